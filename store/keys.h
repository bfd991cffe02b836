/*
 * keys.h — block keys: a prompt's prefix as a SHA-256 hash chain (docs/KEYSPEC.md).
 *
 * The idea: block i of a prompt is named by a key that commits to the namespace
 * (tenant, model, layout, salt), the server-side tenant secret, and every token of
 * blocks 0..i. Two requests share key[i] exactly when they share the namespace and
 * the first (i+1)*block_tokens tokens, so the longest cached prefix is a walk down
 * the chain. The tenant secret never leaves the server: another tenant cannot
 * compute (or time) our keys.
 *
 *   key[0] = SHA-256("kvstash/v1" || descriptor || u16le(len(secret)) || secret
 *                    || tokens of block 0 as u32le)
 *   key[i] = SHA-256(key[i-1] || tokens of block i as u32le)
 *
 * Invariants: the descriptor encoding is canonical (one byte string per
 * descriptor, every field length-prefixed or fixed width), so no two descriptors
 * hash alike by concatenation games. Changing any byte of the encoding is a new
 * spec version ("kvstash/v2"), never a silent change: the unit test pins vectors.
 */
#ifndef KVS_KEYS_H
#define KVS_KEYS_H

#include <stddef.h>
#include <stdint.h>

#define KVS_KEY_LEN 32
#define KVS_KEY_DOMAIN "kvstash/v1"
#define KVS_NS_STR_MAX 255      /* tenant, model fingerprint, salt: 0..255 bytes */
#define KVS_SECRET_MAX 1024     /* tenant secret: 0..1024 bytes */
#define KVS_BLOCK_TOKENS_MIN 16
#define KVS_BLOCK_TOKENS_MAX 1024
/* Largest encoded descriptor: 1 + 3*(1+255) + 4*4 + 1. */
#define KVS_NS_ENC_MAX 786

typedef struct kvs_key {
    uint8_t b[KVS_KEY_LEN];
} kvs_key;

/* Source dtype of the KV the engine computed (before any store-side quantization). */
typedef enum kvs_dtype { KVS_DTYPE_FP16 = 1, KVS_DTYPE_BF16 = 2, KVS_DTYPE_FP32 = 3 } kvs_dtype;

/* A namespace descriptor. Strings are borrowed, need not be NUL-terminated
 * (lengths given), and may contain any byte. */
typedef struct kvs_ns_desc {
    const char *tenant;      size_t tenant_len;   /* 1..255 */
    const char *model;       size_t model_len;    /* model fingerprint, 1..255 */
    uint32_t num_layers;                          /* >= 1 */
    uint32_t num_kv_heads;                        /* >= 1 */
    uint32_t head_dim;                            /* >= 1 */
    uint32_t block_tokens;                        /* 16..1024 */
    kvs_dtype dtype;
    const char *salt;        size_t salt_len;     /* 0..255 */
} kvs_ns_desc;

/* Canonical encoding of d into out (capacity cap >= KVS_NS_ENC_MAX is always
 * enough); *len gets the byte count. KVS_EINVAL for an out-of-range field (err,
 * if not NULL, names it), KVS_ENOSPC if cap is too small. */
int kvs_ns_encode(const kvs_ns_desc *d, uint8_t *out, size_t cap, size_t *len,
                  char *err, size_t errlen);

/* key[0] for the first block: tokens has d->block_tokens entries. */
int kvs_key_root(const kvs_ns_desc *d, const uint8_t *secret, size_t secret_len,
                 const uint32_t *tokens, kvs_key *out);

/* key[i] from key[i-1] and the n tokens of block i (n = block_tokens). */
int kvs_key_next(const kvs_key *prev, const uint32_t *tokens, size_t n, kvs_key *out);

/* All keys of the first nblocks full blocks of tokens (out has nblocks entries). */
int kvs_key_chain(const kvs_ns_desc *d, const uint8_t *secret, size_t secret_len,
                  const uint32_t *tokens, size_t nblocks, kvs_key *out);

/* Lower-case hex of a key into buf (at least 65 bytes). Returns buf. */
char *kvs_key_hex(const kvs_key *k, char *buf);

#endif /* KVS_KEYS_H */
