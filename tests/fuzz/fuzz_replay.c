/*
 * fuzz_replay.c — a deterministic stand-in for libFuzzer, built with any
 * compiler and run by ctest (LABELS fuzz) in every build, the ASan one
 * included, so the decoders meet hostile bytes on every CI run.
 *
 *   fuzz_<target>_replay CORPUS_DIR [MUTATIONS]
 *
 * Feeds LLVMFuzzerTestOneInput every file of CORPUS_DIR (in name order), then
 * every regression input of the target (kvs_fuzz_regression), then MUTATIONS
 * (default 4000) mutants of the corpus made with a fixed-seed generator: bit
 * flips (biased to the headers), truncations, splices of two seeds, byte
 * overwrites with random and boundary values, inserted and deleted runs,
 * random inputs, and a flipped mode byte. Same inputs on every run: a failure
 * reproduces. The target aborts on a broken invariant; ASan/UBSan abort on a
 * memory error. Exit 0 when everything ran.
 *
 * KVS_FUZZ_REPLAY_KIND (a kvs_fuzz_kind) is set by tests/fuzz/CMakeLists.txt.
 */
#include "fuzz_target.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef KVS_FUZZ_REPLAY_KIND
#error "KVS_FUZZ_REPLAY_KIND must be defined"
#endif

/* The file kinds' seeds and regressions live in fuzz_files.c. */
#if KVS_FUZZ_REPLAY_KIND >= KVS_FUZZ_FIRST_FILE_KIND
#define regression_count kvs_fuzz_file_regression_count
#define regression       kvs_fuzz_file_regression
#define regression_valid kvs_fuzz_file_regression_valid
#else
#define regression_count kvs_fuzz_regression_count
#define regression       kvs_fuzz_regression
#define regression_valid kvs_fuzz_regression_valid
#endif

typedef struct input {
    uint8_t *data;
    size_t size;
} input;

static uint64_t g_rng = 0xF022F022F022F022ull;
static uint64_t rnd(void) /* splitmix64 */
{
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static size_t below(size_t n)
{
    return n ? (size_t)(rnd() % n) : 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Loads every regular file of dir, in name order. */
static input *load_corpus(const char *dir, size_t *count)
{
    DIR *d = opendir(dir);
    if (d == NULL) {
        perror(dir);
        return NULL;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **grown = realloc(names, cap * sizeof *names);
            if (grown == NULL) {
                fprintf(stderr, "%s: out of memory\n", dir);
                exit(1);
            }
            names = grown;
        }
        names[n] = strdup(e->d_name);
        if (names[n] == NULL) {
            fprintf(stderr, "%s: out of memory\n", dir);
            exit(1);
        }
        n++;
    }
    closedir(d);
    if (n > 1)
        qsort(names, n, sizeof *names, by_name);
    input *in = calloc(n ? n : 1, sizeof *in);
    size_t got = 0;
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        FILE *f = fopen(path, "rb");
        free(names[i]);
        if (f == NULL)
            continue;
        uint8_t *buf = malloc(KVS_FUZZ_MAX_INPUT);
        if (buf == NULL) {
            fprintf(stderr, "%s: out of memory\n", path);
            exit(1);
        }
        size_t len = fread(buf, 1, KVS_FUZZ_MAX_INPUT, f);
        fclose(f);
        in[got].data = buf;
        in[got].size = len;
        got++;
    }
    free(names);
    *count = got;
    return in;
}

static void run(const uint8_t *data, size_t size)
{
    /* An exact-size heap copy, so ASan sees reads past the end of the input. */
    uint8_t *copy = malloc(size ? size : 1);
    memcpy(copy, data, size);
    LLVMFuzzerTestOneInput(copy, size);
    free(copy);
}

static const uint8_t k_boundary[] = {0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x0F, 0x10, 0x11,
                                     0x3F, 0x40, 0x41, 0x7E, 0x7F, 0x80, 0x81, 0xFE, 0xFF};

/* One mutant of the corpus into out (KVS_FUZZ_MAX_INPUT bytes); its size. */
static size_t mutate(const input *in, size_t n, uint8_t *out)
{
    const input *a = &in[below(n)];
    size_t size = a->size;
    memcpy(out, a->data, size);
    switch (rnd() % 9) {
    case 0: /* flip 1..4 bits, half of the time within the first 64 bytes */
    case 1: {
        int flips = 1 + (int)below(4);
        for (int i = 0; i < flips && size > 0; i++) {
            size_t at = (rnd() & 1) ? below(size < 64 ? size : 64) : below(size);
            out[at] ^= (uint8_t)(1u << below(8));
        }
        break;
    }
    case 2: /* truncate */
        size = below(size + 1);
        break;
    case 3: { /* splice: a's head, b's tail */
        const input *b = &in[below(n)];
        size_t cut_a = below(size + 1), cut_b = below(b->size + 1);
        size_t tail = b->size - cut_b;
        if (cut_a + tail > KVS_FUZZ_MAX_INPUT)
            tail = KVS_FUZZ_MAX_INPUT - cut_a;
        memcpy(out + cut_a, b->data + cut_b, tail);
        size = cut_a + tail;
        break;
    }
    case 4: /* overwrite 1..8 bytes with boundary values, header-biased */
    case 5: {
        int k = 1 + (int)below(8);
        for (int i = 0; i < k && size > 0; i++) {
            size_t at = (rnd() & 1) ? below(size < 64 ? size : 64) : below(size);
            out[at] = (rnd() & 1) ? k_boundary[below(sizeof k_boundary)] : (uint8_t)rnd();
        }
        break;
    }
    case 6: { /* insert or delete a run */
        size_t at = below(size + 1), run_len = 1 + below(32);
        if (rnd() & 1) {
            if (size + run_len <= KVS_FUZZ_MAX_INPUT) {
                memmove(out + at + run_len, out + at, size - at);
                memset(out + at, (int)(rnd() & 0xFF), run_len);
                size += run_len;
            }
        } else if (at < size) {
            if (run_len > size - at)
                run_len = size - at;
            memmove(out + at, out + at + run_len, size - at - run_len);
            size -= run_len;
        }
        break;
    }
    case 7: /* random bytes */
        size = below(512);
        for (size_t i = 0; i < size; i++)
            out[i] = (uint8_t)rnd();
        break;
    default: /* the other mode: sealed <-> raw, other decode variants */
        if (size > 0)
            out[0] ^= (uint8_t)(1u + (below(16) << 1));
        break;
    }
    return size;
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s CORPUS_DIR [MUTATIONS]\n", argv[0]);
        return 2;
    }
    const kvs_fuzz_kind kind = (kvs_fuzz_kind)KVS_FUZZ_REPLAY_KIND;
    const long mutations = argc == 3 ? strtol(argv[2], NULL, 10) : 4000;
    clock_t t0 = clock();
    size_t n = 0;
    input *in = load_corpus(argv[1], &n);
    if (in == NULL || n == 0) {
        fprintf(stderr, "%s: no seeds in %s (run kvs_fuzz_seeds first)\n", argv[0], argv[1]);
        return 1;
    }
    for (size_t i = 0; i < n; i++)
        run(in[i].data, in[i].size);
    const unsigned long seeds_ok = kvs_fuzz_accepted;

    uint8_t *buf = malloc(KVS_FUZZ_MAX_INPUT);
    const unsigned regressions = regression_count(kind);
    for (unsigned i = 0; i < regressions; i++) {
        size_t size = regression(kind, i, buf, KVS_FUZZ_MAX_INPUT);
        if (size == 0) {
            fprintf(stderr, "%s: regression input %u could not be made\n", argv[0], i);
            return 1;
        }
        const unsigned long was = kvs_fuzz_accepted;
        run(buf, size);
        if ((kvs_fuzz_accepted != was) != (regression_valid(kind, i) != 0)) {
            fprintf(stderr, "%s: regression input %u was %s\n", argv[0], i,
                    kvs_fuzz_accepted != was ? "accepted" : "refused");
            return 1;
        }
    }
    const unsigned long before = kvs_fuzz_accepted;
    for (long i = 0; i < mutations; i++)
        run(buf, mutate(in, n, buf));
    const unsigned long mutants_ok = kvs_fuzz_accepted - before;

    printf("%s: %zu seeds (%lu valid), %u regression inputs, %ld mutants (%lu accepted): "
           "no failure (%.2f s)\n",
           argv[0], n, seeds_ok, regressions, mutations, mutants_ok,
           (double)(clock() - t0) / CLOCKS_PER_SEC);
    /* A replay whose seeds are not valid, or whose mutants never get past
     * validation, tests nothing: fail rather than pass vacuously. */
    int vacuous = seeds_ok < n || mutants_ok < (unsigned long)mutations / 20;
    if (vacuous)
        fprintf(stderr, "%s: too few inputs reached the decoders\n", argv[0]);
    for (size_t i = 0; i < n; i++)
        free(in[i].data);
    free(in);
    free(buf);
    return vacuous ? 1 : 0;
}
