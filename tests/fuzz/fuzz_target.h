/*
 * fuzz_target.h — what the fuzz targets, the replay driver and the seed
 * generator share.
 *
 * Input format of the tile and block targets: byte 0 is a mode byte, the rest is the tile or
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
#include <stdio.h>
#include <stdlib.h>

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
    /* Files from disk (fuzz_files.c): a llama2.c checkpoint (fuzz_model.c), a
     * KVSM sample file with the mode byte first (fuzz_sample.c; bit 0 reseals
     * its checksum), a calibration profile's text (fuzz_profile.c), a
     * Mooncake-format JSONL trace (fuzz_trace.c), a kvstashd INI config file
     * (fuzz_config.c). */
    KVS_FUZZ_MODEL = 2,
    KVS_FUZZ_SAMPLE = 3,
    KVS_FUZZ_PROFILE = 4,
    KVS_FUZZ_TRACE = 5,
    KVS_FUZZ_CONFIG = 6,
} kvs_fuzz_kind;

/* Plain numbers: fuzz_replay.c compares them in #if, where enum names are 0. */
#define KVS_FUZZ_FIRST_FILE_KIND 2
#define KVS_FUZZ_NUM_KINDS       7
_Static_assert(KVS_FUZZ_FIRST_FILE_KIND == KVS_FUZZ_MODEL, "first file kind");
_Static_assert(KVS_FUZZ_NUM_KINDS == KVS_FUZZ_CONFIG + 1, "number of kinds");

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

/* The same four for the file kinds (fuzz_files.c, which links the decoder,
 * the calibration code, the store's trace reader and kvstashd's config), so
 * that the tile and block targets do not link those. */
size_t kvs_fuzz_file_seed(kvs_fuzz_kind kind, unsigned i, uint8_t *buf, size_t cap);
unsigned kvs_fuzz_file_regression_count(kvs_fuzz_kind kind);
size_t kvs_fuzz_file_regression(kvs_fuzz_kind kind, unsigned i, uint8_t *buf, size_t cap);
int kvs_fuzz_file_regression_valid(kvs_fuzz_kind kind, unsigned i);

/* Aborts with "<target>: invariant broken: <what>" unless cond holds: how a
 * target reports a broken promise to libFuzzer and to the replay driver. */
static inline void kvs_fuzz_require(int cond, const char *target, const char *what)
{
    if (!cond) {
        fprintf(stderr, "%s: invariant broken: %s\n", target, what);
        abort();
    }
}

/* xorshift64*: the seed generators' deterministic numbers. */
static inline uint32_t kvs_fuzz_next(uint64_t *state)
{
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (uint32_t)((*state * 2685821657736338717ull) >> 32);
}

struct kvs_profile;
/* The text kvs_profile_print writes for p, in a malloc'd buffer (*text, *len;
 * free it). 0 or the print's error (fuzz_files.c). */
int kvs_fuzz_profile_text(const struct kvs_profile *p, char **text, size_t *len);

/* Room for any seed or regression input. */
#define KVS_FUZZ_MAX_INPUT (64u * 1024u)

#endif /* KVS_FUZZ_TARGET_H */
