/*
 * rules_bench.c — the cost of resolving a Put's scheme from the rule lists,
 * against the cost of the quantize-on-ingest that follows it.
 *
 *   rules_bench [RULES]     (RULES model rules and as many tenant rules; default 100)
 *
 * What kvs__put_header does per Put for the rules (service/data_put.c): copy the
 * config snapshot (kvs_config, now with two 4 KiB rule rows), find the tenant's
 * rule and the model's rule. Timed with RULES rules in each list, the matching
 * ones last (the worst case: every subject is read), and with empty lists. The
 * baseline, measured in the same run: kvs_codec_encode on the CPU of one block
 * of 64 tokens x 8 layers x 8 KV heads x head_dim 128, fp16 -> int8 (the block
 * service_bench puts). Validates first: the rules found are the expected ones,
 * and the encode succeeds. Medians of 9 repetitions, CPU time of this thread.
 * Last line: RESULT rules=<n> resolve_us=<x> resolve_empty_us=<y>
 *            encode_us=<z> resolve_vs_encode=<x/z>
 */
#include "codec.h"
#include "config.h"
#include "kvs_error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return v[n / 2];
}

static volatile unsigned g_sink;

/* Per-Put work of the rules: snapshot copy + tenant rule + model rule. */
static double resolve_us(const kvs_config *live, int iters)
{
    double t0 = cpu_us();
    for (int i = 0; i < iters; i++) {
        kvs_config snap = *live;                        /* kvs__config_snapshot */
        __asm__ volatile("" : : "r"(&snap) : "memory"); /* the copy is not elided */
        kvs_config_rule tr, mr;
        int ht = kvs_config_tenant_rule(&snap, "tenant-last", &tr);
        int hm = kvs_config_model_rule(&snap, "llama-3-8b-last", 15, &mr);
        g_sink += (unsigned)ht + (unsigned)hm + (hm ? mr.scheme : 0) + snap.listen[0];
    }
    return (cpu_us() - t0) / iters;
}

int main(int argc, char **argv)
{
    int nrules = argc > 1 ? atoi(argv[1]) : 100;
    if (nrules < 1 || nrules > 200) {
        fprintf(stderr, "usage: %s [RULES 1..200]\n", argv[0]);
        return 2;
    }
    kvs_config rules, empty;
    kvs_config_defaults(&rules);
    kvs_config_defaults(&empty);
    char *m = calloc(1, KVS_CONFIG_STR_MAX * 2), *t = calloc(1, KVS_CONFIG_STR_MAX * 2);
    size_t mu = 0, tu = 0;
    for (int i = 0; i < nrules - 1; i++) {
        mu += (size_t)snprintf(m + mu, KVS_CONFIG_STR_MAX * 2 - mu, "v%03d-* scheme=int8; ", i);
        tu += (size_t)snprintf(t + tu, KVS_CONFIG_STR_MAX * 2 - tu, "t%03d quota=1GiB; ", i);
    }
    snprintf(m + mu, KVS_CONFIG_STR_MAX * 2 - mu, "llama-3-8b-* scheme=fp8_e4m3 skip_layers=0,31");
    snprintf(t + tu, KVS_CONFIG_STR_MAX * 2 - tu, "tenant-last quota=8GiB fp16=false");
    char err[KVS_ERR_LEN];
    if (kvs_config_set_by_name(&rules, "model_rules", m, err) != 0 ||
        kvs_config_set_by_name(&rules, "tenant_rules", t, err) != 0) {
        fprintf(stderr, "FAIL: %d rules do not fit: %s\n", nrules, err);
        return 1;
    }
    /* Validate: the right rules are found, and none in the empty config. */
    kvs_config_rule r;
    if (!kvs_config_model_rule(&rules, "llama-3-8b-last", 15, &r) || r.scheme != 2 ||
        strcmp(r.subject, "llama-3-8b-*") != 0 ||
        !kvs_config_tenant_rule(&rules, "tenant-last", &r) || r.quota != (8ull << 30) ||
        kvs_config_model_rule(&empty, "llama-3-8b-last", 15, &r) ||
        kvs_config_tenant_rule(&empty, "tenant-last", &r)) {
        fprintf(stderr, "FAIL: the rule lookups do not find what they should\n");
        return 1;
    }
    /* The baseline block: 64 tokens x 8 layers x 8 heads x 128, fp16 -> int8. */
    const uint32_t L = 8, H = 8, D = 128, T = 64;
    uint8_t schemes[8] = {4, 4, 4, 4, 4, 4, 4, 4};
    kvs_codec_layout lay = {L, H, D, T, 1, 0, 2, 1, 1, schemes, NULL, NULL, 0};
    size_t size = kvs_codec_block_size(&lay, err), n = (size_t)T * H * D;
    void *k[8], *v[8];
    uint64_t s = 88172645463325252ull;
    for (uint32_t l = 0; l < L; l++) {
        uint16_t *a = malloc(n * 2), *b = malloc(n * 2);
        for (size_t i = 0; i < n; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            a[i] = (uint16_t)(0x3000 + (s & 0x0fff) + ((s >> 20) & 1) * 0x8000);
            b[i] = (uint16_t)(0x3000 + ((s >> 32) & 0x0fff));
        }
        k[l] = a;
        v[l] = b;
    }
    uint8_t *blk = aligned_alloc(64, (size + 63) / 64 * 64);
    float ke[8], ve[8];
    if (size == 0 || kvs_codec_encode(KVS_CODEC_CPU, &lay, (const void *const *)k,
                                      (const void *const *)v, blk, size, ke, ve, err) != 0) {
        fprintf(stderr, "FAIL: encode: %s\n", err);
        return 1;
    }
    enum { REPS = 9 };
    double rr[REPS], re[REPS], enc[REPS];
    for (int rep = 0; rep < REPS; rep++) {
        rr[rep] = resolve_us(&rules, 2000);
        re[rep] = resolve_us(&empty, 2000);
        double t0 = cpu_us();
        (void)kvs_codec_encode(KVS_CODEC_CPU, &lay, (const void *const *)k, (const void *const *)v,
                               blk, size, ke, ve, err);
        enc[rep] = cpu_us() - t0;
    }
    double mr = median(rr, REPS), me = median(re, REPS), mencode = median(enc, REPS);
    printf("rules per list %d (text %zu + %zu bytes): resolve %.2f us, empty lists %.2f us\n",
           nrules, strlen(rules.model_rules), strlen(rules.tenant_rules), mr, me);
    printf("CPU encode of one %zu-byte int8 block (%u layers): %.1f us\n", size, L, mencode);
    printf("RESULT rules=%d resolve_us=%.2f resolve_empty_us=%.2f encode_us=%.1f "
           "resolve_vs_encode=%.5f\n",
           nrules, mr, me, mencode, mr / mencode);
    for (uint32_t l = 0; l < L; l++) {
        free(k[l]);
        free(v[l]);
    }
    free(blk);
    free(m);
    free(t);
    return 0;
}
