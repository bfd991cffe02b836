/*
 * tile_dev.cuh — device building blocks of the tile kernels (tile_quant_k.cu,
 * tile_quant_v.cu, tile_dequant.cu) and the internal launch interface that
 * tile_api.cu drives. Not installed, not seen by C callers.
 *
 * The idea: the kernels do exactly what kernels/ref/kvq_ref.c does, element
 * for element, but read every source byte once, in 16-byte chunks (8 fp16/bf16
 * or 4 fp32 elements, "VEC"), and spend as few instructions per element as the
 * bytes allow. Where a hardware instruction gives the same bits as kvq_math.h
 * it is used; everywhere else kvq_math.h itself runs on the device:
 *   - FP8 encode: cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32 (__nv_cvt_float2_to_fp8x2)
 *     from sm_89, bit-identical to kvq_f32_to_fp8 on every fp32 input
 *     (tests/conformance/test_fp8_cuda.c, docs/BENCHMARKS.md); kvq_math.h
 *     below sm_89. FP8 decode: cvt.rn.f16x2.{e4m3x2,e5m2x2}, exact on every
 *     non-NaN code (same test); NaN codes become the canonical NaN below.
 *   - Scales, reciprocals, products: kvq_scale_from_amax / kvq_scale_inv /
 *     kvq__mul (__fdiv_rn, __frcp_rn, __fmul_rn): one IEEE operation each;
 *     the scale is stored as fp16 rounded up (kvq_scale_fp16, integer
 *     arithmetic) and the reciprocal is taken of its exact fp32 value
 *     (kvq_fp16_to_f32), as in the reference; outlier entries (3 or 4 bytes,
 *     unaligned) are written and read byte by byte (kvs_outlier_put/_get);
 *     ±Inf is never scaled (kvq_ref.c's encode(): it saturates even in a
 *     group whose scale is 0).
 *   - INT8: kvq_int8_quantize itself.
 *   - fp16/bf16 -> fp32 for the arithmetic: cvt.f32.f16 / a shift; exact for
 *     every non-NaN value. A NaN's payload never matters there (a NaN ranks
 *     last, never enters amax and encodes to 0x7F / 0), so only the bits that
 *     are stored again (outlier values, sinks, the fp16 scheme) go through
 *     the exact, payload-keeping kvq_math.h path (exact_fp16 below).
 *   - fp32 -> fp16 narrowing: cvt.rn.f16.f32 (IEEE round to nearest even,
 *     overflow to Inf: kvq_f32_to_fp16 on every non-NaN value); NaN goes
 *     through kvq_f32_to_fp16. fp32 -> bf16: kvq_f32_to_bf16 (a few integer
 *     operations). Never CUDA's NaN handling.
 *   - Dequantize: decode(code) * scale is NaN only for a NaN code (the
 *     quantizer never writes an E5M2 Inf code, and scales are finite): the
 *     host gets the canonical 0x7FFFFFFF there, and so does the device (canon).
 *
 * Invariants: no fast-math, no FMA contraction (-fmad=false), no FTZ: every
 * float operation here is spelled as a kvq_math.h function or an exact
 * conversion. Every tile byte, padding and header included, is written by
 * exactly one thread (checksum 0; the host seals).
 *
 * Host emulation: tests/emu compiles these files unchanged as host C++ with
 * tests/emu/cuda_host_emu.h force-included (KVS_CUDA_HOST_EMU, kvs_emu_launch,
 * kvs_emu_dyn_smem and the CUDA built-ins, each block's threads as fibers),
 * and runs the conformance test against the reference in CI without a GPU
 * (test_kvq_cuda_emu). Built-ins used here must have an emulation there.
 */
#ifndef KVS_TILE_DEV_CUH
#define KVS_TILE_DEV_CUH

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kv_format.h"
#include "kvq_math.h"
#include "kvs_cuda.h" /* also kvq.h, with C linkage */

namespace kvs_tile
{

constexpr int kThreads = 256; /* every tile kernel runs 256-thread blocks */
constexpr int kWarps = kThreads / 32;

/* Launch-uniform facts of one tile shape (all tiles of a launch share them). */
struct Geo {
    int scheme, kind, T, D, k, S;
    int koff;          /* K tiles of an 8-bit scheme with key offsets (kv_format.h rule 5) */
    kvs_tile_layout l; /* offsets from the payload start */
    float qmax;
    uint16_t tensor16; /* 0, or the fp16 per-tensor scale (kvs_tile_tensor_scale_fp16) */
};

/* What the launchers need to know about the device. */
struct DevInfo {
    int sms;        /* multiprocessors */
    int smem_optin; /* largest dynamic shared memory a block may opt into */
};

/* ---- launching (real or emulated) ------------------------------------------ */

#if defined(KVS_CUDA_HOST_EMU)
template <typename A>
inline cudaError_t launch(void (*kernel)(const A), unsigned grid, size_t smem, cudaStream_t s,
                          const A &a)
{
    return kvs_emu_launch(kernel, grid, (unsigned)kThreads, smem, s, a);
}
__device__ inline unsigned char *dyn_smem()
{
    return kvs_emu_dyn_smem();
}
#else
template <typename A>
inline cudaError_t launch(void (*kernel)(const A), unsigned grid, size_t smem, cudaStream_t s,
                          const A &a)
{
    kernel<<<grid, kThreads, smem, s>>>(a);
    return cudaGetLastError();
}
__device__ __forceinline__ unsigned char *dyn_smem()
{
    extern __shared__ uint4 kvs_tile_smem[];
    return reinterpret_cast<unsigned char *>(kvs_tile_smem);
}
#endif

/* 16 bytes global -> shared without a register round trip (cp.async, sm_80+). */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
#else
    *reinterpret_cast<uint4 *>(smem) = *reinterpret_cast<const uint4 *>(gmem);
#endif
}

__device__ __forceinline__ void cp_async_wait_all()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

/* ---- source elements ------------------------------------------------------- */

template <int DT> struct Src {
    static constexpr int esize = DT == KVS_DTYPE_FP32 ? 4 : 2;
    static constexpr int vec = 16 / esize; /* elements per 16-byte chunk */
};

__device__ __forceinline__ uint32_t word_of(const uint4 &c, int i)
{
    return i == 0 ? c.x : i == 1 ? c.y : i == 2 ? c.z : c.w;
}

__device__ __forceinline__ void set_word(uint4 &c, int i, uint32_t v)
{
    if (i == 0)
        c.x = v;
    else if (i == 1)
        c.y = v;
    else if (i == 2)
        c.z = v;
    else
        c.w = v;
}

/* i / n and i % n for the small divisors of the strip loops (n = 1..4). */
__device__ __forceinline__ int div_small(int i, int n)
{
    return n == 4 ? i >> 2 : n == 2 ? i >> 1 : n == 1 ? i : i / n;
}

/* Raw bits of element e of a chunk (zero-extended). */
template <int DT> __device__ __forceinline__ uint32_t raw_elem(const uint4 &c, int e)
{
    if (Src<DT>::esize == 4)
        return word_of(c, e);
    return (word_of(c, e >> 1) >> ((e & 1) * 16)) & 0xFFFFu;
}

template <int DT> __device__ __forceinline__ void set_raw_elem(uint4 &c, int e, uint32_t r)
{
    if (Src<DT>::esize == 4) {
        set_word(c, e, r);
    } else {
        int sh = (e & 1) * 16;
        uint32_t w = word_of(c, e >> 1);
        set_word(c, e >> 1, (w & ~(0xFFFFu << sh)) | ((r & 0xFFFFu) << sh));
    }
}

/* fp16 bits -> fp32, exact for every non-NaN value (cvt.f32.f16). */
__device__ __forceinline__ float hw_fp16_to_f32(uint32_t h)
{
    __half_raw r;
    r.x = (unsigned short)h;
    return __half2float(__half(r));
}

/* Value of a source element for the arithmetic: exact except for NaN payloads
 * (which the arithmetic never looks at). */
template <int DT> __device__ __forceinline__ float widen(uint32_t r)
{
    if (DT == KVS_DTYPE_FP32)
        return kvq_f32_from_bits(r);
    if (DT == KVS_DTYPE_BF16)
        return kvq_f32_from_bits(r << 16);
    return hw_fp16_to_f32(r);
}

/* == kvq_fp16_to_f32(h) on every pattern (NaN payload kept, made quiet). */
__device__ __forceinline__ float exact_fp16_to_f32(uint32_t h)
{
    if ((h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0)
        return kvq_fp16_to_f32((uint16_t)h);
    return hw_fp16_to_f32(h);
}

/* == kvq_f32_to_fp16(x) on every input: cvt.rn.f16.f32 for numbers (IEEE round
 * to nearest even, overflow to Inf), kvq_math.h's payload rule for NaN. */
__device__ __forceinline__ uint16_t narrow16(float x)
{
    if ((kvq_f32_bits(x) & 0x7FFFFFFFu) > 0x7F800000u)
        return kvq_f32_to_fp16(x);
    __half_raw r = __float2half_rn(x);
    return r.x;
}

/* == kvq_f32_to_fp16(kvq_fp16_to_f32(h)): fp16 -> fp32 -> fp16 only quiets NaNs. */
__device__ __forceinline__ uint16_t quiet16(uint32_t h)
{
    if ((h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0)
        h |= 0x0200u;
    return (uint16_t)h;
}

/* What the reference stores for a source element at fp16 (outliers, sinks,
 * the fp16 scheme): kvq_f32_to_fp16(load(element)). */
template <int DT> __device__ __forceinline__ uint16_t exact_fp16(uint32_t r)
{
    if (DT == KVS_DTYPE_FP16)
        return quiet16(r);
    if (DT == KVS_DTYPE_BF16)
        return narrow16(kvq_bf16_to_f32((uint16_t)r));
    return narrow16(kvq_f32_from_bits(r));
}

/* One chunk from a source row, element by element (any alignment; elements
 * at or beyond D read as 0). */
template <int DT>
__device__ __forceinline__ uint4 load_chunk_scalar(const unsigned char *row, int d0, int D)
{
    uint4 c = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int e = 0; e < Src<DT>::vec; e++) {
        int d = d0 + e;
        if (d < D) {
            uint32_t r = Src<DT>::esize == 4
                             ? *reinterpret_cast<const uint32_t *>(row + (size_t)d * 4)
                             : (uint32_t) * reinterpret_cast<const uint16_t *>(row + (size_t)d * 2);
            set_raw_elem<DT>(c, e, r);
        }
    }
    return c;
}

/* ---- ranking and amax (kvq__abs_key, kvq_amax_update) ----------------------- */

/* Rank key of x, shifted up by one so that 0 can mean "no candidate":
 * NaN -> 1, otherwise |x| bits + 2 (so kvq__abs_key(x) + 1). */
__device__ __forceinline__ uint32_t rank_key(float x)
{
    uint32_t a = kvq_f32_bits(x) & 0x7FFFFFFFu;
    return a > 0x7F800000u ? 1u : a + 2u;
}

/* amax (as |x| bits; non-negative floats order like their bits) updated with
 * the element of rank key `key`: only finite numbers count (kvq_amax_update). */
__device__ __forceinline__ uint32_t amax_with_key(uint32_t am, uint32_t key)
{
    if (key >= 2u) {
        uint32_t a = key - 2u;
        if (a < 0x7F800000u && a > am)
            am = a;
    }
    return am;
}

/* ---- encode / decode --------------------------------------------------------- */

/* kvq_ref.c's encode() multiplies ±Inf by 1 when the group's reciprocal is 0
 * (so ±Inf saturates to ±max / ±127 instead of becoming Inf * 0 = NaN). Every
 * nonzero reciprocal is a positive finite number and keeps the Inf anyway, so
 * "±Inf passes unscaled" is the same rule with no test on the reciprocal. */
__device__ __forceinline__ bool is_inf(float x)
{
    return (kvq_f32_bits(x) & 0x7FFFFFFFu) == 0x7F800000u;
}

/* Codes of a * ia and b * ib, a's in the low byte. Outliers and sinks are
 * passed as +0, which encodes to code 0 in every scheme. INF = false is for
 * callers that know neither input is ±Inf (the fast paths). */
template <bool INF = true>
__device__ __forceinline__ uint32_t encode2(float a, float b, int scheme, float ia, float ib)
{
    if (INF) {
        ia = is_inf(a) ? 1.0f : ia;
        ib = is_inf(b) ? 1.0f : ib;
    }
    if (scheme == KVS_SCHEME_INT8)
        return (uint32_t)(uint8_t)kvq_int8_quantize(a, ia) |
               ((uint32_t)(uint8_t)kvq_int8_quantize(b, ib) << 8);
    float x = kvq__mul(a, ia), y = kvq__mul(b, ib);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
    kvq_fp8_format f = scheme == KVS_SCHEME_FP8_E5M2 ? KVQ_FP8_E5M2 : KVQ_FP8_E4M3;
    return (uint32_t)kvq_f32_to_fp8(x, f) | ((uint32_t)kvq_f32_to_fp8(y, f) << 8);
#else
    return (uint32_t)__nv_cvt_float2_to_fp8x2(
        make_float2(x, y), __NV_SATFINITE, scheme == KVS_SCHEME_FP8_E5M2 ? __NV_E5M2 : __NV_E4M3);
#endif
}

/* The canonical NaN for any NaN, else x. */
__device__ __forceinline__ float canon(float x)
{
    return (kvq_f32_bits(x) & 0x7FFFFFFFu) > 0x7F800000u ? kvq_f32_from_bits(KVQ_F32_CANONICAL_NAN)
                                                         : x;
}

/* decode(code) * scale for two codes (low byte first): kvq_fp8_dequantize /
 * kvq_int8_dequantize. A NaN result may have any payload here; out_bits()
 * stores every NaN as the reference's canonical one. */
__device__ __forceinline__ float2 decode2(uint32_t c2, int scheme, float sa, float sb)
{
    float a, b;
    if (scheme == KVS_SCHEME_INT8) {
        a = (float)(int8_t)(c2 & 0xFFu);
        b = (float)(int8_t)((c2 >> 8) & 0xFFu);
    } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
        kvq_fp8_format f = scheme == KVS_SCHEME_FP8_E5M2 ? KVQ_FP8_E5M2 : KVQ_FP8_E4M3;
        a = kvq_fp8_to_f32((uint8_t)(c2 & 0xFFu), f);
        b = kvq_fp8_to_f32((uint8_t)((c2 >> 8) & 0xFFu), f);
#else
        __half2_raw h =
            __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(c2 & 0xFFFFu),
                                       scheme == KVS_SCHEME_FP8_E5M2 ? __NV_E5M2 : __NV_E4M3);
        a = hw_fp16_to_f32(h.x);
        b = hw_fp16_to_f32(h.y);
#endif
    }
    return make_float2(kvq__mul(a, sa), kvq__mul(b, sb));
}

/* ---- output elements (dequantize) --------------------------------------------- */

template <int DT> struct Out {
    static constexpr int esize = DT == KVS_DTYPE_FP32 ? 4 : 2;
};

/* What kvq_ref's store() writes for a decoded x, any NaN taken as the
 * canonical 0x7FFFFFFF (what the reference's decode gives a NaN code). */
template <int DT> __device__ __forceinline__ uint32_t out_bits(float x)
{
    if (DT == KVS_DTYPE_FP32)
        return kvq_f32_bits(canon(x));
    if (DT == KVS_DTYPE_BF16)
        return kvq_f32_to_bf16(canon(x));
    if ((kvq_f32_bits(x) & 0x7FFFFFFFu) > 0x7F800000u)
        return 0x7FFFu; /* kvq_f32_to_fp16(canonical NaN) */
    __half_raw r = __float2half_rn(x);
    return r.x;
}

/* What the reference stores for an fp16 value h (sink, outlier, fp16 scheme):
 * store(kvq_fp16_to_f32(h)). */
template <int DT> __device__ __forceinline__ uint32_t out_bits_fp16(uint32_t h)
{
    if (DT == KVS_DTYPE_FP16)
        return quiet16(h);
    if (DT == KVS_DTYPE_BF16)
        return kvq_f32_to_bf16(exact_fp16_to_f32(h));
    return kvq_f32_bits(exact_fp16_to_f32(h));
}

template <int DT> __device__ __forceinline__ void store_out(unsigned char *p, uint32_t v)
{
    if (Out<DT>::esize == 4)
        *reinterpret_cast<uint32_t *>(p) = v;
    else
        *reinterpret_cast<uint16_t *>(p) = (uint16_t)v;
}

/* ---- header and padding --------------------------------------------------------- */

/* The 32-byte header, checksum 0 (kvs_tile_seal fills it on the host). */
/* The stored fp16 scale of a group whose scale (dynamic or static) is s:
 * rounded up to fp16, then aligned to the launch's per-tensor scale when it
 * has one; kvq_ref.c's step 3, the same kvq_math.h functions. */
__device__ __forceinline__ uint16_t stored_scale(const Geo &g, float s)
{
    const uint16_t h = kvq_scale_fp16(s);
    return g.tensor16 != 0 ? kvq_scale_align_fp16(h, g.tensor16) : h;
}

__device__ __forceinline__ void write_header(unsigned char *tile, const Geo &g, bool is_static)
{
    uint4 w0, w1;
    w0.x = KVS_TILE_MAGIC;
    w0.y = KVS_FORMAT_VERSION | ((uint32_t)g.scheme << 8) | ((uint32_t)g.kind << 16) |
           ((is_static ? KVS_TILE_F_STATIC : 0u) << 24) | ((g.koff ? KVS_TILE_F_KOFF : 0u) << 24);
    w0.z = (uint32_t)g.T | ((uint32_t)g.D << 16);
    w0.w = (uint32_t)g.k | ((uint32_t)g.S << 8);
    w1.x = g.l.payload;
    w1.y = 0;
    w1.z = 0;
    w1.w = 0;
    reinterpret_cast<uint4 *>(tile)[0] = w0;
    reinterpret_cast<uint4 *>(tile)[1] = w1;
}

/* Zeroes the gaps between the payload parts and the tail (each < 16 bytes);
 * one thread per tile calls it. */
__device__ __forceinline__ void write_pads(unsigned char *pay, const Geo &g)
{
    const kvs_tile_layout &l = g.l;
    uint32_t from[5], to[5];
    int n = 0;
    if (g.scheme == KVS_SCHEME_FP16) {
        from[n] = (uint32_t)g.T * g.D * 2u;
        to[n++] = l.payload;
    } else {
        from[n] = (uint32_t)g.T * g.D;
        to[n++] = l.scales;
        from[n] = l.scales + l.groups * 2u;
        to[n++] = l.outliers;
        from[n] = l.outliers + l.groups * (uint32_t)g.k * l.entry;
        to[n++] = l.sinks;
        from[n] = l.sinks + (uint32_t)g.S * g.D * 2u;
        to[n++] = l.offsets; /* = payload without key offsets */
        from[n] = l.offsets + (g.koff ? (uint32_t)g.D * 2u : 0u);
        to[n++] = l.payload;
    }
    for (int i = 0; i < n; i++)
        for (uint32_t b = from[i]; b < to[i]; b++)
            pay[b] = 0;
}

/* ---- launchers (tile_quant_k.cu, tile_quant_v.cu, tile_dequant.cu) --------------- */

/* Each returns 0 or a KVS_* status (kvs_cuda_last_error set). Parameters are
 * valid (tile_api.cu checked them); n >= 1. */
int quant_k(const Geo &g, int dtype, const kvs_cuda_tile_job *jobs, unsigned n, cudaStream_t s,
            const DevInfo &di, int strip_bytes);
/* tile_quant_k_cols.cu: the column-warp K kernels (variant 1, 2, 3: 4, 8, 16
 * source bytes per lane; 4: like 1, rows split into slices, two launches);
 * supported when k <= 4 and without key offsets. */
bool quant_k_cols_supported(const Geo &g);
int quant_k_cols(const Geo &g, int dtype, const kvs_cuda_tile_job *jobs, unsigned n,
                 cudaStream_t s, int variant);
int quant_v(const Geo &g, int dtype, const kvs_cuda_tile_job *jobs, unsigned n, cudaStream_t s,
            const DevInfo &di, int lane_chunks);
int quant_fp16(const Geo &g, int dtype, const kvs_cuda_tile_job *jobs, unsigned n, cudaStream_t s,
               const DevInfo &di);
int dequant(const Geo &g, int dtype, const kvs_cuda_detile_job *jobs, unsigned n, cudaStream_t s,
            const DevInfo &di);

} // namespace kvs_tile

#endif /* KVS_TILE_DEV_CUH */
