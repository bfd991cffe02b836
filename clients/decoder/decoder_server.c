/*
 * decoder_server.c — the workload's cache through kvstashd (libkvstash: gRPC, and
 * UCX for the fetch with --ucx):
 * Lookup of the prompt's prefix, Get of the hit blocks layer by layer into
 * the decoder's pages, and chained asynchronous Puts of the new full blocks.
 *
 * Idea: the server computes chain keys (they commit to the tenant secret), so
 * the client learns block i's key only from Lookup or from the Put of block
 * i. New blocks of one request are therefore put as one chain: each Put's
 * callback issues the next with the key it just received as parent. The chain
 * owns a copy of its tokens and KV, so the decoder may go on at once; the
 * request that follows waits for all chains (kvs__srv_drain) before its TTFT
 * clock starts, which keeps what it finds independent of thread timing.
 *
 * The fetch (kvs_client_fetch_into) decodes every layer straight into its
 * page: fp32 egress fills the page tensor, fp16 egress its first half, which
 * is widened in place once the whole fetch has succeeded. libkvstash checks
 * each layer's size and order; the pages count only after kvs_decoder_extend,
 * which follows a fetch that delivered every layer of every block.
 *
 * Invariants: chain state is touched by one library thread at a time (a
 * chain has at most one Put in flight); the shared counters are under mu.
 */
#include "decoder_int.h"

#include "kvq_calib.h"
#include "kvq_cpu.h"
#include "kvs_error.h"
#include "kvstash.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct kvs__srv {
    kvs_client *c;
    kvs_ns ns;
    char model[sizeof(((kvs_model *)0)->fingerprint)];
    char salt[128];
    unsigned scheme;
    kvs_egress egress;
    uint32_t L, T, kvd;
    /* keys of the blocks the last fetch matched (root first) */
    unsigned char (*keys)[KVS_CLIENT_KEY_LEN];
    uint32_t n_keys, cap_keys;
    /* fetch destinations (pages) and scale slots, 2 x cap_dst each */
    void **dst;
    float *scale;
    size_t cap_dst;
    pthread_mutex_t mu;
    uint64_t blocks_put, bytes_put, already, errors;
    char first_error[KVS_ERR_LEN];
};

int kvs__srv_open(const kvs_model *m, const kvs_wl_opts *o, kvs__srv **out, char *err)
{
    const kvs_model_config *c = kvs_model_cfg(m);
    kvs__srv *s = calloc(1, sizeof *s);
    if (s == NULL)
        return kvs_fail(err, KVS_ENOMEM, "server: out of memory");
    pthread_mutex_init(&s->mu, NULL);
    snprintf(s->model, sizeof s->model, "%s", kvs_model_fingerprint(m));
    s->ns.model = s->model;
    /* the salt keeps runs of different schemes on one server apart (blocks of
     * one prefix stored as fp16 must not serve an int8 run) */
    snprintf(s->salt, sizeof s->salt, "%s", o->salt ? o->salt : kvs_scheme_name(o->scheme));
    s->ns.salt = s->salt;
    s->ns.num_layers = c->n_layers;
    s->ns.num_kv_heads = c->n_kv_heads;
    s->ns.head_dim = c->head_dim;
    s->ns.block_tokens = o->block_tokens;
    s->ns.dtype = KVS_DTYPE_FP32;
    s->scheme = (unsigned)o->scheme;
    s->egress = o->egress_fp16 ? KVS_EGRESS_FP16 : KVS_EGRESS_FP32;
    s->L = c->n_layers, s->T = o->block_tokens, s->kvd = c->kv_dim;
    kvs_client_opts co;
    memset(&co, 0, sizeof co);
    co.target = o->server;
    co.token = o->token;
    co.ucx = o->ucx;
    co.ucx_seal_fetches = o->seal_fetches;
    int rc = kvs_client_open(&co, &s->c, err);
    if (rc != 0) {
        pthread_mutex_destroy(&s->mu);
        free(s);
        return rc;
    }
    *out = s;
    return 0;
}

void kvs__srv_close(kvs__srv *s)
{
    if (s == NULL)
        return;
    kvs_client_close(s->c); /* drains the asynchronous puts first */
    pthread_mutex_destroy(&s->mu);
    free(s->keys);
    free(s->dst);
    free(s->scale);
    free(s);
}

/* ---- fetch -------------------------------------------------------------------------- */

/* Ends a Lookup's lease that no fetch will end (best effort: it expires anyway). */
static void lease_drop(kvs__srv *s, unsigned long long lease)
{
    (void)kvs_client_unpin(s->c, &s->ns, NULL, 0, lease, -1, NULL, NULL);
}

/* Points dst at the pages of blocks 0..n-1 (K of block b layer l at
 * dst[b * L + l], V at dst[n * L + b * L + l]) and sets the scale slots the
 * fetch fills (one per layer and kind, same order) to NaN. */
static int fetch_dst(kvs__srv *s, kvs_decoder *d, uint32_t n, char *err)
{
    const size_t m = (size_t)n * s->L;
    if (m > s->cap_dst) {
        void **p = realloc(s->dst, 2 * m * sizeof *p);
        if (p == NULL)
            return kvs_fail(err, KVS_ENOMEM, "server: out of memory");
        s->dst = p;
        float *q = realloc(s->scale, 2 * m * sizeof *q);
        if (q == NULL)
            return kvs_fail(err, KVS_ENOMEM, "server: out of memory");
        s->scale = q, s->cap_dst = m;
    }
    for (uint32_t b = 0; b < n; b++)
        for (uint32_t l = 0; l < s->L; l++) {
            const size_t i = (size_t)b * s->L + l;
            s->dst[i] = kvs_decoder_page(d, b, l, KVS_TILE_K);
            s->dst[m + i] = kvs_decoder_page(d, b, l, KVS_TILE_V);
            if (s->dst[i] == NULL || s->dst[m + i] == NULL)
                return kvs_fail(err, KVS_ENOMEM, "cannot allocate the KV page of block %u", b);
            s->scale[i] = s->scale[m + i] = NAN;
        }
    return 0;
}

/* Widens the fp16 egress in count page tensors of n floats each, in place
 * (kvs_cpu_fp16_widen_inplace: F16C where kernels/cpu's AVX2 path is on,
 * KVSTASH_CPU_ISA caps it: tests compare). Also timed by
 * tests/bench/fetch_into_bench (decoder_int.h). */
void kvs__srv_widen_pages(void *const *dst, size_t count, size_t n)
{
    for (size_t i = 0; i < count; i++)
        kvs_cpu_fp16_widen_inplace(dst[i], n);
}

int kvs__srv_fetch(kvs__srv *s, kvs_decoder *d, const uint32_t *tokens, uint32_t max_blocks,
                   uint32_t *reused, char *err)
{
    *reused = 0;
    s->n_keys = 0;
    if (max_blocks == 0)
        return 0;
    /* the blocks land in pages 0..n-1: they must hold no KV the decoder uses */
    if (kvs_decoder_len(d) != 0)
        return kvs_fail(err, KVS_EINVAL, "fetch: the cache holds %u tokens, expected none",
                        kvs_decoder_len(d));
    kvs_lookup_result *lr = NULL;
    int rc = kvs_client_lookup(s->c, &s->ns, (const unsigned *)tokens, (size_t)max_blocks * s->T, 0,
                               -1, &lr, err);
    if (rc != 0)
        return rc;
    uint32_t n = lr->matched_blocks;
    /* The lookup's lease pins what it matched until Get ends it (or it
     * expires): every way out before the Get drops it. */
    if (n > max_blocks || lr->n_blocks != n) {
        lease_drop(s, lr->lease_id);
        kvs_lookup_result_free(lr);
        return kvs_fail(err, KVS_EPROTO, "lookup: %u blocks matched of %u asked", n, max_blocks);
    }
    if (n > s->cap_keys) {
        void *p = realloc(s->keys, (size_t)n * sizeof *s->keys);
        if (p == NULL) {
            lease_drop(s, lr->lease_id);
            kvs_lookup_result_free(lr);
            return kvs_fail(err, KVS_ENOMEM, "server: out of memory");
        }
        s->keys = p, s->cap_keys = n;
    }
    for (uint32_t i = 0; i < n; i++)
        memcpy(s->keys[i], lr->blocks[i].key, KVS_CLIENT_KEY_LEN);
    unsigned long long lease = lr->lease_id;
    kvs_lookup_result_free(lr);
    if (n == 0)
        return 0;
    const size_t tensor = (size_t)s->T * s->kvd, m = (size_t)n * s->L;
    const size_t layer_bytes = kvs_egress_layer_bytes(&s->ns, s->egress);
    if (layer_bytes == 0 || layer_bytes > tensor * sizeof(float)) {
        lease_drop(s, lease);
        return kvs_fail(err, KVS_EINVAL, "get: %zu bytes per layer, a page holds %zu", layer_bytes,
                        tensor * sizeof(float));
    }
    if ((rc = fetch_dst(s, d, n, err)) != 0) {
        lease_drop(s, lease);
        return rc;
    }
    /* Each layer is decoded (or copied) by the library straight into its
     * pages; UCX with --ucx, gRPC Get otherwise or as its fallback. On an
     * error the pages may hold some layers: len does not cover them, and the
     * caller's prefill rewrites every position from 0 on. */
    rc = kvs_client_fetch_into(s->c, &s->ns, (const unsigned char(*)[KVS_CLIENT_KEY_LEN])s->keys, n,
                               s->egress, lease, -1, s->dst, s->dst + m, s->scale, s->scale + m,
                               err);
    if (rc != 0)
        return rc;
    /* The scale slots are receipts: fetch_into sets one per layer and kind it
     * delivers (0 for fp32 and fp16), so every layer of every block came. */
    uint32_t seen = 0;
    for (size_t i = 0; i < m; i++)
        seen += s->scale[i] == 0 && s->scale[m + i] == 0;
    if (seen != m)
        return kvs_fail(err, KVS_EPROTO, "get: %u layers arrived, %zu expected", seen, m);
    if (s->egress == KVS_EGRESS_FP16)
        kvs__srv_widen_pages(s->dst, 2 * m, tensor);
    if ((rc = kvs_decoder_extend(d, n * s->T)) != 0)
        return kvs_fail(err, rc, "cannot extend the cache by %u tokens", n * s->T);
    s->n_keys = n;
    *reused = n * s->T;
    return 0;
}

/* ---- put ---------------------------------------------------------------------------- */

typedef struct put_chain {
    kvs__srv *s;
    uint32_t first, count, next; /* block indices first .. first+count-1 */
    unsigned char parent[KVS_CLIENT_KEY_LEN];
    int has_parent;
    unsigned *tokens;    /* count * T */
    float *kv;           /* count blocks of L x (K, V) x T x kvd */
    const void **k, **v; /* L pointers, for the block in flight */
} put_chain;

static void chain_free(put_chain *ch)
{
    free(ch->tokens), free(ch->kv), free(ch->k), free(ch->v);
    free(ch);
}

static void chain_error(kvs__srv *s, int status, const char *err)
{
    pthread_mutex_lock(&s->mu);
    if (s->errors++ == 0)
        snprintf(s->first_error, sizeof s->first_error, "put: %s (%s)", kvs_strerror(status),
                 err ? err : "");
    pthread_mutex_unlock(&s->mu);
}

static void on_put(void *arg, int status, const kvs_put_result *res, const char *err);

/* Issues the Put of ch->next. 0, or the error (the chain is then freed). */
static int chain_issue(put_chain *ch)
{
    kvs__srv *s = ch->s;
    const uint32_t b = ch->next - ch->first;
    const size_t tensor = (size_t)s->T * s->kvd;
    for (uint32_t l = 0; l < s->L; l++) {
        ch->k[l] = ch->kv + ((size_t)b * s->L + l) * 2 * tensor;
        ch->v[l] = ch->kv + (((size_t)b * s->L + l) * 2 + 1) * tensor;
    }
    kvs_put_args a;
    memset(&a, 0, sizeof a);
    a.ns = &s->ns;
    a.parent_key = ch->has_parent ? ch->parent : NULL;
    a.index = ch->next;
    a.tokens = ch->tokens + (size_t)b * s->T;
    a.scheme = s->scheme;
    a.k = ch->k;
    a.v = ch->v;
    int rc = kvs_client_put_async(s->c, &a, -1, on_put, ch);
    if (rc != 0) {
        chain_error(s, rc, "put_async refused the call");
        chain_free(ch);
    }
    return rc;
}

static void on_put(void *arg, int status, const kvs_put_result *res, const char *err)
{
    put_chain *ch = arg;
    kvs__srv *s = ch->s;
    if (status != 0 || res == NULL) {
        chain_error(s, status, err);
        chain_free(ch);
        return;
    }
    pthread_mutex_lock(&s->mu);
    if (res->already_present)
        s->already++;
    else
        s->blocks_put++, s->bytes_put += res->stored_bytes;
    pthread_mutex_unlock(&s->mu);
    memcpy(ch->parent, res->key, KVS_CLIENT_KEY_LEN);
    ch->has_parent = 1;
    if (++ch->next == ch->first + ch->count) {
        chain_free(ch);
        return;
    }
    chain_issue(ch);
}

int kvs__srv_put(kvs__srv *s, kvs_decoder *d, const uint32_t *tokens, uint32_t len, char *err)
{
    const uint32_t full = len / s->T, first = s->n_keys;
    if (full <= first)
        return 0;
    put_chain *ch = calloc(1, sizeof *ch);
    if (ch == NULL) {
        chain_error(s, KVS_ENOMEM, "out of memory");
        return kvs_fail(err, KVS_ENOMEM, "server: out of memory");
    }
    ch->s = s;
    ch->first = ch->next = first;
    ch->count = full - first;
    if (first > 0) {
        memcpy(ch->parent, s->keys[first - 1], KVS_CLIENT_KEY_LEN);
        ch->has_parent = 1;
    }
    const size_t tensor = (size_t)s->T * s->kvd;
    ch->tokens = malloc((size_t)ch->count * s->T * sizeof *ch->tokens);
    ch->kv = malloc((size_t)ch->count * s->L * 2 * tensor * sizeof(float));
    ch->k = malloc(s->L * sizeof *ch->k);
    ch->v = malloc(s->L * sizeof *ch->v);
    if (!ch->tokens || !ch->kv || !ch->k || !ch->v) {
        chain_free(ch);
        chain_error(s, KVS_ENOMEM, "out of memory");
        return kvs_fail(err, KVS_ENOMEM, "server: out of memory");
    }
    for (uint32_t b = 0; b < ch->count; b++) {
        memcpy(ch->tokens + (size_t)b * s->T, tokens + (size_t)(first + b) * s->T,
               s->T * sizeof *tokens);
        for (uint32_t l = 0; l < s->L; l++)
            for (int kind = 0; kind < 2; kind++)
                memcpy(ch->kv + (((size_t)b * s->L + l) * 2 + (size_t)kind) * tensor,
                       kvs_decoder_page(d, first + b, l, kind ? KVS_TILE_V : KVS_TILE_K),
                       tensor * sizeof(float));
    }
    int rc = chain_issue(ch);
    if (rc != 0)
        return kvs_fail(err, rc, "put_async: %s", kvs_strerror(rc));
    return 0;
}

int kvs__srv_drain(kvs__srv *s, kvs_wl_report *r, char *err)
{
    kvs_client_drain(s->c);
    pthread_mutex_lock(&s->mu);
    r->blocks_stored = s->blocks_put;
    r->bytes_stored = s->bytes_put;
    r->blocks_already = s->already;
    r->put_failures = s->errors;
    int rc = s->errors ? kvs_fail(err, KVS_EIO, "%llu put(s) failed; first: %s",
                                  (unsigned long long)s->errors, s->first_error)
                       : 0;
    pthread_mutex_unlock(&s->mu);
    return rc;
}
