/*
 * kvq.h — quantize and dequantize KV tiles: the public API of kernels/.
 *
 * A tile is one (layer, K|V, kv_head) slice of T tokens x D dims (kv_format.h
 * defines its bytes, docs/FORMAT.md explains them). Every implementation —
 * the plain C reference (kvs_tile_*_ref, kernels/ref/), the fast CPU path
 * (kvs_tile_quantize / kvs_tile_dequantize, kernels/cpu/kvq_cpu.h) and the CUDA
 * kernels (kernels/cuda/kvs_cuda.h) — takes the same arguments and produces
 * the same bytes, checksum included.
 *
 * Alignment: the reference stores scales and fp16 values through typed
 * pointers, so its out / dst buffers must be 4-byte aligned (tiles inside a
 * block are 16-byte aligned); the fast CPU path accepts any alignment.
 *
 * Source and destination views: element (t, d) of a tile lives at
 * base[t * stride + d] (in elements of the view's dtype), so a tile can be read
 * straight out of a worker's [T][H][D] layer tensor (base = &x[0][h][0],
 * stride = H * D) without a copy. Views are borrowed for the call only.
 *
 * Errors: KVS_EINVAL for bad parameters or a too-small output buffer (err, if
 * not NULL, names the field); KVS_EFORMAT for a tile that fails validation.
 * No function reads or writes outside the buffers it was given, whatever the
 * bytes of an untrusted tile say.
 */
#ifndef KVQ_H
#define KVQ_H

#include "kv_format.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvs_tile_params {
    kvs_scheme scheme;
    kvs_tile_kind kind;
    uint32_t tokens;   /* T */
    uint32_t dim;      /* D */
    uint32_t outliers; /* k per scale group; must be 0 for fp16 */
    uint32_t sinks;    /* S leading token rows kept at fp16; must be 0 for fp16 */
    /* NULL: scales computed from the data. Otherwise G = (K ? D : T) static
     * scales (finite, >= 0) from a calibration profile; values beyond them
     * saturate. Borrowed for the call. */
    const float *static_scales;
    /* 0: off. Otherwise the per-tensor scale (amax / qmax of the whole layer
     * tensor, as an engine's per-tensor FP8 uses; kvq_calib.h's profile has it,
     * kvs_profile_tile_params fills it) that the FP8 group scales are aligned
     * to: each group's scale, dynamic or static, becomes the smallest
     * tensor_scale * 2^e (e any integer) at or above it, with tensor_scale
     * first rounded up to fp16 like every stored scale, so the stored fp16
     * group scales are exact power-of-two multiples of it. A group whose scale
     * is at most tensor_scale (every group, when tensor_scale covers the data)
     * gets tensor_scale / 2^m, and its FP8 grid holds the per-tensor grid over
     * the group's range: no element rounds worse than per-tensor FP8 with that
     * scale would round it (a larger group gets a coarser tensor_scale * 2^m,
     * where per-tensor FP8 would saturate).
     * kvq_math.h's kvq_scale_align_fp16 is the rule, edge cases included.
     * Applies to fp8_e4m3 and fp8_e5m2; ignored by int8 (a grid of evenly
     * spaced steps gains nothing from nesting, only the coarser scale:
     * docs/QUALITY.md §5) and fp16. Finite and >= 0. Nothing in the tile
     * records it: the stored scales are what decoders use. */
    float tensor_scale;
    /* Nonzero: per-channel key offsets (kv_format.h rule 5, flag
     * KVS_TILE_F_KOFF): each channel's group is quantized around its offset
     * (kvq_offset_trim) and the tile stores D fp16 offsets more. K tiles of
     * the 8-bit schemes only (KVS_EINVAL elsewhere). With static_scales or
     * tensor_scale the scales apply to the shifted values x - m, so a profile
     * measured without offsets gives scales larger than needed (never too
     * small). docs/QUALITY.md §10 has the measurements. */
    uint32_t key_offsets;
} kvs_tile_params;

/* Checks every bound of p (see kv_format.h limits). 0 or KVS_EINVAL. */
int kvs_tile_params_check(const kvs_tile_params *p, char *err);

/* The fp16 per-tensor scale a quantizer aligns p's group scales to
 * (kvq_scale_align_fp16), or 0 when there is none: tensor_scale 0, or a scheme
 * it does not apply to. p must have passed kvs_tile_params_check. */
uint16_t kvs_tile_tensor_scale_fp16(const kvs_tile_params *p);

/* Bytes of the encoded tile (header + payload) for valid p. */
size_t kvs_tile_size(const kvs_tile_params *p);

/* Structural validation of an untrusted tile of len bytes: magic, version,
 * scheme, kind, flags, bounds, reserved fields, payload size, checksum, and
 * that every outlier index is in range. On success fills *hdr (may be NULL)
 * with a copy of the header. 0 or KVS_EFORMAT (err says which check). */
int kvs_tile_check(const void *tile, size_t len, kvs_tile_hdr *hdr, char *err);

/* kvs_tile_check without its checksum pass, for a tile whose checksum our own
 * code verified on these very bytes moments before (transfer/ checks every
 * tile of a fetched layer before reporting it; kvs_block_decode_layer checks
 * a layer's tiles before decoding them). Everything else is checked as
 * kvs_tile_check does — header, bounds, payload size, outlier indices,
 * scales — so a decoder stays within the tile whatever its bytes say; what
 * it does not catch is a payload changed since that verification. Costs a
 * few bytes per scale group, not a pass over the payload. Bytes from a
 * network, a disk or another process that nobody verified take
 * kvs_tile_check. 0 or KVS_EFORMAT. */
int kvs_tile_check_verified(const void *tile, size_t len, kvs_tile_hdr *hdr, char *err);

/* XXH3-64 of len bytes (seed 0): the hash every kvstash checksum uses. */
uint64_t kvs_tile_checksum(const void *payload, size_t len);

/* The value of kvs_tile_hdr.checksum: XXH3-64 of the 32-byte header with its
 * checksum field zeroed, followed by the payload_len payload bytes. Covering
 * the header means no bit of a tile can change unnoticed. */
uint64_t kvs_tile_hdr_checksum(const kvs_tile_hdr *h, const void *payload, size_t payload_len);

/* Recomputes and stores the checksum of a tile whose header and payload were
 * written elsewhere (a GPU kernel writes checksum 0; the host seals the tile
 * after copying it back). The header must already be well-formed; len must
 * cover the payload. 0 or KVS_EFORMAT. */
int kvs_tile_seal(void *tile, size_t len, char *err);

/* For implementations of the two calls below, so every backend rejects bad
 * arguments the same way, in the same order, with the same message:
 * kvs_tile_quantize_args checks p, the source view and the output capacity;
 * kvs_tile_dequantize_args validates the tile (kvs_tile_check, *h filled) and
 * the destination view; kvs_tile_write_header writes the 32-byte header of p
 * at out, its checksum computed over the payload already written after it. */
int kvs_tile_quantize_args(const kvs_tile_params *p, const void *src, kvs_dtype dtype,
                           size_t stride, const void *out, size_t cap, char *err);
int kvs_tile_dequantize_args(const void *tile, size_t len, kvs_dtype dtype, const void *dst,
                             size_t stride, kvs_tile_hdr *h, char *err);
/* kvs_tile_dequantize_args with kvs_tile_check_verified: for the _verified
 * dequantizers. */
int kvs_tile_dequantize_verified_args(const void *tile, size_t len, kvs_dtype dtype,
                                      const void *dst, size_t stride, kvs_tile_hdr *h, char *err);
void kvs_tile_write_header(const kvs_tile_params *p, void *out);

/* Reference quantizer: writes kvs_tile_size(p) bytes to out (cap bytes
 * available). src is a view of dtype with the given stride (>= D). */
int kvs_tile_quantize_ref(const kvs_tile_params *p, const void *src, kvs_dtype dtype,
                          size_t stride, void *out, size_t cap, char *err);

/* Reference dequantizer: validates the tile (kvs_tile_check), then writes its
 * T x D values to the view dst of dtype with stride (>= D). */
int kvs_tile_dequantize_ref(const void *tile, size_t len, kvs_dtype dtype, void *dst,
                            size_t stride, char *err);

/* kvs_tile_dequantize_ref for a tile whose checksum the caller verified
 * (kvs_tile_check_verified's contract): the same output, one XXH3 pass less. */
int kvs_tile_dequantize_verified_ref(const void *tile, size_t len, kvs_dtype dtype, void *dst,
                                     size_t stride, char *err);

#ifdef __cplusplus
}
#endif

#endif /* KVQ_H */
