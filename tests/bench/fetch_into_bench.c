/*
 * fetch_into_bench.c — kvstash-decoder's fetch of cached blocks into its fp32 KV
 * pages (docs/DECODER.md "Fetching into the pages"), over UCX and over gRPC,
 * against memcpy of the same page bytes in the same run. Per transport:
 *   callback fp32  kvs_client_fetch, a callback memcpy-ing each layer into its
 *                  page: what the decoder did before commit e7b9767;
 *   fetch_into fp32  kvs_client_fetch_into straight into the pages (now);
 *   callback fp16  kvs_client_fetch, a callback widening each layer with the
 *                  scalar kvq_fp16_to_f32 into its page (before);
 *   fetch_into fp16  kvs_client_fetch_into of fp16 egress into the first half
 *                  of each page, then widened in place by the decoder's own
 *                  kvs__srv_widen_pages (decoder_int.h: F16C where kernels/cpu's
 *                  AVX2 path is on, the scalar loop under KVSTASH_CPU_ISA=portable).
 * Baseline: memcpy of the page bytes from a buffer that holds them.
 *
 * Usage: fetch_into_bench /path/to/kvstashd | --server HOST:PORT
 *          [--blocks 16] [--rounds 60] [--layers 8] [--kv-heads 4] [--head-dim 64]
 *          [--tokens 32]
 * Defaults: the synthetic decoder model's layout (8.4 MB of fp32 pages). With a
 * path it starts its own kvstashd on 127.0.0.1 (port 0) and stops it at the end;
 * --server uses a running one, which must offer UCX. UCX_TLS picks UCX's
 * transport (for both sides: the server is a child). The blocks are put once,
 * int8 from random fp32 KV, under a fresh salt; the client decodes (the default
 * kvs_decode_at, as the decoder).
 *
 * Validation, before timing (an untimed first round) and after every timed
 * method: each method starts from pages filled with 0xff (NaN). The first
 * fetch_into fp32 over UCX is the reference; it must be within 5 % relative
 * error of the put KV in every tensor. Every fp32 method's pages must equal it
 * byte for byte, every fp16 method's must equal it rounded through fp16 (the
 * client's decode rounds its fp32 result), memcpy's must equal it; a callback
 * must see every layer once, fetch_into must set every scale slot (0), and the
 * UCX client must never fall back to gRPC.
 * Timing: rounds of the nine methods, the order rotating by one each round, wall
 * clock per method; medians (p25, p75) over the rounds.
 * Last line, ratios of medians as speeds (baseline ms / method ms: above 1 is
 * faster than the baseline); the unprefixed ones are UCX's:
 *   RESULT fetch_into_bench blocks=N rounds=R isa=I fetch_into_vs_callback_fp32=<r>
 *     fetch_into_vs_callback_fp16=<r> grpc_fetch_into_vs_callback_fp32=<r>
 *     grpc_fetch_into_vs_callback_fp16=<r> fetch_into_fp32_vs_memcpy=<r>
 *     fetch_into_fp16_vs_memcpy=<r> fallbacks=0
 */
#include "decoder_int.h"
#include "kvq_cpu.h"
#include "kvq_math.h"
#include "kvs_server_proc.h"
#include "kvstash.h"

#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Methods: 0 memcpy, then per transport (UCX at 1, gRPC at 1 + M_PER) these. */
enum { M_CB32, M_INTO32, M_CB16, M_INTO16, M_PER };
enum { N_METHODS = 1 + 2 * M_PER };

static const char *const method_name[M_PER] = {"callback fp32 (memcpy per layer)",
                                               "fetch_into fp32", "callback fp16 (scalar widening)",
                                               "fetch_into fp16 + widen in place"};

typedef struct bench {
    kvs_ns ns;
    unsigned nb;
    size_t tensor;     /* floats per page tensor: T x kv heads x head_dim */
    size_t page_bytes; /* all pages: nb x L x 2 tensors */
    float *pages;      /* [nb][L][K, V][tensor] */
    float *ref32, *ref16;
    unsigned char (*keys)[KVS_CLIENT_KEY_LEN];
    void **dst; /* K of block b layer l at dst[b * L + l], V at dst[m + b * L + l] */
    float *scale;
} bench;

typedef struct cb_ctx {
    const bench *bn;
    kvs_egress fmt;
    size_t seen;
} cb_ctx;

/* The decoder's callback before fetch_into: size check, then copy (fp32) or
 * scalar widening (fp16) of each layer into its pages. The baseline. */
static int copy_layer(void *arg, unsigned b, unsigned l, const void *k, size_t kl, const void *v,
                      size_t vl, float ks, float vs, int last)
{
    (void)ks, (void)vs, (void)last;
    cb_ctx *c = arg;
    const bench *bn = c->bn;
    const size_t n = bn->tensor, m = (size_t)bn->nb * bn->ns.num_layers;
    const size_t want = n * (c->fmt == KVS_EGRESS_FP32 ? 4 : 2);
    if (b >= bn->nb || l >= bn->ns.num_layers || kl != want || vl != want)
        return 1;
    const size_t i = (size_t)b * bn->ns.num_layers + l;
    float *dk = bn->dst[i], *dv = bn->dst[m + i];
    if (c->fmt == KVS_EGRESS_FP32) {
        memcpy(dk, k, kl);
        memcpy(dv, v, vl);
    } else {
        const unsigned char *p = k, *q = v;
        for (size_t j = 0; j < n; j++) {
            uint16_t h;
            memcpy(&h, p + 2 * j, 2);
            dk[j] = kvq_fp16_to_f32(h);
        }
        for (size_t j = 0; j < n; j++) {
            uint16_t h;
            memcpy(&h, q + 2 * j, 2);
            dv[j] = kvq_fp16_to_f32(h);
        }
    }
    c->seen++;
    return 0;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Runs method k (see the enum) once into bn->pages, timed in *ms. 0, or -1
 * with err set. The pages are not checked here. */
static int run_method(bench *bn, kvs_client *const cl[2], int k, double *ms, char *err)
{
    const size_t m = (size_t)bn->nb * bn->ns.num_layers;
    const unsigned char(*keys)[KVS_CLIENT_KEY_LEN] =
        (const unsigned char(*)[KVS_CLIENT_KEY_LEN])bn->keys;
    for (size_t i = 0; i < 2 * m; i++)
        bn->scale[i] = NAN;
    double t0 = kvs_test_now_ms();
    if (k == 0) {
        memcpy(bn->pages, bn->ref32, bn->page_bytes);
        *ms = kvs_test_now_ms() - t0;
        return 0;
    }
    kvs_client *c = cl[(k - 1) / M_PER];
    const int j = (k - 1) % M_PER;
    const kvs_egress fmt = j == M_CB32 || j == M_INTO32 ? KVS_EGRESS_FP32 : KVS_EGRESS_FP16;
    int rc;
    cb_ctx cc = {bn, fmt, 0};
    if (j == M_CB32 || j == M_CB16) {
        rc = kvs_client_fetch(c, &bn->ns, keys, bn->nb, fmt, 0, -1, copy_layer, &cc, err);
    } else {
        rc = kvs_client_fetch_into(c, &bn->ns, keys, bn->nb, fmt, 0, -1, bn->dst, bn->dst + m,
                                   bn->scale, bn->scale + m, err);
        if (rc == 0 && j == M_INTO16)
            kvs__srv_widen_pages(bn->dst, 2 * m, bn->tensor);
    }
    *ms = kvs_test_now_ms() - t0;
    if (rc != 0)
        return -1;
    if ((j == M_CB32 || j == M_CB16) && cc.seen != m) {
        snprintf(err, KVS_ERR_LEN, "the callback saw %zu layers of %zu", cc.seen, m);
        return -1;
    }
    if (j == M_INTO32 || j == M_INTO16)
        for (size_t i = 0; i < 2 * m; i++)
            if (bn->scale[i] != 0) {
                snprintf(err, KVS_ERR_LEN, "scale slot %zu not set (%g)", i, (double)bn->scale[i]);
                return -1;
            }
    return 0;
}

static const char *method_label(int k)
{
    return k == 0 ? "memcpy of the pages" : method_name[(k - 1) % M_PER];
}

static const char *transport_label(int k)
{
    return k == 0 ? "-" : k <= M_PER ? "ucx" : "grpc";
}

static const float *expected(const bench *bn, int k)
{
    const int j = (k - 1) % M_PER;
    return k == 0 || j == M_CB32 || j == M_INTO32 ? bn->ref32 : bn->ref16;
}

static int parse_uint(const char *s, unsigned lo, unsigned hi, unsigned *out)
{
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = (unsigned)v;
    return 0;
}

int main(int argc, char **argv)
{
    const char *kvstashd = NULL, *server = NULL;
    unsigned nb = 16, rounds = 60, L = 8, H = 4, D = 64, T = 32;
    int bad = 0;
    for (int i = 1; i < argc && !bad; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (a[0] != '-' && kvstashd == NULL) {
            kvstashd = a;
            continue;
        }
        if (v == NULL) {
            bad = 1;
        } else if (strcmp(a, "--server") == 0) {
            server = v;
        } else {
            bad = strcmp(a, "--blocks") == 0     ? parse_uint(v, 1, 4096, &nb)
                  : strcmp(a, "--rounds") == 0   ? parse_uint(v, 3, 9999, &rounds)
                  : strcmp(a, "--layers") == 0   ? parse_uint(v, 1, 256, &L)
                  : strcmp(a, "--kv-heads") == 0 ? parse_uint(v, 1, 256, &H)
                  : strcmp(a, "--head-dim") == 0 ? parse_uint(v, 1, 1024, &D)
                  : strcmp(a, "--tokens") == 0   ? parse_uint(v, 1, 4096, &T)
                                                 : -1;
        }
        i++;
    }
    const size_t tensor = (size_t)T * H * D, page_bytes = (size_t)nb * L * 2 * tensor * 4;
    if (bad || (kvstashd == NULL) == (server == NULL) || page_bytes > ((size_t)2 << 30)) {
        fprintf(stderr,
                "usage: %s /path/to/kvstashd | --server HOST:PORT [--blocks 16] [--rounds 60]\n"
                "       [--layers 8] [--kv-heads 4] [--head-dim 64] [--tokens 32]"
                " (at most 2 GiB of pages)\n",
                argv[0]);
        return 2;
    }
    char err[KVS_ERR_LEN] = "", salt[64];
    snprintf(salt, sizeof salt, "fetch_into_bench-%ld-%ld", (long)getpid(), (long)time(NULL));
    bench bn = {.ns = {.model = "bench/fetch_into",
                       .salt = salt,
                       .num_layers = L,
                       .num_kv_heads = H,
                       .head_dim = D,
                       .block_tokens = T,
                       .dtype = KVS_DTYPE_FP32},
                .nb = nb,
                .tensor = tensor,
                .page_bytes = page_bytes};
    const size_t m = (size_t)nb * L;
    kvs_server_proc srv;
    memset(&srv, 0, sizeof srv);
    kvs_client *cl[2] = {NULL, NULL}; /* UCX, gRPC */
    float *src = NULL;
    unsigned *tokens = NULL;
    const void **kp = NULL, **vp = NULL;
    double *t[N_METHODS] = {NULL};
    int rc = 1;
    if (kvstashd != NULL) {
        const char *args[] = {"--capacity",          "4GiB",   "--log-level", "warn",
                              "--max-message-bytes", "256MiB", NULL};
        if (kvs_server_proc_start(kvstashd, args, &srv, err) != 0) {
            fprintf(stderr, "kvstashd: %s\n", err);
            return 1;
        }
        server = srv.addr;
    }
    bn.pages = aligned_alloc(64, (page_bytes + 63) / 64 * 64);
    bn.ref32 = malloc(page_bytes);
    bn.ref16 = malloc(page_bytes);
    src = malloc(page_bytes);
    bn.keys = calloc(nb, KVS_CLIENT_KEY_LEN);
    tokens = malloc((size_t)T * sizeof *tokens);
    kp = malloc(L * sizeof *kp);
    vp = malloc(L * sizeof *vp);
    bn.dst = malloc(2 * m * sizeof *bn.dst);
    bn.scale = malloc(2 * m * sizeof *bn.scale);
    for (int k = 0; k < N_METHODS; k++)
        t[k] = malloc(rounds * sizeof(double));
    int oom = !bn.pages || !bn.ref32 || !bn.ref16 || !src || !bn.keys || !tokens || !kp || !vp ||
              !bn.dst || !bn.scale;
    for (int k = 0; k < N_METHODS; k++)
        oom |= t[k] == NULL;
    if (oom) {
        snprintf(err, sizeof err, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < m; i++) {
        bn.dst[i] = bn.pages + 2 * i * tensor;
        bn.dst[m + i] = bn.pages + (2 * i + 1) * tensor;
    }
    kvs_client_opts o;
    memset(&o, 0, sizeof o);
    o.target = server;
    o.call_timeout_ms = 60000;
    o.max_recv_bytes = (size_t)256 << 20;
    o.ucx = 1;
    if (kvs_client_open(&o, &cl[0], err) != 0)
        goto out;
    o.ucx = 0;
    if (kvs_client_open(&o, &cl[1], err) != 0)
        goto out;

    /* Put the blocks: src holds their KV in the pages' layout. */
    srand(7);
    for (size_t i = 0; i < page_bytes / 4; i++)
        src[i] = ((float)rand() / (float)RAND_MAX - 0.5f) * 4.0f;
    for (unsigned b = 0; b < nb; b++) {
        for (unsigned i = 0; i < T; i++)
            tokens[i] = (unsigned)rand() % 32000u;
        for (unsigned l = 0; l < L; l++) {
            kp[l] = src + ((size_t)b * L + l) * 2 * tensor;
            vp[l] = src + (((size_t)b * L + l) * 2 + 1) * tensor;
        }
        kvs_put_args a = {.ns = &bn.ns,
                          .parent_key = b ? bn.keys[b - 1] : NULL,
                          .index = b,
                          .tokens = tokens,
                          .scheme = KVS_SCHEME_INT8,
                          .k = kp,
                          .v = vp};
        kvs_put_result r;
        memset(&r, 0, sizeof r);
        if (kvs_client_put(cl[1], &a, -1, &r, err) != 0) {
            fprintf(stderr, "put %u failed\n", b);
            goto out;
        }
        memcpy(bn.keys[b], r.key, KVS_CLIENT_KEY_LEN);
    }

    /* The reference: fetch_into fp32 over UCX, close to what was put. */
    double ms;
    memset(bn.pages, 0xff, page_bytes);
    if (run_method(&bn, cl, 1 + M_INTO32, &ms, err) != 0)
        goto out;
    memcpy(bn.ref32, bn.pages, page_bytes);
    for (size_t i = 0; i < 2 * m; i++) {
        const float *x = bn.ref32 + i * tensor, *y = src + i * tensor;
        double e = 0, s = 0;
        for (size_t j = 0; j < tensor; j++)
            e += ((double)x[j] - y[j]) * ((double)x[j] - y[j]), s += (double)y[j] * y[j];
        if (!(e <= 0.05 * 0.05 * s)) {
            snprintf(err, sizeof err, "reference tensor %zu: relative error %g, above 5 %%", i,
                     sqrt(e / s));
            goto out;
        }
    }
    for (size_t i = 0; i < page_bytes / 4; i++)
        bn.ref16[i] = kvq_fp16_to_f32(kvq_f32_to_fp16(bn.ref32[i]));

    /* Round -1 validates every method untimed; rounds 0.. are timed, each
     * method's pages checked after its clock stopped. */
    for (int r = -1; r < (int)rounds; r++) {
        for (int kk = 0; kk < N_METHODS; kk++) {
            const int k = (kk + (r < 0 ? 0 : r)) % N_METHODS;
            memset(bn.pages, 0xff, page_bytes);
            if (run_method(&bn, cl, k, &ms, err) != 0) {
                fprintf(stderr, "%s (%s) failed\n", method_label(k), transport_label(k));
                goto out;
            }
            if (memcmp(bn.pages, expected(&bn, k), page_bytes) != 0) {
                snprintf(err, sizeof err, "%s (%s): the pages differ from the reference",
                         method_label(k), transport_label(k));
                goto out;
            }
            if (r >= 0)
                t[k][r] = ms;
        }
    }
    kvs_client_xfer_stats xs;
    kvs_client_xfer_stats_get(cl[0], &xs);
    const unsigned long long want = 1ull + (rounds + 1ull) * M_PER;
    if (xs.fallbacks != 0 || !xs.connected || xs.fetches != want) {
        snprintf(err, sizeof err,
                 "UCX served %llu of %llu fetches, %llu fallbacks (status %d): not a UCX figure",
                 xs.fetches, want, xs.fallbacks, xs.ucx_status);
        goto out;
    }

    double med[N_METHODS];
    const char *tls = getenv("UCX_TLS");
    const char *isa = kvs_cpu_isa_name(kvs_cpu_isa_active());
    printf("fetch_into_bench: %u blocks of %u layers x %u kv heads x %u dims x %u tokens, int8 "
           "stored; %.1f MB of fp32 pages; %u rounds; isa %s; UCX_TLS=%s; kvstashd %s (%s)\n",
           nb, L, H, D, T, (double)page_bytes / 1e6, rounds, isa, tls ? tls : "(unset)", server,
           kvstashd ? "own" : "given");
    printf("%-34s %-9s %9s %8s %8s %8s %10s %12s\n", "method", "transport", "median_ms", "p25",
           "p75", "GB/s", "vs_memcpy", "vs_callback");
    for (int k = 0; k < N_METHODS; k++) {
        qsort(t[k], rounds, sizeof(double), cmp_d);
        med[k] = t[k][rounds / 2];
    }
    for (int k = 0; k < N_METHODS; k++) {
        const int j = (k - 1) % M_PER;
        char vs_cb[16] = "-";
        if (k > 0 && (j == M_INTO32 || j == M_INTO16))
            snprintf(vs_cb, sizeof vs_cb, "%.2f", med[k - 1] / med[k]);
        printf("%-34s %-9s %9.3f %8.3f %8.3f %8.2f %10.3f %12s\n", method_label(k),
               transport_label(k), med[k], t[k][rounds / 4], t[k][3 * rounds / 4],
               (double)page_bytes / med[k] / 1e6, med[0] / med[k], vs_cb);
    }
    const int u = 1, g = 1 + M_PER;
    printf("RESULT fetch_into_bench blocks=%u rounds=%u isa=%s fetch_into_vs_callback_fp32=%.2f "
           "fetch_into_vs_callback_fp16=%.2f grpc_fetch_into_vs_callback_fp32=%.2f "
           "grpc_fetch_into_vs_callback_fp16=%.2f fetch_into_fp32_vs_memcpy=%.3f "
           "fetch_into_fp16_vs_memcpy=%.3f fallbacks=%llu\n",
           nb, rounds, isa, med[u + M_CB32] / med[u + M_INTO32],
           med[u + M_CB16] / med[u + M_INTO16], med[g + M_CB32] / med[g + M_INTO32],
           med[g + M_CB16] / med[g + M_INTO16], med[0] / med[u + M_INTO32],
           med[0] / med[u + M_INTO16], xs.fallbacks);
    rc = 0;
out:
    if (rc != 0)
        fprintf(stderr, "fetch_into_bench: %s\n", err[0] ? err : "failed");
    kvs_client_close(cl[0]);
    kvs_client_close(cl[1]);
    if (kvstashd != NULL)
        kvs_server_proc_stop(&srv, SIGTERM, 10000, NULL, NULL);
    for (int k = 0; k < N_METHODS; k++)
        free(t[k]);
    free(bn.pages);
    free(bn.ref32);
    free(bn.ref16);
    free(src);
    free(bn.keys);
    free(tokens);
    free(kp);
    free(vp);
    free(bn.dst);
    free(bn.scale);
    return rc;
}
