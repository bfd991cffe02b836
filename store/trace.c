/*
 * trace.c — trace loading (json-c), synthetic generators, and replay.
 *
 * Replay uses the real key derivation and the real store: each trace block id
 * becomes a 16-token block (token 0 = the id, tokens 1..15 = 0) in a fixed
 * simulation namespace, so keys chain exactly as the ids do and lookups compare
 * stored token ids as in production. Keys are computed once per trace.
 * Belady's next-use times come from one backward pass over the trace: a block's
 * time is (request << 16 | position), so within one request deeper blocks are
 * "later", which is the right order for prefix hits.
 * A put line (kvstashd --record-trace writes one for blocks put without a
 * Lookup naming them) inserts its chain and is not demand: it adds nothing to
 * requested or hits, and is not a "use" for Belady's next-use times.
 */
#include "trace.h"

#include "keys.h"
#include "kvs_error.h"
#include "store.h"

#include <json-c/json.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SIM_BT 16

typedef struct buf {
    kvs_trace *t;
    size_t cap_ids, cap_req;
} buf;

static int buf_init(buf *b)
{
    b->t = calloc(1, sizeof *b->t);
    b->cap_ids = 4096;
    b->cap_req = 256;
    if (b->t) {
        b->t->ids = malloc(b->cap_ids * sizeof *b->t->ids);
        b->t->off = malloc((b->cap_req + 1) * sizeof *b->t->off);
    }
    if (!b->t || !b->t->ids || !b->t->off) {
        kvs_trace_free(b->t);
        return KVS_ENOMEM;
    }
    b->t->off[0] = 0;
    return 0;
}

/* Appends one request of n ids; put: a put line. */
static int buf_add(buf *b, const uint32_t *ids, size_t n, int put)
{
    kvs_trace *t = b->t;
    while (t->nblocks + n > b->cap_ids) {
        uint32_t *ni = realloc(t->ids, 2 * b->cap_ids * sizeof *ni);
        if (!ni)
            return KVS_ENOMEM;
        t->ids = ni;
        b->cap_ids *= 2;
    }
    if (t->nreq == b->cap_req) {
        size_t *no = realloc(t->off, (2 * b->cap_req + 1) * sizeof *no);
        if (!no)
            return KVS_ENOMEM;
        t->off = no;
        if (t->put) {
            uint8_t *np = realloc(t->put, 2 * b->cap_req);
            if (!np)
                return KVS_ENOMEM;
            memset(np + b->cap_req, 0, b->cap_req);
            t->put = np;
        }
        b->cap_req *= 2;
    }
    if (put && !t->put) { /* the first put line: lookups so far are 0 */
        t->put = calloc(b->cap_req, 1);
        if (!t->put)
            return KVS_ENOMEM;
    }
    if (n)
        memcpy(t->ids + t->nblocks, ids, n * sizeof *ids);
    if (t->put)
        t->put[t->nreq] = put != 0;
    t->nblocks += n;
    t->off[++t->nreq] = t->nblocks;
    return 0;
}

void kvs_trace_free(kvs_trace *t)
{
    if (!t)
        return;
    free(t->ids);
    free(t->off);
    free(t->put);
    free(t);
}

static int parse_line(const char *line, size_t len, uint32_t **ids, size_t *cap, size_t *n,
                      int *put, const char **why)
{
    json_tokener *tok = json_tokener_new();
    if (!tok)
        return KVS_ENOMEM;
    json_object *o = json_tokener_parse_ex(tok, line, (int)len);
    enum json_tokener_error je = json_tokener_get_error(tok);
    size_t end = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    int rc = KVS_EFORMAT;
    *why = "not valid JSON";
    if (!o || je != json_tokener_success)
        goto out;
    for (; end < len; end++)
        if (line[end] != ' ' && line[end] != '\t' && line[end] != '\r' && line[end] != '\n') {
            *why = "trailing characters after the JSON object";
            goto out;
        }
    json_object *h;
    *why = "not a JSON object";
    if (!json_object_is_type(o, json_type_object))
        goto out;
    *why = "no \"hash_ids\" array";
    if (!json_object_object_get_ex(o, "hash_ids", &h) || !json_object_is_type(h, json_type_array))
        goto out;
    json_object *op;
    *put = 0;
    if (json_object_object_get_ex(o, "op", &op)) {
        const char *v = json_object_is_type(op, json_type_string) ? json_object_get_string(op) : "";
        *why = "\"op\" is neither \"lookup\" nor \"put\"";
        if (strcmp(v, "put") == 0)
            *put = 1;
        else if (strcmp(v, "lookup") != 0)
            goto out;
    }
    size_t k = json_object_array_length(h);
    if (k > *cap) {
        uint32_t *ni = realloc(*ids, k * sizeof *ni);
        if (!ni) {
            rc = KVS_ENOMEM;
            goto out;
        }
        *ids = ni;
        *cap = k;
    }
    for (size_t i = 0; i < k; i++) {
        json_object *v = json_object_array_get_idx(h, i);
        *why = "hash_ids holds something other than an integer in 0..4294967295";
        if (!json_object_is_type(v, json_type_int))
            goto out;
        int64_t x = json_object_get_int64(v);
        if (x < 0 || x > (int64_t)UINT32_MAX)
            goto out;
        (*ids)[i] = (uint32_t)x;
    }
    *n = k;
    rc = 0;
out:
    json_object_put(o);
    return rc;
}

int kvs_trace_load(FILE *f, const char *name, kvs_trace **out, char *err, size_t errlen)
{
    if (!f || !out)
        return KVS_EINVAL;
    *out = NULL;
    buf b;
    if (buf_init(&b))
        return KVS_ENOMEM;
    char *line = NULL;
    size_t lcap = 0, icap = 0, lineno = 0;
    uint32_t *ids = NULL;
    ssize_t len;
    int rc = 0;
    while ((len = getline(&line, &lcap, f)) >= 0) {
        lineno++;
        size_t k = 0;
        while (k < (size_t)len && strchr(" \t\r\n", line[k]))
            k++;
        if (k == (size_t)len)
            continue;
        if (memchr(line, '\0', (size_t)len)) {
            rc = KVS_EFORMAT;
            snprintf(err, errlen, "%s:%zu: NUL byte in line", name, lineno);
            break;
        }
        size_t n = 0;
        int put = 0;
        const char *why = "";
        rc = parse_line(line, (size_t)len, &ids, &icap, &n, &put, &why);
        if (rc == KVS_EFORMAT)
            snprintf(err, errlen, "%s:%zu: malformed trace line: %s", name, lineno, why);
        if (rc == 0)
            rc = buf_add(&b, ids, n, put);
        if (rc)
            break;
    }
    if (rc == 0 && ferror(f)) {
        rc = KVS_EIO;
        snprintf(err, errlen, "%s: read error", name);
    }
    free(line);
    free(ids);
    if (rc) {
        kvs_trace_free(b.t);
        return rc;
    }
    *out = b.t;
    return 0;
}

int kvs_trace_write(const kvs_trace *t, FILE *f)
{
    for (size_t r = 0; r < t->nreq; r++) {
        size_t n = t->off[r + 1] - t->off[r];
        fprintf(f, "{\"timestamp\": %zu, \"input_length\": %zu, \"output_length\": 0, \"hash_ids\": [",
                r, n * 512);
        for (size_t i = 0; i < n; i++)
            fprintf(f, i ? ", %u" : "%u", t->ids[t->off[r] + i]);
        fputs(t->put && t->put[r] ? "], \"op\": \"put\"}\n" : "]}\n", f);
    }
    return ferror(f) ? KVS_EIO : 0;
}

/* ---- generators ------------------------------------------------------- */

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t rnd(rng *g) /* splitmix64 */
{
    uint64_t z = (g->s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint32_t rnd_in(rng *g, uint32_t lo, uint32_t hi) /* [lo, hi] */
{
    return lo + (uint32_t)(rnd(g) % ((uint64_t)hi - lo + 1));
}

static double rnd_u(rng *g) { return (double)(rnd(g) >> 11) / 9007199254740992.0; }

#define G_SYS 16      /* shared system prompts */
#define G_CONV 48     /* live conversations */
#define G_DOCS 64     /* recent documents that may be asked again */
#define G_MAXLEN 400  /* blocks per request at most */

typedef struct chain {
    uint32_t id[G_MAXLEN];
    uint32_t n;
    uint32_t turns_left;
} chain;

typedef struct gen {
    rng g;
    uint32_t next_id;
    chain sys[G_SYS];
    chain conv[G_CONV];
    chain docs[G_DOCS];
    uint32_t ndocs;
    uint32_t req[G_MAXLEN];
} gen;

static void extend(gen *G, chain *c, uint32_t k)
{
    for (uint32_t i = 0; i < k && c->n < G_MAXLEN; i++)
        c->id[c->n++] = G->next_id++;
}

/* Zipf-like pick: low indices are popular. */
static uint32_t pick_sys(gen *G)
{
    double u = rnd_u(&G->g);
    return (uint32_t)(u * u * u * G_SYS);
}

static void new_conv(gen *G, chain *c)
{
    *c = G->sys[pick_sys(G)];
    c->turns_left = 1 + (uint32_t)(-4.0 * log(1.0 - rnd_u(&G->g)));
    extend(G, c, rnd_in(&G->g, 1, 3));
}

static size_t gen_chat(gen *G)
{
    chain *c = &G->conv[rnd_in(&G->g, 0, G_CONV - 1)];
    if (c->turns_left == 0 || c->n + 8 > G_MAXLEN)
        new_conv(G, c);
    c->turns_left--;
    memcpy(G->req, c->id, c->n * sizeof *c->id);
    size_t n = c->n;
    extend(G, c, rnd_in(&G->g, 1, 4)); /* the answer and the next question */
    return n;
}

static size_t gen_sysprompt(gen *G)
{
    chain c = G->sys[pick_sys(G)];
    extend(G, &c, rnd_in(&G->g, 1, 3));
    memcpy(G->req, c.id, c.n * sizeof *c.id);
    return c.n;
}

static size_t gen_docs(gen *G)
{
    chain c;
    if (G->ndocs && rnd_u(&G->g) < 0.3) {
        uint32_t k = G->ndocs < G_DOCS ? G->ndocs : G_DOCS;
        c = G->docs[(G->ndocs - 1 - rnd_in(&G->g, 0, k - 1)) % G_DOCS];
    } else {
        c = G->sys[G_SYS - 1]; /* one short shared instruction prompt */
        c.n = 2;
        extend(G, &c, rnd_in(&G->g, 20, 200));
        G->docs[G->ndocs++ % G_DOCS] = c;
    }
    extend(G, &c, 1); /* the question */
    memcpy(G->req, c.id, c.n * sizeof *c.id);
    return c.n;
}

int kvs_trace_generate(const char *kind, size_t nreq, uint64_t seed, kvs_trace **out)
{
    int which;
    if (!kind || !out)
        return KVS_EINVAL;
    if (!strcmp(kind, "chat"))
        which = 0;
    else if (!strcmp(kind, "sysprompt"))
        which = 1;
    else if (!strcmp(kind, "docs"))
        which = 2;
    else if (!strcmp(kind, "mix"))
        which = 3;
    else
        return KVS_EINVAL;
    gen *G = calloc(1, sizeof *G);
    buf b;
    if (!G || buf_init(&b)) {
        free(G);
        return KVS_ENOMEM;
    }
    G->g.s = seed;
    for (int i = 0; i < G_SYS; i++)
        extend(G, &G->sys[i], rnd_in(&G->g, 4, 40));
    int rc = 0;
    for (size_t r = 0; r < nreq && !rc; r++) {
        int k = which;
        if (k == 3) {
            double u = rnd_u(&G->g);
            k = u < 0.5 ? 0 : u < 0.8 ? 1 : 2;
        }
        size_t n = k == 0 ? gen_chat(G) : k == 1 ? gen_sysprompt(G) : gen_docs(G);
        rc = buf_add(&b, G->req, n, 0);
    }
    free(G);
    if (rc) {
        kvs_trace_free(b.t);
        return rc;
    }
    *out = b.t;
    return 0;
}

/* ---- replay ----------------------------------------------------------- */

static const kvs_ns_desc g_sim_ns = {
    .tenant = "sim", .tenant_len = 3, .model = "trace-replay", .model_len = 12,
    .num_layers = 1, .num_kv_heads = 1, .head_dim = 1, .block_tokens = SIM_BT,
    .dtype = KVS_DTYPE_FP16, .salt = NULL, .salt_len = 0,
};

static void block_tokens(uint32_t id, uint32_t *tok)
{
    memset(tok, 0, SIM_BT * sizeof *tok);
    tok[0] = id;
}

/* Keys of every block of every request. */
static int trace_keys(const kvs_trace *t, kvs_key **out)
{
    kvs_key *k = malloc((t->nblocks ? t->nblocks : 1) * sizeof *k);
    if (!k)
        return KVS_ENOMEM;
    uint32_t tok[SIM_BT];
    for (size_t r = 0; r < t->nreq; r++)
        for (size_t i = t->off[r]; i < t->off[r + 1]; i++) {
            block_tokens(t->ids[i], tok);
            int rc = i == t->off[r] ? kvs_key_root(&g_sim_ns, (const uint8_t *)"s", 1, tok, &k[i])
                                    : kvs_key_next(&k[i - 1], tok, SIM_BT, &k[i]);
            if (rc) {
                free(k);
                return rc;
            }
        }
    *out = k;
    return 0;
}

/* next[i] = time of the next use of block i's key after its request, or
 * UINT64_MAX. Only lookup lines use a block; a put line's blocks get the next
 * use like any other. */
static int next_uses(const kvs_trace *t, const kvs_key *k, uint64_t **out)
{
    size_t cap = 1024;
    while (cap < 2 * t->nblocks + 2)
        cap *= 2;
    uint64_t *fp = calloc(cap, sizeof *fp), *when = malloc(cap * sizeof *when);
    uint64_t *next = malloc((t->nblocks ? t->nblocks : 1) * sizeof *next);
    if (!fp || !when || !next) {
        free(fp);
        free(when);
        free(next);
        return KVS_ENOMEM;
    }
    for (size_t r = t->nreq; r-- > 0;) {
        int put = t->put && t->put[r];
        for (size_t i = t->off[r]; i < t->off[r + 1]; i++) {
            uint64_t f;
            memcpy(&f, k[i].b, sizeof f);
            f |= 1; /* 0 marks an empty slot */
            size_t h = (size_t)(f >> 7) & (cap - 1);
            while (fp[h] && fp[h] != f)
                h = (h + 1) & (cap - 1);
            size_t pos = i - t->off[r];
            next[i] = fp[h] ? when[h] : UINT64_MAX;
            if (put)
                continue;
            fp[h] = f;
            when[h] = ((uint64_t)r << 16) | (pos < 0xffff ? pos : 0xffff);
        }
    }
    free(fp);
    free(when);
    *out = next;
    return 0;
}

int kvs_trace_replay(const kvs_trace *t, const char *policy, uint64_t capacity_blocks,
                     size_t check_every, kvs_replay_result *out, char *err, size_t errlen)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    memset(out, 0, sizeof *out);
    kvs_store_opts o = {.capacity_blocks = capacity_blocks, .policy = policy, .verify_chain = 1};
    kvs_store *s = NULL;
    kvs_key *k = NULL;
    uint64_t *next = NULL;
    uint32_t *tok = NULL;
    int belady = policy && !strcmp(policy, "belady");
    int rc = kvs_store_open(&o, &s);
    if (rc) {
        snprintf(err, errlen, "unknown policy '%s'", policy ? policy : "(null)");
        return rc;
    }
    size_t maxn = 1;
    for (size_t r = 0; r < t->nreq; r++)
        if (t->off[r + 1] - t->off[r] > maxn)
            maxn = t->off[r + 1] - t->off[r];
    tok = malloc(maxn * SIM_BT * sizeof *tok);
    rc = tok ? trace_keys(t, &k) : KVS_ENOMEM;
    if (!rc && belady)
        rc = next_uses(t, k, &next);
    for (size_t r = 0; r < t->nreq && !rc; r++) {
        size_t b0 = t->off[r], n = t->off[r + 1] - b0, hit = 0;
        for (size_t i = 0; i < n; i++)
            block_tokens(t->ids[b0 + i], tok + i * SIM_BT);
        if (t->put && t->put[r]) { /* inserts only: not demand */
            size_t ins = 0;
            out->put_blocks += n;
            rc = n ? kvs_store_insert_chain(s, k + b0, NULL, 0, tok, SIM_BT, n, 0, &ins) : 0;
            if (rc == KVS_ENOSPC)
                rc = 0;
            for (size_t i = 0; belady && i < ins && !rc; i++)
                rc = kvs_store_hint(s, &k[b0 + i], next[b0 + i]);
            if (rc)
                snprintf(err, errlen, "request %zu: %s", r + 1, kvs_strerror(rc));
            if (!rc && check_every && (r + 1) % check_every == 0)
                rc = kvs_store_check(s, err, errlen);
            continue;
        }
        rc = kvs_store_lookup(s, k + b0, tok, SIM_BT, n, &hit);
        out->requested += n;
        out->hits += hit;
        for (size_t i = 0; belady && i < hit && !rc; i++)
            rc = kvs_store_hint(s, &k[b0 + i], next[b0 + i]);
        size_t ins = 0;
        if (!rc && hit < n)
            rc = kvs_store_insert_chain(s, k + b0 + hit, hit ? &k[b0 + hit - 1] : NULL, 0,
                                        tok + hit * SIM_BT, SIM_BT, n - hit, 0, &ins);
        if (rc == KVS_ENOSPC) /* full of pinned blocks, or not admitted */
            rc = 0;
        for (size_t i = hit; belady && i < hit + ins && !rc; i++)
            rc = kvs_store_hint(s, &k[b0 + i], next[b0 + i]);
        if (rc)
            snprintf(err, errlen, "request %zu: %s", r + 1, kvs_strerror(rc));
        if (!rc && check_every && (r + 1) % check_every == 0)
            rc = kvs_store_check(s, err, errlen);
    }
    if (!rc && check_every)
        rc = kvs_store_check(s, err, errlen);
    kvs_store_stats st;
    kvs_store_get_stats(s, &st);
    out->evictions = st.evictions[KVS_EVICT_CAPACITY];
    kvs_store_close(s);
    free(k);
    free(next);
    free(tok);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    out->seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    return rc;
}
