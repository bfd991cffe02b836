/* test_config.c — the settings table: parsing, bounds, precedence, error messages. */
#include "config.h"
#include "kvq_calib.h" /* KVS_QUANT_DEFAULT_* */
#include "kvs_error.h"
#include "kvs_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SCRATCH_NAME "test_config" /* its files go to /tmp/kvs_test_config_XXXXXX */
#include "scratch_test_util.h"

static void test_defaults(void)
{
    kvs_config c;
    kvs_config_defaults(&c);
    CU_ASSERT_STRING_EQUAL(c.listen, "127.0.0.1:50551");
    CU_ASSERT_EQUAL(c.threads, 4);
    CU_ASSERT_EQUAL(c.capacity, INT64_C(1) << 30);
    CU_ASSERT_EQUAL(c.log_level, KVS_LOG_INFO);
    CU_ASSERT_EQUAL(c.max_message_bytes, 64 << 20);
    CU_ASSERT_STRING_EQUAL(c.port_file, "");
    /* A namespace's quantization defaults are the measured ones of kvq_calib.h
     * (docs/QUALITY.md), the same the decoder's --local-quant uses. */
    CU_ASSERT_EQUAL((unsigned)c.k_outliers, KVS_QUANT_DEFAULT_K_OUTLIERS);
    CU_ASSERT_EQUAL((unsigned)c.v_outliers, KVS_QUANT_DEFAULT_V_OUTLIERS);
    CU_ASSERT_EQUAL((unsigned)c.sinks, KVS_QUANT_DEFAULT_SINKS);
    CU_ASSERT_EQUAL(c.default_scheme + 1, (int64_t)KVS_QUANT_DEFAULT_SCHEME);
    /* Every row round-trips its own default through format. */
    for (size_t i = 0; i < kvs_config_count(); i++) {
        const kvs_config_def *d = kvs_config_at(i);
        char buf[KVS_CONFIG_STR_MAX];
        kvs_config_format(&c, d, buf, sizeof buf);
        kvs_config c2 = c;
        CU_ASSERT_EQUAL(kvs_config_set(&c2, d, buf, NULL), 0);
        CU_ASSERT_EQUAL(memcmp(&c, &c2, sizeof c), 0);
    }
    CU_ASSERT_PTR_NULL(kvs_config_at(kvs_config_count()));
}

static void test_sizes_and_durations(void)
{
    kvs_config c;
    kvs_config_defaults(&c);
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "capacity", "2G", NULL), 0);
    CU_ASSERT_EQUAL(c.capacity, INT64_C(2) << 30);
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "capacity", "512MiB", NULL), 0);
    CU_ASSERT_EQUAL(c.capacity, INT64_C(512) << 20);
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "capacity", "3000000", NULL), 0);
    CU_ASSERT_EQUAL(c.capacity, 3000000);
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "shutdown-grace-ms", "2s", NULL), 0);
    CU_ASSERT_EQUAL(c.shutdown_grace_ms, 2000);
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "shutdown_grace_ms", "250ms", NULL), 0);
    CU_ASSERT_EQUAL(c.shutdown_grace_ms, 250);

    char err[KVS_ERR_LEN];
    const char *bad[] = {"", "12Q", "1.5G", "-1", "G", "99999999999999999999", "1 G x",
                         "9223372036854775807G"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "capacity", bad[i], err), KVS_EINVAL);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "capacity"));
    }
    CU_ASSERT_EQUAL(c.capacity, 3000000); /* unchanged by every failure */
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "capacity", "1k", err), KVS_EINVAL); /* < 1 MiB */
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "outside"));
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "shutdown_grace_ms", "2m", err), KVS_EINVAL);
}

static void test_ints_enums_strings(void)
{
    kvs_config c;
    char err[KVS_ERR_LEN];
    kvs_config_defaults(&c);
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "threads", "0", err), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "threads", "257", err), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "threads", "16", err), 0);
    CU_ASSERT_EQUAL(c.threads, 16);
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "log_level", "DEBUG", err), 0);
    CU_ASSERT_EQUAL(c.log_level, KVS_LOG_DEBUG);
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "log_level", "loud", err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "debug|info|warn|error|off"));
    CU_ASSERT_EQUAL(c.log_level, KVS_LOG_DEBUG);
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "listen", "", err), KVS_EINVAL);
    char longs[KVS_CONFIG_STR_MAX + 8];
    memset(longs, 'a', sizeof longs - 1);
    longs[sizeof longs - 1] = '\0';
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "listen", longs, err), KVS_EINVAL);
    CU_ASSERT_STRING_EQUAL(c.listen, "127.0.0.1:50551");
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "no_such", "1", err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "unknown setting 'no_such'"));
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, NULL, "1", err), KVS_EINVAL);
}

static void test_file(void)
{
    kvs_config c;
    char err[KVS_ERR_LEN];
    kvs_config_defaults(&c);
    const char *p = write_file("ok.ini", "; comment\nthreads = 8\n[kvstashd]\ncapacity = 2GiB\n"
                                         "log-level = warn\n");
    CU_ASSERT_EQUAL(kvs_config_load_file(&c, p, err), 0);
    CU_ASSERT_EQUAL(c.threads, 8);
    CU_ASSERT_EQUAL(c.capacity, INT64_C(2) << 30);
    CU_ASSERT_EQUAL(c.log_level, KVS_LOG_WARN);

    kvs_config before = c;
    p = write_file("bad.ini", "threads = 2\ncapacity = lots\n");
    CU_ASSERT_EQUAL(kvs_config_load_file(&c, p, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "bad.ini:2:"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "capacity"));
    CU_ASSERT_EQUAL(memcmp(&c, &before, sizeof c), 0); /* all or nothing */

    p = write_file("unknown.ini", "\n\nthreadz = 2\n");
    CU_ASSERT_EQUAL(kvs_config_load_file(&c, p, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "unknown.ini:3: unknown setting 'threadz'"));

    p = write_file("section.ini", "[store]\ncapacity = 1G\n");
    CU_ASSERT_EQUAL(kvs_config_load_file(&c, p, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "unknown section [store]"));

    p = write_file("syntax.ini", "threads\n");
    CU_ASSERT_EQUAL(kvs_config_load_file(&c, p, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "syntax.ini:1:"));

    p = write_file("binary.ini", "\x01\x02\xff\xfe=\x80\n[\n");
    CU_ASSERT_EQUAL(kvs_config_load_file(&c, p, err), KVS_EINVAL);

    CU_ASSERT_EQUAL(kvs_config_load_file(&c, "/nonexistent/kvstash.ini", err), KVS_EIO);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "/nonexistent/kvstash.ini"));
    CU_ASSERT_EQUAL(memcmp(&c, &before, sizeof c), 0);
}

static void test_env(void)
{
    kvs_config c;
    char err[KVS_ERR_LEN];
    kvs_config_defaults(&c);
    char *env[] = {"PATH=/bin", "KVSTASH_THREADS=3", "KVSTASH_SERVER=x:1", "KVSTASH_LOG_LEVEL=error",
                   "KVSTASH_=", NULL};
    CU_ASSERT_EQUAL(kvs_config_load_env(&c, env, err), 0);
    CU_ASSERT_EQUAL(c.threads, 3);
    CU_ASSERT_EQUAL(c.log_level, KVS_LOG_ERROR);
    char *bad[] = {"KVSTASH_THREADS=many", NULL};
    CU_ASSERT_EQUAL(kvs_config_load_env(&c, bad, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "KVSTASH_THREADS"));
    CU_ASSERT_EQUAL(c.threads, 3);
}

static void test_precedence_and_flags(void)
{
    kvs_config c;
    kvs_config_action a;
    char err[KVS_ERR_LEN];
    const char *p = write_file("prec.ini", "threads = 8\ncapacity = 2G\nlog_level = warn\n");
    char path[256];
    snprintf(path, sizeof path, "%s", p);
    char *env[] = {"KVSTASH_THREADS=6", "KVSTASH_LOG_LEVEL=error", NULL};
    char *argv[] = {"kvstashd", "--config", path, "--threads", "5", "--listen=127.0.0.1:0", NULL};
    CU_ASSERT_EQUAL(kvs_config_from_args(&c, 6, argv, env, &a, err), 0);
    CU_ASSERT_EQUAL(a, KVS_CONFIG_RUN);
    CU_ASSERT_EQUAL(c.threads, 5);                  /* flag beats env beats file */
    CU_ASSERT_EQUAL(c.log_level, KVS_LOG_ERROR);    /* env beats file */
    CU_ASSERT_EQUAL(c.capacity, INT64_C(2) << 30);  /* file beats default */
    CU_ASSERT_STRING_EQUAL(c.listen, "127.0.0.1:0");

    char *envcfg[] = {NULL, NULL};
    char envbuf[300];
    snprintf(envbuf, sizeof envbuf, "KVSTASH_CONFIG=%s", path);
    envcfg[0] = envbuf;
    char *argv0[] = {"kvstashd", NULL};
    CU_ASSERT_EQUAL(kvs_config_from_args(&c, 1, argv0, envcfg, &a, err), 0);
    CU_ASSERT_EQUAL(c.threads, 8);

    char *h[] = {"kvstashd", "--help", NULL};
    CU_ASSERT_EQUAL(kvs_config_from_args(&c, 2, h, NULL, &a, err), 0);
    CU_ASSERT_EQUAL(a, KVS_CONFIG_HELP);
    char *v[] = {"kvstashd", "--version", NULL};
    CU_ASSERT_EQUAL(kvs_config_from_args(&c, 2, v, NULL, &a, err), 0);
    CU_ASSERT_EQUAL(a, KVS_CONFIG_VERSION);

    struct {
        int argc;
        char *argv[4];
        const char *msg;
    } bad[] = {
        {2, {"kvstashd", "--bogus", NULL}, "unknown option '--bogus'"},
        {2, {"kvstashd", "--threads", NULL}, "--threads needs a value"},
        {3, {"kvstashd", "--threads", "x", NULL}, "threads"},
        {2, {"kvstashd", "stray", NULL}, "unexpected argument 'stray'"},
        {2, {"kvstashd", "--config", NULL}, "needs a file name"},
        {3, {"kvstashd", "--config", "/nonexistent.ini", NULL}, "cannot open"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        int rc = kvs_config_from_args(&c, bad[i].argc, bad[i].argv, NULL, &a, err);
        CU_ASSERT_NOT_EQUAL(rc, 0);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, bad[i].msg));
    }
}

/* Every value is text that comes back in protobuf string fields: it must be
 * UTF-8, whatever its source (SetConfig, file, environment). */
static void test_utf8(void)
{
    kvs_config c;
    char err[KVS_ERR_LEN];
    kvs_config_defaults(&c);
    static const char *const good[] = {"", "llama-*", "модель/* scheme=int8",
                                       "\xf0\x9f\x98\x80/* fp16=1", "\xf4\x8f\xbf\xbf/*"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "model_rules", good[i], err), 0);
    CU_ASSERT_STRING_EQUAL(c.model_rules, "\xf4\x8f\xbf\xbf/*");
    kvs_config before = c;
    static const char *const bad[] = {
        "\xff\xfe/*",        /* not UTF-8 at all */
        "zz/\xc0\xaf*",      /* overlong '/' */
        "\xed\xa0\x80*",     /* a surrogate */
        "\xf4\x90\x80\x80*", /* past U+10FFFF (glibc's decoder takes it) */
        "ok/\xe2\x82",       /* truncated */
        "a\x80"
        "b", /* a lone continuation byte */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "model_rules", bad[i], err), KVS_EINVAL);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "model_rules: not UTF-8"));
        CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "record_trace", bad[i], err), KVS_EINVAL);
    }
    CU_ASSERT_EQUAL(memcmp(&c, &before, sizeof c), 0);

    const char *p = write_file("utf8.ini", "[kvstashd]\nthreads = 2\n\n[model.\xff\xfe/*]\n"
                                           "scheme = int8\n");
    CU_ASSERT_EQUAL(kvs_config_load_file(&c, p, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "not UTF-8"));
    char *env[] = {"KVSTASH_RECORD_TRACE=/tmp/\xc0\xaf", NULL};
    CU_ASSERT_EQUAL(kvs_config_load_env(&c, env, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "not UTF-8"));
    CU_ASSERT_EQUAL(memcmp(&c, &before, sizeof c), 0);
}

/* key_offsets: a boolean setting (off by default), and a key of model rules
 * that the [model.PATTERN] sections write too; a bad value is an error naming
 * the key, and changes nothing. */
static void test_key_offsets(void)
{
    kvs_config c;
    char err[KVS_ERR_LEN], buf[KVS_CONFIG_STR_MAX];
    kvs_config_defaults(&c);
    CU_ASSERT_EQUAL(c.key_offsets, 0);
    const kvs_config_def *d = kvs_config_find("key-offsets");
    CU_ASSERT_PTR_NOT_NULL_FATAL(d);
    CU_ASSERT_TRUE(kvs_config_def_runtime(d));
    static const struct {
        const char *in;
        int64_t want;
    } good[] = {{"on", 1}, {"OFF", 0}, {"true", 1}, {"no", 0}, {"1", 1}, {"0", 0}, {"Yes", 1}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        CU_ASSERT_EQUAL(kvs_config_set(&c, d, good[i].in, err), 0);
        CU_ASSERT_EQUAL(c.key_offsets, good[i].want);
        kvs_config_format(&c, d, buf, sizeof buf);
        CU_ASSERT_STRING_EQUAL(buf, good[i].want ? "on" : "off");
    }
    static const char *const bad[] = {"maybe", "", "2", "on ", "enabled"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "key_offsets", bad[i], err), KVS_EINVAL);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "key_offsets: '"));
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "is not on or off"));
        CU_ASSERT_EQUAL(c.key_offsets, 1); /* "Yes", unchanged */
    }
    const char *p = write_file("koff_bad.ini", "threads = 2\nkey_offsets = maybe\n");
    kvs_config before = c;
    CU_ASSERT_EQUAL(kvs_config_load_file(&c, p, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "koff_bad.ini:2: key_offsets: 'maybe' is not on or off"));
    CU_ASSERT_EQUAL(memcmp(&c, &before, sizeof c), 0);

    /* model rules: key_offsets=BOOL, canonical true/false after skip_layers */
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "model_rules",
                                           "koff/* key_offsets=on scheme=int8 skip_layers=0; "
                                           "koff/exact key_offsets=NO; plain",
                                           err),
                    0);
    CU_ASSERT_STRING_EQUAL(c.model_rules, "koff/* scheme=int8 skip_layers=0 key_offsets=true; "
                                          "koff/exact key_offsets=false; plain");
    kvs_config_rule r;
    CU_ASSERT_TRUE_FATAL(kvs_config_model_rule(&c, "koff/a", 6, &r));
    CU_ASSERT_EQUAL(r.key_offsets, 1);
    CU_ASSERT_TRUE_FATAL(kvs_config_model_rule(&c, "koff/exact", 10, &r));
    CU_ASSERT_EQUAL(r.key_offsets, 0);
    CU_ASSERT_TRUE_FATAL(kvs_config_model_rule(&c, "plain", 5, &r));
    CU_ASSERT_EQUAL(r.key_offsets, -1); /* not set: the setting's */
    static const struct {
        const char *row, *value, *msg;
    } rbad[] = {
        {"model_rules", "m key_offsets=maybe", "key_offsets 'maybe' is not true or false"},
        {"model_rules", "m key_offsets=1 key_offsets=0", "key_offsets given twice"},
        {"tenant_rules", "default key_offsets=true", "unknown key 'key_offsets'"},
        {"model_rules", "m koff=1", "profile, key_offsets)"},
    };
    before = c;
    for (size_t i = 0; i < sizeof rbad / sizeof rbad[0]; i++) {
        err[0] = '\0';
        CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, rbad[i].row, rbad[i].value, err), KVS_EINVAL);
        if (strstr(err, rbad[i].msg) == NULL)
            fprintf(stderr, "%s '%s': %s\n", rbad[i].row, rbad[i].value, err);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, rbad[i].msg));
    }
    CU_ASSERT_EQUAL(memcmp(&c, &before, sizeof c), 0);

    /* the file: a global key and [model.PATTERN] sections */
    kvs_config_defaults(&c);
    p = write_file("koff.ini", "key_offsets = on\n[model.llama-*]\nscheme = int8\n"
                               "key_offsets = false\n[model.qwen]\nkey_offsets = yes\n");
    CU_ASSERT_EQUAL_FATAL(kvs_config_load_file(&c, p, err), 0);
    CU_ASSERT_EQUAL(c.key_offsets, 1);
    CU_ASSERT_STRING_EQUAL(c.model_rules, "llama-* scheme=int8 key_offsets=false; "
                                          "qwen key_offsets=true");
    p = write_file("koff_rule_bad.ini", "[model.gemma]\nscheme = int8\nkey_offsets = maybe\n"
                                        "scheme = fp4\n");
    CU_ASSERT_EQUAL(kvs_config_load_file(&c, p, err), KVS_EINVAL);
    /* the first bad line's message (inih goes on reading after it) */
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "koff_rule_bad.ini:3: [model.gemma]: key_offsets 'maybe'"));
    /* environment and flags */
    char *env[] = {"KVSTASH_KEY_OFFSETS=off", NULL};
    CU_ASSERT_EQUAL(kvs_config_load_env(&c, env, err), 0);
    CU_ASSERT_EQUAL(c.key_offsets, 0);
    kvs_config_action a;
    char *argv[] = {"kvstashd", "--key-offsets", "on", NULL};
    CU_ASSERT_EQUAL(kvs_config_from_args(&c, 3, argv, NULL, &a, err), 0);
    CU_ASSERT_EQUAL(c.key_offsets, 1);
    char *argv_bad[] = {"kvstashd", "--key-offsets=maybe", NULL};
    CU_ASSERT_EQUAL(kvs_config_from_args(&c, 2, argv_bad, NULL, &a, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "key_offsets: 'maybe'"));
}

static void test_docs_generation(void)
{
    char path[256];
    snprintf(path, sizeof path, "%s/md.txt", g_dir);
    FILE *f = fopen(path, "w+");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    kvs_config_print_markdown(f);
    kvs_config_print_usage(f, "kvstashd");
    rewind(f);
    char buf[16384];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    for (size_t i = 0; i < kvs_config_count(); i++) {
        char want[128];
        snprintf(want, sizeof want, "| `%s` |", kvs_config_def_name(kvs_config_at(i)));
        CU_ASSERT_PTR_NOT_NULL(strstr(buf, want));
    }
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "--log-level"));
}

int main(void)
{
    static const kvs_test_case cases[] = {
        {"defaults", test_defaults},
        {"sizes_and_durations", test_sizes_and_durations},
        {"ints_enums_strings", test_ints_enums_strings},
        {"file", test_file},
        {"env", test_env},
        {"precedence_and_flags", test_precedence_and_flags},
        {"utf8", test_utf8},
        {"key_offsets", test_key_offsets},
        {"docs_generation", test_docs_generation},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {{"config", suite_init, suite_cleanup, cases},
                                            {NULL, NULL, NULL, NULL}};
    return kvs_test_run(suites);
}
