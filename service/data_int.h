/*
 * data_int.h — what the data-path handlers (data_*.c) share: resolving a
 * request's namespace for the calling tenant, parsing keys, and checking that
 * a cached block belongs to the caller.
 *
 * Isolation (DESIGN §2, issue 5): chain keys commit to the tenant's name and
 * secret, so two tenants with the same prompt get different keys; on top of
 * that every key-addressed RPC (Get, Delete, Pin, Unpin) checks the block's
 * tenant and namespace id in the store and answers NOT_FOUND for a block that
 * is not the caller's, exactly as for one that does not exist.
 *
 * Includes store headers; never include it together with kernel headers
 * (both define kvs_dtype — see codec.h).
 */
#ifndef KVS_DATA_INT_H
#define KVS_DATA_INT_H

#include "kvstash/v1/kvstash.pb-c.h"
#include "server_internal.h"
#include "store.h"

typedef struct kvs__ns {
    kvs_ns_desc desc;          /* strings borrowed from the request / tenant */
    uint32_t ns_id;            /* store namespace id: hash of the descriptor */
    const kvs_tenant *tenant;
} kvs__ns;

/* Validates the request's namespace and the caller's right to its model.
 * 0, or non-zero with the call failed (INVALID_ARGUMENT naming the field,
 * PERMISSION_DENIED for a model the tenant may not use). */
int kvs__ns_resolve(kvs__call *c, const Kvstash__V1__Namespace *pb, kvs__ns *out);

/* A 32-byte key from a bytes field; field/i name it in the error. 0 or non-zero (call failed). */
int kvs__key_parse(kvs__call *c, const ProtobufCBinaryData *b, const char *field, size_t i,
                   kvs_key *out);

/* Is key cached for this caller's tenant and namespace? 1 yes (info filled
 * when not NULL), 0 no. */
int kvs__block_owned(kvs__call *c, const kvs__ns *ns, const kvs_key *key, kvs_store_info *info);

/* The server's config, copied under its lock. */
void kvs__config_snapshot(kvs__call *c, kvs_config *out);

#endif /* KVS_DATA_INT_H */
