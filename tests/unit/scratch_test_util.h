/*
 * scratch_test_util.h — a scratch folder for the unit tests that write the
 * files they parse (test_config, test_service_data): suite_init makes it,
 * suite_cleanup removes it with everything in it, write_file puts a file
 * into it. Header-only (static): each test binary gets its own copy.
 *
 * Define SCRATCH_NAME (a string literal) before including: the folder is
 * /tmp/kvs_<SCRATCH_NAME>_XXXXXX, its path in g_dir once suite_init ran.
 */
#ifndef KVS_SCRATCH_TEST_UTIL_H
#define KVS_SCRATCH_TEST_UTIL_H

#include "kvs_test.h"

#include <stdio.h>
#include <stdlib.h>

#ifndef SCRATCH_NAME
#error "define SCRATCH_NAME before including scratch_test_util.h"
#endif

static char g_dir[] = "/tmp/kvs_" SCRATCH_NAME "_XXXXXX";

static int suite_init(void)
{
    return mkdtemp(g_dir) ? 0 : -1;
}
static int suite_cleanup(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Writes text to g_dir/name (fatal when it cannot); the path, valid until the
 * next call. */
static const char *write_file(const char *name, const char *text)
{
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs(text, f);
    fclose(f);
    return path;
}

#endif /* KVS_SCRATCH_TEST_UTIL_H */
