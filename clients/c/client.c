/*
 * client.c — libkvstash: the channel, the unary call helper, status mapping and
 * Health/Check.
 *
 * The idea: a kvs_client is nothing but a gRPC channel plus the options every
 * call needs (default deadline, authorization value). Each call takes a pluck
 * completion queue of its own (from a small pool, so queues are not made and
 * torn down per call), creates its grpc_call, runs one batch holding all six
 * unary ops and plucks its single tag, so any number of threads may call at
 * once: grpc_channel_create_call is thread-safe, and the pool's mutex is the
 * only thing shared. What every call would otherwise rebuild is made once at
 * open: the method paths are registered on the channel, the authorization
 * value is one slice that calls reference. The request is packed straight
 * into the slice gRPC sends, and a reply in one slice is unpacked in place.
 *
 * Invariants: every gRPC object a call creates (call, byte buffers, slices,
 * metadata arrays) is released on every path before the call returns, and
 * its queue goes back to the pool with no event left on it;
 * grpc_init() is taken once per open client and dropped in kvs_client_close()
 * after the channel is destroyed (gRPC reference-counts it), with
 * grpc_shutdown_blocking: the last client's close returns only when gRPC's
 * threads have stopped. Plain grpc_shutdown hands that to a detached thread,
 * so a program that closes its last client and exits could run OpenSSL's
 * exit-time cleanup while a channel was still retrying a TLS handshake
 * (seen: the CLI killed by SIGSEGV in RAND_priv_bytes_ex under
 * tsi_ssl_client_handshaker_factory_create_handshaker, tls_test).
 * grpc_shutdown_blocking is not enough either (gRPC 1.51): a subchannel
 * whose handshake was refused keeps reconnecting on an EventEngine thread
 * that outlives it, and the same crash came back (tls_test, 1 run in about
 * 75 under load: the main thread in exit() running OpenSSL's atexit clean-up,
 * a pool thread in EC_KEY_generate_key for the next handshake taking a
 * freed lock). So kvs_client_open asks OpenSSL, before gRPC initialises it,
 * not to clean up at exit (OPENSSL_INIT_NO_ATEXIT): the process's memory
 * goes with the process, and a late handshake finds its locks intact.
 */
#include "client_int.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>
#include <openssl/crypto.h>

#include "grpc/health/v1/health.pb-c.h"

#include <limits.h>
#include <stdarg.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KVS_DEFAULT_CONNECT_TIMEOUT_MS 5000
#define KVS_DEFAULT_CALL_TIMEOUT_MS    10000
#define KVS_DEFAULT_MAX_RECV_BYTES     ((size_t)64 << 20)

#ifndef KVS_VERSION
#define KVS_VERSION "0.0.0"
#endif

/* ---- status ---------------------------------------------------------- */

const char *kvs__grpc_status_name(int grpc_status)
{
    const char *n = kvs_grpc_code_name(grpc_status);
    return n ? n : "UNKNOWN_STATUS";
}

const char *kvs_health_status_name(kvs_health_status s)
{
    switch (s) {
    case KVS_HEALTH_UNKNOWN:
        return "UNKNOWN";
    case KVS_HEALTH_SERVING:
        return "SERVING";
    case KVS_HEALTH_NOT_SERVING:
        return "NOT_SERVING";
    case KVS_HEALTH_SERVICE_UNKNOWN:
        return "SERVICE_UNKNOWN";
    }
    return "INVALID";
}

void kvs__set_err(char *err, const char *fmt, ...)
{
    if (err == NULL)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, KVS_ERR_LEN, fmt, ap);
    va_end(ap);
}

char *kvs__strdup(const char *s)
{
    if (s == NULL)
        s = "";
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d != NULL)
        memcpy(d, s, n);
    return d;
}

/* ---- open / close ---------------------------------------------------- */

/* The registered methods, in the order of c->registered. */
static const char *const registered_methods[KVS__N_REGISTERED] = {
    KVS__METHOD_HEALTH_CHECK, KVS__METHOD_STATS, KVS__METHOD_GET_CONFIG, KVS__METHOD_SET_CONFIG,
    KVS__METHOD_LOOKUP,       KVS__METHOD_PUT,   KVS__METHOD_GET,        KVS__METHOD_DELETE,
    KVS__METHOD_PIN,          KVS__METHOD_UNPIN,
};

static void cq_destroy(grpc_completion_queue *cq);

/* ms > 0: that long from now. ms <= 0: one second ago, an unambiguously
 * expired deadline. ("now" itself is not: gRPC rounds deadlines up to the next
 * millisecond, and a call on localhost can finish within that.) */
static gpr_timespec deadline_in(int ms)
{
    gpr_timespec now = gpr_now(GPR_CLOCK_MONOTONIC);
    if (ms <= 0)
        return gpr_time_sub(now, gpr_time_from_millis(1000, GPR_TIMESPAN));
    return gpr_time_add(now, gpr_time_from_millis(ms, GPR_TIMESPAN));
}

static const char *connectivity_name(grpc_connectivity_state st)
{
    switch (st) {
    case GRPC_CHANNEL_IDLE:
        return "IDLE";
    case GRPC_CHANNEL_CONNECTING:
        return "CONNECTING";
    case GRPC_CHANNEL_READY:
        return "READY";
    case GRPC_CHANNEL_TRANSIENT_FAILURE:
        return "TRANSIENT_FAILURE";
    case GRPC_CHANNEL_SHUTDOWN:
        return "SHUTDOWN";
    }
    return "?";
}

/* Drives the channel towards READY until deadline. Each watch completes on a
 * state change (success) or at the deadline (failure); try_to_connect=1 on
 * every check kicks a channel that fell back to IDLE. */
static grpc_connectivity_state wait_ready(grpc_channel *ch, gpr_timespec deadline)
{
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    grpc_connectivity_state st = grpc_channel_check_connectivity_state(ch, 1);
    while (st != GRPC_CHANNEL_READY && st != GRPC_CHANNEL_SHUTDOWN &&
           gpr_time_cmp(gpr_now(GPR_CLOCK_MONOTONIC), deadline) < 0) {
        grpc_channel_watch_connectivity_state(ch, st, deadline, cq, NULL);
        grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        st = grpc_channel_check_connectivity_state(ch, 1);
        if (ev.type != GRPC_OP_COMPLETE || !ev.success)
            break; /* deadline reached */
    }
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
    return st;
}

static void client_free(kvs_client *c)
{
    if (c == NULL)
        return;
    for (int i = 0; i < c->n_cq_free; i++)
        cq_destroy(c->cq_free[i]);
    pthread_mutex_destroy(&c->cq_mu);
    if (c->auth_value != NULL)
        grpc_slice_unref(c->auth_slice);
    free(c->auth_value);
    free(c->target);
    free(c);
}

/* Reads the PEM file path (what names the option in messages) into a
 * malloc'd NUL-terminated string that must hold marker. 0, KVS_EIO, KVS_EINVAL
 * or KVS_ENOMEM. */
static int read_pem(const char *what, const char *path, const char *marker, char **out, char *err)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        kvs__set_err(err, "%s %s: cannot open", what, path);
        return KVS_EIO;
    }
    char *pem = malloc(((size_t)1 << 20) + 1);
    size_t n = pem ? fread(pem, 1, (size_t)1 << 20, f) : 0;
    int too_big = pem && n == ((size_t)1 << 20) && fgetc(f) != EOF;
    int rd_err = ferror(f);
    fclose(f);
    if (pem == NULL) {
        kvs__set_err(err, "out of memory");
        return KVS_ENOMEM;
    }
    pem[n] = '\0';
    if (rd_err || too_big) {
        kvs__set_err(err, "%s %s: %s", what, path, too_big ? "larger than 1 MiB" : "read error");
        free(pem);
        return KVS_EIO;
    }
    if (strstr(pem, marker) == NULL) {
        kvs__set_err(err, "%s %s: no PEM %s in it", what, path,
                     strstr(marker, "KEY") ? "private key" : "certificate");
        free(pem);
        return KVS_EINVAL;
    }
    *out = pem;
    return 0;
}

/* TLS channel credentials trusting the CA(s) in opts->tls_ca_file, presenting
 * opts->tls_cert_file/tls_key_file when set. gRPC copies the PEM text. */
static int tls_credentials(const kvs_client_opts *opts, grpc_channel_credentials **out, char *err)
{
    int have_cert = opts->tls_cert_file != NULL && opts->tls_cert_file[0] != '\0';
    int have_key = opts->tls_key_file != NULL && opts->tls_key_file[0] != '\0';
    if (have_cert != have_key) {
        kvs__set_err(err, "kvs_client_open: tls_cert_file and tls_key_file go together");
        return KVS_EINVAL;
    }
    char *ca = NULL, *cert = NULL, *key = NULL;
    int rc = read_pem("tls_ca_file", opts->tls_ca_file, "-----BEGIN CERTIFICATE-----", &ca, err);
    if (rc == 0 && have_cert)
        rc = read_pem("tls_cert_file", opts->tls_cert_file, "-----BEGIN CERTIFICATE-----", &cert,
                      err);
    if (rc == 0 && have_key)
        rc = read_pem("tls_key_file", opts->tls_key_file, "PRIVATE KEY-----", &key, err);
    if (rc == 0) {
        grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
        *out = grpc_ssl_credentials_create(ca, have_cert ? &pair : NULL, NULL, NULL);
        if (*out == NULL) {
            kvs__set_err(err, "gRPC refused the TLS certificates or key");
            rc = KVS_EINVAL;
        }
    }
    free(ca);
    free(cert);
    free(key);
    return rc;
}

int kvs_client_open(const kvs_client_opts *opts, kvs_client **out, char *err)
{
    if (out == NULL || opts == NULL || opts->target == NULL || opts->target[0] == '\0') {
        kvs__set_err(err, "kvs_client_open: opts->target and out are required");
        return KVS_EINVAL;
    }
    *out = NULL;
    for (const char *t = opts->token; t != NULL && *t != '\0'; t++) {
        if (*t < 0x20 || *t > 0x7e) { /* not a legal HTTP/2 header value */
            kvs__set_err(err, "kvs_client_open: token holds a non-printable character");
            return KVS_EINVAL;
        }
    }
    if ((opts->tls_ca_file == NULL || opts->tls_ca_file[0] == '\0') &&
        ((opts->tls_cert_file != NULL && opts->tls_cert_file[0] != '\0') ||
         (opts->tls_key_file != NULL && opts->tls_key_file[0] != '\0'))) {
        kvs__set_err(err, "kvs_client_open: a client certificate needs tls_ca_file (TLS)");
        return KVS_EINVAL;
    }
    if ((int)opts->decode < KVS_DECODE_AUTO || (int)opts->decode > KVS_DECODE_SERVER) {
        kvs__set_err(err, "kvs_client_open: opts->decode %d is not a kvs_decode_at",
                     (int)opts->decode);
        return KVS_EINVAL;
    }
    int connect_ms =
        opts->connect_timeout_ms > 0 ? opts->connect_timeout_ms : KVS_DEFAULT_CONNECT_TIMEOUT_MS;
    size_t max_recv = opts->max_recv_bytes ? opts->max_recv_bytes : KVS_DEFAULT_MAX_RECV_BYTES;
    if (max_recv > INT_MAX)
        max_recv = INT_MAX;

    kvs_client *c = calloc(1, sizeof *c);
    if (c == NULL)
        goto nomem;
    pthread_mutex_init(&c->cq_mu, NULL);
    atomic_init(&c->outstanding, 0);
    c->pid = getpid();
    if ((c->target = kvs__strdup(opts->target)) == NULL)
        goto nomem;
    c->call_timeout_ms =
        opts->call_timeout_ms > 0 ? opts->call_timeout_ms : KVS_DEFAULT_CALL_TIMEOUT_MS;
    c->ucx = opts->ucx != 0;
    c->ucx_retry_ms = opts->ucx_retry_ms == 0 ? 1000 : opts->ucx_retry_ms;
    c->ucx_seal = opts->ucx_seal_fetches > 0;
    c->decode_local = opts->decode != KVS_DECODE_SERVER; /* auto: the client */
    if (opts->token != NULL) {
        size_t n = strlen("Bearer ") + strlen(opts->token) + 1;
        if ((c->auth_value = malloc(n)) == NULL)
            goto nomem;
        snprintf(c->auth_value, n, "Bearer %s", opts->token);
        c->auth_slice = grpc_slice_from_copied_string(c->auth_value);
    }

    /* Before gRPC initialises OpenSSL: no OpenSSL clean-up at exit (see the
     * comment at the top). A first call decides it for the process. */
    (void)OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, NULL);
    grpc_init();
    grpc_arg args[2];
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = (int)max_recv;
    args[1].type = GRPC_ARG_STRING;
    args[1].key = (char *)GRPC_ARG_PRIMARY_USER_AGENT_STRING;
    args[1].value.string = (char *)"libkvstash/" KVS_VERSION;
    grpc_channel_args chargs = {.num_args = 2, .args = args};
    grpc_channel_credentials *creds = NULL;
    if (opts->tls_ca_file != NULL && opts->tls_ca_file[0] != '\0') {
        int trc = tls_credentials(opts, &creds, err); /* TLS (C2) */
        if (trc != 0) {
            client_free(c);
            grpc_shutdown_blocking();
            return trc;
        }
    } else {
        creds = grpc_insecure_credentials_create();
    }
    c->channel = grpc_channel_create(c->target, creds, &chargs);
    grpc_channel_credentials_release(creds);
    if (c->channel == NULL) {
        kvs__set_err(err, "cannot create a channel to %s", c->target);
        client_free(c);
        grpc_shutdown_blocking();
        return KVS_EINVAL;
    }
    for (int i = 0; i < KVS__N_REGISTERED; i++)
        c->registered[i] =
            grpc_channel_register_call(c->channel, registered_methods[i], NULL, NULL);

    grpc_connectivity_state st = wait_ready(c->channel, deadline_in(connect_ms));
    if (st != GRPC_CHANNEL_READY) {
        kvs__set_err(err, "cannot connect to %s within %d ms (channel %s)", c->target, connect_ms,
                     connectivity_name(st));
        kvs_client_close(c);
        return KVS_EUNAVAIL;
    }
    *out = c;
    return 0;

nomem:
    kvs__set_err(err, "out of memory");
    client_free(c);
    return KVS_ENOMEM;
}

void kvs_client_close(kvs_client *c)
{
    if (c == NULL)
        return;
    /* A forked copy touches nothing: the channel's socket and polling state
     * are shared with the parent (destroying them here would shut the
     * parent's connection down), the threads to join and the locks to take
     * are the parent's (a lock held there at the fork stays held here). Its
     * memory goes with the process. */
    if (kvs__forked(c, "kvs_client_close", NULL) != 0)
        return;
    /* Every callback first: one may start a call of the other kind (a
     * Lookup's callback a put), which the pool or thread closed before it
     * would run on a freed client. Idle after this, nothing starts more. */
    kvs_client_drain(c);
    kvs__async_close(c);
    kvs__lookups_close(c);
    kvs__xfer_close(c);
    grpc_channel_destroy(c->channel);
    client_free(c);
    grpc_shutdown_blocking();
}

/* ---- the unary call -------------------------------------------------- */

static void *registered_handle(kvs_client *c, const char *method)
{
    for (int i = 0; i < KVS__N_REGISTERED; i++)
        if (method == registered_methods[i] || strcmp(method, registered_methods[i]) == 0)
            return c->registered[i];
    return NULL;
}

/* A pluck queue for one call: a pooled one, or a new one. */
static grpc_completion_queue *cq_get(kvs_client *c)
{
    grpc_completion_queue *cq = NULL;
    pthread_mutex_lock(&c->cq_mu);
    if (c->n_cq_free > 0)
        cq = c->cq_free[--c->n_cq_free];
    pthread_mutex_unlock(&c->cq_mu);
    return cq ? cq : grpc_completion_queue_create_for_pluck(NULL);
}

static void cq_destroy(grpc_completion_queue *cq)
{
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
}

/* Back to the pool once its only tag was plucked (nothing else can arrive on
 * it: the call that used it is unref'd after its one batch completed). */
static void cq_put(kvs_client *c, grpc_completion_queue *cq)
{
    pthread_mutex_lock(&c->cq_mu);
    int kept = c->n_cq_free < KVS__CQ_POOL;
    if (kept)
        c->cq_free[c->n_cq_free++] = cq;
    pthread_mutex_unlock(&c->cq_mu);
    if (!kept)
        cq_destroy(cq);
}

/* The message of bb as one slice: the buffer's own slice when it holds one
 * (a reference, no copy), else a contiguous copy. 0, or KVS_EPROTO for a
 * buffer gRPC could not decompress. */
static int byte_buffer_slice(grpc_byte_buffer *bb, grpc_slice *out)
{
    grpc_byte_buffer_reader reader;
    if (!grpc_byte_buffer_reader_init(&reader, bb))
        return KVS_EPROTO;
    grpc_slice *first = NULL, *second = NULL;
    if (grpc_byte_buffer_reader_peek(&reader, &first) &&
        !grpc_byte_buffer_reader_peek(&reader, &second)) {
        *out = grpc_slice_ref(*first);
    } else {
        grpc_byte_buffer_reader_destroy(&reader);
        if (!grpc_byte_buffer_reader_init(&reader, bb))
            return KVS_EPROTO;
        *out = grpc_byte_buffer_reader_readall(&reader);
    }
    grpc_byte_buffer_reader_destroy(&reader);
    return 0;
}

grpc_slice kvs__pack_slice(const ProtobufCMessage *msg)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    grpc_slice s = grpc_slice_malloc(len);
    protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(s));
    return s;
}

void kvs__call_state_init(kvs_client *c, const char *method, grpc_completion_queue *cq,
                          int timeout_ms, kvs__call_state *k)
{
    k->call = kvs__call_create(c, method, cq, timeout_ms);
    k->n_md = (size_t)kvs__auth_metadata(c, &k->auth);
    grpc_metadata_array_init(&k->initial_md);
    grpc_metadata_array_init(&k->trailing_md);
    k->status = GRPC_STATUS_UNKNOWN;
    k->details = grpc_empty_slice();
}

void kvs__call_state_release(kvs__call_state *k)
{
    grpc_slice_unref(k->details);
    grpc_metadata_array_destroy(&k->initial_md);
    grpc_metadata_array_destroy(&k->trailing_md);
    if (k->n_md)
        grpc_slice_unref(k->auth.value);
    grpc_call_unref(k->call);
}

void kvs__call_send_ops(kvs__call_state *k, grpc_op ops[2], grpc_byte_buffer *bb)
{
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = k->n_md;
    ops[0].data.send_initial_metadata.metadata = k->n_md ? &k->auth : NULL;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = bb;
}

void kvs__call_status_op(kvs__call_state *k, grpc_op *op)
{
    op->op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op->data.recv_status_on_client.trailing_metadata = &k->trailing_md;
    op->data.recv_status_on_client.status = &k->status;
    op->data.recv_status_on_client.status_details = &k->details;
}

int kvs__call_status_rc(const kvs__call_state *k, char *err)
{
    int rc = kvs_status_from_grpc((int)k->status);
    if (rc != 0) {
        size_t dn = GRPC_SLICE_LENGTH(k->details);
        if (dn > 0)
            kvs__set_err(err, "%s: %.*s", kvs__grpc_status_name((int)k->status), (int)dn,
                         (const char *)GRPC_SLICE_START_PTR(k->details));
        else
            kvs__set_err(err, "%s", kvs__grpc_status_name((int)k->status));
    }
    return rc;
}

int kvs__unary_start(kvs_client *c, const char *method, grpc_completion_queue *cq, int timeout_ms,
                     grpc_slice req, kvs__unary *u, void *tag, char *err)
{
    memset(u, 0, sizeof *u);
    u->method = method;
    kvs__call_state_init(c, method, cq, timeout_ms, &u->k);
    u->send_bb = grpc_raw_byte_buffer_create(&req, 1);
    grpc_slice_unref(req);

    grpc_op *ops = u->ops;
    kvs__call_send_ops(&u->k, ops, u->send_bb);
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &u->k.initial_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &u->recv_bb;
    kvs__call_status_op(&u->k, &ops[5]);

    /* After the batch starts, u belongs to whoever takes its completion (it
     * may be freed before start_batch returns): read nothing of it after. */
    grpc_call *call = u->k.call;
    TSAN_RELEASE(tag); /* u, and the caller's op around it, for the completion's taker */
    grpc_call_error ce = grpc_call_start_batch(call, ops, 6, tag, NULL);
    if (ce != GRPC_CALL_OK) {
        kvs__set_err(err, "INTERNAL: grpc_call_start_batch failed (%d) for %s", (int)ce, method);
        grpc_slice reply;
        (void)kvs__unary_finish(u, &reply, NULL, NULL); /* releases only */
        return KVS_EINTERNAL;
    }
    return 0;
}

int kvs__unary_finish(kvs__unary *u, grpc_slice *reply, int *grpc_status, char *err)
{
    *reply = grpc_empty_slice();
    if (grpc_status != NULL)
        *grpc_status = (int)u->k.status;
    int rc = kvs__call_status_rc(&u->k, err);
    if (rc == 0 && u->recv_bb == NULL) {
        kvs__set_err(err, "OK: %s returned no message", u->method);
        rc = KVS_EPROTO;
    } else if (rc == 0 && (rc = byte_buffer_slice(u->recv_bb, reply)) != 0) {
        kvs__set_err(err, "OK: cannot read the reply of %s", u->method);
    }
    if (u->recv_bb != NULL)
        grpc_byte_buffer_destroy(u->recv_bb);
    grpc_byte_buffer_destroy(u->send_bb);
    kvs__call_state_release(&u->k);
    memset(u, 0, sizeof *u);
    return rc;
}

int kvs__call_slice(kvs_client *c, const char *method, grpc_slice req, int timeout_ms,
                    grpc_slice *reply, int *grpc_status, char *err)
{
    *reply = grpc_empty_slice();
    if (grpc_status != NULL)
        *grpc_status = GRPC_STATUS_UNKNOWN;
    grpc_completion_queue *cq = cq_get(c);
    kvs__unary u;
    void *tag = &u; /* any unique pointer: the CQ is this call's alone while it runs */
    int rc = kvs__unary_start(c, method, cq, timeout_ms, req, &u, tag, err);
    if (rc == 0) {
        /* RECV_STATUS_ON_CLIENT always completes, at the latest at the deadline. */
        grpc_completion_queue_pluck(cq, tag, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        rc = kvs__unary_finish(&u, reply, grpc_status, err);
    }
    cq_put(c, cq);
    return rc;
}

int kvs__call_unary(kvs_client *c, const char *method, const uint8_t *req, size_t req_len,
                    int timeout_ms, uint8_t **reply, size_t *reply_len, int *grpc_status, char *err)
{
    KVS_ASSERT(c != NULL && method != NULL && reply != NULL && reply_len != NULL);
    *reply = NULL;
    *reply_len = 0;
    grpc_slice rep;
    int rc = kvs__call_slice(c, method, grpc_slice_from_copied_buffer((const char *)req, req_len),
                             timeout_ms, &rep, grpc_status, err);
    if (rc != 0)
        return rc;
    size_t n = GRPC_SLICE_LENGTH(rep);
    if (n > 0) {
        if ((*reply = malloc(n)) == NULL) {
            kvs__set_err(err, "out of memory");
            rc = KVS_ENOMEM;
        } else {
            memcpy(*reply, GRPC_SLICE_START_PTR(rep), n);
            *reply_len = n;
        }
    }
    grpc_slice_unref(rep);
    return rc;
}

int kvs__call_pb(kvs_client *c, const char *method, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *reply_desc, int timeout_ms,
                 ProtobufCMessage **reply, char *err)
{
    *reply = NULL;
    grpc_slice rep;
    int rc = kvs__call_slice(c, method, kvs__pack_slice(req), timeout_ms, &rep, NULL, err);
    if (rc != 0)
        return rc;
    /* protobuf-c unpacks an empty message from (0, NULL) fine. */
    size_t rep_len = GRPC_SLICE_LENGTH(rep);
    *reply = protobuf_c_message_unpack(reply_desc, NULL, rep_len, GRPC_SLICE_START_PTR(rep));
    grpc_slice_unref(rep);
    if (*reply == NULL) {
        kvs__set_err(err, "reply of %s (%zu bytes) does not parse as %s", method, rep_len,
                     reply_desc->name);
        return KVS_EPROTO;
    }
    return 0;
}

/* ---- Health ---------------------------------------------------------- */

int kvs_client_health(kvs_client *c, const char *service, int timeout_ms, kvs_health_status *out,
                      char *err)
{
    if (c == NULL || out == NULL) {
        kvs__set_err(err, "kvs_client_health: client and out are required");
        return KVS_EINVAL;
    }
    if (kvs__forked(c, "kvs_client_health", err) != 0)
        return KVS_EPRECOND;
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)(service != NULL ? service : "");
    ProtobufCMessage *rep = NULL;
    int rc =
        kvs__call_pb(c, KVS__METHOD_HEALTH_CHECK, &req.base,
                     &grpc__health__v1__health_check_response__descriptor, timeout_ms, &rep, err);
    if (rc != 0)
        return rc;
    Grpc__Health__V1__HealthCheckResponse *h = (Grpc__Health__V1__HealthCheckResponse *)rep;
    switch (h->status) {
    case GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING:
        *out = KVS_HEALTH_SERVING;
        break;
    case GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING:
        *out = KVS_HEALTH_NOT_SERVING;
        break;
    case GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN:
        *out = KVS_HEALTH_SERVICE_UNKNOWN;
        break;
    default:
        *out = KVS_HEALTH_UNKNOWN;
        break;
    }
    protobuf_c_message_free_unpacked(rep, NULL);
    return 0;
}

/* ---- shared with the data-path files (client_int.h) ------------------ */

int kvs__forked(const kvs_client *c, const char *fn, char *err)
{
    if (c->pid == getpid())
        return 0;
    kvs__set_err(err,
                 "%s: this process was forked from process %ld, which opened the client: its "
                 "connection and threads are that process's (open a client after exec)",
                 fn, (long)c->pid);
    return KVS_EPRECOND;
}

gpr_timespec kvs__deadline_in(int ms)
{
    return deadline_in(ms);
}

int64_t kvs__mono_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

int64_t kvs__call_deadline(const kvs_client *c, int timeout_ms)
{
    return kvs__mono_ms() + (timeout_ms < 0 ? c->call_timeout_ms : timeout_ms);
}

int kvs__call_left_ms(int64_t deadline)
{
    int64_t left = deadline - kvs__mono_ms();
    return left <= 0 ? 0 : left > INT_MAX ? INT_MAX : (int)left;
}

grpc_call *kvs__call_create(kvs_client *c, const char *method, grpc_completion_queue *cq,
                            int timeout_ms)
{
    if (timeout_ms < 0)
        timeout_ms = c->call_timeout_ms;
    void *handle = registered_handle(c, method);
    if (handle != NULL)
        return grpc_channel_create_registered_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
                                                   handle, deadline_in(timeout_ms), NULL);
    grpc_slice m = grpc_slice_from_copied_string(method);
    grpc_call *call = grpc_channel_create_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cq, m,
                                               NULL, deadline_in(timeout_ms), NULL);
    grpc_slice_unref(m);
    return call;
}

int kvs__auth_metadata(kvs_client *c, grpc_metadata *md)
{
    memset(md, 0, sizeof *md);
    if (c->auth_value == NULL)
        return 0;
    md->key = grpc_slice_from_static_string("authorization");
    md->value = grpc_slice_ref(c->auth_slice); /* made once at open */
    return 1;
}
