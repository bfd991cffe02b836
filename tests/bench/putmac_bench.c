/*
 * putmac_bench.c — the CPU per byte of sealing a put over UCX
 * (common/kvs_putmac.h): kvs_putmac_seal (the worker, before it sends) and
 * kvs_putmac_verify (kvstashd, before it quantizes), for puts of 0.5, 4 and
 * 32 MiB of raw layers, against memcpy of the same bytes and HMAC-SHA256 over
 * them (the alternative the design first named), measured in the same run.
 *
 *   putmac_bench [--reps N]     (default 15)
 *
 * Validates before timing: a sealed put verifies, and one flipped payload
 * byte, one flipped header byte and another key each make it fail. Each
 * figure is the median over N repetitions of one call; the source is
 * rewritten just before each (so it starts as warm as the caches leave it,
 * as a worker's freshly copied layers and kvstashd's bytes just copied out of
 * bounce memory do).
 * Last line: RESULT seal_gbps=<4 MiB> verify_gbps=<4 MiB> memcpy_gbps=<4 MiB>
 * seal_vs_memcpy=<x> gmac_vs_hmac=<x>.
 */
#include "../support/kvs_bench_stats.h"
#include "kvs_error.h"
#include "kvs_putmac.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char *what)
{
    fprintf(stderr, "putmac_bench: %s\n", what);
    exit(1);
}

static volatile uint8_t g_sink;

/* Seals with the next sequence number (each used once, as GMAC needs). */
static int seal_next(const uint8_t *key, kvs_putmac_put *pm, uint8_t *meta, size_t hl,
                     const uint8_t *src, size_t n)
{
    pm->seq++;
    return kvs_putmac_seal(key, pm, meta, hl, src, n);
}

/* Rewrites buf so every repetition starts from bytes just written. */
static void touch(uint8_t *buf, size_t n, unsigned rep)
{
    for (size_t i = 0; i < n; i += 64)
        buf[i] = (uint8_t)(i + rep);
}

int main(int argc, char **argv)
{
    int reps = 15;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else
            die("usage: putmac_bench [--reps N]");
    }
    if (reps < 1 || reps > 1000)
        die("--reps: 1..1000");
    static const double sizes_mib[] = {0.5, 4, 32};
    uint8_t key[KVS_PUTMAC_KEY_LEN], other[KVS_PUTMAC_KEY_LEN], ukey[KVS_PUTMAC_UKEY_LEN] = {0};
    if (kvs_putmac_keygen(key) != 0 || kvs_putmac_keygen(other) != 0)
        die("keygen failed");
    /* a PutHeader-sized header: 64 token ids and a namespace, ~300 bytes */
    uint8_t meta[320 + KVS_PUTMAC_TRAILER_LEN];
    const size_t hl = 320;
    for (size_t i = 0; i < hl; i++)
        meta[i] = (uint8_t)(i * 13);
    double res[3][4]; /* per size: seal, verify, memcpy, hmac GB/s */
    double *t = malloc((size_t)reps * sizeof *t);
    if (t == NULL)
        die("out of memory");
    kvs_putmac_put pm = {.expires_ms = UINT64_MAX, .ukey = ukey, .fmt = 0};
    printf("%-8s %12s %12s %12s %12s %10s\n", "MiB", "seal GB/s", "verify GB/s", "memcpy GB/s",
           "hmac GB/s", "seal/memcpy");
    for (size_t s = 0; s < 3; s++) {
        size_t n = (size_t)(sizes_mib[s] * 1048576.0);
        uint8_t *src = malloc(n), *dst = malloc(n);
        if (src == NULL || dst == NULL)
            die("out of memory");
        for (size_t i = 0; i < n; i++)
            src[i] = (uint8_t)(i * 2654435761u >> 13);
        memset(dst, 0, n);
        /* validate */
        if (seal_next(key, &pm, meta, hl, src, n) != 0 ||
            kvs_putmac_verify(key, ukey, 0, meta, hl + KVS_PUTMAC_TRAILER_LEN, src, n) != 0)
            die("a sealed put does not verify");
        src[n / 3] ^= 1;
        if (kvs_putmac_verify(key, ukey, 0, meta, hl + KVS_PUTMAC_TRAILER_LEN, src, n) !=
            KVS_EUNAUTH)
            die("a changed payload byte verifies");
        src[n / 3] ^= 1;
        meta[7] ^= 1;
        if (kvs_putmac_verify(key, ukey, 0, meta, hl + KVS_PUTMAC_TRAILER_LEN, src, n) !=
            KVS_EUNAUTH)
            die("a changed header byte verifies");
        meta[7] ^= 1;
        if (kvs_putmac_verify(other, ukey, 0, meta, hl + KVS_PUTMAC_TRAILER_LEN, src, n) !=
            KVS_EUNAUTH)
            die("another key verifies");
        for (int way = 0; way < 4; way++) {
            for (int r = 0; r < reps; r++) {
                touch(src, n, (unsigned)r);
                if (way == 1 && seal_next(key, &pm, meta, hl, src, n) != 0)
                    die("seal failed");
                double t0 = kvs_bench_now_s();
                int rc = 0;
                if (way == 0) {
                    rc = seal_next(key, &pm, meta, hl, src, n);
                } else if (way == 1) {
                    rc = kvs_putmac_verify(key, ukey, 0, meta, hl + KVS_PUTMAC_TRAILER_LEN, src, n);
                } else if (way == 2) {
                    memcpy(dst, src, n);
                    g_sink = dst[n - 1];
                } else {
                    uint8_t md[32];
                    unsigned mdl = 0;
                    rc = HMAC(EVP_sha256(), key, sizeof key, src, n, md, &mdl) ? 0 : -1;
                    g_sink = md[0];
                }
                t[r] = kvs_bench_now_s() - t0;
                if (rc != 0)
                    die("a timed call failed");
            }
            res[s][way] = (double)n / kvs_bench_median(t, reps) / 1e9;
        }
        printf("%-8g %12.2f %12.2f %12.2f %12.2f %10.3f\n", sizes_mib[s], res[s][0], res[s][1],
               res[s][2], res[s][3], res[s][0] / res[s][2]);
        free(src);
        free(dst);
    }
    printf("RESULT seal_gbps=%.2f verify_gbps=%.2f memcpy_gbps=%.2f seal_vs_memcpy=%.3f "
           "gmac_vs_hmac=%.2f\n",
           res[1][0], res[1][1], res[1][2], res[1][0] / res[1][2], res[1][0] / res[1][3]);
    free(t);
    return 0;
}
