/*
 * kvs_itest.c — shared helpers of the C integration tests (see kvs_itest.h).
 * A raw call or stream owns every gRPC object it creates (rpc_open) and
 * releases all of them (rpc_close: channel, queue drained to shutdown, call,
 * received buffer, metadata) before it returns, whatever the status.
 */
#include "kvs_itest.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int kvs_itest_main(int argc, char **argv, const char **kvstashd, const kvs_test_suite *suites)
{
    *kvstashd = argc > 1 ? argv[1] : getenv("KVSTASHD");
    if (*kvstashd == NULL) {
        fprintf(stderr, "usage: %s /path/to/kvstashd (or set KVSTASHD)\n", argv[0]);
        return 2;
    }
    grpc_init();
    int rc = kvs_test_run(suites);
    grpc_shutdown();
    return rc;
}

int kvs_itest_open_client(const char *addr, const char *token, int ucx, int call_timeout_ms,
                          kvs_client **out)
{
    return kvs_itest_open_client_retry(addr, token, ucx, call_timeout_ms, 0, out);
}

/* kvs_client_open of o, a failure said on stderr. */
static int open_opts(const kvs_client_opts *o, kvs_client **out)
{
    char err[KVS_ERR_LEN] = "";
    int rc = kvs_client_open(o, out, err);
    if (rc != 0)
        fprintf(stderr, "kvs_client_open(%s): %s: %s\n", o->target, kvs_strerror(rc), err);
    return rc;
}

int kvs_itest_open_client_retry(const char *addr, const char *token, int ucx, int call_timeout_ms,
                                int ucx_retry_ms, kvs_client **out)
{
    kvs_client_opts o;
    memset(&o, 0, sizeof o);
    o.target = addr;
    o.token = token;
    o.connect_timeout_ms = 5000;
    o.call_timeout_ms = call_timeout_ms;
    o.ucx = ucx;
    o.ucx_retry_ms = ucx_retry_ms;
    return open_opts(&o, out);
}

int kvs_itest_open_client_decode(const char *addr, kvs_decode_at dec, kvs_client **out)
{
    kvs_client_opts o;
    memset(&o, 0, sizeof o);
    o.target = addr;
    o.connect_timeout_ms = 5000;
    o.call_timeout_ms = 30000;
    o.decode = dec;
    return open_opts(&o, out);
}

kvs_ns kvs_itest_ns(const char *model, unsigned layers, unsigned heads, unsigned head_dim,
                    unsigned block_tokens, unsigned dtype)
{
    kvs_ns ns;
    memset(&ns, 0, sizeof ns);
    ns.model = model;
    ns.salt = "";
    ns.num_layers = layers;
    ns.num_kv_heads = heads;
    ns.head_dim = head_dim;
    ns.block_tokens = block_tokens;
    ns.dtype = dtype;
    return ns;
}

int kvs_itest_write_config(char *dir_tmpl, char *path, size_t path_len, const char *text)
{
    if (mkdtemp(dir_tmpl) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(path, path_len, "%s/kvstashd.ini", dir_tmpl);
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        perror(path);
        return 1;
    }
    int bad = fputs(text, f) < 0;
    bad |= fclose(f) != 0;
    if (bad)
        fprintf(stderr, "cannot write %s\n", path);
    return bad;
}

int kvs_itest_start(const char *kvstashd, const char *const *args, kvs_server_proc *p,
                    const char *what)
{
    char err[KVS_ERR_LEN] = "";
    if (kvs_server_proc_start(kvstashd, args, p, err) != 0) {
        fprintf(stderr, "cannot start kvstashd (%s): %s\n", what, err);
        return 1;
    }
    return 0;
}

int kvs_itest_stop(kvs_server_proc *p, int timeout_ms)
{
    int status = -1;
    double ms = 0;
    int rc = kvs_server_proc_stop(p, SIGTERM, timeout_ms, &status, &ms);
    if (rc != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "kvstashd did not exit cleanly: rc=%d status=0x%x after %.0f ms\n", rc,
                status, ms);
        return 1;
    }
    return 0;
}

/* Is the /proc/net/tcp{,6} hex address (v6: four little-endian words) loopback? */
static int hex_loopback(const char *hex, int v6)
{
    unsigned char b[16];
    size_t len = v6 ? 16 : 4;
    for (size_t i = 0; i < len; i++)
        if (sscanf(hex + 2 * i, "%2hhx", &b[i]) != 1)
            return 0;
    if (!v6)
        return b[3] == 127; /* little-endian: the first octet is the last byte */
    unsigned char a[16];    /* network order: each 32-bit word reversed */
    for (size_t w = 0; w < 4; w++)
        for (size_t j = 0; j < 4; j++)
            a[4 * w + j] = b[4 * w + 3 - j];
    static const unsigned char one[16] = {[15] = 1}, mapped[12] = {[10] = 0xff, [11] = 0xff};
    return memcmp(a, one, 16) == 0 || (memcmp(a, mapped, 12) == 0 && a[12] == 127);
}

int kvs_itest_listening_outside_loopback(int pid, char *first, size_t n)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", pid);
    DIR *d = opendir(path);
    if (d == NULL)
        return -1;
    unsigned long inodes[256];
    size_t ni = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL && ni < 256;) {
        char fd[320], link[64];
        snprintf(fd, sizeof fd, "%s/%s", path, e->d_name);
        ssize_t l = readlink(fd, link, sizeof link - 1);
        if (l > 0) {
            link[l] = '\0';
            if (sscanf(link, "socket:[%lu]", &inodes[ni]) == 1)
                ni++;
        }
    }
    closedir(d);
    int count = 0;
    if (first && n)
        first[0] = '\0';
    for (int v6 = 0; v6 <= 1; v6++) {
        snprintf(path, sizeof path, "/proc/%d/net/%s", pid, v6 ? "tcp6" : "tcp");
        FILE *f = fopen(path, "r");
        if (f == NULL)
            continue;
        char line[512], addr[40];
        unsigned port, st;
        unsigned long inode;
        while (fgets(line, sizeof line, f)) {
            if (sscanf(line, " %*d: %39[0-9A-Fa-f]:%x %*s %x %*s %*s %*s %*s %*s %lu", addr, &port,
                       &st, &inode) != 4 ||
                st != 0x0A) /* 0A: LISTEN */
                continue;
            int ours = 0;
            for (size_t i = 0; i < ni && !ours; i++)
                ours = inodes[i] == inode;
            if (!ours || hex_loopback(addr, v6))
                continue;
            if (count++ == 0 && first && n)
                snprintf(first, n, "%s:%u", addr, port);
        }
        fclose(f);
    }
    return count;
}

char *kvs_itest_setting(kvs_client *c, const char *name)
{
    const char *names[] = {name};
    kvs_config *cfg = NULL;
    char err[KVS_ERR_LEN] = "";
    if (kvs_client_get_config(c, names, 1, -1, &cfg, err) != 0 || cfg->n != 1) {
        fprintf(stderr, "\n  GetConfig %s: %s\n", name, err);
        kvs_config_free(cfg);
        return NULL;
    }
    char *v = strdup(cfg->entries[0].value);
    kvs_config_free(cfg);
    return v;
}

int kvs_itest_set_setting(kvs_client *c, const char *name, const char *value, char *err)
{
    const char *names[] = {name};
    const char *values[] = {value};
    char own[KVS_ERR_LEN] = "";
    if (err == NULL)
        err = own;
    int rc = kvs_client_set_config(c, names, values, 1, 0, -1, NULL, err);
    if (rc != 0)
        fprintf(stderr, "\n  SetConfig %s=%s: %s\n", name, value, err);
    return rc;
}

static double reloads(kvs_client *c, const char *result)
{
    return kvs_itest_stat(c, "kvstash_config_reloads_total", "result", result);
}

int kvs_itest_hup_wait(kvs_client *c, int pid, const char *result)
{
    const char *other = strcmp(result, "applied") == 0 ? "refused" : "applied";
    double from = reloads(c, result), other0 = reloads(c, other);
    if (from < 0 || other0 < 0 || kill(pid, SIGHUP) != 0)
        return -1;
    for (int i = 0; i < 1000; i++, usleep(10000))
        if (reloads(c, result) > from)
            return reloads(c, other) == other0 ? 0 : -1;
    fprintf(stderr, "\n  no %s reload after SIGHUP\n", result);
    return -1;
}

int kvs_itest_start_config(const char *kvstashd, const char *ini, kvs_server_proc *p,
                           kvs_client **client, const char *what)
{
    const char *args[] = {"--config", ini, NULL};
    if (kvs_itest_start(kvstashd, args, p, what) != 0)
        return 1;
    return kvs_itest_open_client(p->addr, NULL, 0, 30000, client) != 0;
}

int kvs_itest_stop_config(kvs_server_proc *p, kvs_client **client, const char *dir)
{
    kvs_client_close(*client);
    *client = NULL;
    int rc = kvs_itest_stop(p, 10000);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", dir);
    return rc;
}

/* ---- raw calls ---------------------------------------------------------- */

/* One call in flight: what rpc_open creates and rpc_close releases. */
typedef struct raw_rpc {
    grpc_channel *ch;
    grpc_completion_queue *cq;
    grpc_call *call;
    grpc_metadata auth; /* valid when n_md is 1 */
    size_t n_md;
    grpc_metadata_array md_in, md_trail;
    grpc_byte_buffer *recv;
    grpc_status_code status;
    grpc_slice det;
} raw_rpc;

static void rpc_open(raw_rpc *r, const char *addr, const char *token, const char *method,
                     int timeout_ms)
{
    memset(r, 0, sizeof *r);
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    r->ch = grpc_channel_create(addr, creds, NULL);
    grpc_channel_credentials_release(creds);
    r->cq = grpc_completion_queue_create_for_pluck(NULL);
    gpr_timespec deadline = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                         gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
    grpc_slice path = grpc_slice_from_copied_string(method);
    r->call = grpc_channel_create_call(r->ch, NULL, GRPC_PROPAGATE_DEFAULTS, r->cq, path, NULL,
                                       deadline, NULL);
    grpc_slice_unref(path);
    if (token != NULL) {
        char bearer[300];
        snprintf(bearer, sizeof bearer, "Bearer %s", token);
        r->auth.key = grpc_slice_from_static_string("authorization");
        r->auth.value = grpc_slice_from_copied_string(bearer);
        r->n_md = 1;
    }
    grpc_metadata_array_init(&r->md_in);
    grpc_metadata_array_init(&r->md_trail);
    r->status = GRPC_STATUS_UNKNOWN;
    r->det = grpc_empty_slice();
}

/* *op: send the initial metadata (the token, when there is one). */
static void rpc_send_md_op(raw_rpc *r, grpc_op *op)
{
    memset(op, 0, sizeof *op);
    op->op = GRPC_OP_SEND_INITIAL_METADATA;
    op->data.send_initial_metadata.count = r->n_md;
    op->data.send_initial_metadata.metadata = r->n_md ? &r->auth : NULL;
}

/* ops[0..3): the three receive ops, which complete when the status arrives. */
static void rpc_recv_ops(raw_rpc *r, grpc_op *ops)
{
    memset(ops, 0, 3 * sizeof *ops);
    ops[0].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[0].data.recv_initial_metadata.recv_initial_metadata = &r->md_in;
    ops[1].op = GRPC_OP_RECV_MESSAGE;
    ops[1].data.recv_message.recv_message = &r->recv;
    ops[2].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[2].data.recv_status_on_client.trailing_metadata = &r->md_trail;
    ops[2].data.recv_status_on_client.status = &r->status;
    ops[2].data.recv_status_on_client.status_details = &r->det;
}

/* Copies out the details and (when reply is not NULL) the reply bytes, then
 * releases everything rpc_open made; returns the call's status. */
static grpc_status_code rpc_close(raw_rpc *r, char *details, size_t n, uint8_t **reply,
                                  size_t *reply_len)
{
    if (details != NULL)
        snprintf(details, n, "%.*s", (int)GRPC_SLICE_LENGTH(r->det),
                 (const char *)GRPC_SLICE_START_PTR(r->det));
    if (reply != NULL) {
        *reply = NULL;
        *reply_len = 0;
    }
    if (r->recv != NULL) {
        if (reply != NULL) {
            grpc_byte_buffer_reader rd;
            grpc_byte_buffer_reader_init(&rd, r->recv);
            grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
            grpc_byte_buffer_reader_destroy(&rd);
            *reply_len = GRPC_SLICE_LENGTH(all);
            *reply = malloc(*reply_len + 1);
            memcpy(*reply, GRPC_SLICE_START_PTR(all), *reply_len);
            grpc_slice_unref(all);
        }
        grpc_byte_buffer_destroy(r->recv);
    }
    if (r->n_md)
        grpc_slice_unref(r->auth.value);
    grpc_slice_unref(r->det);
    grpc_metadata_array_destroy(&r->md_in);
    grpc_metadata_array_destroy(&r->md_trail);
    grpc_call_unref(r->call);
    grpc_completion_queue_shutdown(r->cq);
    while (grpc_completion_queue_pluck(r->cq, NULL, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL)
               .type != GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(r->cq);
    grpc_channel_destroy(r->ch);
    return r->status;
}

grpc_status_code kvs_itest_raw_call(const char *addr, const char *token, const char *method,
                                    const void *payload, size_t len, int timeout_ms,
                                    uint8_t **reply, size_t *reply_len, char *details, size_t n)
{
    raw_rpc r;
    rpc_open(&r, addr, token, method, timeout_ms);
    grpc_byte_buffer *send = kvs_itest_bb_from(payload, len);
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    rpc_send_md_op(&r, &ops[0]);
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    rpc_recv_ops(&r, &ops[3]);
    if (grpc_call_start_batch(r.call, ops, 6, ops, NULL) == GRPC_CALL_OK)
        grpc_completion_queue_pluck(r.cq, ops, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    grpc_byte_buffer_destroy(send);
    return rpc_close(&r, details, n, reply, reply_len);
}

grpc_status_code kvs_itest_raw_stream(const char *addr, const char *token, const char *method,
                                      grpc_byte_buffer **msgs, size_t n, int cancel_after,
                                      int timeout_ms, char *details, size_t dn)
{
    raw_rpc r;
    rpc_open(&r, addr, token, method, timeout_ms);
    grpc_op rops[3];
    rpc_recv_ops(&r, rops);
    grpc_call_start_batch(r.call, rops, 3, rops, NULL);
    grpc_op s;
    rpc_send_md_op(&r, &s);
    grpc_call_start_batch(r.call, &s, 1, &s, NULL);
    grpc_completion_queue_pluck(r.cq, &s, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) {
        if (cancel_after >= 0 && (int)i == cancel_after)
            break;
        memset(&s, 0, sizeof s);
        s.op = GRPC_OP_SEND_MESSAGE;
        s.data.send_message.send_message = msgs[i];
        grpc_call_start_batch(r.call, &s, 1, &s, NULL);
        ok = grpc_completion_queue_pluck(r.cq, &s, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL)
                 .success;
    }
    if (cancel_after >= 0) {
        usleep(100000); /* let the server take what was sent */
        grpc_call_cancel(r.call, NULL);
    } else if (ok) {
        memset(&s, 0, sizeof s);
        s.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
        grpc_call_start_batch(r.call, &s, 1, &s, NULL);
        grpc_completion_queue_pluck(r.cq, &s, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    }
    grpc_completion_queue_pluck(r.cq, rops, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    return rpc_close(&r, details, dn, NULL, NULL);
}

grpc_byte_buffer *kvs_itest_bb_from(const void *p, size_t n)
{
    grpc_slice s = grpc_slice_from_copied_buffer(p, n);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

double kvs_itest_stat(kvs_client *c, const char *name, const char *label, const char *value)
{
    kvs_stats *s = NULL;
    if (kvs_client_stats(c, name, -1, &s, NULL) != 0)
        return -1;
    const kvs_metric *m = kvs_stats_find(s, name, label, value);
    double v = m ? (m->kind == KVS_METRIC_HISTOGRAM ? (double)m->count : m->value) : -1;
    kvs_stats_free(s);
    return v;
}

void kvs_itest_fill_fp16(uint16_t *p, size_t n, uint64_t seed)
{
    uint64_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        p[i] = (uint16_t)(((s >> 20) & 0x8000u) | ((13u + ((s >> 30) & 3u)) << 10) |
                          ((s >> 40) & 0x3FFu));
    }
}
