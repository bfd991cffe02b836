/*
 * store_test_util.h — setup shared by the store unit tests (test_store_index,
 * test_store_policy, test_store_payload, test_store_stress,
 * test_store_lookup_info): the one-layer fp16 namespace they key chains under,
 * chains of blocks with their token ids, a payload pattern per key, and
 * opening/checking a store with CUnit assertions. Header-only (static inline / static const): each
 * test binary gets its own copy; nothing here keeps state.
 *
 * BT (tokens per block) defaults to 16; define it before including to change.
 */
#ifndef KVS_STORE_TEST_UTIL_H
#define KVS_STORE_TEST_UTIL_H

#include "keys.h"
#include "kvs_error.h"
#include "kvs_test.h"
#include "store.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifndef BT
#define BT 16
#endif

static const kvs_ns_desc g_ns = {.tenant = "t",
                                 .tenant_len = 1,
                                 .model = "m",
                                 .model_len = 1,
                                 .num_layers = 1,
                                 .num_kv_heads = 1,
                                 .head_dim = 1,
                                 .block_tokens = BT,
                                 .dtype = KVS_DTYPE_FP16};

/* Token ids of block `id`: BT distinct values, different for every id. */
static inline void toks(uint32_t id, uint32_t *t)
{
    for (int i = 0; i < BT; i++)
        t[i] = id * 131u + (uint32_t)i;
}

/* A chain of n <= 8 blocks: block i has id base + i. */
typedef struct chain_t {
    size_t n;
    kvs_key k[8];
    uint32_t tok[8 * BT];
} chain_t;

static inline void mk_chain(uint32_t base, size_t n, chain_t *c)
{
    CU_ASSERT_FATAL(n <= 8);
    c->n = n;
    for (size_t i = 0; i < n; i++)
        toks(base + (uint32_t)i, c->tok + i * BT);
    CU_ASSERT_EQUAL_FATAL(kvs_key_chain(&g_ns, (const uint8_t *)"x", 1, c->tok, n, c->k), 0);
}

/* Byte j of the payload the tests give the block keyed k. */
static inline uint8_t pat(const kvs_key *k, uint64_t j)
{
    return (uint8_t)(k->b[j % 32] ^ (j * 13u));
}

static inline void fill(const kvs_key *k, void *buf, uint64_t size)
{
    uint8_t *b = buf;
    for (uint64_t j = 0; j < size; j++)
        b[j] = pat(k, j);
}

/* 1 when buf holds the payload fill() wrote for k. */
static inline int same(const kvs_key *k, const void *buf, uint64_t size)
{
    const uint8_t *b = buf;
    for (uint64_t j = 0; j < size; j++)
        if (b[j] != pat(k, j))
            return 0;
    return 1;
}

/* Writes block i of c (parent i - 1, its BT tokens) with size bytes of fill()
 * under ns_id, tenant and priority prio: write_begin, fill, commit. Asserts
 * the buffer is 64-byte aligned (tier.h). Returns the first failing status. */
static inline int store_test_put(kvs_store *s, const chain_t *c, size_t i, uint32_t ns_id,
                                 kvs_tenant_id tenant, int8_t prio, uint64_t size)
{
    kvs_store_put p = {.key = &c->k[i],
                       .parent = i ? &c->k[i - 1] : NULL,
                       .ns_id = ns_id,
                       .tenant = tenant,
                       .tokens = c->tok + i * BT,
                       .n_tokens = BT,
                       .size = size,
                       .priority = prio};
    kvs_store_wr *w;
    void *buf;
    int rc = kvs_store_write_begin(s, &p, &w, &buf);
    if (rc)
        return rc;
    CU_ASSERT_EQUAL((uintptr_t)buf % 64, 0);
    fill(&c->k[i], buf, size);
    return kvs_store_write_commit(s, w);
}

/* A store of cap blocks (0: unbounded) under policy (NULL: the default) with
 * chain verification on; fails the test when it cannot be opened. The caller
 * owns it (kvs_store_close). */
static inline kvs_store *store_test_open(uint64_t cap, const char *policy)
{
    kvs_store_opts o = {.capacity_blocks = cap, .policy = policy, .verify_chain = 1};
    kvs_store *s = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_store_open(&o, &s), 0);
    return s;
}

/* Asserts kvs_store_check passes, printing its reason when it does not. */
static inline void store_test_assert_ok(kvs_store *s)
{
    char err[KVS_ERR_LEN] = "";
    int rc = kvs_store_check(s, err, sizeof err);
    if (rc)
        fprintf(stderr, "check: %s\n", err);
    CU_ASSERT_EQUAL(rc, 0);
}

#endif /* KVS_STORE_TEST_UTIL_H */
