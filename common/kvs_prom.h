/*
 * kvs_prom.h — the pieces of the Prometheus text exposition format (0.0.4) that
 * both renderers share: kvstashd's /metrics (service/prom.c, from its metric
 * set) and the client's `kvstash stats` (clients/c/stats.c, from a Stats reply).
 * One spelling of numbers and one escaping rule keep their output identical
 * (test_prom compares them byte for byte).
 */
#ifndef KVS_COMMON_PROM_H
#define KVS_COMMON_PROM_H

#include <stddef.h>
#include <stdio.h>

/* Shortest of %.15g/%.17g that reads back exactly, so 0.1 prints as "0.1" and
 * integers as integers; infinities and NaN in Prometheus spelling. */
void kvs_prom_format_double(double v, char *buf, size_t n);

/* Writes s escaping '\\', '\n' and, when quote is set, '"' (label values; HELP
 * text is written with quote = 0). Returns non-zero when a write failed. */
int kvs_prom_put_escaped(FILE *f, const char *s, int quote);

/* "counter" (1), "gauge" (2), "histogram" (3), anything else "untyped": the
 * numbering both the server's and the client's metric kinds use. */
const char *kvs_prom_type_name(int kind);

/* Writes a family's "# HELP name text" line (only when help is neither NULL
 * nor empty: an empty HELP line says nothing) and its "# TYPE name type" line.
 * Returns non-zero when a write failed. */
int kvs_prom_put_family(FILE *f, const char *name, const char *help, int kind);

/* One sample as a renderer holds it, seen through a view so that the server's
 * kvs_metric_sample and the client's kvs_metric are written by the same code.
 * Plain fields are copied in; labels and bucket counts, which the two store
 * differently, are read from src through the two accessors. The view borrows
 * everything: it is valid while the sample it looks at is. */
typedef struct kvs_prom_sample {
    const char *name;
    const void *src; /* the renderer's own sample, passed to the accessors */
    size_t n_labels;
    void (*label)(const void *src, size_t i, const char **name, const char **value);
    int histogram; /* non-zero: n_buckets, bounds, bucket_count, sum, count; else value */
    double value;
    size_t n_buckets;
    const double *bounds; /* ascending upper bounds */
    /* bucket i's cumulative count */
    unsigned long long (*bucket_count)(const void *src, size_t i);
    double sum;
    unsigned long long count;
} kvs_prom_sample;

/* Writes s's lines: "name{labels} value", or for a histogram one
 * name_bucket{labels,le="bound"} line a bound (with a closing le="+Inf" bucket
 * when the bounds lack one), then name_sum and name_count. Returns non-zero
 * when a write failed. */
int kvs_prom_put_sample(FILE *f, const kvs_prom_sample *s);

#endif /* KVS_COMMON_PROM_H */
