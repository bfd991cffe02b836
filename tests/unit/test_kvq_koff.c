/*
 * test_kvq_koff.c — per-channel key offsets (kv_format.h rule 5,
 * KVS_TILE_F_KOFF / KVS_BLOCK_F_KOFF): the trimmed-midrange rule
 * (kvq_offset_trim) on hand-worked groups, the reference tile codec with
 * offsets (where the offsets region lies, what it holds, what decode adds
 * back, what outliers and sinks keep), what it buys on biased channels, the
 * hostile values the rule must survive, the checks that refuse forged offset
 * tiles, and blocks that carry them.
 *
 * Expectations come from first principles: the offsets region's place is
 * written out from docs/FORMAT.md (after the sinks, 16-aligned), the expected
 * offsets from a sort of the channel (not from kvq_offset_trim), the decode
 * from the codes and scales read back out of the tile.
 */
#include "kv_block.h"
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

#define TILE_TEST_SEED 0x6A09E667F3BCC909ull
#include "tile_test_util.h"

/* ---- the rule on hand-worked groups ----------------------------------------- */

static uint16_t h16(float x)
{
    return kvq_f32_to_fp16(x);
}

static void test_trim_rule(void)
{
    const float nan = NAN, inf = INFINITY;
    /* Nothing finite: 0. */
    CU_ASSERT_EQUAL(kvq_offset_trim(NULL, 0, 2), 0);
    const float nonfinite[] = {nan, inf, -inf};
    CU_ASSERT_EQUAL(kvq_offset_trim(nonfinite, 3, 0), 0);
    /* k = 0: the midrange. */
    const float a[] = {1, 2, 3, 4};
    CU_ASSERT_EQUAL(kvq_offset_trim(a, 4, 0), 0x4100); /* 2.5 */
    /* One outlier on top, k = 1: [10, 13] is narrower than [11, 100]. */
    const float top[] = {10, 11, 100, 12, 13};
    CU_ASSERT_EQUAL(kvq_offset_trim(top, 5, 1), 0x49C0); /* 11.5 */
    /* ... at the bottom: [10, 13] again, the other side set aside. */
    const float bottom[] = {12, -100, 10, 11, 13};
    CU_ASSERT_EQUAL(kvq_offset_trim(bottom, 5, 1), 0x49C0);
    /* Order does not matter: every rotation gives the same offset. */
    float rot[5];
    for (int s = 0; s < 5; s++) {
        for (int i = 0; i < 5; i++)
            rot[i] = top[(i + s) % 5];
        CU_ASSERT_EQUAL(kvq_offset_trim(rot, 5, 1), 0x49C0);
    }
    /* Non-finite values never count. */
    const float mixed[] = {nan, inf, 10, 13, -inf};
    CU_ASSERT_EQUAL(kvq_offset_trim(mixed, 5, 0), 0x49C0);
    /* Equal widths: the first i (set aside from the bottom first... i = 0
     * sets aside the top): {0, 10, 20}, k = 1: [0, 10] and [10, 20] -> 5. */
    const float tie[] = {20, 0, 10};
    CU_ASSERT_EQUAL(kvq_offset_trim(tie, 3, 1), h16(5.0f));
    /* Duplicates: {5, 5, 5, 100}, k = 1 -> [5, 5]. */
    const float dup[] = {5, 100, 5, 5};
    CU_ASSERT_EQUAL(kvq_offset_trim(dup, 4, 1), h16(5.0f));
    /* k >= the finite count: nothing is set aside below one value. */
    const float one[] = {nan, 5};
    CU_ASSERT_EQUAL(kvq_offset_trim(one, 2, 3), h16(5.0f));
    /* Beyond fp16: clamped to 65504, never Inf. */
    const float big[] = {1.0e6f, 1.0e6f + 2.0f};
    CU_ASSERT_EQUAL(kvq_offset_trim(big, 2, 0), 0x7BFF);
    const float nbig[] = {-3.0e38f, -1.0e38f};
    CU_ASSERT_EQUAL(kvq_offset_trim(nbig, 2, 0), 0xFBFF);
    /* Opposite extremes of fp32 do not overflow the midrange. */
    const float ext[] = {-FLT_MAX, FLT_MAX};
    CU_ASSERT_EQUAL(kvq_offset_trim(ext, 2, 0), 0);
    /* A zero offset is +0, whatever the zeros' signs. */
    const float negz[] = {-0.0f, -0.0f};
    CU_ASSERT_EQUAL(kvq_offset_trim(negz, 2, 0), 0);
    const float tiny[] = {-1.0e-9f, 0.0f};
    CU_ASSERT_EQUAL(kvq_offset_trim(tiny, 2, 0), 0);
    /* k above 16 is capped at 16. */
    float many[40];
    for (int i = 0; i < 40; i++)
        many[i] = (float)i;
    CU_ASSERT_EQUAL(kvq_offset_trim(many, 40, 17), kvq_offset_trim(many, 40, 16));
}

/* The rule from a sort, in double, for random groups: an independent
 * implementation of "the centre of the narrowest range once r values are set
 * aside". Exact here: the values are multiples of 2^-8 within +-2^12. */
static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static uint16_t trim_by_sort(const float *x, int n, int k)
{
    float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
    int cnt = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(x[i]))
            v[cnt++] = x[i];
    if (cnt == 0) {
        free(v);
        return 0;
    }
    qsort(v, (size_t)cnt, sizeof *v, cmp_float);
    int r = k < cnt - 1 ? k : cnt - 1, best = 0;
    double bw = 0;
    for (int i = 0; i <= r; i++) {
        double w = (double)v[cnt - 1 - (r - i)] - (double)v[i];
        if (i == 0 || w < bw)
            best = i, bw = w;
    }
    double c = ((double)v[best] + (double)v[cnt - 1 - (r - best)]) / 2;
    free(v);
    c = c > 65504 ? 65504 : c < -65504 ? -65504 : c; /* clamped, never Inf */
    uint16_t h = kvq_f32_to_fp16((float)c);
    return h == 0x8000 ? 0 : h;
}

static void test_trim_random(void)
{
    float x[300];
    for (int it = 0; it < 2000; it++) {
        int n = 1 + (int)(rnd() % 300), k = (int)(rnd() % 17);
        double bias = (double)((int)(rnd() % 2001) - 1000);
        for (int i = 0; i < n; i++) {
            double v = bias + gauss() * 8.0;
            if (rnd() % 40 == 0)
                v += (rnd() & 1 ? 1 : -1) * 500.0 * unif(); /* an outlier */
            x[i] = (float)(rint(v * 256.0) / 256.0);
        }
        if (it % 7 == 0)
            x[rnd() % (uint64_t)n] = NAN;
        if (it % 11 == 0)
            x[rnd() % (uint64_t)n] = (rnd() & 1) ? INFINITY : -INFINITY;
        uint16_t want = trim_by_sort(x, n, k), got = kvq_offset_trim(x, n, k);
        if (got != want) {
            CU_FAIL("kvq_offset_trim differs from the sort");
            printf("\n  n %d k %d: got 0x%04x want 0x%04x", n, k, got, want);
            return;
        }
    }
}

/* ---- tiles ---------------------------------------------------------------------- */

/* Where the offsets lie (docs/FORMAT.md): after the sinks, 16-aligned; the
 * payload grows by align16(2 D). */
static size_t offsets_at(const lay *l, size_t D, size_t S)
{
    return align16(l->sinks + 2 * S * D);
}

static kvs_tile_params kparams(kvs_scheme s, uint32_t T, uint32_t D, uint32_t k, uint32_t S,
                               int koff)
{
    kvs_tile_params p = {.scheme = s,
                         .kind = KVS_TILE_K,
                         .tokens = T,
                         .dim = D,
                         .outliers = k,
                         .sinks = S,
                         .key_offsets = (uint32_t)koff};
    return p;
}

static float code_value(kvs_scheme s, uint8_t c, float scale)
{
    if (s == KVS_SCHEME_INT8)
        return kvq_int8_dequantize((int8_t)c, scale);
    return kvq_fp8_dequantize(c, scale, s == KVS_SCHEME_FP8_E5M2 ? KVQ_FP8_E5M2 : KVQ_FP8_E4M3);
}

/* Checks one key-offset tile q of x ([T][D] fp32) against the format: flag,
 * size, offsets (from the sort), outlier values (the original x), sink rows,
 * and every decoded element (code * scale + offset, one fp32 rounding each,
 * unless an outlier or sink overwrites it). */
static void check_koff_tile(kvs_scheme s, uint32_t T, uint32_t D, uint32_t k, uint32_t S,
                            const float *x, const unsigned char *q, size_t qlen)
{
    const lay l = layout(s, KVS_TILE_K, T, D, k, S);
    const size_t off = offsets_at(&l, D, S);
    CU_ASSERT_EQUAL_FATAL(qlen, 32 + align16(off + 2 * D));
    CU_ASSERT_EQUAL(q[7], KVS_TILE_F_KOFF); /* flags */
    CU_ASSERT_EQUAL(kvs_tile_check(q, qlen, NULL, NULL), 0);
    const unsigned char *pay = q + 32;
    CU_ASSERT(all_bytes(pay + off + 2 * D, align16(off + 2 * D) - (off + 2 * D), 0));
    float *col = malloc(sizeof(float) * T), *y = malloc(sizeof(float) * T * D);
    unsigned char *is_out = calloc((size_t)T * D, 1);
    for (uint32_t d = 0; d < D; d++) {
        for (uint32_t t = S; t < T; t++)
            col[t - S] = x[t * D + d];
        CU_ASSERT_EQUAL(rd16(pay + off + 2 * d), trim_by_sort(col, (int)(T - S), (int)k));
        for (uint32_t j = 0; j < k && S < T; j++) {
            const unsigned char *e = pay + l.outliers + (d * k + j) * l.w;
            uint32_t t = l.w == 3 ? e[0] : (uint32_t)rd16(e);
            if (t >= T)
                continue;
            CU_ASSERT_EQUAL(rd16(e + l.w - 2), kvq_f32_to_fp16(x[t * D + d]));
            is_out[t * D + d] = 1;
        }
    }
    CU_ASSERT_EQUAL_FATAL(kvs_tile_dequantize_ref(q, qlen, KVS_DTYPE_FP32, y, D, NULL), 0);
    int bad = 0;
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t d = 0; d < D; d++) {
            float want;
            if (t < S)
                want = kvq_fp16_to_f32(rd16(pay + l.sinks + 2 * (t * D + d)));
            else if (is_out[t * D + d])
                want = kvq_fp16_to_f32(kvq_f32_to_fp16(x[t * D + d]));
            else
                want =
                    code_value(s, pay[t * D + d], kvq_fp16_to_f32(rd16(pay + l.scales + 2 * d))) +
                    kvq_fp16_to_f32(rd16(pay + off + 2 * d));
            if (fbits(y[t * D + d]) != fbits(want) && !(isnan(want) && isnan(y[t * D + d])) &&
                bad++ < MAX_REPORT)
                printf("\n  (%u,%u): decoded %a, want %a", t, d, (double)y[t * D + d],
                       (double)want);
        }
    CU_ASSERT_EQUAL(bad, 0);
    free(col);
    free(y);
    free(is_out);
}

static int quant_k(kvs_scheme s, uint32_t T, uint32_t D, uint32_t k, uint32_t S, int koff,
                   const float *x, unsigned char **out, size_t *len)
{
    kvs_tile_params p = kparams(s, T, D, k, S, koff);
    *len = kvs_tile_size(&p);
    *out = malloc(*len);
    char err[KVS_ERR_LEN] = "";
    int rc = kvs_tile_quantize_ref(&p, x, KVS_DTYPE_FP32, D, *out, *len, err);
    if (rc)
        printf("\n  quantize: %s", err);
    return rc;
}

static const kvs_scheme SCHEMES[] = {KVS_SCHEME_FP8_E4M3, KVS_SCHEME_FP8_E5M2, KVS_SCHEME_INT8};

/* Channels far off zero (bias up to +-500, noise sd 1, a rare outlier): with
 * offsets every scheme's error on the non-outlier values shrinks by more
 * than 10x, and the tile is what the format says. */
static void test_biased_channels(void)
{
    enum { T = 64, D = 16, K = 2, S = 1 };
    float x[T * D];
    for (uint32_t d = 0; d < D; d++) {
        double bias = (d % 2 ? 1 : -1) * (50.0 + 30.0 * d);
        for (uint32_t t = 0; t < T; t++)
            x[t * D + d] = (float)(bias + gauss());
        x[(7 + d) % T * D + d] += 200.0f; /* an outlier */
    }
    for (size_t si = 0; si < sizeof SCHEMES / sizeof SCHEMES[0]; si++) {
        kvs_scheme s = SCHEMES[si];
        unsigned char *q0, *q1;
        size_t n0, n1;
        CU_ASSERT_EQUAL_FATAL(quant_k(s, T, D, K, S, 0, x, &q0, &n0), 0);
        CU_ASSERT_EQUAL_FATAL(quant_k(s, T, D, K, S, 1, x, &q1, &n1), 0);
        CU_ASSERT_EQUAL(n1, n0 + align16(2 * D));
        check_koff_tile(s, T, D, K, S, x, q1, n1);
        float y0[T * D], y1[T * D];
        CU_ASSERT_EQUAL_FATAL(kvs_tile_dequantize_ref(q0, n0, KVS_DTYPE_FP32, y0, D, NULL), 0);
        CU_ASSERT_EQUAL_FATAL(kvs_tile_dequantize_ref(q1, n1, KVS_DTYPE_FP32, y1, D, NULL), 0);
        double e0 = 0, e1 = 0;
        for (int i = S * D; i < T * D; i++) {
            e0 += fabs((double)y0[i] - x[i]);
            e1 += fabs((double)y1[i] - x[i]);
        }
        printf("\n  scheme %d: mean |error| %.4g without offsets, %.4g with", (int)s,
               e0 / ((T - S) * D), e1 / ((T - S) * D));
        CU_ASSERT(e1 * 10 < e0);
        free(q0);
        free(q1);
    }
}

/* Random shapes (T 1..300, D 1..40, every k and S) and values, some channels
 * biased: every tile as the format says. */
static void test_random_tiles(void)
{
    for (int it = 0; it < 150; it++) {
        uint32_t T = 1 + (uint32_t)(rnd() % 300), D = 1 + (uint32_t)(rnd() % 40);
        uint32_t k = (uint32_t)(rnd() % 17), S = (uint32_t)(rnd() % (T < 4 ? T + 1 : 4));
        kvs_scheme s = SCHEMES[rnd() % 3];
        float *x = malloc(sizeof(float) * T * D);
        for (uint32_t d = 0; d < D; d++) {
            double bias = rnd() % 2 ? 0.0 : ((double)(rnd() % 4001) - 2000.0) / 4;
            for (uint32_t t = 0; t < T; t++)
                x[t * D + d] = (float)(rint((bias + gauss() * 4) * 256) / 256);
        }
        unsigned char *q;
        size_t n;
        CU_ASSERT_EQUAL_FATAL(quant_k(s, T, D, k, S, 1, x, &q, &n), 0);
        check_koff_tile(s, T, D, k, S, x, q, n);
        free(q);
        free(x);
    }
}

/* NaN, +-Inf, denormals, +-65504, fp32 values beyond fp16, all-zero and
 * constant channels: offsets stay finite, constant channels decode exactly,
 * non-finite values come back as without offsets (docs/FORMAT.md). */
static void test_hostile_values(void)
{
    enum { T = 16, D = 8, K = 2 };
    float x[T * D];
    for (uint32_t t = 0; t < T; t++) {
        x[t * D + 0] = 0.0f;                                                /* all zero */
        x[t * D + 1] = 3.25f;                                               /* constant */
        x[t * D + 2] = t % 5 == 0 ? NAN : (float)t;                         /* NaNs */
        x[t * D + 3] = t == 3 ? INFINITY : t == 9 ? -INFINITY : 100.0f + t; /* Infs */
        x[t * D + 4] = ldexpf((float)(t + 1), -24);                         /* fp16 subnormals */
        x[t * D + 5] = t % 2 ? 65504.0f : -65504.0f;                        /* fp16 extremes */
        x[t * D + 6] = 1.0e6f + (float)t * 64.0f;                           /* beyond fp16 */
        x[t * D + 7] = t % 2 ? -0.0f : 0.0f;                                /* signed zeros */
    }
    for (size_t si = 0; si < sizeof SCHEMES / sizeof SCHEMES[0]; si++) {
        kvs_scheme s = SCHEMES[si];
        for (uint32_t S = 0; S <= 1; S++) {
            unsigned char *q;
            size_t n;
            CU_ASSERT_EQUAL_FATAL(quant_k(s, T, D, K, S, 1, x, &q, &n), 0);
            check_koff_tile(s, T, D, K, S, x, q, n);
            const lay l = layout(s, KVS_TILE_K, T, D, K, S);
            const size_t off = offsets_at(&l, D, S);
            for (uint32_t d = 0; d < D; d++)
                CU_ASSERT_NOT_EQUAL(rd16(q + 32 + off + 2 * d) & 0x7C00, 0x7C00);
            CU_ASSERT_EQUAL(rd16(q + 32 + off + 2 * 6), 0x7BFF); /* clamped to 65504 */
            CU_ASSERT_EQUAL(rd16(q + 32 + off + 2 * 7), 0);      /* +0 */
            float y[T * D];
            CU_ASSERT_EQUAL_FATAL(kvs_tile_dequantize_ref(q, n, KVS_DTYPE_FP32, y, D, NULL), 0);
            for (uint32_t t = 0; t < T; t++) {
                CU_ASSERT_EQUAL(y[t * D + 0], 0.0f);
                CU_ASSERT_EQUAL(y[t * D + 1], 3.25f);
                CU_ASSERT(isfinite(y[t * D + 5]) && isfinite(y[t * D + 7]));
                if (t >= S && !isnan(x[t * D + 2]))
                    CU_ASSERT(isfinite(y[t * D + 2]));
            }
            free(q);
        }
    }
}

/* key_offsets where the format has none: refused, naming the field. */
static void test_param_errors(void)
{
    float x[16 * 8] = {0};
    unsigned char out[1024];
    char err[KVS_ERR_LEN];
    kvs_tile_params p = kparams(KVS_SCHEME_INT8, 16, 8, 1, 0, 1);
    p.kind = KVS_TILE_V;
    CU_ASSERT_EQUAL(kvs_tile_quantize_ref(&p, x, KVS_DTYPE_FP32, 8, out, sizeof out, err),
                    KVS_EINVAL);
    CU_ASSERT(strstr(err, "key_offsets") != NULL);
    p = kparams(KVS_SCHEME_FP16, 16, 8, 0, 0, 1);
    CU_ASSERT_EQUAL(kvs_tile_quantize_ref(&p, x, KVS_DTYPE_FP32, 8, out, sizeof out, err),
                    KVS_EINVAL);
    CU_ASSERT(strstr(err, "key_offsets") != NULL);
    /* Too small for the offsets: the size counts them. */
    p = kparams(KVS_SCHEME_INT8, 16, 8, 1, 0, 1);
    CU_ASSERT_EQUAL(
        kvs_tile_quantize_ref(&p, x, KVS_DTYPE_FP32, 8, out, kvs_tile_size(&p) - 1, err),
        KVS_EINVAL);
}

/* Forged key-offset tiles, resealed so only the forged field is wrong: a
 * NaN or infinite offset, the flag on a V tile, the flag without its region,
 * the region without its flag; truncation at every length. Each is refused
 * and the destination stays untouched. */
static void test_forged_tiles(void)
{
    enum { T = 16, D = 8 };
    float x[T * D];
    for (int i = 0; i < T * D; i++)
        x[i] = 40.0f + (float)gauss();
    unsigned char *q;
    size_t n;
    CU_ASSERT_EQUAL_FATAL(quant_k(KVS_SCHEME_INT8, T, D, 1, 0, 1, x, &q, &n), 0);
    const lay l = layout(KVS_SCHEME_INT8, KVS_TILE_K, T, D, 1, 0);
    const size_t off = 32 + offsets_at(&l, D, 0);
    unsigned char *f = malloc(n + 64);
    float y[T * D];
    char err[KVS_ERR_LEN];
    const uint16_t bad_offsets[] = {0x7C00, 0xFC00, 0x7E00, 0x7C01};
    for (size_t i = 0; i < sizeof bad_offsets / sizeof bad_offsets[0]; i++) {
        memcpy(f, q, n);
        wr16(f + off + 2 * 5, bad_offsets[i]);
        CU_ASSERT_EQUAL_FATAL(kvs_tile_seal(f, n, NULL), 0);
        memset(y, 0xA5, sizeof y);
        CU_ASSERT_EQUAL(kvs_tile_dequantize_ref(f, n, KVS_DTYPE_FP32, y, D, err), KVS_EFORMAT);
        CU_ASSERT(strstr(err, "key offset 5") != NULL);
        CU_ASSERT(all_bytes(y, sizeof y, 0xA5));
        CU_ASSERT_EQUAL(kvs_tile_check_verified(f, n, NULL, NULL), KVS_EFORMAT);
    }
    /* The flag cleared: the header's size no longer matches its layout. */
    memcpy(f, q, n);
    f[7] = 0;
    CU_ASSERT_EQUAL(kvs_tile_seal(f, n, NULL), KVS_EFORMAT);
    CU_ASSERT_EQUAL(kvs_tile_check(f, n, NULL, NULL), KVS_EFORMAT);
    /* The flag on a V tile, payload grown to what a K tile would need. */
    memcpy(f, q, n);
    f[6] = KVS_TILE_V;
    CU_ASSERT_EQUAL(kvs_tile_check(f, n, NULL, err), KVS_EFORMAT);
    CU_ASSERT(strstr(err, "key offsets") != NULL);
    /* The flag on a tile without the region (payload_bytes of the old size). */
    unsigned char *p0;
    size_t n0;
    CU_ASSERT_EQUAL_FATAL(quant_k(KVS_SCHEME_INT8, T, D, 1, 0, 0, x, &p0, &n0), 0);
    memcpy(f, p0, n0);
    f[7] = KVS_TILE_F_KOFF;
    CU_ASSERT_EQUAL(kvs_tile_check(f, n0 + 64, NULL, NULL), KVS_EFORMAT);
    /* Truncation at every length. */
    for (size_t len = 0; len < n; len++)
        CU_ASSERT_EQUAL(kvs_tile_check(q, len, NULL, NULL), KVS_EFORMAT);
    free(p0);
    free(f);
    free(q);
}

/* ---- blocks --------------------------------------------------------------------- */

/* A root block of three layers (int8, fp16, e4m3) with key offsets: the
 * header flag, KOFF on exactly the 8-bit layers' K tiles, the size, a
 * decode equal to the tiles', and a header whose flag was cleared refused. */
static void test_block(void)
{
    enum { L = 3, H = 2, D = 8, T = 16 };
    const kvs_scheme sch[L] = {KVS_SCHEME_INT8, KVS_SCHEME_FP16, KVS_SCHEME_FP8_E4M3};
    static float k[L][T][H][D], v[L][T][H][D];
    const void *ks[L], *vs[L];
    for (int l = 0; l < L; l++) {
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++)
                for (int d = 0; d < D; d++) {
                    /* fp16 values, as a worker's cache holds: outliers
                     * then keep them exactly */
                    k[l][t][h][d] =
                        kvq_fp16_to_f32(kvq_f32_to_fp16((float)(300.0 * (d - 3) + gauss())));
                    v[l][t][h][d] = (float)gauss();
                }
        ks[l] = k[l];
        vs[l] = v[l];
    }
    kvs_block_params p = {.layers = L,
                          .heads = H,
                          .head_dim = D,
                          .block_tokens = T,
                          .src_dtype = KVS_DTYPE_FP32,
                          .root = 1,
                          .k_outliers = 2,
                          .v_outliers = 1,
                          .sinks = 1,
                          .schemes = sch,
                          .key_offsets = 1};
    size_t n = kvs_block_size(&p);
    p.key_offsets = 0;
    size_t n_plain = kvs_block_size(&p);
    p.key_offsets = 1;
    CU_ASSERT_EQUAL(n, n_plain + 2 * H * align16(2 * D)); /* two 8-bit layers */
    unsigned char *b = aligned_alloc(16, align16(n));
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL_FATAL(kvs_block_encode(&p, ks, vs, NULL, b, n, err), 0);
    kvs_block_hdr hdr;
    CU_ASSERT_EQUAL_FATAL(kvs_block_check(b, n, &hdr, err), 0);
    CU_ASSERT_EQUAL(hdr.flags, KVS_BLOCK_F_ROOT | KVS_BLOCK_F_KOFF);
    for (uint32_t l = 0; l < L; l++)
        for (unsigned kind = 0; kind < 2; kind++)
            for (uint32_t h = 0; h < H; h++) {
                const void *tile;
                size_t tl;
                CU_ASSERT_EQUAL_FATAL(
                    kvs_block_tile(b, n, l, (kvs_tile_kind)kind, h, &tile, &tl, NULL), 0);
                unsigned want = kind == KVS_TILE_K && sch[l] != KVS_SCHEME_FP16;
                CU_ASSERT_EQUAL(((const unsigned char *)tile)[7], want ? KVS_TILE_F_KOFF : 0);
                float y[T * D], z[T][H][D];
                CU_ASSERT_EQUAL_FATAL(kvs_tile_dequantize_ref(tile, tl, KVS_DTYPE_FP32, y, D, NULL),
                                      0);
                CU_ASSERT_EQUAL_FATAL(kvs_block_decode_layer(b, n, l, KVS_DTYPE_FP32,
                                                             kind ? NULL : z, kind ? z : NULL, NULL,
                                                             NULL),
                                      0);
                for (int t = 0; t < T; t++)
                    CU_ASSERT(memcmp(&y[t * D], z[t][h], sizeof(float) * D) == 0);
            }
    /* Key offsets pay: layer 0's K error is small against its 2100-wide range
     * (without them int8 steps would be 1200 / 127). */
    float z[T][H][D];
    CU_ASSERT_EQUAL_FATAL(kvs_block_decode_layer(b, n, 0, KVS_DTYPE_FP32, z, NULL, NULL, NULL), 0);
    double e = 0;
    for (int t = 1; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int d = 0; d < D; d++)
                e = fmax(e, fabs((double)z[t][h][d] - k[0][t][h][d]));
    printf("\n  layer 0 K: max |error| %.4g", e);
    CU_ASSERT(e < 0.1);
    /* The header's flag cleared and resealed: the layout no longer adds up. */
    unsigned char *f = aligned_alloc(16, align16(n));
    memcpy(f, b, n);
    f[5] &= (unsigned char)~KVS_BLOCK_F_KOFF;
    CU_ASSERT_EQUAL(kvs_block_seal(f, n, NULL), KVS_EFORMAT);
    CU_ASSERT_EQUAL(kvs_block_check(f, n, NULL, NULL), KVS_EFORMAT);
    free(f);
    free(b);
}

int main(void)
{
    static const kvs_test_case rule[] = {
        {"trimmed midrange by hand", test_trim_rule},
        {"trimmed midrange against a sort", test_trim_random},
        {NULL, NULL},
    };
    static const kvs_test_case tiles[] = {
        {"biased channels: 10x less error", test_biased_channels},
        {"random tiles as the format says", test_random_tiles},
        {"hostile values", test_hostile_values},
        {"parameter errors", test_param_errors},
        {"forged offset tiles", test_forged_tiles},
        {"blocks with key offsets", test_block},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {
        {"key offset rule", NULL, NULL, rule},
        {"key offset tiles", NULL, NULL, tiles},
        {NULL, NULL, NULL, NULL},
    };
    return kvs_test_run(suites);
}
