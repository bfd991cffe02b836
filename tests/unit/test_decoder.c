/*
 * test_decoder.c — clients/decoder (decoder.h): checkpoint validation, the
 * fp32 forward pass against stories260K.reference.txt, the paged KV cache,
 * reused fp16 blocks, the workload driver and KV sample files.
 *
 * The model directory is argv[1] (tests/unit/decoder.cmake passes
 * KVS_MODEL_DIR). Reference cases need stories260K.bin there; without it the
 * binary exits 77 (skipped) rather than pass. Hostile-file cases start from
 * the real checkpoint and change one thing at a time, so each checks the rule
 * it names and nothing else.
 */
#include "decoder.h"
#include "kv_block.h"
#include "kvq_calib.h"
#include "kvq_cpu.h"
#include "kvq_math.h"

#include "kvs_error.h"
#include "kvs_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *model_dir;
static unsigned char *model_bytes; /* stories260K.bin */
static size_t model_len;
static kvs_model *model;

/* the reference file */
static float ref_logits[3][8];
static uint32_t ref_ids[257];
static uint32_t n_ref_ids;

static unsigned char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(n > 0 ? (size_t)n + 1 : 1);
    *len = b ? fread(b, 1, (size_t)n, f) : 0;
    fclose(f);
    if (b)
        b[*len] = '\0';
    return b;
}

static int load_reference(void)
{
    char path[4096];
    size_t len;
    snprintf(path, sizeof path, "%s/stories260K.reference.txt", model_dir);
    char *text = (char *)slurp(path, &len);
    if (text == NULL)
        return -1;
    int seen = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        int pos;
        float v[8];
        if (sscanf(line, "logits %d %f %f %f %f %f %f %f %f", &pos, &v[0], &v[1], &v[2], &v[3],
                   &v[4], &v[5], &v[6], &v[7]) == 9 &&
            pos >= 0 && pos < 3) {
            memcpy(ref_logits[pos], v, sizeof v);
            seen |= 1 << pos;
        } else if (strncmp(line, "ids ", 4) == 0) {
            char *p = line + 4, *end;
            while (n_ref_ids < 257) {
                unsigned long id = strtoul(p, &end, 10);
                if (end == p)
                    break;
                ref_ids[n_ref_ids++] = (uint32_t)id;
                p = end;
            }
        }
    }
    free(text);
    return seen == 7 && n_ref_ids == 257 ? 0 : -1;
}

static int suite_init(void)
{
    char path[4096], err[KVS_ERR_LEN];
    snprintf(path, sizeof path, "%s/stories260K.bin", model_dir);
    model_bytes = slurp(path, &model_len);
    if (model_bytes == NULL || load_reference() != 0)
        return -1;
    if (kvs_model_load(path, &model, err) != 0) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    return 0;
}

static int suite_cleanup(void)
{
    kvs_model_free(model);
    free(model_bytes);
    return 0;
}

/* ---- the reference ------------------------------------------------------------- */

static void test_config(void)
{
    const kvs_model_config *c = kvs_model_cfg(model);
    CU_ASSERT_EQUAL(c->dim, 64);
    CU_ASSERT_EQUAL(c->hidden_dim, 172);
    CU_ASSERT_EQUAL(c->n_layers, 5);
    CU_ASSERT_EQUAL(c->n_heads, 8);
    CU_ASSERT_EQUAL(c->n_kv_heads, 4);
    CU_ASSERT_EQUAL(c->vocab_size, 512);
    CU_ASSERT_EQUAL(c->seq_len, 512);
    CU_ASSERT_EQUAL(c->head_dim, 8);
    CU_ASSERT_EQUAL(c->kv_dim, 32);
    CU_ASSERT_TRUE(c->shared_classifier);
    CU_ASSERT_EQUAL(kvs_model_file_bytes(c), 1056540);
    CU_ASSERT_EQUAL(strncmp(kvs_model_fingerprint(model), "stories260K@", 12), 0);
    CU_ASSERT_EQUAL(strlen(kvs_model_fingerprint(model)), 12 + 16);
}

/* Greedy decoding from BOS, one token per call: logits at 0..2 within 1e-4
 * and the 257 ids. */
static void test_reference_greedy(void)
{
    char err[KVS_ERR_LEN];
    kvs_decoder *d;
    CU_ASSERT_FATAL(kvs_decoder_create(model, 32, &d, err) == 0);
    float logits[512];
    uint32_t tok = KVS_MODEL_BOS;
    double worst = 0;
    uint32_t matched = 0;
    for (uint32_t pos = 0; pos < 257; pos++) {
        CU_ASSERT_FATAL(kvs_decoder_forward(d, &tok, 1, NULL, logits, err) == 0);
        if (pos < 3)
            for (int j = 0; j < 8; j++) {
                double e = fabs((double)logits[j] - ref_logits[pos][j]);
                worst = e > worst ? e : worst;
            }
        tok = kvs_argmax(logits, 512);
        matched += tok == ref_ids[pos];
    }
    CU_ASSERT(worst <= 1e-4);
    CU_ASSERT_EQUAL(matched, 257);
    CU_ASSERT_EQUAL(kvs_decoder_len(d), 257);
    printf("\n  max |logit - reference| at positions 0..2: %.2e; ids %u/257 ", worst, matched);
    kvs_decoder_free(d);
}

/* The same stream as one prefill with every row's logits: bit-identical to the
 * token-by-token run (the dot products do not depend on the batch). */
static void test_reference_prefill(void)
{
    char err[KVS_ERR_LEN];
    kvs_decoder *a, *b;
    CU_ASSERT_FATAL(kvs_decoder_create(model, 32, &a, err) == 0);
    CU_ASSERT_FATAL(kvs_decoder_create(model, 32, &b, err) == 0);
    uint32_t toks[257];
    toks[0] = KVS_MODEL_BOS;
    memcpy(toks + 1, ref_ids, 256 * sizeof *toks);
    float *all = malloc((size_t)257 * 512 * sizeof(float)), last[512], one[512];
    CU_ASSERT_FATAL(all != NULL);
    CU_ASSERT_FATAL(kvs_decoder_forward(a, toks, 257, all, last, err) == 0);
    int same = 1, ids = 1;
    for (uint32_t p = 0; p < 257; p++) {
        CU_ASSERT_FATAL(kvs_decoder_forward(b, &toks[p], 1, NULL, one, err) == 0);
        same &= memcmp(one, all + (size_t)p * 512, sizeof one) == 0;
        ids &= kvs_argmax(all + (size_t)p * 512, 512) == ref_ids[p];
    }
    CU_ASSERT(same);
    CU_ASSERT(ids);
    CU_ASSERT_EQUAL(memcmp(last, all + (size_t)256 * 512, sizeof last), 0);
    for (int j = 0; j < 8; j++)
        CU_ASSERT(fabsf(all[512 + j] - ref_logits[1][j]) <= 1e-4f);
    /* uneven pieces: 5, 40, 1, 211 */
    kvs_decoder_truncate(b, 0);
    const uint32_t cuts[] = {0, 5, 45, 46, 257};
    for (int i = 0; i < 4; i++)
        CU_ASSERT_FATAL(
            kvs_decoder_forward(b, toks + cuts[i], cuts[i + 1] - cuts[i], NULL, one, err) == 0);
    CU_ASSERT_EQUAL(memcmp(one, last, sizeof one), 0);
    free(all);
    kvs_decoder_free(a);
    kvs_decoder_free(b);
}

/* Pages of 16 and 7 tokens against one contiguous page of 512: the same
 * logits, and the same K/V at every position. */
static void test_paged_equals_contiguous(void)
{
    char err[KVS_ERR_LEN];
    const uint32_t Ts[3] = {512, 16, 7};
    kvs_decoder *d[3];
    for (int i = 0; i < 3; i++)
        CU_ASSERT_FATAL(kvs_decoder_create(model, Ts[i], &d[i], err) == 0);
    uint32_t toks[300];
    toks[0] = KVS_MODEL_BOS;
    for (int i = 1; i < 300; i++)
        toks[i] = ref_ids[(i * 7) % 257];
    float out[3][512];
    for (int i = 0; i < 3; i++) {
        CU_ASSERT_FATAL(kvs_decoder_forward(d[i], toks, 100, NULL, out[i], err) == 0);
        CU_ASSERT_FATAL(kvs_decoder_forward(d[i], toks + 100, 200, NULL, out[i], err) == 0);
    }
    CU_ASSERT_EQUAL(memcmp(out[0], out[1], sizeof out[0]), 0);
    CU_ASSERT_EQUAL(memcmp(out[0], out[2], sizeof out[0]), 0);
    int kv_same = 1;
    for (uint32_t l = 0; l < 5; l++)
        for (uint32_t pos = 0; pos < 300; pos++)
            for (int kind = 0; kind < 2; kind++) {
                const float *c =
                    kvs_decoder_page(d[0], 0, l, kind ? KVS_TILE_V : KVS_TILE_K) + pos * 32;
                for (int i = 1; i < 3; i++) {
                    const float *p =
                        kvs_decoder_page(d[i], pos / Ts[i], l, kind ? KVS_TILE_V : KVS_TILE_K) +
                        (pos % Ts[i]) * 32;
                    kv_same &= memcmp(c, p, 32 * sizeof(float)) == 0;
                }
            }
    CU_ASSERT(kv_same);
    /* pages out of range */
    CU_ASSERT_PTR_NULL(kvs_decoder_page(d[1], 32, 0, KVS_TILE_K));
    CU_ASSERT_PTR_NULL(kvs_decoder_page(d[1], 0, 5, KVS_TILE_K));
    for (int i = 0; i < 3; i++)
        kvs_decoder_free(d[i]);
}

/* Bad tokens and overlong sequences are refused and change nothing. */
static void test_forward_errors(void)
{
    char err[KVS_ERR_LEN];
    kvs_decoder *d;
    CU_ASSERT_FATAL(kvs_decoder_create(model, 32, &d, err) == 0);
    float a[512], b[512];
    uint32_t toks[3] = {1, 512, 5};
    CU_ASSERT_EQUAL(kvs_decoder_forward(d, toks, 3, NULL, a, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "token 1 = 512"));
    CU_ASSERT_EQUAL(kvs_decoder_len(d), 0);
    CU_ASSERT_EQUAL(kvs_decoder_forward(d, toks, 0, NULL, a, err), KVS_EINVAL);
    uint32_t *many = calloc(513, sizeof *many);
    CU_ASSERT_EQUAL(kvs_decoder_forward(d, many, 513, NULL, a, err), KVS_ENOSPC);
    CU_ASSERT_EQUAL(kvs_decoder_len(d), 0);
    CU_ASSERT_EQUAL(kvs_decoder_forward(d, many, 512, NULL, a, err), 0);
    CU_ASSERT_EQUAL(kvs_decoder_forward(d, many, 1, NULL, a, err), KVS_ENOSPC);
    CU_ASSERT_EQUAL(kvs_decoder_truncate(d, 513), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_decoder_truncate(d, 1), 0);
    CU_ASSERT_EQUAL(kvs_decoder_forward(d, many, 1, NULL, b, err), 0);
    /* position 1 after token 0, as at the start of the earlier run */
    kvs_decoder *e;
    CU_ASSERT_FATAL(kvs_decoder_create(model, 32, &e, err) == 0);
    CU_ASSERT_EQUAL(kvs_decoder_forward(e, many, 2, NULL, a, err), 0);
    CU_ASSERT_EQUAL(memcmp(a, b, sizeof a), 0);
    kvs_decoder_free(e);
    CU_ASSERT_EQUAL(kvs_decoder_create(model, 0, &e, err), KVS_EINVAL);
    CU_ASSERT_PTR_NULL(e);
    free(many);
    kvs_decoder_free(d);
}

/* ---- hostile checkpoints -------------------------------------------------------- */

static int parse_copy(const unsigned char *b, size_t len, char *err)
{
    kvs_model *m = NULL;
    int rc = kvs_model_parse(b, len, "t.bin", &m, err);
    if (rc == 0) {
        CU_ASSERT_PTR_NOT_NULL(m);
    } else {
        CU_ASSERT_PTR_NULL(m);
    }
    kvs_model_free(m);
    return rc;
}

/* Header field i set to v: KVS_EFORMAT and err mentions want. */
static void expect_header_error(int field, int32_t v, const char *want)
{
    unsigned char *b = malloc(model_len);
    memcpy(b, model_bytes, model_len);
    memcpy(b + 4 * field, &v, 4);
    char err[KVS_ERR_LEN] = "";
    int rc = parse_copy(b, model_len, err);
    CU_ASSERT_EQUAL(rc, KVS_EFORMAT);
    if (strstr(err, want) == NULL) {
        printf("\n  field %d = %d: error '%s' does not mention '%s'", field, v, err, want);
        CU_FAIL("error names the problem");
    }
    free(b);
}

static void test_hostile_header(void)
{
    char err[KVS_ERR_LEN];
    CU_ASSERT_EQUAL(parse_copy(model_bytes, model_len, err), 0);
    expect_header_error(0, 0, "dim = 0");
    expect_header_error(0, -64, "dim = -64");
    expect_header_error(0, 1 << 30, "dim = 1073741824");
    expect_header_error(1, 0, "hidden_dim");
    expect_header_error(1, INT32_MAX, "hidden_dim");
    expect_header_error(2, 0, "n_layers");
    expect_header_error(2, 100000, "n_layers");
    expect_header_error(3, 0, "n_heads");
    expect_header_error(3, 3, "n_heads = 3 does not divide dim = 64");
    expect_header_error(4, 3, "n_kv_heads = 3 does not divide n_heads = 8");
    expect_header_error(4, 16, "n_kv_heads = 16 does not divide");
    expect_header_error(4, 100000, "n_kv_heads");
    expect_header_error(5, 0, "vocab_size");
    expect_header_error(5, INT32_MIN, "vocab_size");
    expect_header_error(5, 1 << 24, "vocab_size");
    /* negative vocab: a separate classifier the file does not hold */
    expect_header_error(5, -512, "checkpoint size");
    expect_header_error(6, 0, "seq_len");
    expect_header_error(6, -1, "seq_len");
    expect_header_error(6, 513, "checkpoint size");
    /* head_dim 64 / 64 = 1 is odd */
    expect_header_error(3, 64, "head_dim");
    /* every dimension at its bound: a valid header whose size does not match */
    int32_t hdr[7] = {16384, 65536, 256, 1024, 256, 1 << 20, 1 << 16};
    kvs_model_config cfg;
    CU_ASSERT_EQUAL(kvs_model_check_header(hdr, model_len, &cfg, err), KVS_EFORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "checkpoint size"));
}

static void test_hostile_size(void)
{
    char err[KVS_ERR_LEN] = "";
    /* every truncation inside the header, and a sample of cuts in the weights */
    for (size_t len = 0; len < 28; len++) {
        CU_ASSERT_EQUAL(parse_copy(model_bytes, len, err), KVS_EFORMAT);
    }
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "header"));
    for (size_t len = 28; len < model_len; len += 4099) {
        CU_ASSERT_EQUAL(parse_copy(model_bytes, len, err), KVS_EFORMAT);
    }
    CU_ASSERT_EQUAL(parse_copy(model_bytes, model_len - 1, err), KVS_EFORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "implies 1056540"));
    unsigned char *b = malloc(model_len + 4);
    memcpy(b, model_bytes, model_len);
    memset(b + model_len, 0, 4);
    CU_ASSERT_EQUAL(parse_copy(b, model_len + 4, err), KVS_EFORMAT);
    /* a NaN weight */
    uint32_t nan = 0x7FC00000u;
    memcpy(b + 28 + 4 * 1000, &nan, 4);
    CU_ASSERT_EQUAL(parse_copy(b, model_len, err), KVS_EFORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "weight 1000"));
    free(b);
}

/* Fixed-seed mutants: random headers from interesting values against random
 * and exact sizes, and random byte flips in the real file's header. Nothing
 * crashes (the ASan build runs this too); an accepted header satisfies every
 * rule and its size is exactly what was given. */
static void test_hostile_mutants(void)
{
    static const int32_t vals[] = {
        0,         1,         -1,   2,    3,     7,     8,       64,
        172,       512,       513,  1024, 65536, 65537, 1 << 20, (1 << 20) + 1,
        INT32_MAX, INT32_MIN, -512, 4,    5};
    const size_t nv = sizeof vals / sizeof vals[0];
    uint64_t st = 0x9E3779B97F4A7C15ULL;
    char err[KVS_ERR_LEN];
    int accepted = 0, bad = 0;
    for (int it = 0; it < 200000; it++) {
        int32_t hdr[7];
        for (int f = 0; f < 7; f++) {
            st = st * 6364136223846793005ULL + 1442695040888963407ULL;
            hdr[f] = vals[(st >> 33) % nv];
        }
        kvs_model_config cfg;
        /* the size the header would need, computed independently where sane */
        int sane = 1;
        for (int f = 0; f < 7; f++)
            sane &= f == 5 ? (hdr[f] != 0 && hdr[f] != INT32_MIN) : hdr[f] > 0;
        uint64_t size = st >> 40;
        if (sane && hdr[0] % hdr[3] == 0 && hdr[3] % hdr[4] == 0 && (st & 1)) {
            uint64_t d = (uint64_t)hdr[0], h = (uint64_t)hdr[1], L = (uint64_t)hdr[2];
            uint64_t V = (uint64_t)(hdr[5] < 0 ? -(int64_t)hdr[5] : hdr[5]);
            uint64_t hs = d / (uint64_t)hdr[3], kvd = hs * (uint64_t)hdr[4];
            size = 28 + 4 * (V * d * (hdr[5] < 0 ? 2 : 1) + 2 * L * d + 2 * L * d * d +
                             2 * L * kvd * d + 3 * L * h * d + d + (uint64_t)hdr[6] * hs);
        }
        int rc = kvs_model_check_header(hdr, size, &cfg, err);
        if (rc == 0) {
            accepted++;
            bad += cfg.dim % cfg.n_heads != 0 || cfg.n_heads % cfg.n_kv_heads != 0 ||
                   cfg.head_dim % 2 != 0 || kvs_model_file_bytes(&cfg) != size ||
                   cfg.dim > KVS_MODEL_MAX_DIM || cfg.vocab_size > KVS_MODEL_MAX_VOCAB;
        } else {
            bad += rc != KVS_EFORMAT || err[0] == '\0';
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT(accepted > 50); /* 83 with this seed */
    printf("\n  %d of 200000 random headers valid ", accepted);
    /* byte flips in the real header: parse succeeds only with the original bytes */
    unsigned char *b = malloc(model_len);
    int flips_accepted = 0;
    for (int it = 0; it < 300; it++) {
        memcpy(b, model_bytes, model_len);
        st = st * 6364136223846793005ULL + 1442695040888963407ULL;
        b[(st >> 33) % 28] ^= (unsigned char)(1u << ((st >> 20) % 8));
        flips_accepted += parse_copy(b, model_len, err) == 0;
    }
    CU_ASSERT_EQUAL(flips_accepted, 0);
    free(b);
}

static void test_hostile_files(void)
{
    char path[256], err[KVS_ERR_LEN] = "";
    kvs_model *m = (kvs_model *)&m;
    snprintf(path, sizeof path, "%s/kvs-dec-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    int fd = mkstemp(path);
    CU_ASSERT_FATAL(fd >= 0);
    /* truncated in the weights */
    CU_ASSERT_FATAL(write(fd, model_bytes, 50000) == 50000);
    close(fd);
    CU_ASSERT_EQUAL(kvs_model_load(path, &m, err), KVS_EFORMAT);
    CU_ASSERT_PTR_NULL(m);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "50000 bytes"));
    /* header only, partial */
    FILE *f = fopen(path, "wb");
    fwrite(model_bytes, 1, 10, f);
    fclose(f);
    CU_ASSERT_EQUAL(kvs_model_load(path, &m, err), KVS_EFORMAT);
    /* the whole file loads, with the same fingerprint as from memory */
    f = fopen(path, "wb");
    fwrite(model_bytes, 1, model_len, f);
    fclose(f);
    CU_ASSERT_EQUAL(kvs_model_load(path, &m, err), 0);
    kvs_model *m2 = NULL;
    CU_ASSERT_EQUAL(kvs_model_parse(model_bytes, model_len, path, &m2, err), 0);
    CU_ASSERT_STRING_EQUAL(kvs_model_fingerprint(m), kvs_model_fingerprint(m2));
    kvs_model_free(m);
    kvs_model_free(m2);
    unlink(path);
    CU_ASSERT_EQUAL(kvs_model_load(path, &m, err), KVS_EIO);
    CU_ASSERT_EQUAL(kvs_model_load("/", &m, err), KVS_EIO);
}

/* ---- synthetic models ----------------------------------------------------------- */

static void test_synthetic(void)
{
    char err[KVS_ERR_LEN] = "";
    kvs_model_config cfg;
    CU_ASSERT_EQUAL(kvs_model_synthetic_spec(
                        "dim=128,layers=2,heads=4,kv_heads=2,vocab=300,seq=128", &cfg, err),
                    0);
    CU_ASSERT_EQUAL(cfg.dim, 128);
    CU_ASSERT_EQUAL(cfg.hidden_dim, 352); /* 2/3 * 512 = 341.3 -> 352 */
    CU_ASSERT_EQUAL(kvs_model_synthetic_spec("dim=128,bogus=2", &cfg, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "bogus"));
    CU_ASSERT_EQUAL(kvs_model_synthetic_spec("dim=", &cfg, err), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_model_synthetic_spec("dim=-3", &cfg, err), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_model_synthetic_spec("dim", &cfg, err), KVS_EINVAL);
    kvs_model *m = NULL, *m2 = NULL;
    CU_ASSERT_EQUAL(kvs_model_synthetic_spec("dim=96,heads=4,kv_heads=3", &cfg, err), 0);
    CU_ASSERT_EQUAL(kvs_model_synthetic(&cfg, 1, &m, err), KVS_EINVAL); /* 3 does not divide 4 */
    CU_ASSERT_PTR_NULL(m);
    CU_ASSERT_EQUAL(kvs_model_synthetic_spec(
                        "dim=128,layers=2,heads=4,kv_heads=2,vocab=300,seq=128", &cfg, err),
                    0);
    CU_ASSERT_FATAL(kvs_model_synthetic(&cfg, 7, &m, err) == 0);
    CU_ASSERT_FATAL(kvs_model_synthetic(&cfg, 7, &m2, err) == 0);
    kvs_decoder *d, *d2;
    CU_ASSERT_FATAL(kvs_decoder_create(m, 16, &d, err) == 0);
    CU_ASSERT_FATAL(kvs_decoder_create(m2, 16, &d2, err) == 0);
    uint32_t toks[40];
    for (int i = 0; i < 40; i++)
        toks[i] = (uint32_t)(i * 37 % 300);
    float a[300], b[300];
    CU_ASSERT_EQUAL(kvs_decoder_forward(d, toks, 40, NULL, a, err), 0);
    CU_ASSERT_EQUAL(kvs_decoder_forward(d2, toks, 40, NULL, b, err), 0);
    CU_ASSERT_EQUAL(memcmp(a, b, sizeof a), 0);
    int finite = 1;
    double var = 0;
    for (int i = 0; i < 300; i++)
        finite &= isfinite(a[i]), var += (double)a[i] * a[i];
    CU_ASSERT(finite);
    CU_ASSERT(var > 0);
    kvs_decoder_free(d), kvs_decoder_free(d2);
    kvs_model_free(m), kvs_model_free(m2);

    /* The fingerprint names the weights (it is the namespace's model in
     * server mode): models that differ only in hidden_dim have other weights,
     * so their fingerprints differ too, or one's KV would serve the other. */
    kvs_model_config c1, c2;
    CU_ASSERT_EQUAL(
        kvs_model_synthetic_spec("dim=128,layers=2,heads=4,kv_heads=2,vocab=300,seq=128,hidden=352",
                                 &c1, err),
        0);
    CU_ASSERT_EQUAL(
        kvs_model_synthetic_spec("dim=128,layers=2,heads=4,kv_heads=2,vocab=300,seq=128,hidden=384",
                                 &c2, err),
        0);
    m = m2 = NULL;
    CU_ASSERT_FATAL(kvs_model_synthetic(&c1, 7, &m, err) == 0);
    CU_ASSERT_FATAL(kvs_model_synthetic(&c2, 7, &m2, err) == 0);
    CU_ASSERT_STRING_NOT_EQUAL(kvs_model_fingerprint(m), kvs_model_fingerprint(m2));
    kvs_model_free(m), kvs_model_free(m2);
}

/* The AVX2 matrix product gives the bits of the SSE-width one (same lanes,
 * same tree, no FMA): logits of a synthetic model with I not a multiple of 8
 * (the tails) under each ISA. Skipped in part where the CPU lacks AVX2. */
static void test_isa_identical(void)
{
    char err[KVS_ERR_LEN] = "";
    kvs_model_config cfg;
    CU_ASSERT_FATAL(kvs_model_synthetic_spec("dim=100,layers=2,heads=2,kv_heads=1,vocab=301,"
                                             "seq=64,hidden=203",
                                             &cfg, err) == 0);
    kvs_model *m = NULL;
    CU_ASSERT_FATAL(kvs_model_synthetic(&cfg, 3, &m, err) == 0);
    uint32_t toks[40];
    for (int i = 0; i < 40; i++)
        toks[i] = (uint32_t)(i * 53 % 301);
    const kvs_cpu_isa was = kvs_cpu_isa_active();
    const kvs_cpu_isa isas[2] = {KVS_CPU_PORTABLE, KVS_CPU_AVX2};
    float *lg[2];
    int ran = 0;
    for (int k = 0; k < 2; k++) {
        lg[k] = calloc((size_t)40 * 301, sizeof(float));
        if (kvs_cpu_isa_force(isas[k]) != 0)
            continue;
        kvs_decoder *d;
        CU_ASSERT_FATAL(kvs_decoder_create(m, 16, &d, err) == 0);
        CU_ASSERT(kvs_decoder_forward(d, toks, 40, lg[k], NULL, err) == 0);
        kvs_decoder_free(d);
        ran++;
    }
    kvs_cpu_isa_force(was);
    if (ran == 2) {
        CU_ASSERT_EQUAL(memcmp(lg[0], lg[1], (size_t)40 * 301 * sizeof(float)), 0);
    } else {
        printf("\n  no AVX2 here: only the portable path ran ");
    }
    free(lg[0]), free(lg[1]);
    kvs_model_free(m);
}

/* ---- reused blocks -------------------------------------------------------------- */

/* Encodes block b of decoder src (all layers) with scheme into a new buffer. */
static void *encode_page(kvs_decoder *src, uint32_t b, kvs_scheme scheme, size_t *len)
{
    kvs_scheme schemes[5];
    for (int l = 0; l < 5; l++)
        schemes[l] = scheme;
    kvs_block_params p = {.layers = 5,
                          .heads = 4,
                          .head_dim = 8,
                          .block_tokens = 32,
                          .src_dtype = KVS_DTYPE_FP32,
                          .root = b == 0,
                          .schemes = schemes};
    const void *k[5], *v[5];
    for (uint32_t l = 0; l < 5; l++) {
        k[l] = kvs_decoder_page(src, b, l, KVS_TILE_K);
        v[l] = kvs_decoder_page(src, b, l, KVS_TILE_V);
    }
    *len = kvs_block_size(&p);
    void *out = aligned_alloc(64, (*len + 63) & ~(size_t)63);
    char err[KVS_ERR_LEN];
    CU_ASSERT_FATAL(kvs_block_encode(&p, k, v, NULL, out, *len, err) == 0);
    return out;
}

/* Blocks encoded as fp16 and decoded into a fresh decoder's pages give
 * exactly the logits of a decoder whose pages hold the fp32 KV rounded to
 * fp16 (kvq_math.h, independent of the block code), and the same next token
 * as the no-cache run within a tiny KL. */
static void test_reused_fp16_blocks(void)
{
    char err[KVS_ERR_LEN];
    kvs_decoder *base, *run, *round;
    CU_ASSERT_FATAL(kvs_decoder_create(model, 32, &base, err) == 0);
    CU_ASSERT_FATAL(kvs_decoder_create(model, 32, &run, err) == 0);
    CU_ASSERT_FATAL(kvs_decoder_create(model, 32, &round, err) == 0);
    uint32_t toks[200];
    toks[0] = KVS_MODEL_BOS;
    memcpy(toks + 1, ref_ids, 199 * sizeof *toks);
    float lb[512], lr[512], lq[512];
    CU_ASSERT_FATAL(kvs_decoder_forward(base, toks, 200, NULL, lb, err) == 0);
    const uint32_t hits = 6; /* 192 tokens reused, 8 computed */
    for (uint32_t b = 0; b < hits; b++) {
        size_t len;
        void *blk = encode_page(base, b, KVS_SCHEME_FP16, &len);
        for (uint32_t l = 0; l < 5; l++) {
            CU_ASSERT_FATAL(kvs_block_decode_layer(blk, len, l, KVS_DTYPE_FP32,
                                                   kvs_decoder_page(run, b, l, KVS_TILE_K),
                                                   kvs_decoder_page(run, b, l, KVS_TILE_V), NULL,
                                                   err) == 0);
            for (int kind = 0; kind < 2; kind++) {
                kvs_tile_kind tk = kind ? KVS_TILE_V : KVS_TILE_K;
                const float *s = kvs_decoder_page(base, b, l, tk);
                float *dst = kvs_decoder_page(round, b, l, tk);
                for (int i = 0; i < 32 * 32; i++)
                    dst[i] = kvq_fp16_to_f32(kvq_f32_to_fp16(s[i]));
            }
        }
        free(blk);
    }
    CU_ASSERT_EQUAL(kvs_decoder_extend(run, hits * 32), 0);
    CU_ASSERT_EQUAL(kvs_decoder_extend(round, hits * 32), 0);
    CU_ASSERT_EQUAL(kvs_decoder_forward(run, toks + 192, 8, NULL, lr, err), 0);
    CU_ASSERT_EQUAL(kvs_decoder_forward(round, toks + 192, 8, NULL, lq, err), 0);
    CU_ASSERT_EQUAL(memcmp(lr, lq, sizeof lr), 0);
    CU_ASSERT_EQUAL(kvs_argmax(lr, 512), kvs_argmax(lb, 512));
    double maxdiff = 0;
    for (int i = 0; i < 512; i++)
        maxdiff = fmax(maxdiff, fabs((double)lr[i] - lb[i]));
    printf("\n  max |logit(fp16 blocks) - logit(fp32)| = %.3e ", maxdiff);
    CU_ASSERT(maxdiff < 5e-2);
    CU_ASSERT(maxdiff > 0); /* fp16 does round this KV */
    /* the same blocks as int8: close, not equal */
    kvs_decoder_truncate(run, 0);
    for (uint32_t b = 0; b < hits; b++) {
        size_t len;
        void *blk = encode_page(base, b, KVS_SCHEME_INT8, &len);
        for (uint32_t l = 0; l < 5; l++)
            CU_ASSERT_FATAL(kvs_block_decode_layer(blk, len, l, KVS_DTYPE_FP32,
                                                   kvs_decoder_page(run, b, l, KVS_TILE_K),
                                                   kvs_decoder_page(run, b, l, KVS_TILE_V), NULL,
                                                   err) == 0);
        free(blk);
    }
    CU_ASSERT_EQUAL(kvs_decoder_extend(run, hits * 32), 0);
    CU_ASSERT_EQUAL(kvs_decoder_forward(run, toks + 192, 8, NULL, lr, err), 0);
    CU_ASSERT_NOT_EQUAL(memcmp(lr, lb, sizeof lr), 0);
    CU_ASSERT_EQUAL(kvs_decoder_extend(run, 400), KVS_ENOSPC);
    kvs_decoder_free(base), kvs_decoder_free(run), kvs_decoder_free(round);
}

/* kvs_decoder_rope_keys rotates a pre-RoPE key exactly as the forward pass
 * does. Layer 0's K of a token does not depend on its context, and position
 * 0 rotates by angle 0 (exactly the identity), so a token fed alone gives its
 * pre-RoPE layer-0 key; rotated to position p it must equal, bit for bit, the
 * layer-0 key the forward pass cached for that token at p. */
static void test_rope_keys(void)
{
    char err[KVS_ERR_LEN];
    kvs_decoder *seq_d, *one;
    CU_ASSERT_FATAL(kvs_decoder_create(model, 32, &seq_d, err) == 0);
    CU_ASSERT_FATAL(kvs_decoder_create(model, 32, &one, err) == 0);
    uint32_t toks[200];
    toks[0] = KVS_MODEL_BOS;
    memcpy(toks + 1, ref_ids, 199 * sizeof *toks);
    float last[512];
    CU_ASSERT_FATAL(kvs_decoder_forward(seq_d, toks, 200, NULL, last, err) == 0);
    static const uint32_t ps[] = {1, 2, 31, 32, 77, 199};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
        const uint32_t p = ps[i];
        kvs_decoder_truncate(one, 0);
        CU_ASSERT_FATAL(kvs_decoder_forward(one, &toks[p], 1, NULL, last, err) == 0);
        float pre[32], k[32], back[32];
        memcpy(pre, kvs_decoder_page(one, 0, 0, KVS_TILE_K), sizeof pre);
        const float *post = kvs_decoder_page(seq_d, p / 32, 0, KVS_TILE_K) + (p % 32) * 32;
        CU_ASSERT_NOT_EQUAL(memcmp(pre, post, sizeof pre), 0); /* RoPE moved it */
        memcpy(k, pre, sizeof k);
        CU_ASSERT_EQUAL(kvs_decoder_rope_keys(one, k, p, 1, 0), 0);
        CU_ASSERT_EQUAL(memcmp(k, post, sizeof k), 0);
        /* the inverse takes it back to within a few ulp */
        memcpy(back, post, sizeof back);
        CU_ASSERT_EQUAL(kvs_decoder_rope_keys(one, back, p, 1, 1), 0);
        double worst = 0;
        for (int e = 0; e < 32; e++)
            worst = fmax(worst, fabs((double)back[e] - pre[e]) / (fabs((double)pre[e]) + 1e-3));
        CU_ASSERT(worst < 1e-5);
    }
    /* rows are kv_dim apart and each has its own position: one call over a
     * whole page equals row-by-row calls */
    float page[32 * 32], rows[32 * 32];
    memcpy(page, kvs_decoder_page(seq_d, 2, 3, KVS_TILE_K), sizeof page);
    memcpy(rows, page, sizeof rows);
    CU_ASSERT_EQUAL(kvs_decoder_rope_keys(seq_d, page, 64, 32, 1), 0);
    for (uint32_t t = 0; t < 32; t++)
        CU_ASSERT_EQUAL(kvs_decoder_rope_keys(seq_d, rows + t * 32, 64 + t, 1, 1), 0);
    CU_ASSERT_EQUAL(memcmp(page, rows, sizeof page), 0);
    CU_ASSERT_EQUAL(kvs_decoder_rope_keys(seq_d, page, 0, 0, 0), 0);
    CU_ASSERT_EQUAL(kvs_decoder_rope_keys(NULL, page, 0, 1, 0), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_decoder_rope_keys(seq_d, NULL, 0, 1, 0), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_decoder_rope_keys(seq_d, page, 511, 2, 0), KVS_EINVAL);
    kvs_decoder_free(seq_d), kvs_decoder_free(one);
}

/* ---- the workload driver --------------------------------------------------------- */

/* The small workload of these tests: o's options with 8 conversations x 2
 * turns, 8 generated tokens, contexts up to 256. */
static void run_wl_opts(kvs_wl_opts *o, kvs_wl_report *r, char *last_line)
{
    o->conversations = 8;
    o->turns = 2;
    o->gen_tokens = 8;
    o->max_context = 256;
    char err[KVS_ERR_LEN] = "";
    int rc = kvs_workload_run(model, o, r, err);
    if (rc != 0)
        printf("\n  workload: %s", err);
    CU_ASSERT_FATAL(rc == 0);
    FILE *f = tmpfile();
    kvs_wl_report_print(model, o, r, f);
    rewind(f);
    char line[512];
    last_line[0] = '\0';
    while (fgets(line, sizeof line, f))
        strcpy(last_line, line);
    fclose(f);
}

static void run_wl_dt(kvs_wl_mode mode, kvs_scheme scheme, kvs_dtype kv, kvs_wl_report *r,
                      char *last_line)
{
    kvs_wl_opts o;
    kvs_wl_opts_default(&o);
    o.kv_dtype = kv;
    o.mode = mode;
    o.scheme = scheme;
    run_wl_opts(&o, r, last_line);
}

static void run_wl(kvs_wl_mode mode, kvs_scheme scheme, kvs_wl_report *r, char *last_line)
{
    run_wl_dt(mode, scheme, KVS_DTYPE_FP32, r, last_line);
}

/* With an fp16 KV cache in both runs, reused fp16 blocks are exact: every
 * next-token distribution equals the no-cache run's (KL exactly 0). */
static void test_workload_fp16_cache(void)
{
    kvs_wl_report r, r8;
    char line[512];
    run_wl_dt(KVS_WL_LOCAL_QUANT, KVS_SCHEME_FP16, KVS_DTYPE_FP16, &r, line);
    CU_ASSERT(r.reused_tokens > 0);
    CU_ASSERT_EQUAL(r.all.top1, r.all.positions);
    CU_ASSERT_EQUAL(r.all.kl_sum, 0.0);
    CU_ASSERT_EQUAL(r.all.nll_base, r.all.nll_run);
    CU_ASSERT_EQUAL(strncmp(line, "RESULT scheme=fp16 top1=1.000000 kl=0.000000e+00 ", 49), 0);
    /* int8 blocks still move the distributions */
    run_wl_dt(KVS_WL_LOCAL_QUANT, KVS_SCHEME_INT8, KVS_DTYPE_FP16, &r8, line);
    CU_ASSERT(r8.all.kl_sum > 0);
    /* and an fp16 cache is not the fp32 one */
    kvs_decoder *d;
    char err[KVS_ERR_LEN];
    CU_ASSERT_FATAL(kvs_decoder_create(model, 32, &d, err) == 0);
    CU_ASSERT_EQUAL(kvs_decoder_set_kv_dtype(d, KVS_DTYPE_FP16), 0);
    CU_ASSERT_EQUAL(kvs_decoder_set_kv_dtype(d, (kvs_dtype)9), KVS_EINVAL);
    uint32_t toks[2] = {KVS_MODEL_BOS, ref_ids[0]};
    float lg[512];
    CU_ASSERT_EQUAL(kvs_decoder_forward(d, toks, 2, NULL, lg, err), 0);
    int exact = 1;
    for (uint32_t l = 0; l < 5; l++) {
        const float *k = kvs_decoder_page(d, 0, l, KVS_TILE_K);
        for (int i = 0; i < 2 * 32; i++)
            exact &= kvq_fp16_to_f32(kvq_f32_to_fp16(k[i])) == k[i];
    }
    CU_ASSERT(exact);
    CU_ASSERT_NOT_EQUAL(memcmp(lg, ref_logits[1], sizeof ref_logits[1]), 0);
    kvs_decoder_free(d);
}

static void test_workload(void)
{
    kvs_wl_report nc, f16, i8;
    char l0[512], l1[512], l2[512];
    run_wl(KVS_WL_NO_CACHE, KVS_SCHEME_INT8, &nc, l0);
    run_wl(KVS_WL_LOCAL_QUANT, KVS_SCHEME_FP16, &f16, l1);
    run_wl(KVS_WL_LOCAL_QUANT, KVS_SCHEME_INT8, &i8, l2);
    /* same prompts in every mode */
    CU_ASSERT_EQUAL(nc.requests, 16);
    CU_ASSERT_EQUAL(f16.prompt_tokens, nc.prompt_tokens);
    CU_ASSERT_EQUAL(i8.prompt_tokens, nc.prompt_tokens);
    CU_ASSERT_EQUAL(nc.all.positions, 16 * 8);
    CU_ASSERT_EQUAL(nc.reused_tokens, 0);
    CU_ASSERT_EQUAL(nc.all.top1, nc.all.positions);
    CU_ASSERT_EQUAL(strncmp(l0, "RESULT scheme=none top1=1.000000 kl=0.000000e+00 ", 49), 0);
    /* shared prefixes are found; quality of fp16 is near-exact, int8 close */
    CU_ASSERT(f16.reused_tokens > 0);
    CU_ASSERT_EQUAL(f16.reused_tokens, i8.reused_tokens);
    CU_ASSERT_EQUAL(f16.reused_tokens % 32, 0);
    CU_ASSERT(f16.blocks_stored > 0);
    CU_ASSERT(f16.all.kl_sum / (double)f16.all.positions < 1e-4);
    CU_ASSERT(i8.all.kl_sum / (double)i8.all.positions < 5e-3);
    CU_ASSERT(i8.all.kl_sum > f16.all.kl_sum);
    CU_ASSERT(f16.all.top1 >= f16.all.positions - 1);
    uint64_t pos = 0;
    for (int b = 0; b < KVS_WL_BUCKETS; b++)
        pos += i8.bucket[b].positions;
    CU_ASSERT_EQUAL(pos, i8.all.positions);
    CU_ASSERT_EQUAL(strncmp(l1, "RESULT scheme=fp16 top1=", 24), 0);
    char want[64];
    snprintf(want, sizeof want, " reused_tokens=%llu\n", (unsigned long long)i8.reused_tokens);
    CU_ASSERT_PTR_NOT_NULL(strstr(l2, want));
    printf("\n  %s  %s  %s", l0, l1, l2);
    /* bad options */
    kvs_wl_opts o;
    kvs_wl_opts_default(&o);
    kvs_wl_report r;
    char err[KVS_ERR_LEN];
    o.block_tokens = 8;
    CU_ASSERT_EQUAL(kvs_workload_run(model, &o, &r, err), KVS_EINVAL);
    kvs_wl_opts_default(&o);
    o.max_context = 1000;
    CU_ASSERT_EQUAL(kvs_workload_run(model, &o, &r, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "max_context"));
}

/* --skip-layers: listed layers are stored at fp16 whatever the scheme. All
 * of them: exactly the fp16 run (same distributions, same bytes). Layer 0
 * only: between int8 and fp16 in KL and in bytes. A layer past the model's
 * is refused. */
static void test_workload_skip_layers(void)
{
    kvs_wl_opts o;
    kvs_wl_report f16, i8, all, one;
    char line[512];
    kvs_wl_opts_default(&o);
    o.mode = KVS_WL_LOCAL_QUANT;
    o.scheme = KVS_SCHEME_FP16;
    run_wl_opts(&o, &f16, line);
    o.scheme = KVS_SCHEME_INT8;
    run_wl_opts(&o, &i8, line);
    memset(o.skip_layer, 1, 5);
    run_wl_opts(&o, &all, line);
    CU_ASSERT(all.reused_tokens > 0);
    CU_ASSERT_EQUAL(all.reused_tokens, f16.reused_tokens);
    CU_ASSERT_EQUAL(all.all.top1, f16.all.top1);
    CU_ASSERT_EQUAL(all.all.kl_sum, f16.all.kl_sum);
    CU_ASSERT_EQUAL(all.all.nll_run, f16.all.nll_run);
    CU_ASSERT_EQUAL(all.bytes_stored, f16.bytes_stored);
    CU_ASSERT_PTR_NOT_NULL(strstr(line, "RESULT scheme=int8 "));
    memset(o.skip_layer, 0, sizeof o.skip_layer);
    o.skip_layer[0] = 1;
    run_wl_opts(&o, &one, line);
    CU_ASSERT_EQUAL(one.reused_tokens, i8.reused_tokens);
    CU_ASSERT(one.all.kl_sum < i8.all.kl_sum);
    CU_ASSERT(one.all.kl_sum > f16.all.kl_sum);
    CU_ASSERT(one.bytes_stored > i8.bytes_stored);
    CU_ASSERT(one.bytes_stored < f16.bytes_stored);
    FILE *f = tmpfile();
    kvs_wl_report_print(model, &o, &one, f);
    rewind(f);
    char text[4096];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, ", fp16 layers 0\n"));
    o.skip_layer[5] = 1;
    kvs_wl_report r;
    char err[KVS_ERR_LEN];
    CU_ASSERT_EQUAL(kvs_workload_run(model, &o, &r, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "skip layer 5"));
}

/* Keys stored pre-RoPE and rotated after each fetch. With fp16 blocks and an
 * fp16 cache the run is no longer exact (fp16 rounds the unrotated keys), but
 * only by fp16 rounding: a fetch that skipped or misplaced the rotation would
 * give far larger KL. int8 blocks behave like post-RoPE ones. */
static void test_workload_k_pre_rope(void)
{
    kvs_wl_opts o;
    kvs_wl_report post, pre, i8post, i8pre;
    char line[512];
    kvs_wl_opts_default(&o);
    o.mode = KVS_WL_LOCAL_QUANT;
    o.scheme = KVS_SCHEME_FP16;
    o.kv_dtype = KVS_DTYPE_FP16;
    run_wl_opts(&o, &post, line);
    o.k_rope = KVS_WL_K_PRE_ROPE;
    run_wl_opts(&o, &pre, line);
    CU_ASSERT_EQUAL(post.all.kl_sum, 0.0);
    CU_ASSERT(pre.reused_tokens > 0);
    CU_ASSERT_EQUAL(pre.reused_tokens, post.reused_tokens);
    CU_ASSERT(pre.all.kl_sum > 0);
    CU_ASSERT(pre.all.kl_sum / (double)pre.all.positions < 1e-4);
    CU_ASSERT(pre.all.top1 >= pre.all.positions - 1);
    o.kv_dtype = KVS_DTYPE_FP32;
    o.scheme = KVS_SCHEME_INT8;
    run_wl_opts(&o, &i8pre, line);
    o.k_rope = KVS_WL_K_POST_ROPE;
    run_wl_opts(&o, &i8post, line);
    CU_ASSERT_EQUAL(i8pre.reused_tokens, i8post.reused_tokens);
    CU_ASSERT_EQUAL(i8pre.bytes_stored, i8post.bytes_stored);
    CU_ASSERT(i8pre.all.kl_sum != i8post.all.kl_sum);
    CU_ASSERT(i8pre.all.kl_sum < 2 * i8post.all.kl_sum);
    CU_ASSERT(i8pre.all.kl_sum / (double)i8pre.all.positions < 5e-3);
    o.k_rope = (kvs_wl_k_rope)2;
    kvs_wl_report r;
    char err[KVS_ERR_LEN];
    CU_ASSERT_EQUAL(kvs_workload_run(model, &o, &r, err), KVS_EINVAL);
    o.k_rope = KVS_WL_K_PRE_ROPE;
    o.mode = KVS_WL_SERVER;
    o.server = "127.0.0.1:1";
    CU_ASSERT_EQUAL(kvs_workload_run(model, &o, &r, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "local-quant"));
}

/* --k-offsets: int8 blocks whose K tiles carry per-channel key offsets
 * (kv_format.h rule 5). Every stored block says so in its header
 * (KVS_BLOCK_F_KOFF), each costs exactly 2 * head_dim bytes (16-aligned)
 * more per K tile, and the reused KV is at least as good as without: KL and
 * top-1 against the fp32 run, which are deterministic. A decoder that left
 * the offsets out would be far worse. fp16 blocks have no K tiles to offset:
 * the option changes nothing there. Other modes refuse it. */
static void test_workload_key_offsets(void)
{
    kvs_wl_opts o;
    kvs_wl_report i8, ko, f16, f16ko;
    char line[512];
    kvs_wl_opts_default(&o);
    o.mode = KVS_WL_LOCAL_QUANT;
    o.scheme = KVS_SCHEME_INT8;
    run_wl_opts(&o, &i8, line);
    o.key_offsets = 1;
    run_wl_opts(&o, &ko, line);
    CU_ASSERT_PTR_NOT_NULL(strstr(line, "RESULT scheme=int8 "));
    CU_ASSERT(ko.blocks_stored > 0);
    CU_ASSERT_EQUAL(ko.blocks_stored, i8.blocks_stored);
    CU_ASSERT_EQUAL(ko.reused_tokens, i8.reused_tokens);
    CU_ASSERT_EQUAL(ko.blocks_koff, ko.blocks_stored);
    CU_ASSERT_EQUAL(i8.blocks_koff, 0);
    const kvs_model_config *c = kvs_model_cfg(model);
    const uint64_t extra =
        kvs_tile_bytes_ex(KVS_SCHEME_INT8, KVS_TILE_K, 32, c->head_dim, 3, 0, 1) -
        kvs_tile_bytes(KVS_SCHEME_INT8, KVS_TILE_K, 32, c->head_dim, 3, 0);
    CU_ASSERT_EQUAL(extra, (2u * c->head_dim + 15u) / 16u * 16u);
    CU_ASSERT_EQUAL(ko.bytes_stored,
                    i8.bytes_stored + ko.blocks_stored * c->n_layers * c->n_kv_heads * extra);
    CU_ASSERT(ko.all.kl_sum > 0);
    CU_ASSERT(ko.all.kl_sum <= i8.all.kl_sum);
    CU_ASSERT(ko.all.top1 >= i8.all.top1);
    printf("\n  int8 kl %.4e top1 %llu/%llu; with key offsets kl %.4e top1 %llu",
           i8.all.kl_sum / (double)i8.all.positions, (unsigned long long)i8.all.top1,
           (unsigned long long)i8.all.positions, ko.all.kl_sum / (double)ko.all.positions,
           (unsigned long long)ko.all.top1);
    FILE *f = tmpfile();
    kvs_wl_report_print(model, &o, &ko, f);
    rewind(f);
    char text[4096];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "sinks S=1 (root blocks), key offsets\n"));
    /* fp16: nothing to offset */
    o.scheme = KVS_SCHEME_FP16;
    run_wl_opts(&o, &f16ko, line);
    o.key_offsets = 0;
    run_wl_opts(&o, &f16, line);
    CU_ASSERT_EQUAL(f16ko.blocks_koff, 0);
    CU_ASSERT_EQUAL(f16ko.bytes_stored, f16.bytes_stored);
    CU_ASSERT_EQUAL(f16ko.all.kl_sum, f16.all.kl_sum);
    /* a local-quant option */
    kvs_wl_report r;
    char err[KVS_ERR_LEN];
    o.key_offsets = 1;
    o.mode = KVS_WL_SERVER;
    o.server = "127.0.0.1:1";
    CU_ASSERT_EQUAL(kvs_workload_run(model, &o, &r, err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "key offsets are a local-quant option"));
}

/* ---- sample files ---------------------------------------------------------------- */

static void test_dump_kv(void)
{
    char err[KVS_ERR_LEN], path[256];
    kvs_decoder *d;
    CU_ASSERT_FATAL(kvs_decoder_create(model, 32, &d, err) == 0);
    float *q = calloc((size_t)5 * 512 * 64, sizeof(float));
    kvs_decoder_capture_q(d, q);
    uint32_t toks[70];
    toks[0] = KVS_MODEL_BOS;
    memcpy(toks + 1, ref_ids, 69 * sizeof *toks);
    float last[512];
    CU_ASSERT_FATAL(kvs_decoder_forward(d, toks, 70, NULL, last, err) == 0);
    snprintf(path, sizeof path, "%s/kvs-dec-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    int fd = mkstemp(path);
    CU_ASSERT_FATAL(fd >= 0);
    close(fd);
    CU_ASSERT_EQUAL_FATAL(kvs_decoder_dump_kv(d, q, 70, path, err), 0);
    kvs_sample *s = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_sample_read(path, &s, err), 0);
    CU_ASSERT_EQUAL(s->info.num_layers, 5);
    CU_ASSERT_EQUAL(s->info.num_kv_heads, 4);
    CU_ASSERT_EQUAL(s->info.head_dim, 8);
    CU_ASSERT_EQUAL(s->info.num_q_heads, 8);
    CU_ASSERT_EQUAL(s->info.tokens, 70);
    CU_ASSERT_EQUAL(s->info.dtype, KVS_DTYPE_FP32);
    CU_ASSERT_EQUAL(s->info.flags, KVS_SAMPLE_F_POST_ROPE | KVS_SAMPLE_F_QUERIES);
    CU_ASSERT_STRING_EQUAL(s->info.model, kvs_model_fingerprint(model));
    int same = 1;
    for (uint32_t l = 0; l < 5; l++)
        for (uint32_t t = 0; t < 70; t++)
            for (uint32_t h = 0; h < 4; h++)
                for (uint32_t e = 0; e < 8; e++) {
                    size_t off = (size_t)(t % 32) * 32 + h * 8 + e;
                    same &= kvs_sample_value(s, KVS_SAMPLE_K, l, t, h, e) ==
                            kvs_decoder_page(d, t / 32, l, KVS_TILE_K)[off];
                    same &= kvs_sample_value(s, KVS_SAMPLE_V, l, t, h, e) ==
                            kvs_decoder_page(d, t / 32, l, KVS_TILE_V)[off];
                    same &= kvs_sample_value(s, KVS_SAMPLE_Q, l, t, 2 * h + 1, e) ==
                            q[((size_t)l * 512 + t) * 64 + (2 * h + 1) * 8 + e];
                }
    CU_ASSERT(same);
    kvs_sample_free(s);
    CU_ASSERT_EQUAL(kvs_decoder_dump_kv(d, q, 71, path, err), KVS_EINVAL);
    unlink(path);
    free(q);
    kvs_decoder_free(d);
}

static const kvs_test_case model_cases[] = {
    {"config of stories260K", test_config},
    {"greedy from BOS reproduces the reference", test_reference_greedy},
    {"prefill equals token by token, bit for bit", test_reference_prefill},
    {"paged cache equals contiguous", test_paged_equals_contiguous},
    {"forward refuses bad tokens and overlong sequences", test_forward_errors},
    {"hostile header fields", test_hostile_header},
    {"truncated, padded and NaN checkpoints", test_hostile_size},
    {"hostile files on disk", test_hostile_files},
    {"hostile header mutants", test_hostile_mutants},
    {"synthetic models", test_synthetic},
    {"AVX2 and SSE matrix products give the same bits", test_isa_identical},
    {"reused fp16 blocks equal fp16-rounded KV exactly", test_reused_fp16_blocks},
    {"RoPE of stored keys equals the forward pass's", test_rope_keys},
    {"workload driver", test_workload},
    {"skip layers are stored at fp16", test_workload_skip_layers},
    {"keys stored pre-RoPE, rotated after the fetch", test_workload_k_pre_rope},
    {"key offsets: flagged blocks, 2 * D bytes per K tile, KL no worse", test_workload_key_offsets},
    {"fp16 KV cache: reused fp16 blocks are exact", test_workload_fp16_cache},
    {"dump-kv writes readable KVSM samples", test_dump_kv},
    {NULL, NULL},
};

static const kvs_test_suite suites[] = {
    {"decoder", suite_init, suite_cleanup, model_cases},
    {NULL, NULL, NULL, NULL},
};

int main(int argc, char **argv)
{
    model_dir = argc > 1 ? argv[1] : "models";
    char path[4096];
    snprintf(path, sizeof path, "%s/stories260K.bin", model_dir);
    if (access(path, R_OK) != 0) {
        fprintf(stderr, "test_decoder: %s not found: skipped\n", path);
        return KVS_TEST_SKIP;
    }
    return kvs_test_run(suites);
}
