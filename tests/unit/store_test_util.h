/*
 * store_test_util.h — setup shared by the store unit tests (test_store_index,
 * test_store_policy, test_store_payload, test_store_stress): the one-layer
 * fp16 namespace they key chains under, and opening/checking a store with
 * CUnit assertions. Header-only (static inline / static const): each test
 * binary gets its own copy; nothing here keeps state.
 *
 * BT (tokens per block) defaults to 16; define it before including to change.
 */
#ifndef KVS_STORE_TEST_UTIL_H
#define KVS_STORE_TEST_UTIL_H

#include "keys.h"
#include "kvs_error.h"
#include "kvs_test.h"
#include "store.h"

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
