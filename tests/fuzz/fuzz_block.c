/*
 * fuzz_block.c — libFuzzer target for the block decoders: kvs_block_check,
 * then, when it accepts, kvs_block_tile for every tile, kvs_block_decode_layer
 * for every layer (dtype chosen by the mode byte) and kvs_block_requant_fp8.
 * Rejected blocks still go through kvs_block_decode_layer for every layer
 * whose bytes are present, since that function promises to be safe on
 * unchecked bytes (a worker decodes layers as they arrive). Each such layer's
 * K and V runs (its tiles back to back, as a Get in the stored format sends
 * them) also go through kvs_block_decode_run, once cut exactly and once
 * running on to the end of the input: the run must decode exactly when the
 * layer does (the same bytes), and never with a wrong length.
 *
 * The input is copied into a buffer of exactly its size; destinations are
 * exactly T·H·D elements. Invariants, checked with abort():
 *   - an accepted block decodes every layer and finds every tile inside it;
 *   - a failed decode leaves its destination untouched;
 *   - requantization of an accepted block succeeds with a scale >= 0;
 *   - kvs_block_decode_run of a layer's exact K or V run succeeds when
 *     kvs_block_decode_layer does, with the same bytes; then with bytes past
 *     its last tile it is refused without writing;
 *   - kvs_block_decode_run_verified (checksums skipped) runs on every such
 *     run, checksum right or not, within bounds, and writes the full run's
 *     bytes whenever the full run decodes.
 * Memory per input is bounded by the input: a layer is decoded only when its
 * bytes lie within the input, and each element takes at least one byte.
 */
#include "fuzz_target.h"
#include "kv_block.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SENT 0x5A

unsigned long kvs_fuzz_accepted;

static void require(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_block: invariant broken: %s\n", what);
        abort();
    }
}

static int untouched(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != SENT)
            return 0;
    return 1;
}

/* Layer l's run of kind (its H tiles back to back, as kvs_block_tile lays
 * them out) through kvs_block_decode_run: exactly cut, then with the rest of
 * the input after it. want: the layer decode's output for that kind, or NULL
 * when the layer decode failed or skipped the kind. */
static void decode_run(const uint8_t *blk, size_t len, const kvs_block_hdr *h, uint32_t l,
                       unsigned kind, kvs_dtype dt, size_t elems, const unsigned char *want)
{
    const void *t;
    size_t tl;
    if (kvs_block_tile(blk, len, l, (kvs_tile_kind)kind, 0, &t, &tl, NULL) != 0)
        return;
    const uint8_t *run = t;
    const size_t run_len = tl * h->num_kv_heads, rest = (size_t)(blk + len - run);
    if (run_len > rest)
        return; /* not arrived */
    const size_t n = elems * (dt == KVS_DTYPE_FP32 ? 4 : 2);
    unsigned char *dst = malloc(n);
    require(dst != NULL, "malloc");
    memset(dst, SENT, n);
    int rc = kvs_block_decode_run(run, run_len, (kvs_tile_kind)kind, h->num_kv_heads,
                                  h->block_tokens, h->head_dim, dt, dst, NULL, NULL);
    if (want)
        require(rc == 0 && memcmp(dst, want, n) == 0,
                "a run of a layer that decodes does not decode to the same bytes");
    /* The _verified run skips only the checksums: on any bytes it stays in
     * bounds, and where the full run decodes it writes the same bytes. */
    unsigned char *vdst = malloc(n);
    require(vdst != NULL, "malloc");
    memset(vdst, SENT, n);
    int vrc = kvs_block_decode_run_verified(run, run_len, (kvs_tile_kind)kind, h->num_kv_heads,
                                            h->block_tokens, h->head_dim, dt, vdst, NULL, NULL);
    if (rc == 0)
        require(vrc == 0 && memcmp(vdst, dst, n) == 0,
                "the _verified run disagrees with the full run on a run that decodes");
    free(vdst);
    if (rest > run_len) { /* with the layer's head 0 valid, the length alone is wrong */
        memset(dst, SENT, n);
        rc = kvs_block_decode_run(run, rest, (kvs_tile_kind)kind, h->num_kv_heads, h->block_tokens,
                                  h->head_dim, dt, dst, NULL, NULL);
        if (want)
            require(rc != 0 && untouched(dst, n),
                    "a run with bytes after its last tile decodes or writes");
    }
    free(dst);
}

/* Decodes layer l into fresh destinations, then its K and V runs
 * (decode_run); returns the layer decode's status. On failure the
 * destinations must be untouched. */
static int decode(const uint8_t *blk, size_t len, const kvs_block_hdr *h, uint32_t l, size_t elems,
                  kvs_dtype dt, int v_only)
{
    const size_t es = dt == KVS_DTYPE_FP32 ? 4 : 2;
    unsigned char *k = v_only ? NULL : malloc(elems * es);
    unsigned char *v = malloc(elems * es);
    require((v_only || k) && v, "malloc");
    if (k)
        memset(k, SENT, elems * es);
    memset(v, SENT, elems * es);
    int rc = kvs_block_decode_layer(blk, len, l, dt, k, v, NULL, NULL);
    if (rc != 0)
        require((!k || untouched(k, elems * es)) && untouched(v, elems * es),
                "a failed decode wrote to dst");
    decode_run(blk, len, h, l, KVS_TILE_K, dt, elems, rc == 0 ? k : NULL);
    decode_run(blk, len, h, l, KVS_TILE_V, dt, elems, rc == 0 ? v : NULL);
    free(k);
    free(v);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const unsigned mode = data[0];
    const size_t len = size - 1;
    uint8_t *blk = malloc(len ? len : 1); /* malloc: 8-byte aligned, like any real buffer */
    if (blk == NULL)
        return 0;
    memcpy(blk, data + 1, len);
    if (mode & KVS_FUZZ_MODE_SEAL)
        (void)kvs_block_seal(blk, len, NULL);

    kvs_block_hdr h;
    const kvs_dtype dt = (kvs_dtype)(KVS_DTYPE_FP16 + (mode >> 1) % 3u);
    const int ok = kvs_block_check(blk, len, &h, NULL) == 0;
    if (!ok && kvs_block_check_header(blk, len, &h, NULL) != 0) {
        /* Not even a header: every entry point must say so. */
        const void *t;
        size_t tl;
        require(kvs_block_tile(blk, len, 0, KVS_TILE_K, 0, &t, &tl, NULL) != 0 ||
                    (const uint8_t *)t + tl <= blk + len,
                "tile outside the block");
        free(blk);
        return 0;
    }
    const size_t elems = (size_t)h.block_tokens * h.num_kv_heads * h.head_dim;
    for (uint32_t l = 0; l < h.num_layers; l++) {
        uint64_t off, bytes;
        require(kvs_block_layer_range(blk, len, l, &off, &bytes, NULL) == 0, "layer range");
        if (off + bytes > len) {
            require(!ok, "an accepted block is shorter than its layers");
            break; /* the rest has not "arrived" */
        }
        int rc = decode(blk, len, &h, l, elems, dt, (int)(mode >> 4) & 1);
        if (ok)
            require(rc == 0, "an accepted block fails to decode a layer");
        if (!ok || rc != 0)
            continue;
        for (unsigned kind = KVS_TILE_K; kind <= KVS_TILE_V; kind++) {
            for (uint32_t hd = 0; hd < h.num_kv_heads; hd++) {
                const void *t;
                size_t tl;
                require(kvs_block_tile(blk, len, l, (kvs_tile_kind)kind, hd, &t, &tl, NULL) == 0,
                        "tile lookup in an accepted block");
                require((const uint8_t *)t >= blk + off &&
                            (const uint8_t *)t + tl <= blk + off + bytes,
                        "tile outside its layer");
            }
            uint8_t *codes = malloc(elems);
            float scale = -1.0f;
            require(codes != NULL, "malloc");
            require(kvs_block_requant_fp8(blk, len, l, (kvs_tile_kind)kind, codes, &scale, NULL) ==
                            0 &&
                        scale >= 0.0f,
                    "requant of an accepted block");
            free(codes);
        }
    }
    if (ok)
        kvs_fuzz_accepted++;
    free(blk);
    return 0;
}
