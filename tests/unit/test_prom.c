/*
 * test_prom.c — the server's Prometheus renderer (service/prom.c) agrees byte
 * for byte with the client's (kvs_stats_print in clients/c/stats.c) on the
 * same figures: families split across the set, empty HELP, escaping in label
 * values and HELP text, histograms, awkward numbers (0.1, 1e-7, 2^53, NaN,
 * ±Inf). Also checks the rendered text itself on a small known set.
 */
#include "kvs_test.h"
#include "kvstash.h"
#include "prom.h"
#include "stats.h"
#include "tenants.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const double k_bounds[] = {0.001, 0.01, 0.1};

/* Builds the same figures as a server-side set and as a client-side kvs_stats. */
static void build(kvs_metric_set *set, kvs_stats *st)
{
    kvs_metric_set_init(set);
    kvs_metric_add(set, "a_total", "first \\ help\nline two", KVS_MT_COUNTER, 3, 1, "method",
                   "Lookup");
    kvs_metric_add(set, "b_gauge", "", KVS_MT_GAUGE, 0.1, 0);
    kvs_metric_add(set, "a_total", "first \\ help\nline two", KVS_MT_COUNTER, 1e-7, 1, "method",
                   "quote\"back\\slash\nnl");
    kvs_metric_add(set, "c_values", "odd numbers", KVS_MT_GAUGE, 9007199254740992.0, 2, "x", "1",
                   "y", "2");
    kvs_metric_add(set, "c_values", "odd numbers", KVS_MT_GAUGE, NAN, 0);
    kvs_metric_add(set, "c_values", "odd numbers", KVS_MT_GAUGE, INFINITY, 0);
    kvs_metric_add(set, "c_values", "odd numbers", KVS_MT_GAUGE, -INFINITY, 0);
    kvs_metric_sample *h =
        kvs_metric_add(set, "d_seconds", "latency", KVS_MT_HISTOGRAM, 0, 1, "method", "Get");
    h->bounds = k_bounds;
    h->n_buckets = 3;
    h->counts[0] = 1;
    h->counts[1] = 4;
    h->counts[2] = 6;
    h->count = 7;
    h->sum = 0.3333;
    kvs_metric_sample *h0 = kvs_metric_add(set, "e_empty", "no labels", KVS_MT_HISTOGRAM, 0, 0);
    h0->bounds = k_bounds;
    h0->n_buckets = 3;

    memset(st, 0, sizeof *st);
    st->version = strdup("test");
    st->n_metrics = set->n;
    st->metrics = calloc(set->n, sizeof *st->metrics);
    for (size_t i = 0; i < set->n; i++) {
        const kvs_metric_sample *s = &set->v[i];
        kvs_metric *m = &st->metrics[i];
        m->name = strdup(s->name);
        m->help = strdup(s->help);
        m->kind = s->type == KVS_MT_COUNTER ? KVS_METRIC_COUNTER
                  : s->type == KVS_MT_GAUGE ? KVS_METRIC_GAUGE
                                            : KVS_METRIC_HISTOGRAM;
        m->value = s->value;
        m->n_labels = (size_t)s->n_labels;
        m->labels = calloc((size_t)s->n_labels + 1, sizeof *m->labels);
        for (int l = 0; l < s->n_labels; l++) {
            m->labels[l].name = strdup(s->label_names[l]);
            m->labels[l].value = strdup(s->label_values[l]);
        }
        if (s->type == KVS_MT_HISTOGRAM) {
            m->n_buckets = s->n_buckets;
            m->bucket_bounds = calloc(s->n_buckets, sizeof *m->bucket_bounds);
            m->bucket_counts = calloc(s->n_buckets, sizeof *m->bucket_counts);
            for (size_t b = 0; b < s->n_buckets; b++) {
                m->bucket_bounds[b] = s->bounds[b];
                m->bucket_counts[b] = s->counts[b];
            }
            m->sum = s->sum;
            m->count = s->count;
        }
    }
}

static void test_agree(void)
{
    kvs_metric_set set;
    kvs_stats *st = calloc(1, sizeof *st);
    build(&set, st);
    char *a = NULL, *b = NULL;
    size_t alen = 0, blen = 0;
    CU_ASSERT_EQUAL_FATAL(kvs_prom_render(&set, &a, &alen), 0);
    FILE *f = open_memstream(&b, &blen);
    CU_ASSERT_EQUAL(kvs_stats_print(st, f), 0);
    fclose(f);
    CU_ASSERT_EQUAL(alen, strlen(a));
    CU_ASSERT_EQUAL(alen, blen);
    CU_ASSERT_STRING_EQUAL(a, b);
    if (strcmp(a, b) != 0)
        fprintf(stderr, "server:\n%s\nclient:\n%s\n", a, b);
    free(a);
    free(b);
    kvs_stats_free(st);
    kvs_metric_set_free(&set);
}

static void test_text(void)
{
    kvs_metric_set set;
    kvs_stats *st = calloc(1, sizeof *st);
    build(&set, st);
    kvs_stats_free(st);
    char *a = NULL;
    size_t alen = 0;
    CU_ASSERT_EQUAL_FATAL(kvs_prom_render(&set, &a, &alen), 0);
    /* One family header, where its first sample sits; samples of a split family together. */
    CU_ASSERT_PTR_NOT_NULL(strstr(a, "# HELP a_total first \\\\ help\\nline two\n"
                                     "# TYPE a_total counter\n"
                                     "a_total{method=\"Lookup\"} 3\n"
                                     "a_total{method=\"quote\\\"back\\\\slash\\nnl\"} 1e-07\n"
                                     "# TYPE b_gauge gauge\n"
                                     "b_gauge 0.1\n"));
    CU_ASSERT_PTR_NULL(strstr(a, "# HELP b_gauge"));
    CU_ASSERT_PTR_NOT_NULL(strstr(a, "c_values{x=\"1\",y=\"2\"} 9007199254740992\n"
                                     "c_values NaN\nc_values +Inf\nc_values -Inf\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(a, "d_seconds_bucket{method=\"Get\",le=\"0.001\"} 1\n"
                                     "d_seconds_bucket{method=\"Get\",le=\"0.01\"} 4\n"
                                     "d_seconds_bucket{method=\"Get\",le=\"0.1\"} 6\n"
                                     "d_seconds_bucket{method=\"Get\",le=\"+Inf\"} 7\n"
                                     "d_seconds_sum{method=\"Get\"} 0.3333\n"
                                     "d_seconds_count{method=\"Get\"} 7\n"));
    CU_ASSERT_PTR_NOT_NULL(strstr(a, "e_empty_bucket{le=\"+Inf\"} 0\ne_empty_sum 0\n"
                                     "e_empty_count 0\n"));
    /* Exactly one TYPE line per family. */
    int types = 0;
    for (const char *p = a; (p = strstr(p, "# TYPE ")) != NULL; p++)
        types++;
    CU_ASSERT_EQUAL(types, 5);
    free(a);
    kvs_metric_set_free(&set);
}

static void test_empty_and_args(void)
{
    kvs_metric_set set;
    kvs_metric_set_init(&set);
    char *a = (char *)1;
    size_t n = 99;
    CU_ASSERT_EQUAL(kvs_prom_render(&set, &a, &n), 0);
    CU_ASSERT_PTR_NOT_NULL(a);
    CU_ASSERT_EQUAL(n, 0);
    free(a);
    CU_ASSERT_EQUAL(kvs_prom_render(NULL, &a, &n), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_prom_write(&set, NULL), KVS_EINVAL);
}

/* Label values are copied into the sample: a tenant name of the longest
 * length a [tenant.NAME] section allows must come out whole, or two tenants
 * whose names differ only in their last byte print as one series twice. */
static void test_long_tenant_label(void)
{
    char a[KVS_TENANT_NAME_MAX + 1], b[KVS_TENANT_NAME_MAX + 1];
    memset(a, 'x', KVS_TENANT_NAME_MAX);
    a[KVS_TENANT_NAME_MAX] = '\0';
    memcpy(b, a, sizeof b);
    a[KVS_TENANT_NAME_MAX - 1] = 'a';
    b[KVS_TENANT_NAME_MAX - 1] = 'b';
    kvs_metric_set set;
    kvs_metric_set_init(&set);
    CU_ASSERT_PTR_NOT_NULL_FATAL(
        kvs_metric_add(&set, "t_bytes", "by tenant", KVS_MT_GAUGE, 1, 1, "tenant", a));
    CU_ASSERT_PTR_NOT_NULL_FATAL(
        kvs_metric_add(&set, "t_bytes", "by tenant", KVS_MT_GAUGE, 2, 1, "tenant", b));
    CU_ASSERT_STRING_EQUAL(set.v[0].label_values[0], a);
    CU_ASSERT_STRING_EQUAL(set.v[1].label_values[0], b);
    char *text = NULL;
    size_t n = 0;
    CU_ASSERT_EQUAL_FATAL(kvs_prom_render(&set, &text, &n), 0);
    char line[2 * KVS_TENANT_NAME_MAX];
    snprintf(line, sizeof line, "t_bytes{tenant=\"%s\"} 1\n", a);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, line));
    snprintf(line, sizeof line, "t_bytes{tenant=\"%s\"} 2\n", b);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, line));
    free(text);
    kvs_metric_set_free(&set);
}

int main(void)
{
    static const kvs_test_case cases[] = {
        {"server and client renderers agree byte for byte", test_agree},
        {"exposition text: families, escaping, numbers, histograms", test_text},
        {"empty set and bad arguments", test_empty_and_args},
        {"a tenant name of the longest length is a whole label value", test_long_tenant_label},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {{"prom", NULL, NULL, cases}, {NULL, NULL, NULL, NULL}};
    return kvs_test_run(suites);
}
