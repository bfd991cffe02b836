/*
 * async.c — kvs_client_put_async and kvs_client_drain: puts that return at
 * once and call back from a library thread.
 *
 * The idea: put_async deep-copies everything the put needs (namespace strings,
 * parent key, tokens, every layer's K and V), queues the copy, and a small
 * pool of worker threads owned by the client runs kvs_client_put on it and
 * calls the callback. The pool starts on first use; kvs_client_close drains
 * it and joins the workers.
 *
 * Invariants: `pending` counts jobs queued or running; drain waits for 0. A
 * job's callback runs exactly once; when put_async returns an error the
 * callback never runs (libuv's rule, kvstash.h).
 */
#include "client_int.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define ASYNC_WORKERS 4

typedef struct async_job {
    struct async_job *next;
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
    free(j->tokens);
    free(j->model);
    free(j->salt);
    free(j);
}

static void run_job(kvs_client *c, async_job *j)
{
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

int kvs_client_put_async(kvs_client *c, const kvs_put_args *a, int timeout_ms, kvs_put_done_cb cb,
                         void *arg)
{
    if (c == NULL || a == NULL || a->ns == NULL || a->ns->model == NULL || a->tokens == NULL ||
        a->k == NULL || a->v == NULL || cb == NULL)
        return KVS_EINVAL;
    const kvs_ns *ns = a->ns;
    size_t eb = ns->dtype == 1 || ns->dtype == 2 ? 2 : ns->dtype == 3 ? 4 : 0;
    if (eb == 0 || ns->num_layers == 0 || ns->block_tokens == 0)
        return KVS_EINVAL;
    for (unsigned l = 0; l < ns->num_layers; l++)
        if (a->k[l] == NULL || a->v[l] == NULL)
            return KVS_EINVAL;
    size_t layer_bytes = (size_t)ns->block_tokens * ns->num_kv_heads * ns->head_dim * eb;
    int rc = ensure_pool(c);
    if (rc != 0)
        return rc;
    async_job *j = calloc(1, sizeof *j);
    if (j == NULL)
        return KVS_ENOMEM;
    j->ns = *ns;
    j->model = kvs__strdup(ns->model);
    j->salt = kvs__strdup(ns->salt);
    j->ns.model = j->model;
    j->ns.salt = j->salt;
    j->tokens = dup_bytes(a->tokens, ns->block_tokens * sizeof *a->tokens);
    j->k = calloc(ns->num_layers, sizeof *j->k);
    j->v = calloc(ns->num_layers, sizeof *j->v);
    if (!j->model || !j->salt || !j->tokens || !j->k || !j->v) {
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
    pthread_cond_signal(&q->work);
    pthread_mutex_unlock(&q->mu);
    return 0;
}

void kvs_client_drain(kvs_client *c)
{
    if (c == NULL || c->async == NULL)
        return;
    struct kvs__async *q = c->async;
    pthread_mutex_lock(&q->mu);
    while (q->pending > 0)
        pthread_cond_wait(&q->idle, &q->mu);
    pthread_mutex_unlock(&q->mu);
}

void kvs__async_close(kvs_client *c)
{
    struct kvs__async *q = c->async;
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
