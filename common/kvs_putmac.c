/*
 * kvs_putmac.c — AES-256-GMAC seals of UCX puts and HMAC-SHA256 tags of
 * their answers (kvs_putmac.h).
 *
 * OpenSSL's EVP_MAC "GMAC" does the arithmetic (AES-NI and carry-less
 * multiply where the CPU has them: about 10 GB/s on one core of the test VM,
 * where SHA-256 runs at 1.4) and HMAC-SHA256 the answers' tags (60 bytes
 * each); this file only fixes the byte layouts the two sides agree on and
 * the replay window.
 */
#include "kvs_putmac.h"
#include "kvs_error.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

static const char D_PUT[18] = "kvstash ucx put v2"; /* no terminating NULs on the wire */
static const char D_HDR[25] = "kvstash ucx put header v2";
static const char D_REPLY[24] = "kvstash ucx put reply v2";
static const char D_RKEY[28] = "kvstash ucx put reply key v2";
static const char D_FETCH[20] = "kvstash ucx fetch v2";
static const char D_FKEY[24] = "kvstash ucx fetch key v1";
static const uint8_t MAGIC[4] = {'K', 'V', 'P', '2'};
static const uint8_t FMAGIC[4] = {'K', 'V', 'F', '2'};
static const uint8_t IV_HDR[4] = {'K', 'V', 'H', '2'};

/* The trailer's fields, from its start. */
#define T_SEQ    4
#define T_EXP    12
#define T_HTAG   20
#define T_PTAG   36
#define T_SIGNED 20 /* magic, sequence number, expiry: covered by both tags */

static void le64(uint8_t out[8], uint64_t v)
{
    for (int i = 0; i < 8; i++)
        out[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t rd64(const uint8_t in[8])
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)in[i] << (8 * i);
    return v;
}

int kvs_putmac_keygen(uint8_t key[KVS_PUTMAC_KEY_LEN])
{
    return RAND_bytes(key, KVS_PUTMAC_KEY_LEN) == 1 ? 0 : KVS_EIO;
}

uint64_t kvs_putmac_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

typedef struct part {
    const void *p;
    size_t n;
} part;

/* The two algorithms, fetched once (EVP_MAC_fetch searches OpenSSL's
 * provider store under a lock: not per put), kept until exit. */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static EVP_MAC *g_gmac, *g_hmac;

static void fetch_macs(void)
{
    g_gmac = EVP_MAC_fetch(NULL, "GMAC", NULL);
    g_hmac = EVP_MAC_fetch(NULL, "HMAC", NULL);
}

/* One MAC (GMAC or HMAC, its parameters) over the parts, into out. */
static int mac_of(int gmac, const OSSL_PARAM *params, const uint8_t *key, size_t klen,
                  const part *parts, size_t np, uint8_t *out, size_t outcap, size_t want)
{
    pthread_once(&g_once, fetch_macs);
    EVP_MAC *mac = gmac ? g_gmac : g_hmac;
    EVP_MAC_CTX *ctx = mac ? EVP_MAC_CTX_new(mac) : NULL;
    int ok = ctx != NULL && EVP_MAC_init(ctx, key, klen, params) == 1;
    for (size_t i = 0; ok && i < np; i++)
        ok = parts[i].n == 0 || EVP_MAC_update(ctx, parts[i].p, parts[i].n) == 1;
    size_t got = 0;
    ok = ok && EVP_MAC_final(ctx, out, &got, outcap) == 1 && got == want;
    EVP_MAC_CTX_free(ctx);
    return ok ? 0 : KVS_EINTERNAL;
}

/* A GMAC tag: IV = seq | iv4, over domain | u64 n | meta[0..n) | ukey | u32
 * fmt | u64 len | payload (when payload is not NULL). */
static int gmac_tag(const uint8_t key[KVS_PUTMAC_KEY_LEN], uint64_t seq, const uint8_t iv4[4],
                    const char *domain, size_t dlen, const uint8_t *meta, size_t n,
                    const uint8_t *ukey, uint32_t fmt, const void *payload, uint64_t len,
                    uint8_t tag[KVS_PUTMAC_TAG_LEN])
{
    uint8_t iv[12], nb[8], fb[4], lb[8];
    le64(iv, seq);
    memcpy(iv + 8, iv4, 4);
    le64(nb, n);
    for (int i = 0; i < 4; i++)
        fb[i] = (uint8_t)(fmt >> (8 * i));
    le64(lb, len);
    OSSL_PARAM p[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_CIPHER, (char *)"AES-256-GCM", 0),
        OSSL_PARAM_construct_octet_string(OSSL_MAC_PARAM_IV, iv, sizeof iv),
        OSSL_PARAM_construct_end(),
    };
    part parts[] = {{domain, dlen},
                    {nb, 8},
                    {meta, n},
                    {ukey, KVS_PUTMAC_UKEY_LEN},
                    {fb, 4},
                    {lb, 8},
                    {payload, payload ? (size_t)len : 0}};
    return mac_of(1, p, key, KVS_PUTMAC_KEY_LEN, parts, sizeof parts / sizeof parts[0], tag,
                  KVS_PUTMAC_TAG_LEN, KVS_PUTMAC_TAG_LEN);
}

int kvs_putmac_seal(const uint8_t key[KVS_PUTMAC_KEY_LEN], const kvs_putmac_put *p, uint8_t *meta,
                    size_t hdr_len, const void *payload, uint64_t len)
{
    static const uint8_t none[1];
    if (p->seq == 0 || (payload == NULL && len != 0))
        return KVS_EINVAL;
    if (payload == NULL)
        payload = none; /* an empty payload is still a put tag's part */
    uint8_t *t = meta + hdr_len;
    memcpy(t, MAGIC, 4);
    le64(t + T_SEQ, p->seq);
    le64(t + T_EXP, p->expires_ms);
    size_t n = hdr_len + T_SIGNED;
    int rc = gmac_tag(key, p->seq, IV_HDR, D_HDR, sizeof D_HDR, meta, n, p->ukey, p->fmt, NULL, len,
                      t + T_HTAG);
    if (rc == 0)
        rc = gmac_tag(key, p->seq, MAGIC, D_PUT, sizeof D_PUT, meta, n, p->ukey, p->fmt, payload,
                      len, t + T_PTAG);
    return rc;
}

int kvs_putmac_parse(const void *meta, size_t meta_len, size_t *hdr_len, uint64_t *seq,
                     uint64_t *expires_ms)
{
    const uint8_t *m = meta;
    if (m == NULL || meta_len < KVS_PUTMAC_TRAILER_LEN)
        return KVS_EUNAUTH;
    const uint8_t *t = m + meta_len - KVS_PUTMAC_TRAILER_LEN;
    if (memcmp(t, MAGIC, 4) != 0 || rd64(t + T_SEQ) == 0)
        return KVS_EUNAUTH;
    *hdr_len = meta_len - KVS_PUTMAC_TRAILER_LEN;
    *seq = rd64(t + T_SEQ);
    *expires_ms = rd64(t + T_EXP);
    return 0;
}

/* Recomputes one of meta's tags (payload NULL: the header tag) and compares. */
static int check(const uint8_t key[KVS_PUTMAC_KEY_LEN], const uint8_t *ukey, uint32_t fmt,
                 const void *meta, size_t meta_len, const void *payload, uint64_t len)
{
    size_t hl;
    uint64_t seq, exp;
    if (kvs_putmac_parse(meta, meta_len, &hl, &seq, &exp) != 0)
        return KVS_EUNAUTH;
    const uint8_t *m = meta, *t = m + hl;
    uint8_t tag[KVS_PUTMAC_TAG_LEN];
    int rc = payload ? gmac_tag(key, seq, MAGIC, D_PUT, sizeof D_PUT, m, hl + T_SIGNED, ukey, fmt,
                                payload, len, tag)
                     : gmac_tag(key, seq, IV_HDR, D_HDR, sizeof D_HDR, m, hl + T_SIGNED, ukey, fmt,
                                NULL, len, tag);
    if (rc != 0)
        return rc;
    return CRYPTO_memcmp(tag, t + (payload ? T_PTAG : T_HTAG), sizeof tag) == 0 ? 0 : KVS_EUNAUTH;
}

int kvs_putmac_verify_header(const uint8_t key[KVS_PUTMAC_KEY_LEN],
                             const uint8_t ukey[KVS_PUTMAC_UKEY_LEN], uint32_t fmt,
                             const void *meta, size_t meta_len, uint64_t len)
{
    return check(key, ukey, fmt, meta, meta_len, NULL, len);
}

int kvs_putmac_verify(const uint8_t key[KVS_PUTMAC_KEY_LEN],
                      const uint8_t ukey[KVS_PUTMAC_UKEY_LEN], uint32_t fmt, const void *meta,
                      size_t meta_len, const void *payload, uint64_t len)
{
    static const uint8_t none[1];
    if (payload == NULL && len != 0)
        return KVS_EINVAL;
    int rc = check(key, ukey, fmt, meta, meta_len, NULL, len); /* both tags */
    return rc ? rc : check(key, ukey, fmt, meta, meta_len, payload ? payload : none, len);
}

int kvs_putmac_reply_tag(const uint8_t key[KVS_PUTMAC_KEY_LEN], uint64_t seq, int32_t status,
                         const uint8_t rkey[32], uint64_t stored_bytes,
                         uint8_t tag[KVS_PUTMAC_TAG_LEN])
{
    OSSL_PARAM p[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
        OSSL_PARAM_construct_end(),
    };
    uint8_t k2[32], full[32], sb[8], st[4], zb[8];
    part kp[] = {{D_RKEY, sizeof D_RKEY}};
    int rc = mac_of(0, p, key, KVS_PUTMAC_KEY_LEN, kp, 1, k2, sizeof k2, sizeof k2);
    le64(sb, seq);
    for (int i = 0; i < 4; i++)
        st[i] = (uint8_t)((uint32_t)status >> (8 * i));
    le64(zb, stored_bytes);
    part parts[] = {{D_REPLY, sizeof D_REPLY}, {sb, 8}, {st, 4}, {rkey, 32}, {zb, 8}};
    if (rc == 0)
        rc = mac_of(0, p, k2, sizeof k2, parts, sizeof parts / sizeof parts[0], full, sizeof full,
                    sizeof full);
    if (rc == 0)
        memcpy(tag, full, KVS_PUTMAC_TAG_LEN);
    OPENSSL_cleanse(k2, sizeof k2);
    return rc;
}

int kvs_putmac_reply_verify(const uint8_t key[KVS_PUTMAC_KEY_LEN], uint64_t seq, int32_t status,
                            const uint8_t rkey[32], uint64_t stored_bytes,
                            const uint8_t tag[KVS_PUTMAC_TAG_LEN])
{
    uint8_t want[KVS_PUTMAC_TAG_LEN];
    int rc = kvs_putmac_reply_tag(key, seq, status, rkey, stored_bytes, want);
    if (rc != 0)
        return rc;
    return CRYPTO_memcmp(want, tag, sizeof want) == 0 ? 0 : KVS_EUNAUTH;
}

#define WORDS (KVS_PUTMAC_WINDOW / 64)

int kvs_putmac_window_accept(kvs_putmac_window *w, uint64_t seq)
{
    if (seq == 0)
        return KVS_EUNAUTH;
    if (seq > w->top) { /* slide: bit i becomes bit i + d */
        uint64_t d = seq - w->top;
        if (d >= KVS_PUTMAC_WINDOW) {
            memset(w->seen, 0, sizeof w->seen);
        } else {
            size_t ws = (size_t)(d / 64);
            unsigned bs = (unsigned)(d % 64);
            for (size_t j = WORDS; j-- > 0;) {
                uint64_t v = j >= ws ? w->seen[j - ws] << bs : 0;
                if (bs && j >= ws + 1)
                    v |= w->seen[j - ws - 1] >> (64 - bs);
                w->seen[j] = v;
            }
        }
        w->top = seq;
        w->seen[0] |= 1;
        return 0;
    }
    uint64_t i = w->top - seq;
    if (i >= KVS_PUTMAC_WINDOW)
        return KVS_EUNAUTH;
    uint64_t bit = (uint64_t)1 << (i % 64);
    if (w->seen[i / 64] & bit)
        return KVS_EUNAUTH;
    w->seen[i / 64] |= bit;
    return 0;
}

/* ---- sealed fetches ---------------------------------------------------------- */

static void le32(uint8_t out[4], uint32_t v)
{
    for (int i = 0; i < 4; i++)
        out[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t rd32(const uint8_t in[4])
{
    return (uint32_t)in[0] | (uint32_t)in[1] << 8 | (uint32_t)in[2] << 16 | (uint32_t)in[3] << 24;
}

int kvs_fetchseal_key(const uint8_t put_key[KVS_PUTMAC_KEY_LEN], uint8_t fkey[KVS_PUTMAC_KEY_LEN])
{
    OSSL_PARAM p[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
        OSSL_PARAM_construct_end(),
    };
    part kp[] = {{D_FKEY, sizeof D_FKEY}};
    return mac_of(0, p, put_key, KVS_PUTMAC_KEY_LEN, kp, 1, fkey, KVS_PUTMAC_KEY_LEN,
                  KVS_PUTMAC_KEY_LEN);
}

int kvs_fetchseal_nonce(uint8_t nonce[KVS_FETCHSEAL_NONCE_LEN])
{
    return RAND_bytes(nonce, KVS_FETCHSEAL_NONCE_LEN) == 1 ? 0 : KVS_EIO;
}

/* Tag of layer i, [start, end) of block, lent for the request of nonce. */
static int layer_tag(const uint8_t fkey[KVS_PUTMAC_KEY_LEN], const uint8_t bkey[32],
                     const uint8_t nonce[KVS_FETCHSEAL_NONCE_LEN], uint32_t fmt, uint64_t lend,
                     uint32_t layers, uint32_t i, uint64_t start, uint64_t end,
                     const uint8_t *block, uint8_t tag[KVS_PUTMAC_TAG_LEN])
{
    uint8_t iv[12], hd[36];
    le64(iv, lend);
    le32(iv + 8, i);
    le32(hd, fmt);
    le32(hd + 4, layers);
    le32(hd + 8, i);
    le64(hd + 12, start);
    le64(hd + 20, end);
    le64(hd + 28, lend);
    OSSL_PARAM p[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_CIPHER, (char *)"AES-256-GCM", 0),
        OSSL_PARAM_construct_octet_string(OSSL_MAC_PARAM_IV, iv, sizeof iv),
        OSSL_PARAM_construct_end(),
    };
    part parts[] = {{D_FETCH, sizeof D_FETCH},
                    {bkey, 32},
                    {nonce, KVS_FETCHSEAL_NONCE_LEN},
                    {hd, sizeof hd},
                    {block + start, end - start}};
    return mac_of(1, p, fkey, KVS_PUTMAC_KEY_LEN, parts, sizeof parts / sizeof parts[0], tag,
                  KVS_PUTMAC_TAG_LEN, KVS_PUTMAC_TAG_LEN);
}

int kvs_fetchseal_make(const uint8_t fkey[KVS_PUTMAC_KEY_LEN], const uint8_t bkey[32],
                       const uint8_t nonce[KVS_FETCHSEAL_NONCE_LEN], uint32_t fmt, uint64_t lend,
                       uint32_t layers, const uint64_t *ends, const void *bytes, uint8_t *seal)
{
    if (layers == 0 || layers > KVS_FETCHSEAL_MAX_LAYERS || lend == 0 || !nonce || !ends ||
        !bytes || !seal)
        return KVS_EINVAL;
    for (uint32_t i = 0; i < layers; i++)
        if (ends[i] <= (i ? ends[i - 1] : 0))
            return KVS_EINVAL;
    memcpy(seal, FMAGIC, 4);
    le32(seal + 4, layers);
    le64(seal + 8, lend);
    for (uint32_t i = 0; i < layers; i++) {
        uint8_t *e = seal + KVS_FETCHSEAL_LEN(i);
        le64(e, ends[i]);
        int rc = layer_tag(fkey, bkey, nonce, fmt, lend, layers, i, i ? ends[i - 1] : 0, ends[i],
                           bytes, e + 8);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int kvs_fetchseal_parse(const void *seal, size_t len, uint32_t *layers)
{
    const uint8_t *s = seal;
    if (!s || len < KVS_FETCHSEAL_HDR_LEN || memcmp(s, FMAGIC, 4) != 0)
        return KVS_EUNAUTH;
    uint32_t L = rd32(s + 4);
    if (L == 0 || L > KVS_FETCHSEAL_MAX_LAYERS || len != KVS_FETCHSEAL_LEN(L) || rd64(s + 8) == 0)
        return KVS_EUNAUTH;
    for (uint32_t i = 0; i < L; i++)
        if (kvs_fetchseal_end(s, i) <= (i ? kvs_fetchseal_end(s, i - 1) : 0))
            return KVS_EUNAUTH;
    *layers = L;
    return 0;
}

uint64_t kvs_fetchseal_end(const void *seal, uint32_t i)
{
    return rd64((const uint8_t *)seal + KVS_FETCHSEAL_LEN(i));
}

int kvs_fetchseal_check(const uint8_t fkey[KVS_PUTMAC_KEY_LEN], const void *seal,
                        const uint8_t bkey[32], const uint8_t nonce[KVS_FETCHSEAL_NONCE_LEN],
                        uint32_t fmt, uint32_t i, const void *block, uint64_t have)
{
    const uint8_t *s = seal;
    uint32_t L = rd32(s + 4);
    if (i >= L)
        return KVS_EUNAUTH;
    uint64_t start = i ? kvs_fetchseal_end(s, i - 1) : 0, end = kvs_fetchseal_end(s, i);
    if (end > have || end <= start || !block || !nonce) /* the seal is untrusted memory */
        return KVS_EUNAUTH;
    uint8_t want[KVS_PUTMAC_TAG_LEN];
    int rc = layer_tag(fkey, bkey, nonce, fmt, rd64(s + 8), L, i, start, end, block, want);
    if (rc != 0)
        return rc;
    rc = CRYPTO_memcmp(want, s + KVS_FETCHSEAL_LEN(i) + 8, sizeof want) == 0 ? 0 : KVS_EUNAUTH;
    OPENSSL_cleanse(want, sizeof want);
    return rc;
}
