/*
 * kvq_tile.c — what every implementation shares about tiles: parameter checks,
 * sizes, checksums and the validation of untrusted tiles.
 *
 * kvs_tile_check is the only gate between bytes from a network or a disk and
 * the decoders: after it returns 0, every offset and index the decoder uses is
 * in bounds. It reads only within [tile, tile + len).
 */
#include "kvq.h"
#include "kvq_math.h"

#include "kvs_error.h"

#include <float.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack for the streaming checksum */
#include <xxhash.h>
#if defined(KVS_XXH_DISPATCH) && !defined(XXH_INLINE_ALL)
/* libxxhash's run-time AVX2/AVX-512 dispatch (kernels/CMakeLists.txt defines
 * KVS_XXH_DISPATCH where the library ships it): the same hash, ~3x the SSE2
 * default on tile checksums, which every encode and every check computes. */
#include <xxh_x86dispatch.h>
#endif

static int scheme_ok(unsigned s) { return s >= KVS_SCHEME_FP16 && s <= KVS_SCHEME_INT8; }

/* Bounds shared by parameters and headers; returns a message or NULL. */
static const char *bounds_problem(unsigned scheme, unsigned kind, uint32_t T, uint32_t D,
                                  uint32_t k, uint32_t S)
{
    if (!scheme_ok(scheme))
        return "scheme: unknown";
    if (kind != KVS_TILE_K && kind != KVS_TILE_V)
        return "kind: must be K (0) or V (1)";
    if (T < 1 || T > KVS_TILE_MAX_TOKENS)
        return "tokens: must be 1..1024";
    if (D < 1 || D > KVS_TILE_MAX_DIM)
        return "dim: must be 1..1024";
    if (k > KVS_TILE_MAX_OUTLIERS)
        return "outliers: must be 0..16";
    if (S > KVS_TILE_MAX_SINKS || S > T)
        return "sinks: must be 0..min(tokens, 64)";
    if (scheme == KVS_SCHEME_FP16 && (k != 0 || S != 0))
        return "outliers/sinks: must be 0 for the fp16 scheme";
    return NULL;
}

int kvs_tile_params_check(const kvs_tile_params *p, char *err)
{
    if (p == NULL)
        return kvs_fail(err, KVS_EINVAL, "tile params: NULL");
    const char *why = bounds_problem(p->scheme, p->kind, p->tokens, p->dim, p->outliers, p->sinks);
    if (why)
        return kvs_fail(err, KVS_EINVAL, "tile params: %s", why);
    if (p->static_scales) {
        uint32_t g = kvs_tile_groups(p->kind, p->tokens, p->dim);
        for (uint32_t i = 0; i < g; i++) {
            float s = p->static_scales[i];
            if (!(s >= 0.0f && s <= FLT_MAX)) /* NaN fails both */
                return kvs_fail(err, KVS_EINVAL, "static_scales[%u]: must be finite and >= 0", i);
        }
    }
    if (!(p->tensor_scale >= 0.0f && p->tensor_scale <= FLT_MAX))
        return kvs_fail(err, KVS_EINVAL, "tensor_scale: must be finite and >= 0");
    if (p->key_offsets && (p->kind != KVS_TILE_K || p->scheme == KVS_SCHEME_FP16))
        return kvs_fail(err, KVS_EINVAL,
                        "tile params: key_offsets: only for K tiles of an 8-bit scheme");
    return 0;
}

uint16_t kvs_tile_tensor_scale_fp16(const kvs_tile_params *p)
{
    if (p->scheme != KVS_SCHEME_FP8_E4M3 && p->scheme != KVS_SCHEME_FP8_E5M2)
        return 0;
    return kvq_scale_fp16(p->tensor_scale); /* 0 stays 0: off */
}

size_t kvs_tile_size(const kvs_tile_params *p)
{
    return kvs_tile_bytes_ex(p->scheme, p->kind, p->tokens, p->dim, p->outliers, p->sinks,
                             p->key_offsets != 0);
}

uint64_t kvs_tile_checksum(const void *payload, size_t len) { return XXH3_64bits(payload, len); }

uint64_t kvs_tile_hdr_checksum(const kvs_tile_hdr *h, const void *payload, size_t payload_len)
{
    kvs_tile_hdr z = *h;
    z.checksum = 0;
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, &z, sizeof z);
    XXH3_64bits_update(&st, payload, payload_len);
    return XXH3_64bits_digest(&st);
}

/* kvs_tile_check and kvs_tile_check_verified: sum = 0 skips the XXH3 pass
 * only; every other check, and the bounds they give the decoders, stay. */
static int tile_check(const void *tile, size_t len, int sum, kvs_tile_hdr *out, char *err)
{
    kvs_tile_hdr h;
    if (tile == NULL || len < sizeof h)
        return kvs_fail(err, KVS_EFORMAT, "tile: %zu bytes, shorter than its 32-byte header", len);
    memcpy(&h, tile, sizeof h);
    if (h.magic != KVS_TILE_MAGIC)
        return kvs_fail(err, KVS_EFORMAT, "tile: bad magic 0x%08x", (unsigned)h.magic);
    if (h.version != KVS_FORMAT_VERSION)
        return kvs_fail(err, KVS_EFORMAT, "tile: unsupported version %u", (unsigned)h.version);
    if (h.flags & ~KVS_TILE_F_KNOWN)
        return kvs_fail(err, KVS_EFORMAT, "tile: unknown flags 0x%02x", (unsigned)h.flags);
    if (h.reserved0 || h.reserved1)
        return kvs_fail(err, KVS_EFORMAT, "tile: reserved fields not zero");
    const char *why = bounds_problem(h.scheme, h.kind, h.tokens, h.dim, h.outliers, h.sinks);
    if (why)
        return kvs_fail(err, KVS_EFORMAT, "tile: %s", why);
    const unsigned koff = (h.flags & KVS_TILE_F_KOFF) != 0;
    if (koff && (h.kind != KVS_TILE_K || h.scheme == KVS_SCHEME_FP16))
        return kvs_fail(err, KVS_EFORMAT, "tile: key offsets flag on a V or fp16 tile");
    kvs_tile_layout l;
    kvs_tile_layout_ex(h.scheme, h.kind, h.tokens, h.dim, h.outliers, h.sinks, koff, &l);
    if (h.payload_bytes != l.payload)
        return kvs_fail(err, KVS_EFORMAT, "tile: payload_bytes %u, layout needs %u",
                    (unsigned)h.payload_bytes, (unsigned)l.payload);
    if (len - sizeof h < l.payload)
        return kvs_fail(err, KVS_EFORMAT, "tile: truncated: %zu payload bytes of %u",
                    len - sizeof h, (unsigned)l.payload);
    const unsigned char *payload = (const unsigned char *)tile + sizeof h;
    if (sum && kvs_tile_hdr_checksum(&h, payload, l.payload) != h.checksum)
        return kvs_fail(err, KVS_EFORMAT, "tile: checksum mismatch");
    if (h.scheme != KVS_SCHEME_FP16 && h.outliers) {
        /* An index in range is an outlier; out of range, only the empty index
         * (all ones of the entry's width) is allowed. A V sink row's slots
         * must all be empty: with 8-bit indices and D = 256 the empty index
         * 0xFF is also a channel, so decoders skip those rows outright. */
        const uint32_t span = h.kind == KVS_TILE_K ? h.tokens : h.dim;
        const uint32_t lo = h.kind == KVS_TILE_K ? h.sinks : 0;
        const uint32_t empty = l.entry == 3u ? 0xFFu : KVS_OUTLIER_EMPTY;
        for (uint32_t i = 0; i < l.groups * h.outliers; i++) {
            uint32_t index;
            uint16_t value;
            kvs_outlier_get(payload + l.outliers + (size_t)i * l.entry, l.entry, &index, &value);
            if (h.kind == KVS_TILE_V && i / h.outliers < h.sinks) {
                if (index != empty)
                    return kvs_fail(err, KVS_EFORMAT, "tile: outlier %u in a sink row", i);
                continue;
            }
            if (index == empty && index >= span)
                continue;
            if (index >= span || index < lo)
                return kvs_fail(err, KVS_EFORMAT, "tile: outlier %u index %u out of range", i,
                                (unsigned)index);
        }
    }
    /* No quantizer writes a negative, NaN or infinite scale; refusing them keeps
     * every decoder's output defined (NaN payload bits of NaN x NaN are not). */
    if (h.scheme != KVS_SCHEME_FP16) {
        for (uint32_t g = 0; g < l.groups; g++) {
            uint16_t bits;
            memcpy(&bits, payload + l.scales + 2u * g, sizeof bits);
            if (bits >= 0x7C00u) /* fp16: sign set, or exponent all ones */
                return kvs_fail(err, KVS_EFORMAT, "tile: scale %u is negative, NaN or infinite",
                                g);
        }
    }
    /* No quantizer writes a non-finite offset (kvq_offset_fp16 clamps). */
    for (uint32_t d = 0; koff && d < h.dim; d++) {
        uint16_t bits;
        memcpy(&bits, payload + l.offsets + 2u * d, sizeof bits);
        if ((bits & 0x7C00u) == 0x7C00u)
            return kvs_fail(err, KVS_EFORMAT, "tile: key offset %u is NaN or infinite", d);
    }
    if (out)
        *out = h;
    return 0;
}

int kvs_tile_check(const void *tile, size_t len, kvs_tile_hdr *out, char *err)
{
    return tile_check(tile, len, 1, out, err);
}

int kvs_tile_check_verified(const void *tile, size_t len, kvs_tile_hdr *out, char *err)
{
    return tile_check(tile, len, 0, out, err);
}

int kvs_tile_seal(void *tile, size_t len, char *err)
{
    kvs_tile_hdr h;
    if (tile == NULL || len < sizeof h)
        return kvs_fail(err, KVS_EFORMAT, "tile: %zu bytes, shorter than its 32-byte header", len);
    memcpy(&h, tile, sizeof h);
    if (h.magic != KVS_TILE_MAGIC || h.version != KVS_FORMAT_VERSION)
        return kvs_fail(err, KVS_EFORMAT, "tile: bad magic or version");
    const char *why = bounds_problem(h.scheme, h.kind, h.tokens, h.dim, h.outliers, h.sinks);
    if (why)
        return kvs_fail(err, KVS_EFORMAT, "tile: %s", why);
    kvs_tile_layout l;
    kvs_tile_layout_ex(h.scheme, h.kind, h.tokens, h.dim, h.outliers, h.sinks,
                       (h.flags & KVS_TILE_F_KOFF) != 0, &l);
    if (h.payload_bytes != l.payload || len - sizeof h < l.payload)
        return kvs_fail(err, KVS_EFORMAT, "tile: payload size does not match its header");
    h.checksum = kvs_tile_hdr_checksum(&h, (const unsigned char *)tile + sizeof h, l.payload);
    memcpy(tile, &h, sizeof h);
    return 0;
}

static int dtype_ok(kvs_dtype dt)
{
    return dt == KVS_DTYPE_FP16 || dt == KVS_DTYPE_BF16 || dt == KVS_DTYPE_FP32;
}

int kvs_tile_quantize_args(const kvs_tile_params *p, const void *src, kvs_dtype dtype,
                           size_t stride, const void *out, size_t cap, char *err)
{
    int rc = kvs_tile_params_check(p, err);
    if (rc)
        return rc;
    const char *why = src == NULL        ? "src: NULL"
                      : out == NULL      ? "out: NULL"
                      : !dtype_ok(dtype) ? "dtype: must be 1 (fp16), 2 (bf16) or 3 (fp32)"
                      : stride < p->dim  ? "stride: less than dim"
                                         : NULL;
    if (why)
        return kvs_fail(err, KVS_EINVAL, "tile quantize: %s", why);
    size_t size = kvs_tile_size(p);
    if (cap < size)
        return kvs_fail(err, KVS_EINVAL, "tile quantize: out: cap %zu bytes, tile needs %zu", cap,
                        size);
    return 0;
}

static int dequantize_args(const void *tile, size_t len, int sum, kvs_dtype dtype,
                           const void *dst, size_t stride, kvs_tile_hdr *h, char *err)
{
    int rc = tile_check(tile, len, sum, h, err);
    if (rc)
        return rc;
    const char *why = dst == NULL        ? "dst: NULL"
                      : !dtype_ok(dtype) ? "dtype: must be 1 (fp16), 2 (bf16) or 3 (fp32)"
                      : stride < h->dim  ? "stride: less than the tile's dim"
                                         : NULL;
    if (why)
        return kvs_fail(err, KVS_EINVAL, "tile dequantize: %s", why);
    return 0;
}

int kvs_tile_dequantize_args(const void *tile, size_t len, kvs_dtype dtype, const void *dst,
                             size_t stride, kvs_tile_hdr *h, char *err)
{
    return dequantize_args(tile, len, 1, dtype, dst, stride, h, err);
}

int kvs_tile_dequantize_verified_args(const void *tile, size_t len, kvs_dtype dtype,
                                      const void *dst, size_t stride, kvs_tile_hdr *h, char *err)
{
    return dequantize_args(tile, len, 0, dtype, dst, stride, h, err);
}

void kvs_tile_write_header(const kvs_tile_params *p, void *out)
{
    kvs_tile_layout l;
    kvs_tile_layout_ex(p->scheme, p->kind, p->tokens, p->dim, p->outliers, p->sinks,
                       p->key_offsets != 0, &l);
    kvs_tile_hdr h;
    memset(&h, 0, sizeof h);
    h.magic = KVS_TILE_MAGIC;
    h.version = KVS_FORMAT_VERSION;
    h.scheme = (uint8_t)p->scheme;
    h.kind = (uint8_t)p->kind;
    h.flags = (uint8_t)((p->static_scales ? KVS_TILE_F_STATIC : 0u) |
                        (p->key_offsets ? KVS_TILE_F_KOFF : 0u));
    h.tokens = (uint16_t)p->tokens;
    h.dim = (uint16_t)p->dim;
    h.outliers = (uint8_t)p->outliers;
    h.sinks = (uint8_t)p->sinks;
    h.payload_bytes = l.payload;
    h.checksum = kvs_tile_hdr_checksum(&h, (const unsigned char *)out + sizeof h, l.payload);
    memcpy(out, &h, sizeof h);
}
