/*
 * test_kv_block_run.c — kvs_block_decode_run (kernels/block/kv_block.h): a
 * run of tiles, one layer's K tiles or V tiles back to back, is what a Get in
 * the stored format sends, and the client decodes it into the [T][H][D]
 * tensor the server would have rendered with kvs_block_decode_layer.
 *
 * The runs are cut out of blocks made by kvs_block_encode (every scheme, an
 * fp16 skip layer, a root block with sinks, outliers) at the offsets
 * kvs_block_tile reports, and copied to an odd address. Each must decode to
 * kvs_block_decode_layer's bytes for fp16, bf16 and fp32, with the reference
 * and the fast CPU dequantizer; and every way a run can be wrong (length,
 * shape, kind, one flipped bit, tiles valid alone that do not belong together,
 * bad arguments) must be refused — a wrong shape with nothing written, a
 * flipped bit by the tile's own check, naming the head.
 */
#include "kv_block.h"
#include "kv_block_test_util.h"
#include "kv_format.h"
#include "kvq.h"
#include "kvq_cpu.h"
#include "kvs_error.h"
#include "kvs_test.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Layer l's K (kind 0) or V (kind 1) run: its offset, its bytes, one tile's bytes. */
static size_t run_of(const blk *b, uint32_t l, int kind, size_t *len, size_t *tile_len)
{
    const void *t0, *v0;
    size_t tl, vl;
    uint64_t off, bytes;
    CU_ASSERT_EQUAL_FATAL(kvs_block_layer_range(b->bytes, b->size, l, &off, &bytes, NULL), 0);
    CU_ASSERT_EQUAL_FATAL(kvs_block_tile(b->bytes, b->size, l, KVS_TILE_K, 0, &t0, &tl, NULL), 0);
    CU_ASSERT_EQUAL_FATAL(kvs_block_tile(b->bytes, b->size, l, KVS_TILE_V, 0, &v0, &vl, NULL), 0);
    size_t k_off = (size_t)((const unsigned char *)t0 - b->bytes);
    size_t v_off = (size_t)((const unsigned char *)v0 - b->bytes);
    CU_ASSERT_EQUAL(k_off, off);
    CU_ASSERT_EQUAL(v_off - k_off, b->p.heads * tl); /* K tiles back to back, then V */
    CU_ASSERT_EQUAL(off + bytes - v_off, b->p.heads * vl);
    *tile_len = kind ? vl : tl;
    *len = b->p.heads * *tile_len;
    return kind ? v_off : k_off;
}

static void test_decode_run_matches_layer(void)
{
    static const kvs_scheme s0[4] = {KVS_SCHEME_FP16, KVS_SCHEME_FP8_E4M3, KVS_SCHEME_FP8_E5M2,
                                     KVS_SCHEME_INT8};
    static const kvs_scheme s1[2] = {KVS_SCHEME_INT8, KVS_SCHEME_FP16};
    static const struct {
        uint32_t L, H, D, T;
        int root;
        uint32_t kk, kv, S;
        const kvs_scheme *s;
    } cfg[] = {
        {4, 3, 24, 32, 1, 1, 4, 16, s0}, /* root block with sinks, every scheme */
        {2, 2, 64, 16, 0, 2, 1, 0, s1},  /* non-root, an fp16 skip layer */
    };
    static const kvs_dtype dts[] = {KVS_DTYPE_FP16, KVS_DTYPE_BF16, KVS_DTYPE_FP32};
    static const kvs_tile_dequantize_fn fns[] = {NULL, kvs_tile_dequantize};
    unsigned checked = 0;
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        blk b;
        blk_make(&b, cfg[c].L, cfg[c].H, cfg[c].D, cfg[c].T, cfg[c].root, cfg[c].kk, cfg[c].kv,
                 cfg[c].S, cfg[c].s);
        const uint32_t H = cfg[c].H, T = cfg[c].T, D = cfg[c].D;
        const size_t n = (size_t)T * H * D;
        float *want = malloc(2 * n * sizeof *want), *got = malloc(n * sizeof *got);
        for (uint32_t l = 0; l < cfg[c].L; l++)
            for (size_t d = 0; d < 3; d++) {
                CU_ASSERT_EQUAL_FATAL(kvs_block_decode_layer(b.bytes, b.size, l, dts[d], want,
                                                             want + n, kvs_tile_dequantize, NULL),
                                      0);
                for (int kind = 0; kind < 2; kind++) {
                    size_t len, tl, off = run_of(&b, l, kind, &len, &tl);
                    unsigned char *run = malloc(len + 1); /* the run at an odd address */
                    memcpy(run + 1, b.bytes + off, len);
                    const unsigned char *r = run + 1;
                    kvs_tile_kind k = (kvs_tile_kind)kind, o = (kvs_tile_kind)!kind;
                    const size_t out = n * esize(dts[d]);
                    char err[KVS_ERR_LEN] = "";
                    for (size_t f = 0; f < 2; f++) {
                        memset(got, SENTINEL, n * sizeof *got);
                        int rc = kvs_block_decode_run(r, len, k, H, T, D, dts[d], got, fns[f], err);
                        if (rc)
                            printf("\n  cfg %zu layer %u: %s", c, l, err);
                        CU_ASSERT_EQUAL(rc, 0);
                        CU_ASSERT_EQUAL(memcmp(got, want + (kind ? n : 0), out), 0);
                        CU_ASSERT(all_bytes((unsigned char *)got + out, n * sizeof *got - out,
                                            SENTINEL)); /* nothing past the tensor */
                        checked++;
                    }
                    /* hostile: lengths, shape, kind, one bit of the last tile */
                    memset(got, SENTINEL, n * sizeof *got);
                    CU_ASSERT_EQUAL(
                        kvs_block_decode_run(r, len - 1, k, H, T, D, dts[d], got, NULL, NULL),
                        KVS_EFORMAT);
                    CU_ASSERT_EQUAL(
                        kvs_block_decode_run(run, len + 1, k, H, T, D, dts[d], got, NULL, NULL),
                        KVS_EFORMAT); /* a stray byte before the run */
                    CU_ASSERT_EQUAL(
                        kvs_block_decode_run(r, len, k, H + 1, T, D, dts[d], got, NULL, NULL),
                        KVS_EFORMAT);
                    CU_ASSERT_EQUAL(
                        kvs_block_decode_run(r, len, o, H, T, D, dts[d], got, NULL, err),
                        KVS_EFORMAT);
                    CU_ASSERT_PTR_NOT_NULL(strstr(err, "is not kind"));
                    CU_ASSERT_EQUAL(
                        kvs_block_decode_run(r, len, k, H, T + 1, D, dts[d], got, NULL, NULL),
                        KVS_EFORMAT);
                    CU_ASSERT_EQUAL(
                        kvs_block_decode_run(r, len, k, H, T, D + 1, dts[d], got, NULL, NULL),
                        KVS_EFORMAT);
                    CU_ASSERT(all_bytes(got, n * sizeof *got, SENTINEL));
                    if (H > 1) /* fewer heads, fewer bytes: still a run */
                        CU_ASSERT_EQUAL(kvs_block_decode_run(r, len - tl, k, H - 1, T, D, dts[d],
                                                             got, NULL, NULL),
                                        0);
                    memset(got, SENTINEL, n * sizeof *got);
                    run[len] ^= 0x10; /* last payload byte of the last head */
                    CU_ASSERT_EQUAL(
                        kvs_block_decode_run(r, len, k, H, T, D, dts[d], got, NULL, err),
                        KVS_EFORMAT);
                    CU_ASSERT_PTR_NOT_NULL(strstr(err, "checksum"));
                    char head[32];
                    snprintf(head, sizeof head, "head %u", H - 1);
                    CU_ASSERT_PTR_NOT_NULL(strstr(err, head));
                    free(run);
                }
            }
        free(want);
        free(got);
        free(b.bytes);
    }
    CU_ASSERT_EQUAL(checked, 2 * 3 * 2 * (4 + 2));
}

/* Tiles each valid alone that do not belong to one layer, and bad arguments. */
static void test_decode_run_hostile(void)
{
    enum { T = 16, D = 16 };
    float x[T * D];
    for (int i = 0; i < T * D; i++)
        x[i] = rnd_f();
    /* head 0: E4M3 with k = 1, S = 1; head 1: the same tile with k = 0, S = 3 */
    kvs_tile_params p0 = {KVS_SCHEME_FP8_E4M3, KVS_TILE_K, T, D, 1, 1, NULL, 0.0f, 0};
    kvs_tile_params p1 = {KVS_SCHEME_FP8_E4M3, KVS_TILE_K, T, D, 0, 3, NULL, 0.0f, 0};
    kvs_tile_params p2 = {KVS_SCHEME_INT8, KVS_TILE_K, T, D, 1, 1, NULL, 0.0f, 0};
    size_t tl = kvs_tile_size(&p0);
    unsigned char *run = aligned_alloc(16, 2 * ((tl + 15) & ~(size_t)15) + 16);
    CU_ASSERT_EQUAL_FATAL(kvs_tile_quantize_ref(&p0, x, KVS_DTYPE_FP32, D, run, tl, NULL), 0);
    float got[2 * T * D];
    char err[KVS_ERR_LEN] = "";
    int mixed = 0;
    const kvs_tile_params *other[] = {&p1, &p2};
    for (int i = 0; i < 2; i++) {
        if (kvs_tile_size(other[i]) != tl) /* sizes differ: the length check alone refuses */
            continue;
        mixed++;
        CU_ASSERT_EQUAL_FATAL(
            kvs_tile_quantize_ref(other[i], x, KVS_DTYPE_FP32, D, run + tl, tl, NULL), 0);
        memset(got, SENTINEL, sizeof got);
        CU_ASSERT_EQUAL(
            kvs_block_decode_run(run, 2 * tl, KVS_TILE_K, 2, T, D, KVS_DTYPE_FP32, got, NULL, err),
            KVS_EFORMAT);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "head 1"));
        CU_ASSERT(all_bytes(got, sizeof got, SENTINEL));
    }
    CU_ASSERT(mixed >= 1); /* int8 and E4M3 tiles of one shape have one size */
    /* the same tile twice is a good run, both heads decoded */
    memcpy(run + tl, run, tl);
    CU_ASSERT_EQUAL(
        kvs_block_decode_run(run, 2 * tl, KVS_TILE_K, 2, T, D, KVS_DTYPE_FP32, got, NULL, err), 0);
    float one[T * D];
    CU_ASSERT_EQUAL(kvs_tile_dequantize_ref(run, tl, KVS_DTYPE_FP32, one, D, NULL), 0);
    for (int t = 0; t < T; t++) {
        CU_ASSERT_EQUAL(memcmp(got + t * 2 * D, one + t * D, D * sizeof(float)), 0);
        CU_ASSERT_EQUAL(memcmp(got + t * 2 * D + D, one + t * D, D * sizeof(float)), 0);
    }
    /* arguments */
    CU_ASSERT_EQUAL(
        kvs_block_decode_run(run, tl, KVS_TILE_K, 1, T, D, (kvs_dtype)0, got, NULL, err),
        KVS_EINVAL);
    CU_ASSERT_EQUAL(
        kvs_block_decode_run(run, tl, (kvs_tile_kind)2, 1, T, D, KVS_DTYPE_FP32, got, NULL, err),
        KVS_EINVAL);
    CU_ASSERT_EQUAL(
        kvs_block_decode_run(run, tl, KVS_TILE_K, 0, T, D, KVS_DTYPE_FP32, got, NULL, err),
        KVS_EINVAL);
    CU_ASSERT_EQUAL(
        kvs_block_decode_run(run, tl, KVS_TILE_K, 1, T, D, KVS_DTYPE_FP32, NULL, NULL, err),
        KVS_EINVAL);
    CU_ASSERT_EQUAL(
        kvs_block_decode_run(NULL, 0, KVS_TILE_K, 1, T, D, KVS_DTYPE_FP32, got, NULL, err),
        KVS_EFORMAT);
    CU_ASSERT_EQUAL(
        kvs_block_decode_run(run, 0, KVS_TILE_K, 1, T, D, KVS_DTYPE_FP32, got, NULL, err),
        KVS_EFORMAT);
    free(run);
}

int main(void)
{
    static const kvs_test_case cases[] = {
        {"a layer's K and V runs decode as the block does", test_decode_run_matches_layer},
        {"runs that are not one layer's tiles, bad arguments", test_decode_run_hostile},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {
        {"decode a run of tiles", NULL, NULL, cases},
        {NULL, NULL, NULL, NULL},
    };
    return kvs_test_run(suites);
}
