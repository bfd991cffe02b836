/*
 * tile_quant_k.cu — quantize K tiles (one scale group per channel d, over the
 * T - S non-sink tokens) for the 8-bit schemes.
 *
 * A group is a column of the row-major [T][D] source, and it needs three
 * looks (top-k, amax of the rest, encode), so a block stages a *strip* — all
 * T rows of pitch bytes (16, 32 or 64: 8/16/32 fp16 or 4/8/16 fp32 channels)
 * — in shared memory once, with cp.async (16-byte chunks, coalesced along
 * rows), and never reads global memory again:
 *   1. load   the strip -> shared memory (rows t < S too: they become sinks);
 *   2. scan   each thread walks its channel(s) over tokens S + j, S + j + P, ...
 *             keeping its own top-k as a sorted list (k <= 4 in the fast form:
 *             in registers, a branch-free max/min chain, stored to shared
 *             memory at the end; otherwise in shared memory) and the amax of
 *             everything that is not (or no longer) on its list;
 *   3. merge  the k best of the P lists are the group's outliers, in rank
 *             order; every other list entry folds into the amax; the outlier
 *             slots and the scale are written, and each outlier in the staged
 *             strip is overwritten with +0 (which encodes to code 0, the
 *             outlier's code). Fast form, k <= 4 (merge_fast_regs): 8 lanes
 *             per channel push their slices' lists through their own chains
 *             and trade lists in three xor shuffles; fast form, k > 4
 *             (merge_fast): one warp per channel, one warp max per rank, then
 *             one thread per channel for slots and scale; general form: one
 *             thread per channel;
 *   4. encode each thread walks one 16-byte chunk position down the rows:
 *             codes (rows t < S: 0 and their fp16 values into the sink
 *             region).
 * Key offsets (kv_format.h rule 5, launch-uniform): after step 1 the lanes
 * of a warp compute each channel's offset m (kvq_offset_collect over slices
 * of its non-sink tokens, merged by shuffles) and write it to the tile;
 * steps 2-4 then take the general form on y = x - m, outlier slots keep
 * fp16(x), and outliers are marked in a bit mask (T words) instead of being
 * zeroed in the strip, since +0 - m is not 0.
 * Steps 2-3 have two forms, same bytes out: fast (fp16/bf16, D even, and no
 * NaN/Inf in the strip, decided by one __syncthreads_or): a thread takes a
 * channel pair with one 32-bit shared load and ranks by the exact 32-bit key
 * (|h| << 16 | 0xFFFF - t); general (fp32, NaN, ±Inf, odd D): one channel per
 * thread, u64 keys (kvq__abs_key << 32 | 0xFFFF - t). The union of per-thread
 * lists holds the group's top-k (each list is exact for its thread's tokens,
 * ties included, because it sees them in increasing t), so the result equals
 * kvq_topk_abs on the whole group. Block (tile, strip 0) also writes the
 * header and the zero padding.
 *
 * Shared memory: T * pitch (strip) + k * kRow * 4 (lists) + kRow * 4 (amax)
 * + 32 * 4 (reciprocal scales) + 32 * 16 * 4 + 32 * 4 (merge_fast's picks
 * and amax) + with key offsets 32 * 4 + T * 4 (offsets, outlier mask). The
 * fast form keeps list slot s of thread
 * (slice j, pair c2, channel ch) at word s * kRow + j * (2H + 1) + 2 * c2 + ch:
 * the odd row pitch 2H + 1 lets a warp read one channel's P slices, or eight
 * slices of four channels 8 apart, without bank conflicts (P * (2H + 1) =
 * 512 + P <= kRow words); the general form
 * uses the same bytes as u64 [k][256] lists and a u32 [256] amax.
 *
 * fp16-scheme tiles (no groups) go through tile_dequant.cu's row kernel.
 */
#include "tile_dev.cuh"

#include "kvs_cuda_internal.h"
#include "kvs_error.h"

namespace kvs_tile
{
namespace
{

struct KArgs {
    Geo g;
    const kvs_cuda_tile_job *jobs;
    int strips; /* strips per tile */
    int pitch;  /* staged bytes per source row: 16, 32 or 64 */
};

/* Blocks per multiprocessor the K kernel is built for: 5 keeps it at 48 registers
 * without spills (sm_80 and newer hold 1,536 or 2,048 threads per multiprocessor);
 * sm_75 holds 1,024, so 4 there (ptxas rejects a bound beyond the device). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
constexpr int kKMinBlocks = 4;
#else
constexpr int kKMinBlocks = 5;
#endif

constexpr int kRow = 576; /* words per list slot row: >= 512 + P, P <= 64; 16-byte multiple */

size_t k_smem_bytes(const Geo &g, int pitch)
{
    return (size_t)g.T * pitch + (size_t)g.k * kRow * 4 + kRow * 4 + 32 * 4 +
           32 * KVS_TILE_MAX_OUTLIERS * 4 + 32 * 4 + (g.koff ? 32 * 4 + (size_t)g.T * 4 : 0);
}

/* Shared-memory views of one block. */
struct KSmem {
    unsigned char *stage; /* [T][pitch] raw source bytes */
    uint64_t *lists;      /* general: [k][256] u64; fast: [k][kRow] u32 (see above) */
    uint32_t *amx;        /* general: [256]; fast: [kRow] */
    float *inv;           /* [32] reciprocal scales of the strip's channels */
    uint32_t *picked;     /* fast merge: [32][KVS_TILE_MAX_OUTLIERS] the picked keys */
    uint32_t *amc;        /* fast merge: [32] each channel's amax key */
    float *moff;          /* key offsets: [32] each channel's offset m (fp32 of its fp16) */
    uint32_t *omask;      /* key offsets: [T] bit c of row t set when (t, c) is an outlier */
};

template <int DT>
__device__ __forceinline__ uint32_t stage_raw(const KSmem &m, int pitch, int t, int c)
{
    const unsigned char *ep = m.stage + (size_t)t * pitch + c * Src<DT>::esize;
    return Src<DT>::esize == 4 ? *reinterpret_cast<const uint32_t *>(ep)
                               : (uint32_t) * reinterpret_cast<const uint16_t *>(ep);
}

template <int DT>
__device__ __forceinline__ void stage_zero(const KSmem &m, int pitch, int t, int c)
{
    unsigned char *ep = m.stage + (size_t)t * pitch + c * Src<DT>::esize;
    if (Src<DT>::esize == 4)
        *reinterpret_cast<uint32_t *>(ep) = 0;
    else
        *reinterpret_cast<uint16_t *>(ep) = 0;
}

/* Insert key into a descending list of at most k entries (slot s of this
 * list at l[s * step]); returns the entry pushed out (0 if none). */
template <typename K>
__device__ __forceinline__ K list_insert(K *l, int step, int k, int &cnt, K key)
{
    K out = 0;
    int pos;
    if (cnt < k) {
        pos = cnt++;
    } else {
        pos = k - 1;
        out = l[pos * step];
    }
    while (pos > 0 && l[(pos - 1) * step] < key) {
        l[pos * step] = l[(pos - 1) * step];
        pos--;
    }
    l[pos * step] = key;
    return out;
}

/*
 * Fast scan (16-bit sources, D even): thread (pair c2, slice j) reads both
 * channels of a pair with one 32-bit shared load. key = (|h| << 16) |
 * (0xFFFF - t) is exact and unique in 32 bits (fp16/bf16 bits order like |x|;
 * larger key = larger |x|, then lower t). Everything not on a list goes into
 * the amax as a key (max key = max |x|). Returns whether it met a NaN or Inf
 * (then the block redoes the scan the general way).
 */
/* The fast scan's loop for k = KK <= 4: both channels' lists in registers,
 * each key pushed through them by a max/min chain (no branch, so no warp
 * divergence on the many inserts of the first tokens); what falls out of the
 * chain goes into the amax. The lists are written to shared memory at the end,
 * in the layout merge_fast reads. */
template <int KK>
__device__ __forceinline__ void scan_fast_regs(const unsigned char *sp, int pitch, int t0, int T,
                                               int P, uint32_t *l0, uint32_t *l1, uint32_t &am0,
                                               uint32_t &am1)
{
    uint32_t L0[KK > 0 ? KK : 1], L1[KK > 0 ? KK : 1];
#pragma unroll
    for (int s = 0; s < KK; s++)
        L0[s] = L1[s] = 0;
    for (int t = t0; t < T; t += P) {
        const uint32_t w = *reinterpret_cast<const uint32_t *>(sp + (size_t)t * pitch);
        const uint32_t pos = 0xFFFFu - (uint32_t)t;
        uint32_t x0 = ((w << 16) & 0x7FFF0000u) | pos, x1 = (w & 0x7FFF0000u) | pos;
#pragma unroll
        for (int s = 0; s < KK; s++) {
            const uint32_t h0 = max(L0[s], x0), h1 = max(L1[s], x1);
            x0 = min(L0[s], x0);
            x1 = min(L1[s], x1);
            L0[s] = h0;
            L1[s] = h1;
        }
        am0 = max(am0, x0);
        am1 = max(am1, x1);
    }
#pragma unroll
    for (int s = 0; s < KK; s++) {
        l0[s * kRow] = L0[s];
        l1[s * kRow] = L1[s];
    }
}

template <int DT>
__device__ __forceinline__ bool scan_fast(const KSmem &m, const Geo &g, int pitch, int W, int Wc)
{
    const int tid = threadIdx.x, H = W / 2, c2 = tid % H, j = tid / H, P = kThreads / H;
    const int slot = j * (2 * H + 1) + 2 * c2;
    uint32_t *l0 = reinterpret_cast<uint32_t *>(m.lists) + slot, *l1 = l0 + 1;
    for (int s = 0; g.k > 4 && s < g.k; s++) { /* k <= 4: scan_fast_regs writes them */
        l0[s * kRow] = 0;
        l1[s * kRow] = 0;
    }
    uint32_t am0 = 0, am1 = 0;
    uint32_t thr0 = g.k ? 0u : 0xFFFFFFFFu, thr1 = thr0;
    int cnt0 = 0, cnt1 = 0;
    if (2 * c2 < Wc && g.k <= 4) { /* launch-uniform choice */
        const unsigned char *sp = m.stage + c2 * 4;
        switch (g.k) {
        case 0:
            scan_fast_regs<0>(sp, pitch, g.S + j, g.T, P, l0, l1, am0, am1);
            break;
        case 1:
            scan_fast_regs<1>(sp, pitch, g.S + j, g.T, P, l0, l1, am0, am1);
            break;
        case 2:
            scan_fast_regs<2>(sp, pitch, g.S + j, g.T, P, l0, l1, am0, am1);
            break;
        case 3:
            scan_fast_regs<3>(sp, pitch, g.S + j, g.T, P, l0, l1, am0, am1);
            break;
        default:
            scan_fast_regs<4>(sp, pitch, g.S + j, g.T, P, l0, l1, am0, am1);
            break;
        }
    } else if (2 * c2 < Wc) {
        const unsigned char *sp = m.stage + c2 * 4;
        for (int t = g.S + j; t < g.T; t += P) {
            const uint32_t w = *reinterpret_cast<const uint32_t *>(sp + (size_t)t * pitch);
            const uint32_t pos = 0xFFFFu - (uint32_t)t;
            const uint32_t k0 = ((w << 16) & 0x7FFF0000u) | pos, k1 = (w & 0x7FFF0000u) | pos;
            if (k0 > thr0) {
                am0 = max(am0, list_insert(l0, kRow, g.k, cnt0, k0));
                if (cnt0 == g.k)
                    thr0 = l0[(g.k - 1) * kRow];
            } else {
                am0 = max(am0, k0);
            }
            if (k1 > thr1) {
                am1 = max(am1, list_insert(l1, kRow, g.k, cnt1, k1));
                if (cnt1 == g.k)
                    thr1 = l1[(g.k - 1) * kRow];
            } else {
                am1 = max(am1, k1);
            }
        }
    }
    m.amx[slot] = am0;
    m.amx[slot + 1] = am1;
    uint32_t top = max(am0, am1);
    if (g.k > 0 && 2 * c2 < Wc) /* the others' lists are not written when k <= 4 */
        top = max(top, max(l0[0], l1[0]));
    return (top >> 16) >= (DT == KVS_DTYPE_FP16 ? 0x7C00u : 0x7F80u);
}

/* The largest of the warp's 32 values (every lane gets it). */
__device__ __forceinline__ uint32_t warp_max_u32(uint32_t v)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return __reduce_max_sync(0xFFFFFFFFu, v);
#else
    for (int o = 16; o > 0; o >>= 1)
        v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    return v;
#endif
}

/* Fast merge for k > 4 (k <= 4: merge_fast_regs), in two steps. 1: warp w
 * takes channels w, w + 8, ...; for each, the k best of the P lists by one
 * warp max per rank over the lanes' shares of the P * k entries (entries are
 * unique keys, so "below the last pick" skips the ones taken), then the amax:
 * the slices' own plus every entry below the last pick (if fewer than k were
 * picked, every nonzero entry was, and those below are zeros); the picks and
 * the amax go to shared memory. 2: one thread per channel writes the outlier
 * slots (and zeroes the outliers in the staged strip), the scale and its
 * reciprocal. All threads call it (it has a barrier). */
template <int DT>
__device__ __forceinline__ void merge_fast(const KSmem &m, const Geo &g, int pitch, int W, int Wc,
                                           int c0, unsigned char *pay, const float *stat)
{
    const int lane = threadIdx.x & 31, H = W / 2, P = kThreads / H, n = P * g.k;
    const int pshift = __ffs(P) - 1; /* P is a power of two: 16, 32 or 64 */
    const uint32_t *l32 = reinterpret_cast<const uint32_t *>(m.lists);
    /* Entry i of channel cc (i = s * P + slice); cc = 2 * c2 + ch is the
     * channel's word in a slice row of the lists. */
    auto entry = [&](int i, int cc) {
        return l32[(i >> pshift) * kRow + (i & (P - 1)) * (2 * H + 1) + cc];
    };
    for (int cc = threadIdx.x >> 5; cc < Wc; cc += kWarps) {
        uint32_t prev = 0xFFFFFFFFu, am = 0;
        for (int r = 0; r < g.k; r++) {
            uint32_t best = 0;
            for (int i = lane; i < n; i += 32) {
                const uint32_t e = entry(i, cc);
                if (e < prev)
                    best = max(best, e);
            }
            best = warp_max_u32(best);
            if (lane == 0)
                m.picked[cc * KVS_TILE_MAX_OUTLIERS + r] = best;
            if (best != 0)
                prev = best;
        }
        for (int jj = lane; jj < P; jj += 32)
            am = max(am, m.amx[jj * (2 * H + 1) + cc]);
        for (int i = lane; i < n; i += 32) {
            const uint32_t e = entry(i, cc);
            if (e < prev)
                am = max(am, e);
        }
        am = warp_max_u32(am);
        if (lane == 0)
            m.amc[cc] = am;
    }
    __syncthreads();
    const int cc = threadIdx.x;
    if (cc < Wc) {
        const int d = c0 + cc;
        unsigned char *slots = pay + g.l.outliers + (size_t)d * (uint32_t)g.k * g.l.entry;
        for (int r = 0; r < g.k; r++) {
            const uint32_t best = m.picked[cc * KVS_TILE_MAX_OUTLIERS + r];
            uint32_t index = KVS_OUTLIER_EMPTY;
            uint16_t value = 0;
            if (best != 0) {
                const int t = (int)(0xFFFFu - (best & 0xFFFFu));
                index = (uint32_t)t;
                value = exact_fp16<DT>(stage_raw<DT>(m, pitch, t, cc));
                stage_zero<DT>(m, pitch, t, cc);
            }
            kvs_outlier_put(slots + (uint32_t)r * g.l.entry, g.l.entry, index, value);
        }
        const uint32_t am = m.amc[cc];
        const float amax = am != 0 ? widen<DT>(am >> 16) : 0.0f;
        const uint16_t scale =
            stored_scale(g, stat != NULL ? stat[d] : kvq_scale_from_amax(amax, g.qmax));
        reinterpret_cast<uint16_t *>(pay + g.l.scales)[d] = scale;
        m.inv[cc] = kvq_scale_inv(kvq_fp16_to_f32(scale));
    }
}

/* Pushes x through the descending list L[0..KK) (max/min chain): L keeps the
 * KK largest of L and x; returns the one that fell out. */
template <int KK, int N>
__device__ __forceinline__ uint32_t chain_push(uint32_t (&L)[N], uint32_t x)
{
    static_assert(KK <= N, "the list holds KK entries");
#pragma unroll
    for (int s = 0; s < KK; s++) {
        const uint32_t h = max(L[s], x);
        x = min(L[s], x);
        L[s] = h;
    }
    return x;
}

/* Fast merge for k = KK <= 4, in registers: lane (cl, grp) of warp w takes
 * channel cc = w + 8 * cl and slices grp, grp + 8, ... (bank-conflict free on
 * the padded rows); pushes their list entries through its own list (what falls
 * out, and the slices' amax, go into its amax), then the 8 lanes of a channel
 * trade lists in three xor-shuffle steps, after which each holds the group's
 * top k (its outliers, in rank order) and the amax of the rest. Lane grp 0
 * writes the outlier slots (zeroing the outliers in the staged strip), the
 * scale and its reciprocal. Same picks and amax as merge_fast. */
template <int DT, int KK>
__device__ __forceinline__ void merge_fast_regs(const KSmem &m, const Geo &g, int pitch, int W,
                                                int Wc, int c0, unsigned char *pay,
                                                const float *stat)
{
    const int lane = threadIdx.x & 31, grp = lane & 7, cl = lane >> 3;
    const int H = W / 2, P = kThreads / H, cc = (int)(threadIdx.x >> 5) + 8 * cl;
    const uint32_t *l32 = reinterpret_cast<const uint32_t *>(m.lists);
    uint32_t L[KK > 0 ? KK : 1], am = 0;
#pragma unroll
    for (int s = 0; s < KK; s++)
        L[s] = 0;
    if (cc < Wc)
        for (int jj = grp; jj < P; jj += 8) {
            const int at = jj * (2 * H + 1) + cc;
            am = max(am, m.amx[at]);
#pragma unroll
            for (int s = 0; s < KK; s++)
                am = max(am, chain_push<KK>(L, l32[s * kRow + at]));
        }
#pragma unroll
    for (int off = 1; off < 8; off <<= 1) {
        uint32_t B[KK > 0 ? KK : 1];
#pragma unroll
        for (int s = 0; s < KK; s++)
            B[s] = __shfl_xor_sync(0xFFFFFFFFu, L[s], off);
        am = max(am, __shfl_xor_sync(0xFFFFFFFFu, am, off));
#pragma unroll
        for (int s = 0; s < KK; s++)
            am = max(am, chain_push<KK>(L, B[s]));
    }
    if (cc >= Wc || grp != 0)
        return;
    const int d = c0 + cc;
    unsigned char *slots = pay + g.l.outliers + (size_t)d * (uint32_t)KK * g.l.entry;
#pragma unroll
    for (int r = 0; r < KK; r++) {
        uint32_t index = KVS_OUTLIER_EMPTY;
        uint16_t value = 0;
        if (L[r] != 0) {
            const int t = (int)(0xFFFFu - (L[r] & 0xFFFFu));
            index = (uint32_t)t;
            value = exact_fp16<DT>(stage_raw<DT>(m, pitch, t, cc));
            stage_zero<DT>(m, pitch, t, cc);
        }
        kvs_outlier_put(slots + (uint32_t)r * g.l.entry, g.l.entry, index, value);
    }
    const float amax = am != 0 ? widen<DT>(am >> 16) : 0.0f;
    const uint16_t scale =
        stored_scale(g, stat != NULL ? stat[d] : kvq_scale_from_amax(amax, g.qmax));
    reinterpret_cast<uint16_t *>(pay + g.l.scales)[d] = scale;
    m.inv[cc] = kvq_scale_inv(kvq_fp16_to_f32(scale));
}

/* The value rules 2-3 see for element (t, c) of the strip: the source value,
 * or with key offsets y = x - m (kv_format.h rule 5). */
template <int DT>
__device__ __forceinline__ float group_val(const KSmem &m, const Geo &g, int pitch, int t, int c)
{
    const float x = widen<DT>(stage_raw<DT>(m, pitch, t, c));
    return g.koff ? kvq_offset_sub(x, m.moff[c]) : x;
}

/* Key offsets (rule 5), before the scan: each channel's non-sink tokens are
 * split over Q = min(256 / W, 32) consecutive lanes of one warp (lane j of
 * channel c takes tokens S + j, S + j + Q, ...), each collects its part's
 * ends (kvq_offset_collect), the Q parts are merged in log2(Q) xor-shuffle
 * steps (kvq_offset_merge: the values, not their order, decide), and lane 0
 * of the channel stores the fp16 offset in the tile and its fp32 value in
 * m.moff: the reference's offset (kvq_offset_trim). Every thread clears
 * m.omask. Threads beyond W * Q (a multiple of 32: whole warps) only clear. */
template <int DT>
__device__ __forceinline__ void key_offsets(const KSmem &m, const Geo &g, int pitch, int W, int Wc,
                                            int c0, unsigned char *pay)
{
    for (int t = threadIdx.x; t < g.T; t += kThreads)
        m.omask[t] = 0;
    const int Q = min(kThreads / W, 32), tid = threadIdx.x;
    if (tid >= W * Q)
        return;
    const int c = tid / Q, j = tid % Q, keep = kvq_offset_keep(g.k);
    float lo[KVQ_OFFSET_MAX_K + 1] = {}, hi[KVQ_OFFSET_MAX_K + 1] = {};
    int cnt = 0;
    if (c < Wc)
        for (int t = g.S + j; t < g.T; t += Q)
            kvq_offset_collect(lo, hi, keep, &cnt, widen<DT>(stage_raw<DT>(m, pitch, t, c)));
    for (int o = 1; o < Q; o <<= 1) { /* warp-uniform: every lane trades */
        float lo2[KVQ_OFFSET_MAX_K + 1], hi2[KVQ_OFFSET_MAX_K + 1];
        for (int i = 0; i < keep; i++) {
            lo2[i] = __shfl_xor_sync(0xFFFFFFFFu, lo[i], o);
            hi2[i] = __shfl_xor_sync(0xFFFFFFFFu, hi[i], o);
        }
        const int cnt2 = __shfl_xor_sync(0xFFFFFFFFu, cnt, o);
        kvq_offset_merge(lo, hi, keep, &cnt, lo2, hi2, cnt2);
    }
    if (j != 0 || c >= Wc)
        return;
    const uint16_t h = kvq_offset_finish(lo, hi, keep, cnt);
    reinterpret_cast<uint16_t *>(pay + g.l.offsets)[c0 + c] = h;
    m.moff[c] = kvq_fp16_to_f32(h);
}

/* General scan: any source type, NaN and ±Inf (rank_key order), one channel
 * per thread, packed u64 (rank key << 32 | 0xFFFF - t) lists; with key
 * offsets it ranks y = x - m. */
template <int DT>
__device__ __forceinline__ void scan_general(const KSmem &m, const Geo &g, int pitch, int W, int Wc)
{
    const int tid = threadIdx.x, c = tid % W, j = tid / W, P = kThreads / W;
    uint32_t am = 0;
    for (int s = 0; s < g.k; s++)
        m.lists[s * kThreads + tid] = 0;
    if (c < Wc) {
        uint64_t thr = g.k ? 0u : ~(uint64_t)0;
        int cnt = 0;
        for (int t = g.S + j; t < g.T; t += P) {
            const uint32_t key = rank_key(group_val<DT>(m, g, pitch, t, c));
            const uint64_t e = ((uint64_t)key << 32) | (0xFFFFu - (uint32_t)t);
            if (e > thr) {
                const uint64_t out = list_insert(m.lists + tid, kThreads, g.k, cnt, e);
                if (out != 0)
                    am = amax_with_key(am, (uint32_t)(out >> 32));
                if (cnt == g.k)
                    thr = m.lists[(g.k - 1) * kThreads + tid];
            } else {
                am = amax_with_key(am, key);
            }
        }
    }
    m.amx[tid] = am;
}

template <int DT>
__device__ __forceinline__ void merge_general(const KSmem &m, const Geo &g, int pitch, int W,
                                              int cc, int d, unsigned char *pay, const float *stat)
{
    const int P = kThreads / W;
    uint32_t am = 0;
    for (int jj = 0; jj < P; jj++)
        am = max(am, m.amx[jj * W + cc]);
    unsigned char *slots = pay + g.l.outliers + (size_t)d * (uint32_t)g.k * g.l.entry;
    uint64_t prev = ~(uint64_t)0;
    int got = 0;
    for (int r = 0; r < g.k; r++) {
        uint64_t best = 0;
        for (int jj = 0; jj < P; jj++)
            for (int s = 0; s < g.k; s++) {
                const uint64_t e = m.lists[s * kThreads + jj * W + cc];
                if (e < prev && e > best)
                    best = e;
            }
        uint32_t index = KVS_OUTLIER_EMPTY;
        uint16_t value = 0;
        if (best != 0) {
            const int t = (int)(0xFFFFu - (uint32_t)(best & 0xFFFFu));
            index = (uint32_t)t;
            value = exact_fp16<DT>(stage_raw<DT>(m, pitch, t, cc)); /* x, also with offsets */
            if (g.koff)
                atomicOr(&m.omask[t], 1u << cc); /* the encoder writes code 0 there */
            else
                stage_zero<DT>(m, pitch, t, cc); /* +0 encodes to code 0 */
            prev = best;
            got++;
        }
        kvs_outlier_put(slots + (uint32_t)r * g.l.entry, g.l.entry, index, value);
    }
    if (got == g.k && g.k > 0) /* entries ranked below the k-th pick are not outliers */
        for (int jj = 0; jj < P; jj++)
            for (int s = 0; s < g.k; s++) {
                const uint64_t e = m.lists[s * kThreads + jj * W + cc];
                if (e != 0 && e < prev)
                    am = amax_with_key(am, (uint32_t)(e >> 32));
            }
    const uint16_t scale = stored_scale(
        g, stat != NULL ? stat[d] : kvq_scale_from_amax(kvq_f32_from_bits(am), g.qmax));
    reinterpret_cast<uint16_t *>(pay + g.l.scales)[d] = scale;
    m.inv[cc] = kvq_scale_inv(kvq_fp16_to_f32(scale));
}

/* How a thread walks the staged strip's 16-byte chunks (cw per row, 1..4):
 * always chunk cc of rows t0, t0 + step, ... (cw = 3 walks as 4, the fourth
 * chunk's threads idle), so no division per chunk and fixed per-thread
 * channels. */
struct ChunkWalk {
    int cc, t0, step;
    __device__ __forceinline__ explicit ChunkWalk(int cw)
    {
        const int sh = cw >= 3 ? 2 : cw == 2 ? 1 : 0; /* log2 of 1, 2 or 4 */
        cc = threadIdx.x & ((1 << sh) - 1);
        t0 = threadIdx.x >> sh;
        step = kThreads >> sh;
    }
};

/* Encode the staged strip (and write the sink rows). INF: some element may be
 * ±Inf (the general path, which key offsets always take). SCH: the scheme, a
 * constant so that encode2's per-pair scheme tests fold away. With key
 * offsets the codes encode y = x - m, and the outliers (m.omask) get code 0
 * (encoded from +0, as without offsets). */
template <int DT, bool INF, int SCH>
__device__ __forceinline__ void encode_strip(const KSmem &m, const Geo &g, int pitch, int c0,
                                             int cw, bool vstore, unsigned char *pay)
{
    constexpr int VEC = Src<DT>::vec;
    const ChunkWalk cwk(cw);
    const int cc = cwk.cc;
    if (cc >= cw)
        return;
    const int d0 = c0 + cc * VEC;
    /* Each element is its own channel, with its own reciprocal scale: the
     * thread's channels are fixed, so are their reciprocals. */
    float iv[VEC], mo[VEC];
    const bool koff = INF && g.koff;
    const float4 *iv4 = reinterpret_cast<const float4 *>(m.inv + cc * VEC);
    const float4 *mo4 = reinterpret_cast<const float4 *>(m.moff + cc * VEC);
#pragma unroll
    for (int q = 0; q < VEC / 4; q++) {
        const float4 v = iv4[q], o = koff ? mo4[q] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        iv[4 * q] = v.x;
        iv[4 * q + 1] = v.y;
        iv[4 * q + 2] = v.z;
        iv[4 * q + 3] = v.w;
        mo[4 * q] = o.x;
        mo[4 * q + 1] = o.y;
        mo[4 * q + 2] = o.z;
        mo[4 * q + 3] = o.w;
    }
    const unsigned char *stp = m.stage + (size_t)cwk.t0 * pitch + cc * 16;
    unsigned char *cp = pay + g.l.codes + (size_t)cwk.t0 * g.D + d0;
    const int sstep = cwk.step * pitch;
    const size_t cstep = (size_t)cwk.step * g.D;
    for (int t = cwk.t0; t < g.T; t += cwk.step, stp += sstep, cp += cstep) {
        const uint4 raw = *reinterpret_cast<const uint4 *>(stp);
        if (t < g.S) {
            uint16_t *sp = reinterpret_cast<uint16_t *>(pay + g.l.sinks) + (size_t)t * g.D + d0;
            if (vstore) {
                uint32_t h[VEC / 2];
#pragma unroll
                for (int e = 0; e < VEC; e += 2)
                    h[e / 2] = (uint32_t)exact_fp16<DT>(raw_elem<DT>(raw, e)) |
                               ((uint32_t)exact_fp16<DT>(raw_elem<DT>(raw, e + 1)) << 16);
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
                        sp[e] = exact_fp16<DT>(raw_elem<DT>(raw, e));
                        cp[e] = 0;
                    }
            }
            continue;
        }
        const uint32_t om = koff ? m.omask[t] >> (cc * VEC) : 0u;
        auto val = [&](int e) {
            const float x = widen<DT>(raw_elem<DT>(raw, e));
            if (!koff)
                return x;
            return (om >> e) & 1u ? 0.0f : kvq_offset_sub(x, mo[e]);
        };
        uint32_t w[VEC / 4];
#pragma unroll
        for (int q = 0; q < VEC / 4; q++) {
            const uint32_t c01 =
                encode2<INF>(val(4 * q), val(4 * q + 1), SCH, iv[4 * q], iv[4 * q + 1]);
            const uint32_t c23 =
                encode2<INF>(val(4 * q + 2), val(4 * q + 3), SCH, iv[4 * q + 2], iv[4 * q + 3]);
            w[q] = c01 | (c23 << 16);
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

template <int DT, int SCH>
__global__ void __launch_bounds__(kThreads, kKMinBlocks) quant_k_kernel(const KArgs a)
{
    constexpr int VEC = Src<DT>::vec, ES = Src<DT>::esize;
    const Geo &g = a.g;
    const int tid = threadIdx.x;
    const int tile = blockIdx.x / a.strips, strip = blockIdx.x % a.strips;
    const kvs_cuda_tile_job job = a.jobs[tile];
    const int pitch = a.pitch;
    const int W = pitch / ES; /* channels per strip: 4..32, divides 256 */
    const int c0 = strip * W;
    const int Wc = min(W, g.D - c0);     /* channels present in this strip */
    const int cw = (Wc + VEC - 1) / VEC; /* chunks per row present, 1..4 */
    const unsigned char *src = static_cast<const unsigned char *>(job.src);
    const size_t rowb = job.stride * ES;
    const bool vload = ((uintptr_t)src % 16u) == 0 && rowb % 16u == 0 && g.D % VEC == 0;
    const bool vstore = g.D % VEC == 0;
    unsigned char *tilep = static_cast<unsigned char *>(job.dst);
    unsigned char *pay = tilep + sizeof(kvs_tile_hdr);

    KSmem m;
    m.stage = dyn_smem();
    m.lists = reinterpret_cast<uint64_t *>(m.stage + (size_t)g.T * pitch);
    m.amx = reinterpret_cast<uint32_t *>(m.stage + (size_t)g.T * pitch + (size_t)g.k * kRow * 4);
    m.inv = reinterpret_cast<float *>(m.amx + kRow);
    m.picked = reinterpret_cast<uint32_t *>(m.inv + 32);
    m.amc = m.picked + 32 * KVS_TILE_MAX_OUTLIERS;
    m.moff = reinterpret_cast<float *>(m.amc + 32);
    m.omask = reinterpret_cast<uint32_t *>(m.moff + 32);

    /* 1. load: thread tid takes chunk lcc of rows lt0, lt0 + lstep, ... */
    {
        const ChunkWalk cwk(cw);
        if (cwk.cc < cw) {
            const int d0 = c0 + cwk.cc * VEC;
            const unsigned char *row = src + (size_t)cwk.t0 * rowb;
            unsigned char *sp = m.stage + (size_t)cwk.t0 * pitch + cwk.cc * 16;
            const size_t gstep = (size_t)cwk.step * rowb;
            const int sstep = cwk.step * pitch;
            for (int t = cwk.t0; t < g.T; t += cwk.step, row += gstep, sp += sstep) {
                if (vload)
                    cp_async16(sp, row + (size_t)d0 * ES);
                else
                    *reinterpret_cast<uint4 *>(sp) = load_chunk_scalar<DT>(row, d0, g.D);
            }
        }
    }
    if (strip == 0 && tid == 0) {
        write_header(tilep, g, job.static_scales != NULL);
        write_pads(pay, g);
    }
    cp_async_wait_all();
    __syncthreads();

    /* 1b. key offsets (rule 5): the scan, merge and encode below see y = x - m */
    if (g.koff) { /* launch-uniform */
        key_offsets<DT>(m, g, pitch, W, Wc, c0, pay);
        __syncthreads();
    }

    /* 2.-3. scan and merge: fast when the block's strip holds no NaN/Inf and
     * no key offsets (the fast form ranks the source's own bits) */
    bool fast = false;
    if constexpr (DT != KVS_DTYPE_FP32) {
        if (g.D % 2 == 0 && !g.koff) { /* launch-uniform */
            const bool special = scan_fast<DT>(m, g, pitch, W, Wc);
            fast = __syncthreads_or(special) == 0;
            if (fast) {
                const float *st = job.static_scales;
                switch (g.k) { /* launch-uniform */
                case 0:
                    merge_fast_regs<DT, 0>(m, g, pitch, W, Wc, c0, pay, st);
                    break;
                case 1:
                    merge_fast_regs<DT, 1>(m, g, pitch, W, Wc, c0, pay, st);
                    break;
                case 2:
                    merge_fast_regs<DT, 2>(m, g, pitch, W, Wc, c0, pay, st);
                    break;
                case 3:
                    merge_fast_regs<DT, 3>(m, g, pitch, W, Wc, c0, pay, st);
                    break;
                case 4:
                    merge_fast_regs<DT, 4>(m, g, pitch, W, Wc, c0, pay, st);
                    break;
                default:
                    merge_fast<DT>(m, g, pitch, W, Wc, c0, pay, st);
                    break;
                }
            }
        }
    }
    if (!fast) {
        scan_general<DT>(m, g, pitch, W, Wc);
        __syncthreads();
        if (tid < Wc)
            merge_general<DT>(m, g, pitch, W, tid, c0 + tid, pay, job.static_scales);
    }
    __syncthreads();

    /* 4. encode (and sinks) */
    if (fast)
        encode_strip<DT, false, SCH>(m, g, pitch, c0, cw, vstore, pay);
    else
        encode_strip<DT, true, SCH>(m, g, pitch, c0, cw, vstore, pay);
}

} // namespace

template <int DT> static void (*k_kernel_sch(int scheme))(const KArgs)
{
    return scheme == KVS_SCHEME_INT8        ? quant_k_kernel<DT, KVS_SCHEME_INT8>
           : scheme == KVS_SCHEME_FP8_E5M2 ? quant_k_kernel<DT, KVS_SCHEME_FP8_E5M2>
                                           : quant_k_kernel<DT, KVS_SCHEME_FP8_E4M3>;
}

static void (*k_kernel_for(int dtype, int scheme))(const KArgs)
{
    return dtype == KVS_DTYPE_FP16   ? k_kernel_sch<KVS_DTYPE_FP16>(scheme)
           : dtype == KVS_DTYPE_BF16 ? k_kernel_sch<KVS_DTYPE_BF16>(scheme)
                                     : k_kernel_sch<KVS_DTYPE_FP32>(scheme);
}

int quant_k(const Geo &g, int dtype, const kvs_cuda_tile_job *jobs, unsigned n, cudaStream_t s,
            const DevInfo &di, int strip_bytes)
{
    const int es = dtype == KVS_DTYPE_FP32 ? 4 : 2;
    int pitch = strip_bytes;
    if (pitch != 16 && pitch != 32 && pitch != 64) {
        /* Widest strip that still gives each multiprocessor about 256 rows of
         * strips (a block's work grows with T: at T = 1024 a quarter of the
         * blocks keep the device as busy; H200: 32 tiles x T = 1024 ran in
         * 11.6 us with 64-byte strips, 18 us with the 16-byte ones the old
         * rule of two blocks per multiprocessor chose). */
        pitch = 16;
        for (int p = 64; p >= 32; p /= 2) {
            size_t strips = ((size_t)g.D * es + p - 1) / p;
            if ((size_t)n * strips * (size_t)g.T >= (size_t)di.sms * 256u) {
                pitch = p;
                break;
            }
        }
    }
    while (pitch > 16 && k_smem_bytes(g, pitch) > (size_t)di.smem_optin)
        pitch /= 2;
    const size_t smem = k_smem_bytes(g, pitch);
    if (smem > (size_t)di.smem_optin)
        return kvs__cuda_failf(KVS_EINTERNAL,
                               "K tile: needs %zu bytes of shared memory, device allows %d", smem,
                               di.smem_optin);
    const int W = pitch / es;
    const unsigned strips = (unsigned)((g.D + W - 1) / W);
    if ((size_t)n * strips > 0x7FFFFFFFu)
        return kvs__cuda_failf(KVS_EINVAL, "K tiles: %u tiles x %u strips is too many blocks", n,
                               strips);
    KArgs a;
    a.g = g;
    a.jobs = jobs;
    a.strips = (int)strips;
    a.pitch = pitch;
    void (*kernel)(const KArgs) = k_kernel_for(dtype, g.scheme);
    if (smem > 48u * 1024u) { /* once per kernel: allow up to the device's opt-in limit */
        static int raised[4][8]; /* [dtype][scheme] */
        if (!raised[dtype & 3][g.scheme & 7]) {
            KVS_CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        di.smem_optin));
            raised[dtype & 3][g.scheme & 7] = 1;
        }
    }
    KVS_CK(launch(kernel, n * strips, smem, s, a));
    return KVS_OK;
}

} // namespace kvs_tile
