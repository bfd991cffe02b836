/*
 * fuzz_files.c — seeds and regression inputs of the file fuzz targets: llama2.c
 * checkpoints, KVSM sample files, calibration profiles, JSONL traces and
 * kvstashd config files (fuzz_target.h, KVS_FUZZ_MODEL..KVS_FUZZ_CONFIG).
 *
 * Seeds are made at test time by the code that writes each format where one
 * exists (kvs_profile_print, kvs_trace_generate + kvs_trace_write) and by hand
 * from the documented layout otherwise (checkpoints: 7 int32 then the weights,
 * kvs_model_file_bytes long; samples: the 112-byte kvs_sample_hdr, the data,
 * XXH3 over both). Everything is deterministic.
 */
#include "decoder.h"
#include "fuzz_target.h"
#include "kvq.h"
#include "kvq_calib.h"
#include "kvq_math.h"
#include "kvs_error.h"
#include "trace.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t g_state;
static uint32_t next(void)
{
    return kvs_fuzz_next(&g_state);
}

/* Small values, a few large ones, and (when hostile) ±Inf/NaN. */
static float value(int hostile)
{
    uint32_t r = next() % 64;
    if (hostile && r == 0)
        return INFINITY;
    if (hostile && r == 1)
        return NAN;
    if (r == 2)
        return 40.0f;
    return ((float)(int32_t)(next() % 2001u) - 1000.0f) / 1000.0f;
}

/* Copies a memstream's text into buf; 0 when it does not fit. */
static size_t take_text(char *text, size_t len, uint8_t *buf, size_t cap)
{
    size_t n = text && len <= cap ? len : 0;
    if (n)
        memcpy(buf, text, n);
    free(text);
    return n;
}

/* ---- checkpoints -------------------------------------------------------------- */

/* The loader refuses non-finite weights (a regression input checks it), so
 * the seeds hold finite values only. */
typedef struct model_spec {
    int32_t hdr[7]; /* dim, hidden, layers, heads, kv_heads, vocab (< 0: own classifier), seq */
} model_spec;

static const model_spec k_models[] = {
    {{8, 16, 1, 2, 1, 16, 8}},
    {{8, 12, 2, 2, 2, -10, 4}}, /* unshared classifier */
    {{4, 8, 1, 1, 1, 3, 1}},    /* seq 1, vocab 3 (BOS = 1) */
    {{16, 8, 1, 4, 2, 5, 6}},   /* GQA, head_dim 4 */
};

static size_t model_seed_bytes(const model_spec *ms, uint8_t *buf, size_t cap)
{
    const int32_t *h = ms->hdr;
    kvs_model_config cfg = {
        .dim = (uint32_t)h[0],
        .hidden_dim = (uint32_t)h[1],
        .n_layers = (uint32_t)h[2],
        .n_heads = (uint32_t)h[3],
        .n_kv_heads = (uint32_t)h[4],
        .vocab_size = (uint32_t)(h[5] < 0 ? -h[5] : h[5]),
        .seq_len = (uint32_t)h[6],
        .shared_classifier = h[5] > 0,
    };
    cfg.head_dim = cfg.dim / cfg.n_heads;
    cfg.kv_dim = cfg.n_kv_heads * cfg.head_dim;
    const uint64_t n = kvs_model_file_bytes(&cfg);
    if (n > cap || kvs_model_check_header(h, n, &cfg, NULL) != 0)
        return 0;
    memcpy(buf, h, KVS_MODEL_HDR_BYTES);
    for (uint64_t at = KVS_MODEL_HDR_BYTES; at + 4 <= n; at += 4) {
        float x = value(0);
        memcpy(buf + at, &x, 4);
    }
    return (size_t)n;
}

static size_t model_seed(unsigned i, uint8_t *buf, size_t cap)
{
    if (i >= sizeof k_models / sizeof k_models[0])
        return 0;
    g_state = 0x5EED0001u + i;
    return model_seed_bytes(&k_models[i], buf, cap);
}

/* ---- sample files ------------------------------------------------------------- */

typedef struct sample_spec {
    uint32_t layers, heads, dim, q_heads, tokens, first_pos;
    kvs_dtype dtype;
    uint32_t flags;
    const char *model;
} sample_spec;

static const sample_spec k_samples[] = {
    {1, 1, 2, 0, 3, 0, KVS_DTYPE_FP32, 0, ""},
    {2, 2, 4, 4, 5, 7, KVS_DTYPE_FP16, KVS_SAMPLE_F_POST_ROPE | KVS_SAMPLE_F_QUERIES, "m@1"},
    {1, 1, 4, 0, 40, 0, KVS_DTYPE_BF16, KVS_SAMPLE_F_POST_ROPE, "stories260K@0123456789abcdef"},
    {1, 2, 2, 2, 2, 0, KVS_DTYPE_FP32, KVS_SAMPLE_F_QUERIES, "x"},
};

/* A sample file with the mode byte first; mode bit 0 asks the target to
 * reseal (the seed's checksum is right either way). */
static size_t make_sample(const sample_spec *ss, unsigned mode, int hostile, uint8_t *buf,
                          size_t cap)
{
    kvs_sample_info info;
    memset(&info, 0, sizeof info);
    info.num_layers = ss->layers;
    info.num_kv_heads = ss->heads;
    info.head_dim = ss->dim;
    info.num_q_heads = ss->q_heads;
    info.tokens = ss->tokens;
    info.first_pos = ss->first_pos;
    info.dtype = ss->dtype;
    info.flags = ss->flags;
    snprintf(info.model, sizeof info.model, "%s", ss->model);
    if (kvs_sample_info_check(&info, NULL) != 0)
        return 0;
    uint64_t data = kvs_sample_data_bytes(&info);
    if (1 + KVS_SAMPLE_HDR_BYTES + data > cap)
        return 0;
    kvs_sample_hdr h;
    memset(&h, 0, sizeof h);
    h.magic = KVS_SAMPLE_MAGIC;
    h.version = KVS_SAMPLE_VERSION;
    h.dtype = (uint8_t)ss->dtype;
    h.flags = (uint8_t)ss->flags;
    h.num_layers = (uint16_t)ss->layers;
    h.num_kv_heads = (uint16_t)ss->heads;
    h.head_dim = (uint16_t)ss->dim;
    h.num_q_heads = (uint16_t)ss->q_heads;
    h.tokens = ss->tokens;
    h.first_pos = ss->first_pos;
    h.data_bytes = data;
    memcpy(h.model, ss->model, strlen(ss->model));
    uint8_t *file = buf + 1;
    memcpy(file, &h, sizeof h);
    const size_t esz = kvs_sample_elem_size(ss->dtype);
    for (uint64_t at = 0; at < data; at += esz) {
        float x = value(hostile);
        uint8_t *p = file + KVS_SAMPLE_HDR_BYTES + at;
        if (esz == 4) {
            memcpy(p, &x, 4);
        } else {
            uint16_t b = ss->dtype == KVS_DTYPE_FP16 ? kvq_f32_to_fp16(x) : kvq_f32_to_bf16(x);
            memcpy(p, &b, 2);
        }
    }
    h.checksum = kvs_tile_checksum(file, KVS_SAMPLE_HDR_BYTES + (size_t)data);
    memcpy(file + offsetof(kvs_sample_hdr, checksum), &h.checksum, sizeof h.checksum);
    buf[0] = (uint8_t)mode;
    return 1 + KVS_SAMPLE_HDR_BYTES + (size_t)data;
}

static size_t sample_seed(unsigned i, uint8_t *buf, size_t cap)
{
    const unsigned n = sizeof k_samples / sizeof k_samples[0];
    if (i >= 2 * n)
        return 0;
    g_state = 0x5EED0002u + i;
    return make_sample(&k_samples[i % n], i / n ? KVS_FUZZ_MODE_SEAL : 0, (int)(i % 2), buf,
                       cap);
}

/* ---- profiles ----------------------------------------------------------------- */

int kvs_fuzz_profile_text(const struct kvs_profile *p, char **text, size_t *len)
{
    *text = NULL;
    *len = 0;
    FILE *f = open_memstream(text, len);
    if (f == NULL)
        return KVS_ENOMEM;
    int rc = kvs_profile_print(p, f, NULL);
    if (fclose(f) != 0 && rc == 0)
        rc = KVS_EIO;
    if (rc != 0) {
        free(*text);
        *text = NULL;
    }
    return rc;
}

static size_t make_profile(uint32_t layers, uint32_t heads, uint32_t dim, kvs_scheme scheme,
                           int post_rope, const char *model, uint32_t key_offsets, uint8_t *buf,
                           size_t cap)
{
    kvs_profile shape;
    memset(&shape, 0, sizeof shape);
    snprintf(shape.model, sizeof shape.model, "%s", model);
    shape.num_layers = layers;
    shape.num_kv_heads = heads;
    shape.head_dim = dim;
    shape.block_tokens = 32;
    shape.dtype = KVS_DTYPE_FP16;
    shape.post_rope = post_rope;
    shape.scheme = scheme;
    shape.k_outliers = 3;
    shape.v_outliers = 2;
    shape.sinks = 1;
    shape.key_offsets = key_offsets;
    shape.percentile = 99.9;
    shape.samples = 2;
    shape.tokens = 640;
    kvs_profile *p = NULL;
    if (kvs_profile_create(&shape, &p, NULL) != 0)
        return 0;
    const float qmax = scheme == KVS_SCHEME_INT8 ? 127.0f : 448.0f;
    for (uint32_t l = 0; l < layers; l++) {
        float k = 0, v = 0;
        for (uint32_t h = 0; h < heads; h++) {
            for (uint32_t d = 0; d < dim; d++) {
                float a = 0.25f + (float)(next() % 1000u) / 100.0f;
                p->k_scales[((size_t)l * heads + h) * dim + d] = a / qmax;
                k = a > k ? a : k;
            }
            float a = 0.5f + (float)(next() % 500u) / 100.0f;
            p->v_scales[(size_t)l * heads + h] = a / qmax;
            v = a > v ? a : v;
        }
        p->layers[l] = (kvs_profile_layer){k, v, k / qmax, v / qmax};
    }
    char *text = NULL;
    size_t len = 0;
    int rc = kvs_fuzz_profile_text(p, &text, &len);
    kvs_profile_free(p);
    return rc == 0 ? take_text(text, len, buf, cap) : 0;
}

static size_t profile_seed(unsigned i, uint8_t *buf, size_t cap)
{
    g_state = 0x5EED0003u + i;
    switch (i) {
    case 0:
        return make_profile(1, 1, 2, KVS_SCHEME_INT8, 1, "-", 0, buf, cap);
    case 1:
        return make_profile(2, 2, 4, KVS_SCHEME_FP8_E4M3, 1, "stories260K@23167b88d38820e3", 0, buf,
                            cap);
    case 2:
        return make_profile(3, 1, 8, KVS_SCHEME_FP8_E5M2, 0, "m", 0, buf, cap);
    case 3: /* "outliers k=3 v=2 sinks=1 key_offsets=1" */
        return make_profile(2, 3, 6, KVS_SCHEME_INT8, 1, "stories15M@716a448586d29838", 1, buf,
                            cap);
    default:
        return 0;
    }
}

/* ---- traces ------------------------------------------------------------------- */

static const char *const k_trace_kinds[] = {"chat", "sysprompt", "docs", "mix"};

static const char k_trace_text[] =
    "{\"timestamp\": 0, \"input_length\": 1024, \"output_length\": 3, \"hash_ids\": [0, 1]}\n"
    "\n"
    "{\"hash_ids\": [0, 1, 2], \"op\": \"lookup\"}\n"
    "{\"hash_ids\": [7, 8], \"op\": \"put\", \"extra\": {\"a\": [1, 2]}}\n"
    "{\"hash_ids\": [], \"timestamp\": 5}\n"
    "{\"hash_ids\": [4294967295, 0, 4294967295]}\n";

static size_t trace_seed(unsigned i, uint8_t *buf, size_t cap)
{
    const unsigned n = sizeof k_trace_kinds / sizeof k_trace_kinds[0];
    if (i == n) {
        size_t len = sizeof k_trace_text - 1;
        if (len > cap)
            return 0;
        memcpy(buf, k_trace_text, len);
        return len;
    }
    if (i > n)
        return 0;
    kvs_trace *t = NULL;
    if (kvs_trace_generate(k_trace_kinds[i], 12, 7 + i, &t) != 0)
        return 0;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    int rc = f ? kvs_trace_write(t, f) : KVS_EIO;
    if (f && fclose(f) != 0)
        rc = KVS_EIO;
    kvs_trace_free(t);
    if (rc != 0) {
        free(text);
        return 0;
    }
    return take_text(text, len, buf, cap);
}

/* ---- config files ------------------------------------------------------------- */

static const char *const k_configs[] = {
    "[kvstashd]\n"
    "listen = 127.0.0.1:50551\n"
    "threads = 4\n"
    "log_level = info\n"
    "max_message_bytes = 64MiB\n"
    "capacity = 1GiB\n"
    "high_watermark_pct = 95\n"
    "low_watermark_pct = 85\n"
    "policy = lru                 ; lru | leaflru | lfu | s3fifo | prefix\n"
    "lease_ms = 5000\n"
    "default_scheme = int8\n"
    "ingest_backend = auto\n"
    "key_offsets = off\n"
    "ucx = on\n",
    "; only comments and a model rule\n"
    "[model.llama-3-*]\n"
    "scheme = fp8_e4m3\n"
    "skip_layers = 0,31\n"
    "\n"
    "[model.llama-3-8b@1f0c]\n"
    "fp16 = true\n"
    "\n"
    "[model.qwen-*]\n"
    "key_offsets = yes\n",
    "[tenant.alice]\n"
    "scheme = int8\n"
    "quota = 512MiB\n"
    "[kvstashd]\n"
    "policy = prefix\n"
    "capacity = 3000000\n",
};

static size_t config_text(const char *s, uint8_t *buf, size_t cap)
{
    size_t len = strlen(s);
    if (len > cap)
        return 0;
    memcpy(buf, s, len);
    return len;
}

static size_t config_seed(unsigned i, uint8_t *buf, size_t cap)
{
    if (i >= sizeof k_configs / sizeof k_configs[0])
        return 0;
    return config_text(k_configs[i], buf, cap);
}

size_t kvs_fuzz_file_seed(kvs_fuzz_kind kind, unsigned i, uint8_t *buf, size_t cap)
{
    switch (kind) {
    case KVS_FUZZ_MODEL:
        return model_seed(i, buf, cap);
    case KVS_FUZZ_SAMPLE:
        return sample_seed(i, buf, cap);
    case KVS_FUZZ_PROFILE:
        return profile_seed(i, buf, cap);
    case KVS_FUZZ_TRACE:
        return trace_seed(i, buf, cap);
    case KVS_FUZZ_CONFIG:
        return config_seed(i, buf, cap);
    default:
        return 0;
    }
}

/* ---- regressions -------------------------------------------------------------- */

/* Checkpoint headers whose implied size overflows or lies, fields at their
 * bounds; each is followed by nothing or by a few bytes. */
static size_t model_regression(unsigned i, uint8_t *buf, size_t cap)
{
    static const int32_t hdr[][7] = {
        {1 << 30, 1 << 30, 1 << 30, 1, 1, 1 << 30, 1 << 16}, /* size overflows 64 bits */
        {8, 16, 1, 3, 1, 16, 8},                              /* heads do not divide dim */
        {8, 16, 1, 2, 1, INT32_MIN, 8},                       /* -vocab overflows */
        {6, 16, 1, 2, 1, 16, 8},                              /* head_dim 3: odd */
        {0, 0, 0, 0, 0, 0, 0},
    };
    const unsigned n = sizeof hdr / sizeof hdr[0];
    if (i < n) {
        if (cap < KVS_MODEL_HDR_BYTES + 64)
            return 0;
        memcpy(buf, hdr[i], KVS_MODEL_HDR_BYTES);
        memset(buf + KVS_MODEL_HDR_BYTES, 0, 64);
        return KVS_MODEL_HDR_BYTES + 64;
    }
    g_state = 0x5EED0011u;
    if (i == n) { /* a valid checkpoint one byte short */
        size_t len = model_seed_bytes(&k_models[0], buf, cap);
        return len ? len - 1 : 0;
    }
    if (i == n + 1) { /* one NaN weight in a valid checkpoint */
        size_t len = model_seed_bytes(&k_models[1], buf, cap);
        const float nan = NAN;
        if (len > KVS_MODEL_HDR_BYTES + 40)
            memcpy(buf + len - 40, &nan, 4);
        return len;
    }
    if (i == n + 2) /* valid: seq_len 1, vocab 3 */
        return model_seed_bytes(&k_models[2], buf, cap);
    return 0;
}

static size_t sample_regression(unsigned i, uint8_t *buf, size_t cap)
{
    g_state = 0x5EED0012u;
    size_t n = make_sample(&k_samples[1], KVS_FUZZ_MODE_SEAL, 0, buf, cap);
    if (n == 0)
        return 0;
    uint8_t *h = buf + 1;
    switch (i) {
    case 0: /* data_bytes far beyond the file (resealed, so the size check must catch it) */
    {
        uint64_t v = UINT64_MAX - 7;
        memcpy(h + offsetof(kvs_sample_hdr, data_bytes), &v, 8);
        return n;
    }
    case 1: /* tokens 0 */
        memset(h + offsetof(kvs_sample_hdr, tokens), 0, 4);
        return n;
    case 2: /* q heads not a multiple of kv heads */
    {
        uint16_t v = 3;
        memcpy(h + offsetof(kvs_sample_hdr, num_q_heads), &v, 2);
        return n;
    }
    case 3: /* a model name without its NUL padding, and a control byte */
        memset(h + offsetof(kvs_sample_hdr, model), 'a', KVS_SAMPLE_MODEL_LEN);
        h[offsetof(kvs_sample_hdr, model) + 5] = '\n';
        return n;
    case 4: /* a flipped data bit, not resealed: the checksum must catch it */
        buf[0] = 0;
        h[KVS_SAMPLE_HDR_BYTES + 3] ^= 0x10;
        return n;
    case 5: /* the header alone */
        return 1 + KVS_SAMPLE_HDR_BYTES;
    default:
        return 0;
    }
}

static size_t profile_regression(unsigned i, uint8_t *buf, size_t cap)
{
    g_state = 0x5EED0013u;
    size_t n = make_profile(2, 2, 4, KVS_SCHEME_INT8, 1, "m", i >= 4, buf, cap);
    if (n == 0)
        return 0;
    switch (i) {
    case 0: /* truncated in the middle */
        return n / 2;
    case 1: { /* a negative static scale: well formed, out of range */
        const uint8_t *k = memmem(buf, n, "\nk 0 0 ", 7);
        if (k == NULL || n + 1 > cap)
            return 0;
        size_t at = (size_t)(k - buf) + 7;
        memmove(buf + at + 1, buf + at, n - at);
        buf[at] = '-';
        return n + 1;
    }
    case 2: /* a NUL inside the text */
        buf[n / 3] = 0;
        return n;
    case 3: /* trailing junk line */
        if (n + 6 > cap)
            return 0;
        memcpy(buf + n, "extra\n", 6);
        return n + 6;
    case 4:   /* key_offsets=2: well formed, out of range (0 or 1) */
    case 5:   /* key_offsets=y: not a number */
    case 6: { /* a fifth field after key_offsets */
        uint8_t *f = memmem(buf, n, " key_offsets=1\n", 15);
        if (f == NULL || n + 4 > cap)
            return 0;
        if (i < 6) {
            f[13] = i == 4 ? '2' : 'y';
            return n;
        }
        memmove(f + 18, f + 14, n - (size_t)(f + 14 - buf));
        memcpy(f + 14, " x=1", 4);
        return n + 4;
    }
    default:
        return 0;
    }
}

static const char *const k_trace_regressions[] = {
    "{\"hash_ids\": [4294967296]}\n", /* past 2^32 - 1 */
    "{\"hash_ids\": [-1]}\n",
    "{\"hash_ids\": [1.5]}\n",
    "{\"hash_ids\": \"0 1 2\"}\n",
    "[0, 1, 2]\n",
    "{\"hash_ids\": [0, 1], \"op\": \"delete\"}\n",
    "{\"hash_ids\": [0, 1]\n", /* unterminated */
    "{\"hash_ids\": [0], \"op\": \"put\"}\n{\"hash_ids\": [0, 1]}\n",
    "", /* made in code: 200 nested arrays (json-c's depth limit) */
    "{\"hash_ids\": [0, 1]}\0{\"hash_ids\": [2]}\n", /* NUL byte mid-file (strlen stops) */
};
#define N_TRACE_REG (sizeof k_trace_regressions / sizeof k_trace_regressions[0])

static const char *const k_config_regressions[] = {
    "[kvstashd]\ncapacity = 99999999999999999999999GiB\n",
    "[bogus]\nthreads = 4\n",
    "threads = -1\n",
    "[kvstashd]\nno_such_setting = 1\n",
    "[model.x]\nscheme = int9\n",
    "[kvstashd]\nlisten\n", /* no '=' */
    "[kvstashd]\nthreads = 4\n[model.*]\nfp16 = maybe\n",
    "[model.m]\nprofile = /nonexistent/kvstash-profile.txt\n", /* a profile that cannot be read */
    "[model.m]\nprofile = /dev/null\n",                        /* not a regular file */
    "[kvstashd]\nkey_offsets = maybe\n",
    "[model.m]\nkey_offsets = on\nkey_offsets = off\n", /* given twice in one rule */
    "[model.m]\nscheme = int8\nkey_offsets = 2\n",
    "[kvstashd]\nthreads = 4\n", /* valid */
    "",                          /* valid: the empty file changes nothing */
};
#define N_CONFIG_REG (sizeof k_config_regressions / sizeof k_config_regressions[0])

unsigned kvs_fuzz_file_regression_count(kvs_fuzz_kind kind)
{
    switch (kind) {
    case KVS_FUZZ_MODEL:
        return 8;
    case KVS_FUZZ_SAMPLE:
        return 6;
    case KVS_FUZZ_PROFILE:
        return 7;
    case KVS_FUZZ_TRACE:
        return N_TRACE_REG;
    case KVS_FUZZ_CONFIG:
        return N_CONFIG_REG;
    default:
        return 0;
    }
}

int kvs_fuzz_file_regression_valid(kvs_fuzz_kind kind, unsigned i)
{
    switch (kind) {
    case KVS_FUZZ_MODEL:
        return i == 7;
    case KVS_FUZZ_TRACE:
        return i == 7;
    case KVS_FUZZ_CONFIG:
        return i >= N_CONFIG_REG - 2;
    default:
        return 0;
    }
}

size_t kvs_fuzz_file_regression(kvs_fuzz_kind kind, unsigned i, uint8_t *buf, size_t cap)
{
    switch (kind) {
    case KVS_FUZZ_MODEL:
        return model_regression(i, buf, cap);
    case KVS_FUZZ_SAMPLE:
        return sample_regression(i, buf, cap);
    case KVS_FUZZ_PROFILE:
        return profile_regression(i, buf, cap);
    case KVS_FUZZ_TRACE: {
        if (i >= N_TRACE_REG)
            return 0;
        if (i == 8) {
            if (cap < 201)
                return 0;
            memset(buf, '[', 200);
            buf[200] = '\n';
            return 201;
        }
        /* Entry 9 carries a NUL: its length is the literal's, not strlen's. */
        const char *s = k_trace_regressions[i];
        size_t len = i == 9 ? strlen(s) + 1 + strlen(s + strlen(s) + 1) : strlen(s);
        if (len > cap)
            return 0;
        memcpy(buf, s, len);
        return len;
    }
    case KVS_FUZZ_CONFIG:
        if (i >= N_CONFIG_REG)
            return 0;
        /* The empty file: a zero-length input is what "size 0" means here, but
         * the replay driver treats size 0 as "could not be made"; a lone
         * newline is the same empty configuration. */
        if (k_config_regressions[i][0] == '\0') {
            buf[0] = '\n';
            return 1;
        }
        return config_text(k_config_regressions[i], buf, cap);
    default:
        return 0;
    }
}
