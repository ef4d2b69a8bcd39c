/*
 * Byte-level BPE tokenizer reading HF tokenizer.json (the Qwen2 family: NFC normalizer, the
 * Qwen2 split pattern, ByteLevel pre-tokenizer and decoder, added tokens). The goal is the
 * exact ids of HF `tokenizers` encode(text, add_special_tokens=False), so the steps follow that
 * library's order: added tokens that are not normalized are cut out of the raw text, each
 * remaining piece is NFC-normalized, normalized added tokens are cut out of that, the rest is
 * split by the pattern (a hand-written matcher, no regex engine), mapped byte-wise to the
 * GPT-2 alphabet and merged by rank.
 *
 * Unicode data follows what HF tokenizers 0.23.3 itself uses, not the newest Unicode: the
 * pattern's \p{L} \p{N} \p{M} \s are Oniguruma's Unicode 16.0 classes, NFC uses Unicode 9.0
 * data (HF's normalizer crate); see tools/gen_unicode_tables.py. A later tokenizers release that
 * moves either version changes ids only for characters added to Unicode in between.
 *
 * Text must be well-formed UTF-8: HF only ever sees Python str, so bytes it could not receive
 * are refused (with the offset of the first bad byte) rather than silently replaced.
 *
 * After loading, a tokenizer is read-only: calls may run concurrently on one tokenizer.
 * Every encode call owns its scratch space and its word cache.
 */
#include "core/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOK_MAX_FILE ((size_t)1 << 30)
/* Ids are dense arrays indexed by id: refuse absurdly sparse files instead of allocating GBs. */
#define TOK_MAX_ID ((int64_t)1 << 26)

/* The pre-tokenizer patterns understood (exact strings, as written in tokenizer.json). */
static const char PAT_QWEN2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* Qwen3.5/3.6 variant: marks count as letters. */
static const char PAT_QWEN35[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* ------------------------------------------------------------------------------------------ */
/* Unicode lookups                                                                             */

/* Value of the last range starting at or below cp (tables hold start << 8 | value). */
static unsigned range_value(const uint32_t *r, size_t n, uint32_t cp)
{
    size_t lo = 0, hi = n;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if ((r[mid] >> 8) <= cp)
            lo = mid;
        else
            hi = mid;
    }
    return r[lo] & 0xFF;
}

unsigned h3u_class(uint32_t cp)
{
    if (cp < 0x80) {
        /* ASCII dominates real prompts: skip the binary search. */
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return H3U_L | H3U_WORD;
        if (cp >= '0' && cp <= '9') return H3U_N | H3U_WORD;
        if (cp == ' ' || (cp >= 9 && cp <= 13)) return H3U_WS;
        return cp == '_' ? H3U_WORD : 0;
    }
    return range_value(h3u_class_ranges, h3u_class_ranges_n, cp);
}

unsigned h3u_ccc(uint32_t cp)
{
    if (cp < 0x300) return 0;
    return range_value(h3u_ccc_ranges, h3u_ccc_ranges_n, cp);
}

/* Decode one scalar from valid UTF-8 (validated on entry). */
static inline uint32_t u8_dec(const unsigned char *p, int *len)
{
    unsigned c = p[0];
    if (c < 0x80) {
        *len = 1;
        return c;
    }
    if (c < 0xE0) {
        *len = 2;
        return ((c & 0x1Fu) << 6) | (p[1] & 0x3Fu);
    }
    if (c < 0xF0) {
        *len = 3;
        return ((c & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
    }
    *len = 4;
    return ((c & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
}

static inline int u8_put(char *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Offset of the first byte that is not well-formed UTF-8 (Unicode table 3-7), or n. */
static size_t u8_invalid_at(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) {
            k = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            k = 2;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F; /* surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            k = 3;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else {
            return i;
        }
        if (n - i <= k) return i;
        if (s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t j = 2; j <= k; j++)
            if ((s[i + j] & 0xC0) != 0x80) return i;
        i += k + 1;
    }
    return n;
}

#define HANGUL_S0 0xAC00u
#define HANGUL_L0 0x1100u
#define HANGUL_V0 0x1161u
#define HANGUL_T0 0x11A7u
#define HANGUL_VN 21u
#define HANGUL_TN 28u
#define HANGUL_SN 11172u

static int decomp_lookup(uint32_t cp, const uint32_t **out)
{
    size_t lo = 0, hi = h3u_decomp_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (h3u_decomp_cp[mid] < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == h3u_decomp_n || h3u_decomp_cp[lo] != cp) return 0;
    uint32_t info = h3u_decomp_info[lo];
    *out = h3u_decomp_pool + (info >> 3);
    return (int)(info & 7);
}

static uint32_t compose_pair(uint32_t a, uint32_t b)
{
    if (a >= HANGUL_L0 && a < HANGUL_L0 + 19 && b >= HANGUL_V0 && b < HANGUL_V0 + HANGUL_VN)
        return HANGUL_S0 + ((a - HANGUL_L0) * HANGUL_VN + (b - HANGUL_V0)) * HANGUL_TN;
    if (a >= HANGUL_S0 && a < HANGUL_S0 + HANGUL_SN && (a - HANGUL_S0) % HANGUL_TN == 0 &&
        b > HANGUL_T0 && b < HANGUL_T0 + HANGUL_TN)
        return a + (b - HANGUL_T0);
    uint64_t key = ((uint64_t)a << 21) | b;
    size_t lo = 0, hi = h3u_comp_n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (h3u_comp_key[mid] < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (lo < h3u_comp_n && h3u_comp_key[lo] == key) ? h3u_comp_val[lo] : 0;
}

/* Stable sort of a run of non-starters by combining class (canonical ordering). */
static void sort_marks(uint32_t *cp, uint8_t *cc, size_t n, uint32_t *tmp_cp, uint8_t *tmp_cc)
{
    if (n <= 32) {
        for (size_t i = 1; i < n; i++) {
            uint32_t c = cp[i];
            uint8_t k = cc[i];
            size_t j = i;
            while (j > 0 && cc[j - 1] > k) {
                cp[j] = cp[j - 1];
                cc[j] = cc[j - 1];
                j--;
            }
            cp[j] = c;
            cc[j] = k;
        }
        return;
    }
    /* Long runs (adversarial input) use a counting sort: linear instead of quadratic. */
    size_t count[257] = {0};
    for (size_t i = 0; i < n; i++) count[cc[i] + 1]++;
    for (int k = 1; k < 257; k++) count[k] += count[k - 1];
    for (size_t i = 0; i < n; i++) {
        size_t d = count[cc[i]]++;
        tmp_cp[d] = cp[i];
        tmp_cc[d] = cc[i];
    }
    memcpy(cp, tmp_cp, n * sizeof *cp);
    memcpy(cc, tmp_cc, n);
}

static int grow(void *pp, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *p = h3_realloc(*(void **)pp, c * elem);
    if (!p) return -H3_E_NOMEM;
    *(void **)pp = p;
    *cap = c;
    return 0;
}

typedef struct {
    char *p;
    size_t n, cap;
} sbuf;

static int sbuf_add(sbuf *b, const void *s, size_t n)
{
    if (grow(&b->p, &b->cap, b->n + n + 1, 1)) return -H3_E_NOMEM;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

/* Full canonical decompositions are at most this long (generator asserts it; Hangul 3). */
#define DECOMP_MAX 4

/* NFC of one region that starts a run of possibly-changing characters (see h3u_nfc). */
static int nfc_region(const unsigned char *u, size_t n, sbuf *ob)
{
    size_t ncp = 0;
    for (size_t i = 0; i < n; ncp++) {
        int l;
        u8_dec(u + i, &l);
        i += (size_t)l;
    }
    size_t cap = ncp * DECOMP_MAX;
    /* Second halves are the counting sort's scratch. */
    uint32_t *cp = malloc(cap * 2 * sizeof *cp);
    uint8_t *cc = malloc(cap * 2);
    if (!cp || !cc) {
        free(cp);
        free(cc);
        return h3_err(H3_E_NOMEM, "out of memory normalizing %zu bytes", n);
    }
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        int l;
        uint32_t c = u8_dec(u + i, &l);
        i += (size_t)l;
        const uint32_t *d;
        int dn;
        if (c >= HANGUL_S0 && c < HANGUL_S0 + HANGUL_SN) {
            uint32_t si = c - HANGUL_S0;
            cp[m++] = HANGUL_L0 + si / (HANGUL_VN * HANGUL_TN);
            cp[m++] = HANGUL_V0 + (si % (HANGUL_VN * HANGUL_TN)) / HANGUL_TN;
            if (si % HANGUL_TN) cp[m++] = HANGUL_T0 + si % HANGUL_TN;
        } else if (c >= 0xC0 && (dn = decomp_lookup(c, &d)) > 0) {
            for (int k = 0; k < dn; k++) cp[m++] = d[k];
        } else {
            cp[m++] = c;
        }
    }
    for (size_t i = 0; i < m; i++) cc[i] = (uint8_t)h3u_ccc(cp[i]);
    for (size_t i = 0; i < m;) {
        if (!cc[i]) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < m && cc[j]) j++;
        if (j - i > 1) sort_marks(cp + i, cc + i, j - i, cp + cap, cc + cap);
        i = j;
    }
    /* Canonical composition: a character joins the last starter unless something in between
       blocks it (a starter, or a mark of equal or higher class). */
    size_t w = 0;
    ptrdiff_t starter = -1;
    for (size_t i = 0; i < m; i++) {
        uint32_t c = cp[i];
        uint8_t k = cc[i];
        if (starter >= 0) {
            uint8_t last = cc[w - 1];
            if ((size_t)starter == w - 1 || (last != 0 && last < k)) {
                uint32_t x = compose_pair(cp[starter], c);
                if (x) {
                    cp[starter] = x;
                    continue;
                }
            }
        }
        if (k == 0) starter = (ptrdiff_t)w;
        cp[w] = c;
        cc[w] = k;
        w++;
    }
    int rc = grow(&ob->p, &ob->cap, ob->n + w * 4 + 1, 1);
    if (!rc) {
        for (size_t i = 0; i < w; i++) ob->n += (size_t)u8_put(ob->p + ob->n, cp[i]);
        ob->p[ob->n] = 0;
    }
    free(cp);
    free(cc);
    return rc;
}

/*
 * Characters without the H3U_NFC bit are starters that never combine with what precedes them,
 * so the text splits before each of them into independent regions; only regions holding a
 * flagged character are normalized, the rest is copied.
 */
int h3u_nfc(const char *s, size_t n, char **out, size_t *out_n)
{
    const unsigned char *u = (const unsigned char *)s;
    sbuf ob = {0};
    size_t copied = 0, last_safe = 0;
    bool dirty = false;
    int rc = 0;
    for (size_t i = 0; i < n && !rc;) {
        int l = 1;
        uint32_t c = u[i] < 0x80 ? u[i] : u8_dec(u + i, &l);
        if (c < 0x80 || !(h3u_class(c) & H3U_NFC)) {
            if (dirty) {
                rc = sbuf_add(&ob, s + copied, last_safe - copied);
                if (!rc) rc = nfc_region(u + last_safe, i - last_safe, &ob);
                copied = i;
                dirty = false;
            }
            last_safe = i;
        } else {
            dirty = true;
        }
        i += (size_t)l;
    }
    if (!rc && dirty) {
        rc = sbuf_add(&ob, s + copied, last_safe - copied);
        if (!rc) rc = nfc_region(u + last_safe, n - last_safe, &ob);
    } else if (!rc) {
        rc = sbuf_add(&ob, s + copied, n - copied);
    }
    if (rc) {
        free(ob.p);
        *out = NULL;
        *out_n = 0;
        return rc;
    }
    *out = ob.p;
    *out_n = ob.n;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* The tokenizer                                                                               */

typedef struct {
    uint32_t off, len; /* token string in the pool */
    int32_t id;
    uint32_t tag;      /* high hash bits: most probes are rejected without touching the pool */
} vslot;

typedef struct {
    uint64_t key; /* left id << 32 | right id */
    uint32_t rank;
    int32_t id;   /* merged token; -1 marks an empty slot */
} mslot;

enum { AT_SPECIAL = 1, AT_SINGLE_WORD = 2, AT_LSTRIP = 4, AT_RSTRIP = 8, AT_NORMALIZED = 16 };

typedef struct {
    uint32_t off, len;   /* content in the pool */
    uint32_t moff, mlen; /* matched form: content, or its NFC when normalized */
    int32_t id;
    uint8_t flags;
} addtok;

typedef struct {
    int32_t child, sibling, tok; /* tok: index into added, -1 if no token ends here */
    uint8_t byte;
} tnode;

typedef struct {
    tnode *n;
    size_t len, cap;
    uint8_t first[32]; /* bit set of the tokens' first bytes: most positions fail here */
} trie;

struct h3_tokenizer {
    char *pool;
    size_t pool_n, pool_cap;
    /* id -> vocab string (first one, for decoding); off UINT32_MAX = no such id */
    uint32_t *id_off, *id_len;
    int32_t nids;          /* max id + 1 over vocab and added tokens */
    int32_t vocab_count;   /* entries in model.vocab (HF's model vocab size) */
    vslot *vt;             /* string -> id */
    size_t vt_cap;
    mslot *mt;             /* pair -> merge */
    size_t mt_cap;
    int32_t byte_id[256];  /* id of each byte's GPT-2 character, -1 if absent */
    addtok *added;
    size_t nadded;
    int32_t *added_of_id;  /* id -> index into added, -1 */
    trie trie_raw, trie_norm;
    bool nfc;
    bool marks_are_letters; /* Qwen3.5 pattern */
    bool ignore_merges, byte_fallback, fuse_unk;
    int32_t unk_id;         /* -1: none */
    bool unk_missing;       /* unk_token names no vocab entry: an error once it is needed */
    int32_t fallback_id[256][2]; /* byte_fallback tokens for each byte's GPT-2 char bytes */
    int16_t char_byte[0x144];    /* GPT-2 character -> byte, -1 if none (decoding) */
};

/* GPT-2 byte <-> character mapping: printable Latin-1 bytes map to themselves, the rest to
   U+0100.. in byte order. */
static uint32_t byte_char(unsigned b)
{
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) return b;
    unsigned k = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) k++;
    return 256 + k;
}

static uint64_t hash_bytes(const void *p, size_t n)
{
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001b3ull;
    }
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
}

static int pool_add(h3_tokenizer *t, const char *s, size_t n, uint32_t *off)
{
    if (t->pool_n + n + 1 > t->pool_cap) {
        size_t cap = t->pool_cap ? t->pool_cap : 1 << 16;
        while (cap < t->pool_n + n + 1) cap *= 2;
        if (cap > UINT32_MAX) return h3_err(H3_E_FORMAT, "token strings exceed 4 GiB");
        char *p = h3_realloc(t->pool, cap);
        if (!p) return -H3_E_NOMEM;
        t->pool = p;
        t->pool_cap = cap;
    }
    memcpy(t->pool + t->pool_n, s, n);
    t->pool[t->pool_n + n] = 0;
    *off = (uint32_t)t->pool_n;
    t->pool_n += n + 1;
    return 0;
}

static vslot *vocab_slot(const h3_tokenizer *t, const char *s, size_t n, uint32_t *tag)
{
    uint64_t h = hash_u64(hash_bytes(s, n));
    size_t mask = t->vt_cap - 1;
    *tag = (uint32_t)(h >> 32);
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        vslot *v = &t->vt[i];
        if (v->id < 0 || (v->tag == *tag && v->len == n && memcmp(t->pool + v->off, s, n) == 0))
            return v;
    }
}

static int32_t vocab_get(const h3_tokenizer *t, const char *s, size_t n)
{
    if (!t->vt) return -1;
    uint32_t tag;
    return vocab_slot(t, s, n, &tag)->id;
}

static const mslot *merge_get(const h3_tokenizer *t, int32_t a, int32_t b)
{
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t mask = t->mt_cap - 1;
    for (size_t i = hash_u64(key) & mask;; i = (i + 1) & mask) {
        const mslot *m = &t->mt[i];
        if (m->id < 0) return NULL;
        if (m->key == key) return m;
    }
}

static int trie_insert(trie *tr, const char *s, size_t n, int32_t tok)
{
    if (!tr->n) {
        tr->cap = 64;
        tr->n = h3_malloc(tr->cap * sizeof *tr->n);
        if (!tr->n) return -H3_E_NOMEM;
        tr->n[0] = (tnode){-1, -1, -1, 0};
        tr->len = 1;
    }
    int32_t cur = 0;
    if (n) tr->first[(uint8_t)s[0] >> 3] |= (uint8_t)(1u << ((uint8_t)s[0] & 7));
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)s[i];
        int32_t c = tr->n[cur].child;
        while (c >= 0 && tr->n[c].byte != b) c = tr->n[c].sibling;
        if (c < 0) {
            if (tr->len == tr->cap) {
                tnode *nn = h3_realloc(tr->n, tr->cap * 2 * sizeof *nn);
                if (!nn) return -H3_E_NOMEM;
                tr->n = nn;
                tr->cap *= 2;
            }
            c = (int32_t)tr->len++;
            tr->n[c] = (tnode){-1, tr->n[cur].child, -1, b};
            tr->n[cur].child = c;
        }
        cur = c;
    }
    if (tr->n[cur].tok < 0) tr->n[cur].tok = tok; /* first of equal contents wins */
    return 0;
}

/* Longest token starting at s[0..n): its index, *len set; -1 if none. */
static int32_t trie_longest(const trie *tr, const char *s, size_t n, size_t *len)
{
    int32_t best = -1, cur = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t c = tr->n[cur].child;
        while (c >= 0 && tr->n[c].byte != (uint8_t)s[i]) c = tr->n[c].sibling;
        if (c < 0) break;
        cur = c;
        if (tr->n[cur].tok >= 0) {
            best = tr->n[cur].tok;
            *len = i + 1;
        }
    }
    return best;
}

void h3_tokenizer_free(h3_tokenizer *t)
{
    if (!t) return;
    free(t->pool);
    free(t->id_off);
    free(t->id_len);
    free(t->vt);
    free(t->mt);
    free(t->added);
    free(t->added_of_id);
    free(t->trie_raw.n);
    free(t->trie_norm.n);
    free(t);
}


/* ------------------------------------------------------------------------------------------ */
/* Loading                                                                                     */

static bool jstr_is(const h3_json *d, const h3j *v, const char *s)
{
    return v && v->type == H3J_STR && v->len == strlen(s) && memcmp(h3j_str(d, v), s, v->len) == 0;
}

static bool jnull(const h3j *v) { return !v || v->type == H3J_NULL; }

/* Boolean member with a default; -1 (error recorded) if present but not a boolean. */
static int jflag(const h3_json *d, const h3j *o, const char *k, bool def, const char *where)
{
    const h3j *v = h3j_get(d, o, k);
    if (jnull(v)) return def;
    if (v->type == H3J_TRUE) return 1;
    if (v->type == H3J_FALSE) return 0;
    h3_err(H3_E_FORMAT, "%s.%s must be true or false", where, k);
    return -1;
}

/* Type name of a component ("type" member), for messages. */
static const char *jtype(const h3_json *d, const h3j *o)
{
    const h3j *v = h3j_get(d, o, "type");
    return (v && v->type == H3J_STR) ? h3j_str(d, v) : "(no type)";
}

static int load_normalizer(h3_tokenizer *t, const h3_json *d, const h3j *n)
{
    if (jnull(n)) return 0;
    const char *ty = jtype(d, n);
    if (!strcmp(ty, "NFC")) {
        t->nfc = true;
        return 0;
    }
    if (!strcmp(ty, "Sequence")) {
        const h3j *list = h3j_get(d, n, "normalizers");
        if (!list || list->type != H3J_ARR)
            return h3_err(H3_E_FORMAT, "normalizer Sequence without a \"normalizers\" array");
        for (const h3j *c = h3j_first(d, list); c; c = h3j_next(d, c)) {
            int rc = load_normalizer(t, d, c);
            if (rc) return rc;
        }
        return 0;
    }
    return h3_err(H3_E_UNSUPPORTED, "normalizer type '%s' is not supported (only NFC)", ty);
}

static int load_pre_tokenizer(h3_tokenizer *t, const h3_json *d, const h3j *p)
{
    const char *want = "the Qwen2 form: Sequence[Split(Qwen2 pattern, Isolated), "
                       "ByteLevel(add_prefix_space=false, use_regex=false)]";
    if (jnull(p) || strcmp(jtype(d, p), "Sequence") != 0)
        return h3_err(H3_E_UNSUPPORTED, "pre_tokenizer '%s' is not supported (need %s)",
                      jnull(p) ? "null" : jtype(d, p), want);
    const h3j *list = h3j_get(d, p, "pretokenizers");
    const h3j *split = h3j_at(d, list, 0), *bl = h3j_at(d, list, 1);
    if (!list || list->len != 2 || strcmp(jtype(d, split), "Split") != 0 ||
        strcmp(jtype(d, bl), "ByteLevel") != 0)
        return h3_err(H3_E_UNSUPPORTED, "pre_tokenizer Sequence is not supported (need %s)", want);
    const h3j *pat = h3j_path(d, split, "pattern", "Regex", NULL);
    if (jstr_is(d, pat, PAT_QWEN2)) {
        t->marks_are_letters = false;
    } else if (jstr_is(d, pat, PAT_QWEN35)) {
        t->marks_are_letters = true;
    } else {
        return h3_err(H3_E_UNSUPPORTED,
                      "Split pattern %s is not supported (only the Qwen2 and Qwen3.5 patterns)",
                      pat && pat->type == H3J_STR ? h3j_str(d, pat) : "(not a Regex)");
    }
    if (!jstr_is(d, h3j_get(d, split, "behavior"), "Isolated"))
        return h3_err(H3_E_UNSUPPORTED, "Split behavior must be \"Isolated\"");
    int inv = jflag(d, split, "invert", false, "pre_tokenizer.Split");
    if (inv < 0) return -H3_E_FORMAT;
    if (inv) return h3_err(H3_E_UNSUPPORTED, "Split with invert=true is not supported");
    int aps = jflag(d, bl, "add_prefix_space", true, "pre_tokenizer.ByteLevel");
    int ure = jflag(d, bl, "use_regex", true, "pre_tokenizer.ByteLevel");
    if (aps < 0 || ure < 0) return -H3_E_FORMAT;
    if (aps || ure)
        return h3_err(H3_E_UNSUPPORTED,
                      "ByteLevel pre-tokenizer needs add_prefix_space=false and use_regex=false");
    return 0;
}

static int load_vocab(h3_tokenizer *t, const h3_json *d, const h3j *vocab, int64_t *max_id)
{
    if (!vocab || vocab->type != H3J_OBJ) return h3_err(H3_E_FORMAT, "model.vocab must be an object");
    t->vt_cap = pow2_at_least((size_t)vocab->len * 3 / 2 + 2);
    t->vt = h3_malloc(t->vt_cap * sizeof *t->vt);
    if (!t->vt) return -H3_E_NOMEM;
    for (size_t i = 0; i < t->vt_cap; i++) t->vt[i].id = -1;
    int32_t count = 0;
    for (const h3j *m = h3j_first(d, vocab); m; m = h3j_next(d, m)) {
        if (m->type != H3J_NUM || !m->is_int || m->i < 0 || m->i >= TOK_MAX_ID)
            return h3_err(H3_E_FORMAT, "model.vocab[\"%s\"] must be an integer id in [0, %lld)",
                          h3j_key(d, m), (long long)TOK_MAX_ID);
        const char *k = h3j_key(d, m);
        uint32_t tag;
        vslot *v = vocab_slot(t, k, m->keylen, &tag);
        if (v->id < 0) {
            v->tag = tag;
            int rc = pool_add(t, k, m->keylen, &v->off);
            if (rc) return rc;
            v->len = m->keylen;
            count++;
        }
        v->id = (int32_t)m->i; /* a repeated key keeps its last id, as a JSON map does */
        if (m->i > *max_id) *max_id = m->i;
    }
    t->vocab_count = count;
    return 0;
}

static int add_merge(h3_tokenizer *t, const char *a, size_t al, const char *b, size_t bl,
                     uint32_t rank, char **tmp, size_t *tmp_cap)
{
    int32_t ia = vocab_get(t, a, al), ib = vocab_get(t, b, bl);
    if (ia < 0 || ib < 0)
        return h3_err(H3_E_FORMAT, "merge %u (\"%.*s\" \"%.*s\") uses a token missing from the vocab",
                      rank, (int)al, a, (int)bl, b);
    if (al + bl > *tmp_cap) {
        size_t cap = (al + bl) * 2;
        char *p = h3_realloc(*tmp, cap);
        if (!p) return -H3_E_NOMEM;
        *tmp = p;
        *tmp_cap = cap;
    }
    memcpy(*tmp, a, al);
    memcpy(*tmp + al, b, bl);
    int32_t inew = vocab_get(t, *tmp, al + bl);
    if (inew < 0)
        return h3_err(H3_E_FORMAT, "merge %u: \"%.*s\" is missing from the vocab", rank,
                      (int)(al + bl), *tmp);
    uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
    size_t mask = t->mt_cap - 1;
    for (size_t i = hash_u64(key) & mask;; i = (i + 1) & mask) {
        mslot *m = &t->mt[i];
        if (m->id < 0 || m->key == key) {
            /* A repeated pair takes its later rank, as HF's map build does. */
            m->key = key;
            m->rank = rank;
            m->id = inew;
            return 0;
        }
    }
}

static int load_merges(h3_tokenizer *t, const h3_json *d, const h3j *merges)
{
    if (!merges || merges->type != H3J_ARR) return h3_err(H3_E_FORMAT, "model.merges must be an array");
    t->mt_cap = pow2_at_least((size_t)merges->len * 2 + 2);
    t->mt = h3_malloc(t->mt_cap * sizeof *t->mt);
    if (!t->mt) return -H3_E_NOMEM;
    for (size_t i = 0; i < t->mt_cap; i++) t->mt[i].id = -1;
    char *tmp = NULL;
    size_t tmp_cap = 0;
    uint32_t rank = 0;
    int rc = 0;
    for (const h3j *m = h3j_first(d, merges); m && !rc; m = h3j_next(d, m)) {
        if (m->type == H3J_STR) {
            /* "a b": HF's legacy form. Lines starting "#version" are merges.txt headers. */
            const char *s = h3j_str(d, m);
            if (m->len >= 8 && !memcmp(s, "#version", 8)) continue;
            const char *sp = memchr(s, ' ', m->len);
            if (!sp || memchr(sp + 1, ' ', m->len - (size_t)(sp + 1 - s)))
                rc = h3_err(H3_E_FORMAT, "merge %u (\"%s\") is not two tokens separated by one space",
                            rank, s);
            else
                rc = add_merge(t, s, (size_t)(sp - s), sp + 1, m->len - (size_t)(sp + 1 - s), rank,
                               &tmp, &tmp_cap);
        } else if (m->type == H3J_ARR && m->len == 2 && h3j_at(d, m, 0)->type == H3J_STR &&
                   h3j_at(d, m, 1)->type == H3J_STR) {
            const h3j *a = h3j_at(d, m, 0), *b = h3j_at(d, m, 1);
            rc = add_merge(t, h3j_str(d, a), a->len, h3j_str(d, b), b->len, rank, &tmp, &tmp_cap);
        } else {
            rc = h3_err(H3_E_FORMAT, "merge %u is neither \"a b\" nor [\"a\", \"b\"]", rank);
        }
        rank++;
    }
    free(tmp);
    return rc;
}

/*
 * Added tokens get ids the way HF assigns them on load (an existing vocab or added id for the
 * same content, else the next free id after the vocab); the file's "id" is only checked against
 * that, and a disagreement is an error rather than a silent renumbering.
 */
static int load_added(h3_tokenizer *t, const h3_json *d, const h3j *list, int64_t *max_id)
{
    if (jnull(list)) return 0;
    if (list->type != H3J_ARR) return h3_err(H3_E_FORMAT, "added_tokens must be an array");
    t->added = h3_calloc(list->len ? list->len : 1, sizeof *t->added);
    if (!t->added) return -H3_E_NOMEM;
    int64_t max_added = -1;
    uint32_t idx = 0;
    for (const h3j *a = h3j_first(d, list); a; a = h3j_next(d, a), idx++) {
        const h3j *content = h3j_get(d, a, "content"), *jid = h3j_get(d, a, "id");
        if (!content || content->type != H3J_STR || !jid || jid->type != H3J_NUM || !jid->is_int)
            return h3_err(H3_E_FORMAT, "added_tokens[%u] needs a string \"content\" and an integer \"id\"",
                          idx);
        const char *c = h3j_str(d, content);
        if (content->len == 0) continue; /* HF ignores empty tokens */
        char where[32];
        snprintf(where, sizeof where, "added_tokens[%u]", idx);
        int f[5] = {jflag(d, a, "special", false, where), jflag(d, a, "single_word", false, where),
                    jflag(d, a, "lstrip", false, where), jflag(d, a, "rstrip", false, where),
                    jflag(d, a, "normalized", true, where)};
        uint8_t flags = 0;
        for (int k = 0; k < 5; k++) {
            if (f[k] < 0) return -H3_E_FORMAT;
            if (f[k]) flags |= (uint8_t)(1u << k);
        }
        addtok *dup = NULL;
        for (size_t k = 0; k < t->nadded; k++)
            if (t->added[k].len == content->len && !memcmp(t->pool + t->added[k].off, c, content->len))
                dup = &t->added[k];
        int64_t id;
        if (dup) {
            id = dup->id;
        } else if ((id = vocab_get(t, c, content->len)) < 0) {
            if (max_added < 0)
                id = t->vocab_count;
            else
                id = (max_added >= t->vocab_count || t->vocab_count == 0) ? max_added + 1 : t->vocab_count;
        }
        if (id != jid->i)
            return h3_err(H3_E_FORMAT,
                          "added token \"%s\" has id %lld in the file but HF tokenizers would give it "
                          "id %lld (ids must follow the vocab in order)",
                          c, (long long)jid->i, (long long)id);
        if (id >= TOK_MAX_ID) return h3_err(H3_E_FORMAT, "added token \"%s\": id %lld too large", c, (long long)id);
        if (id > max_added) max_added = id;
        if (id > *max_id) *max_id = id;
        if (dup) {
            dup->flags = flags; /* a later entry for the same content updates its options */
            continue;
        }
        addtok *at = &t->added[t->nadded++];
        int rc = pool_add(t, c, content->len, &at->off);
        if (rc) return rc;
        at->len = content->len;
        at->id = (int32_t)id;
        at->flags = flags;
    }
    return 0;
}

/* Matching forms of the added tokens (needs the normalizer) and the two tries. */
static int build_added_index(h3_tokenizer *t)
{
    for (size_t k = 0; k < t->nadded; k++) {
        addtok *a = &t->added[k];
        a->moff = a->off;
        a->mlen = a->len;
        if ((a->flags & AT_NORMALIZED) && t->nfc) {
            char *s;
            size_t n;
            int rc = h3u_nfc(t->pool + a->off, a->len, &s, &n);
            if (rc) return rc;
            rc = pool_add(t, s, n, &a->moff);
            free(s);
            if (rc) return rc;
            a->mlen = (uint32_t)n;
        }
        t->added_of_id[a->id] = (int32_t)k;
        trie *tr = (a->flags & AT_NORMALIZED) ? &t->trie_norm : &t->trie_raw;
        int rc = trie_insert(tr, t->pool + a->moff, a->mlen, (int32_t)k);
        if (rc) return rc;
    }
    return 0;
}

static int load_model(h3_tokenizer *t, const h3_json *d, const h3j *model, int64_t *max_id)
{
    if (!model || model->type != H3J_OBJ) return h3_err(H3_E_FORMAT, "no \"model\" object");
    const h3j *ty = h3j_get(d, model, "type");
    if (ty && !jstr_is(d, ty, "BPE"))
        return h3_err(H3_E_UNSUPPORTED, "model type '%s' is not supported (only BPE)",
                      ty->type == H3J_STR ? h3j_str(d, ty) : "?");
    const h3j *drop = h3j_get(d, model, "dropout");
    if (!jnull(drop) && !(drop->type == H3J_NUM && drop->num == 0.0))
        return h3_err(H3_E_UNSUPPORTED, "BPE dropout is not supported (encoding must be deterministic)");
    const char *affix[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int k = 0; k < 2; k++) {
        const h3j *v = h3j_get(d, model, affix[k]);
        if (!jnull(v) && !(v->type == H3J_STR && v->len == 0))
            return h3_err(H3_E_UNSUPPORTED, "BPE %s is not supported", affix[k]);
    }
    int fu = jflag(d, model, "fuse_unk", false, "model"), bf = jflag(d, model, "byte_fallback", false, "model"),
        im = jflag(d, model, "ignore_merges", false, "model");
    if (fu < 0 || bf < 0 || im < 0) return -H3_E_FORMAT;
    t->fuse_unk = fu;
    t->byte_fallback = bf;
    t->ignore_merges = im;
    int rc = load_vocab(t, d, h3j_get(d, model, "vocab"), max_id);
    if (rc) return rc;
    rc = load_merges(t, d, h3j_get(d, model, "merges"));
    if (rc) return rc;
    t->unk_id = -1;
    const h3j *unk = h3j_get(d, model, "unk_token");
    if (!jnull(unk)) {
        if (unk->type != H3J_STR) return h3_err(H3_E_FORMAT, "model.unk_token must be a string");
        t->unk_id = vocab_get(t, h3j_str(d, unk), unk->len);
        t->unk_missing = t->unk_id < 0;
    }
    for (unsigned b = 0; b < 256; b++) {
        char s[4];
        int n = u8_put(s, byte_char(b));
        t->byte_id[b] = vocab_get(t, s, (size_t)n);
        /* byte_fallback spells the bytes of the GPT-2 character as "<0xXX>" tokens. */
        for (int k = 0; k < 2; k++) {
            char fb[8];
            snprintf(fb, sizeof fb, "<0x%02X>", k < n ? (unsigned char)s[k] : 0);
            t->fallback_id[b][k] = k < n ? vocab_get(t, fb, 6) : -2;
        }
    }
    return 0;
}

static int load_doc(h3_tokenizer *t, const h3_json *d)
{
    const h3j *root = h3j_root(d);
    if (!root || root->type != H3J_OBJ) return h3_err(H3_E_FORMAT, "top level is not an object");
    const h3j *ver = h3j_get(d, root, "version");
    if (ver && !jstr_is(d, ver, "1.0"))
        return h3_err(H3_E_UNSUPPORTED, "unknown tokenizer.json version (only \"1.0\")");
    if (!jnull(h3j_get(d, root, "truncation")) || !jnull(h3j_get(d, root, "padding")))
        return h3_err(H3_E_UNSUPPORTED, "truncation and padding must be null (they would change the ids)");
    int rc = load_normalizer(t, d, h3j_get(d, root, "normalizer"));
    if (!rc) rc = load_pre_tokenizer(t, d, h3j_get(d, root, "pre_tokenizer"));
    if (rc) return rc;
    const h3j *dec = h3j_get(d, root, "decoder");
    if (jnull(dec) || strcmp(jtype(d, dec), "ByteLevel") != 0)
        return h3_err(H3_E_UNSUPPORTED, "decoder '%s' is not supported (only ByteLevel)",
                      jnull(dec) ? "null" : jtype(d, dec));
    int64_t max_id = -1;
    rc = load_model(t, d, h3j_get(d, root, "model"), &max_id);
    if (!rc) rc = load_added(t, d, h3j_get(d, root, "added_tokens"), &max_id);
    if (rc) return rc;
    t->nids = (int32_t)(max_id + 1);
    size_t n = (size_t)t->nids ? (size_t)t->nids : 1;
    t->id_off = h3_malloc(n * sizeof *t->id_off);
    t->id_len = h3_calloc(n, sizeof *t->id_len);
    t->added_of_id = h3_malloc(n * sizeof *t->added_of_id);
    if (!t->id_off || !t->id_len || !t->added_of_id) return -H3_E_NOMEM;
    memset(t->id_off, 0xFF, n * sizeof *t->id_off);
    memset(t->added_of_id, 0xFF, n * sizeof *t->added_of_id);
    for (size_t i = 0; i < t->vt_cap; i++) {
        const vslot *v = &t->vt[i];
        /* Several strings may share an id: decode with the one earliest in the pool (file order). */
        if (v->id >= 0 && (t->id_off[v->id] == UINT32_MAX || v->off < t->id_off[v->id])) {
            t->id_off[v->id] = v->off;
            t->id_len[v->id] = v->len;
        }
    }
    for (unsigned c = 0; c < 0x144; c++) t->char_byte[c] = -1;
    for (unsigned b = 0; b < 256; b++) t->char_byte[byte_char(b)] = (int16_t)b;
    return build_added_index(t);
}

/* A parsed tokenizer.json -> tokenizer; errors are prefixed with `name`. */
static h3_tokenizer *load_parsed(h3_json *doc, const char *name)
{
    h3_tokenizer *t = h3_calloc(1, sizeof *t);
    int rc = t ? load_doc(t, doc) : -H3_E_NOMEM;
    h3_json_free(doc);
    if (rc) {
        h3_err_prefix("%s", name);
        h3_tokenizer_free(t);
        return NULL;
    }
    return t;
}

h3_tokenizer *h3_tokenizer_load(const char *path)
{
    if (!path) {
        h3_err(H3_E_INVALID, "h3_tokenizer_load: path is NULL");
        return NULL;
    }
    h3_json doc;
    if (h3_json_parse_file(&doc, path, TOK_MAX_FILE)) return NULL;
    return load_parsed(&doc, path);
}

h3_tokenizer *h3_tokenizer_load_buffer(const char *json, size_t len, const char *name)
{
    if (!json && len) {
        h3_err(H3_E_INVALID, "h3_tokenizer_load_buffer: NULL text");
        return NULL;
    }
    if (!name) name = "<buffer>";
    if (len > TOK_MAX_FILE) {
        h3_err(H3_E_FORMAT, "%s: larger than %zu bytes", name, TOK_MAX_FILE);
        return NULL;
    }
    h3_json doc;
    if (h3_json_parse(&doc, json ? json : "", len)) {
        h3_err_prefix("%s: malformed JSON", name);
        return NULL;
    }
    return load_parsed(&doc, name);
}

int32_t h3_tokenizer_vocab_size(h3_tokenizer *t)
{
    if (!t) return h3_err(H3_E_INVALID, "h3_tokenizer_vocab_size: tokenizer is NULL");
    return t->nids;
}

int32_t h3_token_id(h3_tokenizer *t, const char *token)
{
    if (!t || !token) {
        h3_err(H3_E_INVALID, "h3_token_id: NULL tokenizer or token");
        return -1;
    }
    size_t n = strlen(token);
    for (size_t k = 0; k < t->nadded; k++)
        if (t->added[k].len == n && !memcmp(t->pool + t->added[k].off, token, n)) return t->added[k].id;
    return vocab_get(t, token, n);
}

/* ------------------------------------------------------------------------------------------ */
/* Encoding                                                                                    */

typedef struct {
    int32_t id, prev, next; /* id -1: merged into its left neighbour */
} bsym;

typedef struct {
    uint32_t rank, pos;
    int32_t a, b, id; /* the pair when queued, and what it merges into */
} bmerge;

typedef struct {
    uint64_t h;
    uint32_t koff, klen, ioff, icount;
    bool used;
} centry;

/* One encode call: output, scratch, and a cache of BPE results per pre-token. */
typedef struct {
    const h3_tokenizer *t;
    int32_t *ids;
    size_t n, cap;
    uint32_t *cp;
    uint8_t *cl;
    size_t *off;
    size_t pcap;
    bsym *sy;
    size_t sycap;
    bmerge *hp;
    size_t hpcap;
    centry *ct;
    size_t ct_cap, ct_n;
    char *ck;
    size_t ck_n, ck_cap;
    int32_t *ci;
    size_t ci_n, ci_cap;
    char *gs; /* GPT-2 spelling of a word (ignore_merges) */
    size_t gs_cap;
} enc;

/* Words longer than this are rarely repeated: not worth caching. */
#define CACHE_MAX_WORD 256


static int emit(enc *e, int32_t id)
{
    if (e->n == e->cap && grow(&e->ids, &e->cap, e->n + 1, sizeof *e->ids)) return -H3_E_NOMEM;
    e->ids[e->n++] = id;
    return 0;
}

static bool merge_before(const bmerge *x, const bmerge *y)
{
    /* HF's order: lowest rank first, then leftmost. */
    return x->rank < y->rank || (x->rank == y->rank && x->pos < y->pos);
}

static void heap_push(bmerge *h, size_t *n, bmerge m)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!merge_before(&m, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = m;
}

static bmerge heap_pop(bmerge *h, size_t *n)
{
    bmerge top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && merge_before(&h[c + 1], &h[c])) c++;
        if (!merge_before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static void queue_pair(const h3_tokenizer *t, bsym *sy, bmerge *hp, size_t *hn, int32_t pos)
{
    if (pos < 0) return;
    int32_t nx = sy[pos].next;
    if (nx < 0) return;
    const mslot *m = merge_get(t, sy[pos].id, sy[nx].id);
    if (m) heap_push(hp, hn, (bmerge){m->rank, (uint32_t)pos, sy[pos].id, sy[nx].id, m->id});
}

static centry *cache_find(enc *e, const unsigned char *w, size_t m, uint64_t h)
{
    size_t mask = e->ct_cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        centry *c = &e->ct[i];
        if (!c->used || (c->h == h && c->klen == m && !memcmp(e->ck + c->koff, w, m))) return c;
    }
}

static int cache_put(enc *e, const unsigned char *w, size_t m, uint64_t h, size_t first_id)
{
    if ((e->ct_n + 1) * 2 > e->ct_cap) {
        size_t nc = e->ct_cap ? e->ct_cap * 2 : 1024;
        centry *old = e->ct;
        size_t oc = e->ct_cap;
        e->ct = h3_calloc(nc, sizeof *e->ct);
        if (!e->ct) {
            e->ct = old;
            return -H3_E_NOMEM;
        }
        e->ct_cap = nc;
        for (size_t i = 0; i < oc; i++) {
            if (!old[i].used) continue;
            size_t j = old[i].h & (nc - 1);
            while (e->ct[j].used) j = (j + 1) & (nc - 1);
            e->ct[j] = old[i];
        }
        free(old);
    }
    size_t cnt = e->n - first_id;
    if (grow(&e->ck, &e->ck_cap, e->ck_n + m, 1) || grow(&e->ci, &e->ci_cap, e->ci_n + cnt, sizeof *e->ci))
        return -H3_E_NOMEM;
    centry *c = cache_find(e, w, m, h);
    *c = (centry){h, (uint32_t)e->ck_n, (uint32_t)m, (uint32_t)e->ci_n, (uint32_t)cnt, true};
    memcpy(e->ck + e->ck_n, w, m);
    e->ck_n += m;
    if (cnt) memcpy(e->ci + e->ci_n, e->ids + first_id, cnt * sizeof *e->ci);
    e->ci_n += cnt;
    e->ct_n++;
    return 0;
}

/* Initial symbols of a word: one per byte, or HF's byte-fallback / unk handling if a byte's
   character is not in the vocab. Returns the symbol count or a negative code. */
static int64_t word_symbols(enc *e, const unsigned char *w, size_t m)
{
    const h3_tokenizer *t = e->t;
    size_t ns = 0;
    bool unk_pending = false;
    for (size_t i = 0; i < m; i++) {
        int32_t id = t->byte_id[w[i]];
        if (id >= 0) {
            if (unk_pending) e->sy[ns++].id = t->unk_id;
            unk_pending = false;
            e->sy[ns++].id = id;
            continue;
        }
        const int32_t *fb = t->fallback_id[w[i]];
        if (t->byte_fallback && fb[0] >= 0 && fb[1] != -1) {
            /* As in HF, a pending unk is not flushed here: it lands after these. */
            e->sy[ns++].id = fb[0];
            if (fb[1] >= 0) e->sy[ns++].id = fb[1];
            continue;
        }
        if (t->unk_missing) return h3_err(H3_E_FORMAT, "unk_token is not in the vocab");
        if (t->unk_id < 0) continue; /* no unk token: HF drops the character */
        if (unk_pending && !t->fuse_unk) e->sy[ns++].id = t->unk_id;
        unk_pending = true;
    }
    if (unk_pending) e->sy[ns++].id = t->unk_id;
    return (int64_t)ns;
}

/* BPE of one pre-token (raw bytes; the GPT-2 mapping is folded into byte_id). */
static int bpe_word(enc *e, const unsigned char *w, size_t m)
{
    const h3_tokenizer *t = e->t;
    uint64_t h = 0;
    size_t first = e->n;
    if (m <= CACHE_MAX_WORD) {
        h = hash_bytes(w, m);
        centry *c = cache_find(e, w, m, h);
        if (c->used) {
            if (!c->icount) return 0;
            if (grow(&e->ids, &e->cap, e->n + c->icount, sizeof *e->ids)) return -H3_E_NOMEM;
            memcpy(e->ids + e->n, e->ci + c->ioff, c->icount * sizeof *e->ids);
            e->n += c->icount;
            return 0;
        }
    }
    if (t->ignore_merges) {
        if (grow(&e->gs, &e->gs_cap, m * 2, 1)) return -H3_E_NOMEM;
        size_t gn = 0;
        for (size_t i = 0; i < m; i++) gn += (size_t)u8_put(e->gs + gn, byte_char(w[i]));
        int32_t id = vocab_get(t, e->gs, gn);
        if (id >= 0) {
            int rc = emit(e, id);
            return rc ? rc : (m <= CACHE_MAX_WORD ? cache_put(e, w, m, h, first) : 0);
        }
    }
    if (grow(&e->sy, &e->sycap, m * 2 + 1, sizeof *e->sy) ||
        grow(&e->hp, &e->hpcap, m * 6 + 1, sizeof *e->hp))
        return -H3_E_NOMEM;
    int64_t ns = word_symbols(e, w, m);
    if (ns < 0) return (int)ns;
    bsym *sy = e->sy;
    for (int64_t i = 0; i < ns; i++) {
        sy[i].prev = (int32_t)i - 1;
        sy[i].next = i + 1 < ns ? (int32_t)i + 1 : -1;
    }
    size_t hn = 0;
    for (int64_t i = 0; i + 1 < ns; i++) queue_pair(t, sy, e->hp, &hn, (int32_t)i);
    while (hn) {
        bmerge top = heap_pop(e->hp, &hn);
        bsym *s = &sy[top.pos];
        /* Stale entries: a symbol only ever grows, so equal ids mean the same pair. */
        if (s->id != top.a || s->next < 0 || sy[s->next].id != top.b) continue;
        bsym *r = &sy[s->next];
        s->id = top.id;
        r->id = -1;
        s->next = r->next;
        if (s->next >= 0) sy[s->next].prev = (int32_t)top.pos;
        queue_pair(t, sy, e->hp, &hn, s->prev);
        queue_pair(t, sy, e->hp, &hn, (int32_t)top.pos);
    }
    for (int32_t i = ns ? 0 : -1; i >= 0; i = sy[i].next) {
        int rc = emit(e, sy[i].id);
        if (rc) return rc;
    }
    return m <= CACHE_MAX_WORD ? cache_put(e, w, m, h, first) : 0;
}

/*
 * The Qwen2 split pattern, matched by hand. Alternatives in order (the first that matches at
 * position i wins, as in a backtracking engine):
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N} | ?[^\s\p{L}\p{N}]+[\r\n]*
 *   | \s*[\r\n]+ | \s+(?!\S) | \s+
 * Returns the end of the match starting at i (every position matches something).
 */
static size_t match_at(const uint32_t *cp, const uint8_t *cl, size_t i, size_t n)
{
    const uint8_t LET = H3U_L, OTHER_NOT = H3U_WS | H3U_L | H3U_N;
    uint32_t c = cp[i];
    if (c == '\'' && i + 1 < n) {
        /* Oniguruma's case folding also maps U+017F (long s) to 's'. */
        uint32_t a = cp[i + 1];
        if (a >= 'A' && a <= 'Z') a += 32;
        if (a == 0x17F) a = 's';
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if (i + 2 < n) {
            uint32_t b = cp[i + 2];
            if (b >= 'A' && b <= 'Z') b += 32;
            if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
        }
    }
    size_t j;
    if (cl[i] & LET) {
        for (j = i + 1; j < n && (cl[j] & LET); j++) {}
        return j;
    }
    if (c != '\r' && c != '\n' && !(cl[i] & H3U_N) && i + 1 < n && (cl[i + 1] & LET)) {
        for (j = i + 2; j < n && (cl[j] & LET); j++) {}
        return j;
    }
    if (cl[i] & H3U_N) return i + 1;
    size_t st = (c == ' ' && i + 1 < n && !(cl[i + 1] & OTHER_NOT)) ? i + 1 : i;
    if (!(cl[st] & OTHER_NOT)) {
        for (j = st + 1; j < n && !(cl[j] & OTHER_NOT); j++) {}
        while (j < n && (cp[j] == '\r' || cp[j] == '\n')) j++;
        return j;
    }
    /* Whitespace: \s*[\r\n]+ ends after the run's last CR/LF; else \s+(?!\S) leaves the run's
       last character for the next word unless the run ends the text; else \s+ (one char). */
    size_t end = i, last_nl = SIZE_MAX;
    while (end < n && (cl[end] & H3U_WS)) {
        if (cp[end] == '\r' || cp[end] == '\n') last_nl = end;
        end++;
    }
    if (end == i) return i + 1; /* unreachable: every class is covered above */
    if (last_nl != SIZE_MAX) return last_nl + 1;
    if (end == n || end - i < 2) return end;
    return end - 1;
}

static int pretokenize(enc *e, const char *s, size_t n)
{
    if (!n) return 0;
    size_t old_cap = e->pcap;
    if (grow(&e->cp, &e->pcap, n + 1, sizeof *e->cp)) return -H3_E_NOMEM;
    if (e->pcap != old_cap) {
        /* cl and off share the capacity of cp. */
        uint8_t *ncl = h3_realloc(e->cl, e->pcap);
        if (!ncl) return -H3_E_NOMEM;
        e->cl = ncl;
        size_t *noff = h3_realloc(e->off, e->pcap * sizeof *noff);
        if (!noff) return -H3_E_NOMEM;
        e->off = noff;
    }
    uint8_t *cl = e->cl;
    size_t *off = e->off;
    const unsigned char *u = (const unsigned char *)s;
    size_t k = 0;
    uint8_t mark_bit = e->t->marks_are_letters ? H3U_M : 0;
    for (size_t i = 0; i < n; k++) {
        int l;
        uint32_t c = u8_dec(u + i, &l);
        unsigned x = h3u_class(c);
        if (x & mark_bit) x |= H3U_L;
        e->cp[k] = c;
        cl[k] = (uint8_t)x;
        off[k] = i;
        i += (size_t)l;
    }
    off[k] = n;
    for (size_t i = 0; i < k;) {
        size_t j = match_at(e->cp, cl, i, k);
        int rc = bpe_word(e, u + off[i], off[j] - off[i]);
        if (rc) return rc;
        i = j;
    }
    return 0;
}

static uint32_t cp_before(const unsigned char *s, size_t at)
{
    size_t i = at - 1;
    while (i > 0 && (s[i] & 0xC0) == 0x80) i--;
    int l;
    return u8_dec(s + i, &l);
}

typedef int (*text_fn)(enc *e, const char *s, size_t n);

/*
 * Cut added tokens out of s as HF does: non-overlapping leftmost-longest matches; a
 * single_word match touching a word character is skipped (the search still resumes after it);
 * lstrip/rstrip widen the match over whitespace. Text between matches goes to fn.
 */
static int split_added(enc *e, const trie *tr, const char *s, size_t n, text_fn fn)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t pos = 0, done = 0;
    while (tr->n && pos < n) {
        size_t start = pos, len = 0;
        int32_t k = -1;
        for (; start < n; start++) {
            if (!(tr->first[u[start] >> 3] & (1u << (u[start] & 7)))) continue;
            if ((k = trie_longest(tr, s + start, n - start, &len)) >= 0) break;
        }
        if (k < 0) break;
        size_t stop = start + len;
        pos = stop;
        const addtok *a = &e->t->added[k];
        if (a->flags & AT_SINGLE_WORD) {
            int l;
            if ((start > 0 && (h3u_class(cp_before(u, start)) & H3U_WORD)) ||
                (stop < n && (h3u_class(u8_dec(u + stop, &l)) & H3U_WORD)))
                continue;
        }
        if (a->flags & AT_LSTRIP) {
            size_t ns = start;
            while (ns > 0) {
                size_t p = ns - 1;
                while (p > 0 && (u[p] & 0xC0) == 0x80) p--;
                int l;
                if (!(h3u_class(u8_dec(u + p, &l)) & H3U_WS)) break;
                ns = p;
            }
            start = ns > done ? ns : done;
        }
        if (a->flags & AT_RSTRIP) {
            while (stop < n) {
                int l;
                if (!(h3u_class(u8_dec(u + stop, &l)) & H3U_WS)) break;
                stop += (size_t)l;
            }
        }
        if (done < start) {
            int rc = fn(e, s + done, start - done);
            if (rc) return rc;
        }
        int rc = emit(e, a->id);
        if (rc) return rc;
        done = stop;
    }
    return done < n ? fn(e, s + done, n - done) : 0;
}

static int normalized_piece(enc *e, const char *s, size_t n)
{
    if (!e->t->nfc) return split_added(e, &e->t->trie_norm, s, n, pretokenize);
    char *norm;
    size_t nn;
    int rc = h3u_nfc(s, n, &norm, &nn);
    if (rc) return rc;
    rc = split_added(e, &e->t->trie_norm, norm, nn, pretokenize);
    free(norm);
    return rc;
}

int64_t h3_tokenize(h3_tokenizer *t, const char *text, size_t len, int32_t *ids, int64_t cap)
{
    if (!t || (!text && len) || cap < 0 || (!ids && cap > 0))
        return h3_err(H3_E_INVALID, "h3_tokenize: bad arguments (NULL tokenizer, text or ids, or cap < 0)");
    if (!len) return 0;
    size_t bad = u8_invalid_at((const unsigned char *)text, len);
    if (bad < len)
        return h3_err(H3_E_INVALID, "h3_tokenize: invalid UTF-8 at byte offset %zu (byte 0x%02X)", bad,
                      (unsigned char)text[bad]);
    enc e;
    memset(&e, 0, sizeof e);
    e.t = t;
    if (grow(&e.ct, &e.ct_cap, 1024, sizeof *e.ct)) return -H3_E_NOMEM;
    memset(e.ct, 0, e.ct_cap * sizeof *e.ct);
    int rc = split_added(&e, &t->trie_raw, text, len, normalized_piece);
    if (!rc && cap > 0 && e.n > 0)
        memcpy(ids, e.ids, (size_t)((int64_t)e.n < cap ? (int64_t)e.n : cap) * sizeof *ids);
    free(e.ids);
    free(e.cp);
    free(e.cl);
    free(e.off);
    free(e.sy);
    free(e.hp);
    free(e.ct);
    free(e.ck);
    free(e.ci);
    free(e.gs);
    return rc ? rc : (int64_t)e.n;
}

/* ------------------------------------------------------------------------------------------ */
/* Decoding                                                                                    */

int64_t h3_detokenize(h3_tokenizer *t, const int32_t *ids, int64_t n, char *out, int64_t cap)
{
    if (!t || n < 0 || (!ids && n > 0) || cap < 0 || (!out && cap > 0))
        return h3_err(H3_E_INVALID, "h3_detokenize: bad arguments (NULL tokenizer, ids or out, or negative count)");
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        const char *s;
        size_t len;
        if (id >= 0 && id < t->nids && t->added_of_id[id] >= 0) {
            const addtok *a = &t->added[t->added_of_id[id]];
            s = t->pool + a->off;
            len = a->len;
        } else if (id >= 0 && id < t->nids && t->id_off[id] != UINT32_MAX) {
            s = t->pool + t->id_off[id];
            len = t->id_len[id];
        } else {
            return h3_err(H3_E_INVALID, "h3_detokenize: id %d (position %lld) is not in the vocabulary",
                          id, (long long)i);
        }
        /* ByteLevel decoding: a token whose every character is a GPT-2 byte character becomes
           those bytes; any other token is copied as it is (HF does the same). */
        const unsigned char *u = (const unsigned char *)s;
        bool mapped = true;
        for (size_t p = 0; p < len && mapped;) {
            int l;
            uint32_t c = u8_dec(u + p, &l);
            mapped = c < 0x144 && t->char_byte[c] >= 0;
            p += (size_t)l;
        }
        for (size_t p = 0; p < len;) {
            int l = 1;
            unsigned char b = u[p];
            if (mapped) b = (unsigned char)t->char_byte[u8_dec(u + p, &l)];
            if (total < cap) out[total] = (char)b;
            total++;
            p += (size_t)l;
        }
    }
    return total;
}
