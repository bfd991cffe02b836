/*
 * kvs_cuda.h — the C API of the CUDA kernels (library kvs_cuda, built only when
 * KVS_CUDA_ENABLED). Plain C: callers never see a CUDA header or type.
 *
 * Idea: every kernel has a plain C twin in kernels/ref with the same arguments
 * and the same results bit for bit (kvq_math.h on both sides). The *_hw
 * variants produce the same outputs with CUDA's own conversion instructions
 * (cuda_fp8.h; cvt.rn.satfinite.*, native from sm_89), so conformance tests
 * can hold kvq_math.h against the hardware. The tile kernels
 * (kvs_cuda_quantize_tiles / kvs_cuda_dequantize_tiles) are the batched twins
 * of kvs_tile_quantize_ref / kvs_tile_dequantize_ref (kvq.h): same bytes, many
 * tiles per launch.
 *
 * Conventions
 *   - Every function returns 0 or a negative KVS_* code. On failure
 *     kvs_cuda_last_error() holds the CUDA error text (thread-local, valid
 *     until the next kvs_cuda_* call on the same thread).
 *   - Array arguments of the kernel entry points are device pointers
 *     (kvs_cuda_alloc); any alignment works, 16-byte-aligned arrays take the
 *     vectorised (128-bit) path. Kernels are queued on the default stream and
 *     return after the launch; a fault inside a kernel surfaces from the next
 *     kvs_cuda_sync() or copy.
 *   - Device 0 is used; nothing here selects or resets devices.
 */
#ifndef KVS_CUDA_H
#define KVS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "kv_format.h"
#include "kvq_math.h"

#ifdef __cplusplus
extern "C" {
#endif

/* kvq.h has no extern "C" guard of its own; C++ files must reach it through
 * this header (or wrap it the same way) so kvs_tile_* keep C linkage. */
#include "kvq.h"

/* *n = number of CUDA devices. KVS_ENODEV (and *n = 0) when there is none or
 * the driver is missing or too old: callers treat that as "no GPU". */
int kvs_cuda_device_count(int *n);

/* Name and compute capability of device 0; name is always NUL-terminated. */
int kvs_cuda_device_info(char *name, size_t name_len, int *cc_major, int *cc_minor);

/* The __CUDA_ARCH__ the kernel image that runs on device 0 was compiled for
 * (e.g. 900). The *_hw kernels use the hardware cvt only when it is >= 890;
 * below that cuda_fp8.h emulates in software. */
int kvs_cuda_kernel_arch(int *arch);

/* Text of the last CUDA error on this thread; never NULL ("" if none). */
const char *kvs_cuda_last_error(void);

/* Device memory. kvs_cuda_free(NULL) is a no-op. */
int kvs_cuda_alloc(void **dptr, size_t bytes);
void kvs_cuda_free(void *dptr);
int kvs_cuda_memset(void *dptr, int byte, size_t bytes);
int kvs_cuda_copy_to_device(void *dst, const void *src, size_t bytes);
int kvs_cuda_copy_to_host(void *dst, const void *src, size_t bytes);
int kvs_cuda_copy_device(void *dst, const void *src, size_t bytes);
/* Waits for all queued work; returns the first asynchronous error. */
int kvs_cuda_sync(void);

/* fp16 → FP8 → fp16 with kvq_math.h on the device: codes[i] =
 * kvq_fp16_to_fp8(in[i]) and, when out is not NULL, out[i] = the decoded fp16.
 * Twin of kvs_ref_fp8_roundtrip_fp16. */
int kvs_cuda_fp8_roundtrip_fp16(const uint16_t *in, uint8_t *codes, uint16_t *out, size_t n,
                                kvq_fp8_format fmt);

/* The same with __nv_cvt_halfraw2_to_fp8x2(.., __NV_SATFINITE, ..) for the codes
 * and __nv_cvt_fp8x2_to_halfraw2 for the decode. */
int kvs_cuda_fp8_roundtrip_fp16_hw(const uint16_t *in, uint8_t *codes, uint16_t *out,
                                   size_t n, kvq_fp8_format fmt);

/* codes[i] = kvq_f32_to_fp8(in[i]). Twin of kvs_ref_f32_to_fp8. */
int kvs_cuda_f32_to_fp8(const float *in, uint8_t *codes, size_t n, kvq_fp8_format fmt);

/* The same with __nv_cvt_float2_to_fp8x2(.., __NV_SATFINITE, ..). */
int kvs_cuda_f32_to_fp8_hw(const float *in, uint8_t *codes, size_t n, kvq_fp8_format fmt);

/* ---- tiles (kvq.h format, many tiles per launch) --------------------------
 *
 * Every pointer inside a job is a device pointer, and so is the job array
 * itself (jobs_dev): a caller builds the jobs once per block layout and reuses
 * them. Work is queued on `stream` (a cudaStream_t; NULL = the legacy default
 * stream) and the call returns after the launch: the outputs are ready after
 * a stream synchronisation, and a fault inside a kernel surfaces there.
 * Borrowed pointers must stay valid until then. Parameters are checked on the
 * host before anything is launched; nothing is launched on error.
 * Errors: KVS_EINVAL (bad params: kvs_tile_params_check, dtype, n > 0 with
 * jobs_dev NULL; p->key_offsets on a V tile or the fp16 scheme); KVS_ENODEV (no GPU or driver);
 * KVS_ENOMEM; KVS_EINTERNAL (any other CUDA error). kvs_cuda_last_error() says more.
 */

/* Key offsets (p->key_offsets, kv_format.h rule 5) are supported on K tiles
 * of the 8-bit schemes: the strip kernel computes each channel's offset with
 * kvq_offset_collect / kvq_offset_finish (kvq_offset_trim's arithmetic) and
 * takes its general form (any k_variant falls back to it); the dequantize
 * kernel adds the offsets. Checked by tests/emu on the CPU and by
 * test_kvq_cuda (section O) on a GPU. */

typedef struct kvs_cuda_tile_job {
    const void *src;            /* device: element (0,0) of the tile; element (t,d) at src[t*stride + d] */
    size_t stride;              /* elements between token rows, >= D */
    void *dst;                  /* device: kvs_tile_size(p) bytes, 16-byte aligned */
    const float *static_scales; /* device: G scales (finite, >= 0), or NULL for dynamic */
} kvs_cuda_tile_job;

/* Quantizes n tiles sharing params p (p->static_scales is ignored: each job
 * carries its own, validated by the caller, e.g. when its calibration profile
 * was loaded; p->tensor_scale applies to every tile of the call, so tiles of
 * layers with different per-tensor scales go in separate calls) and source
 * dtype, in one launch. Writes header + payload, every
 * byte of kvs_tile_size(p), with checksum 0: the caller seals each tile on the
 * host with kvs_tile_seal after copying it back; then it equals
 * kvs_tile_quantize_ref's tile byte for byte. Sources may have any stride and
 * alignment (rows that are 16-byte aligned take the 128-bit path). */
int kvs_cuda_quantize_tiles(const kvs_tile_params *p, kvs_dtype dtype,
                            const kvs_cuda_tile_job *jobs_dev, size_t n, void *stream);

typedef struct kvs_cuda_detile_job {
    const void *tile; /* device: a tile with the header p describes, 16-byte aligned */
    void *dst;        /* device: element (t,d) goes to dst[t*stride + d] (dtype) */
    size_t stride;    /* elements, >= D */
} kvs_cuda_detile_job;

/* Dequantizes n tiles into dst views of dtype, as kvs_tile_dequantize_ref does,
 * byte for byte. The tiles must already have passed kvs_tile_check on the host
 * and carry exactly the geometry of p (scheme, kind, T, D, k, S, key_offsets): the kernel
 * reads p, not the headers. Outlier slots whose index is out of range are
 * skipped, so no tile content makes it write outside dst's T x D view. Only the
 * T x D elements are written; bytes between rows (stride > D) are untouched. */
int kvs_cuda_dequantize_tiles(const kvs_tile_params *p, kvs_dtype dtype,
                              const kvs_cuda_detile_job *jobs_dev, size_t n, void *stream);

/* Benchmark and test knobs (process-wide, not thread-safe; 0 = automatic;
 * other values out of range are treated as 0). Results never depend on them.
 *   k_strip_bytes  bytes of a source row one K-tile block stages: 16, 32, 64
 *                  (automatic: the widest that still gives each multiprocessor
 *                  about 256 rows of strips);
 *   v_lane_chunks  16-byte chunks of a V row each lane holds: 1, 2, 4 (8 for
 *                  fp32) (automatic: 4 for fp16 and fp32, 2 for bf16);
 *   k_variant      K-tile quantize kernel: 0 the strip kernel (default), 1, 2, 3
 *                  the column-warp kernels with 4, 8, 16 source bytes per lane,
 *                  4 the same as 1 with T split into 64-row slices over two
 *                  launches (a device scratch buffer, allocated on first use and
 *                  kept, one per process: no concurrent variant-4 launches on
 *                  different streams) (tile_quant_k_cols.cu; used when k <= 4, else the strip
 *                  kernel). k_strip_bytes applies to the strip kernel only. */
typedef struct kvs_cuda_tile_tuning {
    int k_strip_bytes;
    int v_lane_chunks;
    int k_variant;
} kvs_cuda_tile_tuning;
void kvs_cuda_tile_set_tuning(const kvs_cuda_tile_tuning *t);

#ifdef __cplusplus
}
#endif

#endif /* KVS_CUDA_H */
