/*
 * cuda_host_rt.cc — the CUDA runtime calls kvstash uses (kernels/cuda,
 * transfer/ucx_staging.c, the GPU tests), for one emulated device on the
 * host. Pairs with cuda_host_emu.cc (the kernels' fibers).
 *
 * Device memory is not host memory here either: each cudaMalloc is a memfd
 * mapped twice, a device view (the pointer callers get; PROT_NONE, followed
 * by an inaccessible guard page) and a private alias the emulator reads and
 * writes through. Host code that dereferences a device pointer faults, as it
 * would on a GPU (a library handing a cudaMalloc pointer to memcpy or to UCX,
 * say); copies (cudaMemcpy, cudaMemcpyAsync, cudaMemset) go through the
 * alias; a kernel launch opens every device view for its duration (launches
 * run one at a time, on the calling thread), so kernels touch device memory
 * directly, and past a buffer's end they hit the guard page.
 *
 * Streams: each created stream is a thread running its queued operations in
 * order (copies, host functions), so cudaLaunchHostFunc's function runs on
 * another thread after the copies before it, as with CUDA. The legacy default
 * stream (NULL) runs everything at once on the caller's thread; a kernel
 * launched on a created stream first waits for that stream's queue.
 * cudaPointerGetAttributes knows device allocations, cudaHostAlloc's
 * buffers, and says unregistered for any other pointer. The last error is
 * per thread, as CUDA's is.
 */
#include "cuda_host_emu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>

namespace
{

thread_local cudaError_t g_last = cudaSuccess;

cudaError_t note(cudaError_t e)
{
    if (e != cudaSuccess)
        g_last = e;
    return e;
}

/* One device allocation: view [dev, dev + body) (the user's pointer lies at
 * its end) and a guard page after it, [dev, dev + map) in all; alias
 * [alias, alias + body). */
struct Alloc {
    unsigned char *dev, *alias, *user;
    size_t body, map, len;
};

std::mutex g_mu;                  /* the tables below */
std::map<uintptr_t, Alloc> g_dev; /* view start -> allocation */
std::set<void *> g_host;          /* cudaHostAlloc's buffers */
std::recursive_mutex g_launch;    /* one kernel launch at a time */

/* The allocation holding [p, p + n), or nullptr; *alias its alias address. */
const Alloc *find_dev(const void *p, size_t n, unsigned char **alias)
{
    const uintptr_t a = (uintptr_t)p;
    auto it = g_dev.upper_bound(a);
    if (it == g_dev.begin())
        return nullptr;
    --it;
    const Alloc &al = it->second;
    if (a >= (uintptr_t)al.dev + al.map)
        return nullptr;
    if (a >= (uintptr_t)al.dev + al.body || n > (uintptr_t)al.dev + al.body - a)
        n = SIZE_MAX; /* reaches the guard page: the caller reports it */
    if (alias != nullptr)
        *alias = n == SIZE_MAX ? nullptr : al.alias + (a - (uintptr_t)al.dev);
    return &al;
}

/* Where the emulator may touch [p, p + n): the alias of device memory, or p
 * itself for host memory; nullptr when a device range crosses its end. */
unsigned char *host_view(const void *p, size_t n)
{
    std::lock_guard<std::mutex> lk(g_mu);
    unsigned char *alias = nullptr;
    if (find_dev(p, n, &alias) != nullptr)
        return alias;
    return (unsigned char *)p;
}

struct Stream {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> q;
    unsigned running = 0;
    bool stop = false;
    std::thread th;

    void loop()
    {
        std::unique_lock<std::mutex> lk(mu);
        for (;;) {
            cv.wait(lk, [this] { return stop || !q.empty(); });
            if (q.empty())
                return; /* stop, and nothing left */
            std::function<void()> op = std::move(q.front());
            q.pop_front();
            running = 1;
            lk.unlock();
            op();
            lk.lock();
            running = 0;
            cv.notify_all();
        }
    }
    void push(std::function<void()> op)
    {
        std::lock_guard<std::mutex> lk(mu);
        q.push_back(std::move(op));
        cv.notify_all();
    }
    void drain()
    {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [this] { return q.empty() && running == 0; });
    }
};

Stream *stream_of(cudaStream_t s)
{
    return reinterpret_cast<Stream *>(s);
}

cudaError_t copy(void *dst, const void *src, size_t n)
{
    if (n == 0)
        return cudaSuccess;
    unsigned char *d = host_view(dst, n);
    const unsigned char *s = host_view(src, n);
    if (d == nullptr || s == nullptr)
        return cudaErrorInvalidValue;
    memmove(d, s, n);
    return cudaSuccess;
}

} // namespace

namespace kvs_emu
{

void device_open()
{
    g_launch.lock();
    std::lock_guard<std::mutex> lk(g_mu);
    for (auto &e : g_dev)
        if (mprotect(e.second.dev, e.second.body, PROT_READ | PROT_WRITE) != 0)
            abort();
}

void device_close()
{
    {
        std::lock_guard<std::mutex> lk(g_mu);
        for (auto &e : g_dev)
            if (mprotect(e.second.dev, e.second.map, PROT_NONE) != 0)
                abort();
    }
    g_launch.unlock();
}

void stream_wait(cudaStream_t s)
{
    if (s != nullptr)
        stream_of(s)->drain();
}

} // namespace kvs_emu

extern "C" {

cudaError_t cudaGetDeviceCount(int *n)
{
    *n = 1;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *d)
{
    *d = 0;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device)
{
    if (device != 0)
        return note(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "host emulation (tests/emu)");
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 8;
    p->sharedMemPerBlockOptin = 227 * 1024;
    p->maxThreadsPerBlock = 1024;
    p->warpSize = 32;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int device)
{
    if (device != 0)
        return note(cudaErrorInvalidDevice);
    switch (a) {
    case cudaDevAttrMultiProcessorCount:
        *v = 8; /* small: the launchers' size heuristics take their small-device branches too */
        return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
        *v = 227 * 1024; /* an H100/H200's */
        return cudaSuccess;
    default:
        return note(cudaErrorInvalidValue);
    }
}

cudaError_t cudaFuncSetAttribute(const void *f, cudaFuncAttribute a, int v)
{
    (void)f, (void)a, (void)v;
    return cudaSuccess;
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *n, const void *f,
                                                                   int threads, size_t smem,
                                                                   unsigned flags)
{
    (void)f, (void)flags;
    if (threads <= 0 || threads > 1024)
        return note(cudaErrorInvalidValue);
    /* 2,048 threads and 227 KiB of shared memory per multiprocessor */
    int by_threads = 2048 / threads, by_smem = smem ? (int)((227u * 1024u) / smem) : by_threads;
    *n = by_threads < by_smem ? by_threads : by_smem;
    return cudaSuccess;
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, const void *f, int threads,
                                                          size_t smem)
{
    return cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(n, f, threads, smem, 0);
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = g_last;
    g_last = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void)
{
    return g_last;
}

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess:
        return "cudaSuccess";
    case cudaErrorInvalidValue:
        return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
        return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice:
        return "cudaErrorInvalidDevice";
    default:
        return "cudaError (emulated)";
    }
}

const char *cudaGetErrorString(cudaError_t e)
{
    return cudaGetErrorName(e);
}

/* A memfd of the allocation's pages, mapped as the device view (PROT_NONE,
 * one more PROT_NONE page after it; the user's pointer ends at that page,
 * rounded up to cudaMalloc's 256-byte alignment) and as the alias. */
cudaError_t cudaMalloc(void **p, size_t n)
{
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE), len = (n + 255) & ~(size_t)255;
    const size_t body = (len + pg - 1) / pg * pg, map = body + pg;
    int fd = memfd_create("kvs-emu-device", MFD_CLOEXEC);
    if (fd < 0)
        return note(cudaErrorMemoryAllocation);
    void *view = MAP_FAILED, *alias = MAP_FAILED;
    if (ftruncate(fd, (off_t)body) == 0) {
        view = mmap(nullptr, map, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (view != MAP_FAILED &&
            mmap(view, body, PROT_NONE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
            munmap(view, map);
            view = MAP_FAILED;
        }
        alias = mmap(nullptr, body, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    close(fd);
    if (view == MAP_FAILED || alias == MAP_FAILED) {
        if (view != MAP_FAILED)
            munmap(view, map);
        if (alias != MAP_FAILED)
            munmap(alias, body);
        return note(cudaErrorMemoryAllocation);
    }
    Alloc a;
    a.dev = (unsigned char *)view;
    a.alias = (unsigned char *)alias;
    a.body = body;
    a.map = map;
    a.len = len;
    a.user = a.dev + body - len;
    {
        std::lock_guard<std::recursive_mutex> launch(g_launch); /* not during a kernel */
        std::lock_guard<std::mutex> lk(g_mu);
        g_dev[(uintptr_t)a.dev] = a;
    }
    *p = a.user;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    if (p == nullptr)
        return cudaSuccess;
    std::lock_guard<std::recursive_mutex> launch(g_launch);
    std::lock_guard<std::mutex> lk(g_mu);
    const Alloc *a = find_dev(p, 1, nullptr);
    if (a == nullptr || a->user != p)
        return note(cudaErrorInvalidValue);
    const Alloc al = *a;
    g_dev.erase((uintptr_t)al.dev);
    munmap(al.dev, al.map);
    munmap(al.alias, al.body);
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags)
{
    (void)flags;
    *p = aligned_alloc(4096, (n + 4095) & ~(size_t)4095);
    if (*p == nullptr)
        return note(cudaErrorMemoryAllocation);
    std::lock_guard<std::mutex> lk(g_mu);
    g_host.insert(*p);
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p)
{
    {
        std::lock_guard<std::mutex> lk(g_mu);
        if (p != nullptr && g_host.erase(p) == 0)
            return note(cudaErrorInvalidValue);
    }
    free(p);
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *a, const void *p)
{
    memset(a, 0, sizeof *a);
    std::lock_guard<std::mutex> lk(g_mu);
    if (find_dev(p, 1, nullptr) != nullptr) {
        a->type = cudaMemoryTypeDevice;
        a->device = 0;
        a->devicePointer = const_cast<void *>(p);
    } else if (g_host.count(const_cast<void *>(p)) != 0) {
        a->type = cudaMemoryTypeHost;
        a->hostPointer = const_cast<void *>(p);
    } else {
        a->type = cudaMemoryTypeUnregistered;
    }
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind k)
{
    (void)k;
    return note(copy(dst, src, n));
}

cudaError_t cudaMemset(void *p, int v, size_t n)
{
    unsigned char *d = host_view(p, n);
    if (d == nullptr)
        return note(cudaErrorInvalidValue);
    memset(d, v, n);
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    (void)flags;
    Stream *st = new Stream;
    st->th = std::thread(&Stream::loop, st);
    *s = reinterpret_cast<cudaStream_t>(st);
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s)
{
    return cudaStreamCreateWithFlags(s, 0);
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    if (s == nullptr)
        return note(cudaErrorInvalidValue);
    Stream *st = stream_of(s);
    {
        std::lock_guard<std::mutex> lk(st->mu);
        st->stop = true;
        st->cv.notify_all();
    }
    st->th.join();
    delete st;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    kvs_emu::stream_wait(s);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    return cudaGetLastError();
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k, cudaStream_t s)
{
    (void)k;
    if (s == nullptr)
        return note(copy(dst, src, n));
    if (host_view(dst, n) == nullptr || host_view(src, n) == nullptr)
        return note(cudaErrorInvalidValue); /* a bad range fails now, as CUDA checks it */
    stream_of(s)->push([dst, src, n] { (void)copy(dst, src, n); });
    return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *arg)
{
    if (s == nullptr) {
        fn(arg);
        return cudaSuccess;
    }
    stream_of(s)->push([fn, arg] { fn(arg); });
    return cudaSuccess;
}

} // extern "C"
