/*
 * prom.c — Prometheus text exposition format 0.0.4 from a kvs_metric_set
 * (see prom.h for the rules it shares with the client's kvs_stats_print).
 *
 * Families are grouped by name with one quadratic pass over the set: a set
 * holds a few hundred samples, and keeping the set's order (rather than
 * sorting) is what makes the output identical to the client renderer's.
 */
#include "prom.h"

#include "kvs_error.h"
#include "kvs_prom.h"

#include <stdlib.h>
#include <string.h>

static void sample_label(const void *src, size_t i, const char **name, const char **value)
{
    const kvs_metric_sample *m = src;
    *name = m->label_names[i];
    *value = m->label_values[i];
}

static unsigned long long sample_count(const void *src, size_t i)
{
    return ((const kvs_metric_sample *)src)->counts[i];
}

static int put_metric(FILE *f, const kvs_metric_sample *m)
{
    const kvs_prom_sample s = {
        .name = m->name,
        .src = m,
        .n_labels = (size_t)m->n_labels,
        .label = sample_label,
        .histogram = m->type == KVS_MT_HISTOGRAM,
        .value = m->value,
        .n_buckets = m->n_buckets,
        .bounds = m->bounds,
        .bucket_count = sample_count,
        .sum = m->sum,
        .count = m->count,
    };
    return kvs_prom_put_sample(f, &s);
}

int kvs_prom_write(const kvs_metric_set *set, FILE *f)
{
    if (set == NULL || f == NULL)
        return KVS_EINVAL;
    int bad = 0;
    for (size_t i = 0; i < set->n; i++) {
        const kvs_metric_sample *m = &set->v[i];
        int seen = 0;
        for (size_t j = 0; j < i && !seen; j++)
            seen = strcmp(set->v[j].name, m->name) == 0;
        if (seen)
            continue; /* written with its family's first sample */
        bad |= kvs_prom_put_family(f, m->name, m->help, (int)m->type);
        for (size_t j = i; j < set->n; j++)
            if (strcmp(set->v[j].name, m->name) == 0)
                bad |= put_metric(f, &set->v[j]);
    }
    bad |= fflush(f) == EOF;
    return bad || ferror(f) ? KVS_EIO : 0;
}

int kvs_prom_render(const kvs_metric_set *set, char **out, size_t *len)
{
    if (set == NULL || out == NULL || len == NULL)
        return KVS_EINVAL;
    *out = NULL;
    *len = 0;
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (f == NULL)
        return KVS_ENOMEM;
    int rc = kvs_prom_write(set, f);
    if (fclose(f) != 0 && rc == 0)
        rc = KVS_ENOMEM;
    if (rc != 0) {
        free(buf);
        return rc == KVS_EIO ? KVS_ENOMEM : rc; /* a memstream fails only for memory */
    }
    *out = buf;
    *len = n;
    return 0;
}
