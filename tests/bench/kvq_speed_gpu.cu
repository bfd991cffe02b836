/*
 * kvq_speed_gpu.cu — throughput of the CUDA tile kernels (kvs_cuda.h) against a
 * device-to-device cudaMemcpy of the same source bytes, in the same run.
 *
 *   extern "C" int kvq_speed_gpu(FILE *out);   0 ok, 77 no GPU, 1 failure
 *
 * Called by tests/bench/kvq_speed.c when it is built with CUDA, and by
 * tests/gpu/kvq_tile_bw.c (tests/gpu/run.sh) on its own.
 *
 * Workload: fp16 KV as a worker holds it, [layers][T][H = 8 heads][D = 128]
 * per kind, so a tile (layer l, head h) is a strided view (stride H * D) and a
 * launch quantizes layers * 8 tiles of one kind: E4M3, k = 2 outliers, no
 * sinks unless said. Data: realistic random KV (outlier channels in K, heavy
 * first token, sparse spikes), fixed seed.
 *
 * Validate first, then time (STYLE.md): before any timing, every launch shape
 * is run once and sampled tiles (up to 8, first and last included) are sealed
 * and compared byte for byte with kvs_tile_quantize_ref, and their dequantized
 * fp16 views with kvs_tile_dequantize_ref; a mismatch stops the benchmark
 * (exit 1). Timing: median of kReps launches, each timed alone with CUDA
 * events after a read-only pass over a buffer twice the L2 size (so every
 * launch starts from DRAM, without dirty lines of the flush to write back).
 * Traffic counted: quantize 3 bytes per element (2 read + 1 written),
 * dequantize to fp16 3 bytes (1 read + 2 written), copy 4 bytes per element
 * (read + write of the fp16 source); metadata is not counted. "vs copy" is the
 * ratio of those GB/s.
 *
 * Rows labelled "koff ..." run K tiles with key offsets (kv_format.h rule 5).
 * Rows labelled "kvarN ..." run the K tiles with kvs_cuda_tile_tuning.k_variant
 * = N (the column-warp kernels of tile_quant_k_cols.cu; K rows only; 4 = split
 * rows, two launches); "big"
 * launches (2048 x T=256: 134 MB, 256 x T=1024: 67 MB of fp16) show the kernels
 * beyond launch latency.
 *
 * Last line: RESULT gpu_quant_vs_d2d=<r> gpu_dequant_vs_d2d=<r>, each the
 * smallest ratio over the launches of at least 1,000 token rows (tiles x T)
 * with automatic tuning, K and V alike (the small launch is shown, not
 * counted).
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "kvs_cuda.h" /* kvq.h too, with C linkage */

extern "C" int kvq_speed_gpu(FILE *out);

namespace
{

constexpr int kReps = 30;
constexpr int kHeads = 8;
constexpr int kDim = 128;
constexpr unsigned kMinRows = 1000; /* token rows for a launch to count in RESULT */

struct Fail {
}; /* thrown on any error after it was printed */

FILE *g_out;

void check_cuda(cudaError_t e, const char *what, int line)
{
    if (e != cudaSuccess) {
        fprintf(g_out, "FAIL kvq_speed_gpu:%d: %s: %s (%s)\n", line, what, cudaGetErrorString(e),
                cudaGetErrorName(e));
        throw Fail();
    }
}

void check_kvs(int rc, const char *what, int line)
{
    if (rc != 0) {
        fprintf(g_out, "FAIL kvq_speed_gpu:%d: %s -> %d (%s)\n", line, what, rc,
                kvs_cuda_last_error());
        throw Fail();
    }
}

#define CK(call)  check_cuda((call), #call, __LINE__)
#define CKV(call) check_kvs((call), #call, __LINE__)

uint64_t g_rng;

uint64_t rnd()
{
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float gauss()
{
    double s = 0;
    for (int i = 0; i < 4; i++)
        s += (double)(rnd() >> 11) * (1.0 / 9007199254740992.0);
    return (float)(s - 2.0) * 1.7f;
}

/* Reads a buffer larger than L2 so the next launch finds none of its data
 * cached (and no dirty lines to write back). */
__global__ void flush_kernel(const uint4 *p, size_t n, unsigned *sink)
{
    uint32_t acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9E3779B9u)
        *sink = acc;
}

struct Dev {
    cudaDeviceProp prop;
    uint4 *flush = nullptr;
    size_t flush_n = 0;
    unsigned *sink = nullptr;
    cudaEvent_t a, b;
};

void flush_l2(Dev &d)
{
#if defined(KVS_CUDA_HOST_EMU) /* a CPU harness has no cache to flush and no <<< >>> */
    (void)d;
#else
    flush_kernel<<<d.prop.multiProcessorCount * 4, 256>>>(d.flush, d.flush_n, d.sink);
    CK(cudaGetLastError());
#endif
}

/* Median time in microseconds of op() over kReps launches, each after a flush. */
template <typename F> double time_us(Dev &d, F op)
{
    std::vector<float> ms;
    op(); /* warm-up (module load, first-touch) */
    CK(cudaDeviceSynchronize());
    for (int r = 0; r < kReps; r++) {
        flush_l2(d);
        CK(cudaEventRecord(d.a));
        op();
        CK(cudaEventRecord(d.b));
        CK(cudaEventSynchronize(d.b));
        float t = 0;
        CK(cudaEventElapsedTime(&t, d.a, d.b));
        ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return (ms[kReps / 2 - 1] + ms[kReps / 2]) * 0.5 * 1000.0;
}

struct Shape {
    const char *label;
    unsigned T, layers; /* tiles = layers * kHeads per kind */
    kvs_scheme scheme;
    kvs_dtype dt;
    unsigned k, S;
    bool counts;  /* in RESULT */
    int k_strip;  /* tuning for K (0 = auto) */
    int v_chunks; /* tuning for V (0 = auto) */
    int k_var;    /* K kernel variant (kvs_cuda_tile_tuning.k_variant; 0 = strip kernel) */
    bool koff;    /* K tiles with key offsets (kv_format.h rule 5) */
};

struct Row {
    char name[96];
    double copy_us, q_us, dq_us, q_ratio, dq_ratio;
};

/* One shape and one kind: build, validate, time. */
Row run_shape(Dev &d, const Shape &sh, kvs_tile_kind kind, bool time_copy, double copy_us_in)
{
    const unsigned T = sh.T, D = kDim, n = sh.layers * kHeads;
    const size_t es = sh.dt == KVS_DTYPE_FP32 ? 4 : 2;
    const size_t elems = (size_t)sh.layers * T * kHeads * D; /* = n * T * D */
    kvs_tile_params p = {sh.scheme, kind, T, D, sh.k, sh.S, NULL, 0.0f, 0};
    p.key_offsets = sh.koff && kind == KVS_TILE_K;
    const size_t tsize = kvs_tile_size(&p), slot = (tsize + 255) / 256 * 256;

    /* Source [layers][T][H][D]; K has outlier channels, every token 0 is heavy.
     * Kept per (T, layers, dtype, kind), so the variant rows of the big launches
     * do not generate 134 MB again. */
    static std::map<uint64_t, std::vector<unsigned char>> cache;
    const uint64_t ckey = ((uint64_t)T << 40) | ((uint64_t)sh.layers << 16) |
                          ((uint64_t)sh.dt << 8) | (uint64_t)kind;
    std::vector<unsigned char> &h_src = cache[ckey];
    if (h_src.size() != elems * es) {
        h_src.resize(elems * es);
        g_rng = 0xC0FFEEull + T * 131u + sh.layers + (unsigned)kind * 7u;
        for (size_t i = 0; i < elems; i++) {
            const size_t d_ = i % D, t = (i / (D * kHeads)) % T;
            float x = gauss() * 0.6f;
            if (kind == KVS_TILE_K && d_ % 29 == 5)
                x *= 24.0f;
            if (rnd() % 97 == 0)
                x *= 40.0f;
            if (t == 0)
                x *= 30.0f;
            if (sh.dt == KVS_DTYPE_FP32) {
                memcpy(&h_src[i * 4], &x, 4);
            } else {
                uint16_t h = sh.dt == KVS_DTYPE_FP16 ? kvq_f32_to_fp16(x) : kvq_f32_to_bf16(x);
                memcpy(&h_src[i * 2], &h, 2);
            }
        }
    }
    void *d_src = nullptr, *d_copy = nullptr, *d_tiles = nullptr, *d_out = nullptr;
    kvs_cuda_tile_job *d_jobs = nullptr;
    kvs_cuda_detile_job *d_djobs = nullptr;
    CK(cudaMalloc(&d_src, elems * es));
    CK(cudaMalloc(&d_copy, elems * es));
    CK(cudaMalloc(&d_tiles, n * slot));
    CK(cudaMalloc(&d_out, elems * 2));
    CK(cudaMalloc((void **)&d_jobs, n * sizeof(kvs_cuda_tile_job)));
    CK(cudaMalloc((void **)&d_djobs, n * sizeof(kvs_cuda_detile_job)));
    CK(cudaMemcpy(d_src, h_src.data(), elems * es, cudaMemcpyHostToDevice));
    std::vector<kvs_cuda_tile_job> jobs(n);
    std::vector<kvs_cuda_detile_job> djobs(n);
    const size_t stride = (size_t)kHeads * D;
    for (unsigned i = 0; i < n; i++) {
        const unsigned l = i / kHeads, h = i % kHeads;
        const size_t off = ((size_t)l * T * kHeads + h) * D; /* element (l, t=0, h, d=0) */
        jobs[i].src = (unsigned char *)d_src + off * es;
        jobs[i].stride = stride;
        jobs[i].dst = (unsigned char *)d_tiles + (size_t)i * slot;
        jobs[i].static_scales = nullptr;
        djobs[i].tile = jobs[i].dst;
        djobs[i].dst = (unsigned char *)d_out + off * 2;
        djobs[i].stride = stride;
    }
    CK(cudaMemcpy(d_jobs, jobs.data(), n * sizeof jobs[0], cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_djobs, djobs.data(), n * sizeof djobs[0], cudaMemcpyHostToDevice));

    kvs_cuda_tile_tuning tu = {sh.k_strip, sh.v_chunks, sh.k_var};
    kvs_cuda_tile_set_tuning(&tu);

    Row row;
    snprintf(row.name, sizeof row.name, "%s %s %s %ux T=%u k=%u S=%u", sh.label,
             kind == KVS_TILE_K ? "K" : "V",
             sh.scheme == KVS_SCHEME_INT8       ? "int8"
             : sh.scheme == KVS_SCHEME_FP8_E5M2 ? "e5m2"
                                                : "e4m3",
             n, T, sh.k, sh.S);

    /* Validate: poisoned outputs, one launch each, sampled tiles vs reference. */
    CK(cudaMemset(d_tiles, 0xA5, n * slot));
    CK(cudaMemset(d_out, 0xA5, elems * 2));
    CKV(kvs_cuda_quantize_tiles(&p, sh.dt, d_jobs, n, NULL));
    CKV(kvs_cuda_dequantize_tiles(&p, KVS_DTYPE_FP16, d_djobs, n, NULL));
    CK(cudaDeviceSynchronize());
    std::vector<unsigned char> got(tsize), ref(tsize);
    std::vector<uint16_t> dq_got((size_t)T * stride), dq_ref((size_t)T * stride);
    char err[256];
    const unsigned samples[8] = {0,           n - 1,           n / 2, 1 % n,
                                 (n / 3) % n, (2 * n / 3) % n, 7 % n, (n - 2) % n};
    for (unsigned si = 0; si < 8; si++) {
        const unsigned i = samples[si];
        const unsigned l = i / kHeads, h = i % kHeads;
        const size_t off = ((size_t)l * T * kHeads + h) * D;
        CK(cudaMemcpy(got.data(), jobs[i].dst, tsize, cudaMemcpyDeviceToHost));
        int rc = kvs_tile_seal(got.data(), tsize, err);
        int rr = kvs_tile_quantize_ref(&p, &h_src[off * es], sh.dt, stride, ref.data(), tsize, err);
        if (rc != 0 || rr != 0 || memcmp(got.data(), ref.data(), tsize) != 0) {
            size_t b = 0;
            while (b < tsize && got[b] == ref[b])
                b++;
            fprintf(g_out,
                    "FAIL kvq_speed_gpu: %s tile %u differs from kvs_tile_quantize_ref "
                    "(seal %d, ref %d, first byte %zu: 0x%02x vs 0x%02x): not timing\n",
                    row.name, i, rc, rr, b, b < tsize ? got[b] : 0, b < tsize ? ref[b] : 0);
            throw Fail();
        }
        /* Dequantized view (rows of D fp16 at stride H*D) vs the reference's. */
        CK(cudaMemcpy2D(dq_got.data(), D * 2, (unsigned char *)d_out + off * 2, stride * 2, D * 2,
                        T, cudaMemcpyDeviceToHost));
        rr = kvs_tile_dequantize_ref(ref.data(), tsize, KVS_DTYPE_FP16, dq_ref.data(), D, err);
        if (rr != 0 || memcmp(dq_got.data(), dq_ref.data(), (size_t)T * D * 2) != 0) {
            fprintf(g_out,
                    "FAIL kvq_speed_gpu: %s tile %u: dequantized fp16 differs from "
                    "kvs_tile_dequantize_ref (ref %d): not timing\n",
                    row.name, i, rr);
            throw Fail();
        }
    }

    /* Time. */
    const double N = (double)elems;
    row.copy_us = copy_us_in;
    if (time_copy || copy_us_in <= 0)
        row.copy_us = time_us(
            d, [&] { CK(cudaMemcpyAsync(d_copy, d_src, elems * es, cudaMemcpyDeviceToDevice)); });
    row.q_us = time_us(d, [&] { CKV(kvs_cuda_quantize_tiles(&p, sh.dt, d_jobs, n, NULL)); });
    row.dq_us =
        time_us(d, [&] { CKV(kvs_cuda_dequantize_tiles(&p, KVS_DTYPE_FP16, d_djobs, n, NULL)); });
    const double copy_gbs = 2.0 * N * (double)es / (row.copy_us * 1e3);
    row.q_ratio = (N * (es + 1.0) / (row.q_us * 1e3)) / copy_gbs;
    row.dq_ratio = (N * 3.0 / (row.dq_us * 1e3)) / copy_gbs;
    fprintf(g_out, "%-50s %9.2f %9.1f %9.2f %9.1f %7.2fx %9.2f %9.1f %7.2fx\n", row.name,
            N * es / 1e6, row.copy_us, copy_gbs, row.q_us, row.q_ratio,
            N * (es + 1.0) / (row.q_us * 1e3), row.dq_us, row.dq_ratio);
    fflush(g_out);

    kvs_cuda_tile_tuning zero = {0, 0, 0};
    kvs_cuda_tile_set_tuning(&zero);
    cudaFree(d_src);
    cudaFree(d_copy);
    cudaFree(d_tiles);
    cudaFree(d_out);
    cudaFree(d_jobs);
    cudaFree(d_djobs);
    return row;
}

} // namespace

extern "C" int kvq_speed_gpu(FILE *out)
{
    g_out = out != NULL ? out : stdout;
    int ndev = 0;
    if (kvs_cuda_device_count(&ndev) != 0) {
        fprintf(g_out, "SKIP kvq_speed_gpu: no usable GPU (%s)\n", kvs_cuda_last_error());
        return 77;
    }
    Dev d;
    try {
        CK(cudaGetDeviceProperties(&d.prop, 0));
        fprintf(g_out,
                "kvq_speed_gpu: %s (cc %d.%d, %d SMs, L2 %d MiB), median of %d launches, "
                "L2 flushed before each\n",
                d.prop.name, d.prop.major, d.prop.minor, d.prop.multiProcessorCount,
                d.prop.l2CacheSize >> 20, kReps);
        d.flush_n = ((size_t)2 * d.prop.l2CacheSize + 15) / 16;
        if (d.flush_n < ((size_t)64 << 20) / 16)
            d.flush_n = ((size_t)64 << 20) / 16;
        CK(cudaMalloc((void **)&d.flush, d.flush_n * 16));
        CK(cudaMemset(d.flush, 0x11, d.flush_n * 16));
        CK(cudaMalloc((void **)&d.sink, sizeof(unsigned)));
        CK(cudaEventCreate(&d.a));
        CK(cudaEventCreate(&d.b));

        /* label, T, layers (x8 tiles), scheme, dtype, k, S, counts, K strip, V chunks,
         * K variant, key offsets. Rows "kvarN" time only K tiles with
         * kvs_cuda_tile_tuning.k_variant = N (1, 2, 3: column-warp kernels, 4, 8, 16 source bytes
         * per lane; 4: as 1, rows split in 64-row slices over two launches); "big" launches hold
         * 134 MB (2048 tiles x T=256) and 67 MB (256 x T=1024) of fp16. */
        const Shape shapes[] = {
            {"small", 16, 1, KVS_SCHEME_FP8_E4M3, KVS_DTYPE_FP16, 2, 0, false, 0, 0, 0, false},
            {"auto", 256, 1, KVS_SCHEME_FP8_E4M3, KVS_DTYPE_FP16, 2, 0, true, 0, 0, 0, false},
            {"auto", 256, 8, KVS_SCHEME_FP8_E4M3, KVS_DTYPE_FP16, 2, 0, true, 0, 0, 0, false},
            {"auto", 1024, 4, KVS_SCHEME_FP8_E4M3, KVS_DTYPE_FP16, 2, 0, true, 0, 0, 0, false},
            {"auto", 256, 32, KVS_SCHEME_FP8_E4M3, KVS_DTYPE_FP16, 2, 0, true, 0, 0, 0, false},
            {"big auto", 256, 256, KVS_SCHEME_FP8_E4M3, KVS_DTYPE_FP16, 2, 0, true, 0, 0, 0, false},
            {"big auto", 1024, 32, KVS_SCHEME_FP8_E4M3, KVS_DTYPE_FP16, 2, 0, true, 0, 0, 0, false},
            {"auto", 256, 8, KVS_SCHEME_INT8, KVS_DTYPE_FP16, 2, 4, false, 0, 0, 0, false},
            {"auto bf16", 256, 8, KVS_SCHEME_FP8_E4M3, KVS_DTYPE_BF16, 2, 0, false, 0, 0, 0, false},
            {"auto fp32", 256, 8, KVS_SCHEME_FP8_E4M3, KVS_DTYPE_FP32, 2, 0, false, 0, 0, 0, false},
            {"strip16/lane1", 256, 8, KVS_SCHEME_FP8_E4M3, KVS_DTYPE_FP16, 2, 0, false, 16, 1, 0,
             false},
            {"strip32/lane2", 256, 8, KVS_SCHEME_FP8_E4M3, KVS_DTYPE_FP16, 2, 0, false, 32, 2, 0,
             false},
            {"strip64/lane4", 256, 8, KVS_SCHEME_FP8_E4M3, KVS_DTYPE_FP16, 2, 0, false, 64, 4, 0,
             false},
            {"strip16/lane2", 1024, 4, KVS_SCHEME_FP8_E4M3, KVS_DTYPE_FP16, 2, 0, false, 16, 2, 0,
             false},
            {"strip64/lane4", 1024, 4, KVS_SCHEME_FP8_E4M3, KVS_DTYPE_FP16, 2, 0, false, 64, 4, 0,
             false},
#define KVAR(lbl, v)                                                                               \
    {lbl, 16, 1, KVS_SCHEME_FP8_E4M3, KVS_DTYPE_FP16, 2, 0, false, 0, 0, v, false},                \
        {lbl, 256, 1, KVS_SCHEME_FP8_E4M3, KVS_DTYPE_FP16, 2, 0, false, 0, 0, v, false},           \
        {lbl, 256, 8, KVS_SCHEME_FP8_E4M3, KVS_DTYPE_FP16, 2, 0, false, 0, 0, v, false},           \
        {lbl, 1024, 4, KVS_SCHEME_FP8_E4M3, KVS_DTYPE_FP16, 2, 0, false, 0, 0, v, false},          \
        {lbl, 256, 32, KVS_SCHEME_FP8_E4M3, KVS_DTYPE_FP16, 2, 0, false, 0, 0, v, false},          \
        {lbl " big", 256, 256, KVS_SCHEME_FP8_E4M3, KVS_DTYPE_FP16, 2, 0, false, 0, 0, v, false},  \
        {lbl " big", 1024, 32, KVS_SCHEME_FP8_E4M3, KVS_DTYPE_FP16, 2, 0, false, 0, 0, v, false},  \
        {lbl, 256, 8, KVS_SCHEME_INT8, KVS_DTYPE_FP16, 2, 4, false, 0, 0, v, false},               \
        {lbl " bf16", 256, 8, KVS_SCHEME_FP8_E4M3, KVS_DTYPE_BF16, 2, 0, false, 0, 0, v, false},   \
        {lbl " fp32", 256, 8, KVS_SCHEME_FP8_E4M3, KVS_DTYPE_FP32, 2, 0, false, 0, 0, v, false}
            KVAR("kvar1 4B/lane", 1),
            KVAR("kvar2 8B/lane", 2),
            KVAR("kvar3 16B/lane", 3),
            KVAR("kvar4 split", 4),
#undef KVAR
            /* key offsets: the K tiles' own rows (V tiles have none: they time as "auto") */
            {"koff", 256, 8, KVS_SCHEME_FP8_E4M3, KVS_DTYPE_FP16, 2, 0, false, 0, 0, 0, true},
            {"koff", 256, 8, KVS_SCHEME_INT8, KVS_DTYPE_FP16, 3, 1, false, 0, 0, 0, true},
            {"koff big", 256, 256, KVS_SCHEME_FP8_E4M3, KVS_DTYPE_FP16, 2, 0, false, 0, 0, 0, true},
            {"koff big", 1024, 32, KVS_SCHEME_FP8_E4M3, KVS_DTYPE_FP16, 2, 0, false, 0, 0, 0, true},
        };
        fprintf(g_out,
                "source fp16 [layers][T][8 heads][128] unless said; quantize = 3 B/elem "
                "(fp32 source: 5), dequantize to fp16 = 3 B/elem, copy = 2 x source bytes\n");
        fprintf(g_out, "%-50s %9s %9s %9s %9s %8s %9s %9s %8s\n", "launch (tiles x T, D=128)",
                "src MB", "copy us", "copy GB/s", "quant us", "vs copy", "q GB/s", "deq us",
                "vs copy");
        double qmin = 1e9, dqmin = 1e9;
        /* KVS_GPU_BW_ONLY=text: only the launches whose label holds text (for a
         * profiler run; the RESULT line then covers those alone). */
        const char *only = getenv("KVS_GPU_BW_ONLY");
        for (const Shape &sh : shapes) {
            if (only != nullptr && strstr(sh.label, only) == nullptr)
                continue;
            double copy_us = 0;
            for (int kind = 0; kind < 2; kind++) {
                if ((sh.k_var != 0 || sh.koff) && kind == KVS_TILE_V)
                    continue; /* the variants and key offsets are K kernels */
                Row r = run_shape(d, sh, (kvs_tile_kind)kind, kind == 0, copy_us);
                copy_us = r.copy_us;
                if (sh.counts && sh.T * sh.layers * kHeads >= kMinRows) {
                    qmin = std::min(qmin, r.q_ratio);
                    dqmin = std::min(dqmin, r.dq_ratio);
                }
            }
        }
        fprintf(g_out,
                "PASS kvq_speed_gpu: every launch validated against the reference before timing\n");
        fprintf(g_out, "RESULT gpu_quant_vs_d2d=%.2f gpu_dequant_vs_d2d=%.2f\n", qmin, dqmin);
    } catch (const Fail &) {
        return 1;
    }
    cudaFree(d.flush);
    cudaFree(d.sink);
    cudaEventDestroy(d.a);
    cudaEventDestroy(d.b);
    return 0;
}
