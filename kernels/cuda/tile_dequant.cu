/*
 * tile_dequant.cu — the row-streaming tile kernels: dequantize (every scheme,
 * both kinds) and quantize for the fp16 scheme (a passthrough). Neither needs a
 * second look at its input, so a block simply takes R consecutive token rows
 * of one tile and walks them in 8-element chunks (8 codes in, 8 values out in
 * 16- or 32-byte stores; rows that are not 16-byte aligned, or D % 8 != 0,
 * take an element-by-element path in the same kernel).
 *
 * Dequantize, as kvq_ref.c: x' = decode(code) * scale (+ the channel's key
 * offset, kv_format.h rule 5; sink rows: their fp16 values), then each
 * outlier slot overwrites its element. The block stages the
 * scales it needs (K: all D; V: its R rows) in shared memory, writes its rows,
 * waits at a barrier, then patches the outliers that fall in its rows: one
 * thread per group walks that group's slots in order, so when a (validated but
 * odd) tile names an element twice the later slot wins, as in the reference.
 * Slots whose index is out of range are skipped: no tile can make a block write
 * outside its rows.
 *
 * Rows per block R: about 8 chunks per thread, fewer when that would leave the
 * multiprocessors idle; a block never spans two tiles.
 */
#include "tile_dev.cuh"

#include "kvs_cuda_internal.h"
#include "kvs_error.h"

namespace kvs_tile
{
namespace
{

struct DArgs {
    Geo g;
    const kvs_cuda_detile_job *jobs;
    int R;       /* rows per block */
    int rblocks; /* blocks per tile: ceil(T / R) */
};

template <int DT> __global__ void __launch_bounds__(kThreads) dequant_kernel(const DArgs a)
{
    constexpr int ES = Out<DT>::esize;
    const Geo &g = a.g;
    const int tid = threadIdx.x;
    const int tile = blockIdx.x / a.rblocks, rb = blockIdx.x % a.rblocks;
    const int r0 = rb * a.R, r1 = min(g.T, r0 + a.R);
    const kvs_cuda_detile_job job = a.jobs[tile];
    const unsigned char *pay = static_cast<const unsigned char *>(job.tile) + sizeof(kvs_tile_hdr);
    unsigned char *dst = static_cast<unsigned char *>(job.dst);
    const size_t rowb = job.stride * ES;
    const bool vin = g.D % 8 == 0;
    const bool vout = vin && ((uintptr_t)dst % 16u) == 0 && rowb % 16u == 0;
    const bool is_k = g.kind == KVS_TILE_K;
    const bool fp16 = g.scheme == KVS_SCHEME_FP16;

    float *sc = reinterpret_cast<float *>(dyn_smem());
    float *mo = sc + g.D; /* key offsets: [D] after the K scales */
    if (!fp16) {
        /* fp16 scales (format v2), widened exactly; kvs_tile_check has refused
         * negative, NaN and infinite ones (and offsets that are not finite) */
        const uint16_t *scales = reinterpret_cast<const uint16_t *>(pay + g.l.scales);
        const uint16_t *offs = reinterpret_cast<const uint16_t *>(pay + g.l.offsets);
        if (is_k)
            for (int i = tid; i < g.D; i += kThreads) {
                sc[i] = kvq_fp16_to_f32(scales[i]);
                if (g.koff)
                    mo[i] = kvq_fp16_to_f32(offs[i]);
            }
        else
            for (int i = tid; i < r1 - r0; i += kThreads)
                sc[i] = kvq_fp16_to_f32(scales[r0 + i]);
    }
    __syncthreads();

    const int cr = (g.D + 7) / 8;
    const int nch = (r1 - r0) * cr;
    for (int i = tid; i < nch; i += kThreads) {
        const int t = r0 + i / cr, c = (i % cr) * 8;
        uint32_t v[8];
        if (fp16 || t < g.S) {
            /* fp16 values: the fp16 scheme's payload, or a sink row */
            const uint16_t *hp = reinterpret_cast<const uint16_t *>(pay + (fp16 ? 0u : g.l.sinks)) +
                                 (size_t)t * g.D + c;
            uint32_t h[8];
            if (vin) {
                uint4 q = *reinterpret_cast<const uint4 *>(hp);
#pragma unroll
                for (int e = 0; e < 8; e++)
                    h[e] = (word_of(q, e >> 1) >> ((e & 1) * 16)) & 0xFFFFu;
            } else {
#pragma unroll
                for (int e = 0; e < 8; e++)
                    h[e] = c + e < g.D ? hp[e] : 0u;
            }
#pragma unroll
            for (int e = 0; e < 8; e++)
                v[e] = out_bits_fp16<DT>(h[e]);
        } else {
            const unsigned char *cp = pay + g.l.codes + (size_t)t * g.D + c;
            uint32_t c03, c47;
            if (vin) {
                uint2 q = *reinterpret_cast<const uint2 *>(cp);
                c03 = q.x;
                c47 = q.y;
            } else {
                uint32_t b[8];
#pragma unroll
                for (int e = 0; e < 8; e++)
                    b[e] = c + e < g.D ? cp[e] : 0u;
                c03 = b[0] | (b[1] << 8) | (b[2] << 16) | (b[3] << 24);
                c47 = b[4] | (b[5] << 8) | (b[6] << 16) | (b[7] << 24);
            }
            float s[8];
            if (!is_k) {
#pragma unroll
                for (int e = 0; e < 8; e++)
                    s[e] = sc[t - r0];
            } else if (vin) {
                const float4 s0 = reinterpret_cast<const float4 *>(sc + c)[0];
                const float4 s1 = reinterpret_cast<const float4 *>(sc + c)[1];
                s[0] = s0.x, s[1] = s0.y, s[2] = s0.z, s[3] = s0.w;
                s[4] = s1.x, s[5] = s1.y, s[6] = s1.z, s[7] = s1.w;
            } else {
#pragma unroll
                for (int e = 0; e < 8; e++)
                    s[e] = c + e < g.D ? sc[c + e] : 0.0f;
            }
            const float2 y0 = decode2(c03 & 0xFFFFu, g.scheme, s[0], s[1]);
            const float2 y1 = decode2(c03 >> 16, g.scheme, s[2], s[3]);
            const float2 y2 = decode2(c47 & 0xFFFFu, g.scheme, s[4], s[5]);
            const float2 y3 = decode2(c47 >> 16, g.scheme, s[6], s[7]);
            float y[8] = {y0.x, y0.y, y1.x, y1.y, y2.x, y2.y, y3.x, y3.y};
            if (g.koff) { /* K tiles only (prepare) */
#pragma unroll
                for (int e = 0; e < 8; e++)
                    y[e] = kvq_offset_add(y[e], c + e < g.D ? mo[c + e] : 0.0f);
            }
#pragma unroll
            for (int e = 0; e < 8; e++)
                v[e] = out_bits<DT>(y[e]);
        }
        unsigned char *op = dst + (size_t)t * rowb + (size_t)c * ES;
        if (vout) {
            if constexpr (ES == 2) {
                *reinterpret_cast<uint4 *>(op) =
                    make_uint4(v[0] | (v[1] << 16), v[2] | (v[3] << 16), v[4] | (v[5] << 16),
                               v[6] | (v[7] << 16));
            } else {
                reinterpret_cast<uint4 *>(op)[0] = make_uint4(v[0], v[1], v[2], v[3]);
                reinterpret_cast<uint4 *>(op)[1] = make_uint4(v[4], v[5], v[6], v[7]);
            }
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++)
                if (c + e < g.D)
                    store_out<DT>(op + (size_t)e * ES, v[e]);
        }
    }
    if (fp16 || g.k == 0)
        return;

    /* Outliers overwrite what the rows above wrote (same block: the barrier
     * orders the global stores). */
    __syncthreads();
    /* Entries of 3 or 4 bytes (kvs_outlier_get); an index out of range is an
     * empty slot. V sink rows are skipped: their slots are empty, but with
     * 8-bit indices and D = 256 the empty index 0xFF is also channel 255. */
    const unsigned char *slots = pay + g.l.outliers;
    const uint32_t E = g.l.entry;
    if (is_k) {
        for (int d = tid; d < g.D; d += kThreads)
            for (int s = 0; s < g.k; s++) {
                uint32_t t;
                uint16_t v;
                kvs_outlier_get(slots + ((size_t)d * g.k + s) * E, E, &t, &v);
                if ((int)t >= r0 && (int)t < r1)
                    store_out<DT>(dst + (size_t)t * rowb + (size_t)d * ES, out_bits_fp16<DT>(v));
            }
    } else {
        for (int t = max(r0, g.S) + tid; t < r1; t += kThreads)
            for (int s = 0; s < g.k; s++) {
                uint32_t d;
                uint16_t v;
                kvs_outlier_get(slots + ((size_t)t * g.k + s) * E, E, &d, &v);
                if (d < (uint32_t)g.D)
                    store_out<DT>(dst + (size_t)t * rowb + (size_t)d * ES, out_bits_fp16<DT>(v));
            }
    }
}

/* fp16 scheme: payload[t][d] = fp16 of the source element; no groups. */
struct PArgs {
    Geo g;
    const kvs_cuda_tile_job *jobs;
    int R;
    int rblocks;
};

template <int DT> __global__ void __launch_bounds__(kThreads) quant_fp16_kernel(const PArgs a)
{
    constexpr int VEC = Src<DT>::vec, ES = Src<DT>::esize;
    const Geo &g = a.g;
    const int tid = threadIdx.x;
    const int tile = blockIdx.x / a.rblocks, rb = blockIdx.x % a.rblocks;
    const int r0 = rb * a.R, r1 = min(g.T, r0 + a.R);
    const kvs_cuda_tile_job job = a.jobs[tile];
    const unsigned char *src = static_cast<const unsigned char *>(job.src);
    const size_t rowb = job.stride * ES;
    unsigned char *tilep = static_cast<unsigned char *>(job.dst);
    unsigned char *pay = tilep + sizeof(kvs_tile_hdr);
    const bool vload = ((uintptr_t)src % 16u) == 0 && rowb % 16u == 0 && g.D % VEC == 0;
    const bool vstore = g.D % VEC == 0;
    if (rb == 0 && tid == 0) {
        write_header(tilep, g, job.static_scales != NULL); /* the reference flags it even here */
        write_pads(pay, g);
    }
    const int cr = (g.D + VEC - 1) / VEC;
    const int nch = (r1 - r0) * cr;
    for (int i = tid; i < nch; i += kThreads) {
        const int t = r0 + i / cr, c = (i % cr) * VEC;
        const unsigned char *row = src + (size_t)t * rowb;
        uint4 raw = vload ? *reinterpret_cast<const uint4 *>(row + (size_t)c * ES)
                          : load_chunk_scalar<DT>(row, c, g.D);
        uint16_t *hp = reinterpret_cast<uint16_t *>(pay) + (size_t)t * g.D + c;
        uint32_t h[VEC / 2];
#pragma unroll
        for (int e = 0; e < VEC; e += 2)
            h[e / 2] = (uint32_t)exact_fp16<DT>(raw_elem<DT>(raw, e)) |
                       ((uint32_t)exact_fp16<DT>(raw_elem<DT>(raw, e + 1)) << 16);
        if (vstore) {
            if constexpr (VEC == 8)
                *reinterpret_cast<uint4 *>(hp) = make_uint4(h[0], h[1], h[2], h[3]);
            else
                *reinterpret_cast<uint2 *>(hp) = make_uint2(h[0], h[1]);
        } else {
#pragma unroll
            for (int e = 0; e < VEC; e++)
                if (c + e < g.D)
                    hp[e] = (uint16_t)(h[e / 2] >> ((e & 1) * 16));
        }
    }
}

/* Rows per block: ~8 chunks per thread, but enough blocks for ~4 per SM; a
 * power of two. */
int rows_per_block(const Geo &g, unsigned n, int chunks_per_row, const DevInfo &di)
{
    long rmax = (long)(8 * kThreads) / chunks_per_row;
    long rmin = (long)kThreads / chunks_per_row;
    if (rmax < 1)
        rmax = 1;
    if (rmin < 1)
        rmin = 1;
    long want =
        (long)(((unsigned long long)n * (unsigned)g.T + 4ull * di.sms - 1) / (4ull * di.sms));
    long R = want < rmin ? rmin : want > rmax ? rmax : want;
    long p2 = 1; /* a power of two splits T = 2^n into equal blocks */
    while (p2 * 2 <= R)
        p2 *= 2;
    return (int)(p2 < g.T ? p2 : g.T);
}

} // namespace

int dequant(const Geo &g, int dtype, const kvs_cuda_detile_job *jobs, unsigned n, cudaStream_t s,
            const DevInfo &di)
{
    DArgs a;
    a.g = g;
    a.jobs = jobs;
    a.R = rows_per_block(g, n, (g.D + 7) / 8, di);
    a.rblocks = (g.T + a.R - 1) / a.R;
    if ((unsigned long long)n * (unsigned)a.rblocks > 0x7FFFFFFFull)
        return kvs__cuda_failf(KVS_EINVAL, "dequantize: %u tiles is too many for one launch", n);
    const unsigned grid = n * (unsigned)a.rblocks;
    const size_t smem = (size_t)(g.D > a.R ? g.D : a.R) * sizeof(float) * (g.koff ? 2 : 1);
    switch (dtype) {
    case KVS_DTYPE_FP16:
        KVS_CK(launch(dequant_kernel<KVS_DTYPE_FP16>, grid, smem, s, a));
        break;
    case KVS_DTYPE_BF16:
        KVS_CK(launch(dequant_kernel<KVS_DTYPE_BF16>, grid, smem, s, a));
        break;
    default:
        KVS_CK(launch(dequant_kernel<KVS_DTYPE_FP32>, grid, smem, s, a));
        break;
    }
    return KVS_OK;
}

int quant_fp16(const Geo &g, int dtype, const kvs_cuda_tile_job *jobs, unsigned n, cudaStream_t s,
               const DevInfo &di)
{
    const int vec = dtype == KVS_DTYPE_FP32 ? 4 : 8;
    PArgs a;
    a.g = g;
    a.jobs = jobs;
    a.R = rows_per_block(g, n, (g.D + vec - 1) / vec, di);
    a.rblocks = (g.T + a.R - 1) / a.R;
    if ((unsigned long long)n * (unsigned)a.rblocks > 0x7FFFFFFFull)
        return kvs__cuda_failf(KVS_EINVAL, "quantize: %u tiles is too many for one launch", n);
    const unsigned grid = n * (unsigned)a.rblocks;
    switch (dtype) {
    case KVS_DTYPE_FP16:
        KVS_CK(launch(quant_fp16_kernel<KVS_DTYPE_FP16>, grid, 0, s, a));
        break;
    case KVS_DTYPE_BF16:
        KVS_CK(launch(quant_fp16_kernel<KVS_DTYPE_BF16>, grid, 0, s, a));
        break;
    default:
        KVS_CK(launch(quant_fp16_kernel<KVS_DTYPE_FP32>, grid, 0, s, a));
        break;
    }
    return KVS_OK;
}

} // namespace kvs_tile
