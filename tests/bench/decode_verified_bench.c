/*
 * decode_verified_bench.c — what decoding without the second tile check saves
 * (kv_block.h: kvs_block_decode_run_verified, kvs_block_decode_layer with a
 * _verified dequantizer), in CPU seconds of the decoding thread.
 *
 * A stored int8 block (kvstashd's default outliers, kvq_calib.h) of
 * L layers x H heads x D dims x T tokens is decoded, every layer's K and V, to
 * fp16 four ways:
 *   run      kvs_block_decode_run + kvs_tile_dequantize: each tile checked in
 *            full (libkvstash's decode of a gRPC Get reply; of a UCX fetch
 *            before, right after transfer/ had checked the same tiles);
 *   run_v    kvs_block_decode_run_verified + kvs_tile_dequantize_verified
 *            (libkvstash's decode of a UCX fetch now);
 *   layer2   kvs_block_decode_layer + kvs_tile_dequantize: its own check, then
 *            the full dequantizer's (kvstashd's render before: two hashes);
 *   layer    kvs_block_decode_layer + kvs_tile_dequantize_verified (now).
 * Before timing, each way's output is compared byte for byte with the plain C
 * reference's: every tile located with kvs_block_tile and decoded on its own
 * by kvs_tile_dequantize_ref (kernels/ref/): neither the run and layer
 * decoders nor the fast dequantizers the four ways use, so a bug common to
 * them fails here (the encoder, kvs_block_tile and the tile check are shared
 * with the reference). Each repetition flushes
 * the caches (a 64 MiB write) and times the thread's CPU clock
 * (CLOCK_THREAD_CPUTIME_ID: less sensitive to a shared machine than the wall
 * clock); the best of --reps is reported, as GB/s of fp16 written, and
 *   RESULT run_v_vs_run=<x> layer_vs_layer2=<y>
 * Usage: decode_verified_bench [--reps N] [--layers L] [--heads H]
 */
#include "kv_block.h"
#include "kvq_calib.h"
#include "kvq_cpu.h"
#include "kvs_error.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define D 128u
#define T 256u

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void flush_caches(void)
{
    static unsigned char *junk;
    enum { JUNK = 64 << 20 };
    if (!junk && !(junk = malloc(JUNK)))
        return;
    for (size_t i = 0; i < JUNK; i += 64)
        junk[i]++;
}

/* Decodes every layer of blk (mode 0..3, see the file comment) into out
 * (2 * L * H * T * D fp16: layer l's K, then its V). 0 or a KVS_E*. */
static int decode_all(int mode, const unsigned char *blk, size_t size, uint32_t L, uint32_t H,
                      uint16_t *out)
{
    const size_t n = (size_t)T * H * D;
    for (uint32_t l = 0; l < L; l++) {
        uint16_t *k = out + 2 * l * n, *v = k + n;
        if (mode >= 2) {
            int rc = kvs_block_decode_layer(
                blk, size, l, KVS_DTYPE_FP16, k, v,
                mode == 2 ? kvs_tile_dequantize : kvs_tile_dequantize_verified, NULL);
            if (rc)
                return rc;
            continue;
        }
        const void *kt, *vt;
        size_t kl, vl;
        int rc = kvs_block_tile(blk, size, l, KVS_TILE_K, 0, &kt, &kl, NULL);
        if (rc == 0)
            rc = kvs_block_tile(blk, size, l, KVS_TILE_V, 0, &vt, &vl, NULL);
        for (int kind = 0; rc == 0 && kind < 2; kind++) {
            const void *run = kind ? vt : kt;
            size_t len = (size_t)H * (kind ? vl : kl);
            kvs_tile_kind tk = kind ? KVS_TILE_V : KVS_TILE_K;
            rc = mode == 0 ? kvs_block_decode_run(run, len, tk, H, T, D, KVS_DTYPE_FP16,
                                                  kind ? v : k, kvs_tile_dequantize, NULL)
                           : kvs_block_decode_run_verified(run, len, tk, H, T, D, KVS_DTYPE_FP16,
                                                           kind ? v : k,
                                                           kvs_tile_dequantize_verified, NULL);
        }
        if (rc)
            return rc;
    }
    return 0;
}

/* The reference output of decode_all: each tile of blk decoded alone by the
 * plain C dequantizer into its head's view of out. 0 or a KVS_E* (err says
 * why). */
static int decode_ref(const unsigned char *blk, size_t size, uint32_t L, uint32_t H, uint16_t *out,
                      char *err)
{
    const size_t n = (size_t)T * H * D;
    for (uint32_t l = 0; l < L; l++)
        for (int kind = 0; kind < 2; kind++)
            for (uint32_t h = 0; h < H; h++) {
                const void *t;
                size_t tl;
                kvs_tile_kind tk = kind ? KVS_TILE_V : KVS_TILE_K;
                int rc = kvs_block_tile(blk, size, l, tk, h, &t, &tl, err);
                if (rc == 0)
                    rc = kvs_tile_dequantize_ref(t, tl, KVS_DTYPE_FP16,
                                                 out + (2 * l + (size_t)kind) * n + h * D,
                                                 (size_t)H * D, err);
                if (rc)
                    return rc;
            }
    return 0;
}

int main(int argc, char **argv)
{
    int reps = 15;
    uint32_t L = 32, H = 8;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--reps") == 0)
            reps = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--layers") == 0)
            L = (uint32_t)atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--heads") == 0)
            H = (uint32_t)atoi(argv[i + 1]);
    }
    if (reps < 1 || L < 1 || L > KVS_BLOCK_MAX_LAYERS || H < 1 || H > KVS_BLOCK_MAX_HEADS) {
        fprintf(stderr, "usage: decode_verified_bench [--reps N] [--layers L] [--heads H]\n");
        return 2;
    }
    kvs_scheme *sc = malloc(L * sizeof *sc);
    const size_t n = (size_t)T * H * D;
    float *x = malloc(n * sizeof *x);
    const void **src = malloc(L * sizeof *src);
    if (!sc || !x || !src)
        return 1;
    uint32_t r = 12345;
    for (size_t i = 0; i < n; i++) {
        r = r * 1664525u + 1013904223u;
        x[i] = (float)((int)(r >> 12) % 4000 - 2000) / 1000.0f;
    }
    for (uint32_t l = 0; l < L; l++) {
        sc[l] = KVS_SCHEME_INT8;
        src[l] = x;
    }
    kvs_block_params p = {.layers = L,
                          .heads = H,
                          .head_dim = D,
                          .block_tokens = T,
                          .src_dtype = KVS_DTYPE_FP32,
                          .k_outliers = KVS_QUANT_DEFAULT_K_OUTLIERS,
                          .v_outliers = KVS_QUANT_DEFAULT_V_OUTLIERS,
                          .schemes = sc};
    size_t size = kvs_block_size(&p);
    unsigned char *blk = aligned_alloc(64, (size + 63) / 64 * 64);
    const size_t out_bytes = 2 * (size_t)L * n * sizeof(uint16_t);
    uint16_t *out[4];
    char err[KVS_ERR_LEN] = "";
    if (!blk || kvs_block_encode(&p, src, src, kvs_tile_quantize, blk, size, err) != 0) {
        fprintf(stderr, "decode_verified_bench: encode: %s\n", err);
        return 1;
    }
    /* validate: every way writes the reference's bytes */
    uint16_t *ref = aligned_alloc(64, out_bytes);
    if (!ref)
        return 1;
    memset(ref, 0x5A, out_bytes);
    int rc = decode_ref(blk, size, L, H, ref, err);
    if (rc != 0) {
        fprintf(stderr, "decode_verified_bench: reference decode: %s: %s\n", kvs_strerror(rc), err);
        return 1;
    }
    for (int m = 0; m < 4; m++) {
        out[m] = aligned_alloc(64, out_bytes);
        if (!out[m])
            return 1;
        memset(out[m], 0xA5, out_bytes);
        rc = decode_all(m, blk, size, L, H, out[m]);
        if (rc != 0) {
            fprintf(stderr, "decode_verified_bench: way %d: %s\n", m, kvs_strerror(rc));
            return 1;
        }
        for (size_t i = 0; i < out_bytes / sizeof *ref; i++)
            if (out[m][i] != ref[i]) {
                fprintf(stderr,
                        "decode_verified_bench: way %d: fp16 %zu is 0x%04x, the reference's "
                        "0x%04x\n",
                        m, i, out[m][i], ref[i]);
                return 1;
            }
    }
    free(ref);
    static const char *name[4] = {"run (full check)", "run_verified", "layer (two hashes)",
                                  "layer (verified dequantizer)"};
    double best[4] = {1e30, 1e30, 1e30, 1e30};
    for (int i = 0; i < reps; i++) {
        for (int m = 0; m < 4; m++) {
            flush_caches();
            double t0 = cpu_now();
            if (decode_all(m, blk, size, L, H, out[m]) != 0)
                return 1;
            double dt = cpu_now() - t0;
            if (dt < best[m])
                best[m] = dt;
        }
    }
    printf("decode_verified_bench: int8 block %.2f MiB (%u layers x %u heads x %u dims x %u "
           "tokens, outliers %u/%u) -> fp16 %.1f MiB, %s; thread CPU, best of %d\n",
           (double)size / 1048576.0, L, H, D, T, KVS_QUANT_DEFAULT_K_OUTLIERS,
           KVS_QUANT_DEFAULT_V_OUTLIERS, (double)out_bytes / 1048576.0,
           kvs_cpu_isa_name(kvs_cpu_isa_active()), reps);
    for (int m = 0; m < 4; m++)
        printf("  %-30s %8.4f s  %6.2f GB/s\n", name[m], best[m],
               (double)out_bytes / best[m] / 1e9);
    printf("RESULT run_v_vs_run=%.2f layer_vs_layer2=%.2f\n", best[0] / best[1], best[2] / best[3]);
    for (int m = 0; m < 4; m++)
        free(out[m]);
    free(blk);
    free(sc);
    free(x);
    free(src);
    return 0;
}
