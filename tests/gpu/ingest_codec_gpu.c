/*
 * ingest_codec_gpu.c — the GPU machine's check of kvstashd's GPU ingest backend
 * (service/codec.c, KVS_CODEC_GPU) without the server: the selection's self-checks
 * pass (key offsets included), blocks encoded on the GPU equal the CPU's byte for
 * byte (ingest_cmp.h), the GPU counter counts every layer and no encode fell
 * back to the CPU. Built by tests/gpu/ingest (a
 * standalone project: kernels, codec.c, no gRPC), run by tests/gpu/run.sh.
 * Exit 0 pass, 1 fail, 77 no usable GPU.
 */
#include "ingest_cmp.h"

int main(void)
{
    char err[KVS_ERR_LEN] = "";
    if (kvs_codec_backend_select(2, NULL, err) != 0) {
        printf("SKIP: no usable GPU (%s)\n", err);
        return 77;
    }
    if (kvs_codec_backend_note()[0] != '\0') { /* the GPU passed, its key offsets did not */
        printf("FAIL ingest_codec_gpu: %s\n", kvs_codec_backend_note());
        return 1;
    }
    kvs_codec_counters c0, c1;
    kvs_codec_counters_get(&c0);
    unsigned blocks = 0;
    int failed = kvs_ingest_cmp_run(&blocks);
    kvs_codec_counters_get(&c1);
    unsigned long long gpu = c1.layers_gpu - c0.layers_gpu;
    unsigned long long fb = c1.gpu_fallbacks - c0.gpu_fallbacks;
    if (fb != 0) {
        fprintf(stderr, "FAIL: %llu GPU encodes fell back to the CPU\n", fb);
        failed++;
    }
    if (gpu == 0) {
        fprintf(stderr, "FAIL: no layer was quantized on the GPU\n");
        failed++;
    }
    if (failed) {
        printf("FAIL ingest_codec_gpu: %d of %u checks failed\n", failed, blocks);
        return 1;
    }
    printf("PASS ingest_codec_gpu: %u blocks (%llu layers on the GPU) equal the CPU's byte for "
           "byte, 0 fallbacks\n",
           blocks, gpu);
    return 0;
}
