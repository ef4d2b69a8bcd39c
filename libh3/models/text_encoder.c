/*
 * Text conditioner: the Qwen3-VL language model over a prompt, up to the hidden state MiniMax-H3
 * conditions on (with keyframes, vision_tower.c hands h3_text_forward_vl the rows to splice in).
 * The oracle is transformers' Qwen3VLForConditionalGeneration:
 *
 *   h = embed_tokens[ids]                                   (hidden_states[0])
 *   for each decoder layer l < K:                           (hidden_states[l + 1])
 *       a = RMSNorm(h) ; q, k, v = a Wq^T, a Wk^T, a Wv^T
 *       q, k = per-head RMSNorm(q, k) (q_norm / k_norm, before RoPE), then RoPE
 *       h += o_proj(causal GQA attention(q, k, v), scale 1/sqrt(head_dim))
 *       h += down(silu(RMSNorm(h) Wg^T) * (RMSNorm(h) Wu^T))
 *   out = h after layer K-1 = hidden_states[K]              (no final norm)
 *
 * Positions. Qwen3-VL rotates with interleaved mRoPE: frequency slot j takes its angle from the
 * t, h or w position (j mod 3 for j < 3*mrope_section[1|2], else t). For a text-only prompt the
 * model builds position ids 0..n-1 and broadcasts them to all three axes, so every slot sees the
 * same position and the layout collapses to ordinary 1-D RoPE: angle(p, j) = p * inv_freq[j],
 * inv_freq[j] = theta^(-2j/head_dim), applied rotate-half style (dims j and j + head_dim/2).
 * transformers forms inv_freq and the angle in f32; we do the same so the argument rounding
 * matches, and take cos/sin of that f32 angle. With vision rows the positions are 3-D
 * (get_rope_index) and rope_table picks each slot's axis; text-only prompts use the row index.
 *
 * Streaming. Only layers 0..K-1 are read, one at a time, into the slots of core/streamer
 * (layers_open). The embedding table is touched only at the rows of the prompt's tokens. On a
 * backend with a weight stream (a GPU) the slots are its pinned buffers and each layer's bytes go
 * to a device slot on a copy stream while the previous layer computes (layer_stream; the
 * backend's wstream_* ops).
 */
#include "models/text_encoder.h"
#include "core/host.h" /* h3_to_f32: weights are widened on the host before upload */
#include "core/streamer.h"
#include "core/singlefile.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the read plan: which bytes each layer needs ------------------------------------------ */

enum {
    W_IN_NORM, W_Q, W_K, W_V, W_Q_NORM, W_K_NORM, W_O, W_POST_NORM, W_GATE, W_UP, W_DOWN, W_COUNT
};

static const char *const k_wname[W_COUNT] = {
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
    "self_attn.v_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "self_attn.o_proj.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight",
    "mlp.up_proj.weight", "mlp.down_proj.weight",
};

#define TE_ALIGN 64u
#define TE_EMBED "model.language_model.embed_tokens.weight"

typedef struct {
    const h3_tensor *t[W_COUNT];
    size_t off[W_COUNT];   /* offset of each tensor inside the layer buffer (64-byte aligned) */
    /* A single file's int8 GEMM weight computed from its stored codes (core/singlefile.h): t is the
       codes tensor, sc its per-row scales (at sc_off), group its ConvRot group; sc NULL otherwise. */
    const h3_tensor *sc[W_COUNT];
    size_t sc_off[W_COUNT];
    int group[W_COUNT];
    h3_stream_read reads[2 * W_COUNT]; /* sorted by (file, offset): the order they are read in */
    int nreads;
    uint64_t bytes;        /* stored bytes of the layer (what is read) */
    size_t buf_bytes;      /* bytes of buffer it needs (with alignment padding) */
} te_layer;

typedef struct {
    h3_text_cfg cfg;
    h3_store *store;
    const h3_tensor *embed;
    te_layer *layers;      /* cfg.cond_layer entries */
    size_t slot_bytes;     /* largest buf_bytes */
    bool native;           /* some GEMM weights are stored int8 codes (te_layer.sc) */
} te_plan;

static const h3_tensor *layer_tensor(h3_store *s, int layer, int w)
{
    char name[160];
    snprintf(name, sizeof name, "model.language_model.layers.%d.%s", layer, k_wname[w]);
    return h3_store_find(s, name);
}

/* Read order of a layer's tensors: by (shard, offset), so each shard is read front to back and the
   kernel's readahead sees one sequential stream. Insertion sort: 11 items. */
static bool before(const h3_tensor *x, const h3_tensor *y)
{
    return x->file != y->file ? x->file < y->file : x->begin < y->begin;
}

static void sort_reads(te_layer *L)
{
    L->nreads = 0;
    for (int i = 0; i < W_COUNT; i++) {
        L->reads[L->nreads++] = (h3_stream_read){L->t[i], L->off[i]};
        if (L->sc[i]) L->reads[L->nreads++] = (h3_stream_read){L->sc[i], L->sc_off[i]};
    }
    for (int i = 1; i < L->nreads; i++)
        for (int j = i; j > 0 && before(L->reads[j].t, L->reads[j - 1].t); j--) {
            const h3_stream_read t = L->reads[j];
            L->reads[j] = L->reads[j - 1];
            L->reads[j - 1] = t;
        }
}

bool h3_text_gemm_weight(const char *name)
{
    static const char *const parts[] = {"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                        "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                                        "mlp.gate_proj.weight",    "mlp.up_proj.weight",
                                        "mlp.down_proj.weight"};
    const char *pfx = "model.language_model.layers.";
    if (strncmp(name, pfx, strlen(pfx)) != 0) return false;
    char *end;
    strtol(name + strlen(pfx), &end, 10);
    if (end == name + strlen(pfx) || *end != '.') return false;
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++)
        if (strcmp(end + 1, parts[i]) == 0) return true;
    return false;
}

static void plan_free(te_plan *p)
{
    free(p->layers);
    memset(p, 0, sizeof *p);
}

/* Config + headers + schema (shapes and float dtypes of everything read), then the byte plan. */
static int plan_build(h3_model *m, te_plan *p)
{
    memset(p, 0, sizeof *p);
    int rc;
    if ((rc = h3_text_cfg_load(m, &p->cfg)) || (rc = h3_model_headers(m, H3_COMP_TEXT_ENCODER)) ||
        (rc = h3_model_validate(m, H3_COMP_TEXT_ENCODER)))
        return rc;
    p->store = &m->comp[H3_COMP_TEXT_ENCODER].store;
    p->embed = h3_store_find(p->store, TE_EMBED);
    p->layers = h3_calloc((size_t)p->cfg.cond_layer, sizeof *p->layers);
    if (!p->embed || !p->layers) {
        bool oom = p->embed != NULL;
        plan_free(p);
        return oom ? -H3_E_NOMEM : h3_err(H3_E_SCHEMA, "tensor '%s' is missing", TE_EMBED);
    }
    for (int l = 0; l < p->cfg.cond_layer; l++) {
        te_layer *L = &p->layers[l];
        size_t off = 0;
        for (int w = 0; w < W_COUNT; w++) {
            L->t[w] = layer_tensor(p->store, l, w);
            if (!L->t[w]) { /* the schema check above makes this unreachable; keep the invariant */
                plan_free(p);
                return h3_err(H3_E_SCHEMA, "text encoder: layer %d has no %s", l, k_wname[w]);
            }
            const h3_tensor *codes, *scale;
            char name[160];
            snprintf(name, sizeof name, "model.language_model.layers.%d.%s", l, k_wname[w]);
            if (h3_sf_qtensor(p->store, name, &codes, &scale, &L->group[w])) {
                L->t[w] = codes;
                L->sc[w] = scale;
                p->native = true;
            }
            uint64_t len = L->t[w]->end - L->t[w]->begin;
            L->off[w] = off;
            L->bytes += len;
            off += (size_t)((len + TE_ALIGN - 1) / TE_ALIGN * TE_ALIGN);
            if (L->sc[w]) {
                len = L->sc[w]->end - L->sc[w]->begin;
                L->sc_off[w] = off;
                L->bytes += len;
                off += (size_t)((len + TE_ALIGN - 1) / TE_ALIGN * TE_ALIGN);
            }
        }
        L->buf_bytes = off;
        sort_reads(L);
        if (off > p->slot_bytes) p->slot_bytes = off;
    }
    return 0;
}

/* ---- layer streaming ---------------------------------------------------------------------- */
/*
 * Layers are read by libh3's one weight reader, core/streamer (why pread into slots, and what
 * it measured, is written there): item l is layer l, its tensors read in (shard, offset) order to
 * their 64-byte aligned offsets in a slot. Two slots with prefetch (the streamer's thread fills
 * layer l + 1 while l computes), one without (H3_TEXT_PREFETCH=0: each layer is read by the main
 * thread before it is used). Either way the bytes computed on are the same: bit-identical results.
 *
 * GPU (weight stream): the slots are the backend's pinned buffers, and a slot is free once the
 * copy to the device out of it is over, not the compute (ops are queued, not run): the main
 * thread queues the copy of layer l, waits for the copy that last read slot (l + 1) % slots
 * (layer l + 1 - slots, queued a layer ago), marks that layer done so that the streamer refills
 * the slot with layer l + 1, then queues layer l's ops behind its copy. Reads, copies and compute
 * of neighbouring layers overlap. One thread copying out of the page cache moves ~5-10 GB/s, well
 * below PCIe, so there a layer is read by several threads (H3_TEXT_READERS).
 */

/* Slots: 2 with prefetch (one if there is a single layer), else 1. */
static int reader_slots(const te_plan *p, bool prefetch) { return prefetch && p->cfg.cond_layer > 1 ? 2 : 1; }

/* The streamer over layers 0..cond_layer-1; `host`: the weight stream's pinned slots, or NULL. */
static int layers_open(const te_plan *p, int slots, void *const *host, int readers, h3_streamer **out)
{
    const int L = p->cfg.cond_layer;
    h3_stream_read *all = h3_malloc(sizeof *all * (size_t)(L > 0 ? L : 1) * 2 * W_COUNT);
    const h3_stream_read **reads = h3_malloc(sizeof *reads * (size_t)(L > 0 ? L : 1));
    int *n = h3_malloc(sizeof *n * (size_t)(L > 0 ? L : 1));
    int rc = -H3_E_NOMEM;
    if (all && reads && n) {
        for (int l = 0; l < L; l++) {
            const te_layer *Y = &p->layers[l];
            for (int i = 0; i < Y->nreads; i++) all[(size_t)l * 2 * W_COUNT + i] = Y->reads[i];
            reads[l] = all + (size_t)l * 2 * W_COUNT;
            n[l] = Y->nreads;
        }
        rc = h3_streamer_open(p->store, L, reads, n, p->slot_bytes ? p->slot_bytes : TE_ALIGN, slots, host, readers,
                              "text encoder", out);
    }
    free(all);
    free(reads);
    free(n);
    return rc;
}

/* Prefetch is on unless the caller says otherwise (H3_OPT_NO_TEXT_PREFETCH, read by the API). */
static bool prefetch_default(void) { return true; }

/* The streamed path: a backend with a weight stream at the default precision (a precision that
   rewrites weights at load, such as fp8 or int8, keeps weight_load). On by default where weights are
   copied to the backend (a GPU); H3_TEXT_STREAM=0 turns it off, H3_TEXT_STREAM=1 turns it on for the
   CPU too (a copy there, which lets CI check the protocol's bits). */
static bool use_stream(const h3_backend *be, const h3_tuning *t)
{
    const int e = t ? t->text_stream : -1;
    if (!h3_backend_has(be, H3_CAP_WSTREAM) || be->weight_precision != H3_PRECISION_DEFAULT || e == 0) return false;
    return !be->is_host || e == 1;
}

/* Threads reading a layer: H3_TEXT_READERS (1-16), else 8 on the streamed path (the host's cores
   are idle while the GPU computes; copying out of the page cache scales to about that many before
   memory bandwidth caps it) and 1 on the CPU path (its compute threads need the cores). */
static int reader_threads(bool streamed, const h3_tuning *t)
{
    if (t && t->text_readers) return t->text_readers; /* already clamped to 1-16 */
    return streamed ? 8 : 1;
}

/* ---- compute ------------------------------------------------------------------------------ */

#define ROPE_ROWS 64 /* positions per upload of the RoPE table */

/*
 * Everything the layers compute on lives in one block of backend memory: the residual stream x,
 * the working buffers, the RoPE table and the layer's norm weights widened to f32. `stage` is a
 * small host buffer for what is prepared on the host (the norm weights, RoPE rows) before upload.
 */
typedef struct {
    int64_t n;
    int H, QD, KD, I, hd, half, heads, kv;
    float *x, *xn, *q, *k, *v, *att, *g, *u; /* [n,H] [n,H] [n,QD] [n,KD] [n,KD] [n,QD] [n,I] [n,I] */
    float *cosb, *sinb;                      /* [n, half] */
    float *w_in, *w_post, *w_qn, *w_kn;      /* norm weights as f32 */
    float *stage;                            /* host: stage_floats(c) */
} te_act;

static uint64_t stage_floats(const h3_text_cfg *c)
{
    uint64_t r = 2ull * ROPE_ROWS * (uint64_t)(c->head_dim / 2);
    return r > (uint64_t)c->hidden ? r : (uint64_t)c->hidden;
}

/* Activation floats for n tokens, excluding the caller's output (see h3_text_memory). */
static uint64_t act_floats(const h3_text_cfg *c, uint64_t n)
{
    uint64_t QD = (uint64_t)c->heads * c->head_dim, KD = (uint64_t)c->kv_heads * c->head_dim;
    return n * (2ull * c->hidden + 2 * QD + 2 * KD + 2ull * c->inter + (uint64_t)c->head_dim) +
           2ull * c->hidden + 2ull * c->head_dim + stage_floats(c);
}

static float *carve(float **cur, uint64_t count)
{
    float *p = *cur;
    *cur += (count + 15) / 16 * 16; /* keep every buffer 64-byte aligned */
    return p;
}

static int act_alloc(te_act *a, h3_backend *be, const h3_text_cfg *c, int n, void **block)
{
    memset(a, 0, sizeof *a);
    a->n = n;
    a->H = c->hidden;
    a->hd = c->head_dim;
    a->half = c->head_dim / 2;
    a->heads = c->heads;
    a->kv = c->kv_heads;
    a->QD = c->heads * c->head_dim;
    a->KD = c->kv_heads * c->head_dim;
    a->I = c->inter;
    uint64_t total = act_floats(c, (uint64_t)n) - stage_floats(c) + 16ull * 16; /* + alignment slack */
    float *cur = *block = be->mem->alloc(be, total * sizeof(float));
    a->stage = h3_malloc(stage_floats(c) * sizeof(float));
    if (!cur || !a->stage)
        return h3_err(H3_E_NOMEM, "text encoder: cannot allocate %llu MiB of activations for %d tokens",
                      (unsigned long long)(total * sizeof(float) >> 20), n);
    uint64_t N = (uint64_t)n;
    a->x = carve(&cur, N * a->H);
    a->xn = carve(&cur, N * a->H);
    a->q = carve(&cur, N * a->QD);
    a->k = carve(&cur, N * a->KD);
    a->v = carve(&cur, N * a->KD);
    a->att = carve(&cur, N * a->QD);
    a->g = carve(&cur, N * a->I);
    a->u = carve(&cur, N * a->I);
    a->cosb = carve(&cur, N * a->half);
    a->sinb = carve(&cur, N * a->half);
    a->w_in = carve(&cur, (uint64_t)a->H);
    a->w_post = carve(&cur, (uint64_t)a->H);
    a->w_qn = carve(&cur, (uint64_t)a->hd);
    a->w_kn = carve(&cur, (uint64_t)a->hd);
    return 0;
}

/* cos/sin of pos * inv_freq[j], with inv_freq and the angle formed in f32 as transformers forms
   them (powf matches torch's f32 pow to the ulp on the tested head sizes). Built on the host
   ROPE_ROWS positions at a time and uploaded. pos NULL: text only, position p is row p. Otherwise
   3-D positions pos[axis][token] (axis 0 t, 1 h, 2 w) in Qwen3-VL's interleaved slot layout: slot j
   takes h when j % 3 == 1 and j < 3 * sec[1], w when j % 3 == 2 and j < 3 * sec[2], else t
   (transformers' recomposition_frequencies). */
static int rope_table(h3_backend *be, te_act *a, double theta, const int32_t *const pos[3], const int sec[3])
{
    const int half = a->half;
    for (int64_t p0 = 0; p0 < a->n; p0 += ROPE_ROWS) {
        const int64_t rows = a->n - p0 < ROPE_ROWS ? a->n - p0 : ROPE_ROWS;
        float *cs = a->stage, *sn = a->stage + rows * half;
        for (int j = 0; j < half; j++) {
            float inv_freq = 1.0f / powf((float)theta, (float)(2 * j) / (float)a->hd);
            const int axis = !pos ? 0 : (j % 3 == 1 && j < 3 * sec[1]) ? 1 : (j % 3 == 2 && j < 3 * sec[2]) ? 2 : 0;
            for (int64_t p = 0; p < rows; p++) {
                float ang = (float)(pos ? (int64_t)pos[axis][p0 + p] : p0 + p) * inv_freq;
                cs[p * half + j] = (float)cos((double)ang);
                sn[p * half + j] = (float)sin((double)ang);
            }
        }
        const size_t bytes = sizeof(float) * (size_t)(rows * half);
        int rc;
        if ((rc = be->mem->upload(be, a->cosb + p0 * half, cs, bytes)) ||
            (rc = be->mem->upload(be, a->sinb + p0 * half, sn, bytes)))
            return rc;
    }
    return 0;
}

static h3_bt f32(float *p, int64_t rows, int64_t cols, int64_t ld) { return h3_bt_make(p, H3_DT_F32, rows, cols, ld); }

/* A norm weight of the layer, widened to f32 on the host and uploaded. */
static int norm_weight(h3_backend *be, const te_layer *L, const uint8_t *buf, int w, float *stage, float *dst)
{
    const int64_t n = L->t[w]->shape[0];
    h3_to_f32(buf + L->off[w], L->t[w]->dtype, stage, n);
    return be->mem->upload(be, dst, stage, sizeof(float) * (size_t)n);
}

/* One decoder layer, in place on the residual stream a->x [n, H]. `W` holds the layer's seven
   GEMM weights as the backend took them (in the W_* order of k_wname, norms skipped). */
static int layer_forward(h3_backend *be, te_act *a, const h3_text_cfg *c, const h3_bw *W)
{
    const h3_backend_ops *o = be->ops;
    const int64_t n = a->n;
    const float eps = (float)c->rms_eps;
    const h3_bt x = f32(a->x, n, a->H, a->H), xn = f32(a->xn, n, a->H, a->H);
    const h3_bt q = f32(a->q, n, a->QD, a->QD), k = f32(a->k, n, a->KD, a->KD), v = f32(a->v, n, a->KD, a->KD);
    const h3_bt att = f32(a->att, n, a->QD, a->QD), g = f32(a->g, n, a->I, a->I), u = f32(a->u, n, a->I, a->I);
    int rc;

    /* attention block: q_norm / k_norm are RMSNorms over each head's head_dim values, before the
       rotation; q and k are normalised and rotated in place. */
    if ((rc = o->norm_mod(be, &x, NULL, a->w_in, NULL, eps, &xn)) || (rc = o->linear(be, &xn, &W[W_Q], NULL, &q)) ||
        (rc = o->linear(be, &xn, &W[W_K], NULL, &k)) || (rc = o->linear(be, &xn, &W[W_V], NULL, &v)) ||
        (rc = o->qk_norm_rope(be, &q, &k, NULL, a->hd, a->w_qn, a->w_kn, a->cosb, a->sinb, a->heads, a->kv, a->hd,
                              a->half, eps, &q, &k, NULL)) ||
        (rc = o->attention(be, &q, &k, &v, a->heads, a->kv, a->hd, (float)(1.0 / sqrt((double)a->hd)), true, &att)) ||
        (rc = o->linear(be, &att, &W[W_O], NULL, &xn)) || (rc = o->gated_add(be, &x, &xn, NULL)))
        return rc;

    /* MLP block */
    if ((rc = o->norm_mod(be, &x, NULL, a->w_post, NULL, eps, &xn)) ||
        (rc = o->linear(be, &xn, &W[W_GATE], NULL, &g)) || (rc = o->linear(be, &xn, &W[W_UP], NULL, &u)) ||
        (rc = o->swiglu(be, &g, &u, &g)) || (rc = o->linear(be, &g, &W[W_DOWN], NULL, &xn)) ||
        (rc = o->gated_add(be, &x, &xn, NULL)))
        return rc;
    return 0;
}

static const int k_gemms[7] = {W_Q, W_K, W_V, W_O, W_GATE, W_UP, W_DOWN};
#define TE_GEMMS ((int)(sizeof k_gemms / sizeof *k_gemms))

static int layer_norms(h3_backend *be, te_act *a, const te_layer *L, const uint8_t *buf)
{
    int rc;
    if ((rc = norm_weight(be, L, buf, W_IN_NORM, a->stage, a->w_in)) ||
        (rc = norm_weight(be, L, buf, W_POST_NORM, a->stage, a->w_post)) ||
        (rc = norm_weight(be, L, buf, W_Q_NORM, a->stage, a->w_qn)) ||
        (rc = norm_weight(be, L, buf, W_K_NORM, a->stage, a->w_kn)))
        return rc;
    return 0;
}

/* The streamed path: the layer's bytes (already in the weight stream's pinned buffer `slot`) sent
   to the device slot; W receives the GEMM weights as views of it. The copy runs on the backend's
   copy stream; the layer's ops wait for it. */
static int layer_stream(h3_backend *be, void *ws, int slot, const te_layer *L, h3_bw *W)
{
    h3_bwspec spec[TE_GEMMS];
    h3_bw got[TE_GEMMS];
    int rc;
    for (int i = 0; i < TE_GEMMS; i++) {
        const h3_tensor *t = L->t[k_gemms[i]];
        spec[i] = (h3_bwspec){L->off[k_gemms[i]], t->dtype, t->shape[0], t->shape[1]};
    }
    if ((rc = be->weights->wstream_load(be, ws, slot, L->buf_bytes, TE_GEMMS, spec, got))) return rc;
    memset(W, 0, sizeof(h3_bw) * W_COUNT);
    for (int i = 0; i < TE_GEMMS; i++) W[k_gemms[i]] = got[i];
    return 0;
}

/* Layer l from its buffer: norm weights uploaded, GEMM weights handed to the backend (views on the
   CPU, device copies on a GPU without a weight stream, released right after the layer). */
static int layer_run(h3_backend *be, te_act *a, const h3_text_cfg *c, const te_layer *L, const uint8_t *buf)
{
    const int *gemms = k_gemms;
    h3_bw W[W_COUNT];
    memset(W, 0, sizeof W);
    int rc, loaded = 0;
    if ((rc = layer_norms(be, a, L, buf))) return rc;
    for (; loaded < TE_GEMMS && !rc; loaded++) {
        const int g = gemms[loaded];
        const h3_tensor *t = L->t[g];
        if (L->sc[g])
            rc = h3_backend_has(be, H3_CAP_I8_WEIGHTS)
                     ? be->weight_load_i8(be, (const int8_t *)(buf + L->off[g]),
                                                   (const float *)(buf + L->sc_off[g]), L->group[g], t->shape[0],
                                                   t->shape[1], &W[g])
                     : h3_err(H3_E_UNSUPPORTED, "text encoder: the %s backend cannot compute on int8 codes", be->name);
        else
            rc = be->weights->weight_load(be, buf + L->off[g], t->dtype, t->shape[0], t->shape[1], &W[g]);
    }
    if (!rc) rc = layer_forward(be, a, c, W);
    for (int i = 0; i < loaded; i++)
        if (W[gemms[i]].data || W[gemms[i]].priv) be->weights->weight_free(be, &W[gemms[i]]);
    return rc;
}

/* ---- layers kept on the device between encodes (h3_text_run.keep) -------------------------- */
/*
 * A GPU with room to spare (the release's 50 layers take ~46 GiB) can hold the layers instead of
 * reading ~930 MiB a layer from the page cache and copying it over PCIe at every encode (~41 ms a
 * layer, against ~1.5 ms of compute). The encode that makes the copy is an ordinary streamed one:
 * after each layer's ops are queued, its GEMM weights (the bf16 bytes the ops read in the slot or
 * the conversion area) are copied device to device into the layer's kept block, in stream order,
 * before the slot is marked free; its norm weights are kept on the host, widened as norm_weight
 * widens them. Later encodes compute on the kept bytes: the same bits as streaming them.
 */
struct h3_text_keep {
    h3_backend *be;
    int layers;
    uint64_t ident;            /* which tensors (plan_ident) */
    void **dev;                /* per layer: one block holding its GEMM weights (256-byte aligned parts) */
    h3_bw (*w)[W_COUNT];       /* per layer: views of the block, in W_* order (norm entries unused) */
    float **norm;              /* per layer: w_in, w_post, q_norm, k_norm widened to f32, one after another */
};

static const int k_norms[4] = {W_IN_NORM, W_POST_NORM, W_Q_NORM, W_K_NORM};

/* FNV-1a over where and what every tensor of every layer is: kept layers serve only the plan
   they were made from. */
static uint64_t plan_ident(const te_plan *p)
{
    uint64_t h = 1469598103934665603ull;
    for (int l = 0; l < p->cfg.cond_layer; l++)
        for (int w = 0; w < W_COUNT; w++) {
            const h3_tensor *t = p->layers[l].t[w];
            const uint64_t v[6] = {(uint64_t)t->file, t->begin, t->end, (uint64_t)t->dtype, (uint64_t)t->shape[0],
                                   (uint64_t)(t->ndim > 1 ? t->shape[1] : 0)};
            const unsigned char *c = (const unsigned char *)v;
            for (size_t i = 0; i < sizeof v; i++) h = (h ^ c[i]) * 1099511628211ull;
        }
    return h;
}

void h3_text_keep_free(h3_text_keep *k)
{
    if (!k) return;
    for (int l = 0; l < k->layers; l++) {
        if (k->dev && k->dev[l]) k->be->mem->release(k->be, k->dev[l]);
        if (k->norm) free(k->norm[l]);
    }
    free(k->dev);
    free(k->w);
    free(k->norm);
    free(k);
}

/* Whether a streamed encode should make kept layers: H3_TEXT_KEEP=1 always (CI checks the bits
   on the CPU with it), 0 never; else on a device backend when its free memory less the layers
   (bf16: 2 bytes a value) stays at or above the caller's reserve. */
static bool keep_wanted(h3_backend *be, const te_plan *p, uint64_t reserve, const h3_tuning *tu)
{
    const int e = tu ? tu->text_keep : -1;
    if (e == 0) return false;
    if (e == 1) return true;
    if (be->is_host) return false; /* host memory: it computes on the mapping */
    uint64_t need = 0, fr = 0, tot = 0;
    for (int l = 0; l < p->cfg.cond_layer; l++)
        for (int i = 0; i < TE_GEMMS; i++) {
            const h3_tensor *t = p->layers[l].t[k_gemms[i]];
            need += (uint64_t)t->shape[0] * (uint64_t)t->shape[1] * 2 + 256;
        }
    if (be->mem->mem_info(be, &fr, &tot)) {
        h3_err_clear();
        return false;
    }
    return fr > need && fr - need >= reserve;
}

static h3_text_keep *keep_new(h3_backend *be, const te_plan *p)
{
    const int L = p->cfg.cond_layer;
    h3_text_keep *k = calloc(1, sizeof *k);
    if (!k) return NULL;
    k->be = be;
    k->layers = L;
    k->ident = plan_ident(p);
    k->dev = calloc((size_t)L, sizeof *k->dev);
    k->w = calloc((size_t)L, sizeof *k->w);
    k->norm = calloc((size_t)L, sizeof *k->norm);
    if (!k->dev || !k->w || !k->norm) {
        h3_text_keep_free(k);
        return NULL;
    }
    return k;
}

static size_t align256(size_t n) { return (n + 255) / 256 * 256; }

/* Layer l into the kept block: W (what its ops read) copied in stream order, norms from the host
   buffer `buf`. -H3_E_NOMEM when the device or host has no room (the caller gives up keeping). */
static int keep_layer(h3_text_keep *k, int l, const te_layer *L, const uint8_t *buf, const h3_bw *W)
{
    h3_backend *be = k->be;
    size_t total = 0, nf = 0;
    for (int i = 0; i < TE_GEMMS; i++) {
        const h3_bw *w = &W[k_gemms[i]];
        if (w->priv || !w->data) return -H3_E_NOMEM; /* not plain bytes: nothing to keep */
        total += align256((size_t)(w->rows * w->cols) * h3_dtype_size(w->dtype));
    }
    for (int j = 0; j < 4; j++) nf += (size_t)L->t[k_norms[j]]->shape[0];
    if (!(k->norm[l] = malloc(sizeof(float) * nf)) || !(k->dev[l] = be->mem->alloc(be, total))) return -H3_E_NOMEM;
    size_t at = 0;
    for (int i = 0; i < TE_GEMMS; i++) {
        const h3_bw *w = &W[k_gemms[i]];
        const size_t bytes = (size_t)(w->rows * w->cols) * h3_dtype_size(w->dtype);
        char *dst = (char *)k->dev[l] + at;
        int rc = be->mem->dcopy(be, dst, w->data, bytes);
        if (rc) return rc;
        k->w[l][k_gemms[i]] = (h3_bw){dst, w->dtype, w->rows, w->cols, NULL};
        at += align256(bytes);
    }
    for (int j = 0, o = 0; j < 4; j++) {
        const h3_tensor *t = L->t[k_norms[j]];
        h3_to_f32(buf + L->off[k_norms[j]], t->dtype, k->norm[l] + o, t->shape[0]);
        o += (int)t->shape[0];
    }
    return 0;
}

/* Layer l's norm weights from the kept host copy (the order keep_layer wrote). */
static int kept_norms(h3_backend *be, te_act *a, const h3_text_keep *k, int l, const te_layer *L)
{
    float *const dst[4] = {a->w_in, a->w_post, a->w_qn, a->w_kn};
    size_t o = 0;
    for (int j = 0; j < 4; j++) {
        const size_t n = (size_t)L->t[k_norms[j]]->shape[0];
        int rc = be->mem->upload(be, dst[j], k->norm[l] + o, sizeof(float) * n);
        if (rc) return rc;
        o += n;
    }
    return 0;
}

/* hidden_states[0]: the prompt's rows of the embedding table, read one by one into out. */
static int embed_rows(h3_streamer *st, const te_plan *p, const int32_t *ids, int n, float *out)
{
    const h3_tensor *t = p->embed;
    const int H = p->cfg.hidden;
    size_t row = (size_t)H * h3_dtype_size(t->dtype);
    void *tmp = h3_alloc_aligned(row);
    if (!tmp) return -H3_E_NOMEM;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        rc = h3_streamer_read(st, t, (uint64_t)ids[i] * row, row, tmp);
        if (!rc) h3_to_f32(tmp, t->dtype, out + (int64_t)i * H, H);
    }
    h3_free_aligned(tmp);
    return rc;
}

int h3_text_check_count(int n)
{
    if (n <= 0)
        return h3_err(H3_E_INVALID,
                      "text encoder: empty prompt (0 tokens); the Qwen3-VL conditioner needs at least one "
                      "token (transformers and diffusers cannot encode an empty prompt either)");
    if (n > H3_TEXT_MAX_TOKENS)
        return h3_err(H3_E_INVALID, "text encoder: %d tokens exceed the limit of %d", n, H3_TEXT_MAX_TOKENS);
    return 0;
}

static int check_ids(const te_plan *p, const int32_t *ids, int n)
{
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= p->cfg.vocab)
            return h3_err(H3_E_INVALID, "text encoder: token id %d at position %d is outside the vocabulary "
                          "[0, %d) of %s", (int)ids[i], i, p->cfg.vocab,
                          p->store->files[p->embed->file].path);
    return 0;
}

/* ---- vision rows (Qwen3-VL placeholders) --------------------------------------------------- */

/* A splice that fits the prompt: spans in order, inside it, never touching (transformers groups
   consecutive placeholders into one run, so two touching spans would be read as one image). */
static int vision_check(const h3_text_vision *v, int n, int64_t *total)
{
    if (v->n_spans < 1 || !v->start || !v->grid_h || !v->grid_w || !v->embeds || v->n_deepstack < 0 ||
        (v->n_deepstack > 0 && !v->deepstack))
        return h3_err(H3_E_INVALID, "text encoder: incomplete vision rows");
    int64_t t = 0, prev_end = -1;
    for (int s = 0; s < v->n_spans; s++) {
        if (v->grid_h[s] < 1 || v->grid_w[s] < 1 || v->start[s] < 0 || v->start[s] <= prev_end)
            return h3_err(H3_E_INVALID, "text encoder: vision span %d (tokens from %d, grid %dx%d) is empty, out "
                          "of order or touches the previous one", s, v->start[s], v->grid_h[s], v->grid_w[s]);
        const int64_t len = (int64_t)v->grid_h[s] * v->grid_w[s];
        if (v->start[s] + len > n)
            return h3_err(H3_E_INVALID, "text encoder: vision span %d (%lld tokens from %d) runs past the %d-token "
                          "prompt", s, (long long)len, v->start[s], n);
        prev_end = v->start[s] + len;
        t += len;
    }
    for (int i = 0; i < 3; i++)
        if (v->mrope_section[i] < 0) return h3_err(H3_E_INVALID, "text encoder: negative mrope_section");
    *total = t;
    return 0;
}

/* get_rope_index's (t, h, w) positions of every token. */
static void vision_positions(const h3_text_vision *v, int n, int32_t *const pos[3])
{
    int32_t cur = 0;
    int i = 0;
    for (int s = 0; s < v->n_spans; s++) {
        for (; i < v->start[s]; i++) pos[0][i] = pos[1][i] = pos[2][i] = cur++;
        for (int r = 0; r < v->grid_h[s]; r++)
            for (int c = 0; c < v->grid_w[s]; c++, i++) {
                pos[0][i] = cur;
                pos[1][i] = cur + r;
                pos[2][i] = cur + c;
            }
        cur += v->grid_h[s] > v->grid_w[s] ? v->grid_h[s] : v->grid_w[s];
    }
    for (; i < n; i++) pos[0][i] = pos[1][i] = pos[2][i] = cur++;
}

/* x[span rows] += rows of `src` (backend memory, [sum of span tokens][H]): the deepstack addition. */
static int vision_add(h3_backend *be, te_act *a, const h3_text_vision *v, const float *src)
{
    int64_t off = 0;
    for (int s = 0; s < v->n_spans; s++) {
        const int64_t len = (int64_t)v->grid_h[s] * v->grid_w[s];
        const h3_bt x = f32(a->x + (int64_t)v->start[s] * a->H, len, a->H, a->H);
        const h3_bt y = f32((float *)src + off * a->H, len, a->H, a->H);
        int rc = be->ops->gated_add(be, &x, &y, NULL);
        if (rc) return rc;
        off += len;
    }
    return 0;
}

int h3_text_forward(h3_model *m, h3_backend *be, const int32_t *ids, int n, float *out, h3_text_run *run)
{
    return h3_text_forward_vl(m, be, ids, n, NULL, out, run);
}

int h3_text_forward_vl(h3_model *m, h3_backend *be, const int32_t *ids, int n, const h3_text_vision *vis,
                       float *out, h3_text_run *run)
{
    if (!ids || !out || !be) return h3_err(H3_E_INVALID, "text encoder: NULL ids, output or backend");
    int rc = h3_text_check_count(n);
    if (rc) return rc;
    int64_t vtok = 0;
    if (vis && (rc = vision_check(vis, n, &vtok))) return rc;
    te_plan p;
    rc = plan_build(m, &p);
    if (rc) return rc;
    if ((rc = check_ids(&p, ids, n))) {
        plan_free(&p);
        return rc;
    }
    const int L = p.cfg.cond_layer;
    const int H = p.cfg.hidden;
    bool prefetch = run && run->prefetch >= 0 ? run->prefetch != 0 : prefetch_default();
    h3_progress_fn progress = run ? run->progress : NULL;
    void *user = run ? run->progress_user : NULL;
    h3_streamer *st = NULL;
    int *seq = NULL;        /* the pass: layers 0..L-1 */
    te_act a;
    void *block = NULL;
    float *ds = NULL;       /* backend: the deepstack rows that are added (layers 0..n_ds-1) */
    int32_t *pos = NULL;    /* host: [3][n] positions of the 3-D table */
    void *ws = NULL;        /* the backend's weight stream, when it has one */
    h3_text_keep *making = NULL; /* the layers this encode keeps (h3_text_run.keep), while it runs */
    const size_t stream_bytes = sizeof(float) * (size_t)n * (size_t)H;
    /* hidden_states[L] is recorded before layer L-1's own addition, so at most L-1 sets matter. */
    const int n_ds = !vis ? 0 : vis->n_deepstack < L - 1 ? vis->n_deepstack : L - 1;
    memset(&a, 0, sizeof a);
    if (vis) {
        if (!(pos = h3_malloc(sizeof(int32_t) * 3 * (size_t)n))) {
            rc = -H3_E_NOMEM;
            goto done;
        }
        if (n_ds > 0 && !(ds = h3_backend_dup(be, vis->deepstack, sizeof(float) * (size_t)n_ds * (size_t)vtok * H))) {
            rc = h3_err(H3_E_NOMEM, "text encoder: cannot hold %d deepstack sets of %lld rows", n_ds, (long long)vtok);
            goto done;
        }
    }
    /* A backend with a weight stream (a GPU) gets each layer through it: the reader preads into its
       pinned buffers with several threads, and the copy to the device overlaps the previous layer's
       compute. H3_TEXT_STREAM=0 keeps the per-weight weight_load path (the same bits, slower). */
    const int nslots = reader_slots(&p, prefetch);
    /* Kept layers (h3_text_run.keep) of this plan on this backend: nothing to read but the prompt's
       embedding rows. Kept layers of anything else are let go. */
    /* (Not with stored int8 codes: the streamed and kept paths move bf16 layers.) */
    h3_text_keep *kept = run && run->keep && !p.native ? *run->keep : NULL;
    if (kept && (kept->be != be || kept->layers != L || kept->ident != plan_ident(&p))) {
        h3_text_keep_free(kept);
        *run->keep = kept = NULL;
    }
    if (kept) {
        if ((rc = layers_open(&p, 1, NULL, 1, &st))) goto done;
    } else if (!p.native && use_stream(be, run ? run->tuning : NULL)) {
        void *host[2] = {NULL, NULL};
        if ((rc = be->weights->wstream_open(be, p.slot_bytes ? p.slot_bytes : TE_ALIGN, nslots, host, &ws)) ||
            (rc = layers_open(&p, nslots, host, reader_threads(true, run ? run->tuning : NULL), &st)))
            goto done;
        if (run && run->keep && keep_wanted(be, &p, run->keep_reserve, run->tuning) && !(making = keep_new(be, &p))) {
            rc = -H3_E_NOMEM;
            goto done;
        }
    } else if ((rc = layers_open(&p, nslots, NULL, reader_threads(false, run ? run->tuning : NULL), &st))) {
        goto done;
    }
    if (!(seq = h3_malloc(sizeof *seq * (size_t)L))) {
        rc = -H3_E_NOMEM;
        goto done;
    }
    for (int l = 0; l < L; l++) seq[l] = l;
    /* the first layers load while the embeddings are gathered */
    if ((rc = h3_streamer_begin(st, seq, kept ? 0 : L))) goto done;
    /* hidden_states[0] is gathered into the caller's output, then becomes the residual stream. */
    if ((rc = act_alloc(&a, be, &p.cfg, n, &block)) || (rc = embed_rows(st, &p, ids, n, out))) goto done;
    if (vis) {
        /* masked_scatter of the merger rows over the placeholders' embeddings, span by span */
        int64_t off = 0;
        for (int s = 0; s < vis->n_spans; s++) {
            const int64_t len = (int64_t)vis->grid_h[s] * vis->grid_w[s];
            memcpy(out + (int64_t)vis->start[s] * H, vis->embeds + off * H, sizeof(float) * (size_t)(len * H));
            off += len;
        }
        int32_t *const axes[3] = {pos, pos + n, pos + 2 * (size_t)n};
        vision_positions(vis, n, axes);
        const int32_t *const caxes[3] = {axes[0], axes[1], axes[2]};
        rc = rope_table(be, &a, p.cfg.rope_theta, caxes, vis->mrope_section);
    } else {
        rc = rope_table(be, &a, p.cfg.rope_theta, NULL, NULL);
    }
    if (rc || (rc = be->mem->upload(be, a.x, out, stream_bytes))) goto done;
    if ((rc = h3_progress_check(progress, user, "text_encoder", 0, L))) goto done;
    for (int l = 0; l < L; l++) {
        const uint8_t *buf = NULL;
        if (kept) {
            if ((rc = kept_norms(be, &a, kept, l, &p.layers[l])) || (rc = layer_forward(be, &a, &p.cfg, kept->w[l])))
                break;
        } else if ((rc = h3_streamer_get(st, &buf))) {
            break;
        } else if (ws) {
            /* Slot l % nslots: its device copy is queued, then the host buffer of layer l + 1 is
               handed to the streamer once the copy that last read it (layer l + 1 - nslots) is
               over; the layer's ops are queued behind the copy and mark the slot read. */
            const int slot = l % nslots;
            h3_bw W[W_COUNT];
            if ((rc = layer_stream(be, ws, slot, &p.layers[l], W))) break;
            if (l + 1 < L) {
                if ((rc = be->weights->wstream_wait_host(be, ws, (l + 1) % nslots))) break;
                if (l + 1 - nslots >= 0) h3_streamer_done(st); /* layer l + 1 - nslots: the oldest not done */
            }
            /* The norm weights go last: an upload from pageable memory may wait for the ops queued
               before it (layer l - 1's), and by now the copy and the next read are under way. They
               are read from this layer's host buffer, which the reader does not touch. */
            if ((rc = layer_norms(be, &a, &p.layers[l], buf)) || (rc = layer_forward(be, &a, &p.cfg, W))) break;
            /* Kept layers: the copy is queued behind the layer's ops and before the slot is marked
               free. No room for it is not a fault of the encode: the layers are not kept. */
            if (making && (rc = keep_layer(making, l, &p.layers[l], buf, W))) {
                if (rc != -H3_E_NOMEM) break;
                h3_err_clear();
                h3_text_keep_free(making); /* the device's release waits for the queued copies */
                making = NULL;
                rc = 0;
            }
            if ((rc = be->weights->wstream_done(be, ws, slot))) break;
        } else {
            if ((rc = layer_run(be, &a, &p.cfg, &p.layers[l], buf))) break;
            h3_streamer_done(st);
        }
        if (l < n_ds && (rc = vision_add(be, &a, vis, ds + (size_t)l * (size_t)vtok * H))) break;
        if ((rc = h3_progress_check(progress, user, "text_encoder", l + 1, L))) break;
    }
    if (!rc) rc = be->mem->download(be, out, a.x, stream_bytes);
    if (!rc && making) { /* every layer is in: the next encodes use them */
        *run->keep = making;
        making = NULL;
    }
done:
    h3_text_keep_free(making);
    if (run) run->bytes_read = st ? h3_streamer_bytes(st) : 0;
    h3_streamer_close(st);
    if (ws) be->weights->wstream_close(be, ws); /* after the streamer: it may be filling a pinned buffer */
    free(seq);
    if (block) be->mem->release(be, block);
    if (ds) be->mem->release(be, ds);
    free(pos);
    free(a.stage);
    plan_free(&p);
    return rc;
}

int h3_text_memory(h3_model *m, int n, int prefetch, h3_text_mem *out)
{
    memset(out, 0, sizeof *out);
    te_plan p;
    int rc = plan_build(m, &p);
    if (rc) return rc;
    if (prefetch < 0) prefetch = prefetch_default();
    out->layer_bytes = p.slot_bytes;
    out->layer_slots = prefetch && p.cfg.cond_layer > 1 ? 2 : 1;
    out->weights = out->layer_bytes * out->layer_slots;
    /* working buffers (the residual stream among them) + the caller's [n, hidden] f32 output */
    out->activations = (act_floats(&p.cfg, (uint64_t)(n > 0 ? n : 1)) + (uint64_t)(n > 0 ? n : 1) * p.cfg.hidden) *
                       sizeof(float);
    out->total = out->weights + out->activations;
    plan_free(&p);
    return 0;
}
