/* test_client_status.c — libkvstash's gRPC status mapping and status names. */
#include "client_int.h"
#include "kvs_test.h"

#include <grpc/status.h>

#include <stdlib.h>
#include <string.h>

static void test_status_from_grpc(void)
{
    static const struct {
        int grpc;
        int kvs;
    } map[] = {
        {GRPC_STATUS_OK, KVS_OK},
        {GRPC_STATUS_INVALID_ARGUMENT, KVS_EINVAL},
        {GRPC_STATUS_NOT_FOUND, KVS_ENOTFOUND},
        {GRPC_STATUS_ALREADY_EXISTS, KVS_EEXIST},
        {GRPC_STATUS_DEADLINE_EXCEEDED, KVS_ETIMEDOUT},
        {GRPC_STATUS_UNAVAILABLE, KVS_EUNAVAIL},
        {GRPC_STATUS_UNAUTHENTICATED, KVS_EUNAUTH},
        {GRPC_STATUS_PERMISSION_DENIED, KVS_EPERM},
        {GRPC_STATUS_RESOURCE_EXHAUSTED, KVS_ENOSPC},
        {GRPC_STATUS_FAILED_PRECONDITION, KVS_EPRECOND},
        {GRPC_STATUS_UNIMPLEMENTED, KVS_EUNIMPL},
        {GRPC_STATUS_CANCELLED, KVS_ECANCELED},
        {GRPC_STATUS_DATA_LOSS, KVS_EFORMAT},
        /* "anything else" */
        {GRPC_STATUS_UNKNOWN, KVS_EINTERNAL},
        {GRPC_STATUS_ABORTED, KVS_EINTERNAL},
        {GRPC_STATUS_OUT_OF_RANGE, KVS_EINTERNAL},
        {GRPC_STATUS_INTERNAL, KVS_EINTERNAL},
        {17, KVS_EINTERNAL},
        {-1, KVS_EINTERNAL},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        CU_ASSERT_EQUAL(kvs_status_from_grpc(map[i].grpc), map[i].kvs);
}

static void test_status_names(void)
{
    CU_ASSERT_STRING_EQUAL(kvs__grpc_status_name(GRPC_STATUS_OK), "OK");
    CU_ASSERT_STRING_EQUAL(kvs__grpc_status_name(GRPC_STATUS_INVALID_ARGUMENT), "INVALID_ARGUMENT");
    CU_ASSERT_STRING_EQUAL(kvs__grpc_status_name(GRPC_STATUS_DEADLINE_EXCEEDED),
                           "DEADLINE_EXCEEDED");
    CU_ASSERT_STRING_EQUAL(kvs__grpc_status_name(GRPC_STATUS_UNIMPLEMENTED), "UNIMPLEMENTED");
    CU_ASSERT_STRING_EQUAL(kvs__grpc_status_name(GRPC_STATUS_DATA_LOSS), "DATA_LOSS");
    CU_ASSERT_STRING_EQUAL(kvs__grpc_status_name(GRPC_STATUS_UNAUTHENTICATED), "UNAUTHENTICATED");
    CU_ASSERT_STRING_EQUAL(kvs__grpc_status_name(17), "UNKNOWN_STATUS");
    CU_ASSERT_STRING_EQUAL(kvs__grpc_status_name(-1), "UNKNOWN_STATUS");

    CU_ASSERT_STRING_EQUAL(kvs_health_status_name(KVS_HEALTH_SERVING), "SERVING");
    CU_ASSERT_STRING_EQUAL(kvs_health_status_name(KVS_HEALTH_NOT_SERVING), "NOT_SERVING");
    CU_ASSERT_STRING_EQUAL(kvs_health_status_name(KVS_HEALTH_UNKNOWN), "UNKNOWN");
    CU_ASSERT_STRING_EQUAL(kvs_health_status_name(KVS_HEALTH_SERVICE_UNKNOWN), "SERVICE_UNKNOWN");
    CU_ASSERT_STRING_EQUAL(kvs_health_status_name((kvs_health_status)42), "INVALID");
}

static void test_set_err(void)
{
    char err[KVS_ERR_LEN];
    kvs__set_err(err, "%s: %d", "x", 7);
    CU_ASSERT_STRING_EQUAL(err, "x: 7");
    kvs__set_err(NULL, "%s", "ignored"); /* must not crash */
    char big[2 * KVS_ERR_LEN];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    kvs__set_err(err, "%s", big);
    CU_ASSERT_EQUAL(strlen(err), KVS_ERR_LEN - 1);
    char *d = kvs__strdup(NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    CU_ASSERT_STRING_EQUAL(d, "");
    free(d);
}

int main(void)
{
    static const kvs_test_case cases[] = {
        {"status_from_grpc", test_status_from_grpc},
        {"status_names", test_status_names},
        {"set_err", test_set_err},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {{"client_status", NULL, NULL, cases},
                                            {NULL, NULL, NULL, NULL}};
    return kvs_test_run(suites);
}
