/*
 * test_data_koff.c — per-channel key offsets (kv_format.h rule 5) switched on
 * in a real kvstashd: the key_offsets setting, a model rule's key_offsets and
 * SetConfig, for Puts over gRPC and over UCX.
 *
 * Usage: test_data_koff /path/to/kvstashd (ctest passes it, and UCX_TLS=tcp).
 *
 * kvstashd reads a config file (k_ini): key_offsets off, a [model.koff/...]
 * prefix section with key_offsets = on and skip_layers = 1 (an fp16 layer inside the block),
 * [model.koff/never] with key_offsets = false. A client never sees a block's
 * header (a stored-format Get sends each layer's K tiles and V tiles), so the
 * stored block is put back together: the header kvs_block_write_header makes
 * for the parameters the block must have, then every layer's tiles as the
 * stored-format Get sends them. That block must pass kvs_block_check (which
 * refuses K tiles whose KVS_TILE_F_KOFF differs from the header's
 * KVS_BLOCK_F_KOFF) and be exactly the Put's stored_bytes long; with the
 * other key_offsets it must fail. The fp16, bf16 and fp32 Gets (kvstashd's
 * decode and libkvstash's) must equal kvs_block_decode_layer of it, per-tensor
 * FP8 kvs_block_requant_fp8. The keys have channels far from zero (as real
 * keys do), so the K error Put reports must drop with the offsets.
 */
#include "kv_block.h"
#include "kvq_math.h"
#include "kvs_itest.h"
#include "kvs_server_proc.h"
#include "kvs_test.h"
#include "kvstash.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { L = 3, H = 2, D = 64, T = 16, KO = 2, VO = 1, SINKS = 1 };
#define ELEMS ((size_t)T * H * D)

static const char *g_kvstashd;
static kvs_server_proc g_srv;
static kvs_client *g_c;
static char g_dir[] = "/tmp/kvs_test_koff_XXXXXX";
static char g_ini[128];

static const char k_ini[] = "log_level = warn\n"
                            "k_outliers = 2\nv_outliers = 1\nsinks = 1\n"
                            "key_offsets = off\n"
                            "[model.koff/*]\nkey_offsets = on\nskip_layers = 1\n"
                            "[model.koff/never]\nkey_offsets = false\n";

static kvs_ns make_ns(const char *model)
{
    return kvs_itest_ns(model, L, H, D, T, 1 /* fp16 */);
}

/* A block's K and V, fp16, from seed: key channel d sits near 6 * (d % 9 - 4). */
typedef struct src {
    uint16_t *k[L], *v[L];
} src;

static void src_make(src *s, uint64_t seed)
{
    for (int l = 0; l < L; l++) {
        s->k[l] = malloc(ELEMS * 2);
        s->v[l] = malloc(ELEMS * 2);
        kvs_itest_fill_fp16(s->k[l], ELEMS, seed * 7 + (uint64_t)l);
        kvs_itest_fill_fp16(s->v[l], ELEMS, seed * 7 + 100 + (uint64_t)l);
        for (size_t i = 0; i < ELEMS; i++) {
            float m = 6.0f * (float)((int)(i % D % 9) - 4);
            s->k[l][i] = kvq_f32_to_fp16(m + 0.5f * kvq_fp16_to_f32(s->k[l][i]));
        }
    }
}

static void src_free(src *s)
{
    for (int l = 0; l < L; l++) {
        free(s->k[l]);
        free(s->v[l]);
    }
}

/* One Put (root when parent is NULL) over gRPC or UCX. */
typedef struct put_out {
    unsigned char key[32];
    unsigned long long stored;
    unsigned scheme[L];
    float k_err[L];
} put_out;

static int put(kvs_client *c, const char *model, const unsigned char *parent, unsigned tok_base,
               const src *s, int ucx, put_out *o)
{
    kvs_ns ns = make_ns(model);
    unsigned tokens[T];
    for (unsigned i = 0; i < T; i++)
        tokens[i] = tok_base + i * 3u;
    kvs_put_args a;
    memset(&a, 0, sizeof a);
    a.ns = &ns;
    a.parent_key = parent;
    a.index = parent ? 1 : 0;
    a.tokens = tokens;
    a.scheme = 4; /* int8; a skip layer stays fp16 */
    a.k = (const void *const *)s->k;
    a.v = (const void *const *)s->v;
    kvs_put_result r;
    memset(&r, 0, sizeof r);
    for (int l = 0; l < L; l++) {
        o->scheme[l] = 0;
        o->k_err[l] = -1;
    }
    r.layer_scheme = o->scheme;
    r.k_rel_error = o->k_err;
    char err[KVS_ERR_LEN] = "";
    int rc = ucx ? kvs_client_put_ucx(c, &a, -1, &r, err) : kvs_client_put(c, &a, -1, &r, err);
    if (rc != 0) {
        fprintf(stderr, "put %s: %s\n", model, err);
        return rc;
    }
    memcpy(o->key, r.key, 32);
    o->stored = r.stored_bytes;
    return 0;
}

/* The stored-format Get of one block: each layer's K tiles and V tiles. */
typedef struct stored {
    uint8_t *k[L], *v[L];
    size_t kl[L], vl[L];
    int seen, bad;
} stored;

static int stored_cb(void *arg, unsigned b, unsigned l, const void *k, size_t kl, const void *v,
                     size_t vl, float ks, float vs, int last)
{
    stored *st = arg;
    (void)ks, (void)vs;
    if (b != 0 || l != (unsigned)st->seen || l >= L || last != (l + 1 == L)) {
        st->bad = 1;
        return 1;
    }
    st->k[l] = malloc(kl);
    st->v[l] = malloc(vl);
    memcpy(st->k[l], k, kl);
    memcpy(st->v[l], v, vl);
    st->kl[l] = kl;
    st->vl[l] = vl;
    st->seen++;
    return 0;
}

static void stored_free(stored *st)
{
    for (int l = 0; l < st->seen; l++) {
        free(st->k[l]);
        free(st->v[l]);
    }
}

static int get_stored(kvs_client *c, const char *model, const unsigned char *key, stored *st)
{
    kvs_ns ns = make_ns(model);
    memset(st, 0, sizeof *st);
    char err[KVS_ERR_LEN] = "";
    int rc = kvs_client_get(c, &ns, (const unsigned char(*)[32])key, 1, KVS_EGRESS_STORED, 0, -1,
                            stored_cb, st, err);
    if (rc != 0)
        fprintf(stderr, "get stored %s: %s\n", model, err);
    return rc != 0 || st->bad || st->seen != L;
}

/* The block the stored tiles make with the header of these parameters
 * (malloc'd, 64-aligned; *len its length), or NULL. */
static uint8_t *assemble(const stored *st, const unsigned *scheme, int root, int koff, size_t *len)
{
    kvs_scheme tab[L];
    for (int l = 0; l < L; l++)
        tab[l] = (kvs_scheme)scheme[l];
    kvs_block_params p = {L,   H,    D,    T,   KVS_DTYPE_FP16, root, KO, VO, root ? SINKS : 0,
                          tab, NULL, NULL, koff};
    if (kvs_block_params_check(&p, NULL) != 0)
        return NULL;
    size_t head = kvs_align16((uint32_t)sizeof(kvs_block_hdr) + L), n = head;
    for (int l = 0; l < L; l++)
        n += st->kl[l] + st->vl[l];
    uint8_t *b = aligned_alloc(64, (n + 63) & ~(size_t)63);
    kvs_block_write_header(&p, b);
    size_t at = head;
    for (int l = 0; l < L; l++) {
        memcpy(b + at, st->k[l], st->kl[l]);
        at += st->kl[l];
        memcpy(b + at, st->v[l], st->vl[l]);
        at += st->vl[l];
    }
    *len = n;
    return b;
}

/* Bytes a block of these parameters has (kernels/block's own count). */
static size_t block_size(const unsigned *scheme, int root, int koff)
{
    kvs_scheme tab[L];
    for (int l = 0; l < L; l++)
        tab[l] = (kvs_scheme)scheme[l];
    kvs_block_params p = {L,   H,    D,    T,   KVS_DTYPE_FP16, root, KO, VO, root ? SINKS : 0,
                          tab, NULL, NULL, koff};
    return kvs_block_size(&p);
}

/* The block stored under key is the one with key_offsets = koff, of the
 * schemes o->scheme, o->stored bytes long: its tiles make a valid block with
 * that header and not with the other; each layer's first K tile carries
 * KVS_TILE_F_KOFF exactly when koff and the layer is 8-bit. Returns the
 * block (NULL on failure), for the decode checks. */
static uint8_t *check_stored(kvs_client *c, const char *model, const put_out *o, int root, int koff,
                             size_t *len)
{
    stored st;
    int bad = get_stored(c, model, o->key, &st);
    CU_ASSERT_FALSE(bad);
    if (bad) {
        stored_free(&st);
        return NULL;
    }
    CU_ASSERT_EQUAL(o->stored, block_size(o->scheme, root, koff));
    CU_ASSERT_NOT_EQUAL(o->stored, block_size(o->scheme, root, !koff));
    for (int l = 0; l < L; l++) {
        kvs_tile_hdr th;
        memcpy(&th, st.k[l], sizeof th);
        int want = koff && o->scheme[l] != 1;
        if (((th.flags & KVS_TILE_F_KOFF) != 0) != want)
            fprintf(stderr, "%s layer %d: K tile flags 0x%x, key offsets expected: %d\n", model, l,
                    th.flags, want);
        CU_ASSERT_EQUAL((th.flags & KVS_TILE_F_KOFF) != 0, want);
        memcpy(&th, st.v[l], sizeof th);
        CU_ASSERT_EQUAL(th.flags & KVS_TILE_F_KOFF, 0);
    }
    size_t n_other = 0;
    uint8_t *other = assemble(&st, o->scheme, root, !koff, &n_other);
    CU_ASSERT_PTR_NOT_NULL(other);
    if (other) /* the header of the other setting does not fit these tiles */
        CU_ASSERT_EQUAL(kvs_block_check(other, n_other, NULL, NULL), KVS_EFORMAT);
    free(other);
    uint8_t *b = assemble(&st, o->scheme, root, koff, len);
    stored_free(&st);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    CU_ASSERT_EQUAL(*len, o->stored);
    char err[KVS_ERR_LEN] = "";
    int rc = kvs_block_check(b, *len, NULL, err);
    if (rc != 0)
        fprintf(stderr, "%s: reassembled block: %s\n", model, err);
    CU_ASSERT_EQUAL(rc, 0);
    kvs_block_hdr h;
    memcpy(&h, b, sizeof h);
    CU_ASSERT_EQUAL((h.flags & KVS_BLOCK_F_KOFF) != 0, koff);
    return b;
}

/* Every layer rendered by kvstashd (fp16, bf16, fp32, per-tensor FP8) and by
 * libkvstash (fp16, bf16, fp32: client-side decode) equals what kernels/block
 * makes of the stored block b. */
static void check_rendered(const char *addr, const char *model, const unsigned char *key,
                           const uint8_t *b, size_t len)
{
    kvs_ns ns = make_ns(model);
    kvs_client *by[2] = {NULL, NULL}; /* kvstashd's decode, libkvstash's */
    CU_ASSERT_EQUAL_FATAL(kvs_itest_open_client_decode(addr, KVS_DECODE_SERVER, &by[0]), 0);
    CU_ASSERT_EQUAL_FATAL(kvs_itest_open_client_decode(addr, KVS_DECODE_CLIENT, &by[1]), 0);
    static const kvs_egress fmts[] = {KVS_EGRESS_FP16, KVS_EGRESS_BF16, KVS_EGRESS_FP32,
                                      KVS_EGRESS_FP8_PER_TENSOR};
    static const kvs_dtype dts[] = {KVS_DTYPE_FP16, KVS_DTYPE_BF16, KVS_DTYPE_FP32};
    char err[KVS_ERR_LEN] = "";
    for (size_t f = 0; f < 4; f++) {
        size_t lb = kvs_egress_layer_bytes(&ns, fmts[f]);
        uint8_t *k = malloc(L * lb), *v = malloc(L * lb), *kr = malloc(lb), *vr = malloc(lb);
        void *kd[L], *vd[L];
        for (int l = 0; l < L; l++) {
            kd[l] = k + (size_t)l * lb;
            vd[l] = v + (size_t)l * lb;
        }
        float ks[L], vs[L];
        for (int w = 0; w < (fmts[f] == KVS_EGRESS_FP8_PER_TENSOR ? 1 : 2); w++) {
            memset(k, 0xA5, L * lb);
            memset(v, 0x5A, L * lb);
            int rc = kvs_client_get_into(by[w], &ns, (const unsigned char(*)[32])key, 1, fmts[f], 0,
                                         -1, kd, vd, ks, vs, err);
            if (rc != 0)
                fprintf(stderr, "%s fmt %d: %s\n", model, (int)fmts[f], err);
            CU_ASSERT_EQUAL_FATAL(rc, 0);
            for (uint32_t l = 0; l < L; l++) {
                float rks = 0, rvs = 0;
                if (fmts[f] == KVS_EGRESS_FP8_PER_TENSOR) {
                    CU_ASSERT_EQUAL(kvs_block_requant_fp8(b, len, l, KVS_TILE_K, kr, &rks, err), 0);
                    CU_ASSERT_EQUAL(kvs_block_requant_fp8(b, len, l, KVS_TILE_V, vr, &rvs, err), 0);
                    CU_ASSERT_TRUE(rks > 0);
                } else {
                    CU_ASSERT_EQUAL(kvs_block_decode_layer(b, len, l, dts[f], kr, vr,
                                                           kvs_tile_dequantize_ref, err),
                                    0);
                }
                int same = memcmp(kd[l], kr, lb) == 0 && memcmp(vd[l], vr, lb) == 0;
                if (!same)
                    fprintf(stderr, "%s fmt %d layer %u (%s decode): differs from kv_block's\n",
                            model, (int)fmts[f], l, w ? "client" : "server");
                CU_ASSERT_TRUE(same);
                CU_ASSERT_EQUAL(ks[l], rks);
                CU_ASSERT_EQUAL(vs[l], rvs);
            }
        }
        free(k);
        free(v);
        free(kr);
        free(vr);
    }
    kvs_client_close(by[0]);
    kvs_client_close(by[1]);
}

static char *setting(const char *name)
{
    return kvs_itest_setting(g_c, name);
}

/* ---- the suite ----------------------------------------------------------- */

static int suite_init(void)
{
    if (kvs_itest_write_config(g_dir, g_ini, sizeof g_ini, k_ini) != 0)
        return 1;
    return kvs_itest_start_config(g_kvstashd, g_ini, &g_srv, &g_c, "koff");
}

static int suite_cleanup(void)
{
    return kvs_itest_stop_config(&g_srv, &g_c, g_dir);
}

/* A model rule turns key offsets on for its models only: the same data stored
 * for koff/m (rule on), plain/m (no rule: the setting, off) and koff/never (a
 * longer pattern turning them off); a child block too (no sinks). */
static void test_model_rule(void)
{
    src s;
    src_make(&s, 1);
    put_out on, off, never, child;
    CU_ASSERT_EQUAL_FATAL(put(g_c, "koff/m", NULL, 100, &s, 0, &on), 0);
    CU_ASSERT_EQUAL_FATAL(put(g_c, "plain/m", NULL, 100, &s, 0, &off), 0);
    CU_ASSERT_EQUAL_FATAL(put(g_c, "koff/never", NULL, 100, &s, 0, &never), 0);
    CU_ASSERT_EQUAL(on.scheme[0], 4u);
    CU_ASSERT_EQUAL(on.scheme[1], 1u); /* the rule's skip layer */
    CU_ASSERT_EQUAL(on.scheme[2], 4u);
    CU_ASSERT_EQUAL(off.scheme[1], 4u);
    CU_ASSERT_EQUAL(never.scheme[1], 4u); /* an exact rule wins whole: no skip layer */
    size_t n;
    free(check_stored(g_c, "koff/m", &on, 1, 1, &n));
    free(check_stored(g_c, "plain/m", &off, 1, 0, &n));
    free(check_stored(g_c, "koff/never", &never, 1, 0, &n));
    /* the offsets pay: the K error of the 8-bit layers drops (these keys sit
     * up to 24 from zero with a spread of about 1) */
    for (int l = 0; l < L; l += 2) {
        if (!(on.k_err[l] > 0 && on.k_err[l] < 0.5f * off.k_err[l]))
            fprintf(stderr, "layer %d: K error %g with offsets, %g without\n", l, on.k_err[l],
                    off.k_err[l]);
        CU_ASSERT_TRUE(on.k_err[l] > 0 && on.k_err[l] < 0.5f * off.k_err[l]);
        CU_ASSERT_EQUAL(never.k_err[l], off.k_err[l]);
    }
    CU_ASSERT_EQUAL(on.k_err[1], 0.0f);
    src s2;
    src_make(&s2, 2);
    CU_ASSERT_EQUAL_FATAL(put(g_c, "koff/m", on.key, 200, &s2, 0, &child), 0);
    free(check_stored(g_c, "koff/m", &child, 0, 1, &n));
    src_free(&s2);
    src_free(&s);
}

/* Get rendered in every format equals kernels/block's decode of the stored
 * block, for blocks with and without key offsets. */
static void test_rendered(void)
{
    src s;
    src_make(&s, 3);
    put_out on, off;
    CU_ASSERT_EQUAL_FATAL(put(g_c, "koff/r", NULL, 300, &s, 0, &on), 0);
    CU_ASSERT_EQUAL_FATAL(put(g_c, "plain/r", NULL, 300, &s, 0, &off), 0);
    size_t n;
    uint8_t *b = check_stored(g_c, "koff/r", &on, 1, 1, &n);
    if (b)
        check_rendered(g_srv.addr, "koff/r", on.key, b, n);
    free(b);
    b = check_stored(g_c, "plain/r", &off, 1, 0, &n);
    if (b)
        check_rendered(g_srv.addr, "plain/r", off.key, b, n);
    free(b);
    src_free(&s);
}

/* SetConfig key_offsets: a bad value is refused naming the key; on applies
 * from the next Put (a model rule's false still wins), and the blocks stored
 * before stay readable; back off, new blocks have none again. */
static void test_runtime(void)
{
    char *v = setting("key_offsets");
    CU_ASSERT_PTR_NOT_NULL_FATAL(v);
    CU_ASSERT_STRING_EQUAL(v, "off");
    free(v);
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL(kvs_itest_set_setting(g_c, "key_offsets", "maybe", err), KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "key_offsets: 'maybe' is not on or off"));
    v = setting("key_offsets");
    CU_ASSERT_STRING_EQUAL(v, "off");
    free(v);

    src s;
    src_make(&s, 4);
    put_out before, after, never, back;
    CU_ASSERT_EQUAL_FATAL(put(g_c, "other/a", NULL, 400, &s, 0, &before), 0);
    CU_ASSERT_EQUAL_FATAL(kvs_itest_set_setting(g_c, "key_offsets", "true", err), 0);
    v = setting("key_offsets");
    CU_ASSERT_STRING_EQUAL(v, "on");
    free(v);
    CU_ASSERT_EQUAL_FATAL(put(g_c, "other/b", NULL, 400, &s, 0, &after), 0);
    CU_ASSERT_EQUAL_FATAL(put(g_c, "koff/never", NULL, 400, &s, 0, &never), 0);
    size_t n;
    free(check_stored(g_c, "other/b", &after, 1, 1, &n));
    free(check_stored(g_c, "koff/never", &never, 1, 0, &n));
    uint8_t *b = check_stored(g_c, "other/a", &before, 1, 0, &n);
    if (b)
        check_rendered(g_srv.addr, "other/a", before.key, b, n);
    free(b);
    CU_ASSERT_EQUAL(kvs_itest_set_setting(g_c, "key_offsets", "off", err), 0);
    CU_ASSERT_EQUAL_FATAL(put(g_c, "other/c", NULL, 400, &s, 0, &back), 0);
    free(check_stored(g_c, "other/c", &back, 1, 0, &n));
    b = check_stored(g_c, "other/b", &after, 1, 1, &n);
    if (b)
        check_rendered(g_srv.addr, "other/b", after.key, b, n);
    free(b);
    src_free(&s);
}

#ifdef KVS_TEST_UCX
/* Puts over UCX (service/data_connect.c) take the same key offsets as gRPC
 * Puts: the model rule's, and the setting's. */
static void test_ucx_put(void)
{
    kvs_client *u = NULL;
    CU_ASSERT_EQUAL_FATAL(kvs_itest_open_client(g_srv.addr, NULL, 1, 30000, &u), 0);
    double puts0 = kvs_itest_stat(g_c, "kvstash_xfer_puts_total", NULL, NULL);
    src s;
    src_make(&s, 5);
    put_out on, off, global;
    CU_ASSERT_EQUAL_FATAL(put(u, "koff/ucx", NULL, 500, &s, 1, &on), 0);
    CU_ASSERT_EQUAL_FATAL(put(u, "plain/ucx", NULL, 500, &s, 1, &off), 0);
    char err[KVS_ERR_LEN] = "";
    CU_ASSERT_EQUAL_FATAL(kvs_itest_set_setting(g_c, "key_offsets", "on", err), 0);
    CU_ASSERT_EQUAL_FATAL(put(u, "other/ucx", NULL, 500, &s, 1, &global), 0);
    CU_ASSERT_EQUAL(kvs_itest_set_setting(g_c, "key_offsets", "off", err), 0);
    CU_ASSERT_EQUAL(kvs_itest_stat(g_c, "kvstash_xfer_puts_total", NULL, NULL) - puts0, 3.0);
    kvs_client_xfer_stats st;
    CU_ASSERT_EQUAL(kvs_client_xfer_stats_get(u, &st), 0);
    CU_ASSERT_EQUAL(st.fallbacks, 0u);
    /* the UCX answer has no per-layer schemes: those of the rules */
    static const unsigned rule[L] = {4, 1, 4}, none[L] = {4, 4, 4};
    memcpy(on.scheme, rule, sizeof rule);
    memcpy(off.scheme, none, sizeof none);
    memcpy(global.scheme, none, sizeof none);
    size_t n;
    uint8_t *b = check_stored(g_c, "koff/ucx", &on, 1, 1, &n);
    if (b)
        check_rendered(g_srv.addr, "koff/ucx", on.key, b, n);
    free(b);
    free(check_stored(g_c, "plain/ucx", &off, 1, 0, &n));
    free(check_stored(g_c, "other/ucx", &global, 1, 1, &n));
    src_free(&s);
    kvs_client_close(u);
}
#endif

int main(int argc, char **argv)
{
    static const kvs_test_case cases[] = {
        {"model_rule", test_model_rule},
        {"rendered", test_rendered},
        {"runtime", test_runtime},
#ifdef KVS_TEST_UCX
        {"ucx_put", test_ucx_put},
#endif
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {{"koff", suite_init, suite_cleanup, cases},
                                            {NULL, NULL, NULL, NULL}};
    return kvs_itest_main(argc, argv, &g_kvstashd, suites);
}
