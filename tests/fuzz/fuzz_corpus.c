/*
 * fuzz_corpus.c — seed corpus and regression inputs for the fuzz targets,
 * made by the encoder at test time (kvs_fuzz_seeds writes them as files; the
 * replay driver calls kvs_fuzz_regression directly).
 *
 * Seeds cover every scheme and kind, small shapes (the fuzzer mutates small
 * inputs faster), outliers and sinks, static scales, and non-finite values;
 * block seeds mix per-layer schemes, root and non-root. Every input is
 * prefixed with the mode byte of fuzz_target.h. Everything is deterministic
 * (a fixed-seed generator), so a corpus is the same on every machine.
 */
#include "fuzz_target.h"
#include "kv_block.h"
#include "kvq.h"
#include "kvq_math.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

static uint64_t g_state;
static uint32_t next(void)
{
    return kvs_fuzz_next(&g_state);
}

/* Mostly small values, some large, a few ±Inf/NaN/±0. */
static float value(void)
{
    uint32_t r = next();
    switch (r % 64) {
    case 0:
        return INFINITY;
    case 1:
        return -INFINITY;
    case 2:
        return NAN;
    case 3:
        return -0.0f;
    case 4:
        return 3000.0f;
    default:
        return ((float)(int32_t)(next() % 2001u) - 1000.0f) / 250.0f;
    }
}

static void fill(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = value();
}

/* One tile with mode byte into buf; 0 when it does not fit. The quantizer
 * stores fp32 scales in place, so it writes into aligned scratch, not buf + 1. */
static size_t make_tile(const kvs_tile_params *p, unsigned mode, uint8_t *buf, size_t cap)
{
    static float x[64 * 64];
    static uint64_t scratch[KVS_FUZZ_MAX_INPUT / 8];
    size_t n = kvs_tile_size(p);
    if ((size_t)p->tokens * p->dim > sizeof x / sizeof x[0] || n + 1 > cap || n > sizeof scratch)
        return 0;
    fill(x, (size_t)p->tokens * p->dim);
    if (kvs_tile_quantize_ref(p, x, KVS_DTYPE_FP32, p->dim, scratch, n, NULL) != 0)
        return 0;
    buf[0] = (uint8_t)mode;
    memcpy(buf + 1, scratch, n);
    return n + 1;
}

/* (T, D). The last four sit at the outlier index width's edge: a group span
 * (T for K, D for V) of exactly 256 (3-byte entries, index 0xFF a real token
 * or channel, not an empty slot; with D = 256 a V sink row's empty 0xFF is
 * channel 255 too) and of 257 (4-byte entries). */
static const uint32_t k_shapes[][2] = {{1, 1},   {3, 5},   {16, 8},  {7, 16},
                                       {256, 1}, {257, 1}, {2, 256}, {2, 257}};
#define N_SHAPES (sizeof k_shapes / sizeof k_shapes[0])

/* Seed i of the tile corpus: scheme x kind x shape x (k, S) x static. */
static size_t tile_seed(unsigned i, uint8_t *buf, size_t cap)
{
    /* One static scale per group: up to G = T = 257 for the widest V shape. */
    static const float pattern[8] = {0.5f, 0.0f, 1.0f, 2.0f, 0.25f, 8.0f, 0.125f, 1.5f};
    static float scales[KVS_TILE_MAX_TOKENS];
    for (size_t j = 0; j < KVS_TILE_MAX_TOKENS; j++)
        scales[j] = pattern[j % 8];
    unsigned idx = i;
    const unsigned per_scheme = 2 * N_SHAPES * 2 * 2;
    if (idx >= 4 * per_scheme)
        return 0;
    kvs_tile_params p;
    memset(&p, 0, sizeof p);
    p.scheme = (kvs_scheme)(1 + idx / per_scheme);
    idx %= per_scheme;
    p.kind = (kvs_tile_kind)(idx % 2);
    idx /= 2;
    p.tokens = k_shapes[idx % N_SHAPES][0];
    p.dim = k_shapes[idx % N_SHAPES][1];
    idx /= N_SHAPES;
    int with_extras = idx % 2, with_static = idx / 2;
    if (p.scheme != KVS_SCHEME_FP16 && with_extras) {
        p.outliers = 2;
        p.sinks = p.tokens > 1 ? 1 : 0;
    }
    if (with_static) /* fp16 tiles take them too: only the flag shows */
        p.static_scales = scales;
    g_state = 0x9E3779B97F4A7C15ull ^ i;
    return make_tile(&p, i & 1u ? KVS_FUZZ_MODE_SEAL : 0, buf, cap);
}

typedef struct block_cfg {
    uint32_t L, H, D, T;
    int root;
    uint32_t kk, kv, S;
    kvs_scheme s[3];
} block_cfg;

static const block_cfg k_blocks[] = {
    {1, 1, 4, 16, 0, 1, 1, 0, {KVS_SCHEME_INT8}},
    {2, 2, 8, 16, 1, 1, 2, 2, {KVS_SCHEME_FP8_E4M3, KVS_SCHEME_FP16}},
    {3, 1, 16, 16, 1, 0, 3, 1, {KVS_SCHEME_FP8_E5M2, KVS_SCHEME_INT8, KVS_SCHEME_FP16}},
    {1, 1, 1, 16, 0, 0, 0, 0, {KVS_SCHEME_FP16}},
    {2, 1, 4, 32, 1, 16, 16, 16, {KVS_SCHEME_INT8, KVS_SCHEME_FP8_E4M3}},
    {1, 3, 2, 16, 1, 2, 2, 3, {KVS_SCHEME_FP8_E4M3}},
    /* K tiles at the outlier index width's edge: a span of T = 256 (3-byte
     * entries) and 257 (4-byte) */
    {1, 1, 1, 256, 1, 3, 2, 1, {KVS_SCHEME_INT8}},
    {2, 1, 2, 257, 0, 3, 2, 0, {KVS_SCHEME_FP8_E4M3, KVS_SCHEME_INT8}},
};
#define N_BLOCKS (sizeof k_blocks / sizeof k_blocks[0])

static int g_key_offsets; /* make_block's blocks carry key offsets (KVS_BLOCK_F_KOFF) */

static size_t make_block(const block_cfg *c, kvs_dtype dt, unsigned mode, uint64_t seed,
                         uint8_t *buf, size_t cap)
{
    static float x[2][3][16 * 3 * 16];
    static uint16_t h[2][3][16 * 3 * 16];
    const void *ks[3] = {NULL, NULL, NULL}, *vs[3] = {NULL, NULL, NULL};
    kvs_block_params p = {c->L,  c->H, c->D, c->T, dt,   c->root, c->kk,
                          c->kv, c->S, c->s, NULL, NULL, g_key_offsets};
    size_t n = (size_t)c->T * c->H * c->D;
    size_t size = kvs_block_size(&p);
    if (size == 0 || size + 1 > cap || n > sizeof x[0][0] / sizeof x[0][0][0])
        return 0;
    g_state = seed;
    for (uint32_t l = 0; l < c->L; l++)
        for (int kind = 0; kind < 2; kind++) {
            fill(x[kind][l], n);
            for (size_t i = 0; i < n; i++) /* the same values as fp16 or bf16 bits */
                h[kind][l][i] = dt == KVS_DTYPE_FP16 ? kvq_f32_to_fp16(x[kind][l][i])
                                                     : kvq_f32_to_bf16(x[kind][l][i]);
            const void *src =
                dt == KVS_DTYPE_FP32 ? (const void *)x[kind][l] : (const void *)h[kind][l];
            (kind ? vs : ks)[l] = src;
        }
    /* The block must start 8-byte aligned: encode into an aligned scratch. */
    static uint64_t scratch[KVS_FUZZ_MAX_INPUT / 8];
    if (size > sizeof scratch ||
        kvs_block_encode(&p, ks, vs, NULL, scratch, sizeof scratch, NULL) != 0)
        return 0;
    buf[0] = (uint8_t)mode;
    memcpy(buf + 1, scratch, size);
    return size + 1;
}

static size_t block_seed(unsigned i, uint8_t *buf, size_t cap)
{
    if (i >= N_BLOCKS * 3)
        return 0;
    return make_block(&k_blocks[i % N_BLOCKS], (kvs_dtype)(1 + i / N_BLOCKS),
                      (i & 1u) ? KVS_FUZZ_MODE_SEAL : 0, 0xB10Cull + i, buf, cap);
}

size_t kvs_fuzz_seed(kvs_fuzz_kind kind, unsigned i, uint8_t *buf, size_t cap)
{
    return kind == KVS_FUZZ_TILE ? tile_seed(i, buf, cap) : block_seed(i, buf, cap);
}

/* ---- regressions ---------------------------------------------------------------- */

static void put16(uint8_t *p, uint16_t v)
{
    memcpy(p, &v, 2);
}
static void put32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, 4);
}
static void put64(uint8_t *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

/* Tile regressions: forged outlier indices (sealed, so the checksum passes),
 * headers that promise more than the bytes hold, extreme dimensions. */
static size_t tile_regression(unsigned i, uint8_t *buf, size_t cap)
{
    kvs_tile_params k = {KVS_SCHEME_FP8_E4M3, KVS_TILE_K, 4, 2, 1, 1, NULL, 0.0f, 0};
    kvs_tile_params v = {KVS_SCHEME_INT8, KVS_TILE_V, 3, 4, 2, 1, NULL, 0.0f, 0};
    size_t n;
    g_state = 0x5EED0000ull + i;
    switch (i) {
    case 0: /* K outlier index = T */
        n = make_tile(&k, KVS_FUZZ_MODE_SEAL, buf, cap);
        put16(buf + 1 + 32 + 32, 4);
        return n;
    case 1: /* K outlier in a sink row */
        n = make_tile(&k, KVS_FUZZ_MODE_SEAL, buf, cap);
        put16(buf + 1 + 32 + 32, 0);
        return n;
    case 2: /* V outlier in the sink row */
        n = make_tile(&v, KVS_FUZZ_MODE_SEAL, buf, cap);
        put16(buf + 1 + 32 + 32, 1);
        return n;
    case 3: /* V outlier index 0xFE (3-byte entries: row 1's first slot, at 32 + 2 * 3) */
        n = make_tile(&v, KVS_FUZZ_MODE_SEAL, buf, cap);
        buf[1 + 32 + 32 + 6] = 0xFE;
        return n;
    case 4: /* T = D = 1024, k = 16, S = 64 in a 33-byte input */
        n = make_tile(&k, KVS_FUZZ_MODE_SEAL, buf, cap);
        put16(buf + 1 + 8, 1024), put16(buf + 1 + 10, 1024);
        buf[1 + 12] = 16, buf[1 + 13] = 64;
        return 33;
    case 5: /* payload_bytes near 2^32 */
        n = make_tile(&k, 0, buf, cap);
        put32(buf + 1 + 16, 0xFFFFFFF0u);
        return n;
    case 6: /* a header alone */
        n = make_tile(&v, KVS_FUZZ_MODE_SEAL, buf, cap);
        return 33;
    case 7: { /* T = 1, S = 1: every row is a sink, K groups are empty */
        kvs_tile_params s = {KVS_SCHEME_FP8_E5M2, KVS_TILE_K, 1, 3, 2, 1, NULL, 0.0f, 0};
        return make_tile(&s, 0, buf, cap);
    }
    case 8: { /* fp16 scale fields (at payload 16) forged to NaN, -Inf, negative subnormal */
        n = make_tile(&v, KVS_FUZZ_MODE_SEAL, buf, cap);
        put16(buf + 1 + 32 + 16, 0x7E01u);
        put16(buf + 1 + 32 + 18, 0xFC00u);
        put16(buf + 1 + 32 + 20, 0x8001u);
        return n;
    }
    case 9: /* key offsets (KVS_TILE_F_KOFF): a valid tile, offsets at payload 48 */
    case 10: { /* ... one forged to NaN, one to -Inf, sealed */
        kvs_tile_params ko = k;
        ko.key_offsets = 1;
        n = make_tile(&ko, KVS_FUZZ_MODE_SEAL, buf, cap);
        if (i == 10)
            put16(buf + 1 + 32 + 48, 0x7E01u), put16(buf + 1 + 32 + 50, 0xFC00u);
        return n;
    }
    case 11: { /* the key offsets flag on a V tile */
        n = make_tile(&v, KVS_FUZZ_MODE_SEAL, buf, cap);
        buf[1 + 7] |= KVS_TILE_F_KOFF;
        return n;
    }
    default:
        return 0;
    }
}

/* Block regressions: huge sizes in a small header, tiles that disagree with
 * the block, a layer table that runs past the input. */
static size_t block_regression(unsigned i, uint8_t *buf, size_t cap)
{
    size_t n;
    switch (i) {
    case 0: /* total_bytes near 2^64 */
        n = make_block(&k_blocks[1], KVS_DTYPE_FP32, 0, 1, buf, cap);
        put64(buf + 1 + 24, UINT64_MAX - 7);
        return n;
    case 1: /* the largest header: 1024 layers x 256 heads x 1024 x 1024, no bytes */
        n = make_block(&k_blocks[0], KVS_DTYPE_FP32, KVS_FUZZ_MODE_SEAL, 2, buf, cap);
        put16(buf + 1 + 8, 1024), put16(buf + 1 + 10, 256), put16(buf + 1 + 12, 1024);
        put16(buf + 1 + 14, 1024);
        return 41;
    case 2: /* E5M2 tile in an E4M3 layer, everything sealed */
        n = make_block(&k_blocks[1], KVS_DTYPE_FP32, KVS_FUZZ_MODE_SEAL, 3, buf, cap);
        buf[1 + 40 + 16 + 5] = KVS_SCHEME_FP8_E5M2;
        return n;
    case 3: /* last byte missing */
        n = make_block(&k_blocks[2], KVS_DTYPE_BF16, 0, 4, buf, cap);
        return n - 1;
    case 4: /* non-root block that claims sinks */
        n = make_block(&k_blocks[4], KVS_DTYPE_FP16, KVS_FUZZ_MODE_SEAL, 5, buf, cap);
        buf[1 + 5] = 0;
        return n;
    case 5: /* key offsets: a valid block (an fp8 and an fp16 layer) */
    case 6: /* ... its header's flag cleared, resealed: the sizes no longer add up */
        g_key_offsets = 1;
        n = make_block(&k_blocks[1], KVS_DTYPE_FP16, KVS_FUZZ_MODE_SEAL, 6, buf, cap);
        g_key_offsets = 0;
        if (i == 6)
            buf[1 + 5] &= (uint8_t)~KVS_BLOCK_F_KOFF;
        return n;
    default:
        return 0;
    }
}

unsigned kvs_fuzz_regression_count(kvs_fuzz_kind kind)
{
    return kind == KVS_FUZZ_TILE ? 9 : 5;
}

int kvs_fuzz_regression_valid(kvs_fuzz_kind kind, unsigned i)
{
    return kind == KVS_FUZZ_TILE && i == 7; /* T = 1, S = 1 is a tile like any other */
}

size_t kvs_fuzz_regression(kvs_fuzz_kind kind, unsigned i, uint8_t *buf, size_t cap)
{
    return kind == KVS_FUZZ_TILE ? tile_regression(i, buf, cap) : block_regression(i, buf, cap);
}
