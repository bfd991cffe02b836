/*
 * decoder_int.h — internals shared by the files of clients/decoder (not API).
 */
#ifndef KVS_DECODER_INT_H
#define KVS_DECODER_INT_H

#include "decoder.h"

struct kvs_model {
    kvs_model_config cfg;
    float *w; /* owned, 64-byte aligned, n_floats weights in file order */
    size_t n_floats;
    /* views into w */
    float *tok_emb, *rms_att, *wq, *wk, *wv, *wo, *rms_ffn, *w1, *w2, *w3, *rms_final, *wcls;
    char fingerprint[96];
};

/* The model a decoder borrows. */
const kvs_model *kvs__decoder_model(const kvs_decoder *d);

/* The workload's cache through kvstashd (decoder_server.c). */
typedef struct kvs__srv kvs__srv;
int kvs__srv_open(const kvs_model *m, const kvs_wl_opts *o, kvs__srv **out, char *err);
/* Longest cached prefix of tokens, at most max_blocks blocks, into d's pages
 * (d empty, else KVS_EINVAL); *reused tokens. Remembers the matched keys for
 * the next put. On an error d's length is unchanged, though the pages past
 * it may hold part of the blocks: the next forward rewrites them. */
int kvs__srv_fetch(kvs__srv *s, kvs_decoder *d, const uint32_t *tokens, uint32_t max_blocks,
                   uint32_t *reused, char *err);
/* Puts the full blocks of tokens[0..len) past the last fetch's hits, async. */
int kvs__srv_put(kvs__srv *s, kvs_decoder *d, const uint32_t *tokens, uint32_t len, char *err);
/* Waits for every put; fills r's stored counts; an error when any put failed. */
int kvs__srv_drain(kvs__srv *s, kvs_wl_report *r, char *err);
void kvs__srv_close(kvs__srv *s);
/* The fetch's fp16 widening: each of the count page tensors dst[i] of n floats
 * holds n fp16 values in its first half; they become the n floats in place
 * (F16C where kernels/cpu's AVX2 path is on, else scalar; the same bits). */
void kvs__srv_widen_pages(void *const *dst, size_t count, size_t n);

#endif /* KVS_DECODER_INT_H */
