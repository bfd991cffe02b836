/*
 * profiles.h — the calibration profiles kvstashd's model rules name
 * ([model.PATTERN] profile = PATH), and the per-tensor scales a Put takes
 * from them.
 *
 * What a profile gives a Put: per layer, the K and V per-tensor scale
 * (kvs_tile_params.tensor_scale), so each FP8 group scale of the block is
 * stored as fp16(tensor scale) * 2^e, no FP8 tile worse than per-tensor FP8
 * (docs/QUALITY.md §5). Group scales stay dynamic; the profile's static
 * per-channel scales, outliers and sinks are not used (docs/CALIBRATION.md
 * "Profiles in kvstashd" says why).
 *
 * Like codec.h this header speaks plain integers (scheme: 1 fp16, 2 fp8_e4m3,
 * 3 fp8_e5m2, 4 int8): profiles.c includes kernel headers, the RPC files
 * include store headers, and no translation unit may include both.
 *
 * Ownership and threads: a kvs_profiles set is immutable once loaded except
 * for its per-rule "mismatch logged" flags (atomic); the server swaps whole
 * sets under its config lock and frees the old one (kvs_profiles_free).
 */
#ifndef KVS_PROFILES_H
#define KVS_PROFILES_H

#include <stddef.h>
#include <stdint.h>

/* Reads and validates the profile at path (kvs_profile_read) and checks that
 * kvstashd can use it (calibrated on post-RoPE keys, as kvstashd stores them).
 * 0, or KVS_EIO / KVS_EFORMAT / KVS_EINVAL / KVS_ENOMEM with err (KVS_ERR_LEN)
 * reading "profile 'PATH': why". */
int kvs_profiles_check_file(const char *path, char *err);

typedef struct kvs_profiles kvs_profiles;

/* Loads the profile of every rule of model_rules (a list config.c accepted)
 * that names one. 0 and *out (NULL when no rule names a profile), or the
 * first error, as kvs_profiles_check_file's, with nothing allocated. */
int kvs_profiles_load(const char *model_rules, kvs_profiles **out, char *err);
void kvs_profiles_free(kvs_profiles *ps);

/* The shape of the blocks a Put brings (its namespace's layout). */
typedef struct kvs_profiles_shape {
    uint32_t layers, heads, head_dim;
} kvs_profiles_shape;

enum {
    KVS_PROFILES_NONE = 0,     /* the rule has no profile (or the set changed) */
    KVS_PROFILES_APPLIED = 1,  /* k_ts / v_ts filled */
    KVS_PROFILES_MISMATCH = 2, /* the shape differs: dynamic scales; why says how */
};

/*
 * The per-tensor scales of the model rule `subject` for a block of `shape`
 * whose layer l has scheme schemes[l]: k_ts[l] and v_ts[l] (shape->layers
 * entries each) get the profile's K and V scale of layer l for the layer's
 * FP8 format (the profile's own scale when its scheme is that format, else
 * amax / that format's max), and 0 for fp16 and int8 layers (int8 ignores a
 * tensor scale: kvq.h). Layers, kv heads and head_dim must equal the
 * profile's; block_tokens and the source dtype need not (a per-tensor scale
 * is the layer's amax, whatever the block size or the dtype that carried the
 * values). On KVS_PROFILES_MISMATCH why (KVS_ERR_LEN, may be NULL) names the
 * rule, the file and both shapes, and *first_time (may be NULL) is 1 for the
 * first mismatch of that rule in this set (to log once), else 0. ps may be
 * NULL (no profiles: KVS_PROFILES_NONE).
 */
int kvs_profiles_scales(kvs_profiles *ps, const char *subject, const kvs_profiles_shape *shape,
                        const uint8_t *schemes, float *k_ts, float *v_ts, int *first_time,
                        char *why);

#endif /* KVS_PROFILES_H */
