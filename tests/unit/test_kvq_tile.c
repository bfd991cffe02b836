/*
 * test_kvq_tile.c — the reference tile codec (kernels/ref/kvq_ref.c) and the
 * validation of untrusted tiles (kernels/kvq_tile.c).
 *
 * Expected bytes come from first principles, never from the code under test:
 * the golden tiles are written out by hand (codes worked out from the FP8/INT8
 * definitions, scales chosen as powers of two so every product is exact), the
 * random round trips recompute outlier ranks, scales and error bounds from
 * docs/FORMAT.md with an independent sort and double arithmetic, and checksums
 * are libxxhash's XXH3_64bits of the header (checksum zeroed) and payload. kvq_math.h conversions appear only
 * to express "fp16(x)" in expectations; they have their own exhaustive tests.
 * Hostile tiles must give KVS_EFORMAT and leave the destination untouched.
 */
#include "kv_format.h"
#include "kvq.h"
#include "kvq_math.h"
#include "kvs_error.h"
#include "kvs_test.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define TILE_TEST_SEED 0x9E3779B97F4A7C15ull
#include "tile_test_util.h"

/* ---- helpers ------------------------------------------------------------------ */

static float f_of_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static float fp16_round(float x)
{
    return kvq_fp16_to_f32(kvq_f32_to_fp16(x));
}
static int same_float(float a, float b) /* bitwise, but any NaN equals any NaN */
{
    if (isnan(a) || isnan(b))
        return isnan(a) && isnan(b);
    return fbits(a) == fbits(b);
}
/* Outlier entry j of width w at p: index (w - 2 bytes LE), then fp16 LE. */
static uint32_t slot_index(const unsigned char *p, size_t w, size_t j)
{
    p += w * j;
    return w == 3 ? p[0] : (uint32_t)p[0] | (uint32_t)p[1] << 8;
}
static uint16_t slot_value(const unsigned char *p, size_t w, size_t j)
{
    p += w * j;
    return (uint16_t)(p[w - 2] | p[w - 1] << 8);
}
static uint32_t slot_empty(size_t w)
{
    return w == 3 ? 0xFFu : 0xFFFFu;
}
static void wr_slot(unsigned char *p, uint32_t index, uint16_t value) /* 3-byte entry */
{
    p[0] = (unsigned char)index;
    p[1] = (unsigned char)value;
    p[2] = (unsigned char)(value >> 8);
}

/* The stored fp16 scale of s >= 0: the smallest fp16 >= s, capped at 65504. */
static uint16_t fp16_up(float s)
{
    if (s == 0.0f)
        return 0;
    if (s >= 65504.0f)
        return 0x7BFF;
    uint16_t h = kvq_f32_to_fp16(s);
    if ((double)kvq_fp16_to_f32(h) < (double)s)
        h++;
    return h;
}

static int quant(kvs_scheme s, kvs_tile_kind kind, uint32_t T, uint32_t D, uint32_t k, uint32_t S,
                 const float *static_scales, const void *src, kvs_dtype dt, size_t stride,
                 unsigned char *out, size_t cap)
{
    kvs_tile_params p = {s, kind, T, D, k, S, static_scales, 0.0f, 0};
    char err[KVS_ERR_LEN] = "";
    int rc = kvs_tile_quantize_ref(&p, src, dt, stride, out, cap, err);
    if (rc)
        printf("\n  quantize: %s", err);
    return rc;
}

/* Expected 32-byte header, written field by field at the offsets of FORMAT.md. */
static void expect_header(unsigned char *h, unsigned scheme, unsigned kind, unsigned flags,
                          unsigned T, unsigned D, unsigned k, unsigned S, uint32_t payload,
                          const unsigned char *pay)
{
    memset(h, 0, 32);
    wr32(h + 0, 0x3154564Bu);
    h[4] = 2;
    h[5] = (unsigned char)scheme;
    h[6] = (unsigned char)kind;
    h[7] = (unsigned char)flags;
    wr16(h + 8, (uint16_t)T);
    wr16(h + 10, (uint16_t)D);
    h[12] = (unsigned char)k;
    h[13] = (unsigned char)S;
    wr32(h + 16, payload);
    /* XXH3-64 over the header (checksum bytes still zero) then the payload. */
    unsigned char *buf = malloc(32 + payload);
    memcpy(buf, h, 32);
    memcpy(buf + 32, pay, payload);
    uint64_t c = XXH3_64bits(buf, 32 + payload);
    free(buf);
    memcpy(h + 24, &c, 8);
}

static void check_bytes(const unsigned char *got, const unsigned char *want, size_t n,
                        const char *what)
{
    unsigned bad = 0;
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i] && bad++ < MAX_REPORT)
            printf("\n  %s: byte %zu got 0x%02x want 0x%02x", what, i, got[i], want[i]);
    CU_ASSERT_EQUAL(bad, 0);
}

/* ---- golden tiles, by hand -------------------------------------------------------- */

/* E4M3, K, T=4, D=2, k=1, S=1. Channel 0 over t=1..3: 1000 (outlier), -56, 7:
 * amax 56 → scale 56/448 = 0.125, codes -448 → 0xFE and 56 = 1.75·2^5 → 0x66.
 * Channel 1: -3.5, 3.5, 1.75: |−3.5| ties |3.5|, the lower index (t=1) wins;
 * amax 3.5 → scale 2^-7, codes 448 → 0x7E, 224 = 1.75·2^7 → 0x76. */
static void test_golden_k_e4m3(void)
{
    const float x[4][2] = {{1.5f, -2.0f}, {1000.0f, -3.5f}, {-56.0f, 3.5f}, {7.0f, 1.75f}};
    unsigned char want[96], got[96 + 8];
    unsigned char *p = want + 32;
    memset(want, 0, sizeof want);
    /* codes [T][D]: sink row 0 and the outliers are 0 */
    p[4] = 0xFE, p[5] = 0x7E, p[6] = 0x66, p[7] = 0x76;
    wr16(p + 16, 0x3000);                       /* fp16 0.125 */
    wr16(p + 18, 0x2000);                       /* fp16 2^-7 */
    wr_slot(p + 32, 1, 0x63D0);                 /* channel 0: t=1, fp16(1000) */
    wr_slot(p + 35, 1, 0xC300);                 /* channel 1: t=1, fp16(-3.5) */
    wr16(p + 48, 0x3E00), wr16(p + 50, 0xC000); /* sink row: 1.5, -2 */
    expect_header(want, 2, 0, 0, 4, 2, 1, 1, 64, p);

    memset(got, SENTINEL, sizeof got);
    CU_ASSERT_EQUAL_FATAL(quant(KVS_SCHEME_FP8_E4M3, KVS_TILE_K, 4, 2, 1, 1, NULL, x,
                                KVS_DTYPE_FP32, 2, got, sizeof got),
                          0);
    const kvs_tile_params tp = {KVS_SCHEME_FP8_E4M3, KVS_TILE_K, 4, 2, 1, 1, NULL, 0.0f, 0};
    CU_ASSERT_EQUAL(kvs_tile_size(&tp), 96);
    check_bytes(got, want, 96, "k_e4m3");
    CU_ASSERT(all_bytes(got + 96, 8, SENTINEL)); /* nothing past the tile */

    /* Every value of this tile survives exactly. */
    float y[4][2];
    CU_ASSERT_EQUAL_FATAL(kvs_tile_dequantize_ref(got, 96, KVS_DTYPE_FP32, y, 2, NULL), 0);
    for (int t = 0; t < 4; t++)
        for (int d = 0; d < 2; d++)
            CU_ASSERT_EQUAL(fbits(y[t][d]), fbits(x[t][d]));
}

/* INT8, V, T=3, D=4, k=2, S=1. Row 1: -Inf ranks first, 50 second; the rest
 * 31.75, -0.375: scale 31.75/127 = 0.25, codes 127 and rint(-1.5) = -2 (half to
 * even). Row 2: NaN ranks last, so 1.0 and -0.625 are the outliers; the rest
 * (NaN, 0) has amax 0 → scale 0, codes 0 (INT8 NaN → 0). */
static void test_golden_v_int8(void)
{
    const float nan = f_of_bits(0x7FC00000u);
    const float x[3][4] = {{1.0f, 2.0f, -0.5f, 65504.0f},
                           {-INFINITY, 50.0f, 31.75f, -0.375f},
                           {nan, 0.0f, 1.0f, -0.625f}};
    unsigned char want[112], got[112];
    unsigned char *p = want + 32;
    memset(want, 0, sizeof want);
    p[4 + 2] = 0x7F, p[4 + 3] = 0xFE;
    wr16(p + 16 + 2, 0x3400);                           /* row 1: fp16 0.25; rows 0 and 2: 0 */
    wr_slot(p + 32, 0xFF, 0), wr_slot(p + 35, 0xFF, 0); /* row 0 (sink): empty slots */
    wr_slot(p + 38, 0, 0xFC00);                         /* row 1: -Inf at d=0 */
    wr_slot(p + 41, 1, 0x5240);                         /* 50 at d=1 */
    wr_slot(p + 44, 2, 0x3C00);                         /* row 2: 1.0 at d=2 */
    wr_slot(p + 47, 3, 0xB900);                         /* -0.625 at d=3 */
    wr16(p + 64, 0x3C00), wr16(p + 66, 0x4000), wr16(p + 68, 0xB800), wr16(p + 70, 0x7BFF);
    expect_header(want, 4, 1, 0, 3, 4, 2, 1, 80, p);

    CU_ASSERT_EQUAL_FATAL(
        quant(KVS_SCHEME_INT8, KVS_TILE_V, 3, 4, 2, 1, NULL, x, KVS_DTYPE_FP32, 4, got, sizeof got),
        0);
    check_bytes(got, want, 112, "v_int8");

    const float back[3][4] = {{1.0f, 2.0f, -0.5f, 65504.0f},
                              {-INFINITY, 50.0f, 31.75f, -0.5f},
                              {0.0f, 0.0f, 1.0f, -0.625f}};
    float y[3][4];
    CU_ASSERT_EQUAL_FATAL(kvs_tile_dequantize_ref(got, sizeof got, KVS_DTYPE_FP32, y, 4, NULL), 0);
    for (int t = 0; t < 3; t++)
        for (int d = 0; d < 4; d++)
            CU_ASSERT_EQUAL(fbits(y[t][d]), fbits(back[t][d]));
}

/* E5M2, V, T=2, D=3, k=0, S=0: row 0 amax 56 → scale 2^-10; 57344 → 0x7B,
 * 28672 = 1.75·2^14 → 0x77, -7168 → 0xEF. Row 1 is all zeros: scale 0, zero
 * codes — the -0.0 keeps its sign (0x80), as every FP8 encode does. */
static void test_golden_v_e5m2(void)
{
    const float x[2][3] = {{56.0f, 28.0f, -7.0f}, {0.0f, -0.0f, 0.0f}};
    unsigned char want[64], got[64];
    unsigned char *p = want + 32;
    memset(want, 0, sizeof want);
    p[0] = 0x7B, p[1] = 0x77, p[2] = 0xEF, p[4] = 0x80;
    wr16(p + 16, 0x1400); /* fp16 2^-10 */
    expect_header(want, 3, 1, 0, 2, 3, 0, 0, 32, p);
    CU_ASSERT_EQUAL_FATAL(quant(KVS_SCHEME_FP8_E5M2, KVS_TILE_V, 2, 3, 0, 0, NULL, x,
                                KVS_DTYPE_FP32, 3, got, sizeof got),
                          0);
    check_bytes(got, want, 64, "v_e5m2");
    float y[2][3];
    CU_ASSERT_EQUAL_FATAL(kvs_tile_dequantize_ref(got, 64, KVS_DTYPE_FP32, y, 3, NULL), 0);
    for (int t = 0; t < 2; t++)
        for (int d = 0; d < 3; d++)
            CU_ASSERT_EQUAL(fbits(y[t][d]), fbits(x[t][d]));
}

/* fp16 scheme from a bf16 source: plain fp16 [T][D], zero padding to 16;
 * bf16 99840 is beyond fp16 and becomes +Inf, 2^-20 an fp16 subnormal. */
static void test_golden_fp16(void)
{
    const uint16_t x[3][3] = {{0x3F80, 0xC000, 0x3F00},  /* 1, -2, 0.5 */
                              {0x7F80, 0x47C3, 0x4049},  /* Inf, 99840, 3.140625 */
                              {0x8000, 0x3580, 0xBFC0}}; /* -0, 2^-20, -1.5 */
    const uint16_t h[9] = {0x3C00, 0xC000, 0x3800, 0x7C00, 0x7C00, 0x4248, 0x8000, 0x0010, 0xBE00};
    unsigned char want[64], got[64];
    memset(want, 0, sizeof want);
    for (int i = 0; i < 9; i++)
        wr16(want + 32 + 2 * i, h[i]);
    expect_header(want, 1, 0, 0, 3, 3, 0, 0, 32, want + 32);
    CU_ASSERT_EQUAL_FATAL(
        quant(KVS_SCHEME_FP16, KVS_TILE_K, 3, 3, 0, 0, NULL, x, KVS_DTYPE_BF16, 3, got, sizeof got),
        0);
    check_bytes(got, want, 64, "fp16");
    uint16_t y[3][3];
    CU_ASSERT_EQUAL_FATAL(kvs_tile_dequantize_ref(got, 64, KVS_DTYPE_FP16, y, 3, NULL), 0);
    CU_ASSERT_EQUAL(memcmp(y, h, sizeof y), 0);
}

/* ---- random round trips ---------------------------------------------------------- */

static int cmp_rank(const float *x, int a, int b) /* <0 when a ranks before b */
{
    double ka = isnan(x[a]) ? -1.0 : fabs((double)x[a]); /* Inf > every finite */
    double kb = isnan(x[b]) ? -1.0 : fabs((double)x[b]);
    if (ka != kb)
        return ka > kb ? -1 : 1;
    return a - b;
}

/* The k highest-ranked indices of x[0..n), by insertion sort. */
static int ranks(const float *x, int n, int k, int *idx)
{
    int *o = malloc(sizeof(int) * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) {
        int j = i;
        while (j > 0 && cmp_rank(x, i, o[j - 1]) < 0) {
            o[j] = o[j - 1];
            j--;
        }
        o[j] = i;
    }
    int m = k < n ? k : n;
    memcpy(idx, o, sizeof(int) * (size_t)m);
    free(o);
    return m;
}

static double qmax_of(kvs_scheme s)
{
    return s == KVS_SCHEME_INT8 ? 127.0 : s == KVS_SCHEME_FP8_E4M3 ? 448.0 : 57344.0;
}

/* Bound on |x - x'| for a non-outlier of a group with the given scale: half a
 * unit in the last place of the code at y = |x|/scale (mantissa bits m, min
 * normal 2^emin; INT8: 0.5), times scale, plus the three fp32 roundings
 * (reciprocal, product, decode product) relative to |x|. */
static double bound(kvs_scheme s, double x, double scale)
{
    double y = fabs(x) / scale, half;
    if (s == KVS_SCHEME_INT8)
        half = 0.5;
    else {
        int m = s == KVS_SCHEME_FP8_E4M3 ? 3 : 2, emin = s == KVS_SCHEME_FP8_E4M3 ? -6 : -14;
        half = fmax(y * ldexp(1.0, -(m + 1)), ldexp(1.0, emin - m - 1));
    }
    return half * scale + fabs(x) * ldexp(1.0, -21);
}

typedef struct rt_stats {
    unsigned tiles, bad;
} rt_stats;

#define BAD(...)                                                                                   \
    do {                                                                                           \
        if (st->bad++ < MAX_REPORT) {                                                              \
            printf("\n  s%d kind%d T%u D%u k%u S%u dt%d: ", (int)s, (int)kind, T, D, k, S,         \
                   (int)dt);                                                                       \
            printf(__VA_ARGS__);                                                                   \
        }                                                                                          \
    } while (0)

/* Encodes x (fp32 values exactly representable in dt) from a dt view, and
 * checks every byte of the tile and the decoded values against the rule. */
static void roundtrip_one(kvs_scheme s, kvs_tile_kind kind, uint32_t T, uint32_t D, uint32_t k,
                          uint32_t S, kvs_dtype dt, const float *x, rt_stats *st)
{
    size_t es = dt == KVS_DTYPE_FP32 ? 4 : 2;
    unsigned char *src = malloc(es * T * D);
    for (size_t i = 0; i < (size_t)T * D; i++) {
        if (dt == KVS_DTYPE_FP32)
            memcpy(src + 4 * i, &x[i], 4);
        else
            wr16(src + 2 * i, dt == KVS_DTYPE_FP16 ? kvq_f32_to_fp16(x[i]) : kvq_f32_to_bf16(x[i]));
    }
    lay l = layout(s, kind, T, D, k, S);
    size_t size = 32 + l.payload;
    unsigned char *tile = malloc(size);
    kvs_tile_params p = {s, kind, T, D, k, S, NULL, 0.0f, 0};
    st->tiles++;
    if (kvs_tile_size(&p) != size)
        BAD("size %zu want %zu", kvs_tile_size(&p), size);
    if (quant(s, kind, T, D, k, S, NULL, src, dt, D, tile, size) != 0) {
        BAD("quantize failed");
        goto out;
    }
    const unsigned char *pay = tile + 32;
    unsigned char hdr[32];
    expect_header(hdr, s, kind, 0, T, D, k, S, (uint32_t)l.payload, pay);
    if (memcmp(hdr, tile, 32) != 0)
        BAD("header differs");

    float *y = malloc(sizeof(float) * T * D);
    if (kvs_tile_dequantize_ref(tile, size, KVS_DTYPE_FP32, y, D, NULL) != 0) {
        BAD("dequantize failed");
        free(y);
        goto out;
    }
    if (s == KVS_SCHEME_FP16) {
        for (size_t i = 0; i < (size_t)T * D; i++) {
            if (rd16(pay + 2 * i) != kvq_f32_to_fp16(x[i]) || !same_float(y[i], fp16_round(x[i])))
                BAD("fp16 element %zu", i);
        }
        if (!all_bytes(pay + 2 * T * D, l.payload - 2 * T * D, 0))
            BAD("fp16 padding not zero");
        free(y);
        goto out;
    }

    /* Zero gaps and tail. */
    if (!all_bytes(pay + T * D, l.scales - T * D, 0) ||
        !all_bytes(pay + l.scales + 2 * l.groups, l.outliers - l.scales - 2 * l.groups, 0) ||
        !all_bytes(pay + l.outliers + l.w * l.groups * k, l.sinks - l.outliers - l.w * l.groups * k,
                   0) ||
        !all_bytes(pay + l.sinks + 2 * S * D, l.payload - l.sinks - 2 * S * D, 0))
        BAD("gap or tail not zero");

    /* Sinks: fp16 values stored, decoded exactly, codes 0. */
    for (uint32_t t = 0; t < S; t++)
        for (uint32_t d = 0; d < D; d++) {
            size_t i = (size_t)t * D + d;
            if (rd16(pay + l.sinks + 2 * i) != kvq_f32_to_fp16(x[i]) ||
                !same_float(y[i], fp16_round(x[i])) || pay[i] != 0)
                BAD("sink t%u d%u", t, d);
        }

    unsigned char *is_out = calloc((size_t)T * D, 1);
    float *grp = malloc(sizeof(float) * (T > D ? T : D));
    int *idx = malloc(sizeof(int) * (k ? k : 1));
    for (uint32_t g = 0; g < l.groups; g++) {
        const unsigned char *slots = pay + l.outliers + l.w * (size_t)g * k;
        const uint16_t scale16 = rd16(pay + l.scales + 2 * g);
        double scale = kvq_fp16_to_f32(scale16);
        if (kind == KVS_TILE_V && g < S) { /* a V sink row */
            if (scale16 != 0)
                BAD("sink row %u scale %g", g, scale);
            for (uint32_t j = 0; j < k; j++)
                if (slot_index(slots, l.w, j) != slot_empty(l.w) || slot_value(slots, l.w, j) != 0)
                    BAD("sink row %u slot %u not empty", g, j);
            continue;
        }
        uint32_t first = kind == KVS_TILE_K ? S : 0, n = kind == KVS_TILE_K ? T - S : D;
        for (uint32_t i = 0; i < n; i++)
            grp[i] = kind == KVS_TILE_K ? x[(size_t)(first + i) * D + g] : x[(size_t)g * D + i];
        int got = ranks(grp, (int)n, (int)k, idx);
        for (uint32_t j = 0; j < k; j++) {
            uint32_t si = slot_index(slots, l.w, j);
            uint16_t sv = slot_value(slots, l.w, j);
            if ((int)j >= got) {
                if (si != slot_empty(l.w) || sv != 0)
                    BAD("group %u slot %u should be empty", g, j);
                continue;
            }
            uint32_t want_i = first + (uint32_t)idx[j];
            if (si != want_i || sv != kvq_f32_to_fp16(grp[idx[j]]))
                BAD("group %u slot %u: (%u, 0x%04x) want (%u, 0x%04x)", g, j, si, sv, want_i,
                    kvq_f32_to_fp16(grp[idx[j]]));
            size_t e = kind == KVS_TILE_K ? (size_t)want_i * D + g : (size_t)g * D + want_i;
            is_out[e] = 1;
            if (pay[e] != 0 || !same_float(y[e], fp16_round(x[e])))
                BAD("outlier element %zu", e);
        }
        /* scale = amax / qmax over the finite non-outliers, floored at FLT_MIN,
         * stored as the smallest fp16 >= it */
        double amax = 0;
        for (uint32_t i = 0; i < n; i++) {
            size_t e = kind == KVS_TILE_K ? (size_t)(first + i) * D + g : (size_t)g * D + i;
            if (!is_out[e] && isfinite(x[e]))
                amax = fmax(amax, fabs((double)x[e]));
        }
        float want_scale = amax > 0 ? (float)amax / (float)qmax_of(s) : 0.0f;
        if (amax > 0 && want_scale < FLT_MIN)
            want_scale = FLT_MIN;
        if (scale16 != fp16_up(want_scale))
            BAD("group %u scale %a want fp16 >= %a", g, scale, (double)want_scale);
        for (uint32_t i = 0; i < n; i++) {
            size_t e = kind == KVS_TILE_K ? (size_t)(first + i) * D + g : (size_t)g * D + i;
            if (is_out[e])
                continue;
            double err = fabs((double)x[e] - (double)y[e]);
            if (scale == 0.0 ? y[e] != 0.0f : !(err <= bound(s, x[e], scale)))
                BAD("group %u elem %zu: x %a x' %a scale %a", g, e, (double)x[e], (double)y[e],
                    scale);
        }
    }
    /* The other destination dtypes are the fp32 decode, converted. */
    uint16_t *y16 = malloc(2 * (size_t)T * D);
    if (kvs_tile_dequantize_ref(tile, size, KVS_DTYPE_FP16, y16, D, NULL) != 0)
        BAD("fp16 decode failed");
    for (size_t i = 0; i < (size_t)T * D; i++)
        if (y16[i] != kvq_f32_to_fp16(y[i]))
            BAD("fp16 decode %zu", i);
    if (kvs_tile_dequantize_ref(tile, size, KVS_DTYPE_BF16, y16, D, NULL) != 0)
        BAD("bf16 decode failed");
    for (size_t i = 0; i < (size_t)T * D; i++)
        if (y16[i] != kvq_f32_to_bf16(y[i]))
            BAD("bf16 decode %zu", i);
    free(y16);
    free(is_out);
    free(grp);
    free(idx);
    free(y);
out:
    free(tile);
    free(src);
}

/* Random values exactly representable in dt: gaussian bulk, per-channel
 * offsets (key outliers live in fixed channels), and rare large spikes. */
static void fill_random(float *x, uint32_t T, uint32_t D, kvs_dtype dt)
{
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t d = 0; d < D; d++) {
            float v = gauss() * (d % 7 == 3 ? 20.0f : 1.0f);
            if (rnd() % 50 == 0)
                v *= 40.0f;
            if (rnd() % 97 == 0)
                v = 0.0f;
            if (dt == KVS_DTYPE_FP16)
                v = kvq_fp16_to_f32(kvq_f32_to_fp16(v));
            else if (dt == KVS_DTYPE_BF16)
                v = kvq_bf16_to_f32(kvq_f32_to_bf16(v));
            x[(size_t)t * D + d] = v;
        }
}

static void test_roundtrip_random(void)
{
    static const uint32_t shapes[][2] = {{1, 1}, {7, 5}, {16, 8}, {33, 64}, {64, 17}};
    static const uint32_t ks[] = {0, 1, 3};
    static const uint32_t ss[] = {0, 2};
    rt_stats st = {0, 0};
    for (int si = 1; si <= 4; si++)
        for (int kind = 0; kind < 2; kind++)
            for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
                for (int dt = 1; dt <= 3; dt++)
                    for (size_t ki = 0; ki < 3; ki++)
                        for (size_t sj = 0; sj < 2; sj++) {
                            uint32_t T = shapes[sh][0], D = shapes[sh][1];
                            uint32_t k = ks[ki], S = ss[sj];
                            if (si == KVS_SCHEME_FP16 && (k || S))
                                continue;
                            if (S > T)
                                continue;
                            float *x = malloc(sizeof(float) * T * D);
                            fill_random(x, T, D, (kvs_dtype)dt);
                            roundtrip_one((kvs_scheme)si, (kvs_tile_kind)kind, T, D, k, S,
                                          (kvs_dtype)dt, x, &st);
                            free(x);
                        }
    CU_ASSERT(st.tiles > 300);
    CU_ASSERT_EQUAL(st.bad, 0);
}

/* The same values from fp16, bf16 and fp32 views give the same tile. */
static void test_src_dtypes_agree(void)
{
    enum { T = 16, D = 12 };
    float x[T * D];
    uint16_t h[T * D], b[T * D];
    for (int i = 0; i < T * D; i++) {
        /* 8 significant bits and a small exponent: exact in all three. */
        x[i] = (float)((int)(rnd() % 511) - 255) / 32.0f;
        h[i] = kvq_f32_to_fp16(x[i]);
        b[i] = kvq_f32_to_bf16(x[i]);
        CU_ASSERT_EQUAL(kvq_fp16_to_f32(h[i]), x[i]);
        CU_ASSERT_EQUAL(kvq_bf16_to_f32(b[i]), x[i]);
    }
    for (int si = 1; si <= 4; si++)
        for (int kind = 0; kind < 2; kind++) {
            uint32_t k = si == 1 ? 0 : 2, S = si == 1 ? 0 : 3;
            size_t n = 32 + layout((kvs_scheme)si, (kvs_tile_kind)kind, T, D, k, S).payload;
            unsigned char t32[1024], t16[1024], tb[1024];
            CU_ASSERT_FATAL(n <= sizeof t32);
            CU_ASSERT_EQUAL(quant((kvs_scheme)si, (kvs_tile_kind)kind, T, D, k, S, NULL, x,
                                  KVS_DTYPE_FP32, D, t32, n),
                            0);
            CU_ASSERT_EQUAL(quant((kvs_scheme)si, (kvs_tile_kind)kind, T, D, k, S, NULL, h,
                                  KVS_DTYPE_FP16, D, t16, n),
                            0);
            CU_ASSERT_EQUAL(quant((kvs_scheme)si, (kvs_tile_kind)kind, T, D, k, S, NULL, b,
                                  KVS_DTYPE_BF16, D, tb, n),
                            0);
            CU_ASSERT_EQUAL(memcmp(t32, t16, n), 0);
            CU_ASSERT_EQUAL(memcmp(t32, tb, n), 0);
        }
}

/* Views with stride > D: the gap is never read (NaN there changes nothing) on
 * the way in and never written on the way out. */
static void test_strides(void)
{
    enum { T = 9, D = 6, SI = 11, SO = 8 };
    float packed[T * D], strided[T * SI], y[T * SO];
    for (int t = 0; t < T; t++)
        for (int d = 0; d < SI; d++) {
            float v = gauss();
            if (d < D)
                packed[t * D + d] = v;
            strided[t * SI + d] = d < D ? v : NAN;
        }
    for (int si = 1; si <= 4; si++)
        for (int kind = 0; kind < 2; kind++) {
            uint32_t k = si == 1 ? 0 : 1, S = si == 1 ? 0 : 2;
            size_t n = 32 + layout((kvs_scheme)si, (kvs_tile_kind)kind, T, D, k, S).payload;
            unsigned char a[512], b[512];
            CU_ASSERT_FATAL(n <= sizeof a);
            CU_ASSERT_EQUAL(quant((kvs_scheme)si, (kvs_tile_kind)kind, T, D, k, S, NULL, packed,
                                  KVS_DTYPE_FP32, D, a, n),
                            0);
            CU_ASSERT_EQUAL(quant((kvs_scheme)si, (kvs_tile_kind)kind, T, D, k, S, NULL, strided,
                                  KVS_DTYPE_FP32, SI, b, n),
                            0);
            CU_ASSERT_EQUAL(memcmp(a, b, n), 0);

            float yp[T * D];
            memset(y, SENTINEL, sizeof y);
            CU_ASSERT_EQUAL(kvs_tile_dequantize_ref(a, n, KVS_DTYPE_FP32, yp, D, NULL), 0);
            CU_ASSERT_EQUAL(kvs_tile_dequantize_ref(a, n, KVS_DTYPE_FP32, y, SO, NULL), 0);
            for (int t = 0; t < T; t++) {
                CU_ASSERT_EQUAL(memcmp(&y[t * SO], &yp[t * D], sizeof(float) * D), 0);
                CU_ASSERT(
                    all_bytes((unsigned char *)&y[t * SO + D], sizeof(float) * (SO - D), SENTINEL));
            }
        }
}

/* Static scales: the flag is set, the given scales are stored, values beyond
 * scale·qmax saturate, and outliers are still taken out first. */
static void test_static_scales(void)
{
    /* K, E4M3, T=4, D=2, k=1, S=0. Channel 0 with static scale 0.5 (range
     * ±224): 1000 is the outlier, 300 saturates to 0x7E (448·0.5 = 224), -1.5
     * → -3 = 1.5·2^1 → 0xC4, 0.75 → 1.5 → 1.5·2^0 → 0x3C. Channel 1 with static
     * scale 0: -5 is the outlier, the rest give ±0 codes (x·0). */
    const float x[4][2] = {{300.0f, 1.0f}, {1000.0f, -5.0f}, {-1.5f, 2.0f}, {0.75f, -3.0f}};
    const float sc[2] = {0.5f, 0.0f};
    unsigned char want[96], got[96];
    unsigned char *p = want + 32;
    memset(want, 0, sizeof want);
    p[0] = 0x7E, p[4] = 0xC4, p[6] = 0x3C;
    p[1] = 0x00, p[5] = 0x00, p[7] = 0x80; /* 1·0 = 0, 2·0 = 0, -3·0 = -0 */
    wr16(p + 16, 0x3800);                  /* fp16 0.5 */
    wr16(p + 18, 0);
    wr_slot(p + 32, 1, 0x63D0);
    wr_slot(p + 35, 1, 0xC500); /* fp16(-5) */
    expect_header(want, 2, 0, 1, 4, 2, 1, 0, 48, p);
    CU_ASSERT_EQUAL_FATAL(
        quant(KVS_SCHEME_FP8_E4M3, KVS_TILE_K, 4, 2, 1, 0, sc, x, KVS_DTYPE_FP32, 2, got, 80), 0);
    check_bytes(got, want, 80, "static");
    float y[4][2];
    CU_ASSERT_EQUAL_FATAL(kvs_tile_dequantize_ref(got, 80, KVS_DTYPE_FP32, y, 2, NULL), 0);
    CU_ASSERT_EQUAL(y[0][0], 224.0f); /* saturated */
    CU_ASSERT_EQUAL(y[1][0], 1000.0f);
    CU_ASSERT_EQUAL(y[2][0], -1.5f);
    CU_ASSERT_EQUAL(y[3][0], 0.75f);
    CU_ASSERT_EQUAL(y[0][1], 0.0f);
    CU_ASSERT_EQUAL(y[1][1], -5.0f);

    /* INT8 V row with static scale 1: 300 → 127, -1000 → -127. */
    const float v[1][4] = {{300.0f, -1000.0f, 2.5f, -3.5f}};
    const float one = 1.0f;
    unsigned char t2[64];
    CU_ASSERT_EQUAL_FATAL(
        quant(KVS_SCHEME_INT8, KVS_TILE_V, 1, 4, 0, 0, &one, v, KVS_DTYPE_FP32, 4, t2, sizeof t2),
        0);
    CU_ASSERT_EQUAL(t2[7], 1); /* flags */
    CU_ASSERT_EQUAL(t2[32], 127);
    CU_ASSERT_EQUAL(t2[33], 0x81);
    CU_ASSERT_EQUAL(t2[34], 2);    /* rint(2.5) = 2, half to even */
    CU_ASSERT_EQUAL(t2[35], 0xFC); /* rint(-3.5) = -4 */
    CU_ASSERT_EQUAL(rd16(t2 + 32 + 16), 0x3C00u);
}

/* ---- parameter errors ------------------------------------------------------------ */

static void expect_einval(const kvs_tile_params *p, const void *src, kvs_dtype dt, size_t stride,
                          size_t cap, const char *field)
{
    unsigned char out[256];
    float src_buf[64] = {0};
    char err[KVS_ERR_LEN] = "";
    memset(out, SENTINEL, sizeof out);
    int rc = kvs_tile_quantize_ref(p, src == (void *)1 ? src_buf : src, dt, stride,
                                   cap ? out : NULL, cap, err);
    CU_ASSERT_EQUAL(rc, KVS_EINVAL);
    if (strstr(err, field) == NULL)
        printf("\n  error \"%s\" does not name \"%s\"", err, field);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, field));
    CU_ASSERT(all_bytes(out, sizeof out, SENTINEL));
}

static void test_param_errors(void)
{
    const void *ok = (void *)1; /* expect_einval substitutes a real buffer */
    kvs_tile_params base = {KVS_SCHEME_INT8, KVS_TILE_K, 4, 4, 1, 1, NULL, 0.0f, 0}, p;
    char err[KVS_ERR_LEN];
    CU_ASSERT_EQUAL(kvs_tile_params_check(&base, err), 0);
    CU_ASSERT_EQUAL(kvs_tile_params_check(NULL, err), KVS_EINVAL);

    p = base, p.scheme = (kvs_scheme)0;
    expect_einval(&p, ok, KVS_DTYPE_FP32, 4, 256, "scheme");
    p = base, p.scheme = (kvs_scheme)5;
    expect_einval(&p, ok, KVS_DTYPE_FP32, 4, 256, "scheme");
    p = base, p.kind = (kvs_tile_kind)2;
    expect_einval(&p, ok, KVS_DTYPE_FP32, 4, 256, "kind");
    p = base, p.tokens = 0;
    expect_einval(&p, ok, KVS_DTYPE_FP32, 4, 256, "tokens");
    p = base, p.tokens = 1025;
    expect_einval(&p, ok, KVS_DTYPE_FP32, 4, 256, "tokens");
    p = base, p.dim = 0;
    expect_einval(&p, ok, KVS_DTYPE_FP32, 4, 256, "dim");
    p = base, p.dim = 1025;
    expect_einval(&p, ok, KVS_DTYPE_FP32, 1025, 256, "dim");
    p = base, p.outliers = 17;
    expect_einval(&p, ok, KVS_DTYPE_FP32, 4, 256, "outliers");
    p = base, p.sinks = 5; /* > T */
    expect_einval(&p, ok, KVS_DTYPE_FP32, 4, 256, "sinks");
    p = base, p.tokens = 100, p.sinks = 65;
    expect_einval(&p, ok, KVS_DTYPE_FP32, 4, 256, "sinks");
    p = base, p.scheme = KVS_SCHEME_FP16, p.sinks = 0;
    expect_einval(&p, ok, KVS_DTYPE_FP32, 4, 256, "outliers");
    p = base, p.scheme = KVS_SCHEME_FP16, p.outliers = 0;
    expect_einval(&p, ok, KVS_DTYPE_FP32, 4, 256, "sinks");
    const float bad_scales[][4] = {{1, 1, -1, 1}, {1, NAN, 1, 1}, {1, 1, 1, INFINITY}};
    for (int i = 0; i < 3; i++) {
        p = base, p.static_scales = bad_scales[i];
        char want[32];
        snprintf(want, sizeof want, "static_scales[%d]", i == 0 ? 2 : i == 1 ? 1 : 3);
        expect_einval(&p, ok, KVS_DTYPE_FP32, 4, 256, want);
    }
    /* The view and the output. */
    expect_einval(&base, NULL, KVS_DTYPE_FP32, 4, 256, "src");
    expect_einval(&base, ok, (kvs_dtype)0, 4, 256, "dtype");
    expect_einval(&base, ok, (kvs_dtype)4, 4, 256, "dtype");
    expect_einval(&base, ok, KVS_DTYPE_FP32, 3, 256, "stride");
    expect_einval(&base, ok, KVS_DTYPE_FP32, 4, 0, "out"); /* out NULL */
    size_t need = kvs_tile_size(&base);
    CU_ASSERT_EQUAL(need, 32 + 16 + 16 + 16 + 16);
    expect_einval(&base, ok, KVS_DTYPE_FP32, 4, need - 1, "needs");

    /* Dequantize: the destination view. */
    unsigned char tile[128];
    float src[16] = {1, 2, 3, 4}, dst[16];
    CU_ASSERT_EQUAL_FATAL(quant(KVS_SCHEME_INT8, KVS_TILE_K, 4, 4, 1, 1, NULL, src, KVS_DTYPE_FP32,
                                4, tile, sizeof tile),
                          0);
    memset(dst, SENTINEL, sizeof dst);
    CU_ASSERT_EQUAL(kvs_tile_dequantize_ref(tile, need, KVS_DTYPE_FP32, dst, 3, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "stride"));
    CU_ASSERT_EQUAL(kvs_tile_dequantize_ref(tile, need, (kvs_dtype)9, dst, 4, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "dtype"));
    CU_ASSERT_EQUAL(kvs_tile_dequantize_ref(tile, need, KVS_DTYPE_FP32, NULL, 4, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "dst"));
    CU_ASSERT(all_bytes((unsigned char *)dst, sizeof dst, SENTINEL));
}

/* ---- hostile tiles ----------------------------------------------------------------- */

/* Checks that bytes of len fail kvs_tile_check and kvs_tile_dequantize_ref
 * with KVS_EFORMAT, the latter without writing to its destination; returns 1
 * when they do. */
static int rejected(const unsigned char *tile, size_t len, const char *want_in_err)
{
    static float dst[64 * 64];
    char err[KVS_ERR_LEN] = "";
    int ok = 1;
    if (kvs_tile_check(tile, len, NULL, err) != KVS_EFORMAT)
        ok = 0;
    if (ok && want_in_err && strstr(err, want_in_err) == NULL) {
        printf("\n  error \"%s\" lacks \"%s\"", err, want_in_err);
        ok = 0;
    }
    memset(dst, SENTINEL, sizeof dst);
    if (kvs_tile_dequantize_ref(tile, len, KVS_DTYPE_FP32, dst, 64, NULL) != KVS_EFORMAT)
        ok = 0;
    if (!all_bytes((unsigned char *)dst, sizeof dst, SENTINEL))
        ok = 0;
    return ok;
}

/* A small valid tile of each 8-bit kind to mutate: E4M3 K, T=4, D=2, k=1,
 * S=1 (96 bytes, the golden tile), and INT8 V, T=3, D=4, k=2, S=1. */
static size_t small_k(unsigned char *t)
{
    const float x[4][2] = {{1.5f, -2.0f}, {1000.0f, -3.5f}, {-56.0f, 3.5f}, {7.0f, 1.75f}};
    CU_ASSERT_EQUAL(
        quant(KVS_SCHEME_FP8_E4M3, KVS_TILE_K, 4, 2, 1, 1, NULL, x, KVS_DTYPE_FP32, 2, t, 96), 0);
    return 96;
}
static size_t small_v(unsigned char *t)
{
    const float x[3][4] = {{1, 2, 3, 4}, {5, -60, 7, 0.5f}, {9, 10, -110, 12}};
    CU_ASSERT_EQUAL(
        quant(KVS_SCHEME_INT8, KVS_TILE_V, 3, 4, 2, 1, NULL, x, KVS_DTYPE_FP32, 4, t, 112), 0);
    return 112;
}

static void test_hostile_header_fields(void)
{
    unsigned char good[96], t[96];
    size_t n = small_k(good);
    CU_ASSERT_EQUAL_FATAL(kvs_tile_check(good, n, NULL, NULL), 0);
    struct {
        size_t off, width;
        uint32_t value;
        const char *why;
    } cases[] = {
        {0, 4, 0x3154564Cu, "magic"},
        {0, 4, 0, "magic"},
        {4, 1, 0, "version"},
        {4, 1, 1, "version"}, /* the v1 format (fp32 scales, 4-byte outliers) */
        {4, 1, 3, "version"},
        {5, 1, 0, "scheme"},
        {5, 1, 5, "scheme"},
        {5, 1, 255, "scheme"},
        {6, 1, 2, "kind"},
        {7, 1, 0x04, "flags"},
        {7, 1, 0x80, "flags"},
        {8, 2, 0, "tokens"},
        {8, 2, 1025, "tokens"},
        {8, 2, 0xFFFF, "tokens"},
        {10, 2, 0, "dim"},
        {10, 2, 1025, "dim"},
        {12, 1, 17, "outliers"},
        {12, 1, 255, "outliers"},
        {13, 1, 5, "sinks"}, /* S > T = 4 */
        {13, 1, 65, "sinks"},
        {14, 2, 1, "reserved"},
        {20, 4, 0x80000000u, "reserved"},
        {16, 4, 48, "payload_bytes"},
        {16, 4, 80, "payload_bytes"},
        {16, 4, 0xFFFFFFF0u, "payload_bytes"},
        {24, 4, 0x12345678u, "checksum"},
        {1, 1, 0, "magic"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(t, good, n);
        if (cases[i].width == 1)
            t[cases[i].off] = (unsigned char)cases[i].value;
        else if (cases[i].width == 2)
            wr16(t + cases[i].off, (uint16_t)cases[i].value);
        else
            wr32(t + cases[i].off, cases[i].value);
        if (!rejected(t, n, cases[i].why)) {
            printf("\n  header case %zu (%s) accepted", i, cases[i].why);
            CU_FAIL("hostile header accepted");
        }
    }
    /* An fp16 tile that claims outliers or sinks. */
    const float x[4] = {1, 2, 3, 4};
    unsigned char f[64];
    CU_ASSERT_EQUAL_FATAL(
        quant(KVS_SCHEME_FP16, KVS_TILE_V, 2, 2, 0, 0, NULL, x, KVS_DTYPE_FP32, 2, f, sizeof f), 0);
    CU_ASSERT_EQUAL(kvs_tile_check(f, 48, NULL, NULL), 0);
    f[12] = 1;
    CU_ASSERT(rejected(f, 48, "fp16"));
    f[12] = 0, f[13] = 1;
    CU_ASSERT(rejected(f, 48, "fp16"));
    CU_ASSERT(rejected(NULL, 0, NULL));
}

static void test_truncation(void)
{
    unsigned char t[112];
    size_t n = small_k(t);
    unsigned bad = 0;
    for (size_t len = 0; len < n; len++)
        if (!rejected(t, len, NULL) && bad++ < MAX_REPORT)
            printf("\n  K tile truncated to %zu accepted", len);
    n = small_v(t);
    for (size_t len = 0; len < n; len++)
        if (!rejected(t, len, NULL) && bad++ < MAX_REPORT)
            printf("\n  V tile truncated to %zu accepted", len);
    CU_ASSERT_EQUAL(bad, 0);
    /* Trailing bytes beyond the tile are not part of it. */
    unsigned char big[200];
    memset(big, 0x77, sizeof big);
    memcpy(big, t, n);
    CU_ASSERT_EQUAL(kvs_tile_check(big, sizeof big, NULL, NULL), 0);
}

/* Every single-bit flip of a tile. The checksum covers the header (its own
 * field zeroed) and the payload, so every flip must be rejected — including
 * those that turn the header into another valid header of the same payload
 * size (the STATIC flag, E4M3 <-> E5M2, K <-> V on fp16), which a payload-only
 * checksum let through. Returns the accepted flips as a bitmap of (byte, bit)
 * over the header. */
static void flips(kvs_scheme s, uint32_t k, uint32_t S, uint64_t accepted_header[32])
{
    enum { T = 16, D = 32 };
    float x[T * D];
    for (int i = 0; i < T * D; i++)
        x[i] = gauss();
    size_t n = 32 + layout(s, KVS_TILE_K, T, D, k, S).payload;
    unsigned char *good = malloc(n), *t = malloc(n);
    CU_ASSERT_EQUAL_FATAL(quant(s, KVS_TILE_K, T, D, k, S, NULL, x, KVS_DTYPE_FP32, D, good, n), 0);
    memset(accepted_header, 0, 32 * sizeof accepted_header[0]);
    unsigned payload_accepted = 0;
    for (size_t byte = 0; byte < n; byte++)
        for (int bit = 0; bit < 8; bit++) {
            memcpy(t, good, n);
            t[byte] ^= (unsigned char)(1u << bit);
            if (rejected(t, n, NULL))
                continue;
            if (byte < 32)
                accepted_header[byte] |= 1u << bit;
            else
                payload_accepted++;
        }
    CU_ASSERT_EQUAL(payload_accepted, 0);
    free(good);
    free(t);
}

static void test_bit_flips(void)
{
    uint64_t acc[32];
    static const struct {
        kvs_scheme s;
        uint32_t k, S;
    } cases[] = {{KVS_SCHEME_INT8, 1, 1},
                 {KVS_SCHEME_FP8_E4M3, 2, 3},
                 {KVS_SCHEME_FP8_E5M2, 0, 0},
                 {KVS_SCHEME_FP16, 0, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        flips(cases[i].s, cases[i].k, cases[i].S, acc);
        for (int b = 0; b < 32; b++)
            CU_ASSERT_EQUAL(acc[b], 0u);
    }
}

/* Outlier indices that no encoder writes, with a correct checksum (forged with
 * kvs_tile_seal): out of range, in the K sink rows, or in a V sink row. */
static void test_forged_outliers(void)
{
    unsigned char t[112];
    char err[KVS_ERR_LEN];
    size_t n = small_k(t); /* K: T=4, S=1; slot 0 of channel 0 at payload 32 */
    unsigned char *slot = t + 32 + 32; /* 3-byte entries: index byte, fp16 */
    CU_ASSERT_EQUAL(slot[0], 1);
    static const uint8_t bad_k[] = {0 /* a sink row */, 4, 5, 0xFE};
    for (size_t i = 0; i < sizeof bad_k / sizeof bad_k[0]; i++) {
        small_k(t);
        slot[0] = bad_k[i];
        CU_ASSERT_EQUAL(kvs_tile_seal(t, n, err), 0);
        CU_ASSERT(rejected(t, n, "outlier"));
    }
    /* The same forgery with an in-range index passes: the check is the index. */
    small_k(t);
    slot[0] = 3;
    CU_ASSERT_EQUAL(kvs_tile_seal(t, n, err), 0);
    CU_ASSERT_EQUAL(kvs_tile_check(t, n, NULL, err), 0);
    /* An empty slot (index 0xFF, out of range here) may sit anywhere. */
    slot[0] = 0xFF;
    slot[1] = slot[2] = 0;
    CU_ASSERT_EQUAL(kvs_tile_seal(t, n, err), 0);
    CU_ASSERT_EQUAL(kvs_tile_check(t, n, NULL, err), 0);

    n = small_v(t); /* V: T=3, D=4, k=2, S=1; outliers at payload 32, row-major */
    unsigned char *row0 = t + 32 + 32, *row1 = row0 + 6;
    CU_ASSERT_EQUAL(row0[0], 0xFF);
    CU_ASSERT_EQUAL(row1[0], 1); /* -60 at d=1 */
    small_v(t);
    row0[3] = 2; /* an outlier in sink row 0, index in range */
    CU_ASSERT_EQUAL(kvs_tile_seal(t, n, err), 0);
    CU_ASSERT(rejected(t, n, "sink"));
    small_v(t);
    row0[3] = 0xFE; /* out of range but not the empty index, in a sink row */
    CU_ASSERT_EQUAL(kvs_tile_seal(t, n, err), 0);
    CU_ASSERT(rejected(t, n, "sink"));
    small_v(t);
    row1[0] = 4; /* d = D */
    CU_ASSERT_EQUAL(kvs_tile_seal(t, n, err), 0);
    CU_ASSERT(rejected(t, n, "out of range"));
    /* kvs_tile_seal refuses what it cannot size. */
    small_v(t);
    t[9] = 0x10; /* T = 4099 */
    CU_ASSERT_EQUAL(kvs_tile_seal(t, n, err), KVS_EFORMAT);
    CU_ASSERT_EQUAL(kvs_tile_seal(t, 31, err), KVS_EFORMAT);
}

/* ---- what docs/FORMAT.md says non-finite inputs become -------------------------------- */

static size_t v_tile(kvs_scheme s, uint32_t D, uint32_t k, const float *row, unsigned char *t,
                     size_t cap)
{
    CU_ASSERT_EQUAL(quant(s, KVS_TILE_V, 1, D, k, 0, NULL, row, KVS_DTYPE_FP32, D, t, cap), 0);
    return 32 + layout(s, KVS_TILE_V, 1, D, k, 0).payload;
}

static void test_nonfinite_doc(void)
{
    const float nan = f_of_bits(0x7FC00000u);
    const kvs_scheme q[3] = {KVS_SCHEME_FP8_E4M3, KVS_SCHEME_FP8_E5M2, KVS_SCHEME_INT8};
    const uint8_t maxc[3] = {0x7E, 0x7B, 0x7F}, negmax[3] = {0xFE, 0xFB, 0x81};
    unsigned char t[256];
    float y[8];

    for (int i = 0; i < 3; i++) {
        /* "they never poison a scale, because amax skips them" */
        const float r1[5] = {INFINITY, nan, 2.0f, -INFINITY, 1.0f};
        size_t n = v_tile(q[i], 5, 0, r1, t, sizeof t);
        lay l = layout(q[i], KVS_TILE_V, 1, 5, 0, 0);
        CU_ASSERT_EQUAL(rd16(t + 32 + l.scales), fp16_up(2.0f / (float)qmax_of(q[i])));

        /* "±Inf is ranked first among outliers, so with k >= 1 it is kept
         * exactly (fp16 ±Inf)" */
        const float r2[4] = {5.0f, -INFINITY, 1000.0f, INFINITY};
        n = v_tile(q[i], 4, 2, r2, t, sizeof t);
        l = layout(q[i], KVS_TILE_V, 1, 4, 2, 0);
        CU_ASSERT_EQUAL(slot_index(t + 32 + l.outliers, l.w, 0), 1);
        CU_ASSERT_EQUAL(slot_value(t + 32 + l.outliers, l.w, 0), 0xFC00);
        CU_ASSERT_EQUAL(slot_index(t + 32 + l.outliers, l.w, 1), 3);
        CU_ASSERT_EQUAL(slot_value(t + 32 + l.outliers, l.w, 1), 0x7C00);
        CU_ASSERT_EQUAL_FATAL(kvs_tile_dequantize_ref(t, n, KVS_DTYPE_FP32, y, 4, NULL), 0);
        CU_ASSERT(y[1] == -INFINITY && y[3] == INFINITY);

        /* "Beyond the k slots, ±Inf encodes as ±max (FP8) or ±127 (INT8)":
         * in a group with a positive scale ... */
        const float r3[4] = {INFINITY, -INFINITY, 3.0f, -INFINITY};
        n = v_tile(q[i], 4, 1, r3, t, sizeof t);
        CU_ASSERT_EQUAL(t[32 + 0], 0); /* the outlier */
        CU_ASSERT_EQUAL(t[32 + 1], negmax[i]);
        CU_ASSERT_EQUAL(t[32 + 3], negmax[i]);
        CU_ASSERT_EQUAL_FATAL(kvs_tile_dequantize_ref(t, n, KVS_DTYPE_FP32, y, 4, NULL), 0);
        /* ±max · scale: the fp16 scale rounded up from 3/qmax (y[2] too, as
         * amax · (1/scale) rounds back to the max code) */
        const float sc3 = kvq_fp16_to_f32(fp16_up(3.0f / (float)qmax_of(q[i])));
        CU_ASSERT_EQUAL(y[1], -sc3 * (float)qmax_of(q[i]));
        CU_ASSERT(y[2] >= 3.0f && y[2] <= sc3 * (float)qmax_of(q[i]));
        /* ... and in one whose finite values are all 0 (scale 0), where the IEEE
         * product Inf · (1/scale → 0) would be NaN. */
        const float r4[4] = {INFINITY, -INFINITY, 0.0f, INFINITY};
        n = v_tile(q[i], 4, 1, r4, t, sizeof t);
        l = layout(q[i], KVS_TILE_V, 1, 4, 1, 0);
        CU_ASSERT_EQUAL(rd16(t + 32 + l.scales), 0);
        CU_ASSERT_EQUAL(t[32 + 1], negmax[i]);
        CU_ASSERT_EQUAL(t[32 + 3], maxc[i]);
        CU_ASSERT_EQUAL_FATAL(kvs_tile_dequantize_ref(t, n, KVS_DTYPE_FP32, y, 4, NULL), 0);
        CU_ASSERT(y[0] == INFINITY && y[1] == 0.0f && y[2] == 0.0f && y[3] == 0.0f);

        /* "NaN ranks last, so it is an outlier only when the group has fewer
         * than k numbers; otherwise it encodes as the FP8 NaN code 0x7F (which
         * decodes to NaN) or INT8 0." */
        const float r5[3] = {nan, 4.0f, nan};
        n = v_tile(q[i], 3, 2, r5, t, sizeof t); /* 1 number < k = 2 */
        l = layout(q[i], KVS_TILE_V, 1, 3, 2, 0);
        CU_ASSERT_EQUAL(slot_index(t + 32 + l.outliers, l.w, 0), 1);
        CU_ASSERT_EQUAL(slot_value(t + 32 + l.outliers, l.w, 0), 0x4400);
        CU_ASSERT_EQUAL(slot_index(t + 32 + l.outliers, l.w, 1), 0); /* the first NaN */
        CU_ASSERT_EQUAL(slot_value(t + 32 + l.outliers, l.w, 1) & 0x7C00, 0x7C00);
        CU_ASSERT_NOT_EQUAL(slot_value(t + 32 + l.outliers, l.w, 1) & 0x3FF, 0);
        CU_ASSERT_EQUAL(t[32 + 2], q[i] == KVS_SCHEME_INT8 ? 0 : 0x7F); /* the second NaN */
        CU_ASSERT_EQUAL_FATAL(kvs_tile_dequantize_ref(t, n, KVS_DTYPE_FP32, y, 3, NULL), 0);
        CU_ASSERT(isnan(y[0]));
        CU_ASSERT_EQUAL(y[1], 4.0f);
        CU_ASSERT(q[i] == KVS_SCHEME_INT8 ? y[2] == 0.0f : isnan(y[2]));
        const float r6[4] = {nan, 4.0f, -8.0f, 2.0f};
        n = v_tile(q[i], 4, 2, r6, t, sizeof t); /* 3 numbers >= k: NaN not an outlier */
        l = layout(q[i], KVS_TILE_V, 1, 4, 2, 0);
        CU_ASSERT_EQUAL(slot_index(t + 32 + l.outliers, l.w, 0), 2);
        CU_ASSERT_EQUAL(slot_index(t + 32 + l.outliers, l.w, 1), 1);
        CU_ASSERT_EQUAL(t[32 + 0], q[i] == KVS_SCHEME_INT8 ? 0 : 0x7F);
        CU_ASSERT_EQUAL_FATAL(kvs_tile_dequantize_ref(t, n, KVS_DTYPE_FP32, y, 4, NULL), 0);
        CU_ASSERT(q[i] == KVS_SCHEME_INT8 ? y[0] == 0.0f : isnan(y[0]));
        /* amax 2: the max code, times the stored scale (2/qmax rounded up to fp16) */
        CU_ASSERT_EQUAL(y[3], (float)qmax_of(q[i]) *
                                  kvq_fp16_to_f32(fp16_up(2.0f / (float)qmax_of(q[i]))));
        /* also in a K group (channel over tokens), where NaN ranks last too */
        const float kc[3][1] = {{nan}, {-3.0f}, {nan}};
        CU_ASSERT_EQUAL(
            quant(q[i], KVS_TILE_K, 3, 1, 1, 0, NULL, kc, KVS_DTYPE_FP32, 1, t, sizeof t), 0);
        l = layout(q[i], KVS_TILE_K, 3, 1, 1, 0);
        CU_ASSERT_EQUAL(slot_index(t + 32 + l.outliers, l.w, 0), 1);
        CU_ASSERT_EQUAL(t[32 + 0], q[i] == KVS_SCHEME_INT8 ? 0 : 0x7F);
    }

    /* "With the fp16 scheme every value goes through kvq_f32_to_fp16 unchanged
     * in kind." */
    const float r7[4] = {INFINITY, -INFINITY, nan, -nan};
    unsigned char f[64];
    CU_ASSERT_EQUAL(
        quant(KVS_SCHEME_FP16, KVS_TILE_V, 1, 4, 0, 0, NULL, r7, KVS_DTYPE_FP32, 4, f, sizeof f),
        0);
    CU_ASSERT_EQUAL(rd16(f + 32), 0x7C00);
    CU_ASSERT_EQUAL(rd16(f + 34), 0xFC00);
    CU_ASSERT_EQUAL(rd16(f + 36), 0x7E00);
    CU_ASSERT_EQUAL(rd16(f + 38), 0xFE00);
    CU_ASSERT_EQUAL_FATAL(kvs_tile_dequantize_ref(f, 48, KVS_DTYPE_FP32, y, 4, NULL), 0);
    CU_ASSERT(y[0] == INFINITY && y[1] == -INFINITY && isnan(y[2]) && isnan(y[3]));
}

/* Rule 3: "An all-zero or all-outlier group has scale 0 and all-zero codes." */
static void test_zero_and_all_outlier_groups(void)
{
    unsigned char t[256];
    const kvs_scheme q[3] = {KVS_SCHEME_FP8_E4M3, KVS_SCHEME_FP8_E5M2, KVS_SCHEME_INT8};
    for (int i = 0; i < 3; i++) {
        const float z[4] = {0, 0, 0, 0};
        v_tile(q[i], 4, 1, z, t, sizeof t);
        lay l = layout(q[i], KVS_TILE_V, 1, 4, 1, 0);
        CU_ASSERT_EQUAL(rd16(t + 32 + l.scales), 0);
        CU_ASSERT(all_bytes(t + 32, 4, 0));
        CU_ASSERT_EQUAL(slot_index(t + 32 + l.outliers, l.w, 0), 0); /* the first zero */
        const float a[3] = {5, -6, 7};
        v_tile(q[i], 3, 3, a, t, sizeof t);
        l = layout(q[i], KVS_TILE_V, 1, 3, 3, 0);
        CU_ASSERT_EQUAL(rd16(t + 32 + l.scales), 0);
        CU_ASSERT(all_bytes(t + 32, 3, 0));
        /* K group shorter than k: the slots past it stay empty */
        const float kc[3][1] = {{1}, {2}, {3}};
        CU_ASSERT_EQUAL(
            quant(q[i], KVS_TILE_K, 3, 1, 4, 1, NULL, kc, KVS_DTYPE_FP32, 1, t, sizeof t), 0);
        l = layout(q[i], KVS_TILE_K, 3, 1, 4, 1);
        CU_ASSERT_EQUAL(slot_index(t + 32 + l.outliers, l.w, 0), 2);
        CU_ASSERT_EQUAL(slot_index(t + 32 + l.outliers, l.w, 1), 1);
        CU_ASSERT_EQUAL(slot_index(t + 32 + l.outliers, l.w, 2), 0xFF);
        CU_ASSERT_EQUAL(slot_index(t + 32 + l.outliers, l.w, 3), 0xFF);
        CU_ASSERT_EQUAL(rd16(t + 32 + l.scales), 0);
        /* S = T: the K groups are empty */
        CU_ASSERT_EQUAL(
            quant(q[i], KVS_TILE_K, 3, 1, 2, 3, NULL, kc, KVS_DTYPE_FP32, 1, t, sizeof t), 0);
        l = layout(q[i], KVS_TILE_K, 3, 1, 2, 3);
        CU_ASSERT_EQUAL(slot_index(t + 32 + l.outliers, l.w, 0), 0xFF);
        CU_ASSERT_EQUAL(rd16(t + 32 + l.sinks + 4), 0x4200);
        CU_ASSERT_EQUAL(kvs_tile_check(t, 32 + l.payload, NULL, NULL), 0);
    }
}

/* tensor_scale (kvq.h): FP8 group scales become the per-tensor scale, rounded
 * up to fp16 (t16), times a power of two, at or above the group's own scale,
 * and then no element rounds worse than per-tensor FP8 with scale t16 (the
 * grids nest); the header is the same as without it (nothing records it) and
 * the decoders need nothing new. int8 and fp16 ignore it: same bytes. */
static void test_tensor_scale(void)
{
    enum { T = 64, D = 32, k = 2, S = 1 };
    static float x[T][D], y[T][D], st[T > D ? T : D];
    static unsigned char a[8192], b[8192];
    g_rng = 0x7E45u;
    float amax = 0.0f;
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t d = 0; d < D; d++) {
            /* channel and row gains over 2^-8..2^4, so group scales spread
             * over many binades below the tensor scale; fp16-exact values, so
             * outliers and sinks are exact and every element can be compared */
            float g = ldexpf(1.0f, (int)(d % 13) - 8) * (1.0f + (float)(t % 5));
            x[t][d] = kvq_fp16_to_f32(kvq_f32_to_fp16(gauss() * g));
            amax = fmaxf(amax, fabsf(x[t][d]));
        }
    const kvs_scheme schemes[4] = {KVS_SCHEME_FP8_E4M3, KVS_SCHEME_FP8_E5M2, KVS_SCHEME_INT8,
                                   KVS_SCHEME_FP16};
    unsigned bad = 0, better = 0, moved = 0;
    for (int si = 0; si < 4; si++)
        for (int kind = 0; kind < 2; kind++)
            for (int stat = 0; stat < 2; stat++) {
                const kvs_scheme s = schemes[si];
                const int fp8 = s == KVS_SCHEME_FP8_E4M3 || s == KVS_SCHEME_FP8_E5M2;
                const kvq_fp8_format fmt = s == KVS_SCHEME_FP8_E5M2 ? KVQ_FP8_E5M2 : KVQ_FP8_E4M3;
                const float qmax = s == KVS_SCHEME_INT8 ? 127.0f : kvq_fp8_max(fmt);
                const uint32_t kk = s == KVS_SCHEME_FP16 ? 0 : k, ss = s == KVS_SCHEME_FP16 ? 0 : S;
                const uint32_t G = kind == KVS_TILE_K ? D : T;
                /* not an fp16 value: the quantizer rounds it up */
                const float ts = amax / qmax * 1.37f;
                const uint16_t t16 = kvq_scale_fp16(ts);
                const float tv = kvq_fp16_to_f32(t16);
                for (uint32_t g = 0; g < G; g++) /* static scales 0..~2 tv */
                    st[g] = (float)g / (float)G * 2.0f * tv;
                kvs_tile_params p = {s, (kvs_tile_kind)kind, T, D, kk, ss, stat ? st : NULL, ts, 0};
                const size_t n = kvs_tile_size(&p);
                CU_ASSERT_FATAL(n <= sizeof a);
                CU_ASSERT_EQUAL(kvs_tile_quantize_ref(&p, x, KVS_DTYPE_FP32, D, a, sizeof a, NULL),
                                0);
                p.tensor_scale = 0.0f;
                CU_ASSERT_EQUAL(kvs_tile_quantize_ref(&p, x, KVS_DTYPE_FP32, D, b, sizeof b, NULL),
                                0);
                CU_ASSERT_EQUAL(kvs_tile_tensor_scale_fp16(&p), 0);
                p.tensor_scale = ts;
                CU_ASSERT_EQUAL(kvs_tile_tensor_scale_fp16(&p), fp8 ? t16 : 0);
                CU_ASSERT(memcmp(a, b, 24) == 0); /* the header, up to its checksum */
                CU_ASSERT_EQUAL(kvs_tile_check(a, n, NULL, NULL), 0);
                if (!fp8) {
                    CU_ASSERT(memcmp(a, b, n) == 0);
                    continue;
                }
                const lay l = layout(s, (kvs_tile_kind)kind, T, D, kk, ss);
                for (uint32_t g = 0; g < G; g++) {
                    uint16_t ha = rd16(a + 32 + l.scales + 2 * g);
                    uint16_t hb = rd16(b + 32 + l.scales + 2 * g);
                    double r = (double)kvq_fp16_to_f32(ha) / tv;
                    int e;
                    int ok = hb == 0 ? ha == 0
                                     : ha == kvq_scale_align_fp16(hb, t16) && ha >= hb &&
                                           frexp(r, &e) == 0.5;
                    if (!ok && bad++ < MAX_REPORT)
                        printf("\n  %d/%d/%d group %u: scale 0x%04x, unaligned 0x%04x, t16 0x%04x",
                               si, kind, stat, g, ha, hb, t16);
                    moved += ha != hb;
                }
                /* Dynamic scales: every element against per-tensor FP8 with
                 * scale t16 (which covers the whole tile, so every group scale
                 * is t16 * 2^-m). Static scales may saturate: no such claim. */
                CU_ASSERT_EQUAL(kvs_tile_dequantize_ref(a, n, KVS_DTYPE_FP32, y, D, NULL), 0);
                if (stat)
                    continue;
                const float inv = kvq_scale_inv(tv);
                for (uint32_t t = 0; t < T; t++)
                    for (uint32_t d = 0; d < D; d++) {
                        float pt = kvq_fp8_dequantize(kvq_fp8_quantize(x[t][d], inv, fmt), tv, fmt);
                        float eo = fabsf(x[t][d] - y[t][d]), ep = fabsf(x[t][d] - pt);
                        if (eo > ep && bad++ < MAX_REPORT)
                            printf("\n  %d/%d/%d (%u,%u): x %a ours %a per-tensor %a", si, kind,
                                   stat, t, d, (double)x[t][d], (double)y[t][d], (double)pt);
                        better += eo < ep;
                    }
            }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT(moved > 0);  /* the alignment did change scales */
    CU_ASSERT(better > 0); /* and finer grids did help */
    /* every scale a K tile can have, against a huge and a tiny tensor scale:
     * aligned group scales stay finite, >= 2^-24 and decode */
    for (int big = 0; big < 2; big++) {
        static float z[T][D];
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t d = 0; d < D; d++)
                z[t][d] = d == 0 ? 0.0f : ldexpf(1.0f, (int)(t % 60) - 30) * (float)d;
        kvs_tile_params p = {KVS_SCHEME_FP8_E4M3,      KVS_TILE_V, T, D, 0, 0, NULL,
                             big ? 1.0e30f : 1.0e-30f, 0};
        const size_t n = kvs_tile_size(&p);
        CU_ASSERT_EQUAL(kvs_tile_quantize_ref(&p, z, KVS_DTYPE_FP32, D, a, sizeof a, NULL), 0);
        CU_ASSERT_EQUAL(kvs_tile_dequantize_ref(a, n, KVS_DTYPE_FP32, y, D, NULL), 0);
        const lay l = layout(KVS_SCHEME_FP8_E4M3, KVS_TILE_V, T, D, 0, 0);
        for (uint32_t t = 0; t < T; t++) {
            uint16_t h = rd16(a + 32 + l.scales + 2 * t);
            /* 1e30 -> 65504 = 2047 * 2^5: its multiples are 2047 * 2^(5 - m)
             * down to 2^-24 granularity; 1e-30 -> 2^-24: every power of two */
            CU_ASSERT(h >= 1 && h <= 0x7BFF);
            if (!big)
                CU_ASSERT_EQUAL(h & (h - 1) & 0x3FF, 0); /* a power of two */
        }
    }
}

static void test_checksum(void)
{
    unsigned char t[112];
    size_t n = small_v(t);
    uint64_t c;
    memcpy(&c, t + 24, 8);
    /* XXH3-64 of the header with the checksum zeroed, then the payload. */
    unsigned char z[112];
    memcpy(z, t, n);
    memset(z + 24, 0, 8);
    CU_ASSERT_EQUAL(c, XXH3_64bits(z, n));
    kvs_tile_hdr h;
    memcpy(&h, t, sizeof h);
    CU_ASSERT_EQUAL(kvs_tile_hdr_checksum(&h, t + 32, n - 32), c);
    /* Seal on an intact tile is the identity. */
    unsigned char u[112];
    memcpy(u, t, n);
    CU_ASSERT_EQUAL(kvs_tile_seal(u, n, NULL), 0);
    CU_ASSERT_EQUAL(memcmp(u, t, n), 0);
    /* A device writes checksum 0; sealing restores it. */
    memset(u + 24, 0, 8);
    CU_ASSERT(rejected(u, n, "checksum"));
    CU_ASSERT_EQUAL(kvs_tile_seal(u, n, NULL), 0);
    CU_ASSERT_EQUAL(memcmp(u, t, n), 0);
}

/* ---- format v2: outlier entry widths, v1 tiles ------------------------------------ */

/* 3-byte entries up to a span of 256, 4-byte ones beyond; with D = 256 the
 * empty index 0xFF is also channel 255, so a V sink row's empty slots must
 * not touch it and a real outlier at 255 must be applied. */
static void test_entry_widths(void)
{
    static float x[300 * 256];
    static float y[300 * 256];
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++)
        x[i] = kvq_fp16_to_f32(kvq_f32_to_fp16(gauss()));
    /* K: T = 256 -> 3 bytes, T = 257 -> 4 bytes (FORMAT.md sizes by hand). */
    static const uint32_t Ts[] = {256, 257};
    for (int i = 0; i < 2; i++) {
        uint32_t T = Ts[i], D = 8, k = 4, S = 1;
        kvs_tile_params p = {KVS_SCHEME_INT8, KVS_TILE_K, T, D, k, S, NULL, 0.0f, 0};
        size_t want = 32 + align16(align16(align16(align16(T * D) + 2 * D) + (i ? 4 : 3) * D * k) +
                                   2 * S * D);
        CU_ASSERT_EQUAL(kvs_tile_size(&p), want);
        x[(size_t)255 * D + 3] = 1000.0f; /* token 255 is channel 3's top outlier */
        unsigned char *t = malloc(want);
        CU_ASSERT_EQUAL_FATAL(
            quant(KVS_SCHEME_INT8, KVS_TILE_K, T, D, k, S, NULL, x, KVS_DTYPE_FP32, D, t, want), 0);
        lay l = layout(KVS_SCHEME_INT8, KVS_TILE_K, T, D, k, S);
        CU_ASSERT_EQUAL(l.w, i ? 4u : 3u);
        CU_ASSERT_EQUAL(slot_index(t + 32 + l.outliers + l.w * 3 * k, l.w, 0), 255);
        CU_ASSERT_EQUAL(kvs_tile_dequantize_ref(t, want, KVS_DTYPE_FP32, y, D, NULL), 0);
        CU_ASSERT_EQUAL(y[(size_t)255 * D + 3], 1000.0f);
        free(t);
    }
    /* V, D = 256, S = 1: sink row 0 keeps its channel 255; row 1 has a real
     * outlier at channel 255 (index 0xFF). */
    {
        const uint32_t T = 4, D = 256, k = 2, S = 1;
        x[255] = 3.0f;         /* sink row, channel 255 */
        x[D + 255] = -5000.0f; /* row 1's top outlier */
        lay l = layout(KVS_SCHEME_INT8, KVS_TILE_V, T, D, k, S);
        size_t n = 32 + l.payload;
        CU_ASSERT_EQUAL(l.w, 3u);
        unsigned char *t = malloc(n);
        CU_ASSERT_EQUAL_FATAL(
            quant(KVS_SCHEME_INT8, KVS_TILE_V, T, D, k, S, NULL, x, KVS_DTYPE_FP32, D, t, n), 0);
        CU_ASSERT_EQUAL(slot_index(t + 32 + l.outliers, 3, 0), 0xFF); /* sink row: empty */
        CU_ASSERT_EQUAL(slot_value(t + 32 + l.outliers, 3, 0), 0);
        CU_ASSERT_EQUAL(slot_index(t + 32 + l.outliers, 3, 2), 0xFF); /* row 1: channel 255 */
        CU_ASSERT_EQUAL(kvs_tile_dequantize_ref(t, n, KVS_DTYPE_FP32, y, D, NULL), 0);
        CU_ASSERT_EQUAL(y[255], 3.0f);
        CU_ASSERT_EQUAL(y[D + 255], -5000.0f);
        free(t);
    }
}

/* Version 1 tiles (and any other version) are refused before any byte of the
 * payload is used, even with a correct checksum; nothing is written. */
static void test_v1_refused(void)
{
    unsigned char t[96];
    size_t n = small_k(t);
    t[4] = 1;
    memset(t + 24, 0, 8);
    uint64_t c = XXH3_64bits(t, n); /* checksum as a v1 writer would compute it */
    memcpy(t + 24, &c, 8);
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL(kvs_tile_check(t, n, NULL, err), KVS_EFORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "version"));
    float y[8];
    memset(y, SENTINEL, sizeof y);
    CU_ASSERT_EQUAL(kvs_tile_dequantize_ref(t, n, KVS_DTYPE_FP32, y, 2, NULL), KVS_EFORMAT);
    CU_ASSERT(all_bytes((unsigned char *)y, sizeof y, SENTINEL));
    CU_ASSERT_EQUAL(kvs_tile_seal(t, n, NULL), KVS_EFORMAT);
}

/* kvq_scale_fp16: the stored scale is the smallest fp16 >= s, capped at
 * 65504, so amax * (1/stored) never exceeds qmax. */
static void test_scale_fp16(void)
{
    CU_ASSERT_EQUAL(kvq_scale_fp16(0.0f), 0);
    CU_ASSERT_EQUAL(kvq_scale_fp16(1.0f), 0x3C00);
    CU_ASSERT_EQUAL(kvq_scale_fp16(nextafterf(1.0f, 2.0f)), 0x3C01);
    CU_ASSERT_EQUAL(kvq_scale_fp16(nextafterf(1.0f, 0.0f)), 0x3C00);
    CU_ASSERT_EQUAL(kvq_scale_fp16(65504.0f), 0x7BFF);
    CU_ASSERT_EQUAL(kvq_scale_fp16(1e30f), 0x7BFF);
    CU_ASSERT_EQUAL(kvq_scale_fp16(INFINITY), 0x7BFF);
    CU_ASSERT_EQUAL(kvq_scale_fp16(FLT_MIN), 0x0001);
    CU_ASSERT_EQUAL(kvq_scale_fp16(ldexpf(1.0f, -24)), 0x0001);
    CU_ASSERT_EQUAL(kvq_scale_fp16(ldexpf(1.5f, -24)), 0x0002);
    CU_ASSERT_EQUAL(kvq_scale_fp16(ldexpf(1.0f, -14)), 0x0400);
    CU_ASSERT_EQUAL(kvq_scale_fp16(nextafterf(ldexpf(1.0f, -14), 0.0f)), 0x0400);
    CU_ASSERT_EQUAL(kvq_scale_fp16(-1.0f), 0);
    CU_ASSERT_EQUAL(kvq_scale_fp16(NAN), 0);
    unsigned bad = 0;
    for (int i = 0; i < 200000; i++) {
        /* random positive finite fp32 below 65504, all binades */
        uint32_t b = (uint32_t)(rnd() % 0x477FE000u) + 1u;
        float s = f_of_bits(b);
        uint16_t h = kvq_scale_fp16(s);
        double v = kvq_fp16_to_f32(h);
        double below = h > 1 ? kvq_fp16_to_f32((uint16_t)(h - 1)) : 0.0;
        if (!(v >= (double)s && below < (double)s) && bad++ < MAX_REPORT)
            printf("\n  scale %a -> 0x%04x", (double)s, h);
        /* the point of rounding up: amax = s * qmax scales to qmax at most
         * (up to the fp32 roundings of amax, 1/scale and the product) */
        float amax = s * 127.0f;
        if (amax * kvq_scale_inv((float)v) > 127.0f * (1.0f + 0x1p-21f) && bad++ < MAX_REPORT)
            printf("\n  amax %a scale 0x%04x exceeds qmax", (double)amax, h);
    }
    CU_ASSERT_EQUAL(bad, 0);
}

int main(void)
{
    static const kvs_test_case golden[] = {
        {"E4M3 K tile with sinks, ties, outliers", test_golden_k_e4m3},
        {"INT8 V tile: -Inf and NaN, half-to-even", test_golden_v_int8},
        {"E5M2 V tile, zero row", test_golden_v_e5m2},
        {"fp16 tile from bf16, padding", test_golden_fp16},
        {"static scales", test_static_scales},
        {"all-zero and all-outlier groups", test_zero_and_all_outlier_groups},
        {"non-finite inputs as FORMAT.md says", test_nonfinite_doc},
        {"v2: 3- and 4-byte outlier entries, index 0xFF", test_entry_widths},
        {"v2: version 1 tiles refused", test_v1_refused},
        {"v2: fp16 scales rounded up", test_scale_fp16},
        {"tensor scale: aligned FP8 group scales", test_tensor_scale},
        {NULL, NULL},
    };
    static const kvs_test_case roundtrip[] = {
        {"random tiles: every byte and error bound", test_roundtrip_random},
        {"fp16/bf16/fp32 sources agree", test_src_dtypes_agree},
        {"strided views", test_strides},
        {NULL, NULL},
    };
    static const kvs_test_case errors[] = {
        {"parameter errors name the field", test_param_errors},
        {"hostile header fields", test_hostile_header_fields},
        {"truncation at every length", test_truncation},
        {"every single-bit flip", test_bit_flips},
        {"forged outlier indices", test_forged_outliers},
        {"checksum and seal", test_checksum},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {
        {"tile golden bytes", NULL, NULL, golden},
        {"tile round trips", NULL, NULL, roundtrip},
        {"tile errors and hostile input", NULL, NULL, errors},
        {NULL, NULL, NULL, NULL},
    };
    return kvs_test_run(suites);
}
