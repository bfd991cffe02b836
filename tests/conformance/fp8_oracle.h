/*
 * fp8_oracle.h — an independent, obviously-correct model of FP8 (E4M3/E5M2)
 * and of fp16, for tests only, plus the fp32 boundary cases every FP8 test
 * runs. Shares no code with kernels/kvq_math.h on purpose: values come from
 * ldexp() on the format definitions, and encoding is brute force over all
 * codes in double precision.
 *
 * Model (PTX cvt.rn.satfinite.{e4m3x2,e5m2x2}): nearest representable value,
 * ties to the even code (= even mantissa); |x| beyond max and ±Inf clamp to
 * ±max; NaN → 0x7F; the sign of zero is kept. Below max, differences
 * val - |x| are exact whenever two candidates are close to a tie (both are then
 * within a few binades of |x|), so the tie test is exact where it matters.
 *
 * Used by tests/unit/test_kvq_math.c and tests/conformance/test_fp8_cuda.c;
 * all functions are static inline so a file may use any subset.
 */
#ifndef KVS_FP8_ORACLE_H
#define KVS_FP8_ORACLE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define ORACLE_E4M3 0
#define ORACLE_E5M2 1

/* Largest finite positive code. */
static inline unsigned oracle_fp8_max_code(int e5m2) { return e5m2 ? 0x7Bu : 0x7Eu; }

/* Value of code c (sign included) by the format definition; NAN for a NaN code,
 * ±INFINITY for E5M2 Inf. */
static inline double oracle_fp8_value(unsigned c, int e5m2)
{
    double s = (c & 0x80u) ? -1.0 : 1.0;
    unsigned mb = e5m2 ? 2u : 3u, eb = e5m2 ? 5u : 4u;
    int bias = e5m2 ? 15 : 7;
    unsigned e = (c >> mb) & ((1u << eb) - 1u), m = c & ((1u << mb) - 1u);
    if (!e5m2 && (c & 0x7Fu) == 0x7Fu)
        return NAN;
    if (e5m2 && e == 31u)
        return m ? NAN : s * INFINITY;
    if (e == 0)
        return s * ldexp((double)m, 1 - bias - (int)mb);
    return s * ldexp((double)((1u << mb) + m), (int)e - bias - (int)mb);
}

/* Brute force: nearest of the codes 0..max to |x|, ties to the even code. */
static inline unsigned oracle_fp8_encode(double x, int e5m2)
{
    unsigned sign, best = 0, maxc = oracle_fp8_max_code(e5m2);
    double ax, bestd = INFINITY;
    if (isnan(x))
        return 0x7Fu;
    sign = signbit(x) ? 0x80u : 0u;
    ax = fabs(x);
    if (ax >= oracle_fp8_value(maxc, e5m2)) /* satfinite, and Inf */
        return sign | maxc;
    for (unsigned c = 0; c <= maxc; c++) {
        double d = fabs(oracle_fp8_value(c, e5m2) - ax);
        if (d < bestd || (d == bestd && (c & 1u) == 0)) {
            best = c;
            bestd = d;
        }
    }
    return sign | best;
}

/* fp16 value by definition (NaN → NAN). */
static inline double oracle_fp16_value(uint16_t h)
{
    double s = (h & 0x8000u) ? -1.0 : 1.0;
    unsigned e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 31u)
        return m ? NAN : s * INFINITY;
    if (e == 0)
        return s * ldexp((double)m, -24);
    return s * ldexp((double)(1024u + m), (int)e - 25);
}

static inline float oracle_f32_bits(uint32_t u)
{
    union {
        uint32_t u;
        float f;
    } v;
    v.u = u;
    return v.f;
}

static inline uint32_t oracle_bits_f32(float f)
{
    union {
        uint32_t u;
        float f;
    } v;
    v.f = f;
    return v.u;
}

/* Appends x and -x to out[*n] if room. */
static inline void oracle__push2(float *out, size_t cap, size_t *n, float x)
{
    if (*n + 2 <= cap) {
        out[(*n)++] = x;
        out[(*n)++] = -x;
    }
}

/*
 * The fp32 boundary set of one format, both signs: every code value and its two
 * fp32 neighbours; for every pair of adjacent finite codes the exact midpoint
 * (representable in fp32: one bit more than the format) and its neighbours; the
 * overflow region (max, max + ½ulp, 2·max, FLT_MAX, Inf and neighbours); the
 * flush-to-zero boundary (½ of the smallest subnormal and neighbours); ±0, fp32
 * denormals; a few NaNs. Returns the count (≤ cap; 4096 is plenty).
 */
static inline size_t oracle_fp8_boundaries(int e5m2, float *out, size_t cap)
{
    size_t n = 0;
    unsigned maxc = oracle_fp8_max_code(e5m2);
    double maxv = oracle_fp8_value(maxc, e5m2);
    double half_ulp_max = (maxv - oracle_fp8_value(maxc - 1u, e5m2)) / 2.0;
    double tiny = oracle_fp8_value(1u, e5m2) / 2.0; /* flush boundary */
    const double extra[] = {maxv + half_ulp_max, maxv + 2.0 * half_ulp_max, 2.0 * maxv,
                            tiny, 3.0 * tiny, 1e-30, 1e30, 65504.0, 65520.0};
    const uint32_t bits[] = {0x00000001u, 0x00000002u, 0x007FFFFFu, 0x00400000u,
                             0x00800000u, 0x7F7FFFFFu, 0x7F800000u, 0x00000000u};
    for (unsigned c = 0; c <= maxc; c++) {
        float v = (float)oracle_fp8_value(c, e5m2);
        oracle__push2(out, cap, &n, v);
        oracle__push2(out, cap, &n, nextafterf(v, 0.0f));
        oracle__push2(out, cap, &n, nextafterf(v, INFINITY));
        if (c < maxc) {
            float mid = (float)((oracle_fp8_value(c, e5m2) + oracle_fp8_value(c + 1u, e5m2)) / 2.0);
            oracle__push2(out, cap, &n, mid);
            oracle__push2(out, cap, &n, nextafterf(mid, 0.0f));
            oracle__push2(out, cap, &n, nextafterf(mid, INFINITY));
        }
    }
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
        float v = (float)extra[i];
        oracle__push2(out, cap, &n, v);
        oracle__push2(out, cap, &n, nextafterf(v, 0.0f));
        oracle__push2(out, cap, &n, nextafterf(v, INFINITY));
    }
    for (size_t i = 0; i < sizeof bits / sizeof bits[0]; i++)
        oracle__push2(out, cap, &n, oracle_f32_bits(bits[i]));
    oracle__push2(out, cap, &n, oracle_f32_bits(0x7FC00000u));  /* qNaN */
    oracle__push2(out, cap, &n, oracle_f32_bits(0x7F800001u));  /* sNaN */
    oracle__push2(out, cap, &n, oracle_f32_bits(0x7FFFFFFFu));
    return n;
}

/* splitmix64: the tests' deterministic random source. */
static inline uint64_t oracle_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A random fp32: odd draws are raw bit patterns (every class: NaN, Inf,
 * denormal), even draws have |x| log-uniform over the FP8 ranges, [2^-20, 2^18). */
static inline float oracle_rand_f32(uint64_t *state)
{
    uint64_t r = oracle_rand(state);
    if (r & 1u)
        return oracle_f32_bits((uint32_t)(r >> 32));
    {
        uint32_t exp = (uint32_t)(127 - 20 + (int)((r >> 8) % 38u));
        uint32_t u = ((uint32_t)(r >> 1) & 0x80000000u) | (exp << 23) |
                     ((uint32_t)(r >> 32) & 0x7FFFFFu);
        return oracle_f32_bits(u);
    }
}

#endif /* KVS_FP8_ORACLE_H */
