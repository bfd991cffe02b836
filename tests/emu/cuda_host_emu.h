/*
 * cuda_host_emu.h — runs the CUDA tile kernels (the .cu files of kernels/cuda)
 * on the CPU, so that their logic is checked against the C reference on
 * machines without a GPU (CI). Force-included (-include) ahead of a kernels/cuda .cu file
 * compiled as host C++ (tests/emu/CMakeLists.txt); the .cu file is unchanged.
 *
 * The idea: a kernel launch runs its blocks one after another; each block's
 * threads are fibers on the calling thread, switched only at the
 * points where CUDA threads meet: __syncthreads / __syncthreads_or (the
 * block's live threads), and the warp collectives __shfl_xor_sync,
 * __any_sync, __all_sync (the warp's 32 lanes; a collective with a lane that
 * has exited is reported as an error, as CUDA leaves it undefined).
 * threadIdx and blockIdx name the running fiber's; dyn_smem() (tile_dev.cuh)
 * is the block's dynamic shared memory, filled with a poison byte at each
 * block's start so that a read of shared memory nobody wrote shows as wrong
 * output. cuda_host_rt.cc implements the runtime calls kvstash uses: device
 * memory that host code cannot touch outside copies and kernel launches,
 * streams as threads; a launch runs to completion before it returns.
 *
 * What it checks: the kernels' arithmetic, indexing, top-k merges, layout
 * writes and every-byte coverage, as on a GPU compiled with no __CUDA_ARCH__
 * (the portable branches: warp max by shuffles, no cp.async; FP8 conversions
 * through cuda_fp8.h's host code, which test_fp8_cuda holds against the
 * hardware). What it cannot: the memory model (a missing barrier between a
 * write and another thread's read is hidden when the fibers happen to run in
 * the right order: KVS_EMU_ORDER=reverse runs each block's fibers last to
 * first, KVS_EMU_ORDER=random in a new order every round (KVS_EMU_SEED), to
 * shake such orders out), timing, occupancy, the sm_89+ hardware
 * cvt paths. Deadlocks (a barrier some live thread never reaches) and
 * collectives in diverged warps abort with a message.
 */
#ifndef KVS_CUDA_HOST_EMU_H
#define KVS_CUDA_HOST_EMU_H

#ifndef __cplusplus
#error "cuda_host_emu.h: compile the .cu files as C++"
#endif

#define KVS_CUDA_HOST_EMU 1

/* Execution-space keywords: plain host code. */
#define __device__
#define __global__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <stddef.h>
#include <stdint.h>

namespace kvs_emu
{

/* The running fiber's coordinates. */
uint3 thread_idx();
uint3 block_idx();
dim3 grid_dim();
dim3 block_dim();
/* The running block's dynamic shared memory. */
unsigned char *dyn_smem();
/* Block barrier; returns the OR of every live thread's value. */
int block_sync_or(int v);
/* Warp exchange: every lane gives v, gets lane (own ^ mask)'s. */
uint64_t warp_xor(uint64_t v, int mask);
/* Warp vote: 1 if any (all) of the 32 lanes gave nonzero. */
int warp_any(int v);
int warp_all(int v);

/* cuda_host_rt.cc: device memory opened to host code for a kernel launch
 * (and closed again), and a created stream's queue waited for. */
void device_open();
void device_close();
void stream_wait(cudaStream_t s);

typedef void (*entry_fn)(const void *args, const void *kernel);
/* Runs grid blocks of `threads` fibers, each calling entry(args, kernel). */
cudaError_t run(entry_fn entry, const void *kernel, const void *args, unsigned grid,
                unsigned threads, size_t smem);

template <typename A> void call(const void *args, const void *kernel)
{
    reinterpret_cast<void (*)(const A)>(const_cast<void *>(kernel))(*static_cast<const A *>(args));
}

} // namespace kvs_emu

#define threadIdx (kvs_emu::thread_idx())
#define blockIdx  (kvs_emu::block_idx())
#define gridDim   (kvs_emu::grid_dim())
#define blockDim  (kvs_emu::block_dim())

/* cuda_runtime.h's C++ overload for kernel pointers exists for nvcc only. */
template <typename T> inline cudaError_t cudaFuncSetAttribute(T *f, cudaFuncAttribute a, int v)
{
    return cudaFuncSetAttribute(reinterpret_cast<const void *>(f), a, v);
}

/* tile_dev.cuh's launch() and dyn_smem() under KVS_CUDA_HOST_EMU. */
template <typename A>
inline cudaError_t kvs_emu_launch(void (*kernel)(const A), unsigned grid, unsigned threads,
                                  size_t smem, cudaStream_t s, const A &a)
{
    kvs_emu::stream_wait(s); /* the stream's earlier work first; the launch runs at once */
    return kvs_emu::run(kvs_emu::call<A>, reinterpret_cast<const void *>(kernel), &a, grid, threads,
                        smem);
}
inline unsigned char *kvs_emu_dyn_smem()
{
    return kvs_emu::dyn_smem();
}

/* The device built-ins the kernels use. */
inline void __syncthreads()
{
    (void)kvs_emu::block_sync_or(0);
}
inline int __syncthreads_or(int v)
{
    return kvs_emu::block_sync_or(v != 0);
}
/* Any value of up to 8 bytes (the kernels shuffle 32-bit words, floats and
 * u64 keys), exchanged bit for bit. */
template <typename T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32)
{
    static_assert(sizeof(T) <= 8, "__shfl_xor_sync: values of up to 8 bytes");
    (void)mask, (void)width;
    uint64_t b = 0;
    __builtin_memcpy(&b, &v, sizeof v);
    b = kvs_emu::warp_xor(b, lane_mask);
    __builtin_memcpy(&v, &b, sizeof v);
    return v;
}
inline int __any_sync(unsigned mask, int v)
{
    (void)mask;
    return kvs_emu::warp_any(v);
}
inline int __all_sync(unsigned mask, int v)
{
    (void)mask;
    return kvs_emu::warp_all(v);
}
/* Fibers switch only at the meeting points: a read-modify-write is atomic. */
inline unsigned atomicOr(unsigned *p, unsigned v)
{
    const unsigned old = *p;
    *p = old | v;
    return old;
}
inline int __ffs(int x)
{
    return __builtin_ffs(x);
}

/* CUDA's integer min/max overloads (device code calls them unqualified). */
inline int max(int a, int b)
{
    return a > b ? a : b;
}
inline int min(int a, int b)
{
    return a < b ? a : b;
}
inline unsigned max(unsigned a, unsigned b)
{
    return a > b ? a : b;
}
inline unsigned min(unsigned a, unsigned b)
{
    return a < b ? a : b;
}
inline unsigned long long max(unsigned long long a, unsigned long long b)
{
    return a > b ? a : b;
}
inline unsigned long long min(unsigned long long a, unsigned long long b)
{
    return a < b ? a : b;
}

#endif /* KVS_CUDA_HOST_EMU_H */
