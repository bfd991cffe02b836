/*
 * async.c — kvs_client_put_async, kvs_client_get_async and kvs_client_drain:
 * calls that return at once and call back from a library thread.
 *
 * The idea: put_async deep-copies everything the put needs (namespace strings,
 * parent key, tokens, every layer's K and V), queues the copy, and a small
 * pool of worker threads owned by the client runs kvs_client_put on it and
 * calls the callback. get_async copies the namespace and the keys and a worker
 * runs kvs_client_get with the caller's layer callback, then the done
 * callback. The pool starts on first use; kvs_client_close drains it and joins
 * the workers.
 *
 * Lookups are small and latency-bound, so kvs_client_lookup_async does not
 * use that pool: it starts the call at once on a NEXT completion queue owned
 * by the client, and one library thread (started on first use) takes every
 * completion from that queue, unpacks the reply and calls back. The thread
 * that waits in grpc_completion_queue_next is also the one gRPC lets poll the
 * socket, so with N lookups outstanding a reply is read, parsed and handed to
 * its callback on one thread, without waking a thread per call.
 *
 * Invariants: `pending` counts jobs queued or running (lookups started and
 * not yet called back), and c->outstanding both kinds together (client_int.h);
 * drain waits for the two counts and then for outstanding to read 0, since a
 * callback may start a call of the other kind after that kind was drained. A job's callback
 * runs exactly once; when put_async or lookup_async returns an error the
 * callback never runs (libuv's rule, kvstash.h). The lookup queue is shut
 * down only at close, after drain, so no call is ever started on a queue that
 * is shutting down.
 */
#include "client_int.h"

#include <grpc/support/time.h>

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define ASYNC_WORKERS 4

typedef struct async_job {
    struct async_job *next;
    int get; /* 0 put, 1 get (the fields after "get:") */
    kvs_ns ns;
    char *model, *salt;
    unsigned char parent[KVS_CLIENT_KEY_LEN];
    int has_parent;
    unsigned index, scheme;
    unsigned *tokens;
    void **k, **v;
    int timeout_ms;
    kvs_put_done_cb cb;
    void *arg;
    /* get: */
    unsigned char (*keys)[KVS_CLIENT_KEY_LEN];
    size_t n_keys;
    kvs_egress fmt;
    unsigned long long lease_id;
    kvs_get_layer_cb layer_cb;
    kvs_get_done_cb done_cb;
} async_job;

struct kvs__async {
    pthread_mutex_t mu;
    pthread_cond_t work, idle;
    async_job *head, *tail;
    size_t pending;
    int stopping;
    pthread_t threads[ASYNC_WORKERS];
    int n;
};

static pthread_mutex_t g_init_mu = PTHREAD_MUTEX_INITIALIZER;

static void job_free(async_job *j)
{
    if (j == NULL)
        return;
    if (j->k)
        for (unsigned l = 0; l < j->ns.num_layers; l++)
            free(j->k[l]);
    if (j->v)
        for (unsigned l = 0; l < j->ns.num_layers; l++)
            free(j->v[l]);
    free(j->k);
    free(j->v);
    free(j->keys);
    free(j->tokens);
    free(j->model);
    free(j->salt);
    free(j);
}

static void run_job(kvs_client *c, async_job *j)
{
    if (j->get) {
        char gerr[KVS_ERR_LEN] = "";
        int rc = kvs_client_get(c, &j->ns, (const unsigned char(*)[KVS_CLIENT_KEY_LEN])j->keys,
                                j->n_keys, j->fmt, j->lease_id, j->timeout_ms, j->layer_cb, j->arg,
                                gerr);
        j->done_cb(j->arg, rc, rc == 0 ? NULL : gerr);
        return;
    }
    unsigned L = j->ns.num_layers;
    kvs_put_args a;
    memset(&a, 0, sizeof a);
    a.ns = &j->ns;
    a.parent_key = j->has_parent ? j->parent : NULL;
    a.index = j->index;
    a.tokens = j->tokens;
    a.scheme = j->scheme;
    a.k = (const void *const *)j->k;
    a.v = (const void *const *)j->v;
    kvs_put_result res;
    memset(&res, 0, sizeof res);
    res.k_rel_error = calloc(L, sizeof *res.k_rel_error);
    res.v_rel_error = calloc(L, sizeof *res.v_rel_error);
    res.layer_scheme = calloc(L, sizeof *res.layer_scheme);
    char err[KVS_ERR_LEN] = "";
    int rc = kvs_client_put(c, &a, j->timeout_ms, &res, err);
    j->cb(j->arg, rc, rc == 0 ? &res : NULL, rc == 0 ? NULL : err);
    free(res.k_rel_error);
    free(res.v_rel_error);
    free(res.layer_scheme);
}

static void *worker(void *p)
{
    kvs_client *c = p;
    struct kvs__async *q = c->async;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (q->head == NULL && !q->stopping)
            pthread_cond_wait(&q->work, &q->mu);
        async_job *j = q->head;
        if (j == NULL)
            break;
        q->head = j->next;
        if (q->head == NULL)
            q->tail = NULL;
        pthread_mutex_unlock(&q->mu);
        run_job(c, j);
        job_free(j);
        atomic_fetch_sub(&c->outstanding, 1);
        pthread_mutex_lock(&q->mu);
        if (--q->pending == 0)
            pthread_cond_broadcast(&q->idle);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

/* Starts the pool on first use. 0 or KVS_ENOMEM. */
static int ensure_pool(kvs_client *c)
{
    int rc = 0;
    pthread_mutex_lock(&g_init_mu);
    if (c->async == NULL) {
        struct kvs__async *q = calloc(1, sizeof *q);
        if (q == NULL) {
            rc = KVS_ENOMEM;
        } else {
            pthread_mutex_init(&q->mu, NULL);
            pthread_cond_init(&q->work, NULL);
            pthread_cond_init(&q->idle, NULL);
            c->async = q;
            for (int i = 0; i < ASYNC_WORKERS; i++) {
                if (pthread_create(&q->threads[i], NULL, worker, c) != 0)
                    break;
                q->n++;
            }
            if (q->n == 0)
                rc = KVS_ENOMEM; /* the pool object stays; close frees it */
        }
    } else if (c->async->n == 0) {
        rc = KVS_ENOMEM;
    }
    pthread_mutex_unlock(&g_init_mu);
    return rc;
}

static void *dup_bytes(const void *p, size_t n)
{
    void *d = malloc(n ? n : 1);
    if (d)
        memcpy(d, p, n);
    return d;
}

/* A job with its own copy of ns (strings included), the pool started; NULL
 * with *rc the reason (KVS_ENOMEM) when not. */
static async_job *job_new(kvs_client *c, const kvs_ns *ns, int *rc)
{
    if ((*rc = ensure_pool(c)) != 0)
        return NULL;
    *rc = KVS_ENOMEM;
    async_job *j = calloc(1, sizeof *j);
    if (j == NULL)
        return NULL;
    j->ns = *ns;
    j->model = kvs__strdup(ns->model);
    j->salt = kvs__strdup(ns->salt);
    j->ns.model = j->model;
    j->ns.salt = j->salt;
    if (!j->model || !j->salt) {
        job_free(j);
        return NULL;
    }
    return j;
}

/* Hands j to the pool (which frees it after its callback). 0, or
 * KVS_EUNAVAIL (closing: j freed, no callback). */
static int job_queue(kvs_client *c, async_job *j)
{
    struct kvs__async *q = c->async;
    pthread_mutex_lock(&q->mu);
    if (q->stopping) {
        pthread_mutex_unlock(&q->mu);
        job_free(j);
        return KVS_EUNAVAIL;
    }
    if (q->tail)
        q->tail->next = j;
    else
        q->head = j;
    q->tail = j;
    q->pending++;
    atomic_fetch_add(&c->outstanding, 1);
    pthread_cond_signal(&q->work);
    pthread_mutex_unlock(&q->mu);
    return 0;
}

int kvs_client_put_async(kvs_client *c, const kvs_put_args *a, int timeout_ms, kvs_put_done_cb cb,
                         void *arg)
{
    if (c == NULL || a == NULL || a->ns == NULL || a->ns->model == NULL || a->tokens == NULL ||
        a->k == NULL || a->v == NULL || cb == NULL)
        return KVS_EINVAL;
    if (kvs__forked(c, "kvs_client_put_async", NULL) != 0)
        return KVS_EPRECOND;
    const kvs_ns *ns = a->ns;
    size_t eb = ns->dtype == 1 || ns->dtype == 2 ? 2 : ns->dtype == 3 ? 4 : 0;
    if (eb == 0 || ns->num_layers == 0 || ns->block_tokens == 0)
        return KVS_EINVAL;
    for (unsigned l = 0; l < ns->num_layers; l++)
        if (a->k[l] == NULL || a->v[l] == NULL)
            return KVS_EINVAL;
    size_t layer_bytes = (size_t)ns->block_tokens * ns->num_kv_heads * ns->head_dim * eb;
    int rc;
    async_job *j = job_new(c, ns, &rc);
    if (j == NULL)
        return rc;
    j->tokens = dup_bytes(a->tokens, ns->block_tokens * sizeof *a->tokens);
    j->k = calloc(ns->num_layers, sizeof *j->k);
    j->v = calloc(ns->num_layers, sizeof *j->v);
    if (!j->tokens || !j->k || !j->v) {
        job_free(j);
        return KVS_ENOMEM;
    }
    for (unsigned l = 0; l < ns->num_layers; l++) {
        if ((j->k[l] = dup_bytes(a->k[l], layer_bytes)) == NULL ||
            (j->v[l] = dup_bytes(a->v[l], layer_bytes)) == NULL) {
            job_free(j);
            return KVS_ENOMEM;
        }
    }
    if (a->parent_key) {
        memcpy(j->parent, a->parent_key, KVS_CLIENT_KEY_LEN);
        j->has_parent = 1;
    }
    j->index = a->index;
    j->scheme = a->scheme;
    j->timeout_ms = timeout_ms;
    j->cb = cb;
    j->arg = arg;
    return job_queue(c, j);
}

int kvs_client_get_async(kvs_client *c, const kvs_ns *ns,
                         const unsigned char (*keys)[KVS_CLIENT_KEY_LEN], size_t n_keys,
                         kvs_egress fmt, unsigned long long lease_id, int timeout_ms,
                         kvs_get_layer_cb layer_cb, kvs_get_done_cb done_cb, void *arg)
{
    if (c == NULL || ns == NULL || ns->model == NULL || keys == NULL || n_keys == 0 ||
        layer_cb == NULL || done_cb == NULL || (int)fmt < KVS_EGRESS_STORED ||
        fmt > KVS_EGRESS_FP8_PER_TENSOR)
        return KVS_EINVAL;
    if (kvs__forked(c, "kvs_client_get_async", NULL) != 0)
        return KVS_EPRECOND;
    int rc;
    async_job *j = job_new(c, ns, &rc);
    if (j == NULL)
        return rc;
    if ((j->keys = dup_bytes(keys, n_keys * KVS_CLIENT_KEY_LEN)) == NULL) {
        job_free(j);
        return KVS_ENOMEM;
    }
    j->get = 1;
    j->n_keys = n_keys;
    j->fmt = fmt;
    j->lease_id = lease_id;
    j->timeout_ms = timeout_ms;
    j->layer_cb = layer_cb;
    j->done_cb = done_cb;
    j->arg = arg;
    return job_queue(c, j);
}

/* ---- lookup_async ------------------------------------------------------- */

struct kvs__lookups {
    grpc_completion_queue *cq; /* NEXT queue of every async lookup of the client */
    pthread_t thread;
    atomic_size_t pending; /* started, not yet called back */
    pthread_mutex_t mu;    /* with idle: drain's wait for pending == 0 */
    pthread_cond_t idle;
};

typedef struct lookup_op {
    kvs__unary u;
    kvs_client *c;
    kvs_lookup_done_cb cb;
    void *arg;
} lookup_op;

static void *lookup_thread(void *p)
{
    struct kvs__lookups *lq = p;
    for (;;) {
        grpc_event ev =
            grpc_completion_queue_next(lq->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        lookup_op *op = ev.tag;
        TSAN_ACQUIRE(op);
        char err[KVS_ERR_LEN] = "";
        grpc_slice rep;
        kvs_lookup_result *res = NULL;
        int rc = kvs__unary_finish(&op->u, &rep, NULL, err);
        if (rc == 0) {
            rc = kvs__lookup_from_reply(rep, &res, err);
            grpc_slice_unref(rep);
        }
        op->cb(op->arg, rc, rc == 0 ? res : NULL, rc == 0 ? NULL : err);
        kvs_lookup_result_free(res);
        atomic_fetch_sub(&op->c->outstanding, 1);
        free(op);
        if (atomic_fetch_sub(&lq->pending, 1) == 1) {
            pthread_mutex_lock(&lq->mu);
            pthread_cond_broadcast(&lq->idle);
            pthread_mutex_unlock(&lq->mu);
        }
    }
    return NULL;
}

/* Starts the completion thread on first use. 0 or KVS_ENOMEM. */
static int ensure_lookups(kvs_client *c)
{
    int rc = 0;
    pthread_mutex_lock(&g_init_mu);
    if (c->lookups == NULL) {
        struct kvs__lookups *lq = calloc(1, sizeof *lq);
        if (lq == NULL) {
            rc = KVS_ENOMEM;
        } else {
            pthread_mutex_init(&lq->mu, NULL);
            pthread_cond_init(&lq->idle, NULL);
            atomic_init(&lq->pending, 0);
            lq->cq = grpc_completion_queue_create_for_next(NULL);
            if (pthread_create(&lq->thread, NULL, lookup_thread, lq) != 0) {
                grpc_completion_queue_shutdown(lq->cq);
                grpc_completion_queue_destroy(lq->cq);
                pthread_mutex_destroy(&lq->mu);
                pthread_cond_destroy(&lq->idle);
                free(lq);
                rc = KVS_ENOMEM;
            } else {
                atomic_store(&c->lookups, lq);
            }
        }
    }
    pthread_mutex_unlock(&g_init_mu);
    return rc;
}

int kvs_client_lookup_async(kvs_client *c, const kvs_ns *ns, const unsigned *tokens,
                            size_t n_tokens, unsigned lease_ms, int timeout_ms,
                            kvs_lookup_done_cb cb, void *arg)
{
    if (c == NULL || cb == NULL || (tokens == NULL && n_tokens > 0))
        return KVS_EINVAL;
    if (kvs__forked(c, "kvs_client_lookup_async", NULL) != 0)
        return KVS_EPRECOND;
    /* c->lookups is written once, under g_init_mu (an atomic pointer, so the
     * usual case reads it without the lock). */
    struct kvs__lookups *lq = atomic_load(&c->lookups);
    int rc = lq ? 0 : ensure_lookups(c);
    if (rc != 0)
        return rc;
    lq = atomic_load(&c->lookups);
    grpc_slice req;
    rc = kvs__lookup_pack(ns, tokens, n_tokens, lease_ms, "kvs_client_lookup_async", &req, NULL);
    if (rc != 0)
        return rc;
    lookup_op *op = malloc(sizeof *op);
    if (op == NULL) {
        grpc_slice_unref(req);
        return KVS_ENOMEM;
    }
    op->c = c;
    op->cb = cb;
    op->arg = arg;
    atomic_fetch_add(&c->outstanding, 1);
    atomic_fetch_add(&lq->pending, 1);
    rc = kvs__unary_start(c, KVS__METHOD_LOOKUP, lq->cq, timeout_ms, req, &op->u, op, NULL);
    if (rc != 0) {
        free(op);
        atomic_fetch_sub(&c->outstanding, 1);
        if (atomic_fetch_sub(&lq->pending, 1) == 1) {
            pthread_mutex_lock(&lq->mu);
            pthread_cond_broadcast(&lq->idle);
            pthread_mutex_unlock(&lq->mu);
        }
    }
    return rc;
}

static void lookups_drain(struct kvs__lookups *lq)
{
    pthread_mutex_lock(&lq->mu);
    while (atomic_load(&lq->pending) > 0)
        pthread_cond_wait(&lq->idle, &lq->mu);
    pthread_mutex_unlock(&lq->mu);
}

void kvs__lookups_close(kvs_client *c)
{
    struct kvs__lookups *lq = atomic_load(&c->lookups);
    if (lq == NULL)
        return;
    lookups_drain(lq);
    grpc_completion_queue_shutdown(lq->cq);
    pthread_join(lq->thread, NULL);
    grpc_completion_queue_destroy(lq->cq);
    pthread_mutex_destroy(&lq->mu);
    pthread_cond_destroy(&lq->idle);
    free(lq);
    atomic_store(&c->lookups, NULL);
}

/* The put pool, or NULL: read under the init lock, since a Lookup's
 * callback may be creating it on the completion thread. */
static struct kvs__async *pool_get(kvs_client *c)
{
    pthread_mutex_lock(&g_init_mu);
    struct kvs__async *q = c->async;
    pthread_mutex_unlock(&g_init_mu);
    return q;
}

void kvs_client_drain(kvs_client *c)
{
    /* A forked copy: the calls counted are the parent's, called back there */
    if (c == NULL || kvs__forked(c, "kvs_client_drain", NULL) != 0)
        return;
    /* Each kind in turn, until none of either is left: a put's callback may
     * start a Lookup after the lookups were drained, a Lookup's a put after
     * the puts were (c->outstanding counts both). */
    for (;;) {
        struct kvs__async *q = pool_get(c);
        if (q != NULL) {
            pthread_mutex_lock(&q->mu);
            while (q->pending > 0)
                pthread_cond_wait(&q->idle, &q->mu);
            pthread_mutex_unlock(&q->mu);
        }
        struct kvs__lookups *lq = atomic_load(&c->lookups);
        if (lq != NULL)
            lookups_drain(lq);
        if (atomic_load(&c->outstanding) == 0)
            return;
        sched_yield(); /* a call counted in outstanding, not yet in its kind's count */
    }
}

void kvs__async_close(kvs_client *c)
{
    struct kvs__async *q = pool_get(c);
    if (q == NULL)
        return;
    kvs_client_drain(c);
    pthread_mutex_lock(&q->mu);
    q->stopping = 1;
    pthread_cond_broadcast(&q->work);
    pthread_mutex_unlock(&q->mu);
    for (int i = 0; i < q->n; i++)
        pthread_join(q->threads[i], NULL);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->work);
    pthread_cond_destroy(&q->idle);
    free(q);
    c->async = NULL;
}
