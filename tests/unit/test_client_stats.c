/* test_client_stats.c — libkvstash's pure stats/config code: Prometheus text
 * rendering (escaping, families, histograms), kvs_stats_find, and the deep
 * copies out of protobuf-c replies (run under ASan, a shallow copy is a
 * use-after-free). */
#include "client_int.h"
#include "kvs_test.h"

#include "kvstash/v1/kvstash.pb-c.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A hand-built kvs_stats; static storage, never freed with kvs_stats_free. */
static kvs_label g_l0[] = {{"path", "/a\"b\\c\nd"}};
static kvs_label g_l3[] = {{"path", "/x"}};
static kvs_label g_lget[] = {{"method", "Get"}};
static kvs_label g_lput[] = {{"method", "Put"}};
static double g_b2[] = {0.005, 0.5, 2.5};
static unsigned long long g_c2[] = {1, 4, 5};
static double g_b4[] = {1, INFINITY};
static unsigned long long g_c4[] = {2, 3};

static kvs_metric g_metrics[] = {
    {.name = "req_total", .help = "Requests.\nSecond \\ line", .kind = KVS_METRIC_COUNTER,
     .n_labels = 1, .labels = g_l0, .value = 3},
    {.name = "temp", .help = "", .kind = KVS_METRIC_GAUGE, .value = 0.1},
    {.name = "lat_seconds", .help = "Latency", .kind = KVS_METRIC_HISTOGRAM, .n_labels = 1,
     .labels = g_lget, .n_buckets = 3, .bucket_bounds = g_b2, .bucket_counts = g_c2, .sum = 3.25,
     .count = 6},
    {.name = "req_total", .help = "Requests.\nSecond \\ line", .kind = KVS_METRIC_COUNTER,
     .n_labels = 1, .labels = g_l3, .value = 12345678901.0},
    {.name = "lat_seconds", .help = "Latency", .kind = KVS_METRIC_HISTOGRAM, .n_labels = 1,
     .labels = g_lput, .n_buckets = 2, .bucket_bounds = g_b4, .bucket_counts = g_c4, .sum = 1.5,
     .count = 3},
    {.name = "weird", .help = "odd \"quotes\" stay", .kind = KVS_METRIC_UNSPECIFIED, .value = NAN},
    {.name = "neg", .help = "h", .kind = KVS_METRIC_GAUGE, .value = -INFINITY},
};

static kvs_stats g_stats = {.version = "t", .uptime_seconds = 1, .n_metrics = 7,
                            .metrics = g_metrics};

static const char *const g_expected =
    "# HELP req_total Requests.\\nSecond \\\\ line\n"
    "# TYPE req_total counter\n"
    "req_total{path=\"/a\\\"b\\\\c\\nd\"} 3\n"
    "req_total{path=\"/x\"} 12345678901\n"
    "# TYPE temp gauge\n"
    "temp 0.1\n"
    "# HELP lat_seconds Latency\n"
    "# TYPE lat_seconds histogram\n"
    "lat_seconds_bucket{method=\"Get\",le=\"0.005\"} 1\n"
    "lat_seconds_bucket{method=\"Get\",le=\"0.5\"} 4\n"
    "lat_seconds_bucket{method=\"Get\",le=\"2.5\"} 5\n"
    "lat_seconds_bucket{method=\"Get\",le=\"+Inf\"} 6\n"
    "lat_seconds_sum{method=\"Get\"} 3.25\n"
    "lat_seconds_count{method=\"Get\"} 6\n"
    "lat_seconds_bucket{method=\"Put\",le=\"1\"} 2\n"
    "lat_seconds_bucket{method=\"Put\",le=\"+Inf\"} 3\n"
    "lat_seconds_sum{method=\"Put\"} 1.5\n"
    "lat_seconds_count{method=\"Put\"} 3\n"
    "# HELP weird odd \"quotes\" stay\n"
    "# TYPE weird untyped\n"
    "weird NaN\n"
    "# HELP neg h\n"
    "# TYPE neg gauge\n"
    "neg -Inf\n";

static char *render(const kvs_stats *s, int *rc)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    *rc = kvs_stats_print(s, f);
    fclose(f);
    return text;
}

static void test_print_exposition(void)
{
    int rc = -1;
    char *text = render(&g_stats, &rc);
    CU_ASSERT_EQUAL(rc, 0);
    CU_ASSERT_STRING_EQUAL(text, g_expected);
    if (strcmp(text, g_expected) != 0)
        fprintf(stderr, "--- got:\n%s--- want:\n%s", text, g_expected);
    free(text);
}

static void test_print_histogram_without_buckets(void)
{
    kvs_metric m = {.name = "h", .help = "x", .kind = KVS_METRIC_HISTOGRAM, .sum = 0.25,
                    .count = 2};
    kvs_stats s = {.version = "", .n_metrics = 1, .metrics = &m};
    int rc = -1;
    char *text = render(&s, &rc);
    CU_ASSERT_EQUAL(rc, 0);
    CU_ASSERT_STRING_EQUAL(text, "# HELP h x\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\n"
                                 "h_sum 0.25\nh_count 2\n");
    free(text);
}

static void test_print_empty_and_errors(void)
{
    kvs_stats empty = {.version = "", .n_metrics = 0, .metrics = NULL};
    int rc = -1;
    char *text = render(&empty, &rc);
    CU_ASSERT_EQUAL(rc, 0);
    CU_ASSERT_STRING_EQUAL(text, "");
    free(text);

    FILE *ro = fopen("/dev/null", "r");
    CU_ASSERT_PTR_NOT_NULL_FATAL(ro);
    CU_ASSERT_EQUAL(kvs_stats_print(&g_stats, ro), KVS_EIO);
    fclose(ro);
    CU_ASSERT_EQUAL(kvs_stats_print(NULL, stdout), KVS_EINVAL);
}

static void test_find(void)
{
    CU_ASSERT_PTR_EQUAL(kvs_stats_find(&g_stats, "req_total", NULL, NULL), &g_metrics[0]);
    CU_ASSERT_PTR_EQUAL(kvs_stats_find(&g_stats, "req_total", "path", "/x"), &g_metrics[3]);
    CU_ASSERT_PTR_EQUAL(kvs_stats_find(&g_stats, "req_total", "path", NULL), &g_metrics[0]);
    CU_ASSERT_PTR_EQUAL(kvs_stats_find(&g_stats, "lat_seconds", "method", "Put"), &g_metrics[4]);
    CU_ASSERT_PTR_NULL(kvs_stats_find(&g_stats, "req_total", "path", "/y"));
    CU_ASSERT_PTR_NULL(kvs_stats_find(&g_stats, "req_total", "method", NULL));
    CU_ASSERT_PTR_NULL(kvs_stats_find(&g_stats, "temp", "any", NULL));
    CU_ASSERT_PTR_NULL(kvs_stats_find(&g_stats, "req", NULL, NULL)); /* whole names only */
    CU_ASSERT_PTR_NULL(kvs_stats_find(NULL, "req_total", NULL, NULL));
    CU_ASSERT_PTR_NULL(kvs_stats_find(&g_stats, NULL, NULL, NULL));
}

/* Packs msg and unpacks it again, so the copy is heap-owned like a real reply. */
static ProtobufCMessage *roundtrip(const ProtobufCMessage *msg)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = malloc(n ? n : 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(buf);
    protobuf_c_message_pack(msg, buf);
    ProtobufCMessage *m = protobuf_c_message_unpack(msg->descriptor, NULL, n, buf);
    free(buf);
    return m;
}

static void test_stats_from_pb(void)
{
    Kvstash__V1__Label lab = KVSTASH__V1__LABEL__INIT;
    lab.name = "method";
    lab.value = "Stats";
    Kvstash__V1__Label *labs[] = {&lab};
    Kvstash__V1__Metric c = KVSTASH__V1__METRIC__INIT;
    c.name = "kvstash_rpc_calls_total";
    c.help = "calls";
    c.kind = KVSTASH__V1__METRIC__KIND__COUNTER;
    c.n_labels = 1;
    c.labels = labs;
    c.value = 7;
    double bounds[] = {0.1, 1};
    uint64_t counts[] = {3, 5};
    Kvstash__V1__Metric h = KVSTASH__V1__METRIC__INIT;
    h.name = "lat";
    h.kind = KVSTASH__V1__METRIC__KIND__HISTOGRAM;
    h.n_bucket_bounds = 2;
    h.bucket_bounds = bounds;
    h.n_bucket_counts = 2;
    h.bucket_counts = counts;
    h.sum = 2.5;
    h.count = 6;
    Kvstash__V1__Metric *ms[] = {&c, &h};
    Kvstash__V1__StatsResponse r = KVSTASH__V1__STATS_RESPONSE__INIT;
    r.version = "kvstash 9.9";
    r.uptime_seconds = 12.5;
    r.n_metrics = 2;
    r.metrics = ms;

    ProtobufCMessage *pb = roundtrip(&r.base);
    CU_ASSERT_PTR_NOT_NULL_FATAL(pb);
    kvs_stats *s = NULL;
    int rc = kvs__stats_from_pb((const Kvstash__V1__StatsResponse *)pb, &s);
    protobuf_c_message_free_unpacked(pb, NULL); /* s must not point into it */
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    CU_ASSERT_STRING_EQUAL(s->version, "kvstash 9.9");
    CU_ASSERT_DOUBLE_EQUAL(s->uptime_seconds, 12.5, 1e-12);
    CU_ASSERT_EQUAL_FATAL(s->n_metrics, 2);
    const kvs_metric *m = kvs_stats_find(s, "kvstash_rpc_calls_total", "method", "Stats");
    CU_ASSERT_PTR_EQUAL(m, &s->metrics[0]);
    CU_ASSERT_EQUAL(s->metrics[0].kind, KVS_METRIC_COUNTER);
    CU_ASSERT_STRING_EQUAL(s->metrics[0].help, "calls");
    CU_ASSERT_DOUBLE_EQUAL(s->metrics[0].value, 7, 1e-12);
    CU_ASSERT_EQUAL(s->metrics[1].kind, KVS_METRIC_HISTOGRAM);
    CU_ASSERT_STRING_EQUAL(s->metrics[1].help, ""); /* never NULL */
    CU_ASSERT_EQUAL_FATAL(s->metrics[1].n_buckets, 2);
    CU_ASSERT_DOUBLE_EQUAL(s->metrics[1].bucket_bounds[1], 1.0, 1e-12);
    CU_ASSERT_EQUAL(s->metrics[1].bucket_counts[0], 3);
    CU_ASSERT_EQUAL(s->metrics[1].bucket_counts[1], 5);
    CU_ASSERT_EQUAL(s->metrics[1].count, 6);
    CU_ASSERT_DOUBLE_EQUAL(s->metrics[1].sum, 2.5, 1e-12);
    kvs_stats_free(s);

    /* bounds and counts of different lengths: rejected, nothing leaked */
    h.n_bucket_counts = 1;
    pb = roundtrip(&r.base);
    CU_ASSERT_PTR_NOT_NULL_FATAL(pb);
    s = (kvs_stats *)1;
    CU_ASSERT_EQUAL(kvs__stats_from_pb((const Kvstash__V1__StatsResponse *)pb, &s), KVS_EPROTO);
    CU_ASSERT_PTR_NULL(s);
    protobuf_c_message_free_unpacked(pb, NULL);
    kvs_stats_free(NULL); /* no-op */
}

static void test_config_from_pb(void)
{
    Kvstash__V1__ConfigEntry e = KVSTASH__V1__CONFIG_ENTRY__INIT;
    e.name = "log_level";
    e.value = "info";
    e.type = "enum";
    e.help = "level";
    e.runtime = 1;
    e.min = "debug|info|warn|error|off";
    e.default_value = "info";
    Kvstash__V1__ConfigEntry *es[] = {&e};
    Kvstash__V1__GetConfigResponse r = KVSTASH__V1__GET_CONFIG_RESPONSE__INIT;
    r.n_entries = 1;
    r.entries = es;
    ProtobufCMessage *pb = roundtrip(&r.base);
    CU_ASSERT_PTR_NOT_NULL_FATAL(pb);
    const Kvstash__V1__GetConfigResponse *pr = (const Kvstash__V1__GetConfigResponse *)pb;
    kvs_config *cfg = NULL;
    int rc = kvs__config_from_pb(pr->entries, pr->n_entries, &cfg);
    protobuf_c_message_free_unpacked(pb, NULL);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    CU_ASSERT_EQUAL_FATAL(cfg->n, 1);
    CU_ASSERT_STRING_EQUAL(cfg->entries[0].name, "log_level");
    CU_ASSERT_STRING_EQUAL(cfg->entries[0].value, "info");
    CU_ASSERT_STRING_EQUAL(cfg->entries[0].type, "enum");
    CU_ASSERT_EQUAL(cfg->entries[0].runtime, 1);
    CU_ASSERT_STRING_EQUAL(cfg->entries[0].min, "debug|info|warn|error|off");
    CU_ASSERT_STRING_EQUAL(cfg->entries[0].max, "");
    CU_ASSERT_STRING_EQUAL(cfg->entries[0].default_value, "info");
    kvs_config_free(cfg);

    CU_ASSERT_EQUAL(kvs__config_from_pb(NULL, 0, &cfg), 0);
    CU_ASSERT_EQUAL(cfg->n, 0);
    kvs_config_free(cfg);
    kvs_config_free(NULL);
}

int main(void)
{
    static const kvs_test_case cases[] = {
        {"print_exposition", test_print_exposition},
        {"print_histogram_without_buckets", test_print_histogram_without_buckets},
        {"print_empty_and_errors", test_print_empty_and_errors},
        {"find", test_find},
        {"stats_from_pb", test_stats_from_pb},
        {"config_from_pb", test_config_from_pb},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {{"client_stats", NULL, NULL, cases},
                                            {NULL, NULL, NULL, NULL}};
    return kvs_test_run(suites);
}
