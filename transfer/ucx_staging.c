/*
 * ucx_staging.c — GPU destinations through pinned host staging buffers.
 * Built only when KVS_CUDA_ENABLED (the kvs_transfer target defines
 * KVS_XFER_CUDA).
 *
 * Why: Debian's UCX 1.13 has no CUDA transports, so it would treat a
 * cudaMalloc pointer as host memory (LIBRARIES.md §3). A fetch into device
 * memory therefore lands each block in a pinned host buffer (cudaHostAlloc,
 * pooled and reused), and as soon as a layer has been verified its bytes are
 * copied to the device with cudaMemcpyAsync on the client's stream. The copy
 * of layer l overlaps the network receive of layer l + 1 (they use different
 * byte ranges of the staging buffer), and two blocks in flight use two
 * buffers: double buffering without a second copy of the protocol.
 *
 * Completion: after each copy a host function (cudaLaunchHostFunc) posts a
 * task to the client's progress thread, where the layer is reported. Copies
 * on one stream complete in order, so layers are still reported in order.
 * Host functions must not call CUDA; posting a task only takes a mutex and
 * signals the worker.
 */
#include "kvs_error.h"
#include "ucx_internal.h"

#include <cuda_runtime_api.h>
#include <stdlib.h>

typedef struct stage_buf {
    void *host;
    uint64_t cap;
    int busy;
    struct stage_buf *next;
} stage_buf;

struct kvs__stage {
    kvs__xw *xw;
    cudaStream_t stream;
    pthread_mutex_t mu;
    stage_buf *bufs;
};

typedef struct stage_done {
    kvs__xw_task task;
    kvs__xw *xw;
    void (*fn)(void *arg);
    void *arg;
} stage_done;

int kvs__cuda_dst_check(const void *p)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        return KVS_ENODEV;
    }
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return KVS_EINVAL;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? 0 : KVS_EINVAL;
}

int kvs__stage_create(kvs__xw *xw, kvs__stage **out)
{
    kvs__stage *st = calloc(1, sizeof *st);
    if (!st)
        return KVS_ENOMEM;
    st->xw = xw;
    pthread_mutex_init(&st->mu, NULL);
    if (cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking) != cudaSuccess) {
        (void)cudaGetLastError();
        pthread_mutex_destroy(&st->mu);
        free(st);
        return KVS_ENODEV;
    }
    *out = st;
    return 0;
}

void kvs__stage_sync(kvs__stage *st)
{
    if (st)
        cudaStreamSynchronize(st->stream);
}

void kvs__stage_destroy(kvs__stage *st)
{
    if (!st)
        return;
    cudaStreamSynchronize(st->stream);
    cudaStreamDestroy(st->stream);
    while (st->bufs) {
        stage_buf *b = st->bufs;
        st->bufs = b->next;
        cudaFreeHost(b->host);
        free(b);
    }
    pthread_mutex_destroy(&st->mu);
    free(st);
}

int kvs__stage_get(kvs__stage *st, uint64_t cap, void **host)
{
    pthread_mutex_lock(&st->mu);
    for (stage_buf *b = st->bufs; b; b = b->next) {
        if (!b->busy && b->cap >= cap) {
            b->busy = 1;
            *host = b->host;
            pthread_mutex_unlock(&st->mu);
            return 0;
        }
    }
    pthread_mutex_unlock(&st->mu);
    stage_buf *b = calloc(1, sizeof *b);
    if (!b)
        return KVS_ENOMEM;
    if (cudaHostAlloc(&b->host, cap, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError();
        free(b);
        return KVS_ENOMEM;
    }
    b->cap = cap;
    b->busy = 1;
    pthread_mutex_lock(&st->mu);
    b->next = st->bufs;
    st->bufs = b;
    pthread_mutex_unlock(&st->mu);
    *host = b->host;
    return 0;
}

void kvs__stage_put(kvs__stage *st, void *host)
{
    pthread_mutex_lock(&st->mu);
    for (stage_buf *b = st->bufs; b; b = b->next)
        if (b->host == host)
            b->busy = 0;
    pthread_mutex_unlock(&st->mu);
}

static void stage_task(void *p)
{
    stage_done *d = p;
    d->fn(d->arg);
    free(d);
}

/* On a CUDA thread: hand the completion to the progress thread. */
static void CUDART_CB stage_host_fn(void *p)
{
    stage_done *d = p;
    d->task.fn = stage_task;
    d->task.arg = d;
    kvs__xw_post(d->xw, &d->task);
}

int kvs__stage_copy(kvs__stage *st, void *dev, const void *host, size_t len, void (*fn)(void *arg),
                    void *arg)
{
    stage_done *d = calloc(1, sizeof *d);
    if (!d)
        return KVS_ENOMEM;
    d->fn = fn;
    d->arg = arg;
    if (cudaMemcpyAsync(dev, host, len, cudaMemcpyHostToDevice, st->stream) != cudaSuccess) {
        (void)cudaGetLastError();
        free(d);
        return KVS_EIO;
    }
    d->xw = st->xw;
    if (cudaLaunchHostFunc(st->stream, stage_host_fn, d) != cudaSuccess) {
        (void)cudaGetLastError();
        cudaStreamSynchronize(st->stream);
        free(d);
        return KVS_EIO;
    }
    return 0;
}
