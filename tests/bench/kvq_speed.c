/*
 * kvq_speed.c — how fast the CPU tile codec (kvq_cpu.h) quantizes and
 * dequantizes, next to memcpy of the same bytes measured in the same run.
 *
 *   kvq_speed [--tiles N] [--reps N] [--isa portable|avx2|avx512] [--aligned]
 *
 * Workload: the common case of DESIGN.md §3 — fp16 source, T=256 tokens x
 * D=128, the default outliers per group (kvq_calib.h: K 3, V 2), no sinks — for
 * e4m3 and int8, K and V tiles, and K tiles with per-channel key offsets
 * (kvs_tile_params.key_offsets; rows "K+off", each also given as a ratio to
 * the plain K row of its scheme measured in the same run); dequantize back
 * to fp16. --aligned gives every tile the data's per-tensor
 * scale (kvs_tile_params.tensor_scale = amax / 448 over all tiles): the e4m3
 * rows then align their group scales to it, as with a calibration profile
 * (int8 ignores it). N tiles (default 512, 32 MiB of fp16) are processed
 * one after the other, and every cache line of every buffer is flushed
 * (clflush) before each repetition, so each pass streams from DRAM.
 * Throughput is GB/s of fp16 data (T*D*2 bytes per tile, in or out); memcpy
 * copies those same bytes tile by tile between buffers of the same sizes,
 * flushed the same way, with the same number of repetitions. Every figure is
 * the median of the repetitions, timed on this thread's CPU clock (so other
 * processes on a shared machine do not count; memory stalls do).
 *
 * Validates first (STYLE.md): on a sample of tiles every ISA's output must
 * equal the reference's byte for byte, quantized tile and dequantized fp16;
 * a mismatch exits 1 before anything is timed. Runs on one core (pinned).
 *
 * Prints one table per ISA (every ISA the machine has, or the one --isa
 * names), then — when built with the GPU part (KVQ_SPEED_GPU, from
 * tests/bench/kvq_speed_gpu.cu) — that part's own table, and last:
 *   RESULT quant_vs_memcpy=<r> dequant_vs_memcpy=<r>
 * for the best ISA measured: r is the slowest of its four quantize (or
 * dequantize) rows without key offsets divided by memcpy. Exit 0, or 1 on a validation failure,
 * a bad option or a failed GPU part.
 */
#include "../support/kvs_bench_stats.h"
#include "kv_format.h"
#include "kvq.h"
#include "kvq_calib.h"
#include "kvq_cpu.h"
#include "kvq_math.h"
#include "kvs_error.h"

#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <emmintrin.h>
#define HAVE_CLFLUSH 1
#endif

#if defined(KVQ_SPEED_GPU)
/* tests/bench/kvq_speed_gpu.cu: prints its own table; 0 ok, 77 no GPU, 1 failure. */
extern int kvq_speed_gpu(FILE *out);
#endif

#define T_TOK    256u
#define D_DIM    128u
#define MAX_REPS 1001

typedef struct cfg {
    kvs_scheme scheme;
    kvs_tile_kind kind;
    const char *name;
    unsigned koff; /* key offsets; CFGS[plain] is the same tile without */
    size_t plain;
} cfg;

static const cfg CFGS[] = {
    {KVS_SCHEME_FP8_E4M3, KVS_TILE_K, "e4m3 K", 0, 0},
    {KVS_SCHEME_FP8_E4M3, KVS_TILE_V, "e4m3 V", 0, 0},
    {KVS_SCHEME_INT8, KVS_TILE_K, "int8 K", 0, 0},
    {KVS_SCHEME_INT8, KVS_TILE_V, "int8 V", 0, 0},
    {KVS_SCHEME_FP8_E4M3, KVS_TILE_K, "e4m3 K+off", 1, 0},
    {KVS_SCHEME_INT8, KVS_TILE_K, "int8 K+off", 1, 2},
};
#define NCFG (sizeof CFGS / sizeof CFGS[0])

/* This thread's CPU time: on a shared machine, time spent descheduled is not
 * the codec's (memory stalls still count: the thread is running). */
static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t g_rng = 0xC0FFEEu;
static uint64_t rnd(void) /* splitmix64 */
{
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float gauss(void) /* Irwin-Hall, good enough for KV-like data */
{
    double s = 0;
    for (int i = 0; i < 4; i++)
        s += (double)(rnd() >> 11) / 9007199254740992.0;
    return (float)((s - 2.0) * 1.73);
}

static void *xalloc(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64) != 0) {
        fprintf(stderr, "kvq_speed: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    memset(p, 0, n); /* touch every page before timing */
    return p;
}

/* Evicts [p, p+n) from every cache level. */
static void flush(const void *p, size_t n)
{
#if defined(HAVE_CLFLUSH)
    const char *c = (const char *)p;
    for (size_t i = 0; i < n; i += 64)
        _mm_clflush(c + i);
    _mm_mfence();
#else
    /* no clflush: stream through a buffer far larger than any last-level cache */
    static unsigned char *junk;
    static const size_t junk_bytes = (size_t)512 << 20;
    (void)p;
    (void)n;
    if (!junk)
        junk = xalloc(junk_bytes);
    for (size_t i = 0; i < junk_bytes; i += 64)
        junk[i]++;
#endif
}

typedef struct bench {
    size_t tiles, tile_bytes, fp16_bytes;
    int reps;
    uint16_t *src;    /* tiles x [T][D] fp16 */
    unsigned char *q; /* tiles x tile_bytes */
    uint16_t *dq;     /* tiles x [T][D] fp16 */
    uint16_t *copy;   /* memcpy destination, same size as src */
} bench;

static float g_tensor_scale; /* --aligned: the data's amax / 448; else 0 */

static kvs_tile_params params_of(const cfg *c)
{
    const unsigned k =
        c->kind == KVS_TILE_K ? KVS_QUANT_DEFAULT_K_OUTLIERS : KVS_QUANT_DEFAULT_V_OUTLIERS;
    kvs_tile_params p = {c->scheme, c->kind, T_TOK, D_DIM, k, 0, NULL, g_tensor_scale, c->koff};
    return p;
}

/* Realistic keys/values: gaussian rows of varying scale, 3 key channels 10-20x
 * the rest, an occasional large token. */
static void fill_src(bench *b)
{
    for (size_t i = 0; i < b->tiles; i++) {
        uint16_t *x = b->src + i * T_TOK * D_DIM;
        float ch[D_DIM];
        for (unsigned d = 0; d < D_DIM; d++)
            ch[d] = 1.0f;
        for (int j = 0; j < 3; j++)
            ch[rnd() % D_DIM] = 10.0f + (float)(rnd() % 11);
        for (unsigned t = 0; t < T_TOK; t++) {
            float rs = 0.5f + (float)(rnd() % 1000) * 1e-3f;
            if (rnd() % 64 == 0)
                rs *= 100.0f;
            for (unsigned d = 0; d < D_DIM; d++)
                x[t * D_DIM + d] = kvq_f32_to_fp16(gauss() * ch[d] * rs);
        }
    }
}

/* Fast == reference on a sample of tiles, for every config; 0 or 1. */
static int validate(bench *b, kvs_cpu_isa isa)
{
    unsigned char *want = xalloc(b->tile_bytes), *got = xalloc(b->tile_bytes);
    uint16_t *dw = xalloc(b->fp16_bytes), *dg = xalloc(b->fp16_bytes);
    char err[KVS_ERR_LEN];
    int bad = 0, checked = 0;
    if (kvs_cpu_isa_force(isa) != 0)
        return 1;
    for (size_t c = 0; c < NCFG; c++) {
        kvs_tile_params p = params_of(&CFGS[c]);
        for (size_t i = 0; i < b->tiles; i += 1 + b->tiles / 16) {
            const uint16_t *src = b->src + i * T_TOK * D_DIM;
            size_t size = kvs_tile_size(&p);
            if (kvs_tile_quantize_ref(&p, src, KVS_DTYPE_FP16, D_DIM, want, size, err) ||
                kvs_tile_quantize(&p, src, KVS_DTYPE_FP16, D_DIM, got, size, err) ||
                memcmp(want, got, size) != 0) {
                fprintf(stderr, "kvq_speed: VALIDATION FAILED [%s] quantize %s tile %zu %s\n",
                        kvs_cpu_isa_name(isa), CFGS[c].name, i, err);
                bad = 1;
                continue;
            }
            if (kvs_tile_dequantize_ref(want, size, KVS_DTYPE_FP16, dw, D_DIM, err) ||
                kvs_tile_dequantize(want, size, KVS_DTYPE_FP16, dg, D_DIM, err) ||
                memcmp(dw, dg, b->fp16_bytes) != 0) {
                fprintf(stderr, "kvq_speed: VALIDATION FAILED [%s] dequantize %s tile %zu %s\n",
                        kvs_cpu_isa_name(isa), CFGS[c].name, i, err);
                bad = 1;
            }
            checked++;
        }
    }
    printf("validated %s: %d tiles x (quantize + dequantize) == reference%s\n",
           kvs_cpu_isa_name(isa), checked, bad ? " -- MISMATCH" : "");
    free(want);
    free(got);
    free(dw);
    free(dg);
    return bad;
}

/* One timed pass per repetition; returns the median GB/s of fp16 bytes. */
enum op { OP_MEMCPY, OP_QUANT, OP_DEQUANT };

static double run(bench *b, enum op op, const cfg *c)
{
    double t[MAX_REPS];
    kvs_tile_params p = c ? params_of(c) : (kvs_tile_params){0};
    const size_t elems = (size_t)T_TOK * D_DIM;
    const size_t src_bytes = b->tiles * b->fp16_bytes, q_bytes = b->tiles * b->tile_bytes;
    for (int r = 0; r < b->reps; r++) {
        int rc = 0;
        flush(b->src, src_bytes);
        flush(b->q, q_bytes);
        flush(b->dq, src_bytes);
        flush(b->copy, src_bytes);
        double t0 = now();
        for (size_t i = 0; i < b->tiles; i++) {
            switch (op) {
            case OP_MEMCPY:
                memcpy(b->copy + i * elems, b->src + i * elems, b->fp16_bytes);
                break;
            case OP_QUANT:
                rc |= kvs_tile_quantize(&p, b->src + i * elems, KVS_DTYPE_FP16, D_DIM,
                                        b->q + i * b->tile_bytes, b->tile_bytes, NULL);
                break;
            case OP_DEQUANT:
                rc |= kvs_tile_dequantize(b->q + i * b->tile_bytes, b->tile_bytes, KVS_DTYPE_FP16,
                                          b->dq + i * elems, D_DIM, NULL);
                break;
            }
        }
        t[r] = now() - t0;
        if (rc) {
            fprintf(stderr, "kvq_speed: a call failed during timing\n");
            exit(1);
        }
    }
    return (double)src_bytes / kvs_bench_median(t, b->reps) / 1e9;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: kvq_speed [--tiles N] [--reps N] [--isa portable|avx2|avx512] [--aligned]\n");
}

int main(int argc, char **argv)
{
    bench b;
    memset(&b, 0, sizeof b);
    b.tiles = 512;
    b.reps = 11;
    int only = -1, aligned = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--aligned") == 0) {
            aligned = 1;
        } else if (i + 1 < argc && strcmp(argv[i], "--tiles") == 0) {
            long v = strtol(argv[++i], NULL, 10);
            if (v < 1 || v > 1 << 20) {
                usage();
                return 1;
            }
            b.tiles = (size_t)v;
        } else if (i + 1 < argc && strcmp(argv[i], "--reps") == 0) {
            long v = strtol(argv[++i], NULL, 10);
            if (v < 1 || v > MAX_REPS) {
                usage();
                return 1;
            }
            b.reps = (int)v;
        } else if (i + 1 < argc && strcmp(argv[i], "--isa") == 0) {
            const char *n = argv[++i];
            for (int k = KVS_CPU_PORTABLE; k <= KVS_CPU_AVX512; k++)
                if (strcmp(n, kvs_cpu_isa_name((kvs_cpu_isa)k)) == 0)
                    only = k;
            if (only < 0) {
                usage();
                return 1;
            }
            if (kvs_cpu_isa_force((kvs_cpu_isa)only) != 0) {
                fprintf(stderr, "kvq_speed: %s is not supported on this machine or build\n", n);
                return 1;
            }
        } else {
            usage();
            return 1;
        }
    }
    if (b.reps < 11)
        printf("note: %d repetitions (fewer than 11: the medians are noisy)\n", b.reps);

    /* one core: pin to the one we are on */
    cpu_set_t set;
    CPU_ZERO(&set);
    int cpu = sched_getcpu();
    CPU_SET(cpu >= 0 ? cpu : 0, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
        printf("note: could not pin to one CPU\n");

    kvs_tile_params p0 = params_of(&CFGS[0]);
    for (size_t c = 0; c < NCFG; c++) {
        kvs_tile_params p = params_of(&CFGS[c]);
        if (kvs_tile_size(&p) > b.tile_bytes)
            b.tile_bytes = kvs_tile_size(&p);
    }
    (void)p0;
    b.fp16_bytes = (size_t)T_TOK * D_DIM * 2;
    b.src = xalloc(b.tiles * b.fp16_bytes);
    b.q = xalloc(b.tiles * b.tile_bytes);
    b.dq = xalloc(b.tiles * b.fp16_bytes);
    b.copy = xalloc(b.tiles * b.fp16_bytes);
    fill_src(&b);
    if (aligned) {
        float amax = 0.0f;
        for (size_t i = 0; i < b.tiles * T_TOK * D_DIM; i++)
            amax = kvq_amax_update(amax, kvq_fp16_to_f32(b.src[i]));
        g_tensor_scale = kvq_scale_from_amax(amax, KVQ_E4M3_MAX);
        printf("aligned: tensor_scale %g (the data's amax / 448) on every tile\n",
               (double)g_tensor_scale);
    }

    kvs_cpu_isa isas[3];
    int nisa = 0;
    for (int k = KVS_CPU_PORTABLE; k <= KVS_CPU_AVX512; k++)
        if ((only < 0 || only == k) && (kvs_cpu_isa)k <= kvs_cpu_isa_detect())
            isas[nisa++] = (kvs_cpu_isa)k;
    int bad = 0;
    for (int i = 0; i < nisa; i++)
        bad |= validate(&b, isas[i]);
    if (bad)
        return 1;

    printf("kvq_speed: %zu tiles of T=%u x D=%u fp16 (%.1f MiB per pass), k K=%u V=%u, S=0, "
           "caches flushed before each of %d repetitions, one core (cpu %d); medians\n",
           b.tiles, T_TOK, D_DIM, (double)(b.tiles * b.fp16_bytes) / (1 << 20),
           KVS_QUANT_DEFAULT_K_OUTLIERS, KVS_QUANT_DEFAULT_V_OUTLIERS, b.reps, cpu);
    double q_ratio = 0, dq_ratio = 0;
    for (int i = 0; i < nisa; i++) {
        kvs_cpu_isa_force(isas[i]);
        double mc = run(&b, OP_MEMCPY, NULL);
        double qmin = 1e30, dmin = 1e30, qg[NCFG], dg[NCFG];
        printf("\n[%s]\n  %-12s %-10s %9s %10s %9s\n", kvs_cpu_isa_name(isas[i]), "op", "tile",
               "GB/s", "x memcpy", "x plain");
        printf("  %-12s %-10s %9.2f %10.3f\n", "memcpy", "-", mc, 1.0);
        for (size_t c = 0; c < NCFG; c++) {
            const cfg *f = &CFGS[c];
            double g = qg[c] = run(&b, OP_QUANT, f);
            printf("  %-12s %-10s %9.2f %10.3f", "quantize", f->name, g, g / mc);
            if (f->koff)
                printf(" %9.3f", g / qg[f->plain]);
            printf("\n");
            double d = dg[c] = run(&b, OP_DEQUANT, f); /* the tiles just quantized */
            printf("  %-12s %-10s %9.2f %10.3f", "dequantize", f->name, d, d / mc);
            if (f->koff)
                printf(" %9.3f", d / dg[f->plain]);
            printf("\n");
            if (!f->koff) {
                qmin = g < qmin ? g : qmin;
                dmin = d < dmin ? d : dmin;
            }
        }
        /* isas[] ascends, so the last one measured is the best */
        q_ratio = qmin / mc;
        dq_ratio = dmin / mc;
    }
    int rc = 0;
#if defined(KVQ_SPEED_GPU)
    printf("\n");
    fflush(stdout);
    int g = kvq_speed_gpu(stdout);
    fflush(stdout);
    printf("GPU part: %s (%d)\n", g == 0 ? "ok" : g == 77 ? "skipped, no GPU" : "FAILED", g);
    if (g != 0 && g != 77)
        rc = 1;
#endif
    printf("RESULT quant_vs_memcpy=%.3f dequant_vs_memcpy=%.3f\n", q_ratio, dq_ratio);
    free(b.src);
    free(b.q);
    free(b.dq);
    free(b.copy);
    return rc;
}
