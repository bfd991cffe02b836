/*
 * test_ingest_gpu.c — quantize on ingest on the GPU (codec.h KVS_CODEC_GPU,
 * kvstashd --ingest-backend gpu): the blocks it makes are the CPU's, byte for
 * byte. Built only with KVS_CUDA_ENABLED.
 *
 *   codec_gpu_equals_cpu   in-process (tests/gpu/ingest_cmp.h): kvs_codec_encode
 *                          with the GPU backend and with the CPU backend, whole
 *                          blocks compared (header, scheme table, every tile) and
 *                          the measured errors equal, over fp16/bf16/fp32 sources,
 *                          the four schemes, a mixed block (skip layers), root
 *                          (sinks) or not; the GPU counter grows, the fallback
 *                          counter does not.
 *   put_through_gpu        a real kvstashd --ingest-backend gpu: Stats says gpu;
 *                          Puts of every dtype and scheme; Get in the stored
 *                          format returns each layer's tiles exactly as the CPU
 *                          encode of the same payload has them; Stats counts the
 *                          layers on the GPU and no fallback.
 *
 * Without a usable GPU: checks that kvstashd --ingest-backend gpu refuses to
 * start, saying why, and that an explicit GPU encode falls back to the CPU
 * (counted, the same block), then exits 77 (skipped).
 */
#include "codec.h"
#include "ingest_cmp.h" /* tests/gpu: the in-process GPU-vs-CPU comparison */
#include "kvs_error.h"
#include "kvs_itest.h"
#include "kvs_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *g_kvstashd;

static void test_codec_gpu_equals_cpu(void)
{
    kvs_codec_counters c0, c1;
    kvs_codec_counters_get(&c0);
    unsigned blocks = 0;
    CU_ASSERT_EQUAL(kvs_ingest_cmp_run(&blocks), 0);
    kvs_codec_counters_get(&c1);
    CU_ASSERT(blocks > 0);
    CU_ASSERT(c1.layers_gpu > c0.layers_gpu);
    CU_ASSERT_EQUAL(c1.gpu_fallbacks, c0.gpu_fallbacks);
    printf("\n  %u blocks: GPU == CPU byte for byte\n", blocks);
}

typedef struct payload {
    uint32_t L;
    void **k, **v;
} payload;

static uint64_t g_seed = 0x2545f4914f6cdd1dull;

static payload make_payload(uint32_t L, unsigned dtype, size_t n)
{
    payload pl = {L, calloc(L, sizeof(void *)), calloc(L, sizeof(void *))};
    for (uint32_t l = 0; l < L; l++) {
        pl.k[l] = kvs_ingest_cmp_tensor(dtype, n, &g_seed);
        pl.v[l] = kvs_ingest_cmp_tensor(dtype, n, &g_seed);
    }
    return pl;
}

static void free_payload(payload *pl)
{
    for (uint32_t l = 0; l < pl->L; l++) {
        free(pl->k[l]);
        free(pl->v[l]);
    }
    free(pl->k);
    free(pl->v);
}

/* Get callback: compares each layer's stored tiles with the CPU block's. */
typedef struct cmp_ctx {
    const uint8_t *ref;
    size_t ref_len;
    unsigned layers_seen, mismatches;
} cmp_ctx;

static int cmp_layer(void *arg, unsigned b, unsigned layer, const void *k, size_t k_len,
                     const void *v, size_t v_len, float ks, float vs, int last)
{
    cmp_ctx *c = arg;
    (void)b, (void)ks, (void)vs, (void)last;
    const void *rk, *rv;
    size_t rkl, rvl;
    float s1, s2;
    char err[KVS_ERR_LEN];
    if (kvs_codec_egress_layer(c->ref, c->ref_len, layer, 0, NULL, NULL, &rk, &rkl, &rv, &rvl, &s1,
                               &s2, err) != 0 ||
        rkl != k_len || rvl != v_len || memcmp(rk, k, k_len) != 0 || memcmp(rv, v, v_len) != 0) {
        fprintf(stderr, "layer %u: stored tiles differ from the CPU encode (%zu/%zu vs %zu/%zu)\n",
                layer, k_len, v_len, rkl, rvl);
        c->mismatches++;
    }
    c->layers_seen++;
    return 0;
}

static double metric(kvs_client *cl, const char *name, const char *label, const char *value)
{
    kvs_stats *st = NULL;
    char err[KVS_ERR_LEN];
    if (kvs_client_stats(cl, name, 10000, &st, err) != 0)
        return -1;
    const kvs_metric *m = kvs_stats_find(st, name, label, value);
    double v = m ? m->value : -1;
    kvs_stats_free(st);
    return v;
}

static void test_put_through_gpu(void)
{
    const char *args[] = {"--ingest-backend",
                          "gpu",
                          "--k-outliers",
                          "2",
                          "--v-outliers",
                          "1",
                          "--sinks",
                          "2",
                          "--skip-layers",
                          "1",
                          "--log-level",
                          "warn",
                          NULL};
    kvs_server_proc p;
    CU_ASSERT_EQUAL_FATAL(kvs_itest_start(g_kvstashd, args, &p, "ingest gpu"), 0);
    kvs_client *cl = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_itest_open_client(p.addr, NULL, 0, 20000, &cl), 0);
    CU_ASSERT_EQUAL(metric(cl, "kvstash_ingest_backend", "backend", "gpu"), 1.0);
    CU_ASSERT_EQUAL(metric(cl, "kvstash_ingest_gpu_key_offsets", NULL, NULL), 1.0);
    double gpu0 = metric(cl, "kvstash_ingest_layers_total", "backend", "gpu");

    const uint32_t L = 3, H = 2, D = 64, T = 32;
    unsigned layers_put = 0;
    for (unsigned dtype = 1; dtype <= 3; dtype++) {
        for (unsigned scheme = 1; scheme <= 4; scheme++) {
            kvs_ns ns = {"gpu-ingest", NULL, L, H, D, T, dtype};
            unsigned char parent[KVS_CLIENT_KEY_LEN];
            for (unsigned idx = 0; idx < 2; idx++) { /* a root (sinks), then its child */
                unsigned tokens[32];
                for (unsigned i = 0; i < T; i++)
                    tokens[i] = 1000 * dtype + 100 * scheme + 10 * idx + i;
                payload pl = make_payload(L, dtype, (size_t)T * H * D);
                kvs_put_args a = {&ns,
                                  idx ? parent : NULL,
                                  idx,
                                  tokens,
                                  scheme,
                                  (const void *const *)pl.k,
                                  (const void *const *)pl.v};
                kvs_put_result res;
                memset(&res, 0, sizeof res);
                char err[KVS_ERR_LEN] = "";
                int rc = kvs_client_put(cl, &a, 20000, &res, err);
                CU_ASSERT_EQUAL(rc, 0);
                if (rc != 0) {
                    fprintf(stderr, "put: %s\n", err);
                    free_payload(&pl);
                    continue;
                }
                layers_put += L;
                memcpy(parent, res.key, sizeof parent);
                /* What the CPU makes of the same payload, as the server was told to. */
                uint8_t schemes[3] = {(uint8_t)scheme, 1, (uint8_t)scheme}; /* layer 1 skipped */
                kvs_codec_layout lay = {L, H, D,       T,    dtype, idx == 0, 2,
                                        1, 2, schemes, NULL, NULL,  0};
                size_t size = kvs_codec_block_size(&lay, err);
                CU_ASSERT_EQUAL(res.stored_bytes, size);
                uint8_t *ref = aligned_alloc(64, (size + 63) / 64 * 64);
                float ke[3], ve[3];
                CU_ASSERT_EQUAL(kvs_codec_encode(KVS_CODEC_CPU, &lay, (const void *const *)pl.k,
                                                 (const void *const *)pl.v, ref, size, ke, ve, err),
                                0);
                cmp_ctx c = {ref, size, 0, 0};
                const unsigned char(*keys)[KVS_CLIENT_KEY_LEN] =
                    (const unsigned char(*)[KVS_CLIENT_KEY_LEN])res.key;
                CU_ASSERT_EQUAL(kvs_client_get(cl, &ns, keys, 1, KVS_EGRESS_STORED, 0, 20000,
                                               cmp_layer, &c, err),
                                0);
                CU_ASSERT_EQUAL(c.layers_seen, L);
                CU_ASSERT_EQUAL(c.mismatches, 0);
                free(ref);
                free_payload(&pl);
            }
        }
    }
    CU_ASSERT_EQUAL(metric(cl, "kvstash_ingest_layers_total", "backend", "gpu") - gpu0,
                    (double)layers_put);
    CU_ASSERT_EQUAL(metric(cl, "kvstash_ingest_gpu_fallbacks_total", NULL, NULL), 0.0);
    printf("\n  %u layers put through kvstashd's GPU backend; stored tiles == CPU encode\n",
           layers_put);
    kvs_client_close(cl);
    CU_ASSERT_EQUAL(kvs_itest_stop(&p, 5000), 0);
}

/* No GPU here: kvstashd --ingest-backend gpu must refuse to start, saying so. */
static int gpu_refused(void)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "timeout 20 '%s' --listen 127.0.0.1:0 --ingest-backend gpu 2>&1; echo \"exit=$?\"",
             g_kvstashd);
    FILE *f = popen(cmd, "r");
    if (f == NULL)
        return 0;
    char out[4096];
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = '\0';
    pclose(f);
    int ok = strstr(out, "ingest_backend gpu") != NULL && strstr(out, "exit=0") == NULL &&
             strstr(out, "exit=124") == NULL;
    fprintf(stderr, "%s: kvstashd --ingest-backend gpu without a GPU: %s", ok ? "ok" : "FAIL", out);
    return ok;
}

/* No GPU here: an explicit GPU encode must fail over to the CPU, layer by layer,
 * counted, and still produce the CPU's block. */
static int gpu_falls_back(void)
{
    static const uint8_t schemes[3] = {4, 1, 2};
    const uint32_t L = 3, H = 2, D = 64, T = 32;
    kvs_codec_layout lay = {L, H, D, T, 1, 1, 2, 1, 1, schemes, NULL, NULL, 0};
    char err[KVS_ERR_LEN] = "";
    size_t size = kvs_codec_block_size(&lay, err);
    payload pl = make_payload(L, 1, (size_t)T * H * D);
    uint8_t *cpu = aligned_alloc(64, (size + 63) / 64 * 64);
    uint8_t *gpu = aligned_alloc(64, (size + 63) / 64 * 64);
    float ke[2][3], ve[2][3];
    kvs_codec_counters c0, c1;
    kvs_codec_counters_get(&c0);
    int rc1 = kvs_codec_encode(KVS_CODEC_CPU, &lay, (const void *const *)pl.k,
                               (const void *const *)pl.v, cpu, size, ke[0], ve[0], err);
    int rc2 = kvs_codec_encode(KVS_CODEC_GPU, &lay, (const void *const *)pl.k,
                               (const void *const *)pl.v, gpu, size, ke[1], ve[1], err);
    kvs_codec_counters_get(&c1);
    int ok = size > 0 && rc1 == 0 && rc2 == 0 && memcmp(cpu, gpu, size) == 0 &&
             c1.gpu_fallbacks - c0.gpu_fallbacks == L && c1.layers_gpu == c0.layers_gpu &&
             c1.layers_cpu - c0.layers_cpu == 2 * (uint64_t)L;
    fprintf(stderr,
            "%s: without a GPU, a GPU encode of %u layers fell back to the CPU %llu times, "
            "same block: %s\n",
            ok ? "ok" : "FAIL", L, (unsigned long long)(c1.gpu_fallbacks - c0.gpu_fallbacks),
            rc2 == 0 && memcmp(cpu, gpu, size) == 0 ? "yes" : "no");
    free(cpu);
    free(gpu);
    free_payload(&pl);
    return ok;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s KVSTASHD\n", argv[0]);
        return 2;
    }
    g_kvstashd = argv[1];
    char err[KVS_ERR_LEN] = "";
    if (kvs_codec_backend_select(2, NULL, err) != 0) {
        if (!gpu_refused() || !gpu_falls_back())
            return 1;
        printf("SKIP: no usable GPU (%s)\n", err);
        return KVS_TEST_SKIP;
    }
    static const kvs_test_case cases[] = {
        {"codec_gpu_equals_cpu", test_codec_gpu_equals_cpu},
        {"put_through_gpu", test_put_through_gpu},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {{"ingest_gpu", NULL, NULL, cases},
                                            {NULL, NULL, NULL, NULL}};
    return kvs_test_run(suites);
}
