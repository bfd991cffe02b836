/*
 * fp8_bw.cu — bandwidth of the FP8 conversion kernels (kvs_cuda.h) against a
 * device-to-device cudaMemcpy on the same GPU.
 *
 * Validate first, then time (STYLE.md, llm.c dev/cuda): every kernel's output
 * over the whole input must equal the host reference (kvs_ref_*) before any
 * timing; a mismatch exits 1. Each repetition flushes L2 by writing a buffer
 * larger than it, then times one launch with CUDA events; the median of REPS
 * repetitions is reported as GB/s of DRAM traffic (bytes read + written) and as
 * a ratio to the memcpy's GB/s (traffic 2× the copied bytes).
 *
 * Usage: fp8_bw [elements]   (default 64Mi fp16 elements; exit 77 without a GPU)
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "fp8_ref.h"
#include "kvs_cuda.h"

namespace {

constexpr int kReps = 30;
constexpr size_t kFlushBytes = (size_t)256 << 20; /* > 50 MB L2 of H100/H200 */

#define CK_CUDA(call)                                                                      \
    do {                                                                                   \
        cudaError_t e_ = (call);                                                           \
        if (e_ != cudaSuccess) {                                                           \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                  \
                    cudaGetErrorString(e_));                                               \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

#define CK_KVS(call)                                                                       \
    do {                                                                                   \
        int rc_ = (call);                                                                  \
        if (rc_ != 0) {                                                                    \
            fprintf(stderr, "%s:%d: %s: %d (%s)\n", __FILE__, __LINE__, #call, rc_,        \
                    kvs_cuda_last_error());                                                \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

uint64_t g_rng = 0x9E3779B97F4A7C15ull;

uint64_t next_rand()
{
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* KV-like data: mostly |x| in [2^-12, 2^6), some raw fp16 patterns (specials). */
uint16_t rand_fp16()
{
    uint64_t r = next_rand();
    if ((r & 63u) == 0)
        return (uint16_t)(r >> 16);
    uint32_t exp = 3u + (uint32_t)((r >> 8) % 18u); /* biased 3..20 */
    return (uint16_t)(((r >> 40) & 0x8000u) | (exp << 10) | ((r >> 20) & 0x3FFu));
}

struct Op {
    const char *name;
    double bytes; /* DRAM traffic per launch */
    int (*run)();
};

struct Bufs {
    size_t n;
    uint16_t *in;
    float *in32;
    uint8_t *codes;
    uint16_t *out;
    void *copy;
    kvq_fp8_format fmt;
};

Bufs g;

int op_memcpy() { return cudaMemcpyAsync(g.copy, g.in, g.n * 2, cudaMemcpyDeviceToDevice) == cudaSuccess ? 0 : -1; }
int op_enc_kvq() { return kvs_cuda_fp8_roundtrip_fp16(g.in, g.codes, NULL, g.n, g.fmt); }
int op_enc_hw() { return kvs_cuda_fp8_roundtrip_fp16_hw(g.in, g.codes, NULL, g.n, g.fmt); }
int op_rt_kvq() { return kvs_cuda_fp8_roundtrip_fp16(g.in, g.codes, g.out, g.n, g.fmt); }
int op_rt_hw() { return kvs_cuda_fp8_roundtrip_fp16_hw(g.in, g.codes, g.out, g.n, g.fmt); }
int op_f32_kvq() { return kvs_cuda_f32_to_fp8(g.in32, g.codes, g.n, g.fmt); }
int op_f32_hw() { return kvs_cuda_f32_to_fp8_hw(g.in32, g.codes, g.n, g.fmt); }

double time_op(const Op &op, void *flush)
{
    std::vector<float> ms;
    cudaEvent_t a, b;
    CK_CUDA(cudaEventCreate(&a));
    CK_CUDA(cudaEventCreate(&b));
    CK_KVS(op.run()); /* warm-up */
    for (int r = 0; r < kReps; r++) {
        CK_CUDA(cudaMemsetAsync(flush, r & 0xFF, kFlushBytes));
        CK_CUDA(cudaEventRecord(a));
        CK_KVS(op.run());
        CK_CUDA(cudaEventRecord(b));
        CK_CUDA(cudaEventSynchronize(b));
        float t = 0;
        CK_CUDA(cudaEventElapsedTime(&t, a, b));
        ms.push_back(t);
    }
    CK_CUDA(cudaEventDestroy(a));
    CK_CUDA(cudaEventDestroy(b));
    std::sort(ms.begin(), ms.end());
    return (ms[kReps / 2 - 1] + ms[kReps / 2]) / 2.0;
}

/* Whole-output comparison of the device kernels against the host reference. */
bool validate(const std::vector<uint16_t> &h_in, const std::vector<float> &h_in32)
{
    size_t n = g.n;
    std::vector<uint8_t> ref_codes(n), codes(n);
    std::vector<uint16_t> ref_out(n), out(n);
    bool ok = true;
    for (int f = 0; f < 2; f++) {
        g.fmt = f ? KVQ_FP8_E5M2 : KVQ_FP8_E4M3;
        CK_KVS(kvs_ref_fp8_roundtrip_fp16(h_in.data(), ref_codes.data(), ref_out.data(), n, g.fmt));
        for (int hw = 0; hw < 2; hw++) {
            CK_CUDA(cudaMemset(g.codes, 0xA5, n));
            CK_CUDA(cudaMemset(g.out, 0xA5, n * 2));
            CK_KVS(hw ? op_rt_hw() : op_rt_kvq());
            CK_KVS(kvs_cuda_sync());
            CK_CUDA(cudaMemcpy(codes.data(), g.codes, n, cudaMemcpyDeviceToHost));
            CK_CUDA(cudaMemcpy(out.data(), g.out, n * 2, cudaMemcpyDeviceToHost));
            size_t bad_c = 0, bad_o = 0;
            for (size_t i = 0; i < n; i++) {
                bad_c += codes[i] != ref_codes[i];
                bool nan_code = (ref_codes[i] & 0x7F) == 0x7F ||
                                (f && (ref_codes[i] & 0x7F) > 0x7C);
                bad_o += out[i] != ref_out[i] && !(hw && nan_code);
            }
            printf("validate fp16 %s %s: code mismatches %zu, decode mismatches %zu\n",
                   f ? "e5m2" : "e4m3", hw ? "hw " : "kvq", bad_c, bad_o);
            ok = ok && bad_c == 0 && bad_o == 0;
        }
        CK_KVS(kvs_ref_f32_to_fp8(h_in32.data(), ref_codes.data(), n, g.fmt));
        for (int hw = 0; hw < 2; hw++) {
            CK_CUDA(cudaMemset(g.codes, 0x5A, n));
            CK_KVS(hw ? op_f32_hw() : op_f32_kvq());
            CK_KVS(kvs_cuda_sync());
            CK_CUDA(cudaMemcpy(codes.data(), g.codes, n, cudaMemcpyDeviceToHost));
            size_t bad_c = 0;
            for (size_t i = 0; i < n; i++)
                bad_c += codes[i] != ref_codes[i];
            printf("validate f32  %s %s: code mismatches %zu\n", f ? "e5m2" : "e4m3",
                   hw ? "hw " : "kvq", bad_c);
            ok = ok && bad_c == 0;
        }
    }
    return ok;
}

} // namespace

int main(int argc, char **argv)
{
    int ndev = 0;
    if (kvs_cuda_device_count(&ndev) != 0) {
        printf("SKIP fp8_bw: no usable GPU (%s)\n", kvs_cuda_last_error());
        return 77;
    }
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 0) : ((size_t)64 << 20);
    n &= ~(size_t)7;
    if (n == 0) {
        fprintf(stderr, "usage: fp8_bw [elements]\n");
        return 2;
    }
    cudaDeviceProp p;
    CK_CUDA(cudaGetDeviceProperties(&p, 0));
    printf("device: %s (cc %d.%d), n = %zu fp16 elements (%.1f MiB), %d reps, median\n", p.name,
           p.major, p.minor, n, n * 2.0 / (1 << 20), kReps);

    std::vector<uint16_t> h_in(n);
    std::vector<float> h_in32(n);
    for (size_t i = 0; i < n; i++) {
        h_in[i] = rand_fp16();
        h_in32[i] = kvq_fp16_to_f32(h_in[i]) * 1.1f;
    }
    void *flush = NULL;
    g.n = n;
    CK_CUDA(cudaMalloc((void **)&g.in, n * 2));
    CK_CUDA(cudaMalloc((void **)&g.in32, n * 4));
    CK_CUDA(cudaMalloc((void **)&g.codes, n));
    CK_CUDA(cudaMalloc((void **)&g.out, n * 2));
    CK_CUDA(cudaMalloc(&g.copy, n * 2));
    CK_CUDA(cudaMalloc(&flush, kFlushBytes));
    CK_CUDA(cudaMemcpy(g.in, h_in.data(), n * 2, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(g.in32, h_in32.data(), n * 4, cudaMemcpyHostToDevice));

    if (!validate(h_in, h_in32)) {
        printf("FAIL fp8_bw: validation failed, not timing\n");
        return 1;
    }

    const double N = (double)n;
    const Op ops[] = {
        {"memcpy D2D (fp16 bytes)", 4 * N, op_memcpy},
        {"encode fp16->fp8 kvq", 3 * N, op_enc_kvq},
        {"encode fp16->fp8 hw", 3 * N, op_enc_hw},
        {"roundtrip fp16->fp8->fp16 kvq", 5 * N, op_rt_kvq},
        {"roundtrip fp16->fp8->fp16 hw", 5 * N, op_rt_hw},
        {"encode f32->fp8 kvq", 5 * N, op_f32_kvq},
        {"encode f32->fp8 hw", 5 * N, op_f32_hw},
    };
    double memcpy_gbs = 0;
    printf("%-6s %-32s %12s %10s %10s %8s\n", "format", "op", "traffic MB", "median us",
           "GB/s", "vs copy");
    for (int f = 0; f < 2; f++) {
        g.fmt = f ? KVQ_FP8_E5M2 : KVQ_FP8_E4M3;
        for (const Op &op : ops) {
            if (f == 1 && op.run == op_memcpy)
                continue;
            double ms = time_op(op, flush);
            double gbs = op.bytes / (ms * 1e-3) / 1e9;
            if (op.run == op_memcpy)
                memcpy_gbs = gbs;
            printf("%-6s %-32s %12.1f %10.1f %10.1f %7.2fx\n",
                   op.run == op_memcpy ? "-" : (f ? "e5m2" : "e4m3"), op.name, op.bytes / 1e6,
                   ms * 1e3, gbs, gbs / memcpy_gbs);
        }
    }
    cudaFree(g.in);
    cudaFree(g.in32);
    cudaFree(g.codes);
    cudaFree(g.out);
    cudaFree(g.copy);
    cudaFree(flush);
    printf("PASS fp8_bw: outputs validated, timings above\n");
    return 0;
}
