/*
 * kvq_ref.c — the reference tile quantizer and dequantizer.
 *
 * Written for clarity, one element at a time, in the order kv_format.h states
 * the rule: widen to fp32, set sink rows aside, pick each group's outliers,
 * scale from the rest, encode. This file *is* the format's definition in
 * code; the fast CPU path and the CUDA kernels are tested against it bit for
 * bit (tests/conformance).
 */
#include "kvq.h"
#include "kvq_math.h"

#include "kvs_error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float load(const void *base, kvs_dtype dt, size_t i)
{
    switch (dt) {
    case KVS_DTYPE_FP16:
        return kvq_fp16_to_f32(((const uint16_t *)base)[i]);
    case KVS_DTYPE_BF16:
        return kvq_bf16_to_f32(((const uint16_t *)base)[i]);
    case KVS_DTYPE_FP32:
        return ((const float *)base)[i];
    }
    return 0.0f;
}

static void store(void *base, kvs_dtype dt, size_t i, float x)
{
    switch (dt) {
    case KVS_DTYPE_FP16:
        ((uint16_t *)base)[i] = kvq_f32_to_fp16(x);
        break;
    case KVS_DTYPE_BF16:
        ((uint16_t *)base)[i] = kvq_f32_to_bf16(x);
        break;
    case KVS_DTYPE_FP32:
        ((float *)base)[i] = x;
        break;
    }
}

static float qmax_of(kvs_scheme s)
{
    return s == KVS_SCHEME_INT8 ? KVQ_INT8_MAX
                                : kvq_fp8_max(s == KVS_SCHEME_FP8_E5M2 ? KVQ_FP8_E5M2 : KVQ_FP8_E4M3);
}

static uint8_t encode(kvs_scheme s, float x, float inv)
{
    /* docs/FORMAT.md: beyond the outlier slots ±Inf encodes as ±max (FP8) or
     * ±127 (INT8). In a group whose scale is 0 (its finite values all 0, or a
     * static scale of 0) inv is 0 and the IEEE product Inf * 0 is NaN, which
     * would give the FP8 NaN code (decoding to NaN) or INT8 0; any positive
     * multiplier keeps the Inf, which every encoder saturates. */
    if (inv == 0.0f && isinf(x))
        inv = 1.0f;
    if (s == KVS_SCHEME_INT8)
        return (uint8_t)kvq_int8_quantize(x, inv);
    return kvq_fp8_quantize(x, inv, s == KVS_SCHEME_FP8_E5M2 ? KVQ_FP8_E5M2 : KVQ_FP8_E4M3);
}

static float decode(kvs_scheme s, uint8_t c, float scale)
{
    if (s == KVS_SCHEME_INT8)
        return kvq_int8_dequantize((int8_t)c, scale);
    return kvq_fp8_dequantize(c, scale, s == KVS_SCHEME_FP8_E5M2 ? KVQ_FP8_E5M2 : KVQ_FP8_E4M3);
}

int kvs_tile_quantize_ref(const kvs_tile_params *p, const void *src, kvs_dtype dtype,
                          size_t stride, void *out, size_t cap, char *err)
{
    int rc = kvs_tile_quantize_args(p, src, dtype, stride, out, cap, err);
    if (rc)
        return rc;
    const uint32_t T = p->tokens, D = p->dim, k = p->outliers, S = p->sinks;
    kvs_tile_layout l;
    kvs_tile_layout_ex(p->scheme, p->kind, T, D, k, S, p->key_offsets != 0, &l);
    unsigned char *pay = (unsigned char *)out + sizeof(kvs_tile_hdr);
    memset(pay, 0, l.payload);

    if (p->scheme == KVS_SCHEME_FP16) {
        uint16_t *v = (uint16_t *)pay;
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t d = 0; d < D; d++)
                v[t * D + d] = kvq_f32_to_fp16(load(src, dtype, t * stride + d));
    } else {
        uint8_t *codes = pay + l.codes;
        uint16_t *scales = (uint16_t *)(pay + l.scales);
        unsigned char *outl = pay + l.outliers;
        const uint32_t E = l.entry;
        uint16_t *sinks = (uint16_t *)(pay + l.sinks);
        uint16_t *offs = (uint16_t *)(pay + l.offsets); /* K tiles with key_offsets */
        const float qmax = qmax_of(p->scheme);
        const uint16_t tensor16 = kvs_tile_tensor_scale_fp16(p); /* 0: not aligned */
        const uint32_t span = p->kind == KVS_TILE_K ? T : D; /* group length incl. sinks */
        float *x = malloc(sizeof(float) * span);
        int *idx = malloc(sizeof(int) * (k ? k : 1));
        unsigned char *is_out = malloc(span);
        if (!x || !idx || !is_out) {
            free(x);
            free(idx);
            free(is_out);
            return KVS_ENOMEM;
        }
        /* 1. sink rows */
        for (uint32_t t = 0; t < S; t++)
            for (uint32_t d = 0; d < D; d++)
                sinks[t * D + d] = kvq_f32_to_fp16(load(src, dtype, t * stride + d));
        for (uint32_t g = 0; g < l.groups; g++) {
            unsigned char *slots = outl + (size_t)g * k * E;
            for (uint32_t j = 0; j < k; j++)
                kvs_outlier_put(slots + j * E, E, KVS_OUTLIER_EMPTY, 0);
            /* The group: K = channel g over tokens S..T-1; V = row g over all D. */
            uint32_t first, n;
            if (p->kind == KVS_TILE_K) {
                first = S;
                n = T - S;
                for (uint32_t i = 0; i < n; i++)
                    x[i] = load(src, dtype, (size_t)(S + i) * stride + g);
                if (p->key_offsets) { /* 5. shift the channel by its offset */
                    offs[g] = kvq_offset_trim(x, (int)n, (int)k);
                    const float m = kvq_fp16_to_f32(offs[g]);
                    for (uint32_t i = 0; i < n; i++)
                        x[i] = kvq_offset_sub(x[i], m);
                }
            } else {
                if (g < S) { /* a sink row: scale 0, no outliers, codes 0 */
                    scales[g] = 0;
                    continue;
                }
                first = 0;
                n = D;
                for (uint32_t i = 0; i < n; i++)
                    x[i] = load(src, dtype, (size_t)g * stride + i);
            }
            /* 2. outliers */
            memset(is_out, 0, n ? n : 1);
            int got = kvq_topk_abs(x, (int)n, (int)k, idx);
            for (int j = 0; j < got; j++) {
                /* The value as given, also when the group was shifted. */
                float v = p->key_offsets
                              ? load(src, dtype, (size_t)(first + (uint32_t)idx[j]) * stride + g)
                              : x[idx[j]];
                kvs_outlier_put(slots + (uint32_t)j * E, E, first + (uint32_t)idx[j],
                                kvq_f32_to_fp16(v));
                is_out[idx[j]] = 1;
            }
            /* 3. scale from the rest, stored as fp16 rounded up, then aligned to
             * the per-tensor scale when there is one; the codes use exactly the
             * stored value */
            uint16_t scale16;
            if (p->static_scales) {
                scale16 = kvq_scale_fp16(p->static_scales[g]);
            } else {
                float amax = 0.0f;
                for (uint32_t i = 0; i < n; i++)
                    if (!is_out[i])
                        amax = kvq_amax_update(amax, x[i]);
                scale16 = kvq_scale_fp16(kvq_scale_from_amax(amax, qmax));
            }
            if (tensor16)
                scale16 = kvq_scale_align_fp16(scale16, tensor16);
            scales[g] = scale16;
            float inv = kvq_scale_inv(kvq_fp16_to_f32(scale16));
            for (uint32_t i = 0; i < n; i++) {
                if (is_out[i])
                    continue;
                uint32_t t = p->kind == KVS_TILE_K ? first + i : g;
                uint32_t d = p->kind == KVS_TILE_K ? g : i;
                codes[t * D + d] = encode(p->scheme, x[i], inv);
            }
        }
        free(x);
        free(idx);
        free(is_out);
    }

    kvs_tile_write_header(p, out);
    return 0;
}

/* kvs_tile_dequantize_ref, and with verified its _verified twin: the tile
 * checks differ in the checksum pass only, the decode is the same. */
static int dequantize_ref(const void *tile, size_t len, int verified, kvs_dtype dtype, void *dst,
                          size_t stride, char *err)
{
    kvs_tile_hdr h;
    int rc = verified ? kvs_tile_dequantize_verified_args(tile, len, dtype, dst, stride, &h, err)
                      : kvs_tile_dequantize_args(tile, len, dtype, dst, stride, &h, err);
    if (rc)
        return rc;
    const uint32_t T = h.tokens, D = h.dim, k = h.outliers, S = h.sinks;
    const unsigned koff = (h.flags & KVS_TILE_F_KOFF) != 0; /* K tiles only (kvs_tile_check) */
    kvs_tile_layout l;
    kvs_tile_layout_ex(h.scheme, h.kind, T, D, k, S, koff, &l);
    const unsigned char *pay = (const unsigned char *)tile + sizeof h;
    if (h.scheme == KVS_SCHEME_FP16) {
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t d = 0; d < D; d++) {
                uint16_t v;
                memcpy(&v, pay + 2u * (t * D + d), 2);
                store(dst, dtype, (size_t)t * stride + d, kvq_fp16_to_f32(v));
            }
        return 0;
    }
    const kvs_scheme s = (kvs_scheme)h.scheme;
    for (uint32_t t = 0; t < T; t++) {
        for (uint32_t d = 0; d < D; d++) {
            float x;
            if (t < S) { /* sink row: fp16 */
                uint16_t v;
                memcpy(&v, pay + l.sinks + 2u * (t * D + d), 2);
                x = kvq_fp16_to_f32(v);
            } else {
                uint16_t scale16;
                memcpy(&scale16, pay + l.scales + 2u * (h.kind == KVS_TILE_K ? d : t), 2);
                x = decode(s, pay[l.codes + t * D + d], kvq_fp16_to_f32(scale16));
                if (koff) {
                    uint16_t m16;
                    memcpy(&m16, pay + l.offsets + 2u * d, 2);
                    x = kvq_offset_add(x, kvq_fp16_to_f32(m16));
                }
            }
            store(dst, dtype, (size_t)t * stride + d, x);
        }
    }
    /* Outliers: a slot whose index is out of range is empty (kvs_tile_check
     * allows no other); a V sink row's slots are empty by the same check, and
     * skipped because an 8-bit empty index (0xFF) is in range when D = 256. */
    const uint32_t span = h.kind == KVS_TILE_K ? T : D;
    for (uint32_t g = h.kind == KVS_TILE_K ? 0 : S; g < l.groups; g++) {
        for (uint32_t j = 0; j < k; j++) {
            uint32_t index;
            uint16_t value;
            kvs_outlier_get(pay + l.outliers + (size_t)(g * k + j) * l.entry, l.entry, &index,
                            &value);
            if (index >= span)
                continue;
            uint32_t t = h.kind == KVS_TILE_K ? index : g;
            uint32_t d = h.kind == KVS_TILE_K ? g : index;
            store(dst, dtype, (size_t)t * stride + d, kvq_fp16_to_f32(value));
        }
    }
    return 0;
}

int kvs_tile_dequantize_ref(const void *tile, size_t len, kvs_dtype dtype, void *dst,
                            size_t stride, char *err)
{
    return dequantize_ref(tile, len, 0, dtype, dst, stride, err);
}

int kvs_tile_dequantize_verified_ref(const void *tile, size_t len, kvs_dtype dtype, void *dst,
                                     size_t stride, char *err)
{
    return dequantize_ref(tile, len, 1, dtype, dst, stride, err);
}
