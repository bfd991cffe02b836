/* test_error.c — the status table: every code has a distinct value, text and name. */
#include "kvs_error.h"
#include "kvs_log.h"
#include "kvs_test.h"

#include <string.h>

static void test_codes_are_negative_and_distinct(void)
{
    int codes[] = {
#define XX(name, val, text) KVS_##name,
        KVS_ERRNO_MAP(XX)
#undef XX
    };
    size_t n = sizeof codes / sizeof codes[0];
    CU_ASSERT_TRUE(n >= 10);
    for (size_t i = 0; i < n; i++) {
        CU_ASSERT_TRUE(codes[i] < 0);
        for (size_t j = i + 1; j < n; j++)
            CU_ASSERT_NOT_EQUAL(codes[i], codes[j]);
    }
}

static void test_strerror(void)
{
    CU_ASSERT_STRING_EQUAL(kvs_strerror(KVS_OK), "success");
    CU_ASSERT_STRING_EQUAL(kvs_strerror(KVS_EINVAL), "invalid argument");
    CU_ASSERT_STRING_EQUAL(kvs_strerror(KVS_EFORMAT), "malformed or corrupted data");
    CU_ASSERT_STRING_EQUAL(kvs_strerror(12345), "unknown error");
    CU_ASSERT_STRING_EQUAL(kvs_strerror(-9999), "unknown error");
    CU_ASSERT_STRING_EQUAL(kvs_errname(KVS_ETIMEDOUT), "KVS_ETIMEDOUT");
    CU_ASSERT_STRING_EQUAL(kvs_errname(KVS_OK), "KVS_OK");
    CU_ASSERT_STRING_EQUAL(kvs_errname(-9999), "KVS_E?");
}

static void test_log_levels(void)
{
    kvs_log_level l;
    CU_ASSERT_EQUAL(kvs_log_level_parse("DEBUG", &l), KVS_OK);
    CU_ASSERT_EQUAL(l, KVS_LOG_DEBUG);
    CU_ASSERT_EQUAL(kvs_log_level_parse("warning", &l), KVS_OK);
    CU_ASSERT_EQUAL(l, KVS_LOG_WARN);
    CU_ASSERT_EQUAL(kvs_log_level_parse("loud", &l), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_log_level_parse(NULL, &l), KVS_EINVAL);
    kvs_log_level old = kvs_log_get_level();
    kvs_log_set_level(KVS_LOG_ERROR);
    CU_ASSERT_EQUAL(kvs_log_get_level(), KVS_LOG_ERROR);
    kvs_log_set_level(old);
    CU_ASSERT_STRING_EQUAL(kvs_log_level_name(KVS_LOG_WARN), "warn");
}

int main(void)
{
    static const kvs_test_case cases[] = {
        {"codes_are_negative_and_distinct", test_codes_are_negative_and_distinct},
        {"strerror", test_strerror},
        {"log_levels", test_log_levels},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {{"error", NULL, NULL, cases}, {NULL, NULL, NULL, NULL}};
    return kvs_test_run(suites);
}
