/*
 * test_profile_rules.c — a model rule's calibration profile ([model.PATTERN]
 * profile = PATH) against a real kvstashd: the per-tensor scales it gives a
 * Put, what a namespace of another shape gets, and how a bad profile is
 * refused at start and by SetConfig.
 *
 * Usage: test_profile_rules /path/to/kvstashd (ctest passes it).
 *
 * The suite writes two profiles (L = 2, H = 2, D = 64, fp8_e4m3, post-RoPE)
 * with per-layer K and V amax chosen so that fp16(amax / 448) is not a power
 * of two, and starts kvstashd with a [model.prof/...] section (pattern
 * "prof/" + '*'): scheme = fp8_e4m3, profile = the first. Stored blocks come back with Get in
 * stored format and their tiles are read through kernels/kv_format.h: every group scale of an FP8
 * tile of layer l must be fp16(tensor scale of l) * 2^e. The same check on a
 * block of a model without a profile must fail (so the check can).
 */
#include "kvq_calib.h"
#include "kvq_math.h"
#include "kv_format.h"
#include "kvs_itest.h"
#include "kvs_server_proc.h"
#include "kvs_test.h"
#include "kvstash.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { L = 2, H = 2, D = 64, T = 16 };

static const char *g_kvstashd;
static kvs_server_proc g_srv;
static kvs_client *g_client;
static char g_dir[64] = "/tmp/kvs-profrules-XXXXXX";
static char g_ini[128], g_prof[2][128];
/* amax of profile p, layer l, K (0) / V (1) */
static const float g_amax[2][L][2] = {{{9.7f, 3.1f}, {13.3f, 4.7f}}, {{5.3f, 1.9f}, {21.1f, 2.9f}}};

/* ---- helpers ---------------------------------------------------------------- */

static int write_profile(const char *path, int which)
{
    kvs_profile shape;
    memset(&shape, 0, sizeof shape);
    strcpy(shape.model, "prof-model");
    shape.num_layers = L;
    shape.num_kv_heads = H;
    shape.head_dim = D;
    shape.block_tokens = 256;     /* not the namespace's: block_tokens need not match */
    shape.dtype = KVS_DTYPE_BF16; /* nor the dtype */
    shape.post_rope = 1;
    shape.scheme = KVS_SCHEME_FP8_E4M3;
    shape.percentile = 100.0;
    shape.samples = 1;
    shape.tokens = 256;
    kvs_profile *p = NULL;
    char err[KVS_ERR_LEN] = "";
    int rc = kvs_profile_create(&shape, &p, err);
    for (size_t i = 0; rc == 0 && i < (size_t)L * H * D; i++)
        p->k_scales[i] = 0.02f;
    for (size_t i = 0; rc == 0 && i < (size_t)L * H; i++)
        p->v_scales[i] = 0.01f;
    for (int l = 0; rc == 0 && l < L; l++) {
        p->layers[l].k_amax = g_amax[which][l][0];
        p->layers[l].v_amax = g_amax[which][l][1];
        p->layers[l].k_tensor_scale = g_amax[which][l][0] / 448.0f;
        p->layers[l].v_tensor_scale = g_amax[which][l][1] / 448.0f;
    }
    if (rc == 0)
        rc = kvs_profile_write(path, p, err);
    if (rc != 0)
        fprintf(stderr, "cannot write profile %s: %s\n", path, err);
    kvs_profile_free(p);
    return rc;
}

static kvs_ns make_ns(const char *model, unsigned head_dim)
{
    return kvs_itest_ns(model, L, H, head_dim, T, 1 /* fp16 */);
}

/* fp16 K and V of one block: keys with an outlier channel, per-channel spread. */
typedef struct block {
    uint16_t k[L][T * H * D], v[L][T * H * D];
} block;

static void block_fill(block *b, unsigned head_dim, uint64_t seed)
{
    uint64_t s = seed * 2654435761u + 1;
    size_t n = (size_t)T * H * head_dim;
    for (int l = 0; l < L; l++) {
        for (size_t i = 0; i < n; i++) {
            float x[2];
            for (int j = 0; j < 2; j++) {
                s ^= s << 13, s ^= s >> 7, s ^= s << 17;
                x[j] = ((float)(s >> 40) / (float)(1u << 24) - 0.5f) * 4.0f;
            }
            size_t d = i % head_dim;
            b->k[l][i] = kvq_f32_to_fp16(x[0] * (d == 3 ? 6.0f : 1.0f + (float)(d % 7)));
            b->v[l][i] = kvq_f32_to_fp16(x[1] * (1.0f + (float)(i / (H * head_dim)) / 4.0f));
        }
    }
}

static int put(const kvs_ns *ns, const block *b, unsigned scheme, unsigned tok_base,
               kvs_put_result *res, unsigned *layer_scheme, char *err)
{
    const void *k[L] = {b->k[0], b->k[1]}, *v[L] = {b->v[0], b->v[1]};
    unsigned tokens[T];
    for (int i = 0; i < T; i++)
        tokens[i] = tok_base + (unsigned)i * 3u;
    kvs_put_args a;
    memset(&a, 0, sizeof a);
    a.ns = ns;
    a.tokens = tokens;
    a.scheme = scheme;
    a.k = k;
    a.v = v;
    memset(res, 0, sizeof *res);
    res->layer_scheme = layer_scheme;
    return kvs_client_put(g_client, &a, -1, res, err);
}

static double profile_stat(const char *result)
{
    return kvs_itest_stat(g_client, "kvstash_put_profile_blocks_total", "result", result);
}

/* The stored K and V tiles of one block's layers (copied from Get). */
typedef struct stored {
    unsigned char *k[L], *v[L];
    size_t kl[L], vl[L];
    int bad;
} stored;

static int stored_cb(void *arg, unsigned b, unsigned l, const void *k, size_t kl, const void *v,
                     size_t vl, float ks, float vs, int last)
{
    (void)ks, (void)vs, (void)last;
    stored *x = arg;
    if (b != 0 || l >= L || x->k[l] != NULL) {
        x->bad = 1;
        return 0;
    }
    x->k[l] = malloc(kl);
    x->v[l] = malloc(vl);
    memcpy(x->k[l], k, kl);
    memcpy(x->v[l], v, vl);
    x->kl[l] = kl;
    x->vl[l] = vl;
    return 0;
}

static int get_stored(const kvs_ns *ns, const unsigned char *key, stored *x)
{
    memset(x, 0, sizeof *x);
    char err[KVS_ERR_LEN] = "";
    int rc = kvs_client_get(g_client, ns, (const unsigned char(*)[32])key, 1, KVS_EGRESS_STORED, 0,
                            -1, stored_cb, x, err);
    if (rc != 0)
        fprintf(stderr, "\n  get stored: %s\n", err);
    return rc != 0 || x->bad;
}

static void stored_free(stored *x)
{
    for (int l = 0; l < L; l++) {
        free(x->k[l]);
        free(x->v[l]);
    }
}

/* Walks the H tiles of one layer's K or V (kind) run: counts the group scales
 * that are fp16(tensor) * 2^e (*aligned) and those that are not (*other); a
 * V tile's sink rows (a root block's first tokens, kept at fp16) have none;
 * scheme_out gets the tiles' scheme. -1 when the run is malformed. */
static int scan_scales(const unsigned char *run, size_t len, kvs_tile_kind kind, unsigned head_dim,
                       float tensor, unsigned *scheme_out, int *aligned, int *other)
{
    const double t16 = kvq_fp16_to_f32(kvq_scale_fp16(tensor));
    size_t off = 0;
    for (int h = 0; h < H; h++) {
        kvs_tile_hdr hd;
        if (off + sizeof hd > len)
            return -1;
        memcpy(&hd, run + off, sizeof hd);
        if (hd.magic != KVS_TILE_MAGIC || hd.kind != kind || hd.tokens != T || hd.dim != head_dim)
            return -1;
        *scheme_out = hd.scheme;
        kvs_tile_layout lay;
        kvs_tile_layout_of((kvs_scheme)hd.scheme, kind, T, head_dim, hd.outliers, hd.sinks, &lay);
        if (lay.payload != hd.payload_bytes || off + sizeof hd + lay.payload > len)
            return -1;
        for (uint32_t g = 0; hd.scheme != KVS_SCHEME_FP16 && g < lay.groups; g++) {
            uint16_t s16;
            memcpy(&s16, run + off + sizeof hd + lay.scales + 2 * g, 2);
            int e;
            if (kind == KVS_TILE_V && g < hd.sinks) { /* a sink row: kept at fp16, scale 0 */
                if (s16 != 0)
                    (*other)++;
                continue;
            }
            if (s16 != 0 && frexp(kvq_fp16_to_f32(s16) / t16, &e) == 0.5)
                (*aligned)++;
            else
                (*other)++;
        }
        off += sizeof hd + lay.payload;
    }
    return off == len ? 0 : -1;
}

/* Every FP8 group scale of the stored block is aligned to the profile's
 * layer scales for `fmt_max` (448: e4m3, 57344: e5m2)? Counts into *aligned /
 * *other over all layers; 0, or -1 for a malformed run or a wrong scheme. */
static int scan_block(const stored *x, int which, float fmt_max, unsigned want_scheme, int *aligned,
                      int *other)
{
    *aligned = *other = 0;
    for (int l = 0; l < L; l++) {
        unsigned sk = 0, sv = 0;
        if (scan_scales(x->k[l], x->kl[l], KVS_TILE_K, D, g_amax[which][l][0] / fmt_max, &sk,
                        aligned, other) != 0 ||
            scan_scales(x->v[l], x->vl[l], KVS_TILE_V, D, g_amax[which][l][1] / fmt_max, &sv,
                        aligned, other) != 0 ||
            sk != want_scheme || sv != want_scheme)
            return -1;
    }
    return 0;
}

/* ---- suite ------------------------------------------------------------------- */

static int suite_init(void)
{
    if (mkdtemp(g_dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    for (int p = 0; p < 2; p++) {
        snprintf(g_prof[p], sizeof g_prof[p], "%s/p%d.profile", g_dir, p);
        if (write_profile(g_prof[p], p) != 0)
            return 1;
    }
    char text[512];
    snprintf(text, sizeof text,
             "[kvstashd]\nlog_level = warn\n\n[model.prof/*]\nscheme = fp8_e4m3\n"
             "profile = %s\n",
             g_prof[0]);
    snprintf(g_ini, sizeof g_ini, "%s/kvstashd.ini", g_dir);
    FILE *f = fopen(g_ini, "w");
    if (f == NULL || fputs(text, f) < 0 || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", g_ini);
        return 1;
    }
    return kvs_itest_start_config(g_kvstashd, g_ini, &g_srv, &g_client, "profile rules");
}

static int suite_cleanup(void)
{
    return kvs_itest_stop_config(&g_srv, &g_client, g_dir);
}

/* ---- tests ------------------------------------------------------------------- */

static void test_applied(void)
{
    static block b;
    block_fill(&b, D, 1);
    char err[KVS_ERR_LEN] = "";
    kvs_put_result r;
    unsigned ls[L];
    double applied0 = profile_stat("applied");
    /* The rule's scheme: fp8_e4m3 with the profile's scales. */
    kvs_ns ns = make_ns("prof/a", D);
    CU_ASSERT_EQUAL_FATAL(put(&ns, &b, 0, 100, &r, ls, err), 0);
    CU_ASSERT_EQUAL(ls[0], 2u);
    CU_ASSERT_EQUAL(ls[1], 2u);
    CU_ASSERT_EQUAL(profile_stat("applied"), applied0 + 1);
    stored x;
    int aligned, other;
    CU_ASSERT_EQUAL_FATAL(get_stored(&ns, r.key, &x), 0);
    CU_ASSERT_EQUAL(scan_block(&x, 0, 448.0f, KVS_SCHEME_FP8_E4M3, &aligned, &other), 0);
    CU_ASSERT_EQUAL(other, 0);
    CU_ASSERT(aligned > L * H * D); /* K: one scale per channel, V: per token (but sinks) */
    stored_free(&x);

    /* The same data for a model without a rule: dynamic scales, not aligned
     * (the check above can fail). */
    kvs_ns plain = make_ns("plain/a", D);
    CU_ASSERT_EQUAL_FATAL(put(&plain, &b, 2, 100, &r, ls, err), 0);
    CU_ASSERT_EQUAL_FATAL(get_stored(&plain, r.key, &x), 0);
    CU_ASSERT_EQUAL(scan_block(&x, 0, 448.0f, KVS_SCHEME_FP8_E4M3, &aligned, &other), 0);
    CU_ASSERT(other > L * H * (D + T) / 2);
    stored_free(&x);
    CU_ASSERT_EQUAL(profile_stat("applied"), applied0 + 1);

    /* fp8_e5m2 asked by the request: aligned to the profile's amax / 57344. */
    CU_ASSERT_EQUAL_FATAL(put(&ns, &b, 3, 200, &r, ls, err), 0);
    CU_ASSERT_EQUAL(ls[0], 3u);
    CU_ASSERT_EQUAL_FATAL(get_stored(&ns, r.key, &x), 0);
    CU_ASSERT_EQUAL(scan_block(&x, 0, 57344.0f, KVS_SCHEME_FP8_E5M2, &aligned, &other), 0);
    CU_ASSERT_EQUAL(other, 0);
    stored_free(&x);

    /* int8 ignores a tensor scale: the same tile bytes as without a profile. */
    stored xi, xp;
    CU_ASSERT_EQUAL_FATAL(put(&ns, &b, 4, 300, &r, ls, err), 0);
    CU_ASSERT_EQUAL_FATAL(get_stored(&ns, r.key, &xi), 0);
    CU_ASSERT_EQUAL_FATAL(put(&plain, &b, 4, 300, &r, ls, err), 0);
    CU_ASSERT_EQUAL_FATAL(get_stored(&plain, r.key, &xp), 0);
    for (int l = 0; l < L; l++) {
        CU_ASSERT(xi.kl[l] == xp.kl[l] && memcmp(xi.k[l], xp.k[l], xi.kl[l]) == 0);
        CU_ASSERT(xi.vl[l] == xp.vl[l] && memcmp(xi.v[l], xp.v[l], xi.vl[l]) == 0);
    }
    stored_free(&xi);
    stored_free(&xp);
    CU_ASSERT_EQUAL(profile_stat("applied"), applied0 + 3);
}

static void test_shape_mismatch(void)
{
    static block b;
    block_fill(&b, D / 2, 2);
    char err[KVS_ERR_LEN] = "";
    kvs_put_result r;
    unsigned ls[L];
    double applied0 = profile_stat("applied"), mism0 = profile_stat("shape_mismatch");
    CU_ASSERT(mism0 >= 0);
    kvs_ns ns = make_ns("prof/narrow", D / 2); /* head_dim 32, the profile's is 64 */
    for (unsigned i = 0; i < 2; i++) {
        CU_ASSERT_EQUAL(put(&ns, &b, 0, 1000 + 100 * i, &r, ls, err), 0);
        CU_ASSERT_EQUAL(ls[0], 2u); /* the rule's scheme still applies */
        CU_ASSERT_EQUAL(profile_stat("shape_mismatch"), mism0 + i + 1);
    }
    CU_ASSERT_EQUAL(profile_stat("applied"), applied0);
    /* Served: the block reads back (fp32) close to what was put. */
    stored x;
    memset(&x, 0, sizeof x);
    CU_ASSERT_EQUAL(get_stored(&ns, r.key, &x), 0);
    CU_ASSERT_PTR_NOT_NULL(x.k[1]);
    stored_free(&x);
}

static char *model_rules_now(void)
{
    return kvs_itest_setting(g_client, "model_rules");
}

static void test_set_config(void)
{
    char *before = model_rules_now();
    CU_ASSERT_PTR_NOT_NULL_FATAL(before);
    char want[512];
    snprintf(want, sizeof want, "prof/* scheme=fp8_e4m3 profile=%s", g_prof[0]);
    CU_ASSERT_STRING_EQUAL(before, want); /* the section, canonical */

    /* A missing file, and one that is not a profile: refused, nothing changed. */
    char garbage[160], bad[2][512], err[KVS_ERR_LEN] = "";
    snprintf(garbage, sizeof garbage, "%s/kvstashd.ini", g_dir);
    snprintf(bad[0], sizeof bad[0], "prof/* profile=%s/none.profile", g_dir);
    snprintf(bad[1], sizeof bad[1], "x fp16=1; prof/* profile=%s", garbage);
    for (int i = 0; i < 2; i++) {
        const char *names[] = {"log_level", "model_rules"};
        const char *values[] = {"debug", bad[i]};
        CU_ASSERT_NOT_EQUAL(kvs_client_set_config(g_client, names, values, 2, 0, -1, NULL, err), 0);
        if (strstr(err, "model_rules: rule 'prof/*': profile '") == NULL)
            fprintf(stderr, "\n  SetConfig message: %s\n", err);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "model_rules: rule 'prof/*': profile '"));
        CU_ASSERT_PTR_NOT_NULL(strstr(err, i == 0 ? "cannot open" : "line"));
        char *now = model_rules_now();
        CU_ASSERT_PTR_NOT_NULL_FATAL(now);
        CU_ASSERT_STRING_EQUAL(now, before);
        free(now);
        const char *ln[] = {"log_level"};
        kvs_config *cfg = NULL;
        CU_ASSERT_EQUAL_FATAL(kvs_client_get_config(g_client, ln, 1, -1, &cfg, err), 0);
        CU_ASSERT_STRING_EQUAL(cfg->entries[0].value, "warn");
        kvs_config_free(cfg);
    }

    /* The other profile: the next Put takes its scales; GetConfig shows the
     * canonical text, which SetConfig takes back unchanged. */
    char next[512];
    snprintf(next, sizeof next, "  prof/*  profile=%s scheme=fp8_e4m3 ", g_prof[1]);
    const char *names[] = {"model_rules"};
    const char *values[] = {next};
    CU_ASSERT_EQUAL_FATAL(kvs_client_set_config(g_client, names, values, 1, 0, -1, NULL, err), 0);
    char *now = model_rules_now();
    CU_ASSERT_PTR_NOT_NULL_FATAL(now);
    snprintf(want, sizeof want, "prof/* scheme=fp8_e4m3 profile=%s", g_prof[1]);
    CU_ASSERT_STRING_EQUAL(now, want);
    values[0] = now;
    CU_ASSERT_EQUAL(kvs_client_set_config(g_client, names, values, 1, 0, -1, NULL, err), 0);
    free(now);
    now = model_rules_now();
    CU_ASSERT_STRING_EQUAL(now, want);
    free(now);

    static block b;
    block_fill(&b, D, 3);
    kvs_put_result r;
    unsigned ls[L];
    kvs_ns ns = make_ns("prof/b", D);
    CU_ASSERT_EQUAL_FATAL(put(&ns, &b, 0, 5000, &r, ls, err), 0);
    stored x;
    int aligned, other;
    CU_ASSERT_EQUAL_FATAL(get_stored(&ns, r.key, &x), 0);
    CU_ASSERT_EQUAL(scan_block(&x, 1, 448.0f, KVS_SCHEME_FP8_E4M3, &aligned, &other), 0);
    CU_ASSERT_EQUAL(other, 0);
    CU_ASSERT_EQUAL(scan_block(&x, 0, 448.0f, KVS_SCHEME_FP8_E4M3, &aligned, &other), 0);
    CU_ASSERT(other > 0); /* not the first profile's */
    stored_free(&x);
    /* Back to the first, as the other tests expect. */
    values[0] = before;
    CU_ASSERT_EQUAL(kvs_client_set_config(g_client, names, values, 1, 0, -1, NULL, err), 0);
    free(before);
}

/* Puts one fp8_e4m3 block of model "prof/reread" and says which profile's
 * scales it took: 0 or 1, or -1 for neither (dynamic scales). */
static int scales_taken(unsigned tok_base)
{
    static block b;
    block_fill(&b, D, tok_base);
    char err[KVS_ERR_LEN] = "";
    kvs_put_result r;
    unsigned ls[L];
    kvs_ns ns = make_ns("prof/reread", D);
    stored x;
    int which = -1, aligned, other;
    if (put(&ns, &b, 0, tok_base, &r, ls, err) != 0 || get_stored(&ns, r.key, &x) != 0) {
        fprintf(stderr, "\n  put/get: %s\n", err);
        return -2;
    }
    for (int p = 0; p < 2 && which < 0; p++)
        if (scan_block(&x, p, 448.0f, KVS_SCHEME_FP8_E4M3, &aligned, &other) == 0 && other == 0)
            which = p;
    stored_free(&x);
    return which;
}

static int set_setting(const char *name, const char *value, char *err)
{
    return kvs_itest_set_setting(g_client, name, value, err);
}

/* A profile file recalibrated in place is read again when SetConfig names
 * model_rules, even with the same text, and only then; a file that went bad
 * is refused then and the profiles in use stay. */
static void test_reread(void)
{
    char *before = model_rules_now();
    CU_ASSERT_PTR_NOT_NULL_FATAL(before);
    char live[160], rules[512], err[KVS_ERR_LEN] = "";
    snprintf(live, sizeof live, "%s/live.profile", g_dir);
    snprintf(rules, sizeof rules, "prof/* scheme=fp8_e4m3 profile=%s", live);
    CU_ASSERT_EQUAL_FATAL(write_profile(live, 0), 0);
    CU_ASSERT_EQUAL_FATAL(set_setting("model_rules", rules, err), 0);
    CU_ASSERT_EQUAL(scales_taken(7000), 0);

    /* Recalibrated: another setting does not read it, model_rules does. */
    CU_ASSERT_EQUAL_FATAL(write_profile(live, 1), 0);
    CU_ASSERT_EQUAL(set_setting("log_level", "warn", err), 0);
    CU_ASSERT_EQUAL(scales_taken(7100), 0);
    CU_ASSERT_EQUAL(set_setting("model_rules", rules, err), 0);
    CU_ASSERT_EQUAL(scales_taken(7200), 1);

    /* Gone bad: the same SetConfig is refused naming the file, a dry run too,
     * and the loaded profile still serves. */
    FILE *f = fopen(live, "w");
    CU_ASSERT_FATAL(f != NULL && fputs("not a profile\n", f) >= 0 && fclose(f) == 0);
    for (int dry = 1; dry >= 0; dry--) {
        const char *names[] = {"model_rules"};
        const char *values[] = {rules};
        err[0] = '\0';
        CU_ASSERT_NOT_EQUAL(kvs_client_set_config(g_client, names, values, 1, dry, -1, NULL, err),
                            0);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, live));
    }
    CU_ASSERT_EQUAL(scales_taken(7300), 1);
    /* Other settings are not held hostage by it. */
    CU_ASSERT_EQUAL(set_setting("log_level", "warn", err), 0);

    CU_ASSERT_EQUAL(set_setting("model_rules", before, err), 0);
    free(before);
}

/* SIGHUP and the reload counted as applied (kvs_itest_hup_wait). */
static int hup_applied(void)
{
    return kvs_itest_hup_wait(g_client, (int)g_srv.pid, "applied");
}

/* A SIGHUP reload reads the profiles again even when the config file did not
 * change: the suite's profile file rewritten with the other profile's scales
 * is picked up, then the original is again. */
static void test_reread_on_sighup(void)
{
    CU_ASSERT_EQUAL(scales_taken(8000), 0);
    CU_ASSERT_EQUAL_FATAL(write_profile(g_prof[0], 1), 0);
    CU_ASSERT_EQUAL(scales_taken(8100), 0); /* nothing reads it by itself */
    CU_ASSERT_EQUAL_FATAL(hup_applied(), 0);
    CU_ASSERT_EQUAL(scales_taken(8200), 1);
    CU_ASSERT_EQUAL_FATAL(write_profile(g_prof[0], 0), 0);
    CU_ASSERT_EQUAL_FATAL(hup_applied(), 0);
    CU_ASSERT_EQUAL(scales_taken(8300), 0);
}

/* kvstashd with a bad profile exits at start, saying which and why. */
static void test_start_refused(void)
{
    struct {
        const char *key, *file, *says;
    } cases[] = {
        {"", "none.profile", "cannot open"},
        {"scheme = int8\n", "kvstashd.ini", "line"},
    };
    for (int i = 0; i < 2; i++) {
        char ini[160], text[512], cmd[512], out[4096] = "";
        snprintf(ini, sizeof ini, "%s/bad%d.ini", g_dir, i);
        snprintf(text, sizeof text, "[model.m-*]\n%sprofile = %s/%s\n", cases[i].key, g_dir,
                 cases[i].file);
        FILE *f = fopen(ini, "w");
        CU_ASSERT_PTR_NOT_NULL_FATAL(f);
        fputs(text, f);
        fclose(f);
        snprintf(cmd, sizeof cmd, "'%s' --config '%s' --listen 127.0.0.1:0 2>&1", g_kvstashd, ini);
        FILE *p = popen(cmd, "r");
        CU_ASSERT_PTR_NOT_NULL_FATAL(p);
        size_t n = fread(out, 1, sizeof out - 1, p);
        out[n] = '\0';
        int st = pclose(p);
        CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) != 0);
        if (strstr(out, "model_rules: rule 'm-*': profile '") == NULL ||
            strstr(out, cases[i].says) == NULL)
            fprintf(stderr, "\n  kvstashd said: %s\n", out);
        CU_ASSERT_PTR_NOT_NULL(strstr(out, "model_rules: rule 'm-*': profile '"));
        CU_ASSERT_PTR_NOT_NULL(strstr(out, cases[i].says));
    }
}

int main(int argc, char **argv)
{
    static const kvs_test_case cases[] = {
        {"applied", test_applied},
        {"shape_mismatch", test_shape_mismatch},
        {"set_config", test_set_config},
        {"reread", test_reread},
        {"reread_on_sighup", test_reread_on_sighup},
        {"start_refused", test_start_refused},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {{"profile_rules", suite_init, suite_cleanup, cases},
                                            {NULL, NULL, NULL, NULL}};
    return kvs_itest_main(argc, argv, &g_kvstashd, suites);
}
