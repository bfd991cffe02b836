/*
 * kvq_cpu_avx512.c — the fast path on AVX-512 (F + BW + VL; F16C's 512-bit
 * forms are part of AVX-512F): the body of kvq_cpu_body.h over 16 fp32 lanes.
 * Compiled with -mavx512f -mavx512bw -mavx512vl -mf16c (kernels/cpu/
 * CMakeLists.txt) and only called after kvs_cpu_isa_detect saw those
 * features at run time.
 *
 * Exactness, lane by lane against kvq_math.h:
 *   - fp16 -> fp32 is vcvtph2ps (exact; NaN keeps sign and payload, made
 *     quiet, as kvq_fp16_to_f32); fp32 -> fp16 is vcvtps2ph with
 *     round-to-nearest-even (overflow to Inf, NaN -> sign|0x7E00|payload>>13,
 *     as kvq_f32_to_fp16). bf16 both ways is integer arithmetic, the same
 *     formulas as kvq_bf16_to_f32 / kvq_f32_to_bf16.
 *   - FP8 encode: |y| >= the min normal takes kvq__fp8_encode's normal branch
 *     in integer form (add the rounding bias and the kept LSB, shift); below
 *     it, |y| + 2^k with 2^(k-23) = the smallest FP8 subnormal rounds |y| to
 *     a whole number of subnormal units, ties to even, in one fp32 add (with
 *     explicit round-to-nearest, so MXCSR does not matter); |y| is clamped to
 *     max first (satfinite), the sign ORed in, NaN lanes set to 0x7F.
 *   - INT8: clamp to ±127 in fp32, vcvtps2dq (round to nearest even, as
 *     rintf in the default mode), NaN lanes 0.
 *   - FP8 decode: the code becomes an fp16 bit pattern (E5M2 is the top byte
 *     of an fp16; E4M3 shifted in is its value times 2^-8, subnormals
 *     included) widened by vcvtph2ps and, for E4M3, multiplied by 2^8 (exact);
 *     NaN codes give the canonical 0x7FFFFFFF.
 */
#include "kvq_cpu_impl.h"
#include "kvq_math.h"

#include <immintrin.h>
#include <string.h>

#define KVS__W          16
#define KVS__QUANTIZE   kvs__cpu_quantize_avx512
#define KVS__DEQUANTIZE kvs__cpu_dequantize_avx512

typedef __m512 vf;
typedef __m512i vu;
typedef __mmask16 vm;

#define VL       static inline __attribute__((always_inline))
#define ABS_MASK 0x7FFFFFFF
#define F32_INF  0x7F800000

VL __mmask16 lanes(unsigned n)
{
    return (__mmask16)((1u << n) - 1u);
}
VL vu c32(uint32_t u)
{
    return _mm512_set1_epi32((int)u);
}

VL vf bf16_widen(__m256i h)
{
    vu u = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, c32(ABS_MASK)), c32(F32_INF));
    return _mm512_castsi512_ps(_mm512_mask_or_epi32(u, nan, u, c32(0x00400000u)));
}

VL __m256i bf16_narrow(vf x)
{
    vu u = _mm512_castps_si512(x);
    vu hi = _mm512_srli_epi32(u, 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, c32(ABS_MASK)), c32(F32_INF));
    vu r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, c32(0x7FFFu)), _mm512_and_si512(hi, c32(1))), 16);
    r = _mm512_mask_or_epi32(r, nan, hi, c32(0x40u));
    return _mm512_cvtepi32_epi16(r);
}

VL const void *at(const void *base, size_t bytes)
{
    return (const unsigned char *)base + bytes;
}
VL void *at_w(void *base, size_t bytes)
{
    return (unsigned char *)base + bytes;
}

VL vf v_ld(const void *base, kvs_dtype dt, size_t i)
{
    if (dt == KVS_DTYPE_FP32)
        return _mm512_loadu_ps(at(base, 4 * i));
    __m256i h = _mm256_loadu_si256((const __m256i *)at(base, 2 * i));
    return dt == KVS_DTYPE_FP16 ? _mm512_cvtph_ps(h) : bf16_widen(h);
}

VL vf v_ld_n(const void *base, kvs_dtype dt, size_t i, unsigned n)
{
    if (dt == KVS_DTYPE_FP32)
        return _mm512_maskz_loadu_ps(lanes(n), at(base, 4 * i));
    __m256i h = _mm256_maskz_loadu_epi16(lanes(n), at(base, 2 * i));
    return dt == KVS_DTYPE_FP16 ? _mm512_cvtph_ps(h) : bf16_widen(h);
}

VL __m256i narrow16(kvs_dtype dt, vf x)
{
    return dt == KVS_DTYPE_FP16 ? _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT) : bf16_narrow(x);
}

VL void v_st(void *base, kvs_dtype dt, size_t i, vf x)
{
    if (dt == KVS_DTYPE_FP32)
        _mm512_storeu_ps(at_w(base, 4 * i), x);
    else
        _mm256_storeu_si256((__m256i *)at_w(base, 2 * i), narrow16(dt, x));
}

VL void v_st_n(void *base, kvs_dtype dt, size_t i, vf x, unsigned n)
{
    if (dt == KVS_DTYPE_FP32)
        _mm512_mask_storeu_ps(at_w(base, 4 * i), lanes(n), x);
    else
        _mm256_mask_storeu_epi16(at_w(base, 2 * i), lanes(n), narrow16(dt, x));
}

VL vf v_ldf(const float *p)
{
    return _mm512_load_ps(p);
}
VL void v_stf(float *p, vf x)
{
    _mm512_store_ps(p, x);
}
VL vu v_ldu(const uint32_t *p)
{
    return _mm512_load_si512(p);
}
VL void v_stu(uint32_t *p, vu x)
{
    _mm512_store_si512(p, x);
}
VL void v_stc(unsigned char *p, vu c)
{
    _mm_storeu_si128((__m128i *)p, _mm512_cvtepi32_epi8(c));
}
VL void v_stc_n(unsigned char *p, vu c, unsigned n)
{
    _mm512_mask_cvtepi32_storeu_epi8(p, lanes(n), c);
}

/* 16 FP8 codes (zero-extended to u16) to fp32. */
VL vf dec_fp8(kvs_scheme s, __m256i c)
{
    const __m256i mag = _mm256_and_si256(c, _mm256_set1_epi16(0x7F));
    if (s == KVS_SCHEME_FP8_E5M2) {
        vf f = _mm512_cvtph_ps(_mm256_slli_epi16(c, 8));
        __mmask16 nan = _mm256_cmpgt_epu16_mask(mag, _mm256_set1_epi16(0x7C));
        return _mm512_mask_mov_ps(f, nan, _mm512_castsi512_ps(c32(KVQ_F32_CANONICAL_NAN)));
    }
    /* c << 7 puts the magnitude at bits 13..7 and the sign at bit 14; adding
     * bit 14 to itself carries the sign up to bit 15 */
    __m256i h = _mm256_slli_epi16(c, 7);
    h = _mm256_add_epi16(h, _mm256_and_si256(h, _mm256_set1_epi16(0x4000)));
    vf f = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
    __mmask16 nan = _mm256_cmpeq_epu16_mask(mag, _mm256_set1_epi16(0x7F));
    return _mm512_mask_mov_ps(f, nan, _mm512_castsi512_ps(c32(KVQ_F32_CANONICAL_NAN)));
}

VL vf v_dec(kvs_scheme s, const unsigned char *p)
{
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    if (s == KVS_SCHEME_INT8)
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
    return dec_fp8(s, _mm256_cvtepu8_epi16(b));
}

VL vf v_dec_n(kvs_scheme s, const unsigned char *p, unsigned n)
{
    __m128i b = _mm_maskz_loadu_epi8(lanes(n), p);
    if (s == KVS_SCHEME_INT8)
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
    return dec_fp8(s, _mm256_cvtepu8_epi16(b));
}

/* kvq__fp8_encode on 16 lanes; see the file comment. */
VL vu enc_fp8(vf y, unsigned mbits, uint32_t bias, uint32_t max_bits, uint32_t max_code)
{
    const unsigned shift = 23u - mbits;
    const uint32_t min_normal = (128u - bias) << 23;
    const vu u = _mm512_castps_si512(y);
    const vu a = _mm512_and_si512(u, c32(ABS_MASK));
    /* normal: clamp at max (satfinite: max_bits encodes as max_code exactly) */
    const vu ac = _mm512_min_epu32(a, c32(max_bits));
    vu norm = _mm512_add_epi32(ac, c32((1u << (shift - 1)) - 1u - ((127u - bias) << 23)));
    norm = _mm512_add_epi32(norm, _mm512_and_si512(_mm512_srli_epi32(ac, shift), c32(1)));
    norm = _mm512_srli_epi32(norm, shift);
    /* subnormal: |y| + 2^(23 + 1 - bias - mbits) rounds to whole subnormal units */
    const uint32_t magic = (uint32_t)(23 + 1 - (int)bias - (int)mbits + 127) << 23;
    vf sum = _mm512_add_round_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(c32(magic)),
                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vu sub = _mm512_sub_epi32(_mm512_castps_si512(sum), c32(magic));
    vu code = _mm512_mask_mov_epi32(norm, _mm512_cmplt_epu32_mask(a, c32(min_normal)), sub);
    code = _mm512_or_si512(code, _mm512_and_si512(_mm512_srli_epi32(u, 24), c32(0x80)));
    (void)max_code; /* reached through the clamp */
    return _mm512_mask_mov_epi32(code, _mm512_cmpgt_epu32_mask(a, c32(F32_INF)),
                                 c32(KVQ_FP8_NAN_CODE));
}

VL vu v_enc(kvs_scheme s, vf y)
{
    if (s == KVS_SCHEME_INT8) {
        __mmask16 num = _mm512_cmp_ps_mask(y, y, _CMP_ORD_Q);
        vf yc = _mm512_min_ps(_mm512_max_ps(y, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
        return _mm512_maskz_cvtps_epi32(num, yc);
    }
    if (s == KVS_SCHEME_FP8_E5M2)
        return enc_fp8(y, 2u, 15u, 0x47600000u, KVQ_E5M2_MAX_CODE);
    return enc_fp8(y, 3u, 7u, 0x43E00000u, KVQ_E4M3_MAX_CODE);
}

VL vf v_mul(vf a, vf b)
{
    return _mm512_mul_ps(a, b);
}
VL vf v_add(vf a, vf b)
{
    return _mm512_add_ps(a, b);
}
VL vf v_sub(vf a, vf b)
{
    return _mm512_sub_ps(a, b);
}

VL vf v_fixinf(vf y, vf x, vf iv)
{
    __mmask16 inf = _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(x), c32(ABS_MASK)),
                                            c32(F32_INF));
    __mmask16 z = _mm512_mask_cmp_ps_mask(inf, iv, _mm512_setzero_ps(), _CMP_EQ_OQ);
    return _mm512_mask_mov_ps(y, z, x);
}
VL vf v_bcf(float f)
{
    return _mm512_set1_ps(f);
}
VL vu v_bcu(uint32_t u)
{
    return c32(u);
}

VL vu v_key(vf x)
{
    vu a = _mm512_and_si512(_mm512_castps_si512(x), c32(ABS_MASK));
    return _mm512_mask_mov_epi32(_mm512_add_epi32(a, c32(2)),
                                 _mm512_cmpgt_epu32_mask(a, c32(F32_INF)), c32(1));
}

VL vm v_gt(vu a, vu b)
{
    return _mm512_cmpgt_epu32_mask(a, b);
}
VL vu v_sel(vm m, vu a, vu b)
{
    return _mm512_mask_blend_epi32(m, b, a);
}
VL vu v_max(vu a, vu b)
{
    return _mm512_max_epu32(a, b);
}

VL vu v_spill(vu sp, vu fall)
{
    return _mm512_mask_max_epu32(sp, _mm512_cmpneq_epu32_mask(fall, c32(0x7F800002u)), sp, fall);
}

VL vu v_keep(vu x, unsigned n)
{
    return _mm512_maskz_mov_epi32(lanes(n), x);
}
VL uint32_t v_hmax(vu x)
{
    return (uint32_t)_mm512_reduce_max_epu32(x);
}
VL uint32_t v_hmin(vu x)
{
    return (uint32_t)_mm512_reduce_min_epu32(x);
}
VL vm v_eq(vu a, vu b)
{
    return _mm512_cmpeq_epu32_mask(a, b);
}
VL vu v_addu(vu a, vu b)
{
    return _mm512_add_epi32(a, b);
}
VL vu v_subu(vu a, vu b)
{
    return _mm512_sub_epi32(a, b);
}
VL vu v_or(vu a, vu b)
{
    return _mm512_or_si512(a, b);
}
VL vu v_min(vu a, vu b)
{
    return _mm512_min_epu32(a, b);
}
VL vu v_abs(vf x)
{
    return _mm512_and_si512(_mm512_castps_si512(x), c32(ABS_MASK));
}
/* Sign set: all bits flipped; clear: the sign bit set. */
VL vu v_ord(vf x)
{
    vu u = _mm512_castps_si512(x);
    return _mm512_xor_si512(u, _mm512_or_si512(_mm512_srai_epi32(u, 31), c32(0x80000000u)));
}
VL vu v_iota(void)
{
    return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}
VL vm v_lane(unsigned lane)
{
    return (__mmask16)(1u << lane);
}

VL int v_find(vu x, uint32_t key)
{
    unsigned m = _mm512_cmpeq_epu32_mask(x, c32(key));
    return m ? __builtin_ctz(m) : -1;
}

#include "kvq_cpu_body.h"
