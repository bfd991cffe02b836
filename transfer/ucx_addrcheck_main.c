/*
 * ucx_addrcheck_main.c — kvstash-ucx-addrcheck, the sacrificial process that
 * tries client worker addresses before kvstashd's own UCX sees them.
 *
 * Why: UCX 1.13 parses a worker address without a length and asserts on
 * what it does not expect (ucp_address_unpack; an 8-byte `02 00 ..` aborts
 * the process). An address comes from a Connect RPC, so any caller allowed to
 * Connect could stop the cache node with 8 bytes. Here the address is used
 * first, by a process that may die (docs/TRANSFER.md "Sessions").
 *
 * Protocol on fd 3 (a socket from the parent, ucx_addrcheck.c): requests are
 * a u32 length (8..65536) and that many bytes; each answer is a
 * kvs__ac_answer (ucx_internal.h: the status, 0 when usable, and whether this
 * helper exits after it). EOF on fd 3 ends the helper. UCX logs to stdout/stderr, which stay the
 * parent's.
 *
 * A check: an endpoint to the address with the server's error mode, wired up
 * for at most the given milliseconds (a flush completes once the lanes are
 * connected), then force-closed and its close progressed to the end. That is
 * what kvstashd's session will do with it (create, wire up, close); most
 * addresses that abort UCX do so in one of those steps (the feasibility study
 * in TRANSFER.md: 12 of 300 mutants abort at create, 6 more at wire-up or
 * close).
 *
 * Usage: kvstash-ucx-addrcheck peer|none WIREUP_MS [NET_DEVICES [TLS]]
 */
#include "kvs_error.h"
#include "ucx_internal.h"

#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#define FD        3
#define WIRE_MAX  65536u
#define CLOSE_MS  2000u
#define F_EXITING 1u

typedef struct op_state {
    int done;
    ucs_status_t st;
} op_state;

/* Static: a request that outlives its check (not completed within the
 * bounds) still writes here; the helper then exits after answering. */
static op_state g_flush, g_close;
static ucs_status_t g_ep_err = UCS_OK;

static void on_op(void *req, ucs_status_t st, void *user_data)
{
    op_state *o = user_data;
    o->st = st;
    o->done = 1;
    if (req)
        ucp_request_free(req);
}

static void on_ep_err(void *arg, ucp_ep_h ep, ucs_status_t st)
{
    (void)arg;
    (void)ep;
    g_ep_err = st;
}

/* Starts a non-blocking UCX operation whose completion lands in *o. */
static void op_start(op_state *o, ucs_status_ptr_t r)
{
    if (r == NULL) {
        o->done = 1;
        o->st = UCS_OK;
    } else if (UCS_PTR_IS_ERR(r)) {
        o->done = 1;
        o->st = UCS_PTR_STATUS(r);
    }
}

static void progress_until(ucp_worker_h w, const int *done, uint64_t deadline_ms)
{
    while (!*done && g_ep_err == UCS_OK && kvs__now_ms() < deadline_ms) {
        if (ucp_worker_progress(w) == 0)
            sched_yield();
    }
}

/* Tries one address; returns the status to answer, *exiting set when a
 * request is still pending in UCX (its state is not reusable). */
static int check(kvs__xw *xw, kvs_xfer_err_mode mode, uint32_t wire_ms, const void *addr,
                 size_t len, int *exiting)
{
    ucp_ep_h ep;
    g_ep_err = UCS_OK;
    memset(&g_flush, 0, sizeof g_flush);
    memset(&g_close, 0, sizeof g_close);
    int rc = kvs__ep_create(xw, addr, len, mode, on_ep_err, NULL, &ep);
    if (rc != 0)
        return rc;
    ucp_request_param_t p = {0};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = on_op;
    p.user_data = &g_flush;
    op_start(&g_flush, ucp_ep_flush_nbx(ep, &p));
    progress_until(xw->worker, &g_flush.done, kvs__now_ms() + wire_ms);
    /* A flush that failed, or an endpoint error: the server could not reach
     * this address either. Not wired up in time: the address parsed, the
     * session will find out. */
    ucs_status_t bad = g_flush.done && g_flush.st != UCS_OK ? g_flush.st : g_ep_err;
    if (bad != UCS_OK)
        rc = kvs__status_from_ucs_ep(bad);
    ucp_request_param_t c = {0};
    c.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    c.cb.send = on_op;
    c.user_data = &g_close;
    c.flags = UCP_EP_CLOSE_FLAG_FORCE;
    op_start(&g_close, ucp_ep_close_nbx(ep, &c));
    uint64_t until = kvs__now_ms() + CLOSE_MS;
    g_ep_err = UCS_OK; /* the close itself may report one; keep progressing */
    while ((!g_close.done || !g_flush.done) && kvs__now_ms() < until) {
        if (ucp_worker_progress(xw->worker) == 0)
            sched_yield();
    }
    if (!g_close.done || !g_flush.done)
        *exiting = 1;
    /* Unknown statuses collapse to "refused" for the caller. */
    if (rc == KVS_EIO)
        rc = KVS_EUNAVAIL;
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 3 || (strcmp(argv[1], "peer") != 0 && strcmp(argv[1], "none") != 0)) {
        fprintf(stderr,
                "usage: %s peer|none WIREUP_MS [NET_DEVICES [TLS]]\n"
                "(started by kvstashd with a socket on fd 3; docs/TRANSFER.md)\n",
                argv[0]);
        return 2;
    }
    (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
    (void)signal(SIGPIPE, SIG_IGN);
    kvs_xfer_err_mode mode = strcmp(argv[1], "peer") == 0 ? KVS_XFER_ERR_PEER : KVS_XFER_ERR_NONE;
    char *end;
    unsigned long ms = strtoul(argv[2], &end, 10);
    if (*end || ms == 0 || ms > 60000) {
        fprintf(stderr, "kvstash-ucx-addrcheck: WIREUP_MS %s: want 1..60000\n", argv[2]);
        return 2;
    }
    kvs__xw xw;
    char err[KVS_ERR_LEN] = "";
    /* the first check's answer waits for this too (the helper starts lazily) */
    alarm((unsigned)(ms / 1000u) + 7u);
    if (kvs__xw_init(&xw, 1, argc > 3 ? argv[3] : NULL, argc > 4 ? argv[4] : NULL, err) != 0) {
        fprintf(stderr, "kvstash-ucx-addrcheck: %s\n", err);
        return 1;
    }
    alarm(0);
    static unsigned char buf[WIRE_MAX];
    for (;;) {
        uint32_t len;
        if (kvs__ac_io(FD, &len, sizeof len, 0, 0) != 0)
            break; /* the parent closed the socket: done */
        if (len == 0 || len > WIRE_MAX || kvs__ac_io(FD, buf, len, 0, 0) != 0)
            return 3; /* not the parent's protocol */
        int exiting = 0;
        /* A watchdog of its own: the server gives up on an answer after the
         * wire-up time plus 5 s and kills this process, but when that server is
         * the isolated data plane its sandbox may not signal it (seccomp:
         * xproc_sandbox.c); the kernel's SIGALRM ends a wedged check anyway. */
        alarm((unsigned)(ms / 1000u) + 7u);
        kvs__ac_answer a = {.status = check(&xw, mode, (uint32_t)ms, buf, len, &exiting)};
        alarm(0);
        a.flags = exiting ? KVS__AC_EXITING : 0;
        if (kvs__ac_io(FD, &a, sizeof a, 1, 0) != 0 || exiting)
            _exit(0); /* UCX still holds a request of this check: start afresh */
    }
    kvs__xw_fini(&xw);
    return 0;
}
