/*
 * bench_chain.h — the blocks the libkvstash benches (fetch_bench, soak_bench)
 * store before they measure: one block's worth of synthetic fp16 KV shared
 * by every layer, put as one chain through gRPC.
 */
#ifndef KVS_BENCH_CHAIN_H
#define KVS_BENCH_CHAIN_H

#include "kvstash.h"

#include <stdint.h>

/* Fills buf (block_tokens x num_kv_heads x head_dim fp16 values) with finite
 * values in 0.5..~1 and points kv[0..num_layers) at it. */
void kvs_bench_fill_kv(const kvs_ns *ns, uint16_t *buf, const void **kv);

/* Puts nb blocks of ns as one chain (block b: tokens b*T+1 .. b*T+T, parent
 * block b-1), each layer's K and V from kv, stored as fp16 (scheme 1);
 * keys[b] gets block b's key. 0, or -1 with the failing put said on stderr
 * (err holds the library's message). */
int kvs_bench_put_chain(kvs_client *c, const kvs_ns *ns, const void *const *kv, unsigned nb,
                        unsigned char (*keys)[32], char *err);

#endif /* KVS_BENCH_CHAIN_H */
