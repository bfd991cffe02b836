/*
 * prom.h — the server's Prometheus renderer: a kvs_metric_set as text
 * exposition format 0.0.4, the body of GET /metrics.
 *
 * The same set feeds the Stats RPC (handlers.c), and libkvstash renders a
 * Stats reply with kvs_stats_print (clients/c/stats.c). The two renderers
 * follow one set of rules so `kvstash stats` and /metrics print the same
 * bytes for the same figures (tests/unit/test_prom.c compares them):
 *  - one "# HELP" (omitted when the help text is empty) and one "# TYPE" per
 *    metric family, written where the family's first sample sits, followed by
 *    every sample of that name in set order;
 *  - label values escape backslash, double quote and newline; HELP text
 *    escapes backslash and newline;
 *  - numbers: the shorter of %.15g / %.17g that reads back exactly, NaN and
 *    +Inf/-Inf spelled the Prometheus way;
 *  - histograms: name_bucket{...,le="bound"} per bound, a closing le="+Inf"
 *    bucket (unless the last bound already is +Inf), then name_sum and
 *    name_count.
 */
#ifndef KVS_PROM_H
#define KVS_PROM_H

#include "stats.h"

#include <stddef.h>
#include <stdio.h>

/* The Content-Type of the text format. */
#define KVS_PROM_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* Writes set to f. Returns 0, KVS_EINVAL (NULL argument) or KVS_EIO. */
int kvs_prom_write(const kvs_metric_set *set, FILE *f);

/* Renders set into a malloc'd, NUL-terminated buffer: *out (caller frees)
 * and *len (without the NUL). Returns 0, KVS_EINVAL or KVS_ENOMEM. */
int kvs_prom_render(const kvs_metric_set *set, char **out, size_t *len);

#endif /* KVS_PROM_H */
