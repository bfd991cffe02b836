/*
 * data.c — libkvstash's data path: Lookup, Put (client streaming), Get (server
 * streaming, and into caller buffers), Delete, Pin, Unpin.
 *
 * The idea: unary RPCs go through kvs__call_pb like the rest of the library
 * (Lookup through its slice twin, kvs__call_slice, with its request and
 * reply code shared with kvs_client_lookup_async in async.c);
 * the two streaming RPCs drive their own call on a private pluck queue. A
 * streaming call posts all its receive ops (for Put: the reply and the
 * status; for Get: the status) in one batch at the start, then runs one send
 * or one RECV_MESSAGE batch at a time (gRPC allows one op of each type in
 * flight), so the server's status is read however the stream ends — an early
 * refusal of a Put's header arrives as that status even while layers are
 * still being sent.
 *
 * Invariants: every gRPC object a call makes is released before it returns;
 * a Get callback sees the layers of each block in order, block by block, each
 * one checked against the request (index, layer, format, byte count) first,
 * and a reply that breaks the protocol cancels the call (KVS_EPROTO). Stored
 * tiles (KVS_EGRESS_STORED) are verified here, checksums included, before the
 * callback sees them (DESIGN §3: the client checks before the KV is used); a
 * bad tile cancels the call with KVS_EFORMAT.
 *
 * kvs_client_get_into unpacks K and V straight into the caller's buffers:
 * protobuf-c allocates each bytes field through an allocator, and the one used
 * here (dst_alloc) answers the first two allocations of exactly one layer's
 * size with the expected layer's K and V buffers (the message and its key are
 * far smaller; sizes under DST_MIN are never aliased). protobuf-c still parses
 * and checks the message; afterwards place_layer moves whatever did not land
 * where it belongs (another field order, repeated or unknown fields of that
 * size), so the result never depends on the encoder's choices.
 *
 * Client-side decode (kvstash.h, kvs_decode_at; on unless the client asked for
 * KVS_DECODE_SERVER): a Get in fp16, bf16 or fp32 asks the server for the
 * stored tiles, half the bytes of fp16 for an 8-bit block and no dequantizing
 * on the shared server, and makes the format here with the kernels library
 * (kvs_block_decode_run and the fast CPU dequantizer, the very code the server
 * renders with: the same bytes). Those replies are not unpacked by protobuf-c,
 * which would copy K and V: view_get_reply parses the message where it lies
 * (the received slice, or the gather buffer when it came in several) and the
 * tiles are decoded from there, straight into get_into's buffers; every tile
 * is checked (checksum included) before it is decoded, and a bad one ends the
 * call with KVS_EFORMAT, as for the stored format.
 */
#include "client_int.h"

#include "kv_block.h"
#include "kvq.h"
#include "kvq_cpu.h"
#include "kvstash/v1/kvstash.pb-c.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/support/time.h>

#include <stdlib.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------ */

static size_t dtype_bytes(unsigned dtype)
{
    return dtype == 1 || dtype == 2 ? 2 : dtype == 3 ? 4 : 0;
}

size_t kvs_egress_layer_bytes(const kvs_ns *ns, kvs_egress fmt)
{
    if (ns == NULL)
        return 0;
    size_t n = (size_t)ns->block_tokens * ns->num_kv_heads * ns->head_dim;
    switch (fmt) {
    case KVS_EGRESS_FP16:
    case KVS_EGRESS_BF16:
        return n * 2;
    case KVS_EGRESS_FP32:
        return n * 4;
    case KVS_EGRESS_FP8_PER_TENSOR:
        return n;
    default:
        return 0;
    }
}

static int ns_to_pb(const kvs_ns *ns, pb_ns *out, const char *fn, char *err)
{
    if (ns == NULL || ns->model == NULL || ns->model[0] == '\0') {
        kvs__set_err(err, "%s: ns and ns->model are required", fn);
        return KVS_EINVAL;
    }
    kvstash__v1__namespace__init(&out->ns);
    kvstash__v1__layout__init(&out->layout);
    out->ns.model = (char *)ns->model;
    out->ns.salt = (char *)(ns->salt ? ns->salt : "");
    out->layout.num_layers = ns->num_layers;
    out->layout.num_kv_heads = ns->num_kv_heads;
    out->layout.head_dim = ns->head_dim;
    out->layout.block_tokens = ns->block_tokens;
    out->layout.dtype = (Kvstash__V1__Dtype)ns->dtype;
    out->ns.layout = &out->layout;
    return 0;
}

int kvs__put_header(const kvs_put_args *a, kvs__pb_put *out, char *err)
{
    int rc = ns_to_pb(a->ns, &out->pns, "kvs_client_put", err);
    if (rc != 0)
        return rc;
    const kvs_ns *ns = a->ns;
    size_t eb = dtype_bytes(ns->dtype);
    if (eb == 0 || ns->num_layers == 0 || ns->block_tokens == 0) {
        kvs__set_err(err,
                     "kvs_client_put: ns->dtype must be 1..3, num_layers and block_tokens > 0");
        return KVS_EINVAL;
    }
    for (unsigned l = 0; l < ns->num_layers; l++) {
        if (a->k[l] == NULL || a->v[l] == NULL) {
            kvs__set_err(err, "kvs_client_put: k[%u] or v[%u] is NULL", l, l);
            return KVS_EINVAL;
        }
    }
    out->layer_bytes = (size_t)ns->block_tokens * ns->num_kv_heads * ns->head_dim * eb;
    kvstash__v1__put_header__init(&out->hdr);
    out->hdr.ns = &out->pns.ns;
    if (a->parent_key) {
        out->hdr.parent_key.data = (uint8_t *)a->parent_key;
        out->hdr.parent_key.len = KVS_CLIENT_KEY_LEN;
    }
    out->hdr.tokens = (uint32_t *)a->tokens;
    out->hdr.n_tokens = ns->block_tokens;
    out->hdr.scheme = (Kvstash__V1__Scheme)a->scheme;
    out->hdr.index = a->index;
    return 0;
}

/* n_keys keys as protobuf bytes pointing at the caller's arrays. */
static ProtobufCBinaryData *keys_to_pb(const unsigned char (*keys)[KVS_CLIENT_KEY_LEN], size_t n)
{
    ProtobufCBinaryData *b = calloc(n ? n : 1, sizeof *b);
    if (b == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        b[i].data = (uint8_t *)keys[i];
        b[i].len = KVS_CLIENT_KEY_LEN;
    }
    return b;
}

static grpc_byte_buffer *pack_bb(const ProtobufCMessage *m)
{
    size_t len = protobuf_c_message_get_packed_size(m);
    grpc_slice s = grpc_slice_malloc(len);
    protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

static ProtobufCMessage *unpack_bb_with(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *d,
                                        ProtobufCAllocator *al)
{
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, bb))
        return NULL;
    grpc_slice all = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    ProtobufCMessage *m =
        protobuf_c_message_unpack(d, al, GRPC_SLICE_LENGTH(all), GRPC_SLICE_START_PTR(all));
    grpc_slice_unref(all);
    return m;
}

static ProtobufCMessage *unpack_bb(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *d)
{
    return unpack_bb_with(bb, d, NULL);
}

/* A grow-only buffer a Get reuses to make each reply contiguous for protobuf-c. */
typedef struct flat_buf {
    uint8_t *p;
    size_t cap;
} flat_buf;

static int flat_append(flat_buf *fb, size_t *n, grpc_slice s)
{
    size_t l = GRPC_SLICE_LENGTH(s);
    if (*n + l > fb->cap) {
        size_t cap = fb->cap * 2 > *n + l ? fb->cap * 2 : *n + l;
        uint8_t *p = realloc(fb->p, cap);
        if (p == NULL)
            return -1;
        fb->p = p;
        fb->cap = cap;
    }
    memcpy(fb->p + *n, GRPC_SLICE_START_PTR(s), l);
    *n += l;
    return 0;
}

/* A contiguous view of a received message: one slice is used in place and
 * kept in *held (the caller unrefs it once done with *p); several are gathered
 * into fb (no allocation once fb is large enough). 0, or -1 (bad buffer, out of
 * memory). *p may point into *held itself (a slice of a few bytes is inlined:
 * its bytes are inside the grpc_slice struct), so *held must stay where it is
 * while *p is used. */
static int bb_view(grpc_byte_buffer *bb, flat_buf *fb, grpc_slice *held, const uint8_t **p,
                   size_t *n)
{
    static const uint8_t empty[1];
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, bb))
        return -1;
    int ok = 1;
    grpc_slice first, s;
    *held = grpc_empty_slice();
    *p = empty;
    *n = 0;
    if (!grpc_byte_buffer_reader_next(&r, &first)) {
        /* empty message */
    } else if (!grpc_byte_buffer_reader_next(&r, &s)) {
        *held = first;
        *p = GRPC_SLICE_START_PTR(*held); /* not first's: an inlined slice's bytes are in it */
        *n = GRPC_SLICE_LENGTH(first);
    } else {
        ok = flat_append(fb, n, first) == 0;
        grpc_slice_unref(first);
        do {
            ok = ok && flat_append(fb, n, s) == 0;
            grpc_slice_unref(s);
        } while (grpc_byte_buffer_reader_next(&r, &s));
        *p = fb->p;
    }
    grpc_byte_buffer_reader_destroy(&r);
    return ok ? 0 : -1;
}

/* unpack_bb_with through bb_view: no copy for a one-slice reply. */
static ProtobufCMessage *unpack_bb_flat(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *d,
                                        ProtobufCAllocator *al, flat_buf *fb)
{
    grpc_slice held;
    const uint8_t *p;
    size_t n;
    if (bb_view(bb, fb, &held, &p, &n) != 0)
        return NULL;
    ProtobufCMessage *m = protobuf_c_message_unpack(d, al, n, p);
    grpc_slice_unref(held);
    return m;
}

/* One varint at *p (< end), advancing *p. 0, or -1 when it runs past end or
 * over 10 bytes. */
static int read_varint(const uint8_t **p, const uint8_t *end, uint64_t *out)
{
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 70 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

/* A GetResponse parsed in place: m's k, v and key point into p[0..n), which
 * must outlive m (the stored-format path decodes from the received bytes; a
 * protobuf-c unpack would copy K and V first). Proto3 rules: a field seen
 * twice keeps the last value, unknown fields are skipped; a known field of
 * the wrong wire type, a group or a truncated field is an error. 0 or -1. */
static int view_get_reply(const uint8_t *p, size_t n, Kvstash__V1__GetResponse *m)
{
    /* wire type of fields 1..9: key, block_index, layer, format, k, v,
     * k_scale, v_scale, last_layer */
    static const unsigned char wire[10] = {9, 2, 0, 0, 0, 2, 2, 5, 5, 0};
    kvstash__v1__get_response__init(m);
    const uint8_t *end = p + n;
    while (p < end) {
        uint64_t tag, v;
        if (read_varint(&p, end, &tag) != 0 || tag >> 3 == 0)
            return -1;
        uint64_t field = tag >> 3;
        unsigned wt = (unsigned)(tag & 7);
        if (field < 10 && wire[field] != wt)
            return -1;
        switch (wt) {
        case 0:
            if (read_varint(&p, end, &v) != 0)
                return -1;
            if (field == 2)
                m->block_index = (uint32_t)v;
            else if (field == 3)
                m->layer = (uint32_t)v;
            else if (field == 4)
                m->format = (Kvstash__V1__EgressFormat)(int32_t)v;
            else if (field == 9)
                m->last_layer = v != 0;
            break;
        case 1:
            if (end - p < 8)
                return -1;
            p += 8;
            break;
        case 2: {
            if (read_varint(&p, end, &v) != 0 || v > (uint64_t)(end - p))
                return -1;
            ProtobufCBinaryData b = {(size_t)v, (uint8_t *)p};
            if (field == 1)
                m->key = b;
            else if (field == 5)
                m->k = b;
            else if (field == 6)
                m->v = b;
            p += v;
            break;
        }
        case 5:
            if (end - p < 4)
                return -1;
            if (field == 7)
                memcpy(&m->k_scale, p, 4);
            else if (field == 8)
                memcpy(&m->v_scale, p, 4);
            p += 4;
            break;
        default:
            return -1;
        }
    }
    return 0;
}

/* view_get_reply over a received message (bb_view: *held keeps a one-slice
 * reply, which the caller unrefs after using m). Returns m, or NULL. */
static Kvstash__V1__GetResponse *view_bb(grpc_byte_buffer *bb, Kvstash__V1__GetResponse *m,
                                         flat_buf *fb, grpc_slice *held)
{
    const uint8_t *p;
    size_t n;
    if (bb_view(bb, fb, held, &p, &n) != 0)
        return NULL;
    return view_get_reply(p, n, m) == 0 ? m : NULL;
}

/* The Get-into allocator (file comment): p[0], p[1] for the first two
 * allocations of exactly size bytes, malloc otherwise; never frees p[]. */
#define DST_MIN 4096
typedef struct dst_alloc {
    size_t size;
    void *p[2];
    unsigned used;
} dst_alloc;

static void *dst_alloc_fn(void *data, size_t size)
{
    dst_alloc *d = data;
    if (size == d->size && d->used < 2)
        return d->p[d->used++];
    return malloc(size);
}

static void dst_free_fn(void *data, void *p)
{
    dst_alloc *d = data;
    if (p != NULL && p != d->p[0] && p != d->p[1])
        free(p);
}

/* Runs one batch and waits for it; returns its success flag. */
static int run_batch(grpc_call *call, grpc_completion_queue *cq, grpc_op *ops, size_t n, void *tag)
{
    if (grpc_call_start_batch(call, ops, n, tag, NULL) != GRPC_CALL_OK)
        return 0;
    grpc_event ev = grpc_completion_queue_pluck(cq, tag, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    return ev.type == GRPC_OP_COMPLETE && ev.success;
}

static void cq_destroy(grpc_completion_queue *cq)
{
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
}

/* K (or V) of one stored layer: num_kv_heads tiles back to back, each passing
 * kvs_tile_check (checksum included) with the namespace's T, D and kind. */
static int check_tiles(const uint8_t *p, size_t len, const kvs_ns *ns, unsigned kind,
                       const char *what, char *err)
{
    for (unsigned h = 0; h < ns->num_kv_heads; h++) {
        kvs_tile_hdr hdr;
        char e[KVS_ERR_LEN];
        if (kvs_tile_check(p, len, &hdr, e) != 0) {
            kvs__set_err(err, "Get: stored %s tile of head %u: %s", what, h, e);
            return KVS_EFORMAT;
        }
        if (hdr.kind != kind || hdr.tokens != ns->block_tokens || hdr.dim != ns->head_dim) {
            kvs__set_err(err, "Get: stored %s tile of head %u is %ux%u of kind %u", what, h,
                         (unsigned)hdr.tokens, (unsigned)hdr.dim, (unsigned)hdr.kind);
            return KVS_EFORMAT;
        }
        size_t t = sizeof hdr + hdr.payload_bytes;
        p += t;
        len -= t;
    }
    if (len != 0) {
        kvs__set_err(err, "Get: %zu bytes after the stored %s tiles", len, what);
        return KVS_EFORMAT;
    }
    return 0;
}

/* A stored layer bound for the caller's buffers (get_into with client
 * decode): every tile checked in full, checksum included, before any is
 * decoded, since the decode writes each head as it goes; a bad tile then
 * leaves those buffers as they were (kvstash.h kvs_client_fetch_into), and
 * the decode need not hash the tiles again. 0 or KVS_EFORMAT, err naming the
 * block and layer as the decode's own message does. */
static int check_layer(const Kvstash__V1__GetResponse *gr, const kvs_ns *ns, char *err)
{
    char e[KVS_ERR_LEN] = "";
    if (check_tiles(gr->k.data, gr->k.len, ns, 0, "K", e) == 0 &&
        check_tiles(gr->v.data, gr->v.len, ns, 1, "V", e) == 0)
        return 0;
    kvs__set_err(err, "Get: block %u layer %u: %s", gr->block_index, gr->layer,
                 strncmp(e, "Get: ", 5) == 0 ? e + 5 : e);
    return KVS_EFORMAT;
}

/* kvs__decode_stored_layer (client_int.h): the bytes the server renders
 * (kvs_codec_egress_layer), with the same fast CPU dequantizer; every tile is
 * validated (kvs_block_decode_run), or, verified, every check but the
 * checksum our caller has just verified (kvs_block_decode_run_verified). */
int kvs__decode_stored_layer(const char *op, const kvs_ns *ns, kvs_egress fmt, unsigned block,
                             unsigned layer, const void *k, size_t kl, const void *v, size_t vl,
                             int verified, void *kd, void *vd, char *err)
{
    kvs_dtype dt = fmt == KVS_EGRESS_FP16   ? KVS_DTYPE_FP16
                   : fmt == KVS_EGRESS_BF16 ? KVS_DTYPE_BF16
                                            : KVS_DTYPE_FP32;
    char e[KVS_ERR_LEN] = "";
    const uint32_t H = ns->num_kv_heads, T = ns->block_tokens, D = ns->head_dim;
    int rc = verified
                 ? kvs_block_decode_run_verified(k, kl, KVS_TILE_K, H, T, D, dt, kd,
                                                 kvs_tile_dequantize_verified, e)
                 : kvs_block_decode_run(k, kl, KVS_TILE_K, H, T, D, dt, kd, kvs_tile_dequantize, e);
    if (rc == 0)
        rc = verified
                 ? kvs_block_decode_run_verified(v, vl, KVS_TILE_V, H, T, D, dt, vd,
                                                 kvs_tile_dequantize_verified, e)
                 : kvs_block_decode_run(v, vl, KVS_TILE_V, H, T, D, dt, vd, kvs_tile_dequantize, e);
    if (rc != 0) {
        kvs__set_err(err, "%s: block %u layer %u: stored tiles: %s", op, block, layer, e);
        return KVS_EFORMAT;
    }
    return 0;
}

/* ---- Lookup --------------------------------------------------------------- */

void kvs_lookup_result_free(kvs_lookup_result *r)
{
    if (r == NULL)
        return;
    free(r->blocks);
    free(r);
}

int kvs__lookup_pack(const kvs_ns *ns, const unsigned *tokens, size_t n_tokens, unsigned lease_ms,
                     const char *fn, grpc_slice *out, char *err)
{
    pb_ns pns;
    int rc = ns_to_pb(ns, &pns, fn, err);
    if (rc != 0)
        return rc;
    Kvstash__V1__LookupRequest req = KVSTASH__V1__LOOKUP_REQUEST__INIT;
    req.ns = &pns.ns;
    req.tokens = (uint32_t *)tokens;
    req.n_tokens = n_tokens;
    req.lease_ms = lease_ms;
    *out = kvs__pack_slice(&req.base);
    return 0;
}

int kvs__lookup_from_reply(grpc_slice reply, kvs_lookup_result **out, char *err)
{
    *out = NULL;
    Kvstash__V1__LookupResponse *lr = kvstash__v1__lookup_response__unpack(
        NULL, GRPC_SLICE_LENGTH(reply), GRPC_SLICE_START_PTR(reply));
    if (lr == NULL) {
        kvs__set_err(err, "reply of %s (%zu bytes) does not parse as %s", KVS__METHOD_LOOKUP,
                     (size_t)GRPC_SLICE_LENGTH(reply),
                     kvstash__v1__lookup_response__descriptor.name);
        return KVS_EPROTO;
    }
    int rc = 0;
    kvs_lookup_result *r = calloc(1, sizeof *r);
    if (r == NULL ||
        (lr->n_blocks && (r->blocks = calloc(lr->n_blocks, sizeof *r->blocks)) == NULL)) {
        kvs_lookup_result_free(r);
        kvstash__v1__lookup_response__free_unpacked(lr, NULL);
        kvs__set_err(err, "out of memory");
        return KVS_ENOMEM;
    }
    if (lr->n_blocks != lr->matched_blocks) {
        rc = KVS_EPROTO;
        kvs__set_err(err, "Lookup reply: %zu blocks for matched_blocks %u", lr->n_blocks,
                     lr->matched_blocks);
    }
    for (size_t i = 0; i < lr->n_blocks && rc == 0; i++) {
        const Kvstash__V1__BlockInfo *b = lr->blocks[i];
        if (b->key.len != KVS_CLIENT_KEY_LEN) {
            rc = KVS_EPROTO;
            kvs__set_err(err, "Lookup reply: blocks[%zu].key has %zu bytes", i, b->key.len);
            break;
        }
        memcpy(r->blocks[i].key, b->key.data, KVS_CLIENT_KEY_LEN);
        r->blocks[i].index = b->index;
        r->blocks[i].scheme = (unsigned)b->scheme;
        r->blocks[i].stored_bytes = b->stored_bytes;
        r->blocks[i].tier = (unsigned)b->tier;
    }
    r->matched_blocks = lr->matched_blocks;
    r->matched_tokens = lr->matched_tokens;
    r->n_blocks = lr->n_blocks;
    r->lease_id = lr->lease_id;
    r->lease_ms = lr->lease_ms;
    kvstash__v1__lookup_response__free_unpacked(lr, NULL);
    if (rc != 0) {
        kvs_lookup_result_free(r);
        return rc;
    }
    *out = r;
    return 0;
}

int kvs_client_lookup(kvs_client *c, const kvs_ns *ns, const unsigned *tokens, size_t n_tokens,
                      unsigned lease_ms, int timeout_ms, kvs_lookup_result **out, char *err)
{
    if (out)
        *out = NULL;
    if (c == NULL || out == NULL || (tokens == NULL && n_tokens > 0)) {
        kvs__set_err(err, "kvs_client_lookup: client, tokens and out are required");
        return KVS_EINVAL;
    }
    if (kvs__forked(c, "kvs_client_lookup", err) != 0)
        return KVS_EPRECOND;
    grpc_slice req;
    int rc = kvs__lookup_pack(ns, tokens, n_tokens, lease_ms, "kvs_client_lookup", &req, err);
    if (rc != 0)
        return rc;
    grpc_slice rep;
    rc = kvs__call_slice(c, KVS__METHOD_LOOKUP, req, timeout_ms, &rep, NULL, err);
    if (rc != 0)
        return rc;
    rc = kvs__lookup_from_reply(rep, out, err);
    grpc_slice_unref(rep);
    return rc;
}

/* ---- Put ------------------------------------------------------------------ */

int kvs_client_put(kvs_client *c, const kvs_put_args *a, int timeout_ms, kvs_put_result *res,
                   char *err)
{
    if (c == NULL || a == NULL || a->tokens == NULL || a->k == NULL || a->v == NULL) {
        kvs__set_err(err, "kvs_client_put: client, args, tokens, k and v are required");
        return KVS_EINVAL;
    }
    if (kvs__forked(c, "kvs_client_put", err) != 0)
        return KVS_EPRECOND;
    /* one deadline for the session's close (when UCX was left) and the Put */
    int64_t deadline = kvs__call_deadline(c, timeout_ms);
    kvs__pb_put ph;
    int rc = kvs__put_header(a, &ph, err);
    if (rc != 0 || (rc = kvs__xfer_before_put(c, kvs__call_left_ms(deadline), err)) != 0)
        return rc;
    const kvs_ns *ns = a->ns;
    size_t layer_bytes = ph.layer_bytes;
    Kvstash__V1__PutRequest preq = KVSTASH__V1__PUT_REQUEST__INIT;
    preq.msg_case = KVSTASH__V1__PUT_REQUEST__MSG_HEADER;
    preq.header = &ph.hdr;

    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    kvs__call_state rpc;
    kvs__call_state_init(c, KVS__METHOD_PUT, cq, kvs__call_left_ms(deadline), &rpc);
    grpc_byte_buffer *recv_bb = NULL;

    /* All receive ops at once: they complete when the server's status arrives. */
    grpc_op rops[3];
    memset(rops, 0, sizeof rops);
    rops[0].op = GRPC_OP_RECV_INITIAL_METADATA;
    rops[0].data.recv_initial_metadata.recv_initial_metadata = &rpc.initial_md;
    rops[1].op = GRPC_OP_RECV_MESSAGE;
    rops[1].data.recv_message.recv_message = &recv_bb;
    kvs__call_status_op(&rpc, &rops[2]);
    void *rtag = rops;
    int started = grpc_call_start_batch(rpc.call, rops, 3, rtag, NULL) == GRPC_CALL_OK;

    if (started) {
        grpc_op s[2];
        memset(s, 0, sizeof s);
        grpc_byte_buffer *bb = pack_bb(&preq.base);
        kvs__call_send_ops(&rpc, s, bb);
        int ok = run_batch(rpc.call, cq, s, 2, s);
        grpc_byte_buffer_destroy(bb);
        for (unsigned l = 0; ok && l < ns->num_layers; l++) {
            Kvstash__V1__LayerPayload lp = KVSTASH__V1__LAYER_PAYLOAD__INIT;
            lp.layer = l;
            lp.k.data = (uint8_t *)a->k[l];
            lp.k.len = layer_bytes;
            lp.v.data = (uint8_t *)a->v[l];
            lp.v.len = layer_bytes;
            Kvstash__V1__PutRequest lr = KVSTASH__V1__PUT_REQUEST__INIT;
            lr.msg_case = KVSTASH__V1__PUT_REQUEST__MSG_LAYER;
            lr.layer = &lp;
            grpc_op op;
            memset(&op, 0, sizeof op);
            op.op = GRPC_OP_SEND_MESSAGE;
            bb = pack_bb(&lr.base);
            op.data.send_message.send_message = bb;
            ok = run_batch(rpc.call, cq, &op, 1, &op);
            grpc_byte_buffer_destroy(bb);
        }
        if (ok) {
            grpc_op op;
            memset(&op, 0, sizeof op);
            op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
            run_batch(rpc.call, cq, &op, 1, &op);
        }
        /* The status comes however the sends went (a refusal ends the stream early). */
        grpc_completion_queue_pluck(cq, rtag, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        rc = kvs__call_status_rc(&rpc, err);
    } else {
        kvs__set_err(err, "INTERNAL: cannot start the Put call");
        rc = KVS_EINTERNAL;
    }

    if (rc == 0) {
        Kvstash__V1__PutResponse *pr =
            recv_bb ? (Kvstash__V1__PutResponse *)unpack_bb(recv_bb,
                                                            &kvstash__v1__put_response__descriptor)
                    : NULL;
        if (pr == NULL || pr->key.len != KVS_CLIENT_KEY_LEN) {
            kvs__set_err(err, "Put reply is missing or does not parse");
            rc = KVS_EPROTO;
        } else if (res != NULL) {
            memcpy(res->key, pr->key.data, KVS_CLIENT_KEY_LEN);
            res->stored_bytes = pr->stored_bytes;
            res->already_present = pr->already_present;
            for (size_t i = 0; i < pr->n_quality; i++) {
                const Kvstash__V1__LayerQuality *q = pr->quality[i];
                if (q->layer >= ns->num_layers)
                    continue;
                if (res->k_rel_error)
                    res->k_rel_error[q->layer] = q->k_rel_error;
                if (res->v_rel_error)
                    res->v_rel_error[q->layer] = q->v_rel_error;
                if (res->layer_scheme)
                    res->layer_scheme[q->layer] = (unsigned)q->scheme;
            }
        }
        if (pr)
            protobuf_c_message_free_unpacked(&pr->base, NULL);
    }

    if (recv_bb)
        grpc_byte_buffer_destroy(recv_bb);
    kvs__call_state_release(&rpc);
    cq_destroy(cq);
    return rc;
}

/* ---- Get ------------------------------------------------------------------ */

typedef struct into_ctx {
    unsigned layers;
    size_t bytes;
    void *const *k_dst, *const *v_dst;
    float *k_scale, *v_scale;
} into_ctx;

/* into: NULL, or cb's arg when cb is copy_layer (K and V unpacked in place). */
static int get_call(kvs_client *c, const kvs_ns *ns,
                    const unsigned char (*keys)[KVS_CLIENT_KEY_LEN], size_t n_keys,
                    kvs_egress fmt, unsigned long long lease_id, int timeout_ms,
                    kvs_get_layer_cb cb, void *arg, const into_ctx *into, char *err)
{
    if (c == NULL || keys == NULL || n_keys == 0 || cb == NULL) {
        kvs__set_err(err, "kvs_client_get: client, keys (n_keys > 0) and cb are required");
        return KVS_EINVAL;
    }
    if (kvs__forked(c, "kvs_client_get", err) != 0)
        return KVS_EPRECOND;
    if ((int)fmt < KVS_EGRESS_STORED || fmt > KVS_EGRESS_FP8_PER_TENSOR) {
        kvs__set_err(err, "kvs_client_get: format %d is not a kvs_egress", (int)fmt);
        return KVS_EINVAL;
    }
    pb_ns pns;
    int rc = ns_to_pb(ns, &pns, "kvs_client_get", err);
    if (rc != 0)
        return rc;
    if (ns->num_layers == 0) {
        kvs__set_err(err, "kvs_client_get: ns->num_layers is 0");
        return KVS_EINVAL;
    }
    ProtobufCBinaryData *pk = keys_to_pb(keys, n_keys);
    if (pk == NULL) {
        kvs__set_err(err, "out of memory");
        return KVS_ENOMEM;
    }
    Kvstash__V1__GetRequest req = KVSTASH__V1__GET_REQUEST__INIT;
    req.ns = &pns.ns;
    req.keys = pk;
    req.n_keys = n_keys;
    /* Client-side decode (kvstash.h, kvs_decode_at): ask for the stored tiles
     * and make fmt here; `wire` is what the server is asked for and sends. */
    int local = c->decode_local && fmt >= KVS_EGRESS_FP16 && fmt <= KVS_EGRESS_FP32;
    kvs_egress wire = local ? KVS_EGRESS_STORED : fmt;
    size_t out_bytes = kvs_egress_layer_bytes(ns, fmt);
    req.format = (Kvstash__V1__EgressFormat)wire;
    req.lease_id = lease_id;
    size_t want = kvs_egress_layer_bytes(ns, wire);
    uint8_t *scratch = NULL; /* K then V of one decoded layer, for cb (not into) */

    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    kvs__call_state rpc;
    kvs__call_state_init(c, KVS__METHOD_GET, cq, timeout_ms, &rpc);

    grpc_op st;
    memset(&st, 0, sizeof st);
    kvs__call_status_op(&rpc, &st);
    int started = grpc_call_start_batch(rpc.call, &st, 1, &st, NULL) == GRPC_CALL_OK;
    int stopped = 0, proto_err = 0, bad_tile = 0, nomem = 0;
    size_t bi = 0;
    unsigned li = 0;
    flat_buf flat = {NULL, 0};
    if (started) {
        grpc_op ops[4];
        memset(ops, 0, sizeof ops);
        grpc_byte_buffer *bb = pack_bb(&req.base);
        kvs__call_send_ops(&rpc, ops, bb);
        ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
        ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
        ops[3].data.recv_initial_metadata.recv_initial_metadata = &rpc.initial_md;
        int ok = run_batch(rpc.call, cq, ops, 4, ops);
        grpc_byte_buffer_destroy(bb);
        while (ok) {
            grpc_byte_buffer *rb = NULL;
            grpc_op op;
            memset(&op, 0, sizeof op);
            op.op = GRPC_OP_RECV_MESSAGE;
            op.data.recv_message.recv_message = &rb;
            if (!run_batch(rpc.call, cq, &op, 1, &op) || rb == NULL) {
                if (rb)
                    grpc_byte_buffer_destroy(rb);
                break; /* end of stream (or failure): the status says which */
            }
            dst_alloc da = {0, {NULL, NULL}, 2};
            ProtobufCAllocator al = {dst_alloc_fn, dst_free_fn, &da};
            size_t di = bi * (into ? into->layers : 0) + li;
            if (into && !local && bi < n_keys && into->bytes >= DST_MIN &&
                into->k_dst[di] != into->v_dst[di]) { /* one buffer for both: copy, V wins */
                size_t i = di;
                da.size = into->bytes;
                da.p[0] = into->k_dst[i];
                da.p[1] = into->v_dst[i];
                da.used = 0;
            }
            Kvstash__V1__GetResponse view, *gr;
            grpc_slice held = grpc_empty_slice();
            if (local)
                gr = view_bb(rb, &view, &flat, &held);
            else
                gr = (Kvstash__V1__GetResponse *)unpack_bb_flat(
                    rb, &kvstash__v1__get_response__descriptor, &al, &flat);
            grpc_byte_buffer_destroy(rb);
            if (gr == NULL) {
                kvs__set_err(err, "Get: a reply message does not parse");
                proto_err = 1;
            } else if (bi >= n_keys || gr->block_index != bi || gr->layer != li ||
                       (int)gr->format != (int)wire ||
                       gr->last_layer != (li + 1 == ns->num_layers) ||
                       (want && (gr->k.len != want || gr->v.len != want))) {
                kvs__set_err(err,
                             "Get: unexpected message (block %u layer %u format %d, %zu/%zu "
                             "bytes; expected block %zu layer %u, %zu bytes)",
                             gr->block_index, gr->layer, (int)gr->format, gr->k.len, gr->v.len, bi,
                             li, want);
                proto_err = 1;
            } else if (local && !into && scratch == NULL &&
                       (scratch = malloc(2 * out_bytes)) == NULL) {
                kvs__set_err(err, "out of memory");
                nomem = 1;
            } else if (local) { /* into the caller's buffers, or scratch for cb */
                void *kd = into ? into->k_dst[di] : scratch;
                void *vd = into ? into->v_dst[di] : scratch + out_bytes;
                int checked = into != NULL; /* checked first: check_layer */
                if ((checked && check_layer(gr, ns, err) != 0) ||
                    kvs__decode_stored_layer("Get", ns, fmt, gr->block_index, gr->layer, gr->k.data,
                                             gr->k.len, gr->v.data, gr->v.len, checked, kd, vd,
                                             err) != 0) {
                    bad_tile = 1;
                } else if (into) {
                    if (into->k_scale)
                        into->k_scale[di] = 0; /* as the server sends for fp16/bf16/fp32 */
                    if (into->v_scale)
                        into->v_scale[di] = 0;
                } else if (cb(arg, (unsigned)bi, li, kd, out_bytes, vd, out_bytes, 0, 0,
                              gr->last_layer) != 0) {
                    stopped = 1;
                }
            } else if (fmt == KVS_EGRESS_STORED &&
                       (check_tiles(gr->k.data, gr->k.len, ns, 0, "K", err) != 0 ||
                        check_tiles(gr->v.data, gr->v.len, ns, 1, "V", err) != 0)) {
                bad_tile = 1;
            } else if (cb(arg, (unsigned)bi, li, gr->k.data, gr->k.len, gr->v.data, gr->v.len,
                          gr->k_scale, gr->v_scale, gr->last_layer) != 0) {
                stopped = 1;
            }
            if (gr && !local)
                protobuf_c_message_free_unpacked(&gr->base, &al);
            grpc_slice_unref(held);
            if (proto_err || stopped || bad_tile || nomem) {
                grpc_call_cancel(rpc.call, NULL);
                break;
            }
            if (++li == ns->num_layers) {
                li = 0;
                bi++;
            }
        }
        grpc_completion_queue_pluck(cq, &st, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (proto_err) {
            rc = KVS_EPROTO;
        } else if (nomem) {
            rc = KVS_ENOMEM;
        } else if (bad_tile) {
            rc = KVS_EFORMAT;
        } else if (stopped) {
            kvs__set_err(err, "CANCELLED: the layer callback stopped the Get");
            rc = KVS_ECANCELED;
        } else {
            rc = kvs__call_status_rc(&rpc, err);
            if (rc == 0 && bi != n_keys) {
                kvs__set_err(err, "Get: the stream ended after %zu of %zu blocks", bi, n_keys);
                rc = KVS_EPROTO;
            }
        }
    } else {
        kvs__set_err(err, "INTERNAL: cannot start the Get call");
        rc = KVS_EINTERNAL;
    }

    kvs__call_state_release(&rpc);
    cq_destroy(cq);
    free(pk);
    free(flat.p);
    free(scratch);
    return rc;
}

int kvs_client_get(kvs_client *c, const kvs_ns *ns, const unsigned char (*keys)[KVS_CLIENT_KEY_LEN],
                   size_t n_keys, kvs_egress fmt, unsigned long long lease_id, int timeout_ms,
                   kvs_get_layer_cb cb, void *arg, char *err)
{
    return get_call(c, ns, keys, n_keys, fmt, lease_id, timeout_ms, cb, arg, NULL, err);
}

/* Swaps n bytes between a and b (distinct buffers). */
static void swap_bytes(unsigned char *a, unsigned char *b, size_t n)
{
    unsigned char t[4096];
    for (size_t o = 0; o < n; o += sizeof t) {
        size_t m = n - o < sizeof t ? n - o : sizeof t;
        memcpy(t, a + o, m);
        memcpy(a + o, b + o, m);
        memcpy(b + o, t, m);
    }
}

/* Puts K (n bytes at k) into kd and V (n bytes at v) into vd, where k and v
 * may already be kd or vd, either way round (dst_alloc), or elsewhere. */
static void place_layer(void *kd, void *vd, const void *k, const void *v, size_t n)
{
    if (k == vd && v == kd) {
        swap_bytes(kd, vd, n);
    } else if (k == vd) { /* V is elsewhere: move K out of vd first */
        memcpy(kd, k, n);
        memcpy(vd, v, n);
    } else if (v == kd) { /* K is elsewhere: move V out of kd first */
        memcpy(vd, v, n);
        memcpy(kd, k, n);
    } else {
        if (k != kd)
            memcpy(kd, k, n);
        if (v != vd)
            memcpy(vd, v, n);
    }
}

static int copy_layer(void *arg, unsigned b, unsigned l, const void *k, size_t k_len, const void *v,
                      size_t v_len, float ks, float vs, int last)
{
    into_ctx *x = arg;
    (void)last;
    size_t i = (size_t)b * x->layers + l;
    if (k_len != x->bytes || v_len != x->bytes)
        return 1;
    place_layer(x->k_dst[i], x->v_dst[i], k, v, k_len);
    if (x->k_scale)
        x->k_scale[i] = ks;
    if (x->v_scale)
        x->v_scale[i] = vs;
    return 0;
}

int kvs_client_get_into(kvs_client *c, const kvs_ns *ns,
                        const unsigned char (*keys)[KVS_CLIENT_KEY_LEN], size_t n_keys,
                        kvs_egress fmt, unsigned long long lease_id, int timeout_ms,
                        void *const *k_dst, void *const *v_dst, float *k_scale, float *v_scale,
                        char *err)
{
    size_t bytes = kvs_egress_layer_bytes(ns, fmt);
    if (bytes == 0 || k_dst == NULL || v_dst == NULL) {
        kvs__set_err(err, "kvs_client_get_into: needs a fixed-size format (not STORED), ns, "
                          "k_dst and v_dst");
        return KVS_EINVAL;
    }
    for (size_t i = 0; i < n_keys * ns->num_layers; i++) {
        if (k_dst[i] == NULL || v_dst[i] == NULL) {
            kvs__set_err(err, "kvs_client_get_into: k_dst[%zu] or v_dst[%zu] is NULL", i, i);
            return KVS_EINVAL;
        }
    }
    into_ctx x = {ns->num_layers, bytes, k_dst, v_dst, k_scale, v_scale};
    return get_call(c, ns, keys, n_keys, fmt, lease_id, timeout_ms, copy_layer, &x, &x, err);
}

/* ---- Delete, Pin, Unpin ------------------------------------------------------ */

/*
 * What Delete, Pin and Unpin share: the checked namespace and the keys as
 * protobuf fields, and a reply that is one count. keys_req_begin sets *count
 * (may be NULL) to 0, validates (einval is the message for a missing client
 * or keys) and fills *kr; on 0 the caller sets its request's ns/keys from kr
 * and calls keys_req_call, which makes the call, frees kr's keys whatever
 * the outcome and, on success, stores the reply's uint32 field at count_off
 * (offsetof in the reply message) in *count.
 */
typedef struct keys_req {
    pb_ns pns;
    ProtobufCBinaryData *pk;
} keys_req;

static int keys_req_begin(kvs_client *c, const kvs_ns *ns,
                          const unsigned char (*keys)[KVS_CLIENT_KEY_LEN], size_t n_keys,
                          const char *fn, const char *einval, unsigned *count, keys_req *kr,
                          char *err)
{
    if (count)
        *count = 0;
    if (c == NULL || (keys == NULL && n_keys > 0)) {
        kvs__set_err(err, "%s", einval);
        return KVS_EINVAL;
    }
    if (kvs__forked(c, fn, err) != 0)
        return KVS_EPRECOND;
    int rc = ns_to_pb(ns, &kr->pns, fn, err);
    if (rc != 0)
        return rc;
    kr->pk = keys_to_pb(keys, n_keys);
    return kr->pk == NULL ? KVS_ENOMEM : 0;
}

static int keys_req_call(kvs_client *c, keys_req *kr, const char *method,
                         const ProtobufCMessage *req, const ProtobufCMessageDescriptor *rep_desc,
                         size_t count_off, int timeout_ms, unsigned *count, char *err)
{
    ProtobufCMessage *rep = NULL;
    int rc = kvs__call_pb(c, method, req, rep_desc, timeout_ms, &rep, err);
    free(kr->pk);
    kr->pk = NULL;
    if (rc != 0)
        return rc;
    if (count)
        *count = *(const uint32_t *)((const char *)rep + count_off);
    protobuf_c_message_free_unpacked(rep, NULL);
    return 0;
}

int kvs_client_delete(kvs_client *c, const kvs_ns *ns,
                      const unsigned char (*keys)[KVS_CLIENT_KEY_LEN], size_t n_keys, int subtree,
                      int timeout_ms, unsigned *deleted, char *err)
{
    keys_req kr;
    int rc = keys_req_begin(c, ns, keys, n_keys, "kvs_client_delete",
                            "kvs_client_delete: client and keys are required", deleted, &kr, err);
    if (rc != 0)
        return rc;
    Kvstash__V1__DeleteRequest req = KVSTASH__V1__DELETE_REQUEST__INIT;
    req.ns = &kr.pns.ns;
    req.keys = kr.pk;
    req.n_keys = n_keys;
    req.subtree = subtree != 0;
    return keys_req_call(c, &kr, KVS__METHOD_DELETE, &req.base,
                         &kvstash__v1__delete_response__descriptor,
                         offsetof(Kvstash__V1__DeleteResponse, deleted), timeout_ms, deleted, err);
}

int kvs_client_pin(kvs_client *c, const kvs_ns *ns, const unsigned char (*keys)[KVS_CLIENT_KEY_LEN],
                   size_t n_keys, unsigned ttl_ms, int priority, int timeout_ms, unsigned *pinned,
                   char *err)
{
    keys_req kr;
    int rc = keys_req_begin(c, ns, keys, n_keys, "kvs_client_pin",
                            "kvs_client_pin: client and keys are required", pinned, &kr, err);
    if (rc != 0)
        return rc;
    Kvstash__V1__PinRequest req = KVSTASH__V1__PIN_REQUEST__INIT;
    req.ns = &kr.pns.ns;
    req.keys = kr.pk;
    req.n_keys = n_keys;
    req.ttl_ms = ttl_ms;
    req.priority = priority;
    return keys_req_call(c, &kr, KVS__METHOD_PIN, &req.base, &kvstash__v1__pin_response__descriptor,
                         offsetof(Kvstash__V1__PinResponse, pinned), timeout_ms, pinned, err);
}

int kvs_client_unpin(kvs_client *c, const kvs_ns *ns,
                     const unsigned char (*keys)[KVS_CLIENT_KEY_LEN], size_t n_keys,
                     unsigned long long lease_id, int timeout_ms, unsigned *unpinned, char *err)
{
    keys_req kr;
    int rc = keys_req_begin(c, ns, keys, n_keys, "kvs_client_unpin",
                            "kvs_client_unpin: client is required (and keys when n_keys > 0)",
                            unpinned, &kr, err);
    if (rc != 0)
        return rc;
    Kvstash__V1__UnpinRequest req = KVSTASH__V1__UNPIN_REQUEST__INIT;
    req.ns = &kr.pns.ns;
    req.keys = kr.pk;
    req.n_keys = n_keys;
    req.lease_id = lease_id;
    return keys_req_call(c, &kr, KVS__METHOD_UNPIN, &req.base,
                         &kvstash__v1__unpin_response__descriptor,
                         offsetof(Kvstash__V1__UnpinResponse, unpinned), timeout_ms, unpinned, err);
}
