/*
 * bench.c — `kvstash bench`: N concurrent workers against one kvstashd, each
 * doing what an inference worker does per prompt: Lookup the prompt, Get the
 * cached prefix (fp16, into its buffers), Put the blocks that missed.
 *
 * The mix: a prompt has --prompt-blocks B blocks. With probability
 * --prefix-share F it starts with one of --prefixes P shared prefixes of
 * --shared-blocks S blocks (a system prompt, a shared document), the rest is
 * unique to the request; otherwise the whole prompt is unique. So in steady
 * state about F*S/B of the blocks asked for can hit.
 *
 * Every worker shares one kvs_client (libkvstash is thread-safe). Latencies
 * are per call, wall clock; the report gives ops/s over the whole run, p50
 * and p99 per RPC, the hit rate (blocks matched / blocks asked for), and the
 * errors (a run with errors exits 1). Before timing, one block is Put and
 * fetched back at fp16 and compared, so a bench against a broken server
 * fails instead of timing errors.
 */
#include "cli.h"

#include "kvq_math.h"

#include <math.h>
#include <stddef.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct bench_cfg {
    const cli *o;
    kvs_client *c;
    kvs_ns ns;
    unsigned clients, prompt_blocks, shared_blocks, prefixes, scheme;
    uint64_t requests;
    double share;
    int do_get;
    uint64_t seed;
    size_t layer_elems, layer_bytes;
} bench_cfg;

typedef struct lat {
    double *v;
    size_t n, cap;
} lat;

typedef struct worker {
    const bench_cfg *b;
    unsigned id;
    pthread_t th;
    lat lookup, put, get, request;
    uint64_t asked, hit, errors, puts, gets_bytes;
    char first_err[KVS_ERR_LEN];
} worker;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void lat_add(lat *l, double s)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 1024;
        double *v = realloc(l->v, cap * sizeof *v);
        if (v == NULL)
            return; /* a lost sample, not a crash */
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = s;
}

static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void note_err(worker *w, const char *what, int rc, const char *err)
{
    if (w->errors++ == 0)
        snprintf(w->first_err, sizeof w->first_err, "%s: %s: %.180s", what, kvs_strerror(rc), err);
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    const bench_cfg *b = w->b;
    const kvs_ns *ns = &b->ns;
    const unsigned T = ns->block_tokens, B = b->prompt_blocks, L = ns->num_layers;
    uint64_t rng = b->seed * 1000003u + w->id;
    unsigned *tokens = malloc((size_t)B * T * sizeof *tokens);
    unsigned char *payload = malloc(2 * b->layer_bytes);
    unsigned char *dst = b->do_get ? malloc((size_t)B * L * 2 * b->layer_bytes) : NULL;
    const void **kp = calloc(L, sizeof *kp), **vp = calloc(L, sizeof *vp);
    void **kd = calloc((size_t)B * L, sizeof *kd), **vd = calloc((size_t)B * L, sizeof *vd);
    unsigned char(*keys)[KVS_CLIENT_KEY_LEN] = calloc(B, KVS_CLIENT_KEY_LEN);
    if (!tokens || !payload || (b->do_get && !dst) || !kp || !vp || !kd || !vd || !keys) {
        note_err(w, "setup", KVS_ENOMEM, "out of memory");
        goto out;
    }
    uint64_t ps = rng;
    kvs_cli_fill_random(payload, 2 * b->layer_elems, ns->dtype, &ps);
    for (unsigned l = 0; l < L; l++) {
        kp[l] = payload; /* every layer sends the same bytes: the server does not care */
        vp[l] = payload + b->layer_bytes;
    }
    for (size_t i = 0; b->do_get && i < (size_t)B * L; i++) {
        kd[i] = dst + (2 * i) * b->layer_bytes;
        vd[i] = dst + (2 * i + 1) * b->layer_bytes;
    }
    uint64_t per = b->requests / b->clients + (w->id < b->requests % b->clients);
    for (uint64_t r = 0; r < per; r++) {
        double t_req = now_s();
        int shared = (double)(mix(&rng) >> 11) * 0x1.0p-53 < b->share;
        unsigned prefix = (unsigned)(mix(&rng) % b->prefixes);
        uint64_t uniq = mix(&rng);
        for (unsigned i = 0; i < B; i++) {
            uint64_t s = (shared && i < b->shared_blocks) ? (0x5eedull << 32 | prefix) * 7919u + i
                                                          : uniq * 31u + i;
            for (unsigned j = 0; j < T; j++)
                tokens[(size_t)i * T + j] = (unsigned)(mix(&s) % 32000u);
        }
        char err[KVS_ERR_LEN] = "";
        kvs_lookup_result *lr = NULL;
        double t0 = now_s();
        int rc = kvs_client_lookup(b->c, ns, tokens, (size_t)B * T, 0, b->o->timeout_ms, &lr, err);
        lat_add(&w->lookup, now_s() - t0);
        if (rc != 0) {
            note_err(w, "lookup", rc, err);
            continue;
        }
        unsigned m = lr->matched_blocks <= B ? lr->matched_blocks : B;
        w->asked += B;
        w->hit += m;
        for (unsigned i = 0; i < m; i++)
            memcpy(keys[i], lr->blocks[i].key, KVS_CLIENT_KEY_LEN);
        unsigned long long lease = lr->lease_id;
        kvs_lookup_result_free(lr);
        if (m > 0 && b->do_get) {
            t0 = now_s();
            rc = kvs_client_get_into(b->c, ns, (const unsigned char(*)[KVS_CLIENT_KEY_LEN])keys, m,
                                     KVS_EGRESS_FP16, lease, b->o->timeout_ms, kd, vd, NULL, NULL,
                                     err);
            lat_add(&w->get, now_s() - t0);
            if (rc != 0)
                note_err(w, "get", rc, err);
            else
                w->gets_bytes += (uint64_t)m * L * 2 * kvs_egress_layer_bytes(ns, KVS_EGRESS_FP16);
        } else if (lease != 0) {
            unsigned dummy;
            kvs_client_unpin(b->c, ns, NULL, 0, lease, b->o->timeout_ms, &dummy, NULL);
        }
        for (unsigned i = m; i < B; i++) {
            kvs_put_args pa = {.ns = ns,
                               .parent_key = i ? keys[i - 1] : NULL,
                               .index = i,
                               .tokens = tokens + (size_t)i * T,
                               .scheme = b->scheme,
                               .k = kp,
                               .v = vp};
            kvs_put_result res;
            memset(&res, 0, sizeof res);
            t0 = now_s();
            rc = kvs_client_put(b->c, &pa, b->o->timeout_ms, &res, err);
            lat_add(&w->put, now_s() - t0);
            if (rc != 0) {
                note_err(w, "put", rc, err);
                break;
            }
            w->puts++;
            memcpy(keys[i], res.key, KVS_CLIENT_KEY_LEN);
        }
        lat_add(&w->request, now_s() - t_req);
    }
out:
    free(tokens);
    free(payload);
    free(dst);
    free(kp);
    free(vp);
    free(kd);
    free(vd);
    free(keys);
    return NULL;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Merges the workers' samples of one kind and prints count, rate, p50, p99. */
static void report(const char *name, worker *w, unsigned n, size_t off, double secs, double *p50_ms,
                   double *p99)
{
    size_t total = 0;
    for (unsigned i = 0; i < n; i++)
        total += ((lat *)((char *)&w[i] + off))->n;
    *p99 = 0;
    *p50_ms = 0;
    if (total == 0) {
        printf("%-8s       0 calls\n", name);
        return;
    }
    double *all = malloc(total * sizeof *all);
    if (all == NULL)
        return;
    size_t k = 0;
    for (unsigned i = 0; i < n; i++) {
        lat *l = (lat *)((char *)&w[i] + off);
        memcpy(all + k, l->v, l->n * sizeof *all);
        k += l->n;
    }
    qsort(all, total, sizeof *all, cmp_d);
    double p50 = all[(total - 1) / 2], q99 = all[(size_t)ceil(0.99 * (double)total) - 1];
    printf("%-8s %7zu calls %10.1f /s   p50 %8.3f ms   p99 %8.3f ms\n", name, total,
           (double)total / secs, p50 * 1e3, q99 * 1e3);
    *p99 = q99 * 1e3;
    *p50_ms = p50 * 1e3;
    free(all);
}

/* One block Put at fp16 and read back as fp16 must be exactly the source
 * rounded to fp16 (bit-exact for an fp16 namespace). */
static int validate(const bench_cfg *b)
{
    const kvs_ns *ns = &b->ns;
    const unsigned T = ns->block_tokens, L = ns->num_layers;
    unsigned *tok = malloc(T * sizeof *tok);
    unsigned char *src = malloc((size_t)L * 2 * b->layer_bytes);
    const size_t half_layer = b->layer_elems * 2; /* bytes of one layer at fp16 */
    unsigned char *got = malloc((size_t)L * 2 * half_layer);
    uint16_t *want = malloc((size_t)L * 2 * half_layer);
    const void **kp = calloc(L, sizeof *kp), **vp = calloc(L, sizeof *vp);
    void **kd = calloc(L, sizeof *kd), **vd = calloc(L, sizeof *vd);
    int ret = 1;
    char err[KVS_ERR_LEN] = "";
    if (!tok || !src || !got || !want || !kp || !vp || !kd || !vd) {
        kvs_cli_fail("bench", KVS_ENOMEM, NULL);
        goto out;
    }
    uint64_t s = b->seed ^ 0xabcdefull ^ (uint64_t)time(NULL) << 20;
    for (unsigned j = 0; j < T; j++)
        tok[j] = (unsigned)(mix(&s) % 32000u);
    kvs_cli_fill_random(src, (size_t)L * 2 * b->layer_elems, ns->dtype, &s);
    for (unsigned l = 0; l < L; l++) {
        kp[l] = src + 2 * l * b->layer_bytes;
        vp[l] = src + (2 * l + 1) * b->layer_bytes;
        kd[l] = got + 2 * l * half_layer;
        vd[l] = got + (2 * l + 1) * half_layer;
    }
    for (size_t i = 0; i < (size_t)L * 2 * b->layer_elems; i++)
        want[i] = ns->dtype == 3 ? kvq_f32_to_fp16(((const float *)(const void *)src)[i])
                  : ns->dtype == 2
                      ? kvq_f32_to_fp16(kvq_bf16_to_f32(((const uint16_t *)(const void *)src)[i]))
                      : ((const uint16_t *)(const void *)src)[i];
    kvs_put_args pa = {.ns = ns, .tokens = tok, .scheme = 1 /* fp16 */, .k = kp, .v = vp};
    kvs_put_result res;
    memset(&res, 0, sizeof res);
    int rc = kvs_client_put(b->c, &pa, b->o->timeout_ms, &res, err);
    if (rc == 0)
        rc = kvs_client_get_into(b->c, ns, (const unsigned char(*)[KVS_CLIENT_KEY_LEN])res.key, 1,
                                 KVS_EGRESS_FP16, 0, b->o->timeout_ms, kd, vd, NULL, NULL, err);
    if (rc != 0) {
        kvs_cli_fail("bench: validation", rc, err);
        goto out;
    }
    if (memcmp(want, got, (size_t)L * 2 * half_layer) != 0) {
        kvs_cli_fail("bench: validation", KVS_EFORMAT,
                     "a block put at fp16 came back different from what was sent");
        goto out;
    }
    unsigned dummy;
    kvs_client_delete(b->c, ns, (const unsigned char(*)[KVS_CLIENT_KEY_LEN])res.key, 1, 0,
                      b->o->timeout_ms, &dummy, NULL);
    ret = 0;
out:
    free(tok);
    free(src);
    free(got);
    free(want);
    free(kp);
    free(vp);
    free(kd);
    free(vd);
    return ret;
}

int kvs_cli_bench(const cli *o, int argc, char **argv)
{
    static const char *const flags[] = {"--no-get", NULL};
    static const char *const allowed[] = {
        KVS_CLI_NS_OPTS,   "--clients",       "--requests", "--prefix-share", "--prefixes",
        "--prompt-blocks", "--shared-blocks", "--scheme",   "--seed",         NULL};
    kvs_cli_args a;
    int rc = kvs_cli_args_parse("bench", argc, argv, flags, allowed, &a);
    if (rc != 0)
        return rc;
    if (a.npos > 0)
        return kvs_cli_usage_error("bench: unexpected argument '%s'", a.pos[0]);
    bench_cfg b;
    memset(&b, 0, sizeof b);
    b.o = o;
    if ((rc = kvs_cli_ns_parse("bench", &a, &b.ns)) != 0)
        return rc;
    uint64_t v;
    if (kvs_cli_arg_u64("bench", &a, "--clients", 1, 1024, 4, &v))
        return KVS_CLI_EXIT_USAGE;
    b.clients = (unsigned)v;
    if (kvs_cli_arg_u64("bench", &a, "--requests", 1, 100000000, 200, &b.requests) ||
        kvs_cli_arg_u64("bench", &a, "--prompt-blocks", 1, 4096, 8, &v))
        return KVS_CLI_EXIT_USAGE;
    b.prompt_blocks = (unsigned)v;
    if (kvs_cli_arg_u64("bench", &a, "--shared-blocks", 0, b.prompt_blocks,
                        (b.prompt_blocks * 3 + 3) / 4, &v))
        return KVS_CLI_EXIT_USAGE;
    b.shared_blocks = (unsigned)v;
    if (kvs_cli_arg_u64("bench", &a, "--prefixes", 1, 1u << 20, 4, &v) ||
        kvs_cli_arg_u64("bench", &a, "--seed", 0, UINT64_MAX, 1, &b.seed))
        return KVS_CLI_EXIT_USAGE;
    b.prefixes = (unsigned)v;
    const char *sh = kvs_cli_arg(&a, "--prefix-share");
    b.share = 0.8;
    if (sh != NULL) {
        char *end;
        b.share = strtod(sh, &end);
        if (end == sh || *end != '\0' || !(b.share >= 0.0 && b.share <= 1.0))
            return kvs_cli_usage_error("bench: --prefix-share: expected a number in [0, 1], "
                                       "got '%s'",
                                       sh);
    }
    const char *sc = kvs_cli_arg(&a, "--scheme");
    static const char *const schemes[] = {"fp16", "fp8_e4m3", "fp8_e5m2", "int8"};
    b.scheme = 0;
    for (unsigned i = 0; sc && i < 4; i++)
        if (strcmp(sc, schemes[i]) == 0)
            b.scheme = i + 1;
    if (sc && b.scheme == 0)
        return kvs_cli_usage_error("bench: --scheme: expected fp16, fp8_e4m3, fp8_e5m2 or int8");
    b.do_get = !kvs_cli_flag(&a, "--no-get");
    b.layer_elems = (size_t)b.ns.block_tokens * b.ns.num_kv_heads * b.ns.head_dim;
    b.layer_bytes = b.layer_elems * kvs_cli_dtype_size(b.ns.dtype);

    if (kvs_cli_connect(o, "bench", &b.c) != 0)
        return 1;
    if (validate(&b) != 0) {
        kvs_client_close(b.c);
        return 1;
    }
    worker *w = calloc(b.clients, sizeof *w);
    if (w == NULL) {
        kvs_client_close(b.c);
        return kvs_cli_fail("bench", KVS_ENOMEM, NULL);
    }
    double t0 = now_s();
    unsigned started = 0;
    for (unsigned i = 0; i < b.clients; i++) {
        w[i].b = &b;
        w[i].id = i;
        if (pthread_create(&w[i].th, NULL, worker_main, &w[i]) != 0)
            break;
        started++;
    }
    for (unsigned i = 0; i < started; i++)
        pthread_join(w[i].th, NULL);
    double secs = now_s() - t0;
    kvs_client_close(b.c);

    uint64_t asked = 0, hit = 0, errors = 0, puts = 0, got = 0;
    const char *first = NULL;
    for (unsigned i = 0; i < started; i++) {
        asked += w[i].asked;
        hit += w[i].hit;
        errors += w[i].errors;
        puts += w[i].puts;
        got += w[i].gets_bytes;
        if (!first && w[i].errors)
            first = w[i].first_err;
    }
    if (started < b.clients)
        errors++;
    printf("bench: %u clients, %llu requests of %u blocks x %u tokens (%u layers, %u kv heads, "
           "head_dim %u, %s), prefix share %.2f over %u prefixes of %u blocks, %s\n",
           b.clients, (unsigned long long)b.requests, b.prompt_blocks, b.ns.block_tokens,
           b.ns.num_layers, b.ns.num_kv_heads, b.ns.head_dim,
           b.ns.dtype == 1   ? "fp16"
           : b.ns.dtype == 2 ? "bf16"
                             : "fp32",
           b.share, b.prefixes, b.shared_blocks, b.do_get ? "hits fetched with Get" : "no Get");
    double p_lookup, p_put, p_get, p_req, m_lookup, m_put, m_get, m_req;
    report("request", w, started, offsetof(worker, request), secs, &m_req, &p_req);
    report("lookup", w, started, offsetof(worker, lookup), secs, &m_lookup, &p_lookup);
    report("get", w, started, offsetof(worker, get), secs, &m_get, &p_get);
    report("put", w, started, offsetof(worker, put), secs, &m_put, &p_put);
    double hit_rate = asked ? (double)hit / (double)asked : 0.0;
    printf("hit rate %.4f (%llu of %llu blocks), %llu blocks put, %.1f MB fetched, %llu errors, "
           "%.2f s\n",
           hit_rate, (unsigned long long)hit, (unsigned long long)asked, (unsigned long long)puts,
           (double)got / 1e6, (unsigned long long)errors, secs);
    if (first)
        fprintf(stderr, "kvstash: bench: first error: %s\n", first);
    printf("RESULT requests_per_s=%.1f lookup_p50_ms=%.3f lookup_p99_ms=%.3f put_p99_ms=%.3f "
           "get_p99_ms=%.3f hit_rate=%.4f errors=%llu\n",
           (double)b.requests / secs, m_lookup, p_lookup, p_put, p_get, hit_rate,
           (unsigned long long)errors);
    for (unsigned i = 0; i < b.clients; i++) {
        free(w[i].lookup.v);
        free(w[i].put.v);
        free(w[i].get.v);
        free(w[i].request.v);
    }
    free(w);
    return errors ? 1 : 0;
}
