/*
 * kvstash.h — libkvstash, the C client of a kvstash cache node.
 *
 * A kvs_client is one gRPC channel to one kvstashd. It is safe to use from many
 * threads at once: every call creates its own completion queue and gRPC call.
 * Calls are synchronous and bounded by a deadline.
 *
 * Processes: a kvs_client belongs to the process that opened it. In a process
 * forked from that one, its gRPC connection (socket and polling state), its
 * UCX session and the library's threads are the parent's, shared with it or
 * absent: every call on the client there returns KVS_EPRECOND at once,
 * touching none of them and calling no callback; kvs_client_drain and
 * kvs_client_close return at once (the copy's memory goes with the process).
 * gRPC does not support use across fork(): a child that needs kvstash opens
 * its client after exec.
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

/* Where a Get or a fetch (gRPC or UCX) in KVS_EGRESS_FP16, BF16 or FP32 is
 * made from the stored tiles (kvs_client_opts.decode). KVS_EGRESS_STORED and
 * FP8_PER_TENSOR are not affected: the first is never decoded, the second is
 * always the server's. */
typedef enum kvs_decode_at {
    /* The library's choice: today the client (measured faster end to end,
     * docs/BENCHMARKS.md "Get with client-side decode"). */
    KVS_DECODE_AUTO = 0,
    /* Ask for KVS_EGRESS_STORED (for an 8-bit block: half the bytes of fp16),
     * verify every tile (checksums included) and dequantize here with the
     * kernels library's fast CPU path: the same bytes the server would send. */
    KVS_DECODE_CLIENT = 1,
    /* Ask the server for the format; it dequantizes and sends the result. */
    KVS_DECODE_SERVER = 2,
} kvs_decode_at;

typedef struct kvs_client_opts {
    const char *target;       /* "host:port", required */
    const char *token;        /* bearer token sent as "authorization: Bearer <token>"; NULL = none */
    int connect_timeout_ms;   /* kvs_client_open waits this long for the channel to be READY; <= 0: 5000 */
    int call_timeout_ms;      /* default per-call deadline; <= 0: 10000 */
    size_t max_recv_bytes;    /* largest reply accepted; 0: 64 MiB */
    /* TLS: PEM file of the CA(s) that signed the server's certificate; the
     * channel then speaks TLS and checks the certificate names target's host.
     * NULL or "": plaintext. Read once by kvs_client_open. */
    const char *tls_ca_file;
    /* Mutual TLS (a server with tls_client_ca): PEM certificate chain and its
     * PEM private key this client presents. Both or neither; they need
     * tls_ca_file. NULL or "": none. */
    const char *tls_cert_file;
    const char *tls_key_file;
    /* UCX data plane for kvs_client_fetch: 0 off (gRPC Get only), 1 on when
     * the server offers it (Connect on first use; gRPC when it does not). */
    int ucx;
    /* After the UCX path failed (kvstashd or its data plane process
     * restarted, an endpoint error, a timeout), a fetch or put this many ms
     * later starts a Connect (on a library thread; that call and the others
     * go over gRPC until it is up), the wait doubling with each failure up to
     * 60 s, or ucx_retry_ms if more (a server that refuses UCX: 10 min at
     * least); in between gRPC. 0: 1000;
     * < 0: never (the client stays on gRPC). A client whose data plane
     * answered for kvstashd (forged: ucx_status KVS_EUNAUTH) never retries. */
    int ucx_retry_ms;
    /* Sealed fetches over UCX (docs/TRANSFER.md "Sealed fetches"): > 0:
     * Connect asks kvstashd to tag every layer it lends to this client's
     * session, and a fetch checks each layer's tag before its callback sees
     * the layer, so the data plane process that relays the blocks
     * (kvstash-xferd, ucx_isolate) cannot hand the worker other bytes, nor
     * bytes kvstashd lent for an earlier fetch (each fetch sends a fresh
     * nonce the tags cover; it can still withhold or delay a block). A
     * block whose seal is missing or wrong is fetched over gRPC and the client
     * leaves UCX for good (ucx_status KVS_EUNAUTH, forged_blocks); a kvstashd
     * that cannot seal (older) is not used over UCX. Costs one GMAC pass over
     * each fetched block on each side (about 8 GB/s a core: a stored fetch
     * took 2.4x as long on two cores, docs/BENCHMARKS.md "Sealed fetches"),
     * and a sealed rendered block (KVS_DECODE_SERVER formats) is handed on
     * once all of it has landed. 0 (default) or < 0: no seals (the worker
     * trusts the data plane process). kvstashd with UCX in its own process
     * (ucx_isolate = off) seals nothing: nothing relays its blocks. */
    int ucx_seal_fetches;
    /* kvs_client_get / kvs_client_get_into / kvs_client_fetch in fp16, bf16
     * or fp32: who decodes (kvs_decode_at). 0 (auto) is the usual choice. */
    kvs_decode_at decode;
} kvs_client_opts;

/* Opens a channel and waits until it is connected or connect_timeout_ms
 * passes (KVS_EUNAVAIL). On success *out is a client to free with
 * kvs_client_close; on failure *out is NULL. */
int kvs_client_open(const kvs_client_opts *opts, kvs_client **out, char *err);

/* Closes the channel; calls in flight on other threads must have returned. A
 * UCX session the client opened is closed on kvstashd first (one Connect,
 * at most 2 s or the call timeout, whichever is shorter). In a forked copy it
 * releases nothing and leaves the parent's client alone ("Processes" above).
 * NULL is a no-op. */
void kvs_client_close(kvs_client *c);

/* kvs_status_from_grpc (kvs_error.h) maps a gRPC status code to the KVS_E* code
 * these functions return (see above). */

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

/* --- The data path: Lookup, Put, Get, Delete, Pin, Unpin ---
 *
 * A namespace isolates blocks (docs/KEYSPEC.md): the tenant (from the token),
 * the model fingerprint, the layout and an optional salt. Keys are 32-byte
 * chain keys the server computes; Lookup returns them.
 *
 * Numeric codes shared with the server (kernels/kv_format.h):
 *   scheme: 0 = the namespace's default, 1 fp16, 2 fp8_e4m3, 3 fp8_e5m2, 4 int8;
 *   dtype:  1 fp16, 2 bf16, 3 fp32.
 */
#define KVS_CLIENT_KEY_LEN 32

typedef struct kvs_ns {
    const char *model;        /* model fingerprint, 1..256 bytes, required */
    const char *salt;         /* NULL or "" = none */
    unsigned num_layers;      /* >= 1 */
    unsigned num_kv_heads;    /* >= 1 */
    unsigned head_dim;        /* >= 1 */
    unsigned block_tokens;    /* 16..1024 */
    unsigned dtype;           /* element type sent and expected back: 1 fp16, 2 bf16, 3 fp32 */
} kvs_ns;

/* What Get returns (precision negotiation). */
typedef enum kvs_egress {
    KVS_EGRESS_STORED = 0,          /* the encoded block's tiles, as stored (docs/FORMAT.md) */
    KVS_EGRESS_FP16 = 1,
    KVS_EGRESS_BF16 = 2,
    KVS_EGRESS_FP32 = 3,
    KVS_EGRESS_FP8_PER_TENSOR = 4,  /* E4M3 codes, x = code * k_scale (v_scale for V) */
} kvs_egress;

typedef struct kvs_block_info {
    unsigned char key[KVS_CLIENT_KEY_LEN];
    unsigned index;               /* position in the prompt, 0 = root */
    unsigned scheme;              /* how it is stored */
    unsigned long long stored_bytes;
    unsigned tier;                /* 1 host, 2 gpu, 3 ssd */
} kvs_block_info;

typedef struct kvs_lookup_result {
    unsigned matched_blocks;
    unsigned matched_tokens;
    size_t n_blocks;              /* == matched_blocks */
    kvs_block_info *blocks;       /* root first */
    unsigned long long lease_id;  /* 0 when nothing matched */
    unsigned lease_ms;
} kvs_lookup_result;

/* The longest cached prefix of tokens[0..n_tokens) (only whole blocks count).
 * lease_ms 0 = the server's default. *out is freed with kvs_lookup_result_free. */
int kvs_client_lookup(kvs_client *c, const kvs_ns *ns, const unsigned *tokens, size_t n_tokens,
                      unsigned lease_ms, int timeout_ms, kvs_lookup_result **out, char *err);
void kvs_lookup_result_free(kvs_lookup_result *r);

/* One block to put: layer l's K and V are k[l] and v[l], each
 * [block_tokens][num_kv_heads][head_dim] elements of ns->dtype, host memory,
 * borrowed for the call. */
typedef struct kvs_put_args {
    const kvs_ns *ns;
    const unsigned char *parent_key;  /* KVS_CLIENT_KEY_LEN bytes; NULL for index 0 */
    unsigned index;                   /* position of the block in the prompt */
    const unsigned *tokens;           /* block_tokens token ids of this block */
    unsigned scheme;                  /* 0 = namespace default */
    const void *const *k;             /* num_layers pointers */
    const void *const *v;
} kvs_put_args;

typedef struct kvs_put_result {
    unsigned char key[KVS_CLIENT_KEY_LEN];
    unsigned long long stored_bytes;
    int already_present;
    /* Optional outputs: NULL, or num_layers entries the call fills. */
    float *k_rel_error;
    float *v_rel_error;
    unsigned *layer_scheme;
} kvs_put_result;

/* Puts one block (client-streaming Put: a header, then one message per layer).
 * The block is visible to Lookup once this returns 0. res may be NULL. A
 * client that has left UCX (kvs_client_xfer_stats.close_pending) first has
 * kvstashd close its UCX session; while that close fails (kvstashd not
 * reached, or no answer within timeout_ms, the wait for another thread's
 * close included) nothing is sent and the close's status is returned
 * (KVS_EUNAVAIL, KVS_ETIMEDOUT, ...). */
int kvs_client_put(kvs_client *c, const kvs_put_args *a, int timeout_ms, kvs_put_result *res,
                   char *err);

/* Asynchronous put: copies everything it needs (payload included) and returns
 * at once; cb runs later on a library thread with the outcome (res and err
 * borrowed for the callback). When the call itself returns an error, cb is never
 * called. */
typedef void (*kvs_put_done_cb)(void *arg, int status, const kvs_put_result *res, const char *err);
int kvs_client_put_async(kvs_client *c, const kvs_put_args *a, int timeout_ms, kvs_put_done_cb cb,
                         void *arg);
/* Asynchronous Lookup: packs the request (ns and tokens are borrowed for this
 * call only) and returns at once; cb runs later, exactly once, on the client's
 * completion thread, with the outcome: res is the result when status is 0,
 * else NULL and err says why (res and err borrowed for the callback). Any
 * number may be outstanding at once; they share the client's channel and one
 * library thread that receives every completion, so N concurrent lookups cost
 * one thread, not N. cb may start further lookups (a closed loop); it must not
 * block, nor call kvs_client_drain or kvs_client_close. When the call itself
 * returns an error, cb is never called. */
typedef void (*kvs_lookup_done_cb)(void *arg, int status, const kvs_lookup_result *res,
                                   const char *err);
int kvs_client_lookup_async(kvs_client *c, const kvs_ns *ns, const unsigned *tokens,
                            size_t n_tokens, unsigned lease_ms, int timeout_ms,
                            kvs_lookup_done_cb cb, void *arg);

/* Waits until every asynchronous call of this client (puts, gets and lookups,
 * and those their callbacks start, of any kind) has called back.
 * kvs_client_close does this first. */
void kvs_client_drain(kvs_client *c);

/* Called once per layer of each block, in order (block 0 layers 0..L-1, block 1 ...).
 * k and v are borrowed for the call; k_scale and v_scale are set for
 * KVS_EGRESS_FP8_PER_TENSOR. Return non-zero to stop: the call then returns
 * KVS_ECANCELED and the server releases the lease. */
typedef int (*kvs_get_layer_cb)(void *arg, unsigned block_index, unsigned layer, const void *k,
                                size_t k_len, const void *v, size_t v_len, float k_scale,
                                float v_scale, int last_layer);

/* Fetches blocks by key (usually a Lookup's), layer by layer, in format fmt.
 * lease_id: the Lookup's lease (released when the stream ends), or 0.
 * KVS_EGRESS_STORED: k and v are the layer's K tiles and V tiles back to back
 * (docs/FORMAT.md), each verified (checksum included) before cb sees it; a bad
 * tile ends the call with KVS_EFORMAT. KVS_EGRESS_FP16, BF16 and FP32 are
 * fetched stored and decoded by the client unless opts.decode is
 * KVS_DECODE_SERVER (kvs_decode_at): the bytes cb sees are the same either
 * way, and a bad stored tile is KVS_EFORMAT, as the server's DATA_LOSS is. */
int kvs_client_get(kvs_client *c, const kvs_ns *ns, const unsigned char (*keys)[KVS_CLIENT_KEY_LEN],
                   size_t n_keys, kvs_egress fmt, unsigned long long lease_id, int timeout_ms,
                   kvs_get_layer_cb cb, void *arg, char *err);

/* Asynchronous Get: copies ns and keys and returns at once; a library thread
 * (the put_async pool) then runs kvs_client_get with layer_cb (each layer, in
 * order, on that thread; k and v borrowed for the call) and finally calls
 * done_cb exactly once with the outcome (err NULL on success, else why;
 * borrowed for the callback), both with arg. Neither callback may call
 * kvs_client_drain or kvs_client_close; they may start further calls. When
 * the call itself returns an error (KVS_EINVAL, KVS_ENOMEM, KVS_EUNAVAIL while
 * closing) neither callback runs. kvs_client_drain waits for it. */
typedef void (*kvs_get_done_cb)(void *arg, int status, const char *err);
int kvs_client_get_async(kvs_client *c, const kvs_ns *ns,
                         const unsigned char (*keys)[KVS_CLIENT_KEY_LEN], size_t n_keys,
                         kvs_egress fmt, unsigned long long lease_id, int timeout_ms,
                         kvs_get_layer_cb layer_cb, kvs_get_done_cb done_cb, void *arg);

/* Byte size of one layer's K (or V) of one block in format fmt for ns, or 0 for
 * KVS_EGRESS_STORED (variable). */
size_t kvs_egress_layer_bytes(const kvs_ns *ns, kvs_egress fmt);

/* kvs_client_get into caller buffers: k_dst[b * num_layers + l] and v_dst[...]
 * receive block b's layer l, each kvs_egress_layer_bytes(ns, fmt) bytes
 * (fmt != KVS_EGRESS_STORED). k_scale/v_scale: NULL or n_keys * num_layers floats.
 * With client-side decode (kvs_decode_at) the stored tiles are dequantized
 * straight into k_dst / v_dst. On an error, buffers of layers before the
 * failing one may have been written; with server-side decode
 * (KVS_DECODE_SERVER, KVS_EGRESS_FP8_PER_TENSOR) the failing layer's too (the
 * reply is unpacked into them before its block and layer are checked); later
 * layers' never. */
int kvs_client_get_into(kvs_client *c, const kvs_ns *ns,
                        const unsigned char (*keys)[KVS_CLIENT_KEY_LEN], size_t n_keys,
                        kvs_egress fmt, unsigned long long lease_id, int timeout_ms,
                        void *const *k_dst, void *const *v_dst, float *k_scale, float *v_scale,
                        char *err);

int kvs_client_delete(kvs_client *c, const kvs_ns *ns, const unsigned char (*keys)[KVS_CLIENT_KEY_LEN],
                      size_t n_keys, int subtree, int timeout_ms, unsigned *deleted, char *err);
/* ttl_ms 0 = until Unpin; higher priority survives longer under pressure. */
int kvs_client_pin(kvs_client *c, const kvs_ns *ns, const unsigned char (*keys)[KVS_CLIENT_KEY_LEN],
                   size_t n_keys, unsigned ttl_ms, int priority, int timeout_ms, unsigned *pinned,
                   char *err);
/* Unpins keys, or (lease_id != 0) ends a Lookup lease early. */
int kvs_client_unpin(kvs_client *c, const kvs_ns *ns, const unsigned char (*keys)[KVS_CLIENT_KEY_LEN],
                     size_t n_keys, unsigned long long lease_id, int timeout_ms, unsigned *unpinned,
                     char *err);

/* --- The UCX data plane (clients/c/xfer.c, docs/TRANSFER.md) ---
 *
 * kvs_client_fetch has kvs_client_get's signature and contract (cb sees every
 * layer of block 0, then block 1, ..., in order; the same verification; the
 * lease is ended when the fetch ends; fp16, bf16 and fp32 are decoded by the
 * client from the stored tiles unless opts.decode is KVS_DECODE_SERVER, the
 * same bytes either way). With opts.ucx = 1 it moves the bytes
 * over UCX: on first use it starts the Connect (kvstashd's session, UCX's
 * start and one endpoint per kvs_client) on a thread of the library's own
 * and waits for it within the UCX half of timeout_ms, then goes over gRPC
 * while it goes on (UCX's start alone takes tens of ms); blocks land in buffers the library owns and cb sees them as they
 * arrive. On any UCX failure (Connect UNIMPLEMENTED, UCX cannot start, an
 * endpoint error, a timeout, a block larger than the library's buffer) it
 * goes on over gRPC Get by itself from the first layer cb has not seen, and
 * counts a fallback; a client whose UCX path failed uses gRPC until
 * opts.ucx_retry_ms has passed, then Connects again on a thread of its own
 * (the fetch that starts it goes over gRPC). Errors that
 * gRPC would give too (a block not cached: KVS_ENOTFOUND; corrupt or not of
 * this namespace: KVS_EFORMAT; cb stopped: KVS_ECANCELED) are returned as is.
 * timeout_ms bounds the whole call: the wait for Connect, the UCX fetch and
 * the gRPC Get after a fallback share it. UCX has half of it: a data plane that has not
 * delivered by then counts as failed (the client leaves UCX, as after the
 * transfer's own timeout, kvs_client_opts.call_timeout_ms), the fetch goes
 * on over Get in the time left, and what arrives later is dropped.
 * With opts.ucx = 0 it is kvs_client_get. Thread-safe like the rest. */
int kvs_client_fetch(kvs_client *c, const kvs_ns *ns,
                     const unsigned char (*keys)[KVS_CLIENT_KEY_LEN], size_t n_keys,
                     kvs_egress fmt, unsigned long long lease_id, int timeout_ms,
                     kvs_get_layer_cb cb, void *arg, char *err);

/* kvs_client_fetch into the caller's buffers, as kvs_client_get_into is to
 * kvs_client_get: a fixed-size format (not KVS_EGRESS_STORED); layer l of
 * keys[b] lands in k_dst[b * ns->num_layers + l] and v_dst[...]
 * (kvs_egress_layer_bytes(ns, fmt) bytes each; the same buffer for K and V
 * keeps V), k_scale / v_scale (NULL, or n_keys * num_layers floats) get the
 * per-tensor FP8 scales, 0 for other formats. With client-side decode
 * (fp16/bf16/fp32, kvs_decode_at) each layer is decoded straight into its
 * buffers, without the copy a kvs_client_fetch callback would make. Same
 * statuses, gRPC fallback and kvs_client_xfer_stats as kvs_client_fetch (and
 * KVS_EPROTO, not KVS_ECANCELED, for a layer whose size the format does not
 * have); a
 * layer's buffers are written only once the layer has passed its checks, so
 * after an error those of the failed layer and of later ones hold what they
 * held before, or (after a fallback to gRPC) what Get wrote. */
int kvs_client_fetch_into(kvs_client *c, const kvs_ns *ns,
                          const unsigned char (*keys)[KVS_CLIENT_KEY_LEN], size_t n_keys,
                          kvs_egress fmt, unsigned long long lease_id, int timeout_ms,
                          void *const *k_dst, void *const *v_dst, float *k_scale, float *v_scale,
                          char *err);

typedef struct kvs_client_xfer_stats {
    int connected;                  /* a UCX session is up and usable */
    int ucx_status;                 /* 0, or the KVS_E* that took this client off UCX */
    unsigned long long fetches;     /* kvs_client_fetch calls served over UCX to the end */
    unsigned long long blocks;      /* blocks received over UCX */
    unsigned long long bytes;       /* bytes received over UCX */
    unsigned long long fallbacks;   /* kvs_client_fetch calls that went (on) over gRPC Get */
    /* Blocks that failed their checks over UCX (KVS_EFORMAT): a tile or
     * layer checksum that failed here, a block kvstashd found corrupt, or
     * stored tiles that do not decode. A client without fetch seals returns
     * DATA_LOSS (gRPC would answer the same); a sealing client
     * (fetch_seal 1) takes no verdict from the data plane process: it
     * fetches the block over gRPC Get, kvstashd's own answer, and stays on
     * UCX. */
    unsigned long long corrupt;
    /* 1 once this client, leaving UCX, has had kvstashd close its session
     * (Connect with close_session_id): no put of it can be stored after. */
    unsigned long long sessions_closed;
    /* UCX puts refused without kvstashd's tag (the transfer's own refusal, or
     * one the data plane process invented) that kvstashd then voided through
     * Connect: each went over gRPC, the client stayed on UCX. */
    unsigned long long puts_voided;
    /* 1 while this client has left UCX and kvstashd has not yet closed its
     * session: the next put (kvs_client_put or kvs_client_put_ucx) closes it
     * first. A fetch that leaves UCX does not wait for the close. */
    int close_pending;
    /* Puts not sent over gRPC because that close failed (kvstashd not reached
     * or no answer in the put's time): each returned the close's error
     * (KVS_EUNAVAIL, KVS_ETIMEDOUT, ...) and stored nothing. */
    unsigned long long puts_unsent;
    /* UCX sessions opened again after the path had failed (ucx_retry_ms). */
    unsigned long long reconnects;
    /* The session's fetches are sealed (ucx_seal_fetches): 1 kvstashd tags
     * every lent layer, 2 UCX runs inside kvstashd (nothing relays the
     * blocks), 0 not asked or not connected. */
    int fetch_seal;
    /* Blocks whose seal was missing or wrong: each went over gRPC, and the
     * client left UCX for good (ucx_status KVS_EUNAUTH). */
    unsigned long long forged_blocks;
    /* 1 while a Connect after a failure (reconnects) is under way: on a
     * thread of the library's own, started by the first fetch or put after
     * the wait, which went on over gRPC as every call does until the session
     * is up (none waits for it; kvs_client_close does, within the client's
     * call timeout). */
    int reconnecting;
    /* UCX requests this client stopped waiting for while they still ran (a
     * fetch's batch or a put, whose UCX part of the call's time was up, or a
     * fetch that a failure ended early): each frees its own buffers when it
     * ends. 0 while the data plane answers in time and fetches go through. */
    unsigned long long abandoned;
    /* 1 while the client's first Connect is under way, on a thread of the
     * library's own, started by the first fetch or put (calls, that one
     * included, wait for its outcome within the UCX half of their own time,
     * then go over gRPC while it goes on; kvs_client_close waits for it,
     * within the client's call timeout and UCX's start). */
    int connecting;
} kvs_client_xfer_stats;

/* This client's data-plane figures. 0 or KVS_EINVAL. */
int kvs_client_xfer_stats_get(kvs_client *c, kvs_client_xfer_stats *out);

/* Puts one block like kvs_client_put, over UCX when opts.ucx = 1 (the session
 * kvs_client_fetch uses; Connect on first use): the PutHeader packed as the
 * put's metadata, the layers copied into one buffer (per layer K then V,
 * ns->dtype) as its bytes. kvstashd checks the header exactly as gRPC Put does,
 * for the session's tenant, and answers the same statuses (KVS_EINVAL,
 * KVS_EPRECOND, KVS_ENOSPC, KVS_EPERM, ...), which are returned as is; then it
 * quantizes the block on ingest and commits it before answering 0. On any
 * failure of the UCX path (Connect UNIMPLEMENTED or refused, UCX cannot start,
 * an endpoint error, a timeout, a header over KVS_XFER_MAX_META bytes) the put
 * goes over gRPC by itself and kvs_client_xfer_stats' fallbacks counts it; the
 * client then uses gRPC until opts.ucx_retry_ms has passed. res->key and res->stored_bytes come
 * back as from gRPC Put (the block's chain key, which depends on the tenant's secret, so the next
 * block of a prompt can name it as its parent; all zero from a kvstashd that predates this),
 * already_present is set when the block was cached already, and the optional per-layer quality
 * outputs are left as they are (the UCX answer does not carry them). Each put and its answer are
 * sealed with a per-session key from Connect (docs/TRANSFER.md "Sealed
 * puts"): a put kvstashd refuses as forged or expired, or a success without
 * kvstashd's tag, is a failure of the UCX path too (ucx_status KVS_EUNAUTH),
 * (a process forked from the client's gets KVS_EPRECOND: "Processes"). A refusal
 * without kvstashd's tag (the transfer's own, e.g. its memory full, or one
 * the data plane process invented) sends that put over gRPC once kvstashd has
 * voided it (kvs_client_xfer_stats' puts_voided; the client stays on UCX),
 * or, if kvstashd cannot, after closing the session (ucx_status
 * KVS_EUNAUTH). Leaving UCX closes the session (sessions_closed): no put of
 * it can be stored after that, so a put the data plane process held back
 * cannot undo a later delete (docs/TRANSFER.md "Closing a session").
 * timeout_ms bounds the whole call (the wait for Connect, as kvs_client_fetch
 * waits for it; the UCX put, a void or close,
 * the gRPC put after a fallback). A UCX put without an answer in half of it
 * is a failure of the path: the client leaves UCX and the put goes over
 * gRPC in the time left, once its session is closed (the put held back may
 * still arrive). With opts.ucx = 0 it is kvs_client_put. */
int kvs_client_put_ucx(kvs_client *c, const kvs_put_args *a, int timeout_ms, kvs_put_result *res,
                       char *err);

#ifdef __cplusplus
}
#endif

#endif /* KVSTASH_H */
