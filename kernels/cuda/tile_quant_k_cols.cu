/*
 * tile_quant_k_cols.cu — alternative K-tile quantize kernels ("column warps"),
 * selected with kvs_cuda_tile_tuning.k_variant = 1, 2, 3 or 4 (tile_api.cu);
 * the strip kernel of tile_quant_k.cu stays the default until these are
 * measured. Variant 4 is variant 1 with the T rows split into 64-row slices,
 * one block each, over two launches (scan -> scratch, then merge + encode), for
 * launches with few tiles (see the phases at KCArgs).
 *
 * A block owns (tile, C consecutive channels), C = 32 * CPL: every lane of its
 * 8 warps owns the same CPL consecutive channels (LB = CPL * element size bytes
 * per lane: 4, 8 or 16 for variants 1, 2, 3), so one warp load of a row moves
 * 32 * LB contiguous bytes (128, 256, 512: whole 32-byte sectors, coalesced).
 * Warp w streams rows t = w, w + 8, w + 16, ... (U rows per batch, all loads of
 * a batch issued before any is used). No shared-memory staging:
 *   1. scan    each lane keeps, in registers, per channel, the top-k (k <= 4)
 *              of its rows as a descending list of exact keys (rank of |x| per
 *              kvq__abs_key, then 0xFFFF - t: ties to the lowest token; 32-bit
 *              for fp16/bf16, 64-bit for fp32) and amax = the largest finite |x|
 *              (as bits) of every element that is not / no longer on its list;
 *   2. merge   the 8 lists of a channel go to shared memory; one thread per
 *              channel picks the k best (the group's outliers, rank order),
 *              folds the other list entries into the amax, writes the outlier
 *              slots and the scale, and its reciprocal goes to shared memory;
 *   3. encode  each warp re-reads its rows (L2-resident: the block's working
 *              set is T * C * element size bytes, read moments earlier) and
 *              writes LB / esize codes per lane per row (rows t < S: sinks);
 *   4. fix-up  after a barrier, the merge threads write code 0 at their
 *              outliers (the encode pass wrote a code there first).
 * Per element: ~6 integer instructions to scan (abs, key, compare, max), the
 * pair conversion to encode; DRAM traffic = source once + codes once (the
 * second read hits L2). k > 4 falls back to the strip kernel (the launcher).
 * Same bytes as kvs_tile_quantize_ref, checksum 0, header and padding written
 * by block (tile, channel group 0).
 */
#include "tile_dev.cuh"

#include "kvs_cuda_internal.h"
#include "kvs_error.h"

#include <type_traits>

namespace kvs_tile
{
namespace
{

constexpr int kMaxK = 4; /* outliers per group the register lists hold */

struct KCArgs {
    Geo g;
    const kvs_cuda_tile_job *jobs;
    int groups; /* channel groups per tile */
    int slices; /* row slices per tile (1 unless split) */
    int rows;   /* rows per slice */
    void *scratch; /* split: per (tile, group): [slices][kMaxK][C] keys, then [slices][C] amax */
};

/* Phases: 0 = whole tile in one block (variants 1-3); split (variant 4):
 * 1 = scan a row slice, merge its 8 warps' lists into the slice's top-k + amax
 * (scratch); 2 = merge the slices' lists, write slots and scales (slice 0),
 * encode the slice's rows. */

/* Key type and bit facts of a source type. */
template <int DT> struct KC {
    static constexpr bool wide = DT == KVS_DTYPE_FP32;
    using Key = typename std::conditional<wide, uint64_t, uint32_t>::type;
    static constexpr uint32_t absmask = wide ? 0x7FFFFFFFu : 0x7FFFu;
    static constexpr uint32_t infbits =
        wide ? 0x7F800000u : (DT == KVS_DTYPE_FP16 ? 0x7C00u : 0x7F80u);
    static constexpr int shift = wide ? 32 : 16;
};

/* Rank of an |x| bit pattern: 0 = no element, 1 = NaN, |x| + 2 otherwise
 * (kvq__abs_key + 1: Inf above every finite value, NaN below every number). */
template <int DT> __device__ __forceinline__ typename KC<DT>::Key make_key(uint32_t a, int t)
{
    using Key = typename KC<DT>::Key;
    const uint32_t r = a > KC<DT>::infbits ? 1u : a + 2u;
    return ((Key)r << KC<DT>::shift) | (Key)(0xFFFFu - (uint32_t)t);
}

/* The finite |x| bits of a key's element, 0 for NaN / Inf / no element. */
template <int DT> __device__ __forceinline__ uint32_t key_fin_abs(typename KC<DT>::Key key)
{
    const uint32_t r = (uint32_t)(key >> KC<DT>::shift);
    const uint32_t a = r - 2u;
    return (r >= 2u && a < KC<DT>::infbits) ? a : 0u;
}

template <int DT> __device__ __forceinline__ uint32_t fin_abs(uint32_t a)
{
    return a < KC<DT>::infbits ? a : 0u;
}

/* LB bytes from p (aligned to LB) as words; LB = 2 gives one 16-bit element. */
template <int LB> __device__ __forceinline__ void load_lane(const unsigned char *p, uint32_t (&w)[4])
{
    if constexpr (LB == 16) {
        const uint4 v = *reinterpret_cast<const uint4 *>(p);
        w[0] = v.x;
        w[1] = v.y;
        w[2] = v.z;
        w[3] = v.w;
    } else if constexpr (LB == 8) {
        const uint2 v = *reinterpret_cast<const uint2 *>(p);
        w[0] = v.x;
        w[1] = v.y;
        w[2] = w[3] = 0;
    } else if constexpr (LB == 4) {
        w[0] = *reinterpret_cast<const unsigned int *>(p);
        w[1] = w[2] = w[3] = 0;
    } else {
        w[0] = *reinterpret_cast<const unsigned short *>(p);
        w[1] = w[2] = w[3] = 0;
    }
}

template <int DT> __device__ __forceinline__ uint32_t elem_of(const uint32_t (&w)[4], int e)
{
    if (KC<DT>::wide)
        return w[e];
    return (w[e >> 1] >> ((e & 1) * 16)) & 0xFFFFu;
}

/* The lane's CPL elements of row t (d0 = its first channel); elements at or
 * beyond D read as 0 (never looked at: the caller masks them). */
template <int DT, int CPL>
__device__ __forceinline__ void load_row(const unsigned char *src, size_t rowb, int t, int d0,
                                         int D, bool vload, uint32_t (&w)[4])
{
    constexpr int ES = Src<DT>::esize;
    const unsigned char *row = src + (size_t)t * rowb;
    if (vload) {
        load_lane<CPL * ES>(row + (size_t)d0 * ES, w);
        return;
    }
    w[0] = w[1] = w[2] = w[3] = 0;
#pragma unroll
    for (int e = 0; e < CPL; e++)
        if (d0 + e < D) {
            const uint32_t r = ES == 4 ? *reinterpret_cast<const uint32_t *>(row + (size_t)(d0 + e) * 4)
                                       : (uint32_t) * reinterpret_cast<const uint16_t *>(
                                                          row + (size_t)(d0 + e) * 2);
            if (ES == 4)
                w[e] = r;
            else
                w[e >> 1] |= r << ((e & 1) * 16);
        }
}

template <int DT, int CPL, int PHASE>
__global__ void __launch_bounds__(kThreads) quant_kc_kernel(const KCArgs a)
{
    using Key = typename KC<DT>::Key;
    constexpr int ES = Src<DT>::esize, C = 32 * CPL, LB = CPL * ES;
    constexpr int U = LB >= 16 ? 4 : 8; /* rows per load batch */
    const Geo &g = a.g;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int slice = (int)(blockIdx.x % (unsigned)a.slices);
    const int tile = (int)(blockIdx.x / (unsigned)a.slices) / a.groups,
              grp = (int)(blockIdx.x / (unsigned)a.slices) % a.groups;
    const kvs_cuda_tile_job job = a.jobs[tile];
    const int c0 = grp * C, d0 = c0 + lane * CPL;
    const int D = g.D, S = g.S, k = g.k;
    const int r0 = slice * a.rows, r1 = min(g.T, r0 + a.rows); /* this block's rows */
    const unsigned char *src = static_cast<const unsigned char *>(job.src);
    const size_t rowb = job.stride * ES;
    const bool vload = ((uintptr_t)src % LB) == 0 && rowb % LB == 0 && D % CPL == 0;
    unsigned char *tilep = static_cast<unsigned char *>(job.dst);
    unsigned char *pay = tilep + sizeof(kvs_tile_hdr);
    const bool active = d0 < D;
    int nv = D - d0; /* channels of this lane present */
    nv = nv < 0 ? 0 : nv > CPL ? CPL : nv;

    /* shared: lists [8][kMaxK][C] Key, amax [8][C] u32, inv [C] f32, outlier t [kMaxK][C] */
    unsigned char *sm = dyn_smem();
    Key *s_list = reinterpret_cast<Key *>(sm);
    uint32_t *s_am = reinterpret_cast<uint32_t *>(s_list + kWarps * kMaxK * C);
    float *s_inv = reinterpret_cast<float *>(s_am + kWarps * C);
    int *s_ot = reinterpret_cast<int *>(s_inv + C);

    Key *scr_list = nullptr;
    uint32_t *scr_am = nullptr;
    if (PHASE != 1 && grp == 0 && slice == 0 && tid == 0) {
        write_header(tilep, g, job.static_scales != NULL);
        write_pads(pay, g);
    }

    /* 1. scan */
    Key L[CPL][kMaxK];
    Key thr[CPL];
    uint32_t am[CPL];
    uint32_t special = 0;
#pragma unroll
    for (int e = 0; e < CPL; e++) {
        am[e] = 0;
        thr[e] = k > 0 ? (Key)0 : ~(Key)0;
#pragma unroll
        for (int s = 0; s < kMaxK; s++)
            L[e][s] = 0;
    }
    if (active && PHASE != 2) {
        for (int t0 = max(S, r0) + warp; t0 < r1; t0 += U * kWarps) {
            uint32_t w[U][4];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int t = t0 + u * kWarps;
                if (t < r1)
                    load_row<DT, CPL>(src, rowb, t, d0, D, vload, w[u]);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int t = t0 + u * kWarps;
                if (t >= r1)
                    continue;
#pragma unroll
                for (int e = 0; e < CPL; e++) {
                    if (e >= nv)
                        continue;
                    const uint32_t ab = elem_of<DT>(w[u], e) & KC<DT>::absmask;
                    special |= ab >= KC<DT>::infbits ? 1u : 0u;
                    const Key key = make_key<DT>(ab, t);
                    if (key > thr[e]) {
                        Key x = key;
#pragma unroll
                        for (int s = 0; s < kMaxK; s++)
                            if (s < k) {
                                const Key hi = L[e][s] > x ? L[e][s] : x;
                                x = L[e][s] > x ? x : L[e][s];
                                L[e][s] = hi;
                            }
                        am[e] = max(am[e], key_fin_abs<DT>(x)); /* pushed out (0: none) */
                        /* The k-th entry (0 while the list is not full), as
                         * a min so that no list slot is indexed at run time
                         * (L stays in registers). */
                        Key th = ~(Key)0;
#pragma unroll
                        for (int s = 0; s < kMaxK; s++)
                            if (s < k)
                                th = L[e][s] < th ? L[e][s] : th;
                        thr[e] = th;
                    } else {
                        am[e] = max(am[e], fin_abs<DT>(ab));
                    }
                }
            }
        }
    }
#pragma unroll
    for (int e = 0; e < CPL; e++) {
        const int c = lane * CPL + e;
#pragma unroll
        for (int s = 0; s < kMaxK; s++)
            if (s < k)
                s_list[(warp * kMaxK + s) * C + c] = L[e][s];
        s_am[warp * C + c] = am[e];
    }
    const bool any_special = __syncthreads_or((int)special) != 0 || PHASE == 2;

    /* 2. merge: one thread per channel, over nl lists of k (phase 0, 1: the 8
     * warps' lists in shared memory; phase 2: the slices' lists in scratch). */
    Key *m_list = s_list;
    uint32_t *m_am = s_am;
    int nl = kWarps;
    if (PHASE != 0) {
        Key *sc = reinterpret_cast<Key *>(
            static_cast<unsigned char *>(a.scratch) +
            ((size_t)tile * a.groups + grp) * (size_t)a.slices * C * (kMaxK * sizeof(Key) + 4));
        if (PHASE == 2) {
            m_list = sc;
            m_am = reinterpret_cast<uint32_t *>(sc + (size_t)a.slices * kMaxK * C);
            nl = a.slices;
        }
        scr_list = sc + (size_t)slice * kMaxK * C;
        scr_am = reinterpret_cast<uint32_t *>(sc + (size_t)a.slices * kMaxK * C) + (size_t)slice * C;
    }
    for (int c = tid; c < C; c += kThreads) {
        const int d = c0 + c;
        if (d >= D)
            break;
        uint32_t amx = 0;
        for (int ww = 0; ww < nl; ww++)
            amx = max(amx, m_am[ww * C + c]);
        unsigned char *slots = pay + g.l.outliers + (size_t)d * (uint32_t)k * g.l.entry;
        Key prev = ~(Key)0;
        int got = 0;
        for (int r = 0; r < k; r++) {
            Key best = 0;
            for (int ww = 0; ww < nl; ww++)
                for (int s = 0; s < k; s++) {
                    const Key e = m_list[(ww * kMaxK + s) * C + c];
                    if (e < prev && e > best)
                        best = e;
                }
            if (PHASE == 1) {
                scr_list[r * C + c] = best;
                if (best != 0)
                    prev = best, got++;
                continue;
            }
            uint32_t index = KVS_OUTLIER_EMPTY;
            uint16_t value = 0;
            int ot = -1;
            if (best != 0) {
                ot = (int)(0xFFFFu - (uint32_t)(best & 0xFFFFu));
                if (slice == 0) {
                    const unsigned char *ep = src + (size_t)ot * rowb + (size_t)d * ES;
                    const uint32_t raw = ES == 4
                                             ? *reinterpret_cast<const uint32_t *>(ep)
                                             : (uint32_t) * reinterpret_cast<const uint16_t *>(ep);
                    index = (uint32_t)ot;
                    value = exact_fp16<DT>(raw);
                }
                prev = best;
                got++;
            }
            if (slice == 0)
                kvs_outlier_put(slots + (uint32_t)r * g.l.entry, g.l.entry, index, value);
            s_ot[r * C + c] = ot;
        }
        if (got == k && k > 0) /* list entries ranked below the k-th pick are not outliers */
            for (int ww = 0; ww < nl; ww++)
                for (int s = 0; s < k; s++) {
                    const Key e = m_list[(ww * kMaxK + s) * C + c];
                    if (e < prev)
                        amx = max(amx, key_fin_abs<DT>(e));
                }
        if (PHASE == 1) {
            scr_am[c] = amx;
            continue;
        }
        uint16_t scale; /* stored as fp16, rounded up, aligned (stored_scale) */
        if (job.static_scales != NULL) {
            scale = stored_scale(g, job.static_scales[d]);
        } else {
            const float amax =
                KC<DT>::wide ? kvq_f32_from_bits(amx) : (amx != 0 ? widen<DT>(amx) : 0.0f);
            scale = stored_scale(g, kvq_scale_from_amax(amax, g.qmax));
        }
        if (slice == 0)
            reinterpret_cast<uint16_t *>(pay + g.l.scales)[d] = scale;
        s_inv[c] = kvq_scale_inv(kvq_fp16_to_f32(scale));
    }
    if (PHASE == 1)
        return;
    __syncthreads();

    /* 3. encode (and sinks) */
    if (active) {
        float iv[CPL];
#pragma unroll
        for (int e = 0; e < CPL; e++)
            iv[e] = s_inv[lane * CPL + e];
        const bool vstore = D % CPL == 0;
        for (int t0 = r0 + warp; t0 < r1; t0 += U * kWarps) {
            uint32_t w[U][4];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int t = t0 + u * kWarps;
                if (t < r1)
                    load_row<DT, CPL>(src, rowb, t, d0, D, vload, w[u]);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int t = t0 + u * kWarps;
                if (t >= r1)
                    continue;
                unsigned char *cp = pay + g.l.codes + (size_t)t * D + d0;
                uint32_t cw[(CPL + 3) / 4];
#pragma unroll
                for (int q = 0; q < (CPL + 3) / 4; q++)
                    cw[q] = 0;
                if (t < S) {
                    uint16_t *sp = reinterpret_cast<uint16_t *>(pay + g.l.sinks) + (size_t)t * D + d0;
#pragma unroll
                    for (int e = 0; e < CPL; e++)
                        if (e < nv)
                            sp[e] = exact_fp16<DT>(elem_of<DT>(w[u], e));
                } else {
#pragma unroll
                    for (int e = 0; e < CPL; e += 2) {
                        const float xa = widen<DT>(elem_of<DT>(w[u], e));
                        const float xb = e + 1 < CPL ? widen<DT>(elem_of<DT>(w[u], e + 1)) : 0.0f;
                        const float ib = e + 1 < CPL ? iv[e + 1] : 0.0f;
                        const uint32_t c2 = any_special
                                                ? encode2<true>(xa, xb, g.scheme, iv[e], ib)
                                                : encode2<false>(xa, xb, g.scheme, iv[e], ib);
                        cw[e / 4] |= (c2 & (e + 1 < CPL ? 0xFFFFu : 0xFFu)) << ((e % 4) * 8);
                    }
                }
                if (vstore) {
                    if constexpr (CPL == 8)
                        *reinterpret_cast<uint2 *>(cp) = make_uint2(cw[0], cw[1]);
                    else if constexpr (CPL == 4)
                        *reinterpret_cast<uint32_t *>(cp) = cw[0];
                    else if constexpr (CPL == 2)
                        *reinterpret_cast<uint16_t *>(cp) = (uint16_t)cw[0];
                    else
                        *cp = (unsigned char)cw[0];
                } else {
#pragma unroll
                    for (int e = 0; e < CPL; e++)
                        if (e < nv)
                            cp[e] = (unsigned char)(cw[e / 4] >> ((e % 4) * 8));
                }
            }
        }
    }
    if (k == 0)
        return;
    __syncthreads();

    /* 4. outliers' codes are 0 */
    for (int c = tid; c < C; c += kThreads) {
        const int d = c0 + c;
        if (d >= D)
            break;
        for (int r = 0; r < k; r++) {
            const int ot = s_ot[r * C + c];
            if (ot >= r0 && ot < r1) /* split: only this block's rows */
                pay[g.l.codes + (size_t)ot * D + d] = 0;
        }
    }
}

template <int CPL> size_t kc_smem_bytes(int es)
{
    const size_t C = 32 * CPL, key = es == 4 ? 8 : 4;
    return kWarps * kMaxK * C * key + kWarps * C * 4 + C * 4 + kMaxK * C * 4;
}

/* Split variant: the scratch buffer, grown as needed, never freed (one per
 * process; launches on different streams must not overlap, like the tuning). */
void *g_scratch = nullptr;
size_t g_scratch_bytes = 0;

template <int DT, int CPL>
int launch_kc(const Geo &g, const kvs_cuda_tile_job *jobs, unsigned n, cudaStream_t s, bool split)
{
    constexpr int C = 32 * CPL;
    const unsigned groups = (unsigned)((g.D + C - 1) / C);
    const int rows = split ? 64 : g.T;
    const unsigned slices = (unsigned)((g.T + rows - 1) / rows);
    if ((size_t)n * groups * slices > 0x7FFFFFFFu)
        return kvs__cuda_failf(KVS_EINVAL, "K tiles: %u tiles x %u channel groups is too many blocks",
                               n, groups);
    KCArgs a;
    a.g = g;
    a.jobs = jobs;
    a.groups = (int)groups;
    a.slices = (int)slices;
    a.rows = rows;
    a.scratch = nullptr;
    const size_t smem = kc_smem_bytes<CPL>(Src<DT>::esize);
    const unsigned blocks = n * groups * slices;
    if (!split) {
        KVS_CK(launch(quant_kc_kernel<DT, CPL, 0>, blocks, smem, s, a));
        return KVS_OK;
    }
    const size_t key = Src<DT>::esize == 4 ? 8 : 4;
    const size_t need = (size_t)blocks * C * (kMaxK * key + 4);
    if (need > g_scratch_bytes) {
        if (g_scratch != nullptr) {
            KVS_CK(cudaStreamSynchronize(s));
            KVS_CK(cudaFree(g_scratch));
            g_scratch = nullptr;
            g_scratch_bytes = 0;
        }
        KVS_CK(cudaMalloc(&g_scratch, need));
        g_scratch_bytes = need;
    }
    a.scratch = g_scratch;
    KVS_CK(launch(quant_kc_kernel<DT, CPL, 1>, blocks, smem, s, a));
    KVS_CK(launch(quant_kc_kernel<DT, CPL, 2>, blocks, smem, s, a));
    return KVS_OK;
}

} // namespace

bool quant_k_cols_supported(const Geo &g)
{
    return g.k <= kMaxK && !g.koff; /* key offsets: the strip kernel */
}

int quant_k_cols(const Geo &g, int dtype, const kvs_cuda_tile_job *jobs, unsigned n,
                 cudaStream_t s, int variant)
{
    /* Lane bytes 4 / 8 / 16 for variants 1 / 2 / 3; variant 4: 4, rows split
     * into slices of 64 over two launches. */
    const bool split = variant == 4;
    if (dtype == KVS_DTYPE_FP32)
        return variant == 2   ? launch_kc<KVS_DTYPE_FP32, 2>(g, jobs, n, s, false)
               : variant == 3 ? launch_kc<KVS_DTYPE_FP32, 4>(g, jobs, n, s, false)
                              : launch_kc<KVS_DTYPE_FP32, 1>(g, jobs, n, s, split);
    if (dtype == KVS_DTYPE_BF16)
        return variant == 2   ? launch_kc<KVS_DTYPE_BF16, 4>(g, jobs, n, s, false)
               : variant == 3 ? launch_kc<KVS_DTYPE_BF16, 8>(g, jobs, n, s, false)
                              : launch_kc<KVS_DTYPE_BF16, 2>(g, jobs, n, s, split);
    return variant == 2   ? launch_kc<KVS_DTYPE_FP16, 4>(g, jobs, n, s, false)
           : variant == 3 ? launch_kc<KVS_DTYPE_FP16, 8>(g, jobs, n, s, false)
                          : launch_kc<KVS_DTYPE_FP16, 2>(g, jobs, n, s, split);
}

} // namespace kvs_tile
