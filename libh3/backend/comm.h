/*
 * The communicator: how the ranks of one sequence-parallel render (docs/multi-gpu.md) exchange
 * data. A rank is one device; the transformer splits its packed sequence over the ranks and calls
 * these four collectives around attention and after the block stack (models/dit_sp.c).
 *
 * Two implementations: loopback (comm_loopback.c: ranks as threads of one process, over host
 * memory; the exact CPU path CI checks at several world sizes) and NCCL (backend/cuda/cuda_nccl.cpp:
 * one process per GPU, libnccl.so.2 loaded at run time, buffers are device memory on the stream the
 * backend hands over). Every call is collective: all ranks make the same calls in the same order.
 *
 * Errors: 0 or a negative H3_E_* code with the message recorded (h3_err). A failed collective leaves
 * the group unusable: the caller tears it down (a rank that died or timed out surfaces as an error
 * on the others, never as a hang past the communicator's timeout).
 */
#ifndef H3_COMM_H
#define H3_COMM_H

#include "core/internal.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct h3_comm h3_comm;

/* One piece of an all-to-all: `send_bytes` from `send` go to rank `peer`, and `recv_bytes` from
   that rank land at `recv` (either side may be 0). A peer's pieces are matched in the order both
   ranks list them (NCCL's grouped send/recv rule), so both sides list them in the same order.
   peer never equals the caller's rank: a rank copies its own share itself. */
typedef struct h3_comm_piece {
    int peer;
    const void *send;
    size_t send_bytes;
    void *recv;
    size_t recv_bytes;
} h3_comm_piece;

/* What a rank's collectives moved (bytes this rank sent to other ranks). */
typedef struct h3_comm_stats {
    uint64_t a2a_calls, a2a_bytes;       /* exchange */
    uint64_t gather_calls, gather_bytes; /* all_gather: this rank's share times (world - 1) */
    uint64_t bcast_calls, bcast_bytes;   /* broadcast, counted on the root */
    uint64_t barriers;
} h3_comm_stats;

typedef struct h3_comm_ops {
    /* The grouped send/recv of `n` pieces (an all-to-all when every peer appears). */
    int (*exchange)(h3_comm *c, const h3_comm_piece *p, int n);
    /* recv[r * bytes, (r + 1) * bytes) = rank r's `send` (bytes each). send may be recv + rank * bytes. */
    int (*all_gather)(h3_comm *c, const void *send, void *recv, size_t bytes);
    /* buf on every rank = buf on `root`. */
    int (*broadcast)(h3_comm *c, void *buf, size_t bytes, int root);
    int (*barrier)(h3_comm *c);
    /* A rank that failed tells the group: every collective in flight or to come on any rank returns
       an error instead of waiting for it (NCCL: ncclCommAbort). Safe to call from any thread. */
    void (*abort)(h3_comm *c);
    void (*destroy)(h3_comm *c); /* NULL is fine to pass to h3_comm_destroy */
} h3_comm_ops;

struct h3_comm {
    const h3_comm_ops *ops;
    const char *kind; /* "loopback", "nccl" */
    int rank, world;
    h3_comm_stats stats;
    void *impl;
};

static inline void h3_comm_destroy(h3_comm *c)
{
    if (c && c->ops && c->ops->destroy) c->ops->destroy(c);
}

/* World sizes the loopback accepts (and the most ranks a render splits over). */
#define H3_COMM_MAX_WORLD 64

/* `world` communicators of one loopback group (out[r] is rank r), each used by its own thread. Every
   collective waits for all ranks (pthread barriers); the data moves by memcpy from the other ranks'
   buffers, so buffers are host memory. Destroy each of them (the group goes with the last). */
H3_INTERNAL int h3_comm_loopback_create(int world, h3_comm **out);

/* ---- the NCCL communicator (backend/cuda/cuda_nccl.cpp, built into libh3_cuda) ---------------- */
/* How a process becomes rank `rank` of `world`. libnccl.so.2 is opened at run time (`lib`, else the
   loader's search, which finds the nvidia-nccl wheel's copy when the Python package puts it on the
   path); NVLink multicast (NVLS) is turned off before the communicator exists (NCCL_NVLS_ENABLE=0).
   Rendezvous: rank 0 draws the unique id and writes it to the file `rendezvous` (a path no earlier run
   left behind: rank 0 refuses a file that exists; written to a temporary name and renamed, so a
   reader never sees half of it); the others wait for the file. Every wait (the file, the
   communicator's creation, which needs every rank) ends after timeout_s with one line naming what
   did not come. The collectives run on `stream` (the backend's compute stream, in issue order with
   its ops); buffers are device memory. */
typedef struct h3_nccl_opts {
    uint32_t struct_size;
    int rank, world;
    const char *rendezvous;
    const char *lib;  /* the path of libnccl.so.2 (only it is tried); NULL or "": the loader's search */
    double timeout_s; /* <= 0: 600 s */
    void *stream;     /* cudaStream_t */
    void *scratch;    /* device memory of 4 * world bytes (the barrier) */
    int (*sync)(void *ctx); /* waits for `stream` (barrier, destroy); 0 or a negative H3_E_* */
    void *sync_ctx;
    int (*err)(int code, const char *fmt, ...); /* libh3's error recording (h3_backend_host.err) */
} h3_nccl_opts;
typedef int (*h3_comm_nccl_create_fn)(const h3_nccl_opts *o, h3_comm **out);
#define H3_COMM_NCCL_ENTRY "h3_comm_nccl_create"

#ifdef __cplusplus
}
#endif
#endif /* H3_COMM_H */
