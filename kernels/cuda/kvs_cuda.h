/*
 * kvs_cuda.h — the C API of the CUDA kernels (library kvs_cuda, built only when
 * KVS_CUDA_ENABLED). Plain C: callers never see a CUDA header or type.
 *
 * Idea: every kernel has a plain C twin in kernels/ref with the same arguments
 * and the same results bit for bit (kvq_math.h on both sides). The *_hw
 * variants produce the same outputs with CUDA's own conversion instructions
 * (cuda_fp8.h; cvt.rn.satfinite.*, native from sm_89), so conformance tests
 * can hold kvq_math.h against the hardware.
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

#include "kvq_math.h"

#ifdef __cplusplus
extern "C" {
#endif

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

#ifdef __cplusplus
}
#endif

#endif /* KVS_CUDA_H */
