/*
 * kvq_sample.c — KV sample files ("KVSM"): write, validate, read.
 *
 * A sample file is a 112-byte header and then, per layer, K, V (and Q when
 * flagged) as [tokens][heads][head_dim] elements of one dtype. The checksum
 * (XXH3-64, the same hash kvs_tile_checksum computes) covers the header with
 * its checksum field zeroed and every data byte, so a flipped bit anywhere —
 * shape, model fingerprint or data — is caught.
 *
 * Reading an untrusted file: the header alone is read and checked first
 * (every field against its limit, data_bytes against the shape), then the
 * file's size against the header, and only then is memory allocated and the
 * data read; so a forged header cannot make us allocate more than the file
 * holds, and a short file is reported as truncated, never read past its end.
 * Writing hashes first and writes second, so a pipe works as a destination.
 */
#include "kvq_calib.h"
#include "kvq.h"
#include "kvq_math.h"

#include "kvs_error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

size_t kvs_sample_elem_size(kvs_dtype dt)
{
    switch (dt) {
    case KVS_DTYPE_FP16:
    case KVS_DTYPE_BF16:
        return 2;
    case KVS_DTYPE_FP32:
        return 4;
    }
    return 0;
}

/* The model fingerprint: printable ASCII without spaces, so that it is one
 * token in a profile line. */
static int model_char_ok(unsigned char c)
{
    return c >= 0x21 && c <= 0x7E;
}

/* Shared by info checks (EINVAL, for writers) and header checks (EFORMAT, for
 * readers): returns what is wrong, or NULL. */
static const char *shape_problem(uint32_t L, uint32_t H, uint32_t D, uint32_t Hq, uint32_t T,
                                 unsigned dtype, uint32_t flags)
{
    if (dtype != KVS_DTYPE_FP16 && dtype != KVS_DTYPE_BF16 && dtype != KVS_DTYPE_FP32)
        return "dtype: must be 1 (fp16), 2 (bf16) or 3 (fp32)";
    if (flags & ~KVS_SAMPLE_F_KNOWN)
        return "flags: unknown bits";
    if (L < 1 || L > KVS_BLOCK_MAX_LAYERS)
        return "num_layers: must be 1..1024";
    if (H < 1 || H > KVS_BLOCK_MAX_HEADS)
        return "num_kv_heads: must be 1..256";
    if (D < 1 || D > KVS_TILE_MAX_DIM)
        return "head_dim: must be 1..1024";
    if (T < 1 || T > KVS_SAMPLE_MAX_TOKENS)
        return "tokens: must be 1..1048576";
    if (flags & KVS_SAMPLE_F_QUERIES) {
        if (Hq < H || Hq > KVS_SAMPLE_MAX_Q_HEADS || Hq % H != 0)
            return "num_q_heads: must be a multiple of num_kv_heads, at most 1024";
    } else if (Hq != 0) {
        return "num_q_heads: must be 0 without the queries flag";
    }
    return NULL;
}

static uint64_t data_bytes_of(uint32_t L, uint32_t H, uint32_t D, uint32_t Hq, uint32_t T,
                              kvs_dtype dt)
{
    /* <= 2^10 * 1536 * 2^20 * 2^10 * 4 < 2^64: no overflow within the limits. */
    return (uint64_t)L * (2u * (uint64_t)H + Hq) * T * D * kvs_sample_elem_size(dt);
}

int kvs_sample_info_check(const kvs_sample_info *info, char *err)
{
    if (info == NULL)
        return kvs_fail(err, KVS_EINVAL, "sample info: NULL");
    const char *why = shape_problem(info->num_layers, info->num_kv_heads, info->head_dim,
                                    info->num_q_heads, info->tokens, info->dtype, info->flags);
    if (why)
        return kvs_fail(err, KVS_EINVAL, "sample info: %s", why);
    size_t n = strnlen(info->model, sizeof info->model);
    if (n > KVS_SAMPLE_MODEL_LEN)
        return kvs_fail(err, KVS_EINVAL, "sample info: model: longer than 64 characters");
    for (size_t i = 0; i < n; i++)
        if (!model_char_ok((unsigned char)info->model[i]))
            return kvs_fail(err, KVS_EINVAL,
                        "sample info: model: character %zu is not printable "
                        "ASCII without spaces",
                        i);
    uint64_t bytes = kvs_sample_data_bytes(info);
    if (bytes > KVS_SAMPLE_MAX_DATA_BYTES || bytes > SIZE_MAX)
        return kvs_fail(err, KVS_EINVAL, "sample info: %llu data bytes, the limit is %llu",
                    (unsigned long long)bytes, (unsigned long long)KVS_SAMPLE_MAX_DATA_BYTES);
    return 0;
}

uint64_t kvs_sample_data_bytes(const kvs_sample_info *info)
{
    return data_bytes_of(info->num_layers, info->num_kv_heads, info->head_dim, info->num_q_heads,
                         info->tokens, info->dtype);
}

int kvs_sample_create(const kvs_sample_info *info, kvs_sample **out, char *err)
{
    int rc = kvs_sample_info_check(info, err);
    if (rc)
        return rc;
    kvs_sample *s = calloc(1, sizeof *s);
    if (s == NULL)
        return kvs_fail(err, KVS_ENOMEM, "sample: out of memory");
    s->info = *info;
    s->info.model[KVS_SAMPLE_MODEL_LEN] = '\0';
    s->data_bytes = (size_t)kvs_sample_data_bytes(info);
    s->data = calloc(1, s->data_bytes);
    if (s->data == NULL) {
        size_t want = s->data_bytes;
        free(s);
        return kvs_fail(err, KVS_ENOMEM, "sample: cannot allocate %zu bytes", want);
    }
    *out = s;
    return 0;
}

void kvs_sample_free(kvs_sample *s)
{
    if (s == NULL)
        return;
    free(s->data);
    free(s);
}

/* Bytes of one part of one layer. */
static size_t part_bytes(const kvs_sample_info *in, kvs_sample_part part)
{
    size_t heads = part == KVS_SAMPLE_Q ? in->num_q_heads : in->num_kv_heads;
    return (size_t)in->tokens * heads * in->head_dim * kvs_sample_elem_size(in->dtype);
}

void *kvs_sample_part_ptr(const kvs_sample *s, kvs_sample_part part, uint32_t layer)
{
    const kvs_sample_info *in = &s->info;
    if (layer >= in->num_layers || (part == KVS_SAMPLE_Q && !(in->flags & KVS_SAMPLE_F_QUERIES)))
        return NULL;
    size_t kv = part_bytes(in, KVS_SAMPLE_K);
    size_t layer_bytes = 2 * kv + part_bytes(in, KVS_SAMPLE_Q);
    size_t off = (size_t)layer * layer_bytes + (part == KVS_SAMPLE_K   ? 0
                                                : part == KVS_SAMPLE_V ? kv
                                                                       : 2 * kv);
    return s->data + off;
}

float kvs_sample_value(const kvs_sample *s, kvs_sample_part part, uint32_t layer, uint32_t t,
                       uint32_t head, uint32_t d)
{
    const kvs_sample_info *in = &s->info;
    uint32_t heads = part == KVS_SAMPLE_Q ? in->num_q_heads : in->num_kv_heads;
    const unsigned char *base = kvs_sample_part_ptr(s, part, layer);
    KVS_ASSERT(base != NULL && t < in->tokens && head < heads && d < in->head_dim);
    size_t i = ((size_t)t * heads + head) * in->head_dim + d;
    switch (in->dtype) {
    case KVS_DTYPE_FP16: {
        uint16_t h;
        memcpy(&h, base + 2 * i, 2);
        return kvq_fp16_to_f32(h);
    }
    case KVS_DTYPE_BF16: {
        uint16_t b;
        memcpy(&b, base + 2 * i, 2);
        return kvq_bf16_to_f32(b);
    }
    case KVS_DTYPE_FP32: {
        float f;
        memcpy(&f, base + 4 * i, 4);
        return f;
    }
    }
    return 0.0f;
}

static void header_of(const kvs_sample_info *in, kvs_sample_hdr *h)
{
    memset(h, 0, sizeof *h);
    h->magic = KVS_SAMPLE_MAGIC;
    h->version = KVS_SAMPLE_VERSION;
    h->dtype = (uint8_t)in->dtype;
    h->flags = (uint8_t)in->flags;
    h->num_layers = (uint16_t)in->num_layers;
    h->num_kv_heads = (uint16_t)in->num_kv_heads;
    h->head_dim = (uint16_t)in->head_dim;
    h->num_q_heads = (uint16_t)in->num_q_heads;
    h->tokens = in->tokens;
    h->first_pos = in->first_pos;
    h->data_bytes = kvs_sample_data_bytes(in);
    memcpy(h->model, in->model, strnlen(in->model, KVS_SAMPLE_MODEL_LEN));
}

int kvs_sample_write_layers(const char *path, const kvs_sample_info *info, const void *const *k,
                            const void *const *v, const void *const *q, char *err)
{
    int rc = kvs_sample_info_check(info, err);
    if (rc)
        return rc;
    const int has_q = (info->flags & KVS_SAMPLE_F_QUERIES) != 0;
    if (path == NULL || k == NULL || v == NULL || (has_q && q == NULL))
        return kvs_fail(err, KVS_EINVAL, "sample write: NULL path or layer pointers");
    for (uint32_t l = 0; l < info->num_layers; l++)
        if (k[l] == NULL || v[l] == NULL || (has_q && q[l] == NULL))
            return kvs_fail(err, KVS_EINVAL, "sample write: layer %u: NULL pointer", l);

    const size_t kvb = part_bytes(info, KVS_SAMPLE_K), qb = part_bytes(info, KVS_SAMPLE_Q);
    kvs_sample_hdr h;
    header_of(info, &h);
    XXH3_state_t *st = XXH3_createState();
    if (st == NULL)
        return kvs_fail(err, KVS_ENOMEM, "sample write: out of memory");
    XXH3_64bits_reset(st);
    XXH3_64bits_update(st, &h, sizeof h); /* checksum field still 0 */
    for (uint32_t l = 0; l < info->num_layers; l++) {
        XXH3_64bits_update(st, k[l], kvb);
        XXH3_64bits_update(st, v[l], kvb);
        if (has_q)
            XXH3_64bits_update(st, q[l], qb);
    }
    h.checksum = XXH3_64bits_digest(st);
    XXH3_freeState(st);

    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return kvs_fail(err, KVS_EIO, "%s: cannot create: %s", path, strerror(errno));
    int ok = fwrite(&h, sizeof h, 1, f) == 1;
    for (uint32_t l = 0; ok && l < info->num_layers; l++) {
        ok = fwrite(k[l], 1, kvb, f) == kvb && fwrite(v[l], 1, kvb, f) == kvb;
        if (ok && has_q)
            ok = fwrite(q[l], 1, qb, f) == qb;
    }
    int saved = errno;
    if (fclose(f) != 0 && ok) {
        ok = 0;
        saved = errno;
    }
    if (!ok) {
        remove(path);
        return kvs_fail(err, KVS_EIO, "%s: write failed: %s", path, strerror(saved));
    }
    return 0;
}

int kvs_sample_write(const char *path, const kvs_sample *s, char *err)
{
    if (s == NULL)
        return kvs_fail(err, KVS_EINVAL, "sample write: NULL sample");
    uint32_t L = s->info.num_layers;
    if (L < 1 || L > KVS_BLOCK_MAX_LAYERS)
        return kvs_sample_info_check(&s->info, err);
    const void **ptrs = calloc(3 * (size_t)L, sizeof *ptrs);
    if (ptrs == NULL)
        return kvs_fail(err, KVS_ENOMEM, "sample write: out of memory");
    for (uint32_t l = 0; l < L; l++) {
        ptrs[l] = kvs_sample_part_ptr(s, KVS_SAMPLE_K, l);
        ptrs[L + l] = kvs_sample_part_ptr(s, KVS_SAMPLE_V, l);
        ptrs[2 * L + l] = kvs_sample_part_ptr(s, KVS_SAMPLE_Q, l);
    }
    int rc =
        kvs_sample_write_layers(path, &s->info, ptrs, ptrs + L,
                                (s->info.flags & KVS_SAMPLE_F_QUERIES) ? ptrs + 2 * L : NULL, err);
    free(ptrs);
    return rc;
}

/* Every check that needs only the 112 header bytes; fills info. */
static int check_header(const unsigned char *bytes, kvs_sample_info *info, char *err)
{
    kvs_sample_hdr h;
    memcpy(&h, bytes, sizeof h);
    if (h.magic != KVS_SAMPLE_MAGIC)
        return kvs_fail(err, KVS_EFORMAT, "sample: bad magic 0x%08x (not a KVSM file)",
                    (unsigned)h.magic);
    if (h.version != KVS_SAMPLE_VERSION)
        return kvs_fail(err, KVS_EFORMAT, "sample: unsupported version %u", (unsigned)h.version);
    if (h.reserved != 0)
        return kvs_fail(err, KVS_EFORMAT, "sample: reserved field not zero");
    const char *why = shape_problem(h.num_layers, h.num_kv_heads, h.head_dim, h.num_q_heads,
                                    h.tokens, h.dtype, h.flags);
    if (why)
        return kvs_fail(err, KVS_EFORMAT, "sample: %s", why);
    size_t n = 0;
    while (n < KVS_SAMPLE_MODEL_LEN && h.model[n] != '\0')
        n++;
    for (size_t i = 0; i < KVS_SAMPLE_MODEL_LEN; i++) {
        unsigned char c = (unsigned char)h.model[i];
        if (i < n ? !model_char_ok(c) : c != 0)
            return kvs_fail(err, KVS_EFORMAT,
                        "sample: model fingerprint byte %zu: 0x%02x is not "
                        "printable ASCII (or NUL padding)",
                        i, c);
    }
    uint64_t want = data_bytes_of(h.num_layers, h.num_kv_heads, h.head_dim, h.num_q_heads, h.tokens,
                                  (kvs_dtype)h.dtype);
    if (want > KVS_SAMPLE_MAX_DATA_BYTES || want > SIZE_MAX)
        return kvs_fail(err, KVS_EFORMAT, "sample: shape needs %llu data bytes, the limit is %llu",
                    (unsigned long long)want, (unsigned long long)KVS_SAMPLE_MAX_DATA_BYTES);
    if (h.data_bytes != want)
        return kvs_fail(err, KVS_EFORMAT, "sample: data_bytes %llu, the shape needs %llu",
                    (unsigned long long)h.data_bytes, (unsigned long long)want);
    memset(info, 0, sizeof *info);
    info->num_layers = h.num_layers;
    info->num_kv_heads = h.num_kv_heads;
    info->head_dim = h.head_dim;
    info->num_q_heads = h.num_q_heads;
    info->tokens = h.tokens;
    info->first_pos = h.first_pos;
    info->dtype = (kvs_dtype)h.dtype;
    info->flags = h.flags;
    memcpy(info->model, h.model, n);
    info->model[n] = '\0';
    return 0;
}

/* Checksum over a whole file image [header | data]: the stored value with
 * the field zeroed. The image is not modified. */
static int check_sum(const unsigned char *img, size_t len, char *err)
{
    kvs_sample_hdr h;
    memcpy(&h, img, sizeof h);
    uint64_t stored = h.checksum;
    h.checksum = 0;
    XXH3_state_t *st = XXH3_createState();
    if (st == NULL)
        return kvs_fail(err, KVS_ENOMEM, "sample: out of memory");
    XXH3_64bits_reset(st);
    XXH3_64bits_update(st, &h, sizeof h);
    XXH3_64bits_update(st, img + sizeof h, len - sizeof h);
    uint64_t got = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    if (got != stored)
        return kvs_fail(err, KVS_EFORMAT,
                    "sample: checksum mismatch (stored %016llx, computed "
                    "%016llx): the file is corrupted",
                    (unsigned long long)stored, (unsigned long long)got);
    return 0;
}

int kvs_sample_parse(const void *buf, size_t len, kvs_sample **out, char *err)
{
    if (out == NULL)
        return kvs_fail(err, KVS_EINVAL, "sample parse: NULL output");
    if (buf == NULL || len < KVS_SAMPLE_HDR_BYTES)
        return kvs_fail(err, KVS_EFORMAT, "sample: truncated header: %zu of %u bytes", buf ? len : 0,
                    KVS_SAMPLE_HDR_BYTES);
    kvs_sample_info info;
    int rc = check_header(buf, &info, err);
    if (rc)
        return rc;
    size_t want = (size_t)kvs_sample_data_bytes(&info);
    if (len - KVS_SAMPLE_HDR_BYTES < want)
        return kvs_fail(err, KVS_EFORMAT, "sample: truncated: %zu of %zu data bytes",
                    len - KVS_SAMPLE_HDR_BYTES, want);
    if (len - KVS_SAMPLE_HDR_BYTES > want)
        return kvs_fail(err, KVS_EFORMAT, "sample: %zu trailing bytes after the data",
                    len - KVS_SAMPLE_HDR_BYTES - want);
    rc = check_sum(buf, len, err);
    if (rc)
        return rc;
    kvs_sample *s = calloc(1, sizeof *s);
    if (s == NULL || (s->data = malloc(want ? want : 1)) == NULL) {
        free(s);
        return kvs_fail(err, KVS_ENOMEM, "sample: cannot allocate %zu bytes", want);
    }
    s->info = info;
    s->data_bytes = want;
    memcpy(s->data, (const unsigned char *)buf + KVS_SAMPLE_HDR_BYTES, want);
    *out = s;
    return 0;
}

int kvs_sample_read(const char *path, kvs_sample **out, char *err)
{
    if (path == NULL || out == NULL)
        return kvs_fail(err, KVS_EINVAL, "sample read: NULL argument");
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return kvs_fail(err, KVS_EIO, "%s: cannot open: %s", path, strerror(errno));
    int rc;
    unsigned char *img = NULL;
    kvs_sample *s = NULL;
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        rc = kvs_fail(err, KVS_EIO, "%s: not a regular file", path);
        goto out;
    }
    unsigned char hdr[KVS_SAMPLE_HDR_BYTES];
    size_t got = fread(hdr, 1, sizeof hdr, f);
    if (got < sizeof hdr) {
        rc = ferror(f) ? kvs_fail(err, KVS_EIO, "%s: read error", path)
                       : kvs_fail(err, KVS_EFORMAT, "%s: sample: truncated header: %zu of %u bytes",
                              path, got, KVS_SAMPLE_HDR_BYTES);
        goto out;
    }
    kvs_sample_info info;
    char why[KVS_ERR_LEN] = "";
    rc = check_header(hdr, &info, why);
    if (rc) {
        kvs_fail(err, rc, "%s: %s", path, why);
        goto out;
    }
    size_t want = (size_t)kvs_sample_data_bytes(&info);
    uint64_t size = sb.st_size > 0 ? (uint64_t)sb.st_size : 0;
    uint64_t have = size > KVS_SAMPLE_HDR_BYTES ? size - KVS_SAMPLE_HDR_BYTES : 0;
    if (have != want) {
        rc = have < want ? kvs_fail(err, KVS_EFORMAT, "%s: sample: truncated: %llu of %zu data bytes",
                                path, (unsigned long long)have, want)
                         : kvs_fail(err, KVS_EFORMAT, "%s: sample: %llu trailing bytes after the data",
                                path, (unsigned long long)(have - want));
        goto out;
    }
    s = calloc(1, sizeof *s);
    img = malloc(KVS_SAMPLE_HDR_BYTES + want);
    if (s == NULL || img == NULL) {
        rc = kvs_fail(err, KVS_ENOMEM, "%s: cannot allocate %zu bytes", path, want);
        goto out;
    }
    memcpy(img, hdr, sizeof hdr);
    got = fread(img + sizeof hdr, 1, want, f);
    if (got != want) { /* the file shrank under us */
        rc = ferror(f) ? kvs_fail(err, KVS_EIO, "%s: read error", path)
                       : kvs_fail(err, KVS_EFORMAT, "%s: sample: truncated: %zu of %zu data bytes",
                              path, got, want);
        goto out;
    }
    rc = check_sum(img, KVS_SAMPLE_HDR_BYTES + want, why);
    if (rc) {
        kvs_fail(err, rc, "%s: %s", path, why);
        goto out;
    }
    /* Keep the one buffer: move the data to its start. */
    memmove(img, img + KVS_SAMPLE_HDR_BYTES, want);
    s->info = info;
    s->data_bytes = want;
    s->data = img;
    img = NULL;
    *out = s;
    s = NULL;
out:
    free(img);
    free(s);
    fclose(f);
    return rc;
}
