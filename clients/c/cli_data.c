/*
 * cli_data.c — the data commands of `kvstash`: lookup, put, get, delete, pin,
 * unpin, each one libkvstash call (put and get loop over the blocks of a
 * prompt), plus the argument parsing they share with bench.c.
 *
 * A prompt comes as token ids: --tokens 1,2,3 (commas or spaces),
 * --tokens-file FILE (the same, any whitespace), or --random-tokens N
 * [--seed S]. Only whole blocks count (a partial tail is ignored, as Lookup
 * does). Blocks are named by 64-hex-digit keys (as lookup prints them), or by
 * the prompt: the command then looks the prompt up first and uses the keys of
 * the cached prefix.
 *
 * File layout of put --data and get --out (for a dequantized format equal to
 * the namespace dtype the two are byte-identical): block after block, layer
 * after layer, K then V, each [block_tokens][kv_heads][head_dim] elements,
 * little-endian. For --format stored, get writes each layer's stored K then V
 * bytes as they come (docs/FORMAT.md) and prints their sizes.
 */
#include "cli.h"

#include "kvq_math.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The server's bound on a Lookup lease and a Pin's TTL (24 h, MAX_LEASE_MS of
 * service/data_keys.c): beyond it is a usage error here, not a server refusal.
 * Pin's priority likewise stops at the server's 127; the server also takes
 * -128..-1, which the store counts as 0, so the CLI offers 0..127. */
#define KVS_CLI_MAX_LEASE_MS 86400000u

const char kvs_cli_data_usage[] =
    "Data commands (NS = namespace options, PROMPT = token options, KEYS = hex keys):\n"
    "  lookup NS PROMPT [--lease-ms N]     longest cached prefix: matched blocks and keys\n"
    "  put NS PROMPT [--data FILE] [--scheme fp16|fp8_e4m3|fp8_e5m2|int8] [--data-seed S]\n"
    "                                      store every full block of the prompt (payload\n"
    "                                      from FILE, else pseudo-random values)\n"
    "  get NS (KEYS|PROMPT) --out FILE [--format fp16|bf16|fp32|fp8|stored]\n"
    "                                      fetch blocks layer by layer into FILE\n"
    "  delete NS (KEYS|PROMPT) [--subtree]  remove blocks\n"
    "  pin NS (KEYS|PROMPT) [--ttl-ms N] [--priority 0..127]\n"
    "  unpin NS (KEYS|PROMPT) | unpin NS --lease-id N\n"
    "  bench NS [--clients N] [--requests M] [--prefix-share F] [--prefixes P]\n"
    "        [--prompt-blocks B] [--shared-blocks S] [--no-get] [--scheme S] [--seed S]\n"
    "                                      N concurrent workers: Lookup, Get the hits, Put\n"
    "                                      the misses; ops/s, p50/p99 latency, hit rate\n"
    "  NS:     --model NAME (default kvstash-cli) [--salt S] --layers L (2) --kv-heads H (2)\n"
    "          --head-dim D (64) --block-tokens T (16) --dtype fp16|bf16|fp32 (fp16)\n"
    "  PROMPT: --tokens 1,2,3... | --tokens-file FILE | --random-tokens N [--seed S]\n"
    "  KEYS:   64 hex digits each, as lookup prints them\n"
    "  File layout: block, layer, K then V, each [T][H][D] elements of the dtype.\n";

/* ---- argument parsing ------------------------------------------------------ */

int kvs_cli_args_parse(const char *cmd, int argc, char **argv, const char *const *flags,
                       const char *const *allowed, kvs_cli_args *a)
{
    memset(a, 0, sizeof *a);
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (strncmp(s, "--", 2) != 0 || s[2] == '\0') {
            if (a->npos == (int)(sizeof a->pos / sizeof a->pos[0]))
                return kvs_cli_usage_error("%s: too many arguments", cmd);
            a->pos[a->npos++] = s;
            continue;
        }
        char name[48];
        const char *eq = strchr(s, '=');
        size_t n = eq ? (size_t)(eq - s) : strlen(s);
        if (n >= sizeof name)
            return kvs_cli_usage_error("%s: unknown option '%s'", cmd, s);
        memcpy(name, s, n);
        name[n] = '\0';
        const char *canon = NULL;
        int is_flag = 0;
        for (const char *const *f = flags; f && *f && !canon; f++)
            if (strcmp(*f, name) == 0)
                canon = *f, is_flag = 1;
        for (const char *const *o = allowed; o && *o && !canon; o++)
            if (strcmp(*o, name) == 0)
                canon = *o;
        if (canon == NULL)
            return kvs_cli_usage_error("%s: unknown option '%s'", cmd, name);
        if (a->n == (int)(sizeof a->name / sizeof a->name[0]))
            return kvs_cli_usage_error("%s: too many options", cmd);
        const char *val = NULL;
        if (is_flag) {
            if (eq)
                return kvs_cli_usage_error("%s: %s takes no value", cmd, name);
        } else if (eq) {
            val = eq + 1;
        } else {
            if (i + 1 >= argc)
                return kvs_cli_usage_error("%s: %s needs a value", cmd, name);
            val = argv[++i];
        }
        a->name[a->n] = canon;
        a->value[a->n] = val;
        a->n++;
    }
    return 0;
}

const char *kvs_cli_arg(const kvs_cli_args *a, const char *name)
{
    const char *v = NULL;
    for (int i = 0; i < a->n; i++)
        if (strcmp(a->name[i], name) == 0)
            v = a->value[i];
    return v;
}

int kvs_cli_flag(const kvs_cli_args *a, const char *name)
{
    for (int i = 0; i < a->n; i++)
        if (strcmp(a->name[i], name) == 0)
            return 1;
    return 0;
}

static int parse_u64(const char *s, uint64_t *out)
{
    if (s == NULL || *s < '0' || *s > '9')
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0')
        return -1;
    *out = v;
    return 0;
}

int kvs_cli_arg_u64(const char *cmd, const kvs_cli_args *a, const char *name, uint64_t lo,
                    uint64_t hi, uint64_t def, uint64_t *out)
{
    const char *v = kvs_cli_arg(a, name);
    if (v == NULL) {
        *out = def;
        return 0;
    }
    uint64_t x;
    if (parse_u64(v, &x) != 0 || x < lo || x > hi)
        return kvs_cli_usage_error("%s: %s: expected an integer in %" PRIu64 "..%" PRIu64
                                   ", got '%s'",
                                   cmd, name, lo, hi, v);
    *out = x;
    return 0;
}

int kvs_cli_ns_parse(const char *cmd, const kvs_cli_args *a, kvs_ns *ns)
{
    memset(ns, 0, sizeof *ns);
    ns->model = kvs_cli_arg(a, "--model") ? kvs_cli_arg(a, "--model") : "kvstash-cli";
    ns->salt = kvs_cli_arg(a, "--salt");
    uint64_t v;
    if (kvs_cli_arg_u64(cmd, a, "--layers", 1, 4096, 2, &v))
        return KVS_CLI_EXIT_USAGE;
    ns->num_layers = (unsigned)v;
    if (kvs_cli_arg_u64(cmd, a, "--kv-heads", 1, 1024, 2, &v))
        return KVS_CLI_EXIT_USAGE;
    ns->num_kv_heads = (unsigned)v;
    if (kvs_cli_arg_u64(cmd, a, "--head-dim", 1, 4096, 64, &v))
        return KVS_CLI_EXIT_USAGE;
    ns->head_dim = (unsigned)v;
    if (kvs_cli_arg_u64(cmd, a, "--block-tokens", 16, 1024, 16, &v))
        return KVS_CLI_EXIT_USAGE;
    ns->block_tokens = (unsigned)v;
    const char *dt = kvs_cli_arg(a, "--dtype");
    if (dt == NULL || strcmp(dt, "fp16") == 0)
        ns->dtype = 1;
    else if (strcmp(dt, "bf16") == 0)
        ns->dtype = 2;
    else if (strcmp(dt, "fp32") == 0)
        ns->dtype = 3;
    else
        return kvs_cli_usage_error("%s: --dtype: expected fp16, bf16 or fp32, got '%s'", cmd, dt);
    if (ns->model[0] == '\0' || strlen(ns->model) > 256)
        return kvs_cli_usage_error("%s: --model: 1..256 bytes", cmd);
    return 0;
}

size_t kvs_cli_dtype_size(unsigned dtype)
{
    return dtype == 3 ? 4 : 2;
}

static uint64_t next_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void kvs_cli_fill_random(void *dst, size_t n, unsigned dtype, uint64_t *seed)
{
    for (size_t i = 0; i < n; i++) {
        float x = (float)((double)(next_rand(seed) >> 11) * 0x1.0p-53 * 4.0 - 2.0);
        if (dtype == 3)
            ((float *)dst)[i] = x;
        else if (dtype == 2)
            ((uint16_t *)dst)[i] = kvq_f32_to_bf16(x);
        else
            ((uint16_t *)dst)[i] = kvq_f32_to_fp16(x);
    }
}

/* ---- prompts and keys ------------------------------------------------------ */

typedef struct prompt {
    unsigned *tokens;
    size_t n;
} prompt;

static int parse_token_list(const char *cmd, const char *what, const char *s, prompt *p)
{
    size_t cap = 256;
    p->tokens = malloc(cap * sizeof *p->tokens);
    p->n = 0;
    if (p->tokens == NULL)
        return kvs_cli_fail(cmd, KVS_ENOMEM, NULL);
    while (*s) {
        while (*s == ',' || *s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
            s++;
        if (*s == '\0')
            break;
        char *end;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (end == s || errno != 0 || v > UINT32_MAX || *s == '-' || *s == '+')
            return kvs_cli_usage_error("%s: %s: token %zu is not an integer in 0..4294967295", cmd,
                                       what, p->n);
        if (p->n == cap) {
            unsigned *nt = realloc(p->tokens, 2 * cap * sizeof *nt);
            if (nt == NULL)
                return kvs_cli_fail(cmd, KVS_ENOMEM, NULL);
            p->tokens = nt;
            cap *= 2;
        }
        p->tokens[p->n++] = (unsigned)v;
        s = end;
    }
    return 0;
}

/* Reads the prompt options; 0 with p->tokens NULL when none was given. */
static int parse_prompt(const char *cmd, const kvs_cli_args *a, prompt *p)
{
    memset(p, 0, sizeof *p);
    const char *list = kvs_cli_arg(a, "--tokens"), *file = kvs_cli_arg(a, "--tokens-file");
    const char *rnd = kvs_cli_arg(a, "--random-tokens");
    if ((list != NULL) + (file != NULL) + (rnd != NULL) > 1)
        return kvs_cli_usage_error("%s: give one of --tokens, --tokens-file, --random-tokens", cmd);
    if (list)
        return parse_token_list(cmd, "--tokens", list, p);
    if (file) {
        FILE *f = fopen(file, "r");
        if (f == NULL) {
            char d[KVS_ERR_LEN];
            snprintf(d, sizeof d, "%s: %s", file, strerror(errno));
            return kvs_cli_fail(cmd, KVS_EIO, d);
        }
        char *text = NULL;
        size_t len = 0;
        FILE *m = open_memstream(&text, &len);
        char buf[65536];
        size_t got;
        while (m && (got = fread(buf, 1, sizeof buf, f)) > 0)
            fwrite(buf, 1, got, m);
        int bad = ferror(f);
        fclose(f);
        if (m)
            fclose(m);
        if (m == NULL || bad) {
            free(text);
            return kvs_cli_fail(cmd, KVS_EIO, file);
        }
        int rc = parse_token_list(cmd, file, text, p);
        free(text);
        return rc;
    }
    if (rnd) {
        uint64_t n, seed;
        if (kvs_cli_arg_u64(cmd, a, "--random-tokens", 1, 1u << 24, 0, &n) ||
            kvs_cli_arg_u64(cmd, a, "--seed", 0, UINT64_MAX, 1, &seed))
            return KVS_CLI_EXIT_USAGE;
        p->tokens = malloc(n * sizeof *p->tokens);
        if (p->tokens == NULL)
            return kvs_cli_fail(cmd, KVS_ENOMEM, NULL);
        for (size_t i = 0; i < n; i++)
            p->tokens[i] = (unsigned)(next_rand(&seed) % 32000u);
        p->n = n;
    }
    return 0;
}

static void hex_key(const unsigned char *k, char out[2 * KVS_CLIENT_KEY_LEN + 1])
{
    for (int i = 0; i < KVS_CLIENT_KEY_LEN; i++)
        snprintf(out + 2 * i, 3, "%02x", k[i]);
}

static int unhex(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

typedef unsigned char key_t_[KVS_CLIENT_KEY_LEN];

/* Keys from the positional arguments (hex) or, when there are none, from a
 * Lookup of the prompt (its lease id in *lease). *keys is malloc'd. */
static int resolve_keys(const char *cmd, kvs_client *c, const cli *o, const kvs_ns *ns,
                        const kvs_cli_args *a, const prompt *p, key_t_ **keys, size_t *n,
                        unsigned long long *lease)
{
    *keys = NULL;
    *n = 0;
    *lease = 0;
    if (a->npos > 0 && p->tokens != NULL)
        return kvs_cli_usage_error("%s: give KEYS or a prompt, not both", cmd);
    if (a->npos > 0) {
        *keys = calloc((size_t)a->npos, sizeof **keys);
        if (*keys == NULL)
            return kvs_cli_fail(cmd, KVS_ENOMEM, NULL);
        for (int i = 0; i < a->npos; i++) {
            const char *h = a->pos[i];
            int bad = strlen(h) != 2 * KVS_CLIENT_KEY_LEN;
            for (int j = 0; j < KVS_CLIENT_KEY_LEN && !bad; j++) {
                int hi = unhex(h[2 * j]), lo = unhex(h[2 * j + 1]);
                bad = hi < 0 || lo < 0;
                (*keys)[i][j] = (unsigned char)(hi << 4 | lo);
            }
            if (bad) {
                free(*keys);
                *keys = NULL;
                return kvs_cli_usage_error("%s: key %d: expected 64 hex digits, got '%s'", cmd, i,
                                           h);
            }
        }
        *n = (size_t)a->npos;
        return 0;
    }
    if (p->tokens == NULL)
        return kvs_cli_usage_error("%s: name the blocks: KEYS, or a prompt (--tokens ...)", cmd);
    char err[KVS_ERR_LEN] = "";
    kvs_lookup_result *r = NULL;
    int rc = kvs_client_lookup(c, ns, p->tokens, p->n, 0, o->timeout_ms, &r, err);
    if (rc != 0)
        return kvs_cli_fail(cmd, rc, err);
    if (r->n_blocks > 0) {
        *keys = calloc(r->n_blocks, sizeof **keys);
        if (*keys == NULL) {
            kvs_lookup_result_free(r);
            return kvs_cli_fail(cmd, KVS_ENOMEM, NULL);
        }
        for (size_t i = 0; i < r->n_blocks; i++)
            memcpy((*keys)[i], r->blocks[i].key, KVS_CLIENT_KEY_LEN);
    }
    *n = r->n_blocks;
    *lease = r->lease_id;
    kvs_lookup_result_free(r);
    return 0;
}

/* ---- commands -------------------------------------------------------------- */

static const char *const k_tier[] = {"?", "host", "gpu", "ssd"};
static const char *const k_scheme[] = {"default", "fp16", "fp8_e4m3", "fp8_e5m2", "int8"};

static int cmd_lookup(const cli *o, kvs_client *c, const kvs_ns *ns, const kvs_cli_args *a,
                      const prompt *p)
{
    if (p->tokens == NULL || a->npos > 0)
        return kvs_cli_usage_error("lookup: needs a prompt (--tokens, --tokens-file or "
                                   "--random-tokens) and no KEYS");
    uint64_t lease_ms;
    if (kvs_cli_arg_u64("lookup", a, "--lease-ms", 0, KVS_CLI_MAX_LEASE_MS, 0, &lease_ms))
        return KVS_CLI_EXIT_USAGE;
    char err[KVS_ERR_LEN] = "";
    kvs_lookup_result *r = NULL;
    int rc = kvs_client_lookup(c, ns, p->tokens, p->n, (unsigned)lease_ms, o->timeout_ms, &r, err);
    if (rc != 0)
        return kvs_cli_fail("lookup", rc, err);
    printf("matched_blocks=%u matched_tokens=%u of %zu tokens (%zu full blocks) lease_id=%llu "
           "lease_ms=%u\n",
           r->matched_blocks, r->matched_tokens, p->n, p->n / ns->block_tokens, r->lease_id,
           r->lease_ms);
    for (size_t i = 0; i < r->n_blocks; i++) {
        const kvs_block_info *b = &r->blocks[i];
        char hex[2 * KVS_CLIENT_KEY_LEN + 1];
        hex_key(b->key, hex);
        printf("block %u %s scheme=%s stored_bytes=%llu tier=%s\n", b->index, hex,
               b->scheme < 5 ? k_scheme[b->scheme] : "?", b->stored_bytes,
               b->tier < 4 ? k_tier[b->tier] : "?");
    }
    kvs_lookup_result_free(r);
    return 0;
}

static int parse_scheme(const char *cmd, const kvs_cli_args *a, unsigned *out)
{
    const char *s = kvs_cli_arg(a, "--scheme");
    *out = 0;
    if (s == NULL)
        return 0;
    for (unsigned i = 1; i < 5; i++)
        if (strcmp(s, k_scheme[i]) == 0) {
            *out = i;
            return 0;
        }
    if (strcmp(s, "e4m3") == 0)
        *out = 2;
    else if (strcmp(s, "e5m2") == 0)
        *out = 3;
    else
        return kvs_cli_usage_error("%s: --scheme: expected fp16, fp8_e4m3, fp8_e5m2 or int8, "
                                   "got '%s'",
                                   cmd, s);
    return 0;
}

static int cmd_put(const cli *o, kvs_client *c, const kvs_ns *ns, const kvs_cli_args *a,
                   const prompt *p)
{
    if (p->tokens == NULL || a->npos > 0)
        return kvs_cli_usage_error("put: needs a prompt (--tokens, --tokens-file or "
                                   "--random-tokens) and no KEYS");
    unsigned scheme;
    uint64_t seed;
    if (parse_scheme("put", a, &scheme) ||
        kvs_cli_arg_u64("put", a, "--data-seed", 0, UINT64_MAX, 7, &seed))
        return KVS_CLI_EXIT_USAGE;
    const size_t T = ns->block_tokens, L = ns->num_layers;
    const size_t elems = T * ns->num_kv_heads * ns->head_dim;
    const size_t lbytes = elems * kvs_cli_dtype_size(ns->dtype);
    const size_t nblocks = p->n / T;
    if (nblocks == 0)
        return kvs_cli_usage_error("put: the prompt has %zu tokens, less than one block of %zu",
                                   p->n, T);
    const char *data = kvs_cli_arg(a, "--data");
    FILE *f = NULL;
    if (data) {
        f = fopen(data, "rb");
        if (f == NULL) {
            char d[KVS_ERR_LEN];
            snprintf(d, sizeof d, "%s: %s", data, strerror(errno));
            return kvs_cli_fail("put", KVS_EIO, d);
        }
        long want = (long)(nblocks * L * 2 * lbytes);
        if (fseek(f, 0, SEEK_END) != 0 || ftell(f) != want || fseek(f, 0, SEEK_SET) != 0) {
            char d[KVS_ERR_LEN];
            snprintf(d, sizeof d,
                     "%s holds %ld bytes; %zu blocks x %zu layers x (K+V) x %zu bytes = %ld", data,
                     ftell(f), nblocks, L, lbytes, want);
            fclose(f);
            return kvs_cli_fail("put", KVS_EINVAL, d);
        }
    }
    unsigned char *buf = malloc(L * 2 * lbytes);
    const void **kp = calloc(L, sizeof *kp), **vp = calloc(L, sizeof *vp);
    float *ke = calloc(L, sizeof *ke), *ve = calloc(L, sizeof *ve);
    int ret = 1;
    if (!buf || !kp || !vp || !ke || !ve) {
        kvs_cli_fail("put", KVS_ENOMEM, NULL);
        goto out;
    }
    for (size_t l = 0; l < L; l++) {
        kp[l] = buf + (2 * l) * lbytes;
        vp[l] = buf + (2 * l + 1) * lbytes;
    }
    unsigned char parent[KVS_CLIENT_KEY_LEN];
    unsigned long long total = 0;
    for (size_t b = 0; b < nblocks; b++) {
        if (f) {
            if (fread(buf, 1, L * 2 * lbytes, f) != L * 2 * lbytes) {
                kvs_cli_fail("put", KVS_EIO, data);
                goto out;
            }
        } else {
            kvs_cli_fill_random(buf, L * 2 * elems, ns->dtype, &seed);
        }
        kvs_put_args pa = {.ns = ns,
                           .parent_key = b ? parent : NULL,
                           .index = (unsigned)b,
                           .tokens = p->tokens + b * T,
                           .scheme = scheme,
                           .k = kp,
                           .v = vp};
        kvs_put_result res;
        memset(&res, 0, sizeof res);
        res.k_rel_error = ke;
        res.v_rel_error = ve;
        char err[KVS_ERR_LEN] = "";
        int rc = kvs_client_put(c, &pa, o->timeout_ms, &res, err);
        if (rc != 0) {
            char d[KVS_ERR_LEN + 32];
            snprintf(d, sizeof d, "block %zu: %s", b, err);
            kvs_cli_fail("put", rc, d);
            goto out;
        }
        float kmax = 0, vmax = 0;
        for (size_t l = 0; l < L; l++) {
            kmax = ke[l] > kmax ? ke[l] : kmax;
            vmax = ve[l] > vmax ? ve[l] : vmax;
        }
        char hex[2 * KVS_CLIENT_KEY_LEN + 1];
        hex_key(res.key, hex);
        printf("put block %zu %s stored_bytes=%llu already_present=%d max_k_rel_error=%.3g "
               "max_v_rel_error=%.3g\n",
               b, hex, res.stored_bytes, res.already_present, (double)kmax, (double)vmax);
        memcpy(parent, res.key, KVS_CLIENT_KEY_LEN);
        total += res.stored_bytes;
    }
    printf("put %zu blocks (%zu tokens), %llu bytes stored from %zu bytes sent\n", nblocks,
           nblocks * T, total, nblocks * L * 2 * lbytes);
    ret = 0;
out:
    if (f)
        fclose(f);
    free(buf);
    free(kp);
    free(vp);
    free(ke);
    free(ve);
    return ret;
}

typedef struct get_sink {
    FILE *f;
    unsigned long long bytes, layers;
    int io_error;
} get_sink;

static int on_layer(void *arg, unsigned block_index, unsigned layer, const void *k, size_t k_len,
                    const void *v, size_t v_len, float k_scale, float v_scale, int last_layer)
{
    get_sink *s = arg;
    (void)block_index;
    (void)layer;
    (void)k_scale;
    (void)v_scale;
    (void)last_layer;
    if (fwrite(k, 1, k_len, s->f) != k_len || fwrite(v, 1, v_len, s->f) != v_len) {
        s->io_error = 1;
        return 1;
    }
    s->bytes += k_len + v_len;
    s->layers++;
    return 0;
}

static int cmd_get(const cli *o, kvs_client *c, const kvs_ns *ns, const kvs_cli_args *a,
                   const prompt *p)
{
    const char *out = kvs_cli_arg(a, "--out"), *fmt_s = kvs_cli_arg(a, "--format");
    if (out == NULL)
        return kvs_cli_usage_error("get: --out FILE is required");
    kvs_egress fmt = (kvs_egress)ns->dtype; /* default: the namespace dtype */
    if (fmt_s == NULL)
        ;
    else if (strcmp(fmt_s, "stored") == 0)
        fmt = KVS_EGRESS_STORED;
    else if (strcmp(fmt_s, "fp16") == 0)
        fmt = KVS_EGRESS_FP16;
    else if (strcmp(fmt_s, "bf16") == 0)
        fmt = KVS_EGRESS_BF16;
    else if (strcmp(fmt_s, "fp32") == 0)
        fmt = KVS_EGRESS_FP32;
    else if (strcmp(fmt_s, "fp8") == 0)
        fmt = KVS_EGRESS_FP8_PER_TENSOR;
    else
        return kvs_cli_usage_error("get: --format: expected fp16, bf16, fp32, fp8 or stored, "
                                   "got '%s'",
                                   fmt_s);
    key_t_ *keys = NULL;
    size_t n = 0;
    unsigned long long lease = 0;
    int rc = resolve_keys("get", c, o, ns, a, p, &keys, &n, &lease);
    if (rc != 0)
        return rc;
    if (n == 0) {
        free(keys);
        return kvs_cli_fail("get", KVS_ENOTFOUND, "no block of the prompt is cached");
    }
    get_sink s = {.f = fopen(out, "wb")};
    if (s.f == NULL) {
        char d[KVS_ERR_LEN];
        snprintf(d, sizeof d, "%s: %s", out, strerror(errno));
        free(keys);
        return kvs_cli_fail("get", KVS_EIO, d);
    }
    char err[KVS_ERR_LEN] = "";
    rc = kvs_client_get(c, ns, (const unsigned char(*)[KVS_CLIENT_KEY_LEN])keys, n, fmt, lease,
                        o->timeout_ms, on_layer, &s, err);
    free(keys);
    if (fclose(s.f) != 0)
        s.io_error = 1;
    if (s.io_error)
        return kvs_cli_fail("get", KVS_EIO, out);
    if (rc != 0)
        return kvs_cli_fail("get", rc, err);
    printf("got %zu blocks, %llu layers, %llu bytes -> %s\n", n, s.layers, s.bytes, out);
    return 0;
}

static int cmd_keys(const char *cmd, const cli *o, kvs_client *c, const kvs_ns *ns,
                    const kvs_cli_args *a, const prompt *p)
{
    uint64_t lease_id = 0;
    if (strcmp(cmd, "unpin") == 0 &&
        kvs_cli_arg_u64(cmd, a, "--lease-id", 1, UINT64_MAX, 0, &lease_id))
        return KVS_CLI_EXIT_USAGE;
    key_t_ *keys = NULL;
    size_t n = 0;
    unsigned long long lease = 0;
    int rc = 0;
    if (lease_id == 0 || a->npos > 0 || p->tokens != NULL) {
        rc = resolve_keys(cmd, c, o, ns, a, p, &keys, &n, &lease);
        if (rc != 0)
            return rc;
    }
    char err[KVS_ERR_LEN] = "";
    /* A prompt's Lookup leased its blocks: give the lease back first, or it
     * would hold off the very delete (and outlive pin/unpin) it served. */
    if (lease != 0) {
        unsigned dummy;
        kvs_client_unpin(c, ns, NULL, 0, lease, o->timeout_ms, &dummy, NULL);
    }
    unsigned count = 0;
    const unsigned char(*k)[KVS_CLIENT_KEY_LEN] = (const unsigned char(*)[KVS_CLIENT_KEY_LEN])keys;
    if (strcmp(cmd, "delete") == 0) {
        rc = kvs_client_delete(c, ns, k, n, kvs_cli_flag(a, "--subtree"), o->timeout_ms, &count,
                               err);
    } else if (strcmp(cmd, "pin") == 0) {
        uint64_t ttl, prio;
        if (kvs_cli_arg_u64(cmd, a, "--ttl-ms", 0, KVS_CLI_MAX_LEASE_MS, 0, &ttl) ||
            kvs_cli_arg_u64(cmd, a, "--priority", 0, 127, 0, &prio)) {
            free(keys);
            return KVS_CLI_EXIT_USAGE;
        }
        rc = kvs_client_pin(c, ns, k, n, (unsigned)ttl, (int)prio, o->timeout_ms, &count, err);
    } else {
        rc = kvs_client_unpin(c, ns, k, n, lease_id, o->timeout_ms, &count, err);
    }
    free(keys);
    if (rc != 0)
        return kvs_cli_fail(cmd, rc, err);
    printf("%s: %u of %zu block(s)%s\n",
           strcmp(cmd, "delete") == 0 ? "deleted"
           : strcmp(cmd, "pin") == 0  ? "pinned"
                                      : "unpinned",
           count, n, lease_id ? " (lease released)" : "");
    return 0;
}

int kvs_cli_is_data_command(const char *cmd)
{
    static const char *const cmds[] = {"lookup", "put", "get", "delete", "pin", "unpin", NULL};
    for (const char *const *c = cmds; *c; c++)
        if (strcmp(*c, cmd) == 0)
            return 1;
    return 0;
}

int kvs_cli_data(const cli *o, int argc, char **argv)
{
    const char *cmd = argv[0];
    static const char *const flags[] = {"--subtree", NULL};
    static const char *const allowed[] = {
        KVS_CLI_NS_OPTS, "--tokens", "--tokens-file", "--random-tokens", "--seed",
        "--lease-ms",    "--data",   "--data-seed",   "--scheme",        "--out",
        "--format",      "--ttl-ms", "--priority",    "--lease-id",      NULL};
    kvs_cli_args a;
    int rc = kvs_cli_args_parse(cmd, argc, argv, flags, allowed, &a);
    if (rc != 0)
        return rc;
    kvs_ns ns;
    if ((rc = kvs_cli_ns_parse(cmd, &a, &ns)) != 0)
        return rc;
    prompt p;
    if ((rc = parse_prompt(cmd, &a, &p)) != 0) {
        free(p.tokens);
        return rc;
    }
    kvs_client *c = NULL;
    if (kvs_cli_connect(o, cmd, &c) != 0) {
        free(p.tokens);
        return 1;
    }
    if (strcmp(cmd, "lookup") == 0)
        rc = cmd_lookup(o, c, &ns, &a, &p);
    else if (strcmp(cmd, "put") == 0)
        rc = cmd_put(o, c, &ns, &a, &p);
    else if (strcmp(cmd, "get") == 0)
        rc = cmd_get(o, c, &ns, &a, &p);
    else
        rc = cmd_keys(cmd, o, c, &ns, &a, &p);
    kvs_client_close(c);
    free(p.tokens);
    return rc;
}
