/*
 * kvq_cpu.h — the fast CPU path of the tile quantizer and dequantizer.
 *
 * kvs_tile_quantize / kvs_tile_dequantize take the same arguments, follow the
 * same contract and produce the same bytes as kvs_tile_quantize_ref /
 * kvs_tile_dequantize_ref (kvq.h): codes, scales, outlier slots, sinks, zero
 * padding, header and checksum, for every input including NaN, ±Inf and
 * denormals. tests/conformance/test_kvq_cpu.c holds them to that, byte for
 * byte, on every instruction set this machine has. One case is pinned down
 * here that the reference leaves to its compiler: decoding a NaN code with a
 * NaN scale (only a hand-made tile has a NaN scale) gives the scale's NaN,
 * made quiet, on every ISA.
 *
 * Instruction sets. One implementation per ISA, chosen once at run time:
 *   KVS_CPU_PORTABLE  plain C11, every platform (the fallback);
 *   KVS_CPU_AVX2      x86-64 with AVX2 + F16C;
 *   KVS_CPU_AVX512    x86-64 with AVX-512 F + BW + VL (and F16C).
 * The first call picks the best one that both the CPU and the build support,
 * capped by the environment variable KVSTASH_CPU_ISA=portable|avx2|avx512
 * (read once; an unknown value is ignored). kvs_cpu_isa_force overrides the
 * choice for tests and benchmarks.
 *
 * The floating-point environment must be the default one (round to nearest,
 * no flush-to-zero, no denormals-are-zero), as for the reference.
 */
#ifndef KVQ_CPU_H
#define KVQ_CPU_H

#include "kvq.h"

#include <stddef.h>

typedef enum kvs_cpu_isa {
    KVS_CPU_PORTABLE = 0,
    KVS_CPU_AVX2 = 1,
    KVS_CPU_AVX512 = 2,
} kvs_cpu_isa;

/* The best ISA that this CPU and this build support (ignores KVSTASH_CPU_ISA). */
kvs_cpu_isa kvs_cpu_isa_detect(void);

/* Makes isa the active implementation for every later call in the process,
 * whatever KVSTASH_CPU_ISA says. 0, or KVS_ENODEV (the CPU or the build lacks
 * it; the active ISA is unchanged) or KVS_EINVAL (not an ISA). Safe to call
 * while other threads quantize (each call uses one implementation from start
 * to end), but meant for tests and benchmarks. */
int kvs_cpu_isa_force(kvs_cpu_isa isa);

/* The implementation the next call will use. */
kvs_cpu_isa kvs_cpu_isa_active(void);

/* "portable", "avx2", "avx512"; "?" for anything else. Static storage. */
const char *kvs_cpu_isa_name(kvs_cpu_isa isa);

/* Fast quantizer: contract, arguments and output bytes of kvs_tile_quantize_ref.
 * Allocates nothing; reads only the T x D elements of the source view and
 * writes only kvs_tile_size(p) bytes of out. */
int kvs_tile_quantize(const kvs_tile_params *p, const void *src, kvs_dtype dtype, size_t stride,
                      void *out, size_t cap, char *err);

/* Fast dequantizer: contract, arguments and output bytes of
 * kvs_tile_dequantize_ref (validates the tile with kvs_tile_check first, so an
 * untrusted tile never makes it read or write out of bounds). */
int kvs_tile_dequantize(const void *tile, size_t len, kvs_dtype dtype, void *dst, size_t stride,
                        char *err);

/* kvs_tile_dequantize for a tile whose checksum our own code verified on these
 * bytes moments before (kvs_tile_check_verified's contract, kvq.h): the same
 * output and every other check, one XXH3 pass over the tile less. */
int kvs_tile_dequantize_verified(const void *tile, size_t len, kvs_dtype dtype, void *dst,
                                 size_t stride, char *err);

/* Widens n fp16 values stored in the first 2n bytes of t to n floats over the
 * whole of t, in place (t holds n floats), each with kvq_fp16_to_f32's bits
 * (NaNs made quiet alike): F16C on the AVX2 and AVX-512 paths, the scalar
 * conversion on the portable one. For a destination that first receives fp16
 * and must end as fp32 (kvstash-decoder's KV pages) without a second buffer. */
void kvs_cpu_fp16_widen_inplace(float *t, size_t n);

#endif /* KVQ_CPU_H */
