/*
 * kvs_dying_worker.c — a UCX worker killed mid-fetch (kvs_dying_worker.h).
 *
 * The parent encodes the keys as hex arguments and re-executes its own
 * binary; the child decodes them, opens its UCX session one of two ways and
 * raises SIGKILL from the callback of the layer it was told, on the thread
 * that callback runs on. Everything the child allocates is left to the
 * kill: it never returns from a successful run.
 */
#include "kvs_dying_worker.h"

#include "kvs_itest.h"
#include "kvstash/v1/kvstash.pb-c.h"
#include "xfer.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int kvs_dw_is_worker(int argc, char **argv)
{
    return argc >= 2 && strcmp(argv[1], KVS_DW_FLAG) == 0;
}

/* ---- the worker, on the calling thread (libkvstash) ------------------------------------ */

static int die_cb(void *arg, unsigned b, unsigned l, const void *k, size_t kl, const void *v,
                  size_t vl, float ks, float vs, int last)
{
    (void)k, (void)kl, (void)v, (void)vl, (void)ks, (void)vs, (void)last;
    const unsigned *at = arg; /* block, layer */
    if (b == at[0] && l == at[1])
        raise(SIGKILL);
    return 0;
}

static int die_on_caller(const char *addr, const unsigned char (*keys)[32], unsigned nb,
                         const kvs_ns *ns, const unsigned at[2])
{
    kvs_client *c = NULL;
    if (kvs_itest_open_client(addr, NULL, 1, 60000, &c) != 0)
        return 4; /* said on stderr */
    char err[KVS_ERR_LEN] = "";
    int x = kvs_client_fetch(c, ns, keys, nb, KVS_EGRESS_STORED, 0, -1, die_cb, (void *)at, err);
    kvs_client_xfer_stats st;
    kvs_client_xfer_stats_get(c, &st);
    fprintf(stderr, KVS_DW_FLAG ": the fetch ended (%s), fallbacks %llu, UCX status %d\n",
            x ? err : "ok", st.fallbacks, st.ucx_status);
    kvs_client_close(c);
    return st.fallbacks ? 4 : 3;
}

/* ---- the worker, on the progress thread (a session opened by hand) --------------------- */

typedef struct die_req {
    kvs_xfer_fetch_req req;
    unsigned at[2];  /* block, layer */
    atomic_int done; /* the fetch ended unkilled */
} die_req;

static void die_on_layer(kvs_xfer_fetch_req *r, uint32_t b, uint32_t l)
{
    const die_req *d = r->data;
    if (b == d->at[0] && l == d->at[1])
        raise(SIGKILL);
}

static void die_on_block(kvs_xfer_fetch_req *r, uint32_t b, int status)
{
    (void)r, (void)b, (void)status;
}

static void die_on_done(kvs_xfer_fetch_req *r, int status)
{
    (void)status;
    die_req *d = r->data;
    atomic_store(&d->done, 1);
}

/* Connect (client_name name, no token) with the transfer client's address;
 * the session it opened in *info and kvstashd's worker address in *out (the
 * caller frees it). 0, or 5 with the reason on stderr. */
static int connect_raw(const char *addr, const char *name, const void *wa, size_t wl,
                       kvs_xfer_session_info *info, Kvstash__V1__ConnectResponse **out)
{
    Kvstash__V1__ConnectRequest req = KVSTASH__V1__CONNECT_REQUEST__INIT;
    req.worker_address.data = (uint8_t *)wa;
    req.worker_address.len = wl;
    req.client_name = (char *)name;
    size_t n = kvstash__v1__connect_request__get_packed_size(&req);
    uint8_t *buf = malloc(n + 1);
    if (buf == NULL)
        return 5;
    kvstash__v1__connect_request__pack(&req, buf);
    uint8_t *rep = NULL;
    size_t rlen = 0;
    char det[KVS_ERR_LEN] = "";
    grpc_status_code st = kvs_itest_raw_call(addr, NULL, "/kvstash.v1.KvStash/Connect", buf, n,
                                             10000, &rep, &rlen, det, sizeof det);
    free(buf);
    Kvstash__V1__ConnectResponse *r =
        st == GRPC_STATUS_OK && rep ? kvstash__v1__connect_response__unpack(NULL, rlen, rep) : NULL;
    free(rep);
    if (r == NULL || r->session_token.len != KVS_XFER_TOKEN_LEN) {
        fprintf(stderr, KVS_DW_FLAG ": Connect: status %d %s\n", (int)st, det);
        return 5;
    }
    info->id = r->session_id;
    memcpy(info->token, r->session_token.data, KVS_XFER_TOKEN_LEN);
    *out = r;
    return 0;
}

static int die_on_progress(const char *addr, const char *name, const unsigned char (*keys)[32],
                           unsigned nb, const unsigned at[2])
{
    /* libkvstash's transports (clients/c/xfer.c) when UCX_TLS does not say */
    kvs_xfer_client_opts o = {.err_mode = KVS_XFER_ERR_PEER,
                              .timeout_ms = 30000,
                              .tls = getenv("UCX_TLS") ? NULL : KVS_XFER_TLS_SHM};
    kvs_xfer_client *xc = NULL;
    const void *wa;
    size_t wl;
    if (kvs_xfer_client_create(&o, &xc) != 0 || kvs_xfer_client_address(xc, &wa, &wl) != 0)
        return 4;
    grpc_init(); /* for kvs_itest_raw_call (kvs_itest_main's is not run here) */
    kvs_xfer_session_info info;
    Kvstash__V1__ConnectResponse *r = NULL;
    int rc = connect_raw(addr, name, wa, wl, &info, &r);
    if (rc != 0)
        return rc;
    if (kvs_xfer_client_connect(xc, r->worker_address.data, r->worker_address.len, &info) != 0)
        return 6;
    static kvs_xfer_dst dst[KVS_DW_MAX_BLOCKS];
    for (unsigned b = 0; b < nb; b++) {
        dst[b].cap = KVS_DW_BLOCK_CAP;
        if ((dst[b].buf = malloc(dst[b].cap)) == NULL)
            return 4;
    }
    static die_req d;
    d.req = (kvs_xfer_fetch_req){.format = KVS_XFER_FMT_STORED,
                                 .nblocks = nb,
                                 .keys = keys[0],
                                 .dst = dst,
                                 .on_layer = die_on_layer,
                                 .on_block = die_on_block,
                                 .on_done = die_on_done,
                                 .data = &d};
    d.at[0] = at[0];
    d.at[1] = at[1];
    if (kvs_xfer_fetch(xc, &d.req) != 0)
        return 7;
    for (int i = 0; i < 3000 && !atomic_load(&d.done); i++)
        usleep(10 * 1000);
    return 3;
}

/* ---- both sides ------------------------------------------------------------------------ */

int kvs_dw_main(int argc, char **argv, const kvs_dw_opts *o)
{
    static unsigned char keys[KVS_DW_MAX_BLOCKS][32];
    if (argc < 4 || argc - 3 > KVS_DW_MAX_BLOCKS || !kvs_dw_is_worker(argc, argv))
        return 2;
    unsigned nb = (unsigned)argc - 3;
    for (unsigned b = 0; b < nb; b++) {
        const char *h = argv[3 + b];
        if (strlen(h) != 64)
            return 2;
        for (unsigned i = 0; i < 32; i++) {
            unsigned x;
            if (sscanf(h + 2 * i, "%2x", &x) != 1)
                return 2;
            keys[b][i] = (unsigned char)x;
        }
    }
    long blk = o->block >= 0 ? o->block : (long)nb + o->block;
    if (blk < 0 || blk >= (long)nb)
        return 2;
    const unsigned at[2] = {(unsigned)blk, o->layer};
    if (o->thread == KVS_DW_ON_PROGRESS)
        return die_on_progress(argv[2], argv[0], (const unsigned char(*)[32])keys, nb, at);
    return die_on_caller(argv[2], (const unsigned char(*)[32])keys, nb, &o->ns, at);
}

int kvs_dw_spawn(const char *prog, const char *addr, const unsigned char (*keys)[32], unsigned nb)
{
    if (nb == 0 || nb > KVS_DW_MAX_BLOCKS) {
        fprintf(stderr, "%s: %u blocks for the dying worker (1..%d)\n", prog, nb,
                KVS_DW_MAX_BLOCKS);
        return 0;
    }
    char hex[KVS_DW_MAX_BLOCKS][65];
    char *args[KVS_DW_MAX_BLOCKS + 4] = {(char *)prog, KVS_DW_FLAG, (char *)addr};
    for (unsigned b = 0; b < nb; b++) {
        for (unsigned i = 0; i < 32; i++)
            snprintf(hex[b] + 2 * i, 3, "%02x", keys[b][i]);
        args[3 + b] = hex[b];
    }
    args[3 + nb] = NULL;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "%s: fork of the dying worker: %s\n", prog, strerror(errno));
        return 0;
    }
    if (pid == 0) {
        execv("/proc/self/exe", args);
        _exit(127);
    }
    int st = 0;
    if (waitpid(pid, &st, 0) != pid) {
        fprintf(stderr, "%s: waitpid of the dying worker: %s\n", prog, strerror(errno));
        return 0;
    }
    if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL)
        return 1;
    fprintf(stderr, "%s: the dying worker was not killed mid-fetch (%s %d)\n", prog,
            WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    return 0;
}
