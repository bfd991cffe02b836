/*
 * kvq_cpu.c — the fast CPU path's front: run-time ISA choice, the argument
 * checks, header, zero padding and checksum that every ISA shares.
 *
 * The checks mirror kvs_tile_quantize_ref / kvs_tile_dequantize_ref in their
 * order and codes, so both paths reject the same calls the same way. The ISA
 * files then fill the payload's parts; this file zeroes only the alignment
 * gaps and the tail (the parts themselves are written in full), writes the
 * header exactly as the reference does and checksums the payload.
 *
 * ISA state: one atomic int, -1 until the first call picks the best ISA the
 * CPU and the build support, capped by KVSTASH_CPU_ISA (read once, then);
 * kvs_cpu_isa_force overwrites it. Each call reads it once.
 */
#include "kvq_cpu.h"
#include "kvq_cpu_impl.h"

#include "kvs_error.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static atomic_int g_isa = -1;

#if defined(KVS_CPU_HAVE_AVX2) || defined(KVS_CPU_HAVE_AVX512)
#include <cpuid.h>

/* F16C (CPUID.1:ECX bit 29): not every compiler's __builtin_cpu_supports
 * knows the name. Its instructions use the AVX state, which the avx2/avx512
 * checks below already require the OS to enable. */
static int has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
#endif

kvs_cpu_isa kvs_cpu_isa_detect(void)
{
#if defined(KVS_CPU_HAVE_AVX2) || defined(KVS_CPU_HAVE_AVX512)
    __builtin_cpu_init();
    if (!has_f16c())
        return KVS_CPU_PORTABLE;
#endif
#if defined(KVS_CPU_HAVE_AVX512)
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
        return KVS_CPU_AVX512;
#endif
#if defined(KVS_CPU_HAVE_AVX2)
    if (__builtin_cpu_supports("avx2"))
        return KVS_CPU_AVX2;
#endif
    return KVS_CPU_PORTABLE;
}

const char *kvs_cpu_isa_name(kvs_cpu_isa isa)
{
    switch (isa) {
    case KVS_CPU_PORTABLE:
        return "portable";
    case KVS_CPU_AVX2:
        return "avx2";
    case KVS_CPU_AVX512:
        return "avx512";
    }
    return "?";
}

/* The automatic choice: detect(), capped by KVSTASH_CPU_ISA when it names an ISA. */
static kvs_cpu_isa default_isa(void)
{
    kvs_cpu_isa best = kvs_cpu_isa_detect();
    const char *env = getenv("KVSTASH_CPU_ISA");
    if (env == NULL)
        return best;
    for (int i = KVS_CPU_PORTABLE; i <= KVS_CPU_AVX512; i++)
        if (strcasecmp(env, kvs_cpu_isa_name((kvs_cpu_isa)i)) == 0)
            return (kvs_cpu_isa)i < best ? (kvs_cpu_isa)i : best;
    return best;
}

kvs_cpu_isa kvs_cpu_isa_active(void)
{
    int isa = atomic_load_explicit(&g_isa, memory_order_relaxed);
    if (isa < 0) {
        int want = (int)default_isa();
        int expected = -1;
        /* A concurrent kvs_cpu_isa_force wins over the default. */
        if (!atomic_compare_exchange_strong(&g_isa, &expected, want))
            want = expected;
        isa = want;
    }
    return (kvs_cpu_isa)isa;
}

int kvs_cpu_isa_force(kvs_cpu_isa isa)
{
    if (isa != KVS_CPU_PORTABLE && isa != KVS_CPU_AVX2 && isa != KVS_CPU_AVX512)
        return KVS_EINVAL;
    if (isa > kvs_cpu_isa_detect())
        return KVS_ENODEV;
    atomic_store(&g_isa, (int)isa);
    return 0;
}

static void zero_gap(unsigned char *pay, uint32_t from, uint32_t to)
{
    if (to > from)
        memset(pay + from, 0, to - from);
}

int kvs_tile_quantize(const kvs_tile_params *p, const void *src, kvs_dtype dtype, size_t stride,
                      void *out, size_t cap, char *err)
{
    int rc = kvs_tile_quantize_args(p, src, dtype, stride, out, cap, err);
    if (rc)
        return rc;
    const uint32_t T = p->tokens, D = p->dim, k = p->outliers, S = p->sinks;
    kvs__cpu_qjob j;
    j.src = src;
    j.stride = stride;
    j.dtype = dtype;
    j.scheme = p->scheme;
    j.kind = p->kind;
    j.T = T;
    j.D = D;
    j.k = k;
    j.S = S;
    j.static_scales = p->static_scales;
    j.tensor16 = kvs_tile_tensor_scale_fp16(p);
    j.koff = p->key_offsets != 0; /* K tiles of 8-bit schemes only (kvs_tile_params_check) */
    j.pay = (unsigned char *)out + sizeof(kvs_tile_hdr);
    kvs_tile_layout_ex(p->scheme, p->kind, T, D, k, S, j.koff, &j.l);

    const kvs_tile_layout *l = &j.l;
    if (p->scheme == KVS_SCHEME_FP16) {
        zero_gap(j.pay, T * D * 2u, l->payload);
    } else {
        zero_gap(j.pay, T * D, l->scales);
        zero_gap(j.pay, l->scales + l->groups * 2u, l->outliers);
        zero_gap(j.pay, l->outliers + l->groups * k * l->entry, l->sinks);
        zero_gap(j.pay, l->sinks + S * D * 2u, l->offsets);
        if (j.koff) /* offsets is the payload's end without them */
            zero_gap(j.pay, l->offsets + D * 2u, l->payload);
    }
    switch (kvs_cpu_isa_active()) {
#if defined(KVS_CPU_HAVE_AVX512)
    case KVS_CPU_AVX512:
        kvs__cpu_quantize_avx512(&j);
        break;
#endif
#if defined(KVS_CPU_HAVE_AVX2)
    case KVS_CPU_AVX2:
        kvs__cpu_quantize_avx2(&j);
        break;
#endif
    default:
        kvs__cpu_quantize_portable(&j);
        break;
    }

    kvs_tile_write_header(p, out);
    return 0;
}

/* kvs_tile_dequantize, and with verified its _verified twin: the tile checks
 * differ in the checksum pass only, the decode is the same. */
static int dequantize(const void *tile, size_t len, int verified, kvs_dtype dtype, void *dst,
                      size_t stride, char *err)
{
    kvs_tile_hdr h;
    int rc = verified ? kvs_tile_dequantize_verified_args(tile, len, dtype, dst, stride, &h, err)
                      : kvs_tile_dequantize_args(tile, len, dtype, dst, stride, &h, err);
    if (rc)
        return rc;
    kvs__cpu_djob j;
    j.pay = (const unsigned char *)tile + sizeof h;
    j.scheme = (kvs_scheme)h.scheme;
    j.kind = (kvs_tile_kind)h.kind;
    j.T = h.tokens;
    j.D = h.dim;
    j.k = h.outliers;
    j.S = h.sinks;
    j.koff = (h.flags & KVS_TILE_F_KOFF) != 0; /* K tiles of 8-bit schemes only (kvs_tile_check) */
    j.dst = dst;
    j.stride = stride;
    j.dtype = dtype;
    kvs_tile_layout_ex(h.scheme, h.kind, j.T, j.D, j.k, j.S, j.koff, &j.l);
    switch (kvs_cpu_isa_active()) {
#if defined(KVS_CPU_HAVE_AVX512)
    case KVS_CPU_AVX512:
        kvs__cpu_dequantize_avx512(&j);
        break;
#endif
#if defined(KVS_CPU_HAVE_AVX2)
    case KVS_CPU_AVX2:
        kvs__cpu_dequantize_avx2(&j);
        break;
#endif
    default:
        kvs__cpu_dequantize_portable(&j);
        break;
    }
    return 0;
}

void kvs_cpu_fp16_widen_inplace(float *t, size_t n)
{
#if defined(KVS_CPU_HAVE_AVX2)
    if (kvs_cpu_isa_active() >= KVS_CPU_AVX2) { /* every AVX-512 CPU has AVX2 and F16C */
        kvs__cpu_widen_avx2(t, n);
        return;
    }
#endif
    kvs__cpu_widen_portable(t, n);
}

int kvs_tile_dequantize(const void *tile, size_t len, kvs_dtype dtype, void *dst, size_t stride,
                        char *err)
{
    return dequantize(tile, len, 0, dtype, dst, stride, err);
}

int kvs_tile_dequantize_verified(const void *tile, size_t len, kvs_dtype dtype, void *dst,
                                 size_t stride, char *err)
{
    return dequantize(tile, len, 1, dtype, dst, stride, err);
}
