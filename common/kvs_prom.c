/*
 * kvs_prom.c — number spelling, escaping, family headers and sample lines for
 * Prometheus text (kvs_prom.h).
 */
#include "kvs_prom.h"

#include <math.h>
#include <stdlib.h>

void kvs_prom_format_double(double v, char *buf, size_t n)
{
    if (isnan(v)) {
        snprintf(buf, n, "NaN");
    } else if (isinf(v)) {
        snprintf(buf, n, v > 0 ? "+Inf" : "-Inf");
    } else {
        snprintf(buf, n, "%.15g", v);
        if (strtod(buf, NULL) != v)
            snprintf(buf, n, "%.17g", v);
    }
}

int kvs_prom_put_escaped(FILE *f, const char *s, int quote)
{
    int bad = 0;
    for (; *s != '\0'; s++) {
        int r;
        if (*s == '\\')
            r = fputs("\\\\", f);
        else if (*s == '\n')
            r = fputs("\\n", f);
        else if (quote && *s == '"')
            r = fputs("\\\"", f);
        else
            r = fputc((unsigned char)*s, f);
        bad |= (r == EOF);
    }
    return bad;
}

const char *kvs_prom_type_name(int kind)
{
    switch (kind) {
    case 1:
        return "counter";
    case 2:
        return "gauge";
    case 3:
        return "histogram";
    default:
        return "untyped";
    }
}

int kvs_prom_put_family(FILE *f, const char *name, const char *help, int kind)
{
    int bad = 0;
    if (help != NULL && help[0] != '\0') {
        bad |= fprintf(f, "# HELP %s ", name) < 0;
        bad |= kvs_prom_put_escaped(f, help, 0);
        bad |= fputc('\n', f) == EOF;
    }
    bad |= fprintf(f, "# TYPE %s %s\n", name, kvs_prom_type_name(kind)) < 0;
    return bad;
}

/* name<suffix>{labels[,le="bound"]} value\n; le may be NULL. */
static int put_line(FILE *f, const kvs_prom_sample *s, const char *suffix, const char *le,
                    const char *value)
{
    int bad = fprintf(f, "%s%s", s->name, suffix) < 0;
    if (s->n_labels > 0 || le != NULL) {
        bad |= fputc('{', f) == EOF;
        for (size_t i = 0; i < s->n_labels; i++) {
            const char *name, *val;
            s->label(s->src, i, &name, &val);
            bad |= fprintf(f, "%s%s=\"", i ? "," : "", name) < 0;
            bad |= kvs_prom_put_escaped(f, val, 1);
            bad |= fputc('"', f) == EOF;
        }
        if (le != NULL)
            bad |= fprintf(f, "%sle=\"%s\"", s->n_labels ? "," : "", le) < 0;
        bad |= fputc('}', f) == EOF;
    }
    bad |= fprintf(f, " %s\n", value) < 0;
    return bad;
}

int kvs_prom_put_sample(FILE *f, const kvs_prom_sample *s)
{
    char v[64], le[64];
    if (!s->histogram) {
        kvs_prom_format_double(s->value, v, sizeof v);
        return put_line(f, s, "", NULL, v);
    }
    int bad = 0, have_inf = 0;
    for (size_t i = 0; i < s->n_buckets; i++) {
        kvs_prom_format_double(s->bounds[i], le, sizeof le);
        snprintf(v, sizeof v, "%llu", s->bucket_count(s->src, i));
        bad |= put_line(f, s, "_bucket", le, v);
        have_inf |= isinf(s->bounds[i]) && s->bounds[i] > 0;
    }
    snprintf(v, sizeof v, "%llu", s->count);
    if (!have_inf)
        bad |= put_line(f, s, "_bucket", "+Inf", v);
    kvs_prom_format_double(s->sum, le, sizeof le);
    bad |= put_line(f, s, "_sum", NULL, le);
    bad |= put_line(f, s, "_count", NULL, v);
    return bad;
}
