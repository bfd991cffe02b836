/*
 * decoder.h — the reference decoder worker: llama2.c checkpoints, a CPU
 * forward pass over a paged KV cache, and the workload driver that measures
 * what reused (quantized) KV does to TTFT and quality (DESIGN.md §8,
 * docs/DECODER.md).
 *
 * Three objects:
 *   kvs_model    the weights of one llama2.c checkpoint (or of a random
 *                synthetic model). The file is untrusted: kvs_model_load
 *                checks every header field and the exact file size before it
 *                reads a single weight.
 *   kvs_decoder  one sequence being decoded: its paged KV cache (pages of
 *                block_tokens tokens, each page holding every layer's K and V
 *                as [T][n_kv_heads][head_dim] fp32 — the tensor layout of a
 *                kvstash block, kv_block.h), and scratch buffers.
 *                Cached blocks drop into pages with kvs_decoder_page /
 *                kvs_decoder_extend; prefill and decode share one forward call.
 *   workload     (decoder_workload.c, kvs_workload_run) conversations sharing
 *                prefixes, run with and without reused KV.
 *
 * Arithmetic: fp32 throughout, keys cached after RoPE. The dot product of
 * every matrix-vector product sums in one fixed order whatever the batch size
 * and thread count, so a prompt prefilled in one call, token by token, or in
 * any number of pieces gives bit-identical logits and KV.
 *
 * Errors: 0 or a negative KVS_E* (kvs_error.h); err (KVS_ERR_LEN bytes, may be
 * NULL) receives one line naming the problem. KVS_EINVAL for bad arguments,
 * KVS_EFORMAT for a malformed checkpoint, KVS_EIO for the file system,
 * KVS_ENOMEM, KVS_ENOSPC when a sequence would pass the model's seq_len.
 *
 * Ownership: objects returned through out-params are owned by the caller and
 * freed with their *_free (NULL accepted). A decoder borrows its model, which
 * must outlive it. Not thread-safe per object; distinct decoders may run
 * concurrently on one model. The forward pass uses OpenMP threads when built
 * with it (OMP_NUM_THREADS caps them).
 */
#ifndef KVS_DECODER_H
#define KVS_DECODER_H

#include "kv_format.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bounds a checkpoint must respect (positive, and): */
#define KVS_MODEL_MAX_DIM    16384u
#define KVS_MODEL_MAX_HIDDEN 65536u
#define KVS_MODEL_MAX_LAYERS 256u
#define KVS_MODEL_MAX_HEADS  1024u /* query heads; kv heads also <= KVS_BLOCK_MAX_HEADS */
#define KVS_MODEL_MAX_VOCAB  (1u << 20)
#define KVS_MODEL_MAX_SEQ    (1u << 16)
#define KVS_MODEL_HDR_BYTES  28u /* 7 x int32 */
#define KVS_MODEL_BOS        1u

typedef struct kvs_model_config {
    uint32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
    int shared_classifier; /* 1: logits use the embedding (vocab_size was positive) */
    uint32_t head_dim;     /* dim / n_heads (derived) */
    uint32_t kv_dim;       /* n_kv_heads * head_dim (derived) */
} kvs_model_config;

typedef struct kvs_model kvs_model;

/* Validates a raw header against the size of the whole file: every field
 * positive and within the bounds above, n_heads divides dim, n_kv_heads
 * divides n_heads, head_dim even (RoPE rotates pairs) and <= KVS_TILE_MAX_DIM,
 * and file_size equal to what the header implies. Fills *cfg. 0 or
 * KVS_EFORMAT (err names the field and the values). */
int kvs_model_check_header(const int32_t hdr[7], uint64_t file_size, kvs_model_config *cfg,
                           char *err);

/* Bytes a checkpoint of cfg occupies (header included). */
uint64_t kvs_model_file_bytes(const kvs_model_config *cfg);

/* Loads and validates a checkpoint file (read into owned memory). The
 * fingerprint is "<basename without .bin>@<XXH3-64 of the file, 16 hex>". */
int kvs_model_load(const char *path, kvs_model **out, char *err);

/* Same for an in-memory image of len bytes (copied; buf may be freed after). */
int kvs_model_parse(const void *buf, size_t len, const char *name, kvs_model **out, char *err);

/* A model with random weights (fixed seed): N(0, 1/sqrt(fan_in)) matrices,
 * norms 1, shared classifier. cfg's derived fields are ignored; the same
 * bounds as a file apply. Fingerprint "synthetic-<dims, hidden included>@<seed>". */
int kvs_model_synthetic(const kvs_model_config *cfg, uint64_t seed, kvs_model **out, char *err);

/* Parses "dim=..,layers=..,heads=..,kv_heads=..,vocab=..,seq=..[,hidden=..]"
 * (hidden defaults to the llama rule: 2/3 of 4*dim rounded up to 32). */
int kvs_model_synthetic_spec(const char *spec, kvs_model_config *cfg, char *err);

const kvs_model_config *kvs_model_cfg(const kvs_model *m);
const char *kvs_model_fingerprint(const kvs_model *m); /* valid until kvs_model_free */
void kvs_model_free(kvs_model *m);

/* ---- decoding -------------------------------------------------------------- */

typedef struct kvs_decoder kvs_decoder;

/* A decoder with an empty cache of pages of block_tokens tokens
 * (KVS_BLOCK_MIN_TOKENS..KVS_BLOCK_MAX_TOKENS, or up to seq_len for one
 * contiguous page), capacity the model's seq_len. */
int kvs_decoder_create(const kvs_model *m, uint32_t block_tokens, kvs_decoder **out, char *err);
void kvs_decoder_free(kvs_decoder *d);

/* Tokens whose KV is in the cache (the next position to be fed). */
uint32_t kvs_decoder_len(const kvs_decoder *d);
uint32_t kvs_decoder_block_tokens(const kvs_decoder *d);

/* Feeds n tokens at positions len..len+n-1 (prefill when n > 1): their K and
 * V go into the cache, len grows by n. logits, when not NULL, receives
 * n x vocab_size values (row i: the next-token logits after token i); last,
 * when not NULL, receives the vocab_size logits after the last token. Token
 * ids >= vocab_size give KVS_EINVAL, len + n > seq_len KVS_ENOSPC; nothing
 * changes on error. */
int kvs_decoder_forward(kvs_decoder *d, const uint32_t *tokens, uint32_t n, float *logits,
                        float *last, char *err);

/* Drops every token from position len on (len <= current length). */
int kvs_decoder_truncate(kvs_decoder *d, uint32_t len);

/* Layer tensor of one page: [block_tokens][n_kv_heads][head_dim] fp32 of
 * layer's K (kind KVS_TILE_K) or V, allocated on demand. Page p holds
 * positions p*T .. p*T+T-1. Valid until kvs_decoder_free. NULL when page or
 * layer is out of range or memory runs out. */
float *kvs_decoder_page(kvs_decoder *d, uint32_t page, uint32_t layer, kvs_tile_kind kind);

/* Declares that the caller wrote the KV of positions len..len+n-1 into the
 * pages (a cached block dropped in); len grows by n. KVS_ENOSPC past seq_len,
 * KVS_ENOMEM when a page cannot be allocated. */
int kvs_decoder_extend(kvs_decoder *d, uint32_t n);

/* Rotates n key rows (each kv_dim floats, [n_kv_heads][head_dim], rows kv_dim
 * apart) as the forward pass rotates the keys of positions pos0..pos0+n-1
 * (inverse == 0), or by the opposite angles (inverse != 0). A pre-RoPE key
 * rotated here gets exactly the forward pass's arithmetic, so a block stored
 * pre-RoPE becomes a page again by decoding it and rotating its K. The
 * inverse undoes the rotation to within a few ulp, not bit for bit.
 * KVS_EINVAL for a NULL argument or pos0 + n > seq_len. */
int kvs_decoder_rope_keys(const kvs_decoder *d, float *k, uint32_t pos0, uint32_t n, int inverse);

/* The precision of the KV cache: KVS_DTYPE_FP32 (the default) keeps K and V
 * as computed; KVS_DTYPE_FP16 or KVS_DTYPE_BF16 rounds every value to that
 * type (kvq_math.h, round to nearest even) as it enters the cache, as an
 * engine with an fp16 or bf16 KV cache does. Pages stay fp32 containers.
 * Applies to later forward calls. KVS_EINVAL for another dtype. */
int kvs_decoder_set_kv_dtype(kvs_decoder *d, kvs_dtype dt);

/* When q is not NULL, every later forward call also stores the post-RoPE
 * queries of each position p it feeds, layer l, at q + (l * seq_len + p) * dim
 * (caller-owned, n_layers * seq_len * dim floats, borrowed until replaced
 * with NULL). For KV sample files that carry the model's own queries. */
void kvs_decoder_capture_q(kvs_decoder *d, float *q);

/* Index of the largest logit (lowest index on ties). */
uint32_t kvs_argmax(const float *x, uint32_t n);

/* ---- the workload driver (decoder_workload.c) -------------------------------
 * Conversations that share prefixes — a few system prompts, two long shared
 * documents, multi-turn growth (each turn's prompt is the previous prompt, the
 * fp32 greedy answer and a new user message), a few short chats — with token
 * streams sampled from the model itself from BOS (fixed seed), or uniform
 * random ids for synthetic models. Requests run turn-major (turn 0 of every
 * conversation, then turn 1, ...). Every request runs twice, one after the
 * other: the fp32 no-cache baseline (prefill the whole prompt, then greedy
 * decoding of gen_tokens), and the measured run, which reuses the longest
 * cached prefix of whole blocks (at most (P-1)/T blocks, so at least one
 * prompt token is computed), prefills the rest, then is fed the baseline's
 * greedy tokens (teacher forcing), so both runs predict at the same contexts.
 * Quality compares the two next-token distributions at each of those
 * positions: KL(p_fp32 || p_run), top-1 agreement, and the perplexity of the
 * greedy continuation under each; TTFT is the wall time from the request to
 * the first token's logits (lookup, fetch and dequantization included).
 * After each measured run its new full blocks are stored (off the TTFT path).
 *
 * Modes: NO_CACHE runs the baseline only. LOCAL_QUANT keeps the blocks in an
 * in-process store, encoded by kvs_block_encode with the scheme and the
 * defaults of kvq_calib.h (kK, kV, one sink row in root blocks) and decoded by
 * kvs_block_decode_layer: exactly what a server's quantize-on-ingest does to
 * the KV, without a server. SERVER does it through kvstashd (libkvstash):
 * Lookup of the prompt's whole blocks, Get of the hits layer by layer (fp32 or
 * fp16 egress) straight into the pages, and the new full blocks put as a
 * chain of kvs_client_put_async calls (each block's parent is the key the
 * previous Put returned). Puts are off the TTFT path; the next request waits
 * for them before its clock starts, so what it finds does not depend on
 * thread timing. Namespace: model = the model's fingerprint, layout from the
 * config and block_tokens, dtype fp32, salt = opts.salt or else the scheme's
 * name (so runs of different schemes on one server never share blocks). */

typedef enum kvs_wl_mode {
    KVS_WL_NO_CACHE = 0,
    KVS_WL_LOCAL_QUANT = 1,
    KVS_WL_SERVER = 2,
} kvs_wl_mode;

/* Where the stored blocks' keys are taken: after RoPE, as the cache holds
 * them (the default), or before it: the rotation undone on put
 * (kvs_decoder_rope_keys, inverse) and redone after a fetch, at the positions
 * the block's place in the chain gives. Per-channel K scales can fit
 * pre-RoPE keys better where keys have outlier channels: RoPE mixes each
 * channel pair at a position-dependent angle, which spreads a channel's range
 * over its pair (KVQuant, Hooper et al. 2024). On stories260K it does not help
 * (docs/QUALITY.md §8). Pre-RoPE fp16 blocks are not exact under an fp16
 * cache. The choice is part of the local store's namespace. */
typedef enum kvs_wl_k_rope {
    KVS_WL_K_POST_ROPE = 0,
    KVS_WL_K_PRE_ROPE = 1,
} kvs_wl_k_rope;

typedef struct kvs_wl_opts {
    kvs_wl_mode mode;
    kvs_scheme scheme;      /* LOCAL_QUANT, SERVER: fp16, fp8_e4m3, fp8_e5m2, int8 */
    uint32_t block_tokens;  /* T, KVS_BLOCK_MIN_TOKENS..KVS_BLOCK_MAX_TOKENS (32) */
    uint32_t conversations; /* 1..4096 (16) */
    uint32_t turns;         /* per conversation, 1..64 (4); fewer when max_context is reached */
    uint32_t gen_tokens;    /* generated and scored per request, 1..1024 (32) */
    uint32_t max_context;   /* prompt + generation, <= the model's seq_len (512) */
    uint64_t seed;          /* prompt sampling (1) */
    int random_prompts;     /* nonzero: uniform random ids, not sampled from the model */
    const char *dump_dir;   /* NULL, or: write DIR/conv<c>.kvsm, the fp32 K, V and Q of
                             * each conversation's last (longest) request (KVSM,
                             * kvq_calib.h; every request rewrites its file) */
    FILE *log;              /* one line per request, or NULL */
    const char *server;     /* SERVER: "host:port" of a kvstashd */
    const char *token;      /* SERVER: bearer token, or NULL */
    int egress_fp16;        /* SERVER: Get as fp16 (else fp32) */
    const char *salt;       /* SERVER: namespace salt; NULL: the scheme's name */
    /* LOCAL_QUANT, 8-bit schemes: outliers per K / V group (0..16) and fp16 sink rows
     * of root blocks (0..64, capped at block_tokens); defaults from kvq_calib.h. The
     * server takes these from its own settings. */
    uint32_t k_outliers, v_outliers, sinks;
    /* KV cache precision of both runs (kvs_decoder_set_kv_dtype): FP32 (default),
     * FP16 or BF16. With FP16, reused fp16 blocks are exact. */
    kvs_dtype kv_dtype;
    int ucx; /* SERVER: fetch over the UCX data plane (kvs_client_fetch_into; gRPC fallback) */
    int seal_fetches;     /* with ucx: kvs_client_opts.ucx_seal_fetches = 1 (docs/TRANSFER.md) */
    kvs_wl_k_rope k_rope; /* LOCAL_QUANT: keys stored post-RoPE (default) or pre-RoPE */
    /* LOCAL_QUANT: nonzero for the layers stored at fp16 whatever the scheme, as a
     * server's skip_layers (docs/OPERATIONS.md); all zero by default. A server takes
     * them from its own settings. */
    uint8_t skip_layer[KVS_MODEL_MAX_LAYERS];
    /* LOCAL_QUANT, 8-bit schemes: nonzero stores per-channel key offsets in the
     * K tiles of the 8-bit layers (kvs_block_params.key_offsets, kv_format.h
     * rule 5; 2 * head_dim bytes more per K tile, docs/QUALITY.md §10). 0 by
     * default; a server takes it from its own settings. */
    int key_offsets;
} kvs_wl_opts;

#define KVS_WL_NEAR_TIE 0.1

/* Context-length buckets of a scored position: <= 64, 128, 256, 512, more. */
#define KVS_WL_BUCKETS 5

typedef struct kvs_wl_quality {
    uint64_t positions; /* next-token distributions compared */
    uint64_t top1;      /* of which the argmax agreed */
    uint64_t near_tie;  /* disagreements where the fp32 log-probabilities of the two
                         * tokens differ by less than KVS_WL_NEAR_TIE */
    double kl_sum;      /* sum of KL(p_fp32 || p_run), nats */
    double kl_max;
    double nll_base; /* sum of -log p_fp32(greedy token) */
    double nll_run;  /* sum of -log p_run(greedy token) */
} kvs_wl_quality;

typedef struct kvs_wl_report {
    uint32_t requests;
    uint64_t prompt_tokens, reused_tokens, gen_tokens;
    double ttft_p50_ms, ttft_p99_ms;           /* measured run */
    double base_ttft_p50_ms, base_ttft_p99_ms; /* fp32 no-cache baseline, same prompts */
    double ttft_ratio;                         /* ttft_p50_ms / base_ttft_p50_ms */
    double prefill_tok_s, decode_tok_s;        /* computed prompt tokens / s, decode tokens / s */
    double base_prefill_tok_s, base_decode_tok_s;
    uint64_t blocks_stored, bytes_stored;
    uint64_t blocks_koff;    /* LOCAL_QUANT: stored blocks whose header, read back, has
                              * KVS_BLOCK_F_KOFF */
    uint64_t blocks_already; /* SERVER: puts the server answered "already present" */
    double put_ms;           /* total encode (put) time, off the TTFT path */
    /* SERVER: the cache is an optimisation, never a dependency. A server that
     * cannot be reached, a fetch that fails (server gone, a block that fails
     * its checksum) or a put that fails is logged on stderr, counted here, and
     * the prompt is prefilled in full instead. */
    int server_down;         /* kvstashd unreachable at start: every prompt prefilled */
    uint64_t fetch_failures; /* fetches abandoned: those prompts recomputed */
    uint64_t put_failures;   /* puts that did not store (or were not issued) */
    kvs_wl_quality all, bucket[KVS_WL_BUCKETS];
} kvs_wl_report;

void kvs_wl_opts_default(kvs_wl_opts *o);

/* Runs the workload on m. 0, KVS_EINVAL (bad options), KVS_ENOMEM, KVS_EIO
 * (dump files) or what a kernel call returned. */
int kvs_workload_run(const kvs_model *m, const kvs_wl_opts *o, kvs_wl_report *r, char *err);

/* The human-readable report; its last line is exactly
 * RESULT scheme=<s> top1=<x> kl=<y> ttft_ratio=<z> reused_tokens=<n>
 * (scheme "none" without a cache). */
void kvs_wl_report_print(const kvs_model *m, const kvs_wl_opts *o, const kvs_wl_report *r, FILE *f);

/* Writes the first len positions of the decoder's cache as a KVSM sample
 * file (fp32, post-RoPE keys; with q, as captured by kvs_decoder_capture_q,
 * the queries too). 0, KVS_EINVAL, KVS_ENOMEM or KVS_EIO. */
int kvs_decoder_dump_kv(kvs_decoder *d, const float *q, uint32_t len, const char *path, char *err);

#ifdef __cplusplus
}
#endif

#endif /* KVS_DECODER_H */
