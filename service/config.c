/*
 * config.c — the configuration table and its parsers (see config.h).
 *
 * Values are validated entirely before they are stored, so a bad setting from
 * any source leaves the previous value in place. Numeric parsing is strict:
 * no trailing garbage, no overflow, bounds from the table.
 */
#include "config.h"

#include "kvs_error.h"
#include "profiles.h"

#include <errno.h>
#include <ini.h>
#include <inttypes.h>
#include <locale.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <wchar.h>

struct kvs_config_def {
    const char *name;
    kvs_config_type type;
    size_t offset;
    int64_t min, max;            /* numeric types; max length for strings */
    const char *def;             /* default, as text */
    const char *const *enums;    /* KVS_CFG_ENUM: NULL-terminated names */
    int runtime;                 /* settable by SetConfig */
    void (*apply)(const kvs_config *c); /* run after a change takes effect */
    const char *help;
};

static const char *const k_log_levels[] = {"debug", "info", "warn", "error", "off", NULL};

/* The store's online policies (belady needs an oracle: simulation only). */
static const char *const k_policies[] = {"lru", "leaflru", "lfu", "s3fifo", "prefix", NULL};
static const char *const k_schemes[] = {"fp16", "fp8_e4m3", "fp8_e5m2", "int8", NULL};
static const char *const k_on_off[] = {"off", "on", NULL};
static const char *const k_backends[] = {"auto", "cpu", "gpu", NULL};

const char *kvs_config_policy_name(int64_t policy)
{
    return policy >= 0 && policy < (int64_t)(sizeof k_policies / sizeof k_policies[0]) - 1
               ? k_policies[policy]
               : "lru";
}

static void apply_log_level(const kvs_config *c)
{
    kvs_log_set_level((kvs_log_level)c->log_level);
}

#define F(field) offsetof(kvs_config, field)
#define GiB (INT64_C(1) << 30)
#define TiB (INT64_C(1) << 40)

static const kvs_config_def k_table[] = {
    {"listen", KVS_CFG_STRING, F(listen), 1, KVS_CONFIG_PATH_MAX - 1, "127.0.0.1:50551", NULL, 0,
     NULL, "gRPC listen address host:port; port 0 picks a free port (logged, and written to port_file)"},
    {"port_file", KVS_CFG_STRING, F(port_file), 0, KVS_CONFIG_PATH_MAX - 1, "", NULL, 0, NULL,
     "after binding, write the listening port and a newline to this file (empty: don't)"},
    {"threads", KVS_CFG_INT, F(threads), 1, 256, "4", NULL, 0, NULL,
     "gRPC worker threads serving the completion queue"},
    {"log_level", KVS_CFG_ENUM, F(log_level), 0, 0, "info", k_log_levels, 1, apply_log_level,
     "least severe log level written to stderr"},
    {"capacity", KVS_CFG_SIZE, F(capacity), 1 << 20, 64 * TiB, "1GiB", NULL, 1, NULL,
     "bytes of KV blocks the store may hold in memory; at run time it can be lowered "
     "(evicting) and raised back up to its value at start"},
    {"prefault_memory", KVS_CFG_ENUM, F(prefault_memory), 0, 0, "off", k_on_off, 0, NULL,
     "on: fault the whole memory tier in at start (MADV_POPULATE_WRITE), so no Put pays the "
     "kernel's first touch of a page; start-up takes longer and capacity bytes are resident "
     "from the start"},
    {"max_message_bytes", KVS_CFG_SIZE, F(max_message_bytes), 4096, 2 * GiB - 1, "64MiB", NULL, 0,
     NULL, "largest gRPC message the server accepts"},
    {"max_concurrent_streams", KVS_CFG_INT, F(max_concurrent_streams), 1, 65536, "256", NULL, 0,
     NULL, "concurrent RPCs per client connection (HTTP/2 streams)"},
    {"calls_per_method", KVS_CFG_INT, F(calls_per_method), 1, 1024, "8", NULL, 0, NULL,
     "calls accepted ahead per method (requests waiting beyond this queue in gRPC)"},
    {"shutdown_grace_ms", KVS_CFG_DURATION, F(shutdown_grace_ms), 0, 60000, "1000", NULL, 1, NULL,
     "on SIGTERM, time in-flight calls get before they are cancelled"},
    /* Operator surfaces: /metrics, the request trace, TLS (service/ops.c). */
    {"metrics_listen", KVS_CFG_STRING, F(metrics_listen), 0, KVS_CONFIG_PATH_MAX - 1, "", NULL, 0,
     NULL, "serve Prometheus text on http://HOST:PORT/metrics, e.g. 127.0.0.1:9464; port 0 picks "
     "a free port (empty: no HTTP endpoint)"},
    {"metrics_port_file", KVS_CFG_STRING, F(metrics_port_file), 0, KVS_CONFIG_PATH_MAX - 1, "",
     NULL, 0, NULL,
     "after binding /metrics, write its port and a newline to this file (empty: don't)"},
    {"record_trace", KVS_CFG_STRING, F(record_trace), 0, KVS_CONFIG_PATH_MAX - 1, "", NULL, 0, NULL,
     "write the Lookup and Put requests served to this file as a Mooncake-format trace for "
     "kvstash-sim (empty: don't)"},
    {"tls_cert", KVS_CFG_STRING, F(tls_cert), 0, KVS_CONFIG_PATH_MAX - 1, "", NULL, 0, NULL,
     "PEM certificate chain: the gRPC listener speaks TLS (needs tls_key; empty: plaintext)"},
    {"tls_key", KVS_CFG_STRING, F(tls_key), 0, KVS_CONFIG_PATH_MAX - 1, "", NULL, 0, NULL,
     "PEM private key of tls_cert"},
    {"tls_client_ca", KVS_CFG_STRING, F(tls_client_ca), 0, KVS_CONFIG_PATH_MAX - 1, "", NULL, 0,
     NULL, "PEM CA bundle: require and verify client certificates signed by it (empty: don't)"},
    {"max_blocks_per_request", KVS_CFG_INT, F(max_blocks_per_request), 1, 1 << 20, "4096", NULL,
     1, NULL, "most blocks one Lookup may cover, and most keys one Get, Delete, Pin or Unpin may name"},
    {"policy", KVS_CFG_ENUM, F(policy), 0, 0, "lru", k_policies, 1, NULL,
     "eviction policy of the block store (docs/EVICTION.md)"},
    {"high_watermark_pct", KVS_CFG_INT, F(high_watermark_pct), 1, 100, "100", NULL, 1, NULL,
     "eviction starts when stored bytes would pass this % of capacity"},
    {"low_watermark_pct", KVS_CFG_INT, F(low_watermark_pct), 1, 100, "100", NULL, 1, NULL,
     "eviction then frees down to this % of capacity (<= high_watermark_pct)"},
    {"lease_ms", KVS_CFG_DURATION, F(lease_ms), 1, 86400000, "5000", NULL, 1, NULL,
     "read lease Lookup grants when the request asks for none"},
    {"lease_blocks_per_tenant", KVS_CFG_INT, F(lease_blocks_per_tenant), 1, 1048576, "262144",
     NULL, 1, NULL,
     "blocks one tenant's live Lookup leases may hold at once (the store holds 1048576 for "
     "all tenants); a Lookup past it answers RESOURCE_EXHAUSTED"},
    {"default_scheme", KVS_CFG_ENUM, F(default_scheme), 0, 0, "int8", k_schemes, 1, NULL,
     "how Put stores a block when the request asks for no scheme (docs/QUALITY.md)"},
    /* k_outliers, v_outliers, sinks: KVS_QUANT_DEFAULT_* of kernels/calib/kvq_calib.h */
    {"k_outliers", KVS_CFG_INT, F(k_outliers), 0, 16, "3", NULL, 1, NULL,
     "largest-magnitude values kept exactly per K channel (8-bit schemes)"},
    {"v_outliers", KVS_CFG_INT, F(v_outliers), 0, 16, "2", NULL, 1, NULL,
     "largest-magnitude values kept exactly per V token row (8-bit schemes)"},
    {"sinks", KVS_CFG_INT, F(sinks), 0, 64, "1", NULL, 1, NULL,
     "first tokens of a root block kept at fp16 (attention sinks)"},
    {"key_offsets", KVS_CFG_ENUM, F(key_offsets), 0, 0, "off", k_on_off, 1, NULL,
     "on: the K tiles of 8-bit layers store per-channel key offsets (2 * head_dim bytes more "
     "per tile), for models whose key channels sit far from zero (docs/QUALITY.md §10); a "
     "model rule's key_offsets wins over it"},
    {"skip_layers", KVS_CFG_STRING, F(skip_layers), 0, KVS_CONFIG_PATH_MAX - 1, "", NULL, 1, NULL,
     "layers always stored at fp16, e.g. \"0,30-31\" (empty: none)"},
    {"model_rules", KVS_CFG_STRING, F(model_rules), 0, KVS_CONFIG_STR_MAX - 1, "", NULL, 1, NULL,
     "scheme rules per model, \"PATTERN key=value ...; ...\" with keys scheme, fp16 (the fp16 "
     "fallback), skip_layers, key_offsets (true/false, in place of the key_offsets setting) and "
     "profile (a calibration profile file, read and checked when "
     "set: FP8 layers of matching blocks get its per-tensor scales); PATTERN is a fingerprint "
     "or a prefix ending in '*'; written as [model.PATTERN] sections in the config file "
     "(empty: none)"},
    {"tenant_rules", KVS_CFG_STRING, F(tenant_rules), 0, KVS_CONFIG_STR_MAX - 1, "", NULL, 1,
     NULL, "scheme rules and quotas per tenant, \"NAME key=value ...; ...\" with keys scheme, "
     "fp16, skip_layers and quota; from the [tenant.NAME] sections of the config file, changed "
     "with SetConfig (a tenant left out has none of them)"},
    {"ingest_backend", KVS_CFG_ENUM, F(ingest_backend), 0, 0, "auto", k_backends, 0, NULL,
     "where Put payloads are quantized: gpu (CUDA build and a device; else kvstashd does not "
     "start), cpu, or auto (the GPU when there is one)"},
    {"ingest_threads", KVS_CFG_INT, F(ingest_threads), 1, 256, "2", NULL, 0, NULL,
     "threads quantizing Put payloads (quantize on ingest), over gRPC and over UCX (a UCX "
     "put's layers, beside the thread that ends it); with `ucx = on` as many more threads end "
     "UCX puts (seal check, quantize, commit) off the data plane's thread"},
    {"ssd_dir", KVS_CFG_STRING, F(ssd_dir), 0, KVS_CONFIG_PATH_MAX - 1, "", NULL, 0, NULL,
     "directory of the SSD tier that takes blocks evicted from memory (empty: none); it must "
     "exist and be writable by kvstashd's user, else kvstashd does not start and says which "
     "(the unit's `StateDirectory` makes `/var/lib/kvstash/ssd`)"},
    {"ssd_capacity", KVS_CFG_SIZE, F(ssd_capacity), 0, 64 * TiB, "0", NULL, 0, NULL,
     "bytes the SSD tier may hold (0: unbounded)"},
    {"ucx", KVS_CFG_ENUM, F(ucx), 0, 0, "on", k_on_off, 0, NULL,
     "UCX data plane (Connect, fetch over UCX); when UCX cannot start, gRPC alone is served"},
    {"ucx_addr_check", KVS_CFG_ENUM, F(ucx_addr_check), 0, 0, "on", k_on_off, 0, NULL,
     "try each Connect's worker address in a helper process (kvstash-ucx-addrcheck, next to "
     "kvstashd) before UCX parses it: UCX 1.13 aborts on some malformed addresses; off only "
     "where every caller allowed to Connect is trusted"},
    {"ucx_isolate", KVS_CFG_ENUM, F(ucx_isolate), 0, 0, "on", k_on_off, 0, NULL,
     "run UCX in a child process (kvstash-xferd, next to kvstashd) that reads blocks from the "
     "shared memory tier: bytes that abort UCX 1.13 end that process, which is restarted, "
     "and no stored block is lost; that process runs sandboxed, and kvstashd makes itself "
     "non-dumpable (no core dumps); off: UCX in kvstashd itself"},
    {"ucx_op_timeout_ms", KVS_CFG_DURATION, F(ucx_op_timeout_ms), 100, 3600000, "30000", NULL, 0,
     NULL, "a UCX fetch still in flight after this long closes its session (its blocks released)"},
    {"ucx_max_sessions", KVS_CFG_INT, F(ucx_max_sessions), 1, 65536, "1024", NULL, 1, NULL,
     "UCX sessions open at once (one per worker connection); Connect beyond answers "
     "RESOURCE_EXHAUSTED"},
};

#undef F

static const size_t k_count = sizeof k_table / sizeof k_table[0];

size_t kvs_config_count(void) { return k_count; }

const kvs_config_def *kvs_config_at(size_t i) { return i < k_count ? &k_table[i] : NULL; }

/* Compares names treating '-' and '_' alike. */
static int name_eq(const char *a, const char *b)
{
    for (;; a++, b++) {
        char ca = *a == '-' ? '_' : *a, cb = *b == '-' ? '_' : *b;
        if (ca != cb)
            return 0;
        if (ca == '\0')
            return 1;
    }
}

const kvs_config_def *kvs_config_find(const char *name)
{
    if (name == NULL)
        return NULL;
    for (size_t i = 0; i < k_count; i++)
        if (name_eq(k_table[i].name, name))
            return &k_table[i];
    return NULL;
}

const char *kvs_config_def_name(const kvs_config_def *d) { return d->name; }
const char *kvs_config_def_help(const kvs_config_def *d) { return d->help; }
const char *kvs_config_def_default(const kvs_config_def *d) { return d->def; }
int kvs_config_def_runtime(const kvs_config_def *d) { return d->runtime; }

const char *kvs_config_def_type_name(const kvs_config_def *d)
{
    switch (d->type) {
    case KVS_CFG_INT:
        return "int";
    case KVS_CFG_SIZE:
        return "size";
    case KVS_CFG_STRING:
        return "string";
    case KVS_CFG_ENUM:
        return "enum";
    case KVS_CFG_DURATION:
        return "duration";
    }
    return "?";
}

void kvs_config_def_bounds(const kvs_config_def *d, char *min, size_t nmin, char *max,
                           size_t nmax)
{
    min[0] = max[0] = '\0';
    switch (d->type) {
    case KVS_CFG_ENUM: {
        size_t used = 0;
        for (const char *const *e = d->enums; *e && used < nmin; e++)
            used += (size_t)snprintf(min + used, nmin - used, "%s%s", e == d->enums ? "" : "|", *e);
        break;
    }
    case KVS_CFG_STRING:
        snprintf(max, nmax, "%" PRId64 " bytes", d->max);
        break;
    default:
        snprintf(min, nmin, "%" PRId64, d->min);
        snprintf(max, nmax, "%" PRId64, d->max);
        break;
    }
}

/* Strict decimal parse with an optional unit suffix from units[] (multipliers
 * in mult[]); the suffix is matched case-insensitively. */
static int parse_scaled(const char *s, const char *const *units, const int64_t *mult, int64_t *out)
{
    if (s == NULL || *s == '\0')
        return -1;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || end == s)
        return -1;
    while (*end == ' ')
        end++;
    int64_t m = 1;
    if (*end != '\0') {
        int found = 0;
        for (size_t i = 0; units && units[i]; i++) {
            if (strcasecmp(end, units[i]) == 0) {
                m = mult[i];
                found = 1;
                break;
            }
        }
        if (!found)
            return -1;
    }
    if (v != 0 && (v > INT64_MAX / m || v < INT64_MIN / m))
        return -1;
    *out = (int64_t)v * m;
    return 0;
}

/* Parses one "N" or "N-M" item of a layer list starting at *p; advances *p. */
static int parse_layer_item(const char **p, uint32_t *lo, uint32_t *hi)
{
    char *end;
    errno = 0;
    unsigned long a = strtoul(*p, &end, 10);
    if (end == *p || errno != 0 || a > 1023 || **p == '-' || **p == '+' || **p == ' ')
        return -1;
    unsigned long b = a;
    if (*end == '-') {
        const char *q = end + 1;
        if (*q < '0' || *q > '9')
            return -1;
        b = strtoul(q, &end, 10);
        if (errno != 0 || b > 1023 || b < a)
            return -1;
    }
    *lo = (uint32_t)a;
    *hi = (uint32_t)b;
    *p = end;
    return 0;
}

/* Walks a layer list; returns 1 when layer is in it, 0 when not, -1 when the
 * list is malformed. */
static int walk_layer_list(const char *list, uint32_t layer)
{
    const char *p = list;
    int found = 0;
    if (*p == '\0')
        return 0;
    for (;;) {
        uint32_t lo, hi;
        if (parse_layer_item(&p, &lo, &hi) != 0)
            return -1;
        if (layer >= lo && layer <= hi)
            found = 1;
        if (*p == '\0')
            return found;
        if (*p != ',')
            return -1;
        p++;
    }
}

int kvs_config_layer_listed(const char *list, uint32_t layer)
{
    return walk_layer_list(list ? list : "", layer) == 1;
}

/* ---- rule lists (model_rules, tenant_rules) ------------------------------ */

static const char *rules_row(kvs_config_rule_kind kind)
{
    return kind == KVS_RULES_TENANT ? "tenant_rules" : "model_rules";
}

int kvs_config_parse_bool(const char *v, int *out)
{
    if (!strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcmp(v, "1") || !strcasecmp(v, "on"))
        *out = 1;
    else if (!strcasecmp(v, "false") || !strcasecmp(v, "no") || !strcmp(v, "0") ||
             !strcasecmp(v, "off"))
        *out = 0;
    else
        return -1;
    return 0;
}

static int parse_size_text(const char *v, int64_t *out);

/* Applies key=value to r. what names the rule in messages ("model_rules: rule 2
 * ('x')"). 0 or KVS_EINVAL. */
static int rule_set_key(kvs_config_rule_kind kind, kvs_config_rule *r, const char *key,
                        const char *value, const char *what, char *err)
{
    if (strcmp(key, "scheme") == 0) {
        if (r->scheme != 0)
            return kvs_fail(err, KVS_EINVAL, "%s: scheme given twice", what);
        for (unsigned i = 0; k_schemes[i]; i++)
            if (strcasecmp(value, k_schemes[i]) == 0)
                r->scheme = i + 1;
        if (r->scheme == 0) {
            return kvs_fail(err, KVS_EINVAL,
                            "%s: scheme '%.32s' is not one of fp16|fp8_e4m3|fp8_e5m2|int8", what,
                            value);
        }
    } else if (strcmp(key, "fp16") == 0) {
        if (r->fp16 >= 0)
            return kvs_fail(err, KVS_EINVAL, "%s: fp16 given twice", what);
        if (kvs_config_parse_bool(value, &r->fp16) != 0) {
            r->fp16 = -1;
            return kvs_fail(err, KVS_EINVAL, "%s: fp16 '%.32s' is not true or false", what,
                            value);
        }
    } else if (strcmp(key, "key_offsets") == 0 && kind == KVS_RULES_MODEL) {
        if (r->key_offsets >= 0)
            return kvs_fail(err, KVS_EINVAL, "%s: key_offsets given twice", what);
        if (kvs_config_parse_bool(value, &r->key_offsets) != 0) {
            r->key_offsets = -1;
            return kvs_fail(err, KVS_EINVAL, "%s: key_offsets '%.32s' is not true or false", what,
                            value);
        }
    } else if (strcmp(key, "skip_layers") == 0) {
        if (r->skip_layers[0] != '\0')
            return kvs_fail(err, KVS_EINVAL, "%s: skip_layers given twice", what);
        if (value[0] == '\0' || strlen(value) >= sizeof r->skip_layers ||
            walk_layer_list(value, 0) < 0) {
            return kvs_fail(err, KVS_EINVAL,
                            "%s: skip_layers '%.64s' is not a list of layers like \"0,30-31\" "
                            "(each 0..1023)",
                            what, value);
        }
        snprintf(r->skip_layers, sizeof r->skip_layers, "%s", value);
    } else if (strcmp(key, "profile") == 0 && kind == KVS_RULES_MODEL) {
        /* Syntax only: the file is read where a list is set (kvs_config_set),
         * not on every lookup of a rule. */
        if (r->profile[0] != '\0')
            return kvs_fail(err, KVS_EINVAL, "%s: profile given twice", what);
        if (value[0] == '\0' || strlen(value) >= sizeof r->profile || strpbrk(value, " \t;")) {
            return kvs_fail(err, KVS_EINVAL,
                            "%s: profile '%.64s' is not a file path of 1..%zu bytes without "
                            "blanks or ';'",
                            what, value, sizeof r->profile - 1);
        }
        snprintf(r->profile, sizeof r->profile, "%s", value);
    } else if (strcmp(key, "quota") == 0 && kind == KVS_RULES_TENANT) {
        int64_t q;
        if (r->has_quota)
            return kvs_fail(err, KVS_EINVAL, "%s: quota given twice", what);
        if (parse_size_text(value, &q) != 0 || q < 0) {
            return kvs_fail(err, KVS_EINVAL, "%s: quota '%.32s' is not a size like 8GiB", what,
                            value);
        }
        r->has_quota = 1;
        r->quota = (uint64_t)q;
    } else {
        return kvs_fail(err, KVS_EINVAL, "%s: unknown key '%.32s' (%s)", what, key,
                        kind == KVS_RULES_TENANT ? "scheme, fp16, skip_layers, quota"
                                                 : "scheme, fp16, skip_layers, profile, "
                                                   "key_offsets");
    }
    return 0;
}

static void rule_init(kvs_config_rule *r)
{
    memset(r, 0, sizeof *r);
    r->fp16 = -1;
    r->key_offsets = -1;
}

static int is_blank(char ch) { return ch == ' ' || ch == '\t'; }

/* Checks a rule's subject (n bytes at s) and copies it into r. */
static int rule_subject(kvs_config_rule_kind kind, const char *s, size_t n, size_t idx,
                        kvs_config_rule *r, char *err)
{
    const char *row = rules_row(kind);
    if (n == 0 || n > KVS_CONFIG_SUBJECT_MAX) {
        return kvs_fail(err, KVS_EINVAL, "%s: rule %zu: %s of 1..%d bytes expected first", row,
                        idx + 1, kind == KVS_RULES_TENANT ? "a tenant name" : "a model pattern",
                        KVS_CONFIG_SUBJECT_MAX);
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch < 0x21 || ch == 0x7f || ch == '=' ||
            (ch == '*' && (kind == KVS_RULES_TENANT || i + 1 != n))) {
            return kvs_fail(err, KVS_EINVAL,
                            "%s: rule %zu: '%.*s' is not a %s (printable, no '=', %s)", row,
                            idx + 1, (int)(n > 64 ? 64 : n), s,
                            kind == KVS_RULES_TENANT ? "tenant name" : "model pattern",
                            kind == KVS_RULES_TENANT ? "no '*'" : "'*' only at its end");
        }
    }
    memcpy(r->subject, s, n);
    r->subject[n] = '\0';
    return 0;
}

/* Parses the rule in [s, e) (trimmed, non-empty) into r; only its subject when
 * subject_only (lookups of a list checked when it was set). */
static int rule_parse(kvs_config_rule_kind kind, const char *s, const char *e, size_t idx,
                      int subject_only, kvs_config_rule *r, char *err)
{
    if (!subject_only) /* a subject-only walk (a lookup) reads r->subject alone */
        rule_init(r);
    const char *p = s;
    while (p < e && !is_blank(*p))
        p++;
    int rc = rule_subject(kind, s, (size_t)(p - s), idx, r, err);
    if (rc != 0 || subject_only)
        return rc;
    char what[KVS_CONFIG_SUBJECT_MAX + 64];
    snprintf(what, sizeof what, "%s: rule %zu ('%.64s')", rules_row(kind), idx + 1, r->subject);
    while (p < e) {
        while (p < e && is_blank(*p))
            p++;
        if (p == e)
            break;
        const char *t = p;
        while (p < e && !is_blank(*p))
            p++;
        const char *eq = memchr(t, '=', (size_t)(p - t));
        char key[32], value[KVS_CONFIG_PATH_MAX];
        if (eq == NULL || eq == t || (size_t)(eq - t) >= sizeof key ||
            (size_t)(p - eq - 1) >= sizeof value) {
            return kvs_fail(err, KVS_EINVAL, "%s: '%.*s' is not key=value", what,
                            (int)(p - t > 64 ? 64 : p - t), t);
        }
        memcpy(key, t, (size_t)(eq - t));
        key[eq - t] = '\0';
        memcpy(value, eq + 1, (size_t)(p - eq - 1));
        value[p - eq - 1] = '\0';
        if ((rc = rule_set_key(kind, r, key, value, what, err)) != 0)
            return rc;
    }
    return 0;
}

/* The text [s, e) of one rule, as rules_walk hands it to its callback. */
typedef struct rule_span {
    const char *s, *e;
} rule_span;

/* Walks a list: fn(ctx, rule, index, its text) for each; stops at fn's non-zero. */
static int rules_walk(kvs_config_rule_kind kind, const char *text, int subject_only,
                      int (*fn)(void *ctx, const kvs_config_rule *r, size_t idx, rule_span sp,
                                char *err),
                      void *ctx, char *err)
{
    kvs_config_rule r;
    size_t idx = 0;
    const char *p = text ? text : "";
    for (;;) {
        while (is_blank(*p))
            p++;
        if (*p == '\0')
            return 0;
        const char *e = strchr(p, ';');
        const char *next = e ? e + 1 : p + strlen(p);
        if (e == NULL)
            e = next;
        while (e > p && is_blank(e[-1]))
            e--;
        if (e == p) {
            return kvs_fail(err, KVS_EINVAL, "%s: rule %zu is empty (a stray ';')",
                            rules_row(kind), idx + 1);
        }
        int rc = rule_parse(kind, p, e, idx, subject_only, &r, err);
        if (rc == 0)
            rc = fn(ctx, &r, idx, (rule_span){p, e}, err);
        if (rc != 0)
            return rc;
        idx++;
        p = next;
    }
}

/* Canonical text of one rule, appended to buf (cap bytes) at *used. */
static int rule_render(const kvs_config_rule *r, char *buf, size_t cap, size_t *used)
{
    char q[40] = "";
    if (r->has_quota) {
        static const char *const units[] = {"TiB", "GiB", "MiB", "KiB"};
        static const unsigned shift[] = {40, 30, 20, 10};
        snprintf(q, sizeof q, " quota=%" PRIu64, r->quota);
        for (size_t i = 0; i < 4 && r->quota != 0; i++) {
            if (r->quota % (UINT64_C(1) << shift[i]) == 0) {
                snprintf(q, sizeof q, " quota=%" PRIu64 "%s", r->quota >> shift[i], units[i]);
                break;
            }
        }
    }
    const char *koff = r->key_offsets < 0 ? ""
                       : r->key_offsets   ? " key_offsets=true"
                                          : " key_offsets=false";
    int n =
        snprintf(buf + *used, cap - *used, "%s%s%s%s%s%s%s%s%s%s%s", *used ? "; " : "", r->subject,
                 r->scheme ? " scheme=" : "", r->scheme ? k_schemes[r->scheme - 1] : "",
                 r->fp16 < 0 ? ""
                 : r->fp16   ? " fp16=true"
                             : " fp16=false",
                 r->skip_layers[0] ? " skip_layers=" : "", r->skip_layers, koff,
                 r->profile[0] ? " profile=" : "", r->profile, q);
    if (n < 0 || (size_t)n >= cap - *used)
        return -1;
    *used += (size_t)n;
    return 0;
}

typedef struct canon_ctx {
    kvs_config_rule_kind kind;
    const char *text;
    char *out;
    size_t cap, used;
} canon_ctx;

typedef struct dup_ctx {
    const char *subject;
    size_t before;
} dup_ctx;

static int dup_fn(void *ctx, const kvs_config_rule *r, size_t idx, rule_span sp, char *err)
{
    dup_ctx *d = ctx;
    (void)sp;
    (void)err;
    if (idx >= d->before)
        return 1; /* stop: only the rules before */
    return strcmp(r->subject, d->subject) == 0 ? 2 : 0;
}

static int canon_fn(void *ctx, const kvs_config_rule *r, size_t idx, rule_span sp, char *err)
{
    canon_ctx *cc = ctx;
    (void)sp;
    dup_ctx d = {.subject = r->subject, .before = idx};
    if (idx > 0 && rules_walk(cc->kind, cc->text, 1, dup_fn, &d, NULL) == 2) {
        return kvs_fail(err, KVS_EINVAL, "%s: rule %zu: '%.64s' already has a rule",
                        rules_row(cc->kind), idx + 1, r->subject);
    }
    if (cc->out && rule_render(r, cc->out, cc->cap, &cc->used) != 0) {
        return kvs_fail(err, KVS_EINVAL, "%s: longer than %zu bytes", rules_row(cc->kind),
                        cc->cap - 1);
    }
    return 0;
}

/* Checks text and, when out is not NULL, writes its canonical form there. */
static int rules_canon(kvs_config_rule_kind kind, const char *text, char *out, size_t cap,
                       char *err)
{
    canon_ctx cc = {.kind = kind, .text = text, .out = out, .cap = cap, .used = 0};
    if (out)
        out[0] = '\0';
    return rules_walk(kind, text, 0, canon_fn, &cc, err);
}

int kvs_config_rules_check(kvs_config_rule_kind kind, const char *text, char *err)
{
    return rules_canon(kind, text, NULL, 0, err);
}

typedef struct each_ctx {
    int (*fn)(void *ctx, const kvs_config_rule *r);
    void *ctx;
} each_ctx;

static int each_fn(void *ctx, const kvs_config_rule *r, size_t idx, rule_span sp, char *err)
{
    each_ctx *e = ctx;
    (void)idx;
    (void)sp;
    (void)err;
    return e->fn(e->ctx, r);
}

int kvs_config_rules_each(kvs_config_rule_kind kind, const char *text,
                          int (*fn)(void *ctx, const kvs_config_rule *r), void *ctx, char *err)
{
    each_ctx e = {.fn = fn, .ctx = ctx};
    return rules_walk(kind, text, 0, each_fn, &e, err);
}

typedef struct find_ctx {
    kvs_config_rule_kind kind;
    const char *text;
    const char *name;
    size_t len;
    long best_rank;
    size_t best_idx;
    rule_span best;
} find_ctx;

/* Rank of a subject for name: -1 no match; exact 2*len+1; prefix pattern 2*prefix. */
static long match_rank(kvs_config_rule_kind kind, const char *subject, const char *name,
                       size_t len)
{
    size_t n = strlen(subject);
    if (n == len && memcmp(subject, name, len) == 0)
        return 2 * (long)len + 1;
    if (kind == KVS_RULES_MODEL && n > 0 && subject[n - 1] == '*' && len >= n - 1 &&
        memcmp(subject, name, n - 1) == 0)
        return 2 * (long)(n - 1);
    return -1;
}

static int find_fn(void *ctx, const kvs_config_rule *r, size_t idx, rule_span sp, char *err)
{
    find_ctx *f = ctx;
    (void)err;
    long rank = match_rank(f->kind, r->subject, f->name, f->len);
    if (rank > f->best_rank) {
        f->best_rank = rank;
        f->best_idx = idx;
        f->best = sp;
    }
    return 0;
}

/* Subjects first (cheap), then the one winning rule parsed whole. The list was
 * checked when it was set, so parsing its rules cannot fail. */
static int rules_find(kvs_config_rule_kind kind, const char *text, const char *name, size_t len,
                      kvs_config_rule *out)
{
    find_ctx f = {.kind = kind, .text = text, .name = name, .len = len, .best_rank = -1};
    if (rules_walk(kind, text, 1, find_fn, &f, NULL) != 0 || f.best_rank < 0)
        return 0;
    return rule_parse(kind, f.best.s, f.best.e, f.best_idx, 0, out, NULL) == 0;
}

int kvs_config_model_rule(const kvs_config *c, const char *model, size_t len,
                          kvs_config_rule *out)
{
    return rules_find(KVS_RULES_MODEL, c->model_rules, model ? model : "", model ? len : 0, out);
}

int kvs_config_tenant_rule(const kvs_config *c, const char *name, kvs_config_rule *out)
{
    return rules_find(KVS_RULES_TENANT, c->tenant_rules, name, strlen(name), out);
}

typedef struct own_ctx {
    const char *name;
    char *out;
    size_t len;
} own_ctx;

static int own_fn(void *ctx, const kvs_config_rule *r, size_t idx, rule_span sp, char *err)
{
    own_ctx *o = ctx;
    (void)idx;
    (void)err;
    if (strcmp(r->subject, o->name) != 0)
        return 0;
    size_t n = (size_t)(sp.e - sp.s);
    if (n >= o->len) /* never for a rule of a checked list in a row's buffer */
        return 0;
    memcpy(o->out, sp.s, n);
    o->out[n] = '\0';
    return 1;
}

void kvs_config_tenant_rule_text(const kvs_config *c, const char *name, char *out, size_t len)
{
    if (len == 0)
        return;
    out[0] = '\0';
    own_ctx o = {.name = name ? name : "", .out = out, .len = len};
    (void)rules_walk(KVS_RULES_TENANT, c->tenant_rules, 1, own_fn, &o, NULL);
}

/* The row a string field is, when it holds a rule list; -1 otherwise. */
static int rules_kind_of(const kvs_config_def *d)
{
    if (d->offset == offsetof(kvs_config, model_rules))
        return KVS_RULES_MODEL;
    if (d->offset == offsetof(kvs_config, tenant_rules))
        return KVS_RULES_TENANT;
    return -1;
}

static const char *const k_size_units[] = {"b", "k", "kb", "kib", "m", "mb", "mib", "g",
                                           "gb", "gib", "t", "tb", "tib", NULL};
static const int64_t k_size_mult[] = {1, 1 << 10, 1 << 10, 1 << 10, 1 << 20, 1 << 20, 1 << 20,
                                      GiB, GiB, GiB, TiB, TiB, TiB};

static int parse_size_text(const char *v, int64_t *out)
{
    return parse_scaled(v, k_size_units, k_size_mult, out);
}

int kvs_config_parse_bytes(const char *v, uint64_t *out)
{
    int64_t n;
    if (v == NULL || *v < '0' || *v > '9' || parse_size_text(v, &n) != 0 || n < 0)
        return -1;
    *out = (uint64_t)n;
    return 0;
}

static int parse_value(const kvs_config_def *d, const char *value, int64_t *num, char *err)
{
    static const char *const dur_units[] = {"ms", "s", "m", NULL};
    static const int64_t dur_mult[] = {1, 1000, 60000};
    int rc = 0;
    switch (d->type) {
    case KVS_CFG_INT:
        rc = parse_scaled(value, NULL, NULL, num);
        break;
    case KVS_CFG_SIZE:
        rc = parse_scaled(value, k_size_units, k_size_mult, num);
        break;
    case KVS_CFG_DURATION:
        rc = parse_scaled(value, dur_units, dur_mult, num);
        break;
    case KVS_CFG_ENUM:
        for (int64_t i = 0; d->enums[i]; i++) {
            if (strcasecmp(value, d->enums[i]) == 0) {
                *num = i;
                return 0;
            }
        }
        if (d->enums == k_log_levels && strcasecmp(value, "warning") == 0) {
            *num = KVS_LOG_WARN;
            return 0;
        }
        if (d->enums == k_on_off) { /* on/off rows are booleans: every spelling of one */
            int b;
            if (kvs_config_parse_bool(value, &b) == 0) {
                *num = b;
                return 0;
            }
            return kvs_fail(err, KVS_EINVAL,
                            "%s: '%.64s' is not on or off (true/false, yes/no, 1/0 also do)",
                            d->name, value);
        }
        {
            char allowed[256], unused[8];
            kvs_config_def_bounds(d, allowed, sizeof allowed, unused, sizeof unused);
            (void)kvs_fail(err, 0, "%s: '%s' is not one of %s", d->name, value, allowed);
        }
        return KVS_EINVAL;
    case KVS_CFG_STRING: {
        size_t len = strlen(value);
        if ((int64_t)len < d->min || (int64_t)len > d->max) {
            return kvs_fail(err, KVS_EINVAL, "%s: length %zu is outside %" PRId64 "..%" PRId64,
                            d->name, len, d->min, d->max);
        }
        if (rules_kind_of(d) >= 0)
            return kvs_config_rules_check((kvs_config_rule_kind)rules_kind_of(d), value, err);
        if (d->offset == offsetof(kvs_config, skip_layers) && walk_layer_list(value, 0) < 0) {
            return kvs_fail(err, KVS_EINVAL,
                            "%s: '%s' is not a list of layers like \"0,30-31\" (each 0..1023)",
                            d->name, value);
        }
        return 0;
    }
    }
    if (rc != 0) {
        return kvs_fail(err, KVS_EINVAL, "%s: '%s' is not a valid %s", d->name, value,
                        kvs_config_def_type_name(d));
    }
    if (*num < d->min || *num > d->max) {
        return kvs_fail(err, KVS_EINVAL, "%s: %s is outside %" PRId64 "..%" PRId64, d->name, value,
                        d->min, d->max);
    }
    return 0;
}

typedef struct profile_check_ctx {
    char *err;
    int rc;
} profile_check_ctx;

static int profile_check_fn(void *ctx, const kvs_config_rule *r)
{
    profile_check_ctx *pc = ctx;
    if (r->profile[0] == '\0')
        return 0;
    char why[KVS_ERR_LEN];
    pc->rc = kvs_profiles_check_file(r->profile, why);
    if (pc->rc != 0)
        (void)kvs_fail(pc->err, 0, "model_rules: rule '%.64s': %s", r->subject, why);
    return pc->rc != 0;
}

/* Every profile a model rule list names must read and validate: a bad one is
 * the setting's error, so a config file or SetConfig with it changes nothing. */
static int check_profiles(const char *rules, char *err)
{
    profile_check_ctx pc = {err, 0};
    int rc = kvs_config_rules_each(KVS_RULES_MODEL, rules, profile_check_fn, &pc, err);
    return pc.rc || rc ? KVS_EINVAL : 0; /* a bad value, whatever the file's error */
}

/* 1 when s is UTF-8 (RFC 3629). A setting's value comes back in the string
 * fields of GetConfig's and SetConfig's replies, and strict protobuf parsers
 * (python, Go, Java) refuse a whole message with one string that is not UTF-8;
 * protobuf-c checks nothing, and neither do the file, environment and flags.
 * glibc's UTF-8 decoder refuses overlong forms, surrogates and truncation but
 * accepts code points past U+10FFFF, hence the bound. */
static locale_t g_utf8; /* C.UTF-8's LC_CTYPE (built into glibc since 2.35) */
static pthread_once_t g_utf8_once = PTHREAD_ONCE_INIT;

static void utf8_init(void)
{
    g_utf8 = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
}

static int utf8_valid(const char *s)
{
    size_t n = strlen(s), i = 0;
    for (; i < n && (unsigned char)s[i] < 0x80; i++)
        ;
    if (i == n)
        return 1; /* ASCII: every setting but an odd model pattern */
    pthread_once(&g_utf8_once, utf8_init);
    if (g_utf8 == (locale_t)0)
        return 0; /* cannot check: refuse non-ASCII rather than pass it on */
    locale_t old = uselocale(g_utf8);
    mbstate_t st;
    memset(&st, 0, sizeof st);
    int ok = 1;
    while (ok && i < n) {
        wchar_t wc;
        size_t r = mbrtowc(&wc, s + i, n - i, &st);
        ok = r != (size_t)-1 && r != (size_t)-2 && r != 0 && (uint32_t)wc <= 0x10FFFF;
        i += ok ? r : 0;
    }
    uselocale(old);
    return ok;
}

int kvs_config_set(kvs_config *c, const kvs_config_def *d, const char *value, char *err)
{
    if (d == NULL || value == NULL) {
        return kvs_fail(err, KVS_EINVAL, "missing setting or value");
    }
    if (!utf8_valid(value))
        return kvs_fail(err, KVS_EINVAL, "%s: not UTF-8 (a setting is text)", d->name);
    int64_t num = 0;
    int rc = parse_value(d, value, &num, err);
    if (rc != 0)
        return rc;
    char *field = (char *)c + d->offset;
    if (rules_kind_of(d) >= 0) {
        char canon[KVS_CONFIG_STR_MAX];
        rc = rules_canon((kvs_config_rule_kind)rules_kind_of(d), value, canon, sizeof canon, err);
        if (rc == 0 && rules_kind_of(d) == KVS_RULES_MODEL)
            rc = check_profiles(canon, err);
        if (rc != 0)
            return rc;
        memcpy(field, canon, strlen(canon) + 1);
    } else if (d->type == KVS_CFG_STRING)
        memcpy(field, value, strlen(value) + 1);
    else
        memcpy(field, &num, sizeof num);
    return 0;
}

int kvs_config_set_by_name(kvs_config *c, const char *name, const char *value, char *err)
{
    const kvs_config_def *d = kvs_config_find(name);
    if (d == NULL) {
        return kvs_fail(err, KVS_EINVAL, "unknown setting '%s'", name ? name : "(null)");
    }
    return kvs_config_set(c, d, value, err);
}

void kvs_config_format(const kvs_config *c, const kvs_config_def *d, char *buf, size_t n)
{
    const char *field = (const char *)c + d->offset;
    int64_t v;
    if (d->type == KVS_CFG_STRING) {
        snprintf(buf, n, "%s", field);
        return;
    }
    memcpy(&v, field, sizeof v);
    if (d->type == KVS_CFG_ENUM)
        snprintf(buf, n, "%s", d->enums[v]);
    else
        snprintf(buf, n, "%" PRId64, v);
}

void kvs_config_defaults(kvs_config *c)
{
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < k_count; i++) {
        int rc = kvs_config_set(c, &k_table[i], k_table[i].def, NULL);
        KVS_ASSERT(rc == 0); /* a default outside its own bounds is a programming error */
    }
}

void kvs_config_apply(const kvs_config *c)
{
    for (size_t i = 0; i < k_count; i++)
        if (k_table[i].apply)
            k_table[i].apply(c);
}

/* tenant_rules comes from [tenant.NAME] sections and SetConfig only: the
 * server sets the tenants' quotas from those sections at start. */
static int sections_only(const kvs_config_def *d, const char *where, char *err)
{
    if (d == NULL || d->offset != offsetof(kvs_config, tenant_rules))
        return 0;
    return kvs_fail(err, KVS_EINVAL,
                    "%s tenant_rules: write the keys into [tenant.NAME] sections of the config "
                    "file, or change them at run time with SetConfig",
                    where);
}

/* inih callback state. */
typedef struct ini_state {
    kvs_config *cfg;
    char msg[KVS_ERR_LEN];
    char last[2][KVS_CONFIG_SUBJECT_MAX + 1]; /* subject of the last rule, per kind */
} ini_state;

/* One key of a [tenant.NAME] or [model.PATTERN] section into its rule list:
 * appended to the section's rule (made when its first key arrives). */
static int ini_rule_key(ini_state *st, kvs_config_rule_kind kind, const char *section,
                        const char *subject, const char *key, const char *value)
{
    kvs_config_rule r;
    char what[KVS_CONFIG_SUBJECT_MAX + 16];
    snprintf(what, sizeof what, "[%.*s]", KVS_CONFIG_SUBJECT_MAX + 8, section);
    rule_init(&r);
    if (rule_subject(kind, subject, strlen(subject), 0, &r, st->msg) != 0 ||
        rule_set_key(kind, &r, key, value, what, st->msg) != 0)
        return 0;
    char one[KVS_CONFIG_STR_MAX];
    size_t used = 0;
    if (rule_render(&r, one, sizeof one, &used) != 0) {
        snprintf(st->msg, sizeof st->msg, "%.64s: value too long", what);
        return 0;
    }
    const char *list = kind == KVS_RULES_TENANT ? st->cfg->tenant_rules : st->cfg->model_rules;
    char next[KVS_CONFIG_STR_MAX + KVS_CONFIG_STR_MAX];
    int same = strcmp(st->last[kind], subject) == 0 && list[0] != '\0';
    const char *sep = same || list[0] == '\0' ? "" : "; ";
    const char *add = same ? one + strlen(r.subject) : one;
    size_t nl = strlen(list), ns = strlen(sep), na = strlen(add);
    if (nl + ns + na >= KVS_CONFIG_STR_MAX) {
        snprintf(st->msg, sizeof st->msg, "%s: the rules grow longer than %d bytes",
                 rules_row(kind), KVS_CONFIG_STR_MAX - 1);
        return 0;
    }
    memcpy(next, list, nl);
    memcpy(next + nl, sep, ns);
    memcpy(next + nl + ns, add, na + 1);
    snprintf(st->last[kind], sizeof st->last[kind], "%s", subject);
    const kvs_config_def *d = kvs_config_find(rules_row(kind));
    return kvs_config_set(st->cfg, d, next, st->msg) == 0;
}

static int on_ini(void *user, const char *section, const char *name, const char *value)
{
    ini_state *st = user;
    /* inih reports the first failing line but goes on reading: keep that
     * line's message, not the last one's. */
    if (st->msg[0] != '\0')
        return 0;
    /* [tenant.NAME] sections belong to tenants.c, which reads the same file;
     * their scheme keys and quota also make NAME's tenant rule. */
    if (strncmp(section, "tenant.", 7) == 0) {
        if (strcmp(name, "scheme") && strcmp(name, "fp16") && strcmp(name, "skip_layers") &&
            strcmp(name, "quota"))
            return 1;
        return ini_rule_key(st, KVS_RULES_TENANT, section, section + 7, name, value);
    }
    if (strncmp(section, "model.", 6) == 0)
        return ini_rule_key(st, KVS_RULES_MODEL, section, section + 6, name, value);
    if (section[0] != '\0' && strcmp(section, "kvstashd") != 0) {
        snprintf(st->msg, sizeof st->msg, "unknown section [%s]", section);
        return 0;
    }
    if (sections_only(kvs_config_find(name), "key", st->msg) != 0)
        return 0;
    return kvs_config_set_by_name(st->cfg, name, value, st->msg) == 0;
}

int kvs_config_load_file(kvs_config *c, const char *path, char *err)
{
    if (strlen(path) >= sizeof c->config_file) {
        return kvs_fail(err, KVS_EINVAL, "config file name longer than %zu bytes",
                        sizeof c->config_file - 1);
    }
    kvs_config tmp = *c;
    ini_state st = {.cfg = &tmp, .msg = "", .last = {"", ""}};
    int rc = ini_parse(path, on_ini, &st);
    if (rc == -1) {
        return kvs_fail(err, KVS_EIO, "%s: cannot open: %s", path, strerror(errno));
    }
    if (rc == -2) {
        return kvs_fail(err, KVS_ENOMEM, "%s: out of memory", path);
    }
    if (rc > 0) {
        return kvs_fail(err, KVS_EINVAL, "%s:%d: %s", path, rc,
                        st.msg[0] ? st.msg : "syntax error");
    }
    snprintf(tmp.config_file, sizeof tmp.config_file, "%s", path);
    *c = tmp;
    return 0;
}

int kvs_config_load_env(kvs_config *c, char *const *envp, char *err)
{
    static const char prefix[] = "KVSTASH_";
    kvs_config tmp = *c;
    for (; envp && *envp; envp++) {
        if (strncmp(*envp, prefix, sizeof prefix - 1) != 0)
            continue;
        const char *kv = *envp + sizeof prefix - 1;
        const char *eq = strchr(kv, '=');
        if (eq == NULL || (size_t)(eq - kv) >= 64)
            continue;
        char name[64];
        size_t len = (size_t)(eq - kv);
        for (size_t i = 0; i < len; i++)
            name[i] = (char)((kv[i] >= 'A' && kv[i] <= 'Z') ? kv[i] - 'A' + 'a' : kv[i]);
        name[len] = '\0';
        const kvs_config_def *d = kvs_config_find(name);
        if (d == NULL)
            continue;
        char msg[KVS_ERR_LEN];
        if (sections_only(d, "environment", msg) != 0 ||
            kvs_config_set(&tmp, d, eq + 1, msg) != 0) {
            return kvs_fail(err, KVS_EINVAL, "environment %.*s: %s", (int)(eq - *envp), *envp, msg);
        }
    }
    *c = tmp;
    return 0;
}

int kvs_config_from_args(kvs_config *c, int argc, char **argv, char *const *envp,
                         kvs_config_action *action, char *err)
{
    kvs_config_defaults(c);
    *action = KVS_CONFIG_RUN;

    /* The file comes first (lowest explicit precedence), so find it before the rest. */
    const char *file = NULL;
    for (char *const *e = envp; e && *e; e++)
        if (strncmp(*e, "KVSTASH_CONFIG=", 15) == 0)
            file = *e + 15;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0 || strcmp(argv[i], "-c") == 0) {
            if (i + 1 >= argc) {
                return kvs_fail(err, KVS_EINVAL, "%s needs a file name", argv[i]);
            }
            file = argv[++i];
        } else if (strncmp(argv[i], "--config=", 9) == 0) {
            file = argv[i] + 9;
        }
    }
    int rc;
    if (file && (rc = kvs_config_load_file(c, file, err)) != 0)
        return rc;
    if ((rc = kvs_config_load_env(c, envp, err)) != 0)
        return rc;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            *action = KVS_CONFIG_HELP;
            return 0;
        }
        if (strcmp(a, "--help-config-md") == 0) {
            *action = KVS_CONFIG_HELP_MD;
            return 0;
        }
        if (strcmp(a, "--version") == 0) {
            *action = KVS_CONFIG_VERSION;
            return 0;
        }
        if (strcmp(a, "--config") == 0 || strcmp(a, "-c") == 0) {
            i++;
            continue;
        }
        if (strncmp(a, "--config=", 9) == 0)
            continue;
        if (strncmp(a, "--", 2) != 0) {
            return kvs_fail(err, KVS_EINVAL, "unexpected argument '%s' (see --help)", a);
        }
        char name[64];
        const char *value;
        const char *eq = strchr(a + 2, '=');
        size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        if (len >= sizeof name) {
            return kvs_fail(err, KVS_EINVAL, "unknown option '%s' (see --help)", a);
        }
        memcpy(name, a + 2, len);
        name[len] = '\0';
        const kvs_config_def *d = kvs_config_find(name);
        if (d == NULL) {
            return kvs_fail(err, KVS_EINVAL, "unknown option '--%s' (see --help)", name);
        }
        if ((rc = sections_only(d, "option", err)) != 0)
            return rc;
        if (eq) {
            value = eq + 1;
        } else {
            if (i + 1 >= argc) {
                return kvs_fail(err, KVS_EINVAL, "--%s needs a value", name);
            }
            value = argv[++i];
        }
        if ((rc = kvs_config_set(c, d, value, err)) != 0)
            return rc;
    }
    return 0;
}

void kvs_config_print_usage(FILE *f, const char *prog)
{
    fprintf(f,
            "usage: %s [--config FILE] [--NAME VALUE]...\n"
            "\n"
            "kvstashd, the kvstash cache node. Settings come from the embedded defaults,\n"
            "then the config file (INI; --config or KVSTASH_CONFIG), then environment\n"
            "variables KVSTASH_<NAME>, then flags. Settings marked [runtime] can also be\n"
            "changed while the server runs with SetConfig (kvstash config set).\n"
            "\n"
            "  --help               this text\n"
            "  --help-config-md     the settings as a Markdown table\n"
            "  --version            print the version\n"
            "  --config FILE, -c FILE  read settings from FILE\n\n",
            prog);
    for (size_t i = 0; i < k_count; i++) {
        const kvs_config_def *d = &k_table[i];
        char min[256], max[64];
        kvs_config_def_bounds(d, min, sizeof min, max, sizeof max);
        char flag[80];
        snprintf(flag, sizeof flag, "--%s %s", d->name,
                 d->type == KVS_CFG_ENUM ? "CHOICE" : kvs_config_def_type_name(d));
        for (char *p = flag + 2; *p && *p != ' '; p++)
            if (*p == '_')
                *p = '-';
        fprintf(f, "  %-30s %s%s\n  %30s default: %s%s%s\n", flag, d->help,
                d->runtime ? " [runtime]" : "", "", d->def[0] ? d->def : "\"\"",
                d->type == KVS_CFG_ENUM ? "; one of " : "",
                d->type == KVS_CFG_ENUM ? min : "");
    }
}

void kvs_config_print_markdown(FILE *f)
{
    fprintf(f, "| name | type | default | bounds | runtime | meaning |\n"
               "|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < k_count; i++) {
        const kvs_config_def *d = &k_table[i];
        char min[256], max[64], bounds[400];
        kvs_config_def_bounds(d, min, sizeof min, max, sizeof max);
        if (d->type == KVS_CFG_ENUM)
            snprintf(bounds, sizeof bounds, "%s", min);
        else if (d->type == KVS_CFG_STRING)
            snprintf(bounds, sizeof bounds, "≤ %s", max);
        else
            snprintf(bounds, sizeof bounds, "%s … %s", min, max);
        for (char *p = bounds; *p; p++)
            if (*p == '|')
                *p = '/';
        fprintf(f, "| `%s` | %s | `%s` | %s | %s | %s |\n", d->name, kvs_config_def_type_name(d),
                d->def[0] ? d->def : "\"\"", bounds, d->runtime ? "yes" : "no", d->help);
    }
}
