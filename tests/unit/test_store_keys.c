/*
 * test_store_keys.c — the key spec (docs/KEYSPEC.md): descriptor bytes, chain
 * vectors, validation.
 *
 * The vectors below were computed once by an independent implementation of
 * KEYSPEC.md (Python hashlib, the script is in the doc) and pasted here: any
 * change of the encoding makes this test fail, as it must (a change is a new
 * spec version, not an edit).
 */
#include "keys.h"
#include "kvs_error.h"
#include "kvs_test.h"

#include <string.h>

static kvs_ns_desc desc1(void)
{
    kvs_ns_desc d = {.tenant = "acme", .tenant_len = 4, .model = "llama-3-8b", .model_len = 10,
                     .num_layers = 32, .num_kv_heads = 8, .head_dim = 128, .block_tokens = 16,
                     .dtype = KVS_DTYPE_BF16, .salt = "", .salt_len = 0};
    return d;
}

static void hex(const uint8_t *b, size_t n, char *out)
{
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hx[b[i] >> 4];
        out[2 * i + 1] = hx[b[i] & 15];
    }
    out[2 * n] = '\0';
}

static void test_descriptor_bytes(void)
{
    kvs_ns_desc d = desc1();
    uint8_t enc[KVS_NS_ENC_MAX];
    size_t n = 0;
    char h[2 * KVS_NS_ENC_MAX + 1];
    CU_ASSERT_EQUAL_FATAL(kvs_ns_encode(&d, enc, sizeof enc, &n, NULL, 0), 0);
    hex(enc, n, h);
    CU_ASSERT_STRING_EQUAL(h, "010461636d650a6c6c616d612d332d3862200000000800000080000000100000000200");
    d.salt = "x";
    d.salt_len = 1;
    CU_ASSERT_EQUAL_FATAL(kvs_ns_encode(&d, enc, sizeof enc, &n, NULL, 0), 0);
    hex(enc, n, h);
    CU_ASSERT_STRING_EQUAL(h, "010461636d650a6c6c616d612d332d386220000000080000008000000010000000020178");
    /* Too small a buffer is ENOSPC, not a truncation. */
    CU_ASSERT_EQUAL(kvs_ns_encode(&d, enc, n - 1, &n, NULL, 0), KVS_ENOSPC);
}

static void test_chain_vectors(void)
{
    kvs_ns_desc d = desc1();
    uint32_t tok[48];
    for (int i = 0; i < 32; i++)
        tok[i] = (uint32_t)i;
    for (int i = 0; i < 16; i++)
        tok[32 + i] = 100000u + (uint32_t)i;
    kvs_key k[3];
    char h[65];
    CU_ASSERT_EQUAL_FATAL(kvs_key_chain(&d, (const uint8_t *)"s3cret", 6, tok, 3, k), 0);
    CU_ASSERT_STRING_EQUAL(kvs_key_hex(&k[0], h),
                           "58b062152d82fbcac27fc05ebb6d50303f41dc29582223b8f9031a4e9a42307f");
    CU_ASSERT_STRING_EQUAL(kvs_key_hex(&k[1], h),
                           "8896905953a65e9ea2d5c47de9871388810d1c4d830c01383baa15a1c17fc323");
    CU_ASSERT_STRING_EQUAL(kvs_key_hex(&k[2], h),
                           "0fe810a237b0c516008d42592328dce5908c2dd3e77d102d03973d3c194c584f");
    /* key_next from key[0] reproduces key[1]. */
    kvs_key k1;
    CU_ASSERT_EQUAL(kvs_key_next(&k[0], tok + 16, 16, &k1), 0);
    CU_ASSERT_EQUAL(memcmp(&k1, &k[1], sizeof k1), 0);
    /* A salt changes block 0 (and so every key). */
    d.salt = "x";
    d.salt_len = 1;
    CU_ASSERT_EQUAL(kvs_key_root(&d, (const uint8_t *)"s3cret", 6, tok, &k[0]), 0);
    CU_ASSERT_STRING_EQUAL(kvs_key_hex(&k[0], h),
                           "7b59e5d20e81c7692ebe93d984cd8ce5483dd56fdecba03a17f9e72ad56a91cf");
    /* So does the secret; an empty secret is allowed (shared namespaces). */
    d = desc1();
    CU_ASSERT_EQUAL(kvs_key_root(&d, NULL, 0, tok, &k[0]), 0);
    CU_ASSERT_STRING_EQUAL(kvs_key_hex(&k[0], h),
                           "256bd81e5dbd765ca0931cf92cafe55f5c72d79136cd6f50c384c2443d17f045");
}

static void test_chain_vectors_256(void)
{
    kvs_ns_desc d = {.tenant = "globex", .tenant_len = 6, .model = "qwen2-7b", .model_len = 8,
                     .num_layers = 28, .num_kv_heads = 4, .head_dim = 128, .block_tokens = 256,
                     .dtype = KVS_DTYPE_FP16, .salt = "tenant-salt", .salt_len = 11};
    static uint32_t tok[512];
    for (uint32_t i = 0; i < 2; i++)
        for (uint32_t j = 0; j < 256; j++)
            tok[i * 256 + j] = (i * 7919 + j) % 151936;
    uint8_t secret[32];
    memset(secret, 'k', sizeof secret);
    kvs_key k[2];
    char h[65];
    CU_ASSERT_EQUAL_FATAL(kvs_key_chain(&d, secret, sizeof secret, tok, 2, k), 0);
    CU_ASSERT_STRING_EQUAL(kvs_key_hex(&k[0], h),
                           "7c47bde1f5b31a5654b1084c3f0ba0fcbf1a1db30a8d8f8a2ae903e3c49bed70");
    CU_ASSERT_STRING_EQUAL(kvs_key_hex(&k[1], h),
                           "b19278c1169547d7138ac1ca193b60a2f6f1a4cbfaf8142ff496e017c812f3de");
}

static void test_validation(void)
{
    uint8_t enc[KVS_NS_ENC_MAX];
    size_t n;
    char err[KVS_ERR_LEN] = "";
    kvs_ns_desc d = desc1();
    d.block_tokens = 8;
    CU_ASSERT_EQUAL(kvs_ns_encode(&d, enc, sizeof enc, &n, err, sizeof err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "block_tokens"));
    d = desc1();
    d.block_tokens = 1025;
    CU_ASSERT_EQUAL(kvs_ns_encode(&d, enc, sizeof enc, &n, NULL, 0), KVS_EINVAL);
    d = desc1();
    d.tenant_len = 0;
    CU_ASSERT_EQUAL(kvs_ns_encode(&d, enc, sizeof enc, &n, err, sizeof err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "tenant"));
    d = desc1();
    d.dtype = (kvs_dtype)9;
    CU_ASSERT_EQUAL(kvs_ns_encode(&d, enc, sizeof enc, &n, NULL, 0), KVS_EINVAL);
    d = desc1();
    d.head_dim = 0;
    CU_ASSERT_EQUAL(kvs_ns_encode(&d, enc, sizeof enc, &n, NULL, 0), KVS_EINVAL);
    /* Largest descriptor fits KVS_NS_ENC_MAX exactly. */
    static char big[255];
    memset(big, 'a', sizeof big);
    d = desc1();
    d.tenant = d.model = d.salt = big;
    d.tenant_len = d.model_len = d.salt_len = 255;
    CU_ASSERT_EQUAL(kvs_ns_encode(&d, enc, sizeof enc, &n, NULL, 0), 0);
    CU_ASSERT_EQUAL(n, (size_t)KVS_NS_ENC_MAX);
    d.salt_len = 256;
    CU_ASSERT_EQUAL(kvs_ns_encode(&d, enc, sizeof enc, &n, NULL, 0), KVS_EINVAL);
    /* Secret too long. */
    static uint8_t sec[KVS_SECRET_MAX + 1];
    uint32_t tok[16] = {0};
    kvs_key k;
    d = desc1();
    CU_ASSERT_EQUAL(kvs_key_root(&d, sec, sizeof sec, tok, &k), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_key_root(&d, sec, KVS_SECRET_MAX, tok, &k), 0);
}

int main(void)
{
    static const kvs_test_case cases[] = {
        {"descriptor_bytes", test_descriptor_bytes},
        {"chain_vectors", test_chain_vectors},
        {"chain_vectors_256", test_chain_vectors_256},
        {"validation", test_validation},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {{"store_keys", NULL, NULL, cases},
                                            {NULL, NULL, NULL, NULL}};
    return kvs_test_run(suites);
}
