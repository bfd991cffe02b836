/*
 * ucx_worker.c — one thread owns one UCX worker.
 *
 * The idea: UCX workers are used in single-thread mode (no locks inside
 * UCX); a dedicated thread calls ucp_worker_progress while there is work and
 * sleeps in epoll on the worker's event fd when there is none (UCX sleep
 * mode: progress until idle, then ucp_worker_arm; UCS_ERR_BUSY means more
 * events arrived, so progress again). Other threads never touch the worker:
 * they queue a task and call ucp_worker_signal, which wakes the epoll.
 *
 * Invariants: a task pushed before the thread armed the worker is seen by the
 * check of `pending` after ucp_worker_arm; one pushed after it is followed by
 * ucp_worker_signal, which makes the armed fd readable. So no wake-up is
 * lost.
 *
 * Bounded spin: while the owner has work outstanding (xw->active > 0: a
 * fetch, put or block send in flight), the thread keeps calling
 * ucp_worker_progress for up to spin_us after the last call that made
 * progress before it arms and sleeps. Streaming a block is a long run of
 * small events (8 KiB shared-memory fragments, 64 KiB tcp segments); paying
 * an arm, an epoll wake and the peer's wake-up signal for each one halves the
 * bandwidth. With nothing outstanding the thread sleeps after one empty poll,
 * so an idle process costs no CPU. spin_us = UINT32_MAX never sleeps.
 */
#include "ucx_internal.h"

#include "kvs_error.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

/* Sleep between two arms that both found UCX busy with nothing progressed. */
#define KVS__BUSY_BACKOFF_US 50
/* The longest such sleep, reached by doubling, while nothing of ours is
 * outstanding. */
#define KVS__BUSY_IDLE_MAX_US 1000
/* ... after UCX has stayed busy that long with nothing progressed. */
#define KVS__BUSY_IDLE_AFTER_MS 10

uint64_t kvs__now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void kvs__deadline_ms(struct timespec *ts, uint32_t ms)
{
    kvs__deadline_on(CLOCK_MONOTONIC, ts, ms);
}

void kvs__deadline_on(clockid_t clock, struct timespec *ts, uint32_t ms)
{
    clock_gettime(clock, ts);
    ts->tv_sec += ms / 1000u;
    ts->tv_nsec += (long)(ms % 1000u) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

int kvs__status_from_ucs(ucs_status_t st)
{
    switch (st) {
    case UCS_OK:
        return 0;
    case UCS_ERR_NO_MEMORY:
        return KVS_ENOMEM;
    case UCS_ERR_CANCELED:
        return KVS_ECANCELED;
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_ENDPOINT_TIMEOUT:
        return KVS_ETIMEDOUT;
    case UCS_ERR_INVALID_PARAM:
        return KVS_EINVAL;
    case UCS_ERR_MESSAGE_TRUNCATED:
        return KVS_EPROTO;
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_REJECTED:
    case UCS_ERR_IO_ERROR:
        return KVS_EUNAVAIL;
    default:
        return KVS_EIO;
    }
}

uint64_t kvs__xw_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* opts.spin, else KVS_UCX_SPIN_US from the environment, else the default. */
static uint32_t spin_us_of(uint32_t spin)
{
    if (spin)
        return spin;
    const char *e = getenv("KVS_UCX_SPIN_US");
    if (e && *e) {
        char *end;
        unsigned long long v = strtoull(e, &end, 10);
        if (*end == 0 && v > 0)
            return v >= UINT32_MAX ? UINT32_MAX : (uint32_t)v;
    }
    return KVS__SPIN_US_DEFAULT;
}

/* Whether the transports in use (UCX_TLS, else the caller's tls) may include
 * tcp (UCX warns about a transport setting no transport in use takes). */
static int tls_may_use_tcp(const char *tls)
{
    const char *t = getenv("UCX_TLS");
    if (!t || !*t)
        t = tls;
    return !t || !*t || t[0] == '^' || strstr(t, "tcp") || strstr(t, "all");
}

int kvs__xw_init(kvs__xw *xw, uint32_t spin, const char *net_devices, const char *tls, char *err)
{
    memset(xw, 0, sizeof *xw);
    xw->epfd = -1;
    xw->efd = -1;
    xw->spin_us = spin_us_of(spin);
    pthread_mutex_init(&xw->mu, NULL);
    pthread_cond_init(&xw->cv, NULL);

    ucp_config_t *cfg = NULL;
    ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
    if (st != UCS_OK)
        return kvs_fail(err, KVS_EUNAVAIL, "ucp_config_read: %s", ucs_status_string(st));
    /* UCX 1.13 over tcp: force-closing an endpoint with zero-copy sends in
     * flight leaves a completion behind that a later socket event calls
     * through a NULL pointer (server killed by SIGSEGV in
     * uct_tcp_iface_progress; test server_op_timeout, 5 crashes in 6 runs).
     * With zero copy off it never happened (0 in 18). Closing a session on a
     * timeout is exactly that case, so zero copy is off unless the operator
     * sets UCX_ZCOPY_THRESH. Rendezvous over cma (a get) is not affected. */
    if (!getenv("UCX_ZCOPY_THRESH"))
        (void)ucp_config_modify(cfg, "ZCOPY_THRESH", "inf");
    /* With zero copy off, tcp sends rendezvous data as AM bcopy fragments of
     * TCP_TX_SEG_SIZE: 8 KiB by default, 512 send() calls and receive
     * handlers per 4 MiB. 64 KiB fragments (what tcp's zero-copy path uses:
     * its limit is the receiver's 64 KiB RX_SEG_SIZE) cut that eightfold.
     * Peers need RX_SEG_SIZE >= this (the default is 64 KiB). The tcp
     * transport's own name for it is TX_SEG_SIZE (UCX_TCP_ is its prefix). */
    if (!getenv("UCX_TCP_TX_SEG_SIZE") && tls_may_use_tcp(tls))
        (void)ucp_config_modify(cfg, "TX_SEG_SIZE", "64K"); /* only tcp has this name */
    /* Network devices (tcp, ib) only: shared memory and self are UCX's
     * SHM_DEVICES / SELF_DEVICES and stay as they are. */
    if (net_devices && *net_devices && !getenv("UCX_NET_DEVICES")) {
        st = ucp_config_modify(cfg, "NET_DEVICES", net_devices);
        if (st != UCS_OK) {
            ucp_config_release(cfg);
            return kvs_fail(err, KVS_EINVAL, "NET_DEVICES=%s: %s", net_devices,
                            ucs_status_string(st));
        }
    }
    /* Transports: the caller's list unless the operator set UCX_TLS. Only
     * shared-memory lists are passed here (kvstashd and libkvstash on
     * loopback); under peer error handling UCX drops posix and sysv unless
     * MM_ERROR_HANDLING is on, so it is turned on with them (unless the
     * operator set it). */
    if (tls && *tls && !getenv("UCX_TLS")) {
        st = ucp_config_modify(cfg, "TLS", tls);
        if (st == UCS_OK && !getenv("UCX_MM_ERROR_HANDLING"))
            st = ucp_config_modify(cfg, "MM_ERROR_HANDLING", "y");
        if (st != UCS_OK) {
            ucp_config_release(cfg);
            return kvs_fail(err, KVS_EINVAL, "TLS=%s: %s", tls, ucs_status_string(st));
        }
    }
    ucp_params_t p = {0};
    p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    /* TAG is never used, but UCX 1.13 selects the rendezvous RMA lanes (cma on
     * one host) only when TAG is requested; with AM alone, AM rendezvous
     * falls back to copying fragments through the AM lane (ucx_info -e -u a
     * vs -u at). */
    p.features = UCP_FEATURE_AM | UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    p.mt_workers_shared = 0;
    st = ucp_init(&p, cfg, &xw->ctx);
    ucp_config_release(cfg);
    if (st != UCS_OK) {
        xw->ctx = NULL;
        return kvs_fail(err, KVS_EUNAVAIL, "ucp_init: %s", ucs_status_string(st));
    }
    ucp_worker_params_t wp = {0};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    st = ucp_worker_create(xw->ctx, &wp, &xw->worker);
    if (st != UCS_OK) {
        xw->worker = NULL;
        return kvs_fail(err, KVS_EUNAVAIL, "ucp_worker_create: %s", ucs_status_string(st));
    }
    ucp_address_t *a = NULL;
    st = ucp_worker_get_address(xw->worker, &a, &xw->addr_len);
    if (st != UCS_OK)
        return kvs_fail(err, KVS_EUNAVAIL, "ucp_worker_get_address: %s", ucs_status_string(st));
    xw->addr = a;
    st = ucp_worker_get_efd(xw->worker, &xw->efd);
    if (st != UCS_OK)
        return kvs_fail(err, KVS_EUNAVAIL, "ucp_worker_get_efd: %s", ucs_status_string(st));
    xw->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (xw->epfd < 0)
        return kvs_fail(err, KVS_EIO, "epoll_create1: %s", strerror(errno));
    struct epoll_event ev = {.events = EPOLLIN};
    if (epoll_ctl(xw->epfd, EPOLL_CTL_ADD, xw->efd, &ev) != 0)
        return kvs_fail(err, KVS_EIO, "epoll_ctl: %s", strerror(errno));
    return 0;
}

int kvs__xw_open(kvs__xw *xw, const kvs__xw_opts *o, uint32_t spin, const char *net_devices,
                 const char *tls, void *arg)
{
    int rc = kvs__xw_init(xw, spin, net_devices, tls, NULL);
    for (unsigned i = 0; rc == 0 && i < KVS__XW_MAX_AM && o->am[i].cb; i++) {
        ucp_am_handler_param_t p = {0};
        p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                       UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
        p.id = o->am[i].id;
        p.cb = o->am[i].cb;
        p.arg = arg;
        p.flags = UCP_AM_FLAG_WHOLE_MSG | o->am[i].flags;
        if (ucp_worker_set_am_recv_handler(xw->worker, &p) != UCS_OK)
            rc = KVS_EUNAVAIL;
    }
    if (rc == 0) {
        xw->tick = o->tick;
        xw->tick_arg = arg;
        rc = kvs__xw_start(xw, o->name);
    }
    if (rc != 0)
        kvs__xw_fini(xw);
    return rc;
}

int kvs__xw_address(const kvs__xw *xw, const void **addr, size_t *len)
{
    if (!addr || !len)
        return KVS_EINVAL;
    *addr = xw->addr;
    *len = xw->addr_len;
    return 0;
}

int kvs__xw_on_thread(const kvs__xw *xw)
{
    return xw->started && pthread_equal(pthread_self(), xw->thread);
}

void kvs__xw_run_tasks(kvs__xw *xw)
{
    if (atomic_load_explicit(&xw->pending, memory_order_acquire) == 0)
        return;
    pthread_mutex_lock(&xw->mu);
    kvs__xw_task *t = xw->head;
    xw->head = xw->tail = NULL;
    pthread_mutex_unlock(&xw->mu);
    while (t) {
        kvs__xw_task *next = t->next; /* an async t may be freed by its own fn */
        int sync = t->sync;
        atomic_fetch_sub(&xw->pending, 1);
        t->fn(t->arg);
        if (sync) {
            pthread_mutex_lock(&xw->mu);
            t->done = 1;
            pthread_cond_broadcast(&xw->cv);
            pthread_mutex_unlock(&xw->mu);
        }
        t = next;
    }
}

static void *xw_main(void *arg)
{
    kvs__xw *xw = arg;
    const uint64_t spin_ns = xw->spin_us == UINT32_MAX ? UINT64_MAX : xw->spin_us * 1000ull;
    uint64_t now = kvs__xw_now_ns();
    uint64_t next_tick = now + KVS__TICK_MS * 1000000ull;
    uint64_t last_busy = now; /* the last progress call that did something */
    unsigned busy_arms = 0;   /* UCS_ERR_BUSY from arm since progress last did something */
    unsigned idle_us = 0;     /* the last such sleep with nothing of ours outstanding */
    uint64_t busy_since = 0;  /* when UCX was first busy with nothing progressed (0: not) */
    for (;;) {
        kvs__xw_run_tasks(xw);
        if (atomic_load(&xw->stop))
            break;
        unsigned n = ucp_worker_progress(xw->worker);
        now = kvs__xw_now_ns();
        if (n) {
            last_busy = now;
            busy_arms = 0;
            idle_us = 0;
            busy_since = 0;
        }
        if (now >= next_tick) {
            if (xw->tick)
                xw->tick(xw->tick_arg, now / 1000000u);
            next_tick = now + KVS__TICK_MS * 1000000ull;
        }
        if (n || atomic_load(&xw->pending))
            continue;
        if (xw->active && (spin_ns == UINT64_MAX || now - last_busy < spin_ns)) {
            /* Bounded spin while work is outstanding. Yielding costs a
             * syscall when the core is ours alone, and hands it over at once
             * when the peer process (or anything else) waits for it. */
            sched_yield();
            continue;
        }
        ucs_status_t st = ucp_worker_arm(xw->worker);
        if (st == UCS_ERR_BUSY) {
            /* Once: events came in since the last progress; take them now.
             * Again with nothing progressed between: UCX cannot sleep (e.g.
             * sends pending on a peer's full shared-memory FIFO, which
             * signals nothing when it drains), so back off instead of arming
             * again at once: that loop cost a client 10-16 ms of CPU per
             * 2 MiB UCX put on shm while kvstashd ingested the one before
             * (service_bench --put-only, docs/BENCHMARKS.md). */
            if (++busy_arms > 1) {
                /* With nothing of ours outstanding the busy work is UCX's
                 * own and may never end (sends to a dead shared-memory
                 * peer: ucx_server.c, stuck_tick); 50 us sleeps then took
                 * 17 % of a core from an idle kvstash-xferd. So once such a
                 * spell has lasted KVS__BUSY_IDLE_AFTER_MS with nothing of
                 * ours outstanding, the sleep doubles up to 1 ms (a peer's
                 * message or a task then waits up to that long; epoll on the
                 * worker's fd would not wait: it stays readable). Shorter
                 * spells happen in normal shared-memory traffic and keep
                 * 50 us. */
                unsigned us = KVS__BUSY_BACKOFF_US;
                if (busy_since == 0)
                    busy_since = now;
                if (xw->active == 0 && now - busy_since >= KVS__BUSY_IDLE_AFTER_MS * 1000000ull) {
                    idle_us = idle_us ? idle_us * 2 : KVS__BUSY_BACKOFF_US;
                    if (idle_us > KVS__BUSY_IDLE_MAX_US)
                        idle_us = KVS__BUSY_IDLE_MAX_US;
                    us = idle_us;
                }
                struct timespec ts = {0, (long)us * 1000};
                nanosleep(&ts, NULL);
            }
            continue;
        }
        if (atomic_load(&xw->pending))
            continue;
        struct epoll_event ev;
        (void)epoll_wait(xw->epfd, &ev, 1, KVS__TICK_MS);
        last_busy = kvs__xw_now_ns(); /* a wake-up starts a new spin */
        busy_arms = 0;                /* and its first BUSY is taken at once */
        idle_us = 0;
        busy_since = 0;
    }
    return NULL;
}

int kvs__xw_start(kvs__xw *xw, const char *name)
{
    if (pthread_create(&xw->thread, NULL, xw_main, xw) != 0)
        return KVS_ENOMEM;
    (void)pthread_setname_np(xw->thread, name);
    xw->started = 1;
    return 0;
}

static void xw_push(kvs__xw *xw, kvs__xw_task *t)
{
    t->next = NULL;
    pthread_mutex_lock(&xw->mu);
    if (xw->tail)
        xw->tail->next = t;
    else
        xw->head = t;
    xw->tail = t;
    atomic_fetch_add_explicit(&xw->pending, 1, memory_order_release);
    pthread_mutex_unlock(&xw->mu);
    if (!kvs__xw_on_thread(xw))
        (void)ucp_worker_signal(xw->worker);
}

void kvs__xw_post(kvs__xw *xw, kvs__xw_task *t)
{
    t->sync = 0;
    t->done = 0;
    xw_push(xw, t);
}

void kvs__xw_call(kvs__xw *xw, void (*fn)(void *), void *arg)
{
    if (!xw->started || kvs__xw_on_thread(xw)) {
        fn(arg);
        return;
    }
    kvs__xw_task t = {.fn = fn, .arg = arg, .sync = 1};
    xw_push(xw, &t);
    pthread_mutex_lock(&xw->mu);
    while (!t.done)
        pthread_cond_wait(&xw->cv, &xw->mu);
    pthread_mutex_unlock(&xw->mu);
}

void kvs__xw_fini(kvs__xw *xw)
{
    if (xw->started) {
        atomic_store(&xw->stop, 1);
        (void)ucp_worker_signal(xw->worker);
        pthread_join(xw->thread, NULL);
        xw->started = 0;
    }
    kvs__xw_run_tasks(xw); /* anything posted during shutdown */
    if (xw->epfd >= 0)
        close(xw->epfd);
    if (xw->addr)
        ucp_worker_release_address(xw->worker, xw->addr);
    if (xw->worker)
        ucp_worker_destroy(xw->worker);
    if (xw->ctx)
        ucp_cleanup(xw->ctx);
    pthread_cond_destroy(&xw->cv);
    pthread_mutex_destroy(&xw->mu);
    xw->epfd = -1;
    xw->addr = NULL;
    xw->worker = NULL;
    xw->ctx = NULL;
}

void kvs__ep_close_force_on(ucp_worker_h worker, ucp_ep_h ep)
{
    ucp_request_param_t p = {0};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
    if (UCS_PTR_IS_PTR(r)) {
        while (ucp_request_check_status(r) == UCS_INPROGRESS)
            ucp_worker_progress(worker);
        ucp_request_free(r);
    }
}

void kvs__ep_close_force(kvs__xw *xw, ucp_ep_h ep)
{
    kvs__ep_close_force_on(xw->worker, ep);
}

int kvs__ep_create(kvs__xw *xw, const void *addr, size_t len, kvs_xfer_err_mode mode,
                   ucp_err_handler_cb_t cb, void *cb_arg, ucp_ep_h *ep)
{
    /* A worker address is a few hundred bytes; UCX parses it without a
     * length, so refuse what cannot be one before handing it over. */
    if (!addr || len < 8 || len > 65536)
        return KVS_EINVAL;
    /* UCX reads a truncated address past its end: into whatever follows the
     * caller's bytes (a protobuf buffer's heap neighbours in kvstashd, the
     * previous address in the address check's helper). UCX gets a copy
     * followed by KVS__ADDR_PAD zero bytes instead, so the same bytes parse
     * the same way in every process, and the check's verdict holds for the
     * server (msg_fuzz_grpcio found a truncated address that passed the
     * helper and crashed kvstashd). UCX keeps no pointer into it after
     * ucp_ep_create returns. */
    uint8_t *copy = calloc(1, len + KVS__ADDR_PAD);
    if (!copy)
        return KVS_ENOMEM;
    memcpy(copy, addr, len);
    ucp_ep_params_t p = {0};
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                   UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.address = (const ucp_address_t *)copy;
    p.err_mode =
        mode == KVS_XFER_ERR_PEER ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    p.err_handler.cb = cb;
    p.err_handler.arg = cb_arg;
    ucs_status_t st = ucp_ep_create(xw->worker, &p, ep);
    free(copy);
    return kvs__status_from_ucs_ep(st);
}

int kvs__status_from_ucs_ep(ucs_status_t st)
{
    /* Shared memory the peer made that this process may not attach: UCX's
     * segments are its user's alone (mode 0600, or /proc/<pid>/fd, which needs
     * ptrace rights), so the peer runs as another user (or where this process
     * cannot see its /dev/shm and processes). */
    return st == UCS_ERR_SHMEM_SEGMENT ? KVS_EPERM : kvs__status_from_ucs(st);
}

ucs_status_t kvs__am_send(ucp_ep_h ep, unsigned id, const void *hdr, size_t hlen, const void *buf,
                          size_t len, uint32_t flags, ucp_send_nbx_callback_t cb, void *user_data)
{
    ucp_request_param_t p = {0};
    p.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    p.cb.send = cb;
    p.user_data = user_data;
    p.flags = flags;
    /* UCS_PTR_STATUS: UCS_INPROGRESS for a request, UCS_OK for NULL. It reads
     * its argument twice, so never hand it the call itself. */
    ucs_status_ptr_t r = ucp_am_send_nbx(ep, id, hdr, hlen, buf, len, &p);
    return UCS_PTR_STATUS(r);
}

ucs_status_t kvs__am_recv(kvs__xw *xw, void *data, void *buf, size_t len,
                          ucp_am_recv_data_nbx_callback_t cb, void *user_data)
{
    ucp_request_param_t p = {0};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.recv_am = cb;
    p.user_data = user_data;
    ucs_status_ptr_t r = ucp_am_recv_data_nbx(xw->worker, data, buf, len, &p);
    return UCS_PTR_STATUS(r);
}
