/* stats.c — metric sets and the RPC counters (see stats.h). */
#include "stats.h"

#include "kvs_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const double kvs_rpc_latency_bounds[] = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                         0.005,   0.01,   0.025,   0.05,   0.1,   0.25,
                                         0.5,     1.0,    2.5,     5.0,    10.0};
const size_t kvs_rpc_latency_nbounds =
    sizeof kvs_rpc_latency_bounds / sizeof kvs_rpc_latency_bounds[0];

void kvs_metric_set_init(kvs_metric_set *s) { memset(s, 0, sizeof *s); }

void kvs_metric_set_free(kvs_metric_set *s)
{
    free(s->v);
    memset(s, 0, sizeof *s);
}

static kvs_metric_sample *push(kvs_metric_set *s)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 32;
        kvs_metric_sample *v = realloc(s->v, cap * sizeof *v);
        if (v == NULL)
            return NULL;
        s->v = v;
        s->cap = cap;
    }
    kvs_metric_sample *m = &s->v[s->n++];
    memset(m, 0, sizeof *m);
    return m;
}

kvs_metric_sample *kvs_metric_add(kvs_metric_set *s, const char *name, const char *help,
                                  kvs_metric_type type, double value, int n_labels, ...)
{
    KVS_ASSERT(n_labels >= 0 && n_labels <= KVS_METRIC_MAX_LABELS);
    kvs_metric_sample *m = push(s);
    if (m == NULL)
        return NULL;
    m->name = name;
    m->help = help;
    m->type = type;
    m->value = value;
    m->n_labels = n_labels;
    va_list ap;
    va_start(ap, n_labels);
    for (int i = 0; i < n_labels; i++) {
        m->label_names[i] = va_arg(ap, const char *);
        snprintf(m->label_values[i], KVS_METRIC_LABEL_LEN, "%s", va_arg(ap, const char *));
    }
    va_end(ap);
    return m;
}

void kvs_rpc_stats_record(kvs_rpc_stats *st, size_t method, int grpc_status, uint64_t ns)
{
    KVS_ASSERT(method < KVS_RPC_MAX_METHODS);
    if (grpc_status < 0 || grpc_status >= KVS_RPC_STATUS_CODES)
        grpc_status = 2; /* UNKNOWN */
    atomic_fetch_add_explicit(&st->status[method][grpc_status], 1, memory_order_relaxed);
    double sec = (double)ns / 1e9;
    size_t b = 0;
    while (b < kvs_rpc_latency_nbounds && sec > kvs_rpc_latency_bounds[b])
        b++;
    atomic_fetch_add_explicit(&st->latency[method][b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&st->latency_ns_sum[method], ns, memory_order_relaxed);
}

const char *kvs_grpc_status_name(int code)
{
    const char *n = code < KVS_RPC_STATUS_CODES ? kvs_grpc_code_name(code) : NULL;
    return n ? n : "UNKNOWN";
}

int kvs_rpc_stats_collect(const kvs_rpc_stats *st, const char *const *names, size_t n_methods,
                          kvs_metric_set *set)
{
    KVS_ASSERT(n_methods <= KVS_RPC_MAX_METHODS);
    KVS_ASSERT(kvs_rpc_latency_nbounds < KVS_METRIC_MAX_BUCKETS);
    for (size_t m = 0; m < n_methods; m++) {
        uint64_t calls = atomic_load_explicit(&st->calls[m], memory_order_relaxed);
        if (!kvs_metric_add(set, "kvstash_rpc_calls_total", "RPCs received, by method",
                            KVS_MT_COUNTER, (double)calls, 1, "method", names[m]))
            return KVS_ENOMEM;
        for (int code = 1; code < KVS_RPC_STATUS_CODES; code++) {
            uint64_t n = atomic_load_explicit(&st->status[m][code], memory_order_relaxed);
            if (n == 0)
                continue;
            if (!kvs_metric_add(set, "kvstash_rpc_errors_total",
                                "RPCs that ended with a non-OK status, by method and code",
                                KVS_MT_COUNTER, (double)n, 2, "method", names[m], "code",
                                kvs_grpc_status_name(code)))
                return KVS_ENOMEM;
        }
        kvs_metric_sample *h = kvs_metric_add(set, "kvstash_rpc_latency_seconds",
                                              "time from accepting an RPC to its final status",
                                              KVS_MT_HISTOGRAM, 0, 1, "method", names[m]);
        if (h == NULL)
            return KVS_ENOMEM;
        h->bounds = kvs_rpc_latency_bounds;
        h->n_buckets = kvs_rpc_latency_nbounds;
        uint64_t cum = 0;
        for (size_t b = 0; b <= kvs_rpc_latency_nbounds; b++) {
            cum += atomic_load_explicit(&st->latency[m][b], memory_order_relaxed);
            if (b < kvs_rpc_latency_nbounds)
                h->counts[b] = cum;
        }
        h->count = cum;
        h->sum = (double)atomic_load_explicit(&st->latency_ns_sum[m], memory_order_relaxed) / 1e9;
    }
    return 0;
}

/* ---- data path --------------------------------------------------------- */

const double kvs_qerr_bounds[] = {0.0001, 0.0003, 0.001, 0.003, 0.01, 0.02,
                                  0.03,   0.05,   0.1,   0.2,   0.5,  1.0};
const size_t kvs_qerr_nbounds = sizeof kvs_qerr_bounds / sizeof kvs_qerr_bounds[0];

void kvs_data_stats_lookup(kvs_data_stats *st, uint64_t blocks, uint64_t hits,
                           uint32_t block_tokens)
{
    uint64_t misses = blocks - hits;
    atomic_fetch_add_explicit(&st->hit_blocks, hits, memory_order_relaxed);
    atomic_fetch_add_explicit(&st->miss_blocks, misses, memory_order_relaxed);
    atomic_fetch_add_explicit(&st->hit_tokens, hits * block_tokens, memory_order_relaxed);
    atomic_fetch_add_explicit(&st->miss_tokens, misses * block_tokens, memory_order_relaxed);
}

void kvs_data_stats_qerr(kvs_data_stats *st, uint32_t layer, int kind, float rel_error)
{
    if (layer > KVS_QERR_LAYERS)
        layer = KVS_QERR_LAYERS;
    kind = kind ? 1 : 0;
    double e = rel_error >= 0 ? (double)rel_error : 0; /* NaN and negatives count as 0 */
    size_t b = 0;
    while (b < kvs_qerr_nbounds && e > kvs_qerr_bounds[b])
        b++;
    atomic_fetch_add_explicit(&st->qerr[layer][kind][b], 1, memory_order_relaxed);
    uint64_t nano = e < 1e9 ? (uint64_t)(e * 1e9) : UINT64_C(1) << 62;
    atomic_fetch_add_explicit(&st->qerr_sum_nano[layer][kind], nano, memory_order_relaxed);
}

int kvs_data_stats_collect(const kvs_data_stats *st, kvs_metric_set *set)
{
    KVS_ASSERT(kvs_qerr_nbounds < KVS_METRIC_MAX_BUCKETS);
#define LOAD(x) ((double)atomic_load_explicit(&st->x, memory_order_relaxed))
    struct {
        const char *name, *help, *label, *value;
        double v;
    } c[] = {
        {"kvstash_lookup_blocks_total", "whole blocks asked for by Lookup, by result", "result",
         "hit", LOAD(hit_blocks)},
        {"kvstash_lookup_blocks_total", "whole blocks asked for by Lookup, by result", "result",
         "miss", LOAD(miss_blocks)},
        {"kvstash_lookup_tokens_total", "tokens of whole blocks asked for by Lookup, by result",
         "result", "hit", LOAD(hit_tokens)},
        {"kvstash_lookup_tokens_total", "tokens of whole blocks asked for by Lookup, by result",
         "result", "miss", LOAD(miss_tokens)},
        {"kvstash_ingest_bytes_total", "KV payload bytes received by Put (source dtype)", NULL,
         NULL, LOAD(ingest_bytes)},
        {"kvstash_ingest_stored_bytes_total", "encoded bytes committed by Put", NULL, NULL,
         LOAD(stored_bytes)},
        {"kvstash_egress_bytes_total", "K and V bytes sent by Get", NULL, NULL, LOAD(egress_bytes)},
        {"kvstash_put_blocks_total", "Put outcomes", "result", "stored", LOAD(put_blocks)},
        {"kvstash_put_blocks_total", "Put outcomes", "result", "already_present",
         LOAD(put_present)},
        {"kvstash_put_blocks_total", "Put outcomes", "result", "aborted", LOAD(put_aborted)},
        {"kvstash_get_blocks_total", "blocks streamed by Get", NULL, NULL, LOAD(get_blocks)},
        {"kvstash_put_profile_blocks_total",
         "Put headers whose model rule names a calibration profile: its per-tensor scales "
         "applied, or the namespace's shape differs from the profile's (dynamic scales)",
         "result", "applied", LOAD(put_profile_applied)},
        {"kvstash_put_profile_blocks_total",
         "Put headers whose model rule names a calibration profile: its per-tensor scales "
         "applied, or the namespace's shape differs from the profile's (dynamic scales)",
         "result", "shape_mismatch", LOAD(put_profile_mismatch)},
    };
    double staged = LOAD(put_staged_bytes);
#undef LOAD
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        kvs_metric_sample *m =
            c[i].label ? kvs_metric_add(set, c[i].name, c[i].help, KVS_MT_COUNTER, c[i].v, 1,
                                        c[i].label, c[i].value)
                       : kvs_metric_add(set, c[i].name, c[i].help, KVS_MT_COUNTER, c[i].v, 0);
        if (m == NULL)
            return KVS_ENOMEM;
    }
    if (!kvs_metric_add(set, "kvstash_put_staged_bytes",
                        "encoded bytes of Puts still being received or quantized (held outside "
                        "the store until their commit)",
                        KVS_MT_GAUGE, staged, 0))
        return KVS_ENOMEM;
    static const char *const kinds[2] = {"k", "v"};
    for (int l = 0; l <= KVS_QERR_LAYERS; l++) {
        for (int k = 0; k < 2; k++) {
            uint64_t cum = 0, counts[KVS_METRIC_MAX_BUCKETS];
            for (size_t b = 0; b <= kvs_qerr_nbounds; b++) {
                cum += atomic_load_explicit(&st->qerr[l][k][b], memory_order_relaxed);
                if (b < kvs_qerr_nbounds)
                    counts[b] = cum;
            }
            if (cum == 0)
                continue;
            char layer[16];
            if (l < KVS_QERR_LAYERS)
                snprintf(layer, sizeof layer, "%d", l);
            else
                snprintf(layer, sizeof layer, "%d+", KVS_QERR_LAYERS);
            kvs_metric_sample *h = kvs_metric_add(
                set, "kvstash_quant_rel_error",
                "relative error ||X-X'||/||X|| of each layer's K or V measured on ingest",
                KVS_MT_HISTOGRAM, 0, 2, "layer", layer, "tensor", kinds[k]);
            if (h == NULL)
                return KVS_ENOMEM;
            h->bounds = kvs_qerr_bounds;
            h->n_buckets = kvs_qerr_nbounds;
            memcpy(h->counts, counts, kvs_qerr_nbounds * sizeof counts[0]);
            h->count = cum;
            h->sum = (double)atomic_load_explicit(&st->qerr_sum_nano[l][k], memory_order_relaxed) /
                     1e9;
        }
    }
    return 0;
}
