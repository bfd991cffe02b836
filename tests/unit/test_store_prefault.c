/*
 * test_store_prefault.c — kvs_store_prefault (prefault_memory): the arena is
 * faulted in (the process's resident memory grows by about the capacity) and
 * no byte changes: blocks stored before it read back the same, and blocks
 * stored after it work as before. A heap-backed store has nothing to populate
 * (KVS_ENODEV) and a NULL store is KVS_EINVAL.
 */
#include "keys.h"
#include "kvs_error.h"
#include "kvs_test.h"
#include "store.h"
#include "store_test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CAP   ((uint64_t)48 << 20)
#define BSIZE ((uint64_t)300000)

/* Resident bytes of this process (/proc/self/statm), or 0. */
static uint64_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, res = 0;
    if (f == NULL)
        return 0;
    if (fscanf(f, "%lu %lu", &size, &res) != 2)
        res = 0;
    fclose(f);
    return (uint64_t)res * (uint64_t)sysconf(_SC_PAGESIZE);
}

static int put(kvs_store *s, const chain_t *c, size_t i)
{
    return store_test_put(s, c, i, 7, 0, 0, BSIZE);
}

static int read_same(kvs_store *s, const chain_t *c, size_t i)
{
    kvs_store_ref r;
    if (kvs_store_read(s, &c->k[i], &r) != 0)
        return 0;
    int ok = r.size == BSIZE && same(&c->k[i], r.data, r.size);
    kvs_store_read_release(s, &r);
    return ok;
}

static kvs_store *open_cap(uint64_t cap)
{
    kvs_store_opts o = {.policy = "lru", .verify_chain = 1};
    kvs_store_payload_opts p = {.capacity_bytes = cap};
    kvs_store *s = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_store_open_ex(&o, &p, &s), 0);
    return s;
}

static void test_populates_and_keeps_bytes(void)
{
    kvs_store *s = open_cap(CAP);
    chain_t c;
    mk_chain(100, 8, &c);
    for (size_t i = 0; i < 4; i++)
        CU_ASSERT_EQUAL(put(s, &c, i), 0);
    uint64_t before = rss_bytes();
    int rc = kvs_store_prefault(s);
    uint64_t after = rss_bytes();
    if (rc == KVS_ENODEV) {
        fprintf(stderr, "note: this kernel has no MADV_POPULATE_WRITE; nothing populated\n");
    } else {
        CU_ASSERT_EQUAL(rc, 0);
        /* the arena minus what the four blocks had touched already, give or take */
        CU_ASSERT(after >= before + CAP - 4 * BSIZE - ((uint64_t)8 << 20));
    }
    for (size_t i = 0; i < 4; i++)
        CU_ASSERT(read_same(s, &c, i));
    for (size_t i = 4; i < 8; i++)
        CU_ASSERT_EQUAL(put(s, &c, i), 0);
    for (size_t i = 0; i < 8; i++)
        CU_ASSERT(read_same(s, &c, i));
    CU_ASSERT_EQUAL(kvs_store_prefault(s), rc); /* again: harmless */
    for (size_t i = 0; i < 8; i++)
        CU_ASSERT(read_same(s, &c, i));
    store_test_assert_ok(s);
    kvs_store_close(s);
}

static void test_nothing_to_populate(void)
{
    CU_ASSERT_EQUAL(kvs_store_prefault(NULL), KVS_EINVAL);
    kvs_store *s = open_cap(0); /* heap-backed */
    CU_ASSERT_EQUAL(kvs_store_prefault(s), KVS_ENODEV);
    kvs_store_close(s);
}

int main(void)
{
    static const kvs_test_case cases[] = {
        {"populates_and_keeps_bytes", test_populates_and_keeps_bytes},
        {"nothing_to_populate", test_nothing_to_populate},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {{"store_prefault", NULL, NULL, cases},
                                            {NULL, NULL, NULL, NULL}};
    return kvs_test_run(suites);
}
