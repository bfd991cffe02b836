/*
 * xproc.h — the isolated data plane (private to transfer/): kvs_xfer_server
 * with opts.isolate runs its UCX worker in a child process, kvstash-xferd
 * (xproc_main.c), and this process keeps the store. docs/TRANSFER.md
 * "Isolation".
 *
 * Why: UCX 1.13 aborts its process on some bytes any peer can send (13 bytes
 * to its tcp port; a listener answering junk to its connection). In the
 * child such an abort ends the data plane, which is restarted; the store and
 * every block in it stay in this process.
 *
 * Wire: a SOCK_SEQPACKET socketpair (the child's end is its fd 3), one
 * kvs__xp_msg header per message followed by n tail bytes. Both ends are the
 * same build on the same host: host byte order. Block bytes never travel on
 * the socket: the child reads a fetched block from the shared region (the
 * store's memory, fd 5: a read-only descriptor of it, sealed against writes
 * through any new one, xproc.c) or from the bounce region (fd 4,
 * read-write), and a put lands in the bounce region.
 *
 * Trust: the parent trusts nothing the child sends (ids are looked up in its
 * own tables, offsets it hands out itself); the child trusts the parent.
 */
#ifndef KVS_XPROC_H
#define KVS_XPROC_H

#include "xfer.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

enum {
    KVS__XP_HELLO = 1,     /* child: tail = its worker address */
    KVS__XP_OPEN,          /* parent call: a = session key, tail = client address */
    KVS__XP_CLOSE,         /* parent call: a = session id */
    KVS__XP_STATS,         /* parent call: reply tail = kvs_xfer_server_stats */
    KVS__XP_REPLY,         /* the answer to a call: seq, rc, a..d, reply, tail */
    KVS__XP_PROVIDE,       /* child: seq = its handle, a = session key, fmt, key,
                            * tail = the request's nonce (KVS_XFER_NONCE_LEN) */
    KVS__XP_PROVIDED,      /* parent: seq, rc, a = lend id, b = region, c = offset,
                            * d = len, fmt = layers, tail = layers + 1 bounds (none
                            * for layers 0), then the block's seal (the rest) */
    KVS__XP_RELEASE,       /* child: a = lend id */
    KVS__XP_PUT_BEGIN,     /* child call: a = session key, b = len, fmt, key, tail = meta;
                            * reply a = put id, c = bounce offset, reply,
                            * fmt = KVS__XP_PUT_BEGIN (a late one is ended) */
    KVS__XP_PUT_END,       /* child call: a = put id, rc = status; reply rc, reply */
    KVS__XP_SESSION_END,   /* child: a = session key (the session closed itself) */
    KVS__XP_PUT_END_ASYNC, /* child: seq = its handle, a = put id (every byte landed) */
    KVS__XP_PUT_ENDED,     /* parent: seq, rc, reply: the answer to PUT_END_ASYNC */
    /* child: seq = its handle, then as PUT_BEGIN (a, b, fmt, key, tail); not a
     * call: the progress thread goes on, and the answer is a PUT_BEGUN */
    KVS__XP_PUT_BEGIN_ASYNC,
    KVS__XP_PUT_BEGUN, /* parent: seq, then as PUT_BEGIN's reply (rc, a, c, reply) */
};

#define KVS__XP_REGION_BOUNCE 0u
#define KVS__XP_REGION_SHARED 1u
#define KVS__XP_TAIL_MAX      (65536u + 4096u)
#define KVS__XP_ADDR_MAX      65536u /* the child's worker address (HELLO) */
#define KVS__XP_FD_SOCK       3
#define KVS__XP_FD_BOUNCE     4
#define KVS__XP_FD_SHARED     5
/* The child's exit status when its shared-memory receive queue wedged
 * (kvs_xfer_server_opts.on_wedged): the parent says so and starts another. */
#define KVS__XP_EXIT_WEDGED 75
/* Exit status of a child that ended itself because sends to dead peers that
 * UCX never completes piled up (kvs_xfer_server_opts.on_stuck). */
#define KVS__XP_EXIT_STUCK 76

typedef struct kvs__xp_msg {
    uint32_t type;
    int32_t rc;
    uint64_t seq;
    uint64_t a, b, c, d;
    uint32_t fmt;
    uint32_t n; /* tail bytes */
    uint8_t key[KVS_XFER_KEY_LEN];
    kvs_xfer_put_reply reply;
} kvs__xp_msg;

/* One end of the socket: sends from any thread, calls that wait for their
 * REPLY (delivered by whichever thread reads the socket). */
typedef struct kvs__xp_conn {
    int fd;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t next_seq;
    int dead; /* set by kvs__xp_conn_fail: calls answer KVS_EUNAVAIL */
    /* A send waits at most this long for room in the socket (KVS_ETIMEDOUT);
     * 0 (kvs__xp_conn_init's): as long as it takes. */
    uint32_t send_ms;
    struct kvs__xp_wait *waits;
} kvs__xp_conn;

void kvs__xp_conn_init(kvs__xp_conn *c, int fd);
void kvs__xp_conn_fini(kvs__xp_conn *c);
/* Sends m (m->n set to n) and n tail bytes; 0, KVS_EUNAVAIL (the peer is
 * gone) or KVS_ETIMEDOUT (no room for c->send_ms: the peer does not read). */
int kvs__xp_send(kvs__xp_conn *c, kvs__xp_msg *m, const void *tail, uint32_t n);
/* Sends m with a fresh seq and waits up to timeout_ms for its REPLY: 0 with
 * *r (and up to cap tail bytes in tail, r->n the count), or KVS_EUNAVAIL
 * (connection gone) / KVS_ETIMEDOUT (no reply, or the send timed out). */
int kvs__xp_call(kvs__xp_conn *c, kvs__xp_msg *m, const void *tail, uint32_t n, kvs__xp_msg *r,
                 void *rtail, uint32_t cap, uint32_t timeout_ms);
/* Receives one message into buf (KVS__XP_TAIL_MAX + sizeof header): 1 with
 * *m and *tail set, 0 on EOF or error, -1 for a malformed message. */
int kvs__xp_recv(int fd, void *buf, kvs__xp_msg **m, uint8_t **tail);
/* The same for r bytes recv() put into buf (r <= 0: 0). */
int kvs__xp_parse(void *buf, ssize_t r, kvs__xp_msg **m, uint8_t **tail);
/* Hands a REPLY to the call waiting for it: 1, or 0 when none waits (it
 * timed out, or the seq is not one of ours). */
int kvs__xp_deliver(kvs__xp_conn *c, const kvs__xp_msg *m, const uint8_t *tail);
/* Wakes every waiting call with KVS_EUNAVAIL; later calls fail at once. */
void kvs__xp_conn_fail(kvs__xp_conn *c);

/* Starts path with argv, fds[i] as descriptor 3 + i and nothing else open
 * besides stdin (/dev/null), stdout and stderr; default signals, empty mask.
 * KVS__SPAWN_QUIET: UCX_HANDLE_ERRORS=none added to the environment when not
 * set. KVS__SPAWN_GROUP: in a process group of its own (its pid), so
 * kill(-pid) also ends whatever it started. */
#define KVS__SPAWN_QUIET 1u
#define KVS__SPAWN_GROUP 2u
int kvs__spawn(const char *path, char *const argv[], const int *fds, int nfds, unsigned flags,
               pid_t *pid);

/* The child's sandbox (xproc_sandbox.c; its own library, kvs_xproc_sandbox):
 * no new privileges, no capabilities, and a seccomp filter that keeps it off
 * every process's memory (ptrace, process_vm_*), off every other process's
 * signals, and in its process group. 0, or KVS_EINTERNAL with why in err. */
int kvs__xp_sandbox(char *err, size_t n);

/* The parent side (xproc.c), behind kvs_xfer_server's functions. */
typedef struct kvs__xp kvs__xp;
int kvs__xp_create(const kvs_xfer_server_opts *o, kvs__xp **out);
int kvs__xp_address(kvs__xp *x, const void **addr, size_t *len);
int kvs__xp_session_open(kvs__xp *x, const void *addr, size_t len, void *data,
                         kvs_xfer_session_info *info);
int kvs__xp_session_close(kvs__xp *x, uint64_t id);
int kvs__xp_stats(kvs__xp *x, kvs_xfer_server_stats *st);
void kvs__xp_provide_done(kvs__xp *x, void *handle, int status, const kvs_xfer_block_src *src);
void kvs__xp_put_done(kvs__xp *x, void *handle, int status, const kvs_xfer_put_reply *reply);
void kvs__xp_put_begun(kvs__xp *x, void *handle, int status, void *buf, void *ref,
                       const kvs_xfer_put_reply *reply);
void *kvs__xp_buffer(kvs__xp *x, uint64_t len);
void kvs__xp_buffer_free(kvs__xp *x, void *buf, uint64_t len);
void kvs__xp_destroy(kvs__xp *x);

#endif
