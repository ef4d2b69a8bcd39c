/* Launchers of the Metal kernels under the emulator (kernels_emu.cpp): the role the Objective-C
   host's encoders will have on Apple - grid, threadgroup size and threadgroup memory per kernel,
   the dtype picking the instantiation. Each returns NULL or the emulator's message. */
#ifndef H3_KERNELS_EMU_H
#define H3_KERNELS_EMU_H
#include "../../shaders/metal/h3_metal.h"
#include <stdint.h>

enum { EMU_F32 = 0, EMU_BF16 = 1, EMU_F16 = 2 };

const char *emu_linear(const void *x, int xdt, const void *w, int wdt, const float *bias, void *y, int ydt,
                       const h3m_linear_args *a);
const char *emu_attention(const void *q, const void *k, const void *v, int qdt, void *o, int odt,
                          const h3m_attn_args *a);
const char *emu_norm_mod(const void *x, int xdt, const int64_t *rows, const float *w, const float *tab,
                         const int32_t *ent, void *y, int ydt, int64_t rows_out, const h3m_norm_args *a);
const char *emu_gated_add(float *x, const void *y, int ydt, const float *tab, const int32_t *ent, int64_t rows,
                          const h3m_gate_args *a);
const char *emu_gated_add_norm(float *x, const void *y, int ydt, const float *gtab, const int32_t *gent,
                               const float *w, const float *ntab, const int32_t *nent, void *out, int odt,
                               int64_t rows, const h3m_gate_args *a);
const char *emu_qk_norm_rope(const void *qin, const void *kin, const void *vin, int idt, const float *qn,
                             const float *kn, const float *cs, const float *sn, void *q, void *k, void *v, int odt,
                             int64_t rows, const h3m_qkv_args *a);
const char *emu_rope(float *x, const float *cs, const float *sn, int64_t rows, const h3m_rope_args *a);
const char *emu_swiglu(const void *gate, const void *up, void *out, int dt, int64_t rows, const h3m_ew_args *a);
const char *emu_gelu(const float *x, float *y, int64_t rows, const h3m_ew_args *a);
const char *emu_mul(const float *x, const float *b, float *y, int64_t rows, const h3m_ew_args *a);
const char *emu_conv3d(const float *x, const float *w, const float *bias, float *y, const h3m_conv3d_args *g);
const char *emu_snake(const float *x, const float *a, const float *rb, const float *fup, const float *fdown, float *dst,
                      const h3m_phased_args *p);
const char *emu_conv1_clamp(const float *x, const float *w, float *y, const h3m_conv1_args *a);
const char *emu_layernorm(const float *x, const float *w, const float *b, float *y, int64_t rows, const h3m_ln_args *a);
const char *emu_group_norm(const float *x, const float *w, const float *b, float *y, int frames, const h3m_gn_args *a);
const char *emu_euler(float *x, const float *v, const h3m_knob_args *a);
const char *emu_extrapolate(float *out, const float *x, const float *b, const h3m_knob_args *a);
const char *emu_sub(float *out, const float *x, const float *b, const h3m_knob_args *a);
const char *emu_pool_pairs(const float *src, const int64_t *pairs, float *dst, int64_t rows, const h3m_rowop_args *a);
const char *emu_unpool_pairs(const float *red, const float *base, const int64_t *pairs, float *full, int64_t rows,
                             const h3m_rowop_args *a);
const char *emu_scatter_rows(const float *src, const int64_t *idx, float *dst, int64_t rows, const h3m_rowop_args *a);
const char *emu_add_div(float *y, const float *x, int64_t rows, const h3m_rowop_args *a);
const char *emu_head_pool(const float *x, float *y, int64_t rows, const h3m_head_pool_args *a);
const char *emu_channels_last(const float *x, const float *scale, const float *shift, float *y, const h3m_cl_args *a);
const char *emu_unpatchify(const float *src, const int32_t *fmap, float *dst, int64_t rows, const h3m_unpatch_args *a);
/* the kernel's block partials, then (as the host will) their sum in double, in block order */
const char *emu_abs_diff_sum(const float *x, const float *b, int64_t n, double *diff, double *ref);
/* both kernels, in order (what the host encodes for one tile) */
const char *emu_vae_stitch(const float *tile, float *above, float *left, float *carry, uint8_t *rgb, float *pixels,
                           const float *mean, const float *sd, const h3m_stitch_args *s);
const char *emu_linear_q8(const void *x, int xdt, const int8_t *q, const float *scale, const float *bias, void *y,
                          int ydt, const h3m_linear_args *a);
/* the emulator's thread order for the next dispatches (h3emu::set_reverse_order) */
void h3emu_reverse(bool on);
#endif
