/*
 * test_xproc_chaos.c — the isolated data plane (opts.isolate, transfer/xproc.c)
 * under fire: its kvstash-xferd child is SIGKILLed at random moments while
 * client threads fetch and put, sessions are closed under them and the
 * counters are read, and what must hold whatever happens is checked at the
 * end:
 *   - nothing hangs (every fetch and put ends within its client's timeout,
 *     destroy returns);
 *   - the store's books balance: every provide released exactly once, every
 *     successful put_begin ended exactly once, every opened session ended
 *     (session_end) exactly once, and no callback saw session data after its
 *     session ended;
 *   - a fetch or block that reports success has the stored bytes, a put the
 *     store accepted has the client's bytes (the store ends a put of even
 *     length on a thread of its own, put_end_async, and one of odd length
 *     at once);
 *   - the counters never go backwards, and proc_restarts counts the kills.
 * Then the regressions, each a race made deterministic (see the cases).
 *
 * Every check in a thread is a counter (CUnit is not thread-safe); the main
 * thread asserts on them. KVS_CHAOS_SECS (default 16) sets the run's length,
 * KVS_CHAOS_SEED its random seed (printed). The store, the waiter and the
 * blocks are tests/support/kvs_xfer_fixture.h (shared with test_xfer).
 */
#include "kv_block.h"
#include "kvs_error.h"
#include "kvs_test.h"
#include "kvs_xfer_fixture.h"
#include "xfer.h"
#include "xproc.h" /* kvs__xp_send's bound (send_bounded) */

#include <cap-ng.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NBLK      8  /* blocks 0..3 in opts.shared, 4..7 on the heap (bounce) */
#define FMT_RAW   1u /* the same bytes in 4 chunks (store bounds), provided inline */
#define FMT_ASYNC 2u /* as FMT_RAW, provided by a thread of its own (provide_async) */
#define FMT_PUT   7u
#define SD_MAGIC  0x5e55107du
#define MAX_SD    4096

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---- session data: the store checks it is alive in every callback ------------------- */

typedef struct sdata {
    uint32_t magic;
    atomic_int opened;     /* session_open returned 0 with it */
    atomic_int ends;       /* session_end calls naming it */
    atomic_int close_done; /* the test's session_close for it has returned */
    atomic_int used_after; /* a callback named it after it ended / was closed */
} sdata;

static struct {
    pthread_mutex_t mu;
    sdata *sd[MAX_SD];
    int n;
} g_sds = {.mu = PTHREAD_MUTEX_INITIALIZER};

static sdata *sd_new(void)
{
    sdata *d = calloc(1, sizeof *d);
    d->magic = SD_MAGIC;
    pthread_mutex_lock(&g_sds.mu);
    if (g_sds.n < MAX_SD)
        g_sds.sd[g_sds.n++] = d;
    else
        d = NULL;
    pthread_mutex_unlock(&g_sds.mu);
    return d;
}

/* Every session data of the test: opened ones ended exactly once, none named after its
 * end; then freed. */
static void sd_check_all(void)
{
    int bad_ends = 0, used_after = 0, opened = 0;
    pthread_mutex_lock(&g_sds.mu);
    for (int i = 0; i < g_sds.n; i++) {
        sdata *d = g_sds.sd[i];
        int want = atomic_load(&d->opened) ? 1 : 0;
        opened += want;
        if (atomic_load(&d->ends) != want) {
            if (bad_ends < 5)
                printf("\n    session data %d: opened %d, session_end called %d times", i, want,
                       atomic_load(&d->ends));
            bad_ends++;
        }
        used_after += atomic_load(&d->used_after);
        free(d);
    }
    g_sds.n = 0;
    pthread_mutex_unlock(&g_sds.mu);
    printf("\n    sessions opened %d, wrong session_end counts %d, used after end %d", opened,
           bad_ends, used_after);
    CU_ASSERT_EQUAL(bad_ends, 0);
    CU_ASSERT_EQUAL(used_after, 0);
}

/* ---- the store (kvs_xfer_fixture.h) and what only this test's store does ------------- */

static kvs_fx_store g_store = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* Under g_store.mu but in_slow (atomic). */
static struct {
    long session_ends;
    long bad_puts; /* put_end status 0 with bytes not the client's */
    int slow_ms;   /* provide of key slow_key sleeps this long */
    /* hold_begins: put_begin_async keeps every begin (its handle, key and
     * length) until the test answers it (begins_answer); else declined */
    int hold_begins;
    unsigned nheld;
    void *held[2048];
    uint8_t held_key[2048][KVS_XFER_KEY_LEN];
    uint64_t held_len[2048];
    uint8_t slow_key[KVS_XFER_KEY_LEN];
    atomic_int in_slow; /* a slow provide is sleeping */
} g_st;

static void sd_use(void *sd)
{
    sdata *d = sd;
    if (!d || d->magic != SD_MAGIC)
        abort(); /* not session data of ours: the parent handed a wrong pointer */
    if (atomic_load(&d->ends) || atomic_load(&d->close_done))
        atomic_fetch_add(&d->used_after, 1);
}

/* The fixture's provide, after the session data's check and the slow key's
 * sleep. */
static int st_provide(void *ctx, void *sd, const uint8_t *key, uint32_t fmt, const uint8_t *nonce,
                      kvs_xfer_block_src *src)
{
    if (sd)
        sd_use(sd);
    pthread_mutex_lock(&g_store.mu);
    int slow = g_st.slow_ms && memcmp(key, g_st.slow_key, KVS_XFER_KEY_LEN) == 0 ? g_st.slow_ms : 0;
    pthread_mutex_unlock(&g_store.mu);
    if (slow) {
        atomic_store(&g_st.in_slow, 1);
        usleep((useconds_t)slow * 1000u);
        if (sd)
            sd_use(sd); /* still ours after the sleep? */
        atomic_store(&g_st.in_slow, 0);
    }
    return kvs_fx_provide(ctx, sd, key, fmt, nonce, src);
}

/* FMT_ASYNC only, provided 1 to 4 ms later by a thread of its own. */
static int st_provide_async(void *ctx, void *sd, const uint8_t *key, uint32_t fmt,
                            const uint8_t *nonce, void *handle)
{
    sd_use(sd);
    if (fmt != FMT_ASYNC)
        return 1;
    return kvs_fx_provide_later(ctx, st_provide, key, fmt, nonce, handle,
                                1000u + (unsigned)(key[0] % 4) * 1000u);
}

/* A put's key carries what the client sent: the pattern seed (bytes 0..7) and
 * the length (8..15). */
static uint8_t pat(uint64_t seed, uint64_t i)
{
    uint64_t x = (seed + i / 8) * 0x9E3779B97F4A7C15ull;
    return (uint8_t)(x >> (8 * (i % 8)));
}

static int st_put_begin(void *ctx, void *sd, const uint8_t *key, uint32_t fmt, const void *meta,
                        size_t meta_len, uint64_t len, void **buf, void **ref,
                        kvs_xfer_put_reply *reply)
{
    (void)meta, (void)meta_len, (void)reply;
    sd_use(sd);
    if (fmt != FMT_PUT || len > (4u << 20))
        return KVS_EINVAL;
    return kvs_fx_put_begin(ctx, key, len, buf, ref);
}

static int st_put_begin_async(void *ctx, void *sd, const uint8_t *key, uint32_t fmt,
                              const void *meta, size_t meta_len, uint64_t len, void *handle)
{
    (void)ctx, (void)meta, (void)meta_len;
    sd_use(sd);
    if (fmt != FMT_PUT || len > (4u << 20))
        return KVS_EINVAL;
    int rc = 1;
    pthread_mutex_lock(&g_store.mu);
    if (g_st.hold_begins && g_st.nheld < 2048) {
        memcpy(g_st.held_key[g_st.nheld], key, KVS_XFER_KEY_LEN);
        g_st.held_len[g_st.nheld] = len;
        g_st.held[g_st.nheld++] = handle;
        rc = 0;
    }
    pthread_mutex_unlock(&g_store.mu);
    return rc;
}

/* Begins every held put (a buffer each) and hands it to srv; how many. */
static unsigned begins_answer(kvs_xfer_server *srv)
{
    pthread_mutex_lock(&g_store.mu);
    unsigned n = g_st.nheld;
    g_st.nheld = 0;
    pthread_mutex_unlock(&g_store.mu);
    for (unsigned i = 0; i < n; i++) {
        void *buf = NULL, *ref = NULL;
        int rc = kvs_fx_put_begin(&g_store, g_st.held_key[i], g_st.held_len[i], &buf, &ref);
        kvs_xfer_server_put_begun(srv, g_st.held[i], rc, buf, ref, NULL);
    }
    return n;
}

static int st_put_end(void *ctx, void *ref, int status, kvs_xfer_put_reply *reply)
{
    kvs_fx_put *p = ref;
    uint64_t seed;
    memcpy(&seed, p->key, 8);
    int bad = 0;
    if (status == 0)
        for (uint64_t i = 0; i < p->len && !bad; i++)
            bad = p->buf[i] != pat(seed, i);
    pthread_mutex_lock(&g_store.mu);
    g_st.bad_puts += bad;
    pthread_mutex_unlock(&g_store.mu);
    if (status == 0 && !bad)
        reply->stored_bytes = p->len;
    return kvs_fx_put_end(ctx, p, bad ? KVS_EFORMAT : status);
}

/* put_end_async: a put of even length is ended 1 to 4 ms later by a thread
 * of its own (kvs_xfer_server_put_done to the server it was begun on), one
 * of odd length is declined (put_end runs on the parent's reader). */
typedef struct put_later {
    kvs_xfer_server *srv;
    void *ref, *handle;
    unsigned delay_us;
} put_later;

static void *put_later_main(void *arg)
{
    put_later *j = arg;
    usleep(j->delay_us);
    kvs_xfer_put_reply reply;
    memset(&reply, 0, sizeof reply);
    int rc = st_put_end(&g_store, j->ref, 0, &reply);
    kvs_xfer_server_put_done(j->srv, j->handle, rc, &reply);
    free(j);
    return NULL;
}

static int st_put_end_async(void *ctx, void *ref, void *handle)
{
    kvs_fx_store *s = ctx;
    kvs_fx_put *p = ref;
    if (p->len % 2)
        return 1;
    put_later *j = calloc(1, sizeof *j);
    if (!j)
        return 1;
    *j = (put_later){.srv = s->srv,
                     .ref = ref,
                     .handle = handle,
                     .delay_us = 1000u + (unsigned)(p->key[0] % 4) * 1000u};
    pthread_t t;
    if (pthread_create(&t, NULL, put_later_main, j) != 0) {
        free(j);
        return 1;
    }
    pthread_detach(t);
    return 0;
}

static void st_session_end(void *ctx, void *sd)
{
    (void)ctx;
    sdata *d = sd;
    if (!d || d->magic != SD_MAGIC)
        abort();
    atomic_fetch_add(&d->ends, 1);
    pthread_mutex_lock(&g_store.mu);
    g_st.session_ends++;
    pthread_mutex_unlock(&g_store.mu);
}

/* The blocks: 0..3 in a memfd given as opts.shared (sent in place), 4..7 on
 * the heap (copied through bounce memory). */
static struct {
    int fd;
    uint8_t *base;
    uint64_t len;
} g_shm = {.fd = -1};

static void store_setup(void)
{
    uint64_t len[NBLK];
    uint8_t *tmp[NBLK];
    uint64_t region = 0;
    for (unsigned i = 0; i < NBLK; i++) {
        tmp[i] = kvs_fx_block_new(4, 2 + i % 3, 32 + 16 * (i % 2), 0, 100 + i, &len[i]);
        if (i < NBLK / 2)
            region += (len[i] + 4095) / 4096 * 4096;
    }
    /* sealable, as kvstashd's memory tier is: the server seals it */
    g_shm.fd = memfd_create("test-xproc-chaos", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (g_shm.fd < 0 || ftruncate(g_shm.fd, (off_t)region) != 0 ||
        (g_shm.base = mmap(NULL, region, PROT_READ | PROT_WRITE, MAP_SHARED, g_shm.fd, 0)) ==
            MAP_FAILED) {
        perror("store_setup");
        exit(1);
    }
    g_shm.len = region;
    uint64_t off = 0;
    for (unsigned i = 0; i < NBLK; i++) { /* block i is g_store.e[i] */
        uint8_t key[KVS_XFER_KEY_LEN];
        kvs_fx_key(key, i);
        uint8_t *bytes = tmp[i];
        if (i < NBLK / 2) {
            bytes = g_shm.base + off;
            memcpy(bytes, tmp[i], len[i]);
            off += (len[i] + 4095) / 4096 * 4096;
            free(tmp[i]);
        }
        kvs_fx_store_add(&g_store, key, bytes, len[i]);
    }
}

static void store_reset_counters(void)
{
    kvs_fx_store_zero(&g_store);
    pthread_mutex_lock(&g_store.mu);
    g_st.session_ends = g_st.bad_puts = 0;
    g_st.slow_ms = 0;
    g_st.hold_begins = 0;
    g_st.nheld = 0;
    pthread_mutex_unlock(&g_store.mu);
}

/* Every server's options: this store, the blocks' shared region, 4 MiB of
 * bounce memory, isolate as the data plane process. */
static kvs_xfer_server_opts server_opts(uint32_t op_timeout_ms, const char *isolate)
{
    kvs_xfer_server_opts o = {0};
    o.ops = kvs_fx_store_ops(&g_store);
    o.ops.provide = st_provide;
    o.ops.provide_async = st_provide_async;
    o.ops.put_begin = st_put_begin;
    o.ops.put_end = st_put_end;
    o.ops.put_end_async = st_put_end_async;
    o.ops.put_begin_async = st_put_begin_async;
    o.ops.session_end = st_session_end;
    o.op_timeout_ms = op_timeout_ms;
    o.isolate = isolate;
    o.shared = (kvs_xfer_shared){.fd = g_shm.fd, .base = g_shm.base, .len = g_shm.len};
    o.bounce_bytes = 4u << 20;
    return o;
}

static kvs_xfer_server *server_new(uint32_t op_timeout_ms)
{
    kvs_xfer_server_opts o = server_opts(op_timeout_ms, KVS_TEST_XFERD);
    kvs_xfer_server *s = NULL;
    int rc = kvs_xfer_server_create(&o, &s);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    g_store.srv = s;
    return s;
}

static pid_t child_pid(kvs_xfer_server *srv)
{
    kvs_xfer_server_stats st;
    if (kvs_xfer_server_stats_get(srv, &st) != 0)
        return 0;
    return (pid_t)st.proc_pid;
}

/* Waits up to ms for a running child other than old; its pid or 0. */
static pid_t wait_new_child(kvs_xfer_server *srv, pid_t old, unsigned ms)
{
    uint64_t until = now_ms() + ms;
    do {
        pid_t p = child_pid(srv);
        if (p > 0 && p != old)
            return p;
        usleep(5000);
    } while (now_ms() < until);
    return 0;
}

/* ---- a client with its session -------------------------------------------------------- */

typedef struct conn {
    kvs_xfer_client *c;
    sdata *sd;
    uint64_t id;
} conn;

/* 0 with *cn connected, else the failing status (nothing left open of it but
 * perhaps the session, which the server ends). */
static int conn_open(kvs_xfer_server *srv, uint32_t timeout_ms, conn *cn)
{
    memset(cn, 0, sizeof *cn);
    kvs_xfer_client_opts o = {.timeout_ms = timeout_ms};
    int rc = kvs_xfer_client_create(&o, &cn->c);
    if (rc != 0)
        return rc;
    const void *ca, *sa;
    size_t cl, sl;
    kvs_xfer_session_info info;
    cn->sd = sd_new();
    if ((rc = kvs_xfer_client_address(cn->c, &ca, &cl)) == 0 &&
        (rc = kvs_xfer_server_session_open(srv, ca, cl, cn->sd, &info)) == 0) {
        atomic_store(&cn->sd->opened, 1);
        cn->id = info.id;
        if ((rc = kvs_xfer_server_address(srv, &sa, &sl)) == 0)
            rc = kvs_xfer_client_connect(cn->c, sa, sl, &info);
    }
    if (rc != 0) {
        kvs_xfer_client_destroy(cn->c);
        cn->c = NULL;
    }
    return rc;
}

/* A server (op_timeout_ms, fresh store counters) and *cn connected to it
 * with a client timeout of client_ms. */
static kvs_xfer_server *server_conn(uint32_t op_timeout_ms, uint32_t client_ms, conn *cn)
{
    store_reset_counters();
    kvs_xfer_server *srv = server_new(op_timeout_ms);
    CU_ASSERT_EQUAL_FATAL(conn_open(srv, client_ms, cn), 0);
    return srv;
}

/* ---- fetch and put with a deadline ------------------------------------------------------ */

/* ---- the chaos run ---------------------------------------------------------------------- */

#define WORKERS    4
#define OP_WAIT_MS 15000u /* far above the clients' 1500 ms: past it, something hangs */

static struct {
    kvs_xfer_server *srv;
    atomic_int stop;
    atomic_long fetch_ok, fetch_fail, blocks_ok, put_ok, put_fail, reconnects, open_fail;
    atomic_long bad_bytes, bad_reply, hangs, kills, closes, stats_calls, backwards;
    atomic_ullong last_id[WORKERS]; /* the workers' current session ids, for the closer */
    atomic_long ok_after_last_kill;
    atomic_int last_kill_done;
} g_run;

typedef struct worker {
    int idx;
    unsigned seed;
} worker;

/* 0 when the operation ended (whatever its status), -1 on a hang; *ok: it succeeded. */
static int worker_fetch(worker *w, conn *cn, int *ok_out)
{
    uint8_t keys[4 * KVS_XFER_KEY_LEN];
    int which[4];
    unsigned nb = 1 + (unsigned)rand_r(&w->seed) % 4;
    uint32_t fmt = (uint32_t)rand_r(&w->seed) % 3;
    for (unsigned i = 0; i < nb; i++) {
        which[i] = rand_r(&w->seed) % (NBLK + 1); /* NBLK: a key the store lacks */
        kvs_fx_key(keys + i * KVS_XFER_KEY_LEN, (unsigned)which[i]);
    }
    kvs_xfer_dst dst[4];
    for (unsigned i = 0; i < nb; i++) {
        uint64_t cap = which[i] < NBLK ? g_store.e[which[i]].len : 4096;
        dst[i] = (kvs_xfer_dst){.buf = calloc(1, cap), .cap = cap};
    }
    kvs_fx_waiter o;
    kvs_fx_waiter_init(&o);
    kvs_xfer_fetch_req req = {.format = fmt,
                              .nblocks = nb,
                              .keys = keys,
                              .dst = dst,
                              .on_block = kvs_fx_on_block,
                              .on_done = kvs_fx_on_done,
                              .data = &o};
    int rc = kvs_xfer_fetch(cn->c, &req);
    if (rc == 0 && kvs_fx_waiter_wait(&o, OP_WAIT_MS) != 0) {
        atomic_fetch_add(&g_run.hangs, 1);
        return -1; /* dst and o stay: UCX may still write them */
    }
    if (rc == 0) {
        for (unsigned i = 0; i < nb; i++) {
            if (!o.block_done[i] || o.block_status[i] != 0)
                continue;
            int ok = which[i] < NBLK && dst[i].len == g_store.e[which[i]].len &&
                     memcmp(dst[i].buf, g_store.e[which[i]].bytes, dst[i].len) == 0 &&
                     (fmt == KVS_XFER_FMT_STORED || dst[i].layers == 4);
            if (!ok && atomic_fetch_add(&g_run.bad_bytes, 1) < 3) {
                uint64_t off = 0;
                if (which[i] < NBLK)
                    while (off < dst[i].len && off < g_store.e[which[i]].len &&
                           ((uint8_t *)dst[i].buf)[off] == g_store.e[which[i]].bytes[off])
                        off++;
                printf("\n    BAD block %u of %u: key %d, format %u, %llu bytes (stored %llu), "
                       "%u layers, first wrong byte at %llu\n",
                       i, nb, which[i], fmt, (unsigned long long)dst[i].len,
                       (unsigned long long)(which[i] < NBLK ? g_store.e[which[i]].len : 0),
                       dst[i].layers, (unsigned long long)off);
            } else if (ok) {
                atomic_fetch_add(&g_run.blocks_ok, 1);
            }
        }
        int missing = 0;
        for (unsigned i = 0; i < nb; i++)
            missing |= which[i] == NBLK;
        if (o.status == 0 && missing) { /* a block that does not exist "arrived" */
            atomic_fetch_add(&g_run.bad_bytes, 1);
            printf("\n    BAD fetch: success with a missing block\n");
        }
        if (o.status == 0 || (missing && o.status == KVS_ENOTFOUND)) {
            *ok_out = 1;
            atomic_fetch_add(&g_run.fetch_ok, 1);
            if (atomic_load(&g_run.last_kill_done))
                atomic_fetch_add(&g_run.ok_after_last_kill, 1);
        } else {
            atomic_fetch_add(&g_run.fetch_fail, 1);
        }
    } else {
        atomic_fetch_add(&g_run.fetch_fail, 1);
    }
    for (unsigned i = 0; i < nb; i++)
        free(dst[i].buf);
    kvs_fx_waiter_fini(&o);
    return 0;
}

static int worker_put(worker *w, conn *cn, int *ok_out)
{
    kvs_xfer_put_req req = {.format = FMT_PUT};
    uint64_t seed = ((uint64_t)rand_r(&w->seed) << 32) | (unsigned)rand_r(&w->seed);
    uint64_t len = 1 + (uint64_t)rand_r(&w->seed) % 150000;
    memcpy(req.key, &seed, 8);
    memcpy(req.key + 8, &len, 8);
    uint8_t *buf = malloc(len);
    for (uint64_t i = 0; i < len; i++)
        buf[i] = pat(seed, i);
    req.buf = buf;
    req.len = len;
    req.on_done = kvs_fx_on_put_done;
    kvs_fx_waiter o;
    kvs_fx_waiter_init(&o);
    req.data = &o;
    int rc = kvs_xfer_put(cn->c, &req);
    if (rc == 0 && kvs_fx_waiter_wait(&o, OP_WAIT_MS) != 0) {
        atomic_fetch_add(&g_run.hangs, 1);
        return -1;
    }
    if (rc == 0 && o.status == 0) {
        *ok_out = 1;
        atomic_fetch_add(&g_run.put_ok, 1);
        if (req.reply.stored_bytes != len)
            atomic_fetch_add(&g_run.bad_reply, 1);
    } else {
        atomic_fetch_add(&g_run.put_fail, 1);
    }
    free(buf);
    kvs_fx_waiter_fini(&o);
    return 0;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    conn cn = {0};
    int fails = 0; /* in a row: a client that got the next child's address with the
                    * previous child's session fails every operation (EUNAUTH) */
    while (!atomic_load(&g_run.stop)) {
        if (!cn.c || kvs_xfer_client_status(cn.c) != 0 || fails >= 3) {
            fails = 0;
            if (cn.c) {
                kvs_xfer_client_destroy(cn.c);
                cn.c = NULL;
                atomic_fetch_add(&g_run.reconnects, 1);
            }
            if (conn_open(g_run.srv, 1500, &cn) != 0) {
                atomic_fetch_add(&g_run.open_fail, 1);
                usleep(20000);
                continue;
            }
            atomic_store(&g_run.last_id[w->idx], cn.id);
        }
        int ok = 0;
        int rc = rand_r(&w->seed) % 3 == 0 ? worker_put(w, &cn, &ok) : worker_fetch(w, &cn, &ok);
        if (rc < 0)
            return NULL; /* a hang: leave the client, something holds it */
        fails = ok ? 0 : fails + 1;
    }
    kvs_xfer_client_destroy(cn.c);
    return NULL;
}

/* The counters a caller reads must not go backwards when the child dies. */
static void check_forward(const kvs_xfer_server_stats *a, const kvs_xfer_server_stats *b)
{
    if (b->fetch_requests < a->fetch_requests || b->blocks_sent < a->blocks_sent ||
        b->bytes_sent < a->bytes_sent || b->puts < a->puts ||
        b->bytes_received < a->bytes_received || b->proc_restarts < a->proc_restarts ||
        b->bounce_copies < a->bounce_copies) {
        if (atomic_fetch_add(&g_run.backwards, 1) < 3)
            printf("\n    counters went back: blocks_sent %llu -> %llu, fetch_requests %llu -> "
                   "%llu, restarts %llu -> %llu",
                   (unsigned long long)a->blocks_sent, (unsigned long long)b->blocks_sent,
                   (unsigned long long)a->fetch_requests, (unsigned long long)b->fetch_requests,
                   (unsigned long long)a->proc_restarts, (unsigned long long)b->proc_restarts);
    }
}

static void *closer_main(void *arg)
{
    unsigned seed = *(unsigned *)arg;
    kvs_xfer_server_stats prev = {0}, st;
    for (unsigned n = 0; !atomic_load(&g_run.stop); n++) {
        if (kvs_xfer_server_stats_get(g_run.srv, &st) == 0) {
            check_forward(&prev, &st);
            prev = st;
        }
        atomic_fetch_add(&g_run.stats_calls, 1);
        if (n % 25 == 24) { /* about every 0.5 s: close a worker's session under it */
            uint64_t id = atomic_load(&g_run.last_id[rand_r(&seed) % WORKERS]);
            if (id) {
                (void)kvs_xfer_server_session_close(g_run.srv, id);
                atomic_fetch_add(&g_run.closes, 1);
            }
        }
        usleep(20000);
    }
    return NULL;
}

static unsigned g_secs = 16;

static void *killer_main(void *arg)
{
    unsigned seed = *(unsigned *)arg;
    /* 4 kills: with the first start 5 starts, never 5 in 10 s (2 s apart at least,
     * and the run spreads them over g_secs). */
    uint64_t t0 = now_ms(), span = (uint64_t)g_secs * 1000u;
    for (int k = 0; k < 4 && !atomic_load(&g_run.stop); k++) {
        uint64_t at = t0 + span * (uint64_t)(k + 1) / 6 + (uint64_t)(rand_r(&seed) % 1500);
        while (now_ms() < at && !atomic_load(&g_run.stop))
            usleep(10000);
        pid_t p = wait_new_child(g_run.srv, 0, 5000);
        if (p <= 0 || atomic_load(&g_run.stop))
            break;
        if (kill(p, SIGKILL) == 0)
            atomic_fetch_add(&g_run.kills, 1);
        /* wait for its successor, so the next kill hits a child the parent runs */
        if (wait_new_child(g_run.srv, p, 10000) <= 0)
            printf("\n    no data plane process after killing %d", (int)p);
        if (k == 3)
            atomic_store(&g_run.last_kill_done, 1);
    }
    return NULL;
}

static void test_chaos(void)
{
    store_reset_counters();
    const char *e = getenv("KVS_CHAOS_SEED");
    unsigned seed = e ? (unsigned)strtoul(e, NULL, 10) : (unsigned)time(NULL) ^ (unsigned)getpid();
    e = getenv("KVS_CHAOS_SECS");
    if (e && atoi(e) > 0)
        g_secs = (unsigned)atoi(e);
    printf("\n    seed %u (KVS_CHAOS_SEED), %u s", seed, g_secs);
    memset(&g_run, 0, sizeof g_run);
    g_run.srv = server_new(1500);
    pid_t first = child_pid(g_run.srv);
    CU_ASSERT_FATAL(first > 0);
    pthread_t wt[WORKERS], ct, kt;
    worker w[WORKERS];
    for (int i = 0; i < WORKERS; i++) {
        w[i] = (worker){.idx = i, .seed = seed + (unsigned)i * 7919u};
        CU_ASSERT_FATAL(pthread_create(&wt[i], NULL, worker_main, &w[i]) == 0);
    }
    unsigned cs = seed * 31u, ks = seed * 17u;
    CU_ASSERT_FATAL(pthread_create(&ct, NULL, closer_main, &cs) == 0);
    CU_ASSERT_FATAL(pthread_create(&kt, NULL, killer_main, &ks) == 0);
    uint64_t end = now_ms() + (uint64_t)g_secs * 1000u;
    while (now_ms() < end && !atomic_load(&g_run.hangs))
        usleep(50000);
    /* Some fetches on the last child before stopping (it may still be starting). */
    for (int i = 0;
         i < 100 && atomic_load(&g_run.ok_after_last_kill) < 3 && !atomic_load(&g_run.hangs); i++)
        usleep(50000);
    atomic_store(&g_run.stop, 1);
    pthread_join(kt, NULL);
    pthread_join(ct, NULL);
    if (atomic_load(&g_run.hangs)) {
        printf("\n    an operation did not end in %u ms: giving up on the run\n", OP_WAIT_MS);
        fflush(stdout);
        CU_FAIL_FATAL("hang");
    }
    for (int i = 0; i < WORKERS; i++)
        pthread_join(wt[i], NULL);
    kvs_xfer_server_stats st;
    CU_ASSERT_EQUAL(kvs_xfer_server_stats_get(g_run.srv, &st), 0);
    /* Clients are gone: every block the child holds comes back (rendezvous
     * acknowledgements may lag the clients' completions a little). */
    long out = 0, puts_open = 0;
    for (int i = 0; i < 500; i++) {
        kvs_fx_store_books(&g_store, &out, &puts_open);
        CU_ASSERT_EQUAL(kvs_xfer_server_stats_get(g_run.srv, &st), 0);
        if (out == 0 && puts_open == 0 && st.refs_held == 0)
            break;
        usleep(10000);
    }
    printf("\n    kills %ld, restarts %llu; fetches ok %ld / failed %ld (blocks ok %ld, %ld on "
           "the last child), puts ok %ld / failed %ld, reconnects %ld, opens refused %ld, "
           "closes %ld, stats %ld; before destroy: provides-releases %ld, "
           "put_begins-put_ends %ld",
           atomic_load(&g_run.kills), (unsigned long long)st.proc_restarts,
           atomic_load(&g_run.fetch_ok), atomic_load(&g_run.fetch_fail),
           atomic_load(&g_run.blocks_ok), atomic_load(&g_run.ok_after_last_kill),
           atomic_load(&g_run.put_ok), atomic_load(&g_run.put_fail), atomic_load(&g_run.reconnects),
           atomic_load(&g_run.open_fail), atomic_load(&g_run.closes),
           atomic_load(&g_run.stats_calls), out, puts_open);
    CU_ASSERT_EQUAL(out, 0);
    CU_ASSERT_EQUAL(puts_open, 0);
    CU_ASSERT_EQUAL(st.proc_restarts, (uint64_t)atomic_load(&g_run.kills));
    CU_ASSERT_EQUAL(atomic_load(&g_run.kills), 4);
    CU_ASSERT(st.proc_pid > 0);
    kvs_xfer_server_destroy(g_run.srv);
    g_store.srv = NULL;
    kvs_fx_store_books(&g_store, &out, &puts_open);
    CU_ASSERT_EQUAL(out, 0);
    CU_ASSERT_EQUAL(puts_open, 0);
    CU_ASSERT_EQUAL(g_st.bad_puts, 0);
    CU_ASSERT_EQUAL(atomic_load(&g_run.bad_bytes), 0);
    CU_ASSERT_EQUAL(atomic_load(&g_run.bad_reply), 0);
    CU_ASSERT_EQUAL(atomic_load(&g_run.backwards), 0);
    CU_ASSERT(atomic_load(&g_run.fetch_ok) > 0);
    CU_ASSERT(atomic_load(&g_run.put_ok) > 0);
    CU_ASSERT(atomic_load(&g_run.ok_after_last_kill) > 0); /* it serves again */
    sd_check_all();
}

/* ---- regressions -------------------------------------------------------------------------- */

static int g_destroyed;
static pthread_mutex_t g_dmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_dcv = PTHREAD_COND_INITIALIZER;

static void *destroy_main(void *arg)
{
    kvs_xfer_server_destroy(arg);
    pthread_mutex_lock(&g_dmu);
    g_destroyed = 1;
    pthread_cond_broadcast(&g_dcv);
    pthread_mutex_unlock(&g_dmu);
    return NULL;
}

/* Destroy while the reader thread starts the next child (after a kill,
 * before its hello): destroy must still return. It used to wait forever: the
 * shutdown that wakes the reader found no child yet, and the reader then
 * read the new child's socket for good. */
static void test_destroy_during_restart(void)
{
    store_reset_counters();
    int hit = 0;
    for (int round = 0; round < 4; round++) {
        kvs_xfer_server *srv = server_new(0);
        pid_t p = child_pid(srv);
        CU_ASSERT_FATAL(p > 0);
        CU_ASSERT_EQUAL(kill(p, SIGKILL), 0);
        /* the old child reaped (pid 0), then a little while into the next one's start */
        pid_t q = p;
        for (int i = 0; i < 4000 && (q = child_pid(srv)) == p; i++)
            usleep(500);
        usleep((useconds_t)(round * round) * 1000u); /* 0, 1, 4, 9 ms */
        hit += q == 0 && child_pid(srv) == 0;
        g_destroyed = 0;
        pthread_t t;
        CU_ASSERT_FATAL(pthread_create(&t, NULL, destroy_main, srv) == 0);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 10;
        pthread_mutex_lock(&g_dmu);
        while (!g_destroyed && pthread_cond_timedwait(&g_dcv, &g_dmu, &ts) != ETIMEDOUT) {
        }
        int done = g_destroyed;
        pthread_mutex_unlock(&g_dmu);
        if (!done) {
            printf("\n    destroy during a restart did not return in 10 s\n");
            fflush(stdout);
            CU_FAIL_FATAL("destroy hangs");
        }
        pthread_join(t, NULL);
    }
    printf("\n    %d of 4 destroys during a start", hit);
    sd_check_all();
}

/* Counters read while the child dies do not drop to zero: a stats call that
 * failed (its child just died) used to store a zero snapshot as the child's
 * last, so what that child had counted was lost for good. */
static void test_counters_survive_kill(void)
{
    conn cn;
    kvs_xfer_server *srv = server_conn(0, 2000, &cn);
    worker w = {.seed = 1};
    int ok = 0;
    for (int i = 0; i < 8; i++)
        (void)worker_fetch(&w, &cn, &ok);
    kvs_xfer_server_stats before, st;
    CU_ASSERT_EQUAL(kvs_xfer_server_stats_get(srv, &before), 0);
    CU_ASSERT(before.blocks_sent > 0);
    kvs_xfer_client_destroy(cn.c);
    pid_t p = (pid_t)before.proc_pid;
    CU_ASSERT_EQUAL(kill(p, SIGKILL), 0);
    int low = 0, n = 0;
    uint64_t until = now_ms() + 10000;
    do {
        CU_ASSERT_EQUAL(kvs_xfer_server_stats_get(srv, &st), 0);
        n++;
        if (st.blocks_sent < before.blocks_sent || st.fetch_requests < before.fetch_requests)
            low++;
    } while ((st.proc_pid == 0 || st.proc_pid == (uint64_t)p) && now_ms() < until);
    printf("\n    %d stats reads across the restart, %d below the counts before it", n, low);
    CU_ASSERT_EQUAL(low, 0);
    CU_ASSERT(st.proc_pid != 0 && st.proc_pid != (uint64_t)p);
    CU_ASSERT(st.blocks_sent >= before.blocks_sent);
    kvs_xfer_server_destroy(srv);
    sd_check_all();
}

/* session_close must not return while the store is still inside a callback
 * with that session's data (the caller may free it then). It used to, when
 * the child had died: the CLOSE could not be sent, so it returned at once. */
static void test_close_during_callback(void)
{
    conn cn;
    kvs_xfer_server *srv = server_conn(0, 5000, &cn);
    pid_t p = child_pid(srv); /* now: a stats call waits for the reader, busy below */
    pthread_mutex_lock(&g_store.mu);
    kvs_fx_key(g_st.slow_key, 2);
    g_st.slow_ms = 400;
    pthread_mutex_unlock(&g_store.mu);
    uint8_t key[KVS_XFER_KEY_LEN];
    kvs_fx_key(key, 2);
    kvs_xfer_dst dst = {.buf = malloc(g_store.e[2].len), .cap = g_store.e[2].len};
    kvs_fx_waiter o;
    kvs_fx_waiter_init(&o);
    kvs_xfer_fetch_req req = {.format = KVS_XFER_FMT_STORED,
                              .nblocks = 1,
                              .keys = key,
                              .dst = &dst,
                              .on_done = kvs_fx_on_done,
                              .data = &o};
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_fetch(cn.c, &req), 0);
    for (int i = 0; i < 2000 && !atomic_load(&g_st.in_slow); i++)
        usleep(1000);
    CU_ASSERT_FATAL(atomic_load(&g_st.in_slow));
    CU_ASSERT_EQUAL(kill(p, SIGKILL), 0);
    usleep(50000); /* the child's socket is closed by now; the reader is in provide */
    uint64_t t = now_ms();
    int crc = kvs_xfer_server_session_close(srv, cn.id);
    atomic_store(&cn.sd->close_done, 1); /* a caller could free it now */
    int running = atomic_load(&g_st.in_slow);
    printf("\n    session_close: %s after %llu ms, provide %s", kvs_strerror(crc),
           (unsigned long long)(now_ms() - t), running ? "still running" : "done");
    CU_ASSERT_EQUAL(running, 0);
    CU_ASSERT_EQUAL(crc, 0); /* closed (with its child) */
    CU_ASSERT_EQUAL(kvs_fx_waiter_wait(&o, 10000), 0);
    CU_ASSERT(o.status != 0);
    pthread_mutex_lock(&g_store.mu);
    g_st.slow_ms = 0;
    pthread_mutex_unlock(&g_store.mu);
    kvs_xfer_client_destroy(cn.c);
    kvs_xfer_server_destroy(srv);
    kvs_fx_waiter_fini(&o);
    free(dst.buf);
    long out, puts_open;
    kvs_fx_store_books(&g_store, &out, &puts_open);
    CU_ASSERT_EQUAL(out, 0);
    sd_check_all();
}

/* ---- a hostile child ------------------------------------------------------------------ */

/* errno of a call that returned r (0 when it succeeded). */
static int err_of(long r)
{
    return r < 0 ? errno : 0;
}

/* What code in the data plane process could do to kvstashd, tried after
 * kvs__xp_sandbox (xproc_sandbox.c): "name=errno ..." into out (0: it
 * worked). Harmless if it did: signal 0, zero-length transfers, reads. */
static void sandbox_probe(char *out, size_t n)
{
    pid_t pp = getppid();
    char why[160] = "", mem[64];
    int sb = kvs__xp_sandbox(why, sizeof why);
    snprintf(mem, sizeof mem, "/proc/%d/mem", (int)pp);
    int memfd = open(mem, O_RDONLY);
    int e_mem = memfd < 0 ? errno : 0;
    if (memfd >= 0)
        close(memfd);
    int e_kp = err_of(kill(pp, 0)), e_ka = err_of(kill(-1, 0)), e_ks = err_of(kill(getpid(), 0));
    int e_vm = err_of(process_vm_readv(pp, NULL, 0, NULL, 0, 0));
    /* the same with bits above the 32 the kernel reads */
    int e_vm_hi =
        err_of(syscall(SYS_process_vm_readv, (unsigned long)pp | (1ul << 32), NULL, 0, NULL, 0, 0));
    errno = 0;
    long pr = ptrace(PTRACE_PEEKDATA, pp, NULL, NULL);
    int e_pt = pr == -1 ? errno : 0;
    int e_pg = err_of(setpgid(0, 0));
    long pfd = syscall(SYS_pidfd_open, pp, 0);
    int e_pfd = err_of(pfd);
    if (pfd >= 0)
        close((int)pfd);
    /* who gets SIGIO of a descriptor (default action: ends the process) */
    int e_own = err_of(fcntl(KVS__XP_FD_SOCK, F_SETOWN, pp));
    /* TIOCSTI with bits the kernel drops (it reads 32): stdin is /dev/null,
     * so the call itself would fail with ENOTTY */
    char ch = 0;
    int e_sti = err_of(syscall(SYS_ioctl, 0, (unsigned long)TIOCSTI | (1ul << 32), &ch));
    /* a process of kvstashd's own (CLONE_PARENT); clone3: ENOSYS */
    long cp = syscall(SYS_clone, (unsigned long)(CLONE_PARENT | SIGCHLD), NULL, NULL, NULL, 0);
    if (cp == 0)
        _exit(0); /* the new process, had the call been let through */
    int e_cp = err_of(cp);
    int e_c3 = err_of(syscall(SYS_clone3, NULL, 0));
    /* the memory tier (descriptor 5): a writable mapping of it, a read-only
     * one made writable, and the same through a reopen of /proc/self/fd/5
     * O_RDWR (a write of the byte already there, a growth undone) */
    int e_shw = 0, e_shp = 0, e_sho = 0, e_shpw = 0, e_shmw = 0, e_shg = 0;
    void *sm = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, KVS__XP_FD_SHARED, 0);
    if (sm == MAP_FAILED)
        e_shw = errno;
    else
        munmap(sm, 4096);
    sm = mmap(NULL, 4096, PROT_READ, MAP_SHARED, KVS__XP_FD_SHARED, 0);
    e_shp = sm == MAP_FAILED ? -1 : err_of(mprotect(sm, 4096, PROT_READ | PROT_WRITE));
    if (sm != MAP_FAILED)
        munmap(sm, 4096);
    char fdp[40];
    snprintf(fdp, sizeof fdp, "/proc/self/fd/%d", KVS__XP_FD_SHARED);
    int rw = open(fdp, O_RDWR | O_CLOEXEC);
    struct stat sst;
    if (rw < 0 || fstat(rw, &sst) != 0) {
        e_sho = e_shpw = e_shmw = e_shg = rw < 0 ? errno : -1;
    } else {
        char b = 0;
        e_shpw = pread(rw, &b, 1, 0) != 1 ? -1 : err_of(pwrite(rw, &b, 1, 0));
        sm = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
        e_shmw = sm == MAP_FAILED ? errno : 0;
        if (sm != MAP_FAILED)
            munmap(sm, 4096);
        e_shg = err_of(ftruncate(rw, sst.st_size + 4096));
        if (e_shg == 0)
            (void)ftruncate(rw, sst.st_size);
    }
    if (rw >= 0)
        close(rw);
    /* process_vm_readv / writev on a process of its own (same user, its
     * descendant: the kernel's ptrace check would let it), which ends when
     * its pipe closes (signals to it are refused) */
    static char vm_byte = 42;
    int vp[2], e_vmc = -1, e_vmcw = -1;
    if (pipe(vp) == 0) {
        pid_t k = fork();
        if (k == 0) {
            close(vp[1]);
            char c;
            _exit(read(vp[0], &c, 1) < 0);
        }
        close(vp[0]);
        if (k > 0) {
            char got = 0;
            struct iovec lv = {&got, 1}, rv = {&vm_byte, 1};
            e_vmc = err_of(process_vm_readv(k, &lv, 1, &rv, 1, 0));
            e_vmcw = err_of(process_vm_writev(k, &lv, 1, &rv, 1, 0));
        }
        close(vp[1]);
        if (k > 0)
            (void)waitpid(k, NULL, 0);
    }
    /* caps: 1 when none is left but CAP_SYS_PTRACE (a root child keeps it) */
    capng_get_caps_process();
    int caps = 1;
    for (unsigned c = 0; c <= CAP_LAST_CAP; c++)
        if (c != CAP_SYS_PTRACE && capng_have_capability(CAPNG_EFFECTIVE, c))
            caps = 0;
    snprintf(out, n,
             "sandbox=%d kill_parent=%d kill_all=%d kill_self=%d vm=%d mem=%d ptrace=%d "
             "setpgid=%d pidfd=%d caps=%d setown=%d tiocsti=%d vm_hi=%d clone_parent=%d "
             "clone3=%d shm_rw=%d shm_mprotect=%d shm_reopen=%d shm_reopen_write=%d "
             "shm_reopen_map=%d shm_reopen_grow=%d vm_child=%d vm_child_write=%d",
             sb, e_kp, e_ka, e_ks, e_vm, e_mem, e_pt, e_pg, e_pfd, caps, e_own, e_sti, e_vm_hi,
             e_cp, e_c3, e_shw, e_shp, e_sho, e_shpw, e_shmw, e_shg, e_vmc, e_vmcw);
}

/* This program itself, started as the data plane process (opts.isolate names
 * it; main sees kvstash-xferd's arguments): a child under an attacker's
 * control. It speaks the protocol (xproc.h) but never sends a block and
 * never gives one back. KVS_TEST_HOSTILE="N,E,S,F,P,U": once a session is open
 * and the test has asked for the stats once after (then the parent has it
 * open: PROVIDEs naming a session still opening are refused), it asks for
 * block 0 N times (a window of 256 PROVIDEs unanswered); with E =
 * 1, once all N are answered it says the session ended, then RELEASEs every
 * lend id it got (stale by then) and asks for 16 more blocks of the ended
 * session. S = 1: it puts itself in the sandbox and its HELLO "address" is
 * what sandbox_probe found. F = 1: it starts a process of its own that keeps
 * its socket open and waits forever; the HELLO is "gc=<its pid>". P: it sends
 * P PROVIDEs naming a session before it answers that session's OPEN. U: it
 * begins U puts of 1 MiB per session and never sends their data or ends
 * them (with E = 1 the first session is then said to have ended). D = 1:
 * each begun put is ended at once, without its data, as PUT_END_ASYNC of its
 * id twice, of its id with another generation and of an index never given,
 * then as a PUT_END call; its STATS answer counts the answers: puts those
 * with the store's verdict, proto_errors the KVS_EINVAL ones. D = 2: the
 * same with puts of odd length (the store declines put_end_async). B: it
 * sends B PUT_BEGIN_ASYNCs of 4 KiB naming its session, every one with the
 * same handle (seq), then 4 more: two naming a session never given, one
 * naming key 0, one of 2^62 bytes; each put begun is ended (PUT_END call,
 * KVS_ECANCELED) and its STATS answer counts the PUT_BEGUNs: fetch_requests
 * those with rc 0, blocks_failed the refused, auth_failures those whose seq
 * is not the one it sent. OPEN, CLOSE and STATS get plain answers (CLOSE
 * releases nothing). */
static int hostile_main(void)
{
    const char *mode = getenv("KVS_TEST_HOSTILE");
    long per = 0;
    int end = 0, sandbox = 0, forks = 0, early = 0, puts = 0, dup = 0, begins = 0;
    uint64_t verdicts = 0, refused = 0; /* D: the answers to its ends */
    uint64_t begun = 0, begin_refused = 0, begin_stray = 0; /* B: the PUT_BEGUNs */
    if (!mode ||
        sscanf(mode, "%ld,%d,%d,%d,%d,%d,%d,%d", &per, &end, &sandbox, &forks, &early, &puts, &dup,
               &begins) < 1 ||
        per < 0)
        return 2;
    const uint64_t begin_seq = 5ull << 30;
    int begins_sent = 0;
    char addr[512] = "hostile";
    if (sandbox)
        sandbox_probe(addr, sizeof addr);
    if (forks) {
        pid_t gc = fork();
        if (gc == 0) {
            for (;;)
                pause(); /* holds descriptor 3, the socket, open */
        }
        snprintf(addr, sizeof addr, "gc=%d", (int)gc);
    }
    kvs__xp_conn c;
    kvs__xp_conn_init(&c, KVS__XP_FD_SOCK);
    kvs__xp_msg hello = {.type = KVS__XP_HELLO};
    void *buf = malloc(sizeof(kvs__xp_msg) + KVS__XP_TAIL_MAX);
    uint64_t *ids = malloc((size_t)(per + 1) * sizeof *ids);
    if (!buf || !ids || kvs__xp_send(&c, &hello, addr, sizeof addr) != 0)
        return 3;
    uint8_t key[KVS_XFER_KEY_LEN];
    kvs_fx_key(key, 0);
    const uint8_t nonce[KVS_XFER_NONCE_LEN] = {0}; /* each PROVIDE's tail, as the child's */
    uint64_t skey = 0;
    long sent = 0, answered = 0, nids = 0;
    int go = 0; /* a STATS call came after the OPEN: the session is open by then */
    int puts_sent = 0, puts_answered = 0;
    for (;;) {
        for (; go && puts_sent < puts; puts_sent++) { /* 1 MiB each, never ended */
            kvs__xp_msg q = {.type = KVS__XP_PUT_BEGIN,
                             .seq = (uint64_t)(2u << 30) + (uint64_t)puts_sent,
                             .a = skey,
                             .b = (1u << 20) + (dup == 2),
                             .fmt = FMT_PUT};
            memcpy(q.key, key, sizeof key);
            (void)kvs__xp_send(&c, &q, NULL, 0);
        }
        if (go && begins && !begins_sent) {
            for (int i = 0; i < begins + 4; i++) {
                kvs__xp_msg q = {.type = KVS__XP_PUT_BEGIN_ASYNC,
                                 .seq = begin_seq, /* the same "handle" each time */
                                 .a = i < begins       ? skey
                                      : i < begins + 2 ? skey + 1000
                                                       : 0,
                                 .b = i == begins + 3 ? 1ull << 62 : 4096,
                                 .fmt = FMT_PUT};
                memcpy(q.key, key, sizeof key);
                (void)kvs__xp_send(&c, &q, NULL, 0);
            }
            begins_sent = 1;
        }
        while (go && sent < per && sent - answered < 256) {
            kvs__xp_msg m = {.type = KVS__XP_PROVIDE, .seq = (uint64_t)++sent, .a = skey};
            memcpy(m.key, key, sizeof key);
            (void)kvs__xp_send(&c, &m, nonce, sizeof nonce);
        }
        if (go && answered == per && puts_answered == puts && end == 1) {
            kvs__xp_msg m = {.type = KVS__XP_SESSION_END, .a = skey};
            (void)kvs__xp_send(&c, &m, NULL, 0);
            for (long i = 0; i < nids; i++) {
                kvs__xp_msg r = {.type = KVS__XP_RELEASE, .a = ids[i]};
                (void)kvs__xp_send(&c, &r, NULL, 0);
            }
            for (int i = 0; i < 16; i++) {
                kvs__xp_msg q = {
                    .type = KVS__XP_PROVIDE, .seq = (uint64_t)(per + 1 + i), .a = skey};
                memcpy(q.key, key, sizeof key);
                (void)kvs__xp_send(&c, &q, nonce, sizeof nonce);
            }
            end = 2;
        }
        kvs__xp_msg *m;
        uint8_t *tail;
        int r = kvs__xp_recv(KVS__XP_FD_SOCK, buf, &m, &tail);
        if (r == 0)
            _exit(0);
        if (r < 0)
            continue;
        kvs__xp_msg rep = {.type = KVS__XP_REPLY, .seq = m->seq};
        if (m->type == KVS__XP_OPEN) {
            static const uint8_t token[KVS_XFER_TOKEN_LEN] = {9};
            skey = m->a;
            sent = answered = nids = 0;
            puts_sent = puts_answered = 0;
            begins_sent = 0;
            go = 0;
            for (int i = 0; i < early; i++) { /* before the answer: still opening */
                kvs__xp_msg q = {
                    .type = KVS__XP_PROVIDE, .seq = (uint64_t)(1u << 30) + i, .a = skey};
                memcpy(q.key, key, sizeof key);
                (void)kvs__xp_send(&c, &q, nonce, sizeof nonce);
            }
            rep.a = 7000 + skey;
            (void)kvs__xp_send(&c, &rep, token, sizeof token);
        } else if (m->type == KVS__XP_CLOSE) {
            (void)kvs__xp_send(&c, &rep, NULL, 0);
        } else if (m->type == KVS__XP_STATS) {
            go = skey != 0;
            kvs_xfer_server_stats st;
            memset(&st, 0, sizeof st);
            st.puts = verdicts;
            st.proto_errors = refused;
            st.fetch_requests = begun;
            st.blocks_failed = begin_refused;
            st.auth_failures = begin_stray;
            (void)kvs__xp_send(&c, &rep, &st, sizeof st);
        } else if (m->type == KVS__XP_REPLY && m->fmt == KVS__XP_PUT_BEGIN) {
            puts_answered++;
            if (dup && m->rc == 0) {
                const uint64_t id = m->a, ends[4] = {id, id, id ^ (1ull << 32), 0xffffffffull};
                for (int i = 0; i < 4; i++) {
                    kvs__xp_msg q = {.type = KVS__XP_PUT_END_ASYNC, .seq = 1u + i, .a = ends[i]};
                    (void)kvs__xp_send(&c, &q, NULL, 0);
                }
                kvs__xp_msg q = {.type = KVS__XP_PUT_END, .seq = 3u << 30, .a = id};
                (void)kvs__xp_send(&c, &q, NULL, 0);
            }
        } else if (m->type == KVS__XP_PUT_BEGUN) {
            begin_stray += m->seq != begin_seq;
            if (m->rc == 0) {
                begun++;
                kvs__xp_msg q = {
                    .type = KVS__XP_PUT_END, .seq = 4u << 30, .a = m->a, .rc = KVS_ECANCELED};
                (void)kvs__xp_send(&c, &q, NULL, 0);
            } else {
                begin_refused++;
            }
        } else if (m->type == KVS__XP_PUT_ENDED ||
                   (m->type == KVS__XP_REPLY && m->seq == 3u << 30)) {
            if (m->rc == KVS_EINVAL)
                refused++;
            else
                verdicts++;
        } else if (m->type == KVS__XP_PROVIDED && m->seq <= (uint64_t)per) {
            answered++;
            if (m->rc == 0)
                ids[nids++] = m->a;
        }
    }
}

static char g_self[4096];

/* A server whose data plane process is hostile_main with mode; restarted
 * children get the same mode while keep is set (unset it with
 * unsetenv("KVS_TEST_HOSTILE")). */
static kvs_xfer_server *server_hostile_keep(const char *mode, int keep)
{
    kvs_xfer_server_opts o = server_opts(0, g_self);
    setenv("KVS_TEST_HOSTILE", mode, 1);
    kvs_xfer_server *s = NULL;
    int rc = kvs_xfer_server_create(&o, &s);
    if (!keep)
        unsetenv("KVS_TEST_HOSTILE");
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    g_store.srv = s;
    return s;
}

static kvs_xfer_server *server_hostile(const char *mode)
{
    return server_hostile_keep(mode, 0);
}

static long store_session_ends(void)
{
    pthread_mutex_lock(&g_store.mu);
    long n = g_st.session_ends;
    pthread_mutex_unlock(&g_store.mu);
    return n;
}

/* A server with a hostile child of mode (fresh store counters) and one
 * session open on it (any address: the child answers every OPEN). */
static kvs_xfer_server *hostile_session(const char *mode, sdata **sd, kvs_xfer_session_info *info)
{
    store_reset_counters();
    kvs_xfer_server *srv = server_hostile(mode);
    static const uint8_t caddr[64] = {1};
    *sd = sd_new();
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_server_session_open(srv, caddr, sizeof caddr, *sd, info), 0);
    atomic_store(&(*sd)->opened, 1);
    return srv;
}

/* Lets srv's hostile child go (a stats call after the OPEN: its session is
 * open then) and waits up to ms for it to say that session ended; fatal
 * when it does not. */
static void hostile_until_session_end(kvs_xfer_server *srv, unsigned ms)
{
    kvs_xfer_server_stats st;
    CU_ASSERT_EQUAL(kvs_xfer_server_stats_get(srv, &st), 0); /* go */
    uint64_t until = now_ms() + ms;
    while (store_session_ends() == 0 && now_ms() < until)
        usleep(5000);
    CU_ASSERT_EQUAL_FATAL(store_session_ends(), 1);
}

/* A child that asks for blocks and never gives them back pins at most
 * 65536 per session (the rest are refused and counted), and only until its
 * session ends: session_close gives back what the child kept, although the
 * child says it closed the session. Without the bound every store block it
 * asked for stayed pinned until the child died. */
static void test_hostile_keeps_blocks(void)
{
    sdata *sd;
    kvs_xfer_session_info info;
    kvs_xfer_server *srv = hostile_session("65636,0", &sd, &info);
    kvs_xfer_server_stats st;
    uint64_t until = now_ms() + 60000;
    do {
        usleep(20000);
        CU_ASSERT_EQUAL_FATAL(kvs_xfer_server_stats_get(srv, &st), 0);
    } while (st.lend_refused < 100 && now_ms() < until);
    long out, puts_open;
    kvs_fx_store_books(&g_store, &out, &puts_open);
    printf("\n    lent %llu, refused %llu, store references held %ld",
           (unsigned long long)st.proc_lent, (unsigned long long)st.lend_refused, out);
    CU_ASSERT_EQUAL(st.lend_refused, 100);
    CU_ASSERT_EQUAL(st.proc_lent, 65536);
    CU_ASSERT_EQUAL(out, 65536);
    CU_ASSERT_EQUAL(kvs_xfer_server_session_close(srv, info.id), 0);
    atomic_store(&sd->close_done, 1);
    kvs_fx_store_books(&g_store, &out, &puts_open);
    CU_ASSERT_EQUAL(kvs_xfer_server_stats_get(srv, &st), 0);
    printf("; after session_close: lent %llu, held %ld", (unsigned long long)st.proc_lent, out);
    CU_ASSERT_EQUAL(out, 0);
    CU_ASSERT_EQUAL(st.proc_lent, 0);
    CU_ASSERT_EQUAL(store_session_ends(), 1);
    kvs_xfer_server_destroy(srv);
    sd_check_all();
}

/* A child that says its session ended without giving back its blocks: they
 * are given back then; its stale RELEASEs afterwards release nothing twice,
 * and blocks it asks for after the end are refused before the store sees
 * them. */
static void test_hostile_session_end(void)
{
    sdata *sd;
    kvs_xfer_session_info info;
    kvs_xfer_server *srv = hostile_session("1000,1", &sd, &info);
    hostile_until_session_end(srv, 20000);
    kvs_xfer_server_stats st;
    /* its answer comes after the stale RELEASEs and late PROVIDEs it sent */
    CU_ASSERT_EQUAL(kvs_xfer_server_stats_get(srv, &st), 0);
    pthread_mutex_lock(&g_store.mu);
    long provides = g_store.provides, releases = g_store.releases;
    pthread_mutex_unlock(&g_store.mu);
    printf("\n    provides %ld, releases %ld, lent %llu", provides, releases,
           (unsigned long long)st.proc_lent);
    CU_ASSERT_EQUAL(provides, 1000);
    CU_ASSERT_EQUAL(releases, 1000);
    CU_ASSERT_EQUAL(st.proc_lent, 0);
    CU_ASSERT_EQUAL(st.lend_refused, 0);
    CU_ASSERT_EQUAL(kvs_xfer_server_session_close(srv, info.id), KVS_ENOTFOUND);
    kvs_xfer_server_destroy(srv);
    sd_check_all();
}

/* What code running in the data plane process can still do to this one
 * (the parent): the child puts itself in kvs__xp_sandbox, as kvstash-xferd
 * does first thing, and tries. Each must be refused; signalling itself
 * stays allowed (UCX's own abort). This process is made non-dumpable for
 * the while, as kvstashd makes itself: then its /proc/<pid>/mem is closed to
 * the child, unless both run as root (the child keeps CAP_SYS_PTRACE).
 * And to the blocks of the store: the memory tier it reads (opts.shared)
 * must stay read-only to it, however it maps or reopens it; and to other
 * processes of its user (process_vm_* on a child of its own). */
static void test_hostile_sandbox(void)
{
    store_reset_counters();
    CU_ASSERT_EQUAL(prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), 0);
    kvs_xfer_server *srv = server_hostile("0,0,1,0");
    const void *a;
    size_t n;
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_server_address(srv, &a, &n), 0);
    char probe[512];
    snprintf(probe, sizeof probe, "%.*s", (int)n, (const char *)a);
    printf("\n    %s", probe);
    int sb = -1, kp = -1, ka = -1, ks = -1, vm = -1, mem = -1, pt = -1, pg = -1, pfd = -1,
        caps = -1, own = -1, sti = -1, vmhi = -1, cpar = -1, c3 = -1, shw = -1, shp = -1, sho = -1,
        shpw = -1, shmw = -1, shg = -1, vmc = -1, vmcw = -1;
    CU_ASSERT_EQUAL_FATAL(
        sscanf(probe,
               "sandbox=%d kill_parent=%d kill_all=%d kill_self=%d vm=%d "
               "mem=%d ptrace=%d setpgid=%d pidfd=%d caps=%d setown=%d "
               "tiocsti=%d vm_hi=%d clone_parent=%d clone3=%d shm_rw=%d shm_mprotect=%d "
               "shm_reopen=%d shm_reopen_write=%d shm_reopen_map=%d shm_reopen_grow=%d "
               "vm_child=%d vm_child_write=%d",
               &sb, &kp, &ka, &ks, &vm, &mem, &pt, &pg, &pfd, &caps, &own, &sti, &vmhi, &cpar, &c3,
               &shw, &shp, &sho, &shpw, &shmw, &shg, &vmc, &vmcw),
        23);
    /* the memory tier cannot be made writable: its descriptor is read-only
     * (EACCES), and a reopen of it read-write, which the kernel allows, is
     * refused every write by its seals (EPERM) */
    CU_ASSERT_EQUAL(shw, EACCES);
    CU_ASSERT_EQUAL(shp, EACCES);
    CU_ASSERT(sho == 0 || sho == EACCES);
    CU_ASSERT_EQUAL(shpw, sho ? sho : EPERM);
    CU_ASSERT_EQUAL(shmw, sho ? sho : EPERM);
    CU_ASSERT_EQUAL(shg, sho ? sho : EPERM);
    /* no process_vm_* on any process, its own children included */
    CU_ASSERT_EQUAL(vmc, EPERM);
    CU_ASSERT_EQUAL(vmcw, EPERM);
    CU_ASSERT_EQUAL(vmhi, EPERM);
    CU_ASSERT_EQUAL(cpar, EPERM);
    CU_ASSERT_EQUAL(c3, ENOSYS);
    CU_ASSERT_EQUAL(own, EPERM);
    CU_ASSERT_EQUAL(sti, EPERM);
    CU_ASSERT_EQUAL(sb, 0);
    CU_ASSERT_EQUAL(kp, EPERM);
    CU_ASSERT_EQUAL(ka, EPERM);
    CU_ASSERT_EQUAL(ks, 0);
    CU_ASSERT_EQUAL(vm, EPERM);
    if (geteuid() != 0)
        CU_ASSERT(mem == EACCES || mem == EPERM);
    CU_ASSERT_EQUAL(pt, EPERM);
    CU_ASSERT_EQUAL(pg, EPERM);
    CU_ASSERT_EQUAL(pfd, EPERM);
    CU_ASSERT_EQUAL(caps, 1);
    kvs_xfer_server_destroy(srv);
    CU_ASSERT_EQUAL(prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), 0);
    sd_check_all();
}

/* A child that names a session before it has answered its OPEN (it may
 * then answer with an error, and the blocks would stay lent under a session
 * that never was): nothing is lent for a session still opening. */
static void test_hostile_early_provide(void)
{
    sdata *sd;
    kvs_xfer_session_info info;
    kvs_xfer_server *srv = hostile_session("0,0,0,0,64", &sd, &info);
    kvs_xfer_server_stats st;
    CU_ASSERT_EQUAL(kvs_xfer_server_stats_get(srv, &st), 0); /* after the PROVIDEs */
    pthread_mutex_lock(&g_store.mu);
    long provides = g_store.provides;
    pthread_mutex_unlock(&g_store.mu);
    printf("\n    64 PROVIDEs before the OPEN answer: store provides %ld, lent %llu", provides,
           (unsigned long long)st.proc_lent);
    CU_ASSERT_EQUAL(provides, 0);
    CU_ASSERT_EQUAL(st.proc_lent, 0);
    CU_ASSERT_EQUAL(kvs_xfer_server_session_close(srv, info.id), 0);
    atomic_store(&sd->close_done, 1);
    kvs_xfer_server_destroy(srv);
    sd_check_all();
}

/* Puts whose session ended while their data never came keep their bounce
 * memory (the client's bytes could still land there): a child holding half
 * of it that way is killed when bounce memory runs out, and its death gives
 * every put back. Without it, every copy through bounce memory (blocks not
 * in the shared region, puts) failed for as long as the child lived. */
static void test_hostile_put_starves_bounce(void)
{
    sdata *sd;
    kvs_xfer_session_info info;
    /* bounce memory 4 MiB: three 1 MiB puts under the first session, which
     * then ends; the second session's second put finds none left */
    kvs_xfer_server *srv = hostile_session("0,1,0,0,0,3", &sd, &info);
    hostile_until_session_end(srv, 10000);
    kvs_xfer_server_stats st;
    long out, puts_open;
    kvs_fx_store_books(&g_store, &out, &puts_open);
    CU_ASSERT_EQUAL(puts_open, 3); /* kept past their session's end */
    static const uint8_t caddr[64] = {2};
    sdata *sd2 = sd_new();
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_server_session_open(srv, caddr, sizeof caddr, sd2, &info), 0);
    atomic_store(&sd2->opened, 1);
    CU_ASSERT_EQUAL(kvs_xfer_server_stats_get(srv, &st), 0); /* go */
    uint64_t until = now_ms() + 10000;
    do {
        usleep(10000);
        CU_ASSERT_EQUAL_FATAL(kvs_xfer_server_stats_get(srv, &st), 0);
    } while (st.proc_restarts == 0 && now_ms() < until);
    kvs_fx_store_books(&g_store, &out, &puts_open);
    printf("\n    restarts %llu; puts still begun %ld, bounce fails %llu",
           (unsigned long long)st.proc_restarts, puts_open, (unsigned long long)st.bounce_fails);
    CU_ASSERT(st.proc_restarts >= 1);
    CU_ASSERT_EQUAL(puts_open, 0);
    CU_ASSERT(st.bounce_fails >= 1);
    kvs_xfer_server_destroy(srv);
    sd_check_all();
}

/* A child that ends each put it began several times over (PUT_END_ASYNC of
 * its id twice, of a stale generation, of an index never given, then a
 * PUT_END): the store ends each put once, every other end is refused
 * (KVS_EINVAL), whether the store ends it on a thread of its own
 * (put_end_async) or declines that. */
static void test_hostile_put_ends_again(void)
{
    const char *modes[2] = {"0,0,0,0,0,3,1", "0,0,0,0,0,3,2"};
    for (int m = 0; m < 2; m++) {
        sdata *sd;
        kvs_xfer_session_info info;
        kvs_xfer_server *srv = hostile_session(modes[m], &sd, &info);
        kvs_xfer_server_stats st;
        long out = 0, puts_open = 0;
        uint64_t until = now_ms() + 10000;
        do {
            CU_ASSERT_EQUAL_FATAL(kvs_xfer_server_stats_get(srv, &st), 0); /* the 1st: go */
            kvs_fx_store_books(&g_store, &out, &puts_open);
            if (st.puts + st.proto_errors >= 3 * 5 && puts_open == 0)
                break;
            usleep(10000);
        } while (now_ms() < until);
        pthread_mutex_lock(&g_store.mu);
        long begins = g_store.put_begins, ends = g_store.put_ends;
        pthread_mutex_unlock(&g_store.mu);
        printf("\n    %s: put_begins %ld, put_ends %ld; answers: %llu verdicts, %llu refused",
               m ? "declined" : "put_end_async", begins, ends, (unsigned long long)st.puts,
               (unsigned long long)st.proto_errors);
        CU_ASSERT_EQUAL(begins, 3);
        CU_ASSERT_EQUAL(ends, 3);
        CU_ASSERT_EQUAL(st.puts, 3);
        CU_ASSERT_EQUAL(st.proto_errors, 3 * 4);
        CU_ASSERT_EQUAL(st.proc_restarts, 0);
        kvs_xfer_server_destroy(srv);
        g_store.srv = NULL;
        kvs_fx_store_books(&g_store, &out, &puts_open);
        CU_ASSERT_EQUAL(puts_open, 0);
        sd_check_all();
    }
}

/* A child that sends PUT_BEGIN_ASYNCs all under one handle, for sessions
 * never given and of impossible lengths: each is answered (PUT_BEGUN, the
 * handle echoed), the bogus ones refused before the store sees them, and
 * every put the store began is ended once, when the child ends it or,
 * held, when the store answers after the session ended. Held by the store
 * (put_begin_async), a session's pending begins are bounded (1024, the rest
 * KVS_ENOSPC), so a child cannot make the store reserve without limit. */
static void test_hostile_put_begin_async(void)
{
    for (int held = 0; held < 2; held++) {
        sdata *sd;
        kvs_xfer_session_info info;
        /* 8 puts begun inline (the store declines put_begin_async), or 1100
         * offered to a store that holds them */
        kvs_xfer_server *srv =
            hostile_session(held ? "0,0,0,0,0,0,0,1100" : "0,0,0,0,0,0,0,8", &sd, &info);
        pthread_mutex_lock(&g_store.mu);
        g_st.hold_begins = held;
        pthread_mutex_unlock(&g_store.mu);
        unsigned want = held ? 1100 + 4 : 8 + 4, nheld = 0;
        kvs_xfer_server_stats st;
        long out = 0, puts_open = 0;
        uint64_t until = now_ms() + 20000;
        do {
            CU_ASSERT_EQUAL_FATAL(kvs_xfer_server_stats_get(srv, &st), 0); /* the 1st: go */
            pthread_mutex_lock(&g_store.mu);
            nheld = g_st.nheld;
            pthread_mutex_unlock(&g_store.mu);
            kvs_fx_store_books(&g_store, &out, &puts_open);
            if (st.fetch_requests + st.blocks_failed + (held ? nheld : 0) >= want &&
                (held || puts_open == 0))
                break;
            usleep(10000);
        } while (now_ms() < until);
        printf("\n    %s: begun %llu, refused %llu, stray %llu, held by the store %u",
               held ? "held" : "inline", (unsigned long long)st.fetch_requests,
               (unsigned long long)st.blocks_failed, (unsigned long long)st.auth_failures, nheld);
        CU_ASSERT_EQUAL(st.auth_failures, 0);
        if (held) {
            CU_ASSERT_EQUAL(nheld, 1024);
            CU_ASSERT_EQUAL(st.fetch_requests, 0);
            CU_ASSERT_EQUAL(st.blocks_failed, 1100 - 1024 + 4);
            /* The session ends; the store answers every held begin after it:
             * each put it begins is ended at once. */
            CU_ASSERT_EQUAL(kvs_xfer_server_session_close(srv, info.id), 0);
            atomic_store(&sd->close_done, 1);
            CU_ASSERT_EQUAL(begins_answer(srv), 1024);
            until = now_ms() + 20000;
            do {
                CU_ASSERT_EQUAL_FATAL(kvs_xfer_server_stats_get(srv, &st), 0);
                if (st.blocks_failed >= 1100 + 4)
                    break;
                usleep(10000);
            } while (now_ms() < until);
            CU_ASSERT_EQUAL(st.blocks_failed, 1100 + 4);
            CU_ASSERT_EQUAL(st.fetch_requests, 0);
        } else {
            CU_ASSERT_EQUAL(st.fetch_requests, 8);
            CU_ASSERT_EQUAL(st.blocks_failed, 4);
        }
        kvs_fx_store_books(&g_store, &out, &puts_open);
        pthread_mutex_lock(&g_store.mu);
        long begins = g_store.put_begins, ends = g_store.put_ends;
        int last = g_store.last_put_status;
        pthread_mutex_unlock(&g_store.mu);
        printf("; store: put_begins %ld, put_ends %ld", begins, ends);
        CU_ASSERT_EQUAL(begins, held ? 1024 : 8);
        CU_ASSERT_EQUAL(ends, begins);
        CU_ASSERT_EQUAL(puts_open, 0);
        CU_ASSERT_EQUAL(last, KVS_ECANCELED);
        CU_ASSERT_EQUAL(st.proc_restarts, 0);
        kvs_xfer_server_destroy(srv);
        g_store.srv = NULL;
        kvs_fx_store_books(&g_store, &out, &puts_open);
        CU_ASSERT_EQUAL(puts_open, 0);
        store_reset_counters();
        sd_check_all();
    }
}

/* 'R' (or any state) of pid from /proc, 'X' when it is gone. */
static char proc_state(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 'X';
    size_t r = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[r] = '\0';
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p[2] : '?';
}

/* A child that started a process of its own holding its socket open, then
 * died: its death is seen all the same (the pidfd, not the socket's end),
 * a new child starts at once, and what the dead one started is killed with
 * it (its process group). It used to take a 15 s call timeout for every
 * call, and no restart came: the socket never ended. */
static void test_hostile_grandchild(void)
{
    store_reset_counters();
    kvs_xfer_server *srv = server_hostile_keep("0,0,0,1", 1);
    const void *a;
    size_t n;
    CU_ASSERT_EQUAL_FATAL(kvs_xfer_server_address(srv, &a, &n), 0);
    int gc = 0;
    CU_ASSERT_EQUAL_FATAL(sscanf((const char *)a, "gc=%d", &gc), 1);
    pid_t p = child_pid(srv);
    CU_ASSERT_FATAL(p > 0 && gc > 0);
    CU_ASSERT(proc_state(gc) != 'X' && proc_state(gc) != 'Z');
    uint64_t t = now_ms();
    CU_ASSERT_EQUAL(kill(p, SIGKILL), 0);
    pid_t q = wait_new_child(srv, p, 5000);
    uint64_t took = now_ms() - t;
    char st = proc_state(gc);
    for (int i = 0; i < 200 && st != 'X' && st != 'Z'; i++) {
        usleep(10000);
        st = proc_state(gc);
    }
    unsetenv("KVS_TEST_HOSTILE");
    printf("\n    new child after %llu ms; the old one's own process: %c", (unsigned long long)took,
           st);
    CU_ASSERT(q > 0);
    CU_ASSERT(took < 4000);
    CU_ASSERT(st == 'X' || st == 'Z');
    kvs_xfer_server_destroy(srv);
    sd_check_all();
}

/* A put_begin the store takes longer over than the server's op timeout: the
 * child's call gives up (the put fails), and the put the parent began after
 * all is ended (KVS_ECANCELED) when its late answer arrives, not held (slot,
 * store buffer, bounce memory) until the child dies. */
static void test_put_begin_late(void)
{
    conn cn;
    kvs_xfer_server *srv = server_conn(1000, 5000, &cn);
    pthread_mutex_lock(&g_store.mu);
    g_store.put_stall_ms = 1600;
    pthread_mutex_unlock(&g_store.mu);
    worker w = {.seed = 5};
    int ok = 0;
    CU_ASSERT_EQUAL(worker_put(&w, &cn, &ok), 0);
    CU_ASSERT_EQUAL(ok, 0);
    pthread_mutex_lock(&g_store.mu);
    g_store.put_stall_ms = 0;
    pthread_mutex_unlock(&g_store.mu);
    long out = 0, puts_open = 1;
    for (int i = 0; i < 500 && puts_open; i++) {
        kvs_fx_store_books(&g_store, &out, &puts_open);
        usleep(10000);
    }
    pthread_mutex_lock(&g_store.mu);
    long begins = g_store.put_begins;
    int last = g_store.last_put_status;
    pthread_mutex_unlock(&g_store.mu);
    printf("\n    put_begins %ld, open %ld, last put_end status %s", begins, puts_open,
           kvs_strerror(last));
    CU_ASSERT_EQUAL(begins, 1);
    CU_ASSERT_EQUAL(puts_open, 0); /* before destroy */
    CU_ASSERT_EQUAL(last, KVS_ECANCELED);
    kvs_xfer_client_destroy(cn.c);
    kvs_xfer_server_destroy(srv);
    sd_check_all();
}

/* The parent's sends to its child are bounded (kvs__xp_conn.send_ms): a child
 * that stops reading (SIGSTOP, a wedged reader) fills the socket, and an
 * unbounded send then held the reader thread and every caller of
 * session_open / stats_get behind it for good, with no call left waiting
 * whose timeout would kill the child. Here a peer that never reads: the send
 * that finds no room fails with KVS_ETIMEDOUT after send_ms, and succeeds
 * again once the peer reads. (Through a whole server this takes the 15 s
 * CALL_MS; the wedged-child kill itself is test_xfer's isolated_wedged.) */
static void test_send_bounded(void)
{
    int sv[2];
    CU_ASSERT_FATAL(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
    int small = 16384;
    (void)setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
    kvs__xp_conn c;
    kvs__xp_conn_init(&c, sv[0]);
    c.send_ms = 300;
    static uint8_t tail[2048];
    kvs__xp_msg m = {.type = KVS__XP_STATS};
    int rc = 0, sent = 0;
    uint64_t t = 0;
    while (sent < 100000) {
        t = now_ms();
        if ((rc = kvs__xp_send(&c, &m, tail, sizeof tail)) != 0)
            break;
        sent++;
    }
    uint64_t waited = now_ms() - t;
    printf("\n    %d messages, then %s after %llu ms", sent, kvs_strerror(rc),
           (unsigned long long)waited);
    CU_ASSERT_EQUAL(rc, KVS_ETIMEDOUT);
    CU_ASSERT(sent > 0);
    CU_ASSERT(waited >= 250 && waited < 5000);
    uint8_t buf[sizeof(kvs__xp_msg) + sizeof tail];
    for (int i = 0; i < 4; i++)
        CU_ASSERT(recv(sv[1], buf, sizeof buf, 0) > 0);
    CU_ASSERT_EQUAL(kvs__xp_send(&c, &m, tail, sizeof tail), 0);
    close(sv[1]); /* the peer is gone: no wait at all */
    CU_ASSERT_EQUAL(kvs__xp_send(&c, &m, tail, sizeof tail), KVS_EUNAVAIL);
    kvs__xp_conn_fini(&c);
    close(sv[0]);
}

int main(int argc, char **argv)
{
    if (argc == 13 && (strcmp(argv[1], "peer") == 0 || strcmp(argv[1], "none") == 0))
        return hostile_main(); /* started as a data plane process */
    signal(SIGPIPE, SIG_IGN);
    ssize_t n = readlink("/proc/self/exe", g_self, sizeof g_self - 1);
    if (n <= 0) {
        perror("readlink /proc/self/exe");
        return 1;
    }
    g_self[n] = '\0';
    kvs_fx_tls_setup();
    printf("UCX_TLS=%s\n", getenv("UCX_TLS") ? getenv("UCX_TLS") : "(default)");
    store_setup();
    static const kvs_test_case cases[] = {
        {"destroy_during_restart", test_destroy_during_restart},
        {"counters_survive_kill", test_counters_survive_kill},
        {"close_during_callback", test_close_during_callback},
        {"put_begin_late", test_put_begin_late},
        {"send_bounded", test_send_bounded},
        {"hostile_keeps_blocks", test_hostile_keeps_blocks},
        {"hostile_session_end", test_hostile_session_end},
        {"hostile_early_provide", test_hostile_early_provide},
        {"hostile_put_starves_bounce", test_hostile_put_starves_bounce},
        {"hostile_put_ends_again", test_hostile_put_ends_again},
        {"hostile_put_begin_async", test_hostile_put_begin_async},
        {"hostile_sandbox", test_hostile_sandbox},
        {"hostile_grandchild", test_hostile_grandchild},
        {"chaos", test_chaos},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {
        {"xproc_chaos", NULL, NULL, cases},
        {NULL, NULL, NULL, NULL},
    };
    int rc = kvs_test_run(suites);
    for (int i = NBLK / 2; i < NBLK; i++)
        free(g_store.e[i].bytes);
    munmap(g_shm.base, g_shm.len);
    close(g_shm.fd);
    return rc;
}
