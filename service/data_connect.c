/*
 * data_connect.c — the UCX data plane inside kvstashd: the kvs_xfer_server
 * (transfer/xfer.h), its store callbacks, the Connect RPC and its figures.
 *
 * The idea: gRPC stays the control plane. Connect trades the worker's UCX
 * address for ours plus a session (id, random token) bound to the caller's
 * tenant; the worker then fetches blocks over UCX, layer by layer, straight
 * into its buffers.
 *
 * Invariants (the same rules as data_get.c):
 *   - a block is served only to a session of the tenant that stored it; any
 *     other block answers KVS_ENOTFOUND, exactly like one that does not exist
 *     (UCX requests carry no namespace, so the tenant is the boundary here;
 *     chain keys also commit to the tenant's secret, DESIGN §2);
 *   - the stored format (EGRESS_STORED) is lent straight from the store under
 *     a read reference (kvs_store_read) held until the transfer releases it;
 *   - the other egress formats (1..4) are rendered through the codec (on the
 *     transfer's progress thread, or with KVS_UCX_RENDER_POOL=1 on the ingest
 *     pool through provide_async) into a buffer this file owns: a 16-byte header (RHDR below), then
 * layer by layer [K][V] (format 4 adds the fp32 k_scale and v_scale after V); the store reference
 * is dropped at once. libkvstash (clients/c/xfer.c) reads the same layout;
 *   - a put over UCX carries a packed PutHeader as its metadata and the raw
 *     layers (per layer [K][V], source dtype) as its bytes; put_begin checks
 *     the header with kvs__put_header, gRPC Put's own check, for the session's
 *     tenant (same refusals, as KVS_E* statuses), and reserves the block in
 *     the store before any byte moves; put_end quantizes the staged layers
 *     into the reservation (codec, as Put's ingest does: the layers on the
 *     ingest pool, encode_put), checks the block and
 *     commits it, or aborts it on any failure. A block already cached answers
 *     KVS_EEXIST at put_begin (nothing is sent). Either answer carries the
 *     block's chain key and stored size (kvs_xfer_put_reply), as Put's reply
 *     does. The UCX key must be the
 *     block's chain key (it is the claimed key: checked like PutHeader.key)
 *     or all zero (then unchecked). put_end runs on a thread of its own
 *     (put_end_async, s->put_ends: as many as ingest_threads), so the
 *     transfer's thread goes on with other puts and fetches meanwhile;
 *     KVS_UCX_PUT_SYNC=1 ends puts on that thread instead (A/B only).
 *   - every UCX put is sealed (common/kvs_putmac.h) with a key Connect gave
 *     the worker over gRPC, which the data plane process (kvstash-xferd with
 *     ucx_isolate) never sees: that process knows each session's id and
 *     token and relays every put and answer, so without the seals it could
 *     start puts of its own under any open session, change a put's header
 *     or bytes, hold a put back for later, or answer the worker falsely.
 *     put_begin checks the header tag, the expiry and that the sequence
 *     number is new (it is used up then, whatever becomes of the put)
 *     before it reads the header; put_end checks the put tag against the
 *     staged bytes and the expiry again before it quantizes anything
 *     (KVS_EUNAUTH: libkvstash then puts over gRPC). Every answer to a put
 *     whose header tag checked carries the answer's tag (reply_seal);
 *   - a session's data (ucx_sess: tenant, put key, window) is shared by the
 *     session and its puts in flight, reference counted: a put may end after
 *     its session (when UCX completes its receive);
 *   - the session's tenant pointer lives in the tenant table, which lives from
 *     start to stop; the xfer server is destroyed before the table and store.
 * The store callbacks run on the xfer server's progress thread; the store has
 * its own lock. A read that promotes a block from the SSD tier does its I/O on
 * that thread (it stalls other UCX sessions for that long).
 */
#include "codec.h"
#include "data_int.h"
#include "kvs_log.h"
#include "kvs_netdev.h"
#include "kvs_putmac.h"
#include "pool.h"
#include "xfer.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#define MOD "ucx"

/* A UCX session as kvstashd sees it (the xfer server's session_data). */
typedef struct ucx_sess {
    kvs_server *srv;
    const kvs_tenant *tenant;
    /* What Connect gave the client (id, token): a close names the session
     * by them. Listed in srv->ucx_sessions (under srv->ucx_sess_mu) from
     * Connect's answer until the last reference goes, so a close finds a
     * session whose puts are still in flight after its end. */
    uint64_t id;
    uint8_t token[KVS_XFER_TOKEN_LEN];
    struct ucx_sess *prev, *next;
    int listed;
    uint8_t put_key[KVS_PUTMAC_KEY_LEN]; /* sent to the worker by Connect only */
    /* Sealed fetches (Connect's seal_fetches, with ucx_isolate): every block
     * lent to the session carries tags under fetch_key (kvs_putmac.h), lend
     * numbering the lends (the tags' IVs). Set before the session opens. */
    int seal;
    uint8_t fetch_key[KVS_PUTMAC_KEY_LEN];
    atomic_uint_fast64_t lends;
    pthread_mutex_t mu;                  /* guards win, closed, committing */
    pthread_cond_t idle;                 /* committing reached 0 */
    kvs_putmac_window win;
    int closed;           /* its client closed it (Connect close_session_id): nothing commits */
    unsigned committing;  /* puts past the closed check and not yet committed */
    struct ucx_put *puts; /* begun and not yet freed (a void looks for its put here) */
    atomic_int ended;     /* session_end ran: the transfer has forgotten the id */
    atomic_uint refs;     /* the session (until session_end) + each put in flight */
} ucx_sess;

static ucx_sess *sess_new(kvs_server *s, const kvs_tenant *t, int seal)
{
    ucx_sess *u = calloc(1, sizeof *u);
    if (u == NULL)
        return NULL;
    if (kvs_putmac_keygen(u->put_key) != 0 ||
        (seal && kvs_fetchseal_key(u->put_key, u->fetch_key) != 0)) {
        OPENSSL_cleanse(u, sizeof *u);
        free(u);
        return NULL;
    }
    u->seal = seal;
    u->srv = s;
    u->tenant = t;
    pthread_mutex_init(&u->mu, NULL);
    pthread_cond_init(&u->idle, NULL);
    atomic_init(&u->refs, 1);
    return u;
}

static void sess_unref(ucx_sess *u)
{
    if (atomic_fetch_sub_explicit(&u->refs, 1, memory_order_acq_rel) != 1)
        return;
    if (u->listed) { /* sess_find takes no reference from 0: u is ours alone now */
        kvs_server *s = u->srv;
        pthread_mutex_lock(&s->ucx_sess_mu);
        if (u->prev)
            u->prev->next = u->next;
        else
            s->ucx_sessions = u->next;
        if (u->next)
            u->next->prev = u->prev;
        pthread_mutex_unlock(&s->ucx_sess_mu);
    }
    pthread_cond_destroy(&u->idle);
    pthread_mutex_destroy(&u->mu);
    OPENSSL_cleanse(u->put_key, sizeof u->put_key);
    OPENSSL_cleanse(u->fetch_key, sizeof u->fetch_key);
    memset(u->token, 0, sizeof u->token);
    free(u);
}

/* Lists u (Connect's answer gave its client id and token). */
static void sess_list(ucx_sess *u, const kvs_xfer_session_info *info)
{
    kvs_server *s = u->srv;
    u->id = info->id;
    memcpy(u->token, info->token, sizeof u->token);
    pthread_mutex_lock(&s->ucx_sess_mu);
    u->listed = 1;
    u->prev = NULL;
    u->next = s->ucx_sessions;
    if (u->next)
        u->next->prev = u;
    s->ucx_sessions = u;
    pthread_mutex_unlock(&s->ucx_sess_mu);
}

/* Tenant t's session with this id and token, with a reference of the
 * caller's; NULL when there is none (ended and nothing of it in flight, never
 * opened, another tenant's, or a wrong token). */
static ucx_sess *sess_find(kvs_server *s, const kvs_tenant *t, uint64_t id,
                           const uint8_t token[KVS_XFER_TOKEN_LEN])
{
    ucx_sess *found = NULL;
    pthread_mutex_lock(&s->ucx_sess_mu);
    for (ucx_sess *u = s->ucx_sessions; u != NULL && found == NULL; u = u->next) {
        if (u->id != id || u->tenant != t || CRYPTO_memcmp(u->token, token, sizeof u->token) != 0)
            continue;
        unsigned r = atomic_load_explicit(&u->refs, memory_order_relaxed);
        while (r != 0 && !atomic_compare_exchange_weak_explicit(
                             &u->refs, &r, r + 1, memory_order_acq_rel, memory_order_relaxed))
            ;
        if (r != 0)
            found = u;
    }
    pthread_mutex_unlock(&s->ucx_sess_mu);
    return found;
}

/* Under u->mu: waits until no put of u is between commit_enter and
 * commit_leave (a commit is quick: the store's insert). */
static void commits_drain_locked(ucx_sess *u)
{
    while (u->committing > 0)
        pthread_cond_wait(&u->idle, &u->mu);
}

/* Its client closed u: from here no put of it commits. Waits for the puts
 * already past the check (their commit is quick: the store's insert), so
 * that when Connect answers, none of them can still store a block. */
static void sess_close(kvs_server *s, ucx_sess *u)
{
    pthread_mutex_lock(&u->mu);
    u->closed = 1;
    commits_drain_locked(u);
    pthread_mutex_unlock(&u->mu);
    if (!atomic_load_explicit(&u->ended, memory_order_acquire))
        (void)kvs_xfer_server_session_close(s->xfer, u->id); /* KVS_ENOTFOUND: it just ended */
}

/* Counts a put refused because its client had closed its session. */
static int put_closed(kvs_server *s)
{
    atomic_fetch_add_explicit(&s->data.put_closed, 1, memory_order_relaxed);
    return KVS_ECANCELED;
}

/* Before put p of u commits: 0 (then commit_leave), or KVS_ECANCELED when
 * its client has closed u or voided p. */
static int commit_enter(ucx_sess *u, const int *voided)
{
    pthread_mutex_lock(&u->mu);
    int refused = u->closed || *voided;
    u->committing += !refused;
    pthread_mutex_unlock(&u->mu);
    return refused ? put_closed(u->srv) : 0;
}

static void commit_leave(ucx_sess *u)
{
    pthread_mutex_lock(&u->mu);
    if (--u->committing == 0)
        pthread_cond_broadcast(&u->idle);
    pthread_mutex_unlock(&u->mu);
}

static void session_end(void *ctx, void *session_data)
{
    (void)ctx;
    ucx_sess *u = session_data;
    atomic_store_explicit(&u->ended, 1, memory_order_release);
    sess_unref(u);
}

/* One provided block: a store reference (stored format) or a rendered copy. */
typedef struct lent {
    kvs_store *store;
    kvs_store_ref ref;
    int have_ref;
    /* Rendered formats: from kvs_xfer_server_buffer (the isolated data plane
     * then sends them in place instead of copying them into its bounce
     * memory), or from the heap when that has none left. */
    kvs_xfer_server *xfer;
    void *buf;
    uint64_t buf_len;
    int buf_heap;
    uint64_t *bounds; /* layers + 1 */
    uint8_t *seal;    /* the session seals its fetches: seal_block */
} lent;

static void lent_free(lent *l)
{
    if (l->have_ref)
        kvs_store_read_release(l->store, &l->ref);
    if (l->buf_heap)
        free(l->buf);
    else
        kvs_xfer_server_buffer_free(l->xfer, l->buf, l->buf_len);
    free(l->bounds);
    free(l->seal);
    free(l);
}

/* A block lent to a session that seals its fetches (Connect's seal_fetches,
 * ucx_isolate): one tag per layer, as the transfer sends the layers, under
 * the session's fetch key (kvs_putmac.h), bound to the nonce of the request
 * it answers, so the data plane process can neither change what it relays
 * nor answer a request with a lend made for an earlier one unnoticed. The
 * nonce comes through that process untrusted: one it changed gives a seal
 * the worker's own nonce does not check. Costs one GMAC pass over the block
 * here (about 10 GB/s a core). A block of more layers than a seal holds is
 * refused with KVS_EUNIMPL (the worker gets it over gRPC). */
_Static_assert(KVS_XFER_NONCE_LEN == KVS_FETCHSEAL_NONCE_LEN, "a request's nonce is the seal's");
static int seal_block(ucx_sess *u, lent *l, const uint8_t key[KVS_XFER_KEY_LEN],
                      const uint8_t nonce[KVS_XFER_NONCE_LEN], uint32_t fmt,
                      kvs_xfer_block_src *src)
{
    if (!u->seal)
        return 0;
    uint64_t ends[KVS_FETCHSEAL_MAX_LAYERS];
    uint32_t n = src->layers;
    if (fmt == KVS_XFER_FMT_STORED) {
        int rc =
            kvs_codec_layer_ends(src->bytes, src->len, ends, KVS_FETCHSEAL_MAX_LAYERS, &n, NULL);
        if (rc != 0)
            return rc == KVS_ENOSPC ? KVS_EUNIMPL : rc;
    } else if (n == 0 || n > KVS_FETCHSEAL_MAX_LAYERS) {
        return KVS_EUNIMPL;
    } else {
        memcpy(ends, src->bounds + 1, n * sizeof *ends);
    }
    if ((l->seal = malloc(KVS_FETCHSEAL_LEN(n))) == NULL)
        return KVS_ENOMEM;
    uint64_t lend = atomic_fetch_add_explicit(&u->lends, 1, memory_order_relaxed) + 1;
    int rc = kvs_fetchseal_make(u->fetch_key, key, nonce, fmt, lend, n, ends, src->bytes, l->seal);
    if (rc != 0)
        return rc;
    src->seal = l->seal;
    src->seal_len = (uint32_t)KVS_FETCHSEAL_LEN(n);
    atomic_fetch_add_explicit(&u->srv->data.fetch_sealed, 1, memory_order_relaxed);
    return 0;
}

/* A rendered block starts with 16 bytes: magic, layers, per-layer bytes (64-bit,
 * low word first), as uint32 in host order (little-endian hosts; clients/c/xfer.c
 * reads the same), so a worker can check the layout with layer 0 and use each
 * layer as it lands. */
#define RHDR_MAGIC 0x5253564Bu /* "KVSR" */
#define RHDR_LEN 16u

/* Renders l's block in fmt into l->buf. In the data plane's buffer
 * (kvs_xfer_server_buffer: with ucx_isolate, bounce memory, which
 * kvstash-xferd maps read-write), so it is lent in place; for a session that
 * seals its fetches (sealed) in our own memory instead, since seal_block
 * tags what it reads there: the data plane process could write its own bytes
 * over the render before they are read, and have them sealed as ours. The
 * transfer then copies the sealed block into bounce memory (a copy it may
 * change, which the worker's check catches). */
static int render(lent *l, uint32_t fmt, int sealed, kvs_xfer_block_src *src)
{
    kvs_codec_info ci;
    char err[KVS_ERR_LEN] = "";
    if (kvs_codec_block_info(l->ref.data, l->ref.size, &ci, err) != 0)
        return KVS_EFORMAT;
    size_t bytes = kvs_codec_egress_bytes(ci.block_tokens, ci.heads, ci.head_dim, fmt);
    if (bytes == 0)
        return KVS_EINVAL;
    size_t per = 2 * bytes + (fmt == 4 ? 2 * sizeof(float) : 0);
    l->buf_len = RHDR_LEN + per * ci.layers;
    if (sealed || (l->buf = kvs_xfer_server_buffer(l->xfer, l->buf_len)) == NULL) {
        l->buf = malloc(l->buf_len);
        l->buf_heap = 1;
    }
    if (l->buf == NULL || (l->bounds = malloc((ci.layers + 1u) * sizeof *l->bounds)) == NULL)
        return KVS_ENOMEM;
    uint8_t *p = (uint8_t *)l->buf + RHDR_LEN;
    uint32_t hdr[4] = {RHDR_MAGIC, ci.layers, (uint32_t)per, (uint32_t)(per >> 32)};
    memcpy(l->buf, hdr, RHDR_LEN);
    for (uint32_t li = 0; li < ci.layers; li++) {
        const void *k, *v;
        size_t kl, vl;
        float ks = 0, vs = 0;
        uint8_t *kb = p + (size_t)li * per, *vb = kb + bytes;
        int rc = kvs_codec_egress_layer(l->ref.data, l->ref.size, li, fmt, kb, vb, &k, &kl, &v,
                                        &vl, &ks, &vs, err);
        if (rc != 0)
            return rc;
        if (kl != bytes || vl != bytes)
            return KVS_EINTERNAL;
        if (fmt == 4) {
            memcpy(vb + bytes, &ks, sizeof ks);
            memcpy(vb + bytes + sizeof ks, &vs, sizeof vs);
        }
        l->bounds[li] = li ? RHDR_LEN + (uint64_t)li * per : 0; /* layer 0 carries the header */
    }
    l->bounds[ci.layers] = RHDR_LEN + (uint64_t)ci.layers * per;
    kvs_store_read_release(l->store, &l->ref);
    l->have_ref = 0;
    src->bytes = l->buf;
    src->len = RHDR_LEN + (uint64_t)ci.layers * per;
    src->layers = ci.layers;
    src->bounds = l->bounds;
    return 0;
}

/* Takes a read reference to the session tenant's block `key` into a fresh
 * lent (*out); another tenant's block is KVS_ENOTFOUND, as if absent. */
static int lend_block(kvs_server *s, const kvs_tenant *t, const uint8_t key[KVS_XFER_KEY_LEN],
                      lent **out)
{
    lent *l = calloc(1, sizeof *l);
    if (l == NULL)
        return KVS_ENOMEM;
    l->store = s->store;
    l->xfer = s->xfer;
    kvs_key k;
    memcpy(k.b, key, KVS_KEY_LEN);
    int rc = kvs_store_read(s->store, &k, &l->ref);
    if (rc != 0) {
        free(l);
        return rc;
    }
    l->have_ref = 1;
    if (l->ref.tenant != t->id) {
        lent_free(l);
        return KVS_ENOTFOUND; /* not this tenant's: as if absent */
    }
    *out = l;
    return 0;
}

static int provide(void *ctx, void *session_data, const uint8_t key[KVS_XFER_KEY_LEN], uint32_t fmt,
                   const uint8_t nonce[KVS_XFER_NONCE_LEN], kvs_xfer_block_src *src)
{
    if (fmt > 4)
        return KVS_EINVAL;
    lent *l;
    int rc = lend_block(ctx, ((ucx_sess *)session_data)->tenant, key, &l);
    if (rc != 0)
        return rc;
    memset(src, 0, sizeof *src);
    if (fmt == KVS_XFER_FMT_STORED) {
        src->bytes = l->ref.data;
        src->len = l->ref.size;
    } else {
        rc = render(l, fmt, ((ucx_sess *)session_data)->seal, src);
    }
    if (rc == 0)
        rc = seal_block(session_data, l, key, nonce, fmt, src);
    if (rc != 0) {
        lent_free(l);
        return rc;
    }
    src->ref = l; /* counted by the xfer server (kvstash_xfer_*), not in Get's figures */
    return 0;
}

static void release(void *ctx, void *ref)
{
    (void)ctx;
    lent_free(ref);
}

/* A job for the ingest pool from the data plane's threads, which may run
 * while the server stops it (server_internal.h, ingest_mu). 0, or non-zero
 * when the pool is gone, stopping or out of memory (the caller does the work
 * itself). */
static int ingest_submit(kvs_server *s, void (*fn)(void *), void *arg)
{
    pthread_mutex_lock(&s->ingest_mu);
    int rc = s->ingest != NULL ? kvs_pool_submit(s->ingest, fn, arg) : KVS_EUNAVAIL;
    pthread_mutex_unlock(&s->ingest_mu);
    return rc;
}

/* A rendered format on the ingest pool: the render would otherwise run on the
 * transfer's progress thread and hold every other UCX session for its length
 * (fetch_bench's BLOCKING line: p90 1.1-3.4x worse beside renders). */
typedef struct render_job {
    kvs_xfer_server *xfer;
    lent *l;
    uint32_t fmt;
    void *handle;
    ucx_sess *u; /* a reference: the seal's key and lend count */
    uint8_t key[KVS_XFER_KEY_LEN];
    uint8_t nonce[KVS_XFER_NONCE_LEN]; /* the request's, for the seal */
} render_job;

static void render_main(void *arg)
{
    render_job *j = arg;
    kvs_xfer_block_src src;
    memset(&src, 0, sizeof src);
    int rc = render(j->l, j->fmt, j->u->seal, &src);
    if (rc == 0)
        rc = seal_block(j->u, j->l, j->key, j->nonce, j->fmt, &src);
    sess_unref(j->u);
    if (rc != 0)
        lent_free(j->l);
    else
        src.ref = j->l;
    kvs_xfer_server_provide_done(j->xfer, j->handle, rc, rc == 0 ? &src : NULL);
    free(j);
}

/* The stored format is lent in place (declined: provide does it inline); the
 * others are read and checked here, then rendered on the ingest pool. */
static int provide_async(void *ctx, void *session_data, const uint8_t key[KVS_XFER_KEY_LEN],
                         uint32_t fmt, const uint8_t nonce[KVS_XFER_NONCE_LEN], void *handle)
{
    kvs_server *s = ctx;
    if (fmt == KVS_XFER_FMT_STORED || fmt > 4 || s->xfer == NULL)
        return 1;
    render_job *j = calloc(1, sizeof *j);
    if (j == NULL)
        return 1;
    lent *l;
    int rc = lend_block(s, ((ucx_sess *)session_data)->tenant, key, &l);
    if (rc == KVS_ENOMEM) {
        free(j);
        return 1; /* render inline, as before */
    }
    if (rc != 0) {
        free(j);
        return rc;
    }
    j->xfer = s->xfer;
    j->l = l;
    j->fmt = fmt;
    j->handle = handle;
    j->u = session_data;
    memcpy(j->key, key, sizeof j->key);
    memcpy(j->nonce, nonce, sizeof j->nonce);
    atomic_fetch_add_explicit(&j->u->refs, 1, memory_order_relaxed);
    if (ingest_submit(s, render_main, j) != 0) {
        sess_unref(j->u);
        lent_free(l);
        free(j);
        return 1; /* the pool is stopping: render inline */
    }
    return 0;
}

/* ---- Put ----------------------------------------------------------------- */

/* A put in flight between put_begin and put_end. */
typedef struct ucx_put {
    kvs_server *srv;
    ucx_sess *sess;           /* a reference */
    uint64_t seq, expires_ms; /* of its seal, whose header tag checked */
    kvs__put_hdr hd;
    void *raw; /* staged layers, per layer [K][V] */
    uint64_t len;
    /* What the seal covers besides the bytes: the metadata as sent and the
     * UCX key field (copied: both are borrowed for put_begin only). */
    uint8_t *meta;
    size_t meta_len;
    uint8_t ukey[KVS_XFER_KEY_LEN];
    /* In sess->puts from the moment its sequence number is used up
     * (seq_take) to ucx_put_free, under sess->mu, with voided (its client
     * voided it: it never commits). */
    struct ucx_put *prev, *next;
    int listed, voided;
} ucx_put;

/* Its client voids u's put seq (its answer had no kvstashd tag): a number
 * not used yet is used up here, so no put can begin with it; a put begun
 * with it and not yet ended is marked, and put_end refuses to commit it;
 * one that has ended can no longer be stored. Waits for puts committing now,
 * as sess_close does, so that none of them stores the put after the answer. */
static void sess_void(ucx_sess *u, uint64_t seq)
{
    pthread_mutex_lock(&u->mu);
    if (kvs_putmac_window_accept(&u->win, seq) != 0)
        for (ucx_put *p = u->puts; p != NULL; p = p->next)
            if (p->seq == seq)
                p->voided = 1;
    commits_drain_locked(u);
    pthread_mutex_unlock(&u->mu);
}

/* Uses up seq in u's window and lists p (NULL: nothing to list) in u's
 * puts, in one step: a void of seq (sess_void) either uses the number up
 * first, and then no put begins with it, or finds p and marks it. Listed
 * only later, p could begin in between and sess_void find neither, answer
 * voided, and p commit. 0, or KVS_EUNAUTH when seq was used before. */
static int seq_take(ucx_sess *u, uint64_t seq, ucx_put *p)
{
    pthread_mutex_lock(&u->mu);
    int rc = kvs_putmac_window_accept(&u->win, seq);
    if (rc == 0 && p != NULL) {
        p->seq = seq;
        p->prev = NULL;
        p->next = u->puts;
        if (p->next)
            p->next->prev = p;
        u->puts = p;
        p->listed = 1;
    }
    pthread_mutex_unlock(&u->mu);
    return rc;
}

static void ucx_put_free(ucx_put *p)
{
    kvs__put_hdr_release(&p->srv->data, &p->hd);
    if (p->listed) {
        ucx_sess *u = p->sess;
        pthread_mutex_lock(&u->mu);
        if (p->prev)
            p->prev->next = p->next;
        else
            u->puts = p->next;
        if (p->next)
            p->next->prev = p->prev;
        pthread_mutex_unlock(&u->mu);
    }
    if (p->sess)
        sess_unref(p->sess);
    free(p->meta);
    free(p->raw);
    free(p);
}

/* Counts a refused seal; logs the 1st, 2nd, 4th, 8th ... (a data plane
 * process that forges puts must not flood the log). */
static void seal_refused(kvs_server *s, const kvs_tenant *t, const char *why)
{
    uint64_t n = atomic_fetch_add_explicit(&s->data.put_seal_refused, 1, memory_order_relaxed) + 1;
    if ((n & (n - 1)) == 0)
        KVS_LOG_WARN(MOD,
                     "UCX put for tenant %s refused: %s; nothing stored, libkvstash puts over "
                     "gRPC instead (%llu refused so far: kvstash_xfer_put_seal_refused_total)",
                     t->name, why, (unsigned long long)n);
}

/* The seal of a put whose bytes have all landed: both tags over the staged
 * bytes, and its expiry (a put held back until after it). */
static int seal_check(ucx_put *p)
{
    ucx_sess *u = p->sess;
    int rc = kvs_putmac_verify(u->put_key, p->ukey, KVS_XFER_FMT_STORED, p->meta, p->meta_len,
                               p->raw, p->len);
    if (rc == KVS_EINTERNAL)
        return rc;
    if (rc != 0) {
        seal_refused(p->srv, u->tenant,
                     "its seal does not match its bytes (changed on the way: the data plane "
                     "process, or a client without the session's put key)");
        return KVS_EUNAUTH;
    }
    if (kvs_putmac_now_ms() > p->expires_ms) {
        seal_refused(p->srv, u->tenant, "it expired before its bytes landed (held back?)");
        return KVS_EUNAUTH;
    }
    return 0;
}

/* The tag of a put's answer (its status, key and size). */
static void reply_seal(const ucx_sess *u, uint64_t seq, int status, kvs_xfer_put_reply *reply)
{
    if (kvs_putmac_reply_tag(u->put_key, seq, status, reply->key, reply->stored_bytes,
                             reply->tag) != 0)
        memset(reply->tag, 0, sizeof reply->tag); /* the worker then puts over gRPC */
}

/* put_begin's checks of the seal, before the header is read: the header tag
 * (so whatever is answered answers the worker's own header) and the expiry;
 * put_begin then uses up the sequence number (seq_take). */
static int seal_check_begin(kvs_server *s, ucx_sess *u, const uint8_t *ukey, uint32_t fmt,
                            const void *meta, size_t meta_len, uint64_t len, uint64_t expires_ms)
{
    int rc = kvs_putmac_verify_header(u->put_key, ukey, fmt, meta, meta_len, len);
    if (rc == KVS_EINTERNAL)
        return rc;
    if (rc != 0) {
        seal_refused(s, u->tenant,
                     "its header's seal does not match (forged or changed on the way: the data "
                     "plane process, or a client without the session's put key)");
        return KVS_EUNAUTH;
    }
    if (kvs_putmac_now_ms() > expires_ms) {
        seal_refused(s, u->tenant, "it expired before it arrived (held back?)");
        return KVS_EUNAUTH;
    }
    return 0;
}

/* The stored block's key and size for the client, as gRPC Put's reply has them. */
static void reply_of(kvs_server *s, const kvs__put_hdr *hd, uint64_t stored,
                     kvs_xfer_put_reply *reply)
{
    memcpy(reply->key, hd->key.b, KVS_XFER_KEY_LEN);
    reply->stored_bytes = stored;
    if (stored == 0) { /* cached already: its size from the store */
        kvs_store_info info;
        if (kvs_store_info_get(s->store, &hd->key, &info) == 0)
            reply->stored_bytes = info.size;
    }
}

static int put_begin(void *ctx, void *session_data, const uint8_t key[KVS_XFER_KEY_LEN],
                     uint32_t fmt, const void *meta, size_t meta_len, uint64_t len, void **buf,
                     void **ref, kvs_xfer_put_reply *reply)
{
    kvs_server *s = ctx;
    ucx_sess *u = session_data;
    if (fmt != KVS_XFER_FMT_STORED) /* the bytes are raw layers, not an egress format */
        return KVS_EINVAL;
    pthread_mutex_lock(&u->mu);
    int closed = u->closed;
    pthread_mutex_unlock(&u->mu);
    if (closed) /* held back by the data plane process past its client's close */
        return put_closed(s);
    /* The seal's header part, before anything is reserved or answered (the
     * put tag is checked when the bytes have landed). */
    size_t hdr_len;
    uint64_t seq, expires_ms;
    if (kvs_putmac_parse(meta, meta_len, &hdr_len, &seq, &expires_ms) != 0) {
        seal_refused(s, u->tenant, "not sealed (a libkvstash older than kvstashd?)");
        return KVS_EUNAUTH;
    }
    int sc = seal_check_begin(s, u, key, fmt, meta, meta_len, len, expires_ms);
    if (sc != 0)
        return sc;
    ucx_put *p = calloc(1, sizeof *p);
    if (p != NULL) {
        p->srv = s;
        p->sess = u;
        atomic_fetch_add_explicit(&u->refs, 1, memory_order_relaxed);
    }
    if (seq_take(u, seq, p) != 0) { /* the number used up, p listed: one step */
        if (p != NULL)
            ucx_put_free(p);
        seal_refused(s, u->tenant, "its sequence number was used before (a put played again)");
        return KVS_EUNAUTH;
    }
    /* From here every answer is the worker's own (its header checked): tagged. */
    if (p == NULL) {
        reply_seal(u, seq, KVS_ENOMEM, reply);
        return KVS_ENOMEM;
    }
    Kvstash__V1__PutHeader *h =
        kvstash__v1__put_header__unpack(NULL, hdr_len, (const uint8_t *)meta);
    if (h == NULL) {
        reply_seal(u, seq, KVS_EINVAL, reply);
        ucx_put_free(p);
        return KVS_EINVAL;
    }
    static const uint8_t zero[KVS_XFER_KEY_LEN];
    if (h->key.len == 0 && memcmp(key, zero, sizeof zero) != 0) {
        h->key.data = (uint8_t *)key; /* the claim; not freed by protobuf-c (see below) */
        h->key.len = KVS_XFER_KEY_LEN;
    }
    p->expires_ms = expires_ms;
    p->len = len;
    memcpy(p->ukey, key, sizeof p->ukey);
    /* The checks of gRPC Put, through a call that only collects the verdict. */
    kvs__call c;
    memset(&c, 0, sizeof c);
    c.srv = s;
    c.tenant = u->tenant;
    c.status = GRPC_STATUS_OK;
    int bad = kvs__put_header(&c, h, &p->hd);
    if (h->key.data == (uint8_t *)key) {
        h->key.data = NULL;
        h->key.len = 0;
    }
    kvstash__v1__put_header__free_unpacked(h, NULL);
    int rc = 0;
    if (bad) {
        rc = c.status == GRPC_STATUS_OK ? KVS_EINTERNAL : kvs_status_from_grpc((int)c.status);
        KVS_LOG_DEBUG(MOD, "put refused: %s", c.message);
    } else if (p->hd.present) {
        atomic_fetch_add_explicit(&s->data.put_present, 1, memory_order_relaxed);
        reply_of(s, &p->hd, 0, reply);
        rc = KVS_EEXIST;
    } else if (len != 2 * (uint64_t)p->hd.layer_bytes * p->hd.lay.layers) {
        KVS_LOG_DEBUG(MOD, "put refused: %llu bytes, the layout needs %llu",
                      (unsigned long long)len,
                      (unsigned long long)(2 * (uint64_t)p->hd.layer_bytes * p->hd.lay.layers));
        rc = KVS_EINVAL;
    } else if ((p->raw = malloc(len)) == NULL || (p->meta = malloc(meta_len)) == NULL) {
        rc = KVS_ENOMEM;
    } else {
        memcpy(p->meta, meta, meta_len);
        p->meta_len = meta_len;
    }
    if (rc != 0) {
        reply_seal(u, seq, rc, reply);
        ucx_put_free(p);
        return rc;
    }
    *buf = p->raw;
    *ref = p;
    return 0;
}

/* Quantizing a UCX put's layers: put_end runs on a put-end thread
 * (put_end_async below) or, declined, on the transfer's thread (the progress
 * thread, or kvstashd's reader of kvstash-xferd). Either way a put's layers
 * go to the ingest pool, as gRPC Put's do, and the ending thread does layer 0
 * itself and waits for the rest (fork-join): a block takes the time of its
 * slowest share, not of all its layers.
 *
 * The pool is one FIFO shared with gRPC Put's layers and the renders: a job
 * of ours may sit behind a long queue, and the ending thread (on the
 * transfer's thread: every UCX session) would wait for all of it. So after layer 0 it takes back
 * each of its jobs no pool thread has started (taken) and does it itself; it waits only for layers
 * a pool thread is encoding now (running). The jobs it took back still run later and do nothing,
 * and may outlive put_end (and hd, raw): the state lives on the heap until its last reference
 * (refs) goes. */
typedef struct put_layers put_layers;

typedef struct put_layer_job {
    put_layers *pl;
    uint32_t layer;
    int taken; /* under pl->mu: a thread encodes (or encoded) this layer */
} put_layer_job;

struct put_layers {
    pthread_mutex_t mu;
    pthread_cond_t done;
    unsigned refs;    /* encode_put + each job still queued or running */
    unsigned running; /* layers a pool thread is encoding now */
    int rc;           /* the lowest failing layer's, as the serial loop reported */
    uint32_t err_layer;
    char err[KVS_ERR_LEN];
    kvs__put_hdr *hd; /* valid while encode_put runs: read only by taken jobs */
    const uint8_t *raw;
    put_layer_job jobs[];
};

static int encode_put_layer(kvs__put_hdr *hd, const uint8_t *raw, uint32_t l, char *err)
{
    const uint8_t *k = raw + 2 * (size_t)l * hd->layer_bytes;
    return kvs_codec_encode_layer(KVS_CODEC_INGEST, &hd->lay, l, k, k + hd->layer_bytes, hd->buf,
                                  hd->block_bytes, &hd->k_err[l], &hd->v_err[l], err);
}

/* Under pl->mu. */
static void do_put_layers_note(put_layers *pl, uint32_t l, int rc, const char *err)
{
    if (rc != 0 && (pl->rc == 0 || l < pl->err_layer)) {
        pl->rc = rc;
        pl->err_layer = l;
        snprintf(pl->err, sizeof pl->err, "layer %u: %.200s", l, err);
    }
}

/* Drops one reference (pl->mu held; released here); the last frees pl. */
static void do_put_layers_unref(put_layers *pl)
{
    int last = --pl->refs == 0;
    pthread_mutex_unlock(&pl->mu);
    if (last) {
        pthread_cond_destroy(&pl->done);
        pthread_mutex_destroy(&pl->mu);
        free(pl);
    }
}

static void put_layer_main(void *arg)
{
    put_layer_job *j = arg;
    put_layers *pl = j->pl;
    pthread_mutex_lock(&pl->mu);
    if (!j->taken) {
        j->taken = 1;
        pl->running++;
        pthread_mutex_unlock(&pl->mu);
        char err[KVS_ERR_LEN] = "";
        int rc = encode_put_layer(pl->hd, pl->raw, j->layer, err);
        pthread_mutex_lock(&pl->mu);
        do_put_layers_note(pl, j->layer, rc, err);
        if (--pl->running == 0)
            pthread_cond_signal(&pl->done);
    }
    do_put_layers_unref(pl);
}

/* The put_end thread's share: layer l, unless a pool thread has it. */
static void put_layers_take(put_layers *pl, uint32_t l)
{
    pthread_mutex_lock(&pl->mu);
    int mine = !pl->jobs[l].taken;
    pl->jobs[l].taken = 1;
    pthread_mutex_unlock(&pl->mu);
    if (!mine)
        return;
    char err[KVS_ERR_LEN] = "";
    int rc = encode_put_layer(pl->hd, pl->raw, l, err);
    pthread_mutex_lock(&pl->mu);
    do_put_layers_note(pl, l, rc, err);
    pthread_mutex_unlock(&pl->mu);
}

/* Every layer of the staged put into hd->buf (then kvs_codec_finish). Layers
 * 1.. on the ingest pool, 0 here, then here too whatever the pool has not
 * started (or did not take: stopping, out of memory). 0 or the lowest
 * failing layer's error. */
static int encode_put(kvs_server *s, kvs__put_hdr *hd, const uint8_t *raw, char *err, size_t cap)
{
    const uint32_t n = hd->lay.layers;
    put_layers *pl = calloc(1, sizeof *pl + (size_t)n * sizeof pl->jobs[0]);
    if (pl == NULL) {
        snprintf(err, cap, "out of memory");
        return KVS_ENOMEM;
    }
    pthread_mutex_init(&pl->mu, NULL);
    pthread_cond_init(&pl->done, NULL);
    pl->refs = 1;
    pl->hd = hd;
    pl->raw = raw;
    for (uint32_t l = n; l-- > 1;) { /* the last layers first: ours go from 1 up */
        pl->jobs[l] = (put_layer_job){.pl = pl, .layer = l};
        pthread_mutex_lock(&pl->mu);
        pl->refs++;
        pthread_mutex_unlock(&pl->mu);
        if (ingest_submit(s, put_layer_main, &pl->jobs[l]) != 0) {
            pthread_mutex_lock(&pl->mu);
            pl->refs--;
            pthread_mutex_unlock(&pl->mu);
        }
    }
    for (uint32_t l = 0; l < n; l++)
        put_layers_take(pl, l);
    pthread_mutex_lock(&pl->mu);
    while (pl->running > 0)
        pthread_cond_wait(&pl->done, &pl->mu);
    int rc = pl->rc;
    if (rc != 0)
        snprintf(err, cap, "%s", pl->err);
    pl->hd = NULL; /* the jobs still queued find every layer taken */
    pl->raw = NULL;
    do_put_layers_unref(pl);
    return rc;
}

static int put_end(void *ctx, void *ref, int status, kvs_xfer_put_reply *reply)
{
    (void)ctx;
    ucx_put *p = ref;
    kvs_server *s = p->srv;
    kvs__put_hdr *hd = &p->hd;
    char err[KVS_ERR_LEN] = "";
    int rc = status;
    if (rc == 0)
        rc = seal_check(p);
    if (rc == 0) {
        atomic_fetch_add_explicit(&s->data.ingest_bytes, 2 * hd->layer_bytes * hd->lay.layers,
                                  memory_order_relaxed);
        rc = encode_put(s, hd, (const uint8_t *)p->raw, err, sizeof err);
        if (rc == 0 && kvs_codec_finish(hd->buf, hd->block_bytes, err) != 0)
            rc = KVS_EINTERNAL;
        if (rc != 0)
            KVS_LOG_WARN(MOD, "put: quantize on ingest: %s", err);
    }
    if (rc == 0 && (rc = commit_enter(p->sess, &p->voided)) == 0) {
        rc = kvs__put_commit(s, hd);
        commit_leave(p->sess);
        if (rc == KVS_EEXIST) {
            atomic_fetch_add_explicit(&s->data.put_present, 1, memory_order_relaxed);
            reply_of(s, hd, 0, reply);
        } else if (rc == 0) {
            for (uint32_t l = 0; l < hd->lay.layers; l++) {
                kvs_data_stats_qerr(&s->data, l, 0, hd->k_err[l]);
                kvs_data_stats_qerr(&s->data, l, 1, hd->v_err[l]);
            }
            atomic_fetch_add_explicit(&s->data.put_blocks, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&s->data.stored_bytes, hd->block_bytes,
                                      memory_order_relaxed);
            reply_of(s, hd, hd->block_bytes, reply);
        }
    }
    if (rc > 0)
        rc = KVS_EINTERNAL; /* what the transfer would send */
    reply_seal(p->sess, p->seq, rc, reply);
    ucx_put_free(p); /* releases the staged block */
    return rc;
}

/* Staged bytes of puts waiting for their end on s->put_ends at most (by
 * default; KVS_UCX_PUT_END_MAX=<bytes> for tests); past it a put ends on the
 * transfer's thread, which then takes no new put: the back-pressure a
 * blocking end gave. Without it a client sending puts faster than they
 * quantize would pile up staged copies (isolated, bounce memory no longer
 * holds them: the reader copies each put out before its end). */
#define PUT_END_MAX_BYTES (256ull << 20)

/* A put's end on a thread of s->put_ends (put_end_async), so the transfer's
 * thread (every UCX session; with ucx_isolate kvstashd's reader of
 * kvstash-xferd, and that process's progress thread) goes on receiving while
 * the put is quantized. Not on the ingest pool itself: a put's end there
 * would queue behind every gRPC Put layer (test_connect put_ucx_beside_grpc
 * prints what a small UCX put takes beside gRPC Puts); from its own thread
 * encode_put hands layers to the ingest pool and takes back the ones it has
 * not started, as it did on the transfer's thread. */
typedef struct put_end_job {
    kvs_server *s;
    ucx_put *p;
    void *handle;
} put_end_job;

static void put_end_main(void *arg)
{
    put_end_job *j = arg;
    kvs_server *s = j->s;
    uint64_t len = j->p->len;
    kvs_xfer_put_reply reply;
    memset(&reply, 0, sizeof reply);
    int rc = put_end(s, j->p, 0, &reply); /* frees j->p */
    atomic_fetch_sub_explicit(&s->put_end_bytes, len, memory_order_relaxed);
    kvs_xfer_server_put_done(s->xfer, j->handle, rc, &reply);
    free(j);
}

static int put_end_async(void *ctx, void *ref, void *handle)
{
    kvs_server *s = ctx;
    ucx_put *p = ref;
    if (s->xfer == NULL || s->put_ends == NULL)
        return 1;
    uint64_t held = atomic_fetch_add_explicit(&s->put_end_bytes, p->len, memory_order_relaxed);
    put_end_job *j = held + p->len <= s->put_end_max ? malloc(sizeof *j) : NULL;
    if (j != NULL) {
        *j = (put_end_job){.s = s, .p = p, .handle = handle};
        if (kvs_pool_submit(s->put_ends, put_end_main, j) == 0)
            return 0;
        free(j);
    }
    atomic_fetch_sub_explicit(&s->put_end_bytes, p->len, memory_order_relaxed);
    return 1; /* put_end runs on the transfer's thread */
}

/* A helper program (kvstash-ucx-addrcheck, kvstash-xferd) next to
 * kvstashd's own executable (the build's service/ folder, or bin/ when
 * installed). -1 after logging that UCX stays off, and that `off` (the
 * setting that does without the helper) would change that. */
static int helper_path(const char *name, const char *off, char *out, size_t cap)
{
    char exe[KVS_CONFIG_PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    int w = -1;
    if (n > 0 && (size_t)n < sizeof exe - 1) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            slash[1] = 0;
            w = snprintf(out, cap, "%s%s", exe, name);
        }
    }
    if (w > 0 && (size_t)w < cap)
        return 0;
    KVS_LOG_ERROR(MOD,
                  "UCX data plane not started: cannot locate kvstashd's own executable to find "
                  "%s next to it; serving gRPC only (%s)",
                  name, off);
    return -1;
}

void kvs__xfer_start(kvs_server *s)
{
    kvs_config cfg;
    pthread_rwlock_rdlock(&s->cfg_lock);
    cfg = s->cfg;
    pthread_rwlock_unlock(&s->cfg_lock);
    if (!cfg.ucx) {
        KVS_LOG_INFO(MOD, "UCX data plane off (ucx = off): Connect answers UNIMPLEMENTED");
        return;
    }
    /* Rendering on the ingest pool is opt-in (KVS_UCX_RENDER_POOL=1): on the
     * 2-core test VM it made fp16 egress over UCX 1.45x faster but fp32 0.79x
     * and did not measurably shorten other sessions' tail (docs/BENCHMARKS.md);
     * by default the render stays on the progress thread. */
    const char *rp = getenv("KVS_UCX_RENDER_POOL");
    int render_pool = rp != NULL && strcmp(rp, "1") == 0;
    /* KVS_UCX_PUT_SYNC=1 (A/B measurements): a put's end holds the thread
     * that ends it, as before put_end_async: in process the progress thread;
     * isolated kvstashd's reader of kvstash-xferd (that process's own thread
     * goes on: it always sends PUT_END_ASYNC). */
    const char *ps = getenv("KVS_UCX_PUT_SYNC");
    int put_sync = ps != NULL && strcmp(ps, "1") == 0;
    const char *pm = getenv("KVS_UCX_PUT_END_MAX");
    s->put_end_max = pm != NULL ? strtoull(pm, NULL, 10) : PUT_END_MAX_BYTES;
    kvs_xfer_server_opts o = {
        .ops = {.ctx = s,
                .provide = provide,
                .provide_async = render_pool ? provide_async : NULL,
                .release = release,
                .put_begin = put_begin,
                .put_end = put_end,
                .put_end_async = put_sync ? NULL : put_end_async,
                .session_end = session_end},
        .err_mode = KVS_XFER_ERR_PEER,
        .op_timeout_ms = (uint32_t)cfg.ucx_op_timeout_ms,
    };
    /* A node serving gRPC on loopback keeps UCX's network transports there
     * too (it takes no UCX connection from the network; shared memory is not
     * a network device). Any other address leaves UCX every device: its list
     * names RDMA devices apart from their IP interfaces, so one interface
     * would take RDMA away (kvs_netdev.h). UCX_NET_DEVICES overrides. */
    char dev[64];
    const char *env_dev = getenv("UCX_NET_DEVICES"), *env_tls = getenv("UCX_TLS");
    if (kvs_netdev_of_listen(cfg.listen, dev, sizeof dev) == KVS_NETDEV_LOOPBACK) {
        o.net_devices = dev;
        /* And on one host shared memory alone: no UCX tcp port, which 13
         * crafted bytes from any local process abort in UCX 1.13
         * (docs/TRANSFER.md "Sessions"). An operator who set UCX_NET_DEVICES
         * keeps the network; UCX_TLS always wins over opts.tls. libkvstash
         * does the same for a server on loopback. */
        if (env_dev == NULL)
            o.tls = KVS_XFER_TLS_SHM;
    }
    /* UCX 1.13 aborts the process on some malformed worker addresses, and
     * they come from Connect: each is tried in a helper process first
     * (docs/TRANSFER.md "Sessions"). */
    char helper[KVS_CONFIG_PATH_MAX + 64], xferd[KVS_CONFIG_PATH_MAX + 64];
    if (cfg.ucx_addr_check) {
        if (helper_path("kvstash-ucx-addrcheck", "ucx_addr_check = off runs UCX without the check",
                        helper, sizeof helper) != 0)
            return;
        o.addr_check = helper;
    }
    /* And UCX itself in a child process (docs/TRANSFER.md "Isolation"): bytes
     * any peer can send abort UCX 1.13, which then ends that process only;
     * the store stays here, and the child reads stored blocks in place from
     * the store's shared memory tier. */
    if (cfg.ucx_isolate) {
        if (helper_path("kvstash-xferd", "ucx_isolate = off runs UCX inside kvstashd", xferd,
                        sizeof xferd) != 0)
            return;
        o.isolate = xferd;
        if (kvs_store_shared_memory(s->store, &o.shared.fd, &o.shared.base, &o.shared.len) != 0)
            o.shared = (kvs_xfer_shared){.fd = -1};
        /* Not dumpable: then /proc/<pid>/mem and process_vm_writev on
         * kvstashd need CAP_SYS_PTRACE, which code running in the data plane
         * process (the same user) lacks unless kvstashd runs as root
         * (docs/TRANSFER.md "Isolation"). Also: no core dumps. */
        if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0)
            KVS_LOG_WARN(MOD, "cannot make kvstashd non-dumpable: %s", strerror(errno));
    }
    /* As many threads as the ingest pool: that many puts quantize at once. */
    if (!put_sync && kvs_pool_start((int)cfg.ingest_threads, &s->put_ends) != 0) {
        s->put_ends = NULL;
        KVS_LOG_WARN(MOD, "no threads to end UCX puts: they end on the transfer's thread");
    }
    int rc = kvs_xfer_server_create(&o, &s->xfer);
    if (rc != 0) {
        s->xfer = NULL;
        kvs_pool_stop(s->put_ends);
        s->put_ends = NULL;
        if (rc == KVS_ENOTFOUND && o.isolate && access(o.isolate, X_OK) != 0)
            KVS_LOG_ERROR(MOD,
                          "UCX data plane not started: %s is missing or not executable "
                          "(install it next to kvstashd, or set ucx_isolate = off); serving "
                          "gRPC only",
                          o.isolate);
        else if (rc == KVS_ENOTFOUND && o.addr_check)
            KVS_LOG_ERROR(MOD,
                          "UCX data plane not started: the address check helper %s is "
                          "missing or not executable (install it next to kvstashd, or set "
                          "ucx_addr_check = off where every Connect caller is trusted); "
                          "serving gRPC only",
                          helper);
        else
            KVS_LOG_WARN(MOD, "UCX data plane cannot start (%s): serving gRPC only",
                         kvs_strerror(rc));
        return;
    }
    kvs_xfer_server_stats xst;
    char where[160] = "in kvstashd (ucx_isolate = off)";
    if (o.isolate && kvs_xfer_server_stats_get(s->xfer, &xst) == 0)
        snprintf(where, sizeof where, "in kvstash-xferd, pid %llu, reading %s",
                 (unsigned long long)xst.proc_pid,
                 o.shared.len ? "stored blocks in place from the shared memory tier"
                              : "every block through its bounce memory (no bounded memory tier)");
    KVS_LOG_INFO(MOD,
                 "UCX data plane up %s (op timeout %lld ms; rendered formats on the %s; Connect "
                 "addresses %s; transports: %s%s; network devices: %s%s)",
                 where, (long long)cfg.ucx_op_timeout_ms,
                 render_pool ? "ingest pool"
                 : o.isolate ? "thread that serves the data plane process"
                             : "progress thread",
                 o.addr_check ? "checked in kvstash-ucx-addrcheck"
                              : "NOT checked (ucx_addr_check = off)",
                 env_tls ? env_tls
                 : o.tls ? o.tls
                         : "UCX's choice",
                 env_tls ? " from UCX_TLS"
                 : o.tls ? ", shared memory only as gRPC listens on loopback"
                         : "",
                 env_dev         ? env_dev
                 : o.net_devices ? o.net_devices
                                 : "all",
                 env_dev         ? " from UCX_NET_DEVICES"
                 : o.net_devices ? ", as gRPC listens there"
                                 : "");
}

void kvs__xfer_stop(kvs_server *s)
{
    if (s->xfer == NULL)
        return;
    kvs_xfer_server_destroy(s->xfer); /* waits for every pending put end */
    s->xfer = NULL;
    kvs_pool_stop(s->put_ends);
    s->put_ends = NULL;
}

/* ---- Connect ------------------------------------------------------------- */

/* UCX parses worker addresses without a length: transfer/ checks 8..65536. */
#define ADDR_MAX 65536u

/* Opens a UCX session for the worker at waddr, bound to tenant t, and gives
 * the address of the data plane that holds it (*addr: valid until the reply
 * is sent) and its ucx_sess (*out: a reference of the caller's, which the
 * caller drops; the session holds its own until session_end, which may come
 * at any time, e.g. when the data plane process dies). With ucx_isolate that
 * process may be replaced between the open and the read of its address, which
 * would hand the client a new process's address with a session of the old one
 * (its first fetch refused): the address read before the open must equal the
 * one read after, else the session is closed and the open tried again; 3
 * tries, then KVS_ENOSPC (restarting). */
static int session_open(kvs_server *s, const void *waddr, size_t wlen, const kvs_tenant *t,
                        int seal, kvs_xfer_session_info *info, const void **addr, size_t *alen,
                        ucx_sess **out)
{
    for (int tries = 0; tries < 3; tries++) {
        const void *a;
        size_t n;
        int rc = kvs_xfer_server_address(s->xfer, &a, &n);
        if (rc != 0)
            return rc == KVS_EUNAVAIL ? KVS_ENOSPC : rc; /* none running yet */
        void *before = malloc(n);
        ucx_sess *u = before ? sess_new(s, t, seal) : NULL;
        if (u == NULL) {
            free(before);
            return KVS_ENOMEM;
        }
        memcpy(before, a, n);
        atomic_fetch_add_explicit(&u->refs, 1, memory_order_relaxed); /* the caller's */
        rc = kvs_xfer_server_session_open(s->xfer, waddr, wlen, u, info);
        if (rc == 0 && kvs_xfer_server_address(s->xfer, addr, alen) == 0 && *alen == n &&
            memcmp(*addr, before, n) == 0) {
            free(before);
            *out = u;
            return 0;
        }
        free(before);
        if (rc != 0) {
            sess_unref(u); /* no session took it: no session_end comes */
            sess_unref(u);
            return rc;
        }
        (void)kvs_xfer_server_session_close(s->xfer, info->id); /* its session_end */
        sess_unref(u);
        KVS_LOG_INFO(MOD, "the UCX data plane process changed during a Connect: opening again");
    }
    return KVS_ENOSPC;
}

/* Connect's close (close_session_id and its token, checked by the caller's
 * length): the caller's tenant's session with that id and token, if there is
 * one, is closed and none of its puts commits from here on (a put the data
 * plane process held back included: docs/TRANSFER.md "Closing a session").
 * With void_put_seq only that put is voided (sess_void) and the session
 * stays. No such session (ended with nothing in flight, another tenant's, a
 * wrong token) has nothing that could still commit: the answer is the same,
 * so either request always succeeds. */
static void connect_close(kvs__call *c, const Kvstash__V1__ConnectRequest *req)
{
    kvs_server *s = c->srv;
    ucx_sess *u = sess_find(s, c->tenant, req->close_session_id, req->close_session_token.data);
    if (u == NULL) {
        atomic_fetch_add_explicit(&s->data.ucx_close_unknown, 1, memory_order_relaxed);
        KVS_LOG_DEBUG(MOD, "Connect from tenant %s (%.64s): no session %llu of it to close",
                      c->tenant->name, req->client_name ? req->client_name : "",
                      (unsigned long long)req->close_session_id);
        return;
    }
    if (req->void_put_seq != 0) {
        sess_void(u, req->void_put_seq);
        atomic_fetch_add_explicit(&s->data.put_voided, 1, memory_order_relaxed);
        KVS_LOG_DEBUG(MOD, "session %llu of tenant %s: put %llu voided by its client",
                      (unsigned long long)u->id, c->tenant->name,
                      (unsigned long long)req->void_put_seq);
    } else {
        sess_close(s, u);
        atomic_fetch_add_explicit(&s->data.ucx_closed, 1, memory_order_relaxed);
        KVS_LOG_DEBUG(MOD, "session %llu of tenant %s closed by its client (%.64s)",
                      (unsigned long long)u->id, c->tenant->name,
                      req->client_name ? req->client_name : "");
    }
    sess_unref(u);
}

void kvs__do_connect(kvs__call *c, const ProtobufCMessage *m)
{
    const Kvstash__V1__ConnectRequest *req = (const void *)m;
    kvs_server *s = c->srv;
    if (s->xfer == NULL) {
        kvs__call_fail(c, GRPC_STATUS_UNIMPLEMENTED,
                       "data plane disabled (ucx = off, or UCX failed to start): use Get");
        return;
    }
    int closing = req->close_session_id != 0 || req->close_session_token.len != 0;
    /* Before any byte of the request reaches UCX, which trusts its peers
     * (docs/TRANSFER.md, "Sessions"). A close alone passes no byte to UCX
     * and names only the caller's own sessions (none, for such a tenant:
     * its ucx changes only at a restart): it gets the true answer. */
    if (c->tenant && !c->tenant->ucx && !(closing && req->worker_address.len == 0)) {
        kvs__call_fail(c, GRPC_STATUS_PERMISSION_DENIED,
                       "tenant %s may not use the UCX data plane (ucx = false): use Get",
                       c->tenant->name);
        return;
    }
    if (closing && req->close_session_token.len != KVS_XFER_TOKEN_LEN) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT,
                       "close_session_token: %zu bytes (a session token has %u)",
                       req->close_session_token.len, KVS_XFER_TOKEN_LEN);
        return;
    }
    if (req->worker_address.len == 0 && !closing) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "worker_address: required");
        return;
    }
    if (req->worker_address.len > ADDR_MAX) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "worker_address: %zu bytes (max %u)",
                       req->worker_address.len, ADDR_MAX);
        return;
    }
    if (req->void_put_seq != 0 && (!closing || req->worker_address.len != 0)) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT,
                       "void_put_seq: needs close_session_id and close_session_token, and no "
                       "worker_address");
        return;
    }
    if (closing) {
        connect_close(c, req);
        if (req->worker_address.len == 0) {
            Kvstash__V1__ConnectResponse r = KVSTASH__V1__CONNECT_RESPONSE__INIT;
            r.closed = req->void_put_seq == 0;
            r.voided = req->void_put_seq != 0;
            kvs__call_reply(c, &r.base);
            return;
        }
    }
    kvs_config cfg;
    kvs__config_snapshot(c, &cfg);
    kvs_xfer_server_stats st;
    memset(&st, 0, sizeof st);
    if (kvs_xfer_server_stats_get(s->xfer, &st) == 0 &&
        st.sessions >= (uint64_t)cfg.ucx_max_sessions) {
        kvs__call_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED,
                       "%llu UCX sessions open (ucx_max_sessions %lld): use Get, or retry "
                       "when a worker has gone",
                       (unsigned long long)st.sessions, (long long)cfg.ucx_max_sessions);
        return;
    }
    kvs_xfer_session_info info;
    const void *addr;
    size_t alen;
    ucx_sess *u = NULL;
    /* Sealed fetches where another process relays the blocks (ucx_isolate);
     * in kvstashd's own process there is nothing between us and the worker. */
    int isolated = st.proc_pid != 0 || cfg.ucx_isolate;
    int seal = req->seal_fetches && isolated;
    int rc = session_open(s, req->worker_address.data, req->worker_address.len, c->tenant, seal,
                          &info, &addr, &alen, &u);
    if (rc == KVS_EINVAL) {
        KVS_LOG_WARN(MOD,
                     "Connect from tenant %s (%.64s): refused a %zu-byte worker address "
                     "that is not a usable UCX address",
                     c->tenant->name, req->client_name ? req->client_name : "",
                     req->worker_address.len);
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT,
                       "worker_address: not a usable UCX worker address");
        return;
    }
    if (rc == KVS_ENOSPC) {
        kvs__call_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED,
                       "worker_address: the UCX address check is busy, or it or the data "
                       "plane process is restarting; retry in a second, or use Get");
        return;
    }
    /* KVS_EUNAVAIL here is UCX refusing the client's address (mostly
     * UCS_ERR_UNREACHABLE: no transport of ours reaches it, or bytes that only
     * look like an address): retrying cannot help, and the server itself is
     * fine, so not UNAVAILABLE. */
    if (rc == KVS_EUNAVAIL) {
        kvs__call_fail(c, GRPC_STATUS_FAILED_PRECONDITION,
                       "worker_address: UCX cannot reach it from this server (no common "
                       "transport, or not a worker address): use Get");
        return;
    }
    /* KVS_EPERM: UCX may not attach the worker's shared memory, which is its
     * user's alone: on one host a worker under another user than kvstashd's
     * cannot use UCX (docs/OPERATIONS.md "UCX and user IDs"); nor one whose
     * /dev/shm and processes kvstashd cannot see (another container: not
     * measured here, UCX reports the same failure). */
    if (rc == KVS_EPERM) {
        KVS_LOG_WARN(MOD,
                     "Connect from tenant %s (%.64s): UCX cannot attach the worker's shared "
                     "memory (permission denied): the worker runs as another user than "
                     "kvstashd, or where kvstashd cannot see its shared memory (another "
                     "container); it uses Get instead (docs/OPERATIONS.md, \"UCX and user "
                     "IDs\")",
                     c->tenant->name, req->client_name ? req->client_name : "");
        kvs__call_fail(c, GRPC_STATUS_FAILED_PRECONDITION,
                       "worker_address: UCX cannot attach this worker's shared memory "
                       "(permission denied: on one host a worker must run as kvstashd's user, "
                       "and see the same shared memory, to use UCX): use Get");
        return;
    }
    if (rc != 0) {
        kvs__call_fail(c, kvs__grpc_from_status(rc), "cannot open a UCX session: %s",
                       kvs_strerror(rc));
        return;
    }
    KVS_LOG_DEBUG(MOD, "session %llu for tenant %s (%.64s)", (unsigned long long)info.id,
                  c->tenant->name, req->client_name ? req->client_name : "");
    sess_list(u, &info);
    Kvstash__V1__ConnectResponse r = KVSTASH__V1__CONNECT_RESPONSE__INIT;
    r.closed = closing;
    r.worker_address.data = (uint8_t *)addr;
    r.worker_address.len = alen;
    r.session_token.data = info.token;
    r.session_token.len = sizeof info.token;
    r.session_id = info.id;
    r.put_key.data = u->put_key;
    r.put_key.len = sizeof u->put_key;
    r.server_clock_ms = kvs_putmac_now_ms();
    r.fetch_seal = !req->seal_fetches ? 0 : seal ? 1 : 2;
    kvs__call_reply(c, &r.base);
    sess_unref(u);
}

/* ---- Stats --------------------------------------------------------------- */

int kvs__xfer_collect(kvs_server *s, kvs_metric_set *set)
{
    kvs_xfer_server_stats st;
    memset(&st, 0, sizeof st);
    if (s->xfer != NULL && kvs_xfer_server_stats_get(s->xfer, &st) != 0)
        return 0;
    struct {
        const char *name, *help;
        kvs_metric_type type;
        uint64_t v;
    } g[] = {
        {"kvstash_xfer_enabled", "1 when the UCX data plane is serving", KVS_MT_GAUGE,
         s->xfer != NULL},
        {"kvstash_xfer_sessions", "UCX sessions open", KVS_MT_GAUGE, st.sessions},
        {"kvstash_xfer_fetch_requests_total", "UCX fetch requests", KVS_MT_COUNTER,
         st.fetch_requests},
        {"kvstash_xfer_blocks_sent_total", "blocks fully delivered over UCX", KVS_MT_COUNTER,
         st.blocks_sent},
        {"kvstash_xfer_bytes_sent_total", "bytes sent over UCX", KVS_MT_COUNTER, st.bytes_sent},
        {"kvstash_xfer_puts_total", "blocks put over UCX and committed", KVS_MT_COUNTER, st.puts},
        {"kvstash_xfer_blocks_failed_total", "UCX blocks not found, refused or aborted",
         KVS_MT_COUNTER, st.blocks_failed},
        {"kvstash_xfer_auth_failures_total", "UCX requests with a wrong session id or token",
         KVS_MT_COUNTER, st.auth_failures},
        {"kvstash_xfer_proto_errors_total", "malformed UCX requests", KVS_MT_COUNTER,
         st.proto_errors},
        {"kvstash_xfer_peer_failures_total", "UCX sessions closed by an endpoint error",
         KVS_MT_COUNTER, st.peer_failures},
        {"kvstash_xfer_timeouts_total", "UCX sessions closed by ucx_op_timeout_ms", KVS_MT_COUNTER,
         st.timeouts},
        {"kvstash_xfer_refs_held", "blocks lent to UCX sends not yet released", KVS_MT_GAUGE,
         st.refs_held},
        {"kvstash_xfer_put_end_bytes",
         "staged bytes of UCX puts waiting for their end (quantize, commit) on a put-end thread",
         KVS_MT_GAUGE, atomic_load_explicit(&s->put_end_bytes, memory_order_relaxed)},
        {"kvstash_xfer_orphans", "UCX requests left pending after a force close", KVS_MT_GAUGE,
         st.orphans},
        {"kvstash_xfer_addr_checks_total",
         "Connect worker addresses tried in the address check helper", KVS_MT_COUNTER,
         st.addr_checks},
        {"kvstash_xfer_addr_rejected_total",
         "Connect worker addresses refused by the check (helper died, or UCX refused them)",
         KVS_MT_COUNTER, st.addr_rejected},
        {"kvstash_xfer_addr_check_busy_total",
         "Connects refused because another address check held the helper for 250 ms",
         KVS_MT_COUNTER, st.addr_check_busy},
        {"kvstash_xfer_addr_check_crashes_total",
         "address check helpers killed by a worker address (or hung on one)", KVS_MT_COUNTER,
         st.addr_check_crashes},
        {"kvstash_xfer_proc_restarts_total",
         "UCX data plane processes (kvstash-xferd) that ended and were replaced", KVS_MT_COUNTER,
         st.proc_restarts},
        {"kvstash_xfer_bounce_fails_total",
         "UCX blocks refused for want of the data plane's bounce memory", KVS_MT_COUNTER,
         st.bounce_fails},
        {"kvstash_xfer_bounce_copies_total",
         "UCX blocks copied through the data plane's bounce memory (not sent in place: SSD "
         "reads, puts)",
         KVS_MT_COUNTER, st.bounce_copies},
        {"kvstash_xfer_proc_lent", "blocks lent to the UCX data plane process now", KVS_MT_GAUGE,
         st.proc_lent},
        {"kvstash_xfer_proc_pid",
         "pid of the UCX data plane process serving now (0: none, e.g. restarting)", KVS_MT_GAUGE,
         st.proc_pid},
        {"kvstash_xfer_orphan_put_bytes",
         "bytes of UCX puts whose session closed while UCX still receives them", KVS_MT_GAUGE,
         st.orphan_put_bytes},
        {"kvstash_xfer_orphans_stuck",
         "sends to closed sessions UCX has not completed 10 s after the close (dead "
         "shared-memory peers; the data plane process restarts at 64)",
         KVS_MT_GAUGE, st.orphans_stuck},
        {"kvstash_xfer_puts_refused_total",
         "UCX puts refused while orphaned puts held over 256 MiB", KVS_MT_COUNTER, st.puts_refused},
        {"kvstash_xfer_lend_refused_total",
         "UCX blocks refused because their session had 65536 lent to the data plane process",
         KVS_MT_COUNTER, st.lend_refused},
        {"kvstash_xfer_fetch_sealed_total",
         "blocks lent to UCX sessions that seal their fetches (a GMAC tag per layer)",
         KVS_MT_COUNTER, atomic_load_explicit(&s->data.fetch_sealed, memory_order_relaxed)},
        {"kvstash_xfer_sessions_closed_total",
         "UCX sessions their client closed through Connect (it left UCX for gRPC)", KVS_MT_COUNTER,
         atomic_load_explicit(&s->data.ucx_closed, memory_order_relaxed)},
        {"kvstash_xfer_close_unknown_total",
         "Connect closes that named no open session of the caller's tenant (ended already, "
         "or a wrong id or token)",
         KVS_MT_COUNTER, atomic_load_explicit(&s->data.ucx_close_unknown, memory_order_relaxed)},
        {"kvstash_xfer_put_voided_total",
         "UCX puts their client voided through Connect (their answer lacked kvstashd's tag)",
         KVS_MT_COUNTER, atomic_load_explicit(&s->data.put_voided, memory_order_relaxed)},
        {"kvstash_xfer_put_closed_total",
         "UCX puts refused because their client had closed their session or voided them (held "
         "back by the data plane process)",
         KVS_MT_COUNTER, atomic_load_explicit(&s->data.put_closed, memory_order_relaxed)},
        {"kvstash_xfer_put_seal_refused_total",
         "UCX puts refused because their seal was missing, did not match their header and "
         "bytes, or was played again (docs/TRANSFER.md \"Sealed puts\")",
         KVS_MT_COUNTER, atomic_load_explicit(&s->data.put_seal_refused, memory_order_relaxed)},
    };
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++)
        if (!kvs_metric_add(set, g[i].name, g[i].help, g[i].type, (double)g[i].v, 0))
            return KVS_ENOMEM;
    return 0;
}
