/*
 * xfer.c — libkvstash's UCX data plane: kvs_client_fetch (kvstash.h).
 *
 * The idea: one kvs_xfer_client (transfer/xfer.h) per kvs_client, connected
 * lazily on the first fetch (Connect over gRPC gives the server's worker
 * address and a session bound to our tenant). A fetch asks for a batch of
 * blocks into buffers owned here; the transfer's progress thread records
 * which layers have landed (verified), and the calling thread hands them to
 * the caller's callback strictly in (block, layer) order, as kvs_client_get
 * does, while later layers are still arriving.
 *
 * Layout of a layer as the server sends it (service/data_connect.c):
 *   EGRESS_STORED: the encoded block itself; layer l's K tiles and V tiles are
 *     located with kvs_block_layer_range / kvs_block_tile (the transfer has
 *     checked the header and every tile checksum before reporting the layer).
 *   formats 1..4: a 16-byte header (magic, layers, per-layer bytes) with
 *     layer 0, then per layer [K][V] of kvs_egress_layer_bytes each, then for
 *     FP8_PER_TENSOR the fp32 k_scale and v_scale.
 *
 * Fallback: any failure of the UCX path (Connect refused or UNIMPLEMENTED,
 * UCX cannot start, an endpoint error or timeout, a block too large for our
 * buffer) continues the same fetch over gRPC Get from the first layer the
 * callback has not seen; the client then uses gRPC (state FAILED) until
 * its wait is over (kvs_client_opts.ucx_retry_ms, doubling per failure:
 * fail_locked), when the next fetch or put Connects again (connect_locked).
 * Its session is closed by the next put before that put goes over gRPC
 * (xfer_settle), or by that Connect, never on a fetch's path.
 * Answers gRPC would give as well (not cached, corrupt, callback stop) are
 * returned without a fallback. UCX requests carry no namespace (the server
 * checks the tenant); a block whose layout is not ns's is answered here with
 * KVS_ENOTFOUND, as Get answers a block of another namespace.
 *
 * Puts (kvs_client_put_ucx): the packed PutHeader and the raw layers, sealed
 * with the session's put key from Connect (common/kvs_putmac.h): kvstashd
 * checks the seal, so a data plane process that changes or invents puts gets
 * them refused (then this put goes over gRPC).
 *
 * Invariants: a batch's buffers are freed only after its on_done (no UCX
 * operation touches them any more); the caller's callback runs on the
 * calling thread only, never on the progress thread.
 *
 * Processes: everything here runs in the process that opened the client.
 * Every public entry refuses a forked copy before it touches c->xfer
 * (kvs__forked: fetch_args, kvs_client_put_ucx, kvs_client_xfer_stats_get,
 * and kvs_client_put before kvs__xfer_before_put), kvs_client_close returns
 * before kvs__xfer_close there (a copy releases nothing), and the threads
 * that call in here (the Connect's thread, the transfer's progress thread,
 * libkvstash's put and get workers, which go through kvs_client_put and
 * kvs_client_get) are started by that process and do not exist in a copy.
 * So no state of x names a process.
 */
#include "client_int.h"

#include "kv_block.h"
#include "kvs_netdev.h"
#include "kvs_putmac.h"
#include "kvstash/v1/kvstash.pb-c.h"
#include "xfer.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define METHOD_CONNECT "/kvstash.v1.KvStash/Connect"
/* Bytes of receive buffers one batch may hold (at least one block). */
#define BATCH_BYTES ((uint64_t)256 << 20)

enum { ST_NEW = 0, ST_UP = 1, ST_FAILED = 2 };
/* Header of a rendered block (service/data_connect.c): magic, layers,
 * per-layer bytes (low, high), uint32 each in host order. */
#define RHDR_MAGIC 0x5253564Bu /* "KVSR" */
#define RHDR_LEN 16u
#define POOL_MAX 64
#define POOL_BYTES ((uint64_t)512 << 20)

struct kvs__xfer {
    /* Serialises the calls that close our session or void one of its puts
     * (session_call); taken before mu, never while holding it. */
    pthread_mutex_t close_mu;
    pthread_mutex_t mu; /* guards everything below */
    int state;
    /* A first Connect is under way on the library's thread (dial_main):
     * callers wait on cv for its outcome within their own time, then go
     * over gRPC. */
    int dialing;
    pthread_cond_t cv;
    int status; /* why FAILED */
    kvs_xfer_client *cli;
    /* The session's put key (Connect; kvs_putmac.h) and the last sequence
     * number sealed with it. No key: a server older than sealed puts. */
    uint8_t put_key[KVS_PUTMAC_KEY_LEN];
    int have_put_key;
    uint64_t put_seq;
    int64_t clock_off_ms; /* kvstashd's monotonic clock minus ours, at Connect */
    /* Sealed fetches (kvs_client_opts.ucx_seal_fetches): Connect's fetch_seal
     * answer, and the session's fetch key when it is 1 (kvs_putmac.h). */
    int fetch_seal;
    uint8_t fetch_key[KVS_PUTMAC_KEY_LEN];
    /* The session Connect gave us, until kvstashd has closed it (xfer_settle).
     * Open while FAILED: its close is pending, and no put may go over gRPC
     * until kvstashd has answered it (a put of it held back could commit). */
    uint64_t sess_id;
    uint8_t sess_token[KVS_XFER_TOKEN_LEN];
    int sess_open;
    /* state == ST_FAILED && sess_open, written under mu (fail_locked,
     * xfer_settle) and read without it: a gRPC put with nothing pending
     * takes neither lock (close_mu is held across a close
     * or a void, each under another call's deadline). */
    atomic_int close_pend;
    unsigned long long puts_unsent; /* gRPC puts not sent: the close failed */
    /* Connect again after a failure (connect_locked): not before retry_at_ms
     * (CLOCK_MONOTONIC), and only while no thread uses cli outside mu
     * (cli_users: a fetch or put holds it across its wait). backoff_ms is the
     * next wait, retry_base the first (kvs_client_opts.ucx_retry_ms; < 0:
     * never). */
    int64_t retry_at_ms;
    int64_t backoff_ms, retry_base;
    unsigned cli_users;
    /* A Connect after a failure is under way on a thread of its own
     * (dial_main); dial_thr is joined by the next start or by
     * kvs__xfer_close. */
    int connecting;
    pthread_t dial_thr;
    int dial_joinable;
    kvs_client_xfer_stats st;
    /* Receive buffers of fetches whose callers' time ran out while their
     * requests still ran (fetch_batch): freed when each ends. */
    uint64_t orphan_bytes;
    /* Receive buffers kept for the next fetch (fresh large mallocs are fresh
     * mmaps: every page would fault again). Exact sizes, POOL_BYTES at most. */
    void *pool[POOL_MAX];
    uint64_t pool_len[POOL_MAX];
    unsigned npool;
    uint64_t pool_bytes;
};

/* Creating c->xfer races between threads of one client: one global lock. */
static pthread_mutex_t g_init = PTHREAD_MUTEX_INITIALIZER;

static void mono_cond_init(pthread_cond_t *cv);

static struct kvs__xfer *xfer_of(kvs_client *c)
{
    pthread_mutex_lock(&g_init);
    if (c->xfer == NULL && (c->xfer = calloc(1, sizeof *c->xfer)) != NULL) {
        c->xfer->retry_base = c->ucx_retry_ms;
        pthread_mutex_init(&c->xfer->mu, NULL);
        pthread_mutex_init(&c->xfer->close_mu, NULL);
        mono_cond_init(&c->xfer->cv);
    }
    struct kvs__xfer *x = c->xfer;
    pthread_mutex_unlock(&g_init);
    return x;
}

/* Receive buffers of HUGE_BYTES or more start on a 2 MiB boundary and are
 * asked to be transparent huge pages (MADV_HUGEPAGE: many kernels give them
 * only when asked): UCX's copy of each layer into them then crosses 512
 * times fewer pages (xfer_bench, XFER_BENCH_HUGE: docs/BENCHMARKS.md). A
 * kernel without THP ignores the advice. free() releases them. */
#define HUGE_BYTES ((uint64_t)2 << 20)

static void *buf_alloc(uint64_t len)
{
    if (len < HUGE_BYTES)
        return malloc(len);
    uint64_t n = (len + HUGE_BYTES - 1) / HUGE_BYTES * HUGE_BYTES;
    void *p = NULL;
    if (posix_memalign(&p, HUGE_BYTES, n) != 0)
        return NULL;
    (void)madvise(p, n, MADV_HUGEPAGE);
    return p;
}

static void *buf_get(struct kvs__xfer *x, uint64_t len)
{
    pthread_mutex_lock(&x->mu);
    for (unsigned i = 0; i < x->npool; i++)
        if (x->pool_len[i] == len) {
            void *p = x->pool[i];
            x->pool_bytes -= len;
            x->npool--;
            x->pool[i] = x->pool[x->npool];
            x->pool_len[i] = x->pool_len[x->npool];
            pthread_mutex_unlock(&x->mu);
            return p;
        }
    pthread_mutex_unlock(&x->mu);
    return buf_alloc(len);
}

static void buf_put(struct kvs__xfer *x, void *p, uint64_t len)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&x->mu);
    if (x->npool < POOL_MAX && x->pool_bytes + len <= POOL_BYTES) {
        x->pool[x->npool] = p;
        x->pool_len[x->npool++] = len;
        x->pool_bytes += len;
        p = NULL;
    }
    pthread_mutex_unlock(&x->mu);
    free(p);
}

static int session_call(kvs_client *c, struct kvs__xfer *x, uint64_t void_seq, int timeout_ms,
                        uint64_t *id);

/* The longest kvs_client_close waits for kvstashd to close our session. */
#define CLOSE_AT_EXIT_MS 2000

void kvs__xfer_close(kvs_client *c)
{
    struct kvs__xfer *x = c->xfer;
    if (x == NULL)
        return;
    /* A reconnect under way ends within the client's call timeout. */
    pthread_mutex_lock(&x->mu);
    int join = x->dial_joinable;
    pthread_mutex_unlock(&x->mu);
    if (join)
        pthread_join(x->dial_thr, NULL);
    /* Our session ends with us: kvstashd is told over gRPC (a Connect that
     * closes it), because UCX does not tell it. Over shared memory a live
     * process that closes its endpoint looks, to the server, like one that
     * is still there (only a dead one is noticed), so every closed client's
     * session stayed open, counted against ucx_max_sessions, until kvstashd
     * refused every new worker. Best effort, within CLOSE_AT_EXIT_MS: a
     * kvstashd that does not answer closes it when UCX sees the endpoint go
     * (tcp) or never. */
    pthread_mutex_lock(&x->mu);
    int open = x->sess_open;
    if (open)
        atomic_store(&x->close_pend, 1);
    pthread_mutex_unlock(&x->mu);
    if (open) {
        int ms = c->call_timeout_ms < CLOSE_AT_EXIT_MS ? c->call_timeout_ms : CLOSE_AT_EXIT_MS;
        uint64_t id;
        pthread_mutex_lock(&x->close_mu);
        (void)session_call(c, x, 0, ms, &id);
        pthread_mutex_unlock(&x->close_mu);
    }
    if (x->cli != NULL)
        kvs_xfer_client_destroy(x->cli);
    for (unsigned i = 0; i < x->npool; i++)
        free(x->pool[i]);
    pthread_mutex_destroy(&x->mu);
    pthread_mutex_destroy(&x->close_mu);
    pthread_cond_destroy(&x->cv);
    free(x);
    c->xfer = NULL;
}

/* A Connect that names our session (close_session_id and its token): with
 * void_seq 0 it closes the session, else it voids our put sealed with
 * void_seq. Called with x->close_mu, without x->mu (a frozen kvstashd must
 * not stall fetches behind it), within timeout_ms. 1: kvstashd says so
 * (closed or voided); 0: kvstashd answered without saying so (a void of a
 * put it no longer knows), or refused the request (a kvstashd older than
 * the close: nothing more can be done), or the session is not ours to name;
 * a KVS_E* < 0: kvstashd was not reached or did not answer in time. */
static int session_call(kvs_client *c, struct kvs__xfer *x, uint64_t void_seq, int timeout_ms,
                        uint64_t *id)
{
    Kvstash__V1__ConnectRequest req = KVSTASH__V1__CONNECT_REQUEST__INIT;
    uint8_t token[KVS_XFER_TOKEN_LEN];
    pthread_mutex_lock(&x->mu);
    /* A close names only a session whose close is pending: a reconnect
     * may have closed the one the caller saw pending and opened another
     * since, which must not be closed unless it has failed too. *id: the
     * session named, 0 for none. */
    int named = void_seq != 0 || atomic_load(&x->close_pend);
    int open = named && x->sess_open;
    *id = named ? x->sess_id : 0;
    req.close_session_id = x->sess_id;
    memcpy(token, x->sess_token, sizeof token);
    pthread_mutex_unlock(&x->mu);
    if (!open)
        return 0;
    req.close_session_token.data = token;
    req.close_session_token.len = sizeof token;
    req.void_put_seq = void_seq;
    req.client_name = (char *)"libkvstash";
    ProtobufCMessage *rep = NULL;
    int rc = kvs__call_pb(c, METHOD_CONNECT, &req.base, &kvstash__v1__connect_response__descriptor,
                          timeout_ms, &rep, NULL);
    memset(token, 0, sizeof token);
    const Kvstash__V1__ConnectResponse *r = (const void *)rep;
    int yes = rc == 0 && (void_seq ? r->voided : r->closed);
    if (rep != NULL)
        protobuf_c_message_free_unpacked(rep, NULL);
    if (rc == KVS_EUNAVAIL || rc == KVS_ETIMEDOUT || rc == KVS_ECANCELED || rc == KVS_ENOMEM ||
        rc == KVS_EINTERNAL || rc == KVS_ENOSPC || rc == KVS_EUNAUTH)
        return rc;
    return yes;
}

/* A condition variable whose timed waits run on CLOCK_MONOTONIC (kvs__mono_ms). */
static void mono_cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}

/* The time ms (> 0) from now on clock clk, for a timed wait. */
static struct timespec abs_in(clockid_t clk, int64_t ms)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    return ts;
}

/* Waits on cv (mono_cond_init's) with mu until deadline (kvs__mono_ms): 0 when
 * woken (the caller checks its condition again), ETIMEDOUT once the
 * deadline has passed. */
static int wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t deadline)
{
    int64_t ms = deadline - kvs__mono_ms();
    if (ms <= 0)
        return ETIMEDOUT;
    struct timespec ts = abs_in(CLOCK_MONOTONIC, ms);
    return pthread_cond_timedwait(cv, mu, &ts) == ETIMEDOUT ? ETIMEDOUT : 0;
}

/* Takes x->close_mu by deadline: 0, or KVS_ETIMEDOUT when another thread's
 * close or void holds it that long (each runs under its own caller's
 * deadline, which may be far longer than ours) or the time is already out. */
static int close_lock(struct kvs__xfer *x, int64_t deadline)
{
    int64_t ms = deadline - kvs__mono_ms();
    if (ms <= 0)
        return KVS_ETIMEDOUT;
#ifdef __SANITIZE_THREAD__
    /* GCC 12's ThreadSanitizer does not intercept pthread_mutex_clocklock
     * (transfer/ucx_addrcheck.c): its builds wait on the realtime clock. */
    clockid_t clk = CLOCK_REALTIME;
#else
    clockid_t clk = CLOCK_MONOTONIC;
#endif
    struct timespec ts = abs_in(clk, ms);
#ifdef __SANITIZE_THREAD__
    int rc = pthread_mutex_timedlock(&x->close_mu, &ts);
#else
    int rc = pthread_mutex_clocklock(&x->close_mu, CLOCK_MONOTONIC, &ts);
#endif
    return rc == 0 ? 0 : KVS_ETIMEDOUT;
}

/* Before a put goes over gRPC: a session we have left (FAILED) is closed
 * first, so a put of ours the data plane process held back cannot be stored
 * after this one, once the block is deleted or evicted (docs/TRANSFER.md
 * "Closing a session"). Leaving UCX only marks the close pending, so a
 * fetch's fallback never waits for it. 0: nothing of the session can commit
 * any more (or kvstashd cannot close it: older); else the close failed
 * (kvstashd unreachable, or no answer within timeout_ms), the put must not
 * be sent, and the next one tries again. timeout_ms bounds the whole wait,
 * another thread's close included: a put never waits for a close made
 * under a longer deadline than its own. */
static int xfer_settle(kvs_client *c, struct kvs__xfer *x, int timeout_ms)
{
    if (!atomic_load(&x->close_pend))
        return 0; /* a session once closed stays closed; a new one is not FAILED */
    int64_t deadline = kvs__call_deadline(c, timeout_ms);
    int rc = close_lock(x, deadline);
    int locked = rc == 0;
    int pending = atomic_load(&x->close_pend); /* another thread may have closed it */
    while (locked && pending) {
        int64_t left = deadline - kvs__mono_ms();
        uint64_t id = 0;
        rc = left > 0 ? session_call(c, x, 0, (int)left, &id) : KVS_ETIMEDOUT;
        pthread_mutex_lock(&x->mu);
        if (left > 0 && !(id != 0 && x->sess_id == id && x->sess_open)) {
            /* Not the session named: a reconnect's Connect closed it (or it
             * had nothing pending), whatever our call's fate; the session
             * that Connect opened may have failed since: then close that. */
            pending = atomic_load(&x->close_pend);
            rc = 0;
        } else if (rc >= 0) {
            x->sess_open = 0;
            atomic_store(&x->close_pend, 0);
            x->st.sessions_closed += (unsigned long long)rc;
            memset(x->sess_token, 0, sizeof x->sess_token);
            pending = 0;
        }
        pthread_mutex_unlock(&x->mu);
        if (rc < 0)
            break;
    }
    pthread_mutex_lock(&x->mu);
    x->puts_unsent += pending && rc < 0;
    pthread_mutex_unlock(&x->mu);
    if (locked)
        pthread_mutex_unlock(&x->close_mu);
    return pending && rc < 0 ? rc : 0;
}

int kvs__xfer_before_put(kvs_client *c, int timeout_ms, char *err)
{
    pthread_mutex_lock(&g_init);
    struct kvs__xfer *x = c->xfer;
    pthread_mutex_unlock(&g_init);
    int rc = x ? xfer_settle(c, x, timeout_ms) : 0;
    if (rc != 0)
        kvs__set_err(err,
                     "not put over gRPC: this client left UCX and its session could not be "
                     "closed yet (%s), so a put of it held back could still be stored; the "
                     "next put tries again",
                     kvs_strerror(rc));
    return rc;
}

/* Voids our put sealed with seq: session_call's answer (1 voided). */
static int void_put(kvs_client *c, struct kvs__xfer *x, uint64_t seq, int timeout_ms)
{
    int64_t deadline = kvs__call_deadline(c, timeout_ms);
    if (close_lock(x, deadline) != 0)
        return KVS_ETIMEDOUT; /* then the client leaves UCX, and the close comes first */
    int64_t left = deadline - kvs__mono_ms();
    uint64_t id;
    int rc = left > 0 ? session_call(c, x, seq, (int)left, &id) : KVS_ETIMEDOUT;
    pthread_mutex_unlock(&x->close_mu);
    pthread_mutex_lock(&x->mu);
    x->st.puts_voided += (unsigned long long)(rc == 1);
    pthread_mutex_unlock(&x->mu);
    return rc;
}

#define RETRY_MAX_MS     60000  /* the longest wait before Connect again */
#define RETRY_REFUSED_MS 600000 /* after kvstashd refused UCX (off, tenant, user) */
#define RETRY_NEVER      INT64_MAX

/* The UCX path failed: gRPC until retry_at_ms, then Connect again
 * (connect_locked). The session's close is pending (xfer_settle): no call is
 * made here. forged: the data plane process answered for kvstashd (a
 * KVS_EUNAUTH on the data plane, not kvstashd's own UNAUTHENTICATED to a
 * Connect, which is a refusal like PERMISSION_DENIED). */
static void retry_later(struct kvs__xfer *x, int forged)
{
    if (x->retry_base < 0 || forged) {
        /* never: the caller asked so, or the data plane process answered for
         * kvstashd (a forgery; TRANSFER.md "Sealed puts") */
        x->retry_at_ms = RETRY_NEVER;
        return;
    }
    if (x->backoff_ms <= 0)
        x->backoff_ms = x->retry_base;
    int64_t wait = x->backoff_ms;
    if (x->status == KVS_EUNIMPL || x->status == KVS_EPERM || x->status == KVS_EPRECOND ||
        x->status == KVS_EUNAUTH)
        wait = wait > RETRY_REFUSED_MS ? wait : RETRY_REFUSED_MS;
    x->retry_at_ms = kvs__mono_ms() + wait;
    /* up to RETRY_MAX_MS, or the first wait when the caller asked for more
     * (never shorter than that: it used to drop to 60 s after a first wait
     * of more) */
    int64_t top = x->retry_base > RETRY_MAX_MS ? x->retry_base : RETRY_MAX_MS;
    x->backoff_ms = x->backoff_ms >= top / 2 ? top : 2 * x->backoff_ms;
}

static void fail_locked(struct kvs__xfer *x, int status)
{
    if (x->state == ST_FAILED && status != KVS_EUNAUTH)
        return; /* one failure, one wait */
    x->state = ST_FAILED;
    x->status = status ? status : KVS_EUNAVAIL;
    atomic_store(&x->close_pend, x->sess_open);
    retry_later(x, x->status == KVS_EUNAUTH); /* on the data plane: forged */
}

/* A fetch or put went through over UCX: the next failure waits the least. */
static void ucx_worked(struct kvs__xfer *x)
{
    pthread_mutex_lock(&x->mu);
    x->backoff_ms = x->retry_base;
    pthread_mutex_unlock(&x->mu);
}

/* What a Connect gave (dial). */
typedef struct dial_out {
    kvs_xfer_client *cli; /* created, or NULL */
    int answered;         /* a valid ConnectResponse: its session is open */
    int closed;           /* its answer's closed (the session named to close) */
    uint64_t id;
    uint8_t token[KVS_XFER_TOKEN_LEN];
    uint8_t put_key[KVS_PUTMAC_KEY_LEN];
    int have_put_key;
    int64_t clock_off_ms;
    int fetch_seal; /* the answer's fetch_seal */
} dial_out;

/* Creates a transfer client and opens a session for it: Connect (closing
 * session close_id, token close_tok, in the same call when close_id != 0),
 * then the endpoint to kvstashd's address, under the client's call timeout
 * (on the Connect's thread, dial_main). Touches nothing of x: the caller
 * may hold x->mu or not. 0, or the KVS_E* of the step that failed (*d says
 * how far it got). */
static int dial(kvs_client *c, uint64_t close_id, const uint8_t *close_tok, dial_out *d)
{
    memset(d, 0, sizeof *d);
    kvs_xfer_client_opts o = {.err_mode = KVS_XFER_ERR_PEER,
                              .timeout_ms = (uint32_t)c->call_timeout_ms};
    /* A server reached over loopback: shared memory only, as kvstashd on
     * loopback (no UCX tcp port, whose transport UCX 1.13 lets 13 crafted
     * bytes abort), and UCX's network transports on loopback should the
     * operator's UCX_TLS bring them back (UCX opens a listening socket on each
     * interface and trusts its peers). Otherwise every transport and device,
     * RDMA included (kvs_netdev.h). UCX_TLS and UCX_NET_DEVICES override. */
    char dev[64];
    if (kvs_netdev_toward(c->target, dev, sizeof dev) == KVS_NETDEV_LOOPBACK) {
        o.net_devices = dev;
        if (getenv("UCX_NET_DEVICES") == NULL)
            o.tls = KVS_XFER_TLS_SHM;
    }
    int rc = kvs_xfer_client_create(&o, &d->cli);
    if (rc != 0) {
        d->cli = NULL;
        return rc;
    }
    const void *addr;
    size_t alen;
    if ((rc = kvs_xfer_client_address(d->cli, &addr, &alen)) != 0)
        return rc;
    Kvstash__V1__ConnectRequest req = KVSTASH__V1__CONNECT_REQUEST__INIT;
    req.worker_address.data = (uint8_t *)addr;
    req.worker_address.len = alen;
    req.client_name = (char *)"libkvstash";
    req.seal_fetches = c->ucx_seal != 0;
    if (close_id != 0) {
        req.close_session_id = close_id;
        req.close_session_token.data = (uint8_t *)close_tok;
        req.close_session_token.len = KVS_XFER_TOKEN_LEN;
    }
    ProtobufCMessage *rep = NULL;
    rc = kvs__call_pb(c, METHOD_CONNECT, &req.base, &kvstash__v1__connect_response__descriptor,
                      c->call_timeout_ms, &rep, NULL);
    if (rc != 0)
        return rc; /* KVS_EUNIMPL: the server serves gRPC only */
    const Kvstash__V1__ConnectResponse *r = (const void *)rep;
    if (r->session_token.len != KVS_XFER_TOKEN_LEN || r->worker_address.len == 0 ||
        (r->put_key.len != 0 && r->put_key.len != KVS_PUTMAC_KEY_LEN)) {
        protobuf_c_message_free_unpacked(rep, NULL);
        return KVS_EPROTO;
    }
    d->answered = 1;
    d->closed = r->closed != 0;
    d->id = r->session_id;
    memcpy(d->token, r->session_token.data, sizeof d->token);
    d->have_put_key = r->put_key.len == KVS_PUTMAC_KEY_LEN;
    if (d->have_put_key)
        memcpy(d->put_key, r->put_key.data, KVS_PUTMAC_KEY_LEN);
    d->clock_off_ms = (int64_t)r->server_clock_ms - (int64_t)kvs_putmac_now_ms();
    d->fetch_seal = (int)r->fetch_seal;
    /* Seals asked for and not promised (a kvstashd older than them, or a
     * sealed answer without a put key to derive the fetch key from): this
     * session is not used (its close is then pending), as with a refusal. */
    if (c->ucx_seal &&
        (d->fetch_seal < 1 || d->fetch_seal > 2 || (d->fetch_seal == 1 && !d->have_put_key))) {
        protobuf_c_message_free_unpacked(rep, NULL);
        return KVS_EPRECOND;
    }
    kvs_xfer_session_info info = {.id = d->id};
    memcpy(info.token, d->token, sizeof info.token);
    rc = kvs_xfer_client_connect(d->cli, r->worker_address.data, r->worker_address.len, &info);
    protobuf_c_message_free_unpacked(rep, NULL);
    return rc;
}

/* A Connect's outcome (dial's rc and *d), with x->mu: the session it opened
 * becomes ours; UP, or FAILED with the next wait. again: a reconnect. */
static kvs_xfer_client *dialed_locked(kvs_client *c, struct kvs__xfer *x, int rc, dial_out *d,
                                      int again)
{
    x->cli = d->cli;
    if (d->answered) { /* kvstashd opened a session: ours until closed */
        x->sess_id = d->id;
        memcpy(x->sess_token, d->token, sizeof x->sess_token);
        x->sess_open = 1;
        x->have_put_key = d->have_put_key;
        memcpy(x->put_key, d->put_key, sizeof x->put_key);
        x->put_seq = 0;
        x->clock_off_ms = d->clock_off_ms;
        x->fetch_seal = c->ucx_seal ? d->fetch_seal : 0;
        if (x->fetch_seal == 1 && kvs_fetchseal_key(x->put_key, x->fetch_key) != 0 && rc == 0)
            rc = KVS_EINTERNAL;
    }
    memset(d, 0, sizeof *d);
    if (rc != 0) {
        /* FAILED (again: already), this try's status, and the next wait. A
         * KVS_EUNAUTH here is kvstashd's answer to the Connect (our
         * credentials refused), not the data plane's: not a forgery. */
        x->state = ST_FAILED;
        x->status = rc;
        atomic_store(&x->close_pend, x->sess_open);
        retry_later(x, 0);
        return NULL;
    }
    x->state = ST_UP;
    atomic_store(&x->close_pend, 0);
    x->st.reconnects += (unsigned long long)again;
    return x->cli;
}

/* A Connect on the library's thread: the first (first: x->dialing), or a
 * reconnect with what connect_locked took from x for it (x->connecting). */
typedef struct dial_job {
    kvs_client *c;
    int first;
    kvs_xfer_client *old; /* the failed transfer client, destroyed first */
    int closing;          /* our old session's close is pending: Connect closes it */
    uint64_t id;
    uint8_t tok[KVS_XFER_TOKEN_LEN];
} dial_job;

/* The Connect's thread: the first one, or again (closing the old session in
 * the same call), under the client's call timeout, then UP or FAILED. The
 * callers of a first Connect wait for it within their own time (cv); none
 * waits for a reconnect: fetches and puts go over gRPC meanwhile. */
static void *dial_main(void *arg)
{
    dial_job *r = arg;
    kvs_client *c = r->c;
    struct kvs__xfer *x = c->xfer;
    kvs_xfer_client_destroy(r->old);
    dial_out d;
    int rc = dial(c, r->closing ? r->id : 0, r->tok, &d);
    pthread_mutex_lock(&x->mu);
    x->connecting = 0;
    x->dialing = 0;
    /* answered: the old session is closed (or the server is older than
     * the close); a close made by another thread meanwhile counted it */
    if (d.answered && r->closing && x->sess_open && x->sess_id == r->id) {
        x->sess_open = 0;
        atomic_store(&x->close_pend, 0);
        x->st.sessions_closed += (unsigned long long)d.closed;
    }
    (void)dialed_locked(c, x, rc, &d, !r->first);
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
    memset(r, 0, sizeof *r);
    free(r);
    return NULL;
}

/* With x->mu: starts the Connect's thread. first: the first Connect (x is
 * NEW); else a reconnect, handed the failed transfer client (no thread uses
 * it: cli_users is 0). Without a thread, a reconnect's next wait starts, and
 * a first Connect is tried again by the next call. */
static void dial_start(kvs_client *c, struct kvs__xfer *x, int first)
{
    if (x->dial_joinable)
        pthread_join(x->dial_thr, NULL); /* ended: connecting and dialing are 0 */
    x->dial_joinable = 0;
    dial_job *r = calloc(1, sizeof *r);
    if (r == NULL) {
        if (!first)
            retry_later(x, 0);
        return;
    }
    r->c = c;
    r->first = first;
    r->old = x->cli;
    r->closing = x->sess_open;
    r->id = x->sess_id;
    memcpy(r->tok, x->sess_token, sizeof r->tok);
    x->cli = NULL;
    if (first)
        x->dialing = 1;
    else
        x->connecting = 1;
    if (pthread_create(&x->dial_thr, NULL, dial_main, r) != 0) {
        x->cli = r->old;
        x->connecting = 0;
        x->dialing = 0;
        memset(r, 0, sizeof *r);
        free(r);
        if (!first)
            retry_later(x, 0);
        return;
    }
    x->dial_joinable = 1;
}

/* The connected transfer client, or NULL (then use gRPC). Called with x->mu,
 * and returns with it. The first Connect runs on a thread of the library's
 * own (dial_start), under the client's call timeout, and every caller,
 * the one that started it included, waits for its outcome within its own
 * timeout_ms, then goes over gRPC while it goes on. Most of a first
 * Connect's time is UCX starting up (ucp_init and the worker: ~50 ms here),
 * which no deadline bounds: on the caller's thread a fetch with 50 ms or less
 * spent all of it there and failed without trying gRPC (test_connect
 * short_first_fetch); and callers beside it used to wait on x->mu for as long
 * as it took, whatever their own time (shared_first_connect).
 * After a failure (FAILED), once
 * its wait is over (retry_later), the caller starts a reconnect on a thread
 * of its own (dial_main) and goes on over gRPC, as every other caller
 * does until that thread has connected: none waits for a Connect again (a
 * frozen kvstashd made the one that did take its timeout twice: Connect,
 * then gRPC). */
static kvs_xfer_client *connect_locked(kvs_client *c, struct kvs__xfer *x, int timeout_ms)
{
    int64_t until = kvs__mono_ms() + timeout_ms;
    if (x->state == ST_NEW && !x->dialing)
        dial_start(c, x, 1);
    while (x->state == ST_NEW && x->dialing) {
        if (wait_until(&x->cv, &x->mu, until) == ETIMEDOUT && x->state == ST_NEW && x->dialing)
            return NULL;
    }
    if (x->state == ST_UP) {
        int st = kvs_xfer_client_status(x->cli);
        if (st == 0)
            return x->cli;
        fail_locked(x, st);
    }
    if (x->state == ST_FAILED) {
        /* Only when no thread still uses the old transfer client. */
        if (x->connecting || x->retry_at_ms == RETRY_NEVER || kvs__mono_ms() < x->retry_at_ms ||
            x->cli_users > 0)
            return NULL;
        dial_start(c, x, 0);
    }
    return NULL; /* NEW: no thread for the first Connect, the next call tries again */
}

/* ---- one batch ------------------------------------------------------------ */

/* One request's state, on the heap: when the caller stops waiting for it
 * (its deadline, or a failure that ended the walk early) while the request
 * still runs, on_done frees it (abandoned). */
typedef struct batch {
    kvs_xfer_fetch_req req;
    struct kvs__xfer *x;
    uint32_t n;
    uint64_t bytes; /* of receive buffers: n × cap */
    kvs_xfer_dst *dst;
    uint32_t *landed; /* layers verified, per block */
    int *bstatus;     /* per block: 0 running/ok, else its failure */
    int *bdone;
    uint8_t *seals; /* sealed fetches: each block's seal (seal_cap bytes each) */
    int done, done_status, abandoned;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} batch;

static void batch_free(batch *bt);

static void on_layer(kvs_xfer_fetch_req *r, uint32_t b, uint32_t l)
{
    batch *bt = r->data;
    pthread_mutex_lock(&bt->mu);
    bt->landed[b] = l + 1;
    pthread_cond_broadcast(&bt->cv);
    pthread_mutex_unlock(&bt->mu);
}

static void on_block(kvs_xfer_fetch_req *r, uint32_t b, int status)
{
    batch *bt = r->data;
    pthread_mutex_lock(&bt->mu);
    bt->bstatus[b] = status;
    bt->bdone[b] = 1;
    pthread_cond_broadcast(&bt->cv);
    pthread_mutex_unlock(&bt->mu);
}

static void on_done(kvs_xfer_fetch_req *r, int status)
{
    batch *bt = r->data;
    pthread_mutex_lock(&bt->mu);
    bt->done = 1;
    bt->done_status = status;
    int orphan = bt->abandoned;
    pthread_cond_broadcast(&bt->cv);
    pthread_mutex_unlock(&bt->mu);
    if (orphan) {
        /* no thread holds x->mu while it waits for this one: x->mu is never
         * held across a call that waits for the progress thread of a
         * transfer client with requests (destroy runs without it) */
        struct kvs__xfer *x = bt->x;
        pthread_mutex_lock(&x->mu);
        x->orphan_bytes -= bt->bytes;
        pthread_mutex_unlock(&x->mu);
        batch_free(bt);
    }
}

/* The largest a stored block of ns can be: every layer in the largest scheme
 * with the most outliers and sinks the format allows, key offsets included (a
 * mixed block is no larger: layers are independent). 0 when ns is invalid. */
static uint64_t stored_cap(const kvs_ns *ns)
{
    kvs_scheme *sch = malloc(ns->num_layers * sizeof *sch);
    if (sch == NULL)
        return 0;
    uint64_t best = 0;
    for (int x = KVS_SCHEME_FP16; x <= KVS_SCHEME_INT8; x++) {
        for (unsigned i = 0; i < ns->num_layers; i++)
            sch[i] = (kvs_scheme)x;
        kvs_block_params p = {.layers = ns->num_layers, .heads = ns->num_kv_heads,
                              .head_dim = ns->head_dim, .block_tokens = ns->block_tokens,
                              .src_dtype = (kvs_dtype)ns->dtype, .root = 1,
                              .schemes = sch};
        if (x != KVS_SCHEME_FP16) {
            p.k_outliers = p.v_outliers = 16;
            p.sinks = ns->block_tokens < 64 ? ns->block_tokens : 64;
            p.key_offsets = 1;
        }
        size_t n = kvs_block_size(&p);
        if (n > best)
            best = n;
    }
    free(sch);
    return best;
}

/* Layer l of a received block as kvs_get_layer_cb wants it. */
static int layer_view(const kvs_ns *ns, kvs_egress fmt, const uint8_t *buf, uint64_t cap,
                      unsigned l, const void **k, size_t *kl, const void **v, size_t *vl,
                      float *ks, float *vs, char *err)
{
    if (fmt == KVS_EGRESS_STORED) {
        kvs_block_hdr h;
        uint64_t off, n;
        const void *kt, *vt;
        size_t tl;
        if (kvs_block_check_header(buf, cap, &h, NULL) != 0 || h.num_layers != ns->num_layers ||
            h.num_kv_heads != ns->num_kv_heads || h.head_dim != ns->head_dim ||
            h.block_tokens != ns->block_tokens) {
            kvs__set_err(err, "NOT_FOUND: the block is not cached in this namespace");
            return KVS_ENOTFOUND;
        }
        if (kvs_block_layer_range(buf, cap, l, &off, &n, NULL) != 0 ||
            kvs_block_tile(buf, cap, l, KVS_TILE_K, 0, &kt, &tl, NULL) != 0 ||
            kvs_block_tile(buf, cap, l, KVS_TILE_V, 0, &vt, &tl, NULL) != 0) {
            kvs__set_err(err, "fetch: cannot locate layer %u's tiles", l);
            return KVS_EFORMAT;
        }
        const uint8_t *end = buf + off + n;
        *k = kt;
        *kl = (size_t)((const uint8_t *)vt - (const uint8_t *)kt);
        *v = vt;
        *vl = (size_t)(end - (const uint8_t *)vt);
        *ks = *vs = 0;
        return 0;
    }
    size_t want = kvs_egress_layer_bytes(ns, fmt);
    size_t per = 2 * want + (fmt == KVS_EGRESS_FP8_PER_TENSOR ? 2 * sizeof(float) : 0);
    uint32_t h[4];
    memcpy(h, buf, sizeof h); /* layer 0 has landed: it carries the header */
    if (h[0] != RHDR_MAGIC || h[1] != ns->num_layers || h[2] != (uint32_t)per ||
        h[3] != (uint32_t)((uint64_t)per >> 32)) {
        kvs__set_err(err, "NOT_FOUND: the block is not cached in this namespace");
        return KVS_ENOTFOUND;
    }
    const uint8_t *p = buf + RHDR_LEN + (size_t)l * per;
    *k = p;
    *kl = want;
    *v = p + want;
    *vl = want;
    *ks = *vs = 0;
    if (fmt == KVS_EGRESS_FP8_PER_TENSOR) {
        memcpy(ks, p + 2 * want, sizeof *ks);
        memcpy(vs, p + 2 * want + sizeof *ks, sizeof *vs);
    }
    return 0;
}

typedef struct resume_ctx {
    size_t b0;
    unsigned l0;
    kvs_get_layer_cb cb;
    void *arg;
} resume_ctx;

/* gRPC Get from (b0, l0) on: skips what the caller has seen, renumbers blocks. */
static int resume_cb(void *arg, unsigned b, unsigned l, const void *k, size_t kl, const void *v,
                     size_t vl, float ks, float vs, int last)
{
    resume_ctx *r = arg;
    if (b == 0 && l < r->l0)
        return 0;
    return r->cb(r->arg, (unsigned)(b + r->b0), l, k, kl, v, vl, ks, vs, last);
}

/* kvs_client_fetch_into's destination: layer l of block b at k_dst[b * layers + l]. */
typedef struct into_dst {
    unsigned layers;
    size_t bytes;
    void *const *k_dst, *const *v_dst;
    float *k_scale, *v_scale;
    char why[KVS_ERR_LEN]; /* into_copy_cb refused a layer: what it got */
} into_dst;

/* Copies a layer into its buffers (formats that are not decoded here, and the
 * gRPC fallback). */
static int into_copy_cb(void *arg, unsigned b, unsigned l, const void *k, size_t kl, const void *v,
                        size_t vl, float ks, float vs, int last)
{
    (void)last;
    into_dst *x = arg;
    size_t i = (size_t)b * x->layers + l;
    if (kl != x->bytes || vl != x->bytes) {
        snprintf(x->why, sizeof x->why,
                 "block %u layer %u: K %zu and V %zu bytes arrived, the format has %zu", b, l, kl,
                 vl, x->bytes);
        return 1;
    }
    if (x->k_dst[i] != k)
        memcpy(x->k_dst[i], k, kl);
    if (x->v_dst[i] != v)
        memcpy(x->v_dst[i], v, vl);
    if (x->k_scale)
        x->k_scale[i] = ks;
    if (x->v_scale)
        x->v_scale[i] = vs;
    return 0;
}

/* Client-side decode over UCX (kvs_decode_at): the fetch moves the stored
 * tiles and this adapter hands cb the layer in the asked format, decoded by
 * kvs__decode_stored_layer into scratch (K then V, 2 * bytes). transfer/ has
 * verified every tile of the layer, checksum included, on these bytes in our
 * own buffer before reporting it (and no later message may overwrite a
 * reported layer), so the decode does not hash them again (verified = 1). */
typedef struct decode_ctx {
    const kvs_ns *ns;
    kvs_egress fmt;
    size_t bytes;
    uint8_t *scratch;     /* K then V of one layer for cb; NULL with into */
    const into_dst *into; /* kvs_client_fetch_into: decode there, no cb */
    kvs_get_layer_cb cb;
    void *arg;
    int bad; /* a stored tile did not decode: the fetch answers KVS_EFORMAT */
    char *err;
} decode_ctx;

static int decode_cb(void *arg, unsigned b, unsigned l, const void *k, size_t kl, const void *v,
                     size_t vl, float ks, float vs, int last)
{
    (void)ks;
    (void)vs;
    decode_ctx *d = arg;
    const into_dst *x = d->into;
    size_t i = (size_t)b * d->ns->num_layers + l;
    uint8_t *kd = x ? x->k_dst[i] : d->scratch, *vd = x ? x->v_dst[i] : d->scratch + d->bytes;
    if (kvs__decode_stored_layer("fetch", d->ns, d->fmt, b, l, k, kl, v, vl, 1, kd, vd, d->err) !=
        0) {
        d->bad = 1;
        return 1;
    }
    if (x == NULL)
        return d->cb(d->arg, b, l, kd, d->bytes, vd, d->bytes, 0, 0, last);
    if (x->k_scale)
        x->k_scale[i] = 0; /* as the server sends for fp16/bf16/fp32 */
    if (x->v_scale)
        x->v_scale[i] = 0;
    return 0;
}

/* kvs_client_xfer_stats.corrupt: a block failed its checks over UCX (a fetch
 * refused it as DATA_LOSS, or a sealing client took it over gRPC). */
static void count_corrupt(struct kvs__xfer *x)
{
    pthread_mutex_lock(&x->mu);
    x->st.corrupt++;
    pthread_mutex_unlock(&x->mu);
}

static void batch_free(batch *bt)
{
    if (bt->dst)
        for (uint32_t i = 0; i < bt->n; i++)
            buf_put(bt->x, bt->dst[i].buf, bt->dst[i].cap);
    free(bt->dst);
    free(bt->landed);
    free(bt->bstatus);
    free(bt->bdone);
    free(bt->seals);
    pthread_mutex_destroy(&bt->mu);
    pthread_cond_destroy(&bt->cv);
    free(bt);
}

/* A session's seals (fetch_ucx takes them with the transfer client). */
typedef struct seal_ctx {
    int on;
    uint8_t key[KVS_PUTMAC_KEY_LEN];
} seal_ctx;

/* Sealed fetches: checks layer l of a block as received (buf, cap bytes),
 * fetched as key in format fmt by the request that sent nonce, against
 * kvstashd's seal (dst->seal) before anything reads the layer. With layer 0:
 * the seal's shape, then layer 0's tag (it covers the block's header), then
 * that the seal's layer ends are the ones the (now genuine) header gives,
 * which are the ranges transfer/ receives each layer into, so no later
 * message lands inside a checked layer. 0, or KVS_EUNAUTH with why in err. */
static int seal_check(const seal_ctx *sc, kvs_egress fmt, const uint8_t *key, const uint8_t *nonce,
                      const kvs_xfer_dst *dst, unsigned l, size_t index, char *err)
{
    uint32_t L = 0, rh[4] = {0};
    const char *why = NULL;
    if (kvs_fetchseal_parse(dst->seal, dst->seal_len, &L) != 0)
        why = dst->seal_len ? "a malformed seal" : "no seal";
    else if (kvs_fetchseal_check(sc->key, dst->seal, key, nonce, (uint32_t)fmt, l, dst->buf,
                                 dst->cap) != 0)
        why = "a layer whose seal does not match";
    if (why == NULL && l == 0 && fmt != KVS_EGRESS_STORED) {
        memcpy(rh, dst->buf, sizeof rh); /* RHDR: magic, layers, per-layer bytes */
        if (rh[0] != RHDR_MAGIC || rh[1] != L)
            why = "a seal whose layers are not the block's";
    }
    /* Whether the block is ns's is layer_view's question (NOT_FOUND), asked
     * of the header once it is known to be kvstashd's. */
    for (unsigned i = 0; why == NULL && l == 0 && i < L; i++) {
        uint64_t end;
        if (fmt == KVS_EGRESS_STORED) {
            uint64_t off, n;
            if (kvs_block_layer_range(dst->buf, dst->cap, i, &off, &n, NULL) != 0) {
                why = "a sealed header that does not parse";
                break;
            }
            end = off + n;
        } else {
            end = RHDR_LEN + (uint64_t)(i + 1) * ((uint64_t)rh[3] << 32 | rh[2]);
        }
        if (kvs_fetchseal_end(dst->seal, i) != end)
            why = "a seal whose layers are not the block's";
    }
    if (why == NULL)
        return 0;
    kvs__set_err(err,
                 "keys[%zu] layer %u: the UCX data plane delivered %s (fetched over gRPC "
                 "instead; UCX left)",
                 index, l, why);
    return KVS_EUNAUTH;
}

/*
 * Fetches keys[b0 .. b0 + n) over UCX and hands their layers to cb, waiting
 * until deadline (kvs__mono_ms) at most (then FALLBACK, *ucx_status
 * KVS_ETIMEDOUT). Returns 0, a final status (KVS_ENOTFOUND, KVS_EFORMAT,
 * KVS_ECANCELED, KVS_ENOMEM), or
 * FALLBACK with *fb_block / *fb_layer the first layer cb has not seen
 * (*forged 1 when a block failed its seal).
 */
#define FALLBACK 1

/* Receive buffers of abandoned fetches (batch) beyond which a client leaves
 * UCX: one batch's worth. */
#define ORPHAN_MAX BATCH_BYTES

/* The part of a call's time (deadline, kvs__mono_ms) a UCX request may take:
 * half of what is left. The rest is the gRPC fallback's when the data plane
 * does not answer in it (then the client leaves UCX, as for the transfer's
 * own op timeout): a stalled data plane costs a call half its time, not all
 * of it and the fallback's too. */
static int64_t ucx_part(int64_t deadline)
{
    int64_t now = kvs__mono_ms();
    return deadline <= now ? deadline : now + (deadline - now) / 2;
}
static int fetch_batch(struct kvs__xfer *x, kvs_xfer_client *cli, const seal_ctx *sc,
                       const kvs_ns *ns, const unsigned char (*keys)[KVS_CLIENT_KEY_LEN], size_t b0,
                       uint32_t n, uint64_t cap, kvs_egress fmt, kvs_get_layer_cb cb, void *arg,
                       size_t *fb_block, unsigned *fb_layer, int *ucx_status, int *forged,
                       int64_t deadline, char *err)
{
    *fb_block = b0;
    *fb_layer = 0;
    batch *bt = calloc(1, sizeof *bt);
    if (bt == NULL) {
        kvs__set_err(err, "out of memory");
        return KVS_ENOMEM;
    }
    bt->x = x;
    bt->n = n;
    bt->bytes = (uint64_t)n * cap;
    pthread_mutex_init(&bt->mu, NULL);
    mono_cond_init(&bt->cv);
    if ((bt->dst = calloc(n, sizeof *bt->dst)) == NULL ||
        (bt->landed = calloc(n, sizeof *bt->landed)) == NULL ||
        (bt->bstatus = calloc(n, sizeof *bt->bstatus)) == NULL ||
        (bt->bdone = calloc(n, sizeof *bt->bdone)) == NULL) {
        batch_free(bt);
        kvs__set_err(err, "out of memory");
        return KVS_ENOMEM;
    }
    /* Room for a seal of ns's layers (more than a seal holds: kvstashd
     * refuses to lend the block, which then goes over gRPC). */
    uint32_t seal_cap = sc->on && ns->num_layers <= KVS_FETCHSEAL_MAX_LAYERS
                            ? (uint32_t)KVS_FETCHSEAL_LEN(ns->num_layers)
                            : 0;
    if (seal_cap && (bt->seals = malloc((size_t)n * seal_cap)) == NULL) {
        batch_free(bt);
        kvs__set_err(err, "out of memory");
        return KVS_ENOMEM;
    }
    for (uint32_t i = 0; i < n; i++) {
        if ((bt->dst[i].buf = buf_get(x, cap)) == NULL) {
            batch_free(bt);
            kvs__set_err(err, "out of memory");
            return KVS_ENOMEM;
        }
        bt->dst[i].cap = cap;
        bt->dst[i].mem = KVS_XFER_MEM_HOST;
        if (seal_cap) {
            bt->dst[i].seal = bt->seals + (size_t)i * seal_cap;
            bt->dst[i].seal_cap = seal_cap;
        }
    }
    bt->req.format = (uint32_t)fmt;
    bt->req.nblocks = n;
    bt->req.keys = (const uint8_t *)keys[b0];
    bt->req.dst = bt->dst;
    bt->req.on_layer = on_layer;
    bt->req.on_block = on_block;
    bt->req.on_done = on_done;
    bt->req.data = bt;
    if (fmt != KVS_EGRESS_STORED) { /* layer l read at RHDR_LEN + l * per (layer_view) */
        bt->req.head_bytes = RHDR_LEN;
        bt->req.layer_bytes = 2 * (uint64_t)kvs_egress_layer_bytes(ns, fmt) +
                              (fmt == KVS_EGRESS_FP8_PER_TENSOR ? 2 * sizeof(float) : 0);
    }
    /* A sealing session's seals answer this request only: a fresh nonce,
     * which kvstashd binds into each tag (a lend made for an earlier request
     * does not check). Unsealed, none is drawn (the field stays zero). */
    if (sc->on && kvs_fetchseal_nonce(bt->req.nonce) != 0) {
        batch_free(bt);
        *ucx_status = KVS_EIO;
        return FALLBACK;
    }
    int rc = kvs_xfer_fetch(cli, &bt->req);
    if (rc != 0) {
        batch_free(bt);
        *ucx_status = rc;
        return FALLBACK;
    }
    int out = 0;
    uint64_t got_bytes = 0;
    uint32_t b = 0;
    unsigned l = 0;
    size_t want = kvs_egress_layer_bytes(ns, fmt);
    uint64_t fixed_len = fmt == KVS_EGRESS_STORED
                             ? 0
                             : RHDR_LEN + (uint64_t)ns->num_layers *
                                              (2 * want + (fmt == KVS_EGRESS_FP8_PER_TENSOR ? 8 : 0));
    /* Layers are handed on as they land: layer 0 brings the block's header
     * (stored or rendered), checked against ns before any layer is used. */
    pthread_mutex_lock(&bt->mu);
    while (b < n && out == 0) {
        /* A sealed rendered block is checked once all of it has landed: its
         * layer ranges on the wire are the data plane's word, so a message
         * still landing could otherwise overwrite a checked layer. Only a
         * block that landed whole: one that failed (a STATUS for it, say)
         * may still have receives in flight into its buffer, into the
         * ranges the seal gives its landed layers, until on_done; none of
         * its layers is handed on (it goes over gRPC from its layer 0). */
        int whole = sc->on && fixed_len, passed = 0;
        while ((bt->landed[b] <= l || whole) && !bt->bdone[b] && !bt->done && !passed)
            passed = wait_until(&bt->cv, &bt->mu, deadline) == ETIMEDOUT;
        if ((bt->landed[b] <= l || whole) && !bt->bdone[b] && !bt->done) {
            *fb_block = b0 + b; /* the data plane did not answer in time */
            *fb_layer = l;
            *ucx_status = KVS_ETIMEDOUT;
            out = FALLBACK;
            break;
        }
        int ok_block = bt->bdone[b] && bt->bstatus[b] == 0;
        if ((bt->landed[b] > l && !whole) || ok_block) {
            if (ok_block && (bt->dst[b].layers != ns->num_layers ||
                             (fixed_len && bt->dst[b].len != fixed_len))) {
                *fb_block = b0 + b;
                *fb_layer = l;
                if (sc->on) { /* the data plane's word, as below */
                    *ucx_status = KVS_ENOTFOUND;
                    out = FALLBACK;
                    break;
                }
                kvs__set_err(err, "NOT_FOUND: keys[%zu]: the block is not cached in this "
                             "namespace", b0 + b);
                out = KVS_ENOTFOUND;
                break;
            }
            pthread_mutex_unlock(&bt->mu);
            const void *k, *v;
            size_t kl, vl;
            float ks, vs;
            if (sc->on && seal_check(sc, fmt, keys[b0 + b], bt->req.nonce, &bt->dst[b], l, b0 + b,
                                     err) != 0) {
                *fb_block = b0 + b;
                *fb_layer = l;
                *ucx_status = KVS_EUNAUTH;
                *forged = 1;
                pthread_mutex_lock(&x->mu);
                x->st.forged_blocks++;
                pthread_mutex_unlock(&x->mu);
                pthread_mutex_lock(&bt->mu);
                out = FALLBACK;
                break;
            }
            int vr = layer_view(ns, fmt, bt->dst[b].buf, cap, l, &k, &kl, &v, &vl, &ks, &vs, err);
            if (vr != 0)
                out = vr;
            else if (cb(arg, (unsigned)(b0 + b), l, k, kl, v, vl, ks, vs,
                        l + 1 == ns->num_layers) != 0) {
                kvs__set_err(err, "CANCELLED: the layer callback stopped the fetch");
                out = KVS_ECANCELED;
            }
            pthread_mutex_lock(&bt->mu);
            if (out != 0 || ++l < ns->num_layers)
                continue;
            /* Every layer handed on: the block is the caller's. */
            while (!bt->bdone[b] && !bt->done && !passed)
                passed = wait_until(&bt->cv, &bt->mu, deadline) == ETIMEDOUT;
            if (!bt->bdone[b] && !bt->done) {
                *fb_block = b0 + b + 1; /* every layer of b is the caller's */
                *fb_layer = 0;
                *ucx_status = KVS_ETIMEDOUT;
                out = FALLBACK;
                break;
            }
            int st = bt->bdone[b] ? bt->bstatus[b] : bt->done_status;
            if (st == 0 && bt->dst[b].layers != ns->num_layers) {
                kvs__set_err(err, "DATA_LOSS: keys[%zu]: the block does not match its namespace",
                             b0 + b);
                out = KVS_EFORMAT;
                break;
            }
            got_bytes += bt->dst[b].len;
            b++;
            l = 0;
            if (st != 0) { /* cannot happen per xfer.h; go on over gRPC after this block */
                *fb_block = b0 + b;
                *fb_layer = 0;
                *ucx_status = st;
                out = FALLBACK;
            }
            continue;
        }
        /* Block b ended (or the whole fetch did) before layer l. */
        int st = bt->bdone[b] ? bt->bstatus[b] : bt->done_status;
        *fb_block = b0 + b;
        *fb_layer = l;
        if (sc->on && (st == KVS_ENOTFOUND || st == KVS_EFORMAT)) {
            /* A sealing client takes neither on the data plane process's
             * word: it could withhold any block as NOT_FOUND, and the checks
             * that failed ran over bytes it sent. Get, kvstashd's own answer,
             * has the block, or its NOT_FOUND or DATA_LOSS; UCX stays up (the
             * block's problem, not the path's). */
            if (st == KVS_EFORMAT)
                count_corrupt(x);
            *ucx_status = st;
            out = FALLBACK;
        } else if (st == KVS_ENOTFOUND) {
            kvs__set_err(err, "NOT_FOUND: keys[%zu]: the block is not cached", b0 + b);
            out = st;
        } else if (st == KVS_EFORMAT) {
            kvs__set_err(err, "DATA_LOSS: keys[%zu]: the block failed its checks", b0 + b);
            out = st;
            count_corrupt(x);
        } else {
            *ucx_status = st ? st : KVS_EPROTO;
            out = FALLBACK; /* KVS_ENOSPC, KVS_EUNAVAIL, KVS_ETIMEDOUT, ... */
        }
    }
    /* The buffers are ours again only after on_done. A request still
     * running (the deadline passed, or a failure ended the walk first) is
     * left to free them itself: the caller does not wait for the rest of a
     * request it no longer uses. One whose every block has ended has
     * nothing left but on_done, which the progress thread calls right after
     * the last on_block (or once its last receives end): that one is waited
     * for, within the deadline. (Leaving it made most fetches that went
     * through abandon their batch, which then missed the buffer pool and
     * counted towards ORPHAN_MAX: test_connect healthy_not_abandoned.) */
    uint32_t ended = 0;
    while (ended < n && bt->bdone[ended])
        ended++;
    for (int passed = 0; ended == n && !bt->done && !passed;)
        passed = wait_until(&bt->cv, &bt->mu, deadline) == ETIMEDOUT;
    int orphan = !bt->done;
    if (orphan) {
        /* Counted before on_done can see abandoned: it takes the bytes
         * back under x->mu (bt->mu, then x->mu, as count_corrupt). Past
         * ORPHAN_MAX left running, the data plane is not answering in the
         * callers' time: leave UCX (its buffers come back when the
         * reconnect destroys the transfer client, which ends the requests). */
        pthread_mutex_lock(&x->mu);
        x->orphan_bytes += bt->bytes;
        x->st.abandoned++;
        if (x->orphan_bytes > ORPHAN_MAX && x->state == ST_UP)
            fail_locked(x, KVS_ETIMEDOUT);
        pthread_mutex_unlock(&x->mu);
        bt->abandoned = 1;
    }
    pthread_mutex_unlock(&bt->mu);
    if (!orphan)
        batch_free(bt);
    pthread_mutex_lock(&x->mu);
    x->st.blocks += b;
    x->st.bytes += got_bytes;
    pthread_mutex_unlock(&x->mu);
    return out;
}

/*
 * kvs_client_fetch over UCX in wire format fmt, handing layers to cb; on a
 * fallback the rest goes over gRPC Get in get_fmt to get_cb (the caller's
 * format and callback: with client-side decode, fmt is KVS_EGRESS_STORED and
 * cb is decode_cb, and Get decodes by itself).
 */
static int fetch_ucx(kvs_client *c, const kvs_ns *ns,
                     const unsigned char (*keys)[KVS_CLIENT_KEY_LEN], size_t n_keys, kvs_egress fmt,
                     kvs_egress get_fmt, unsigned long long lease_id, int timeout_ms,
                     kvs_get_layer_cb cb, void *arg, kvs_get_layer_cb get_cb, void *get_arg,
                     char *err)
{
    /* One deadline for Connect, the UCX fetch and the gRPC Get after it;
     * UCX gets half of it. */
    int64_t deadline = kvs__call_deadline(c, timeout_ms);
    int64_t ucx_deadline = ucx_part(deadline);
    struct kvs__xfer *x = xfer_of(c);
    if (x == NULL) {
        kvs__set_err(err, "out of memory");
        return KVS_ENOMEM;
    }
    uint64_t cap;
    if (fmt == KVS_EGRESS_STORED) {
        cap = stored_cap(ns);
    } else {
        size_t want = kvs_egress_layer_bytes(ns, fmt);
        cap = RHDR_LEN + (uint64_t)ns->num_layers *
                             (2 * want + (fmt == KVS_EGRESS_FP8_PER_TENSOR ? 2 * sizeof(float) : 0));
    }
    seal_ctx sc = {0};
    pthread_mutex_lock(&x->mu);
    kvs_xfer_client *cli = cap ? connect_locked(c, x, kvs__call_left_ms(ucx_deadline)) : NULL;
    if (cli && x->fetch_seal == 1) {
        /* More layers than a seal holds: kvstashd lends none of ns's blocks
         * to a sealing session (KVS_EUNIMPL). That is ns's limit, not the
         * path's failure: this fetch goes over gRPC, and UCX stays up. */
        if (ns->num_layers > KVS_FETCHSEAL_MAX_LAYERS)
            cli = NULL;
        sc.on = 1;
        memcpy(sc.key, x->fetch_key, sizeof sc.key);
    }
    x->cli_users += cli != NULL;
    pthread_mutex_unlock(&x->mu);

    size_t b = 0, fb_block = 0;
    unsigned fb_layer = 0;
    int rc = cli ? 0 : FALLBACK;
    while (cli && b < n_keys && rc == 0) {
        uint64_t per_batch = BATCH_BYTES / cap;
        if (per_batch == 0)
            per_batch = 1;
        if (per_batch > KVS_XFER_MAX_BLOCKS)
            per_batch = KVS_XFER_MAX_BLOCKS;
        uint32_t nb = (uint32_t)(n_keys - b < per_batch ? n_keys - b : per_batch);
        int st = 0, forged = 0;
        rc = fetch_batch(x, cli, &sc, ns, keys, b, nb, cap, fmt, cb, arg, &fb_block, &fb_layer, &st,
                         &forged, ucx_deadline, err);
        if (rc == FALLBACK) {
            pthread_mutex_lock(&x->mu);
            /* A block too big for our buffer is that block's problem, not the
             * path's; so is one kvstashd cannot seal (KVS_EUNIMPL: more
             * layers than a seal holds, so not one of ns's blocks), and one
             * that failed its checks for a sealing client (KVS_EFORMAT) or
             * that its data plane said was not there (KVS_ENOTFOUND). A
             * block that failed its seal is a forgery whatever became of the
             * connection meanwhile (the data plane process may have stalled
             * or dropped it too): UCX is left for good, not retried. */
            int cst = kvs_xfer_client_status(cli);
            if (forged)
                fail_locked(x, KVS_EUNAUTH);
            else if (st != KVS_ENOSPC &&
                     !(sc.on && (st == KVS_EUNIMPL || st == KVS_EFORMAT || st == KVS_ENOTFOUND)))
                fail_locked(x, cst ? cst : st);
            pthread_mutex_unlock(&x->mu);
        }
        b += nb;
    }
    if (cli) {
        pthread_mutex_lock(&x->mu);
        x->cli_users--;
        pthread_mutex_unlock(&x->mu);
        if (rc != FALLBACK)
            ucx_worked(x);
    }
    if (rc == FALLBACK && fb_block >= n_keys)
        rc = 0; /* every layer was handed on before UCX failed */
    if (rc == FALLBACK) {
        pthread_mutex_lock(&x->mu);
        x->st.fallbacks++;
        pthread_mutex_unlock(&x->mu);
        if (err)
            err[0] = '\0';
        resume_ctx r = {.b0 = fb_block, .l0 = fb_layer, .cb = get_cb, .arg = get_arg};
        return kvs_client_get(c, ns, keys + fb_block, n_keys - fb_block, get_fmt, lease_id,
                              kvs__call_left_ms(deadline), resume_cb, &r, err);
    }
    /* Get would end the lease with the stream; over UCX we do, in the time
     * left (none: the lease ends by its own time) */
    if (lease_id != 0)
        (void)kvs_client_unpin(c, ns, NULL, 0, lease_id, kvs__call_left_ms(deadline), NULL, NULL);
    if (rc == 0) {
        pthread_mutex_lock(&x->mu);
        x->st.fetches++;
        pthread_mutex_unlock(&x->mu);
    }
    return rc;
}

/* Checks kvs_client_fetch's arguments; 0 or KVS_EINVAL with the message. */
static int fetch_args(const char *fn, const char *dst_name, int have_dst, kvs_client *c,
                      const kvs_ns *ns, const unsigned char (*keys)[KVS_CLIENT_KEY_LEN],
                      size_t n_keys, kvs_egress fmt, char *err)
{
    if (c == NULL || keys == NULL || n_keys == 0 || !have_dst || ns == NULL ||
        ns->num_layers == 0) {
        kvs__set_err(err, "%s: client, ns, keys (n_keys > 0) and %s are required", fn, dst_name);
        return KVS_EINVAL;
    }
    if (kvs__forked(c, fn, err) != 0)
        return KVS_EPRECOND;
    if ((int)fmt < KVS_EGRESS_STORED || fmt > KVS_EGRESS_FP8_PER_TENSOR) {
        kvs__set_err(err, "%s: format %d is not a kvs_egress", fn, (int)fmt);
        return KVS_EINVAL;
    }
    return 0;
}

/* Client-side decode over UCX (kvs_decode_at), as kvs_client_get does it:
 * into cb (scratch per layer) or, with into, straight into its buffers; a
 * fallback goes on over Get in fmt to get_cb. */
static int fetch_decoded(kvs_client *c, const kvs_ns *ns,
                         const unsigned char (*keys)[KVS_CLIENT_KEY_LEN], size_t n_keys,
                         kvs_egress fmt, unsigned long long lease_id, int timeout_ms,
                         kvs_get_layer_cb cb, void *arg, const into_dst *into,
                         kvs_get_layer_cb get_cb, void *get_arg, char *err)
{
    char derr[KVS_ERR_LEN] = "";
    decode_ctx d = {.ns = ns,
                    .fmt = fmt,
                    .bytes = kvs_egress_layer_bytes(ns, fmt),
                    .into = into,
                    .cb = cb,
                    .arg = arg,
                    .err = derr};
    if (into == NULL && (d.scratch = malloc(2 * d.bytes)) == NULL) {
        kvs__set_err(err, "out of memory");
        return KVS_ENOMEM;
    }
    int rc = fetch_ucx(c, ns, keys, n_keys, KVS_EGRESS_STORED, fmt, lease_id, timeout_ms, decode_cb,
                       &d, get_cb, get_arg, err);
    if (d.bad) { /* decode_cb stopped the fetch on a tile that does not decode */
        kvs__set_err(err, "DATA_LOSS: %s", derr);
        rc = KVS_EFORMAT;
        struct kvs__xfer *x = xfer_of(c);
        if (x != NULL) {
            count_corrupt(x);
        }
    }
    free(d.scratch);
    return rc;
}

int kvs_client_fetch(kvs_client *c, const kvs_ns *ns,
                     const unsigned char (*keys)[KVS_CLIENT_KEY_LEN], size_t n_keys, kvs_egress fmt,
                     unsigned long long lease_id, int timeout_ms, kvs_get_layer_cb cb, void *arg,
                     char *err)
{
    int rc = fetch_args("kvs_client_fetch", "cb", cb != NULL, c, ns, keys, n_keys, fmt, err);
    if (rc != 0)
        return rc;
    if (!c->ucx)
        return kvs_client_get(c, ns, keys, n_keys, fmt, lease_id, timeout_ms, cb, arg, err);
    if (!c->decode_local || fmt < KVS_EGRESS_FP16 || fmt > KVS_EGRESS_FP32)
        return fetch_ucx(c, ns, keys, n_keys, fmt, fmt, lease_id, timeout_ms, cb, arg, cb, arg,
                         err);
    return fetch_decoded(c, ns, keys, n_keys, fmt, lease_id, timeout_ms, cb, arg, NULL, cb, arg,
                         err);
}

int kvs_client_fetch_into(kvs_client *c, const kvs_ns *ns,
                          const unsigned char (*keys)[KVS_CLIENT_KEY_LEN], size_t n_keys,
                          kvs_egress fmt, unsigned long long lease_id, int timeout_ms,
                          void *const *k_dst, void *const *v_dst, float *k_scale, float *v_scale,
                          char *err)
{
    int rc = fetch_args("kvs_client_fetch_into", "k_dst, v_dst", k_dst != NULL && v_dst != NULL, c,
                        ns, keys, n_keys, fmt, err);
    if (rc != 0)
        return rc;
    size_t bytes = kvs_egress_layer_bytes(ns, fmt);
    if (bytes == 0) {
        kvs__set_err(err, "kvs_client_fetch_into: needs a fixed-size format (not STORED)");
        return KVS_EINVAL;
    }
    for (size_t i = 0; i < n_keys * ns->num_layers; i++) {
        if (k_dst[i] == NULL || v_dst[i] == NULL) {
            kvs__set_err(err, "kvs_client_fetch_into: k_dst[%zu] or v_dst[%zu] is NULL", i, i);
            return KVS_EINVAL;
        }
    }
    if (!c->ucx)
        return kvs_client_get_into(c, ns, keys, n_keys, fmt, lease_id, timeout_ms, k_dst, v_dst,
                                   k_scale, v_scale, err);
    into_dst x = {ns->num_layers, bytes, k_dst, v_dst, k_scale, v_scale, ""};
    if (!c->decode_local || fmt < KVS_EGRESS_FP16 || fmt > KVS_EGRESS_FP32)
        rc = fetch_ucx(c, ns, keys, n_keys, fmt, fmt, lease_id, timeout_ms, into_copy_cb, &x,
                       into_copy_cb, &x, err);
    else
        rc = fetch_decoded(c, ns, keys, n_keys, fmt, lease_id, timeout_ms, NULL, NULL, &x,
                           into_copy_cb, &x, err);
    if (rc == KVS_ECANCELED && x.why[0]) { /* our own copy stopped it, not a caller */
        kvs__set_err(err, "kvs_client_fetch_into: %s", x.why);
        rc = KVS_EPROTO;
    }
    return rc;
}

int kvs_client_xfer_stats_get(kvs_client *c, kvs_client_xfer_stats *out)
{
    if (c == NULL || out == NULL)
        return KVS_EINVAL;
    memset(out, 0, sizeof *out);
    if (kvs__forked(c, "kvs_client_xfer_stats_get", NULL) != 0)
        return KVS_EPRECOND; /* x->mu may be held by a thread of the parent */
    if (!c->ucx)
        return 0;
    struct kvs__xfer *x = xfer_of(c);
    if (x == NULL)
        return KVS_ENOMEM;
    pthread_mutex_lock(&x->mu);
    if (x->state == ST_UP && kvs_xfer_client_status(x->cli) != 0)
        fail_locked(x, kvs_xfer_client_status(x->cli));
    *out = x->st;
    out->close_pending = x->state == ST_FAILED && x->sess_open; /* after fail_locked */
    out->puts_unsent = x->puts_unsent;
    out->connected = x->state == ST_UP;
    out->fetch_seal = x->state == ST_UP ? x->fetch_seal : 0;
    out->ucx_status = x->state == ST_FAILED ? x->status : 0;
    out->reconnecting = x->connecting;
    out->connecting = x->dialing;
    pthread_mutex_unlock(&x->mu);
    return 0;
}

/* ---- put over UCX ---------------------------------------------------------- */

/* Statuses that say the UCX path failed, not the put: go on over gRPC. */
static int path_failure(int st)
{
    return st == KVS_EUNAVAIL || st == KVS_ETIMEDOUT || st == KVS_ECANCELED ||
           st == KVS_EUNIMPL || st == KVS_EPROTO || st == KVS_EIO || st == KVS_EUNAUTH;
}

/* How long a sealed put stays valid after it is sealed (kvstashd refuses it
 * after that: a put the data plane process held back), unless the caller's
 * timeout is longer. */
#define PUT_VALID_MS 60000

/* A put over UCX and the bytes it sends, on the heap: the caller stops
 * waiting at its deadline, and UCX reads raw until the put's answer, so the
 * last of the two (refs) frees it. */
typedef struct put_op {
    kvs_xfer_put_req req;
    uint8_t *meta, *raw;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, status, refs;
} put_op;

static put_op *put_op_new(size_t meta_len, uint64_t len)
{
    put_op *op = calloc(1, sizeof *op);
    if (op == NULL)
        return NULL;
    if ((op->meta = malloc(meta_len)) == NULL || (op->raw = malloc(len)) == NULL) {
        free(op->meta);
        free(op);
        return NULL;
    }
    pthread_mutex_init(&op->mu, NULL);
    mono_cond_init(&op->cv);
    op->refs = 1; /* the caller's */
    return op;
}

static void put_op_unref(put_op *op)
{
    pthread_mutex_lock(&op->mu);
    int last = --op->refs == 0;
    pthread_mutex_unlock(&op->mu);
    if (!last)
        return;
    free(op->meta);
    free(op->raw);
    pthread_mutex_destroy(&op->mu);
    pthread_cond_destroy(&op->cv);
    free(op);
}

static void put_op_done(kvs_xfer_put_req *r, int status)
{
    put_op *op = r->data;
    pthread_mutex_lock(&op->mu);
    op->done = 1;
    op->status = status;
    pthread_cond_broadcast(&op->cv);
    pthread_mutex_unlock(&op->mu);
    put_op_unref(op);
}

/* One put over UCX: the packed header (hdr_len bytes of op->meta, which has
 * KVS_PUTMAC_TRAILER_LEN more of room) and the seal of the session's put key
 * as metadata, op->raw (len bytes) the layers, within the call's deadline
 * (kvs__mono_ms): its answer within ucx_part of it. The server's verdict (and in
 * *reply the stored key and size it sent), or FALLBACK when the path failed
 * (no answer in time included). A seal the
 * server refuses (the data plane process changed the put), or an answer
 * whose tag is not kvstashd's (the data plane process answered for it), is
 * a path failure: the put goes over gRPC. */
static int put_over(kvs_client *c, struct kvs__xfer *x, put_op *op, size_t hdr_len, uint64_t len,
                    int64_t deadline, kvs_xfer_put_reply *reply)
{
    uint8_t *meta = op->meta;
    const uint8_t *raw = op->raw;
    int timeout_ms = kvs__call_left_ms(deadline);
    int64_t ucx_deadline = ucx_part(deadline);
    pthread_mutex_lock(&x->mu);
    kvs_xfer_client *cli = connect_locked(c, x, kvs__call_left_ms(ucx_deadline));
    if (cli != NULL && x->have_put_key && x->put_seq == UINT64_MAX) {
        fail_locked(x, KVS_EUNAVAIL); /* never reuse a number under this key */
        cli = NULL;
    }
    uint8_t key[KVS_PUTMAC_KEY_LEN];
    int sealed = cli != NULL && x->have_put_key;
    uint64_t seq = sealed ? ++x->put_seq : 0;
    int64_t off = x->clock_off_ms;
    if (sealed)
        memcpy(key, x->put_key, sizeof key);
    x->cli_users += cli != NULL; /* until the put's answer is in */
    pthread_mutex_unlock(&x->mu);
    if (cli == NULL)
        return FALLBACK;
    int rc = 0;
    kvs_xfer_put_req *req = &op->req;
    memset(req, 0, sizeof *req);
    /* key all zero: the server derives the chain key (it knows the tenant's secret) */
    req->format = KVS_XFER_FMT_STORED;
    req->buf = raw;
    req->len = len;
    req->meta = meta;
    req->meta_len = (uint32_t)hdr_len;
    req->on_done = put_op_done;
    req->data = op;
    if (sealed) {
        uint64_t valid = timeout_ms > PUT_VALID_MS ? (uint64_t)timeout_ms : PUT_VALID_MS;
        kvs_putmac_put pm = {.seq = seq,
                             .expires_ms = (uint64_t)((int64_t)kvs_putmac_now_ms() + off) + valid,
                             .ukey = req->key,
                             .fmt = req->format};
        if (kvs_putmac_seal(key, &pm, meta, hdr_len, raw, len) != 0)
            rc = FALLBACK; /* OpenSSL failed: gRPC needs no seal */
        req->meta_len += KVS_PUTMAC_TRAILER_LEN;
    }
    int unanswered = 0;
    if (rc == 0) {
        pthread_mutex_lock(&op->mu);
        op->refs++; /* the answer's */
        pthread_mutex_unlock(&op->mu);
        if ((rc = kvs_xfer_put(cli, req)) != 0) {
            pthread_mutex_lock(&op->mu);
            op->refs--; /* no answer will come */
            pthread_mutex_unlock(&op->mu);
        } else {
            int passed = 0;
            pthread_mutex_lock(&op->mu);
            while (!op->done && !passed)
                passed = wait_until(&op->cv, &op->mu, ucx_deadline) == ETIMEDOUT;
            unanswered = !op->done;
            rc = op->done ? op->status : KVS_ETIMEDOUT;
            if (op->done)
                *reply = req->reply;
            pthread_mutex_unlock(&op->mu);
        }
    }
    if (unanswered) {
        /* No answer in UCX's part of the time: the put may still be
         * stored, or held back by the data plane process. Leave UCX, as for
         * the transfer's own op timeout: the session's close comes before
         * this put goes over gRPC (the put's bytes are freed with its
         * answer, or when the reconnect destroys the transfer client). */
        memset(key, 0, sizeof key);
        pthread_mutex_lock(&x->mu);
        fail_locked(x, KVS_ETIMEDOUT);
        x->st.abandoned++;
        x->cli_users--;
        pthread_mutex_unlock(&x->mu);
        return FALLBACK;
    }
    int cst = kvs_xfer_client_status(cli);
    if (rc == FALLBACK) {
        memset(key, 0, sizeof key);
        pthread_mutex_lock(&x->mu);
        x->cli_users--;
        pthread_mutex_unlock(&x->mu);
        return FALLBACK;
    }
    int forged =
        sealed && cst == 0 && !path_failure(rc) &&
        kvs_putmac_reply_verify(key, seq, rc, reply->key, reply->stored_bytes, reply->tag) != 0;
    memset(key, 0, sizeof key);
    /* A refusal kvstashd did not sign: the transfer's own (bounce memory
     * full, too many puts pending), or one the data plane process invented
     * while it holds the put back, to deliver it after this put went over
     * gRPC and its block was deleted or evicted. The two look the same here,
     * so kvstashd voids the put first (it will never be stored), and only
     * this put goes over gRPC; if it cannot say so, the session is closed.
     * Until then this put still counts in cli_users: no reconnect may replace
     * the session it voids or fails (it would void a number of the new
     * session, or take a new, sound session off UCX). */
    if (cst == 0 && !path_failure(rc) && forged && rc != 0 && rc != KVS_EEXIST) {
        int v = void_put(c, x, seq, kvs__call_left_ms(deadline));
        pthread_mutex_lock(&x->mu);
        /* then the close, before the gRPC put; a session closed meanwhile
         * (another thread's put) can commit nothing: no forgery to count */
        if (v != 1 && x->sess_open)
            fail_locked(x, v < 0 ? v : KVS_EUNAUTH); /* not answered: try UCX again later */
        x->cli_users--;
        pthread_mutex_unlock(&x->mu);
        return FALLBACK;
    }
    pthread_mutex_lock(&x->mu);
    if (cst != 0 || path_failure(rc) || forged)
        fail_locked(x, cst ? cst : forged ? KVS_EUNAUTH : rc);
    else
        x->backoff_ms = x->retry_base; /* UCX worked: the next failure waits the least */
    x->cli_users--;
    pthread_mutex_unlock(&x->mu);
    if (cst != 0 || path_failure(rc) || forged)
        return FALLBACK; /* kvs_client_xfer_stats: ucx_status KVS_EUNAUTH when forged */
    return rc;
}

int kvs_client_put_ucx(kvs_client *c, const kvs_put_args *a, int timeout_ms, kvs_put_result *res,
                       char *err)
{
    /* one deadline for Connect, the UCX put, a void or close, and gRPC */
    int64_t deadline = c != NULL ? kvs__call_deadline(c, timeout_ms) : 0;
    kvs__pb_put ph;
    if (c == NULL || a == NULL || a->tokens == NULL || a->k == NULL || a->v == NULL ||
        kvs__put_header(a, &ph, NULL) != 0)
        return kvs_client_put(c, a, timeout_ms, res, err); /* it says what is missing */
    if (kvs__forked(c, "kvs_client_put_ucx", err) != 0)
        return KVS_EPRECOND;
    if (!c->ucx)
        return kvs_client_put(c, a, timeout_ms, res, err);
    const kvs_ns *ns = a->ns;
    struct kvs__xfer *x = xfer_of(c);
    if (x == NULL) {
        kvs__set_err(err, "out of memory");
        return KVS_ENOMEM;
    }
    Kvstash__V1__PutHeader *hdr = &ph.hdr;
    size_t meta_len = kvstash__v1__put_header__get_packed_size(hdr);
    size_t room = meta_len + KVS_PUTMAC_TRAILER_LEN; /* the seal's trailer */
    size_t lb = ph.layer_bytes;
    uint64_t len = 2 * (uint64_t)lb * ns->num_layers;
    int rc = FALLBACK;
    put_op *op = NULL;
    kvs_xfer_put_reply reply;
    memset(&reply, 0, sizeof reply);
    if (room <= KVS_XFER_MAX_META && len > 0 && (op = put_op_new(room, len)) != NULL) {
        kvstash__v1__put_header__pack(hdr, op->meta);
        for (unsigned l = 0; l < ns->num_layers; l++) {
            memcpy(op->raw + 2 * (size_t)l * lb, a->k[l], lb);
            memcpy(op->raw + (2 * (size_t)l + 1) * lb, a->v[l], lb);
        }
        rc = put_over(c, x, op, meta_len, len, deadline, &reply);
        put_op_unref(op);
    } else if (room <= KVS_XFER_MAX_META && len > 0) {
        rc = KVS_ENOMEM;
    }
    if (rc == FALLBACK) {
        pthread_mutex_lock(&x->mu);
        x->st.fallbacks++;
        pthread_mutex_unlock(&x->mu);
        return kvs_client_put(c, a, kvs__call_left_ms(deadline), res, err);
    }
    if (rc != 0 && rc != KVS_EEXIST) {
        kvs__set_err(err, "put over UCX: %s", kvs_strerror(rc));
        return rc;
    }
    if (res != NULL) { /* the UCX reply: the key and size, no per-layer quality */
        memcpy(res->key, reply.key, sizeof res->key);
        res->stored_bytes = reply.stored_bytes;
        res->already_present = rc == KVS_EEXIST;
    }
    return 0;
}
