/*
 * server.c — the gRPC C-core machinery of kvstashd (see server.h).
 *
 * Threads: the polling workers (one per 4 threads, at least one) loop on the
 * polling NEXT completion queue `cq` and serve the quick methods (Lookup,
 * Health: short, never blocking) start to end; the other workers loop on
 * `cq_slow`, a non-polling queue that every other method's calls are bound
 * to (Put, Get, config, Stats, ...). Only the polling workers ever poll the
 * sockets, so at the default of 4 threads a Lookup is read, handled and
 * answered on one thread: with several threads on one polling queue, gRPC's
 * epoll poller hands the polling role to another waiting thread on every
 * wake-up, which on 2 cores cost about two context switches per Lookup
 * (docs/BENCHMARKS.md). A call's completions go to the queue its slot was
 * requested on. With threads = 1 there is no cq_slow: one thread serves
 * everything.
 * Completions of one call are serialised by its state machine (one batch in
 * flight). For every registered method the server keeps calls_per_method
 * requests outstanding; each accepted call re-arms its slot before it is
 * handled (LIBRARIES.md §1), so a slow handler never stops new calls from
 * being accepted.
 *
 * Invariants:
 *  - every kvs__call is freed exactly once, by the step that sees its final
 *    completion; live_calls counts them so stop can prove nothing leaked;
 *  - no slot is re-armed once shutting_down is set;
 *  - the queue is shut down only after the server's shutdown tag arrived.
 */
#include "server.h"

#include "codec.h"
#include "kvs_log.h"
#include "kvs_tsan.h"
#include "leases.h"
#include "ops.h"
#include "pool.h"
#include "profiles.h"
#include "server_internal.h"
#include "store.h"

#include <errno.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MOD "server"

/* ThreadSanitizer cannot see the synchronisation inside libgrpc (built
 * without it): a call's state written before a batch starts is read by
 * whichever worker takes the completion. These annotations state that
 * happens-before edge — the one gRPC guarantees — so TSan reports only races
 * of our own (TSAN_ACQUIRE/TSAN_RELEASE, kvs_tsan.h; no-ops in other builds). */

#define KVS_VERSION_STRING "kvstash 0.1.0"

const char *kvs_server_version(void) { return KVS_VERSION_STRING; }

uint64_t kvs__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

double kvs__server_uptime(const kvs_server *s)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - s->started.tv_sec) +
           (double)(now.tv_nsec - s->started.tv_nsec) / 1e9;
}

grpc_status_code kvs__grpc_from_status(int st)
{
    switch (st) {
    case KVS_OK:
        return GRPC_STATUS_OK;
    case KVS_EINVAL:
    case KVS_EFORMAT:
        return GRPC_STATUS_INVALID_ARGUMENT;
    case KVS_ENOTFOUND:
        return GRPC_STATUS_NOT_FOUND;
    case KVS_EEXIST:
        return GRPC_STATUS_ALREADY_EXISTS;
    case KVS_ETIMEDOUT:
        return GRPC_STATUS_DEADLINE_EXCEEDED;
    case KVS_EUNAVAIL:
        return GRPC_STATUS_UNAVAILABLE;
    case KVS_EUNAUTH:
        return GRPC_STATUS_UNAUTHENTICATED;
    case KVS_EPERM:
        return GRPC_STATUS_PERMISSION_DENIED;
    case KVS_ENOSPC:
    case KVS_ENOMEM:
        return GRPC_STATUS_RESOURCE_EXHAUSTED;
    case KVS_EPRECOND:
        return GRPC_STATUS_FAILED_PRECONDITION;
    case KVS_EUNIMPL:
        return GRPC_STATUS_UNIMPLEMENTED;
    case KVS_ECANCELED:
        return GRPC_STATUS_CANCELLED;
    default:
        return GRPC_STATUS_INTERNAL;
    }
}

/* ---- calls ---------------------------------------------------------------- */

static void on_new_call(kvs__call *c, int ok);
static void on_finished(kvs__call *c, int ok);
static void finish(kvs__call *c);

static kvs__call *call_new(kvs_server *s, size_t method)
{
    kvs__call *c = calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    c->srv = s;
    c->method = method;
    c->status = GRPC_STATUS_OK;
    grpc_metadata_array_init(&c->md);
    if (method == kvs__n_methods)
        grpc_call_details_init(&c->details);
    atomic_fetch_add(&s->live_calls, 1);
    return c;
}

static void call_free(kvs__call *c)
{
    if (c->stream && c->method < kvs__n_methods && kvs__methods[c->method].stream &&
        kvs__methods[c->method].stream->cleanup)
        kvs__methods[c->method].stream->cleanup(c);
    if (c->recv)
        grpc_byte_buffer_destroy(c->recv);
    if (c->out)
        grpc_byte_buffer_destroy(c->out);
    if (c->payload)
        grpc_byte_buffer_destroy(c->payload);
    if (c->reply)
        grpc_byte_buffer_destroy(c->reply);
    grpc_metadata_array_destroy(&c->md);
    if (c->method == kvs__n_methods)
        grpc_call_details_destroy(&c->details);
    if (c->call)
        grpc_call_unref(c->call);
    atomic_fetch_sub(&c->srv->live_calls, 1);
    free(c);
}

/* The queue a call of method is bound to (see the top of the file). */
static grpc_completion_queue *method_cq(const kvs_server *s, size_t method)
{
    if (s->cq_slow == NULL || (method < kvs__n_methods && kvs__methods[method].quick))
        return s->cq;
    return s->cq_slow;
}

/* Posts a request for the next call of `method` (or of any unknown path when
 * method == kvs__n_methods). */
static int arm(kvs_server *s, size_t method)
{
    if (atomic_load(&s->shutting_down))
        return 0;
    kvs__call *c = call_new(s, method);
    if (c == NULL) {
        KVS_LOG_ERROR(MOD, "out of memory arming a call slot");
        return KVS_ENOMEM;
    }
    c->step = on_new_call;
    grpc_call_error e;
    TSAN_RELEASE(c);
    grpc_completion_queue *cq = method_cq(s, method);
    if (method == kvs__n_methods) {
        e = grpc_server_request_call(s->server, &c->call, &c->details, &c->md, cq, cq, c);
    } else {
        int unary_payload = kvs__methods[method].kind != KVS__CLIENT_STREAM;
        e = grpc_server_request_registered_call(s->server, s->handles[method], &c->call,
                                                &c->deadline, &c->md,
                                                unary_payload ? &c->payload : NULL, cq, cq, c);
    }
    if (e != GRPC_CALL_OK) {
        KVS_LOG_ERROR(MOD, "request_call failed: %d", (int)e);
        call_free(c);
        return KVS_EINTERNAL;
    }
    return 0;
}

void kvs__call_fail(kvs__call *c, grpc_status_code code, const char *fmt, ...)
{
    c->status = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->message, sizeof c->message, fmt, ap);
    va_end(ap);
    if (c->reply) {
        grpc_byte_buffer_destroy(c->reply);
        c->reply = NULL;
    }
}

void kvs__call_reply(kvs__call *c, const ProtobufCMessage *msg)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    grpc_slice slice = grpc_slice_malloc(len);
    size_t packed = protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(slice));
    if (packed != len) {
        grpc_slice_unref(slice);
        kvs__call_fail(c, GRPC_STATUS_INTERNAL, "reply packing failed");
        return;
    }
    if (c->reply)
        grpc_byte_buffer_destroy(c->reply);
    c->reply = grpc_raw_byte_buffer_create(&slice, 1);
    grpc_slice_unref(slice);
    c->status = GRPC_STATUS_OK;
    c->message[0] = '\0';
}

/* Sends the reply (if any) and the status in one batch; on_finished frees. */
static void finish(kvs__call *c)
{
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (!c->md_sent) {
        ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
        n++;
        c->md_sent = 1;
    }
    if (c->status == GRPC_STATUS_OK && c->reply) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = c->reply;
        n++;
    }
    grpc_slice details = grpc_slice_from_copied_string(c->message);
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = c->status;
    ops[n].data.send_status_from_server.status_details = c->message[0] ? &details : NULL;
    n++;
    ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[n].data.recv_close_on_server.cancelled = &c->cancelled;
    n++;
    c->step = on_finished;
    grpc_call *call = c->call; /* read before the release: the completion may free c */
    TSAN_RELEASE(c);
    grpc_call_error e = grpc_call_start_batch(call, ops, n, c, NULL);
    grpc_slice_unref(details);
    if (e != GRPC_CALL_OK) {
        KVS_LOG_ERROR(MOD, "start_batch failed: %d", (int)e);
        on_finished(c, 0);
    }
}

int kvs__call_expired(const kvs__call *c)
{
    gpr_timespec now = gpr_now(c->deadline.clock_type);
    return gpr_time_cmp(c->deadline, now) <= 0;
}

void kvs__call_resume(kvs__call *c) { finish(c); }

int kvs__call_stream_msg(kvs__call *c, const ProtobufCMessage *msg)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    grpc_slice slice = grpc_slice_malloc(len);
    if (protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(slice)) != len) {
        grpc_slice_unref(slice);
        kvs__call_fail(c, GRPC_STATUS_INTERNAL, "stream message packing failed");
        return 0;
    }
    if (c->out)
        grpc_byte_buffer_destroy(c->out);
    c->out = grpc_raw_byte_buffer_create(&slice, 1);
    grpc_slice_unref(slice);
    return 1;
}

/* Unpacks one request message of method m; NULL (call failed) when it does not parse. */
static ProtobufCMessage *unpack(kvs__call *c, const kvs__method *m, grpc_byte_buffer *bb)
{
    grpc_byte_buffer_reader reader;
    if (!grpc_byte_buffer_reader_init(&reader, bb)) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "%s: unreadable request", m->name);
        return NULL;
    }
    grpc_slice all = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
    size_t len = GRPC_SLICE_LENGTH(all);
    ProtobufCMessage *req =
        protobuf_c_message_unpack(m->req_desc, NULL, len, GRPC_SLICE_START_PTR(all));
    grpc_slice_unref(all);
    if (req == NULL)
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT,
                       "%s: malformed %s message (%zu bytes do not parse)", m->name,
                       m->req_desc->name, len);
    return req;
}

/* Reads the unary request and runs the handler. */
static void dispatch(kvs__call *c)
{
    const kvs__method *m = &kvs__methods[c->method];
    if (m->fn == NULL) {
        kvs__call_fail(c, GRPC_STATUS_UNIMPLEMENTED, "%s is not implemented yet (%s)", m->path,
                       m->not_yet);
        return;
    }
    if (kvs__call_expired(c)) {
        kvs__call_fail(c, GRPC_STATUS_DEADLINE_EXCEEDED,
                       "deadline passed before %s was handled", m->name);
        return;
    }
    if (c->payload == NULL) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "%s: request message missing", m->name);
        return;
    }
    ProtobufCMessage *req = unpack(c, m, c->payload);
    if (req == NULL)
        return;
    m->fn(c, req);
    protobuf_c_message_free_unpacked(req, NULL);
}

/* ---- client streaming: one RECV_MESSAGE batch at a time ------------------- */

static void on_recv(kvs__call *c, int ok);

static void recv_next(kvs__call *c)
{
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->recv;
    c->step = on_recv;
    grpc_call *call = c->call;
    TSAN_RELEASE(c);
    grpc_call_error e = grpc_call_start_batch(call, &op, 1, c, NULL);
    if (e != GRPC_CALL_OK) {
        kvs__call_fail(c, GRPC_STATUS_INTERNAL, "start_batch failed: %d", (int)e);
        finish(c);
    }
}

static void on_recv(kvs__call *c, int ok)
{
    const kvs__method *m = &kvs__methods[c->method];
    grpc_byte_buffer *bb = c->recv;
    c->recv = NULL;
    if (!ok) { /* cancelled by the client, or the server is going down */
        if (bb)
            grpc_byte_buffer_destroy(bb);
        kvs__call_fail(c, GRPC_STATUS_CANCELLED, "%s: stream cancelled", m->name);
        finish(c);
        return;
    }
    if (bb == NULL) { /* the client half-closed: the request is complete */
        if (m->stream->on_end(c) == KVS__PENDING)
            return;
        finish(c);
        return;
    }
    if (kvs__call_expired(c)) {
        grpc_byte_buffer_destroy(bb);
        kvs__call_fail(c, GRPC_STATUS_DEADLINE_EXCEEDED, "%s: deadline passed mid-stream",
                       m->name);
        finish(c);
        return;
    }
    ProtobufCMessage *msg = unpack(c, m, bb);
    grpc_byte_buffer_destroy(bb);
    int rc = msg ? m->stream->on_msg(c, msg) : -1;
    if (msg)
        protobuf_c_message_free_unpacked(msg, NULL);
    if (rc != 0)
        finish(c);
    else
        recv_next(c);
}

/* ---- server streaming: one SEND_MESSAGE batch at a time ------------------- */

static void on_sent(kvs__call *c, int ok);

static void send_next(kvs__call *c)
{
    const kvs__method *m = &kvs__methods[c->method];
    if (kvs__call_expired(c)) {
        kvs__call_fail(c, GRPC_STATUS_DEADLINE_EXCEEDED, "%s: deadline passed mid-stream",
                       m->name);
        finish(c);
        return;
    }
    if (!m->stream->next(c) || c->out == NULL) {
        finish(c);
        return;
    }
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (!c->md_sent) {
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        c->md_sent = 1;
    }
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = c->out;
    n++;
    c->step = on_sent;
    grpc_call *call = c->call; /* read before the release: the completion may free c */
    TSAN_RELEASE(c);
    grpc_call_error e = grpc_call_start_batch(call, ops, n, c, NULL);
    if (e != GRPC_CALL_OK) {
        kvs__call_fail(c, GRPC_STATUS_INTERNAL, "start_batch failed: %d", (int)e);
        finish(c);
    }
}

static void on_sent(kvs__call *c, int ok)
{
    if (c->out) {
        grpc_byte_buffer_destroy(c->out);
        c->out = NULL;
    }
    if (!ok) {
        kvs__call_fail(c, GRPC_STATUS_CANCELLED, "%s: the client went away mid-stream",
                       kvs__methods[c->method].name);
        finish(c);
        return;
    }
    send_next(c);
}

static void start_server_stream(kvs__call *c)
{
    const kvs__method *m = &kvs__methods[c->method];
    if (kvs__call_expired(c)) {
        kvs__call_fail(c, GRPC_STATUS_DEADLINE_EXCEEDED,
                       "deadline passed before %s was handled", m->name);
        finish(c);
        return;
    }
    if (c->payload == NULL) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "%s: request message missing", m->name);
        finish(c);
        return;
    }
    ProtobufCMessage *req = unpack(c, m, c->payload);
    int rc = req ? m->stream->start(c, req) : -1;
    if (req)
        protobuf_c_message_free_unpacked(req, NULL);
    if (rc != 0)
        finish(c);
    else
        send_next(c);
}

/* Bearer token -> tenant (tenants.h). 1 ok; 0 with the call failed. */
static int authenticate(kvs__call *c)
{
    const char *v = NULL;
    size_t len = 0;
    for (size_t i = 0; i < c->md.count; i++) {
        if (grpc_slice_str_cmp(c->md.metadata[i].key, "authorization") == 0) {
            v = (const char *)GRPC_SLICE_START_PTR(c->md.metadata[i].value);
            len = GRPC_SLICE_LENGTH(c->md.metadata[i].value);
            break;
        }
    }
    char err[KVS_ERR_LEN];
    if (kvs_tenants_authenticate(c->srv->tenants, v, len, &c->tenant, err) != 0) {
        kvs__call_fail(c, GRPC_STATUS_UNAUTHENTICATED, "%s", err);
        return 0;
    }
    return 1;
}

static void on_new_call(kvs__call *c, int ok)
{
    kvs_server *s = c->srv;
    if (!ok) { /* the server is shutting down; this slot never got a call */
        call_free(c);
        return;
    }
    arm(s, c->method);
    atomic_fetch_add(&s->active_calls, 1);
    c->t0_ns = kvs__now_ns();
    if (c->method == kvs__n_methods) {
        char *path = grpc_slice_to_c_string(c->details.method);
        KVS_LOG_DEBUG(MOD, "unknown method %s", path);
        kvs__call_fail(c, GRPC_STATUS_UNIMPLEMENTED, "unknown method %s", path);
        gpr_free(path);
        finish(c);
        return;
    }
    const kvs__method *m = &kvs__methods[c->method];
    atomic_fetch_add_explicit(&s->rpc.calls[c->method], 1, memory_order_relaxed);
    if (!m->no_auth && !authenticate(c)) {
        finish(c);
        return;
    }
    if (m->kind == KVS__CLIENT_STREAM && m->stream) {
        if (kvs__call_expired(c)) {
            kvs__call_fail(c, GRPC_STATUS_DEADLINE_EXCEEDED,
                           "deadline passed before %s was handled", m->name);
            finish(c);
        } else {
            recv_next(c);
        }
        return;
    }
    if (m->kind == KVS__SERVER_STREAM && m->stream) {
        start_server_stream(c);
        return;
    }
    if (m->kind != KVS__UNARY && m->fn == NULL)
        kvs__call_fail(c, GRPC_STATUS_UNIMPLEMENTED, "%s is not implemented yet (%s)", m->path,
                       m->not_yet ? m->not_yet : "no handler");
    else
        dispatch(c);
    finish(c);
}

static void on_finished(kvs__call *c, int ok)
{
    kvs_server *s = c->srv;
    uint64_t ns = kvs__now_ns() - c->t0_ns;
    int status = c->status;
    if (c->cancelled && status == GRPC_STATUS_OK)
        status = GRPC_STATUS_CANCELLED;
    if (c->method < kvs__n_methods) {
        kvs_rpc_stats_record(&s->rpc, c->method, status, ns);
        if (status != GRPC_STATUS_OK)
            KVS_LOG_DEBUG(MOD, "%s -> %s: %s", kvs__methods[c->method].name,
                          kvs_grpc_status_name(status), c->message);
    } else {
        atomic_fetch_add_explicit(&s->rpc.calls[kvs__n_methods], 1, memory_order_relaxed);
        kvs_rpc_stats_record(&s->rpc, kvs__n_methods, status, ns);
    }
    (void)ok;
    atomic_fetch_sub(&s->active_calls, 1);
    call_free(c);
}

/* ---- threads and lifecycle ------------------------------------------------ */

static void *worker_main(void *arg)
{
    kvs__worker *w = arg;
    kvs_server *s = w->srv;
    for (;;) {
        grpc_event ev =
            grpc_completion_queue_next(w->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        if (ev.tag == &s->shutdown_tag) {
            pthread_mutex_lock(&s->mu);
            s->shutdown_done = 1;
            pthread_cond_broadcast(&s->cv);
            pthread_mutex_unlock(&s->mu);
            continue;
        }
        kvs__call *c = ev.tag;
        TSAN_ACQUIRE(c);
        c->step(c, ev.success);
    }
    return NULL;
}

static int write_port_file(const char *path, int port, char *err)
{
    char tmp[KVS_CONFIG_STR_MAX + 16];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (f == NULL || fprintf(f, "%d\n", port) < 0 || fclose(f) != 0) {
        snprintf(err, KVS_ERR_LEN, "port_file %.160s: %s", path, strerror(errno));
        return KVS_EIO;
    }
    if (rename(tmp, path) != 0) {
        snprintf(err, KVS_ERR_LEN, "port_file %.160s: %s", path, strerror(errno));
        unlink(tmp);
        return KVS_EIO;
    }
    return 0;
}

static void destroy(kvs_server *s)
{
    kvs__ops_stop(s); /* no-op when already stopped (kvs_server_stop) */
    if (s->server)
        grpc_server_destroy(s->server);
    if (s->cq)
        grpc_completion_queue_destroy(s->cq);
    if (s->cq_slow)
        grpc_completion_queue_destroy(s->cq_slow);
    kvs__xfer_stop(s); /* releases every block it lent, before the store goes */
    kvs_pool_stop(s->ingest);
    if (s->store)
        kvs_store_close(s->store);
    kvs_lease_reg_close(s->leases);
    kvs_tenants_free(s->tenants);
    kvs_profiles_free(s->profiles);
    pthread_rwlock_destroy(&s->cfg_lock);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->ingest_mu);
    pthread_mutex_destroy(&s->ucx_sess_mu);
    pthread_cond_destroy(&s->cv);
    free(s->workers);
    free(s);
    /* Blocking: the process exits right after, and OpenSSL's exit-time
     * cleanup must not run under a gRPC thread still shutting down (libkvstash
     * saw exactly that crash, clients/c/client.c). */
    grpc_shutdown_blocking();
}

static int apply_store(kvs_server *s, const kvs_config *cfg, char *err);

int kvs__server_apply_store(kvs_server *s, const kvs_config *cfg, int reread_profiles, int dry_run,
                            char *err)
{
    const kvs_config *old = &s->cfg;
    if (cfg->low_watermark_pct > cfg->high_watermark_pct) {
        snprintf(err, KVS_ERR_LEN, "low_watermark_pct %lld is above high_watermark_pct %lld",
                 (long long)cfg->low_watermark_pct, (long long)cfg->high_watermark_pct);
        return KVS_EINVAL;
    }
    if (cfg->capacity > s->capacity_at_start) {
        snprintf(err, KVS_ERR_LEN,
                 "capacity: %lld bytes is above %lld, the capacity the server started with (the "
                 "arena is sized at start; restart to grow it)",
                 (long long)cfg->capacity, (long long)s->capacity_at_start);
        return KVS_EINVAL;
    }
    if (kvs_tenants_apply_rules(s->tenants, cfg->tenant_rules, NULL, err) != 0)
        return KVS_EINVAL; /* tenant_rules naming an unknown tenant (tenants.h) */
    /* New model rules, or model_rules set again: their profiles are read
     * again (a file may have changed or gone since kvs_config_set checked it,
     * or been recalibrated since it was loaded) before anything is applied. */
    kvs_profiles *np = NULL;
    int new_rules = reread_profiles || strcmp(cfg->model_rules, old->model_rules) != 0;
    char why[KVS_ERR_LEN];
    int rc = new_rules ? kvs_profiles_load(cfg->model_rules, &np, why) : 0;
    if (rc != 0) {
        snprintf(err, KVS_ERR_LEN, "model_rules: %.*s", KVS_ERR_LEN - 16, why);
        return KVS_EINVAL;
    }
    if (dry_run) {
        kvs_profiles_free(np);
        return 0;
    }
    rc = apply_store(s, cfg, err);
    if (rc != 0) {
        kvs_profiles_free(np);
        return rc;
    }
    if (new_rules) {
        kvs_profiles_free(s->profiles);
        s->profiles = np;
    }
    return 0;
}

int kvs__server_config_commit(kvs_server *s, const kvs_config *next,
                              const kvs_config_def *const *defs, size_t n, int reread_profiles,
                              int dry_run, const char *source, char *err)
{
    int rc = kvs__server_apply_store(s, next, reread_profiles, dry_run, err);
    if (rc != 0 || dry_run)
        return rc;
    s->cfg = *next;
    kvs_config_apply(&s->cfg);
    for (size_t i = 0; i < n; i++) {
        char v[KVS_CONFIG_STR_MAX];
        kvs_config_format(&s->cfg, defs[i], v, sizeof v);
        KVS_LOG_INFO(MOD, "config %s = %s (%s)", kvs_config_def_name(defs[i]), v, source);
    }
    return 0;
}

/* Logs what a reload read but cannot apply: the restart-only settings the
 * sources changed (restart[0..nr), last in table order first; their new
 * values in now) and changed tenant identities (t: the tenants the file
 * declares now). */
static void reload_restart_only(const kvs_server *s, const kvs_config *now,
                                const kvs_config_def *const *restart, size_t nr,
                                const kvs_tenants *t)
{
    for (size_t i = nr; i-- > 0;) {
        char is[KVS_CONFIG_STR_MAX];
        kvs_config_format(now, restart[i], is, sizeof is);
        KVS_LOG_WARN(MOD,
                     "reload: %s is now %s in the configuration; it takes effect at the next "
                     "restart",
                     kvs_config_def_name(restart[i]), is);
    }
    if (!kvs_tenants_same_identity(t, s->tenants))
        KVS_LOG_WARN(MOD, "reload: the [tenant.*] tokens, secrets, models, admin or ucx flags "
                          "changed; they take effect at the next restart");
}

int kvs_server_reload(kvs_server *s, int argc, char **argv, char *const *envp, char *err)
{
    /* changed[0..nc): runtime settings to apply; changed[n - nr..n): restart-only ones */
    size_t n = kvs_config_count(), nc = 0, nr = 0;
    const kvs_config_def **changed = calloc(n, sizeof *changed);
    kvs_config *next = malloc(sizeof *next), *now = malloc(sizeof *now);
    kvs_config_action action;
    kvs_tenants *tenants = NULL;
    int rc = changed && next && now ? 0 : kvs_fail(err, KVS_ENOMEM, "reload: out of memory");
    if (rc == 0)
        rc = kvs_config_from_args(now, argc, argv, envp, &action, err);
    /* The [tenant.*] sections as the next start would read them: a file that
     * start refuses (a bad key, a missing token) is refused here too. */
    if (rc == 0)
        rc = kvs_tenants_load(now->config_file, &tenants, err);
    pthread_rwlock_wrlock(&s->cfg_lock);
    if (rc == 0)
        *next = s->cfg;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const kvs_config_def *d = kvs_config_at(i);
        char was[KVS_CONFIG_STR_MAX], is[KVS_CONFIG_STR_MAX], why[KVS_ERR_LEN];
        kvs_config_format(&s->cfg_read, d, was, sizeof was);
        kvs_config_format(now, d, is, sizeof is);
        if (strcmp(was, is) == 0)
            continue;
        if (!kvs_config_def_runtime(d)) {
            changed[n - ++nr] = d;
            continue;
        }
        if ((rc = kvs_config_set(next, d, is, why)) != 0)
            kvs_fail(err, rc, "%s: %s", kvs_config_def_name(d), why);
        changed[nc++] = d;
    }
    if (rc == 0)
        rc = kvs__server_config_commit(s, next, changed, nc, 1, 0, "reload", err);
    if (rc == 0) {
        reload_restart_only(s, now, changed + n - nr, nr, tenants);
        s->cfg_read = *now;
    }
    s->reloads[rc != 0]++;
    pthread_rwlock_unlock(&s->cfg_lock);
    kvs_tenants_free(tenants);
    free(changed);
    free(next);
    free(now);
    return rc;
}

/* The store-facing part of kvs__server_apply_store (not a dry run). All or
 * nothing: when a step fails, the steps before it are undone, so the store
 * keeps running with what s->cfg says (a capacity the store refused keeps
 * its new bound, store.h: it is put back too). Evictions a refused lowering
 * of the capacity made cannot be undone. */
static int apply_store(kvs_server *s, const kvs_config *cfg, char *err)
{
    const kvs_config *old = &s->cfg;
    if (s->store == NULL)
        return 0;
    int rc = 0, policy = 0, marks = 0, capacity = 0, quotas = 0;
    if (cfg->policy != old->policy) {
        rc = kvs_store_set_policy(s->store, kvs_config_policy_name(cfg->policy));
        if (rc != 0) {
            snprintf(err, KVS_ERR_LEN, "policy: the store refused '%s': %s",
                     kvs_config_policy_name(cfg->policy), kvs_strerror(rc));
            goto undo;
        }
        policy = 1;
    }
    if (cfg->high_watermark_pct != old->high_watermark_pct ||
        cfg->low_watermark_pct != old->low_watermark_pct) {
        rc = kvs_store_set_watermarks(s->store, (double)cfg->high_watermark_pct / 100.0,
                                      (double)cfg->low_watermark_pct / 100.0);
        if (rc != 0) {
            snprintf(err, KVS_ERR_LEN, "high/low_watermark_pct: the store refused them: %s",
                     kvs_strerror(rc));
            goto undo;
        }
        marks = 1;
    }
    if (cfg->capacity != old->capacity) {
        capacity = 1; /* even refused, the store has taken the new bound */
        rc = kvs_store_set_capacity_bytes(s->store, (uint64_t)cfg->capacity);
        if (rc != 0) {
            snprintf(err, KVS_ERR_LEN, "capacity: the store refused %lld bytes: %s",
                     (long long)cfg->capacity, kvs_strerror(rc));
            goto undo;
        }
    }
    if (strcmp(cfg->tenant_rules, old->tenant_rules) != 0) { /* the tenants' quotas */
        quotas = 1;
        rc = kvs_tenants_apply_rules(s->tenants, cfg->tenant_rules, s->store, err);
        if (rc != 0)
            goto undo;
    }
    return 0;
undo:
    if (quotas)
        (void)kvs_tenants_apply_rules(s->tenants, old->tenant_rules, s->store, NULL);
    if (capacity)
        (void)kvs_store_set_capacity_bytes(s->store, (uint64_t)old->capacity);
    if (marks)
        (void)kvs_store_set_watermarks(s->store, (double)old->high_watermark_pct / 100.0,
                                       (double)old->low_watermark_pct / 100.0);
    if (policy)
        (void)kvs_store_set_policy(s->store, kvs_config_policy_name(old->policy));
    return rc;
}
/* ssd_dir must be a directory kvstashd's user can write and search: it is
 * not created (the service unit makes it, StateDirectory). 0, or KVS_EINVAL
 * with the reason in err, instead of the store's bare status. */
static int ssd_dir_usable(const char *dir, char *err)
{
    struct stat st;
    if (stat(dir, &st) != 0) {
        snprintf(err, KVS_ERR_LEN, "ssd_dir %.160s: %s (kvstashd does not create it)", dir,
                 strerror(errno));
        return KVS_EINVAL;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(err, KVS_ERR_LEN, "ssd_dir %.160s: not a directory", dir);
        return KVS_EINVAL;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        snprintf(err, KVS_ERR_LEN, "ssd_dir %.160s: not writable by kvstashd's user: %s", dir,
                 strerror(errno));
        return KVS_EINVAL;
    }
    return 0;
}

/* Tenants (from the config file), the block store with their quotas, and the
 * ingest pool. On failure err says which; destroy() frees what was made. */
static int open_data_path(kvs_server *s, char *err)
{
    const kvs_config *cfg = &s->cfg;
    s->capacity_at_start = cfg->capacity;
    int rc = kvs_tenants_load(cfg->config_file, &s->tenants, err);
    if (rc != 0)
        return rc;
    kvs_tenants_log_plain(s->tenants); /* once: not on reload */
    if ((rc = kvs_profiles_load(cfg->model_rules, &s->profiles, err)) != 0)
        return rc;
    if (cfg->low_watermark_pct > cfg->high_watermark_pct) {
        snprintf(err, KVS_ERR_LEN, "low_watermark_pct %lld is above high_watermark_pct %lld",
                 (long long)cfg->low_watermark_pct, (long long)cfg->high_watermark_pct);
        return KVS_EINVAL;
    }
    if (cfg->ssd_dir[0] && (rc = ssd_dir_usable(cfg->ssd_dir, err)) != 0)
        return rc;
    kvs_store_opts so;
    memset(&so, 0, sizeof so);
    so.policy = kvs_config_policy_name(cfg->policy);
    so.verify_chain = 1;
    kvs_store_payload_opts po;
    memset(&po, 0, sizeof po);
    po.capacity_bytes = (uint64_t)cfg->capacity;
    po.high_watermark = (double)cfg->high_watermark_pct / 100.0;
    po.low_watermark = (double)cfg->low_watermark_pct / 100.0;
    po.ssd_dir = cfg->ssd_dir[0] ? cfg->ssd_dir : NULL;
    po.ssd_capacity_bytes = (uint64_t)cfg->ssd_capacity;
    /* The isolated UCX data plane maps the memory tier read-only. */
    po.shareable = cfg->ucx && cfg->ucx_isolate;
    rc = kvs_store_open_ex(&so, &po, &s->store);
    if (rc != 0) {
        s->store = NULL;
        snprintf(err, KVS_ERR_LEN, "cannot open the block store: %s", kvs_strerror(rc));
        return rc;
    }
    if (cfg->prefault_memory) { /* an optimisation: a failure is logged, not fatal */
        uint64_t t0 = kvs__now_ns();
        int pr = kvs_store_prefault(s->store);
        if (pr == 0)
            KVS_LOG_INFO(MOD, "prefault_memory: %.2f GiB populated in %.2f s",
                         (double)cfg->capacity / (double)(1u << 30),
                         (double)(kvs__now_ns() - t0) / 1e9);
        else
            KVS_LOG_WARN(MOD, "prefault_memory: not done: %s", kvs_strerror(pr));
    }
    for (size_t i = 0; i < kvs_tenants_count(s->tenants); i++) {
        const kvs_tenant *t = kvs_tenants_at(s->tenants, i);
        if (t->quota_bytes && (rc = kvs_store_set_quota(s->store, t->id, t->quota_bytes)) != 0) {
            snprintf(err, KVS_ERR_LEN, "tenant %s: quota refused by the store: %s", t->name,
                     kvs_strerror(rc));
            return rc;
        }
    }
    if ((rc = kvs_lease_reg_open(&s->leases)) != 0) {
        snprintf(err, KVS_ERR_LEN, "out of memory");
        return rc;
    }
    kvs_codec_backend be;
    if ((rc = kvs_codec_backend_select((int)cfg->ingest_backend, &be, err)) != 0)
        return rc; /* ingest_backend = gpu without a device, or failing its self-check */
    if (kvs_codec_backend_note()[0])
        KVS_LOG_WARN(MOD, "%s", kvs_codec_backend_note());
    KVS_LOG_INFO(MOD, "quantize on ingest: %s", kvs_codec_backend_name(be));
    rc = kvs_pool_start((int)cfg->ingest_threads, &s->ingest);
    if (rc != 0) {
        snprintf(err, KVS_ERR_LEN, "cannot start %lld ingest threads",
                 (long long)cfg->ingest_threads);
        return rc;
    }
    if (!kvs_tenants_open_mode(s->tenants))
        KVS_LOG_INFO(MOD, "%zu tenants configured", kvs_tenants_count(s->tenants));
    return 0;
}

/* Waits for the shutdown tag until abs (CLOCK_REALTIME), or forever if NULL. */
static int wait_shutdown(kvs_server *s, const struct timespec *abs)
{
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    while (!s->shutdown_done && rc == 0)
        rc = abs ? pthread_cond_timedwait(&s->cv, &s->mu, abs) : pthread_cond_wait(&s->cv, &s->mu);
    int done = s->shutdown_done;
    pthread_mutex_unlock(&s->mu);
    return done;
}

int kvs_server_start(const kvs_config *cfg, kvs_server **out, char *err)
{
    char dummy[KVS_ERR_LEN];
    if (err == NULL)
        err = dummy;
    KVS_ASSERT(kvs__n_methods < KVS_RPC_MAX_METHODS);
    grpc_init();
    kvs_server *s = calloc(1, sizeof *s);
    if (s == NULL) {
        grpc_shutdown_blocking();
        snprintf(err, KVS_ERR_LEN, "out of memory");
        return KVS_ENOMEM;
    }
    s->cfg = *cfg;
    s->cfg_read = *cfg;
    pthread_rwlock_init(&s->cfg_lock, NULL);
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->ingest_mu, NULL);
    pthread_mutex_init(&s->ucx_sess_mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    clock_gettime(CLOCK_MONOTONIC, &s->started);
    kvs_config_apply(&s->cfg);
    int drc = open_data_path(s, err);
    if (drc != 0) {
        destroy(s);
        return drc;
    }
    kvs__xfer_start(s); /* UCX data plane; logs and stays off when UCX cannot start */

    grpc_arg args[4];
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = (int)cfg->max_message_bytes;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = (char *)GRPC_ARG_MAX_CONCURRENT_STREAMS;
    args[1].value.integer = (int)cfg->max_concurrent_streams;
    /* Without this a second kvstashd on the same port would silently share it. */
    args[2].type = GRPC_ARG_INTEGER;
    args[2].key = (char *)GRPC_ARG_ALLOW_REUSEPORT;
    args[2].value.integer = 0;
    args[3].type = GRPC_ARG_INTEGER;
    args[3].key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    args[3].value.integer = -1;
    grpc_channel_args chargs = {.num_args = 4, .args = args};

    s->cq = grpc_completion_queue_create_for_next(NULL);
    if (cfg->threads > 1) {
        grpc_completion_queue_attributes attr = {.version = 1,
                                                 .cq_completion_type = GRPC_CQ_NEXT,
                                                 .cq_polling_type = GRPC_CQ_NON_POLLING};
        s->cq_slow = grpc_completion_queue_create(
            grpc_completion_queue_factory_lookup(&attr), &attr, NULL);
    }
    s->server = grpc_server_create(&chargs, NULL);
    for (size_t i = 0; i < kvs__n_methods; i++) {
        const kvs__method *m = &kvs__methods[i];
        grpc_server_register_method_payload_handling ph =
            m->kind == KVS__CLIENT_STREAM ? GRPC_SRM_PAYLOAD_NONE
                                          : GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER;
        s->handles[i] = grpc_server_register_method(s->server, m->path, NULL, ph, 0);
        KVS_ASSERT(s->handles[i] != NULL);
    }
    grpc_server_register_completion_queue(s->server, s->cq, NULL);
    if (s->cq_slow)
        grpc_server_register_completion_queue(s->server, s->cq_slow, NULL);
    /* /metrics and the request trace (ops.c) start before any call is served
     * (handlers read s->trace, Stats reads s->metrics) and before the port is
     * bound (gRPC wants a bound server shut down, not just destroyed); on
     * failure kvs__ops_start has stopped what it started, and destroy() stops
     * the rest on the failure paths below. */
    int orc = kvs__ops_start(s, err);
    if (orc != 0) {
        destroy(s);
        return orc;
    }
    /* TLS when tls_cert/tls_key are set, else insecure (ops.c). */
    grpc_server_credentials *creds = kvs__ops_credentials(cfg, err);
    if (creds == NULL) {
        destroy(s);
        return KVS_EINVAL;
    }
    s->port = grpc_server_add_http2_port(s->server, cfg->listen, creds);
    grpc_server_credentials_release(creds);
    if (s->port <= 0) {
        snprintf(err, KVS_ERR_LEN, "cannot listen on %.160s (bad address, or port in use)",
                 cfg->listen);
        destroy(s);
        return KVS_EIO;
    }
    grpc_server_start(s->server);

    int rc = 0;
    for (size_t i = 0; i <= kvs__n_methods && rc == 0; i++)
        for (int64_t k = 0; k < cfg->calls_per_method && rc == 0; k++)
            rc = arm(s, i);
    s->workers = calloc((size_t)cfg->threads, sizeof *s->workers);
    if (rc != 0 || s->workers == NULL) {
        snprintf(err, KVS_ERR_LEN, "out of memory starting the server");
        rc = KVS_ENOMEM;
    }
    /* One polling worker per 4 threads (at least one): 1 at the default of 4,
     * so on a small machine no Lookup pays a poller hand-off, while a large
     * one given more threads also gets more threads reading sockets. */
    int64_t n_poll = cfg->threads / 4 > 1 ? cfg->threads / 4 : 1;
    for (int64_t i = 0; rc == 0 && i < cfg->threads; i++) {
        kvs__worker *w = &s->workers[s->n_threads];
        w->srv = s;
        w->cq = i < n_poll || s->cq_slow == NULL ? s->cq : s->cq_slow;
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            snprintf(err, KVS_ERR_LEN, "cannot start worker thread: %s", strerror(errno));
            rc = KVS_ENOMEM;
            break;
        }
        s->n_threads++;
        if (w->cq == s->cq)
            s->n_fast++;
        else
            s->n_slow++;
    }
    if (rc == 0 && cfg->port_file[0])
        rc = write_port_file(cfg->port_file, s->port, err);
    if (rc != 0) {
        kvs_server_stop(s);
        return rc;
    }

    char host[KVS_CONFIG_STR_MAX];
    snprintf(host, sizeof host, "%s", cfg->listen);
    char *colon = strrchr(host, ':');
    if (colon)
        *colon = '\0';
    KVS_LOG_INFO(MOD, "%s listening on %s:%d (%d worker threads)", KVS_VERSION_STRING, host,
                 s->port, s->n_threads);
    *out = s;
    return 0;
}

int kvs_server_port(const kvs_server *s) { return s->port; }

int kvs_server_stop(kvs_server *s)
{
    atomic_store(&s->shutting_down, 1);
    pthread_rwlock_rdlock(&s->cfg_lock);
    int64_t grace_ms = s->cfg.shutdown_grace_ms;
    pthread_rwlock_unlock(&s->cfg_lock);

    grpc_server_shutdown_and_notify(s->server, s->cq, &s->shutdown_tag);
    if (s->n_fast > 0 && (s->cq_slow == NULL || s->n_slow > 0)) {
        /* Give calls in flight the grace period. The shutdown tag itself may
         * wait for idle client connections too, so poll our own count of
         * active calls rather than waiting for the tag alone. */
        uint64_t give_up = kvs__now_ns() + (uint64_t)grace_ms * 1000000u;
        for (;;) {
            long active = atomic_load(&s->active_calls);
            if (active == 0)
                break;
            if (kvs__now_ns() >= give_up) {
                KVS_LOG_WARN(MOD, "%ld calls still running after %lld ms; cancelling them",
                             active, (long long)grace_ms);
                break;
            }
            struct timespec abs;
            clock_gettime(CLOCK_REALTIME, &abs);
            abs.tv_nsec += 5000000L; /* 5 ms */
            if (abs.tv_nsec >= 1000000000L) {
                abs.tv_sec++;
                abs.tv_nsec -= 1000000000L;
            }
            if (wait_shutdown(s, &abs))
                break;
        }
        grpc_server_cancel_all_calls(s->server);
        wait_shutdown(s, NULL);
    } else {
        /* Start failed before a queue had its worker: serve the unserved
         * queue(s) here until the shutdown tag (on cq) is seen. */
        grpc_server_cancel_all_calls(s->server);
        for (int done = 0; !done;) {
            grpc_completion_queue *own[2] = {s->n_fast == 0 ? s->cq : NULL,
                                             s->n_slow == 0 ? s->cq_slow : NULL};
            for (int q = 0; q < 2; q++) {
                if (own[q] == NULL)
                    continue;
                grpc_event ev = grpc_completion_queue_next(
                    own[q], gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                         gpr_time_from_millis(20, GPR_TIMESPAN)), NULL);
                if (ev.type == GRPC_OP_COMPLETE && ev.tag == &s->shutdown_tag)
                    done = 1;
                else if (ev.type == GRPC_OP_COMPLETE)
                    ((kvs__call *)ev.tag)->step(ev.tag, ev.success);
            }
            if (s->n_fast > 0) {
                pthread_mutex_lock(&s->mu);
                done = done || s->shutdown_done;
                pthread_mutex_unlock(&s->mu);
            }
        }
    }
    /* Ingest jobs finish calls: run the queued ones before the queues go. The
     * UCX data plane still runs (it stops in destroy): taken out under
     * ingest_mu, so its ingest_submit never meets a freed pool. */
    pthread_mutex_lock(&s->ingest_mu);
    kvs_pool *ingest = s->ingest;
    s->ingest = NULL;
    pthread_mutex_unlock(&s->ingest_mu);
    kvs_pool_stop(ingest);
    grpc_completion_queue_shutdown(s->cq);
    if (s->cq_slow)
        grpc_completion_queue_shutdown(s->cq_slow);
    grpc_completion_queue *unserved[2] = {s->n_fast == 0 ? s->cq : NULL,
                                          s->n_slow == 0 ? s->cq_slow : NULL};
    for (int q = 0; q < 2; q++) {
        while (unserved[q] &&
               grpc_completion_queue_next(unserved[q], gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL)
                       .type != GRPC_QUEUE_SHUTDOWN)
            ;
    }
    for (int i = 0; i < s->n_threads; i++)
        pthread_join(s->workers[i].thread, NULL);
    kvs__ops_stop(s); /* after the last handler: none records into the trace any more */
    long leaked = atomic_load(&s->live_calls);
    if (leaked != 0)
        KVS_LOG_ERROR(MOD, "%ld calls were not freed at shutdown", leaked);
    else
        KVS_LOG_INFO(MOD, "stopped");
    destroy(s);
    return leaked ? KVS_EINTERNAL : 0;
}
