/*
 * ucx_server.c — kvs_xfer_server: serves fetches and accepts puts over UCX
 * active messages on behalf of a store (xfer.h, docs/TRANSFER.md).
 *
 * The idea: a FETCH request names blocks; for each, the store lends the bytes
 * (provide) and the server sends one LAYER message per layer, header in the
 * AM header, bytes as the AM payload (rendezvous for anything past UCX's
 * eager limit, so the client pulls them straight into its buffer); a block
 * lent with a seal (opaque here) has it copied into layer 0's AM header,
 * after the kvs__layer_hdr (KVS__LAYER_F_SEAL). The block's reference is
 * released when the last layer send completes — with success, or with an
 * error when the endpoint was closed. A PUT's payload is
 * received by ucp_am_recv_data_nbx into the buffer the store picked; with
 * put_begin_async the store picks it on another thread while the PUT's
 * descriptor is kept (the handler returns UCS_INPROGRESS), so a store whose
 * begin takes a round trip (kvstash-xferd's parent) holds no other session.
 *
 * Invariants (all state is touched on the progress thread only):
 *  - every successful provide is matched by exactly one release: a srv_block
 *    lives until its outstanding layer sends reach zero, and a force-closed
 *    endpoint completes every pending send (with an error);
 *  - a session is freed when it is closed and its reference count (one for
 *    the session list, one per live block, put, pending put begin and status
 *    send) drops to 0;
 *  - every put_begin_async the store answers with a buffer is ended once:
 *    its receive ends it as any put's, or put_end(KVS_ECANCELED) when its
 *    session closed while the begin was pending;
 *  - a request whose (session, token) does not match gets KVS_EUNAUTH on the
 *    sender's reply endpoint and changes nothing else.
 */
#include "kv_block.h"
#include "kvs_error.h"
#include "ucx_internal.h"
#include "xproc.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>
#include <xxhash.h>
#if defined(__x86_64__)
/* XXH3_64bits becomes libxxhash's dispatching variant (AVX2 / AVX-512 when the
 * CPU has them): the same hash, about 3x faster than the SSE2 default at
 * 128 KiB on this project's x86 machines. */
#include <xxh_x86dispatch.h>
#endif

typedef struct srv_session srv_session;

/* Layer messages one session may have in flight; a fetch past it gets
 * KVS_ENOSPC for the blocks that do not fit (the client retries). Bounds the
 * server memory one client can pin with a single request. */
#define KVS__MAX_SENDS 65536u

/* Bytes of puts orphaned by a session's close that UCX has not finished
 * receiving; past it puts are refused (KVS_ENOSPC). */
#define KVS__MAX_ORPHAN_PUT_BYTES (256ull << 20)

/* Put begins one session may have pending in the store (put_begin_async);
 * past it puts are refused (KVS_ENOSPC). Each holds UCX's descriptor (an
 * eager put's bytes, or a rendezvous not yet received) and whatever the
 * store reserves for it, so a client that offers puts faster than the store
 * begins them cannot pile them up. */
#define KVS__MAX_BEGINS 256u

typedef struct srv_block {
    srv_session *s;
    kvs_xfer_block_src src;
    uint64_t *bounds; /* layers + 1 */
    uint32_t layers;
    uint32_t outstanding; /* layers not yet completed (issued or queued) */
    uint32_t next_issue;  /* next layer to send; < layers while queued */
    uint64_t req_id;
    uint32_t index; /* the block's index in its request */
    uint32_t fmt;
    int failed;
    struct srv_block *qnext; /* the session's send queue */
    uint64_t start_ms;
    struct srv_block *prev, *next;
} srv_block;

typedef struct srv_put {
    srv_session *s;
    void *ref;
    uint64_t req_id;
    uint64_t len;
    uint64_t start_ms;
    int orphan;                  /* swept: its callback ends it (KVS_ECANCELED) and frees it */
    struct kvs_xfer_server *srv; /* set when orphaned */
    struct srv_put *prev, *next;
} srv_put;

/* One in-flight send: a layer of a block, or a status reply. */
typedef struct srv_send {
    srv_block *b;                 /* NULL for a status */
    uint32_t count;               /* layers this message carries */
    srv_session *s;               /* status on a session ep (holds a ref); NULL on a reply ep */
    int orphan;                   /* its session was swept: the callback only frees it */
    struct kvs_xfer_server *srv;  /* set when orphaned */
    uint64_t orphan_ms;           /* when it was (kvs__now_ms) */
    struct srv_send *prev, *next; /* the session's sends in flight */
    union {
        kvs__layer_hdr layer;
        kvs__status_hdr status;
    } h;
    /* A STATUS's data (data_len bytes): a put's reply, or a goodbye's
     * session token (the client believes only a goodbye that carries it). */
    union {
        kvs__put_reply reply;
        uint8_t token[KVS_XFER_TOKEN_LEN];
    } d;
    uint32_t data_len;
    /* A sealed block's layer 0: its AM header, h.layer followed by the
     * block's seal (allocated with the op, so it lives until the send
     * completes and is freed with it). Empty on every other send. */
    uint8_t sealed_hdr[];
} srv_send;

struct srv_session {
    kvs_xfer_server *srv;
    uint64_t id;
    uint8_t token[KVS_XFER_TOKEN_LEN];
    void *data;
    ucp_ep_h ep;
    int closed;
    int err; /* why it failed (peer error) */
    int close_posted;
    int pumping; /* inside session_pump: a nested call leaves the work to it */
    uint32_t refs;
    uint64_t sends;            /* layer sends issued to UCX, not completed (<= window) */
    uint64_t pending;          /* layers issued or queued (bounded by KVS__MAX_SENDS) */
    srv_block *qhead, *qtail;  /* blocks with layers not yet issued, FIFO */
    struct srv_send *inflight; /* sends handed to UCX on this session's ep */
    srv_block *blocks;
    srv_put *puts;
    struct srv_begin *begins; /* put_begin_async calls not yet answered */
    uint32_t nbegins;
    kvs__xw_task close_task;
    srv_session *prev, *next; /* every session not yet freed */
};

struct kvs_xfer_server {
    kvs__xw xw;
    kvs_xfer_server_opts o;
    uint32_t window;  /* layer messages in flight per session */
    uint64_t min_msg; /* bytes a message of several layers reaches */
    /* Requests swept from closed sessions (session_sweep): freed by their
     * late callback, or at destroy once the worker is gone. */
    struct srv_send *orphan_sends;
    struct srv_put *orphan_puts;
    uint64_t orphan_put_bytes; /* of orphan_puts: buffers UCX may still write */
    srv_session *sessions;
    uint64_t next_id;
    uint64_t provides_pending; /* provide_async calls not yet done (thread only) */
    uint64_t put_ends_pending; /* put_end_async calls not yet done (thread only) */
    uint64_t put_begins_pending; /* put_begin_async calls not yet done (thread only) */
    atomic_int posting; /* provide_done / put_done / put_begun calls still inside kvs__xw_post */
    kvs_xfer_server_stats st;
    kvs__ac *ac; /* the address check; NULL: off */
    kvs__xp *xp; /* opts.isolate: UCX runs in a child process (xproc.c) */
    /* The receive queue's watchdog (opts.probe_ms; probe_*, thread only):
     * a worker of ours with an endpoint to xw's worker, the nonce of the
     * probe in flight (0: none), ticks since it was sent, whether its send
     * is still inside UCX, and whether on_wedged has been called. */
    ucp_worker_h probe_w;
    ucp_ep_h probe_ep;
    uint64_t probe_nonce, probe_next_ms;
    uint32_t probe_ticks;
    int probe_sending, probe_fired, probe_deaf;
    /* Orphaned sends UCX has not completed stuck_ms after their sweep
     * (thread only; counted each tick), and whether on_stuck was called. */
    uint64_t orphans_stuck;
    int stuck_fired;
};

/* A provide_async in flight: its completion comes back through task. */
typedef struct srv_pending {
    kvs_xfer_server *srv;
    srv_session *s; /* holds a reference */
    uint64_t req_id;
    uint32_t index, fmt;
    int status;
    kvs_xfer_block_src src;
    kvs__xw_task task;
} srv_pending;

/* A put_end_async in flight: its answer comes back through task. */
typedef struct srv_put_end {
    kvs_xfer_server *srv;
    srv_session *s; /* holds a reference */
    uint64_t req_id, len;
    int status;
    kvs_xfer_put_reply reply;
    kvs__xw_task task;
} srv_put_end;

/* A put_begin_async in flight: the put's AM descriptor is kept (the handler
 * returned UCS_INPROGRESS) until the store's answer comes back through task;
 * then its bytes are received (rendezvous) or copied (eager) into the
 * store's buffer, or the descriptor is released. */
typedef struct srv_begin {
    kvs_xfer_server *srv;
    srv_session *s; /* holds a reference */
    void *desc;     /* UCX's: a rendezvous descriptor, or persistent eager bytes */
    int rndv;
    uint64_t req_id, len, start_ms;
    int status;
    void *buf, *ref;
    kvs_xfer_put_reply reply;
    kvs__xw_task task;
    struct srv_begin *prev, *next; /* the session's pending begins */
} srv_begin;

static void session_pump(srv_session *s);
static void session_sweep(srv_session *s);

/* ---- sessions --------------------------------------------------------------- */

static void session_unref(srv_session *s)
{
    KVS_ASSERT(s->refs > 0);
    if (--s->refs)
        return;
    kvs_xfer_server *srv = s->srv;
    if (s->prev)
        s->prev->next = s->next;
    else
        srv->sessions = s->next;
    if (s->next)
        s->next->prev = s->prev;
    free(s);
}

/* Closes the endpoint (pending sends and receives complete with an error,
 * which releases their blocks and ends their puts) and drops the list's
 * reference. On the thread, outside UCX callbacks. */
static void session_close(srv_session *s)
{
    if (s->closed)
        return;
    s->closed = 1;
    s->srv->st.sessions--;
    s->refs++; /* stay alive through the callbacks the close runs */
    if (s->ep) {
        ucp_ep_h ep = s->ep;
        s->ep = NULL;
        kvs__ep_close_force(&s->srv->xw, ep);
    }
    session_pump(s); /* drops the layers still queued */
    session_sweep(s);
    /* Last: every block lent to it is released by now (an isolated parent
     * gives back what its child has not: xproc.c); puts still receiving end
     * when their receive completes (session_sweep). */
    if (s->srv->o.ops.session_end)
        s->srv->o.ops.session_end(s->srv->o.ops.ctx, s->data);
    s->refs--;
    session_unref(s);
}

static void session_close_task(void *arg)
{
    srv_session *s = arg;
    s->close_posted = 0;
    session_close(s);
    session_unref(s); /* the posted task's reference */
}

static void session_fail_later(srv_session *s)
{
    if (s->closed || s->close_posted)
        return;
    s->close_posted = 1;
    s->refs++;
    s->close_task.fn = session_close_task;
    s->close_task.arg = s;
    kvs__xw_post(&s->srv->xw, &s->close_task);
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    srv_session *s = arg;
    if (s->closed)
        return;
    s->err = kvs__status_from_ucs(status);
    s->srv->st.peer_failures++;
    session_fail_later(s); /* closing needs progress: not inside a callback */
}

static srv_session *session_auth(kvs_xfer_server *srv, uint64_t id, const uint8_t *token)
{
    for (srv_session *s = srv->sessions; s; s = s->next) {
        if (s->id != id || s->closed)
            continue;
        return kvs__token_eq(s->token, token) ? s : NULL;
    }
    return NULL;
}

/* ---- sends -------------------------------------------------------------------- */

static void block_done(srv_block *b)
{
    kvs_xfer_server *srv = b->s->srv;
    if (b->prev)
        b->prev->next = b->next;
    else
        b->s->blocks = b->next;
    if (b->next)
        b->next->prev = b->prev;
    srv->o.ops.release(srv->o.ops.ctx, b->src.ref);
    srv->st.refs_held--;
    srv->xw.active--;
    if (b->failed) {
        srv->st.blocks_failed++;
    } else {
        srv->st.blocks_sent++;
        srv->st.bytes_sent += b->bounds[b->layers];
    }
    srv_session *s = b->s;
    free(b->bounds);
    free(b);
    session_unref(s);
}

static srv_session *send_session(const srv_send *op)
{
    return op->b ? op->b->s : op->s;
}

static void send_unlink(srv_send *op)
{
    srv_session *s = send_session(op);
    if (!s)
        return;
    if (op->prev)
        op->prev->next = op->next;
    else if (s->inflight == op)
        s->inflight = op->next;
    if (op->next)
        op->next->prev = op->prev;
    op->prev = op->next = NULL;
}

static void send_finish(srv_send *op, ucs_status_t st)
{
    send_unlink(op);
    if (op->b) {
        srv_block *b = op->b;
        srv_session *s = b->s;
        s->sends--;
        s->pending -= op->count;
        if (st != UCS_OK)
            b->failed = 1;
        s->refs++; /* block_done may drop the last reference to s */
        b->outstanding -= op->count;
        if (b->outstanding == 0)
            block_done(b);
        session_pump(s);
        session_unref(s);
    } else if (op->s) {
        session_unref(op->s);
    }
    free(op);
}

static void orphan_send_free(kvs_xfer_server *srv, srv_send *op)
{
    if (op->prev)
        op->prev->next = op->next;
    else
        srv->orphan_sends = op->next;
    if (op->next)
        op->next->prev = op->prev;
    free(op);
}

static void send_cb(void *request, ucs_status_t st, void *user_data)
{
    srv_send *op = user_data;
    if (op->orphan)
        orphan_send_free(op->srv, op);
    else
        send_finish(op, st);
    ucp_request_free(request);
}

static void send_am(ucp_ep_h ep, unsigned id, srv_send *op, const void *hdr, size_t hlen,
                    const void *buf, size_t len)
{
    srv_session *s = send_session(op);
    if (s) {
        op->next = s->inflight;
        if (s->inflight)
            s->inflight->prev = op;
        s->inflight = op;
    }
    ucs_status_t st = kvs__am_send(ep, id, hdr, hlen, buf, len, 0, send_cb, op);
    if (st != UCS_INPROGRESS)
        send_finish(op, st);
}

/* A status to a session (s) or to an unauthenticated sender (reply_ep);
 * with a put's reply (may be NULL) as its data. */
static void send_status_r(kvs_xfer_server *srv, srv_session *s, ucp_ep_h reply_ep, uint64_t req_id,
                          uint32_t kind, uint32_t block, int status,
                          const kvs_xfer_put_reply *reply)
{
    ucp_ep_h ep = s ? s->ep : reply_ep;
    if (!ep || (s && s->closed))
        return;
    srv_send *op = calloc(1, sizeof *op);
    if (!op)
        return;
    (void)srv;
    op->s = s;
    if (s)
        s->refs++;
    op->h.status.req_id = req_id;
    op->h.status.kind = kind;
    op->h.status.block = block;
    op->h.status.status = status;
    if (reply) {
        memcpy(op->d.reply.key, reply->key, sizeof op->d.reply.key);
        op->d.reply.stored_bytes = reply->stored_bytes;
        memcpy(op->d.reply.tag, reply->tag, sizeof op->d.reply.tag);
        op->data_len = sizeof op->d.reply;
    } else if (kind == KVS__ST_GOODBYE && s) {
        memcpy(op->d.token, s->token, sizeof op->d.token);
        op->data_len = sizeof op->d.token;
    }
    send_am(ep, KVS__AM_STATUS, op, &op->h.status, sizeof op->h.status,
            op->data_len ? &op->d : NULL, op->data_len);
}

static void send_status(kvs_xfer_server *srv, srv_session *s, ucp_ep_h reply_ep, uint64_t req_id,
                        uint32_t kind, uint32_t block, int status)
{
    send_status_r(srv, s, reply_ep, req_id, kind, block, status, NULL);
}

/* Layer boundaries of a provided block: from the header for the stored
 * format (layer 0 also carries the header and scheme table), from the store
 * otherwise. Contiguous, covering [0, len). */
static int block_bounds(uint32_t fmt, const kvs_xfer_block_src *src, uint64_t **out,
                        uint32_t *layers)
{
    if (!src->bytes || src->len == 0)
        return KVS_EINTERNAL;
    uint32_t L;
    uint64_t *b;
    if (fmt == KVS_XFER_FMT_STORED) {
        kvs_block_hdr hdr;
        if (kvs_block_check_header(src->bytes, src->len, &hdr, NULL) != 0 ||
            hdr.total_bytes > src->len)
            return KVS_EFORMAT;
        L = hdr.num_layers;
        b = malloc(((size_t)L + 1) * sizeof *b);
        if (!b)
            return KVS_ENOMEM;
        b[0] = 0;
        /* A layer's bytes depend only on its scheme: ask kv_block.h once per
         * scheme (each call parses the header), sum, and check the end. */
        const uint8_t *table = (const uint8_t *)src->bytes + sizeof(kvs_block_hdr);
        uint64_t lbytes[KVS_SCHEME_INT8 + 1] = {0};
        uint64_t end = 0;
        for (uint32_t l = 0; l < L; l++) {
            unsigned sc = table[l];
            if (sc > KVS_SCHEME_INT8) {
                free(b);
                return KVS_EFORMAT;
            }
            if (lbytes[sc] == 0) {
                uint64_t off, bytes;
                if (kvs_block_layer_range(src->bytes, src->len, l, &off, &bytes, NULL) != 0 ||
                    (l > 0 && off != end) || bytes == 0) {
                    free(b);
                    return KVS_EFORMAT;
                }
                if (l == 0)
                    end = off; /* header + table: layer 0's message carries them */
                lbytes[sc] = bytes;
            }
            end += lbytes[sc];
            b[l + 1] = end;
        }
        if (b[L] != hdr.total_bytes) {
            free(b);
            return KVS_EFORMAT;
        }
    } else {
        L = src->layers;
        if (L == 0 || L > KVS_XFER_MAX_LAYERS || !src->bounds || src->bounds[0] != 0 ||
            src->bounds[L] != src->len)
            return KVS_EINTERNAL;
        b = malloc(((size_t)L + 1) * sizeof *b);
        if (!b)
            return KVS_ENOMEM;
        for (uint32_t l = 0; l <= L; l++) {
            b[l] = src->bounds[l];
            if (l > 0 && b[l] <= b[l - 1]) {
                free(b);
                return KVS_EINTERNAL;
            }
        }
    }
    *out = b;
    *layers = L;
    return 0;
}

/* A block the store lent (rc 0, src) or refused (rc < 0): queue its layers. */
static void block_provided(kvs_xfer_server *srv, srv_session *s, uint64_t req_id, uint32_t i,
                           uint32_t fmt, int rc, kvs_xfer_block_src src)
{
    if (rc != 0) {
        srv->st.blocks_failed++;
        send_status(srv, s, NULL, req_id, KVS__ST_BLOCK, i, rc < 0 ? rc : KVS_EINTERNAL);
        return;
    }
    srv->st.refs_held++;
    uint64_t *bounds = NULL;
    uint32_t L = 0;
    srv_block *b = NULL;
    /* The seal rides in layer 0's AM header (KVS__LAYER_F_SEAL), under UCX's
     * cap on its size: a longer one is the store's mistake. */
    if (src.seal_len > KVS_XFER_MAX_SEAL || (src.seal_len && !src.seal))
        rc = KVS_EINTERNAL;
    else
        rc = block_bounds(fmt, &src, &bounds, &L);
    if (rc == 0 && s->pending + L > KVS__MAX_SENDS)
        rc = KVS_ENOSPC;
    if (rc == 0 && !(b = calloc(1, sizeof *b)))
        rc = KVS_ENOMEM;
    if (rc != 0) {
        free(bounds);
        free(b);
        srv->o.ops.release(srv->o.ops.ctx, src.ref);
        srv->st.refs_held--;
        srv->st.blocks_failed++;
        send_status(srv, s, NULL, req_id, KVS__ST_BLOCK, i, rc);
        return;
    }
    b->s = s;
    s->refs++;
    srv->xw.active++; /* until block_done */
    b->src = src;
    b->bounds = bounds;
    b->layers = L;
    b->outstanding = L;
    b->req_id = req_id;
    b->index = i;
    b->fmt = fmt;
    b->start_ms = kvs__now_ms();
    b->next = s->blocks;
    if (s->blocks)
        s->blocks->prev = b;
    s->blocks = b;
    s->pending += L;
    if (s->qtail)
        s->qtail->qnext = b;
    else
        s->qhead = b;
    s->qtail = b;
    session_pump(s);
}

static void pending_task(void *arg)
{
    srv_pending *p = arg;
    kvs_xfer_server *srv = p->srv;
    srv_session *s = p->s;
    srv->provides_pending--;
    srv->xw.active--;
    if (s->closed) { /* nobody to send to: give the block back */
        if (p->status == 0)
            srv->o.ops.release(srv->o.ops.ctx, p->src.ref);
        srv->st.blocks_failed++;
    } else {
        block_provided(srv, s, p->req_id, p->index, p->fmt, p->status < 0 ? p->status : 0, p->src);
    }
    session_unref(s);
    free(p);
}

/* Hands a store's answer (provide_done, put_done, put_begun: any thread) to
 * the progress thread as task running fn(arg). The task may run (and destroy
 * finish waiting for it) before the post returns: destroy also waits for
 * posting to drop, the last touch of s. */
static void post_answer(kvs_xfer_server *s, kvs__xw_task *task, void (*fn)(void *), void *arg)
{
    task->fn = fn;
    task->arg = arg;
    atomic_fetch_add(&s->posting, 1);
    kvs__xw_post(&s->xw, task);
    atomic_fetch_sub(&s->posting, 1);
}

void kvs_xfer_server_provide_done(kvs_xfer_server *s, void *handle, int status,
                                  const kvs_xfer_block_src *src)
{
    srv_pending *p = handle;
    if (!s || !p)
        return;
    if (s->xp) {
        kvs__xp_provide_done(s->xp, handle, status, src);
        return;
    }
    p->status = status > 0 ? KVS_EINTERNAL : status;
    if (status == 0 && src)
        p->src = *src;
    else if (status == 0)
        p->status = KVS_EINTERNAL;
    post_answer(s, &p->task, pending_task, p);
}

static void fetch_block(kvs_xfer_server *srv, srv_session *s, uint64_t req_id, uint32_t i,
                        uint32_t fmt, const uint8_t *key, const uint8_t *nonce)
{
    if (srv->o.ops.provide_async) {
        srv_pending *p = calloc(1, sizeof *p);
        if (p) {
            p->srv = srv;
            p->s = s;
            p->req_id = req_id;
            p->index = i;
            p->fmt = fmt;
            s->refs++;
            srv->provides_pending++;
            srv->xw.active++;
            int rc = srv->o.ops.provide_async(srv->o.ops.ctx, s->data, key, fmt, nonce, p);
            if (rc == 0)
                return; /* pending_task carries on */
            s->refs--;  /* the session list still holds it */
            srv->provides_pending--;
            srv->xw.active--;
            free(p);
            if (rc < 0) {
                block_provided(srv, s, req_id, i, fmt, rc, (kvs_xfer_block_src){0});
                return;
            }
        }
    }
    kvs_xfer_block_src src = {0};
    int rc = srv->o.ops.provide(srv->o.ops.ctx, s->data, key, fmt, nonce, &src);
    block_provided(srv, s, req_id, i, fmt, rc, src);
}

/* Issues queued layer sends, oldest block first, while fewer than the window
 * are in flight. A bounded window keeps UCX's queues short: with every layer
 * of several blocks issued at once, the fragments of 100+ rendezvous
 * transfers interleave in the shared-memory FIFO and the first layer of a
 * block waits behind all of them. On a closed session the queued layers are
 * dropped (their blocks complete as failed and are released).
 * A send UCX completes at once finishes inside send_am (send_finish), which
 * calls this again: that nested call returns at once and this loop issues
 * the next send, so a long run of such sends (up to KVS__MAX_SENDS small
 * layers) costs no stack (it recursed once per message: test_xfer
 * fetch_many_small_sends). The caller holds a reference to s. */
static void session_pump(srv_session *s)
{
    kvs_xfer_server *srv = s->srv;
    if (s->pumping)
        return;
    s->pumping = 1;
    while (s->qhead && (s->closed || !s->ep || s->sends < srv->window)) {
        srv_block *b = s->qhead;
        /* One message: layer l alone when it is layer 0 (the first layer
         * arrives as early as possible), else layers l..l+k-1 up to
         * min_msg bytes (fewer, larger rendezvous transfers). */
        uint32_t l = b->next_issue, k = 1;
        if (l > 0)
            while (l + k < b->layers && b->bounds[l + k] - b->bounds[l] < srv->min_msg)
                k++;
        b->next_issue += k;
        if (b->next_issue == b->layers) {
            s->qhead = b->qnext;
            if (!s->qhead)
                s->qtail = NULL;
            b->qnext = NULL;
        }
        /* A sealed block's layer 0 carries the seal after its header. */
        size_t sealed = l == 0 && b->src.seal_len ? sizeof(kvs__layer_hdr) + b->src.seal_len : 0;
        srv_send *op = (s->closed || !s->ep) ? NULL : calloc(1, sizeof *op + sealed);
        if (!op) { /* dropped: the block fails; a live client times out on it */
            s->pending -= k;
            b->failed = 1;
            b->outstanding -= k;
            if (b->outstanding == 0)
                block_done(b);
            continue;
        }
        s->sends++;
        op->b = b;
        op->count = k;
        kvs__layer_hdr *h = &op->h.layer;
        h->req_id = b->req_id;
        h->block = b->index;
        h->layer = l;
        h->count = k;
        h->layers = b->layers;
        h->total = b->bounds[b->layers];
        h->off = b->bounds[l];
        h->len = b->bounds[l + k] - b->bounds[l];
        const uint8_t *bytes = b->src.bytes;
        if (b->fmt != KVS_XFER_FMT_STORED) {
            h->flags = KVS__LAYER_F_XXH3;
            h->sum = XXH3_64bits(bytes + h->off, h->len);
        }
        if (sealed) {
            h->flags |= KVS__LAYER_F_SEAL;
            h->seal_len = b->src.seal_len;
            memcpy(op->sealed_hdr, h, sizeof *h);
            memcpy(op->sealed_hdr + sizeof *h, b->src.seal, b->src.seal_len);
            send_am(s->ep, KVS__AM_LAYER, op, op->sealed_hdr, sealed, bytes + h->off, h->len);
        } else {
            send_am(s->ep, KVS__AM_LAYER, op, h, sizeof *h, bytes + h->off, h->len);
        }
    }
    s->pumping = 0;
}

/* After a FORCE close, UCX 1.13 should have completed every request of the
 * endpoint, but it does not always: a rendezvous send whose RTS went out and
 * whose peer died stays in the worker ("was not returned to mpool" at exit;
 * seen on posix shm with peer error handling), and its block would never be
 * released. The endpoint's lanes are gone, and with peer error handling no
 * transport reads our memory on the peer's behalf (no cma lane: the sender
 * pushes), so nothing can touch those bytes any more: release them now and
 * leave the requests as orphans whose late callbacks (if any) only free their
 * own memory.
 * Puts still receiving are the other way round: their receive
 * (ucp_am_recv_data_nbx into our buffer) is left running, not cancelled, and
 * UCX's tcp endpoint lives on after its destroy to receive ("remove TX
 * capability, but still will be able to receive data", uct_tcp_ep_destroy),
 * so the peer's data fragments (AM: a worker-address endpoint under peer
 * error handling has no RMA lane) keep landing after the close. So their
 * buffer stays the
 * store's only when UCX is done with it: put_end(KVS_ECANCELED) runs when the
 * receive completes (put_recv_cb), or at destroy once the worker is gone.
 * Ending them here gave an isolated child's bounce memory back while the
 * payload still landed there, over a block copied in for another fetch
 * (test_xproc_chaos: wrong bytes accepted). */
static void session_sweep(srv_session *s)
{
    kvs_xfer_server *srv = s->srv;
    s->refs++;
    while (s->inflight) {
        srv_send *op = s->inflight;
        send_unlink(op);
        op->orphan = 1;
        op->srv = srv;
        op->orphan_ms = kvs__now_ms();
        srv->st.orphans++;
        if (op->b) {
            srv_block *b = op->b;
            op->b = NULL;
            s->sends--;
            s->pending -= op->count;
            b->failed = 1;
            b->outstanding -= op->count;
            if (b->outstanding == 0)
                block_done(b);
        } else if (op->s) {
            op->s = NULL;
            session_unref(s);
        }
        op->next = srv->orphan_sends; /* op->prev is NULL after send_unlink */
        if (srv->orphan_sends)
            srv->orphan_sends->prev = op;
        srv->orphan_sends = op;
    }
    while (s->puts) {
        srv_put *put = s->puts;
        s->puts = put->next;
        if (s->puts)
            s->puts->prev = NULL;
        put->orphan = 1;
        put->srv = srv;
        put->prev = NULL;
        put->next = srv->orphan_puts;
        if (srv->orphan_puts)
            srv->orphan_puts->prev = put;
        srv->orphan_puts = put;
        srv->orphan_put_bytes += put->len;
        srv->st.orphans++;
        srv->xw.active--;
        session_unref(s);
    }
    session_unref(s);
}

/* ---- active message handlers ------------------------------------------------ */

static ucp_ep_h reply_ep_of(const ucp_am_recv_param_t *p)
{
    return (p->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? p->reply_ep : NULL;
}

static ucs_status_t on_fetch(void *arg, const void *header, size_t hlen, void *data, size_t len,
                             const ucp_am_recv_param_t *p)
{
    kvs_xfer_server *srv = arg;
    kvs__fetch_hdr h;
    if (hlen != sizeof h) {
        srv->st.proto_errors++;
        return UCS_OK;
    }
    memcpy(&h, header, sizeof h);
    if (h.magic != KVS__WIRE_MAGIC) {
        srv->st.proto_errors++;
        return UCS_OK;
    }
    srv_session *s = session_auth(srv, h.session, h.token);
    if (!s) {
        srv->st.auth_failures++;
        send_status(srv, NULL, reply_ep_of(p), h.req_id, KVS__ST_REQUEST, 0, KVS_EUNAUTH);
        return UCS_OK;
    }
    if ((p->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) || h.nblocks == 0 ||
        h.nblocks > KVS_XFER_MAX_BLOCKS || len != (size_t)h.nblocks * KVS_XFER_KEY_LEN) {
        srv->st.proto_errors++;
        send_status(srv, s, NULL, h.req_id, KVS__ST_REQUEST, 0, KVS_EPROTO);
        return UCS_OK; /* a rendezvous descriptor not received is dropped */
    }
    srv->st.fetch_requests++;
    s->refs++; /* a provide callback may not close it, but be safe */
    for (uint32_t i = 0; i < h.nblocks && !s->closed; i++)
        fetch_block(srv, s, h.req_id, i, h.format,
                    (const uint8_t *)data + (size_t)i * KVS_XFER_KEY_LEN, h.nonce);
    session_unref(s);
    return UCS_OK;
}

/* A put's answer: the store's put_end status and reply (a session closed
 * while a put_end_async ran gets nothing: send_status_r drops it). */
static void put_answer(kvs_xfer_server *srv, srv_session *s, uint64_t req_id, uint64_t len, int rc,
                       const kvs_xfer_put_reply *reply)
{
    if (rc == 0) {
        srv->st.puts++;
        srv->st.bytes_received += len;
    }
    send_status_r(srv, s, NULL, req_id, KVS__ST_PUT, 0, rc > 0 ? KVS_EINTERNAL : rc, reply);
}

static void put_finish(srv_put *put, ucs_status_t st)
{
    srv_session *s = put->s;
    kvs_xfer_server *srv = s->srv;
    if (put->prev)
        put->prev->next = put->next;
    else
        s->puts = put->next;
    if (put->next)
        put->next->prev = put->prev;
    srv->xw.active--;
    int status = kvs__status_from_ucs(st);
    if (status == 0 && srv->o.ops.put_end_async) {
        srv_put_end *e = calloc(1, sizeof *e);
        if (e) {
            e->srv = srv;
            e->s = s; /* takes put's reference */
            e->req_id = put->req_id;
            e->len = put->len;
            srv->put_ends_pending++;
            int rc = srv->o.ops.put_end_async(srv->o.ops.ctx, put->ref, e);
            if (rc == 0) {
                free(put);
                return; /* put_end_task answers */
            }
            srv->put_ends_pending--;
            free(e);
        }
    }
    kvs_xfer_put_reply reply;
    memset(&reply, 0, sizeof reply);
    int rc = srv->o.ops.put_end(srv->o.ops.ctx, put->ref, status, &reply);
    put_answer(srv, s, put->req_id, put->len, rc, &reply);
    free(put);
    session_unref(s);
}

static void put_end_task(void *arg)
{
    srv_put_end *e = arg;
    kvs_xfer_server *srv = e->srv;
    srv->put_ends_pending--;
    put_answer(srv, e->s, e->req_id, e->len, e->status, &e->reply);
    session_unref(e->s);
    free(e);
}

void kvs_xfer_server_put_done(kvs_xfer_server *s, void *handle, int status,
                              const kvs_xfer_put_reply *reply)
{
    if (!s || !handle)
        return;
    if (s->xp) {
        kvs__xp_put_done(s->xp, handle, status, reply);
        return;
    }
    srv_put_end *e = handle;
    e->status = status;
    if (reply)
        e->reply = *reply;
    post_answer(s, &e->task, put_end_task, e);
}

static void put_recv_cb(void *request, ucs_status_t st, size_t length, void *user_data)
{
    srv_put *put = user_data;
    if (put->orphan) {
        kvs_xfer_server *srv = put->srv;
        if (put->prev)
            put->prev->next = put->next;
        else
            srv->orphan_puts = put->next;
        if (put->next)
            put->next->prev = put->prev;
        srv->orphan_put_bytes -= put->len;
        kvs_xfer_put_reply ignored;
        memset(&ignored, 0, sizeof ignored);
        srv->o.ops.put_end(srv->o.ops.ctx, put->ref, KVS_ECANCELED, &ignored);
        free(put);
        ucp_request_free(request);
        return;
    }
    if (st == UCS_OK && length != put->len)
        st = UCS_ERR_MESSAGE_TRUNCATED;
    put_finish(put, st);
    ucp_request_free(request);
}

/* A begun put (the store's buf and ref) of session s: its bytes, desc, are
 * received into buf (rendezvous; UCX owns desc from then on) or copied
 * there (eager), and put_finish ends it. kept: its handler returned
 * UCS_INPROGRESS, so a descriptor not received is ours to release. */
static void put_start(kvs_xfer_server *srv, srv_session *s, uint64_t req_id, uint64_t len,
                      void *desc, int rndv, int kept, void *buf, void *ref)
{
    srv_put *put = calloc(1, sizeof *put);
    if (!put) {
        kvs_xfer_put_reply ignored;
        memset(&ignored, 0, sizeof ignored);
        srv->o.ops.put_end(srv->o.ops.ctx, ref, KVS_ENOMEM, &ignored);
        if (kept)
            ucp_am_data_release(srv->xw.worker, desc);
        send_status(srv, s, NULL, req_id, KVS__ST_PUT, 0, KVS_ENOMEM);
        return;
    }
    put->s = s;
    s->refs++;
    srv->xw.active++; /* until put_finish or the sweep */
    put->ref = ref;
    put->req_id = req_id;
    put->len = len;
    put->start_ms = kvs__now_ms();
    put->next = s->puts;
    if (s->puts)
        s->puts->prev = put;
    s->puts = put;
    if (rndv) {
        ucs_status_t st = kvs__am_recv(&srv->xw, desc, buf, len, put_recv_cb, put);
        if (st != UCS_INPROGRESS)
            put_finish(put, st);
        return; /* receive started: UCX owns the descriptor */
    }
    memcpy(buf, desc, len); /* arrived eagerly (small, or the first AM on a new ep) */
    if (kept)
        ucp_am_data_release(srv->xw.worker, desc);
    put_finish(put, UCS_OK);
}

static void begin_unlink(srv_begin *b)
{
    srv_session *s = b->s;
    if (b->prev)
        b->prev->next = b->next;
    else
        s->begins = b->next;
    if (b->next)
        b->next->prev = b->prev;
    s->nbegins--;
}

/* The store's answer to a put_begin_async, on the thread. A put begun for a
 * session that closed meanwhile is ended at once (KVS_ECANCELED): nobody
 * will send its bytes to a closed session's receive. */
static void put_begun_task(void *arg)
{
    srv_begin *b = arg;
    kvs_xfer_server *srv = b->srv;
    srv_session *s = b->s;
    srv->put_begins_pending--;
    srv->xw.active--;
    begin_unlink(b);
    int rc = b->status;
    if (rc == 0 && (s->closed || !s->ep || !b->buf)) {
        kvs_xfer_put_reply ignored;
        memset(&ignored, 0, sizeof ignored);
        rc = b->buf ? KVS_ECANCELED : KVS_EINTERNAL;
        srv->o.ops.put_end(srv->o.ops.ctx, b->ref, rc, &ignored);
        memset(&b->reply, 0, sizeof b->reply);
    }
    if (rc != 0) {
        /* A rendezvous descriptor released unreceived completes the sender's
         * send, as dropping it in the handler does. */
        ucp_am_data_release(srv->xw.worker, b->desc);
        send_status_r(srv, s, NULL, b->req_id, KVS__ST_PUT, 0, rc, &b->reply);
    } else {
        put_start(srv, s, b->req_id, b->len, b->desc, b->rndv, 1, b->buf, b->ref);
    }
    session_unref(s);
    free(b);
}

void kvs_xfer_server_put_begun(kvs_xfer_server *s, void *handle, int status, void *buf, void *ref,
                               const kvs_xfer_put_reply *reply)
{
    if (!s || !handle)
        return;
    if (s->xp) {
        kvs__xp_put_begun(s->xp, handle, status, buf, ref, reply);
        return;
    }
    srv_begin *b = handle;
    b->status = status > 0 ? KVS_EINTERNAL : status;
    b->buf = buf;
    b->ref = ref;
    if (reply)
        b->reply = *reply;
    post_answer(s, &b->task, put_begun_task, b);
}

/* Offers the put to the store's put_begin_async: 1 pending (the handler
 * keeps data, returning UCS_INPROGRESS), 0 answered here (refused), -1 for
 * the synchronous put_begin (declined, no memory, or eager bytes UCX does
 * not keep past the handler). */
static int put_begin_later(kvs_xfer_server *srv, srv_session *s, const kvs__put_hdr *h,
                           const void *meta, void *data, const ucp_am_recv_param_t *p)
{
    int rndv = (p->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    if (!rndv && !(p->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA))
        return -1;
    if (s->nbegins >= KVS__MAX_BEGINS) {
        send_status(srv, s, NULL, h->req_id, KVS__ST_PUT, 0, KVS_ENOSPC);
        return 0;
    }
    srv_begin *b = calloc(1, sizeof *b);
    if (!b)
        return -1;
    b->srv = srv;
    b->s = s;
    b->desc = data;
    b->rndv = rndv;
    b->req_id = h->req_id;
    b->len = h->len;
    b->start_ms = kvs__now_ms();
    s->refs++;
    b->next = s->begins;
    if (s->begins)
        s->begins->prev = b;
    s->begins = b;
    s->nbegins++;
    srv->put_begins_pending++;
    srv->xw.active++;
    int rc = srv->o.ops.put_begin_async(srv->o.ops.ctx, s->data, h->key, h->format, meta,
                                        h->meta_len, h->len, b);
    if (rc == 0)
        return 1; /* put_begun_task carries on */
    begin_unlink(b);
    srv->put_begins_pending--;
    srv->xw.active--;
    s->refs--; /* the session list still holds it */
    free(b);
    if (rc > 0)
        return -1;
    send_status(srv, s, NULL, h->req_id, KVS__ST_PUT, 0, rc);
    return 0;
}

static ucs_status_t on_put(void *arg, const void *header, size_t hlen, void *data, size_t len,
                           const ucp_am_recv_param_t *p)
{
    kvs_xfer_server *srv = arg;
    kvs__put_hdr h;
    if (hlen < sizeof h) {
        srv->st.proto_errors++;
        return UCS_OK;
    }
    memcpy(&h, header, sizeof h);
    if (h.magic != KVS__WIRE_MAGIC || h.meta_len > KVS_XFER_MAX_META ||
        hlen != sizeof h + h.meta_len) {
        srv->st.proto_errors++;
        return UCS_OK;
    }
    srv_session *s = session_auth(srv, h.session, h.token);
    if (!s) {
        srv->st.auth_failures++;
        send_status(srv, NULL, reply_ep_of(p), h.req_id, KVS__ST_PUT, 0, KVS_EUNAUTH);
        return UCS_OK;
    }
    if (h.len == 0 || h.len != len) {
        srv->st.proto_errors++;
        send_status(srv, s, NULL, h.req_id, KVS__ST_PUT, 0, KVS_EPROTO);
        return UCS_OK;
    }
    if (!srv->o.ops.put_begin || !srv->o.ops.put_end) {
        send_status(srv, s, NULL, h.req_id, KVS__ST_PUT, 0, KVS_EUNIMPL);
        return UCS_OK;
    }
    /* Puts whose session closed while UCX still received them keep their
     * buffers until UCX completes those receives (session_sweep); a peer
     * that never sends the data would pile them up. Past the bound new puts
     * are refused (the client puts over gRPC instead). */
    if (srv->orphan_put_bytes > KVS__MAX_ORPHAN_PUT_BYTES) {
        srv->st.puts_refused++;
        send_status(srv, s, NULL, h.req_id, KVS__ST_PUT, 0, KVS_ENOSPC);
        return UCS_OK;
    }
    const uint8_t *meta = (const uint8_t *)header + sizeof h;
    if (srv->o.ops.put_begin_async) {
        int later = put_begin_later(srv, s, &h, meta, data, p);
        if (later >= 0)
            return later ? UCS_INPROGRESS : UCS_OK;
    }
    void *buf = NULL, *ref = NULL;
    kvs_xfer_put_reply reply;
    memset(&reply, 0, sizeof reply);
    int rc = srv->o.ops.put_begin(srv->o.ops.ctx, s->data, h.key, h.format, meta, h.meta_len, h.len,
                                  &buf, &ref, &reply);
    if (rc != 0 || !buf) {
        send_status_r(srv, s, NULL, h.req_id, KVS__ST_PUT, 0, rc < 0 ? rc : KVS_EINTERNAL,
                      rc < 0 ? &reply : NULL);
        return UCS_OK; /* dropping the descriptor completes the sender's send */
    }
    /* An eager descriptor is UCX's again when this returns UCS_OK. */
    put_start(srv, s, h.req_id, h.len, data, (p->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0, 0,
              buf, ref);
    return UCS_OK;
}

/* ---- the receive queue's watchdog ---------------------------------------------
 *
 * UCX's shared-memory transports (posix, sysv) deliver a message by
 * reserving the next slot of the receiver's FIFO (an atomic step of its
 * head), copying the message in, then flipping the slot's owner flag; the
 * receiver reads slots in order and waits for each flag. A peer killed
 * between the two steps leaves a slot taken and never filled: this worker
 * waits on it for good, every later message (any client's FETCH, PUT,
 * rendezvous answers) stays unread, and once the FIFO is full no peer can
 * even send. Peer error handling does not help (the dead peer's endpoint is
 * closed, the slot stays). Reproduced by soak_bench's churn phase (workers
 * SIGKILLed mid-fetch over shared memory: after 10 to 150 kills every new
 * worker's fetch timed out; docs/BENCHMARKS.md "Data plane: soak").
 *
 * Nothing in UCX's API shows the FIFO's state, so the watchdog measures it:
 * a second worker of this process sends a probe (a random nonce) to this
 * one every probe_ms over the same transports a client would use. A probe
 * unread after wedge_ms of ticks (ticks, not wall time: a progress thread
 * held up elsewhere drains its backlog before its next tick) means the
 * queue is wedged, and on_wedged is called once. Only the probe in flight is
 * accepted (its nonce), so a client cannot silence the watchdog. */

static ucs_status_t on_probe(void *arg, const void *header, size_t hlen, void *data, size_t len,
                             const ucp_am_recv_param_t *p)
{
    (void)data, (void)len, (void)p;
    kvs_xfer_server *srv = arg;
    uint64_t nonce;
    if (hlen != sizeof nonce) {
        srv->st.proto_errors++;
        return UCS_OK;
    }
    memcpy(&nonce, header, sizeof nonce);
    if (nonce != 0 && nonce == srv->probe_nonce && !srv->probe_deaf)
        srv->probe_nonce = 0;
    return UCS_OK;
}

static void probe_sent(void *request, ucs_status_t st, void *user_data)
{
    (void)st;
    ((kvs_xfer_server *)user_data)->probe_sending = 0;
    ucp_request_free(request);
}

/* The probe worker and its endpoint to ours (on the thread, after start). A
 * failure leaves the watchdog off. */
static void probe_start(void *arg)
{
    kvs_xfer_server *srv = arg;
    ucp_worker_params_t wp = {0};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    const void *addr;
    size_t len;
    if (ucp_worker_create(srv->xw.ctx, &wp, &srv->probe_w) != UCS_OK) {
        srv->probe_w = NULL;
        return;
    }
    ucp_ep_params_t ep = {0};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.err_mode = srv->o.err_mode == KVS_XFER_ERR_PEER ? UCP_ERR_HANDLING_MODE_PEER
                                                       : UCP_ERR_HANDLING_MODE_NONE;
    if (kvs__xw_address(&srv->xw, &addr, &len) == 0) {
        ep.address = addr;
        if (ucp_ep_create(srv->probe_w, &ep, &srv->probe_ep) != UCS_OK)
            srv->probe_ep = NULL;
    }
    if (!srv->probe_ep) {
        ucp_worker_destroy(srv->probe_w);
        srv->probe_w = NULL;
    }
}

static void probe_stop(kvs_xfer_server *srv)
{
    if (!srv->probe_w)
        return;
    if (srv->probe_ep) {
        kvs__ep_close_force_on(srv->probe_w, srv->probe_ep);
        srv->probe_ep = NULL;
    }
    /* a probe whose send never completed: UCX frees it with the worker */
    ucp_worker_destroy(srv->probe_w);
    srv->probe_w = NULL;
}

static void say_goodbye(kvs_xfer_server *srv);

static void probe_tick(kvs_xfer_server *srv, uint64_t now)
{
    if (!srv->probe_w || srv->probe_fired)
        return;
    (void)ucp_worker_progress(srv->probe_w);
    if (srv->probe_nonce != 0) {
        uint32_t wedge = srv->o.wedge_ms ? srv->o.wedge_ms : 10000;
        if (++srv->probe_ticks >= (wedge + KVS__TICK_MS - 1) / KVS__TICK_MS) {
            srv->probe_fired = 1;
            if (srv->o.on_wedged) {
                say_goodbye(srv);
                srv->o.on_wedged(srv->o.wedged_arg);
            }
        }
        return;
    }
    if (now < srv->probe_next_ms || srv->probe_sending)
        return;
    uint64_t nonce = 0;
    while (nonce == 0)
        if (getrandom(&nonce, sizeof nonce, 0) != (ssize_t)sizeof nonce)
            nonce = kvs__xw_now_ns();
    srv->probe_nonce = nonce;
    srv->probe_ticks = 0;
    srv->probe_next_ms = now + srv->o.probe_ms;
    srv->probe_sending = 1;
    ucs_status_t st = kvs__am_send(srv->probe_ep, KVS__AM_PROBE, &nonce, sizeof nonce, NULL, 0,
                                   UCP_AM_SEND_FLAG_EAGER, probe_sent, srv);
    if (st != UCS_INPROGRESS)
        srv->probe_sending = 0; /* sent (or failed: then it is never read either) */
}

/* ---- timeouts ------------------------------------------------------------------ */

/* Before the process ends itself (on_wedged, on_stuck): every open session's
 * client is told (STATUS KVS__ST_GOODBYE with the session's id, and its token
 * as data: ids are sequential, a tenant knows its neighbours') so it leaves
 * UCX at once, instead of at its op timeout or, over shared memory, UCX's
 * keepalive (20 s); the sends get up to 200 ms. On the thread, outside UCX
 * callbacks. */
static void say_goodbye(kvs_xfer_server *srv)
{
    for (srv_session *s = srv->sessions; s; s = s->next)
        if (!s->closed && s->ep)
            send_status(srv, s, NULL, s->id, KVS__ST_GOODBYE, 0, KVS_EUNAVAIL);
    uint64_t until = kvs__now_ms() + 200;
    for (int left = 1; left && kvs__now_ms() < until;) {
        (void)ucp_worker_progress(srv->xw.worker);
        left = 0;
        for (srv_session *s = srv->sessions; s && !left; s = s->next)
            for (srv_send *op = s->inflight; op && !left; op = op->next)
                left = op->b == NULL && op->h.status.kind == KVS__ST_GOODBYE;
    }
}

/* Sends to a dead peer that UCX can never complete. Over shared memory
 * (UCX 1.13 posix, sysv) a force close discards the endpoint with a flush
 * that waits while the peer's FIFO is full, and a dead peer never drains it:
 * the send stays pending, the endpoint is never destroyed, and the dead
 * peer's segments (about 0.55 MiB) stay mapped for the life of the worker,
 * whose pending queue also keeps ucp_worker_arm busy. Over tcp the orphans
 * complete within a moment. So an orphan still pending stuck_ms after its
 * sweep is counted as stuck, and on_stuck ends the process (kvstashd starts
 * a fresh one) once stuck_max of them are, or at once while no session is
 * open (a restart then ends nothing). */
static void stuck_tick(kvs_xfer_server *srv, uint64_t now)
{
    uint64_t grace = srv->o.stuck_ms ? srv->o.stuck_ms : 10000, n = 0;
    for (srv_send *op = srv->orphan_sends; op; op = op->next)
        n += now - op->orphan_ms >= grace;
    srv->orphans_stuck = n;
    if (n == 0 || srv->stuck_fired || !srv->o.on_stuck || srv->o.stuck_max == 0)
        return;
    if (n >= srv->o.stuck_max || srv->st.sessions == 0) {
        srv->stuck_fired = 1;
        say_goodbye(srv);
        srv->o.on_stuck(srv->o.stuck_arg, n);
    }
}

static void server_tick(void *arg, uint64_t now)
{
    kvs_xfer_server *srv = arg;
    uint64_t limit = srv->o.op_timeout_ms;
    for (srv_session *s = srv->sessions; s; s = s->next) {
        if (s->closed)
            continue;
        int late = 0;
        for (srv_block *b = s->blocks; b && !late; b = b->next)
            late = now - b->start_ms > limit;
        for (srv_put *p = s->puts; p && !late; p = p->next)
            late = now - p->start_ms > limit;
        for (srv_begin *b = s->begins; b && !late; b = b->next)
            late = now - b->start_ms > limit;
        if (late) {
            srv->st.timeouts++;
            s->err = KVS_ETIMEDOUT;
            session_fail_later(s);
        }
    }
    probe_tick(srv, now);
    stuck_tick(srv, now);
}

/* ---- public API ------------------------------------------------------------- */

/* The server's side of the protocol: it receives FETCH and PUT. */
static const kvs__xw_opts server_xw = {
    .name = "kvs-xfer-srv",
    .tick = server_tick,
    /* A put's eager bytes persist past on_put: a put_begin_async keeps them
     * until the store has given their buffer. */
    .am = {{KVS__AM_FETCH, on_fetch, 0},
           {KVS__AM_PUT, on_put, UCP_AM_FLAG_PERSISTENT_DATA},
           {KVS__AM_PROBE, on_probe, 0}},
};

int kvs_xfer_server_create(const kvs_xfer_server_opts *o, kvs_xfer_server **out)
{
    if (!o || !out || !o->ops.provide || !o->ops.release)
        return KVS_EINVAL;
    if (o->err_mode != KVS_XFER_ERR_PEER && o->err_mode != KVS_XFER_ERR_NONE)
        return KVS_EINVAL;
    kvs_xfer_server *srv = calloc(1, sizeof *srv);
    if (!srv)
        return KVS_ENOMEM;
    if (o->isolate && *o->isolate) {
        int rc = kvs__xp_create(o, &srv->xp);
        if (rc != 0) {
            free(srv);
            return rc;
        }
        *out = srv;
        return 0;
    }
    srv->o = *o;
    if (!srv->o.op_timeout_ms)
        srv->o.op_timeout_ms = 30000;
    /* Defaults from A/B runs of xfer_bench at 4 MiB (docs/BENCHMARKS.md): a
     * window of 4 against 16 gave 1.26x on shm (4 of 4 pairs) and less CPU
     * per byte on both transports; 256 KiB messages against 1 MiB 1.14-1.18x
     * (4 MiB messages: 0.68x). */
    srv->window = o->window ? o->window : 4;
    srv->min_msg = o->min_msg_bytes ? o->min_msg_bytes : (256u << 10);
    /* Session ids start at a random point (48 bits, so they stay exact in
     * a double and far from wrapping): an isolated server's child is replaced
     * with a fresh server, and a caller holding a dead child's id must not
     * close the new child's session that happens to get the same number. */
    uint64_t r = 0;
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
        r = (uint64_t)kvs__xw_now_ns();
    srv->next_id = (r & ((1ull << 48) - 1)) + 1;
    srv->o.net_devices = NULL; /* read during create only */
    srv->o.tls = NULL;
    srv->o.addr_check = NULL;
    if (o->addr_check && *o->addr_check) {
        int rc = kvs__ac_create(o->addr_check, o->net_devices, o->tls, o->err_mode,
                                o->addr_check_ms, &srv->ac);
        if (rc != 0) {
            free(srv);
            return rc;
        }
    }
    /* KVS_UCX_PROBE_DEAF=1 (tests only): probes are never taken as read, as
     * on a wedged queue. */
    srv->probe_deaf = getenv("KVS_UCX_PROBE_DEAF") && atoi(getenv("KVS_UCX_PROBE_DEAF")) == 1;
    int rc = kvs__xw_open(&srv->xw, &server_xw, o->spin, o->net_devices, o->tls, srv);
    if (rc != 0) {
        kvs__ac_destroy(srv->ac);
        free(srv);
        return rc;
    }
    if (o->probe_ms)
        kvs__xw_call(&srv->xw, probe_start, srv);
    *out = srv;
    return 0;
}

int kvs_xfer_server_address(kvs_xfer_server *s, const void **addr, size_t *len)
{
    if (s && s->xp)
        return kvs__xp_address(s->xp, addr, len);
    return s ? kvs__xw_address(&s->xw, addr, len) : KVS_EINVAL;
}

typedef struct open_args {
    kvs_xfer_server *srv;
    const void *addr;
    size_t len;
    void *data;
    kvs_xfer_session_info *info;
    int rc;
} open_args;

static void open_task(void *arg)
{
    open_args *a = arg;
    kvs_xfer_server *srv = a->srv;
    srv_session *s = calloc(1, sizeof *s);
    if (!s) {
        a->rc = KVS_ENOMEM;
        return;
    }
    if (getrandom(s->token, sizeof s->token, 0) != (ssize_t)sizeof s->token) {
        free(s);
        a->rc = KVS_EIO;
        return;
    }
    s->srv = srv;
    s->data = a->data;
    a->rc = kvs__ep_create(&srv->xw, a->addr, a->len, srv->o.err_mode, on_ep_error, s, &s->ep);
    if (a->rc != 0) {
        free(s);
        return;
    }
    s->id = srv->next_id++;
    s->refs = 1;
    s->next = srv->sessions;
    if (srv->sessions)
        srv->sessions->prev = s;
    srv->sessions = s;
    srv->st.sessions++;
    a->info->id = s->id;
    memcpy(a->info->token, s->token, sizeof s->token);
}

int kvs_xfer_server_session_open(kvs_xfer_server *s, const void *client_addr, size_t len,
                                 void *session_data, kvs_xfer_session_info *info)
{
    if (!s || !client_addr || !info)
        return KVS_EINVAL;
    /* The check runs here, on the caller's thread: a helper's start or death
     * never stalls the progress thread and every other session. */
    if (len < 8 || len > 65536)
        return KVS_EINVAL;
    if (s->xp)
        return kvs__xp_session_open(s->xp, client_addr, len, session_data, info);
    if (s->ac) {
        int rc = kvs__ac_check(s->ac, client_addr, len);
        if (rc != 0)
            return rc;
    }
    open_args a = {s, client_addr, len, session_data, info, 0};
    kvs__xw_call(&s->xw, open_task, &a);
    return a.rc;
}

void *kvs_xfer_server_buffer(kvs_xfer_server *s, uint64_t len)
{
    if (!s || len == 0)
        return NULL;
    return s->xp ? kvs__xp_buffer(s->xp, len) : malloc(len);
}

void kvs_xfer_server_buffer_free(kvs_xfer_server *s, void *buf, uint64_t len)
{
    if (!s || !buf)
        return;
    if (s->xp)
        kvs__xp_buffer_free(s->xp, buf, len);
    else
        free(buf);
}

typedef struct close_args {
    kvs_xfer_server *srv;
    uint64_t id;
    int rc;
} close_args;

static void close_task(void *arg)
{
    close_args *a = arg;
    for (srv_session *s = a->srv->sessions; s; s = s->next) {
        if (s->id == a->id && !s->closed) {
            session_close(s);
            return;
        }
    }
    a->rc = KVS_ENOTFOUND;
}

int kvs_xfer_server_session_close(kvs_xfer_server *s, uint64_t id)
{
    if (!s)
        return KVS_EINVAL;
    if (s->xp)
        return kvs__xp_session_close(s->xp, id);
    close_args a = {s, id, 0};
    kvs__xw_call(&s->xw, close_task, &a);
    return a.rc;
}

typedef struct stats_args {
    kvs_xfer_server *srv;
    kvs_xfer_server_stats *st;
} stats_args;

static void stats_task(void *arg)
{
    stats_args *a = arg;
    *a->st = a->srv->st;
    a->st->orphan_put_bytes = a->srv->orphan_put_bytes;
    a->st->orphans_stuck = a->srv->orphans_stuck;
}

int kvs_xfer_server_stats_get(kvs_xfer_server *s, kvs_xfer_server_stats *st)
{
    if (!s || !st)
        return KVS_EINVAL;
    if (s->xp)
        return kvs__xp_stats(s->xp, st);
    memset(st, 0, sizeof *st);
    stats_args a = {s, st};
    kvs__xw_call(&s->xw, stats_task, &a);
    kvs__ac_stats(s->ac, st);
    return 0;
}

static void shutdown_task(void *arg)
{
    kvs_xfer_server *srv = arg;
    srv_session *s = srv->sessions;
    while (s) {
        s->refs++; /* keep s while closing; its neighbours may be freed */
        session_close(s);
        srv_session *next = s->next;
        session_unref(s);
        s = next;
    }
    /* Pending provide_async, put_end_async and put_begin_async calls: the
     * store promised to finish each one; their completions arrive as tasks
     * (their sessions are closed now, so each block is released and each
     * begun put ended at once). */
    while (srv->provides_pending || srv->put_ends_pending || srv->put_begins_pending ||
           atomic_load(&srv->posting)) {
        kvs__xw_run_tasks(&srv->xw);
        if (srv->provides_pending || srv->put_ends_pending || srv->put_begins_pending ||
            atomic_load(&srv->posting))
            usleep(1000);
    }
    /* Force-closed endpoints complete their requests; give stragglers a
     * moment of progress before the worker goes away. */
    uint64_t until = kvs__now_ms() + 1000;
    while (srv->sessions && kvs__now_ms() < until)
        ucp_worker_progress(srv->xw.worker);
    probe_stop(srv);
}

void kvs_xfer_server_destroy(kvs_xfer_server *s)
{
    if (!s)
        return;
    if (s->xp) {
        kvs__xp_destroy(s->xp);
        free(s);
        return;
    }
    kvs__xw_call(&s->xw, shutdown_task, s);
    kvs__xw_fini(&s->xw);
    kvs__ac_destroy(s->ac);
    /* Whatever UCX never completed: nothing references the bytes now. */
    while (s->sessions) {
        srv_session *ss = s->sessions;
        while (ss->blocks) {
            srv_block *b = ss->blocks;
            ss->blocks = b->next;
            s->o.ops.release(s->o.ops.ctx, b->src.ref);
            free(b->bounds);
            free(b);
        }
        while (ss->puts) {
            srv_put *p = ss->puts;
            ss->puts = p->next;
            kvs_xfer_put_reply ignored;
            memset(&ignored, 0, sizeof ignored);
            s->o.ops.put_end(s->o.ops.ctx, p->ref, KVS_ECANCELED, &ignored);
            free(p);
        }
        s->sessions = ss->next;
        free(ss);
    }
    while (s->orphan_sends) {
        srv_send *op = s->orphan_sends;
        s->orphan_sends = op->next;
        free(op);
    }
    while (s->orphan_puts) { /* receives UCX never completed: the worker is gone now */
        srv_put *p = s->orphan_puts;
        s->orphan_puts = p->next;
        kvs_xfer_put_reply ignored;
        memset(&ignored, 0, sizeof ignored);
        s->o.ops.put_end(s->o.ops.ctx, p->ref, KVS_ECANCELED, &ignored);
        free(p);
    }
    free(s);
}
