/*
 * The MiniMax-H3 transformer (DiT) and its sampler: internal API.
 *
 * The end-to-end context API is built on this header. A request runs as
 *
 *     h3_dit_open(model, pool, backend, flags, &dit)  weights made backend-resident, vectors f32
 *     h3_dit_layout_t2va(cfg, ..., &layout)           packed rows, tags, fp64 RoPE grid
 *     h3_dit_set_layout(dit, &layout)                 RoPE cos/sin tables for that layout
 *     h3_dit_set_text(dit, prompt_embeds, n)          condition_proj + token refiner, once per prompt
 *     h3_dit_prepare_schedule(dit, steps, ...)        sigmas + AdaLN tables of every step, then the
 *                                                     adaln_proj weights are released
 *     h3_noise_fill / injected noise -> h3_dit_patchify_video / h3_dit_pack_audio -> rows, uploaded
 *     while (h3_dit_step(dit, i++, video_rows, audio_rows) > 0) ...   one forward + Euler per call
 *     rows downloaded -> h3_dit_unpatchify_video / h3_dit_unpack_audio -> latents for the decoders
 *
 * Everything follows diffusers 0.42.1 (MiniMaxH3Transformer3DModel, MiniMaxH3Scheduler and the
 * modular pipeline's layout/timestep plan). On the CPU backend it computes in f32 (bf16/f16
 * weights are widened on the fly by the CPU backend's GEMM); on a GPU backend GEMMs and attention take bf16
 * operands with f32 accumulation and the residual stream stays f32 (backend/backend.h).
 */
#ifndef H3_DIT_H
#define H3_DIT_H

#include "backend/backend.h"
#include "core/host.h"
#include "core/schedule.h"

/* Modality tags of packed rows (diffusers MINIMAX_H3_*_TAG). They select the AdaLN modality. */
enum { H3_TAG_VIDEO = 0, H3_TAG_TEXT = 1, H3_TAG_AUDIO = 2, H3_TAGS = 3 };

/*
 * Timestep roles of a request's rows (diffusers MiniMaxH3SetTimestepsStep.build_row_timesteps):
 * generated video rows and every text row use the video timestep, generated audio rows the audio
 * timestep, visual conditioning rows max(video t, 0.999), reference audio rows 1.0. Roles replace
 * diffusers' per-step `torch.unique` of the row timesteps: equal values give equal modulation, so
 * the result is the same while the row -> table mapping stays fixed for the whole schedule.
 */
enum { H3_ROLE_VIDEO = 0, H3_ROLE_AUDIO = 1, H3_ROLE_COND_VIDEO = 2, H3_ROLE_COND_AUDIO = 3, H3_ROLES = 4 };

#define H3_STEREO 2                 /* audio rows are packed side-major: [left t0..][right t0..] */
#define H3_KEYFRAME_NOISE_AUG 0.999 /* t of visual conditioning rows (pipeline keyframe_noise_aug) */

/* FL2VA keyframe anchors of h3_dit_layout_t2va. */
enum { H3_ANCHOR_FIRST = 0, H3_ANCHOR_LAST = 1 };

typedef struct h3_dit h3_dit;

/* ---- layout ---------------------------------------------------------------------------- */

/*
 * One packed sequence. Row r of the sequence is a text, video or audio row; the index arrays give
 * the sequence position of each modality's rows in the order their inputs/outputs are stored
 * (video: conditioning rows first, then generated rows; audio: reference rows first).
 */
typedef struct h3_dit_layout {
    int64_t seq;                       /* L */
    int64_t n_text, n_video, n_audio;  /* rows per modality (video/audio include conditioning) */
    int64_t n_cond_video, n_cond_audio;/* leading conditioning rows, never stepped */
    int64_t *text_idx, *video_idx, *audio_idx;
    uint8_t *tags;                     /* [L] H3_TAG_* */
    uint8_t *role;                     /* [L] H3_ROLE_* */
    double *pos;                       /* [L][3] (t, h, w) RoPE coordinates, fp64 as diffusers */
    /* Generated latent geometry (for patchify/unpatchify); 0 when the layout came from rows. */
    int lat_t, lat_h, lat_w, audio_lat;
} h3_dit_layout;

/*
 * The t2va / fl2va layout [text | keyframe rows | target audio | target video] exactly as
 * diffusers' MiniMaxH3PrepareLayoutStep.build_packed_sequence builds it. text_tags (n_text
 * entries, H3_TAG_TEXT or H3_TAG_VIDEO for vision spans) may be NULL for all-text prompts.
 * anchors: n_anchors entries of H3_ANCHOR_* (0 for t2va).
 */
H3_INTERNAL int h3_dit_layout_t2va(const h3_dit_cfg *c, int64_t n_text, const uint8_t *text_tags,
                                   int lat_t, int lat_h, int lat_w, int audio_lat, const int *anchors,
                                   int n_anchors, h3_dit_layout *out);
/*
 * One reference of a ref2va request, by the latent geometry its encoder produced (the layout is
 * built from those shapes, as diffusers builds it from the encoded tensors): an image (lat_t 1,
 * no audio), a video (lat_t frames; audio_lat > 0 when it carries a soundtrack) or an audio clip
 * (audio_lat latents per side, no visual rows).
 */
enum { H3_REF_IMAGE = 0, H3_REF_VIDEO = 1, H3_REF_AUDIO = 2 };
#define H3_REF_MAX 12 /* references per request (diffusers' MiniMaxH3Ref2VASetupStep) */
typedef struct h3_dit_ref {
    int kind;
    int lat_t, lat_h, lat_w;
    int audio_lat;
} h3_dit_ref;
/*
 * The ref2va layout [text | reference blocks | target audio | target video] exactly as
 * diffusers' MiniMaxH3Ref2VAPrepareLayoutStep.build_ref2va_packed_sequence builds it: references
 * in request order on one rotary clock from n_text (image: own grid at the clock, +1; audio:
 * t = clock + j, w at the target's width extremes, + T_a; video: soundtrack rows then frames,
 * both from the clock, + max(T_a, span)); the target from the final clock. Visual reference
 * rows are H3_ROLE_COND_VIDEO, reference audio rows H3_ROLE_COND_AUDIO (t = 1.0).
 */
H3_INTERNAL int h3_dit_layout_ref2va(const h3_dit_cfg *c, int64_t n_text, const uint8_t *text_tags,
                                     const h3_dit_ref *refs, int n_refs, int lat_t, int lat_h, int lat_w,
                                     int audio_lat, h3_dit_layout *out);
H3_INTERNAL void h3_dit_layout_free(h3_dit_layout *l);
/*
 * Copy a layout out in diffusers' array forms (each output may be NULL: position_ids [seq][3], token_tags [seq],
 * text / video / audio row indices, roles [seq], n_condition {video, audio} rows), then free it. Returns seq.
 */
H3_INTERNAL int64_t h3_dit_layout_export(h3_dit_layout *l, double *position_ids, int64_t *token_tags,
                                         int64_t *text_indices, int64_t *video_indices, int64_t *audio_indices,
                                         uint8_t *roles, int64_t *n_condition);
/* Deep copy. */
H3_INTERNAL int h3_dit_layout_copy(h3_dit_layout *dst, const h3_dit_layout *src);
/*
 * A layout described row by row, as diffusers' forward receives it (text/video/audio_indices,
 * token_tags, position_ids). Indices must be distinct and inside the sequence; rows no index
 * names stay zero, as diffusers' index_copy into a zero buffer leaves them. Roles are all 0.
 */
H3_INTERNAL int h3_dit_layout_from_rows(int64_t seq, int64_t n_text, int64_t n_video, int64_t n_audio,
                                        const int64_t *text_idx, const int64_t *video_idx,
                                        const int64_t *audio_idx, const int64_t *tags, const double *pos,
                                        h3_dit_layout *out);

/* Video latents [C, T, H, W] <-> rows [T*(H/ph)*(W/pw), C*ph*pw] (frame, patch row, patch col;
   features channel-major then dh, dw). */
H3_INTERNAL void h3_dit_patchify_video(const h3_dit_cfg *c, const float *lat, int T, int H, int W, float *rows);
H3_INTERNAL void h3_dit_unpatchify_video(const h3_dit_cfg *c, const float *rows, int T, int H, int W, float *lat);
/* Audio latents [2, C, Ta] <-> rows [2*Ta, C] (side-major, then time). */
H3_INTERNAL void h3_dit_pack_audio(int C, int Ta, const float *lat, float *rows);
H3_INTERNAL void h3_dit_unpack_audio(int C, int Ta, const float *rows, float *lat);

/* ---- the model ------------------------------------------------------------------------- */

/* The four GEMM weights of a block, k = 0..3: "<prefix>.<i>.<part>.weight" with part qkv_proj,
   out_proj, fc1, fc2 (attn. / mlp.), and their shapes under a config (main blocks and refiner
   alike). The reduced precisions apply to these of the main blocks. */
#define H3_DIT_GEMMS 4
H3_INTERNAL const char *h3_dit_gemm_part(int k);
/* Whether tensor `name` is one the transformer loads as a backend GEMM weight (get_w: the blocks' and the
   refiner's qkv / out / fc1 / fc2, the input and output projections), as opposed to the matrices it
   reads on the host (the AdaLN projections, the time embedder): what a single file's stored codes may
   replace (core/singlefile.h's h3_sf_native). */
H3_INTERNAL bool h3_dit_gemm_weight(const char *name);
/* The streaming rule of a vram budget (dit_stream.c), for the memory estimate too: blocks kept resident when
   `avail` bytes remain after the fixed weights, one block's GEMM weights take block_bytes and the ring
   ring_bytes (h3_dit_stream_slots() plain slots of a block); -1 when the budget cannot hold the ring. */
H3_INTERNAL int64_t h3_dit_stream_keep(int64_t avail, uint64_t block_bytes, uint64_t ring_bytes);
H3_INTERNAL int h3_dit_stream_slots(void);
H3_INTERNAL void h3_dit_gemm_shape(const h3_dit_cfg *c, int k, int64_t *rows, int64_t *cols);

/*
 * Open the transformer on a backend: weights shape-checked against config.json and made
 * backend-resident (views of the mapping on the CPU, bf16 device copies on a GPU), small vectors
 * widened to f32. `pool` runs the host-side work (timestep embedding); `flags` are H3_OPT_*.
 * The backend must outlive the transformer.
 */
H3_INTERNAL int h3_dit_open(h3_model *m, h3_pool *pool, h3_backend *be, unsigned flags, h3_dit **out);

/* How a transformer is opened (h3_dit_open_ex; zeroed = h3_dit_open). */
typedef struct h3_dit_open_opts {
    /* Leave the blocks' GEMM weights unloaded until a schedule runs them: with layer dropping the
       dropped blocks' weights are then never loaded. */
    bool lazy_blocks;
    /* LoRA files merged into the weights they target as those load (lora.h); scales may be NULL. */
    const char *const *lora_paths;
    const float *lora_scales;
    int n_lora;
    /* H3_PRECISION_* of the main blocks' four GEMM weights (qkv, out, fc1, fc2: the bulk of the
       bytes and FLOPs); every other weight keeps the exact path. The backend must run it (the API
       checks at h3_init). */
    int precision;
    /* Bytes the transformer's GEMM weights may hold (h3_options.vram_bytes): blocks that do not fit
       stream through a ring of slots (dit_stream.c). 0: auto, i.e. every block resident unless a
       GPU's free memory is short of them plus DIT_AUTO_MARGIN; the CPU then keeps them all (the
       page cache does the rest). */
    int64_t vram_bytes;
    /* Pre-quantised fp8 weights (h3_options.quantized_path, opened and checked at h3_init): with
       precision fp8 the main blocks' GEMM weights come from it instead of being quantised at load.
       Not with LoRA files (they change the weights the file was made from). */
    struct h3_fp8file *fp8file;
    /* Plain copies of streamed bf16 blocks instead of the packed ones (the runtime sets it from
       H3_STREAM_PACK=0, core/tuning.h); false: packed where the backend has a packed ring. */
    bool no_stream_pack;
} h3_dit_open_opts;
H3_INTERNAL int h3_dit_open_ex(h3_model *m, h3_pool *pool, h3_backend *be, unsigned flags,
                               const h3_dit_open_opts *opts, h3_dit **out);
H3_INTERNAL void h3_dit_close(h3_dit *d);
H3_INTERNAL const h3_dit_cfg *h3_dit_config(const h3_dit *d);
H3_INTERNAL h3_backend *h3_dit_backend(const h3_dit *d);
/* Incremented by every h3_dit_set_layout: a caller that prepared a request remembers it and can
   tell when another caller has replaced the transformer's request state since. */
H3_INTERNAL uint64_t h3_dit_generation(const h3_dit *d);

/* Use this layout for the following forwards (copied; builds the RoPE tables). Drops the text
   refined for a previous layout only if its text row count differs. */
H3_INTERNAL int h3_dit_set_layout(h3_dit *d, const h3_dit_layout *l);
/* condition_proj + token refiner on prompt_embeds [n, text_dim]; n must match the layout. */
H3_INTERNAL int h3_dit_set_text(h3_dit *d, const float *text_states, int64_t n);

/*
 * Build both schedules (video/audio shift) with `steps` grid points, and the AdaLN modulation of
 * every step for the (role, modality) pairs the layout uses. With `release_adaln`, the
 * adaln_proj weights (blocks and final layer) are then released: their pages are dropped, and
 * the denoise loop never reads them again. Returns the number of model evaluations (>= 1).
 */
H3_INTERNAL int h3_dit_prepare_schedule(h3_dit *d, int steps, double shift_video, double shift_audio,
                                        bool release_adaln);
/* The same on given grids (n_sigmas values each, strictly decreasing to a terminal 0). */
H3_INTERNAL int h3_dit_prepare_sigmas(h3_dit *d, const float *sigmas_video, const float *sigmas_audio, int n_sigmas,
                                      bool release_adaln);
/*
 * Speed knobs of a request (h3.h h3_request has the user-facing description). Zero = off; all off
 * is the exact path, bit for bit. They apply from the next h3_dit_prepare_schedule on and are
 * turned off by every h3_dit_set_layout; h3_dit_forward_t ignores them.
 */
typedef struct h3_dit_knobs {
    int reuse;             /* >= 2: evaluate steps 0, last and multiples of reuse; extrapolate between */
    int core_reuse;        /* >= 2: run the block stack on call 0, every core_reuse-th call and the last step */
    int layers;            /* 0 = all; else the number of blocks run (first two + last + ranked others) */
    int layer_policy;      /* H3_LAYERS_GATE / H3_LAYERS_UNIFORM */
    int token_reduction;   /* 1: pool horizontal target-video token pairs over the middle blocks */
    float cache_threshold; /* > 0: step cache on the first block's modulated input */
} h3_dit_knobs;
/* Check knobs against a transformer config: one line naming the first problem (H3_E_INVALID). */
H3_INTERNAL int h3_dit_knobs_check(const h3_dit_cfg *c, const h3_dit_knobs *k);
/* Set the knobs for the next prepared schedule (NULL = all off). Needs a layout. */
H3_INTERNAL int h3_dit_set_knobs(h3_dit *d, const h3_dit_knobs *k);
/* Token reduction's span for a depth: original block indices [first, end), and end during the first
   10 steps (the release's 4..30 and 4..40 of 50 blocks, scaled). */
H3_INTERNAL void h3_dit_token_span(int layers, int *first, int *end, int *end_early);

/* The blocks the prepared schedule runs (original indices, in order) and token reduction's reduced
   sequence length (0: no reduction). */
H3_INTERNAL const int *h3_dit_blocks_run(const h3_dit *d, int *n, int64_t *reduced_rows);

/* Evaluations of the prepared schedule; sigma tables (count = evaluations + 1). */
H3_INTERNAL int h3_dit_num_steps(const h3_dit *d);
H3_INTERNAL const float *h3_dit_sigmas(const h3_dit *d, int modality_audio);

/*
 * Step i (0-based) of the prepared schedule: one forward on all rows and the Euler update of the
 * generated rows, in place. video_rows [n_video, patch_dim] (conditioning rows first), audio_rows
 * [n_audio, audio_ch], both in the backend's memory (h3_dit_backend). Returns the number of steps
 * left (0 after the last), or a negative error.
 */
H3_INTERNAL int h3_dit_step(h3_dit *d, int i, float *video_rows, float *audio_rows);

/*
 * One forward with explicit timesteps: t_values[n_t] and row_t[L] (index into t_values per row),
 * i.e. diffusers' (timestep, timestep_indices). Needs the adaln_proj weights (computes the
 * modulation of the pairs present). Outputs every video/audio row in index order. Inputs and
 * outputs are host memory (copied to and from the backend).
 */
H3_INTERNAL int h3_dit_forward_t(h3_dit *d, const float *t_values, int n_t, const int32_t *row_t,
                                 const float *video_rows, const float *audio_rows, float *video_out,
                                 float *audio_out);

/* Bytes of the adaln_proj tensors (released after precompute) and of the precomputed tables. */
H3_INTERNAL void h3_dit_adaln_bytes(const h3_dit *d, uint64_t *weights, uint64_t *tables, bool *released);

/* Timings in milliseconds for profiles: open, the last refine and prepare, and the forwards since
   the last prepared schedule. */
enum { H3_DIT_PART_LINEAR, H3_DIT_PART_ATTENTION, H3_DIT_PART_NORM, H3_DIT_PART_QKV, H3_DIT_PART_ELTWISE,
       H3_DIT_PARTS };
typedef struct h3_dit_stats {
    double open_ms, refine_ms, prepare_ms;
    double forward_ms_last, forward_ms_min, forward_ms_total;
    double stack_ms_min, stack_ms_total; /* the block stack alone, over the block_runs forwards */
    double part_ms[H3_DIT_PARTS]; /* forward time by kind of work, summed over the forwards */
    int forwards;
    /* the work of the steps since the last prepared schedule (the speed knobs change it) */
    int block_runs;       /* forwards that ran the block stack (fewer than forwards with core reuse) */
    int skipped_steps;    /* steps that ran no forward (step reuse, step cache) */
    int layers_run;       /* blocks per block-stack run */
    double transformer_ms;/* time inside h3_dit_step: forwards, cache tests, extrapolation, Euler */
} h3_dit_stats;
/* Weight streaming of the open transformer: blocks streamed (0: all resident) of `blocks`, bytes
   its GEMM weights hold (resident blocks, slots, a GPU's packed-copy staging and every other GEMM
   weight), bytes streamed by forwards so far (blocks in their slot form, block_bytes each), bytes of
   one block's GEMM weights as a slot holds them, bytes the streamed copies actually moved (less than
   streamed_bytes where blocks were packed) and how many streamed blocks are held packed. */
H3_INTERNAL void h3_dit_stream_info(const h3_dit *d, int *streamed, int *blocks, uint64_t *held_bytes,
                                    uint64_t *streamed_bytes, uint64_t *block_bytes, uint64_t *copied_bytes,
                                    int *packed);
/* Names of the parts ("linear", "attention", "norm_modulate", "qk_norm_rope", "eltwise"). */
H3_INTERNAL const char *h3_dit_part_name(int part);
H3_INTERNAL void h3_dit_get_stats(const h3_dit *d, h3_dit_stats *s);

/* ---- sequence parallelism (models/dit_sp.c, docs/multi-gpu.md) ------------------------------ */
typedef struct h3_comm h3_comm; /* backend/comm.h */
/* Split the block stack of every forward over `world` loopback ranks: threads of this process, each
   with its own CPU backend over a pool of threads / world threads (at least 1), exchanging through
   the loopback communicator; bit-identical to one device. world 1 runs the split path with one rank (its
   exchanges are empty: a check of the path itself); 0 turns it off. Errors: a world
   that does not divide the attention heads (H3_E_INVALID, the message lists the ones that do), a
   backend other than the CPU, streamed blocks. */
H3_INTERNAL int h3_dit_sp_loopback(h3_dit *d, int world, int threads);
/* This process is rank comm->rank of comm->world (NCCL, one process per GPU); the communicator stays
   the caller's and must outlive the transformer or be detached (NULL). Same degree check. A world of 1
   runs the split path too (world size 1 through NCCL: the same bytes as the plain path). */
H3_INTERNAL int h3_dit_sp_attach(h3_dit *d, h3_comm *comm);
/* Ranks the block stack is split over (1: one device). */
H3_INTERNAL int h3_dit_sp_world(const h3_dit *d);
/* The group as a JSON object (kind, world, sequence rows, per rank: name, rows, bytes each all-to-all
   and the all-gather moved), or null. */
H3_INTERNAL void h3_dit_sp_json(const h3_dit *d, h3_buf *b);

#endif /* H3_DIT_H */
