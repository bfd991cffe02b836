/*
 * bench_chain.c — see bench_chain.h.
 */
#include "bench_chain.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvs_bench_fill_kv(const kvs_ns *ns, uint16_t *buf, const void **kv)
{
    size_t elems = (size_t)ns->block_tokens * ns->num_kv_heads * ns->head_dim;
    for (size_t i = 0; i < elems; i++)
        buf[i] = (uint16_t)(0x3800u + (i * 2654435761u >> 22)); /* finite fp16 0.5..~1 */
    for (unsigned l = 0; l < ns->num_layers; l++)
        kv[l] = buf;
}

int kvs_bench_put_chain(kvs_client *c, const kvs_ns *ns, const void *const *kv, unsigned nb,
                        unsigned char (*keys)[32], char *err)
{
    const unsigned T = ns->block_tokens;
    unsigned *tokens = malloc(sizeof *tokens * T);
    if (tokens == NULL) {
        fprintf(stderr, "put: out of memory\n");
        return -1;
    }
    int rc = 0;
    for (unsigned b = 0; b < nb && rc == 0; b++) {
        for (unsigned i = 0; i < T; i++)
            tokens[i] = b * T + i + 1;
        kvs_put_args a = {.ns = ns,
                          .parent_key = b ? keys[b - 1] : NULL,
                          .index = b,
                          .tokens = tokens,
                          .scheme = 1,
                          .k = kv,
                          .v = kv};
        kvs_put_result r;
        memset(&r, 0, sizeof r);
        if (kvs_client_put(c, &a, -1, &r, err) != 0) {
            fprintf(stderr, "put %u: %s\n", b, err);
            rc = -1;
        } else {
            memcpy(keys[b], r.key, 32);
        }
    }
    free(tokens);
    return rc;
}
