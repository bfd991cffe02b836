/*
 * pool.h — a fixed pool of worker threads running queued jobs (the
 * quantize-on-ingest workers of Put).
 *
 * Jobs run in submission order on whichever worker is free. A job owns its
 * argument; the pool never frees it. kvs_pool_stop waits until every queued
 * job has run, then joins the workers: the server stops the pool before it
 * shuts its completion queue down, because jobs finish gRPC calls.
 */
#ifndef KVS_POOL_H
#define KVS_POOL_H

#include <stddef.h>

typedef struct kvs_pool kvs_pool;

/* Starts n (>= 1) workers. 0, KVS_EINVAL or KVS_ENOMEM. */
int kvs_pool_start(int n, kvs_pool **out);

/* Queues fn(arg). 0, or KVS_ENOMEM / KVS_EUNAVAIL (stopping): then fn is never called. */
int kvs_pool_submit(kvs_pool *p, void (*fn)(void *arg), void *arg);

/* Jobs queued and not yet started. */
size_t kvs_pool_queued(kvs_pool *p);

/* Runs what is queued, joins the workers, frees the pool. NULL is a no-op. */
void kvs_pool_stop(kvs_pool *p);

#endif /* KVS_POOL_H */
