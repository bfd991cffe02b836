/*
 * test_service_data.c — the data path's pure modules, without a server:
 * tenants.c (INI sections, authentication, model patterns), leases.c (owner
 * registry), config.c's layer lists, and codec.c (sizes, encode with the
 * measured error, egress formats, corrupt blocks).
 */
#include "codec.h"
#include "config.h"
#include "kv_block.h"
#include "kvq_cpu.h"
#include "kvq_math.h"
#include "kvs_error.h"
#include "kvs_test.h"
#include "leases.h"
#include "stats.h"
#include "tenants.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SCRATCH_NAME "test_svcdata" /* its files go to /tmp/kvs_test_svcdata_XXXXXX */
#include "scratch_test_util.h"

/* ---- tenants ---------------------------------------------------------- */

static void test_tenants_open_mode(void)
{
    kvs_tenants *t = NULL;
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL_FATAL(kvs_tenants_load(NULL, &t, err), 0);
    CU_ASSERT_TRUE(kvs_tenants_open_mode(t));
    CU_ASSERT_EQUAL(kvs_tenants_count(t), 1u);
    const kvs_tenant *tn = NULL;
    CU_ASSERT_EQUAL(kvs_tenants_authenticate(t, NULL, 0, &tn, err), 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(tn);
    CU_ASSERT_STRING_EQUAL(tn->name, "default");
    CU_ASSERT_EQUAL(tn->id, 0);
    CU_ASSERT_EQUAL(tn->secret_len, 0u);
    CU_ASSERT_TRUE(tn->admin);
    CU_ASSERT_TRUE(kvs_tenant_may_use_model(tn, "any/model", 9));
    CU_ASSERT_PTR_EQUAL(kvs_tenants_by_id(t, 0), tn);
    kvs_tenants_free(t);
    /* a config file without tenant sections is open mode too */
    const char *p = write_file("plain.ini", "[kvstashd]\nthreads = 2\n");
    CU_ASSERT_EQUAL_FATAL(kvs_tenants_load(p, &t, err), 0);
    CU_ASSERT_TRUE(kvs_tenants_open_mode(t));
    kvs_tenants_free(t);
}

static void test_tenants_parse_and_auth(void)
{
    const char *p = write_file("t.ini", "threads = 2\n"
                                        "[tenant.a]\ntoken = aaaaaaaa-1\nsecret = s3\n"
                                        "quota = 2MiB\nmodels = llama/*, exact/m\nfp16 = yes\n"
                                        "[kvstashd]\nlog_level = warn\n"
                                        "[tenant.b]\ntoken = bbbbbbbb-2\nadmin = true\n"
                                        "scheme = FP8_E4M3\nskip_layers = 0,2-3\n");
    kvs_tenants *t = NULL;
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL_FATAL(kvs_tenants_load(p, &t, err), 0);
    CU_ASSERT_FALSE(kvs_tenants_open_mode(t));
    CU_ASSERT_EQUAL(kvs_tenants_count(t), 2u);
    const kvs_tenant *a = kvs_tenants_at(t, 0), *b = kvs_tenants_at(t, 1);
    CU_ASSERT_FATAL(a != NULL && b != NULL);
    CU_ASSERT_EQUAL(a->id, 1);
    CU_ASSERT_EQUAL(b->id, 2);
    CU_ASSERT_EQUAL(a->quota_bytes, 2u << 20);
    CU_ASSERT_EQUAL(a->secret_len, 2u);
    CU_ASSERT_EQUAL(memcmp(a->secret, "s3", 2), 0);
    CU_ASSERT_TRUE(a->fp16_only);
    CU_ASSERT_FALSE(a->admin);
    CU_ASSERT_TRUE(b->admin);
    CU_ASSERT_EQUAL(a->scheme, 0u);
    CU_ASSERT_EQUAL(b->scheme, 2u);
    CU_ASSERT_STRING_EQUAL(b->skip_layers, "0,2-3");
    CU_ASSERT_PTR_EQUAL(kvs_tenants_by_id(t, 2), b);
    CU_ASSERT_PTR_NULL(kvs_tenants_by_id(t, 0)); /* no default tenant any more */
    CU_ASSERT_PTR_NULL(kvs_tenants_by_id(t, 3));

    const kvs_tenant *tn = NULL;
    const char *ok = "Bearer aaaaaaaa-1", *ok2 = "bearer bbbbbbbb-2";
    CU_ASSERT_EQUAL(kvs_tenants_authenticate(t, ok, strlen(ok), &tn, err), 0);
    CU_ASSERT_PTR_EQUAL(tn, a);
    CU_ASSERT_EQUAL(kvs_tenants_authenticate(t, ok2, strlen(ok2), &tn, err), 0);
    CU_ASSERT_PTR_EQUAL(tn, b);
    const char *bad[] = {"Bearer aaaaaaaa-", "Bearer aaaaaaaa-12", "aaaaaaaa-1", "Basic aaaaaaaa-1",
                         "Bearer ", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CU_ASSERT_EQUAL(kvs_tenants_authenticate(t, bad[i], strlen(bad[i]), &tn, err),
                        KVS_EUNAUTH);
        CU_ASSERT_PTR_NULL(tn);
        CU_ASSERT_PTR_NULL(strstr(err, "aaaaaaaa")); /* the token is never echoed */
    }
    CU_ASSERT_EQUAL(kvs_tenants_authenticate(t, NULL, 0, &tn, err), KVS_EUNAUTH);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "missing"));

    CU_ASSERT_TRUE(kvs_tenant_may_use_model(a, "llama/3-8b", 10));
    CU_ASSERT_TRUE(kvs_tenant_may_use_model(a, "llama/", 6));
    CU_ASSERT_TRUE(kvs_tenant_may_use_model(a, "exact/m", 7));
    CU_ASSERT_FALSE(kvs_tenant_may_use_model(a, "exact/m2", 8));
    CU_ASSERT_FALSE(kvs_tenant_may_use_model(a, "llama", 5));
    CU_ASSERT_FALSE(kvs_tenant_may_use_model(a, "qwen/x", 6));
    CU_ASSERT_TRUE(kvs_tenant_may_use_model(b, "qwen/x", 6));
    kvs_tenants_free(t);
}

/* SHA-256 (hex) of the tokens below: printf %s TOKEN | sha256sum */
#define SHA_HASHED "b994b24ad665aa12e2de126ec0de71a49b933e8792fef3a93a09434c438befad"
#define SHA_UPPER  "13FC7904F8F148E55A3C0A62705D39C2A98A692E16B8D7082ABC94088D9FEC39"
#define SHA_PLAIN  "ac9ea78ad5d7af717ece2896d071e8bd59f6c6040711147e1fc7437b471be4ea"
#define SHA_A10    "bf2cb58a68f684d95a3b78ef8f661c9a4e5b09e82cc8f9cc88cce90528caeb27"

static const char k_hashed_ini[] = "[tenant.h]\ntoken_sha256 = " SHA_HASHED "\nsecret = s-h\n"
                                   "[tenant.u]\ntoken_sha256 = " SHA_UPPER "\n"
                                   "[tenant.p]\ntoken = plain-token-3\n";

/* token_sha256 authenticates with the token it is the hash of (either case of
 * hex), and only that; token = still does; the table keeps no token. */
static void test_tenants_token_sha256(void)
{
    const char *p = write_file("hashed.ini", k_hashed_ini);
    kvs_tenants *t = NULL;
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL_FATAL(kvs_tenants_load(p, &t, err), 0);
    CU_ASSERT_EQUAL_FATAL(kvs_tenants_count(t), 3u);
    const kvs_tenant *h = kvs_tenants_at(t, 0), *u = kvs_tenants_at(t, 1),
                     *pl = kvs_tenants_at(t, 2);
    CU_ASSERT_EQUAL(h->token_from, KVS_TENANT_TOKEN_HASH);
    CU_ASSERT_EQUAL(u->token_from, KVS_TENANT_TOKEN_HASH);
    CU_ASSERT_EQUAL(pl->token_from, KVS_TENANT_TOKEN_PLAIN);
    CU_ASSERT_EQUAL(h->secret_len, 3u);

    static const struct {
        const char *auth;
        int who; /* index of the tenant, -1: refused */
    } cases[] = {
        {"Bearer hashed-token-1", 0},
        {"BEARER upper-token-22", 1},
        {"Bearer plain-token-3", 2},
        {"Bearer hashed-token-2", -1},
        {"Bearer hashed-token-1 ", -1},
        {"Bearer hashed-token-", -1},
        {"Bearer Upper-token-22", -1},
        {"Bearer " SHA_HASHED, -1}, /* the hash in the file is not a token */
        {"Bearer " SHA_PLAIN, -1},
        {"Bearer ", -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const kvs_tenant *tn = (const kvs_tenant *)1;
        int rc = kvs_tenants_authenticate(t, cases[i].auth, strlen(cases[i].auth), &tn, err);
        if (cases[i].who >= 0) {
            CU_ASSERT_EQUAL(rc, 0);
            CU_ASSERT_PTR_EQUAL(tn, kvs_tenants_at(t, (size_t)cases[i].who));
        } else {
            CU_ASSERT_EQUAL(rc, KVS_EUNAUTH);
            CU_ASSERT_PTR_NULL(tn);
            CU_ASSERT_PTR_NULL(strstr(err, "token-")); /* never echoed */
            CU_ASSERT_PTR_NULL(strstr(err, "b994b24a"));
        }
        if ((rc == 0) != (cases[i].who >= 0))
            fprintf(stderr, "case %zu '%s': %d %s\n", i, cases[i].auth, rc, err);
    }
    /* the plain token was hashed at load: no byte run of the table spells it */
    for (size_t i = 0; i < kvs_tenants_count(t); i++)
        CU_ASSERT_PTR_NULL(memmem(kvs_tenants_at(t, i), sizeof(kvs_tenant), "plain-token-3", 13));
    kvs_tenants_free(t);
}

/* The WARN per `token =` tenant, at most once, with the line to write instead
 * and never the token: stderr is captured in a file for the call. */
static void test_tenants_log_plain(void)
{
    const char *p = write_file("warn.ini", k_hashed_ini);
    kvs_tenants *t = NULL;
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL_FATAL(kvs_tenants_load(p, &t, err), 0);
    char logpath[300];
    snprintf(logpath, sizeof logpath, "%s/warn.log", g_dir);
    FILE *lf = fopen(logpath, "w+");
    CU_ASSERT_PTR_NOT_NULL_FATAL(lf);
    fflush(stderr);
    int saved = dup(2);
    CU_ASSERT_FATAL(saved >= 0 && dup2(fileno(lf), 2) == 2);
    kvs_tenants_log_plain(t);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char buf[4096];
    rewind(lf);
    size_t n = fread(buf, 1, sizeof buf - 1, lf);
    fclose(lf);
    buf[n] = '\0';
    size_t lines = 0;
    for (size_t i = 0; i < n; i++)
        lines += buf[i] == '\n';
    CU_ASSERT_EQUAL(lines, 1u);
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "WARN"));
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "tenant p:"));
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "UCX data plane process"));
    CU_ASSERT_PTR_NOT_NULL(strstr(buf, "token_sha256 = " SHA_PLAIN "\n"));
    CU_ASSERT_PTR_NULL(strstr(buf, "plain-token-3"));
    CU_ASSERT_PTR_NULL(strstr(buf, "tenant h"));
    CU_ASSERT_PTR_NULL(strstr(buf, "tenant u"));
    kvs_tenants_free(t);
    /* open mode and an all-hash file: nothing */
    CU_ASSERT_EQUAL_FATAL(kvs_tenants_load(NULL, &t, err), 0);
    lf = fopen(logpath, "w+");
    CU_ASSERT_PTR_NOT_NULL_FATAL(lf);
    saved = dup(2);
    CU_ASSERT_FATAL(saved >= 0 && dup2(fileno(lf), 2) == 2);
    kvs_tenants_log_plain(t);
    kvs_tenants_free(t);
    p = write_file("allhash.ini", "[tenant.h]\ntoken_sha256 = " SHA_HASHED "\n");
    CU_ASSERT_EQUAL(kvs_tenants_load(p, &t, err), 0);
    if (t != NULL)
        kvs_tenants_log_plain(t);
    kvs_tenants_free(t);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    CU_ASSERT_EQUAL(fseek(lf, 0, SEEK_END), 0);
    CU_ASSERT_EQUAL(ftell(lf), 0L);
    fclose(lf);
}

static void test_tenants_errors(void)
{
    struct {
        const char *text, *want;
    } cases[] = {
        {"[tenant.a]\nsecret = x\n", "no token"},
        {"[tenant.a]\ntoken = short\n", "8.."},
        {"[tenant.a]\ntoken = has space in it\n", "printable"},
        {"[tenant.a]\ntoken = aaaaaaaaaa\n[tenant.b]\ntoken = aaaaaaaaaa\n", "same token"},
        {"[tenant.a]\ntoken = aaaaaaaaaa\n[tenant.b]\ntoken = bbbbbbbbbb\n[tenant.a]\nfp16 = 1\n",
         "declared twice"},
        {"[tenant.a]\ntoken = aaaaaaaaaa\nquota = lots\n", "quota"},
        {"[tenant.a]\ntoken = aaaaaaaaaa\nfp16 = maybe\n", "fp16"},
        {"[tenant.a]\ntoken = aaaaaaaaaa\ncolour = red\n", "unknown key 'colour'"},
        {"[tenant.default]\ntoken = aaaaaaaaaa\n", "default"},
        {"[tenant.]\ntoken = aaaaaaaaaa\n", "tenant name"},
        {"[tenant.a]\ntoken = aaaaaaaaaa\nscheme = fp4\n", "scheme"},
        {"[tenant.a]\ntoken = aaaaaaaaaa\nskip_layers = 3-1\n", "skip_layers"},
        /* token_sha256: 64 hex digits, exactly one of it and token, unique digests */
        {"[tenant.a]\ntoken_sha256 = " SHA_A10 "0\n", "tenant a: token_sha256 must be 64 hex"},
        {"[tenant.a]\ntoken_sha256 = "
         "bf2cb58a68f684d95a3b78ef8f661c9a4e5b09e82cc8f9cc88cce90528caeb2\n",
         "tenant a: token_sha256 must be 64 hex"},
        {"[tenant.a]\ntoken_sha256 = "
         "bf2cb58a68f684d95a3b78ef8f661c9a4e5b09e82cc8f9cc88cce90528caebg7\n",
         "tenant a: token_sha256 must be 64 hex"},
        {"[tenant.a]\ntoken_sha256 = "
         "-f2cb58a68f684d95a3b78ef8f661c9a4e5b09e82cc8f9cc88cce90528caeb27\n",
         "tenant a: token_sha256 must be 64 hex"},
        {"[tenant.a]\ntoken_sha256 = aaaaaaaaaa\n", "tenant a: token_sha256 must be 64 hex"},
        {"[tenant.a]\ntoken_sha256 =\n", "tenant a: token_sha256 must be 64 hex"},
        {"[tenant.a]\ntoken = aaaaaaaaaa\ntoken_sha256 = " SHA_A10 "\n",
         "tenant a: both token and token_sha256"},
        {"[tenant.b]\ntoken = bbbbbbbbbb\n[tenant.a]\ntoken_sha256 = " SHA_A10
         "\nsecret = s\ntoken = aaaaaaaaaa\n",
         "tenant a: both token and token_sha256"},
        {"[tenant.b]\ntoken = bbbbbbbbbb\n[tenant.a]\nsecret = s\nadmin = true\n",
         "tenant a has no token"},
        {"[tenant.a]\ntoken = aaaaaaaaaa\n[tenant.b]\ntoken_sha256 = " SHA_A10 "\n",
         "tenants a and b have the same token"},
        {"[tenant.a]\ntoken_sha256 = " SHA_A10 "\n[tenant.b]\ntoken = aaaaaaaaaa\n",
         "tenants a and b have the same token"},
        {"[tenant.a]\ntoken_sha256 = "
         "BF2CB58A68F684D95A3B78EF8F661C9A4E5B09E82CC8F9CC88CCE90528CAEB27"
         "\n[tenant.b]\ntoken_sha256 = " SHA_A10 "\n",
         "tenants a and b have the same token"},
        {"[tenant.a]\ntoken_sha256 = "
         "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n",
         "tenant a: token_sha256 is the SHA-256 of an empty token"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "bad%zu.ini", i);
        const char *p = write_file(name, cases[i].text);
        kvs_tenants *t = (kvs_tenants *)1;
        char err[KVS_ERR_LEN] = "";
        CU_ASSERT_EQUAL(kvs_tenants_load(p, &t, err), KVS_EINVAL);
        CU_ASSERT_PTR_NULL(t);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, cases[i].want));
        CU_ASSERT_PTR_NOT_NULL(strstr(err, name));
        CU_ASSERT_PTR_NULL(strstr(err, "aaaaaaaaaa")); /* no token, no digest echoed */
        CU_ASSERT_PTR_NULL(strstr(err, "bf2cb58a"));
        CU_ASSERT_PTR_NULL(strstr(err, "BF2CB58A"));
        if (strstr(err, cases[i].want) == NULL)
            fprintf(stderr, "case %zu: '%s' lacks '%s'\n", i, err, cases[i].want);
    }
    kvs_tenants *t = NULL;
    char err[KVS_ERR_LEN] = "";
    char missing[300];
    snprintf(missing, sizeof missing, "%s/none.ini", g_dir);
    CU_ASSERT_EQUAL(kvs_tenants_load(missing, &t, err), KVS_EIO);
}

/* ---- leases, layer lists --------------------------------------------- */

static void test_lease_registry(void)
{
    kvs_lease_reg *r = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_lease_reg_open(&r), 0);
    for (uint64_t id = 1; id <= 10000; id++)
        CU_ASSERT_EQUAL(kvs_lease_reg_add(r, id, (uint16_t)(id % 3), 60000, 1, 1u << 20, NULL), 0);
    CU_ASSERT_EQUAL(kvs_lease_reg_count(r), 10000u);
    CU_ASSERT_FALSE(kvs_lease_reg_take(r, 7, 0)); /* 7 belongs to tenant 1 */
    CU_ASSERT_TRUE(kvs_lease_reg_take(r, 7, 1));
    CU_ASSERT_FALSE(kvs_lease_reg_take(r, 7, 1)); /* once */
    CU_ASSERT_FALSE(kvs_lease_reg_take(r, 99999, 0));
    CU_ASSERT_EQUAL(kvs_lease_reg_count(r), 9999u);
    /* an expired lease is not taken, and adds to its bucket prune it */
    CU_ASSERT_EQUAL(kvs_lease_reg_add(r, 20001, 5, 0, 1, 1u << 20, NULL), 0);
    usleep(5000);
    CU_ASSERT_FALSE(kvs_lease_reg_take(r, 20001, 5));
    kvs_lease_reg_close(r);
}

/* Each tenant's leases hold at most max_blocks blocks: a refused add records
 * nothing, other tenants are not affected, and a lease taken, extended or
 * expired gives its blocks back. */
static void test_lease_bound(void)
{
    kvs_lease_reg *r = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_lease_reg_open(&r), 0);
    CU_ASSERT_EQUAL(kvs_lease_reg_add(r, 1, 1, 60000, 3, 8, NULL), 0);
    CU_ASSERT_EQUAL(kvs_lease_reg_add(r, 2, 1, 60000, 3, 8, NULL), 0);
    uint64_t held = 0;
    CU_ASSERT_EQUAL(kvs_lease_reg_add(r, 3, 1, 60000, 3, 8, &held), KVS_ENOSPC);
    CU_ASSERT_EQUAL(held, 6u);
    CU_ASSERT_EQUAL(kvs_lease_reg_count(r), 2u);
    CU_ASSERT_EQUAL(kvs_lease_reg_held(r, 1), 6u);
    CU_ASSERT_FALSE(kvs_lease_reg_take(r, 3, 1));                /* never recorded */
    CU_ASSERT_EQUAL(kvs_lease_reg_add(r, 4, 2, 60000, 8, 8, NULL), 0); /* tenant 2: its own bound */
    CU_ASSERT_EQUAL(kvs_lease_reg_add(r, 5, 1, 60000, 2, 8, NULL), 0); /* exactly at it */
    CU_ASSERT_EQUAL(kvs_lease_reg_held(r, 1), 8u);
    CU_ASSERT_TRUE(kvs_lease_reg_take(r, 1, 1));
    CU_ASSERT_EQUAL(kvs_lease_reg_held(r, 1), 5u);
    CU_ASSERT_EQUAL(kvs_lease_reg_add(r, 2, 1, 60000, 1, 8, NULL),
                    0); /* lease 2 extended: 3 -> 1 */
    CU_ASSERT_EQUAL(kvs_lease_reg_held(r, 1), 3u);
    CU_ASSERT_EQUAL(kvs_lease_reg_add(r, 6, 3, 0, 4, 4, NULL), 0); /* expires at once */
    usleep(5000);
    CU_ASSERT_EQUAL(kvs_lease_reg_held(r, 3), 0u);
    CU_ASSERT_EQUAL(kvs_lease_reg_add(r, 7, 3, 60000, 4, 4, NULL), 0);
    CU_ASSERT_EQUAL(kvs_lease_reg_held(r, 2), 8u);
    kvs_lease_reg_close(r);
}

/* kvstash_lookup_blocks_total and _tokens_total are counters: read while
 * Lookups are counted, each result must only grow. With every block a hit,
 * the misses stay 0 whenever they are read. */
typedef struct lookup_writer {
    kvs_data_stats *st;
    atomic_int stop;
} lookup_writer;

static void *lookup_writer_main(void *arg)
{
    lookup_writer *w = arg;
    while (!atomic_load(&w->stop))
        kvs_data_stats_lookup(w->st, 4, 4, 16);
    return NULL;
}

static double figure(const kvs_metric_set *set, const char *name, const char *result)
{
    for (size_t i = 0; i < set->n; i++)
        if (strcmp(set->v[i].name, name) == 0 && strcmp(set->v[i].label_values[0], result) == 0)
            return set->v[i].value;
    return -1;
}

static void test_lookup_counters_monotone(void)
{
    static kvs_data_stats st; /* large: not on the stack */
    memset(&st, 0, sizeof st);
    lookup_writer w = {.st = &st};
    pthread_t th;
    CU_ASSERT_EQUAL_FATAL(pthread_create(&th, NULL, lookup_writer_main, &w), 0);
    int bad = 0;
    double last_hit = 0;
    for (int i = 0; i < 20000 && !bad; i++) {
        kvs_metric_set set;
        kvs_metric_set_init(&set);
        if (kvs_data_stats_collect(&st, &set) != 0) {
            bad = 1;
        } else {
            double miss = figure(&set, "kvstash_lookup_blocks_total", "miss");
            double tmiss = figure(&set, "kvstash_lookup_tokens_total", "miss");
            double hit = figure(&set, "kvstash_lookup_blocks_total", "hit");
            if (miss != 0 || tmiss != 0 || hit < last_hit) {
                fprintf(stderr, "\n  collection %d: miss %g, token miss %g, hit %g after %g\n", i,
                        miss, tmiss, hit, last_hit);
                bad = 1;
            }
            last_hit = hit;
        }
        kvs_metric_set_free(&set);
    }
    atomic_store(&w.stop, 1);
    pthread_join(th, NULL);
    CU_ASSERT_FALSE(bad);
}

static void test_layer_list(void)
{
    kvs_config c;
    kvs_config_defaults(&c);
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "skip_layers", "0,3-5,31", err), 0);
    CU_ASSERT_TRUE(kvs_config_layer_listed(c.skip_layers, 0));
    CU_ASSERT_FALSE(kvs_config_layer_listed(c.skip_layers, 1));
    CU_ASSERT_TRUE(kvs_config_layer_listed(c.skip_layers, 4));
    CU_ASSERT_TRUE(kvs_config_layer_listed(c.skip_layers, 5));
    CU_ASSERT_FALSE(kvs_config_layer_listed(c.skip_layers, 6));
    CU_ASSERT_TRUE(kvs_config_layer_listed(c.skip_layers, 31));
    CU_ASSERT_FALSE(kvs_config_layer_listed("", 0));
    const char *bad[] = {"x", "1,", ",1", "5-3", "1-", "-1", "1 ,2", "2000", "1;2", "3--4"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "skip_layers", bad[i], err), KVS_EINVAL);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "skip_layers"));
    }
    CU_ASSERT_STRING_EQUAL(c.skip_layers, "0,3-5,31"); /* unchanged */
    CU_ASSERT_STRING_EQUAL(kvs_config_policy_name(c.policy), "lru");
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "policy", "prefix", err), 0);
    CU_ASSERT_STRING_EQUAL(kvs_config_policy_name(c.policy), "prefix");
    CU_ASSERT_EQUAL(kvs_config_set_by_name(&c, "policy", "belady", err), KVS_EINVAL);
    CU_ASSERT_EQUAL(c.default_scheme, 3); /* int8 */
}

/* ---- codec -------------------------------------------------------------- */

enum { L = 2, H = 2, D = 64, T = 32 };

static void fill(uint16_t *x, size_t n, unsigned seed)
{
    uint32_t s = seed * 2654435761u + 12345u;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        float f = ((float)(s >> 8) / (float)(1u << 24) - 0.5f) * 4.0f;
        x[i] = kvq_f32_to_fp16(f);
    }
}

static void test_codec_roundtrip(void)
{
    size_t n = (size_t)T * H * D;
    uint16_t *k[L], *v[L];
    for (int l = 0; l < L; l++) {
        k[l] = malloc(n * 2);
        v[l] = malloc(n * 2);
        fill(k[l], n, 1 + (unsigned)l);
        fill(v[l], n, 11 + (unsigned)l);
    }
    uint8_t schemes[L] = {1, 4}; /* layer 0 fp16 (a skip layer), layer 1 int8 */
    kvs_codec_layout lay = {L, H, D, T, 1, 1, 2, 1, 1, schemes, NULL, NULL, 0};
    CU_ASSERT_EQUAL(kvs_codec_layer_bytes(&lay), n * 2);
    char err[KVS_ERR_LEN] = "";
    size_t size = kvs_codec_block_size(&lay, err);
    CU_ASSERT_FATAL(size > 0);
    void *blk = aligned_alloc(64, (size + 63) & ~(size_t)63);
    float ke[L] = {-1, -1}, ve[L] = {-1, -1};
    CU_ASSERT_EQUAL_FATAL(kvs_codec_encode(KVS_CODEC_CPU, &lay, (const void *const *)k,
                                           (const void *const *)v, blk, size, ke, ve, err),
                          0);
    CU_ASSERT_EQUAL(ke[0], 0.0f);
    CU_ASSERT_EQUAL(ve[0], 0.0f);
    CU_ASSERT_TRUE(ke[1] > 0 && ke[1] < 0.02f);
    CU_ASSERT_TRUE(ve[1] > 0 && ve[1] < 0.02f);

    /* layer by layer, the bytes kvs_block_encode makes in one go */
    kvs_scheme tab[L] = {KVS_SCHEME_FP16, KVS_SCHEME_INT8};
    kvs_block_params bp = {L, H, D, T, KVS_DTYPE_FP16, 1, 2, 1, 1, tab, NULL, NULL, 0};
    CU_ASSERT_EQUAL_FATAL(kvs_block_size(&bp), size);
    void *ref = aligned_alloc(64, (size + 63) & ~(size_t)63);
    CU_ASSERT_EQUAL_FATAL(kvs_block_encode(&bp, (const void *const *)k, (const void *const *)v,
                                           kvs_tile_quantize, ref, size, err),
                          0);
    CU_ASSERT_EQUAL(memcmp(ref, blk, size), 0);
    /* layers in any order, into a fresh buffer: the same bytes again */
    memset(ref, 0xee, size);
    float e1[L];
    CU_ASSERT_EQUAL_FATAL(kvs_codec_begin(&lay, ref, size, err), 0);
    CU_ASSERT_EQUAL(kvs_codec_finish(ref, size, err), KVS_EFORMAT); /* tiles not written yet */
    CU_ASSERT_EQUAL(kvs_codec_encode_layer(KVS_CODEC_CPU, &lay, 1, k[1], v[1], ref, size, &e1[1],
                                           &e1[0], err),
                    0);
    CU_ASSERT_EQUAL(e1[1], ke[1]);
    CU_ASSERT_EQUAL(kvs_codec_encode_layer(KVS_CODEC_CPU, &lay, 0, k[0], v[0], ref, size, &e1[0],
                                           &e1[1], err),
                    0);
    CU_ASSERT_EQUAL(kvs_codec_finish(ref, size, err), 0);
    CU_ASSERT_EQUAL(memcmp(ref, blk, size), 0);
    CU_ASSERT_EQUAL(kvs_codec_encode_layer(KVS_CODEC_CPU, &lay, 2, k[0], v[0], ref, size, &e1[0],
                                           &e1[1], err),
                    KVS_EINVAL);
    free(ref);

    kvs_codec_info ci;
    CU_ASSERT_EQUAL_FATAL(kvs_codec_block_info(blk, size, &ci, err), 0);
    CU_ASSERT_EQUAL(ci.layers, (uint32_t)L);
    CU_ASSERT_EQUAL(ci.block_tokens, (uint32_t)T);
    CU_ASSERT_EQUAL(ci.scheme, 1u);
    CU_ASSERT_TRUE(ci.mixed);

    /* fp16 egress of the fp16 layer is the input, bit for bit */
    size_t eb = kvs_codec_egress_bytes(T, H, D, 1);
    CU_ASSERT_EQUAL(eb, n * 2);
    void *kb = malloc(n * 4), *vb = malloc(n * 4);
    const void *ko, *vo;
    size_t kl, vl;
    float ks, vs;
    CU_ASSERT_EQUAL(kvs_codec_egress_layer(blk, size, 0, 1, kb, vb, &ko, &kl, &vo, &vl, &ks, &vs,
                                           err),
                    0);
    CU_ASSERT_EQUAL(kl, n * 2);
    CU_ASSERT_EQUAL(memcmp(ko, k[0], n * 2), 0);
    CU_ASSERT_EQUAL(memcmp(vo, v[0], n * 2), 0);
    /* fp32 egress of the int8 layer has exactly the error encode reported */
    CU_ASSERT_EQUAL(kvs_codec_egress_layer(blk, size, 1, 3, kb, vb, &ko, &kl, &vo, &vl, &ks, &vs,
                                           err),
                    0);
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double x = kvq_fp16_to_f32(k[1][i]), d = x - ((const float *)ko)[i];
        num += d * d;
        den += x * x;
    }
    CU_ASSERT_TRUE(fabs(sqrt(num / den) - ke[1]) < 1e-6);
    /* per-tensor fp8: codes and a positive scale */
    CU_ASSERT_EQUAL(kvs_codec_egress_layer(blk, size, 1, 4, kb, vb, &ko, &kl, &vo, &vl, &ks, &vs,
                                           err),
                    0);
    CU_ASSERT_EQUAL(kl, n);
    CU_ASSERT_TRUE(ks > 0 && vs > 0);
    /* stored: byte ranges inside the block, K tiles then V tiles */
    CU_ASSERT_EQUAL(kvs_codec_egress_layer(blk, size, 1, 0, NULL, NULL, &ko, &kl, &vo, &vl, &ks,
                                           &vs, err),
                    0);
    CU_ASSERT_TRUE((const uint8_t *)ko > (const uint8_t *)blk &&
                   (const uint8_t *)vo + vl <= (const uint8_t *)blk + size);
    CU_ASSERT_PTR_EQUAL((const uint8_t *)ko + kl, vo);
    /* bad arguments and a corrupt block */
    CU_ASSERT_EQUAL(kvs_codec_egress_layer(blk, size, 2, 1, kb, vb, &ko, &kl, &vo, &vl, &ks, &vs,
                                           err),
                    KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_codec_egress_layer(blk, size, 0, 9, kb, vb, &ko, &kl, &vo, &vl, &ks, &vs,
                                           err),
                    KVS_EINVAL);
    ((uint8_t *)blk)[size - 100] ^= 0x40; /* inside layer 1's last tile */
    CU_ASSERT_EQUAL(kvs_codec_egress_layer(blk, size, 1, 3, kb, vb, &ko, &kl, &vo, &vl, &ks, &vs,
                                           err),
                    KVS_EFORMAT);
    ((uint8_t *)blk)[0] ^= 1;
    CU_ASSERT_EQUAL(kvs_codec_block_info(blk, size, &ci, err), KVS_EFORMAT);

    uint8_t bad_schemes[L] = {1, 9};
    kvs_codec_layout bad = lay;
    bad.schemes = bad_schemes;
    CU_ASSERT_EQUAL(kvs_codec_block_size(&bad, err), 0u);
    bad = lay;
    bad.dtype = 7;
    CU_ASSERT_EQUAL(kvs_codec_block_size(&bad, err), 0u);
    bad = lay;
    bad.block_tokens = 8;
    CU_ASSERT_EQUAL(kvs_codec_block_size(&bad, err), 0u);
    free(blk);
    free(kb);
    free(vb);
    for (int l = 0; l < L; l++) {
        free(k[l]);
        free(v[l]);
    }
}

/* Per-tensor scales (a model rule's profile, service/profiles.h): the codec's
 * CPU bytes equal the reference quantizer's through kvs_block_encode with the
 * same scales, differ from the dynamic rule's for FP8 layers, and leave int8
 * and fp16 layers' bytes alone; bad scales make the layout invalid. */
static void test_codec_tensor_scales(void)
{
    size_t n = (size_t)T * H * D;
    uint16_t *k[L], *v[L];
    for (int l = 0; l < L; l++) {
        k[l] = malloc(n * 2);
        v[l] = malloc(n * 2);
        fill(k[l], n, 21 + (unsigned)l);
        fill(v[l], n, 31 + (unsigned)l);
    }
    /* |x| < 2: amax / 448 ~ 4.5e-3, amax / 57344 ~ 3.5e-5; one below, one above. */
    static const float k_ts[L] = {1.7e-3f, 9.0e-5f}, v_ts[L] = {1.1e-2f, 1.2e-5f};
    static const uint8_t tabs[2][L] = {{2, 3}, {4, 1}}; /* e4m3, e5m2 | int8, fp16 */
    char err[KVS_ERR_LEN] = "";
    for (int t = 0; t < 2; t++) {
        kvs_codec_layout lay = {L, H, D, T, 1, 1, 2, 1, 1, tabs[t], k_ts, v_ts, 0};
        kvs_codec_layout dyn = lay;
        dyn.k_tensor_scales = dyn.v_tensor_scales = NULL;
        size_t size = kvs_codec_block_size(&lay, err);
        CU_ASSERT_FATAL(size > 0 && size == kvs_codec_block_size(&dyn, err));
        size_t cap = (size + 63) & ~(size_t)63;
        uint8_t *a = aligned_alloc(64, cap), *b = aligned_alloc(64, cap),
                *r = aligned_alloc(64, cap);
        float ke[L], ve[L];
        CU_ASSERT_EQUAL_FATAL(kvs_codec_encode(KVS_CODEC_CPU, &lay, (const void *const *)k,
                                               (const void *const *)v, a, size, ke, ve, err),
                              0);
        CU_ASSERT_EQUAL_FATAL(kvs_codec_encode(KVS_CODEC_CPU, &dyn, (const void *const *)k,
                                               (const void *const *)v, b, size, ke, ve, err),
                              0);
        kvs_scheme sch[L] = {(kvs_scheme)tabs[t][0], (kvs_scheme)tabs[t][1]};
        kvs_block_params bp = {L, H, D, T, KVS_DTYPE_FP16, 1, 2, 1, 1, sch, k_ts, v_ts, 0};
        CU_ASSERT_EQUAL_FATAL(kvs_block_encode(&bp, (const void *const *)k, (const void *const *)v,
                                               kvs_tile_quantize_ref, r, size, err),
                              0);
        CU_ASSERT_EQUAL(memcmp(a, r, size), 0); /* fast CPU == reference, scales included */
        /* The scales change FP8 tiles; int8 and fp16 ignore them. */
        CU_ASSERT_EQUAL(memcmp(a, b, size) != 0, t == 0);
        free(a);
        free(b);
        free(r);
    }
    static const float bad_nan[L] = {NAN, 0.0f}, bad_neg[L] = {0.0f, -1.0f};
    kvs_codec_layout lay = {L, H, D, T, 1, 1, 2, 1, 1, tabs[0], bad_nan, NULL, 0};
    CU_ASSERT_EQUAL(kvs_codec_block_size(&lay, err), 0u);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "k_tensor_scales[0]"));
    lay.k_tensor_scales = NULL;
    lay.v_tensor_scales = bad_neg;
    CU_ASSERT_EQUAL(kvs_codec_block_size(&lay, err), 0u);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "v_tensor_scales[1]"));
    for (int l = 0; l < L; l++) {
        free(k[l]);
        free(v[l]);
    }
}

/* Key offsets (kvs_codec_layout.key_offsets, kv_format.h rule 5) on keys whose
 * channels sit far from zero: the block is kvs_block_encode's with
 * key_offsets (KVS_BLOCK_F_KOFF in the header, KVS_TILE_F_KOFF on the K tiles
 * of its 8-bit layers and nowhere else, 2 * D bytes more per such tile), its K
 * error is far smaller than without, V is untouched, every egress format
 * decodes it as kernels/block does, and a GPU request quantizes such layers
 * on the CPU without counting a GPU fallback. */
static void test_codec_key_offsets(void)
{
    enum { KL = 3 };
    size_t n = (size_t)T * H * D;
    uint16_t *k[KL], *v[KL];
    for (int l = 0; l < KL; l++) {
        k[l] = malloc(n * 2);
        v[l] = malloc(n * 2);
        fill(k[l], n, 51 + (unsigned)l);
        fill(v[l], n, 61 + (unsigned)l);
        for (size_t i = 0; i < n; i++) { /* channel d near 8 * (d % 7 - 3), +- 0.5 */
            float m = 8.0f * (float)((int)(i % D % 7) - 3);
            k[l][i] = kvq_f32_to_fp16(m + 0.25f * kvq_fp16_to_f32(k[l][i]));
        }
    }
    uint8_t schemes[KL] = {4, 1, 2}; /* int8, fp16 (a skip layer), fp8_e4m3 */
    kvs_codec_layout off = {KL, H, D, T, 1, 1, 2, 1, 1, schemes, NULL, NULL, 0};
    kvs_codec_layout on = off;
    on.key_offsets = 1;
    char err[KVS_ERR_LEN] = "";
    size_t s0 = kvs_codec_block_size(&off, err), s1 = kvs_codec_block_size(&on, err);
    kvs_scheme tab[KL] = {KVS_SCHEME_INT8, KVS_SCHEME_FP16, KVS_SCHEME_FP8_E4M3};
    kvs_block_params bp = {KL, H, D, T, KVS_DTYPE_FP16, 1, 2, 1, 1, tab, NULL, NULL, 1};
    CU_ASSERT_FATAL(s0 > 0);
    CU_ASSERT_EQUAL_FATAL(s1, kvs_block_size(&bp));
    CU_ASSERT_EQUAL(s1 - s0, (size_t)2 * H * 2 * D); /* 2 layers x H K tiles x D fp16 */
    size_t cap = (s1 + 63) & ~(size_t)63;
    uint8_t *a = aligned_alloc(64, cap), *b = aligned_alloc(64, cap), *r = aligned_alloc(64, cap);
    float ke1[KL], ve1[KL], ke0[KL], ve0[KL];
    CU_ASSERT_EQUAL_FATAL(kvs_codec_encode(KVS_CODEC_CPU, &on, (const void *const *)k,
                                           (const void *const *)v, a, s1, ke1, ve1, err),
                          0);
    CU_ASSERT_EQUAL_FATAL(kvs_codec_encode(KVS_CODEC_CPU, &off, (const void *const *)k,
                                           (const void *const *)v, b, s0, ke0, ve0, err),
                          0);
    CU_ASSERT_EQUAL_FATAL(kvs_block_encode(&bp, (const void *const *)k, (const void *const *)v,
                                           kvs_tile_quantize_ref, r, s1, err),
                          0);
    CU_ASSERT_EQUAL(memcmp(a, r, s1), 0); /* the definition's bytes */
    CU_ASSERT_EQUAL(kvs_block_check(a, s1, NULL, err), 0);
    kvs_block_hdr bh;
    memcpy(&bh, a, sizeof bh);
    CU_ASSERT_EQUAL(bh.flags, KVS_BLOCK_F_ROOT | KVS_BLOCK_F_KOFF);
    memcpy(&bh, b, sizeof bh);
    CU_ASSERT_EQUAL(bh.flags, KVS_BLOCK_F_ROOT);
    for (uint32_t l = 0; l < KL; l++) {
        for (unsigned kind = KVS_TILE_K; kind <= KVS_TILE_V; kind++) {
            for (uint32_t h = 0; h < H; h++) {
                const void *ta, *tb;
                size_t la, lb;
                CU_ASSERT_EQUAL_FATAL(
                    kvs_block_tile(a, s1, l, (kvs_tile_kind)kind, h, &ta, &la, err), 0);
                CU_ASSERT_EQUAL_FATAL(
                    kvs_block_tile(b, s0, l, (kvs_tile_kind)kind, h, &tb, &lb, err), 0);
                kvs_tile_hdr th;
                memcpy(&th, ta, sizeof th);
                unsigned koff = kind == KVS_TILE_K && schemes[l] != 1;
                CU_ASSERT_EQUAL((th.flags & KVS_TILE_F_KOFF) != 0, koff);
                CU_ASSERT_EQUAL(la, lb + (koff ? 2u * D : 0u));
                if (!koff) /* V tiles and the fp16 layer: the bytes without offsets */
                    CU_ASSERT_EQUAL(memcmp(ta, tb, la), 0);
            }
        }
        CU_ASSERT_EQUAL(ve1[l], ve0[l]);
    }
    CU_ASSERT_EQUAL(ke1[1], 0.0f);
    CU_ASSERT_TRUE(ke1[0] > 0 && ke1[0] < 0.25f * ke0[0]); /* int8 */
    CU_ASSERT_TRUE(ke1[2] > 0 && ke1[2] < 0.25f * ke0[2]); /* fp8_e4m3 */

    /* Egress: what kernels/block makes of the stored bytes, in every format. */
    float *kd = malloc(n * 4), *vd = malloc(n * 4);
    uint8_t *kb = malloc(n * 4), *vb = malloc(n * 4);
    for (uint32_t l = 0; l < KL; l++) {
        static const kvs_dtype dts[3] = {KVS_DTYPE_FP16, KVS_DTYPE_BF16, KVS_DTYPE_FP32};
        const void *ko, *vo;
        size_t kl, vl;
        float ks, vs;
        for (unsigned fmt = 1; fmt <= 3; fmt++) {
            size_t eb = kvs_codec_egress_bytes(T, H, D, fmt);
            CU_ASSERT_EQUAL_FATAL(
                kvs_codec_egress_layer(a, s1, l, fmt, kb, vb, &ko, &kl, &vo, &vl, &ks, &vs, err),
                0);
            CU_ASSERT_EQUAL_FATAL(kvs_block_decode_layer(a, s1, l, dts[fmt - 1], kd, vd,
                                                         kvs_tile_dequantize_ref, err),
                                  0);
            CU_ASSERT_EQUAL(kl, eb);
            CU_ASSERT_EQUAL(memcmp(ko, kd, eb), 0);
            CU_ASSERT_EQUAL(memcmp(vo, vd, eb), 0);
        }
        /* fp32: exactly the error encode reported */
        double num = 0, den = 0;
        for (size_t i = 0; i < n; i++) {
            double x = kvq_fp16_to_f32(k[l][i]), d = x - kd[i];
            num += d * d;
            den += x * x;
        }
        CU_ASSERT_TRUE(fabs(sqrt(num / den) - ke1[l]) < 1e-6);
        CU_ASSERT_EQUAL(
            kvs_codec_egress_layer(a, s1, l, 4, kb, vb, &ko, &kl, &vo, &vl, &ks, &vs, err), 0);
        float rks = -1, rvs = -1;
        CU_ASSERT_EQUAL(kvs_block_requant_fp8(a, s1, l, KVS_TILE_K, (uint8_t *)kd, &rks, err), 0);
        CU_ASSERT_TRUE(ks > 0 && ks == rks);
        CU_ASSERT_EQUAL(memcmp(ko, kd, n), 0);
        CU_ASSERT_EQUAL(kvs_block_requant_fp8(a, s1, l, KVS_TILE_V, (uint8_t *)vd, &rvs, err), 0);
        CU_ASSERT_TRUE(vs > 0 && vs == rvs);
        CU_ASSERT_EQUAL(vl, n);
        CU_ASSERT_EQUAL(memcmp(vo, vd, n), 0);
        CU_ASSERT_EQUAL(
            kvs_codec_egress_layer(a, s1, l, 0, NULL, NULL, &ko, &kl, &vo, &vl, &ks, &vs, err), 0);
        CU_ASSERT_EQUAL(kl, (size_t)H * kvs_tile_bytes_ex(schemes[l], KVS_TILE_K, T, D,
                                                          schemes[l] == 1 ? 0 : 2,
                                                          schemes[l] == 1 ? 0 : 1, 1));
    }
    unsigned sch = 0;
    CU_ASSERT_EQUAL(kvs_codec_peek_scheme(a, 64, &sch, err), 0);
    CU_ASSERT_EQUAL(sch, 4u);

    /* Key offsets go to the GPU only after their self-check passed at select
     * (never here: no select ran): asked for it, 8-bit layers go to the CPU
     * at once (no GPU attempt, no fallback), the same bytes. */
    uint8_t eight[KL] = {4, 2, 3};
    on.schemes = eight;
    size_t s8 = kvs_codec_block_size(&on, err);
    CU_ASSERT_FATAL(s8 > 0 && s8 <= cap);
    kvs_codec_counters c0, c1;
    kvs_codec_counters_get(&c0);
    CU_ASSERT_EQUAL_FATAL(kvs_codec_encode(KVS_CODEC_GPU, &on, (const void *const *)k,
                                           (const void *const *)v, a, s8, ke1, ve1, err),
                          0);
    kvs_codec_counters_get(&c1);
    CU_ASSERT_EQUAL(c1.gpu_fallbacks, c0.gpu_fallbacks);
    CU_ASSERT_EQUAL(c1.layers_gpu, c0.layers_gpu);
    CU_ASSERT_EQUAL(c1.layers_cpu, c0.layers_cpu + KL);
    CU_ASSERT_EQUAL_FATAL(kvs_codec_encode(KVS_CODEC_CPU, &on, (const void *const *)k,
                                           (const void *const *)v, b, s8, ke0, ve0, err),
                          0);
    CU_ASSERT_EQUAL(memcmp(a, b, s8), 0);
    free(kd);
    free(vd);
    free(kb);
    free(vb);
    free(a);
    free(b);
    free(r);
    for (int l = 0; l < KL; l++) {
        free(k[l]);
        free(v[l]);
    }
}

int main(void)
{
    static const kvs_test_case cases[] = {
        {"tenants_open_mode", test_tenants_open_mode},
        {"tenants_parse_and_auth", test_tenants_parse_and_auth},
        {"tenants_errors", test_tenants_errors},
        {"tenants_token_sha256", test_tenants_token_sha256},
        {"tenants_log_plain", test_tenants_log_plain},
        {"lease_registry", test_lease_registry},
        {"lease_bound", test_lease_bound},
        {"layer_list", test_layer_list},
        {"lookup_counters_monotone", test_lookup_counters_monotone},
        {"codec_roundtrip", test_codec_roundtrip},
        {"codec_tensor_scales", test_codec_tensor_scales},
        {"codec_key_offsets", test_codec_key_offsets},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {
        {"service_data", suite_init, suite_cleanup, cases},
        {NULL, NULL, NULL, NULL},
    };
    return kvs_test_run(suites);
}
