/*
 * test_kvq_cuda.c — on a GPU: the CUDA tile kernels == the C reference, byte for
 * byte. kvs_cuda_quantize_tiles' tiles, once copied back and sealed
 * (kvs_tile_seal), must equal kvs_tile_quantize_ref's; kvs_cuda_dequantize_tiles'
 * output views must equal kvs_tile_dequantize_ref's, including the untouched
 * bytes between rows.
 *
 * Coverage (every launch holds several tiles with different strides, some with
 * rows that are not 16-byte aligned, and some with static scales):
 *   A. T in {1, 16, 256, 1024} x D in {8, 64, 128, 256} x every scheme x both
 *      kinds x fp16/bf16/fp32 sources, k in {0,1,2,4} and S in {0,1,4} cycling,
 *      data cycling through realistic (fixed seeds), hostile (NaN with payloads,
 *      signalling NaN, ±Inf, ±0, denormals, 65504, beyond-fp16, random bits),
 *      ties, all-zero, constant, denormal-only, huge and all-NaN tiles;
 *   B. k in {0,1,2,4,8,16} x S in {0,1,4,64} at T=256, D=128, both kinds, the
 *      three 8-bit schemes; K tiles at every strip width (16/32/64 bytes), V
 *      rows at 1, 2 and 4 chunks per lane (kvs_cuda_tile_set_tuning);
 *   C. odd shapes: D not a multiple of 8 (1, 3, 7, 12, 100, 1000), D = 1024
 *      (widest V rows), T = 2, 17, 63, 1000; groups shorter than k;
 *   D. large launches (64 tiles of 256 x 128; 32 tiles of 1024 x 128): the
 *      V kernel's grid-stride loop and many K strips;
 *   K. the K-tile kernel variants 1-4 (kvs_cuda_tile_tuning.k_variant): every
 *      8-bit scheme x T {1,16,256,1024} x D {8,64,128,256} x dtype, k {0,1,2,4}
 *      and S {0,1,4} cycling, hostile data included; odd shapes; 64 tiles;
 *      k = 8 (the strip kernel's fallback);
 *   E. parameter errors (KVS_EINVAL before any launch) and n = 0;
 *   F. every fp16/bf16 pattern and every fp16 rounding boundary of fp32 through
 *      the fp16 scheme (both directions) and as outliers, and static scales
 *      swept over 2^-40..2^40 (where the hardware conversions meet rounding,
 *      subnormals and overflow);
 *   T. tensor_scale (FP8 group scales aligned to a per-tensor scale; int8 and
 *      fp16 ignore it): ordinary, fp16-exact, fp16-subnormal, below-fp16,
 *      65504, beyond-fp16 and FLT_MAX tensor scales x every scheme, kind,
 *      dtype and kernel (strip and column-warp K variants, V lane chunks),
 *      dynamic and static scales, every data flavor; 64 tiles at the defaults;
 *   O. key offsets (kv_format.h rule 5) on K tiles: every 8-bit scheme, dtype,
 *      T, D, k, S, strip width and flavor, channels centred away from 0,
 *      static and tensor scales, odd shapes, 64-tile launches.
 * Outputs are poisoned before each launch (two different bytes for quantize),
 * and bytes after each tile are checked untouched.
 *
 * Self-contained (no CUnit, so tests/gpu can build it on a bare GPU machine):
 * prints failures, a total per section and "N passed, M failed" (-v: a line
 * per case; --quick: a subset), exits 1 on any failure, 77 (skipped) when no
 * usable GPU is found, 0 otherwise. Mismatches print where (header, codes at
 * (t,d), scale / outlier slot of group g, sinks, padding) and the bytes.
 */
#include "kvq.h"
#include "kvq_math.h"
#include "kvs_cuda.h"
#include "kvs_error.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SKIP       77
#define MAX_DETAIL 6  /* failing cases explained in full */
#define GUARD      64 /* bytes after each device tile that must stay poisoned */

static unsigned g_pass, g_fail, g_detail;
static int g_verbose; /* -v: a PASS line per case too (else failures and section totals) */

static void report(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void report(int ok, const char *fmt, ...)
{
    va_list ap;
    if (!ok || g_verbose) {
        va_start(ap, fmt);
        printf("%s ", ok ? "PASS" : "FAIL");
        vprintf(fmt, ap);
        printf("\n");
        va_end(ap);
    }
    if (ok)
        g_pass++;
    else
        g_fail++;
    fflush(stdout);
}

/* ---- data ------------------------------------------------------------------ */

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t rnext(rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double runif(rng *r)
{
    return (double)(rnext(r) >> 11) * (1.0 / 9007199254740992.0);
}

static float rgauss(rng *r) /* Irwin-Hall, close enough to a normal */
{
    return (float)(runif(r) + runif(r) + runif(r) + runif(r) - 2.0) * 1.7f;
}

enum flavor {
    F_REAL,
    F_HOSTILE,
    F_TIES,
    F_ZERO,
    F_CONST,
    F_DENORM,
    F_BIG,
    F_NAN,
    F_COUNT,
    F_SEQ,  /* not cycled: every 16-bit pattern in order; fp32: each fp16 value, the
             * midpoint above it and its two fp32 neighbours (rounding boundaries) */
    F_SHIFT /* not cycled: channels centred away from 0 (what key offsets are for) */
};

static const char *flavor_name[F_SHIFT + 1] = {
    [F_REAL] = "realistic", [F_HOSTILE] = "hostile", [F_TIES] = "ties",    [F_ZERO] = "zero",
    [F_CONST] = "constant", [F_DENORM] = "denormal", [F_BIG] = "huge",     [F_NAN] = "all-NaN",
    [F_COUNT] = "(count)",  [F_SEQ] = "patterns",    [F_SHIFT] = "shifted"};

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
    switch (s) {
    case KVS_SCHEME_FP16:
        return "fp16";
    case KVS_SCHEME_FP8_E4M3:
        return "e4m3";
    case KVS_SCHEME_FP8_E5M2:
        return "e5m2";
    case KVS_SCHEME_INT8:
        return "int8";
    }
    return "?";
}

static uint32_t raw_of(float x, kvs_dtype dt)
{
    switch (dt) {
    case KVS_DTYPE_FP16:
        return kvq_f32_to_fp16(x);
    case KVS_DTYPE_BF16:
        return kvq_f32_to_bf16(x);
    default:
        return kvq_f32_bits(x);
    }
}

static void put_raw(void *base, kvs_dtype dt, size_t i, uint32_t raw)
{
    if (dt == KVS_DTYPE_FP32)
        memcpy((char *)base + 4 * i, &raw, 4);
    else {
        uint16_t h = (uint16_t)raw;
        memcpy((char *)base + 2 * i, &h, 2);
    }
}

/* A special value of the source type as raw bits. */
static uint32_t special(rng *r, kvs_dtype dt)
{
    uint64_t z = rnext(r);
    uint32_t sign = (uint32_t)(z >> 63);
    switch ((z >> 8) % 9) {
    case 0: /* quiet NaN with payload */
        return dt == KVS_DTYPE_FP32   ? (sign << 31) | 0x7FC00000u | (uint32_t)(z & 0x3FFFFFu)
               : dt == KVS_DTYPE_FP16 ? (sign << 15) | 0x7E00u | (uint32_t)(z & 0x1FFu)
                                      : (sign << 15) | 0x7FC0u | (uint32_t)(z & 0x3Fu);
    case 1: /* signalling NaN */
        return dt == KVS_DTYPE_FP32   ? (sign << 31) | 0x7F800001u | (uint32_t)(z & 0x1FFFFEu)
               : dt == KVS_DTYPE_FP16 ? (sign << 15) | 0x7C01u | (uint32_t)(z & 0x1FEu)
                                      : (sign << 15) | 0x7F81u | (uint32_t)(z & 0x3Eu);
    case 2: /* ±Inf */
        return dt == KVS_DTYPE_FP32 ? (sign << 31) | 0x7F800000u
                                    : (sign << 15) | (dt == KVS_DTYPE_FP16 ? 0x7C00u : 0x7F80u);
    case 3: /* ±0 */
        return dt == KVS_DTYPE_FP32 ? sign << 31 : sign << 15;
    case 4: /* denormal */
        return dt == KVS_DTYPE_FP32   ? (sign << 31) | (uint32_t)(1 + z % 0x7FFFFFu)
               : dt == KVS_DTYPE_FP16 ? (sign << 15) | (uint32_t)(1 + z % 0x3FFu)
                                      : (sign << 15) | (uint32_t)(1 + z % 0x7Fu);
    case 5: /* largest finite */
        return dt == KVS_DTYPE_FP32 ? (sign << 31) | 0x7F7FFFFFu
                                    : (sign << 15) | (dt == KVS_DTYPE_FP16 ? 0x7BFFu : 0x7F7Fu);
    case 6: /* 65504 and just beyond fp16 (65520 rounds to Inf) */
        return raw_of((sign ? -1.0f : 1.0f) * ((z >> 20) & 1 ? 65504.0f : 65520.0f), dt);
    case 7: /* random bits */
        return dt == KVS_DTYPE_FP32 ? (uint32_t)z : (uint32_t)(z & 0xFFFFu);
    default: /* tiny normal */
        return raw_of((sign ? -1.0f : 1.0f) * FLT_MIN * (float)(1 + z % 7), dt);
    }
}

/* Fills a T x D view (stride elements apart) of one tile; gaps get junk. */
static void gen_tile(int flavor, kvs_dtype dt, kvs_tile_kind kind, uint32_t T, uint32_t D,
                     size_t stride, void *base, rng *r)
{
    float cval = (float)(int)(rnext(r) % 9) - 4.0f + 0.5f;
    for (uint32_t t = 0; t < T; t++)
        for (size_t d = 0; d < stride; d++) {
            size_t i = (size_t)t * stride + d;
            if (d >= D) { /* between rows: junk the kernels must never use */
                if (t + 1 < T)
                    put_raw(base, dt, i, special(r, dt));
                continue;
            }
            float x;
            uint32_t raw;
            const size_t seq = (size_t)t * D + d;
            switch (flavor) {
            case F_SEQ:
                if (dt != KVS_DTYPE_FP32) {
                    raw = (uint32_t)(seq & 0xFFFFu);
                } else {
                    uint16_t h = (uint16_t)(seq / 4);
                    uint32_t b = kvq_f32_bits(kvq_fp16_to_f32(h));
                    if ((h & 0x7C00u) == 0x7C00u) /* Inf/NaN: fp32 NaNs with payloads, Inf */
                        raw = (h & 0x3FFu) ? b ^ (uint32_t)(seq % 4) * 0x1001u : b;
                    else if (seq % 4 == 0)
                        raw = b;
                    else { /* midpoint to the next fp16 away from zero, and +-1 ulp */
                        float lo = kvq_fp16_to_f32(h), hi = kvq_fp16_to_f32((uint16_t)(h + 1));
                        float mid = (h & 0x7FFFu) == 0x7BFFu
                                        ? (h & 0x8000u ? -65520.0f : 65520.0f)
                                        : (float)(((double)lo + (double)hi) / 2);
                        raw = kvq_f32_bits(mid) + (uint32_t)(seq % 4) - 2u;
                    }
                }
                break;
            case F_REAL: {
                float chan =
                    kind == KVS_TILE_K && d % 29 == 5 ? 24.0f : 1.0f; /* outlier channels */
                x = rgauss(r) * 0.6f * chan;
                if (rnext(r) % 97 == 0)
                    x *= 40.0f; /* sparse outliers */
                if (t == 0)
                    x *= 30.0f; /* massive activations on the first token */
                raw = raw_of(x, dt);
                break;
            }
            case F_SHIFT: { /* channel d near its own centre, a few far from it */
                const float centre =
                    (float)((int)(d * 37 % 11) - 5) * 7.3f + (float)(d % 3) * 0.01f;
                x = centre + rgauss(r) * (d % 4 == 1 ? 0.05f : 0.5f);
                if (rnext(r) % 61 == 0)
                    x = centre - x * 9.0f;
                raw = raw_of(x, dt);
                break;
            }
            case F_HOSTILE:
                raw = rnext(r) % 5 < 2 ? special(r, dt) : raw_of(rgauss(r) * 3.0f, dt);
                break;
            case F_TIES: {
                static const float vals[] = {0.0f, 1.0f, -1.0f, 2.0f, -2.0f, 0.5f, -0.5f, -0.0f};
                raw = raw_of(vals[rnext(r) % 8], dt);
                break;
            }
            case F_ZERO:
                raw = rnext(r) % 4 == 0 ? raw_of(-0.0f, dt) : 0u;
                break;
            case F_CONST:
                raw = raw_of(cval, dt);
                break;
            case F_DENORM: {
                uint64_t z = rnext(r);
                uint32_t sign = (uint32_t)(z >> 63);
                raw = dt == KVS_DTYPE_FP32   ? (sign << 31) | (uint32_t)(1 + z % 0x7FFFFFu)
                      : dt == KVS_DTYPE_FP16 ? (sign << 15) | (uint32_t)(1 + z % 0x3FFu)
                                             : (sign << 15) | (uint32_t)(1 + z % 0x7Fu);
                break;
            }
            case F_BIG: {
                static const float vals[] = {65504.0f, -65504.0f, 65519.0f, 70000.0f, -1e30f, 3e38f,
                                             448.0f,   464.0f,    57344.0f, 61440.0f, 1e-3f};
                raw = raw_of(vals[rnext(r) % 11] * (1.0f + (float)(rnext(r) % 3) * 0.001f), dt);
                break;
            }
            default: /* F_NAN */
                raw = dt == KVS_DTYPE_FP32 ? 0x7FC00000u | (uint32_t)(rnext(r) & 0xFFu)
                                           : (dt == KVS_DTYPE_FP16 ? 0x7E00u : 0x7FC0u) |
                                                 (uint32_t)(rnext(r) & 0x1Fu);
                break;
            }
            put_raw(base, dt, i, raw);
        }
}

/* Static scales (finite, >= 0), including the edge cases: 0, a denormal, FLT_MAX. */
static void gen_scales(float *s, uint32_t G, kvs_scheme scheme, rng *r)
{
    float qmax = scheme == KVS_SCHEME_INT8       ? 127.0f
                 : scheme == KVS_SCHEME_FP8_E5M2 ? 57344.0f
                                                 : 448.0f;
    for (uint32_t g = 0; g < G; g++) {
        uint64_t z = rnext(r);
        switch (z % 16) {
        case 0:
            s[g] = 0.0f;
            break;
        case 1:
            s[g] = FLT_MIN / 4.0f; /* denormal: reciprocal 0, all codes 0 */
            break;
        case 2:
            s[g] = FLT_MAX;
            break;
        default:
            s[g] = (float)(0.05 + 8.0 * runif(r)) / qmax;
            break;
        }
    }
}

/* ---- one case ----------------------------------------------------------------- */

typedef struct tcase {
    kvs_scheme scheme;
    kvs_tile_kind kind;
    uint32_t T, D, k, S;
    kvs_dtype dt;
    int ntiles;
    int flavor;     /* tile i uses (flavor + i) % F_COUNT when mixed */
    int mixed;      /* flavors vary per tile */
    int use_static; /* 1: odd tiles static, 2: every tile, 3: every tile, a sweep 2^-40..2^40 */
    int strip;      /* K strip bytes (0 = automatic) */
    int vchunks;    /* V chunks per lane (0 = automatic) */
    int kvariant;   /* K kernel variant (0 = the strip kernel; 1..3 column warps) */
    float tensor_scale; /* kvs_tile_params.tensor_scale of the call (0: off) */
    int koff;           /* kvs_tile_params.key_offsets (K tiles of 8-bit schemes) */
    uint64_t seed;
    const char *label;
} tcase;

static const char *part_of(const kvs_tile_params *p, size_t off, char *buf, size_t len)
{
    kvs_tile_layout l;
    kvs_tile_layout_ex(p->scheme, p->kind, p->tokens, p->dim, p->outliers, p->sinks, p->key_offsets,
                       &l);
    if (off < sizeof(kvs_tile_hdr)) {
        snprintf(buf, len, "header byte %zu", off);
        return buf;
    }
    size_t o = off - sizeof(kvs_tile_hdr);
    uint32_t T = p->tokens, D = p->dim;
    if (p->scheme == KVS_SCHEME_FP16) {
        if (o < (size_t)T * D * 2)
            snprintf(buf, len, "fp16 value (t=%zu, d=%zu)", o / 2 / D, o / 2 % D);
        else
            snprintf(buf, len, "padding at payload +%zu", o);
    } else if (o < (size_t)T * D)
        snprintf(buf, len, "code (t=%zu, d=%zu)", o / D, o % D);
    else if (o >= l.scales && o < l.scales + 2u * l.groups)
        snprintf(buf, len, "scale of group %zu", (o - l.scales) / 2);
    else if (p->outliers && o >= l.outliers && o < l.outliers + l.entry * l.groups * p->outliers)
        snprintf(buf, len, "outlier slot %zu of group %zu (%s)",
                 (o - l.outliers) / l.entry % p->outliers, (o - l.outliers) / l.entry / p->outliers,
                 (o - l.outliers) % l.entry < l.entry - 2 ? "index" : "value");
    else if (o >= l.sinks && o < l.sinks + 2u * p->sinks * D)
        snprintf(buf, len, "sink (t=%zu, d=%zu)", (o - l.sinks) / 2 / D, (o - l.sinks) / 2 % D);
    else if (p->key_offsets && o >= l.offsets && o < l.offsets + 2u * D)
        snprintf(buf, len, "key offset of channel %zu", (o - l.offsets) / 2);
    else
        snprintf(buf, len, "padding at payload +%zu", o);
    return buf;
}

static void case_name(const tcase *c, char *buf, size_t len)
{
    char ts[40] = "";
    if (c->tensor_scale != 0.0f)
        snprintf(ts, sizeof ts, " tensor_scale=%a", (double)c->tensor_scale);
    snprintf(buf, len, "%s %s %s%s T=%u D=%u k=%u S=%u %s x%d %s%s%s tuning=%d/%d/k%d", c->label,
             scheme_name(c->scheme), c->kind == KVS_TILE_K ? "K" : "V", c->koff ? " koff" : "",
             c->T, c->D, c->k, c->S, dt_name(c->dt), c->ntiles,
             c->mixed ? "mixed" : flavor_name[c->flavor],
             c->use_static == 3   ? " static sweep"
             : c->use_static == 2 ? " static"
             : c->use_static      ? " static(odd tiles)"
                                  : "",
             ts, c->strip, c->vchunks, c->kvariant);
}

#define CK(call)                                                                                   \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != KVS_OK) {                                                                       \
            char nm_[256];                                                                         \
            case_name(c, nm_, sizeof nm_);                                                         \
            report(0, "%s: %s:%d: %s -> %s (%s)", nm_, __FILE__, __LINE__, #call,                  \
                   kvs_errname(rc_), kvs_cuda_last_error());                                       \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

static size_t round_up(size_t x, size_t a)
{
    return (x + a - 1) / a * a;
}

/* Bytes from one element of dtype view, for messages. */
static uint32_t get_raw(const void *base, kvs_dtype dt, size_t i)
{
    if (dt == KVS_DTYPE_FP32) {
        uint32_t u;
        memcpy(&u, (const char *)base + 4 * i, 4);
        return u;
    }
    uint16_t h;
    memcpy(&h, (const char *)base + 2 * i, 2);
    return h;
}

static int run_case(const tcase *c)
{
    const int n = c->ntiles;
    const size_t es = esize(c->dt);
    kvs_tile_params p = {c->scheme,       c->kind,          c->T, c->D, c->k, c->S, NULL,
                         c->tensor_scale, (uint32_t)c->koff};
    const size_t tsize = kvs_tile_size(&p);
    const uint32_t G = kvs_tile_groups(c->kind, c->T, c->D);
    const size_t slot = round_up(tsize + GUARD, 256);
    char name[256], err[KVS_ERR_LEN];
    rng r = {c->seed};
    int ok = 1, qbad = 0, dbad = 0;
    const unsigned fail0 = g_fail;
    size_t *src_off = calloc((size_t)n, sizeof *src_off),
           *stride = calloc((size_t)n, sizeof *stride);
    float **scales = calloc((size_t)n, sizeof *scales);
    unsigned char *h_src = NULL, *ref = NULL, *got = NULL, *h_dq_ref = NULL, *h_dq_got = NULL;
    void *d_src = NULL, *d_dst = NULL, *d_scales = NULL, *d_jobs = NULL, *d_tiles = NULL,
         *d_out = NULL, *d_djobs = NULL;
    kvs_cuda_tile_job *jobs = calloc((size_t)n, sizeof *jobs);
    kvs_cuda_detile_job *djobs = calloc((size_t)n, sizeof *djobs);
    case_name(c, name, sizeof name);
    if (!src_off || !stride || !scales || !jobs || !djobs) {
        report(0, "%s: out of host memory", name);
        ok = 0;
        goto out;
    }

    /* Sources: tile i at an offset aligned to 16 bytes, plus one element for
     * every third tile (rows not 16-byte aligned); strides D, D+8, D+3, ... */
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        static const unsigned extra[] = {0, 8, 3, 16, 1, 64};
        stride[i] = c->D + extra[i % 6];
        src_off[i] = round_up(total, 16) + (i % 3 == 2 ? es : 0);
        total = src_off[i] + (((size_t)c->T - 1) * stride[i] + c->D) * es;
    }
    total = round_up(total, 16);
    h_src = malloc(total);
    ref = malloc((size_t)n * slot);
    got = malloc((size_t)n * slot);
    if (!h_src || !ref || !got) {
        report(0, "%s: out of host memory", name);
        ok = 0;
        goto out;
    }
    memset(h_src, 0, total);
    for (int i = 0; i < n; i++) {
        int fl = c->mixed ? (c->flavor + i) % F_COUNT : c->flavor;
        gen_tile(fl, c->dt, c->kind, c->T, c->D, stride[i], h_src + src_off[i], &r);
        if (c->use_static >= 2 || (c->use_static == 1 && i % 2 == 1)) {
            scales[i] = malloc(G * sizeof(float));
            if (!scales[i]) {
                report(0, "%s: out of host memory", name);
                ok = 0;
                goto out;
            }
            gen_scales(scales[i], G, c->scheme, &r);
            if (c->use_static == 3)
                for (uint32_t gi = 0; gi < G; gi++)
                    scales[i][gi] = ldexpf(1.0f + (float)(gi % 7) / 8.0f, -40 + (int)(80 * gi / G));
        }
    }

    /* Reference tiles. */
    for (int i = 0; i < n; i++) {
        kvs_tile_params pi = p;
        pi.static_scales = scales[i];
        int rc = kvs_tile_quantize_ref(&pi, h_src + src_off[i], c->dt, stride[i],
                                       ref + (size_t)i * slot, tsize, err);
        if (rc != KVS_OK) {
            report(0, "%s: reference quantize tile %d: %s (%s)", name, i, kvs_errname(rc), err);
            ok = 0;
            goto out;
        }
    }

    /* Device quantize, twice, with two poisons. */
    CK(kvs_cuda_alloc(&d_src, total));
    CK(kvs_cuda_copy_to_device(d_src, h_src, total));
    CK(kvs_cuda_alloc(&d_dst, (size_t)n * slot));
    CK(kvs_cuda_alloc(&d_scales, (size_t)n * G * sizeof(float) + 16));
    CK(kvs_cuda_alloc(&d_jobs, (size_t)n * sizeof *jobs));
    for (int i = 0; i < n; i++) {
        jobs[i].src = (unsigned char *)d_src + src_off[i];
        jobs[i].stride = stride[i];
        jobs[i].dst = (unsigned char *)d_dst + (size_t)i * slot;
        jobs[i].static_scales = NULL;
        if (scales[i]) {
            float *ds = (float *)d_scales + (size_t)i * G;
            CK(kvs_cuda_copy_to_device(ds, scales[i], G * sizeof(float)));
            jobs[i].static_scales = ds;
        }
    }
    CK(kvs_cuda_copy_to_device(d_jobs, jobs, (size_t)n * sizeof *jobs));
    if (c->strip || c->vchunks || c->kvariant) {
        kvs_cuda_tile_tuning tu = {c->strip, c->vchunks, c->kvariant};
        kvs_cuda_tile_set_tuning(&tu);
    }
    for (int pz = 0; pz < 2 && ok; pz++) {
        const int poison = pz ? 0x5A : 0xA5;
        CK(kvs_cuda_memset(d_dst, poison, (size_t)n * slot));
        int rc =
            kvs_cuda_quantize_tiles(&p, c->dt, (const kvs_cuda_tile_job *)d_jobs, (size_t)n, NULL);
        if (rc == KVS_OK)
            rc = kvs_cuda_sync();
        if (rc != KVS_OK) {
            report(0, "%s: kvs_cuda_quantize_tiles -> %s (%s)", name, kvs_errname(rc),
                   kvs_cuda_last_error());
            ok = 0;
            break;
        }
        CK(kvs_cuda_copy_to_host(got, d_dst, (size_t)n * slot));
        for (int i = 0; i < n && ok; i++) {
            unsigned char *gt = got + (size_t)i * slot, *rf = ref + (size_t)i * slot;
            kvs_tile_hdr h;
            size_t bad_guard = 0;
            for (size_t b = tsize; b < slot; b++)
                bad_guard += gt[b] != poison;
            memcpy(&h, gt, sizeof h);
            int rc2 = h.checksum == 0 ? kvs_tile_seal(gt, tsize, err) : KVS_EFORMAT;
            if (h.checksum != 0)
                snprintf(err, sizeof err, "device wrote checksum 0x%016llx, not 0",
                         (unsigned long long)h.checksum);
            size_t bad = 0, first = 0;
            for (size_t b = 0; b < tsize; b++)
                if (gt[b] != rf[b] && bad++ == 0)
                    first = b;
            if (bad_guard == 0 && rc2 == KVS_OK && bad == 0)
                continue;
            ok = 0;
            qbad = 1;
            if (g_detail++ >= MAX_DETAIL)
                break;
            printf("  quantize tile %d (poison 0x%02X): %zu bytes differ, %zu guard bytes written "
                   "past the tile, seal %s%s%s\n",
                   i, poison, bad, bad_guard,
                   rc2 == KVS_OK ? "ok" : "FAILED: ", rc2 == KVS_OK ? "" : err, "");
            int shown = 0;
            for (size_t b = 0; b < tsize && shown < 8; b++) {
                /* The sealed checksum differs whenever the payload does: show it
                 * only when nothing else differs. */
                if (gt[b] == rf[b] || (b >= 24 && b < 32 && bad > 8))
                    continue;
                char where[128];
                part_of(&p, b, where, sizeof where);
                printf("    +%zu %s: got 0x%02x want 0x%02x", b, where, gt[b], rf[b]);
                size_t o = b - sizeof(kvs_tile_hdr);
                if (b >= sizeof(kvs_tile_hdr) && c->scheme != KVS_SCHEME_FP16 &&
                    o < (size_t)c->T * c->D) {
                    kvs_tile_layout l;
                    size_t grp = c->kind == KVS_TILE_K ? o % c->D : o / c->D;
                    uint16_t sg, sr; /* fp16 scales (format v2) */
                    kvs_tile_layout_of(c->scheme, c->kind, c->T, c->D, c->k, c->S, &l);
                    memcpy(&sg, gt + sizeof(kvs_tile_hdr) + l.scales + 2 * grp, 2);
                    memcpy(&sr, rf + sizeof(kvs_tile_hdr) + l.scales + 2 * grp, 2);
                    printf(" (source bits 0x%x; group %zu scale got %a want %a%s)",
                           get_raw(h_src + src_off[i], c->dt, o / c->D * stride[i] + o % c->D), grp,
                           (double)kvq_fp16_to_f32(sg), (double)kvq_fp16_to_f32(sr),
                           scales[i] ? ", static" : "");
                }
                printf("\n");
                shown++;
            }
            (void)first;
        }
    }
    if (c->strip || c->vchunks || c->kvariant) {
        kvs_cuda_tile_tuning tu = {0, 0, 0};
        kvs_cuda_tile_set_tuning(&tu);
    }
    if (!ok)
        goto out;

    /* Dequantize the reference tiles into fp16, bf16 and fp32 views. */
    CK(kvs_cuda_alloc(&d_tiles, (size_t)n * slot));
    CK(kvs_cuda_copy_to_device(d_tiles, ref, (size_t)n * slot));
    CK(kvs_cuda_alloc(&d_djobs, (size_t)n * sizeof *djobs));
    for (int od = 0; od < 3 && ok; od++) {
        const kvs_dtype odt = od == 0 ? KVS_DTYPE_FP16 : od == 1 ? KVS_DTYPE_BF16 : KVS_DTYPE_FP32;
        const size_t oes = esize(odt);
        size_t ototal = 0, *ooff = calloc((size_t)n, sizeof *ooff),
               *ostr = calloc((size_t)n, sizeof *ostr);
        if (!ooff || !ostr) {
            free(ooff);
            free(ostr);
            report(0, "%s: out of host memory", name);
            ok = 0;
            break;
        }
        for (int i = 0; i < n; i++) {
            static const unsigned extra[] = {0, 5, 8, 0, 32, 1};
            ostr[i] = c->D + extra[(i + od) % 6];
            ooff[i] = round_up(ototal, 16) + ((i + od) % 4 == 3 ? oes : 0);
            ototal = ooff[i] + (size_t)c->T * ostr[i] * oes;
        }
        ototal = round_up(ototal, 16);
        h_dq_ref = malloc(ototal);
        h_dq_got = malloc(ototal);
        if (!h_dq_ref || !h_dq_got) {
            report(0, "%s: out of host memory", name);
            ok = 0;
            free(ooff);
            free(ostr);
            break;
        }
        memset(h_dq_ref, 0xC3, ototal);
        for (int i = 0; i < n; i++) {
            int rc = kvs_tile_dequantize_ref(ref + (size_t)i * slot, tsize, odt, h_dq_ref + ooff[i],
                                             ostr[i], err);
            if (rc != KVS_OK) {
                report(0, "%s: reference dequantize tile %d: %s (%s)", name, i, kvs_errname(rc),
                       err);
                ok = 0;
            }
            djobs[i].tile = (unsigned char *)d_tiles + (size_t)i * slot;
            djobs[i].dst = NULL;
            djobs[i].stride = ostr[i];
        }
        int rc = KVS_OK;
        if (ok) {
            rc = kvs_cuda_alloc(&d_out, ototal);
            if (rc == KVS_OK)
                rc = kvs_cuda_memset(d_out, 0xC3, ototal);
            for (int i = 0; i < n; i++)
                djobs[i].dst = (unsigned char *)d_out + ooff[i];
            if (rc == KVS_OK)
                rc = kvs_cuda_copy_to_device(d_djobs, djobs, (size_t)n * sizeof *djobs);
            if (rc == KVS_OK)
                rc = kvs_cuda_dequantize_tiles(&p, odt, (const kvs_cuda_detile_job *)d_djobs,
                                               (size_t)n, NULL);
            if (rc == KVS_OK)
                rc = kvs_cuda_sync();
            if (rc == KVS_OK)
                rc = kvs_cuda_copy_to_host(h_dq_got, d_out, ototal);
            if (rc != KVS_OK) {
                report(0, "%s: dequantize to %s -> %s (%s)", name, dt_name(odt), kvs_errname(rc),
                       kvs_cuda_last_error());
                ok = 0;
            }
        }
        if (ok) {
            size_t bad = 0;
            for (size_t b = 0; b < ototal; b++)
                bad += h_dq_got[b] != h_dq_ref[b];
            if (bad) {
                ok = 0;
                dbad = 1;
                if (g_detail++ < MAX_DETAIL) {
                    printf("  dequantize to %s: %zu bytes differ\n", dt_name(odt), bad);
                    int shown = 0;
                    for (int i = 0; i < n && shown < 8; i++)
                        for (size_t b = ooff[i];
                             b < ooff[i] + (size_t)c->T * ostr[i] * oes && b < ototal && shown < 8;
                             b++) {
                            if (h_dq_got[b] == h_dq_ref[b])
                                continue;
                            size_t e = (b - ooff[i]) / oes;
                            size_t t = e / ostr[i], d = e % ostr[i];
                            printf("    tile %d (t=%zu, d=%zu)%s: got 0x%x want 0x%x\n", i, t, d,
                                   d >= c->D ? " BETWEEN ROWS" : "",
                                   get_raw(h_dq_got + ooff[i], odt, e),
                                   get_raw(h_dq_ref + ooff[i], odt, e));
                            shown++;
                            b = ooff[i] + (e + 1) * oes - 1;
                        }
                }
            }
        }
        kvs_cuda_free(d_out);
        d_out = NULL;
        free(h_dq_ref);
        free(h_dq_got);
        h_dq_ref = h_dq_got = NULL;
        free(ooff);
        free(ostr);
    }
out:
    /* One verdict per case (error paths above may have reported already). */
    if (g_fail == fail0 && (ok || qbad || dbad))
        report(ok, "%s%s%s", name, qbad ? " [quantize differs]" : "",
               dbad ? " [dequantize differs]" : "");
    else if (g_fail == fail0)
        report(0, "%s", name);
    kvs_cuda_free(d_src);
    kvs_cuda_free(d_dst);
    kvs_cuda_free(d_scales);
    kvs_cuda_free(d_jobs);
    kvs_cuda_free(d_tiles);
    kvs_cuda_free(d_out);
    kvs_cuda_free(d_djobs);
    if (scales)
        for (int i = 0; i < n; i++)
            free(scales[i]);
    free(scales);
    free(src_off);
    free(stride);
    free(jobs);
    free(djobs);
    free(h_src);
    free(ref);
    free(got);
    free(h_dq_ref);
    free(h_dq_got);
    return ok;
}

/* ---- sections -------------------------------------------------------------------- */

static const kvs_scheme k_schemes[4] = {KVS_SCHEME_FP8_E4M3, KVS_SCHEME_FP8_E5M2, KVS_SCHEME_INT8,
                                        KVS_SCHEME_FP16};
static const kvs_dtype k_dtypes[3] = {KVS_DTYPE_FP16, KVS_DTYPE_BF16, KVS_DTYPE_FP32};

static tcase make(const char *label, kvs_scheme s, kvs_tile_kind kind, uint32_t T, uint32_t D,
                  uint32_t k, uint32_t S, kvs_dtype dt, int ntiles, uint64_t seed)
{
    tcase c;
    memset(&c, 0, sizeof c);
    c.label = label;
    c.scheme = s;
    c.kind = kind;
    c.T = T;
    c.D = D;
    c.k = s == KVS_SCHEME_FP16 ? 0 : k;
    c.S = s == KVS_SCHEME_FP16 ? 0 : (S > T ? T : S);
    c.dt = dt;
    c.ntiles = ntiles;
    c.seed = seed;
    return c;
}

static void section(const char *what, unsigned pass0, unsigned fail0)
{
    printf("== %s: %u cases passed, %u failed\n", what, g_pass - pass0, g_fail - fail0);
    fflush(stdout);
}

static void section_a(int quick)
{
    static const uint32_t Ts[4] = {1, 16, 256, 1024}, Ds[4] = {8, 64, 128, 256};
    static const uint32_t ks[4] = {0, 1, 2, 4}, Ss[3] = {0, 1, 4};
    unsigned p0 = g_pass, f0 = g_fail, i = 0;
    for (int ti = 0; ti < 4; ti++)
        for (int di = 0; di < 4; di++)
            for (int si = 0; si < 4; si++)
                for (int kind = 0; kind < 2; kind++)
                    for (int dti = 0; dti < 3; dti++, i++) {
                        if (quick && i % 7 != 0)
                            continue;
                        tcase c =
                            make("A", k_schemes[si], (kvs_tile_kind)kind, Ts[ti], Ds[di], ks[i % 4],
                                 Ss[(i / 4) % 3], k_dtypes[dti], Ts[ti] >= 1024 ? 2 : 3, 1000 + i);
                        c.flavor = (int)(i % F_COUNT);
                        c.mixed = i % 11 == 4;
                        c.use_static = i % 5 == 2 ? 1 : i % 13 == 7 ? 2 : 0;
                        run_case(&c);
                    }
    section("A: T x D x scheme x kind x dtype", p0, f0);
}

static void section_b(int quick)
{
    static const uint32_t ks[6] = {0, 1, 2, 4, 8, 16}, Ss[4] = {0, 1, 4, 64};
    static const int strips[3] = {16, 32, 64};
    unsigned p0 = g_pass, f0 = g_fail, i = 0;
    for (int ki = 0; ki < 6; ki++)
        for (int si = 0; si < 4; si++)
            for (int kind = 0; kind < 2; kind++)
                for (int sc = 0; sc < 3; sc++, i++) {
                    if (quick && i % 5 != 0)
                        continue;
                    tcase c = make("B", k_schemes[sc], (kvs_tile_kind)kind, 256, 128, ks[ki],
                                   Ss[si], k_dtypes[i % 3], 3, 5000 + i);
                    c.flavor = i % 4 == 3 ? F_HOSTILE : F_REAL;
                    c.use_static = i % 6 == 1;
                    c.strip = kind == KVS_TILE_K ? strips[i % 3] : 0;
                    c.vchunks =
                        kind == KVS_TILE_V ? (int)(i / 2 % 4) : 0; /* 0 = auto, 1, 2, 3 -> 4 */
                    if (c.vchunks == 3)
                        c.vchunks = 4;
                    run_case(&c);
                }
    section("B: k x S sweep, K strips 16/32/64, V lane chunks 1/2/4", p0, f0);
}

static void section_c(int quick)
{
    static const struct {
        uint32_t T, D;
    } shapes[] = {{1, 1},    {2, 3},    {17, 7},    {63, 12},  {16, 100}, {5, 1000},
                  {3, 1024}, {2, 1024}, {1000, 24}, {17, 300}, {33, 520}, {64, 9}};
    unsigned p0 = g_pass, f0 = g_fail, i = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int sc = 0; sc < 4; sc++)
            for (int kind = 0; kind < 2; kind++, i++) {
                if (quick && i % 3 != 0)
                    continue;
                kvs_dtype dt = k_dtypes[(s + (size_t)sc) % 3];
                tcase c = make("C", k_schemes[sc], (kvs_tile_kind)kind, shapes[s].T, shapes[s].D,
                               (uint32_t)(i % 5 == 0 ? 16 : i % 5), (uint32_t)(i % 3 == 0 ? 2 : 0),
                               dt, 3, 9000 + i);
                c.flavor = (int)(i % F_COUNT);
                c.use_static = i % 4 == 1;
                c.strip = kind == KVS_TILE_K ? (int[]){0, 16, 32, 64}[i % 4] : 0;
                c.vchunks = kind == KVS_TILE_V ? (int[]){0, 1, 2, 4}[i / 2 % 4] : 0;
                run_case(&c);
                /* The widest V rows exist only in fp32 (D = 1024: 8 chunks per lane). */
                if (shapes[s].D == 1024 && kind == KVS_TILE_V && sc == 0) {
                    tcase w = c;
                    w.dt = KVS_DTYPE_FP32;
                    w.seed += 77;
                    run_case(&w);
                }
            }
    section("C: odd shapes", p0, f0);
}

static void section_d(void)
{
    unsigned p0 = g_pass, f0 = g_fail;
    for (int kind = 0; kind < 2; kind++) {
        tcase c = make("D", KVS_SCHEME_FP8_E4M3, (kvs_tile_kind)kind, 256, 128, 2, 0,
                       KVS_DTYPE_FP16, 64, 12000 + (uint64_t)kind);
        c.flavor = F_REAL;
        run_case(&c);
        c = make("D", KVS_SCHEME_INT8, (kvs_tile_kind)kind, 1024, 128, 2, 4, KVS_DTYPE_BF16, 32,
                 12010 + (uint64_t)kind);
        c.flavor = F_REAL;
        c.use_static = 1;
        run_case(&c);
    }
    section("D: large launches", p0, f0);
}

/* The K-tile kernel variants (kvs_cuda_tile_tuning.k_variant 1..4): every
 * 8-bit scheme x T in {1, 16, 256, 1024} x D in {8, 64, 128, 256} x every
 * dtype, k in {0,1,2,4} and S in {0,1,4} cycling, flavors (hostile included)
 * cycling; then odd shapes (D not a multiple of the lane width, odd T), a
 * launch of 64 tiles, and k = 8 (falls back to the strip kernel). */
static void section_k(int quick)
{
    static const uint32_t Ts[4] = {1, 16, 256, 1024}, Ds[4] = {8, 64, 128, 256};
    static const uint32_t ks[4] = {0, 1, 2, 4}, Ss[3] = {0, 1, 4};
    static const struct {
        uint32_t T, D;
    } odd[] = {{1, 1}, {2, 3}, {17, 7}, {63, 12}, {16, 100}, {5, 1000}, {1000, 24}, {33, 520}};
    unsigned p0 = g_pass, f0 = g_fail, i = 0;
    for (int v = 1; v <= 4; v++) {
        for (int ti = 0; ti < 4; ti++)
            for (int di = 0; di < 4; di++)
                for (int si = 0; si < 3; si++)
                    for (int dti = 0; dti < 3; dti++, i++) {
                        if (quick && i % 4 != 0)
                            continue;
                        tcase c = make("K", k_schemes[si], KVS_TILE_K, Ts[ti], Ds[di], ks[i % 4],
                                       Ss[(i / 4) % 3], k_dtypes[dti], Ts[ti] >= 1024 ? 2 : 3,
                                       30000 + i);
                        c.flavor = (int)(i % F_COUNT);
                        c.mixed = i % 11 == 4;
                        c.use_static = i % 5 == 2 ? 1 : i % 13 == 7 ? 2 : 0;
                        c.kvariant = v;
                        run_case(&c);
                    }
        for (size_t s = 0; s < sizeof odd / sizeof odd[0]; s++, i++) {
            tcase c = make("K", k_schemes[(s + (size_t)v) % 3], KVS_TILE_K, odd[s].T, odd[s].D,
                           ks[i % 4], (uint32_t)(i % 3 == 0 ? 2 : 0), k_dtypes[(s + (size_t)v) % 3],
                           3, 31000 + i);
            c.flavor = (int)(i % F_COUNT);
            c.use_static = i % 4 == 1;
            c.kvariant = v;
            run_case(&c);
        }
        tcase c = make("K", KVS_SCHEME_FP8_E4M3, KVS_TILE_K, 256, 128, 2, 0, KVS_DTYPE_FP16, 64,
                       32000 + (uint64_t)v);
        c.flavor = F_REAL;
        c.kvariant = v;
        run_case(&c);
        c = make("K", KVS_SCHEME_INT8, KVS_TILE_K, 1024, 128, 4, 4, KVS_DTYPE_BF16, 8,
                 32010 + (uint64_t)v);
        c.flavor = F_HOSTILE;
        c.use_static = 1;
        c.kvariant = v;
        run_case(&c);
        c = make("K", KVS_SCHEME_FP8_E5M2, KVS_TILE_K, 256, 128, 8, 1, KVS_DTYPE_FP32, 3,
                 32020 + (uint64_t)v);
        c.flavor = F_HOSTILE;
        c.kvariant = v; /* k > 4: the strip kernel */
        run_case(&c);
    }
    section("K: K-tile kernel variants 1-4 (column warps)", p0, f0);
}

static void section_e(void)
{
    unsigned p0 = g_pass, f0 = g_fail;
    kvs_cuda_tile_job dummy; /* never dereferenced: every call below fails its checks */
    const kvs_cuda_tile_job *jobs = &dummy;
    kvs_tile_params good = {KVS_SCHEME_FP8_E4M3, KVS_TILE_V, 16, 128, 2, 0, NULL, 0.0f, 0};
    struct {
        const char *what;
        kvs_tile_params p;
        kvs_dtype dt;
        int null_jobs;
    } bad[] = {
        {"T = 0",
         {KVS_SCHEME_FP8_E4M3, KVS_TILE_V, 0, 128, 2, 0, NULL, 0.0f, 0},
         KVS_DTYPE_FP16,
         0},
        {"T = 1025",
         {KVS_SCHEME_FP8_E4M3, KVS_TILE_V, 1025, 128, 2, 0, NULL, 0.0f, 0},
         KVS_DTYPE_FP16,
         0},
        {"D = 0", {KVS_SCHEME_FP8_E4M3, KVS_TILE_K, 16, 0, 2, 0, NULL, 0.0f, 0}, KVS_DTYPE_FP16, 0},
        {"k = 17", {KVS_SCHEME_INT8, KVS_TILE_K, 16, 128, 17, 0, NULL, 0.0f, 0}, KVS_DTYPE_FP16, 0},
        {"S > T", {KVS_SCHEME_INT8, KVS_TILE_K, 16, 128, 2, 17, NULL, 0.0f, 0}, KVS_DTYPE_FP16, 0},
        {"fp16 with k",
         {KVS_SCHEME_FP16, KVS_TILE_K, 16, 128, 2, 0, NULL, 0.0f, 0},
         KVS_DTYPE_FP16,
         0},
        {"scheme 9", {(kvs_scheme)9, KVS_TILE_K, 16, 128, 2, 0, NULL, 0.0f, 0}, KVS_DTYPE_FP16, 0},
        {"kind 2",
         {KVS_SCHEME_INT8, (kvs_tile_kind)2, 16, 128, 2, 0, NULL, 0.0f, 0},
         KVS_DTYPE_FP16,
         0},
        {"dtype 7", {KVS_SCHEME_INT8, KVS_TILE_K, 16, 128, 2, 0, NULL, 0.0f, 0}, (kvs_dtype)7, 0},
        {"jobs NULL",
         {KVS_SCHEME_INT8, KVS_TILE_K, 16, 128, 2, 0, NULL, 0.0f, 0},
         KVS_DTYPE_FP16,
         1},
        {"tensor_scale NaN",
         {KVS_SCHEME_FP8_E4M3, KVS_TILE_K, 16, 128, 2, 0, NULL, NAN, 0},
         KVS_DTYPE_FP16,
         0},
        {"tensor_scale -1",
         {KVS_SCHEME_FP8_E4M3, KVS_TILE_K, 16, 128, 2, 0, NULL, -1.0f, 0},
         KVS_DTYPE_FP16,
         0},
        {"tensor_scale Inf",
         {KVS_SCHEME_INT8, KVS_TILE_V, 16, 128, 2, 0, NULL, INFINITY, 0},
         KVS_DTYPE_FP16,
         0},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rq =
            kvs_cuda_quantize_tiles(&bad[i].p, bad[i].dt, bad[i].null_jobs ? NULL : jobs, 1, NULL);
        int rd = kvs_cuda_dequantize_tiles(
            &bad[i].p, bad[i].dt, bad[i].null_jobs ? NULL : (const kvs_cuda_detile_job *)jobs, 1,
            NULL);
        report(rq == KVS_EINVAL && rd == KVS_EINVAL, "E: %s -> quantize %s, dequantize %s (%s)",
               bad[i].what, kvs_errname(rq), kvs_errname(rd), kvs_cuda_last_error());
    }
    report(kvs_cuda_quantize_tiles(NULL, KVS_DTYPE_FP16, jobs, 1, NULL) == KVS_EINVAL,
           "E: params NULL -> KVS_EINVAL");
    {
        /* Key offsets (kv_format.h rule 5) exist for K tiles of 8-bit schemes
         * only: on a V tile or the fp16 scheme they are refused before any
         * launch (section O runs the valid ones). */
        static const kvs_tile_params koff_bad[2] = {
            {KVS_SCHEME_INT8, KVS_TILE_V, 16, 128, 2, 0, NULL, 0.0f, 1},
            {KVS_SCHEME_FP16, KVS_TILE_K, 16, 128, 0, 0, NULL, 0.0f, 1}};
        for (int i = 0; i < 2; i++) {
            int rq = kvs_cuda_quantize_tiles(&koff_bad[i], KVS_DTYPE_FP16, jobs, 1, NULL);
            int rd = kvs_cuda_dequantize_tiles(&koff_bad[i], KVS_DTYPE_FP16,
                                               (const kvs_cuda_detile_job *)jobs, 1, NULL);
            report(rq == KVS_EINVAL && rd == KVS_EINVAL,
                   "E: key_offsets on a %s tile -> quantize %s, dequantize %s (want KVS_EINVAL)",
                   i ? "fp16 K" : "V", kvs_errname(rq), kvs_errname(rd));
        }
    }
    {
        /* p->static_scales is a host pointer the API must ignore, not read. */
        kvs_tile_params p = good;
        p.static_scales = (const float *)(uintptr_t)0x10; /* would fault if read */
        report(kvs_cuda_quantize_tiles(&p, KVS_DTYPE_FP16, NULL, 0, NULL) == KVS_OK,
               "E: n = 0 -> KVS_OK, p->static_scales not read");
        report(kvs_cuda_dequantize_tiles(&good, KVS_DTYPE_FP16, NULL, 0, NULL) == KVS_OK,
               "E: dequantize n = 0 -> KVS_OK");
    }
    section("E: parameter errors", p0, f0);
}

/* Exhaustive and boundary data through the paths that use hardware conversions:
 * fp32 -> fp16 narrowing (cvt.rn.f16.f32) on every fp16 rounding boundary, every
 * fp16 and bf16 pattern through the fp16 scheme and back out to each dtype, every
 * pattern as an outlier, and decoded values scaled from 2^-40 to 2^40 (subnormal
 * and overflowing fp16 results). */
static void section_f(void)
{
    unsigned p0 = g_pass, f0 = g_fail;
    static const kvs_dtype dts[3] = {KVS_DTYPE_FP32, KVS_DTYPE_FP16, KVS_DTYPE_BF16};
    for (int i = 0; i < 3; i++) {
        tcase c = make("F", KVS_SCHEME_FP16, KVS_TILE_V, dts[i] == KVS_DTYPE_FP32 ? 1024 : 64,
                       dts[i] == KVS_DTYPE_FP32 ? 256 : 1024, 0, 0, dts[i], 1, 20000 + (uint64_t)i);
        c.flavor = F_SEQ;
        run_case(&c);
    }
    for (int i = 0; i < 2; i++)
        for (int kind = 0; kind < 2; kind++) {
            tcase c = make("F", KVS_SCHEME_FP8_E4M3, (kvs_tile_kind)kind, 64, 1024, 16, 1,
                           dts[1 + i], 1, 20010 + (uint64_t)(2 * i + kind));
            c.flavor = F_SEQ;
            run_case(&c);
        }
    for (int sc = 0; sc < 3; sc++)
        for (int kind = 0; kind < 2; kind++) {
            tcase c = make("F", k_schemes[sc], (kvs_tile_kind)kind, 1024, 256, 2, 0, KVS_DTYPE_FP16,
                           1, 20020 + (uint64_t)(2 * sc + kind));
            c.flavor = sc == 2 ? F_HOSTILE : F_REAL;
            c.use_static = 3;
            run_case(&c);
        }
    section("F: exhaustive patterns and scale sweeps", p0, f0);
}

/* kvs_tile_params.tensor_scale (FP8 group scales aligned to a per-tensor
 * scale; int8 and fp16 ignore it): every scheme, kind and dtype, every
 * kernel (K strip and column-warp variants, V lane chunks), dynamic and
 * static scales, all flavors (all-zero tiles included), with tensor scales
 * that are ordinary, exact fp16, fp16 subnormal, below fp16 (-> 2^-24), at and
 * beyond 65504 (group scales clamp) and FLT_MAX; tests/conformance/
 * test_kvq_cpu.c's tensor_scale test runs the same values on the CPU. */
static void section_t(int quick)
{
    static const float tsv[] = {0.37f,    1.0f,     0x1.8p-24f,  0x1.ff8p-15f,
                                0x1p-14f, 1.0e-30f, FLT_MIN,     0x1.ffcp15f,
                                1.0e6f,   FLT_MAX,  0x1.554p-3f, 2.5e-5f};
    static const struct {
        uint32_t T, D;
    } shapes[] = {{16, 24}, {256, 128}, {17, 7}, {1024, 64}, {33, 520}, {1, 8}};
    unsigned p0 = g_pass, f0 = g_fail, i = 0;
    const size_t nts = sizeof tsv / sizeof tsv[0], nsh = sizeof shapes / sizeof shapes[0];
    for (size_t ti = 0; ti < nts; ti++)
        for (int sc = 0; sc < 4; sc++)
            for (int kind = 0; kind < 2; kind++, i++) {
                if (quick && i % 3 != 0)
                    continue;
                const size_t s = (ti + (size_t)sc + (size_t)kind) % nsh;
                tcase c = make("T", k_schemes[sc], (kvs_tile_kind)kind, shapes[s].T, shapes[s].D,
                               (uint32_t)(i % 5), (uint32_t)(i % 3 == 0 ? 1 : 0), k_dtypes[i % 3],
                               3, 40000 + i);
                c.tensor_scale = tsv[ti];
                c.flavor = (int)(i % F_COUNT);
                c.mixed = i % 7 == 3;
                c.use_static = i % 4 == 1 ? 1 : i % 9 == 5 ? 3 : 0;
                if (kind == KVS_TILE_K)
                    c.kvariant = (int)(i / 2 % 5); /* 0 = strip, 1..4 column warps */
                else
                    c.vchunks = (int[]){0, 1, 2, 4}[i / 2 % 4];
                run_case(&c);
            }
    /* the deployment shape: 64 tiles, defaults (3, 2), S = 1, fp16 source */
    for (int sc = 0; sc < 2; sc++)
        for (int kind = 0; kind < 2; kind++) {
            tcase c =
                make("T", k_schemes[sc], (kvs_tile_kind)kind, 256, 128, kind == KVS_TILE_K ? 3 : 2,
                     1, KVS_DTYPE_FP16, 64, 41000 + (uint64_t)(2 * sc + kind));
            c.tensor_scale = 0.5f;
            c.flavor = F_REAL;
            run_case(&c);
        }
    section("T: tensor_scale (aligned FP8 scales)", p0, f0);
}

/* Key offsets (kv_format.h rule 5; K tiles of the 8-bit schemes): every
 * scheme x dtype x T in {1, 16, 256, 1024} x D in {8, 64, 128, 256}, k in
 * {0, 1, 2, 4, 8, 16} and S in {0, 1, 4} cycling, channels centred away from
 * 0 on every third case and the other flavors (hostile, NaN, huge included)
 * on the rest, strips 16/32/64, column-warp variants asked for (they leave
 * key offsets to the strip kernel), static and tensor scales; odd shapes;
 * 64-tile launches at the deployment shape. run_case checks the dequantized
 * views too. */
static void section_o(int quick)
{
    static const uint32_t Ts[4] = {1, 16, 256, 1024}, Ds[4] = {8, 64, 128, 256};
    static const uint32_t ks[6] = {0, 1, 2, 4, 8, 16}, Ss[3] = {0, 1, 4};
    static const struct {
        uint32_t T, D;
    } odd[] = {{2, 3}, {17, 7}, {63, 12}, {16, 100}, {5, 1000}, {1000, 24}, {33, 520}};
    unsigned p0 = g_pass, f0 = g_fail, i = 0;
    for (int ti = 0; ti < 4; ti++)
        for (int di = 0; di < 4; di++)
            for (int si = 0; si < 3; si++)
                for (int dti = 0; dti < 3; dti++, i++) {
                    if (quick && i % 3 != 0)
                        continue;
                    tcase c =
                        make("O", k_schemes[si], KVS_TILE_K, Ts[ti], Ds[di], ks[i % 6],
                             Ss[(i / 6) % 3], k_dtypes[dti], Ts[ti] >= 1024 ? 2 : 3, 50000 + i);
                    c.koff = 1;
                    c.flavor = i % 3 == 0 ? F_SHIFT : (int)(i / 3 % F_COUNT);
                    c.mixed = i % 11 == 4;
                    c.use_static = i % 5 == 2;
                    c.strip = (int[]){0, 16, 32, 64}[i / 2 % 4];
                    c.kvariant = i % 7 == 3 ? 1 + (int)(i % 4) : 0;
                    c.tensor_scale = i % 9 == 4 ? 0.37f : 0.0f;
                    run_case(&c);
                }
    for (size_t s = 0; s < sizeof odd / sizeof odd[0]; s++, i++) {
        tcase c = make("O", k_schemes[s % 3], KVS_TILE_K, odd[s].T, odd[s].D, ks[s % 6],
                       (uint32_t)(s % 3 == 0 ? 2 : 0), k_dtypes[(s + 1) % 3], 3, 51000 + i);
        c.koff = 1;
        c.flavor = s % 2 ? F_SHIFT : F_HOSTILE;
        c.use_static = s % 4 == 1;
        run_case(&c);
    }
    for (int sc = 0; sc < 3; sc++) { /* the deployment shape: 64 tiles, k = 3, S = 1 */
        tcase c = make("O", k_schemes[sc], KVS_TILE_K, 256, 128, 3, 1, KVS_DTYPE_FP16, 64,
                       52000 + (uint64_t)sc);
        c.koff = 1;
        c.flavor = F_SHIFT;
        run_case(&c);
    }
    section("O: key offsets (K tiles)", p0, f0);
}

int main(int argc, char **argv)
{
    int ndev = 0, major = 0, minor = 0;
    char name[256];
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0)
            quick = 1;
        else if (strcmp(argv[i], "-v") == 0)
            g_verbose = 1;
        else {
            printf("usage: test_kvq_cuda [--quick] [-v]\n");
            return 2;
        }
    }
    if (kvs_cuda_device_count(&ndev) != KVS_OK) {
        printf("SKIP test_kvq_cuda: no usable GPU (%s)\n", kvs_cuda_last_error());
        return SKIP;
    }
    if (kvs_cuda_device_info(name, sizeof name, &major, &minor) != KVS_OK) {
        printf("FAIL device info: %s\n", kvs_cuda_last_error());
        return 1;
    }
    printf("device 0: %s, compute capability %d.%d (%d device(s))%s\n", name, major, minor, ndev,
           quick ? ", quick subset" : "");
    section_e();
    section_a(quick);
    section_b(quick);
    section_c(quick);
    section_d();
    section_k(quick);
    section_f();
    section_t(quick);
    section_o(quick);
    printf("test_kvq_cuda: %u passed, %u failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
