/*
 * tenants.c — the tenant table (see tenants.h).
 *
 * Parsing runs once at start with inih over the same file config.c reads; a
 * section is applied to a fresh kvs_tenant when its first key arrives and
 * checked (token present, names and tokens unique) when the file ends. The
 * table never changes afterwards, so lookups take no lock.
 *
 * Tokens: the table holds the SHA-256 of each, from `token_sha256 =` as
 * written or hashed at load from `token =`, so neither the file (with
 * token_sha256) nor kvstashd's memory holds a token that a reader could
 * present. A presented token is hashed and compared with every tenant's digest
 * by CRYPTO_memcmp, without an early exit. The digests are of tokens an
 * operator chose, so a plain unsalted SHA-256 is enough: a salt or a slow hash
 * defends guessable passwords, and 8+ random bytes are not guessed from their
 * hash (docs/OPERATIONS.md asks for random tokens). Errors never echo a token
 * nor a token_sha256 value (a token pasted on the wrong line would leak).
 */
#include "tenants.h"

#include "config.h"
#include "kvs_error.h"
#include "store.h"

#include "kvs_log.h"

#include <errno.h>
#include <ini.h>
#include <inttypes.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct kvs_tenants {
    kvs_tenant *v;
    size_t n, cap;
    kvs_tenant def; /* open mode */
};

typedef struct load_state {
    kvs_tenants *t;
    char msg[KVS_ERR_LEN];
    int oom;
    int hash_failed; /* OpenSSL could not hash a token: KVS_EINTERNAL */
} load_state;

#define MOD "tenants"

static EVP_MD *g_sha256;
static pthread_once_t g_sha256_once = PTHREAD_ONCE_INIT;

static void fetch_sha256(void)
{
    g_sha256 = EVP_MD_fetch(NULL, "SHA2-256", NULL);
}

/* SHA-256 of p (n bytes) into out: 0, or -1 when OpenSSL fails. The digest
 * is fetched once (an implicit fetch per call takes a lock in OpenSSL 3, and
 * every authenticated RPC hashes), the legacy EVP_sha256() when that fails. */
static int token_hash(const void *p, size_t n, uint8_t out[KVS_TENANT_TOKEN_HASH_LEN])
{
    pthread_once(&g_sha256_once, fetch_sha256);
    unsigned int len = 0;
    if (EVP_Digest(p, n, out, &len, g_sha256 ? g_sha256 : EVP_sha256(), NULL) != 1 ||
        len != KVS_TENANT_TOKEN_HASH_LEN)
        return -1;
    return 0;
}

/* Exactly 2 * KVS_TENANT_TOKEN_HASH_LEN hex digits, either case: 0, else -1. */
static int parse_hash_hex(const char *s, uint8_t out[KVS_TENANT_TOKEN_HASH_LEN])
{
    if (strlen(s) != 2 * KVS_TENANT_TOKEN_HASH_LEN)
        return -1;
    for (size_t i = 0; i < KVS_TENANT_TOKEN_HASH_LEN; i++) {
        int hi = OPENSSL_hexchar2int((unsigned char)s[2 * i]);
        int lo = OPENSSL_hexchar2int((unsigned char)s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

static int printable(const char *s)
{
    for (; *s; s++)
        if (*s < 0x21 || *s > 0x7e)
            return 0;
    return 1;
}

static kvs_tenant *section_tenant(load_state *st, const char *name)
{
    kvs_tenants *t = st->t;
    if (t->n > 0 && strcmp(t->v[t->n - 1].name, name) == 0)
        return &t->v[t->n - 1];
    for (size_t i = 0; i < t->n; i++) {
        if (strcmp(t->v[i].name, name) == 0) {
            snprintf(st->msg, sizeof st->msg, "tenant '%s' is declared twice", name);
            return NULL;
        }
    }
    if (strlen(name) == 0 || strlen(name) > KVS_TENANT_NAME_MAX || !printable(name) ||
        strcmp(name, "default") == 0) {
        snprintf(st->msg, sizeof st->msg,
                 "tenant name '%.80s': 1..%d printable bytes, not \"default\"", name,
                 KVS_TENANT_NAME_MAX);
        return NULL;
    }
    if (t->n >= KVS_TENANTS_MAX) {
        snprintf(st->msg, sizeof st->msg, "more than %d tenants", KVS_TENANTS_MAX);
        return NULL;
    }
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 8;
        kvs_tenant *v = realloc(t->v, cap * sizeof *v);
        if (v == NULL) {
            st->oom = 1;
            snprintf(st->msg, sizeof st->msg, "out of memory");
            return NULL;
        }
        t->v = v;
        t->cap = cap;
    }
    kvs_tenant *tn = &t->v[t->n++];
    memset(tn, 0, sizeof *tn);
    tn->id = (uint16_t)t->n;
    tn->ucx = 1;
    snprintf(tn->name, sizeof tn->name, "%s", name);
    return tn;
}

static int on_ini(void *user, const char *section, const char *key, const char *value)
{
    load_state *st = user;
    if (strncmp(section, "tenant.", 7) != 0)
        return 1; /* config.c's */
    /* inih reports the first failing line but reads on (Debian builds it
     * without INI_STOP_ON_FIRST_ERROR): keep that line's message, not the
     * last bad line's. */
    if (st->msg[0] != '\0')
        return 0;
    kvs_tenant *tn = section_tenant(st, section + 7);
    if (tn == NULL)
        return 0;
    size_t len = strlen(value);
    if (strcmp(key, "token") == 0 || strcmp(key, "token_sha256") == 0) {
        int from = key[5] == '\0' ? KVS_TENANT_TOKEN_PLAIN : KVS_TENANT_TOKEN_HASH;
        if (tn->token_from != 0 && tn->token_from != from) {
            snprintf(st->msg, sizeof st->msg,
                     "tenant %s: both token and token_sha256; give one (token_sha256, the "
                     "token's SHA-256, keeps the token out of the file)",
                     tn->name);
            return 0;
        }
        if (from == KVS_TENANT_TOKEN_HASH) {
            if (parse_hash_hex(value, tn->token_sha256) != 0) {
                snprintf(st->msg, sizeof st->msg,
                         "tenant %s: token_sha256 must be %d hex digits, the SHA-256 of the token "
                         "(`kvstash token-hash` prints the line)",
                         tn->name, 2 * KVS_TENANT_TOKEN_HASH_LEN);
                return 0;
            }
            /* `printf %s "$UNSET" | sha256sum` would let "Bearer " in */
            static const uint8_t empty[KVS_TENANT_TOKEN_HASH_LEN] = {
                0xe3, 0xb0, 0xc4, 0x42, 0x98, 0xfc, 0x1c, 0x14, 0x9a, 0xfb, 0xf4,
                0xc8, 0x99, 0x6f, 0xb9, 0x24, 0x27, 0xae, 0x41, 0xe4, 0x64, 0x9b,
                0x93, 0x4c, 0xa4, 0x95, 0x99, 0x1b, 0x78, 0x52, 0xb8, 0x55};
            if (memcmp(tn->token_sha256, empty, sizeof empty) == 0) {
                snprintf(st->msg, sizeof st->msg,
                         "tenant %s: token_sha256 is the SHA-256 of an empty token", tn->name);
                return 0;
            }
        } else {
            if (len < 8 || len > KVS_TENANT_TOKEN_MAX || !printable(value)) {
                snprintf(st->msg, sizeof st->msg,
                         "tenant %s: token must be 8..%d printable bytes without spaces", tn->name,
                         KVS_TENANT_TOKEN_MAX);
                return 0;
            }
            if (token_hash(value, len, tn->token_sha256) != 0) {
                st->hash_failed = 1;
                snprintf(st->msg, sizeof st->msg, "tenant %s: OpenSSL cannot hash the token",
                         tn->name);
                return 0;
            }
        }
        tn->token_from = from;
    } else if (strcmp(key, "secret") == 0) {
        if (len > KVS_TENANT_SECRET_MAX) {
            snprintf(st->msg, sizeof st->msg, "tenant %s: secret longer than %d bytes", tn->name,
                     KVS_TENANT_SECRET_MAX);
            return 0;
        }
        memcpy(tn->secret, value, len);
        tn->secret_len = len;
    } else if (strcmp(key, "quota") == 0) {
        if (kvs_config_parse_bytes(value, &tn->quota_bytes) != 0) {
            snprintf(st->msg, sizeof st->msg, "tenant %s: quota '%.64s' is not a size", tn->name,
                     value);
            return 0;
        }
    } else if (strcmp(key, "models") == 0) {
        if (len >= KVS_TENANT_MODELS_MAX) {
            snprintf(st->msg, sizeof st->msg, "tenant %s: models longer than %d bytes", tn->name,
                     KVS_TENANT_MODELS_MAX - 1);
            return 0;
        }
        memcpy(tn->models, value, len + 1);
    } else if (strcmp(key, "scheme") == 0) {
        static const char *const names[] = {"fp16", "fp8_e4m3", "fp8_e5m2", "int8"};
        tn->scheme = 0;
        for (unsigned i = 0; i < 4; i++)
            if (strcasecmp(value, names[i]) == 0)
                tn->scheme = i + 1;
        if (tn->scheme == 0) {
            snprintf(st->msg, sizeof st->msg,
                     "tenant %s: scheme '%.32s' is not fp16, fp8_e4m3, fp8_e5m2 or int8", tn->name,
                     value);
            return 0;
        }
    } else if (strcmp(key, "skip_layers") == 0) {
        kvs_config tmp;
        kvs_config_defaults(&tmp);
        char e[KVS_ERR_LEN];
        if (len >= sizeof tn->skip_layers ||
            kvs_config_set_by_name(&tmp, "skip_layers", value, e) != 0) {
            snprintf(st->msg, sizeof st->msg, "tenant %s: skip_layers '%.64s' is not a list of "
                     "layers like \"0,30-31\"", tn->name, value);
            return 0;
        }
        memcpy(tn->skip_layers, value, len + 1);
    } else if (strcmp(key, "fp16") == 0 || strcmp(key, "admin") == 0 || strcmp(key, "ucx") == 0) {
        int *dst = key[0] == 'f' ? &tn->fp16_only : key[0] == 'a' ? &tn->admin : &tn->ucx;
        if (kvs_config_parse_bool(value, dst) != 0) {
            snprintf(st->msg, sizeof st->msg, "tenant %s: %s '%.32s' is not true or false",
                     tn->name, key, value);
            return 0;
        }
    } else {
        snprintf(st->msg, sizeof st->msg,
                 "tenant %s: unknown key '%.64s' (token_sha256, token, secret, quota, models, "
                 "fp16, admin, ucx, scheme, skip_layers)",
                 tn->name, key);
        return 0;
    }
    return 1;
}

static void init_default(kvs_tenants *t)
{
    memset(&t->def, 0, sizeof t->def);
    t->def.id = 0;
    snprintf(t->def.name, sizeof t->def.name, "default");
    t->def.admin = 1;
    t->def.ucx = 1;
}

int kvs_tenants_load(const char *path, kvs_tenants **out, char *err)
{
    *out = NULL;
    kvs_tenants *t = calloc(1, sizeof *t);
    if (t == NULL) {
        return kvs_fail(err, KVS_ENOMEM, "out of memory");
    }
    init_default(t);
    if (path == NULL || path[0] == '\0') {
        *out = t;
        return 0;
    }
    load_state st = {.t = t, .msg = "", .oom = 0, .hash_failed = 0};
    int rc = ini_parse(path, on_ini, &st);
    if (rc == -1) {
        (void)kvs_fail(err, 0, "%s: cannot open: %s", path, strerror(errno));
        kvs_tenants_free(t);
        return KVS_EIO;
    }
    if (rc == -2 || st.oom) {
        (void)kvs_fail(err, 0, "%s: out of memory", path);
        kvs_tenants_free(t);
        return KVS_ENOMEM;
    }
    if (rc > 0) {
        (void)kvs_fail(err, 0, "%s:%d: %s", path, rc, st.msg[0] ? st.msg : "syntax error");
        kvs_tenants_free(t);
        return st.hash_failed ? KVS_EINTERNAL : KVS_EINVAL;
    }
    for (size_t i = 0; i < t->n; i++) {
        if (t->v[i].token_from == 0) {
            (void)kvs_fail(err, 0, "%s: tenant %s has no token (token_sha256 = <its SHA-256>)",
                           path, t->v[i].name);
            kvs_tenants_free(t);
            return KVS_EINVAL;
        }
        for (size_t j = 0; j < i; j++) {
            /* the same digest: the same token, however each line gave it */
            if (memcmp(t->v[i].token_sha256, t->v[j].token_sha256, KVS_TENANT_TOKEN_HASH_LEN) ==
                0) {
                (void)kvs_fail(err, 0, "%s: tenants %s and %s have the same token", path,
                               t->v[j].name, t->v[i].name);
                kvs_tenants_free(t);
                return KVS_EINVAL;
            }
        }
    }
    *out = t;
    return 0;
}

void kvs_tenants_log_plain(const kvs_tenants *t)
{
    for (size_t i = 0; i < t->n; i++) {
        const kvs_tenant *tn = &t->v[i];
        if (tn->token_from != KVS_TENANT_TOKEN_PLAIN)
            continue;
        char hex[2 * KVS_TENANT_TOKEN_HASH_LEN + 1];
        for (size_t k = 0; k < KVS_TENANT_TOKEN_HASH_LEN; k++)
            snprintf(hex + 2 * k, 3, "%02x", tn->token_sha256[k]);
        KVS_LOG_WARN(MOD,
                     "tenant %s: the config file holds its usable bearer token (token =), which "
                     "the UCX data plane process (kvstash-xferd, same user) could read; replace "
                     "that line with: token_sha256 = %s",
                     tn->name, hex);
    }
}

void kvs_tenants_free(kvs_tenants *t)
{
    if (t == NULL)
        return;
    /* Secrets should not linger in freed memory. */
    if (t->v)
        memset(t->v, 0, t->n * sizeof *t->v);
    free(t->v);
    free(t);
}

int kvs_tenants_open_mode(const kvs_tenants *t) { return t->n == 0; }
size_t kvs_tenants_count(const kvs_tenants *t) { return t->n ? t->n : 1; }

const kvs_tenant *kvs_tenants_at(const kvs_tenants *t, size_t i)
{
    if (t->n == 0)
        return i == 0 ? &t->def : NULL;
    return i < t->n ? &t->v[i] : NULL;
}

int kvs_tenants_same_identity(const kvs_tenants *a, const kvs_tenants *b)
{
    if (a->n != b->n)
        return 0;
    for (size_t i = 0; i < a->n; i++) {
        const kvs_tenant *x = &a->v[i], *y = &b->v[i];
        if (strcmp(x->name, y->name) != 0 ||
            memcmp(x->token_sha256, y->token_sha256, KVS_TENANT_TOKEN_HASH_LEN) != 0 ||
            x->secret_len != y->secret_len || memcmp(x->secret, y->secret, x->secret_len) != 0 ||
            strcmp(x->models, y->models) != 0 || x->admin != y->admin || x->ucx != y->ucx)
            return 0;
    }
    return 1;
}

const kvs_tenant *kvs_tenants_by_id(const kvs_tenants *t, uint16_t id)
{
    if (t->n == 0)
        return id == 0 ? &t->def : NULL;
    return id >= 1 && id <= t->n ? &t->v[id - 1] : NULL;
}

int kvs_tenants_authenticate(const kvs_tenants *t, const char *auth, size_t len,
                             const kvs_tenant **out, char *err)
{
    *out = NULL;
    if (t->n == 0) {
        *out = &t->def;
        return 0;
    }
    if (auth == NULL || len == 0) {
        return kvs_fail(err, KVS_EUNAUTH, "missing \"authorization: Bearer <token>\" metadata");
    }
    if (len < 7 || strncasecmp(auth, "bearer ", 7) != 0) {
        return kvs_fail(err, KVS_EUNAUTH, "authorization metadata is not \"Bearer <token>\"");
    }
    auth += 7;
    len -= 7;
    if (len == 0) {
        return kvs_fail(err, KVS_EUNAUTH, "empty bearer token");
    }
    uint8_t md[KVS_TENANT_TOKEN_HASH_LEN];
    if (token_hash(auth, len, md) != 0) {
        return kvs_fail(err, KVS_EINTERNAL, "OpenSSL cannot hash the bearer token");
    }
    const kvs_tenant *hit = NULL;
    for (size_t i = 0; i < t->n; i++) /* no early exit: time does not depend on which */
        if (CRYPTO_memcmp(md, t->v[i].token_sha256, sizeof md) == 0)
            hit = &t->v[i];
    if (hit == NULL) {
        return kvs_fail(err, KVS_EUNAUTH, "unknown bearer token");
    }
    *out = hit;
    return 0;
}

static const kvs_tenant *by_name(const kvs_tenants *t, const char *name)
{
    for (size_t i = 0; i < kvs_tenants_count(t); i++) {
        const kvs_tenant *tn = kvs_tenants_at(t, i);
        if (strcmp(tn->name, name) == 0)
            return tn;
    }
    return NULL;
}

typedef struct rules_ctx {
    const kvs_tenants *t;
    char name[KVS_CONFIG_SUBJECT_MAX + 1];
} rules_ctx;

static int check_rule(void *ctx, const kvs_config_rule *r)
{
    rules_ctx *rc = ctx;
    if (by_name(rc->t, r->subject) != NULL)
        return 0;
    snprintf(rc->name, sizeof rc->name, "%s", r->subject);
    return 1;
}

typedef struct quota_ctx {
    const char *name;
    uint64_t quota;
} quota_ctx;

static int find_quota(void *ctx, const kvs_config_rule *r)
{
    quota_ctx *q = ctx;
    if (strcmp(r->subject, q->name) != 0)
        return 0;
    q->quota = r->has_quota ? r->quota : 0;
    return 1;
}

int kvs_tenants_apply_rules(const kvs_tenants *t, const char *tenant_rules,
                            struct kvs_store *store, char *err)
{
    rules_ctx rc = {.t = t, .name = ""};
    int s = kvs_config_rules_each(KVS_RULES_TENANT, tenant_rules, check_rule, &rc, err);
    if (s < 0)
        return s;
    if (s == 1) {
        return kvs_fail(err, KVS_EINVAL,
                        "tenant_rules: '%.64s' is not a tenant of this server (%s)", rc.name,
                        t->n ? "declared in [tenant.NAME] sections" : "open mode: only 'default'");
    }
    if (store == NULL)
        return 0;
    for (size_t i = 0; i < kvs_tenants_count(t); i++) {
        const kvs_tenant *tn = kvs_tenants_at(t, i);
        quota_ctx q = {.name = tn->name, .quota = 0};
        (void)kvs_config_rules_each(KVS_RULES_TENANT, tenant_rules, find_quota, &q, NULL);
        int src = kvs_store_set_quota(store, tn->id, q.quota);
        if (src != 0) {
            return kvs_fail(err, src, "tenant_rules: the store refused tenant %s's quota: %s",
                            tn->name, kvs_strerror(src));
        }
    }
    return 0;
}

int kvs_tenant_may_use_model(const kvs_tenant *tn, const char *model, size_t len)
{
    const char *p = tn->models;
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p == '\0')
        return 1;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        const char *s = p;
        while (*p && *p != ',')
            p++;
        const char *e = p;
        while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
            e--;
        size_t n = (size_t)(e - s);
        if (n == 0)
            continue;
        if (s[n - 1] == '*') {
            if (len >= n - 1 && memcmp(model, s, n - 1) == 0)
                return 1;
        } else if (n == len && memcmp(model, s, n) == 0) {
            return 1;
        }
    }
    return 0;
}
