/*
 * service_bench.c — kvstashd over gRPC on loopback, against Redis on loopback.
 *
 *   service_bench /path/to/kvstashd [--quick]
 *                 [--lookup-only | --get-only | --fetch-only | --put-only]
 *
 * Starts its own kvstashd (127.0.0.1, port 0, memory tier faulted in at start:
 * prefault_memory) and its own redis-server (a free
 * port, no persistence), both stopped at the end, and measures:
 *  1. Lookup QPS and p50/p99 latency at 1, 4 and 16 concurrent clients, every
 *     Lookup an 8-block prompt that is fully cached (so the server walks and
 *     leases the whole chain), and the CPU time per Lookup of each side, in
 *     two modes. Thread mode (1, 4, 16): each client an OS thread with its own
 *     kvs_client (channel) making blocking kvs_client_lookup calls. Async mode
 *     (4, 16): each client one outstanding kvs_client_lookup_async call, issued
 *     again from its callback (closed loop), all on one kvs_client, the way
 *     load generators (ghz, wrk) drive N concurrent clients from few threads;
 *     latency runs from the issue to the callback and every call counts. The
 *     RESULT line reports async mode at 16 clients: 16 client threads on 2
 *     cores measure the bench's own scheduling as much as the server
 *     (docs/BENCHMARKS.md); thread mode is printed next to it. gRPC's global
 *     subchannel pool puts all the clients of this one process on one TCP
 *     connection; giving each its own (GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL) was
 *     measured to cost more CPU per Lookup on 2 cores (docs/BENCHMARKS.md,
 *     Service), so it stays shared. --lookup-only stops after this part;
 *     --get-only skips it (and the Lookup preload and check) to time part 2.
 *  2. Put and Get throughput (MB/s of fp16 KV and KV tokens/s) with 4 clients:
 *     Put stores blocks at fp16 (pure storage, what Redis does) and at int8
 *     (quantize on ingest); Get fetches 8 blocks per call as fp16 into the
 *     caller's buffers, from the fp16 and from the int8 blocks, each two ways:
 *     the server renders fp16 (kvs_client_opts.decode = KVS_DECODE_SERVER) or
 *     the client fetches the stored tiles and decodes them (KVS_DECODE_CLIENT,
 *     what the default, auto, does). The baseline is Redis SET / GET of the
 *     same fp16 block bytes (one key per block, GETs pipelined 8 at a time like
 *     the 8-block Get), with the same number of connections, measured in the
 *     same run.
 *  3. --fetch-only (instead of 1 and 2): KV tokens/s through kvs_client_fetch
 *     over UCX (kvs_client_opts.ucx = 1; UCX_TLS picks the transport) from
 *     int8-stored blocks, 4 clients, 8 blocks per call: the stored tiles only
 *     (landed and verified, not decoded) and fp16 with the client's decode
 *     copied into the caller's buffers by the callback (what a worker restores)
 *     and through kvs_client_fetch_into (decoded straight into them), next to gRPC
 *     Get with the client's decode and Redis GET of the fp16 block, in
 *     alternating rounds (run_fetch_rows). Validated first: the stored bytes
 *     equal gRPC Get's, the decoded fp16 equals kvstashd's gRPC render, and no
 *     fetch fell back to gRPC (checked after every timed phase too). Last line:
 *     RESULT fetch_stored_tokens_per_s fetch_fp16_tokens_per_s
 *     fetch_into_tokens_per_s get_fp16_tokens_per_s redis_tokens_per_s
 *     fetch_fp16_vs_redis fetch_into_vs_redis fetch_stored_vs_redis
 *     decode_vs_stored into_vs_fetch (medians over the rounds).
 *  4. --put-only (instead of 1 and 2): Put throughput (KV tokens/s and MB/s of
 *     fp16 KV in), 4 clients, each its own kvs_client, of the same 2 MiB fp16
 *     blocks: gRPC Put (kvs_client_put) and UCX put (kvs_client_put_ucx with
 *     kvs_client_opts.ucx = 1, sealed: docs/TRANSFER.md "Sealed puts"; UCX_TLS
 *     picks the transport), each stored at fp16 and at int8 (quantize on
 *     ingest), next to Redis SET of the same fp16 bytes, in alternating rounds
 *     after one untimed pass of each row (run_put_rows). Every phase puts fresh
 *     blocks (token ids distinct per round and row; every put answered not
 *     already_present, or the run fails) and deletes them afterwards, untimed
 *     (Redis: FLUSHDB), so no round finds the store fuller than the last. Each
 *     client makes one untimed put before the clock starts (its UCX Connect
 *     and gRPC channel are set up then: a worker keeps its session). Validated
 *     first (validate_put): a block put over gRPC and, once deleted, over UCX
 *     gets the same key, stored size and stored bytes (Get KVS_EGRESS_STORED),
 *     fp16 comes back bit-exact, int8 within 5 %, a second UCX put of it
 *     answers already_present; after every UCX phase no put fell back to gRPC
 *     (kvs_client_xfer_stats fallbacks 0) and kvstashd's
 *     kvstash_xfer_puts_total grew by exactly the UCX puts made (Stats RPC),
 *     with kvstash_xfer_put_seal_refused_total still 0. CPU per block is
 *     printed for the clients, kvstashd and its data plane process
 *     (kvstash-xferd, ucx_isolate = on; pid from kvstash_xfer_proc_pid). Last
 *     two lines, int8 (the default scheme) on the RESULT line and fp16 on the
 *     one before: put_ucx_tokens_per_s put_grpc_tokens_per_s
 *     redis_set_tokens_per_s ucx_vs_grpc ucx_vs_redis (rates: medians over the
 *     rounds; ratios: medians of the per-round ratios).
 * Before timing it validates: a Put at fp16 comes back bit-exact from Get, an
 * int8 block comes back within 5 % relative error, the client's decode gives
 * the server's fp16 bytes for both, Lookup matches the 8 preloaded blocks, and
 * Redis GET returns the bytes SET stored.
 *
 * The block: 64 tokens x 8 layers x 8 KV heads x head_dim 128, fp16 = 2 MiB of
 * K+V (Llama-3-8B-like heads, fewer layers to keep the run short on 2 cores).
 * Last line: RESULT lookup_p99_ms_16=<x> get_tokens_per_s=<n> redis_tokens_per_s=<n>
 * get_ratio=<get / redis> get_fp16_stored_ratio=<r>. get_tokens_per_s is what a
 * user of kvstash with its defaults gets: blocks stored at the default scheme
 * (int8) restored into fp16 buffers, decoded by the client (the default
 * decode); get_fp16_stored_ratio is the same Get of fp16-stored blocks over
 * Redis GET. The ratios of every row are printed on the line before.
 */
#include "../support/kvs_bench_stats.h"
#include "kvstash.h"

#include <hiredis/hiredis.h>

#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define L             8u
#define H             8u
#define D             128u
#define T             64u
#define PROMPT_BLOCKS 8u
#define GET_BATCH     8u
#define LAYER_ELEMS   ((size_t)T * H * D)
#define LAYER_BYTES   (LAYER_ELEMS * 2)
#define BLOCK_BYTES   (LAYER_BYTES * 2 * L)

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static pid_t g_kvs_pid, g_redis_pid;
static char g_tmp[64];

static void stop_children(void)
{
    if (g_kvs_pid > 0) {
        kill(g_kvs_pid, SIGTERM);
        waitpid(g_kvs_pid, NULL, 0);
        g_kvs_pid = 0;
    }
    if (g_redis_pid > 0) {
        kill(g_redis_pid, SIGTERM);
        waitpid(g_redis_pid, NULL, 0);
        g_redis_pid = 0;
    }
    if (g_tmp[0]) {
        char path[128];
        snprintf(path, sizeof path, "%s/port", g_tmp);
        unlink(path);
        rmdir(g_tmp);
        g_tmp[0] = '\0';
    }
}

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "service_bench: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    stop_children();
    exit(1);
}

static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* fp16 bits of a value in [-2, 2): exponent 14/15 and random mantissa and
 * sign; never NaN or Inf. */
static void fill_fp16(uint16_t *dst, size_t n, uint64_t *seed)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t r = mix(seed);
        dst[i] = (uint16_t)((r & 0x8000u) | ((0x0E + (r >> 16 & 1)) << 10) | (r >> 20 & 0x3FF));
    }
}

/* ---- children -------------------------------------------------------------- */

/* quiet: the child's stdout and stderr go to /dev/null (redis-server prints
 * start-up warnings even at --loglevel warning). */
static pid_t spawn(char *const argv[], int quiet)
{
    pid_t pid = fork();
    if (pid < 0)
        die("fork: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (quiet && freopen("/dev/null", "w", stdout) == NULL)
            _exit(127);
        if (quiet && freopen("/dev/null", "w", stderr) == NULL)
            _exit(127);
        execv(argv[0], argv);
        fprintf(stderr, "service_bench: exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    return pid;
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        die("cannot find a free port: %s", strerror(errno));
    close(fd);
    return ntohs(a.sin_port);
}

static int start_kvstashd(const char *path)
{
    snprintf(g_tmp, sizeof g_tmp, "/tmp/kvs-svcbench-XXXXXX");
    if (mkdtemp(g_tmp) == NULL)
        die("mkdtemp: %s", strerror(errno));
    char port_file[128];
    snprintf(port_file, sizeof port_file, "%s/port", g_tmp);
    /* The worker thread count is kvstashd's default: what a user gets. The
     * memory tier is faulted in at start (prefault_memory): the Put rows then
     * time a server in its steady state, not the kernel's first touch of each
     * arena page, which a fresh server pays once per page (3x slower Puts on
     * this VM: docs/BENCHMARKS.md, "Put on a fresh server"). */
    char *argv[] = {(char *)path,
                    "--listen",
                    "127.0.0.1:0",
                    "--port-file",
                    port_file,
                    "--capacity",
                    "3GiB",
                    "--prefault-memory",
                    "on",
                    "--log-level",
                    "warn",
                    "--calls-per-method",
                    "32",
                    NULL};
    g_kvs_pid = spawn(argv, 0);
    for (int i = 0; i < 6000; i++) { /* populating 3 GiB takes seconds */
        FILE *f = fopen(port_file, "r");
        int port = 0;
        if (f) {
            char line[32] = "";
            if (fgets(line, sizeof line, f) && strchr(line, '\n'))
                port = atoi(line);
            fclose(f);
        }
        if (port > 0)
            return port;
        if (waitpid(g_kvs_pid, NULL, WNOHANG) == g_kvs_pid) {
            g_kvs_pid = 0;
            die("kvstashd exited at start");
        }
        usleep(10000);
    }
    die("kvstashd wrote no port within 60 s");
}

static int start_redis(void)
{
    int port = free_port();
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    char *argv[] = {"/usr/bin/redis-server",
                    "--port",
                    ps,
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--loglevel",
                    "warning",
                    "--protected-mode",
                    "yes",
                    NULL};
    g_redis_pid = spawn(argv, 1);
    for (int i = 0; i < 1000; i++) {
        redisContext *c = redisConnect("127.0.0.1", port);
        if (c && !c->err) {
            redisReply *r = redisCommand(c, "PING");
            int ok = r && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0;
            freeReplyObject(r);
            redisFree(c);
            if (ok)
                return port;
        } else if (c) {
            redisFree(c);
        }
        if (waitpid(g_redis_pid, NULL, WNOHANG) == g_redis_pid) {
            g_redis_pid = 0;
            die("redis-server exited at start (port %d taken?)", port);
        }
        usleep(10000);
    }
    die("redis-server did not answer PING within 10 s");
}

/* ---- shared setup ------------------------------------------------------------ */

static char g_target[64];
static kvs_ns g_ns = {.model = "service-bench",
                      .num_layers = L,
                      .num_kv_heads = H,
                      .head_dim = D,
                      .block_tokens = T,
                      .dtype = 1};

/* decode: who makes fp16 from the stored tiles on Get (kvstash.h kvs_decode_at). */
static kvs_client *open_client_decode(kvs_decode_at decode)
{
    kvs_client_opts o = {.target = g_target, .call_timeout_ms = 30000, .decode = decode};
    kvs_client *c = NULL;
    char err[KVS_ERR_LEN] = "";
    int rc = kvs_client_open(&o, &c, err);
    if (rc != 0)
        die("kvs_client_open: %s: %s", kvs_strerror(rc), err);
    return c;
}

static kvs_client *open_client(void)
{
    return open_client_decode(KVS_DECODE_AUTO);
}

/* A client whose kvs_client_fetch goes over UCX (kvs_client_opts.ucx). */
static kvs_client *open_client_ucx(kvs_decode_at decode)
{
    kvs_client_opts o = {.target = g_target, .call_timeout_ms = 30000, .decode = decode, .ucx = 1};
    kvs_client *c = NULL;
    char err[KVS_ERR_LEN] = "";
    int rc = kvs_client_open(&o, &c, err);
    if (rc != 0)
        die("kvs_client_open (ucx): %s: %s", kvs_strerror(rc), err);
    return c;
}

/* One block's payload: K and V of every layer, contiguous, and pointers to it. */
typedef struct block_buf {
    uint16_t *data; /* L x (K, V) x LAYER_ELEMS */
    const void *k[L], *v[L];
    void *kd[L], *vd[L];
} block_buf;

static void block_init(block_buf *b, uint64_t seed)
{
    b->data = malloc(BLOCK_BYTES);
    if (b->data == NULL)
        die("out of memory");
    fill_fp16(b->data, BLOCK_BYTES / 2, &seed);
    for (unsigned l = 0; l < L; l++) {
        b->k[l] = b->kd[l] = (char *)b->data + (2 * l) * LAYER_BYTES;
        b->v[l] = b->vd[l] = (char *)b->data + (2 * l + 1) * LAYER_BYTES;
    }
}

static void tokens_for(unsigned *tok, uint64_t seed, size_t n)
{
    for (size_t i = 0; i < n; i++)
        tok[i] = (unsigned)(mix(&seed) % 32000u);
}

/* ucx: through kvs_client_put_ucx (the client must be open with opts.ucx = 1
 * for that to leave gRPC), else kvs_client_put. */
static int put_block(kvs_client *c, const block_buf *b, const unsigned *tok, unsigned index,
                     const unsigned char *parent, unsigned scheme, int ucx, kvs_put_result *res)
{
    kvs_put_args a = {.ns = &g_ns,
                      .parent_key = parent,
                      .index = index,
                      .tokens = tok,
                      .scheme = scheme,
                      .k = b->k,
                      .v = b->v};
    char err[KVS_ERR_LEN] = "";
    int rc = ucx ? kvs_client_put_ucx(c, &a, -1, res, err) : kvs_client_put(c, &a, -1, res, err);
    if (rc != 0)
        fprintf(stderr, "service_bench: put%s: %s: %s\n", ucx ? " (ucx)" : "", kvs_strerror(rc),
                err);
    return rc;
}

/* ---- validation -------------------------------------------------------------- */

static double rel_err(const uint16_t *a, const uint16_t *b, size_t n);

/* Validates Get both ways (the server renders fp16; the client decodes the
 * stored tiles): the two must give the same bytes, fp16-stored blocks the
 * bytes put, int8 ones within 5 %. */
static void validate(int redis_port)
{
    kvs_client *c = open_client_decode(KVS_DECODE_SERVER);
    kvs_client *cl = open_client_decode(KVS_DECODE_CLIENT);
    block_buf src, got, loc;
    block_init(&src, 11);
    block_init(&got, 12);
    block_init(&loc, 13);
    unsigned tok[T];
    unsigned char key[KVS_CLIENT_KEY_LEN];
    char err[KVS_ERR_LEN] = "";
    for (unsigned scheme = 1; scheme <= 4; scheme += 3) { /* fp16, int8 */
        tokens_for(tok, 1000 + scheme, T);
        kvs_put_result res;
        memset(&res, 0, sizeof res);
        if (put_block(c, &src, tok, 0, NULL, scheme, 0, &res) != 0)
            die("validation put failed");
        memcpy(key, res.key, sizeof key);
        int rc = kvs_client_get_into(c, &g_ns, (const unsigned char(*)[KVS_CLIENT_KEY_LEN])key, 1,
                                     KVS_EGRESS_FP16, 0, -1, got.kd, got.vd, NULL, NULL, err);
        if (rc != 0)
            die("validation get: %s: %s", kvs_strerror(rc), err);
        rc = kvs_client_get_into(cl, &g_ns, (const unsigned char(*)[KVS_CLIENT_KEY_LEN])key, 1,
                                 KVS_EGRESS_FP16, 0, -1, loc.kd, loc.vd, NULL, NULL, err);
        if (rc != 0)
            die("validation get (client decode): %s: %s", kvs_strerror(rc), err);
        if (scheme == 1 && memcmp(src.data, got.data, BLOCK_BYTES) != 0)
            die("validation: a block put at fp16 came back different");
        double e = rel_err(src.data, got.data, BLOCK_BYTES / 2);
        if (scheme == 4 && !(e > 0 && e < 0.05))
            die("validation: int8 block relative error %.4f", e);
        if (memcmp(loc.data, got.data, BLOCK_BYTES) != 0)
            die("validation: %s block: the client's decode differs from the server's fp16",
                scheme == 1 ? "fp16" : "int8");
        printf("validate: %s put -> get fp16: %s (relative error %.2e); client decode: the "
               "server's bytes\n",
               scheme == 1 ? "fp16" : "int8", scheme == 1 ? "bit-exact" : "close", e);
    }
    redisContext *r = redisConnect("127.0.0.1", redis_port);
    if (r == NULL || r->err)
        die("redis connect failed");
    redisReply *rep = redisCommand(r, "SET validate %b", (const char *)src.data, BLOCK_BYTES);
    if (rep == NULL || rep->type != REDIS_REPLY_STATUS)
        die("redis SET failed");
    freeReplyObject(rep);
    rep = redisCommand(r, "GET validate");
    if (rep == NULL || rep->type != REDIS_REPLY_STRING || rep->len != (long long)BLOCK_BYTES ||
        memcmp(rep->str, src.data, BLOCK_BYTES) != 0)
        die("redis GET did not return the bytes SET stored");
    freeReplyObject(rep);
    redisFree(r);
    printf("validate: redis SET -> GET of %zu bytes: identical\n", (size_t)BLOCK_BYTES);
    free(src.data);
    free(got.data);
    free(loc.data);
    kvs_client_close(c);
    kvs_client_close(cl);
}

/* Layers a kvs_client_fetch / kvs_client_get callback hands on, copied: into
 * dst at [block][layer][K, V] of LAYER_BYTES each when copy is set (fp16, what
 * a worker restores into its KV memory), else only counted (stored tiles: the
 * bytes landed and verified in the library's buffers). */
typedef struct fetch_sink {
    char *dst;
    int copy;
    uint64_t layers, bytes, bad;
} fetch_sink;

static int fetch_cb(void *arg, unsigned b, unsigned l, const void *k, size_t kl, const void *v,
                    size_t vl, float ks, float vs, int last)
{
    (void)ks;
    (void)vs;
    (void)last;
    fetch_sink *f = arg;
    f->layers++;
    f->bytes += kl + vl;
    if (!f->copy)
        return 0;
    if (kl != LAYER_BYTES || vl != LAYER_BYTES || b >= GET_BATCH) {
        f->bad++;
        return 1;
    }
    char *p = f->dst + ((size_t)b * L + l) * 2 * LAYER_BYTES;
    memcpy(p, k, kl);
    memcpy(p + LAYER_BYTES, v, vl);
    return 0;
}

/* Stored layers as one byte string (K then V per layer), for comparing paths. */
typedef struct stored_acc {
    char *buf;
    size_t len, cap;
} stored_acc;

static int stored_cb(void *arg, unsigned b, unsigned l, const void *k, size_t kl, const void *v,
                     size_t vl, float ks, float vs, int last)
{
    (void)b;
    (void)l;
    (void)ks;
    (void)vs;
    (void)last;
    stored_acc *a = arg;
    if (a->len + kl + vl > a->cap) {
        a->cap = 2 * (a->len + kl + vl);
        if ((a->buf = realloc(a->buf, a->cap)) == NULL)
            die("out of memory");
    }
    memcpy(a->buf + a->len, k, kl);
    memcpy(a->buf + a->len + kl, v, vl);
    a->len += kl + vl;
    return 0;
}

/* The UCX rows are worth timing only if they are right and stay on UCX: an
 * int8 block fetched stored over UCX gives gRPC Get's stored bytes, fetched
 * as fp16 with the client's decode gives the server's gRPC fp16 render (of
 * kvs_block_decode_layer), and no fetch fell back to gRPC. */
static void validate_fetch(void)
{
    kvs_client *g = open_client_decode(KVS_DECODE_SERVER);
    kvs_client *u = open_client_ucx(KVS_DECODE_AUTO);
    block_buf src, ref;
    block_init(&src, 21);
    block_init(&ref, 22);
    unsigned tok[T];
    tokens_for(tok, 2121, T);
    kvs_put_result res;
    memset(&res, 0, sizeof res);
    if (put_block(g, &src, tok, 0, NULL, 4, 0, &res) != 0)
        die("validation put (int8) failed");
    const unsigned char(*key)[KVS_CLIENT_KEY_LEN] =
        (const unsigned char(*)[KVS_CLIENT_KEY_LEN])res.key;
    char err[KVS_ERR_LEN] = "";
    stored_acc sg = {0}, su = {0};
    int rc = kvs_client_get(g, &g_ns, key, 1, KVS_EGRESS_STORED, 0, -1, stored_cb, &sg, err);
    if (rc != 0)
        die("validation get (stored): %s: %s", kvs_strerror(rc), err);
    rc = kvs_client_fetch(u, &g_ns, key, 1, KVS_EGRESS_STORED, 0, -1, stored_cb, &su, err);
    if (rc != 0)
        die("validation fetch (stored): %s: %s", kvs_strerror(rc), err);
    if (sg.len == 0 || sg.len != su.len || memcmp(sg.buf, su.buf, sg.len) != 0)
        die("validation: the stored bytes fetched over UCX differ from gRPC Get's");
    rc = kvs_client_get_into(g, &g_ns, key, 1, KVS_EGRESS_FP16, 0, -1, ref.kd, ref.vd, NULL, NULL,
                             err);
    if (rc != 0)
        die("validation get (fp16, server render): %s: %s", kvs_strerror(rc), err);
    fetch_sink f = {.dst = malloc((size_t)GET_BATCH * BLOCK_BYTES), .copy = 1};
    if (f.dst == NULL)
        die("out of memory");
    rc = kvs_client_fetch(u, &g_ns, key, 1, KVS_EGRESS_FP16, 0, -1, fetch_cb, &f, err);
    if (rc != 0 || f.bad || f.layers != L)
        die("validation fetch (fp16, client decode): %s: %s", kvs_strerror(rc), err);
    if (memcmp(f.dst, ref.data, BLOCK_BYTES) != 0)
        die("validation: the client's decode of a UCX fetch differs from the server's fp16");
    block_buf into;
    block_init(&into, 23);
    rc = kvs_client_fetch_into(u, &g_ns, key, 1, KVS_EGRESS_FP16, 0, -1, into.kd, into.vd, NULL,
                               NULL, err);
    if (rc != 0)
        die("validation fetch_into (fp16, client decode): %s: %s", kvs_strerror(rc), err);
    if (memcmp(into.data, ref.data, BLOCK_BYTES) != 0)
        die("validation: kvs_client_fetch_into's decode differs from the server's fp16");
    free(into.data);
    kvs_client_xfer_stats st;
    if (kvs_client_xfer_stats_get(u, &st) != 0 || st.fallbacks != 0 || st.fetches != 3 ||
        !st.connected)
        die("validation: the fetches did not stay on UCX (fetches %llu, fallbacks %llu, "
            "ucx_status %d)",
            st.fetches, st.fallbacks, st.ucx_status);
    printf("validate: int8 block over UCX: stored bytes = gRPC Get's (%zu bytes); fetch fp16 "
           "and fetch_into with client decode = the server's fp16 render; 3 fetches on UCX, 0 "
           "fallbacks\n",
           sg.len);
    free(sg.buf);
    free(su.buf);
    free(f.dst);
    free(src.data);
    free(ref.data);
    kvs_client_close(g);
    kvs_client_close(u);
}

/* Value of kvstashd's metric name (Stats RPC); dies when it has none. */
static double metric_value(kvs_client *c, const char *name)
{
    kvs_stats *s = NULL;
    char err[KVS_ERR_LEN] = "";
    int rc = kvs_client_stats(c, name, -1, &s, err);
    if (rc != 0)
        die("Stats: %s: %s", kvs_strerror(rc), err);
    const kvs_metric *m = kvs_stats_find(s, name, NULL, NULL);
    if (m == NULL)
        die("kvstashd reports no metric %s", name);
    double v = m->value;
    kvs_stats_free(s);
    return v;
}

/* Deletes n blocks; dies unless kvstashd deleted all n. */
static void delete_blocks(kvs_client *c, const unsigned char (*keys)[KVS_CLIENT_KEY_LEN], size_t n)
{
    char err[KVS_ERR_LEN] = "";
    unsigned deleted = 0;
    int rc = kvs_client_delete(c, &g_ns, keys, n, 0, -1, &deleted, err);
    if (rc != 0 || deleted != n)
        die("delete of %zu blocks: %s: %s (%u deleted)", n, kvs_strerror(rc), err, deleted);
}

/* The UCX put rows are worth timing only if a UCX put stores what gRPC Put
 * stores and stays on UCX: for fp16 and int8, a block put over gRPC is read
 * back stored (Get KVS_EGRESS_STORED) and deleted, then put over UCX with the
 * same token ids: same key, same stored size, same stored bytes; fp16 comes
 * back bit-exact, int8 within 5 %; kvstash_xfer_puts_total counts the UCX put
 * (and nothing else moved it: the gRPC put did not), a second UCX put of the
 * block answers already_present, and the UCX client made no fallback. */
static void validate_put(void)
{
    kvs_client *g = open_client_decode(KVS_DECODE_SERVER);
    kvs_client *u = open_client_ucx(KVS_DECODE_AUTO);
    block_buf src, back;
    block_init(&src, 31);
    block_init(&back, 32);
    char err[KVS_ERR_LEN] = "";
    unsigned long long ucx_puts = 0;
    for (unsigned scheme = 1; scheme <= 4; scheme += 3) { /* fp16, int8 */
        const char *sn = scheme == 1 ? "fp16" : "int8";
        unsigned tok[T];
        tokens_for(tok, 3100 + scheme, T);
        kvs_put_result rg, ru;
        memset(&rg, 0, sizeof rg);
        memset(&ru, 0, sizeof ru);
        double p0 = metric_value(g, "kvstash_xfer_puts_total");
        if (put_block(g, &src, tok, 0, NULL, scheme, 0, &rg) != 0 || rg.already_present)
            die("validation: gRPC put (%s) failed or found the block present", sn);
        const unsigned char(*key)[KVS_CLIENT_KEY_LEN] =
            (const unsigned char(*)[KVS_CLIENT_KEY_LEN])rg.key;
        stored_acc sg = {0}, su = {0};
        int rc = kvs_client_get(g, &g_ns, key, 1, KVS_EGRESS_STORED, 0, -1, stored_cb, &sg, err);
        if (rc != 0)
            die("validation get (stored, %s): %s: %s", sn, kvs_strerror(rc), err);
        delete_blocks(g, key, 1);
        double p1 = metric_value(g, "kvstash_xfer_puts_total");
        if (put_block(u, &src, tok, 0, NULL, scheme, 1, &ru) != 0 || ru.already_present)
            die("validation: UCX put (%s) failed or found the deleted block present", sn);
        ucx_puts++;
        double p2 = metric_value(g, "kvstash_xfer_puts_total");
        if (p1 != p0 || p2 != p1 + 1)
            die("validation: kvstash_xfer_puts_total went %.0f -> %.0f (gRPC put) -> %.0f (one "
                "UCX put)",
                p0, p1, p2);
        if (memcmp(ru.key, rg.key, sizeof rg.key) != 0 || ru.stored_bytes != rg.stored_bytes ||
            rg.stored_bytes == 0)
            die("validation: UCX put (%s) answered another key or size (%llu bytes; gRPC %llu)", sn,
                ru.stored_bytes, rg.stored_bytes);
        rc = kvs_client_get(g, &g_ns, key, 1, KVS_EGRESS_STORED, 0, -1, stored_cb, &su, err);
        if (rc != 0)
            die("validation get (stored, %s, UCX put): %s: %s", sn, kvs_strerror(rc), err);
        if (sg.len == 0 || sg.len != su.len || memcmp(sg.buf, su.buf, sg.len) != 0)
            die("validation: a block put over UCX (%s) is stored differently from gRPC Put's "
                "(%zu / %zu bytes)",
                sn, su.len, sg.len);
        rc = kvs_client_get_into(g, &g_ns, key, 1, KVS_EGRESS_FP16, 0, -1, back.kd, back.vd, NULL,
                                 NULL, err);
        if (rc != 0)
            die("validation get (fp16, %s, UCX put): %s: %s", sn, kvs_strerror(rc), err);
        double e = rel_err(src.data, back.data, BLOCK_BYTES / 2);
        if (scheme == 1 && memcmp(src.data, back.data, BLOCK_BYTES) != 0)
            die("validation: a block put over UCX at fp16 came back different");
        if (scheme == 4 && !(e > 0 && e < 0.05))
            die("validation: int8 block put over UCX: relative error %.4f", e);
        memset(&ru, 0, sizeof ru);
        if (put_block(u, &src, tok, 0, NULL, scheme, 1, &ru) != 0 || !ru.already_present)
            die("validation: a second UCX put (%s) of a cached block did not answer "
                "already_present",
                sn);
        ucx_puts++;
        delete_blocks(g, key, 1);
        printf("validate: %s block put over UCX: key, size (%llu bytes) and stored bytes = gRPC "
               "Put's; get fp16: %s (relative error %.2e); put again: already_present\n",
               sn, rg.stored_bytes, scheme == 1 ? "bit-exact" : "close", e);
        free(sg.buf);
        free(su.buf);
    }
    kvs_client_xfer_stats st;
    memset(&st, 0, sizeof st);
    if (kvs_client_xfer_stats_get(u, &st) != 0 || st.fallbacks != 0 || !st.connected)
        die("validation: the %llu UCX puts did not stay on UCX (fallbacks %llu, ucx_status %d)",
            ucx_puts, st.fallbacks, st.ucx_status);
    double refused = metric_value(g, "kvstash_xfer_put_seal_refused_total");
    if (refused != 0)
        die("validation: kvstashd refused %.0f seals", refused);
    printf("validate: %llu UCX puts, 0 fallbacks, 0 seals refused\n", ucx_puts);
    free(src.data);
    free(back.data);
    kvs_client_close(g);
    kvs_client_close(u);
}

static double rel_err(const uint16_t *a, const uint16_t *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        /* fp16 -> double, normal numbers only (what fill_fp16 writes; the int8
         * round trip may give subnormals, close enough as 0 for an error). */
        uint16_t x = a[i], y = b[i];
        double fx = ((x >> 10 & 31) ? ldexp(1.0 + (x & 1023) / 1024.0, (x >> 10 & 31) - 15) : 0.0);
        double fy = ((y >> 10 & 31) ? ldexp(1.0 + (y & 1023) / 1024.0, (y >> 10 & 31) - 15) : 0.0);
        if (x & 0x8000)
            fx = -fx;
        if (y & 0x8000)
            fy = -fy;
        num += (fx - fy) * (fx - fy);
        den += fx * fx;
    }
    return den > 0 ? sqrt(num / den) : 0;
}

/* ---- timed phases ------------------------------------------------------------ */

/* CPU seconds (user + system, all threads) this process has used. */
static double self_cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* CPU seconds process pid has used (utime + stime of /proc/PID/stat, all its
 * threads, clock-tick resolution); -1 when it cannot be read. */
static double proc_cpu_s(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    unsigned long long ut = 0, st = 0;
    if (p == NULL ||
        sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* CPU seconds kvstashd has used; -1 when it cannot be read. */
static double kvs_cpu_s(void)
{
    return proc_cpu_s(g_kvs_pid);
}

typedef struct job {
    int kind; /* 0 lookup, 1 put, 2 get, 3 redis set, 4 redis get, 5 fetch stored over UCX,
               * 6 fetch fp16 over UCX (client decode) into the caller's buffers by its
               * callback, 7 kvs_client_fetch_into fp16 (decoded straight into them),
               * 8 put over UCX (kvs_client_put_ucx) */
    unsigned id, clients;
    double seconds;   /* lookup: run this long */
    unsigned nblocks; /* put/get: blocks per client */
    unsigned scheme;
    uint64_t salt;        /* put: mixed into the token ids (0: as before --put-only) */
    int warm;             /* put: one untimed put first, its key at keys[nblocks] */
    kvs_decode_at decode; /* get: who decodes */
    int redis_port;
    pthread_barrier_t *bar;
    /* results */
    double *lat;
    size_t nlat, cap;
    uint64_t ops, blocks, errors, fetched_bytes;
    uint64_t present, stored_bytes; /* put: answers already_present; stored bytes answered */
    double t0, t1;
    unsigned char (*keys)[KVS_CLIENT_KEY_LEN]; /* put output, get input */
} job;

static unsigned g_prompt[PROMPT_BLOCKS * T];
static int g_fetch_nocopy; /* SERVICE_BENCH_FETCH_NOCOPY */
/* --put-only sets these for the put phases run_phase starts next: job.salt and
 * job.warm (0 and 0 in the other modes). */
static uint64_t g_put_salt;
static int g_put_warm;

static void lat_add(job *j, double s)
{
    if (j->nlat == j->cap) {
        j->cap = j->cap ? 2 * j->cap : 4096;
        j->lat = realloc(j->lat, j->cap * sizeof *j->lat);
        if (j->lat == NULL)
            die("out of memory");
    }
    j->lat[j->nlat++] = s;
}

static void *run_job(void *arg)
{
    job *j = arg;
    kvs_client *c = j->kind <= 2   ? open_client_decode(j->decode)
                    : j->kind >= 5 ? open_client_ucx(j->decode)
                                   : NULL;
    redisContext *r = NULL;
    if (j->kind == 3 || j->kind == 4) {
        r = redisConnect("127.0.0.1", j->redis_port);
        if (r == NULL || r->err)
            die("redis connect failed");
    }
    block_buf b;
    block_init(&b, 100 + j->id);
    unsigned tok[T];
    char err[KVS_ERR_LEN] = "";
    void *kd[GET_BATCH * L], *vd[GET_BATCH * L];
    char *dst = NULL;
    if (j->kind == 2 || j->kind == 4 || j->kind == 6 || j->kind == 7) {
        dst = malloc((size_t)GET_BATCH * BLOCK_BYTES);
        if (dst == NULL)
            die("out of memory");
        for (unsigned i = 0; i < GET_BATCH * L; i++) {
            kd[i] = dst + (2 * i) * LAYER_BYTES;
            vd[i] = dst + (2 * i + 1) * LAYER_BYTES;
        }
    }
    int put = j->kind == 1 || j->kind == 8;
    if (put && j->warm) {
        /* Untimed: sets up the gRPC channel and (kind 8) the UCX session. */
        tokens_for(tok,
                   (j->salt << 48) ^ ((uint64_t)j->scheme << 40) ^ ((uint64_t)j->id << 20) ^
                       j->nblocks,
                   T);
        kvs_put_result res;
        memset(&res, 0, sizeof res);
        if (put_block(c, &b, tok, 0, NULL, j->scheme, j->kind == 8, &res) != 0)
            j->errors++;
        else if (res.already_present)
            j->present++;
        memcpy(j->keys[j->nblocks], res.key, KVS_CLIENT_KEY_LEN);
    }
    pthread_barrier_wait(j->bar);
    j->t0 = kvs_bench_now_s();
    if (j->kind == 0) {
        double end = j->t0 + j->seconds;
        while (kvs_bench_now_s() < end) {
            kvs_lookup_result *res = NULL;
            double t = kvs_bench_now_s();
            int rc = kvs_client_lookup(c, &g_ns, g_prompt, PROMPT_BLOCKS * T, 1, -1, &res, err);
            lat_add(j, kvs_bench_now_s() - t);
            if (rc != 0 || res->matched_blocks != PROMPT_BLOCKS)
                j->errors++;
            kvs_lookup_result_free(res);
            j->ops++;
        }
    } else if (put) {
        for (unsigned i = 0; i < j->nblocks; i++) {
            tokens_for(tok,
                       (j->salt << 48) ^ ((uint64_t)j->scheme << 40) ^ ((uint64_t)j->id << 20) ^ i,
                       T);
            kvs_put_result res;
            memset(&res, 0, sizeof res);
            double t = kvs_bench_now_s();
            int rc = put_block(c, &b, tok, 0, NULL, j->scheme, j->kind == 8, &res);
            lat_add(j, kvs_bench_now_s() - t);
            if (rc != 0) {
                j->errors++;
                continue;
            }
            memcpy(j->keys[i], res.key, KVS_CLIENT_KEY_LEN);
            j->present += res.already_present != 0;
            j->stored_bytes += res.stored_bytes;
            j->blocks++;
            j->ops++;
        }
        kvs_client_xfer_stats st;
        memset(&st, 0, sizeof st);
        if (j->kind == 8 &&
            (kvs_client_xfer_stats_get(c, &st) != 0 || st.fallbacks != 0 || !st.connected)) {
            fprintf(stderr, "service_bench: %llu UCX puts fell back to gRPC (ucx_status %d)\n",
                    st.fallbacks, st.ucx_status);
            j->errors++;
        }
    } else if (j->kind == 2) {
        for (unsigned i = 0; i + GET_BATCH <= j->nblocks; i += GET_BATCH) {
            double t = kvs_bench_now_s();
            int rc = kvs_client_get_into(
                c, &g_ns, (const unsigned char(*)[KVS_CLIENT_KEY_LEN])j->keys[i], GET_BATCH,
                KVS_EGRESS_FP16, 0, -1, kd, vd, NULL, NULL, err);
            lat_add(j, kvs_bench_now_s() - t);
            if (rc != 0) {
                if (j->errors++ == 0)
                    fprintf(stderr, "service_bench: get: %s: %s\n", kvs_strerror(rc), err);
                continue;
            }
            j->blocks += GET_BATCH;
            j->ops++;
        }
    } else if (j->kind == 7) {
        for (unsigned i = 0; i + GET_BATCH <= j->nblocks; i += GET_BATCH) {
            double t = kvs_bench_now_s();
            int rc = kvs_client_fetch_into(
                c, &g_ns, (const unsigned char(*)[KVS_CLIENT_KEY_LEN])j->keys[i], GET_BATCH,
                KVS_EGRESS_FP16, 0, -1, kd, vd, NULL, NULL, err);
            lat_add(j, kvs_bench_now_s() - t);
            if (rc != 0) {
                if (j->errors++ == 0)
                    fprintf(stderr, "service_bench: fetch_into: %s: %s\n", kvs_strerror(rc), err);
                continue;
            }
            j->blocks += GET_BATCH;
            j->ops++;
        }
        kvs_client_xfer_stats st;
        if (kvs_client_xfer_stats_get(c, &st) != 0 || st.fallbacks != 0) {
            fprintf(stderr, "service_bench: %llu fetches fell back to gRPC\n", st.fallbacks);
            j->errors++;
        }
    } else if (j->kind >= 5) {
        for (unsigned i = 0; i + GET_BATCH <= j->nblocks; i += GET_BATCH) {
            /* SERVICE_BENCH_FETCH_NOCOPY=1 (diagnostic): the fp16 row's callback
             * only counts, so the copy out of the library's decode buffer is
             * not timed (what decoding straight into the caller's buffers could
             * save). */
            fetch_sink f = {.dst = dst, .copy = j->kind == 6 && !g_fetch_nocopy};
            double t = kvs_bench_now_s();
            int rc = kvs_client_fetch(
                c, &g_ns, (const unsigned char(*)[KVS_CLIENT_KEY_LEN])j->keys[i], GET_BATCH,
                j->kind == 6 ? KVS_EGRESS_FP16 : KVS_EGRESS_STORED, 0, -1, fetch_cb, &f, err);
            lat_add(j, kvs_bench_now_s() - t);
            if (rc != 0 || f.bad || f.layers != (uint64_t)GET_BATCH * L) {
                if (j->errors++ == 0)
                    fprintf(stderr, "service_bench: fetch: %s: %s\n", kvs_strerror(rc), err);
                continue;
            }
            j->blocks += GET_BATCH;
            j->fetched_bytes += f.bytes;
            j->ops++;
        }
        kvs_client_xfer_stats st;
        if (kvs_client_xfer_stats_get(c, &st) != 0 || st.fallbacks != 0) {
            fprintf(stderr, "service_bench: %llu fetches fell back to gRPC\n", st.fallbacks);
            j->errors++;
        }
    } else if (j->kind == 3) {
        for (unsigned i = 0; i < j->nblocks; i++) {
            double t = kvs_bench_now_s();
            redisReply *rep =
                redisCommand(r, "SET blk:%u:%u %b", j->id, i, (const char *)b.data, BLOCK_BYTES);
            lat_add(j, kvs_bench_now_s() - t);
            if (rep == NULL || rep->type != REDIS_REPLY_STATUS)
                j->errors++;
            else
                j->blocks++, j->ops++;
            freeReplyObject(rep);
        }
    } else {
        for (unsigned i = 0; i + GET_BATCH <= j->nblocks; i += GET_BATCH) {
            double t = kvs_bench_now_s();
            for (unsigned k = 0; k < GET_BATCH; k++)
                redisAppendCommand(r, "GET blk:%u:%u", j->id, i + k);
            for (unsigned k = 0; k < GET_BATCH; k++) {
                void *rv = NULL;
                redisReply *rep = NULL;
                if (redisGetReply(r, &rv) == REDIS_OK)
                    rep = rv;
                if (rep == NULL || rep->type != REDIS_REPLY_STRING ||
                    rep->len != (long long)BLOCK_BYTES) {
                    j->errors++;
                } else {
                    /* into the worker's buffer, as get_into delivers it */
                    memcpy(dst + (size_t)k * BLOCK_BYTES, rep->str, BLOCK_BYTES);
                    j->blocks++;
                }
                freeReplyObject(rep);
            }
            lat_add(j, kvs_bench_now_s() - t);
            j->ops++;
        }
    }
    j->t1 = kvs_bench_now_s();
    free(dst);
    free(b.data);
    if (c)
        kvs_client_close(c);
    if (r)
        redisFree(r);
    return NULL;
}

typedef struct phase_result {
    double secs, ops_per_s, blocks_per_s, p50_ms, p99_ms, p999_ms, max_ms;
    uint64_t ops, blocks, errors, fetched_bytes, present, stored_bytes;
} phase_result;

static phase_result run_phase(int kind, unsigned clients, double seconds, unsigned nblocks,
                              unsigned scheme, kvs_decode_at decode, int redis_port,
                              unsigned char (*keys)[KVS_CLIENT_KEY_LEN])
{
    job *j = calloc(clients, sizeof *j);
    pthread_t *th = calloc(clients, sizeof *th);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, clients);
    for (unsigned i = 0; i < clients; i++) {
        j[i] = (job){.kind = kind,
                     .id = i,
                     .clients = clients,
                     .seconds = seconds,
                     .nblocks = nblocks,
                     .scheme = scheme,
                     .decode = decode,
                     .salt = g_put_salt,
                     .warm = g_put_warm,
                     .redis_port = redis_port,
                     .bar = &bar,
                     .keys = keys ? keys + (size_t)i * (nblocks + (g_put_warm != 0)) : NULL};
        if (pthread_create(&th[i], NULL, run_job, &j[i]) != 0)
            die("pthread_create");
    }
    for (unsigned i = 0; i < clients; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&bar);
    phase_result pr;
    memset(&pr, 0, sizeof pr);
    double t0 = j[0].t0, t1 = j[0].t1;
    size_t n = 0;
    for (unsigned i = 0; i < clients; i++) {
        t0 = j[i].t0 < t0 ? j[i].t0 : t0;
        t1 = j[i].t1 > t1 ? j[i].t1 : t1;
        n += j[i].nlat;
        pr.ops += j[i].ops;
        pr.blocks += j[i].blocks;
        pr.errors += j[i].errors;
        pr.fetched_bytes += j[i].fetched_bytes;
        pr.present += j[i].present;
        pr.stored_bytes += j[i].stored_bytes;
    }
    double *all = malloc((n ? n : 1) * sizeof *all);
    size_t k = 0;
    for (unsigned i = 0; i < clients; i++) {
        memcpy(all + k, j[i].lat, j[i].nlat * sizeof *all);
        k += j[i].nlat;
        free(j[i].lat);
    }
    qsort(all, n, sizeof *all, kvs_bench_cmp_double);
    pr.secs = t1 - t0;
    pr.ops_per_s = (double)pr.ops / pr.secs;
    pr.blocks_per_s = (double)pr.blocks / pr.secs;
    pr.p50_ms = n ? all[(n - 1) / 2] * 1e3 : 0;
    pr.p99_ms = n ? all[(size_t)ceil(0.99 * (double)n) - 1] * 1e3 : 0;
    pr.p999_ms = n ? all[(size_t)ceil(0.999 * (double)n) - 1] * 1e3 : 0;
    pr.max_ms = n ? all[n - 1] * 1e3 : 0;
    free(all);
    free(j);
    free(th);
    return pr;
}

/*
 * The same Lookup load driven the way load generators (ghz, wrk) drive N
 * concurrent clients: `clients` closed-loop clients, each keeping exactly one
 * Lookup outstanding, as kvs_client_lookup_async calls over one kvs_client
 * (one channel, one library completion thread) instead of one OS thread each.
 * A client's next Lookup is issued from the callback of its previous one;
 * latency runs from just before kvs_client_lookup_async to the callback, so
 * it includes the wait for the completion thread. Every call is counted.
 */
typedef struct async_run {
    kvs_client *c;
    double end;
    double *lat; /* written by the completion thread only */
    size_t nlat, cap;
    uint64_t ops, errors;
    double t1;
} async_run;

typedef struct async_slot {
    async_run *run;
    double t_issue;
} async_slot;

static void async_issue(async_slot *sl);

static void async_done(void *arg, int status, const kvs_lookup_result *res, const char *err)
{
    async_slot *sl = arg;
    async_run *r = sl->run;
    double now = kvs_bench_now_s();
    if (r->nlat == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 4096;
        r->lat = realloc(r->lat, r->cap * sizeof *r->lat);
        if (r->lat == NULL)
            die("out of memory");
    }
    r->lat[r->nlat++] = now - sl->t_issue;
    r->ops++;
    if (status != 0 || res == NULL || res->matched_blocks != PROMPT_BLOCKS) {
        if (r->errors++ == 0)
            fprintf(stderr, "service_bench: async lookup: %s: %s\n", kvs_strerror(status),
                    err ? err : "wrong match");
    }
    if (now < r->end)
        async_issue(sl);
    else if (now > r->t1)
        r->t1 = now;
}

static void async_issue(async_slot *sl)
{
    sl->t_issue = kvs_bench_now_s();
    int rc = kvs_client_lookup_async(sl->run->c, &g_ns, g_prompt, PROMPT_BLOCKS * T, 1, -1,
                                     async_done, sl);
    if (rc != 0)
        die("kvs_client_lookup_async: %s", kvs_strerror(rc));
}

static phase_result run_async_lookups(unsigned clients, double seconds)
{
    async_run r;
    memset(&r, 0, sizeof r);
    r.c = open_client();
    async_slot *sl = calloc(clients, sizeof *sl);
    if (sl == NULL)
        die("out of memory");
    /* One warm-up Lookup starts the completion thread outside the timing. */
    async_slot w = {.run = &r};
    r.end = 0;
    async_issue(&w);
    kvs_client_drain(r.c);
    if (r.errors)
        die("async warm-up lookup failed");
    r.nlat = 0;
    r.ops = 0;
    double t0 = kvs_bench_now_s();
    r.end = t0 + seconds;
    r.t1 = t0;
    for (unsigned i = 0; i < clients; i++) {
        sl[i].run = &r;
        async_issue(&sl[i]);
    }
    kvs_client_drain(r.c);
    kvs_client_close(r.c);
    phase_result pr;
    memset(&pr, 0, sizeof pr);
    qsort(r.lat, r.nlat, sizeof *r.lat, kvs_bench_cmp_double);
    pr.ops = r.ops;
    pr.errors = r.errors;
    pr.secs = r.t1 - t0;
    pr.ops_per_s = (double)pr.ops / pr.secs;
    pr.p50_ms = r.nlat ? r.lat[(r.nlat - 1) / 2] * 1e3 : 0;
    pr.p99_ms = r.nlat ? r.lat[(size_t)ceil(0.99 * (double)r.nlat) - 1] * 1e3 : 0;
    pr.p999_ms = r.nlat ? r.lat[(size_t)ceil(0.999 * (double)r.nlat) - 1] * 1e3 : 0;
    pr.max_ms = r.nlat ? r.lat[r.nlat - 1] * 1e3 : 0;
    free(r.lat);
    free(sl);
    return pr;
}

static void print_tput(const char *name, const phase_result *p)
{
    printf("%-34s %8.1f MB/s %10.0f KV tokens/s  p50 %7.2f ms  p99 %7.2f ms  (%llu blocks, "
           "%llu errors, %.2f s)\n",
           name, p->blocks_per_s * (double)BLOCK_BYTES / 1e6, p->blocks_per_s * T, p->p50_ms,
           p->p99_ms, (unsigned long long)p->blocks, (unsigned long long)p->errors, p->secs);
}

/*
 * --fetch-only: KV tokens/s restored through kvs_client_fetch over UCX with
 * the client's decode into fp16 buffers (what a worker gets), next to the
 * same fetch of the stored int8 tiles only (landed and verified, not decoded:
 * what xfer_bench's int8 tokens count), gRPC Get with the client's decode, and
 * Redis GET of the fp16 block (8 pipelined). 4 clients, each its own
 * kvs_client (its own UCX session), 8 blocks per call. Rows are timed in
 * rounds, the order reversed every other round (A B C D, D C B A, ...); rates
 * and per-round ratios are medians over the rounds.
 */
static void run_fetch_rows(int redis_port, int quick)
{
    const unsigned clients = 4, nblocks = quick ? 16 : 48;
    const int rounds = quick ? 2 : 6;
    unsigned char(*keys8)[KVS_CLIENT_KEY_LEN] =
        calloc((size_t)clients * nblocks, KVS_CLIENT_KEY_LEN);
    phase_result put8 = run_phase(1, clients, 0, nblocks, 4, 0, 0, keys8);
    print_tput("put int8 (quantized), 4 clients", &put8);
    phase_result rset = run_phase(3, clients, 0, nblocks, 0, 0, redis_port, NULL);
    print_tput("redis SET, 4 connections", &rset);
    if (put8.errors || rset.errors)
        die("errors during the puts");
    enum { NR = 5, RD = 4 }; /* rows; RD: Redis, the baseline */
    struct {
        const char *name;
        int kind;
        kvs_decode_at decode;
        double rate[16], cpu_client, cpu_server, blocks, bytes;
        uint64_t errors;
    } row[NR] = {
        {"fetch int8 stored over UCX, no decode", 5, KVS_DECODE_AUTO, {0}, 0, 0, 0, 0, 0},
        {"fetch fp16 from int8 over UCX, decode", 6, KVS_DECODE_AUTO, {0}, 0, 0, 0, 0, 0},
        {"fetch_into fp16 from int8 over UCX", 7, KVS_DECODE_AUTO, {0}, 0, 0, 0, 0, 0},
        {"get fp16 from int8 gRPC, client decode", 2, KVS_DECODE_CLIENT, {0}, 0, 0, 0, 0, 0},
        {"redis GET fp16 x8 pipelined, 4 conns", 4, KVS_DECODE_AUTO, {0}, 0, 0, 0, 0, 0}};
    for (int r = 0; r < RD; r++) /* untimed: the first pass of each runs slower */
        if (run_phase(row[r].kind, clients, 0, nblocks, 0, row[r].decode, redis_port, keys8).errors)
            die("errors during the warm-up of %s", row[r].name);
    for (int k = 0; k < rounds; k++)
        for (int i = 0; i < NR; i++) {
            int r = k % 2 ? NR - 1 - i : i;
            double cc0 = self_cpu_s(), sc0 = kvs_cpu_s();
            phase_result p = run_phase(row[r].kind, clients, 0, nblocks, 0, row[r].decode,
                                       redis_port, row[r].kind == 4 ? NULL : keys8);
            row[r].cpu_client += self_cpu_s() - cc0;
            row[r].cpu_server += kvs_cpu_s() - sc0;
            print_tput(row[r].name, &p);
            row[r].rate[k] = p.blocks_per_s * T;
            row[r].blocks += (double)p.blocks;
            row[r].bytes += (double)p.fetched_bytes;
            row[r].errors += p.errors;
        }
    free(keys8);
    for (int r = 0; r < NR; r++)
        if (row[r].errors)
            die("errors during %s", row[r].name);
    double ratio[NR][16], med[NR], medr[NR], dvs[16], ivs[16];
    for (int k = 0; k < rounds; k++) {
        for (int r = 0; r < NR; r++)
            ratio[r][k] = row[r].rate[k] / row[RD].rate[k];
        dvs[k] = row[1].rate[k] / row[0].rate[k];
        ivs[k] = row[2].rate[k] / row[1].rate[k];
    }
    for (int r = 0; r < NR; r++) {
        double tmp[16];
        memcpy(tmp, row[r].rate, sizeof tmp);
        med[r] = kvs_bench_median(tmp, rounds);
        medr[r] = kvs_bench_median(ratio[r], rounds);
        printf("median of %d rounds: %-40s %10.0f KV tokens/s (%.2f x redis GET)  cpu ms per "
               "block client %.2f kvstashd %.2f\n",
               rounds, row[r].name, med[r], medr[r], row[r].cpu_client / row[r].blocks * 1e3,
               r == RD ? 0.0 : row[r].cpu_server / row[r].blocks * 1e3);
    }
    printf("fetch: %.0f stored bytes per int8 block over UCX (fp16 block %zu); fetch+decode / "
           "stored-only %.2f, fetch_into / fetch+decode %.2f (medians of per-round ratios)\n",
           row[0].bytes / row[0].blocks, (size_t)BLOCK_BYTES, kvs_bench_median(dvs, rounds),
           kvs_bench_median(ivs, rounds));
    printf("RESULT fetch_stored_tokens_per_s=%.0f fetch_fp16_tokens_per_s=%.0f "
           "fetch_into_tokens_per_s=%.0f get_fp16_tokens_per_s=%.0f redis_tokens_per_s=%.0f "
           "fetch_fp16_vs_redis=%.2f fetch_into_vs_redis=%.2f fetch_stored_vs_redis=%.2f "
           "decode_vs_stored=%.2f into_vs_fetch=%.2f\n",
           med[0], med[1], med[2], med[3], med[RD], medr[1], medr[2], medr[0],
           kvs_bench_median(dvs, rounds), kvs_bench_median(ivs, rounds));
}

/*
 * --put-only: KV tokens/s put by 4 clients (each its own kvs_client and, over
 * UCX, its own session) over gRPC Put and over UCX, stored at fp16 and int8,
 * next to Redis SET of the same fp16 bytes (4 connections). One untimed pass
 * of each row, then rounds with the row order reversed every other round.
 * Every phase puts blocks no earlier phase put (the salt) and they are
 * deleted after it, untimed (Redis: FLUSHDB), so the store is as empty at the
 * start of each phase and every put stores. After each phase: no errors, no
 * already_present, and for a UCX row no fallback and kvstash_xfer_puts_total
 * up by exactly the puts made (the timed ones and each client's warm-up).
 */
static void run_put_rows(int redis_port, int quick)
{
    const unsigned clients = 4, nblocks = quick ? 16 : 48;
    const int rounds = quick ? 2 : 6;
    const size_t nkeys = (size_t)clients * (nblocks + 1);
    kvs_client *mc = open_client(); /* Stats and Delete */
    unsigned char(*keys)[KVS_CLIENT_KEY_LEN] = calloc(nkeys, KVS_CLIENT_KEY_LEN);
    redisContext *rc = redisConnect("127.0.0.1", redis_port);
    if (keys == NULL || rc == NULL || rc->err)
        die("out of memory, or redis connect failed");
    enum { NR = 5, RD = 4 }; /* rows; RD: Redis, the baseline */
    struct {
        const char *name;
        int kind;
        unsigned scheme;
        double rate[16], cpu_client, cpu_server, cpu_xferd, blocks, stored;
    } row[NR] = {{"put fp16 over UCX (sealed)", 8, 1, {0}, 0, 0, 0, 0, 0},
                 {"put fp16 gRPC", 1, 1, {0}, 0, 0, 0, 0, 0},
                 {"put int8 over UCX (sealed)", 8, 4, {0}, 0, 0, 0, 0, 0},
                 {"put int8 gRPC", 1, 4, {0}, 0, 0, 0, 0, 0},
                 {"redis SET fp16, 4 connections", 3, 0, {0}, 0, 0, 0, 0, 0}};
    g_put_warm = 1;
    int xferd_seen = 1;
    for (int k = -1; k < rounds; k++) /* k = -1: untimed, the first pass of each row */
        for (int i = 0; i < NR; i++) {
            int r = k % 2 ? NR - 1 - i : i;
            int ucx = row[r].kind == 8;
            g_put_salt = (uint64_t)(k + 2) * NR + (uint64_t)r + 1;
            pid_t xpid = (pid_t)metric_value(mc, "kvstash_xfer_proc_pid");
            double p0 = metric_value(mc, "kvstash_xfer_puts_total");
            double cc0 = self_cpu_s(), sc0 = kvs_cpu_s(), xc0 = xpid > 0 ? proc_cpu_s(xpid) : -1;
            phase_result p = run_phase(row[r].kind, clients, 0, nblocks, row[r].scheme,
                                       KVS_DECODE_AUTO, redis_port, row[r].kind == 3 ? NULL : keys);
            double cc = self_cpu_s() - cc0, sc = kvs_cpu_s() - sc0;
            double xc = xc0 >= 0 ? proc_cpu_s(xpid) - xc0 : -1;
            double p1 = metric_value(mc, "kvstash_xfer_puts_total");
            double made = ucx ? (double)p.blocks + clients : 0;
            printf("%s", k < 0 ? "untimed: " : "");
            print_tput(row[r].name, &p);
            if (p.errors || p.present || p.blocks != (uint64_t)clients * nblocks)
                die("%s: %llu errors, %llu puts found their block present, %llu of %u blocks",
                    row[r].name, (unsigned long long)p.errors, (unsigned long long)p.present,
                    (unsigned long long)p.blocks, clients * nblocks);
            if (p1 - p0 != made)
                die("%s: kvstash_xfer_puts_total grew by %.0f, %.0f UCX puts were made",
                    row[r].name, p1 - p0, made);
            if (row[r].kind == 3) {
                redisReply *rep = redisCommand(rc, "FLUSHDB");
                if (rep == NULL || rep->type != REDIS_REPLY_STATUS)
                    die("redis FLUSHDB failed");
                freeReplyObject(rep);
            } else {
                delete_blocks(mc, (const unsigned char(*)[KVS_CLIENT_KEY_LEN])keys, nkeys);
            }
            if (k < 0)
                continue;
            row[r].rate[k] = p.blocks_per_s * T;
            row[r].cpu_client += cc;
            row[r].cpu_server += sc;
            if (xc >= 0)
                row[r].cpu_xferd += xc;
            else
                xferd_seen = 0;
            row[r].blocks += (double)p.blocks;
            row[r].stored += (double)p.stored_bytes;
        }
    g_put_warm = 0;
    g_put_salt = 0;
    double refused = metric_value(mc, "kvstash_xfer_put_seal_refused_total");
    double restarts = metric_value(mc, "kvstash_xfer_proc_restarts_total");
    redisFree(rc);
    free(keys);
    kvs_client_close(mc);
    if (refused != 0 || restarts != 0)
        die("kvstashd refused %.0f seals and restarted its data plane %.0f times", refused,
            restarts);
    double med[NR], medr[NR], ratio[NR][16], vg[2][16];
    for (int k = 0; k < rounds; k++) {
        for (int r = 0; r < NR; r++)
            ratio[r][k] = row[r].rate[k] / row[RD].rate[k];
        vg[0][k] = row[0].rate[k] / row[1].rate[k]; /* fp16: UCX / gRPC */
        vg[1][k] = row[2].rate[k] / row[3].rate[k]; /* int8 */
    }
    for (int r = 0; r < NR; r++) {
        double tmp[16];
        memcpy(tmp, row[r].rate, sizeof tmp);
        med[r] = kvs_bench_median(tmp, rounds);
        medr[r] = kvs_bench_median(ratio[r], rounds);
        printf("median of %d rounds: %-30s %10.0f KV tokens/s %7.1f MB/s (%.2f x redis SET)  cpu "
               "ms per block client %.2f kvstashd %.2f kvstash-xferd %.2f",
               rounds, row[r].name, med[r], med[r] / T * (double)BLOCK_BYTES / 1e6, medr[r],
               row[r].cpu_client / row[r].blocks * 1e3,
               r == RD ? 0.0 : row[r].cpu_server / row[r].blocks * 1e3,
               r == RD || !xferd_seen ? 0.0 : row[r].cpu_xferd / row[r].blocks * 1e3);
        if (r != RD)
            printf("  stored %.0f bytes per block", row[r].stored / row[r].blocks);
        printf("\n");
    }
    printf("(cpu per block counts each client's open, Connect and warm-up put: 1 put in %u)\n",
           nblocks + 1);
    double vg16 = kvs_bench_median(vg[0], rounds), vg8 = kvs_bench_median(vg[1], rounds);
    printf("fp16: put_ucx_tokens_per_s=%.0f put_grpc_tokens_per_s=%.0f redis_set_tokens_per_s=%.0f "
           "ucx_vs_grpc=%.2f ucx_vs_redis=%.2f\n",
           med[0], med[1], med[RD], vg16, medr[0]);
    printf(
        "RESULT put_ucx_tokens_per_s=%.0f put_grpc_tokens_per_s=%.0f redis_set_tokens_per_s=%.0f "
        "ucx_vs_grpc=%.2f ucx_vs_redis=%.2f\n",
        med[2], med[3], med[RD], vg8, medr[2]);
}

int main(int argc, char **argv)
{
    int quick = 0, lookup_only = 0, get_only = 0, fetch_only = 0, put_only = 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0)
            quick = 1;
        else if (strcmp(argv[i], "--lookup-only") == 0)
            lookup_only = 1;
        else if (strcmp(argv[i], "--get-only") == 0)
            get_only = 1;
        else if (strcmp(argv[i], "--fetch-only") == 0)
            fetch_only = 1;
        else if (strcmp(argv[i], "--put-only") == 0)
            put_only = 1;
        else
            argc = 0;
    }
    if (argc < 2 || lookup_only + get_only + fetch_only + put_only > 1) {
        fprintf(stderr, "usage: service_bench /path/to/kvstashd [--quick] "
                        "[--lookup-only | --get-only | --fetch-only | --put-only]\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    int port = start_kvstashd(argv[1]);
    int redis_port = start_redis();
    snprintf(g_target, sizeof g_target, "127.0.0.1:%d", port);
    printf("service_bench: kvstashd on %s, redis-server on 127.0.0.1:%d; block %u tokens x %u "
           "layers x %u kv heads x %u dims fp16 = %zu bytes\n",
           g_target, redis_port, T, L, H, D, (size_t)BLOCK_BYTES);
    validate(redis_port);
    if (fetch_only) {
        g_fetch_nocopy = getenv("SERVICE_BENCH_FETCH_NOCOPY") != NULL &&
                         atoi(getenv("SERVICE_BENCH_FETCH_NOCOPY")) != 0;
        if (g_fetch_nocopy)
            printf("SERVICE_BENCH_FETCH_NOCOPY: the fp16 fetch row does not copy the decoded "
                   "layers (diagnostic)\n");
        validate_fetch();
        run_fetch_rows(redis_port, quick);
        stop_children();
        return 0;
    }
    if (put_only) {
        validate_put();
        run_put_rows(redis_port, quick);
        stop_children();
        return 0;
    }
    double lookup_p99_16 = 0, lookup_p99_16_threads = 0;
    if (get_only)
        goto throughput;

    /* Preload the 8-block prompt every Lookup asks for. */
    kvs_client *c = open_client();
    tokens_for(g_prompt, 4242, PROMPT_BLOCKS * T);
    block_buf pb;
    block_init(&pb, 77);
    unsigned char parent[KVS_CLIENT_KEY_LEN];
    for (unsigned i = 0; i < PROMPT_BLOCKS; i++) {
        kvs_put_result res;
        memset(&res, 0, sizeof res);
        if (put_block(c, &pb, g_prompt + (size_t)i * T, i, i ? parent : NULL, 4, 0, &res) != 0)
            die("preload failed");
        memcpy(parent, res.key, sizeof parent);
    }
    free(pb.data);
    kvs_lookup_result *lr = NULL;
    char err[KVS_ERR_LEN] = "";
    if (kvs_client_lookup(c, &g_ns, g_prompt, PROMPT_BLOCKS * T, 1, -1, &lr, err) != 0 ||
        lr->matched_blocks != PROMPT_BLOCKS)
        die("validation: Lookup of the preloaded prompt does not match %u blocks", PROMPT_BLOCKS);
    kvs_lookup_result_free(lr);
    kvs_client_close(c);
    printf("validate: Lookup of the preloaded %u-block prompt matches all of it\n", PROMPT_BLOCKS);

    /* Thread mode: each client an OS thread making blocking calls. Async
     * mode: each client one outstanding kvs_client_lookup_async call, all of
     * them on one channel and one completion thread (run_async_lookups). The
     * RESULT line reports async mode at 16 clients (docs/BENCHMARKS.md says
     * why); both are printed. */
    static const unsigned conc[] = {1, 4, 16, 4, 16};
    for (unsigned i = 0; i < 5; i++) {
        int async = i >= 3;
        double cc0 = self_cpu_s(), sc0 = kvs_cpu_s();
        double secs = quick ? 1.0 : 4.0;
        phase_result p = async ? run_async_lookups(conc[i], secs)
                               : run_phase(0, conc[i], secs, 0, 0, 0, 0, NULL);
        double cc = self_cpu_s() - cc0, sc = kvs_cpu_s() - sc0;
        double nops = p.ops ? (double)p.ops : 1;
        /* CPU per Lookup, both sides: what bounds the throughput of a closed
         * loop on a small machine, and is less disturbed by other load than
         * latency is. */
        printf("lookup  %2u clients %-7s %8.0f ops/s  p50 %6.3f ms  p99 %6.3f ms  (%llu ops, "
               "%llu errors)  cpu/op client %.1f us server %.1f us  p99.9 %.3f max %.3f ms\n",
               conc[i], async ? "async:" : "thread:", p.ops_per_s, p.p50_ms, p.p99_ms,
               (unsigned long long)p.ops, (unsigned long long)p.errors, cc / nops * 1e6,
               sc0 < 0 ? -1.0 : sc / nops * 1e6, p.p999_ms, p.max_ms);
        if (p.errors)
            die("lookup errors");
        if (conc[i] == 16 && async)
            lookup_p99_16 = p.p99_ms;
        else if (conc[i] == 16)
            lookup_p99_16_threads = p.p99_ms;
    }
    printf("lookup p99 at 16 clients: async %.3f ms, threads %.3f ms (RESULT: async)\n",
           lookup_p99_16, lookup_p99_16_threads);
    if (lookup_only) {
        stop_children();
        printf("RESULT lookup_p99_ms_16=%.3f\n", lookup_p99_16);
        return 0;
    }

throughput:;
    const unsigned clients = 4, nblocks = quick ? 16 : 48;
    unsigned char(*keys)[KVS_CLIENT_KEY_LEN] =
        calloc((size_t)clients * nblocks, KVS_CLIENT_KEY_LEN);
    unsigned char(*keys8)[KVS_CLIENT_KEY_LEN] =
        calloc((size_t)clients * nblocks, KVS_CLIENT_KEY_LEN);
    phase_result put16 = run_phase(1, clients, 0, nblocks, 1, 0, 0, keys);
    print_tput("put fp16 (stored as is), 4 clients", &put16);
    phase_result put8 = run_phase(1, clients, 0, nblocks, 4, 0, 0, keys8);
    print_tput("put int8 (quantized), 4 clients", &put8);
    /* Get rows. The first Get phase after the puts runs slower, whichever it
     * is (measured with the rows in the reverse order: docs/BENCHMARKS.md,
     * "Get with client-side decode"), so one untimed pass each way comes
     * first; then each pair of rows is timed A B B A and a row's rate is its
     * two phases together. */
    for (int w = 0; w < 2; w++) {
        phase_result p = run_phase(2, clients, 0, nblocks, 0,
                                   w ? KVS_DECODE_CLIENT : KVS_DECODE_SERVER, 0, keys8);
        if (p.errors)
            die("errors during the warm-up Get");
    }
    struct {
        const char *name;
        unsigned char (*keys)[KVS_CLIENT_KEY_LEN];
        kvs_decode_at decode;
        double blocks, secs, cpu_client, cpu_server;
        uint64_t errors;
    } gr[4] = {{"get fp16 from int8, client decodes", keys8, KVS_DECODE_CLIENT, 0, 0, 0, 0, 0},
               {"get fp16 from int8, server renders", keys8, KVS_DECODE_SERVER, 0, 0, 0, 0, 0},
               {"get fp16 from fp16, client decodes", keys, KVS_DECODE_CLIENT, 0, 0, 0, 0, 0},
               {"get fp16 from fp16, server renders", keys, KVS_DECODE_SERVER, 0, 0, 0, 0, 0}};
    static const int order[8] = {0, 1, 1, 0, 2, 3, 3, 2};
    for (int i = 0; i < 8; i++) {
        int r = order[i];
        double cc0 = self_cpu_s(), sc0 = kvs_cpu_s();
        phase_result p = run_phase(2, clients, 0, nblocks, 0, gr[r].decode, 0, gr[r].keys);
        gr[r].cpu_client += self_cpu_s() - cc0;
        gr[r].cpu_server += kvs_cpu_s() - sc0;
        print_tput(gr[r].name, &p);
        gr[r].blocks += (double)p.blocks;
        gr[r].secs += p.secs;
        gr[r].errors += p.errors;
    }
    phase_result rset = run_phase(3, clients, 0, nblocks, 0, 0, redis_port, NULL);
    print_tput("redis SET, 4 connections", &rset);
    phase_result rget = run_phase(4, clients, 0, nblocks, 0, 0, redis_port, NULL);
    print_tput("redis GET x8 pipelined, 4 conns", &rget);
    free(keys);
    free(keys8);
    if (put16.errors || put8.errors || gr[0].errors || gr[1].errors || gr[2].errors ||
        gr[3].errors || rset.errors || rget.errors)
        die("errors during the throughput phases");
    double rg = rget.blocks_per_s, rate[4];
    for (int r = 0; r < 4; r++)
        rate[r] = gr[r].blocks / gr[r].secs;
    printf("ratios to redis GET (A B B A pairs): get fp16 from int8: client decodes %.2f, server "
           "renders %.2f; from fp16: client decodes %.2f, server renders %.2f; put fp16 / redis "
           "SET = %.2f\n",
           rate[0] / rg, rate[1] / rg, rate[2] / rg, rate[3] / rg,
           put16.blocks_per_s / rset.blocks_per_s);
    /* CPU per block on each side (the bench process is the 4 clients; the
     * server's figure is kvstashd's, at clock-tick resolution): the server's
     * CPU is what many workers share. */
    printf("cpu ms per block, client / server:");
    for (int r = 0; r < 4; r++)
        printf("%s %s %.2f / %.2f", r ? ";" : "", gr[r].name + 4,
               gr[r].cpu_client / gr[r].blocks * 1e3, gr[r].cpu_server / gr[r].blocks * 1e3);
    printf("\n");
    stop_children();
    /* get_tokens_per_s: the default scheme (int8) restored into fp16 buffers
     * with the client's default decode (kvs_decode_at auto: the client). */
    printf("RESULT lookup_p99_ms_16=%.3f get_tokens_per_s=%.0f redis_tokens_per_s=%.0f "
           "get_ratio=%.2f get_fp16_stored_ratio=%.2f\n",
           lookup_p99_16, rate[0] * T, rg * T, rate[0] / rg, rate[2] / rg);
    return 0;
}
