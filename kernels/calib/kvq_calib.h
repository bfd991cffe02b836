/*
 * kvq_calib.h — calibration of KV quantization: KV sample files, per-channel
 * statistics, suggested settings, and the profile a server loads.
 *
 * Three objects, one module (docs/CALIBRATION.md documents every byte and
 * every line; DESIGN.md §4 says why):
 *
 *   kvs_sample   one run of a model over one prompt: for every layer its K and
 *                V as [tokens][kv_heads][head_dim] (optionally Q as
 *                [tokens][q_heads][head_dim]), in a binary file "KVSM" written
 *                by the decoder (--dump-kv) or by tests. Files are untrusted:
 *                kvs_sample_read checks every size, bound and the checksum
 *                before it hands out a byte, and never reads outside the file.
 *   kvs_calib    an accumulator: feed it samples, it keeps for every (layer,
 *                head, channel) of K and every (layer, head) of V the exact
 *                absmax and a log-linear histogram of |x| (percentiles within
 *                1/64 relative; see KVS_CALIB_HIST_*), measures the
 *                reconstruction error of the real quantizer for k in {0,1,2,4},
 *                and looks for sink tokens. Memory does not grow with the
 *                number of samples.
 *   kvs_profile  what calibration produces for a namespace: model fingerprint,
 *                layout, scheme, k and S, static scales per (layer, head,
 *                channel) for K and per (layer, head) for V, and per-tensor
 *                scales per layer (for engines that take one FP8 scale). A
 *                strict line-based text file; kvs_profile_read rejects anything
 *                not exactly in the documented grammar, naming line and field.
 *
 * Static scales plug into the quantizer unchanged: kvs_tile_params.static_scales
 * takes kvs_profile_k_scales(p, layer, head) for a K tile (G = D scales) and,
 * for a V tile, the per-head scale replicated over the T rows
 * (kvs_profile_v_scales_fill). kvs_profile_tile_params fills a tile's params
 * from a profile, its per-tensor scale (kvs_tile_params.tensor_scale) included.
 *
 * Errors: KVS_EINVAL for bad arguments and for well-formed values out of range,
 * KVS_EFORMAT for malformed or corrupted bytes, KVS_EIO for the file system,
 * KVS_ENOMEM, KVS_ENOSPC when a size cap is hit. err (KVS_ERR_LEN bytes, may be
 * NULL) receives one line naming the problem.
 *
 * Ownership: every *_read / *_create / kvs_calib_profile result is owned by the
 * caller and freed with the matching *_free (NULL is accepted). Pointers
 * returned by accessors stay valid until that free. Little-endian hosts only,
 * like kv_format.h.
 */
#ifndef KVQ_CALIB_H
#define KVQ_CALIB_H

#include "kv_format.h"
#include "kvq.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- defaults chosen by measurement (docs/QUALITY.md) ----------------------
 * What a namespace uses when nobody says otherwise, and what `kvstash
 * calibrate` starts from. tests/bench/kvq_quality measures every alternative
 * against the baselines; docs/QUALITY.md holds the table behind each choice:
 * int8 has ~7x less attention-output error than fp8_e4m3 at the same bits;
 * with tile format v2 (fp16 scales, 3-byte outlier entries) (kK, kV) = (3, 2)
 * is the best of the pairs that fill 0.5 extra bit per element (0.430 bit of
 * metadata at T = 256, D = 128; (5, 1) costs the same and is within 1 %);
 * one fp16 sink row cuts the error by a third and costs bytes in root blocks
 * only. */
#define KVS_QUANT_DEFAULT_SCHEME     KVS_SCHEME_INT8
#define KVS_QUANT_DEFAULT_K_OUTLIERS 3u
#define KVS_QUANT_DEFAULT_V_OUTLIERS 2u
#define KVS_QUANT_DEFAULT_SINKS      1u
/* Metadata budget of DESIGN.md §3: scales + outliers + tile headers, bits per
 * element at the reference shape T = 256, D = 128. */
#define KVS_QUANT_META_BUDGET_BITS 0.6

/* ======================================================================== */
/* Sample files                                                              */
/* ======================================================================== */

#define KVS_SAMPLE_MAGIC     0x4D53564Bu /* bytes "KVSM" */
#define KVS_SAMPLE_VERSION   1u
#define KVS_SAMPLE_HDR_BYTES 112u

/* Header flags. */
#define KVS_SAMPLE_F_POST_ROPE 0x01u /* keys (and queries) were stored after RoPE */
#define KVS_SAMPLE_F_QUERIES   0x02u /* each layer also carries Q */
#define KVS_SAMPLE_F_KNOWN     0x03u

/* Limits every reader enforces (layers, heads, dims follow kv_format.h). */
#define KVS_SAMPLE_MAX_TOKENS     (1u << 20)
#define KVS_SAMPLE_MAX_Q_HEADS    1024u
#define KVS_SAMPLE_MAX_DATA_BYTES ((uint64_t)1 << 32) /* 4 GiB after the header */
#define KVS_SAMPLE_MODEL_LEN      64u /* fingerprint bytes, printable ASCII, NUL padded */

/* The 112-byte file header, as stored (docs/CALIBRATION.md). */
typedef struct kvs_sample_hdr {
    uint32_t magic;        /* KVS_SAMPLE_MAGIC */
    uint16_t version;      /* KVS_SAMPLE_VERSION */
    uint8_t dtype;         /* kvs_dtype of every element */
    uint8_t flags;         /* KVS_SAMPLE_F_* */
    uint16_t num_layers;   /* 1..KVS_BLOCK_MAX_LAYERS */
    uint16_t num_kv_heads; /* 1..KVS_BLOCK_MAX_HEADS */
    uint16_t head_dim;     /* 1..KVS_TILE_MAX_DIM */
    uint16_t num_q_heads;  /* 0 without queries, else a multiple of num_kv_heads */
    uint32_t tokens;       /* 1..KVS_SAMPLE_MAX_TOKENS */
    uint32_t first_pos;    /* sequence position of token 0 (0: the sequence start) */
    uint64_t data_bytes;   /* bytes after the header */
    uint64_t reserved;     /* 0 */
    uint64_t checksum;     /* XXH3-64 of header (this field 0) + data */
    char model[KVS_SAMPLE_MODEL_LEN];
} kvs_sample_hdr;

_Static_assert(sizeof(kvs_sample_hdr) == KVS_SAMPLE_HDR_BYTES, "sample header is 112 bytes");

typedef struct kvs_sample_info {
    uint32_t num_layers, num_kv_heads, head_dim;
    uint32_t num_q_heads; /* 0 unless flags has KVS_SAMPLE_F_QUERIES */
    uint32_t tokens, first_pos;
    kvs_dtype dtype;
    uint32_t flags;
    char model[KVS_SAMPLE_MODEL_LEN + 1]; /* NUL-terminated, may be empty */
} kvs_sample_info;

typedef struct kvs_sample {
    kvs_sample_info info;
    size_t data_bytes;
    unsigned char *data; /* owned; per layer: K, V, then Q if present */
} kvs_sample;

typedef enum kvs_sample_part {
    KVS_SAMPLE_K = 0,
    KVS_SAMPLE_V = 1,
    KVS_SAMPLE_Q = 2,
} kvs_sample_part;

/* Bytes per element of a dtype (2 or 4); 0 for an unknown dtype. */
size_t kvs_sample_elem_size(kvs_dtype dt);

/* Checks info against every limit above. 0 or KVS_EINVAL naming the field. */
int kvs_sample_info_check(const kvs_sample_info *info, char *err);

/* Data bytes a sample of this (valid) info holds. */
uint64_t kvs_sample_data_bytes(const kvs_sample_info *info);

/* A zero-filled sample of the given shape, for writers and tests. */
int kvs_sample_create(const kvs_sample_info *info, kvs_sample **out, char *err);

/* Start of one part of one layer: [tokens][heads][head_dim] elements of
 * info.dtype, heads = num_kv_heads (K, V) or num_q_heads (Q). NULL for Q when
 * the sample has none, or layer out of range. Valid until kvs_sample_free. */
void *kvs_sample_part_ptr(const kvs_sample *s, kvs_sample_part part, uint32_t layer);

/* One element widened to fp32. The caller keeps every index in range. */
float kvs_sample_value(const kvs_sample *s, kvs_sample_part part, uint32_t layer, uint32_t t,
                       uint32_t head, uint32_t d);

/* Writes a sample file from per-layer pointers (no copy): k[l] and v[l] point
 * to [tokens][num_kv_heads][head_dim] elements of info->dtype, q[l] (only with
 * KVS_SAMPLE_F_QUERIES; q may be NULL otherwise) to [tokens][num_q_heads]
 * [head_dim]. On failure the file is removed. 0, KVS_EINVAL or KVS_EIO. */
int kvs_sample_write_layers(const char *path, const kvs_sample_info *info, const void *const *k,
                            const void *const *v, const void *const *q, char *err);

/* Writes s to path (kvs_sample_write_layers over s's own parts). */
int kvs_sample_write(const char *path, const kvs_sample *s, char *err);

/* Validates len bytes of an untrusted sample file image and copies it into a
 * new sample. 0, KVS_EFORMAT (err names the check) or KVS_ENOMEM. */
int kvs_sample_parse(const void *buf, size_t len, kvs_sample **out, char *err);

/* Reads and validates a sample file. The header is checked and the file size
 * compared with it before any data is allocated or read. 0, KVS_EIO (cannot
 * open or read), KVS_EFORMAT or KVS_ENOMEM. */
int kvs_sample_read(const char *path, kvs_sample **out, char *err);

void kvs_sample_free(kvs_sample *s);

/* ======================================================================== */
/* Calibration                                                               */
/* ======================================================================== */

/* |x| histogram: bin 0 holds [0, 2^EMIN) (and -0); bins 1..(EMAX-EMIN)*SUB
 * split each octave [2^e, 2^(e+1)) into SUB equal parts; the last bin holds
 * [2^EMAX, +Inf). A percentile is reported as the middle of the bin that holds
 * it (clamped to the exact maximum), so for values in [2^EMIN, 2^EMAX) its
 * relative error is at most 1/(2*SUB) = 1/64; below 2^EMIN it is reported as
 * 0 (absolute error < 2^EMIN); at or above 2^EMAX as the exact maximum.
 * Percentile 100 is always the exact maximum. */
#define KVS_CALIB_HIST_SUB  32
#define KVS_CALIB_HIST_EMIN (-16)
#define KVS_CALIB_HIST_EMAX 16
#define KVS_CALIB_HIST_BINS ((KVS_CALIB_HIST_EMAX - KVS_CALIB_HIST_EMIN) * KVS_CALIB_HIST_SUB + 2)

/* Accumulator memory cap (two histograms per K channel dominate:
 * 8.2 KB x layers x heads x head_dim; Llama-3-70B needs 0.67 GB). */
#define KVS_CALIB_MAX_BYTES ((uint64_t)2 << 30)
/* Total tokens one accumulator takes (histogram counts are 32-bit). */
#define KVS_CALIB_MAX_TOKENS ((uint64_t)1 << 31)

/* Weight of the K error against the V error when choosing k (docs/QUALITY.md:
 * attention output moves about twice as much per unit of relative K error). */
#define KVS_CALIB_K_WEIGHT 2.0

/* Candidate k (outliers per group) whose error calibration measures. */
#define KVS_CALIB_NUM_K 4
extern const uint32_t kvs_calib_k_candidates[KVS_CALIB_NUM_K]; /* {0, 1, 2, 4} */

/* Sink detection (docs/CALIBRATION.md): in samples that start a sequence and
 * have more than 2 * WINDOW tokens, token t < WINDOW is "sink-like" in one
 * (layer, head, K|V) when some channel holds a |x| at least RATIO times the
 * largest |x| of that channel over the tokens t' >= WINDOW; position t is a
 * sink when that holds for at least FRAC of the (layer, head) pairs, for K or
 * for V. Suggested S = max(1, 1 + the last sink position). */
#define KVS_CALIB_SINK_WINDOW 16u
#define KVS_CALIB_SINK_RATIO  8.0
#define KVS_CALIB_SINK_FRAC   0.5

/* Key offsets are suggested when they cut the mean relative K error (at the
 * suggested k) by a larger fraction than WORTH times the fraction they add to
 * the bytes of a K and V tile pair: at 1, a 1 % larger block must buy more
 * than 1 % less K error. docs/CALIBRATION.md §3 has the rule and the
 * measurements behind it (stories15M: 32 % less K error for 2.3 % more bytes;
 * stories260K: 16 % for 2.3 %; end to end both lowered KL). */
#define KVS_CALIB_KOFF_WORTH 1.0

typedef struct kvs_calib_opts {
    kvs_scheme scheme;     /* fp8_e4m3, fp8_e5m2 or int8: qmax and measured errors */
    uint32_t block_tokens; /* T of the tiles, KVS_BLOCK_MIN_TOKENS..KVS_BLOCK_MAX_TOKENS */
    uint32_t k_outliers;   /* per K group, left out of the scale statistics (0..16) */
    uint32_t v_outliers;   /* per V group (0..16) */
    uint32_t sinks;        /* S of root tiles (0..min(T, 64)) */
    uint32_t key_offsets;  /* 0 or 1: what the profile's key_offsets says (0 by default;
                            * `kvstash calibrate` puts the suggestion here) */
    double percentile;     /* static scale = this percentile of non-outlier |x| / qmax */
    double meta_budget;    /* bits per element of metadata at T = 256, D = 128 that the
                            * suggested k may use (scales + outliers + tile headers) */
} kvs_calib_opts;

/* The defaults: KVS_QUANT_DEFAULT_*, T = 256, percentile 100, meta_budget
 * KVS_QUANT_META_BUDGET_BITS. */
void kvs_calib_opts_default(kvs_calib_opts *o);

typedef struct kvs_calib_stats {
    uint64_t count;       /* finite values seen */
    uint64_t nonfinite;   /* NaN and ±Inf seen (not in any statistic) */
    float amax;           /* exact max |x| */
    float p50, p99, p999; /* percentiles of |x| (histogram, see above) */
    uint64_t kept;        /* finite non-sink values that were not outliers */
    float kept_amax;      /* exact max |x| over those */
    float kept_pct;       /* opts.percentile of those: the static scale's source */
} kvs_calib_stats;

typedef struct kvs_calib_suggestion {
    uint32_t k_outliers, v_outliers, sinks;
    double meta_bits;              /* at (block_tokens, head_dim) for that k pair */
    double k_err[KVS_CALIB_NUM_K]; /* mean over layers of relative K error per candidate */
    double v_err[KVS_CALIB_NUM_K];
    /* Per leading position: the larger of the K and V fractions of (layer,
     * head) pairs where it is sink-like; all 0 when no sample was examined. */
    double sink_frac[KVS_CALIB_SINK_WINDOW];
    int sinks_measured; /* 0: no sample started a sequence: sinks = opts.sinks */
    int budget_met;     /* 0: not even k = 0 fits opts.meta_budget; k = 0 */
    /* Key offsets (kv_format.h rule 5): the mean relative K error with them per
     * candidate k; at the suggested (k_outliers, v_outliers), that error over
     * the one without (koff_err_ratio) and the bytes they add to a K and V
     * tile pair of block_tokens x head_dim, as a fraction (koff_bytes);
     * key_offsets = 1 when 1 - koff_err_ratio > KVS_CALIB_KOFF_WORTH *
     * koff_bytes. */
    double k_err_koff[KVS_CALIB_NUM_K];
    double koff_err_ratio, koff_bytes;
    int key_offsets;
} kvs_calib_suggestion;

typedef struct kvs_calib kvs_calib;
typedef struct kvs_profile kvs_profile;

/* Validates o (KVS_EINVAL naming the field) and makes an empty accumulator. */
int kvs_calib_create(const kvs_calib_opts *o, kvs_calib **out, char *err);

/* Adds one sample. The first fixes the layout (layers, heads, head_dim, dtype,
 * RoPE flag, model); later ones must match (KVS_EINVAL naming the field).
 * KVS_ENOSPC past KVS_CALIB_MAX_BYTES or KVS_CALIB_MAX_TOKENS. On error the
 * accumulator is unchanged only for layout errors; after ENOMEM mid-sample it
 * must be freed. */
int kvs_calib_add(kvs_calib *c, const kvs_sample *s, char *err);

uint64_t kvs_calib_samples(const kvs_calib *c);
uint64_t kvs_calib_tokens(const kvs_calib *c);

/* Statistics of one K channel / one V head. KVS_EINVAL for indices out of
 * range or before the first sample. */
int kvs_calib_k_stats(const kvs_calib *c, uint32_t layer, uint32_t head, uint32_t d,
                      kvs_calib_stats *out);
int kvs_calib_v_stats(const kvs_calib *c, uint32_t layer, uint32_t head, kvs_calib_stats *out);

/* Measured relative reconstruction error sqrt(sum (x-x')^2 / sum x^2) of one
 * layer's K (kind KVS_TILE_K) or V tiles with candidate index ci, using the
 * reference quantizer with opts' scheme, block_tokens, sinks and dynamic scales. */
int kvs_calib_layer_error(const kvs_calib *c, uint32_t layer, kvs_tile_kind kind, int ci,
                          double *out);

/* The same as kvs_calib_layer_error for K tiles quantized with key offsets
 * (kvs_tile_params.key_offsets, kv_format.h rule 5): what the offsets would
 * give. KVS_EINVAL for a layer or ci out of range or before the first sample. */
int kvs_calib_k_error_offsets(const kvs_calib *c, uint32_t layer, int ci, double *out);

/* The share of one layer's K energy that the per-channel means of its tiles
 * hold, over the rows after the sinks: sum over tiles and channels of
 * n * mean^2 / sum x^2, in 0..1. Near 0 for channels centred on zero (noise
 * alone gives about 1/n); high when each channel sits at an offset its rows
 * vary little around, where a per-channel offset per tile would cut the
 * error (docs/QUALITY.md §10; with 32-token tiles 0.11-0.18 per layer on
 * stories260K, 0.52-0.65 on stories15M; with 256-token tiles 0.04-0.10 and
 * 0.29-0.42). KVS_EINVAL for a layer out of range or before the first sample. */
int kvs_calib_k_bias(const kvs_calib *c, uint32_t layer, double *out);

/* k for K and V and S from the measurements (docs/CALIBRATION.md, "Suggested
 * settings"). KVS_EINVAL before the first sample. */
int kvs_calib_suggest(const kvs_calib *c, kvs_calib_suggestion *out);

/* Builds the profile from what was accumulated, with opts' scheme, k, S and
 * percentile; model overrides the samples' fingerprint when not NULL. */
int kvs_calib_profile(const kvs_calib *c, const char *model, kvs_profile **out, char *err);

void kvs_calib_free(kvs_calib *c);

/* ======================================================================== */
/* Profiles                                                                  */
/* ======================================================================== */

#define KVS_PROFILE_VERSION   1u
#define KVS_PROFILE_MODEL_MAX 64u                /* fingerprint characters */
#define KVS_PROFILE_MAX_BYTES ((size_t)64 << 20) /* text size a reader accepts */

typedef struct kvs_profile_layer {
    float k_amax, v_amax;                 /* max |x| of the layer, all heads */
    float k_tensor_scale, v_tensor_scale; /* amax / qmax: one scale per tensor */
} kvs_profile_layer;

struct kvs_profile {
    char model[KVS_PROFILE_MODEL_MAX + 1]; /* 1..64 chars 0x21..0x7E; "-" = unknown */
    uint32_t num_layers, num_kv_heads, head_dim, block_tokens;
    kvs_dtype dtype;
    int post_rope;     /* keys were calibrated after RoPE */
    kvs_scheme scheme; /* fp8_e4m3, fp8_e5m2 or int8 */
    uint32_t k_outliers, v_outliers, sinks;
    /* 0 or 1: K tiles with per-channel key offsets (kvs_tile_params.key_offsets,
     * kv_format.h rule 5), calibration's suggestion (kvs_calib_suggestion). In
     * the text only when 1, so profiles without offsets read as before and
     * older profiles (no such field) read as 0. The static K scales are those
     * of the unshifted keys either way: with offsets larger than needed, never
     * too small (kvq.h). */
    uint32_t key_offsets;
    double percentile;
    uint64_t samples, tokens;
    kvs_profile_layer *layers; /* [num_layers] */
    float *k_scales;           /* [num_layers][num_kv_heads][head_dim] */
    float *v_scales;           /* [num_layers][num_kv_heads] */
};

/* An empty profile of this shape (scales 0) with every field validated as
 * kvs_profile_check does. */
int kvs_profile_create(const kvs_profile *shape, kvs_profile **out, char *err);

/* Every bound and value of p. 0 or KVS_EINVAL naming the field. */
int kvs_profile_check(const kvs_profile *p, char *err);

/* Writes the text form. 0, KVS_EINVAL (p fails kvs_profile_check) or KVS_EIO. */
int kvs_profile_print(const kvs_profile *p, FILE *f, char *err);
int kvs_profile_write(const char *path, const kvs_profile *p, char *err);

/* Strict parse of an untrusted profile text. KVS_EFORMAT for the grammar
 * (missing, extra or misordered lines and fields, bad numbers, truncation),
 * KVS_EINVAL for well-formed values out of range; err reads
 * "profile line N: field F: ...". */
int kvs_profile_parse(const char *text, size_t len, kvs_profile **out, char *err);
int kvs_profile_read(const char *path, kvs_profile **out, char *err);

/* D static scales of one K tile: ready for kvs_tile_params.static_scales.
 * NULL when out of range. */
const float *kvs_profile_k_scales(const kvs_profile *p, uint32_t layer, uint32_t head);

/* Fills out[0..T) with the (layer, head) V scale: a V tile's static scales.
 * KVS_EINVAL when out of range. */
int kvs_profile_v_scales_fill(const kvs_profile *p, uint32_t layer, uint32_t head, uint32_t T,
                              float *out);

/* The tile parameters of one layer's K or V tiles of T tokens under p: p's
 * scheme, head_dim, k_outliers / v_outliers, S = p's sinks (capped at T) when
 * root (the tile belongs to a sequence's first block), else 0; key_offsets =
 * p's for a K tile, 0 for a V tile; dynamic group
 * scales (static_scales NULL: docs/QUALITY.md §6 recommends them; set
 * kvs_profile_k_scales / kvs_profile_v_scales_fill there for static ones);
 * and tensor_scale = the layer's k_tensor_scale / v_tensor_scale, so FP8
 * group scales are aligned to the per-tensor scale (kvq.h; docs/QUALITY.md
 * §5: no tile worse than per-tensor FP8). Those scales are amax / qmax of p's
 * scheme: a caller that changes out->scheme to another FP8 format recomputes
 * tensor_scale from layers[layer].k_amax / v_amax. *out is fully written.
 * KVS_EINVAL for a NULL argument, layer out of range, a kind that is not
 * K or V, or T outside 1..KVS_TILE_MAX_TOKENS. */
int kvs_profile_tile_params(const kvs_profile *p, uint32_t layer, kvs_tile_kind kind, uint32_t T,
                            int root, kvs_tile_params *out);

void kvs_profile_free(kvs_profile *p);

/* Names used in profiles and on command lines: "fp16", "fp8_e4m3", "fp8_e5m2",
 * "int8"; parse also takes "e4m3", "e5m2". 0 or KVS_EINVAL. */
const char *kvs_scheme_name(kvs_scheme s);
int kvs_scheme_parse(const char *name, kvs_scheme *out);
const char *kvs_dtype_name(kvs_dtype d);

/* Metadata bits per element (scales + outliers + the two tile headers) of a
 * K tile and a V tile pair at (T, D) with kK and kV outliers and no sinks. */
double kvs_quant_meta_bits(kvs_scheme s, uint32_t T, uint32_t D, uint32_t kK, uint32_t kV);

#endif /* KVQ_CALIB_H */
