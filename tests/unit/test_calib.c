/*
 * test_calib.c — kernels/calib (kvq_calib.h): sample files, the calibration
 * accumulator, profiles, and static scales in the quantizer.
 *
 * Sample files: a round trip for every dtype with and without queries, the
 * documented byte offsets, and one case per validation rule (each field out
 * of range, truncation at the header and in the data, trailing bytes, a
 * flipped bit in data and in header fields that pass the range checks), from
 * memory and from disk. Percentiles: against a sort-based nearest-rank oracle
 * on data spanning 2^-20..2^18 with ties, zeros, NaN and Inf, within the
 * documented 1/64 bound; "kept" statistics against an independent top-k
 * oracle. Profiles: a bit-exact round trip and one case per grammar rule,
 * plus every truncation of a valid text. Static scales: calibrating on the
 * data itself with percentile 100 reproduces the dynamic tile bit for bit
 * (flag aside); beyond a static scale values saturate; the flag is set.
 */
#include "kvq.h"
#include "kvq_calib.h"
#include "kvq_math.h"

#include "kvs_error.h"
#include "kvs_test.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------------- */

static uint64_t rng_state = 0x853c49e6748fea9bULL;

static void rng_seed(uint64_t s)
{
    rng_state = s * 0x9E3779B97F4A7C15ULL + 1;
}

static uint64_t rnd_u64(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static double rnd_unif(void)
{
    return (double)(rnd_u64() >> 11) * 0x1p-53;
}

static double rnd_norm(void)
{
    double u = rnd_unif(), v = rnd_unif();
    if (u < 1e-300)
        u = 1e-300;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* A temporary file name; the file exists (empty) until unlinked. */
static void tmp_path(char *buf, size_t n)
{
    const char *dir = getenv("TMPDIR");
    snprintf(buf, n, "%s/kvs-calib-XXXXXX", dir && dir[0] ? dir : "/tmp");
    int fd = mkstemp(buf);
    CU_ASSERT_FATAL(fd >= 0);
    close(fd);
}

static unsigned char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(n > 0 ? (size_t)n : 1);
    *len = fread(b, 1, (size_t)n, f);
    fclose(f);
    return b;
}

static void spill(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    CU_ASSERT_FATAL(f != NULL);
    CU_ASSERT(fwrite(buf, 1, len, f) == len);
    fclose(f);
}

static int contains(const char *s, const char *sub)
{
    return strstr(s, sub) != NULL;
}

static kvs_sample_info tiny_info(kvs_dtype dt, int queries)
{
    kvs_sample_info in;
    memset(&in, 0, sizeof in);
    in.num_layers = 3;
    in.num_kv_heads = 2;
    in.head_dim = 8;
    in.num_q_heads = queries ? 4 : 0;
    in.tokens = 37;
    in.first_pos = 5;
    in.dtype = dt;
    in.flags = KVS_SAMPLE_F_POST_ROPE | (queries ? KVS_SAMPLE_F_QUERIES : 0);
    strcpy(in.model, "tiny-model_v1");
    return in;
}

/* Stores x at (part, layer, t, h, d) in the sample's dtype. */
static void put(kvs_sample *s, kvs_sample_part part, uint32_t l, uint32_t t, uint32_t h, uint32_t d,
                float x)
{
    const kvs_sample_info *in = &s->info;
    uint32_t heads = part == KVS_SAMPLE_Q ? in->num_q_heads : in->num_kv_heads;
    unsigned char *base = kvs_sample_part_ptr(s, part, l);
    size_t i = ((size_t)t * heads + h) * in->head_dim + d;
    if (in->dtype == KVS_DTYPE_FP32) {
        memcpy(base + 4 * i, &x, 4);
    } else {
        uint16_t b = in->dtype == KVS_DTYPE_FP16 ? kvq_f32_to_fp16(x) : kvq_f32_to_bf16(x);
        memcpy(base + 2 * i, &b, 2);
    }
}

/* What put() stores, widened back: the value a reader must return. */
static float stored(kvs_dtype dt, float x)
{
    if (dt == KVS_DTYPE_FP16)
        return kvq_fp16_to_f32(kvq_f32_to_fp16(x));
    if (dt == KVS_DTYPE_BF16)
        return kvq_bf16_to_f32(kvq_f32_to_bf16(x));
    return x;
}

static float gen_value(kvs_sample_part part, uint32_t l, uint32_t t, uint32_t h, uint32_t d)
{
    return (float)((int)part * 1000 + (int)l * 100 + (int)h * 10 + (int)d) * 0.37f -
           (float)t * 1.25f;
}

static kvs_sample *make_tiny(kvs_dtype dt, int queries)
{
    kvs_sample_info in = tiny_info(dt, queries);
    kvs_sample *s = NULL;
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_FATAL(kvs_sample_create(&in, &s, err) == 0);
    for (uint32_t p = 0; p < (queries ? 3u : 2u); p++) {
        uint32_t heads = p == KVS_SAMPLE_Q ? in.num_q_heads : in.num_kv_heads;
        for (uint32_t l = 0; l < in.num_layers; l++)
            for (uint32_t t = 0; t < in.tokens; t++)
                for (uint32_t h = 0; h < heads; h++)
                    for (uint32_t d = 0; d < in.head_dim; d++)
                        put(s, (kvs_sample_part)p, l, t, h, d,
                            gen_value((kvs_sample_part)p, l, t, h, d));
    }
    return s;
}

/* The encoded file image of a sample. */
static unsigned char *image_of(const kvs_sample *s, size_t *len)
{
    char path[256], err[KVS_ERR_LEN] = "";
    tmp_path(path, sizeof path);
    CU_ASSERT_FATAL(kvs_sample_write(path, s, err) == 0);
    unsigned char *b = slurp(path, len);
    unlink(path);
    return b;
}

/* Default calibration options but for the scheme and the outlier and sink counts. */
static kvs_calib_opts calib_opts(kvs_scheme scheme, uint32_t kK, uint32_t kV, uint32_t S)
{
    kvs_calib_opts o;
    kvs_calib_opts_default(&o);
    o.scheme = scheme;
    o.k_outliers = kK;
    o.v_outliers = kV;
    o.sinks = S;
    return o;
}

/* A calibration of o with the sample s added; a failure fails the test (fatal). */
static kvs_calib *calib_with(const kvs_calib_opts *o, const kvs_sample *s)
{
    char err[KVS_ERR_LEN] = "";
    kvs_calib *c = NULL;
    CU_ASSERT_FATAL(kvs_calib_create(o, &c, err) == 0);
    CU_ASSERT_FATAL(kvs_calib_add(c, s, err) == 0);
    return c;
}

/* ---- sample files -------------------------------------------------------------- */

static void test_sample_roundtrip(void)
{
    const kvs_dtype dts[] = {KVS_DTYPE_FP16, KVS_DTYPE_BF16, KVS_DTYPE_FP32};
    for (int di = 0; di < 3; di++)
        for (int q = 0; q <= 1; q++) {
            kvs_sample *s = make_tiny(dts[di], q);
            char path[256], err[KVS_ERR_LEN] = "";
            tmp_path(path, sizeof path);
            CU_ASSERT_FATAL(kvs_sample_write(path, s, err) == 0);
            kvs_sample *r = NULL;
            int rc = kvs_sample_read(path, &r, err);
            CU_ASSERT_EQUAL_FATAL(rc, 0);
            const kvs_sample_info *a = &s->info, *b = &r->info;
            CU_ASSERT_EQUAL(b->num_layers, 3);
            CU_ASSERT_EQUAL(b->num_kv_heads, 2);
            CU_ASSERT_EQUAL(b->head_dim, 8);
            CU_ASSERT_EQUAL(b->num_q_heads, q ? 4u : 0u);
            CU_ASSERT_EQUAL(b->tokens, 37);
            CU_ASSERT_EQUAL(b->first_pos, 5);
            CU_ASSERT_EQUAL(b->dtype, dts[di]);
            CU_ASSERT_EQUAL(b->flags, a->flags);
            CU_ASSERT_STRING_EQUAL(b->model, "tiny-model_v1");
            CU_ASSERT_EQUAL(r->data_bytes, s->data_bytes);
            CU_ASSERT(memcmp(r->data, s->data, s->data_bytes) == 0);
            /* Element access through the documented layout. */
            int bad = 0;
            for (uint32_t p = 0; p < (q ? 3u : 2u); p++)
                for (uint32_t l = 0; l < 3; l++)
                    for (uint32_t t = 0; t < 37; t += 6)
                        for (uint32_t h = 0; h < (p == 2 ? 4u : 2u); h++)
                            for (uint32_t d = 0; d < 8; d += 3) {
                                float want =
                                    stored(dts[di], gen_value((kvs_sample_part)p, l, t, h, d));
                                float got = kvs_sample_value(r, (kvs_sample_part)p, l, t, h, d);
                                bad += got != want;
                            }
            CU_ASSERT_EQUAL(bad, 0);
            CU_ASSERT(q ? kvs_sample_part_ptr(r, KVS_SAMPLE_Q, 0) != NULL
                        : kvs_sample_part_ptr(r, KVS_SAMPLE_Q, 0) == NULL);
            CU_ASSERT(kvs_sample_part_ptr(r, KVS_SAMPLE_K, 3) == NULL);

            /* The bytes on disk: documented offsets and size. */
            size_t len;
            unsigned char *img = slurp(path, &len);
            size_t es = dts[di] == KVS_DTYPE_FP32 ? 4 : 2;
            size_t data = 3 * (2 * 2 + (q ? 4 : 0)) * 37 * 8 * es;
            CU_ASSERT_EQUAL(len, KVS_SAMPLE_HDR_BYTES + data);
            CU_ASSERT(memcmp(img, "KVSM", 4) == 0);
            CU_ASSERT_EQUAL(img[4] | img[5] << 8, 1);           /* version */
            CU_ASSERT_EQUAL(img[6], (unsigned)dts[di]);         /* dtype */
            CU_ASSERT_EQUAL(img[8] | img[9] << 8, 3);           /* num_layers */
            CU_ASSERT_EQUAL(img[10] | img[11] << 8, 2);         /* num_kv_heads */
            CU_ASSERT_EQUAL(img[12] | img[13] << 8, 8);         /* head_dim */
            CU_ASSERT_EQUAL(img[14] | img[15] << 8, q ? 4 : 0); /* num_q_heads */
            CU_ASSERT_EQUAL(img[16] | img[17] << 8, 37);        /* tokens */
            CU_ASSERT_EQUAL(img[20], 5);                        /* first_pos */
            CU_ASSERT(memcmp(img + 48, "tiny-model_v1", 13) == 0 && img[61] == 0);
            /* Layer 1's V starts after layer 0 (K, V, Q) and layer 1's K. */
            size_t kv = 37 * 2 * 8 * es, qb = q ? 37 * 4 * 8 * es : 0;
            CU_ASSERT(memcmp(img + KVS_SAMPLE_HDR_BYTES + (2 * kv + qb) + kv,
                             kvs_sample_part_ptr(s, KVS_SAMPLE_V, 1), kv) == 0);
            /* The checksum: XXH3-64 of the header with the field zeroed, then the data. */
            uint64_t stored_sum;
            memcpy(&stored_sum, img + 40, 8);
            memset(img + 40, 0, 8);
            CU_ASSERT_EQUAL(kvs_tile_checksum(img, len), stored_sum);
            free(img);

            kvs_sample_free(r);
            kvs_sample_free(s);
            unlink(path);
        }
}

typedef struct corrupt_case {
    const char *name;
    size_t off; /* byte to change */
    int width;  /* 1, 2, 4 or 8 */
    uint64_t value;
    const char *want; /* in the message */
} corrupt_case;

static void put_le(unsigned char *p, int width, uint64_t v)
{
    for (int i = 0; i < width; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void test_sample_corrupt_header(void)
{
    kvs_sample *s = make_tiny(KVS_DTYPE_FP16, 1);
    size_t len;
    unsigned char *img = image_of(s, &len);
    const corrupt_case cases[] = {
        {"magic", 0, 4, 0x4D53564Cu, "bad magic"},
        {"version", 4, 2, 2, "version"},
        {"dtype 0", 6, 1, 0, "dtype"},
        {"dtype 4", 6, 1, 4, "dtype"},
        {"flags", 7, 1, 0x83, "flags"},
        {"layers 0", 8, 2, 0, "num_layers"},
        {"layers 1025", 8, 2, 1025, "num_layers"},
        {"heads 0", 10, 2, 0, "num_kv_heads"},
        {"heads 257", 10, 2, 257, "num_kv_heads"},
        {"dim 0", 12, 2, 0, "head_dim"},
        {"dim 1025", 12, 2, 1025, "head_dim"},
        {"q heads 3", 14, 2, 3, "num_q_heads"},
        {"q heads 0 with flag", 14, 2, 0, "num_q_heads"},
        {"q heads 2048", 14, 2, 2048, "num_q_heads"},
        {"queries flag cleared", 7, 1, KVS_SAMPLE_F_POST_ROPE, "num_q_heads"},
        {"tokens 0", 16, 4, 0, "tokens"},
        {"tokens 2^20+1", 16, 4, (1u << 20) + 1, "tokens"},
        {"data_bytes", 24, 8, 0, "data_bytes"},
        {"data_bytes+1", 24, 8, 0, "data_bytes"}, /* value set below */
        {"reserved", 32, 8, 1, "reserved"},
        {"model control byte", 50, 1, 0x01, "model"},
        {"model space", 50, 1, ' ', "model"},
        {"model after NUL", 100, 1, 'x', "model"},
        {"first_pos (checksummed)", 20, 4, 6, "checksum"},
        {"checksum", 40, 8, 0x1234, "checksum"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unsigned char *b = malloc(len);
        memcpy(b, img, len);
        uint64_t v = cases[i].value;
        if (strcmp(cases[i].name, "data_bytes+1") == 0) {
            memcpy(&v, img + 24, 8);
            v++;
        }
        put_le(b + cases[i].off, cases[i].width, v);
        char err[KVS_ERR_LEN] = "";
        kvs_sample *r = NULL;
        int rc = kvs_sample_parse(b, len, &r, err);
        if (rc != KVS_EFORMAT || !contains(err, cases[i].want))
            printf("\n  case '%s': rc=%d err='%s'", cases[i].name, rc, err);
        CU_ASSERT_EQUAL(rc, KVS_EFORMAT);
        CU_ASSERT(contains(err, cases[i].want));
        CU_ASSERT(r == NULL);
        /* The same from a file. */
        char path[256];
        tmp_path(path, sizeof path);
        spill(path, b, len);
        err[0] = '\0';
        rc = kvs_sample_read(path, &r, err);
        CU_ASSERT_EQUAL(rc, KVS_EFORMAT);
        CU_ASSERT(contains(err, cases[i].want));
        CU_ASSERT(contains(err, path));
        CU_ASSERT(r == NULL);
        unlink(path);
        free(b);
    }
    /* A shape beyond the 4 GiB data limit, with data_bytes consistent. */
    {
        unsigned char *b = malloc(len);
        memcpy(b, img, len);
        put_le(b + 7, 1, 0);     /* no queries */
        put_le(b + 8, 2, 1024);  /* layers */
        put_le(b + 10, 2, 256);  /* heads */
        put_le(b + 12, 2, 1024); /* dim */
        put_le(b + 14, 2, 0);
        put_le(b + 16, 4, 1u << 20); /* tokens */
        put_le(b + 24, 8, (uint64_t)1024 * 512 * 1024 * (1u << 20) * 2);
        char err[KVS_ERR_LEN] = "";
        kvs_sample *r = NULL;
        CU_ASSERT_EQUAL(kvs_sample_parse(b, len, &r, err), KVS_EFORMAT);
        CU_ASSERT(contains(err, "limit"));
        free(b);
    }
    free(img);
    kvs_sample_free(s);
}

static void test_sample_corrupt_body(void)
{
    kvs_sample *s = make_tiny(KVS_DTYPE_BF16, 0);
    size_t len;
    unsigned char *img = image_of(s, &len);
    char err[KVS_ERR_LEN];
    kvs_sample *r = NULL;
    /* Truncated header at several lengths, and an empty buffer. */
    const size_t cuts[] = {0, 1, 4, 50, KVS_SAMPLE_HDR_BYTES - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        err[0] = '\0';
        CU_ASSERT_EQUAL(kvs_sample_parse(img, cuts[i], &r, err), KVS_EFORMAT);
        CU_ASSERT(contains(err, "truncated header"));
        char path[256];
        tmp_path(path, sizeof path);
        spill(path, img, cuts[i]);
        err[0] = '\0';
        CU_ASSERT_EQUAL(kvs_sample_read(path, &r, err), KVS_EFORMAT);
        CU_ASSERT(contains(err, "truncated header"));
        unlink(path);
    }
    /* Truncated data, from one byte short to the header alone. */
    const size_t short_by[] = {1, 2, 100, len - KVS_SAMPLE_HDR_BYTES};
    for (size_t i = 0; i < sizeof short_by / sizeof short_by[0]; i++) {
        err[0] = '\0';
        CU_ASSERT_EQUAL(kvs_sample_parse(img, len - short_by[i], &r, err), KVS_EFORMAT);
        CU_ASSERT(contains(err, "truncated:"));
        char path[256];
        tmp_path(path, sizeof path);
        spill(path, img, len - short_by[i]);
        err[0] = '\0';
        CU_ASSERT_EQUAL(kvs_sample_read(path, &r, err), KVS_EFORMAT);
        CU_ASSERT(contains(err, "truncated:"));
        unlink(path);
    }
    /* Trailing bytes. */
    {
        unsigned char *b = calloc(1, len + 3);
        memcpy(b, img, len);
        err[0] = '\0';
        CU_ASSERT_EQUAL(kvs_sample_parse(b, len + 3, &r, err), KVS_EFORMAT);
        CU_ASSERT(contains(err, "3 trailing bytes"));
        char path[256];
        tmp_path(path, sizeof path);
        spill(path, b, len + 3);
        err[0] = '\0';
        CU_ASSERT_EQUAL(kvs_sample_read(path, &r, err), KVS_EFORMAT);
        CU_ASSERT(contains(err, "trailing"));
        unlink(path);
        free(b);
    }
    /* One flipped bit anywhere in the data, at a few places. */
    const size_t at[] = {KVS_SAMPLE_HDR_BYTES, KVS_SAMPLE_HDR_BYTES + 777, len - 1};
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        unsigned char *b = malloc(len);
        memcpy(b, img, len);
        b[at[i]] ^= 0x10;
        err[0] = '\0';
        CU_ASSERT_EQUAL(kvs_sample_parse(b, len, &r, err), KVS_EFORMAT);
        CU_ASSERT(contains(err, "checksum mismatch"));
        free(b);
    }
    CU_ASSERT(r == NULL);
    /* The untouched image still parses. */
    CU_ASSERT_EQUAL(kvs_sample_parse(img, len, &r, err), 0);
    kvs_sample_free(r);
    /* Files that cannot be read at all. */
    err[0] = '\0';
    r = NULL;
    CU_ASSERT_EQUAL(kvs_sample_read("/nonexistent/kvs/sample", &r, err), KVS_EIO);
    CU_ASSERT(contains(err, "cannot open"));
    CU_ASSERT_EQUAL(kvs_sample_read("/tmp", &r, err), KVS_EIO);
    CU_ASSERT(r == NULL);
    free(img);
    kvs_sample_free(s);
}

static void test_sample_write_errors(void)
{
    char err[KVS_ERR_LEN] = "";
    kvs_sample_info in = tiny_info(KVS_DTYPE_FP16, 0);
    kvs_sample *s = NULL;
    in.head_dim = 0;
    CU_ASSERT_EQUAL(kvs_sample_create(&in, &s, err), KVS_EINVAL);
    CU_ASSERT(contains(err, "head_dim"));
    in = tiny_info(KVS_DTYPE_FP16, 0);
    strcpy(in.model, "has space");
    CU_ASSERT_EQUAL(kvs_sample_create(&in, &s, err), KVS_EINVAL);
    CU_ASSERT(contains(err, "model"));
    in = tiny_info(KVS_DTYPE_FP16, 0);
    in.num_q_heads = 2; /* without the flag */
    CU_ASSERT_EQUAL(kvs_sample_create(&in, &s, err), KVS_EINVAL);
    CU_ASSERT(s == NULL);
    s = make_tiny(KVS_DTYPE_FP16, 0);
    CU_ASSERT_EQUAL(kvs_sample_write("/nonexistent/dir/x.kvsm", s, err), KVS_EIO);
    CU_ASSERT(contains(err, "cannot create"));
    const void *k[3] = {NULL, NULL, NULL};
    CU_ASSERT_EQUAL(kvs_sample_write_layers("/tmp/unused", &s->info, k, k, NULL, err), KVS_EINVAL);
    kvs_sample_free(s);
}

/* ---- percentiles ----------------------------------------------------------------- */

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Nearest rank of per-mille q (500, 990, 999, 1000) of n sorted values. */
static float oracle_pct(const float *sorted, size_t n, unsigned permille)
{
    if (n == 0)
        return 0.0f;
    size_t r = ((size_t)permille * n + 999) / 1000;
    if (r < 1)
        r = 1;
    return sorted[r - 1];
}

/* The documented bound: 0 below 2^-16, the exact max at or above 2^16, else
 * within 1/64 relative. */
static int pct_ok(float est, float truth, float amax)
{
    if (truth < 0x1p-16f)
        return est == 0.0f;
    if (truth >= 0x1p16f)
        return est == amax;
    return fabsf(est - truth) <= truth / 64.0f * 1.000001f;
}

/* A value of channel d's distribution. */
static float wide_value(uint32_t d, uint32_t t)
{
    double sign = (rnd_u64() & 1) ? -1.0 : 1.0;
    switch (d) {
    case 0: /* log-uniform magnitudes over 2^-20..2^18 */
        return (float)(sign * exp2(-20.0 + 38.0 * rnd_unif()));
    case 1:
        return (float)rnd_norm();
    case 2: /* ties and zeros */
        return rnd_unif() < 0.3 ? 0.0f : (float)(sign * (double)(rnd_u64() % 16) / 8.0);
    default: /* heavy tail with non-finite values sprinkled in */
        if (t % 97 == 3)
            return NAN;
        if (t % 131 == 7)
            return sign > 0 ? INFINITY : -INFINITY;
        return (float)(sign * exp2(10.0 * rnd_unif()) * (rnd_unif() < 0.01 ? 300.0 : 1.0));
    }
}

/* Independent top-k: the k largest |x| of g[0..n), Inf first, ties to the
 * lower index, NaN last; marks them in out. */
static void oracle_topk(const float *g, uint32_t n, uint32_t k, unsigned char *out)
{
    memset(out, 0, n);
    for (uint32_t j = 0; j < k && j < n; j++) {
        int best = -1;
        for (uint32_t i = 0; i < n; i++) {
            if (out[i])
                continue;
            if (best < 0) {
                best = (int)i;
                continue;
            }
            float a = g[i], b = g[best];
            int anan = isnan(a), bnan = isnan(b);
            if (bnan && !anan)
                best = (int)i;
            else if (!anan && !bnan && fabsf(a) > fabsf(b))
                best = (int)i;
        }
        out[best] = 1;
    }
}

static void test_percentiles_vs_oracle(void)
{
    rng_seed(11);
    const uint32_t L = 1, H = 2, D = 4, N = 5000, T = 256, kK = 2, kV = 1, S = 3;
    kvs_sample_info in;
    memset(&in, 0, sizeof in);
    in.num_layers = L;
    in.num_kv_heads = H;
    in.head_dim = D;
    in.tokens = N;
    in.first_pos = 0; /* a root tile with S sinks, then 19 tiles and a partial one */
    in.dtype = KVS_DTYPE_FP32;
    kvs_sample *s = NULL;
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_FATAL(kvs_sample_create(&in, &s, err) == 0);
    for (uint32_t h = 0; h < H; h++)
        for (uint32_t t = 0; t < N; t++)
            for (uint32_t d = 0; d < D; d++) {
                put(s, KVS_SAMPLE_K, 0, t, h, d, wide_value(d, t));
                put(s, KVS_SAMPLE_V, 0, t, h, d, wide_value((d + h + t) % 4, t));
            }
    kvs_calib_opts o = calib_opts(KVS_SCHEME_INT8, kK, kV, S);
    o.block_tokens = T;
    o.percentile = 99.0;
    kvs_calib *c = calib_with(&o, s);
    CU_ASSERT_EQUAL(kvs_calib_samples(c), 1);
    CU_ASSERT_EQUAL(kvs_calib_tokens(c), N);

    float *all = malloc(sizeof(float) * N * D), *kept = malloc(sizeof(float) * N * D);
    float *g = malloc(sizeof(float) * (T > D ? T : D));
    unsigned char *mark = malloc(T > D ? T : D);
    int bad = 0;
    for (uint32_t h = 0; h < H; h++) {
        /* K channels */
        for (uint32_t d = 0; d < D; d++) {
            size_t na = 0, nk = 0, nonfinite = 0;
            float amax = 0, kamax = 0;
            for (uint32_t t0 = 0; t0 < N; t0 += T) {
                uint32_t n = N - t0 < T ? N - t0 : T, sink = t0 == 0 ? S : 0;
                for (uint32_t i = 0; i < n; i++) {
                    g[i] = kvs_sample_value(s, KVS_SAMPLE_K, 0, t0 + i, h, d);
                    if (isfinite(g[i])) {
                        all[na++] = fabsf(g[i]);
                        amax = fmaxf(amax, fabsf(g[i]));
                    } else {
                        nonfinite++;
                    }
                }
                oracle_topk(g + sink, n - sink, kK, mark);
                for (uint32_t i = 0; i < n - sink; i++)
                    if (!mark[i] && isfinite(g[sink + i])) {
                        kept[nk++] = fabsf(g[sink + i]);
                        kamax = fmaxf(kamax, fabsf(g[sink + i]));
                    }
            }
            qsort(all, na, sizeof *all, cmp_f);
            qsort(kept, nk, sizeof *kept, cmp_f);
            kvs_calib_stats st;
            CU_ASSERT_EQUAL_FATAL(kvs_calib_k_stats(c, 0, h, d, &st), 0);
            bad += st.count != na;
            bad += st.nonfinite != nonfinite;
            bad += st.amax != amax;
            bad += st.kept != nk;
            bad += st.kept_amax != kamax;
            bad += !pct_ok(st.p50, oracle_pct(all, na, 500), amax);
            bad += !pct_ok(st.p99, oracle_pct(all, na, 990), amax);
            bad += !pct_ok(st.p999, oracle_pct(all, na, 999), amax);
            bad += !pct_ok(st.kept_pct, oracle_pct(kept, nk, 990), kamax);
            if (bad)
                printf("\n  K h%u d%u: count %llu/%zu p50 %g/%g p99 %g/%g p999 %g/%g kept %g/%g", h,
                       d, (unsigned long long)st.count, na, (double)st.p50,
                       (double)oracle_pct(all, na, 500), (double)st.p99,
                       (double)oracle_pct(all, na, 990), (double)st.p999,
                       (double)oracle_pct(all, na, 999), (double)st.kept_pct,
                       (double)oracle_pct(kept, nk, 990));
        }
        /* V head: rows are the groups; sink rows only count in "all". */
        size_t na = 0, nk = 0;
        float amax = 0, kamax = 0;
        for (uint32_t t = 0; t < N; t++) {
            for (uint32_t d = 0; d < D; d++) {
                g[d] = kvs_sample_value(s, KVS_SAMPLE_V, 0, t, h, d);
                if (isfinite(g[d])) {
                    all[na++] = fabsf(g[d]);
                    amax = fmaxf(amax, fabsf(g[d]));
                }
            }
            if (t < S)
                continue;
            oracle_topk(g, D, kV, mark);
            for (uint32_t d = 0; d < D; d++)
                if (!mark[d] && isfinite(g[d])) {
                    kept[nk++] = fabsf(g[d]);
                    kamax = fmaxf(kamax, fabsf(g[d]));
                }
        }
        qsort(all, na, sizeof *all, cmp_f);
        qsort(kept, nk, sizeof *kept, cmp_f);
        kvs_calib_stats st;
        CU_ASSERT_EQUAL_FATAL(kvs_calib_v_stats(c, 0, h, &st), 0);
        CU_ASSERT_EQUAL(st.count, na);
        CU_ASSERT_EQUAL(st.kept, nk);
        CU_ASSERT_EQUAL(st.amax, amax);
        CU_ASSERT_EQUAL(st.kept_amax, kamax);
        CU_ASSERT(pct_ok(st.p50, oracle_pct(all, na, 500), amax));
        CU_ASSERT(pct_ok(st.p99, oracle_pct(all, na, 990), amax));
        CU_ASSERT(pct_ok(st.p999, oracle_pct(all, na, 999), amax));
        CU_ASSERT(pct_ok(st.kept_pct, oracle_pct(kept, nk, 990), kamax));
    }
    CU_ASSERT_EQUAL(bad, 0);
    /* Out of range. */
    kvs_calib_stats st;
    CU_ASSERT_EQUAL(kvs_calib_k_stats(c, 1, 0, 0, &st), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_calib_k_stats(c, 0, 0, D, &st), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_calib_v_stats(c, 0, H, &st), KVS_EINVAL);
    free(all);
    free(kept);
    free(g);
    free(mark);
    kvs_calib_free(c);
    kvs_sample_free(s);
}

/* Percentile 100 is the exact maximum, and bin middles are reported exactly. */
static void test_percentile_exact_cases(void)
{
    kvs_sample_info in;
    memset(&in, 0, sizeof in);
    in.num_layers = 1;
    in.num_kv_heads = 1;
    in.head_dim = 1;
    in.tokens = 1000;
    in.first_pos = 1000;
    in.dtype = KVS_DTYPE_FP32;
    kvs_sample *s = NULL;
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_FATAL(kvs_sample_create(&in, &s, err) == 0);
    /* 1000 values: 1 + (m + 0.5)/32 for m = t % 32, in octave 2^(t % 5 - 2). */
    for (uint32_t t = 0; t < 1000; t++)
        put(s, KVS_SAMPLE_K, 0, t, 0, 0,
            ldexpf(1.0f + ((float)(t % 32) + 0.5f) / 32.0f, (int)(t % 5) - 2));
    kvs_calib_opts o;
    kvs_calib_opts_default(&o);
    o.k_outliers = 0;
    o.percentile = 100.0;
    kvs_calib *c = calib_with(&o, s);
    kvs_calib_stats st;
    kvs_calib_k_stats(c, 0, 0, 0, &st);
    float v[1000];
    for (uint32_t t = 0; t < 1000; t++)
        v[t] = kvs_sample_value(s, KVS_SAMPLE_K, 0, t, 0, 0);
    qsort(v, 1000, sizeof *v, cmp_f);
    CU_ASSERT_EQUAL(st.p50, v[499]);  /* rank 500 */
    CU_ASSERT_EQUAL(st.p99, v[989]);  /* rank 990 */
    CU_ASSERT_EQUAL(st.p999, v[998]); /* rank 999, not 1000 */
    CU_ASSERT_EQUAL(st.kept_pct, v[999]);
    CU_ASSERT_EQUAL(st.amax, v[999]);
    kvs_calib_free(c);
    kvs_sample_free(s);
}

static void test_calib_layout_mismatch(void)
{
    char err[KVS_ERR_LEN] = "";
    kvs_calib_opts o;
    kvs_calib_opts_default(&o);
    kvs_calib *c = NULL;
    CU_ASSERT_FATAL(kvs_calib_create(&o, &c, err) == 0);
    kvs_sample *a = make_tiny(KVS_DTYPE_FP16, 0);
    CU_ASSERT_EQUAL(kvs_calib_add(c, a, err), 0);
    kvs_sample_info in = tiny_info(KVS_DTYPE_FP16, 0);
    kvs_sample *b = NULL;
    in.head_dim = 16;
    CU_ASSERT_FATAL(kvs_sample_create(&in, &b, err) == 0);
    CU_ASSERT_EQUAL(kvs_calib_add(c, b, err), KVS_EINVAL);
    CU_ASSERT(contains(err, "head_dim"));
    kvs_sample_free(b);
    in = tiny_info(KVS_DTYPE_BF16, 0);
    CU_ASSERT_FATAL(kvs_sample_create(&in, &b, err) == 0);
    CU_ASSERT_EQUAL(kvs_calib_add(c, b, err), KVS_EINVAL);
    CU_ASSERT(contains(err, "dtype"));
    kvs_sample_free(b);
    in = tiny_info(KVS_DTYPE_FP16, 0);
    strcpy(in.model, "other");
    CU_ASSERT_FATAL(kvs_sample_create(&in, &b, err) == 0);
    CU_ASSERT_EQUAL(kvs_calib_add(c, b, err), KVS_EINVAL);
    CU_ASSERT(contains(err, "model"));
    kvs_sample_free(b);
    in = tiny_info(KVS_DTYPE_FP16, 0);
    in.flags = 0;
    CU_ASSERT_FATAL(kvs_sample_create(&in, &b, err) == 0);
    CU_ASSERT_EQUAL(kvs_calib_add(c, b, err), KVS_EINVAL);
    CU_ASSERT(contains(err, "RoPE"));
    kvs_sample_free(b);
    /* A matching sample (with queries: they are not part of the layout). */
    b = make_tiny(KVS_DTYPE_FP16, 1);
    CU_ASSERT_EQUAL(kvs_calib_add(c, b, err), 0);
    CU_ASSERT_EQUAL(kvs_calib_samples(c), 2);
    kvs_sample_free(b);
    kvs_sample_free(a);
    kvs_calib_free(c);
    /* Options. */
    o.percentile = 0.0;
    CU_ASSERT_EQUAL(kvs_calib_create(&o, &c, err), KVS_EINVAL);
    CU_ASSERT(contains(err, "percentile"));
    kvs_calib_opts_default(&o);
    o.scheme = KVS_SCHEME_FP16;
    CU_ASSERT_EQUAL(kvs_calib_create(&o, &c, err), KVS_EINVAL);
    kvs_calib_opts_default(&o);
    o.block_tokens = 8;
    CU_ASSERT_EQUAL(kvs_calib_create(&o, &c, err), KVS_EINVAL);
    CU_ASSERT(contains(err, "block_tokens"));
}

/* ---- static scales in the quantizer -------------------------------------------- */

/* One block of KV with outlier channels, a sink and per-token V outliers. */
/* An empty fp16 sample of 2 layers x 2 KV heads x 64 dims x 256 tokens. */
static kvs_sample *block_sample(uint32_t first_pos)
{
    kvs_sample_info in;
    memset(&in, 0, sizeof in);
    in.num_layers = 2;
    in.num_kv_heads = 2;
    in.head_dim = 64;
    in.tokens = 256;
    in.first_pos = first_pos;
    in.dtype = KVS_DTYPE_FP16;
    strcpy(in.model, "unit");
    kvs_sample *s = NULL;
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_FATAL(kvs_sample_create(&in, &s, err) == 0);
    return s;
}

static kvs_sample *make_block(uint32_t first_pos, int with_sink, uint64_t seed)
{
    rng_seed(seed);
    kvs_sample *s = block_sample(first_pos);
    for (uint32_t l = 0; l < 2; l++)
        for (uint32_t h = 0; h < 2; h++)
            for (uint32_t t = 0; t < 256; t++)
                for (uint32_t d = 0; d < 64; d++) {
                    double k = rnd_norm() * (d % 16 == 5 ? 15.0 : 1.0);
                    if (with_sink && t == 0 && d % 32 == 9)
                        k = 100.0;
                    double v = rnd_norm();
                    if (d == (t * 7 + h) % 64 && t % 3 == 0)
                        v *= 12.0;
                    put(s, KVS_SAMPLE_K, l, t, h, d, (float)k);
                    put(s, KVS_SAMPLE_V, l, t, h, d, (float)v);
                }
    return s;
}

static void test_static_reproduces_dynamic(void)
{
    const kvs_scheme schemes[] = {KVS_SCHEME_INT8, KVS_SCHEME_FP8_E4M3, KVS_SCHEME_FP8_E5M2};
    for (int si = 0; si < 3; si++) {
        kvs_sample *s = make_block(0, 1, 5);
        char err[KVS_ERR_LEN] = "";
        kvs_calib_opts o = calib_opts(schemes[si], 2, 1, 1);
        o.percentile = 100.0;
        kvs_calib *c = calib_with(&o, s);
        kvs_profile *p = NULL;
        CU_ASSERT_FATAL(kvs_calib_profile(c, NULL, &p, err) == 0);
        CU_ASSERT_STRING_EQUAL(p->model, "unit");
        CU_ASSERT_EQUAL(p->scheme, schemes[si]);
        const size_t stride = 2 * 64;
        for (uint32_t l = 0; l < 2; l++)
            for (uint32_t h = 0; h < 2; h++) {
                const unsigned char *K = kvs_sample_part_ptr(s, KVS_SAMPLE_K, l);
                const void *src = K + (size_t)h * 64 * 2;
                kvs_tile_params dyn = {schemes[si], KVS_TILE_K, 256, 64, 2, 1, NULL, 0.0f, 0};
                kvs_tile_params sta = dyn;
                sta.static_scales = kvs_profile_k_scales(p, l, h);
                CU_ASSERT_FATAL(sta.static_scales != NULL);
                size_t n = kvs_tile_size(&dyn);
                unsigned char *a = malloc(n), *b = malloc(n);
                CU_ASSERT_FATAL(
                    kvs_tile_quantize_ref(&dyn, src, KVS_DTYPE_FP16, stride, a, n, err) == 0);
                CU_ASSERT_FATAL(
                    kvs_tile_quantize_ref(&sta, src, KVS_DTYPE_FP16, stride, b, n, err) == 0);
                kvs_tile_hdr ha, hb;
                memcpy(&ha, a, sizeof ha);
                memcpy(&hb, b, sizeof hb);
                CU_ASSERT_EQUAL(ha.flags, 0);
                CU_ASSERT_EQUAL(hb.flags, KVS_TILE_F_STATIC);
                /* Same payload byte for byte: the profile scale is the dynamic one. */
                CU_ASSERT(memcmp(a + 32, b + 32, n - 32) == 0);
                CU_ASSERT_EQUAL(kvs_tile_check(b, n, NULL, err), 0);
                free(a);
                free(b);
            }
        kvs_profile_free(p);
        kvs_calib_free(c);
        kvs_sample_free(s);
    }
}

static void test_static_saturates(void)
{
    const kvs_scheme schemes[] = {KVS_SCHEME_INT8, KVS_SCHEME_FP8_E4M3};
    const float qmax[] = {127.0f, 448.0f};
    for (int si = 0; si < 2; si++) {
        kvs_sample *s = make_block(256, 0, 9); /* not a root block: no sinks */
        char err[KVS_ERR_LEN] = "";
        kvs_calib_opts o = calib_opts(schemes[si], 0, 0, 0);
        kvs_calib *c = calib_with(&o, s);
        kvs_profile *p = NULL;
        CU_ASSERT_FATAL(kvs_calib_profile(c, "sat-test", &p, err) == 0);
        CU_ASSERT_STRING_EQUAL(p->model, "sat-test");
        /* New data: layer 1 head 0 scaled by 3, so its largest values exceed
         * what the static scales can express. */
        float *x = malloc(sizeof(float) * 256 * 64), *y = malloc(sizeof(float) * 256 * 64);
        for (uint32_t t = 0; t < 256; t++)
            for (uint32_t d = 0; d < 64; d++)
                x[t * 64 + d] = 3.0f * kvs_sample_value(s, KVS_SAMPLE_V, 1, t, 0, d);
        float vs[256];
        CU_ASSERT_EQUAL(kvs_profile_v_scales_fill(p, 1, 0, 256, vs), 0);
        CU_ASSERT(vs[0] > 0.0f && vs[255] == vs[0]);
        CU_ASSERT_EQUAL(vs[0], p->v_scales[1 * 2 + 0]);
        kvs_tile_params tp = {schemes[si], KVS_TILE_V, 256, 64, 0, 0, vs, 0.0f, 0};
        size_t n = kvs_tile_size(&tp);
        unsigned char *tile = malloc(n);
        CU_ASSERT_FATAL(kvs_tile_quantize_ref(&tp, x, KVS_DTYPE_FP32, 64, tile, n, err) == 0);
        kvs_tile_hdr th;
        memcpy(&th, tile, sizeof th);
        CU_ASSERT_EQUAL(th.flags, KVS_TILE_F_STATIC);
        kvs_tile_layout lay;
        kvs_tile_layout_of(th.scheme, th.kind, 256, 64, 0, 0, &lay);
        /* Format v2 stores the static scale as fp16, rounded up. */
        uint16_t stored0;
        memcpy(&stored0, tile + 32 + lay.scales + 2 * 17, 2);
        CU_ASSERT_EQUAL(stored0, kvq_scale_fp16(vs[0]));
        CU_ASSERT(kvq_fp16_to_f32(stored0) >= vs[0]);
        CU_ASSERT_FATAL(kvs_tile_dequantize_ref(tile, n, KVS_DTYPE_FP32, y, 64, err) == 0);
        const float top = kvq__mul(qmax[si], kvq_fp16_to_f32(stored0));
        int saturated = 0, over = 0, wrong = 0;
        for (size_t i = 0; i < 256 * 64; i++) {
            if (fabsf(x[i]) >= top) {
                saturated++;
                wrong += fabsf(y[i]) != top || (y[i] > 0) != (x[i] > 0);
            }
            over += fabsf(y[i]) > top;
        }
        CU_ASSERT(saturated > 0);
        CU_ASSERT_EQUAL(wrong, 0);
        CU_ASSERT_EQUAL(over, 0);
        /* With percentile 100 and no outliers the static V scale is the one the
         * calibration data's largest |v| needs: nothing there saturates. */
        float vmax = 0.0f;
        for (size_t i = 0; i < 256 * 64; i++)
            vmax = fmaxf(vmax, fabsf(x[i] / 3.0f));
        CU_ASSERT_EQUAL(vs[0], kvq_scale_from_amax(vmax, qmax[si]));
        free(tile);
        free(x);
        free(y);
        kvs_profile_free(p);
        kvs_calib_free(c);
        kvs_sample_free(s);
    }
}

/* kvs_calib_k_bias: layer 0's key channels sit at offsets their tokens vary
 * little around (m_d +- 0.1), layer 1's are centred on zero; a sink row of
 * 100s in layer 1 is left out (rows after the sinks only). */
static void test_k_bias(void)
{
    rng_seed(11);
    kvs_sample *s = block_sample(0);
    char err[KVS_ERR_LEN] = "";
    for (uint32_t h = 0; h < 2; h++)
        for (uint32_t t = 0; t < 256; t++)
            for (uint32_t d = 0; d < 64; d++) {
                double m = (d % 2 ? 1.0 : -1.0) * (1.0 + d % 5);
                put(s, KVS_SAMPLE_K, 0, t, h, d, (float)(m + 0.1 * rnd_norm()));
                put(s, KVS_SAMPLE_K, 1, t, h, d, (float)(t == 0 ? 100.0 : rnd_norm()));
                put(s, KVS_SAMPLE_V, 0, t, h, d, (float)rnd_norm());
                put(s, KVS_SAMPLE_V, 1, t, h, d, (float)rnd_norm());
            }
    kvs_calib_opts o;
    kvs_calib_opts_default(&o);
    o.sinks = 1;
    kvs_calib *c = NULL;
    CU_ASSERT_FATAL(kvs_calib_create(&o, &c, err) == 0);
    double b0 = -1, b1 = -1;
    CU_ASSERT_EQUAL(kvs_calib_k_bias(c, 0, &b0), KVS_EINVAL); /* no sample yet */
    CU_ASSERT_FATAL(kvs_calib_add(c, s, err) == 0);
    CU_ASSERT_EQUAL(kvs_calib_k_bias(c, 0, &b0), 0);
    CU_ASSERT_EQUAL(kvs_calib_k_bias(c, 1, &b1), 0);
    CU_ASSERT(b0 > 0.99 && b0 <= 1.0); /* m^2 / (m^2 + 0.01), m^2 >= 1 */
    CU_ASSERT(b1 >= 0.0 && b1 < 0.05); /* about 1/255 without the sink row */
    CU_ASSERT_EQUAL(kvs_calib_k_bias(c, 2, &b0), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_calib_k_bias(c, 0, NULL), KVS_EINVAL);
    kvs_calib_free(c);
    kvs_sample_free(s);
}

/* The key-offset suggestion. Keys whose channels sit at offsets they vary
 * little around (m_d +- 0.1): offsets cut the K error to a fraction, so they
 * are suggested, and the profile says so. Keys spread symmetrically over
 * [-a_d, a_d] with both ends taken more than k times: every trimmed midrange is 0,
 * the tiles are the same with and without, the error ratio is exactly 1 and
 * nothing is suggested. */
static void fill_keys(kvs_sample *s, int biased)
{
    rng_seed(12);
    for (uint32_t l = 0; l < 2; l++)
        for (uint32_t h = 0; h < 2; h++)
            for (uint32_t t = 0; t < 256; t++)
                for (uint32_t d = 0; d < 64; d++) {
                    double m = (d % 2 ? 1.0 : -1.0) * (1.0 + d % 5);
                    /* 5 levels, each 6 or 7 times in a 32-token tile: more
                     * than the k + 1 <= 5 values the trimming looks at */
                    double sym = (1.0 + 0.37 * (d % 5)) * (double)((int)((t * 3 + d) % 5) - 2) / 2;
                    put(s, KVS_SAMPLE_K, l, t, h, d, (float)(biased ? m + 0.1 * rnd_norm() : sym));
                    put(s, KVS_SAMPLE_V, l, t, h, d, (float)rnd_norm());
                }
}

static void test_suggest_key_offsets(void)
{
    char err[KVS_ERR_LEN] = "";
    kvs_calib_opts o;
    kvs_calib_opts_default(&o);
    o.block_tokens = 32;
    kvs_calib_suggestion sg;
    kvs_sample *s = block_sample(32); /* not a sequence start: no sink rows */
    fill_keys(s, 1);
    kvs_calib *c = calib_with(&o, s);
    double e = -1;
    CU_ASSERT_EQUAL(kvs_calib_k_error_offsets(c, 1, 3, &e), 0);
    CU_ASSERT(e > 0.0);
    CU_ASSERT_EQUAL(kvs_calib_k_error_offsets(c, 2, 0, &e), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_calib_k_error_offsets(c, 0, 4, &e), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_calib_k_error_offsets(c, 0, -1, &e), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_calib_k_error_offsets(c, 0, 0, NULL), KVS_EINVAL);
    CU_ASSERT_EQUAL_FATAL(kvs_calib_suggest(c, &sg), 0);
    for (int ci = 0; ci < KVS_CALIB_NUM_K; ci++)
        CU_ASSERT(sg.k_err_koff[ci] > 0.0 && sg.k_err_koff[ci] < 0.2 * sg.k_err[ci]);
    CU_ASSERT(sg.koff_err_ratio < 0.2);
    /* 2 * 64 bytes more on a K and V tile pair of 32 x 64 int8 (4 KiB of codes) */
    CU_ASSERT(sg.koff_bytes > 128.0 / 5000 && sg.koff_bytes < 128.0 / 4096);
    CU_ASSERT_EQUAL(sg.key_offsets, 1);
    o.key_offsets = 1; /* what `kvstash calibrate` passes on */
    kvs_calib *c1 = calib_with(&o, s);
    kvs_profile *p = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_calib_profile(c1, NULL, &p, err), 0);
    CU_ASSERT_EQUAL(p->key_offsets, 1);
    kvs_tile_params tp;
    CU_ASSERT_EQUAL(kvs_profile_tile_params(p, 0, KVS_TILE_K, 32, 0, &tp), 0);
    CU_ASSERT_EQUAL(tp.key_offsets, 1);
    CU_ASSERT_EQUAL(kvs_tile_params_check(&tp, err), 0);
    CU_ASSERT_EQUAL(kvs_profile_tile_params(p, 0, KVS_TILE_V, 32, 0, &tp), 0);
    CU_ASSERT_EQUAL(tp.key_offsets, 0);
    kvs_profile_free(p);
    kvs_calib_free(c1);
    kvs_calib_free(c);
    fill_keys(s, 0);
    c = calib_with(&o, s);
    CU_ASSERT_EQUAL_FATAL(kvs_calib_suggest(c, &sg), 0);
    CU_ASSERT(sg.k_err[0] > 0.0);
    for (int ci = 0; ci < KVS_CALIB_NUM_K; ci++)
        CU_ASSERT_EQUAL(sg.k_err_koff[ci], sg.k_err[ci]);
    CU_ASSERT_EQUAL(sg.koff_err_ratio, 1.0);
    CU_ASSERT_EQUAL(sg.key_offsets, 0);
    kvs_calib_free(c);
    o.key_offsets = 2;
    CU_ASSERT_EQUAL(kvs_calib_create(&o, &c, err), KVS_EINVAL);
    CU_ASSERT(contains(err, "key_offsets"));
    kvs_sample_free(s);
}

static void test_suggestion(void)
{
    char err[KVS_ERR_LEN] = "";
    kvs_calib_opts o;
    kvs_calib_opts_default(&o);
    o.scheme = KVS_SCHEME_INT8;
    o.sinks = 0;
    /* With a sink at position 0. */
    kvs_calib *c = NULL;
    CU_ASSERT_FATAL(kvs_calib_create(&o, &c, err) == 0);
    kvs_calib_suggestion sg;
    CU_ASSERT_EQUAL(kvs_calib_suggest(c, &sg), KVS_EINVAL); /* nothing yet */
    kvs_sample *s = make_block(0, 1, 3);
    CU_ASSERT_FATAL(kvs_calib_add(c, s, err) == 0);
    CU_ASSERT_EQUAL(kvs_calib_suggest(c, &sg), 0);
    CU_ASSERT(sg.sinks_measured);
    CU_ASSERT_EQUAL(sg.sink_frac[0], 1.0);
    CU_ASSERT_EQUAL(sg.sink_frac[1], 0.0);
    CU_ASSERT_EQUAL(sg.sinks, 1);
    CU_ASSERT(sg.budget_met);
    /* Errors fall with k, and outliers are worth it on this data. */
    CU_ASSERT(sg.k_err[0] > sg.k_err[3]);
    CU_ASSERT(sg.v_err[0] > sg.v_err[1]);
    CU_ASSERT(sg.k_err[3] > 0.0);
    CU_ASSERT(sg.v_outliers >= 1);
    /* 3-byte outlier entries at T = 256, D = 64: 12 bits per group and k. */
    CU_ASSERT(12.0 * ((double)sg.k_outliers / 256 + (double)sg.v_outliers / 64) <=
              KVS_QUANT_META_BUDGET_BITS - kvs_quant_meta_bits(KVS_SCHEME_INT8, 256, 128, 0, 0) +
                  1e-9);
    kvs_calib_free(c);
    /* A tighter budget: 0.3 bit leaves 0.198 for outliers (fp16 scales and
     * headers take 0.102 at the reference shape), at D = 64 with 3-byte
     * entries at most one of kV = 1 (0.1875) or kK <= 4 (0.1875); a budget
     * below the scales' own 0.102 bit allows no outliers at all. */
    o.meta_budget = 0.3;
    c = calib_with(&o, s);
    CU_ASSERT_EQUAL(kvs_calib_suggest(c, &sg), 0);
    CU_ASSERT(sg.budget_met);
    CU_ASSERT(sg.k_outliers + sg.v_outliers >= 1);
    CU_ASSERT(fabs(kvs_quant_meta_bits(KVS_SCHEME_INT8, 256, 128, 0, 0) - 832.0 * 8 / 65536) <
              1e-12);
    CU_ASSERT(12.0 * ((double)sg.k_outliers / 256 + (double)sg.v_outliers / 64) <=
              0.3 - 832.0 * 8 / 65536 + 1e-9);
    CU_ASSERT(sg.k_outliers + sg.v_outliers <= 4);
    kvs_calib_free(c);
    o.meta_budget = 0.1;
    c = calib_with(&o, s);
    CU_ASSERT_EQUAL(kvs_calib_suggest(c, &sg), 0);
    CU_ASSERT(!sg.budget_met);
    CU_ASSERT_EQUAL(sg.k_outliers, 0);
    CU_ASSERT_EQUAL(sg.v_outliers, 0);
    o.meta_budget = KVS_QUANT_META_BUDGET_BITS;
    double e0, e3;
    CU_ASSERT_EQUAL(kvs_calib_layer_error(c, 0, KVS_TILE_V, 0, &e0), 0);
    CU_ASSERT_EQUAL(kvs_calib_layer_error(c, 0, KVS_TILE_V, 3, &e3), 0);
    CU_ASSERT(e0 > e3 && e3 > 0.0 && e0 < 0.05);
    CU_ASSERT_EQUAL(kvs_calib_layer_error(c, 2, KVS_TILE_V, 0, &e0), KVS_EINVAL);
    kvs_calib_free(c);
    kvs_sample_free(s);
    /* Without a sink: nothing sink-like (the per-token V outliers, one every
     * third row, do not count), and S stays at its floor of 1. */
    CU_ASSERT_FATAL(kvs_calib_create(&o, &c, err) == 0);
    s = make_block(0, 0, 3);
    CU_ASSERT_FATAL(kvs_calib_add(c, s, err) == 0);
    CU_ASSERT_EQUAL(kvs_calib_suggest(c, &sg), 0);
    CU_ASSERT_EQUAL(sg.sinks, 1);
    double most = 0.0;
    for (unsigned t = 0; t < KVS_CALIB_SINK_WINDOW; t++)
        most = fmax(most, sg.sink_frac[t]);
    CU_ASSERT(most < KVS_CALIB_SINK_FRAC);
    /* Massive values at positions 0..2 of one layer's K in every head, and at
     * position 5 in only one (layer, head) pair of four: S = 3. */
    for (uint32_t h = 0; h < 2; h++)
        for (uint32_t l = 0; l < 2; l++)
            for (uint32_t t = 0; t < 3; t++)
                put(s, KVS_SAMPLE_K, l, t, h, 30, 400.0f);
    put(s, KVS_SAMPLE_V, 1, 5, 1, 7, 400.0f);
    kvs_calib_free(c);
    c = calib_with(&o, s);
    CU_ASSERT_EQUAL(kvs_calib_suggest(c, &sg), 0);
    CU_ASSERT_EQUAL(sg.sink_frac[2], 1.0);
    CU_ASSERT_EQUAL(sg.sink_frac[5], 0.25);
    CU_ASSERT_EQUAL(sg.sinks, 3);
    kvs_calib_free(c);
    kvs_sample_free(s);
    /* No sample starts a sequence: S is the option's. */
    o.sinks = 4;
    CU_ASSERT_FATAL(kvs_calib_create(&o, &c, err) == 0);
    s = make_block(256, 1, 3);
    CU_ASSERT_FATAL(kvs_calib_add(c, s, err) == 0);
    CU_ASSERT_EQUAL(kvs_calib_suggest(c, &sg), 0);
    CU_ASSERT(!sg.sinks_measured);
    CU_ASSERT_EQUAL(sg.sinks, 4);
    kvs_calib_free(c);
    kvs_sample_free(s);
    /* The reference-shape metadata of FORMAT.md (v2): k = 2 is 0.383 bit,
     * (kK, kV) = (4, 1) also 0.383, (5, 1) 0.430. */
    CU_ASSERT(fabs(kvs_quant_meta_bits(KVS_SCHEME_INT8, 256, 128, 2, 2) - 3136.0 * 8 / 65536) <
              1e-12);
    CU_ASSERT(fabs(kvs_quant_meta_bits(KVS_SCHEME_INT8, 256, 128, 4, 1) - 3136.0 * 8 / 65536) <
              1e-12);
    CU_ASSERT(fabs(kvs_quant_meta_bits(KVS_SCHEME_INT8, 256, 128, 5, 1) - 3520.0 * 8 / 65536) <
              1e-12);
    /* 4-byte entries beyond a span of 256: T = 512 K tiles. */
    CU_ASSERT(fabs(kvs_quant_meta_bits(KVS_SCHEME_INT8, 512, 128, 2, 0) -
                   (32.0 + 256 + 4 * 128 * 2 + 32 + 1024) * 8 / (2.0 * 512 * 128)) < 1e-12);
}

/* ---- profiles -------------------------------------------------------------------- */

static kvs_profile *make_profile(uint32_t L, uint32_t H, uint32_t D)
{
    kvs_profile shape;
    memset(&shape, 0, sizeof shape);
    strcpy(shape.model, "llama-ish/7b@sha:0123");
    shape.num_layers = L;
    shape.num_kv_heads = H;
    shape.head_dim = D;
    shape.block_tokens = 256;
    shape.dtype = KVS_DTYPE_BF16;
    shape.post_rope = 1;
    shape.scheme = KVS_SCHEME_FP8_E4M3;
    shape.k_outliers = 2;
    shape.v_outliers = 1;
    shape.sinks = 4;
    shape.percentile = 99.99;
    shape.samples = 12;
    shape.tokens = 24576;
    kvs_profile *p = NULL;
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_FATAL(kvs_profile_create(&shape, &p, err) == 0);
    static const float special[] = {0.0f, FLT_MIN, 1e-40f, FLT_MAX, 1.0f / 3.0f, 448.0f};
    rng_seed(77);
    for (size_t i = 0; i < (size_t)L * H * D; i++)
        p->k_scales[i] = i < 6 ? special[i] : (float)exp2(-20.0 + 30.0 * rnd_unif());
    for (size_t i = 0; i < (size_t)L * H; i++)
        p->v_scales[i] = (float)rnd_unif();
    for (uint32_t l = 0; l < L; l++) {
        p->layers[l].k_amax = (float)(100.0 * rnd_unif());
        p->layers[l].v_amax = (float)(10.0 * rnd_unif());
        p->layers[l].k_tensor_scale = p->layers[l].k_amax / 448.0f;
        p->layers[l].v_tensor_scale = p->layers[l].v_amax / 448.0f;
    }
    return p;
}

static char *profile_text(const kvs_profile *p, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_FATAL(kvs_profile_print(p, f, err) == 0);
    fclose(f);
    return buf;
}

static void test_profile_roundtrip(void)
{
    kvs_profile *p = make_profile(3, 2, 5);
    char path[256], err[KVS_ERR_LEN] = "";
    tmp_path(path, sizeof path);
    CU_ASSERT_FATAL(kvs_profile_write(path, p, err) == 0);
    kvs_profile *r = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_profile_read(path, &r, err), 0);
    CU_ASSERT_STRING_EQUAL(r->model, p->model);
    CU_ASSERT_EQUAL(r->num_layers, 3);
    CU_ASSERT_EQUAL(r->num_kv_heads, 2);
    CU_ASSERT_EQUAL(r->head_dim, 5);
    CU_ASSERT_EQUAL(r->block_tokens, 256);
    CU_ASSERT_EQUAL(r->dtype, KVS_DTYPE_BF16);
    CU_ASSERT_EQUAL(r->post_rope, 1);
    CU_ASSERT_EQUAL(r->scheme, KVS_SCHEME_FP8_E4M3);
    CU_ASSERT_EQUAL(r->k_outliers, 2);
    CU_ASSERT_EQUAL(r->v_outliers, 1);
    CU_ASSERT_EQUAL(r->sinks, 4);
    CU_ASSERT_EQUAL(r->percentile, 99.99);
    CU_ASSERT_EQUAL(r->samples, 12);
    CU_ASSERT_EQUAL(r->tokens, 24576);
    /* Bit-exact scales, including 0, FLT_MIN, a subnormal and FLT_MAX. */
    CU_ASSERT(memcmp(r->k_scales, p->k_scales, sizeof(float) * 3 * 2 * 5) == 0);
    CU_ASSERT(memcmp(r->v_scales, p->v_scales, sizeof(float) * 3 * 2) == 0);
    CU_ASSERT(memcmp(r->layers, p->layers, sizeof(kvs_profile_layer) * 3) == 0);
    /* Accessors. */
    CU_ASSERT(kvs_profile_k_scales(r, 2, 1) == r->k_scales + (2 * 2 + 1) * 5);
    CU_ASSERT(kvs_profile_k_scales(r, 3, 0) == NULL);
    CU_ASSERT(kvs_profile_k_scales(r, 0, 2) == NULL);
    float vs[4];
    CU_ASSERT_EQUAL(kvs_profile_v_scales_fill(r, 1, 1, 4, vs), 0);
    CU_ASSERT(vs[0] == r->v_scales[3] && vs[3] == r->v_scales[3]);
    CU_ASSERT_EQUAL(kvs_profile_v_scales_fill(r, 1, 2, 4, vs), KVS_EINVAL);
    /* The text: the documented first lines. */
    size_t len;
    char *text = (char *)slurp(path, &len);
    CU_ASSERT(contains(text, "\nkvstash-profile 1\nmodel llama-ish/7b@sha:0123\n"
                             "layout layers=3 kv_heads=2 head_dim=5 block_tokens=256 dtype=bf16 "
                             "keys=post-rope\nscheme fp8_e4m3\noutliers k=2 v=1 sinks=4\n"
                             "calibration samples=12 tokens=24576 percentile=99.99\nlayer 0 "));
    CU_ASSERT(len > 4 && memcmp(text + len - 4, "end\n", 4) == 0);
    free(text);
    CU_ASSERT_EQUAL(r->key_offsets, 0); /* not in the text: 0, as in older profiles */
    kvs_profile_free(r);
    /* key_offsets = 1: one more field on the outliers line, read back. */
    p->key_offsets = 1;
    CU_ASSERT_FATAL(kvs_profile_write(path, p, err) == 0);
    text = (char *)slurp(path, &len);
    CU_ASSERT(contains(text, "\noutliers k=2 v=1 sinks=4 key_offsets=1\ncalibration "));
    free(text);
    CU_ASSERT_EQUAL_FATAL(kvs_profile_read(path, &r, err), 0);
    CU_ASSERT_EQUAL(r->key_offsets, 1);
    CU_ASSERT(memcmp(r->k_scales, p->k_scales, sizeof(float) * 3 * 2 * 5) == 0);
    kvs_profile_free(r);
    p->key_offsets = 2;
    CU_ASSERT_EQUAL(kvs_profile_write(path, p, err), KVS_EINVAL);
    CU_ASSERT(contains(err, "key_offsets"));
    p->key_offsets = 0;
    /* An invalid profile is not written. */
    p->v_scales[0] = NAN;
    CU_ASSERT_EQUAL(kvs_profile_write(path, p, err), KVS_EINVAL);
    CU_ASSERT(contains(err, "v scale of layer 0 head 0"));
    p->v_scales[0] = 1.0f;
    p->head_dim = 0;
    CU_ASSERT_EQUAL(kvs_profile_check(p, err), KVS_EINVAL);
    CU_ASSERT(contains(err, "head_dim"));
    p->head_dim = 5;
    CU_ASSERT_EQUAL(kvs_profile_read("/nonexistent/profile", &r, err), KVS_EIO);
    kvs_profile_free(p);
    unlink(path);
}

/* Replaces the first occurrence of `from` in text by `to`; a new string. */
static char *replace(const char *text, const char *from, const char *to)
{
    const char *at = strstr(text, from);
    CU_ASSERT_FATAL(at != NULL);
    size_t a = (size_t)(at - text), n = strlen(text) + strlen(to) + 1;
    char *out = malloc(n);
    memcpy(out, text, a);
    strcpy(out + a, to);
    strcat(out, at + strlen(from));
    return out;
}

typedef struct bad_case {
    const char *from, *to;
    int rc;
    const char *want1, *want2;
} bad_case;

/* kvs_profile_tile_params: a tile's params from a profile, its per-tensor
 * scale included, ready for the quantizer (FP8 scales then aligned to it). */
static void test_profile_tile_params(void)
{
    kvs_profile *p = make_profile(3, 2, 5); /* fp8_e4m3, k 2/1, S 4 */
    kvs_tile_params tp;
    char err[KVS_ERR_LEN] = "";
    memset(&tp, 0xA5, sizeof tp);
    CU_ASSERT_EQUAL_FATAL(kvs_profile_tile_params(p, 2, KVS_TILE_K, 256, 1, &tp), 0);
    CU_ASSERT_EQUAL(tp.scheme, KVS_SCHEME_FP8_E4M3);
    CU_ASSERT_EQUAL(tp.kind, KVS_TILE_K);
    CU_ASSERT_EQUAL(tp.tokens, 256);
    CU_ASSERT_EQUAL(tp.dim, 5);
    CU_ASSERT_EQUAL(tp.outliers, 2);
    CU_ASSERT_EQUAL(tp.sinks, 4);
    CU_ASSERT(tp.static_scales == NULL);
    CU_ASSERT_EQUAL(tp.tensor_scale, p->layers[2].k_tensor_scale);
    CU_ASSERT_EQUAL(kvs_tile_params_check(&tp, err), 0);
    CU_ASSERT_EQUAL_FATAL(kvs_profile_tile_params(p, 1, KVS_TILE_V, 2, 1, &tp), 0);
    CU_ASSERT_EQUAL(tp.kind, KVS_TILE_V);
    CU_ASSERT_EQUAL(tp.outliers, 1);
    CU_ASSERT_EQUAL(tp.sinks, 2); /* capped at T */
    CU_ASSERT_EQUAL(tp.tensor_scale, p->layers[1].v_tensor_scale);
    CU_ASSERT_EQUAL(kvs_tile_params_check(&tp, err), 0);
    CU_ASSERT_EQUAL_FATAL(kvs_profile_tile_params(p, 0, KVS_TILE_V, 16, 0, &tp), 0);
    CU_ASSERT_EQUAL(tp.sinks, 0); /* not a root block */
    CU_ASSERT_EQUAL(kvs_profile_tile_params(p, 3, KVS_TILE_K, 16, 1, &tp), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_profile_tile_params(p, 0, (kvs_tile_kind)2, 16, 1, &tp), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_profile_tile_params(p, 0, KVS_TILE_K, 0, 1, &tp), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_profile_tile_params(p, 0, KVS_TILE_K, 1025, 1, &tp), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_profile_tile_params(NULL, 0, KVS_TILE_K, 16, 1, &tp), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_profile_tile_params(p, 0, KVS_TILE_K, 16, 1, NULL), KVS_EINVAL);
    /* Quantized with them: every K scale is the per-tensor scale (as fp16)
     * times a power of two. */
    float x[16][5];
    rng_seed(5);
    for (int t = 0; t < 16; t++)
        for (int d = 0; d < 5; d++)
            x[t][d] = (float)(rnd_unif() - 0.5) * (float)(1 << (2 * d));
    CU_ASSERT_EQUAL_FATAL(kvs_profile_tile_params(p, 1, KVS_TILE_K, 16, 0, &tp), 0);
    unsigned char tile[512];
    CU_ASSERT_FATAL(kvs_tile_size(&tp) <= sizeof tile);
    CU_ASSERT_EQUAL_FATAL(kvs_tile_quantize_ref(&tp, x, KVS_DTYPE_FP32, 5, tile, sizeof tile, err),
                          0);
    kvs_tile_layout l;
    kvs_tile_layout_of(tp.scheme, tp.kind, 16, 5, tp.outliers, tp.sinks, &l);
    const double tv = kvq_fp16_to_f32(kvq_scale_fp16(p->layers[1].k_tensor_scale));
    for (int d = 0; d < 5; d++) {
        uint16_t h;
        memcpy(&h, tile + sizeof(kvs_tile_hdr) + l.scales + 2 * d, 2);
        int e;
        CU_ASSERT(h != 0 && frexp(kvq_fp16_to_f32(h) / tv, &e) == 0.5);
    }
    kvs_profile_free(p);
}

static void test_profile_malformed(void)
{
    kvs_profile *p = make_profile(2, 2, 3);
    size_t len;
    char *good = profile_text(p, &len);
    /* Line numbers: 1 comment, 2 kvstash-profile, 3 model, 4 layout, 5 scheme,
     * 6 outliers, 7 calibration, 8 layer 0, 9-10 k 0 h, 11 v 0, 12 layer 1 ... 16 end. */
    const bad_case cases[] = {
        {"kvstash-profile 1", "kvstash-profile 2", KVS_EFORMAT, "line 2", "version"},
        {"kvstash-profile 1", "kvstash-profil 1", KVS_EFORMAT, "line 2",
         "expected a 'kvstash-profile'"},
        {"kvstash-profile 1", "kvstash-profile 1 x", KVS_EFORMAT, "line 2", "takes 1 fields"},
        {"model llama-ish/7b@sha:0123",
         "model m12345678901234567890123456789012345678901234567890123456789012345", KVS_EINVAL,
         "line 3", "'model'"},
        {"model llama-ish/7b@sha:0123", "model two words", KVS_EFORMAT, "line 3", "takes 1"},
        {" keys=post-rope", "", KVS_EFORMAT, "line 4", "'layout' takes 6 fields"},
        {"layers=2 kv_heads=2", "kv_heads=2 layers=2", KVS_EFORMAT, "line 4", "expected 'layers='"},
        {"layers=2", "layers=0", KVS_EINVAL, "line 4", "'layers'"},
        {"layers=2", "layers=1025", KVS_EINVAL, "line 4", "'layers'"},
        {"layers=2", "layers=99999999999999999999999", KVS_EINVAL, "line 4", "'layers'"},
        {"head_dim=3", "head_dim=abc", KVS_EFORMAT, "line 4", "'head_dim'"},
        {"head_dim=3", "head_dim=-3", KVS_EFORMAT, "line 4", "'head_dim'"},
        {"head_dim=3", "head_dim=+3", KVS_EFORMAT, "line 4", "'head_dim'"},
        {"head_dim=3", "head_dim=3.0", KVS_EFORMAT, "line 4", "'head_dim'"},
        {"block_tokens=256", "block_tokens=8", KVS_EINVAL, "line 4", "'block_tokens'"},
        {"dtype=bf16", "dtype=fp64", KVS_EINVAL, "line 4", "'dtype'"},
        {"keys=post-rope", "keys=sideways", KVS_EINVAL, "line 4", "'keys'"},
        {"scheme fp8_e4m3", "scheme fp16", KVS_EINVAL, "line 5", "'scheme'"},
        {"scheme fp8_e4m3", "scheme e4m3", KVS_EINVAL, "line 5", "'scheme'"},
        {"outliers k=2", "outliers k=17", KVS_EINVAL, "line 6", "'k'"},
        {"outliers k=2 v=1", "outliers v=1 k=2", KVS_EFORMAT, "line 6", "expected 'k='"},
        {"sinks=4", "sinks=65", KVS_EINVAL, "line 6", "'sinks'"},
        {"sinks=4\n", "sinks=4 key_offsets=2\n", KVS_EINVAL, "line 6", "'key_offsets'"},
        {"sinks=4\n", "sinks=4 key_offsets=-1\n", KVS_EFORMAT, "line 6", "'key_offsets'"},
        {"sinks=4\n", "sinks=4 key_offsets=yes\n", KVS_EFORMAT, "line 6", "'key_offsets'"},
        {"sinks=4\n", "sinks=4 key_offsets=\n", KVS_EFORMAT, "line 6", "'key_offsets'"},
        {"sinks=4\n", "sinks=4 koff=1\n", KVS_EFORMAT, "line 6", "expected 'key_offsets='"},
        {"sinks=4\n", "sinks=4 key_offsets=1 x=1\n", KVS_EFORMAT, "line 6",
         "'outliers' takes 3 fields (4 with key_offsets), found 5"},
        {"outliers k=2 v=1 sinks=4", "outliers k=2 v=1", KVS_EFORMAT, "line 6", "found 2"},
        {"percentile=99.99", "percentile=0", KVS_EINVAL, "line 7", "'percentile'"},
        {"percentile=99.99", "percentile=100.5", KVS_EINVAL, "line 7", "'percentile'"},
        {"percentile=99.99", "percentile=abc", KVS_EFORMAT, "line 7", "'percentile'"},
        {"samples=12", "samples=-1", KVS_EFORMAT, "line 7", "'samples'"},
        {"layer 0 ", "layer 1 ", KVS_EFORMAT, "line 8", "expected 0"},
        {"layer 0 k_amax", "layer 0 kamax", KVS_EFORMAT, "line 8", "expected 'k_amax='"},
        {"\nk 0 0 ", "\nk 0 1 ", KVS_EFORMAT, "line 9", "'head'"},
        {"\nk 0 0 ", "\nk 1 0 ", KVS_EFORMAT, "line 9", "'layer'"},
        {"\nk 0 0 0 ", "\nk 0 0 ", KVS_EFORMAT, "line 9", "'k' takes 5 fields, found 4"},
        {"\nk 0 0 0 ", "\nk 0 0 nan ", KVS_EINVAL, "line 9", "'k_scale[0]'"},
        {"\nk 0 0 0 ", "\nk 0 0 -0.5 ", KVS_EINVAL, "line 9", "'k_scale[0]'"},
        {"\nk 0 0 0 ", "\nk 0 0 -0 ", KVS_EINVAL, "line 9", "'k_scale[0]'"},
        {"\nk 0 0 0 ", "\nk 0 0 1e39 ", KVS_EINVAL, "line 9", "'k_scale[0]'"},
        {"\nk 0 0 0 ", "\nk 0 0 inf ", KVS_EINVAL, "line 9", "'k_scale[0]'"},
        {"\nk 0 0 0 ", "\nk 0 0 1.0abc ", KVS_EFORMAT, "line 9", "'k_scale[0]'"},
        {"\nk 0 0 0 ", "\nk 0 0 +1 ", KVS_EFORMAT, "line 9", "'k_scale[0]'"},
        {"\nv 0 ", "\nv 0 1 ", KVS_EFORMAT, "line 11", "'v' takes 3 fields"},
        {"\nv 0 ", "\nw 0 ", KVS_EFORMAT, "line 11", "expected a 'v' line"},
        {"\nlayer 1 ", "\nfoo 1\nlayer 1 ", KVS_EFORMAT, "line 12", "expected a 'layer' line"},
        {"\nend\n", "\n", KVS_EFORMAT, "truncated", "'end'"},
        {"\nend\n", "\nend x\n", KVS_EFORMAT, "line 16", "'end' takes 0"},
        {"\nend\n", "\nend\nlayer 2\n", KVS_EFORMAT, "line 17", "after 'end'"},
        {"scheme fp8_e4m3\n", "scheme fp8_e4m3\r\n", KVS_EFORMAT, "line 5", "carriage return"},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *t = replace(good, cases[i].from, cases[i].to);
        char err[KVS_ERR_LEN] = "";
        kvs_profile *r = NULL;
        int rc = kvs_profile_parse(t, strlen(t), &r, err);
        if (rc != cases[i].rc || !contains(err, cases[i].want1) || !contains(err, cases[i].want2) ||
            r != NULL) {
            printf("\n  case %zu ('%s' -> '%s'): rc=%d err='%s'", i, cases[i].from, cases[i].to, rc,
                   err);
            bad++;
        }
        kvs_profile_free(r);
        free(t);
    }
    CU_ASSERT_EQUAL(bad, 0);

    /* Every truncation of the text fails (the last line may lack its '\n'). */
    int accepted = 0;
    for (size_t n = 0; n + 1 < len; n++) {
        char err[KVS_ERR_LEN] = "";
        kvs_profile *r = NULL;
        int rc = kvs_profile_parse(good, n, &r, err);
        if (rc == 0 || (rc != KVS_EFORMAT && rc != KVS_EINVAL) || err[0] == '\0')
            accepted++;
        kvs_profile_free(r);
    }
    CU_ASSERT_EQUAL(accepted, 0);
    char err[KVS_ERR_LEN] = "";
    kvs_profile *r = NULL;
    CU_ASSERT_EQUAL(kvs_profile_parse(good, len - 1, &r, err), 0);
    kvs_profile_free(r);
    r = NULL;
    CU_ASSERT_EQUAL(kvs_profile_parse("", 0, &r, err), KVS_EFORMAT);
    CU_ASSERT(contains(err, "truncated"));
    char nul[] = "kvstash-profile 1\n\0model x\n";
    CU_ASSERT_EQUAL(kvs_profile_parse(nul, sizeof nul - 1, &r, err), KVS_EFORMAT);
    CU_ASSERT(contains(err, "NUL"));

    /* Comments, blank lines and extra blanks are fine. */
    {
        char *a =
            replace(good, "scheme fp8_e4m3\n", "\n  # a comment\n\t scheme \t fp8_e4m3  \n\n");
        CU_ASSERT_EQUAL(kvs_profile_parse(a, strlen(a), &r, err), 0);
        CU_ASSERT(r && memcmp(r->k_scales, p->k_scales, sizeof(float) * 2 * 2 * 3) == 0);
        kvs_profile_free(r);
        free(a);
    }
    free(good);
    kvs_profile_free(p);
}

int main(void)
{
    static const kvs_test_case sample_cases[] = {
        {"round trip, every dtype, with and without queries", test_sample_roundtrip},
        {"corrupt header fields", test_sample_corrupt_header},
        {"truncation, trailing bytes, flipped data bits", test_sample_corrupt_body},
        {"write errors", test_sample_write_errors},
        {NULL, NULL},
    };
    static const kvs_test_case calib_cases[] = {
        {"percentiles against a sort-based oracle", test_percentiles_vs_oracle},
        {"exact percentiles at bin middles and at 100", test_percentile_exact_cases},
        {"layout mismatches and options", test_calib_layout_mismatch},
        {"suggested k and S", test_suggestion},
        {"K bias: tile means' share of K energy", test_k_bias},
        {"key offsets: suggested on biased keys, not on symmetric ones", test_suggest_key_offsets},
        {NULL, NULL},
    };
    static const kvs_test_case static_cases[] = {
        {"calibrated on itself, static == dynamic", test_static_reproduces_dynamic},
        {"beyond a static scale values saturate", test_static_saturates},
        {NULL, NULL},
    };
    static const kvs_test_case profile_cases[] = {
        {"round trip, bit-exact", test_profile_roundtrip},
        {"malformed profiles", test_profile_malformed},
        {"tile params from a profile", test_profile_tile_params},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {
        {"sample files", NULL, NULL, sample_cases},
        {"calibration", NULL, NULL, calib_cases},
        {"static scales", NULL, NULL, static_cases},
        {"profiles", NULL, NULL, profile_cases},
        {NULL, NULL, NULL, NULL},
    };
    return kvs_test_run(suites);
}
