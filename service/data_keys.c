/*
 * data_keys.c — the unary data RPCs: Lookup (longest cached prefix with a read
 * lease), Delete, Pin and Unpin.
 *
 * Lookup computes the chain keys itself from the tenant's name and secret
 * (store/keys.h), so a client never needs the secret; keys a client sends
 * along are only compared. Key-addressed RPCs check every key first (format,
 * ownership) and only then change anything, so a request naming a key that is
 * not the caller's changes nothing.
 */
#include "codec.h"
#include "data_int.h"
#include "leases.h"
#include "trace_rec.h"

#include <stdlib.h>
#include <string.h>

#define MAX_LEASE_MS 86400000u

/* The start Delete, Pin and Unpin share: resolves the request's namespace into
 * *ns, then checks its n key count against max_blocks_per_request (and refuses
 * an empty list unless may_be_empty). Fails the call and returns -1 on error. */
static int keyed_request(kvs__call *c, const Kvstash__V1__Namespace *pb, size_t n, int may_be_empty,
                         kvs__ns *ns)
{
    kvs_config cfg;
    kvs__config_snapshot(c, &cfg);
    if (kvs__ns_resolve(c, pb, ns) != 0)
        return -1;
    if (n == 0 && !may_be_empty) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "keys: empty");
        return -1;
    }
    if ((int64_t)n > cfg.max_blocks_per_request) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT,
                       "keys: %zu keys; max_blocks_per_request is %lld", n,
                       (long long)cfg.max_blocks_per_request);
        return -1;
    }
    return 0;
}

/* Parses every key and checks that each is the caller's. *out is malloc'd. */
static int owned_keys(kvs__call *c, const kvs__ns *ns, ProtobufCBinaryData *keys, size_t n,
                      kvs_key **out)
{
    *out = malloc(n * sizeof **out);
    if (*out == NULL) {
        kvs__call_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (kvs__key_parse(c, &keys[i], "keys", i, &(*out)[i]) != 0)
            goto fail;
        if (!kvs__block_owned(c, ns, &(*out)[i], NULL)) {
            char hex[2 * KVS_KEY_LEN + 1];
            kvs__call_fail(c, GRPC_STATUS_NOT_FOUND, "keys[%zu]: block %.16s... is not cached", i,
                           kvs_key_hex(&(*out)[i], hex));
            goto fail;
        }
    }
    return 0;
fail:
    free(*out);
    *out = NULL;
    return -1;
}

/* ---- Lookup ---------------------------------------------------------------- */

/* Fills bi from what the store's lookup copied under its lock (m): size,
 * tier, and the scheme the block's header records, read from the peeked
 * header bytes (no read reference). A block on the SSD tier has no peek (its
 * file is not read for a Lookup), so its scheme stays SCHEME_UNSPECIFIED. */
static void block_info(const kvs_store_match *m, uint32_t index, Kvstash__V1__BlockInfo *bi)
{
    kvstash__v1__block_info__init(bi);
    bi->index = index;
    bi->stored_bytes = m->size;
    bi->tier = (Kvstash__V1__Tier)m->tier;
    unsigned scheme;
    if (m->peek_len && kvs_codec_peek_scheme(m->peek, m->peek_len, &scheme, NULL) == 0)
        bi->scheme = (Kvstash__V1__Scheme)scheme;
}

void kvs__do_lookup(kvs__call *c, const ProtobufCMessage *m)
{
    const Kvstash__V1__LookupRequest *req = (const void *)m;
    kvs_server *s = c->srv;
    kvs__ns ns;
    if (kvs__ns_resolve(c, req->ns, &ns) != 0)
        return;
    /* The two settings Lookup reads, not a copy of the whole config (several
     * KiB of strings): this is the hottest RPC. */
    pthread_rwlock_rdlock(&s->cfg_lock);
    int64_t max_blocks = s->cfg.max_blocks_per_request;
    int64_t default_lease_ms = s->cfg.lease_ms;
    int64_t lease_blocks = s->cfg.lease_blocks_per_tenant;
    pthread_rwlock_unlock(&s->cfg_lock);
    uint32_t bt = ns.desc.block_tokens;
    size_t nblocks = req->n_tokens / bt;
    if ((int64_t)nblocks > max_blocks) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT,
                       "tokens: %zu whole blocks; max_blocks_per_request is %lld", nblocks,
                       (long long)max_blocks);
        return;
    }
    if (req->n_keys > nblocks) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT,
                       "keys: %zu keys for %zu whole blocks of tokens", req->n_keys, nblocks);
        return;
    }
    if (req->lease_ms > MAX_LEASE_MS) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "lease_ms: %u is above 24 h",
                       req->lease_ms);
        return;
    }
    uint32_t lease_ms = req->lease_ms ? req->lease_ms : (uint32_t)default_lease_ms;
    Kvstash__V1__LookupResponse resp = KVSTASH__V1__LOOKUP_RESPONSE__INIT;
    if (nblocks == 0) {
        kvs__call_reply(c, &resp.base);
        return;
    }
    kvs_key *keys = malloc(nblocks * sizeof *keys);
    Kvstash__V1__BlockInfo *bis = calloc(nblocks, sizeof *bis);
    Kvstash__V1__BlockInfo **bip = calloc(nblocks, sizeof *bip);
    kvs_store_match *mt = malloc(nblocks * sizeof *mt);
    if (keys == NULL || bis == NULL || bip == NULL || mt == NULL) {
        kvs__call_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    int rc = kvs_key_chain(&ns.desc, ns.tenant->secret, ns.tenant->secret_len, req->tokens,
                           nblocks, keys);
    if (rc != 0) {
        kvs__call_fail(c, kvs__grpc_from_status(rc), "tokens: cannot compute chain keys: %s",
                       kvs_strerror(rc));
        goto out;
    }
    for (size_t i = 0; i < req->n_keys; i++) {
        kvs_key k;
        if (kvs__key_parse(c, &req->keys[i], "keys", i, &k) != 0)
            goto out;
        if (memcmp(k.b, keys[i].b, KVS_KEY_LEN) != 0) {
            kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT,
                           "keys[%zu]: does not match the chain key of the tokens (KEYSPEC)", i);
            goto out;
        }
    }
    size_t matched = 0;
    uint64_t lease_id = 0;
    rc = kvs_store_lookup_leased_info(s->store, ns.tenant->id, keys, req->tokens, bt, nblocks,
                                      lease_ms, mt, &matched, &lease_id);
    if (rc != 0) {
        kvs__call_fail(c, kvs__grpc_from_status(rc), "lookup failed: %s", kvs_strerror(rc));
        goto out;
    }
    uint64_t held = 0;
    rc = lease_id == 0 ? 0
                       : kvs_lease_reg_add(s->leases, lease_id, ns.tenant->id, lease_ms,
                                           (uint32_t)matched, (uint64_t)lease_blocks, &held);
    if (rc != 0) {
        (void)kvs_store_lease_release(s->store, lease_id);
        if (rc == KVS_ENOSPC)
            kvs__call_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED,
                           "lease: this tenant's leases already hold %llu blocks, and %zu more "
                           "would pass lease_blocks_per_tenant (%lld): end leases (Unpin, or a "
                           "Get with the lease) or wait for them to expire",
                           (unsigned long long)held, matched, (long long)lease_blocks);
        else
            kvs__call_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory recording the lease");
        goto out;
    }
    for (size_t i = 0; i < matched; i++) {
        block_info(&mt[i], (uint32_t)i, &bis[i]);
        bis[i].key.data = keys[i].b;
        bis[i].key.len = KVS_KEY_LEN;
        bip[i] = &bis[i];
    }
    /* --record-trace (trace_rec.h): every full block of the prompt, hit or not. */
    _Static_assert(sizeof(kvs_key) == KVS_TRACE_KEY_LEN, "kvs_key is the 32 key bytes");
    if (s->trace)
        kvs_trace_rec_lookup(s->trace, (const uint8_t(*)[KVS_TRACE_KEY_LEN])keys, nblocks,
                             req->n_tokens);
    kvs_data_stats_lookup(&s->data, nblocks, matched, bt);
    resp.matched_blocks = (uint32_t)matched;
    resp.matched_tokens = (uint32_t)(matched * bt);
    resp.blocks = bip;
    resp.n_blocks = matched;
    resp.lease_id = lease_id;
    resp.lease_ms = matched ? lease_ms : 0;
    kvs__call_reply(c, &resp.base);
out:
    free(keys);
    free(bis);
    free(bip);
    free(mt);
}

/* ---- Delete ------------------------------------------------------------------ */

void kvs__do_delete(kvs__call *c, const ProtobufCMessage *m)
{
    const Kvstash__V1__DeleteRequest *req = (const void *)m;
    kvs_server *s = c->srv;
    kvs__ns ns;
    if (keyed_request(c, req->ns, req->n_keys, 0, &ns) != 0)
        return;
    kvs_key *keys;
    if (owned_keys(c, &ns, req->keys, req->n_keys, &keys) != 0)
        return;
    uint32_t deleted = 0;
    for (size_t i = 0; i < req->n_keys; i++) {
        kvs_store_stats before, after;
        kvs_store_get_stats(s->store, &before);
        int rc = kvs_store_delete(s->store, &keys[i], req->subtree);
        kvs_store_get_stats(s->store, &after);
        if (rc == KVS_ENOTFOUND && req->subtree)
            continue; /* went with an earlier key's subtree */
        if (rc == KVS_EPRECOND) {
            kvs__call_fail(c, GRPC_STATUS_FAILED_PRECONDITION,
                           "keys[%zu]: the block has cached children (set subtree to delete "
                           "them too); %u deleted before it",
                           i, deleted);
            goto out;
        }
        if (rc == KVS_EPERM) {
            kvs__call_fail(c, GRPC_STATUS_FAILED_PRECONDITION,
                           "keys[%zu]: the block (or a descendant) is pinned or leased; %u "
                           "deleted before it",
                           i, deleted);
            goto out;
        }
        if (rc != 0) {
            kvs__call_fail(c, kvs__grpc_from_status(rc), "keys[%zu]: %s", i, kvs_strerror(rc));
            goto out;
        }
        /* Blocks removed by this call (the block, and its subtree). Other
         * threads' evictions between the two reads could inflate it; the
         * store's own count is exact. */
        uint64_t d = after.evictions[KVS_EVICT_DELETE] - before.evictions[KVS_EVICT_DELETE] +
                     after.evictions[KVS_EVICT_SUBTREE] - before.evictions[KVS_EVICT_SUBTREE];
        deleted += d ? (uint32_t)d : 1;
    }
    Kvstash__V1__DeleteResponse resp = KVSTASH__V1__DELETE_RESPONSE__INIT;
    resp.deleted = deleted;
    kvs__call_reply(c, &resp.base);
out:
    free(keys);
}

/* ---- Pin / Unpin ----------------------------------------------------------- */

void kvs__do_pin(kvs__call *c, const ProtobufCMessage *m)
{
    const Kvstash__V1__PinRequest *req = (const void *)m;
    kvs_server *s = c->srv;
    kvs__ns ns;
    if (keyed_request(c, req->ns, req->n_keys, 0, &ns) != 0)
        return;
    if (req->priority < -128 || req->priority > 127) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "priority: %d is outside -128..127",
                       req->priority);
        return;
    }
    if (req->ttl_ms > MAX_LEASE_MS) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "ttl_ms: %u is above 24 h", req->ttl_ms);
        return;
    }
    kvs_key *keys;
    if (owned_keys(c, &ns, req->keys, req->n_keys, &keys) != 0)
        return;
    uint32_t pinned = 0;
    for (size_t i = 0; i < req->n_keys; i++) {
        int rc = kvs_store_pin_ex(s->store, &keys[i], (int8_t)req->priority, req->ttl_ms);
        if (rc != 0) {
            kvs__call_fail(c, kvs__grpc_from_status(rc), "keys[%zu]: %s; %u pinned before it", i,
                           kvs_strerror(rc), pinned);
            goto out;
        }
        pinned++;
    }
    Kvstash__V1__PinResponse resp = KVSTASH__V1__PIN_RESPONSE__INIT;
    resp.pinned = pinned;
    kvs__call_reply(c, &resp.base);
out:
    free(keys);
}

void kvs__do_unpin(kvs__call *c, const ProtobufCMessage *m)
{
    const Kvstash__V1__UnpinRequest *req = (const void *)m;
    kvs_server *s = c->srv;
    kvs__ns ns;
    if (keyed_request(c, req->ns, req->n_keys, 1, &ns) != 0)
        return;
    if (req->n_keys == 0 && req->lease_id == 0) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "keys: empty, and no lease_id");
        return;
    }
    kvs_key *keys = NULL;
    if (req->n_keys && owned_keys(c, &ns, req->keys, req->n_keys, &keys) != 0)
        return;
    uint32_t unpinned = 0;
    if (req->lease_id != 0) {
        /* Only the caller's own lease: another tenant's id is as unknown as an expired one. */
        int rc = kvs_lease_reg_take(s->leases, req->lease_id, ns.tenant->id)
                     ? kvs_store_lease_release(s->store, req->lease_id)
                     : KVS_ENOTFOUND;
        if (rc != 0) {
            kvs__call_fail(c, rc == KVS_ENOTFOUND ? GRPC_STATUS_NOT_FOUND
                                                  : kvs__grpc_from_status(rc),
                           "lease_id: %llu is unknown or expired",
                           (unsigned long long)req->lease_id);
            goto out;
        }
    }
    for (size_t i = 0; i < req->n_keys; i++) {
        int rc = kvs_store_unpin(s->store, &keys[i]);
        if (rc == KVS_EPRECOND) {
            kvs__call_fail(c, GRPC_STATUS_FAILED_PRECONDITION,
                           "keys[%zu]: the block is not pinned; %u unpinned before it", i,
                           unpinned);
            goto out;
        }
        if (rc != 0) {
            kvs__call_fail(c, kvs__grpc_from_status(rc), "keys[%zu]: %s", i, kvs_strerror(rc));
            goto out;
        }
        unpinned++;
    }
    Kvstash__V1__UnpinResponse resp = KVSTASH__V1__UNPIN_RESPONSE__INIT;
    resp.unpinned = unpinned;
    kvs__call_reply(c, &resp.base);
out:
    free(keys);
}
