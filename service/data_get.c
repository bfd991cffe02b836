/*
 * data_get.c — Get (server streaming): blocks by key, each sent layer by
 * layer in the requested egress format (precision negotiation).
 *
 * Every key is checked before the first message (format, ownership), so a
 * bad request fails cleanly instead of mid-stream. One block at a time is
 * held by a store read reference, taken when its first layer is produced and
 * released after its last, so eviction or delete meanwhile cannot free bytes
 * being sent. The Lookup lease named in the request is released when the
 * stream ends, however it ends (done, error, client cancel).
 *
 * Fixed-size formats (1..4) are sent without a packing copy: each layer is
 * produced in a fresh buffer laid out as the encoded message — the packed
 * small fields and K's tag and length, K, V's tag and length, V — and handed
 * to gRPC as one slice that it frees when the bytes are written. K and V are
 * fields 5 and 6 (length-delimited); protobuf-c leaves them out of the packed
 * small fields (proto3, empty), and field order does not matter on the wire.
 * Stored format (0) points into the block, so it is packed (copied) while the
 * read reference is held, as before.
 */
#include "codec.h"
#include "data_int.h"
#include "leases.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct get_state {
    kvs__ns ns;             /* desc strings are not kept: only ids and shape */
    kvs_key *keys;
    size_t n;
    unsigned fmt;
    uint64_t lease_id;
    size_t bi;              /* block being sent */
    uint32_t layer;         /* its next layer */
    kvs_store_ref ref;
    int have_ref;
    size_t bytes;           /* K (= V) bytes per layer, formats 1..4 */
} get_state;

/* Room before K in a layer buffer for the packed small fields and K's tag and
 * length: key (34 bytes) + 2 uint32 + enum + 2 floats + bool < 80. */
#define GET_HEAD_ROOM 128

static size_t put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

static void get_cleanup(kvs__call *c)
{
    get_state *gs = c->stream;
    if (gs == NULL)
        return;
    if (gs->have_ref)
        kvs_store_read_release(c->srv->store, &gs->ref);
    /* The caller's own lease only (it may also have expired meanwhile). */
    if (gs->lease_id && c->tenant && kvs_lease_reg_take(c->srv->leases, gs->lease_id, c->tenant->id))
        (void)kvs_store_lease_release(c->srv->store, gs->lease_id);
    free(gs->keys);
    free(gs);
    c->stream = NULL;
}

static int get_start(kvs__call *c, const ProtobufCMessage *m)
{
    const Kvstash__V1__GetRequest *req = (const void *)m;
    get_state *gs = calloc(1, sizeof *gs);
    if (gs == NULL) {
        kvs__call_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return -1;
    }
    c->stream = gs;
    gs->lease_id = req->lease_id; /* released by cleanup even if the request is bad */
    if (kvs__ns_resolve(c, req->ns, &gs->ns) != 0)
        return -1;
    gs->ns.desc.model = gs->ns.desc.salt = NULL; /* borrowed from req: gone after start */
    kvs_config cfg;
    kvs__config_snapshot(c, &cfg);
    if ((int)req->format < 0 || req->format > 4) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "format: %d is not an EgressFormat",
                       (int)req->format);
        return -1;
    }
    gs->fmt = (unsigned)req->format;
    if (req->n_keys == 0) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "keys: empty");
        return -1;
    }
    if ((int64_t)req->n_keys > cfg.max_blocks_per_request) {
        kvs__call_fail(c, GRPC_STATUS_INVALID_ARGUMENT,
                       "keys: %zu keys; max_blocks_per_request is %lld", req->n_keys,
                       (long long)cfg.max_blocks_per_request);
        return -1;
    }
    gs->n = req->n_keys;
    if ((gs->keys = malloc(gs->n * sizeof *gs->keys)) == NULL) {
        kvs__call_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < gs->n; i++) {
        if (kvs__key_parse(c, &req->keys[i], "keys", i, &gs->keys[i]) != 0)
            return -1;
        if (!kvs__block_owned(c, &gs->ns, &gs->keys[i], NULL)) {
            kvs__call_fail(c, GRPC_STATUS_NOT_FOUND, "keys[%zu]: the block is not cached", i);
            return -1;
        }
    }
    gs->bytes = kvs_codec_egress_bytes(gs->ns.desc.block_tokens, gs->ns.desc.num_kv_heads,
                                       gs->ns.desc.head_dim, gs->fmt);
    return 0;
}

/* One layer in a fixed-size format as a single slice over a fresh buffer (the
 * file comment). 1 with c->out set, or 0 with the call failed. */
static int send_fixed_layer(kvs__call *c, get_state *gs, Kvstash__V1__GetResponse *r)
{
    uint8_t vtag[11];
    size_t vtl = 1 + put_varint(vtag + 1, gs->bytes);
    vtag[0] = (6u << 3) | 2u; /* field 6 (v), length-delimited */
    uint8_t *buf = malloc(GET_HEAD_ROOM + 2 * gs->bytes + vtl);
    if (buf == NULL) {
        kvs__call_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return 0;
    }
    uint8_t *kp = buf + GET_HEAD_ROOM, *vp = kp + gs->bytes + vtl;
    const void *k, *v;
    size_t kl, vl;
    char err[KVS_ERR_LEN] = "";
    int rc = kvs_codec_egress_layer(gs->ref.data, gs->ref.size, gs->layer, gs->fmt, kp, vp, &k,
                                    &kl, &v, &vl, &r->k_scale, &r->v_scale, err);
    if (rc == 0 && (k != kp || v != vp || kl != gs->bytes || vl != gs->bytes)) {
        snprintf(err, sizeof err, "egress produced %zu/%zu bytes outside the layer buffer", kl, vl);
        rc = KVS_EINTERNAL;
    }
    uint8_t ktag[11];
    size_t ktl = 1 + put_varint(ktag + 1, gs->bytes);
    ktag[0] = (5u << 3) | 2u; /* field 5 (k), length-delimited */
    size_t hl = rc == 0 ? protobuf_c_message_get_packed_size(&r->base) : 0;
    if (rc == 0 && hl + ktl > GET_HEAD_ROOM) {
        snprintf(err, sizeof err, "%zu bytes of small fields do not fit", hl);
        rc = KVS_EINTERNAL;
    }
    if (rc != 0) {
        free(buf);
        kvs__call_fail(c, rc == KVS_EFORMAT ? GRPC_STATUS_DATA_LOSS : GRPC_STATUS_INTERNAL,
                       "keys[%zu] layer %u: %s", gs->bi, gs->layer, err);
        return 0;
    }
    uint8_t *start = kp - ktl - hl;
    if (protobuf_c_message_pack(&r->base, start) != hl) {
        free(buf);
        kvs__call_fail(c, GRPC_STATUS_INTERNAL, "stream message packing failed");
        return 0;
    }
    memcpy(kp - ktl, ktag, ktl);
    memcpy(kp + gs->bytes, vtag, vtl);
    grpc_slice slice = grpc_slice_new_with_user_data(start, (size_t)(vp + gs->bytes - start), free,
                                                     buf);
    if (c->out)
        grpc_byte_buffer_destroy(c->out);
    c->out = grpc_raw_byte_buffer_create(&slice, 1);
    grpc_slice_unref(slice); /* the byte buffer holds it; gRPC frees buf when done */
    return 1;
}

static int get_next(kvs__call *c)
{
    get_state *gs = c->stream;
    kvs_server *s = c->srv;
    char err[KVS_ERR_LEN] = "";
    if (!gs->have_ref) {
        if (gs->bi == gs->n)
            return 0; /* done, status OK */
        int rc = kvs_store_read(s->store, &gs->keys[gs->bi], &gs->ref);
        if (rc == KVS_ENOTFOUND) {
            kvs__call_fail(c, GRPC_STATUS_NOT_FOUND,
                           "keys[%zu]: the block was evicted or deleted before it was sent "
                           "(hold a Lookup lease to prevent that)",
                           gs->bi);
            return 0;
        }
        if (rc != 0) {
            kvs__call_fail(c, rc == KVS_EFORMAT ? GRPC_STATUS_DATA_LOSS : kvs__grpc_from_status(rc),
                           "keys[%zu]: cannot read the block: %s", gs->bi, kvs_strerror(rc));
            return 0;
        }
        gs->have_ref = 1;
        gs->layer = 0;
        kvs_codec_info ci;
        if (gs->ref.tenant != gs->ns.tenant->id || gs->ref.ns_id != gs->ns.ns_id) {
            kvs__call_fail(c, GRPC_STATUS_NOT_FOUND, "keys[%zu]: the block is not cached",
                           gs->bi);
            return 0;
        }
        if (kvs_codec_block_info(gs->ref.data, gs->ref.size, &ci, err) != 0 ||
            ci.layers != gs->ns.desc.num_layers || ci.heads != gs->ns.desc.num_kv_heads ||
            ci.head_dim != gs->ns.desc.head_dim || ci.block_tokens != gs->ns.desc.block_tokens) {
            kvs__call_fail(c, GRPC_STATUS_DATA_LOSS,
                           "keys[%zu]: the stored block does not match its namespace %s", gs->bi,
                           err);
            return 0;
        }
    }
    Kvstash__V1__GetResponse r = KVSTASH__V1__GET_RESPONSE__INIT;
    r.key.data = gs->keys[gs->bi].b;
    r.key.len = KVS_KEY_LEN;
    r.block_index = (uint32_t)gs->bi;
    r.layer = gs->layer;
    r.format = (Kvstash__V1__EgressFormat)gs->fmt;
    r.last_layer = gs->layer + 1 == gs->ns.desc.num_layers;
    size_t kl, vl;
    if (gs->fmt != 0) {
        if (!send_fixed_layer(c, gs, &r))
            return 0;
        kl = vl = gs->bytes;
    } else {
        const void *k, *v;
        int rc = kvs_codec_egress_layer(gs->ref.data, gs->ref.size, gs->layer, gs->fmt, NULL, NULL,
                                        &k, &kl, &v, &vl, &r.k_scale, &r.v_scale, err);
        if (rc != 0) {
            kvs__call_fail(c, rc == KVS_EFORMAT ? GRPC_STATUS_DATA_LOSS : GRPC_STATUS_INTERNAL,
                           "keys[%zu] layer %u: %s", gs->bi, gs->layer, err);
            return 0;
        }
        r.k.data = (uint8_t *)k;
        r.k.len = kl;
        r.v.data = (uint8_t *)v;
        r.v.len = vl;
        if (!kvs__call_stream_msg(c, &r.base)) /* packs (copies) now: the ref may go after */
            return 0;
    }
    atomic_fetch_add_explicit(&s->data.egress_bytes, kl + vl, memory_order_relaxed);
    if (++gs->layer == gs->ns.desc.num_layers) {
        kvs_store_read_release(s->store, &gs->ref);
        gs->have_ref = 0;
        gs->bi++;
        atomic_fetch_add_explicit(&s->data.get_blocks, 1, memory_order_relaxed);
    }
    return 1;
}

const kvs__stream_ops kvs__get_ops = {
    .start = get_start,
    .next = get_next,
    .cleanup = get_cleanup,
};
