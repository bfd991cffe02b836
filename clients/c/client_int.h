/*
 * client_int.h — internals shared by the files of libkvstash (not installed).
 *
 * The one gRPC boundary of the library is kvs__call_unary(): every RPC packs
 * its request, makes one blocking call on its own pluck completion queue and
 * gets the reply bytes back, so the RPC files (client.c, stats.c, config.c,
 * and later lookup/put/get) deal only in protobuf-c messages and plain structs.
 * Cross-file names carry the kvs__ prefix (STYLE.md); everything else is static.
 */
#ifndef KVS_CLIENT_INT_H
#define KVS_CLIENT_INT_H

#include "kvs_tsan.h"
#include "kvstash.h"
#include "kvstash/v1/kvstash.pb-c.h"

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* ThreadSanitizer cannot see the synchronisation inside libgrpc (built
 * without it): what a thread writes before it starts a batch is read by the
 * thread that takes the completion (async.c's lookup thread). TSAN_ACQUIRE /
 * TSAN_RELEASE (kvs_tsan.h) state that happens-before edge, the one gRPC
 * guarantees, as server.c does, so TSan reports only races of our own. */

/* The methods registered on every channel at open (grpc_channel_register_call),
 * so a call to one of them does not copy and intern its path each time. */
#define KVS__N_REGISTERED 10

/* Pluck queues kept for reuse by unary calls (client.c): at most this many,
 * about one per thread calling at once. */
#define KVS__CQ_POOL 64

struct kvs_client {
    grpc_channel *channel;
    char *target;
    char *auth_value;     /* "Bearer <token>", or NULL when no token */
    grpc_slice auth_slice; /* auth_value as a slice made once (valid iff auth_value) */
    int call_timeout_ms;  /* resolved default, > 0 */
    void *registered[KVS__N_REGISTERED]; /* handles, same order as client.c's table */
    pthread_mutex_t cq_mu;               /* guards cq_free / n_cq_free */
    grpc_completion_queue *cq_free[KVS__CQ_POOL];
    int n_cq_free;
    struct kvs__async *async; /* put_async workers (async.c); NULL until first used */
    /* lookup_async's completion thread (async.c): NULL until first used, then
     * set once under async.c's init lock; read without it. */
    _Atomic(struct kvs__lookups *) lookups;
    /* Asynchronous calls of either kind started and not yet called back
     * (async.c). A callback may start a call of the other kind, which is
     * counted before its own call ends, so 0 means no callback is pending or
     * running: kvs_client_drain (and so close) waits for that, not for each
     * kind's own count in turn (a Lookup's callback may queue a put after
     * the puts were drained). */
    atomic_size_t outstanding;
    int ucx;                  /* opts.ucx: kvs_client_fetch may use UCX (xfer.c) */
    int ucx_retry_ms;         /* opts.ucx_retry_ms: first wait before Connect again; < 0 never */
    int ucx_seal;             /* opts.ucx_seal_fetches > 0: Connect asks for sealed fetches */
    int decode_local;         /* opts.decode resolved: fp16/bf16/fp32 Gets decoded here (data.c) */
    struct kvs__xfer *xfer;   /* the UCX data plane (xfer.c); NULL until first used */
    pid_t pid;                /* the process that opened it: no other may use it (kvs__forked) */
};

/* 0 in the process that opened c. In a process forked from it (kvstash.h
 * "Processes") KVS_EPRECOND, with err (may be NULL) naming fn: its gRPC
 * connection, UCX session and library threads are the parent's, so every
 * call returns this before it touches any of them. */
int kvs__forked(const kvs_client *c, const char *fn, char *err);

/* A deadline ms from now (ms <= 0: already expired), as every call uses. */
gpr_timespec kvs__deadline_in(int ms);

/* Milliseconds on CLOCK_MONOTONIC (kvs_putmac_now_ms's clock): the clock of
 * every deadline and wait below. */
int64_t kvs__mono_ms(void);

/* A call's deadline in milliseconds on kvs__mono_ms's clock, from its timeout_ms
 * (kvstash.h semantics; < 0 = the client's default), for a call made of
 * several steps (a UCX try, a close, a gRPC fallback): each step gets
 * kvs__call_left_ms of it, so the whole call ends within timeout_ms. */
int64_t kvs__call_deadline(const kvs_client *c, int timeout_ms);

/* What is left of deadline in ms: 0 once it has passed (then a call made
 * with it fails with KVS_ETIMEDOUT), at most INT_MAX. */
int kvs__call_left_ms(int64_t deadline);

/* A call to method on the client's channel, bound to cq, with the deadline
 * timeout_ms (kvstash.h semantics; < 0 = the client's default). Never NULL. */
grpc_call *kvs__call_create(kvs_client *c, const char *method, grpc_completion_queue *cq,
                            int timeout_ms);

/*
 * What every call we make keeps while it runs (unary and streaming alike):
 * the call, our authorization metadata (n_md entries: 0 or 1), and where its
 * receive ops leave the server's metadata, status and details.
 * kvs__call_state_init makes the call on cq and fills the rest;
 * kvs__call_state_release frees every gRPC object of it (not cq).
 */
typedef struct kvs__call_state {
    grpc_call *call;
    grpc_metadata auth;
    size_t n_md;
    grpc_metadata_array initial_md, trailing_md;
    grpc_status_code status;
    grpc_slice details;
} kvs__call_state;

void kvs__call_state_init(kvs_client *c, const char *method, grpc_completion_queue *cq,
                          int timeout_ms, kvs__call_state *k);
void kvs__call_state_release(kvs__call_state *k);
/* ops[0] sends our initial metadata, ops[1] the message bb (the caller's: it
 * destroys bb once the batch has completed). */
void kvs__call_send_ops(kvs__call_state *k, grpc_op ops[2], grpc_byte_buffer *bb);
/* *op receives the trailing metadata, status and details into k. */
void kvs__call_status_op(kvs__call_state *k, grpc_op *op);
/* The status k received as a kvs_status_from_grpc() code; when not 0, err
 * gets "<STATUS_NAME>: <details>" (or the name alone without details). */
int kvs__call_status_rc(const kvs__call_state *k, char *err);

/* The authorization metadata entry for this client in *md: returns 1 (then
 * release md->value with grpc_slice_unref after the batch), or 0 when the
 * client has no token. */
int kvs__auth_metadata(kvs_client *c, grpc_metadata *md);

/* Stops the put_async workers after every queued put has called back (async.c). */
void kvs__async_close(kvs_client *c);

/* Closes the UCX session and its endpoint, if any (xfer.c). Called by
 * kvs_client_close only, in the process that opened c (a forked copy's
 * close returns before it and releases nothing). */
void kvs__xfer_close(kvs_client *c);

/* Called by every gRPC put before it sends anything: when this client has
 * left UCX with its session still open, kvstashd closes the session first
 * (xfer.c). 0, or the close's KVS_E* (message in err): then the put must not
 * be sent. */
int kvs__xfer_before_put(kvs_client *c, int timeout_ms, char *err);

/* Decodes one stored layer (K tiles and V tiles back to back, as a Get or a
 * UCX fetch in KVS_EGRESS_STORED delivers them) into kd and vd in fmt (fp16,
 * bf16 or fp32), each kvs_egress_layer_bytes(ns, fmt) bytes: the bytes the
 * server would render. verified: 1 only when our own code has verified every
 * tile of the layer, checksum included, on these bytes just before (a UCX
 * fetch: transfer/ did before it reported the layer; a Get into the caller's
 * buffers: data.c checks first, so that a bad tile leaves them untouched):
 * the checksums are then not computed a second time
 * (kvs_block_decode_run_verified); 0 for anything else (a Get reply decoded
 * into scratch): every tile is checked in full as it is decoded. 0, or
 * KVS_EFORMAT with err set, prefixed with op (data.c). */
int kvs__decode_stored_layer(const char *op, const kvs_ns *ns, kvs_egress fmt, unsigned block,
                             unsigned layer, const void *k, size_t kl, const void *v, size_t vl,
                             int verified, void *kd, void *vd, char *err);

/* Method paths: "/<package>.<Service>/<Method>". */
#define KVS__METHOD_HEALTH_CHECK "/grpc.health.v1.Health/Check"
#define KVS__METHOD_STATS "/kvstash.v1.KvStash/Stats"
#define KVS__METHOD_GET_CONFIG "/kvstash.v1.KvStash/GetConfig"
#define KVS__METHOD_SET_CONFIG "/kvstash.v1.KvStash/SetConfig"
#define KVS__METHOD_LOOKUP "/kvstash.v1.KvStash/Lookup"
#define KVS__METHOD_PUT "/kvstash.v1.KvStash/Put"
#define KVS__METHOD_GET "/kvstash.v1.KvStash/Get"
#define KVS__METHOD_DELETE "/kvstash.v1.KvStash/Delete"
#define KVS__METHOD_PIN "/kvstash.v1.KvStash/Pin"
#define KVS__METHOD_UNPIN "/kvstash.v1.KvStash/Unpin"

/* "INVALID_ARGUMENT" etc.; "UNKNOWN_STATUS" for a code outside the table. */
const char *kvs__grpc_status_name(int grpc_status);

/* snprintf into err when err is not NULL (KVS_ERR_LEN bytes). */
void kvs__set_err(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* strdup that maps NULL to "" so converted structs never hold NULL strings.
 * Returns NULL only when out of memory. */
char *kvs__strdup(const char *s);

/*
 * One unary RPC. Sends req (req_len bytes, may be empty) to method with the
 * deadline timeout_ms (kvstash.h semantics; 0 is an already expired deadline
 * that gRPC itself reports as DEADLINE_EXCEEDED) and the client's
 * authorization metadata.
 *
 * On gRPC status OK with a reply message: returns 0, *reply is a malloc'd copy
 * of the message bytes (caller frees; NULL when the message is empty) and
 * *reply_len its length. Otherwise returns the kvs_status_from_grpc() code,
 * *reply is NULL, and err gets "<STATUS_NAME>: <details>". *grpc_status (may
 * be NULL) receives the gRPC status in every case where a call was made, and
 * GRPC_STATUS_UNKNOWN when it could not be started.
 */
int kvs__call_unary(kvs_client *c, const char *method, const uint8_t *req, size_t req_len,
                    int timeout_ms, uint8_t **reply, size_t *reply_len, int *grpc_status,
                    char *err);

/*
 * One unary call in flight, the state that kvs__unary_start fills and
 * kvs__unary_finish reads and releases. The synchronous calls keep it on
 * their stack; kvs_client_lookup_async keeps it in its heap op until the
 * completion thread sees the tag.
 */
typedef struct kvs__unary {
    kvs__call_state k;
    const char *method;
    grpc_byte_buffer *send_bb;
    grpc_byte_buffer *recv_bb;
    grpc_op ops[6];
} kvs__unary;

/*
 * Starts one unary call of method on cq: one batch of all six ops, whose
 * completion carries tag. Takes over req (the packed request; unref'd here on
 * every path). On 0 exactly one completion with tag will arrive on cq, after
 * which the caller must call kvs__unary_finish(u). On error nothing is left
 * to release and no completion arrives (KVS_EINTERNAL, err says why).
 */
int kvs__unary_start(kvs_client *c, const char *method, grpc_completion_queue *cq,
                     int timeout_ms, grpc_slice req, kvs__unary *u, void *tag, char *err);

/*
 * After the tag of kvs__unary_start completed: the outcome, with every gRPC
 * object of u released. On OK with a message returns 0 and *reply holds the
 * message bytes (the caller unrefs it); otherwise the kvs_status_from_grpc()
 * code (or KVS_EPROTO when OK came without a message), *reply is empty and
 * err says "<STATUS_NAME>: <details>". *grpc_status (may be NULL) gets the
 * gRPC status.
 */
int kvs__unary_finish(kvs__unary *u, grpc_slice *reply, int *grpc_status, char *err);

/* kvs__call_unary() with slices: takes over req; on 0 *reply is the message
 * (caller unrefs). Blocks on a pooled pluck queue. */
int kvs__call_slice(kvs_client *c, const char *method, grpc_slice req, int timeout_ms,
                    grpc_slice *reply, int *grpc_status, char *err);

/* msg packed into a new slice (no intermediate buffer). */
grpc_slice kvs__pack_slice(const ProtobufCMessage *msg);

/* Lookup's request and reply (data.c), shared by kvs_client_lookup and
 * kvs_client_lookup_async: pack checks the arguments (err names fn) and
 * packs a LookupRequest into *out (caller unrefs); from_reply unpacks and
 * checks a LookupResponse into a new result (free with
 * kvs_lookup_result_free). 0 or KVS_EINVAL / KVS_ENOMEM / KVS_EPROTO. */
int kvs__lookup_pack(const kvs_ns *ns, const unsigned *tokens, size_t n_tokens,
                     unsigned lease_ms, const char *fn, grpc_slice *out, char *err);
int kvs__lookup_from_reply(grpc_slice reply, kvs_lookup_result **out, char *err);

/* Waits for and stops lookup_async's completion thread (async.c). */
void kvs__lookups_close(kvs_client *c);

/*
 * kvs__call_unary() in protobuf-c terms: packs req, unpacks the reply as
 * reply_desc. On 0, *reply is an unpacked message to free with
 * protobuf_c_message_free_unpacked(*reply, NULL). A reply that does not parse
 * is KVS_EPROTO.
 */
int kvs__call_pb(kvs_client *c, const char *method, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *reply_desc, int timeout_ms,
                 ProtobufCMessage **reply, char *err);

/* Deep copies of replies into the public structs (stats.c, config.c).
 * Return 0, KVS_ENOMEM or KVS_EPROTO (inconsistent reply). */
struct Kvstash__V1__StatsResponse;
struct Kvstash__V1__ConfigEntry;
int kvs__stats_from_pb(const struct Kvstash__V1__StatsResponse *pb, kvs_stats **out);
int kvs__config_from_pb(struct Kvstash__V1__ConfigEntry *const *entries, size_t n,
                        kvs_config **out);

/* The protobuf namespace, pointing at an kvs_ns's strings (no copies). */
typedef struct pb_ns {
    Kvstash__V1__Namespace ns;
    Kvstash__V1__Layout layout;
} pb_ns;

/* A Put's header as gRPC Put and the UCX put (xfer.c) both send it: *out points
 * at a's namespace strings, tokens and parent key and at itself (use it in
 * place, do not copy it). Validates a as kvs_client_put documents (ns, model,
 * dtype, layers, block_tokens, every k[l] and v[l]); 0 or KVS_EINVAL with err
 * naming kvs_client_put. layer_bytes: one layer's K (or V) in the source dtype. */
typedef struct kvs__pb_put {
    pb_ns pns;
    Kvstash__V1__PutHeader hdr;
    size_t layer_bytes;
} kvs__pb_put;
int kvs__put_header(const kvs_put_args *a, kvs__pb_put *out, char *err);

#endif /* KVS_CLIENT_INT_H */
