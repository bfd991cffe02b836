/*
 * ucx_addrcheck.c — the server's side of the address check: it keeps one
 * kvstash-ucx-addrcheck helper (ucx_addrcheck_main.c) running and asks it
 * about each client worker address before the server's own UCX parses it.
 *
 * The idea: UCX 1.13 aborts the process on some malformed worker addresses,
 * and those arrive from a Connect RPC. The helper is a separate process with
 * its own UCX context from the same environment; if an address kills it,
 * the address is refused (KVS_EINVAL) and the next check starts a new
 * helper. docs/TRANSFER.md "Sessions".
 *
 * Invariants: one check at a time (ac->mu); the helper is started with
 * kvs__spawn (posix_spawn, never fork: kvstashd runs gRPC and UCX threads),
 * with its end of a socketpair on fd 3, stdin from /dev/null, stdout and
 * stderr the server's, no other descriptor, default signal dispositions
 * and an empty mask; every helper that ends is reaped here.
 * Writes use MSG_NOSIGNAL, so a dead helper is an error, never a SIGPIPE.
 * At most KVS__AC_SPAWNS helpers start in any KVS__AC_WINDOW_MS: beyond
 * that a check answers KVS_ENOSPC without starting one.
 */
#include "kvs_error.h"
#include "kvs_log.h"
#include "ucx_internal.h"
#include "xproc.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KVS__AC_SPAWNS    10u
#define KVS__AC_WINDOW_MS 1000u
/* Beyond the wire-up time, what an answer may take (the helper's close is
 * bounded by 2 s, a cold UCX context by a few hundred ms). */
#define KVS__AC_SLACK_MS 5000u
/* How long a check waits for the one in progress before it answers busy. */
#define KVS__AC_WAIT_MS 250

struct kvs__ac {
    pthread_mutex_t mu;
    char *path;
    char *net_devices; /* "" for all */
    char *tls;         /* "" for UCX's choice */
    kvs_xfer_err_mode mode;
    uint32_t wire_ms;
    pid_t pid;                           /* 0: no helper */
    int fd;                              /* our end; -1 with no helper */
    uint64_t spawned_ms[KVS__AC_SPAWNS]; /* ring of start times */
    unsigned spawn_next;
    /* Read by kvs__ac_stats without mu (a check may hold it for seconds). */
    _Atomic uint64_t checks, rejected, crashes, busy, spawns;
};

int kvs__ac_create(const char *path, const char *net_devices, const char *tls,
                   kvs_xfer_err_mode mode, uint32_t wire_ms, kvs__ac **out)
{
    if (!path || !*path || !out)
        return KVS_EINVAL;
    if (access(path, X_OK) != 0)
        return KVS_ENOTFOUND;
    kvs__ac *ac = calloc(1, sizeof *ac);
    if (!ac)
        return KVS_ENOMEM;
    ac->path = strdup(path);
    ac->net_devices = strdup(net_devices ? net_devices : "");
    ac->tls = strdup(tls ? tls : "");
    if (!ac->path || !ac->net_devices || !ac->tls) {
        free(ac->path);
        free(ac->net_devices);
        free(ac->tls);
        free(ac);
        return KVS_ENOMEM;
    }
    pthread_mutex_init(&ac->mu, NULL);
    ac->mode = mode;
    ac->wire_ms = wire_ms ? wire_ms : 100;
    ac->fd = -1;
    *out = ac;
    return 0;
}

/* Reaps the helper: closes our end, SIGKILL unless it exits within
 * grace_ms. Returns its wait status (0 when it was never there). The kill
 * may be refused (in the isolated data plane's sandbox only the process
 * itself may be signalled): the helper's own watchdog (alarm, wire-up time
 * + 7 s) ends it then, and this waits that long at most before it leaves
 * the helper to its fate. */
/* Waits up to ms for pid to end: 1 with *ws once reaped, 0 if it still runs. */
static int reaped_within(pid_t pid, unsigned ms, int *ws)
{
    pid_t r;
    uint64_t until = kvs__now_ms() + ms;
    while ((r = waitpid(pid, ws, WNOHANG)) == 0 && kvs__now_ms() < until)
        usleep(1000);
    return r != 0;
}

static int ac_reap(kvs__ac *ac, unsigned grace_ms)
{
    if (ac->fd >= 0)
        close(ac->fd);
    ac->fd = -1;
    if (ac->pid <= 0)
        return 0;
    int ws = 0;
    if (!reaped_within(ac->pid, grace_ms, &ws)) {
        (void)kill(ac->pid, SIGKILL);
        if (!reaped_within(ac->pid, ac->wire_ms + 8000u, &ws))
            KVS_LOG_WARN("xfer", "address check helper %d did not end: left behind", (int)ac->pid);
    }
    ac->pid = 0;
    return ws;
}

static int ac_spawn(kvs__ac *ac)
{
    uint64_t now = kvs__now_ms();
    uint64_t oldest = ac->spawned_ms[ac->spawn_next];
    if (atomic_load(&ac->spawns) >= KVS__AC_SPAWNS && now - oldest < KVS__AC_WINDOW_MS)
        return KVS_ENOSPC;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return KVS_EINTERNAL;
    char ms[16];
    snprintf(ms, sizeof ms, "%u", ac->wire_ms);
    char *argv[] = {ac->path, ac->mode == KVS_XFER_ERR_PEER ? "peer" : "none",
                    ms,       ac->net_devices,
                    ac->tls,  NULL};
    /* Its socket as fd 3 and nothing else of the server's (kvs__spawn). */
    pid_t pid;
    int rc = kvs__spawn(ac->path, argv, &sv[1], 1, KVS__SPAWN_QUIET, &pid);
    close(sv[1]);
    if (rc != 0) {
        close(sv[0]);
        return rc;
    }
    ac->pid = pid;
    ac->fd = sv[0];
    ac->spawned_ms[ac->spawn_next] = now;
    ac->spawn_next = (ac->spawn_next + 1) % KVS__AC_SPAWNS;
    atomic_fetch_add(&ac->spawns, 1);
    return 0;
}

int kvs__ac_io(int fd, void *buf, size_t n, int out, uint64_t deadline_ms)
{
    char *p = buf;
    while (n) {
        if (deadline_ms) {
            uint64_t now = kvs__now_ms();
            if (now >= deadline_ms)
                return -1;
            struct pollfd pf = {.fd = fd, .events = out ? POLLOUT : POLLIN};
            int pr = poll(&pf, 1, (int)(deadline_ms - now));
            if (pr < 0 && errno == EINTR)
                continue;
            if (pr <= 0)
                return -1;
        }
        ssize_t r = out ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static int send_request(kvs__ac *ac, const void *addr, size_t len)
{
    uint32_t h = (uint32_t)len;
    return kvs__ac_io(ac->fd, &h, sizeof h, 1, 0) == 0 &&
                   kvs__ac_io(ac->fd, (void *)addr, len, 1, 0) == 0
               ? 0
               : -1;
}

/* Whether st is a status the helper may answer with. */
static int known_status(int32_t st)
{
    return st == 0 || (st < 0 && strcmp(kvs_errname(st), "KVS_E?") != 0);
}

static int check_locked(kvs__ac *ac, const void *addr, size_t len)
{
    /* A helper that ended between checks (it exits after a check UCX did not
     * finish, and says so; or it died of something else): a new one. A
     * send into a helper that is gone fails, so one retry with a fresh
     * helper tells that apart from this address. */
    int rc;
    for (int attempt = 0;; attempt++) {
        if (ac->fd < 0 && (rc = ac_spawn(ac)) != 0)
            return rc;
        if (send_request(ac, addr, len) == 0)
            break;
        (void)ac_reap(ac, 0);
        if (attempt > 0)
            return KVS_EINTERNAL;
    }
    atomic_fetch_add(&ac->checks, 1);
    kvs__ac_answer a;
    if (kvs__ac_io(ac->fd, &a, sizeof a, 0, kvs__now_ms() + ac->wire_ms + KVS__AC_SLACK_MS) != 0) {
        /* Died on this address (or hung on it: killed). */
        (void)ac_reap(ac, 0);
        atomic_fetch_add(&ac->crashes, 1);
        return KVS_EINVAL;
    }
    if (a.flags & KVS__AC_EXITING) /* it exits now; reap it, the next check starts another */
        (void)ac_reap(ac, 1000);
    return known_status(a.status) ? a.status : KVS_EINTERNAL;
}

int kvs__ac_check(kvs__ac *ac, const void *addr, size_t len)
{
    if (!ac || !addr || len == 0 || len > 65536)
        return KVS_EINVAL;
    /* Checks run one at a time on the callers' (gRPC) threads. One that
     * takes long (an address that wires up slowly or not at all: up to
     * addr_check_ms, its close up to 2 s) must not hold every caller's
     * thread behind it: a caller that waits KVS__AC_WAIT_MS gives up. */
    struct timespec ts;
#ifdef __SANITIZE_THREAD__
    /* GCC 12's ThreadSanitizer does not intercept pthread_mutex_clocklock
     * (it then reports the unlock below as one of an unlocked mutex): its
     * builds wait on the realtime clock, which it does intercept. */
    kvs__deadline_on(CLOCK_REALTIME, &ts, KVS__AC_WAIT_MS);
    if (pthread_mutex_timedlock(&ac->mu, &ts) != 0) {
#else
    kvs__deadline_ms(&ts, KVS__AC_WAIT_MS);
    if (pthread_mutex_clocklock(&ac->mu, CLOCK_MONOTONIC, &ts) != 0) {
#endif
        atomic_fetch_add(&ac->busy, 1);
        return KVS_ENOSPC;
    }
    int rc = check_locked(ac, addr, len);
    pthread_mutex_unlock(&ac->mu);
    if (rc != 0 && rc != KVS_ENOSPC && rc != KVS_EINTERNAL)
        atomic_fetch_add(&ac->rejected, 1);
    return rc;
}

void kvs__ac_stats(kvs__ac *ac, kvs_xfer_server_stats *st)
{
    if (!ac)
        return;
    st->addr_checks = atomic_load(&ac->checks);
    st->addr_rejected = atomic_load(&ac->rejected);
    st->addr_check_crashes = atomic_load(&ac->crashes);
    st->addr_check_spawns = atomic_load(&ac->spawns);
    st->addr_check_busy = atomic_load(&ac->busy);
}

void kvs__ac_destroy(kvs__ac *ac)
{
    if (!ac)
        return;
    pthread_mutex_lock(&ac->mu);
    (void)ac_reap(ac, 1000);
    pthread_mutex_unlock(&ac->mu);
    pthread_mutex_destroy(&ac->mu);
    free(ac->path);
    free(ac->net_devices);
    free(ac->tls);
    free(ac);
}
