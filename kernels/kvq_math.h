/*
 * kvq_math.h — the per-element arithmetic of KV quantization, shared by the C
 * reference (kernels/ref), the fast CPU path (kernels/cpu) and the CUDA kernels
 * (kernels/cuda). Every function is `static inline`, C11 and CUDA C++ at once
 * (KVS_HD adds __host__ __device__ under nvcc), with no GNU or C++-only
 * constructs, so one definition compiles everywhere and every backend produces
 * the same bits (DESIGN.md §4).
 *
 * Conventions
 *   - A quantized element is a code with  x ≈ value(code) * scale.  The
 *     quantizer multiplies by the reciprocal: code = encode(x * inv_scale) with
 *     inv_scale = kvq_scale_inv(scale), both computed once per scale group.
 *     Multiplying (not dividing) is what every backend does; the reciprocal,
 *     the division in kvq_scale_from_amax and the product are each one IEEE
 *     binary32 operation rounded to nearest (__frcp_rn/__fdiv_rn/__fmul_rn on
 *     the device, which also rules out FMA contraction), so host and device
 *     agree bit for bit. Do not build the kernels with --use_fast_math or
 *     -ftz=true.
 *   - Conversions work on bit patterns with integer arithmetic; no result
 *     depends on the floating-point environment, except INT8 rounding, which
 *     uses rintf() in the default round-to-nearest-even mode.
 *   - fp16 and bf16 travel as uint16_t bit patterns, FP8 codes as uint8_t.
 *
 * FP8 encode = CUDA's cvt.rn.satfinite.{e4m3x2,e5m2x2}.{f32,f16x2}, exactly
 * (checked against the hardware by tests/conformance/test_fp8_cuda.c and against
 * CUDA's host emulation by tests/unit/test_kvq_math.c):
 *   - round to nearest, ties to even mantissa, on the exact input value;
 *   - E4M3 is the "FN" variant: bias 7, max ±448 (code 0x7E/0xFE), no Inf,
 *     NaN = 0x7F/0xFF. E5M2: bias 15, max ±57344 (0x7B/0xFB), Inf 0x7C/0xFC,
 *     NaN 0x7D..0x7F / 0xFD..0xFF;
 *   - finite |x| >= max (so also everything that would round past max) → ±max;
 *   - ±Inf → ±max (satfinite: Inf is "beyond max", not NaN);
 *   - NaN (any sign or payload) → 0x7F in both formats (sign dropped);
 *   - |x| <= half the smallest subnormal (E4M3 2^-10, E5M2 2^-17) → ±0 (code
 *     0x00/0x80, sign kept), as are ±0 and every fp32 denormal;
 *   - fp16 input goes through its exact fp32 value, so the f16 and f32 paths
 *     agree on every fp16 value.
 * FP8 decode is exact; a NaN code decodes to the canonical NaN 0x7FFFFFFF (sign
 * dropped, like CUDA's own cvt to f16x2 which yields 0x7FFF); E5M2 ±Inf codes
 * decode to ±Inf.
 *
 * fp16/bf16 <-> fp32: IEEE round to nearest even; fp16 overflow (|x| >= 65520)
 * gives ±Inf, bf16 likewise; denormals both ways are exact or correctly rounded.
 * NaN keeps its sign and the top payload bits and is made quiet (fp16 bit 9,
 * bf16 bit 6, fp32 bit 22). So fp16 → fp32 → fp16 (and bf16 → fp32 → bf16) is the
 * identity on every pattern except signalling NaNs, which come back quiet
 * (h | 0x0200 for fp16, b | 0x0040 for bf16). (CUDA's cvt.f16.f32 returns the
 * canonical 0x7FFF for any NaN instead; our kernels use these functions, not
 * the cvt, so host and device still agree.)
 *
 * INT8 (symmetric, codes -127..127, -128 never produced):
 *   code = clamp(rint(x * inv_scale), -127, 127) with round half to even;
 *   ±Inf (or any product beyond ±127) → ±127; NaN → 0. decode = code * scale.
 *
 * Scales: scale = amax / qmax with qmax 448 (E4M3), 57344 (E5M2), 127 (INT8).
 *   amax must come from kvq_amax_update, which skips NaN and ±Inf, so a
 *   non-finite element never poisons its group's scale (it is encoded on its own
 *   terms as above). amax <= 0, NaN or Inf → scale 0; a group with scale 0
 *   quantizes to all-zero codes and decodes to zeros. A positive scale is at
 *   least FLT_MIN, so its reciprocal is finite. kvq_scale_inv(scale) is 1/scale
 *   for scale in [FLT_MIN, FLT_MAX] and 0 otherwise.
 *   Tile format v2 stores scales as fp16: kvq_scale_fp16 rounds a scale up to
 *   the next fp16 value (capped at 65504), and both the encoder (through
 *   kvq_scale_inv) and the decoder use the fp32 value of the stored bits.
 */
#ifndef KVQ_MATH_H
#define KVQ_MATH_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define KVS_HD __host__ __device__
#else
#define KVS_HD
#endif

typedef enum kvq_fp8_format {
    KVQ_FP8_E4M3 = 0,
    KVQ_FP8_E5M2 = 1,
} kvq_fp8_format;

#define KVQ_E4M3_MAX 448.0f
#define KVQ_E5M2_MAX 57344.0f
#define KVQ_INT8_MAX 127.0f
#define KVQ_E4M3_MAX_CODE 0x7Eu
#define KVQ_E5M2_MAX_CODE 0x7Bu
#define KVQ_FP8_NAN_CODE 0x7Fu          /* what FP8 encode returns for any NaN */
#define KVQ_F32_CANONICAL_NAN 0x7FFFFFFFu /* what FP8 decode returns for a NaN code */

/* ---- bit casts (memcpy on the host, the intrinsics on the device) ---------- */

KVS_HD static inline uint32_t kvq_f32_bits(float f)
{
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

KVS_HD static inline float kvq_f32_from_bits(uint32_t u)
{
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* One correctly rounded binary32 operation on host and device alike. */
KVS_HD static inline float kvq__mul(float a, float b)
{
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

KVS_HD static inline float kvq__div(float a, float b)
{
#if defined(__CUDA_ARCH__)
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}

KVS_HD static inline float kvq__rcp(float a)
{
#if defined(__CUDA_ARCH__)
    return __frcp_rn(a);
#else
    return 1.0f / a;
#endif
}

KVS_HD static inline float kvq__add(float a, float b)
{
#if defined(__CUDA_ARCH__)
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

KVS_HD static inline float kvq__sub(float a, float b)
{
#if defined(__CUDA_ARCH__)
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}

/* Round-to-nearest-even of (q + rem / 2^shift), 1 <= shift <= 24, where rem
 * holds the bits shifted out. A carry out of the mantissa bumps the exponent,
 * which is the right answer in every format below. */
KVS_HD static inline uint32_t kvq__rne(uint32_t q, uint32_t rem, unsigned shift)
{
    uint32_t halfway = 1u << (shift - 1u);
    return q + ((rem > halfway || (rem == halfway && (q & 1u))) ? 1u : 0u);
}

/* ---- fp16 <-> fp32 --------------------------------------------------------- */

KVS_HD static inline float kvq_fp16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (uint32_t)(h >> 10) & 0x1Fu;
    uint32_t man = (uint32_t)h & 0x3FFu;
    uint32_t bits;
    if (exp == 0x1Fu) {
        bits = sign | 0x7F800000u | (man << 13);
        if (man != 0)
            bits |= 0x00400000u; /* NaN: keep sign and payload, make it quiet */
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13); /* rebias 15 -> 127 */
    } else if (man == 0) {
        bits = sign;
    } else {
        /* Subnormal man * 2^-24: shift the leading one up to bit 10. */
        uint32_t e = 113u; /* biased fp32 exponent of 2^-14 */
        while ((man & 0x400u) == 0) {
            man <<= 1;
            e--;
        }
        bits = sign | (e << 23) | ((man & 0x3FFu) << 13);
    }
    return kvq_f32_from_bits(bits);
}

KVS_HD static inline uint16_t kvq_f32_to_fp16(float f)
{
    uint32_t x = kvq_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t a = x & 0x7FFFFFFFu;
    if (a > 0x7F800000u) /* NaN: quiet, top 10 payload bits kept */
        return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
    if (a >= 0x477FF000u) /* >= 65520 = max + half ulp: ties go to Inf */
        return (uint16_t)(sign | 0x7C00u);
    if (a >= 0x38800000u) { /* >= 2^-14: normal */
        uint32_t base = a - (112u << 23);
        return (uint16_t)(sign | kvq__rne(base >> 13, base & 0x1FFFu, 13));
    }
    if (a <= 0x33000000u) /* <= 2^-25, half the smallest subnormal: ±0 */
        return (uint16_t)sign;
    {
        uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
        unsigned shift = 126u - (a >> 23); /* 14..24 */
        return (uint16_t)(sign | kvq__rne(m >> shift, m & ((1u << shift) - 1u), shift));
    }
}

/* ---- bf16 <-> fp32 --------------------------------------------------------- */

KVS_HD static inline float kvq_bf16_to_f32(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u)
        bits |= 0x00400000u; /* quiet NaN */
    return kvq_f32_from_bits(bits);
}

KVS_HD static inline uint16_t kvq_f32_to_bf16(float f)
{
    uint32_t x = kvq_f32_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)((x >> 16) | 0x0040u);
    /* Adding 0x7FFF plus the kept LSB rounds half to even; a carry into the
     * exponent (up to Inf) is correct rounding too. */
    return (uint16_t)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

/* ---- FP8 encode ------------------------------------------------------------ */

/* fp32 → FP8 with mbits mantissa bits and exponent bias `bias`; max_bits is
 * the fp32 pattern of the largest finite FP8 value, max_code its code. */
KVS_HD static inline uint8_t kvq__fp8_encode(float f, unsigned mbits, unsigned bias,
                                             uint32_t max_bits, uint32_t max_code)
{
    uint32_t x = kvq_f32_bits(f);
    uint32_t sign = (x >> 24) & 0x80u;
    uint32_t a = x & 0x7FFFFFFFu;
    unsigned be = a >> 23;             /* biased fp32 exponent */
    unsigned emin_be = 128u - bias;    /* biased fp32 exponent of the FP8 min normal */
    if (a > 0x7F800000u)
        return (uint8_t)KVQ_FP8_NAN_CODE;
    if (a >= max_bits) /* satfinite: at or beyond max (incl. Inf) */
        return (uint8_t)(sign | max_code);
    if (be >= emin_be) {
        uint32_t base = a - ((127u - bias) << 23);
        unsigned shift = 23u - mbits;
        return (uint8_t)(sign | kvq__rne(base >> shift, base & ((1u << shift) - 1u), shift));
    }
    if (be + mbits + 1u < emin_be) /* below half the smallest subnormal */
        return (uint8_t)sign;
    {
        /* FP8 subnormal: count units of 2^(1-bias-mbits); shift <= 24. */
        uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
        unsigned shift = (emin_be - be) + 23u - mbits;
        return (uint8_t)(sign | kvq__rne(m >> shift, m & ((1u << shift) - 1u), shift));
    }
}

KVS_HD static inline uint8_t kvq_f32_to_e4m3(float f)
{
    return kvq__fp8_encode(f, 3u, 7u, 0x43E00000u /* 448 */, KVQ_E4M3_MAX_CODE);
}

KVS_HD static inline uint8_t kvq_f32_to_e5m2(float f)
{
    return kvq__fp8_encode(f, 2u, 15u, 0x47600000u /* 57344 */, KVQ_E5M2_MAX_CODE);
}

KVS_HD static inline uint8_t kvq_f32_to_fp8(float f, kvq_fp8_format fmt)
{
    return fmt == KVQ_FP8_E5M2 ? kvq_f32_to_e5m2(f) : kvq_f32_to_e4m3(f);
}

KVS_HD static inline uint8_t kvq_fp16_to_fp8(uint16_t h, kvq_fp8_format fmt)
{
    return kvq_f32_to_fp8(kvq_fp16_to_f32(h), fmt);
}

/* ---- FP8 decode (exact) ---------------------------------------------------- */

KVS_HD static inline float kvq_e4m3_to_f32(uint8_t c)
{
    uint32_t sign = (uint32_t)(c & 0x80u) << 24;
    uint32_t exp = ((uint32_t)c >> 3) & 0xFu;
    uint32_t man = (uint32_t)c & 0x7u;
    uint32_t bits;
    if ((c & 0x7Fu) == 0x7Fu) {
        bits = KVQ_F32_CANONICAL_NAN;
    } else if (exp != 0) {
        bits = sign | ((exp + 120u) << 23) | (man << 20);
    } else if (man == 0) {
        bits = sign;
    } else {
        uint32_t e = 121u; /* 2^-6 */
        while ((man & 0x8u) == 0) {
            man <<= 1;
            e--;
        }
        bits = sign | (e << 23) | ((man & 0x7u) << 20);
    }
    return kvq_f32_from_bits(bits);
}

/* E5M2 is the top byte of an fp16. */
KVS_HD static inline float kvq_e5m2_to_f32(uint8_t c)
{
    if ((c & 0x7Fu) > 0x7Cu)
        return kvq_f32_from_bits(KVQ_F32_CANONICAL_NAN);
    return kvq_fp16_to_f32((uint16_t)((uint32_t)c << 8));
}

KVS_HD static inline float kvq_fp8_to_f32(uint8_t c, kvq_fp8_format fmt)
{
    return fmt == KVQ_FP8_E5M2 ? kvq_e5m2_to_f32(c) : kvq_e4m3_to_f32(c);
}

/* Exact: every FP8 value is an fp16 value. NaN codes give 0x7FFF. */
KVS_HD static inline uint16_t kvq_fp8_to_fp16(uint8_t c, kvq_fp8_format fmt)
{
    return kvq_f32_to_fp16(kvq_fp8_to_f32(c, fmt));
}

/* ---- scales ---------------------------------------------------------------- */

KVS_HD static inline float kvq_fp8_max(kvq_fp8_format fmt)
{
    return fmt == KVQ_FP8_E5M2 ? KVQ_E5M2_MAX : KVQ_E4M3_MAX;
}

/* max(amax, |x|) over finite x only: NaN and ±Inf leave amax unchanged. */
KVS_HD static inline float kvq_amax_update(float amax, float x)
{
    uint32_t a = kvq_f32_bits(x) & 0x7FFFFFFFu;
    float ax = kvq_f32_from_bits(a);
    return (a < 0x7F800000u && ax > amax) ? ax : amax;
}

/* amax / qmax, or 0 when amax is not a positive finite number; a positive
 * result is raised to FLT_MIN so that 1/scale is finite. */
KVS_HD static inline float kvq_scale_from_amax(float amax, float qmax)
{
    uint32_t a = kvq_f32_bits(amax);
    float s;
    if (a == 0 || a >= 0x7F800000u) /* +0; Inf, NaN and anything negative */
        return 0.0f;
    s = kvq__div(amax, qmax);
    return s < FLT_MIN ? FLT_MIN : s;
}

/* The stored (tile format v2) fp16 scale of a scale s >= 0: the smallest fp16
 * value >= s — rounded up, never to nearest, so amax * (1/stored) stays
 * <= qmax and no code saturates for want of range — capped at 65504, the
 * largest finite fp16 (a group whose amax / qmax exceeds it saturates; only
 * fp32 and bf16 sources can hold such values). 0 for s = 0; NaN and negative
 * s (which no caller passes) also give 0. Any positive s gives at least the
 * smallest subnormal 2^-24, whose fp32 value is normal, so kvq_scale_inv of
 * kvq_fp16_to_f32(result) is finite. Encoder and decoder both use the fp32
 * value of the stored bits, kvq_fp16_to_f32(kvq_scale_fp16(s)). */
KVS_HD static inline uint16_t kvq_scale_fp16(float s)
{
    uint32_t a = kvq_f32_bits(s);
    if (a == 0 || a > 0x7F800000u) /* +0, NaN, anything negative (sign bit set) */
        return 0;
    if (a >= 0x477FE000u) /* >= 65504 (Inf included) */
        return 0x7BFFu;
    if (a >= 0x38800000u) { /* >= 2^-14: fp16 normal; a carry is the next binade */
        uint32_t base = a - (112u << 23);
        return (uint16_t)((base >> 13) + ((base & 0x1FFFu) != 0 ? 1u : 0u));
    }
    if (a <= 0x33800000u) /* <= 2^-24, the smallest subnormal */
        return 1u;
    {
        /* Subnormal: units of 2^-24; 2^-24 < s < 2^-14 gives shift 14..23. */
        uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
        unsigned shift = 126u - (a >> 23);
        return (uint16_t)((m >> shift) + ((m & ((1u << shift) - 1u)) != 0 ? 1u : 0u));
    }
}

/* A stored group scale g16 (kvq_scale_fp16's result) aligned to a per-tensor
 * scale t16 (an fp16 value too: the tile params' tensor_scale, kvq.h): the
 * smallest t16 * 2^e, e any integer, that is >= g16 and is itself exactly an
 * fp16 value. So the group's grid holds the per-tensor grid over the group's
 * range (FP8: every value the per-tensor scale can encode below the group's
 * top is a code of ours too). "Exactly an fp16 value" bounds e both ways:
 *   - at most 65504: when g16 > the largest such multiple (only groups whose
 *     scale is within 2x of 65504, or above it, i.e. amax / qmax near the fp16
 *     range), the result is that largest multiple, < g16, and the group's
 *     largest values saturate at qmax times it, as groups beyond 65504 do today;
 *   - at least the smallest subnormal: the lowest set bit of t16's significand
 *     stays at or above 2^-24, so a g16 below t16's smallest representable
 *     multiple gets that multiple (larger than needed: coarser, never
 *     saturating). Subnormal results are allowed; they are exact, and their fp32
 *     value is normal, so kvq_scale_inv of it is finite.
 * g16 = 0 (an all-zero or all-outlier group, a static scale of 0) stays 0, and
 * t16 = 0 (no tensor scale) returns g16 unchanged; so does any NaN or Inf
 * pattern of either (no caller passes one). */
KVS_HD static inline uint16_t kvq_scale_align_fp16(uint16_t g16, uint16_t t16)
{
    if (g16 == 0 || t16 == 0 || g16 >= 0x7C00u || t16 >= 0x7C00u)
        return g16;
    /* Both are positive fp16 values, so their fp32 forms are normal numbers. */
    const uint32_t g = kvq_f32_bits(kvq_fp16_to_f32(g16));
    const uint32_t t = kvq_f32_bits(kvq_fp16_to_f32(t16));
    const int ge = (int)(g >> 23), te = (int)(t >> 23);
    const uint32_t gm = g & 0x7FFFFFu, tm = t & 0x7FFFFFu;
    /* t * 2^(ge - te) has g's exponent: enough unless t's significand is smaller. */
    int e = ge - te + (tm < gm ? 1 : 0);
    /* t = m * 2^(te - 150) with the 24-bit significand m; its lowest set bit,
     * 2^(te - 150 + tz), must stay >= 2^-24 after scaling: e >= 126 - te - tz. */
    const uint32_t m = tm | 0x800000u, low = m & (~m + 1u);
    const int tz = (int)(kvq_f32_bits((float)low) >> 23) - 127; /* (float)low is exact */
    const int e_lo = 126 - te - tz;
    /* The result's exponent at most 15 (biased 142): t16's significand is an
     * fp16 one, so with exponent 15 it is at most 65504's. */
    const int e_hi = 142 - te;
    if (e < e_lo)
        e = e_lo;
    if (e > e_hi)
        e = e_hi;
    return kvq_f32_to_fp16(kvq_f32_from_bits(((uint32_t)(te + e) << 23) | tm));
}

/* The quantizer's multiplier: 1/scale for scale in [FLT_MIN, FLT_MAX], else 0. */
KVS_HD static inline float kvq_scale_inv(float scale)
{
    uint32_t s = kvq_f32_bits(scale);
    if (s < 0x00800000u || s >= 0x7F800000u) /* 0, subnormal, negative, Inf, NaN */
        return 0.0f;
    return kvq__rcp(scale);
}

/* ---- scaled encode / decode ------------------------------------------------ */

KVS_HD static inline uint8_t kvq_fp8_quantize(float x, float inv_scale, kvq_fp8_format fmt)
{
    return kvq_f32_to_fp8(kvq__mul(x, inv_scale), fmt);
}

KVS_HD static inline float kvq_fp8_dequantize(uint8_t c, float scale, kvq_fp8_format fmt)
{
    return kvq__mul(kvq_fp8_to_f32(c, fmt), scale);
}

KVS_HD static inline int8_t kvq_int8_quantize(float x, float inv_scale)
{
    float y = kvq__mul(x, inv_scale);
    if ((kvq_f32_bits(y) & 0x7FFFFFFFu) > 0x7F800000u)
        return 0; /* NaN (also Inf * 0) */
    if (y >= KVQ_INT8_MAX)
        return 127;
    if (y <= -KVQ_INT8_MAX)
        return -127;
    return (int8_t)(int)rintf(y); /* |y| < 127: round half to even */
}

KVS_HD static inline float kvq_int8_dequantize(int8_t q, float scale)
{
    return kvq__mul((float)q, scale);
}

/* ---- top-k ----------------------------------------------------------------- */

/* Rank key of |x|: larger key = larger magnitude; NaN ranks below every number. */
KVS_HD static inline uint32_t kvq__abs_key(float x)
{
    uint32_t a = kvq_f32_bits(x) & 0x7FFFFFFFu;
    return a > 0x7F800000u ? 0u : a + 1u;
}

/* Writes to idx[0..) the indices of the k largest |x[i]|, i < n, largest first,
 * ties broken by lowest index; ±Inf ranks above every finite value, NaN below
 * every number (±0 included). Returns the count written, min(k, n) (0 for
 * k <= 0 or n <= 0). O(n·k) without scratch memory: meant for short groups and
 * small k (outlier tables), also from a device thread. */
KVS_HD static inline int kvq_topk_abs(const float *x, int n, int k, int *idx)
{
    int j;
    if (k > n)
        k = n;
    for (j = 0; j < k; j++) {
        int best = -1, i;
        uint32_t bkey = 0, pkey = 0;
        int prev = j > 0 ? idx[j - 1] : -1;
        if (prev >= 0)
            pkey = kvq__abs_key(x[prev]);
        for (i = 0; i < n; i++) {
            uint32_t key = kvq__abs_key(x[i]);
            /* Only candidates ranked strictly after the previous pick. */
            if (prev >= 0 && (key > pkey || (key == pkey && i <= prev)))
                continue;
            if (best < 0 || key > bkey) {
                best = i;
                bkey = key;
            }
        }
        idx[j] = best;
    }
    return k > 0 ? k : 0;
}

/* ---- key offsets (kv_format.h rule 5) --------------------------------------- */

#define KVQ_OFFSET_MAX_K 16 /* KVS_TILE_MAX_OUTLIERS: larger k are capped */

KVS_HD static inline int kvq__finite(float x)
{
    return (kvq_f32_bits(x) & 0x7FFFFFFFu) < 0x7F800000u;
}

/* The midrange of finite lo <= hi: lo/2 + hi/2, two halvings (exact but in
 * the subnormal range) and one rounded addition; never overflows. */
KVS_HD static inline float kvq_midrange(float lo, float hi)
{
    return kvq__add(kvq__mul(lo, 0.5f), kvq__mul(hi, 0.5f));
}

/* The stored fp16 offset of a midrange c (finite): c clamped to +-65504, then
 * rounded to nearest (kvq_f32_to_fp16), so it is always finite; -0 becomes
 * +0, so the sign of a zero min or max (which min/max instructions treat
 * differently) never shows. */
KVS_HD static inline uint16_t kvq_offset_fp16(float c)
{
    uint16_t h;
    if (c > 65504.0f)
        c = 65504.0f;
    if (c < -65504.0f)
        c = -65504.0f;
    h = kvq_f32_to_fp16(c);
    return h == 0x8000u ? (uint16_t)0 : h;
}

/* x - m and code value + m: one correctly rounded fp32 operation each, the
 * encoder's shift and the decoder's unshift (never contracted into an FMA). */
KVS_HD static inline float kvq_offset_sub(float x, float m)
{
    return kvq__sub(x, m);
}
KVS_HD static inline float kvq_offset_add(float q, float m)
{
    return kvq__add(q, m);
}

/* kvq_offset_trim's choice, given the ends of the sorted finite values:
 * lo[0..r] the r + 1 smallest ascending, hi[0..r] the r + 1 largest
 * descending (hi[q] = v[cnt-1-q]), r = min(k, cnt - 1). Every implementation
 * that collects the ends its own way (the fast CPU path's vector lists)
 * finishes with this. */
KVS_HD static inline uint16_t kvq_offset_trim_ends(const float *lo, const float *hi, int r)
{
    int best = 0, i;
    float bw = 0.0f;
    for (i = 0; i <= r; i++) {
        float w = kvq__sub(hi[r - i], lo[i]);
        if (i == 0 || w < bw) {
            best = i;
            bw = w;
        }
    }
    return kvq_offset_fp16(kvq_midrange(lo[best], hi[r - best]));
}

/* kvq_offset_trim's entries kept at each end for k outlier slots: k + 1, k
 * clamped to 0..KVQ_OFFSET_MAX_K. */
KVS_HD static inline int kvq_offset_keep(int k)
{
    return (k < 0 ? 0 : k > KVQ_OFFSET_MAX_K ? KVQ_OFFSET_MAX_K : k) + 1;
}

/* v into lo[0..keep), ascending, of which in_use (<= keep) entries are set:
 * it takes its place, and the largest falls off a full list. */
KVS_HD static inline void kvq__offset_put_lo(float *lo, int keep, int in_use, float v)
{
    int j;
    for (j = in_use; j > 0 && lo[j - 1] > v; j--)
        if (j < keep)
            lo[j] = lo[j - 1];
    if (j < keep)
        lo[j] = v;
}

/* The same for hi[0..keep), descending: the smallest falls off. */
KVS_HD static inline void kvq__offset_put_hi(float *hi, int keep, int in_use, float v)
{
    int j;
    for (j = in_use; j > 0 && hi[j - 1] < v; j--)
        if (j < keep)
            hi[j] = hi[j - 1];
    if (j < keep)
        hi[j] = v;
}

/* One value of a group into kvq_offset_trim's ends: lo[0..keep) holds the
 * smallest finite values so far in ascending order, hi[0..keep) the largest
 * in descending order, *cnt counts the finite values (NaN and +-Inf are
 * ignored). Every implementation that walks a group in its own order (the
 * CUDA K kernel) collects with this (and kvq_offset_merge, for parts of a
 * group walked apart) and finishes with kvq_offset_finish. */
KVS_HD static inline void kvq_offset_collect(float *lo, float *hi, int keep, int *cnt, float v)
{
    int m;
    if (!kvq__finite(v))
        return;
    m = *cnt < keep ? *cnt : keep; /* entries in use */
    kvq__offset_put_lo(lo, keep, m, v);
    kvq__offset_put_hi(hi, keep, m, v);
    (*cnt)++;
}

/* The ends (lo2, hi2, cnt2) another part of the group collected, into (lo,
 * hi, *cnt): afterwards they are the ends of both parts, as if every value
 * had been collected here (the offset depends on the values, not on their
 * order). */
KVS_HD static inline void kvq_offset_merge(float *lo, float *hi, int keep, int *cnt,
                                           const float *lo2, const float *hi2, int cnt2)
{
    int m = *cnt < keep ? *cnt : keep, n2 = cnt2 < keep ? cnt2 : keep, i;
    for (i = 0; i < n2; i++, m += m < keep) {
        kvq__offset_put_lo(lo, keep, m, lo2[i]);
        kvq__offset_put_hi(hi, keep, m, hi2[i]);
    }
    *cnt += cnt2;
}

/* The offset from the ends kvq_offset_collect gathered with keep =
 * kvq_offset_keep(k) over cnt finite values (none: 0). */
KVS_HD static inline uint16_t kvq_offset_finish(const float *lo, const float *hi, int keep, int cnt)
{
    if (cnt == 0)
        return 0;
    return kvq_offset_trim_ends(lo, hi, keep - 1 < cnt - 1 ? keep - 1 : cnt - 1);
}

/* The key offset of one K channel's group x[0..n) (its non-sink tokens) with
 * k outlier slots, as stored (fp16 bits): the trimmed midrange, the centre of
 * the narrowest range left after setting r = min(k, cnt - 1) of the cnt
 * finite values aside (NaN and +-Inf never count; none finite: 0):
 *   with v the finite values in ascending order, for i = 0..r the range
 *   w_i = v[cnt-1-(r-i)] - v[i] (i from the bottom and r - i from the top
 *   set aside; one fp32 subtraction); b = the first i with the smallest w_i;
 *   the offset is kvq_offset_fp16(kvq_midrange(v[b], v[cnt-1-(r-b)])).
 * The k values that become outliers are then (up to rounding) the ones set
 * aside, and the rest fits the smallest scale any offset allows. Depends on
 * the values only, not on their order. O(n k) with 2 (k + 1) floats of
 * scratch on the stack. k above KVQ_OFFSET_MAX_K counts as that. */
KVS_HD static inline uint16_t kvq_offset_trim(const float *x, int n, int k)
{
    float lo[KVQ_OFFSET_MAX_K + 1], hi[KVQ_OFFSET_MAX_K + 1];
    const int keep = kvq_offset_keep(k);
    int cnt = 0, i;
    for (i = 0; i < n; i++)
        kvq_offset_collect(lo, hi, keep, &cnt, x[i]);
    return kvq_offset_finish(lo, hi, keep, cnt);
}

#endif /* KVQ_MATH_H */
