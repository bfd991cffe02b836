/*
 * kvs_cuda_util.cu — the plumbing of kvs_cuda.h: error text, device queries
 * and device memory. No kernels here (fp8_roundtrip.cu and tile_*.cu hold
 * them), only CUDA runtime calls.
 *
 * Invariants: every entry point clears this thread's error text first and
 * sets it on failure; nothing here selects, resets or reconfigures a device.
 */
#include <cuda_runtime.h>

#include <stdarg.h>
#include <stdio.h>

#include "kvs_cuda.h"
#include "kvs_cuda_internal.h"
#include "kvs_error.h"

namespace
{
thread_local char g_err[256];
}

void kvs__cuda_clear_error(void)
{
    g_err[0] = '\0';
}

int kvs__cuda_fail(cudaError_t e, const char *what)
{
    snprintf(g_err, sizeof g_err, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    switch (e) {
    case cudaErrorMemoryAllocation:
        return KVS_ENOMEM;
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorNoKernelImageForDevice:
        return KVS_ENODEV;
    case cudaErrorInvalidValue:
        return KVS_EINVAL;
    default:
        return KVS_EINTERNAL;
    }
}

int kvs__cuda_failf(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
    return code;
}

extern "C" {

int kvs_cuda_device_count(int *n)
{
    kvs__cuda_clear_error();
    if (n == NULL)
        return KVS_EINVAL;
    *n = 0;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        /* No driver, an old one, or no device: all mean "no GPU" here. */
        (void)cudaGetLastError();
        kvs__cuda_fail(e, "cudaGetDeviceCount");
        return KVS_ENODEV;
    }
    if (count <= 0) {
        snprintf(g_err, sizeof g_err, "cudaGetDeviceCount: 0 devices");
        return KVS_ENODEV;
    }
    *n = count;
    return KVS_OK;
}

int kvs_cuda_device_info(char *name, size_t name_len, int *cc_major, int *cc_minor)
{
    kvs__cuda_clear_error();
    if (name == NULL || name_len == 0 || cc_major == NULL || cc_minor == NULL)
        return KVS_EINVAL;
    cudaDeviceProp p;
    KVS_CK(cudaGetDeviceProperties(&p, 0));
    snprintf(name, name_len, "%s", p.name);
    *cc_major = p.major;
    *cc_minor = p.minor;
    return KVS_OK;
}

const char *kvs_cuda_last_error(void)
{
    return g_err;
}

int kvs_cuda_alloc(void **dptr, size_t bytes)
{
    kvs__cuda_clear_error();
    if (dptr == NULL)
        return KVS_EINVAL;
    *dptr = NULL;
    KVS_CK(cudaMalloc(dptr, bytes));
    return KVS_OK;
}

void kvs_cuda_free(void *dptr)
{
    if (dptr != NULL)
        (void)cudaFree(dptr);
}

int kvs_cuda_memset(void *dptr, int byte, size_t bytes)
{
    kvs__cuda_clear_error();
    KVS_CK(cudaMemset(dptr, byte, bytes));
    return KVS_OK;
}

int kvs_cuda_copy_to_device(void *dst, const void *src, size_t bytes)
{
    kvs__cuda_clear_error();
    KVS_CK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    return KVS_OK;
}

int kvs_cuda_copy_to_host(void *dst, const void *src, size_t bytes)
{
    kvs__cuda_clear_error();
    KVS_CK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
    return KVS_OK;
}

int kvs_cuda_copy_device(void *dst, const void *src, size_t bytes)
{
    kvs__cuda_clear_error();
    KVS_CK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
    return KVS_OK;
}

int kvs_cuda_sync(void)
{
    kvs__cuda_clear_error();
    KVS_CK(cudaDeviceSynchronize());
    return KVS_OK;
}

} // extern "C"
