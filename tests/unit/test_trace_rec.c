/*
 * test_trace_rec.c — the request-trace recorder (service/trace_rec.c): what it
 * writes loads with kvstash-sim's own loader (store/trace.h), ids are dense in
 * first-seen order, shared prefixes share ids, Puts of blocks a Lookup already
 * named write nothing, a Put without a Lookup writes its chain, and the file
 * holds no key bytes or token ids.
 */
#include "kvs_error.h"
#include "kvs_test.h"
#include "trace.h"
#include "trace_rec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A distinct, well-spread 32-byte key per seed (splitmix64 words), standing
 * in for a SHA-256 chain key. */
static void key_of(uint8_t k[KVS_TRACE_KEY_LEN], unsigned seed)
{
    uint64_t x = seed;
    for (int w = 0; w < KVS_TRACE_KEY_LEN / 8; w++) {
        uint64_t z = (x += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        memcpy(k + 8 * w, &z, 8);
    }
}

static void test_record_and_load(void)
{
    char path[] = "/tmp/kvs-trace-rec-XXXXXX";
    int fd = mkstemp(path);
    CU_ASSERT_FATAL(fd >= 0);
    close(fd);
    kvs_trace_rec *r = NULL;
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL_FATAL(kvs_trace_rec_open(path, &r, err), 0);

    uint8_t k[8][KVS_TRACE_KEY_LEN];
    for (unsigned i = 0; i < 8; i++)
        key_of(k[i], 1000 + i);
    /* Lookup A: blocks k0 k1 k2; Lookup B shares k0 k1 then k3. */
    uint8_t a[3][KVS_TRACE_KEY_LEN], b[3][KVS_TRACE_KEY_LEN];
    memcpy(a[0], k[0], 32);
    memcpy(a[1], k[1], 32);
    memcpy(a[2], k[2], 32);
    memcpy(b[0], k[0], 32);
    memcpy(b[1], k[1], 32);
    memcpy(b[2], k[3], 32);
    CU_ASSERT_EQUAL(kvs_trace_rec_lookup(r, (const uint8_t(*)[32])a, 3, 3 * 16 + 5), 0);
    CU_ASSERT_EQUAL(kvs_trace_rec_lookup(r, (const uint8_t(*)[32])b, 3, 3 * 16), 0);
    /* Puts of blocks already named by a Lookup: nothing written. */
    CU_ASSERT_EQUAL(kvs_trace_rec_put(r, k[2], k[1], 16), 0);
    CU_ASSERT_EQUAL(kvs_trace_rec_put(r, k[0], NULL, 16), 0);
    CU_ASSERT_EQUAL(kvs_trace_rec_lines(r), 2);
    /* A Put extending B's chain (never looked up): the chain k0 k1 k3 k4. */
    CU_ASSERT_EQUAL(kvs_trace_rec_put(r, k[4], k[3], 16), 0);
    /* A Put whose parent was never seen: [parent, itself]. */
    CU_ASSERT_EQUAL(kvs_trace_rec_put(r, k[6], k[5], 16), 0);
    /* An empty Lookup (prompt shorter than a block) is a line with no ids. */
    CU_ASSERT_EQUAL(kvs_trace_rec_lookup(r, NULL, 0, 9), 0);
    CU_ASSERT_EQUAL(kvs_trace_rec_lines(r), 5);
    kvs_trace_rec_close(r);

    FILE *f = fopen(path, "r");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    kvs_trace *t = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_trace_load(f, path, &t, err, sizeof err), 0);
    CU_ASSERT_EQUAL(t->nreq, 5);
    static const uint32_t want[] = {0, 1, 2, 0, 1, 3, 0, 1, 3, 4, 5, 6};
    static const size_t off[] = {0, 3, 6, 10, 12, 12};
    CU_ASSERT_EQUAL(t->nblocks, sizeof want / sizeof want[0]);
    for (size_t i = 0; i < t->nblocks && i < sizeof want / sizeof want[0]; i++)
        CU_ASSERT_EQUAL(t->ids[i], want[i]);
    for (size_t i = 0; i <= t->nreq && i < 6; i++)
        CU_ASSERT_EQUAL(t->off[i], off[i]);
    kvs_trace_free(t);

    /* The other members: input_length and op; no key bytes in the text. */
    rewind(f);
    char line[512];
    CU_ASSERT_PTR_NOT_NULL(fgets(line, sizeof line, f));
    CU_ASSERT_PTR_NOT_NULL(strstr(line, "\"input_length\": 53"));
    CU_ASSERT_PTR_NOT_NULL(strstr(line, "\"op\": \"lookup\""));
    CU_ASSERT_PTR_NOT_NULL(strstr(line, "\"timestamp\": "));
    CU_ASSERT_PTR_NOT_NULL(fgets(line, sizeof line, f));
    CU_ASSERT_PTR_NOT_NULL(fgets(line, sizeof line, f));
    CU_ASSERT_PTR_NOT_NULL(strstr(line, "\"op\": \"put\""));
    CU_ASSERT_PTR_NOT_NULL(strstr(line, "\"input_length\": 64"));
    fclose(f);
    unlink(path);
}

static void test_many_keys(void)
{
    /* Enough keys to grow the table several times; ids stay dense. */
    char path[] = "/tmp/kvs-trace-rec-XXXXXX";
    int fd = mkstemp(path);
    CU_ASSERT_FATAL(fd >= 0);
    close(fd);
    kvs_trace_rec *r = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_trace_rec_open(path, &r, NULL), 0);
    enum { N = 20000, CH = 50 };
    uint8_t(*keys)[KVS_TRACE_KEY_LEN] = malloc((size_t)CH * KVS_TRACE_KEY_LEN);
    for (unsigned q = 0; q < N / CH; q++) {
        for (unsigned i = 0; i < CH; i++)
            key_of(keys[i], q * CH + i);
        CU_ASSERT_EQUAL(kvs_trace_rec_lookup(r, (const uint8_t(*)[32])keys, CH, CH * 16), 0);
    }
    kvs_trace_rec_close(r);
    free(keys);
    FILE *f = fopen(path, "r");
    kvs_trace *t = NULL;
    char err[KVS_ERR_LEN];
    CU_ASSERT_EQUAL_FATAL(kvs_trace_load(f, path, &t, err, sizeof err), 0);
    fclose(f);
    CU_ASSERT_EQUAL(t->nblocks, N);
    int dense = 1;
    for (size_t i = 0; i < t->nblocks; i++)
        dense &= t->ids[i] == i;
    CU_ASSERT(dense);
    kvs_trace_free(t);
    unlink(path);
}

static int count_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    int n = 0, c;
    while (f && (c = fgetc(f)) != EOF)
        n += c == '\n';
    if (f)
        fclose(f);
    return n;
}

static void test_live_flush(void)
{
    /* While recording, lines reach the file within about a second. */
    char path[] = "/tmp/kvs-trace-rec-XXXXXX";
    int fd = mkstemp(path);
    CU_ASSERT_FATAL(fd >= 0);
    close(fd);
    kvs_trace_rec *r = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_trace_rec_open(path, &r, NULL), 0);
    uint8_t k[2][KVS_TRACE_KEY_LEN];
    key_of(k[0], 1);
    key_of(k[1], 2);
    CU_ASSERT_EQUAL(kvs_trace_rec_lookup(r, (const uint8_t(*)[32])k, 2, 40), 0);
    int seen = 0;
    for (int i = 0; i < 30 && !seen; i++) { /* up to 3 s on a loaded machine */
        usleep(100000);
        seen = count_lines(path);
    }
    CU_ASSERT_EQUAL(seen, 1);
    kvs_trace_rec_close(r);
    CU_ASSERT_EQUAL(count_lines(path), 1);
    unlink(path);
}

static void test_open_error(void)
{
    kvs_trace_rec *r = (kvs_trace_rec *)1;
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL(kvs_trace_rec_open("/nonexistent-dir/x/trace.jsonl", &r, err), KVS_EIO);
    CU_ASSERT_PTR_NULL(r);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "record_trace /nonexistent-dir/x/trace.jsonl"));
    kvs_trace_rec_close(NULL);
}

int main(void)
{
    static const kvs_test_case cases[] = {
        {"recorded trace loads with kvstash-sim's loader", test_record_and_load},
        {"20000 keys: ids dense in first-seen order", test_many_keys},
        {"lines reach the file while recording", test_live_flush},
        {"unopenable file is KVS_EIO naming it", test_open_error},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {{"trace_rec", NULL, NULL, cases},
                                            {NULL, NULL, NULL, NULL}};
    return kvs_test_run(suites);
}
