/*
 * test_xfer_gpu.c — fetch into device memory (KVS_XFER_MEM_CUDA): the block
 * lands in a pinned host staging buffer, each verified layer is copied to the
 * GPU, layers are reported in order once on the device. Built only with
 * KVS_CUDA_ENABLED; exits 77 (skipped) where no GPU is usable.
 */
#include "kv_block.h"
#include "kvs_error.h"
#include "kvs_test.h"
#include "xfer.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint8_t *g_blk;
static uint64_t g_len;
static long g_released;

static int provide(void *ctx, void *sd, const uint8_t *key, uint32_t fmt, const uint8_t *nonce,
                   kvs_xfer_block_src *src)
{
    (void)ctx;
    (void)sd;
    (void)fmt;
    (void)nonce;
    if (key[0] != 1)
        return KVS_ENOTFOUND;
    src->bytes = g_blk;
    src->len = g_len;
    src->ref = NULL;
    return 0;
}

static void release(void *ctx, void *ref)
{
    (void)ctx;
    (void)ref;
    __atomic_add_fetch(&g_released, 1, __ATOMIC_SEQ_CST);
}

typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, status, order_ok;
    uint32_t next[2];
} waiter;

static void on_layer(kvs_xfer_fetch_req *r, uint32_t b, uint32_t l)
{
    waiter *w = r->data;
    if (b >= 2 || w->next[b] != l)
        w->order_ok = 0;
    else
        w->next[b]++;
}

static void on_done(kvs_xfer_fetch_req *r, int st)
{
    waiter *w = r->data;
    pthread_mutex_lock(&w->mu);
    w->done = 1;
    w->status = st;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void test_fetch_to_device(void)
{
    const uint32_t L = 6;
    kvs_scheme sch[6] = {KVS_SCHEME_FP16, KVS_SCHEME_FP8_E4M3, KVS_SCHEME_FP16,
                         KVS_SCHEME_INT8, KVS_SCHEME_FP16,     KVS_SCHEME_FP8_E5M2};
    kvs_block_params p = {.layers = L,
                          .heads = 4,
                          .head_dim = 128,
                          .block_tokens = 256,
                          .src_dtype = KVS_DTYPE_FP32,
                          .k_outliers = 2,
                          .v_outliers = 2,
                          .schemes = sch};
    size_t n = 256 * 4 * 128;
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((int)(i * 2654435761u >> 20) % 1000) / 250.0f - 2.0f;
    const void *src[6] = {x, x, x, x, x, x};
    g_len = kvs_block_size(&p);
    g_blk = aligned_alloc(64, (g_len + 63) / 64 * 64);
    CU_ASSERT_EQUAL_FATAL(kvs_block_encode(&p, src, src, NULL, g_blk, g_len, NULL), 0);

    kvs_xfer_server_opts so = {0};
    so.ops.provide = provide;
    so.ops.release = release;
    kvs_xfer_server *srv;
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_server_create(&so, &srv), 0);
    kvs_xfer_client *c;
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_client_create(NULL, &c), 0);
    const void *ca, *sa;
    size_t cl, sl;
    kvs_xfer_client_address(c, &ca, &cl);
    kvs_xfer_server_address(srv, &sa, &sl);
    kvs_xfer_session_info info;
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_server_session_open(srv, ca, cl, NULL, &info), 0);
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_client_connect(c, sa, sl, &info), 0);

    void *dev[2];
    CU_ASSERT_EQUAL_FATAL(cudaMalloc(&dev[0], g_len), cudaSuccess);
    CU_ASSERT_EQUAL_FATAL(cudaMalloc(&dev[1], g_len), cudaSuccess);
    cudaMemset(dev[0], 0, g_len);
    cudaMemset(dev[1], 0, g_len);
    uint8_t keys[2 * KVS_XFER_KEY_LEN] = {0};
    keys[0] = 1;
    keys[KVS_XFER_KEY_LEN] = 1;
    kvs_xfer_dst dst[2] = {{.buf = dev[0], .cap = g_len, .mem = KVS_XFER_MEM_CUDA},
                           {.buf = dev[1], .cap = g_len, .mem = KVS_XFER_MEM_CUDA}};
    waiter w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .order_ok = 1};
    kvs_xfer_fetch_req req = {.nblocks = 2,
                              .keys = keys,
                              .dst = dst,
                              .on_layer = on_layer,
                              .on_done = on_done,
                              .data = &w};
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_fetch(c, &req), 0);
    pthread_mutex_lock(&w.mu);
    while (!w.done)
        pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    CU_ASSERT_EQUAL(w.status, 0);
    CU_ASSERT(w.order_ok);
    CU_ASSERT_EQUAL(w.next[0], L);
    CU_ASSERT_EQUAL(w.next[1], L);
    uint8_t *back = malloc(g_len);
    for (int i = 0; i < 2; i++) {
        CU_ASSERT_EQUAL(cudaMemcpy(back, dev[i], g_len, cudaMemcpyDeviceToHost), cudaSuccess);
        CU_ASSERT_EQUAL(memcmp(back, g_blk, g_len), 0);
    }
    /* Host memory named as CUDA is refused. */
    dst[0].buf = back;
    req.nblocks = 1;
    CU_ASSERT_EQUAL(kvs_xfer_fetch(c, &req), KVS_EINVAL);
    kvs_xfer_client_destroy(c);
    kvs_xfer_server_destroy(srv);
    CU_ASSERT_EQUAL(g_released, 2);
    cudaFree(dev[0]);
    cudaFree(dev[1]);
    free(back);
    free(x);
    free(g_blk);
}

int main(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("test_xfer_gpu: no usable GPU, skipped\n");
        return KVS_TEST_SKIP;
    }
    static const kvs_test_case cases[] = {{"fetch_to_device", test_fetch_to_device}, {NULL, NULL}};
    static const kvs_test_suite suites[] = {{"xfer_gpu", NULL, NULL, cases},
                                            {NULL, NULL, NULL, NULL}};
    return kvs_test_run(suites);
}
