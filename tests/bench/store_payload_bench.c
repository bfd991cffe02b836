/*
 * store_payload_bench.c — the payload path of the store on one core: two-phase
 * writes into the DRAM arena, read references, and the SSD tier's demotion and
 * promotion, each against a baseline measured in the same run.
 *
 * Method: B blocks of S bytes (default 2048 x 64 KiB = 128 MiB), payloads
 * prepared before timing. Validation first: every block written, read back and
 * compared byte for byte; the SSD round likewise. Then, best of 3:
 *   put   : write_begin + memcpy of the payload + write_commit, per block,
 *           into a warm arena (filled and emptied once before timing);
 *           baseline: memcpy of the same bytes into preallocated, touched buffers
 *           (what any store must at least do). ratio = put GB/s / memcpy GB/s.
 *   read  : kvs_store_read + read_release per block (zero-copy reference);
 *           reported as reads/s and as GB/s of payload made available.
 *   ssd   : DRAM holding half the blocks, an SSD directory (argv[3], default
 *           /tmp): writing all B demotes half (write + XXH3 + file per block),
 *           reading all promotes them back (read + verify); baseline: pwrite then
 *           pread of the same bytes to one file per block in the same directory.
 *           ratio = store GB/s / raw file GB/s.
 * Last line:
 *   RESULT put_gbs=<x> memcpy_gbs=<x> put_ratio=<x> read_ops=<n> ssd_gbs=<x> file_gbs=<x>
 * ssd_ratio=<x>
 */
#include "keys.h"
#include "kvs_error.h"
#include "store.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BT 16

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static const kvs_ns_desc g_ns = {.tenant = "bench",
                                 .tenant_len = 5,
                                 .model = "m",
                                 .model_len = 1,
                                 .num_layers = 32,
                                 .num_kv_heads = 8,
                                 .head_dim = 128,
                                 .block_tokens = BT,
                                 .dtype = KVS_DTYPE_BF16};

static size_t B, S;
static kvs_key *g_k;
static uint32_t *g_tok;
static uint8_t *g_src;

static int put_all(kvs_store *s)
{
    for (size_t i = 0; i < B; i++) {
        kvs_store_put p = {.key = &g_k[i], .tokens = g_tok + i * BT, .n_tokens = BT, .size = S};
        kvs_store_wr *w;
        void *buf;
        int rc = kvs_store_write_begin(s, &p, &w, &buf);
        if (rc)
            return rc;
        memcpy(buf, g_src + i * S, S);
        if ((rc = kvs_store_write_commit(s, w)) != 0)
            return rc;
    }
    return 0;
}

/* Reads every block; check: compare the bytes. */
static int read_all(kvs_store *s, int check)
{
    for (size_t i = 0; i < B; i++) {
        kvs_store_ref r;
        int rc = kvs_store_read(s, &g_k[i], &r);
        if (rc)
            return rc;
        if (check && (r.size != S || memcmp(r.data, g_src + i * S, S) != 0)) {
            kvs_store_read_release(s, &r);
            return KVS_EFORMAT;
        }
        kvs_store_read_release(s, &r);
    }
    return 0;
}

static int open_store(uint64_t cap, const char *dir, kvs_store **s)
{
    kvs_store_opts o = {.policy = "lru"};
    kvs_store_payload_opts p = {.capacity_bytes = cap, .ssd_dir = dir};
    return kvs_store_open_ex(&o, &p, s);
}

int main(int argc, char **argv)
{
    B = argc > 1 ? strtoul(argv[1], NULL, 10) : 2048;
    S = argc > 2 ? strtoul(argv[2], NULL, 10) : 65536;
    const char *dir = argc > 3 ? argv[3] : "/tmp";
    if (B < 16 || S < 64) {
        fprintf(stderr, "usage: store_payload_bench [blocks>=16] [bytes>=64] [ssd dir]\n");
        return 2;
    }
    g_k = malloc(B * sizeof *g_k);
    g_tok = malloc(B * BT * sizeof *g_tok);
    g_src = malloc(B * S);
    uint8_t **dst = malloc(B * sizeof *dst);
    if (!g_k || !g_tok || !g_src || !dst)
        return 1;
    for (size_t i = 0; i < B; i++) {
        for (int j = 0; j < BT; j++)
            g_tok[i * BT + j] = (uint32_t)(i * 31 + (size_t)j);
        if (kvs_key_root(&g_ns, (const uint8_t *)"s", 1, g_tok + i * BT, &g_k[i]))
            return 1;
        dst[i] = aligned_alloc(64, (S + 63) / 64 * 64);
        if (!dst[i])
            return 1;
        memset(dst[i], 0, S);
    }
    uint64_t x = 88172645463325252ULL;
    for (size_t i = 0; i < B * S; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        g_src[i] = (uint8_t)x;
    }
    uint64_t cap = (uint64_t)B * (S + 64) * 5 / 4 + (64u << 20);

    /* Validation. */
    kvs_store *s;
    if (open_store(cap, NULL, &s) || put_all(s) || read_all(s, 1)) {
        fprintf(stderr, "validation failed (DRAM)\n");
        return 1;
    }
    kvs_store_close(s);

    double best_put = 1e30, best_cpy = 1e30, best_read = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        /* Warm arena: a first round faults its pages in, as a running server's
         * arena is; the timed round reuses them. */
        if (open_store(cap, NULL, &s) || put_all(s))
            return 1;
        for (size_t i = 0; i < B; i++)
            if (kvs_store_delete(s, &g_k[i], 0))
                return 1;
        double t0 = now();
        if (put_all(s))
            return 1;
        double t1 = now();
        if (read_all(s, 0))
            return 1;
        double t2 = now();
        for (size_t i = 0; i < B; i++)
            memcpy(dst[i], g_src + i * S, S);
        double t3 = now();
        kvs_store_close(s);
        if (t1 - t0 < best_put)
            best_put = t1 - t0;
        if (t2 - t1 < best_read)
            best_read = t2 - t1;
        if (t3 - t2 < best_cpy)
            best_cpy = t3 - t2;
    }

    /* SSD round: DRAM for half the blocks. */
    char sdir[4096];
    snprintf(sdir, sizeof sdir, "%s/kvs-payload-bench-XXXXXX", dir);
    if (!mkdtemp(sdir)) {
        perror("mkdtemp");
        return 1;
    }
    uint64_t half = (uint64_t)(B / 2) * (S + 64) * 5 / 4;
    if (open_store(half, sdir, &s) || put_all(s) || read_all(s, 1)) {
        fprintf(stderr, "validation failed (SSD)\n");
        return 1;
    }
    kvs_store_payload_stats ps;
    kvs_store_get_payload_stats(s, &ps);
    if (ps.demotions < B / 4 || ps.promotions < B / 4) {
        fprintf(stderr, "SSD round did not demote and promote (%llu, %llu)\n",
                (unsigned long long)ps.demotions, (unsigned long long)ps.promotions);
        return 1;
    }
    kvs_store_close(s);
    double best_ssd = 1e30, best_file = 1e30;
    uint64_t moved = 0;
    for (int rep = 0; rep < 3; rep++) {
        if (open_store(half, sdir, &s))
            return 1;
        double t0 = now();
        if (put_all(s) || read_all(s, 0))
            return 1;
        double t1 = now();
        kvs_store_get_payload_stats(s, &ps);
        moved = (ps.demotions + ps.promotions) * S;
        kvs_store_close(s);
        /* Baseline: as many files written (demotions) and read back (promotions)
         * as the store moved, one per block, in the same directory. */
        size_t nd = (size_t)ps.demotions, np = (size_t)ps.promotions;
        double t2 = now();
        char path[4200];
        for (size_t i = 0; i < nd; i++) {
            snprintf(path, sizeof path, "%s/raw%zu", sdir, i);
            int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            if (fd < 0 || pwrite(fd, g_src + (i % B) * S, S, 0) != (ssize_t)S)
                return 1;
            close(fd);
        }
        for (size_t i = 0; i < np && i < nd; i++) {
            snprintf(path, sizeof path, "%s/raw%zu", sdir, i);
            int fd = open(path, O_RDONLY);
            if (fd < 0 || pread(fd, dst[i % B], S, 0) != (ssize_t)S)
                return 1;
            close(fd);
        }
        for (size_t i = 0; i < nd; i++) {
            snprintf(path, sizeof path, "%s/raw%zu", sdir, i);
            unlink(path);
        }
        double t3 = now();
        if (t1 - t0 < best_ssd)
            best_ssd = t1 - t0;
        if (t3 - t2 < best_file)
            best_file = t3 - t2;
    }
    rmdir(sdir);
    double gb = (double)B * (double)S / 1e9;
    double put_gbs = gb / best_put, cpy_gbs = gb / best_cpy;
    /* The SSD round moves demotions + promotions worth of bytes through files
     * (and also does the DRAM puts and reads); the baseline moves the same file
     * bytes and nothing else. */
    double ssd_gbs = (double)moved / 1e9 / best_ssd, file_gbs = (double)moved / 1e9 / best_file;
    printf("blocks=%zu bytes=%zu\n", B, S);
    printf("put: %.2f GB/s (memcpy %.2f GB/s, ratio %.2f)  read refs: %.2f M/s\n", put_gbs, cpy_gbs,
           put_gbs / cpy_gbs, (double)B / best_read / 1e6);
    printf("ssd demote+promote: %.2f GB/s (raw files %.2f GB/s, ratio %.2f)\n", ssd_gbs, file_gbs,
           ssd_gbs / file_gbs);
    printf("RESULT put_gbs=%.3f memcpy_gbs=%.3f put_ratio=%.3f read_ops=%.0f ssd_gbs=%.3f "
           "file_gbs=%.3f ssd_ratio=%.3f\n",
           put_gbs, cpy_gbs, put_gbs / cpy_gbs, (double)B / best_read, ssd_gbs, file_gbs,
           ssd_gbs / file_gbs);
    for (size_t i = 0; i < B; i++)
        free(dst[i]);
    free(dst);
    free(g_k);
    free(g_tok);
    free(g_src);
    return 0;
}
