/*
 * The API layer's view of a context. Only files under api/ include this: below it, the runtime
 * receives an h3_runtime and the stages receive a model, a pool or backend and a progress hook.
 */
#ifndef H3_API_INTERNAL_H
#define H3_API_INTERNAL_H

#include "runtime/runtime.h"

struct h3_ctx {
    h3_model model;
    h3_runtime rt;       /* pool, backends, tokenizer, prompt cache, transformer, request */
    int threads;
    unsigned flags;      /* H3_OPT_* after the environment overrides */
    int device;          /* H3_DEVICE_CPU, H3_DEVICE_CUDA or H3_DEVICE_METAL once resolved */
    int device_index;
    char *info_json;
    char *mem_json;
    char *dit_json;
    char device_desc[192];
};

/* Online CPUs (at most 256): the default thread count. */
H3_INTERNAL int h3_online_cpus(void);

#endif /* H3_API_INTERNAL_H */
