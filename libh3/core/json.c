/*
 * A strict RFC 8259 JSON reader producing a flat DOM. It serves safetensors headers, component
 * configs and tokenizer.json (a few MB with ~300k values), so values live in one array and
 * strings in one pool, with offsets instead of pointers while the arrays grow.
 */
#include "core/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define H3J_MAX_DEPTH 256

typedef struct {
    h3_json *d;
    const char *s, *end, *p;
    int depth;
} jparser;

static int jerr(jparser *ps, const char *what)
{
    int line = 1, col = 1;
    for (const char *q = ps->s; q < ps->p && q < ps->end; q++) {
        if (*q == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    return h3_err(H3_E_FORMAT, "line %d, column %d: %s", line, col, what);
}

static int32_t jnew(jparser *ps, uint8_t type)
{
    h3_json *d = ps->d;
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 64;
        if (cap > (size_t)INT32_MAX) return -1;
        h3j *v = h3_realloc(d->v, cap * sizeof *v);
        if (!v) return -1;
        d->v = v;
        d->cap = cap;
    }
    h3j *v = &d->v[d->n];
    memset(v, 0, sizeof *v);
    v->type = type;
    v->next = -1;
    v->child = -1;
    return (int32_t)d->n++;
}

static int pool_reserve(h3_json *d, size_t extra)
{
    if (d->pool_n + extra + 1 <= d->pool_cap) return 0;
    size_t cap = d->pool_cap ? d->pool_cap : 256;
    while (cap < d->pool_n + extra + 1) cap *= 2;
    if (cap > UINT32_MAX) return h3_err(H3_E_FORMAT, "JSON strings exceed 4 GiB");
    char *p = h3_realloc(d->pool, cap);
    if (!p) return -H3_E_NOMEM;
    d->pool = p;
    d->pool_cap = cap;
    return 0;
}

static void skip_ws(jparser *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static int hex4(const char *p, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

/* Length of a valid UTF-8 sequence starting at p (strict: no overlongs, no surrogates). */
static int utf8_len(const unsigned char *p, const unsigned char *end)
{
    unsigned c = p[0];
    if (c < 0x80) return 1;
    int n;
    unsigned min;
    if ((c & 0xE0) == 0xC0) {
        n = 2;
        min = 0x80;
        c &= 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
        n = 3;
        min = 0x800;
        c &= 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
        n = 4;
        min = 0x10000;
        c &= 0x07;
    } else {
        return -1;
    }
    if (end - p < n) return -1;
    for (int i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80) return -1;
        c = (c << 6) | (p[i] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return -1;
    return n;
}

static void put_utf8(char *o, size_t *n, unsigned cp)
{
    if (cp < 0x80) {
        o[(*n)++] = (char)cp;
    } else if (cp < 0x800) {
        o[(*n)++] = (char)(0xC0 | (cp >> 6));
        o[(*n)++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        o[(*n)++] = (char)(0xE0 | (cp >> 12));
        o[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[(*n)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        o[(*n)++] = (char)(0xF0 | (cp >> 18));
        o[(*n)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        o[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[(*n)++] = (char)(0x80 | (cp & 0x3F));
    }
}

/* Parse a string at ps->p (which points at the opening quote) into the pool. */
static int parse_string(jparser *ps, uint32_t *off, uint32_t *len)
{
    h3_json *d = ps->d;
    const char *q = ps->p + 1;
    /* Unescaped output is never longer than the input. */
    const char *close = q;
    while (close < ps->end && *close != '"') {
        if (*close == '\\') close++;
        close++;
    }
    if (close >= ps->end) {
        ps->p = ps->end;
        return jerr(ps, "unterminated string");
    }
    int rc = pool_reserve(d, (size_t)(close - q));
    if (rc) return rc;
    char *o = d->pool + d->pool_n;
    size_t n = 0;
    while (q < close) {
        unsigned char c = (unsigned char)*q;
        if (c == '\\') {
            q++;
            switch (*q) {
            case '"': o[n++] = '"'; q++; break;
            case '\\': o[n++] = '\\'; q++; break;
            case '/': o[n++] = '/'; q++; break;
            case 'b': o[n++] = '\b'; q++; break;
            case 'f': o[n++] = '\f'; q++; break;
            case 'n': o[n++] = '\n'; q++; break;
            case 'r': o[n++] = '\r'; q++; break;
            case 't': o[n++] = '\t'; q++; break;
            case 'u': {
                unsigned cp;
                if (close - q < 5 || hex4(q + 1, &cp)) {
                    ps->p = q;
                    return jerr(ps, "bad \\u escape");
                }
                q += 5;
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    unsigned lo;
                    if (close - q < 6 || q[0] != '\\' || q[1] != 'u' || hex4(q + 2, &lo) ||
                        lo < 0xDC00 || lo > 0xDFFF) {
                        ps->p = q;
                        return jerr(ps, "unpaired UTF-16 surrogate in \\u escape");
                    }
                    q += 6;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    ps->p = q;
                    return jerr(ps, "unpaired UTF-16 surrogate in \\u escape");
                }
                put_utf8(o, &n, cp);
                break;
            }
            default:
                ps->p = q;
                return jerr(ps, "bad escape in string");
            }
        } else if (c < 0x20) {
            ps->p = q;
            return jerr(ps, "control character in string");
        } else if (c < 0x80) {
            o[n++] = (char)c;
            q++;
        } else {
            int k = utf8_len((const unsigned char *)q, (const unsigned char *)close);
            if (k < 0) {
                ps->p = q;
                return jerr(ps, "invalid UTF-8 in string");
            }
            memcpy(o + n, q, (size_t)k);
            n += (size_t)k;
            q += k;
        }
    }
    o[n] = 0;
    *off = (uint32_t)d->pool_n;
    *len = (uint32_t)n;
    d->pool_n += n + 1;
    ps->p = close + 1;
    return 0;
}

static int parse_number(jparser *ps, h3j *v)
{
    const char *q = ps->p, *start = q;
    bool integral = true;
    if (q < ps->end && *q == '-') q++;
    if (q >= ps->end) return jerr(ps, "bad number");
    if (*q == '0') {
        q++;
    } else if (*q >= '1' && *q <= '9') {
        while (q < ps->end && *q >= '0' && *q <= '9') q++;
    } else {
        return jerr(ps, "bad number");
    }
    if (q < ps->end && *q == '.') {
        integral = false;
        q++;
        if (q >= ps->end || *q < '0' || *q > '9') {
            ps->p = q;
            return jerr(ps, "bad number: digit expected after '.'");
        }
        while (q < ps->end && *q >= '0' && *q <= '9') q++;
    }
    if (q < ps->end && (*q == 'e' || *q == 'E')) {
        integral = false;
        q++;
        if (q < ps->end && (*q == '+' || *q == '-')) q++;
        if (q >= ps->end || *q < '0' || *q > '9') {
            ps->p = q;
            return jerr(ps, "bad number: digit expected in exponent");
        }
        while (q < ps->end && *q >= '0' && *q <= '9') q++;
    }
    size_t n = (size_t)(q - start);
    char tmp[64];
    if (n >= sizeof tmp) {
        /* Very long literals only matter as doubles; keep the leading digits' magnitude. */
        char *big = h3_malloc(n + 1);
        if (!big) return -H3_E_NOMEM;
        memcpy(big, start, n);
        big[n] = 0;
        v->num = strtod(big, NULL);
        free(big);
        integral = false;
    } else {
        memcpy(tmp, start, n);
        tmp[n] = 0;
        v->num = strtod(tmp, NULL);
        if (integral) {
            /* Exact int64 parse; byte offsets in safetensors headers must not go through a double. */
            const char *r = tmp;
            bool neg = *r == '-';
            if (neg) r++;
            uint64_t acc = 0;
            bool fits = true;
            for (; *r; r++) {
                unsigned dgt = (unsigned)(*r - '0');
                if (acc > (UINT64_MAX - dgt) / 10) {
                    fits = false;
                    break;
                }
                acc = acc * 10 + dgt;
            }
            if (fits && !neg && acc <= (uint64_t)INT64_MAX) {
                v->i = (int64_t)acc;
            } else if (fits && neg && acc <= (uint64_t)INT64_MAX + 1) {
                v->i = (int64_t)(0 - acc);
            } else {
                integral = false;
            }
        }
    }
    v->is_int = integral;
    ps->p = q;
    return 0;
}

static int parse_value(jparser *ps, int32_t *out);

static int parse_container(jparser *ps, int32_t idx, bool is_obj)
{
    if (++ps->depth > H3J_MAX_DEPTH) return jerr(ps, "nesting deeper than 256 levels");
    ps->p++; /* '[' or '{' */
    skip_ws(ps);
    char closer = is_obj ? '}' : ']';
    if (ps->p < ps->end && *ps->p == closer) {
        ps->p++;
        ps->depth--;
        return 0;
    }
    int32_t prev = -1;
    uint32_t count = 0;
    for (;;) {
        uint32_t koff = 0, klen = 0;
        skip_ws(ps);
        if (is_obj) {
            if (ps->p >= ps->end || *ps->p != '"') return jerr(ps, "object key (a string) expected");
            int rc = parse_string(ps, &koff, &klen);
            if (rc) return rc;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') return jerr(ps, "':' expected after object key");
            ps->p++;
        }
        int32_t child;
        int rc = parse_value(ps, &child);
        if (rc) return rc;
        if (is_obj) {
            ps->d->v[child].key = koff;
            ps->d->v[child].keylen = klen;
        }
        if (prev < 0)
            ps->d->v[idx].child = child;
        else
            ps->d->v[prev].next = child;
        prev = child;
        count++;
        skip_ws(ps);
        if (ps->p >= ps->end) return jerr(ps, is_obj ? "unterminated object" : "unterminated array");
        if (*ps->p == ',') {
            ps->p++;
            continue;
        }
        if (*ps->p == closer) {
            ps->p++;
            break;
        }
        return jerr(ps, is_obj ? "',' or '}' expected" : "',' or ']' expected");
    }
    ps->d->v[idx].len = count;
    ps->depth--;
    return 0;
}

static int parse_value(jparser *ps, int32_t *out)
{
    skip_ws(ps);
    if (ps->p >= ps->end) return jerr(ps, "value expected, found end of input");
    char c = *ps->p;
    int32_t idx;
    switch (c) {
    case '{':
    case '[':
        idx = jnew(ps, c == '{' ? H3J_OBJ : H3J_ARR);
        if (idx < 0) return -H3_E_NOMEM;
        *out = idx;
        return parse_container(ps, idx, c == '{');
    case '"': {
        idx = jnew(ps, H3J_STR);
        if (idx < 0) return -H3_E_NOMEM;
        uint32_t off, len;
        int rc = parse_string(ps, &off, &len);
        if (rc) return rc;
        ps->d->v[idx].str = off;
        ps->d->v[idx].len = len;
        *out = idx;
        return 0;
    }
    case 't':
    case 'f':
    case 'n': {
        const char *word = c == 't' ? "true" : c == 'f' ? "false" : "null";
        size_t n = strlen(word);
        if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0)
            return jerr(ps, "unexpected character");
        idx = jnew(ps, c == 't' ? H3J_TRUE : c == 'f' ? H3J_FALSE : H3J_NULL);
        if (idx < 0) return -H3_E_NOMEM;
        ps->p += n;
        *out = idx;
        return 0;
    }
    default:
        if (c == '-' || (c >= '0' && c <= '9')) {
            idx = jnew(ps, H3J_NUM);
            if (idx < 0) return -H3_E_NOMEM;
            h3j tmp;
            memset(&tmp, 0, sizeof tmp);
            int rc = parse_number(ps, &tmp);
            if (rc) return rc;
            ps->d->v[idx].num = tmp.num;
            ps->d->v[idx].i = tmp.i;
            ps->d->v[idx].is_int = tmp.is_int;
            *out = idx;
            return 0;
        }
        return jerr(ps, "unexpected character");
    }
}

int h3_json_parse(h3_json *doc, const char *text, size_t len)
{
    memset(doc, 0, sizeof *doc);
    jparser ps = {doc, text, text + len, text, 0};
    if (len > UINT32_MAX) return h3_err(H3_E_FORMAT, "JSON text larger than 4 GiB");
    /* A UTF-8 byte-order mark is not JSON; HF tools never write one. */
    int32_t root;
    int rc = parse_value(&ps, &root);
    if (rc == 0) {
        skip_ws(&ps);
        if (ps.p != ps.end) rc = jerr(&ps, "trailing characters after the JSON value");
    }
    if (rc) h3_json_free(doc);
    return rc;
}

int h3_json_parse_file(h3_json *doc, const char *path, size_t max_len)
{
    char *text;
    size_t len;
    memset(doc, 0, sizeof *doc);
    int rc = h3_read_file(path, &text, &len, max_len);
    if (rc) return rc;
    rc = h3_json_parse(doc, text, len);
    free(text);
    if (rc) h3_err_prefix("%s: malformed JSON", path);
    return rc;
}

void h3_json_free(h3_json *doc)
{
    free(doc->v);
    free(doc->pool);
    memset(doc, 0, sizeof *doc);
}

const h3j *h3j_get(const h3_json *d, const h3j *obj, const char *key)
{
    if (!obj || obj->type != H3J_OBJ) return NULL;
    size_t kl = strlen(key);
    /* Later duplicates win, as in Python's json module. */
    const h3j *found = NULL;
    for (const h3j *c = h3j_first(d, obj); c; c = h3j_next(d, c))
        if (c->keylen == kl && memcmp(d->pool + c->key, key, kl) == 0) found = c;
    return found;
}

const h3j *h3j_path(const h3_json *d, const h3j *obj, ...)
{
    va_list ap;
    va_start(ap, obj);
    const char *k;
    while (obj && (k = va_arg(ap, const char *)) != NULL) obj = h3j_get(d, obj, k);
    va_end(ap);
    return obj;
}

const h3j *h3j_at(const h3_json *d, const h3j *arr, uint32_t index)
{
    if (!arr || arr->type != H3J_ARR || index >= arr->len) return NULL;
    const h3j *c = h3j_first(d, arr);
    while (index-- && c) c = h3j_next(d, c);
    return c;
}

/* The first of the NULL-terminated alias keys in `ap` that holds a number (an integer when `want_int`). */
static const h3j *cfg_first_num(const h3_json *d, const h3j *obj, bool want_int, va_list ap)
{
    const char *k;
    while ((k = va_arg(ap, const char *)) != NULL) {
        const h3j *v = h3j_get(d, obj, k);
        if (v && v->type == H3J_NUM && (v->is_int || !want_int)) return v;
    }
    return NULL;
}

int h3_cfg_int(const h3_json *d, const h3j *obj, int64_t *out, ...)
{
    va_list ap;
    va_start(ap, out);
    const h3j *v = cfg_first_num(d, obj, true, ap);
    va_end(ap);
    if (!v) return -1;
    *out = v->i;
    return 0;
}

int h3_cfg_num(const h3_json *d, const h3j *obj, double *out, ...)
{
    va_list ap;
    va_start(ap, out);
    const h3j *v = cfg_first_num(d, obj, false, ap);
    va_end(ap);
    if (!v) return -1;
    *out = v->num;
    return 0;
}
