/*
 * kvs_putmac.h — the seals of a put over UCX and of its answer, shared by
 * kvstashd (service/data_connect.c, which checks the put's and seals the
 * answer) and libkvstash (clients/c/xfer.c, which seals the put and checks
 * the answer).
 *
 * Why: with ucx_isolate, UCX runs in kvstash-xferd, a process that parses
 * every byte peers send. Code running there knows each open session's id and
 * token (it checks them) and relays every put and every answer, so it could
 * start puts of its own under any open session, change a put's header or
 * bytes in its bounce memory, hold a put back and deliver it later, or hand
 * the worker a false answer (a wrong key, on which the worker chains its next
 * block). Connect therefore hands the worker a per-session key over gRPC,
 * which the data plane process never sees (docs/TRANSFER.md, "Sealed puts").
 *
 * A put's metadata is the packed PutHeader followed by a 52-byte trailer:
 *   "KVP2" | u64 LE sequence number | u64 LE expiry (kvstashd's monotonic
 *   clock, ms) | header tag (16) | put tag (16).
 * Both tags are AES-256-GMAC (NIST SP 800-38D: GCM with no plaintext) under
 * the session's put key. With P = u64 LE n | the metadata's first n bytes
 * (header, magic, sequence number, expiry) | the UCX key (32 bytes) | u32 LE
 * format | u64 LE payload length:
 *   header tag: IV = sequence number (8 bytes LE) | "KVH2",
 *               over "kvstash ucx put header v2" (25 bytes) | P;
 *   put tag:    IV = sequence number | "KVP2",
 *               over "kvstash ucx put v2" (18 bytes) | P | the payload.
 * kvstashd checks the header tag before it looks at the header (so an answer
 * it gives, e.g. "already cached, here is its key", answers the worker's own
 * header), the expiry, and that the sequence number is new (a window of
 * KVS_PUTMAC_WINDOW numbers below the highest seen; each number is used once,
 * whatever becomes of its put), and the put tag once every byte has landed.
 * Sequence numbers start at 1 and are never reused within a session (GMAC
 * needs a fresh IV per key; the two tags' IVs differ in their last 4 bytes).
 *
 * The answer (kvs_xfer_put_reply: status, stored key, stored size) carries a
 * tag kvstashd computes and the worker checks: HMAC-SHA256 truncated to 16
 * bytes, under HMAC-SHA256(put key, "kvstash ucx put reply key v2"), over
 * "kvstash ucx put reply v2" (24 bytes) | u64 LE sequence number | i32 LE
 * status | key (32) | u64 LE stored size. (HMAC, not GMAC: kvstashd may
 * answer one sequence number more than once, which GMAC's IVs may not.)
 *
 * Thread safety: the functions are reentrant; a window is the caller's to
 * lock.
 */
#ifndef KVS_PUTMAC_H
#define KVS_PUTMAC_H

#include <stddef.h>
#include <stdint.h>

#define KVS_PUTMAC_KEY_LEN     32
#define KVS_PUTMAC_TAG_LEN     16
#define KVS_PUTMAC_TRAILER_LEN 52   /* magic 4, sequence number 8, expiry 8, tags 2 x 16 */
#define KVS_PUTMAC_UKEY_LEN    32   /* the UCX put's key field */
#define KVS_PUTMAC_WINDOW      1024 /* sequence numbers remembered below the highest */

/* Fills key with fresh random bytes (OpenSSL's RAND_bytes). 0 or KVS_EIO. */
int kvs_putmac_keygen(uint8_t key[KVS_PUTMAC_KEY_LEN]);

/* Milliseconds of this host's monotonic clock (the expiry's clock: kvstashd
 * reads it for Connect's answer and to check expiries). */
uint64_t kvs_putmac_now_ms(void);

/* What a put's seal binds besides its header and payload. */
typedef struct kvs_putmac_put {
    uint64_t seq;        /* >= 1, unique per key */
    uint64_t expires_ms; /* kvstashd's monotonic clock */
    const uint8_t *ukey; /* KVS_PUTMAC_UKEY_LEN bytes: the UCX key field */
    uint32_t fmt;        /* the UCX put's format */
} kvs_putmac_put;

/* Seals a put: meta holds hdr_len bytes of header followed by
 * KVS_PUTMAC_TRAILER_LEN bytes of room, where the trailer is written.
 * 0, KVS_EINVAL (sequence number 0) or KVS_EINTERNAL (OpenSSL failed). */
int kvs_putmac_seal(const uint8_t key[KVS_PUTMAC_KEY_LEN], const kvs_putmac_put *p, uint8_t *meta,
                    size_t hdr_len, const void *payload, uint64_t len);

/* The header length, sequence number and expiry of sealed metadata
 * (untrusted: nothing is verified yet). 0, or KVS_EUNAUTH when meta has no
 * trailer (too short, or not its magic) or the sequence number is 0. */
int kvs_putmac_parse(const void *meta, size_t meta_len, size_t *hdr_len, uint64_t *seq,
                     uint64_t *expires_ms);

/* Checks sealed metadata's header tag for a put of len bytes in format fmt
 * under ukey. 0, KVS_EUNAUTH (wrong tag, no trailer), KVS_EINTERNAL. */
int kvs_putmac_verify_header(const uint8_t key[KVS_PUTMAC_KEY_LEN],
                             const uint8_t ukey[KVS_PUTMAC_UKEY_LEN], uint32_t fmt,
                             const void *meta, size_t meta_len, uint64_t len);

/* Checks sealed metadata's two tags, the put tag against the payload that
 * arrived: 0, KVS_EUNAUTH (a wrong tag, no trailer), KVS_EINVAL (payload
 * NULL with len > 0) or KVS_EINTERNAL. Tags are compared in constant time. */
int kvs_putmac_verify(const uint8_t key[KVS_PUTMAC_KEY_LEN],
                      const uint8_t ukey[KVS_PUTMAC_UKEY_LEN], uint32_t fmt, const void *meta,
                      size_t meta_len, const void *payload, uint64_t len);

/* The tag of the answer to put seq: status, stored key (32 bytes) and stored
 * size. 0 or KVS_EINTERNAL. */
int kvs_putmac_reply_tag(const uint8_t key[KVS_PUTMAC_KEY_LEN], uint64_t seq, int32_t status,
                         const uint8_t rkey[32], uint64_t stored_bytes,
                         uint8_t tag[KVS_PUTMAC_TAG_LEN]);

/* 0 when tag is the answer's (constant time), KVS_EUNAUTH when not,
 * KVS_EINTERNAL. */
int kvs_putmac_reply_verify(const uint8_t key[KVS_PUTMAC_KEY_LEN], uint64_t seq, int32_t status,
                            const uint8_t rkey[32], uint64_t stored_bytes,
                            const uint8_t tag[KVS_PUTMAC_TAG_LEN]);

/* Sequence numbers a session has accepted: the highest, and a bitmap of the
 * KVS_PUTMAC_WINDOW numbers below it. Zero-initialise. */
typedef struct kvs_putmac_window {
    uint64_t top;
    uint64_t seen[KVS_PUTMAC_WINDOW / 64]; /* bit i: top - i was accepted */
} kvs_putmac_window;

/* Accepts seq once: 0 and remembers it, or KVS_EUNAUTH when it is 0, was
 * accepted before, or is KVS_PUTMAC_WINDOW or more below the highest. */
int kvs_putmac_window_accept(kvs_putmac_window *w, uint64_t seq);

/* ---- Sealed fetches (docs/TRANSFER.md "Sealed fetches") --------------------
 *
 * The same data plane process relays every block a worker fetches: it could
 * hand the worker other bytes (with tile checksums that match: XXH3 is not a
 * MAC). A session whose worker asked for it (ConnectRequest.seal_fetches)
 * gets a seal with every block kvstashd lends: one AES-256-GMAC tag per
 * layer under the session's fetch key, HMAC-SHA256(put key, "kvstash ucx
 * fetch key v1"), which only kvstashd and the worker hold. The seal (all
 * little-endian):
 *   "KVF2" | u32 layers L | u64 lend | L x (u64 end | tag (16))
 * Layer i covers bytes [start, end) of the block as sent, start = 0 for
 * layer 0 (which holds the block's header) and the previous layer's end
 * otherwise; the ends strictly increase and the last is the block's length.
 * Tag i: IV = lend (8 bytes LE) | u32 LE i, over "kvstash ucx fetch v2" (20
 * bytes) | the fetched key (32) | the request's nonce (16) | u32 format |
 * u32 L | u32 i | u64 start | u64 end | u64 lend | the layer's bytes.
 * lend is kvstashd's count of the session's lends, from 1, so no IV
 * repeats under a key. The nonce is KVS_FETCHSEAL_NONCE_LEN random bytes
 * the worker draws for each fetch request (kvs_fetchseal_nonce) and sends
 * with it; the data plane process hands it to kvstashd with each block of
 * the request, and the seal does not carry it: the worker checks with its
 * own. A tag therefore binds the bytes to this block, format, layer and
 * place and to the request they answer: a lend made for an earlier request
 * (of a block since deleted, or put again with other bytes) does not check
 * for a later one, nor does a lend for a nonce the relay changed. What the
 * relay can still do is withhold or delay an answer: bytes that check were
 * kvstashd's for that key at some moment after the worker sent the request
 * (docs/TRANSFER.md "Sealed fetches").
 */
#define KVS_FETCHSEAL_HDR_LEN    16u
#define KVS_FETCHSEAL_LAYER_LEN  24u
#define KVS_FETCHSEAL_MAX_LAYERS 255u /* (6144 - 16) / 24: transfer's seal cap */
#define KVS_FETCHSEAL_LEN(L)     (KVS_FETCHSEAL_HDR_LEN + KVS_FETCHSEAL_LAYER_LEN * (size_t)(L))
#define KVS_FETCHSEAL_NONCE_LEN  16u /* a fetch request's nonce */

/* The session's fetch key from its put key. 0 or KVS_EINTERNAL. */
int kvs_fetchseal_key(const uint8_t put_key[KVS_PUTMAC_KEY_LEN], uint8_t fkey[KVS_PUTMAC_KEY_LEN]);

/* Fills nonce with fresh random bytes for one fetch request (OpenSSL's
 * RAND_bytes). 0 or KVS_EIO. */
int kvs_fetchseal_nonce(uint8_t nonce[KVS_FETCHSEAL_NONCE_LEN]);

/* Seals a block of ends[layers - 1] bytes (layer i ends at ends[i]) lent as
 * lend (>= 1) for key bkey in format fmt, for the request that sent nonce,
 * into seal (KVS_FETCHSEAL_LEN(layers) bytes). 0, KVS_EINVAL (layers 0 or
 * above the maximum, lend 0, ends not strictly increasing from above 0) or
 * KVS_EINTERNAL. */
int kvs_fetchseal_make(const uint8_t fkey[KVS_PUTMAC_KEY_LEN], const uint8_t bkey[32],
                       const uint8_t nonce[KVS_FETCHSEAL_NONCE_LEN], uint32_t fmt, uint64_t lend,
                       uint32_t layers, const uint64_t *ends, const void *bytes, uint8_t *seal);

/* Checks a received seal's shape (untrusted; no tag is checked): its length,
 * magic, layer count (1..KVS_FETCHSEAL_MAX_LAYERS), lend (>= 1) and ends
 * (strictly increasing from above 0). 0 with *layers, or KVS_EUNAUTH. */
int kvs_fetchseal_parse(const void *seal, size_t len, uint32_t *layers);

/* Layer i's end in a seal kvs_fetchseal_parse accepted (i < its layers). */
uint64_t kvs_fetchseal_end(const void *seal, uint32_t i);

/* Checks layer i's tag over its bytes in block (the block as received, of
 * which have bytes are valid), for key bkey in format fmt, fetched by the
 * request that sent nonce, in a seal kvs_fetchseal_parse accepted. 0;
 * KVS_EUNAUTH for a wrong tag, i out of range or a layer ending past have;
 * KVS_EINTERNAL. Constant-time compare. */
int kvs_fetchseal_check(const uint8_t fkey[KVS_PUTMAC_KEY_LEN], const void *seal,
                        const uint8_t bkey[32], const uint8_t nonce[KVS_FETCHSEAL_NONCE_LEN],
                        uint32_t fmt, uint32_t i, const void *block, uint64_t have);

#endif
