/*
 * tenants.c — the tenant table (see tenants.h).
 *
 * Parsing runs once at start with inih over the same file config.c reads; a
 * section is applied to a fresh kvs_tenant when its first key arrives and
 * checked (token present, names and tokens unique) when the file ends. The
 * table never changes afterwards, so lookups take no lock.
 */
#include "tenants.h"

#include "config.h"
#include "kvs_error.h"
#include "store.h"

#include <errno.h>
#include <ini.h>
#include <inttypes.h>
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
} load_state;

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
    kvs_tenant *tn = section_tenant(st, section + 7);
    if (tn == NULL)
        return 0;
    size_t len = strlen(value);
    if (strcmp(key, "token") == 0) {
        if (len < 8 || len > KVS_TENANT_TOKEN_MAX || !printable(value)) {
            snprintf(st->msg, sizeof st->msg,
                     "tenant %s: token must be 8..%d printable bytes without spaces", tn->name,
                     KVS_TENANT_TOKEN_MAX);
            return 0;
        }
        memcpy(tn->token, value, len + 1);
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
                 "tenant %s: unknown key '%.64s' (token, secret, quota, models, fp16, admin, "
                 "ucx, scheme, skip_layers)",
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
    load_state st = {.t = t, .msg = "", .oom = 0};
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
        return KVS_EINVAL;
    }
    for (size_t i = 0; i < t->n; i++) {
        if (t->v[i].token[0] == '\0') {
            (void)kvs_fail(err, 0, "%s: tenant %s has no token", path, t->v[i].name);
            kvs_tenants_free(t);
            return KVS_EINVAL;
        }
        for (size_t j = 0; j < i; j++) {
            if (strcmp(t->v[i].token, t->v[j].token) == 0) {
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

void kvs_tenants_free(kvs_tenants *t)
{
    if (t == NULL)
        return;
    /* Secrets and tokens should not linger in freed memory. */
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
        if (strcmp(x->name, y->name) != 0 || strcmp(x->token, y->token) != 0 ||
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

/* Constant-time equality of a (alen bytes) and the NUL-terminated b. */
static int token_eq(const char *a, size_t alen, const char *b)
{
    size_t blen = strlen(b);
    unsigned diff = (unsigned)(alen ^ blen);
    for (size_t i = 0; i < blen; i++)
        diff |= (unsigned)(unsigned char)b[i] ^ (unsigned)(unsigned char)(i < alen ? a[i] : 0);
    return diff == 0;
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
    const kvs_tenant *hit = NULL;
    for (size_t i = 0; i < t->n; i++) /* no early exit: time does not depend on which */
        if (token_eq(auth, len, t->v[i].token))
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
