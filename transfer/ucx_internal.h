/*
 * ucx_internal.h — what the UCX files of transfer/ share: the progress
 * thread that owns a worker (ucx_worker.c) and the wire format of the active
 * messages (docs/TRANSFER.md "Wire format").
 *
 * Invariants: only the progress thread touches the ucp_worker and its
 * endpoints; other threads post tasks (kvs__xw_post / kvs__xw_call). Wire
 * headers are fixed-size little-endian structs (x86-64 and aarch64 only, as
 * the rest of kvstash); a receiver copies a header out with memcpy (UCX gives
 * no alignment) and checks its size before reading a field.
 */
#ifndef KVS_UCX_INTERNAL_H
#define KVS_UCX_INTERNAL_H

#include "xfer.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <ucp/api/ucp.h>

/* ---- progress thread ---------------------------------------------------- */

typedef struct kvs__xw_task kvs__xw_task;
struct kvs__xw_task {
    void (*fn)(void *arg);
    void *arg;
    kvs__xw_task *next;
    /* kvs__xw_call only: */
    int sync;
    int done;
};

typedef struct kvs__xw {
    ucp_context_h ctx;
    ucp_worker_h worker;
    void *addr; /* our worker address (ucp_worker_release_address) */
    size_t addr_len;
    int epfd;
    int efd;          /* ucp_worker_get_efd */
    uint32_t spin_us; /* UINT32_MAX: never sleep */
    /* Operations in flight (the owner counts them, on the thread): while
     * non-zero the thread spins up to spin_us before sleeping. */
    unsigned active;
    pthread_t thread;
    int started;
    atomic_int stop;
    pthread_mutex_t mu; /* the task queue and the done flags */
    pthread_cond_t cv;
    kvs__xw_task *head, *tail;
    atomic_int pending; /* tasks queued: checked after ucp_worker_arm */
    /* Called on the thread about every 50 ms with a monotonic ms clock. */
    void (*tick)(void *arg, uint64_t now_ms);
    void *tick_arg;
} kvs__xw;

/* The progress thread calls its tick at most this often (and at least, while
 * nothing else wakes it, about this often: its epoll wait's timeout). */
#define KVS__TICK_MS 50

/* Default of kvs_xfer_*_opts.spin (µs); KVS_UCX_SPIN_US overrides it. */
#define KVS__SPIN_US_DEFAULT 200u

/* Context + worker (AM and wakeup features, single thread mode) and the
 * epoll set. spin: µs (0: KVS_UCX_SPIN_US or the default). net_devices: the
 * network devices UCX may use (UCX_NET_DEVICES syntax, e.g. "lo"; NULL: all;
 * ignored when the environment sets UCX_NET_DEVICES). tls: the transports
 * (UCX_TLS syntax, shared memory lists only; NULL: UCX's choice; ignored when
 * the environment sets UCX_TLS), with MM_ERROR_HANDLING on. Register AM
 * handlers on xw->worker, then kvs__xw_start. */
int kvs__xw_init(kvs__xw *xw, uint32_t spin, const char *net_devices, const char *tls, char *err);

/* What a client or a server brings its worker up with (kvs__xw_open): a
 * static description of its side of the protocol. */
#define KVS__XW_MAX_AM 4
typedef struct kvs__xw_opts {
    const char *name; /* as kvs__xw_start's */
    void (*tick)(void *arg, uint64_t now_ms);
    struct {
        unsigned id; /* KVS__AM_* */
        ucp_am_recv_callback_t cb;
        unsigned flags;   /* UCP_AM_FLAG_* besides WHOLE_MSG (PERSISTENT_DATA: eager bytes
                           * a handler may keep past its return, ucp_am_data_release) */
    } am[KVS__XW_MAX_AM]; /* whole-message handlers; the list ends at a NULL cb */
} kvs__xw_opts;

/* kvs__xw_init (spin, net_devices and tls as there), o's AM handlers and
 * tick, each called with arg, then kvs__xw_start: a worker whose thread
 * runs. On an error everything is released again (kvs__xw_fini). */
int kvs__xw_open(kvs__xw *xw, const kvs__xw_opts *o, uint32_t spin, const char *net_devices,
                 const char *tls, void *arg);
/* Our worker address, valid until kvs__xw_fini (KVS_EINVAL for NULL
 * out-params). */
int kvs__xw_address(const kvs__xw *xw, const void **addr, size_t *len);
/* name: the thread's name for ps/gdb (<= 15 chars). */
int kvs__xw_start(kvs__xw *xw, const char *name);
/* Runs fn(arg) on the thread and waits (inline when called on the thread). */
void kvs__xw_call(kvs__xw *xw, void (*fn)(void *), void *arg);
/* Queues a task (caller-owned memory, valid until fn has run). */
void kvs__xw_post(kvs__xw *xw, kvs__xw_task *t);
/* Runs the queued tasks now; on the thread only (a task may call it to wait
 * for tasks other threads will post). */
void kvs__xw_run_tasks(kvs__xw *xw);
/* Stops and joins the thread (after a final kvs__xw_call that closed the
 * endpoints), then releases the worker and context. Safe on a partial init. */
void kvs__xw_fini(kvs__xw *xw);
int kvs__xw_on_thread(const kvs__xw *xw);
uint64_t kvs__now_ms(void);
/* *ts = clock's now + ms: an absolute deadline on that clock. */
void kvs__deadline_on(clockid_t clock, struct timespec *ts, uint32_t ms);
/* kvs__deadline_on(CLOCK_MONOTONIC, ...), for pthread_cond_timedwait on a
 * CLOCK_MONOTONIC condvar and pthread_mutex_clocklock. */
void kvs__deadline_ms(struct timespec *ts, uint32_t ms);
uint64_t kvs__xw_now_ns(void);

/* Closes ep with FORCE and progresses until UCX is done with it; on the
 * thread only. Pending operations on ep complete (with an error) first. */
void kvs__ep_close_force(kvs__xw *xw, ucp_ep_h ep);
/* The same for an endpoint of another worker of the thread (the server's
 * probe worker). */
void kvs__ep_close_force_on(ucp_worker_h worker, ucp_ep_h ep);
/* Endpoint from an untrusted worker address, with err_mode and a failure
 * callback. UCX is handed a copy of the len bytes followed by KVS__ADDR_PAD
 * zero bytes (it parses without a length and reads a short address past its
 * end), so a given address parses the same in every process. */
#define KVS__ADDR_PAD 65536u
int kvs__ep_create(kvs__xw *xw, const void *addr, size_t len, kvs_xfer_err_mode mode,
                   ucp_err_handler_cb_t cb, void *cb_arg, ucp_ep_h *ep);
/* ucs_status_t -> KVS_E*. */
int kvs__status_from_ucs(ucs_status_t st);
/* The same for an endpoint's creation or wire-up (kvs__ep_create, the
 * address check's flush): UCS_ERR_SHMEM_SEGMENT is KVS_EPERM there, shared
 * memory of the peer's this process may not attach (another user's). */
int kvs__status_from_ucs_ep(ucs_status_t st);

/* ucp_am_send_nbx of hdr and buf on ep with the UCP_AM_SEND_FLAG_* flags.
 * UCS_INPROGRESS: cb(request, status, user_data) runs later and frees the
 * request; any other value is how the send ended at once, and cb is never
 * called. hdr, buf and user_data stay valid until then. */
ucs_status_t kvs__am_send(ucp_ep_h ep, unsigned id, const void *hdr, size_t hlen, const void *buf,
                          size_t len, uint32_t flags, ucp_send_nbx_callback_t cb, void *user_data);
/* ucp_am_recv_data_nbx of a rendezvous descriptor (data) into buf, on the
 * same terms: UCS_INPROGRESS, or the status it ended with at once. */
ucs_status_t kvs__am_recv(kvs__xw *xw, void *data, void *buf, size_t len,
                          ucp_am_recv_data_nbx_callback_t cb, void *user_data);

/* ---- address check (ucx_addrcheck.c; the helper: ucx_addrcheck_main.c) ------ */

/* A kvstash-ucx-addrcheck helper process and its socket. Thread-safe (one
 * check at a time, under its own mutex; never on the progress thread). */
typedef struct kvs__ac kvs__ac;
/* path must be executable (KVS_ENOTFOUND otherwise); net_devices and tls
 * (as kvs__xw_init's) may be NULL; strings are copied. The helper starts at the first check. */
int kvs__ac_create(const char *path, const char *net_devices, const char *tls,
                   kvs_xfer_err_mode mode, uint32_t wire_ms, kvs__ac **out);
/* 0 when the helper survived addr and UCX took it; KVS_EINVAL when the
 * helper died or hung on it; UCX's refusal (KVS_EUNAVAIL, ...) as the helper
 * saw it; KVS_ENOSPC when more than 10 helpers started in the last second or
 * another check held the helper for 250 ms; KVS_EINTERNAL when none can be
 * started. */
int kvs__ac_check(kvs__ac *ac, const void *addr, size_t len);
/* Adds the check's counters to st (addr_* fields). */
void kvs__ac_stats(kvs__ac *ac, kvs_xfer_server_stats *st);
/* Ends the helper (EOF, then SIGKILL after 1 s) and frees ac. NULL ok. */
void kvs__ac_destroy(kvs__ac *ac);
/* The helper's protocol on its socket: a request is a u32 length (8..65536)
 * and that many address bytes; the answer is this (host byte order: both
 * ends are the same build on the same machine). */
typedef struct kvs__ac_answer {
    int32_t status; /* 0: usable; else the KVS_E* UCX's refusal maps to */
    uint32_t flags; /* KVS__AC_EXITING: the helper exits after this answer */
} kvs__ac_answer;
#define KVS__AC_EXITING 1u
/* Sends (out) or receives exactly n bytes on socket fd (send with
 * MSG_NOSIGNAL); deadline_ms on kvs__now_ms's clock, 0 for none. 0, or -1 on
 * EOF, error or timeout. */
int kvs__ac_io(int fd, void *buf, size_t n, int out, uint64_t deadline_ms);

/* ---- GPU staging (ucx_staging.c, only with KVS_XFER_CUDA) -------------------- */

#ifdef KVS_XFER_CUDA
typedef struct kvs__stage kvs__stage;
/* 0 when p is device (or managed) memory; KVS_ENODEV without a usable GPU;
 * KVS_EINVAL for host memory. */
int kvs__cuda_dst_check(const void *p);
int kvs__stage_create(kvs__xw *xw, kvs__stage **out);
/* Waits until every queued copy is done and its completion posted. */
void kvs__stage_sync(kvs__stage *st);
/* Waits for the copies in flight, frees every pinned buffer. */
void kvs__stage_destroy(kvs__stage *st);
/* A pinned host buffer of >= cap bytes from the pool (thread-safe). */
int kvs__stage_get(kvs__stage *st, uint64_t cap, void **host);
void kvs__stage_put(kvs__stage *st, void *host);
/* Queues a host-to-device copy; fn(arg) runs on the progress thread once it
 * is done. When this returns an error fn is never called. */
int kvs__stage_copy(kvs__stage *st, void *dev, const void *host, size_t len, void (*fn)(void *arg),
                    void *arg);
#endif

/* ---- wire format ---------------------------------------------------------- */

#define KVS__WIRE_MAGIC 0x3158564Bu /* "KVX1" */

enum {
    KVS__AM_FETCH = 1,  /* client -> server: kvs__fetch_hdr, data = keys */
    KVS__AM_PUT = 2,    /* client -> server: kvs__put_hdr + metadata, data = payload (rndv) */
    KVS__AM_LAYER = 3,  /* server -> client: kvs__layer_hdr (+ seal on layer 0), data = bytes
                         * of 1+ layers */
    KVS__AM_STATUS = 4, /* server -> client: kvs__status_hdr; a put's verdict may carry a
                         * kvs__put_reply as data */
    KVS__AM_PROBE = 5,  /* server's probe worker -> server: a uint64_t nonce (the watchdog of
                         * its shared-memory receive queue, ucx_server.c) */
};

typedef struct kvs__fetch_hdr {
    uint32_t magic;
    uint32_t format;
    uint64_t session;
    uint8_t token[KVS_XFER_TOKEN_LEN];
    uint64_t req_id;
    uint32_t nblocks;
    uint32_t reserved;
    uint8_t nonce[KVS_XFER_NONCE_LEN]; /* kvs_xfer_fetch_req.nonce, passed to provide */
} kvs__fetch_hdr;

typedef struct kvs__put_hdr {
    uint32_t magic;
    uint32_t format;
    uint64_t session;
    uint8_t token[KVS_XFER_TOKEN_LEN];
    uint64_t req_id;
    uint64_t len;
    uint8_t key[KVS_XFER_KEY_LEN];
    uint32_t meta_len; /* metadata bytes that follow this struct in the AM header */
    uint32_t reserved;
} kvs__put_hdr;

#define KVS__LAYER_F_XXH3 0x1u /* sum is XXH3-64 of the layer bytes */
/* The block's seal (kvs_xfer_block_src.seal, opaque here): seal_len bytes
 * (1..KVS_XFER_MAX_SEAL) follow this struct in the AM header. Only on the
 * message of layer 0, which carries that layer alone (count 1). */
#define KVS__LAYER_F_SEAL 0x2u

typedef struct kvs__layer_hdr {
    uint64_t req_id;
    uint32_t block;
    uint32_t layer;
    uint32_t layers;
    uint32_t flags;
    uint64_t total; /* bytes of the whole block */
    uint64_t off;   /* this message's bytes land at [off, off + len) */
    uint64_t len;
    uint64_t sum;   /* XXH3-64 of [off, off + len) when KVS__LAYER_F_XXH3 */
    uint32_t count; /* layers layer..layer+count-1 travel in this message */
    uint32_t seal_len; /* with KVS__LAYER_F_SEAL: seal bytes after this header; else 0 */
} kvs__layer_hdr;

enum {
    KVS__ST_REQUEST = 1, /* the whole request failed (auth, malformed) */
    KVS__ST_BLOCK = 2,   /* one block of a fetch failed */
    KVS__ST_PUT = 3,     /* verdict of a put */
    KVS__ST_GOODBYE = 4, /* the server's process ends now: req_id is the session's id, the
                          * data its token (KVS_XFER_TOKEN_LEN bytes, eager); the client
                          * leaves UCX at once (older clients: a malformed status) */
};

/* Session tokens compared in constant time (no early exit): the server's
 * check of a request, the client's of a goodbye. */
static inline int kvs__token_eq(const uint8_t *a, const uint8_t *b)
{
    unsigned diff = 0;
    for (unsigned i = 0; i < KVS_XFER_TOKEN_LEN; i++)
        diff |= (unsigned)(a[i] ^ b[i]);
    return diff == 0;
}

typedef struct kvs__status_hdr {
    uint64_t req_id;
    uint32_t kind;
    uint32_t block;
    int32_t status;
    uint32_t reserved;
} kvs__status_hdr;

/* Data of a put's STATUS (KVS__ST_PUT): the stored key and size, and the
 * store's tag over them. A client ignores data of any other length (older
 * servers send none, or 40 bytes without the tag). */
typedef struct kvs__put_reply {
    uint8_t key[KVS_XFER_KEY_LEN];
    uint64_t stored_bytes;
    uint8_t tag[KVS_XFER_REPLY_TAG_LEN];
} kvs__put_reply;

_Static_assert(sizeof(kvs__put_reply) == 56, "put reply layout");
_Static_assert(sizeof(kvs__fetch_hdr) == 64, "fetch header layout");
_Static_assert(sizeof(kvs__put_hdr) == 88, "put header layout");
_Static_assert(sizeof(kvs__layer_hdr) == 64, "layer header layout");
_Static_assert(sizeof(kvs__status_hdr) == 24, "status header layout");

#endif /* KVS_UCX_INTERNAL_H */
