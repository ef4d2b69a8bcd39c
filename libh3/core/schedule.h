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
/* Standard normal noise, element `offset + i` of stream (seed, stream) for i < n (see schedule.c). */
H3_INTERNAL void h3_noise(uint64_t seed, uint32_t stream, uint64_t offset, float *out, int64_t n);

#endif /* H3_SCHEDULE_H */
