/*
 * data_common.c — namespace resolution, key parsing and ownership checks for
 * the data-path handlers, and the store's figures for Stats (see data_int.h).
 */
#include "data_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvs__config_snapshot(kvs__call *c, kvs_config *out)
{
    pthread_rwlock_rdlock(&c->srv->cfg_lock);
    *out = c->srv->cfg;
    pthread_rwlock_unlock(&c->srv->cfg_lock);
}

/* FNV-1a over the canonical descriptor: a stable 32-bit namespace id. */
static uint32_t fnv1a(const uint8_t *p, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 16777619u;
    }
    return h;
}

int kvs__ns_resolve(kvs__call *c, const Kvstash__V1__Namespace *pb, kvs__ns *out)
{
    memset(out, 0, sizeof *out);
    const kvs_tenant *t = c->tenant;
    if (pb == NULL) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "ns: required");
        return -1;
    }
    if (pb->layout == NULL) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "ns.layout: required");
        return -1;
    }
    const Kvstash__V1__Layout *l = pb->layout;
    const char *model = pb->model ? pb->model : "";
    const char *salt = pb->salt ? pb->salt : "";
    out->tenant = t;
    out->desc.tenant = t->name;
    out->desc.tenant_len = strlen(t->name);
    out->desc.model = model;
    out->desc.model_len = strlen(model);
    out->desc.num_layers = l->num_layers;
    out->desc.num_kv_heads = l->num_kv_heads;
    out->desc.head_dim = l->head_dim;
    out->desc.block_tokens = l->block_tokens;
    out->desc.dtype = (kvs_dtype)l->dtype;
    out->desc.salt = salt;
    out->desc.salt_len = strlen(salt);
    if ((int)l->dtype < (int)KVS_DTYPE_FP16 || (int)l->dtype > (int)KVS_DTYPE_FP32) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT,
                       "ns.layout.dtype: %d is not DTYPE_FP16, DTYPE_BF16 or DTYPE_FP32",
                       (int)l->dtype);
        return -1;
    }
    /* Bounds the block format enforces (kernels/kv_format.h). */
    if (l->num_layers < 1 || l->num_layers > 1024 || l->num_kv_heads < 1 ||
        l->num_kv_heads > 256 || l->head_dim < 1 || l->head_dim > 1024) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT,
                       "ns.layout: num_layers %u (1..1024), num_kv_heads %u (1..256), head_dim "
                       "%u (1..1024)",
                       l->num_layers, l->num_kv_heads, l->head_dim);
        return -1;
    }
    uint8_t enc[KVS_NS_ENC_MAX];
    size_t len = 0;
    char err[KVS_ERR_LEN] = "";
    if (kvs_ns_encode(&out->desc, enc, sizeof enc, &len, err, sizeof err) != 0) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "ns: %s", err);
        return -1;
    }
    if (!kvs_tenant_may_use_model(t, model, out->desc.model_len)) {
        kvs__call_fail(c, GRPC_STATUS_PERMISSION_DENIED,
                       "ns.model: tenant %s may not use model '%.200s'", t->name, model);
        return -1;
    }
    out->ns_id = fnv1a(enc, len);
    return 0;
}

int kvs__key_parse(kvs__call *c, const ProtobufCBinaryData *b, const char *field, size_t i,
                   kvs_key *out)
{
    if (b->len != KVS_KEY_LEN) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "%s[%zu]: %zu bytes, a key is %d", field,
                       i, b->len, KVS_KEY_LEN);
        return -1;
    }
    memcpy(out->b, b->data, KVS_KEY_LEN);
    return 0;
}

int kvs__block_owned(kvs__call *c, const kvs__ns *ns, const kvs_key *key, kvs_store_info *info)
{
    kvs_store_info tmp;
    if (info == NULL)
        info = &tmp;
    if (kvs_store_info_get(c->srv->store, key, info) != 0)
        return 0;
    return info->tenant == ns->tenant->id && info->ns_id == ns->ns_id;
}

/* ---- Stats -------------------------------------------------------------- */

_Static_assert(KVS_METRIC_LABEL_LEN > KVS_TENANT_NAME_MAX,
               "kvstash_tenant_bytes{tenant} holds whole tenant names");

int kvs__store_collect(kvs_server *s, kvs_metric_set *set)
{
    if (s->store == NULL)
        return 0;
    kvs_store_stats st;
    kvs_store_get_stats(s->store, &st);
    kvs_store_payload_stats ps;
    kvs_store_get_payload_stats(s->store, &ps);
    uint64_t used = ps.bytes[KVS_TIER_DRAM] + ps.bytes[KVS_TIER_GPU] + ps.bytes[KVS_TIER_SSD];
#define G(n, h, v)                                                                                 \
    if (!kvs_metric_add(set, n, h, KVS_MT_GAUGE, (double)(v), 0))                                  \
        return KVS_ENOMEM;
#define C(n, h, v)                                                                                 \
    if (!kvs_metric_add(set, n, h, KVS_MT_COUNTER, (double)(v), 0))                                \
        return KVS_ENOMEM;
    G("kvstash_store_used_bytes", "payload bytes of the blocks held, all tiers", used);
    G("kvstash_store_blocks", "blocks held", st.blocks);
    G("kvstash_store_memory_used_bytes",
      "memory-tier bytes charged against capacity (slab chunks, reserved and held included)",
      ps.used_bytes);
    G("kvstash_store_leases", "read leases and TTL pins active", ps.leases);
    G("kvstash_store_reserved_bytes", "bytes reserved by Puts not yet committed",
      ps.reserved_bytes);
    G("kvstash_store_memory_capacity_bytes", "payload bytes the memory tier may hold",
      ps.capacity_bytes);
    C("kvstash_store_inserts_total", "blocks committed to the store", st.inserts);
    C("kvstash_store_demotions_total", "blocks moved from memory to the SSD tier", ps.demotions);
    C("kvstash_store_promotions_total", "blocks brought back from the SSD tier", ps.promotions);
    C("kvstash_store_corrupt_dropped_total", "SSD copies dropped for a bad checksum",
      ps.corrupt_dropped);
    C("kvstash_store_io_errors_total", "tier I/O errors", ps.io_errors);
    C("kvstash_store_quota_refused_total", "writes refused by a tenant quota", ps.quota_refused);
    C("kvstash_store_not_admitted_total", "inserts the eviction policy declined", st.not_admitted);
#undef G
#undef C
    static const char *const tiers[4] = {"none", "host", "gpu", "ssd"};
    for (int t = 1; t < 4; t++)
        if (!kvs_metric_add(set, "kvstash_store_tier_bytes", "payload bytes held, by tier",
                            KVS_MT_GAUGE, (double)ps.bytes[t], 1, "tier", tiers[t]))
            return KVS_ENOMEM;
    /* Names by kvs_evict_reason; a reason the store adds later shows as "reasonN". */
    static const char *const reasons[] = {"capacity", "delete",  "subtree", "resize",
                                          "watermark", "quota",  "demote",  "corrupt",
                                          "ssd_full"};
    for (int r = 0; r < KVS_EVICT__COUNT; r++) {
        char name[32];
        if ((size_t)r < sizeof reasons / sizeof reasons[0])
            snprintf(name, sizeof name, "%s", reasons[r]);
        else
            snprintf(name, sizeof name, "reason%d", r);
        if (!kvs_metric_add(set, "kvstash_store_evictions_total",
                            "blocks that left the store (or DRAM, for demote), by reason",
                            KVS_MT_COUNTER, (double)st.evictions[r], 1, "reason", name))
            return KVS_ENOMEM;
    }
    /* Quantize on ingest (codec.h): which backend, and how many layers each did. */
    static const char layers_help[] = "layers quantized on ingest, by backend";
    kvs_codec_counters cc;
    kvs_codec_counters_get(&cc);
    if (!kvs_metric_add(set, "kvstash_ingest_backend",
                        "the backend Put quantizes on (ingest_backend): 1 for the one in use",
                        KVS_MT_GAUGE, 1.0, 1, "backend",
                        kvs_codec_backend_name(kvs_codec_backend_current())) ||
        !kvs_metric_add(set, "kvstash_ingest_layers_total", layers_help, KVS_MT_COUNTER,
                        (double)cc.layers_cpu, 1, "backend", "cpu") ||
        !kvs_metric_add(set, "kvstash_ingest_layers_total", layers_help, KVS_MT_COUNTER,
                        (double)cc.layers_gpu, 1, "backend", "gpu") ||
        !kvs_metric_add(set, "kvstash_ingest_gpu_fallbacks_total",
                        "GPU encodes that failed (a CUDA error) and were redone on the CPU",
                        KVS_MT_COUNTER, (double)cc.gpu_fallbacks, 0) ||
        !kvs_metric_add(set, "kvstash_ingest_gpu_key_offsets",
                        "1 when layers with key offsets are quantized on the GPU (it passed "
                        "their self-check), 0 when they go to the CPU",
                        KVS_MT_GAUGE, (double)kvs_codec_gpu_key_offsets(), 0))
        return KVS_ENOMEM;
    kvs_config *cfg = malloc(sizeof *cfg); /* the live quotas: tenant_rules (SetConfig) */
    if (cfg == NULL)
        return KVS_ENOMEM;
    pthread_rwlock_rdlock(&s->cfg_lock);
    *cfg = s->cfg;
    pthread_rwlock_unlock(&s->cfg_lock);
    for (size_t i = 0; i < kvs_tenants_count(s->tenants); i++) {
        const kvs_tenant *t = kvs_tenants_at(s->tenants, i);
        kvs_config_rule r;
        uint64_t quota = kvs_config_tenant_rule(cfg, t->name, &r) && r.has_quota ? r.quota : 0;
        if (!kvs_metric_add(set, "kvstash_tenant_bytes", "payload bytes held, by tenant",
                            KVS_MT_GAUGE, (double)kvs_store_tenant_bytes(s->store, t->id), 1,
                            "tenant", t->name) ||
            !kvs_metric_add(set, "kvstash_tenant_quota_bytes", "payload quota, by tenant (0: none)",
                            KVS_MT_GAUGE, (double)quota, 1, "tenant", t->name)) {
            free(cfg);
            return KVS_ENOMEM;
        }
    }
    free(cfg);
    return 0;
}
