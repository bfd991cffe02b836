/*
 * profiles.c — calibration profiles named by model rules (profiles.h).
 *
 * A set keeps, per rule that names a profile, only what a Put uses: the
 * profile's shape, scheme, and per layer the K and V amax and per-tensor
 * scales (the static per-channel scales stay on disk). Rules are few and a
 * Put looks one up by subject, so a linear scan is enough.
 *
 * Why the profile's scheme matters: its tensor scales are amax / qmax of that
 * scheme (kvq_calib.c). A block layer stored in the other FP8 format gets
 * amax / its own qmax (kvs_profile_tile_params' documented rule); int8 and
 * fp16 layers get 0 (the kernels ignore a tensor scale there anyway).
 */
#include "profiles.h"

#include "config.h"
#include "kvq_calib.h"
#include "kvq_math.h"
#include "kvs_error.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct prof_entry {
    char subject[KVS_CONFIG_SUBJECT_MAX + 1];
    char path[KVS_CONFIG_PATH_MAX];
    uint32_t layers, heads, head_dim;
    kvs_scheme scheme;
    kvs_profile_layer *lay; /* [layers] */
    atomic_int mismatch_logged;
} prof_entry;

struct kvs_profiles {
    size_t n;
    prof_entry *e;
};

/* kvs_profile_read's message, without its own "PATH: " prefix (ours names it). */
static const char *strip_path(const char *msg, const char *path)
{
    size_t n = strlen(path);
    return strncmp(msg, path, n) == 0 && strncmp(msg + n, ": ", 2) == 0 ? msg + n + 2 : msg;
}

/* Reads path into *out (the caller frees), checked for kvstashd's use. */
static int read_checked(const char *path, kvs_profile **out, char *err)
{
    char why[KVS_ERR_LEN] = "";
    kvs_profile *p = NULL;
    struct stat st;
    /* A FIFO or a device would block or feed the reader forever: files only. */
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return kvs_fail(err, KVS_EINVAL, "profile '%.200s': not a regular file", path);
    int rc = kvs_profile_read(path, &p, why);
    if (rc != 0)
        return kvs_fail(err, rc, "profile '%.200s': %s", path, strip_path(why, path));
    if (!p->post_rope) {
        kvs_profile_free(p);
        return kvs_fail(err, KVS_EINVAL,
                        "profile '%.200s': calibrated on pre-RoPE keys (post_rope 0); kvstashd "
                        "stores keys after RoPE, whose per-tensor scale differs",
                        path);
    }
    *out = p;
    return 0;
}

int kvs_profiles_check_file(const char *path, char *err)
{
    kvs_profile *p = NULL;
    int rc = read_checked(path, &p, err);
    kvs_profile_free(p);
    return rc;
}

void kvs_profiles_free(kvs_profiles *ps)
{
    if (ps == NULL)
        return;
    for (size_t i = 0; i < ps->n; i++)
        free(ps->e[i].lay);
    free(ps->e);
    free(ps);
}

typedef struct load_ctx {
    kvs_profiles *ps;
    char *err;
    int rc;
} load_ctx;

static int load_fn(void *ctx, const kvs_config_rule *r)
{
    load_ctx *lc = ctx;
    if (r->profile[0] == '\0')
        return 0;
    kvs_profile *p = NULL;
    if ((lc->rc = read_checked(r->profile, &p, lc->err)) != 0)
        return 1;
    kvs_profiles *ps = lc->ps;
    prof_entry *ne = realloc(ps->e, (ps->n + 1) * sizeof *ne);
    kvs_profile_layer *lay = malloc(p->num_layers * sizeof *lay);
    if (ne)
        ps->e = ne;
    if (!ne || !lay) {
        free(lay);
        kvs_profile_free(p);
        lc->rc = kvs_fail(lc->err, KVS_ENOMEM, "profile '%.200s': out of memory", r->profile);
        return 1;
    }
    prof_entry *e = &ps->e[ps->n++];
    memset(e, 0, sizeof *e);
    snprintf(e->subject, sizeof e->subject, "%s", r->subject);
    snprintf(e->path, sizeof e->path, "%s", r->profile);
    e->layers = p->num_layers;
    e->heads = p->num_kv_heads;
    e->head_dim = p->head_dim;
    e->scheme = p->scheme;
    memcpy(lay, p->layers, p->num_layers * sizeof *lay);
    e->lay = lay;
    atomic_init(&e->mismatch_logged, 0);
    kvs_profile_free(p);
    return 0;
}

int kvs_profiles_load(const char *model_rules, kvs_profiles **out, char *err)
{
    *out = NULL;
    load_ctx lc = {calloc(1, sizeof(kvs_profiles)), err, 0};
    if (lc.ps == NULL)
        return kvs_fail(err, KVS_ENOMEM, "profiles: out of memory");
    int rc = kvs_config_rules_each(KVS_RULES_MODEL, model_rules, load_fn, &lc, err);
    if (rc != 0 || lc.rc != 0) {
        kvs_profiles_free(lc.ps);
        return lc.rc ? lc.rc : rc;
    }
    if (lc.ps->n == 0)
        kvs_profiles_free(lc.ps);
    else
        *out = lc.ps;
    return 0;
}

/* The tensor scale of one layer tensor for a block layer of `scheme`. */
static float layer_scale(const prof_entry *e, unsigned scheme, float amax, float profile_scale)
{
    if (scheme == KVS_SCHEME_FP8_E4M3)
        return e->scheme == KVS_SCHEME_FP8_E4M3 ? profile_scale
                                                : kvq_scale_from_amax(amax, KVQ_E4M3_MAX);
    if (scheme == KVS_SCHEME_FP8_E5M2)
        return e->scheme == KVS_SCHEME_FP8_E5M2 ? profile_scale
                                                : kvq_scale_from_amax(amax, KVQ_E5M2_MAX);
    return 0.0f;
}

int kvs_profiles_scales(kvs_profiles *ps, const char *subject, const kvs_profiles_shape *shape,
                        const uint8_t *schemes, float *k_ts, float *v_ts, int *first_time,
                        char *why)
{
    if (first_time)
        *first_time = 0;
    prof_entry *e = NULL;
    for (size_t i = 0; ps && i < ps->n && e == NULL; i++)
        if (strcmp(ps->e[i].subject, subject) == 0)
            e = &ps->e[i];
    if (e == NULL)
        return KVS_PROFILES_NONE;
    if (shape->layers != e->layers || shape->heads != e->heads || shape->head_dim != e->head_dim) {
        (void)kvs_fail(why, 0,
                       "model rule '%.64s': profile '%.160s' is for %u layers x %u kv heads x "
                       "head_dim %u, the namespace has %u x %u x %u: dynamic scales",
                       e->subject, e->path, e->layers, e->heads, e->head_dim, shape->layers,
                       shape->heads, shape->head_dim);
        if (first_time)
            *first_time = atomic_exchange(&e->mismatch_logged, 1) == 0;
        return KVS_PROFILES_MISMATCH;
    }
    for (uint32_t l = 0; l < e->layers; l++) {
        k_ts[l] = layer_scale(e, schemes[l], e->lay[l].k_amax, e->lay[l].k_tensor_scale);
        v_ts[l] = layer_scale(e, schemes[l], e->lay[l].v_amax, e->lay[l].v_tensor_scale);
    }
    return KVS_PROFILES_APPLIED;
}
