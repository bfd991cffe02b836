/*
 * config.h — kvstashd's configuration: one table drives everything.
 *
 * Every setting is one row of a table (name, type, bounds, default, field,
 * runtime flag, help), as Redis' static_configs[]. The same rows feed:
 *   - the defaults embedded in the binary,
 *   - the config file (INI, parsed by inih; keys at top level or under
 *     [kvstashd]),
 *   - the environment (KVSTASH_<NAME>, e.g. KVSTASH_LOG_LEVEL=debug),
 *   - command-line flags (--name VALUE or --name=VALUE, '-' and '_' alike),
 *   - the GetConfig / SetConfig RPCs (rows marked runtime only),
 *   - `kvstashd --help` and the table in docs/OPERATIONS.md
 *     (`kvstashd --help-config-md`).
 * Precedence, lowest first: default < file < environment < flags.
 *
 * kvs_config is a plain value struct: copy it freely. Whoever shares one
 * between threads (the server) guards it; this module holds no global state.
 */
#ifndef KVS_CONFIG_H
#define KVS_CONFIG_H

#include "kvs_log.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Longest value text of any row (GetConfig / SetConfig buffers use it), and
 * the size of the plain string rows (addresses, paths, layer lists). */
#define KVS_CONFIG_STR_MAX 4096
#define KVS_CONFIG_PATH_MAX 512

typedef struct kvs_config {
    char listen[KVS_CONFIG_PATH_MAX];    /* host:port of the gRPC listener */
    char port_file[KVS_CONFIG_PATH_MAX]; /* write the bound port here ("" = no) */
    int64_t threads;                    /* gRPC worker threads */
    int64_t log_level;                  /* kvs_log_level */
    int64_t capacity;                   /* store capacity in bytes */
    int64_t prefault_memory;            /* 1: populate the memory tier at start */
    int64_t max_message_bytes;          /* largest gRPC message received */
    int64_t max_concurrent_streams;     /* per connection (HTTP/2) */
    int64_t calls_per_method;           /* outstanding accepted calls per method */
    int64_t shutdown_grace_ms;          /* in-flight calls get this long on SIGTERM */
    /* Operator surfaces (service/ops.c, metrics_http.c, trace_rec.c). */
    char metrics_listen[KVS_CONFIG_PATH_MAX];    /* /metrics HTTP host:port ("" = off) */
    char metrics_port_file[KVS_CONFIG_PATH_MAX]; /* write the /metrics port here ("" = no) */
    char record_trace[KVS_CONFIG_PATH_MAX];      /* Mooncake-format request trace ("" = off) */
    char tls_cert[KVS_CONFIG_PATH_MAX];          /* PEM certificate chain ("" = plaintext) */
    char tls_key[KVS_CONFIG_PATH_MAX];           /* PEM private key of tls_cert */
    char tls_client_ca[KVS_CONFIG_PATH_MAX];     /* PEM CA: require client certificates */
    /* The data path (Lookup, Put, Get, ...) and the store behind it. */
    int64_t max_blocks_per_request;     /* Lookup blocks, Get/Delete/Pin/Unpin keys */
    int64_t policy;                     /* eviction policy: index into kvs_config_policy_name() */
    int64_t high_watermark_pct;         /* % of capacity that starts eviction */
    int64_t low_watermark_pct;          /* eviction goes down to this % */
    int64_t lease_ms;                   /* default read lease granted by Lookup */
    int64_t lease_blocks_per_tenant;    /* blocks one tenant's live Lookup leases may hold */
    int64_t default_scheme;             /* kvs_scheme - 1: 0 fp16, 1 fp8_e4m3, 2 fp8_e5m2, 3 int8 */
    int64_t k_outliers;                 /* outliers kept per K scale group */
    int64_t v_outliers;                 /* outliers kept per V scale group */
    int64_t sinks;                      /* leading tokens of a root block kept at fp16 */
    int64_t key_offsets;                /* 1: 8-bit K tiles carry per-channel key offsets */
    char skip_layers[KVS_CONFIG_PATH_MAX]; /* "0,31": layers always stored at fp16 */
    /* Scheme rules per model and per tenant (rule lists, see below). */
    char model_rules[KVS_CONFIG_STR_MAX];  /* from [model.PATTERN] sections */
    char tenant_rules[KVS_CONFIG_STR_MAX]; /* from [tenant.NAME] sections */
    int64_t ingest_backend;             /* kvs_config_backend: auto, cpu, gpu */
    int64_t ingest_threads;             /* quantize-on-ingest worker threads */
    char ssd_dir[KVS_CONFIG_PATH_MAX];   /* SSD tier directory ("" = no SSD tier) */
    int64_t ssd_capacity;               /* SSD tier bytes (0 = unbounded) */
    /* The UCX data plane (service/data_connect.c, transfer/xfer.h). */
    int64_t ucx;                        /* 1: serve Connect and UCX fetches; 0: gRPC only */
    int64_t ucx_addr_check; /* 1: Connect addresses are tried in kvstash-ucx-addrcheck first */
    int64_t ucx_isolate;    /* 1: UCX runs in kvstash-xferd, a child process (restart-only) */
    int64_t ucx_op_timeout_ms;          /* a UCX fetch older than this closes its session */
    int64_t ucx_max_sessions;           /* Connect refuses more open UCX sessions than this */
    /* Not a row: the INI file kvs_config_load_file read last ("" = none);
     * the server reads its [tenant.NAME] sections (tenants.h). */
    char config_file[KVS_CONFIG_PATH_MAX];
} kvs_config;

typedef enum kvs_config_type {
    KVS_CFG_INT,       /* decimal integer */
    KVS_CFG_SIZE,      /* bytes; suffixes k, M, G, T (powers of 1024), optional "iB"/"B" */
    KVS_CFG_STRING,
    KVS_CFG_ENUM,      /* one of enum_names; stored as its index */
    KVS_CFG_DURATION,  /* milliseconds; suffixes ms, s, m */
} kvs_config_type;

typedef struct kvs_config_def kvs_config_def;

/* Number of rows and the table itself (static storage). */
size_t kvs_config_count(void);
const kvs_config_def *kvs_config_at(size_t i);
/* Finds a row by name; '-' and '_' are equivalent. NULL when unknown. */
const kvs_config_def *kvs_config_find(const char *name);

const char *kvs_config_def_name(const kvs_config_def *d);
const char *kvs_config_def_help(const kvs_config_def *d);
const char *kvs_config_def_type_name(const kvs_config_def *d);
const char *kvs_config_def_default(const kvs_config_def *d);
int kvs_config_def_runtime(const kvs_config_def *d);
/* Bounds as text: numeric rows give min and max; enum rows give the names
 * joined by '|' in min and "" in max; string rows give "" and the length. */
void kvs_config_def_bounds(const kvs_config_def *d, char *min, size_t nmin, char *max,
                           size_t nmax);

/* Name of the eviction policy a `policy` value stands for (static storage). */
const char *kvs_config_policy_name(int64_t policy);

/* Is layer in the comma-separated list of layer indices and ranges ("0,2-3,31")?
 * The list was validated when it was set. 1 yes, 0 no. */
int kvs_config_layer_listed(const char *list, uint32_t layer);

/* The spellings every setting takes, shared with the tenant sections
 * (tenants.c). Booleans: true/yes/1/on, false/no/0/off, any case (the on/off
 * settings take them too and show on or off). Bytes: a
 * non-negative integer with an optional b, k/kb/kib, m/mb/mib, g/gb/gib or
 * t/tb/tib suffix (powers of 1024, any case). 0, or -1 with *out untouched. */
int kvs_config_parse_bool(const char *v, int *out);
int kvs_config_parse_bytes(const char *v, uint64_t *out);

/*
 * Rule lists: the scheme per model and per tenant, and the tenants' quotas.
 *
 * Two rows hold lists of rules, "SUBJECT key=value ...; SUBJECT key=value ...":
 *   model_rules   SUBJECT is a model pattern: a fingerprint, or a prefix ending
 *                 in '*' ("llama-3-*", "*"); keys scheme, fp16, skip_layers,
 *                 profile, key_offsets.
 *   tenant_rules  SUBJECT is a declared tenant's name ("default" in open mode);
 *                 keys scheme, fp16, skip_layers, quota.
 * scheme is fp16|fp8_e4m3|fp8_e5m2|int8, fp16 a boolean (the fp16 fallback),
 * key_offsets a boolean (per-channel key offsets for the model's blocks, in
 * place of the key_offsets setting), skip_layers a layer list like
 * "0,30-31", quota a size (0: none), profile the path of a calibration
 * profile (no blank, no ';'; relative to kvstashd's
 * working directory): kvs_config_set reads and validates every profile of
 * the model_rules it is given (kvs_profiles_check_file), so a missing or bad
 * file is a config error naming it; the server loads them (profiles.h) and a
 * Put of a matching model takes its per-tensor scales. Subjects
 * contain no blank and no ';', appear once per list, and each key at most once
 * per rule. A value is stored canonical (that text is what GetConfig shows and
 * what round-trips through SetConfig).
 *
 * The config file writes them as sections: the keys scheme, fp16, skip_layers
 * and quota of [tenant.NAME] (tenants.h) make NAME's tenant rule, and a
 * [model.PATTERN] section (keys scheme, fp16, skip_layers, profile,
 * key_offsets) makes a model rule.
 * model_rules may also be given whole as a key, flag or variable; tenant_rules
 * only through sections and SetConfig (the server sets the tenants' quotas from
 * the sections at start, so a flag could not be honoured there).
 *
 * Which rule applies to a Put, and the precedence of the scheme sources:
 * docs/OPERATIONS.md "Schemes per model and tenant"; data_put.c applies it.
 */
typedef enum kvs_config_rule_kind {
    KVS_RULES_MODEL = 0,
    KVS_RULES_TENANT = 1,
} kvs_config_rule_kind;

#define KVS_CONFIG_SUBJECT_MAX 256

typedef struct kvs_config_rule {
    char subject[KVS_CONFIG_SUBJECT_MAX + 1];
    unsigned scheme;        /* kvs_scheme 1..4; 0 = not set */
    int fp16;               /* 1 fallback on, 0 off, -1 not set */
    int key_offsets;        /* model rules: 1 on, 0 off, -1 not set (the setting's) */
    char skip_layers[KVS_CONFIG_PATH_MAX]; /* layer list; "" = none */
    char profile[KVS_CONFIG_PATH_MAX];     /* model rules: calibration profile; "" = none */
    int has_quota;          /* tenant rules */
    uint64_t quota;         /* bytes; 0 = none */
} kvs_config_rule;

/* Checks a rule list of `kind`. 0, or KVS_EINVAL with err naming the row, the
 * rule and the key. */
int kvs_config_rules_check(kvs_config_rule_kind kind, const char *text, char *err);

/* Calls fn for each rule of a list in order; a non-zero return from fn stops
 * the walk and is returned. KVS_EINVAL for a malformed list. */
int kvs_config_rules_each(kvs_config_rule_kind kind, const char *text,
                          int (*fn)(void *ctx, const kvs_config_rule *r), void *ctx, char *err);

/* The model rule for a fingerprint (len bytes): an exact pattern wins, then
 * the longest matching prefix pattern. 1 and *out filled, or 0 when none. */
int kvs_config_model_rule(const kvs_config *c, const char *model, size_t len,
                          kvs_config_rule *out);

/* The rule of tenant `name`. 1 and *out filled, or 0 when none. */
int kvs_config_tenant_rule(const kvs_config *c, const char *name, kvs_config_rule *out);

/* The text of NAME's own rule in c->tenant_rules ("NAME key=value ..."), into
 * out (len bytes), or "" when NAME has none: the row as a tenant that is not
 * an admin may see it (GetConfig shows no tenant another tenant's rule). */
void kvs_config_tenant_rule_text(const kvs_config *c, const char *name, char *out, size_t len);

/* The quantize-on-ingest backend an `ingest_backend` value asks for. */
typedef enum kvs_config_backend {
    KVS_BACKEND_AUTO = 0, /* the GPU when the build has CUDA and a device exists, else CPU */
    KVS_BACKEND_CPU = 1,
    KVS_BACKEND_GPU = 2,  /* required: no device is a start-up error */
} kvs_config_backend;

/* Fills c with the embedded defaults. */
void kvs_config_defaults(kvs_config *c);

/* Parses and range-checks value for row d and stores it in c. On error
 * returns KVS_EINVAL, leaves c unchanged and writes a message naming the
 * setting into err (KVS_ERR_LEN, may be NULL). */
int kvs_config_set(kvs_config *c, const kvs_config_def *d, const char *value, char *err);

/* Same, by name: unknown names are KVS_EINVAL "unknown setting 'x'". */
int kvs_config_set_by_name(kvs_config *c, const char *name, const char *value, char *err);

/* Runs every row's apply hook (e.g. log_level sets the process log level).
 * The server calls it at start and after each SetConfig. */
void kvs_config_apply(const kvs_config *c);

/* Current value of row d as text, into buf (always NUL-terminated). */
void kvs_config_format(const kvs_config *c, const kvs_config_def *d, char *buf, size_t n);

/* Applies an INI file. KVS_EIO when it cannot be read, KVS_EINVAL with
 * "FILE:LINE: ..." for a syntax error, an unknown key or a bad value. */
int kvs_config_load_file(kvs_config *c, const char *path, char *err);

/* Applies KVSTASH_<NAME> variables found in envp (NULL-terminated).
 * Unknown KVSTASH_ variables are ignored (KVSTASH_SERVER is the CLI's). */
int kvs_config_load_env(kvs_config *c, char *const *envp, char *err);

typedef enum kvs_config_action {
    KVS_CONFIG_RUN = 0,
    KVS_CONFIG_HELP,        /* --help */
    KVS_CONFIG_HELP_MD,     /* --help-config-md */
    KVS_CONFIG_VERSION,     /* --version */
} kvs_config_action;

/* The whole start-up sequence: defaults, then --config FILE (or
 * KVSTASH_CONFIG) if given, then the environment, then the flags. Returns 0
 * and the action, or KVS_EINVAL / KVS_EIO with a message in err. */
int kvs_config_from_args(kvs_config *c, int argc, char **argv, char *const *envp,
                         kvs_config_action *action, char *err);

/* `kvstashd --help`, generated from the table. */
void kvs_config_print_usage(FILE *f, const char *prog);
/* The Markdown table for docs/OPERATIONS.md, generated from the table. */
void kvs_config_print_markdown(FILE *f);

#endif /* KVS_CONFIG_H */
