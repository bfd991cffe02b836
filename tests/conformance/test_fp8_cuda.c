/*
 * test_fp8_cuda.c — on a GPU: kvq_math.h compiled for the device == CUDA's
 * hardware cvt.rn.satfinite == kvq_math.h on the host, bit for bit.
 *
 *   1. All 65,536 fp16 inputs, E4M3 and E5M2, through the round-trip kernels:
 *      device kvq codes == hardware codes == host codes, and the decoded fp16
 *      of the kvq kernel == the host round trip; the hardware decode must agree
 *      on every non-NaN code (NaN decodes are reported, not judged: they are our
 *      convention, not the instruction's contract). Three shapes: aligned
 *      (128-bit path), aligned with a tail (n % 8 != 0), and misaligned (scalar
 *      path).
 *   2. fp32 through the f32 kernels: the boundary set of fp8_oracle.h (also
 *      held against the oracle; aligned and misaligned), every fp16 value as an
 *      f32 (so cvt from f32 and from f16x2 agree), then 16M random fp32 (raw bit
 *      patterns and values spread over the FP8 ranges).
 * Every output buffer is poisoned before every launch, with two different
 * bytes in two runs, so an element a kernel fails to write cannot match.
 *
 * Self-contained (no CUnit): prints "N passed, M failed" and returns 1 on any
 * failure, 77 (skipped) when there is no usable GPU, 0 otherwise. Built only
 * where CUDA is (main build: KVS_CUDA_ENABLED; tests/gpu: standalone).
 */
#include "fp8_oracle.h"
#include "fp8_ref.h"
#include "kvs_cuda.h"
#include "kvs_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SKIP 77
#define N_FP16 65536u
#define N_RANDOM (16u * 1024u * 1024u)
#define MAX_REPORT 8

static unsigned g_pass, g_fail;

static void report(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void report(int ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "PASS" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (ok)
        g_pass++;
    else
        g_fail++;
}

/* Runs a kvs_cuda_* call; on failure records it and jumps to `out`. */
#define CK(call)                                                               \
    do {                                                                       \
        int rc_ = (call);                                                      \
        if (rc_ != KVS_OK) {                                                   \
            report(0, "%s:%d: %s -> %s (%s)", __FILE__, __LINE__, #call,       \
                   kvs_errname(rc_), kvs_cuda_last_error());                   \
            goto out;                                                          \
        }                                                                      \
    } while (0)

static const char *fmt_name(kvq_fp8_format f) { return f == KVQ_FP8_E5M2 ? "e5m2" : "e4m3"; }

static const uint8_t k_poison[2] = {0xA5, 0x5A};

/* Mismatches of two code arrays; prints the first few with their input. */
static size_t diff_codes(const uint8_t *got, const uint8_t *want, size_t n, const char *what,
                         const void *in, int in_is_f32)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (got[i] == want[i])
            continue;
        if (bad++ < MAX_REPORT) {
            if (in_is_f32)
                printf("  %s[%zu]: in 0x%08x got 0x%02x want 0x%02x\n", what, i,
                       oracle_bits_f32(((const float *)in)[i]), got[i], want[i]);
            else
                printf("  %s[%zu]: in 0x%04x got 0x%02x want 0x%02x\n", what, i,
                       ((const uint16_t *)in)[i], got[i], want[i]);
        }
    }
    return bad;
}

/* 1. every fp16, one format, one shape: elements [off, off + n) of 0..65535. */
static void fp16_case(kvq_fp8_format fmt, size_t off, size_t n, const uint16_t *h_in,
                      uint16_t *d_in, uint8_t *d_codes, uint16_t *d_out)
{
    uint8_t *ref_codes = malloc(n), *codes = malloc(n);
    uint16_t *ref_out = malloc(n * 2), *out = malloc(n * 2);
    const uint16_t *in = h_in + off;
    if (!ref_codes || !codes || !ref_out || !out) {
        report(0, "fp16 %s: out of host memory", fmt_name(fmt));
        goto out;
    }
    CK(kvs_ref_fp8_roundtrip_fp16(in, ref_codes, ref_out, n, fmt));
    for (int hw = 0; hw < 2; hw++) {
        size_t bad_codes = 0, bad_out = 0, nan_decode_diff = 0;
        uint16_t hw_nan = 0;
        for (int p = 0; p < 2; p++) {
            CK(kvs_cuda_memset(d_codes + off, k_poison[p], n));
            CK(kvs_cuda_memset(d_out + off, k_poison[p], n * 2));
            if (hw)
                CK(kvs_cuda_fp8_roundtrip_fp16_hw(d_in + off, d_codes + off, d_out + off, n, fmt));
            else
                CK(kvs_cuda_fp8_roundtrip_fp16(d_in + off, d_codes + off, d_out + off, n, fmt));
            CK(kvs_cuda_sync());
            CK(kvs_cuda_copy_to_host(codes, d_codes + off, n));
            CK(kvs_cuda_copy_to_host(out, d_out + off, n * 2));
            bad_codes += diff_codes(codes, ref_codes, n, hw ? "hw codes" : "kvq codes", in, 0);
            for (size_t i = 0; i < n; i++) {
                int nan_code = (ref_codes[i] & 0x7Fu) == 0x7Fu ||
                               (fmt == KVQ_FP8_E5M2 && (ref_codes[i] & 0x7Fu) > 0x7Cu);
                if (out[i] == ref_out[i])
                    continue;
                if (hw && nan_code && codes[i] == ref_codes[i]) {
                    nan_decode_diff++;
                    hw_nan = out[i];
                    continue;
                }
                if (bad_out++ < MAX_REPORT)
                    printf("  %s out[%zu]: in 0x%04x code 0x%02x got 0x%04x want 0x%04x\n",
                           hw ? "hw" : "kvq", i, in[i], codes[i], out[i], ref_out[i]);
            }
        }
        report(bad_codes == 0, "fp16 %s %s codes == host kvq (%zu elements from %zu, x2 poisons): %zu mismatches",
               fmt_name(fmt), hw ? "hardware cvt" : "device kvq", n, off, bad_codes);
        report(bad_out == 0, "fp16 %s %s decoded fp16 == host round trip%s: %zu mismatches",
               fmt_name(fmt), hw ? "hardware cvt" : "device kvq", hw ? " (non-NaN codes)" : "",
               bad_out);
        if (nan_decode_diff)
            printf("INFO hardware decodes NaN codes to 0x%04x, kvq_math to 0x7fff (%zu elements)\n",
                   hw_nan, nan_decode_diff / 2);
    }
out:
    free(ref_codes);
    free(codes);
    free(ref_out);
    free(out);
}

static void test_all_fp16(void)
{
    uint16_t *h_in = malloc(N_FP16 * 2);
    uint16_t *d_in = NULL, *d_out = NULL;
    uint8_t *d_codes = NULL;
    if (h_in == NULL) {
        report(0, "fp16: out of host memory");
        return;
    }
    for (uint32_t h = 0; h < N_FP16; h++)
        h_in[h] = (uint16_t)h;
    CK(kvs_cuda_alloc((void **)&d_in, N_FP16 * 2));
    CK(kvs_cuda_alloc((void **)&d_codes, N_FP16));
    CK(kvs_cuda_alloc((void **)&d_out, N_FP16 * 2));
    CK(kvs_cuda_copy_to_device(d_in, h_in, N_FP16 * 2));
    for (int f = 0; f < 2; f++) {
        kvq_fp8_format fmt = f ? KVQ_FP8_E5M2 : KVQ_FP8_E4M3;
        fp16_case(fmt, 0, N_FP16, h_in, d_in, d_codes, d_out);     /* 128-bit path */
        fp16_case(fmt, 0, N_FP16 - 3, h_in, d_in, d_codes, d_out); /* + tail */
        fp16_case(fmt, 1, N_FP16 - 1, h_in, d_in, d_codes, d_out); /* misaligned: scalar */
    }
out:
    kvs_cuda_free(d_in);
    kvs_cuda_free(d_codes);
    kvs_cuda_free(d_out);
    free(h_in);
}

/* 2. fp32 inputs h_in[off, off + n) through both f32 kernels vs the host. */
static void f32_case(kvq_fp8_format fmt, const char *what, const float *h_in, size_t off,
                     size_t n, const float *d_in, uint8_t *d_codes, uint8_t *ref, uint8_t *got)
{
    CK(kvs_ref_f32_to_fp8(h_in + off, ref, n, fmt));
    for (int hw = 0; hw < 2; hw++) {
        size_t bad = 0;
        for (int p = 0; p < 2; p++) {
            CK(kvs_cuda_memset(d_codes + off, k_poison[p], n));
            if (hw)
                CK(kvs_cuda_f32_to_fp8_hw(d_in + off, d_codes + off, n, fmt));
            else
                CK(kvs_cuda_f32_to_fp8(d_in + off, d_codes + off, n, fmt));
            CK(kvs_cuda_sync());
            CK(kvs_cuda_copy_to_host(got, d_codes + off, n));
            bad += diff_codes(got, ref, n, hw ? "hw f32" : "kvq f32", h_in + off, 1);
        }
        report(bad == 0, "f32 %s %s: %s codes == host kvq (%zu elements from %zu, x2 poisons): %zu mismatches",
               fmt_name(fmt), what, hw ? "hardware cvt" : "device kvq", n, off, bad);
    }
out:
    return;
}

static void test_f32(void)
{
    enum { CAP = 4096 };
    float *h_in = malloc((size_t)N_RANDOM * sizeof(float));
    uint8_t *ref = malloc(N_RANDOM), *got = malloc(N_RANDOM);
    float *d_in = NULL;
    uint8_t *d_codes = NULL;
    uint64_t st = 0x5EED;
    if (!h_in || !ref || !got) {
        report(0, "f32: out of host memory");
        goto out;
    }
    CK(kvs_cuda_alloc((void **)&d_in, (size_t)N_RANDOM * sizeof(float)));
    CK(kvs_cuda_alloc((void **)&d_codes, N_RANDOM));
    for (int f = 0; f < 2; f++) {
        kvq_fp8_format fmt = f ? KVQ_FP8_E5M2 : KVQ_FP8_E4M3;
        /* Boundary sets of both formats, for either format's encoder. */
        size_t n = oracle_fp8_boundaries(0, h_in, CAP);
        size_t bad = 0;
        n += oracle_fp8_boundaries(1, h_in + n, CAP);
        CK(kvs_ref_f32_to_fp8(h_in, ref, n, fmt));
        for (size_t i = 0; i < n; i++)
            if (ref[i] != oracle_fp8_encode((double)h_in[i], f) && bad++ < MAX_REPORT)
                printf("  oracle: x=%a host 0x%02x\n", (double)h_in[i], ref[i]);
        report(bad == 0, "f32 %s boundaries: host kvq == oracle (%zu values): %zu mismatches",
               fmt_name(fmt), n, bad);
        CK(kvs_cuda_copy_to_device(d_in, h_in, n * sizeof(float)));
        f32_case(fmt, "boundaries", h_in, 0, n, d_in, d_codes, ref, got);
        f32_case(fmt, "boundaries misaligned", h_in, 1, n - 1, d_in, d_codes, ref, got);
    }
    /* Every fp16 value as an f32: the f32 and f16x2 instructions must agree. */
    for (uint32_t h = 0; h < N_FP16; h++)
        h_in[h] = kvq_fp16_to_f32((uint16_t)h);
    CK(kvs_cuda_copy_to_device(d_in, h_in, N_FP16 * sizeof(float)));
    f32_case(KVQ_FP8_E4M3, "all fp16 values", h_in, 0, N_FP16, d_in, d_codes, ref, got);
    f32_case(KVQ_FP8_E5M2, "all fp16 values", h_in, 0, N_FP16, d_in, d_codes, ref, got);
    for (size_t i = 0; i < N_RANDOM; i++)
        h_in[i] = oracle_rand_f32(&st);
    CK(kvs_cuda_copy_to_device(d_in, h_in, (size_t)N_RANDOM * sizeof(float)));
    f32_case(KVQ_FP8_E4M3, "random", h_in, 0, N_RANDOM, d_in, d_codes, ref, got);
    f32_case(KVQ_FP8_E5M2, "random", h_in, 0, N_RANDOM, d_in, d_codes, ref, got);
out:
    kvs_cuda_free(d_in);
    kvs_cuda_free(d_codes);
    free(h_in);
    free(ref);
    free(got);
}

int main(void)
{
    int ndev = 0, major = 0, minor = 0, arch = 0;
    char name[256];
    int rc = kvs_cuda_device_count(&ndev);
    if (rc != KVS_OK) {
        printf("SKIP test_fp8_cuda: no usable GPU (%s)\n", kvs_cuda_last_error());
        return SKIP;
    }
    if (kvs_cuda_device_info(name, sizeof name, &major, &minor) != KVS_OK) {
        printf("FAIL device info: %s\n", kvs_cuda_last_error());
        return 1;
    }
    printf("device 0: %s, compute capability %d.%d (%d device(s))\n", name, major, minor, ndev);
    if (major * 10 + minor < 89) {
        printf("SKIP test_fp8_cuda: FP8 conversions need compute capability >= 8.9\n");
        return SKIP;
    }
    rc = kvs_cuda_kernel_arch(&arch);
    report(rc == KVS_OK && arch >= 890,
           "kernel image runs as __CUDA_ARCH__ %d (hardware FP8 cvt needs >= 890)%s%s",
           arch, rc == KVS_OK ? "" : ": ", rc == KVS_OK ? "" : kvs_cuda_last_error());
    if (rc != KVS_OK)
        goto done;
    test_all_fp16();
    test_f32();
done:
    printf("test_fp8_cuda: %u passed, %u failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
