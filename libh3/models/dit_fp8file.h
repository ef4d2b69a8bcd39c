/*
 * Pre-quantised fp8 transformer weights on file: what `h3ctl quantize` (h3_quantize) writes once and
 * a GPU context with h3_options.quantized_path reads instead of quantising at load.
 *
 * The file is one safetensors file. For every weight the fp8 path quantises (the main blocks'
 * qkv, out, fc1 and fc2 of a shape h3_fp8_weight_shape_ok accepts, in block order) it holds
 * "<name>" F8_E4M3 [rows, cols] and "<name>.scale" F32 [rows], the bits the CUDA backend's
 * quantiser makes (core/fp8.h). __metadata__:
 *   "h3ctl.format":    H3_FP8FILE_FORMAT
 *   "h3ctl.precision": "fp8"
 *   "h3ctl.identity":  the checkpoint's identity (below), 64 hex digits
 *   "h3ctl.partition": "FL2VA" / "Ref2VA" / "partition" (informative; the identity decides)
 *
 * Identity: SHA-256 over the transformer's config.json, every shard's safetensors header (the
 * 8-byte length and the JSON: names, dtypes, shapes, offsets) and, for every quantised weight, its
 * name and three 4 KiB windows of its stored bytes (start, middle, end). Computing it reads a few
 * MiB whatever the model's size (milliseconds, not a 42 GiB read), and it changes with any other
 * checkpoint of the same shapes (other values) or another layout; a checkpoint that differs only in
 * bytes outside the windows of the quantised weights is not told apart (a cheap fingerprint, not
 * a checksum of the weights).
 */
#ifndef H3_DIT_FP8FILE_H
#define H3_DIT_FP8FILE_H

#include "backend/backend.h"
#include "core/internal.h"

#define H3_FP8FILE_FORMAT "fp8-e4m3-per-output-channel/1"

struct h3_pool;
typedef struct h3_fp8file h3_fp8file;

/* Quantise the model's transformer and write the file at `path` (atomically; an existing file is
   replaced only with `overwrite`). Progress phase "quantize", one unit per weight. */
H3_INTERNAL int h3_fp8file_write(h3_model *m, struct h3_pool *pool, const char *path, bool overwrite,
                                 h3_progress_fn fn, void *user);
/* Open and check a file against the model before any work: well formed and complete (a truncated
   file fails), its format and precision, its identity equal to the model's, every weight there
   with its dtype and shape, nothing else. Errors name the file and the reason in one line. */
H3_INTERNAL int h3_fp8file_open(h3_model *m, const char *path, h3_fp8file **out);
H3_INTERNAL void h3_fp8file_close(h3_fp8file *f);
/* Weight `name` [rows, cols]: its e4m3 values and scales, mapped from the file. */
H3_INTERNAL int h3_fp8file_get(h3_fp8file *f, const char *name, int64_t rows, int64_t cols, const uint8_t **q,
                               const float **scale);
/* Let the pages of weight `name` go (its device copy is made). */
H3_INTERNAL void h3_fp8file_release(h3_fp8file *f, const char *name);

#endif /* H3_DIT_FP8FILE_H */
