/*
 * kv_block_test_util.h — what the block unit tests that cut runs out of
 * encoded blocks share (test_kv_block_run, test_kv_block_verified): random
 * fp32 sources with scattered outliers, a block encoded from them
 * (kvs_block_encode, 16-byte aligned output), and small byte helpers.
 * Header-only (static): each test binary gets its own copy.
 */
#ifndef KVS_KV_BLOCK_TEST_UTIL_H
#define KVS_KV_BLOCK_TEST_UTIL_H

#include "kv_block.h"
#include "kvs_error.h"
#include "kvs_test.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SENTINEL 0xA5

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static float rnd_f(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    float f = (float)((int64_t)(g_rng >> 40) - (1 << 23)) / (float)(1 << 21);
    return g_rng % 61 == 0 ? f * 40.0f : f; /* scattered outliers */
}

static int all_bytes(const void *p, size_t n, unsigned char v)
{
    for (size_t i = 0; i < n; i++)
        if (((const unsigned char *)p)[i] != v)
            return 0;
    return 1;
}

static size_t esize(kvs_dtype d)
{
    return d == KVS_DTYPE_FP32 ? 4 : 2;
}

typedef struct blk {
    kvs_block_params p;
    unsigned char *bytes;
    size_t size;
} blk;

/* Encodes a block of random fp32 sources (8-byte aligned output, as required). */
static void blk_make(blk *b, uint32_t L, uint32_t H, uint32_t D, uint32_t T, int root, uint32_t kk,
                     uint32_t kv, uint32_t S, const kvs_scheme *schemes)
{
    memset(b, 0, sizeof *b);
    b->p = (kvs_block_params){.layers = L,
                              .heads = H,
                              .head_dim = D,
                              .block_tokens = T,
                              .src_dtype = KVS_DTYPE_FP32,
                              .root = root,
                              .k_outliers = kk,
                              .v_outliers = kv,
                              .sinks = S,
                              .schemes = schemes};
    size_t n = (size_t)T * H * D;
    float *x = malloc(2 * L * n * sizeof *x);
    const void *k[8], *v[8];
    CU_ASSERT_FATAL(x != NULL && L <= 8);
    for (size_t i = 0; i < 2 * L * n; i++)
        x[i] = rnd_f();
    for (uint32_t l = 0; l < L; l++) {
        k[l] = x + 2 * l * n;
        v[l] = x + (2 * l + 1) * n;
    }
    b->size = kvs_block_size(&b->p);
    CU_ASSERT_FATAL(b->size > 0);
    b->bytes = aligned_alloc(16, (b->size + 15) & ~(size_t)15);
    CU_ASSERT_FATAL(b->bytes != NULL);
    char err[KVS_ERR_LEN] = "";
    int rc = kvs_block_encode(&b->p, k, v, NULL, b->bytes, b->size, err);
    if (rc)
        printf("\n  encode: %s", err);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    free(x);
}

#endif /* KVS_KV_BLOCK_TEST_UTIL_H */
