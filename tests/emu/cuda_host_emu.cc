/*
 * cuda_host_emu.cc — the fiber scheduler behind cuda_host_emu.h: kernel
 * launches and the device built-ins.
 *
 * A block: `threads` fibers (64 KiB stacks) run round-robin on the caller's
 * thread; each starts through makecontext/setcontext and switches with
 * _setjmp/_longjmp afterwards (no signal-mask system call per switch). A
 * fiber runs until it reaches a meeting point or returns; a meeting point
 * completes when every live fiber of its group (block, or warp for the
 * collectives) has reached it, and then all of them go on. A fiber that
 * returns leaves its groups (as an exited CUDA thread no longer holds up
 * __syncthreads). These abort the process with a message, as bugs of the
 * kernel, not results: a warp collective that finds a lane exited, a round
 * in which no fiber can move, a block that wrote past its dynamic shared
 * memory (a poisoned guard after it, checked at the block's end). Device
 * memory and its guard pages: cuda_host_rt.cc.
 */
#include "cuda_host_emu.h"

/* _longjmp between fiber stacks: glibc's fortified longjmp refuses a jump to
 * another stack, so this file is never built fortified. */
#undef _FORTIFY_SOURCE

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <vector>

namespace kvs_emu
{
namespace
{

constexpr size_t kStack = 64 * 1024;
constexpr unsigned kPoison = 0xA5; /* shared memory at a block's start */
constexpr size_t kSmemGuard = 256; /* poisoned bytes after it, checked at the block's end */

/* One meeting point in progress for a group of fibers. */
struct Meet {
    unsigned gen = 0;     /* completed meetings so far */
    unsigned arrived = 0; /* fibers waiting at the current one */
    unsigned live = 0;    /* fibers of the group that have not returned */
    uint64_t acc = 0;     /* OR (block) of the values given */
    uint64_t result = 0;  /* the last completed meeting's result */
    uint64_t vals[32];    /* warp: each lane's value */
};

struct Fiber {
    ucontext_t ctx; /* the start */
    jmp_buf jb;     /* where it waits */
    bool started, done;
};

struct Block {
    unsigned threads = 0, grid = 0;
    uint3 bidx{0, 0, 0};
    std::vector<Fiber> fibers;
    std::vector<unsigned char> stacks;
    std::vector<unsigned char> smem;
    Meet block;
    std::vector<Meet> warps;
    unsigned cur = 0;      /* running fiber */
    bool progress = false; /* something moved in this round */
    jmp_buf sched;
    entry_fn entry = nullptr;
    const void *kernel = nullptr;
    const void *args = nullptr;
};

Block *g_blk; /* the block being run (launches are not reentrant) */

[[noreturn]] void die(const char *what)
{
    fprintf(stderr, "cuda_host_emu: block (%u) thread %u: %s\n", g_blk ? g_blk->bidx.x : 0u,
            g_blk ? g_blk->cur : 0u, what);
    abort();
}

void yield()
{
    Block *b = g_blk;
    if (_setjmp(b->fibers[b->cur].jb) == 0)
        _longjmp(b->sched, 1);
}

/* Completes m's meeting if every live member has arrived. */
void try_release(Meet &m)
{
    if (m.arrived != 0 && m.arrived == m.live) {
        m.result = m.acc;
        m.arrived = 0;
        m.gen++;
        g_blk->progress = true;
    }
}

/* Arrive at m with v (OR-accumulated) and wait for the meeting to complete. */
uint64_t meet(Meet &m, uint64_t v)
{
    const unsigned gen = m.gen;
    m.acc = m.arrived == 0 ? v : (m.acc | v);
    m.arrived++;
    g_blk->progress = true;
    try_release(m);
    while (m.gen == gen)
        yield();
    return m.result;
}

Meet &my_warp()
{
    return g_blk->warps[g_blk->cur / 32];
}

void check_full_warp(const Meet &w, const char *what)
{
    if (w.live != 32) {
        static char msg[128];
        snprintf(msg, sizeof msg, "%s with %u of 32 lanes live (undefined in CUDA)", what, w.live);
        die(msg);
    }
}

void fiber_main()
{
    Block *b = g_blk;
    b->entry(b->args, b->kernel);
    /* Returned: leave the block and the warp, possibly completing their meetings. */
    b->fibers[b->cur].done = true;
    b->block.live--;
    try_release(b->block);
    Meet &w = my_warp();
    w.live--;
    try_release(w);
    b->progress = true;
    _longjmp(b->sched, 1); /* never resumed */
}

/* Runs fiber t until it waits or returns. Its own frame holds the _setjmp,
 * so no variable of the scheduler's loops lives across a _longjmp. */
__attribute__((noinline)) void resume(Block &b, unsigned t)
{
    Fiber &f = b.fibers[t];
    b.cur = t;
    if (_setjmp(b.sched) != 0)
        return;
    if (f.started)
        _longjmp(f.jb, 1);
    f.started = true;
    setcontext(&f.ctx);
    die("setcontext failed");
}

/* Fiber t's start, on its own stack (getcontext returns twice: kept out of
 * the scheduler's frame like _setjmp). */
__attribute__((noinline)) void prepare_fiber(Block &b, unsigned t)
{
    Fiber &f = b.fibers[t];
    f.started = f.done = false;
    if (getcontext(&f.ctx) != 0)
        die("getcontext failed");
    f.ctx.uc_stack.ss_sp = b.stacks.data() + (size_t)t * kStack;
    f.ctx.uc_stack.ss_size = kStack;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_main, 0);
}

enum Order { kForward, kReverse, kRandom };

/* KVS_EMU_ORDER: forward (default), reverse, or random (a new permutation of
 * the fibers every round, from KVS_EMU_SEED, default 1). Anything else is an
 * error: a typo must not quietly run the default. */
Order order_mode(uint64_t *seed)
{
    static int mode = -1;
    static uint64_t s0 = 1;
    if (mode < 0) {
        const char *e = getenv("KVS_EMU_ORDER"), *sd = getenv("KVS_EMU_SEED");
        if (e == nullptr || strcmp(e, "forward") == 0)
            mode = kForward;
        else if (strcmp(e, "reverse") == 0)
            mode = kReverse;
        else if (strcmp(e, "random") == 0)
            mode = kRandom;
        else
            die("KVS_EMU_ORDER: not forward, reverse or random");
        if (sd != nullptr)
            s0 = strtoull(sd, nullptr, 0) | 1u;
    }
    *seed = s0;
    return (Order)mode;
}

/* The order of one scheduling round over `threads` fibers. */
void round_order(std::vector<unsigned> &ord, unsigned threads, Order mode, uint64_t *rng)
{
    ord.resize(threads);
    for (unsigned i = 0; i < threads; i++)
        ord[i] = mode == kReverse ? threads - 1 - i : i;
    if (mode != kRandom)
        return;
    for (unsigned i = threads - 1; i > 0; i--) { /* Fisher-Yates, xorshift64 */
        *rng ^= *rng << 13, *rng ^= *rng >> 7, *rng ^= *rng << 17;
        const unsigned j = (unsigned)(*rng % (i + 1));
        const unsigned t = ord[i];
        ord[i] = ord[j];
        ord[j] = t;
    }
}

} // namespace

uint3 thread_idx()
{
    return make_uint3(g_blk->cur, 0, 0);
}

uint3 block_idx()
{
    return g_blk->bidx;
}

dim3 grid_dim()
{
    return dim3(g_blk->grid, 1, 1);
}

dim3 block_dim()
{
    return dim3(g_blk->threads, 1, 1);
}

unsigned char *dyn_smem()
{
    return g_blk->smem.data();
}

int block_sync_or(int v)
{
    return (int)meet(g_blk->block, (uint64_t)(v != 0));
}

uint64_t warp_xor(uint64_t v, int mask)
{
    Meet &w = my_warp();
    check_full_warp(w, "__shfl_xor_sync");
    const unsigned lane = g_blk->cur % 32;
    w.vals[lane] = v;
    meet(w, 0);
    const uint64_t r = w.vals[(lane ^ (unsigned)mask) & 31u];
    meet(w, 0); /* nobody overwrites vals before every lane has read */
    return r;
}

int warp_any(int v)
{
    Meet &w = my_warp();
    check_full_warp(w, "__any_sync");
    return meet(w, (uint64_t)(v != 0)) != 0;
}

int warp_all(int v)
{
    Meet &w = my_warp();
    check_full_warp(w, "__all_sync");
    return meet(w, (uint64_t)(v == 0)) == 0;
}

cudaError_t run(entry_fn entry, const void *kernel, const void *args, unsigned grid,
                unsigned threads, size_t smem)
{
    if (threads == 0 || threads > 1024 || threads % 32 != 0)
        return cudaErrorInvalidValue;
    Block b;
    b.threads = threads;
    b.grid = grid;
    b.entry = entry;
    b.kernel = kernel;
    b.args = args;
    b.fibers.resize(threads);
    b.stacks.resize(kStack * threads);
    b.smem.resize(smem + kSmemGuard);
    b.warps.resize(threads / 32);
    g_blk = &b;
    device_open();
    for (unsigned blk = 0; blk < grid; blk++) {
        b.bidx = make_uint3(blk, 0, 0);
        memset(b.smem.data(), (int)kPoison, b.smem.size());
        b.block = Meet();
        b.block.live = threads;
        for (Meet &w : b.warps) {
            w = Meet();
            w.live = 32;
        }
        for (unsigned t = 0; t < threads; t++)
            prepare_fiber(b, t);
        unsigned left = threads;
        uint64_t rng;
        const Order mode = order_mode(&rng);
        rng ^= 0x9E3779B97F4A7C15ull * (blk + 1);
        std::vector<unsigned> ord;
        while (left > 0) {
            b.progress = false;
            round_order(ord, threads, mode, &rng);
            for (unsigned i = 0; i < threads; i++) {
                const unsigned t = ord[i];
                if (b.fibers[t].done)
                    continue;
                resume(b, t);
                if (b.fibers[t].done)
                    left--;
            }
            if (!b.progress && left > 0)
                die("deadlock: every live thread waits at a barrier that cannot complete");
        }
        for (size_t i = smem; i < b.smem.size(); i++)
            if (b.smem[i] != kPoison)
                die("the block wrote past its dynamic shared memory");
    }
    device_close();
    g_blk = nullptr;
    return cudaSuccess;
}

} // namespace kvs_emu
