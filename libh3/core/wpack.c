/*
 * wpack: the host packer and the reference unpacker of packed bf16 words (wpack.h has the format).
 *
 * The packer works chunk by chunk in two passes, h3_wpack_scan (E0 and the escape counts: the
 * packed size) and h3_wpack_write (the bytes), so chunks can be spread over threads: each chunk
 * writes only its own bytes, and the escape offsets are an exclusive prefix taken serially between
 * the passes, so the output is the same whatever the split. A caller that sizes its buffer from the
 * scan writes from the same scan: the words are read twice in all, not three times. The reference
 * unpacker checks every field: it serves tests and the CPU, and a packed image it accepts decodes
 * to exactly the words that were packed.
 */
#include "core/wpack.h"

#include <stdlib.h>
#include <string.h>

static int chunk_ok(uint32_t chunk) { return chunk >= 2 && chunk <= (1u << 20) && chunk % 2 == 0; }

static unsigned expo(uint16_t v) { return (v >> 7) & 0xFFu; }

/* The hot loops run over groups of G values with a constant trip count, which the compiler's
   vectoriser takes at -O2 (a packer pass over a 0.77 GB block is then a fraction of a second per
   thread); the tail of a short last chunk runs one value at a time. */
#define G 16

/* E0 of the m values at v, and how many of them escape. */
static uint32_t scan_chunk(const uint16_t *v, uint64_t m, uint8_t *e0)
{
    const uint64_t mg = m / G * G;
    unsigned mx = 0;
    for (uint64_t i = 0; i < mg; i += G) {
        uint16_t t = 0;
        for (int k = 0; k < G; k++) {
            const uint16_t e = (uint16_t)((v[i + k] >> 7) & 0xFFu);
            t = e > t ? e : t;
        }
        mx = t > mx ? t : mx;
    }
    for (uint64_t i = mg; i < m; i++) mx = expo(v[i]) > mx ? expo(v[i]) : mx;
    uint32_t esc = 0;
    const uint16_t lim = (uint16_t)(mx >= 15u ? mx - 14u : 0u); /* e escapes when e < E0 - 14 */
    for (uint64_t i = 0; i < mg; i += G) {
        uint16_t t = 0;
        for (int k = 0; k < G; k++) t += (uint16_t)(((v[i + k] >> 7) & 0xFFu) < lim);
        esc += t;
    }
    for (uint64_t i = mg; i < m; i++) esc += expo(v[i]) < lim;
    *e0 = (uint8_t)mx;
    return esc;
}

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

typedef struct {
    const uint16_t *src;
    uint64_t n, chunk;
    uint8_t *e0;     /* [chunks] */
    uint32_t *count; /* [chunks]: escapes of each chunk (pass 1) */
    uint8_t *dst;    /* pass 2 */
    h3_wpack_layout l;
} pack_job;

static uint64_t chunk_len(const pack_job *j, int64_t c)
{
    const uint64_t b = (uint64_t)c * j->chunk;
    return j->n - b < j->chunk ? j->n - b : j->chunk;
}

static void scan_task(void *arg, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    pack_job *j = arg;
    for (int64_t c = begin; c < end; c++)
        j->count[c] = scan_chunk(j->src + (uint64_t)c * j->chunk, chunk_len(j, c), &j->e0[c]);
}

static void write_task(void *arg, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    pack_job *j = arg;
    uint8_t *sm = j->dst + j->l.sm, *nib = j->dst + j->l.nib, *esc = j->dst + j->l.esc;
    const uint8_t *e0t = j->dst + j->l.e0;
    const uint8_t *escoff = j->dst + j->l.escoff;
    for (int64_t c = begin; c < end; c++) {
        const uint64_t b = (uint64_t)c * j->chunk, m = chunk_len(j, c), mg = m / G * G;
        /* restrict: the output bytes never alias the input words (else the loops would not vectorise) */
        const uint16_t *restrict v = j->src + b;
        const unsigned mx = e0t[c];
        uint8_t *restrict s8 = sm + b, *restrict n8 = nib + b / 2; /* chunk even: codes start on a byte */
        for (uint64_t i = 0; i < mg; i += G) {
            for (int k = 0; k < G; k++) s8[i + k] = (uint8_t)(((v[i + k] >> 8) & 0x80u) | (v[i + k] & 0x7Fu));
            /* two values per 32-bit word (little-endian: the even one low), so the loads stay contiguous */
            uint32_t pair[G / 2];
            memcpy(pair, v + i, sizeof pair);
            for (int k = 0; k < G / 2; k++) {
                const uint32_t d0 = mx - ((pair[k] >> 7) & 0xFFu), d1 = mx - ((pair[k] >> 23) & 0xFFu);
                n8[i / 2 + k] = (uint8_t)((d0 > 14u ? 15u : d0) | (d1 > 14u ? 15u : d1) << 4);
            }
        }
        for (uint64_t i = mg; i < m; i++) {
            const unsigned d = mx - expo(v[i]), code = d > 14u ? 15u : d;
            s8[i] = (uint8_t)(((v[i] >> 8) & 0x80u) | (v[i] & 0x7Fu));
            if (i % 2 == 0)
                n8[i / 2] = (uint8_t)code;
            else
                n8[i / 2] |= (uint8_t)(code << 4);
        }
        /* The escapes in value order; most chunks have none, so the scan is skipped. */
        const uint32_t e_begin = h3_wpack_get32(escoff + 4 * c), e_end = h3_wpack_get32(escoff + 4 * (c + 1));
        if (e_begin == e_end) continue;
        uint8_t *ep = esc + e_begin;
        for (uint64_t i = 0; i < m; i++)
            if (mx - expo(v[i]) > 14u) *ep++ = (uint8_t)expo(v[i]);
    }
}

static void run_tasks(h3_wpack_runner run, void *ctx, int64_t n, h3_wpack_task fn, void *arg)
{
    if (n <= 0) return;
    if (run)
        run(ctx, n, fn, arg);
    else
        fn(arg, 0, n, 0);
}

void h3_wpack_plan_free(h3_wpack_plan *p)
{
    if (!p) return;
    free(p->e0);
    free(p->count);
    p->e0 = NULL;
    p->count = NULL;
}

int h3_wpack_scan(const uint16_t *src, uint64_t n, uint32_t chunk, h3_wpack_runner run, void *run_ctx,
                  h3_wpack_plan *out)
{
    memset(out, 0, sizeof *out);
    if (!chunk_ok(chunk)) return h3_err(H3_E_INVALID, "wpack: chunk %u (an even number in [2, 2^20])", chunk);
    const uint64_t chunks = (n + chunk - 1) / chunk;
    out->e0 = malloc(chunks ? chunks : 1);
    out->count = malloc(sizeof *out->count * (chunks ? chunks : 1));
    if (!out->e0 || !out->count) {
        h3_wpack_plan_free(out);
        return h3_err(H3_E_NOMEM, "wpack: out of memory for %llu chunk tables", (unsigned long long)chunks);
    }
    pack_job j = {.src = src, .n = n, .chunk = chunk, .e0 = out->e0, .count = out->count};
    run_tasks(run, run_ctx, (int64_t)chunks, scan_task, &j);
    uint64_t escapes = 0;
    for (uint64_t c = 0; c < chunks; c++) escapes += out->count[c];
    out->src = src;
    out->n = n;
    out->chunk = chunk;
    out->layout = h3_wpack_layout_of(n, chunk, escapes);
    return 0;
}

uint64_t h3_wpack_size(const uint16_t *src, uint64_t n, uint32_t chunk, h3_wpack_runner run, void *run_ctx)
{
    h3_wpack_plan p;
    if (h3_wpack_scan(src, n, chunk, run, run_ctx, &p)) return 0;
    h3_wpack_plan_free(&p);
    return p.layout.total;
}

int h3_wpack_write(const h3_wpack_plan *p, void *dst, uint64_t dst_bytes, h3_wpack_runner run, void *run_ctx)
{
    const h3_wpack_layout l = p->layout;
    const uint64_t n = p->n, chunks = l.chunks, escapes = l.escapes;
    if (escapes > UINT32_MAX)
        return h3_err(H3_E_INVALID, "wpack: %llu escapes (the offsets are 32-bit)", (unsigned long long)escapes);
    if (dst_bytes < l.total)
        return h3_err(H3_E_INVALID, "wpack: %llu bytes cannot hold the packed image of %llu bytes",
                      (unsigned long long)dst_bytes, (unsigned long long)l.total);
    uint8_t *d = dst;
    memset(d, 0, H3_WPACK_HEADER);
    put32(d, H3_WPACK_MAGIC);
    put32(d + 4, H3_WPACK_VERSION);
    put64(d + 8, n);
    put32(d + 16, p->chunk);
    put64(d + 24, chunks);
    put64(d + 32, escapes);
    put64(d + 40, l.total);
    /* Section padding as zeros: the same input gives the same bytes. */
    memcpy(d + l.e0, p->e0, chunks);
    memset(d + l.e0 + chunks, 0, l.escoff - l.e0 - chunks);
    uint64_t acc = 0; /* escapes < 2^32 (checked above) */
    for (uint64_t c = 0; c < chunks; c++) {
        put32(d + l.escoff + 4 * c, (uint32_t)acc);
        acc += p->count[c];
    }
    put32(d + l.escoff + 4 * chunks, (uint32_t)acc);
    memset(d + l.escoff + 4 * (chunks + 1), 0, l.sm - l.escoff - 4 * (chunks + 1));
    memset(d + l.sm + n, 0, l.nib - l.sm - n);
    memset(d + l.nib + (n + 1) / 2, 0, l.esc - l.nib - (n + 1) / 2);
    memset(d + l.esc + escapes, 0, l.total - l.esc - escapes);
    pack_job j = {.src = p->src, .n = n, .chunk = p->chunk, .dst = d, .l = l};
    run_tasks(run, run_ctx, (int64_t)chunks, write_task, &j);
    return 0;
}

int h3_wpack_encode(const uint16_t *src, uint64_t n, uint32_t chunk, void *dst, uint64_t dst_bytes,
                    h3_wpack_runner run, void *run_ctx)
{
    h3_wpack_plan p;
    int rc = h3_wpack_scan(src, n, chunk, run, run_ctx, &p);
    if (!rc) rc = h3_wpack_write(&p, dst, dst_bytes, run, run_ctx);
    h3_wpack_plan_free(&p);
    return rc;
}

int h3_wpack_header(const void *packed, uint64_t bytes, h3_wpack_layout *l)
{
    const uint8_t *p = packed;
    if (!p || bytes < H3_WPACK_HEADER)
        return h3_err(H3_E_FORMAT, "wpack: a packed image of %llu bytes is shorter than its header",
                      (unsigned long long)bytes);
    if (h3_wpack_get32(p) != H3_WPACK_MAGIC || h3_wpack_get32(p + 4) != H3_WPACK_VERSION)
        return h3_err(H3_E_FORMAT, "wpack: not a packed image of version %u (magic %08x, version %u)", H3_WPACK_VERSION,
                      h3_wpack_get32(p), h3_wpack_get32(p + 4));
    const uint64_t n = h3_wpack_get64(p + 8), chunks = h3_wpack_get64(p + 24), escapes = h3_wpack_get64(p + 32);
    const uint64_t total = h3_wpack_get64(p + 40);
    const uint32_t chunk = h3_wpack_get32(p + 16);
    /* n and escapes are bounded by the size before the layout arithmetic, which cannot overflow then. */
    if (!chunk_ok(chunk) || h3_wpack_get32(p + 20) != 0 || n > bytes || escapes > n ||
        chunks != (n + chunk - 1) / chunk)
        return h3_err(H3_E_FORMAT, "wpack: a bad header (n %llu, chunk %u, chunks %llu, escapes %llu)",
                      (unsigned long long)n, chunk, (unsigned long long)chunks, (unsigned long long)escapes);
    *l = h3_wpack_layout_of(n, chunk, escapes);
    if (l->total != total || total > bytes)
        return h3_err(H3_E_FORMAT, "wpack: a packed image of %llu bytes, %llu expected (header says %llu)",
                      (unsigned long long)bytes, (unsigned long long)l->total, (unsigned long long)total);
    return 0;
}

int h3_wpack_decode(const void *packed, uint64_t bytes, uint16_t *out, uint64_t n)
{
    h3_wpack_layout l;
    int rc = h3_wpack_header(packed, bytes, &l);
    if (rc) return rc;
    if (l.n != n)
        return h3_err(H3_E_FORMAT, "wpack: the packed image holds %llu values, %llu expected", (unsigned long long)l.n,
                      (unsigned long long)n);
    const uint8_t *p = packed;
    const uint8_t *e0t = p + l.e0, *sm = p + l.sm, *nib = p + l.nib, *esc = p + l.esc;
    const uint8_t *escoff = p + l.escoff;
    if (h3_wpack_get32(escoff) != 0 || h3_wpack_get32(escoff + 4 * l.chunks) != l.escapes)
        return h3_err(H3_E_FORMAT, "wpack: the escape offsets do not span the %llu escapes",
                      (unsigned long long)l.escapes);
    if (n % 2 && nib[n / 2] >> 4)
        return h3_err(H3_E_FORMAT, "wpack: a code past the last value");
    for (uint64_t c = 0; c < l.chunks; c++) {
        const uint64_t b = c * l.chunk, m = n - b < l.chunk ? n - b : l.chunk;
        const uint32_t e_begin = h3_wpack_get32(escoff + 4 * c), e_end = h3_wpack_get32(escoff + 4 * (c + 1));
        if (e_end < e_begin || e_end - e_begin > m)
            return h3_err(H3_E_FORMAT, "wpack: chunk %llu's escape offsets %u..%u", (unsigned long long)c, e_begin,
                          e_end);
        const unsigned mx = e0t[c];
        uint32_t k = e_begin;
        bool has_max = false;
        for (uint64_t i = 0; i < m; i++) {
            const unsigned code = (nib[(b + i) / 2] >> (4 * ((b + i) & 1))) & 0xFu;
            unsigned e;
            if (code == 15u) {
                if (k == e_end)
                    return h3_err(H3_E_FORMAT, "wpack: chunk %llu has more escapes than its offsets say",
                                  (unsigned long long)c);
                e = esc[k++];
                /* Canonical: an escape is an exponent more than 14 below E0 (E0 is the chunk's max). */
                if (e > mx || mx - e <= 14u)
                    return h3_err(H3_E_FORMAT, "wpack: chunk %llu escapes exponent %u under E0 %u",
                                  (unsigned long long)c, e, mx);
            } else {
                if (code > mx)
                    return h3_err(H3_E_FORMAT, "wpack: chunk %llu has code %u under E0 %u", (unsigned long long)c,
                                  code, mx);
                e = mx - code;
                has_max |= code == 0;
            }
            out[b + i] = (uint16_t)(((unsigned)(sm[b + i] >> 7) << 15) | e << 7 | (sm[b + i] & 0x7Fu));
        }
        if (k != e_end)
            return h3_err(H3_E_FORMAT, "wpack: chunk %llu has fewer escapes than its offsets say",
                          (unsigned long long)c);
        if (m && !has_max)
            return h3_err(H3_E_FORMAT, "wpack: chunk %llu's E0 %u is not its largest exponent", (unsigned long long)c,
                          mx);
    }
    return 0;
}
