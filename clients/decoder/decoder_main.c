/*
 * decoder_main.c — kvstash-decoder, the reference decoder worker's command
 * line (docs/DECODER.md).
 *
 *   kvstash-decoder --model FILE --greedy N [--print-ids]   greedy ids from BOS
 *   kvstash-decoder workload --model FILE [--no-cache | --local-quant SCHEME] ...
 *
 * Exit status: 0 success, 1 a runtime error (message on stderr naming it),
 * 2 a usage error.
 */
#include "decoder.h"

#include "kvq_calib.h"
#include "kvs_error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: kvstash-decoder MODEL --greedy N [--print-ids] [--prompt IDS] [--dump-kv DIR]\n"
        "       kvstash-decoder workload MODEL [--no-cache | --local-quant SCHEME |\n"
        "                       --server ADDR [--scheme SCHEME] [--token T] [--egress fp32|fp16]\n"
        "                       [--salt S] [--ucx [--seal-fetches]]]\n"
        "                       [--conversations N] [--turns N] [--gen N] [--max-context N]\n"
        "                       [--prompt-seed S] [--random-prompts] [--dump-kv DIR] [-v]\n"
        "                       [--k-outliers N] [--v-outliers N] [--sinks N]\n"
        "                       [--skip-layers L] [--k-rope post|pre] [--k-offsets] (local)\n"
        "MODEL: --model FILE (llama2.c checkpoint) or --synthetic-model\n"
        "       dim=..,layers=..,heads=..,kv_heads=..,vocab=..,seq=..[,hidden=..] [--seed S]\n"
        "common: --block-tokens T (KV page and block size, default 32)\n"
        "greedy: N ids generated greedily after BOS (id 1), or after --prompt 1,5,7\n"
        "        (comma-separated ids); --print-ids prints only the ids, on one line.\n"
        "workload: conversations sharing prefixes; TTFT, reuse and quality against an\n"
        "        fp32 no-cache run (decoder.h). SCHEME: fp16, fp8_e4m3, fp8_e5m2, int8.\n"
        "        --server ADDR: reuse through kvstashd (Lookup, Get by layer, async Put);\n"
        "        --scheme: how the server stores the blocks (default int8); --salt: the\n"
        "        namespace salt (default: the scheme's name).\n"
        "--dump-kv DIR: write KVSM sample files (fp32 K, V and Q, post-RoPE) that\n"
        "        `kvstash calibrate` and kvq_quality read.\n");
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kvstash-decoder: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    usage(stderr);
    return 2;
}

static int parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (s[0] == '\0' || s[0] == '-' || *end != '\0' || errno != 0 || v < lo || v > hi)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

/* "0,30-31": layers and inclusive ranges, each below KVS_MODEL_MAX_LAYERS;
 * sets their flags. 0, or -1 on anything else (empty items, N-M with M < N,
 * signs, spaces). */
static int parse_layers(const char *s, uint8_t *flags)
{
    const char *p = s;
    do {
        uint32_t lo, hi;
        char *end;
        if (*p < '0' || *p > '9')
            return -1;
        errno = 0;
        unsigned long v = strtoul(p, &end, 10);
        if (errno || v >= KVS_MODEL_MAX_LAYERS)
            return -1;
        lo = hi = (uint32_t)v;
        if (*end == '-') {
            p = end + 1;
            if (*p < '0' || *p > '9')
                return -1;
            v = strtoul(p, &end, 10);
            if (errno || v >= KVS_MODEL_MAX_LAYERS || v < lo)
                return -1;
            hi = (uint32_t)v;
        }
        if (*end != ',' && *end != '\0')
            return -1;
        for (uint32_t l = lo; l <= hi; l++)
            flags[l] = 1;
        p = *end == ',' ? end + 1 : end;
        if (*end == ',' && *p == '\0')
            return -1;
    } while (*p);
    return 0;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

typedef struct args {
    const char *model_path, *synthetic, *prompt, *dump_dir, *server;
    uint64_t seed;
    uint32_t block_tokens, greedy;
    int print_ids, workload, verbose, have_greedy;
    kvs_wl_opts wl;
} args;

static int parse_args(int argc, char **argv, args *a)
{
    memset(a, 0, sizeof *a);
    kvs_wl_opts_default(&a->wl);
    a->block_tokens = 32;
    a->seed = 1;
    int i = 1;
    if (argc > 1 && strcmp(argv[1], "workload") == 0)
        a->workload = 1, i = 2;
    int scheme_given = 0, cache_mode_given = 0, quant_knobs = 0;
    for (; i < argc; i++) {
        const char *o = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDS_VALUE()                                                                              \
    do {                                                                                           \
        if (v == NULL)                                                                             \
            return usage_error("%s needs a value", o);                                             \
        i++;                                                                                       \
    } while (0)
        if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(o, "--model") == 0) {
            NEEDS_VALUE();
            a->model_path = v;
        } else if (strcmp(o, "--synthetic-model") == 0) {
            NEEDS_VALUE();
            a->synthetic = v;
        } else if (strcmp(o, "--seed") == 0) {
            NEEDS_VALUE();
            char *end;
            errno = 0;
            a->seed = strtoull(v, &end, 10);
            if (*end || errno || v[0] == '-')
                return usage_error("--seed: expected a non-negative integer, got '%s'", v);
        } else if (strcmp(o, "--block-tokens") == 0) {
            NEEDS_VALUE();
            if (parse_u32(v, KVS_BLOCK_MIN_TOKENS, KVS_BLOCK_MAX_TOKENS, &a->block_tokens) != 0)
                return usage_error("--block-tokens: expected %u..%u, got '%s'",
                                   KVS_BLOCK_MIN_TOKENS, KVS_BLOCK_MAX_TOKENS, v);
        } else if (strcmp(o, "--dump-kv") == 0) {
            NEEDS_VALUE();
            a->dump_dir = v;
        } else if (!a->workload && strcmp(o, "--greedy") == 0) {
            NEEDS_VALUE();
            if (parse_u32(v, 1, KVS_MODEL_MAX_SEQ, &a->greedy) != 0)
                return usage_error("--greedy: expected 1..%u, got '%s'", KVS_MODEL_MAX_SEQ, v);
            a->have_greedy = 1;
        } else if (!a->workload && strcmp(o, "--print-ids") == 0) {
            a->print_ids = 1;
        } else if (!a->workload && strcmp(o, "--prompt") == 0) {
            NEEDS_VALUE();
            a->prompt = v;
        } else if (strcmp(o, "--no-cache") == 0) {
            a->wl.mode = KVS_WL_NO_CACHE;
            cache_mode_given = 1;
        } else if (a->workload && strcmp(o, "--local-quant") == 0) {
            NEEDS_VALUE();
            kvs_scheme s;
            if (kvs_scheme_parse(v, &s) != 0)
                return usage_error("--local-quant: expected fp16, fp8_e4m3, fp8_e5m2 or int8, "
                                   "got '%s'",
                                   v);
            a->wl.mode = KVS_WL_LOCAL_QUANT;
            a->wl.scheme = s;
            cache_mode_given = 1;
        } else if (strcmp(o, "--scheme") == 0) {
            NEEDS_VALUE();
            if (kvs_scheme_parse(v, &a->wl.scheme) != 0)
                return usage_error("--scheme: expected fp16, fp8_e4m3, fp8_e5m2 or int8, got '%s'",
                                   v);
            scheme_given = 1;
        } else if (strcmp(o, "--server") == 0) {
            NEEDS_VALUE();
            a->server = v;
        } else if (strcmp(o, "--kv-dtype") == 0) {
            NEEDS_VALUE();
            if (strcmp(v, "fp32") == 0)
                a->wl.kv_dtype = KVS_DTYPE_FP32;
            else if (strcmp(v, "fp16") == 0)
                a->wl.kv_dtype = KVS_DTYPE_FP16;
            else if (strcmp(v, "bf16") == 0)
                a->wl.kv_dtype = KVS_DTYPE_BF16;
            else
                return usage_error("--kv-dtype: expected fp32, fp16 or bf16, got '%s'", v);
        } else if (a->workload && strcmp(o, "--salt") == 0) {
            NEEDS_VALUE();
            a->wl.salt = v;
        } else if (a->workload && strcmp(o, "--ucx") == 0) {
            a->wl.ucx = 1;
        } else if (a->workload && strcmp(o, "--seal-fetches") == 0) {
            a->wl.seal_fetches = 1;
        } else if (a->workload && strcmp(o, "--token") == 0) {
            NEEDS_VALUE();
            a->wl.token = v;
        } else if (a->workload && strcmp(o, "--egress") == 0) {
            NEEDS_VALUE();
            if (strcmp(v, "fp32") == 0)
                a->wl.egress_fp16 = 0;
            else if (strcmp(v, "fp16") == 0)
                a->wl.egress_fp16 = 1;
            else
                return usage_error("--egress: expected fp32 or fp16, got '%s'", v);
        } else if (a->workload && strcmp(o, "--conversations") == 0) {
            NEEDS_VALUE();
            if (parse_u32(v, 1, 4096, &a->wl.conversations) != 0)
                return usage_error("--conversations: expected 1..4096, got '%s'", v);
        } else if (a->workload && strcmp(o, "--turns") == 0) {
            NEEDS_VALUE();
            if (parse_u32(v, 1, 64, &a->wl.turns) != 0)
                return usage_error("--turns: expected 1..64, got '%s'", v);
        } else if (a->workload && strcmp(o, "--gen") == 0) {
            NEEDS_VALUE();
            if (parse_u32(v, 1, 1024, &a->wl.gen_tokens) != 0)
                return usage_error("--gen: expected 1..1024, got '%s'", v);
        } else if (a->workload && strcmp(o, "--max-context") == 0) {
            NEEDS_VALUE();
            if (parse_u32(v, 1, KVS_MODEL_MAX_SEQ, &a->wl.max_context) != 0)
                return usage_error("--max-context: expected 1..%u, got '%s'", KVS_MODEL_MAX_SEQ, v);
        } else if (a->workload && strcmp(o, "--prompt-seed") == 0) {
            NEEDS_VALUE();
            char *end;
            errno = 0;
            a->wl.seed = strtoull(v, &end, 10);
            if (*end || errno || v[0] == '-')
                return usage_error("--prompt-seed: expected a non-negative integer, got '%s'", v);
        } else if (a->workload && (strcmp(o, "--k-outliers") == 0 ||
                                   strcmp(o, "--v-outliers") == 0 || strcmp(o, "--sinks") == 0)) {
            NEEDS_VALUE();
            uint32_t *dst = o[2] == 'k'   ? &a->wl.k_outliers
                            : o[2] == 'v' ? &a->wl.v_outliers
                                          : &a->wl.sinks;
            uint32_t max = o[2] == 's' ? KVS_TILE_MAX_SINKS : KVS_TILE_MAX_OUTLIERS;
            if (parse_u32(v, 0, max, dst) != 0)
                return usage_error("%s: expected 0..%u, got '%s'", o, max, v);
            quant_knobs = 1;
        } else if (a->workload && strcmp(o, "--skip-layers") == 0) {
            NEEDS_VALUE();
            if (parse_layers(v, a->wl.skip_layer) != 0)
                return usage_error("--skip-layers: expected layers like 0,3-4 (each < %u), got "
                                   "'%s'",
                                   KVS_MODEL_MAX_LAYERS, v);
            quant_knobs = 1;
        } else if (a->workload && strcmp(o, "--k-rope") == 0) {
            NEEDS_VALUE();
            if (strcmp(v, "pre") == 0)
                a->wl.k_rope = KVS_WL_K_PRE_ROPE;
            else if (strcmp(v, "post") == 0)
                a->wl.k_rope = KVS_WL_K_POST_ROPE;
            else
                return usage_error("--k-rope: expected pre or post, got '%s'", v);
            quant_knobs = 1;
        } else if (a->workload && strcmp(o, "--k-offsets") == 0) {
            a->wl.key_offsets = 1;
            quant_knobs = 1;
        } else if (a->workload && strcmp(o, "--random-prompts") == 0) {
            a->wl.random_prompts = 1;
        } else if (a->workload && (strcmp(o, "-v") == 0 || strcmp(o, "--verbose") == 0)) {
            a->verbose = 1;
        } else {
            return usage_error("unknown option '%s'", o);
        }
#undef NEEDS_VALUE
    }
    if ((a->model_path != NULL) == (a->synthetic != NULL))
        return usage_error("give exactly one of --model FILE and --synthetic-model SPEC");
    if (!a->workload && !a->have_greedy)
        return usage_error("--greedy N is required (or the workload subcommand)");
    if (a->server != NULL && !a->workload)
        return usage_error("--server is a workload option");
    if (a->server != NULL && cache_mode_given)
        return usage_error("--server cannot be combined with --no-cache or --local-quant");
    if (a->server != NULL)
        a->wl.mode = KVS_WL_SERVER, a->wl.server = a->server;
    if (quant_knobs && a->wl.mode != KVS_WL_LOCAL_QUANT)
        return usage_error("--k-outliers, --v-outliers, --sinks, --skip-layers, --k-rope and "
                           "--k-offsets need --local-quant (a server takes them from its "
                           "settings)");
    if (scheme_given && a->server == NULL)
        return usage_error("--scheme needs --server; use --local-quant SCHEME without a server");
    if ((a->wl.token || a->wl.egress_fp16 || a->wl.salt || a->wl.ucx) && a->server == NULL)
        return usage_error("--token, --egress, --salt and --ucx need --server");
    if (a->wl.seal_fetches && !a->wl.ucx)
        return usage_error("--seal-fetches needs --ucx");
    a->wl.block_tokens = a->block_tokens;
    a->wl.dump_dir = a->dump_dir;
    return 0;
}

static int load_model(const args *a, kvs_model **m)
{
    char err[KVS_ERR_LEN] = "";
    int rc;
    if (a->model_path) {
        rc = kvs_model_load(a->model_path, m, err);
    } else {
        kvs_model_config cfg;
        rc = kvs_model_synthetic_spec(a->synthetic, &cfg, err);
        if (rc != 0) {
            fprintf(stderr, "kvstash-decoder: --synthetic-model: %s\n", err);
            return 2;
        }
        rc = kvs_model_synthetic(&cfg, a->seed, m, err);
    }
    if (rc != 0) {
        fprintf(stderr, "kvstash-decoder: %s\n", err);
        return a->synthetic ? 2 : 1;
    }
    return 0;
}

/* Comma-separated ids; 0 or -1 with a message. */
static int parse_prompt(const char *s, uint32_t vocab, uint32_t **ids, uint32_t *n)
{
    size_t cap = 1;
    for (const char *p = s; *p; p++)
        cap += *p == ',';
    *ids = malloc(cap * sizeof **ids);
    if (*ids == NULL)
        return -1;
    *n = 0;
    const char *p = s;
    while (1) {
        char *end;
        errno = 0;
        unsigned long v = strtoul(p, &end, 10);
        if (end == p || errno || v >= vocab || p[0] == '-' || (*end != ',' && *end != '\0')) {
            fprintf(stderr, "kvstash-decoder: --prompt: id %u: expected an integer below %u\n", *n,
                    vocab);
            free(*ids);
            return -1;
        }
        (*ids)[(*n)++] = (uint32_t)v;
        if (*end == '\0')
            break;
        p = end + 1;
    }
    return 0;
}

static int run_greedy(const args *a, const kvs_model *m)
{
    const kvs_model_config *c = kvs_model_cfg(m);
    char err[KVS_ERR_LEN] = "";
    uint32_t *prompt = NULL, np = 1, bos = KVS_MODEL_BOS;
    if (a->prompt && parse_prompt(a->prompt, c->vocab_size, &prompt, &np) != 0)
        return 2;
    if ((uint64_t)np + a->greedy - 1 > c->seq_len) {
        fprintf(stderr, "kvstash-decoder: prompt %u + %u generated tokens pass seq_len %u\n", np,
                a->greedy, c->seq_len);
        free(prompt);
        return 2;
    }
    kvs_decoder *d = NULL;
    float *logits = malloc(c->vocab_size * sizeof(float));
    uint32_t *out = malloc(a->greedy * sizeof *out);
    float *qcap = NULL;
    if (a->dump_dir)
        qcap = malloc((size_t)c->n_layers * c->seq_len * c->dim * sizeof(float));
    int rc = kvs_decoder_create(m, a->block_tokens, &d, err);
    if (rc == 0 && (logits == NULL || out == NULL || (a->dump_dir && qcap == NULL)))
        rc = kvs_fail(err, KVS_ENOMEM, "out of memory");
    if (rc == 0) {
        kvs_decoder_capture_q(d, qcap);
        kvs_decoder_set_kv_dtype(d, a->wl.kv_dtype);
    }
    double t0 = now_ms(), t1 = t0;
    if (rc == 0)
        rc = kvs_decoder_forward(d, prompt ? prompt : &bos, np, NULL, logits, err);
    t1 = now_ms();
    for (uint32_t i = 0; rc == 0 && i < a->greedy; i++) {
        out[i] = kvs_argmax(logits, c->vocab_size);
        if (i + 1 < a->greedy)
            rc = kvs_decoder_forward(d, &out[i], 1, NULL, logits, err);
    }
    double t2 = now_ms();
    if (rc == 0 && a->dump_dir) {
        char path[4096];
        if (mkdir(a->dump_dir, 0777) != 0 && errno != EEXIST)
            rc = kvs_fail(err, KVS_EIO, "%s: %s", a->dump_dir, strerror(errno));
        snprintf(path, sizeof path, "%s/greedy.kvsm", a->dump_dir);
        if (rc == 0)
            rc = kvs_decoder_dump_kv(d, qcap, kvs_decoder_len(d), path, err);
        if (rc == 0 && !a->print_ids)
            printf("wrote %s (%u tokens)\n", path, kvs_decoder_len(d));
    }
    if (rc == 0) {
        for (uint32_t i = 0; i < a->greedy; i++)
            printf(i ? " %u" : "%u", out[i]);
        printf("\n");
        if (!a->print_ids)
            printf("model %s: prompt %u tokens in %.3f ms (TTFT), %u tokens decoded at %.0f "
                   "tokens/s\n",
                   kvs_model_fingerprint(m), np, t1 - t0, a->greedy - 1,
                   a->greedy > 1 ? (a->greedy - 1) / ((t2 - t1) * 1e-3) : 0.0);
    } else {
        fprintf(stderr, "kvstash-decoder: %s\n", err);
    }
    kvs_decoder_free(d);
    free(logits), free(out), free(qcap), free(prompt);
    return rc == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    args a;
    int rc = parse_args(argc, argv, &a);
    if (rc != 0)
        return rc;
    kvs_model *m = NULL;
    if ((rc = load_model(&a, &m)) != 0)
        return rc;
    if (!a.workload) {
        rc = run_greedy(&a, m);
    } else {
        if (a.synthetic)
            a.wl.random_prompts = 1;
        if (a.wl.max_context > kvs_model_cfg(m)->seq_len)
            a.wl.max_context = kvs_model_cfg(m)->seq_len;
        a.wl.log = a.verbose ? stdout : NULL;
        kvs_wl_report r;
        char err[KVS_ERR_LEN] = "";
        rc = kvs_workload_run(m, &a.wl, &r, err);
        if (rc != 0) {
            fprintf(stderr, "kvstash-decoder: workload: %s\n", err);
            rc = rc == KVS_EINVAL ? 2 : 1;
        } else {
            kvs_wl_report_print(m, &a.wl, &r, stdout);
        }
    }
    kvs_model_free(m);
    return rc;
}
