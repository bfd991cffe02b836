/*
 * test_reload.c — kvstashd's SIGHUP reload against a real server: what a
 * changed config file applies, what it leaves to a restart, what SetConfig
 * changes it keeps, and that a bad file changes nothing and the server keeps
 * serving.
 *
 * Usage: test_reload /path/to/kvstashd (ctest passes it).
 *
 * Each reload is observed through kvstash_config_reloads_total{result}: the
 * test sends SIGHUP and waits for the applied or refused count to move, then
 * reads the settings back with GetConfig.
 */
#include "kvs_itest.h"
#include "kvs_server_proc.h"
#include "kvs_test.h"
#include "kvstash.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *g_kvstashd;
static kvs_server_proc g_srv;
static kvs_client *g_client;
static char g_dir[64] = "/tmp/kvs-reload-XXXXXX";
static char g_ini[128];

static const char k_start[] = "[kvstashd]\nlog_level = warn\npolicy = lru\nthreads = 2\n"
                              "lease_ms = 5000\n\n[model.a/*]\nscheme = fp16\n";

/* ---- helpers ---------------------------------------------------------------- */

static int write_ini(const char *text)
{
    /* Written beside and renamed over, as an editor or a config manager would. */
    char tmp[160];
    snprintf(tmp, sizeof tmp, "%s.new", g_ini);
    FILE *f = fopen(tmp, "w");
    if (f == NULL || fputs(text, f) < 0 || fclose(f) != 0 || rename(tmp, g_ini) != 0) {
        fprintf(stderr, "cannot write %s\n", g_ini);
        return -1;
    }
    return 0;
}

static int setting_is(const char *name, const char *want)
{
    char *v = kvs_itest_setting(g_client, name);
    int ok = v != NULL && strcmp(v, want) == 0;
    if (!ok)
        fprintf(stderr, "\n  %s = '%s', expected '%s'\n", name, v ? v : "(none)", want);
    free(v);
    return ok;
}

static int set_setting(const char *name, const char *value)
{
    return kvs_itest_set_setting(g_client, name, value, NULL);
}

static int hup_and_wait(const char *result)
{
    return kvs_itest_hup_wait(g_client, (int)g_srv.pid, result);
}

/* ---- suite ------------------------------------------------------------------- */

static int suite_init(void)
{
    return kvs_itest_write_config(g_dir, g_ini, sizeof g_ini, k_start) != 0 ||
           kvs_itest_start_config(g_kvstashd, g_ini, &g_srv, &g_client, "reload") != 0;
}

static int suite_cleanup(void)
{
    return kvs_itest_stop_config(&g_srv, &g_client, g_dir);
}

/* ---- tests ------------------------------------------------------------------- */

/* Nothing changed: the reload is applied and changes nothing. */
static void test_unchanged(void)
{
    CU_ASSERT_EQUAL(kvs_itest_stat(g_client, "kvstash_config_reloads_total", "result", "applied"),
                    0);
    CU_ASSERT_EQUAL(kvs_itest_stat(g_client, "kvstash_config_reloads_total", "result", "refused"),
                    0);
    CU_ASSERT_EQUAL_FATAL(hup_and_wait("applied"), 0);
    CU_ASSERT(setting_is("policy", "lru"));
    CU_ASSERT(setting_is("model_rules", "a/* scheme=fp16"));
}

/* The file's run-time changes apply; a restart-only one waits; SetConfig
 * values the file did not change stay. */
static void test_applies_changes(void)
{
    CU_ASSERT_EQUAL_FATAL(set_setting("low_watermark_pct", "80"), 0); /* not in the file */
    CU_ASSERT_EQUAL_FATAL(set_setting("lease_ms", "7000"), 0);        /* in it, unchanged */
    CU_ASSERT_EQUAL_FATAL(set_setting("sinks", "2"), 0);              /* in it, changed */
    CU_ASSERT_EQUAL_FATAL(
        write_ini("[kvstashd]\nlog_level = warn\npolicy = lfu\nthreads = 3\nlease_ms = 5000\n"
                  "sinks = 4\n\n[model.a/*]\nscheme = fp16\n\n[model.b/*]\nscheme = int8\n"),
        0);
    CU_ASSERT_EQUAL_FATAL(hup_and_wait("applied"), 0);
    CU_ASSERT(setting_is("policy", "lfu"));
    CU_ASSERT(setting_is("sinks", "4"));
    CU_ASSERT(setting_is("model_rules", "a/* scheme=fp16; b/* scheme=int8"));
    CU_ASSERT(setting_is("threads", "2")); /* takes effect at the next restart */
    CU_ASSERT(setting_is("low_watermark_pct", "80"));
    CU_ASSERT(setting_is("lease_ms", "7000"));
}

/* A file that does not parse, a setting the server refuses, a profile that
 * cannot be read, a tenant the running table does not have, tenant sections
 * that would stop kvstashd at its next start: each reload is
 * refused whole, nothing changes, the server keeps serving; the fixed file
 * then applies. */
static void test_refused(void)
{
    char profile_rule[256];
    snprintf(profile_rule, sizeof profile_rule,
             "[kvstashd]\npolicy = s3fifo\n\n[model.c/*]\nscheme = fp8_e4m3\n"
             "profile = %s/none.profile\n",
             g_dir);
    const char *bad[] = {
        "[kvstashd]\npolicy = s3fifo\nthis is not ini\n",
        "[kvstashd]\npolicy = s3fifo\nno_such_setting = 1\n",
        "[kvstashd]\npolicy = s3fifo\nlow_watermark_pct = 90\nhigh_watermark_pct = 50\n",
        profile_rule,
        "[kvstashd]\npolicy = s3fifo\n\n[tenant.newcomer]\ntoken = newcomer-token-1\n"
        "quota = 1MiB\n",
        /* tenant sections kvstashd would refuse at its next start */
        "[kvstashd]\npolicy = s3fifo\n\n[tenant.newcomer]\ntoken = newcomer-token-1\n"
        "admin = maybe\n",
        "[kvstashd]\npolicy = s3fifo\n\n[tenant.newcomer]\nsecret = no-token\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CU_ASSERT_EQUAL_FATAL(write_ini(bad[i]), 0);
        CU_ASSERT_EQUAL(hup_and_wait("refused"), 0);
        CU_ASSERT(setting_is("policy", "lfu"));
        CU_ASSERT(setting_is("low_watermark_pct", "80"));
        CU_ASSERT(setting_is("model_rules", "a/* scheme=fp16; b/* scheme=int8"));
    }
    /* Served as before: the open-mode default tenant still works. */
    kvs_lookup_result *lr = NULL;
    unsigned tokens[16] = {1, 2, 3, 4};
    kvs_ns ns = kvs_itest_ns("a/x", 1, 1, 8, 16, 1 /* fp16 */);
    char err[KVS_ERR_LEN] = "";
    int rc = kvs_client_lookup(g_client, &ns, tokens, 16, 0, -1, &lr, err);
    if (rc != 0)
        fprintf(stderr, "\n  Lookup: %s\n", err);
    CU_ASSERT_EQUAL(rc, 0);
    kvs_lookup_result_free(lr);

    /* Fixed: applied against what was last read (the file of the test above). */
    CU_ASSERT_EQUAL_FATAL(write_ini("[kvstashd]\nlog_level = warn\npolicy = s3fifo\n"), 0);
    CU_ASSERT_EQUAL_FATAL(hup_and_wait("applied"), 0);
    CU_ASSERT(setting_is("policy", "s3fifo"));
    CU_ASSERT(setting_is("model_rules", ""));
    CU_ASSERT(setting_is("sinks", "1")); /* back to the default the file now leaves */
    CU_ASSERT(setting_is("lease_ms", "7000"));
    CU_ASSERT(setting_is("low_watermark_pct", "80"));
}

int main(int argc, char **argv)
{
    static const kvs_test_case cases[] = {
        {"unchanged", test_unchanged},
        {"applies_changes", test_applies_changes},
        {"refused", test_refused},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {{"reload", suite_init, suite_cleanup, cases},
                                            {NULL, NULL, NULL, NULL}};
    return kvs_itest_main(argc, argv, &g_kvstashd, suites);
}
