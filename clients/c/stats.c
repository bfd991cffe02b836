/*
 * stats.c — libkvstash: the Stats RPC, the plain kvs_stats copy of its reply,
 * and the Prometheus text renderer.
 *
 * The reply is deep-copied out of the protobuf-c message so the caller's
 * kvs_stats owns every byte and the public header needs no protobuf type.
 * Rendering follows the text exposition format 0.0.4: one "# HELP"/"# TYPE"
 * pair per metric family (all samples of one name, wherever they sit in the
 * reply), label values escaped (backslash, double quote, newline), HELP text
 * escaped (backslash, newline), histograms as _bucket{le=...} lines with a
 * closing le="+Inf" bucket, then _sum and _count.
 */
#include "client_int.h"
#include "kvs_prom.h"

#include "kvstash/v1/kvstash.pb-c.h"

#include <stdlib.h>
#include <string.h>

/* ---- conversion ------------------------------------------------------ */

static void metric_clear(kvs_metric *m)
{
    free(m->name);
    free(m->help);
    for (size_t i = 0; i < m->n_labels; i++) {
        free(m->labels[i].name);
        free(m->labels[i].value);
    }
    free(m->labels);
    free(m->bucket_bounds);
    free(m->bucket_counts);
}

void kvs_stats_free(kvs_stats *s)
{
    if (s == NULL)
        return;
    for (size_t i = 0; i < s->n_metrics; i++)
        metric_clear(&s->metrics[i]);
    free(s->metrics);
    free(s->version);
    free(s);
}

static int metric_from_pb(const Kvstash__V1__Metric *pm, kvs_metric *m)
{
    m->name = kvs__strdup(pm->name);
    m->help = kvs__strdup(pm->help);
    if (m->name == NULL || m->help == NULL)
        return KVS_ENOMEM;
    switch (pm->kind) {
    case KVSTASH__V1__METRIC__KIND__COUNTER:
        m->kind = KVS_METRIC_COUNTER;
        break;
    case KVSTASH__V1__METRIC__KIND__GAUGE:
        m->kind = KVS_METRIC_GAUGE;
        break;
    case KVSTASH__V1__METRIC__KIND__HISTOGRAM:
        m->kind = KVS_METRIC_HISTOGRAM;
        break;
    default:
        m->kind = KVS_METRIC_UNSPECIFIED;
        break;
    }
    m->value = pm->value;
    m->sum = pm->sum;
    m->count = pm->count;
    if (pm->n_labels > 0) {
        m->labels = calloc(pm->n_labels, sizeof *m->labels);
        if (m->labels == NULL)
            return KVS_ENOMEM;
        for (size_t i = 0; i < pm->n_labels; i++) {
            m->n_labels = i + 1; /* so metric_clear frees what was copied */
            m->labels[i].name = kvs__strdup(pm->labels[i]->name);
            m->labels[i].value = kvs__strdup(pm->labels[i]->value);
            if (m->labels[i].name == NULL || m->labels[i].value == NULL)
                return KVS_ENOMEM;
        }
    }
    if (pm->n_bucket_bounds != pm->n_bucket_counts)
        return KVS_EPROTO;
    if (pm->n_bucket_bounds > 0) {
        size_t n = pm->n_bucket_bounds;
        m->bucket_bounds = malloc(n * sizeof *m->bucket_bounds);
        m->bucket_counts = malloc(n * sizeof *m->bucket_counts);
        if (m->bucket_bounds == NULL || m->bucket_counts == NULL)
            return KVS_ENOMEM;
        m->n_buckets = n;
        memcpy(m->bucket_bounds, pm->bucket_bounds, n * sizeof *m->bucket_bounds);
        for (size_t i = 0; i < n; i++)
            m->bucket_counts[i] = (unsigned long long)pm->bucket_counts[i];
    }
    return 0;
}

int kvs__stats_from_pb(const Kvstash__V1__StatsResponse *pb, kvs_stats **out)
{
    *out = NULL;
    kvs_stats *s = calloc(1, sizeof *s);
    if (s == NULL)
        return KVS_ENOMEM;
    int rc = 0;
    s->uptime_seconds = pb->uptime_seconds;
    if ((s->version = kvs__strdup(pb->version)) == NULL) {
        rc = KVS_ENOMEM;
        goto fail;
    }
    if (pb->n_metrics > 0) {
        s->metrics = calloc(pb->n_metrics, sizeof *s->metrics);
        if (s->metrics == NULL) {
            rc = KVS_ENOMEM;
            goto fail;
        }
        for (size_t i = 0; i < pb->n_metrics; i++) {
            s->n_metrics = i + 1;
            if ((rc = metric_from_pb(pb->metrics[i], &s->metrics[i])) != 0)
                goto fail;
        }
    }
    *out = s;
    return 0;
fail:
    kvs_stats_free(s);
    return rc;
}

int kvs_client_stats(kvs_client *c, const char *prefix, int timeout_ms, kvs_stats **out,
                     char *err)
{
    if (c == NULL || out == NULL) {
        kvs__set_err(err, "kvs_client_stats: client and out are required");
        return KVS_EINVAL;
    }
    *out = NULL; /* on a failure from here on, a forked copy's included */
    if (kvs__forked(c, "kvs_client_stats", err) != 0)
        return KVS_EPRECOND;
    Kvstash__V1__StatsRequest req = KVSTASH__V1__STATS_REQUEST__INIT;
    req.prefix = (char *)(prefix != NULL ? prefix : "");
    ProtobufCMessage *rep = NULL;
    int rc = kvs__call_pb(c, KVS__METHOD_STATS, &req.base, &kvstash__v1__stats_response__descriptor,
                          timeout_ms, &rep, err);
    if (rc != 0)
        return rc;
    rc = kvs__stats_from_pb((const Kvstash__V1__StatsResponse *)rep, out);
    protobuf_c_message_free_unpacked(rep, NULL);
    if (rc == KVS_EPROTO)
        kvs__set_err(err, "Stats reply has a histogram whose bounds and counts differ in length");
    else if (rc != 0)
        kvs__set_err(err, "out of memory");
    return rc;
}

/* ---- lookup ---------------------------------------------------------- */

const kvs_metric *kvs_stats_find(const kvs_stats *s, const char *name, const char *label,
                                 const char *value)
{
    if (s == NULL || name == NULL)
        return NULL;
    for (size_t i = 0; i < s->n_metrics; i++) {
        const kvs_metric *m = &s->metrics[i];
        if (strcmp(m->name, name) != 0)
            continue;
        if (label == NULL)
            return m;
        for (size_t j = 0; j < m->n_labels; j++) {
            if (strcmp(m->labels[j].name, label) == 0 &&
                (value == NULL || strcmp(m->labels[j].value, value) == 0))
                return m;
        }
    }
    return NULL;
}

/* ---- Prometheus text ------------------------------------------------- */

static void metric_label(const void *src, size_t i, const char **name, const char **value)
{
    const kvs_metric *m = src;
    *name = m->labels[i].name;
    *value = m->labels[i].value;
}

static unsigned long long metric_count(const void *src, size_t i)
{
    return ((const kvs_metric *)src)->bucket_counts[i];
}

static int put_metric(FILE *f, const kvs_metric *m)
{
    const kvs_prom_sample s = {
        .name = m->name,
        .src = m,
        .n_labels = m->n_labels,
        .label = metric_label,
        .histogram = m->kind == KVS_METRIC_HISTOGRAM,
        .value = m->value,
        .n_buckets = m->n_buckets,
        .bounds = m->bucket_bounds,
        .bucket_count = metric_count,
        .sum = m->sum,
        .count = m->count,
    };
    return kvs_prom_put_sample(f, &s);
}

int kvs_stats_print(const kvs_stats *s, FILE *f)
{
    if (s == NULL || f == NULL)
        return KVS_EINVAL;
    int bad = 0;
    for (size_t i = 0; i < s->n_metrics; i++) {
        const kvs_metric *m = &s->metrics[i];
        int seen = 0;
        for (size_t j = 0; j < i && !seen; j++)
            seen = strcmp(s->metrics[j].name, m->name) == 0;
        if (seen)
            continue; /* its family was written with the first sample */
        bad |= kvs_prom_put_family(f, m->name, m->help, (int)m->kind);
        for (size_t j = i; j < s->n_metrics; j++) {
            if (strcmp(s->metrics[j].name, m->name) == 0)
                bad |= put_metric(f, &s->metrics[j]);
        }
    }
    bad |= fflush(f) == EOF;
    return bad || ferror(f) ? KVS_EIO : 0;
}
