/*
 * decoder_forward.c — the fp32 forward pass (Llama: RMSNorm, grouped-query
 * attention with RoPE, SwiGLU, tied or separate classifier) over a paged KV
 * cache.
 *
 * Idea: tokens go through the network in chunks of up to CHUNK rows, so
 * prefill is a matrix-matrix product (each weight row is read once per chunk,
 * not once per token) and decode is the same code with one row. Every output
 * element is one dot() over the input row in a fixed order (eight vector
 * lanes, then a fixed reduction tree), whatever the chunk size, the position
 * of a row in its chunk and the thread that computes it: prefill in one call,
 * token by token, or in pieces gives bit-identical KV and logits.
 *
 * KV cache: page p holds positions p*T .. p*T+T-1; within a page, layer l's K
 * is the [T][n_kv_heads][head_dim] tensor at offset 2l*T*kv_dim and its V
 * follows it — exactly a kvstash block's per-layer tensors (kv_block.h), so a
 * fetched block decodes straight into a page. Pages are allocated on demand
 * and kept until the decoder is freed (truncate only moves len).
 *
 * Invariants: positions < len hold valid KV; len <= seq_len; scratch buffers
 * are sized for CHUNK rows at creation.
 */
#include "decoder_int.h"

#include "kvq_cpu.h"
#include "kvq_math.h"
#include "kvs_error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define CHUNK 32u

struct kvs_decoder {
    const kvs_model *m;
    uint32_t T, n_pages, len;
    float **pages; /* [n_pages], each NULL or 2 * L * T * kv_dim floats */
    int nthreads;
    /* scratch, CHUNK rows each */
    float *x, *xb, *xb2, *q, *k, *v, *hb, *hb2;
    float *att;         /* [nthreads][seq_len] */
    float *freq;        /* [head_dim / 2] RoPE inverse frequencies */
    kvs_dtype kv_dtype; /* FP32: no rounding; FP16 / BF16: values rounded on entry */
    float *qcap;        /* borrowed, NULL or [n_layers][seq_len][dim] (kvs_decoder_capture_q) */
};

/* ---- arithmetic ------------------------------------------------------------------ */

/* Eight lanes as two SSE-width vectors (the x86-64 baseline; wider vectors
 * would change the ABI of these inline helpers without -mavx). */
typedef float v4f __attribute__((vector_size(16)));

static inline v4f load4(const float *p)
{
    v4f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float hsum8(v4f lo, v4f hi, float tail)
{
    return (((lo[0] + hi[0]) + (lo[1] + hi[1])) + ((lo[2] + hi[2]) + (lo[3] + hi[3]))) + tail;
}

/* The one dot product of the decoder: eight lanes over i, a fixed tree, then
 * the tail in order. */
static inline float dot(const float *a, const float *b, size_t n)
{
    v4f lo = {0}, hi = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        lo += load4(a + i) * load4(b + i);
        hi += load4(a + i + 4) * load4(b + i + 4);
    }
    float tail = 0.0f;
    for (; i < n; i++)
        tail += a[i] * b[i];
    return hsum8(lo, hi, tail);
}

/* Four dot products of one x row with four weight rows: the same arithmetic
 * as four dot() calls, one load of x. */
static inline void dot4(const float *x, const float *w, size_t n, float *out)
{
    const float *w0 = w, *w1 = w + n, *w2 = w + 2 * n, *w3 = w + 3 * n;
    v4f l0 = {0}, h0 = {0}, l1 = {0}, h1 = {0}, l2 = {0}, h2 = {0}, l3 = {0}, h3 = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        v4f xl = load4(x + i), xh = load4(x + i + 4);
        l0 += xl * load4(w0 + i), h0 += xh * load4(w0 + i + 4);
        l1 += xl * load4(w1 + i), h1 += xh * load4(w1 + i + 4);
        l2 += xl * load4(w2 + i), h2 += xh * load4(w2 + i + 4);
        l3 += xl * load4(w3 + i), h3 += xh * load4(w3 + i + 4);
    }
    float t0 = 0, t1 = 0, t2 = 0, t3 = 0;
    for (; i < n; i++) {
        t0 += x[i] * w0[i];
        t1 += x[i] * w1[i];
        t2 += x[i] * w2[i];
        t3 += x[i] * w3[i];
    }
    out[0] = hsum8(l0, h0, t0);
    out[1] = hsum8(l1, h1, t1);
    out[2] = hsum8(l2, h2, t2);
    out[3] = hsum8(l3, h3, t3);
}

/* Rows o0..o1 of the output for every x row (the SSE-width path). */
static void matmul_block(float *out, const float *x, const float *w, size_t rows, size_t I,
                         size_t O, size_t o0, size_t o1)
{
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * I;
        float *outr = out + r * O;
        size_t o = o0;
        for (; o + 4 <= o1; o += 4)
            dot4(xr, w + o * I, I, outr + o);
        for (; o < o1; o++)
            outr[o] = dot(xr, w + o * I, I);
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
/* The same eight lanes as one AVX register: lane j of the 256-bit
 * accumulator is lane j of (lo, hi) above, each a separate multiply and add
 * (no FMA: AVX2 only, and C11 mode does not contract), reduced by the same
 * tree — so the results are bit-identical to matmul_block, only faster. */
#define KVS_DEC_HAVE_AVX2 1
typedef float v8f __attribute__((vector_size(32)));

__attribute__((target("avx2"))) static void matmul_block_avx2(float *out, const float *x,
                                                              const float *w, size_t rows, size_t I,
                                                              size_t O, size_t o0, size_t o1)
{
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * I;
        float *outr = out + r * O;
        size_t o = o0;
        for (; o + 4 <= o1; o += 4) {
            const float *w0 = w + o * I, *w1 = w0 + I, *w2 = w1 + I, *w3 = w2 + I;
            v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, xv, t;
            size_t i = 0;
            for (; i + 8 <= I; i += 8) {
                memcpy(&xv, xr + i, sizeof xv);
                memcpy(&t, w0 + i, sizeof t), a0 += xv * t;
                memcpy(&t, w1 + i, sizeof t), a1 += xv * t;
                memcpy(&t, w2 + i, sizeof t), a2 += xv * t;
                memcpy(&t, w3 + i, sizeof t), a3 += xv * t;
            }
            float t0 = 0, t1 = 0, t2 = 0, t3 = 0;
            for (; i < I; i++) {
                t0 += xr[i] * w0[i];
                t1 += xr[i] * w1[i];
                t2 += xr[i] * w2[i];
                t3 += xr[i] * w3[i];
            }
            outr[o] =
                (((a0[0] + a0[4]) + (a0[1] + a0[5])) + ((a0[2] + a0[6]) + (a0[3] + a0[7]))) + t0;
            outr[o + 1] =
                (((a1[0] + a1[4]) + (a1[1] + a1[5])) + ((a1[2] + a1[6]) + (a1[3] + a1[7]))) + t1;
            outr[o + 2] =
                (((a2[0] + a2[4]) + (a2[1] + a2[5])) + ((a2[2] + a2[6]) + (a2[3] + a2[7]))) + t2;
            outr[o + 3] =
                (((a3[0] + a3[4]) + (a3[1] + a3[5])) + ((a3[2] + a3[6]) + (a3[3] + a3[7]))) + t3;
        }
        for (; o < o1; o++)
            outr[o] = dot(xr, w + o * I, I);
    }
}
#endif

/* out[r][o] = x[r] . w[o] for r < rows, o < O; w is [O][I] row-major. Blocks
 * of 16 weight rows stay in cache while every x row passes over them. The
 * AVX2 body runs where kernels/cpu says the CPU has it (KVSTASH_CPU_ISA caps
 * it, as for the quantizer); either body gives the same bits. */
static void matmul(float *out, const float *x, const float *w, size_t rows, size_t I, size_t O)
{
    const long nblk = (long)((O + 15) / 16);
#ifdef KVS_DEC_HAVE_AVX2
    const int avx2 = kvs_cpu_isa_active() >= KVS_CPU_AVX2;
#else
    const int avx2 = 0;
#endif
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (rows * I * O >= (1u << 20))
#endif
    for (long b = 0; b < nblk; b++) {
        size_t o0 = (size_t)b * 16, o1 = o0 + 16 < O ? o0 + 16 : O;
#ifdef KVS_DEC_HAVE_AVX2
        if (avx2) {
            matmul_block_avx2(out, x, w, rows, I, O, o0, o1);
            continue;
        }
#endif
        (void)avx2;
        matmul_block(out, x, w, rows, I, O, o0, o1);
    }
}

static void rmsnorm(float *o, const float *x, const float *w, size_t n)
{
    float ss = dot(x, x, n);
    ss = 1.0f / sqrtf(ss / (float)n + 1e-5f);
    for (size_t i = 0; i < n; i++)
        o[i] = w[i] * (ss * x[i]);
}

static void softmax(float *x, size_t n)
{
    float mx = x[0];
    for (size_t i = 1; i < n; i++)
        if (x[i] > mx)
            mx = x[i];
    float sum = 0.0f;
    for (size_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    for (size_t i = 0; i < n; i++)
        x[i] /= sum;
}

uint32_t kvs_argmax(const float *x, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* ---- the decoder ---------------------------------------------------------------- */

int kvs_decoder_create(const kvs_model *m, uint32_t block_tokens, kvs_decoder **out, char *err)
{
    if (m == NULL || out == NULL)
        return kvs_fail(err, KVS_EINVAL, "kvs_decoder_create: NULL argument");
    *out = NULL;
    const kvs_model_config *c = &m->cfg;
    if (block_tokens == 0 || block_tokens > KVS_MODEL_MAX_SEQ)
        return kvs_fail(err, KVS_EINVAL, "block_tokens = %u, expected 1..%u", block_tokens,
                        KVS_MODEL_MAX_SEQ);
    kvs_decoder *d = calloc(1, sizeof *d);
    if (d == NULL)
        return kvs_fail(err, KVS_ENOMEM, "decoder: out of memory");
    d->m = m;
    d->T = block_tokens;
    d->kv_dtype = KVS_DTYPE_FP32;
    d->n_pages = (c->seq_len + block_tokens - 1) / block_tokens;
#ifdef _OPENMP
    d->nthreads = omp_get_max_threads();
#else
    d->nthreads = 1;
#endif
    d->pages = calloc(d->n_pages, sizeof *d->pages);
    const size_t C = CHUNK;
    d->x = malloc(C * c->dim * sizeof(float));
    d->xb = malloc(C * c->dim * sizeof(float));
    d->xb2 = malloc(C * c->dim * sizeof(float));
    d->q = malloc(C * c->dim * sizeof(float));
    d->k = malloc(C * c->kv_dim * sizeof(float));
    d->v = malloc(C * c->kv_dim * sizeof(float));
    d->hb = malloc(C * c->hidden_dim * sizeof(float));
    d->hb2 = malloc(C * c->hidden_dim * sizeof(float));
    d->att = malloc((size_t)d->nthreads * c->seq_len * sizeof(float));
    d->freq = malloc(c->head_dim / 2 * sizeof(float));
    if (!d->pages || !d->x || !d->xb || !d->xb2 || !d->q || !d->k || !d->v || !d->hb || !d->hb2 ||
        !d->att || !d->freq) {
        kvs_decoder_free(d);
        return kvs_fail(err, KVS_ENOMEM, "decoder: out of memory");
    }
    /* llama2.c: freq = 1 / 10000^(j / head_size) for the pair starting at j = 2i. */
    for (uint32_t i = 0; i < c->head_dim / 2; i++)
        d->freq[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)c->head_dim);
    *out = d;
    return 0;
}

void kvs_decoder_free(kvs_decoder *d)
{
    if (d == NULL)
        return;
    if (d->pages)
        for (uint32_t p = 0; p < d->n_pages; p++)
            free(d->pages[p]);
    free(d->pages);
    free(d->x), free(d->xb), free(d->xb2), free(d->q), free(d->k), free(d->v);
    free(d->hb), free(d->hb2), free(d->att), free(d->freq);
    free(d);
}

uint32_t kvs_decoder_len(const kvs_decoder *d)
{
    return d->len;
}

uint32_t kvs_decoder_block_tokens(const kvs_decoder *d)
{
    return d->T;
}

static size_t page_floats(const kvs_decoder *d)
{
    return (size_t)2 * d->m->cfg.n_layers * d->T * d->m->cfg.kv_dim;
}

static int ensure_pages(kvs_decoder *d, uint32_t end)
{
    for (uint32_t p = 0; p * d->T < end; p++)
        if (d->pages[p] == NULL) {
            d->pages[p] = calloc(page_floats(d), sizeof(float));
            if (d->pages[p] == NULL)
                return KVS_ENOMEM;
        }
    return 0;
}

float *kvs_decoder_page(kvs_decoder *d, uint32_t page, uint32_t layer, kvs_tile_kind kind)
{
    if (d == NULL || page >= d->n_pages || layer >= d->m->cfg.n_layers ||
        (kind != KVS_TILE_K && kind != KVS_TILE_V))
        return NULL;
    if (ensure_pages(d, page * d->T + 1) != 0)
        return NULL;
    size_t tensor = (size_t)d->T * d->m->cfg.kv_dim;
    return d->pages[page] + (2 * (size_t)layer + (kind == KVS_TILE_V)) * tensor;
}

int kvs_decoder_extend(kvs_decoder *d, uint32_t n)
{
    if (d == NULL)
        return KVS_EINVAL;
    if ((uint64_t)d->len + n > d->m->cfg.seq_len)
        return KVS_ENOSPC;
    if (ensure_pages(d, d->len + n) != 0)
        return KVS_ENOMEM;
    d->len += n;
    return 0;
}

void kvs_decoder_capture_q(kvs_decoder *d, float *q)
{
    d->qcap = q;
}

const kvs_model *kvs__decoder_model(const kvs_decoder *d)
{
    return d->m;
}

int kvs_decoder_truncate(kvs_decoder *d, uint32_t len)
{
    if (d == NULL || len > d->len)
        return KVS_EINVAL;
    d->len = len;
    return 0;
}

/* K (or V) row of position pos, layer l: kv_dim floats. */
static inline float *kv_row(const kvs_decoder *d, uint32_t pos, uint32_t l, int is_v)
{
    const size_t kvd = d->m->cfg.kv_dim;
    return d->pages[pos / d->T] + (2 * (size_t)l + (size_t)is_v) * d->T * kvd +
           (size_t)(pos % d->T) * kvd;
}

/* Rounds n values to the cache's precision (after the queries were copied:
 * only K and V are rounded, as a cache of that dtype would hold them). */
static void round_kv(kvs_dtype dt, float *x, size_t n)
{
    if (dt == KVS_DTYPE_FP16)
        for (size_t i = 0; i < n; i++)
            x[i] = kvq_fp16_to_f32(kvq_f32_to_fp16(x[i]));
    else if (dt == KVS_DTYPE_BF16)
        for (size_t i = 0; i < n; i++)
            x[i] = kvq_bf16_to_f32(kvq_f32_to_bf16(x[i]));
}

int kvs_decoder_set_kv_dtype(kvs_decoder *d, kvs_dtype dt)
{
    if (d == NULL || (dt != KVS_DTYPE_FP32 && dt != KVS_DTYPE_FP16 && dt != KVS_DTYPE_BF16))
        return KVS_EINVAL;
    d->kv_dtype = dt;
    return 0;
}

/* RoPE of the pair starting at element j of a row (a query row or a K row:
 * the angle depends on j's place in its head) at position pos. The forward
 * pass and kvs_decoder_rope_keys share these two, so keys rotated after a
 * fetch get exactly the arithmetic of keys rotated in the forward pass. */
static inline void rope_angle(const kvs_decoder *d, float pos, size_t j, float *c, float *s)
{
    const float val = pos * d->freq[(j % d->m->cfg.head_dim) / 2];
    *c = cosf(val);
    *s = sinf(val);
}

static inline void rope_pair(float *x, float c, float s)
{
    const float a = x[0], b = x[1];
    x[0] = a * c - b * s;
    x[1] = a * s + b * c;
}

/* The inverse rotation (by -angle). In fp32 it undoes rope_pair to within a
 * few ulp, not exactly. */
static inline void rope_pair_inv(float *x, float c, float s)
{
    const float a = x[0], b = x[1];
    x[0] = a * c + b * s;
    x[1] = b * c - a * s;
}

int kvs_decoder_rope_keys(const kvs_decoder *d, float *k, uint32_t pos0, uint32_t n, int inverse)
{
    if (d == NULL || (k == NULL && n > 0))
        return KVS_EINVAL;
    const kvs_model_config *c = &d->m->cfg;
    if ((uint64_t)pos0 + n > c->seq_len)
        return KVS_EINVAL;
    const size_t kvd = c->kv_dim;
    for (uint32_t i = 0; i < n; i++) {
        const float pos = (float)(pos0 + i);
        float *row = k + (size_t)i * kvd;
        for (size_t j = 0; j < kvd; j += 2) {
            float fcr, fci;
            rope_angle(d, pos, j, &fcr, &fci);
            if (inverse)
                rope_pair_inv(row + j, fcr, fci);
            else
                rope_pair(row + j, fcr, fci);
        }
    }
    return 0;
}

/* One chunk of n <= CHUNK tokens at positions d->len .. d->len+n-1; the
 * residual stream is left in d->x (final norm not applied). */
static void forward_chunk(kvs_decoder *d, const uint32_t *tok, uint32_t n)
{
    const kvs_model *m = d->m;
    const kvs_model_config *c = &m->cfg;
    const size_t dim = c->dim, kvd = c->kv_dim, hs = c->head_dim, hid = c->hidden_dim;
    const uint32_t group = c->n_heads / c->n_kv_heads;
    const float inv_sqrt_hs = 1.0f / sqrtf((float)hs);

    for (uint32_t i = 0; i < n; i++)
        memcpy(d->x + i * dim, m->tok_emb + (size_t)tok[i] * dim, dim * sizeof(float));

    for (uint32_t l = 0; l < c->n_layers; l++) {
        for (uint32_t i = 0; i < n; i++)
            rmsnorm(d->xb + i * dim, d->x + i * dim, m->rms_att + l * dim, dim);
        matmul(d->q, d->xb, m->wq + l * dim * dim, n, dim, dim);
        matmul(d->k, d->xb, m->wk + l * kvd * dim, n, dim, kvd);
        matmul(d->v, d->xb, m->wv + l * kvd * dim, n, dim, kvd);
        for (uint32_t i = 0; i < n; i++) {
            const float pos = (float)(d->len + i);
            float *q = d->q + i * dim, *k = d->k + i * kvd;
            for (size_t j = 0; j < dim; j += 2) {
                float fcr, fci;
                rope_angle(d, pos, j, &fcr, &fci);
                rope_pair(q + j, fcr, fci);
                if (j < kvd)
                    rope_pair(k + j, fcr, fci);
            }
            if (d->qcap)
                memcpy(d->qcap + ((size_t)l * c->seq_len + d->len + i) * dim, q,
                       dim * sizeof(float));
            round_kv(d->kv_dtype, k, kvd);
            round_kv(d->kv_dtype, d->v + i * kvd, kvd);
            memcpy(kv_row(d, d->len + i, l, 0), k, kvd * sizeof(float));
            memcpy(kv_row(d, d->len + i, l, 1), d->v + i * kvd, kvd * sizeof(float));
        }
        /* attention: every (row, head) pair on its own */
        const long pairs = (long)n * c->n_heads;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) if ((size_t)pairs * (d->len + n) * hs >= (1u << 20))
#endif
        for (long pi = 0; pi < pairs; pi++) {
            const uint32_t i = (uint32_t)(pi / c->n_heads), h = (uint32_t)(pi % c->n_heads);
            const uint32_t pos = d->len + i, g = h / group;
#ifdef _OPENMP
            float *att = d->att + (size_t)omp_get_thread_num() * c->seq_len;
#else
            float *att = d->att;
#endif
            const float *q = d->q + i * dim + h * hs;
            /* walk the pages: rows of one page are kv_dim apart */
            for (uint32_t t0 = 0; t0 <= pos; t0 += d->T) {
                const uint32_t t1 = pos + 1 - t0 < d->T ? pos + 1 : t0 + d->T;
                const float *kr = kv_row(d, t0, l, 0) + g * hs;
                for (uint32_t t = t0; t < t1; t++, kr += kvd)
                    att[t] = dot(q, kr, hs) * inv_sqrt_hs;
            }
            softmax(att, pos + 1);
            float *o = d->xb2 + i * dim + h * hs;
            memset(o, 0, hs * sizeof(float));
            for (uint32_t t0 = 0; t0 <= pos; t0 += d->T) {
                const uint32_t t1 = pos + 1 - t0 < d->T ? pos + 1 : t0 + d->T;
                const float *vr = kv_row(d, t0, l, 1) + g * hs;
                for (uint32_t t = t0; t < t1; t++, vr += kvd) {
                    const float a = att[t];
                    for (size_t e = 0; e < hs; e++)
                        o[e] += a * vr[e];
                }
            }
        }
        matmul(d->xb, d->xb2, m->wo + l * dim * dim, n, dim, dim);
        for (size_t e = 0; e < n * dim; e++)
            d->x[e] += d->xb[e];
        /* SwiGLU feed-forward */
        for (uint32_t i = 0; i < n; i++)
            rmsnorm(d->xb + i * dim, d->x + i * dim, m->rms_ffn + l * dim, dim);
        matmul(d->hb, d->xb, m->w1 + l * hid * dim, n, dim, hid);
        matmul(d->hb2, d->xb, m->w3 + l * hid * dim, n, dim, hid);
        for (size_t e = 0; e < n * hid; e++) {
            float a = d->hb[e];
            d->hb[e] = a * (1.0f / (1.0f + expf(-a))) * d->hb2[e];
        }
        matmul(d->xb, d->hb, m->w2 + l * dim * hid, n, hid, dim);
        for (size_t e = 0; e < n * dim; e++)
            d->x[e] += d->xb[e];
    }
}

int kvs_decoder_forward(kvs_decoder *d, const uint32_t *tokens, uint32_t n, float *logits,
                        float *last, char *err)
{
    if (d == NULL || (tokens == NULL && n > 0))
        return kvs_fail(err, KVS_EINVAL, "kvs_decoder_forward: NULL argument");
    const kvs_model_config *c = &d->m->cfg;
    if (n == 0)
        return kvs_fail(err, KVS_EINVAL, "kvs_decoder_forward: no tokens");
    for (uint32_t i = 0; i < n; i++)
        if (tokens[i] >= c->vocab_size)
            return kvs_fail(err, KVS_EINVAL, "token %u = %u, vocabulary has %u", i, tokens[i],
                            c->vocab_size);
    if ((uint64_t)d->len + n > c->seq_len)
        return kvs_fail(err, KVS_ENOSPC, "sequence of %u + %u tokens passes seq_len %u", d->len, n,
                        c->seq_len);
    if (ensure_pages(d, d->len + n) != 0)
        return kvs_fail(err, KVS_ENOMEM, "decoder: cannot allocate a KV page");
    const size_t dim = c->dim, V = c->vocab_size;
    for (uint32_t done = 0; done < n;) {
        uint32_t cn = n - done < CHUNK ? n - done : CHUNK;
        forward_chunk(d, tokens + done, cn);
        d->len += cn;
        done += cn;
        /* classifier: every row when all logits are wanted, else the last row */
        uint32_t first = logits ? 0 : (done == n && last ? cn - 1 : cn);
        for (uint32_t i = first; i < cn; i++)
            rmsnorm(d->xb + i * dim, d->x + i * dim, d->m->rms_final, dim);
        if (first < cn) {
            float *dst = logits ? logits + (size_t)(done - cn) * V : last;
            matmul(dst, d->xb + first * dim, d->m->wcls, cn - first, dim, V);
            if (last && logits && done == n)
                memcpy(last, logits + (size_t)(n - 1) * V, V * sizeof(float));
        }
    }
    return 0;
}
