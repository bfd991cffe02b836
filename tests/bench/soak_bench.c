/*
 * soak_bench.c — does a long run of UCX fetches and puts make kvstashd, its data plane
 * process (kvstash-xferd) or a libkvstash worker grow? UCX 1.13 has a known
 * AM-rendezvous descriptor leak (fixed in 1.14); every block here moves by
 * rendezvous (256 KiB layer messages, puts forced), so a leak per message would show
 * as resident memory that grows with the number of operations.
 *
 * Usage: soak_bench /path/to/kvstashd
 *   SOAK_SECONDS (60) per path; SOAK_BLOCKS (4) blocks of 32 layers x 8 kv heads x
 *   128 dims x 16 tokens, stored fp16 (2 MiB each), pinned; SOAK_CSV=file writes
 *   every sample. UCX_TLS decides the transport of both sides (the server is a
 *   child process, its data plane a child of that).
 *
 * kvstashd runs with its defaults (UCX isolated in kvstash-xferd) and
 * --capacity 1GiB --prefault-memory on: the memory tier is resident from the
 * start, so the tier filling up is not mistaken for growth; the fresh blocks
 * put during the run are evicted, the pinned ones stay.
 *
 * Validation first: each block fetched over UCX hashes (bytes, scales, order)
 * the same as kvs_client_get of it over gRPC, and the client did not fall back.
 * Then two phases of SOAK_SECONDS each, UCX first, then gRPC (the baseline, same
 * processes): a loop of single-block fetches in the stored format (SOAK_BLOCKS
 * of them, one after the other) and one put of a fresh block (scheme fp16).
 * Every fetched layer is compared with the bytes gRPC gave at the start; every
 * put must be stored. Once a second the loop samples VmRSS (and RssAnon,
 * RssShmem) of kvstashd, kvstash-xferd and this process, with the phase's op
 * count (fetches + puts) and the 1-minute load average.
 *
 * Third phase, churn (SOAK_CHURN_SECONDS, default SOAK_SECONDS; 0 skips it):
 * sessions that come and go. Each round a fresh UCX client (a new Connect and
 * UCX session) fetches one block (checked as above), puts a fresh one over UCX
 * and closes; after every SOAK_KILL_EVERY (10; 0: none) rounds a worker
 * process (this binary, --die-mid-fetch: tests/support/kvs_dying_worker.h)
 * connects, fetches every block in one call and is SIGKILLed in the middle of
 * it, on its calling thread. A round may go over gRPC only
 * across a restart of kvstash-xferd (kvstashd replaces it when its
 * shared-memory queue wedged, a worker killed while writing into it, or when
 * UCX aborted it), and the
 * next round must be on UCX again. Afterwards kvstashd must hold no block
 * reference and no session but the soak's own within 30 s. Its ops are
 * sessions; kvstashd runs with --ucx-op-timeout-ms 5000, so a killed worker's
 * session over shared memory is closed by the op timeout within seconds.
 *
 * Output: one line per (path, process): RSS after warm-up (the first 20 % of a
 * phase's samples skipped; for kvstash-xferd in the churn phase, the samples
 * of the process running at the end), at the end, and the growth in KiB per 10,000 ops,
 * the least-squares slope of RSS over op count on the samples after warm-up
 * (and of RssAnon, where a heap leak would be: kvstashd's VmRSS also counts the
 * shared memory tier, kvstash-xferd's the pages of it and of the bounce memory
 * it has touched); a line with kvstashd's own counters of the UCX phase
 * (blocks sent, puts; block references and orphan sends still held after it).
 * Last line:
 *   RESULT ucx_xferd_kib_per_10k=.. ucx_kvstashd_kib_per_10k=.. ucx_client_kib_per_10k=..
 *          grpc_kvstashd_kib_per_10k=.. [churn_xferd_kib_per_10k=..
 *          churn_kvstashd_kib_per_10k=.. churn_client_kib_per_10k=.. churn_killed=..
 *          churn_restarts=.. churn_settle_s=..]
 * Exit 1 when a fetch brings other bytes, a put fails, the UCX client fell back
 * to gRPC during the UCX phase, kvstash-xferd was restarted during the first
 * two phases, a churn round left UCX without a restart, or kvstashd did not
 * let go of the churn's sessions and blocks.
 */
#include "bench_chain.h"
#include "kvs_dying_worker.h"
#include "kvs_server_proc.h"
#include "kvstash.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { P_XFERD, P_KVSTASHD, P_CLIENT, N_PROC };
static const char *const proc_names[N_PROC] = {"kvstash-xferd", "kvstashd", "client"};

typedef struct sample {
    double ms;
    long ops;
    long rss[N_PROC], anon[N_PROC], shmem[N_PROC]; /* KiB */
    double load1;
} sample;

/* The stored bytes of one block, as gRPC Get gave them: per layer K then V,
 * and the layer's scales. */
typedef struct ref_block {
    unsigned layers;
    size_t klen[64], vlen[64];
    unsigned char *k[64], *v[64];
    float ks[64], vs[64];
} ref_block;

static int rec_cb(void *arg, unsigned b, unsigned l, const void *k, size_t kl, const void *v,
                  size_t vl, float ks, float vs, int last)
{
    (void)b, (void)last;
    ref_block *r = arg;
    if (l != r->layers || l >= 64)
        return 1;
    r->k[l] = malloc(kl ? kl : 1);
    r->v[l] = malloc(vl ? vl : 1);
    if (!r->k[l] || !r->v[l]) {
        free(r->k[l]);
        free(r->v[l]);
        return 1;
    }
    memcpy(r->k[l], k, kl);
    memcpy(r->v[l], v, vl);
    r->klen[l] = kl;
    r->vlen[l] = vl;
    r->ks[l] = ks;
    r->vs[l] = vs;
    r->layers++;
    return 0;
}

typedef struct check {
    const ref_block *r;
    unsigned seen;
    int bad;
} check;

/* Each layer must be the next one and hold the reference's bytes and scales. */
static int check_cb(void *arg, unsigned b, unsigned l, const void *k, size_t kl, const void *v,
                    size_t vl, float ks, float vs, int last)
{
    check *c = arg;
    const ref_block *r = c->r;
    if (b != 0 || l != c->seen || l >= r->layers || kl != r->klen[l] || vl != r->vlen[l] ||
        memcmp(k, r->k[l], kl) != 0 || memcmp(v, r->v[l], vl) != 0 ||
        memcmp(&ks, &r->ks[l], sizeof ks) != 0 || memcmp(&vs, &r->vs[l], sizeof vs) != 0 ||
        (last != 0) != (l + 1 == r->layers)) {
        c->bad = 1;
        return 1;
    }
    c->seen++;
    return 0;
}

/* kvstashd's counter name (0 when absent). */
static double metric(const kvs_stats *s, const char *name)
{
    const kvs_metric *m = s ? kvs_stats_find(s, name, NULL, NULL) : NULL;
    return m ? m->value : 0;
}

/* kvstashd's data plane counters named (kvstash_xfer_*), from one Stats call,
 * into out (0 for one it does not have); -1 when Stats fails. */
static int xfer_metrics(kvs_client *g, const char *const *names, int n, double *out, char *err)
{
    kvs_stats *s = NULL;
    if (kvs_client_stats(g, "kvstash_xfer_", -1, &s, err) != 0)
        return -1;
    for (int i = 0; i < n; i++)
        out[i] = metric(s, names[i]);
    kvs_stats_free(s);
    return 0;
}

/* What kvstashd counted of the UCX phase: blocks sent and puts over UCX, and
 * what it still held once the phase was over (block references lent to
 * the data plane, sends whose session closed): both should be 0. */
static int xfer_counts(kvs_client *g, double out[4], char *err)
{
    static const char *const names[4] = {"kvstash_xfer_blocks_sent_total",
                                         "kvstash_xfer_puts_total", "kvstash_xfer_refs_held",
                                         "kvstash_xfer_orphans"};
    return xfer_metrics(g, names, 4, out, err);
}

/* VmRSS, RssAnon and RssShmem of pid in KiB; -1 when it cannot be read. */
static int read_rss(pid_t pid, long *rss, long *anon, long *shmem)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    *rss = *anon = *shmem = -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "VmRSS:", 6) == 0)
            *rss = atol(line + 6);
        else if (strncmp(line, "RssAnon:", 8) == 0)
            *anon = atol(line + 8);
        else if (strncmp(line, "RssShmem:", 9) == 0)
            *shmem = atol(line + 9);
    }
    fclose(f);
    return *rss < 0 || *anon < 0 || *shmem < 0 ? -1 : 0;
}

static double load1(void)
{
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1)
            l = -1;
        fclose(f);
    }
    return l;
}

/* Least-squares slope of y over x on s[from..n), in KiB per 10,000 ops. */
static double slope_10k(const sample *s, int from, int n, int proc, int anon)
{
    double mx = 0, my = 0;
    for (int i = from; i < n; i++) {
        mx += (double)s[i].ops;
        my += (double)(anon ? s[i].anon[proc] : s[i].rss[proc]);
    }
    mx /= n - from;
    my /= n - from;
    double sxy = 0, sxx = 0;
    for (int i = from; i < n; i++) {
        double dx = (double)s[i].ops - mx;
        sxy += dx * ((double)(anon ? s[i].anon[proc] : s[i].rss[proc]) - my);
        sxx += dx * dx;
    }
    return sxx > 0 ? sxy / sxx * 10000.0 : 0;
}

typedef struct soak {
    kvs_client *c; /* the client of this phase */
    int ucx;       /* 1: kvs_client_fetch / kvs_client_put_ucx; 0: Get / Put */
    const kvs_ns *ns;
    unsigned char (*keys)[32];
    const ref_block *refs;
    unsigned nb;
    const void *const *kv;
    unsigned *next_put; /* fresh tokens across phases */
    pid_t pid[N_PROC];
    double seconds;
    sample *s; /* room for cap samples */
    int n, cap;
    int xferd_from; /* the first sample of the kvstash-xferd now running */
    long fetches, puts;
    double ms;
    FILE *csv;
} soak;

static int take_sample(soak *k, double t0, const char *name)
{
    sample *x = &k->s[k->n];
    x->ms = kvs_test_now_ms() - t0;
    x->ops = k->fetches + k->puts;
    x->load1 = load1();
    for (int p = 0; p < N_PROC; p++)
        if (read_rss(k->pid[p], &x->rss[p], &x->anon[p], &x->shmem[p]) != 0) {
            fprintf(stderr, "%s: cannot read %s's memory (pid %d): did it exit?\n", name,
                    proc_names[p], (int)k->pid[p]);
            return -1;
        }
    if (k->csv)
        fprintf(k->csv, "%s,%.0f,%ld,%ld,%ld,%ld,%ld,%ld,%ld,%ld,%ld,%ld,%.2f\n", name, x->ms,
                k->fetches, k->puts, x->rss[0], x->anon[0], x->shmem[0], x->rss[1], x->anon[1],
                x->shmem[1], x->rss[2], x->anon[2], x->load1);
    k->n++;
    return 0;
}

/* One phase: fetch each block in turn, then put a fresh one, until seconds
 * have passed; a sample every second. 0, or -1 with the reason printed. */
static int soak_run(soak *k, const char *name)
{
    char err[KVS_ERR_LEN] = "";
    double t0 = kvs_test_now_ms(), next = 0;
    if (take_sample(k, t0, name) != 0)
        return -1;
    for (;;) {
        for (unsigned b = 0; b < k->nb; b++) {
            check c = {&k->refs[b], 0, 0};
            int x = k->ucx ? kvs_client_fetch(k->c, k->ns, (const unsigned char(*)[32])k->keys + b,
                                              1, KVS_EGRESS_STORED, 0, -1, check_cb, &c, err)
                           : kvs_client_get(k->c, k->ns, (const unsigned char(*)[32])k->keys + b, 1,
                                            KVS_EGRESS_STORED, 0, -1, check_cb, &c, err);
            if (x != 0 || c.bad || c.seen != k->refs[b].layers) {
                fprintf(stderr, "%s: fetch %ld of block %u: %s\n", name, k->fetches, b,
                        c.bad ? "other bytes than gRPC's at the start" : err);
                return -1;
            }
            k->fetches++;
        }
        unsigned tokens[16];
        for (unsigned i = 0; i < 16; i++)
            tokens[i] = 1000000u + *k->next_put * 16u + i;
        (*k->next_put)++;
        kvs_put_args a = {
            .ns = k->ns, .index = 0, .tokens = tokens, .scheme = 1, .k = k->kv, .v = k->kv};
        kvs_put_result r;
        memset(&r, 0, sizeof r);
        int x = k->ucx ? kvs_client_put_ucx(k->c, &a, -1, &r, err)
                       : kvs_client_put(k->c, &a, -1, &r, err);
        if (x != 0 || r.already_present || r.stored_bytes == 0) {
            fprintf(stderr, "%s: put %ld: %s\n", name, k->puts,
                    x ? err : "not stored (already present or 0 bytes)");
            return -1;
        }
        k->puts++;
        double now = kvs_test_now_ms() - t0;
        if (now >= next + 1000.0) {
            next += 1000.0 * (long)((now - next) / 1000.0);
            if (take_sample(k, t0, name) != 0)
                return -1;
            if (now >= k->seconds * 1000.0 || k->n == k->cap)
                break;
        }
    }
    k->ms = kvs_test_now_ms() - t0;
    return 0;
}

/* Mean and largest 1-minute load average over a phase's samples. */
static void phase_load(const soak *k, double *mean, double *max)
{
    *mean = *max = 0;
    for (int i = 0; i < k->n; i++) {
        *mean += k->s[i].load1;
        *max = k->s[i].load1 > *max ? k->s[i].load1 : *max;
    }
    *mean /= k->n;
}

/* The lines of one phase; the slopes of VmRSS per process into kib10k. The
 * churn phase's ops are sessions (its own line says so). */
static void soak_report(const soak *k, const char *name, double kib10k[N_PROC])
{
    int from = k->n / 5, last = k->n - 1;
    double lmean, lmax;
    phase_load(k, &lmean, &lmax);
    if (strcmp(name, "churn") != 0)
        printf("%s: %.0f s, %ld fetches (%.0f/s, %.2f GB/s) and %ld puts (%.0f/s) of 2 MiB "
               "blocks, %ld ops; %d samples, fit over the last %d; load average %.2f mean, "
               "%.2f max\n",
               name, k->ms / 1000.0, k->fetches, k->fetches * 1000.0 / k->ms,
               (double)k->fetches * 2097152.0 / k->ms / 1e6, k->puts, k->puts * 1000.0 / k->ms,
               k->fetches + k->puts, k->n, k->n - from, lmean, lmax);
    for (int p = 0; p < N_PROC; p++) {
        /* a data plane process started during the phase: its own samples */
        int f = p == P_XFERD && k->xferd_from > from ? k->xferd_from : from;
        kib10k[p] = f + 2 < k->n ? slope_10k(k->s, f, k->n, p, 0) : 0;
        printf("%-5s %-13s VmRSS %8ld KiB after warm-up, %8ld at end (%+ld), %+8.1f KiB/10k "
               "ops; RssAnon %7ld -> %7ld, %+8.1f KiB/10k ops; RssShmem %7ld -> %7ld\n",
               name, proc_names[p], k->s[f].rss[p], k->s[last].rss[p],
               k->s[last].rss[p] - k->s[f].rss[p], kib10k[p], k->s[f].anon[p], k->s[last].anon[p],
               slope_10k(k->s, f, k->n, p, 1), k->s[f].shmem[p], k->s[last].shmem[p]);
    }
}

/* ---- churn: sessions opened and closed, clients killed mid-fetch ----------------- */

/* The namespace every soak process uses (the child must name the same blocks). */
static kvs_ns soak_ns(void)
{
    return (kvs_ns){.model = "bench/soak",
                    .salt = "",
                    .num_layers = 32,
                    .num_kv_heads = 8,
                    .head_dim = 128,
                    .block_tokens = 16,
                    .dtype = 1};
}

/* What the churn phase saw of kvstashd's data plane process: restarts
 * (kvstash_xfer_proc_restarts_total, a wedged shared-memory queue among
 * them), sessions that left UCX while one happened, and the longest such
 * fetch. */
typedef struct churn_out {
    long killed, restarts, fell_back;
    double worst_ms;
} churn_out;

/* kvstashd's count of data plane restarts; -1 when Stats fails. */
static double proc_restarts(kvs_client *g)
{
    static const char *const name[1] = {"kvstash_xfer_proc_restarts_total"};
    char err[KVS_ERR_LEN] = "";
    double v;
    return xfer_metrics(g, name, 1, &v, err) == 0 ? v : -1;
}

/* kvstashd's count of data plane restarts once it passes `seen`, waiting up
 * to 2 s for that: a session leaves UCX at the old process's goodbye, before
 * that process has ended and kvstashd has counted its restart. */
static double proc_restarts_past(kvs_client *g, double seen)
{
    double nr = proc_restarts(g);
    for (int i = 0; i < 40 && nr >= 0 && nr <= seen; i++) {
        usleep(50 * 1000);
        nr = proc_restarts(g);
    }
    return nr;
}

/* Waits up to 10 s until kvstashd has a data plane process serving again
 * (kvstash_xfer_proc_pid non-zero): a restart is counted once the old one is
 * gone, and Connect is refused until the new one has said hello. */
static void wait_serving(kvs_client *g)
{
    static const char *const name[1] = {"kvstash_xfer_proc_pid"};
    for (int i = 0; i < 200; i++) {
        char err[KVS_ERR_LEN] = "";
        double v = 0;
        if (xfer_metrics(g, name, 1, &v, err) == 0 && v > 0)
            return;
        usleep(50 * 1000);
    }
}

/* One churn phase: until seconds have passed, a fresh UCX client (a new
 * Connect and UCX session) fetches one block, checks it, puts a fresh block
 * over UCX and closes; after every kill_every such sessions a worker process
 * is killed in the middle of a fetch of every block. Its op count
 * (k->fetches; k->puts stays 0) is sessions, clean and killed. A session may
 * leave UCX only across a restart of the data plane process (kvstashd
 * starts a fresh one when the old one's shared-memory queue wedged, a worker
 * killed while writing into it, or when sends to dead workers got stuck,
 * or when UCX aborted it); then, once the new process serves, the next one
 * must be on UCX again.
 * g: a gRPC client of the same kvstashd (pid kpid). */
static int churn_run(soak *k, const char *addr, unsigned kill_every, kvs_client *g, pid_t kpid,
                     churn_out *co)
{
    char err[KVS_ERR_LEN] = "";
    double t0 = kvs_test_now_ms(), next = 0;
    double restarts0 = proc_restarts(g), restarts = restarts0;
    int must_ucx = 0; /* the session after a fallback must be on UCX */
    if (restarts0 < 0 || take_sample(k, t0, "churn") != 0)
        return -1;
    for (unsigned i = 0;; i++) {
        kvs_client_opts o;
        memset(&o, 0, sizeof o);
        o.target = addr;
        o.call_timeout_ms = 60000;
        o.ucx = 1;
        kvs_client *c = NULL;
        if (kvs_client_open(&o, &c, err) != 0) {
            fprintf(stderr, "churn: session %u: open: %s\n", i, err);
            return -1;
        }
        unsigned b = i % k->nb;
        check ck = {&k->refs[b], 0, 0};
        double tf = kvs_test_now_ms();
        int x = kvs_client_fetch(c, k->ns, (const unsigned char(*)[32])k->keys + b, 1,
                                 KVS_EGRESS_STORED, 0, -1, check_cb, &ck, err);
        if (x != 0 || ck.bad || ck.seen != k->refs[b].layers) {
            fprintf(stderr, "churn: session %u: fetch of block %u: %s\n", i, b,
                    ck.bad ? "other bytes than gRPC's at the start" : err);
            kvs_client_close(c);
            return -1;
        }
        unsigned tokens[16];
        for (unsigned t = 0; t < 16; t++)
            tokens[t] = 1000000u + *k->next_put * 16u + t;
        (*k->next_put)++;
        kvs_put_args a = {
            .ns = k->ns, .index = 0, .tokens = tokens, .scheme = 1, .k = k->kv, .v = k->kv};
        kvs_put_result r;
        memset(&r, 0, sizeof r);
        x = kvs_client_put_ucx(c, &a, -1, &r, err);
        kvs_client_xfer_stats st;
        kvs_client_xfer_stats_get(c, &st);
        kvs_client_close(c);
        if (x != 0 || r.already_present || r.stored_bytes == 0) {
            fprintf(stderr, "churn: session %u: put: %s\n", i,
                    x ? err : "not stored (already present or 0 bytes)");
            return -1;
        }
        if (st.fallbacks != 0 || st.fetches != 1 || st.ucx_status != 0) {
            double nr = proc_restarts_past(g, restarts);
            if (must_ucx || nr <= restarts) {
                fprintf(stderr, "churn: session %u left UCX (status %s, %llu fallbacks) %s\n", i,
                        kvs_strerror(st.ucx_status), st.fallbacks,
                        must_ucx ? "right after the data plane had been restarted"
                                 : "with no restart of the data plane");
                return -1;
            }
            restarts = nr;
            co->fell_back++;
            double ms = kvs_test_now_ms() - tf;
            co->worst_ms = ms > co->worst_ms ? ms : co->worst_ms;
            must_ucx = 1;
            wait_serving(g);
        } else {
            must_ucx = 0;
        }
        k->fetches++; /* this phase's op: a session (clean or killed) */
        if (kill_every && (i + 1) % kill_every == 0) {
            if (!kvs_dw_spawn("soak_bench", addr, (const unsigned char(*)[32])k->keys, k->nb))
                return -1;
            co->killed++;
            k->fetches++;
        }
        double now = kvs_test_now_ms() - t0;
        if (now >= next + 1000.0) {
            next += 1000.0 * (long)((now - next) / 1000.0);
            pid_t xp = kvs_server_proc_xferd(kpid);
            if (xp > 0 && xp != k->pid[P_XFERD]) { /* restarted: sample the new one */
                k->pid[P_XFERD] = xp;
                k->xferd_from = k->n;
            }
            if (take_sample(k, t0, "churn") != 0)
                return -1;
            if (now >= k->seconds * 1000.0 || k->n == k->cap)
                break;
        }
    }
    k->ms = kvs_test_now_ms() - t0;
    co->restarts = (long)(proc_restarts(g) - restarts0);
    return 0;
}

/* After the churn: kvstashd must let go of everything the dead workers held.
 * Polls its counters until no block reference is held and only the soak's own
 * UCX session is open; the seconds that took, or -1 after limit_s. */
static double churn_settle(kvs_client *g, double limit_s, double xc[4], double *sessions)
{
    static const char *const names[5] = {
        "kvstash_xfer_refs_held", "kvstash_xfer_orphans", "kvstash_xfer_timeouts_total",
        "kvstash_xfer_peer_failures_total", "kvstash_xfer_sessions"};
    double t0 = kvs_test_now_ms();
    char err[KVS_ERR_LEN] = "";
    for (;;) {
        double v[5];
        if (xfer_metrics(g, names, 5, v, err) != 0)
            return -1;
        memcpy(xc, v, 4 * sizeof *xc);
        *sessions = v[4];
        double el = (kvs_test_now_ms() - t0) / 1000.0;
        if (xc[0] == 0 && *sessions <= 1)
            return el;
        if (el > limit_s)
            return -1;
        usleep(200000);
    }
}

int main(int argc, char **argv)
{
    if (kvs_dw_is_worker(argc, argv)) {
        /* the dying worker of the churn: killed on the calling thread once
         * layer 3 of its last block has landed, the rest still on the wire */
        kvs_dw_opts o = {.thread = KVS_DW_ON_CALLER, .block = -1, .layer = 3, .ns = soak_ns()};
        return kvs_dw_main(argc, argv, &o);
    }
    if (argc < 2) {
        fprintf(stderr, "usage: %s /path/to/kvstashd\n", argv[0]);
        return 2;
    }
    double seconds = getenv("SOAK_SECONDS") ? atof(getenv("SOAK_SECONDS")) : 60;
    unsigned nb = getenv("SOAK_BLOCKS") ? (unsigned)atoi(getenv("SOAK_BLOCKS")) : 4;
    double churn_s = getenv("SOAK_CHURN_SECONDS") ? atof(getenv("SOAK_CHURN_SECONDS")) : seconds;
    int kill_every = getenv("SOAK_KILL_EVERY") ? atoi(getenv("SOAK_KILL_EVERY")) : 10;
    if (seconds < 5 || seconds > 86400 || nb < 1 || nb > 64 ||
        (churn_s != 0 && (churn_s < 5 || churn_s > 86400)) || kill_every < 0) {
        fprintf(stderr, "SOAK_SECONDS 5..86400, SOAK_BLOCKS 1..64, SOAK_CHURN_SECONDS 0 or "
                        "5..86400, SOAK_KILL_EVERY >= 0\n");
        return 2;
    }
    /* A killed worker's session over shared memory is closed by the op
     * timeout (UCX's keepalive takes 20 s): 5 s keeps the wait after the churn
     * short. It never fires for a live fetch here (milliseconds). */
    const char *args[] = {"--capacity",  "1GiB", "--prefault-memory",   "on",
                          "--log-level", "warn", "--ucx-op-timeout-ms", "5000",
                          NULL};
    kvs_server_proc srv;
    char err[KVS_ERR_LEN] = "";
    if (kvs_server_proc_start(argv[1], args, &srv, err) != 0) {
        fprintf(stderr, "kvstashd: %s\n", err);
        return 1;
    }
    int rc = 1;
    kvs_client *g = NULL, *u = NULL;
    FILE *csv = NULL;
    sample *smp = NULL;
    kvs_ns ns = soak_ns();
    size_t elems = (size_t)ns.block_tokens * ns.num_kv_heads * ns.head_dim;
    unsigned char(*keys)[32] = calloc(nb, 32);
    ref_block *refs = calloc(nb, sizeof *refs);
    uint16_t *buf = malloc(elems * 2);
    if (!keys || !refs || !buf)
        goto out;
    kvs_client_opts o;
    memset(&o, 0, sizeof o);
    o.target = srv.addr;
    o.call_timeout_ms = 60000;
    if (kvs_client_open(&o, &g, err) != 0)
        goto out;
    o.ucx = 1;
    if (kvs_client_open(&o, &u, err) != 0)
        goto out;
    const void *kv[32];
    kvs_bench_fill_kv(&ns, buf, kv);
    if (kvs_bench_put_chain(g, &ns, kv, nb, keys, err) != 0)
        goto out;
    unsigned pinned = 0;
    if (kvs_client_pin(g, &ns, (const unsigned char(*)[32])keys, nb, 0, 10, -1, &pinned, err) !=
            0 ||
        pinned != nb) {
        fprintf(stderr, "pin: %s (%u of %u pinned)\n", err, pinned, nb);
        goto out;
    }
    /* Validate: UCX brings what gRPC brings (the check every later fetch
     * gets); keep gRPC's bytes for it. */
    for (unsigned b = 0; b < nb; b++) {
        const unsigned char(*kb)[32] = (const unsigned char(*)[32])keys + b;
        check c = {&refs[b], 0, 0};
        if (kvs_client_get(g, &ns, kb, 1, KVS_EGRESS_STORED, 0, -1, rec_cb, &refs[b], err) != 0 ||
            kvs_client_fetch(u, &ns, kb, 1, KVS_EGRESS_STORED, 0, -1, check_cb, &c, err) != 0) {
            fprintf(stderr, "block %u: %s\n", b, c.bad ? "UCX and gRPC disagree" : err);
            goto out;
        }
        if (refs[b].layers != ns.num_layers || c.seen != refs[b].layers) {
            fprintf(stderr, "block %u: UCX and gRPC disagree (%u vs %u layers)\n", b, c.seen,
                    refs[b].layers);
            goto out;
        }
    }
    kvs_client_xfer_stats st0;
    kvs_client_xfer_stats_get(u, &st0);
    if (st0.fallbacks != 0 || !st0.connected) {
        fprintf(stderr, "the UCX client fell back (status %d): not a UCX figure\n", st0.ucx_status);
        goto out;
    }
    pid_t xp = kvs_server_proc_xferd((pid_t)srv.pid);
    if (xp <= 0) {
        fprintf(stderr, "no kvstash-xferd child of kvstashd (pid %d): isolation off?\n",
                (int)srv.pid);
        goto out;
    }
    if (getenv("SOAK_CSV") && !(csv = fopen(getenv("SOAK_CSV"), "w"))) {
        fprintf(stderr, "SOAK_CSV: cannot write %s\n", getenv("SOAK_CSV"));
        goto out;
    }
    if (csv)
        fprintf(csv, "path,ms,fetches,puts,xferd_rss,xferd_anon,xferd_shmem,kvstashd_rss,"
                     "kvstashd_anon,kvstashd_shmem,client_rss,client_anon,load1\n");
    int cap = (int)seconds + 8;
    int ccap = (int)churn_s + 8;
    smp = calloc(2 * (size_t)cap + (size_t)ccap, sizeof *smp);
    if (!smp)
        goto out;
    printf("soak_bench: %u pinned blocks of 2 MiB (stored fp16), kvstashd %d, kvstash-xferd %d, "
           "client %d, UCX_TLS=%s, %.0f s per path\n",
           nb, (int)srv.pid, (int)xp, (int)getpid(),
           getenv("UCX_TLS") ? getenv("UCX_TLS") : "(unset)", seconds);
    fflush(stdout);
    unsigned next_put = 0;
    soak ph[2];
    for (int i = 0; i < 2; i++)
        ph[i] = (soak){.c = i ? g : u,
                       .ucx = !i,
                       .ns = &ns,
                       .keys = keys,
                       .refs = refs,
                       .nb = nb,
                       .kv = kv,
                       .next_put = &next_put,
                       .pid = {xp, (pid_t)srv.pid, getpid()},
                       .seconds = seconds,
                       .s = smp + (size_t)i * cap,
                       .cap = cap,
                       .csv = csv};
    if (soak_run(&ph[0], "ucx") != 0)
        goto out;
    kvs_client_xfer_stats st;
    kvs_client_xfer_stats_get(u, &st);
    if (st.fallbacks != 0 || !st.connected || st.fetches - st0.fetches != (uint64_t)ph[0].fetches) {
        fprintf(stderr,
                "the UCX client fell back %llu times (status %d, %llu of %ld fetches "
                "over UCX): not a UCX figure\n",
                st.fallbacks, st.ucx_status, st.fetches - st0.fetches, ph[0].fetches);
        goto out;
    }
    double xc[4];
    if (xfer_counts(g, xc, err) != 0)
        goto out;
    if (soak_run(&ph[1], "grpc") != 0)
        goto out;
    if (kvs_server_proc_xferd((pid_t)srv.pid) != xp) {
        fprintf(stderr, "kvstash-xferd was restarted during the ucx or grpc phase: not a soak "
                        "figure\n");
        goto out;
    }
    soak pc = ph[0];
    pc.c = NULL;
    pc.s = smp + 2 * (size_t)cap;
    pc.n = 0;
    pc.cap = ccap;
    pc.seconds = churn_s;
    pc.fetches = pc.puts = 0;
    churn_out co = {0};
    double settle_s = 0, cc[4] = {0}, open_sessions = 0;
    if (churn_s > 0) {
        if (churn_run(&pc, srv.addr, (unsigned)kill_every, g, (pid_t)srv.pid, &co) != 0)
            goto out;
        settle_s = churn_settle(g, 30, cc, &open_sessions);
        if (settle_s < 0) {
            fprintf(stderr,
                    "churn: 30 s after the last session kvstashd still holds %.0f block "
                    "references and %.0f UCX sessions (the soak's own: 1)\n",
                    cc[0], open_sessions);
            goto out;
        }
    }
    double ku[N_PROC], kg[N_PROC], kc[N_PROC] = {0};
    soak_report(&ph[0], "ucx", ku);
    soak_report(&ph[1], "grpc", kg);
    printf("kvstashd after the UCX phase: %.0f blocks sent and %.0f puts over UCX in all "
           "(validation included), %.0f block references held, %.0f orphan sends\n",
           xc[0], xc[1], xc[2], xc[3]);
    if (churn_s > 0) {
        double lmean, lmax;
        phase_load(&pc, &lmean, &lmax);
        printf("churn: %.0f s, %ld UCX sessions (%.1f/s): %ld opened, fetched a block, put one "
               "and closed, %ld workers killed mid-fetch (one after every %d); ops below = "
               "sessions; %d samples, fit over the last %d; load average %.2f mean, %.2f max\n",
               pc.ms / 1000.0, pc.fetches, pc.fetches * 1000.0 / pc.ms, pc.fetches - co.killed,
               co.killed, kill_every, pc.n, pc.n - pc.n / 5, lmean, lmax);
        printf("churn: the data plane process was restarted %ld times (kvstashd's log says why: "
               "a wedged shared-memory queue, a crash); %ld sessions went over gRPC meanwhile, the "
               "longest fetch %.1f s; kvstash-xferd's line below is the last one's (from sample "
               "%d)\n",
               co.restarts, co.fell_back, co.worst_ms / 1000.0, pc.xferd_from);
        soak_report(&pc, "churn", kc);
        printf("kvstashd after the churn: everything released %.1f s after the last session "
               "(block references 0, sessions %.0f), %.0f orphan sends, %.0f sessions closed "
               "by the op timeout, %.0f by a peer failure\n",
               settle_s, open_sessions, cc[1], cc[2], cc[3]);
    }
    printf("RESULT ucx_xferd_kib_per_10k=%.1f ucx_kvstashd_kib_per_10k=%.1f "
           "ucx_client_kib_per_10k=%.1f grpc_kvstashd_kib_per_10k=%.1f",
           ku[P_XFERD], ku[P_KVSTASHD], ku[P_CLIENT], kg[P_KVSTASHD]);
    if (churn_s > 0)
        printf(" churn_xferd_kib_per_10k=%.1f churn_kvstashd_kib_per_10k=%.1f "
               "churn_client_kib_per_10k=%.1f churn_killed=%ld churn_restarts=%ld "
               "churn_settle_s=%.1f",
               kc[P_XFERD], kc[P_KVSTASHD], kc[P_CLIENT], co.killed, co.restarts, settle_s);
    printf("\n");
    rc = 0;
out:
    if (rc != 0 && err[0])
        fprintf(stderr, "soak_bench: %s\n", err);
    if (csv)
        fclose(csv);
    kvs_client_close(g);
    kvs_client_close(u);
    kvs_server_proc_stop(&srv, SIGTERM, 10000, NULL, NULL);
    for (unsigned b = 0; refs && b < nb; b++)
        for (unsigned l = 0; l < refs[b].layers; l++) {
            free(refs[b].k[l]);
            free(refs[b].v[l]);
        }
    free(refs);
    free(keys);
    free(buf);
    free(smp);
    return rc;
}
