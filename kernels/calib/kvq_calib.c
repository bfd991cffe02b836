/*
 * kvq_calib.c — the calibration accumulator: statistics of |x| per K channel
 * and per V head, measured quantization error per candidate k, sink
 * detection, and the profile built from them.
 *
 * The idea: a static scale should be what the dynamic one would have been on
 * typical data, so the statistics are taken exactly the way the quantizer sees
 * the data. Samples are cut into the tiles the store would make (block_tokens
 * aligned to sequence positions, root tiles with S sink rows); in each scale
 * group the k outliers are chosen with the quantizer's own kvq_topk_abs and
 * left out; what remains ("kept") feeds a histogram whose percentile P, over
 * qmax, is the static scale. With P = 100 the static scale is exactly
 * kvq_scale_from_amax(max kept |x|), i.e. the dynamic scale of the tile with
 * the largest one, so calibrating on the data itself reproduces the dynamic
 * quantization bit for bit (tests/unit/test_calib.c checks it).
 *
 * Invariants: histograms have KVS_CALIB_HIST_BINS bins and count only finite
 * values; amax fields are exact maxima over finite values; error sums skip
 * non-finite sources. Memory is fixed by the layout of the first sample.
 */
#include "kvq_calib.h"
#include "kvq.h"
#include "kvq_math.h"

#include "kvs_error.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(KVS_CALIB_HIST_SUB == 32, "hist_bin takes 5 mantissa bits");

const uint32_t kvs_calib_k_candidates[KVS_CALIB_NUM_K] = {0, 1, 2, 4};

typedef struct chan {
    uint64_t count, nonfinite, kept;
    float amax, kept_amax;
} chan;

struct kvs_calib {
    kvs_calib_opts o;
    int have_layout;
    kvs_sample_info lay;
    uint64_t samples, tokens;
    size_t nk, nv;                                /* L*H*D K channels, L*H V heads */
    chan *k, *v;                                  /* [nk], [nv] */
    uint32_t *k_all, *k_kept;                     /* [nk][BINS] */
    uint64_t *v_all, *v_kept;                     /* [nv][BINS]: a V head sees tokens*D values */
    double *err;                                  /* [L][2][NUM_K] sum (x - x')^2 */
    double *err_koff;                             /* [L][NUM_K] K sum (x - x')^2 with key
                                                   * offsets (kv_format.h rule 5) */
    double *ref;                                  /* [L][2] sum x^2 */
    double *kbias;                                /* [L][2]: K tiles' sum over channels of
                                                   * n * mean^2, and sum x^2, rows S.. */
    uint64_t sink_hits[2][KVS_CALIB_SINK_WINDOW]; /* K, V: sink-like (layer, head) pairs */
    uint64_t sink_pairs;                          /* (layer, head) pairs examined */
    /* scratch, sized at layout time */
    float *x;              /* max(T, D) */
    unsigned char *is_out; /* max(T, D) */
    unsigned char *tile;   /* one encoded tile */
    size_t tile_cap;
    float *deq; /* T * D */
};

/* ---- histogram ------------------------------------------------------------ */

static int hist_bin(float a)
{
    uint32_t b = kvq_f32_bits(a);
    int e = (int)(b >> 23) - 127;
    if (e < KVS_CALIB_HIST_EMIN)
        return 0;
    if (e >= KVS_CALIB_HIST_EMAX)
        return KVS_CALIB_HIST_BINS - 1;
    return 1 + (e - KVS_CALIB_HIST_EMIN) * KVS_CALIB_HIST_SUB + (int)((b >> 18) & 31u);
}

/* Middle of an interior bin. */
static float bin_mid(int bin)
{
    int e = (bin - 1) / KVS_CALIB_HIST_SUB + KVS_CALIB_HIST_EMIN;
    int m = (bin - 1) % KVS_CALIB_HIST_SUB;
    return ldexpf(1.0f + ((float)m + 0.5f) / KVS_CALIB_HIST_SUB, e);
}

/* Nearest rank r = ceil(P * n / 100), 1..n, with P taken to 1e-4: integer
 * arithmetic, so P = 99.9 of n = 1000 is rank 999, not 1000. */
static uint64_t rank_of(double pct, uint64_t n)
{
    uint64_t pp = (uint64_t)llround(pct * 10000.0); /* <= 1e6 */
    uint64_t r = (pp * n + 999999u) / 1000000u;
    if (r < 1)
        r = 1;
    if (r > n)
        r = n;
    return r;
}

/* Percentile of a histogram holding n values whose exact maximum is amax.
 * Counts come from h32 (K channels) or, when it is NULL, h64 (V heads). */
static float hist_pct(const uint32_t *h32, const uint64_t *h64, uint64_t n, float amax, double pct)
{
    if (n == 0)
        return 0.0f;
    uint64_t r = rank_of(pct, n);
    if (r == n)
        return amax;
    uint64_t cum = 0;
    int b = 0;
    for (; b < KVS_CALIB_HIST_BINS - 1; b++) {
        cum += h32 ? h32[b] : h64[b];
        if (cum >= r)
            break;
    }
    if (b == 0)
        return 0.0f;
    if (b == KVS_CALIB_HIST_BINS - 1)
        return amax;
    float mid = bin_mid(b);
    return mid < amax ? mid : amax;
}

/* ---- options ---------------------------------------------------------------- */

void kvs_calib_opts_default(kvs_calib_opts *o)
{
    memset(o, 0, sizeof *o);
    o->scheme = KVS_QUANT_DEFAULT_SCHEME;
    o->block_tokens = 256;
    o->k_outliers = KVS_QUANT_DEFAULT_K_OUTLIERS;
    o->v_outliers = KVS_QUANT_DEFAULT_V_OUTLIERS;
    o->sinks = KVS_QUANT_DEFAULT_SINKS;
    o->percentile = 100.0;
    o->meta_budget = KVS_QUANT_META_BUDGET_BITS;
}

static int opts_check(const kvs_calib_opts *o, char *err)
{
    if (o == NULL)
        return kvs_fail(err, KVS_EINVAL, "calibration options: NULL");
    if (o->scheme != KVS_SCHEME_FP8_E4M3 && o->scheme != KVS_SCHEME_FP8_E5M2 &&
        o->scheme != KVS_SCHEME_INT8)
        return kvs_fail(err, KVS_EINVAL, "scheme: must be fp8_e4m3, fp8_e5m2 or int8");
    if (o->block_tokens < KVS_BLOCK_MIN_TOKENS || o->block_tokens > KVS_BLOCK_MAX_TOKENS)
        return kvs_fail(err, KVS_EINVAL, "block_tokens: must be 16..1024");
    if (o->k_outliers > KVS_TILE_MAX_OUTLIERS || o->v_outliers > KVS_TILE_MAX_OUTLIERS)
        return kvs_fail(err, KVS_EINVAL, "outliers: must be 0..16");
    if (o->sinks > KVS_TILE_MAX_SINKS || o->sinks > o->block_tokens)
        return kvs_fail(err, KVS_EINVAL, "sinks: must be 0..min(block_tokens, 64)");
    if (o->key_offsets > 1)
        return kvs_fail(err, KVS_EINVAL, "key_offsets: must be 0 or 1");
    if (!(o->percentile > 0.0 && o->percentile <= 100.0))
        return kvs_fail(err, KVS_EINVAL, "percentile: must be in (0, 100]");
    if (!(o->meta_budget >= 0.0 && o->meta_budget <= 64.0))
        return kvs_fail(err, KVS_EINVAL, "meta_budget: must be in [0, 64] bits per element");
    return 0;
}

int kvs_calib_create(const kvs_calib_opts *o, kvs_calib **out, char *err)
{
    int rc = opts_check(o, err);
    if (rc)
        return rc;
    if (out == NULL)
        return kvs_fail(err, KVS_EINVAL, "calibration: NULL output");
    kvs_calib *c = calloc(1, sizeof *c);
    if (c == NULL)
        return kvs_fail(err, KVS_ENOMEM, "calibration: out of memory");
    c->o = *o;
    *out = c;
    return 0;
}

/* Frees what set_layout allocated and forgets the layout. */
static void drop_layout(kvs_calib *c)
{
    free(c->k);
    free(c->v);
    free(c->k_all);
    free(c->k_kept);
    free(c->v_all);
    free(c->v_kept);
    free(c->err);
    free(c->err_koff);
    free(c->ref);
    free(c->kbias);
    free(c->x);
    free(c->is_out);
    free(c->tile);
    free(c->deq);
    c->k = c->v = NULL;
    c->k_all = c->k_kept = NULL;
    c->v_all = c->v_kept = NULL;
    c->err = c->err_koff = c->ref = c->kbias = NULL;
    c->x = c->deq = NULL;
    c->is_out = c->tile = NULL;
    c->have_layout = 0;
}

void kvs_calib_free(kvs_calib *c)
{
    if (c == NULL)
        return;
    drop_layout(c);
    free(c);
}

uint64_t kvs_calib_samples(const kvs_calib *c)
{
    return c->samples;
}
uint64_t kvs_calib_tokens(const kvs_calib *c)
{
    return c->tokens;
}

/* ---- layout ------------------------------------------------------------------ */

static int set_layout(kvs_calib *c, const kvs_sample_info *in, char *err)
{
    const uint32_t L = in->num_layers, H = in->num_kv_heads, D = in->head_dim;
    const uint32_t T = c->o.block_tokens;
    c->nk = (size_t)L * H * D;
    c->nv = (size_t)L * H;
    uint64_t bytes =
        (uint64_t)c->nk * (sizeof(chan) + 2u * KVS_CALIB_HIST_BINS * sizeof(uint32_t)) +
        (uint64_t)c->nv * (sizeof(chan) + 2u * KVS_CALIB_HIST_BINS * sizeof(uint64_t));
    if (bytes > KVS_CALIB_MAX_BYTES)
        return kvs_fail(err, KVS_ENOSPC,
                    "calibration: %u layers x %u heads x %u dims need %llu "
                    "bytes of statistics, the limit is %llu",
                    L, H, D, (unsigned long long)bytes, (unsigned long long)KVS_CALIB_MAX_BYTES);
    size_t span = T > D ? T : D;
    kvs_tile_params pk = {c->o.scheme, KVS_TILE_K, T, D, 4, c->o.sinks, NULL, 0.0f, 1};
    kvs_tile_params pv = {c->o.scheme, KVS_TILE_V, T, D, 4, c->o.sinks, NULL, 0.0f, 0};
    size_t a = kvs_tile_size(&pk), b = kvs_tile_size(&pv);
    c->tile_cap = a > b ? a : b;
    c->k = calloc(c->nk, sizeof *c->k);
    c->v = calloc(c->nv, sizeof *c->v);
    c->k_all = calloc(c->nk * KVS_CALIB_HIST_BINS, sizeof *c->k_all);
    c->k_kept = calloc(c->nk * KVS_CALIB_HIST_BINS, sizeof *c->k_kept);
    c->v_all = calloc(c->nv * KVS_CALIB_HIST_BINS, sizeof *c->v_all);
    c->v_kept = calloc(c->nv * KVS_CALIB_HIST_BINS, sizeof *c->v_kept);
    c->err = calloc((size_t)L * 2 * KVS_CALIB_NUM_K, sizeof *c->err);
    c->err_koff = calloc((size_t)L * KVS_CALIB_NUM_K, sizeof *c->err_koff);
    c->ref = calloc((size_t)L * 2, sizeof *c->ref);
    c->kbias = calloc((size_t)L * 2, sizeof *c->kbias);
    c->x = malloc(span * sizeof *c->x);
    c->is_out = malloc(span);
    c->tile = malloc(c->tile_cap);
    c->deq = malloc((size_t)T * D * sizeof *c->deq);
    if (!c->k || !c->v || !c->k_all || !c->k_kept || !c->v_all || !c->v_kept || !c->err ||
        !c->err_koff || !c->ref || !c->kbias || !c->x || !c->is_out || !c->tile || !c->deq) {
        drop_layout(c);
        return kvs_fail(err, KVS_ENOMEM, "calibration: cannot allocate %llu bytes",
                    (unsigned long long)bytes);
    }
    c->lay = *in;
    c->lay.tokens = 0;
    c->lay.first_pos = 0;
    c->lay.flags &= KVS_SAMPLE_F_POST_ROPE;
    c->lay.num_q_heads = 0;
    c->have_layout = 1;
    return 0;
}

static int layout_matches(const kvs_calib *c, const kvs_sample_info *in, char *err)
{
    const kvs_sample_info *a = &c->lay;
    if (in->num_layers != a->num_layers)
        return kvs_fail(err, KVS_EINVAL, "num_layers: %u, earlier samples have %u", in->num_layers,
                    a->num_layers);
    if (in->num_kv_heads != a->num_kv_heads)
        return kvs_fail(err, KVS_EINVAL, "num_kv_heads: %u, earlier samples have %u", in->num_kv_heads,
                    a->num_kv_heads);
    if (in->head_dim != a->head_dim)
        return kvs_fail(err, KVS_EINVAL, "head_dim: %u, earlier samples have %u", in->head_dim,
                    a->head_dim);
    if (in->dtype != a->dtype)
        return kvs_fail(err, KVS_EINVAL, "dtype: %s, earlier samples have %s",
                    kvs_dtype_name(in->dtype), kvs_dtype_name(a->dtype));
    if ((in->flags & KVS_SAMPLE_F_POST_ROPE) != (a->flags & KVS_SAMPLE_F_POST_ROPE))
        return kvs_fail(err, KVS_EINVAL, "flags: keys are %s-RoPE, earlier samples are %s-RoPE",
                    (in->flags & KVS_SAMPLE_F_POST_ROPE) ? "post" : "pre",
                    (a->flags & KVS_SAMPLE_F_POST_ROPE) ? "post" : "pre");
    if (strcmp(in->model, a->model) != 0)
        return kvs_fail(err, KVS_EINVAL, "model: '%s', earlier samples are '%s'", in->model, a->model);
    return 0;
}

/* ---- accumulation ------------------------------------------------------------ */

static float load(const unsigned char *base, kvs_dtype dt, size_t i)
{
    if (dt == KVS_DTYPE_FP32) {
        float f;
        memcpy(&f, base + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, base + 2 * i, 2);
    return dt == KVS_DTYPE_FP16 ? kvq_fp16_to_f32(h) : kvq_bf16_to_f32(h);
}

static int is_finite(float x)
{
    return (kvq_f32_bits(x) & 0x7F800000u) != 0x7F800000u;
}

/* One scale group: x[0..n) of which the first `sink` are sink rows (K) or the
 * whole group is a sink row (V: sink = n). All values go to the "all"
 * statistics, the non-outliers among the non-sink ones to "kept". */
static void add_group(kvs_calib *c, const float *x, uint32_t n, uint32_t sink, uint32_t k, chan *ch,
                      uint32_t *all32, uint32_t *kept32, uint64_t *all64, uint64_t *kept64)
{
    for (uint32_t i = 0; i < n; i++) {
        if (!is_finite(x[i])) {
            ch->nonfinite++;
            continue;
        }
        float a = fabsf(x[i]);
        int b = hist_bin(a);
        ch->count++;
        if (a > ch->amax)
            ch->amax = a;
        if (all32)
            all32[b]++;
        else
            all64[b]++;
    }
    if (sink >= n)
        return;
    const float *g = x + sink;
    uint32_t m = n - sink;
    int idx[KVS_TILE_MAX_OUTLIERS];
    memset(c->is_out, 0, m);
    int got = kvq_topk_abs(g, (int)m, (int)k, idx);
    for (int j = 0; j < got; j++)
        c->is_out[idx[j]] = 1;
    for (uint32_t i = 0; i < m; i++) {
        if (c->is_out[i] || !is_finite(g[i]))
            continue;
        float a = fabsf(g[i]);
        int b = hist_bin(a);
        ch->kept++;
        if (a > ch->kept_amax)
            ch->kept_amax = a;
        if (kept32)
            kept32[b]++;
        else
            kept64[b]++;
    }
}

/* How much of one K tile's energy its per-channel means hold, over the rows
 * after the sinks: adds sum over channels of n * mean^2 and sum x^2 (finite
 * values only). Near 0 for channels centred on zero; near 1 when each channel
 * sits at an offset its rows vary little around (docs/QUALITY.md §10). */
static void k_bias_tile(kvs_calib *c, uint32_t layer, const unsigned char *src, size_t stride,
                        uint32_t n, uint32_t sink)
{
    const uint32_t D = c->lay.head_dim;
    double mean_e = 0.0, all_e = 0.0;
    for (uint32_t d = 0; d < D; d++) {
        double sum = 0.0;
        uint32_t cnt = 0;
        for (uint32_t t = sink; t < n; t++) {
            float x = load(src, c->lay.dtype, (size_t)t * stride + d);
            if (is_finite(x)) {
                sum += x;
                all_e += (double)x * x;
                cnt++;
            }
        }
        if (cnt > 0)
            mean_e += sum * sum / cnt;
    }
    c->kbias[layer * 2] += mean_e;
    c->kbias[layer * 2 + 1] += all_e;
}

/* Squared error of one tile quantized with p and decoded again (finite
 * sources only) in *out. */
static int tile_sq_error(kvs_calib *c, const kvs_tile_params *p, const unsigned char *src,
                         size_t stride, double *out, char *err)
{
    const uint32_t D = c->lay.head_dim, n = p->tokens;
    const kvs_dtype dt = c->lay.dtype;
    int rc = kvs_tile_quantize_ref(p, src, dt, stride, c->tile, c->tile_cap, err);
    if (rc == 0)
        rc = kvs_tile_dequantize_ref(c->tile, kvs_tile_size(p), KVS_DTYPE_FP32, c->deq, D, err);
    if (rc)
        return rc;
    double e = 0.0;
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t d = 0; d < D; d++) {
            float x = load(src, dt, (size_t)t * stride + d);
            if (!is_finite(x))
                continue;
            double dx = (double)x - c->deq[(size_t)t * D + d];
            e += dx * dx;
        }
    *out = e;
    return 0;
}

/* Quantizes one tile with each candidate k and adds its squared errors; a K
 * tile also with key offsets (kv_format.h rule 5), for the suggestion. */
static int measure_tile(kvs_calib *c, uint32_t layer, kvs_tile_kind kind, const unsigned char *src,
                        size_t stride, uint32_t n, uint32_t sink, char *err)
{
    const uint32_t D = c->lay.head_dim;
    const kvs_dtype dt = c->lay.dtype;
    double ref = 0.0;
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t d = 0; d < D; d++) {
            float x = load(src, dt, (size_t)t * stride + d);
            if (is_finite(x))
                ref += (double)x * x;
        }
    c->ref[layer * 2 + kind] += ref;
    for (int ci = 0; ci < KVS_CALIB_NUM_K; ci++) {
        kvs_tile_params p = {.scheme = c->o.scheme,
                             .kind = kind,
                             .tokens = n,
                             .dim = D,
                             .outliers = kvs_calib_k_candidates[ci],
                             .sinks = sink};
        double e;
        int rc = tile_sq_error(c, &p, src, stride, &e, err);
        if (rc)
            return rc;
        c->err[((size_t)layer * 2 + kind) * KVS_CALIB_NUM_K + ci] += e;
        if (kind != KVS_TILE_K)
            continue;
        p.key_offsets = 1;
        rc = tile_sq_error(c, &p, src, stride, &e, err);
        if (rc)
            return rc;
        c->err_koff[(size_t)layer * KVS_CALIB_NUM_K + ci] += e;
    }
    return 0;
}

/* Sink-like leading tokens of one (layer, head, K|V) of a sample of N >
 * 2 * WINDOW tokens: a channel where |x[t]| >= RATIO * max |x[t']| over t' >=
 * WINDOW. colmax has D floats of scratch. */
static void sink_scan(kvs_calib *c, const unsigned char *part, uint32_t N, uint32_t h, int kv,
                      float *colmax)
{
    const kvs_sample_info *in = &c->lay;
    const uint32_t H = in->num_kv_heads, D = in->head_dim;
    for (uint32_t d = 0; d < D; d++)
        colmax[d] = 0.0f;
    for (uint32_t t = KVS_CALIB_SINK_WINDOW; t < N; t++)
        for (uint32_t d = 0; d < D; d++)
            colmax[d] =
                kvq_amax_update(colmax[d], load(part, in->dtype, ((size_t)t * H + h) * D + d));
    for (uint32_t t = 0; t < KVS_CALIB_SINK_WINDOW; t++) {
        int hit = 0;
        for (uint32_t d = 0; d < D && !hit; d++) {
            float a = kvq_amax_update(0.0f, load(part, in->dtype, ((size_t)t * H + h) * D + d));
            hit = a > 0.0f && (double)a >= KVS_CALIB_SINK_RATIO * colmax[d];
        }
        c->sink_hits[kv][t] += (uint64_t)hit;
    }
}

int kvs_calib_add(kvs_calib *c, const kvs_sample *s, char *err)
{
    if (c == NULL || s == NULL || s->data == NULL)
        return kvs_fail(err, KVS_EINVAL, "calibration: NULL argument");
    int rc = kvs_sample_info_check(&s->info, err);
    if (rc)
        return rc;
    if (s->data_bytes != kvs_sample_data_bytes(&s->info))
        return kvs_fail(err, KVS_EINVAL, "sample: data_bytes does not match its shape");
    if (c->have_layout) {
        rc = layout_matches(c, &s->info, err);
        if (rc)
            return rc;
    } else {
        rc = set_layout(c, &s->info, err);
        if (rc)
            return rc;
    }
    if (c->tokens + s->info.tokens > KVS_CALIB_MAX_TOKENS)
        return kvs_fail(err, KVS_ENOSPC, "calibration: more than %llu tokens in total",
                    (unsigned long long)KVS_CALIB_MAX_TOKENS);

    const uint32_t L = s->info.num_layers, H = s->info.num_kv_heads, D = s->info.head_dim;
    const uint32_t N = s->info.tokens, T = c->o.block_tokens;
    const kvs_dtype dt = s->info.dtype;
    const size_t stride = (size_t)H * D;
    const size_t es = kvs_sample_elem_size(dt);
    float *x = c->x;

    for (uint32_t l = 0; l < L; l++) {
        const unsigned char *K = kvs_sample_part_ptr(s, KVS_SAMPLE_K, l);
        const unsigned char *V = kvs_sample_part_ptr(s, KVS_SAMPLE_V, l);
        for (uint32_t h = 0; h < H; h++) {
            chan *vch = &c->v[(size_t)l * H + h];
            uint64_t *vall = c->v_all + ((size_t)l * H + h) * KVS_CALIB_HIST_BINS;
            uint64_t *vkept = c->v_kept + ((size_t)l * H + h) * KVS_CALIB_HIST_BINS;
            uint32_t t0 = 0;
            while (t0 < N) {
                /* Tiles follow block boundaries of the sequence position. */
                uint64_t p0 = (uint64_t)s->info.first_pos + t0;
                uint32_t len = T - (uint32_t)(p0 % T);
                uint32_t n = len < N - t0 ? len : N - t0;
                uint32_t sink = p0 == 0 ? (c->o.sinks < n ? c->o.sinks : n) : 0;
                for (uint32_t d = 0; d < D; d++) {
                    size_t ci = ((size_t)l * H + h) * D + d;
                    for (uint32_t i = 0; i < n; i++)
                        x[i] = load(K, dt, (size_t)(t0 + i) * stride + (size_t)h * D + d);
                    add_group(c, x, n, sink, c->o.k_outliers, &c->k[ci],
                              c->k_all + ci * KVS_CALIB_HIST_BINS,
                              c->k_kept + ci * KVS_CALIB_HIST_BINS, NULL, NULL);
                }
                for (uint32_t i = 0; i < n; i++) {
                    for (uint32_t d = 0; d < D; d++)
                        x[d] = load(V, dt, (size_t)(t0 + i) * stride + (size_t)h * D + d);
                    add_group(c, x, D, i < sink ? D : 0, c->o.v_outliers, vch, NULL, NULL, vall,
                              vkept);
                }
                const size_t off = ((size_t)t0 * stride + (size_t)h * D) * es;
                k_bias_tile(c, l, K + off, stride, n, sink);
                rc = measure_tile(c, l, KVS_TILE_K, K + off, stride, n, sink, err);
                if (rc == 0)
                    rc = measure_tile(c, l, KVS_TILE_V, V + off, stride, n, sink, err);
                if (rc)
                    return rc;
                t0 += n;
            }
        }
    }

    if (s->info.first_pos == 0 && N > 2 * KVS_CALIB_SINK_WINDOW) {
        float *colmax = malloc((size_t)D * sizeof *colmax);
        if (colmax == NULL)
            return kvs_fail(err, KVS_ENOMEM, "calibration: out of memory");
        for (uint32_t l = 0; l < L; l++)
            for (uint32_t h = 0; h < H; h++) {
                sink_scan(c, kvs_sample_part_ptr(s, KVS_SAMPLE_K, l), N, h, 0, colmax);
                sink_scan(c, kvs_sample_part_ptr(s, KVS_SAMPLE_V, l), N, h, 1, colmax);
            }
        c->sink_pairs += (uint64_t)L * H;
        free(colmax);
    }
    c->samples++;
    c->tokens += N;
    return 0;
}

/* ---- results ------------------------------------------------------------------- */

static void stats_of(const kvs_calib *c, const chan *ch, const uint32_t *a32, const uint32_t *k32,
                     const uint64_t *a64, const uint64_t *k64, kvs_calib_stats *out)
{
    memset(out, 0, sizeof *out);
    out->count = ch->count;
    out->nonfinite = ch->nonfinite;
    out->amax = ch->amax;
    out->kept = ch->kept;
    out->kept_amax = ch->kept_amax;
    out->p50 = hist_pct(a32, a64, ch->count, ch->amax, 50.0);
    out->p99 = hist_pct(a32, a64, ch->count, ch->amax, 99.0);
    out->p999 = hist_pct(a32, a64, ch->count, ch->amax, 99.9);
    out->kept_pct = hist_pct(k32, k64, ch->kept, ch->kept_amax, c->o.percentile);
}

int kvs_calib_k_stats(const kvs_calib *c, uint32_t layer, uint32_t head, uint32_t d,
                      kvs_calib_stats *out)
{
    if (c == NULL || out == NULL || !c->have_layout || layer >= c->lay.num_layers ||
        head >= c->lay.num_kv_heads || d >= c->lay.head_dim)
        return KVS_EINVAL;
    size_t i = ((size_t)layer * c->lay.num_kv_heads + head) * c->lay.head_dim + d;
    stats_of(c, &c->k[i], c->k_all + i * KVS_CALIB_HIST_BINS, c->k_kept + i * KVS_CALIB_HIST_BINS,
             NULL, NULL, out);
    return 0;
}

int kvs_calib_v_stats(const kvs_calib *c, uint32_t layer, uint32_t head, kvs_calib_stats *out)
{
    if (c == NULL || out == NULL || !c->have_layout || layer >= c->lay.num_layers ||
        head >= c->lay.num_kv_heads)
        return KVS_EINVAL;
    size_t i = (size_t)layer * c->lay.num_kv_heads + head;
    stats_of(c, &c->v[i], NULL, NULL, c->v_all + i * KVS_CALIB_HIST_BINS,
             c->v_kept + i * KVS_CALIB_HIST_BINS, out);
    return 0;
}

int kvs_calib_layer_error(const kvs_calib *c, uint32_t layer, kvs_tile_kind kind, int ci,
                          double *out)
{
    if (c == NULL || out == NULL || !c->have_layout || layer >= c->lay.num_layers ||
        (kind != KVS_TILE_K && kind != KVS_TILE_V) || ci < 0 || ci >= KVS_CALIB_NUM_K)
        return KVS_EINVAL;
    double ref = c->ref[layer * 2 + kind];
    double e = c->err[((size_t)layer * 2 + kind) * KVS_CALIB_NUM_K + (size_t)ci];
    *out = ref > 0.0 ? sqrt(e / ref) : 0.0;
    return 0;
}

int kvs_calib_k_error_offsets(const kvs_calib *c, uint32_t layer, int ci, double *out)
{
    if (c == NULL || out == NULL || !c->have_layout || layer >= c->lay.num_layers || ci < 0 ||
        ci >= KVS_CALIB_NUM_K)
        return KVS_EINVAL;
    double ref = c->ref[layer * 2 + KVS_TILE_K];
    double e = c->err_koff[(size_t)layer * KVS_CALIB_NUM_K + (size_t)ci];
    *out = ref > 0.0 ? sqrt(e / ref) : 0.0;
    return 0;
}

int kvs_calib_k_bias(const kvs_calib *c, uint32_t layer, double *out)
{
    if (c == NULL || out == NULL || !c->have_layout || layer >= c->lay.num_layers)
        return KVS_EINVAL;
    double all = c->kbias[layer * 2 + 1];
    *out = all > 0.0 ? c->kbias[layer * 2] / all : 0.0;
    return 0;
}

double kvs_quant_meta_bits(kvs_scheme s, uint32_t T, uint32_t D, uint32_t kK, uint32_t kV)
{
    double meta = (double)kvs_tile_bytes(s, KVS_TILE_K, T, D, kK, 0) +
                  kvs_tile_bytes(s, KVS_TILE_V, T, D, kV, 0) - 2.0 * T * D;
    return 8.0 * meta / (2.0 * T * D);
}

/* Key offsets at the suggested (kK, kV): they pay when they cut the relative
 * K error by a larger fraction than they add to the bytes of a K and V tile
 * pair (docs/CALIBRATION.md §3, "Key offsets", has the measurements). */
static void suggest_key_offsets(const kvs_calib *c, kvs_calib_suggestion *out)
{
    const uint32_t L = c->lay.num_layers, T = c->o.block_tokens, D = c->lay.head_dim;
    const kvs_scheme s = c->o.scheme;
    int ki = 0;
    for (int ci = 0; ci < KVS_CALIB_NUM_K; ci++) {
        double sk = 0;
        for (uint32_t l = 0; l < L; l++) {
            double e;
            kvs_calib_k_error_offsets(c, l, ci, &e);
            sk += e;
        }
        out->k_err_koff[ci] = sk / L;
        if (kvs_calib_k_candidates[ci] == out->k_outliers)
            ki = ci;
    }
    const double pair = (double)kvs_tile_bytes(s, KVS_TILE_K, T, D, out->k_outliers, 0) +
                        kvs_tile_bytes(s, KVS_TILE_V, T, D, out->v_outliers, 0);
    const double extra = (double)kvs_tile_bytes_ex(s, KVS_TILE_K, T, D, out->k_outliers, 0, 1) -
                         kvs_tile_bytes(s, KVS_TILE_K, T, D, out->k_outliers, 0);
    out->koff_bytes = extra / pair;
    out->koff_err_ratio = out->k_err[ki] > 0.0 ? out->k_err_koff[ki] / out->k_err[ki] : 1.0;
    out->key_offsets = 1.0 - out->koff_err_ratio > KVS_CALIB_KOFF_WORTH * out->koff_bytes;
}

int kvs_calib_suggest(const kvs_calib *c, kvs_calib_suggestion *out)
{
    if (c == NULL || out == NULL || !c->have_layout || c->samples == 0)
        return KVS_EINVAL;
    memset(out, 0, sizeof *out);
    const uint32_t L = c->lay.num_layers, T = c->o.block_tokens, D = c->lay.head_dim;
    for (int ci = 0; ci < KVS_CALIB_NUM_K; ci++) {
        double sk = 0, sv = 0;
        for (uint32_t l = 0; l < L; l++) {
            double e;
            kvs_calib_layer_error(c, l, KVS_TILE_K, ci, &e);
            sk += e;
            kvs_calib_layer_error(c, l, KVS_TILE_V, ci, &e);
            sv += e;
        }
        out->k_err[ci] = sk / L;
        out->v_err[ci] = sv / L;
    }
    /* The outlier tables may use what the budget leaves after scales and
     * headers at the reference shape (0.6 - 0.102 = 0.498 bit per element by
     * default with the fp16 scales of format v2). An outlier entry costs
     * 8 * E bits (E = 3 or 4 bytes, kvs_outlier_entry_bytes) per group, spread
     * over the K and V elements together. K errors weigh twice: attention
     * output is about twice as sensitive to a unit of relative K error as to
     * one of V (docs/QUALITY.md). */
    const double room = c->o.meta_budget - kvs_quant_meta_bits(c->o.scheme, 256, 128, 0, 0);
    const double ek = 4.0 * kvs_outlier_entry_bytes(KVS_TILE_K, T, D),
                 ev = 4.0 * kvs_outlier_entry_bytes(KVS_TILE_V, T, D);
    double best = INFINITY;
    for (int a = 0; a < KVS_CALIB_NUM_K; a++)
        for (int b = 0; b < KVS_CALIB_NUM_K; b++) {
            uint32_t kK = kvs_calib_k_candidates[a], kV = kvs_calib_k_candidates[b];
            double obits = ek * kK / T + ev * kV / D;
            double cost = KVS_CALIB_K_WEIGHT * out->k_err[a] + out->v_err[b];
            if (obits <= room + 1e-12 && cost < best)
                best = cost;
        }
    /* Among pairs within 1% of the best, the cheapest (then the fewest outliers). */
    double cheapest = INFINITY;
    for (int a = 0; a < KVS_CALIB_NUM_K; a++)
        for (int b = 0; b < KVS_CALIB_NUM_K; b++) {
            uint32_t kK = kvs_calib_k_candidates[a], kV = kvs_calib_k_candidates[b];
            double obits = ek * kK / T + ev * kV / D;
            double cost = KVS_CALIB_K_WEIGHT * out->k_err[a] + out->v_err[b];
            if (obits > room + 1e-12 || cost > best * 1.01)
                continue;
            if (obits < cheapest - 1e-12 ||
                (obits < cheapest + 1e-12 && kK + kV < out->k_outliers + out->v_outliers)) {
                cheapest = obits;
                out->k_outliers = kK;
                out->v_outliers = kV;
            }
        }
    out->budget_met = isfinite(best);
    if (!out->budget_met)
        out->k_outliers = out->v_outliers = 0;
    out->meta_bits = kvs_quant_meta_bits(c->o.scheme, T, D, out->k_outliers, out->v_outliers);
    suggest_key_offsets(c, out);
    if (c->sink_pairs > 0) {
        out->sinks_measured = 1;
        out->sinks = 1; /* the first token always: cheap, and it is where sinks sit */
        for (uint32_t t = 0; t < KVS_CALIB_SINK_WINDOW; t++) {
            uint64_t hits =
                c->sink_hits[0][t] > c->sink_hits[1][t] ? c->sink_hits[0][t] : c->sink_hits[1][t];
            out->sink_frac[t] = (double)hits / (double)c->sink_pairs;
            if (out->sink_frac[t] >= KVS_CALIB_SINK_FRAC)
                out->sinks = t + 1 > out->sinks ? t + 1 : out->sinks;
        }
    } else {
        out->sinks = c->o.sinks; /* nothing to measure: no sample starts a sequence */
    }
    if (out->sinks > T)
        out->sinks = T;
    return 0;
}

int kvs_calib_profile(const kvs_calib *c, const char *model, kvs_profile **out, char *err)
{
    if (c == NULL || out == NULL)
        return kvs_fail(err, KVS_EINVAL, "calibration: NULL argument");
    if (!c->have_layout || c->samples == 0)
        return kvs_fail(err, KVS_EINVAL, "calibration: no samples");
    kvs_profile shape;
    memset(&shape, 0, sizeof shape);
    const char *m = model ? model : c->lay.model;
    if (m[0] == '\0')
        m = "-";
    if (strlen(m) > KVS_PROFILE_MODEL_MAX)
        return kvs_fail(err, KVS_EINVAL, "model: longer than %u characters", KVS_PROFILE_MODEL_MAX);
    memcpy(shape.model, m, strlen(m) + 1);
    shape.num_layers = c->lay.num_layers;
    shape.num_kv_heads = c->lay.num_kv_heads;
    shape.head_dim = c->lay.head_dim;
    shape.block_tokens = c->o.block_tokens;
    shape.dtype = c->lay.dtype;
    shape.post_rope = (c->lay.flags & KVS_SAMPLE_F_POST_ROPE) != 0;
    shape.scheme = c->o.scheme;
    shape.k_outliers = c->o.k_outliers;
    shape.v_outliers = c->o.v_outliers;
    shape.sinks = c->o.sinks;
    shape.key_offsets = c->o.key_offsets;
    shape.percentile = c->o.percentile;
    shape.samples = c->samples;
    shape.tokens = c->tokens;
    kvs_profile *p;
    int rc = kvs_profile_create(&shape, &p, err);
    if (rc)
        return rc;
    const float qmax = c->o.scheme == KVS_SCHEME_INT8       ? KVQ_INT8_MAX
                       : c->o.scheme == KVS_SCHEME_FP8_E5M2 ? KVQ_E5M2_MAX
                                                            : KVQ_E4M3_MAX;
    const uint32_t H = p->num_kv_heads, D = p->head_dim;
    for (uint32_t l = 0; l < p->num_layers; l++) {
        float ka = 0.0f, va = 0.0f;
        for (uint32_t h = 0; h < H; h++) {
            kvs_calib_stats st;
            for (uint32_t d = 0; d < D; d++) {
                kvs_calib_k_stats(c, l, h, d, &st);
                p->k_scales[((size_t)l * H + h) * D + d] = kvq_scale_from_amax(st.kept_pct, qmax);
                if (st.amax > ka)
                    ka = st.amax;
            }
            kvs_calib_v_stats(c, l, h, &st);
            p->v_scales[(size_t)l * H + h] = kvq_scale_from_amax(st.kept_pct, qmax);
            if (st.amax > va)
                va = st.amax;
        }
        p->layers[l].k_amax = ka;
        p->layers[l].v_amax = va;
        p->layers[l].k_tensor_scale = kvq_scale_from_amax(ka, qmax);
        p->layers[l].v_tensor_scale = kvq_scale_from_amax(va, qmax);
    }
    *out = p;
    return 0;
}
