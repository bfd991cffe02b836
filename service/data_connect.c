/*
 * data_connect.c — the UCX data plane inside kvstashd: the kvs_xfer_server
 * (transfer/xfer.h), its store callbacks, the Connect RPC and its figures.
 *
 * The idea: gRPC stays the control plane. Connect trades the worker's UCX
 * address for ours plus a session (id, random token) bound to the caller's
 * tenant; the worker then fetches blocks over UCX, layer by layer, straight
 * into its buffers.
 *
 * Invariants (the same rules as data_get.c):
 *   - a block is served only to a session of the tenant that stored it; any
 *     other block answers KVS_ENOTFOUND, exactly like one that does not exist
 *     (UCX requests carry no namespace, so the tenant is the boundary here;
 *     chain keys also commit to the tenant's secret, DESIGN §2);
 *   - the stored format (EGRESS_STORED) is lent straight from the store under
 *     a read reference (kvs_store_read) held until the transfer releases it;
 *   - the other egress formats (1..4) are rendered through the codec into a
 *     buffer this file owns: a 16-byte header (RHDR below), then layer by layer
 *     [K][V] (format 4 adds the fp32 k_scale and v_scale after V); the store
 *     reference is dropped at once.
 *     libkvstash (clients/c/xfer.c) reads the same layout;
 *   - puts over UCX are refused (KVS_EUNIMPL): Put goes over gRPC.
 *   - the session's tenant pointer lives in the tenant table, which lives from
 *     start to stop; the xfer server is destroyed before the table and store.
 * The store callbacks run on the xfer server's progress thread; the store has
 * its own lock. A read that promotes a block from the SSD tier does its I/O on
 * that thread (it stalls other UCX sessions for that long).
 */
#include "codec.h"
#include "data_int.h"
#include "kvs_log.h"
#include "xfer.h"

#include <stdlib.h>
#include <string.h>

#define MOD "ucx"

/* One provided block: a store reference (stored format) or a rendered copy. */
typedef struct lent {
    kvs_store *store;
    kvs_store_ref ref;
    int have_ref;
    void *buf;        /* rendered formats */
    uint64_t *bounds; /* layers + 1 */
} lent;

static void lent_free(lent *l)
{
    if (l->have_ref)
        kvs_store_read_release(l->store, &l->ref);
    free(l->buf);
    free(l->bounds);
    free(l);
}

/* A rendered block starts with 16 bytes: magic, layers, per-layer bytes (64-bit,
 * low word first), as uint32 in host order (little-endian hosts; clients/c/xfer.c
 * reads the same), so a worker can check the layout with layer 0 and use each
 * layer as it lands. */
#define RHDR_MAGIC 0x5253564Bu /* "KVSR" */
#define RHDR_LEN 16u

static int render(lent *l, uint32_t fmt, kvs_xfer_block_src *src)
{
    kvs_codec_info ci;
    char err[KVS_ERR_LEN] = "";
    if (kvs_codec_block_info(l->ref.data, l->ref.size, &ci, err) != 0)
        return KVS_EFORMAT;
    size_t bytes = kvs_codec_egress_bytes(ci.block_tokens, ci.heads, ci.head_dim, fmt);
    if (bytes == 0)
        return KVS_EINVAL;
    size_t per = 2 * bytes + (fmt == 4 ? 2 * sizeof(float) : 0);
    if ((l->buf = malloc(RHDR_LEN + per * ci.layers)) == NULL ||
        (l->bounds = malloc((ci.layers + 1u) * sizeof *l->bounds)) == NULL)
        return KVS_ENOMEM;
    uint8_t *p = (uint8_t *)l->buf + RHDR_LEN;
    uint32_t hdr[4] = {RHDR_MAGIC, ci.layers, (uint32_t)per, (uint32_t)(per >> 32)};
    memcpy(l->buf, hdr, RHDR_LEN);
    for (uint32_t li = 0; li < ci.layers; li++) {
        const void *k, *v;
        size_t kl, vl;
        float ks = 0, vs = 0;
        uint8_t *kb = p + (size_t)li * per, *vb = kb + bytes;
        int rc = kvs_codec_egress_layer(l->ref.data, l->ref.size, li, fmt, kb, vb, &k, &kl, &v,
                                        &vl, &ks, &vs, err);
        if (rc != 0)
            return rc;
        if (kl != bytes || vl != bytes)
            return KVS_EINTERNAL;
        if (fmt == 4) {
            memcpy(vb + bytes, &ks, sizeof ks);
            memcpy(vb + bytes + sizeof ks, &vs, sizeof vs);
        }
        l->bounds[li] = li ? RHDR_LEN + (uint64_t)li * per : 0; /* layer 0 carries the header */
    }
    l->bounds[ci.layers] = RHDR_LEN + (uint64_t)ci.layers * per;
    kvs_store_read_release(l->store, &l->ref);
    l->have_ref = 0;
    src->bytes = l->buf;
    src->len = RHDR_LEN + (uint64_t)ci.layers * per;
    src->layers = ci.layers;
    src->bounds = l->bounds;
    return 0;
}

static int provide(void *ctx, void *session_data, const uint8_t key[KVS_XFER_KEY_LEN],
                   uint32_t fmt, kvs_xfer_block_src *src)
{
    kvs_server *s = ctx;
    const kvs_tenant *t = session_data;
    if (fmt > 4)
        return KVS_EINVAL;
    lent *l = calloc(1, sizeof *l);
    if (l == NULL)
        return KVS_ENOMEM;
    l->store = s->store;
    kvs_key k;
    memcpy(k.b, key, KVS_KEY_LEN);
    int rc = kvs_store_read(s->store, &k, &l->ref);
    if (rc != 0) {
        free(l);
        return rc;
    }
    l->have_ref = 1;
    if (l->ref.tenant != t->id) {
        lent_free(l);
        return KVS_ENOTFOUND; /* not this tenant's: as if absent */
    }
    memset(src, 0, sizeof *src);
    if (fmt == KVS_XFER_FMT_STORED) {
        src->bytes = l->ref.data;
        src->len = l->ref.size;
    } else if ((rc = render(l, fmt, src)) != 0) {
        lent_free(l);
        return rc;
    }
    src->ref = l; /* counted by the xfer server (kvstash_xfer_*), not in Get's figures */
    return 0;
}

static void release(void *ctx, void *ref)
{
    (void)ctx;
    lent_free(ref);
}

void kvs__xfer_start(kvs_server *s)
{
    kvs_config cfg;
    pthread_rwlock_rdlock(&s->cfg_lock);
    cfg = s->cfg;
    pthread_rwlock_unlock(&s->cfg_lock);
    if (!cfg.ucx) {
        KVS_LOG_INFO(MOD, "UCX data plane off (ucx = off): Connect answers UNIMPLEMENTED");
        return;
    }
    kvs_xfer_server_opts o = {
        .ops = {.ctx = s, .provide = provide, .release = release},
        .err_mode = KVS_XFER_ERR_PEER,
        .op_timeout_ms = (uint32_t)cfg.ucx_op_timeout_ms,
    };
    int rc = kvs_xfer_server_create(&o, &s->xfer);
    if (rc != 0) {
        s->xfer = NULL;
        KVS_LOG_WARN(MOD, "UCX data plane cannot start (%s): serving gRPC only",
                     kvs_strerror(rc));
        return;
    }
    KVS_LOG_INFO(MOD, "UCX data plane up (op timeout %lld ms)", (long long)cfg.ucx_op_timeout_ms);
}

void kvs__xfer_stop(kvs_server *s)
{
    if (s->xfer == NULL)
        return;
    kvs_xfer_server_destroy(s->xfer);
    s->xfer = NULL;
}

/* ---- Connect ------------------------------------------------------------- */

/* UCX parses worker addresses without a length: transfer/ checks 8..65536. */
#define ADDR_MAX 65536u

void kvs__do_connect(kvs__call *c, const ProtobufCMessage *m)
{
    const Kvstash__V1__ConnectRequest *req = (const void *)m;
    kvs_server *s = c->srv;
    if (s->xfer == NULL) {
        kvs__call_fail(c, GRPC_STATUS_UNIMPLEMENTED,
                       "data plane disabled (ucx = off, or UCX failed to start): use Get");
        return;
    }
    if (req->worker_address.len == 0) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "worker_address: required");
        return;
    }
    if (req->worker_address.len > ADDR_MAX) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "worker_address: %zu bytes (max %u)",
                       req->worker_address.len, ADDR_MAX);
        return;
    }
    kvs_config cfg;
    kvs__config_snapshot(c, &cfg);
    kvs_xfer_server_stats st;
    if (kvs_xfer_server_stats_get(s->xfer, &st) == 0 &&
        st.sessions >= (uint64_t)cfg.ucx_max_sessions) {
        kvs__call_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED,
                       "%llu UCX sessions open (ucx_max_sessions %lld): use Get, or retry "
                       "when a worker has gone",
                       (unsigned long long)st.sessions, (long long)cfg.ucx_max_sessions);
        return;
    }
    kvs_xfer_session_info info;
    int rc = kvs_xfer_server_session_open(s->xfer, req->worker_address.data,
                                          req->worker_address.len, (void *)c->tenant, &info);
    if (rc == KVS_EINVAL) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT,
                       "worker_address: not a usable UCX worker address");
        return;
    }
    if (rc != 0) {
        kvs__call_fail(c, kvs__grpc_from_status(rc), "cannot open a UCX session: %s",
                       kvs_strerror(rc));
        return;
    }
    const void *addr;
    size_t alen;
    if ((rc = kvs_xfer_server_address(s->xfer, &addr, &alen)) != 0) {
        (void)kvs_xfer_server_session_close(s->xfer, info.id);
        kvs__call_fail(c, GRPC_STATUS_INTERNAL, "no UCX address: %s", kvs_strerror(rc));
        return;
    }
    KVS_LOG_DEBUG(MOD, "session %llu for tenant %s (%.64s)", (unsigned long long)info.id,
                  c->tenant->name, req->client_name ? req->client_name : "");
    Kvstash__V1__ConnectResponse r = KVSTASH__V1__CONNECT_RESPONSE__INIT;
    r.worker_address.data = (uint8_t *)addr;
    r.worker_address.len = alen;
    r.session_token.data = info.token;
    r.session_token.len = sizeof info.token;
    r.session_id = info.id;
    kvs__call_reply(c, &r.base);
}

/* ---- Stats --------------------------------------------------------------- */

int kvs__xfer_collect(kvs_server *s, kvs_metric_set *set)
{
    kvs_xfer_server_stats st;
    memset(&st, 0, sizeof st);
    if (s->xfer != NULL && kvs_xfer_server_stats_get(s->xfer, &st) != 0)
        return 0;
    struct {
        const char *name, *help;
        kvs_metric_type type;
        uint64_t v;
    } g[] = {
        {"kvstash_xfer_enabled", "1 when the UCX data plane is serving", KVS_MT_GAUGE,
         s->xfer != NULL},
        {"kvstash_xfer_sessions", "UCX sessions open", KVS_MT_GAUGE, st.sessions},
        {"kvstash_xfer_fetch_requests_total", "UCX fetch requests", KVS_MT_COUNTER,
         st.fetch_requests},
        {"kvstash_xfer_blocks_sent_total", "blocks fully delivered over UCX", KVS_MT_COUNTER,
         st.blocks_sent},
        {"kvstash_xfer_bytes_sent_total", "bytes sent over UCX", KVS_MT_COUNTER, st.bytes_sent},
        {"kvstash_xfer_blocks_failed_total", "UCX blocks not found, refused or aborted",
         KVS_MT_COUNTER, st.blocks_failed},
        {"kvstash_xfer_auth_failures_total", "UCX requests with a wrong session id or token",
         KVS_MT_COUNTER, st.auth_failures},
        {"kvstash_xfer_proto_errors_total", "malformed UCX requests", KVS_MT_COUNTER,
         st.proto_errors},
        {"kvstash_xfer_peer_failures_total", "UCX sessions closed by an endpoint error",
         KVS_MT_COUNTER, st.peer_failures},
        {"kvstash_xfer_timeouts_total", "UCX sessions closed by ucx_op_timeout_ms",
         KVS_MT_COUNTER, st.timeouts},
        {"kvstash_xfer_refs_held", "blocks lent to UCX sends not yet released", KVS_MT_GAUGE,
         st.refs_held},
        {"kvstash_xfer_orphans", "UCX requests left pending after a force close", KVS_MT_GAUGE,
         st.orphans},
    };
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++)
        if (!kvs_metric_add(set, g[i].name, g[i].help, g[i].type, (double)g[i].v, 0))
            return KVS_ENOMEM;
    return 0;
}
