/*
 * codec.c — quantize-on-ingest and egress conversion (see codec.h).
 *
 * Ingest error is measured the honest way: the block is decoded from the very
 * bytes that will be stored, with the same dequantizer a reader uses, and
 * compared with the source widened to fp32. Sums run in double; non-finite
 * source elements are left out of both norms (they have no meaningful error).
 *
 * The GPU backend (KVS_HAVE_CUDA builds) copies the layer's K and V to the
 * device, quantizes every tile of the layer in two launches (K tiles, V tiles:
 * one job per head, a head's [T][D] view at stride H*D), copies the tiles back
 * through a host staging buffer into their places in the block and seals each
 * tile on the host (the kernels leave checksums 0, kvs_cuda.h). Any failure
 * there is a "CUDA error": the caller redoes the layer on the CPU, which
 * overwrites every tile byte, so nothing of a failed GPU attempt survives.
 */
#include "codec.h"

#include "kv_block.h"
#include "kvq_cpu.h"
#include "kvq_math.h"
#include "kvs_error.h"
#ifdef KVS_HAVE_CUDA
#include "kvs_cuda.h"
#endif

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t elem_bytes(unsigned dtype)
{
    switch (dtype) {
    case KVS_DTYPE_FP16:
    case KVS_DTYPE_BF16:
        return 2;
    case KVS_DTYPE_FP32:
        return 4;
    default:
        return 0;
    }
}

size_t kvs_codec_layer_bytes(const kvs_codec_layout *l)
{
    return (size_t)l->block_tokens * l->heads * l->head_dim * elem_bytes(l->dtype);
}

/* Fills p from l; schemes converted into tab (l->layers entries). */
static int to_params(const kvs_codec_layout *l, kvs_scheme *tab, kvs_block_params *p, char *err)
{
    if (elem_bytes(l->dtype) == 0) {
        return kvs_fail(err, KVS_EINVAL, "dtype %u is not fp16 (1), bf16 (2) or fp32 (3)",
                        l->dtype);
    }
    for (uint32_t i = 0; i < l->layers; i++) {
        if (l->schemes[i] < KVS_SCHEME_FP16 || l->schemes[i] > KVS_SCHEME_INT8) {
            return kvs_fail(err, KVS_EINVAL, "layer %u: scheme %u is not 1..4", i, l->schemes[i]);
        }
        tab[i] = (kvs_scheme)l->schemes[i];
    }
    memset(p, 0, sizeof *p);
    p->layers = l->layers;
    p->heads = l->heads;
    p->head_dim = l->head_dim;
    p->block_tokens = l->block_tokens;
    p->src_dtype = (kvs_dtype)l->dtype;
    p->root = l->root;
    p->k_outliers = l->k_outliers;
    p->v_outliers = l->v_outliers;
    uint32_t s = l->root ? l->sinks : 0;
    if (s > l->block_tokens)
        s = l->block_tokens;
    p->sinks = s;
    p->schemes = tab;
    p->k_tensor_scales = l->k_tensor_scales;
    p->v_tensor_scales = l->v_tensor_scales;
    p->key_offsets = l->key_offsets != 0;
    return kvs_block_params_check(p, err);
}

size_t kvs_codec_block_size(const kvs_codec_layout *l, char *err)
{
    if (l->layers == 0 || l->layers > KVS_BLOCK_MAX_LAYERS) {
        (void)kvs_fail(err, 0, "num_layers %u is outside 1..%u", l->layers, KVS_BLOCK_MAX_LAYERS);
        return 0;
    }
    kvs_scheme tab[KVS_BLOCK_MAX_LAYERS];
    kvs_block_params p;
    if (to_params(l, tab, &p, err) != 0)
        return 0;
    return kvs_block_size(&p);
}

/* fp16 -> fp32 for all 65536 codes, built once: the error pass reads every
 * source element, and the scalar conversion was its cost. */
static float g_fp16_f32[65536];
static pthread_once_t g_fp16_once = PTHREAD_ONCE_INIT;
static void build_fp16_table(void)
{
    for (uint32_t h = 0; h < 65536; h++)
        g_fp16_f32[h] = kvq_fp16_to_f32((uint16_t)h);
}

static void accumulate(double *num, double *den, float x, float y)
{
    if (!isfinite(x))
        return;
    double d = (double)x - (double)y;
    *num += d * d;
    *den += (double)x * (double)x;
}

static float rel_error(const void *src, unsigned dtype, const float *dec, size_t n)
{
    double num = 0, den = 0;
    if (dtype == KVS_DTYPE_FP32) {
        const float *x = src;
        for (size_t i = 0; i < n; i++)
            accumulate(&num, &den, x[i], dec[i]);
    } else if (dtype == KVS_DTYPE_FP16) {
        pthread_once(&g_fp16_once, build_fp16_table);
        const uint16_t *x = src;
        for (size_t i = 0; i < n; i++)
            accumulate(&num, &den, g_fp16_f32[x[i]], dec[i]);
    } else {
        const uint16_t *x = src;
        for (size_t i = 0; i < n; i++)
            accumulate(&num, &den, kvq_bf16_to_f32(x[i]), dec[i]);
    }
    if (den == 0)
        return num == 0 ? 0.0f : INFINITY;
    return (float)sqrt(num / den);
}

/* The header kvs_block_encode writes, from the same code
 * (kvs_block_write_header): fields, the scheme table padded so tiles start
 * 16-aligned, XXH3-64 over both with the checksum field zero.
 * kvs_block_check_header then proves it right. */
int kvs_codec_begin(const kvs_codec_layout *l, void *out, size_t cap, char *err)
{
    if (l->layers == 0 || l->layers > KVS_BLOCK_MAX_LAYERS) {
        return kvs_fail(err, KVS_EINVAL, "num_layers %u is outside 1..%u", l->layers,
                        KVS_BLOCK_MAX_LAYERS);
    }
    kvs_scheme tab[KVS_BLOCK_MAX_LAYERS];
    kvs_block_params p;
    int rc = to_params(l, tab, &p, err);
    if (rc != 0)
        return rc;
    size_t size = kvs_block_size(&p);
    if (out == NULL || (uintptr_t)out % 8u != 0 || cap < size) {
        return kvs_fail(err, KVS_EINVAL, "block buffer: %zu bytes (8-aligned) needed, %zu given",
                        size, cap);
    }
    kvs_block_write_header(&p, out);
    return kvs_block_check_header(out, cap, NULL, err);
}

/* Do layer's K tiles carry key offsets? Those of 8-bit layers in a block
 * with key_offsets (kvs_block_encode's rule: the header flag and the tiles
 * must agree, kvs_block_check). */
static int layer_koff(const kvs_codec_layout *l, uint32_t layer)
{
    return l->key_offsets && l->schemes[layer] != KVS_SCHEME_FP16;
}

/* The tile parameters of one layer's K or V tiles. */
static kvs_tile_params layer_tile_params(const kvs_codec_layout *l, uint32_t layer, unsigned kind)
{
    unsigned s = l->schemes[layer];
    uint32_t sinks = l->root ? l->sinks : 0;
    if (sinks > l->block_tokens)
        sinks = l->block_tokens;
    kvs_tile_params tp = {
        .scheme = (kvs_scheme)s,
        .kind = (kvs_tile_kind)kind,
        .tokens = l->block_tokens,
        .dim = l->head_dim,
        .outliers = s == KVS_SCHEME_FP16 ? 0 : kind == KVS_TILE_K ? l->k_outliers : l->v_outliers,
        .sinks = s == KVS_SCHEME_FP16 ? 0 : sinks,
        .static_scales = NULL,
        .tensor_scale = 0.0f,
        .key_offsets = kind == KVS_TILE_K && layer_koff(l, layer),
    };
    const float *ts = kind == KVS_TILE_K ? l->k_tensor_scales : l->v_tensor_scales;
    if (ts != NULL && s != KVS_SCHEME_FP16)
        tp.tensor_scale = ts[layer];
    return tp;
}

static int cpu_quantize_layer(const kvs_codec_layout *l, uint32_t layer, const void *k,
                              const void *v, void *out, size_t cap, char *err)
{
    size_t es = elem_bytes(l->dtype);
    size_t row = (size_t)l->heads * l->head_dim;
    for (unsigned kind = KVS_TILE_K; kind <= KVS_TILE_V; kind++) {
        kvs_tile_params tp = layer_tile_params(l, layer, kind);
        const uint8_t *src = kind == KVS_TILE_K ? k : v;
        for (uint32_t h = 0; h < l->heads; h++) {
            const void *tile;
            size_t tl;
            int rc = kvs_block_tile(out, cap, layer, (kvs_tile_kind)kind, h, &tile, &tl, err);
            if (rc == 0)
                rc = kvs_tile_quantize(&tp, src + (size_t)h * l->head_dim * es,
                                       (kvs_dtype)l->dtype, row, (void *)tile, tl, err);
            if (rc != 0)
                return rc;
        }
    }
    return 0;
}

/* ---- backend selection, counters, the GPU path --------------------------- */

static atomic_int g_ingest = KVS_CODEC_CPU;
/* Why auto did not choose the GPU, or why key offsets stay on the CPU
 * (kvs_codec_backend_note); written only at select. */
static char g_select_note[KVS_ERR_LEN + 32];
static atomic_ullong g_layers_cpu, g_layers_gpu, g_gpu_fallbacks;
/* Layers with key offsets go to the GPU only once their own self-check passed
 * (kvs_codec_backend_select); until then, and if it failed, to the CPU. */
static atomic_int g_gpu_koff;

const char *kvs_codec_backend_name(kvs_codec_backend be)
{
    switch (be) {
    case KVS_CODEC_CPU:
        return "cpu";
    case KVS_CODEC_GPU:
        return "gpu";
    case KVS_CODEC_INGEST:
        return "ingest";
    }
    return "?";
}

const char *kvs_codec_backend_note(void)
{
    return g_select_note;
}

kvs_codec_backend kvs_codec_backend_current(void)
{
    return (kvs_codec_backend)atomic_load(&g_ingest);
}

int kvs_codec_gpu_key_offsets(void)
{
    return atomic_load(&g_gpu_koff);
}

void kvs_codec_counters_get(kvs_codec_counters *out)
{
    out->layers_cpu = atomic_load(&g_layers_cpu);
    out->layers_gpu = atomic_load(&g_layers_gpu);
    out->gpu_fallbacks = atomic_load(&g_gpu_fallbacks);
}

#ifdef KVS_HAVE_CUDA
int kvs_codec_gpu_built(void) { return 1; }

/* Device buffers, grown to the largest layer seen; guarded by g_gpu_mu. */
static pthread_mutex_t g_gpu_mu = PTHREAD_MUTEX_INITIALIZER;
static void *g_dsrc, *g_dtiles, *g_djobs;
static size_t g_dsrc_cap, g_dtiles_cap, g_djobs_cap;

static int gpu_reserve(void **p, size_t *cap, size_t need)
{
    if (*cap >= need)
        return 0;
    kvs_cuda_free(*p);
    *p = NULL;
    *cap = 0;
    int rc = kvs_cuda_alloc(p, need);
    if (rc == 0)
        *cap = need;
    return rc;
}

static int gpu_fail(int rc, const char *what, char *err)
{
    return kvs_fail(err, rc ? rc : KVS_EINTERNAL, "GPU %s: %s (%s)", what, kvs_strerror(rc),
                    kvs_cuda_last_error());
}

/* One layer's tiles on the device; the caller holds g_gpu_mu. */
static int gpu_quantize_layer_locked(const kvs_codec_layout *l, uint32_t layer, const void *k,
                                     const void *v, void *out, size_t cap, char *err)
{
    size_t lb = kvs_codec_layer_bytes(l), es = elem_bytes(l->dtype);
    size_t row = (size_t)l->heads * l->head_dim;
    uint32_t H = l->heads;
    uint64_t off, n;
    int rc = kvs_block_layer_range(out, cap, layer, &off, &n, err);
    if (rc != 0)
        return rc;
    uint8_t *base = (uint8_t *)out + off;
    size_t njobs = 2 * (size_t)H;
    kvs_cuda_tile_job *jobs = calloc(njobs, sizeof *jobs);
    uint8_t **tile_at = calloc(njobs, sizeof *tile_at);
    size_t *tile_len = calloc(njobs, sizeof *tile_len);
    uint8_t *stage = malloc(n ? n : 1);
    if (!jobs || !tile_at || !tile_len || !stage) {
        rc = kvs_fail(err, KVS_ENOMEM, "out of memory staging a layer for the GPU");
        goto out;
    }
    if ((rc = gpu_reserve(&g_dsrc, &g_dsrc_cap, 2 * lb)) != 0 ||
        (rc = gpu_reserve(&g_dtiles, &g_dtiles_cap, n)) != 0 ||
        (rc = gpu_reserve(&g_djobs, &g_djobs_cap, njobs * sizeof *jobs)) != 0) {
        rc = gpu_fail(rc, "allocation", err);
        goto out;
    }
    for (size_t j = 0; j < njobs; j++) {
        unsigned kind = j < H ? KVS_TILE_K : KVS_TILE_V;
        uint32_t h = (uint32_t)(j % H);
        const void *tile;
        if ((rc = kvs_block_tile(out, cap, layer, (kvs_tile_kind)kind, h, &tile, &tile_len[j],
                                 err)) != 0)
            goto out;
        tile_at[j] = (uint8_t *)tile;
        size_t t_off = (size_t)(tile_at[j] - base);
        if (t_off % 16 != 0 || t_off + tile_len[j] > n) {
            rc = kvs_fail(err, KVS_EINTERNAL, "GPU: tile %zu of layer %u at offset %zu", j, layer,
                          t_off);
            goto out;
        }
        jobs[j].src = (const uint8_t *)g_dsrc + (kind == KVS_TILE_K ? 0 : lb) +
                      (size_t)h * l->head_dim * es;
        jobs[j].stride = row;
        jobs[j].dst = (uint8_t *)g_dtiles + t_off;
        jobs[j].static_scales = NULL;
    }
    if ((rc = kvs_cuda_copy_to_device(g_dsrc, k, lb)) != 0 ||
        (rc = kvs_cuda_copy_to_device((uint8_t *)g_dsrc + lb, v, lb)) != 0 ||
        (rc = kvs_cuda_copy_to_device(g_djobs, jobs, njobs * sizeof *jobs)) != 0) {
        rc = gpu_fail(rc, "copy to the device", err);
        goto out;
    }
    for (unsigned kind = KVS_TILE_K; kind <= KVS_TILE_V; kind++) {
        kvs_tile_params tp = layer_tile_params(l, layer, kind);
        const kvs_cuda_tile_job *jd =
            (const kvs_cuda_tile_job *)g_djobs + (kind == KVS_TILE_K ? 0 : H);
        if ((rc = kvs_cuda_quantize_tiles(&tp, (kvs_dtype)l->dtype, jd, H, NULL)) != 0) {
            rc = gpu_fail(rc, "quantize launch", err);
            goto out;
        }
    }
    if ((rc = kvs_cuda_sync()) != 0 || (rc = kvs_cuda_copy_to_host(stage, g_dtiles, n)) != 0) {
        rc = gpu_fail(rc, "quantize", err);
        goto out;
    }
    for (size_t j = 0; j < njobs; j++) {
        memcpy(tile_at[j], stage + (tile_at[j] - base), tile_len[j]);
        if ((rc = kvs_tile_seal(tile_at[j], tile_len[j], err)) != 0)
            goto out;
    }
out:
    free(jobs);
    free(tile_at);
    free(tile_len);
    free(stage);
    return rc;
}

static int gpu_quantize_layer(const kvs_codec_layout *l, uint32_t layer, const void *k,
                              const void *v, void *out, size_t cap, char *err)
{
    pthread_mutex_lock(&g_gpu_mu);
    int rc = gpu_quantize_layer_locked(l, layer, k, v, out, cap, err);
    pthread_mutex_unlock(&g_gpu_mu);
    return rc;
}

static int gpu_probe(char *err)
{
    int n = 0;
    int rc = kvs_cuda_device_count(&n);
    if (rc != 0 || n <= 0) {
        return kvs_fail(err, KVS_ENODEV, "no CUDA device (%s)",
                        kvs_cuda_last_error()[0] ? kvs_cuda_last_error() : "none found");
    }
    return 0;
}
#else
int kvs_codec_gpu_built(void) { return 0; }

static int gpu_quantize_layer(const kvs_codec_layout *l, uint32_t layer, const void *k,
                              const void *v, void *out, size_t cap, char *err)
{
    (void)l, (void)layer, (void)k, (void)v, (void)out, (void)cap;
    return kvs_fail(err, KVS_EUNIMPL, "this build has no CUDA (configure with KVS_CUDA=ON)");
}

static int gpu_probe(char *err)
{
    return kvs_fail(err, KVS_EUNIMPL, "this build has no CUDA (configure with KVS_CUDA=ON)");
}
#endif

/* The GPU backend must make the CPU's bytes: before it is chosen, one block
 * of every 8-bit scheme with outliers, sinks and an fp16 layer (fp16 source
 * with a few large channels, fixed seed) is encoded both ways and compared,
 * with per-tensor scales (a model rule's profile) on the FP8 layers: one
 * below the data's amax / 448 (groups aligned up) and one above it; with
 * koff, the same block with key offsets (kv_format.h rule 5).
 * 0, or KVS_EINTERNAL / the GPU's error with why saying which layer differed. */
static int gpu_selfcheck(int koff, char *why)
{
    enum { L = 4, H = 2, D = 128, T = 64 };
    static const uint8_t schemes[L] = {KVS_SCHEME_INT8, KVS_SCHEME_FP8_E4M3, KVS_SCHEME_FP8_E5M2,
                                       KVS_SCHEME_FP16};
    static const float k_ts[L] = {0.05f, 0.0123f, 7.1e-4f, 0.05f};
    static const float v_ts[L] = {0.01f, 0.0731f, 1.9e-5f, 0.01f};
    kvs_codec_layout l = {.layers = L,
                          .heads = H,
                          .head_dim = D,
                          .block_tokens = T,
                          .dtype = KVS_DTYPE_FP16,
                          .root = 1,
                          .k_outliers = 2,
                          .v_outliers = 1,
                          .sinks = 1,
                          .schemes = schemes,
                          .k_tensor_scales = k_ts,
                          .v_tensor_scales = v_ts,
                          .key_offsets = koff};
    size_t n = (size_t)T * H * D, size = kvs_codec_block_size(&l, why);
    uint16_t *src = malloc(2 * n * sizeof *src);
    uint8_t *a = aligned_alloc(64, (size + 63) & ~(size_t)63);
    uint8_t *b = aligned_alloc(64, (size + 63) & ~(size_t)63);
    int rc = size && src && a && b ? 0 : KVS_ENOMEM;
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; rc == 0 && i < 2 * n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        float f = (float)((int64_t)(x >> 40) - (1 << 23)) / (float)(1 << 23);
        if (i % D == 5 || x % 97 == 0)
            f *= 24.0f; /* an outlier channel and scattered large values */
        src[i] = kvq_f32_to_fp16(f);
    }
    if (rc == 0 && ((rc = kvs_codec_begin(&l, a, size, why)) == 0))
        memcpy(b, a, size);
    for (uint32_t layer = 0; rc == 0 && layer < L; layer++) {
        rc = gpu_quantize_layer(&l, layer, src, src + n, a, size, why);
        if (rc == 0)
            rc = cpu_quantize_layer(&l, layer, src, src + n, b, size, why);
        if (rc == 0 && memcmp(a, b, size) != 0)
            rc = kvs_fail(why, KVS_EINTERNAL,
                          "self-check: layer %u (scheme %u%s) quantized on the GPU differs from "
                          "the CPU's bytes",
                          layer, (unsigned)schemes[layer], koff ? ", key offsets" : "");
    }
    free(src);
    free(a);
    free(b);
    return rc;
}

int kvs_codec_backend_select(int want, kvs_codec_backend *out, char *err)
{
    kvs_codec_backend be = KVS_CODEC_CPU;
    char why[KVS_ERR_LEN] = "";
    if (want < 0 || want > 2) {
        return kvs_fail(err, KVS_EINVAL, "ingest_backend: %d is not auto (0), cpu (1), gpu (2)",
                        want);
    }
    g_select_note[0] = '\0';
    atomic_store(&g_gpu_koff, 0);
    if (want != 1) {
        int rc = gpu_probe(why), probed = rc == 0;
        if (probed)
            rc = gpu_selfcheck(0, why);
        if (rc == 0)
            be = KVS_CODEC_GPU;
        else if (want == 2)
            return kvs_fail(err, rc, "ingest_backend gpu: %s", why);
        else if (probed) /* a GPU is there but failed: say so (no GPU is the usual case) */
            snprintf(g_select_note, sizeof g_select_note, "ingest on the CPU: %s", why);
        /* Key offsets are checked on their own: if only they differ, the GPU
         * keeps the other layers and theirs go to the CPU, said in the note. */
        if (be == KVS_CODEC_GPU && (rc = gpu_selfcheck(1, why)) != 0)
            snprintf(g_select_note, sizeof g_select_note, "key offsets on the CPU: %s", why);
        atomic_store(&g_gpu_koff, be == KVS_CODEC_GPU && rc == 0);
    }
    atomic_store(&g_ingest, (int)be);
    if (out)
        *out = be;
    return 0;
}

int kvs_codec_encode_layer(kvs_codec_backend be, const kvs_codec_layout *l, uint32_t layer,
                           const void *k, const void *v, void *out, size_t cap, float *k_err,
                           float *v_err, char *err)
{
    if (be == KVS_CODEC_INGEST)
        be = kvs_codec_backend_current();
    if (be != KVS_CODEC_CPU && be != KVS_CODEC_GPU) {
        return kvs_fail(err, KVS_EINVAL, "codec backend %d is not cpu, gpu or ingest", (int)be);
    }
    if (layer >= l->layers || k == NULL || v == NULL) {
        return kvs_fail(err, KVS_EINVAL, "layer %u: out of range or no payload", layer);
    }
    int rc;
    if (be == KVS_CODEC_GPU && layer_koff(l, layer) && !atomic_load(&g_gpu_koff))
        be = KVS_CODEC_CPU; /* their self-check did not pass: not a fallback */
    if (be == KVS_CODEC_GPU) {
        rc = gpu_quantize_layer(l, layer, k, v, out, cap, err);
        if (rc == 0) {
            atomic_fetch_add(&g_layers_gpu, 1);
        } else {
            atomic_fetch_add(&g_gpu_fallbacks, 1);
            be = KVS_CODEC_CPU; /* the CPU rewrites every tile byte */
        }
    }
    if (be == KVS_CODEC_CPU) {
        rc = cpu_quantize_layer(l, layer, k, v, out, cap, err);
        if (rc != 0)
            return rc;
        atomic_fetch_add(&g_layers_cpu, 1);
    }
    size_t row = (size_t)l->heads * l->head_dim;
    /* Measure by decoding what is now stored, with a reader's own checks. */
    size_t n = (size_t)l->block_tokens * row;
    float *kd = malloc(n * sizeof *kd), *vd = malloc(n * sizeof *vd);
    rc = KVS_ENOMEM;
    if (kd && vd) {
        rc = kvs_block_decode_layer(out, cap, layer, KVS_DTYPE_FP32, kd, vd,
                                    kvs_tile_dequantize_verified, err);
        if (rc == 0) {
            *k_err = rel_error(k, l->dtype, kd, n);
            *v_err = rel_error(v, l->dtype, vd, n);
        }
    } else {
        (void)kvs_fail(err, 0, "out of memory measuring quantization error");
    }
    free(kd);
    free(vd);
    return rc;
}

int kvs_codec_finish(const void *out, size_t size, char *err)
{
    return kvs_block_check(out, size, NULL, err);
}

int kvs_codec_encode(kvs_codec_backend be, const kvs_codec_layout *l, const void *const *k,
                     const void *const *v, void *out, size_t cap, float *k_err, float *v_err,
                     char *err)
{
    int rc = kvs_codec_begin(l, out, cap, err);
    for (uint32_t i = 0; rc == 0 && i < l->layers; i++)
        rc = kvs_codec_encode_layer(be, l, i, k[i], v[i], out, cap, &k_err[i], &v_err[i], err);
    if (rc == 0)
        rc = kvs_codec_finish(out, cap, err);
    return rc;
}

int kvs_codec_block_info(const void *blk, size_t len, kvs_codec_info *out, char *err)
{
    kvs_block_hdr h;
    int rc = kvs_block_check_header(blk, len, &h, err);
    if (rc != 0)
        return rc;
    memset(out, 0, sizeof *out);
    out->layers = h.num_layers;
    out->heads = h.num_kv_heads;
    out->head_dim = h.head_dim;
    out->block_tokens = h.block_tokens;
    out->src_dtype = h.src_dtype;
    const uint8_t *tab = (const uint8_t *)blk + sizeof h;
    out->scheme = tab[0];
    for (uint32_t i = 1; i < h.num_layers; i++)
        if (tab[i] != tab[0])
            out->mixed = 1;
    return 0;
}

int kvs_codec_layer_ends(const void *blk, size_t len, uint64_t *ends, uint32_t cap,
                         uint32_t *layers, char *err)
{
    kvs_block_hdr h;
    int rc = kvs_block_check_header(blk, len, &h, err);
    if (rc != 0)
        return rc;
    if (h.num_layers > cap)
        return kvs_fail(err, KVS_ENOSPC, "block: %u layers (at most %u here)", h.num_layers, cap);
    uint64_t end = 0;
    for (uint32_t i = 0; i < h.num_layers; i++) {
        uint64_t off, n;
        if ((rc = kvs_block_layer_range(blk, len, i, &off, &n, err)) != 0)
            return rc;
        if (i > 0 && off != end)
            return kvs_fail(err, KVS_EFORMAT, "block: layer %u does not follow layer %u", i, i - 1);
        ends[i] = end = off + n;
    }
    if (end != h.total_bytes || end > len)
        return kvs_fail(err, KVS_EFORMAT, "block: layers end at %llu, total_bytes %llu",
                        (unsigned long long)end, (unsigned long long)h.total_bytes);
    *layers = h.num_layers;
    return 0;
}

int kvs_codec_peek_scheme(const void *head, size_t len, unsigned *scheme, char *err)
{
    kvs_block_hdr h;
    if (head == NULL || len < sizeof h + 1)
        return kvs_fail(err, KVS_EFORMAT, "block head: %zu bytes, need %zu", len, sizeof h + 1);
    memcpy(&h, head, sizeof h);
    size_t need = kvs_align16((uint32_t)sizeof h + h.num_layers);
    if (h.num_layers >= 1 && len >= need) {
        kvs_codec_info ci;
        int rc = kvs_codec_block_info(head, len, &ci, err);
        if (rc == 0)
            *scheme = ci.scheme;
        return rc;
    }
    /* The table runs past what we have: check what is here, field by field,
     * the bounds by kvs_block_params_check (the layers not seen stand in as
     * layer 0's scheme, which is checked). */
    if (h.magic != KVS_BLOCK_MAGIC || h.version != KVS_FORMAT_VERSION ||
        (h.flags & ~KVS_BLOCK_F_KNOWN) || h.reserved0 || h.reserved1 || h.reserved2 ||
        h.num_layers < 1 || h.num_layers > KVS_BLOCK_MAX_LAYERS)
        return kvs_fail(err, KVS_EFORMAT,
                        "block head: bad magic, version, flags, reserved field or layers");
    const uint8_t *tab = (const uint8_t *)head + sizeof h;
    size_t have = len - sizeof h; /* < num_layers here */
    kvs_scheme sch[KVS_BLOCK_MAX_LAYERS];
    for (size_t i = 0; i < h.num_layers; i++)
        sch[i] = (kvs_scheme)(i < have ? tab[i] : tab[0]);
    kvs_block_params p = {.layers = h.num_layers,
                          .heads = h.num_kv_heads,
                          .head_dim = h.head_dim,
                          .block_tokens = h.block_tokens,
                          .src_dtype = (kvs_dtype)h.src_dtype,
                          .root = (h.flags & KVS_BLOCK_F_ROOT) != 0,
                          .k_outliers = h.k_outliers,
                          .v_outliers = h.v_outliers,
                          .sinks = h.sinks,
                          .schemes = sch,
                          .key_offsets = (h.flags & KVS_BLOCK_F_KOFF) != 0};
    char perr[KVS_ERR_LEN];
    if (kvs_block_params_check(&p, perr) != 0)
        return kvs_fail(err, KVS_EFORMAT, "block head: %s", perr);
    *scheme = tab[0];
    return 0;
}

size_t kvs_codec_egress_bytes(uint32_t block_tokens, uint32_t heads, uint32_t head_dim,
                              unsigned fmt)
{
    size_t n = (size_t)block_tokens * heads * head_dim;
    switch (fmt) {
    case 1:
    case 2:
        return n * 2;
    case 3:
        return n * 4;
    case 4:
        return n;
    default:
        return 0;
    }
}

int kvs_codec_egress_layer(const void *blk, size_t len, uint32_t layer, unsigned fmt,
                           void *k_buf, void *v_buf, const void **k, size_t *k_len,
                           const void **v, size_t *v_len, float *k_scale, float *v_scale,
                           char *err)
{
    kvs_block_hdr h;
    int rc = kvs_block_check_header(blk, len, &h, err);
    if (rc != 0)
        return rc;
    if (layer >= h.num_layers) {
        return kvs_fail(err, KVS_EINVAL, "layer %u: the block has %u layers", layer, h.num_layers);
    }
    size_t bytes = kvs_codec_egress_bytes(h.block_tokens, h.num_kv_heads, h.head_dim, fmt);
    *k_scale = *v_scale = 0;
    switch (fmt) {
    case 0: {
        uint64_t off, n;
        const void *kt, *vt;
        size_t tl;
        if ((rc = kvs_block_layer_range(blk, len, layer, &off, &n, err)) != 0 ||
            (rc = kvs_block_tile(blk, len, layer, KVS_TILE_K, 0, &kt, &tl, err)) != 0 ||
            (rc = kvs_block_tile(blk, len, layer, KVS_TILE_V, 0, &vt, &tl, err)) != 0)
            return rc;
        const uint8_t *end = (const uint8_t *)blk + off + n;
        *k = kt;
        *k_len = (size_t)((const uint8_t *)vt - (const uint8_t *)kt);
        *v = vt;
        *v_len = (size_t)(end - (const uint8_t *)vt);
        return 0;
    }
    case 1:
    case 2:
    case 3: {
        kvs_dtype dt = fmt == 1 ? KVS_DTYPE_FP16 : fmt == 2 ? KVS_DTYPE_BF16 : KVS_DTYPE_FP32;
        rc = kvs_block_decode_layer(blk, len, layer, dt, k_buf, v_buf, kvs_tile_dequantize_verified,
                                    err);
        break;
    }
    case 4:
        rc = kvs_block_requant_fp8(blk, len, layer, KVS_TILE_K, k_buf, k_scale, err);
        if (rc == 0)
            rc = kvs_block_requant_fp8(blk, len, layer, KVS_TILE_V, v_buf, v_scale, err);
        break;
    default:
        return kvs_fail(err, KVS_EINVAL, "format %u is not an EgressFormat (0..4)", fmt);
    }
    if (rc != 0)
        return rc;
    *k = k_buf;
    *v = v_buf;
    *k_len = *v_len = bytes;
    return 0;
}
