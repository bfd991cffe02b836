/*
 * decoder_workload.c — conversations sharing prefixes, run with and without
 * reused KV; TTFT, reuse and quality against an fp32 no-cache run (the
 * contract is in decoder.h), and KV sample files (--dump-kv).
 *
 * Idea: the baseline and the measured run of a request see the same prompt
 * and predict at the same positions (the measured run is fed the baseline's
 * greedy tokens), so every difference in their next-token distributions comes
 * from the reused KV and nothing else. Prompts and answers do not depend on
 * the scheme: answers appended to a conversation are the baseline's.
 *
 * Local block store: chain keys key_0 = XXH3-128(namespace seed, tokens of
 * block 0), key_i = XXH3-128(key_{i-1} || tokens of block i) — the shape of
 * docs/KEYSPEC.md, not its bytes (nothing leaves the process) — in an array
 * searched linearly (a few thousand blocks at most); a hit also compares the
 * block's tokens, so a collision can never serve wrong KV. Blocks hold the
 * bytes kvs_block_encode wrote and are decoded with kvs_block_decode_layer,
 * which validates every header and tile before it writes a value.
 */
#include "decoder_int.h"

#include "kv_block.h"
#include "kvq_calib.h"
#include "kvq_cpu.h"
#include "kvs_error.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <xxhash.h>

void kvs_wl_opts_default(kvs_wl_opts *o)
{
    memset(o, 0, sizeof *o);
    o->mode = KVS_WL_NO_CACHE;
    o->scheme = KVS_SCHEME_INT8;
    o->block_tokens = 32;
    o->conversations = 16;
    o->turns = 4;
    o->gen_tokens = 32;
    o->max_context = 512;
    o->seed = 1;
    o->k_outliers = KVS_QUANT_DEFAULT_K_OUTLIERS;
    o->v_outliers = KVS_QUANT_DEFAULT_V_OUTLIERS;
    o->sinks = KVS_QUANT_DEFAULT_SINKS;
    o->kv_dtype = KVS_DTYPE_FP32;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static double unif(uint64_t *s)
{
    return (double)(splitmix(s) >> 11) * 0x1p-53;
}

static uint32_t range(uint64_t *s, uint32_t lo, uint32_t hi)
{
    return lo + (uint32_t)(splitmix(s) % (uint64_t)(hi - lo + 1));
}

/* ---- token sequences ------------------------------------------------------------ */

typedef struct seq {
    uint32_t *t;
    uint32_t n, cap;
} seq;

static int seq_push(seq *s, const uint32_t *t, uint32_t n)
{
    if (s->n + n > s->cap) {
        uint32_t cap = s->cap ? s->cap : 64;
        while (cap < s->n + n)
            cap *= 2;
        uint32_t *p = realloc(s->t, cap * sizeof *p);
        if (p == NULL)
            return KVS_ENOMEM;
        s->t = p, s->cap = cap;
    }
    memcpy(s->t + s->n, t, n * sizeof *t);
    s->n += n;
    return 0;
}

/* n tokens sampled from the model at temperature 1 after BOS (BOS itself not
 * included), or uniform random ids. */
static int sample_stream(kvs_decoder *d, const kvs_wl_opts *o, uint64_t *rng, uint32_t n,
                         float *logits, seq *out, char *err)
{
    const kvs_model_config *c = kvs_model_cfg(kvs__decoder_model(d));
    out->n = 0;
    if (o->random_prompts) {
        for (uint32_t i = 0; i < n; i++) {
            uint32_t t = (uint32_t)(splitmix(rng) % c->vocab_size);
            int rc = seq_push(out, &t, 1);
            if (rc != 0)
                return kvs_fail(err, rc, "workload: out of memory");
        }
        return 0;
    }
    kvs_decoder_truncate(d, 0);
    uint32_t tok = KVS_MODEL_BOS;
    for (uint32_t i = 0; i < n; i++) {
        int rc = kvs_decoder_forward(d, &tok, 1, NULL, logits, err);
        if (rc != 0)
            return rc;
        float mx = logits[kvs_argmax(logits, c->vocab_size)];
        double sum = 0;
        for (uint32_t v = 0; v < c->vocab_size; v++)
            sum += exp((double)logits[v] - mx);
        double u = unif(rng) * sum, acc = 0;
        tok = c->vocab_size - 1;
        for (uint32_t v = 0; v < c->vocab_size; v++) {
            acc += exp((double)logits[v] - mx);
            if (u < acc) {
                tok = v;
                break;
            }
        }
        if ((rc = seq_push(out, &tok, 1)) != 0)
            return kvs_fail(err, rc, "workload: out of memory");
    }
    return 0;
}

/* ---- the local block store -------------------------------------------------------- */

typedef struct lblock {
    XXH128_hash_t key;
    uint32_t *tokens; /* T, owned */
    void *bytes;      /* owned, kvs_block_encode output */
    size_t len;
} lblock;

typedef struct lstore {
    lblock *b;
    size_t n, cap;
    XXH128_hash_t ns; /* namespace seed */
    uint32_t T;
    kvs_scheme scheme;
    kvs_scheme *schemes; /* [n_layers] */
    uint32_t k_outliers, v_outliers, sinks;
    int k_pre_rope; /* blocks hold pre-RoPE keys (KVS_WL_K_PRE_ROPE) */
    int key_offsets; /* 8-bit schemes: K tiles carry per-channel key offsets */
    float *kpre;    /* k_pre_rope: [n_layers][T][kv_dim], the keys of the block being put */
} lstore;

static XXH128_hash_t chain_key(XXH128_hash_t prev, const uint32_t *tokens, uint32_t T)
{
    unsigned char buf[sizeof(XXH128_hash_t) + 4 * KVS_BLOCK_MAX_TOKENS];
    memcpy(buf, &prev, sizeof prev);
    memcpy(buf + sizeof prev, tokens, T * sizeof *tokens);
    return XXH3_128bits(buf, sizeof prev + T * sizeof *tokens);
}

static lblock *lstore_find(lstore *s, XXH128_hash_t key, const uint32_t *tokens)
{
    for (size_t i = 0; i < s->n; i++)
        if (XXH128_isEqual(s->b[i].key, key) &&
            memcmp(s->b[i].tokens, tokens, s->T * sizeof *tokens) == 0)
            return &s->b[i];
    return NULL;
}

static void lstore_free(lstore *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->b[i].tokens), free(s->b[i].bytes);
    free(s->b);
    free(s->schemes);
    free(s->kpre);
}

static void block_params(const lstore *s, const kvs_model_config *c, int root, kvs_block_params *p)
{
    memset(p, 0, sizeof *p);
    p->layers = c->n_layers;
    p->heads = c->n_kv_heads;
    p->head_dim = c->head_dim;
    p->block_tokens = s->T;
    p->src_dtype = KVS_DTYPE_FP32;
    p->root = root;
    int q8 = s->scheme != KVS_SCHEME_FP16;
    p->k_outliers = q8 ? s->k_outliers : 0;
    p->v_outliers = q8 ? s->v_outliers : 0;
    p->sinks = q8 && root ? s->sinks : 0;
    p->key_offsets = q8 && s->key_offsets;
    p->schemes = s->schemes;
}

/* Stores every full block of tokens[0..len) that is not in the store yet,
 * encoded from the decoder's pages. */
static int lstore_put(lstore *s, kvs_decoder *d, const uint32_t *tokens, uint32_t len,
                      kvs_wl_report *r, char *err)
{
    const kvs_model_config *c = kvs_model_cfg(kvs__decoder_model(d));
    XXH128_hash_t key = s->ns;
    const void **k = malloc(c->n_layers * sizeof *k), **v = malloc(c->n_layers * sizeof *v);
    if (k == NULL || v == NULL) {
        free(k), free(v);
        return kvs_fail(err, KVS_ENOMEM, "workload: out of memory");
    }
    int rc = 0;
    for (uint32_t b = 0; (b + 1) * s->T <= len && rc == 0; b++) {
        const uint32_t *bt = tokens + (size_t)b * s->T;
        key = chain_key(key, bt, s->T);
        if (lstore_find(s, key, bt) != NULL)
            continue;
        kvs_block_params p;
        block_params(s, c, b == 0, &p);
        for (uint32_t l = 0; l < c->n_layers; l++) {
            k[l] = kvs_decoder_page(d, b, l, KVS_TILE_K);
            v[l] = kvs_decoder_page(d, b, l, KVS_TILE_V);
            if (s->k_pre_rope) { /* the block holds the keys as they were before RoPE */
                float *kp = s->kpre + (size_t)l * s->T * c->kv_dim;
                memcpy(kp, k[l], (size_t)s->T * c->kv_dim * sizeof(float));
                kvs_decoder_rope_keys(d, kp, b * s->T, s->T, 1);
                k[l] = kp;
            }
        }
        size_t size = kvs_block_size(&p);
        if (s->n == s->cap) {
            size_t cap = s->cap ? 2 * s->cap : 64;
            lblock *nb = realloc(s->b, cap * sizeof *nb);
            if (nb == NULL) {
                rc = kvs_fail(err, KVS_ENOMEM, "workload: out of memory");
                break;
            }
            s->b = nb, s->cap = cap;
        }
        lblock *e = &s->b[s->n];
        e->key = key;
        e->len = size;
        e->tokens = malloc(s->T * sizeof *e->tokens);
        e->bytes = aligned_alloc(64, (size + 63) & ~(size_t)63);
        if (e->tokens == NULL || e->bytes == NULL || size == 0) {
            free(e->tokens), free(e->bytes);
            rc = kvs_fail(err, KVS_ENOMEM, "workload: cannot allocate a block of %zu bytes", size);
            break;
        }
        memcpy(e->tokens, bt, s->T * sizeof *bt);
        rc = kvs_block_encode(&p, k, v, kvs_tile_quantize, e->bytes, size, err);
        if (rc != 0) {
            free(e->tokens), free(e->bytes);
            break;
        }
        kvs_block_hdr h; /* what the block says, not what was asked for */
        rc = kvs_block_check_header(e->bytes, size, &h, err);
        if (rc != 0) {
            free(e->tokens), free(e->bytes);
            break;
        }
        s->n++;
        r->blocks_stored++;
        r->bytes_stored += size;
        r->blocks_koff += (h.flags & KVS_BLOCK_F_KOFF) != 0;
    }
    free(k), free(v);
    return rc;
}

/* Longest cached prefix of whole blocks of tokens[0..n) with at most max_blocks
 * blocks, decoded into the (empty) decoder's pages. Returns the number of
 * tokens reused in *reused. */
static int lstore_fetch(lstore *s, kvs_decoder *d, const uint32_t *tokens, uint32_t max_blocks,
                        uint32_t *reused, char *err)
{
    const kvs_model_config *c = kvs_model_cfg(kvs__decoder_model(d));
    XXH128_hash_t key = s->ns;
    uint32_t hits = 0;
    *reused = 0;
    for (uint32_t b = 0; b < max_blocks; b++) {
        const uint32_t *bt = tokens + (size_t)b * s->T;
        key = chain_key(key, bt, s->T);
        lblock *e = lstore_find(s, key, bt);
        if (e == NULL)
            break;
        for (uint32_t l = 0; l < c->n_layers; l++) {
            float *kd = kvs_decoder_page(d, b, l, KVS_TILE_K);
            float *vd = kvs_decoder_page(d, b, l, KVS_TILE_V);
            if (kd == NULL || vd == NULL)
                return kvs_fail(err, KVS_ENOMEM, "workload: cannot allocate a KV page");
            /* decode_layer checks the layer's tiles in full first: its
             * dequantizer need not hash them again (kv_block.h) */
            int rc = kvs_block_decode_layer(e->bytes, e->len, l, KVS_DTYPE_FP32, kd, vd,
                                            kvs_tile_dequantize_verified, err);
            if (rc != 0)
                return rc;
            if (s->k_pre_rope) /* block b holds positions b*T .. b*T+T-1 */
                kvs_decoder_rope_keys(d, kd, b * s->T, s->T, 0);
        }
        hits++;
    }
    if (hits > 0) {
        int rc = kvs_decoder_extend(d, hits * s->T);
        if (rc != 0)
            return kvs_fail(err, rc, "workload: cannot extend the cache");
    }
    *reused = hits * s->T;
    return 0;
}

/* ---- quality ------------------------------------------------------------------------ */

static void log_softmax(const float *x, uint32_t n, double *out)
{
    double mx = x[kvs_argmax(x, n)], sum = 0;
    for (uint32_t i = 0; i < n; i++)
        sum += exp((double)x[i] - mx);
    double lse = mx + log(sum > 0 ? sum : 1.0); /* sum >= 1: the max term is exp(0) */
    for (uint32_t i = 0; i < n; i++)
        out[i] = (double)x[i] - lse;
}

static int bucket_of(uint32_t ctx)
{
    return ctx <= 64 ? 0 : ctx <= 128 ? 1 : ctx <= 256 ? 2 : ctx <= 512 ? 3 : 4;
}

static void score(kvs_wl_quality *q, const float *base, const float *run, uint32_t V,
                  uint32_t greedy, double *lp, double *lq)
{
    log_softmax(base, V, lp);
    log_softmax(run, V, lq);
    double kl = 0;
    for (uint32_t i = 0; i < V; i++)
        kl += exp(lp[i]) * (lp[i] - lq[i]);
    if (kl < 0)
        kl = 0; /* rounding when the distributions are equal */
    q->positions++;
    uint32_t top = kvs_argmax(run, V);
    q->top1 += top == greedy;
    q->near_tie += top != greedy && lp[greedy] - lp[top] < KVS_WL_NEAR_TIE;
    q->kl_sum += kl;
    if (kl > q->kl_max)
        q->kl_max = kl;
    q->nll_base -= lp[greedy];
    q->nll_run -= lq[greedy];
}

static void quality_add(kvs_wl_quality *dst, const kvs_wl_quality *src)
{
    dst->positions += src->positions;
    dst->top1 += src->top1;
    dst->near_tie += src->near_tie;
    dst->kl_sum += src->kl_sum;
    if (src->kl_max > dst->kl_max)
        dst->kl_max = src->kl_max;
    dst->nll_base += src->nll_base;
    dst->nll_run += src->nll_run;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of n sorted values. */
static double pct(const double *v, size_t n, double p)
{
    if (n == 0)
        return 0;
    size_t k = (size_t)ceil(p / 100.0 * (double)n);
    return v[k == 0 ? 0 : k - 1];
}

/* ---- sample files --------------------------------------------------------------------- */

int kvs_decoder_dump_kv(kvs_decoder *d, const float *q, uint32_t len, const char *path, char *err)
{
    if (d == NULL || path == NULL || len == 0 || len > kvs_decoder_len(d))
        return kvs_fail(err, KVS_EINVAL, "dump-kv: bad arguments (len %u of %u)", len,
                        d ? kvs_decoder_len(d) : 0);
    const kvs_model *m = kvs__decoder_model(d);
    const kvs_model_config *c = kvs_model_cfg(m);
    kvs_sample_info info;
    memset(&info, 0, sizeof info);
    info.num_layers = c->n_layers;
    info.num_kv_heads = c->n_kv_heads;
    info.head_dim = c->head_dim;
    info.num_q_heads = q ? c->n_heads : 0;
    info.tokens = len;
    info.first_pos = 0;
    info.dtype = KVS_DTYPE_FP32;
    info.flags = KVS_SAMPLE_F_POST_ROPE | (q ? KVS_SAMPLE_F_QUERIES : 0);
    snprintf(info.model, sizeof info.model, "%.*s", (int)KVS_SAMPLE_MODEL_LEN,
             kvs_model_fingerprint(m));
    const size_t kvd = c->kv_dim, L = c->n_layers, T = kvs_decoder_block_tokens(d);
    float *kv = malloc(2 * L * len * kvd * sizeof(float));
    const void **kp = malloc(L * sizeof *kp), **vp = malloc(L * sizeof *vp),
               **qp = malloc(L * sizeof *qp);
    if (kv == NULL || kp == NULL || vp == NULL || qp == NULL) {
        free(kv), free(kp), free(vp), free(qp);
        return kvs_fail(err, KVS_ENOMEM, "dump-kv: out of memory");
    }
    for (size_t l = 0; l < L; l++) {
        float *kl = kv + 2 * l * len * kvd, *vl = kl + (size_t)len * kvd;
        for (uint32_t t = 0; t < len; t += (uint32_t)T) {
            uint32_t n = len - t < T ? len - t : (uint32_t)T;
            uint32_t page = t / (uint32_t)T;
            memcpy(kl + (size_t)t * kvd, kvs_decoder_page(d, page, (uint32_t)l, KVS_TILE_K),
                   n * kvd * sizeof(float));
            memcpy(vl + (size_t)t * kvd, kvs_decoder_page(d, page, (uint32_t)l, KVS_TILE_V),
                   n * kvd * sizeof(float));
        }
        kp[l] = kl, vp[l] = vl;
        qp[l] = q ? q + l * c->seq_len * c->dim : NULL;
    }
    int rc = kvs_sample_write_layers(path, &info, kp, vp, q ? qp : NULL, err);
    free(kv), free(kp), free(vp), free(qp);
    return rc;
}

/* ---- the driver ---------------------------------------------------------------------- */

typedef struct conv {
    seq prompt; /* grows turn by turn */
    int done;
} conv;

static int check_opts(const kvs_model_config *c, const kvs_wl_opts *o, char *err)
{
    if (o->mode != KVS_WL_NO_CACHE && o->mode != KVS_WL_LOCAL_QUANT && o->mode != KVS_WL_SERVER)
        return kvs_fail(err, KVS_EINVAL, "workload: unknown mode %d", (int)o->mode);
    if (o->block_tokens < KVS_BLOCK_MIN_TOKENS || o->block_tokens > KVS_BLOCK_MAX_TOKENS)
        return kvs_fail(err, KVS_EINVAL, "workload: block_tokens %u, expected %u..%u",
                        o->block_tokens, KVS_BLOCK_MIN_TOKENS, KVS_BLOCK_MAX_TOKENS);
    if (o->conversations < 1 || o->conversations > 4096)
        return kvs_fail(err, KVS_EINVAL, "workload: conversations %u, expected 1..4096",
                        o->conversations);
    if (o->turns < 1 || o->turns > 64)
        return kvs_fail(err, KVS_EINVAL, "workload: turns %u, expected 1..64", o->turns);
    if (o->gen_tokens < 1 || o->gen_tokens > 1024)
        return kvs_fail(err, KVS_EINVAL, "workload: gen_tokens %u, expected 1..1024",
                        o->gen_tokens);
    if (o->max_context > c->seq_len || o->max_context < o->gen_tokens + 64)
        return kvs_fail(err, KVS_EINVAL,
                        "workload: max_context %u, expected gen_tokens + 64 .. seq_len (%u)",
                        o->max_context, c->seq_len);
    if (o->kv_dtype != KVS_DTYPE_FP32 && o->kv_dtype != KVS_DTYPE_FP16 &&
        o->kv_dtype != KVS_DTYPE_BF16)
        return kvs_fail(err, KVS_EINVAL, "workload: kv_dtype %d, expected fp32, fp16 or bf16",
                        (int)o->kv_dtype);
    if (o->k_outliers > KVS_TILE_MAX_OUTLIERS || o->v_outliers > KVS_TILE_MAX_OUTLIERS ||
        o->sinks > KVS_TILE_MAX_SINKS)
        return kvs_fail(err, KVS_EINVAL, "workload: outliers %u/%u (max %u) or sinks %u (max %u)",
                        o->k_outliers, o->v_outliers, KVS_TILE_MAX_OUTLIERS, o->sinks,
                        KVS_TILE_MAX_SINKS);
    if (o->k_rope != KVS_WL_K_POST_ROPE && o->k_rope != KVS_WL_K_PRE_ROPE)
        return kvs_fail(err, KVS_EINVAL, "workload: k_rope %d, expected post (0) or pre (1)",
                        (int)o->k_rope);
    if (o->k_rope == KVS_WL_K_PRE_ROPE && o->mode != KVS_WL_LOCAL_QUANT)
        return kvs_fail(err, KVS_EINVAL, "workload: pre-RoPE keys are a local-quant option");
    if (o->key_offsets && o->mode != KVS_WL_LOCAL_QUANT)
        return kvs_fail(err, KVS_EINVAL, "workload: key offsets are a local-quant option");
    for (uint32_t l = c->n_layers; l < KVS_MODEL_MAX_LAYERS; l++)
        if (o->skip_layer[l])
            return kvs_fail(err, KVS_EINVAL, "workload: skip layer %u, the model has %u layers", l,
                            c->n_layers);
    if (o->mode == KVS_WL_SERVER && (o->server == NULL || o->server[0] == '\0'))
        return kvs_fail(err, KVS_EINVAL, "workload: server mode needs an address");
    if (o->mode != KVS_WL_NO_CACHE && (o->scheme < KVS_SCHEME_FP16 || o->scheme > KVS_SCHEME_INT8))
        return kvs_fail(err, KVS_EINVAL, "workload: unknown scheme %d", (int)o->scheme);
    return 0;
}

typedef struct wl {
    const kvs_model *m;
    const kvs_model_config *c;
    const kvs_wl_opts *o;
    kvs_decoder *base, *run, *gen;
    lstore store;
    kvs__srv *srv;
    double drain_ms;
    float *base_logits, *run_logits, *tmp; /* [gen][V], [gen][V], [V] */
    double *lp, *lq;
    double *ttft, *base_ttft;
    double base_prefill_ms, base_decode_ms, run_prefill_ms, run_decode_ms;
    uint64_t computed_tokens;
    float *qcap;
} wl;

/* One request: the baseline, then the measured run; answer receives the
 * baseline's greedy tokens. */
/* Waits for the puts in flight. A failed put costs reuse later, never this
 * answer: it is logged (the first time) and counted, not fatal. */
static void srv_drain_soft(kvs__srv *s, kvs_wl_report *r)
{
    char e[KVS_ERR_LEN] = "";
    uint64_t before = r->put_failures;
    if (kvs__srv_drain(s, r, e) != 0 && before == 0)
        fprintf(stderr, "kvstash-decoder: %s (the workload goes on; those blocks are not cached)\n",
                e);
}

static int run_request(wl *w, uint32_t ci, uint32_t turn, const seq *prompt, seq *answer, int dump,
                       kvs_wl_report *r, char *err)
{
    const kvs_model_config *c = w->c;
    const kvs_wl_opts *o = w->o;
    const uint32_t V = c->vocab_size, G = o->gen_tokens, P = prompt->n;
    int rc;
    /* baseline: fp32, no cache */
    kvs_decoder_truncate(w->base, 0);
    kvs_decoder_capture_q(w->base, dump ? w->qcap : NULL);
    double t0 = now_ms();
    if ((rc = kvs_decoder_forward(w->base, prompt->t, P, NULL, w->base_logits, err)) != 0)
        return rc;
    double t1 = now_ms();
    answer->n = 0;
    for (uint32_t i = 0; i < G; i++) {
        uint32_t y = kvs_argmax(w->base_logits + (size_t)i * V, V);
        if ((rc = seq_push(answer, &y, 1)) != 0)
            return kvs_fail(err, rc, "workload: out of memory");
        if (i + 1 < G && (rc = kvs_decoder_forward(w->base, &y, 1, NULL,
                                                   w->base_logits + (size_t)(i + 1) * V, err)) != 0)
            return rc;
    }
    double t2 = now_ms();
    kvs_decoder_capture_q(w->base, NULL);
    w->base_ttft[r->requests] = t1 - t0;
    w->base_prefill_ms += t1 - t0;
    w->base_decode_ms += t2 - t1;
    if (dump) {
        char path[4096];
        snprintf(path, sizeof path, "%s/conv%u.kvsm", o->dump_dir, ci);
        if ((rc = kvs_decoder_dump_kv(w->base, w->qcap, kvs_decoder_len(w->base), path, err)) != 0)
            return rc;
    }

    uint32_t reused = 0;
    double ttft = t1 - t0;
    kvs_wl_quality q;
    memset(&q, 0, sizeof q);
    if (o->mode != KVS_WL_NO_CACHE) {
        kvs_decoder_truncate(w->run, 0);
        if (w->srv) { /* the previous request's puts land before this one starts */
            double q0 = now_ms();
            srv_drain_soft(w->srv, r);
            w->drain_ms += now_ms() - q0;
        }
        double s0 = now_ms();
        if (w->srv) {
            rc = kvs__srv_fetch(w->srv, w->run, prompt->t, (P - 1) / o->block_tokens, &reused, err);
            if (rc != 0) { /* never use what did not arrive whole: recompute it */
                if (r->fetch_failures++ < 3)
                    fprintf(stderr,
                            "kvstash-decoder: fetch failed (%s): prefilling the prompt "
                            "(%u tokens) in full\n",
                            err, P);
                kvs_decoder_truncate(w->run, 0);
                reused = 0;
                rc = 0;
            }
        } else if (o->mode == KVS_WL_SERVER) { /* server down since start */
            reused = 0;
        } else {
            rc =
                lstore_fetch(&w->store, w->run, prompt->t, (P - 1) / o->block_tokens, &reused, err);
        }
        if (rc != 0)
            return rc;
        if ((rc = kvs_decoder_forward(w->run, prompt->t + reused, P - reused, NULL, w->run_logits,
                                      err)) != 0)
            return rc;
        double s1 = now_ms();
        for (uint32_t i = 0; i + 1 < G; i++)
            if ((rc = kvs_decoder_forward(w->run, &answer->t[i], 1, NULL,
                                          w->run_logits + (size_t)(i + 1) * V, err)) != 0)
                return rc;
        double s2 = now_ms();
        ttft = s1 - s0;
        w->run_prefill_ms += s1 - s0;
        w->run_decode_ms += s2 - s1;
        w->computed_tokens += P - reused;
        for (uint32_t i = 0; i < G; i++) {
            kvs_wl_quality one;
            memset(&one, 0, sizeof one);
            score(&one, w->base_logits + (size_t)i * V, w->run_logits + (size_t)i * V, V,
                  answer->t[i], w->lp, w->lq);
            quality_add(&q, &one);
            quality_add(&r->bucket[bucket_of(P + i)], &one);
        }
        /* put: the run's own KV (prompt and answer), off the TTFT path */
        double p0 = now_ms();
        seq all = {0};
        if ((rc = seq_push(&all, prompt->t, P)) != 0 ||
            (rc = seq_push(&all, answer->t, G - 1)) != 0) {
            free(all.t);
            return kvs_fail(err, rc, "workload: out of memory");
        }
        if (w->srv) {
            if (kvs__srv_put(w->srv, w->run, all.t, kvs_decoder_len(w->run), err) != 0 &&
                r->put_failures < 3)
                fprintf(stderr, "kvstash-decoder: put not issued (%s)\n", err);
            rc = 0;
        } else if (o->mode != KVS_WL_SERVER) {
            rc = lstore_put(&w->store, w->run, all.t, kvs_decoder_len(w->run), r, err);
        }
        free(all.t);
        if (rc != 0)
            return rc;
        r->put_ms += now_ms() - p0;
    } else {
        w->computed_tokens += P;
        for (uint32_t i = 0; i < G; i++) {
            kvs_wl_quality one;
            memset(&one, 0, sizeof one);
            score(&one, w->base_logits + (size_t)i * V, w->base_logits + (size_t)i * V, V,
                  answer->t[i], w->lp, w->lq);
            quality_add(&q, &one);
            quality_add(&r->bucket[bucket_of(P + i)], &one);
        }
    }
    quality_add(&r->all, &q);
    w->ttft[r->requests] = ttft;
    r->requests++;
    r->prompt_tokens += P;
    r->reused_tokens += reused;
    r->gen_tokens += G;
    if (o->log)
        fprintf(o->log,
                "request conv=%u turn=%u prompt=%u reused=%u ttft_ms=%.3f base_ttft_ms=%.3f "
                "top1=%.4f kl=%.3g\n",
                ci, turn, P, reused, ttft, t1 - t0, (double)q.top1 / (double)q.positions,
                q.kl_sum / (double)q.positions);
    return 0;
}

int kvs_workload_run(const kvs_model *m, const kvs_wl_opts *o, kvs_wl_report *r, char *err)
{
    if (m == NULL || o == NULL || r == NULL)
        return kvs_fail(err, KVS_EINVAL, "kvs_workload_run: NULL argument");
    const kvs_model_config *c = kvs_model_cfg(m);
    int rc = check_opts(c, o, err);
    if (rc != 0)
        return rc;
    memset(r, 0, sizeof *r);
    if (o->dump_dir && mkdir(o->dump_dir, 0777) != 0 && errno != EEXIST)
        return kvs_fail(err, KVS_EIO, "%s: %s", o->dump_dir, strerror(errno));

    wl w;
    memset(&w, 0, sizeof w);
    w.m = m, w.c = c, w.o = o;
    const uint32_t V = c->vocab_size, G = o->gen_tokens, NC = o->conversations;
    const size_t max_req = (size_t)NC * o->turns;
    conv *cv = calloc(NC, sizeof *cv);
    seq sys[3] = {{0}}, doc[2] = {{0}}, user = {0}, answer = {0};
    w.base_logits = malloc((size_t)G * V * sizeof(float));
    w.run_logits = malloc((size_t)G * V * sizeof(float));
    w.tmp = malloc(V * sizeof(float));
    w.lp = malloc(V * sizeof(double));
    w.lq = malloc(V * sizeof(double));
    w.ttft = malloc(max_req * sizeof(double));
    w.base_ttft = malloc(max_req * sizeof(double));
    if (o->dump_dir)
        w.qcap = malloc((size_t)c->n_layers * c->seq_len * c->dim * sizeof(float));
    w.store.T = o->block_tokens;
    w.store.scheme = o->scheme;
    w.store.k_outliers = o->k_outliers;
    w.store.v_outliers = o->v_outliers;
    w.store.sinks = o->sinks < o->block_tokens ? o->sinks : o->block_tokens;
    w.store.schemes = malloc(c->n_layers * sizeof(kvs_scheme));
    w.store.k_pre_rope = o->mode == KVS_WL_LOCAL_QUANT && o->k_rope == KVS_WL_K_PRE_ROPE;
    w.store.key_offsets = o->mode == KVS_WL_LOCAL_QUANT && o->key_offsets;
    if (w.store.k_pre_rope)
        w.store.kpre = malloc((size_t)c->n_layers * o->block_tokens * c->kv_dim * sizeof(float));
    if ((w.store.k_pre_rope && !w.store.kpre) || !cv || !w.base_logits || !w.run_logits || !w.tmp ||
        !w.lp || !w.lq || !w.ttft || !w.base_ttft || (o->dump_dir && !w.qcap) || !w.store.schemes) {
        rc = kvs_fail(err, KVS_ENOMEM, "workload: out of memory");
        goto out;
    }
    for (uint32_t l = 0; l < c->n_layers; l++)
        w.store.schemes[l] = o->skip_layer[l] ? KVS_SCHEME_FP16 : o->scheme;
    {
        char nsd[256];
        int n = snprintf(nsd, sizeof nsd, "kvstash-decoder/local|%s|L%u|H%u|D%u|T%u|%s|K %s",
                         kvs_model_fingerprint(m), c->n_layers, c->n_kv_heads, c->head_dim,
                         o->block_tokens, kvs_scheme_name(o->scheme),
                         w.store.k_pre_rope ? "pre-RoPE" : "post-RoPE");
        w.store.ns = XXH3_128bits(nsd, (size_t)n < sizeof nsd ? (size_t)n : sizeof nsd - 1);
    }
    if (o->mode == KVS_WL_SERVER && kvs__srv_open(m, o, &w.srv, err) != 0) {
        fprintf(stderr,
                "kvstash-decoder: kvstashd at %s unavailable (%s): every prompt is "
                "prefilled in full\n",
                o->server, err);
        r->server_down = 1;
        w.srv = NULL;
        err[0] = '\0';
    }
    if ((rc = kvs_decoder_create(m, o->block_tokens, &w.base, err)) != 0 ||
        (rc = kvs_decoder_create(m, o->block_tokens, &w.run, err)) != 0 ||
        (rc = kvs_decoder_create(m, o->block_tokens, &w.gen, err)) != 0)
        goto out;
    kvs_decoder_set_kv_dtype(w.base, o->kv_dtype);
    kvs_decoder_set_kv_dtype(w.run, o->kv_dtype);

    /* shared material: system prompts (BOS + 40..88 tokens), documents (120..200) */
    uint64_t rng = o->seed * 0x2545F4914F6CDD1DULL + 7;
    const uint32_t ctx = o->max_context;
    for (int i = 0; i < 3; i++) {
        uint32_t bos = KVS_MODEL_BOS;
        seq body = {0};
        rc = sample_stream(w.gen, o, &rng, range(&rng, ctx / 12, ctx / 6), w.tmp, &body, err);
        if (rc == 0 && ((rc = seq_push(&sys[i], &bos, 1)) != 0 ||
                        (rc = seq_push(&sys[i], body.t, body.n)) != 0))
            rc = kvs_fail(err, rc, "workload: out of memory");
        free(body.t);
        if (rc != 0)
            goto out;
    }
    for (int i = 0; i < 2; i++)
        if ((rc = sample_stream(w.gen, o, &rng, range(&rng, ctx / 4, ctx * 2 / 5), w.tmp, &doc[i],
                                err)) != 0)
            goto out;
    /* conversation c: kind c % 4 — 0: system + document A, 1: system + document B,
     * 2: system only, 3: a short chat from BOS */
    for (uint32_t ci = 0; ci < NC; ci++) {
        seq *p = &cv[ci].prompt;
        uint32_t kind = ci % 4, bos = KVS_MODEL_BOS;
        if (kind < 3)
            rc = seq_push(p, sys[ci / 4 % 3].t, sys[ci / 4 % 3].n);
        else
            rc = seq_push(p, &bos, 1);
        if (rc == 0 && kind < 2)
            rc = seq_push(p, doc[kind].t, doc[kind].n);
        if (rc != 0) {
            rc = kvs_fail(err, rc, "workload: out of memory");
            goto out;
        }
    }
    for (uint32_t turn = 0; turn < o->turns; turn++) {
        for (uint32_t ci = 0; ci < NC; ci++) {
            conv *cc = &cv[ci];
            if (cc->done)
                continue;
            if ((rc = sample_stream(w.gen, o, &rng, range(&rng, ctx / 32, ctx / 11), w.tmp, &user,
                                    err)) != 0)
                goto out;
            uint32_t before = cc->prompt.n;
            if ((rc = seq_push(&cc->prompt, user.t, user.n)) != 0) {
                rc = kvs_fail(err, rc, "workload: out of memory");
                goto out;
            }
            if (cc->prompt.n + G > ctx) { /* this conversation is full */
                cc->prompt.n = before;
                cc->done = 1;
                continue;
            }
            /* --dump-kv: every request rewrites its conversation's file, so the file
             * holds the conversation's longest context however it ends (predicting
             * its last turn missed those whose next turn did not fit). */
            if ((rc = run_request(&w, ci, turn, &cc->prompt, &answer, o->dump_dir != NULL, r,
                                  err)) != 0)
                goto out;
            if ((rc = seq_push(&cc->prompt, answer.t, G)) != 0) {
                rc = kvs_fail(err, rc, "workload: out of memory");
                goto out;
            }
        }
    }
    if (r->requests == 0) {
        rc = kvs_fail(err, KVS_EINVAL, "workload: no request fits max_context %u", ctx);
        goto out;
    }
    if (w.srv) {
        double q0 = now_ms();
        srv_drain_soft(w.srv, r);
        w.drain_ms += now_ms() - q0;
        r->put_ms = w.drain_ms; /* time spent waiting for puts, outside every TTFT */
    }
    qsort(w.ttft, r->requests, sizeof(double), cmp_double);
    qsort(w.base_ttft, r->requests, sizeof(double), cmp_double);
    r->ttft_p50_ms = pct(w.ttft, r->requests, 50);
    r->ttft_p99_ms = pct(w.ttft, r->requests, 99);
    r->base_ttft_p50_ms = pct(w.base_ttft, r->requests, 50);
    r->base_ttft_p99_ms = pct(w.base_ttft, r->requests, 99);
    r->ttft_ratio = r->base_ttft_p50_ms > 0 ? r->ttft_p50_ms / r->base_ttft_p50_ms : 0;
    const double decoded = (double)r->requests * (G - 1);
    r->base_prefill_tok_s = (double)r->prompt_tokens / (w.base_prefill_ms * 1e-3);
    r->base_decode_tok_s = w.base_decode_ms > 0 ? decoded / (w.base_decode_ms * 1e-3) : 0;
    if (o->mode == KVS_WL_NO_CACHE) {
        r->prefill_tok_s = r->base_prefill_tok_s;
        r->decode_tok_s = r->base_decode_tok_s;
    } else {
        r->prefill_tok_s = (double)w.computed_tokens / (w.run_prefill_ms * 1e-3);
        r->decode_tok_s = w.run_decode_ms > 0 ? decoded / (w.run_decode_ms * 1e-3) : 0;
    }
out:
    for (uint32_t ci = 0; cv && ci < NC; ci++)
        free(cv[ci].prompt.t);
    free(cv);
    for (int i = 0; i < 3; i++)
        free(sys[i].t);
    free(doc[0].t), free(doc[1].t), free(user.t), free(answer.t);
    free(w.base_logits), free(w.run_logits), free(w.tmp), free(w.lp), free(w.lq);
    free(w.ttft), free(w.base_ttft), free(w.qcap);
    kvs_decoder_free(w.base), kvs_decoder_free(w.run), kvs_decoder_free(w.gen);
    lstore_free(&w.store);
    kvs__srv_close(w.srv);
    return rc;
}

/* ---- the report ------------------------------------------------------------------------- */

static void quality_line(FILE *f, const char *name, const kvs_wl_quality *q)
{
    if (q->positions == 0) {
        fprintf(f, "  %-8s %9u  %8s  %9s  %10s  %10s  %9s  %9s\n", name, 0u, "-", "-", "-", "-",
                "-", "-");
        return;
    }
    double n = (double)q->positions;
    char flips[32];
    snprintf(flips, sizeof flips, "%llu/%llu", (unsigned long long)(q->positions - q->top1),
             (unsigned long long)q->near_tie);
    fprintf(f, "  %-8s %9llu  %8.4f  %9s  %10.3e  %10.3e  %9.4f  %9.4f\n", name,
            (unsigned long long)q->positions, (double)q->top1 / n, flips, q->kl_sum / n, q->kl_max,
            exp(q->nll_base / n), exp(q->nll_run / n));
}

void kvs_wl_report_print(const kvs_model *m, const kvs_wl_opts *o, const kvs_wl_report *r, FILE *f)
{
    const kvs_model_config *c = kvs_model_cfg(m);
    const int cached = o->mode != KVS_WL_NO_CACHE;
    const char *scheme = cached ? kvs_scheme_name(o->scheme) : "none";
    char srvdesc[600];
    snprintf(srvdesc, sizeof srvdesc, "kvstashd at %s (Get as %s, puts asynchronous)",
             o->server ? o->server : "-", o->egress_fp16 ? "fp16" : "fp32");
    fprintf(f,
            "workload: model %s (dim %u, layers %u, heads %u/%u, vocab %u, seq %u); %s; "
            "block_tokens %u; %u conversations x up to %u turns, %u generated tokens each\n",
            kvs_model_fingerprint(m), c->dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size,
            c->seq_len,
            o->mode == KVS_WL_SERVER        ? srvdesc
            : o->mode == KVS_WL_LOCAL_QUANT ? "local quantization (kvs_block_encode / "
                                              "kvs_block_decode_layer)"
                                            : "no cache",
            o->block_tokens, o->conversations, o->turns, o->gen_tokens);
    if (o->kv_dtype != KVS_DTYPE_FP32)
        fprintf(f, "KV cache precision %s in both runs (the baseline is \"%s no-cache\")\n",
                kvs_dtype_name(o->kv_dtype), kvs_dtype_name(o->kv_dtype));
    if (o->mode == KVS_WL_LOCAL_QUANT && o->scheme != KVS_SCHEME_FP16) {
        char skip[256] = "";
        size_t n = 0;
        for (uint32_t l = 0; l < c->n_layers && n + 16 < sizeof skip; l++)
            if (o->skip_layer[l])
                n += (size_t)snprintf(skip + n, sizeof skip - n, "%s%u", n ? "," : "", l);
        fprintf(f, "scheme %s, outliers kK=%u kV=%u, sinks S=%u (root blocks)%s%s%s\n",
                kvs_scheme_name(o->scheme), o->k_outliers, o->v_outliers, o->sinks,
                o->key_offsets ? ", key offsets" : "", n ? ", fp16 layers " : "", skip);
    }
    if (o->mode == KVS_WL_LOCAL_QUANT && o->k_rope == KVS_WL_K_PRE_ROPE)
        fprintf(f, "blocks hold pre-RoPE keys (rotated after each fetch)\n");
    fprintf(f, "requests %u, prompt tokens %llu, reused %llu (%.1f%%), generated %llu\n",
            r->requests, (unsigned long long)r->prompt_tokens, (unsigned long long)r->reused_tokens,
            r->prompt_tokens ? 100.0 * (double)r->reused_tokens / (double)r->prompt_tokens : 0.0,
            (unsigned long long)r->gen_tokens);
    fprintf(f,
            "TTFT ms: p50 %.3f p99 %.3f; fp32 no-cache baseline p50 %.3f p99 %.3f; "
            "ratio (p50) %.3f\n",
            r->ttft_p50_ms, r->ttft_p99_ms, r->base_ttft_p50_ms, r->base_ttft_p99_ms,
            r->ttft_ratio);
    fprintf(f, "tokens/s: prefill %.0f decode %.0f; baseline prefill %.0f decode %.0f\n",
            r->prefill_tok_s, r->decode_tok_s, r->base_prefill_tok_s, r->base_decode_tok_s);
    if (o->mode == KVS_WL_SERVER)
        fprintf(f,
                "server stored %llu blocks (%llu already present), %llu bytes; waited %.1f ms "
                "in total for puts between requests\n",
                (unsigned long long)r->blocks_stored, (unsigned long long)r->blocks_already,
                (unsigned long long)r->bytes_stored, r->put_ms);
    else if (cached)
        fprintf(f,
                "stored %llu blocks, %llu bytes (%.2f bytes per token per layer); put %.1f ms "
                "total\n",
                (unsigned long long)r->blocks_stored, (unsigned long long)r->bytes_stored,
                r->blocks_stored ? (double)r->bytes_stored /
                                       ((double)r->blocks_stored * o->block_tokens * c->n_layers)
                                 : 0.0,
                r->put_ms);
    if (o->mode == KVS_WL_SERVER && (r->server_down || r->fetch_failures || r->put_failures))
        fprintf(f,
                "cache trouble: %s%llu fetch(es) abandoned and recomputed, %llu put(s) "
                "failed\n",
                r->server_down ? "server unreachable (no reuse), " : "",
                (unsigned long long)r->fetch_failures, (unsigned long long)r->put_failures);
    fprintf(f,
            "quality vs fp32 no-cache (same prompts, fed the fp32 greedy tokens; flips/tie: "
            "top-1 disagreements / of which near-ties, fp32 log-prob gap < %g):\n",
            KVS_WL_NEAR_TIE);
    fprintf(f, "  %-8s %9s  %8s  %9s  %10s  %10s  %9s  %9s\n", "context", "positions", "top1",
            "flips/tie", "mean_kl", "max_kl", "ppl_fp32", "ppl");
    static const char *names[KVS_WL_BUCKETS] = {"<=64", "<=128", "<=256", "<=512", ">512"};
    for (int b = 0; b < KVS_WL_BUCKETS; b++)
        if (b < 4 || r->bucket[b].positions > 0)
            quality_line(f, names[b], &r->bucket[b]);
    quality_line(f, "all", &r->all);
    double n = r->all.positions ? (double)r->all.positions : 1.0;
    fprintf(f, "RESULT scheme=%s top1=%.6f kl=%.6e ttft_ratio=%.4f reused_tokens=%llu\n", scheme,
            (double)r->all.top1 / n, r->all.kl_sum / n, r->ttft_ratio,
            (unsigned long long)r->reused_tokens);
}
