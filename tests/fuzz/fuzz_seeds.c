/*
 * fuzz_seeds.c — writes the seed corpus of the fuzz targets:
 *   kvs_fuzz_seeds DIR   creates DIR/<kind>/ for every kind of fuzz_target.h
 *                        (tile, block, model, sample, profile, trace, config)
 *                        with one file per seed, named seed-NNN.
 * Run by ctest (fixture fuzz_corpus) before the replay tests, and by hand
 * before a libFuzzer session (tests/fuzz/README.md). Existing files of the
 * same names are overwritten; other files are left alone.
 */
#include "fuzz_target.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int make_dir(const char *path)
{
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "kvs_fuzz_seeds: mkdir %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

static int write_kind(const char *dir, const char *sub, kvs_fuzz_kind kind)
{
    static uint8_t buf[KVS_FUZZ_MAX_INPUT];
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, sub);
    if (make_dir(path) != 0)
        return -1;
    unsigned count = 0;
    for (unsigned i = 0;; i++) {
        size_t n = kind >= KVS_FUZZ_FIRST_FILE_KIND ? kvs_fuzz_file_seed(kind, i, buf, sizeof buf)
                                                    : kvs_fuzz_seed(kind, i, buf, sizeof buf);
        if (n == 0)
            break;
        snprintf(path, sizeof path, "%s/%s/seed-%03u", dir, sub, i);
        FILE *f = fopen(path, "wb");
        if (f == NULL || fwrite(buf, 1, n, f) != n || fclose(f) != 0) {
            fprintf(stderr, "kvs_fuzz_seeds: write %s: %s\n", path, strerror(errno));
            return -1;
        }
        count++;
    }
    printf("kvs_fuzz_seeds: %u %s seeds in %s/%s\n", count, sub, dir, sub);
    return count > 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: kvs_fuzz_seeds DIR\n");
        return 2;
    }
    static const char *const names[KVS_FUZZ_NUM_KINDS] = {"tile",    "block", "model", "sample",
                                                          "profile", "trace", "config"};
    if (make_dir(argv[1]) != 0)
        return 1;
    for (int k = 0; k < KVS_FUZZ_NUM_KINDS; k++)
        if (write_kind(argv[1], names[k], (kvs_fuzz_kind)k) != 0)
            return 1;
    return 0;
}
