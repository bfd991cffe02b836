/* fp8_ref.c — see fp8_ref.h. One loop per conversion, nothing clever: this is
 * the definition the fast paths are compared against. */
#include "fp8_ref.h"

#include "kvs_error.h"

static int check_args(const void *a, const void *b, size_t n, kvq_fp8_format fmt)
{
    if (fmt != KVQ_FP8_E4M3 && fmt != KVQ_FP8_E5M2)
        return KVS_EINVAL;
    if (n > 0 && (a == NULL || b == NULL))
        return KVS_EINVAL;
    return KVS_OK;
}

int kvs_ref_fp16_to_fp8(const uint16_t *in, uint8_t *codes, size_t n, kvq_fp8_format fmt)
{
    int rc = check_args(in, codes, n, fmt);
    if (rc != KVS_OK)
        return rc;
    for (size_t i = 0; i < n; i++)
        codes[i] = kvq_fp16_to_fp8(in[i], fmt);
    return KVS_OK;
}

int kvs_ref_f32_to_fp8(const float *in, uint8_t *codes, size_t n, kvq_fp8_format fmt)
{
    int rc = check_args(in, codes, n, fmt);
    if (rc != KVS_OK)
        return rc;
    for (size_t i = 0; i < n; i++)
        codes[i] = kvq_f32_to_fp8(in[i], fmt);
    return KVS_OK;
}

int kvs_ref_fp8_to_fp16(const uint8_t *codes, uint16_t *out, size_t n, kvq_fp8_format fmt)
{
    int rc = check_args(codes, out, n, fmt);
    if (rc != KVS_OK)
        return rc;
    for (size_t i = 0; i < n; i++)
        out[i] = kvq_fp8_to_fp16(codes[i], fmt);
    return KVS_OK;
}

int kvs_ref_fp8_to_f32(const uint8_t *codes, float *out, size_t n, kvq_fp8_format fmt)
{
    int rc = check_args(codes, out, n, fmt);
    if (rc != KVS_OK)
        return rc;
    for (size_t i = 0; i < n; i++)
        out[i] = kvq_fp8_to_f32(codes[i], fmt);
    return KVS_OK;
}

int kvs_ref_fp8_roundtrip_fp16(const uint16_t *in, uint8_t *codes, uint16_t *out, size_t n,
                               kvq_fp8_format fmt)
{
    int rc = check_args(in, codes, n, fmt);
    if (rc != KVS_OK)
        return rc;
    for (size_t i = 0; i < n; i++) {
        codes[i] = kvq_fp16_to_fp8(in[i], fmt);
        if (out != NULL)
            out[i] = kvq_fp8_to_fp16(codes[i], fmt);
    }
    return KVS_OK;
}
