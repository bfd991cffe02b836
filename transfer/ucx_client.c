/*
 * ucx_client.c — kvs_xfer_client: fetches blocks layer by layer and puts
 * blocks over UCX active messages (xfer.h, docs/TRANSFER.md).
 *
 * The idea: a fetch is one FETCH message; the server answers with one LAYER
 * message per (block, layer), whose header says where its bytes go. The
 * handler checks that range against the caller's buffer and pulls the bytes
 * there (ucp_am_recv_data_nbx for rendezvous, memcpy for eager). Layers may
 * land in any order; each block reports them in order, verifying each one
 * just before it is reported (stored format: header, layer range and every
 * tile checksum; other formats: the XXH3-64 in the LAYER header).
 *
 * Invariants (progress thread only):
 *  - a fetch op ends (on_done) only when every block is resolved AND no
 *    receive into the caller's buffers is in flight (op->inflight == 0), so
 *    the caller may free them in on_done;
 *  - a message for an unknown request, or for a block already resolved, is
 *    dropped (returning UCS_OK drops a rendezvous descriptor);
 *  - every header field that sizes a write is checked against the caller's
 *    capacity before UCX is told where to write;
 *  - a block's seal (KVS__LAYER_F_SEAL, opaque here) comes only in the header
 *    of its layer 0 and is copied to dst->seal there, before any on_layer.
 */
#include "kv_block.h"
#include "kvs_error.h"
#include "ucx_internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <xxhash.h>
#if defined(__x86_64__)
/* XXH3_64bits becomes libxxhash's dispatching variant (AVX2 / AVX-512 when the
 * CPU has them): the same hash, about 3x faster than the SSE2 default at
 * 128 KiB on this project's x86 machines. */
#include <xxh_x86dispatch.h>
#endif

enum { OP_FETCH = 1, OP_PUT = 2 };
enum { L_NONE = 0, L_INFLIGHT = 1, L_LANDED = 2 };

typedef struct cli_block {
    int resolved;
    uint32_t layers; /* 0 until the first LAYER message */
    uint64_t total;
    uint8_t *state;
    /* Per layer, the message that carries it: byte range, XXH3 (other
     * formats), and on its first layer the number of layers it carries. */
    uint64_t *off, *len, *sum;
    uint32_t *cnt;
    uint32_t next;     /* next layer to verify and report */
    uint8_t *stage;    /* CUDA destination: the pinned host buffer it lands in */
    kvs_block_hdr hdr; /* stored format: checked with layer 0 */
    /* Stored format, from layer 0 on (geometry_of): layer l's tiles lie at
     * [loff[l], loff[l + 1]); its K tiles are tk[scheme] bytes each, its V
     * tiles tv[scheme]. */
    uint64_t *loff;
    uint32_t tk[KVS_SCHEME_INT8 + 1], tv[KVS_SCHEME_INT8 + 1];
} cli_block;

typedef struct cli_op cli_op;
struct cli_op {
    int kind;
    uint64_t id;
    uint64_t start_ms;
    kvs_xfer_client *c;
    cli_op *prev, *next;
    kvs__xw_task task;
    int linked;
    uint32_t inflight; /* UCX operations touching caller memory or this op */
    /* fetch */
    kvs_xfer_fetch_req *fr;
    kvs__fetch_hdr fh;
    uint8_t *keys;
    cli_block *blocks;
    uint32_t resolved;
    int first_err;
    /* put */
    kvs_xfer_put_req *pr;
    kvs__put_hdr ph;
    uint8_t *phdr; /* put: ph followed by the metadata, the AM header */
    int verdict_in;
    int verdict;
};

typedef struct cli_recv {
    cli_op *op;
    uint32_t block;
    uint32_t layer;
} cli_recv;

struct kvs_xfer_client {
    kvs__xw xw;
    kvs_xfer_client_opts o;
    ucp_ep_h ep;
    /* Written on the thread by connect_task (on_status reads it there);
     * callers read it once kvs_xfer_client_connect has returned. */
    kvs_xfer_session_info session;
    /* The session id and token of the last goodbye heard (thread only): one
     * that came before connect_task set session fails the connection there. */
    uint64_t goodbye_id;
    uint8_t goodbye_token[KVS_XFER_TOKEN_LEN];
    int connected;
    atomic_int status;
    cli_op *ops;
    atomic_uint_fast64_t next_id;
    kvs__xw_task fail_task;
    int fail_posted;
#ifdef KVS_XFER_CUDA
    kvs__stage *stage; /* created on the first CUDA fetch */
#endif
};

/* Where block i's bytes land: the caller's buffer, or its staging buffer. */
static uint8_t *block_base(const cli_op *op, uint32_t i)
{
    return op->blocks[i].stage ? op->blocks[i].stage : (uint8_t *)op->fr->dst[i].buf;
}

/* ---- ops ------------------------------------------------------------------- */

static void op_unlink(cli_op *op)
{
    if (!op->linked)
        return;
    kvs_xfer_client *c = op->c;
    if (op->prev)
        op->prev->next = op->next;
    else
        c->ops = op->next;
    if (op->next)
        op->next->prev = op->prev;
    op->linked = 0;
    c->xw.active--;
}

static void op_free(cli_op *op)
{
    if (op->blocks) {
        for (uint32_t i = 0; i < op->fr->nblocks; i++) {
            cli_block *b = &op->blocks[i];
            free(b->state);
            free(b->off);
            free(b->len);
            free(b->sum);
            free(b->cnt);
            free(b->loff);
#ifdef KVS_XFER_CUDA
            if (b->stage)
                kvs__stage_put(op->c->stage, b->stage);
#endif
        }
    }
    free(op->blocks);
    free(op->keys);
    free(op->phdr);
    free(op);
}

static cli_op *op_find(kvs_xfer_client *c, uint64_t id, int kind)
{
    for (cli_op *op = c->ops; op; op = op->next)
        if (op->id == id)
            return op->kind == kind ? op : NULL;
    return NULL;
}

static void op_maybe_done(cli_op *op)
{
    if (op->inflight)
        return;
    if (op->kind == OP_FETCH) {
        if (op->resolved < op->fr->nblocks)
            return;
        op_unlink(op);
        kvs_xfer_fetch_req *r = op->fr;
        int st = op->first_err;
        op_free(op);
        r->on_done(r, st);
    } else {
        if (!op->verdict_in)
            return;
        op_unlink(op);
        kvs_xfer_put_req *r = op->pr;
        int st = op->verdict;
        op_free(op);
        r->on_done(r, st);
    }
}

static void block_resolve(cli_op *op, uint32_t i, int status)
{
    cli_block *b = &op->blocks[i];
    if (b->resolved)
        return;
    b->resolved = 1;
    op->resolved++;
    kvs_xfer_dst *d = &op->fr->dst[i];
    d->status = status;
    if (status == 0) {
        d->len = b->total;
        d->layers = b->layers;
    } else if (!op->first_err) {
        op->first_err = status;
    }
    if (op->fr->on_block)
        op->fr->on_block(op->fr, i, status);
}

static void op_fail(cli_op *op, int status)
{
    if (op->kind == OP_FETCH) {
        for (uint32_t i = 0; i < op->fr->nblocks; i++)
            block_resolve(op, i, status);
    } else if (!op->verdict_in) {
        op->verdict_in = 1;
        op->verdict = status;
    }
}

/* ---- connection failure ---------------------------------------------------------- */

static void fail_all_task(void *arg)
{
    kvs_xfer_client *c = arg;
    c->fail_posted = 0;
    int st = atomic_load(&c->status);
    if (c->ep) {
        ucp_ep_h ep = c->ep;
        c->ep = NULL;
        kvs__ep_close_force(&c->xw, ep); /* in-flight receives complete with errors */
    }
    for (cli_op *op = c->ops; op; op = op->next)
        op_fail(op, st);
    cli_op *op = c->ops;
    while (op) {
        cli_op *next = op->next;
        op_maybe_done(op);
        op = next;
    }
}

static void conn_fail(kvs_xfer_client *c, int status)
{
    int zero = 0;
    atomic_compare_exchange_strong(&c->status, &zero, status);
    if (c->fail_posted)
        return;
    c->fail_posted = 1;
    c->fail_task.fn = fail_all_task;
    c->fail_task.arg = c;
    kvs__xw_post(&c->xw, &c->fail_task);
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    (void)status;
    conn_fail(arg, KVS_EUNAVAIL);
}

static void client_tick(void *arg, uint64_t now)
{
    kvs_xfer_client *c = arg;
    for (cli_op *op = c->ops; op; op = op->next) {
        if (now - op->start_ms > c->o.timeout_ms) {
            conn_fail(c, KVS_ETIMEDOUT);
            return;
        }
    }
}

/* ---- fetch: layers --------------------------------------------------------------- */

/* The layout of a stored block whose header (layer 0's bytes, buf) passed
 * kvs_block_check_header: every layer's range and each scheme's tile sizes,
 * taken from kv_block.h (kvs_block_layer_range, kvs_block_tile) once per
 * scheme the block uses rather than once per tile (each of those calls parses
 * the header: per tile that was a fifth of the client's CPU at 4 MiB). A
 * layer's bytes depend only on its scheme, and layers are contiguous, so the
 * ranges follow by summing; they must end at total_bytes, and each scheme's
 * tiles must fill its layers exactly (K tiles of every head, then V tiles). */
static int geometry_of(cli_block *b, const uint8_t *buf)
{
    uint32_t L = b->hdr.num_layers, H = b->hdr.num_kv_heads;
    const uint8_t *table = buf + sizeof(kvs_block_hdr);
    uint64_t lbytes[KVS_SCHEME_INT8 + 1] = {0};
    b->loff = malloc(((size_t)L + 1) * sizeof *b->loff);
    if (!b->loff)
        return KVS_ENOMEM;
    uint64_t off0, bytes0;
    if (kvs_block_layer_range(buf, b->total, 0, &off0, &bytes0, NULL) != 0)
        return KVS_EFORMAT;
    b->loff[0] = off0;
    for (uint32_t l = 0; l < L; l++) {
        unsigned sc = table[l];
        if (sc > KVS_SCHEME_INT8) /* checked by kvs_block_check_header; be safe */
            return KVS_EFORMAT;
        if (lbytes[sc] == 0) { /* first layer of this scheme: ask kv_block.h */
            uint64_t off, bytes;
            const void *kt, *vt;
            size_t kl, vl;
            if (kvs_block_layer_range(buf, b->total, l, &off, &bytes, NULL) != 0 ||
                off != b->loff[l] || bytes == 0 ||
                kvs_block_tile(buf, b->total, l, KVS_TILE_K, 0, &kt, &kl, NULL) != 0 ||
                kvs_block_tile(buf, b->total, l, KVS_TILE_V, 0, &vt, &vl, NULL) != 0 ||
                (const uint8_t *)kt != buf + off ||
                (const uint8_t *)vt != buf + off + (uint64_t)H * kl ||
                (uint64_t)H * (kl + vl) != bytes)
                return KVS_EFORMAT;
            lbytes[sc] = bytes;
            b->tk[sc] = (uint32_t)kl;
            b->tv[sc] = (uint32_t)vl;
        }
        b->loff[l + 1] = b->loff[l] + lbytes[sc];
    }
    return b->loff[L] == b->total ? 0 : KVS_EFORMAT;
}

/* Checks layer l of block i, whose bytes have landed and whose predecessors
 * passed. 0 or a KVS_E* that fails the block. */
static int layer_verify(cli_op *op, uint32_t i, uint32_t l, uint32_t k)
{
    cli_block *b = &op->blocks[i];
    const uint8_t *buf = block_base(op, i);
    uint64_t off = b->off[l], len = b->len[l];
    if (l + k == b->layers && off + len != b->total)
        return KVS_EPROTO;
    if (l > 0 && b->off[l - 1] + b->len[l - 1] != off)
        return KVS_EPROTO;
    if (op->fr->format != KVS_XFER_FMT_STORED)
        return XXH3_64bits(buf + off, len) == b->sum[l] ? 0 : KVS_EFORMAT;
    if (l == 0) {
        if (off != 0 || kvs_block_check_header(buf, len, &b->hdr, NULL) != 0 ||
            b->hdr.total_bytes != b->total || b->hdr.num_layers != b->layers)
            return KVS_EFORMAT;
        int rc = geometry_of(b, buf);
        if (rc != 0)
            return rc;
    }
    /* The message must hold exactly layers l..l+k-1 as the header lays them
     * out (layer 0's message starts at 0: it also carries the header). */
    if ((l == 0 ? 0 : b->loff[l]) != off || b->loff[l + k] != off + len)
        return KVS_EPROTO;
    const uint8_t *table = buf + sizeof(kvs_block_hdr);
    uint32_t H = b->hdr.num_kv_heads;
    /* KVS_XFER_FETCH_CALLER_CHECKS: every tile's header and bounds here, its
     * checksum by the caller (on its own thread, not this progress thread). */
    int (*check)(const void *, size_t, kvs_tile_hdr *, char *) =
        (op->fr->flags & KVS_XFER_FETCH_CALLER_CHECKS) && !b->stage ? kvs_tile_check_verified
                                                                    : kvs_tile_check;
    for (uint32_t j = l; j < l + k; j++) {
        const uint8_t *t = buf + b->loff[j];
        uint32_t ks = b->tk[table[j]], vs = b->tv[table[j]];
        for (uint32_t hd = 0; hd < H; hd++, t += ks)
            if (check(t, ks, NULL, NULL) != 0)
                return KVS_EFORMAT;
        for (uint32_t hd = 0; hd < H; hd++, t += vs)
            if (check(t, vs, NULL, NULL) != 0)
                return KVS_EFORMAT;
    }
    return 0;
}

#ifdef KVS_XFER_CUDA
typedef struct cli_copy {
    cli_op *op;
    uint32_t block, layer, count;
} cli_copy;

/* Layer's bytes reached the device: report it (copies complete in order). */
static void copy_done(void *arg)
{
    cli_copy *cp = arg;
    cli_op *op = cp->op;
    cli_block *b = &op->blocks[cp->block];
    op->inflight--;
    if (!b->resolved) {
        for (uint32_t l = cp->layer; l < cp->layer + cp->count; l++)
            if (op->fr->on_layer)
                op->fr->on_layer(op->fr, cp->block, l);
        if (cp->layer + cp->count == b->layers)
            block_resolve(op, cp->block, 0);
    }
    free(cp);
    op_maybe_done(op);
}

/* Queues the host-to-device copy of verified layers l..l+k-1 (one message);
 * 0 or a KVS_E*. */
static int layer_copy(cli_op *op, uint32_t i, uint32_t l, uint32_t k)
{
    cli_block *b = &op->blocks[i];
    cli_copy *cp = malloc(sizeof *cp);
    if (!cp)
        return KVS_ENOMEM;
    cp->op = op;
    cp->block = i;
    cp->layer = l;
    cp->count = k;
    op->inflight++;
    int rc = kvs__stage_copy(op->c->stage, (uint8_t *)op->fr->dst[i].buf + b->off[l],
                             b->stage + b->off[l], b->len[l], copy_done, cp);
    if (rc != 0) {
        op->inflight--;
        free(cp);
    }
    return rc;
}
#endif

/* The message starting at layer l landed (or failed). Reports, in order,
 * every message whose predecessors are all in, verifying each first. */
static void layer_landed(cli_op *op, uint32_t i, uint32_t l, ucs_status_t st)
{
    cli_block *b = &op->blocks[i];
    op->inflight--;
    if (!b->resolved) {
        if (st != UCS_OK) {
            block_resolve(op, i, kvs__status_from_ucs(st));
        } else {
            for (uint32_t j = l; j < l + b->cnt[l]; j++)
                b->state[j] = L_LANDED;
            while (b->next < b->layers && b->state[b->next] == L_LANDED) {
                uint32_t n = b->next, k = b->cnt[n];
                int rc = k ? layer_verify(op, i, n, k) : KVS_EPROTO;
#ifdef KVS_XFER_CUDA
                if (rc == 0 && b->stage)
                    rc = layer_copy(op, i, n, k); /* reported by copy_done */
#endif
                if (rc != 0) {
                    block_resolve(op, i, rc);
                    break;
                }
                for (uint32_t j = n; j < n + k; j++)
                    if (op->fr->on_layer && !b->stage)
                        op->fr->on_layer(op->fr, i, j);
                b->next += k;
            }
            if (!b->resolved && b->next == b->layers && !b->stage)
                block_resolve(op, i, 0);
        }
    }
    op_maybe_done(op);
}

static void recv_cb(void *request, ucs_status_t st, size_t length, void *user_data)
{
    cli_recv *rv = user_data;
    cli_op *op = rv->op;
    if (st == UCS_OK && length != op->blocks[rv->block].len[rv->layer])
        st = UCS_ERR_MESSAGE_TRUNCATED;
    uint32_t i = rv->block, l = rv->layer;
    free(rv);
    ucp_request_free(request);
    layer_landed(op, i, l, st);
}

/* First message of a block: sizes its per-layer state. */
static int block_setup(cli_op *op, uint32_t i, const kvs__layer_hdr *h)
{
    cli_block *b = &op->blocks[i];
    if (h->layers == 0 || h->layers > KVS_XFER_MAX_LAYERS || h->total == 0)
        return KVS_EPROTO;
    if (h->total > op->fr->dst[i].cap)
        return KVS_ENOSPC;
    b->state = calloc(h->layers, 1);
    b->off = calloc(h->layers, sizeof *b->off);
    b->len = calloc(h->layers, sizeof *b->len);
    b->sum = calloc(h->layers, sizeof *b->sum);
    b->cnt = calloc(h->layers, sizeof *b->cnt);
    if (!b->state || !b->off || !b->len || !b->sum || !b->cnt)
        return KVS_ENOMEM;
    b->layers = h->layers;
    b->total = h->total;
    return 0;
}

static ucs_status_t on_layer(void *arg, const void *header, size_t hlen, void *data, size_t len,
                             const ucp_am_recv_param_t *p)
{
    kvs_xfer_client *c = arg;
    kvs__layer_hdr h;
    if (hlen < sizeof h)
        return UCS_OK;
    memcpy(&h, header, sizeof h);
    int sealed = (h.flags & KVS__LAYER_F_SEAL) != 0;
    if (!sealed && hlen != sizeof h)
        return UCS_OK;
    cli_op *op = op_find(c, h.req_id, OP_FETCH);
    if (!op)
        return UCS_OK;
    if (h.block >= op->fr->nblocks) {
        op_fail(op, KVS_EPROTO);
        op_maybe_done(op);
        return UCS_OK;
    }
    cli_block *b = &op->blocks[h.block];
    if (b->resolved)
        return UCS_OK;
    int rc = 0;
    if (b->layers == 0)
        rc = block_setup(op, h.block, &h);
    else if (h.layers != b->layers || h.total != b->total)
        rc = KVS_EPROTO;
    if (rc == 0 && (h.layer >= b->layers || h.count == 0 || h.count > b->layers - h.layer ||
                    h.len != len || h.len == 0 || h.off > b->total || h.len > b->total - h.off))
        rc = KVS_EPROTO;
    for (uint32_t j = h.layer; rc == 0 && j < h.layer + h.count; j++)
        if (b->state[j] != L_NONE) /* each layer arrives once */
            rc = KVS_EPROTO;
    if (rc == 0 && op->fr->format != KVS_XFER_FMT_STORED && !(h.flags & KVS__LAYER_F_XXH3))
        rc = KVS_EPROTO;
    /* A format with fixed places (layer_bytes) gets every layer exactly at
     * its place: the caller reads layer l there once it is reported, so a
     * message elsewhere would report bytes never written (or still landing)
     * as the layer. A block of another size is not laid out as the caller's
     * blocks are (one of another namespace's, under a key the caller named):
     * not found, as the caller's own check of its head would answer, not a
     * fault of the path. */
    if (rc == 0 && op->fr->format != KVS_XFER_FMT_STORED && op->fr->layer_bytes) {
        uint64_t hb = op->fr->head_bytes, lb = op->fr->layer_bytes;
        if (hb > b->total || (b->total - hb) / lb != b->layers || (b->total - hb) % lb != 0)
            rc = KVS_ENOTFOUND;
        else if (h.off != (h.layer ? hb + (uint64_t)h.layer * lb : 0) ||
                 h.off + h.len != hb + (uint64_t)(h.layer + h.count) * lb)
            rc = KVS_EPROTO;
    }
    /* A seal comes only with layer 0, alone in its message, which the checks
     * above let through once per block: a block's seal is written once. */
    if (rc == 0 && sealed &&
        (h.layer != 0 || h.count != 1 || h.seal_len == 0 || h.seal_len > KVS_XFER_MAX_SEAL ||
         hlen != sizeof h + h.seal_len))
        rc = KVS_EPROTO;
    kvs_xfer_dst *d = &op->fr->dst[h.block];
    if (rc == 0 && sealed && d->seal && h.seal_len > d->seal_cap)
        rc = KVS_ENOSPC;
    /* No two layers of a block may share a byte: a layer already reported
     * must never be overwritten by a later message. O(layers) per message. */
    for (uint32_t k = 0; rc == 0 && k < b->layers; k++)
        if (b->state[k] != L_NONE && h.off < b->off[k] + b->len[k] && b->off[k] < h.off + h.len)
            rc = KVS_EPROTO;
    if (rc != 0) {
        block_resolve(op, h.block, rc);
        op_maybe_done(op);
        return UCS_OK;
    }
    if (sealed && d->seal) { /* before layer 0 can be reported */
        memcpy(d->seal, (const uint8_t *)header + sizeof h, h.seal_len);
        d->seal_len = h.seal_len;
    }
    for (uint32_t j = h.layer; j < h.layer + h.count; j++) {
        b->state[j] = L_INFLIGHT;
        b->off[j] = h.off;
        b->len[j] = h.len;
        b->sum[j] = h.sum;
        b->cnt[j] = j == h.layer ? h.count : 0;
    }
    op->inflight++;
    uint8_t *dst = block_base(op, h.block) + h.off;
    if (!(p->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        memcpy(dst, data, len);
        layer_landed(op, h.block, h.layer, UCS_OK);
        return UCS_OK;
    }
    cli_recv *rv = malloc(sizeof *rv);
    if (!rv) {
        layer_landed(op, h.block, h.layer, UCS_ERR_NO_MEMORY);
        return UCS_OK;
    }
    rv->op = op;
    rv->block = h.block;
    rv->layer = h.layer;
    ucs_status_t st = kvs__am_recv(&c->xw, data, dst, len, recv_cb, rv);
    if (st != UCS_INPROGRESS) {
        free(rv);
        layer_landed(op, h.block, h.layer, st);
    }
    return UCS_OK;
}

static int status_sane(int32_t st, int allow_ok)
{
    if (st == 0)
        return allow_ok ? 0 : KVS_EPROTO;
    return (st < 0 && st >= KVS_EINTERNAL) ? st : KVS_EPROTO;
}

/* On the thread: the last goodbye heard names this client's session, with
 * its token. */
static int goodbye_is_ours(const kvs_xfer_client *c)
{
    return c->session.id != 0 && c->goodbye_id == c->session.id &&
           kvs__token_eq(c->goodbye_token, c->session.token);
}

static ucs_status_t on_status(void *arg, const void *header, size_t hlen, void *data, size_t len,
                              const ucp_am_recv_param_t *p)
{
    kvs_xfer_client *c = arg;
    kvs__status_hdr h;
    if (hlen != sizeof h)
        return UCS_OK;
    memcpy(&h, header, sizeof h);
    if (h.kind == KVS__ST_GOODBYE) {
        /* The server's process is about to end (ucx_server.c, say_goodbye):
         * leave UCX now, not at the op timeout or UCX's keepalive (20 s over
         * shared memory). Only for this session: a stray one changes nothing.
         * The server says it to every session it has open, also one whose
         * client has not connected yet (session id 0 here): connect_task
         * looks at it then. */
        /* It carries the session's token: session ids are sequential, so
         * another tenant's worker could name ours, not prove it. */
        if (!data || len != KVS_XFER_TOKEN_LEN || (p->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV))
            return UCS_OK;
        c->goodbye_id = h.req_id;
        memcpy(c->goodbye_token, data, sizeof c->goodbye_token);
        if (goodbye_is_ours(c))
            conn_fail(c, KVS_EUNAVAIL);
        return UCS_OK;
    }
    cli_op *op = NULL;
    for (cli_op *o = c->ops; o; o = o->next)
        if (o->id == h.req_id)
            op = o;
    if (!op)
        return UCS_OK;
    if (op->kind == OP_FETCH) {
        if (h.kind == KVS__ST_REQUEST)
            op_fail(op, status_sane(h.status, 0));
        else if (h.kind == KVS__ST_BLOCK && h.block < op->fr->nblocks)
            block_resolve(op, h.block, status_sane(h.status, 0));
        else
            op_fail(op, KVS_EPROTO);
    } else if (!op->verdict_in) {
        op->verdict_in = 1;
        op->verdict = (h.kind == KVS__ST_PUT || h.kind == KVS__ST_REQUEST)
                          ? status_sane(h.status, h.kind == KVS__ST_PUT)
                          : KVS_EPROTO;
        /* The store's reply (stored key and size) rides as eager data; any
         * other length or a rendezvous descriptor is ignored (dropped). */
        if (h.kind == KVS__ST_PUT && data && len == sizeof(kvs__put_reply) &&
            !(p->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
            kvs__put_reply r;
            memcpy(&r, data, sizeof r);
            memcpy(op->pr->reply.key, r.key, sizeof r.key);
            op->pr->reply.stored_bytes = r.stored_bytes;
            memcpy(op->pr->reply.tag, r.tag, sizeof r.tag);
        }
    }
    op_maybe_done(op);
    return UCS_OK;
}

/* ---- sending requests ------------------------------------------------------------- */

/* A request that could not be sent means the path to the server is broken
 * (on shared memory a vanished peer shows up here, not as an endpoint error):
 * the connection fails as a whole, so the caller falls back to gRPC. */
static void req_send_done(cli_op *op, ucs_status_t st)
{
    op->inflight--;
    if (st != UCS_OK) {
        int rc = kvs__status_from_ucs(st);
        if (rc != KVS_ECANCELED && rc != KVS_ETIMEDOUT)
            rc = KVS_EUNAVAIL;
        conn_fail(op->c, rc);
        op_fail(op, rc);
    }
    op_maybe_done(op);
}

static void req_send_cb(void *request, ucs_status_t st, void *user_data)
{
    req_send_done(user_data, st);
    ucp_request_free(request);
}

static void op_start_task(void *arg)
{
    cli_op *op = arg;
    kvs_xfer_client *c = op->c;
    op->start_ms = kvs__now_ms();
    op->next = c->ops;
    op->prev = NULL;
    if (c->ops)
        c->ops->prev = op;
    c->ops = op;
    op->linked = 1;
    c->xw.active++;
    int st = atomic_load(&c->status);
    if (st != 0 || !c->ep) {
        op_fail(op, st ? st : KVS_EUNAVAIL);
        op_maybe_done(op);
        return;
    }
#ifdef KVS_XFER_CUDA
    if (op->kind == OP_FETCH) {
        for (uint32_t i = 0; i < op->fr->nblocks; i++) {
            if (op->fr->dst[i].mem != KVS_XFER_MEM_CUDA)
                continue;
            int rc = c->stage ? 0 : kvs__stage_create(&c->xw, &c->stage);
            void *host = NULL;
            if (rc == 0)
                rc = kvs__stage_get(c->stage, op->fr->dst[i].cap, &host);
            if (rc != 0)
                block_resolve(op, i, rc); /* its layers will be dropped */
            else
                op->blocks[i].stage = host;
        }
    }
#endif
    op->inflight++;
    ucs_status_t sst;
    if (op->kind == OP_FETCH)
        sst = kvs__am_send(c->ep, KVS__AM_FETCH, &op->fh, sizeof op->fh, op->keys,
                           (size_t)op->fr->nblocks * KVS_XFER_KEY_LEN,
                           UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY, req_send_cb, op);
    else
        sst = kvs__am_send(c->ep, KVS__AM_PUT, op->phdr, sizeof op->ph + op->ph.meta_len,
                           op->pr->buf, op->pr->len, UCP_AM_SEND_FLAG_RNDV | UCP_AM_SEND_FLAG_REPLY,
                           req_send_cb, op);
    if (sst != UCS_INPROGRESS)
        req_send_done(op, sst);
}

/* A new operation (calloc'd, with its id) on a connected client whose
 * connection has not failed: KVS_EPRECOND before kvs_xfer_client_connect,
 * the connection's failure after it. */
static int op_new(kvs_xfer_client *c, int kind, cli_op **out)
{
    if (!c->connected)
        return KVS_EPRECOND;
    int st = atomic_load(&c->status);
    if (st != 0)
        return st;
    cli_op *op = calloc(1, sizeof *op);
    if (!op)
        return KVS_ENOMEM;
    op->kind = kind;
    op->c = c;
    op->id = atomic_fetch_add(&c->next_id, 1);
    *out = op;
    return 0;
}

/* Hands a filled op to the progress thread, which sends it (op_start_task). */
static void op_post(cli_op *op)
{
    op->task.fn = op_start_task;
    op->task.arg = op;
    kvs__xw_post(&op->c->xw, &op->task);
}

int kvs_xfer_fetch(kvs_xfer_client *c, kvs_xfer_fetch_req *req)
{
    if (!c || !req || !req->keys || !req->dst || !req->on_done || req->nblocks == 0 ||
        req->nblocks > KVS_XFER_MAX_BLOCKS)
        return KVS_EINVAL;
    for (uint32_t i = 0; i < req->nblocks; i++) {
        if (!req->dst[i].buf || req->dst[i].cap == 0)
            return KVS_EINVAL;
        if (req->dst[i].mem == KVS_XFER_MEM_CUDA) {
#ifdef KVS_XFER_CUDA
            int rc = kvs__cuda_dst_check(req->dst[i].buf);
            if (rc != 0)
                return rc;
#else
            return KVS_EUNIMPL;
#endif
        } else if (req->dst[i].mem != KVS_XFER_MEM_HOST) {
            return KVS_EINVAL;
        }
    }
    cli_op *op = NULL;
    int rc = op_new(c, OP_FETCH, &op);
    if (rc != 0)
        return rc;
    op->fr = req;
    op->keys = malloc((size_t)req->nblocks * KVS_XFER_KEY_LEN);
    op->blocks = calloc(req->nblocks, sizeof *op->blocks);
    if (!op->keys || !op->blocks) {
        free(op->keys);
        free(op->blocks);
        free(op);
        return KVS_ENOMEM;
    }
    memcpy(op->keys, req->keys, (size_t)req->nblocks * KVS_XFER_KEY_LEN);
    for (uint32_t i = 0; i < req->nblocks; i++) {
        req->dst[i].status = 0;
        req->dst[i].len = 0;
        req->dst[i].layers = 0;
        req->dst[i].seal_len = 0;
    }
    op->fh.magic = KVS__WIRE_MAGIC;
    op->fh.format = req->format;
    op->fh.session = c->session.id;
    memcpy(op->fh.token, c->session.token, KVS_XFER_TOKEN_LEN);
    op->fh.req_id = op->id;
    op->fh.nblocks = req->nblocks;
    memcpy(op->fh.nonce, req->nonce, KVS_XFER_NONCE_LEN);
    op_post(op);
    return 0;
}

int kvs_xfer_put(kvs_xfer_client *c, kvs_xfer_put_req *req)
{
    if (!c || !req || !req->buf || req->len == 0 || !req->on_done ||
        req->meta_len > KVS_XFER_MAX_META || (req->meta_len && !req->meta))
        return KVS_EINVAL;
    cli_op *op = NULL;
    int rc = op_new(c, OP_PUT, &op);
    if (rc != 0)
        return rc;
    op->pr = req;
    memset(&req->reply, 0, sizeof req->reply);
    op->ph.magic = KVS__WIRE_MAGIC;
    op->ph.format = req->format;
    op->ph.session = c->session.id;
    memcpy(op->ph.token, c->session.token, KVS_XFER_TOKEN_LEN);
    op->ph.req_id = op->id;
    op->ph.len = req->len;
    memcpy(op->ph.key, req->key, KVS_XFER_KEY_LEN);
    op->ph.meta_len = req->meta_len;
    op->phdr = malloc(sizeof op->ph + req->meta_len);
    if (!op->phdr) {
        free(op);
        return KVS_ENOMEM;
    }
    memcpy(op->phdr, &op->ph, sizeof op->ph);
    if (req->meta_len)
        memcpy(op->phdr + sizeof op->ph, req->meta, req->meta_len);
    op_post(op);
    return 0;
}

/* A blocking put: the waiter lives on the caller's stack until on_done has
 * signalled (on_done runs on the progress thread, which touches the waiter
 * only under its lock, and last). */
typedef struct put_waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, status;
} put_waiter;

static void put_wait_done(kvs_xfer_put_req *r, int status)
{
    put_waiter *w = r->data;
    pthread_mutex_lock(&w->mu);
    w->status = status;
    w->done = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

int kvs_xfer_put_wait(kvs_xfer_client *c, kvs_xfer_put_req *req)
{
    if (!req)
        return KVS_EINVAL;
    if (c && c->xw.started && kvs__xw_on_thread(&c->xw))
        return KVS_EPRECOND; /* from a callback: would wait for itself */
    put_waiter w = {.done = 0, .status = 0};
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    req->on_done = put_wait_done;
    req->data = &w;
    int rc = kvs_xfer_put(c, req);
    if (rc == 0) {
        pthread_mutex_lock(&w.mu);
        while (!w.done)
            pthread_cond_wait(&w.cv, &w.mu);
        rc = w.status;
        pthread_mutex_unlock(&w.mu);
    }
    req->data = NULL;
    pthread_cond_destroy(&w.cv);
    pthread_mutex_destroy(&w.mu);
    return rc;
}

/* ---- lifecycle --------------------------------------------------------------------- */

/* The client's side of the protocol: it receives LAYER and STATUS. */
static const kvs__xw_opts client_xw = {
    .name = "kvs-xfer-cli",
    .tick = client_tick,
    .am = {{KVS__AM_LAYER, on_layer}, {KVS__AM_STATUS, on_status}},
};

int kvs_xfer_client_create(const kvs_xfer_client_opts *o, kvs_xfer_client **out)
{
    if (!out)
        return KVS_EINVAL;
    kvs_xfer_client_opts def = {0};
    if (!o)
        o = &def;
    if (o->err_mode != KVS_XFER_ERR_PEER && o->err_mode != KVS_XFER_ERR_NONE)
        return KVS_EINVAL;
    kvs_xfer_client *c = calloc(1, sizeof *c);
    if (!c)
        return KVS_ENOMEM;
    c->o = *o;
    if (!c->o.timeout_ms)
        c->o.timeout_ms = 30000;
    /* Request ids start at a random point: a stray or stale message can
     * hardly name a live request of a later client. */
    uint64_t base = 1;
    if (getrandom(&base, sizeof base, 0) != (ssize_t)sizeof base)
        base = (uint64_t)kvs__now_ms() << 20;
    atomic_init(&c->next_id, base | 1);
    int rc = kvs__xw_open(&c->xw, &client_xw, o->spin, o->net_devices, o->tls, c);
    if (rc != 0) {
        free(c);
        return rc;
    }
    *out = c;
    return 0;
}

int kvs_xfer_client_address(kvs_xfer_client *c, const void **addr, size_t *len)
{
    return c ? kvs__xw_address(&c->xw, addr, len) : KVS_EINVAL;
}

typedef struct connect_args {
    kvs_xfer_client *c;
    const void *addr;
    size_t len;
    const kvs_xfer_session_info *session;
    int rc;
} connect_args;

/* On the thread: the session is set where on_status reads it, and a goodbye
 * that named it before (the server's process ends) fails the connection. */
static void connect_task(void *arg)
{
    connect_args *a = arg;
    kvs_xfer_client *c = a->c;
    a->rc = kvs__ep_create(&c->xw, a->addr, a->len, c->o.err_mode, on_ep_error, c, &c->ep);
    if (a->rc != 0)
        return;
    c->session = *a->session;
    if (goodbye_is_ours(c))
        conn_fail(c, KVS_EUNAVAIL);
}

int kvs_xfer_client_connect(kvs_xfer_client *c, const void *server_addr, size_t len,
                            const kvs_xfer_session_info *session)
{
    if (!c || !server_addr || !session)
        return KVS_EINVAL;
    if (c->connected)
        return KVS_EEXIST;
    connect_args a = {c, server_addr, len, session, 0};
    kvs__xw_call(&c->xw, connect_task, &a);
    if (a.rc == 0)
        c->connected = 1;
    return a.rc;
}

int kvs_xfer_client_status(kvs_xfer_client *c)
{
    if (!c)
        return KVS_EINVAL;
    return atomic_load(&c->status);
}

static void client_shutdown_task(void *arg)
{
    kvs_xfer_client *c = arg;
    int zero = 0;
    atomic_compare_exchange_strong(&c->status, &zero, KVS_ECANCELED);
    fail_all_task(c);
    uint64_t until = kvs__now_ms() + 1000;
    while (c->ops && kvs__now_ms() < until)
        ucp_worker_progress(c->xw.worker);
}

void kvs_xfer_client_destroy(kvs_xfer_client *c)
{
    if (!c)
        return;
    kvs__xw_call(&c->xw, client_shutdown_task, c);
#ifdef KVS_XFER_CUDA
    kvs__stage_sync(c->stage); /* every copy completion is queued before the join */
#endif
    kvs__xw_fini(&c->xw);
    /* Operations UCX never completed: nothing writes their buffers now. */
    while (c->ops) {
        cli_op *op = c->ops;
        op->inflight = 0;
        op_fail(op, KVS_ECANCELED);
        op_maybe_done(op);
    }
#ifdef KVS_XFER_CUDA
    kvs__stage_destroy(c->stage);
#endif
    free(c);
}
