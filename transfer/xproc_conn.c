/*
 * xproc_conn.c — what both ends of the isolated data plane share: the
 * message socket with calls that wait for their reply (xproc.h), and
 * kvs__spawn, which starts a helper process (kvstash-xferd, and the address
 * check's kvstash-ucx-addrcheck) with exactly the descriptors it is given.
 */
#include "kvs_error.h"
#include "ucx_internal.h"
#include "xproc.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

typedef struct kvs__xp_wait {
    uint64_t seq;
    int done;
    kvs__xp_msg *r;
    void *tail;
    uint32_t cap;
    struct kvs__xp_wait *next;
} kvs__xp_wait;

void kvs__xp_conn_init(kvs__xp_conn *c, int fd)
{
    memset(c, 0, sizeof *c);
    c->fd = fd;
    c->next_seq = 1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
}

void kvs__xp_conn_fini(kvs__xp_conn *c)
{
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
}

/* kvs__xp_send with send_ms in place of c->send_ms. */
static int send_within(kvs__xp_conn *c, kvs__xp_msg *m, const void *tail, uint32_t n,
                       uint32_t send_ms)
{
    if (n > KVS__XP_TAIL_MAX)
        return KVS_EINVAL;
    m->n = n;
    struct iovec iov[2] = {{m, sizeof *m}, {(void *)tail, n}};
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = n ? 2 : 1};
    /* Bounded: a peer that stopped reading (stopped, or wedged with its
     * reader) fills the socket, and a send without a limit would then hold
     * this thread, and every caller queued behind it, for good. */
    int flags = MSG_NOSIGNAL | (send_ms ? MSG_DONTWAIT : 0);
    uint64_t until = 0;
    ssize_t w;
    for (;;) {
        if ((w = sendmsg(c->fd, &mh, flags)) >= 0)
            break;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return KVS_EUNAVAIL;
        uint64_t now = kvs__now_ms();
        if (!until)
            until = now + send_ms;
        if (now >= until)
            return KVS_ETIMEDOUT;
        struct pollfd pf = {.fd = c->fd, .events = POLLOUT};
        (void)poll(&pf, 1, (int)(until - now));
    }
    return w == (ssize_t)(sizeof *m + n) ? 0 : KVS_EUNAVAIL;
}

int kvs__xp_send(kvs__xp_conn *c, kvs__xp_msg *m, const void *tail, uint32_t n)
{
    return send_within(c, m, tail, n, c->send_ms);
}

int kvs__xp_call(kvs__xp_conn *c, kvs__xp_msg *m, const void *tail, uint32_t n, kvs__xp_msg *r,
                 void *rtail, uint32_t cap, uint32_t timeout_ms)
{
    kvs__xp_wait w = {.r = r, .tail = rtail, .cap = cap};
    pthread_mutex_lock(&c->mu);
    if (c->dead) {
        pthread_mutex_unlock(&c->mu);
        return KVS_EUNAVAIL;
    }
    w.seq = c->next_seq++;
    w.next = c->waits;
    c->waits = &w;
    pthread_mutex_unlock(&c->mu);
    m->seq = w.seq;
    /* One deadline for the send and the answer: a call never waits longer
     * than timeout_ms in all. */
    struct timespec until;
    kvs__deadline_ms(&until, timeout_ms);
    uint32_t send_ms = c->send_ms;
    if (send_ms && send_ms > timeout_ms)
        send_ms = timeout_ms;
    int rc = send_within(c, m, tail, n, send_ms);
    pthread_mutex_lock(&c->mu);
    while (rc == 0 && !w.done && !c->dead)
        if (pthread_cond_timedwait(&c->cv, &c->mu, &until) == ETIMEDOUT && !w.done)
            rc = KVS_ETIMEDOUT;
    if (rc == 0 && !w.done)
        rc = KVS_EUNAVAIL;
    for (kvs__xp_wait **p = &c->waits; *p; p = &(*p)->next)
        if (*p == &w) {
            *p = w.next;
            break;
        }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int kvs__xp_recv(int fd, void *buf, kvs__xp_msg **m, uint8_t **tail)
{
    ssize_t r;
    while ((r = recv(fd, buf, sizeof(kvs__xp_msg) + KVS__XP_TAIL_MAX, 0)) < 0 && errno == EINTR) {
    }
    return kvs__xp_parse(buf, r, m, tail);
}

int kvs__xp_parse(void *buf, ssize_t r, kvs__xp_msg **m, uint8_t **tail)
{
    if (r <= 0)
        return 0;
    *m = buf;
    *tail = (uint8_t *)buf + sizeof(kvs__xp_msg);
    if ((size_t)r < sizeof(kvs__xp_msg) || (*m)->n != (size_t)r - sizeof(kvs__xp_msg))
        return -1;
    return 1;
}

int kvs__xp_deliver(kvs__xp_conn *c, const kvs__xp_msg *m, const uint8_t *tail)
{
    int found = 0;
    pthread_mutex_lock(&c->mu);
    for (kvs__xp_wait *w = c->waits; w; w = w->next) {
        if (w->seq != m->seq || w->done)
            continue;
        *w->r = *m;
        uint32_t n = m->n < w->cap ? m->n : w->cap;
        if (n)
            memcpy(w->tail, tail, n);
        w->r->n = n;
        w->done = 1;
        found = 1;
        pthread_cond_broadcast(&c->cv);
        break;
    }
    pthread_mutex_unlock(&c->mu);
    return found;
}

void kvs__xp_conn_fail(kvs__xp_conn *c)
{
    pthread_mutex_lock(&c->mu);
    c->dead = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

int kvs__spawn(const char *path, char *const argv[], const int *fds, int nfds, unsigned flags,
               pid_t *pid)
{
    /* Copies above the target numbers first, so no dup2 overwrites a source
     * (dup2 onto its own number would also leave FD_CLOEXEC set). */
    int hi[8];
    if (nfds < 0 || nfds > 8)
        return KVS_EINVAL;
    for (int i = 0; i < nfds; i++) {
        hi[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 3 + nfds);
        if (hi[i] < 0) {
            while (i--)
                close(hi[i]);
            return KVS_EINTERNAL;
        }
    }
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&at);
    for (int i = 0; i < nfds; i++)
        posix_spawn_file_actions_adddup2(&fa, hi[i], 3 + i);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    /* Nothing else of the server's: a descriptor some library left without
     * close-on-exec (a client's socket, a pipe) must not live on in a
     * process that untrusted bytes may take over. */
    posix_spawn_file_actions_addclosefrom_np(&fa, 3 + nfds);
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &all);
    short sf = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
    if (flags & KVS__SPAWN_GROUP) {
        posix_spawnattr_setpgroup(&at, 0);
        sf |= POSIX_SPAWN_SETPGROUP;
    }
    posix_spawnattr_setflags(&at, sf);
    /* UCX_HANDLE_ERRORS=none unless set: a helper death is expected, and UCX
     * would otherwise print a backtrace per death into the server's log (its
     * one-line assertion message stays). UCX reads it before main. */
    size_t n = 0;
    while (environ[n])
        n++;
    char **envp = malloc((n + 2) * sizeof *envp);
    int rc = KVS_EINTERNAL;
    if (envp) {
        memcpy(envp, environ, n * sizeof *envp);
        envp[n] = ((flags & KVS__SPAWN_QUIET) && !getenv("UCX_HANDLE_ERRORS"))
                      ? "UCX_HANDLE_ERRORS=none"
                      : NULL;
        envp[n + 1] = NULL;
        rc = posix_spawn(pid, path, &fa, &at, argv, envp) == 0 ? 0 : KVS_EINTERNAL;
        free(envp);
    }
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    for (int i = 0; i < nfds; i++)
        close(hi[i]);
    return rc;
}
