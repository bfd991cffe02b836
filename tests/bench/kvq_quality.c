/*
 * kvq_quality.c — quality of our KV quantization against the schemes engines
 * use today, measured in one run on the same data (a benchmark program, not a
 * ctest; docs/QUALITY.md holds a run and the choices made from it).
 *
 * Data: synthetic KV with the statistics the literature reports for real
 * models (fixed seeds; docs/QUALITY.md "Data"), or real KV sample files
 * (kvq_calib.h) given on the command line. Each dataset is cut into tiles of
 * T = 256 tokens the way the store cuts blocks (block 0 is the root block when
 * the data starts at sequence position 0, so only it carries sinks).
 *
 * Methods: four baselines implemented here, each in a few lines —
 *   per-tensor FP8 E4M3, one static scale amax/448 per layer tensor (vLLM's
 *   default); per-token INT8 (one fp32 scale per token and head, no
 *   outliers); llama.cpp q8_0 (blocks of 32 along D, fp16 scale, round half
 *   away from zero: 8.5 bits); KIVI-style 8-bit (asymmetric, fp16 scale and
 *   zero point, K per channel over the tile's tokens, V per token, no outliers)
 * — and ours through the reference quantizer and dequantizer
 * (kvs_tile_quantize_ref / kvs_tile_dequantize_ref), whose bits per element
 * come from the encoded tile sizes (codes, scales, outliers, sinks, tile
 * headers) plus the block header and scheme table of every block.
 *
 * Our FP8 defaults run as a calibrated deployment does: with a per-tensor
 * scale (kvs_tile_params.tensor_scale), here the same amax/448 of each layer
 * tensor that the per-tensor FP8 baseline uses, so every group scale is that
 * scale times a power of two and our FP8 grid holds the baseline's over the
 * group's range (no tile can round worse). Rows without it (what a deployment
 * without a profile gets) and with a profile's per-tensor scale (calibrated on
 * another draw) show the difference.
 *
 * Metrics (relative Frobenius norms over every layer and head): K and V
 * reconstruction, attention scores A = softmax(q K^T / sqrt(D)) and attention
 * output A V, and the mean cosine of K and V rows. The last line is exactly
 *   RESULT int8_vs_pertensor_fp8=<r> int8_vs_q8_0=<r> fp8_vs_pertensor_fp8=<r>
 * (ratios of attention-output error; ours at the defaults of kvq_calib.h,
 * fp8_e4m3 with the per-tensor scale as above).
 *
 * `kvq_quality --write-sample FILE` writes a synthetic sample file instead
 * (for tests/integration/cli_calibrate.sh and for trying `kvstash calibrate`).
 */
#include "kvq.h"
#include "kvq_calib.h"
#include "kvq_math.h"

#include "kvs_error.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TILE_T          256u
#define MAX_SINK_WINDOW 64u

static void die(const char *what)
{
    fprintf(stderr, "kvq_quality: %s\n", what);
    exit(1);
}

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (p == NULL)
        die("out of memory");
    return p;
}

/* ---- random numbers (splitmix64; Box-Muller) ------------------------------------- */

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t rnd_u64(rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static double rnd_unif(rng *r)
{
    return (double)(rnd_u64(r) >> 11) * 0x1p-53;
}

static double rnd_range(rng *r, double lo, double hi)
{
    return lo + (hi - lo) * rnd_unif(r);
}

static double rnd_norm(rng *r)
{
    double u = rnd_unif(r), v = rnd_unif(r);
    if (u < 1e-300)
        u = 1e-300;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* ---- datasets --------------------------------------------------------------------- */

typedef struct dataset {
    char name[200];
    uint32_t L, H, Hq, D, N, first_pos, nq;
    kvs_dtype dtype; /* what the values were rounded to (the "source dtype") */
    float *K, *V;    /* [L][N][H][D] */
    float *Q;        /* [L][Hq][nq][D] */
    uint32_t *qlen;  /* [nq]: keys visible to query i */
    int primary;     /* counts for the RESULT line */
    /* tiles along the sequence */
    uint32_t ntiles;
    uint32_t *t0, *tn; /* [ntiles] */
    int *root;         /* [ntiles] */
    /* reference attention */
    float *A;  /* [L][Hq][nq][N] */
    double *O; /* [L][Hq][nq][D] */
    double a_ref2, o_ref2;
    double sink_share;
} dataset;

static size_t kv_index(const dataset *ds, uint32_t l, uint32_t t, uint32_t h, uint32_t d)
{
    return (((size_t)l * ds->N + t) * ds->H + h) * ds->D + d;
}

static float round_to(kvs_dtype dt, float x)
{
    if (dt == KVS_DTYPE_FP16)
        return kvq_fp16_to_f32(kvq_f32_to_fp16(x));
    if (dt == KVS_DTYPE_BF16)
        return kvq_bf16_to_f32(kvq_f32_to_bf16(x));
    return x;
}

static void make_tiles(dataset *ds)
{
    uint32_t n = 0;
    for (uint32_t t = 0; t < ds->N;) {
        uint64_t p = (uint64_t)ds->first_pos + t;
        uint32_t len = TILE_T - (uint32_t)(p % TILE_T);
        t += len < ds->N - t ? len : ds->N - t;
        n++;
    }
    ds->ntiles = n;
    ds->t0 = xcalloc(n, sizeof *ds->t0);
    ds->tn = xcalloc(n, sizeof *ds->tn);
    ds->root = xcalloc(n, sizeof *ds->root);
    n = 0;
    for (uint32_t t = 0; t < ds->N; n++) {
        uint64_t p = (uint64_t)ds->first_pos + t;
        uint32_t len = TILE_T - (uint32_t)(p % TILE_T);
        ds->t0[n] = t;
        ds->tn[n] = len < ds->N - t ? len : ds->N - t;
        ds->root[n] = p == 0;
        t += ds->tn[n];
    }
}

/* The structure of a synthetic "model": fixed per (layer, head) by the model
 * seed, so calibration data and test data share it (as real prompts share a
 * model's outlier channels). */
typedef struct synth_head {
    double kscale[1024], kmean[1024]; /* per channel: value = gain * scale * (mean + z) */
    int massive[2];                   /* the sink's two massive dims */
    double msign[2];
    double sink_logit; /* mean attention logit of the sink */
    double kgain, vgain;
} synth_head;

typedef struct synth_opts {
    uint32_t L, H, D, N, nq, first_pos;
    uint64_t model_seed, data_seed;
    kvs_dtype dtype;
} synth_opts;

static void synth_structure(const synth_opts *so, synth_head *hd)
{
    rng r = {so->model_seed * 0x2545F4914F6CDD1DULL + 17};
    const uint32_t D = so->D, nout = D / 32 < 2 ? 2 : D / 32;
    for (uint32_t i = 0; i < so->L * so->H; i++) {
        synth_head *s = &hd[i];
        s->kgain = rnd_range(&r, 0.5, 2.0);
        s->vgain = rnd_range(&r, 0.5, 2.0);
        for (uint32_t d = 0; d < D; d++) {
            s->kscale[d] = rnd_range(&r, 0.6, 1.4);
            s->kmean[d] = 0.0;
        }
        /* A few key channels 10-20x the rest, with a bias: fixed per head. */
        for (uint32_t j = 0; j < nout; j++) {
            uint32_t d;
            do
                d = (uint32_t)(rnd_u64(&r) % D);
            while (s->kscale[d] > 2.0);
            s->kscale[d] = rnd_range(&r, 10.0, 20.0);
            s->kmean[d] = rnd_range(&r, -1.0, 1.0);
        }
        for (int j = 0; j < 2; j++) {
            uint32_t d;
            do
                d = (uint32_t)(rnd_u64(&r) % D);
            while (s->kscale[d] > 2.0 || (j == 1 && (int)d == s->massive[0]));
            s->massive[j] = (int)d;
            s->msign[j] = (rnd_u64(&r) & 1) ? 1.0 : -1.0;
        }
        s->sink_logit = rnd_range(&r, 7.0, 11.0);
    }
}

/* One query "like the keys": the same channel structure, normalised so that
 * logits over the ordinary tokens have a standard deviation of 2.5, then
 * moved along the sink's massive dims so the sink's logit is
 * sink_logit + 1.5 z (when the data holds a sink). */
static void synth_query(const synth_opts *so, const synth_head *s, const float *K, size_t kstride,
                        uint32_t nkeys, int has_sink, rng *r, float *q)
{
    const uint32_t D = so->D;
    double *tmp = xcalloc(D, sizeof *tmp);
    for (uint32_t d = 0; d < D; d++)
        tmp[d] = s->kscale[d] * (s->kmean[d] + rnd_norm(r));
    /* logit spread over ordinary keys (t >= 1) */
    double sum = 0, sum2 = 0;
    uint32_t cnt = 0;
    for (uint32_t t = has_sink ? 1 : 0; t < nkeys; t++) {
        double dot = 0;
        for (uint32_t d = 0; d < D; d++)
            dot += tmp[d] * K[t * kstride + d];
        dot /= sqrt((double)D);
        sum += dot;
        sum2 += dot * dot;
        cnt++;
    }
    double sd = cnt > 1 ? sqrt(fmax(sum2 / cnt - (sum / cnt) * (sum / cnt), 1e-30)) : 1.0;
    double c = 2.5 / sd;
    for (uint32_t d = 0; d < D; d++)
        tmp[d] *= c;
    if (has_sink) {
        double dot = 0, mass = 0;
        for (uint32_t d = 0; d < D; d++)
            dot += tmp[d] * K[d];
        dot /= sqrt((double)D);
        for (int j = 0; j < 2; j++)
            mass += fabs(K[s->massive[j]]);
        double want = s->sink_logit + 1.5 * rnd_norm(r);
        double delta = (want - dot) * sqrt((double)D) / mass;
        for (int j = 0; j < 2; j++)
            tmp[s->massive[j]] += delta * (K[s->massive[j]] > 0 ? 1.0 : -1.0);
    }
    for (uint32_t d = 0; d < D; d++)
        q[d] = (float)tmp[d];
    free(tmp);
}

static void synth_dataset(const synth_opts *so, dataset *ds, float **qtok)
{
    memset(ds, 0, sizeof *ds);
    ds->L = so->L;
    ds->H = ds->Hq = so->H;
    ds->D = so->D;
    ds->N = so->N;
    ds->first_pos = so->first_pos;
    ds->nq = so->nq;
    ds->dtype = so->dtype;
    const uint32_t L = so->L, H = so->H, D = so->D, N = so->N;
    synth_head *hd = xcalloc((size_t)L * H, sizeof *hd);
    synth_structure(so, hd);
    ds->K = xcalloc((size_t)L * N * H * D, sizeof *ds->K);
    ds->V = xcalloc((size_t)L * N * H * D, sizeof *ds->V);
    rng r = {so->data_seed * 0x9E3779B97F4A7C15ULL + 99};
    const int has_sink = so->first_pos == 0;
    for (uint32_t l = 0; l < L; l++)
        for (uint32_t t = 0; t < N; t++)
            for (uint32_t h = 0; h < H; h++) {
                const synth_head *s = &hd[l * H + h];
                for (uint32_t d = 0; d < D; d++) {
                    double k = s->kgain * s->kscale[d] * (s->kmean[d] + rnd_norm(&r));
                    ds->K[kv_index(ds, l, t, h, d)] = (float)k;
                    ds->V[kv_index(ds, l, t, h, d)] = (float)(s->vgain * rnd_norm(&r));
                }
                /* The attention sink: ~100x in two dims of token 0's key. */
                if (has_sink && t == 0)
                    for (int j = 0; j < 2; j++)
                        ds->K[kv_index(ds, l, 0, h, (uint32_t)s->massive[j])] =
                            (float)(100.0 * s->kgain * s->msign[j] * rnd_range(&r, 0.8, 1.2));
                /* Values: milder, a few per-token outliers (1-2 channels, 5-10x). */
                if (rnd_unif(&r) < 0.2) {
                    int n = 1 + (int)(rnd_u64(&r) & 1);
                    uint32_t first = D;
                    for (int j = 0; j < n; j++) {
                        uint32_t d = (uint32_t)(rnd_u64(&r) % D);
                        if (d == first)
                            d = (d + 1) % D;
                        first = d;
                        ds->V[kv_index(ds, l, t, h, d)] *= (float)rnd_range(&r, 5.0, 10.0);
                    }
                }
            }
    for (size_t i = 0; i < (size_t)L * N * H * D; i++) {
        ds->K[i] = round_to(so->dtype, ds->K[i]);
        ds->V[i] = round_to(so->dtype, ds->V[i]);
    }
    /* Queries: nq per head seeing every key, or one per token (causal) for a
     * sample file. */
    const size_t kstride = (size_t)H * D;
    if (qtok) {
        *qtok = xcalloc((size_t)L * N * H * D, sizeof **qtok);
        for (uint32_t l = 0; l < L; l++)
            for (uint32_t t = 0; t < N; t++)
                for (uint32_t h = 0; h < H; h++)
                    synth_query(so, &hd[l * H + h], ds->K + kv_index(ds, l, 0, h, 0), kstride,
                                t + 1 < 32 ? (N < 32 ? N : 32) : t + 1, has_sink, &r,
                                *qtok + kv_index(ds, l, t, h, 0));
    }
    ds->Q = xcalloc((size_t)L * H * so->nq * D, sizeof *ds->Q);
    ds->qlen = xcalloc(so->nq, sizeof *ds->qlen);
    for (uint32_t i = 0; i < so->nq; i++)
        ds->qlen[i] = N;
    for (uint32_t l = 0; l < L; l++)
        for (uint32_t h = 0; h < H; h++)
            for (uint32_t i = 0; i < so->nq; i++)
                synth_query(so, &hd[l * H + h], ds->K + kv_index(ds, l, 0, h, 0), kstride, N,
                            has_sink, &r, ds->Q + (((size_t)l * H + h) * so->nq + i) * D);
    free(hd);
    make_tiles(ds);
}

static void dataset_free(dataset *ds)
{
    free(ds->K);
    free(ds->V);
    free(ds->Q);
    free(ds->qlen);
    free(ds->t0);
    free(ds->tn);
    free(ds->root);
    free(ds->A);
    free(ds->O);
}

/* A dataset from a sample file: its K and V; its own queries (the last nq
 * tokens, causal) when it has them, else queries drawn like its keys. */
static int load_dataset(const char *path, uint32_t nq, dataset *ds)
{
    char err[KVS_ERR_LEN] = "";
    kvs_sample *s = NULL;
    int rc = kvs_sample_read(path, &s, err);
    if (rc != 0) {
        fprintf(stderr, "kvq_quality: %s\n", err);
        return rc;
    }
    memset(ds, 0, sizeof *ds);
    const kvs_sample_info *in = &s->info;
    snprintf(ds->name, sizeof ds->name, "%s (model %s, %s, keys %s)", path,
             in->model[0] ? in->model : "-", kvs_dtype_name(in->dtype),
             (in->flags & KVS_SAMPLE_F_POST_ROPE) ? "post-RoPE" : "pre-RoPE");
    ds->L = in->num_layers;
    ds->H = in->num_kv_heads;
    ds->D = in->head_dim;
    ds->N = in->tokens;
    ds->first_pos = in->first_pos;
    ds->dtype = in->dtype;
    ds->nq = nq < in->tokens ? nq : in->tokens;
    ds->primary = 1;
    const uint32_t L = ds->L, H = ds->H, D = ds->D, N = ds->N;
    ds->K = xcalloc((size_t)L * N * H * D, sizeof *ds->K);
    ds->V = xcalloc((size_t)L * N * H * D, sizeof *ds->V);
    for (uint32_t l = 0; l < L; l++)
        for (uint32_t t = 0; t < N; t++)
            for (uint32_t h = 0; h < H; h++)
                for (uint32_t d = 0; d < D; d++) {
                    ds->K[kv_index(ds, l, t, h, d)] = kvs_sample_value(s, KVS_SAMPLE_K, l, t, h, d);
                    ds->V[kv_index(ds, l, t, h, d)] = kvs_sample_value(s, KVS_SAMPLE_V, l, t, h, d);
                }
    ds->qlen = xcalloc(ds->nq, sizeof *ds->qlen);
    for (uint32_t i = 0; i < ds->nq; i++)
        ds->qlen[i] = N - ds->nq + i + 1;
    if (in->flags & KVS_SAMPLE_F_QUERIES) {
        ds->Hq = in->num_q_heads;
        ds->Q = xcalloc((size_t)L * ds->Hq * ds->nq * D, sizeof *ds->Q);
        for (uint32_t l = 0; l < L; l++)
            for (uint32_t hq = 0; hq < ds->Hq; hq++)
                for (uint32_t i = 0; i < ds->nq; i++)
                    for (uint32_t d = 0; d < D; d++)
                        ds->Q[(((size_t)l * ds->Hq + hq) * ds->nq + i) * D + d] =
                            kvs_sample_value(s, KVS_SAMPLE_Q, l, N - ds->nq + i, hq, d);
        strncat(ds->name, ", its own queries", sizeof ds->name - strlen(ds->name) - 1);
    } else {
        /* q_d = mean_d + sd_d z over the keys' channel statistics, scaled to a
         * logit spread of 2.5. */
        ds->Hq = H;
        ds->Q = xcalloc((size_t)L * H * ds->nq * D, sizeof *ds->Q);
        rng r = {12345};
        double *mu = xcalloc(D, sizeof *mu), *sd = xcalloc(D, sizeof *sd);
        for (uint32_t l = 0; l < L; l++)
            for (uint32_t h = 0; h < H; h++) {
                for (uint32_t d = 0; d < D; d++) {
                    double a = 0, b = 0;
                    for (uint32_t t = 0; t < N; t++) {
                        double x = ds->K[kv_index(ds, l, t, h, d)];
                        a += x;
                        b += x * x;
                    }
                    mu[d] = a / N;
                    sd[d] = sqrt(fmax(b / N - mu[d] * mu[d], 0.0));
                }
                for (uint32_t i = 0; i < ds->nq; i++) {
                    float *q = ds->Q + (((size_t)l * H + h) * ds->nq + i) * D;
                    for (uint32_t d = 0; d < D; d++)
                        q[d] = (float)(mu[d] + sd[d] * rnd_norm(&r));
                    double s1 = 0, s2 = 0;
                    for (uint32_t t = 0; t < ds->qlen[i]; t++) {
                        double dot = 0;
                        for (uint32_t d = 0; d < D; d++)
                            dot += (double)q[d] * ds->K[kv_index(ds, l, t, h, d)];
                        dot /= sqrt((double)D);
                        s1 += dot;
                        s2 += dot * dot;
                    }
                    double n = ds->qlen[i];
                    double spread = n > 1 ? sqrt(fmax(s2 / n - (s1 / n) * (s1 / n), 1e-30)) : 1.0;
                    for (uint32_t d = 0; d < D; d++)
                        q[d] = (float)(q[d] * 2.5 / spread);
                }
            }
        free(mu);
        free(sd);
        strncat(ds->name, ", queries drawn like its keys", sizeof ds->name - strlen(ds->name) - 1);
    }
    kvs_sample_free(s);
    make_tiles(ds);
    return 0;
}

/* ---- attention -------------------------------------------------------------------- */

/* A[nq][N] and O[nq][D] of query head hq of layer l over keys K and values V. */
static void attend(const dataset *ds, const float *K, const float *V, uint32_t l, uint32_t hq,
                   float *A, double *O, double *scratch)
{
    const uint32_t D = ds->D, N = ds->N, h = hq / (ds->Hq / ds->H);
    const double inv = 1.0 / sqrt((double)D);
    for (uint32_t i = 0; i < ds->nq; i++) {
        const float *q = ds->Q + (((size_t)l * ds->Hq + hq) * ds->nq + i) * D;
        const uint32_t n = ds->qlen[i];
        double m = -INFINITY;
        for (uint32_t t = 0; t < n; t++) {
            const float *k = K + kv_index(ds, l, t, h, 0);
            double dot = 0;
            for (uint32_t d = 0; d < D; d++)
                dot += (double)q[d] * k[d];
            scratch[t] = dot * inv;
            if (scratch[t] > m)
                m = scratch[t];
        }
        double z = 0;
        for (uint32_t t = 0; t < n; t++) {
            scratch[t] = exp(scratch[t] - m);
            z += scratch[t];
        }
        double *o = O + (size_t)i * D;
        for (uint32_t d = 0; d < D; d++)
            o[d] = 0;
        float *a = A + (size_t)i * N;
        for (uint32_t t = 0; t < N; t++)
            a[t] = 0.0f;
        for (uint32_t t = 0; t < n; t++) {
            double w = scratch[t] / z;
            a[t] = (float)w;
            const float *v = V + kv_index(ds, l, t, h, 0);
            for (uint32_t d = 0; d < D; d++)
                o[d] += w * v[d];
        }
    }
}

static void prepare_reference(dataset *ds)
{
    const size_t per = (size_t)ds->nq;
    ds->A = xcalloc((size_t)ds->L * ds->Hq * per * ds->N, sizeof *ds->A);
    ds->O = xcalloc((size_t)ds->L * ds->Hq * per * ds->D, sizeof *ds->O);
    double *scratch = xcalloc(ds->N, sizeof *scratch);
    double share = 0;
    for (uint32_t l = 0; l < ds->L; l++)
        for (uint32_t hq = 0; hq < ds->Hq; hq++) {
            float *A = ds->A + ((size_t)l * ds->Hq + hq) * per * ds->N;
            double *O = ds->O + ((size_t)l * ds->Hq + hq) * per * ds->D;
            attend(ds, ds->K, ds->V, l, hq, A, O, scratch);
            for (size_t i = 0; i < per * ds->N; i++)
                ds->a_ref2 += (double)A[i] * A[i];
            for (size_t i = 0; i < per * ds->D; i++)
                ds->o_ref2 += O[i] * O[i];
            for (size_t i = 0; i < per; i++)
                share += A[i * ds->N];
        }
    ds->sink_share = share / ((double)ds->L * ds->Hq * per);
    free(scratch);
}

/* ---- methods ---------------------------------------------------------------------- */

typedef enum mkind { M_PT_FP8, M_PTOK_INT8, M_Q8_0, M_KIVI8, M_OURS } mkind;

typedef struct method {
    char name[64];
    mkind kind;
    kvs_scheme scheme;
    uint32_t kK, kV, S;
    const kvs_profile *prof; /* static scales, or NULL */
    /* kvs_tile_params.tensor_scale (used by the FP8 schemes): 0 none; 1 the
     * data's own, amax / qmax of each layer tensor (the per-tensor FP8
     * baseline's scale); 2 tprof's, through kvs_profile_tile_params (which
     * then sets scheme, k and S too: the profile's). */
    int tensor;
    const kvs_profile *tprof;
    int koff; /* K tiles with per-channel key offsets (kvs_tile_params.key_offsets) */
} method;

/* Per-tensor FP8 E4M3: one scale per layer tensor, amax / 448; or, with a
 * profile, the profile's k_tensor_scale / v_tensor_scale (values beyond it
 * saturate), as an engine calibrated from that profile would run. */
static double run_pt_fp8(const dataset *ds, const kvs_profile *prof, int is_k, const float *X,
                         float *Y)
{
    const size_t per = (size_t)ds->N * ds->H * ds->D;
    for (uint32_t l = 0; l < ds->L; l++) {
        const float *x = X + l * per;
        float amax = 0;
        for (size_t i = 0; i < per; i++)
            amax = kvq_amax_update(amax, x[i]);
        float scale = kvq_scale_from_amax(amax, KVQ_E4M3_MAX);
        if (prof)
            scale = is_k ? prof->layers[l].k_tensor_scale : prof->layers[l].v_tensor_scale;
        float inv = kvq_scale_inv(scale);
        for (size_t i = 0; i < per; i++)
            Y[l * per + i] =
                kvq_fp8_dequantize(kvq_fp8_quantize(x[i], inv, KVQ_FP8_E4M3), scale, KVQ_FP8_E4M3);
    }
    return (double)ds->L * per + 4.0 * ds->L;
}

/* Per-token INT8: one fp32 scale per (token, head) row of D. */
static double run_ptok_int8(const dataset *ds, const float *X, float *Y)
{
    const size_t rows = (size_t)ds->L * ds->N * ds->H, D = ds->D;
    for (size_t r = 0; r < rows; r++) {
        const float *x = X + r * D;
        float amax = 0;
        for (size_t d = 0; d < D; d++)
            amax = kvq_amax_update(amax, x[d]);
        float scale = kvq_scale_from_amax(amax, KVQ_INT8_MAX), inv = kvq_scale_inv(scale);
        for (size_t d = 0; d < D; d++)
            Y[r * D + d] = kvq_int8_dequantize(kvq_int8_quantize(x[d], inv), scale);
    }
    return (double)rows * (D + 4);
}

/* llama.cpp q8_0 (ggml-quants.c quantize_row_q8_0_ref): blocks of 32 along
 * D, d = amax/127 stored as fp16, q = roundf(x / d), x' = q * fp16(d). A
 * short last block (D not a multiple of 32) is quantized the same way. */
static double run_q8_0(const dataset *ds, const float *X, float *Y)
{
    const size_t rows = (size_t)ds->L * ds->N * ds->H, D = ds->D;
    double bytes = 0;
    for (size_t r = 0; r < rows; r++)
        for (size_t b = 0; b < D; b += 32) {
            size_t n = D - b < 32 ? D - b : 32;
            const float *x = X + r * D + b;
            float amax = 0;
            for (size_t j = 0; j < n; j++)
                amax = fmaxf(amax, fabsf(x[j]));
            float dd = amax / 127.0f, id = dd != 0.0f ? 1.0f / dd : 0.0f;
            float d16 = kvq_fp16_to_f32(kvq_f32_to_fp16(dd));
            for (size_t j = 0; j < n; j++)
                Y[r * D + b + j] = roundf(x[j] * id) * d16;
            bytes += (double)n + 2;
        }
    return bytes;
}

/* KIVI-style asymmetric 8-bit: q = round((x - min) / s), s = (max - min)/255,
 * min and s stored as fp16; K groups = channel over a tile's tokens, V groups
 * = token row. */
static void kivi_group(const float *x, size_t n, size_t step, float *y)
{
    float mn = INFINITY, mx = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        mn = fminf(mn, x[i * step]);
        mx = fmaxf(mx, x[i * step]);
    }
    float s = kvq_fp16_to_f32(kvq_f32_to_fp16((mx - mn) / 255.0f));
    float z = kvq_fp16_to_f32(kvq_f32_to_fp16(mn));
    for (size_t i = 0; i < n; i++) {
        float q = s > 0.0f ? rintf((x[i * step] - z) / s) : 0.0f;
        q = fminf(fmaxf(q, 0.0f), 255.0f);
        y[i * step] = q * s + z;
    }
}

static double run_kivi8(const dataset *ds, const float *X, float *Y, int is_k)
{
    const uint32_t H = ds->H, D = ds->D;
    double bytes = 0;
    if (is_k) {
        for (uint32_t l = 0; l < ds->L; l++)
            for (uint32_t b = 0; b < ds->ntiles; b++)
                for (uint32_t h = 0; h < H; h++)
                    for (uint32_t d = 0; d < D; d++) {
                        size_t i = kv_index(ds, l, ds->t0[b], h, d);
                        kivi_group(X + i, ds->tn[b], (size_t)H * D, Y + i);
                        bytes += ds->tn[b] + 4.0;
                    }
    } else {
        const size_t rows = (size_t)ds->L * ds->N * H;
        for (size_t r = 0; r < rows; r++) {
            kivi_group(X + r * D, D, 1, Y + r * D);
            bytes += D + 4.0;
        }
    }
    return bytes;
}

/* Ours: every tile through the reference quantizer and back. */
static double run_ours(const dataset *ds, const method *m, const float *X, float *Y,
                       kvs_tile_kind kind)
{
    const uint32_t H = ds->H, D = ds->D;
    const size_t stride = (size_t)H * D;
    double bytes = 0;
    size_t cap = 0;
    unsigned char *buf = NULL;
    float *vs = xcalloc(TILE_T > D ? TILE_T : D, sizeof *vs);
    const size_t per = (size_t)ds->N * H * D;
    char err[KVS_ERR_LEN] = "";
    for (uint32_t l = 0; l < ds->L; l++) {
        float st = 0.0f; /* the data's per-tensor scale for this layer */
        if (m->tensor == 1) {
            float amax = 0.0f;
            for (size_t i = 0; i < per; i++)
                amax = kvq_amax_update(amax, X[l * per + i]);
            st = kvq_scale_from_amax(amax, m->scheme == KVS_SCHEME_INT8       ? KVQ_INT8_MAX
                                           : m->scheme == KVS_SCHEME_FP8_E5M2 ? KVQ_E5M2_MAX
                                                                              : KVQ_E4M3_MAX);
        }
        for (uint32_t b = 0; b < ds->ntiles; b++)
            for (uint32_t h = 0; h < H; h++) {
                kvs_tile_params p;
                memset(&p, 0, sizeof p);
                p.scheme = m->scheme;
                p.kind = kind;
                p.tokens = ds->tn[b];
                p.dim = D;
                if (m->scheme != KVS_SCHEME_FP16) {
                    p.outliers = kind == KVS_TILE_K ? m->kK : m->kV;
                    p.sinks = ds->root[b] ? (m->S < ds->tn[b] ? m->S : ds->tn[b]) : 0;
                }
                p.tensor_scale = st;
                p.key_offsets = m->koff && kind == KVS_TILE_K && m->scheme != KVS_SCHEME_FP16;
                if (m->tensor == 2 && /* the profile's key_offsets too */
                    kvs_profile_tile_params(m->tprof, l, kind, ds->tn[b], ds->root[b], &p) != 0)
                    die("kvs_profile_tile_params failed");
                if (m->prof) {
                    if (kind == KVS_TILE_K) {
                        p.static_scales = kvs_profile_k_scales(m->prof, l, h);
                    } else {
                        kvs_profile_v_scales_fill(m->prof, l, h, ds->tn[b], vs);
                        p.static_scales = vs;
                    }
                }
                const size_t off = kv_index(ds, l, ds->t0[b], h, 0);
                size_t size = kvs_tile_size(&p);
                if (size > cap) {
                    free(buf);
                    cap = size;
                    buf = xcalloc(cap, 1);
                }
                if (kvs_tile_quantize_ref(&p, X + off, KVS_DTYPE_FP32, stride, buf, cap, err) !=
                        0 ||
                    kvs_tile_dequantize_ref(buf, size, KVS_DTYPE_FP32, Y + off, stride, err) != 0)
                    die(err);
                bytes += (double)size;
            }
    }
    free(buf);
    free(vs);
    return bytes;
}

/* Encoded bytes of K + V; fills K2, V2. */
static double run_method(const dataset *ds, const method *m, float *K2, float *V2)
{
    switch (m->kind) {
    case M_PT_FP8:
        return run_pt_fp8(ds, m->tprof, 1, ds->K, K2) + run_pt_fp8(ds, m->tprof, 0, ds->V, V2);
    case M_PTOK_INT8:
        return run_ptok_int8(ds, ds->K, K2) + run_ptok_int8(ds, ds->V, V2);
    case M_Q8_0:
        return run_q8_0(ds, ds->K, K2) + run_q8_0(ds, ds->V, V2);
    case M_KIVI8:
        return run_kivi8(ds, ds->K, K2, 1) + run_kivi8(ds, ds->V, V2, 0);
    case M_OURS: {
        /* Block headers and scheme tables, one per block of the sequence. */
        double blocks = ds->ntiles * (double)(sizeof(kvs_block_hdr) + kvs_align16(ds->L));
        return run_ours(ds, m, ds->K, K2, KVS_TILE_K) + run_ours(ds, m, ds->V, V2, KVS_TILE_V) +
               blocks;
    }
    }
    return 0;
}

/* ---- metrics ---------------------------------------------------------------------- */

typedef struct result {
    double bits;
    double k_e2, k_r2, v_e2, v_r2, a_e2, o_e2;
    double k_cos, v_cos;
    double *tile_e2; /* [L][ntiles][H][2]: K, V squared error per tile */
    double *tile_r2;
    double *head_o_e2, *head_o_r2; /* [L][Hq] */
} result;

static double rel(double e2, double r2)
{
    return r2 > 0 ? sqrt(e2 / r2) : 0.0;
}

static void result_free(result *r)
{
    free(r->tile_e2);
    free(r->tile_r2);
    free(r->head_o_e2);
    free(r->head_o_r2);
}

static void evaluate(const dataset *ds, const method *m, result *r)
{
    const uint32_t L = ds->L, H = ds->H, D = ds->D, N = ds->N;
    const size_t n = (size_t)L * N * H * D;
    float *K2 = xcalloc(n, sizeof *K2), *V2 = xcalloc(n, sizeof *V2);
    memset(r, 0, sizeof *r);
    r->bits = 8.0 * run_method(ds, m, K2, V2) / (2.0 * (double)n);
    r->tile_e2 = xcalloc((size_t)L * ds->ntiles * H * 2, sizeof *r->tile_e2);
    r->tile_r2 = xcalloc((size_t)L * ds->ntiles * H * 2, sizeof *r->tile_r2);
    double cos_k = 0, cos_v = 0;
    size_t rows_k = 0, rows_v = 0;
    for (uint32_t l = 0; l < L; l++)
        for (uint32_t b = 0; b < ds->ntiles; b++)
            for (uint32_t t = ds->t0[b]; t < ds->t0[b] + ds->tn[b]; t++)
                for (uint32_t h = 0; h < H; h++)
                    for (int kv = 0; kv < 2; kv++) {
                        const float *x = (kv ? ds->V : ds->K) + kv_index(ds, l, t, h, 0);
                        const float *y = (kv ? V2 : K2) + kv_index(ds, l, t, h, 0);
                        double e2 = 0, r2 = 0, yy = 0, xy = 0;
                        for (uint32_t d = 0; d < D; d++) {
                            double dx = (double)x[d] - y[d];
                            e2 += dx * dx;
                            r2 += (double)x[d] * x[d];
                            yy += (double)y[d] * y[d];
                            xy += (double)x[d] * y[d];
                        }
                        size_t ti = (((size_t)l * ds->ntiles + b) * H + h) * 2 + (size_t)kv;
                        r->tile_e2[ti] += e2;
                        r->tile_r2[ti] += r2;
                        if (kv) {
                            r->v_e2 += e2;
                            r->v_r2 += r2;
                        } else {
                            r->k_e2 += e2;
                            r->k_r2 += r2;
                        }
                        if (r2 > 0 && yy > 0) {
                            double c = xy / sqrt(r2 * yy);
                            if (kv) {
                                cos_v += c;
                                rows_v++;
                            } else {
                                cos_k += c;
                                rows_k++;
                            }
                        }
                    }
    r->k_cos = rows_k ? cos_k / rows_k : 1.0;
    r->v_cos = rows_v ? cos_v / rows_v : 1.0;
    /* attention */
    const size_t per = ds->nq;
    float *A = xcalloc(per * N, sizeof *A);
    double *O = xcalloc(per * D, sizeof *O), *scratch = xcalloc(N, sizeof *scratch);
    r->head_o_e2 = xcalloc((size_t)L * ds->Hq, sizeof *r->head_o_e2);
    r->head_o_r2 = xcalloc((size_t)L * ds->Hq, sizeof *r->head_o_r2);
    for (uint32_t l = 0; l < L; l++)
        for (uint32_t hq = 0; hq < ds->Hq; hq++) {
            attend(ds, K2, V2, l, hq, A, O, scratch);
            const float *Ar = ds->A + ((size_t)l * ds->Hq + hq) * per * N;
            const double *Or = ds->O + ((size_t)l * ds->Hq + hq) * per * D;
            for (size_t i = 0; i < per * N; i++) {
                double d = (double)A[i] - Ar[i];
                r->a_e2 += d * d;
            }
            double oe = 0, orr = 0;
            for (size_t i = 0; i < per * D; i++) {
                double d = O[i] - Or[i];
                oe += d * d;
                orr += Or[i] * Or[i];
            }
            r->o_e2 += oe;
            r->head_o_e2[l * ds->Hq + hq] = oe;
            r->head_o_r2[l * ds->Hq + hq] = orr;
        }
    free(A);
    free(O);
    free(scratch);
    free(K2);
    free(V2);
}

/* ---- the report ------------------------------------------------------------------- */

static void print_header(void)
{
    printf("%-34s %7s %6s %10s %10s %10s %10s %10s %10s %6s\n", "method", "bits/el", "meta*",
           "K err", "V err", "A err", "AV err", "1-cos K", "1-cos V", "tile/");
}

static double worst_tile(const dataset *ds, const result *a, const result *b, int kind,
                         uint32_t *wl, uint32_t *wb, uint32_t *wh);

/* meta*: metadata bits at the reference shape T = 256, D = 128, for the
 * budget check (our schemes only). tile/: the worst ratio, over K and V
 * tiles, of this method's reconstruction error to per-tensor FP8's. */
static void print_row(const dataset *ds, const method *m, const result *r, const result *pt)
{
    uint32_t a, b, c;
    double wt =
        pt ? fmax(worst_tile(ds, r, pt, 0, &a, &b, &c), worst_tile(ds, r, pt, 1, &a, &b, &c)) : 0.0;
    char meta[16] = "";
    if (m->kind == M_OURS && m->scheme != KVS_SCHEME_FP16) {
        double mb = kvs_quant_meta_bits(m->scheme, 256, 128, m->kK, m->kV);
        if (m->koff) /* D fp16 offsets per K tile */
            mb += 8.0 *
                  (kvs_tile_bytes_ex(m->scheme, KVS_TILE_K, 256, 128, m->kK, 0, 1) -
                   kvs_tile_bytes(m->scheme, KVS_TILE_K, 256, 128, m->kK, 0)) /
                  (2.0 * 256 * 128);
        snprintf(meta, sizeof meta, "%.3f%s", mb,
                 mb > KVS_QUANT_META_BUDGET_BITS + 1e-9 ? "!" : "");
    }
    printf("%-34s %7.3f %6s %10.3e %10.3e %10.3e %10.3e %10.3e %10.3e %6.3f\n", m->name, r->bits,
           meta, rel(r->k_e2, r->k_r2), rel(r->v_e2, r->v_r2), rel(r->a_e2, ds->a_ref2),
           rel(r->o_e2, ds->o_ref2), 1.0 - r->k_cos, 1.0 - r->v_cos, wt);
}

static method mk(const char *name, mkind kind, kvs_scheme s, uint32_t kK, uint32_t kV, uint32_t S)
{
    method m;
    memset(&m, 0, sizeof m);
    snprintf(m.name, sizeof m.name, "%s", name);
    m.kind = kind;
    m.scheme = s;
    m.kK = kK;
    m.kV = kV;
    m.S = S;
    return m;
}

static method ours(kvs_scheme s, uint32_t kK, uint32_t kV, uint32_t S)
{
    char name[64];
    if (s == KVS_SCHEME_FP16)
        snprintf(name, sizeof name, "ours fp16");
    else if (kK == kV)
        snprintf(name, sizeof name, "ours %s k=%u S=%u", kvs_scheme_name(s), kK, S);
    else
        snprintf(name, sizeof name, "ours %s kK=%u kV=%u S=%u", kvs_scheme_name(s), kK, kV, S);
    return mk(name, M_OURS, s, kK, kV, S);
}

/* Worst tile ratio of a to b (relative reconstruction error); kind 0 K, 1 V. */
static double worst_tile(const dataset *ds, const result *a, const result *b, int kind,
                         uint32_t *wl, uint32_t *wb, uint32_t *wh)
{
    double worst = 0;
    for (uint32_t l = 0; l < ds->L; l++)
        for (uint32_t t = 0; t < ds->ntiles; t++)
            for (uint32_t h = 0; h < ds->H; h++) {
                size_t i = (((size_t)l * ds->ntiles + t) * ds->H + h) * 2 + (size_t)kind;
                if (b->tile_e2[i] <= 0)
                    continue;
                double q = sqrt(a->tile_e2[i] / b->tile_e2[i]);
                if (q > worst) {
                    worst = q;
                    *wl = l;
                    *wb = t;
                    *wh = h;
                }
            }
    return worst;
}

static double worst_head(const dataset *ds, const result *a, const result *b)
{
    double worst = 0;
    for (size_t i = 0; i < (size_t)ds->L * ds->Hq; i++)
        if (b->head_o_e2[i] > 0)
            worst = fmax(worst, sqrt(a->head_o_e2[i] / b->head_o_e2[i]));
    return worst;
}

typedef struct totals {
    double int8_o2, fp8_o2, pt_o2, q8_o2, ref2;
    double int8_bits, fp8_bits;
    int n;
} totals;

typedef struct run_opts {
    int grid;   /* print the kK x kV grid */
    int npairs; /* --pairs: extra (kK, kV) rows at the default scheme and S */
    uint32_t pairs[16][2];
} run_opts;

static int profile_fits(const kvs_profile *p, const dataset *ds)
{
    return p->num_layers == ds->L && p->num_kv_heads == ds->H && p->head_dim == ds->D &&
           p->block_tokens == TILE_T;
}

static void run_dataset(dataset *ds, const run_opts *ro, const kvs_profile *const *statics,
                        int nstatic, totals *tot)
{
    prepare_reference(ds);
    printf("\n== %s ==\n", ds->name);
    printf("%u layers x %u kv heads (%u query heads) x D=%u, %u tokens from position %u = %u "
           "tile(s) of <= %u (%s), %u queries per head",
           ds->L, ds->H, ds->Hq, ds->D, ds->N, ds->first_pos, ds->ntiles, TILE_T,
           ds->root[0] ? "tile 0 is a root block" : "no root block", ds->nq);
    if (ds->first_pos == 0)
        printf("; attention on token 0: %.3f (mean)", ds->sink_share);
    printf("\n");
    print_header();

    const kvs_scheme defs = KVS_QUANT_DEFAULT_SCHEME;
    const uint32_t dK = KVS_QUANT_DEFAULT_K_OUTLIERS, dV = KVS_QUANT_DEFAULT_V_OUTLIERS,
                   dS = KVS_QUANT_DEFAULT_SINKS;
    method base[4] = {
        mk("per-tensor fp8_e4m3 (vLLM)", M_PT_FP8, KVS_SCHEME_FP8_E4M3, 0, 0, 0),
        mk("per-token int8", M_PTOK_INT8, KVS_SCHEME_INT8, 0, 0, 0),
        mk("q8_0 (llama.cpp, 32/fp16)", M_Q8_0, KVS_SCHEME_INT8, 0, 0, 0),
        mk("KIVI-8 (asym, K/chan V/tok)", M_KIVI8, KVS_SCHEME_INT8, 0, 0, 0),
    };
    result rb[4];
    for (int i = 0; i < 4; i++) {
        evaluate(ds, &base[i], &rb[i]);
        print_row(ds, &base[i], &rb[i], i ? &rb[0] : NULL);
    }
    {
        method m = ours(KVS_SCHEME_FP16, 0, 0, 0);
        result r;
        evaluate(ds, &m, &r);
        print_row(ds, &m, &r, &rb[0]);
        result_free(&r);
    }
    const kvs_scheme schemes[3] = {KVS_SCHEME_FP8_E4M3, KVS_SCHEME_FP8_E5M2, KVS_SCHEME_INT8};
    const uint32_t ks[4] = {0, 1, 2, 4}, ss[3] = {0, 1, 4};
    for (int si = 0; si < 3; si++)
        for (int ki = 0; ki < 4; ki++)
            for (int sj = 0; sj < 3; sj++) {
                method m = ours(schemes[si], ks[ki], ks[ki], ss[sj]);
                result r;
                evaluate(ds, &m, &r);
                print_row(ds, &m, &r, &rb[0]);
                result_free(&r);
            }
    if (ro->grid) {
        printf("-- kK x kV at %s, S=%u (meta* marked ! is over the %.1f-bit budget) --\n",
               kvs_scheme_name(defs), dS, KVS_QUANT_META_BUDGET_BITS);
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < 4; b++) {
                if (a == b)
                    continue;
                method m = ours(defs, ks[a], ks[b], dS);
                result r;
                evaluate(ds, &m, &r);
                print_row(ds, &m, &r, &rb[0]);
                result_free(&r);
            }
    }
    if (ro->npairs) {
        printf("-- --pairs at %s, S=%u --\n", kvs_scheme_name(defs), dS);
        for (int i = 0; i < ro->npairs; i++) {
            method m = ours(defs, ro->pairs[i][0], ro->pairs[i][1], dS);
            result r;
            evaluate(ds, &m, &r);
            print_row(ds, &m, &r, &rb[0]);
            printf("  pair %u/%u: AV error / q8_0 = %.3f, / per-tensor fp8 = %.3f\n",
                   ro->pairs[i][0], ro->pairs[i][1],
                   rel(r.o_e2, ds->o_ref2) / rel(rb[2].o_e2, ds->o_ref2),
                   rel(r.o_e2, ds->o_ref2) / rel(rb[0].o_e2, ds->o_ref2));
            result_free(&r);
        }
    }
    /* Static scales from a calibration profile. */
    for (int i = 0; i < nstatic; i++) {
        const kvs_profile *p = statics[i];
        if (!profile_fits(p, ds)) {
            printf("(profile %s: layout %ux%ux%u T=%u does not fit this dataset; skipped)\n",
                   p->model, p->num_layers, p->num_kv_heads, p->head_dim, p->block_tokens);
            continue;
        }
        method m = ours(p->scheme, p->k_outliers, p->v_outliers, p->sinks);
        snprintf(m.name, sizeof m.name, "static %s k=%u/%u S=%u p%g%s", kvs_scheme_name(p->scheme),
                 p->k_outliers, p->v_outliers, p->sinks, p->percentile,
                 p->key_offsets ? " +koff" : "");
        m.prof = p;
        m.koff = (int)p->key_offsets;
        result r;
        evaluate(ds, &m, &r);
        print_row(ds, &m, &r, &rb[0]);
        result_free(&r);
    }

    /* The defaults against the targets. fp8_e4m3 with the per-tensor scale
     * (the baseline's: a deployment gets it from its profile), and without. */
    method mi = ours(KVS_SCHEME_INT8, dK, dV, dS), mf = ours(KVS_SCHEME_FP8_E4M3, dK, dV, dS);
    method md = mf;
    snprintf(mi.name, sizeof mi.name, "DEFAULT int8 kK=%u kV=%u S=%u", dK, dV, dS);
    snprintf(mf.name, sizeof mf.name, "DEFAULT fp8_e4m3 %u/%u S=%u +pt scale", dK, dV, dS);
    mf.tensor = 1;
    snprintf(md.name, sizeof md.name, "fp8_e4m3 %u/%u S=%u, no pt scale", dK, dV, dS);
    result ri, rf, ra;
    evaluate(ds, &mi, &ri);
    print_row(ds, &mi, &ri, &rb[0]);
    evaluate(ds, &mf, &rf);
    print_row(ds, &mf, &rf, &rb[0]);
    evaluate(ds, &md, &ra);
    print_row(ds, &md, &ra, &rb[0]);
    /* The same three with per-channel key offsets (kv_format.h rule 5): not
     * in the RESULT line, which stays the defaults'. */
    {
        method ko[3] = {mi, mf, md};
        snprintf(ko[0].name, sizeof ko[0].name, "int8 %u/%u S=%u + key offsets", dK, dV, dS);
        snprintf(ko[1].name, sizeof ko[1].name, "fp8_e4m3 %u/%u S=%u +pt + key offsets", dK, dV,
                 dS);
        snprintf(ko[2].name, sizeof ko[2].name, "fp8_e4m3 %u/%u S=%u no pt + key offs", dK, dV, dS);
        for (int i = 0; i < 3; i++) {
            result r;
            ko[i].koff = 1;
            evaluate(ds, &ko[i], &r);
            print_row(ds, &ko[i], &r, &rb[0]);
            result_free(&r);
        }
    }
    /* With the per-tensor scale of the first fitting fp8_e4m3 profile: the
     * scale of another draw, as a deployment calibrates it. */
    const kvs_profile *fp = NULL;
    for (int i = 0; i < nstatic && fp == NULL; i++)
        if (statics[i]->scheme == KVS_SCHEME_FP8_E4M3 && profile_fits(statics[i], ds))
            fp = statics[i];
    result rp, rpb;
    memset(&rp, 0, sizeof rp);
    memset(&rpb, 0, sizeof rpb);
    if (fp) {
        /* Its baseline: per-tensor FP8 with the same (profile) scale. */
        method mb =
            mk("per-tensor fp8_e4m3, profile scale", M_PT_FP8, KVS_SCHEME_FP8_E4M3, 0, 0, 0);
        mb.tprof = fp;
        evaluate(ds, &mb, &rpb);
        print_row(ds, &mb, &rpb, &rb[0]);
        method mp = ours(fp->scheme, fp->k_outliers, fp->v_outliers, fp->sinks);
        snprintf(mp.name, sizeof mp.name, "fp8_e4m3 %u/%u S=%u +profile pt p%g%s", fp->k_outliers,
                 fp->v_outliers, fp->sinks, fp->percentile, fp->key_offsets ? " +koff" : "");
        mp.tensor = 2;
        mp.tprof = fp;
        mp.koff = (int)fp->key_offsets; /* for meta*: kvs_profile_tile_params sets it */
        evaluate(ds, &mp, &rp);
        print_row(ds, &mp, &rp, &rb[0]);
    }

    const double oi = rel(ri.o_e2, ds->o_ref2), of = rel(rf.o_e2, ds->o_ref2);
    const double opt = rel(rb[0].o_e2, ds->o_ref2), oq = rel(rb[2].o_e2, ds->o_ref2);
    printf("targets (attention-output error ratios; lower is better):\n");
    printf("  int8 default / per-tensor fp8 = %.3f (target <= 0.25)\n", oi / opt);
    printf("  int8 default / q8_0           = %.3f (target <= 0.5)\n", oi / oq);
    printf("  int8 default bits/el          = %.3f (target <= 8.5: at most 0.5 extra bit)\n",
           ri.bits);
    printf("  fp8_e4m3 default (per-tensor scale set) / per-tensor fp8 = %.3f (target <= 0.7)\n",
           of / opt);
    uint32_t wl = 0, wb = 0, wh = 0;
    double wk = worst_tile(ds, &rf, &rb[0], 0, &wl, &wb, &wh);
    printf("  worst tile, fp8_e4m3 default / per-tensor fp8: K %.3f (layer %u tile %u head %u)", wk,
           wl, wb, wh);
    double wv = worst_tile(ds, &rf, &rb[0], 1, &wl, &wb, &wh);
    printf(", V %.3f (layer %u tile %u head %u) (target <= 1)\n", wv, wl, wb, wh);
    printf("  worst head (attention output), fp8_e4m3 default / per-tensor fp8: %.3f; int8 "
           "default / per-tensor fp8: %.3f\n",
           worst_head(ds, &rf, &rb[0]), worst_head(ds, &ri, &rb[0]));
    wk = worst_tile(ds, &ra, &rb[0], 0, &wl, &wb, &wh);
    wv = worst_tile(ds, &ra, &rb[0], 1, &wl, &wb, &wh);
    printf("  without a per-tensor scale (no profile): fp8 / per-tensor fp8 = %.3f, worst tile K "
           "%.3f V %.3f\n",
           rel(ra.o_e2, ds->o_ref2) / opt, wk, wv);
    if (fp) {
        /* Against per-tensor FP8 with the same scale, the comparison the
         * alignment is about, and against the data's own amax / 448. */
        wk = worst_tile(ds, &rp, &rpb, 0, &wl, &wb, &wh);
        wv = worst_tile(ds, &rp, &rpb, 1, &wl, &wb, &wh);
        printf("  with the profile's per-tensor scale (p%g, another draw): fp8 / per-tensor fp8 "
               "with that scale = %.3f, worst tile K %.3f V %.3f;",
               fp->percentile, rel(rp.o_e2, ds->o_ref2) / rel(rpb.o_e2, ds->o_ref2), wk, wv);
        wk = worst_tile(ds, &rp, &rb[0], 0, &wl, &wb, &wh);
        wv = worst_tile(ds, &rp, &rb[0], 1, &wl, &wb, &wh);
        printf(" / per-tensor fp8 (amax/448 of the data) = %.3f, worst tile K %.3f V %.3f\n",
               rel(rp.o_e2, ds->o_ref2) / opt, wk, wv);
        result_free(&rp);
        result_free(&rpb);
    }
    result_free(&ra);
    if (ds->primary) {
        tot->int8_o2 += ri.o_e2;
        tot->fp8_o2 += rf.o_e2;
        tot->pt_o2 += rb[0].o_e2;
        tot->q8_o2 += rb[2].o_e2;
        tot->ref2 += ds->o_ref2;
        tot->n++;
    }
    result_free(&ri);
    result_free(&rf);
    for (int i = 0; i < 4; i++)
        result_free(&rb[i]);
}

/* A profile calibrated on an independent draw of the same synthetic model. */
static kvs_profile *calibrate_synthetic(const synth_opts *so, kvs_scheme s, double pct)
{
    synth_opts c = *so;
    c.data_seed = so->data_seed + 1000;
    c.N = 4 * so->N; /* calibrate on more tokens than the test holds */
    dataset cal;
    synth_dataset(&c, &cal, NULL);
    kvs_sample_info in;
    memset(&in, 0, sizeof in);
    in.num_layers = cal.L;
    in.num_kv_heads = cal.H;
    in.head_dim = cal.D;
    in.tokens = cal.N;
    in.first_pos = cal.first_pos;
    in.dtype = KVS_DTYPE_FP32;
    snprintf(in.model, sizeof in.model, "kvq-synthetic-%llu", (unsigned long long)so->model_seed);
    kvs_sample *smp = NULL;
    char err[KVS_ERR_LEN] = "";
    if (kvs_sample_create(&in, &smp, err) != 0)
        die(err);
    for (uint32_t l = 0; l < cal.L; l++) {
        size_t per = (size_t)cal.N * cal.H * cal.D;
        memcpy(kvs_sample_part_ptr(smp, KVS_SAMPLE_K, l), cal.K + l * per, per * sizeof(float));
        memcpy(kvs_sample_part_ptr(smp, KVS_SAMPLE_V, l), cal.V + l * per, per * sizeof(float));
    }
    kvs_calib_opts o;
    kvs_calib_opts_default(&o);
    o.scheme = s;
    o.percentile = pct;
    kvs_calib *cb = NULL;
    kvs_profile *p = NULL;
    if (kvs_calib_create(&o, &cb, err) != 0 || kvs_calib_add(cb, smp, err) != 0 ||
        kvs_calib_profile(cb, NULL, &p, err) != 0)
        die(err);
    kvs_calib_free(cb);
    kvs_sample_free(smp);
    dataset_free(&cal);
    return p;
}

/* ---- command line ----------------------------------------------------------------- */

static void usage(void)
{
    printf("usage: kvq_quality [--dim D] [--layers L] [--heads H] [--blocks B] [--queries N]\n"
           "                   [--seed S] [--data-seed S] [--no-grid] [--pairs kK/kV,...]\n"
           "                   [--profile PROFILE]\n"
           "                   [SAMPLE_FILE...]\n"
           "       kvq_quality --write-sample FILE [--dim D] [--layers L] [--heads H]\n"
           "                   [--tokens N] [--first-pos P] [--dtype fp16|bf16|fp32]\n"
           "                   [--seed S] [--data-seed S]\n"
           "Without files: synthetic KV at D=128 and D=64 (or --dim); defaults 8 layers x 4\n"
           "heads, 2 blocks of 256 tokens (block 0 is a root block), 32 queries per head,\n"
           "seed 1. --seed sets the synthetic model and its data, --data-seed the data only.\n"
           "The last line is\n"
           "RESULT int8_vs_pertensor_fp8=<r> int8_vs_q8_0=<r> fp8_vs_pertensor_fp8=<r>.\n");
}

static unsigned long arg_num(const char *opt, const char *v, unsigned long lo, unsigned long hi)
{
    char *end;
    unsigned long x = strtoul(v ? v : "", &end, 10);
    if (v == NULL || end == v || *end != '\0' || x < lo || x > hi) {
        fprintf(stderr, "kvq_quality: %s: expected %lu..%lu\n", opt, lo, hi);
        exit(2);
    }
    return x;
}

static int write_sample(const char *path, const synth_opts *so)
{
    dataset ds;
    float *qtok = NULL;
    synth_dataset(so, &ds, &qtok);
    kvs_sample_info in;
    memset(&in, 0, sizeof in);
    in.num_layers = so->L;
    in.num_kv_heads = so->H;
    in.head_dim = so->D;
    in.num_q_heads = so->H;
    in.tokens = so->N;
    in.first_pos = so->first_pos;
    in.dtype = so->dtype;
    in.flags = KVS_SAMPLE_F_QUERIES;
    snprintf(in.model, sizeof in.model, "kvq-synthetic-%llu", (unsigned long long)so->model_seed);
    kvs_sample *s = NULL;
    char err[KVS_ERR_LEN] = "";
    if (kvs_sample_create(&in, &s, err) != 0)
        die(err);
    const size_t es = kvs_sample_elem_size(so->dtype), per = (size_t)so->N * so->H * so->D;
    for (uint32_t l = 0; l < so->L; l++) {
        const float *src[3] = {ds.K + l * per, ds.V + l * per, qtok + l * per};
        for (int part = 0; part < 3; part++) {
            unsigned char *dst = kvs_sample_part_ptr(s, (kvs_sample_part)part, l);
            for (size_t i = 0; i < per; i++) {
                float x = src[part][i];
                if (es == 4) {
                    memcpy(dst + 4 * i, &x, 4);
                } else {
                    uint16_t b =
                        so->dtype == KVS_DTYPE_FP16 ? kvq_f32_to_fp16(x) : kvq_f32_to_bf16(x);
                    memcpy(dst + 2 * i, &b, 2);
                }
            }
        }
    }
    int rc = kvs_sample_write(path, s, err);
    if (rc != 0)
        fprintf(stderr, "kvq_quality: %s\n", err);
    else
        printf("wrote %s: %u layers x %u heads x D=%u, %u tokens from position %u, %s, with "
               "queries\n",
               path, so->L, so->H, so->D, so->N, so->first_pos, kvs_dtype_name(so->dtype));
    kvs_sample_free(s);
    free(qtok);
    dataset_free(&ds);
    return rc == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    synth_opts so = {8, 4, 128, 2 * TILE_T, 32, 0, 1, 1, KVS_DTYPE_FP16};
    int dim_given = 0, no_grid = 0;
    run_opts ro = {0, 0, {{0}}};
    long long data_seed = -1;
    const char *write_path = NULL, *profile_path = NULL;
    uint32_t tokens = 0;
    char **files = xcalloc((size_t)argc, sizeof *files);
    int nfiles = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage();
            return 0;
        } else if (strcmp(a, "--dim") == 0) {
            so.D = (uint32_t)arg_num(a, v, 1, 1024);
            dim_given = 1;
            i++;
        } else if (strcmp(a, "--layers") == 0) {
            so.L = (uint32_t)arg_num(a, v, 1, 64);
            i++;
        } else if (strcmp(a, "--heads") == 0) {
            so.H = (uint32_t)arg_num(a, v, 1, 64);
            i++;
        } else if (strcmp(a, "--blocks") == 0) {
            so.N = TILE_T * (uint32_t)arg_num(a, v, 1, 64);
            i++;
        } else if (strcmp(a, "--tokens") == 0) {
            tokens = (uint32_t)arg_num(a, v, 2, 1u << 16);
            i++;
        } else if (strcmp(a, "--first-pos") == 0) {
            so.first_pos = (uint32_t)arg_num(a, v, 0, 1u << 30);
            i++;
        } else if (strcmp(a, "--queries") == 0) {
            so.nq = (uint32_t)arg_num(a, v, 1, 1024);
            i++;
        } else if (strcmp(a, "--seed") == 0) {
            so.data_seed = so.model_seed = arg_num(a, v, 0, 1u << 30);
            i++;
        } else if (strcmp(a, "--data-seed") == 0) {
            data_seed = (long long)arg_num(a, v, 0, 1u << 30);
            i++;
        } else if (strcmp(a, "--dtype") == 0) {
            if (v && strcmp(v, "fp16") == 0)
                so.dtype = KVS_DTYPE_FP16;
            else if (v && strcmp(v, "bf16") == 0)
                so.dtype = KVS_DTYPE_BF16;
            else if (v && strcmp(v, "fp32") == 0)
                so.dtype = KVS_DTYPE_FP32;
            else {
                fprintf(stderr, "kvq_quality: --dtype: expected fp16, bf16 or fp32\n");
                return 2;
            }
            i++;
        } else if (strcmp(a, "--write-sample") == 0 && v) {
            write_path = v;
            i++;
        } else if (strcmp(a, "--profile") == 0 && v) {
            profile_path = v;
            i++;
        } else if (strcmp(a, "--no-grid") == 0) {
            no_grid = 1;
        } else if (strcmp(a, "--pairs") == 0 && v) {
            /* "kK/kV,kK/kV,...": extra int8 rows (e.g. --pairs 4/1,5/1,3/2) */
            const char *c = v;
            while (*c) {
                unsigned kk, kv;
                int used = 0;
                if (ro.npairs == 16 || sscanf(c, "%u/%u%n", &kk, &kv, &used) != 2 ||
                    kk > KVS_TILE_MAX_OUTLIERS || kv > KVS_TILE_MAX_OUTLIERS) {
                    fprintf(stderr, "kvq_quality: --pairs: expected up to 16 kK/kV, k <= 16\n");
                    return 2;
                }
                ro.pairs[ro.npairs][0] = kk;
                ro.pairs[ro.npairs][1] = kv;
                ro.npairs++;
                c += used;
                if (*c == ',')
                    c++;
                else if (*c) {
                    fprintf(stderr, "kvq_quality: --pairs: expected kK/kV[,kK/kV...]\n");
                    return 2;
                }
            }
            i++;
        } else if (a[0] == '-') {
            fprintf(stderr, "kvq_quality: unknown option '%s'\n", a);
            usage();
            return 2;
        } else {
            files[nfiles++] = argv[i];
        }
    }
    if (data_seed >= 0)
        so.data_seed = (uint64_t)data_seed;
    if (write_path) {
        if (tokens)
            so.N = tokens;
        free(files);
        return write_sample(write_path, &so);
    }

    ro.grid = !no_grid;
    totals tot;
    memset(&tot, 0, sizeof tot);
    kvs_profile *loaded = NULL;
    if (profile_path) {
        char err[KVS_ERR_LEN] = "";
        if (kvs_profile_read(profile_path, &loaded, err) != 0) {
            fprintf(stderr, "kvq_quality: %s\n", err);
            free(files);
            return 1;
        }
        printf("profile %s: model %s, layers=%u kv_heads=%u head_dim=%u block_tokens=%u, "
               "scheme %s, k=%u v=%u sinks=%u, percentile %g\n",
               profile_path, loaded->model, loaded->num_layers, loaded->num_kv_heads,
               loaded->head_dim, loaded->block_tokens, kvs_scheme_name(loaded->scheme),
               loaded->k_outliers, loaded->v_outliers, loaded->sinks, loaded->percentile);
    }
    printf("kvq_quality: ours = reference quantizer (kernels/ref); defaults from kvq_calib.h: "
           "scheme %s, kK=%u, kV=%u, S=%u\n",
           kvs_scheme_name(KVS_QUANT_DEFAULT_SCHEME), KVS_QUANT_DEFAULT_K_OUTLIERS,
           KVS_QUANT_DEFAULT_V_OUTLIERS, KVS_QUANT_DEFAULT_SINKS);
    printf("columns: bits/el = all bytes (codes + metadata) per element; meta* = scales + "
           "outliers + tile headers at T=256, D=128 (! over budget); errors are relative "
           "Frobenius norms\n");
    if (nfiles > 0) {
        for (int i = 0; i < nfiles; i++) {
            dataset ds;
            if (load_dataset(files[i], so.nq, &ds) != 0) {
                free(files);
                kvs_profile_free(loaded);
                return 1;
            }
            const kvs_profile *st[1] = {loaded};
            run_dataset(&ds, &ro, st, loaded ? 1 : 0, &tot);
            dataset_free(&ds);
        }
    } else {
        const uint32_t dims[2] = {so.D, 64};
        for (int di = 0; di < (dim_given ? 1 : 2); di++) {
            synth_opts s = so;
            s.D = dims[di];
            dataset ds;
            synth_dataset(&s, &ds, NULL);
            snprintf(ds.name, sizeof ds.name, "synthetic D=%u (seed %llu, fp16 source)", s.D,
                     (unsigned long long)s.data_seed);
            ds.primary = di == 0;
            /* Static rows: profiles calibrated on another draw of the same model. */
            kvs_profile *st[4] = {
                calibrate_synthetic(&s, KVS_SCHEME_INT8, 100.0),
                calibrate_synthetic(&s, KVS_SCHEME_INT8, 99.9),
                calibrate_synthetic(&s, KVS_SCHEME_FP8_E4M3, 100.0),
                calibrate_synthetic(&s, KVS_SCHEME_FP8_E4M3, 99.9),
            };
            run_dataset(&ds, &ro, (const kvs_profile *const *)st, 4, &tot);
            for (int i = 0; i < 4; i++)
                kvs_profile_free(st[i]);
            dataset_free(&ds);
        }
    }
    kvs_profile_free(loaded);
    free(files);
    const double oi = rel(tot.int8_o2, tot.ref2), of = rel(tot.fp8_o2, tot.ref2);
    const double opt = rel(tot.pt_o2, tot.ref2), oq = rel(tot.q8_o2, tot.ref2);
    printf("\n(RESULT: %s)\n",
           nfiles ? "pooled over the sample files" : "the first synthetic dataset");
    printf("RESULT int8_vs_pertensor_fp8=%.4f int8_vs_q8_0=%.4f fp8_vs_pertensor_fp8=%.4f\n",
           opt > 0 ? oi / opt : 0.0, oq > 0 ? oi / oq : 0.0, opt > 0 ? of / opt : 0.0);
    return 0;
}
