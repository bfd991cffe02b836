/*
 * fetch_bench.c — libkvstash's kvs_client_fetch over the UCX data plane against
 * kvs_client_get over gRPC (the baseline), same kvstashd, same blocks, same run.
 *
 * Usage: fetch_bench /path/to/kvstashd
 *   FETCH_BENCH_BLOCKS (16) blocks of 32 layers x 8 kv heads x 128 dims x 16 tokens,
 *   stored fp16 (2 MiB each), fetched FETCH_BENCH_REPS (7) times per path and format.
 * UCX_TLS decides the transport of both sides (the server is a child process).
 * FETCH_BENCH_SEAL=1: the UCX clients ask for sealed fetches
 * (kvs_client_opts.ucx_seal_fetches = 1; default: not, as libkvstash).
 *
 * Validation first: for each format the bytes, scales and order every callback
 * saw over UCX hash to the same value as over gRPC, and the client's figures say
 * no fetch fell back. Then alternating timed runs (callback only counts bytes);
 * medians. Output: one line per format and a RESULT line with the ratios
 * (UCX / gRPC throughput).
 *
 * Then whether rendering blocks other sessions (kvstashd renders egress formats
 * in its UCX progress thread, service/data_connect.c): a second UCX client
 * fetches one stored block FETCH_BENCH_PROBES (40) times and its latency (p50,
 * p90) is taken alone, beside a third client fetching every block stored
 * (the same bytes, no rendering), and beside it fetching them as fp16 (each
 * block rendered), and beside it putting fresh int8 blocks over UCX (each
 * quantized on ingest: kvstashd ends UCX puts on threads of their own since
 * put_end_async; before, the put's end held the data plane's thread). Line:
 * BLOCKING p50/p90 alone, beside stored, beside fp16, beside UCX puts (and
 * their count and rate over the time the putting thread ran). Each probe
 * fetch must bring the block's bytes, each put must be stored, and neither
 * client may have fallen back to gRPC.
 */
#include "bench_chain.h"
#include "kvs_server_proc.h"
#include "kvstash.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct acc {
    uint64_t h, bytes;
    int hash;
} acc;

static int acc_cb(void *arg, unsigned b, unsigned l, const void *k, size_t kl, const void *v,
                  size_t vl, float ks, float vs, int last)
{
    acc *a = arg;
    a->bytes += kl + vl;
    if (!a->hash)
        return 0;
    uint64_t h = a->h ^ ((uint64_t)b << 32 | l) ^ (uint64_t)last << 63;
    const uint8_t *p[2] = {k, v};
    size_t n[2] = {kl, vl};
    for (int j = 0; j < 2; j++)
        for (size_t i = 0; i < n[j]; i++)
            h = (h ^ p[j][i]) * 1099511628211ull;
    uint32_t s[2];
    memcpy(&s[0], &ks, 4);
    memcpy(&s[1], &vs, 4);
    a->h = (h ^ s[0]) * 1099511628211ull ^ s[1];
    return 0;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The background load of the blocking probe: fetch every block in fmt until
 * told to stop; or, with kv set, put fresh root blocks (layers kv, stored
 * int8: quantized on ingest) over UCX. */
typedef struct bg_load {
    kvs_client *c;
    const kvs_ns *ns;
    unsigned char (*keys)[32];
    unsigned nb;
    kvs_egress fmt;
    const void **kv;
    atomic_int stop;
    int failed;
    long ops;  /* fetches, or puts with kv set */
    double ms; /* how long it ran (puts/s: over the puts' own time) */
} bg_load;

static void *bg_main(void *arg)
{
    bg_load *b = arg;
    char err[KVS_ERR_LEN];
    double t0 = kvs_test_now_ms();
    while (b->kv && !atomic_load(&b->stop)) {
        unsigned tokens[16];
        for (unsigned i = 0; i < 16; i++)
            tokens[i] = 1000000u + (unsigned)b->ops * 16u + i;
        kvs_put_args a = {
            .ns = b->ns, .index = 0, .tokens = tokens, .scheme = 4, .k = b->kv, .v = b->kv};
        kvs_put_result r;
        memset(&r, 0, sizeof r);
        if (kvs_client_put_ucx(b->c, &a, -1, &r, err) != 0 || r.already_present ||
            r.stored_bytes == 0) {
            b->failed = 1;
            break;
        }
        b->ops++;
    }
    while (!b->kv && !atomic_load(&b->stop)) {
        acc a = {0, 0, 0};
        if (kvs_client_fetch(b->c, b->ns, (const unsigned char(*)[32])b->keys, b->nb, b->fmt, 0, -1,
                             acc_cb, &a, err) != 0) {
            b->failed = 1;
            break;
        }
        b->ops++;
    }
    b->ms = kvs_test_now_ms() - t0;
    return NULL;
}

/* n fetches of one stored block by c, each of want bytes; p50 and p90 in
 * µs; 0 or -1 (a fetch failed or came back short). */
static int probe(kvs_client *c, const kvs_ns *ns, unsigned char (*key)[32], uint64_t want, int n,
                 double *p50, double *p90)
{
    double t[200];
    char err[KVS_ERR_LEN];
    for (int i = 0; i < n; i++) {
        acc a = {0, 0, 0};
        double t0 = kvs_test_now_ms();
        if (kvs_client_fetch(c, ns, (const unsigned char(*)[32])key, 1, KVS_EGRESS_STORED, 0, -1,
                             acc_cb, &a, err) != 0)
            return -1;
        t[i] = (kvs_test_now_ms() - t0) * 1000.0;
        if (a.bytes != want)
            return -1;
    }
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    *p50 = t[n / 2];
    *p90 = t[n * 9 / 10];
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s /path/to/kvstashd\n", argv[0]);
        return 2;
    }
    unsigned nb = getenv("FETCH_BENCH_BLOCKS") ? (unsigned)atoi(getenv("FETCH_BENCH_BLOCKS")) : 16;
    int reps = getenv("FETCH_BENCH_REPS") ? atoi(getenv("FETCH_BENCH_REPS")) : 7;
    if (nb < 1 || nb > 256 || reps < 1 || reps > 99) {
        fprintf(stderr, "FETCH_BENCH_BLOCKS 1..256, FETCH_BENCH_REPS 1..99\n");
        return 2;
    }
    const char *args[] = {"--capacity", "4GiB", "--log-level", "warn",
                          "--max-message-bytes", "256MiB", NULL};
    kvs_server_proc srv;
    char err[KVS_ERR_LEN] = "";
    if (kvs_server_proc_start(argv[1], args, &srv, err) != 0) {
        fprintf(stderr, "kvstashd: %s\n", err);
        return 1;
    }
    int rc = 1;
    kvs_client *g = NULL, *u = NULL;
    kvs_client_opts o;
    memset(&o, 0, sizeof o);
    o.target = srv.addr;
    o.call_timeout_ms = 60000;
    o.max_recv_bytes = (size_t)256 << 20;
    /* The server renders fp16/fp32 (what this bench compares and probes);
     * libkvstash's default decodes on the client (service_bench measures that). */
    o.decode = KVS_DECODE_SERVER;
    if (kvs_client_open(&o, &g, err) != 0)
        goto out;
    o.ucx = 1;
    if (getenv("FETCH_BENCH_SEAL") && strcmp(getenv("FETCH_BENCH_SEAL"), "1") == 0)
        o.ucx_seal_fetches = 1;
    if (kvs_client_open(&o, &u, err) != 0)
        goto out;
    kvs_ns ns = {.model = "bench/model", .salt = "", .num_layers = 32, .num_kv_heads = 8,
                 .head_dim = 128, .block_tokens = 16, .dtype = 1};
    size_t elems = (size_t)ns.block_tokens * ns.num_kv_heads * ns.head_dim;
    unsigned char(*keys)[32] = calloc(nb, 32);
    uint16_t *buf = malloc(elems * 2);
    const void *kv[32];
    kvs_bench_fill_kv(&ns, buf, kv);
    if (kvs_bench_put_chain(g, &ns, kv, nb, keys, err) != 0)
        goto out;
    static const kvs_egress fmts[] = {KVS_EGRESS_STORED, KVS_EGRESS_FP16, KVS_EGRESS_FP32};
    static const char *const names[] = {"stored", "fp16", "fp32"};
    double ratio[3];
    for (int f = 0; f < 3; f++) {
        acc ag = {14695981039346656037ull, 0, 1}, au = ag;
        if (kvs_client_get(g, &ns, (const unsigned char(*)[32])keys, nb, fmts[f], 0, -1, acc_cb,
                           &ag, err) != 0 ||
            kvs_client_fetch(u, &ns, (const unsigned char(*)[32])keys, nb, fmts[f], 0, -1, acc_cb,
                             &au, err) != 0) {
            fprintf(stderr, "%s: %s\n", names[f], err);
            goto out;
        }
        if (ag.h != au.h || ag.bytes != au.bytes || ag.bytes == 0) {
            fprintf(stderr, "%s: UCX and gRPC disagree (%llu vs %llu bytes)\n", names[f],
                    (unsigned long long)au.bytes, (unsigned long long)ag.bytes);
            goto out;
        }
        double tg[99], tu[99];
        for (int r = 0; r < reps; r++) {
            for (int p = 0; p < 2; p++) {
                acc a = {0, 0, 0};
                double t0 = kvs_test_now_ms();
                int x = p ? kvs_client_fetch(u, &ns, (const unsigned char(*)[32])keys, nb,
                                             fmts[f], 0, -1, acc_cb, &a, err)
                          : kvs_client_get(g, &ns, (const unsigned char(*)[32])keys, nb, fmts[f],
                                           0, -1, acc_cb, &a, err);
                double ms = kvs_test_now_ms() - t0;
                if (x != 0 || a.bytes != ag.bytes) {
                    fprintf(stderr, "%s run %d: %s\n", names[f], r, err);
                    goto out;
                }
                (p ? tu : tg)[r] = ms;
            }
        }
        qsort(tg, (size_t)reps, sizeof *tg, cmp_d);
        qsort(tu, (size_t)reps, sizeof *tu, cmp_d);
        double mg = tg[reps / 2], mu = tu[reps / 2];
        double gbg = (double)ag.bytes / mg / 1e6, gbu = (double)ag.bytes / mu / 1e6;
        ratio[f] = gbu / gbg;
        printf("%-6s %u blocks, %.1f MiB per fetch: gRPC Get %.1f ms (%.2f GB/s), UCX fetch "
               "%.1f ms (%.2f GB/s), ratio %.2fx\n",
               names[f], nb, (double)ag.bytes / 1048576.0, mg, gbg, mu, gbu, ratio[f]);
    }
    kvs_client_xfer_stats st;
    kvs_client_xfer_stats_get(u, &st);
    if (st.fallbacks != 0 || !st.connected) {
        fprintf(stderr, "the UCX client fell back %llu times (status %d): not a UCX figure\n",
                st.fallbacks, st.ucx_status);
        goto out;
    }
    /* Does rendering on the server's progress thread hold other sessions? */
    int probes = getenv("FETCH_BENCH_PROBES") ? atoi(getenv("FETCH_BENCH_PROBES")) : 40;
    if (probes < 10 || probes > 200)
        probes = 40;
    kvs_client *pc = NULL;
    o.ucx = 1;
    if (kvs_client_open(&o, &pc, err) != 0)
        goto out;
    /* What one probe fetch must bring: the block as gRPC Get gives it. */
    acc one = {0, 0, 0};
    if (kvs_client_get(g, &ns, (const unsigned char(*)[32])keys, 1, KVS_EGRESS_STORED, 0, -1,
                       acc_cb, &one, err) != 0 ||
        one.bytes == 0) {
        fprintf(stderr, "the probe's block over gRPC: %s\n", err);
        goto out_pc;
    }
    double q[4][2];
    static const char *const conds[] = {"alone", "beside stored", "beside fp16", "beside UCX puts"};
    long puts = 0;
    double puts_per_s = 0;
    for (int k = 0; k < 4; k++) {
        bg_load bg = {.c = u,
                      .ns = &ns,
                      .keys = keys,
                      .nb = nb,
                      .fmt = k == 2 ? KVS_EGRESS_FP16 : KVS_EGRESS_STORED,
                      .kv = k == 3 ? kv : NULL};
        pthread_t th;
        int started = k > 0 && pthread_create(&th, NULL, bg_main, &bg) == 0;
        if (k > 0 && !started)
            goto out_pc;
        if (started)
            usleep(20000); /* let the load get going */
        int pr = probe(pc, &ns, keys, one.bytes, probes, &q[k][0], &q[k][1]);
        if (started) {
            atomic_store(&bg.stop, 1);
            pthread_join(th, NULL);
        }
        if (pr != 0 || bg.failed || (started && bg.ops == 0)) {
            fprintf(stderr, "blocking probe (%s) failed\n", conds[k]);
            goto out_pc;
        }
        if (k == 3) {
            puts = bg.ops;
            puts_per_s = (double)bg.ops * 1000.0 / bg.ms;
        }
    }
    kvs_client_xfer_stats_get(u, &st);
    if (st.fallbacks != 0) {
        fprintf(stderr, "the UCX client fell back during the probes: not a UCX figure\n");
        goto out_pc;
    }
    kvs_client_xfer_stats pst;
    kvs_client_xfer_stats_get(pc, &pst);
    if (pst.fallbacks != 0) {
        fprintf(stderr, "the probe client fell back: not a UCX figure\n");
        goto out_pc;
    }
    printf("BLOCKING one stored block over UCX (another session), p50/p90 us: alone %.0f/%.0f, "
           "beside %u-block stored fetches %.0f/%.0f, beside %u-block fp16 renders %.0f/%.0f, "
           "beside UCX puts of int8 blocks %.0f/%.0f (%ld puts, %.0f/s)\n",
           q[0][0], q[0][1], nb, q[1][0], q[1][1], nb, q[2][0], q[2][1], q[3][0], q[3][1], puts,
           puts_per_s);
    printf("RESULT fetch_bench blocks=%u reps=%d ucx_vs_grpc_stored=%.2f ucx_vs_grpc_fp16=%.2f "
           "ucx_vs_grpc_fp32=%.2f fallbacks=%llu\n",
           nb, reps, ratio[0], ratio[1], ratio[2], st.fallbacks);
    rc = 0;
out_pc:
    kvs_client_close(pc);
    free(keys);
    free(buf);
out:
    if (rc != 0 && err[0])
        fprintf(stderr, "fetch_bench: %s\n", err);
    kvs_client_close(g);
    kvs_client_close(u);
    kvs_server_proc_stop(&srv, SIGTERM, 10000, NULL, NULL);
    return rc;
}
