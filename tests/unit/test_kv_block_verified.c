/*
 * test_kv_block_verified.c — decoding tiles whose checksums our own code has
 * just verified: kvs_block_decode_run_verified, kvs_tile_check_verified and the
 * _verified dequantizers (kv_block.h, kvq.h, kvq_cpu.h), and
 * kvs_block_decode_layer, which checks a layer's tiles in full and then decodes
 * them with a _verified dequantizer.
 *
 * What must hold: the output is byte for byte the full path's (every scheme,
 * sinks, an fp16 skip layer, fp16/bf16/fp32, the reference and the fast CPU
 * dequantizer); the only check skipped is the checksum — a flipped payload
 * byte decodes under _verified (that is the point: the caller verified it)
 * and is refused by the full path and by kvs_block_decode_layer with nothing
 * written — while every other check still refuses a tile before a byte is
 * written: bad magic, a payload size that disagrees with the shape, an
 * outlier index out of range, a negative scale (each re-sealed, so only that
 * check can catch it), a short length.
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

/* Layer l's K (kind 0) or V (kind 1) run: its offset in the block, its bytes
 * and one tile's bytes. */
static size_t run_of(const blk *b, uint32_t l, int kind, size_t *len, size_t *tile_len)
{
    const void *t;
    size_t tl;
    CU_ASSERT_EQUAL_FATAL(
        kvs_block_tile(b->bytes, b->size, l, kind ? KVS_TILE_V : KVS_TILE_K, 0, &t, &tl, NULL), 0);
    *tile_len = tl;
    *len = b->p.heads * tl;
    return (size_t)((const unsigned char *)t - b->bytes);
}

static const kvs_scheme g_s0[4] = {KVS_SCHEME_FP16, KVS_SCHEME_FP8_E4M3, KVS_SCHEME_FP8_E5M2,
                                   KVS_SCHEME_INT8};
static const kvs_scheme g_s1[2] = {KVS_SCHEME_INT8, KVS_SCHEME_FP16};

/* kvs_block_decode_run_verified and kvs_block_decode_layer (whatever dequantizer
 * it is given) write exactly kvs_block_decode_run's bytes. */
static void test_same_bytes(void)
{
    static const struct {
        uint32_t L, H, D, T;
        int root;
        uint32_t kk, kv, S;
        const kvs_scheme *s;
    } cfg[] = {
        {4, 3, 24, 32, 1, 3, 2, 1, g_s0}, /* root block with a sink, every scheme */
        {2, 2, 64, 16, 0, 2, 1, 0, g_s1}, /* non-root, an fp16 skip layer */
    };
    static const kvs_dtype dts[] = {KVS_DTYPE_FP16, KVS_DTYPE_BF16, KVS_DTYPE_FP32};
    static const kvs_tile_dequantize_fn vfns[] = {NULL, kvs_tile_dequantize_verified};
    static const kvs_tile_dequantize_fn lfns[] = {NULL, kvs_tile_dequantize_verified,
                                                  kvs_tile_dequantize};
    unsigned compared = 0;
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        blk b;
        blk_make(&b, cfg[c].L, cfg[c].H, cfg[c].D, cfg[c].T, cfg[c].root, cfg[c].kk, cfg[c].kv,
                 cfg[c].S, cfg[c].s);
        const uint32_t H = cfg[c].H, T = cfg[c].T, D = cfg[c].D;
        const size_t n = (size_t)T * H * D;
        float *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
        float *lk = malloc(n * sizeof *lk), *lv = malloc(n * sizeof *lv);
        CU_ASSERT_FATAL(want && got && lk && lv);
        for (uint32_t l = 0; l < cfg[c].L; l++) {
            for (size_t d = 0; d < 3; d++) {
                const size_t out = n * esize(dts[d]);
                for (int kind = 0; kind < 2; kind++) {
                    size_t len, tl, off = run_of(&b, l, kind, &len, &tl);
                    const unsigned char *r = b.bytes + off;
                    kvs_tile_kind k = (kvs_tile_kind)kind;
                    memset(want, SENTINEL, n * sizeof *want);
                    CU_ASSERT_EQUAL_FATAL(kvs_block_decode_run(r, len, k, H, T, D, dts[d], want,
                                                               kvs_tile_dequantize, NULL),
                                          0);
                    for (size_t f = 0; f < 2; f++) {
                        char err[KVS_ERR_LEN] = "";
                        memset(got, SENTINEL, n * sizeof *got);
                        int rc = kvs_block_decode_run_verified(r, len, k, H, T, D, dts[d], got,
                                                               vfns[f], err);
                        if (rc)
                            printf("\n  cfg %zu layer %u: %s", c, l, err);
                        CU_ASSERT_EQUAL(rc, 0);
                        CU_ASSERT_EQUAL(memcmp(got, want, n * sizeof *got), 0); /* sentinel too */
                        compared++;
                    }
                    for (size_t f = 0; f < 3; f++) {
                        memset(lk, SENTINEL, n * sizeof *lk);
                        memset(lv, SENTINEL, n * sizeof *lv);
                        CU_ASSERT_EQUAL(kvs_block_decode_layer(b.bytes, b.size, l, dts[d], lk, lv,
                                                               lfns[f], NULL),
                                        0);
                        CU_ASSERT_EQUAL(memcmp(kind ? lv : lk, want, out), 0);
                    }
                }
            }
        }
        free(want);
        free(got);
        free(lk);
        free(lv);
        free(b.bytes);
    }
    CU_ASSERT_EQUAL(compared, 2 * 3 * 2 * (4 + 2));
}

/* A payload changed after the verification is the caller's to catch: the full
 * path refuses it (naming the checksum), the _verified one decodes it. And a
 * block whose tile changed is still refused by kvs_block_decode_layer's own
 * check, with nothing written, and by the requantizer. */
static void test_checksum_is_the_callers(void)
{
    blk b;
    blk_make(&b, 4, 2, 32, 16, 1, 2, 1, 1, g_s0);
    const uint32_t H = 2, T = 16, D = 32;
    const size_t n = (size_t)T * H * D;
    float *got = malloc(n * sizeof *got);
    CU_ASSERT_FATAL(got != NULL);
    for (uint32_t l = 0; l < 4; l++) {
        size_t len, tl, off = run_of(&b, l, 1, &len, &tl);
        unsigned char *r = b.bytes + off;
        char err[KVS_ERR_LEN] = "";
        r[len - tl + sizeof(kvs_tile_hdr)] ^= 0x01; /* the last head's first payload byte */
        CU_ASSERT_EQUAL(kvs_tile_check(r + len - tl, tl, NULL, err), KVS_EFORMAT);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "checksum"));
        CU_ASSERT_EQUAL(kvs_tile_check_verified(r + len - tl, tl, NULL, NULL), 0);
        CU_ASSERT_EQUAL(
            kvs_block_decode_run(r, len, KVS_TILE_V, H, T, D, KVS_DTYPE_FP32, got, NULL, err),
            KVS_EFORMAT);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "checksum"));
        CU_ASSERT_EQUAL(kvs_block_decode_run_verified(r, len, KVS_TILE_V, H, T, D, KVS_DTYPE_FP32,
                                                      got, kvs_tile_dequantize_verified, NULL),
                        0);
        CU_ASSERT_EQUAL(kvs_block_decode_run_verified(r, len, KVS_TILE_V, H, T, D, KVS_DTYPE_FP32,
                                                      got, NULL, NULL),
                        0);
        memset(got, SENTINEL, n * sizeof *got);
        CU_ASSERT_EQUAL(kvs_block_decode_layer(b.bytes, b.size, l, KVS_DTYPE_FP32, got, NULL,
                                               kvs_tile_dequantize_verified, NULL),
                        0); /* K tiles only: the V tile is not checked */
        memset(got, SENTINEL, n * sizeof *got);
        CU_ASSERT_EQUAL(kvs_block_decode_layer(b.bytes, b.size, l, KVS_DTYPE_FP32, NULL, got,
                                               kvs_tile_dequantize_verified, err),
                        KVS_EFORMAT);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "checksum"));
        CU_ASSERT(all_bytes(got, n * sizeof *got, SENTINEL));
        CU_ASSERT_EQUAL(
            kvs_block_decode_layer(b.bytes, b.size, l, KVS_DTYPE_FP32, NULL, got, NULL, NULL),
            KVS_EFORMAT);
        CU_ASSERT(all_bytes(got, n * sizeof *got, SENTINEL));
        if (g_s0[l] != KVS_SCHEME_FP16) {
            float scale = -1.0f, amax = -1.0f;
            CU_ASSERT_EQUAL(
                kvs_block_requant_fp8(b.bytes, b.size, l, KVS_TILE_V, (uint8_t *)got, &scale, NULL),
                KVS_EFORMAT);
            CU_ASSERT_EQUAL(scale, -1.0f);
            CU_ASSERT_EQUAL(kvs_tile_amax(r + len - tl, tl, &amax, NULL), KVS_EFORMAT);
            CU_ASSERT_EQUAL(
                kvs_block_requant_fp8(b.bytes, b.size, l, KVS_TILE_K, (uint8_t *)got, &scale, NULL),
                0); /* K tiles untouched */
        }
        r[len - tl + sizeof(kvs_tile_hdr)] ^= 0x01;
        CU_ASSERT_EQUAL(kvs_block_check(b.bytes, b.size, NULL, NULL), 0);
    }
    free(got);
    free(b.bytes);
}

typedef void (*tile_damage)(unsigned char *tile, const kvs_tile_hdr *h, const kvs_tile_layout *l);

static void bad_magic(unsigned char *t, const kvs_tile_hdr *h, const kvs_tile_layout *l)
{
    (void)l;
    kvs_tile_hdr x = *h;
    x.magic ^= 1u;
    memcpy(t, &x, sizeof x);
}

static void bad_payload_size(unsigned char *t, const kvs_tile_hdr *h, const kvs_tile_layout *l)
{
    (void)l;
    kvs_tile_hdr x = *h;
    x.payload_bytes -= 16u;
    memcpy(t, &x, sizeof x);
}

static void bad_outlier_index(unsigned char *t, const kvs_tile_hdr *h, const kvs_tile_layout *l)
{
    /* K tile: the group's span is T; index T is neither a token nor empty */
    unsigned char *e = t + sizeof *h + l->outliers + (size_t)(h->sinks ? 1 : 0) * l->entry;
    kvs_outlier_put(e, l->entry, h->tokens, 0x3C00u);
}

static void bad_scale(unsigned char *t, const kvs_tile_hdr *h, const kvs_tile_layout *l)
{
    uint16_t minus_one = 0xBC00u;
    memcpy(t + sizeof *h + l->scales, &minus_one, sizeof minus_one);
}

/* Every check but the checksum stays: damaged tiles, re-sealed so that their
 * checksums hold, are refused by every _verified entry, before any write. */
static void test_other_checks_stay(void)
{
    enum { T = 32, D = 24, H = 2 };
    float x[T * D];
    for (int i = 0; i < T * D; i++)
        x[i] = rnd_f();
    kvs_tile_params p = {.scheme = KVS_SCHEME_INT8,
                         .kind = KVS_TILE_K,
                         .tokens = T,
                         .dim = D,
                         .outliers = 2,
                         .sinks = 1};
    const size_t tl = kvs_tile_size(&p);
    unsigned char *good = aligned_alloc(16, (tl + 15) & ~(size_t)15);
    unsigned char *run = aligned_alloc(16, (H * tl + 15) & ~(size_t)15);
    CU_ASSERT_FATAL(good && run);
    CU_ASSERT_EQUAL_FATAL(kvs_tile_quantize_ref(&p, x, KVS_DTYPE_FP32, D, good, tl, NULL), 0);
    kvs_tile_hdr h;
    CU_ASSERT_EQUAL_FATAL(kvs_tile_check(good, tl, &h, NULL), 0);
    kvs_tile_layout l;
    kvs_tile_layout_of(h.scheme, h.kind, T, D, h.outliers, h.sinks, &l);
    static const struct {
        const char *what;
        tile_damage fn;
        int reseal;
    } dmg[] = {
        {"bad magic", bad_magic, 0},
        {"payload size", bad_payload_size, 0},
        {"outlier index", bad_outlier_index, 1},
        {"negative scale", bad_scale, 1},
    };
    float got[T * H * D];
    for (size_t i = 0; i < sizeof dmg / sizeof dmg[0]; i++) {
        for (uint32_t head = 0; head < H; head++) {
            for (uint32_t j = 0; j < H; j++)
                memcpy(run + j * tl, good, tl);
            unsigned char *t = run + head * tl;
            dmg[i].fn(t, &h, &l);
            if (dmg[i].reseal)
                CU_ASSERT_EQUAL_FATAL(kvs_tile_seal(t, tl, NULL), 0);
            char err[KVS_ERR_LEN] = "";
            CU_ASSERT_EQUAL(kvs_tile_check(t, tl, NULL, NULL), KVS_EFORMAT);
            CU_ASSERT_EQUAL(kvs_tile_check_verified(t, tl, NULL, err), KVS_EFORMAT);
            CU_ASSERT_PTR_NULL(strstr(err, "checksum"));
            memset(got, SENTINEL, sizeof got);
            CU_ASSERT_EQUAL(kvs_tile_dequantize_verified(t, tl, KVS_DTYPE_FP32, got, D, NULL),
                            KVS_EFORMAT);
            CU_ASSERT_EQUAL(kvs_tile_dequantize_verified_ref(t, tl, KVS_DTYPE_FP32, got, D, NULL),
                            KVS_EFORMAT);
            CU_ASSERT(all_bytes(got, sizeof got, SENTINEL));
            int rc = kvs_block_decode_run_verified(run, H * tl, KVS_TILE_K, H, T, D, KVS_DTYPE_FP32,
                                                   got, kvs_tile_dequantize_verified, err);
            if (rc != KVS_EFORMAT)
                printf("\n  %s, head %u: rc %d", dmg[i].what, head, rc);
            CU_ASSERT_EQUAL(rc, KVS_EFORMAT);
            /* head 0 damaged: nothing written; head 1: head 0 may stand */
            if (head == 0)
                CU_ASSERT(all_bytes(got, sizeof got, SENTINEL));
        }
    }
    /* short length, and the good run still decodes */
    memcpy(run, good, tl);
    memcpy(run + tl, good, tl);
    CU_ASSERT_EQUAL(kvs_tile_check_verified(good, tl - 1, NULL, NULL), KVS_EFORMAT);
    CU_ASSERT_EQUAL(kvs_tile_dequantize_verified(good, tl - 1, KVS_DTYPE_FP32, got, D, NULL),
                    KVS_EFORMAT);
    CU_ASSERT_EQUAL(kvs_block_decode_run_verified(run, H * tl - 1, KVS_TILE_K, H, T, D,
                                                  KVS_DTYPE_FP32, got, NULL, NULL),
                    KVS_EFORMAT);
    CU_ASSERT_EQUAL(kvs_block_decode_run_verified(run, H * tl, KVS_TILE_K, H, T, D, KVS_DTYPE_FP32,
                                                  got, NULL, NULL),
                    0);
    /* the arguments are checked as by kvs_block_decode_run */
    CU_ASSERT_EQUAL(kvs_block_decode_run_verified(run, H * tl, KVS_TILE_K, H, T, D, (kvs_dtype)0,
                                                  got, NULL, NULL),
                    KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_block_decode_run_verified(run, H * tl, KVS_TILE_K, H, T, D, KVS_DTYPE_FP32,
                                                  NULL, NULL, NULL),
                    KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_block_decode_run_verified(NULL, 0, KVS_TILE_K, H, T, D, KVS_DTYPE_FP32, got,
                                                  NULL, NULL),
                    KVS_EFORMAT);
    free(good);
    free(run);
}

int main(void)
{
    static const kvs_test_case cases[] = {
        {"_verified decodes equal the full path's bytes", test_same_bytes},
        {"the checksum is the caller's; decode_layer still checks", test_checksum_is_the_callers},
        {"every other tile check stays", test_other_checks_stay},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {
        {"decode verified tiles", NULL, NULL, cases},
        {NULL, NULL, NULL, NULL},
    };
    return kvs_test_run(suites);
}
