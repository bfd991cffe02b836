/*
 * kvs_putmac.h — the message authentication code of a put over UCX, shared
 * by kvstashd (service/data_connect.c, which checks it) and libkvstash
 * (clients/c/xfer.c, which seals it).
 *
 * Why: with ucx_isolate, UCX runs in kvstash-xferd, a process that parses
 * every byte peers send. Code running there knows each open session's id and
 * token (it checks them), so it could start puts of its own under any open
 * session, or change a put's header or bytes in its bounce memory. Connect
 * therefore hands the worker a second per-session key over gRPC, which the
 * data plane process never sees; the worker seals every UCX put with it and
 * kvstashd checks the seal against the bytes it staged before it quantizes
 * and commits anything (docs/TRANSFER.md, "Sealed puts").
 *
 * The seal: AES-256-GMAC (NIST SP 800-38D, GCM with no plaintext) keyed with
 * the session's put key, IV = the put's sequence number (8 bytes, little
 * endian) followed by "KVP1", over the authenticated data
 *   "kvstash ucx put v1" (18 bytes) | u64 LE n | the metadata's first n
 *   bytes (the packed PutHeader, then the trailer's magic and sequence
 *   number) | the UCX key (32 bytes) | u64 LE payload length | payload.
 * The metadata sent is the packed PutHeader followed by a 28-byte trailer:
 *   "KVP1" | u64 LE sequence number | 16-byte tag.
 * Sequence numbers start at 1 and are never reused within a session (GMAC
 * needs a fresh IV per key); the server refuses a number it has seen (a
 * window of KVS_PUTMAC_WINDOW numbers below the highest), so a put the data
 * plane process recorded cannot be played again.
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
#define KVS_PUTMAC_TRAILER_LEN 28   /* magic 4, sequence number 8, tag 16 */
#define KVS_PUTMAC_UKEY_LEN    32   /* the UCX put's key field */
#define KVS_PUTMAC_WINDOW      1024 /* sequence numbers remembered below the highest */

/* Fills key with fresh random bytes (OpenSSL's RAND_bytes). 0 or KVS_EIO. */
int kvs_putmac_keygen(uint8_t key[KVS_PUTMAC_KEY_LEN]);

/* Seals a put: meta holds hdr_len bytes of header followed by
 * KVS_PUTMAC_TRAILER_LEN bytes of room, where the trailer is written.
 * seq >= 1, unique per key. 0, KVS_EINVAL (seq 0) or KVS_EINTERNAL
 * (OpenSSL failed). */
int kvs_putmac_seal(const uint8_t key[KVS_PUTMAC_KEY_LEN], uint64_t seq,
                    const uint8_t ukey[KVS_PUTMAC_UKEY_LEN], uint8_t *meta, size_t hdr_len,
                    const void *payload, uint64_t len);

/* The header length and sequence number of sealed metadata (untrusted:
 * nothing is verified yet). 0, or KVS_EUNAUTH when meta has no trailer (too
 * short, or not its magic) or the sequence number is 0. */
int kvs_putmac_parse(const void *meta, size_t meta_len, size_t *hdr_len, uint64_t *seq);

/* Checks sealed metadata against the UCX key and the payload that arrived:
 * 0 when the tag is the one key gives (compared in constant time),
 * KVS_EUNAUTH when it is not or meta has no trailer, KVS_EINTERNAL when
 * OpenSSL failed. */
int kvs_putmac_verify(const uint8_t key[KVS_PUTMAC_KEY_LEN],
                      const uint8_t ukey[KVS_PUTMAC_UKEY_LEN], const void *meta, size_t meta_len,
                      const void *payload, uint64_t len);

/* Sequence numbers a session has accepted: the highest, and a bitmap of the
 * KVS_PUTMAC_WINDOW numbers below it. Zero-initialise. */
typedef struct kvs_putmac_window {
    uint64_t top;
    uint64_t seen[KVS_PUTMAC_WINDOW / 64]; /* bit i: top - i was accepted */
} kvs_putmac_window;

/* Accepts seq once: 0 and remembers it, or KVS_EUNAUTH when it is 0, was
 * accepted before, or is KVS_PUTMAC_WINDOW or more below the highest. */
int kvs_putmac_window_accept(kvs_putmac_window *w, uint64_t seq);

#endif
