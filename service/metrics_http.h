/*
 * metrics_http.h — GET /metrics over HTTP (libmicrohttpd), for Prometheus.
 *
 * One MHD daemon with its own polling thread serves:
 *   GET|HEAD /metrics  200, text exposition format 0.0.4 (prom.h), rendered
 *                      from a kvs_metric_set that the caller's collect
 *                      callback fills at each scrape (the server's collect(),
 *                      the very function the Stats RPC uses);
 *   any other path     404;
 *   any other method   405 with "Allow: GET, HEAD".
 * A scrape that cannot be rendered (out of memory) gets 500.
 *
 * Threads: collect runs on the daemon's thread, concurrently with gRPC
 * workers; it must be thread-safe (the server's is: it reads atomics and takes
 * the config read lock). kvs_metrics_http_stop returns only after the daemon
 * thread has finished, so after it the callback is never called again.
 */
#ifndef KVS_METRICS_HTTP_H
#define KVS_METRICS_HTTP_H

#include "stats.h"

typedef struct kvs_metrics_http kvs_metrics_http;

/* Fills set (initialised, empty) with the current figures; 0 or a KVS_E* code. */
typedef int (*kvs_metrics_collect_fn)(void *arg, kvs_metric_set *set);

/* Starts serving on listen, "host:port" (an IPv4 or IPv6 literal, "[::1]:port",
 * or a host name; port 0 picks a free port). arg is passed to collect and
 * must outlive the daemon. Errors: KVS_EINVAL (bad address), KVS_EIO (cannot
 * bind), KVS_ENOMEM; err (KVS_ERR_LEN, may be NULL) says which. */
int kvs_metrics_http_start(const char *listen, kvs_metrics_collect_fn collect, void *arg,
                           kvs_metrics_http **out, char *err);

/* The bound TCP port. */
int kvs_metrics_http_port(const kvs_metrics_http *m);

/* Number of scrapes answered 200 so far. */
unsigned long long kvs_metrics_http_scrapes(const kvs_metrics_http *m);

/* Stops the daemon and frees m. NULL is a no-op. */
void kvs_metrics_http_stop(kvs_metrics_http *m);

#endif /* KVS_METRICS_HTTP_H */
