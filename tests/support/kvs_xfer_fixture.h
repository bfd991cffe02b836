/*
 * kvs_xfer_fixture.h — what the data plane's tests (test_xfer, test_xproc_chaos)
 * stand on: a small in-memory block store behind kvs_xfer_store_ops, a waiter
 * for one fetch or put, encoded blocks (kv_block.h), and a UCX_TLS without
 * cma where cma cannot work here.
 *
 * The store holds up to KVS_FX_STORE_MAX blocks by key. provide lends a
 * stored block as it is in KVS_XFER_FMT_STORED (the server reads the layers
 * from its header) and, in any other format, the same bytes cut into 4 equal
 * chunks. The puts' common part is here (a buffer of the offered length,
 * put_begins and put_ends counted); what a put must hold and where it is
 * filed is each program's own put_begin / put_end, built on
 * kvs_fx_put_begin / kvs_fx_put_end.
 *
 * Invariants: every field of a kvs_fx_store but srv (set before any fetch)
 * is read and written under its mu (a program's own store fields may share
 * that lock); provides - releases is what the server holds at any moment and
 * put_begins - put_ends the puts it has begun and not ended, so both are 0
 * whenever the server holds nothing; a stored block's bytes do not change
 * while it is stored.
 */
#ifndef KVS_XFER_FIXTURE_H
#define KVS_XFER_FIXTURE_H

#include "xfer.h"

#include <pthread.h>
#include <stdint.h>

/* ---- the store ----------------------------------------------------------------------- */

#define KVS_FX_STORE_MAX 16

typedef struct kvs_fx_entry {
    uint8_t key[KVS_XFER_KEY_LEN];
    uint8_t *bytes; /* owned: freed by kvs_fx_store_clear (set it NULL to keep it) */
    uint64_t len;
    int used;
    int corrupt_on_provide; /* lend a copy with one byte of the last tile flipped */
    uint8_t nonce[KVS_XFER_NONCE_LEN]; /* the request nonce its last provide was given */
} kvs_fx_entry;

/* Initialise mu (PTHREAD_MUTEX_INITIALIZER); the rest starts zeroed. */
typedef struct kvs_fx_store {
    pthread_mutex_t mu;
    kvs_fx_entry e[KVS_FX_STORE_MAX];
    long provides, releases, put_begins, put_ends;
    int put_stall_ms;     /* kvs_fx_put_begin holds the server's thread this long */
    int last_put_status;  /* what the last put_end returned */
    kvs_xfer_server *srv; /* kvs_fx_provide_later's lends go to it (set before fetching) */
} kvs_fx_store;

/* The test key number n (distinct for every n below 256). */
void kvs_fx_key(uint8_t key[KVS_XFER_KEY_LEN], unsigned n);

/* Frees every stored block and zeroes what kvs_fx_store_zero does. */
void kvs_fx_store_clear(kvs_fx_store *s);
/* Zeroes the counters, put_stall_ms and last_put_status; the blocks stay. */
void kvs_fx_store_zero(kvs_fx_store *s);
/* Stores len bytes (the store owns them) under key; dropped when it is full. */
void kvs_fx_store_add(kvs_fx_store *s, const uint8_t *key, uint8_t *bytes, uint64_t len);
/* The entry of key or NULL; the caller holds s->mu (valid while it does). */
kvs_fx_entry *kvs_fx_do_find(kvs_fx_store *s, const uint8_t *key);
/* What the server holds now: blocks lent and not released, puts begun and
 * not ended (one snapshot). */
void kvs_fx_store_books(kvs_fx_store *s, long *lent, long *puts_open);

/* ops with ctx = s, provide and release; the caller adds the rest. */
kvs_xfer_store_ops kvs_fx_store_ops(kvs_fx_store *s);
/* The store's provide (ctx: the store; session data unused). */
int kvs_fx_provide(void *ctx, void *sd, const uint8_t key[KVS_XFER_KEY_LEN], uint32_t fmt,
                   const uint8_t nonce[KVS_XFER_NONCE_LEN], kvs_xfer_block_src *src);
void kvs_fx_release(void *ctx, void *ref);

typedef int (*kvs_fx_provide_fn)(void *ctx, void *sd, const uint8_t key[KVS_XFER_KEY_LEN],
                                 uint32_t fmt, const uint8_t nonce[KVS_XFER_NONCE_LEN],
                                 kvs_xfer_block_src *src);

/* The body of a provide_async that takes the block: a thread of its own
 * sleeps delay_us, calls provide(s, NULL, key, fmt, nonce, ...) and hands the
 * result to kvs_xfer_server_provide_done(s->srv, handle, ...). 0 (pending),
 * 1 when no thread could be started (declined: the server provides it now),
 * or KVS_ENOMEM. */
int kvs_fx_provide_later(kvs_fx_store *s, kvs_fx_provide_fn provide, const uint8_t *key,
                         uint32_t fmt, const uint8_t *nonce, void *handle, unsigned delay_us);

/* A put under way: the client's key, the buffer its len bytes land in. */
typedef struct kvs_fx_put {
    uint8_t key[KVS_XFER_KEY_LEN];
    uint8_t *buf;
    uint64_t len;
} kvs_fx_put;

/* put_begin once the program has accepted the put: *buf (len bytes) and
 * *ref (a kvs_fx_put) for key, counted in put_begins, then put_stall_ms of
 * sleep on the server's thread. 0 or KVS_ENOMEM. */
int kvs_fx_put_begin(kvs_fx_store *s, const uint8_t *key, uint64_t len, void **buf, void **ref);
/* The end of put_end: status (what put_end returns) becomes last_put_status,
 * the put is counted in put_ends, p and its buffer are freed (set p->buf
 * NULL to keep the buffer). Returns status. */
int kvs_fx_put_end(kvs_fx_store *s, kvs_fx_put *p, int status);

/* ---- a fetch or put to wait for -------------------------------------------------------- */

#define KVS_FX_BLOCKS 16 /* blocks a waiter records, per fetch */

/* r->data of a request given the kvs_fx_on_* callbacks. Everything but the
 * knobs is written by the client's progress thread: read it under mu, or
 * after kvs_fx_waiter_wait returned 0. */
typedef struct kvs_fx_waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;                  /* on CLOCK_MONOTONIC */
    int done, status;                   /* on_done came, with status */
    int order_ok;                       /* every block's layers came 0, 1, 2, ... */
    uint32_t next_layer[KVS_FX_BLOCKS]; /* per block: the layers seen in order */
    int block_status[KVS_FX_BLOCKS];
    int block_done[KVS_FX_BLOCKS]; /* on_block came for it */
    int blocks_reported;
    long layers_seen;
    /* Knobs, each used once by the first on_layer after it is set: */
    int notify_fd;              /* write 'L' to it, then stall the progress thread 30 s */
    int stall_ms;               /* stall the progress thread this long */
    kvs_xfer_client *put_in_cb; /* try a kvs_xfer_put_wait on it (into put_in_cb_rc) */
    int put_in_cb_rc;
    /* on_done of a fetch first copies snap_len bytes of snap_src to snap */
    const void *snap_src;
    void *snap;
    uint64_t snap_len;
} kvs_fx_waiter;

/* Zeroes w (no knob set, order_ok 1); may be called again once w is done. */
void kvs_fx_waiter_init(kvs_fx_waiter *w);
void kvs_fx_waiter_fini(kvs_fx_waiter *w);
/* 0 once w is done, -1 when it was not within ms. */
int kvs_fx_waiter_wait(kvs_fx_waiter *w, unsigned ms);

void kvs_fx_on_layer(kvs_xfer_fetch_req *r, uint32_t block, uint32_t layer);
void kvs_fx_on_block(kvs_xfer_fetch_req *r, uint32_t block, int status);
void kvs_fx_on_done(kvs_xfer_fetch_req *r, int status);
void kvs_fx_on_put_done(kvs_xfer_put_req *r, int status);

/* ---- blocks and transports ------------------------------------------------------------- */

/* An encoded block: L (<= 64) layers alternating fp16 / fp8_e4m3 (all fp16
 * when fp16_only), H heads of 64, T tokens, from fp32 values drawn from
 * seed. 64-byte aligned, the caller frees it; its size in *len. Aborts when
 * the encoder refuses the parameters (a test's mistake). */
uint8_t *kvs_fx_block_new(uint32_t L, uint32_t H, uint32_t T, int fp16_only, unsigned seed,
                          uint64_t *len);

/* cma (process_vm_readv) needs ptrace rights over the peer: when UCX_TLS
 * names cma and a probe with a child of this process fails, cma leaves
 * UCX_TLS, with a message. Call before any UCX context exists. */
void kvs_fx_tls_setup(void);

#endif /* KVS_XFER_FIXTURE_H */
