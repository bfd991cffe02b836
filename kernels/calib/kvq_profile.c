/*
 * kvq_profile.c — calibration profiles: the text form, written and strictly
 * parsed.
 *
 * The grammar (docs/CALIBRATION.md has it with an example) is a fixed
 * sequence of lines, each a keyword and then positional numbers or key=value
 * fields in a fixed order. The parser is a small state machine that knows
 * which line must come next; anything else — an unknown keyword, a missing,
 * extra or misordered field, a number that does not parse completely, a
 * value out of range, a missing "end" — is an error that names the line and
 * the field. Floats are printed with 9 significant digits, which round-trips
 * every binary32 value exactly, so a profile read back gives the same bits.
 *
 * Untrusted input: the text need not be NUL-terminated; the parser works on a
 * private copy, never indexes arrays with unchecked numbers (every layer and
 * head index must equal the expected one), and caps the text size.
 */
#include "kvq_calib.h"

#include "kvs_error.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- names -------------------------------------------------------------------- */

const char *kvs_scheme_name(kvs_scheme s)
{
    switch (s) {
    case KVS_SCHEME_FP16:
        return "fp16";
    case KVS_SCHEME_FP8_E4M3:
        return "fp8_e4m3";
    case KVS_SCHEME_FP8_E5M2:
        return "fp8_e5m2";
    case KVS_SCHEME_INT8:
        return "int8";
    }
    return "unknown";
}

int kvs_scheme_parse(const char *name, kvs_scheme *out)
{
    static const struct {
        const char *name;
        kvs_scheme s;
    } tab[] = {{"fp16", KVS_SCHEME_FP16},     {"fp8_e4m3", KVS_SCHEME_FP8_E4M3},
               {"e4m3", KVS_SCHEME_FP8_E4M3}, {"fp8_e5m2", KVS_SCHEME_FP8_E5M2},
               {"e5m2", KVS_SCHEME_FP8_E5M2}, {"int8", KVS_SCHEME_INT8}};
    for (size_t i = 0; name && i < sizeof tab / sizeof tab[0]; i++)
        if (strcmp(name, tab[i].name) == 0) {
            *out = tab[i].s;
            return 0;
        }
    return KVS_EINVAL;
}

const char *kvs_dtype_name(kvs_dtype d)
{
    switch (d) {
    case KVS_DTYPE_FP16:
        return "fp16";
    case KVS_DTYPE_BF16:
        return "bf16";
    case KVS_DTYPE_FP32:
        return "fp32";
    }
    return "unknown";
}

static int dtype_parse(const char *name, kvs_dtype *out)
{
    if (strcmp(name, "fp16") == 0)
        *out = KVS_DTYPE_FP16;
    else if (strcmp(name, "bf16") == 0)
        *out = KVS_DTYPE_BF16;
    else if (strcmp(name, "fp32") == 0)
        *out = KVS_DTYPE_FP32;
    else
        return KVS_EINVAL;
    return 0;
}

/* ---- the object --------------------------------------------------------------- */

static int scale_ok(float s)
{
    return s >= 0.0f && s <= FLT_MAX;
} /* NaN fails */

/* The scalar fields; "what" is NULL when fine. */
static const char *header_problem(const kvs_profile *p)
{
    size_t n = strnlen(p->model, sizeof p->model);
    if (n < 1 || n > KVS_PROFILE_MODEL_MAX)
        return "model: must be 1..64 characters";
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)p->model[i] < 0x21 || (unsigned char)p->model[i] > 0x7E)
            return "model: printable ASCII without spaces only";
    if (p->num_layers < 1 || p->num_layers > KVS_BLOCK_MAX_LAYERS)
        return "layers: must be 1..1024";
    if (p->num_kv_heads < 1 || p->num_kv_heads > KVS_BLOCK_MAX_HEADS)
        return "kv_heads: must be 1..256";
    if (p->head_dim < 1 || p->head_dim > KVS_TILE_MAX_DIM)
        return "head_dim: must be 1..1024";
    if (p->block_tokens < KVS_BLOCK_MIN_TOKENS || p->block_tokens > KVS_BLOCK_MAX_TOKENS)
        return "block_tokens: must be 16..1024";
    if (p->dtype != KVS_DTYPE_FP16 && p->dtype != KVS_DTYPE_BF16 && p->dtype != KVS_DTYPE_FP32)
        return "dtype: must be fp16, bf16 or fp32";
    if (p->scheme != KVS_SCHEME_FP8_E4M3 && p->scheme != KVS_SCHEME_FP8_E5M2 &&
        p->scheme != KVS_SCHEME_INT8)
        return "scheme: must be fp8_e4m3, fp8_e5m2 or int8";
    if (p->k_outliers > KVS_TILE_MAX_OUTLIERS)
        return "k: must be 0..16";
    if (p->v_outliers > KVS_TILE_MAX_OUTLIERS)
        return "v: must be 0..16";
    if (p->sinks > KVS_TILE_MAX_SINKS || p->sinks > p->block_tokens)
        return "sinks: must be 0..min(block_tokens, 64)";
    if (p->key_offsets > 1)
        return "key_offsets: must be 0 or 1";
    if (!(p->percentile > 0.0 && p->percentile <= 100.0))
        return "percentile: must be in (0, 100]";
    return NULL;
}

int kvs_profile_check(const kvs_profile *p, char *err)
{
    if (p == NULL)
        return kvs_fail(err, KVS_EINVAL, "profile: NULL");
    const char *why = header_problem(p);
    if (why)
        return kvs_fail(err, KVS_EINVAL, "profile: %s", why);
    if (p->layers == NULL || p->k_scales == NULL || p->v_scales == NULL)
        return kvs_fail(err, KVS_EINVAL, "profile: missing arrays");
    const uint32_t L = p->num_layers, H = p->num_kv_heads, D = p->head_dim;
    for (uint32_t l = 0; l < L; l++) {
        const kvs_profile_layer *y = &p->layers[l];
        if (!scale_ok(y->k_amax) || !scale_ok(y->v_amax) || !scale_ok(y->k_tensor_scale) ||
            !scale_ok(y->v_tensor_scale))
            return kvs_fail(err, KVS_EINVAL,
                        "profile: layer %u: amax and tensor scales must be "
                        "finite and >= 0",
                        l);
        for (uint32_t h = 0; h < H; h++) {
            if (!scale_ok(p->v_scales[(size_t)l * H + h]))
                return kvs_fail(err, KVS_EINVAL,
                            "profile: v scale of layer %u head %u: must be "
                            "finite and >= 0",
                            l, h);
            for (uint32_t d = 0; d < D; d++)
                if (!scale_ok(p->k_scales[((size_t)l * H + h) * D + d]))
                    return kvs_fail(err, KVS_EINVAL,
                                "profile: k scale of layer %u head %u "
                                "channel %u: must be finite and >= 0",
                                l, h, d);
        }
    }
    return 0;
}

int kvs_profile_create(const kvs_profile *shape, kvs_profile **out, char *err)
{
    if (shape == NULL || out == NULL)
        return kvs_fail(err, KVS_EINVAL, "profile: NULL argument");
    const char *why = header_problem(shape);
    if (why)
        return kvs_fail(err, KVS_EINVAL, "profile: %s", why);
    kvs_profile *p = calloc(1, sizeof *p);
    if (p == NULL)
        return kvs_fail(err, KVS_ENOMEM, "profile: out of memory");
    *p = *shape;
    const size_t L = p->num_layers, H = p->num_kv_heads, D = p->head_dim;
    p->layers = calloc(L, sizeof *p->layers);
    p->k_scales = calloc(L * H * D, sizeof *p->k_scales);
    p->v_scales = calloc(L * H, sizeof *p->v_scales);
    if (!p->layers || !p->k_scales || !p->v_scales) {
        kvs_profile_free(p);
        return kvs_fail(err, KVS_ENOMEM, "profile: out of memory");
    }
    *out = p;
    return 0;
}

void kvs_profile_free(kvs_profile *p)
{
    if (p == NULL)
        return;
    free(p->layers);
    free(p->k_scales);
    free(p->v_scales);
    free(p);
}

const float *kvs_profile_k_scales(const kvs_profile *p, uint32_t layer, uint32_t head)
{
    if (p == NULL || layer >= p->num_layers || head >= p->num_kv_heads)
        return NULL;
    return p->k_scales + ((size_t)layer * p->num_kv_heads + head) * p->head_dim;
}

int kvs_profile_v_scales_fill(const kvs_profile *p, uint32_t layer, uint32_t head, uint32_t T,
                              float *out)
{
    if (p == NULL || out == NULL || layer >= p->num_layers || head >= p->num_kv_heads)
        return KVS_EINVAL;
    float s = p->v_scales[(size_t)layer * p->num_kv_heads + head];
    for (uint32_t t = 0; t < T; t++)
        out[t] = s;
    return 0;
}

int kvs_profile_tile_params(const kvs_profile *p, uint32_t layer, kvs_tile_kind kind, uint32_t T,
                            int root, kvs_tile_params *out)
{
    if (p == NULL || out == NULL || layer >= p->num_layers ||
        (kind != KVS_TILE_K && kind != KVS_TILE_V) || T < 1 || T > KVS_TILE_MAX_TOKENS)
        return KVS_EINVAL;
    memset(out, 0, sizeof *out);
    out->scheme = p->scheme;
    out->kind = kind;
    out->tokens = T;
    out->dim = p->head_dim;
    out->outliers = kind == KVS_TILE_K ? p->k_outliers : p->v_outliers;
    out->sinks = root ? (p->sinks < T ? p->sinks : T) : 0;
    out->key_offsets = kind == KVS_TILE_K ? p->key_offsets : 0;
    out->static_scales = NULL;
    out->tensor_scale =
        kind == KVS_TILE_K ? p->layers[layer].k_tensor_scale : p->layers[layer].v_tensor_scale;
    return 0;
}

/* ---- writing -------------------------------------------------------------------- */

int kvs_profile_print(const kvs_profile *p, FILE *f, char *err)
{
    int rc = kvs_profile_check(p, err);
    if (rc)
        return rc;
    const uint32_t L = p->num_layers, H = p->num_kv_heads, D = p->head_dim;
    fprintf(f, "# kvstash calibration profile (docs/CALIBRATION.md)\n");
    fprintf(f, "kvstash-profile %u\n", KVS_PROFILE_VERSION);
    fprintf(f, "model %s\n", p->model);
    fprintf(f, "layout layers=%u kv_heads=%u head_dim=%u block_tokens=%u dtype=%s keys=%s\n", L, H,
            D, p->block_tokens, kvs_dtype_name(p->dtype), p->post_rope ? "post-rope" : "pre-rope");
    fprintf(f, "scheme %s\n", kvs_scheme_name(p->scheme));
    /* key_offsets only when set: a profile without offsets stays readable by
     * readers that predate the field */
    fprintf(f, "outliers k=%u v=%u sinks=%u%s\n", p->k_outliers, p->v_outliers, p->sinks,
            p->key_offsets ? " key_offsets=1" : "");
    fprintf(f, "calibration samples=%llu tokens=%llu percentile=%.10g\n",
            (unsigned long long)p->samples, (unsigned long long)p->tokens, p->percentile);
    for (uint32_t l = 0; l < L; l++) {
        const kvs_profile_layer *y = &p->layers[l];
        fprintf(f, "layer %u k_amax=%.9g v_amax=%.9g k_tensor_scale=%.9g v_tensor_scale=%.9g\n", l,
                (double)y->k_amax, (double)y->v_amax, (double)y->k_tensor_scale,
                (double)y->v_tensor_scale);
        for (uint32_t h = 0; h < H; h++) {
            fprintf(f, "k %u %u", l, h);
            const float *s = p->k_scales + ((size_t)l * H + h) * D;
            for (uint32_t d = 0; d < D; d++)
                fprintf(f, " %.9g", (double)s[d]);
            fputc('\n', f);
        }
        fprintf(f, "v %u", l);
        for (uint32_t h = 0; h < H; h++)
            fprintf(f, " %.9g", (double)p->v_scales[(size_t)l * H + h]);
        fputc('\n', f);
    }
    fprintf(f, "end\n");
    if (ferror(f))
        return kvs_fail(err, KVS_EIO, "profile: write error");
    return 0;
}

int kvs_profile_write(const char *path, const kvs_profile *p, char *err)
{
    int rc = kvs_profile_check(p, err);
    if (rc)
        return rc;
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return kvs_fail(err, KVS_EIO, "%s: cannot create: %s", path, strerror(errno));
    rc = kvs_profile_print(p, f, err);
    if (fclose(f) != 0 && rc == 0)
        rc = kvs_fail(err, KVS_EIO, "%s: write failed: %s", path, strerror(errno));
    if (rc)
        remove(path);
    return rc;
}

/* ---- parsing -------------------------------------------------------------------- */

#define MAX_FIELDS (KVS_TILE_MAX_DIM + 8)

typedef struct parser {
    char *buf;     /* private NUL-terminated copy */
    char *next;    /* start of the next line */
    unsigned line; /* number of the current line, 1-based */
    char *tok[MAX_FIELDS];
    int ntok;
    char *err;
} parser;

/* Next meaningful line, split into tokens. 1: got one, 0: end of text,
 * negative: error. */
static int next_line(parser *ps)
{
    while (*ps->next != '\0') {
        char *s = ps->next;
        char *nl = strchr(s, '\n');
        if (nl) {
            *nl = '\0';
            ps->next = nl + 1;
        } else {
            ps->next = s + strlen(s);
        }
        ps->line++;
        if (strchr(s, '\r'))
            return kvs_fail(ps->err, KVS_EFORMAT,
                        "profile line %u: carriage return (use \\n line "
                        "ends)",
                        ps->line);
        while (*s == ' ' || *s == '\t')
            s++;
        if (*s == '\0' || *s == '#')
            continue;
        ps->ntok = 0;
        while (*s) {
            if (ps->ntok == MAX_FIELDS)
                return kvs_fail(ps->err, KVS_EFORMAT, "profile line %u: more than %d fields", ps->line,
                            MAX_FIELDS);
            ps->tok[ps->ntok++] = s;
            while (*s && *s != ' ' && *s != '\t')
                s++;
            if (*s) {
                *s++ = '\0';
                while (*s == ' ' || *s == '\t')
                    s++;
            }
        }
        return 1;
    }
    return 0;
}

/* Requires the next line to start with keyword and have exactly nfields
 * fields after it (-1: any number, checked by the caller). */
static int expect(parser *ps, const char *keyword, int nfields)
{
    int r = next_line(ps);
    if (r < 0)
        return r;
    if (r == 0)
        return kvs_fail(ps->err, KVS_EFORMAT,
                    "profile line %u: truncated: expected a '%s' line, "
                    "found the end of the file",
                    ps->line + 1, keyword);
    if (strcmp(ps->tok[0], keyword) != 0)
        return kvs_fail(ps->err, KVS_EFORMAT, "profile line %u: expected a '%s' line, found '%.40s'",
                    ps->line, keyword, ps->tok[0]);
    if (nfields >= 0 && ps->ntok - 1 != nfields)
        return kvs_fail(ps->err, KVS_EFORMAT, "profile line %u: '%s' takes %d fields, found %d",
                    ps->line, keyword, nfields, ps->ntok - 1);
    return 0;
}

/* Token i as "key=value": returns the value or NULL after setting the error. */
static const char *keyval(parser *ps, int i, const char *key, int *rc)
{
    size_t n = strlen(key);
    if (strncmp(ps->tok[i], key, n) != 0 || ps->tok[i][n] != '=') {
        *rc = kvs_fail(ps->err, KVS_EFORMAT,
                   "profile line %u: field %d: expected '%s=', found "
                   "'%.40s'",
                   ps->line, i, key, ps->tok[i]);
        return NULL;
    }
    return ps->tok[i] + n + 1;
}

/* Decimal unsigned integer, digits only, at most max. */
static int parse_uint(parser *ps, const char *s, const char *field, uint64_t max, uint64_t *out)
{
    if (*s < '0' || *s > '9')
        return kvs_fail(ps->err, KVS_EFORMAT,
                    "profile line %u: field '%s': not an unsigned integer: "
                    "'%.40s'",
                    ps->line, field, s);
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end != '\0')
        return kvs_fail(ps->err, KVS_EFORMAT,
                    "profile line %u: field '%s': not an unsigned integer: "
                    "'%.40s'",
                    ps->line, field, s);
    if (errno == ERANGE || v > max)
        return kvs_fail(ps->err, KVS_EINVAL,
                    "profile line %u: field '%s': %.40s is out of range "
                    "(at most %llu)",
                    ps->line, field, s, (unsigned long long)max);
    *out = v;
    return 0;
}

static int parse_u32(parser *ps, const char *s, const char *field, uint32_t max, uint32_t *out)
{
    uint64_t v;
    int rc = parse_uint(ps, s, field, max, &v);
    if (rc == 0)
        *out = (uint32_t)v;
    return rc;
}

/* A finite number >= 0 that fits a float. */
static int parse_scale(parser *ps, const char *s, const char *field, unsigned index, float *out)
{
    char *end;
    char name[64];
    snprintf(name, sizeof name, index == ~0u ? "%s" : "%s[%u]", field, index);
    if (*s == '\0' || *s == ' ' || *s == '+')
        return kvs_fail(ps->err, KVS_EFORMAT, "profile line %u: field '%s': not a number: '%.40s'",
                    ps->line, name, s);
    errno = 0;
    float v = strtof(s, &end);
    if (end == s || *end != '\0')
        return kvs_fail(ps->err, KVS_EFORMAT, "profile line %u: field '%s': not a number: '%.40s'",
                    ps->line, name, s);
    /* ERANGE alone is fine: glibc sets it for subnormal results, which are
     * exact round trips; overflow shows as Inf and fails the range. */
    if (!(v >= 0.0f && v <= FLT_MAX) || signbit(v))
        return kvs_fail(ps->err, KVS_EINVAL,
                    "profile line %u: field '%s': must be a finite number "
                    ">= 0, found '%.40s'",
                    ps->line, name, s);
    *out = v;
    return 0;
}

/* The index field i must be exactly `want` (lines come in order). */
static int parse_index(parser *ps, int i, const char *field, uint32_t want)
{
    uint64_t v;
    int rc = parse_uint(ps, ps->tok[i], field, UINT32_MAX, &v);
    if (rc)
        return rc == KVS_EINVAL ? KVS_EFORMAT : rc;
    if (v != want)
        return kvs_fail(ps->err, KVS_EFORMAT,
                    "profile line %u: field '%s': %llu, expected %u (lines "
                    "must come in order)",
                    ps->line, field, (unsigned long long)v, want);
    return 0;
}

static int range(parser *ps, const char *field, uint64_t v, uint64_t lo, uint64_t hi)
{
    if (v < lo || v > hi)
        return kvs_fail(ps->err, KVS_EINVAL,
                    "profile line %u: field '%s': %llu is out of range "
                    "%llu..%llu",
                    ps->line, field, (unsigned long long)v, (unsigned long long)lo,
                    (unsigned long long)hi);
    return 0;
}

#define TRY(x)                                                                                     \
    do {                                                                                           \
        rc = (x);                                                                                  \
        if (rc)                                                                                    \
            goto out;                                                                              \
    } while (0)

#define KV(i, key, var)                                                                            \
    do {                                                                                           \
        var = keyval(&ps, i, key, &rc);                                                            \
        if (var == NULL)                                                                           \
            goto out;                                                                              \
    } while (0)

int kvs_profile_parse(const char *text, size_t len, kvs_profile **out, char *err)
{
    if (out == NULL)
        return kvs_fail(err, KVS_EINVAL, "profile parse: NULL output");
    if (text == NULL)
        len = 0;
    if (len > KVS_PROFILE_MAX_BYTES)
        return kvs_fail(err, KVS_EFORMAT, "profile: %zu bytes, larger than the %zu-byte limit", len,
                    KVS_PROFILE_MAX_BYTES);
    if (len && memchr(text, '\0', len))
        return kvs_fail(err, KVS_EFORMAT, "profile: NUL byte in the text");
    parser ps;
    memset(&ps, 0, sizeof ps);
    ps.err = err;
    ps.buf = malloc(len + 1);
    if (ps.buf == NULL)
        return kvs_fail(err, KVS_ENOMEM, "profile: out of memory");
    if (len)
        memcpy(ps.buf, text, len);
    ps.buf[len] = '\0';
    ps.next = ps.buf;

    int rc = 0;
    kvs_profile *p = NULL;
    kvs_profile h;
    memset(&h, 0, sizeof h);
    const char *v;

    TRY(expect(&ps, "kvstash-profile", 1));
    if (strcmp(ps.tok[1], "1") != 0) {
        rc = kvs_fail(err, KVS_EFORMAT,
                  "profile line %u: field 'version': unsupported version "
                  "'%.20s' (this reader knows 1)",
                  ps.line, ps.tok[1]);
        goto out;
    }

    TRY(expect(&ps, "model", 1));
    if (strlen(ps.tok[1]) > KVS_PROFILE_MODEL_MAX) {
        rc = kvs_fail(err, KVS_EINVAL, "profile line %u: field 'model': longer than %u characters",
                  ps.line, KVS_PROFILE_MODEL_MAX);
        goto out;
    }
    for (const char *c = ps.tok[1]; *c; c++)
        if ((unsigned char)*c < 0x21 || (unsigned char)*c > 0x7E) {
            rc = kvs_fail(err, KVS_EFORMAT,
                      "profile line %u: field 'model': byte 0x%02x is not "
                      "printable ASCII",
                      ps.line, (unsigned char)*c);
            goto out;
        }
    memcpy(h.model, ps.tok[1], strlen(ps.tok[1]) + 1);

    TRY(expect(&ps, "layout", 6));
    KV(1, "layers", v);
    TRY(parse_u32(&ps, v, "layers", UINT32_MAX, &h.num_layers));
    KV(2, "kv_heads", v);
    TRY(parse_u32(&ps, v, "kv_heads", UINT32_MAX, &h.num_kv_heads));
    KV(3, "head_dim", v);
    TRY(parse_u32(&ps, v, "head_dim", UINT32_MAX, &h.head_dim));
    KV(4, "block_tokens", v);
    TRY(parse_u32(&ps, v, "block_tokens", UINT32_MAX, &h.block_tokens));
    KV(5, "dtype", v);
    if (dtype_parse(v, &h.dtype) != 0) {
        rc = kvs_fail(err, KVS_EINVAL,
                  "profile line %u: field 'dtype': '%.20s' is not fp16, bf16 "
                  "or fp32",
                  ps.line, v);
        goto out;
    }
    TRY(range(&ps, "layers", h.num_layers, 1, KVS_BLOCK_MAX_LAYERS));
    TRY(range(&ps, "kv_heads", h.num_kv_heads, 1, KVS_BLOCK_MAX_HEADS));
    TRY(range(&ps, "head_dim", h.head_dim, 1, KVS_TILE_MAX_DIM));
    TRY(range(&ps, "block_tokens", h.block_tokens, KVS_BLOCK_MIN_TOKENS, KVS_BLOCK_MAX_TOKENS));
    KV(6, "keys", v);
    if (strcmp(v, "post-rope") == 0) {
        h.post_rope = 1;
    } else if (strcmp(v, "pre-rope") != 0) {
        rc = kvs_fail(err, KVS_EINVAL,
                  "profile line %u: field 'keys': '%.20s' is not pre-rope or "
                  "post-rope",
                  ps.line, v);
        goto out;
    }

    TRY(expect(&ps, "scheme", 1));
    if (kvs_scheme_parse(ps.tok[1], &h.scheme) != 0 ||
        strcmp(ps.tok[1], kvs_scheme_name(h.scheme)) != 0 || h.scheme == KVS_SCHEME_FP16) {
        rc = kvs_fail(err, KVS_EINVAL,
                  "profile line %u: field 'scheme': '%.20s' is not fp8_e4m3, "
                  "fp8_e5m2 or int8",
                  ps.line, ps.tok[1]);
        goto out;
    }

    TRY(expect(&ps, "outliers", -1));
    if (ps.ntok - 1 != 3 && ps.ntok - 1 != 4) {
        rc = kvs_fail(err, KVS_EFORMAT,
                      "profile line %u: 'outliers' takes 3 fields (4 with key_offsets), found %d",
                      ps.line, ps.ntok - 1);
        goto out;
    }
    KV(1, "k", v);
    TRY(parse_u32(&ps, v, "k", KVS_TILE_MAX_OUTLIERS, &h.k_outliers));
    KV(2, "v", v);
    TRY(parse_u32(&ps, v, "v", KVS_TILE_MAX_OUTLIERS, &h.v_outliers));
    KV(3, "sinks", v);
    TRY(parse_u32(&ps, v, "sinks", KVS_TILE_MAX_SINKS, &h.sinks));
    TRY(range(&ps, "sinks", h.sinks, 0, h.block_tokens));
    if (ps.ntok - 1 == 4) { /* optional, absent in older profiles: 0 */
        KV(4, "key_offsets", v);
        TRY(parse_u32(&ps, v, "key_offsets", 1, &h.key_offsets));
    }

    TRY(expect(&ps, "calibration", 3));
    KV(1, "samples", v);
    TRY(parse_uint(&ps, v, "samples", UINT64_MAX, &h.samples));
    KV(2, "tokens", v);
    TRY(parse_uint(&ps, v, "tokens", UINT64_MAX, &h.tokens));
    KV(3, "percentile", v);
    {
        float pf;
        TRY(parse_scale(&ps, v, "percentile", ~0u, &pf));
        h.percentile = strtod(v, NULL); /* the double the text names, not the float */
        if (!(h.percentile > 0.0 && h.percentile <= 100.0)) {
            rc = kvs_fail(err, KVS_EINVAL,
                      "profile line %u: field 'percentile': %.40s is not in "
                      "(0, 100]",
                      ps.line, v);
            goto out;
        }
    }

    /* The header fields together, with the field names of the text. */
    {
        const char *why = header_problem(&h);
        if (why) {
            rc = kvs_fail(err, KVS_EINVAL, "profile: %s", why);
            goto out;
        }
    }
    TRY(kvs_profile_create(&h, &p, err));

    const uint32_t L = p->num_layers, H = p->num_kv_heads, D = p->head_dim;
    for (uint32_t l = 0; l < L; l++) {
        kvs_profile_layer *y = &p->layers[l];
        TRY(expect(&ps, "layer", 5));
        TRY(parse_index(&ps, 1, "layer", l));
        KV(2, "k_amax", v);
        TRY(parse_scale(&ps, v, "k_amax", ~0u, &y->k_amax));
        KV(3, "v_amax", v);
        TRY(parse_scale(&ps, v, "v_amax", ~0u, &y->v_amax));
        KV(4, "k_tensor_scale", v);
        TRY(parse_scale(&ps, v, "k_tensor_scale", ~0u, &y->k_tensor_scale));
        KV(5, "v_tensor_scale", v);
        TRY(parse_scale(&ps, v, "v_tensor_scale", ~0u, &y->v_tensor_scale));
        for (uint32_t hd = 0; hd < H; hd++) {
            TRY(expect(&ps, "k", (int)D + 2));
            TRY(parse_index(&ps, 1, "layer", l));
            TRY(parse_index(&ps, 2, "head", hd));
            float *s = p->k_scales + ((size_t)l * H + hd) * D;
            for (uint32_t d = 0; d < D; d++)
                TRY(parse_scale(&ps, ps.tok[3 + d], "k_scale", d, &s[d]));
        }
        TRY(expect(&ps, "v", (int)H + 1));
        TRY(parse_index(&ps, 1, "layer", l));
        for (uint32_t hd = 0; hd < H; hd++)
            TRY(parse_scale(&ps, ps.tok[2 + hd], "v_scale", hd, &p->v_scales[(size_t)l * H + hd]));
    }
    TRY(expect(&ps, "end", 0));
    {
        int r = next_line(&ps);
        if (r < 0) {
            rc = r;
            goto out;
        }
        if (r > 0) {
            rc = kvs_fail(err, KVS_EFORMAT, "profile line %u: '%.40s' after 'end'", ps.line, ps.tok[0]);
            goto out;
        }
    }
    *out = p;
    p = NULL;
out:
    kvs_profile_free(p);
    free(ps.buf);
    return rc;
}

int kvs_profile_read(const char *path, kvs_profile **out, char *err)
{
    if (path == NULL || out == NULL)
        return kvs_fail(err, KVS_EINVAL, "profile read: NULL argument");
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return kvs_fail(err, KVS_EIO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    int rc = 0;
    while (buf) {
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (len < cap)
            break;
        if (cap > KVS_PROFILE_MAX_BYTES) {
            rc = kvs_fail(err, KVS_EFORMAT, "%s: larger than the %zu-byte profile limit", path,
                      KVS_PROFILE_MAX_BYTES);
            break;
        }
        char *nb = realloc(buf, cap * 2);
        if (nb == NULL) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    if (buf == NULL)
        rc = kvs_fail(err, KVS_ENOMEM, "%s: out of memory", path);
    else if (rc == 0 && ferror(f))
        rc = kvs_fail(err, KVS_EIO, "%s: read error", path);
    fclose(f);
    if (rc == 0) {
        char why[KVS_ERR_LEN] = "";
        rc = kvs_profile_parse(buf, len, out, why);
        if (rc)
            kvs_fail(err, rc, "%s: %s", path, why);
    }
    free(buf);
    return rc;
}
