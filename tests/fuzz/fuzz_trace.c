/*
 * fuzz_trace.c — libFuzzer target for the JSONL trace reader (kvs_trace_load,
 * behind kvstash-sim --trace): the input is the file. An accepted trace is
 * replayed through the real store at a small capacity with the store's
 * consistency check after every request, then written and read back.
 *
 * Invariants (abort when broken):
 *   - a refused trace gets KVS_EFORMAT (or KVS_ENOMEM) and a message naming
 *     the input and the line ("fuzz:<line>: ...");
 *   - an accepted trace is consistent (off[nreq] == nblocks, offsets
 *     non-decreasing);
 *   - the replay succeeds with every policy and never hits more than it was asked;
 *   - kvs_trace_write's output loads back to the same requests.
 */
#include "fuzz_target.h"
#include "kvs_error.h"
#include "trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

unsigned long kvs_fuzz_accepted;

#define REQUIRE(c, what) kvs_fuzz_require((c), "fuzz_trace", (what))

static const char *const k_policies[] = {"lru", "leaflru", "lfu", "s3fifo", "prefix", "belady"};

static int load(const void *text, size_t len, kvs_trace **t, char *err)
{
    FILE *f = fmemopen((void *)text, len, "r");
    REQUIRE(f != NULL, "fmemopen failed");
    int rc = kvs_trace_load(f, "fuzz", t, err, KVS_ERR_LEN);
    fclose(f);
    return rc;
}

static int put_of(const kvs_trace *t, size_t r)
{
    return t->put ? t->put[r] : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) /* fmemopen refuses a zero-length buffer */
        return 0;
    char err[KVS_ERR_LEN] = "";
    kvs_trace *t = NULL;
    int rc = load(data, size, &t, err);
    if (rc != 0) {
        REQUIRE(t == NULL, "a refused trace was returned");
        REQUIRE(rc == KVS_EFORMAT || rc == KVS_ENOMEM, "refused with an unexpected status");
        REQUIRE(rc != KVS_EFORMAT || strncmp(err, "fuzz:", 5) == 0,
                "a malformed trace's message does not name the input and line");
        return 0;
    }
    kvs_fuzz_accepted++;
    REQUIRE(t->off[0] == 0 && t->off[t->nreq] == t->nblocks, "offsets inconsistent");
    for (size_t r = 0; r < t->nreq; r++)
        REQUIRE(t->off[r] <= t->off[r + 1], "offsets decrease");

    const char *policy = k_policies[size % (sizeof k_policies / sizeof k_policies[0])];
    kvs_replay_result res;
    rc = kvs_trace_replay(t, policy, 1 + size % 13, 1, &res, err, sizeof err);
    REQUIRE(rc == 0, "replay of an accepted trace failed");
    REQUIRE(res.hits <= res.requested, "more hits than requested blocks");

    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    REQUIRE(f != NULL && kvs_trace_write(t, f) == 0 && fclose(f) == 0, "write failed");
    kvs_trace *u = NULL;
    if (t->nreq > 0) {
        REQUIRE(load(text, len, &u, err) == 0, "written trace does not load back");
        REQUIRE(u->nreq == t->nreq && u->nblocks == t->nblocks, "round trip changed the size");
        REQUIRE(memcmp(u->off, t->off, (t->nreq + 1) * sizeof *t->off) == 0 &&
                    (t->nblocks == 0 || memcmp(u->ids, t->ids, t->nblocks * sizeof *t->ids) == 0),
                "round trip changed the requests");
        for (size_t r = 0; r < t->nreq; r++)
            REQUIRE(put_of(u, r) == put_of(t, r), "round trip changed an op");
        kvs_trace_free(u);
    }
    free(text);
    kvs_trace_free(t);
    return 0;
}
