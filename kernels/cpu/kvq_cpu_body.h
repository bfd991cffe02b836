/*
 * kvq_cpu_body.h — the tile kernels of the fast CPU path, written once over a
 * small vector layer and compiled once per instruction set: kvq_cpu_portable.c
 * (1 lane, plain C), kvq_cpu_avx2.c (8 lanes), kvq_cpu_avx512.c (16 lanes)
 * each define the layer below, then include this file. Not a header of its
 * own: it defines the ISA's two entry points (KVS__QUANTIZE, KVS__DEQUANTIZE).
 *
 * The idea. The reference (kernels/ref/kvq_ref.c) walks one scale group at a
 * time; here the lanes of a vector are groups or elements:
 *   - K tiles (a group is channel d over tokens S..T-1): W channels sit in the
 *     W lanes and the kernel walks the tokens, keeping per lane the k best
 *     (key, token) pairs in rank order and a "spill" key: the largest finite
 *     key that left (or never entered) the list. When the walk ends the list
 *     holds the outliers and the spill is the amax of the rest, exactly — every
 *     element that is not an outlier went through the spill once. A second
 *     walk (L1/L2-resident) encodes; outlier codes are then zeroed.
 *   - V tiles (a group is one token row of D values): the row is widened into
 *     an fp32 buffer while lane l keeps the top-k and spill of channels
 *     l, l+W, ... as above; k rounds of "largest list head, lowest channel
 *     among equals" pop the outliers in rank order; the spill and what is left
 *     in the lists give the amax; then the row is encoded from the buffer.
 *     (For k > 4: keys in a buffer and k rounds of max + first index.)
 *   - K tiles with key offsets (kv_format.h rule 5): a first walk keeps per
 *     lane the k + 1 smallest and k + 1 largest finite values (min/max
 *     chains on order keys), from which each lane's offset m follows as
 *     kvq_offset_trim computes it; the top-k walk (exact keys: packed keys
 *     need low bits that x - m no longer leaves zero) and the encode walk
 *     then see x - m, one fp32 subtraction per element, as the reference's.
 *     Outlier slots keep the source value (they are read back from it).
 *   - Dequantize: rows of codes decode exactly to fp32 (vector bit
 *     manipulation), times the group's fp16 scale widened to fp32 (one IEEE
 *     multiply, as in the reference), plus the channel's offset for a key
 *     offset tile (one IEEE add), stored in the destination dtype; then the
 *     outlier entries (3 or 4 bytes, kvs_outlier_get).
 * Ranking keys (u32, all < 2^31): 0 = empty slot, 1 = NaN, |x| bits + 2
 * otherwise, so ±Inf (0x7F800002) ranks first and NaN last, as kvq_topk_abs
 * orders them; a strict ">" while walking indices upwards breaks ties by the
 * lowest index, as kvq_topk_abs does. amax = spill - 2 (spill > 1), else 0.
 * fp16 and bf16 sources (the common case) first try "packed" keys that carry
 * the index in the low bits the widened value leaves zero, so the lists are
 * plain min/max chains (see KVS__PK_ONE); a group holding a NaN, or an Inf
 * that is not an outlier, is redone with the exact keys above.
 * Walks down K columns prefetch each row's next line (a page boundary every
 * 16 rows defeats the hardware's stride prefetch); V and dequantize rows
 * prefetch a few rows ahead.
 *
 * Invariants: every result is bit-identical to the reference; no element
 * outside the T x D view is read or written (tails use masked or bounced
 * accesses); nothing is allocated (row buffers are on the stack, 8 KiB).
 *
 * The layer (all static inline, W = KVS__W lanes; vf = W floats, vu = W u32,
 * vm = a lane mask):
 *   v_ld(base, dt, i) / v_ld_n(.., n)  W (or n < W, zeros after) elements of
 *        view dtype dt at element index i, widened exactly as kvq_fp16_to_f32 /
 *        kvq_bf16_to_f32 do (fp32 bits pass unchanged)
 *   v_st(base, dt, i, x) / v_st_n      narrowed as kvq_f32_to_fp16/_bf16 do
 *   v_ldf / v_stf (64-byte aligned fp32), v_ldu / v_stu (aligned u32),
 *   v_stc / v_stc_n (low byte of each lane to W or n bytes)
 *   v_dec(s, p) / v_dec_n: exact fp32 value of W (n) codes of scheme s
 *   v_enc(s, y): codes of y = x * inv (kvq_f32_to_e4m3/_e5m2, INT8 rounding)
 *   v_fixinf(y, x, iv): y, but x where iv is 0 and x is ±Inf
 *   v_mul, v_add, v_sub (one IEEE fp32 operation each, never fused),
 *   v_ord (order key: u32 lanes ordered as the values, -0 below +0; only
 *   finite values are compared),
 *   v_bcf, v_bcu, v_key (ranking key), v_abs (|x| bits), v_gt (a > b),
 *   v_eq, v_sel (m ? a : b), v_max, v_min, v_addu, v_subu, v_or (u32 lanes),
 *   v_iota (0..W-1), v_lane (mask of one lane), v_spill (max unless the key
 *   is Inf's), v_keep (lanes >= n to 0), v_hmax / v_hmin (largest / smallest
 *   lane), v_find (lowest lane equal to a key, or -1)
 */
#include "kvq_cpu_impl.h"
#include "kvq_math.h"

#include <string.h>

#define KVS__AI      static inline __attribute__((always_inline))
#define KVS__ALIGN   _Alignas(64)
#define KVS__KEY_INF 0x7F800002u
#define KVS__KMAX    KVS_TILE_MAX_OUTLIERS

/* ---- scalar helpers: unaligned-safe, same conversions as the reference ---- */

/* Prefetches the n bytes at p (a row a few iterations ahead; never faults). */
KVS__AI void prefetch_row(const void *p, size_t n, int write)
{
    const unsigned char *c = (const unsigned char *)p;
    for (size_t i = 0; i < n; i += 64) {
        if (write)
            __builtin_prefetch(c + i, 1);
        else
            __builtin_prefetch(c + i, 0);
    }
}

KVS__AI float s_ld(const void *base, kvs_dtype dt, size_t i)
{
    uint16_t h;
    float f;
    if (dt == KVS_DTYPE_FP32) {
        memcpy(&f, (const unsigned char *)base + 4 * i, 4);
        return f;
    }
    memcpy(&h, (const unsigned char *)base + 2 * i, 2);
    return dt == KVS_DTYPE_FP16 ? kvq_fp16_to_f32(h) : kvq_bf16_to_f32(h);
}

KVS__AI void s_st(void *base, kvs_dtype dt, size_t i, float x)
{
    uint16_t h;
    if (dt == KVS_DTYPE_FP32) {
        memcpy((unsigned char *)base + 4 * i, &x, 4);
        return;
    }
    h = dt == KVS_DTYPE_FP16 ? kvq_f32_to_fp16(x) : kvq_f32_to_bf16(x);
    memcpy((unsigned char *)base + 2 * i, &h, 2);
}

KVS__AI uint16_t get_u16(const unsigned char *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

KVS__AI void put_u16(unsigned char *p, uint16_t h)
{
    memcpy(p, &h, 2);
}

KVS__AI float qmax_of(kvs_scheme s)
{
    return s == KVS_SCHEME_INT8       ? KVQ_INT8_MAX
           : s == KVS_SCHEME_FP8_E5M2 ? KVQ_E5M2_MAX
                                      : KVQ_E4M3_MAX;
}

/* The stored fp16 scale of a group from its spill key (or the static scale),
 * rounded up as the reference does (kvq_scale_fp16), then aligned to the
 * per-tensor scale when the job has one (kvq_scale_align_fp16). */
KVS__AI uint16_t group_scale(const kvs__cpu_qjob *j, uint32_t g, uint32_t spill, float qmax)
{
    uint16_t s;
    if (j->static_scales)
        s = kvq_scale_fp16(j->static_scales[g]);
    else
        s = kvq_scale_fp16(
            kvq_scale_from_amax(spill > 1u ? kvq_f32_from_bits(spill - 2u) : 0.0f, qmax));
    return j->tensor16 ? kvq_scale_align_fp16(s, j->tensor16) : s;
}

/* Rows [t0, t1) of the view, converted to fp16 into out ([rows][D], any alignment):
 * the fp16 scheme's payload and the sink rows. */
KVS__AI void rows_to_fp16(const void *src, const kvs_dtype dt, size_t stride, uint32_t t0,
                          uint32_t t1, uint32_t D, unsigned char *out)
{
    const uint32_t nfull = D / KVS__W * KVS__W;
    for (uint32_t t = t0; t < t1; t++) {
        size_t off = (size_t)t * stride;
        unsigned char *o = out + (size_t)(t - t0) * D * 2u;
        uint32_t d = 0;
        for (; d < nfull; d += KVS__W)
            v_st(o, KVS_DTYPE_FP16, d, v_ld(src, dt, off + d));
        if (d < D)
            v_st_n(o, KVS_DTYPE_FP16, d, v_ld_n(src, dt, off + d, D - d), D - d);
    }
}

/* ---- K tiles: lanes = channels ------------------------------------------- */

/* Inserts (key, tv) into the per-lane lists K0..K3 / I0..I3 (rank order, the
 * first k in use; k a constant after inlining) and folds what drops off the
 * end into spill. m_q: the new element ranks before slot q; m_q implies
 * m_{q+1}; a strict ">" keeps an earlier equal key in front. */
#define KVS__INSERT4(k, key, tv)                                                                   \
    do {                                                                                           \
        const vm m0 = v_gt(key, K0), m1 = v_gt(key, K1), m2 = v_gt(key, K2), m3 = v_gt(key, K3);   \
        vu fall = key;                                                                             \
        if (k == 1)                                                                                \
            fall = v_sel(m0, K0, key);                                                             \
        else if (k == 2)                                                                           \
            fall = v_sel(m1, K1, key);                                                             \
        else if (k == 3)                                                                           \
            fall = v_sel(m2, K2, key);                                                             \
        else if (k == 4)                                                                           \
            fall = v_sel(m3, K3, key);                                                             \
        if (k > 3) {                                                                               \
            K3 = v_sel(m3, v_sel(m2, K2, key), K3);                                                \
            I3 = v_sel(m3, v_sel(m2, I2, tv), I3);                                                 \
        }                                                                                          \
        if (k > 2) {                                                                               \
            K2 = v_sel(m2, v_sel(m1, K1, key), K2);                                                \
            I2 = v_sel(m2, v_sel(m1, I1, tv), I2);                                                 \
        }                                                                                          \
        if (k > 1) {                                                                               \
            K1 = v_sel(m1, v_sel(m0, K0, key), K1);                                                \
            I1 = v_sel(m1, v_sel(m0, I0, tv), I1);                                                 \
        }                                                                                          \
        if (k > 0) {                                                                               \
            K0 = v_sel(m0, key, K0);                                                               \
            I0 = v_sel(m0, tv, I0);                                                                \
        }                                                                                          \
        spill = v_spill(spill, fall);                                                              \
    } while (0)

/* A source strip of W (tail: n < W, zeros after) channels at element off,
 * shifted by the lanes' key offsets mo (x - m, kvq_offset_sub) when koff. */
KVS__AI vf ld_strip(const void *src, const kvs_dtype dt, size_t off, const int tail, unsigned n,
                    const int koff, vf mv)
{
    const vf x = tail ? v_ld_n(src, dt, off, n) : v_ld(src, dt, off);
    return koff ? v_sub(x, mv) : x;
}

/* The top-k walk for k <= 4 with everything in registers (k is a constant
 * after inlining, so the unused slots vanish). Writes per lane the keys kk[q],
 * tokens ii[q] (rank order) and the spill sp. koff: ranks x - mo (per lane)
 * instead of x. */
KVS__AI void qk_scan_small(const kvs__cpu_qjob *j, const kvs_dtype dt, const unsigned k,
                           const int koff, const float *mo, uint32_t d0, uint32_t (*kk)[KVS__W],
                           uint32_t (*ii)[KVS__W], uint32_t *sp)
{
    const vf mv = koff ? v_ldf(mo) : v_bcf(0.0f);
    const vu zero = v_bcu(0);
    vu K0 = zero, K1 = zero, K2 = zero, K3 = zero;
    vu I0 = zero, I1 = zero, I2 = zero, I3 = zero;
    vu spill = zero;
    const unsigned char *src = (const unsigned char *)j->src;
    const size_t es = dt == KVS_DTYPE_FP32 ? 4u : 2u;
    /* The walk goes down a column: hardware prefetchers lose the stride at
     * every page, so fetch each row's next 64-byte line (the next strips) now. */
    const size_t ahead = (d0 + KVS__W) * es < (size_t)j->D * es ? 64u : 0u;
    size_t off = (size_t)j->S * j->stride + d0;
    for (uint32_t t = j->S; t < j->T; t++, off += j->stride) {
        __builtin_prefetch(src + off * es + ahead);
        const vu key = v_key(ld_strip(src, dt, off, 0, KVS__W, koff, mv));
        const vu tv = v_bcu(t);
        KVS__INSERT4(k, key, tv);
    }
    if (k > 0) {
        v_stu(kk[0], K0);
        v_stu(ii[0], I0);
    }
    if (k > 1) {
        v_stu(kk[1], K1);
        v_stu(ii[1], I1);
    }
    if (k > 2) {
        v_stu(kk[2], K2);
        v_stu(ii[2], I2);
    }
    if (k > 3) {
        v_stu(kk[3], K3);
        v_stu(ii[3], I3);
    }
    v_stu(sp, spill);
}

/* The same walk for any k (lists on the stack) and for a tail of n < W lanes
 * (tail != 0; the lanes past n are zeros and ignored by the caller). */
KVS__AI void qk_scan_any(const kvs__cpu_qjob *j, const kvs_dtype dt, const int tail, const int koff,
                         const float *mo, uint32_t d0, unsigned n, uint32_t (*kk)[KVS__W],
                         uint32_t (*ii)[KVS__W], uint32_t *sp)
{
    const unsigned k = j->k;
    const vf mv = koff ? v_ldf(mo) : v_bcf(0.0f);
    vu K[KVS__KMAX], I[KVS__KMAX];
    vm m[KVS__KMAX];
    vu spill = v_bcu(0);
    for (unsigned q = 0; q < k; q++)
        K[q] = I[q] = v_bcu(0);
    size_t off = (size_t)j->S * j->stride + d0;
    for (uint32_t t = j->S; t < j->T; t++, off += j->stride) {
        const vu key = v_key(ld_strip(j->src, dt, off, tail, n, koff, mv));
        const vu tv = v_bcu(t);
        for (unsigned q = 0; q < k; q++)
            m[q] = v_gt(key, K[q]);
        vu fall = k ? v_sel(m[k - 1], K[k - 1], key) : key;
        for (unsigned q = k; q-- > 1;) {
            K[q] = v_sel(m[q], v_sel(m[q - 1], K[q - 1], key), K[q]);
            I[q] = v_sel(m[q], v_sel(m[q - 1], I[q - 1], tv), I[q]);
        }
        if (k) {
            K[0] = v_sel(m[0], key, K[0]);
            I[0] = v_sel(m[0], tv, I[0]);
        }
        spill = v_spill(spill, fall);
    }
    for (unsigned q = 0; q < k; q++) {
        v_stu(kk[q], K[q]);
        v_stu(ii[q], I[q]);
    }
    v_stu(sp, spill);
}

/* ---- packed keys (fp16 and bf16 sources) ---------------------------------
 * A widened fp16 (bf16) value has its low 13 (16) fp32 bits zero, so
 *     pk = (|x| bits + 2^13) | (1023 - index)
 * orders elements by |x| descending, then index ascending, exactly as the
 * ranking keys do, and no two elements of a group share one (T, D <= 1024).
 * The per-lane top-k lists then become plain min/max chains, and the row's
 * best in a V round is one horizontal max. NaN (which needs its own rank) and
 * an Inf among the non-outliers (which must not reach the amax) are rare:
 * the packed walk only notices them, and the caller redoes the group exactly.
 * 0 = empty; numbers are >= 2^13. */
#define KVS__PK_ONE 0x2000u
#define KVS__PK_INF (0x7F800000u + KVS__PK_ONE)

/* Packed key -> ranking key (|x| bits + 2; 0 stays 0) and index. */
KVS__AI uint32_t pk_key(uint32_t pk)
{
    return pk ? (pk & ~0x1FFFu) - KVS__PK_ONE + 2u : 0u;
}
KVS__AI uint32_t pk_index(uint32_t pk)
{
    return 1023u - (pk & 0x3FFu);
}

/* Inserts pk into the sorted lists P0..P3 (first k in use); what drops off the
 * end goes to spill. */
#define KVS__PK_INSERT(k, pk)                                                                      \
    do {                                                                                           \
        vu x_ = pk, hi_;                                                                           \
        if (k > 0) {                                                                               \
            hi_ = v_max(P0, x_);                                                                   \
            x_ = v_min(P0, x_);                                                                    \
            P0 = hi_;                                                                              \
        }                                                                                          \
        if (k > 1) {                                                                               \
            hi_ = v_max(P1, x_);                                                                   \
            x_ = v_min(P1, x_);                                                                    \
            P1 = hi_;                                                                              \
        }                                                                                          \
        if (k > 2) {                                                                               \
            hi_ = v_max(P2, x_);                                                                   \
            x_ = v_min(P2, x_);                                                                    \
            P2 = hi_;                                                                              \
        }                                                                                          \
        if (k > 3) {                                                                               \
            hi_ = v_max(P3, x_);                                                                   \
            x_ = v_min(P3, x_);                                                                    \
            P3 = hi_;                                                                              \
        }                                                                                          \
        spill = v_max(spill, x_);                                                                  \
    } while (0)

/* The K walk with packed keys, k <= 4, full strips. 0 with kk/ii/sp filled as
 * qk_scan_small fills them, or 1: a NaN or a non-outlier Inf, walk exactly. */
KVS__AI int qk_scan_packed(const kvs__cpu_qjob *j, const kvs_dtype dt, const unsigned k,
                           uint32_t d0, uint32_t (*kk)[KVS__W], uint32_t (*ii)[KVS__W],
                           uint32_t *sp)
{
    const vu z = v_bcu(0), one = v_bcu(KVS__PK_ONE);
    vu P0 = z, P1 = z, P2 = z, P3 = z, spill = z, amax = z;
    const unsigned char *src = (const unsigned char *)j->src;
    const size_t es = 2u;
    const size_t ahead = (d0 + KVS__W) * es < (size_t)j->D * es ? 64u : 0u;
    size_t off = (size_t)j->S * j->stride + d0;
    for (uint32_t t = j->S; t < j->T; t++, off += j->stride) {
        __builtin_prefetch(src + off * es + ahead);
        const vu a = v_abs(v_ld(src, dt, off));
        amax = v_max(amax, a);
        const vu pk = v_or(v_addu(a, one), v_bcu(1023u - t));
        KVS__PK_INSERT(k, pk);
    }
    if (v_hmax(amax) > 0x7F800000u || v_hmax(spill) >= KVS__PK_INF)
        return 1;
    KVS__ALIGN uint32_t tmp[4][KVS__W], stmp[KVS__W];
    if (k > 0)
        v_stu(tmp[0], P0);
    if (k > 1)
        v_stu(tmp[1], P1);
    if (k > 2)
        v_stu(tmp[2], P2);
    if (k > 3)
        v_stu(tmp[3], P3);
    v_stu(stmp, spill);
    for (unsigned l = 0; l < KVS__W; l++) {
        for (unsigned q = 0; q < k; q++) {
            kk[q][l] = pk_key(tmp[q][l]);
            ii[q][l] = pk_index(tmp[q][l]);
        }
        sp[l] = pk_key(stmp[l]);
    }
    return 0;
}

/* The top-k walk of one strip; koff: of the shifted values x - mo (exact
 * keys: the shift leaves the low bits that packed keys need zero set). */
KVS__AI void qk_scan(const kvs__cpu_qjob *j, const kvs_dtype dt, const int koff, const float *mo,
                     uint32_t d0, unsigned n, uint32_t (*kk)[KVS__W], uint32_t (*ii)[KVS__W],
                     uint32_t *sp)
{
    if (n < KVS__W) {
        qk_scan_any(j, dt, 1, koff, mo, d0, n, kk, ii, sp);
        return;
    }
    if (dt != KVS_DTYPE_FP32 && !koff) {
        int redo = 1;
        switch (j->k) {
        case 0:
            redo = qk_scan_packed(j, dt, 0, d0, kk, ii, sp);
            break;
        case 1:
            redo = qk_scan_packed(j, dt, 1, d0, kk, ii, sp);
            break;
        case 2:
            redo = qk_scan_packed(j, dt, 2, d0, kk, ii, sp);
            break;
        case 3:
            redo = qk_scan_packed(j, dt, 3, d0, kk, ii, sp);
            break;
        case 4:
            redo = qk_scan_packed(j, dt, 4, d0, kk, ii, sp);
            break;
        default:
            break;
        }
        if (!redo)
            return;
    }
    switch (j->k) {
    case 0:
        qk_scan_small(j, dt, 0, koff, mo, d0, kk, ii, sp);
        break;
    case 1:
        qk_scan_small(j, dt, 1, koff, mo, d0, kk, ii, sp);
        break;
    case 2:
        qk_scan_small(j, dt, 2, koff, mo, d0, kk, ii, sp);
        break;
    case 3:
        qk_scan_small(j, dt, 3, koff, mo, d0, kk, ii, sp);
        break;
    case 4:
        qk_scan_small(j, dt, 4, koff, mo, d0, kk, ii, sp);
        break;
    default:
        qk_scan_any(j, dt, 0, koff, mo, d0, n, kk, ii, sp);
        break;
    }
}

/* x * inv as the reference's encode() forms it: where inv is 0 (a group with
 * scale 0) a ±Inf keeps its value (multiplier 1) instead of becoming NaN. fix
 * says whether any lane of iv is 0; it is almost never set. */
KVS__AI vf scaled(vf x, vf iv, int fix)
{
    vf y = v_mul(x, iv);
    return fix ? v_fixinf(y, x, iv) : y;
}

#define KVS__QK_SCAN(DTN, DT)                                                                      \
    static void qk_scan_##DTN(const kvs__cpu_qjob *j, uint32_t d0, unsigned n,                     \
                              uint32_t(*kk)[KVS__W], uint32_t(*ii)[KVS__W], uint32_t *sp)          \
    {                                                                                              \
        qk_scan(j, DT, 0, NULL, d0, n, kk, ii, sp);                                                \
    }                                                                                              \
    static void qk_scan_off_##DTN(const kvs__cpu_qjob *j, const float *mo, uint32_t d0,            \
                                  unsigned n, uint32_t(*kk)[KVS__W], uint32_t(*ii)[KVS__W],        \
                                  uint32_t *sp)                                                    \
    {                                                                                              \
        qk_scan(j, DT, 1, mo, d0, n, kk, ii, sp);                                                  \
    }
KVS__QK_SCAN(f16, KVS_DTYPE_FP16)
KVS__QK_SCAN(bf16, KVS_DTYPE_BF16)
KVS__QK_SCAN(f32, KVS_DTYPE_FP32)

/* The encode walk: codes of tokens S..T-1 for lanes d0..d0+n-1 (koff: of
 * x - mo). */
KVS__AI void qk_encode(const kvs__cpu_qjob *j, const kvs_dtype dt, const kvs_scheme s, uint32_t d0,
                       unsigned n, vf iv, int fix, const int koff, const float *mo)
{
    const vf mv = koff ? v_ldf(mo) : v_bcf(0.0f);
    /* locals: the code stores may alias *j, so its fields would be reloaded */
    const void *src = j->src;
    const size_t stride = j->stride, D = j->D;
    const uint32_t T = j->T;
    unsigned char *c = j->pay + j->l.codes + (size_t)j->S * D + d0;
    size_t off = (size_t)j->S * stride + d0;
    if (n < KVS__W) {
        for (uint32_t t = j->S; t < T; t++, off += stride, c += D)
            v_stc_n(c, v_enc(s, scaled(ld_strip(src, dt, off, 1, n, koff, mv), iv, fix)), n);
        return;
    }
    for (uint32_t t = j->S; t < T; t++, off += stride, c += D)
        v_stc(c, v_enc(s, scaled(ld_strip(src, dt, off, 0, KVS__W, koff, mv), iv, fix)));
}

/* ---- key offsets (kv_format.h rule 5): the trimmed midrange per lane ----
 * kvq_offset_trim needs, of each channel's finite values, the k + 1 smallest
 * and the k + 1 largest. The walk keeps them per lane as order keys
 * (v_ord: u32 in the order of the values, -0 just below +0) in two sorted
 * lists that are plain min/max chains: L ascending (the smallest first,
 * KVS__ORD_NONE = empty) and H descending (0 = empty); NaN and ±Inf enter
 * neither. Only a zero's sign can differ from the reference's lists (which
 * keep equal values in arrival order), and kvq_offset_trim's result does not
 * depend on it: the widths compare equal, a midrange of a zero and v is
 * v / 2 either way, and kvq_offset_fp16 stores -0 as +0. */
#define KVS__ORD_NONE 0xFFFFFFFFu /* no finite value orders there (v_ord of a NaN) */

/* One (lo, hi) insertion step at list position q: lo_/hi_ carry on down. */
#define KVS__MM_STEP(q)                                                                            \
    do {                                                                                           \
        const vu l_ = v_min(L##q, lo_), h_ = v_max(H##q, hi_);                                     \
        lo_ = v_max(L##q, lo_);                                                                    \
        hi_ = v_min(H##q, hi_);                                                                    \
        L##q = l_;                                                                                 \
        H##q = h_;                                                                                 \
    } while (0)

/* Order keys of a strip: *lo (NONE where x is not finite) and *hi (0 there). */
KVS__AI void ord_pair(vf x, vu *lo, vu *hi)
{
    const vm fin = v_gt(v_bcu(0x7F800000u), v_abs(x));
    const vu o = v_ord(x);
    *lo = v_sel(fin, o, v_bcu(KVS__ORD_NONE));
    *hi = v_sel(fin, o, v_bcu(0));
}

/* The walk for k <= 4 (a constant after inlining), full strips, lists in
 * registers. Writes lo[q] / hi[q], q = 0..k, per lane. */
KVS__AI void qk_trim_small(const kvs__cpu_qjob *j, const kvs_dtype dt, const unsigned k,
                           uint32_t d0, uint32_t (*lo)[KVS__W], uint32_t (*hi)[KVS__W])
{
    const vu none = v_bcu(KVS__ORD_NONE), z = v_bcu(0);
    vu L0 = none, L1 = none, L2 = none, L3 = none, L4 = none;
    vu H0 = z, H1 = z, H2 = z, H3 = z, H4 = z;
    const unsigned char *src = (const unsigned char *)j->src;
    const size_t es = dt == KVS_DTYPE_FP32 ? 4u : 2u;
    const size_t ahead = (d0 + KVS__W) * es < (size_t)j->D * es ? 64u : 0u;
    size_t off = (size_t)j->S * j->stride + d0;
    for (uint32_t t = j->S; t < j->T; t++, off += j->stride) {
        __builtin_prefetch(src + off * es + ahead);
        vu lo_, hi_;
        ord_pair(v_ld(src, dt, off), &lo_, &hi_);
        KVS__MM_STEP(0);
        if (k > 0)
            KVS__MM_STEP(1);
        if (k > 1)
            KVS__MM_STEP(2);
        if (k > 2)
            KVS__MM_STEP(3);
        if (k > 3)
            KVS__MM_STEP(4);
    }
    const vu Ls[5] = {L0, L1, L2, L3, L4}, Hs[5] = {H0, H1, H2, H3, H4};
    for (unsigned q = 0; q <= k; q++) {
        v_stu(lo[q], Ls[q]);
        v_stu(hi[q], Hs[q]);
    }
}

/* The same for any k and for a tail of n < W lanes (lists on the stack). */
KVS__AI void qk_trim_any(const kvs__cpu_qjob *j, const kvs_dtype dt, const int tail, uint32_t d0,
                         unsigned n, uint32_t (*lo)[KVS__W], uint32_t (*hi)[KVS__W])
{
    const unsigned k = j->k;
    vu L[KVS__KMAX + 1], H[KVS__KMAX + 1];
    for (unsigned q = 0; q <= k; q++) {
        L[q] = v_bcu(KVS__ORD_NONE);
        H[q] = v_bcu(0);
    }
    size_t off = (size_t)j->S * j->stride + d0;
    for (uint32_t t = j->S; t < j->T; t++, off += j->stride) {
        vu lo_, hi_;
        ord_pair(ld_strip(j->src, dt, off, tail, n, 0, v_bcf(0.0f)), &lo_, &hi_);
        for (unsigned q = 0; q <= k; q++) {
            const vu l_ = v_min(L[q], lo_), h_ = v_max(H[q], hi_);
            lo_ = v_max(L[q], lo_);
            hi_ = v_min(H[q], hi_);
            L[q] = l_;
            H[q] = h_;
        }
    }
    for (unsigned q = 0; q <= k; q++) {
        v_stu(lo[q], L[q]);
        v_stu(hi[q], H[q]);
    }
}

KVS__AI void qk_trim(const kvs__cpu_qjob *j, const kvs_dtype dt, uint32_t d0, unsigned n,
                     uint32_t (*lo)[KVS__W], uint32_t (*hi)[KVS__W])
{
    if (n < KVS__W) {
        qk_trim_any(j, dt, 1, d0, n, lo, hi);
        return;
    }
    switch (j->k) {
    case 0:
        qk_trim_small(j, dt, 0, d0, lo, hi);
        break;
    case 1:
        qk_trim_small(j, dt, 1, d0, lo, hi);
        break;
    case 2:
        qk_trim_small(j, dt, 2, d0, lo, hi);
        break;
    case 3:
        qk_trim_small(j, dt, 3, d0, lo, hi);
        break;
    case 4:
        qk_trim_small(j, dt, 4, d0, lo, hi);
        break;
    default:
        qk_trim_any(j, dt, 0, d0, n, lo, hi);
        break;
    }
}

#define KVS__QK_TRIM(DTN, DT)                                                                      \
    static void qk_trim_##DTN(const kvs__cpu_qjob *j, uint32_t d0, unsigned n,                     \
                              uint32_t(*lo)[KVS__W], uint32_t(*hi)[KVS__W])                        \
    {                                                                                              \
        qk_trim(j, DT, d0, n, lo, hi);                                                             \
    }
KVS__QK_TRIM(f16, KVS_DTYPE_FP16)
KVS__QK_TRIM(bf16, KVS_DTYPE_BF16)
KVS__QK_TRIM(f32, KVS_DTYPE_FP32)

/* The value of an order key (the inverse of v_ord). */
KVS__AI float ord_value(uint32_t o)
{
    return kvq_f32_from_bits(o & 0x80000000u ? o & 0x7FFFFFFFu : ~o);
}

/* kvq_offset_trim's result for lane l from the walk's lists: c =
 * min(finite count, k + 1) entries are in use, lo[i] / hi[i] are the
 * reference's lo[i] / hi[i], so kvq_offset_finish with keep = count = c
 * (r = c - 1) finishes as the reference does. */
KVS__AI uint16_t trim_offset(const uint32_t (*lo)[KVS__W], const uint32_t (*hi)[KVS__W], unsigned l,
                             unsigned k)
{
    float lv[KVS__KMAX + 1], hv[KVS__KMAX + 1];
    unsigned c = 0;
    for (; c <= k && lo[c][l] != KVS__ORD_NONE; c++) {
        lv[c] = ord_value(lo[c][l]);
        hv[c] = ord_value(hi[c][l]);
    }
    return kvq_offset_finish(lv, hv, (int)c, (int)c);
}

/* Every K group of the tile, W channels at a time; koff (a constant): with
 * key offsets. */
KVS__AI void qk_walk(const kvs__cpu_qjob *j, const kvs_dtype dt, const kvs_scheme s, const int koff)
{
    KVS__ALIGN uint32_t kk[KVS__KMAX][KVS__W];
    KVS__ALIGN uint32_t ii[KVS__KMAX][KVS__W];
    KVS__ALIGN uint32_t sp[KVS__W];
    KVS__ALIGN float inv[KVS__W];
    KVS__ALIGN float mo[KVS__W]; /* koff: the lanes' offsets, fp32 */
    const uint32_t D = j->D, k = j->k, E = j->l.entry;
    const float qmax = qmax_of(s);
    unsigned char *codes = j->pay + j->l.codes;
    for (uint32_t d0 = 0; d0 < D; d0 += KVS__W) {
        const unsigned n = D - d0 < KVS__W ? D - d0 : KVS__W;
        int fix = 0;
        if (koff) {
            /* rule 5: the offsets first, then everything on x - m */
            KVS__ALIGN uint32_t lo[KVS__KMAX + 1][KVS__W], hi[KVS__KMAX + 1][KVS__W];
            if (dt == KVS_DTYPE_FP16)
                qk_trim_f16(j, d0, n, lo, hi);
            else if (dt == KVS_DTYPE_BF16)
                qk_trim_bf16(j, d0, n, lo, hi);
            else
                qk_trim_f32(j, d0, n, lo, hi);
            for (unsigned l = 0; l < KVS__W; l++) {
                const uint16_t m16 = l < n ? trim_offset(lo, hi, l, k) : 0;
                if (l < n)
                    put_u16(j->pay + j->l.offsets + 2u * (d0 + l), m16);
                mo[l] = kvq_fp16_to_f32(m16);
            }
            if (dt == KVS_DTYPE_FP16)
                qk_scan_off_f16(j, mo, d0, n, kk, ii, sp);
            else if (dt == KVS_DTYPE_BF16)
                qk_scan_off_bf16(j, mo, d0, n, kk, ii, sp);
            else
                qk_scan_off_f32(j, mo, d0, n, kk, ii, sp);
        } else if (dt == KVS_DTYPE_FP16)
            qk_scan_f16(j, d0, n, kk, ii, sp);
        else if (dt == KVS_DTYPE_BF16)
            qk_scan_bf16(j, d0, n, kk, ii, sp);
        else
            qk_scan_f32(j, d0, n, kk, ii, sp);
        for (unsigned l = 0; l < KVS__W; l++) {
            uint16_t scale;
            uint32_t g = d0 + l;
            if (l >= n) {
                inv[l] = 0.0f;
                continue;
            }
            unsigned char *slots = j->pay + j->l.outliers + (size_t)g * k * E;
            /* the value as given, also when the group was shifted */
            for (uint32_t q = 0; q < k; q++) {
                if (kk[q][l] == 0) {
                    kvs_outlier_put(slots + E * q, E, KVS_OUTLIER_EMPTY, 0);
                    continue;
                }
                uint32_t t = ii[q][l];
                kvs_outlier_put(slots + E * q, E, t,
                                kvq_f32_to_fp16(s_ld(j->src, dt, (size_t)t * j->stride + g)));
            }
            scale = group_scale(j, g, sp[l], qmax);
            put_u16(j->pay + j->l.scales + 2u * g, scale);
            inv[l] = kvq_scale_inv(kvq_fp16_to_f32(scale));
            fix |= inv[l] == 0.0f;
        }
        qk_encode(j, dt, s, d0, n, v_ldf(inv), fix, koff, mo);
        for (unsigned l = 0; l < n; l++)
            for (uint32_t q = 0; q < k; q++)
                if (kk[q][l] != 0)
                    codes[(size_t)ii[q][l] * D + d0 + l] = 0;
    }
}

/* K tiles without and with key offsets. */
KVS__AI void qk_tile(const kvs__cpu_qjob *j, const kvs_dtype dt, const kvs_scheme s)
{
    qk_walk(j, dt, s, 0);
}
KVS__AI void qko_tile(const kvs__cpu_qjob *j, const kvs_dtype dt, const kvs_scheme s)
{
    qk_walk(j, dt, s, 1);
}

/* ---- V tiles: one group per token row ------------------------------------ */

/* Selection for k <= 4, all in registers: lane l of the row's vectors holds
 * channels d = l, l+W, ...; one walk keeps per lane its k best (key, channel)
 * and a spill, as for K tiles. The row's best is then the largest head key,
 * lowest channel among equal heads; popping it moves that lane's list up.
 * After k rounds the spill and whatever stayed in the lists are the rest.
 * Widens the row into xr; writes the slots; returns the spill key. */
KVS__AI uint32_t qv_select_small(const void *src, const kvs_dtype dt, size_t off, uint32_t D,
                                 const unsigned k, float *xr, uint32_t *picked, unsigned *np)
{
    const vu z = v_bcu(0), iota = v_iota();
    vu K0 = z, K1 = z, K2 = z, K3 = z;
    vu I0 = z, I1 = z, I2 = z, I3 = z;
    vu spill = z;
    const uint32_t nfull = D / KVS__W * KVS__W;
    uint32_t d = 0;
    for (; d < nfull; d += KVS__W) {
        const vf x = v_ld(src, dt, off + d);
        const vu key = v_key(x), tv = v_addu(iota, v_bcu(d));
        v_stf(xr + d, x);
        KVS__INSERT4(k, key, tv);
    }
    if (d < D) {
        const vf x = v_ld_n(src, dt, off + d, D - d);
        const vu key = v_keep(v_key(x), D - d), tv = v_addu(iota, v_bcu(d));
        v_stf(xr + d, x);
        KVS__INSERT4(k, key, tv);
    }
    for (unsigned q = 0; q < k; q++) {
        const uint32_t kmax = v_hmax(K0);
        if (kmax == 0) { /* fewer than k elements: the rest stay empty */
            break;
        }
        const uint32_t idx = v_hmin(v_sel(v_eq(K0, v_bcu(kmax)), I0, v_bcu(0xFFFFFFFFu)));
        picked[(*np)++] = idx;
        const vm lm = v_lane(idx % KVS__W);
        if (k > 0) {
            K0 = v_sel(lm, k > 1 ? K1 : z, K0);
            I0 = v_sel(lm, I1, I0);
        }
        if (k > 1) {
            K1 = v_sel(lm, k > 2 ? K2 : z, K1);
            I1 = v_sel(lm, I2, I1);
        }
        if (k > 2) {
            K2 = v_sel(lm, k > 3 ? K3 : z, K2);
            I2 = v_sel(lm, I3, I2);
        }
        if (k > 3)
            K3 = v_sel(lm, z, K3);
    }
    if (k > 0)
        spill = v_spill(spill, K0);
    if (k > 1)
        spill = v_spill(spill, K1);
    if (k > 2)
        spill = v_spill(spill, K2);
    if (k > 3)
        spill = v_spill(spill, K3);
    return v_hmax(spill);
}

/* Selection for any k (5..16 here): keys in a buffer beside xr, then k rounds
 * of "vector max, then the lowest index holding it". */
KVS__AI uint32_t qv_select_any(const void *src, const kvs_dtype dt, size_t off, uint32_t D,
                               unsigned k, float *xr, uint32_t *kr, uint32_t *picked, unsigned *np)
{
    const uint32_t nfull = D / KVS__W * KVS__W;
    const uint32_t nv = nfull + (D > nfull ? KVS__W : 0); /* lanes in the buffers */
    vu M = v_bcu(0), F = v_bcu(0);
    uint32_t d;
    for (d = 0; d < nfull; d += KVS__W) {
        vf x = v_ld(src, dt, off + d);
        vu key = v_key(x);
        v_stf(xr + d, x);
        v_stu(kr + d, key);
        M = v_max(M, key);
    }
    if (d < D) {
        vf x = v_ld_n(src, dt, off + d, D - d);
        vu key = v_keep(v_key(x), D - d);
        v_stf(xr + d, x);
        v_stu(kr + d, key);
        M = v_max(M, key);
    }
    uint32_t kmax = v_hmax(M);
    for (uint32_t q = 0; q < k; q++) {
        if (kmax == 0) {
            break;
        }
        uint32_t idx = 0;
        for (d = 0; d < nv; d += KVS__W) {
            int lane = v_find(v_ldu(kr + d), kmax);
            if (lane >= 0) {
                idx = d + (uint32_t)lane;
                break;
            }
        }
        picked[(*np)++] = idx;
        kr[idx] = 0;
        if (q + 1 < k) {
            M = v_bcu(0);
            for (d = 0; d < nv; d += KVS__W)
                M = v_max(M, v_ldu(kr + d));
            kmax = v_hmax(M);
        }
    }
    for (d = 0; d < nv; d += KVS__W)
        F = v_spill(F, v_ldu(kr + d));
    return v_hmax(F);
}

/* Selection with packed keys (fp16/bf16, k <= 4): per-lane min/max chains,
 * one horizontal max per round. Returns the spill key, or UINT32_MAX when the
 * row needs the exact selection (NaN, or an Inf among the non-outliers). */
KVS__AI uint32_t qv_select_packed(const void *src, const kvs_dtype dt, size_t off, uint32_t D,
                                  const unsigned k, float *xr, uint32_t *picked, unsigned *np)
{
    const vu z = v_bcu(0), one = v_bcu(KVS__PK_ONE);
    vu P0 = z, P1 = z, P2 = z, P3 = z, spill = z, amax = z;
    const vu inv_iota = v_subu(v_bcu(1023u), v_iota()); /* 1023 - index = inv_iota - d */
    const uint32_t nfull = D / KVS__W * KVS__W;
    uint32_t d = 0;
    for (; d < nfull; d += KVS__W) {
        const vf x = v_ld(src, dt, off + d);
        const vu a = v_abs(x);
        v_stf(xr + d, x);
        amax = v_max(amax, a);
        const vu pk = v_or(v_addu(a, one), v_subu(inv_iota, v_bcu(d)));
        KVS__PK_INSERT(k, pk);
    }
    if (d < D) {
        const vf x = v_ld_n(src, dt, off + d, D - d);
        const vu a = v_abs(x);
        v_stf(xr + d, x);
        amax = v_max(amax, a);
        const vu pk = v_keep(v_or(v_addu(a, one), v_subu(inv_iota, v_bcu(d))), D - d);
        KVS__PK_INSERT(k, pk);
    }
    if (v_hmax(amax) > 0x7F800000u)
        return UINT32_MAX;
    for (unsigned q = 0; q < k; q++) {
        const uint32_t best = v_hmax(P0);
        if (best == 0) {
            break;
        }
        const uint32_t idx = pk_index(best);
        picked[(*np)++] = idx;
        const vm lm = v_lane(idx % KVS__W);
        if (k > 0)
            P0 = v_sel(lm, k > 1 ? P1 : z, P0);
        if (k > 1)
            P1 = v_sel(lm, k > 2 ? P2 : z, P1);
        if (k > 2)
            P2 = v_sel(lm, k > 3 ? P3 : z, P2);
        if (k > 3)
            P3 = v_sel(lm, z, P3);
    }
    if (k > 0)
        spill = v_max(spill, P0);
    if (k > 1)
        spill = v_max(spill, P1);
    if (k > 2)
        spill = v_max(spill, P2);
    if (k > 3)
        spill = v_max(spill, P3);
    const uint32_t sp = v_hmax(spill);
    if (sp >= KVS__PK_INF) { /* an Inf that is not an outlier: start over, exactly */
        *np = 0;
        return UINT32_MAX;
    }
    return pk_key(sp);
}

KVS__AI uint32_t qv_select(const void *src, const kvs_dtype dt, size_t off, uint32_t D, unsigned k,
                           float *xr, uint32_t *kr, uint32_t *picked, unsigned *np)
{
    if (dt != KVS_DTYPE_FP32 && k <= 4) {
        uint32_t sp = UINT32_MAX;
        switch (k) {
        case 0:
            sp = qv_select_packed(src, dt, off, D, 0, xr, picked, np);
            break;
        case 1:
            sp = qv_select_packed(src, dt, off, D, 1, xr, picked, np);
            break;
        case 2:
            sp = qv_select_packed(src, dt, off, D, 2, xr, picked, np);
            break;
        case 3:
            sp = qv_select_packed(src, dt, off, D, 3, xr, picked, np);
            break;
        case 4:
            sp = qv_select_packed(src, dt, off, D, 4, xr, picked, np);
            break;
        default:
            break;
        }
        if (sp != UINT32_MAX)
            return sp;
    }
    switch (k) {
    case 0:
        return qv_select_small(src, dt, off, D, 0, xr, picked, np);
    case 1:
        return qv_select_small(src, dt, off, D, 1, xr, picked, np);
    case 2:
        return qv_select_small(src, dt, off, D, 2, xr, picked, np);
    case 3:
        return qv_select_small(src, dt, off, D, 3, xr, picked, np);
    case 4:
        return qv_select_small(src, dt, off, D, 4, xr, picked, np);
    default:
        return qv_select_any(src, dt, off, D, k, xr, kr, picked, np);
    }
}

/* One specialisation per source dtype, shared by the three schemes. */
#define KVS__QV_SEL(DTN, DT)                                                                       \
    static uint32_t qv_select_##DTN(const void *src, size_t off, uint32_t D, unsigned k,           \
                                    float *xr, uint32_t *kr, uint32_t *picked, unsigned *np)       \
    {                                                                                              \
        return qv_select(src, DT, off, D, k, xr, kr, picked, np);                                  \
    }
KVS__QV_SEL(f16, KVS_DTYPE_FP16)
KVS__QV_SEL(bf16, KVS_DTYPE_BF16)
KVS__QV_SEL(f32, KVS_DTYPE_FP32)

KVS__AI void qv_tile(const kvs__cpu_qjob *j, const kvs_dtype dt, const kvs_scheme s)
{
    KVS__ALIGN float xr[KVS_TILE_MAX_DIM];
    KVS__ALIGN uint32_t kr[KVS_TILE_MAX_DIM];
    const uint32_t D = j->D, k = j->k, T = j->T;
    const void *src = j->src;
    const size_t stride = j->stride;
    unsigned char *pay = j->pay;
    const kvs_tile_layout l = j->l; /* a copy: the stores below may alias *j */
    const uint32_t nfull = D / KVS__W * KVS__W;
    const unsigned rem = D - nfull;
    const float qmax = qmax_of(s);
    unsigned char *outl = pay + l.outliers;
    const uint32_t E = l.entry;
    for (uint32_t t = 0; t < j->S; t++) { /* sink rows: scale 0, empty slots */
        put_u16(pay + l.scales + 2u * t, 0);
        for (uint32_t q = 0; q < k; q++)
            kvs_outlier_put(outl + E * ((size_t)t * k + q), E, KVS_OUTLIER_EMPTY, 0);
    }
    const size_t es = dt == KVS_DTYPE_FP32 ? 4u : 2u;
    for (uint32_t t = j->S; t < T; t++) {
        const size_t off = (size_t)t * stride;
        unsigned char *slots = outl + (size_t)t * k * E;
        if (t + 2 < T)
            prefetch_row((const unsigned char *)src + (off + 2 * stride) * es, D * es, 0);
        unsigned char *crow = pay + l.codes + (size_t)t * D;
        uint32_t picked[KVS__KMAX];
        unsigned np = 0;
        uint32_t spill;
        if (dt == KVS_DTYPE_FP16)
            spill = qv_select_f16(src, off, D, k, xr, kr, picked, &np);
        else if (dt == KVS_DTYPE_BF16)
            spill = qv_select_bf16(src, off, D, k, xr, kr, picked, &np);
        else
            spill = qv_select_f32(src, off, D, k, xr, kr, picked, &np);
        /* the slots in rank order (empty past the row's length), the scale
         * from the rest, then codes */
        for (unsigned q = 0; q < k; q++)
            kvs_outlier_put(slots + E * q, E, q < np ? picked[q] : KVS_OUTLIER_EMPTY,
                            q < np ? kvq_f32_to_fp16(xr[picked[q]]) : 0);
        const uint16_t scale = group_scale(j, t, spill, qmax);
        put_u16(pay + l.scales + 2u * t, scale);
        const float inv = kvq_scale_inv(kvq_fp16_to_f32(scale));
        const vf iv = v_bcf(inv);
        const int fix = inv == 0.0f;
        uint32_t d;
        for (d = 0; d < nfull; d += KVS__W)
            v_stc(crow + d, v_enc(s, scaled(v_ldf(xr + d), iv, fix)));
        if (rem)
            v_stc_n(crow + d, v_enc(s, scaled(v_ldf(xr + d), iv, fix)), rem);
        for (unsigned q = 0; q < np; q++)
            crow[picked[q]] = 0;
    }
}

/* ---- quantize: one specialised function per (kind, dtype, scheme) --------- */

#define KVS__Q_FN(KIND, DTN, DT, SN, S)                                                            \
    static void q##KIND##_##DTN##_##SN(const kvs__cpu_qjob *j)                                     \
    {                                                                                              \
        q##KIND##_tile(j, DT, S);                                                                  \
    }

#define KVS__Q_FNS(KIND, DTN, DT)                                                                  \
    KVS__Q_FN(KIND, DTN, DT, e4m3, KVS_SCHEME_FP8_E4M3)                                            \
    KVS__Q_FN(KIND, DTN, DT, e5m2, KVS_SCHEME_FP8_E5M2)                                            \
    KVS__Q_FN(KIND, DTN, DT, int8, KVS_SCHEME_INT8)
KVS__Q_FNS(k, f16, KVS_DTYPE_FP16)
KVS__Q_FNS(k, bf16, KVS_DTYPE_BF16)
KVS__Q_FNS(k, f32, KVS_DTYPE_FP32)
KVS__Q_FNS(v, f16, KVS_DTYPE_FP16)
KVS__Q_FNS(v, bf16, KVS_DTYPE_BF16)
KVS__Q_FNS(v, f32, KVS_DTYPE_FP32)
KVS__Q_FNS(ko, f16, KVS_DTYPE_FP16)
KVS__Q_FNS(ko, bf16, KVS_DTYPE_BF16)
KVS__Q_FNS(ko, f32, KVS_DTYPE_FP32)

typedef void (*kvs__q_fn)(const kvs__cpu_qjob *);
/* [kind][dtype - 1][scheme - 2] */
static const kvs__q_fn q_table[2][3][3] = {
    {{qk_f16_e4m3, qk_f16_e5m2, qk_f16_int8},
     {qk_bf16_e4m3, qk_bf16_e5m2, qk_bf16_int8},
     {qk_f32_e4m3, qk_f32_e5m2, qk_f32_int8}},
    {{qv_f16_e4m3, qv_f16_e5m2, qv_f16_int8},
     {qv_bf16_e4m3, qv_bf16_e5m2, qv_bf16_int8},
     {qv_f32_e4m3, qv_f32_e5m2, qv_f32_int8}},
};
/* K tiles with key offsets: [dtype - 1][scheme - 2] */
static const kvs__q_fn qko_table[3][3] = {
    {qko_f16_e4m3, qko_f16_e5m2, qko_f16_int8},
    {qko_bf16_e4m3, qko_bf16_e5m2, qko_bf16_int8},
    {qko_f32_e4m3, qko_f32_e5m2, qko_f32_int8},
};

static void fp16_rows(const void *src, kvs_dtype dt, size_t stride, uint32_t t0, uint32_t t1,
                      uint32_t D, unsigned char *out)
{
    switch (dt) {
    case KVS_DTYPE_FP16:
        rows_to_fp16(src, KVS_DTYPE_FP16, stride, t0, t1, D, out);
        break;
    case KVS_DTYPE_BF16:
        rows_to_fp16(src, KVS_DTYPE_BF16, stride, t0, t1, D, out);
        break;
    default:
        rows_to_fp16(src, KVS_DTYPE_FP32, stride, t0, t1, D, out);
        break;
    }
}

void KVS__QUANTIZE(const kvs__cpu_qjob *j)
{
    if (j->scheme == KVS_SCHEME_FP16) {
        fp16_rows(j->src, j->dtype, j->stride, 0, j->T, j->D, j->pay);
        return;
    }
    if (j->S) { /* sink rows: fp16 copies, codes 0 */
        fp16_rows(j->src, j->dtype, j->stride, 0, j->S, j->D, j->pay + j->l.sinks);
        memset(j->pay + j->l.codes, 0, (size_t)j->S * j->D);
    }
    if (j->koff) /* K tiles only (kvs_tile_params_check) */
        qko_table[j->dtype - 1][j->scheme - 2](j);
    else
        q_table[j->kind == KVS_TILE_V][j->dtype - 1][j->scheme - 2](j);
}

/* ---- dequantize ----------------------------------------------------------- */

/* decode(code) * scale: one IEEE multiply per element, as in the reference.
 * Scales are fp16 (kvs_tile_check has refused negative, NaN and infinite
 * ones), widened exactly to fp32 once per tile (K) or row (V). */
KVS__AI void dq_tile(const kvs__cpu_djob *j, const kvs_dtype dt, const kvs_scheme s,
                     const kvs_tile_kind kind, const int koff)
{
    KVS__ALIGN float ksc[KVS_TILE_MAX_DIM];
    KVS__ALIGN float kof[KVS_TILE_MAX_DIM]; /* koff: the channels' offsets, fp32 */
    const uint32_t D = j->D, T = j->T;
    void *const dst = j->dst;
    const size_t stride = j->stride;
    const unsigned char *const codes = j->pay + j->l.codes;
    const uint32_t nfull = D / KVS__W * KVS__W;
    const unsigned char *scales = j->pay + j->l.scales;
    if (kind == KVS_TILE_K) {
        for (uint32_t g = 0; g < D; g++)
            ksc[g] = kvq_fp16_to_f32(get_u16(scales + 2u * g));
        for (uint32_t g = D; g % KVS__W; g++) /* the tail vector's unused lanes */
            ksc[g] = 0.0f;
    }
    if (koff) { /* K tiles only (kvs_tile_check); kvs_tile_check refused non-finite ones */
        const unsigned char *offs = j->pay + j->l.offsets;
        for (uint32_t g = 0; g < D; g++)
            kof[g] = kvq_fp16_to_f32(get_u16(offs + 2u * g));
        for (uint32_t g = D; g % KVS__W; g++)
            kof[g] = 0.0f;
    }
    const size_t es = dt == KVS_DTYPE_FP32 ? 4u : 2u;
    for (uint32_t t = j->S; t < T; t++) {
        const unsigned char *crow = codes + (size_t)t * D;
        const size_t off = (size_t)t * stride;
        if (t + 4 < T) {
            prefetch_row(crow + 4 * D, D, 0);
            prefetch_row((unsigned char *)dst + (off + 4 * stride) * es, D * es, 1);
        }
        const float s1 = kind == KVS_TILE_V ? kvq_fp16_to_f32(get_u16(scales + 2u * t)) : 0.0f;
        const vf sv = v_bcf(s1);
        uint32_t d = 0;
        for (; d < nfull; d += KVS__W) {
            vf sc = kind == KVS_TILE_K ? v_ldf(ksc + d) : sv;
            vf x = v_mul(v_dec(s, crow + d), sc);
            v_st(dst, dt, off + d, koff ? v_add(x, v_ldf(kof + d)) : x);
        }
        if (d < D) {
            unsigned n = D - d;
            vf sc = kind == KVS_TILE_K ? v_ldf(ksc + d) : sv;
            vf x = v_mul(v_dec_n(s, crow + d, n), sc);
            v_st_n(dst, dt, off + d, koff ? v_add(x, v_ldf(kof + d)) : x, n);
        }
    }
}

#define KVS__DQ_FN(DTN, DT, SN, S)                                                                 \
    static void dqk_##DTN##_##SN(const kvs__cpu_djob *j)                                           \
    {                                                                                              \
        dq_tile(j, DT, S, KVS_TILE_K, 0);                                                          \
    }                                                                                              \
    static void dqko_##DTN##_##SN(const kvs__cpu_djob *j)                                          \
    {                                                                                              \
        dq_tile(j, DT, S, KVS_TILE_K, 1);                                                          \
    }                                                                                              \
    static void dqv_##DTN##_##SN(const kvs__cpu_djob *j)                                           \
    {                                                                                              \
        dq_tile(j, DT, S, KVS_TILE_V, 0);                                                          \
    }
#define KVS__DQ_FNS(DTN, DT)                                                                       \
    KVS__DQ_FN(DTN, DT, e4m3, KVS_SCHEME_FP8_E4M3)                                                 \
    KVS__DQ_FN(DTN, DT, e5m2, KVS_SCHEME_FP8_E5M2)                                                 \
    KVS__DQ_FN(DTN, DT, int8, KVS_SCHEME_INT8)
KVS__DQ_FNS(f16, KVS_DTYPE_FP16)
KVS__DQ_FNS(bf16, KVS_DTYPE_BF16)
KVS__DQ_FNS(f32, KVS_DTYPE_FP32)

typedef void (*kvs__dq_fn)(const kvs__cpu_djob *);
static const kvs__dq_fn dq_table[2][3][3] = {
    {{dqk_f16_e4m3, dqk_f16_e5m2, dqk_f16_int8},
     {dqk_bf16_e4m3, dqk_bf16_e5m2, dqk_bf16_int8},
     {dqk_f32_e4m3, dqk_f32_e5m2, dqk_f32_int8}},
    {{dqv_f16_e4m3, dqv_f16_e5m2, dqv_f16_int8},
     {dqv_bf16_e4m3, dqv_bf16_e5m2, dqv_bf16_int8},
     {dqv_f32_e4m3, dqv_f32_e5m2, dqv_f32_int8}},
};
/* K tiles with key offsets: [dtype - 1][scheme - 2] */
static const kvs__dq_fn dqko_table[3][3] = {
    {dqko_f16_e4m3, dqko_f16_e5m2, dqko_f16_int8},
    {dqko_bf16_e4m3, dqko_bf16_e5m2, dqko_bf16_int8},
    {dqko_f32_e4m3, dqko_f32_e5m2, dqko_f32_int8},
};

/* fp16 rows (payload or sinks, [rows][D]) to the view, through fp32 as the
 * reference does (which quiets signalling NaNs). */
KVS__AI void fp16_to_view(const unsigned char *in, uint32_t t0, uint32_t t1, uint32_t D, void *dst,
                          const kvs_dtype dt, size_t stride)
{
    const uint32_t nfull = D / KVS__W * KVS__W;
    for (uint32_t t = t0; t < t1; t++) {
        const unsigned char *row = in + (size_t)(t - t0) * D * 2u;
        size_t off = (size_t)t * stride;
        uint32_t d = 0;
        for (; d < nfull; d += KVS__W)
            v_st(dst, dt, off + d, v_ld(row, KVS_DTYPE_FP16, d));
        if (d < D)
            v_st_n(dst, dt, off + d, v_ld_n(row, KVS_DTYPE_FP16, d, D - d), D - d);
    }
}

static void fp16_view(const unsigned char *in, uint32_t t0, uint32_t t1, uint32_t D, void *dst,
                      kvs_dtype dt, size_t stride)
{
    switch (dt) {
    case KVS_DTYPE_FP16:
        fp16_to_view(in, t0, t1, D, dst, KVS_DTYPE_FP16, stride);
        break;
    case KVS_DTYPE_BF16:
        fp16_to_view(in, t0, t1, D, dst, KVS_DTYPE_BF16, stride);
        break;
    default:
        fp16_to_view(in, t0, t1, D, dst, KVS_DTYPE_FP32, stride);
        break;
    }
}

void KVS__DEQUANTIZE(const kvs__cpu_djob *j)
{
    if (j->scheme == KVS_SCHEME_FP16) {
        fp16_view(j->pay, 0, j->T, j->D, j->dst, j->dtype, j->stride);
        return;
    }
    if (j->S)
        fp16_view(j->pay + j->l.sinks, 0, j->S, j->D, j->dst, j->dtype, j->stride);
    if (j->koff)
        dqko_table[j->dtype - 1][j->scheme - 2](j);
    else
        dq_table[j->kind == KVS_TILE_V][j->dtype - 1][j->scheme - 2](j);
    /* Outlier slots overwrite their element, in slot order (a repeated index:
     * the last one wins, as in the reference). */
    const uint32_t k = j->k, E = j->l.entry;
    const uint32_t span = j->kind == KVS_TILE_K ? j->T : j->D;
    for (uint32_t g = j->kind == KVS_TILE_K ? 0 : j->S; g < j->l.groups; g++) {
        const unsigned char *slots = j->pay + j->l.outliers + (size_t)g * k * E;
        for (uint32_t q = 0; q < k; q++) {
            uint32_t index;
            uint16_t value;
            kvs_outlier_get(slots + E * q, E, &index, &value);
            if (index >= span) /* empty */
                continue;
            uint32_t t = j->kind == KVS_TILE_K ? index : g;
            uint32_t d = j->kind == KVS_TILE_K ? g : index;
            s_st(j->dst, j->dtype, (size_t)t * j->stride + d, kvq_fp16_to_f32(value));
        }
    }
}
