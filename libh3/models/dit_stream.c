/*
 * Weight streaming of the transformer's blocks under a memory budget (h3_options.vram_bytes).
 *
 * The budget covers every GEMM weight the transformer holds: the refiner, the projections and
 * heads (always resident), the main blocks that stay resident, and the slots the others stream
 * through. The main blocks' four GEMM weights (qkv, out, fc1, fc2: ~0.72 GiB of bf16 per block
 * at the released widths) are what streams; their norm vectors stay resident (kilobytes).
 *
 * Which blocks stay: as many as fit after two slots, spread evenly over the stack from block 0 on
 * (block i stays when ceil((i + 1) r / L) > ceil(i r / L)), so the copy of a streamed block also
 * overlaps the resident blocks before it, not only the streamed one in the other slot, and the
 * first copies of a forward overlap block 0.
 *
 * GPU: each streamed block is loaded once through weight_load (so bf16 rounding or fp8
 * quantisation happen exactly as for a resident block), copied back to pinned host memory in that
 * device form (weight_save) and let go on the device, before the ring exists (so the block in
 * transit fits the budget's room for the slots). A forward then copies each one into a ring
 * slot on the backend's copy stream, two blocks ahead at most, and its GEMMs read the slot through
 * weight_view: the same bytes, the same plans, the same bits as the resident path
 * (backend/cuda/cuda_stream.cu has the stream and event ordering).
 *
 * CPU: blocks that stay are views of the mapping as always; streamed blocks are read with pread
 * from their shards into two slots by the block streamer's reader thread (core/streamer.h), the
 * next block while this one computes, trusting the page cache. The GEMMs see the stored bytes
 * through weight_load's view of the slot, as they see the mapping: the same bits. LoRA merges and
 * int8 copies are made from the mapping at load, so a budget on the CPU takes neither.
 *
 * Auto (0): the CPU keeps every block (its weights are page-cache backed mappings already); a
 * GPU keeps every block when they fit its free memory with DIT_AUTO_MARGIN to spare (today's
 * path, untouched), else streams with the free memory less that margin as the budget.
 *
 * Packed copies (GPU, bf16 blocks): at the released widths a bf16 block takes longer to cross
 * PCIe than to compute (14.0 against 9.9 ms at 7,135 tokens), so the staged image is packed
 * losslessly (core/wpack.h: sign+mantissa bytes, 4-bit exponent codes, ~76 % of the bytes) into
 * pinned memory of its own size. A packed ring (ring_open_packed) copies a block's image into its
 * slot's staging on the copy stream, and decodes it when the block is acquired, on the compute
 * stream, into the one buffer the GEMMs read: the same words as a plain copy, hence the same bits.
 * Its memory is that buffer plus two stagings of up to 85 % of a block (h3_wpack_stream_max),
 * 2.7 blocks against the plain ring's 2. The copies are plain when the budget holds two slots but
 * not that, with H3_STREAM_PACK=0, for fp8 images (one byte per value already), and for every
 * block when one of them packs to more than 85 % (a rare pattern of exponents; its bytes are
 * then unpacked on the host once).
 */
#include "core/wpack.h"
#include "models/dit_internal.h"
#include "core/streamer.h"

/* What auto keeps free on a GPU for the activations of a request (about 6.3 GiB at the released
   widths and 37,838 tokens), the tables and the other stages' work. */
#define DIT_AUTO_MARGIN ((int64_t)8 << 30)
#define DIT_SLOTS 2

int64_t h3_dit_stream_keep(int64_t avail, uint64_t block_bytes, uint64_t ring_bytes)
{
    const int64_t B = (int64_t)block_bytes;
    return B > 0 && avail >= B * DIT_SLOTS ? (avail - (int64_t)ring_bytes) / B : -1;
}

int h3_dit_stream_slots(void) { return DIT_SLOTS; }
#define CPU_ALIGN 64u

static double gib(uint64_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }

static bool on_gpu(const h3_dit *d)
{
    return h3_backend_has(d->be, H3_CAP_RINGS | H3_CAP_PINNED);
}

/* Bytes a loaded weight holds: its device form on a GPU, its elements (and an int8 copy's
   scales) on the CPU. */
static uint64_t held(const h3_dit *d, const h3_bw *w)
{
    if (!w->data && !w->priv) return 0;
    if (on_gpu(d)) return d->be->weights->weight_bytes(d->be, w);
    return (uint64_t)(w->rows * w->cols) * h3_dtype_size(w->dtype) + (w->priv ? (uint64_t)w->rows * 4 : 0);
}

/* CPU: the stored tensor of part k of block i, checked as host_mat checks it. */
static int cpu_tensor(h3_dit *d, int i, int k, const h3_tensor **out)
{
    char name[112];
    snprintf(name, sizeof name, "blocks.%d.%s.weight", i, h3_dit_gemm_part(k));
    int64_t rows, cols;
    h3_dit_gemm_shape(&d->w.c, k, &rows, &cols);
    const h3_tensor *t = h3_store_find(d->st, name);
    if (!t) return h3_err(H3_E_SCHEMA, "transformer: tensor '%s' is missing", name);
    if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols ||
        (t->dtype != H3_DT_F32 && t->dtype != H3_DT_BF16 && t->dtype != H3_DT_F16))
        return h3_err(H3_E_SCHEMA, "transformer: tensor '%s' must be a [%lld, %lld] F32, BF16 or F16 matrix", name,
                      (long long)rows, (long long)cols);
    *out = t;
    return 0;
}

/* The packer's chunks over the context's threads (the bytes do not depend on the split). */
static void pool_run(void *ctx, int64_t n, h3_wpack_task fn, void *arg) { h3_parallel_for(ctx, n, 16, fn, arg); }

/* GPU, bf16: the saved image of block b at *host packed into pinned memory of its own size, the
   unpacked copy let go (*host, *bytes updated); left as it is when packing saves too little. */
static int pack_block(h3_dit *d, dit_block *b, void **host, size_t *bytes)
{
    h3_backend *be = d->be;
    for (int k = 0; k < 4; k++)
        if (b->like[k].dtype != H3_DT_BF16) return 0;
    const uint64_t n = d->ws.blk_bytes / 2; /* every part is a multiple of 256 bytes */
    /* One scan sizes the image and feeds the write: the block's words are read twice, not three times. */
    h3_wpack_plan plan;
    int rc = h3_wpack_scan(*host, n, H3_WPACK_CHUNK, pool_run, d->pool, &plan);
    if (rc) return rc;
    const uint64_t size = plan.layout.total;
    void *p = NULL;
    if (size <= h3_wpack_stream_max(d->ws.blk_bytes)) { /* else it saves too little: the block stays plain */
        p = be->mem->host_alloc(be, (size_t)size);
        rc = p ? h3_wpack_write(&plan, p, size, pool_run, d->pool) : -H3_E_NOMEM;
    }
    h3_wpack_plan_free(&plan);
    if (rc && p) be->mem->host_free(be, p);
    if (rc || !p) return rc;
    be->mem->host_free(be, *host);
    *host = p;
    *bytes = (size_t)size;
    b->packed = true;
    d->ws.n_packed++;
    return 0;
}

/* GPU: block i's weights (loaded now unless they are) copied to pinned host memory in their
   device form (packed when the plan chose the packed ring: d->ws.stage_bytes), then let go on the
   device. */
static int gpu_stage(h3_dit *d, int i)
{
    dit_block *b = &d->w.blk[i];
    h3_backend *be = d->be;
    int rc = 0;
    /* The block passes through the device on its way to host memory: without the slots there, the
       budget holds it (the budget has room for two slots and one block is less). The next forward
       allocates them again. */
    if (d->ws.ring) {
        be->weights->ring_close(be, d->ws.ring);
        d->ws.ring = NULL;
    }
    if (!b->qkv.data && (rc = dit_load_block_weights(d, b, "blocks", i))) return rc;
    for (int k = 0; k < 4; k++) {
        const size_t want = (k < 3 ? d->ws.blk_off[k + 1] : d->ws.blk_bytes) - d->ws.blk_off[k];
        if (be->weights->weight_bytes(be, dit_gemm(b, k)) != want) {
            dit_unload_block_weights(d, i);
            return h3_err(H3_E_SCHEMA, "transformer: block %d's %s differs in form from block 0's: it cannot stream "
                          "through the same slots", i, h3_dit_gemm_part(k));
        }
    }
    void *host = be->mem->host_alloc(be, d->ws.blk_bytes);
    if (!host) {
        dit_unload_block_weights(d, i);
        return -H3_E_NOMEM;
    }
    for (int k = 0; k < 4 && !rc; k++) {
        rc = be->weights->weight_save(be, dit_gemm(b, k), (char *)host + d->ws.blk_off[k]);
        b->like[k] = *dit_gemm(b, k);
    }
    dit_unload_block_weights(d, i);
    size_t bytes = d->ws.blk_bytes;
    if (!rc && d->ws.stage_bytes) rc = pack_block(d, b, &host, &bytes);
    if (rc) {
        be->mem->host_free(be, host);
        return rc;
    }
    b->host = host;
    b->host_bytes = bytes;
    b->loaded = true;
    return 0;
}

int dit_stream_stage(h3_dit *d, int i)
{
    dit_block *b = &d->w.blk[i];
    if (!b->streamed || b->loaded) return 0;
    if (on_gpu(d)) return gpu_stage(d, i);
    /* CPU: nothing is held (the streamer checked the tensors when it opened). */
    b->loaded = true;
    return 0;
}

void dit_stream_unstage(h3_dit *d, int i)
{
    dit_block *b = &d->w.blk[i];
    if (b->host) d->be->mem->host_free(d->be, b->host);
    b->host = NULL;
    b->host_bytes = 0;
    d->ws.n_packed -= b->packed;
    b->packed = false;
    b->loaded = false;
}

/* CPU: the streamer over the streamed blocks' stored tensors. */
static int cpu_open_streamer(h3_dit *d)
{
    const int L = d->w.c.layers;
    h3_stream_read *all = h3_calloc((size_t)L * 4, sizeof *all);
    const h3_stream_read **reads = h3_calloc((size_t)L, sizeof *reads);
    int *n = h3_calloc((size_t)L, sizeof *n);
    int rc = all && reads && n ? 0 : -H3_E_NOMEM;
    for (int i = 0; i < L && !rc; i++) {
        reads[i] = all + (size_t)i * 4;
        if (!d->w.blk[i].streamed) continue;
        for (int k = 0; k < 4 && !rc; k++) {
            const h3_tensor *t;
            if ((rc = cpu_tensor(d, i, k, &t))) break;
            const size_t extent = (k < 3 ? d->ws.blk_off[k + 1] : d->ws.blk_bytes) - d->ws.blk_off[k];
            if (t->end - t->begin > extent) {
                rc = h3_err(H3_E_SCHEMA, "transformer: block %d's %s is stored wider than block 0's: it cannot "
                            "stream through the same slots", i, h3_dit_gemm_part(k));
                break;
            }
            all[(size_t)i * 4 + k] = (h3_stream_read){t, d->ws.blk_off[k]};
            d->w.blk[i].like[k] = (h3_bw){NULL, t->dtype, t->shape[0], t->shape[1], NULL};
        }
        n[i] = 4;
    }
    if (!rc) rc = h3_streamer_open(d->st, L, reads, n, d->ws.blk_bytes, d->ws.slots, NULL, 1, "transformer blocks",
                                      &d->ws.streamer);
    free(all);
    free(reads);
    free(n);
    return rc;
}

int dit_stream_plan(h3_dit *d, int64_t vram, bool pack)
{
    const int L = d->w.c.layers;
    h3_backend *be = d->be;
    const bool gpu = on_gpu(d);
    if (vram < 0) return h3_err(H3_E_INVALID, "transformer: a memory budget of %lld bytes", (long long)vram);
    if (L < 1) return 0;
    /* What is held whatever the budget: the refiner, projections and heads. */
    uint64_t fixed = held(d, &d->w.cond) + held(d, &d->w.vout) + held(d, &d->w.aout) + held(d, &d->w.vproj) +
                     held(d, &d->w.aproj);
    for (int i = 0; i < d->w.c.refiner_layers; i++)
        for (int k = 0; k < 4; k++) fixed += held(d, dit_gemm(&d->w.ref[i], k));
    /* One block in a slot: a GPU's device form (learnt from block 0, loaded now), or the stored
       tensors on the CPU. */
    size_t B = 0;
    int rc = 0;
    if (gpu) {
        if (!d->w.blk[0].loaded && (rc = dit_load_block_weights(d, &d->w.blk[0], "blocks", 0))) return rc;
        for (int k = 0; k < 4; k++) {
            d->ws.blk_off[k] = B;
            B += be->weights->weight_bytes(be, dit_gemm(&d->w.blk[0], k));
        }
    } else if (vram == 0) {
        /* Auto on the CPU: the mappings stay (the page cache backs them). Only the report is made
           here, without checks: the blocks' own loads check their tensors and name the problem. */
        for (int k = 0; k < 4; k++) {
            char name[112];
            snprintf(name, sizeof name, "blocks.0.%s.weight", h3_dit_gemm_part(k));
            const h3_tensor *t = h3_store_find(d->st, name);
            B += t ? (size_t)((t->end - t->begin + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN) : 0;
        }
        d->ws.blk_bytes = B;
        d->ws.held_bytes = fixed + (uint64_t)B * (uint64_t)L;
        return 0;
    } else {
        for (int k = 0; k < 4; k++) {
            const h3_tensor *t;
            if ((rc = cpu_tensor(d, 0, k, &t))) return rc;
            d->ws.blk_off[k] = B;
            B += (size_t)((t->end - t->begin + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN);
        }
    }
    d->ws.blk_bytes = B; /* reported even when every block stays */
    int64_t avail;
    if (vram > 0) {
        avail = vram - (int64_t)fixed;
    } else {
        uint64_t fr = 0, tot = 0;
        if ((rc = be->mem->mem_info(be, &fr, &tot))) return rc;
        avail = (int64_t)fr + (int64_t)B - DIT_AUTO_MARGIN; /* block 0 is on the device already */
    }
    if (avail >= (int64_t)B * L) { /* every block fits: the resident path */
        d->ws.held_bytes = fixed + (uint64_t)B * (uint64_t)L;
        return 0;
    }
    /* A packed ring (one slot of words and two stagings of at most h3_wpack_stream_max) when the
       budget holds it; else the plain ring's two slots (so the smallest budget below stays what it
       says). */
    d->ws.stage_bytes = 0;
    uint64_t ring_bytes = (uint64_t)B * DIT_SLOTS;
    if (gpu && h3_backend_has(be, H3_CAP_PACKED_RING) && pack) {
        bool bf16 = true;
        for (int k = 0; k < 4; k++) bf16 &= dit_gemm(&d->w.blk[0], k)->dtype == H3_DT_BF16;
        const uint64_t stage = h3_wpack_stream_max(B);
        if (bf16 && stage && avail >= (int64_t)(B + DIT_SLOTS * stage)) {
            d->ws.stage_bytes = stage;
            ring_bytes = B + DIT_SLOTS * stage;
        }
    }
    int64_t keep = h3_dit_stream_keep(avail, B, ring_bytes);
    if (keep < 0) {
        if (vram > 0)
            return h3_err(H3_E_INVALID,
                          "vram budget %.3f GiB is below what the transformer needs with its blocks streamed: %.3f "
                          "GiB (%.3f GiB of other weights + %d slots of %.3f GiB)",
                          gib((uint64_t)vram), gib(fixed + (uint64_t)B * DIT_SLOTS), gib(fixed), DIT_SLOTS, gib(B));
        keep = 0; /* auto on a card that is short even of that: try, and let the allocation say */
    }
    if (!gpu && (d->w.lora || d->w.precision != H3_PRECISION_DEFAULT))
        return h3_err(H3_E_UNSUPPORTED, "a vram budget streams the stored block weights on the CPU, so it cannot be "
                      "combined with LoRA files or int8 precision there (%.3f GiB would keep every block)",
                      gib(fixed + (uint64_t)B * (uint64_t)L));
    d->ws.n_streamed = 0;
    for (int i = 0; i < L; i++) { /* ceil((i + 1) k / L) > ceil(i k / L): block 0 first */
        d->w.blk[i].streamed = !(((int64_t)(i + 1) * keep + L - 1) / L > ((int64_t)i * keep + L - 1) / L);
        d->ws.n_streamed += d->w.blk[i].streamed;
    }
    d->ws.blk_bytes = B;
    d->ws.slots = DIT_SLOTS;
    d->ws.held_bytes = fixed + (uint64_t)B * (uint64_t)(L - d->ws.n_streamed) + ring_bytes;
    if (!(d->ws.pass = h3_malloc(sizeof *d->ws.pass * (size_t)L))) return -H3_E_NOMEM;
    if (!gpu) return cpu_open_streamer(d);
    /* Block 0 was loaded to learn the form: keep it, or make it the first streamed copy. The ring
       is allocated by the first forward (dit_stream_begin), after every block is staged. */
    return d->w.blk[0].streamed ? gpu_stage(d, 0) : 0;
}

/* GPU: the packed streamed blocks' images decoded back to plain ones on the host (when another
   block could not be packed, the ring is a plain one). */
static int unpack_blocks(h3_dit *d)
{
    h3_backend *be = d->be;
    for (int i = 0; i < d->w.c.layers; i++) {
        dit_block *b = &d->w.blk[i];
        if (!b->streamed || !b->packed) continue;
        void *plain = be->mem->host_alloc(be, d->ws.blk_bytes);
        if (!plain) return -H3_E_NOMEM;
        int rc = h3_wpack_decode(b->host, b->host_bytes, plain, d->ws.blk_bytes / 2);
        if (rc) {
            be->mem->host_free(be, plain);
            return rc;
        }
        be->mem->host_free(be, b->host);
        b->host = plain;
        b->host_bytes = d->ws.blk_bytes;
        b->packed = false;
        d->ws.n_packed--;
    }
    return 0;
}

/* GPU: queue the copy of block b into ring slot s, packed or plain as it was staged. */
static int gpu_fill(h3_dit *d, int s, const dit_block *b)
{
    h3_backend *be = d->be;
    if (b->packed) return be->weights->ring_fill_packed(be, d->ws.ring, s, b->host, b->host_bytes, d->ws.blk_bytes);
    return be->weights->ring_fill(be, d->ws.ring, s, b->host, d->ws.blk_bytes);
}

int dit_stream_begin(h3_dit *d, const int *seq, int n)
{
    if (n > d->w.c.layers) return h3_err(H3_E_INVALID, "transformer: a pass of %d streamed blocks", n);
    for (int j = 0; j < n; j++)
        if (!d->w.blk[seq[j]].streamed || !d->w.blk[seq[j]].loaded)
            return h3_err(H3_E_INVALID, "transformer: block %d is not ready to stream", seq[j]);
    memcpy(d->ws.pass, seq, sizeof *seq * (size_t)n);
    d->ws.pass_n = n;
    if (d->ws.streamer) return h3_streamer_begin(d->ws.streamer, seq, n);
    int rc;
    if (!d->ws.ring) {
        h3_backend *be = d->be;
        /* Packed only when every streamed block is; else the packed ones go back to plain images. */
        if (d->ws.n_packed > 0 && d->ws.n_packed < d->ws.n_streamed && (rc = unpack_blocks(d))) return rc;
        rc = d->ws.n_packed > 0
                 ? be->weights->ring_open_packed(be, d->ws.slots, d->ws.blk_bytes, d->ws.stage_bytes, &d->ws.ring)
                 : be->weights->ring_open(be, d->ws.slots, d->ws.blk_bytes, &d->ws.ring);
        if (rc) return rc;
    }
    /* The first slots fill at once: they overlap whatever runs before their blocks. */
    for (int j = 0; j < n && j < d->ws.slots; j++)
        if ((rc = gpu_fill(d, j % d->ws.slots, &d->w.blk[seq[j]]))) return rc;
    return 0;
}

int dit_stream_acquire(h3_dit *d, int j, int b, dit_block *view)
{
    h3_backend *be = d->be;
    *view = d->w.blk[b];
    const uint8_t *base;
    int rc;
    if (d->ws.streamer) {
        if ((rc = h3_streamer_get(d->ws.streamer, &base))) return rc;
    } else {
        void *dev;
        if ((rc = be->weights->ring_wait(be, d->ws.ring, j % d->ws.slots, &dev))) return rc;
        base = dev;
    }
    for (int k = 0; k < 4; k++) {
        const h3_bw *like = &d->w.blk[b].like[k];
        h3_bw *w = dit_gemm(view, k);
        if (d->ws.streamer) {
            /* The CPU's weight_load of stored bytes at the default precision is a view: nothing to free. */
            rc = be->weights->weight_load(be, base + d->ws.blk_off[k], like->dtype, like->rows, like->cols, w);
            if (!rc && w->priv) {
                be->weights->weight_free(be, w);
                rc = h3_err(H3_E_UNSUPPORTED, "transformer: the backend copied a streamed weight (only views stream)");
            }
        } else {
            rc = be->weights->weight_view(be, like, base + d->ws.blk_off[k], w);
        }
        if (rc) return rc;
    }
    return 0;
}

int dit_stream_release(h3_dit *d, int j)
{
    d->ws.stream_bytes += d->ws.blk_bytes;
    d->ws.copy_bytes += d->ws.streamer ? d->ws.blk_bytes : d->w.blk[d->ws.pass[j]].host_bytes;
    if (d->ws.streamer) {
        h3_streamer_done(d->ws.streamer);
        return 0;
    }
    h3_backend *be = d->be;
    const int s = j % d->ws.slots;
    int rc = be->weights->ring_done(be, d->ws.ring, s);
    /* The slot refills with the block `slots` places on, once these GEMMs are done with it. */
    if (!rc && j + d->ws.slots < d->ws.pass_n)
        rc = gpu_fill(d, s, &d->w.blk[d->ws.pass[j + d->ws.slots]]);
    return rc;
}

void dit_stream_close(h3_dit *d)
{
    if (d->ws.ring) d->be->weights->ring_close(d->be, d->ws.ring);
    d->ws.ring = NULL;
    h3_streamer_close(d->ws.streamer);
    d->ws.streamer = NULL;
    if (d->w.blk)
        for (int i = 0; i < d->w.c.layers; i++)
            if (d->w.blk[i].streamed) dit_stream_unstage(d, i);
    free(d->ws.pass);
    d->ws.pass = NULL;
}

void h3_dit_stream_info(const h3_dit *d, int *streamed, int *blocks, uint64_t *held_bytes, uint64_t *streamed_bytes,
                        uint64_t *block_bytes, uint64_t *copied_bytes, int *packed)
{
    if (copied_bytes) *copied_bytes = d->ws.copy_bytes;
    if (packed) *packed = d->ws.n_packed;
    if (block_bytes) *block_bytes = d->ws.blk_bytes;
    if (streamed) *streamed = d->ws.n_streamed;
    if (blocks) *blocks = d->w.c.layers;
    if (held_bytes) *held_bytes = d->ws.held_bytes;
    if (streamed_bytes) *streamed_bytes = d->ws.stream_bytes;
}
