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

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int put_sample(FILE *f, const kvs_metric_sample *m, const char *suffix, const char *le,
                      const char *value)
{
    int bad = fprintf(f, "%s%s", m->name, suffix) < 0;
    if (m->n_labels > 0 || le != NULL) {
        bad |= fputc('{', f) == EOF;
        for (int i = 0; i < m->n_labels; i++) {
            bad |= fprintf(f, "%s%s=\"", i ? "," : "", m->label_names[i]) < 0;
            bad |= kvs_prom_put_escaped(f, m->label_values[i], 1);
            bad |= fputc('"', f) == EOF;
        }
        if (le != NULL)
            bad |= fprintf(f, "%sle=\"%s\"", m->n_labels ? "," : "", le) < 0;
        bad |= fputc('}', f) == EOF;
    }
    bad |= fprintf(f, " %s\n", value) < 0;
    return bad;
}

static int put_metric(FILE *f, const kvs_metric_sample *m)
{
    char v[64], le[64];
    if (m->type != KVS_MT_HISTOGRAM) {
        kvs_prom_format_double(m->value, v, sizeof v);
        return put_sample(f, m, "", NULL, v);
    }
    int bad = 0, have_inf = 0;
    for (size_t i = 0; i < m->n_buckets; i++) {
        kvs_prom_format_double(m->bounds[i], le, sizeof le);
        snprintf(v, sizeof v, "%llu", (unsigned long long)m->counts[i]);
        bad |= put_sample(f, m, "_bucket", le, v);
        have_inf |= isinf(m->bounds[i]) && m->bounds[i] > 0;
    }
    snprintf(v, sizeof v, "%llu", (unsigned long long)m->count);
    if (!have_inf)
        bad |= put_sample(f, m, "_bucket", "+Inf", v);
    kvs_prom_format_double(m->sum, le, sizeof le);
    bad |= put_sample(f, m, "_sum", NULL, le);
    bad |= put_sample(f, m, "_count", NULL, v);
    return bad;
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
        if (m->help != NULL && m->help[0] != '\0') {
            bad |= fprintf(f, "# HELP %s ", m->name) < 0;
            bad |= kvs_prom_put_escaped(f, m->help, 0);
            bad |= fputc('\n', f) == EOF;
        }
        bad |= fprintf(f, "# TYPE %s %s\n", m->name, kvs_prom_type_name((int)m->type)) < 0;
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
