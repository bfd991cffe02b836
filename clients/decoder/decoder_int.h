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

#endif /* KVS_DECODER_INT_H */
