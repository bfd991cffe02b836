/*
 * decoder_model.c — llama2.c checkpoints and synthetic models.
 *
 * Idea: the 28-byte header alone fixes the exact size of a valid file, so the
 * loader checks the header and compares the file size with it before it
 * allocates or reads anything else: a truncated, padded or hostile file is a
 * KVS_EFORMAT naming the field, never a huge allocation or a read out of
 * bounds. All size arithmetic is in uint64_t under bounds that keep every
 * product below 2^50.
 *
 * Invariants: a kvs_model owns one 64-byte aligned float buffer `w` holding
 * the weights in file order; the tensor pointers point into it; the
 * classifier points at the embedding when shared. The legacy RoPE tables are
 * skipped (the forward pass computes RoPE).
 */
#include "decoder_int.h"

#include "kvs_error.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

static uint64_t weight_floats(const kvs_model_config *c)
{
    const uint64_t d = c->dim, h = c->hidden_dim, L = c->n_layers, V = c->vocab_size;
    const uint64_t kvd = c->kv_dim, hs = c->head_dim, S = c->seq_len;
    uint64_t n = V * d;               /* token embedding */
    n += L * d;                       /* attention norm */
    n += L * d * d + 2 * L * kvd * d; /* wq, wk, wv */
    n += L * d * d;                   /* wo */
    n += L * d;                       /* ffn norm */
    n += 3 * L * h * d;               /* w1, w2, w3 */
    n += d;                           /* final norm */
    n += S * hs;                      /* two legacy RoPE tables of S*hs/2 */
    if (!c->shared_classifier)
        n += V * d;
    return n;
}

uint64_t kvs_model_file_bytes(const kvs_model_config *cfg)
{
    return KVS_MODEL_HDR_BYTES + 4 * weight_floats(cfg);
}

static int check_field(const char *name, int32_t v, uint32_t max, char *err)
{
    if (v <= 0 || (uint32_t)v > max)
        return kvs_fail(err, KVS_EFORMAT, "checkpoint header: %s = %d, expected 1..%u", name, v,
                        max);
    return 0;
}

int kvs_model_check_header(const int32_t hdr[7], uint64_t file_size, kvs_model_config *cfg,
                           char *err)
{
    if (hdr == NULL || cfg == NULL)
        return kvs_fail(err, KVS_EINVAL, "kvs_model_check_header: NULL argument");
    int32_t vocab = hdr[5];
    int shared = 1;
    if (vocab < 0) {
        if (vocab == INT32_MIN)
            return kvs_fail(err, KVS_EFORMAT, "checkpoint header: vocab_size = %d", vocab);
        vocab = -vocab;
        shared = 0;
    }
    int rc;
    if ((rc = check_field("dim", hdr[0], KVS_MODEL_MAX_DIM, err)) != 0 ||
        (rc = check_field("hidden_dim", hdr[1], KVS_MODEL_MAX_HIDDEN, err)) != 0 ||
        (rc = check_field("n_layers", hdr[2], KVS_MODEL_MAX_LAYERS, err)) != 0 ||
        (rc = check_field("n_heads", hdr[3], KVS_MODEL_MAX_HEADS, err)) != 0 ||
        (rc = check_field("n_kv_heads", hdr[4], KVS_BLOCK_MAX_HEADS, err)) != 0 ||
        (rc = check_field("vocab_size (absolute value)", vocab, KVS_MODEL_MAX_VOCAB, err)) != 0 ||
        (rc = check_field("seq_len", hdr[6], KVS_MODEL_MAX_SEQ, err)) != 0)
        return rc;
    kvs_model_config c;
    memset(&c, 0, sizeof c);
    c.dim = (uint32_t)hdr[0];
    c.hidden_dim = (uint32_t)hdr[1];
    c.n_layers = (uint32_t)hdr[2];
    c.n_heads = (uint32_t)hdr[3];
    c.n_kv_heads = (uint32_t)hdr[4];
    c.vocab_size = (uint32_t)vocab;
    c.seq_len = (uint32_t)hdr[6];
    c.shared_classifier = shared;
    if (c.dim % c.n_heads != 0)
        return kvs_fail(err, KVS_EFORMAT,
                        "checkpoint header: n_heads = %u does not divide dim = %u", c.n_heads,
                        c.dim);
    if (c.n_heads % c.n_kv_heads != 0)
        return kvs_fail(err, KVS_EFORMAT,
                        "checkpoint header: n_kv_heads = %u does not divide n_heads = %u",
                        c.n_kv_heads, c.n_heads);
    c.head_dim = c.dim / c.n_heads;
    c.kv_dim = c.n_kv_heads * c.head_dim;
    if (c.head_dim % 2 != 0 || c.head_dim > KVS_TILE_MAX_DIM)
        return kvs_fail(err, KVS_EFORMAT,
                        "checkpoint header: head_dim = dim / n_heads = %u, expected even and <= %u",
                        c.head_dim, KVS_TILE_MAX_DIM);
    uint64_t want = kvs_model_file_bytes(&c);
    if (file_size != want)
        return kvs_fail(err, KVS_EFORMAT,
                        "checkpoint size: %llu bytes, the header (dim %u, hidden %u, layers %u, "
                        "heads %u/%u, vocab %d, seq %u) implies %llu",
                        (unsigned long long)file_size, c.dim, c.hidden_dim, c.n_layers, c.n_heads,
                        c.n_kv_heads, hdr[5], c.seq_len, (unsigned long long)want);
    *cfg = c;
    return 0;
}

/* Points the tensors into m->w (file order). */
static void map_weights(kvs_model *m)
{
    const kvs_model_config *c = &m->cfg;
    const size_t d = c->dim, h = c->hidden_dim, L = c->n_layers, V = c->vocab_size;
    const size_t kvd = c->kv_dim;
    float *p = m->w;
    m->tok_emb = p, p += V * d;
    m->rms_att = p, p += L * d;
    m->wq = p, p += L * d * d;
    m->wk = p, p += L * kvd * d;
    m->wv = p, p += L * kvd * d;
    m->wo = p, p += L * d * d;
    m->rms_ffn = p, p += L * d;
    m->w1 = p, p += L * h * d;
    m->w2 = p, p += L * d * h;
    m->w3 = p, p += L * h * d;
    m->rms_final = p, p += d;
    p += (size_t)c->seq_len * c->head_dim; /* legacy RoPE tables */
    m->wcls = c->shared_classifier ? m->tok_emb : p;
}

static int model_alloc(const kvs_model_config *cfg, kvs_model **out, char *err)
{
    kvs_model *m = calloc(1, sizeof *m);
    if (m == NULL)
        return kvs_fail(err, KVS_ENOMEM, "model: out of memory");
    m->cfg = *cfg;
    m->n_floats = (size_t)weight_floats(cfg);
    size_t bytes = (m->n_floats * sizeof(float) + 63) & ~(size_t)63;
    m->w = aligned_alloc(64, bytes);
    if (m->w == NULL) {
        free(m);
        return kvs_fail(err, KVS_ENOMEM, "model: cannot allocate %zu bytes of weights", bytes);
    }
    map_weights(m);
    *out = m;
    return 0;
}

/* "<base name without .bin>@<16 hex>", limited to 64 printable characters. */
static void set_fingerprint(kvs_model *m, const char *name, uint64_t h)
{
    const char *base = name ? strrchr(name, '/') : NULL;
    base = base ? base + 1 : (name ? name : "model");
    size_t n = strlen(base);
    if (n > 4 && strcmp(base + n - 4, ".bin") == 0)
        n -= 4;
    if (n > 40)
        n = 40;
    char clean[41];
    for (size_t i = 0; i < n; i++)
        clean[i] = (base[i] > 0x20 && base[i] < 0x7F && base[i] != '@') ? base[i] : '_';
    clean[n] = '\0';
    snprintf(m->fingerprint, sizeof m->fingerprint, "%s@%016llx", n ? clean : "model",
             (unsigned long long)h);
}

static int finite_weights(const kvs_model *m, char *err)
{
    for (size_t i = 0; i < m->n_floats; i++)
        if (!isfinite(m->w[i]))
            return kvs_fail(err, KVS_EFORMAT, "checkpoint: weight %zu (byte %zu) is not finite", i,
                            KVS_MODEL_HDR_BYTES + 4 * i);
    return 0;
}

int kvs_model_parse(const void *buf, size_t len, const char *name, kvs_model **out, char *err)
{
    if (out == NULL || (buf == NULL && len > 0))
        return kvs_fail(err, KVS_EINVAL, "kvs_model_parse: NULL argument");
    *out = NULL;
    if (len < KVS_MODEL_HDR_BYTES)
        return kvs_fail(err, KVS_EFORMAT, "checkpoint: %zu bytes, shorter than the %u-byte header",
                        len, KVS_MODEL_HDR_BYTES);
    int32_t hdr[7];
    memcpy(hdr, buf, sizeof hdr);
    kvs_model_config cfg;
    int rc = kvs_model_check_header(hdr, len, &cfg, err);
    if (rc != 0)
        return rc;
    kvs_model *m;
    if ((rc = model_alloc(&cfg, &m, err)) != 0)
        return rc;
    memcpy(m->w, (const unsigned char *)buf + KVS_MODEL_HDR_BYTES, m->n_floats * sizeof(float));
    if ((rc = finite_weights(m, err)) != 0) {
        kvs_model_free(m);
        return rc;
    }
    set_fingerprint(m, name, XXH3_64bits(buf, len));
    *out = m;
    return 0;
}

int kvs_model_load(const char *path, kvs_model **out, char *err)
{
    if (path == NULL || out == NULL)
        return kvs_fail(err, KVS_EINVAL, "kvs_model_load: NULL argument");
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return kvs_fail(err, KVS_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return kvs_fail(err, KVS_EIO, "%s: not a regular file", path);
    }
    int32_t hdr[7];
    if (st.st_size < (off_t)KVS_MODEL_HDR_BYTES || fread(hdr, 1, sizeof hdr, f) != sizeof hdr) {
        fclose(f);
        return kvs_fail(err, KVS_EFORMAT, "%s: %lld bytes, shorter than the %u-byte header", path,
                        (long long)st.st_size, KVS_MODEL_HDR_BYTES);
    }
    kvs_model_config cfg;
    char why[KVS_ERR_LEN];
    int rc = kvs_model_check_header(hdr, (uint64_t)st.st_size, &cfg, why);
    if (rc != 0) {
        fclose(f);
        return kvs_fail(err, rc, "%s: %s", path, why);
    }
    kvs_model *m;
    if ((rc = model_alloc(&cfg, &m, err)) != 0) {
        fclose(f);
        return rc;
    }
    size_t got = fread(m->w, sizeof(float), m->n_floats, f);
    fclose(f);
    if (got != m->n_floats) {
        size_t want = m->n_floats;
        kvs_model_free(m);
        return kvs_fail(err, KVS_EIO, "%s: short read (%zu of %zu weights): file changed?", path,
                        got, want);
    }
    if ((rc = finite_weights(m, why)) != 0) {
        kvs_model_free(m);
        return kvs_fail(err, rc, "%s: %s", path, why);
    }
    XXH3_state_t *xs = XXH3_createState();
    if (xs == NULL) {
        kvs_model_free(m);
        return kvs_fail(err, KVS_ENOMEM, "model: out of memory");
    }
    XXH3_64bits_reset(xs);
    XXH3_64bits_update(xs, hdr, sizeof hdr);
    XXH3_64bits_update(xs, m->w, m->n_floats * sizeof(float));
    set_fingerprint(m, path, XXH3_64bits_digest(xs));
    XXH3_freeState(xs);
    *out = m;
    return 0;
}

/* ---- synthetic models ---------------------------------------------------------- */

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Uniform in [-a, a): variance a^2/3; a = sqrt(3/fan_in) gives variance 1/fan_in. */
static void fill_uniform(float *p, size_t n, float a, uint64_t *s)
{
    for (size_t i = 0; i < n; i++)
        p[i] = a * (float)((double)(splitmix(s) >> 11) * 0x1p-52 - 1.0);
}

static void fill_const(float *p, size_t n, float v)
{
    for (size_t i = 0; i < n; i++)
        p[i] = v;
}

int kvs_model_synthetic(const kvs_model_config *in, uint64_t seed, kvs_model **out, char *err)
{
    if (in == NULL || out == NULL)
        return kvs_fail(err, KVS_EINVAL, "kvs_model_synthetic: NULL argument");
    *out = NULL;
    int32_t hdr[7] = {(int32_t)in->dim,     (int32_t)in->hidden_dim, (int32_t)in->n_layers,
                      (int32_t)in->n_heads, (int32_t)in->n_kv_heads, (int32_t)in->vocab_size,
                      (int32_t)in->seq_len};
    if (in->dim > INT32_MAX || in->hidden_dim > INT32_MAX || in->n_layers > INT32_MAX ||
        in->n_heads > INT32_MAX || in->n_kv_heads > INT32_MAX || in->vocab_size > INT32_MAX ||
        in->seq_len > INT32_MAX)
        return kvs_fail(err, KVS_EINVAL, "synthetic model: a dimension is out of range");
    kvs_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.dim = in->dim;
    cfg.n_heads = in->n_heads ? in->n_heads : 1;
    cfg.n_kv_heads = in->n_kv_heads ? in->n_kv_heads : 1;
    cfg.head_dim = cfg.dim / cfg.n_heads;
    cfg.kv_dim = cfg.n_kv_heads * cfg.head_dim;
    cfg.seq_len = in->seq_len;
    cfg.vocab_size = in->vocab_size;
    cfg.hidden_dim = in->hidden_dim;
    cfg.n_layers = in->n_layers;
    cfg.shared_classifier = 1;
    char why[KVS_ERR_LEN];
    int rc = kvs_model_check_header(hdr, kvs_model_file_bytes(&cfg), &cfg, why);
    if (rc != 0)
        return kvs_fail(err, KVS_EINVAL, "synthetic model: %s", why);
    kvs_model *m;
    if ((rc = model_alloc(&cfg, &m, err)) != 0)
        return rc;
    const size_t d = cfg.dim, h = cfg.hidden_dim, L = cfg.n_layers, V = cfg.vocab_size;
    uint64_t s = seed;
    fill_uniform(m->tok_emb, V * d, 1.0f, &s);
    fill_const(m->rms_att, L * d, 1.0f);
    fill_uniform(m->wq, L * d * d, sqrtf(3.0f / (float)d), &s);
    fill_uniform(m->wk, L * cfg.kv_dim * d, sqrtf(3.0f / (float)d), &s);
    fill_uniform(m->wv, L * cfg.kv_dim * d, sqrtf(3.0f / (float)d), &s);
    fill_uniform(m->wo, L * d * d, sqrtf(3.0f / (float)d), &s);
    fill_const(m->rms_ffn, L * d, 1.0f);
    fill_uniform(m->w1, L * h * d, sqrtf(3.0f / (float)d), &s);
    fill_uniform(m->w2, L * d * h, sqrtf(3.0f / (float)h), &s);
    fill_uniform(m->w3, L * h * d, sqrtf(3.0f / (float)d), &s);
    fill_const(m->rms_final, d, 1.0f);
    fill_const(m->rms_final + d, (size_t)cfg.seq_len * cfg.head_dim, 0.0f);
    /* every input of the weights: the fingerprint is the namespace's model */
    snprintf(m->fingerprint, sizeof m->fingerprint, "synthetic-d%u-l%u-h%u-kv%u-f%u-v%u-s%u@%llx",
             cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.hidden_dim, cfg.vocab_size,
             cfg.seq_len, (unsigned long long)seed);
    *out = m;
    return 0;
}

int kvs_model_synthetic_spec(const char *spec, kvs_model_config *cfg, char *err)
{
    if (spec == NULL || cfg == NULL)
        return kvs_fail(err, KVS_EINVAL, "synthetic model spec: NULL argument");
    memset(cfg, 0, sizeof *cfg);
    cfg->dim = 256, cfg->n_layers = 4, cfg->n_heads = 8, cfg->n_kv_heads = 4;
    cfg->vocab_size = 512, cfg->seq_len = 512;
    int hidden_given = 0;
    const char *p = spec;
    while (*p) {
        const char *eq = strchr(p, '=');
        if (eq == NULL)
            return kvs_fail(err, KVS_EINVAL, "synthetic model spec: expected name=value at '%s'",
                            p);
        size_t nlen = (size_t)(eq - p);
        char *end;
        errno = 0;
        unsigned long v = strtoul(eq + 1, &end, 10);
        if (end == eq + 1 || errno != 0 || v == 0 || v > INT32_MAX || (*end && *end != ','))
            return kvs_fail(err, KVS_EINVAL, "synthetic model spec: bad value for '%.*s'",
                            (int)nlen, p);
        uint32_t *dst = NULL;
#define KEY(s) (nlen == sizeof(s) - 1 && strncmp(p, s, nlen) == 0)
        if (KEY("dim"))
            dst = &cfg->dim;
        else if (KEY("layers"))
            dst = &cfg->n_layers;
        else if (KEY("heads"))
            dst = &cfg->n_heads;
        else if (KEY("kv_heads"))
            dst = &cfg->n_kv_heads;
        else if (KEY("vocab"))
            dst = &cfg->vocab_size;
        else if (KEY("seq"))
            dst = &cfg->seq_len;
        else if (KEY("hidden"))
            dst = &cfg->hidden_dim, hidden_given = 1;
#undef KEY
        if (dst == NULL)
            return kvs_fail(err, KVS_EINVAL,
                            "synthetic model spec: unknown key '%.*s' (dim, layers, heads, "
                            "kv_heads, vocab, seq, hidden)",
                            (int)nlen, p);
        *dst = (uint32_t)v;
        p = *end ? end + 1 : end;
    }
    if (!hidden_given) {
        uint32_t h = (uint32_t)((8ull * cfg->dim + 2) / 3);
        cfg->hidden_dim = (h + 31) / 32 * 32;
    }
    return 0;
}

const kvs_model_config *kvs_model_cfg(const kvs_model *m)
{
    return &m->cfg;
}

const char *kvs_model_fingerprint(const kvs_model *m)
{
    return m->fingerprint;
}

void kvs_model_free(kvs_model *m)
{
    if (m == NULL)
        return;
    free(m->w);
    free(m);
}
