/*
 * kv_block.h — KV blocks: encode, validate, locate tiles, decode, seal, and
 * requantize for egress to one per-tensor FP8 scale.
 *
 * A block is block_tokens tokens of every layer of one model (docs/FORMAT.md
 * "Blocks", kv_format.h): the 40-byte kvs_block_hdr, the scheme table
 * (num_layers bytes, zero-padded to 16), then the tiles layer-major — layer 0:
 * K heads 0..H-1, V heads 0..H-1; then layer 1, ... Every tile size follows
 * from the header and the table (8-bit layers: k_outliers / v_outliers and
 * sinks; fp16 layers: k = S = 0), so every offset is known before a single tile
 * byte has arrived, and a worker can decode layer 0 while later layers stream.
 *
 * Checksums: the block header carries XXH3-64 (seed 0) of the 40 header bytes
 * with the checksum field zeroed, followed by the whole padded scheme table
 * (align16(num_layers) bytes, padding included); each tile carries XXH3-64 of
 * its payload.
 *
 * Tensors: a layer's K (or V) tensor is [T][H][D] in the given dtype, row-major
 * (vLLM's flash layout for one block); tile (layer, kind, head) is the view
 * base = &x[0][head][0], stride = H*D. All views are borrowed for the call.
 *
 * Trust: every function that takes block or tile bytes treats them as
 * untrusted and reads only within [ptr, ptr + len): a malformed block gives
 * KVS_EFORMAT (err, when not NULL, says which check), never a crash, and no
 * output is written unless the call succeeds — except where stated for
 * multi-tile outputs. Bad arguments (NULL pointers, indices out of range,
 * output too small) give KVS_EINVAL naming the argument. Allocation failure
 * gives KVS_ENOMEM. err, when not NULL, is char[KVS_ERR_LEN].
 *
 * Thread safety: no global state; concurrent calls on distinct outputs are
 * safe, and any number of concurrent readers may share one block.
 */
#ifndef KV_BLOCK_H
#define KV_BLOCK_H

#include "kv_format.h"
#include "kvq.h"

#include <stddef.h>
#include <stdint.h>

/* A tile quantizer / dequantizer: kvs_tile_quantize_ref and
 * kvs_tile_dequantize_ref (kvq.h), or a fast path with the same contract and
 * the same bytes (kernels/cpu). Where a function below has checked a tile in
 * full just before decoding it, or its caller has, it takes a _verified
 * dequantizer (kvs_tile_dequantize_verified_ref, kvs_tile_dequantize_verified:
 * every check but the checksum pass, kvs_tile_check_verified); a full one
 * works there too, hashing every tile a second time. */
typedef int (*kvs_tile_quantize_fn)(const kvs_tile_params *p, const void *src, kvs_dtype dtype,
                                    size_t stride, void *out, size_t cap, char *err);
typedef int (*kvs_tile_dequantize_fn)(const void *tile, size_t len, kvs_dtype dtype, void *dst,
                                      size_t stride, char *err);

typedef struct kvs_block_params {
    uint32_t layers;       /* L, 1..KVS_BLOCK_MAX_LAYERS */
    uint32_t heads;        /* H, kv heads, 1..KVS_BLOCK_MAX_HEADS */
    uint32_t head_dim;     /* D, 1..KVS_TILE_MAX_DIM */
    uint32_t block_tokens; /* T, KVS_BLOCK_MIN_TOKENS..KVS_BLOCK_MAX_TOKENS */
    kvs_dtype src_dtype;   /* dtype of the source tensors (recorded in the header) */
    int root;              /* nonzero: first block of its sequence (KVS_BLOCK_F_ROOT) */
    uint32_t k_outliers;   /* k of the K tiles of every 8-bit layer, 0..16 */
    uint32_t v_outliers;   /* k of the V tiles of every 8-bit layer, 0..16 */
    uint32_t sinks;        /* S of every 8-bit tile, 0..min(T, 64); 0 unless root */
    /* L entries, the scheme of each layer; KVS_SCHEME_FP16 keeps a layer
     * unquantized (vLLM's "skip layers"), its tiles with k = S = 0. Borrowed. */
    const kvs_scheme *schemes;
    /* Per-tensor scales (kvs_tile_params.tensor_scale) of layer l's K and V
     * tiles: L entries each, or NULL for none; 0 for a layer = none. FP8
     * group scales are aligned to them (kvq.h); int8 and fp16 ignore them.
     * Each finite and >= 0. Borrowed. kvstashd's codec passes a model rule's
     * profile scales here (service/codec.h: the same bytes). */
    const float *k_tensor_scales, *v_tensor_scales;
    /* Nonzero: the K tiles of every 8-bit layer carry per-channel key offsets
     * (kvs_tile_params.key_offsets, KVS_BLOCK_F_KOFF in the header): 2 * D
     * bytes more per K tile, for keys whose channels sit off zero
     * (docs/QUALITY.md §10). */
    int key_offsets;
} kvs_block_params;

/* Checks every bound of p. 0 or KVS_EINVAL (err names the field). */
int kvs_block_params_check(const kvs_block_params *p, char *err);

/* Bytes of the encoded block (header + table + tiles), or 0 when p is invalid. */
size_t kvs_block_size(const kvs_block_params *p);

/* Encodes a block into out (cap bytes; at least kvs_block_size(p)), which must
 * be 8-byte aligned (as malloc's is: quantizers store fp32 scales in place).
 * k_src[l] and v_src[l] (l < L) are layer l's K and V tensors, [T][H][D] of
 * p->src_dtype. quantize may be NULL for kvs_tile_quantize_ref. Writes exactly
 * kvs_block_size(p) bytes; on error, out's contents are unspecified. */
int kvs_block_encode(const kvs_block_params *p, const void *const *k_src, const void *const *v_src,
                     kvs_tile_quantize_fn quantize, void *out, size_t cap, char *err);

/* Writes the header and the padded scheme table of the block p describes at
 * the start of out (8-byte aligned; 40 + align16-padded L bytes), checksum
 * included: the bytes kvs_block_encode writes ahead of the tiles, for a caller
 * that writes the tiles itself (kvstashd's codec). p must have passed
 * kvs_block_params_check. */
void kvs_block_write_header(const kvs_block_params *p, void *out);

/* Validates the header and scheme table of an untrusted block: magic,
 * version, flags, dtype, bounds, reserved fields, table entries and padding,
 * header checksum, and total_bytes against the layout the header implies.
 * Needs only the first 40 + align16(num_layers) bytes (len may be less than
 * total_bytes: a block still arriving). Fills *hdr (may be NULL) with a copy of
 * the header. 0 or KVS_EFORMAT. */
int kvs_block_check_header(const void *blk, size_t len, kvs_block_hdr *hdr, char *err);

/* Full validation of an untrusted block of len >= total_bytes bytes (bytes
 * past total_bytes are ignored): kvs_block_check_header, then every tile with
 * kvs_tile_check (its checksum included), and that each tile's scheme, kind,
 * T, D, k and S are what the block says. 0 or KVS_EFORMAT. */
int kvs_block_check(const void *blk, size_t len, kvs_block_hdr *hdr, char *err);

/* Byte range [*off, *off + *bytes) of layer's 2H tiles within the block.
 * Reads only the header and table, which it validates structurally (not the
 * checksum); O(layer). KVS_EINVAL for layer >= L, KVS_EFORMAT for a bad or
 * short header. */
int kvs_block_layer_range(const void *blk, size_t len, uint32_t layer, uint64_t *off,
                          uint64_t *bytes, char *err);

/* Locates tile (layer, kind, head): *tile points into blk, *tile_len is its
 * exact size. Meant for a block that passed kvs_block_check (then the tile is
 * valid and consistent); on any other bytes it still never points outside
 * [blk, blk + len) — KVS_EFORMAT when the header is bad or the tile lies past
 * len — but the tile's own bytes are unchecked. *tile stays valid as long as
 * blk does. KVS_EINVAL for an index out of range. O(layer). */
int kvs_block_tile(const void *blk, size_t len, uint32_t layer, kvs_tile_kind kind, uint32_t head,
                   const void **tile, size_t *tile_len, char *err);

/* Dequantizes layer's K tiles into k_dst and V tiles into v_dst, each a
 * [T][H][D] tensor of dtype (either may be NULL to skip it). Validates the
 * header (kvs_block_check_header) and every tile of the layer (as
 * kvs_block_check does, checksums included) before writing anything, so it is
 * safe on unchecked bytes and needs len to cover only up to the end of this
 * layer (streaming). The tiles are then decoded by dequantize, a _verified
 * dequantizer (kvs_tile_dequantize_verified; NULL for
 * kvs_tile_dequantize_verified_ref): one XXH3 pass per tile, not two. If a
 * caller's function fails on a tile that passed validation, the heads before
 * it stay written. */
int kvs_block_decode_layer(const void *blk, size_t len, uint32_t layer, kvs_dtype dtype,
                           void *k_dst, void *v_dst, kvs_tile_dequantize_fn dequantize, char *err);

/* Dequantizes a run of tiles — one layer's K tiles (or V tiles), heads 0..H-1
 * back to back, as a block stores them and a Get in the stored format sends
 * them — into dst, a [tokens][heads][dim] tensor of dtype: exactly what
 * kvs_block_decode_layer writes for that layer's K (or V) of the block the
 * run came from. len must be exactly the run's bytes. Safe on untrusted
 * bytes (KVS_EFORMAT): before writing anything it checks the run's shape from
 * the tile headers (every tile of kind, tokens and dim, with head 0's scheme,
 * k, S and size, as the tiles of one layer of a block are); then each tile is
 * checked in full (kvs_tile_check, checksum included) by the dequantizer as
 * it is decoded — one check per tile where kvs_block_decode_layer makes two —
 * so a tile failing that check leaves the heads before it written (the
 * exception for multi-tile outputs, above). dequantize as for
 * kvs_block_decode_layer (NULL: the reference). The run may lie at any
 * address; dst is aligned as the dequantizer needs (kvq.h). */
int kvs_block_decode_run(const void *run, size_t len, kvs_tile_kind kind, uint32_t heads,
                         uint32_t tokens, uint32_t dim, kvs_dtype dtype, void *dst,
                         kvs_tile_dequantize_fn dequantize, char *err);

/* kvs_block_decode_run for a run whose tiles our own code has verified in
 * full (kvs_tile_check, checksum included) on these very bytes moments before
 * — libkvstash decoding a layer transfer/ has just verified and reported. The
 * same shape checks and output; each tile gets every check but the checksum
 * (kvs_tile_check_verified), so the decoder stays within the run whatever its
 * bytes, but a payload changed since that verification is not caught: bytes
 * nobody verified (a gRPC reply, a disk) take kvs_block_decode_run.
 * dequantize is a _verified dequantizer (kvs_tile_dequantize_verified; NULL
 * for kvs_tile_dequantize_verified_ref). */
int kvs_block_decode_run_verified(const void *run, size_t len, kvs_tile_kind kind, uint32_t heads,
                                  uint32_t tokens, uint32_t dim, kvs_dtype dtype, void *dst,
                                  kvs_tile_dequantize_fn dequantize, char *err);

/* Recomputes every tile checksum, then the header checksum, of a block whose
 * bytes were written elsewhere (a device kernel, a test forging a block). The
 * header and table must be structurally valid and len must cover total_bytes;
 * each tile header must be well-formed (kvs_tile_seal). 0 or KVS_EFORMAT. */
int kvs_block_seal(void *blk, size_t len, char *err);

/* ---- egress: one per-tensor FP8 (E4M3) scale ------------------------------
 * For engines that take only per-tensor FP8 KV (vLLM's default fp8 cache): the
 * stored tiles are dequantized to fp32 x' (kvs_tile_dequantize_ref), and each
 * x' is encoded as code = kvq_f32_to_e4m3(x' * kvq_scale_inv(scale)) — one
 * fp32 product, round to nearest even, saturation to ±448. NaN gives 0x7F;
 * ±Inf gives ±448 (0x7E/0xFE), even when scale is 0 (where the IEEE product
 * Inf * 0 would be NaN). Decode on the engine side: x'' = e4m3(code) * scale. */

/* Max |x'| over the finite dequantized values of a tile (0 when none).
 * 0, KVS_EFORMAT (tile fails kvs_tile_check) or KVS_ENOMEM. */
int kvs_tile_amax(const void *tile, size_t len, float *amax, char *err);

/* Requantizes one tile to E4M3 with the given scale (finite, >= 0) into the
 * [T][D] byte view dst with stride >= D (row t at dst + t * stride). */
int kvs_tile_requant_fp8(const void *tile, size_t len, float scale, uint8_t *dst, size_t stride,
                         char *err);

/* Requantizes layer's K (or V) tiles over all heads with one scale,
 * kvq_scale_from_amax(max of kvs_tile_amax over the heads, 448), into dst, a
 * [T][H][D] byte tensor, and returns that scale in *scale. Validates the
 * layer's tiles first (as kvs_block_decode_layer), so it is safe on unchecked
 * bytes; dst and *scale are written only on success. */
int kvs_block_requant_fp8(const void *blk, size_t len, uint32_t layer, kvs_tile_kind kind,
                          uint8_t *dst, float *scale, char *err);

#endif /* KV_BLOCK_H */
