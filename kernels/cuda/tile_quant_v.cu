/*
 * tile_quant_v.cu — quantize V tiles (one scale group per token row t, over
 * all D channels) for the 8-bit schemes.
 *
 * A group is one contiguous source row, small enough (D <= 1024) to live in
 * registers, so nothing is staged: a *segment* of L lanes of a warp owns a row,
 * each lane holding CPL 16-byte chunks of it (chunk m * L + lane, element
 * d = chunk * VEC + e); a warp takes 32 / L rows at once. CPL is 4 for fp16 and
 * fp32 (32 / 16 elements per lane: per-row and per-round work is shared by many
 * elements), 2 for bf16 (register pressure), more only for the widest fp32 rows.
 * Warps walk row groups grid-stride, loading the next group's chunks before
 * working on the current one (one group in flight per warp while it computes).
 *
 * Two paths, chosen per warp and row group with one vote, same bytes out:
 *   fast    (fp16/bf16, D % 8 == 0, no NaN/Inf among the warp's live values):
 *           exact 32-bit keys (|h| << 16 | 0xFFFF - d); round r takes the max key
 *           below round r-1's (one subtract + one min per element, then a
 *           segment min); the round after the k-th is the amax;
 *   general (anything else: fp32, odd D, NaN, ±Inf): kvq__abs_key order (±Inf
 *           first, NaN last), k rounds of a lane-local arg-max over unchosen
 *           elements + a segment max of (key << 32 | ~d), a masked amax.
 * Both give kvq_topk_abs's picks: larger |x| first, then the lower d. The
 * owner lane of each pick writes its slot (index d, fp16 of the source bits);
 * a round without a candidate (D < k) writes an empty slot; outliers encode as
 * code 0. Sink rows (t < S) run the same votes and shuffles with no candidates
 * (the warp stays converged) and store their fp16 values, zero codes, scale 0.
 * The segment of row 0 of each tile writes the header and the zero padding.
 */
#include "tile_dev.cuh"

#include "kvs_cuda_internal.h"
#include "kvs_error.h"

namespace kvs_tile
{
namespace
{

struct VArgs {
    Geo g;
    const kvs_cuda_tile_job *jobs;
    unsigned rows;   /* n * T */
    unsigned groups; /* ceil(rows / (32 / L)) */
    int lg;          /* log2 L */
};

template <int DT, int CPL> struct Row {
    bool valid;
    int t;
    kvs_cuda_tile_job job;
    uint4 raw[CPL];
};

template <int DT, int CPL>
__device__ __forceinline__ void load_row(Row<DT, CPL> &r, const VArgs &a, unsigned grp, int seg,
                                         int sl)
{
    constexpr int VEC = Src<DT>::vec, ES = Src<DT>::esize;
    const Geo &g = a.g;
    const int L = 1 << a.lg;
    const unsigned row = grp * (32u >> a.lg) + (unsigned)seg;
    r.valid = grp < a.groups && row < a.rows;
    r.t = 0;
    r.job = kvs_cuda_tile_job();
#pragma unroll
    for (int m = 0; m < CPL; m++)
        r.raw[m] = make_uint4(0, 0, 0, 0);
    if (!r.valid)
        return;
    const unsigned tile = row / (unsigned)g.T;
    r.t = (int)(row - tile * (unsigned)g.T);
    r.job = a.jobs[tile];
    const unsigned char *src =
        static_cast<const unsigned char *>(r.job.src) + (size_t)r.t * r.job.stride * ES;
    const bool vload = ((uintptr_t)src % 16u) == 0 && g.D % VEC == 0;
    const int C = (g.D + VEC - 1) / VEC;
#pragma unroll
    for (int m = 0; m < CPL; m++) {
        int ci = m * L + sl;
        if (ci < C)
            r.raw[m] = vload ? reinterpret_cast<const uint4 *>(src)[ci]
                             : load_chunk_scalar<DT>(src, ci * VEC, g.D);
    }
}

/* Raw bits of element e of chunk m of a row (m, e known only at run time:
 * selects, no local memory). */
template <int DT, int CPL>
__device__ __forceinline__ uint32_t raw_at(const Row<DT, CPL> &r, int m, int e)
{
    uint4 ch = r.raw[0];
#pragma unroll
    for (int mm = 1; mm < CPL; mm++)
        if (mm == m)
            ch = r.raw[mm];
    return raw_elem<DT>(ch, e);
}

/* max / min over the L lanes of a segment (xor butterflies stay inside it). */
__device__ __forceinline__ uint32_t seg_max(uint32_t v, int L)
{
    for (int off = L >> 1; off > 0; off >>= 1)
        v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, off));
    return v;
}

__device__ __forceinline__ uint32_t seg_min(uint32_t v, int L)
{
    for (int off = L >> 1; off > 0; off >>= 1)
        v = min(v, __shfl_xor_sync(0xFFFFFFFFu, v, off));
    return v;
}

/* Bytes of an 8-code chunk whose bit in b (8 bits) is set, as a clear mask. */
__device__ __forceinline__ uint2 byte_mask8(uint32_t b)
{
    uint32_t lo = ((b & 0xFu) * 0x00204081u & 0x01010101u) * 0xFFu;
    uint32_t hi = ((b >> 4) * 0x00204081u & 0x01010101u) * 0xFFu;
    return make_uint2(lo, hi);
}

/* Sink row t < S: fp16 values into the sink region, codes 0. */
template <int DT, int CPL>
__device__ __forceinline__ void store_sink_row(const Row<DT, CPL> &r, const VArgs &a, int sl,
                                               unsigned char *pay)
{
    constexpr int VEC = Src<DT>::vec;
    const Geo &g = a.g;
    const int L = 1 << a.lg, C = (g.D + VEC - 1) / VEC;
    const bool vstore = g.D % VEC == 0;
#pragma unroll
    for (int m = 0; m < CPL; m++) {
        const int ci = m * L + sl;
        if (ci >= C)
            continue;
        const int d0 = ci * VEC;
        unsigned char *cp = pay + g.l.codes + (size_t)r.t * g.D + d0;
        uint16_t *sp = reinterpret_cast<uint16_t *>(pay + g.l.sinks) + (size_t)r.t * g.D + d0;
        if (vstore) {
            uint32_t h[VEC / 2];
#pragma unroll
            for (int e = 0; e < VEC; e += 2)
                h[e / 2] = (uint32_t)exact_fp16<DT>(raw_elem<DT>(r.raw[m], e)) |
                           ((uint32_t)exact_fp16<DT>(raw_elem<DT>(r.raw[m], e + 1)) << 16);
            if constexpr (VEC == 8) {
                *reinterpret_cast<uint4 *>(sp) = make_uint4(h[0], h[1], h[2], h[3]);
                *reinterpret_cast<uint2 *>(cp) = make_uint2(0, 0);
            } else {
                *reinterpret_cast<uint2 *>(sp) = make_uint2(h[0], h[1]);
                *reinterpret_cast<uint32_t *>(cp) = 0;
            }
        } else {
#pragma unroll
            for (int e = 0; e < VEC; e++)
                if (d0 + e < g.D) {
                    sp[e] = exact_fp16<DT>(raw_elem<DT>(r.raw[m], e));
                    cp[e] = 0;
                }
        }
    }
}

/* Scale of a live row from its amax (or the static scale); writes it, and the
 * header and padding from row 0. Returns the reciprocal. */
template <int DT, int CPL>
__device__ __forceinline__ float finish_scale(const Row<DT, CPL> &r, const VArgs &a, int sl,
                                              unsigned char *pay, bool live, float amax)
{
    const Geo &g = a.g;
    uint16_t scale = 0; /* stored as fp16, rounded up, aligned (stored_scale) */
    if (live)
        scale = stored_scale(g, r.job.static_scales != NULL ? r.job.static_scales[r.t]
                                                            : kvq_scale_from_amax(amax, g.qmax));
    if (sl == 0) {
        reinterpret_cast<uint16_t *>(pay + g.l.scales)[r.t] = scale;
        if (r.t == 0) {
            write_header(static_cast<unsigned char *>(r.job.dst), g, r.job.static_scales != NULL);
            write_pads(pay, g);
        }
    }
    return kvq_scale_inv(kvq_fp16_to_f32(scale));
}

/*
 * Fast path: 16-bit sources, D % 8 == 0, no NaN or Inf among the warp's live
 * elements (checked with one vote; otherwise the general path runs). The
 * fp16/bf16 bits order like |x|, so key = (|h| << 16) | (0xFFFF - d) is exact
 * and unique in 32 bits: the larger key is the larger |x|, then the lower d.
 * Round r's winner is the largest key below round r-1's, found per element
 * with one subtraction and one min (W - 1 - key wraps for keys >= W); the
 * round after the k-th gives the largest non-outlier key, i.e. the amax (all
 * values finite here). Outliers are encoded like the rest, then their code
 * bytes cleared.
 */
/* The 8 codes of chunk m of a live row (outliers still encoded: cleared by the
 * caller), the scheme a constant. */
template <int DT, int SCH>
__device__ __forceinline__ uint2 encode_chunk(const uint4 &c, float inv)
{
    uint32_t w[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const uint32_t w0 = word_of(c, 2 * h), w1 = word_of(c, 2 * h + 1);
        w[h] = encode2<false>(widen<DT>(w0 & 0xFFFFu), widen<DT>(w0 >> 16), SCH, inv, inv) |
               (encode2<false>(widen<DT>(w1 & 0xFFFFu), widen<DT>(w1 >> 16), SCH, inv, inv)
                << 16);
    }
    return make_uint2(w[0], w[1]);
}

template <int DT, int CPL, int SCH>
__device__ __forceinline__ void encode_row_fast(const Row<DT, CPL> &r, const Geo &g, int sl, int L,
                                                int C, unsigned char *pay, float inv,
                                                uint32_t sel)
{
#pragma unroll
    for (int m = 0; m < CPL; m++) {
        const int ci = m * L + sl;
        if (ci >= C)
            continue;
        uint2 w = encode_chunk<DT, SCH>(r.raw[m], inv);
        const uint32_t b = (sel >> (m * 8)) & 0xFFu;
        if (b != 0) {
            uint2 cm = byte_mask8(b);
            w.x &= ~cm.x;
            w.y &= ~cm.y;
        }
        *reinterpret_cast<uint2 *>(pay + g.l.codes + (size_t)r.t * g.D + ci * 8) = w;
    }
}

/* FULL: every lane of the warp holds CPL chunks of a live row (D = 128 with 4
 * lanes of 4 chunks, the common case): no per-element "is it there" selects,
 * so the keys, recomputed from the raw words in each round (32 more registers
 * would halve the blocks per multiprocessor), cost two or three instructions. */
template <int DT, int CPL, bool FULL>
__device__ __forceinline__ bool row_fast(const Row<DT, CPL> &r, const VArgs &a, int sl, bool sink,
                                         bool live)
{
    const Geo &g = a.g;
    const int L = 1 << a.lg, C = g.D >> 3;
    /* Key of element (m, 2q + hi): (|h| << 16) | (0xFFFF - d), or 0 if absent. */
    auto key_of = [&](int m, int q, int hi) -> uint32_t {
        const int ci = m * L + sl;
        const bool on = FULL || (live && ci < C);
        const uint32_t w = word_of(r.raw[m], q);
        const uint32_t v = hi ? w & 0x7FFF0000u : (w << 16) & 0x7FFF0000u;
        return on ? v | (0xFFFFu - (uint32_t)(ci * 8 + 2 * q + hi)) : 0u;
    };
    uint32_t lmax = 0;
#pragma unroll
    for (int m = 0; m < CPL; m++)
#pragma unroll
        for (int q = 0; q < 4; q++)
            lmax = max(lmax, max(key_of(m, q, 0), key_of(m, q, 1)));
    const uint32_t nonfinite = (DT == KVS_DTYPE_FP16 ? 0x7C00u : 0x7F80u) << 16;
    if (__any_sync(0xFFFFFFFFu, lmax >= nonfinite))
        return false;

    unsigned char *pay = static_cast<unsigned char *>(r.job.dst) + sizeof(kvs_tile_hdr);
    unsigned char *slots =
        r.valid ? pay + g.l.outliers + (size_t)r.t * (uint32_t)g.k * g.l.entry : NULL;
    uint32_t sel = 0;
    uint32_t W = seg_max(lmax, L);
    for (int round = 0;; round++) {
        if (round > 0) {
            const uint32_t wm1 = W - 1u;
            uint32_t mt = wm1; /* an absent element: "nothing below W" */
#pragma unroll
            for (int m = 0; m < CPL; m++)
#pragma unroll
                for (int q = 0; q < 4; q++)
                    mt = min(mt, min(wm1 - key_of(m, q, 0), wm1 - key_of(m, q, 1)));
            mt = seg_min(mt, L);
            W = W != 0 ? wm1 - mt : 0u;
        }
        if (round == g.k)
            break;
        if (W != 0) {
            const uint32_t dw = 0xFFFFu - (W & 0xFFFFu);
            const int ciw = (int)(dw >> 3);
            if ((ciw & (L - 1)) == sl) {
                const int mw = ciw >> a.lg, ew = (int)(dw & 7u);
                sel |= 1u << (mw * 8 + ew);
                kvs_outlier_put(slots + (uint32_t)round * g.l.entry, g.l.entry, dw,
                                exact_fp16<DT>(raw_at(r, mw, ew)));
            }
        } else if (sl == 0 && r.valid) {
            kvs_outlier_put(slots + (uint32_t)round * g.l.entry, g.l.entry, KVS_OUTLIER_EMPTY, 0);
        }
    }
    if (!r.valid)
        return true;
    if (sink) {
        finish_scale(r, a, sl, pay, false, 0.0f);
        store_sink_row(r, a, sl, pay);
        return true;
    }
    const float amax = W != 0 ? widen<DT>(W >> 16) : 0.0f;
    const float inv = finish_scale(r, a, sl, pay, live, amax);
    if (g.scheme == KVS_SCHEME_INT8) /* launch-uniform */
        encode_row_fast<DT, CPL, KVS_SCHEME_INT8>(r, g, sl, L, C, pay, inv, sel);
    else if (g.scheme == KVS_SCHEME_FP8_E5M2)
        encode_row_fast<DT, CPL, KVS_SCHEME_FP8_E5M2>(r, g, sl, L, C, pay, inv, sel);
    else
        encode_row_fast<DT, CPL, KVS_SCHEME_FP8_E4M3>(r, g, sl, L, C, pay, inv, sel);
    return true;
}

/*
 * General path: any source type, any D, NaN and ±Inf. Keys (rank_key: NaN
 * lowest, ±Inf highest) are recomputed from the raw bits each round instead of
 * being kept, so this rarely used path costs few registers. Each round is a
 * lane-local arg-max over the unchosen elements (lowest d wins ties: the lane
 * visits its elements in increasing d) and a segment max of the packed
 * (key << 32 | ~d).
 */
template <int DT, int CPL>
__device__ __forceinline__ void row_general(const Row<DT, CPL> &r, const VArgs &a, int sl,
                                            bool sink, bool live)
{
    constexpr int VEC = Src<DT>::vec, N = CPL * VEC;
    static_assert(N <= 32, "one 32-bit mask per lane");
    const Geo &g = a.g;
    const int L = 1 << a.lg;
    const int C = (g.D + VEC - 1) / VEC;
    auto key_at = [&](int m, int e) -> uint32_t {
        const int d = (m * L + sl) * VEC + e;
        return live && d < g.D ? rank_key(widen<DT>(raw_elem<DT>(r.raw[m], e))) : 0u;
    };

    unsigned char *pay = static_cast<unsigned char *>(r.job.dst) + sizeof(kvs_tile_hdr);
    unsigned char *slots =
        r.valid ? pay + g.l.outliers + (size_t)r.t * (uint32_t)g.k * g.l.entry : NULL;
    uint32_t sel = 0; /* bit p: element p is an outlier */
    for (int round = 0; round < g.k; round++) {
        uint32_t best = 0;
        int bp = 0;
#pragma unroll
        for (int m = 0; m < CPL; m++)
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                const int p = m * VEC + e;
                const uint32_t kk = (sel >> p) & 1u ? 0u : key_at(m, e);
                if (kk > best) {
                    best = kk;
                    bp = p;
                }
            }
        const uint32_t bd = (uint32_t)(((bp / VEC) * L + sl) * VEC + bp % VEC);
        uint64_t packed = best ? ((uint64_t)best << 32) | (0xFFFFFFFFu - bd) : 0;
        for (int off = L >> 1; off > 0; off >>= 1) {
            uint64_t o = __shfl_xor_sync(0xFFFFFFFFu, packed, off);
            packed = o > packed ? o : packed;
        }
        if (packed != 0) {
            const uint32_t dw = 0xFFFFFFFFu - (uint32_t)packed;
            const int ciw = (int)(dw / VEC);
            if ((ciw & (L - 1)) == sl) {
                const int mw = ciw >> a.lg, ew = (int)(dw % VEC);
                sel |= 1u << (mw * VEC + ew);
                kvs_outlier_put(slots + (uint32_t)round * g.l.entry, g.l.entry, dw,
                                exact_fp16<DT>(raw_at(r, mw, ew)));
            }
        } else if (sl == 0 && r.valid) {
            kvs_outlier_put(slots + (uint32_t)round * g.l.entry, g.l.entry, KVS_OUTLIER_EMPTY, 0);
        }
    }

    uint32_t am = 0;
#pragma unroll
    for (int m = 0; m < CPL; m++)
#pragma unroll
        for (int e = 0; e < VEC; e++)
            if (!((sel >> (m * VEC + e)) & 1u))
                am = amax_with_key(am, key_at(m, e));
    am = seg_max(am, L);

    if (!r.valid)
        return;
    if (sink) {
        finish_scale(r, a, sl, pay, false, 0.0f);
        store_sink_row(r, a, sl, pay);
        return;
    }
    const float inv = finish_scale(r, a, sl, pay, live, kvq_f32_from_bits(am));
    const bool vstore = g.D % VEC == 0;
#pragma unroll
    for (int m = 0; m < CPL; m++) {
        const int ci = m * L + sl;
        if (ci >= C)
            continue;
        const int d0 = ci * VEC;
        unsigned char *cp = pay + g.l.codes + (size_t)r.t * g.D + d0;
        uint32_t w[VEC / 4];
#pragma unroll
        for (int q = 0; q < VEC / 4; q++) {
            float v[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int p = m * VEC + 4 * q + e;
                v[e] = (sel >> p) & 1u ? 0.0f : widen<DT>(raw_elem<DT>(r.raw[m], 4 * q + e));
            }
            w[q] = encode2(v[0], v[1], g.scheme, inv, inv) |
                   (encode2(v[2], v[3], g.scheme, inv, inv) << 16);
        }
        if (vstore) {
            if constexpr (VEC == 8)
                *reinterpret_cast<uint2 *>(cp) = make_uint2(w[0], w[1]);
            else
                *reinterpret_cast<uint32_t *>(cp) = w[0];
        } else {
#pragma unroll
            for (int e = 0; e < VEC; e++)
                if (d0 + e < g.D)
                    cp[e] = (unsigned char)(w[e / 4] >> ((e % 4) * 8));
        }
    }
}

template <int DT, int CPL>
__device__ __forceinline__ void do_row(const Row<DT, CPL> &r, const VArgs &a, int sl)
{
    const bool sink = r.valid && r.t < a.g.S;
    const bool live = r.valid && !sink;
    if constexpr (DT != KVS_DTYPE_FP32) {
        if (a.g.D % 8 == 0) { /* D: launch-uniform; FULL: warp-uniform (one vote) */
            const bool full = live && (CPL - 1) * (1 << a.lg) + sl < (a.g.D >> 3);
            if (__all_sync(0xFFFFFFFFu, full) ? row_fast<DT, CPL, true>(r, a, sl, sink, live)
                                              : row_fast<DT, CPL, false>(r, a, sl, sink, live))
                return;
        }
    }
    row_general(r, a, sl, sink, live);
}

/* Register budget by row slice: the 4-chunk fast path keeps 32 keys and two rows of
 * raw chunks live (~170 registers unbounded; 127 without spills at 2 blocks/SM). */
template <int CPL> struct VOcc {
    static constexpr int blocks = CPL >= 8 ? 1 : CPL == 4 ? 2 : 3;
};

template <int DT, int CPL>
__global__ void __launch_bounds__(kThreads, VOcc<CPL>::blocks) quant_v_kernel(const VArgs a)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sl = lane & ((1 << a.lg) - 1), seg = lane >> a.lg;
    const unsigned nw = gridDim.x * (unsigned)kWarps;
    unsigned grp = blockIdx.x * (unsigned)kWarps + (unsigned)warp;
    Row<DT, CPL> cur, nxt;
    load_row(cur, a, grp, seg, sl);
    for (; grp < a.groups; grp += nw) { /* warp-uniform: the shuffles see all 32 lanes */
        load_row(nxt, a, grp + nw, seg, sl);
        do_row(cur, a, sl);
        cur = nxt;
    }
}

template <int DT, int CPL>
int launch_v(const VArgs &a, unsigned n, cudaStream_t s, const DevInfo &di)
{
    void (*kernel)(const VArgs) = quant_v_kernel<DT, CPL>;
    static int per_sm = 0; /* resident blocks per multiprocessor, once per kernel */
    if (per_sm == 0) {
        int b = 0;
        KVS_CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, kThreads, 0));
        per_sm = b > 0 ? b : 1;
    }
    (void)n;
    size_t want = ((size_t)a.groups + kWarps - 1) / kWarps;
    size_t cap = (size_t)per_sm * (size_t)di.sms;
    unsigned grid = (unsigned)(want < cap ? want : cap);
    KVS_CK(launch(kernel, grid > 0 ? grid : 1u, 0, s, a));
    return KVS_OK;
}

template <int DT>
int dispatch_v(const VArgs &a, int cpl, unsigned n, cudaStream_t s, const DevInfo &di)
{
    switch (cpl) {
    case 1:
        return launch_v<DT, 1>(a, n, s, di);
    case 2:
        return launch_v<DT, 2>(a, n, s, di);
    case 4:
        return launch_v<DT, 4>(a, n, s, di);
    default:
        if constexpr (Src<DT>::vec == 4)
            return launch_v<DT, 8>(a, n, s, di);
        return kvs__cuda_failf(KVS_EINTERNAL, "V tile: no kernel for %d chunks per lane", cpl);
    }
}

} // namespace

int quant_v(const Geo &g, int dtype, const kvs_cuda_tile_job *jobs, unsigned n, cudaStream_t s,
            const DevInfo &di, int lane_chunks)
{
    const int vec = dtype == KVS_DTYPE_FP32 ? 4 : 8;
    const int C = (g.D + vec - 1) / vec; /* chunks per row, 1..256 */
    /* Up to 4 chunks (32 fp16/bf16 or 16 fp32 elements) per lane, more for
     * the widest fp32 rows: per-row and per-round work is shared by more
     * elements, and a lane still holds the whole row slice in registers. */
    int cpl_max = dtype == KVS_DTYPE_BF16 ? 2 : 4; /* bf16 at 4: ~190 registers */
    if (lane_chunks == 1 || lane_chunks == 2 || lane_chunks == 4 ||
        (lane_chunks == 8 && dtype == KVS_DTYPE_FP32))
        cpl_max = lane_chunks;
    if (dtype == KVS_DTYPE_FP32 && C > 32 * cpl_max)
        cpl_max = 8; /* the widest fp32 rows need 8 chunks per lane */
    else if (C > 32 * cpl_max)
        cpl_max = 4;
    int cpl = 1;
    while (cpl < cpl_max && cpl < C)
        cpl *= 2;
    const unsigned long long rows = (unsigned long long)n * (unsigned)g.T;
    if (lane_chunks == 0) {
        /* A small launch spreads over more warps (fewer chunks per lane) until it
         * has a block for every multiprocessor, as long as a row fits a warp. */
        while (cpl > 1 && C <= 32 * (cpl / 2)) {
            int l = 0;
            while ((1 << l) * cpl < C)
                l++;
            unsigned long long blocks = (rows + (32u >> l) * kWarps - 1) / ((32u >> l) * kWarps);
            if (blocks >= (unsigned long long)di.sms)
                break;
            cpl /= 2;
        }
    }
    int lg = 0;
    while ((1 << lg) * cpl < C)
        lg++;
    const unsigned rpw = 32u >> lg;
    const unsigned long long groups = (rows + rpw - 1) / rpw;
    if (rows > 0xFFFFFFFFull - 32u * kThreads * 2u)
        return kvs__cuda_failf(KVS_EINVAL, "V tiles: %llu rows in one launch is too many", rows);
    VArgs a;
    a.g = g;
    a.jobs = jobs;
    a.rows = (unsigned)rows;
    a.groups = (unsigned)groups;
    a.lg = lg;
    switch (dtype) {
    case KVS_DTYPE_FP16:
        return dispatch_v<KVS_DTYPE_FP16>(a, cpl, n, s, di);
    case KVS_DTYPE_BF16:
        return dispatch_v<KVS_DTYPE_BF16>(a, cpl, n, s, di);
    default:
        return dispatch_v<KVS_DTYPE_FP32>(a, cpl, n, s, di);
    }
}

} // namespace kvs_tile
