/*
 * test_kvq_math.c — kernels/kvq_math.h against independent oracles.
 *
 * FP8 encode is checked exhaustively over all 65,536 fp16 inputs and over the
 * fp32 boundary set (every code, midpoint and their neighbours, overflow and
 * flush-to-zero regions, specials) and random fp32 against the brute-force
 * oracle of tests/conformance/fp8_oracle.h; where the CUDA toolkit headers are
 * present (KVS_TEST_HAVE_CUDA_FP8), also against CUDA's own host emulation of
 * cvt.rn.satfinite (cuda_fp8.h compiles as C). fp16/bf16 conversions are checked
 * over every bit pattern and every rounding boundary; INT8 ties and saturation,
 * scales and top-k by value tables and brute force.
 */
#include "kvq_math.h"

#include "fp8_oracle.h"
#include "kvs_test.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(KVS_TEST_HAVE_CUDA_FP8)
#include <cuda_fp8.h>
#endif

/* Report at most a few mismatches per test, then just count them. */
#define MAX_REPORT 8

static uint32_t bits_of(float f) { return oracle_bits_f32(f); }
static float float_of(uint32_t u) { return oracle_f32_bits(u); }

static int is_fp16_nan(uint16_t h) { return (h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0; }
static int is_bf16_nan(uint16_t b) { return (b & 0x7F80u) == 0x7F80u && (b & 0x7Fu) != 0; }

static kvq_fp8_format fmt_of(int e5m2) { return e5m2 ? KVQ_FP8_E5M2 : KVQ_FP8_E4M3; }
static const char *fmt_name(int e5m2) { return e5m2 ? "e5m2" : "e4m3"; }

/* Counts and prints (a few) fp32 inputs where kvq_math disagrees with the oracle. */
static unsigned check_fp8_f32(const float *xs, size_t n, int e5m2, const char *what)
{
    unsigned bad = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned want = oracle_fp8_encode((double)xs[i], e5m2);
        unsigned got = kvq_f32_to_fp8(xs[i], fmt_of(e5m2));
        if (got != want && bad++ < MAX_REPORT)
            printf("\n  %s %s: x=%a (0x%08x) got 0x%02x want 0x%02x", what, fmt_name(e5m2),
                   (double)xs[i], bits_of(xs[i]), got, want);
    }
    return bad;
}

/* ---- fp16 ------------------------------------------------------------------ */

static void test_fp16_decode_all(void)
{
    unsigned bad = 0;
    for (uint32_t h = 0; h < 0x10000u; h++) {
        float f = kvq_fp16_to_f32((uint16_t)h);
        int ok;
        if (is_fp16_nan((uint16_t)h)) {
            uint32_t want = ((h & 0x8000u) << 16) | 0x7FC00000u | ((h & 0x3FFu) << 13);
            ok = bits_of(f) == want;
        } else {
            double v = oracle_fp16_value((uint16_t)h);
            ok = (double)f == v && !!signbit(f) == !!signbit(v);
        }
        if (!ok && bad++ < MAX_REPORT)
            printf("\n  fp16 0x%04x -> 0x%08x", h, bits_of(f));
    }
    CU_ASSERT_EQUAL(bad, 0);
}

static void test_fp16_roundtrip_all(void)
{
    unsigned bad = 0;
    for (uint32_t h = 0; h < 0x10000u; h++) {
        uint16_t back = kvq_f32_to_fp16(kvq_fp16_to_f32((uint16_t)h));
        /* Identity, except that a signalling NaN comes back quiet. */
        uint16_t want = is_fp16_nan((uint16_t)h) ? (uint16_t)(h | 0x200u) : (uint16_t)h;
        if (back != want && bad++ < MAX_REPORT)
            printf("\n  fp16 0x%04x -> 0x%04x", h, back);
    }
    CU_ASSERT_EQUAL(bad, 0);
}

/* Every pair of adjacent fp16 values (0x7C00 = Inf acting as 65536 for rounding):
 * the midpoint goes to the even code, its fp32 neighbours to the near side. */
static void test_fp16_rounding_boundaries(void)
{
    unsigned bad = 0;
    for (uint32_t lo = 0; lo < 0x7C00u; lo++) {
        uint32_t hi = lo + 1;
        double vlo = oracle_fp16_value((uint16_t)lo);
        double vhi = hi == 0x7C00u ? 65536.0 : oracle_fp16_value((uint16_t)hi);
        float mid = (float)((vlo + vhi) / 2.0);
        CU_ASSERT_EQUAL_FATAL((double)mid, (vlo + vhi) / 2.0); /* exact in fp32 */
        for (int s = 0; s < 2; s++) {
            uint16_t sg = s ? 0x8000u : 0u;
            float m = s ? -mid : mid;
            uint16_t even = (uint16_t)(((lo & 1u) ? hi : lo) | sg);
            if (kvq_f32_to_fp16(m) != even ||
                kvq_f32_to_fp16(nextafterf(m, 0.0f)) != (uint16_t)(lo | sg) ||
                kvq_f32_to_fp16(nextafterf(m, s ? -INFINITY : INFINITY)) != (uint16_t)(hi | sg) ||
                kvq_f32_to_fp16((float)(s ? -vlo : vlo)) != (uint16_t)(lo | sg)) {
                if (bad++ < MAX_REPORT)
                    printf("\n  fp16 pair 0x%04x/0x%04x sign %d", lo, hi, s);
            }
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(kvq_f32_to_fp16(65504.0f), 0x7BFF);
    CU_ASSERT_EQUAL(kvq_f32_to_fp16(nextafterf(65520.0f, 0.0f)), 0x7BFF);
    CU_ASSERT_EQUAL(kvq_f32_to_fp16(65520.0f), 0x7C00);
    CU_ASSERT_EQUAL(kvq_f32_to_fp16(-65520.0f), 0xFC00);
    CU_ASSERT_EQUAL(kvq_f32_to_fp16(FLT_MAX), 0x7C00);
    CU_ASSERT_EQUAL(kvq_f32_to_fp16(INFINITY), 0x7C00);
    CU_ASSERT_EQUAL(kvq_f32_to_fp16(-INFINITY), 0xFC00);
    CU_ASSERT_EQUAL(kvq_f32_to_fp16(0x1p-24f), 0x0001);
    CU_ASSERT_EQUAL(kvq_f32_to_fp16(0x1p-25f), 0x0000);
    CU_ASSERT_EQUAL(kvq_f32_to_fp16(-0x1p-25f), 0x8000);
    CU_ASSERT_EQUAL(kvq_f32_to_fp16(nextafterf(0x1p-25f, 1.0f)), 0x0001);
    CU_ASSERT_EQUAL(kvq_f32_to_fp16(0x1.8p-24f), 0x0002); /* tie 1|2 → even */
    CU_ASSERT_EQUAL(kvq_f32_to_fp16(0x1.ffcp-15f), 0x0400); /* rounds up into the normals */
    CU_ASSERT_EQUAL(kvq_f32_to_fp16(float_of(0x00000001u)), 0x0000);
    CU_ASSERT_EQUAL(kvq_f32_to_fp16(float_of(0x807FFFFFu)), 0x8000);
    CU_ASSERT_EQUAL(kvq_f32_to_fp16(-0.0f), 0x8000);
    /* NaN: quiet, sign and top payload bits kept. */
    CU_ASSERT_EQUAL(kvq_f32_to_fp16(float_of(0x7FC00000u)), 0x7E00);
    CU_ASSERT_EQUAL(kvq_f32_to_fp16(float_of(0xFFC00001u)), 0xFE00);
    CU_ASSERT_EQUAL(kvq_f32_to_fp16(float_of(0x7F800001u)), 0x7E00);
    CU_ASSERT_EQUAL(kvq_f32_to_fp16(float_of(0x7FFFFFFFu)), 0x7FFF);
    CU_ASSERT_EQUAL(kvq_f32_to_fp16(float_of(0x7FA02000u)), 0x7F01);
}

/* Nearest fp16 to a finite double by binary search over the positive codes
 * (Inf standing in as 65536), ties to even; independent of kvq_math. */
static uint16_t oracle_fp16_encode(double x)
{
    static double tab[0x7C01];
    static int init;
    uint16_t sign;
    double ax;
    uint32_t lo = 0, hi = 0x7C00u;
    if (!init) {
        for (uint32_t h = 0; h < 0x7C00u; h++)
            tab[h] = oracle_fp16_value((uint16_t)h);
        tab[0x7C00] = 65536.0;
        init = 1;
    }
    if (isnan(x))
        return 0x7E00u;
    sign = signbit(x) ? 0x8000u : 0u;
    ax = fabs(x);
    if (ax >= 65536.0)
        return sign | 0x7C00u;
    while (hi - lo > 1) { /* tab[lo] <= ax < tab[hi] */
        uint32_t m = (lo + hi) / 2;
        if (tab[m] <= ax)
            lo = m;
        else
            hi = m;
    }
    if (ax - tab[lo] < tab[hi] - ax)
        return (uint16_t)(sign | lo);
    if (ax - tab[lo] > tab[hi] - ax)
        return (uint16_t)(sign | hi);
    return (uint16_t)(sign | ((lo & 1u) ? hi : lo));
}

static void test_fp16_random(void)
{
    uint64_t st = 0x1234;
    unsigned bad = 0;
    for (int i = 0; i < 1000000; i++) {
        float x = oracle_rand_f32(&st);
        uint16_t got = kvq_f32_to_fp16(x), want;
        if (isnan(x)) {
            if (!is_fp16_nan(got) || !(got & 0x200u) || (got >> 15) != (bits_of(x) >> 31))
                bad++;
            continue;
        }
        want = oracle_fp16_encode((double)x);
        if (got != want && bad++ < MAX_REPORT)
            printf("\n  x=%a got 0x%04x want 0x%04x", (double)x, got, want);
    }
    CU_ASSERT_EQUAL(bad, 0);
}

/* ---- bf16 ------------------------------------------------------------------ */

static double oracle_bf16_value(uint16_t b)
{
    double s = (b & 0x8000u) ? -1.0 : 1.0;
    unsigned e = (b >> 7) & 0xFFu, m = b & 0x7Fu;
    if (e == 255u)
        return m ? NAN : s * INFINITY;
    if (e == 0)
        return s * ldexp((double)m, -133);
    return s * ldexp((double)(128u + m), (int)e - 134);
}

static void test_bf16_all(void)
{
    unsigned bad = 0;
    for (uint32_t b = 0; b < 0x10000u; b++) {
        float f = kvq_bf16_to_f32((uint16_t)b);
        uint16_t back = kvq_f32_to_bf16(f);
        int ok;
        if (is_bf16_nan((uint16_t)b)) {
            ok = bits_of(f) == ((b << 16) | 0x00400000u) && back == (uint16_t)(b | 0x40u);
        } else {
            double v = oracle_bf16_value((uint16_t)b);
            ok = (double)f == v && !!signbit(f) == !!signbit(v) && back == b;
        }
        if (!ok && bad++ < MAX_REPORT)
            printf("\n  bf16 0x%04x -> 0x%08x -> 0x%04x", b, bits_of(f), back);
    }
    CU_ASSERT_EQUAL(bad, 0);
}

/* The two bf16 candidates around x are its truncation t and t+1 (in magnitude);
 * pick the nearer in double, ties to even, Inf counting as 2^128. */
static void test_bf16_rounding(void)
{
    uint64_t st = 99;
    unsigned bad = 0;
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)oracle_rand(&st);
        float x;
        uint16_t got, t, want;
        double ax, vt, vu;
        if (i % 4 == 1)
            u = (u & 0xFFFF0000u) | 0x8000u; /* exact tie */
        else if (i % 4 == 2)
            u = (u & 0xFFFF0000u) | 0x7FFFu; /* just under a tie */
        x = float_of(u);
        got = kvq_f32_to_bf16(x);
        if (isnan(x)) {
            if (got != (uint16_t)((u >> 16) | 0x40u))
                bad++;
            continue;
        }
        t = (uint16_t)(u >> 16);
        if ((t & 0x7FFFu) == 0x7F80u) { /* ±Inf */
            if (got != t)
                bad++;
            continue;
        }
        ax = fabs((double)x);
        vt = fabs(oracle_bf16_value(t));
        vu = ((t & 0x7FFFu) == 0x7F7Fu) ? ldexp(1.0, 128) : fabs(oracle_bf16_value((uint16_t)(t + 1)));
        if (ax - vt < vu - ax || (ax - vt == vu - ax && !(t & 1u)))
            want = t;
        else
            want = (uint16_t)(t + 1);
        if (got != want && bad++ < MAX_REPORT)
            printf("\n  x=0x%08x got 0x%04x want 0x%04x", u, got, want);
    }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(kvq_f32_to_bf16(float_of(0x7F7F7FFFu)), 0x7F7F);
    CU_ASSERT_EQUAL(kvq_f32_to_bf16(float_of(0x7F7F8000u)), 0x7F80); /* tie, odd → Inf */
    CU_ASSERT_EQUAL(kvq_f32_to_bf16(FLT_MAX), 0x7F80);
    CU_ASSERT_EQUAL(kvq_f32_to_bf16(-INFINITY), 0xFF80);
    CU_ASSERT_EQUAL(kvq_f32_to_bf16(float_of(0x00008000u)), 0x0000); /* denormal tie → even */
    CU_ASSERT_EQUAL(kvq_f32_to_bf16(float_of(0x00018000u)), 0x0002);
    CU_ASSERT_EQUAL(kvq_f32_to_bf16(float_of(0x80008001u)), 0x8001);
    CU_ASSERT_EQUAL(kvq_f32_to_bf16(float_of(0xFF800001u)), 0xFFC0); /* sNaN → quiet */
}

/* ---- FP8 ------------------------------------------------------------------- */

static void test_fp8_decode_all(void)
{
    for (int e5m2 = 0; e5m2 < 2; e5m2++) {
        unsigned bad = 0;
        for (unsigned c = 0; c < 256; c++) {
            float f = kvq_fp8_to_f32((uint8_t)c, fmt_of(e5m2));
            double v = oracle_fp8_value(c, e5m2);
            uint16_t h = kvq_fp8_to_fp16((uint8_t)c, fmt_of(e5m2));
            int ok;
            if (isnan(v))
                ok = bits_of(f) == KVQ_F32_CANONICAL_NAN && h == 0x7FFFu;
            else
                ok = (double)f == v && !!signbit(f) == !!signbit(v) &&
                     oracle_fp16_value(h) == v && !!(h & 0x8000u) == !!signbit(v);
            if (!ok && bad++ < MAX_REPORT)
                printf("\n  %s 0x%02x -> %a / 0x%04x", fmt_name(e5m2), c, (double)f, h);
        }
        CU_ASSERT_EQUAL(bad, 0);
    }
    CU_ASSERT_EQUAL(kvq_e4m3_to_f32(0x7E), 448.0f);
    CU_ASSERT_EQUAL(kvq_e4m3_to_f32(0x01), 0x1p-9f);
    CU_ASSERT_EQUAL(kvq_e4m3_to_f32(0x38), 1.0f);
    CU_ASSERT_EQUAL(kvq_e5m2_to_f32(0x7B), 57344.0f);
    CU_ASSERT_EQUAL(kvq_e5m2_to_f32(0x01), 0x1p-16f);
    CU_ASSERT_TRUE(isinf(kvq_e5m2_to_f32(0xFC)) && kvq_e5m2_to_f32(0xFC) < 0);
    CU_ASSERT_EQUAL(bits_of(kvq_e4m3_to_f32(0xFF)), KVQ_F32_CANONICAL_NAN);
    CU_ASSERT_EQUAL(bits_of(kvq_e5m2_to_f32(0xFD)), KVQ_F32_CANONICAL_NAN);
}

/* encode(decode(c)) == c for every finite code; E5M2 ±Inf → ±max. */
static void test_fp8_code_identity(void)
{
    for (int e5m2 = 0; e5m2 < 2; e5m2++) {
        unsigned bad = 0;
        for (unsigned c = 0; c < 256; c++) {
            double v = oracle_fp8_value(c, e5m2);
            unsigned want = c, got;
            if (isnan(v))
                continue;
            if (isinf(v))
                want = (c & 0x80u) | oracle_fp8_max_code(e5m2);
            got = kvq_f32_to_fp8(kvq_fp8_to_f32((uint8_t)c, fmt_of(e5m2)), fmt_of(e5m2));
            if (got != want && bad++ < MAX_REPORT)
                printf("\n  %s 0x%02x -> 0x%02x", fmt_name(e5m2), c, got);
        }
        CU_ASSERT_EQUAL(bad, 0);
    }
}

/* All 65,536 fp16 inputs, both formats, through the f16 and the f32 entry. */
static void test_fp8_exhaustive_fp16(void)
{
    for (int e5m2 = 0; e5m2 < 2; e5m2++) {
        unsigned bad = 0;
        for (uint32_t h = 0; h < 0x10000u; h++) {
            unsigned want = oracle_fp8_encode(oracle_fp16_value((uint16_t)h), e5m2);
            unsigned got = kvq_fp16_to_fp8((uint16_t)h, fmt_of(e5m2));
            unsigned got32 = kvq_f32_to_fp8(kvq_fp16_to_f32((uint16_t)h), fmt_of(e5m2));
            if ((got != want || got32 != want) && bad++ < MAX_REPORT)
                printf("\n  %s fp16 0x%04x got 0x%02x/0x%02x want 0x%02x", fmt_name(e5m2), h,
                       got, got32, want);
        }
        CU_ASSERT_EQUAL(bad, 0);
    }
}

static void test_fp8_boundaries(void)
{
    static float xs[4096];
    for (int e5m2 = 0; e5m2 < 2; e5m2++) {
        size_t n = oracle_fp8_boundaries(e5m2, xs, sizeof xs / sizeof xs[0]);
        CU_ASSERT_TRUE(n > 1000 && n < sizeof xs / sizeof xs[0]);
        CU_ASSERT_EQUAL(check_fp8_f32(xs, n, e5m2, "boundary"), 0);
    }
}

/* The facts of QUANTIZATION.md §4 and cvt.rn.satfinite, spelled out. */
static void test_fp8_known_values(void)
{
    static const struct {
        float x;
        uint8_t e4m3, e5m2;
    } t[] = {
        {0.0f, 0x00, 0x00},
        {-0.0f, 0x80, 0x80},
        {1.0f, 0x38, 0x3C},
        {-2.0f, 0xC0, 0xC0},
        {448.0f, 0x7E, 0x5F},
        {464.0f, 0x7E, 0x5F},        /* E4M3 max + ½ulp: tie to even = max */
        {480.0f, 0x7E, 0x60},        /* E4M3 beyond max: satfinite; E5M2 tie → 512 */
        {-1e6f, 0xFE, 0xFB},
        {57344.0f, 0x7E, 0x7B},
        {61440.0f, 0x7E, 0x7B},      /* E5M2 max + ½ulp: would be Inf, satfinite → max */
        {FLT_MAX, 0x7E, 0x7B},
        {INFINITY, 0x7E, 0x7B},      /* ±Inf → ±max under satfinite */
        {-INFINITY, 0xFE, 0xFB},
        {0x1p-6f, 0x08, 0x24},       /* E4M3 min normal */
        {0x1p-9f, 0x01, 0x18},       /* E4M3 min subnormal */
        {0x1p-10f, 0x00, 0x14},      /* E4M3 flush boundary: tie with 0 → 0 */
        {-0x1p-10f, 0x80, 0x94},
        {0x1.000002p-10f, 0x01, 0x14},
        {0x1.8p-9f, 0x02, 0x1A},     /* E4M3 tie between codes 1 and 2 → 2 */
        {0x1p-14f, 0x00, 0x04},      /* E5M2 min normal */
        {0x1p-16f, 0x00, 0x01},      /* E5M2 min subnormal */
        {0x1p-17f, 0x00, 0x00},      /* E5M2 flush boundary */
        {0x1.000002p-17f, 0x00, 0x01},
        {-0x1.000002p-17f, 0x80, 0x81},
        {0x1p-149f, 0x00, 0x00},     /* fp32 denormals */
        {-0x1p-149f, 0x80, 0x80},
        {1.0625f, 0x38, 0x3C},       /* tie, even mantissa below */
        {1.1875f, 0x3A, 0x3D},       /* E4M3 tie 1.125|1.25 → 1.25 (even); E5M2 → 1.25 */
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        unsigned g4 = kvq_f32_to_e4m3(t[i].x), g5 = kvq_f32_to_e5m2(t[i].x);
        if (g4 != t[i].e4m3 || g5 != t[i].e5m2)
            printf("\n  x=%a: e4m3 0x%02x (want 0x%02x) e5m2 0x%02x (want 0x%02x)",
                   (double)t[i].x, g4, t[i].e4m3, g5, t[i].e5m2);
        CU_ASSERT_EQUAL(g4, t[i].e4m3);
        CU_ASSERT_EQUAL(g5, t[i].e5m2);
        /* and the oracle agrees with the table */
        CU_ASSERT_EQUAL(oracle_fp8_encode((double)t[i].x, 0), t[i].e4m3);
        CU_ASSERT_EQUAL(oracle_fp8_encode((double)t[i].x, 1), t[i].e5m2);
    }
}

static void test_fp8_nan(void)
{
    static const uint32_t nans[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u,
                                    0x7FFFFFFFu, 0xFFFFFFFFu, 0x7FA00000u};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        CU_ASSERT_EQUAL(kvq_f32_to_e4m3(float_of(nans[i])), 0x7F);
        CU_ASSERT_EQUAL(kvq_f32_to_e5m2(float_of(nans[i])), 0x7F);
    }
    CU_ASSERT_EQUAL(kvq_fp16_to_fp8(0x7E00, KVQ_FP8_E4M3), 0x7F);
    CU_ASSERT_EQUAL(kvq_fp16_to_fp8(0xFC01, KVQ_FP8_E4M3), 0x7F);
    CU_ASSERT_EQUAL(kvq_fp16_to_fp8(0xFC01, KVQ_FP8_E5M2), 0x7F);
    CU_ASSERT_EQUAL(kvq_fp16_to_fp8(0x7C00, KVQ_FP8_E5M2), 0x7B); /* +Inf → max */
    CU_ASSERT_EQUAL(kvq_fp16_to_fp8(0xFC00, KVQ_FP8_E4M3), 0xFE);
}

static void test_fp8_random(void)
{
    enum { N = 300000 };
    float *xs = malloc(N * sizeof *xs);
    uint64_t st = 7;
    CU_ASSERT_PTR_NOT_NULL_FATAL(xs);
    for (int i = 0; i < N; i++)
        xs[i] = oracle_rand_f32(&st);
    CU_ASSERT_EQUAL(check_fp8_f32(xs, N, 0, "random"), 0);
    CU_ASSERT_EQUAL(check_fp8_f32(xs, N, 1, "random"), 0);
    free(xs);
}

#if defined(KVS_TEST_HAVE_CUDA_FP8)
/* CUDA's host emulation of cvt.rn.satfinite (what the device computes below
 * sm_89, written by NVIDIA to match the instruction) as a second oracle. */
static void test_fp8_vs_cuda_emulation(void)
{
    static float xs[4096];
    uint64_t st = 42;
    for (int e5m2 = 0; e5m2 < 2; e5m2++) {
        __nv_fp8_interpretation_t in = e5m2 ? __NV_E5M2 : __NV_E4M3;
        unsigned bad = 0;
        size_t n = oracle_fp8_boundaries(e5m2, xs, sizeof xs / sizeof xs[0]);
        for (uint32_t h = 0; h < 0x10000u; h++) {
            __half_raw r;
            r.x = (unsigned short)h;
            if (kvq_fp16_to_fp8((uint16_t)h, fmt_of(e5m2)) !=
                    __nv_cvt_halfraw_to_fp8(r, __NV_SATFINITE, in) &&
                bad++ < MAX_REPORT)
                printf("\n  %s fp16 0x%04x", fmt_name(e5m2), h);
        }
        for (size_t i = 0; i < n; i++)
            if (kvq_f32_to_fp8(xs[i], fmt_of(e5m2)) !=
                    __nv_cvt_float_to_fp8(xs[i], __NV_SATFINITE, in) &&
                bad++ < MAX_REPORT)
                printf("\n  %s x=%a", fmt_name(e5m2), (double)xs[i]);
        for (int i = 0; i < 2000000; i++) {
            float x = oracle_rand_f32(&st);
            if (kvq_f32_to_fp8(x, fmt_of(e5m2)) != __nv_cvt_float_to_fp8(x, __NV_SATFINITE, in) &&
                bad++ < MAX_REPORT)
                printf("\n  %s x=%a", fmt_name(e5m2), (double)x);
        }
        for (unsigned c = 0; c < 256; c++)
            if (kvq_fp8_to_fp16((uint8_t)c, fmt_of(e5m2)) !=
                    __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, in).x &&
                bad++ < MAX_REPORT)
                printf("\n  %s decode 0x%02x", fmt_name(e5m2), c);
        CU_ASSERT_EQUAL(bad, 0);
    }
}
#endif

/* ---- INT8 ------------------------------------------------------------------ */

static void test_int8_rounding(void)
{
    static const struct {
        float y;
        int q;
    } t[] = {
        {0.0f, 0},     {-0.0f, 0},    {0.5f, 0},      {-0.5f, 0},     {1.5f, 2},
        {-1.5f, -2},   {2.5f, 2},     {-2.5f, -2},    {0.49999997f, 0}, {0.50000006f, 1},
        {126.5f, 126}, {-126.5f, -126}, {126.50001f, 127}, {127.0f, 127}, {127.5f, 127},
        {-127.5f, -127}, {128.0f, 127}, {-128.0f, -127}, {-1000.0f, -127}, {FLT_MAX, 127},
        {INFINITY, 127}, {-INFINITY, -127}, {NAN, 0},  {-NAN, 0},       {1e-40f, 0},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        int q = kvq_int8_quantize(t[i].y, 1.0f);
        if (q != t[i].q)
            printf("\n  y=%a -> %d (want %d)", (double)t[i].y, q, t[i].q);
        CU_ASSERT_EQUAL(q, t[i].q);
    }
    /* The multiply is part of the rule: x * inv_scale, then round. */
    CU_ASSERT_EQUAL(kvq_int8_quantize(5.0f, 0.5f), 2);  /* 2.5 → 2 */
    CU_ASSERT_EQUAL(kvq_int8_quantize(7.0f, 0.5f), 4);  /* 3.5 → 4 */
    CU_ASSERT_EQUAL(kvq_int8_quantize(INFINITY, 0.0f), 0); /* Inf·0 = NaN → 0 */
    CU_ASSERT_EQUAL(kvq_int8_dequantize(-127, 0.5f), -63.5f);
    CU_ASSERT_EQUAL(kvq_int8_dequantize(3, 0.0f), 0.0f);
}

/* Every fp16 value as x, two multipliers, against round-half-even in double. */
static void test_int8_exhaustive_fp16(void)
{
    static const float invs[] = {1.0f, 0.37f, 3.0f};
    unsigned bad = 0;
    for (size_t k = 0; k < sizeof invs / sizeof invs[0]; k++) {
        for (uint32_t h = 0; h < 0x10000u; h++) {
            float x = kvq_fp16_to_f32((uint16_t)h);
            double y = (double)(x * invs[k]);
            int want, got = kvq_int8_quantize(x, invs[k]);
            if (isnan(y)) {
                want = 0;
            } else if (y >= 127.0) {
                want = 127;
            } else if (y <= -127.0) {
                want = -127;
            } else {
                double f = floor(y), frac = y - f;
                want = (int)f + (frac > 0.5 || (frac == 0.5 && fmod(f, 2.0) != 0.0));
            }
            if (got != want && bad++ < MAX_REPORT)
                printf("\n  x=%a inv=%a got %d want %d", (double)x, (double)invs[k], got, want);
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
}

/* ---- scales ---------------------------------------------------------------- */

static void test_scale_from_amax(void)
{
    CU_ASSERT_EQUAL(kvq_scale_from_amax(448.0f, KVQ_E4M3_MAX), 1.0f);
    CU_ASSERT_EQUAL(kvq_scale_from_amax(57344.0f, KVQ_E5M2_MAX), 1.0f);
    CU_ASSERT_EQUAL(kvq_scale_from_amax(127.0f, KVQ_INT8_MAX), 1.0f);
    CU_ASSERT_EQUAL(kvq_scale_from_amax(3.0f, KVQ_INT8_MAX), 3.0f / 127.0f);
    CU_ASSERT_EQUAL(kvq_scale_from_amax(0.0f, KVQ_E4M3_MAX), 0.0f);
    CU_ASSERT_EQUAL(kvq_scale_from_amax(-0.0f, KVQ_E4M3_MAX), 0.0f);
    CU_ASSERT_EQUAL(kvq_scale_from_amax(-1.0f, KVQ_E4M3_MAX), 0.0f);
    CU_ASSERT_EQUAL(kvq_scale_from_amax(NAN, KVQ_E4M3_MAX), 0.0f);
    CU_ASSERT_EQUAL(kvq_scale_from_amax(INFINITY, KVQ_E4M3_MAX), 0.0f);
    CU_ASSERT_EQUAL(kvq_scale_from_amax(0x1p-149f, KVQ_E4M3_MAX), FLT_MIN);
    CU_ASSERT_EQUAL(kvq_scale_from_amax(FLT_MIN, KVQ_INT8_MAX), FLT_MIN);
    CU_ASSERT_EQUAL(kvq_scale_from_amax(FLT_MAX, KVQ_E4M3_MAX), FLT_MAX / 448.0f);
    CU_ASSERT_TRUE(isfinite(kvq_scale_inv(kvq_scale_from_amax(0x1p-149f, KVQ_E5M2_MAX))));

    CU_ASSERT_EQUAL(kvq_scale_inv(0.5f), 2.0f);
    CU_ASSERT_EQUAL(kvq_scale_inv(FLT_MIN), 0x1p126f);
    CU_ASSERT_EQUAL(kvq_scale_inv(0.0f), 0.0f);
    CU_ASSERT_EQUAL(kvq_scale_inv(-2.0f), 0.0f);
    CU_ASSERT_EQUAL(kvq_scale_inv(0x1p-140f), 0.0f);
    CU_ASSERT_EQUAL(kvq_scale_inv(NAN), 0.0f);
    CU_ASSERT_EQUAL(kvq_scale_inv(INFINITY), 0.0f);

    {
        float a = 0.0f;
        a = kvq_amax_update(a, 1.5f);
        a = kvq_amax_update(a, NAN);
        a = kvq_amax_update(a, -INFINITY);
        a = kvq_amax_update(a, -5.0f);
        a = kvq_amax_update(a, INFINITY);
        a = kvq_amax_update(a, 2.0f);
        CU_ASSERT_EQUAL(a, 5.0f);
    }
}

/* kvq_scale_align_fp16 by its definition, in doubles: every t * 2^e that is
 * exactly an fp16 value (<= 65504, a multiple of 2^-24: t's significand
 * already fits fp16's), the smallest of them >= g, else the largest. */
static uint16_t align_oracle(uint16_t g16, uint16_t t16)
{
    if (g16 == 0 || t16 == 0)
        return g16;
    const double g = kvq_fp16_to_f32(g16), t = kvq_fp16_to_f32(t16);
    double best = 0.0, top = 0.0;
    for (int e = -48; e <= 48; e++) {
        double c = ldexp(t, e), u = c * 0x1p24;
        if (c > 65504.0 || u != floor(u))
            continue;
        if (c > top)
            top = c;
        if (c >= g && (best == 0.0 || c < best))
            best = c;
    }
    return kvq_f32_to_fp16((float)(best != 0.0 ? best : top));
}

static unsigned check_align(uint16_t g16, uint16_t t16)
{
    uint16_t got = kvq_scale_align_fp16(g16, t16), want = align_oracle(g16, t16);
    if (got != want) {
        printf("\n  align g 0x%04x t 0x%04x: got 0x%04x want 0x%04x", g16, t16, got, want);
        return 1;
    }
    return 0;
}

static void test_scale_align(void)
{
    /* by hand */
    CU_ASSERT_EQUAL(kvq_scale_align_fp16(0x3C00, 0x3C00), 0x3C00); /* 1 on 1 */
    CU_ASSERT_EQUAL(kvq_scale_align_fp16(0x3C01, 0x3C00), 0x4000); /* just above 1 -> 2 */
    CU_ASSERT_EQUAL(kvq_scale_align_fp16(0x3BFF, 0x3C00), 0x3C00); /* just below 1 -> 1 */
    CU_ASSERT_EQUAL(kvq_scale_align_fp16(0x3800, 0x3C00), 0x3800); /* 0.5 = 1 * 2^-1 */
    CU_ASSERT_EQUAL(kvq_scale_align_fp16(0x3C00, 0x3A00), 0x3E00); /* 1 on 0.75 -> 1.5 */
    CU_ASSERT_EQUAL(kvq_scale_align_fp16(0x2E66, 0x3A00), 0x3200); /* 0.1 on 0.75 -> 0.1875 */
    CU_ASSERT_EQUAL(kvq_scale_align_fp16(0x7000, 0x0001), 0x7000); /* 8192 on 2^-24 */
    CU_ASSERT_EQUAL(kvq_scale_align_fp16(0x7BFF, 0x3C00), 0x7800); /* clamped: 32768 < 65504 */
    CU_ASSERT_EQUAL(kvq_scale_align_fp16(0x7BFF, 0x3E00), 0x7A00); /* 1.5 * 2^15 = 49152 */
    CU_ASSERT_EQUAL(kvq_scale_align_fp16(0x7A01, 0x3E00), 0x7A00); /* just above: saturates */
    CU_ASSERT_EQUAL(kvq_scale_align_fp16(0x7BFF, 0x7BFF), 0x7BFF); /* 65504 itself */
    CU_ASSERT_EQUAL(kvq_scale_align_fp16(0x0001, 0x0003), 0x0003); /* 3 * 2^-24 is the least */
    CU_ASSERT_EQUAL(kvq_scale_align_fp16(0x0001, 0x0400), 0x0001); /* 2^-14 down to 2^-24 */
    CU_ASSERT_EQUAL(kvq_scale_align_fp16(0x0001, 0x3C01), 0x0401); /* 1025 * 2^-24 */
    CU_ASSERT_EQUAL(kvq_scale_align_fp16(0x0005, 0x0003), 0x0006); /* subnormal to subnormal */
    CU_ASSERT_EQUAL(kvq_scale_align_fp16(0x03FF, 0x0003), 0x0600); /* 3 * 2^-16 */
    CU_ASSERT_EQUAL(kvq_scale_align_fp16(0, 0x3C00), 0);           /* zero group stays 0 */
    CU_ASSERT_EQUAL(kvq_scale_align_fp16(0x1234, 0), 0x1234);      /* no tensor scale */
    /* every t16 against a fixed set of g16, every g16 against a set of t16 */
    static const uint16_t gs[] = {0x0001, 0x0002, 0x0003, 0x00FF, 0x03FF, 0x0400, 0x0401,
                                  0x1400, 0x2E66, 0x3BFF, 0x3C00, 0x3C01, 0x4500, 0x5555,
                                  0x7800, 0x7A00, 0x7A01, 0x7BFE, 0x7BFF};
    static const uint16_t ts[] = {0x0001, 0x0002, 0x0003, 0x0005, 0x0155, 0x03FF, 0x0400,
                                  0x0401, 0x07FF, 0x0C00, 0x1A2B, 0x3A00, 0x3BFF, 0x3C00,
                                  0x3C01, 0x3E00, 0x5FFF, 0x7800, 0x7A00, 0x7BFF};
    unsigned bad = 0;
    for (uint32_t t = 1; t < 0x7C00u; t++)
        for (size_t i = 0; i < sizeof gs / sizeof gs[0]; i++)
            bad += check_align(gs[i], (uint16_t)t);
    for (uint32_t g = 1; g < 0x7C00u; g++)
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
            bad += check_align((uint16_t)g, ts[i]);
    /* and the property the quantizer relies on: the result is >= g, unless the
     * largest multiple is below g; t * 2^e exactly */
    for (uint32_t g = 1; g < 0x7C00u; g += 7)
        for (uint32_t t = 1; t < 0x7C00u; t += 61) {
            uint16_t a = kvq_scale_align_fp16((uint16_t)g, (uint16_t)t);
            double r = (double)kvq_fp16_to_f32(a) / kvq_fp16_to_f32((uint16_t)t);
            int e;
            double m = frexp(r, &e);
            if (m != 0.5 || (a < g && ldexp(kvq_fp16_to_f32(a), 1) <= 65504.0)) {
                if (bad++ < MAX_REPORT)
                    printf("\n  align g 0x%04x t 0x%04x -> 0x%04x", g, t, a);
            }
        }
    CU_ASSERT_EQUAL(bad, 0);
}

/* Random groups through the whole rule: amax (skipping specials), scale,
 * reciprocal, quantize, dequantize. Checks the amax element maps to ±max code,
 * the error bounds of QUANTIZATION.md §4, and what Inf/NaN elements become. */
static void test_scaled_groups(void)
{
    enum { G = 128 };
    float x[G];
    uint64_t st = 5;
    for (int iter = 0; iter < 2000; iter++) {
        float amax = 0.0f, mag = ldexpf(1.0f, (int)(oracle_rand(&st) % 40) - 20);
        for (int i = 0; i < G; i++) {
            double u = (double)(oracle_rand(&st) >> 11) * 0x1p-53 * 2.0 - 1.0;
            x[i] = (float)(u * mag);
        }
        x[iter % G] = INFINITY;
        x[(iter + 7) % G] = NAN;
        for (int i = 0; i < G; i++)
            amax = kvq_amax_update(amax, x[i]);
        CU_ASSERT_TRUE_FATAL(amax > 0.0f && isfinite(amax));
        for (int f = 0; f < 3; f++) {
            float qmax = f == 0 ? KVQ_E4M3_MAX : f == 1 ? KVQ_E5M2_MAX : KVQ_INT8_MAX;
            float scale = kvq_scale_from_amax(amax, qmax), inv = kvq_scale_inv(scale);
            unsigned bad = 0;
            CU_ASSERT_TRUE(scale > 0.0f && inv > 0.0f && isfinite(inv));
            for (int i = 0; i < G; i++) {
                double err;
                if (!isfinite(x[i]))
                    continue;
                if (f < 2) {
                    kvq_fp8_format fmt = fmt_of(f);
                    uint8_t c = kvq_fp8_quantize(x[i], inv, fmt);
                    double y = (double)kvq_fp8_dequantize(c, scale, fmt);
                    err = fabs(y - x[i]);
                    if (fabs(x[i]) == amax)
                        bad += (c & 0x7Fu) != (f ? KVQ_E5M2_MAX_CODE : KVQ_E4M3_MAX_CODE);
                    /* relative 2^-(mbits+1) in the normal range, plus one
                     * subnormal half-step below it (and float slack) */
                    bad += err > fabs(x[i]) * (f ? 0x1p-3 : 0x1p-4) * 1.0001 +
                                     (f ? 0x1p-17 : 0x1p-10) * scale * 1.0001;
                } else {
                    int8_t q = kvq_int8_quantize(x[i], inv);
                    double y = (double)kvq_int8_dequantize(q, scale);
                    err = fabs(y - x[i]);
                    if (fabs(x[i]) == amax)
                        bad += (q != 127 && q != -127);
                    bad += err > amax / 254.0 * 1.0001;
                }
            }
            CU_ASSERT_EQUAL(bad, 0);
            /* The specials, on their own terms. */
            if (f < 2) {
                CU_ASSERT_EQUAL(kvq_fp8_quantize(INFINITY, inv, fmt_of(f)),
                                f ? KVQ_E5M2_MAX_CODE : KVQ_E4M3_MAX_CODE);
                CU_ASSERT_EQUAL(kvq_fp8_quantize(NAN, inv, fmt_of(f)), KVQ_FP8_NAN_CODE);
            } else {
                CU_ASSERT_EQUAL(kvq_int8_quantize(-INFINITY, inv), -127);
                CU_ASSERT_EQUAL(kvq_int8_quantize(NAN, inv), 0);
            }
        }
    }
    /* An all-zero group: scale 0, every code 0, decodes to 0. */
    {
        float s = kvq_scale_from_amax(0.0f, KVQ_E4M3_MAX), inv = kvq_scale_inv(s);
        CU_ASSERT_EQUAL(kvq_fp8_quantize(0.0f, inv, KVQ_FP8_E4M3), 0);
        CU_ASSERT_EQUAL(kvq_fp8_dequantize(0, s, KVQ_FP8_E4M3), 0.0f);
        CU_ASSERT_EQUAL(kvq_int8_quantize(1.0f, inv), 0);
    }
}

/* ---- top-k ----------------------------------------------------------------- */

static void test_topk_examples(void)
{
    const float x[] = {3.0f, -7.0f, 7.0f, 1.0f, NAN, -INFINITY, 0.0f, -0.0f};
    int idx[10];
    memset(idx, 0xFF, sizeof idx);
    CU_ASSERT_EQUAL(kvq_topk_abs(x, 8, 4, idx), 4);
    CU_ASSERT_EQUAL(idx[0], 5); /* -Inf */
    CU_ASSERT_EQUAL(idx[1], 1); /* -7 before 7: lower index wins the tie */
    CU_ASSERT_EQUAL(idx[2], 2);
    CU_ASSERT_EQUAL(idx[3], 0);
    CU_ASSERT_EQUAL(idx[4], -1); /* untouched */
    CU_ASSERT_EQUAL(kvq_topk_abs(x, 8, 10, idx), 8);
    CU_ASSERT_EQUAL(idx[5], 6); /* +0, -0 tie by index */
    CU_ASSERT_EQUAL(idx[6], 7);
    CU_ASSERT_EQUAL(idx[7], 4); /* NaN last */
    CU_ASSERT_EQUAL(kvq_topk_abs(x, 8, 0, idx), 0);
    CU_ASSERT_EQUAL(kvq_topk_abs(x, 8, -3, idx), 0);
    CU_ASSERT_EQUAL(kvq_topk_abs(x, 0, 3, idx), 0);
    {
        const float nans[] = {NAN, NAN, NAN};
        CU_ASSERT_EQUAL(kvq_topk_abs(nans, 3, 2, idx), 2);
        CU_ASSERT_EQUAL(idx[0], 0);
        CU_ASSERT_EQUAL(idx[1], 1);
    }
}

static const float *g_topk_x;

static int topk_cmp(const void *a, const void *b)
{
    int i = *(const int *)a, j = *(const int *)b;
    float xi = g_topk_x[i], xj = g_topk_x[j];
    /* NaN lowest; otherwise larger |x| first; then lower index. */
    double ki = isnan(xi) ? -1.0 : fabs((double)xi), kj = isnan(xj) ? -1.0 : fabs((double)xj);
    if (ki != kj)
        return ki > kj ? -1 : 1;
    return i < j ? -1 : 1;
}

static void test_topk_random(void)
{
    static const float vals[] = {0.0f, -0.0f, 1.0f, -1.0f, 2.5f, -2.5f, 1e-40f, NAN, INFINITY, 3.0f};
    float x[40];
    int order[40] = {0}, idx[42] = {0};
    uint64_t st = 11;
    unsigned bad = 0;
    for (int iter = 0; iter < 5000; iter++) {
        int n = (int)(oracle_rand(&st) % 41u), k = (int)(oracle_rand(&st) % 43u);
        int want_k = k < n ? k : n;
        for (int i = 0; i < n; i++) {
            x[i] = vals[oracle_rand(&st) % (sizeof vals / sizeof vals[0])];
            order[i] = i;
        }
        g_topk_x = x;
        qsort(order, (size_t)n, sizeof order[0], topk_cmp);
        if (kvq_topk_abs(x, n, k, idx) != want_k || memcmp(idx, order, (size_t)want_k * sizeof(int)))
            bad++;
    }
    CU_ASSERT_EQUAL(bad, 0);
}

int main(void)
{
    static const kvs_test_case fp16_cases[] = {
        {"fp16_decode_all", test_fp16_decode_all},
        {"fp16_roundtrip_all", test_fp16_roundtrip_all},
        {"fp16_rounding_boundaries", test_fp16_rounding_boundaries},
        {"fp16_random", test_fp16_random},
        {"bf16_all", test_bf16_all},
        {"bf16_rounding", test_bf16_rounding},
        {NULL, NULL},
    };
    static const kvs_test_case fp8_cases[] = {
        {"fp8_decode_all", test_fp8_decode_all},
        {"fp8_code_identity", test_fp8_code_identity},
        {"fp8_exhaustive_fp16", test_fp8_exhaustive_fp16},
        {"fp8_boundaries", test_fp8_boundaries},
        {"fp8_known_values", test_fp8_known_values},
        {"fp8_nan", test_fp8_nan},
        {"fp8_random", test_fp8_random},
#if defined(KVS_TEST_HAVE_CUDA_FP8)
        {"fp8_vs_cuda_emulation", test_fp8_vs_cuda_emulation},
#endif
        {NULL, NULL},
    };
    static const kvs_test_case int8_cases[] = {
        {"int8_rounding", test_int8_rounding},
        {"int8_exhaustive_fp16", test_int8_exhaustive_fp16},
        {"scale_from_amax", test_scale_from_amax},
        {"scale_align", test_scale_align},
        {"scaled_groups", test_scaled_groups},
        {"topk_examples", test_topk_examples},
        {"topk_random", test_topk_random},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {
        {"kvq_fp16_bf16", NULL, NULL, fp16_cases},
        {"kvq_fp8", NULL, NULL, fp8_cases},
        {"kvq_int8_scale_topk", NULL, NULL, int8_cases},
        {NULL, NULL, NULL, NULL},
    };
    return kvs_test_run(suites);
}
