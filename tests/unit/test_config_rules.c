/*
 * test_config_rules.c — the rule lists of service/config.h (model_rules,
 * tenant_rules): what a list may say, its canonical text, which rule a model or
 * tenant gets, and how [model.PATTERN] / [tenant.NAME] sections of a config file
 * become those rows, and which tenant names a tenant_rules may use
 * (kvs_tenants_apply_rules). The precedence of the scheme sources at Put is tested
 * against a real kvstashd (tests/integration/scheme_rules.py).
 */
#include "config.h"
#include "kvs_error.h"
#include "kvs_test.h"
#include "tenants.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void test_canonical(void)
{
    kvs_config c;
    char err[KVS_ERR_LEN];
    kvs_config_defaults(&c);
    CU_ASSERT_STRING_EQUAL(c.model_rules, "");
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "model_rules",
                                           "  qwen-*   skip_layers=0,2-3 SCHEME=int8 ;"
                                           "llama fp16=YES scheme=FP8_E5M2  ",
                                           err),
                    KVS_EINVAL); /* keys are lower case */
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "unknown key 'SCHEME'"));
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "model_rules",
                                           "  qwen-*   skip_layers=0,2-3 scheme=INT8 ;"
                                           "llama fp16=YES scheme=FP8_E5M2  ",
                                           err),
                    0);
    CU_ASSERT_STRING_EQUAL(c.model_rules,
                           "qwen-* scheme=int8 skip_layers=0,2-3; llama scheme=fp8_e5m2 fp16=true");
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "tenant_rules",
                                           "acme quota=8589934592; beta quota=1536KiB fp16=off; "
                                           "gamma quota=0 scheme=fp16",
                                           err),
                    0);
    CU_ASSERT_STRING_EQUAL(c.tenant_rules, "acme quota=8GiB; beta fp16=false quota=1536KiB; "
                                           "gamma scheme=fp16 quota=0");
    /* The canonical text is a fixed point. */
    kvs_config d = c;
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&d, "tenant_rules", c.tenant_rules, err), 0);
    CU_ASSERT_STRING_EQUAL(d.tenant_rules, c.tenant_rules);
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&d, "model_rules", "", err), 0);
    CU_ASSERT_STRING_EQUAL(d.model_rules, "");
}

static void test_refused(void)
{
    static const struct {
        const char *row, *value, *says;
    } bad[] = {
        {"model_rules", "x scheme=fp9", "scheme 'fp9'"},
        {"model_rules", "x fp16=maybe", "fp16 'maybe'"},
        {"model_rules", "x skip_layers=3-1", "skip_layers '3-1'"},
        {"model_rules", "x skip_layers=", "skip_layers ''"},
        {"model_rules", "x quota=1GiB", "unknown key 'quota'"},
        {"model_rules", "x scheme=int8 scheme=fp16", "scheme given twice"},
        {"model_rules", "x fp16=1; y fp16=0; x fp16=0", "rule 3: 'x' already has a rule"},
        {"model_rules", "a*b fp16=1", "'*' only at its end"},
        {"model_rules", "x; ; y", "rule 2 is empty"},
        {"model_rules", "x scheme", "'scheme' is not key=value"},
        {"model_rules", "=x fp16=1", "not a model pattern"},
        {"tenant_rules", "acme quota=-1", "quota '-1'"},
        {"tenant_rules", "acme quota=8XB", "quota '8XB'"},
        {"tenant_rules", "ac*me quota=1", "no '*'"},
        {"tenant_rules", "acme quota=1 quota=2", "quota given twice"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvs_config c;
        char err[KVS_ERR_LEN] = "";
        kvs_config_defaults(&c);
        CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "model_rules", "keep fp16=1", NULL), 0);
        CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, bad[i].row, bad[i].value, err), KVS_EINVAL);
        if (strstr(err, bad[i].says) == NULL || strstr(err, bad[i].row) == NULL)
            fprintf(stderr, "\n  '%s': message '%s' lacks '%s'\n", bad[i].value, err, bad[i].says);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, bad[i].says));
        CU_ASSERT_PTR_NOT_NULL(strstr(err, bad[i].row));
        CU_ASSERT_STRING_EQUAL(c.model_rules, "keep fp16=true"); /* unchanged */
        CU_ASSERT_STRING_EQUAL(c.tenant_rules, "");
    }
}

static void test_which_rule(void)
{
    kvs_config c;
    kvs_config_rule r;
    kvs_config_defaults(&c);
    CU_ASSERT_EQUAL(kvs_config_model_rule(&c, "llama-3-8b", 10, &r), 0);
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "model_rules",
                                           "* scheme=fp8_e5m2; llama-* scheme=int8; "
                                           "llama-3-* scheme=fp8_e4m3 skip_layers=31; "
                                           "llama-3-8b fp16=true; llama-3-8b* scheme=fp16",
                                           NULL),
                    0);
    CU_ASSERT_EQUAL(kvs_config_model_rule(&c, "llama-3-8b", 10, &r), 1);
    CU_ASSERT_STRING_EQUAL(r.subject, "llama-3-8b"); /* exact beats the prefix of equal length */
    CU_ASSERT_EQUAL(r.fp16, 1);
    CU_ASSERT_EQUAL(r.scheme, 0u);
    CU_ASSERT_EQUAL(kvs_config_model_rule(&c, "llama-3-8b-instruct", 19, &r), 1);
    CU_ASSERT_STRING_EQUAL(r.subject, "llama-3-8b*");
    CU_ASSERT_EQUAL(kvs_config_model_rule(&c, "llama-3-70b", 11, &r), 1);
    CU_ASSERT_STRING_EQUAL(r.subject, "llama-3-*");
    CU_ASSERT_EQUAL(r.scheme, 2u);
    CU_ASSERT_EQUAL(r.fp16, -1);
    CU_ASSERT_TRUE(kvs_config_layer_listed(r.skip_layers, 31));
    CU_ASSERT_FALSE(kvs_config_layer_listed(r.skip_layers, 30));
    CU_ASSERT_EQUAL(kvs_config_model_rule(&c, "llama-2", 7, &r), 1);
    CU_ASSERT_STRING_EQUAL(r.subject, "llama-*");
    CU_ASSERT_EQUAL(kvs_config_model_rule(&c, "qwen", 4, &r), 1);
    CU_ASSERT_STRING_EQUAL(r.subject, "*");
    /* The length bounds the comparison: "llama-3-8b" is not "llama-3-8" + garbage. */
    CU_ASSERT_EQUAL(kvs_config_model_rule(&c, "llama-3-8bXYZ", 9, &r), 1);
    CU_ASSERT_STRING_EQUAL(r.subject, "llama-3-*");

    CU_ASSERT_EQUAL(
        kvs_config_set_by_name(&c, "tenant_rules", "acme quota=1MiB; acme2 fp16=1", NULL), 0);
    CU_ASSERT_EQUAL(kvs_config_tenant_rule(&c, "acme", &r), 1);
    CU_ASSERT_EQUAL(r.has_quota, 1);
    CU_ASSERT_EQUAL(r.quota, 1u << 20);
    CU_ASSERT_EQUAL(kvs_config_tenant_rule(&c, "acme2", &r), 1);
    CU_ASSERT_EQUAL(r.has_quota, 0);
    CU_ASSERT_EQUAL(r.fp16, 1);
    CU_ASSERT_EQUAL(kvs_config_tenant_rule(&c, "acm", &r), 0);
}

static int write_file(char *path, size_t n, const char *text)
{
    snprintf(path, n, "/tmp/kvs-cfgrules-XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0)
        return -1;
    size_t len = strlen(text);
    int ok = write(fd, text, len) == (ssize_t)len;
    close(fd);
    return ok ? 0 : -1;
}

static void test_file_sections(void)
{
    char path[64], err[KVS_ERR_LEN];
    kvs_config c;
    CU_ASSERT_EQUAL_FATAL(write_file(path, sizeof path,
                                     "[kvstashd]\ndefault_scheme = fp16\n"
                                     "[tenant.acme]\ntoken = aaaaaaaaaa\nquota = 2 GiB\n"
                                     "scheme = int8\nmodels = llama-*\n"
                                     "[model.llama-*]\nskip_layers = 0\nfp16 = no\n"
                                     "[tenant.beta]\ntoken = bbbbbbbbbb\n"
                                     "[model.qwen]\nscheme = fp8_e4m3\n"),
                          0);
    kvs_config_defaults(&c);
    CU_ASSERT_EQUAL(kvs_config_load_file(&c, path, err), 0);
    CU_ASSERT_STRING_EQUAL(c.tenant_rules, "acme scheme=int8 quota=2GiB");
    CU_ASSERT_STRING_EQUAL(c.model_rules, "llama-* fp16=false skip_layers=0; qwen scheme=fp8_e4m3");
    unlink(path);

    static const struct {
        const char *text, *says;
    } bad[] = {
        {"[model.x]\nscheme = int4\n", ":2: [model.x]: scheme 'int4'"},
        {"[model.x]\ntoken = t\n", ":2: [model.x]: unknown key 'token'"},
        {"[model.x]\nfp16 = 1\n[model.y]\nfp16 = 1\n[model.x]\nscheme = int8\n",
         ":6: model_rules: rule 3: 'x' already has a rule"},
        {"[tenant.a]\nquota = lots\n", ":2: [tenant.a]: quota 'lots'"},
        {"tenant_rules = a quota=1\n", "key tenant_rules: write the keys into [tenant.NAME]"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CU_ASSERT_EQUAL_FATAL(write_file(path, sizeof path, bad[i].text), 0);
        kvs_config_defaults(&c);
        CU_ASSERT_EQUAL(kvs_config_load_file(&c, path, err), KVS_EINVAL);
        if (strstr(err, bad[i].says) == NULL)
            fprintf(stderr, "\n  message '%s' lacks '%s'\n", err, bad[i].says);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, bad[i].says));
        unlink(path);
    }
    /* Neither a flag nor the environment may set tenant_rules; model_rules they may. */
    char *argv[] = {"kvstashd", "--tenant-rules", "a quota=1", NULL};
    char *envp[] = {"KVSTASH_TENANT_RULES=a quota=1", NULL};
    char *envm[] = {"KVSTASH_MODEL_RULES=m* fp16=1", NULL};
    kvs_config_action act;
    CU_ASSERT_EQUAL(kvs_config_from_args(&c, 3, argv, NULL, &act, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "option tenant_rules"));
    CU_ASSERT_EQUAL(kvs_config_from_args(&c, 1, argv, envp, &act, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "environment tenant_rules"));
    CU_ASSERT_EQUAL(kvs_config_from_args(&c, 1, argv, envm, &act, err), 0);
    CU_ASSERT_STRING_EQUAL(c.model_rules, "m* fp16=true");
}

/* Random lists from the grammar's own pieces: each is refused with a message
 * naming its row, or stored canonical, and the canonical text is a fixed point
 * that finds the same rules. Under ASan this is also the parser's memory check. */
static void test_random_lists(void)
{
    static const char *const pieces[] = {"llama-*",
                                         "qwen",
                                         "*",
                                         "acme",
                                         "a*b",
                                         "x",
                                         " ",
                                         " ",
                                         ";",
                                         "; ",
                                         "=",
                                         "scheme=int8",
                                         "scheme=FP8_E4M3",
                                         "scheme=fp9",
                                         "fp16=yes",
                                         "fp16=0",
                                         "fp16=maybe",
                                         "skip_layers=0,31",
                                         "skip_layers=2-1",
                                         "skip_layers=1023",
                                         "skip_layers=1024",
                                         "quota=8GiB",
                                         "quota=-1",
                                         "quota=1k",
                                         "quota=",
                                         "scheme",
                                         "\t",
                                         "\xc3\xa9",
                                         "k=v",
                                         "ab=cd=ef"};
    const size_t np = sizeof pieces / sizeof pieces[0];
    uint64_t st = 12345;
    unsigned stored = 0, refused = 0;
    for (int it = 0; it < 20000; it++) {
        char text[600] = "";
        size_t used = 0;
        int n = 1 + (int)(st % 12);
        for (int i = 0; i < n; i++) {
            st ^= st << 13, st ^= st >> 7, st ^= st << 17;
            const char *p = pieces[st % np];
            size_t l = strlen(p);
            if (used + l + 2 >= sizeof text)
                break;
            memcpy(text + used, p, l);
            used += l;
            if (st & 0x100)
                text[used++] = ' ';
            text[used] = '\0';
        }
        const char *row = st & 0x200 ? "tenant_rules" : "model_rules";
        kvs_config c, d;
        char err[KVS_ERR_LEN] = "";
        kvs_config_defaults(&c);
        int rc = kvs_config_set_by_name(&c, row, text, err);
        if (rc != 0) {
            CU_ASSERT_EQUAL(rc, KVS_EINVAL);
            CU_ASSERT_PTR_NOT_NULL(strstr(err, row));
            refused++;
            continue;
        }
        stored++;
        const char *canon = row[0] == 't' ? c.tenant_rules : c.model_rules;
        d = c;
        CU_ASSERT_EQUAL(kvs_config_set_by_name(&d, row, canon, err), 0);
        CU_ASSERT_STRING_EQUAL(row[0] == 't' ? d.tenant_rules : d.model_rules, canon);
        kvs_config_rule r1, r2;
        int h1 = row[0] == 't' ? kvs_config_tenant_rule(&c, "acme", &r1)
                               : kvs_config_model_rule(&c, "llama-3", 7, &r1);
        int h2 = row[0] == 't' ? kvs_config_tenant_rule(&d, "acme", &r2)
                               : kvs_config_model_rule(&d, "llama-3", 7, &r2);
        CU_ASSERT_EQUAL(h1, h2);
        if (h1 && h2) {
            CU_ASSERT_STRING_EQUAL(r1.subject, r2.subject);
            CU_ASSERT_EQUAL(r1.scheme, r2.scheme);
            CU_ASSERT_EQUAL(r1.fp16, r2.fp16);
            CU_ASSERT_EQUAL(r1.quota, r2.quota);
        }
    }
    CU_ASSERT(stored > 100);
    CU_ASSERT(refused > 100);
    printf("\n  %u stored, %u refused\n", stored, refused);
}

/* kvs_tenants_apply_rules without a store: the names a tenant_rules may use. */
static void test_tenant_names(void)
{
    char err[KVS_ERR_LEN] = "", path[64];
    kvs_tenants *open = NULL, *two = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_tenants_load(NULL, &open, err), 0);
    CU_ASSERT_EQUAL(kvs_tenants_apply_rules(open, "", NULL, err), 0);
    CU_ASSERT_EQUAL(kvs_tenants_apply_rules(open, "default quota=1MiB fp16=true", NULL, err), 0);
    CU_ASSERT_EQUAL(kvs_tenants_apply_rules(open, "acme quota=1MiB", NULL, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "tenant_rules: 'acme'"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "open mode"));
    CU_ASSERT_EQUAL_FATAL(write_file(path, sizeof path,
                                     "[tenant.acme]\ntoken = aaaaaaaaaa\n"
                                     "[tenant.beta]\ntoken = bbbbbbbbbb\n"),
                          0);
    CU_ASSERT_EQUAL_FATAL(kvs_tenants_load(path, &two, err), 0);
    unlink(path);
    CU_ASSERT_EQUAL(kvs_tenants_apply_rules(two, "acme quota=1MiB; beta fp16=1", NULL, err), 0);
    CU_ASSERT_EQUAL(kvs_tenants_apply_rules(two, "acme quota=1MiB; default fp16=1", NULL, err),
                    KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "'default' is not a tenant"));
    CU_ASSERT_EQUAL(kvs_tenants_apply_rules(two, "acme quota=lots", NULL, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "quota 'lots'"));
    kvs_tenants_free(open);
    kvs_tenants_free(two);
}

static void test_backend_row(void)
{
    kvs_config c;
    char err[KVS_ERR_LEN];
    kvs_config_defaults(&c);
    CU_ASSERT_EQUAL(c.ingest_backend, KVS_BACKEND_AUTO);
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "ingest_backend", "GPU", err), 0);
    CU_ASSERT_EQUAL(c.ingest_backend, KVS_BACKEND_GPU);
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "ingest_backend", "tpu", err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "auto|cpu|gpu"));
    CU_ASSERT_FALSE(kvs_config_def_runtime(kvs_config_find("ingest_backend")));
    CU_ASSERT_TRUE(kvs_config_def_runtime(kvs_config_find("model_rules")));
    CU_ASSERT_TRUE(kvs_config_def_runtime(kvs_config_find("tenant_rules")));
}

int main(void)
{
    static const kvs_test_case cases[] = {
        {"canonical", test_canonical},       {"refused", test_refused},
        {"which_rule", test_which_rule},     {"file_sections", test_file_sections},
        {"backend_row", test_backend_row},   {"tenant_names", test_tenant_names},
        {"random_lists", test_random_lists}, {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {{"config_rules", NULL, NULL, cases},
                                            {NULL, NULL, NULL, NULL}};
    return kvs_test_run(suites);
}
