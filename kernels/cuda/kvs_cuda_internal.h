/*
 * kvs_cuda_internal.h — what the .cu files of kvs_cuda share and callers never
 * see: the thread-local error text behind kvs_cuda_last_error() and the
 * mapping of cudaError_t onto KVS_* statuses.
 *
 * Invariant: every public entry point calls kvs__cuda_clear_error() first, so
 * kvs_cuda_last_error() always describes the latest call on this thread.
 */
#ifndef KVS_CUDA_INTERNAL_H
#define KVS_CUDA_INTERNAL_H

#include <cuda_runtime.h>

/* Empties the error text of this thread. */
void kvs__cuda_clear_error(void);

/* Records "what: CUDA text (name)" and returns the KVS_* status for e:
 * ENOMEM, ENODEV (no device, driver too old, no kernel image), EINVAL
 * (cudaErrorInvalidValue), else EINTERNAL. */
int kvs__cuda_fail(cudaError_t e, const char *what);

/* Records a message of our own (printf-style) and returns code. */
int kvs__cuda_failf(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define KVS_CK(call)                                                                               \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return kvs__cuda_fail(e_, #call);                                                      \
    } while (0)

#endif /* KVS_CUDA_INTERNAL_H */
