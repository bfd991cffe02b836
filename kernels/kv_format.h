/*
 * kv_format.h — the stored form of KV blocks: tiles and blocks (version 2).
 *
 * Compiled by cc and nvcc alike; every layout here is fixed-size and checked
 * with static_assert. docs/FORMAT.md documents every byte; this header is the
 * definition. All multi-byte fields are little-endian.
 *
 * A *tile* is one (layer, K or V, kv_head) slice of T tokens x D dims,
 * quantized as a unit. A *block* is block_tokens tokens for every layer: a
 * block header, a per-layer scheme table, then the tiles in layer-major order
 * (layer 0: K head 0..H-1, V head 0..H-1; layer 1: ...), so a worker can use
 * layer 0 while later layers are still arriving.
 *
 * Tile = 32-byte header + payload. For the 8-bit schemes the payload is, each
 * part starting at a 16-byte aligned offset from the payload start:
 *   codes     T*D bytes, row-major [T][D] (token-major, as vLLM's flash layout)
 *   scales    G x fp16, one per scale group
 *   outliers  G*k entries of E bytes, k per group, group-major: the index
 *             (E - 2 bytes: uint8 when the group's span, T for K and D for V,
 *             is <= 256, else uint16) then the fp16 value (kvs_outlier_put)
 *   sinks     S*D x fp16, the first S token rows kept at fp16
 *   offsets   D x fp16, only in a K tile flagged KVS_TILE_F_KOFF: the
 *             per-channel key offsets (rule 5 below)
 * and its length is rounded up to 16. For fp16 the payload is T*D fp16 values
 * ([T][D]) rounded up to 16, with k = S = 0.
 *
 * Scale groups: K tiles have one group per channel d (G = D; the group is the
 * T - S non-sink tokens of that channel) because key outliers live in fixed
 * channels; V tiles have one group per token row t (G = T; the group is the D
 * values of that row) because attention sums values over tokens.
 *
 * The quantization rule (kernels/ref/kvq_ref.c is the executable definition,
 * kvq_math.h the per-element arithmetic):
 *   1. Sink rows t < S: values stored as fp16 in the sink region; their codes
 *      are 0; a V sink row's scale is 0 and its outlier slots are empty.
 *   2. In each group, the k elements of largest |x| (kvq_topk_abs: ±Inf first,
 *      ties to the lowest index, NaN last) are outliers: their fp16 value
 *      (kvq_f32_to_fp16) and their index within the group (token index for K,
 *      channel index for V) go to the group's outlier slots in rank order;
 *      their codes are 0. Slots beyond the group's length are empty
 *      (index all ones of its width: 0xFF or 0xFFFF; value 0).
 *   3. scale = kvq_scale_fp16(kvq_scale_from_amax(amax of the finite
 *      non-outlier values, qmax)) — or kvq_scale_fp16 of the profile's static
 *      scale when KVS_TILE_F_STATIC is set: the fp16 value stored, rounded up
 *      so no code saturates for want of range — and every other element gets
 *      code = quantize(x * kvq_scale_inv(that fp16 scale widened to fp32)).
 *   4. Decode: x' = dequantize(code, scale) (+ the channel's offset, rule 5);
 *      then outlier slots (of non-sink groups: with D = 256 the empty 0xFF is
 *      also channel 255) overwrite their element; then sink rows overwrite
 *      theirs.
 *   5. Key offsets (K tiles of 8-bit schemes with KVS_TILE_F_KOFF): before
 *      rules 2-3, each channel's group gets an offset m (kvq_offset_trim: the
 *      centre of the narrowest range its finite values span once k of them
 *      are set aside, stored as fp16) and rules 2-3 apply to y = x - m (one
 *      fp32 subtraction): outliers are the k largest |y|, the scale comes
 *      from the rest of y, codes encode y. An outlier slot keeps fp16(x), the
 *      original value. Decode adds m to dequantize(code, scale) (one fp32
 *      addition, kvq_offset_add). A key channel sitting at m +- s with
 *      |m| >> s then spends its 8 bits on s, not on |m| + s.
 * Source elements (fp16, bf16, fp32) are first widened to fp32, exactly.
 *
 * Checksums: XXH3-64 (libxxhash) of the tile header (checksum field zeroed)
 * followed by its payload, in the tile header; the
 * block header carries XXH3-64 of itself (checksum field zeroed) and its
 * scheme table. A reader checks both before it uses a byte.
 */
#ifndef KV_FORMAT_H
#define KV_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#ifndef __cplusplus
#include <assert.h> /* static_assert */
#endif

#ifndef KVS_HD
#if defined(__CUDACC__)
#define KVS_HD __host__ __device__
#else
#define KVS_HD
#endif
#endif

/* Version 2 (fp16 scales, 3-byte outlier entries) changed tile sizes, so
 * blocks carry it too; readers reject every other version (KVS_EFORMAT). */
#define KVS_FORMAT_VERSION 2u
#define KVS_TILE_MAGIC 0x3154564Bu  /* bytes "KVT1" */
#define KVS_BLOCK_MAGIC 0x3142564Bu /* bytes "KVB1" */

/* Limits every reader enforces. Indices are uint8 (span <= 256) or uint16,
 * so T and D < 65535. */
#define KVS_TILE_MAX_TOKENS 1024u
#define KVS_TILE_MAX_DIM 1024u
#define KVS_TILE_MAX_OUTLIERS 16u   /* k per scale group */
#define KVS_TILE_MAX_SINKS 64u      /* S */
#define KVS_BLOCK_MIN_TOKENS 16u
#define KVS_BLOCK_MAX_TOKENS 1024u
#define KVS_BLOCK_MAX_LAYERS 1024u
#define KVS_BLOCK_MAX_HEADS 256u

/* An empty outlier slot's index: all ones of its width (0xFF or 0xFFFF). */
#define KVS_OUTLIER_EMPTY 0xFFFFu
/* Groups of span <= this many (T for K, D for V) use 3-byte outlier entries. */
#define KVS_OUTLIER_INDEX8_SPAN 256u

/* Values match kvstash.v1.Scheme. */
typedef enum kvs_scheme {
    KVS_SCHEME_FP16 = 1,
    KVS_SCHEME_FP8_E4M3 = 2,
    KVS_SCHEME_FP8_E5M2 = 3,
    KVS_SCHEME_INT8 = 4,
} kvs_scheme;

/* Values match kvstash.v1.Dtype. */
typedef enum kvs_dtype {
    KVS_DTYPE_FP16 = 1,
    KVS_DTYPE_BF16 = 2,
    KVS_DTYPE_FP32 = 3,
} kvs_dtype;

typedef enum kvs_tile_kind {
    KVS_TILE_K = 0, /* per-channel scales, G = D */
    KVS_TILE_V = 1, /* per-token scales, G = T */
} kvs_tile_kind;

/* Tile header flags. */
#define KVS_TILE_F_STATIC 0x01u /* scales came from a calibration profile */
#define KVS_TILE_F_KOFF   0x02u /* K tile, 8-bit scheme: per-channel offsets (rule 5) */
#define KVS_TILE_F_KNOWN  0x03u /* every flag this version defines */

typedef struct kvs_tile_hdr {
    uint32_t magic;         /* KVS_TILE_MAGIC */
    uint8_t version;        /* KVS_FORMAT_VERSION */
    uint8_t scheme;         /* kvs_scheme */
    uint8_t kind;           /* kvs_tile_kind */
    uint8_t flags;          /* KVS_TILE_F_* */
    uint16_t tokens;        /* T, 1..KVS_TILE_MAX_TOKENS */
    uint16_t dim;           /* D, 1..KVS_TILE_MAX_DIM */
    uint8_t outliers;       /* k per group, 0..KVS_TILE_MAX_OUTLIERS (0 for fp16) */
    uint8_t sinks;          /* S, 0..min(T, KVS_TILE_MAX_SINKS) (0 for fp16) */
    uint16_t reserved0;     /* 0 */
    uint32_t payload_bytes; /* = kvs_tile_payload_bytes(...) */
    uint32_t reserved1;     /* 0 */
    uint64_t checksum;      /* XXH3-64 of this header (checksum 0) + the payload */
} kvs_tile_hdr;

/* Block header flags. */
#define KVS_BLOCK_F_ROOT 0x01u  /* first block of a sequence: tiles may carry sinks */
#define KVS_BLOCK_F_KOFF  0x02u  /* the K tiles of its 8-bit layers carry KVS_TILE_F_KOFF */
#define KVS_BLOCK_F_KNOWN 0x03u

typedef struct kvs_block_hdr {
    uint32_t magic;         /* KVS_BLOCK_MAGIC */
    uint8_t version;        /* KVS_FORMAT_VERSION */
    uint8_t flags;          /* KVS_BLOCK_F_* */
    uint8_t src_dtype;      /* kvs_dtype the worker sent */
    uint8_t reserved0;      /* 0 */
    uint16_t num_layers;    /* 1..KVS_BLOCK_MAX_LAYERS */
    uint16_t num_kv_heads;  /* 1..KVS_BLOCK_MAX_HEADS */
    uint16_t head_dim;      /* 1..KVS_TILE_MAX_DIM */
    uint16_t block_tokens;  /* KVS_BLOCK_MIN_TOKENS..KVS_BLOCK_MAX_TOKENS */
    uint8_t k_outliers;     /* k of every K tile */
    uint8_t v_outliers;     /* k of every V tile */
    uint8_t sinks;          /* S of every tile when ROOT, else 0 */
    uint8_t reserved1;      /* 0 */
    uint32_t reserved2;     /* 0 */
    uint64_t total_bytes;   /* header + scheme table + every tile */
    uint64_t checksum;      /* XXH3-64 of header (this field 0) + scheme table */
} kvs_block_hdr;
/* Then num_layers scheme bytes (kvs_scheme per layer), zero-padded so that
 * header + table end on a multiple of 16 (tiles start 16-byte aligned); then
 * the tiles. */

#if defined(__cplusplus)
static_assert(sizeof(kvs_tile_hdr) == 32, "tile header is 32 bytes");
static_assert(sizeof(kvs_block_hdr) == 40, "block header is 40 bytes");
#else
_Static_assert(sizeof(kvs_tile_hdr) == 32, "tile header is 32 bytes");
_Static_assert(sizeof(kvs_block_hdr) == 40, "block header is 40 bytes");
#endif

/* ---- tile geometry: pure functions of (scheme, kind, T, D, k, S) ---------- */

typedef struct kvs_tile_layout {
    uint32_t codes;    /* offsets from the payload start */
    uint32_t scales;
    uint32_t outliers;
    uint32_t sinks;
    uint32_t offsets;  /* the key offsets (KVS_TILE_F_KOFF); = the end of the sinks without */
    uint32_t payload;  /* total payload bytes */
    uint32_t groups;   /* G */
    uint32_t entry;    /* bytes per outlier entry: 3 or 4 (kvs_outlier_entry_bytes) */
} kvs_tile_layout;

KVS_HD static inline uint32_t kvs_align16(uint32_t x) { return (x + 15u) & ~15u; }

KVS_HD static inline uint32_t kvs_tile_groups(unsigned kind, uint32_t T, uint32_t D)
{
    return kind == KVS_TILE_K ? D : T;
}

/* Outlier entry width: an 8-bit index when the group's span (the index
 * range: T for K, D for V) is <= 256, else a 16-bit one; then 2 bytes fp16. */
KVS_HD static inline uint32_t kvs_outlier_entry_bytes(unsigned kind, uint32_t T, uint32_t D)
{
    return (kind == KVS_TILE_K ? T : D) <= KVS_OUTLIER_INDEX8_SPAN ? 3u : 4u;
}

/* Writes one outlier entry of `entry` bytes at p, byte by byte (entries are
 * not aligned): index little-endian in entry - 2 bytes (KVS_OUTLIER_EMPTY
 * becomes all ones of that width), then the fp16 value little-endian. */
KVS_HD static inline void kvs_outlier_put(unsigned char *p, uint32_t entry, uint32_t index,
                                          uint16_t value)
{
    p[0] = (unsigned char)(index & 0xFFu);
    if (entry == 4u)
        p[1] = (unsigned char)(index >> 8);
    p[entry - 2u] = (unsigned char)(value & 0xFFu);
    p[entry - 1u] = (unsigned char)(value >> 8);
}

/* Reads the entry at p: its index (an empty slot reads as all ones of its
 * width, 0xFF or 0xFFFF) and its fp16 value. */
KVS_HD static inline void kvs_outlier_get(const unsigned char *p, uint32_t entry, uint32_t *index,
                                          uint16_t *value)
{
    *index = entry == 4u ? (uint32_t)p[0] | ((uint32_t)p[1] << 8) : (uint32_t)p[0];
    *value = (uint16_t)((uint32_t)p[entry - 2u] | ((uint32_t)p[entry - 1u] << 8));
}

/* Fills *l for a tile with (koff nonzero) or without key offsets; koff counts
 * only for K tiles of 8-bit schemes (kvs_tile_params_check refuses it
 * elsewhere). The caller has validated the parameters (kvs_tile_params_check). */
KVS_HD static inline void kvs_tile_layout_ex(unsigned scheme, unsigned kind, uint32_t T, uint32_t D,
                                             uint32_t k, uint32_t S, unsigned koff,
                                             kvs_tile_layout *l)
{
    l->groups = kvs_tile_groups(kind, T, D);
    l->entry = kvs_outlier_entry_bytes(kind, T, D);
    l->codes = 0;
    if (scheme == KVS_SCHEME_FP16) {
        l->scales = l->outliers = l->sinks = l->offsets = l->payload = kvs_align16(T * D * 2u);
        return;
    }
    l->scales = kvs_align16(T * D);
    l->outliers = kvs_align16(l->scales + l->groups * 2u);
    l->sinks = kvs_align16(l->outliers + l->groups * k * l->entry);
    l->offsets = kvs_align16(l->sinks + S * D * 2u);
    l->payload = koff && kind == KVS_TILE_K ? kvs_align16(l->offsets + D * 2u) : l->offsets;
}

/* kvs_tile_layout_ex without key offsets. */
KVS_HD static inline void kvs_tile_layout_of(unsigned scheme, unsigned kind, uint32_t T, uint32_t D,
                                             uint32_t k, uint32_t S, kvs_tile_layout *l)
{
    kvs_tile_layout_ex(scheme, kind, T, D, k, S, 0, l);
}

/* Total bytes of a tile (header + payload), with or without key offsets. */
KVS_HD static inline uint32_t kvs_tile_bytes_ex(unsigned scheme, unsigned kind, uint32_t T,
                                                uint32_t D, uint32_t k, uint32_t S, unsigned koff)
{
    kvs_tile_layout l;
    kvs_tile_layout_ex(scheme, kind, T, D, k, S, koff, &l);
    return (uint32_t)sizeof(kvs_tile_hdr) + l.payload;
}

/* kvs_tile_bytes_ex without key offsets. */
KVS_HD static inline uint32_t kvs_tile_bytes(unsigned scheme, unsigned kind, uint32_t T, uint32_t D,
                                             uint32_t k, uint32_t S)
{
    return kvs_tile_bytes_ex(scheme, kind, T, D, k, S, 0);
}

#endif /* KV_FORMAT_H */
