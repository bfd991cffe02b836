/*
 * kvstash.h — libkvstash, the C client of a kvstash cache node.
 *
 * A kvs_client is one gRPC channel to one kvstashd. It is safe to use from many
 * threads at once: every call creates its own completion queue and gRPC call.
 * Calls are synchronous and bounded by a deadline.
 *
 * Deadlines: every call takes timeout_ms. timeout_ms < 0 uses the client's
 * default (kvs_client_opts.call_timeout_ms); timeout_ms == 0 means "already
 * expired" and fails with KVS_ETIMEDOUT without waiting (useful to probe and in
 * tests: the call really is made, with a deadline in the past, and gRPC itself
 * reports DEADLINE_EXCEEDED); > 0 is a deadline that many milliseconds from now.
 *
 * Errors: every function returns 0 or a negative KVS_E* code (kvs_error.h,
 * kvs_strerror()). gRPC statuses map as: INVALID_ARGUMENT→KVS_EINVAL,
 * NOT_FOUND→KVS_ENOTFOUND, ALREADY_EXISTS→KVS_EEXIST,
 * DEADLINE_EXCEEDED→KVS_ETIMEDOUT, UNAVAILABLE→KVS_EUNAVAIL,
 * UNAUTHENTICATED→KVS_EUNAUTH, PERMISSION_DENIED→KVS_EPERM,
 * RESOURCE_EXHAUSTED→KVS_ENOSPC, FAILED_PRECONDITION→KVS_EPRECOND,
 * UNIMPLEMENTED→KVS_EUNIMPL, CANCELLED→KVS_ECANCELED, DATA_LOSS→KVS_EFORMAT,
 * anything else→KVS_EINTERNAL; a reply that does not parse→KVS_EPROTO.
 * When err is not NULL it receives a NUL-terminated detail message, for a
 * failed RPC "<gRPC status name>: <server's status message>", e.g.
 * "INVALID_ARGUMENT: names[0]: unknown setting 'x'"; err may be NULL.
 *
 * Ownership: objects returned through out-params are owned by the caller and
 * freed with their *_free function.
 */
#ifndef KVSTASH_H
#define KVSTASH_H

#include "kvs_error.h"

#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvs_client kvs_client;

typedef struct kvs_client_opts {
    const char *target;       /* "host:port", required */
    const char *token;        /* bearer token sent as "authorization: Bearer <token>"; NULL = none */
    int connect_timeout_ms;   /* kvs_client_open waits this long for the channel to be READY; <= 0: 5000 */
    int call_timeout_ms;      /* default per-call deadline; <= 0: 10000 */
    size_t max_recv_bytes;    /* largest reply accepted; 0: 64 MiB */
} kvs_client_opts;

/* Opens a channel and waits until it is connected or connect_timeout_ms
 * passes (KVS_EUNAVAIL). On success *out is a client to free with
 * kvs_client_close; on failure *out is NULL. */
int kvs_client_open(const kvs_client_opts *opts, kvs_client **out, char *err);

/* Closes the channel; calls in flight on other threads must have returned. NULL is a no-op. */
void kvs_client_close(kvs_client *c);

/* Maps a gRPC status code (grpc_status_code as int) to a KVS_E* code (see above). */
int kvs_status_from_grpc(int grpc_status);

/* --- Health (grpc.health.v1.Health/Check) --- */
typedef enum kvs_health_status {
    KVS_HEALTH_UNKNOWN = 0,
    KVS_HEALTH_SERVING = 1,
    KVS_HEALTH_NOT_SERVING = 2,
    KVS_HEALTH_SERVICE_UNKNOWN = 3,
} kvs_health_status;

/* service: "" (or NULL) for the whole server, or "kvstash.v1.KvStash". */
int kvs_client_health(kvs_client *c, const char *service, int timeout_ms,
                      kvs_health_status *out, char *err);
const char *kvs_health_status_name(kvs_health_status s);

/* --- Stats --- */
typedef enum kvs_metric_kind {
    KVS_METRIC_UNSPECIFIED = 0,
    KVS_METRIC_COUNTER = 1,
    KVS_METRIC_GAUGE = 2,
    KVS_METRIC_HISTOGRAM = 3,
} kvs_metric_kind;

typedef struct kvs_label {
    char *name;
    char *value;
} kvs_label;

typedef struct kvs_metric {
    char *name;
    char *help;
    kvs_metric_kind kind;
    size_t n_labels;
    kvs_label *labels;
    double value;              /* counter, gauge */
    size_t n_buckets;          /* histogram */
    double *bucket_bounds;     /* ascending upper bounds */
    unsigned long long *bucket_counts; /* cumulative */
    double sum;
    unsigned long long count;
} kvs_metric;

typedef struct kvs_stats {
    char *version;
    double uptime_seconds;
    size_t n_metrics;
    kvs_metric *metrics;
} kvs_stats;

/* prefix: only metrics whose name starts with it; NULL or "" for all. */
int kvs_client_stats(kvs_client *c, const char *prefix, int timeout_ms,
                     kvs_stats **out, char *err);
void kvs_stats_free(kvs_stats *s);

/* Finds the first metric called name whose labels include label=value (label
 * NULL: any metric of that name; value NULL: any value of label). Returns it
 * or NULL. Borrowed: valid until kvs_stats_free. */
const kvs_metric *kvs_stats_find(const kvs_stats *s, const char *name,
                                 const char *label, const char *value);

/* Writes the metrics as Prometheus text exposition format (0.0.4): one
 * "# HELP" (omitted when help is empty) and "# TYPE" per metric name, label
 * values escaped, histograms as name_bucket{le="..."} lines ending with
 * le="+Inf", then name_sum and name_count. version and uptime_seconds are not
 * written. Returns 0, KVS_EINVAL (NULL argument) or KVS_EIO (write failed). */
int kvs_stats_print(const kvs_stats *s, FILE *f);

/* --- Runtime configuration --- */
typedef struct kvs_config_entry {
    char *name;
    char *value;
    char *type;
    char *help;
    int runtime;       /* settable while the server runs */
    char *min;
    char *max;
    char *default_value;
} kvs_config_entry;

typedef struct kvs_config {
    size_t n;
    kvs_config_entry *entries;
} kvs_config;

/* names: n_names entry names, or n_names == 0 for every entry. */
int kvs_client_get_config(kvs_client *c, const char *const *names, size_t n_names,
                          int timeout_ms, kvs_config **out, char *err);

/* Sets n settings atomically (all validated, then all applied, or none).
 * dry_run != 0 validates only. *out (may be NULL) receives the entries named. */
int kvs_client_set_config(kvs_client *c, const char *const *names,
                          const char *const *values, size_t n, int dry_run,
                          int timeout_ms, kvs_config **out, char *err);
void kvs_config_free(kvs_config *cfg);

#ifdef __cplusplus
}
#endif

#endif /* KVSTASH_H */
