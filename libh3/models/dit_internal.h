/*
 * The transformer's internals shared by its files: dit.c (weights, layout, blocks, forward, schedule,
 * step), dit_knobs.c (the speed knobs: step and core reuse, layer selection, token reduction, the step
 * cache), dit_stream.c (weight streaming) and dit_pdd.c (a PDD LoRA's per-step heads). Not included
 * anywhere else. struct h3_dit is split by what a field belongs to: the weights, the request, the
 * prepared schedule, the knobs' state and the streaming state, each written where its comment says.
 */
#ifndef H3_DIT_INTERNAL_H
#define H3_DIT_INTERNAL_H

#include "models/dit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "models/lora.h"

/* The backends stage one head's q/k rows on the stack or in registers. */
#define DIT_MAX_HEAD_DIM 1024

typedef struct {
    float *norm1, *norm2, *qn, *kn; /* backend f32 vectors */
    h3_bw qkv, out, fc1, fc2;       /* backend weights */
    bool loaded;                    /* qkv/out/fc1/fc2 are on the backend (see lazy_blocks); for a
                                       streamed block: ready to stream (its host copy made) */
    bool streamed;                  /* the GEMM weights stay off the backend (dit_stream.c) */
    void *host;                     /* GPU, streamed: pinned copy of the four weights' device form,
                                       or of its packed image (core/wpack.h) when `packed` */
    size_t host_bytes;              /* bytes at host: what one copy of the block moves */
    bool packed;
    h3_bw like[4];                  /* GPU, streamed: qkv, out, fc1, fc2 as they loaded (shape, dtype,
                                       scales or not; the pointers were freed and are never read) */
    h3_mat ada;                     /* blocks only: adaln_proj.linear [18H, temb_dim], host mapping */
    float *ada_b;                   /* host f32 */
} dit_block;

/* GEMM weight k (h3_dit_gemm_part's order) of a block. */
static inline h3_bw *dit_gemm(dit_block *b, int k)
{
    h3_bw *w[H3_DIT_GEMMS] = {&b->qkv, &b->out, &b->fc1, &b->fc2};
    return w[k];
}

/* A LoRA-merged weight: an owned host copy that lives as long as the handle made from it (the CPU
   backend's weights are views of host memory). */
typedef struct {
    char name[112];
    void *data;
} dit_owned;

/* Which (timestep slot, modality) pairs of one forward get modulation rows, and per row which. */
typedef struct {
    int n_t, n_combo, n_fin;
    int32_t *combo_of; /* [n_t * 3] -> combo or -1 */
    int32_t *fin_of;   /* [n_t] -> final-layer row or -1 */
    int32_t *combo_t, *combo_m, *fin_t;
    int32_t *row_combo, *row_fin; /* [L]; row_fin is -1 on text rows */
    int32_t *d_row_combo, *d_row_fin; /* the same on the backend */
} dit_plan;

/* The model's weights: the handles, configs and dims the checkpoint gives, and the LoRA merged into
   them. Written by h3_dit_open (dit.c) and freed by close; afterwards only a lazy block's GEMM weights
   load and unload (dit_knobs.c, dit_load_block_weights) and prepare may release the AdaLN weights
   (adaln_released) once the tables hold them. */
struct dit_weights {
    h3_dit_cfg c;
    h3_lora *lora;     /* merged into every weight it targets as the weight loads */
    dit_owned *owned;  /* the merged copies */
    int n_owned;
    bool lazy_blocks;  /* blocks' GEMM weights load when a schedule runs them (layer dropping) */
    int precision;     /* H3_PRECISION_* of the main blocks' GEMM weights (h3_dit_open_opts) */
    struct h3_fp8file *fp8file; /* their pre-quantised fp8 form (precision fp8 only; not owned) */
    int A, P, F3; /* attention width, video patch width, 3 * rope frequencies */

    h3_bw cond, vout, aout, vproj, aproj;
    h3_mat te_in, te_out, fin_ada;                        /* host mappings */
    float *te_in_b, *te_out_b, *fin_ada_b, *inv_freq;     /* host f32 */
    /* Pruned ("curve form") checkpoints: the time embedder and its SiLU are a table of
       silu(time_embedder(t)) projected on a basis, sampled at curve_grid points of t in [0, 1]
       ([curve_grid][temb_dim], host f32; temb_dim is then the basis width); NULL otherwise. */
    float *curve;
    int curve_grid;
    float *cond_b, *fin_norm, *vout_b, *aout_b, *vproj_b, *aproj_b, *ref_final; /* backend f32 */
    dit_block *ref, *blk;
    bool adaln_released;
    uint64_t adaln_weight_bytes;
};

/* The request: the current render's layout, its RoPE rows, the refined text rows and the forward's
   buffers sized for it. Written by h3_dit_set_layout and h3_dit_refine_text (dit.c); read by every
   forward. */
struct dit_request {
    h3_dit_layout lay;
    bool has_layout;
    uint64_t generation;  /* bumped by every set_layout: callers detect a replaced request */
    int64_t *d_text_idx, *d_video_idx, *d_audio_idx; /* backend copies of the layout's indices */
    float *rcos, *rsin; /* [L][3F] backend */
    float *text;        /* refined text rows [n_text][H], backend f32 */
    bool has_text;
    void *x, *nb, *tmp, *big, *qkv3, *ob, *vo, *ao; /* forward buffers (backend) */
    int64_t buf_rows;
};

/* The prepared schedule: sigmas and timesteps, the modulation plan and its precomputed AdaLN tables,
   and a PDD LoRA's per-step output heads. Written by h3_dit_prepare (dit.c); freed when the layout or
   the schedule changes. */
struct dit_schedule {
    int n_steps;
    float *sig[2], *ts[2]; /* [0] video, [1] audio (host) */
    dit_plan plan;
    bool has_plan;
    float *tab_blk, *tab_fin; /* backend */
    float *tvals;   /* [steps][H3_ROLES] timestep of every role at every step (host) */
    bool per_step;  /* H3_OPT_DIT_PER_STEP: modulation computed at each step (the slow path) */
    uint64_t table_bytes;
    /* a PDD LoRA's output heads of each prepared step ([0] video, [1] audio; pdd_n = 0: none) */
    h3_bw *pdd_w[2];
    float **pdd_b[2];
    float **pdd_host[2];
    int pdd_n;
};

/* The speed knobs and their running state: which blocks run, step reuse, the step cache, core reuse,
   token reduction. Set by h3_dit_set_knobs and dit_apply_knobs (dit_knobs.c; all off after every
   set_layout); the reuse and cache state is updated by the forward and the step (dit.c). */
struct dit_knob_state {
    h3_dit_knobs knobs;
    int *run, n_run;             /* blocks a forward runs, in order; the tables follow this order */
    /* step reuse and the step cache: the velocities of the last two evaluations per modality */
    float *vel[2][2];            /* [video, audio][last, previous], backend */
    int n_vel;                   /* evaluations held (0 to 2) */
    float vel_sig[2][2];         /* their sigmas, [modality][last, previous] */
    /* step cache: the first block's modulated input of this step and of the previous one */
    float *mod_cur, *mod_prev;   /* [L][H] f32, backend */
    bool has_mod_prev;
    double cache_acc;            /* relative change accumulated since the last evaluation */
    /* core reuse */
    float *core_delta;           /* [L][H]: h_out - h_in of the last full block-stack run */
    int core_calls;              /* forwards since the schedule was prepared */
    /* token reduction: the reduced sequence of Lr rows as (p0, p1) pairs of full rows */
    int64_t red_rows;
    int64_t *d_pairs;            /* [Lr][2] backend */
    float *red_cos, *red_sin;    /* [Lr][3F] backend: RoPE at each pair's mean position */
    int32_t *d_red_combo;        /* [Lr] modulation entry of each reduced row (the plan's) */
    float *snap, *red_base;      /* [L][H] entry state, [Lr][H] pooled entry state */
    int tr_first, tr_end, tr_end_early; /* span of original block indices [first, end) */
};

/* Weight streaming under a memory budget (h3_dit_open_opts.vram_bytes): the streamed blocks, the
   GPU's ring or the CPU's streamer and their slots, the pack staging, the pass in flight. Written by
   dit_stream.c: planned at open, a pass per forward. */
struct dit_stream_state {
    int n_streamed;              /* blocks whose GEMM weights are streamed (0: all resident) */
    size_t blk_bytes;            /* one streamed block in its slot: the four weights, each aligned */
    size_t blk_off[4];           /* their offsets in the slot (the same for every block) */
    int slots;                   /* ring slots (GPU) or streamer slots (CPU) */
    struct h3_bring *ring;       /* GPU */
    struct h3_streamer *streamer;/* CPU */
    uint64_t held_bytes;         /* bytes of GEMM weights held: resident blocks, slots, other weights */
    uint64_t stream_bytes;       /* bytes streamed by forwards since the open: blocks' device form
                                    (blk_bytes each), whether or not their copies were packed */
    uint64_t copy_bytes;         /* bytes those copies moved host -> device (packed images' sizes) */
    int n_packed;                /* streamed blocks whose host copy is packed */
    uint64_t stage_bytes;        /* GPU, bf16 blocks packed (H3_STREAM_PACK; 0: plain copies): one slot's
                                    staging for a packed image (h3_wpack_stream_max of a block); the
                                    packed ring holds two and one block of words */
    int *pass, pass_n;           /* the streamed blocks of the forward in flight, in order */
};

/* Where a block stack runs (dit.c's run_block and dit_run_stack_exec): the backend, the buffers and
   the first row of the sequence it computes. One device: the handle's backend and request buffers
   from row 0 (dit_exec_local). A rank of a sequence-parallel group (models/dit_sp.c): its slice
   of rows, its own exchange buffers in `sp`, and in a loopback group its own backend and buffers. */
struct dit_sp_rank;
typedef struct dit_exec {
    h3_backend *be;
    void *x, *nb, *tmp, *big, *qkv3, *ob; /* x: [L][H] f32, the whole sequence; the others from row 0 */
    int64_t r0;
    bool timed;              /* charges the forward's parts (one device, or rank 0) */
    struct dit_sp_rank *sp;  /* NULL on one device */
} dit_exec;

struct dit_sp; /* models/dit_sp.c */

/* The handle: where it runs (set at open) and its counters, then the five parts above. */
struct h3_dit {
    h3_model *m;
    h3_store *st;
    h3_pool *pool;   /* host work: the timestep embedding */
    h3_backend *be;  /* everything else */
    unsigned flags;  /* H3_OPT_* */
    size_t esz;   /* bytes per activation element on the backend */
    bool time_parts; /* per-part timings need a synchronous backend (the CPU) */
    h3_dit_stats stats;

    struct dit_weights w;
    struct dit_request rq;
    struct dit_schedule sc;
    struct dit_knob_state kn;
    struct dit_stream_state ws;
    struct dit_sp *sp; /* sequence parallelism (dit_sp.c); NULL: one device */
};

static inline double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* Element `i` of a backend buffer of activations. */

static inline h3_bt act(const h3_dit *d, void *p, int64_t rows, int64_t cols, int64_t ld)
{
    return h3_bt_make(p, d->be->act_dtype, rows, cols, ld);
}

static inline h3_bt f32(void *p, int64_t rows, int64_t cols, int64_t ld)
{
    return h3_bt_make(p, H3_DT_F32, rows, cols, ld);
}


H3_INTERNAL void dit_bfree(h3_dit *d, void *p);
H3_INTERNAL dit_exec dit_exec_local(h3_dit *d);
H3_INTERNAL int dit_run_stack_exec(h3_dit *d, const dit_exec *e, const dit_plan *p, const float *tab_blk, int step,
                                   int64_t rows);
/* Sequence parallelism (dit_sp.c): the block stack split over the group's ranks (each rank's slice,
   then an all-gather of the residual stream), and one block's attention on a rank: q/k/v of its
   slice exchanged by heads, attention over the whole sequence for its heads, the output exchanged
   back to rows. cos/sin are the rank's rows; `main`: a main block (fp8 attention may apply). */
H3_INTERNAL int dit_sp_run_stack(h3_dit *d, const dit_plan *p, const float *tab_blk, int step);
H3_INTERNAL int dit_sp_attention(h3_dit *d, const dit_exec *e, const dit_block *b, const h3_bt *qkv, int64_t rows,
                                 const float *cos, const float *sin, bool main, const h3_bt *ob);
H3_INTERNAL void dit_sp_free(h3_dit *d);
H3_INTERNAL void dit_wfree(h3_dit *d, h3_bw *w);
H3_INTERNAL int dit_time_embed(h3_dit *d, const float *t, int64_t M, float *out);
H3_INTERNAL void dit_run_all_blocks(h3_dit *d);
H3_INTERNAL void dit_rope_rows(const h3_dit *d, const double *pos, int64_t n, float *hc, float *hs);
H3_INTERNAL int dit_ensure_run_blocks(h3_dit *d);
H3_INTERNAL int dit_apply_knobs(h3_dit *d, const float *t_values, int evals, bool release);
H3_INTERNAL int dit_load_block_weights(h3_dit *d, dit_block *b, const char *pfx, int i);
H3_INTERNAL void dit_unload_block_weights(h3_dit *d, int i);
/* PDD heads (dit_pdd.c): build the heads of `evals` prepared steps into d->sc; drop them. */
H3_INTERNAL int dit_pdd_build(h3_dit *d, int evals);
H3_INTERNAL void dit_pdd_drop(h3_dit *d);

/* Weight streaming (dit_stream.c). plan: after every weight but the main blocks' GEMMs loaded,
   choose which blocks stream under vram_bytes (0: auto) and set up the ring or the streamer.
   stage / unstage: make a streamed block ready (a GPU's pinned copy) / let it go. In a forward,
   begin opens a pass over the streamed blocks of the run list (in order); acquire gives pass
   entry j's block with its weights in a slot, release says its ops are issued (CPU: done). */
/* pack: packed copies of streamed bf16 blocks where the backend has them (h3_dit_open_opts). */
H3_INTERNAL int dit_stream_plan(h3_dit *d, int64_t vram_bytes, bool pack);
H3_INTERNAL int dit_stream_stage(h3_dit *d, int i);
H3_INTERNAL void dit_stream_unstage(h3_dit *d, int i);
H3_INTERNAL int dit_stream_begin(h3_dit *d, const int *seq, int n);
H3_INTERNAL int dit_stream_acquire(h3_dit *d, int j, int b, dit_block *view);
H3_INTERNAL int dit_stream_release(h3_dit *d, int j);
H3_INTERNAL void dit_stream_close(h3_dit *d);

#endif /* H3_DIT_INTERNAL_H */
