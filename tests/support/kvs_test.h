/*
 * kvs_test.h — the CUnit runner every kvstash test binary uses.
 *
 * A binary declares NULL-terminated tables of cases and suites and calls
 * kvs_test_run() from main. It runs them in CUnit's Basic mode (verbose, so the
 * ctest log shows every test and CUnit's Run Summary) and returns the process
 * exit code: 0 when every test passed, 1 when any test or assert failed or
 * CUnit itself failed. CU_basic_run_tests() alone reports success even when a
 * test failed (LIBRARIES.md §5), which is why this wrapper exists.
 *
 * KVS_TEST_ONLY=suite or suite/case in the environment runs only that suite
 * or case (the others' init does not run either).
 *
 * A test that cannot run here (no GPU) makes the binary exit KVS_TEST_SKIP
 * (77) before kvs_test_run; ctest maps that to "skipped".
 */
#ifndef KVS_TEST_H
#define KVS_TEST_H

#include <CUnit/CUnit.h>

#define KVS_TEST_SKIP 77

typedef struct kvs_test_case {
    const char *name;
    void (*fn)(void);
} kvs_test_case;

typedef struct kvs_test_suite {
    const char *name;
    int (*init)(void);     /* may be NULL */
    int (*cleanup)(void);  /* may be NULL */
    const kvs_test_case *cases; /* terminated by {NULL, NULL} */
} kvs_test_suite;

/* suites is terminated by an entry whose name is NULL. */
int kvs_test_run(const kvs_test_suite *suites);

#endif /* KVS_TEST_H */
