/*
 * kvq_cpu_portable.c — the fast path's plain C11 implementation: the body of
 * kvq_cpu_body.h over a one-lane "vector" layer, so it has the fast path's
 * loop structure (one walk per K channel with the top-k in locals, packed
 * keys for fp16/bf16, no allocation, no per-element dispatch). Built
 * everywhere; the fallback on CPUs without AVX2 and on other architectures.
 *
 * The conversions on the hot path avoid kvq_math.h's data-dependent branches
 * (its round-to-nearest-even tests "rem > half || (rem == half && odd)", which
 * mispredict on real data about half the time) for the ranges that matter:
 *   - rounding to fp16 / FP8 in the normal range adds half an ulp minus one
 *     plus the kept LSB, then shifts: the same result as kvq__rne;
 *   - widening fp16 and decoding E4M3/E5M2 place the bits in an fp32 and
 *     multiply by a power of two (exact, subnormals included: the library
 *     runs with denormals enabled, as documented in kvq_cpu.h);
 * everything else (NaN, Inf, overflow, subnormal results) goes to the
 * kvq_math.h function itself, on branches that real data predicts well.
 * The results are those of kvq_math.h for every input (tests/conformance).
 */
#include "kvq_cpu_impl.h"
#include "kvq_math.h"

#include <string.h>

#define KVS__W          1
#define KVS__QUANTIZE   kvs__cpu_quantize_portable
#define KVS__DEQUANTIZE kvs__cpu_dequantize_portable

typedef float vf;
typedef uint32_t vu;
typedef int vm;

#define VL static inline __attribute__((always_inline))

#define TWO_P112 0x1p112f
#define TWO_P120 0x1p120f

/* kvq_fp16_to_f32: finite values as (h << 13) * 2^112 (exact). */
VL float fp16_to_f32(uint16_t h)
{
    if ((h & 0x7C00u) == 0x7C00u)
        return kvq_fp16_to_f32(h);
    float f = kvq_f32_from_bits((uint32_t)(h & 0x7FFFu) << 13) * TWO_P112;
    return kvq_f32_from_bits(kvq_f32_bits(f) | ((uint32_t)(h & 0x8000u) << 16));
}

/* kvq_f32_to_fp16: normal results rounded without a branch. */
VL uint16_t f32_to_fp16(float f)
{
    uint32_t x = kvq_f32_bits(f), a = x & 0x7FFFFFFFu;
    if (a - 0x38800000u < 0x477FF000u - 0x38800000u) { /* 2^-14 <= |f| < 65520 */
        uint32_t base = a - (112u << 23);
        return (uint16_t)(((x >> 16) & 0x8000u) | ((base + 0xFFFu + ((base >> 13) & 1u)) >> 13));
    }
    return kvq_f32_to_fp16(f);
}

/* kvq__fp8_encode: normal results below max rounded without a branch. */
VL uint8_t f32_to_fp8(float f, kvq_fp8_format fmt)
{
    const unsigned mbits = fmt == KVQ_FP8_E5M2 ? 2u : 3u, bias = fmt == KVQ_FP8_E5M2 ? 15u : 7u;
    const uint32_t max_bits = fmt == KVQ_FP8_E5M2 ? 0x47600000u : 0x43E00000u;
    const uint32_t min_normal = (128u - bias) << 23;
    const unsigned shift = 23u - mbits;
    uint32_t x = kvq_f32_bits(f), a = x & 0x7FFFFFFFu;
    if (a - min_normal < max_bits - min_normal) {
        uint32_t base = a - ((127u - bias) << 23);
        uint32_t q = (base + (1u << (shift - 1u)) - 1u + ((base >> shift) & 1u)) >> shift;
        return (uint8_t)(((x >> 24) & 0x80u) | q);
    }
    return kvq_f32_to_fp8(f, fmt);
}

/* kvq_e4m3_to_f32 / kvq_e5m2_to_f32: the magnitude bits placed in an fp32
 * are the value times 2^-120 (2^-112), subnormal codes included. */
VL float fp8_to_f32(uint8_t c, kvq_fp8_format fmt)
{
    uint32_t mag = c & 0x7Fu;
    float f;
    if (fmt == KVQ_FP8_E5M2) {
        if (mag >= 0x7Cu)
            return kvq_e5m2_to_f32(c);
        f = kvq_f32_from_bits(mag << 21) * TWO_P112;
    } else {
        if (mag == 0x7Fu)
            return kvq_e4m3_to_f32(c);
        f = kvq_f32_from_bits(mag << 20) * TWO_P120;
    }
    return kvq_f32_from_bits(kvq_f32_bits(f) | ((uint32_t)(c & 0x80u) << 24));
}

VL vf v_ld(const void *base, kvs_dtype dt, size_t i)
{
    uint16_t h;
    float f;
    if (dt == KVS_DTYPE_FP32) {
        memcpy(&f, (const unsigned char *)base + 4 * i, 4);
        return f;
    }
    memcpy(&h, (const unsigned char *)base + 2 * i, 2);
    return dt == KVS_DTYPE_FP16 ? fp16_to_f32(h) : kvq_bf16_to_f32(h);
}

/* One lane never has a tail; these exist for the body's shape only. */
VL vf v_ld_n(const void *base, kvs_dtype dt, size_t i, unsigned n)
{
    return n ? v_ld(base, dt, i) : 0.0f;
}

VL void v_st(void *base, kvs_dtype dt, size_t i, vf x)
{
    uint16_t h;
    if (dt == KVS_DTYPE_FP32) {
        memcpy((unsigned char *)base + 4 * i, &x, 4);
        return;
    }
    h = dt == KVS_DTYPE_FP16 ? f32_to_fp16(x) : kvq_f32_to_bf16(x);
    memcpy((unsigned char *)base + 2 * i, &h, 2);
}

VL void v_st_n(void *base, kvs_dtype dt, size_t i, vf x, unsigned n)
{
    if (n)
        v_st(base, dt, i, x);
}

VL vf v_ldf(const float *p)
{
    return *p;
}
VL void v_stf(float *p, vf x)
{
    *p = x;
}
VL vu v_ldu(const uint32_t *p)
{
    return *p;
}
VL void v_stu(uint32_t *p, vu x)
{
    *p = x;
}

VL void v_stc(unsigned char *p, vu c)
{
    *p = (unsigned char)c;
}

VL void v_stc_n(unsigned char *p, vu c, unsigned n)
{
    if (n)
        *p = (unsigned char)c;
}

VL vf v_dec(kvs_scheme s, const unsigned char *p)
{
    if (s == KVS_SCHEME_INT8)
        return (float)(int8_t)*p;
    return fp8_to_f32(*p, s == KVS_SCHEME_FP8_E5M2 ? KVQ_FP8_E5M2 : KVQ_FP8_E4M3);
}

VL vf v_dec_n(kvs_scheme s, const unsigned char *p, unsigned n)
{
    return n ? v_dec(s, p) : 0.0f;
}

/* kvq_int8_quantize(y, 1): |y| < 127 rounds to an integer by adding and
 * subtracting 1.5 * 2^23 (round to nearest even, the default mode rintf also
 * follows; no libm call where rintf is not an instruction). */
VL uint8_t int8_of(float y)
{
    if (!(y > -KVQ_INT8_MAX && y < KVQ_INT8_MAX))
        return (uint8_t)kvq_int8_quantize(y, 1.0f); /* NaN, saturation */
    return (uint8_t)(int8_t)(int)((y + 0x1.8p23f) - 0x1.8p23f);
}

/* y is already x * inv. */
VL vu v_enc(kvs_scheme s, vf y)
{
    if (s == KVS_SCHEME_INT8)
        return int8_of(y);
    return f32_to_fp8(y, s == KVS_SCHEME_FP8_E5M2 ? KVQ_FP8_E5M2 : KVQ_FP8_E4M3);
}

VL vf v_mul(vf a, vf b)
{
    return a * b;
}
VL vf v_add(vf a, vf b)
{
    return a + b;
}
VL vf v_sub(vf a, vf b)
{
    return a - b;
}

VL vf v_fixinf(vf y, vf x, vf iv)
{
    return iv == 0.0f && (kvq_f32_bits(x) & 0x7FFFFFFFu) == 0x7F800000u ? x : y;
}
VL vf v_bcf(float f)
{
    return f;
}
VL vu v_bcu(uint32_t u)
{
    return u;
}

VL vu v_key(vf x)
{
    uint32_t a = kvq_f32_bits(x) & 0x7FFFFFFFu;
    return a > 0x7F800000u ? 1u : a + 2u;
}

VL vm v_gt(vu a, vu b)
{
    return a > b;
}
VL vu v_sel(vm m, vu a, vu b)
{
    return m ? a : b;
}
VL vu v_max(vu a, vu b)
{
    return a > b ? a : b;
}
VL vu v_spill(vu sp, vu fall)
{
    return fall != 0x7F800002u && fall > sp ? fall : sp;
}
VL vu v_keep(vu x, unsigned n)
{
    return n ? x : 0u;
}
VL uint32_t v_hmax(vu x)
{
    return x;
}
VL uint32_t v_hmin(vu x)
{
    return x;
}
VL vm v_eq(vu a, vu b)
{
    return a == b;
}
VL vu v_addu(vu a, vu b)
{
    return a + b;
}
VL vu v_subu(vu a, vu b)
{
    return a - b;
}
VL vu v_or(vu a, vu b)
{
    return a | b;
}
VL vu v_min(vu a, vu b)
{
    return a < b ? a : b;
}
VL vu v_abs(vf x)
{
    return kvq_f32_bits(x) & 0x7FFFFFFFu;
}
VL vu v_ord(vf x)
{
    uint32_t u = kvq_f32_bits(x);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}
VL vu v_iota(void)
{
    return 0;
}
VL vm v_lane(unsigned lane)
{
    return lane == 0;
}
VL int v_find(vu x, uint32_t key)
{
    return x == key ? 0 : -1;
}

/* Float i covers halves 2i and 2i+1, so from the last element down every
 * half is read before a float overwrites it; memcpy reads may alias the float
 * stores, so the compiler keeps that order. */
void kvs__cpu_widen_portable(float *t, size_t n)
{
    const unsigned char *h = (const unsigned char *)t;
    for (size_t i = n; i-- > 0;) {
        uint16_t x;
        memcpy(&x, h + 2 * i, sizeof x);
        t[i] = kvq_fp16_to_f32(x);
    }
}

#include "kvq_cpu_body.h"
