/*
 * fp8_ref.h — plain C reference conversions between fp16/fp32 arrays and FP8
 * codes: the twins of the CUDA kernels in kernels/cuda/kvs_cuda.h (same
 * arguments, same results bit for bit), written for clarity, one element at a
 * time through kvq_math.h.
 *
 * All arrays are caller-owned and borrowed for the duration of the call;
 * input and output must not overlap. Every function returns 0, or KVS_EINVAL
 * for an unknown format or a NULL array with n > 0.
 */
#ifndef KVS_FP8_REF_H
#define KVS_FP8_REF_H

#include <stddef.h>
#include <stdint.h>

#include "kvq_math.h"

#ifdef __cplusplus
extern "C" {
#endif

/* codes[i] = FP8 code of the fp16 in[i]. */
int kvs_ref_fp16_to_fp8(const uint16_t *in, uint8_t *codes, size_t n, kvq_fp8_format fmt);

/* codes[i] = FP8 code of in[i]. */
int kvs_ref_f32_to_fp8(const float *in, uint8_t *codes, size_t n, kvq_fp8_format fmt);

/* out[i] = the fp16 value of codes[i] (exact; NaN codes give 0x7FFF). */
int kvs_ref_fp8_to_fp16(const uint8_t *codes, uint16_t *out, size_t n, kvq_fp8_format fmt);

/* out[i] = the fp32 value of codes[i] (exact; NaN codes give 0x7FFFFFFF). */
int kvs_ref_fp8_to_f32(const uint8_t *codes, float *out, size_t n, kvq_fp8_format fmt);

/* fp16 → FP8 → fp16: codes[i] as kvs_ref_fp16_to_fp8, and, when out is not
 * NULL, out[i] the decoded fp16. */
int kvs_ref_fp8_roundtrip_fp16(const uint16_t *in, uint8_t *codes, uint16_t *out, size_t n,
                               kvq_fp8_format fmt);

#ifdef __cplusplus
}
#endif

#endif /* KVS_FP8_REF_H */
