/*
 * kv_block.c — KV blocks (kv_block.h): geometry, encode, validation, tile
 * lookup, layer decode, sealing, and egress requantization to per-tensor FP8.
 *
 * The idea: a block's layout is a pure function of its header and scheme
 * table, so everything here starts by parsing those (parse_header) into a
 * geometry (struct geom) and then computes offsets; no tile byte is needed to
 * find another tile. Two tile sizes per 8-bit layer (K, V: they differ in their
 * group count and k) and one per fp16 layer; the offset of layer l is the
 * header, the padded table and the sum of the sizes of layers 0..l-1, an O(l)
 * walk over the table bytes (at most 1024), done on every call rather than
 * cached so that the functions can take plain bytes and keep no state.
 *
 * Invariants:
 *   - after parse_header returns 0, every field of geom is within the format's
 *     bounds and geom.total (<= 2^40) equals the header's total_bytes, so offset
 *     arithmetic in uint64_t cannot overflow;
 *   - no function reads block bytes outside [blk, blk + len): every pointer into
 *     the block is formed only after its end was compared with len;
 *   - tile bytes are always handed to the tile functions with their exact size
 *     from the block's layout, so a tile cannot claim its neighbour's bytes;
 *   - multi-tile outputs (decode, requant) are written only after every tile
 *     involved passed validation.
 */
#include "kv_block.h"

#include "kvq_math.h"
#include "kvs_error.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#define HDR_BYTES ((uint32_t)sizeof(kvs_block_hdr))

static int scheme_ok(unsigned s)
{
    return s >= KVS_SCHEME_FP16 && s <= KVS_SCHEME_INT8;
}
static int dtype_ok(unsigned d)
{
    return d >= KVS_DTYPE_FP16 && d <= KVS_DTYPE_FP32;
}
static size_t dtype_size(kvs_dtype d)
{
    return d == KVS_DTYPE_FP32 ? 4u : 2u;
}
static char kind_char(unsigned kind)
{
    return kind == KVS_TILE_K ? 'K' : 'V';
}

/* ---- geometry ---------------------------------------------------------------- */

typedef struct geom {
    uint32_t L, H, D, T, kk, kv, S;
    unsigned koff;  /* KVS_BLOCK_F_KOFF: K tiles of 8-bit layers carry key offsets */
    uint32_t table; /* bytes of the padded scheme table */
    uint64_t total; /* bytes of the whole block */
} geom;

/* Bounds shared by parameters and headers; returns a message naming the field
 * or NULL. */
static const char *bounds_problem(uint32_t L, uint32_t H, uint32_t D, uint32_t T, unsigned dtype,
                                  int root, uint32_t kk, uint32_t kv, uint32_t S)
{
    if (L < 1 || L > KVS_BLOCK_MAX_LAYERS)
        return "num_layers: must be 1..1024";
    if (H < 1 || H > KVS_BLOCK_MAX_HEADS)
        return "num_kv_heads: must be 1..256";
    if (D < 1 || D > KVS_TILE_MAX_DIM)
        return "head_dim: must be 1..1024";
    if (T < KVS_BLOCK_MIN_TOKENS || T > KVS_BLOCK_MAX_TOKENS)
        return "block_tokens: must be 16..1024";
    if (!dtype_ok(dtype))
        return "src_dtype: must be 1 (fp16), 2 (bf16) or 3 (fp32)";
    if (kk > KVS_TILE_MAX_OUTLIERS)
        return "k_outliers: must be 0..16";
    if (kv > KVS_TILE_MAX_OUTLIERS)
        return "v_outliers: must be 0..16";
    if (S > KVS_TILE_MAX_SINKS || S > T)
        return "sinks: must be 0..min(block_tokens, 64)";
    if (!root && S != 0)
        return "sinks: must be 0 in a non-root block";
    return NULL;
}

/* Size of one tile of layer scheme s and kind, per the block's k and S. */
static uint64_t tile_size(const geom *g, unsigned s, unsigned kind)
{
    if (s == KVS_SCHEME_FP16)
        return kvs_tile_bytes(s, kind, g->T, g->D, 0, 0);
    return kvs_tile_bytes_ex(s, kind, g->T, g->D, kind == KVS_TILE_K ? g->kk : g->kv, g->S,
                             g->koff && kind == KVS_TILE_K);
}

static uint64_t layer_size(const geom *g, unsigned s)
{
    return (uint64_t)g->H * (tile_size(g, s, KVS_TILE_K) + tile_size(g, s, KVS_TILE_V));
}

/* Offset of layer l (l <= L: l = L gives the total) from the table bytes. */
static uint64_t layer_offset(const geom *g, const uint8_t *table, uint32_t l)
{
    uint64_t off = (uint64_t)HDR_BYTES + g->table;
    for (uint32_t j = 0; j < l; j++)
        off += layer_size(g, table[j]);
    return off;
}

/* Offset of tile (kind, head) from the start of its layer. */
static uint64_t tile_in_layer(const geom *g, unsigned s, unsigned kind, uint32_t head)
{
    uint64_t ks = tile_size(g, s, KVS_TILE_K);
    if (kind == KVS_TILE_K)
        return (uint64_t)head * ks;
    return (uint64_t)g->H * ks + (uint64_t)head * tile_size(g, s, KVS_TILE_V);
}

static uint64_t header_checksum(const kvs_block_hdr *h, const uint8_t *table, uint32_t table_bytes)
{
    /* Streamed, not copied into a fixed buffer: the padded table of a
     * 1024-layer block is 1032 bytes, more than KVS_BLOCK_MAX_LAYERS. */
    kvs_block_hdr z = *h;
    z.checksum = 0;
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, &z, sizeof z);
    XXH3_64bits_update(&st, table, table_bytes);
    return XXH3_64bits_digest(&st);
}

/* Parses and validates the header and table of untrusted bytes. With
 * verify_checksum 0 (lookups, sealing) the checksum is not compared. */
static int parse_header(const void *blk, size_t len, int verify_checksum, geom *g,
                        kvs_block_hdr *out, char *err)
{
    kvs_block_hdr h;
    if (blk == NULL || len < HDR_BYTES)
        return kvs_fail(err, KVS_EFORMAT, "block: %zu bytes, shorter than its 40-byte header", len);
    memcpy(&h, blk, sizeof h);
    if (h.magic != KVS_BLOCK_MAGIC)
        return kvs_fail(err, KVS_EFORMAT, "block: bad magic 0x%08x", (unsigned)h.magic);
    if (h.version != KVS_FORMAT_VERSION)
        return kvs_fail(err, KVS_EFORMAT, "block: unsupported version %u", (unsigned)h.version);
    if (h.flags & ~KVS_BLOCK_F_KNOWN)
        return kvs_fail(err, KVS_EFORMAT, "block: unknown flags 0x%02x", (unsigned)h.flags);
    if (h.reserved0 || h.reserved1 || h.reserved2)
        return kvs_fail(err, KVS_EFORMAT, "block: reserved fields not zero");
    const char *why =
        bounds_problem(h.num_layers, h.num_kv_heads, h.head_dim, h.block_tokens, h.src_dtype,
                       h.flags & KVS_BLOCK_F_ROOT, h.k_outliers, h.v_outliers, h.sinks);
    if (why)
        return kvs_fail(err, KVS_EFORMAT, "block: %s", why);
    g->L = h.num_layers;
    g->H = h.num_kv_heads;
    g->D = h.head_dim;
    g->T = h.block_tokens;
    g->kk = h.k_outliers;
    g->kv = h.v_outliers;
    g->S = h.sinks;
    g->koff = (h.flags & KVS_BLOCK_F_KOFF) != 0;
    g->table = kvs_align16(HDR_BYTES + g->L) - HDR_BYTES; /* tiles start 16-aligned */
    if (len - HDR_BYTES < g->table)
        return kvs_fail(err, KVS_EFORMAT, "block: truncated: %zu bytes, header and table need %u", len,
                    HDR_BYTES + g->table);
    const uint8_t *table = (const uint8_t *)blk + HDR_BYTES;
    for (uint32_t l = 0; l < g->L; l++)
        if (!scheme_ok(table[l]))
            return kvs_fail(err, KVS_EFORMAT, "block: scheme table: layer %u has unknown scheme %u", l,
                        (unsigned)table[l]);
    for (uint32_t i = g->L; i < g->table; i++)
        if (table[i] != 0)
            return kvs_fail(err, KVS_EFORMAT, "block: scheme table: padding byte %u not zero", i);
    if (verify_checksum && header_checksum(&h, table, g->table) != h.checksum)
        return kvs_fail(err, KVS_EFORMAT, "block: header checksum mismatch");
    g->total = layer_offset(g, table, g->L);
    if (h.total_bytes != g->total)
        return kvs_fail(err, KVS_EFORMAT, "block: total_bytes %llu, layout needs %llu",
                    (unsigned long long)h.total_bytes, (unsigned long long)g->total);
    if (out)
        *out = h;
    return 0;
}

/* kvs_tile_check, plus: the tile's header says what the block says. */
static int check_tile(const unsigned char *tile, size_t size, const geom *g, unsigned s,
                      unsigned kind, uint32_t layer, uint32_t head, char *err)
{
    char terr[KVS_ERR_LEN];
    kvs_tile_hdr th;
    if (kvs_tile_check(tile, size, &th, terr) != 0)
        return kvs_fail(err, KVS_EFORMAT, "block: layer %u %c head %u: %s", layer, kind_char(kind),
                    head, terr);
    uint32_t k = s == KVS_SCHEME_FP16 ? 0 : kind == KVS_TILE_K ? g->kk : g->kv;
    uint32_t S = s == KVS_SCHEME_FP16 ? 0 : g->S;
    const unsigned koff = g->koff && kind == KVS_TILE_K && s != KVS_SCHEME_FP16;
    if (((th.flags & KVS_TILE_F_KOFF) != 0) != koff)
        return kvs_fail(err, KVS_EFORMAT, "block: layer %u %c head %u: key offsets %s the block's",
                        layer, kind_char(kind), head,
                        koff ? "missing, against" : "present, against");
    if (th.scheme != s || th.kind != kind || th.tokens != g->T || th.dim != g->D ||
        th.outliers != k || th.sinks != S)
        return kvs_fail(err, KVS_EFORMAT,
                    "block: layer %u %c head %u: tile header (scheme %u kind %u T %u D %u k %u "
                    "S %u) disagrees with the block (scheme %u kind %u T %u D %u k %u S %u)",
                    layer, kind_char(kind), head, (unsigned)th.scheme, (unsigned)th.kind,
                    (unsigned)th.tokens, (unsigned)th.dim, (unsigned)th.outliers,
                    (unsigned)th.sinks, s, kind, g->T, g->D, k, S);
    return 0;
}

/* A layer located in checked bytes: its scheme, offset and extent. */
typedef struct layer_loc {
    geom g;
    unsigned scheme;
    uint64_t off, bytes;
} layer_loc;

static int locate_layer(const void *blk, size_t len, uint32_t layer, int verify_checksum,
                        layer_loc *loc, char *err)
{
    int rc = parse_header(blk, len, verify_checksum, &loc->g, NULL, err);
    if (rc)
        return rc;
    if (layer >= loc->g.L)
        return kvs_fail(err, KVS_EINVAL, "layer: %u, block has %u layers", layer, loc->g.L);
    const uint8_t *table = (const uint8_t *)blk + HDR_BYTES;
    loc->scheme = table[layer];
    loc->off = layer_offset(&loc->g, table, layer);
    loc->bytes = layer_size(&loc->g, loc->scheme);
    return 0;
}

/* Offset of tile (kind, head) of a located layer from the block start. */
static uint64_t tile_offset(const layer_loc *loc, unsigned kind, uint32_t head, size_t *size)
{
    *size = (size_t)tile_size(&loc->g, loc->scheme, kind);
    return loc->off + tile_in_layer(&loc->g, loc->scheme, kind, head);
}

/* Pointer to a tile of a layer whose bytes are known to lie within the block. */
static const unsigned char *tile_at(const void *blk, const layer_loc *loc, unsigned kind,
                                    uint32_t head, size_t *size)
{
    return (const unsigned char *)blk + tile_offset(loc, kind, head, size);
}

/* Validates every tile of the given kinds (mask bit 1 << kind) of a located
 * layer whose bytes lie within the block. */
static int check_layer_tiles(const void *blk, const layer_loc *loc, uint32_t layer, unsigned kinds,
                             char *err)
{
    for (unsigned kind = KVS_TILE_K; kind <= KVS_TILE_V; kind++) {
        if (!(kinds & (1u << kind)))
            continue;
        for (uint32_t h = 0; h < loc->g.H; h++) {
            size_t size;
            const unsigned char *t = tile_at(blk, loc, kind, h, &size);
            int rc = check_tile(t, size, &loc->g, loc->scheme, kind, layer, h, err);
            if (rc)
                return rc;
        }
    }
    return 0;
}

/* Locates layer (checksum verified), requires its bytes within len, and
 * validates its tiles of the given kinds. */
static int check_layer(const void *blk, size_t len, uint32_t layer, unsigned kinds, layer_loc *loc,
                       char *err)
{
    int rc = locate_layer(blk, len, layer, 1, loc, err);
    if (rc)
        return rc;
    if (loc->off + loc->bytes > len)
        return kvs_fail(err, KVS_EFORMAT, "block: truncated: layer %u ends at byte %llu, have %zu",
                    layer, (unsigned long long)(loc->off + loc->bytes), len);
    return check_layer_tiles(blk, loc, layer, kinds, err);
}

/* ---- parameters, size, encode -------------------------------------------------- */

int kvs_block_params_check(const kvs_block_params *p, char *err)
{
    if (p == NULL)
        return kvs_fail(err, KVS_EINVAL, "block params: NULL");
    const char *why =
        bounds_problem(p->layers, p->heads, p->head_dim, p->block_tokens, (unsigned)p->src_dtype,
                       p->root, p->k_outliers, p->v_outliers, p->sinks);
    if (why)
        return kvs_fail(err, KVS_EINVAL, "block params: %s", why);
    if (p->schemes == NULL)
        return kvs_fail(err, KVS_EINVAL, "block params: schemes: NULL");
    for (uint32_t l = 0; l < p->layers; l++)
        if (!scheme_ok((unsigned)p->schemes[l]))
            return kvs_fail(err, KVS_EINVAL, "block params: schemes[%u]: unknown scheme %d", l,
                        (int)p->schemes[l]);
    for (uint32_t l = 0; l < p->layers; l++) {
        for (int kv = 0; kv < 2; kv++) {
            const float *ts = kv ? p->v_tensor_scales : p->k_tensor_scales;
            if (ts && !(isfinite(ts[l]) && ts[l] >= 0.0f))
                return kvs_fail(err, KVS_EINVAL,
                                "block params: %c_tensor_scales[%u]: %g is not finite and >= 0",
                                kv ? 'v' : 'k', l, (double)ts[l]);
        }
    }
    return 0;
}

static void geom_of_params(const kvs_block_params *p, geom *g)
{
    g->L = p->layers;
    g->H = p->heads;
    g->D = p->head_dim;
    g->T = p->block_tokens;
    g->kk = p->k_outliers;
    g->kv = p->v_outliers;
    g->S = p->sinks;
    g->koff = p->key_offsets != 0;
    g->table = kvs_align16(HDR_BYTES + g->L) - HDR_BYTES; /* tiles start 16-aligned */
    g->total = (uint64_t)HDR_BYTES + g->table;
    for (uint32_t l = 0; l < g->L; l++)
        g->total += layer_size(g, (unsigned)p->schemes[l]);
}

/* The header and padded scheme table of the block p describes, at o: fields,
 * table entries, zero padding, then the checksum over both. */
static void write_header(const kvs_block_params *p, const geom *g, unsigned char *o)
{
    uint8_t *table = o + HDR_BYTES;
    memset(table, 0, g->table);
    for (uint32_t l = 0; l < g->L; l++)
        table[l] = (uint8_t)p->schemes[l];
    kvs_block_hdr h;
    memset(&h, 0, sizeof h);
    h.magic = KVS_BLOCK_MAGIC;
    h.version = KVS_FORMAT_VERSION;
    h.flags = (uint8_t)((p->root ? KVS_BLOCK_F_ROOT : 0u) | (g->koff ? KVS_BLOCK_F_KOFF : 0u));
    h.src_dtype = (uint8_t)p->src_dtype;
    h.num_layers = (uint16_t)g->L;
    h.num_kv_heads = (uint16_t)g->H;
    h.head_dim = (uint16_t)g->D;
    h.block_tokens = (uint16_t)g->T;
    h.k_outliers = (uint8_t)g->kk;
    h.v_outliers = (uint8_t)g->kv;
    h.sinks = (uint8_t)g->S;
    h.total_bytes = g->total;
    h.checksum = header_checksum(&h, table, g->table);
    memcpy(o, &h, sizeof h);
}

void kvs_block_write_header(const kvs_block_params *p, void *out)
{
    geom g;
    geom_of_params(p, &g);
    write_header(p, &g, out);
}

size_t kvs_block_size(const kvs_block_params *p)
{
    geom g;
    if (kvs_block_params_check(p, NULL) != 0)
        return 0;
    geom_of_params(p, &g);
    return g.total > SIZE_MAX ? 0 : (size_t)g.total;
}

int kvs_block_encode(const kvs_block_params *p, const void *const *k_src, const void *const *v_src,
                     kvs_tile_quantize_fn quantize, void *out, size_t cap, char *err)
{
    int rc = kvs_block_params_check(p, err);
    if (rc)
        return rc;
    if (k_src == NULL || v_src == NULL)
        return kvs_fail(err, KVS_EINVAL, "block encode: %s: NULL", k_src ? "v_src" : "k_src");
    for (uint32_t l = 0; l < p->layers; l++)
        if (k_src[l] == NULL || v_src[l] == NULL)
            return kvs_fail(err, KVS_EINVAL, "block encode: %s[%u]: NULL", k_src[l] ? "v_src" : "k_src",
                        l);
    if (out == NULL)
        return kvs_fail(err, KVS_EINVAL, "block encode: out: NULL");
    if ((uintptr_t)out % 8u != 0)
        return kvs_fail(err, KVS_EINVAL, "block encode: out: must be 8-byte aligned");
    geom g;
    geom_of_params(p, &g);
    if (g.total > SIZE_MAX || cap < g.total)
        return kvs_fail(err, KVS_EINVAL, "block encode: out: cap %zu bytes, block needs %llu", cap,
                    (unsigned long long)g.total);
    if (quantize == NULL)
        quantize = kvs_tile_quantize_ref;

    unsigned char *o = out;
    write_header(p, &g, o);

    const size_t es = dtype_size(p->src_dtype);
    const size_t row = (size_t)g.H * g.D; /* elements per token in a [T][H][D] tensor */
    uint64_t off = (uint64_t)HDR_BYTES + g.table;
    for (uint32_t l = 0; l < g.L; l++) {
        unsigned s = (unsigned)p->schemes[l];
        for (unsigned kind = KVS_TILE_K; kind <= KVS_TILE_V; kind++) {
            const unsigned char *src = (kind == KVS_TILE_K ? k_src : v_src)[l];
            kvs_tile_params tp = {
                .scheme = (kvs_scheme)s,
                .kind = (kvs_tile_kind)kind,
                .tokens = g.T,
                .dim = g.D,
                .outliers = s == KVS_SCHEME_FP16 ? 0
                            : kind == KVS_TILE_K ? g.kk
                                                 : g.kv,
                .sinks = s == KVS_SCHEME_FP16 ? 0 : g.S,
                .static_scales = NULL,
                .tensor_scale = 0.0f,
                .key_offsets = g.koff && kind == KVS_TILE_K && s != KVS_SCHEME_FP16,
            };
            const float *tsc = kind == KVS_TILE_K ? p->k_tensor_scales : p->v_tensor_scales;
            if (tsc != NULL && s != KVS_SCHEME_FP16)
                tp.tensor_scale = tsc[l];
            uint64_t ts = tile_size(&g, s, kind);
            for (uint32_t h = 0; h < g.H; h++) {
                char terr[KVS_ERR_LEN] = "";
                rc = quantize(&tp, src + (size_t)h * g.D * es, p->src_dtype, row, o + off,
                              (size_t)ts, terr);
                if (rc)
                    return kvs_fail(err, rc, "block encode: layer %u %c head %u: %s", l,
                                kind_char(kind), h, terr);
                off += ts;
            }
        }
    }
    KVS_ASSERT(off == g.total);
    return 0;
}

/* ---- validation, lookup, decode, seal ------------------------------------------ */

int kvs_block_check_header(const void *blk, size_t len, kvs_block_hdr *hdr, char *err)
{
    geom g;
    return parse_header(blk, len, 1, &g, hdr, err);
}

int kvs_block_check(const void *blk, size_t len, kvs_block_hdr *hdr, char *err)
{
    geom g;
    kvs_block_hdr h;
    int rc = parse_header(blk, len, 1, &g, &h, err);
    if (rc)
        return rc;
    if (len < g.total)
        return kvs_fail(err, KVS_EFORMAT, "block: truncated: %zu bytes of %llu", len,
                    (unsigned long long)g.total);
    /* One pass, offsets accumulated (check_layer would re-parse per layer). */
    const uint8_t *table = (const uint8_t *)blk + HDR_BYTES;
    layer_loc loc;
    loc.g = g;
    loc.off = (uint64_t)HDR_BYTES + g.table;
    for (uint32_t l = 0; l < g.L; l++) {
        loc.scheme = table[l];
        loc.bytes = layer_size(&g, loc.scheme);
        rc = check_layer_tiles(blk, &loc, l, 3u, err);
        if (rc)
            return rc;
        loc.off += loc.bytes;
    }
    if (hdr)
        *hdr = h;
    return 0;
}

int kvs_block_layer_range(const void *blk, size_t len, uint32_t layer, uint64_t *off,
                          uint64_t *bytes, char *err)
{
    layer_loc loc;
    int rc = locate_layer(blk, len, layer, 0, &loc, err);
    if (rc)
        return rc;
    if (off)
        *off = loc.off;
    if (bytes)
        *bytes = loc.bytes;
    return 0;
}

int kvs_block_tile(const void *blk, size_t len, uint32_t layer, kvs_tile_kind kind, uint32_t head,
                   const void **tile, size_t *tile_len, char *err)
{
    if (tile == NULL || tile_len == NULL)
        return kvs_fail(err, KVS_EINVAL, "block tile: %s: NULL", tile ? "tile_len" : "tile");
    if (kind != KVS_TILE_K && kind != KVS_TILE_V)
        return kvs_fail(err, KVS_EINVAL, "kind: must be K (0) or V (1)");
    layer_loc loc;
    int rc = locate_layer(blk, len, layer, 0, &loc, err);
    if (rc)
        return rc;
    if (head >= loc.g.H)
        return kvs_fail(err, KVS_EINVAL, "head: %u, block has %u kv heads", head, loc.g.H);
    size_t size;
    uint64_t off = tile_offset(&loc, kind, head, &size); /* no pointer before the bound check */
    if (off + size > len)
        return kvs_fail(err, KVS_EFORMAT, "block: truncated: tile ends at byte %llu, have %zu",
                    (unsigned long long)(off + size), len);
    *tile = (const unsigned char *)blk + off;
    *tile_len = size;
    return 0;
}

/* Dequantizes H tiles of tile_len bytes each, back to back at run (a layer's K
 * or V tiles, already validated), head h into the [T][H][D] tensor dst at
 * &dst[0][h][0]. The one loop behind kvs_block_decode_layer and
 * kvs_block_decode_run. On failure *bad_head is the head that failed. */
static int dequantize_run(const unsigned char *run, size_t tile_len, uint32_t H, uint32_t D,
                          kvs_dtype dtype, unsigned char *dst, kvs_tile_dequantize_fn dequantize,
                          uint32_t *bad_head, char *terr)
{
    const size_t es = dtype_size(dtype);
    const size_t row = (size_t)H * D;
    for (uint32_t h = 0; h < H; h++) {
        int rc = dequantize(run + (size_t)h * tile_len, tile_len, dtype, dst + (size_t)h * D * es,
                            row, terr);
        if (rc) {
            *bad_head = h;
            return rc;
        }
    }
    return 0;
}

int kvs_block_decode_layer(const void *blk, size_t len, uint32_t layer, kvs_dtype dtype,
                           void *k_dst, void *v_dst, kvs_tile_dequantize_fn dequantize, char *err)
{
    if (!dtype_ok((unsigned)dtype))
        return kvs_fail(err, KVS_EINVAL, "dtype: must be 1 (fp16), 2 (bf16) or 3 (fp32)");
    if (k_dst == NULL && v_dst == NULL)
        return kvs_fail(err, KVS_EINVAL, "block decode: k_dst and v_dst: both NULL");
    unsigned kinds = (k_dst ? 1u << KVS_TILE_K : 0u) | (v_dst ? 1u << KVS_TILE_V : 0u);
    layer_loc loc;
    int rc = check_layer(blk, len, layer, kinds, &loc, err);
    if (rc)
        return rc;
    /* check_layer has just checked every tile in full, checksum included:
     * the dequantizer need not hash them again (kv_block.h). */
    if (dequantize == NULL)
        dequantize = kvs_tile_dequantize_verified_ref;
    for (unsigned kind = KVS_TILE_K; kind <= KVS_TILE_V; kind++) {
        unsigned char *dst = kind == KVS_TILE_K ? k_dst : v_dst;
        if (dst == NULL)
            continue;
        size_t size;
        const unsigned char *run = tile_at(blk, &loc, kind, 0, &size);
        char terr[KVS_ERR_LEN] = "";
        uint32_t h = 0;
        rc = dequantize_run(run, size, loc.g.H, loc.g.D, dtype, dst, dequantize, &h, terr);
        if (rc)
            return kvs_fail(err, rc, "block decode: layer %u %c head %u: %s", layer,
                            kind_char(kind), h, terr);
    }
    return 0;
}

/* kvs_block_decode_run and kvs_block_decode_run_verified: the same shape
 * checks; they differ in the dequantizer used when the caller gives none
 * (the reference, or its _verified twin), so in whether the tiles are hashed. */
static int decode_run(const void *run, size_t len, kvs_tile_kind kind, uint32_t heads,
                      uint32_t tokens, uint32_t dim, kvs_dtype dtype, void *dst,
                      kvs_tile_dequantize_fn dequantize, int verified, char *err)
{
    if (!dtype_ok((unsigned)dtype))
        return kvs_fail(err, KVS_EINVAL, "dtype: must be 1 (fp16), 2 (bf16) or 3 (fp32)");
    if (kind != KVS_TILE_K && kind != KVS_TILE_V)
        return kvs_fail(err, KVS_EINVAL, "kind: must be K (0) or V (1)");
    if (heads < 1 || heads > KVS_BLOCK_MAX_HEADS)
        return kvs_fail(err, KVS_EINVAL, "heads: %u, must be 1..256", heads);
    if (dst == NULL)
        return kvs_fail(err, KVS_EINVAL, "decode run: dst: NULL");
    if (run == NULL)
        return kvs_fail(err, KVS_EFORMAT, "decode run: no bytes");
    /* The shape first, from the tile headers alone: every tile of this kind,
     * T and D, with head 0's scheme, k, S and size, heads of them filling len
     * exactly. The dequantizer then checks each tile as it decodes it: in
     * full (kvs_tile_check, checksum included), one check per tile, not two;
     * or, verified, all but the checksum the caller has just verified. */
    const unsigned char *p = run;
    kvs_tile_hdr first;
    size_t tile_len = 0;
    if (len < sizeof first)
        return kvs_fail(err, KVS_EFORMAT, "decode run: %zu bytes, shorter than a tile header", len);
    for (uint32_t h = 0; h < heads; h++) {
        kvs_tile_hdr th;
        memcpy(&th, p + (size_t)h * tile_len, sizeof th); /* within len: checked at h = 0 */
        if (h == 0) {
            first = th;
            tile_len = sizeof th + (size_t)th.payload_bytes;
            if (tile_len * heads != len) /* no overflow: tile_len < 2^33, heads <= 256 */
                return kvs_fail(err, KVS_EFORMAT,
                                "decode run: %zu bytes, not %u tiles of head 0's %zu bytes", len,
                                heads, tile_len);
        }
        if (th.magic != KVS_TILE_MAGIC || th.kind != kind || th.tokens != tokens || th.dim != dim ||
            th.scheme != first.scheme || th.outliers != first.outliers || th.sinks != first.sinks ||
            th.payload_bytes != first.payload_bytes)
            return kvs_fail(err, KVS_EFORMAT,
                            "decode run: %c head %u: tile (magic 0x%08x scheme %u kind %u T %u D "
                            "%u k %u S %u) is not kind %u, T %u, D %u, with head 0's scheme %u, "
                            "k %u, S %u",
                            kind_char(kind), h, (unsigned)th.magic, (unsigned)th.scheme,
                            (unsigned)th.kind, (unsigned)th.tokens, (unsigned)th.dim,
                            (unsigned)th.outliers, (unsigned)th.sinks, (unsigned)kind, tokens, dim,
                            (unsigned)first.scheme, (unsigned)first.outliers,
                            (unsigned)first.sinks);
    }
    if (dequantize == NULL)
        dequantize = verified ? kvs_tile_dequantize_verified_ref : kvs_tile_dequantize_ref;
    char terr[KVS_ERR_LEN] = "";
    uint32_t h = 0;
    int rc = dequantize_run(p, tile_len, heads, dim, dtype, dst, dequantize, &h, terr);
    if (rc)
        return kvs_fail(err, rc, "decode run: %c head %u: %s", kind_char(kind), h, terr);
    return 0;
}

int kvs_block_decode_run(const void *run, size_t len, kvs_tile_kind kind, uint32_t heads,
                         uint32_t tokens, uint32_t dim, kvs_dtype dtype, void *dst,
                         kvs_tile_dequantize_fn dequantize, char *err)
{
    return decode_run(run, len, kind, heads, tokens, dim, dtype, dst, dequantize, 0, err);
}

int kvs_block_decode_run_verified(const void *run, size_t len, kvs_tile_kind kind, uint32_t heads,
                                  uint32_t tokens, uint32_t dim, kvs_dtype dtype, void *dst,
                                  kvs_tile_dequantize_fn dequantize, char *err)
{
    return decode_run(run, len, kind, heads, tokens, dim, dtype, dst, dequantize, 1, err);
}

int kvs_block_seal(void *blk, size_t len, char *err)
{
    geom g;
    kvs_block_hdr h;
    int rc = parse_header(blk, len, 0, &g, &h, err);
    if (rc)
        return rc;
    if (len < g.total)
        return kvs_fail(err, KVS_EFORMAT, "block: truncated: %zu bytes of %llu", len,
                    (unsigned long long)g.total);
    unsigned char *b = blk;
    const uint8_t *table = b + HDR_BYTES;
    uint64_t off = (uint64_t)HDR_BYTES + g.table;
    for (uint32_t l = 0; l < g.L; l++) {
        for (unsigned kind = KVS_TILE_K; kind <= KVS_TILE_V; kind++) {
            uint64_t ts = tile_size(&g, table[l], kind);
            for (uint32_t hd = 0; hd < g.H; hd++) {
                char terr[KVS_ERR_LEN] = "";
                if (kvs_tile_seal(b + off, (size_t)ts, terr) != 0)
                    return kvs_fail(err, KVS_EFORMAT, "block seal: layer %u %c head %u: %s", l,
                                kind_char(kind), hd, terr);
                off += ts;
            }
        }
    }
    h.checksum = header_checksum(&h, table, g.table);
    memcpy(b, &h, sizeof h);
    return 0;
}

/* ---- egress: per-tensor FP8 ----------------------------------------------------- */

/* E4M3 code of x' with the multiplier inv = kvq_scale_inv(scale). ±Inf
 * saturates to ±448 even for inv = 0, where the IEEE product would be NaN. */
static uint8_t egress_code(float x, float inv)
{
    if (isinf(x))
        return kvq_f32_to_e4m3(x);
    return kvq_fp8_quantize(x, inv, KVQ_FP8_E4M3);
}

/* Dequantizes a tile that passed kvs_tile_check (header th) to fp32 [T][D]
 * in scratch (T*D floats). Every caller has just checked the tile in full,
 * checksum included, so it is not hashed again (kvs_block_requant_fp8 decodes
 * each tile twice: once for amax, once for the codes). */
static int tile_to_f32(const void *tile, size_t len, const kvs_tile_hdr *th, float *scratch,
                       char *err)
{
    return kvs_tile_dequantize_verified_ref(tile, len, KVS_DTYPE_FP32, scratch, th->dim, err);
}

static float amax_of(const float *x, size_t n)
{
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++)
        amax = kvq_amax_update(amax, x[i]);
    return amax;
}

static void requant_rows(const float *x, uint32_t T, uint32_t D, float scale, uint8_t *dst,
                         size_t stride)
{
    const float inv = kvq_scale_inv(scale);
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t d = 0; d < D; d++)
            dst[(size_t)t * stride + d] = egress_code(x[(size_t)t * D + d], inv);
}

int kvs_tile_amax(const void *tile, size_t len, float *amax, char *err)
{
    if (amax == NULL)
        return kvs_fail(err, KVS_EINVAL, "tile amax: amax: NULL");
    kvs_tile_hdr th;
    int rc = kvs_tile_check(tile, len, &th, err);
    if (rc)
        return rc;
    const size_t n = (size_t)th.tokens * th.dim;
    float *x = malloc(n * sizeof *x);
    if (x == NULL)
        return kvs_fail(err, KVS_ENOMEM, "tile amax: %zu floats", n);
    rc = tile_to_f32(tile, len, &th, x, err);
    if (rc == 0)
        *amax = amax_of(x, n);
    free(x);
    return rc;
}

int kvs_tile_requant_fp8(const void *tile, size_t len, float scale, uint8_t *dst, size_t stride,
                         char *err)
{
    if (!(scale >= 0.0f && scale <= FLT_MAX)) /* NaN fails both */
        return kvs_fail(err, KVS_EINVAL, "scale: must be finite and >= 0");
    if (dst == NULL)
        return kvs_fail(err, KVS_EINVAL, "tile requant: dst: NULL");
    kvs_tile_hdr th;
    int rc = kvs_tile_check(tile, len, &th, err);
    if (rc)
        return rc;
    if (stride < th.dim)
        return kvs_fail(err, KVS_EINVAL, "stride: %zu, less than the tile's dim %u", stride,
                    (unsigned)th.dim);
    const size_t n = (size_t)th.tokens * th.dim;
    float *x = malloc(n * sizeof *x);
    if (x == NULL)
        return kvs_fail(err, KVS_ENOMEM, "tile requant: %zu floats", n);
    rc = tile_to_f32(tile, len, &th, x, err);
    if (rc == 0)
        requant_rows(x, th.tokens, th.dim, scale, dst, stride);
    free(x);
    return rc;
}

int kvs_block_requant_fp8(const void *blk, size_t len, uint32_t layer, kvs_tile_kind kind,
                          uint8_t *dst, float *scale, char *err)
{
    if (kind != KVS_TILE_K && kind != KVS_TILE_V)
        return kvs_fail(err, KVS_EINVAL, "kind: must be K (0) or V (1)");
    if (dst == NULL || scale == NULL)
        return kvs_fail(err, KVS_EINVAL, "block requant: %s: NULL", dst ? "scale" : "dst");
    layer_loc loc;
    int rc = check_layer(blk, len, layer, 1u << kind, &loc, err);
    if (rc)
        return rc;
    const geom *g = &loc.g;
    const size_t n = (size_t)g->T * g->D;
    float *x = malloc(n * sizeof *x);
    if (x == NULL)
        return kvs_fail(err, KVS_ENOMEM, "block requant: %zu floats", n);
    /* Two passes over the heads (amax, then codes) rather than one scratch
     * tensor of H*T*D floats: a layer can be 1 GiB of fp32. */
    float amax = 0.0f;
    for (int pass = 0; pass < 2 && rc == 0; pass++) {
        float s = kvq_scale_from_amax(amax, KVQ_E4M3_MAX);
        for (uint32_t h = 0; h < g->H && rc == 0; h++) {
            size_t size;
            const unsigned char *t = tile_at(blk, &loc, kind, h, &size);
            kvs_tile_hdr th;
            memcpy(&th, t, sizeof th); /* checked by check_layer */
            rc = tile_to_f32(t, size, &th, x, err);
            if (rc)
                break;
            if (pass == 0) {
                float a = amax_of(x, n);
                amax = a > amax ? a : amax;
            } else {
                requant_rows(x, g->T, g->D, s, dst + (size_t)h * g->D, (size_t)g->H * g->D);
            }
        }
        if (pass == 1 && rc == 0)
            *scale = s;
    }
    free(x);
    return rc;
}
