/*
 * The NCCL communicator (backend/comm.h's h3_comm over NCCL; docs/multi-gpu.md): one process per GPU,
 * libnccl.so.2 opened at run time like the other NVIDIA libraries (no build-time dependency, no CUDA
 * header: the stream is a void *), the subset of NCCL's C API below declared here from its public
 * documentation (names, signatures and enum values as NVIDIA publishes them in nccl.h).
 *
 * What each collective is in NCCL: the all-to-all is a group of ncclSend/ncclRecv (NCCL has no
 * all-to-all primitive; a group lets all pairs progress at once), the all-gather and broadcast are
 * NCCL's own, the barrier an all-gather of one word per rank followed by a wait on the stream.
 * All of them are bytes (ncclUint8): the activations' dtype does not matter to the exchange.
 *
 * Plain C++ compiled into libh3_cuda; it cannot see libh3's hidden symbols, so errors go through the
 * caller's err callback (libh3's h3_err, as h3_backend_host hands it to the backend).
 */
#include "backend/comm.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <new>
#include <thread>

namespace {

/* ---- our declarations of the NCCL subset ---- */
typedef int nccl_result;                 /* ncclResult_t */
enum { NCCL_SUCCESS = 0 };               /* ncclSuccess */
enum { NCCL_UINT8 = 1 };                 /* ncclDataType_t ncclUint8 */
enum { NCCL_ID_BYTES = 128 };            /* NCCL_UNIQUE_ID_BYTES */
struct nccl_id {                         /* ncclUniqueId, passed by value */
    char internal[NCCL_ID_BYTES];
};
typedef struct nccl_comm_opaque *nccl_comm; /* ncclComm_t */

typedef nccl_result (*fn_get_version)(int *version);
typedef nccl_result (*fn_get_unique_id)(nccl_id *id);
typedef nccl_result (*fn_comm_init_rank)(nccl_comm *comm, int nranks, nccl_id id, int rank);
typedef nccl_result (*fn_group)(void);
typedef nccl_result (*fn_send)(const void *buf, size_t count, int dtype, int peer, nccl_comm comm, void *stream);
typedef nccl_result (*fn_recv)(void *buf, size_t count, int dtype, int peer, nccl_comm comm, void *stream);
typedef nccl_result (*fn_all_gather)(const void *send, void *recv, size_t sendcount, int dtype, nccl_comm comm,
                                     void *stream);
typedef nccl_result (*fn_broadcast)(const void *send, void *recv, size_t count, int dtype, int root, nccl_comm comm,
                                    void *stream);
typedef nccl_result (*fn_comm_op)(nccl_comm comm);
typedef const char *(*fn_error_string)(nccl_result r);
typedef const char *(*fn_last_error)(nccl_comm comm);

struct nccl_lib {
    void *so = nullptr;
    int version = 0;
    fn_get_version get_version = nullptr;
    fn_get_unique_id get_unique_id = nullptr;
    fn_comm_init_rank comm_init_rank = nullptr;
    fn_group group_start = nullptr, group_end = nullptr;
    fn_send send = nullptr;
    fn_recv recv = nullptr;
    fn_all_gather all_gather = nullptr;
    fn_broadcast broadcast = nullptr;
    fn_comm_op comm_destroy = nullptr, comm_abort = nullptr;
    fn_error_string error_string = nullptr;
    fn_last_error last_error = nullptr; /* optional (NCCL 2.13+) */
};

struct nccl_impl {
    nccl_lib lib;
    nccl_comm comm = nullptr;
    void *stream = nullptr;
    void *scratch = nullptr;
    int (*sync)(void *) = nullptr;
    void *sync_ctx = nullptr;
    int (*err)(int, const char *, ...) = nullptr;
    bool aborted = false;
};

/* The result of ncclCommInitRank, shared with the thread that runs it: a timed-out wait leaves the
   thread running (NCCL's blocking init cannot be interrupted), and it must find this alive. */
struct init_state {
    std::unique_ptr<nccl_impl> abandoned; /* what a timed-out wait leaves to the thread (the library stays loaded) */
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    nccl_result rc = NCCL_SUCCESS;
    nccl_comm comm = nullptr;
};

const int E_INVALID = 1, E_IO = 2, E_NOMEM = 5, E_UNSUPPORTED = 7; /* H3_E_* (h3.h) */

nccl_impl *impl_of(h3_comm *c) { return static_cast<nccl_impl *>(c->impl); }

const char *result_text(const nccl_impl *m, nccl_result r)
{
    const char *s = m->lib.error_string ? m->lib.error_string(r) : nullptr;
    return s ? s : "unknown NCCL error";
}

/* One line for a failed NCCL call: what failed, NCCL's words for the code and its last message. */
int fail(h3_comm *c, const char *what, nccl_result r)
{
    nccl_impl *m = impl_of(c);
    const char *last = m->lib.last_error && m->comm ? m->lib.last_error(m->comm) : nullptr;
    return m->err(E_IO, "nccl rank %d of %d: %s failed: %s (%d)%s%s", c->rank, c->world, what, result_text(m, r), r,
                  last && last[0] ? ": " : "", last && last[0] ? last : "");
}

int nccl_exchange(h3_comm *c, const h3_comm_piece *p, int n)
{
    nccl_impl *m = impl_of(c);
    for (int i = 0; i < n; i++)
        if (p[i].peer < 0 || p[i].peer >= c->world || p[i].peer == c->rank)
            return m->err(E_INVALID, "nccl rank %d: all-to-all piece %d names rank %d of %d", c->rank, i, p[i].peer,
                          c->world);
    nccl_result r = m->lib.group_start();
    if (r != NCCL_SUCCESS) return fail(c, "ncclGroupStart", r);
    nccl_result first = NCCL_SUCCESS;
    const char *what = "";
    for (int i = 0; i < n && first == NCCL_SUCCESS; i++) {
        if (p[i].send_bytes && (r = m->lib.send(p[i].send, p[i].send_bytes, NCCL_UINT8, p[i].peer, m->comm, m->stream)))
            first = r, what = "ncclSend";
        if (first == NCCL_SUCCESS && p[i].recv_bytes &&
            (r = m->lib.recv(p[i].recv, p[i].recv_bytes, NCCL_UINT8, p[i].peer, m->comm, m->stream)))
            first = r, what = "ncclRecv";
    }
    r = m->lib.group_end(); /* always closes the group, even after a failed call inside it */
    if (first != NCCL_SUCCESS) return fail(c, what, first);
    if (r != NCCL_SUCCESS) return fail(c, "ncclGroupEnd", r);
    c->stats.a2a_calls++;
    for (int i = 0; i < n; i++) c->stats.a2a_bytes += p[i].send_bytes;
    return 0;
}

int nccl_all_gather(h3_comm *c, const void *send, void *recv, size_t bytes)
{
    nccl_impl *m = impl_of(c);
    nccl_result r = m->lib.all_gather(send, recv, bytes, NCCL_UINT8, m->comm, m->stream);
    if (r != NCCL_SUCCESS) return fail(c, "ncclAllGather", r);
    c->stats.gather_calls++;
    c->stats.gather_bytes += (uint64_t)bytes * (uint64_t)(c->world - 1);
    return 0;
}

int nccl_broadcast(h3_comm *c, void *buf, size_t bytes, int root)
{
    nccl_impl *m = impl_of(c);
    if (root < 0 || root >= c->world) return m->err(E_INVALID, "nccl: broadcast from rank %d of %d", root, c->world);
    nccl_result r = m->lib.broadcast(buf, buf, bytes, NCCL_UINT8, root, m->comm, m->stream);
    if (r != NCCL_SUCCESS) return fail(c, "ncclBroadcast", r);
    c->stats.bcast_calls++;
    if (c->rank == root) c->stats.bcast_bytes += (uint64_t)bytes * (uint64_t)(c->world - 1);
    return 0;
}

int nccl_barrier(h3_comm *c)
{
    nccl_impl *m = impl_of(c);
    if (!m->scratch) return m->err(E_INVALID, "nccl: a barrier needs the scratch buffer of h3_nccl_opts");
    char *s = static_cast<char *>(m->scratch);
    nccl_result r = m->lib.all_gather(s + 4 * c->rank, s, 4, NCCL_UINT8, m->comm, m->stream);
    if (r != NCCL_SUCCESS) return fail(c, "ncclAllGather (barrier)", r);
    int rc = m->sync ? m->sync(m->sync_ctx) : 0;
    if (!rc) c->stats.barriers++;
    return rc;
}

void nccl_abort(h3_comm *c)
{
    nccl_impl *m = impl_of(c);
    if (m->comm && !m->aborted) m->lib.comm_abort(m->comm);
    m->aborted = true;
}

void nccl_destroy(h3_comm *c)
{
    if (!c) return;
    nccl_impl *m = impl_of(c);
    if (m->comm && !m->aborted) {
        /* work still queued on the stream reads the communicator: wait, then free it (abort if the wait fails) */
        if (m->sync && m->sync(m->sync_ctx))
            m->lib.comm_abort(m->comm);
        else
            m->lib.comm_destroy(m->comm);
    }
    if (m->lib.so) dlclose(m->lib.so);
    delete m;
    delete c;
}

const h3_comm_ops k_ops = {nccl_exchange, nccl_all_gather, nccl_broadcast, nccl_barrier, nccl_abort, nccl_destroy};

/* dlopen and resolve; one line naming the library or the missing symbol. */
int load(nccl_lib *L, const char *path, int (*err)(int, const char *, ...))
{
    const char *name = path && path[0] ? path : "libnccl.so.2";
    /* a path given (H3_NCCL_LIB) is the only one tried: a wrong setting is named, not papered over */
    L->so = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!L->so) {
        const char *why = dlerror();
        return err(E_UNSUPPORTED, "NCCL is not available: %s (install the nvidia-nccl-cu13 wheel%s)",
                   why ? why : name, path && path[0] ? " or fix H3_NCCL_LIB" : " or set H3_NCCL_LIB");
    }
    struct {
        const char *name;
        void **slot;
        bool need;
    } syms[] = {
        {"ncclGetVersion", reinterpret_cast<void **>(&L->get_version), true},
        {"ncclGetUniqueId", reinterpret_cast<void **>(&L->get_unique_id), true},
        {"ncclCommInitRank", reinterpret_cast<void **>(&L->comm_init_rank), true},
        {"ncclGroupStart", reinterpret_cast<void **>(&L->group_start), true},
        {"ncclGroupEnd", reinterpret_cast<void **>(&L->group_end), true},
        {"ncclSend", reinterpret_cast<void **>(&L->send), true},
        {"ncclRecv", reinterpret_cast<void **>(&L->recv), true},
        {"ncclAllGather", reinterpret_cast<void **>(&L->all_gather), true},
        {"ncclBroadcast", reinterpret_cast<void **>(&L->broadcast), true},
        {"ncclCommDestroy", reinterpret_cast<void **>(&L->comm_destroy), true},
        {"ncclCommAbort", reinterpret_cast<void **>(&L->comm_abort), true},
        {"ncclGetErrorString", reinterpret_cast<void **>(&L->error_string), true},
        {"ncclGetLastError", reinterpret_cast<void **>(&L->last_error), false},
    };
    for (auto &s : syms) {
        *s.slot = dlsym(L->so, s.name);
        if (!*s.slot && s.need) {
            dlclose(L->so);
            L->so = nullptr;
            return err(E_UNSUPPORTED, "NCCL library %s has no %s (too old or not NCCL)", name, s.name);
        }
    }
    nccl_result r = L->get_version(&L->version);
    /* point-to-point send/recv came with NCCL 2.7 (codes: 2700 up to 2.8, major*10000 + minor*100 from 2.9) */
    if (r != NCCL_SUCCESS || L->version < 2700) {
        const int v = L->version;
        dlclose(L->so);
        L->so = nullptr;
        return err(E_UNSUPPORTED, "NCCL library %s is version code %d; sequence parallelism needs NCCL 2.7 or newer",
                   name, r == NCCL_SUCCESS ? v : -1);
    }
    return 0;
}

double now_s()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/* Rank 0: the id to a temporary name next to the file, then renamed onto it. */
int write_id(const char *path, const nccl_id &id, int (*err)(int, const char *, ...))
{
    struct stat st;
    if (stat(path, &st) == 0)
        return err(E_INVALID, "nccl rank 0: the rendezvous file %s exists already (left by an earlier run? each run "
                   "needs a new path)", path);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0) return err(E_IO, "nccl rank 0: cannot write the rendezvous file %s: %s", tmp, strerror(errno));
    const bool ok = write(fd, id.internal, NCCL_ID_BYTES) == NCCL_ID_BYTES;
    const bool closed = close(fd) == 0;
    if (!ok || !closed || rename(tmp, path) != 0) {
        const int e = errno;
        unlink(tmp);
        return err(E_IO, "nccl rank 0: cannot write the rendezvous file %s: %s", path, strerror(e));
    }
    return 0;
}

/* The other ranks: wait for the whole file. */
int read_id(const char *path, int rank, double timeout_s, nccl_id *id, int (*err)(int, const char *, ...))
{
    const double t0 = now_s();
    for (;;) {
        int fd = open(path, O_RDONLY);
        if (fd >= 0) {
            const ssize_t n = read(fd, id->internal, NCCL_ID_BYTES);
            close(fd);
            if (n == NCCL_ID_BYTES) return 0;
            return err(E_IO, "nccl rank %d: the rendezvous file %s holds %zd bytes, not %d", rank, path, n,
                       NCCL_ID_BYTES);
        }
        if (errno != ENOENT) return err(E_IO, "nccl rank %d: cannot read the rendezvous file %s: %s", rank, path, strerror(errno));
        if (now_s() - t0 > timeout_s)
            return err(E_IO, "nccl rank %d: no rendezvous file %s after %.3g s (rank 0 did not start or failed)", rank,
                       path, timeout_s);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
}

} // namespace

extern "C" __attribute__((visibility("default"))) int h3_comm_nccl_create(const h3_nccl_opts *o, h3_comm **out)
{
    if (!o || !out || !o->err) return -E_INVALID;
    *out = nullptr;
    int (*err)(int, const char *, ...) = o->err;
    if (o->struct_size < sizeof(h3_nccl_opts)) return err(E_INVALID, "nccl: h3_nccl_opts of %u bytes", o->struct_size);
    if (o->world < 1 || o->world > H3_COMM_MAX_WORLD || o->rank < 0 || o->rank >= o->world)
        return err(E_INVALID, "nccl: rank %d of %d ranks (1 to %d ranks)", o->rank, o->world, H3_COMM_MAX_WORLD);
    if (o->world > 1 && (!o->rendezvous || !o->rendezvous[0]))
        return err(E_INVALID, "nccl: %d ranks need a rendezvous file (H3_RENDEZVOUS)", o->world);
    const double timeout = o->timeout_s > 0 ? o->timeout_s : 600.0;
    /* NVLink multicast stays off: set before NCCL reads its environment (at the communicator's init) */
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    std::unique_ptr<nccl_impl> m(new (std::nothrow) nccl_impl);
    h3_comm *c = new (std::nothrow) h3_comm;
    if (!m || !c) {
        delete c;
        return err(E_NOMEM, "nccl: out of memory");
    }
    memset(c, 0, sizeof *c);
    m->err = err;
    int rc = load(&m->lib, o->lib, err);
    if (rc) {
        delete c;
        return rc;
    }
    nccl_id id;
    memset(&id, 0, sizeof id);
    if (o->rank == 0) {
        nccl_result r = m->lib.get_unique_id(&id);
        if (r != NCCL_SUCCESS)
            rc = err(E_IO, "nccl rank 0: ncclGetUniqueId failed: %s (%d)", result_text(m.get(), r), r);
        else if (o->world > 1)
            rc = write_id(o->rendezvous, id, err);
    } else {
        rc = read_id(o->rendezvous, o->rank, timeout, &id, err);
    }
    if (rc) {
        dlclose(m->lib.so);
        delete c;
        return rc;
    }
    /* ncclCommInitRank blocks until every rank joined: run it where a missing rank cannot hold us past
       the timeout (the thread keeps the library and its state alive if it is abandoned) */
    auto st = std::make_shared<init_state>();
    fn_comm_init_rank init = m->lib.comm_init_rank;
    const int world = o->world, rank = o->rank;
    try {
        std::thread([st, init, world, id, rank]() {
            nccl_comm comm = nullptr;
            nccl_result r = init(&comm, world, id, rank);
            std::lock_guard<std::mutex> g(st->mu);
            st->rc = r;
            st->comm = comm;
            st->done = true;
            st->cv.notify_all();
        }).detach();
    } catch (...) {
        dlclose(m->lib.so);
        delete c;
        return err(E_NOMEM, "nccl rank %d: cannot start the communicator's init thread", rank);
    }
    {
        std::unique_lock<std::mutex> g(st->mu);
        const bool done = st->cv.wait_for(g, std::chrono::duration<double>(timeout), [&] { return st->done; });
        if (!done) {
            delete c;
            st->abandoned = std::move(m); /* the library stays loaded for the abandoned thread */
            return err(E_IO, "nccl rank %d of %d: ncclCommInitRank did not complete in %.3g s (a rank did not join)",
                       rank, world, timeout);
        }
    }
    if (st->rc != NCCL_SUCCESS) {
        rc = err(E_IO, "nccl rank %d of %d: ncclCommInitRank failed: %s (%d)", rank, world, result_text(m.get(), st->rc),
                 st->rc);
        dlclose(m->lib.so);
        delete c;
        return rc;
    }
    m->comm = st->comm;
    m->stream = o->stream;
    m->scratch = o->scratch;
    m->sync = o->sync;
    m->sync_ctx = o->sync_ctx;
    c->ops = &k_ops;
    c->kind = "nccl";
    c->rank = rank;
    c->world = world;
    c->impl = m.release();
    *out = c;
    return 0;
}

/* The version code of the loaded library (0 when c is not an NCCL communicator). */
extern "C" __attribute__((visibility("default"))) int h3_comm_nccl_version(const h3_comm *c)
{
    return c && c->ops == &k_ops ? static_cast<const nccl_impl *>(c->impl)->lib.version : 0;
}
