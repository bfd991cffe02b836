/*
 * keys.c — the SHA-256 hash chain of docs/KEYSPEC.md, on OpenSSL's EVP digests.
 *
 * Every integer is written little-endian byte by byte, so the bytes hashed do
 * not depend on the host. The encoder validates every field: a descriptor that
 * would not survive a round trip through the spec is refused, not truncated.
 *
 * Speed: the digest is fetched from OpenSSL's provider once per process (an
 * implicit fetch by EVP_sha256() on every init cost as much as hashing an
 * 8-block chain), and a chain reuses one digest context for all its blocks.
 */
#include "keys.h"

#include "kvs_error.h"

#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static size_t put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
    return 4;
}

static size_t put_str(uint8_t *p, const char *s, size_t n)
{
    p[0] = (uint8_t)n;
    if (n)
        memcpy(p + 1, s, n);
    return 1 + n;
}

static int fail(char *err, size_t errlen, const char *what)
{
    if (err && errlen)
        snprintf(err, errlen, "namespace descriptor: %s", what);
    return KVS_EINVAL;
}

int kvs_ns_encode(const kvs_ns_desc *d, uint8_t *out, size_t cap, size_t *len,
                  char *err, size_t errlen)
{
    if (!d || !out || !len)
        return KVS_EINVAL;
    if (d->tenant_len < 1 || d->tenant_len > KVS_NS_STR_MAX || !d->tenant)
        return fail(err, errlen, "tenant must be 1..255 bytes");
    if (d->model_len < 1 || d->model_len > KVS_NS_STR_MAX || !d->model)
        return fail(err, errlen, "model fingerprint must be 1..255 bytes");
    if (d->salt_len > KVS_NS_STR_MAX || (d->salt_len && !d->salt))
        return fail(err, errlen, "salt must be 0..255 bytes");
    if (d->num_layers < 1 || d->num_kv_heads < 1 || d->head_dim < 1)
        return fail(err, errlen, "num_layers, num_kv_heads and head_dim must be >= 1");
    if (d->block_tokens < KVS_BLOCK_TOKENS_MIN || d->block_tokens > KVS_BLOCK_TOKENS_MAX)
        return fail(err, errlen, "block_tokens must be 16..1024");
    if (d->dtype != KVS_DTYPE_FP16 && d->dtype != KVS_DTYPE_BF16 && d->dtype != KVS_DTYPE_FP32)
        return fail(err, errlen, "dtype must be fp16 (1), bf16 (2) or fp32 (3)");
    size_t need = 1 + (1 + d->tenant_len) + (1 + d->model_len) + 16 + 1 + (1 + d->salt_len);
    if (cap < need)
        return KVS_ENOSPC;
    size_t o = 0;
    out[o++] = 1; /* descriptor version */
    o += put_str(out + o, d->tenant, d->tenant_len);
    o += put_str(out + o, d->model, d->model_len);
    o += put_u32(out + o, d->num_layers);
    o += put_u32(out + o, d->num_kv_heads);
    o += put_u32(out + o, d->head_dim);
    o += put_u32(out + o, d->block_tokens);
    out[o++] = (uint8_t)d->dtype;
    o += put_str(out + o, d->salt, d->salt_len);
    KVS_ASSERT(o == need);
    *len = o;
    return 0;
}

/* Feed n tokens as u32le, in chunks so the stack buffer stays small. */
static int update_tokens(EVP_MD_CTX *c, const uint32_t *t, size_t n)
{
    uint8_t buf[256 * 4];
    while (n) {
        size_t k = n < 256 ? n : 256;
        for (size_t i = 0; i < k; i++)
            put_u32(buf + 4 * i, t[i]);
        if (EVP_DigestUpdate(c, buf, 4 * k) != 1)
            return KVS_EINTERNAL;
        t += k;
        n -= k;
    }
    return 0;
}

static EVP_MD *g_sha256;
static pthread_once_t g_sha256_once = PTHREAD_ONCE_INIT;

static void fetch_sha256(void) { g_sha256 = EVP_MD_fetch(NULL, "SHA2-256", NULL); }

/* The provider's SHA-256, fetched once (the legacy EVP_sha256() when the fetch fails). */
static const EVP_MD *sha256(void)
{
    pthread_once(&g_sha256_once, fetch_sha256);
    return g_sha256 ? g_sha256 : EVP_sha256();
}

static int root_with(EVP_MD_CTX *c, const uint8_t *enc, size_t enc_len, const uint8_t sl[2],
                     const uint8_t *secret, size_t secret_len, const uint32_t *tokens, size_t n,
                     kvs_key *out)
{
    unsigned int olen = 0;
    if (EVP_DigestInit_ex(c, sha256(), NULL) == 1 &&
        EVP_DigestUpdate(c, KVS_KEY_DOMAIN, strlen(KVS_KEY_DOMAIN)) == 1 &&
        EVP_DigestUpdate(c, enc, enc_len) == 1 && EVP_DigestUpdate(c, sl, 2) == 1 &&
        (secret_len == 0 || EVP_DigestUpdate(c, secret, secret_len) == 1) &&
        update_tokens(c, tokens, n) == 0 && EVP_DigestFinal_ex(c, out->b, &olen) == 1 &&
        olen == KVS_KEY_LEN)
        return 0;
    return KVS_EINTERNAL;
}

static int next_with(EVP_MD_CTX *c, const kvs_key *prev, const uint32_t *tokens, size_t n,
                     kvs_key *out)
{
    unsigned int olen = 0;
    if (EVP_DigestInit_ex(c, sha256(), NULL) == 1 &&
        EVP_DigestUpdate(c, prev->b, KVS_KEY_LEN) == 1 && update_tokens(c, tokens, n) == 0 &&
        EVP_DigestFinal_ex(c, out->b, &olen) == 1 && olen == KVS_KEY_LEN)
        return 0;
    return KVS_EINTERNAL;
}

int kvs_key_root(const kvs_ns_desc *d, const uint8_t *secret, size_t secret_len,
                 const uint32_t *tokens, kvs_key *out)
{
    if (!tokens) /* kvs_key_chain accepts NULL tokens for 0 blocks only */
        return KVS_EINVAL;
    return kvs_key_chain(d, secret, secret_len, tokens, 1, out);
}

int kvs_key_next(const kvs_key *prev, const uint32_t *tokens, size_t n, kvs_key *out)
{
    if (!prev || !tokens || !out || n == 0)
        return KVS_EINVAL;
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (!c)
        return KVS_ENOMEM;
    int rc = next_with(c, prev, tokens, n, out);
    EVP_MD_CTX_free(c);
    return rc;
}

int kvs_key_chain(const kvs_ns_desc *d, const uint8_t *secret, size_t secret_len,
                  const uint32_t *tokens, size_t nblocks, kvs_key *out)
{
    if (!d || !out || (nblocks && !tokens))
        return KVS_EINVAL;
    if (nblocks == 0)
        return 0;
    if (secret_len > KVS_SECRET_MAX || (secret_len && !secret))
        return KVS_EINVAL;
    uint8_t enc[KVS_NS_ENC_MAX];
    size_t enc_len;
    int rc = kvs_ns_encode(d, enc, sizeof enc, &enc_len, NULL, 0);
    if (rc)
        return rc;
    uint8_t sl[2] = {(uint8_t)secret_len, (uint8_t)(secret_len >> 8)};
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (!c)
        return KVS_ENOMEM;
    rc = root_with(c, enc, enc_len, sl, secret, secret_len, tokens, d->block_tokens, &out[0]);
    for (size_t i = 1; i < nblocks && rc == 0; i++)
        rc = next_with(c, &out[i - 1], tokens + i * d->block_tokens, d->block_tokens, &out[i]);
    EVP_MD_CTX_free(c);
    return rc;
}

char *kvs_key_hex(const kvs_key *k, char *buf)
{
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < KVS_KEY_LEN; i++) {
        buf[2 * i] = hx[k->b[i] >> 4];
        buf[2 * i + 1] = hx[k->b[i] & 15];
    }
    buf[2 * KVS_KEY_LEN] = '\0';
    return buf;
}
