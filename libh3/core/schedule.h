/*
 * The sampler's arithmetic shared by every backend: MiniMaxH3Scheduler's sigma grid and Euler
 * step, and libh3's counter-based noise (core/schedule.c).
 */
#ifndef H3_SCHEDULE_H
#define H3_SCHEDULE_H

#include "core/internal.h"

/*
 * MiniMaxH3Scheduler.set_timesteps(steps) with the given shift, bit for bit: `steps` grid points
 * of torch.linspace(1, 0, steps) in f32, shifted in f32, consecutive duplicates collapsed.
 * Writes up to `steps` sigmas and returns their count (>= 2), or a negative error.
 */
H3_INTERNAL int h3_sched_sigmas(int steps, double shift, float *sigmas);
/* timesteps[i] = 1 - sigmas[i] (f32), i < n - 1. */
H3_INTERNAL void h3_sched_timesteps(const float *sigmas, int n, float *timesteps);
/* MiniMaxH3Scheduler.step on n values in place: x <- r*x + (1-r)*(x + (1-t)*v), r = s1/s0. */
H3_INTERNAL void h3_sched_euler(float *x, const float *v, int64_t n, float t, float sigma, float sigma_next);
/*
 * Named sigma grids (docs/few-step.md). Each fills `steps` grid points (terminal 0 included) for
 * video and audio and returns their common count, or a negative error naming the known names:
 *  "h3"          MiniMaxH3Scheduler (h3_sched_sigmas) with the model's shifts (the default);
 *  "turbo-544p"  the same grid at shifts 12 / 3 (lightx2v Minimax-h3-Turbo 544p, larryvrh Turbo LoRA);
 *  "turbo-768p"  the same grid at shifts 6 / 3 (lightx2v Minimax-h3-Turbo v1.0 768p);
 *  "pdd"         the same grid at shifts 12 / 3 (alibaba-pai Acc LoRAs: euler + simple, on the head grid);
 *  "h3c-lowstep" h3.c's low-step grid: base 1 - i/E in f32 (E = steps - 1 passes), shifted 12 / 3,
 *                terminal 0.
 */
H3_INTERNAL int h3_sched_named(const char *name, int steps, double model_shift_video, double model_shift_audio,
                               float *video, float *audio);
/* Index of a schedule name (>= 0), or -1. */
H3_INTERNAL int h3_sched_find(const char *name);
/* The i-th name (NULL past the last) and the names joined by ", " (static storage). */
H3_INTERNAL const char *h3_sched_name(int i);
H3_INTERNAL const char *h3_sched_names(void);
/* An explicit grid (a request's sigmas): n in 2..100000 values per modality in [0, 1], strictly
   decreasing (a full render ends at 0; a segment of a grid may stop before). */
H3_INTERNAL int h3_sched_check(const float *sigmas, int n, const char *what);

/* Standard normal noise, element `offset + i` of stream (seed, stream) for i < n (see schedule.c). */
H3_INTERNAL void h3_noise(uint64_t seed, uint32_t stream, uint64_t offset, float *out, int64_t n);

#endif /* H3_SCHEDULE_H */
