/*
 * test_kv_block.c — KV blocks (kernels/block/kv_block.h): layout, encode, full
 * validation, tile lookup, layer decode (also while the block is still
 * arriving), sealing, per-tensor FP8 egress, and hostile blocks.
 *
 * Expectations come from docs/FORMAT.md, not from kv_block.c: offsets and
 * sizes are recomputed from the byte tables (here and in tile_test_util.h),
 * the header is compared field by field at its documented offsets, the header
 * checksum is libxxhash's XXH3_64bits over the header (checksum zeroed) and
 * the padded scheme table, and each tile must equal what the (separately
 * tested) tile quantizer makes from the same [T][H][D] view. Egress codes are
 * decoded by a small E4M3 decoder written here.
 */
#include "kv_block.h"
#include "kv_format.h"
#include "kvq.h"
#include "kvq_math.h"
#include "kvs_error.h"
#include "kvs_test.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define TILE_TEST_SEED 0x243F6A8885A308D3ull
#include "tile_test_util.h"

/* ---- helpers ------------------------------------------------------------------ */

/* Tile size from docs/FORMAT.md: the 32-byte header and the payload. */
static size_t tile_bytes(int s, int kind, size_t T, size_t D, size_t k, size_t S)
{
    return 32 + layout((kvs_scheme)s, (kvs_tile_kind)kind, T, D, k, S).payload;
}

/* A block under test: its parameters, sources and encoding. */
typedef struct blk {
    kvs_block_params p;
    kvs_scheme schemes[8];
    float *kx[8], *vx[8];    /* fp32 values, exactly representable in src_dtype */
    void *ksrc[8], *vsrc[8]; /* the same in src_dtype */
    unsigned char *bytes;
    size_t size;
} blk;

static size_t esize(kvs_dtype d)
{
    return d == KVS_DTYPE_FP32 ? 4 : 2;
}

/* Expected offset of tile (l, kind, h), from FORMAT.md's order. */
static size_t tile_off(const kvs_block_params *p, uint32_t l, int kind, uint32_t h, size_t *len)
{
    size_t off = align16(40 + p->layers); /* tiles start 16-aligned */
    for (uint32_t j = 0; j <= l; j++) {
        int s = p->schemes[j];
        size_t kk = s == KVS_SCHEME_FP16 ? 0 : p->k_outliers,
               kv = s == KVS_SCHEME_FP16 ? 0 : p->v_outliers;
        size_t S = s == KVS_SCHEME_FP16 ? 0 : p->sinks;
        size_t ks = tile_bytes(s, 0, p->block_tokens, p->head_dim, kk, S);
        size_t vs = tile_bytes(s, 1, p->block_tokens, p->head_dim, kv, S);
        if (j < l) {
            off += p->heads * (ks + vs);
            continue;
        }
        *len = kind == KVS_TILE_K ? ks : vs;
        return off + (kind == KVS_TILE_K ? h * ks : p->heads * ks + h * vs);
    }
    return 0;
}

static size_t block_bytes(const kvs_block_params *p)
{
    size_t len, off = tile_off(p, p->layers - 1, KVS_TILE_V, p->heads - 1, &len);
    return off + len;
}

static void blk_make(blk *b, uint32_t L, uint32_t H, uint32_t D, uint32_t T, kvs_dtype dt, int root,
                     uint32_t kk, uint32_t kv, uint32_t S, const kvs_scheme *schemes)
{
    memset(b, 0, sizeof *b);
    CU_ASSERT_FATAL(L <= 8);
    memcpy(b->schemes, schemes, sizeof(kvs_scheme) * L);
    b->p = (kvs_block_params){L, H, D, T, dt, root, kk, kv, S, b->schemes, NULL, NULL, 0};
    size_t n = (size_t)T * H * D;
    for (uint32_t l = 0; l < L; l++) {
        for (int kind = 0; kind < 2; kind++) {
            float *x = malloc(sizeof(float) * n);
            unsigned char *src = malloc(esize(dt) * n);
            for (size_t i = 0; i < n; i++) {
                size_t d = i % D;
                float v = gauss() * (kind == 0 && d % 5 == 1 ? 16.0f : 1.0f);
                if (rnd() % 64 == 0)
                    v *= 30.0f;
                if (dt == KVS_DTYPE_FP16) {
                    uint16_t h16 = kvq_f32_to_fp16(v);
                    v = kvq_fp16_to_f32(h16);
                    memcpy(src + 2 * i, &h16, 2);
                } else if (dt == KVS_DTYPE_BF16) {
                    uint16_t b16 = kvq_f32_to_bf16(v);
                    v = kvq_bf16_to_f32(b16);
                    memcpy(src + 2 * i, &b16, 2);
                } else {
                    memcpy(src + 4 * i, &v, 4);
                }
                x[i] = v;
            }
            (kind ? b->vx : b->kx)[l] = x;
            (kind ? b->vsrc : b->ksrc)[l] = src;
        }
    }
    b->size = kvs_block_size(&b->p);
    CU_ASSERT_EQUAL(b->size, block_bytes(&b->p));
    b->bytes = malloc(b->size + 64);
    memset(b->bytes, SENTINEL, b->size + 64);
    char err[KVS_ERR_LEN] = "";
    int rc = kvs_block_encode(&b->p, (const void *const *)b->ksrc, (const void *const *)b->vsrc,
                              NULL, b->bytes, b->size + 64, err);
    if (rc)
        printf("\n  encode: %s", err);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    CU_ASSERT(all_bytes(b->bytes + b->size, 64, SENTINEL)); /* exactly size bytes written */
}

static void blk_free(blk *b)
{
    for (uint32_t l = 0; l < b->p.layers; l++) {
        free(b->kx[l]), free(b->vx[l]);
        free(b->ksrc[l]), free(b->vsrc[l]);
    }
    free(b->bytes);
}

static uint64_t hdr_checksum(const unsigned char *bytes, uint32_t L)
{
    size_t n = align16(40 + L);
    unsigned char *c = malloc(n);
    memcpy(c, bytes, n);
    memset(c + 32, 0, 8);
    uint64_t h = XXH3_64bits(c, n);
    free(c);
    return h;
}
static void reseal_hdr(unsigned char *bytes)
{
    wr64(bytes + 32, hdr_checksum(bytes, rd16(bytes + 8)));
}

/* ---- layout and header ------------------------------------------------------------ */

static void check_layout(const blk *b)
{
    const kvs_block_params *p = &b->p;
    const unsigned char *h = b->bytes;
    /* header at FORMAT.md's offsets */
    CU_ASSERT_EQUAL(rd16(h) | (uint32_t)rd16(h + 2) << 16, 0x3142564Bu);
    CU_ASSERT_EQUAL(memcmp(h, "KVB1", 4), 0);
    CU_ASSERT_EQUAL(h[4], 2);
    CU_ASSERT_EQUAL(h[5], p->root ? 1 : 0);
    CU_ASSERT_EQUAL(h[6], p->src_dtype);
    CU_ASSERT_EQUAL(h[7], 0);
    CU_ASSERT_EQUAL(rd16(h + 8), p->layers);
    CU_ASSERT_EQUAL(rd16(h + 10), p->heads);
    CU_ASSERT_EQUAL(rd16(h + 12), p->head_dim);
    CU_ASSERT_EQUAL(rd16(h + 14), p->block_tokens);
    CU_ASSERT_EQUAL(h[16], p->k_outliers);
    CU_ASSERT_EQUAL(h[17], p->v_outliers);
    CU_ASSERT_EQUAL(h[18], p->sinks);
    CU_ASSERT(all_bytes(h + 19, 5, 0));
    CU_ASSERT_EQUAL(rd64(h + 24), b->size);
    CU_ASSERT_EQUAL(rd64(h + 32), hdr_checksum(h, p->layers));
    /* scheme table, zero padded */
    for (uint32_t l = 0; l < p->layers; l++)
        CU_ASSERT_EQUAL(h[40 + l], p->schemes[l]);
    CU_ASSERT(all_bytes(h + 40 + p->layers, align16(40 + p->layers) - 40 - p->layers, 0));

    /* every tile where FORMAT.md puts it, equal to the tile codec's own output
     * for the [T][H][D] view, and found there by kvs_block_tile */
    unsigned bad = 0;
    const size_t es = esize(p->src_dtype);
    for (uint32_t l = 0; l < p->layers; l++) {
        uint64_t loff = 0, lbytes = 0;
        size_t first_len, last_len;
        CU_ASSERT_EQUAL(kvs_block_layer_range(h, b->size, l, &loff, &lbytes, NULL), 0);
        size_t want_off = tile_off(p, l, KVS_TILE_K, 0, &first_len);
        size_t want_end = tile_off(p, l, KVS_TILE_V, p->heads - 1, &last_len) + last_len;
        CU_ASSERT_EQUAL(loff, want_off);
        CU_ASSERT_EQUAL(lbytes, want_end - want_off);
        for (int kind = 0; kind < 2; kind++)
            for (uint32_t hd = 0; hd < p->heads; hd++) {
                size_t len, off = tile_off(p, l, kind, hd, &len);
                const void *t = NULL;
                size_t tlen = 0;
                CU_ASSERT_EQUAL(
                    kvs_block_tile(h, b->size, l, (kvs_tile_kind)kind, hd, &t, &tlen, NULL), 0);
                if (t != h + off || tlen != len) {
                    if (bad++ < MAX_REPORT)
                        printf("\n  tile %u/%d/%u at %td+%zu, want %zu+%zu", l, kind, hd,
                               (const unsigned char *)t - h, tlen, off, len);
                    continue;
                }
                int s = p->schemes[l];
                kvs_tile_params tp = {(kvs_scheme)s,
                                      (kvs_tile_kind)kind,
                                      p->block_tokens,
                                      p->head_dim,
                                      s == KVS_SCHEME_FP16 ? 0
                                      : kind               ? p->v_outliers
                                                           : p->k_outliers,
                                      s == KVS_SCHEME_FP16 ? 0 : p->sinks,
                                      NULL,
                                      0.0f,
                                      0};
                unsigned char *want = malloc(len);
                const unsigned char *src = (kind ? b->vsrc : b->ksrc)[l];
                CU_ASSERT_EQUAL(kvs_tile_quantize_ref(&tp, src + (size_t)hd * p->head_dim * es,
                                                      p->src_dtype, (size_t)p->heads * p->head_dim,
                                                      want, len, NULL),
                                0);
                if (memcmp(want, h + off, len) != 0 && bad++ < MAX_REPORT)
                    printf("\n  tile %u/%d/%u differs from the tile codec's", l, kind, hd);
                free(want);
            }
    }
    CU_ASSERT_EQUAL(bad, 0);
}

static void test_layout(void)
{
    const kvs_scheme s3[3] = {KVS_SCHEME_FP8_E4M3, KVS_SCHEME_FP16, KVS_SCHEME_INT8};
    blk b;
    blk_make(&b, 3, 2, 8, 16, KVS_DTYPE_FP32, 1, 1, 2, 2, s3);
    /* By hand (format v2): E4M3 K tile = 32 + 128 codes + 16 scales + 24
     * outliers (+ 8 pad) + 32 sinks = 240, V = 32 + 128 + 32 + 96 + 32 = 320;
     * fp16 tile = 32 + 256 = 288; INT8 like E4M3. */
    CU_ASSERT_EQUAL(tile_bytes(2, 0, 16, 8, 1, 2), 240);
    CU_ASSERT_EQUAL(tile_bytes(2, 1, 16, 8, 2, 2), 320);
    CU_ASSERT_EQUAL(b.size, 48 + 2 * (240 + 320) + 4 * 288 + 2 * (240 + 320));
    check_layout(&b);
    CU_ASSERT_EQUAL(kvs_block_check(b.bytes, b.size, NULL, NULL), 0);
    blk_free(&b);

    /* 8 layers: header + table fill 48 bytes. Non-root, no sinks. */
    kvs_scheme s17[8];
    for (int i = 0; i < 8; i++)
        s17[i] = (kvs_scheme)(1 + i % 4);
    blk_make(&b, 8, 1, 4, 16, KVS_DTYPE_BF16, 0, 0, 3, 0, s17);
    CU_ASSERT_EQUAL(rd16(b.bytes + 8), 8);
    check_layout(&b);
    kvs_block_hdr hdr;
    CU_ASSERT_EQUAL(kvs_block_check(b.bytes, b.size, &hdr, NULL), 0);
    CU_ASSERT_EQUAL(memcmp(&hdr, b.bytes, 40), 0);
    blk_free(&b);
}

/* ---- round trips ------------------------------------------------------------------ */

/* Decodes every layer into every dtype and compares with the tile codec's
 * decode of the same tiles, and with the source where the rule says exact:
 * fp16 layers equal fp16(x); sink rows of root blocks equal fp16(x). */
static void check_roundtrip(const blk *b)
{
    const kvs_block_params *p = &b->p;
    const uint32_t T = p->block_tokens, H = p->heads, D = p->head_dim;
    const size_t n = (size_t)T * H * D;
    unsigned bad = 0;
    CU_ASSERT_EQUAL_FATAL(kvs_block_check(b->bytes, b->size, NULL, NULL), 0);
    float *k32 = malloc(4 * n), *v32 = malloc(4 * n), *ref = malloc(4 * n);
    uint16_t *k16 = malloc(2 * n + 16), *v16 = malloc(2 * n + 16);
    for (uint32_t l = 0; l < p->layers; l++) {
        char err[KVS_ERR_LEN] = "";
        int rc = kvs_block_decode_layer(b->bytes, b->size, l, KVS_DTYPE_FP32, k32, v32, NULL, err);
        if (rc)
            printf("\n  decode: %s", err);
        CU_ASSERT_EQUAL_FATAL(rc, 0);
        for (int kind = 0; kind < 2; kind++) {
            const float *y = kind ? v32 : k32, *x = kind ? b->vx[l] : b->kx[l];
            for (uint32_t h = 0; h < H; h++) {
                const void *t;
                size_t tl;
                CU_ASSERT_EQUAL_FATAL(
                    kvs_block_tile(b->bytes, b->size, l, (kvs_tile_kind)kind, h, &t, &tl, NULL), 0);
                CU_ASSERT_EQUAL_FATAL(kvs_tile_dequantize_ref(t, tl, KVS_DTYPE_FP32, ref + h * D,
                                                              (size_t)H * D, NULL),
                                      0);
            }
            for (size_t i = 0; i < n; i++) {
                size_t t = i / ((size_t)H * D);
                int exact = p->schemes[l] == KVS_SCHEME_FP16 || t < p->sinks;
                float want = kvq_fp16_to_f32(kvq_f32_to_fp16(x[i]));
                if (fbits(y[i]) != fbits(ref[i]) || (exact && fbits(y[i]) != fbits(want))) {
                    if (bad++ < MAX_REPORT)
                        printf("\n  layer %u kind %d elem %zu: %a (ref %a, x %a)", l, kind, i,
                               (double)y[i], (double)ref[i], (double)x[i]);
                }
            }
            /* quantization error stays small relative to the tensor (scheme-level
             * sanity; exact bounds are the tile test's job) */
            double amax = 0, emax = 0;
            for (size_t i = 0; i < n; i++) {
                amax = fmax(amax, fabs(x[i]));
                emax = fmax(emax, fabs((double)x[i] - y[i]));
            }
            double rel = p->schemes[l] == KVS_SCHEME_FP16       ? 1e-3
                         : p->schemes[l] == KVS_SCHEME_INT8     ? 1.0 / 127
                         : p->schemes[l] == KVS_SCHEME_FP8_E4M3 ? 1.0 / 16
                                                                : 1.0 / 8;
            if (!(emax <= rel * amax) && bad++ < MAX_REPORT)
                printf("\n  layer %u kind %d: max error %g of amax %g", l, kind, emax, amax);
        }
        /* fp16 and bf16 destinations are the fp32 decode, converted; V only. */
        memset(k16, SENTINEL, 2 * n + 16);
        CU_ASSERT_EQUAL(
            kvs_block_decode_layer(b->bytes, b->size, l, KVS_DTYPE_FP16, k16, NULL, NULL, NULL), 0);
        CU_ASSERT_EQUAL(
            kvs_block_decode_layer(b->bytes, b->size, l, KVS_DTYPE_BF16, NULL, v16, NULL, NULL), 0);
        for (size_t i = 0; i < n; i++)
            if ((k16[i] != kvq_f32_to_fp16(k32[i]) || v16[i] != kvq_f32_to_bf16(v32[i])) &&
                bad++ < MAX_REPORT)
                printf("\n  layer %u elem %zu: 16-bit decode differs", l, i);
        CU_ASSERT(all_bytes(k16 + n, 16, SENTINEL));
    }
    CU_ASSERT_EQUAL(bad, 0);
    free(k32), free(v32), free(ref), free(k16), free(v16);
}

static void test_roundtrip(void)
{
    static const struct {
        uint32_t L, H, D, T;
        kvs_dtype dt;
        int root;
        uint32_t kk, kv, S;
        kvs_scheme s[4];
    } cfg[] = {
        {1, 1, 1, 16, KVS_DTYPE_FP32, 0, 0, 0, 0, {KVS_SCHEME_INT8}},
        {2, 2, 16, 16, KVS_DTYPE_FP16, 1, 2, 2, 4, {KVS_SCHEME_FP8_E4M3, KVS_SCHEME_FP8_E5M2}},
        {4,
         3,
         24,
         32,
         KVS_DTYPE_BF16,
         1,
         1,
         4,
         16,
         {KVS_SCHEME_FP16, KVS_SCHEME_FP8_E4M3, KVS_SCHEME_FP16, KVS_SCHEME_INT8}},
        {3,
         4,
         64,
         48,
         KVS_DTYPE_FP32,
         0,
         2,
         2,
         0,
         {KVS_SCHEME_FP8_E4M3, KVS_SCHEME_FP8_E4M3, KVS_SCHEME_FP16}},
        {2, 1, 128, 16, KVS_DTYPE_FP16, 1, 16, 16, 16, {KVS_SCHEME_INT8, KVS_SCHEME_FP8_E5M2}},
        {1, 2, 8, 64, KVS_DTYPE_FP32, 1, 3, 0, 0, {KVS_SCHEME_FP16}}, /* root, no sinks */
    };
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
        blk b;
        blk_make(&b, cfg[i].L, cfg[i].H, cfg[i].D, cfg[i].T, cfg[i].dt, cfg[i].root, cfg[i].kk,
                 cfg[i].kv, cfg[i].S, cfg[i].s);
        check_layout(&b);
        check_roundtrip(&b);
        blk_free(&b);
    }
}

/* The most layers a block may have: the padded scheme table (up to 1032 bytes at
 * 1017..1024 layers) goes through the header checksum whole (it once overflowed a
 * 40 + 1024-byte stack buffer there: ASan found it). A flipped table byte is caught. */
static void test_max_layers(void)
{
    static const uint32_t Ls[] = {1016, 1017, 1020, 1024};
    const uint32_t T = 16;
    static uint16_t zeros[16]; /* T x H=1 x D=1 fp16 zeros, shared by every layer */
    static kvs_scheme sch[KVS_BLOCK_MAX_LAYERS];
    static const void *src[KVS_BLOCK_MAX_LAYERS];
    for (uint32_t i = 0; i < KVS_BLOCK_MAX_LAYERS; i++) {
        sch[i] = i % 3 ? KVS_SCHEME_FP16 : KVS_SCHEME_INT8;
        src[i] = zeros;
    }
    for (size_t i = 0; i < sizeof Ls / sizeof Ls[0]; i++) {
        kvs_block_params p = {Ls[i], 1, 1, T, KVS_DTYPE_FP16, 0, 0, 0, 0, sch, NULL, NULL, 0};
        size_t n = kvs_block_size(&p);
        CU_ASSERT_FATAL(n > 0);
        unsigned char *b = malloc(n);
        CU_ASSERT_FATAL(b != NULL);
        char err[KVS_ERR_LEN] = "";
        CU_ASSERT_EQUAL(kvs_block_encode(&p, src, src, NULL, b, n, err), 0);
        kvs_block_hdr h;
        CU_ASSERT_EQUAL(kvs_block_check_header(b, n, &h, err), 0);
        CU_ASSERT_EQUAL(h.num_layers, Ls[i]);
        CU_ASSERT_EQUAL(kvs_block_check(b, n, NULL, err), 0);
        /* Another valid scheme for the last layer: only the checksum can tell. */
        unsigned char *last = b + sizeof(kvs_block_hdr) + Ls[i] - 1;
        *last = *last == KVS_SCHEME_FP16 ? KVS_SCHEME_FP8_E4M3 : KVS_SCHEME_FP8_E5M2;
        CU_ASSERT_EQUAL(kvs_block_check_header(b, n, NULL, err), KVS_EFORMAT);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "checksum"));
        free(b);
    }
}

/* The quantizer is the caller's choice; its failure surfaces with the tile named. */
static int g_calls, g_fail_at;
static int counting_quantize(const kvs_tile_params *p, const void *src, kvs_dtype dtype,
                             size_t stride, void *out, size_t cap, char *err)
{
    if (++g_calls == g_fail_at) {
        snprintf(err, KVS_ERR_LEN, "injected failure");
        return KVS_ENOMEM;
    }
    return kvs_tile_quantize_ref(p, src, dtype, stride, out, cap, err);
}

static void test_quantize_fn(void)
{
    const kvs_scheme s2[2] = {KVS_SCHEME_INT8, KVS_SCHEME_FP16};
    blk b;
    blk_make(&b, 2, 3, 8, 16, KVS_DTYPE_FP32, 1, 1, 1, 1, s2);
    unsigned char *o = malloc(b.size);
    g_calls = 0, g_fail_at = -1;
    CU_ASSERT_EQUAL(kvs_block_encode(&b.p, (const void *const *)b.ksrc, (const void *const *)b.vsrc,
                                     counting_quantize, o, b.size, NULL),
                    0);
    CU_ASSERT_EQUAL(g_calls, 2 * 2 * 3);
    CU_ASSERT_EQUAL(memcmp(o, b.bytes, b.size), 0);
    char err[KVS_ERR_LEN] = "";
    g_calls = 0, g_fail_at = 11; /* layer 1, V, head 1 */
    CU_ASSERT_EQUAL(kvs_block_encode(&b.p, (const void *const *)b.ksrc, (const void *const *)b.vsrc,
                                     counting_quantize, o, b.size, err),
                    KVS_ENOMEM);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "layer 1 V head 1: injected failure"));
    free(o);
    blk_free(&b);
}

/* A worker decodes layer l as soon as the bytes up to its end have arrived. */
static void test_streaming(void)
{
    const kvs_scheme s3[3] = {KVS_SCHEME_FP8_E4M3, KVS_SCHEME_FP16, KVS_SCHEME_INT8};
    blk b;
    blk_make(&b, 3, 2, 16, 16, KVS_DTYPE_FP16, 1, 2, 2, 3, s3);
    const size_t n = 16 * 2 * 16;
    float *k = malloc(4 * n), *v = malloc(4 * n), *kf = malloc(4 * n), *vf = malloc(4 * n);
    size_t hdr_len = 48; /* header + table padded so tiles start 16-aligned */
    CU_ASSERT_EQUAL(kvs_block_check_header(b.bytes, hdr_len, NULL, NULL), 0);
    CU_ASSERT_EQUAL(kvs_block_check_header(b.bytes, hdr_len - 1, NULL, NULL), KVS_EFORMAT);
    for (uint32_t l = 0; l < 3; l++) {
        size_t len, end = tile_off(&b.p, l, KVS_TILE_V, 1, &len) + len;
        char err[KVS_ERR_LEN];
        memset(k, SENTINEL, 4 * n);
        CU_ASSERT_EQUAL(
            kvs_block_decode_layer(b.bytes, end - 1, l, KVS_DTYPE_FP32, k, v, NULL, err),
            KVS_EFORMAT);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "truncated"));
        CU_ASSERT(all_bytes(k, 4 * n, SENTINEL));
        CU_ASSERT_EQUAL(kvs_block_decode_layer(b.bytes, end, l, KVS_DTYPE_FP32, k, v, NULL, err),
                        0);
        CU_ASSERT_EQUAL(
            kvs_block_decode_layer(b.bytes, b.size, l, KVS_DTYPE_FP32, kf, vf, NULL, err), 0);
        CU_ASSERT_EQUAL(memcmp(k, kf, 4 * n), 0);
        CU_ASSERT_EQUAL(memcmp(v, vf, 4 * n), 0);
        if (l < 2) /* the whole block is not there yet */
            CU_ASSERT_EQUAL(kvs_block_check(b.bytes, end, NULL, NULL), KVS_EFORMAT);
    }
    free(k), free(v), free(kf), free(vf);
    blk_free(&b);
}

/* ---- egress: per-tensor FP8 ------------------------------------------------------- */

/* E4M3 decode from the definition (bias 7, 3 mantissa bits, 0x7F = NaN). */
static double e4m3(uint8_t c)
{
    int sign = c >> 7, e = (c >> 3) & 15, m = c & 7;
    if ((c & 0x7F) == 0x7F)
        return NAN;
    double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return sign ? -v : v;
}

static void test_requant(void)
{
    const kvs_scheme s3[3] = {KVS_SCHEME_FP8_E4M3, KVS_SCHEME_FP16, KVS_SCHEME_INT8};
    blk b;
    blk_make(&b, 3, 3, 16, 32, KVS_DTYPE_BF16, 1, 2, 1, 2, s3);
    const uint32_t T = 32, H = 3, D = 16;
    const size_t n = (size_t)T * H * D;
    float *x = calloc(n, 4);
    uint8_t *codes = malloc(n + 16);
    unsigned bad = 0;
    for (uint32_t l = 0; l < 3; l++)
        for (int kind = 0; kind < 2; kind++) {
            CU_ASSERT_EQUAL_FATAL(kvs_block_decode_layer(b.bytes, b.size, l, KVS_DTYPE_FP32,
                                                         kind ? NULL : x, kind ? x : NULL, NULL,
                                                         NULL),
                                  0);
            double amax = 0;
            for (size_t i = 0; i < n; i++)
                amax = fmax(amax, fabs(x[i]));
            /* per-tile amax, from the decoded tensor */
            for (uint32_t h = 0; h < H; h++) {
                const void *t;
                size_t tl;
                float ta = -1;
                CU_ASSERT_EQUAL(
                    kvs_block_tile(b.bytes, b.size, l, (kvs_tile_kind)kind, h, &t, &tl, NULL), 0);
                CU_ASSERT_EQUAL(kvs_tile_amax(t, tl, &ta, NULL), 0);
                double want = 0;
                for (uint32_t tt = 0; tt < T; tt++)
                    for (uint32_t d = 0; d < D; d++)
                        want = fmax(want, fabs(x[(size_t)tt * H * D + h * D + d]));
                CU_ASSERT_EQUAL((double)ta, want);
            }
            float scale = -1;
            memset(codes, SENTINEL, n + 16);
            CU_ASSERT_EQUAL_FATAL(
                kvs_block_requant_fp8(b.bytes, b.size, l, (kvs_tile_kind)kind, codes, &scale, NULL),
                0);
            CU_ASSERT_EQUAL(fbits(scale), fbits((float)amax / 448.0f));
            CU_ASSERT(all_bytes(codes + n, 16, SENTINEL));
            int saw_max = 0;
            for (size_t i = 0; i < n; i++) {
                double got = e4m3(codes[i]) * scale;
                double tol = fmax(fabs(x[i]) / 16.0, ldexp(scale, -10)) * (1 + 1e-6);
                if (!(fabs(got - x[i]) <= tol) && bad++ < MAX_REPORT)
                    printf("\n  layer %u kind %d elem %zu: x' %a code 0x%02x -> %a", l, kind, i,
                           (double)x[i], codes[i], got);
                if (fabs(x[i]) == amax)
                    saw_max |= (codes[i] & 0x7F) == 0x7E;
            }
            CU_ASSERT(saw_max);
        }
    CU_ASSERT_EQUAL(bad, 0);

    /* One tile into a strided view; the gaps stay untouched. */
    const void *t;
    size_t tl;
    CU_ASSERT_EQUAL_FATAL(kvs_block_tile(b.bytes, b.size, 0, KVS_TILE_V, 2, &t, &tl, NULL), 0);
    uint8_t *strided = malloc((size_t)T * 20);
    memset(strided, SENTINEL, (size_t)T * 20);
    CU_ASSERT_EQUAL(kvs_tile_requant_fp8(t, tl, 0.01f, strided, 20, NULL), 0);
    float *tx = malloc(4 * (size_t)T * D);
    CU_ASSERT_EQUAL(kvs_tile_dequantize_ref(t, tl, KVS_DTYPE_FP32, tx, D, NULL), 0);
    for (uint32_t tt = 0; tt < T; tt++) {
        CU_ASSERT(all_bytes(strided + tt * 20 + D, 4, SENTINEL));
        for (uint32_t d = 0; d < D; d++) /* scale 0.01 saturates beyond 4.48 */
            CU_ASSERT_EQUAL(strided[tt * 20 + d], kvq_f32_to_e4m3(tx[tt * D + d] * (1.0f / 0.01f)));
    }
    char err[KVS_ERR_LEN];
    CU_ASSERT_EQUAL(kvs_tile_requant_fp8(t, tl, -1.0f, strided, 20, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "scale"));
    CU_ASSERT_EQUAL(kvs_tile_requant_fp8(t, tl, NAN, strided, 20, err), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_tile_requant_fp8(t, tl, 1.0f, strided, D - 1, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "stride"));
    CU_ASSERT_EQUAL(kvs_tile_requant_fp8(t, tl - 1, 1.0f, strided, D, err), KVS_EFORMAT);
    float sc = 7.0f;
    CU_ASSERT_EQUAL(kvs_block_requant_fp8(b.bytes, b.size, 3, KVS_TILE_K, codes, &sc, err),
                    KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "layer"));
    CU_ASSERT_EQUAL(kvs_block_requant_fp8(b.bytes, b.size, 0, (kvs_tile_kind)2, codes, &sc, err),
                    KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_block_requant_fp8(b.bytes, b.size - 1, 2, KVS_TILE_V, codes, &sc, err),
                    KVS_EFORMAT);
    CU_ASSERT_EQUAL(sc, 7.0f); /* untouched on failure */
    free(strided), free(tx);
    free(x), free(codes);
    blk_free(&b);
}

/* Re-encodes b after its fp32 sources (src_dtype fp32) were edited by hand. */
static void blk_reencode(blk *b)
{
    for (uint32_t l = 0; l < b->p.layers; l++) {
        size_t n = (size_t)b->p.block_tokens * b->p.heads * b->p.head_dim;
        memcpy(b->ksrc[l], b->kx[l], 4 * n);
        memcpy(b->vsrc[l], b->vx[l], 4 * n);
    }
    CU_ASSERT_EQUAL_FATAL(kvs_block_encode(&b->p, (const void *const *)b->ksrc,
                                           (const void *const *)b->vsrc, NULL, b->bytes, b->size,
                                           NULL),
                          0);
}

/* Non-finite values on egress: ±Inf saturate to ±448, NaN is 0x7F, and
 * neither moves the scale — also when the finite values are all zero. */
static void test_requant_nonfinite(void)
{
    const kvs_scheme s2[2] = {KVS_SCHEME_FP16, KVS_SCHEME_FP8_E5M2};
    blk b;
    blk_make(&b, 2, 2, 4, 16, KVS_DTYPE_FP32, 0, 0, 0, 0, s2);
    const size_t n = 16 * 2 * 4;
    for (size_t i = 0; i < n; i++)
        b.kx[0][i] = b.vx[0][i] = b.kx[1][i] = 0.0f;
    b.kx[0][3] = INFINITY, b.kx[0][9] = -INFINITY, b.kx[0][17] = NAN, b.kx[0][20] = -2.5f;
    b.vx[0][5] = INFINITY, b.vx[0][6] = NAN; /* V of layer 0: no finite value but 0 */
    b.kx[1][0] = 0.875f; /* E5M2: amax 0.875 = 57344 * 2^-16, an exact fp16 scale */
    blk_reencode(&b);
    uint8_t codes[16 * 2 * 4];
    float scale;
    CU_ASSERT_EQUAL_FATAL(
        kvs_block_requant_fp8(b.bytes, b.size, 0, KVS_TILE_K, codes, &scale, NULL), 0);
    CU_ASSERT_EQUAL(scale, 2.5f / 448.0f);
    CU_ASSERT_EQUAL(codes[3], 0x7E);
    CU_ASSERT_EQUAL(codes[9], 0xFE);
    CU_ASSERT_EQUAL(codes[17], 0x7F);
    CU_ASSERT_EQUAL(codes[20], 0xFE);
    CU_ASSERT_EQUAL(codes[0], 0x00);
    CU_ASSERT_EQUAL_FATAL(
        kvs_block_requant_fp8(b.bytes, b.size, 0, KVS_TILE_V, codes, &scale, NULL), 0);
    CU_ASSERT_EQUAL(fbits(scale), 0);
    CU_ASSERT_EQUAL(codes[5], 0x7E); /* not NaN, although Inf * 0 is */
    CU_ASSERT_EQUAL(codes[6], 0x7F);
    CU_ASSERT_EQUAL(codes[7], 0x00);
    float a = -1;
    const void *t;
    size_t tl;
    CU_ASSERT_EQUAL(kvs_block_tile(b.bytes, b.size, 0, KVS_TILE_V, 1, &t, &tl, NULL), 0);
    CU_ASSERT_EQUAL(kvs_tile_amax(t, tl, &a, NULL), 0);
    CU_ASSERT_EQUAL(fbits(a), 0);
    CU_ASSERT_EQUAL(kvs_block_tile(b.bytes, b.size, 0, KVS_TILE_K, 1, &t, &tl, NULL), 0);
    CU_ASSERT_EQUAL(kvs_tile_amax(t, tl, &a, NULL), 0); /* element 20 is t=2, head 1, d=0 */
    CU_ASSERT_EQUAL(a, 2.5f);
    CU_ASSERT_EQUAL(kvs_block_tile(b.bytes, b.size, 0, KVS_TILE_K, 0, &t, &tl, NULL), 0);
    CU_ASSERT_EQUAL(kvs_tile_amax(t, tl, &a, NULL), 0); /* head 0: ±Inf, NaN and zeros */
    CU_ASSERT_EQUAL(fbits(a), 0);
    CU_ASSERT_EQUAL_FATAL(
        kvs_block_requant_fp8(b.bytes, b.size, 1, KVS_TILE_K, codes, &scale, NULL), 0);
    CU_ASSERT_EQUAL(scale, 0.875f / 448.0f);
    CU_ASSERT_EQUAL(codes[0], 0x7E);
    blk_free(&b);
}

/* ---- parameters ------------------------------------------------------------------- */

static void expect_param(const kvs_block_params *p, const char *field)
{
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL(kvs_block_params_check(p, err), KVS_EINVAL);
    if (strstr(err, field) == NULL)
        printf("\n  \"%s\" does not name \"%s\"", err, field);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, field));
    CU_ASSERT_EQUAL(kvs_block_size(p), 0);
}

static void test_params(void)
{
    kvs_scheme s2[2] = {KVS_SCHEME_INT8, KVS_SCHEME_FP16};
    const kvs_block_params ok = {2, 2, 8, 16, KVS_DTYPE_FP32, 1, 1, 1, 1, s2, NULL, NULL, 0};
    kvs_block_params p;
    CU_ASSERT_EQUAL(kvs_block_params_check(&ok, NULL), 0);
    CU_ASSERT_EQUAL(kvs_block_params_check(NULL, NULL), KVS_EINVAL);
    p = ok, p.layers = 0, expect_param(&p, "num_layers");
    p = ok, p.layers = 1025, expect_param(&p, "num_layers");
    p = ok, p.heads = 0, expect_param(&p, "num_kv_heads");
    p = ok, p.heads = 257, expect_param(&p, "num_kv_heads");
    p = ok, p.head_dim = 0, expect_param(&p, "head_dim");
    p = ok, p.head_dim = 1025, expect_param(&p, "head_dim");
    p = ok, p.block_tokens = 15, expect_param(&p, "block_tokens");
    p = ok, p.block_tokens = 1025, expect_param(&p, "block_tokens");
    p = ok, p.src_dtype = (kvs_dtype)0, expect_param(&p, "src_dtype");
    p = ok, p.src_dtype = (kvs_dtype)4, expect_param(&p, "src_dtype");
    p = ok, p.k_outliers = 17, expect_param(&p, "k_outliers");
    p = ok, p.v_outliers = 17, expect_param(&p, "v_outliers");
    p = ok, p.sinks = 17, expect_param(&p, "sinks"); /* > T */
    p = ok, p.block_tokens = 128, p.sinks = 65, expect_param(&p, "sinks");
    p = ok, p.root = 0, expect_param(&p, "sinks");
    p = ok, p.schemes = NULL, expect_param(&p, "schemes");
    kvs_scheme bad[2] = {KVS_SCHEME_INT8, (kvs_scheme)5};
    p = ok, p.schemes = bad, expect_param(&p, "schemes[1]");
    const float ts_ok[2] = {0.5f, 0.0f}, ts_nan[2] = {0.5f, NAN}, ts_neg[2] = {-1.0f, 0.0f},
                ts_inf[2] = {0.0f, INFINITY};
    p = ok, p.k_tensor_scales = ts_ok, p.v_tensor_scales = ts_ok;
    CU_ASSERT_EQUAL(kvs_block_params_check(&p, NULL), 0);
    p = ok, p.k_tensor_scales = ts_nan, expect_param(&p, "k_tensor_scales[1]");
    p = ok, p.v_tensor_scales = ts_neg, expect_param(&p, "v_tensor_scales[0]");
    p = ok, p.v_tensor_scales = ts_inf, expect_param(&p, "v_tensor_scales[1]");
    p = ok, p.root = 0, p.sinks = 0;
    CU_ASSERT_EQUAL(kvs_block_params_check(&p, NULL), 0);

    size_t size = kvs_block_size(&ok);
    CU_ASSERT_EQUAL(size, block_bytes(&ok));
    float x[16 * 2 * 8] = {0};
    const void *src[2] = {x, x}, *half[2] = {x, NULL};
    uint64_t *buf = malloc(size + 8);
    unsigned char *out = (unsigned char *)buf;
    char err[KVS_ERR_LEN];
    memset(buf, SENTINEL, size + 8);
    CU_ASSERT_EQUAL(kvs_block_encode(&ok, NULL, src, NULL, out, size, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "k_src"));
    CU_ASSERT_EQUAL(kvs_block_encode(&ok, src, half, NULL, out, size, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "v_src[1]"));
    CU_ASSERT_EQUAL(kvs_block_encode(&ok, src, src, NULL, NULL, size, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "out"));
    CU_ASSERT_EQUAL(kvs_block_encode(&ok, src, src, NULL, out + 4, size, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "aligned"));
    CU_ASSERT_EQUAL(kvs_block_encode(&ok, src, src, NULL, out, size - 1, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "cap"));
    p = ok, p.heads = 0;
    CU_ASSERT_EQUAL(kvs_block_encode(&p, src, src, NULL, out, size, err), KVS_EINVAL);
    CU_ASSERT(all_bytes(out, size + 8, SENTINEL)); /* nothing written on a parameter error */
    CU_ASSERT_EQUAL(kvs_block_encode(&ok, src, src, NULL, out, size, err), 0);

    /* lookups and decode: indices and views */
    const void *t = NULL;
    size_t tl = 0;
    CU_ASSERT_EQUAL(kvs_block_tile(out, size, 2, KVS_TILE_K, 0, &t, &tl, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "layer"));
    CU_ASSERT_EQUAL(kvs_block_tile(out, size, 1, KVS_TILE_V, 2, &t, &tl, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "head"));
    CU_ASSERT_EQUAL(kvs_block_tile(out, size, 1, (kvs_tile_kind)2, 0, &t, &tl, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "kind"));
    CU_ASSERT_EQUAL(kvs_block_tile(out, size - 1, 1, KVS_TILE_V, 1, &t, &tl, err), KVS_EFORMAT);
    CU_ASSERT_EQUAL(kvs_block_tile(out, size, 1, KVS_TILE_V, 1, &t, &tl, err), 0);
    CU_ASSERT_EQUAL((const unsigned char *)t + tl, out + size);
    CU_ASSERT_EQUAL(kvs_block_layer_range(out, size, 2, NULL, NULL, err), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_block_decode_layer(out, size, 0, (kvs_dtype)0, x, x, NULL, err),
                    KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "dtype"));
    CU_ASSERT_EQUAL(kvs_block_decode_layer(out, size, 0, KVS_DTYPE_FP32, NULL, NULL, NULL, err),
                    KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_block_decode_layer(out, size, 2, KVS_DTYPE_FP32, x, x, NULL, err),
                    KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "layer"));
    free(buf);
}

/* ---- hostile blocks --------------------------------------------------------------- */

/* kvs_block_check and kvs_block_decode_layer (on every layer) both give
 * KVS_EFORMAT, the latter writing nothing. */
static int rejected(const unsigned char *bytes, size_t len, const char *want_in_err)
{
    static float dst[2][16 * 4 * 32];
    char err[KVS_ERR_LEN] = "";
    int ok = kvs_block_check(bytes, len, NULL, err) == KVS_EFORMAT;
    if (ok && want_in_err && strstr(err, want_in_err) == NULL) {
        printf("\n  \"%s\" lacks \"%s\"", err, want_in_err);
        ok = 0;
    }
    memset(dst, SENTINEL, sizeof dst);
    int any_decode_fail = 0;
    for (uint32_t l = 0; l < 2; l++) {
        int rc = kvs_block_decode_layer(bytes, len, l, KVS_DTYPE_FP32, dst[0], dst[1], NULL, NULL);
        if (rc == KVS_EFORMAT)
            any_decode_fail = 1;
        else if (rc != 0 && rc != KVS_EINVAL)
            ok = 0;
        if (rc != 0 && !all_bytes(dst, sizeof dst, SENTINEL))
            ok = 0; /* a failed decode wrote */
        memset(dst, SENTINEL, sizeof dst);
    }
    return ok && any_decode_fail;
}

/* The block hostile tests mutate: L=2 (E4M3, fp16), H=1, D=16, T=16, root,
 * k = 1 / 1, S = 1. 1936 bytes (format v2: E4M3 tiles of 32 + 256 codes + 32
 * scales + 48 outliers + 32 sinks). */
static void small_block(blk *b)
{
    const kvs_scheme s2[2] = {KVS_SCHEME_FP8_E4M3, KVS_SCHEME_FP16};
    blk_make(b, 2, 1, 16, 16, KVS_DTYPE_FP32, 1, 1, 1, 1, s2);
    CU_ASSERT_EQUAL(b->size, 48 + 2 * 400 + 2 * 544);
}

static void test_hostile_header(void)
{
    blk b;
    small_block(&b);
    unsigned char *t = malloc(b.size);
    struct {
        size_t off, width;
        uint64_t value;
        const char *why;
    } cases[] = {
        {0, 4, 0x3142564Cu, "magic"},
        {4, 1, 0, "version"},
        {4, 1, 1, "version"}, /* format v1 (its tile sizes differ) */
        {4, 1, 3, "version"},
        {5, 1, 0x04, "flags"},
        {5, 1, 0x81, "flags"},
        {5, 1, 0x00, "sinks"}, /* non-root with sinks */
        {6, 1, 0, "src_dtype"},
        {6, 1, 4, "src_dtype"},
        {7, 1, 1, "reserved"},
        {8, 2, 0, "num_layers"},
        {8, 2, 1025, "num_layers"},
        {8, 2, 3, "scheme table"}, /* padding as a layer */
        {8, 2, 1, "padding"},
        /* layer 1 read as padding */ {10, 2, 0, "num_kv_heads"},
        {10, 2, 257, "num_kv_heads"},
        {10, 2, 2, "total_bytes"},
        {12, 2, 0, "head_dim"},
        {12, 2, 1025, "head_dim"},
        {12, 2, 8, "total_bytes"},
        {14, 2, 15, "block_tokens"},
        {14, 2, 1025, "block_tokens"},
        {14, 2, 32, "total_bytes"},
        {16, 1, 17, "k_outliers"},
        {16, 1, 2, "total_bytes"},
        {17, 1, 17, "v_outliers"},
        {17, 1, 0, "total_bytes"},
        {18, 1, 65, "sinks"},
        {18, 1, 17, "sinks"},
        {18, 1, 2, "total_bytes"},
        {19, 1, 1, "reserved"},
        {20, 4, 1, "reserved"},
        {24, 8, 2032 + 16, "total_bytes"},
        {24, 8, 2032 - 16, "total_bytes"},
        {24, 8, UINT64_MAX, "total_bytes"},
        {40, 1, 0, "scheme table"},
        {40, 1, 5, "scheme table"},
        {41, 1, 4, "total_bytes"},
        {42, 1, 1, "padding"},
        {47, 1, 0x80, "padding"},
    };
    unsigned bad = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (int seal = 0; seal < 2; seal++) {
            memcpy(t, b.bytes, b.size);
            if (cases[i].width == 1)
                t[cases[i].off] = (unsigned char)cases[i].value;
            else if (cases[i].width == 2)
                wr16(t + cases[i].off, (uint16_t)cases[i].value);
            else if (cases[i].width == 4)
                wr32(t + cases[i].off, (uint32_t)cases[i].value);
            else
                wr64(t + cases[i].off, cases[i].value);
            /* Sealed: the field check itself must fire. Unsealed: the field check
             * or the checksum. */
            if (seal)
                reseal_hdr(t);
            if (!rejected(t, b.size, seal ? cases[i].why : NULL) && bad++ < MAX_REPORT)
                printf("\n  header case %zu (%s, sealed %d) accepted", i, cases[i].why, seal);
        }
    }
    memcpy(t, b.bytes, b.size);
    t[33] ^= 1;
    CU_ASSERT(rejected(t, b.size, "checksum"));
    CU_ASSERT(rejected(NULL, 0, NULL));
    CU_ASSERT_EQUAL(bad, 0);
    free(t);
    blk_free(&b);
}

static void test_truncation(void)
{
    blk b;
    small_block(&b);
    unsigned bad = 0;
    for (size_t len = 0; len < b.size; len++) {
        if (kvs_block_check(b.bytes, len, NULL, NULL) != KVS_EFORMAT && bad++ < MAX_REPORT)
            printf("\n  truncated to %zu accepted", len);
        const void *t;
        size_t tl;
        int rc = kvs_block_tile(b.bytes, len, 1, KVS_TILE_V, 0, &t, &tl, NULL);
        if (rc == 0 && (const unsigned char *)t + tl > b.bytes + len && bad++ < MAX_REPORT)
            printf("\n  truncated to %zu: tile past the end", len);
    }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(kvs_block_check(b.bytes, b.size + 64, NULL, NULL), 0); /* trailing bytes */
    blk_free(&b);
}

/* Every single-bit flip: caught by the block header checksum (header, table),
 * the tile checksums (tile headers and payloads) or the tile-vs-block
 * comparison. None is left harmless now that tile checksums cover the tile
 * header (the STATIC flag bit used to pass). */
static void test_bit_flips(void)
{
    blk b;
    small_block(&b);
    unsigned char *t = malloc(b.size);
    int *allowed = calloc(b.size * 8, sizeof(int));
    for (uint32_t l = 0; l < 2; l++)
        for (int kind = 0; kind < 2; kind++) {
            size_t len, off = tile_off(&b.p, l, kind, 0, &len);
            allowed[(off + 7) * 8] = 1;
        }
    float y0[16 * 16], y1[16 * 16];
    unsigned bad = 0, harmless = 0;
    for (size_t byte = 0; byte < b.size; byte++)
        for (int bit = 0; bit < 8; bit++) {
            memcpy(t, b.bytes, b.size);
            t[byte] ^= (unsigned char)(1u << bit);
            if (kvs_block_check(t, b.size, NULL, NULL) == KVS_EFORMAT)
                continue;
            if (!allowed[byte * 8 + bit]) {
                if (bad++ < MAX_REPORT)
                    printf("\n  flip of byte %zu bit %d accepted", byte, bit);
                continue;
            }
            for (uint32_t l = 0; l < 2; l++) {
                CU_ASSERT_EQUAL(
                    kvs_block_decode_layer(t, b.size, l, KVS_DTYPE_FP32, y0, y1, NULL, NULL), 0);
                float z0[16 * 16], z1[16 * 16];
                CU_ASSERT_EQUAL(
                    kvs_block_decode_layer(b.bytes, b.size, l, KVS_DTYPE_FP32, z0, z1, NULL, NULL),
                    0);
                CU_ASSERT_EQUAL(memcmp(y0, z0, sizeof z0), 0);
                CU_ASSERT_EQUAL(memcmp(y1, z1, sizeof z1), 0);
            }
            harmless++;
        }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(harmless, 0);
    free(allowed);
    free(t);
    blk_free(&b);
}

/* Tiles that are valid on their own, sealed, inside a sealed block, but say
 * something else than the block does. */
static void test_tile_disagrees(void)
{
    blk b;
    small_block(&b);
    unsigned char *t = malloc(b.size);
    char err[KVS_ERR_LEN];
    size_t klen, k0 = tile_off(&b.p, 0, KVS_TILE_K, 0, &klen);
    size_t vlen, v0 = tile_off(&b.p, 0, KVS_TILE_V, 0, &vlen);
    size_t flen, f0 = tile_off(&b.p, 1, KVS_TILE_K, 0, &flen);
    CU_ASSERT_EQUAL(klen, vlen); /* T = D and k_K = k_V: K and V tiles have one size */

    /* scheme: E5M2 where the table says E4M3 */
    memcpy(t, b.bytes, b.size);
    t[k0 + 5] = KVS_SCHEME_FP8_E5M2;
    CU_ASSERT_EQUAL(kvs_block_seal(t, b.size, err), 0);
    CU_ASSERT(rejected(t, b.size, "disagrees"));
    /* kind: the V tile where the K tile belongs, and the other way round */
    memcpy(t, b.bytes, b.size);
    memcpy(t + k0, b.bytes + v0, klen);
    memcpy(t + v0, b.bytes + k0, klen);
    CU_ASSERT_EQUAL(kvs_block_check(t, b.size, NULL, NULL), KVS_EFORMAT);
    CU_ASSERT(rejected(t, b.size, "disagrees"));
    /* T and D: an fp16 tile of 8 x 32 (same 512 payload bytes) */
    float x[8 * 32] = {1.0f, 2.0f};
    kvs_tile_params fp = {KVS_SCHEME_FP16, KVS_TILE_K, 8, 32, 0, 0, NULL, 0.0f, 0};
    CU_ASSERT_EQUAL_FATAL(kvs_tile_size(&fp), flen);
    memcpy(t, b.bytes, b.size);
    CU_ASSERT_EQUAL(kvs_tile_quantize_ref(&fp, x, KVS_DTYPE_FP32, 32, t + f0, flen, NULL), 0);
    CU_ASSERT(rejected(t, b.size, "disagrees"));
    /* a corrupted payload in the last tile */
    memcpy(t, b.bytes, b.size);
    t[b.size - 1] ^= 0x40;
    CU_ASSERT(rejected(t, b.size, "layer 1 V head 0: tile: checksum mismatch"));
    /* a forged outlier index that the tile check refuses */
    memcpy(t, b.bytes, b.size);
    t[k0 + 32 + 256 + 32] = 0; /* channel 0's slot (8-bit index): token 0 is a sink */
    CU_ASSERT_EQUAL(kvs_block_seal(t, b.size, err), 0);
    CU_ASSERT(rejected(t, b.size, "outlier"));
    free(t);
    blk_free(&b);
    /* k and S: at D = 8, T = 16 a K tile with k = 0, S = 3 has the size of
     * k = 1, S = 1 (16 scale bytes, 24 outlier bytes padded to 32, 16 per
     * sink row) */
    const kvs_scheme s1[1] = {KVS_SCHEME_FP8_E4M3};
    blk_make(&b, 1, 1, 8, 16, KVS_DTYPE_FP32, 1, 1, 1, 1, s1);
    t = malloc(b.size);
    k0 = tile_off(&b.p, 0, KVS_TILE_K, 0, &klen);
    float kx[16 * 8];
    for (int i = 0; i < 128; i++)
        kx[i] = (float)i;
    kvs_tile_params kp = {KVS_SCHEME_FP8_E4M3, KVS_TILE_K, 16, 8, 0, 3, NULL, 0.0f, 0};
    CU_ASSERT_EQUAL_FATAL(kvs_tile_size(&kp), klen);
    memcpy(t, b.bytes, b.size);
    CU_ASSERT_EQUAL(kvs_tile_quantize_ref(&kp, kx, KVS_DTYPE_FP32, 8, t + k0, klen, NULL), 0);
    CU_ASSERT(rejected(t, b.size, "disagrees"));
    free(t);
    blk_free(&b);
}

static void test_seal(void)
{
    blk b;
    small_block(&b);
    unsigned char *t = malloc(b.size);
    memcpy(t, b.bytes, b.size);
    memset(t + 32, 0, 8);
    for (uint32_t l = 0; l < 2; l++)
        for (int kind = 0; kind < 2; kind++) {
            size_t len, off = tile_off(&b.p, l, kind, 0, &len);
            memset(t + off + 24, 0, 8); /* as a device writes them */
        }
    CU_ASSERT_EQUAL(kvs_block_check(t, b.size, NULL, NULL), KVS_EFORMAT);
    CU_ASSERT_EQUAL(kvs_block_seal(t, b.size - 1, NULL), KVS_EFORMAT);
    CU_ASSERT_EQUAL(kvs_block_seal(t, b.size, NULL), 0);
    CU_ASSERT_EQUAL(memcmp(t, b.bytes, b.size), 0);
    t[8] = 0; /* no layers: nothing to seal */
    CU_ASSERT_EQUAL(kvs_block_seal(t, b.size, NULL), KVS_EFORMAT);
    free(t);
    blk_free(&b);
}

int main(void)
{
    static const kvs_test_case encode[] = {
        {"layout, header and tiles", test_layout},
        {"round trips: shapes, skip layers, root/non-root", test_roundtrip},
        {"1016..1024 layers: the whole scheme table checksummed", test_max_layers},
        {"caller's tile quantizer", test_quantize_fn},
        {"decode while the block arrives", test_streaming},
        {"parameters", test_params},
        {NULL, NULL},
    };
    static const kvs_test_case egress[] = {
        {"per-tensor FP8: scale, codes, error bound", test_requant},
        {"per-tensor FP8: Inf, NaN, zero scale", test_requant_nonfinite},
        {NULL, NULL},
    };
    static const kvs_test_case hostile[] = {
        {"every header field", test_hostile_header},
        {"truncation at every length", test_truncation},
        {"every single-bit flip", test_bit_flips},
        {"tiles that disagree with the block", test_tile_disagrees},
        {"seal", test_seal},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {
        {"block encode and decode", NULL, NULL, encode},
        {"block egress", NULL, NULL, egress},
        {"block hostile input", NULL, NULL, hostile},
        {NULL, NULL, NULL, NULL},
    };
    return kvs_test_run(suites);
}
