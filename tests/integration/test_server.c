/*
 * test_server.c — black-box tests of a real kvstashd through libkvstash (and,
 * for malformed and unbuilt RPCs, through the gRPC C core directly).
 *
 * Usage: test_server /path/to/kvstashd   (ctest passes $<TARGET_FILE:kvstashd>;
 * the KVSTASHD environment variable is the fallback).
 *
 * Suite "server" shares one kvstashd started with --threads 3 --log-level warn,
 * so tests can check that the values they read back are the ones configured.
 * Suites "connect" and "shutdown" start their own servers. Every server is
 * stopped with SIGTERM (exit 0 expected) or killed; none outlives the binary.
 */
#include "kvs_itest.h"
#include "kvs_server_proc.h"
#include "kvs_test.h"
#include "kvstash.h"

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *g_kvstashd;
static kvs_server_proc g_srv;
static kvs_client *g_client;

#define SERVER_THREADS "3"

/* ---- helpers --------------------------------------------------------- */

static int open_client(const char *addr, const char *token, kvs_client **out)
{
    return kvs_itest_open_client(addr, token, 0, 5000, out);
}

static int suite_server_init(void)
{
    /* --ucx off: Connect answers UNIMPLEMENTED (test_unimplemented; test_connect.c covers UCX) */
    static const char *const args[] = {"--threads", SERVER_THREADS, "--log-level", "warn",
                                       "--ucx",   "off",          NULL};
    if (kvs_itest_start(g_kvstashd, args, &g_srv, "server") != 0)
        return 1;
    if (open_client(g_srv.addr, NULL, &g_client) != 0) {
        kvs_server_proc_kill(&g_srv);
        return 1;
    }
    return 0;
}

static int suite_server_cleanup(void)
{
    kvs_client_close(g_client);
    g_client = NULL;
    return kvs_itest_stop(&g_srv, 5000);
}

/* The value of the metric name{label=value}, or -1 when it is absent. */
static double metric_value(const kvs_stats *s, const char *name, const char *label,
                           const char *value)
{
    const kvs_metric *m = kvs_stats_find(s, name, label, value);
    return m != NULL ? m->value : -1.0;
}

static double stats_value(const char *name, const char *label, const char *value)
{
    kvs_stats *s = NULL;
    char err[KVS_ERR_LEN] = "";
    int rc = kvs_client_stats(g_client, NULL, -1, &s, err);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    double v = metric_value(s, name, label, value);
    kvs_stats_free(s);
    return v;
}

/* The value of one config entry as a malloc'd string (NULL when the call fails). */
static char *config_value(const char *name)
{
    kvs_config *cfg = NULL;
    const char *names[] = {name};
    if (kvs_client_get_config(g_client, names, 1, -1, &cfg, NULL) != 0)
        return NULL;
    char *v = cfg->n == 1 ? strdup(cfg->entries[0].value) : NULL;
    kvs_config_free(cfg);
    return v;
}

static const kvs_config_entry *config_find(const kvs_config *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->n; i++) {
        if (strcmp(cfg->entries[i].name, name) == 0)
            return &cfg->entries[i];
    }
    return NULL;
}

#define ASSERT_CONFIG_VALUE(name, expected)                                    \
    do {                                                                       \
        char *v_ = config_value(name);                                         \
        CU_ASSERT_PTR_NOT_NULL(v_);                                            \
        if (v_ != NULL)                                                        \
            CU_ASSERT_STRING_EQUAL(v_, expected);                              \
        free(v_);                                                              \
    } while (0)

/* One raw unary call without a token (kvs_itest_raw_call, 5 s deadline). */
static grpc_status_code raw_call(const char *addr, const char *method, const void *payload,
                                 size_t len, char *details, size_t n)
{
    return kvs_itest_raw_call(addr, NULL, method, payload, len, 5000, NULL, NULL, details, n);
}

/* ---- suite "server" -------------------------------------------------- */

static void test_health_serving(void)
{
    const char *services[] = {"", NULL, "kvstash.v1.KvStash"};
    for (size_t i = 0; i < 3; i++) {
        kvs_health_status st = KVS_HEALTH_UNKNOWN;
        char err[KVS_ERR_LEN] = "";
        CU_ASSERT_EQUAL(kvs_client_health(g_client, services[i], -1, &st, err), 0);
        CU_ASSERT_EQUAL(st, KVS_HEALTH_SERVING);
    }
    CU_ASSERT_STRING_EQUAL(kvs_health_status_name(KVS_HEALTH_SERVING), "SERVING");
}

static void test_health_unknown_service(void)
{
    kvs_health_status st = KVS_HEALTH_SERVING;
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL(kvs_client_health(g_client, "no.such.Service", -1, &st, err), KVS_ENOTFOUND);
    CU_ASSERT_EQUAL(strncmp(err, "NOT_FOUND", 9), 0);
    /* err may be NULL */
    CU_ASSERT_EQUAL(kvs_client_health(g_client, "no.such.Service", -1, &st, NULL), KVS_ENOTFOUND);
}

static void test_stats_values(void)
{
    kvs_stats *s = NULL;
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL_FATAL(kvs_client_stats(g_client, "", -1, &s, err), 0);
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    CU_ASSERT_TRUE(s->version[0] != '\0');
    CU_ASSERT_TRUE(s->uptime_seconds > 0);
    CU_ASSERT_TRUE(s->uptime_seconds < 3600);

    static const struct {
        const char *name;
        kvs_metric_kind kind;
    } required[] = {
        {"kvstash_rpc_calls_total", KVS_METRIC_COUNTER},
        {"kvstash_uptime_seconds", KVS_METRIC_GAUGE},
        {"kvstash_worker_threads", KVS_METRIC_GAUGE},
        {"kvstash_store_capacity_bytes", KVS_METRIC_GAUGE},
        {"kvstash_store_used_bytes", KVS_METRIC_GAUGE},
        {"kvstash_store_blocks", KVS_METRIC_GAUGE},
    };
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        const kvs_metric *m = kvs_stats_find(s, required[i].name, NULL, NULL);
        CU_ASSERT_PTR_NOT_NULL(m);
        if (m == NULL) {
            fprintf(stderr, "missing metric %s\n", required[i].name);
            continue;
        }
        CU_ASSERT_EQUAL(m->kind, required[i].kind);
        CU_ASSERT_TRUE(m->help[0] != '\0');
    }
    /* This very call is counted. */
    CU_ASSERT_TRUE(metric_value(s, "kvstash_rpc_calls_total", "method", "Stats") >= 1);
    CU_ASSERT_TRUE(metric_value(s, "kvstash_uptime_seconds", NULL, NULL) > 0);
    CU_ASSERT_DOUBLE_EQUAL(metric_value(s, "kvstash_worker_threads", NULL, NULL),
                           atof(SERVER_THREADS), 1e-9);
    CU_ASSERT_TRUE(metric_value(s, "kvstash_store_capacity_bytes", NULL, NULL) > 0);
    CU_ASSERT_TRUE(metric_value(s, "kvstash_store_used_bytes", NULL, NULL) >= 0);
    CU_ASSERT_TRUE(metric_value(s, "kvstash_store_blocks", NULL, NULL) >= 0);
    kvs_stats_free(s);
}

static void test_stats_counters_increase(void)
{
    double stats1 = stats_value("kvstash_rpc_calls_total", "method", "Stats");
    double stats2 = stats_value("kvstash_rpc_calls_total", "method", "Stats");
    CU_ASSERT_TRUE(stats1 >= 1);
    CU_ASSERT_TRUE(stats2 >= stats1 + 1);

    double check1 = stats_value("kvstash_rpc_calls_total", "method", "Check");
    kvs_health_status st;
    CU_ASSERT_EQUAL(kvs_client_health(g_client, "", -1, &st, NULL), 0);
    CU_ASSERT_EQUAL(kvs_client_health(g_client, "", -1, &st, NULL), 0);
    double check2 = stats_value("kvstash_rpc_calls_total", "method", "Check");
    CU_ASSERT_TRUE(check1 >= 0);
    CU_ASSERT_TRUE(check2 >= check1 + 2);
}

static void test_stats_prefix(void)
{
    kvs_stats *s = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_client_stats(g_client, "kvstash_store_", -1, &s, NULL), 0);
    CU_ASSERT_TRUE(s->n_metrics >= 3);
    for (size_t i = 0; i < s->n_metrics; i++)
        CU_ASSERT_EQUAL(strncmp(s->metrics[i].name, "kvstash_store_", 14), 0);
    CU_ASSERT_PTR_NULL(kvs_stats_find(s, "kvstash_rpc_calls_total", NULL, NULL));
    CU_ASSERT_PTR_NOT_NULL(kvs_stats_find(s, "kvstash_store_capacity_bytes", NULL, NULL));
    kvs_stats_free(s);
}

static void test_stats_print_real(void)
{
    kvs_stats *s = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_client_stats(g_client, NULL, -1, &s, NULL), 0);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    CU_ASSERT_EQUAL(kvs_stats_print(s, f), 0);
    fclose(f);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "# TYPE kvstash_rpc_calls_total counter\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "\nkvstash_rpc_calls_total{method=\"Stats\"} "));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "# TYPE kvstash_store_capacity_bytes gauge\n"));
    /* one TYPE line per family */
    const char *first = strstr(text, "# TYPE kvstash_rpc_calls_total ");
    CU_ASSERT_PTR_NULL(first ? strstr(first + 1, "# TYPE kvstash_rpc_calls_total ") : NULL);
    free(text);
    kvs_stats_free(s);
}

static void test_config_get_all(void)
{
    kvs_config *cfg = NULL;
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL_FATAL(kvs_client_get_config(g_client, NULL, 0, -1, &cfg, err), 0);
    CU_ASSERT_TRUE(cfg->n >= 4);
    const kvs_config_entry *listen = config_find(cfg, "listen");
    const kvs_config_entry *threads = config_find(cfg, "threads");
    const kvs_config_entry *level = config_find(cfg, "log_level");
    const kvs_config_entry *cap = config_find(cfg, "capacity");
    CU_ASSERT_PTR_NOT_NULL(listen);
    CU_ASSERT_PTR_NOT_NULL(threads);
    CU_ASSERT_PTR_NOT_NULL(level);
    CU_ASSERT_PTR_NOT_NULL(cap);
    if (listen != NULL)
        CU_ASSERT_STRING_EQUAL(listen->value, "127.0.0.1:0");
    if (threads != NULL) {
        CU_ASSERT_STRING_EQUAL(threads->value, SERVER_THREADS);
        CU_ASSERT_STRING_EQUAL(threads->type, "int");
    }
    if (level != NULL) {
        CU_ASSERT_EQUAL(level->runtime, 1);
        CU_ASSERT_STRING_EQUAL(level->value, "warn");
    }
    if (cap != NULL) {
        CU_ASSERT_EQUAL(cap->runtime, 1); /* SetConfig resizes the store */
        CU_ASSERT_TRUE(strtod(cap->value, NULL) > 0);
    }
    for (size_t i = 0; i < cfg->n; i++) {
        CU_ASSERT_TRUE(cfg->entries[i].name[0] != '\0');
        CU_ASSERT_TRUE(cfg->entries[i].type[0] != '\0');
        CU_ASSERT_TRUE(cfg->entries[i].help[0] != '\0');
    }
    kvs_config_free(cfg);
}

static void test_config_get_named(void)
{
    const char *names[] = {"log_level", "threads"};
    kvs_config *cfg = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_client_get_config(g_client, names, 2, -1, &cfg, NULL), 0);
    CU_ASSERT_EQUAL(cfg->n, 2);
    CU_ASSERT_PTR_NOT_NULL(config_find(cfg, "log_level"));
    CU_ASSERT_PTR_NOT_NULL(config_find(cfg, "threads"));
    CU_ASSERT_PTR_NULL(config_find(cfg, "listen"));
    kvs_config_free(cfg);
}

static void test_config_get_unknown(void)
{
    const char *names[] = {"log_level", "no_such_setting"};
    kvs_config *cfg = (kvs_config *)1;
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL(kvs_client_get_config(g_client, names, 2, -1, &cfg, err), KVS_EINVAL);
    CU_ASSERT_PTR_NULL(cfg);
    CU_ASSERT_EQUAL(strncmp(err, "INVALID_ARGUMENT: ", 18), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "no_such_setting"));
}

static void test_config_set_runtime(void)
{
    const char *n[] = {"log_level"}, *v[] = {"debug"};
    kvs_config *out = NULL;
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL_FATAL(kvs_client_set_config(g_client, n, v, 1, 0, -1, &out, err), 0);
    CU_ASSERT_EQUAL(out->n, 1);
    if (out->n == 1) {
        CU_ASSERT_STRING_EQUAL(out->entries[0].name, "log_level");
        CU_ASSERT_STRING_EQUAL(out->entries[0].value, "debug");
    }
    kvs_config_free(out);
    ASSERT_CONFIG_VALUE("log_level", "debug");
    /* back to quiet; out may be NULL */
    const char *quiet[] = {"warn"};
    CU_ASSERT_EQUAL(kvs_client_set_config(g_client, n, quiet, 1, 0, -1, NULL, NULL), 0);
    ASSERT_CONFIG_VALUE("log_level", "warn");
}

static void test_config_set_static(void)
{
    char *before = config_value("threads");
    CU_ASSERT_PTR_NOT_NULL_FATAL(before);
    const char *n[] = {"threads"}, *v[] = {"8"};
    char err[KVS_ERR_LEN] = "";
    kvs_config *out = (kvs_config *)1;
    CU_ASSERT_EQUAL(kvs_client_set_config(g_client, n, v, 1, 0, -1, &out, err), KVS_EPRECOND);
    CU_ASSERT_PTR_NULL(out);
    CU_ASSERT_EQUAL(strncmp(err, "FAILED_PRECONDITION: ", 21), 0);
    ASSERT_CONFIG_VALUE("threads", before);
    free(before);
}

static void test_config_set_bad_value(void)
{
    const char *n[] = {"log_level"}, *v[] = {"loud"};
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL(kvs_client_set_config(g_client, n, v, 1, 0, -1, NULL, err), KVS_EINVAL);
    CU_ASSERT_EQUAL(strncmp(err, "INVALID_ARGUMENT: ", 18), 0);
    ASSERT_CONFIG_VALUE("log_level", "warn");
}

static void test_config_set_atomic(void)
{
    char *grace = config_value("shutdown_grace_ms");
    CU_ASSERT_PTR_NOT_NULL_FATAL(grace);
    /* the first setting is valid, the second is not: neither may apply */
    const char *n[] = {"log_level", "shutdown_grace_ms"}, *v[] = {"error", "soon"};
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL(kvs_client_set_config(g_client, n, v, 2, 0, -1, NULL, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "shutdown_grace_ms"));
    ASSERT_CONFIG_VALUE("log_level", "warn");
    ASSERT_CONFIG_VALUE("shutdown_grace_ms", grace);
    free(grace);
}

static void test_config_set_dry_run(void)
{
    const char *n[] = {"log_level"}, *v[] = {"error"};
    kvs_config *out = NULL;
    CU_ASSERT_EQUAL(kvs_client_set_config(g_client, n, v, 1, 1, -1, &out, NULL), 0);
    kvs_config_free(out);
    ASSERT_CONFIG_VALUE("log_level", "warn");
    /* a dry run still validates */
    const char *bad[] = {"loud"};
    CU_ASSERT_EQUAL(kvs_client_set_config(g_client, n, bad, 1, 1, -1, NULL, NULL), KVS_EINVAL);
    ASSERT_CONFIG_VALUE("log_level", "warn");
}

static void test_malformed_payload(void)
{
    /* A varint that never ends within the message: no protobuf parser accepts it. */
    static const unsigned char junk[] = {0xff, 0xff, 0xff, 0xff, 0x0f};
    const char *methods[] = {"/kvstash.v1.KvStash/Stats", "/kvstash.v1.KvStash/GetConfig",
                             "/kvstash.v1.KvStash/SetConfig", "/grpc.health.v1.Health/Check"};
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
        char details[256] = "";
        grpc_status_code st = raw_call(g_srv.addr, methods[i], junk, sizeof junk, details,
                                       sizeof details);
        CU_ASSERT_EQUAL(st, GRPC_STATUS_INVALID_ARGUMENT);
        if (st != GRPC_STATUS_INVALID_ARGUMENT)
            fprintf(stderr, "%s: status %d (%s)\n", methods[i], (int)st, details);
    }
    kvs_health_status hs = KVS_HEALTH_UNKNOWN;
    CU_ASSERT_EQUAL(kvs_client_health(g_client, "", -1, &hs, NULL), 0);
    CU_ASSERT_EQUAL(hs, KVS_HEALTH_SERVING);

    /* and the failure is counted. The server counts a call when its last
     * batch completes, which can be just after the client has the status
     * (a clean-clone CI run read the counter before it moved): poll up to 2 s. */
    int found = 0;
    for (int tries = 0; tries < 100 && !found; tries++) {
        if (tries > 0)
            usleep(20 * 1000);
        kvs_stats *s = NULL;
        CU_ASSERT_EQUAL_FATAL(kvs_client_stats(g_client, "kvstash_rpc_errors_total", -1, &s, NULL),
                              0);
        for (size_t i = 0; i < s->n_metrics; i++) {
            const kvs_metric *m = &s->metrics[i];
            int is_stats = 0, is_inval = 0;
            for (size_t j = 0; j < m->n_labels; j++) {
                is_stats |=
                    !strcmp(m->labels[j].name, "method") && !strcmp(m->labels[j].value, "Stats");
                is_inval |= !strcmp(m->labels[j].name, "code") &&
                            !strcmp(m->labels[j].value, "INVALID_ARGUMENT");
            }
            if (is_stats && is_inval && m->value >= 1) {
                found = 1;
                CU_ASSERT_EQUAL(m->kind, KVS_METRIC_COUNTER);
            }
        }
        kvs_stats_free(s);
    }
    CU_ASSERT_TRUE(found);
}

static void test_unimplemented(void)
{
    const char *methods[] = {"Connect"}; /* the data RPCs are tested in test_data.c */
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
        char path[64], details[256] = "";
        snprintf(path, sizeof path, "/kvstash.v1.KvStash/%s", methods[i]);
        grpc_status_code st = raw_call(g_srv.addr, path, "", 0, details, sizeof details);
        CU_ASSERT_EQUAL(st, GRPC_STATUS_UNIMPLEMENTED);
        CU_ASSERT_TRUE(details[0] != '\0'); /* "with a message" */
        if (st != GRPC_STATUS_UNIMPLEMENTED)
            fprintf(stderr, "%s: status %d (%s)\n", path, (int)st, details);
    }
    /* a method no service declares: standard gRPC behaviour */
    grpc_status_code st = raw_call(g_srv.addr, "/kvstash.v1.KvStash/NoSuchMethod", "", 0, NULL, 0);
    CU_ASSERT_EQUAL(st, GRPC_STATUS_UNIMPLEMENTED);
    kvs_health_status hs = KVS_HEALTH_UNKNOWN;
    CU_ASSERT_EQUAL(kvs_client_health(g_client, "", -1, &hs, NULL), 0);
    CU_ASSERT_EQUAL(hs, KVS_HEALTH_SERVING);
}

static void test_expired_deadline(void)
{
    kvs_health_status hs = KVS_HEALTH_UNKNOWN;
    char err[KVS_ERR_LEN] = "";
    double t0 = kvs_test_now_ms();
    CU_ASSERT_EQUAL(kvs_client_health(g_client, "", 0, &hs, err), KVS_ETIMEDOUT);
    CU_ASSERT_EQUAL(strncmp(err, "DEADLINE_EXCEEDED", 17), 0);
    kvs_stats *s = (kvs_stats *)1;
    CU_ASSERT_EQUAL(kvs_client_stats(g_client, NULL, 0, &s, NULL), KVS_ETIMEDOUT);
    CU_ASSERT_PTR_NULL(s);
    kvs_config *cfg = (kvs_config *)1;
    CU_ASSERT_EQUAL(kvs_client_get_config(g_client, NULL, 0, 0, &cfg, NULL), KVS_ETIMEDOUT);
    CU_ASSERT_PTR_NULL(cfg);
    CU_ASSERT_TRUE(kvs_test_now_ms() - t0 < 1000);
    /* the client is still fine afterwards */
    CU_ASSERT_EQUAL(kvs_client_health(g_client, "", 2000, &hs, NULL), 0);
}

static void test_token_metadata(void)
{
    kvs_client *c = NULL;
    CU_ASSERT_EQUAL_FATAL(open_client(g_srv.addr, "s3cr3t-token", &c), 0);
    kvs_health_status hs = KVS_HEALTH_UNKNOWN;
    CU_ASSERT_EQUAL(kvs_client_health(c, "", -1, &hs, NULL), 0);
    CU_ASSERT_EQUAL(hs, KVS_HEALTH_SERVING);
    kvs_stats *s = NULL;
    CU_ASSERT_EQUAL(kvs_client_stats(c, "kvstash_uptime", -1, &s, NULL), 0);
    kvs_stats_free(s);
    kvs_client_close(c);
}

#define N_THREADS 8
#define N_ROUNDS 50

static atomic_int g_thread_errors;

static void *hammer(void *arg)
{
    (void)arg;
    for (int i = 0; i < N_ROUNDS; i++) {
        char err[KVS_ERR_LEN] = "";
        kvs_health_status hs = KVS_HEALTH_UNKNOWN;
        int rc = kvs_client_health(g_client, "", -1, &hs, err);
        if (rc != 0 || hs != KVS_HEALTH_SERVING) {
            fprintf(stderr, "health: %s (%s)\n", kvs_strerror(rc), err);
            atomic_fetch_add(&g_thread_errors, 1);
        }
        kvs_stats *s = NULL;
        rc = kvs_client_stats(g_client, NULL, -1, &s, err);
        if (rc != 0 || kvs_stats_find(s, "kvstash_rpc_calls_total", NULL, NULL) == NULL) {
            fprintf(stderr, "stats: %s (%s)\n", kvs_strerror(rc), err);
            atomic_fetch_add(&g_thread_errors, 1);
        }
        kvs_stats_free(s);
    }
    return NULL;
}

static void test_concurrent_clients(void)
{
    double before = stats_value("kvstash_rpc_calls_total", "method", "Stats");
    atomic_store(&g_thread_errors, 0);
    pthread_t t[N_THREADS];
    int started = 0;
    for (int i = 0; i < N_THREADS; i++) {
        if (pthread_create(&t[i], NULL, hammer, NULL) == 0)
            started++;
    }
    CU_ASSERT_EQUAL(started, N_THREADS);
    for (int i = 0; i < started; i++)
        pthread_join(t[i], NULL);
    CU_ASSERT_EQUAL(atomic_load(&g_thread_errors), 0);
    double after = stats_value("kvstash_rpc_calls_total", "method", "Stats");
    CU_ASSERT_TRUE(after >= before + N_THREADS * N_ROUNDS + 1);
}

/* ---- suite "connect" ------------------------------------------------- */

static void test_open_unavailable(void)
{
    /* A port bound but never listened on refuses connections, and stays ours
     * for the whole test. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CU_ASSERT_FATAL(fd >= 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof sa;
    CU_ASSERT_FATAL(bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    CU_ASSERT_FATAL(getsockname(fd, (struct sockaddr *)&sa, &sl) == 0);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(sa.sin_port));

    kvs_client_opts o;
    memset(&o, 0, sizeof o);
    o.target = addr;
    o.connect_timeout_ms = 700;
    kvs_client *c = (kvs_client *)1;
    char err[KVS_ERR_LEN] = "";
    double t0 = kvs_test_now_ms();
    int rc = kvs_client_open(&o, &c, err);
    double ms = kvs_test_now_ms() - t0;
    CU_ASSERT_EQUAL(rc, KVS_EUNAVAIL);
    CU_ASSERT_PTR_NULL(c);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, addr));
    CU_ASSERT_TRUE(ms >= 600);  /* it kept trying until the deadline */
    CU_ASSERT_TRUE(ms < 2500);  /* and gave up then */
    close(fd);
}

static void test_open_bad_args(void)
{
    kvs_client *c = (kvs_client *)1;
    kvs_client_opts o;
    memset(&o, 0, sizeof o);
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL(kvs_client_open(&o, &c, err), KVS_EINVAL);
    CU_ASSERT_TRUE(err[0] != '\0');
    CU_ASSERT_EQUAL(kvs_client_open(NULL, &c, NULL), KVS_EINVAL);
    o.target = "127.0.0.1:1";
    o.token = "two\nlines";
    CU_ASSERT_EQUAL(kvs_client_open(&o, &c, err), KVS_EINVAL);
    CU_ASSERT_PTR_NULL(c);
    kvs_client_close(NULL); /* no-op */
}

/* ---- suite "shutdown" ------------------------------------------------ */

/* A client stays connected while the server is told to stop: idle
 * connections must not hold shutdown up. */
static void stop_with(int sig, const char *const *extra_args)
{
    kvs_server_proc p;
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL_FATAL(kvs_server_proc_start(g_kvstashd, extra_args, &p, err), 0);
    kvs_client *c = NULL;
    if (open_client(p.addr, NULL, &c) != 0) {
        kvs_server_proc_kill(&p);
        CU_FAIL_FATAL("cannot connect to the fresh server");
    }
    kvs_health_status hs = KVS_HEALTH_UNKNOWN;
    CU_ASSERT_EQUAL(kvs_client_health(c, "", -1, &hs, NULL), 0);
    CU_ASSERT_EQUAL(hs, KVS_HEALTH_SERVING);

    int status = -1;
    double ms = 0;
    int rc = kvs_server_proc_stop(&p, sig, 5000, &status, &ms);
    fprintf(stderr, "kvstashd: signal %d -> status 0x%x after %.1f ms\n", sig, status, ms);
    CU_ASSERT_EQUAL(rc, 0);
    CU_ASSERT_TRUE(WIFEXITED(status));
    CU_ASSERT_EQUAL(WEXITSTATUS(status), 0);
    /* No call is running, so the grace period must not be waited out. */
    CU_ASSERT_TRUE(ms < 500);

    /* the client sees the server gone */
    CU_ASSERT_NOT_EQUAL(kvs_client_health(c, "", 1000, &hs, NULL), 0);
    kvs_client_close(c);
}

static void test_sigterm(void)
{
    stop_with(SIGTERM, NULL);
}

static void test_sigint(void)
{
    stop_with(SIGINT, NULL);
}

/* A long grace period is for calls in flight, not for idle connections. */
static void test_sigterm_long_grace(void)
{
    static const char *const args[] = {"--shutdown-grace-ms", "30s", NULL};
    stop_with(SIGTERM, args);
}

int main(int argc, char **argv)
{
    g_kvstashd = argc > 1 ? argv[1] : getenv("KVSTASHD");
    if (g_kvstashd == NULL) {
        fprintf(stderr, "usage: %s /path/to/kvstashd (or set KVSTASHD)\n", argv[0]);
        return 2;
    }
    grpc_init(); /* for raw_call; libkvstash takes its own references */

    static const kvs_test_case server_cases[] = {
        {"health_serving", test_health_serving},
        {"health_unknown_service", test_health_unknown_service},
        {"stats_values", test_stats_values},
        {"stats_counters_increase", test_stats_counters_increase},
        {"stats_prefix", test_stats_prefix},
        {"stats_print_real", test_stats_print_real},
        {"config_get_all", test_config_get_all},
        {"config_get_named", test_config_get_named},
        {"config_get_unknown", test_config_get_unknown},
        {"config_set_runtime", test_config_set_runtime},
        {"config_set_static", test_config_set_static},
        {"config_set_bad_value", test_config_set_bad_value},
        {"config_set_atomic", test_config_set_atomic},
        {"config_set_dry_run", test_config_set_dry_run},
        {"malformed_payload", test_malformed_payload},
        {"unimplemented", test_unimplemented},
        {"expired_deadline", test_expired_deadline},
        {"token_metadata", test_token_metadata},
        {"concurrent_clients", test_concurrent_clients},
        {NULL, NULL},
    };
    static const kvs_test_case connect_cases[] = {
        {"open_unavailable", test_open_unavailable},
        {"open_bad_args", test_open_bad_args},
        {NULL, NULL},
    };
    static const kvs_test_case shutdown_cases[] = {
        {"sigterm_exit_0_within_2s", test_sigterm},
        {"sigint_exit_0_within_2s", test_sigint},
        {"sigterm_idle_client_ignores_long_grace", test_sigterm_long_grace},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {
        {"server", suite_server_init, suite_server_cleanup, server_cases},
        {"connect", NULL, NULL, connect_cases},
        {"shutdown", NULL, NULL, shutdown_cases},
        {NULL, NULL, NULL, NULL},
    };
    int rc = kvs_test_run(suites);
    kvs_server_proc_kill(&g_srv); /* in case a suite init failed half-way */
    grpc_shutdown();
    return rc;
}
