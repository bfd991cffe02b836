/*
 * test_kvq_cpu.c — the fast CPU path (kernels/cpu, kvq_cpu.h) against the
 * reference (kernels/ref/kvq_ref.c), byte for byte, on every ISA this machine
 * and this build support (each one forced in turn with kvs_cpu_isa_force; an
 * ISA the machine lacks is skipped with a printed note, never failed).
 *
 * What is compared: the whole quantized tile (header, codes, scales, outlier
 * slots, sinks, padding, checksum) plus guard bytes after it that must stay
 * untouched; and the dequantized view in every destination dtype, gaps
 * between rows included (they must keep their sentinel). The reference runs
 * once per case; every ISA is held to its bytes.
 *
 * Cases: T in {1, 16, 256, 1024} x D in {8, 64, 128, 256} x every scheme and
 * kind, k in {0, 1, 2, 4} (fp16: 0 only), S in {0, 1, 4}, source dtypes
 * fp16/bf16/fp32, tiles inside a [T][H][D] tensor (stride > D), static
 * scales, and data that is realistic (a few key channels 10-20x the rest, a
 * sink token ~100x) or hostile (NaN of every kind, ±Inf, fp32 denormals,
 * ±65504, all-zero and constant tiles, one huge value, ties, values on FP8 and
 * INT8 rounding boundaries after scaling, random bit patterns). Small shapes
 * run the full cross product; large shapes a fixed-seed sample that still
 * visits every scheme x kind x dtype. Odd shapes (vector tails), k up to 16,
 * all 65,536 fp16/bf16 patterns, hand-corrupted but sealed tiles (random
 * codes, NaN/negative scales, repeated outlier indices), misaligned buffers
 * and every error path complete it. K tiles with key offsets (kv_format.h
 * rule 5) get their own sweep: every 8-bit scheme, k in {0,1,2,3,4,5,8,16},
 * S in {0, 1, 4, 64, T}, every shape above, and channels built to stress the
 * offset (far off zero, beyond fp16 so it clamps, constant, ±0 mixes, nothing
 * or almost nothing finite, denormals, ties), misaligned views and sealed
 * garbage with arbitrary finite offsets. Seeds are fixed: a failure
 * reproduces.
 *
 * Run with --expect-isa NAME (ctest does, with KVSTASH_CPU_ISA set) it only
 * checks that the environment variable capped the automatic choice.
 */
#include "kv_format.h"
#include "kvq.h"
#include "kvq_cpu.h"
#include "kvq_math.h"
#include "kvs_error.h"
#include "kvs_test.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_REPORT 10
#define SENTINEL   0xA5
#define GUARD      64

static const kvs_cpu_isa ALL_ISAS[] = {KVS_CPU_PORTABLE, KVS_CPU_AVX2, KVS_CPU_AVX512};
static kvs_cpu_isa g_isas[3];
static int g_nisa;
static unsigned g_reports; /* mismatches printed so far (all tests) */
static unsigned long g_cases, g_compares;

/* ---- helpers ------------------------------------------------------------------ */

static uint64_t g_rng;
static uint64_t rnd(void) /* splitmix64 */
{
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static uint32_t rndn(uint32_t n)
{
    return (uint32_t)(rnd() % n);
}
static double unif(void)
{
    return (double)(rnd() >> 11) / 9007199254740992.0;
}
static float gauss(void)
{
    double s = 0;
    for (int i = 0; i < 6; i++)
        s += unif();
    return (float)((s - 3.0) * 1.41);
}
static float f_of(uint32_t u)
{
    return kvq_f32_from_bits(u);
}

static size_t esize(kvs_dtype dt)
{
    return dt == KVS_DTYPE_FP32 ? 4 : 2;
}
static const char *dt_name(kvs_dtype dt)
{
    return dt == KVS_DTYPE_FP16 ? "fp16" : dt == KVS_DTYPE_BF16 ? "bf16" : "fp32";
}
static const char *scheme_name(kvs_scheme s)
{
    static const char *n[] = {"?", "fp16", "e4m3", "e5m2", "int8"};
    return n[s <= 4 ? s : 0];
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    return p;
}

/* Element i of a source view: a value (rounded into dt as the reference would
 * widen it back) or raw bits (low 16 bits for fp16/bf16: NaN payloads survive). */
static void put_val(void *base, kvs_dtype dt, size_t i, float f)
{
    if (dt == KVS_DTYPE_FP32) {
        memcpy((unsigned char *)base + 4 * i, &f, 4);
        return;
    }
    uint16_t h = dt == KVS_DTYPE_FP16 ? kvq_f32_to_fp16(f) : kvq_f32_to_bf16(f);
    memcpy((unsigned char *)base + 2 * i, &h, 2);
}
static void put_bits(void *base, kvs_dtype dt, size_t i, uint32_t bits)
{
    if (dt == KVS_DTYPE_FP32) {
        memcpy((unsigned char *)base + 4 * i, &bits, 4);
        return;
    }
    uint16_t h = (uint16_t)bits;
    memcpy((unsigned char *)base + 2 * i, &h, 2);
}

/* Which payload part a byte offset of a tile falls in, for messages. */
static const char *region(const kvs_tile_params *p, size_t off)
{
    kvs_tile_layout l;
    if (off < sizeof(kvs_tile_hdr))
        return "header";
    kvs_tile_layout_ex(p->scheme, p->kind, p->tokens, p->dim, p->outliers, p->sinks,
                       p->key_offsets != 0, &l);
    off -= sizeof(kvs_tile_hdr);
    if (off >= l.payload)
        return "past the tile";
    if (p->scheme == KVS_SCHEME_FP16)
        return "fp16 values";
    if (off < l.scales)
        return "codes/pad";
    if (off < l.outliers)
        return "scales/pad";
    if (off < l.sinks)
        return "outliers/pad";
    if (off < l.offsets)
        return "sinks/pad";
    return "key offsets/pad";
}

/* 0 if equal, else reports (a few) and returns 1. */
static int diff(const unsigned char *got, const unsigned char *want, size_t n, const char *what,
                const char *isa, const char *label, const kvs_tile_params *p)
{
    size_t i = 0;
    while (i < n && got[i] == want[i])
        i++;
    if (i == n)
        return 0;
    if (g_reports++ < MAX_REPORT) {
        size_t bad = 0;
        for (size_t j = i; j < n; j++)
            bad += got[j] != want[j];
        printf(
            "\n  MISMATCH [%s] %s %s: %zu bytes differ, first at %zu%s%s: got 0x%02x want 0x%02x",
            isa, what, label, bad, i, p ? " " : "", p ? region(p, i) : "", got[i], want[i]);
    }
    return 1;
}

/* ---- one case: quantize + dequantize on every ISA ---------------------------- */

typedef struct tcase {
    kvs_tile_params p;
    kvs_dtype dt;    /* source dtype */
    uint32_t H, h;   /* the tile is head h of a [T][H][D] tensor: stride H*D */
    const void *src; /* tensor base */
    char label[160];
} tcase;

static void label_of(tcase *c, const char *gen)
{
    char ts[40] = "";
    if (c->p.tensor_scale != 0.0f)
        snprintf(ts, sizeof ts, " tensor_scale=%a", (double)c->p.tensor_scale);
    snprintf(c->label, sizeof c->label, "%s %s T=%u D=%u k=%u S=%u src=%s H=%u%s%s%s gen=%s",
             scheme_name(c->p.scheme), c->p.kind == KVS_TILE_K ? "K" : "V", c->p.tokens, c->p.dim,
             c->p.outliers, c->p.sinks, dt_name(c->dt), c->H, c->p.static_scales ? " static" : "",
             ts, c->p.key_offsets ? " koff" : "", gen);
}

/* Dequantizes tile (ref bytes) into every dtype with the reference and with
 * every ISA; returns mismatches. */
static unsigned check_dequant(const unsigned char *tile, size_t len, uint32_t T, uint32_t D,
                              uint32_t H, uint32_t h, const char *label)
{
    static const kvs_dtype dts[] = {KVS_DTYPE_FP16, KVS_DTYPE_BF16, KVS_DTYPE_FP32};
    unsigned bad = 0;
    const size_t stride = (size_t)H * D;
    for (int di = 0; di < 3; di++) {
        kvs_dtype dt = dts[di];
        size_t bytes = (size_t)T * stride * esize(dt);
        size_t off = (size_t)h * D * esize(dt);
        unsigned char *want = xmalloc(bytes), *got = xmalloc(bytes);
        memset(want, SENTINEL, bytes);
        char err[KVS_ERR_LEN] = "";
        int rc_ref = kvs_tile_dequantize_ref(tile, len, dt, want + off, stride, err);
        for (int i = 0; i < g_nisa; i++) {
            CU_ASSERT_EQUAL_FATAL(kvs_cpu_isa_force(g_isas[i]), 0);
            memset(got, SENTINEL, bytes);
            int rc = kvs_tile_dequantize(tile, len, dt, got + off, stride, err);
            char what[32];
            snprintf(what, sizeof what, "dequantize->%s", dt_name(dt));
            g_compares++;
            if (rc != rc_ref) {
                if (g_reports++ < MAX_REPORT)
                    printf("\n  MISMATCH [%s] %s %s: rc %d, reference %d",
                           kvs_cpu_isa_name(g_isas[i]), what, label, rc, rc_ref);
                bad++;
            } else {
                bad += (unsigned)diff(got, want, bytes, what, kvs_cpu_isa_name(g_isas[i]), label,
                                      NULL);
            }
        }
        free(want);
        free(got);
    }
    return bad;
}

/* The whole check of one case; returns mismatches (also counted by CUnit). */
static unsigned check_case(tcase *c, int dequant)
{
    const kvs_tile_params *p = &c->p;
    const size_t size = kvs_tile_size(p), cap = size + GUARD;
    const size_t stride = (size_t)c->H * p->dim;
    const void *src = (const unsigned char *)c->src + (size_t)c->h * p->dim * esize(c->dt);
    unsigned char *want = xmalloc(cap), *got = xmalloc(cap);
    unsigned bad = 0;
    char err[KVS_ERR_LEN] = "";
    memset(want, SENTINEL, cap);
    int rc_ref = kvs_tile_quantize_ref(p, src, c->dt, stride, want, cap, err);
    CU_ASSERT_EQUAL(rc_ref, 0);
    g_cases++;
    for (int i = 0; i < g_nisa; i++) {
        CU_ASSERT_EQUAL_FATAL(kvs_cpu_isa_force(g_isas[i]), 0);
        memset(got, SENTINEL, cap);
        int rc = kvs_tile_quantize(p, src, c->dt, stride, got, cap, err);
        g_compares++;
        if (rc != rc_ref) {
            if (g_reports++ < MAX_REPORT)
                printf("\n  MISMATCH [%s] quantize %s: rc %d (%s), reference %d",
                       kvs_cpu_isa_name(g_isas[i]), c->label, rc, err, rc_ref);
            bad++;
            continue;
        }
        bad += (unsigned)diff(got, want, cap, "quantize", kvs_cpu_isa_name(g_isas[i]), c->label, p);
    }
    if (dequant && rc_ref == 0)
        bad += check_dequant(want, size, p->tokens, p->dim, c->H, c->h, c->label);
    free(want);
    free(got);
    CU_ASSERT_EQUAL(bad, 0);
    return bad;
}

/* ---- data ------------------------------------------------------------------------ */

enum gen {
    G_REAL,           /* gaussian; 3 key channels 10-20x; token 0 ~100x; rows vary */
    G_HOSTILE,        /* G_REAL with specials sprinkled in */
    G_ZERO,           /* all ±0 */
    G_CONST,          /* one value everywhere */
    G_HUGE,           /* small values and one huge one */
    G_TIES,           /* few magnitudes, many repeats, ±Inf and NaN repeats */
    G_BOUNDARY,       /* rounding boundaries after scaling (scale 1: amax = qmax) */
    G_RANDBITS,       /* random bit patterns: anything at all */
    G_COUNT,          /* the sets above rotate in the tests without key offsets */
    G_KOFF = G_COUNT, /* per channel: far off zero, constant, ±0, specials, few finite... */
    G_ALL
};
static const char *const gen_names[G_ALL] = {"real", "hostile",  "zero",     "const", "huge",
                                             "ties", "boundary", "randbits", "koff"};

/* Specials as raw bits of each dtype. */
static const uint32_t SPECIAL_F32[] = {0x7FC00000u,
                                       0xFFC00000u,
                                       0x7FC00001u,
                                       0xFFBFFFFFu,
                                       0x7F800001u /* sNaN */,
                                       0x7FA00000u,
                                       0x7F800000u,
                                       0xFF800000u,
                                       0x00000001u,
                                       0x80000001u,
                                       0x007FFFFFu,
                                       0x80400000u,
                                       0x477FE000u /* 65504 */,
                                       0xC77FE000u,
                                       0x477FF000u /* 65520 */,
                                       0x00000000u,
                                       0x80000000u,
                                       0x7F7FFFFFu,
                                       0xFF7FFFFFu,
                                       0x33800000u /* 2^-24 */,
                                       0x43E00000u /* 448 */,
                                       0x47600000u /* 57344 */};
static const uint32_t SPECIAL_F16[] = {0x7E00u, 0xFE00u, 0x7C01u /* sNaN */,
                                       0xFD55u, 0x7FFFu, 0x7C00u,
                                       0xFC00u, 0x7BFFu, 0xFBFFu,
                                       0x0001u, 0x8001u, 0x03FFu,
                                       0x0000u, 0x8000u, 0x5F00u /* 448 */,
                                       0x7B00u /* 57344 */};
static const uint32_t SPECIAL_BF16[] = {0x7FC0u, 0xFFC0u, 0x7F81u /* sNaN */,
                                        0xFF80u, 0x7F80u, 0x0001u,
                                        0x8001u, 0x007Fu, 0x7F7Fu,
                                        0xFF7Fu, 0x0000u, 0x8000u,
                                        0x477Fu, 0xC77Fu, 0x43E0u /* 448 */};

static uint32_t special_bits(kvs_dtype dt)
{
    if (dt == KVS_DTYPE_FP32)
        return SPECIAL_F32[rndn(sizeof SPECIAL_F32 / sizeof SPECIAL_F32[0])];
    if (dt == KVS_DTYPE_FP16)
        return SPECIAL_F16[rndn(sizeof SPECIAL_F16 / sizeof SPECIAL_F16[0])];
    return SPECIAL_BF16[rndn(sizeof SPECIAL_BF16 / sizeof SPECIAL_BF16[0])];
}

/* Values on the encode boundaries of a scheme, all |v| <= qmax: every FP8 value,
 * every midpoint and its fp32 neighbours; INT8 integers and half-integers. */
static size_t boundary_values(kvs_scheme s, float *v, size_t cap)
{
    size_t n = 0;
    if (s == KVS_SCHEME_INT8) {
        for (int i = -127; i <= 127 && n + 4 <= cap; i++) {
            float h = (float)i + 0.5f;
            v[n++] = (float)i;
            v[n++] = h;
            v[n++] = nextafterf(h, 1000.0f);
            v[n++] = nextafterf(h, -1000.0f);
        }
        return n;
    }
    kvq_fp8_format f = s == KVS_SCHEME_FP8_E5M2 ? KVQ_FP8_E5M2 : KVQ_FP8_E4M3;
    uint32_t maxc = s == KVS_SCHEME_FP8_E5M2 ? KVQ_E5M2_MAX_CODE : KVQ_E4M3_MAX_CODE;
    for (uint32_t c = 0; c <= maxc && n + 8 <= cap; c++) {
        float a = kvq_fp8_to_f32((uint8_t)c, f);
        v[n++] = a;
        v[n++] = -a;
        if (c < maxc) {
            float b = kvq_fp8_to_f32((uint8_t)(c + 1), f);
            float m = a + (b - a) * 0.5f; /* exact: FP8 values have few bits */
            v[n++] = m;
            v[n++] = -m;
            v[n++] = nextafterf(m, 0.0f);
            v[n++] = nextafterf(m, 1e9f);
            v[n++] = -nextafterf(m, 1e9f);
        }
    }
    /* below the smallest subnormal: half of it is a tie to 0 */
    float tiny = kvq_fp8_to_f32(1, f);
    if (n + 4 <= cap) {
        v[n++] = tiny * 0.5f;
        v[n++] = nextafterf(tiny * 0.5f, 1.0f);
        v[n++] = tiny * 0.25f;
        v[n++] = -tiny * 0.5f;
    }
    return n;
}

static float qmax_of(kvs_scheme s)
{
    return s == KVS_SCHEME_INT8 ? 127.0f : s == KVS_SCHEME_FP8_E5M2 ? 57344.0f : 448.0f;
}

/* A non-finite value of dt (NaN of either sign and payload, ±Inf), as bits. */
static uint32_t nonfinite_bits(kvs_dtype dt)
{
    static const uint32_t F32[] = {0x7FC00000u, 0xFFC00001u, 0x7F800001u, 0x7F800000u, 0xFF800000u};
    static const uint32_t F16[] = {0x7E00u, 0xFE01u, 0x7C01u, 0x7C00u, 0xFC00u};
    static const uint32_t BF16[] = {0x7FC0u, 0xFFC1u, 0x7F81u, 0x7F80u, 0xFF80u};
    uint32_t i = rndn(5);
    return dt == KVS_DTYPE_FP32 ? F32[i] : dt == KVS_DTYPE_FP16 ? F16[i] : BF16[i];
}

/* A denormal of dt (fp16 subnormal, bf16 / fp32 denormal), either sign, as bits. */
static uint32_t denormal_bits(kvs_dtype dt)
{
    uint32_t sign = rndn(2);
    if (dt == KVS_DTYPE_FP32)
        return (sign << 31) | (1u + rndn(0x7FFFFFu));
    if (dt == KVS_DTYPE_FP16)
        return (sign << 15) | (1u + rndn(0x3FFu));
    return (sign << 15) | (1u + rndn(0x7Fu));
}

/* G_KOFF, the data key offsets must get right: each channel of the tile
 * (tokens 0..T-1, sinks included) draws one of
 *   0 far off zero: bias +- spread (1000 +- 1, -65504 +- 0.01, ...; fp32 and
 *     bf16 also 1e5, -1e7, 1e30: beyond fp16, so the offset clamps to
 *     +-65504), 1 constant, 2 a +0 / -0 mix, 3 biased with specials (NaN,
 *     ±Inf, denormals, ±65504) sprinkled in, 4 nothing finite, 5 one or two
 *     finite values among NaN / Inf (fewer than k + 1), 6 denormals only,
 *     7 biased with a few huge values (the outliers-to-be), 8 three tied
 *     values (bias - 1, bias, bias + 1), 9 ±0 and ± the smallest denormal
 *     (only a zero's sign tells the lists apart), 10-11 small integers
 *     (-2..2 or -1..1), all finite: ties of |x - m| at every rank. */
static void fill_koff(tcase *c, void *tensor)
{
    const kvs_tile_params *p = &c->p;
    const uint32_t T = p->tokens, D = p->dim, H = c->H;
    const kvs_dtype dt = c->dt;
    static const float BIAS16[] = {1000.0f, -1000.0f, 60000.0f, -65504.0f,
                                   0.25f,   3.0e4f,   -2048.5f, 65504.0f};
    static const float BIAS32[] = {1.0e5f, -1.0e7f, 1.0e30f, 70000.0f, -65520.0f, 65519.0f};
    static const float SPREAD[] = {1.0f, 0.01f, 100.0f, 1.0e-6f};
    for (uint32_t d = 0; d < D; d++) {
        const uint32_t mode = rndn(12);
        const float bias = (dt != KVS_DTYPE_FP16 && rndn(3) == 0)
                               ? BIAS32[rndn(sizeof BIAS32 / sizeof BIAS32[0])]
                               : BIAS16[rndn(sizeof BIAS16 / sizeof BIAS16[0])];
        const float spread = SPREAD[rndn(4)];
        const float huge = dt == KVS_DTYPE_FP16 ? 65504.0f : 1.0e6f;
        const uint32_t nfin = 1 + rndn(2);
        for (uint32_t t = 0; t < T; t++) {
            size_t i = (size_t)t * H * D + (size_t)c->h * D + d;
            float x = 0.0f;
            switch (mode) {
            case 0:
                x = bias + gauss() * spread;
                break;
            case 1:
                x = bias;
                break;
            case 2:
                x = rndn(2) ? 0.0f : -0.0f;
                break;
            case 3:
                if (rndn(5) == 0) {
                    put_bits(tensor, dt, i,
                             rndn(3) ? special_bits(dt)
                                     : (rndn(2) ? nonfinite_bits(dt) : denormal_bits(dt)));
                    continue;
                }
                x = bias + gauss() * spread;
                break;
            case 4:
                put_bits(tensor, dt, i, nonfinite_bits(dt));
                continue;
            case 5:
                if (rndn(T) >= nfin) {
                    put_bits(tensor, dt, i, nonfinite_bits(dt));
                    continue;
                }
                x = bias + gauss() * spread;
                break;
            case 6:
                put_bits(tensor, dt, i, denormal_bits(dt));
                continue;
            case 7:
                x = rndn(16) == 0 ? (rndn(2) ? huge : -huge) : bias + gauss() * spread;
                break;
            case 8:
                x = bias + (float)((int)rndn(3) - 1);
                break;
            case 10:
                x = (float)((int)rndn(5) - 2);
                break;
            case 11:
                x = (float)((int)rndn(3) - 1);
                break;
            case 9: { /* ±0 or ± the smallest denormal (bits 1) */
                const uint32_t sign = rndn(2) ? (dt == KVS_DTYPE_FP32 ? 0x80000000u : 0x8000u) : 0u;
                put_bits(tensor, dt, i, sign | rndn(2));
                continue;
            }
            }
            put_val(tensor, dt, i, x);
        }
    }
}

/* Fills the tile part of a [T][H][D] tensor (head h) and garbage elsewhere. */
static void fill(tcase *c, void *tensor, enum gen g)
{
    const kvs_tile_params *p = &c->p;
    const uint32_t T = p->tokens, D = p->dim, H = c->H;
    const kvs_dtype dt = c->dt;
    const size_t n_all = (size_t)T * H * D;
    /* elements outside the tile: random bits that must never matter */
    for (size_t i = 0; i < n_all; i++)
        put_bits(tensor, dt, i, (uint32_t)rnd());
    if (g == G_KOFF) {
        fill_koff(c, tensor);
        return;
    }
    float chs[KVS_TILE_MAX_DIM];
    for (uint32_t d = 0; d < D; d++)
        chs[d] = 1.0f;
    for (int i = 0; i < 3; i++)
        chs[rndn(D)] = 10.0f + (float)rndn(11);
    const float cval = (float[]){1.5f, -7.0f, 448.0f, 3.0e-5f}[rndn(4)];
    const float huge = dt == KVS_DTYPE_FP16 ? 60000.0f : 1.0e30f;
    const size_t hpos = rndn(T * D);
    float bv[2048];
    size_t nb = boundary_values(p->scheme, bv, sizeof bv / sizeof bv[0]);
    const float qmax = qmax_of(p->scheme);
    const float big = dt == KVS_DTYPE_FP16 ? 65504.0f : 1.0e6f;
    for (uint32_t t = 0; t < T; t++) {
        float rs = 0.5f + (float)unif();
        for (uint32_t d = 0; d < D; d++) {
            size_t i = (size_t)t * H * D + (size_t)c->h * D + d;
            float x = 0.0f;
            switch (g) {
            case G_REAL:
            case G_HOSTILE:
                x = gauss() * chs[d] * rs * (t == 0 ? 100.0f : 1.0f);
                if (g == G_HOSTILE && rndn(12) == 0) {
                    put_bits(tensor, dt, i, special_bits(dt));
                    continue;
                }
                break;
            case G_ZERO:
                x = rndn(4) ? 0.0f : -0.0f;
                break;
            case G_CONST:
                x = cval;
                break;
            case G_HUGE:
                x = (size_t)t * D + d == hpos ? huge : gauss() * 1e-3f;
                break;
            case G_TIES: {
                static const float tv[] = {0.0f, 1.0f, -1.0f, 2.0f, -2.0f, 2.0f, -2.0f};
                uint32_t r = rndn(24);
                if (r == 0)
                    x = INFINITY;
                else if (r == 1)
                    x = -INFINITY;
                else if (r == 2) {
                    put_bits(tensor, dt, i, dt == KVS_DTYPE_FP32 ? 0x7FC00000u : 0x7E00u);
                    continue;
                } else
                    x = tv[rndn(7)];
                break;
            }
            case G_BOUNDARY: {
                /* Per group: k values above qmax (the outliers), one ±qmax (the
                 * amax, so scale = 1 and inv = 1), then boundary values. The
                 * group position is the token for K, the channel for V. */
                uint32_t pos = p->kind == KVS_TILE_K ? t - (t >= p->sinks ? p->sinks : 0) : d;
                if (p->kind == KVS_TILE_K && t < p->sinks)
                    x = bv[rndn((uint32_t)nb)];
                else if (pos < p->outliers)
                    x = rndn(2) ? big : -big;
                else if (pos == p->outliers)
                    x = rndn(2) ? qmax : -qmax;
                else
                    x = bv[rndn((uint32_t)nb)];
                if (p->static_scales)
                    x = bv[rndn((uint32_t)nb)];
                break;
            }
            case G_RANDBITS:
                put_bits(tensor, dt, i, (uint32_t)rnd());
                continue;
            default:
                break;
            }
            put_val(tensor, dt, i, x);
        }
    }
}

/* Static scales: powers of two (exact boundaries), 0, subnormal, ordinary. */
static void fill_static(float *sc, uint32_t G, enum gen g)
{
    for (uint32_t i = 0; i < G; i++) {
        if (g == G_BOUNDARY) {
            sc[i] = 1.0f;
            continue;
        }
        switch (rndn(8)) {
        case 0:
            sc[i] = 0.0f;
            break;
        case 1:
            sc[i] = f_of(0x00000010u);
            break; /* subnormal: inv 0 */
        case 2:
            sc[i] = FLT_MIN;
            break;
        case 3:
            sc[i] = 0.125f;
            break;
        case 4:
            sc[i] = 3.0e4f;
            break;
        default:
            sc[i] = (float)(unif() * 0.5 + 1e-3);
            break;
        }
    }
}

/* Runs one case: builds the tensor, fills it, checks; tensor_scale ts (0: off). */
static unsigned run_case_full(kvs_scheme s, kvs_tile_kind kind, uint32_t T, uint32_t D, uint32_t k,
                              uint32_t S, kvs_dtype dt, uint32_t H, int statics, enum gen g,
                              int dequant, float ts, uint32_t koff)
{
    tcase c;
    float sc[KVS_TILE_MAX_TOKENS > KVS_TILE_MAX_DIM ? KVS_TILE_MAX_TOKENS : KVS_TILE_MAX_DIM];
    memset(&c, 0, sizeof c);
    c.p.scheme = s;
    c.p.kind = kind;
    c.p.tokens = T;
    c.p.dim = D;
    c.p.outliers = k;
    c.p.sinks = S;
    c.p.tensor_scale = ts;
    c.p.key_offsets = koff;
    c.dt = dt;
    c.H = H;
    c.h = H > 1 ? H / 2 : 0;
    if (statics) { /* the fp16 scheme ignores them but flags the header */
        fill_static(sc, kind == KVS_TILE_K ? D : T, g);
        c.p.static_scales = sc;
    }
    void *tensor = xmalloc((size_t)T * H * D * esize(dt));
    c.src = tensor;
    fill(&c, tensor, g);
    label_of(&c, gen_names[g]);
    unsigned bad = check_case(&c, dequant);
    free(tensor);
    return bad;
}

static unsigned run_case_ts(kvs_scheme s, kvs_tile_kind kind, uint32_t T, uint32_t D, uint32_t k,
                            uint32_t S, kvs_dtype dt, uint32_t H, int statics, enum gen g,
                            int dequant, float ts)
{
    return run_case_full(s, kind, T, D, k, S, dt, H, statics, g, dequant, ts, 0);
}

static unsigned run_case(kvs_scheme s, kvs_tile_kind kind, uint32_t T, uint32_t D, uint32_t k,
                         uint32_t S, kvs_dtype dt, uint32_t H, int statics, enum gen g, int dequant)
{
    return run_case_ts(s, kind, T, D, k, S, dt, H, statics, g, dequant, 0.0f);
}

static void note_isas(void)
{
    static int done;
    if (done)
        return;
    done = 1;
    for (int i = 0; i < g_nisa; i++)
        printf("%s%s", i ? ", " : "\n  ISAs exercised: ", kvs_cpu_isa_name(g_isas[i]));
}

/* ---- tests ----------------------------------------------------------------------- */

/* Prints the cases a test ran and its CPU time (for keeping the suite fast). */
static void report(const char *what, unsigned long cases0, clock_t t0)
{
    printf("\n  [%s: %lu cases, %.1f s]", what, g_cases - cases0,
           (double)(clock() - t0) / CLOCKS_PER_SEC);
}

static const kvs_scheme SCHEMES[] = {KVS_SCHEME_FP16, KVS_SCHEME_FP8_E4M3, KVS_SCHEME_FP8_E5M2,
                                     KVS_SCHEME_INT8};
static const kvs_dtype DTYPES[] = {KVS_DTYPE_FP16, KVS_DTYPE_BF16, KVS_DTYPE_FP32};
static const uint32_t KS[] = {0, 1, 2, 4};
static const uint32_t SS[] = {0, 1, 4};

/* Every combination on the small shapes, four data sets each. */
static void test_small_cross_product(void)
{
    const unsigned long cases0 = g_cases;
    const clock_t t0 = clock();
    static const uint32_t TS[] = {1, 16}, DS[] = {8, 64};
    unsigned bad = 0, n = 0;
    g_rng = 0x5EED0001u;
    note_isas();
    for (int ti = 0; ti < 2; ti++)
        for (int di = 0; di < 2; di++)
            for (int si = 0; si < 4; si++)
                for (int kind = 0; kind < 2; kind++)
                    for (int ki = 0; ki < 4; ki++)
                        for (int ssi = 0; ssi < 3; ssi++)
                            for (int dti = 0; dti < 3; dti++) {
                                kvs_scheme s = SCHEMES[si];
                                uint32_t k = KS[ki], S = SS[ssi];
                                if (s == KVS_SCHEME_FP16 && (k || S))
                                    continue;
                                if (S > TS[ti])
                                    continue;
                                /* four of the eight data sets, rotating; one in
                                 * two with static scales, one in two strided */
                                for (unsigned r = 0; r < 4; r++) {
                                    enum gen g = (enum gen)((n + 2 * r + (r & 1)) % G_COUNT);
                                    uint32_t H = ((n + r) & 1) ? 3 : 1;
                                    int statics = (n + r / 2) % 2 == 1;
                                    bad += run_case(s, (kvs_tile_kind)kind, TS[ti], DS[di], k, S,
                                                    DTYPES[dti], H, statics, g, 1);
                                }
                                n++;
                            }
    report("small cross product", cases0, t0);
    CU_ASSERT_EQUAL(bad, 0);
}

/* Large shapes: every scheme x kind x dtype on every (T, D) not covered above,
 * twice (once from 64K elements up), with k, S, stride, scales and data drawn
 * with a fixed seed. Dequantization is checked on half of them. */
static void test_large_sample(void)
{
    const unsigned long cases0 = g_cases;
    const clock_t t0 = clock();
    static const uint32_t TS[] = {1, 16, 256, 1024}, DS[] = {8, 64, 128, 256};
    unsigned bad = 0, n = 0;
    g_rng = 0x5EED0002u;
    for (int ti = 0; ti < 4; ti++)
        for (int di = 0; di < 4; di++) {
            uint32_t T = TS[ti], D = DS[di];
            if (T <= 16 && D <= 64)
                continue; /* the cross product has these */
            for (int si = 0; si < 4; si++)
                for (int kind = 0; kind < 2; kind++)
                    for (int dti = 0; dti < 3; dti++) {
                        kvs_scheme s = SCHEMES[si];
                        /* two draws of k, S, stride, scales and data each
                         * (one for the biggest tiles, to keep the suite fast) */
                        const int draws = (size_t)T * D >= 65536u ? 1 : 2;
                        for (int r = 0; r < draws; r++) {
                            uint32_t k = s == KVS_SCHEME_FP16 ? 0 : KS[rndn(4)];
                            uint32_t S = s == KVS_SCHEME_FP16 ? 0 : SS[rndn(3)];
                            if (S > T)
                                S = T;
                            enum gen g = (enum gen)((n + 3 * (unsigned)r) % G_COUNT);
                            bad += run_case(s, (kvs_tile_kind)kind, T, D, k, S, DTYPES[dti],
                                            rndn(3) ? 1 : 3, rndn(4) == 0, g, (n + r) % 2 == 0);
                        }
                        n++;
                    }
        }
    /* the common case, in full: fp16 source, D=128, k=2, S in {0, 4}, e4m3 and int8 */
    for (int si = 1; si < 4; si += 2)
        for (int kind = 0; kind < 2; kind++)
            for (uint32_t S = 0; S <= 4; S += 4) {
                bad += run_case(SCHEMES[si], (kvs_tile_kind)kind, 256, 128, 2, S, KVS_DTYPE_FP16, 8,
                                0, G_REAL, 1);
                bad += run_case(SCHEMES[si], (kvs_tile_kind)kind, 256, 128, 2, S, KVS_DTYPE_FP16, 1,
                                0, G_HOSTILE, 1);
            }
    report("large sample", cases0, t0);
    CU_ASSERT_EQUAL(bad, 0);
}

/* Vector tails (D not a multiple of 8 or 16), k beyond the register path
 * (5..16, also k > group length), S = T, and the largest limits. */
static void test_odd_shapes(void)
{
    const unsigned long cases0 = g_cases;
    const clock_t t0 = clock();
    static const uint32_t DS[] = {1, 3, 7, 9, 13, 17, 24, 31, 33, 100, 1000};
    static const uint32_t TS[] = {1, 2, 5, 33};
    unsigned bad = 0, n = 0;
    g_rng = 0x5EED0003u;
    for (int di = 0; di < 11; di++)
        for (int ti = 0; ti < 4; ti++) {
            uint32_t D = DS[di], T = TS[ti];
            for (int si = 0; si < 4; si++) {
                kvs_scheme s = SCHEMES[si];
                kvs_tile_kind kind = (kvs_tile_kind)((n / 4) & 1);
                uint32_t k = s == KVS_SCHEME_FP16 ? 0 : (uint32_t)(n % 17);
                uint32_t S = s == KVS_SCHEME_FP16 ? 0 : rndn(T + 1);
                if (S > 64)
                    S = 64;
                bad += run_case(s, kind, T, D, k, S, DTYPES[n % 3], 1 + (n & 1), n % 5 == 2,
                                (enum gen)(n % G_COUNT), 1);
                n++;
            }
        }
    /* k = 16, S = 64, D = 1024: every upper bound at once (V and K) */
    bad += run_case(KVS_SCHEME_FP8_E4M3, KVS_TILE_V, 80, 1024, 16, 64, KVS_DTYPE_FP32, 1, 0,
                    G_HOSTILE, 1);
    bad += run_case(KVS_SCHEME_INT8, KVS_TILE_K, 80, 1000, 16, 64, KVS_DTYPE_BF16, 2, 0, G_TIES, 1);
    report("odd shapes", cases0, t0);
    CU_ASSERT_EQUAL(bad, 0);
}

/* kvs_tile_params.tensor_scale (group scales aligned to a per-tensor scale):
 * every scheme (int8 and fp16 ignore it, the FP8 schemes align), both kinds,
 * every source dtype and every data set, dynamic and static group scales,
 * with tensor scales that are ordinary, exact fp16, not fp16 (rounded up),
 * fp16 subnormal (odd significands: the smallest multiples are bounded by
 * 2^-24), below fp16's range (-> 2^-24), at and beyond 65504 (-> 65504: group
 * scales clamp there) and FLT_MAX; all-zero tiles, groups far above and far
 * below the tensor scale (G_HUGE, G_RANDBITS). */
static void test_tensor_scale(void)
{
    const unsigned long cases0 = g_cases;
    const clock_t t0 = clock();
    static const float TSV[] = {
        0.37f,        /* ordinary, not an fp16 value: rounded up */
        1.0f,         /* exact */
        0x1.8p-24f,   /* fp16 subnormal 3 * 2^-24 */
        0x1.ff8p-15f, /* largest fp16 subnormal 0x03FF */
        0x1p-14f,     /* smallest fp16 normal */
        1.0e-30f,     /* below fp16: 2^-24 */
        FLT_MIN,      /* likewise */
        0x1.ffcp15f,  /* 65504 */
        1.0e6f,       /* beyond fp16: 65504 */
        FLT_MAX,      /* likewise */
        0x1.554p-3f,  /* an fp16 value with a long significand */
        2.5e-5f,      /* small normal fp32, fp16 subnormal range */
    };
    const size_t NTS = sizeof TSV / sizeof TSV[0];
    static const enum gen GENS[] = {G_REAL,     G_HOSTILE,  G_ZERO,  G_HUGE,
                                    G_RANDBITS, G_BOUNDARY, G_CONST, G_TIES};
    unsigned bad = 0, n = 0;
    g_rng = 0x5EED0007u;
    for (size_t ti = 0; ti < NTS; ti++)
        for (int si = 0; si < 4; si++)
            for (int kind = 0; kind < 2; kind++)
                for (int dti = 0; dti < 3; dti++) {
                    kvs_scheme s = SCHEMES[si];
                    /* a small and a mid shape each; the data set rotates */
                    uint32_t k = s == KVS_SCHEME_FP16 ? 0 : KS[n % 4];
                    uint32_t S = s == KVS_SCHEME_FP16 ? 0 : SS[n % 3];
                    enum gen g = GENS[n % 8];
                    bad += run_case_ts(s, (kvs_tile_kind)kind, 16, 24, k, S, DTYPES[dti], 1 + n % 2,
                                       n % 3 == 1, g, n % 2 == 0, TSV[ti]);
                    g = GENS[(n + 3) % 8];
                    bad += run_case_ts(s, (kvs_tile_kind)kind, 64, 72, k, S > 0 ? 1 : 0,
                                       DTYPES[dti], 2, n % 4 == 2, g, n % 2 == 1, TSV[ti]);
                    n++;
                }
    /* the deployment shape: fp16 source, T = 256, D = 128, defaults (3, 2), S = 1 */
    for (int si = 1; si < 3; si++)
        for (int kind = 0; kind < 2; kind++) {
            uint32_t k = kind == KVS_TILE_K ? 3 : 2;
            bad += run_case_ts(SCHEMES[si], (kvs_tile_kind)kind, 256, 128, k, 1, KVS_DTYPE_FP16, 4,
                               0, G_REAL, 1, 0.5f);
            bad += run_case_ts(SCHEMES[si], (kvs_tile_kind)kind, 256, 128, k, 1, KVS_DTYPE_FP16, 1,
                               1, G_HOSTILE, 1, 3.0e-3f);
            bad += run_case_ts(SCHEMES[si], (kvs_tile_kind)kind, 256, 128, k, 0, KVS_DTYPE_FP32, 1,
                               0, G_ZERO, 1, 0.5f);
        }
    report("tensor scale", cases0, t0);
    CU_ASSERT_EQUAL(bad, 0);
}

/* All 65,536 fp16 and bf16 patterns through quantize (fp16 scheme and 8-bit
 * with sinks) and dequantize: conversions, NaN quieting, denormals. */
static void test_all_16bit_patterns(void)
{
    const unsigned long cases0 = g_cases;
    const clock_t t0 = clock();
    unsigned bad = 0;
    uint16_t *x = xmalloc(65536 * 2);
    for (uint32_t i = 0; i < 65536; i++)
        x[i] = (uint16_t)i;
    for (int dti = 0; dti < 2; dti++) {
        for (int si = 0; si < 4; si++) {
            tcase c;
            memset(&c, 0, sizeof c);
            c.p.scheme = SCHEMES[si];
            c.p.kind = (kvs_tile_kind)(si & 1);
            c.p.tokens = si ? 1024 : 256;
            c.p.dim = si ? 64 : 256;
            c.p.outliers = si ? 2 : 0;
            c.p.sinks = si ? 64 : 0; /* 64 x 64 sink values: a 1/16 sample of patterns */
            c.dt = DTYPES[dti];
            c.H = 1;
            c.src = x;
            label_of(&c, "all16");
            bad += check_case(&c, 1);
        }
    }
    free(x);
    report("all 16bit patterns", cases0, t0);
    CU_ASSERT_EQUAL(bad, 0);
}

/* A NaN code times a NaN scale would have no defined payload (IEEE does not
 * say whose NaN the product keeps), so a sealed tile with a NaN, infinite or
 * negative scale is refused by every decoder before any output is written. */
static void test_nonfinite_scales_refused(void)
{
    for (int si = 1; si < 3; si++) {
        kvs_tile_params p = {SCHEMES[si], KVS_TILE_K, 4, 20, 0, 0, NULL, 0.0f, 0};
        size_t size = kvs_tile_size(&p);
        unsigned char tile[512];
        float src[80] = {0}, out[80];
        CU_ASSERT_EQUAL_FATAL(kvs_tile_quantize_ref(&p, src, KVS_DTYPE_FP32, 20, tile, size, NULL),
                              0);
        kvs_tile_layout l;
        kvs_tile_layout_of(p.scheme, p.kind, 4, 20, 0, 0, &l);
        unsigned char *pay = tile + sizeof(kvs_tile_hdr);
        for (int i = 0; i < 80; i++)
            pay[l.codes + i] = i % 2 ? 0x7F : 0xFF;
        for (int g = 0; g < 20; g++) {
            uint16_t b = (uint16_t)(0x7C23u | (g % 2 ? 0x8000u : 0u)); /* signalling fp16 NaN */
            memcpy(pay + l.scales + 2 * g, &b, 2);
        }
        CU_ASSERT_EQUAL_FATAL(kvs_tile_seal(tile, size, NULL), 0);
        char err[KVS_ERR_LEN];
        for (int e = 0; e < 80; e++)
            out[e] = 1.0f;
        CU_ASSERT_EQUAL(kvs_tile_dequantize_ref(tile, size, KVS_DTYPE_FP32, out, 20, err),
                        KVS_EFORMAT);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "scale"));
        for (int i = 0; i < g_nisa; i++) {
            CU_ASSERT_EQUAL_FATAL(kvs_cpu_isa_force(g_isas[i]), 0);
            CU_ASSERT_EQUAL(kvs_tile_dequantize(tile, size, KVS_DTYPE_FP32, out, 20, err),
                            KVS_EFORMAT);
            for (int e = 0; e < 80; e++)
                CU_ASSERT_EQUAL(out[e], 1.0f); /* nothing written */
        }
        /* +Inf and a negative scale (-0 included) are refused too; +0, a
         * subnormal and the largest finite fp16 are not. */
        const uint16_t refused[] = {0x7C00u, 0xFC00u, 0xBC00u, 0x8000u, 0xFBFFu};
        const uint16_t accepted[] = {0x0000u, 0x0001u, 0x3C00u, 0x7BFFu};
        for (int r = 0; r < 5; r++) {
            memcpy(pay + l.scales, &refused[r], 2);
            CU_ASSERT_EQUAL_FATAL(kvs_tile_seal(tile, size, NULL), 0);
            CU_ASSERT_EQUAL(kvs_tile_check(tile, size, NULL, NULL), KVS_EFORMAT);
        }
        for (int g = 0; g < 20; g++)
            memcpy(pay + l.scales + 2 * g, &accepted[g % 4], 2);
        CU_ASSERT_EQUAL_FATAL(kvs_tile_seal(tile, size, NULL), 0);
        CU_ASSERT_EQUAL(kvs_tile_check(tile, size, NULL, NULL), 0);
    }
}

/* Dequantization of sealed tiles whose payload is arbitrary: every code byte,
 * scales that are zero, subnormal or small (negative, NaN and infinite scales
 * are refused by kvs_tile_check: test_nonfinite_scales_refused), repeated and empty
 * outlier indices, every fp16 pattern in sinks and outlier values. */
static void test_dequant_sealed_garbage(void)
{
    unsigned bad = 0;
    g_rng = 0x5EED0005u;
    for (int iter = 0; iter < 48; iter++) {
        kvs_scheme s = SCHEMES[1 + iter % 3];
        kvs_tile_kind kind = (kvs_tile_kind)((iter / 3) & 1);
        uint32_t T = (uint32_t[]){16, 33, 256}[iter % 3 == 2 ? 2 : rndn(2)];
        uint32_t D = (uint32_t[]){8, 64, 128, 13}[rndn(4)];
        uint32_t k = rndn(5), S = rndn(5);
        kvs_tile_params p = {s, kind, T, D, k, S, NULL, 0.0f, 0};
        size_t size = kvs_tile_size(&p);
        unsigned char *tile = xmalloc(size);
        float *src = xmalloc((size_t)T * D * 4);
        for (size_t i = 0; i < (size_t)T * D; i++)
            src[i] = gauss();
        CU_ASSERT_EQUAL_FATAL(kvs_tile_quantize_ref(&p, src, KVS_DTYPE_FP32, D, tile, size, NULL),
                              0);
        kvs_tile_layout l;
        kvs_tile_layout_of(s, kind, T, D, k, S, &l);
        unsigned char *pay = tile + sizeof(kvs_tile_hdr);
        for (size_t i = 0; i < (size_t)T * D; i++)
            pay[l.codes + i] = (unsigned char)rnd();
        for (uint32_t g = 0; g < l.groups; g++) {
            uint16_t b;
            switch (rndn(6)) {
            case 0:
            case 1:
                b = 0;
                break; /* a zero-scale group */
            case 2:
                b = 0x7BFFu; /* 65504, the largest fp16 */
                break;
            case 3:
                b = (uint16_t)rndn(0x400u);
                break; /* subnormal */
            default:
                b = kvq_f32_to_fp16((float)unif() * 0.01f);
            }
            memcpy(pay + l.scales + 2u * g, &b, 2);
            uint32_t span = kind == KVS_TILE_K ? T : D, lo = kind == KVS_TILE_K ? S : 0;
            for (uint32_t q = 0; q < k; q++) {
                int sink_row = kind == KVS_TILE_V && g < S;
                uint32_t index = (sink_row || lo >= span || rndn(5) == 0)
                                     ? KVS_OUTLIER_EMPTY
                                     : lo + rndn(q > 0 && rndn(2) ? 1 : span - lo);
                kvs_outlier_put(pay + l.outliers + ((size_t)g * k + q) * l.entry, l.entry, index,
                                (uint16_t)rnd());
            }
        }
        for (size_t i = 0; i < (size_t)S * D; i++) {
            uint16_t h = (uint16_t)rnd();
            memcpy(pay + l.sinks + 2 * i, &h, 2);
        }
        char err[KVS_ERR_LEN];
        CU_ASSERT_EQUAL_FATAL(kvs_tile_seal(tile, size, err), 0);
        CU_ASSERT_EQUAL_FATAL(kvs_tile_check(tile, size, NULL, err), 0);
        char label[96];
        snprintf(label, sizeof label, "garbage %s %s T=%u D=%u k=%u S=%u", scheme_name(s),
                 kind == KVS_TILE_K ? "K" : "V", T, D, k, S);
        bad += check_dequant(tile, size, T, D, 1 + (iter & 1), iter & 1, label);
        free(tile);
        free(src);
    }
    CU_ASSERT_EQUAL(bad, 0);
}

/* The fast path takes buffers at any alignment (the reference needs natural
 * alignment, so this compares the fast path with itself at offset 0). */
static void test_misaligned_buffers(void)
{
    g_rng = 0x5EED0006u;
    const uint32_t T = 33, D = 100;
    const size_t n = (size_t)T * D;
    unsigned char *srcbuf = xmalloc(n * 4 + 8);
    for (int si = 1; si < 4; si++)
        for (int kind = 0; kind < 2; kind++) {
            kvs_tile_params p = {SCHEMES[si], (kvs_tile_kind)kind, T, D, 2, 3, NULL, 0.0f, 0};
            size_t size = kvs_tile_size(&p);
            unsigned char *a = xmalloc(size + 8), *b = xmalloc(size + 8);
            float *src = (float *)(void *)(srcbuf + 4); /* aligned view, filled below */
            for (size_t i = 0; i < n; i++)
                src[i] = gauss() * (i % D == 5 ? 20.0f : 1.0f);
            for (int i = 0; i < g_nisa; i++) {
                CU_ASSERT_EQUAL_FATAL(kvs_cpu_isa_force(g_isas[i]), 0);
                CU_ASSERT_EQUAL_FATAL(kvs_tile_quantize(&p, src, KVS_DTYPE_FP32, D, a, size, NULL),
                                      0);
                for (unsigned off = 1; off < 4; off++) {
                    memset(b, SENTINEL, size + 8);
                    CU_ASSERT_EQUAL(
                        kvs_tile_quantize(&p, src, KVS_DTYPE_FP32, D, b + off, size, NULL), 0);
                    CU_ASSERT_EQUAL(memcmp(a, b + off, size), 0);
                    /* dequantize from a misaligned tile into a misaligned fp32 view */
                    float *want = xmalloc(n * 4);
                    unsigned char *got = xmalloc(n * 4 + 8);
                    CU_ASSERT_EQUAL(kvs_tile_dequantize(a, size, KVS_DTYPE_FP32, want, D, NULL), 0);
                    CU_ASSERT_EQUAL(
                        kvs_tile_dequantize(b + off, size, KVS_DTYPE_FP32, got + off, D, NULL), 0);
                    CU_ASSERT_EQUAL(memcmp(want, got + off, n * 4), 0);
                    free(want);
                    free(got);
                }
            }
            free(a);
            free(b);
        }
    free(srcbuf);
}

/* ---- key offsets (kv_format.h rule 5) ------------------------------------------- */

static const uint32_t KOFF_KS[] = {0, 1, 2, 3, 4, 5, 8, 16};
#define N_KOFF_KS (sizeof KOFF_KS / sizeof KOFF_KS[0])

/* A K tile with key offsets: the whole tile and its decode in every dtype. */
static unsigned run_koff(kvs_scheme s, uint32_t T, uint32_t D, uint32_t k, uint32_t S, kvs_dtype dt,
                         uint32_t H, int statics, enum gen g, int dequant, float ts)
{
    return run_case_full(s, KVS_TILE_K, T, D, k, S, dt, H, statics, g, dequant, ts, 1);
}

/* Every 8-bit scheme x k in KOFF_KS x S in {0, 1, 4} (capped at T: S = T
 * leaves no token to offset) x source dtype on the small shapes; twice each:
 * G_KOFF and one of the other data sets in turn, now and then with static
 * scales or a tensor scale (both apply to the shifted values). */
static void test_koff_cross_product(void)
{
    const unsigned long cases0 = g_cases;
    const clock_t t0 = clock();
    static const uint32_t TS[] = {1, 16}, DS[] = {8, 64};
    unsigned bad = 0, n = 0;
    g_rng = 0x5EED0101u;
    for (int ti = 0; ti < 2; ti++)
        for (int di = 0; di < 2; di++)
            for (int si = 1; si < 4; si++)
                for (size_t ki = 0; ki < N_KOFF_KS; ki++)
                    for (int ssi = 0; ssi < 3; ssi++)
                        for (int dti = 0; dti < 3; dti++) {
                            uint32_t S = SS[ssi] > TS[ti] ? TS[ti] : SS[ssi];
                            enum gen other = (enum gen)(n % G_COUNT);
                            float ts = n % 6 == 5 ? 0.37f : 0.0f;
                            bad +=
                                run_koff(SCHEMES[si], TS[ti], DS[di], KOFF_KS[ki], S, DTYPES[dti],
                                         (n & 1) ? 3 : 1, n % 4 == 3, G_KOFF, 1, ts);
                            bad +=
                                run_koff(SCHEMES[si], TS[ti], DS[di], KOFF_KS[ki], S, DTYPES[dti],
                                         (n & 2) ? 3 : 1, n % 5 == 4, other, 1, 0.0f);
                            n++;
                        }
    report("key offsets: cross product", cases0, t0);
    CU_ASSERT_EQUAL(bad, 0);
}

/* Every (T, D) with T in {1, 16, 256, 1024}, D in {8, 64, 128, 256} not in
 * the cross product, every scheme and source dtype; k walks KOFF_KS, S walks
 * {0, 1, 4, 64} (capped at T), the data set alternates G_KOFF with the
 * others. Dequantization always. */
static void test_koff_large(void)
{
    const unsigned long cases0 = g_cases;
    const clock_t t0 = clock();
    static const uint32_t TS[] = {1, 16, 256, 1024}, DS[] = {8, 64, 128, 256};
    static const uint32_t SK[] = {0, 1, 4, 64};
    unsigned bad = 0, n = 0;
    g_rng = 0x5EED0102u;
    for (int ti = 0; ti < 4; ti++)
        for (int di = 0; di < 4; di++) {
            uint32_t T = TS[ti], D = DS[di];
            if (T <= 16 && D <= 64)
                continue;
            for (int si = 1; si < 4; si++)
                for (int dti = 0; dti < 3; dti++) {
                    uint32_t k = KOFF_KS[(n * 3 + (uint32_t)ti) % N_KOFF_KS];
                    uint32_t S = SK[n % 4] > T ? T : SK[n % 4];
                    enum gen g = n % 2 ? G_KOFF : (enum gen)((n / 2) % G_COUNT);
                    bad += run_koff(SCHEMES[si], T, D, k, S, DTYPES[dti], rndn(3) ? 1 : 2,
                                    rndn(6) == 0, g, 1, 0.0f);
                    n++;
                }
        }
    /* the deployment shape: fp16 source, T = 256, D = 128, k = 3, S in {0, 1} */
    for (int si = 1; si < 4; si++)
        for (uint32_t S = 0; S <= 1; S++) {
            bad += run_koff(SCHEMES[si], 256, 128, 3, S, KVS_DTYPE_FP16, 8, 0, G_REAL, 1, 0.0f);
            bad += run_koff(SCHEMES[si], 256, 128, 3, S, KVS_DTYPE_FP16, 1, 0, G_KOFF, 1, 0.0f);
        }
    report("key offsets: large", cases0, t0);
    CU_ASSERT_EQUAL(bad, 0);
}

/* Vector tails (D not a multiple of 8 or 16) with every k up to 16, also
 * k >= the group's length, and S up to T. */
static void test_koff_odd_shapes(void)
{
    const unsigned long cases0 = g_cases;
    const clock_t t0 = clock();
    static const uint32_t DS[] = {1, 3, 7, 9, 13, 17, 24, 31, 33, 100, 1000};
    static const uint32_t TS[] = {1, 2, 5, 33};
    unsigned bad = 0, n = 0;
    g_rng = 0x5EED0103u;
    for (int di = 0; di < 11; di++)
        for (int ti = 0; ti < 4; ti++)
            for (int si = 1; si < 4; si++) {
                uint32_t D = DS[di], T = TS[ti];
                uint32_t k = n % 17, S = rndn(T + 1);
                enum gen g = n % 3 ? G_KOFF : (enum gen)(n % G_COUNT);
                bad += run_koff(SCHEMES[si], T, D, k, S, DTYPES[n % 3], 1 + (n & 1), n % 5 == 2, g,
                                1, 0.0f);
                n++;
            }
    bad += run_koff(KVS_SCHEME_INT8, 80, 1000, 16, 64, KVS_DTYPE_BF16, 2, 0, G_KOFF, 1, 0.0f);
    bad += run_koff(KVS_SCHEME_FP8_E5M2, 1024, 1024, 16, 0, KVS_DTYPE_FP32, 1, 0, G_KOFF, 1, 0.0f);
    report("key offsets: odd shapes", cases0, t0);
    CU_ASSERT_EQUAL(bad, 0);
}

/* The fast path at any alignment: source views and tiles 1..3 bytes off,
 * against the reference on aligned copies; then decoding the misaligned tile
 * into a misaligned view of every dtype. */
static void test_koff_misaligned(void)
{
    static const kvs_dtype dts[] = {KVS_DTYPE_FP16, KVS_DTYPE_BF16, KVS_DTYPE_FP32};
    const uint32_t T = 37, D = 100, k = 3, S = 1;
    const size_t n = (size_t)T * D;
    unsigned bad = 0;
    g_rng = 0x5EED0104u;
    for (int si = 1; si < 4; si++)
        for (int dti = 0; dti < 3; dti++) {
            const kvs_dtype dt = DTYPES[dti];
            kvs_tile_params p = {SCHEMES[si], KVS_TILE_K, T, D, k, S, NULL, 0.0f, 1};
            tcase c;
            memset(&c, 0, sizeof c);
            c.p = p;
            c.dt = dt;
            c.H = 1;
            void *src = xmalloc(n * esize(dt));
            fill(&c, src, si == 2 ? G_HOSTILE : G_KOFF);
            const size_t size = kvs_tile_size(&p);
            unsigned char *want = xmalloc(size), *sbuf = xmalloc(n * esize(dt) + 8),
                          *obuf = xmalloc(size + 8);
            CU_ASSERT_EQUAL_FATAL(kvs_tile_quantize_ref(&p, src, dt, D, want, size, NULL), 0);
            for (int i = 0; i < g_nisa; i++) {
                CU_ASSERT_EQUAL_FATAL(kvs_cpu_isa_force(g_isas[i]), 0);
                for (unsigned off = 1; off < 4; off++) {
                    memcpy(sbuf + off, src, n * esize(dt));
                    memset(obuf, SENTINEL, size + 8);
                    CU_ASSERT_EQUAL(
                        kvs_tile_quantize(&p, sbuf + off, dt, D, obuf + (4 - off), size, NULL), 0);
                    bad += memcmp(obuf + (4 - off), want, size) != 0;
                    bad += obuf[4 - off + size] != SENTINEL;
                    for (int di = 0; di < 3; di++) {
                        const size_t bytes = n * esize(dts[di]);
                        unsigned char *dw = xmalloc(bytes), *dg = xmalloc(bytes + 8);
                        CU_ASSERT_EQUAL(kvs_tile_dequantize_ref(want, size, dts[di], dw, D, NULL),
                                        0);
                        CU_ASSERT_EQUAL(
                            kvs_tile_dequantize(obuf + (4 - off), size, dts[di], dg + off, D, NULL),
                            0);
                        bad += memcmp(dw, dg + off, bytes) != 0;
                        free(dw);
                        free(dg);
                    }
                }
            }
            free(src);
            free(want);
            free(sbuf);
            free(obuf);
        }
    if (bad)
        printf("\n  key offsets, misaligned: %u mismatches", bad);
    CU_ASSERT_EQUAL(bad, 0);
}

/* Decoding sealed key-offset tiles whose payload is arbitrary: every code
 * byte, scales zero, subnormal or large, every finite fp16 offset (±65504,
 * subnormals, -0), repeated and empty outlier indices, random sinks. */
static void test_koff_dequant_garbage(void)
{
    unsigned bad = 0;
    g_rng = 0x5EED0105u;
    for (int iter = 0; iter < 48; iter++) {
        kvs_scheme s = SCHEMES[1 + iter % 3];
        uint32_t T = (uint32_t[]){16, 33, 256}[iter % 3 == 2 ? 2 : rndn(2)];
        uint32_t D = (uint32_t[]){8, 64, 128, 13}[rndn(4)];
        uint32_t k = KOFF_KS[rndn(N_KOFF_KS)], S = rndn(5);
        kvs_tile_params p = {s, KVS_TILE_K, T, D, k, S, NULL, 0.0f, 1};
        size_t size = kvs_tile_size(&p);
        unsigned char *tile = xmalloc(size);
        float *src = xmalloc((size_t)T * D * 4);
        for (size_t i = 0; i < (size_t)T * D; i++)
            src[i] = gauss() + 100.0f;
        CU_ASSERT_EQUAL_FATAL(kvs_tile_quantize_ref(&p, src, KVS_DTYPE_FP32, D, tile, size, NULL),
                              0);
        kvs_tile_layout l;
        kvs_tile_layout_ex(s, KVS_TILE_K, T, D, k, S, 1, &l);
        unsigned char *pay = tile + sizeof(kvs_tile_hdr);
        for (size_t i = 0; i < (size_t)T * D; i++)
            pay[l.codes + i] = (unsigned char)rnd();
        for (uint32_t g = 0; g < D; g++) {
            uint16_t b = (uint16_t[]){0, 1, 0x7BFFu, 0x3C00u, 0x2E66u}[rndn(5)];
            memcpy(pay + l.scales + 2u * g, &b, 2);
            uint16_t m = (uint16_t)rnd();
            if ((m & 0x7C00u) == 0x7C00u) /* a finite offset: kvs_tile_check refuses others */
                m = (uint16_t[]){0x7BFFu, 0xFBFFu, 0x8000u, 0x0001u, 0x8001u}[rndn(5)];
            memcpy(pay + l.offsets + 2u * g, &m, 2);
            for (uint32_t q = 0; q < k; q++) {
                uint32_t index = (S >= T || rndn(5) == 0) ? KVS_OUTLIER_EMPTY : S + rndn(T - S);
                kvs_outlier_put(pay + l.outliers + ((size_t)g * k + q) * l.entry, l.entry, index,
                                (uint16_t)rnd());
            }
        }
        for (size_t i = 0; i < (size_t)S * D; i++) {
            uint16_t h = (uint16_t)rnd();
            memcpy(pay + l.sinks + 2 * i, &h, 2);
        }
        char err[KVS_ERR_LEN];
        CU_ASSERT_EQUAL_FATAL(kvs_tile_seal(tile, size, err), 0);
        CU_ASSERT_EQUAL_FATAL(kvs_tile_check(tile, size, NULL, err), 0);
        char label[96];
        snprintf(label, sizeof label, "koff garbage %s T=%u D=%u k=%u S=%u", scheme_name(s), T, D,
                 k, S);
        bad += check_dequant(tile, size, T, D, 1 + (iter & 1), iter & 1, label);
        free(tile);
        free(src);
    }
    CU_ASSERT_EQUAL(bad, 0);
}

/* Every rejected call gets the reference's status, and touches nothing. */
static void test_errors(void)
{
    float src[64 * 8];
    unsigned char out[4096], want[4096];
    char err[KVS_ERR_LEN];
    float nan_scale[8] = {1, 1, 1, NAN, 1, 1, 1, 1}, neg_scale[8] = {1, -1, 1, 1, 1, 1, 1, 1};
    for (int i = 0; i < 64 * 8; i++)
        src[i] = (float)i;
    const kvs_tile_params good = {KVS_SCHEME_FP8_E4M3, KVS_TILE_K, 64, 8, 2, 1, NULL, 0.0f, 0};
    kvs_tile_params bad[] = {good, good, good, good, good, good, good,
                             good, good, good, good, good, good, good};
    bad[0].scheme = (kvs_scheme)9;
    bad[1].kind = (kvs_tile_kind)2;
    bad[2].tokens = 0;
    bad[3].dim = 1025;
    bad[4].outliers = 17;
    bad[5].sinks = 65;
    bad[6].scheme = KVS_SCHEME_FP16; /* with k and S */
    bad[7].static_scales = nan_scale;
    bad[8].static_scales = neg_scale;
    bad[9].tokens = 1025;
    bad[10].tensor_scale = NAN;
    bad[11].tensor_scale = -1.0f;
    bad[12].tensor_scale = INFINITY;
    bad[13].tensor_scale = -FLT_MIN;
    for (size_t b = 10; b < 14; b++) {
        err[0] = '\0';
        CU_ASSERT_EQUAL(kvs_tile_params_check(&bad[b], err), KVS_EINVAL);
        CU_ASSERT(strstr(err, "tensor_scale") != NULL);
    }
    for (int i = 0; i < g_nisa; i++) {
        CU_ASSERT_EQUAL_FATAL(kvs_cpu_isa_force(g_isas[i]), 0);
        for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
            memset(out, SENTINEL, sizeof out);
            err[0] = '\0';
            CU_ASSERT_EQUAL(
                kvs_tile_quantize(&bad[b], src, KVS_DTYPE_FP32, 8, out, sizeof out, err),
                kvs_tile_quantize_ref(&bad[b], src, KVS_DTYPE_FP32, 8, want, sizeof want, NULL));
            CU_ASSERT(err[0] != '\0');
            CU_ASSERT_EQUAL(out[0], SENTINEL);
        }
        CU_ASSERT_EQUAL(kvs_tile_quantize(NULL, src, KVS_DTYPE_FP32, 8, out, sizeof out, err),
                        KVS_EINVAL);
        CU_ASSERT_EQUAL(kvs_tile_quantize(&good, NULL, KVS_DTYPE_FP32, 8, out, sizeof out, err),
                        KVS_EINVAL);
        CU_ASSERT_EQUAL(kvs_tile_quantize(&good, src, KVS_DTYPE_FP32, 8, NULL, sizeof out, err),
                        KVS_EINVAL);
        CU_ASSERT_EQUAL(kvs_tile_quantize(&good, src, (kvs_dtype)0, 8, out, sizeof out, err),
                        KVS_EINVAL);
        CU_ASSERT_EQUAL(kvs_tile_quantize(&good, src, KVS_DTYPE_FP32, 7, out, sizeof out, err),
                        KVS_EINVAL);
        size_t size = kvs_tile_size(&good);
        memset(out, SENTINEL, sizeof out);
        CU_ASSERT_EQUAL(kvs_tile_quantize(&good, src, KVS_DTYPE_FP32, 8, out, size - 1, err),
                        KVS_EINVAL);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "cap"));
        CU_ASSERT_EQUAL(out[0], SENTINEL);
        CU_ASSERT_EQUAL(kvs_tile_quantize(&good, src, KVS_DTYPE_FP32, 8, out, size, err), 0);

        /* dequantize: the tile is checked before anything is written */
        float dst[64 * 8 + 8];
        memset(dst, SENTINEL, sizeof dst);
        CU_ASSERT_EQUAL(kvs_tile_dequantize(out, size - 1, KVS_DTYPE_FP32, dst, 8, err),
                        KVS_EFORMAT);
        out[40] ^= 1; /* a payload byte: checksum mismatch */
        CU_ASSERT_EQUAL(kvs_tile_dequantize(out, size, KVS_DTYPE_FP32, dst, 8, err), KVS_EFORMAT);
        out[40] ^= 1;
        out[0] ^= 1; /* magic */
        CU_ASSERT_EQUAL(kvs_tile_dequantize(out, size, KVS_DTYPE_FP32, dst, 8, err), KVS_EFORMAT);
        out[0] ^= 1;
        CU_ASSERT_EQUAL(kvs_tile_dequantize(NULL, size, KVS_DTYPE_FP32, dst, 8, err), KVS_EFORMAT);
        CU_ASSERT_EQUAL(kvs_tile_dequantize(out, size, KVS_DTYPE_FP32, NULL, 8, err), KVS_EINVAL);
        CU_ASSERT_EQUAL(kvs_tile_dequantize(out, size, (kvs_dtype)4, dst, 8, err), KVS_EINVAL);
        CU_ASSERT_EQUAL(kvs_tile_dequantize(out, size, KVS_DTYPE_FP32, dst, 7, err), KVS_EINVAL);
        unsigned char s8[sizeof dst];
        memset(s8, SENTINEL, sizeof s8);
        CU_ASSERT_EQUAL(memcmp(dst, s8, sizeof dst), 0);
        CU_ASSERT_EQUAL(kvs_tile_dequantize(out, size, KVS_DTYPE_FP32, dst, 8, err), 0);
    }
}

/* The ISA controls themselves. */
/* kvs_cpu_fp16_widen_inplace on every ISA: all 65,536 fp16 patterns, at
 * every length 0..40 (the vector tail and the scalar top) and at 65,536, give
 * kvq_fp16_to_f32's bits in place. */
static void test_fp16_widen_inplace(void)
{
    enum { N = 65536 };
    float *t = malloc((size_t)N * sizeof *t);
    CU_ASSERT_PTR_NOT_NULL_FATAL(t);
    for (int i = 0; i < g_nisa; i++) {
        CU_ASSERT_EQUAL_FATAL(kvs_cpu_isa_force(g_isas[i]), 0);
        unsigned bad = 0;
        for (size_t n = 0; n <= 41; n++) {
            size_t len = n == 41 ? N : n;
            uint16_t *h = (uint16_t *)(void *)t;
            for (size_t e = 0; e < len; e++)
                h[e] = (uint16_t)(e * 40503u + n); /* every pattern when len is N */
            for (size_t e = len; e < (size_t)N && e < 2 * len + 8; e++)
                t[e] = -7.0f; /* past the tensor: must stay */
            kvs_cpu_fp16_widen_inplace(t, len);
            for (size_t e = 0; e < len; e++) {
                float want = kvq_fp16_to_f32((uint16_t)(e * 40503u + n));
                bad += memcmp(&t[e], &want, sizeof want) != 0;
            }
            for (size_t e = len; e < (size_t)N && e < 2 * len + 8; e++)
                bad += t[e] != -7.0f;
        }
        if (bad)
            fprintf(stderr, "\n  %s: %u widened values differ\n", kvs_cpu_isa_name(g_isas[i]), bad);
        CU_ASSERT_EQUAL(bad, 0u);
    }
    free(t);
}

static void test_isa_api(void)
{
    kvs_cpu_isa best = kvs_cpu_isa_detect();
    CU_ASSERT(best >= KVS_CPU_PORTABLE && best <= KVS_CPU_AVX512);
    CU_ASSERT_STRING_EQUAL(kvs_cpu_isa_name(KVS_CPU_PORTABLE), "portable");
    CU_ASSERT_STRING_EQUAL(kvs_cpu_isa_name(KVS_CPU_AVX2), "avx2");
    CU_ASSERT_STRING_EQUAL(kvs_cpu_isa_name(KVS_CPU_AVX512), "avx512");
    CU_ASSERT_STRING_EQUAL(kvs_cpu_isa_name((kvs_cpu_isa)7), "?");
    CU_ASSERT_EQUAL(kvs_cpu_isa_force((kvs_cpu_isa)3), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_cpu_isa_force((kvs_cpu_isa)-1), KVS_EINVAL);
    for (int i = 0; i < 3; i++) {
        int rc = kvs_cpu_isa_force(ALL_ISAS[i]);
        if (ALL_ISAS[i] <= best) {
            CU_ASSERT_EQUAL(rc, 0);
            CU_ASSERT_EQUAL(kvs_cpu_isa_active(), ALL_ISAS[i]);
        } else {
            CU_ASSERT_EQUAL(rc, KVS_ENODEV);
            CU_ASSERT_NOT_EQUAL(kvs_cpu_isa_active(), ALL_ISAS[i]);
        }
    }
    CU_ASSERT_EQUAL(kvs_cpu_isa_force(KVS_CPU_PORTABLE), 0); /* always there */
}

static int suite_init(void)
{
    /* The automatic choice first, before any force: the best, unless capped. */
    kvs_cpu_isa auto_isa = kvs_cpu_isa_active();
    if (getenv("KVSTASH_CPU_ISA") == NULL && auto_isa != kvs_cpu_isa_detect())
        return -1;
    for (int i = 0; i < 3; i++) {
        if (kvs_cpu_isa_force(ALL_ISAS[i]) == 0)
            g_isas[g_nisa++] = ALL_ISAS[i];
        else
            printf("\n  note: %s not supported by this CPU or build: skipped",
                   kvs_cpu_isa_name(ALL_ISAS[i]));
    }
    return g_nisa > 0 ? 0 : -1;
}

static int suite_cleanup(void)
{
    printf("\n  %lu cases, %lu comparisons against the reference\n", g_cases, g_compares);
    return 0;
}

static const kvs_test_case cases[] = {
    {"isa_api", test_isa_api},
    {"small_cross_product", test_small_cross_product},
    {"large_sample", test_large_sample},
    {"odd_shapes", test_odd_shapes},
    {"all_16bit_patterns", test_all_16bit_patterns},
    {"tensor_scale", test_tensor_scale},
    {"dequant_sealed_garbage", test_dequant_sealed_garbage},
    {"nonfinite_scales_refused", test_nonfinite_scales_refused},
    {"misaligned_buffers", test_misaligned_buffers},
    {"errors", test_errors},
    {"fp16_widen_inplace", test_fp16_widen_inplace},
    {"koff_cross_product", test_koff_cross_product},
    {"koff_large", test_koff_large},
    {"koff_odd_shapes", test_koff_odd_shapes},
    {"koff_misaligned", test_koff_misaligned},
    {"koff_dequant_garbage", test_koff_dequant_garbage},
    {NULL, NULL},
};

static const kvs_test_suite suites[] = {
    {"kvq_cpu_vs_ref", suite_init, suite_cleanup, cases},
    {NULL, NULL, NULL, NULL},
};

/* --expect-isa NAME: the automatic choice (KVSTASH_CPU_ISA capped) is NAME, or
 * the best this machine has when that is lower. */
static int expect_isa(const char *name)
{
    kvs_cpu_isa got = kvs_cpu_isa_active(), best = kvs_cpu_isa_detect();
    for (int i = 0; i < 3; i++)
        if (strcmp(name, kvs_cpu_isa_name(ALL_ISAS[i])) == 0) {
            kvs_cpu_isa want = ALL_ISAS[i] < best ? ALL_ISAS[i] : best;
            printf("KVSTASH_CPU_ISA=%s: active %s, expected %s (best here %s)\n",
                   getenv("KVSTASH_CPU_ISA") ? getenv("KVSTASH_CPU_ISA") : "(unset)",
                   kvs_cpu_isa_name(got), kvs_cpu_isa_name(want), kvs_cpu_isa_name(best));
            return got == want ? 0 : 1;
        }
    fprintf(stderr, "unknown ISA '%s'\n", name);
    return 2;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--expect-isa") == 0)
        return expect_isa(argv[2]);
    clock_t t0 = clock();
    int rc = kvs_test_run(suites);
    printf("cpu time %.1f s\n", (double)(clock() - t0) / CLOCKS_PER_SEC);
    return rc;
}
