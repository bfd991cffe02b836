/*
 * data_put.c — Put (client streaming): a PutHeader, then one LayerPayload per
 * layer; the block is quantized on ingest and becomes visible on commit.
 *
 * The flow: the header is checked completely (namespace, tokens, parent,
 * claimed key; kvs_store_write_check refuses what no eviction could fit:
 * more than the tenant's quota or the memory tier) and the encoded block is
 * staged in memory outside the store (at most a quarter of the capacity for
 * all Puts together, beyond which RESOURCE_EXHAUSTED), with its block header
 * written (kvs_codec_begin). Layers must arrive in order with exactly the
 * layout's byte count; their bytes are taken over from the unpacked message
 * (no copy) and handed to the ingest pool at once, which quantizes each
 * layer straight into its place in the staged block and measures its error
 * by decoding it — so layer i is quantized while layer i+1 is still on the
 * wire, and a raw layer is freed as soon as it is encoded. When the client
 * half-closes and every layer job is done, the whole block is checked (every
 * tile checksum), and only then is room made in the store
 * (kvs__put_commit: write_begin, which may evict, a copy, the commit) and
 * the call answered. So a Put that ends early has evicted nothing: until
 * 2026-11-30 the header reserved (and evicted) at once, and header-only
 * streams could empty the cache (msg_fuzz_grpcio put_header_evicts).
 *
 * Concurrency: layer jobs run on pool threads while the call's own thread
 * receives more layers. They share the put_state, which is reference counted
 * (the call holds one reference, each job one) and whose job counters are
 * guarded by mu. Jobs never touch the call unless on_end has already parked
 * it (KVS__PENDING): then the job that finishes last completes the Put and
 * resumes the call. A client cancel frees the call while jobs may still run;
 * the last reference aborts the reservation after the jobs have stopped
 * writing into it.
 *
 * Invariant: a staged block is either committed or released exactly once — a
 * cancelled, malformed or failed stream leaves nothing in the store, and its
 * staged bytes are freed (Stats: kvstash_put_staged_bytes).
 */
#include "codec.h"
#include "data_int.h"
#include "pool.h"
#include "profiles.h"
#include "trace_rec.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct put_state {
    kvs__call *call; /* valid while the call lives (see above) */
    kvs_data_stats *data;
    pthread_mutex_t mu;     /* guards refs, jobs_out, ended, failed, fail_* */
    int refs;               /* the call's + one per layer job in flight */
    int jobs_out;
    int ended;              /* on_end parked the call: the last job completes it */
    int failed;
    grpc_status_code fail_code;
    char fail_msg[KVS_ERR_LEN];
    int have_header;
    kvs__put_hdr hd;        /* the checked header and its reservation (data_int.h) */
    uint32_t next_layer;
} put_state;

/* Drops one reference; the last one aborts an uncommitted reservation and frees. */
static void put_unref(put_state *ps)
{
    pthread_mutex_lock(&ps->mu);
    int last = --ps->refs == 0;
    pthread_mutex_unlock(&ps->mu);
    if (!last)
        return;
    kvs__put_hdr_release(ps->data, &ps->hd);
    pthread_mutex_destroy(&ps->mu);
    free(ps);
}

void kvs__put_hdr_release(kvs_data_stats *data, kvs__put_hdr *hd)
{
    if (hd->buf) {
        if (!hd->committed)
            atomic_fetch_add_explicit(&data->put_aborted, 1, memory_order_relaxed);
        atomic_fetch_sub_explicit(&data->put_staged_bytes, hd->block_bytes, memory_order_relaxed);
        free(hd->buf);
        hd->buf = NULL;
    }
    free(hd->k_err);
    free(hd->v_err);
    free(hd->k_ts);
    free(hd->v_ts);
    free(hd->tokens);
    free(hd->schemes);
    free(hd->model);
    free(hd->salt);
    memset(hd, 0, sizeof *hd);
}

/* The call is being freed: from now on no job may touch it. */
static void put_cleanup(kvs__call *c)
{
    put_state *ps = c->stream;
    if (ps == NULL)
        return;
    c->stream = NULL;
    pthread_mutex_lock(&ps->mu);
    ps->call = NULL;
    pthread_mutex_unlock(&ps->mu);
    put_unref(ps);
}

static char *dup_str(const char *s)
{
    size_t n = strlen(s ? s : "") + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s ? s : "", n);
    return d;
}

static int oom(kvs__call *c)
{
    kvs__call_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return -1;
}

/* The model rule names a profile: its per-tensor scales into hd->lay when the
 * namespace has the profile's shape (layers, kv heads, head_dim), else the
 * block keeps dynamic scales, counted and logged once per rule (profiles.h).
 * The set is read under the config lock: a SetConfig may have replaced the
 * rules since this Put's snapshot, and then the rule has no profile here (or
 * the new one's): the block gets what the server holds now. 0, or -1 out of
 * memory. */
static int put_profile(kvs__call *c, const kvs_config_rule *mrule, kvs__put_hdr *hd)
{
    kvs_server *s = c->srv;
    uint32_t L = hd->lay.layers;
    hd->k_ts = malloc(L * sizeof *hd->k_ts);
    hd->v_ts = malloc(L * sizeof *hd->v_ts);
    if (!hd->k_ts || !hd->v_ts)
        return -1;
    kvs_profiles_shape shape = {L, hd->lay.heads, hd->lay.head_dim};
    char why[KVS_ERR_LEN] = "";
    int first = 0;
    pthread_rwlock_rdlock(&s->cfg_lock);
    int r = kvs_profiles_scales(s->profiles, mrule->subject, &shape, hd->schemes, hd->k_ts,
                                hd->v_ts, &first, why);
    pthread_rwlock_unlock(&s->cfg_lock);
    if (r == KVS_PROFILES_APPLIED) {
        hd->lay.k_tensor_scales = hd->k_ts;
        hd->lay.v_tensor_scales = hd->v_ts;
        atomic_fetch_add_explicit(&s->data.put_profile_applied, 1, memory_order_relaxed);
    } else if (r == KVS_PROFILES_MISMATCH) {
        atomic_fetch_add_explicit(&s->data.put_profile_mismatch, 1, memory_order_relaxed);
        if (first)
            KVS_LOG_WARN("put",
                         "%s (logged once per rule; counted in "
                         "kvstash_put_profile_blocks_total{result=\"shape_mismatch\"})",
                         why);
    }
    return 0;
}

/* The store's view of hd's block. */
static void put_of(const kvs__put_hdr *hd, kvs_store_put *p)
{
    memset(p, 0, sizeof *p);
    p->key = &hd->key;
    p->parent = hd->root ? NULL : &hd->parent;
    p->ns_id = hd->ns.ns_id;
    p->tenant = hd->ns.tenant->id;
    p->tokens = hd->tokens;
    p->n_tokens = hd->lay.block_tokens;
    p->size = hd->block_bytes;
}

/* hd->buf: block_bytes of memory outside the store, counted in
 * put_staged_bytes. KVS_ENOSPC when other Puts already hold a quarter of the
 * capacity the server started with (one Put alone is always admitted). */
static int stage(kvs_server *s, kvs__put_hdr *hd)
{
    uint64_t limit = (uint64_t)s->capacity_at_start / 4;
    uint64_t before = atomic_fetch_add(&s->data.put_staged_bytes, hd->block_bytes);
    if (before > 0 && before + hd->block_bytes > limit) {
        atomic_fetch_sub(&s->data.put_staged_bytes, hd->block_bytes);
        return KVS_ENOSPC;
    }
    size_t n = (size_t)(hd->block_bytes + 63) & ~(size_t)63;
    if ((hd->buf = aligned_alloc(64, n)) == NULL) {
        atomic_fetch_sub(&s->data.put_staged_bytes, hd->block_bytes);
        return KVS_ENOMEM;
    }
    return 0;
}

int kvs__put_commit(kvs_server *s, kvs__put_hdr *hd)
{
    kvs_store_put p;
    put_of(hd, &p);
    kvs_store_wr *wr;
    void *buf;
    hd->committed = 1;
    int rc = kvs_store_write_begin(s->store, &p, &wr, &buf);
    if (rc == 0) {
        memcpy(buf, hd->buf, hd->block_bytes);
        rc = kvs_store_write_commit(s->store, wr);
    }
    if (rc != 0 && rc != KVS_EEXIST)
        atomic_fetch_add_explicit(&s->data.put_aborted, 1, memory_order_relaxed);
    return rc;
}

int kvs__put_header(kvs__call *c, const Kvstash__V1__PutHeader *h, kvs__put_hdr *hd)
{
    kvs_server *s = c->srv;
    if (kvs__ns_resolve(c, h->ns, &hd->ns) != 0)
        return -1;
    /* Keep the namespace strings beyond this message. */
    hd->model = dup_str(h->ns->model);
    hd->salt = dup_str(h->ns->salt);
    if (!hd->model || !hd->salt)
        return oom(c);
    hd->ns.desc.model = hd->model;
    hd->ns.desc.salt = hd->salt;
    const kvs_ns_desc *d = &hd->ns.desc;
    uint32_t T = d->block_tokens;
    if (h->n_tokens != T) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT,
                       "header.tokens: %zu token ids; a block holds block_tokens = %u", h->n_tokens,
                       T);
        return -1;
    }
    hd->root = h->parent_key.len == 0;
    if (hd->root != (h->index == 0)) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT,
                       hd->root ? "header.parent_key: empty, but index %u > 0 needs its parent"
                                : "header.parent_key: set, but index %u is a root (must be empty)",
                       h->index);
        return -1;
    }
    if (!hd->root) {
        if (kvs__key_parse(c, &h->parent_key, "header.parent_key", 0, &hd->parent) != 0)
            return -1;
        kvs_store_info pinfo;
        if (!kvs__block_owned(c, &hd->ns, &hd->parent, &pinfo)) {
            kvs__call_fail(c, GRPC_STATUS_FAILED_PRECONDITION,
                           "header.parent_key: the parent block is not cached (put the chain "
                           "from its root)");
            return -1;
        }
        if (pinfo.depth + 1 != h->index) { /* a root has depth 0 */
            kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT,
                           "header.index: %u, but parent_key is block %u of its prompt", h->index,
                           pinfo.depth);
            return -1;
        }
    }
    int rc = hd->root ? kvs_key_root(d, hd->ns.tenant->secret, hd->ns.tenant->secret_len,
                                     h->tokens, &hd->key)
                      : kvs_key_next(&hd->parent, h->tokens, T, &hd->key);
    if (rc != 0) {
        kvs__call_fail(c, kvs__grpc_from_status(rc), "header: cannot compute the key: %s",
                       kvs_strerror(rc));
        return -1;
    }
    if (h->key.len != 0) {
        kvs_key claimed;
        if (kvs__key_parse(c, &h->key, "header.key", 0, &claimed) != 0)
            return -1;
        if (memcmp(claimed.b, hd->key.b, KVS_KEY_LEN) != 0) {
            kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT,
                           "header.key: does not match the chain key of parent_key and tokens");
            return -1;
        }
    }

    kvs_config cfg;
    kvs__config_snapshot(c, &cfg);
    unsigned scheme = (unsigned)h->scheme;
    if (scheme > 4) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "header.scheme: %u is not a Scheme",
                       scheme);
        return -1;
    }
    /* Precedence (docs/OPERATIONS.md "Schemes per model and tenant"): an fp16
     * fallback of the tenant's or the model's rule; else the request's scheme;
     * else the model rule's, the tenant rule's, default_scheme, the first set.
     * Skip layers of the server, the tenant rule and the model rule are fp16.
     * Key offsets: the model rule's key_offsets when it has one, else the
     * server's. The rules come from this Put's config snapshot, so a
     * SetConfig applies from the next Put on. */
    kvs_config_rule trule, mrule;
    int has_t = kvs_config_tenant_rule(&cfg, hd->ns.tenant->name, &trule);
    int has_m = kvs_config_model_rule(&cfg, d->model, d->model_len, &mrule);
    if (scheme == 0)
        scheme = has_m && mrule.scheme   ? mrule.scheme
                 : has_t && trule.scheme ? trule.scheme
                                         : (unsigned)cfg.default_scheme + 1;
    if ((has_t && trule.fp16 == 1) || (has_m && mrule.fp16 == 1))
        scheme = 1;
    uint32_t L = d->num_layers;
    hd->tokens = malloc(T * sizeof *hd->tokens);
    hd->schemes = malloc(L);
    hd->k_err = calloc(L, sizeof *hd->k_err);
    hd->v_err = calloc(L, sizeof *hd->v_err);
    if (!hd->tokens || !hd->schemes || !hd->k_err || !hd->v_err)
        return oom(c);
    memcpy(hd->tokens, h->tokens, T * sizeof *hd->tokens);
    for (uint32_t l = 0; l < L; l++)
        hd->schemes[l] = kvs_config_layer_listed(cfg.skip_layers, l) ||
                                 (has_t && kvs_config_layer_listed(trule.skip_layers, l)) ||
                                 (has_m && kvs_config_layer_listed(mrule.skip_layers, l))
                             ? 1
                             : (uint8_t)scheme;
    hd->lay.layers = L;
    hd->lay.heads = d->num_kv_heads;
    hd->lay.head_dim = d->head_dim;
    hd->lay.block_tokens = T;
    hd->lay.dtype = (unsigned)d->dtype;
    hd->lay.root = hd->root;
    hd->lay.k_outliers = (uint32_t)cfg.k_outliers;
    hd->lay.v_outliers = (uint32_t)cfg.v_outliers;
    hd->lay.sinks = (uint32_t)cfg.sinks;
    hd->lay.key_offsets =
        has_m && mrule.key_offsets >= 0 ? mrule.key_offsets : cfg.key_offsets != 0;
    hd->lay.schemes = hd->schemes;
    if (has_m && mrule.profile[0] != '\0' && put_profile(c, &mrule, hd) != 0)
        return oom(c);
    hd->layer_bytes = kvs_codec_layer_bytes(&hd->lay);
    if ((int64_t)hd->layer_bytes * 2 + 4096 > cfg.max_message_bytes) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT,
                       "ns.layout: one layer is %zu bytes of K and as much of V, more than "
                       "max_message_bytes %lld allows in one message",
                       hd->layer_bytes, (long long)cfg.max_message_bytes);
        return -1;
    }
    char err[KVS_ERR_LEN] = "";
    hd->block_bytes = kvs_codec_block_size(&hd->lay, err);
    if (hd->block_bytes == 0) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "ns.layout: %s", err);
        return -1;
    }

    kvs_store_put p;
    put_of(hd, &p);
    rc = kvs_store_write_check(s->store, &p);
    switch (rc) {
    case 0:
        if ((rc = stage(s, hd)) == KVS_ENOSPC) {
            kvs__call_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED,
                           "%llu bytes of other Puts are being received and quantized (at most "
                           "a quarter of the %lld-byte capacity): retry",
                           (unsigned long long)atomic_load(&s->data.put_staged_bytes),
                           (long long)s->capacity_at_start);
            return -1;
        }
        if (rc != 0)
            return oom(c);
        if ((rc = kvs_codec_begin(&hd->lay, hd->buf, hd->block_bytes, err)) != 0) {
            kvs__call_fail(c, GRPC_STATUS_INTERNAL, "block header: %s", err);
            return -1; /* cleanup releases the staging */
        }
        return 0;
    case KVS_EEXIST:
        hd->present = 1;
        return 0;
    case KVS_EPRECOND:
        kvs__call_fail(c, GRPC_STATUS_FAILED_PRECONDITION,
                       "header.parent_key: the parent block is not cached");
        return -1;
    case KVS_ENOSPC:
        kvs__call_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED,
                       "no room for a block of %llu bytes: more than tenant %s's quota (%llu "
                       "bytes) or than the store's memory tier",
                       (unsigned long long)hd->block_bytes, hd->ns.tenant->name,
                       (unsigned long long)(has_t && trule.has_quota ? trule.quota : 0));
        return -1;
    case KVS_EINVAL:
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT,
                       "header: the key is cached with other tokens or another parent");
        return -1;
    default:
        kvs__call_fail(c, kvs__grpc_from_status(rc), "store: %s", kvs_strerror(rc));
        return -1;
    }
}

static int submit_layer(kvs__call *c, put_state *ps, Kvstash__V1__LayerPayload *lp);

static int put_on_msg(kvs__call *c, const ProtobufCMessage *m)
{
    Kvstash__V1__PutRequest *req = (Kvstash__V1__PutRequest *)m; /* we take its bytes */
    put_state *ps = c->stream;
    if (ps == NULL) {
        if ((ps = calloc(1, sizeof *ps)) == NULL)
            return oom(c);
        pthread_mutex_init(&ps->mu, NULL);
        ps->refs = 1;
        ps->call = c;
        ps->data = &c->srv->data;
        c->stream = ps;
    }
    if (req->msg_case == KVSTASH__V1__PUT_REQUEST__MSG_HEADER) {
        if (ps->have_header) {
            kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "header: sent twice");
            return -1;
        }
        ps->have_header = 1;
        return kvs__put_header(c, req->header, &ps->hd);
    }
    if (req->msg_case != KVSTASH__V1__PUT_REQUEST__MSG_LAYER) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "PutRequest: neither header nor layer");
        return -1;
    }
    if (!ps->have_header) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT,
                       "layer: the first message of a Put must be its header");
        return -1;
    }
    Kvstash__V1__LayerPayload *lp = req->layer;
    if (ps->next_layer >= ps->hd.lay.layers) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT,
                       "layer %u: the layout has only %u layers", lp->layer, ps->hd.lay.layers);
        return -1;
    }
    if (lp->layer != ps->next_layer) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT,
                       "layer: got layer %u, expected %u (layers go in order)", lp->layer,
                       ps->next_layer);
        return -1;
    }
    if (lp->k.len != ps->hd.layer_bytes || lp->v.len != ps->hd.layer_bytes) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT,
                       "layer %u: k has %zu bytes and v %zu; the layout needs %zu each "
                       "([block_tokens][num_kv_heads][head_dim] of dtype)",
                       lp->layer, lp->k.len, lp->v.len, ps->hd.layer_bytes);
        return -1;
    }
    atomic_fetch_add_explicit(&c->srv->data.ingest_bytes, 2 * ps->hd.layer_bytes,
                              memory_order_relaxed);
    if (!ps->hd.present && submit_layer(c, ps, lp) != 0)
        return -1;
    ps->next_layer++;
    return 0;
}

static void reply(kvs__call *c, put_state *ps, uint64_t stored, int present)
{
    if (c->srv->trace) /* --record-trace (trace_rec.h) */
        kvs_trace_rec_put(c->srv->trace, ps->hd.key.b, ps->hd.root ? NULL : ps->hd.parent.b,
                          ps->hd.ns.desc.block_tokens);
    Kvstash__V1__PutResponse r = KVSTASH__V1__PUT_RESPONSE__INIT;
    r.key.data = ps->hd.key.b;
    r.key.len = KVS_KEY_LEN;
    r.stored_bytes = stored;
    r.already_present = present;
    Kvstash__V1__LayerQuality *q = NULL, **qp = NULL;
    if (!present) {
        q = calloc(ps->hd.lay.layers, sizeof *q);
        qp = calloc(ps->hd.lay.layers, sizeof *qp);
        if (!q || !qp) {
            free(q);
            free(qp);
            kvs__call_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
            return;
        }
        for (uint32_t l = 0; l < ps->hd.lay.layers; l++) {
            kvstash__v1__layer_quality__init(&q[l]);
            q[l].layer = l;
            q[l].scheme = (Kvstash__V1__Scheme)ps->hd.schemes[l];
            q[l].k_rel_error = ps->hd.k_err[l];
            q[l].v_rel_error = ps->hd.v_err[l];
            qp[l] = &q[l];
        }
        r.quality = qp;
        r.n_quality = ps->hd.lay.layers;
    }
    kvs__call_reply(c, &r.base);
    free(q);
    free(qp);
}

/* Checks the finished block, commits it and answers the call (not resumed
 * here). Runs once, when the stream ended and no layer job is left. */
static void complete(kvs__call *c, put_state *ps)
{
    kvs_server *s = c->srv;
    char err[KVS_ERR_LEN] = "";
    if (ps->failed) {
        kvs__call_fail(c, ps->fail_code, "%s", ps->fail_msg);
        return;
    }
    if (kvs__call_expired(c)) {
        kvs__call_fail(c, GRPC_STATUS_DEADLINE_EXCEEDED, "Put: deadline passed during ingest");
        return;
    }
    if (kvs_codec_finish(ps->hd.buf, ps->hd.block_bytes, err) != 0) {
        kvs__call_fail(c, GRPC_STATUS_INTERNAL, "quantize on ingest: block check: %s", err);
        return;
    }
    int rc = kvs__put_commit(s, &ps->hd);
    if (rc == KVS_EEXIST) {
        kvs_store_info info;
        uint64_t size = kvs_store_info_get(s->store, &ps->hd.key, &info) == 0 ? info.size : 0;
        atomic_fetch_add_explicit(&s->data.put_present, 1, memory_order_relaxed);
        reply(c, ps, size, 1);
    } else if (rc == KVS_EPRECOND) {
        kvs__call_fail(c, GRPC_STATUS_FAILED_PRECONDITION,
                       "header.parent_key: the parent block was evicted while the Put streamed");
    } else if (rc == KVS_ENOSPC) {
        kvs__call_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED,
                       "no room for a block of %llu bytes: tenant %s's quota or the store's "
                       "capacity, with nothing evictable",
                       (unsigned long long)ps->hd.block_bytes, ps->hd.ns.tenant->name);
    } else if (rc != 0) {
        kvs__call_fail(c, kvs__grpc_from_status(rc), "store commit: %s", kvs_strerror(rc));
    } else {
        for (uint32_t l = 0; l < ps->hd.lay.layers; l++) {
            kvs_data_stats_qerr(&s->data, l, 0, ps->hd.k_err[l]);
            kvs_data_stats_qerr(&s->data, l, 1, ps->hd.v_err[l]);
        }
        atomic_fetch_add_explicit(&s->data.put_blocks, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->data.stored_bytes, ps->hd.block_bytes, memory_order_relaxed);
        reply(c, ps, ps->hd.block_bytes, 0);
    }
}

typedef struct layer_job {
    put_state *ps;
    uint32_t layer;
    void *k, *v; /* owned: taken from the message */
} layer_job;

/* A pool job: one layer into its tiles, its error measured. */
static void encode_layer(void *arg)
{
    layer_job *j = arg;
    put_state *ps = j->ps;
    char err[KVS_ERR_LEN] = "";
    int rc = kvs_codec_encode_layer(KVS_CODEC_INGEST, &ps->hd.lay, j->layer, j->k, j->v, ps->hd.buf,
                                    ps->hd.block_bytes, &ps->hd.k_err[j->layer],
                                    &ps->hd.v_err[j->layer], err);
    free(j->k);
    free(j->v);
    pthread_mutex_lock(&ps->mu);
    if (rc != 0 && !ps->failed) {
        ps->failed = 1;
        ps->fail_code = rc == KVS_EINVAL ? GRPC_STATUS_INVALID_ARGUMENT : GRPC_STATUS_INTERNAL;
        snprintf(ps->fail_msg, sizeof ps->fail_msg, "quantize on ingest: layer %u: %.200s",
                 j->layer, err);
    }
    kvs__call *c = --ps->jobs_out == 0 && ps->ended ? ps->call : NULL;
    pthread_mutex_unlock(&ps->mu);
    if (c != NULL) { /* parked by on_end, so alive: this job completes the Put */
        complete(c, ps);
        kvs__call_resume(c);
    }
    free(j);
    put_unref(ps);
}

/* Hands one received layer to the pool. 0, or non-zero with the call failed. */
static int submit_layer(kvs__call *c, put_state *ps, Kvstash__V1__LayerPayload *lp)
{
    layer_job *j = malloc(sizeof *j);
    if (j == NULL)
        return oom(c);
    j->ps = ps;
    j->layer = ps->next_layer;
    j->k = lp->k.data;
    j->v = lp->v.data;
    lp->k.data = lp->v.data = NULL; /* ours now: protobuf-c frees neither */
    lp->k.len = lp->v.len = 0;
    pthread_mutex_lock(&ps->mu);
    ps->refs++;
    ps->jobs_out++;
    pthread_mutex_unlock(&ps->mu);
    int rc = kvs_pool_submit(c->srv->ingest, encode_layer, j);
    if (rc != 0) {
        pthread_mutex_lock(&ps->mu);
        ps->refs--;
        ps->jobs_out--;
        pthread_mutex_unlock(&ps->mu);
        free(j->k);
        free(j->v);
        free(j);
        kvs__call_fail(c, GRPC_STATUS_UNAVAILABLE, "Put: the ingest pool is %s",
                       rc == KVS_ENOMEM ? "out of memory" : "stopping");
        return -1;
    }
    return 0;
}

static int put_on_end(kvs__call *c)
{
    put_state *ps = c->stream;
    if (ps == NULL || !ps->have_header) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT,
                       "Put: the stream ended without a header");
        return 0;
    }
    if (ps->next_layer != ps->hd.lay.layers) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT,
                       "Put: the stream ended after %u of %u layers; nothing was stored",
                       ps->next_layer, ps->hd.lay.layers);
        return 0;
    }
    if (ps->hd.present) {
        kvs_store_info info;
        uint64_t size = kvs_store_info_get(c->srv->store, &ps->hd.key, &info) == 0 ? info.size : 0;
        atomic_fetch_add_explicit(&c->srv->data.put_present, 1, memory_order_relaxed);
        reply(c, ps, size, 1);
        return 0;
    }
    pthread_mutex_lock(&ps->mu);
    int parked = ps->jobs_out > 0;
    ps->ended = parked;
    pthread_mutex_unlock(&ps->mu);
    if (parked)
        return KVS__PENDING; /* the last layer job completes and resumes the call */
    complete(c, ps);
    return 0;
}

const kvs__stream_ops kvs__put_ops = {
    .on_msg = put_on_msg,
    .on_end = put_on_end,
    .cleanup = put_cleanup,
};
