/*
 * tenants.h — who may call kvstashd: tenants, their bearer tokens, key
 * secrets, quotas and allowed model namespaces.
 *
 * The idea: the config file declares tenants as INI sections
 *
 *     [tenant.acme]
 *     token_sha256 = <64 hex digits>  ; the SHA-256 of the bearer token (recommended)
 *     token  = <bearer token>         ; or the token itself, 8..255 printable bytes
 *     secret = <key secret>           ; mixed into every chain key (docs/KEYSPEC.md)
 *     quota  = 8GiB                   ; payload bytes over all tiers (0 or absent: none)
 *     models = meta-llama/ *, qwen/Qwen2-7B  ; allowed model fingerprints (absent: any)
 *     fp16   = false                  ; true: store this tenant's blocks unquantized
 *     scheme = fp8_e4m3               ; this tenant's default scheme (absent: the server's)
 *     skip_layers = 0,31              ; layers kept at fp16, added to the server's list
 *     admin  = false                  ; true: may call SetConfig
 *     ucx    = true                   ; false: may not Connect (the UCX data
 *                                     ; plane trusts its peers; gRPC serves it)
 *
 * Exactly one of token_sha256 and token is required, and tokens are unique.
 * token_sha256 (any case; `kvstash token-hash` prints the line) keeps a usable
 * token out of the file: the UCX data plane process, kvstash-xferd, runs as
 * kvstashd's user and can read the file (docs/TRANSFER.md "Isolation"). A
 * `token =` line still works; kvs_tenants_log_plain() warns about each.
 * Either way the table keeps only the SHA-256 of a token, never the token.
 *
 * A model pattern ending in '*' matches every fingerprint with that prefix;
 * otherwise it must match exactly. With no [tenant.*] section the server runs
 * open: every caller, with or without a token, is the tenant "default" (id 0,
 * empty secret, no quota, any model, admin), so a fresh install needs no setup.
 * Declared tenants get ids 1, 2, ... in file order; there is then no default
 * tenant and a missing or unknown token is refused.
 *
 * The keys scheme, fp16, skip_layers and quota also make the tenant's rule in
 * the config row tenant_rules (config.h), which SetConfig can change while the
 * server runs: at run time that row, not this table, says what a tenant's
 * scheme, fp16 fallback, skip layers and quota are. The fields below hold the
 * values of the file (the server sets the store's quotas from them at start).
 *
 * The table is immutable after kvs_tenants_load: any number of threads may read
 * it without a lock. A bearer token is authenticated by hashing it (SHA-256,
 * OpenSSL) and comparing the digest with every tenant's in constant time.
 */
#ifndef KVS_TENANTS_H
#define KVS_TENANTS_H

#include <stddef.h>
#include <stdint.h>

#define KVS_TENANT_NAME_MAX       64   /* bytes of a tenant name, without the NUL */
#define KVS_TENANT_TOKEN_MAX      255  /* bytes of a `token =` value */
#define KVS_TENANT_TOKEN_HASH_LEN 32   /* SHA-256 */
#define KVS_TENANT_SECRET_MAX     1024 /* = KVS_SECRET_MAX of store/keys.h */
#define KVS_TENANT_MODELS_MAX     1024
#define KVS_TENANTS_MAX           1000 /* store tenant ids are uint16 */
#define KVS_TENANT_TOKEN_PLAIN    1    /* kvs_tenant.token_from: `token =` */
#define KVS_TENANT_TOKEN_HASH     2    /* kvs_tenant.token_from: `token_sha256 =` */

typedef struct kvs_tenant {
    uint16_t id;                    /* 0 = the open-mode default tenant */
    char name[KVS_TENANT_NAME_MAX + 1];
    uint8_t token_sha256[KVS_TENANT_TOKEN_HASH_LEN]; /* of the bearer token (never kept) */
    int token_from; /* the file's line: KVS_TENANT_TOKEN_HASH or KVS_TENANT_TOKEN_PLAIN
                     * (a usable token in the file); 0 for the open-mode default */
    uint8_t secret[KVS_TENANT_SECRET_MAX];
    size_t secret_len;
    uint64_t quota_bytes;           /* 0 = none */
    char models[KVS_TENANT_MODELS_MAX]; /* comma-separated patterns; "" = any */
    int fp16_only;
    int admin;
    int ucx; /* may open a UCX session (Connect); 1 unless the file says false */
    unsigned scheme;                /* default kvs_scheme for this tenant; 0 = the server's */
    char skip_layers[256];          /* layer list (config.h syntax); "" = none */
} kvs_tenant;

typedef struct kvs_tenants kvs_tenants;

/* Reads the [tenant.NAME] sections of the INI file at path (NULL or "": no
 * file, open mode). Every other section is ignored (config.c owns them).
 * Returns 0 and a table in *out (free with kvs_tenants_free), or KVS_EIO
 * (unreadable), KVS_EINVAL ("FILE:LINE: ..." for an unknown key, a bad value,
 * a duplicate token or name, a missing token or both token and token_sha256),
 * KVS_ENOMEM, KVS_EINTERNAL (OpenSSL could not hash); err says which, naming
 * the tenant and never echoing a token or a token_sha256 value. Logs nothing. */
int kvs_tenants_load(const char *path, kvs_tenants **out, char *err);
void kvs_tenants_free(kvs_tenants *t);

/* Logs one WARN per tenant whose file line is `token =`: the file holds a
 * usable token that the UCX data plane process could read, and the
 * `token_sha256 = <hex>` line to write instead (a hash: safe to log). kvstashd
 * calls it once, at start, not on reload. */
void kvs_tenants_log_plain(const kvs_tenants *t);

/* 1 when no tenant is declared (everyone is "default"). */
int kvs_tenants_open_mode(const kvs_tenants *t);
size_t kvs_tenants_count(const kvs_tenants *t);
/* Tenant i (0 <= i < count), or NULL. Borrowed: valid until kvs_tenants_free. */
const kvs_tenant *kvs_tenants_at(const kvs_tenants *t, size_t i);
/* Tenant by id, or NULL. */
const kvs_tenant *kvs_tenants_by_id(const kvs_tenants *t, uint16_t id);

/*
 * Authenticates one call from its "authorization" metadata value (auth, len
 * bytes; auth NULL when the call carries none). "Bearer <token>" is expected
 * (the scheme name is case-insensitive). Open mode accepts anything as the
 * default tenant. Returns 0 and the tenant in *out, or KVS_EUNAUTH with the
 * reason in err (never echoing the token), or KVS_EINTERNAL when OpenSSL
 * cannot hash.
 */
int kvs_tenants_authenticate(const kvs_tenants *t, const char *auth, size_t len,
                             const kvs_tenant **out, char *err);

struct kvs_store;

/* Checks a tenant_rules list (config.h) against the table: every rule must
 * name a declared tenant ("default" in open mode). Then, when store is not
 * NULL, sets every tenant's store quota to its rule's quota (0, none, for a
 * tenant without one). 0, or KVS_EINVAL with err naming tenant_rules and the
 * tenant, or the store's status (nothing is set when the check fails). */
int kvs_tenants_apply_rules(const kvs_tenants *t, const char *tenant_rules,
                            struct kvs_store *store, char *err);

/* 1 when a and b declare the same tenants in the same order with the same
 * name, token (compared by hash: `token =` and its token_sha256 are the same),
 * secret, models, admin and ucx flags (what only a restart changes;
 * scheme, fp16, skip_layers and quota live in tenant_rules), else 0. */
int kvs_tenants_same_identity(const kvs_tenants *a, const kvs_tenants *b);

/* May tenant use the model fingerprint (len bytes)? 1 yes, 0 no. */
int kvs_tenant_may_use_model(const kvs_tenant *tn, const char *model, size_t len);

#endif /* KVS_TENANTS_H */
