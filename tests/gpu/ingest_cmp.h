/*
 * ingest_cmp.h — the GPU ingest backend against the CPU one, in-process: one
 * function shared by tests/gpu/ingest_codec_gpu.c (standalone, the GPU
 * machine's check, no gRPC needed) and tests/integration/test_ingest_gpu.c
 * (CUnit, beside its Put/Get check through kvstashd).
 *
 * kvs_ingest_cmp_run encodes blocks with kvs_codec_encode(KVS_CODEC_GPU) and
 * kvs_codec_encode(KVS_CODEC_CPU) from the same payload and compares them
 * whole (header, scheme table, every tile) and their measured errors, over
 * fp16/bf16/fp32 sources, the four schemes and a mixed block (skip layers),
 * root blocks (sinks) and not, with per-tensor scales (kvs_codec_layout's
 * k/v_tensor_scales, what a model rule's profile gives) and without, with
 * key offsets (kvs_codec_layout.key_offsets) and without, two shapes. The GPU output buffer starts
 * with other bytes than the CPU's, so a byte the GPU path failed to write shows. Returns the number
 * of failed comparisons (0 = all equal); *blocks gets the number of blocks compared, and what
 * differed is printed to stderr.
 */
#ifndef KVS_INGEST_CMP_H
#define KVS_INGEST_CMP_H

#include "codec.h"
#include "kvs_error.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* xorshift64*: values mostly in [-2, 2), one in 256 a hundred times larger (outliers). */
static inline float kvs_ingest_cmp_rnd(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    uint64_t r = *s * 2685821657736338717ull;
    float u = (float)((r >> 40) & 0xffffff) / 16777216.0f - 0.5f;
    return (r & 0xff) == 0 ? u * 400.0f : u * 4.0f;
}

/* fp32 -> fp16 / bf16 bits, round to nearest even (finite inputs). */
static inline uint16_t kvs_ingest_cmp_half(float f, unsigned dtype)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if (dtype == 2) {
        u += 0x7fff + ((u >> 16) & 1);
        return (uint16_t)(u >> 16);
    }
    uint32_t sign = (u >> 16) & 0x8000, mag = u & 0x7fffffff;
    if (mag >= 0x477ff000u) /* rounds to >= 65520: inf */
        return (uint16_t)(sign | 0x7c00);
    if (mag < 0x38800000u) { /* subnormal half */
        float a;
        memcpy(&a, &mag, 4);
        float q = a * 16777216.0f; /* units of 2^-24 */
        uint32_t n = (uint32_t)q;
        float rem = q - (float)n;
        if (rem > 0.5f || (rem == 0.5f && (n & 1)))
            n++;
        return (uint16_t)(sign | n);
    }
    uint32_t r = mag + 0xfff + ((mag >> 13) & 1) - 0x38000000u;
    return (uint16_t)(sign | (r >> 13));
}

static inline void *kvs_ingest_cmp_tensor(unsigned dtype, size_t n, uint64_t *s)
{
    size_t es = dtype == 3 ? 4 : 2;
    uint8_t *p = malloc(n * es);
    for (size_t i = 0; p && i < n; i++) {
        float x = kvs_ingest_cmp_rnd(s);
        if (dtype == 3) {
            memcpy(p + 4 * i, &x, 4);
        } else {
            uint16_t h = kvs_ingest_cmp_half(x, dtype);
            memcpy(p + 2 * i, &h, 2);
        }
    }
    return p;
}

static inline int kvs_ingest_cmp_run(unsigned *blocks)
{
    static const uint32_t shapes[][4] = {{4, 4, 128, 64}, {3, 2, 64, 32}}; /* L H D T */
    static const uint8_t tabs[][4] = {
        {1, 1, 1, 1}, {2, 2, 2, 2}, {3, 3, 3, 3}, {4, 4, 4, 4}, {1, 4, 2, 1}};
    /* Below and above the data's amax / qmax (groups aligned up, and down). */
    static const float k_ts[4] = {0.0123f, 0.31f, 7.1e-4f, 2.5f};
    static const float v_ts[4] = {0.07f, 0.0019f, 0.9f, 1e-5f};
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    int failed = 0;
    *blocks = 0;
    for (size_t sh = 0; sh < 2; sh++) {
        uint32_t L = shapes[sh][0], H = shapes[sh][1], D = shapes[sh][2], T = shapes[sh][3];
        size_t n = (size_t)T * H * D;
        for (unsigned dtype = 1; dtype <= 3; dtype++) {
            for (size_t si = 0; si < sizeof tabs / sizeof tabs[0]; si++) {
                for (int rk = 0; rk < 4; rk++) {
                    /* Per-tensor scales (a model rule's profile) on every other block:
                     * each scheme table gets them with root or without; key offsets
                     * (kv_format.h rule 5) with and without root. */
                    const int root = rk & 1, koff = rk >> 1;
                    int ts = (int)((si + (size_t)root) % 2);
                    kvs_codec_layout lay = {L, H, D,        T,    dtype, root, 2,
                                            1, 4, tabs[si], NULL, NULL,  koff};
                    lay.k_tensor_scales = ts ? k_ts : NULL;
                    lay.v_tensor_scales = ts ? v_ts : NULL;
                    char err[KVS_ERR_LEN] = "";
                    size_t size = kvs_codec_block_size(&lay, err);
                    void *k[4] = {0}, *v[4] = {0};
                    for (uint32_t l = 0; l < L; l++) {
                        k[l] = kvs_ingest_cmp_tensor(dtype, n, &seed);
                        v[l] = kvs_ingest_cmp_tensor(dtype, n, &seed);
                    }
                    size_t cap = (size + 63) / 64 * 64;
                    uint8_t *cpu = aligned_alloc(64, cap ? cap : 64);
                    uint8_t *gpu = aligned_alloc(64, cap ? cap : 64);
                    float ke[2][4] = {{0}}, ve[2][4] = {{0}};
                    int rc1 = -1, rc2 = -1;
                    if (size && cpu && gpu) {
                        memset(cpu, 0xAA, size);
                        memset(gpu, 0x55, size);
                        rc1 =
                            kvs_codec_encode(KVS_CODEC_CPU, &lay, (const void *const *)k,
                                             (const void *const *)v, cpu, size, ke[0], ve[0], err);
                        if (rc1 == 0)
                            rc2 = kvs_codec_encode(KVS_CODEC_GPU, &lay, (const void *const *)k,
                                                   (const void *const *)v, gpu, size, ke[1], ve[1],
                                                   err);
                    }
                    const char *why = NULL;
                    size_t at = 0;
                    if (rc1 != 0 || rc2 != 0) {
                        why = "encode failed";
                    } else if (memcmp(cpu, gpu, size) != 0) {
                        while (cpu[at] == gpu[at])
                            at++;
                        why = "blocks differ";
                    } else if (memcmp(ke[0], ke[1], sizeof ke[0]) != 0 ||
                               memcmp(ve[0], ve[1], sizeof ve[0]) != 0) {
                        why = "measured errors differ";
                    }
                    if (why) {
                        fprintf(stderr,
                                "FAIL L%u H%u D%u T%u dtype %u schemes %u%u%u%u root %d "
                                "tensor scales %d key offsets %d: %s (cpu %d, gpu %d: %s; first "
                                "difference at byte %zu of %zu)\n",
                                L, H, D, T, dtype, tabs[si][0], tabs[si][1], tabs[si][2],
                                tabs[si][3], root, ts, koff, why, rc1, rc2, err, at, size);
                        failed++;
                    }
                    (*blocks)++;
                    free(cpu);
                    free(gpu);
                    for (uint32_t l = 0; l < L; l++) {
                        free(k[l]);
                        free(v[l]);
                    }
                }
            }
        }
    }
    return failed;
}

#endif /* KVS_INGEST_CMP_H */
