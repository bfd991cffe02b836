/*
 * test_connect_faults.c — a corrupt block fetched over UCX by libkvstash with
 * client-side decode (kvs_client_fetch in fp16, the default decode), against
 * a real kvstashd (issue 6; docs/DECODER.md "When the cache fails").
 *
 * kvstashd runs with a 3 MiB memory tier and an SSD directory, so most of the
 * blocks put are demoted to SSD files and the last ones stay in memory. Two
 * ways a block goes bad:
 *   - dram_corrupt: one byte of a tile payload is flipped inside kvstashd's
 *     memory tier (the arena mapping, found through /proc/PID/maps and written
 *     through /proc/PID/mem: kvstashd is our child). kvstashd does not check
 *     memory-tier blocks on read, so it sends the bad tile: transfer/ must
 *     refuse it on the client before the layer is reported, and the decode
 *     (which skips the checksum transfer/ has checked: verified = 1) must
 *     never see it. This is a tile corrupted on the wire as far as the client
 *     can tell.
 *   - ssd_corrupt: a byte of every SSD file is flipped (as decoder_faults.sh
 *     does); kvstashd's read finds the bad checksum, drops the block and
 *     answers DATA_LOSS over UCX.
 * Either way the fetch must end with KVS_EFORMAT and a DATA_LOSS message; the
 * callback must have seen the blocks before the bad one in full, at most the
 * layers of the bad block that passed their checks (transfer/ checks a
 * message's layers together, so layer 1 may go with layer 2), every one equal
 * to kvstashd's own fp16 render taken before the damage, and nothing of or
 * after the bad layer; no fallback to gRPC (kvstash.h: a corrupt block is an
 * answer, not a path failure, and Get would give the same); the UCX session
 * must stay up and serve the next fetch. Also checked: the server-render path (decode =
 * server) and gRPC Get with client decode refuse the same block; the server
 * counts what it saw (kvstash_xfer_blocks_failed_total, _corrupt_dropped_).
 *
 * Usage: test_connect_faults /path/to/kvstashd (UCX_TLS from ctest:
 * connect_faults.cmake runs it on tcp and on posix shm).
 */
#include "kvs_itest.h"
#include "kvs_server_proc.h"
#include "kvs_test.h"
#include "kvstash.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

enum { NL = 4, NH = 4, HD = 64, BT = 32, NBLK = 48 };
#define CAPACITY ((uint64_t)3 << 20) /* the arena is one mapping of exactly this */

static const char *g_kvstashd;
static kvs_server_proc g_srv;
static char g_dir[] = "/tmp/kvs_test_connect_faults_XXXXXX";
static char g_ssd[96], g_cap[32];
static unsigned char g_keys[NBLK][KVS_CLIENT_KEY_LEN];
static size_t g_lb; /* fp16 bytes of one K (or V) layer */
static kvs_ns g_ns;
/* kvstashd's fp16 render of every layer of g_keys[i], K then V per layer,
 * taken before any corruption (NULL until ref_fill). */
static uint8_t *g_ref[NBLK];

static int open_with(int ucx, kvs_decode_at dec, kvs_client **out)
{
    kvs_client_opts o;
    memset(&o, 0, sizeof o);
    o.target = g_srv.addr;
    o.connect_timeout_ms = 5000;
    o.call_timeout_ms = 30000;
    o.ucx = ucx;
    o.decode = dec;
    char err[KVS_ERR_LEN] = "";
    int rc = kvs_client_open(&o, out, err);
    if (rc != 0)
        fprintf(stderr, "kvs_client_open: %s: %s\n", kvs_strerror(rc), err);
    return rc;
}

/* NBLK independent int8 root blocks, oldest first: the first ones end up on SSD. */
static int suite_init(void)
{
    if (mkdtemp(g_dir) == NULL)
        return 1;
    snprintf(g_ssd, sizeof g_ssd, "%s/ssd", g_dir);
    if (mkdir(g_ssd, 0700) != 0)
        return 1;
    snprintf(g_cap, sizeof g_cap, "%llu", (unsigned long long)CAPACITY);
    const char *args[] = {"--capacity", g_cap, "--ssd-dir", g_ssd, "--log-level", "warn", NULL};
    if (kvs_itest_start(g_kvstashd, args, &g_srv, "faults") != 0)
        return 1;
    kvs_client *c;
    if (open_with(0, KVS_DECODE_AUTO, &c) != 0)
        return 1;
    kvs_ns ns = kvs_itest_ns("faults/model", NL, NH, HD, BT, 1 /* fp16 */);
    g_ns = ns;
    size_t elems = (size_t)BT * NH * HD;
    g_lb = elems * 2;
    uint16_t *kv = malloc(2 * NL * g_lb);
    int rc = 0;
    for (unsigned b = 0; b < NBLK && rc == 0; b++) {
        const void *k[NL], *v[NL];
        for (unsigned l = 0; l < NL; l++) {
            uint16_t *kp = kv + (2 * l) * elems, *vp = kv + (2 * l + 1) * elems;
            kvs_itest_fill_fp16(kp, elems, b * 100u + l + 1);
            kvs_itest_fill_fp16(vp, elems, b * 100u + l + 51);
            k[l] = kp;
            v[l] = vp;
        }
        unsigned tokens[BT];
        for (unsigned i = 0; i < BT; i++)
            tokens[i] = 1000u * (b + 1) + i;
        kvs_put_args a = {.ns = &ns, .tokens = tokens, .scheme = 1 /* int8 */, .k = k, .v = v};
        kvs_put_result res;
        memset(&res, 0, sizeof res);
        char err[KVS_ERR_LEN] = "";
        if ((rc = kvs_client_put(c, &a, 30000, &res, err)) != 0)
            fprintf(stderr, "put %u: %s: %s\n", b, kvs_strerror(rc), err);
        memcpy(g_keys[b], res.key, KVS_CLIENT_KEY_LEN);
    }
    free(kv);
    kvs_client_close(c);
    return rc != 0;
}

static int suite_cleanup(void)
{
    int rc = kvs_itest_stop(&g_srv, 10000);
    for (unsigned i = 0; i < NBLK; i++)
        free(g_ref[i]);
    DIR *d = opendir(g_ssd);
    struct dirent *e;
    char p[512];
    while (d && (e = readdir(d)) != NULL)
        if (e->d_name[0] != '.') {
            snprintf(p, sizeof p, "%s/%s", g_ssd, e->d_name);
            unlink(p);
        }
    if (d)
        closedir(d);
    rmdir(g_ssd);
    rmdir(g_dir);
    return rc;
}

/* ---- what the callback saw ------------------------------------------------- */

typedef struct seen {
    const unsigned *idx; /* keys[b] is g_keys[idx[b]] */
    unsigned layers[8];  /* layers handed on per fetched block */
    unsigned order_bad;  /* a layer out of (block, layer) order */
    unsigned mismatch;   /* a layer whose bytes differ from kvstashd's render */
    unsigned next_b, next_l;
} seen;

/* kvstashd's own fp16 render of layer l of g_keys[i] (gRPC Get, decode =
 * server), K then V into out (2 * g_lb bytes). */
typedef struct ref_arg {
    unsigned l;
    uint8_t *out;
    int got;
} ref_arg;

static int ref_cb(void *arg, unsigned b, unsigned l, const void *k, size_t kl, const void *v,
                  size_t vl, float ks, float vs, int last)
{
    (void)b;
    (void)ks;
    (void)vs;
    (void)last;
    ref_arg *r = arg;
    if (l == r->l && kl == g_lb && vl == g_lb) {
        memcpy(r->out, k, kl);
        memcpy(r->out + kl, v, vl);
        r->got = 1;
    }
    return 0;
}

static int ref_fill(kvs_client *refc, unsigned i)
{
    if (g_ref[i] != NULL)
        return 0;
    g_ref[i] = malloc(NL * 2 * g_lb);
    for (unsigned l = 0; l < NL; l++) {
        ref_arg r = {.l = l, .out = g_ref[i] + l * 2 * g_lb};
        char err[KVS_ERR_LEN] = "";
        int rc = kvs_client_get(refc, &g_ns, (const unsigned char(*)[KVS_CLIENT_KEY_LEN])g_keys[i],
                                1, KVS_EGRESS_FP16, 0, 30000, ref_cb, &r, err);
        if (rc != 0 || !r.got) {
            fprintf(stderr, "reference Get of block %u: %s: %s\n", i, kvs_strerror(rc), err);
            free(g_ref[i]);
            g_ref[i] = NULL;
            return 1;
        }
    }
    return 0;
}

static int seen_cb(void *arg, unsigned b, unsigned l, const void *k, size_t kl, const void *v,
                   size_t vl, float ks, float vs, int last)
{
    (void)ks;
    (void)vs;
    (void)last;
    seen *s = arg;
    if (b != s->next_b || l != s->next_l || b >= 8)
        s->order_bad++;
    s->next_l = l + 1 == NL ? 0 : l + 1;
    s->next_b = l + 1 == NL ? b + 1 : b;
    if (b >= 8)
        return 1;
    s->layers[b]++;
    const uint8_t *want = g_ref[s->idx[b]] ? g_ref[s->idx[b]] + l * 2 * g_lb : NULL;
    if (kl != g_lb || vl != g_lb || want == NULL || memcmp(want, k, g_lb) != 0 ||
        memcmp(want + g_lb, v, g_lb) != 0)
        s->mismatch++;
    return 0;
}

/* Fetches g_keys[idx[0..n)] in fp16 through c; rc, the message in err. */
static int fetch_idx(kvs_client *c, const unsigned *idx, size_t n, seen *s, char *err)
{
    kvs_ns ns = kvs_itest_ns("faults/model", NL, NH, HD, BT, 1 /* fp16 */);
    unsigned char keys[8][KVS_CLIENT_KEY_LEN];
    for (size_t i = 0; i < n; i++)
        memcpy(keys[i], g_keys[idx[i]], KVS_CLIENT_KEY_LEN);
    memset(s, 0, sizeof *s);
    s->idx = idx;
    err[0] = '\0';
    return kvs_client_fetch(c, &ns, (const unsigned char(*)[KVS_CLIENT_KEY_LEN])keys, n,
                            KVS_EGRESS_FP16, 0, 30000, seen_cb, s, err);
}

/* ---- flipping a byte inside kvstashd --------------------------------------- */

typedef struct needle_arg {
    uint8_t bytes[64];
    int got;
} needle_arg;

/* 64 bytes from the middle of layer 2's V tile (its int8 payload). */
static int needle_cb(void *arg, unsigned b, unsigned l, const void *k, size_t kl, const void *v,
                     size_t vl, float ks, float vs, int last)
{
    (void)b;
    (void)k;
    (void)kl;
    (void)ks;
    (void)vs;
    (void)last;
    needle_arg *n = arg;
    if (l == 2 && vl >= 256) {
        memcpy(n->bytes, (const uint8_t *)v + vl / 2, sizeof n->bytes);
        n->got = 1;
    }
    return 0;
}

/* Finds needle in kvstashd's memory-tier arena (an rw mapping of exactly
 * CAPACITY bytes) and flips one bit of its byte 32. The number of copies
 * flipped (1 expected). */
static int flip_in_arena(pid_t pid, const uint8_t *needle, size_t nlen)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
    FILE *f = fopen(path, "r");
    snprintf(path, sizeof path, "/proc/%d/mem", (int)pid);
    int fd = open(path, O_RDWR);
    if (f != NULL && fd < 0 && (errno == EACCES || errno == EPERM)) {
        fclose(f);
        return -2; /* no ptrace rights over our child here */
    }
    if (f == NULL || fd < 0) {
        perror(path);
        if (f)
            fclose(f);
        if (fd >= 0)
            close(fd);
        return -1;
    }
    int found = 0;
    char line[512];
    uint8_t *buf = malloc(CAPACITY);
    while (fgets(line, sizeof line, f) != NULL) {
        unsigned long lo, hi;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3 || perms[0] != 'r' ||
            perms[1] != 'w' || hi - lo != CAPACITY)
            continue;
        if (pread(fd, buf, CAPACITY, (off_t)lo) != (ssize_t)CAPACITY)
            continue;
        for (size_t off = 0; off + nlen <= CAPACITY; off++) {
            const uint8_t *p = memchr(buf + off, needle[0], CAPACITY - nlen + 1 - off);
            if (p == NULL)
                break;
            off = (size_t)(p - buf);
            if (memcmp(p, needle, nlen) == 0) {
                uint8_t x = p[32] ^ 0x10;
                if (pwrite(fd, &x, 1, (off_t)(lo + off + 32)) == 1)
                    found++;
            }
        }
    }
    free(buf);
    fclose(f);
    close(fd);
    return found;
}

static int xfer_stats(kvs_client *c, kvs_client_xfer_stats *st)
{
    return kvs_client_xfer_stats_get(c, st);
}

/* n blocks x NL layers of fp16 K and V buffers for kvs_client_fetch_into,
 * filled with 0xA5 (a sentinel no layer decodes to in full). */
typedef struct into_bufs {
    uint8_t *mem;
    void *k[8 * NL], *v[8 * NL];
    float ks[8 * NL], vs[8 * NL];
} into_bufs;

static void into_init(into_bufs *ib, size_t n)
{
    ib->mem = malloc(n * NL * 2 * g_lb);
    memset(ib->mem, 0xA5, n * NL * 2 * g_lb);
    for (size_t i = 0; i < n * NL; i++) {
        ib->k[i] = ib->mem + i * 2 * g_lb;
        ib->v[i] = ib->mem + i * 2 * g_lb + g_lb;
        ib->ks[i] = ib->vs[i] = -1;
    }
}

/* Layers of block b (g_keys[idx]) in ib that equal the reference, and those
 * still all sentinel. */
static void into_count(const into_bufs *ib, unsigned b, unsigned idx, unsigned *same,
                       unsigned *untouched)
{
    *same = *untouched = 0;
    for (unsigned l = 0; l < NL; l++) {
        const uint8_t *p = ib->mem + ((size_t)b * NL + l) * 2 * g_lb;
        if (g_ref[idx] && memcmp(p, g_ref[idx] + l * 2 * g_lb, 2 * g_lb) == 0 &&
            ib->ks[b * NL + l] == 0 && ib->vs[b * NL + l] == 0)
            (*same)++;
        size_t j = 0;
        while (j < 2 * g_lb && p[j] == 0xA5)
            j++;
        if (j == 2 * g_lb)
            (*untouched)++;
    }
}

/* kvs_client_fetch_into: every client kind lands kvstashd's fp16 render in
 * the caller's buffers (client decode straight into them, the server's render
 * copied, gRPC get_into), over UCX when asked, and refuses what it cannot do. */
static void test_fetch_into(void)
{
    kvs_client *u, *us, *g, *ref;
    CU_ASSERT_FATAL(open_with(1, KVS_DECODE_AUTO, &u) == 0);
    CU_ASSERT_FATAL(open_with(1, KVS_DECODE_SERVER, &us) == 0);
    CU_ASSERT_FATAL(open_with(0, KVS_DECODE_AUTO, &g) == 0);
    CU_ASSERT_FATAL(open_with(0, KVS_DECODE_SERVER, &ref) == 0);
    const unsigned idx[2] = {NBLK - 2, NBLK - 3};
    CU_ASSERT_FATAL(ref_fill(ref, idx[0]) == 0 && ref_fill(ref, idx[1]) == 0);
    unsigned char keys[2][KVS_CLIENT_KEY_LEN];
    memcpy(keys[0], g_keys[idx[0]], KVS_CLIENT_KEY_LEN);
    memcpy(keys[1], g_keys[idx[1]], KVS_CLIENT_KEY_LEN);
    kvs_client *cl[3] = {u, us, g};
    char err[KVS_ERR_LEN];
    for (int i = 0; i < 3; i++) {
        kvs_client_xfer_stats st0, st1;
        CU_ASSERT_EQUAL(xfer_stats(cl[i], &st0), 0);
        into_bufs ib;
        into_init(&ib, 2);
        err[0] = '\0';
        int rc =
            kvs_client_fetch_into(cl[i], &g_ns, (const unsigned char(*)[KVS_CLIENT_KEY_LEN])keys, 2,
                                  KVS_EGRESS_FP16, 0, 30000, ib.k, ib.v, ib.ks, ib.vs, err);
        CU_ASSERT_EQUAL(rc, 0);
        if (rc != 0)
            fprintf(stderr, "fetch_into (client %d): %s: %s\n", i, kvs_strerror(rc), err);
        for (unsigned b = 0; b < 2; b++) {
            unsigned same, untouched;
            into_count(&ib, b, idx[b], &same, &untouched);
            CU_ASSERT_EQUAL(same, (unsigned)NL);
        }
        CU_ASSERT_EQUAL(xfer_stats(cl[i], &st1), 0);
        CU_ASSERT_EQUAL(st1.fetches, st0.fetches + (i < 2 ? 1u : 0u)); /* over UCX */
        CU_ASSERT_EQUAL(st1.fallbacks, 0u);
        free(ib.mem);
    }
    /* Refused: the stored format (no fixed size), a NULL buffer. */
    into_bufs ib;
    into_init(&ib, 2);
    CU_ASSERT_EQUAL(kvs_client_fetch_into(u, &g_ns,
                                          (const unsigned char(*)[KVS_CLIENT_KEY_LEN])keys, 2,
                                          KVS_EGRESS_STORED, 0, 30000, ib.k, ib.v, NULL, NULL, err),
                    KVS_EINVAL);
    ib.v[3] = NULL;
    CU_ASSERT_EQUAL(kvs_client_fetch_into(u, &g_ns,
                                          (const unsigned char(*)[KVS_CLIENT_KEY_LEN])keys, 2,
                                          KVS_EGRESS_FP16, 0, 30000, ib.k, ib.v, NULL, NULL, err),
                    KVS_EINVAL);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "v_dst[3]"));
    free(ib.mem);
    kvs_client_close(u);
    kvs_client_close(us);
    kvs_client_close(g);
    kvs_client_close(ref);
}

/* A tile flipped in kvstashd's memory: sent as is, refused by the client. */
static void test_dram_corrupt(void)
{
    kvs_ns ns = kvs_itest_ns("faults/model", NL, NH, HD, BT, 1 /* fp16 */);
    kvs_client *u, *ref, *srvdec, *grpc_cl;
    CU_ASSERT_FATAL(open_with(1, KVS_DECODE_AUTO, &u) == 0);
    CU_ASSERT_FATAL(open_with(0, KVS_DECODE_SERVER, &ref) == 0);
    CU_ASSERT_FATAL(open_with(1, KVS_DECODE_SERVER, &srvdec) == 0);
    CU_ASSERT_FATAL(open_with(0, KVS_DECODE_CLIENT, &grpc_cl) == 0);
    const unsigned bad = NBLK - 1, good[2] = {NBLK - 2, NBLK - 3};
    char err[KVS_ERR_LEN];
    seen s;

    /* Before: the three blocks fetch over UCX, decoded here, equal to the render. */
    unsigned idx[3] = {good[0], bad, good[1]};
    for (unsigned i = 0; i < 3; i++)
        CU_ASSERT_FATAL(ref_fill(ref, idx[i]) == 0);
    int rc = fetch_idx(u, idx, 3, &s, err);
    CU_ASSERT_EQUAL(rc, 0);
    CU_ASSERT_EQUAL(s.layers[0] + s.layers[1] + s.layers[2], 3u * NL);
    CU_ASSERT_EQUAL(s.mismatch, 0u);
    CU_ASSERT_EQUAL(s.order_bad, 0u);

    /* The stored bytes of layer 2's V tile (over UCX, stored format: lent in place). */
    needle_arg n = {{0}, 0};
    rc = kvs_client_fetch(u, &ns, (const unsigned char(*)[KVS_CLIENT_KEY_LEN])g_keys[bad], 1,
                          KVS_EGRESS_STORED, 0, 30000, needle_cb, &n, err);
    CU_ASSERT_FATAL(rc == 0 && n.got);
    int flipped = flip_in_arena(g_srv.pid, n.bytes, sizeof n.bytes);
    if (flipped == -2) {
        printf("  dram_corrupt: skipped: /proc/%d/mem cannot be written (ptrace rights)\n",
               (int)g_srv.pid);
        kvs_client_close(u);
        kvs_client_close(ref);
        kvs_client_close(srvdec);
        kvs_client_close(grpc_cl);
        return;
    }
    if (flipped != 1)
        fprintf(stderr, "dram_corrupt: %d copies of the tile bytes in the arena\n", flipped);
    CU_ASSERT_FATAL(flipped == 1);

    kvs_client_xfer_stats st0, st1;
    CU_ASSERT_EQUAL(xfer_stats(u, &st0), 0);
    double failed0 = kvs_itest_stat(ref, "kvstash_xfer_blocks_failed_total", NULL, NULL);

    /* After: layer 2 of the bad block is never handed on, nor anything after it.
     * Layers before it may be (layer 0 travels alone and is; layer 1 shares a
     * message with layer 2 at the default min_msg_bytes, and transfer/ checks a
     * message's layers together): whatever is handed on equals the render. */
    rc = fetch_idx(u, idx, 3, &s, err);
    CU_ASSERT_EQUAL(rc, KVS_EFORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "DATA_LOSS"));
    CU_ASSERT_EQUAL(s.layers[0], (unsigned)NL);
    CU_ASSERT(s.layers[1] >= 1 && s.layers[1] <= 2);
    CU_ASSERT_EQUAL(s.layers[2], 0u);
    CU_ASSERT_EQUAL(s.mismatch, 0u);
    CU_ASSERT_EQUAL(s.order_bad, 0u);
    CU_ASSERT_EQUAL(xfer_stats(u, &st1), 0);
    CU_ASSERT_EQUAL(st1.fallbacks, st0.fallbacks); /* an answer, not a path failure */
    CU_ASSERT_EQUAL(st1.fetches, st0.fetches);
    CU_ASSERT_EQUAL(st1.connected, 1);
    CU_ASSERT_EQUAL(st1.ucx_status, 0);
    CU_ASSERT_EQUAL(st1.corrupt, st0.corrupt + 1);
    printf("  dram_corrupt: rc=%s err='%s' layers %u %u %u mismatch %u\n", kvs_strerror(rc), err,
           s.layers[0], s.layers[1], s.layers[2], s.mismatch);

    /* The bad block alone: nothing of layer 2 or later, same verdict. */
    rc = fetch_idx(u, &idx[1], 1, &s, err);
    CU_ASSERT_EQUAL(rc, KVS_EFORMAT);
    CU_ASSERT(s.layers[0] >= 1 && s.layers[0] <= 2);
    CU_ASSERT_EQUAL(s.mismatch, 0u);

    /* In the stored format (no decode) the same: transfer/ refuses the
     * layer, so layer 2 never reaches the callback. */
    needle_arg n2 = {{0}, 0};
    rc = kvs_client_fetch(u, &ns, (const unsigned char(*)[KVS_CLIENT_KEY_LEN])g_keys[bad], 1,
                          KVS_EGRESS_STORED, 0, 30000, needle_cb, &n2, err);
    CU_ASSERT_EQUAL(rc, KVS_EFORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "DATA_LOSS"));
    CU_ASSERT_EQUAL(n2.got, 0);

    /* The server's render refuses it too (decode = server over UCX)... */
    rc = fetch_idx(srvdec, &idx[1], 1, &s, err);
    CU_ASSERT_EQUAL(rc, KVS_EFORMAT);
    CU_ASSERT_EQUAL(s.layers[0], 0u); /* the render fails before any byte is sent */
    CU_ASSERT(kvs_itest_stat(ref, "kvstash_xfer_blocks_failed_total", NULL, NULL) >= failed0 + 1);
    kvs_client_xfer_stats sst;
    CU_ASSERT_EQUAL(xfer_stats(srvdec, &sst), 0);
    CU_ASSERT_EQUAL(sst.corrupt, 1u);
    CU_ASSERT_EQUAL(sst.fallbacks, 0u);
    /* ...and so does gRPC Get with client decode. */
    s.idx = &idx[1];
    memset(s.layers, 0, sizeof s.layers);
    s.next_b = s.next_l = 0;
    rc = kvs_client_get(grpc_cl, &ns, (const unsigned char(*)[KVS_CLIENT_KEY_LEN])g_keys[bad], 1,
                        KVS_EGRESS_FP16, 0, 30000, seen_cb, &s, err);
    CU_ASSERT_EQUAL(rc, KVS_EFORMAT);
    CU_ASSERT(s.layers[0] <= 2);
    CU_ASSERT_EQUAL(s.mismatch, 0u);

    /* fetch_into [good, bad]: the good block lands, the bad block's layer 2 and
     * later are never written (and no layer of it holds anything but the render). */
    {
        unsigned char keys[2][KVS_CLIENT_KEY_LEN];
        memcpy(keys[0], g_keys[good[0]], KVS_CLIENT_KEY_LEN);
        memcpy(keys[1], g_keys[bad], KVS_CLIENT_KEY_LEN);
        into_bufs ib;
        into_init(&ib, 2);
        rc = kvs_client_fetch_into(u, &ns, (const unsigned char(*)[KVS_CLIENT_KEY_LEN])keys, 2,
                                   KVS_EGRESS_FP16, 0, 30000, ib.k, ib.v, ib.ks, ib.vs, err);
        CU_ASSERT_EQUAL(rc, KVS_EFORMAT);
        CU_ASSERT_PTR_NOT_NULL(strstr(err, "DATA_LOSS"));
        unsigned same, untouched;
        into_count(&ib, 0, good[0], &same, &untouched);
        CU_ASSERT_EQUAL(same, (unsigned)NL);
        into_count(&ib, 1, bad, &same, &untouched);
        CU_ASSERT(same >= 1 && same <= 2);
        CU_ASSERT_EQUAL(same + untouched, (unsigned)NL);
        free(ib.mem);
    }

    /* The same over gRPC with client decode (kvs_client_get_into, which is
     * also kvs_client_fetch_into with opts.ucx = 0): the bad block's layer 2
     * and later are never written, not even its K or heads before the bad
     * tile (a first version decoded each head into the caller's buffers as
     * it checked it). */
    for (int into_fetch = 0; into_fetch < 2; into_fetch++) {
        unsigned char keys[2][KVS_CLIENT_KEY_LEN];
        memcpy(keys[0], g_keys[good[0]], KVS_CLIENT_KEY_LEN);
        memcpy(keys[1], g_keys[bad], KVS_CLIENT_KEY_LEN);
        into_bufs ib;
        into_init(&ib, 2);
        const unsigned char(*kp)[KVS_CLIENT_KEY_LEN] =
            (const unsigned char(*)[KVS_CLIENT_KEY_LEN])keys;
        rc = into_fetch ? kvs_client_fetch_into(grpc_cl, &ns, kp, 2, KVS_EGRESS_FP16, 0, 30000,
                                                ib.k, ib.v, ib.ks, ib.vs, err)
                        : kvs_client_get_into(grpc_cl, &ns, kp, 2, KVS_EGRESS_FP16, 0, 30000, ib.k,
                                              ib.v, ib.ks, ib.vs, err);
        CU_ASSERT_EQUAL(rc, KVS_EFORMAT);
        unsigned same, untouched;
        into_count(&ib, 0, good[0], &same, &untouched);
        CU_ASSERT_EQUAL(same, (unsigned)NL);
        into_count(&ib, 1, bad, &same, &untouched);
        CU_ASSERT_EQUAL(same, 2u); /* layers 0 and 1 */
        CU_ASSERT_EQUAL(untouched, (unsigned)NL - 2);
        free(ib.mem);
    }

    /* The session is still good: the good blocks fetch over UCX, no fallback. */
    rc = fetch_idx(u, good, 2, &s, err);
    CU_ASSERT_EQUAL(rc, 0);
    CU_ASSERT_EQUAL(s.layers[0] + s.layers[1], 2u * NL);
    CU_ASSERT_EQUAL(s.mismatch, 0u);
    CU_ASSERT_EQUAL(xfer_stats(u, &st1), 0);
    CU_ASSERT_EQUAL(st1.fallbacks, st0.fallbacks);
    CU_ASSERT_EQUAL(st1.fetches, st0.fetches + 1);
    CU_ASSERT_EQUAL(st1.corrupt, st0.corrupt + 4); /* the four fetches of the bad block */
    kvs_client_close(u);
    kvs_client_close(ref);
    kvs_client_close(srvdec);
    kvs_client_close(grpc_cl);
}

/* Every SSD file flipped: kvstashd's read refuses the block and drops it. */
static void test_ssd_corrupt(void)
{
    kvs_client *u, *ref;
    CU_ASSERT_FATAL(open_with(1, KVS_DECODE_AUTO, &u) == 0);
    CU_ASSERT_FATAL(open_with(0, KVS_DECODE_SERVER, &ref) == 0);
    CU_ASSERT_FATAL(ref_fill(ref, NBLK - 2) == 0 && ref_fill(ref, NBLK - 3) == 0);
    unsigned nfiles = 0;
    DIR *d = opendir(g_ssd);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", g_ssd, e->d_name);
        int fd = open(p, O_WRONLY);
        uint8_t x = 0xFF;
        if (fd >= 0 && pwrite(fd, &x, 1, 100) == 1)
            nfiles++;
        if (fd >= 0)
            close(fd);
    }
    if (d)
        closedir(d);
    CU_ASSERT_FATAL(nfiles > 0); /* block 0, the oldest, is among them */
    double dropped0 = kvs_itest_stat(ref, "kvstash_store_corrupt_dropped_total", NULL, NULL);
    double failed0 = kvs_itest_stat(ref, "kvstash_xfer_blocks_failed_total", NULL, NULL);
    kvs_client_xfer_stats st0, st1;
    CU_ASSERT_EQUAL(xfer_stats(u, &st0), 0);

    unsigned idx[3] = {NBLK - 2, 0, NBLK - 3};
    char err[KVS_ERR_LEN];
    seen s;
    int rc = fetch_idx(u, idx, 3, &s, err);
    CU_ASSERT_EQUAL(rc, KVS_EFORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "DATA_LOSS"));
    CU_ASSERT_EQUAL(s.layers[0], (unsigned)NL);
    CU_ASSERT_EQUAL(s.layers[1], 0u);
    CU_ASSERT_EQUAL(s.layers[2], 0u);
    CU_ASSERT_EQUAL(s.mismatch, 0u);
    CU_ASSERT_EQUAL(s.order_bad, 0u);
    printf("  ssd_corrupt: %u files, rc=%s err='%s'\n", nfiles, kvs_strerror(rc), err);
    CU_ASSERT(kvs_itest_stat(ref, "kvstash_store_corrupt_dropped_total", NULL, NULL) >=
              dropped0 + 1);
    CU_ASSERT(kvs_itest_stat(ref, "kvstash_xfer_blocks_failed_total", NULL, NULL) >= failed0 + 1);
    CU_ASSERT_EQUAL(xfer_stats(u, &st1), 0);
    CU_ASSERT_EQUAL(st1.fallbacks, st0.fallbacks);
    CU_ASSERT_EQUAL(st1.connected, 1);
    CU_ASSERT_EQUAL(st1.corrupt, st0.corrupt + 1);

    /* Dropped: now it is not cached at all. */
    rc = fetch_idx(u, &idx[1], 1, &s, err);
    CU_ASSERT_EQUAL(rc, KVS_ENOTFOUND);
    CU_ASSERT_EQUAL(s.layers[0], 0u);
    CU_ASSERT_EQUAL(xfer_stats(u, &st1), 0);
    CU_ASSERT_EQUAL(st1.fallbacks, st0.fallbacks);
    CU_ASSERT_EQUAL(st1.connected, 1);
    CU_ASSERT_EQUAL(st1.corrupt, st0.corrupt + 1); /* not found is not corrupt */
    kvs_client_close(u);
    kvs_client_close(ref);
}

int main(int argc, char **argv)
{
    static const kvs_test_case cases[] = {
        {"fetch_into", test_fetch_into},
        {"dram_corrupt", test_dram_corrupt}, /* early: nothing promoted or evicted yet */
        {"ssd_corrupt", test_ssd_corrupt},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {
        {"faults", suite_init, suite_cleanup, cases},
        {NULL, NULL, NULL, NULL},
    };
    return kvs_itest_main(argc, argv, &g_kvstashd, suites);
}
