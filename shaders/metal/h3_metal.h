/*
 * What the Metal kernels (the .metal files here) share: the argument blocks the host passes as
 * `constant` buffers (plain int/float fields, the same layout in C, Objective-C, MSL and the
 * emulation), and the kernels' small helpers (loads and stores in any storage type, the reduction
 * over a threadgroup, erf).
 *
 * On Apple the host builds one library from source (newLibraryWithSource) by concatenating this
 * header and the .metal files; a file's #include of it is then skipped by its include guard. The
 * kernels need MSL 3.1 (bfloat) and a compile without fast math (MTLCompileOptions mathMode safe,
 * or fastMathEnabled = NO): the op tolerances assume IEEE exp, sqrt and division.
 */
#ifndef H3_METAL_H
#define H3_METAL_H

/* linear: y[M, N] = x[M, K] W^T (+ bias), W [N, K] row-major. Tiles of H3M_BM x H3M_BN outputs per
   threadgroup of H3M_GEMM_THREADS threads; grid (ceil(N / H3M_BN), ceil(M / H3M_BM)). */
#define H3M_BM 32
#define H3M_BN 32
#define H3M_BK 16
#define H3M_GEMM_THREADS 128
#define H3M_GEMM_TG_BYTES (H3M_BM * H3M_BN * 4)
typedef struct h3m_linear_args {
    int M, N, K, ldx, ldy, has_bias;
} h3m_linear_args;

/* attention: one simdgroup per query row, H3M_ATT_ROWS rows per threadgroup (H3M_ATT_ROWS * 32
   threads); grid (ceil(Lq / H3M_ATT_ROWS), heads). Head dims up to H3M_ATT_MAX_D. */
#define H3M_ATT_ROWS 4
#define H3M_ATT_MAX_D 256
typedef struct h3m_attn_args {
    int Lq, Lk, heads, kv_heads, D, ldq, ldk, ldv, ldo, causal;
    float scale;
} h3m_attn_args;

/* norm_mod: one threadgroup per output row (any multiple of 32 threads, at most 1024); threadgroup
   memory 32 floats. */
typedef struct h3m_norm_args {
    int n, ldx, ldy, has_rows, has_w, has_mod, stride, slot;
    float eps;
} h3m_norm_args;

/* gated_add: grid (ceil(n / threads), rows). gated_add_norm: one threadgroup per row as norm_mod. */
typedef struct h3m_gate_args {
    int n, ldx, ldy, ldo, has_gate, gate_stride, gate_slot, has_w, norm_stride, norm_slot;
    float eps;
} h3m_gate_args;

/* qk_norm_rope: one simdgroup per (row, head): q heads, then k heads, then v heads (copied);
   H3M_QKV_HEADS simdgroups per threadgroup, grid (ceil(units / H3M_QKV_HEADS), rows), threadgroup
   memory H3M_QKV_HEADS * D floats. Head dims up to H3M_QKV_MAX_D. */
#define H3M_QKV_HEADS 4
#define H3M_QKV_MAX_D 256
typedef struct h3m_qkv_args {
    int heads, kv_heads, D, half_, hs, ldqin, ldkin, ldvin, ldq, ldk, ldv, has_qn, has_kn, has_rope, has_v;
    float eps;
} h3m_qkv_args;

/* rope (no norm, f32 in place) and the element-wise ops: grid (ceil(work / threads), rows). */
typedef struct h3m_rope_args {
    int heads, D, half_, ld;
} h3m_rope_args;
typedef struct h3m_ew_args {
    int n, lda, ldb, ldy, tanh_approx;
} h3m_ew_args;

/* conv3d (the GEMM's tiling and grid over M = To * Ho * Wo rows, N = cout): backend.h's
   h3_bconv3d plus the output sizes. */
typedef struct h3m_conv3d_args {
    int T, H, W, cin, cout, kt, kh, kw, st, sh, sw, pad_t, pad_top, pad_left, To, Ho, Wo, has_bias;
} h3m_conv3d_args;

/* snake / snake_aa into a phased destination (h3_bphased): one thread per (channel, destination
   row), grid (ceil(C / 32), d * phase_rows), 32 threads. */
typedef struct h3m_phased_args {
    int L, C, d, phase_rows, margin, aa;
} h3m_phased_args;

/* conv1_clamp: one simdgroup per row, H3M_ATT_ROWS rows per threadgroup. layernorm: one
   threadgroup per row. group_norm: one threadgroup per (group, frame): grid (groups, frames). */
typedef struct h3m_conv1_args {
    int M, K, ldx;
} h3m_conv1_args;
typedef struct h3m_ln_args {
    int n, ldx, ldy, has_w, has_b;
    float eps;
} h3m_ln_args;
typedef struct h3m_gn_args {
    int pixels, C, groups, silu;
    float eps;
} h3m_gn_args;

/* The step's and the speed knobs' element-wise ops over n values (grid ceil(n / threads)), and
   the row copies (grid (ceil(cols / threads), rows)): h3_knobs.metal. */
typedef struct h3m_knob_args {
    int n, has_b;
    float r, t, sigma, sigma_next;
} h3m_knob_args;
/* abs_diff_sum: one threadgroup per block; part [blocks][4] floats (diff hi, lo, ref hi, lo). */
#define H3M_ADS_BLOCK 4096
#define H3M_ADS_THREADS 256
typedef struct h3m_rowop_args {
    int n, lda, ldb, ldy;
    float div;
} h3m_rowop_args;

/* head_pool: one thread per (output column, row). channels_last: one thread per (channel, row).
   unpatchify: one thread per (source column, token row). Grids (ceil(cols / threads), rows). */
typedef struct h3m_head_pool_args {
    int heads, D, n, ldx, ldy;
} h3m_head_pool_args;
typedef struct h3m_cl_args {
    int C, cs, ts, rs, nt, t_avail, ny, nx, ldy;
} h3m_cl_args;
typedef struct h3m_unpatch_args {
    int tok0, gh, gw, C, pt, ps, lds;
} h3m_unpatch_args;

/* vae_stitch (backend.h's h3_bstitch, flags for the optional outputs): h3m_vae_stitch, one thread
   per owned pixel and channel, grid (ceil(own_w / 32), own_h, C), 32 threads; then
   h3m_vae_save_strips, one thread per tile pixel, channel and frame, grid (ceil(tw / 32), th, C * K). */
typedef struct h3m_stitch_args {
    int C, K, keep0, keep1, blend_t, th, tw, max_ovy, max_ovx, H, W, frames, window, windows, y0, x0, own_h, own_w,
        ov_top, ov_left, ov_bottom, ov_right, slot_above, slot_left, raw, has_rgb, has_pixels;
} h3m_stitch_args;

#if defined(__METAL_VERSION__) || defined(H3_MSL_EMU)

/* Loads give f32 whatever the storage type; stores round once (to nearest even). */
template <typename T> inline float h3m_ld(device const T *p, long i) { return float(p[i]); }
template <typename T> inline void h3m_st(device T *p, long i, float v) { p[i] = T(v); }

/* Sum of one value per thread over the threadgroup, the same total in every thread: each
   simdgroup's sum, then those in simdgroup order (red: 32 floats of threadgroup memory). */
inline float h3m_tg_sum(float v, threadgroup float *red, uint lane, uint sg, uint nsg)
{
    v = simd_sum(v);
    if (lane == 0) red[sg] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float t = 0.0f;
    for (uint s = 0; s < nsg; s++) t += red[s];
    threadgroup_barrier(mem_flags::mem_threadgroup); /* red is free again */
    return t;
}

/* MSL has no erf. Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7), odd in x. */
inline float h3m_erf(float x)
{
    const float ax = fabs(x);
    const float t = 1.0f / (1.0f + 0.3275911f * ax);
    const float poly = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
    const float r = 1.0f - poly * exp(-ax * ax);
    return x < 0.0f ? -r : r;
}

/* libh3's SiLU (x / (1 + e^-x), h3_silu) and GELUs (the backend's `gelu`). */
inline float h3m_silu(float x) { return x / (1.0f + exp(-x)); }
inline float h3m_gelu_tanh(float x)
{
    return 0.5f * x * (1.0f + tanh(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}
inline float h3m_gelu_erf(float x) { return 0.5f * x * (1.0f + h3m_erf(x * 0.7071067811865476f)); }

#endif
#endif /* H3_METAL_H */
