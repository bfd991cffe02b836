/*
 * pool.c — worker threads over one mutex-guarded FIFO (see pool.h).
 *
 * Invariant: once `stopping` is set no job is accepted, and a worker exits
 * only when the queue is empty, so every accepted job runs exactly once.
 */
#include "pool.h"

#include "kvs_error.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct job {
    void (*fn)(void *);
    void *arg;
    struct job *next;
} job;

struct kvs_pool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *head, *tail;
    size_t queued;
    int stopping;
    pthread_t *threads;
    int n;
};

static void *worker(void *arg)
{
    kvs_pool *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->head == NULL && !p->stopping)
            pthread_cond_wait(&p->cv, &p->mu);
        job *j = p->head;
        if (j == NULL)
            break; /* stopping and drained */
        p->head = j->next;
        if (p->head == NULL)
            p->tail = NULL;
        p->queued--;
        pthread_mutex_unlock(&p->mu);
        j->fn(j->arg);
        free(j);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int kvs_pool_start(int n, kvs_pool **out)
{
    *out = NULL;
    if (n < 1)
        return KVS_EINVAL;
    kvs_pool *p = calloc(1, sizeof *p);
    if (p == NULL || (p->threads = calloc((size_t)n, sizeof *p->threads)) == NULL) {
        free(p);
        return KVS_ENOMEM;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    for (int i = 0; i < n; i++) {
        if (pthread_create(&p->threads[i], NULL, worker, p) != 0) {
            kvs_pool_stop(p);
            return KVS_ENOMEM;
        }
        p->n++;
    }
    *out = p;
    return 0;
}

int kvs_pool_submit(kvs_pool *p, void (*fn)(void *arg), void *arg)
{
    job *j = malloc(sizeof *j);
    if (j == NULL)
        return KVS_ENOMEM;
    j->fn = fn;
    j->arg = arg;
    j->next = NULL;
    pthread_mutex_lock(&p->mu);
    if (p->stopping) {
        pthread_mutex_unlock(&p->mu);
        free(j);
        return KVS_EUNAVAIL;
    }
    if (p->tail)
        p->tail->next = j;
    else
        p->head = j;
    p->tail = j;
    p->queued++;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return 0;
}

size_t kvs_pool_queued(kvs_pool *p)
{
    pthread_mutex_lock(&p->mu);
    size_t n = p->queued;
    pthread_mutex_unlock(&p->mu);
    return n;
}

void kvs_pool_stop(kvs_pool *p)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->mu);
    p->stopping = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n; i++)
        pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->threads);
    free(p);
}
