/*
 * kvq_cpu_avx2.c — the fast path on AVX2 + F16C: the body of kvq_cpu_body.h
 * over 8 fp32 lanes. Compiled with -mavx2 -mf16c (kernels/cpu/CMakeLists.txt)
 * and only called after kvs_cpu_isa_detect saw both at run time.
 *
 * Same arithmetic as kvq_cpu_avx512.c (see its comment for why each step is
 * exact), with vector masks instead of mask registers. AVX2 has no masked
 * 8/16-bit loads or stores, so a tail of n < 8 elements bounces through a
 * small zeroed stack buffer: only the n elements of the view are copied in
 * or out. The FP8 subnormal rounding uses a plain fp32 add, so it relies on
 * the default round-to-nearest mode, like the reference's own multiply.
 */
#include "kvq_cpu_impl.h"
#include "kvq_math.h"

#include <immintrin.h>
#include <string.h>

#define KVS__W          8
#define KVS__QUANTIZE   kvs__cpu_quantize_avx2
#define KVS__DEQUANTIZE kvs__cpu_dequantize_avx2

typedef __m256 vf;
typedef __m256i vu;
typedef __m256i vm;

#define VL       static inline __attribute__((always_inline))
#define ABS_MASK 0x7FFFFFFF
#define F32_INF  0x7F800000

VL vu c32(uint32_t u)
{
    return _mm256_set1_epi32((int)u);
}

/* a > b for u32 lanes that are all < 2^31 (keys, |x| bits). */
VL vu gt31(vu a, vu b)
{
    return _mm256_cmpgt_epi32(a, b);
}

VL vf bf16_widen(__m128i h)
{
    vu u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
    vu nan = gt31(_mm256_and_si256(u, c32(ABS_MASK)), c32(F32_INF));
    return _mm256_castsi256_ps(_mm256_or_si256(u, _mm256_and_si256(nan, c32(0x00400000u))));
}

VL __m128i bf16_narrow(vf x)
{
    vu u = _mm256_castps_si256(x);
    vu hi = _mm256_srli_epi32(u, 16);
    vu nan = gt31(_mm256_and_si256(u, c32(ABS_MASK)), c32(F32_INF));
    vu r = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, c32(0x7FFFu)), _mm256_and_si256(hi, c32(1))), 16);
    r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, c32(0x40u)), nan);
    r = _mm256_packus_epi32(r, r); /* lanes: r0-3 r0-3 | r4-7 r4-7 */
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(r, 0x08));
}

VL const void *at(const void *base, size_t bytes)
{
    return (const unsigned char *)base + bytes;
}
VL void *at_w(void *base, size_t bytes)
{
    return (unsigned char *)base + bytes;
}
VL size_t esize(kvs_dtype dt)
{
    return dt == KVS_DTYPE_FP32 ? 4u : 2u;
}

VL vf v_ld(const void *base, kvs_dtype dt, size_t i)
{
    if (dt == KVS_DTYPE_FP32)
        return _mm256_loadu_ps(at(base, 4 * i));
    __m128i h = _mm_loadu_si128((const __m128i *)at(base, 2 * i));
    return dt == KVS_DTYPE_FP16 ? _mm256_cvtph_ps(h) : bf16_widen(h);
}

VL vf v_ld_n(const void *base, kvs_dtype dt, size_t i, unsigned n)
{
    _Alignas(32) unsigned char tmp[32] = {0};
    memcpy(tmp, at(base, esize(dt) * i), esize(dt) * n);
    return v_ld(tmp, dt, 0);
}

VL void v_st(void *base, kvs_dtype dt, size_t i, vf x)
{
    if (dt == KVS_DTYPE_FP32)
        _mm256_storeu_ps(at_w(base, 4 * i), x);
    else
        _mm_storeu_si128((__m128i *)at_w(base, 2 * i),
                         dt == KVS_DTYPE_FP16 ? _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT)
                                              : bf16_narrow(x));
}

VL void v_st_n(void *base, kvs_dtype dt, size_t i, vf x, unsigned n)
{
    _Alignas(32) unsigned char tmp[32];
    v_st(tmp, dt, 0, x);
    memcpy(at_w(base, esize(dt) * i), tmp, esize(dt) * n);
}

VL vf v_ldf(const float *p)
{
    return _mm256_load_ps(p);
}
VL void v_stf(float *p, vf x)
{
    _mm256_store_ps(p, x);
}
VL vu v_ldu(const uint32_t *p)
{
    return _mm256_load_si256((const __m256i *)p);
}
VL void v_stu(uint32_t *p, vu x)
{
    _mm256_store_si256((__m256i *)p, x);
}
/* Low byte of each lane, packed into the low 8 bytes. */
VL __m128i bytes_of(vu c)
{
    const vu pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0,
                                     4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    vu b = _mm256_shuffle_epi8(c, pick);
    b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1));
    return _mm256_castsi256_si128(b);
}

VL void v_stc(unsigned char *p, vu c)
{
    _mm_storel_epi64((__m128i *)p, bytes_of(c));
}

VL void v_stc_n(unsigned char *p, vu c, unsigned n)
{
    _Alignas(16) unsigned char tmp[16];
    _mm_store_si128((__m128i *)tmp, bytes_of(c));
    memcpy(p, tmp, n);
}

/* 8 FP8 codes (zero-extended to u16) to fp32. */
VL vf dec_fp8(kvs_scheme s, __m128i c)
{
    const __m128i mag = _mm_and_si128(c, _mm_set1_epi16(0x7F));
    const vf qnan = _mm256_castsi256_ps(c32(KVQ_F32_CANONICAL_NAN));
    vf f;
    __m128i nan;
    if (s == KVS_SCHEME_FP8_E5M2) {
        f = _mm256_cvtph_ps(_mm_slli_epi16(c, 8));
        nan = _mm_cmpgt_epi16(mag, _mm_set1_epi16(0x7C));
    } else {
        /* c << 7 puts the magnitude at bits 13..7 and the sign at bit 14;
         * adding bit 14 to itself carries the sign up to bit 15 */
        __m128i h = _mm_slli_epi16(c, 7);
        h = _mm_add_epi16(h, _mm_and_si128(h, _mm_set1_epi16(0x4000)));
        f = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
        nan = _mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7F));
    }
    return _mm256_blendv_ps(f, qnan, _mm256_castsi256_ps(_mm256_cvtepi16_epi32(nan)));
}

VL vf v_dec(kvs_scheme s, const unsigned char *p)
{
    __m128i b = _mm_loadl_epi64((const __m128i *)p);
    if (s == KVS_SCHEME_INT8)
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    return dec_fp8(s, _mm_cvtepu8_epi16(b));
}

VL vf v_dec_n(kvs_scheme s, const unsigned char *p, unsigned n)
{
    _Alignas(16) unsigned char tmp[16] = {0};
    memcpy(tmp, p, n);
    return v_dec(s, tmp);
}

/* kvq__fp8_encode on 8 lanes; see kvq_cpu_avx512.c. */
VL vu enc_fp8(vf y, unsigned mbits, uint32_t bias, uint32_t max_bits)
{
    const unsigned shift = 23u - mbits;
    const uint32_t min_normal = (128u - bias) << 23;
    const vu u = _mm256_castps_si256(y);
    const vu a = _mm256_and_si256(u, c32(ABS_MASK));
    const vu ac = _mm256_min_epu32(a, c32(max_bits));
    vu norm = _mm256_add_epi32(ac, c32((1u << (shift - 1)) - 1u - ((127u - bias) << 23)));
    norm = _mm256_add_epi32(norm, _mm256_and_si256(_mm256_srli_epi32(ac, shift), c32(1)));
    norm = _mm256_srli_epi32(norm, shift);
    const uint32_t magic = (uint32_t)(23 + 1 - (int)bias - (int)mbits + 127) << 23;
    vf sum = _mm256_add_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(c32(magic)));
    vu sub = _mm256_sub_epi32(_mm256_castps_si256(sum), c32(magic));
    vu code = _mm256_blendv_epi8(norm, sub, gt31(c32(min_normal), a));
    code = _mm256_or_si256(code, _mm256_and_si256(_mm256_srli_epi32(u, 24), c32(0x80)));
    return _mm256_blendv_epi8(code, c32(KVQ_FP8_NAN_CODE), gt31(a, c32(F32_INF)));
}

VL vu v_enc(kvs_scheme s, vf y)
{
    if (s == KVS_SCHEME_INT8) {
        vf num = _mm256_cmp_ps(y, y, _CMP_ORD_Q);
        vf yc = _mm256_min_ps(_mm256_max_ps(y, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
        return _mm256_and_si256(_mm256_cvtps_epi32(yc), _mm256_castps_si256(num));
    }
    if (s == KVS_SCHEME_FP8_E5M2)
        return enc_fp8(y, 2u, 15u, 0x47600000u);
    return enc_fp8(y, 3u, 7u, 0x43E00000u);
}

VL vf v_mul(vf a, vf b)
{
    return _mm256_mul_ps(a, b);
}
VL vf v_add(vf a, vf b)
{
    return _mm256_add_ps(a, b);
}
VL vf v_sub(vf a, vf b)
{
    return _mm256_sub_ps(a, b);
}

VL vf v_fixinf(vf y, vf x, vf iv)
{
    vu inf =
        _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(x), c32(ABS_MASK)), c32(F32_INF));
    vf z =
        _mm256_and_ps(_mm256_castsi256_ps(inf), _mm256_cmp_ps(iv, _mm256_setzero_ps(), _CMP_EQ_OQ));
    return _mm256_blendv_ps(y, x, z);
}
VL vf v_bcf(float f)
{
    return _mm256_set1_ps(f);
}
VL vu v_bcu(uint32_t u)
{
    return c32(u);
}

VL vu v_key(vf x)
{
    vu a = _mm256_and_si256(_mm256_castps_si256(x), c32(ABS_MASK));
    return _mm256_blendv_epi8(_mm256_add_epi32(a, c32(2)), c32(1), gt31(a, c32(F32_INF)));
}

VL vm v_gt(vu a, vu b)
{
    return gt31(a, b);
}
VL vu v_sel(vm m, vu a, vu b)
{
    return _mm256_blendv_epi8(b, a, m);
}
VL vu v_max(vu a, vu b)
{
    return _mm256_max_epu32(a, b);
}

VL vu v_spill(vu sp, vu fall)
{
    vu inf = _mm256_cmpeq_epi32(fall, c32(0x7F800002u));
    return _mm256_max_epu32(sp, _mm256_andnot_si256(inf, fall));
}

VL vu v_keep(vu x, unsigned n)
{
    vu keep = _mm256_cmpgt_epi32(c32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_and_si256(x, keep);
}

VL uint32_t v_hmax(vu x)
{
    vu m = _mm256_max_epu32(x, _mm256_permute2x128_si256(x, x, 1));
    m = _mm256_max_epu32(m, _mm256_shuffle_epi32(m, 0x4E));
    m = _mm256_max_epu32(m, _mm256_shuffle_epi32(m, 0xB1));
    return (uint32_t)_mm256_cvtsi256_si32(m);
}

VL uint32_t v_hmin(vu x)
{
    vu m = _mm256_min_epu32(x, _mm256_permute2x128_si256(x, x, 1));
    m = _mm256_min_epu32(m, _mm256_shuffle_epi32(m, 0x4E));
    m = _mm256_min_epu32(m, _mm256_shuffle_epi32(m, 0xB1));
    return (uint32_t)_mm256_cvtsi256_si32(m);
}

VL vm v_eq(vu a, vu b)
{
    return _mm256_cmpeq_epi32(a, b);
}
VL vu v_addu(vu a, vu b)
{
    return _mm256_add_epi32(a, b);
}
VL vu v_subu(vu a, vu b)
{
    return _mm256_sub_epi32(a, b);
}
VL vu v_or(vu a, vu b)
{
    return _mm256_or_si256(a, b);
}
VL vu v_min(vu a, vu b)
{
    return _mm256_min_epu32(a, b);
}
VL vu v_abs(vf x)
{
    return _mm256_and_si256(_mm256_castps_si256(x), c32(ABS_MASK));
}
/* Sign set: all bits flipped; clear: the sign bit set. */
VL vu v_ord(vf x)
{
    vu u = _mm256_castps_si256(x);
    return _mm256_xor_si256(u, _mm256_or_si256(_mm256_srai_epi32(u, 31), c32(0x80000000u)));
}
VL vu v_iota(void)
{
    return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
}
VL vm v_lane(unsigned lane)
{
    return _mm256_cmpeq_epi32(v_iota(), c32(lane));
}

VL int v_find(vu x, uint32_t key)
{
    int m = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(x, c32(key))));
    return m ? __builtin_ctz((unsigned)m) : -1;
}

/* Eight at a time from the top: the block at i reads halves i..i+7 before it
 * writes bytes 4i..4i+31, past every half a lower block reads; the unaligned
 * load and store may alias, so their order is kept. The n % 8 top elements
 * go first, one by one. */
void kvs__cpu_widen_avx2(float *t, size_t n)
{
    const unsigned char *h = (const unsigned char *)t;
    size_t i = n;
    for (; i % 8; i--) {
        uint16_t x;
        memcpy(&x, h + 2 * (i - 1), sizeof x);
        t[i - 1] = kvq_fp16_to_f32(x);
    }
    while (i > 0) {
        i -= 8;
        __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(h + 2 * i));
        _mm256_storeu_ps(t + i, _mm256_cvtph_ps(x));
    }
}

#include "kvq_cpu_body.h"
