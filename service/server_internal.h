/*
 * server_internal.h — what server.c (the gRPC machinery) shares with
 * handlers.c (what each RPC does). Not a public API: kvs__ names only.
 *
 * A kvs__call is one accepted RPC. Its `step` is called once for each
 * completion of the batch it started, so exactly one batch is in flight per
 * call and a call is only ever touched by one thread at a time: no per-call
 * lock is needed.
 */
#ifndef KVS_SERVER_INTERNAL_H
#define KVS_SERVER_INTERNAL_H

#include "config.h"
#include "kvs_error.h"
#include "server.h"
#include "stats.h"
#include "tenants.h"

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

typedef struct kvs__call kvs__call;

typedef enum kvs__rpc_kind {
    KVS__UNARY,
    KVS__CLIENT_STREAM,
    KVS__SERVER_STREAM,
} kvs__rpc_kind;

/* A unary handler: req is the unpacked request (borrowed, freed after it
 * returns). It must end with kvs__call_reply or kvs__call_fail. */
typedef void (*kvs__unary_fn)(kvs__call *c, const ProtobufCMessage *req);

/* on_end's answer when the handler finishes the call later itself
 * (kvs__call_resume), e.g. after the ingest pool quantized a Put. */
#define KVS__PENDING 1

/*
 * Streaming handlers. The server drives the call; the handler keeps its
 * state in c->stream and frees it in cleanup, which runs exactly once when the
 * call is freed (whatever ended it: done, failure, client cancel, shutdown).
 *
 * Client streaming: on_msg gets each request message in order (borrowed) and
 * returns 0 to read on, or non-zero after kvs__call_fail to end the call. At
 * the end of the stream (the client half-closed) on_end returns 0 after
 * kvs__call_reply / kvs__call_fail, or KVS__PENDING. A client that cancels
 * mid-stream never reaches on_end: only cleanup runs.
 *
 * Server streaming: start gets the request (borrowed) and returns 0 to stream
 * or non-zero after kvs__call_fail. Then next is called once per message:
 * it returns 1 after kvs__call_stream_msg (one message to send), or 0 when the
 * stream is over (status OK unless it called kvs__call_fail). A client cancel
 * stops the calls to next; cleanup still runs.
 */
typedef struct kvs__stream_ops {
    int (*on_msg)(kvs__call *c, const ProtobufCMessage *msg);
    int (*on_end)(kvs__call *c);
    int (*start)(kvs__call *c, const ProtobufCMessage *req);
    int (*next)(kvs__call *c);
    void (*cleanup)(kvs__call *c);
} kvs__stream_ops;

typedef struct kvs__method {
    const char *path;  /* "/kvstash.v1.KvStash/Stats" */
    const char *name;  /* "Stats": the metrics label */
    kvs__rpc_kind kind;
    const ProtobufCMessageDescriptor *req_desc;
    kvs__unary_fn fn;        /* unary; NULL (and no stream): answered UNIMPLEMENTED */
    const char *not_yet;     /* for fn == NULL: what will provide it */
    const kvs__stream_ops *stream; /* streaming kinds */
    int no_auth;             /* 1: callable without a token (Health) */
    int quick;               /* 1: short and never blocks, so it is served by the
                              * polling worker itself (server.c); 0: by the others */
} kvs__method;

extern const kvs__method kvs__methods[];
extern const size_t kvs__n_methods;

/* One worker thread and the queue it serves (server.c). */
typedef struct kvs__worker {
    pthread_t thread;
    kvs_server *srv;
    grpc_completion_queue *cq;
} kvs__worker;

struct kvs_server {
    grpc_server *server;
    /* cq: the polling queue, served by the polling workers (threads / 4, at
     * least 1): the quick methods (Lookup, Health). cq_slow: the other
     * methods, a non-polling queue served by the remaining workers; NULL when
     * threads is 1 (everything on cq). */
    grpc_completion_queue *cq;
    grpc_completion_queue *cq_slow;
    kvs__worker *workers;
    atomic_int n_threads;      /* read by Stats while start still creates them */
    int n_fast, n_slow;        /* workers started on cq / on cq_slow */
    int port;
    void *handles[KVS_RPC_MAX_METHODS];

    pthread_rwlock_t cfg_lock; /* guards cfg, cfg_read and profiles */
    kvs_config cfg;
    kvs_config cfg_read; /* as the file, environment and flags said at start / last reload */
    unsigned long long reloads[2]; /* kvs_server_reload calls: [0] applied, [1] refused */
    /* The profiles cfg.model_rules names (profiles.h), loaded with it; NULL: none. */
    struct kvs_profiles *profiles;

    atomic_int shutting_down;
    atomic_long live_calls;    /* kvs__call objects allocated and not yet freed */
    atomic_long active_calls;  /* accepted calls whose final status is not yet sent */
    pthread_mutex_t mu;        /* guards shutdown_done */
    pthread_cond_t cv;
    int shutdown_done;
    char shutdown_tag;         /* its address is the shutdown notification tag */

    struct timespec started;   /* CLOCK_MONOTONIC */
    kvs_rpc_stats rpc;

    /* The data path. store and tenants live from start to stop; the store
     * has its own lock, the tenant table is immutable. ingest runs Put's
     * quantization (codec.h) off the gRPC threads. */
    struct kvs_store *store;
    kvs_tenants *tenants;
    struct kvs_pool *ingest;
    /* put_ends: the threads that end UCX puts (data_connect.c put_end_async),
     * from kvs__xfer_start to kvs__xfer_stop; put_end_bytes: staged bytes of
     * the puts handed to them and not yet ended. */
    struct kvs_pool *put_ends;
    atomic_uint_fast64_t put_end_bytes;
    uint64_t put_end_max; /* put_end_bytes may reach (set before UCX starts) */
    /* ingest_mu: the UCX data plane's threads submit to ingest while the
     * server stops (the pool stops before the data plane): they go through
     * ingest_submit (data_connect.c), and stop takes the pool out under
     * ingest_mu. */
    pthread_mutex_t ingest_mu;
    /* The UCX sessions Connect opened (data_connect.c ucx_sess), each until
     * its last reference: a Connect that closes one finds it here. */
    pthread_mutex_t ucx_sess_mu;
    struct ucx_sess *ucx_sessions;
    struct kvs_lease_reg *leases; /* who owns which Lookup lease (leases.h) */
    int64_t capacity_at_start;    /* the arena's size: capacity may not grow past it */
    kvs_data_stats data;

    /* Operator surfaces (ops.h): NULL when off. trace is thread-safe; the
     * Lookup and Put handlers record into it (trace_rec.h). */
    struct kvs_metrics_http *metrics;
    struct kvs_trace_rec *trace;

    /* The UCX data plane (data_connect.c): NULL when `ucx` is off or UCX
     * failed to start (then Connect answers UNIMPLEMENTED). Created after the
     * store, destroyed after gRPC has stopped and before the store closes. */
    struct kvs_xfer_server *xfer;
};

struct kvs__call {
    kvs_server *srv;
    size_t method;             /* index into kvs__methods; kvs__n_methods = unknown path */
    grpc_call *call;
    gpr_timespec deadline;
    grpc_metadata_array md;
    grpc_byte_buffer *payload; /* unary request, owned */
    grpc_call_details details; /* unknown-path slot only */
    void (*step)(kvs__call *c, int ok);

    grpc_status_code status;
    char message[KVS_ERR_LEN];
    grpc_byte_buffer *reply;   /* owned until the final batch completes */
    int cancelled;
    uint64_t t0_ns;

    const kvs_tenant *tenant;  /* authenticated caller (NULL before auth, or for Health) */
    /* Streaming (kvs__stream_ops). */
    void *stream;              /* handler state, freed by ops->cleanup */
    grpc_byte_buffer *recv;    /* client streaming: the message being received */
    grpc_byte_buffer *out;     /* server streaming: the message being sent */
    int md_sent;               /* initial metadata already sent */
};

/* Server streaming: packs msg as the next message to send (for ops->next).
 * On failure the call is failed (INTERNAL) and 0 is returned; 1 on success. */
int kvs__call_stream_msg(kvs__call *c, const ProtobufCMessage *msg);

/* Finishes a call whose on_end returned KVS__PENDING, from any thread, after
 * kvs__call_reply or kvs__call_fail. */
void kvs__call_resume(kvs__call *c);

/* Has the call's deadline passed? */
int kvs__call_expired(const kvs__call *c);

/* Checks the store-facing settings of cfg (policy, capacity, watermarks) and,
 * unless dry_run, applies those that differ from s->cfg to the live store;
 * called with cfg_lock held for writing, before s->cfg is replaced. When
 * cfg->model_rules differs from s->cfg's, or reread_profiles is set (the
 * SetConfig named model_rules, even with the same text), it loads the
 * profiles the rules name first (KVS_EINVAL when one fails) and, unless
 * dry_run, replaces s->profiles once everything else was applied. 0 or a
 * KVS_E* code with err naming the setting. */
int kvs__server_apply_store(kvs_server *s, const kvs_config *cfg, int reread_profiles, int dry_run,
                            char *err);

/* SetConfig's and the reload's last step, with cfg_lock held for writing:
 * kvs__server_apply_store(next), then unless dry_run s->cfg = *next, applied
 * to the process (kvs_config_apply), and each of the n rows in defs logged
 * with its new value and `source`. 0 or the KVS_E* status with err. */
int kvs__server_config_commit(kvs_server *s, const kvs_config *next,
                              const kvs_config_def *const *defs, size_t n, int reread_profiles,
                              int dry_run, const char *source, char *err);

/* The unary and streaming data handlers (data_*.c). */
void kvs__do_lookup(kvs__call *c, const ProtobufCMessage *req);
void kvs__do_delete(kvs__call *c, const ProtobufCMessage *req);
void kvs__do_pin(kvs__call *c, const ProtobufCMessage *req);
void kvs__do_unpin(kvs__call *c, const ProtobufCMessage *req);
extern const kvs__stream_ops kvs__put_ops;
extern const kvs__stream_ops kvs__get_ops;

/* The UCX data plane (data_connect.c). start never fails the server: it logs
 * why UCX is off and leaves s->xfer NULL. stop is a no-op when it is NULL. */
void kvs__xfer_start(kvs_server *s);
void kvs__xfer_stop(kvs_server *s);
int kvs__xfer_collect(kvs_server *s, kvs_metric_set *set);
void kvs__do_connect(kvs__call *c, const ProtobufCMessage *req);

/* Store figures for Stats (data_common.c). */
int kvs__store_collect(kvs_server *s, kvs_metric_set *set);

/* Packs msg as the reply; status OK. On allocation failure the call ends INTERNAL. */
void kvs__call_reply(kvs__call *c, const ProtobufCMessage *msg);

/* Ends the call with code and a message naming the cause (printf format). */
void kvs__call_fail(kvs__call *c, grpc_status_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Maps a KVS_E* status to the gRPC code a client should see. */
grpc_status_code kvs__grpc_from_status(int kvs_status);

/* Every module's figures into set (handlers.c): what Stats replies and what
 * GET /metrics renders (ops.c), so both carry the same figures. Thread-safe. */
int kvs__server_collect(kvs_server *s, kvs_metric_set *set);

/* Seconds since kvs_server_start. */
double kvs__server_uptime(const kvs_server *s);

uint64_t kvs__now_ns(void);

#endif /* KVS_SERVER_INTERNAL_H */
