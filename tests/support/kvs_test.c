/* kvs_test.c — see kvs_test.h. */
#include "kvs_test.h"

#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* KVS_TEST_ONLY=suite or suite/case: whether this one runs (a suite left out
 * never runs its init, so starts no server). Unset or empty: all. */
static int wanted(const char *suite, const char *tcase)
{
    const char *only = getenv("KVS_TEST_ONLY");
    if (only == NULL || only[0] == '\0')
        return 1;
    const char *slash = strchr(only, '/');
    size_t sl = slash ? (size_t)(slash - only) : strlen(only);
    if (strlen(suite) != sl || strncmp(suite, only, sl) != 0)
        return 0;
    return tcase == NULL || slash == NULL || strcmp(tcase, slash + 1) == 0;
}

int kvs_test_run(const kvs_test_suite *suites)
{
    if (CU_initialize_registry() != CUE_SUCCESS) {
        fprintf(stderr, "CUnit: %s\n", CU_get_error_msg());
        return 1;
    }
    for (const kvs_test_suite *s = suites; s->name != NULL; s++) {
        if (!wanted(s->name, NULL))
            continue;
        CU_pSuite suite = CU_add_suite(s->name, s->init, s->cleanup);
        if (suite == NULL)
            goto fail;
        for (const kvs_test_case *c = s->cases; c->name != NULL; c++) {
            if (!wanted(s->name, c->name))
                continue;
            if (CU_add_test(suite, c->name, c->fn) == NULL)
                goto fail;
        }
    }
    CU_basic_set_mode(CU_BRM_VERBOSE);
    if (CU_basic_run_tests() != CUE_SUCCESS)
        goto fail;
    unsigned failed_tests = CU_get_number_of_tests_failed();
    unsigned failures = CU_get_number_of_failures();
    unsigned suites_failed = CU_get_number_of_suites_failed();
    CU_cleanup_registry();
    printf("\n");
    return (failed_tests || failures || suites_failed) ? 1 : 0;
fail:
    fprintf(stderr, "CUnit: %s\n", CU_get_error_msg());
    CU_cleanup_registry();
    return 1;
}
