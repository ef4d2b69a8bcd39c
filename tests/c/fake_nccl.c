/*
 * A fake libnccl.so.2 for tests/c/test_nccl.c (plain C, host memory, streams ignored): the entry points
 * backend/cuda/cuda_nccl.cpp resolves, behaving as a one-process NCCL would. Built once per variant:
 *   FAKE_NCCL_OK        works: one rank does its collectives as copies; ranks of larger groups join
 *                       at once and record the unique id they were given (fake_nccl_seen)
 *   FAKE_NCCL_INITFAIL  ncclCommInitRank returns ncclSystemError
 *   FAKE_NCCL_HANG      ncclCommInitRank never returns within the test (a rank that does not join)
 *   FAKE_NCCL_OLD       version code 2600 (before point-to-point send/recv)
 *   FAKE_NCCL_NOSEND    no ncclSend symbol
 * The numbers are NCCL's: ncclSuccess 0, ncclSystemError 2, ncclInvalidUsage 5, ncclUint8 1.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

typedef struct {
    char internal[128];
} fake_id;
typedef struct {
    int nranks, rank;
    fake_id id;
} fake_comm;

static fake_comm g_comms[8] __attribute__((unused));
static int g_next __attribute__((unused));
static int g_in_group, g_pending_send;
static const void *g_send;
static size_t g_send_bytes;

API char fake_nccl_seen[8][128]; /* the id each rank passed to ncclCommInitRank */
API int fake_nccl_destroyed, fake_nccl_aborted;

API int ncclGetVersion(int *v)
{
#ifdef FAKE_NCCL_OLD
    *v = 2600;
#else
    *v = 22809;
#endif
    return 0;
}

API int ncclGetUniqueId(fake_id *id)
{
    for (int i = 0; i < 128; i++) id->internal[i] = (char)(i * 7 + 3 + getpid());
    return 0;
}

API int ncclCommInitRank(fake_comm **comm, int nranks, fake_id id, int rank)
{
#ifdef FAKE_NCCL_INITFAIL
    (void)comm, (void)nranks, (void)id, (void)rank;
    return 2;
#else
#ifdef FAKE_NCCL_HANG
    sleep(30);
#endif
    fake_comm *c = &g_comms[__atomic_fetch_add(&g_next, 1, __ATOMIC_SEQ_CST) % 8];
    c->nranks = nranks;
    c->rank = rank;
    c->id = id;
    if (rank >= 0 && rank < 8) memcpy(fake_nccl_seen[rank], id.internal, 128);
    *comm = c;
    return 0;
#endif
}

API int ncclGroupStart(void)
{
    g_in_group = 1;
    return 0;
}
API int ncclGroupEnd(void)
{
    g_in_group = 0;
    return g_pending_send ? 5 : 0;
}

/* One rank sends to itself only (the exchange never does; a send with no matching receive is an
   invalid usage at the group's end). */
#ifndef FAKE_NCCL_NOSEND
API int ncclSend(const void *buf, size_t count, int dtype, int peer, fake_comm *comm, void *stream)
{
    (void)dtype, (void)stream;
    if (peer < 0 || peer >= comm->nranks) return 4;
    g_send = buf;
    g_send_bytes = count;
    g_pending_send = 1;
    return 0;
}
#endif
API int ncclRecv(void *buf, size_t count, int dtype, int peer, fake_comm *comm, void *stream)
{
    (void)dtype, (void)stream;
    if (peer < 0 || peer >= comm->nranks || !g_pending_send || !g_send || count != g_send_bytes) return 5;
    memcpy(buf, g_send, count);
    g_pending_send = 0;
    return 0;
}

API int ncclAllGather(const void *send, void *recv, size_t count, int dtype, fake_comm *comm, void *stream)
{
    (void)dtype, (void)stream;
    if (comm->nranks != 1) return 5;
    if (send != recv) memmove(recv, send, count);
    return 0;
}

API int ncclBroadcast(const void *send, void *recv, size_t count, int dtype, int root, fake_comm *comm, void *stream)
{
    (void)dtype, (void)stream;
    if (root < 0 || root >= comm->nranks) return 4;
    if (send != recv) memmove(recv, send, count);
    return 0;
}

API int ncclCommDestroy(fake_comm *comm)
{
    (void)comm;
    fake_nccl_destroyed++;
    return 0;
}
API int ncclCommAbort(fake_comm *comm)
{
    (void)comm;
    fake_nccl_aborted++;
    return 0;
}

API const char *ncclGetErrorString(int r)
{
    static const char *s[] = {"no error", "unhandled cuda error", "unhandled system error", "internal error",
                              "invalid argument", "invalid usage", "remote process exited or there was a network error"};
    return r >= 0 && r < 7 ? s[r] : "unknown result code";
}

API const char *ncclGetLastError(fake_comm *comm)
{
    (void)comm;
    return "fake: the last message";
}
