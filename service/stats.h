/*
 * stats.h — the server's own counters and the metric set every renderer reads.
 *
 * Modules fill a caller-owned kvs_metric_set with samples (counter, gauge,
 * histogram, up to KVS_METRIC_MAX_LABELS labels each); one renderer turns the
 * set into the Stats reply (handlers.c) and, later, Prometheus text for
 * /metrics — so both always carry the same figures (STYLE.md).
 *
 * kvs_rpc_stats is updated lock-free (relaxed atomics) from every worker
 * thread; readers see each counter consistent on its own, not a snapshot of
 * all of them together.
 */
#ifndef KVS_STATS_H
#define KVS_STATS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define KVS_METRIC_MAX_LABELS 3
#define KVS_METRIC_MAX_BUCKETS 24
/* A label value with its NUL: room for the longest tenant name (tenants.h
 * KVS_TENANT_NAME_MAX, data_common.c checks it), the longest value there is. */
#define KVS_METRIC_LABEL_LEN 80

typedef enum kvs_metric_type {
    KVS_MT_COUNTER = 1,
    KVS_MT_GAUGE = 2,
    KVS_MT_HISTOGRAM = 3,
} kvs_metric_type;

typedef struct kvs_metric_sample {
    const char *name;  /* static storage */
    const char *help;  /* static storage */
    kvs_metric_type type;
    int n_labels;
    const char *label_names[KVS_METRIC_MAX_LABELS];       /* static storage */
    char label_values[KVS_METRIC_MAX_LABELS][KVS_METRIC_LABEL_LEN];
    double value;                                         /* counter, gauge */
    size_t n_buckets;                                     /* histogram */
    const double *bounds;                                 /* static storage, ascending */
    uint64_t counts[KVS_METRIC_MAX_BUCKETS];              /* cumulative */
    double sum;
    uint64_t count;
} kvs_metric_sample;

typedef struct kvs_metric_set {
    kvs_metric_sample *v;
    size_t n, cap;
} kvs_metric_set;

void kvs_metric_set_init(kvs_metric_set *s);
void kvs_metric_set_free(kvs_metric_set *s);

/* Appends a counter or gauge; the variadic part is n_labels (name, value)
 * pairs of const char *. Returns the new sample or NULL when out of memory. */
kvs_metric_sample *kvs_metric_add(kvs_metric_set *s, const char *name, const char *help,
                                  kvs_metric_type type, double value, int n_labels, ...);

/* RPC latency histogram bounds in seconds, and their count. */
extern const double kvs_rpc_latency_bounds[];
extern const size_t kvs_rpc_latency_nbounds;

#define KVS_RPC_MAX_METHODS 16
#define KVS_RPC_STATUS_CODES 17 /* gRPC status codes 0..16 */

typedef struct kvs_rpc_stats {
    _Atomic uint64_t calls[KVS_RPC_MAX_METHODS];
    _Atomic uint64_t status[KVS_RPC_MAX_METHODS][KVS_RPC_STATUS_CODES];
    _Atomic uint64_t latency[KVS_RPC_MAX_METHODS][KVS_METRIC_MAX_BUCKETS]; /* per bucket, not cumulative */
    _Atomic uint64_t latency_ns_sum[KVS_RPC_MAX_METHODS];
} kvs_rpc_stats;

/* Records one finished call: its status code and wall time. */
void kvs_rpc_stats_record(kvs_rpc_stats *st, size_t method, int grpc_status, uint64_t ns);

/* Appends the RPC figures to set: calls, errors by code, latency histogram.
 * names[i] labels method i. */
int kvs_rpc_stats_collect(const kvs_rpc_stats *st, const char *const *names, size_t n_methods,
                          kvs_metric_set *set);

/* The data path's own figures (hits, misses, bytes in and out, quantization
 * error per layer measured on ingest). Lock-free like kvs_rpc_stats. */
#define KVS_QERR_LAYERS 64 /* layers 0..63 get their own histograms; deeper ones share "64+" */
extern const double kvs_qerr_bounds[];
extern const size_t kvs_qerr_nbounds;

typedef struct kvs_data_stats {
    /* Whole blocks Lookup served / did not serve, and their tokens: each a
     * counter of its own, so each result only grows however it is read (a
     * miss figure computed as asked - hit from two loads went backwards). */
    _Atomic uint64_t hit_blocks, miss_blocks;
    _Atomic uint64_t hit_tokens, miss_tokens;
    _Atomic uint64_t ingest_bytes;   /* Put payload bytes received (source dtype) */
    _Atomic uint64_t stored_bytes;   /* encoded bytes committed by Put */
    _Atomic uint64_t egress_bytes;   /* K and V bytes sent by Get */
    _Atomic uint64_t put_blocks, put_present, put_aborted, get_blocks;
    _Atomic uint64_t put_seal_refused; /* UCX puts whose seal was missing, wrong or replayed */
    _Atomic uint64_t put_closed;       /* UCX puts refused: their client closed the session */
    _Atomic uint64_t ucx_closed;       /* UCX sessions closed by their client (Connect) */
    _Atomic uint64_t ucx_close_unknown; /* Connect closes naming no session of the caller */
    _Atomic uint64_t put_voided;        /* UCX puts voided by their client (Connect) */
    _Atomic uint64_t fetch_sealed;      /* blocks lent to sessions that seal their fetches */
    _Atomic uint64_t put_staged_bytes; /* gauge: Puts' encoded blocks held until commit */
    /* Puts whose model rule names a profile: its scales applied, or the
     * namespace's shape differs from the profile's (dynamic scales). */
    _Atomic uint64_t put_profile_applied, put_profile_mismatch;
    /* [layer][0 = K, 1 = V][bucket], per bucket (not cumulative); sums in 1e-9 units. */
    _Atomic uint64_t qerr[KVS_QERR_LAYERS + 1][2][KVS_METRIC_MAX_BUCKETS];
    _Atomic uint64_t qerr_sum_nano[KVS_QERR_LAYERS + 1][2];
} kvs_data_stats;

/* Records one Lookup: blocks whole blocks asked for, hits of them served,
 * block_tokens tokens each. */
void kvs_data_stats_lookup(kvs_data_stats *st, uint64_t blocks, uint64_t hits,
                           uint32_t block_tokens);

/* Records one layer's relative error (kind 0 = K, 1 = V). */
void kvs_data_stats_qerr(kvs_data_stats *st, uint32_t layer, int kind, float rel_error);

/* Appends the data-path figures to set. */
int kvs_data_stats_collect(const kvs_data_stats *st, kvs_metric_set *set);

/* Name of a gRPC status code ("OK", "INVALID_ARGUMENT", ...); "UNKNOWN" when out of range. */
const char *kvs_grpc_status_name(int code);

#endif /* KVS_STATS_H */
