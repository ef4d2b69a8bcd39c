/*
 * The tuning knobs: every H3_* environment variable libh3 reads, read in one place (core/tuning.c,
 * the only getenv of the library) and handed to the layers as values. docs/environment.md lists
 * them. Two are read once per process, at their first use, because code runs on them before any
 * context exists: H3_NO_SIMD (the CPU kernel variant, h3_host_simd) and H3_CUDA_LIB (where the
 * CUDA backend library is, also asked by h3_backends_json). The others are read by h3_init into
 * the context's h3_tuning (h3_tuning_read), so a context keeps the values it was opened with.
 *
 * Values are kept as the variables' meaning, not parsed further than the old readers did: the
 * CUDA backend's three strings are checked by the backend when it is created (its refusal
 * messages name the variable and the value).
 */
#ifndef H3_TUNING_H
#define H3_TUNING_H

#include "core/internal.h"

#define H3_TUNING_STR 256

typedef struct h3_tuning {
    /* H3_DIT_PRECOMPUTE, H3_DIT_KEEP_ADALN, H3_TEXT_PREFETCH, H3_DROP_PAGE_CACHE, H3_STAGES_CPU,
       H3_FP8_ATTENTION, H3_FP8_DECODER: the H3_OPT_* bits the environment turns on and off over h3_options.flags. */
    unsigned flags_on, flags_off;
    int text_stream;  /* H3_TEXT_STREAM: 0 off, 1 on (the CPU too), -1 unset: on where weights are copied */
    int text_readers; /* H3_TEXT_READERS: threads reading a text-encoder layer, 1-16; 0 unset (8 streamed, 1 CPU) */
    int text_keep;    /* H3_TEXT_KEEP: 0 never, 1 always, -1 unset: where the GPU has room */
    bool stream_pack; /* H3_STREAM_PACK: packed copies of streamed transformer blocks (0 turns off) */
    /* The CUDA backend's, as set ("" unset), passed to its create call (h3_backend_host). */
    char cuda_attention[H3_TUNING_STR]; /* H3_CUDA_ATTENTION: auto, own or cudnn */
    char cuda_rows[H3_TUNING_STR];      /* H3_CUDA_ROWS: auto or scalar */
    char cudnn_lib[4096];               /* H3_CUDNN_LIB: path of libcudnn.so.9 */
    /* H3_QUANT_WIDEN: a single file's quantised layers are widened to BF16 at load (1), not computed
       from their stored codes where the backend can (the default). */
    bool quant_widen;
    char libcuda[4096];                 /* H3_LIBCUDA: path of libcuda.so.1 (tests: a fake driver) */
    char nvrtc_lib[4096];               /* H3_NVRTC_LIB: path of libnvrtc.so.13 */
    char cublaslt_lib[4096];            /* H3_CUBLASLT_LIB: path of libcublasLt.so.13 */
    /* The CUDA kernel cache folder: H3_KERNEL_CACHE ("off": none), else $XDG_CACHE_HOME/h3ctl/kernels,
       else $HOME/.cache/h3ctl/kernels; "" when there is none. */
    char kernel_cache[4096];
    /* Once per process (copies, for h3_tuning_json). */
    bool no_simd;       /* H3_NO_SIMD */
    char cuda_lib[4096]; /* H3_CUDA_LIB, "" unset */
    /* Sequence parallelism (docs/multi-gpu.md). H3_LOOPBACK_RANKS: the transformer's block stack split
       over that many loopback ranks (threads; the CPU), 0 unset (or 0), -1 not a whole number 0..64. */
    int loopback_ranks;
    /* One process of a multi-process group (the launcher's or an embedder's): RANK, WORLD_SIZE,
       LOCAL_RANK (-1 unset, -2 not a whole number) and H3_RENDEZVOUS (the file that carries the NCCL
       unique id from rank 0; "" unset), H3_NCCL_LIB (path of libnccl.so.2; "" the loader's search). */
    int rank, world_size, local_rank;
    char rendezvous[4096];
    char nccl_lib[4096];
} h3_tuning;

/* The environment now, into *t (the per-context knobs; the per-process ones as first read). */
H3_INTERNAL void h3_tuning_read(h3_tuning *t);
/* H3_NO_SIMD set to a value other than "" and "0"; read once per process. */
H3_INTERNAL bool h3_env_no_simd(void);
/* H3_CUDA_LIB, "" when unset; read once per process. */
H3_INTERNAL const char *h3_env_cuda_lib(void);
/* H3_METAL_LIB (where the Metal backend library is), "" when unset; read once per process. */
H3_INTERNAL const char *h3_env_metal_lib(void);
/* The folder for temporary files: $TMPDIR when set and not empty, else /tmp (read at each call). */
H3_INTERNAL const char *h3_env_tmpdir(void);
/* The tuning in effect as a JSON object, keyed by variable: null where unset (the default holds). */
H3_INTERNAL void h3_tuning_json(h3_buf *b, const h3_tuning *t);

#endif /* H3_TUNING_H */
