/*
 * trace_rec.c — the request-trace recorder (see trace_rec.h).
 *
 * The idea: an open-addressing table maps a 32-byte chain key to its small id
 * and the id of its parent (UINT32_MAX when unknown: a root, or a block whose
 * parent the recording never saw). Chain keys are SHA-256 outputs, so their
 * first 8 bytes are a good hash as they are. Lines are built with json-c.
 *
 * Lines go through stdio's buffer; a flusher thread flushes it once a second
 * when something was written, so the request path never waits for write(2)
 * and a live file is never more than about a second behind.
 *
 * Invariants: ids are dense, 0..n-1 in first-seen order; a key keeps its id
 * for the whole recording; the table is at most half full; r->f is touched
 * only under r->mu.
 */
#include "trace_rec.h"

#include "kvs_error.h"
#include "kvs_log.h"

#include <errno.h>
#include <json-c/json.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MOD   "trace"
#define NO_ID UINT32_MAX

typedef struct slot {
    uint8_t key[KVS_TRACE_KEY_LEN];
    uint32_t id;     /* NO_ID: empty slot */
    uint32_t parent; /* NO_ID: none known */
} slot;

struct kvs_trace_rec {
    pthread_mutex_t mu;
    FILE *f;
    slot *tab;
    size_t cap; /* power of two */
    uint32_t n_ids;
    uint32_t *parent_of; /* by id, for walking a Put's chain */
    size_t parent_cap;
    uint64_t lines;
    struct timespec t0;
    int failed;        /* a write failed once: logged once */
    int dirty;         /* lines written since the last fflush */
    int stop;          /* tells the flusher to end */
    pthread_cond_t cv; /* wakes the flusher for stop */
    pthread_t flusher;
};

static uint64_t key_hash(const uint8_t *k)
{
    uint64_t h;
    memcpy(&h, k, sizeof h);
    return h;
}

static slot *do_find(kvs_trace_rec *r, const uint8_t *key)
{
    size_t mask = r->cap - 1;
    for (size_t i = (size_t)key_hash(key) & mask;; i = (i + 1) & mask) {
        slot *s = &r->tab[i];
        if (s->id == NO_ID || memcmp(s->key, key, KVS_TRACE_KEY_LEN) == 0)
            return s;
    }
}

static int do_grow(kvs_trace_rec *r)
{
    size_t ncap = r->cap * 2;
    slot *nt = malloc(ncap * sizeof *nt);
    if (nt == NULL)
        return KVS_ENOMEM;
    for (size_t i = 0; i < ncap; i++)
        nt[i].id = NO_ID;
    slot *old = r->tab;
    size_t ocap = r->cap;
    r->tab = nt;
    r->cap = ncap;
    for (size_t i = 0; i < ocap; i++)
        if (old[i].id != NO_ID)
            *do_find(r, old[i].key) = old[i];
    free(old);
    return 0;
}

/* The id of key, assigning the next one when new (*is_new set). */
static int do_id(kvs_trace_rec *r, const uint8_t *key, uint32_t parent, uint32_t *id, int *is_new)
{
    if ((size_t)(r->n_ids + 1) * 2 > r->cap && do_grow(r) != 0)
        return KVS_ENOMEM;
    if (r->n_ids >= r->parent_cap) {
        size_t nc = r->parent_cap ? r->parent_cap * 2 : 1024;
        uint32_t *np = realloc(r->parent_of, nc * sizeof *np);
        if (np == NULL)
            return KVS_ENOMEM;
        r->parent_of = np;
        r->parent_cap = nc;
    }
    slot *s = do_find(r, key);
    if (is_new)
        *is_new = s->id == NO_ID;
    if (s->id == NO_ID) {
        memcpy(s->key, key, KVS_TRACE_KEY_LEN);
        s->id = r->n_ids++;
        s->parent = parent;
        r->parent_of[s->id] = parent;
    } else if (s->parent == NO_ID && parent != NO_ID && parent != s->id) {
        s->parent = parent; /* learnt later: a Lookup chain names the parent */
        r->parent_of[s->id] = parent;
    }
    *id = s->id;
    return 0;
}

static double elapsed_ms(const kvs_trace_rec *r)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - r->t0.tv_sec) * 1e3 + (double)(now.tv_nsec - r->t0.tv_nsec) / 1e6;
}

/* Writes one line; ids[0..n) root first. */
static int do_write(kvs_trace_rec *r, const uint32_t *ids, size_t n, size_t input_length,
                    const char *op)
{
    json_object *o = json_object_new_object();
    json_object *a = json_object_new_array_ext((int)n);
    if (o == NULL || a == NULL) {
        json_object_put(o);
        json_object_put(a);
        return KVS_ENOMEM;
    }
    json_object_object_add(o, "timestamp", json_object_new_int64((int64_t)elapsed_ms(r)));
    json_object_object_add(o, "input_length", json_object_new_int64((int64_t)input_length));
    json_object_object_add(o, "output_length", json_object_new_int(0));
    for (size_t i = 0; i < n; i++)
        json_object_array_add(a, json_object_new_int64(ids[i]));
    json_object_object_add(o, "hash_ids", a);
    json_object_object_add(o, "op", json_object_new_string(op));
    const char *text = json_object_to_json_string_ext(o, JSON_C_TO_STRING_SPACED);
    int rc = 0;
    if (text == NULL)
        rc = KVS_ENOMEM;
    else if (fputs(text, r->f) == EOF || fputc('\n', r->f) == EOF)
        rc = KVS_EIO;
    else
        r->lines++;
    /* No fflush here: a write(2) per Lookup would put a system call on the hot
     * path. The flusher thread flushes once a second, stdio a full buffer. */
    r->dirty = 1;
    json_object_put(o);
    if (rc == KVS_EIO && !r->failed) {
        r->failed = 1;
        KVS_LOG_ERROR(MOD, "cannot write the trace: %s (lines are being dropped)", strerror(errno));
    }
    return rc;
}

/* Flushes dirty lines once a second until stop. */
static void *flusher_main(void *arg)
{
    kvs_trace_rec *r = arg;
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += 1;
        pthread_cond_timedwait(&r->cv, &r->mu, &until);
        if (r->dirty) {
            r->dirty = 0;
            if (fflush(r->f) == EOF && !r->failed) {
                r->failed = 1;
                KVS_LOG_ERROR(MOD, "cannot write the trace: %s (lines are being dropped)",
                              strerror(errno));
            }
        }
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

int kvs_trace_rec_open(const char *path, kvs_trace_rec **out, char *err)
{
    *out = NULL;
    kvs_trace_rec *r = calloc(1, sizeof *r);
    if (r == NULL)
        return kvs_fail(err, KVS_ENOMEM, "out of memory");
    r->cap = 4096;
    r->tab = malloc(r->cap * sizeof *r->tab);
    if (r->tab == NULL) {
        free(r);
        return kvs_fail(err, KVS_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < r->cap; i++)
        r->tab[i].id = NO_ID;
    r->f = fopen(path, "w");
    if (r->f == NULL) {
        int e = errno;
        free(r->tab);
        free(r);
        return kvs_fail(err, KVS_EIO, "record_trace %.200s: %s", path, strerror(e));
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    clock_gettime(CLOCK_MONOTONIC, &r->t0);
    if (pthread_create(&r->flusher, NULL, flusher_main, r) != 0) {
        fclose(r->f);
        pthread_cond_destroy(&r->cv);
        pthread_mutex_destroy(&r->mu);
        free(r->tab);
        free(r);
        return kvs_fail(err, KVS_ENOMEM, "record_trace: cannot start the flusher thread");
    }
    *out = r;
    return 0;
}

int kvs_trace_rec_lookup(kvs_trace_rec *r, const uint8_t (*keys)[KVS_TRACE_KEY_LEN], size_t n_keys,
                         size_t n_tokens)
{
    uint32_t *ids = malloc((n_keys ? n_keys : 1) * sizeof *ids);
    if (ids == NULL)
        return KVS_ENOMEM;
    pthread_mutex_lock(&r->mu);
    int rc = 0;
    for (size_t i = 0; i < n_keys && rc == 0; i++)
        rc = do_id(r, keys[i], i ? ids[i - 1] : NO_ID, &ids[i], NULL);
    if (rc == 0)
        rc = do_write(r, ids, n_keys, n_tokens, "lookup");
    pthread_mutex_unlock(&r->mu);
    free(ids);
    return rc;
}

int kvs_trace_rec_put(kvs_trace_rec *r, const uint8_t *key, const uint8_t *parent_key,
                      unsigned block_tokens)
{
    pthread_mutex_lock(&r->mu);
    int rc = 0, is_new = 0;
    uint32_t parent = NO_ID, id;
    if (parent_key != NULL)
        rc = do_id(r, parent_key, NO_ID, &parent, NULL);
    if (rc == 0)
        rc = do_id(r, key, parent, &id, &is_new);
    if (rc == 0 && is_new) {
        /* The chain through the known ancestors, written root first. A cycle
         * cannot form (a key's parent is fixed when first learnt, and ids
         * only point at older ids or at ids learnt from Lookup chains), but
         * the walk is bounded by n_ids anyway. */
        size_t depth = 0;
        for (uint32_t x = id; x != NO_ID && depth <= r->n_ids; x = r->parent_of[x])
            depth++;
        uint32_t *ids = malloc(depth * sizeof *ids);
        if (ids == NULL) {
            rc = KVS_ENOMEM;
        } else {
            size_t i = depth;
            for (uint32_t x = id; x != NO_ID && i > 0; x = r->parent_of[x])
                ids[--i] = x;
            size_t tokens = depth * block_tokens;
            rc = do_write(r, ids, depth, tokens, "put");
            free(ids);
        }
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

uint64_t kvs_trace_rec_lines(const kvs_trace_rec *r)
{
    pthread_mutex_lock((pthread_mutex_t *)&r->mu);
    uint64_t n = r->lines;
    pthread_mutex_unlock((pthread_mutex_t *)&r->mu);
    return n;
}

void kvs_trace_rec_close(kvs_trace_rec *r)
{
    if (r == NULL)
        return;
    pthread_mutex_lock(&r->mu);
    r->stop = 1;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->flusher, NULL);
    if (fclose(r->f) != 0)
        KVS_LOG_ERROR(MOD, "closing the trace: %s", strerror(errno));
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r->tab);
    free(r->parent_of);
    free(r);
}
