/*
 * Fuzz target: libh3's JSON reader (core/json.c) on arbitrary bytes. A parse either fails with
 * a message or yields a DOM whose every index, offset and count is consistent; the lookups the
 * config loaders use (h3j_get, h3j_path, h3j_at, h3_cfg_int, h3_cfg_num) agree with a plain walk
 * of that DOM; and the document written back out as JSON parses to the same DOM (so escapes,
 * surrogate pairs, numbers and nesting are read as they are written). libFuzzer-compatible entry
 * point; with gcc it runs under tests/fuzz/driver.c.
 */
#include "core/internal.h"
#include "fuzz.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAIL() __builtin_trap()


/* Every value reachable from v is well formed; returns how many values the subtree holds. */
static size_t check_tree(const h3_json *d, const h3j *v, int depth)
{
    if (depth > 300) FAIL(); /* the reader refuses nesting deeper than 256 */
    if (v->type > H3J_OBJ) FAIL();
    if (v->type == H3J_STR) {
        if ((size_t)v->str + v->len >= d->pool_n || d->pool[v->str + v->len] != 0) FAIL();
        if (!utf8_ok((const unsigned char *)h3j_str(d, v), v->len)) FAIL();
    }
    /* the exact integer and the double are the same number (both correctly rounded) */
    if (v->type == H3J_NUM && v->is_int && (double)v->i != v->num) FAIL();
    if (v->type != H3J_ARR && v->type != H3J_OBJ) {
        if (v->child != -1) FAIL();
        return 1;
    }
    size_t count = 1, kids = 0;
    for (const h3j *c = h3j_first(d, v); c; c = h3j_next(d, c)) {
        if (c < d->v || c >= d->v + d->n || c <= v) FAIL(); /* children come after their parent */
        if (v->type == H3J_OBJ) {
            if ((size_t)c->key + c->keylen >= d->pool_n || d->pool[c->key + c->keylen] != 0) FAIL();
            if (!utf8_ok((const unsigned char *)h3j_key(d, c), c->keylen)) FAIL();
        }
        if (++kids > d->n) FAIL(); /* a cycle */
        count += check_tree(d, c, depth + 1);
    }
    if (kids != v->len) FAIL();
    /* lookups: by index, by key (the last duplicate wins), through a path, as config numbers */
    uint32_t i = 0;
    for (const h3j *c = h3j_first(d, v); c; c = h3j_next(d, c), i++) {
        if (h3j_at(d, v, i) != (v->type == H3J_ARR ? c : NULL)) FAIL();
        if (v->type != H3J_OBJ) continue;
        const char *key = h3j_key(d, c);
        if (strlen(key) != c->keylen) continue; /* keys with NUL bytes cannot be looked up by C string */
        const h3j *g = h3j_get(d, v, key);
        if (!g || g->keylen != c->keylen || memcmp(h3j_key(d, g), key, c->keylen) != 0 || g < c) FAIL();
        if (h3j_path(d, v, key, (const char *)NULL) != g) FAIL();
        int64_t iv = 0;
        double dv = 0;
        int ri = h3_cfg_int(d, v, &iv, key, (const char *)NULL), rn = h3_cfg_num(d, v, &dv, key, (const char *)NULL);
        if ((ri == 0) != (g->type == H3J_NUM && g->is_int) || (ri == 0 && iv != g->i)) FAIL();
        if ((rn == 0) != (g->type == H3J_NUM) || (rn == 0 && !(dv == g->num || (isnan(dv) && isnan(g->num))))) FAIL();
        /* an absent alias first, then the key: the first present alias answers */
        static const char absent[] = "\x01no such key";
        if (!h3j_get(d, v, absent) && h3_cfg_num(d, v, &dv, absent, key, (const char *)NULL) != rn) FAIL();
        if (g->type == H3J_OBJ && h3j_first(d, g)) {
            const h3j *gc = h3j_first(d, g);
            const char *k2 = h3j_key(d, gc);
            if (strlen(k2) == gc->keylen && !h3j_path(d, v, key, k2, (const char *)NULL)) FAIL();
        }
    }
    if (v->type == H3J_ARR && h3j_at(d, v, v->len) != NULL) FAIL();
    if (v->type != H3J_OBJ && h3j_get(d, v, "") != NULL) FAIL();
    return count;
}

/* ---- writing the DOM back out ------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t n, cap;
} sbuf;

static void put(sbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static void put_str(sbuf *b, const char *s, size_t n)
{
    put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char e[8];
        if (c == '"' || c == '\\') {
            e[0] = '\\', e[1] = (char)c;
            put(b, e, 2);
        } else if (c < 0x20) {
            snprintf(e, sizeof e, "\\u%04x", c);
            put(b, e, 6);
        } else {
            put(b, (const char *)&c, 1); /* the reader only stores valid UTF-8 */
        }
    }
    put(b, "\"", 1);
}

/* 0, or -1 when a number has no finite JSON spelling (1e999 reads as inf). */
static int write_value(sbuf *b, const h3_json *d, const h3j *v)
{
    char num[64];
    switch (v->type) {
    case H3J_NULL: put(b, "null", 4); return 0;
    case H3J_TRUE: put(b, "true", 4); return 0;
    case H3J_FALSE: put(b, "false", 5); return 0;
    case H3J_NUM:
        if (v->is_int) {
            put(b, num, (size_t)snprintf(num, sizeof num, "%lld", (long long)v->i));
            return 0;
        }
        if (!isfinite(v->num)) return -1;
        /* a fraction keeps it a non-integer on the way back, as it was read */
        put(b, num, (size_t)snprintf(num, sizeof num, "%.17e", v->num));
        return 0;
    case H3J_STR: put_str(b, h3j_str(d, v), v->len); return 0;
    default: {
        bool obj = v->type == H3J_OBJ;
        put(b, obj ? "{" : "[", 1);
        int rc = 0;
        for (const h3j *c = h3j_first(d, v); c && !rc; c = h3j_next(d, c)) {
            if (c != h3j_first(d, v)) put(b, ",", 1);
            if (obj) {
                put_str(b, h3j_key(d, c), c->keylen);
                put(b, ":", 1);
            }
            rc = write_value(b, d, c);
        }
        put(b, obj ? "}" : "]", 1);
        return rc;
    }
    }
}

/* Same values, same keys, same order. */
static bool same(const h3_json *a, const h3j *x, const h3_json *b, const h3j *y)
{
    if (x->type != y->type || x->len != y->len) return false;
    if (x->type == H3J_NUM) return x->is_int == y->is_int && (x->is_int ? x->i == y->i : x->num == y->num);
    if (x->type == H3J_STR) return memcmp(h3j_str(a, x), h3j_str(b, y), x->len) == 0;
    const h3j *p = h3j_first(a, x), *q = h3j_first(b, y);
    for (; p && q; p = h3j_next(a, p), q = h3j_next(b, q)) {
        if (x->type == H3J_OBJ &&
            (p->keylen != q->keylen || memcmp(h3j_key(a, p), h3j_key(b, q), p->keylen) != 0))
            return false;
        if (!same(a, p, b, q)) return false;
    }
    return !p && !q;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    h3_json doc;
    h3_err_clear();
    int rc = h3_json_parse(&doc, (const char *)data, size);
    if (rc != 0) {
        /* a refusal names the problem, and leaves an empty document behind */
        if (rc >= 0 || !h3_last_error()[0] || doc.v || doc.pool || doc.n) FAIL();
        return 0;
    }
    const h3j *root = h3j_root(&doc);
    if (!root || check_tree(&doc, root, 0) != doc.n) FAIL(); /* every value is reachable once */
    sbuf out = {0};
    if (write_value(&out, &doc, root) == 0) {
        h3_json again;
        if (h3_json_parse(&again, out.p, out.n) != 0) FAIL();
        if (!same(&doc, root, &again, h3j_root(&again))) FAIL();
        h3_json_free(&again);
    }
    free(out.p);
    h3_json_free(&doc);
    return 0;
}

/* ---- seeds for tests/fuzz/driver.c -------------------------------------------------------- */

#define S(x) {(const uint8_t *)(x), sizeof(x) - 1}
static const fuzz_input k_seeds[] = {
    S("{}"),
    S("[]"),
    S("0"),
    S("\"\""),
    S("{\"hidden_size\": 64, \"num_layers\": 2, \"patch_size\": [1, 2, 2], \"rope_theta\": 10000.0, "
      "\"eps\": 1e-05, \"neg\": -0.5, \"big\": 18446744073709551616, \"min\": -9223372036854775808, "
      "\"flag\": true, \"off\": false, \"none\": null}"),
    S("{\"text_config\": {\"hidden_size\": 48, \"rope_parameters\": {\"rope_type\": \"default\", "
      "\"mrope_section\": [4, 2, 2]}}, \"minimax_h3_conditioning_layer\": 3}"),
    S("{\"a\": 1, \"a\": 2, \"b\": {\"a\": [1, [2, [3, {\"c\": \"d\"}]]]}}"),
    S("[\"esc \\\" \\\\ \\/ \\b \\f \\n \\r \\t\", \"\\u0041\\u00e9\\u4e2d\\ud83d\\ude00\", \"\\u0000x\", "
      "\"\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80\"]"),
    S("{\"metadata\": {\"kwargs\": {\"decoder_rates\": [5, 5, 2], \"resblock_dilation_sizes\": [[1, 3], [1, 3]]}}}"),
    S(" \t\r\n[ 1 , 2.5 , -3e+2 , 4E-1 , 0.0 ] \n"),
};

static const char *const k_dict[] = {
    "{", "}", "[", "]", ",", ":", "\"", "\\", "\"a\"", "\"a\":", "null", "true", "false", "0", "-0", "1", "-1",
    "1.5", "1e5", "1E-5", "2.5e+3", "0.", ".5", "01", "-", "+1", "1e", "9223372036854775807", "9223372036854775808",
    "-9223372036854775808", "-9223372036854775809", "18446744073709551615", "1e309", "-1e309", "4.9e-324",
    "123456789012345678901234567890123456789012345678901234567890123456789012345", "\\u0000", "\\u00e9",
    "\\ud800", "\\udc00", "\\ud83d\\ude00", "\\ud83d\\u0041", "\\uZZZZ", "\\x", "\\n", "\xc3\xa9", "\xe4\xb8\xad",
    "\xf0\x9f\x98\x80", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xff", "\x01", " ", "\t", "\r\n",
    "\"hidden_size\"", "\"text_config\"", "[[[[[[[[[[[[[[[[", "]]]]]]]]]]]]]]]]", "{\"k\":{\"k\":{\"k\":",
};

const fuzz_target *fuzz_target_info(void)
{
    static const fuzz_target t = {"fuzz_json", 4096, k_seeds, sizeof k_seeds / sizeof *k_seeds, k_dict,
                                  sizeof k_dict / sizeof *k_dict, 0};
    return &t;
}
