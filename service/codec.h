/*
 * codec.h — the service's bridge to kernels/: quantize a Put into an encoded
 * block (measuring what it lost), and turn a stored block back into what a Get
 * asked for.
 *
 * Why a separate module: kernels/kv_format.h and store/keys.h both define
 * kvs_dtype, so no translation unit may include both. Everything here speaks
 * plain integers (dtype: 1 fp16, 2 bf16, 3 fp32; scheme: 1 fp16, 2 fp8_e4m3,
 * 3 fp8_e5m2, 4 int8; egress format: kvstash.v1.EgressFormat values) and
 * includes only kernel headers; the RPC files include only store headers.
 *
 * Backends: KVS_CODEC_CPU quantizes with the fast CPU path (kernels/cpu,
 * bit-identical to the reference); KVS_CODEC_GPU stages the layer through
 * device memory and runs the kernels/cuda tile kernels (kvs_cuda.h, also
 * bit-identical), then seals the tiles on the host. The block bytes are the
 * same whichever backend made them. KVS_CODEC_INGEST is the backend
 * kvs_codec_backend_select chose at start; a GPU encode that fails (any CUDA
 * error) is redone on the CPU and counted (kvs_codec_counters). 8-bit layers
 * with key offsets (kvs_codec_layout.key_offsets) take the GPU only after a
 * self-check of their own passed at select (else the CPU, said in
 * kvs_codec_backend_note, not counted as fallbacks).
 *
 * State: the selection, the counters and the GPU's staging buffers are
 * process-wide (the CUDA device is too). GPU encodes are serialised on one
 * mutex and one set of device buffers, grown to the largest layer seen.
 *
 * Every function is thread-safe and touches only the buffers it is given.
 * Block bytes handed to the egress functions are treated as untrusted
 * (they may come back from an SSD tier): a bad block is KVS_EFORMAT.
 */
#ifndef KVS_CODEC_H
#define KVS_CODEC_H

#include <stddef.h>
#include <stdint.h>

typedef enum kvs_codec_backend {
    KVS_CODEC_CPU = 0,    /* kernels/cpu fast path (runtime ISA dispatch) */
    KVS_CODEC_GPU = 1,    /* kernels/cuda tile kernels (builds with CUDA) */
    KVS_CODEC_INGEST = 2, /* the one kvs_codec_backend_select chose (CPU until then) */
} kvs_codec_backend;

/* Has this build the GPU backend? 1 yes (compiled with CUDA), 0 no. */
int kvs_codec_gpu_built(void);

/*
 * Chooses the backend KVS_CODEC_INGEST stands for, once at start. want: 0
 * auto (the GPU when the build has CUDA and a device answers, else the CPU),
 * 1 cpu, 2 gpu (config.h kvs_config_backend). 0 and the choice in *out (may
 * be NULL), or for gpu without one KVS_ENODEV / KVS_EUNIMPL with err saying
 * why (no device, or a build without CUDA).
 */
int kvs_codec_backend_select(int want, kvs_codec_backend *out, char *err);

/* Why auto chose the CPU although a GPU answered: "" when it did not (or no
 * GPU was there), else "ingest on the CPU: ..." — the GPU failed the self-check
 * kvs_codec_backend_select runs before it picks the GPU: one block of every
 * scheme, with outliers, a sink and an fp16 layer, encoded on both and compared
 * byte for byte (with want = gpu that failure is the error instead); or "key
 * offsets on the CPU: ..." — the GPU was chosen but failed the same check with
 * key offsets, so layers with them are quantized on the CPU. Static storage,
 * written only by kvs_codec_backend_select. */
const char *kvs_codec_backend_note(void);

/* The backend KVS_CODEC_INGEST stands for now. */
kvs_codec_backend kvs_codec_backend_current(void);

/* 1 when 8-bit layers with key offsets are quantized on the GPU (the GPU was
 * chosen and passed the self-check with key offsets), else 0: they go to the
 * CPU. */
int kvs_codec_gpu_key_offsets(void);

/* "cpu", "gpu" or "ingest" (static storage). */
const char *kvs_codec_backend_name(kvs_codec_backend be);

/* Process-wide ingest counters since start. */
typedef struct kvs_codec_counters {
    uint64_t layers_cpu;    /* layers quantized on the CPU (fallbacks included) */
    uint64_t layers_gpu;    /* layers quantized on the GPU */
    uint64_t gpu_fallbacks; /* GPU encodes that failed and were redone on the CPU */
} kvs_codec_counters;
void kvs_codec_counters_get(kvs_codec_counters *out);

/* Shape and encoding choices of one block. schemes: `layers` entries, borrowed. */
typedef struct kvs_codec_layout {
    uint32_t layers, heads, head_dim, block_tokens;
    unsigned dtype;     /* source element type */
    int root;           /* block 0 of its prompt (sinks apply) */
    uint32_t k_outliers, v_outliers, sinks;
    const uint8_t *schemes;
    /* Per-tensor scales (kvs_tile_params.tensor_scale): `layers` entries each,
     * borrowed, or NULL for none; 0 for a layer = none. The FP8 group scales
     * of layer l's K (V) tiles are aligned to k_tensor_scales[l]
     * (v_tensor_scales[l]); int8 and fp16 ignore them. Each finite and >= 0
     * (else the layout is invalid). The CPU and the GPU apply the same scales,
     * so their bytes stay equal. */
    const float *k_tensor_scales, *v_tensor_scales;
    /* Nonzero: the K tiles of every 8-bit layer carry per-channel key offsets
     * (kvs_block_params.key_offsets: KVS_BLOCK_F_KOFF in the header,
     * KVS_TILE_F_KOFF on those tiles, 2 * head_dim bytes more per K tile;
     * kv_format.h rule 5). On the GPU backend only once their self-check
     * passed (kvs_codec_backend_select); else such layers are quantized on
     * the CPU (not counted as GPU fallbacks) and fp16 layers of the block
     * still go to the GPU. */
    int key_offsets;
} kvs_codec_layout;

/* Bytes of one layer's K (or V) in the source dtype: T*H*D*elem, or 0 for a
 * bad dtype. What a Put sends, so key offsets do not change it. */
size_t kvs_codec_layer_bytes(const kvs_codec_layout *l);

/* Bytes of the encoded block (key offsets included), or 0 when the layout is
 * invalid (err says why). */
size_t kvs_codec_block_size(const kvs_codec_layout *l, char *err);

/*
 * Layer-at-a-time encoding, so a Put can quantize layer i while layer i+1 is
 * still arriving. kvs_codec_begin writes the block header and scheme table
 * (checksummed, exactly as kvs_block_encode would) into out (cap bytes,
 * 8-byte aligned); then kvs_codec_encode_layer quantizes one layer's K and V
 * into their tiles and measures that layer's error by decoding it (as
 * kvs_codec_encode does); different layers of one block may be encoded by
 * different threads at once (they write disjoint bytes and only read the
 * header). kvs_codec_finish checks the whole block (every tile checksum)
 * before it is made visible. The bytes equal kvs_block_encode's (tensor
 * scales included: kvs_block_params takes the same ones).
 */
int kvs_codec_begin(const kvs_codec_layout *l, void *out, size_t cap, char *err);
int kvs_codec_encode_layer(kvs_codec_backend be, const kvs_codec_layout *l, uint32_t layer,
                           const void *k, const void *v, void *out, size_t cap, float *k_err,
                           float *v_err, char *err);
int kvs_codec_finish(const void *out, size_t size, char *err);

/*
 * Encodes k[l], v[l] (each kvs_codec_layer_bytes, [T][H][D] of l->dtype) into
 * out (cap bytes, 8-byte aligned), then decodes every layer back from out and
 * writes the relative error ||X - X'|| / ||X|| over finite elements into
 * k_err[l] and v_err[l] (0 when ||X|| is 0). 0, KVS_EINVAL, KVS_ENOMEM,
 * KVS_EFORMAT (should not happen: our own block fails its check).
 */
int kvs_codec_encode(kvs_codec_backend be, const kvs_codec_layout *l, const void *const *k,
                     const void *const *v, void *out, size_t cap, float *k_err, float *v_err,
                     char *err);

/* What a stored block says about itself (validated header). */
typedef struct kvs_codec_info {
    uint32_t layers, heads, head_dim, block_tokens;
    unsigned src_dtype;
    unsigned scheme;    /* layer 0's scheme: the block's scheme unless layers differ */
    int mixed;          /* some layer has another scheme (skip layers) */
} kvs_codec_info;
int kvs_codec_block_info(const void *blk, size_t len, kvs_codec_info *out, char *err);

/* Where each layer of a stored block ends, as the UCX data plane sends it
 * (layer 0 also carries the header and the scheme table, from byte 0):
 * ends[i] for i < *layers (at most cap), the last equal to the block's total
 * bytes (<= len). 0, KVS_EFORMAT (bad header), KVS_ENOSPC (more than cap layers). */
int kvs_codec_layer_ends(const void *blk, size_t len, uint64_t *ends, uint32_t cap,
                         uint32_t *layers, char *err);

/*
 * The scheme of a stored block from the first len bytes of it alone (a
 * store's peek, kvs_store_lookup_leased_info: 64 bytes), for Lookup's reply.
 * When len covers the header and the whole scheme table, this is
 * kvs_codec_block_info's check (header checksum included). When the table is
 * longer than len (over 24 layers in 64 bytes), the 40-byte header is checked
 * field by field (magic, version, flags, reserved fields, every bound) and so
 * is each table byte that is there, but not the checksum, which covers the
 * whole table: enough for a block the service wrote itself after
 * kvs_codec_finish checked all of it. *scheme gets layer 0's scheme (1..4).
 * 0, or KVS_EFORMAT (bad bytes, or fewer than 41: not even layer 0's entry).
 */
int kvs_codec_peek_scheme(const void *head, size_t len, unsigned *scheme, char *err);

/* Bytes of one layer's K (or V) in egress format fmt (1 fp16, 2 bf16, 3 fp32,
 * 4 per-tensor fp8), or 0 for format 0 (stored: variable) or a bad format. */
size_t kvs_codec_egress_bytes(uint32_t block_tokens, uint32_t heads, uint32_t head_dim,
                              unsigned fmt);

/*
 * One layer of a stored block in format fmt.
 *   fmt 0 (stored): *k and *v point INTO blk (the layer's K tiles, then its V
 *     tiles, byte ranges of the block; valid as long as blk); k_buf/v_buf unused.
 *   fmt 1..3: dequantized into k_buf / v_buf (each >= kvs_codec_egress_bytes).
 *   fmt 4: requantized to E4M3 with one scale per tensor (*k_scale, *v_scale).
 * On 0, (*k, *k_len) and (*v, *v_len) describe the bytes to send. KVS_EINVAL (bad
 * fmt or layer), KVS_EFORMAT (corrupt block).
 */
int kvs_codec_egress_layer(const void *blk, size_t len, uint32_t layer, unsigned fmt,
                           void *k_buf, void *v_buf, const void **k, size_t *k_len,
                           const void **v, size_t *v_len, float *k_scale, float *v_scale,
                           char *err);

#endif /* KVS_CODEC_H */
