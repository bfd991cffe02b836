/*
 * handlers.c — what each RPC does: the method table and the unary handlers.
 *
 * Methods whose capability has not been built yet stay in the table with
 * fn == NULL and answer UNIMPLEMENTED naming what will provide them; they
 * disappear from that list as the store, the kernels and the data plane land.
 */
#include "grpc/health/v1/health.pb-c.h"
#include "kvs_log.h"
#include "kvstash/v1/kvstash.pb-c.h"
#include "ops.h"
#include "server.h"
#include "server_internal.h"

#include <stdlib.h>
#include <string.h>

#define MOD "rpc"

static void do_health(kvs__call *c, const ProtobufCMessage *m);
static void do_stats(kvs__call *c, const ProtobufCMessage *m);
static void do_get_config(kvs__call *c, const ProtobufCMessage *m);
static void do_set_config(kvs__call *c, const ProtobufCMessage *m);

#define SVC "/kvstash.v1.KvStash/"
#define U(p, n, d, f) {.path = p, .name = n, .kind = KVS__UNARY, .req_desc = &d, .fn = f}
const kvs__method kvs__methods[] = {
    {.path = "/grpc.health.v1.Health/Check", .name = "Check", .kind = KVS__UNARY,
     .req_desc = &grpc__health__v1__health_check_request__descriptor, .fn = do_health,
     .no_auth = 1, .quick = 1},
    U(SVC "Stats", "Stats", kvstash__v1__stats_request__descriptor, do_stats),
    U(SVC "GetConfig", "GetConfig", kvstash__v1__get_config_request__descriptor, do_get_config),
    U(SVC "SetConfig", "SetConfig", kvstash__v1__set_config_request__descriptor, do_set_config),
    {.path = SVC "Lookup", .name = "Lookup", .kind = KVS__UNARY,
     .req_desc = &kvstash__v1__lookup_request__descriptor, .fn = kvs__do_lookup, .quick = 1},
    {.path = SVC "Put", .name = "Put", .kind = KVS__CLIENT_STREAM,
     .req_desc = &kvstash__v1__put_request__descriptor, .stream = &kvs__put_ops},
    {.path = SVC "Get", .name = "Get", .kind = KVS__SERVER_STREAM,
     .req_desc = &kvstash__v1__get_request__descriptor, .stream = &kvs__get_ops},
    {.path = SVC "Connect", .name = "Connect", .kind = KVS__UNARY,
     .req_desc = &kvstash__v1__connect_request__descriptor, .fn = kvs__do_connect},
    U(SVC "Delete", "Delete", kvstash__v1__delete_request__descriptor, kvs__do_delete),
    U(SVC "Pin", "Pin", kvstash__v1__pin_request__descriptor, kvs__do_pin),
    U(SVC "Unpin", "Unpin", kvstash__v1__unpin_request__descriptor, kvs__do_unpin),
};
#undef U
#undef SVC
const size_t kvs__n_methods = sizeof kvs__methods / sizeof kvs__methods[0];

/* ---- Health ---------------------------------------------------------------- */

static void do_health(kvs__call *c, const ProtobufCMessage *m)
{
    const Grpc__Health__V1__HealthCheckRequest *req = (const void *)m;
    const char *svc = req->service ? req->service : "";
    if (svc[0] != '\0' && strcmp(svc, "kvstash.v1.KvStash") != 0) {
        kvs__call_fail(c, GRPC_STATUS_NOT_FOUND, "unknown service '%.128s'", svc);
        return;
    }
    Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    resp.status = atomic_load(&c->srv->shutting_down)
                      ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
                      : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    kvs__call_reply(c, &resp.base);
}

/* ---- Stats ----------------------------------------------------------------- */

/* Gathers every module's figures into one set (the single source of truth).
 * Also GET /metrics' source, through kvs__server_collect (server_internal.h). */
static int collect(kvs_server *s, kvs_metric_set *set);
int kvs__server_collect(kvs_server *s, kvs_metric_set *set) { return collect(s, set); }

static int collect(kvs_server *s, kvs_metric_set *set)
{
    const char *names[KVS_RPC_MAX_METHODS];
    for (size_t i = 0; i < kvs__n_methods; i++)
        names[i] = kvs__methods[i].name;
    names[kvs__n_methods] = "unknown";
    int rc = kvs_rpc_stats_collect(&s->rpc, names, kvs__n_methods + 1, set);
    if (rc)
        return rc;
    if ((rc = kvs_data_stats_collect(&s->data, set)) != 0 ||
        (rc = kvs__store_collect(s, set)) != 0 || (rc = kvs__xfer_collect(s, set)) != 0)
        return rc;
    pthread_rwlock_rdlock(&s->cfg_lock);
    double capacity = (double)s->cfg.capacity;
    double reloads[2] = {(double)s->reloads[0], (double)s->reloads[1]};
    pthread_rwlock_unlock(&s->cfg_lock);
    static const char reload_help[] =
        "configuration reloads (SIGHUP): applied, or refused with nothing changed";
    if (!kvs_metric_add(set, "kvstash_config_reloads_total", reload_help, KVS_MT_COUNTER,
                        reloads[0], 1, "result", "applied") ||
        !kvs_metric_add(set, "kvstash_config_reloads_total", reload_help, KVS_MT_COUNTER,
                        reloads[1], 1, "result", "refused"))
        return KVS_ENOMEM;
    struct {
        const char *name, *help;
        kvs_metric_type type;
        double v;
    } g[] = {
        {"kvstash_uptime_seconds", "seconds since the server started", KVS_MT_GAUGE,
         kvs__server_uptime(s)},
        {"kvstash_worker_threads", "gRPC worker threads", KVS_MT_GAUGE, (double)s->n_threads},
        {"kvstash_rpc_calls_in_flight", "accepted calls whose final status is not yet sent",
         KVS_MT_GAUGE, (double)atomic_load(&s->active_calls)},
        {"kvstash_store_capacity_bytes", "configured store capacity", KVS_MT_GAUGE, capacity},
    };
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++)
        if (!kvs_metric_add(set, g[i].name, g[i].help, g[i].type, g[i].v, 0))
            return KVS_ENOMEM;
    return kvs__ops_collect(s, set); /* /metrics, trace, TLS figures (ops.c) */
}

static const Kvstash__V1__Metric__Kind k_kind[] = {
    [KVS_MT_COUNTER] = KVSTASH__V1__METRIC__KIND__COUNTER,
    [KVS_MT_GAUGE] = KVSTASH__V1__METRIC__KIND__GAUGE,
    [KVS_MT_HISTOGRAM] = KVSTASH__V1__METRIC__KIND__HISTOGRAM,
};

/* A tenant that is not an admin sees no other tenant's figures: a sample
 * labelled with another tenant's name is left out (its name, bytes and quota
 * are that tenant's business). Admins, and open mode's default, see all. */
static int visible_to(const kvs__call *c, const kvs_metric_sample *s)
{
    if (c->tenant == NULL || c->tenant->admin)
        return 1;
    for (int l = 0; l < s->n_labels; l++)
        if (strcmp(s->label_names[l], "tenant") == 0 &&
            strcmp(s->label_values[l], c->tenant->name) != 0)
            return 0;
    return 1;
}

static void do_stats(kvs__call *c, const ProtobufCMessage *m)
{
    const Kvstash__V1__StatsRequest *req = (const void *)m;
    const char *prefix = req->prefix ? req->prefix : "";
    size_t plen = strlen(prefix);
    kvs_metric_set set;
    kvs_metric_set_init(&set);
    if (collect(c->srv, &set) != 0) {
        kvs_metric_set_free(&set);
        kvs__call_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory collecting stats");
        return;
    }
    /* One allocation per kind of object; protobuf-c only reads them. */
    Kvstash__V1__Metric *metrics = calloc(set.n ? set.n : 1, sizeof *metrics);
    Kvstash__V1__Metric **mptr = calloc(set.n ? set.n : 1, sizeof *mptr);
    Kvstash__V1__Label *labels = calloc(set.n * KVS_METRIC_MAX_LABELS + 1, sizeof *labels);
    Kvstash__V1__Label **lptr = calloc(set.n * KVS_METRIC_MAX_LABELS + 1, sizeof *lptr);
    double *bounds = calloc(set.n * KVS_METRIC_MAX_BUCKETS + 1, sizeof *bounds);
    uint64_t *counts = calloc(set.n * KVS_METRIC_MAX_BUCKETS + 1, sizeof *counts);
    if (!metrics || !mptr || !labels || !lptr || !bounds || !counts) {
        kvs__call_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory building stats");
        goto out;
    }
    size_t n = 0, nl = 0;
    for (size_t i = 0; i < set.n; i++) {
        const kvs_metric_sample *s = &set.v[i];
        if (strncmp(s->name, prefix, plen) != 0 || !visible_to(c, s))
            continue;
        Kvstash__V1__Metric *pm = &metrics[n];
        kvstash__v1__metric__init(pm);
        pm->name = (char *)s->name;
        pm->help = (char *)s->help;
        pm->kind = k_kind[s->type];
        pm->labels = &lptr[nl];
        for (int l = 0; l < s->n_labels; l++, nl++) {
            kvstash__v1__label__init(&labels[nl]);
            labels[nl].name = (char *)s->label_names[l];
            labels[nl].value = (char *)s->label_values[l];
            lptr[nl] = &labels[nl];
        }
        pm->n_labels = (size_t)s->n_labels;
        pm->value = s->value;
        if (s->type == KVS_MT_HISTOGRAM) {
            double *b = &bounds[i * KVS_METRIC_MAX_BUCKETS];
            uint64_t *k = &counts[i * KVS_METRIC_MAX_BUCKETS];
            memcpy(b, s->bounds, s->n_buckets * sizeof *b);
            memcpy(k, s->counts, s->n_buckets * sizeof *k);
            pm->bucket_bounds = b;
            pm->n_bucket_bounds = s->n_buckets;
            pm->bucket_counts = k;
            pm->n_bucket_counts = s->n_buckets;
            pm->sum = s->sum;
            pm->count = s->count;
        }
        mptr[n++] = pm;
    }
    Kvstash__V1__StatsResponse resp = KVSTASH__V1__STATS_RESPONSE__INIT;
    resp.version = (char *)kvs_server_version();
    resp.uptime_seconds = kvs__server_uptime(c->srv);
    resp.metrics = mptr;
    resp.n_metrics = n;
    kvs__call_reply(c, &resp.base);
out:
    free(metrics);
    free(mptr);
    free(labels);
    free(lptr);
    free(bounds);
    free(counts);
    kvs_metric_set_free(&set);
}

/* ---- GetConfig / SetConfig ------------------------------------------------- */

/* Text storage for one reply entry. */
typedef struct entry_text {
    char value[KVS_CONFIG_STR_MAX];
    char min[256];
    char max[64];
} entry_text;

static void fill_entry(Kvstash__V1__ConfigEntry *e, entry_text *t, const kvs_config *cfg,
                       const kvs_config_def *d)
{
    kvstash__v1__config_entry__init(e);
    kvs_config_format(cfg, d, t->value, sizeof t->value);
    kvs_config_def_bounds(d, t->min, sizeof t->min, t->max, sizeof t->max);
    e->name = (char *)kvs_config_def_name(d);
    e->value = t->value;
    e->type = (char *)kvs_config_def_type_name(d);
    e->help = (char *)kvs_config_def_help(d);
    e->runtime = kvs_config_def_runtime(d);
    e->min = t->min;
    e->max = t->max;
    e->default_value = (char *)kvs_config_def_default(d);
}

/* Replies with the entries `defs` (n of them) as they stand in cfg. */
static void reply_entries(kvs__call *c, const kvs_config *cfg, const kvs_config_def **defs,
                          size_t n, int set)
{
    Kvstash__V1__ConfigEntry *e = calloc(n ? n : 1, sizeof *e);
    Kvstash__V1__ConfigEntry **ep = calloc(n ? n : 1, sizeof *ep);
    entry_text *t = calloc(n ? n : 1, sizeof *t);
    if (!e || !ep || !t) {
        kvs__call_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    } else {
        for (size_t i = 0; i < n; i++) {
            fill_entry(&e[i], &t[i], cfg, defs[i]);
            ep[i] = &e[i];
        }
        if (set) {
            Kvstash__V1__SetConfigResponse r = KVSTASH__V1__SET_CONFIG_RESPONSE__INIT;
            r.entries = ep;
            r.n_entries = n;
            kvs__call_reply(c, &r.base);
        } else {
            Kvstash__V1__GetConfigResponse r = KVSTASH__V1__GET_CONFIG_RESPONSE__INIT;
            r.entries = ep;
            r.n_entries = n;
            kvs__call_reply(c, &r.base);
        }
    }
    free(e);
    free(ep);
    free(t);
}

static void do_get_config(kvs__call *c, const ProtobufCMessage *m)
{
    const Kvstash__V1__GetConfigRequest *req = (const void *)m;
    size_t n = req->n_names ? req->n_names : kvs_config_count();
    const kvs_config_def **defs = calloc(n, sizeof *defs);
    if (defs == NULL) {
        kvs__call_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        defs[i] = req->n_names ? kvs_config_find(req->names[i]) : kvs_config_at(i);
        if (defs[i] == NULL) {
            kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "names[%zu]: unknown setting '%.128s'",
                           i, req->names[i]);
            free(defs);
            return;
        }
    }
    kvs_config snapshot;
    pthread_rwlock_rdlock(&c->srv->cfg_lock);
    snapshot = c->srv->cfg;
    pthread_rwlock_unlock(&c->srv->cfg_lock);
    if (c->tenant && !c->tenant->admin) { /* its own rule only, as Stats */
        char own[sizeof snapshot.tenant_rules];
        kvs_config_tenant_rule_text(&snapshot, c->tenant->name, own, sizeof own);
        memcpy(snapshot.tenant_rules, own, sizeof own);
    }
    reply_entries(c, &snapshot, defs, n, 0);
    free(defs);
}

static void do_set_config(kvs__call *c, const ProtobufCMessage *m)
{
    const Kvstash__V1__SetConfigRequest *req = (const void *)m;
    kvs_server *s = c->srv;
    if (c->tenant && !c->tenant->admin) {
        kvs__call_fail(c, GRPC_STATUS_PERMISSION_DENIED,
                       "tenant %s may not change settings (needs admin = true)", c->tenant->name);
        return;
    }
    if (req->n_settings == 0) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "settings: empty");
        return;
    }
    const kvs_config_def **defs = calloc(req->n_settings, sizeof *defs);
    if (defs == NULL) {
        kvs__call_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    pthread_rwlock_wrlock(&s->cfg_lock);
    kvs_config next = s->cfg; /* all or nothing: validate on a copy */
    int reread_profiles = 0;  /* model_rules named: its profile files are read again */
    for (size_t i = 0; i < req->n_settings; i++) {
        const Kvstash__V1__ConfigSetting *st = req->settings[i];
        const char *name = st->name ? st->name : "";
        defs[i] = kvs_config_find(name);
        char err[KVS_ERR_LEN];
        if (defs[i] == NULL) {
            kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT,
                           "settings[%zu].name: unknown setting '%.128s'", i, name);
            goto out;
        }
        if (!kvs_config_def_runtime(defs[i])) {
            kvs__call_fail(c, GRPC_STATUS_FAILED_PRECONDITION,
                           "settings[%zu]: '%s' cannot change while the server runs; set it in "
                           "the config file and restart",
                           i, name);
            goto out;
        }
        if (kvs_config_set(&next, defs[i], st->value ? st->value : "", err) != 0) {
            kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "settings[%zu].value: %s", i, err);
            goto out;
        }
        reread_profiles |= strcmp(kvs_config_def_name(defs[i]), "model_rules") == 0;
    }
    {
        char err[KVS_ERR_LEN];
        int arc = kvs__server_config_commit(s, &next, defs, req->n_settings, reread_profiles,
                                            req->dry_run, "SetConfig", err);
        if (arc != 0) {
            kvs__call_fail(c, kvs__grpc_from_status(arc), "%s", err);
            goto out;
        }
    }
    reply_entries(c, &next, defs, req->n_settings, 1);
out:
    pthread_rwlock_unlock(&s->cfg_lock);
    free(defs);
}
