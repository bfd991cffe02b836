/*
 * payload.c — block payloads: the DRAM tier and the SSD tier behind the index,
 * two-phase writes, read references, leases with ids, TTL pins, per-tenant
 * quotas and the DRAM watermarks (store.h, lower half; store_int.h).
 *
 * The idea:
 *  - Writing is two-phase. write_begin checks the block against the index,
 *    makes room (the tenant's quota first, then the DRAM watermarks) and
 *    reserves a chunk; nothing is in the index yet, so no lookup or read can
 *    see the block. write_commit inserts the entry and attaches the chunk;
 *    write_abort, or a commit that finds the parent gone, frees it.
 *  - A chunk starts with a kvs__blob header that counts read references. An
 *    entry leaving DRAM (evicted, deleted, demoted) only detaches its blob;
 *    the chunk is freed when it is neither attached nor referenced, so a
 *    reader's bytes stay valid and unchanged until read_release.
 *  - Byte pressure: a reservation that would take DRAM usage above
 *    high * capacity evicts (kvs__evict, BYTES mode) down to low * capacity.
 *    With an SSD tier, DRAM victims are demoted: written to a file with a
 *    checksum, their entry stays (tier SSD, out of the policy's candidates,
 *    queued in demotion order in the ring). A read of an SSD block promotes it
 *    back (or, when DRAM cannot make room, serves a private heap copy); a copy
 *    that fails its checksum is never served: the block and its subtree go.
 *  - Leases with ids and TTL pins are records (s->holds, sorted by id) whose
 *    entries count them in holds; a held block is not a candidate and cannot
 *    be deleted. Records end at release or expiry; expired ones are reaped
 *    before every eviction and delete, so expiry is exact where it matters.
 *  - Quotas count committed payload bytes in every tier plus reservations; a
 *    write over quota evicts the tenant's own least recently used unprotected
 *    leaves (a scan of the index: quota evictions are rare and administrative)
 *    and is refused when that is not enough.
 *
 * Invariants (kvs__payload_check): bytes[DRAM] and bytes[SSD] are the sums of
 * the sizes of cached blocks in each tier, and the tenants' byte counts sum to
 * their total; ssd_used == bytes[SSD]; every DRAM entry's blob is attached and
 * has the entry's size and tenant. s->used is the DRAM tier's charge for all
 * chunks not yet freed.
 *
 * Costs: promotion reads its file outside the store lock (do_fetch_ssd:
 * the entry is held and a busy slot reports a forced drop meanwhile);
 * demotion writes its file under the write lock, inside the eviction that needs
 * the room (the next step: demote ahead of need, from a background thread).
 */
#include "kvs_error.h"
#include "store_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LEASE_MAX_MS (24u * 3600u * 1000u)
#define HOLDS_MAX    (1u << 20)

/* ---- blobs ------------------------------------------------------------- */

static void blob_free(kvs_store *s, kvs__blob *b)
{
    if (b->heap) {
        free(b);
        return;
    }
    s->used -= b->charged;
    s->dram->m->free(s->dram, b, KVS__BLOB_HDR + b->size);
}

static void blob_unref(kvs_store *s, kvs__blob *b)
{
    if (b->refs == 0 && !b->attached)
        blob_free(s, b);
}

static kvs__blob *blob_of(const kvs__entry *x)
{
    return (kvs__blob *)(uintptr_t)x->location;
}

/* Reserves a DRAM chunk for size payload bytes, evicting as the watermarks
 * say. 0, KVS_ENOSPC (too big, or nothing more can go), KVS_ENOMEM, or the
 * tier's own failure (the fault tier's KVS_EIO). */
static int reserve(kvs_store *s, uint64_t size, kvs_tenant_id tenant, kvs__blob **out)
{
    *out = NULL;
    uint64_t need = KVS__BLOB_HDR + size;
    uint64_t ch = s->dram->m->charge(s->dram, need);
    uint64_t cap = s->cap_bytes ? s->cap_bytes : s->region_bytes;
    if (cap && ch > cap)
        return KVS_ENOSPC;
    if (cap && s->used + ch > (uint64_t)(s->high * (double)cap)) {
        uint64_t low = (uint64_t)(s->low * (double)cap);
        kvs__evict(s, KVS__EV_BYTES, low > ch ? low - ch : 0, KVS_EVICT_WATERMARK);
        if (s->used + ch > cap)
            return KVS_ENOSPC;
    }
    void *p;
    int rc;
    while ((rc = s->dram->m->alloc(s->dram, need, &p)) == KVS_ENOSPC) {
        /* A bounded arena can be short of a page for this class while under
         * its byte bound (fragmentation), or the fault tier says so: free one
         * more victim's worth and try again. */
        if (s->used == 0)
            return KVS_ENOSPC;
        int erc = kvs__evict(s, KVS__EV_BYTES, s->used - 1, KVS_EVICT_WATERMARK);
        if (erc)
            return erc;
    }
    if (rc)
        return rc;
    kvs__blob *b = p;
    memset(b, 0, sizeof *b);
    b->size = size;
    b->charged = ch;
    b->tenant = tenant;
    s->used += ch;
    *out = b;
    return 0;
}

/* ---- the SSD tier -------------------------------------------------------- */

static int ring_push(kvs_store *s, uint32_t idx, uint64_t seq)
{
    if (s->ring_n == s->ring_cap) {
        uint32_t nc = s->ring_cap ? 2 * s->ring_cap : 256;
        kvs__ssd_item *nr = malloc((size_t)nc * sizeof *nr);
        if (!nr)
            return KVS_ENOMEM;
        for (uint32_t k = 0; k < s->ring_n; k++)
            nr[k] = s->ring[(s->ring_head + k) % s->ring_cap];
        free(s->ring);
        s->ring = nr;
        s->ring_cap = nc;
        s->ring_head = 0;
    }
    s->ring[(s->ring_head + s->ring_n++) % s->ring_cap] = (kvs__ssd_item){idx, seq};
    return 0;
}

static int ring_pop(kvs_store *s, kvs__ssd_item *it)
{
    if (!s->ring_n)
        return 0;
    *it = s->ring[s->ring_head];
    s->ring_head = (s->ring_head + 1) % s->ring_cap;
    s->ring_n--;
    return 1;
}

static int ring_valid(const kvs_store *s, kvs__ssd_item it)
{
    if (it.idx >= s->ix.used_e)
        return 0;
    const kvs__entry *x = &s->ix.e[it.idx];
    return (x->flags & KVS__F_LIVE) && x->tier == KVS_TIER_SSD && x->location == it.seq;
}

/* Drops stale items (promoted or removed blocks) once they outnumber the
 * live ones, so the ring stays O(SSD blocks). */
static void ring_compact(kvs_store *s)
{
    uint32_t n = s->ring_n, keep = 0;
    for (uint32_t k = 0; k < n; k++) {
        kvs__ssd_item it = s->ring[(s->ring_head + k) % s->ring_cap];
        if (ring_valid(s, it))
            s->ring[(s->ring_head + keep++) % s->ring_cap] = it;
    }
    s->ring_n = keep;
}

int kvs__ssd_drop_oldest(kvs_store *s, kvs_evict_reason why)
{
    kvs__ssd_item it;
    for (uint32_t tries = s->ring_n; tries && ring_pop(s, &it); tries--) {
        if (!ring_valid(s, it))
            continue;
        kvs__entry *x = &s->ix.e[it.idx];
        if (x->nchildren == 0 && !x->pins && !x->holds && !kvs__lease_active(s, x)) {
            kvs__remove(s, it.idx, why);
            return 0;
        }
        if (ring_push(s, it.idx, it.seq)) /* cannot fail: the pop made room */
            return KVS_ENOMEM;
    }
    return KVS_ENOSPC;
}

int kvs__demote(kvs_store *s, uint32_t i)
{
    kvs__entry *x = &s->ix.e[i];
    kvs__blob *b = blob_of(x);
    uint64_t size = x->size;
    while (s->ssd_cap && s->ssd_used + size > s->ssd_cap)
        if (size > s->ssd_cap || kvs__ssd_drop_oldest(s, KVS_EVICT_SSD_FULL) != 0)
            return KVS_ENOSPC;
    if (s->ring_n >= 64 && s->ring_n > 2 * (s->ssd_blocks + 32))
        ring_compact(s);
    int rc = ring_push(s, i, s->ssd_seq + 1);
    if (rc)
        return rc;
    rc = s->ssd->m->put(s->ssd, &x->key, kvs__blob_data(b), size);
    if (rc) {
        s->ring_n--; /* the item just pushed */
        if (rc == KVS_EIO)
            s->ps.io_errors++;
        return rc;
    }
    x->tier = KVS_TIER_SSD;
    x->location = ++s->ssd_seq;
    s->ssd_blocks++;
    b->attached = 0;
    blob_unref(s, b);
    s->ssd_used += size;
    s->ps.bytes[KVS_TIER_DRAM] -= size;
    s->ps.bytes[KVS_TIER_SSD] += size;
    s->ps.demotions++;
    s->st.evictions[KVS_EVICT_DEMOTE]++;
    if (x->parent != KVS__NIL) {
        s->ix.e[x->parent].memkids--;
        kvs__refresh(s, x->parent);
    }
    kvs__refresh(s, i);
    return 0;
}

void kvs__payload_detach(kvs_store *s, kvs__entry *x)
{
    if (x->tier == KVS_TIER_DRAM) {
        kvs__blob *b = blob_of(x);
        b->attached = 0;
        blob_unref(s, b);
    } else if (x->tier == KVS_TIER_SSD) {
        s->ssd->m->drop(s->ssd, &x->key);
        s->ssd_used -= x->size;
        s->ssd_blocks--;
    }
    if (x->tier == KVS_TIER_DRAM || x->tier == KVS_TIER_SSD) {
        s->ps.bytes[x->tier] -= x->size;
        s->t_bytes[x->tenant] -= x->size;
    }
    x->tier = KVS_TIER_NONE;
    x->location = 0;
}

static int busy_take(kvs_store *s, uint32_t i)
{
    for (uint32_t k = 0; k < KVS__BUSY_MAX; k++)
        if (!s->busy[k].used) {
            s->busy[k].used = 1;
            s->busy[k].removed = 0;
            s->busy[k].idx = i;
            s->nbusy++;
            return (int)k;
        }
    return -1;
}

void kvs__busy_removed(kvs_store *s, uint32_t i)
{
    for (uint32_t k = 0; k < KVS__BUSY_MAX; k++)
        if (s->busy[k].used && s->busy[k].idx == i)
            s->busy[k].removed = 1;
}

#define FETCH_RETRY 1 /* the entry changed while its file was read: read again */

/* Brings SSD block i back for a read: promoted into DRAM, or a private heap
 * copy when DRAM cannot make room. Called and returns with the write lock held, but
 * reads the file without it (a large block would stall every other call):
 * the entry is held meanwhile, so nothing but a forced drop removes it, and
 * a busy slot tells the reader if that happened. A copy that fails its
 * checksum drops the block and its subtree (KVS_EFORMAT), unless the entry
 * changed meanwhile (promoted and demoted again by others: FETCH_RETRY). */
static int do_fetch_ssd(kvs_store *s, uint32_t i, kvs__blob **out, kvs_tier_kind *where)
{
    kvs__entry *x = &s->ix.e[i];
    uint64_t size = x->size, seq = x->location;
    kvs_key key = x->key;
    kvs__blob *b;
    /* Not dropped, deleted or evicted while we read. A count at its maximum
     * already holds it (and must not wrap): its records then keep it. */
    int guard = x->holds < UINT16_MAX;
    x->holds += guard;
    int rc = reserve(s, size, x->tenant, &b);
    x = &s->ix.e[i];
    *where = KVS_TIER_DRAM;
    if (rc == KVS_ENOSPC) {
        void *p = NULL;
        rc = posix_memalign(&p, 64, (size_t)(KVS__BLOB_HDR + size)) != 0 ? KVS_ENOMEM : 0;
        if (rc == 0) {
            b = p;
            memset(b, 0, sizeof *b);
            b->heap = 1;
            b->size = size;
            b->tenant = x->tenant;
            *where = KVS_TIER_SSD;
        }
    }
    if (rc) {
        x->holds -= guard;
        return rc;
    }
    int slot = busy_take(s, i); /* none free: read under the lock */
    if (slot >= 0)
        kvs__unlock(s);
    rc = s->ssd->m->get(s->ssd, &key, kvs__blob_data(b), size);
    if (slot >= 0) {
        kvs__lock(s);
        int removed = s->busy[slot].removed;
        s->busy[slot].used = 0;
        s->nbusy--;
        if (removed) { /* a forced drop (corrupt ancestor) took it */
            blob_free(s, b);
            return KVS_ENOTFOUND;
        }
    }
    x = &s->ix.e[i];
    x->holds -= guard;
    kvs__refresh(s, i);
    int same = x->tier == KVS_TIER_SSD && x->location == seq;
    if (rc) {
        blob_free(s, b);
        if (!same)
            return FETCH_RETRY;
        if (rc == KVS_EFORMAT) {
            s->ps.corrupt_dropped++;
            kvs__drop_subtree(s, i, KVS_EVICT_CORRUPT);
        } else if (rc == KVS_EIO) {
            s->ps.io_errors++;
        }
        return rc;
    }
    if (*where == KVS_TIER_DRAM && same) {
        s->ssd->m->drop(s->ssd, &x->key);
        s->ssd_used -= size;
        s->ssd_blocks--;
        s->ps.bytes[KVS_TIER_SSD] -= size;
        s->ps.bytes[KVS_TIER_DRAM] += size;
        s->ps.promotions++;
        x->tier = KVS_TIER_DRAM;
        x->location = (uint64_t)(uintptr_t)b;
        b->attached = 1;
        if (x->parent != KVS__NIL) {
            s->ix.e[x->parent].memkids++;
            kvs__refresh(s, x->parent);
        }
        kvs__refresh(s, i);
    }
    /* Otherwise (another reader promoted it meanwhile) our verified copy
     * serves this reference alone and is freed at its release. */
    *out = b;
    return 0;
}

/* ---- open / close -------------------------------------------------------- */

static int bad_marks(double high, double low)
{
    return !(high > 0 && high <= 1) || !(low > 0 && low <= high);
}

int kvs__payload_open(kvs_store *s, const kvs_store_payload_opts *p)
{
    kvs_store_payload_opts none = {0};
    if (!p)
        p = &none;
    double high = p->high_watermark ? p->high_watermark : 1.0;
    double low = p->low_watermark ? p->low_watermark : high;
    if (bad_marks(high, low) || p->fault_tier < 0 || p->fault_tier > 2 ||
        (p->fault_tier == 2 && !p->ssd_dir) ||
        (p->fault_tier && p->fault_every && p->fault_status != KVS_ENOSPC &&
         p->fault_status != KVS_EIO))
        return KVS_EINVAL;
    s->high = high;
    s->low = low;
    s->cap_bytes = s->region_bytes = p->capacity_bytes;
    s->ssd_cap = p->ssd_capacity_bytes;
    s->next_hold_id = 1;
    s->t_bytes = calloc(KVS__NTENANTS, sizeof *s->t_bytes);
    s->t_resv = calloc(KVS__NTENANTS, sizeof *s->t_resv);
    s->t_quota = calloc(KVS__NTENANTS, sizeof *s->t_quota);
    if (!s->t_bytes || !s->t_resv || !s->t_quota)
        return KVS_ENOMEM;
    int rc = KVS_ENODEV;
    if (p->capacity_bytes &&
        (rc = kvs_tier_pinned_open(p->capacity_bytes, p->shareable, &s->dram)) == 0)
        s->ps.pinned = 1;
    else
        rc = kvs_tier_dram_open(p->capacity_bytes, p->shareable, &s->dram);
    if (rc)
        return rc;
    if (p->ssd_dir && (rc = kvs_tier_ssd_open(p->ssd_dir, &s->ssd)) != 0)
        return rc;
    if (p->fault_tier && p->fault_every) {
        kvs_tier **t = p->fault_tier == 1 ? &s->dram : &s->ssd, *f;
        if ((rc = kvs_tier_fault_open(*t, p->fault_every, p->fault_status, &f)) != 0)
            return rc;
        *t = f;
    }
    return 0;
}

void kvs__payload_close(kvs_store *s)
{
    if (s->dram)
        s->dram->m->close(s->dram);
    if (s->ssd)
        s->ssd->m->close(s->ssd);
    s->dram = s->ssd = NULL;
    for (uint32_t k = 0; k < s->nholds; k++)
        free(s->holds[k].idx);
    free(s->holds);
    free(s->ring);
    free(s->t_bytes);
    free(s->t_resv);
    free(s->t_quota);
}

/* ---- lease records -------------------------------------------------------- */

static void hold_end(kvs_store *s, uint32_t k)
{
    kvs__hold *h = &s->holds[k];
    for (uint32_t j = 0; j < h->n; j++) {
        uint32_t i = h->idx[j];
        if (i == KVS__NIL)
            continue;
        s->ix.e[i].holds--;
        kvs__refresh(s, i);
    }
    free(h->idx);
    h->idx = NULL;
    h->n = 0;
    s->ndead_holds++;
}

static void holds_compact_now(kvs_store *s)
{
    uint32_t keep = 0;
    for (uint32_t k = 0; k < s->nholds; k++)
        if (s->holds[k].idx)
            s->holds[keep++] = s->holds[k];
    s->nholds = keep;
    s->ndead_holds = 0;
}

/* Drops ended records once they are half the array (not while iterating). */
static void holds_compact(kvs_store *s)
{
    if (s->ndead_holds >= 32 && s->ndead_holds * 2 >= s->nholds)
        holds_compact_now(s);
}

void kvs__reap_holds(kvs_store *s)
{
    if (!s->nholds)
        return;
    uint32_t now = kvs__now(s);
    if ((int32_t)(s->holds_min_until - now) > 0)
        return;
    uint32_t min = 0;
    int have = 0;
    for (uint32_t k = 0; k < s->nholds; k++) {
        uint32_t u = s->holds[k].until;
        if (!s->holds[k].idx)
            continue;
        if ((int32_t)(u - now) <= 0) {
            hold_end(s, k);
            continue;
        }
        if (!have || (int32_t)(u - min) < 0)
            min = u;
        have = 1;
    }
    s->holds_min_until = have ? min : now + LEASE_MAX_MS;
    holds_compact(s);
}

int kvs__unpin_ttl(kvs_store *s, uint32_t i)
{
    kvs__reap_holds(s);
    for (uint32_t k = 0; k < s->nholds; k++)
        if (s->holds[k].pin && s->holds[k].idx && s->holds[k].idx[0] == i) {
            hold_end(s, k);
            holds_compact(s);
            return 0;
        }
    return KVS_EPRECOND;
}

void kvs__holds_scrub(kvs_store *s, uint32_t i)
{
    for (uint32_t k = 0; k < s->nholds; k++)
        for (uint32_t j = 0; j < s->holds[k].n; j++)
            if (s->holds[k].idx[j] == i)
                s->holds[k].idx[j] = KVS__NIL;
}

/* A record holding entries v[0..n) for ttl_ms; on success the record owns v
 * (malloc'd by the caller), on failure the caller still does. An entry whose
 * hold count is saturated gets the anonymous lease instead (same protection). */
static int hold_add_owned(kvs_store *s, uint32_t ttl_ms, uint32_t *v, uint32_t n, int pin,
                          uint64_t *id)
{
    if (s->nholds - s->ndead_holds >= HOLDS_MAX || n >= (1u << 31))
        return KVS_ENOSPC;
    if (s->nholds == s->cap_holds && s->ndead_holds) /* reuse room before growing */
        holds_compact_now(s);
    if (s->nholds == s->cap_holds) {
        uint32_t nc = s->cap_holds ? 2 * s->cap_holds : 64;
        kvs__hold *nh = realloc(s->holds, (size_t)nc * sizeof *nh);
        if (!nh)
            return KVS_ENOMEM;
        s->holds = nh;
        s->cap_holds = nc;
    }
    uint32_t until = kvs__now(s) + ttl_ms;
    if (until == 0)
        until = 1;
    for (uint32_t j = 0; j < n; j++) {
        uint32_t i = v[j];
        kvs__entry *x = &s->ix.e[i];
        if (x->holds == UINT16_MAX) {
            if (!kvs__lease_active(s, x) || (int32_t)(until - x->lease_ms) > 0)
                x->lease_ms = until;
            v[j] = KVS__NIL;
            continue;
        }
        x->holds++;
        kvs__refresh(s, i);
    }
    if (s->nholds == s->ndead_holds || (int32_t)(until - s->holds_min_until) < 0)
        s->holds_min_until = until;
    s->holds[s->nholds++] =
        (kvs__hold){.id = s->next_hold_id, .until = until, .n = n, .pin = pin != 0, .idx = v};
    if (id)
        *id = s->next_hold_id;
    s->next_hold_id++;
    return 0;
}

/* hold_add_owned of a copy of idx[0..n). */
static int hold_add(kvs_store *s, uint32_t ttl_ms, const uint32_t *idx, uint32_t n, int pin,
                    uint64_t *id)
{
    uint32_t *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!v)
        return KVS_ENOMEM;
    memcpy(v, idx, (size_t)n * sizeof *v);
    int rc = hold_add_owned(s, ttl_ms, v, n, pin, id);
    if (rc)
        free(v);
    return rc;
}

static int64_t hold_find(const kvs_store *s, uint64_t id)
{
    uint32_t lo = 0, hi = s->nholds;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (s->holds[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < s->nholds && s->holds[lo].id == id && s->holds[lo].idx ? (int64_t)lo : -1;
}

/* Lookup's whole store side in one write-lock acquisition (store.h): the
 * match, the lease record, the accesses (once per block, leaf first, as
 * kvs_store_lookup) and, per matched block, its size, tier and the head of a
 * DRAM payload. The head is copied under the lock, so the caller needs no read
 * reference to look at it; the bytes cannot change meanwhile anyway (a DRAM
 * payload is written before commit and never after). The index array is
 * allocated before the lock and becomes the lease record's own. */
int kvs_store_lookup_leased_info(kvs_store *s, kvs_tenant_id tenant, const kvs_key *keys,
                                 const uint32_t *tokens, uint32_t block_tokens, size_t nblocks,
                                 uint32_t ttl_ms, kvs_store_match *out, size_t *matched,
                                 uint64_t *lease_id)
{
    if (matched)
        *matched = 0;
    if (lease_id)
        *lease_id = 0;
    if (!s || !matched || !lease_id || (nblocks && (!keys || !tokens || block_tokens == 0)) ||
        ttl_ms == 0 || ttl_ms > LEASE_MAX_MS || nblocks > UINT32_MAX)
        return KVS_EINVAL;
    uint32_t *v = malloc((nblocks ? nblocks : 1) * sizeof *v);
    if (!v)
        return KVS_ENOMEM;
    kvs__lock(s);
    kvs__reap_holds(s);
    size_t n = 0;
    uint32_t prev = KVS__NIL;
    for (; n < nblocks; n++) {
        uint32_t i = kvs__find(&s->ix, &keys[n]);
        if (i == KVS__NIL)
            break;
        const kvs__entry *x = &s->ix.e[i];
        if (x->parent != prev || x->tenant != tenant || x->tier == KVS_TIER_NONE ||
            x->n_tokens != block_tokens ||
            memcmp(x->tokens, tokens + n * block_tokens, (size_t)block_tokens * sizeof *tokens))
            break;
        /* The payload head is a cache (and often TLB) miss of its own: start
         * it now, so it overlaps the next key and the lease bookkeeping. */
        if (out && x->tier == KVS_TIER_DRAM)
            __builtin_prefetch(kvs__blob_data(blob_of(x)));
        v[n] = i;
        prev = i;
    }
    int rc = 0;
    if (n) {
        rc = hold_add_owned(s, ttl_ms, v, (uint32_t)n, 0, lease_id);
        if (rc == 0)
            v = NULL; /* the record's now */
    }
    if (rc == 0) {
        for (size_t k = n; k-- > 0;) { /* leaf first, as kvs_store_lookup */
            uint32_t i = prev;
            const kvs__entry *x = &s->ix.e[i];
            prev = x->parent;
            kvs__touch(s, i);
            if (!out)
                continue;
            kvs_store_match *o = &out[k];
            o->size = x->size;
            o->tier = (kvs_tier_kind)x->tier;
            o->ns_id = x->ns_id;
            o->peek_len = 0;
            if (x->tier == KVS_TIER_DRAM) {
                o->peek_len =
                    x->size < KVS_STORE_PEEK_BYTES ? (uint32_t)x->size : KVS_STORE_PEEK_BYTES;
                memcpy(o->peek, kvs__blob_data(blob_of(x)), o->peek_len);
            }
        }
        s->st.lookups++;
        s->st.lookup_blocks += nblocks;
        s->st.hit_blocks += n;
        *matched = n;
    }
    kvs__unlock(s);
    free(v);
    return rc;
}

int kvs_store_lookup_leased(kvs_store *s, kvs_tenant_id tenant, const kvs_key *keys,
                            const uint32_t *tokens, uint32_t block_tokens, size_t nblocks,
                            uint32_t ttl_ms, size_t *matched, uint64_t *lease_id)
{
    return kvs_store_lookup_leased_info(s, tenant, keys, tokens, block_tokens, nblocks, ttl_ms,
                                        NULL, matched, lease_id);
}

int kvs_store_lease_release(kvs_store *s, uint64_t lease_id)
{
    if (!s)
        return KVS_EINVAL;
    kvs__lock(s);
    kvs__reap_holds(s);
    int64_t k = hold_find(s, lease_id);
    int rc = k < 0 ? KVS_ENOTFOUND : 0;
    if (k >= 0) {
        hold_end(s, (uint32_t)k);
        holds_compact(s);
    }
    kvs__unlock(s);
    return rc;
}

int kvs_store_pin_ex(kvs_store *s, const kvs_key *key, int8_t priority, uint32_t ttl_ms)
{
    if (!s || !key || ttl_ms > LEASE_MAX_MS)
        return KVS_EINVAL;
    kvs__lock(s);
    kvs__reap_holds(s);
    int rc = 0;
    uint32_t i = kvs__find(&s->ix, key);
    if (i == KVS__NIL) {
        rc = KVS_ENOTFOUND;
    } else if (ttl_ms == 0) {
        kvs__entry *x = &s->ix.e[i];
        if (x->pins == UINT16_MAX) {
            rc = KVS_ENOSPC;
        } else {
            x->pins++;
            kvs__refresh(s, i);
        }
    } else {
        rc = hold_add(s, ttl_ms, &i, 1, 1, NULL);
    }
    if (rc == 0 && priority > s->ix.e[i].prio)
        s->ix.e[i].prio = priority;
    kvs__unlock(s);
    return rc;
}

/* ---- quotas -------------------------------------------------------------- */

/* The tenant's least valuable removable block: lowest priority, then least
 * recently used, among its unprotected leaves with a payload. */
static uint32_t tenant_victim(kvs_store *s, kvs_tenant_id t)
{
    uint32_t best = KVS__NIL;
    for (uint32_t i = 0; i < s->ix.used_e; i++) {
        const kvs__entry *x = &s->ix.e[i];
        if (!(x->flags & KVS__F_LIVE) || x->tenant != t || x->tier == KVS_TIER_NONE ||
            x->nchildren || x->pins || x->holds || kvs__lease_active(s, x))
            continue;
        if (best == KVS__NIL || x->prio < s->ix.e[best].prio ||
            (x->prio == s->ix.e[best].prio && x->last_access < s->ix.e[best].last_access))
            best = i;
    }
    return best;
}

static int fit_quota(kvs_store *s, kvs_tenant_id t, uint64_t size)
{
    uint64_t q = s->t_quota[t];
    if (!q)
        return 0;
    kvs__reap_holds(s);
    while (s->t_bytes[t] + s->t_resv[t] + size > q) {
        uint32_t v = size > q ? KVS__NIL : tenant_victim(s, t);
        if (v == KVS__NIL) {
            s->ps.quota_refused++;
            return KVS_ENOSPC;
        }
        kvs__remove(s, v, KVS_EVICT_QUOTA);
    }
    return 0;
}

int kvs_store_set_quota(kvs_store *s, kvs_tenant_id tenant, uint64_t bytes)
{
    if (!s)
        return KVS_EINVAL;
    kvs__lock(s);
    s->t_quota[tenant] = bytes;
    kvs__unlock(s);
    return 0;
}

uint64_t kvs_store_tenant_bytes(kvs_store *s, kvs_tenant_id tenant)
{
    if (!s)
        return 0;
    kvs__lock(s);
    uint64_t b = s->t_bytes[tenant];
    kvs__unlock(s);
    return b;
}

/* ---- two-phase write ------------------------------------------------------ */

struct kvs_store_wr {
    kvs__blob *b;
    kvs_key key, parent;
    int has_parent;
    uint32_t ns_id;
    kvs_tenant_id tenant;
    int8_t prio;
    uint32_t n_tokens;
    uint64_t size;
    uint32_t tokens[];
};

/* The arguments' sanity, and the chain key a child must have (SHA-256 of the
 * block, computed outside the lock; *want untouched without a parent or
 * verify_chain). */
static int put_args(kvs_store *s, const kvs_store_put *p, kvs_key *want)
{
    if (!s || !p || !p->key || !p->tokens || p->n_tokens == 0 || p->n_tokens > UINT16_MAX ||
        p->size == 0 || p->size > UINT32_MAX)
        return KVS_EINVAL;
    if (p->parent && s->verify_chain)
        return kvs_key_next(p->parent, p->tokens, p->n_tokens, want);
    return 0;
}

/* Under the lock: whether p may be written as a new block. 0 with *pi the
 * parent's slot (KVS__NIL for a root); KVS_EPRECOND (parent not cached),
 * KVS_EEXIST (the same block is cached: touched), KVS_EINVAL (the key cached
 * with other tokens, parent or tenant; a chain too deep; a forged key). */
static int put_admissible(kvs_store *s, const kvs_store_put *p, const kvs_key *want,
                          uint32_t *pi_out)
{
    kvs__index *ix = &s->ix;
    uint32_t pi = p->parent ? kvs__find(ix, p->parent) : KVS__NIL;
    uint32_t have = kvs__find(ix, p->key);
    *pi_out = pi;
    if (p->parent && pi == KVS__NIL)
        return KVS_EPRECOND;
    if (have != KVS__NIL) {
        const kvs__entry *x = &ix->e[have];
        if (x->parent != pi || x->tenant != p->tenant || x->n_tokens != p->n_tokens ||
            memcmp(x->tokens, p->tokens, (size_t)p->n_tokens * sizeof *p->tokens) != 0) {
            s->st.refused++;
            return KVS_EINVAL;
        }
        kvs__touch(s, have);
        return KVS_EEXIST;
    }
    if (pi != KVS__NIL && ix->e[pi].depth == UINT16_MAX)
        return KVS_EINVAL;
    if (p->parent && s->verify_chain && memcmp(want->b, p->key->b, KVS_KEY_LEN) != 0) {
        s->st.refused++;
        return KVS_EINVAL;
    }
    return 0;
}

int kvs_store_write_check(kvs_store *s, const kvs_store_put *p)
{
    kvs_key want;
    int rc = put_args(s, p, &want);
    if (rc)
        return rc;
    kvs__lock(s);
    uint32_t pi;
    rc = put_admissible(s, p, &want, &pi);
    if (rc == 0) {
        /* What no eviction could make room for: more than the tenant's quota,
         * or a chunk larger than the memory tier. */
        uint64_t q = s->t_quota[p->tenant];
        uint64_t ch = s->dram->m->charge(s->dram, KVS__BLOB_HDR + p->size);
        uint64_t cap = s->cap_bytes ? s->cap_bytes : s->region_bytes;
        if (q && p->size > q) {
            s->ps.quota_refused++;
            rc = KVS_ENOSPC;
        } else if (cap && ch > cap) {
            rc = KVS_ENOSPC;
        }
    }
    kvs__unlock(s);
    return rc;
}

int kvs_store_write_begin(kvs_store *s, const kvs_store_put *p, kvs_store_wr **w, void **buf)
{
    if (w)
        *w = NULL;
    if (buf)
        *buf = NULL;
    if (!w || !buf)
        return KVS_EINVAL;
    kvs_key want;
    int rc = put_args(s, p, &want);
    if (rc)
        return rc;
    kvs_store_wr *wr = malloc(sizeof *wr + (size_t)p->n_tokens * sizeof(uint32_t));
    if (!wr)
        return KVS_ENOMEM;
    wr->key = *p->key;
    wr->has_parent = p->parent != NULL;
    if (p->parent)
        wr->parent = *p->parent;
    wr->ns_id = p->ns_id;
    wr->tenant = p->tenant;
    wr->prio = p->priority;
    wr->n_tokens = p->n_tokens;
    wr->size = p->size;
    memcpy(wr->tokens, p->tokens, (size_t)p->n_tokens * sizeof(uint32_t));

    kvs__lock(s);
    uint32_t pi;
    rc = put_admissible(s, p, &want, &pi);
    if (rc == 0) {
        int guard = kvs__parent_guard(s, pi); /* not a victim for its own child */
        rc = fit_quota(s, p->tenant, p->size);
        if (rc == 0)
            rc = reserve(s, p->size, p->tenant, &wr->b);
        kvs__parent_unguard(s, pi, guard);
    }
    if (rc == 0) {
        s->t_resv[p->tenant] += p->size;
        s->ps.reserved_bytes += wr->b->charged;
        *w = wr;
        *buf = kvs__blob_data(wr->b);
    }
    kvs__unlock(s);
    if (rc)
        free(wr);
    return rc;
}

static void unreserve(kvs_store *s, kvs_store_wr *w)
{
    s->t_resv[w->tenant] -= w->size;
    s->ps.reserved_bytes -= w->b->charged;
}

int kvs_store_write_commit(kvs_store *s, kvs_store_wr *w)
{
    if (!s || !w)
        return KVS_EINVAL;
    kvs__lock(s);
    unreserve(s, w);
    uint32_t i;
    int rc = kvs__insert(s, &w->key, w->has_parent ? &w->parent : NULL, w->ns_id, w->tokens,
                         w->n_tokens, w->size, KVS__CTX_TAIL_MASK, 0, &i);
    if (rc == KVS_EEXIST && s->ix.e[i].tenant != w->tenant) {
        s->st.refused++;
        rc = KVS_EINVAL;
    }
    if (rc == 0) {
        kvs__entry *x = &s->ix.e[i];
        x->tier = KVS_TIER_DRAM;
        x->location = (uint64_t)(uintptr_t)w->b;
        x->tenant = w->tenant;
        x->prio = w->prio;
        w->b->attached = 1;
        s->t_bytes[w->tenant] += w->size;
        s->ps.bytes[KVS_TIER_DRAM] += w->size;
        kvs__refresh(s, i);
    } else {
        blob_free(s, w->b);
    }
    kvs__unlock(s);
    free(w);
    return rc;
}

void kvs_store_write_abort(kvs_store *s, kvs_store_wr *w)
{
    if (!s || !w)
        return;
    kvs__lock(s);
    unreserve(s, w);
    blob_free(s, w->b);
    kvs__unlock(s);
    free(w);
}

/* ---- reads -------------------------------------------------------------- */

int kvs_store_read(kvs_store *s, const kvs_key *key, kvs_store_ref *ref)
{
    if (ref)
        memset(ref, 0, sizeof *ref);
    if (!s || !key || !ref)
        return KVS_EINVAL;
    kvs__lock(s);
    int rc = FETCH_RETRY;
    uint32_t i = KVS__NIL;
    kvs__blob *b = NULL;
    kvs_tier_kind where = KVS_TIER_DRAM;
    for (int tries = 0; rc == FETCH_RETRY; tries++) {
        i = kvs__find(&s->ix, key);
        if (i == KVS__NIL || s->ix.e[i].tier == KVS_TIER_NONE) {
            rc = KVS_ENOTFOUND;
        } else if (s->ix.e[i].tier == KVS_TIER_DRAM) {
            b = blob_of(&s->ix.e[i]);
            rc = 0;
        } else {
            rc = do_fetch_ssd(s, i, &b, &where);
            if (rc == FETCH_RETRY && tries == 8)
                rc = KVS_EIO; /* the block keeps moving under us */
        }
    }
    if (rc == 0) {
        kvs__entry *x = &s->ix.e[i];
        b->refs++;
        kvs__touch(s, i);
        ref->data = kvs__blob_data(b);
        ref->size = b->size;
        ref->tier = where;
        ref->ns_id = x->ns_id;
        ref->tenant = x->tenant;
        ref->h_ = b;
    }
    kvs__unlock(s);
    return rc;
}

void kvs_store_read_release(kvs_store *s, kvs_store_ref *ref)
{
    if (!s || !ref || !ref->h_)
        return;
    kvs__blob *b = ref->h_;
    kvs__lock(s);
    KVS_ASSERT(b->refs > 0);
    b->refs--;
    blob_unref(s, b);
    kvs__unlock(s);
    memset(ref, 0, sizeof *ref);
}

/* ---- tunables, facts, figures -------------------------------------------- */

int kvs_store_shared_memory(kvs_store *s, int *fd, const void **base, uint64_t *len)
{
    if (!s || !fd || !base || !len)
        return KVS_EINVAL;
    void *b = NULL;
    int rc = s->dram && s->dram->m->memory ? s->dram->m->memory(s->dram, fd, &b, len) : KVS_ENODEV;
    *base = b;
    return rc;
}

int kvs_store_prefault(kvs_store *s)
{
    if (!s)
        return KVS_EINVAL;
    return s->ps.pinned ? 0 : kvs_tier_dram_prefault(s->dram);
}

int kvs_store_set_capacity_bytes(kvs_store *s, uint64_t bytes)
{
    if (!s)
        return KVS_EINVAL;
    kvs__lock(s);
    int rc = 0;
    if (s->region_bytes && bytes > s->region_bytes) {
        rc = KVS_EINVAL; /* the arena was sized at open */
    } else {
        s->cap_bytes = bytes;
        uint64_t cap = bytes ? bytes : s->region_bytes;
        if (cap && s->used > (uint64_t)(s->high * (double)cap)) {
            kvs__evict(s, KVS__EV_BYTES, (uint64_t)(s->low * (double)cap), KVS_EVICT_RESIZE);
            if (s->used > cap)
                rc = KVS_ENOSPC;
        }
    }
    kvs__unlock(s);
    return rc;
}

int kvs_store_set_watermarks(kvs_store *s, double high, double low)
{
    if (!s || bad_marks(high, low))
        return KVS_EINVAL;
    kvs__lock(s);
    s->high = high;
    s->low = low;
    uint64_t cap = s->cap_bytes ? s->cap_bytes : s->region_bytes;
    if (cap && s->used > (uint64_t)(high * (double)cap))
        kvs__evict(s, KVS__EV_BYTES, (uint64_t)(low * (double)cap), KVS_EVICT_WATERMARK);
    kvs__unlock(s);
    return 0;
}

int kvs_store_info_get(kvs_store *s, const kvs_key *key, kvs_store_info *out)
{
    if (!s || !key || !out)
        return KVS_EINVAL;
    kvs__lock(s);
    uint32_t i = kvs__find(&s->ix, key);
    if (i != KVS__NIL) {
        const kvs__entry *x = &s->ix.e[i];
        *out = (kvs_store_info){.size = x->size,
                                .tier = (kvs_tier_kind)x->tier,
                                .ns_id = x->ns_id,
                                .tenant = x->tenant,
                                .depth = x->depth,
                                .nchildren = x->nchildren,
                                .pins = x->pins};
    }
    kvs__unlock(s);
    return i == KVS__NIL ? KVS_ENOTFOUND : 0;
}

void kvs_store_get_payload_stats(kvs_store *s, kvs_store_payload_stats *out)
{
    kvs__lock(s);
    *out = s->ps;
    out->capacity_bytes = s->cap_bytes;
    out->used_bytes = s->used;
    out->ssd_capacity_bytes = s->ssd_cap;
    out->leases = s->nholds - s->ndead_holds;
    kvs__unlock(s);
}

int kvs__payload_check(kvs_store *s, char *err, size_t errlen)
{
    uint64_t by[4] = {0}, tenants = 0, resv = 0;
    for (uint32_t i = 0; i < s->ix.used_e; i++) {
        const kvs__entry *x = &s->ix.e[i];
        if (!(x->flags & KVS__F_LIVE))
            continue;
        if (x->tier == KVS_TIER_DRAM || x->tier == KVS_TIER_SSD)
            by[x->tier] += x->size;
        if (x->tier == KVS_TIER_DRAM) {
            const kvs__blob *b = blob_of(x);
            if (!b->attached || b->size != x->size || b->tenant != x->tenant) {
                if (err && errlen)
                    snprintf(err, errlen, "entry %u: payload header disagrees", i);
                return KVS_EINTERNAL;
            }
        }
    }
    for (uint32_t t = 0; t < KVS__NTENANTS; t++) {
        tenants += s->t_bytes[t];
        resv += s->t_resv[t];
    }
    const char *why = NULL;
    if (by[KVS_TIER_DRAM] != s->ps.bytes[KVS_TIER_DRAM] ||
        by[KVS_TIER_SSD] != s->ps.bytes[KVS_TIER_SSD])
        why = "bytes per tier differ from the blocks";
    else if (tenants != by[KVS_TIER_DRAM] + by[KVS_TIER_SSD])
        why = "tenant bytes differ from the blocks";
    else if (s->ssd_used != by[KVS_TIER_SSD])
        why = "SSD usage differs from the blocks";
    else if (s->used < by[KVS_TIER_DRAM] + resv)
        why = "DRAM usage below the bytes it holds";
    if (why && err && errlen)
        snprintf(err, errlen, "payload: %s", why);
    return why ? KVS_EINTERNAL : 0;
}
