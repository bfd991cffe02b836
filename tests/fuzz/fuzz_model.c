/*
 * fuzz_model.c — libFuzzer target for the llama2.c checkpoint loader
 * (kvs_model_parse, the in-memory twin of kvs_model_load): the input is the
 * whole file. An accepted checkpoint then runs: a decoder over one page of
 * seq_len tokens greedily feeds up to 3 tokens from BOS (the weights may be
 * NaN or ±Inf: the forward pass must still return, and argmax a valid id).
 *
 * Invariants (abort when broken):
 *   - a refused file gets KVS_EFORMAT (or KVS_ENOMEM) with a message, and no model;
 *   - an accepted file is exactly kvs_model_file_bytes(cfg) long, and cfg's
 *     derived fields agree with the header's;
 *   - the decoder accepts the model; forward returns 0 up to seq_len tokens,
 *     then KVS_ENOSPC; a token id >= vocab_size is KVS_EINVAL;
 *   - argmax of any logits row is < vocab_size.
 */
#include "decoder.h"
#include "fuzz_target.h"
#include "kvs_error.h"

#include <stdlib.h>

unsigned long kvs_fuzz_accepted;

#define REQUIRE(c, what) kvs_fuzz_require((c), "fuzz_model", (what))

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[KVS_ERR_LEN] = "";
    kvs_model *m = NULL;
    int rc = kvs_model_parse(data, size, "fuzz", &m, err);
    if (rc != 0) {
        REQUIRE(m == NULL, "a refused checkpoint left a model");
        REQUIRE(rc == KVS_EFORMAT || rc == KVS_ENOMEM, "refused with an unexpected status");
        REQUIRE(err[0] != '\0', "refused without a message");
        return 0;
    }
    kvs_fuzz_accepted++;
    const kvs_model_config *cfg = kvs_model_cfg(m);
    REQUIRE(kvs_model_file_bytes(cfg) == size, "accepted a file of the wrong size");
    REQUIRE(cfg->head_dim * cfg->n_heads == cfg->dim, "head_dim * n_heads != dim");
    REQUIRE(cfg->kv_dim == cfg->n_kv_heads * cfg->head_dim, "kv_dim wrong");
    REQUIRE(cfg->seq_len >= 1 && cfg->vocab_size >= 1, "empty seq or vocab accepted");

    kvs_decoder *d = NULL;
    rc = kvs_decoder_create(m, cfg->seq_len, &d, err);
    REQUIRE(rc == 0 || rc == KVS_ENOMEM, "decoder refused an accepted model");
    if (rc == 0) {
        float *last = malloc((size_t)cfg->vocab_size * sizeof *last);
        REQUIRE(last != NULL, "out of memory");
        uint32_t bad = cfg->vocab_size;
        REQUIRE(kvs_decoder_forward(d, &bad, 1, NULL, last, err) == KVS_EINVAL,
                "token id >= vocab_size accepted");
        uint32_t tok = KVS_MODEL_BOS < cfg->vocab_size ? KVS_MODEL_BOS : 0;
        uint32_t steps = cfg->seq_len < 3 ? cfg->seq_len : 3;
        for (uint32_t i = 0; i < steps; i++) {
            REQUIRE(kvs_decoder_forward(d, &tok, 1, NULL, last, err) == 0, "forward failed");
            tok = kvs_argmax(last, cfg->vocab_size);
            REQUIRE(tok < cfg->vocab_size, "argmax out of range");
        }
        REQUIRE(kvs_decoder_len(d) == steps, "cache length wrong");
        if (steps == cfg->seq_len)
            REQUIRE(kvs_decoder_forward(d, &tok, 1, NULL, last, err) == KVS_ENOSPC,
                    "forward past seq_len did not give KVS_ENOSPC");
        free(last);
        kvs_decoder_free(d);
    }
    kvs_model_free(m);
    return 0;
}
