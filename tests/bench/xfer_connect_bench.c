/*
 * xfer_connect_bench.c — what the address check (xfer.h opts.addr_check, the
 * kvstash-ucx-addrcheck helper) costs a Connect, and what it lets through.
 *
 * Two measurements, one binary, re-executed so each part starts with fresh
 * UCX state and the UCX_* environment of its transport (as xfer_bench):
 *
 * 1. Latency (`--run tcp|shm`, one child per transport). Two servers in the
 *    child, one without the check and one with it (opts.addr_check = the
 *    helper, addr_check_ms 0: 100). Each round connects `--clients` fresh
 *    clients to each server, one after another, alternating off, on (in
 *    pairs of alternating order: off on, on off, ...), so load bursts on a
 *    shared machine hit both alike; medians are over all rounds. A
 *    client's worker (kvs_xfer_client_create) is made before the clock runs;
 *    timed are the server side of a Connect (kvs_xfer_server_session_open
 *    with that client's real address) and the whole connect (session_open +
 *    kvs_xfer_client_connect + one fetch of a small stored block, 32 KiB,
 *    until its on_done). A session counts only when that fetch returned the
 *    server's bytes exactly (memcmp); any other outcome is counted as
 *    invalid and fails the run. Both servers first serve 3 untimed connects
 *    (the helper's start, a cold UCX context, is not what a Connect costs).
 *    The clients live in the servers' process: the figures are the library
 *    calls, not a gRPC round trip.
 *
 * 2. Mutants (`--mutants-run`, one child, UCX_TLS of `--mut-tls`): the
 *    residual risk, a measurement and not a pass/fail test. A donor child
 *    holds a real client whose worker address is the base; N mutants of it
 *    (1-4 bytes each set to a different random value, positions and values
 *    from a fixed, settable seed) are offered one by one to a server with the
 *    check on, in a child (`--child`: an abort there is observed, not fatal).
 *    Each mutant is classified from the server's answer and its address-check
 *    counters: killed the check's helper (KVS_EINVAL, addr_check_crashes
 *    moved), refused by UCX (the helper's UCX refused it, or the server's own
 *    after the check passed), or accepted (the session opened; it is held
 *    `--hold-ms` so its endpoint wires up to the junk address, then closed,
 *    and the server answers only after that close). Every `--probe-every`
 *    mutants and at the end a fresh real client connects and must fetch the
 *    block byte for byte. A server that dies (or stops answering for 60 s)
 *    is recorded with the mutant in flight and the last accepted one (both
 *    in hex) and the tail of its log, and a new server child continues. The
 *    server's and the helpers' stderr go to a log file (`--log`, default
 *    /tmp/xfer_connect_bench.<pid>.log); the UCX assertion sites in it are
 *    counted at the end. Random mutants model a corrupt address, not a
 *    hostile peer: one that answers the helper's connection and the server's
 *    differently (say, silent to the first, junk to the second) is outside
 *    what they can find.
 *
 * Output: a summary line per transport, per-round medians, the mutant counts,
 * then
 *   RESULT check_ms_tcp=<x> check_ms_shm=<y> connect_ratio_tcp=<a>
 *          connect_ratio_shm=<b> mutants=<n> check_killed=<k> ucx_refused=<r>
 *          accepted=<c> server_deaths=<d>
 * (one line): check_ms is the median session_open with the check minus the
 * median without; connect_ratio the median whole connect with over without.
 *
 * Usage: xfer_connect_bench [--clients 40] [--rounds 6] [--mutants 300]
 *          [--seed 7] [--mut-tls tcp|shm] [--hold-ms 100] [--probe-every 50]
 *          [--only latency|mutants] [--helper PATH] [--log PATH]
 * tcp is UCX_TLS=tcp; shm is UCX_TLS=posix,self with UCX_MM_ERROR_HANDLING=y
 * (peer error handling keeps the shm lanes only with it); UCX picks the
 * network devices (all, as xfer_bench). The helper defaults to the build's
 * kvstash-ucx-addrcheck.
 */
#include "../support/kvs_bench_stats.h"
#include "../support/kvs_fdio.h"
#include "kv_block.h"
#include "kvs_error.h"
#include "xfer.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef KVS_BENCH_ADDRCHECK
#define KVS_BENCH_ADDRCHECK "kvstash-ucx-addrcheck"
#endif

#define WARMUP      3
#define MAX_CLIENTS 1000
#define MAX_ROUNDS  40
#define MAX_MUTANTS 100000
#define ANSWER_MS   60000 /* a server child silent this long is counted dead */

static const char *g_self;
static const char *g_helper = KVS_BENCH_ADDRCHECK;

/* The q-quantile (nearest rank; 0.5 is the median's midpoint rule). Sorts v. */
static double quantile(double *v, int n, double q)
{
    if (n <= 0 || q == 0.5)
        return kvs_bench_median(v, n);
    qsort(v, (size_t)n, sizeof *v, kvs_bench_cmp_double);
    int k = (int)ceil(q * n) - 1;
    return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

static void hex(const uint8_t *b, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n && o + 3 <= cap; i++)
        o += (size_t)snprintf(out + o, cap - o, "%02x", b[i]);
    out[o < cap ? o : cap - 1] = 0;
}

/* ---- the block every server serves (for any key) ------------------------------------- */

static uint8_t *g_blk;
static uint64_t g_blk_len;

/* 2 fp16 layers x 1 head x 64 dims x 64 tokens: 32 KiB of K+V, a small block. */
static int make_block(void)
{
    enum { L = 2, H = 1, D = 64, T = 64 };
    kvs_scheme schemes[L] = {KVS_SCHEME_FP16, KVS_SCHEME_FP16};
    kvs_block_params p = {.layers = L,
                          .heads = H,
                          .head_dim = D,
                          .block_tokens = T,
                          .src_dtype = KVS_DTYPE_FP32,
                          .schemes = schemes};
    static float src[T * H * D];
    uint32_t x = 777;
    for (size_t i = 0; i < sizeof src / sizeof src[0]; i++) {
        x = x * 1664525u + 1013904223u;
        src[i] = (float)((int)(x >> 12) % 4000 - 2000) / 1000.0f;
    }
    const void *ks[L] = {src, src};
    size_t size = kvs_block_size(&p);
    g_blk = aligned_alloc(64, (size + 63) / 64 * 64);
    char err[KVS_ERR_LEN] = "";
    if (!g_blk || kvs_block_encode(&p, ks, ks, NULL, g_blk, size, err) != 0) {
        fprintf(stderr, "xfer_connect_bench: encode: %s\n", err);
        return -1;
    }
    g_blk_len = size;
    return 0;
}

static int sv_provide(void *ctx, void *sd, const uint8_t *key, uint32_t fmt, const uint8_t *nonce,
                      kvs_xfer_block_src *src)
{
    (void)ctx;
    (void)sd;
    (void)nonce;
    (void)key;
    if (fmt != KVS_XFER_FMT_STORED)
        return KVS_EINVAL;
    src->bytes = g_blk;
    src->len = g_blk_len;
    src->ref = NULL;
    return 0;
}

static void sv_release(void *ctx, void *ref)
{
    (void)ctx;
    (void)ref;
}

static int server_new(int check, kvs_xfer_server **out)
{
    kvs_xfer_server_opts o = {0};
    o.ops.provide = sv_provide;
    o.ops.release = sv_release;
    o.err_mode = KVS_XFER_ERR_PEER; /* as kvstashd */
    o.addr_check = check ? g_helper : NULL;
    int rc = kvs_xfer_server_create(&o, out);
    if (rc != 0)
        fprintf(stderr, "xfer_connect_bench: server (check %s, helper %s): %s\n",
                check ? "on" : "off", g_helper, kvs_strerror(rc));
    return rc;
}

/* ---- a client's one fetch -------------------------------------------------------------- */

typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    int status;
} waiter;

static void w_done(kvs_xfer_fetch_req *r, int status)
{
    waiter *w = r->data;
    pthread_mutex_lock(&w->mu);
    w->status = status;
    w->done = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Fetches the block into buf (cap bytes) and waits for on_done (the
 * client's timeout bounds the wait). 0 and *got, or the failure. */
static int fetch_one(kvs_xfer_client *c, void *buf, uint64_t cap, uint64_t *got)
{
    waiter w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    uint8_t key[KVS_XFER_KEY_LEN] = {1};
    kvs_xfer_dst dst = {.buf = buf, .cap = cap, .mem = KVS_XFER_MEM_HOST};
    kvs_xfer_fetch_req req = {.format = KVS_XFER_FMT_STORED,
                              .nblocks = 1,
                              .keys = key,
                              .dst = &dst,
                              .on_done = w_done,
                              .data = &w};
    int rc = kvs_xfer_fetch(c, &req);
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&w.mu);
    while (!w.done)
        pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    *got = dst.len;
    return w.status ? w.status : dst.status;
}

/* Whether buf holds the served block (len bytes fetched). */
static int valid(const void *buf, uint64_t len)
{
    return len == g_blk_len && memcmp(buf, g_blk, g_blk_len) == 0;
}

/* ---- 1. latency -------------------------------------------------------------------------- */

/* One Connect against srv: a fresh client (not timed), then session_open
 * (*open_ms) and the whole connect through the first fetch (*conn_ms). 1:
 * valid (the fetched bytes are the block), 0: invalid (reason on stderr). */
static int one_connect(kvs_xfer_server *srv, void *buf, double *open_ms, double *conn_ms)
{
    kvs_xfer_client *c = NULL;
    int rc = kvs_xfer_client_create(NULL, &c);
    if (rc != 0) {
        fprintf(stderr, "xfer_connect_bench: client: %s\n", kvs_strerror(rc));
        return 0;
    }
    const void *ca, *sa;
    size_t cl, sl;
    kvs_xfer_client_address(c, &ca, &cl);
    kvs_xfer_server_address(srv, &sa, &sl);
    memset(buf, 0, g_blk_len);
    kvs_xfer_session_info info;
    uint64_t got = 0;
    double t0 = kvs_bench_now_s();
    rc = kvs_xfer_server_session_open(srv, ca, cl, NULL, &info);
    double t1 = kvs_bench_now_s();
    int ok = 0, opened = rc == 0;
    const char *step = "session_open";
    if (rc == 0) {
        step = "connect";
        rc = kvs_xfer_client_connect(c, sa, sl, &info);
        if (rc == 0) {
            step = "fetch";
            rc = fetch_one(c, buf, g_blk_len, &got);
        }
    }
    double t2 = kvs_bench_now_s();
    if (rc == 0 && valid(buf, got)) {
        ok = 1;
        *open_ms = (t1 - t0) * 1e3;
        *conn_ms = (t2 - t0) * 1e3;
    } else {
        fprintf(stderr, "xfer_connect_bench: %s failed: %s\n", step,
                rc ? kvs_strerror(rc) : "fetched bytes differ from the block");
    }
    if (opened)
        (void)kvs_xfer_server_session_close(srv, info.id);
    kvs_xfer_client_destroy(c);
    return ok;
}

static int run_main(const char *name, int clients, int rounds)
{
    if (make_block() != 0)
        return 1;
    kvs_xfer_server *srv[2] = {NULL, NULL}; /* [0]: no check, [1]: the check */
    if (server_new(0, &srv[0]) || server_new(1, &srv[1]))
        return 1;
    void *buf = aligned_alloc(64, (g_blk_len + 63) / 64 * 64);
    int n = clients * rounds;
    double *open_v[2], *conn_v[2];
    for (int k = 0; k < 2; k++) {
        open_v[k] = malloc((size_t)n * sizeof(double));
        conn_v[k] = malloc((size_t)n * sizeof(double));
    }
    double *r_open[2], *r_conn[2]; /* this round's */
    for (int k = 0; k < 2; k++) {
        r_open[k] = malloc((size_t)clients * sizeof(double));
        r_conn[k] = malloc((size_t)clients * sizeof(double));
        if (!open_v[k] || !conn_v[k] || !r_open[k] || !r_conn[k])
            return 1;
    }
    if (!buf)
        return 1;
    int nv[2] = {0, 0}, invalid = 0;
    /* Warm-up, not counted: the helper starts on the first checked open. */
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < WARMUP; i++) {
            double a, b;
            invalid += !one_connect(srv[k], buf, &a, &b);
        }
    for (int r = 0; r < rounds; r++) {
        int m[2] = {0, 0};
        /* Connects alternate off/on, in pairs whose order alternates too
         * (off on, on off, ...): a burst of load on this shared machine hits
         * both sides alike. */
        for (int i = 0; i < 2 * clients; i++) {
            int k = (i / 2) % 2 ? !(i % 2) : i % 2;
            double a, b;
            if (one_connect(srv[k], buf, &a, &b)) {
                open_v[k][nv[k]] = r_open[k][m[k]] = a;
                conn_v[k][nv[k]] = r_conn[k][m[k]] = b;
                nv[k]++;
                m[k]++;
            } else {
                invalid++;
            }
        }
        double mo[2], mc[2];
        for (int k = 0; k < 2; k++) {
            mo[k] = quantile(r_open[k], m[k], 0.5);
            mc[k] = quantile(r_conn[k], m[k], 0.5);
        }
        printf("%-3s round %2d  session_open median off %7.3f on %7.3f ms  connect median off "
               "%7.3f on %7.3f ms  (%d + %d valid)\n",
               name, r, mo[0], mo[1], mc[0], mc[1], m[0], m[1]);
        fflush(stdout);
    }
    kvs_xfer_server_stats st[2];
    for (int k = 0; k < 2; k++)
        kvs_xfer_server_stats_get(srv[k], &st[k]);
    double om[2], op[2], cm[2], cp[2];
    for (int k = 0; k < 2; k++) {
        op[k] = quantile(open_v[k], nv[k], 0.9);
        om[k] = quantile(open_v[k], nv[k], 0.5);
        cp[k] = quantile(conn_v[k], nv[k], 0.9);
        cm[k] = quantile(conn_v[k], nv[k], 0.5);
    }
    printf("%-3s helper: %llu checks, %llu refused, %llu helper deaths, %llu helper starts\n", name,
           (unsigned long long)st[1].addr_checks, (unsigned long long)st[1].addr_rejected,
           (unsigned long long)st[1].addr_check_crashes,
           (unsigned long long)st[1].addr_check_spawns);
    printf("ROW %s %.4f %.4f %.4f %.4f %.4f %.4f %.4f %.4f %d %d %d\n", name, om[0], op[0], om[1],
           op[1], cm[0], cp[0], cm[1], cp[1], nv[0], nv[1], invalid);
    fflush(stdout);
    kvs_xfer_server_destroy(srv[0]);
    kvs_xfer_server_destroy(srv[1]);
    for (int k = 0; k < 2; k++) {
        free(open_v[k]);
        free(conn_v[k]);
        free(r_open[k]);
        free(r_conn[k]);
    }
    free(buf);
    free(g_blk);
    return invalid ? 1 : 0;
}

/* ---- 2. mutants: the server child ------------------------------------------------------ */

enum { CLS_ACCEPTED, CLS_KILLED, CLS_CHECK_REFUSED, CLS_SERVER_REFUSED, CLS_BUSY };

typedef struct mut_reply {
    int32_t rc;          /* session_open's status */
    int32_t cls;         /* CLS_* */
    int32_t close_rc;    /* session_close's, for an accepted one */
    uint32_t busy_waits; /* KVS_ENOSPC answers waited out */
} mut_reply;

static int read_addr(int fd, uint8_t **out, uint32_t *len)
{
    uint32_t n;
    if (kvs_read_full(fd, &n, sizeof n) || n == 0 || n > 65536)
        return -1;
    uint8_t *a = malloc(n);
    if (!a || kvs_read_full(fd, a, n)) {
        free(a);
        return -1;
    }
    *out = a;
    *len = n;
    return 0;
}

/* session_open with KVS_ENOSPC (the helper died more than 10 times in a
 * second) waited out: that answer is about the rate, not the address. */
static int open_patient(kvs_xfer_server *srv, const uint8_t *a, uint32_t n,
                        kvs_xfer_session_info *info, uint32_t *waits)
{
    int rc;
    for (int i = 0; i < 5; i++) {
        rc = kvs_xfer_server_session_open(srv, a, n, NULL, info);
        if (rc != KVS_ENOSPC)
            return rc;
        (*waits)++;
        usleep(1100 * 1000);
    }
    return rc;
}

/* `--child RFD WFD HOLD_MS`: a server with the check on. Commands on rfd:
 * 'M' len addr (a mutant: mut_reply), 'P' len addr (a real client: i32 rc,
 * session info), 'C' id (close: i32 rc), 'S' (stats), EOF (exit). */
static int child_main(int rfd, int wfd, unsigned hold_ms)
{
    (void)fcntl(rfd, F_SETFD, FD_CLOEXEC); /* not inherited by the helper */
    (void)fcntl(wfd, F_SETFD, FD_CLOEXEC);
    if (make_block() != 0)
        return 2;
    kvs_xfer_server *srv = NULL;
    if (server_new(1, &srv) != 0)
        return 3;
    const void *sa;
    size_t sl;
    kvs_xfer_server_address(srv, &sa, &sl);
    uint32_t sl32 = (uint32_t)sl;
    if (kvs_write_full(wfd, &sl32, sizeof sl32) || kvs_write_full(wfd, sa, sl))
        return 4;
    for (;;) {
        uint8_t cmd;
        if (kvs_read_full(rfd, &cmd, 1))
            break;
        if (cmd == 'M' || cmd == 'P') {
            uint8_t *a;
            uint32_t n;
            if (read_addr(rfd, &a, &n))
                return 5;
            kvs_xfer_server_stats s0, s1;
            kvs_xfer_session_info info = {0};
            mut_reply m = {0};
            kvs_xfer_server_stats_get(srv, &s0);
            m.rc = open_patient(srv, a, n, &info, &m.busy_waits);
            kvs_xfer_server_stats_get(srv, &s1);
            free(a);
            if (cmd == 'P') {
                if (kvs_write_full(wfd, &m.rc, sizeof m.rc) ||
                    kvs_write_full(wfd, &info, sizeof info))
                    return 6;
                continue;
            }
            if (m.rc == 0) {
                m.cls = CLS_ACCEPTED;
                usleep(hold_ms * 1000u); /* its endpoint wires up to the junk */
                m.close_rc = kvs_xfer_server_session_close(srv, info.id);
                kvs_xfer_server_stats_get(srv, &s1); /* the progress thread still runs */
            } else if (m.rc == KVS_ENOSPC) {
                m.cls = CLS_BUSY;
            } else if (s1.addr_check_crashes > s0.addr_check_crashes) {
                m.cls = CLS_KILLED;
            } else if (s1.addr_rejected > s0.addr_rejected) {
                m.cls = CLS_CHECK_REFUSED;
            } else {
                m.cls = CLS_SERVER_REFUSED;
            }
            if (kvs_write_full(wfd, &m, sizeof m))
                return 6;
        } else if (cmd == 'C') {
            uint64_t id;
            if (kvs_read_full(rfd, &id, sizeof id))
                return 5;
            int32_t rc = kvs_xfer_server_session_close(srv, id);
            if (kvs_write_full(wfd, &rc, sizeof rc))
                return 6;
        } else if (cmd == 'S') {
            kvs_xfer_server_stats st;
            kvs_xfer_server_stats_get(srv, &st);
            if (kvs_write_full(wfd, &st, sizeof st))
                return 6;
        } else {
            return 7;
        }
    }
    kvs_xfer_server_destroy(srv);
    free(g_blk);
    return 0;
}

/* `--donor WFD`: a real client whose address the mutants come from; it
 * stays up (its worker answers whatever the mutants make the server send)
 * until stdin closes. */
static int donor_main(int wfd)
{
    (void)fcntl(wfd, F_SETFD, FD_CLOEXEC);
    kvs_xfer_client *c = NULL;
    if (kvs_xfer_client_create(NULL, &c) != 0)
        return 2;
    const void *ca;
    size_t cl;
    kvs_xfer_client_address(c, &ca, &cl);
    uint32_t n = (uint32_t)cl;
    if (kvs_write_full(wfd, &n, sizeof n) || kvs_write_full(wfd, ca, cl))
        return 3;
    close(wfd);
    char ch;
    while (read(0, &ch, 1) > 0) {
    }
    kvs_xfer_client_destroy(c);
    return 0;
}

/* ---- 2. mutants: the driver --------------------------------------------------------------- */

typedef struct proc {
    pid_t pid;
    int to, from; /* our ends; -1 when not there */
} proc;

/* Reads n bytes within ms; -1 on EOF, error or timeout. */
static int read_within(int fd, void *buf, size_t n, int ms)
{
    uint8_t *p = buf;
    double until = kvs_bench_now_s() + ms / 1e3;
    while (n) {
        int left = (int)((until - kvs_bench_now_s()) * 1e3);
        if (left <= 0)
            return -1;
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int pr = poll(&pf, 1, left);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            return -1;
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* Forks and execs this binary with args; the child gets the read end of
 * our `to` pipe as RFD (or stdin for the donor) and the write end of `from`
 * as WFD, stdout and stderr on logfd (when >= 0). Every pipe is O_CLOEXEC so
 * no child holds another's ends. */
static int spawn(proc *p, const char *role, const char *extra, int logfd)
{
    int to[2], from[2];
    if (pipe2(to, O_CLOEXEC) || pipe2(from, O_CLOEXEC))
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        char a[16], b[16];
        if (logfd >= 0) {
            dup2(logfd, 1);
            dup2(logfd, 2);
        }
        if (strcmp(role, "--donor") == 0) {
            dup2(to[0], 0);
            (void)fcntl(from[1], F_SETFD, 0);
            snprintf(b, sizeof b, "%d", from[1]);
            execl(g_self, g_self, role, b, (char *)NULL);
        } else {
            (void)fcntl(to[0], F_SETFD, 0);
            (void)fcntl(from[1], F_SETFD, 0);
            snprintf(a, sizeof a, "%d", to[0]);
            snprintf(b, sizeof b, "%d", from[1]);
            execl(g_self, g_self, role, a, b, extra, (char *)NULL);
        }
        _exit(127);
    }
    close(to[0]);
    close(from[1]);
    p->pid = pid;
    p->to = to[1];
    p->from = from[0];
    return 0;
}

/* Ends a child: closes its pipes, waits up to 5 s, then SIGKILL (*killed
 * set, when given). Returns its wait status. */
static int reap(proc *p, int *killed)
{
    if (killed)
        *killed = 0;
    if (p->to >= 0)
        close(p->to);
    if (p->from >= 0)
        close(p->from);
    p->to = p->from = -1;
    int ws = 0;
    if (p->pid <= 0)
        return 0;
    for (int i = 0; i < 500; i++) {
        if (waitpid(p->pid, &ws, WNOHANG) == p->pid) {
            p->pid = 0;
            return ws;
        }
        usleep(10000);
    }
    kill(p->pid, SIGKILL);
    waitpid(p->pid, &ws, 0);
    p->pid = 0;
    if (killed)
        *killed = 1;
    return ws;
}

static void describe_ws(int ws, char *out, size_t cap)
{
    if (WIFSIGNALED(ws))
        snprintf(out, cap, "signal %d (%s)", WTERMSIG(ws), strsignal(WTERMSIG(ws)));
    else if (WIFEXITED(ws))
        snprintf(out, cap, "exit %d", WEXITSTATUS(ws));
    else
        snprintf(out, cap, "status 0x%x", ws);
}

static int server_start(proc *s, unsigned hold_ms, int logfd, uint8_t **sa, uint32_t *sl)
{
    char h[16];
    snprintf(h, sizeof h, "%u", hold_ms);
    if (spawn(s, "--child", h, logfd) != 0)
        return -1;
    uint32_t n;
    if (read_within(s->from, &n, sizeof n, ANSWER_MS) || n == 0 || n > 65536)
        return -1;
    free(*sa);
    *sa = malloc(n);
    if (!*sa || read_within(s->from, *sa, n, ANSWER_MS))
        return -1;
    *sl = n;
    return 0;
}

static int donor_start(proc *d, int logfd, uint8_t **addr, uint32_t *len)
{
    if (spawn(d, "--donor", NULL, logfd) != 0)
        return -1;
    uint32_t n;
    if (read_within(d->from, &n, sizeof n, ANSWER_MS) || n == 0 || n > 65536)
        return -1;
    free(*addr);
    *addr = malloc(n);
    if (!*addr || read_within(d->from, *addr, n, ANSWER_MS))
        return -1;
    *len = n;
    return 0;
}

static int send_addr(proc *s, char cmd, const uint8_t *a, uint32_t n)
{
    uint8_t c = (uint8_t)cmd;
    return kvs_write_full(s->to, &c, 1) || kvs_write_full(s->to, &n, sizeof n) ||
                   kvs_write_full(s->to, a, n)
               ? -1
               : 0;
}

/* A fresh real client connects through the server child and must fetch the
 * block byte for byte. 0: served; 1: the server answered but did not serve
 * (reason on stdout); -1: the server did not answer (dead or hung). */
static int probe(proc *s, const uint8_t *sa, uint32_t sl, void *buf)
{
    kvs_xfer_client *c = NULL;
    int rc = kvs_xfer_client_create(NULL, &c);
    if (rc != 0) {
        printf("probe: client: %s\n", kvs_strerror(rc));
        return 1;
    }
    const void *ca;
    size_t cl;
    kvs_xfer_client_address(c, &ca, &cl);
    int32_t orc;
    kvs_xfer_session_info info;
    int result = 0;
    if (send_addr(s, 'P', ca, (uint32_t)cl) || read_within(s->from, &orc, sizeof orc, ANSWER_MS) ||
        read_within(s->from, &info, sizeof info, ANSWER_MS)) {
        result = -1;
        goto out;
    }
    if (orc != 0) {
        printf("probe: session_open refused a real client: %s\n", kvs_strerror(orc));
        result = 1;
        goto out;
    }
    uint64_t got = 0;
    memset(buf, 0, g_blk_len);
    rc = kvs_xfer_client_connect(c, sa, sl, &info);
    if (rc == 0)
        rc = fetch_one(c, buf, g_blk_len, &got);
    if (rc != 0 || !valid(buf, got)) {
        printf("probe: %s\n", rc ? kvs_strerror(rc) : "fetched bytes differ from the block");
        result = 1;
    }
    uint8_t cmd = 'C';
    int32_t crc;
    if (kvs_write_full(s->to, &cmd, 1) || kvs_write_full(s->to, &info.id, sizeof info.id) ||
        read_within(s->from, &crc, sizeof crc, ANSWER_MS))
        result = -1;
out:
    kvs_xfer_client_destroy(c);
    return result;
}

static uint64_t g_rng;

static uint64_t rng_next(void) /* splitmix64 */
{
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* m = base with 1-4 bytes at random positions set to other random values. */
static void mutate(const uint8_t *base, uint32_t n, uint8_t *m)
{
    memcpy(m, base, n);
    int k = 1 + (int)(rng_next() % 4);
    for (int i = 0; i < k; i++) {
        uint32_t pos = (uint32_t)(rng_next() % n);
        uint8_t v;
        do
            v = (uint8_t)rng_next();
        while (v == base[pos]);
        m[pos] = v;
    }
}

/* Prints the log written since offset off (the last 3000 bytes of it). */
static void log_since(int logfd, off_t off)
{
    struct stat sb;
    if (logfd < 0 || fstat(logfd, &sb) != 0 || sb.st_size <= off)
        return;
    off_t from = sb.st_size - off > 3000 ? sb.st_size - 3000 : off;
    char buf[3001];
    ssize_t r = pread(logfd, buf, (size_t)(sb.st_size - from), from);
    if (r <= 0)
        return;
    buf[r] = 0;
    printf("---- server log since this mutant%s ----\n%s---- end of log ----\n",
           from > off ? " (tail)" : "", buf);
}

/* Counts the UCX assertion sites ("file.c:line" before "Assertion") in the log. */
static void log_sites(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    char site[32][64];
    int count[32], ns = 0;
    char line[2048];
    while (fgets(line, sizeof line, f)) {
        char *a = strstr(line, "Assertion");
        if (!a)
            continue;
        /* the last token of the form name.c:NNN before it */
        char s[64] = "?";
        for (char *p = line; p < a; p++) {
            char tok[64];
            if ((p == line || p[-1] == ' ') && sscanf(p, "%63s", tok) == 1 && strstr(tok, ".c:"))
                snprintf(s, sizeof s, "%s", tok);
        }
        int i;
        for (i = 0; i < ns && strcmp(site[i], s) != 0; i++) {
        }
        if (i == ns && ns < 32) {
            snprintf(site[ns], sizeof site[ns], "%s", s);
            count[ns++] = 0;
        }
        if (i < ns)
            count[i]++;
    }
    fclose(f);
    for (int i = 0; i < ns; i++)
        printf("log: %d UCX assertion(s) at %s\n", count[i], site[i]);
    if (ns == 0)
        printf("log: no UCX assertion messages\n");
}

static int mutants_main(int nmut, uint64_t seed, unsigned hold_ms, int probe_every,
                        const char *log_path)
{
    if (make_block() != 0)
        return 1;
    int rc = 1;
    proc srv = {0, -1, -1}, donor = {0, -1, -1};
    uint8_t *sa = NULL, *base = NULL, *mu = malloc(65536), *last_acc = malloc(65536);
    uint32_t sl = 0, bl = 0;
    void *buf = aligned_alloc(64, (g_blk_len + 63) / 64 * 64);
    int logfd = open(log_path, O_RDWR | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (!buf || !mu || !last_acc || logfd < 0) {
        fprintf(stderr, "xfer_connect_bench: log %s: %s\n", log_path, strerror(errno));
        goto out;
    }
    if (donor_start(&donor, logfd, &base, &bl) || server_start(&srv, hold_ms, logfd, &sa, &sl)) {
        fprintf(stderr, "xfer_connect_bench: donor or server child did not start\n");
        goto out;
    }
    char hx[2 * 65536 + 1];
    hex(base, bl, hx, sizeof hx);
    printf("mutants: base address (a real client's, %u bytes) %s\n", bl, hx);
    int cnt[5] = {0}, deaths = 0, hangs = 0, donor_deaths = 0, probe_fail = 0, probes = 0;
    int close_err = 0, restarts = 0, unanswered = 0;
    uint32_t busy = 0;
    /* Control: the base address itself must be accepted. */
    mut_reply m;
    if (send_addr(&srv, 'M', base, bl) || read_within(srv.from, &m, sizeof m, ANSWER_MS) ||
        m.cls != CLS_ACCEPTED) {
        fprintf(stderr, "xfer_connect_bench: the unmutated address was not accepted\n");
        goto out;
    }
    int pr = probe(&srv, sa, sl, buf);
    if (pr != 0) {
        fprintf(stderr, "xfer_connect_bench: the first probe failed\n");
        goto out;
    }
    g_rng = seed;
    uint32_t last_acc_len = 0;
    int last_acc_i = -1;
    for (int i = 0; i < nmut; i++) {
        uint32_t n = bl;
        mutate(base, n, mu);
        struct stat sb;
        off_t off = fstat(logfd, &sb) == 0 ? sb.st_size : 0;
        int dead = send_addr(&srv, 'M', mu, n) || read_within(srv.from, &m, sizeof m, ANSWER_MS);
        if (!dead) {
            cnt[m.cls]++;
            busy += m.busy_waits;
            close_err += m.cls == CLS_ACCEPTED && m.close_rc != 0;
            if (m.cls == CLS_ACCEPTED) {
                memcpy(last_acc, mu, n);
                last_acc_len = n;
                last_acc_i = i;
            }
        }
        unanswered += dead;
        const char *when = "answering mutant";
        if (!dead && ((i + 1) % probe_every == 0 || i == nmut - 1)) {
            probes++;
            pr = probe(&srv, sa, sl, buf);
            probe_fail += pr == 1;
            dead = pr < 0;
            when = "the probe after mutant";
        }
        if (dead) {
            /* EOF (or silence) from the server: it is ending, or hung. */
            int alive;
            int ws = reap(&srv, &alive);
            hangs += alive;
            char wd[64];
            describe_ws(ws, wd, sizeof wd);
            deaths++;
            hex(mu, n, hx, sizeof hx);
            printf("SERVER DEATH during %s %d (%s%s)\n  mutant %d: %s\n", when, i,
                   alive ? "hung, killed: " : "", wd, i, hx);
            if (last_acc_i >= 0) {
                hex(last_acc, last_acc_len, hx, sizeof hx);
                printf("  last accepted mutant %d: %s\n", last_acc_i, hx);
            }
            log_since(logfd, off);
            fflush(stdout);
            if (server_start(&srv, hold_ms, logfd, &sa, &sl)) {
                fprintf(stderr, "xfer_connect_bench: server child did not restart\n");
                goto out;
            }
            restarts++;
        }
        if (waitpid(donor.pid, NULL, WNOHANG) == donor.pid) {
            donor.pid = 0;
            donor_deaths++;
            printf("DONOR (the real client) died at mutant %d; a new one gives the base\n", i);
            reap(&donor, NULL);
            if (donor_start(&donor, logfd, &base, &bl)) {
                fprintf(stderr, "xfer_connect_bench: donor child did not restart\n");
                goto out;
            }
        }
    }
    kvs_xfer_server_stats st = {0};
    uint8_t c = 'S';
    int got_stats =
        kvs_write_full(srv.to, &c, 1) == 0 && read_within(srv.from, &st, sizeof st, ANSWER_MS) == 0;
    int ws = reap(&srv, NULL);
    if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
        char wd[64];
        describe_ws(ws, wd, sizeof wd);
        printf("SERVER DEATH at shutdown (%s)\n", wd);
        deaths++;
    }
    reap(&donor, NULL);
    printf("mutants: %d of a %u-byte address, seed %llu, accepted ones held %u ms, a probe every "
           "%d (%d probes)\n",
           nmut, bl, (unsigned long long)seed, hold_ms, probe_every, probes);
    printf("mutants: killed the check's helper %d, refused by UCX %d (in the helper %d, in the "
           "server after the check %d), accepted %d, not tried (helper restart limit) %d, in "
           "flight when the server died %d\n",
           cnt[CLS_KILLED], cnt[CLS_CHECK_REFUSED] + cnt[CLS_SERVER_REFUSED],
           cnt[CLS_CHECK_REFUSED], cnt[CLS_SERVER_REFUSED], cnt[CLS_ACCEPTED], cnt[CLS_BUSY],
           unanswered);
    printf("mutants: server deaths %d (hangs %d), server restarts %d, probes failed with the "
           "server up %d, closes that failed %d, restart-limit waits %u, donor deaths %d\n",
           deaths, hangs, restarts, probe_fail, close_err, busy, donor_deaths);
    if (got_stats)
        printf("mutants: last server's counters: %llu checks, %llu refused, %llu helper deaths, "
               "%llu helper starts, %llu peer failures, %llu sessions open\n",
               (unsigned long long)st.addr_checks, (unsigned long long)st.addr_rejected,
               (unsigned long long)st.addr_check_crashes, (unsigned long long)st.addr_check_spawns,
               (unsigned long long)st.peer_failures, (unsigned long long)st.sessions);
    log_sites(log_path);
    printf("MUT %d %d %d %d %d\n", nmut, cnt[CLS_KILLED],
           cnt[CLS_CHECK_REFUSED] + cnt[CLS_SERVER_REFUSED], cnt[CLS_ACCEPTED], deaths);
    fflush(stdout);
    rc = 0;
out:
    reap(&srv, NULL);
    reap(&donor, NULL);
    if (logfd >= 0)
        close(logfd);
    free(mu);
    free(last_acc);
    free(sa);
    free(base);
    free(buf);
    free(g_blk);
    return rc;
}

/* ---- orchestrator --------------------------------------------------------------------------- */

typedef struct transport {
    const char *name;
    const char *tls;
    int mm_err;
} transport;

static const transport g_tps[] = {
    {"tcp", "tcp", 0},
    {"shm", "posix,self", 1},
};

static void set_env(const transport *t)
{
    setenv("UCX_TLS", t->tls, 1);
    if (t->mm_err)
        setenv("UCX_MM_ERROR_HANDLING", "y", 1);
    else
        unsetenv("UCX_MM_ERROR_HANDLING");
}

typedef struct row {
    double om[2], op[2], cm[2], cp[2];
    int nv[2], invalid;
} row;

/* Runs this binary with args in the transport's environment; prints its
 * output but for the ROW/MUT line, which is parsed into r or mr. */
static int run_child(const transport *t, char *const *args, row *r, int mr[5])
{
    set_env(t);
    int pfd[2];
    if (pipe(pfd))
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(pfd[0]);
        dup2(pfd[1], 1);
        execv(g_self, args);
        _exit(127);
    }
    close(pfd[1]);
    FILE *f = fdopen(pfd[0], "r");
    char line[1 << 17];
    int got = 0;
    while (fgets(line, sizeof line, f)) {
        char nm[16];
        if (r && sscanf(line, "ROW %15s %lf %lf %lf %lf %lf %lf %lf %lf %d %d %d", nm, &r->om[0],
                        &r->op[0], &r->om[1], &r->op[1], &r->cm[0], &r->cp[0], &r->cm[1], &r->cp[1],
                        &r->nv[0], &r->nv[1], &r->invalid) == 12)
            got = 1;
        else if (mr &&
                 sscanf(line, "MUT %d %d %d %d %d", &mr[0], &mr[1], &mr[2], &mr[3], &mr[4]) == 5)
            got = 1;
        else
            fputs(line, stdout);
        fflush(stdout);
    }
    fclose(f);
    int st;
    waitpid(pid, &st, 0);
    return got && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static void usage(void)
{
    fprintf(stderr, "usage: xfer_connect_bench [--clients 40] [--rounds 6] [--mutants 300] "
                    "[--seed 7] [--mut-tls tcp|shm] [--hold-ms 100] [--probe-every 50] "
                    "[--only latency|mutants] [--helper PATH] [--log PATH]\n");
}

int main(int argc, char **argv)
{
    g_self = argv[0];
    signal(SIGPIPE, SIG_IGN);
    if (getenv("XFER_CONNECT_BENCH_HELPER"))
        g_helper = getenv("XFER_CONNECT_BENCH_HELPER"); /* children get --helper this way */
    if (argc == 5 && strcmp(argv[1], "--child") == 0)
        return child_main(atoi(argv[2]), atoi(argv[3]), (unsigned)atoi(argv[4]));
    if (argc == 3 && strcmp(argv[1], "--donor") == 0)
        return donor_main(atoi(argv[2]));
    int clients = 40, rounds = 6, nmut = 300, hold_ms = 100, probe_every = 50;
    unsigned long long seed = 7;
    const char *run = NULL, *only = NULL, *mut_tls = "tcp", *log_path = NULL;
    int mut_run = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--mutants-run") == 0) {
            mut_run = 1;
            continue;
        }
        if (!v) {
            usage();
            return 2;
        }
        i++;
        if (strcmp(a, "--run") == 0)
            run = v;
        else if (strcmp(a, "--clients") == 0)
            clients = atoi(v);
        else if (strcmp(a, "--rounds") == 0)
            rounds = atoi(v);
        else if (strcmp(a, "--mutants") == 0)
            nmut = atoi(v);
        else if (strcmp(a, "--seed") == 0)
            seed = strtoull(v, NULL, 0);
        else if (strcmp(a, "--mut-tls") == 0)
            mut_tls = v;
        else if (strcmp(a, "--hold-ms") == 0)
            hold_ms = atoi(v);
        else if (strcmp(a, "--probe-every") == 0)
            probe_every = atoi(v);
        else if (strcmp(a, "--only") == 0)
            only = v;
        else if (strcmp(a, "--helper") == 0)
            g_helper = v;
        else if (strcmp(a, "--log") == 0)
            log_path = v;
        else {
            usage();
            return 2;
        }
    }
    if (clients < 1 || clients > MAX_CLIENTS || rounds < 1 || rounds > MAX_ROUNDS || nmut < 0 ||
        nmut > MAX_MUTANTS || hold_ms < 0 || hold_ms > 10000 || probe_every < 1 ||
        (strcmp(mut_tls, "tcp") && strcmp(mut_tls, "shm")) ||
        (only && strcmp(only, "latency") && strcmp(only, "mutants"))) {
        usage();
        return 2;
    }
    if (access(g_helper, X_OK) != 0) {
        fprintf(stderr, "xfer_connect_bench: helper %s: %s (--helper PATH)\n", g_helper,
                strerror(errno));
        return 2;
    }
    setenv("XFER_CONNECT_BENCH_HELPER", g_helper, 1);
    if (run)
        return run_main(run, clients, rounds);
    char default_log[64];
    if (!log_path) {
        snprintf(default_log, sizeof default_log, "/tmp/xfer_connect_bench.%d.log", (int)getpid());
        log_path = default_log;
    }
    if (mut_run)
        return mutants_main(nmut, seed, (unsigned)hold_ms, probe_every, log_path);

    printf("xfer_connect_bench: Connect with the address check (%s) off and on, %d clients x %d "
           "rounds each, alternating off/on; %d mutants (seed %llu) over %s\n",
           g_helper, clients, rounds, nmut, seed, mut_tls);
    double check_ms[2] = {NAN, NAN}, ratio[2] = {NAN, NAN};
    int failed = 0;
    if (!only || strcmp(only, "latency") == 0) {
        for (int t = 0; t < 2; t++) {
            char cs[16], rs[16];
            snprintf(cs, sizeof cs, "%d", clients);
            snprintf(rs, sizeof rs, "%d", rounds);
            char *args[] = {(char *)g_self,
                            "--run",
                            (char *)g_tps[t].name,
                            "--clients",
                            cs,
                            "--rounds",
                            rs,
                            NULL};
            row r;
            if (run_child(&g_tps[t], args, &r, NULL) != 0) {
                fprintf(stderr, "xfer_connect_bench: %s latency run failed\n", g_tps[t].name);
                failed = 1;
                continue;
            }
            check_ms[t] = r.om[1] - r.om[0];
            ratio[t] = r.cm[1] / r.cm[0];
            printf("%-3s (UCX_TLS=%s%s) session_open: off median %.3f p90 %.3f ms, on median %.3f "
                   "p90 %.3f ms, added %.3f ms (x%.2f)\n",
                   g_tps[t].name, g_tps[t].tls, g_tps[t].mm_err ? ", UCX_MM_ERROR_HANDLING=y" : "",
                   r.om[0], r.op[0], r.om[1], r.op[1], check_ms[t], r.om[1] / r.om[0]);
            printf("%-3s whole connect (open + connect + first fetch): off median %.3f p90 %.3f "
                   "ms, on median %.3f p90 %.3f ms, ratio on/off %.2f (%d + %d valid sessions)\n",
                   g_tps[t].name, r.cm[0], r.cp[0], r.cm[1], r.cp[1], ratio[t], r.nv[0], r.nv[1]);
            fflush(stdout);
        }
    }
    int mr[5] = {0, 0, 0, 0, -1};
    if (!only || strcmp(only, "mutants") == 0) {
        const transport *t = strcmp(mut_tls, "tcp") == 0 ? &g_tps[0] : &g_tps[1];
        char ns[16], ss[32], hs[16], ps[16];
        snprintf(ns, sizeof ns, "%d", nmut);
        snprintf(ss, sizeof ss, "%llu", seed);
        snprintf(hs, sizeof hs, "%d", hold_ms);
        snprintf(ps, sizeof ps, "%d", probe_every);
        char *args[] = {(char *)g_self,
                        "--mutants-run",
                        "--mutants",
                        ns,
                        "--seed",
                        ss,
                        "--hold-ms",
                        hs,
                        "--probe-every",
                        ps,
                        "--log",
                        (char *)log_path,
                        NULL};
        if (run_child(t, args, NULL, mr) != 0) {
            fprintf(stderr, "xfer_connect_bench: mutant run failed\n");
            failed = 1;
        }
        printf("mutants (%s): log of the server and its helpers in %s\n", t->name, log_path);
    }
    char mf[160] = "mutants=nan check_killed=nan ucx_refused=nan accepted=nan server_deaths=nan";
    if (mr[4] >= 0)
        snprintf(mf, sizeof mf,
                 "mutants=%d check_killed=%d ucx_refused=%d accepted=%d server_deaths=%d", mr[0],
                 mr[1], mr[2], mr[3], mr[4]);
    printf("RESULT check_ms_tcp=%.3f check_ms_shm=%.3f connect_ratio_tcp=%.2f "
           "connect_ratio_shm=%.2f %s\n",
           check_ms[0], check_ms[1], ratio[0], ratio[1], mf);
    return failed;
}
