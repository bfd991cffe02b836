/*
 * test_config_rules.c — the rule lists of service/config.h (model_rules,
 * tenant_rules): what a list may say, its canonical text, which rule a model or
 * tenant gets, and how [model.PATTERN] / [tenant.NAME] sections of a config file
 * become those rows, and which tenant names a tenant_rules may use
 * (kvs_tenants_apply_rules), and the profile key of model rules: the file read
 * and checked when a list is set, the scales a Put takes from it
 * (kvs_profiles_scales). The precedence of the scheme sources at Put is tested
 * against a real kvstashd (tests/integration/scheme_rules.py).
 */
#include "config.h"
#include "kvq_calib.h"
#include "kvs_error.h"
#include "kvs_test.h"
#include "profiles.h"
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

/* kvs_tenants_same_identity: what a reload cannot apply (name, token, secret,
 * models, admin, order) differs; what tenant_rules carries does not count, nor
 * whether a token is given as token = or as its token_sha256. */
static void test_tenant_identity(void)
{
    static const char base[] = "[tenant.acme]\ntoken = aaaaaaaaaa\nsecret = s1\n"
                               "models = m/*\nquota = 1MiB\n[tenant.beta]\ntoken = bbbbbbbbbb\n";
    static const struct {
        const char *text;
        int same;
    } cases[] = {
        {base, 1},
        {"[tenant.acme]\ntoken = aaaaaaaaaa\nsecret = s1\nmodels = m/*\nquota = 2MiB\n"
         "scheme = fp16\n[tenant.beta]\ntoken = bbbbbbbbbb\n",
         1},
        {"[tenant.acme]\ntoken = aaaaaaaaaZ\nsecret = s1\nmodels = m/*\n"
         "[tenant.beta]\ntoken = bbbbbbbbbb\n",
         0},
        {"[tenant.acme]\ntoken = aaaaaaaaaa\nsecret = s2\nmodels = m/*\n"
         "[tenant.beta]\ntoken = bbbbbbbbbb\n",
         0},
        {"[tenant.acme]\ntoken = aaaaaaaaaa\nsecret = s1\nmodels = n/*\n"
         "[tenant.beta]\ntoken = bbbbbbbbbb\n",
         0},
        {"[tenant.acme]\ntoken = aaaaaaaaaa\nsecret = s1\nmodels = m/*\nadmin = true\n"
         "[tenant.beta]\ntoken = bbbbbbbbbb\n",
         0},
        {"[tenant.beta]\ntoken = bbbbbbbbbb\n[tenant.acme]\ntoken = aaaaaaaaaa\nsecret = s1\n"
         "models = m/*\n",
         0},
        {"[tenant.acme]\ntoken = aaaaaaaaaa\nsecret = s1\nmodels = m/*\nucx = false\n"
         "[tenant.beta]\ntoken = bbbbbbbbbb\n",
         0},
        {"[tenant.acme]\ntoken = aaaaaaaaaa\nsecret = s1\nmodels = m/*\nucx = true\n"
         "quota = 1MiB\n[tenant.beta]\ntoken = bbbbbbbbbb\n",
         1},
        {"[tenant.acme]\ntoken = aaaaaaaaaa\nsecret = s1\nmodels = m/*\n", 0},
        {"", 0},
        /* token_sha256 of the same token (sha256sum of aaaaaaaaaa, either case): the same */
        {"[tenant.acme]\ntoken_sha256 = "
         "bf2cb58a68f684d95a3b78ef8f661c9a4e5b09e82cc8f9cc88cce90528caeb27\nsecret = s1\n"
         "models = m/*\n[tenant.beta]\ntoken_sha256 = "
         "6D2FE32DC4249EF7E7359C6D874FFFBBF335E832E49A2681236E1B686AF78794\n",
         1},
        /* ... of aaaaaaaaaZ: another token */
        {"[tenant.acme]\ntoken_sha256 = "
         "f144a8156b78e361b2a253146138daef5076bce4247e518abeef9b8531e063f6\nsecret = s1\n"
         "models = m/*\n[tenant.beta]\ntoken = bbbbbbbbbb\n",
         0},
    };
    char err[KVS_ERR_LEN] = "", path[64];
    kvs_tenants *a = NULL;
    CU_ASSERT_EQUAL_FATAL(write_file(path, sizeof path, base), 0);
    CU_ASSERT_EQUAL_FATAL(kvs_tenants_load(path, &a, err), 0);
    unlink(path);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvs_tenants *b = NULL;
        CU_ASSERT_EQUAL_FATAL(write_file(path, sizeof path, cases[i].text), 0);
        CU_ASSERT_EQUAL_FATAL(kvs_tenants_load(path, &b, err), 0);
        unlink(path);
        CU_ASSERT_EQUAL(kvs_tenants_same_identity(a, b), cases[i].same);
        CU_ASSERT_EQUAL(kvs_tenants_same_identity(b, a), cases[i].same);
        kvs_tenants_free(b);
    }
    kvs_tenants_free(a);
    /* ucx: a boolean like fp16 and admin; true unless said otherwise */
    CU_ASSERT_EQUAL_FATAL(
        write_file(path, sizeof path, "[tenant.x]\ntoken = xxxxxxxxxx\nucx = maybe\n"), 0);
    CU_ASSERT_EQUAL(kvs_tenants_load(path, &a, err), KVS_EINVAL);
    unlink(path);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "ucx 'maybe' is not true or false"));
    /* two bad lines: the first one's number and its own message */
    CU_ASSERT_EQUAL_FATAL(write_file(path, sizeof path,
                                     "[tenant.x]\ntoken = xxxxxxxxxx\nucx = maybe\nadmin = perhaps\n"),
                          0);
    CU_ASSERT_EQUAL(kvs_tenants_load(path, &a, err), KVS_EINVAL);
    unlink(path);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, ":3: "));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "ucx 'maybe'"));
    CU_ASSERT_PTR_NULL(strstr(err, "perhaps"));
    CU_ASSERT_EQUAL_FATAL(write_file(path, sizeof path, base), 0);
    CU_ASSERT_EQUAL_FATAL(kvs_tenants_load(path, &a, err), 0);
    unlink(path);
    CU_ASSERT_EQUAL(kvs_tenants_at(a, 0)->ucx, 1);
    kvs_tenants_free(a);
    CU_ASSERT_EQUAL_FATAL(kvs_tenants_load(NULL, &a, err), 0);
    CU_ASSERT_EQUAL(kvs_tenants_at(a, 0)->ucx, 1); /* open mode */
    kvs_tenants_free(a);
}

/* ---- profile = PATH (model rules) ------------------------------------------- */

/* Writes a 3-layer, 2-head, D = 16 profile of `scheme` to a temp file (path, n
 * bytes): layer l has k_amax 10 (l + 1), v_amax l + 0.5, tensor scales amax /
 * the scheme's qmax. 0 or -1. */
static int write_profile(char *path, size_t n, kvs_scheme scheme, int post_rope)
{
    kvs_profile shape;
    memset(&shape, 0, sizeof shape);
    strcpy(shape.model, "test-model");
    shape.num_layers = 3;
    shape.num_kv_heads = 2;
    shape.head_dim = 16;
    shape.block_tokens = 64;
    shape.dtype = KVS_DTYPE_FP16;
    shape.post_rope = post_rope;
    shape.scheme = scheme;
    shape.percentile = 100.0;
    shape.samples = 1;
    shape.tokens = 64;
    kvs_profile *p = NULL;
    char err[KVS_ERR_LEN] = "";
    if (kvs_profile_create(&shape, &p, err) != 0) {
        fprintf(stderr, "\n  kvs_profile_create: %s\n", err);
        return -1;
    }
    float qmax = scheme == KVS_SCHEME_INT8       ? 127.0f
                 : scheme == KVS_SCHEME_FP8_E5M2 ? 57344.0f
                                                 : 448.0f;
    for (size_t i = 0; i < 3 * 2 * 16; i++)
        p->k_scales[i] = 0.01f;
    for (size_t i = 0; i < 3 * 2; i++)
        p->v_scales[i] = 0.02f;
    for (uint32_t l = 0; l < 3; l++) {
        p->layers[l].k_amax = 10.0f * (float)(l + 1);
        p->layers[l].v_amax = (float)l + 0.5f;
        p->layers[l].k_tensor_scale = p->layers[l].k_amax / qmax;
        p->layers[l].v_tensor_scale = p->layers[l].v_amax / qmax;
    }
    snprintf(path, n, "/tmp/kvs-cfgprof-XXXXXX");
    int fd = mkstemp(path);
    int rc = fd < 0 ? -1 : 0;
    if (fd >= 0)
        close(fd);
    if (rc == 0 && kvs_profile_write(path, p, err) != 0) {
        fprintf(stderr, "\n  kvs_profile_write: %s\n", err);
        rc = -1;
    }
    kvs_profile_free(p);
    return rc;
}

static void test_profile_key(void)
{
    char prof[64], rules[512], want[512], err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL_FATAL(write_profile(prof, sizeof prof, KVS_SCHEME_FP8_E4M3, 1), 0);
    kvs_config c;
    kvs_config_defaults(&c);
    snprintf(rules, sizeof rules, "  m-* profile=%s   scheme=fp8_e4m3 ; other fp16=1", prof);
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "model_rules", rules, err), 0);
    snprintf(want, sizeof want, "m-* scheme=fp8_e4m3 profile=%s; other fp16=true", prof);
    CU_ASSERT_STRING_EQUAL(c.model_rules, want);
    kvs_config d = c; /* the canonical text is a fixed point */
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&d, "model_rules", c.model_rules, err), 0);
    CU_ASSERT_STRING_EQUAL(d.model_rules, want);
    kvs_config_rule r;
    CU_ASSERT_EQUAL(kvs_config_model_rule(&c, "m-7b", 4, &r), 1);
    CU_ASSERT_STRING_EQUAL(r.profile, prof);
    CU_ASSERT_EQUAL(r.scheme, 2u);
    CU_ASSERT_EQUAL(kvs_config_model_rule(&c, "other", 5, &r), 1);
    CU_ASSERT_STRING_EQUAL(r.profile, "");

    /* Refused values leave the row as it was and name the rule and the file. */
    char garbage[64], pre[64];
    CU_ASSERT_EQUAL_FATAL(write_file(garbage, sizeof garbage, "kvstash-profile 1\nnonsense\n"), 0);
    CU_ASSERT_EQUAL_FATAL(write_profile(pre, sizeof pre, KVS_SCHEME_FP8_E4M3, 0), 0);
    struct {
        char value[256];
        const char *says;
    } bad[] = {
        {"m-* profile=/nonexistent/p.txt", "model_rules: rule 'm-*': profile "
                                           "'/nonexistent/p.txt': cannot open"},
        {"", "model_rules: rule 'x': profile '"},
        {"", "pre-RoPE keys"},
        {"", "profile given twice"},
        {"m-* profile=", "profile '' is not a file path"},
        {"m-* fp16=1; y profile=/nonexistent/q", "rule 'y': profile '/nonexistent/q'"},
        {"m-* profile=/dev/null", "profile '/dev/null': not a regular file"},
    };
    snprintf(bad[1].value, sizeof bad[1].value, "x profile=%s", garbage);
    snprintf(bad[2].value, sizeof bad[2].value, "x profile=%s", pre);
    snprintf(bad[3].value, sizeof bad[3].value, "x profile=%s profile=%s", prof, prof);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        d = c;
        CU_ASSERT_EQUAL(kvs_config_set_by_name(&d, "model_rules", bad[i].value, err), KVS_EINVAL);
        if (strstr(err, bad[i].says) == NULL)
            fprintf(stderr, "\n  %zu: message '%s' lacks '%s'\n", i, err, bad[i].says);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, bad[i].says));
        CU_ASSERT_STRING_EQUAL(d.model_rules, want);
    }
    /* The garbage file's own error (the profile grammar) is in the message. */
    snprintf(rules, sizeof rules, "x profile=%s", garbage);
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&d, "model_rules", rules, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "line"));
    /* Tenant rules have no profile. */
    snprintf(rules, sizeof rules, "acme profile=%s", prof);
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&d, "tenant_rules", rules, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "unknown key 'profile'"));

    /* [model.PATTERN] profile = PATH in a config file, and a bad one. */
    char ini[64], text[512];
    snprintf(text, sizeof text, "[model.m-*]\nprofile = %s\nscheme = fp8_e4m3\n", prof);
    CU_ASSERT_EQUAL_FATAL(write_file(ini, sizeof ini, text), 0);
    kvs_config_defaults(&d);
    CU_ASSERT_EQUAL(kvs_config_load_file(&d, ini, err), 0);
    snprintf(want, sizeof want, "m-* scheme=fp8_e4m3 profile=%s", prof);
    CU_ASSERT_STRING_EQUAL(d.model_rules, want);
    unlink(ini);
    snprintf(text, sizeof text, "[model.m-*]\nscheme = int8\nprofile = %s\n", garbage);
    CU_ASSERT_EQUAL_FATAL(write_file(ini, sizeof ini, text), 0);
    kvs_config_defaults(&d);
    CU_ASSERT_EQUAL(kvs_config_load_file(&d, ini, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, ":3: model_rules: rule 'm-*': profile '"));
    unlink(ini);
    unlink(garbage);
    unlink(pre);
    unlink(prof);
}

static void test_profile_scales(void)
{
    char e4[64], i8[64], rules[512], err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL_FATAL(write_profile(e4, sizeof e4, KVS_SCHEME_FP8_E4M3, 1), 0);
    CU_ASSERT_EQUAL_FATAL(write_profile(i8, sizeof i8, KVS_SCHEME_INT8, 1), 0);
    kvs_profiles *ps = NULL;
    CU_ASSERT_EQUAL(kvs_profiles_load("a fp16=1; b scheme=int8", &ps, err), 0);
    CU_ASSERT_PTR_NULL(ps); /* no rule names a profile */
    snprintf(rules, sizeof rules, "a profile=%s; b scheme=int8; c* profile=%s", e4, i8);
    CU_ASSERT_EQUAL_FATAL(kvs_profiles_load(rules, &ps, err), 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(ps);
    kvs_profiles_shape sh = {3, 2, 16};
    const uint8_t schemes[3] = {2, 3, 4}; /* e4m3, e5m2, int8 */
    float k[3], v[3];
    int first = -1;
    CU_ASSERT_EQUAL(kvs_profiles_scales(ps, "a", &sh, schemes, k, v, &first, err),
                    KVS_PROFILES_APPLIED);
    CU_ASSERT_EQUAL(first, 0);
    CU_ASSERT_EQUAL(k[0], 10.0f / 448.0f); /* the profile's own e4m3 scale */
    CU_ASSERT_EQUAL(v[0], 0.5f / 448.0f);
    CU_ASSERT_EQUAL(k[1], 20.0f / 57344.0f); /* e5m2: its amax / 57344 */
    CU_ASSERT_EQUAL(v[1], 1.5f / 57344.0f);
    CU_ASSERT_EQUAL(k[2], 0.0f); /* int8 takes none */
    CU_ASSERT_EQUAL(v[2], 0.0f);
    /* An int8 profile: its amax over the FP8 format's max. */
    const uint8_t e4all[3] = {2, 2, 1};
    CU_ASSERT_EQUAL(kvs_profiles_scales(ps, "c*", &sh, e4all, k, v, NULL, err),
                    KVS_PROFILES_APPLIED);
    CU_ASSERT_EQUAL(k[0], 10.0f / 448.0f);
    CU_ASSERT_EQUAL(k[1], 20.0f / 448.0f);
    CU_ASSERT_EQUAL(v[1], 1.5f / 448.0f);
    CU_ASSERT_EQUAL(k[2], 0.0f); /* fp16 layer */
    /* No profile for b, nor for an unknown subject, nor in no set. */
    CU_ASSERT_EQUAL(kvs_profiles_scales(ps, "b", &sh, schemes, k, v, NULL, err), KVS_PROFILES_NONE);
    CU_ASSERT_EQUAL(kvs_profiles_scales(ps, "zz", &sh, schemes, k, v, NULL, err),
                    KVS_PROFILES_NONE);
    CU_ASSERT_EQUAL(kvs_profiles_scales(NULL, "a", &sh, schemes, k, v, NULL, err),
                    KVS_PROFILES_NONE);
    /* Each of layers, heads, head_dim differing is a mismatch, first_time once per rule. */
    const kvs_profiles_shape bad[3] = {{2, 2, 16}, {3, 1, 16}, {3, 2, 32}};
    for (int i = 0; i < 3; i++) {
        k[0] = -1.0f;
        CU_ASSERT_EQUAL(kvs_profiles_scales(ps, "a", &bad[i], schemes, k, v, &first, err),
                        KVS_PROFILES_MISMATCH);
        CU_ASSERT_EQUAL(first, i == 0);
        CU_ASSERT_EQUAL(k[0], -1.0f); /* untouched */
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "model rule 'a': profile '"));
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "is for 3 layers x 2 kv heads x head_dim 16"));
    }
    CU_ASSERT_EQUAL(kvs_profiles_scales(ps, "c*", &bad[0], schemes, k, v, &first, err),
                    KVS_PROFILES_MISMATCH);
    CU_ASSERT_EQUAL(first, 1); /* another rule logs its own */
    kvs_profiles_free(ps);
    /* A list whose profile went away since it was checked fails to load. */
    unlink(i8);
    ps = (kvs_profiles *)&ps;
    CU_ASSERT_EQUAL(kvs_profiles_load(rules, &ps, err), KVS_EIO);
    CU_ASSERT_PTR_NULL(ps);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "cannot open"));
    unlink(e4);
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
        {"canonical", test_canonical},
        {"refused", test_refused},
        {"which_rule", test_which_rule},
        {"file_sections", test_file_sections},
        {"backend_row", test_backend_row},
        {"tenant_names", test_tenant_names},
        {"tenant_identity", test_tenant_identity},
        {"random_lists", test_random_lists},
        {"profile_key", test_profile_key},
        {"profile_scales", test_profile_scales},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {{"config_rules", NULL, NULL, cases},
                                            {NULL, NULL, NULL, NULL}};
    return kvs_test_run(suites);
}
