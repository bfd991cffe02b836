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

#endif /* KVS_COMMON_PROM_H */
