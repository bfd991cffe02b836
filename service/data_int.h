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

#include "codec.h"
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

/* A PutHeader checked for the caller, with its store reservation: what gRPC
 * Put (data_put.c) and the UCX put (data_connect.c) share. Every pointer is
 * owned (ns.desc's strings point at model and salt); kvs__put_hdr_release
 * frees them and aborts a reservation still held. */
typedef struct kvs__put_hdr {
    char *model, *salt;
    kvs__ns ns;
    kvs_key key, parent;
    int root;
    uint32_t *tokens;       /* block_tokens */
    uint8_t *schemes;       /* per layer */
    kvs_codec_layout lay;
    size_t layer_bytes;     /* raw bytes of one layer's K (as many of V) */
    uint64_t block_bytes;   /* encoded size */
    void *buf;              /* the staged block (block_bytes, counted in
                             * data->put_staged_bytes), block header written; or NULL */
    int committed;          /* kvs__put_commit ran (it counts its own outcome) */
    int present;            /* the block is cached already: nothing staged */
    float *k_err, *v_err;   /* per layer, filled by the encoder */
    float *k_ts, *v_ts;     /* per layer: the model rule's profile scales (lay's), or NULL */
} kvs__put_hdr;

/* Checks h completely for c's tenant (namespace, tokens, parent, index,
 * claimed key, scheme, layout; kvs_store_write_check: what no eviction could
 * make room for) and stages the encoded block in memory outside the store
 * (hd->buf; all Puts' staged bytes at most a quarter of the capacity the
 * server started with, beyond which Put answers RESOURCE_EXHAUSTED). Nothing
 * is reserved or evicted until kvs__put_commit, so a Put that never
 * completes costs the store nothing. 0: hd filled (hd->present, or staged),
 * or non-zero with the call failed — the gRPC status Put answers. hd must be
 * zeroed before; release it with kvs__put_hdr_release either way. */
int kvs__put_header(kvs__call *c, const Kvstash__V1__PutHeader *h, kvs__put_hdr *hd);
/* The staged, quantized and checked block into the store: write_begin (the
 * quota and capacity, evicting as a write does), copy, commit. The store's
 * status: 0, KVS_EEXIST (cached meanwhile), KVS_EPRECOND (the parent went),
 * KVS_ENOSPC (quota or capacity, nothing evictable), ... Counts aborted
 * outcomes; the caller counts stored and present ones. */
int kvs__put_commit(kvs_server *s, kvs__put_hdr *hd);
void kvs__put_hdr_release(kvs_data_stats *data, kvs__put_hdr *hd);

#endif /* KVS_DATA_INT_H */
