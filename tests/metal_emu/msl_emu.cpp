/*
 * The MSL emulator's runtime: each threadgroup's threads run as cooperating fibers on one host
 * thread, switched only where MSL makes threads wait for each other (threadgroup_barrier and the
 * SIMD-group functions), so barrier and SIMD-group semantics are real, not approximated: a fiber
 * that reaches a barrier stays suspended until every thread of its group has reached it, and a
 * SIMD-group function's result is computed from the operands every live lane passed at that call.
 *
 * Threadgroups run one after another in grid order, fibers round-robin in thread order: a run is
 * deterministic. When no fiber can run and some have not returned, the run is a deadlock and is
 * reported with what the threads wait for, instead of hanging.
 *
 * The context switch is a few lines of x86-64 assembly (callee-saved registers, MXCSR and the x87
 * control word); elsewhere, or with H3EMU_UCONTEXT defined, ucontext's swapcontext (slower: it
 * saves the signal mask with a system call at every switch).
 */
#include "../../shaders/metal/msl_emu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>
#include <vector>

#if !defined(__x86_64__) && !defined(H3EMU_UCONTEXT)
#define H3EMU_UCONTEXT 1
#endif
#ifdef H3EMU_UCONTEXT
#include <ucontext.h>
#endif

namespace h3emu {

void complete_simd(int sg);

namespace {

enum fstate { RUNNABLE, AT_BARRIER, AT_SIMD, DONE };

struct fiber {
#ifdef H3EMU_UCONTEXT
    ucontext_t uc;
#else
    void *sp;
#endif
    char *stack;
    fstate st;
    ids id;
    lane_slot slot;
};

struct simd_state {
    int arrived;
    simd_op op;
    bool need_all;
};

const size_t STACK_BYTES = 128 * 1024; /* the kernels keep a few dozen floats per thread */

struct runtime {
    std::vector<fiber> fibers;
    std::vector<simd_state> simd;
    std::vector<char *> stacks;
    size_t page;
    int n;           /* threads in the group */
    int cur;         /* fiber running, -1: the scheduler */
    int bar_arrived; /* threads waiting at the barrier */
    std::string err;
    thread_fn fn;
    void *ctx;
    void *tgmem;
    stats st;
    bool reverse; /* resume fibers from the last thread to the first */
#ifdef H3EMU_UCONTEXT
    ucontext_t sched;
#else
    void *sched_sp;
#endif
};

runtime R;

#ifndef H3EMU_UCONTEXT
extern "C" void h3emu_switch(void **save_sp, void *load_sp);
extern "C" void h3emu_boot();
/* h3emu_switch: push the callee-saved registers and the FP control words, save the stack pointer
   to *save_sp, load load_sp, pop the same and return into the other fiber. h3emu_boot is the first
   return address of a new fiber: it calls fiber_main (held in r12). */
asm(".text\n"
    ".globl h3emu_switch\n"
    ".type h3emu_switch,@function\n"
    "h3emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size h3emu_switch, .-h3emu_switch\n"
    ".globl h3emu_boot\n"
    ".type h3emu_boot,@function\n"
    "h3emu_boot:\n"
    "  callq *%r12\n"
    "  ud2\n"
    ".size h3emu_boot, .-h3emu_boot\n");
#endif

void to_scheduler()
{
    fiber &f = R.fibers[(size_t)R.cur];
    R.st.switches++;
#ifdef H3EMU_UCONTEXT
    swapcontext(&f.uc, &R.sched);
#else
    h3emu_switch(&f.sp, R.sched_sp);
#endif
}

extern "C" void fiber_main()
{
    fiber &f = R.fibers[(size_t)R.cur];
    R.fn(R.ctx, f.id, R.tgmem);
    R.fibers[(size_t)R.cur].st = DONE;
    /* a lane leaving may complete a SIMD-group function the others wait at */
    const int sg = (int)R.fibers[(size_t)R.cur].id.simdgroup_index_in_threadgroup;
    const int base = sg * SIMD_WIDTH;
    simd_state &s = R.simd[(size_t)sg];
    if (s.arrived > 0) {
        int live = 0;
        for (int l = 0; l < SIMD_WIDTH && base + l < R.n; l++) live += R.fibers[(size_t)(base + l)].st != DONE;
        if (s.arrived == live) {
            complete_simd(sg);
        }
    }
    to_scheduler();
    abort(); /* a finished fiber is never resumed */
}

#ifdef H3EMU_UCONTEXT
void ucontext_entry() { fiber_main(); }
#endif

char *new_stack()
{
    const size_t total = STACK_BYTES + R.page;
    void *p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    mprotect(p, R.page, PROT_NONE); /* an overflowing fiber faults instead of corrupting its neighbour */
    return (char *)p + R.page;
}

void start_fiber(fiber &f)
{
#ifdef H3EMU_UCONTEXT
    getcontext(&f.uc);
    f.uc.uc_stack.ss_sp = f.stack;
    f.uc.uc_stack.ss_size = STACK_BYTES;
    f.uc.uc_link = nullptr;
    makecontext(&f.uc, (void (*)())ucontext_entry, 0);
#else
    uintptr_t top = ((uintptr_t)(f.stack + STACK_BYTES)) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)top;
    *--sp = (uint64_t)&h3emu_boot; /* return address: after it rsp is 16-aligned, so fiber_main
                                       starts with rsp % 16 == 8 as the ABI wants */
    *--sp = 0;                        /* rbp */
    *--sp = 0;                        /* rbx */
    *--sp = (uint64_t)&fiber_main;    /* r12 */
    *--sp = 0;                        /* r13 */
    *--sp = 0;                        /* r14 */
    *--sp = 0;                        /* r15 */
    *--sp = 0x1F80u | (0x037Full << 32); /* MXCSR default, x87 control word default */
    f.sp = sp;
#endif
}

void resume(int i)
{
    R.cur = i;
    R.st.switches++;
#ifdef H3EMU_UCONTEXT
    swapcontext(&R.sched, &R.fibers[(size_t)i].uc);
#else
    h3emu_switch(&R.sched_sp, R.fibers[(size_t)i].sp);
#endif
    R.cur = -1;
}

std::string describe_wait()
{
    int done = 0, bar = 0, simd = 0;
    for (int i = 0; i < R.n; i++) {
        done += R.fibers[(size_t)i].st == DONE;
        bar += R.fibers[(size_t)i].st == AT_BARRIER;
        simd += R.fibers[(size_t)i].st == AT_SIMD;
    }
    char buf[256];
    snprintf(buf, sizeof buf,
             "deadlock: of %d threads, %d wait at a threadgroup barrier, %d at a SIMD-group function, %d returned "
             "(a barrier every thread does not reach, or SIMD-group calls in divergent code)",
             R.n, bar, simd, done);
    return buf;
}

} // namespace

void complete_simd(int sg)
{
    simd_state &s = R.simd[(size_t)sg];
    const int base = sg * SIMD_WIDTH;
    lane_slot slots[SIMD_WIDTH] = {};
    uint32_t active = 0;
    int lanes = 0;
    for (int l = 0; l < SIMD_WIDTH && base + l < R.n; l++) {
        fiber &f = R.fibers[(size_t)(base + l)];
        lanes++;
        if (f.st == AT_SIMD) {
            active |= 1u << l;
            slots[l] = f.slot;
        }
    }
    R.st.collectives++;
    if (s.need_all && (lanes != SIMD_WIDTH || active != 0xFFFFFFFFu)) {
        if (R.err.empty())
            R.err = "a simdgroup matrix function ran with " + std::to_string(__builtin_popcount(active)) +
                    " of 32 lanes (it needs the whole simdgroup)";
    } else {
        const char *e = s.op(slots, active);
        if (e && R.err.empty()) R.err = e;
    }
    for (int l = 0; l < SIMD_WIDTH && base + l < R.n; l++) {
        fiber &f = R.fibers[(size_t)(base + l)];
        if (f.st == AT_SIMD) f.st = RUNNABLE;
    }
    s.arrived = 0;
    s.op = nullptr;
}

uint current_lane() { return R.fibers[(size_t)R.cur].id.thread_index_in_simdgroup; }

void barrier(const void *site)
{
    fiber &f = R.fibers[(size_t)R.cur];
    R.st.barriers++;
    (void)site; /* see simd_collective */
    if (++R.bar_arrived == R.n) { /* the last one releases the group */
        for (int i = 0; i < R.n; i++)
            if (R.fibers[(size_t)i].st == AT_BARRIER) R.fibers[(size_t)i].st = RUNNABLE;
        R.bar_arrived = 0;
        return;
    }
    f.st = AT_BARRIER;
    to_scheduler();
}

void simd_collective(simd_op op, const void *site, const void *in, void *out, bool need_all)
{
    fiber &f = R.fibers[(size_t)R.cur];
    const int sg = (int)f.id.simdgroup_index_in_threadgroup, base = sg * SIMD_WIDTH;
    simd_state &s = R.simd[(size_t)sg];
    /* Calls are matched by function, not by call site: the C++ compiler may duplicate one source
       call (tail duplication, loop versioning), so two return addresses can be the same MSL call. */
    (void)site;
    if (s.arrived == 0) {
        s.op = op, s.need_all = need_all;
    } else if (s.op != op && R.err.empty()) {
        R.err = "lanes of one simdgroup called different SIMD-group functions (divergent control flow)";
    }
    f.slot.in = in, f.slot.out = out;
    s.arrived++;
    int live = 0;
    for (int l = 0; l < SIMD_WIDTH && base + l < R.n; l++) live += R.fibers[(size_t)(base + l)].st != DONE;
    if (s.arrived == live) {
        f.st = AT_SIMD;
        complete_simd(sg);
        f.st = RUNNABLE;
        return;
    }
    f.st = AT_SIMD;
    to_scheduler();
}

stats last_stats() { return R.st; }

void set_reverse_order(bool on) { R.reverse = on; }

/* Messages stay valid for the life of the process (a run after a failed one keeps the old text). */
static const char *keep(const std::string &m) { return strdup(m.c_str()); }

const char *run(thread_fn fn, void *ctx, uint3 grid, uint3 tpg, size_t tgmem_bytes)
{
    std::string msg;
    R.st = stats{};
    const uint64_t n = (uint64_t)tpg.x * tpg.y * tpg.z;
    if (n == 0 || n > 1024) {
        msg = "threads per threadgroup " + std::to_string(n) + " (Metal allows 1 to 1024)";
        return keep(msg);
    }
    if (tgmem_bytes > 32768) {
        msg = "threadgroup memory of " + std::to_string(tgmem_bytes) + " bytes (Apple GPUs have 32 KiB)";
        return keep(msg);
    }
    if (!R.page) R.page = (size_t)sysconf(_SC_PAGESIZE);
    R.n = (int)n;
    R.fn = fn, R.ctx = ctx;
    R.fibers.assign(n, fiber{});
    R.simd.assign((n + SIMD_WIDTH - 1) / SIMD_WIDTH, simd_state{});
    while (R.stacks.size() < n) {
        char *s = new_stack();
        if (!s) {
            msg = "out of memory for fiber stacks";
            return keep(msg);
        }
        R.stacks.push_back(s);
    }
    std::vector<unsigned char> tg(tgmem_bytes ? tgmem_bytes : 1);
    R.tgmem = tg.data();
    R.err.clear();
    const uint32_t nsg = (uint32_t)R.simd.size();
    for (uint32_t gz = 0; gz < grid.z; gz++)
        for (uint32_t gy = 0; gy < grid.y; gy++)
            for (uint32_t gx = 0; gx < grid.x; gx++) {
                memset(tg.data(), 0xFF, tg.size());
                R.bar_arrived = 0;
                for (auto &s : R.simd) s = simd_state{};
                for (uint32_t i = 0; i < n; i++) {
                    fiber &f = R.fibers[i];
                    f.stack = R.stacks[i];
                    f.st = RUNNABLE;
                    const uint32_t tx = i % tpg.x, ty = (i / tpg.x) % tpg.y, tz = i / (tpg.x * tpg.y);
                    f.id.threadgroup_position_in_grid = {gx, gy, gz};
                    f.id.thread_position_in_threadgroup = {tx, ty, tz};
                    f.id.threads_per_threadgroup = tpg;
                    f.id.thread_position_in_grid = {gx * tpg.x + tx, gy * tpg.y + ty, gz * tpg.z + tz};
                    f.id.thread_index_in_threadgroup = i;
                    f.id.thread_index_in_simdgroup = i % SIMD_WIDTH;
                    f.id.simdgroup_index_in_threadgroup = i / SIMD_WIDTH;
                    f.id.threads_per_simdgroup = SIMD_WIDTH;
                    f.id.simdgroups_per_threadgroup = nsg;
                    start_fiber(f);
                }
                R.st.threads += n;
                int done = 0;
                while (done < R.n) {
                    bool progress = false;
                    for (int ii = 0; ii < R.n; ii++) {
                        const int i = R.reverse ? R.n - 1 - ii : ii;
                        if (R.fibers[(size_t)i].st != RUNNABLE) continue;
                        progress = true;
                        resume(i);
                        if (R.fibers[(size_t)i].st == DONE) done++;
                        if (!R.err.empty()) break;
                    }
                    if (!R.err.empty()) break;
                    if (!progress) {
                        R.err = describe_wait();
                        break;
                    }
                }
                if (!R.err.empty()) {
                    char where[96];
                    snprintf(where, sizeof where, " (threadgroup %u,%u,%u)", gx, gy, gz);
                    msg = R.err + where;
                    return keep(msg);
                }
            }
    return nullptr;
}

} // namespace h3emu
