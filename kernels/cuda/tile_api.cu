/*
 * tile_api.cu — kvs_cuda_quantize_tiles / kvs_cuda_dequantize_tiles: the host
 * side. Checks every parameter before anything is launched, describes the
 * shape once (kvs_tile::Geo: layout offsets, qmax) and picks the kernel:
 *   fp16 scheme          -> quant_fp16 (row streaming, tile_dequant.cu)
 *   8-bit, K tiles       -> quant_k    (strip staged in shared memory), or with
 *                           tuning k_variant 1..4 and k <= 4 quant_k_cols
 *                           (column warps, registers; tile_quant_k_cols.cu)
 *   8-bit, V tiles       -> quant_v    (a warp segment per row, registers)
 *   dequantize, any tile -> dequant    (row streaming)
 * One launch per call, whatever n is.
 */
#include "tile_dev.cuh"

#include "kvs_cuda_internal.h"
#include "kvs_error.h"

#include <stdio.h>

namespace
{

kvs_cuda_tile_tuning g_tuning; /* zero: automatic */

bool dtype_ok(kvs_dtype d)
{
    return d == KVS_DTYPE_FP16 || d == KVS_DTYPE_BF16 || d == KVS_DTYPE_FP32;
}

/* Checks p (ignoring its static_scales pointer), dtype and the job array;
 * fills the shape and, when n > 0, the device facts. */
int prepare(const kvs_tile_params *p, kvs_dtype dtype, const void *jobs, size_t n, kvs_tile::Geo *g,
            kvs_tile::DevInfo *di)
{
    kvs__cuda_clear_error();
    if (p == NULL)
        return kvs__cuda_failf(KVS_EINVAL, "tile params: NULL");
    kvs_tile_params q = *p;
    q.static_scales = NULL; /* per job, on the device */
    char err[KVS_ERR_LEN];
    int rc = kvs_tile_params_check(&q, err);
    if (rc != 0)
        return kvs__cuda_failf(rc, "%s", err);
    if (!dtype_ok(dtype))
        return kvs__cuda_failf(KVS_EINVAL, "dtype: %d is not fp16, bf16 or fp32", (int)dtype);
    if (n > 0 && jobs == NULL)
        return kvs__cuda_failf(KVS_EINVAL, "jobs: NULL with n = %zu", n);
    if (n > 0x7FFFFFFFu)
        return kvs__cuda_failf(KVS_EINVAL, "n: %zu tiles in one call is too many", n);
    g->scheme = (int)q.scheme;
    g->kind = (int)q.kind;
    g->T = (int)q.tokens;
    g->D = (int)q.dim;
    g->k = (int)q.outliers;
    g->S = (int)q.sinks;
    g->koff = q.key_offsets != 0; /* kvs_tile_params_check: K tiles of 8-bit schemes only */
    kvs_tile_layout_ex(q.scheme, q.kind, q.tokens, q.dim, q.outliers, q.sinks, (unsigned)g->koff,
                       &g->l);
    g->qmax = q.scheme == KVS_SCHEME_INT8       ? KVQ_INT8_MAX
              : q.scheme == KVS_SCHEME_FP8_E5M2 ? KVQ_E5M2_MAX
                                                : KVQ_E4M3_MAX;
    g->tensor16 = kvs_tile_tensor_scale_fp16(&q); /* one per call: every tile of it */
    if (n == 0)
        return KVS_OK; /* nothing to launch: the device is not even asked */
    int dev = 0;
    KVS_CK(cudaGetDevice(&dev));
    KVS_CK(cudaDeviceGetAttribute(&di->sms, cudaDevAttrMultiProcessorCount, dev));
    KVS_CK(cudaDeviceGetAttribute(&di->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (di->sms < 1)
        di->sms = 1;
    return KVS_OK;
}

} // namespace

extern "C" {

int kvs_cuda_quantize_tiles(const kvs_tile_params *p, kvs_dtype dtype,
                            const kvs_cuda_tile_job *jobs_dev, size_t n, void *stream)
{
    kvs_tile::Geo g;
    kvs_tile::DevInfo di;
    int rc = prepare(p, dtype, jobs_dev, n, &g, &di);
    if (rc != 0 || n == 0)
        return rc;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (g.scheme == KVS_SCHEME_FP16)
        return kvs_tile::quant_fp16(g, dtype, jobs_dev, (unsigned)n, s, di);
    if (g.kind == KVS_TILE_K && g_tuning.k_variant >= 1 && g_tuning.k_variant <= 4 &&
        kvs_tile::quant_k_cols_supported(g))
        return kvs_tile::quant_k_cols(g, dtype, jobs_dev, (unsigned)n, s, g_tuning.k_variant);
    if (g.kind == KVS_TILE_K)
        return kvs_tile::quant_k(g, dtype, jobs_dev, (unsigned)n, s, di, g_tuning.k_strip_bytes);
    return kvs_tile::quant_v(g, dtype, jobs_dev, (unsigned)n, s, di, g_tuning.v_lane_chunks);
}

int kvs_cuda_dequantize_tiles(const kvs_tile_params *p, kvs_dtype dtype,
                              const kvs_cuda_detile_job *jobs_dev, size_t n, void *stream)
{
    kvs_tile::Geo g;
    kvs_tile::DevInfo di;
    int rc = prepare(p, dtype, jobs_dev, n, &g, &di);
    if (rc != 0 || n == 0)
        return rc;
    return kvs_tile::dequant(g, dtype, jobs_dev, (unsigned)n, static_cast<cudaStream_t>(stream),
                             di);
}

void kvs_cuda_tile_set_tuning(const kvs_cuda_tile_tuning *t)
{
    if (t != NULL)
        g_tuning = *t;
    else
        g_tuning = kvs_cuda_tile_tuning();
}

} // extern "C"
