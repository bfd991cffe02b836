/*
 * test_putmac.c — the seal of a put over UCX (common/kvs_putmac.h): a known
 * answer computed with the OpenSSL command line, a change of any byte the
 * seal covers refused, trailers that are not one refused, and the window of
 * sequence numbers. Sealed fetches: a known answer, every byte and field a
 * layer's tag covers (the request's nonce among them: a seal made for one
 * request does not check for another), and seals that are not one.
 */
#include "kvs_error.h"
#include "kvs_putmac.h"
#include "kvs_test.h"

#include <stdlib.h>
#include <string.h>

/* The vector: key 00 01 .. 1f, UCX key a0 a1 .. af a0 .. af, format 0,
 * header 0a 03 'a' 'b' 'c', sequence number 7, expiry 0x1122334455667788,
 * payload byte i = i * 37 mod 256 (1000 bytes). Its tags, from
 *   openssl mac -cipher AES-256-GCM -macopt hexkey:0001..1f \
 *     -macopt hexiv:0700000000000000<4b564832 | 4b565032> -in AAD GMAC
 * with AAD written as kvs_putmac.h says; the answer's tag (status -4, key
 * 100 .. 131, stored size 123456789) from Python's hmac module. */
static const uint8_t KAT_HTAG[16] = {0xC4, 0x0A, 0x03, 0xD7, 0x4D, 0xEE, 0x0A, 0x4C,
                                     0x87, 0x95, 0xAF, 0xBF, 0xAC, 0x4F, 0x7C, 0xC5};
static const uint8_t KAT_PTAG[16] = {0xC2, 0x66, 0x69, 0x40, 0x5C, 0x91, 0x9E, 0x2D,
                                     0x52, 0x4E, 0xBF, 0x71, 0x33, 0x20, 0x79, 0xA5};
static const uint8_t KAT_RTAG[16] = {0x1f, 0x45, 0x6e, 0xb2, 0x3f, 0x33, 0x12, 0x60,
                                     0x8b, 0x5b, 0x8f, 0xa9, 0xe1, 0xbf, 0xac, 0xe8};
static const uint8_t HDR[5] = {0x0a, 0x03, 'a', 'b', 'c'};
#define EXP 0x1122334455667788ull

typedef struct vec {
    uint8_t key[KVS_PUTMAC_KEY_LEN], ukey[KVS_PUTMAC_UKEY_LEN];
    uint32_t fmt;
    uint8_t meta[sizeof HDR + KVS_PUTMAC_TRAILER_LEN];
    uint8_t payload[1000];
} vec;

static int seal_vec(vec *v, uint64_t seq)
{
    kvs_putmac_put p = {.seq = seq, .expires_ms = EXP, .ukey = v->ukey, .fmt = v->fmt};
    return kvs_putmac_seal(v->key, &p, v->meta, sizeof HDR, v->payload, sizeof v->payload);
}

static void vec_make(vec *v)
{
    for (int i = 0; i < 32; i++) {
        v->key[i] = (uint8_t)i;
        v->ukey[i] = (uint8_t)(0xa0 + i % 16);
    }
    v->fmt = 0;
    memcpy(v->meta, HDR, sizeof HDR);
    for (int i = 0; i < 1000; i++)
        v->payload[i] = (uint8_t)(i * 37);
    CU_ASSERT_EQUAL_FATAL(seal_vec(v, 7), 0);
}

static int verify(const vec *v)
{
    return kvs_putmac_verify(v->key, v->ukey, v->fmt, v->meta, sizeof v->meta, v->payload,
                             sizeof v->payload);
}

static int verify_header(const vec *v)
{
    return kvs_putmac_verify_header(v->key, v->ukey, v->fmt, v->meta, sizeof v->meta,
                                    sizeof v->payload);
}

static void test_known_answer(void)
{
    vec v;
    vec_make(&v);
    const uint8_t *t = v.meta + sizeof HDR;
    CU_ASSERT_EQUAL(memcmp(t, "KVP2", 4), 0);
    CU_ASSERT_EQUAL(t[4], 7);
    CU_ASSERT_EQUAL(t[12], 0x88);
    CU_ASSERT_EQUAL(memcmp(t + 20, KAT_HTAG, 16), 0);
    CU_ASSERT_EQUAL(memcmp(t + 36, KAT_PTAG, 16), 0);
    CU_ASSERT_EQUAL(verify(&v), 0);
    CU_ASSERT_EQUAL(verify_header(&v), 0);
    size_t hl = 0;
    uint64_t seq = 0, exp = 0;
    CU_ASSERT_EQUAL(kvs_putmac_parse(v.meta, sizeof v.meta, &hl, &seq, &exp), 0);
    CU_ASSERT_EQUAL(hl, sizeof HDR);
    CU_ASSERT_EQUAL(seq, 7u);
    CU_ASSERT_EQUAL(exp, EXP);
    uint8_t rkey[32], tag[16];
    for (int i = 0; i < 32; i++)
        rkey[i] = (uint8_t)(100 + i);
    CU_ASSERT_EQUAL(kvs_putmac_reply_tag(v.key, 7, -4, rkey, 123456789u, tag), 0);
    CU_ASSERT_EQUAL(memcmp(tag, KAT_RTAG, 16), 0);
    CU_ASSERT_EQUAL(kvs_putmac_reply_verify(v.key, 7, -4, rkey, 123456789u, KAT_RTAG), 0);
}

/* Every bit of everything the seal covers: one flipped, the put tag refused;
 * the header tag refused for everything but the payload (and the put tag). */
static void test_every_byte_counts(void)
{
    vec v;
    vec_make(&v);
    uint8_t *parts[] = {v.key, v.ukey, v.meta, v.payload};
    size_t lens[] = {sizeof v.key, sizeof v.ukey, sizeof v.meta, sizeof v.payload};
    unsigned refused = 0, tried = 0, h_refused = 0, h_should = 0;
    for (size_t p = 0; p < 4; p++)
        for (size_t i = 0; i < lens[p]; i++) {
            uint8_t bit = (uint8_t)(1u << (i % 8));
            parts[p][i] ^= bit;
            tried++;
            refused += verify(&v) == KVS_EUNAUTH;
            /* the header tag covers all but the payload and the put tag */
            int in_ptag = p == 2 && i >= sizeof HDR + 36;
            if (p != 3 && !in_ptag) {
                h_should++;
                h_refused += verify_header(&v) == KVS_EUNAUTH;
            } else {
                CU_ASSERT_EQUAL(verify_header(&v), 0);
            }
            parts[p][i] ^= bit;
        }
    CU_ASSERT_EQUAL(refused, tried);
    CU_ASSERT_EQUAL(h_refused, h_should);
    CU_ASSERT_EQUAL(verify(&v), 0);
    /* the format */
    v.fmt = 1;
    CU_ASSERT_EQUAL(verify(&v), KVS_EUNAUTH);
    CU_ASSERT_EQUAL(verify_header(&v), KVS_EUNAUTH);
    v.fmt = 0;
    /* the payload's length: one byte fewer, or one more */
    CU_ASSERT_EQUAL(
        kvs_putmac_verify(v.key, v.ukey, 0, v.meta, sizeof v.meta, v.payload, sizeof v.payload - 1),
        KVS_EUNAUTH);
    CU_ASSERT_EQUAL(
        kvs_putmac_verify_header(v.key, v.ukey, 0, v.meta, sizeof v.meta, sizeof v.payload + 1),
        KVS_EUNAUTH);
    uint8_t more[1001];
    memcpy(more, v.payload, 1000);
    more[1000] = 0;
    CU_ASSERT_EQUAL(kvs_putmac_verify(v.key, v.ukey, 0, v.meta, sizeof v.meta, more, sizeof more),
                    KVS_EUNAUTH);
    /* the trailer moved: the header one byte longer, taking the magic's first byte */
    CU_ASSERT_EQUAL(
        kvs_putmac_verify(v.key, v.ukey, 0, v.meta, sizeof v.meta - 1, v.payload, sizeof v.payload),
        KVS_EUNAUTH);
    /* the answer: every field */
    uint8_t rkey[32] = {0}, tag[16];
    CU_ASSERT_EQUAL(kvs_putmac_reply_tag(v.key, 9, 0, rkey, 77, tag), 0);
    CU_ASSERT_EQUAL(kvs_putmac_reply_verify(v.key, 9, 0, rkey, 77, tag), 0);
    CU_ASSERT_EQUAL(kvs_putmac_reply_verify(v.key, 10, 0, rkey, 77, tag), KVS_EUNAUTH);
    CU_ASSERT_EQUAL(kvs_putmac_reply_verify(v.key, 9, -4, rkey, 77, tag), KVS_EUNAUTH);
    CU_ASSERT_EQUAL(kvs_putmac_reply_verify(v.key, 9, 0, rkey, 78, tag), KVS_EUNAUTH);
    rkey[31] = 1;
    CU_ASSERT_EQUAL(kvs_putmac_reply_verify(v.key, 9, 0, rkey, 77, tag), KVS_EUNAUTH);
    rkey[31] = 0;
    tag[15] ^= 0x80;
    CU_ASSERT_EQUAL(kvs_putmac_reply_verify(v.key, 9, 0, rkey, 77, tag), KVS_EUNAUTH);
    tag[15] ^= 0x80;
    v.key[0] ^= 1;
    CU_ASSERT_EQUAL(kvs_putmac_reply_verify(v.key, 9, 0, rkey, 77, tag), KVS_EUNAUTH);
}

static void test_not_a_trailer(void)
{
    size_t hl = 123;
    uint64_t seq = 456, exp = 789;
    uint8_t m[96];
    memset(m, 0, sizeof m);
    CU_ASSERT_EQUAL(kvs_putmac_parse(NULL, 0, &hl, &seq, &exp), KVS_EUNAUTH);
    CU_ASSERT_EQUAL(kvs_putmac_parse(m, KVS_PUTMAC_TRAILER_LEN - 1, &hl, &seq, &exp), KVS_EUNAUTH);
    CU_ASSERT_EQUAL(kvs_putmac_parse(m, sizeof m, &hl, &seq, &exp), KVS_EUNAUTH); /* no magic */
    memcpy(m + sizeof m - KVS_PUTMAC_TRAILER_LEN, "KVP1", 4); /* the first version's */
    m[sizeof m - KVS_PUTMAC_TRAILER_LEN + 4] = 1;
    CU_ASSERT_EQUAL(kvs_putmac_parse(m, sizeof m, &hl, &seq, &exp), KVS_EUNAUTH);
    memcpy(m + sizeof m - KVS_PUTMAC_TRAILER_LEN, "KVP2", 4);
    m[sizeof m - KVS_PUTMAC_TRAILER_LEN + 4] = 0; /* sequence number 0 */
    CU_ASSERT_EQUAL(kvs_putmac_parse(m, sizeof m, &hl, &seq, &exp), KVS_EUNAUTH);
    CU_ASSERT_EQUAL(hl, 123u); /* untouched on refusal */
    CU_ASSERT_EQUAL(seq, 456u);
    CU_ASSERT_EQUAL(exp, 789u);
    m[sizeof m - KVS_PUTMAC_TRAILER_LEN + 4] = 1;
    CU_ASSERT_EQUAL(kvs_putmac_parse(m, sizeof m, &hl, &seq, &exp), 0);
    CU_ASSERT_EQUAL(hl, sizeof m - KVS_PUTMAC_TRAILER_LEN);
    CU_ASSERT_EQUAL(seq, 1u);
    CU_ASSERT_EQUAL(exp, 0u);
    uint8_t key[32] = {0};
    /* tags 0 */
    CU_ASSERT_EQUAL(kvs_putmac_verify(key, key, 0, m, sizeof m, NULL, 0), KVS_EUNAUTH);
    CU_ASSERT_EQUAL(kvs_putmac_verify_header(key, key, 0, m, sizeof m, 0), KVS_EUNAUTH);
    CU_ASSERT_EQUAL(kvs_putmac_verify(key, key, 0, m, 10, NULL, 0), KVS_EUNAUTH);
    /* sealing with sequence number 0 is refused: GMAC needs a fresh IV;
     * a payload pointer is needed for a length */
    kvs_putmac_put p0 = {.seq = 0, .ukey = key};
    CU_ASSERT_EQUAL(kvs_putmac_seal(key, &p0, m, 8, NULL, 0), KVS_EINVAL);
    kvs_putmac_put p1 = {.seq = 1, .ukey = key};
    CU_ASSERT_EQUAL(kvs_putmac_seal(key, &p1, m, 8, NULL, 5), KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_putmac_verify(key, key, 0, m, sizeof m, NULL, 5), KVS_EINVAL);
    /* an empty header and payload seal and verify */
    uint8_t e[KVS_PUTMAC_TRAILER_LEN];
    CU_ASSERT_EQUAL(kvs_putmac_seal(key, &p1, e, 0, NULL, 0), 0);
    CU_ASSERT_EQUAL(kvs_putmac_verify(key, key, 0, e, sizeof e, NULL, 0), 0);
    CU_ASSERT_EQUAL(kvs_putmac_verify_header(key, key, 0, e, sizeof e, 0), 0);
}

/* The same input under two keys, and two sequence numbers under one key,
 * give different tags; fresh keys differ. */
static void test_keys_and_numbers(void)
{
    vec a, b;
    vec_make(&a);
    vec_make(&b);
    CU_ASSERT_EQUAL_FATAL(kvs_putmac_keygen(b.key), 0);
    CU_ASSERT_EQUAL(seal_vec(&b, 7), 0);
    CU_ASSERT_NOT_EQUAL(memcmp(a.meta, b.meta, sizeof a.meta), 0);
    CU_ASSERT_EQUAL(verify(&b), 0);
    memcpy(b.key, a.key, sizeof a.key); /* b's seal under a's key */
    CU_ASSERT_EQUAL(verify(&b), KVS_EUNAUTH);
    CU_ASSERT_EQUAL(verify_header(&b), KVS_EUNAUTH);
    CU_ASSERT_EQUAL(seal_vec(&b, 8), 0);
    CU_ASSERT_NOT_EQUAL(memcmp(a.meta + sizeof HDR + 20, b.meta + sizeof HDR + 20, 32), 0);
    /* a's tags with b's sequence number: refused */
    memcpy(b.meta + sizeof HDR + 20, a.meta + sizeof HDR + 20, 32);
    CU_ASSERT_EQUAL(verify(&b), KVS_EUNAUTH);
    CU_ASSERT_EQUAL(verify_header(&b), KVS_EUNAUTH);
    /* the header tag is not the put tag (different IVs and domains) */
    CU_ASSERT_NOT_EQUAL(memcmp(a.meta + sizeof HDR + 20, a.meta + sizeof HDR + 36, 16), 0);
    uint8_t k1[32], k2[32];
    CU_ASSERT_EQUAL(kvs_putmac_keygen(k1), 0);
    CU_ASSERT_EQUAL(kvs_putmac_keygen(k2), 0);
    CU_ASSERT_NOT_EQUAL(memcmp(k1, k2, 32), 0);
    uint64_t t0 = kvs_putmac_now_ms(), t1 = kvs_putmac_now_ms();
    CU_ASSERT(t0 > 0 && t1 >= t0);
}

static void test_window(void)
{
    kvs_putmac_window w;
    memset(&w, 0, sizeof w);
    CU_ASSERT_EQUAL(kvs_putmac_window_accept(&w, 0), KVS_EUNAUTH);
    /* in order, then each again */
    for (uint64_t s = 1; s <= 100; s++)
        CU_ASSERT_EQUAL(kvs_putmac_window_accept(&w, s), 0);
    unsigned again = 0;
    for (uint64_t s = 1; s <= 100; s++)
        again += kvs_putmac_window_accept(&w, s) == KVS_EUNAUTH;
    CU_ASSERT_EQUAL(again, 100u);
    /* out of order inside the window: a jump, then the numbers skipped */
    CU_ASSERT_EQUAL(kvs_putmac_window_accept(&w, 1000), 0);
    unsigned ok = 0;
    for (uint64_t s = 999; s > 100; s--)
        ok += kvs_putmac_window_accept(&w, s) == 0;
    CU_ASSERT_EQUAL(ok, 899u);
    CU_ASSERT_EQUAL(kvs_putmac_window_accept(&w, 500), KVS_EUNAUTH);
    /* the window's edge: top 2000 remembers 977 .. 2000 (of 101 .. 1000, 977 .. 1000) */
    CU_ASSERT_EQUAL(kvs_putmac_window_accept(&w, 2000), 0);
    CU_ASSERT_EQUAL(kvs_putmac_window_accept(&w, 2000 - KVS_PUTMAC_WINDOW), KVS_EUNAUTH); /* old */
    CU_ASSERT_EQUAL(kvs_putmac_window_accept(&w, 2000 - KVS_PUTMAC_WINDOW + 1), KVS_EUNAUTH);
    CU_ASSERT_EQUAL(kvs_putmac_window_accept(&w, 1000), KVS_EUNAUTH); /* accepted before */
    CU_ASSERT_EQUAL(kvs_putmac_window_accept(&w, 1001), 0);           /* never seen */
    /* a shift by a multiple of 64 and by 64 + 1 keep what they should */
    CU_ASSERT_EQUAL(kvs_putmac_window_accept(&w, 2064), 0);
    CU_ASSERT_EQUAL(kvs_putmac_window_accept(&w, 2000), KVS_EUNAUTH);
    CU_ASSERT_EQUAL(kvs_putmac_window_accept(&w, 2129), 0);
    CU_ASSERT_EQUAL(kvs_putmac_window_accept(&w, 2000), KVS_EUNAUTH);
    CU_ASSERT_EQUAL(kvs_putmac_window_accept(&w, 2064), KVS_EUNAUTH);
    CU_ASSERT_EQUAL(kvs_putmac_window_accept(&w, 1001), KVS_EUNAUTH); /* 1,128 below: too old */
    CU_ASSERT_EQUAL(kvs_putmac_window_accept(&w, 1999), 0);
    CU_ASSERT_EQUAL(kvs_putmac_window_accept(&w, 2001), 0);
    /* a jump past the whole window forgets everything below it */
    CU_ASSERT_EQUAL(kvs_putmac_window_accept(&w, UINT64_MAX - 5), 0);
    CU_ASSERT_EQUAL(kvs_putmac_window_accept(&w, 2129), KVS_EUNAUTH);
    CU_ASSERT_EQUAL(kvs_putmac_window_accept(&w, UINT64_MAX), 0);
    CU_ASSERT_EQUAL(kvs_putmac_window_accept(&w, UINT64_MAX - 5), KVS_EUNAUTH);
    CU_ASSERT_EQUAL(kvs_putmac_window_accept(&w, UINT64_MAX - 4), 0);
}

/* The window against a plain model: a random walk of numbers near the top. */
static void test_window_model(void)
{
    kvs_putmac_window w;
    memset(&w, 0, sizeof w);
    enum { N = 20000 };
    uint8_t *seen = calloc(N + 2 * KVS_PUTMAC_WINDOW, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(seen);
    uint64_t top = 0, x = 88172645463325252ull;
    unsigned bad = 0;
    for (int i = 0; i < 200000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint64_t s = top + 40 >= 1300 ? top + 40 - (x % 1300) : 1 + x % (top + 40);
        if (s == 0 || s >= N)
            continue;
        int want =
            (top >= KVS_PUTMAC_WINDOW && s <= top - KVS_PUTMAC_WINDOW) || seen[s] ? KVS_EUNAUTH : 0;
        int got = kvs_putmac_window_accept(&w, s);
        bad += got != want;
        if (got == 0) {
            seen[s] = 1;
            if (s > top)
                top = s;
        }
    }
    CU_ASSERT_EQUAL(bad, 0u);
    CU_ASSERT(top > 10000);
    free(seen);
}

/* ---- sealed fetches ---- */

/* Put key 00 .. 1f, fetched key a0 .. af a0 .. af, request nonce c0 .. cf,
 * format 0, lend 5, two layers ending at 300 and 1000 of the payload above
 * (byte i = i * 37). Fetch key from Python's hmac (HMAC-SHA256(put key,
 * "kvstash ucx fetch key v1")), tags from
 *   openssl mac -cipher AES-256-GCM -macopt hexkey:<fetch key> \
 *     -macopt hexiv:0500000000000000<00000000 | 01000000> -in AAD GMAC
 * with AAD written as kvs_putmac.h says. */
static const uint8_t KAT_FKEY0[4] = {0xec, 0x92, 0xbc, 0xfb};
static const uint8_t KAT_FTAG[2][16] = {{0x12, 0x06, 0xFA, 0x14, 0x4A, 0xDE, 0x3B, 0xD2, 0x08, 0xDB,
                                         0x24, 0x4C, 0xD7, 0x2A, 0xD9, 0x88},
                                        {0xA1, 0x8A, 0x66, 0x0D, 0x45, 0x9B, 0xB4, 0x78, 0x5D, 0x68,
                                         0xA9, 0xAF, 0xC9, 0xCC, 0x60, 0xFC}};
static const uint64_t F_ENDS[2] = {300, 1000};

typedef struct fvec {
    uint8_t fkey[KVS_PUTMAC_KEY_LEN], bkey[32];
    uint8_t nonce[KVS_FETCHSEAL_NONCE_LEN];
    uint8_t block[1000];
    uint8_t seal[KVS_FETCHSEAL_LEN(2)];
} fvec;

static void fvec_make(fvec *f)
{
    vec v;
    vec_make(&v);
    CU_ASSERT_EQUAL_FATAL(kvs_fetchseal_key(v.key, f->fkey), 0);
    memcpy(f->bkey, v.ukey, 32);
    for (unsigned i = 0; i < KVS_FETCHSEAL_NONCE_LEN; i++)
        f->nonce[i] = (uint8_t)(0xc0 + i);
    memcpy(f->block, v.payload, sizeof f->block);
    CU_ASSERT_EQUAL_FATAL(
        kvs_fetchseal_make(f->fkey, f->bkey, f->nonce, 0, 5, 2, F_ENDS, f->block, f->seal), 0);
}

/* Both layers' checks: a bit per layer, set when it passes. */
static int fcheck(const fvec *f, uint32_t fmt)
{
    int ok = 0;
    for (uint32_t i = 0; i < 2; i++)
        if (kvs_fetchseal_check(f->fkey, f->seal, f->bkey, f->nonce, fmt, i, f->block,
                                sizeof f->block) == 0)
            ok |= 1 << i;
    return ok;
}

static void test_fetch_known_answer(void)
{
    fvec f;
    fvec_make(&f);
    CU_ASSERT_EQUAL(memcmp(f.fkey, KAT_FKEY0, 4), 0);
    CU_ASSERT_EQUAL(memcmp(f.seal, "KVF2", 4), 0);
    CU_ASSERT_EQUAL(f.seal[4], 2);
    CU_ASSERT_EQUAL(f.seal[8], 5);
    CU_ASSERT_EQUAL(memcmp(f.seal + 24, KAT_FTAG[0], 16), 0);
    CU_ASSERT_EQUAL(memcmp(f.seal + 48, KAT_FTAG[1], 16), 0);
    uint32_t L = 0;
    CU_ASSERT_EQUAL(kvs_fetchseal_parse(f.seal, sizeof f.seal, &L), 0);
    CU_ASSERT_EQUAL(L, 2u);
    CU_ASSERT_EQUAL(kvs_fetchseal_end(f.seal, 0), 300u);
    CU_ASSERT_EQUAL(kvs_fetchseal_end(f.seal, 1), 1000u);
    CU_ASSERT_EQUAL(fcheck(&f, 0), 3);
}

/* A flipped bit in a layer fails that layer only; in the key, the fetched
 * key, the nonce, the format, the lend, an end or a tag, the layers it
 * covers. */
static void test_fetch_every_byte_counts(void)
{
    fvec f;
    fvec_make(&f);
    for (size_t i = 0; i < sizeof f.block; i += 7) {
        f.block[i] ^= 0x10;
        CU_ASSERT_EQUAL(fcheck(&f, 0), i < 300 ? 2 : 1);
        f.block[i] ^= 0x10;
    }
    CU_ASSERT_EQUAL(fcheck(&f, 1), 0); /* another format */
    for (size_t i = 0; i < 32; i++) {
        f.bkey[i] ^= 1;
        CU_ASSERT_EQUAL(fcheck(&f, 0), 0);
        f.bkey[i] ^= 1;
        f.fkey[i] ^= 1;
        CU_ASSERT_EQUAL(fcheck(&f, 0), 0);
        f.fkey[i] ^= 1;
    }
    for (size_t i = 0; i < sizeof f.nonce; i++) {
        f.nonce[i] ^= 0x80;
        CU_ASSERT_EQUAL(fcheck(&f, 0), 0);
        f.nonce[i] ^= 0x80;
    }
    for (size_t i = 8; i < sizeof f.seal; i++) { /* lend, ends, tags */
        f.seal[i] ^= 0x01;
        int want = i < 16 ? 0 : i < 40 ? 2 : 1; /* lend: both; layer 0's end moves layer 1 too */
        if (i >= 16 && i < 24)
            want = 0;
        CU_ASSERT_EQUAL(fcheck(&f, 0), want);
        f.seal[i] ^= 0x01;
    }
    /* Swapped tags, and a layer count that claims one layer. */
    uint8_t t[16];
    memcpy(t, f.seal + 24, 16);
    memcpy(f.seal + 24, f.seal + 48, 16);
    memcpy(f.seal + 48, t, 16);
    CU_ASSERT_EQUAL(fcheck(&f, 0), 0);
    fvec_make(&f);
    CU_ASSERT_EQUAL(fcheck(&f, 0), 3);
    /* The block received only in part: a layer ending past it fails. */
    CU_ASSERT_EQUAL(kvs_fetchseal_check(f.fkey, f.seal, f.bkey, f.nonce, 0, 1, f.block, 999),
                    KVS_EUNAUTH);
    CU_ASSERT_EQUAL(kvs_fetchseal_check(f.fkey, f.seal, f.bkey, f.nonce, 0, 0, f.block, 300), 0);
    CU_ASSERT_EQUAL(kvs_fetchseal_check(f.fkey, f.seal, f.bkey, f.nonce, 0, 2, f.block, 1000),
                    KVS_EUNAUTH);
}

/* The replay a relay could make before seals bound the request: the same
 * block, key, format and bytes lent for request A (nonce A), then for
 * request B, and A's seal handed to B. Each seal checks with its own
 * request's nonce only, whatever the lend numbers; and nonces are drawn
 * fresh each time. */
static void test_fetch_nonce(void)
{
    fvec a, b;
    fvec_make(&a);
    b = a;
    CU_ASSERT_EQUAL_FATAL(kvs_fetchseal_nonce(a.nonce), 0);
    CU_ASSERT_EQUAL_FATAL(kvs_fetchseal_nonce(b.nonce), 0);
    CU_ASSERT_NOT_EQUAL(memcmp(a.nonce, b.nonce, sizeof a.nonce), 0);
    CU_ASSERT_EQUAL_FATAL(
        kvs_fetchseal_make(a.fkey, a.bkey, a.nonce, 0, 5, 2, F_ENDS, a.block, a.seal), 0);
    CU_ASSERT_EQUAL_FATAL(
        kvs_fetchseal_make(b.fkey, b.bkey, b.nonce, 0, 6, 2, F_ENDS, b.block, b.seal), 0);
    CU_ASSERT_EQUAL(fcheck(&a, 0), 3);
    CU_ASSERT_EQUAL(fcheck(&b, 0), 3);
    fvec replay = b;
    memcpy(replay.seal, a.seal, sizeof replay.seal); /* A's lend answers B */
    CU_ASSERT_EQUAL(fcheck(&replay, 0), 0);
    memcpy(replay.nonce, a.nonce, sizeof replay.nonce); /* only A's nonce checks it */
    CU_ASSERT_EQUAL(fcheck(&replay, 0), 3);
    /* the same lend number under another nonce: still refused */
    CU_ASSERT_EQUAL_FATAL(
        kvs_fetchseal_make(b.fkey, b.bkey, b.nonce, 0, 5, 2, F_ENDS, b.block, b.seal), 0);
    memcpy(replay.seal, b.seal, sizeof replay.seal);
    CU_ASSERT_EQUAL(fcheck(&replay, 0), 0);
    CU_ASSERT_EQUAL(kvs_fetchseal_make(a.fkey, a.bkey, NULL, 0, 5, 2, F_ENDS, a.block, a.seal),
                    KVS_EINVAL);
}

static void test_fetch_not_a_seal(void)
{
    fvec f;
    fvec_make(&f);
    uint32_t L = 0;
    CU_ASSERT_EQUAL(kvs_fetchseal_parse(f.seal, sizeof f.seal - 1, &L), KVS_EUNAUTH);
    CU_ASSERT_EQUAL(kvs_fetchseal_parse(f.seal, 15, &L), KVS_EUNAUTH);
    CU_ASSERT_EQUAL(kvs_fetchseal_parse(NULL, 0, &L), KVS_EUNAUTH);
    uint8_t s[sizeof f.seal];
    memcpy(s, f.seal, sizeof s);
    s[0] = 'X';
    CU_ASSERT_EQUAL(kvs_fetchseal_parse(s, sizeof s, &L), KVS_EUNAUTH);
    memcpy(s, f.seal, sizeof s);
    s[4] = 1; /* one layer, two layers' bytes */
    CU_ASSERT_EQUAL(kvs_fetchseal_parse(s, sizeof s, &L), KVS_EUNAUTH);
    s[4] = 0;
    CU_ASSERT_EQUAL(kvs_fetchseal_parse(s, KVS_FETCHSEAL_HDR_LEN, &L), KVS_EUNAUTH);
    memcpy(s, f.seal, sizeof s);
    memset(s + 8, 0, 8); /* lend 0 */
    CU_ASSERT_EQUAL(kvs_fetchseal_parse(s, sizeof s, &L), KVS_EUNAUTH);
    memcpy(s, f.seal, sizeof s);
    memcpy(s + 40, s + 16, 8); /* layer 1 ends where layer 0 does */
    CU_ASSERT_EQUAL(kvs_fetchseal_parse(s, sizeof s, &L), KVS_EUNAUTH);
    memcpy(s, f.seal, sizeof s);
    memset(s + 16, 0, 8); /* layer 0 empty */
    CU_ASSERT_EQUAL(kvs_fetchseal_parse(s, sizeof s, &L), KVS_EUNAUTH);
    /* What make refuses. */
    uint64_t flat[2] = {300, 300}, zero[1] = {0};
    CU_ASSERT_EQUAL(kvs_fetchseal_make(f.fkey, f.bkey, f.nonce, 0, 5, 2, flat, f.block, s),
                    KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_fetchseal_make(f.fkey, f.bkey, f.nonce, 0, 5, 1, zero, f.block, s),
                    KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_fetchseal_make(f.fkey, f.bkey, f.nonce, 0, 0, 2, F_ENDS, f.block, s),
                    KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_fetchseal_make(f.fkey, f.bkey, f.nonce, 0, 5, 0, F_ENDS, f.block, s),
                    KVS_EINVAL);
    CU_ASSERT_EQUAL(kvs_fetchseal_make(f.fkey, f.bkey, f.nonce, 0, 5, KVS_FETCHSEAL_MAX_LAYERS + 1,
                                       F_ENDS, f.block, s),
                    KVS_EINVAL);
}

int main(void)
{
    static const kvs_test_case cases[] = {
        {"known_answer", test_known_answer},
        {"every_byte_counts", test_every_byte_counts},
        {"not_a_trailer", test_not_a_trailer},
        {"keys_and_numbers", test_keys_and_numbers},
        {"window", test_window},
        {"window_model", test_window_model},
        {"fetch_known_answer", test_fetch_known_answer},
        {"fetch_every_byte_counts", test_fetch_every_byte_counts},
        {"fetch_nonce", test_fetch_nonce},
        {"fetch_not_a_seal", test_fetch_not_a_seal},
        {NULL, NULL},
    };
    static const kvs_test_suite suites[] = {{"putmac", NULL, NULL, cases},
                                            {NULL, NULL, NULL, NULL}};
    return kvs_test_run(suites);
}
