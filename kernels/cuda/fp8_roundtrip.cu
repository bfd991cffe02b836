/*
 * fp8_roundtrip.cu — CUDA FP8 conversion kernels behind the C API of
 * kvs_cuda.h: fp16 → FP8 codes (+ decoded fp16) and fp32 → FP8 codes, each in
 * two implementations selected by a template parameter:
 *   KVQ: kvq_math.h, the same source the host reference compiles, so device
 *        and host results are identical by construction (and checked);
 *   HW:  cuda_fp8.h's __nv_cvt_*x2 (one cvt.rn.satfinite instruction per pair
 *        from sm_89 on), the ground truth kvq_math.h must equal.
 *
 * Shape: one thread handles one 128-bit load (8 fp16 or 4 fp32) per grid-stride
 * step, writes the codes in one 64- or 32-bit store and the decoded fp16 in one
 * 128-bit store. Misaligned arrays (or the n % 8 tail) take a scalar path in the
 * same kernel. The format is a template parameter, so the per-element code has
 * no format branch.
 *
 * Invariants: inputs and outputs never alias (__restrict__); nothing here
 * changes device state other than the memory the caller hands in; kvq_math.h
 * uses __fmul_rn/__frcp_rn, and this file is built without fast-math, so no
 * device result depends on contraction or flush-to-zero. Error text and the
 * memory/device helpers of kvs_cuda.h live in kvs_cuda_util.cu.
 */
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>

#include "kvs_cuda.h"
#include "kvs_cuda_internal.h"
#include "kvs_error.h"

namespace {

enum Impl { KVQ, HW };

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = (size_t)1 << 20;

/* Two elements at a time: in the low/high 16 bits of a word → codes in the
 * low/high byte of the result (cuda_fp8.h's x2 convention). */
template <Impl I, int FMT> struct Conv;

template <int FMT> struct Conv<KVQ, FMT> {
    static constexpr kvq_fp8_format fmt = (kvq_fp8_format)FMT;
    __device__ static uint32_t enc_h2(uint32_t h2)
    {
        return (uint32_t)kvq_fp16_to_fp8((uint16_t)(h2 & 0xFFFFu), fmt) |
               ((uint32_t)kvq_fp16_to_fp8((uint16_t)(h2 >> 16), fmt) << 8);
    }
    __device__ static uint32_t enc_f2(float a, float b)
    {
        return (uint32_t)kvq_f32_to_fp8(a, fmt) | ((uint32_t)kvq_f32_to_fp8(b, fmt) << 8);
    }
    __device__ static uint32_t dec_c2(uint32_t c2)
    {
        return (uint32_t)kvq_fp8_to_fp16((uint8_t)(c2 & 0xFFu), fmt) |
               ((uint32_t)kvq_fp8_to_fp16((uint8_t)(c2 >> 8), fmt) << 16);
    }
};

template <int FMT> struct Conv<HW, FMT> {
    static constexpr __nv_fp8_interpretation_t interp =
        FMT == KVQ_FP8_E5M2 ? __NV_E5M2 : __NV_E4M3;
    __device__ static uint32_t enc_h2(uint32_t h2)
    {
        __half2_raw r;
        r.x = (unsigned short)(h2 & 0xFFFFu);
        r.y = (unsigned short)(h2 >> 16);
        return (uint32_t)__nv_cvt_halfraw2_to_fp8x2(r, __NV_SATFINITE, interp);
    }
    __device__ static uint32_t enc_f2(float a, float b)
    {
        return (uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, interp);
    }
    __device__ static uint32_t dec_c2(uint32_t c2)
    {
        __half2_raw d = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)c2, interp);
        return (uint32_t)d.x | ((uint32_t)d.y << 16);
    }
};

/* nvec 8-element vectors from the start (0 when misaligned), then n - 8*nvec
 * scalars. out may be NULL (encode only). */
template <Impl I, int FMT>
__global__ void __launch_bounds__(kThreads)
    roundtrip_fp16_kernel(const uint16_t *__restrict__ in, uint8_t *__restrict__ codes,
                          uint16_t *__restrict__ out, size_t n, size_t nvec)
{
    typedef Conv<I, FMT> C;
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    const uint4 *in4 = reinterpret_cast<const uint4 *>(in);
    uint2 *codes8 = reinterpret_cast<uint2 *>(codes);
    uint4 *out4 = reinterpret_cast<uint4 *>(out);
    for (size_t i = tid; i < nvec; i += stride) {
        uint4 v = in4[i];
        uint32_t c0 = C::enc_h2(v.x) | (C::enc_h2(v.y) << 16);
        uint32_t c1 = C::enc_h2(v.z) | (C::enc_h2(v.w) << 16);
        codes8[i] = make_uint2(c0, c1);
        if (out != NULL)
            out4[i] = make_uint4(C::dec_c2(c0 & 0xFFFFu), C::dec_c2(c0 >> 16),
                                 C::dec_c2(c1 & 0xFFFFu), C::dec_c2(c1 >> 16));
    }
    for (size_t j = nvec * 8 + tid; j < n; j += stride) {
        uint32_t c = C::enc_h2(in[j]) & 0xFFu;
        codes[j] = (uint8_t)c;
        if (out != NULL)
            out[j] = (uint16_t)(C::dec_c2(c) & 0xFFFFu);
    }
}

template <Impl I, int FMT>
__global__ void __launch_bounds__(kThreads)
    f32_to_fp8_kernel(const float *__restrict__ in, uint8_t *__restrict__ codes, size_t n,
                      size_t nvec)
{
    typedef Conv<I, FMT> C;
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    const float4 *in4 = reinterpret_cast<const float4 *>(in);
    uint32_t *codes4 = reinterpret_cast<uint32_t *>(codes);
    for (size_t i = tid; i < nvec; i += stride) {
        float4 v = in4[i];
        codes4[i] = C::enc_f2(v.x, v.y) | (C::enc_f2(v.z, v.w) << 16);
    }
    for (size_t j = nvec * 4 + tid; j < n; j += stride)
        codes[j] = (uint8_t)(C::enc_f2(in[j], 0.0f) & 0xFFu);
}

__global__ void arch_kernel(int *out)
{
#if defined(__CUDA_ARCH__)
    *out = __CUDA_ARCH__;
#endif
}

bool aligned(const void *p, uintptr_t a) { return ((uintptr_t)p % a) == 0; }

unsigned blocks_for(size_t work)
{
    size_t b = (work + kThreads - 1) / kThreads;
    if (b == 0)
        b = 1;
    return (unsigned)(b < kMaxBlocks ? b : kMaxBlocks);
}

bool valid_fmt(kvq_fp8_format fmt) { return fmt == KVQ_FP8_E4M3 || fmt == KVQ_FP8_E5M2; }

template <Impl I>
int roundtrip_fp16(const uint16_t *in, uint8_t *codes, uint16_t *out, size_t n,
                   kvq_fp8_format fmt)
{
    kvs__cuda_clear_error();
    if (!valid_fmt(fmt) || (n > 0 && (in == NULL || codes == NULL)))
        return KVS_EINVAL;
    if (n == 0)
        return KVS_OK;
    bool vec = aligned(in, 16) && aligned(codes, 8) && (out == NULL || aligned(out, 16));
    size_t nvec = vec ? n / 8 : 0;
    unsigned blocks = blocks_for(nvec > 0 ? nvec : n);
    if (fmt == KVQ_FP8_E5M2)
        roundtrip_fp16_kernel<I, KVQ_FP8_E5M2><<<blocks, kThreads>>>(in, codes, out, n, nvec);
    else
        roundtrip_fp16_kernel<I, KVQ_FP8_E4M3><<<blocks, kThreads>>>(in, codes, out, n, nvec);
    KVS_CK(cudaGetLastError());
    return KVS_OK;
}

template <Impl I>
int f32_to_fp8(const float *in, uint8_t *codes, size_t n, kvq_fp8_format fmt)
{
    kvs__cuda_clear_error();
    if (!valid_fmt(fmt) || (n > 0 && (in == NULL || codes == NULL)))
        return KVS_EINVAL;
    if (n == 0)
        return KVS_OK;
    size_t nvec = (aligned(in, 16) && aligned(codes, 4)) ? n / 4 : 0;
    unsigned blocks = blocks_for(nvec > 0 ? nvec : n);
    if (fmt == KVQ_FP8_E5M2)
        f32_to_fp8_kernel<I, KVQ_FP8_E5M2><<<blocks, kThreads>>>(in, codes, n, nvec);
    else
        f32_to_fp8_kernel<I, KVQ_FP8_E4M3><<<blocks, kThreads>>>(in, codes, n, nvec);
    KVS_CK(cudaGetLastError());
    return KVS_OK;
}

} // namespace

extern "C" {

int kvs_cuda_kernel_arch(int *arch)
{
    kvs__cuda_clear_error();
    if (arch == NULL)
        return KVS_EINVAL;
    int *d = NULL;
    int h = -1;
    KVS_CK(cudaMalloc((void **)&d, sizeof *d));
    cudaError_t e = cudaMemset(d, 0xFF, sizeof *d);
    if (e == cudaSuccess) {
        arch_kernel<<<1, 1>>>(d);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess)
        e = cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost);
    (void)cudaFree(d);
    if (e != cudaSuccess)
        return kvs__cuda_fail(e, "arch_kernel");
    *arch = h;
    return KVS_OK;
}

int kvs_cuda_fp8_roundtrip_fp16(const uint16_t *in, uint8_t *codes, uint16_t *out, size_t n,
                                kvq_fp8_format fmt)
{
    return roundtrip_fp16<KVQ>(in, codes, out, n, fmt);
}

int kvs_cuda_fp8_roundtrip_fp16_hw(const uint16_t *in, uint8_t *codes, uint16_t *out,
                                   size_t n, kvq_fp8_format fmt)
{
    return roundtrip_fp16<HW>(in, codes, out, n, fmt);
}

int kvs_cuda_f32_to_fp8(const float *in, uint8_t *codes, size_t n, kvq_fp8_format fmt)
{
    return f32_to_fp8<KVQ>(in, codes, n, fmt);
}

int kvs_cuda_f32_to_fp8_hw(const float *in, uint8_t *codes, size_t n, kvq_fp8_format fmt)
{
    return f32_to_fp8<HW>(in, codes, n, fmt);
}

} // extern "C"
