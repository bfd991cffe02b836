/*
 * kvq_cpu_impl.h — what the files of the fast CPU path share (private to
 * kernels/cpu/; the public API is kvq_cpu.h).
 *
 * kvq_cpu.c checks arguments, fills the header, zeroes the padding and
 * computes the checksum; the per-ISA files (kvq_cpu_portable.c,
 * kvq_cpu_avx2.c, kvq_cpu_avx512.c) fill the payload's parts, each one the
 * same body (kvq_cpu_body.h) over its own vector layer. A job is fully
 * validated before an ISA function sees it: those functions never fail.
 */
#ifndef KVQ_CPU_IMPL_H
#define KVQ_CPU_IMPL_H

#include "kv_format.h"
#include "kvq.h"

#include <stddef.h>
#include <stdint.h>

/* One tile to quantize: a validated source view and the payload to fill. */
typedef struct kvs__cpu_qjob {
    const void *src; /* element (t, d) at src[t * stride + d] */
    size_t stride;   /* in elements, >= D */
    kvs_dtype dtype;
    kvs_scheme scheme;
    kvs_tile_kind kind;
    uint32_t T, D, k, S;
    const float *static_scales; /* NULL or G scales */
    uint16_t tensor16;          /* 0, or the fp16 per-tensor scale to align to */
    unsigned koff;              /* K tiles: per-channel key offsets (kv_format.h rule 5) */
    unsigned char *pay;         /* payload start (any alignment) */
    kvs_tile_layout l;          /* kvs_tile_layout_ex, koff included */
} kvs__cpu_qjob;

/* One checked tile to decode into a validated destination view. */
typedef struct kvs__cpu_djob {
    const unsigned char *pay; /* payload start (any alignment) */
    kvs_tile_layout l;        /* kvs_tile_layout_ex, koff included */
    kvs_scheme scheme;
    kvs_tile_kind kind;
    uint32_t T, D, k, S;
    unsigned koff; /* KVS_TILE_F_KOFF (K tiles only, kvs_tile_check) */
    void *dst;     /* element (t, d) at dst[t * stride + d] */
    size_t stride; /* in elements, >= D */
    kvs_dtype dtype;
} kvs__cpu_djob;

/* Quantize fills every payload byte that carries data: codes (sink rows and
 * outlier positions included, as 0), scales, outlier slots, sinks and key
 * offsets, or the whole fp16 array. The alignment gaps and the tail are kvq_cpu.c's job.
 * Dequantize writes the T x D elements of the view. */
/* kvs_cpu_fp16_widen_inplace per ISA (the AVX-512 path uses the AVX2 one). */
void kvs__cpu_widen_portable(float *t, size_t n);
void kvs__cpu_widen_avx2(float *t, size_t n);

void kvs__cpu_quantize_portable(const kvs__cpu_qjob *j);
void kvs__cpu_dequantize_portable(const kvs__cpu_djob *j);
#if defined(KVS_CPU_HAVE_AVX2)
void kvs__cpu_quantize_avx2(const kvs__cpu_qjob *j);
void kvs__cpu_dequantize_avx2(const kvs__cpu_djob *j);
#endif
#if defined(KVS_CPU_HAVE_AVX512)
void kvs__cpu_quantize_avx512(const kvs__cpu_qjob *j);
void kvs__cpu_dequantize_avx512(const kvs__cpu_djob *j);
#endif

#endif /* KVQ_CPU_IMPL_H */
