/*
 * fuzz_target.h — what the fuzz targets, the replay driver and the seed
 * generator share.
 *
 * Input format of both targets: byte 0 is a mode byte, the rest is the tile or
 * block. Mode bit 0 asks the target to reseal the bytes (recompute checksums
 * with kvs_tile_seal / kvs_block_seal) before validating them, so that mutated
 * inputs get past the checksums to the structural checks and the decoders —
 * a fuzzer cannot solve XXH3 — while inputs with bit 0 clear test the
 * checksums themselves. The other bits pick decode variants (stride slack,
 * destination dtypes).
 *
 * Seeds and regression inputs are made by the encoder in fuzz_corpus.c at
 * test time (no binary files in the repository): kvs_fuzz_seed() enumerates
 * the seed corpus, kvs_fuzz_regression() the inputs that once broke something
 * or that aim at an edge no seed reaches by mutation.
 */
#ifndef KVS_FUZZ_TARGET_H
#define KVS_FUZZ_TARGET_H

#include <stddef.h>
#include <stdint.h>

#define KVS_FUZZ_MODE_SEAL 0x01u

/* libFuzzer's entry point, defined by fuzz_tile.c / fuzz_block.c. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Inputs so far that passed full validation and went through every decoder
 * (defined by each target): the replay driver checks that its mutants reach
 * the decoders, not only the first check. */
extern unsigned long kvs_fuzz_accepted;

typedef enum kvs_fuzz_kind {
    KVS_FUZZ_TILE = 0,
    KVS_FUZZ_BLOCK = 1,
} kvs_fuzz_kind;

/* Writes seed i of the corpus for kind into buf (cap bytes) and returns its
 * size; 0 when i is past the last seed. Deterministic. */
size_t kvs_fuzz_seed(kvs_fuzz_kind kind, unsigned i, uint8_t *buf, size_t cap);

/* Regression input i < kvs_fuzz_regression_count(kind) into buf; its size
 * (never 0 for a valid i and a buffer of KVS_FUZZ_MAX_INPUT bytes). */
unsigned kvs_fuzz_regression_count(kvs_fuzz_kind kind);
size_t kvs_fuzz_regression(kvs_fuzz_kind kind, unsigned i, uint8_t *buf, size_t cap);
/* Whether regression input i is a valid tile or block (most are forgeries the
 * checks must refuse): the replay driver fails when the verdict differs, so
 * that an input that no longer hits its edge (a layout change moved the
 * bytes it forges) shows. */
int kvs_fuzz_regression_valid(kvs_fuzz_kind kind, unsigned i);

/* Room for any seed or regression input. */
#define KVS_FUZZ_MAX_INPUT (64u * 1024u)

#endif /* KVS_FUZZ_TARGET_H */
