/*
 * xproc.c — the parent side of the isolated data plane (xproc.h): keeps one
 * kvstash-xferd child running, answers its requests with the store
 * callbacks, and restarts it when it ends.
 *
 * Threads: one reader thread per kvs__xp reads the child's messages and runs
 * the store callbacks (provide, release, put_begin, put_end, session_end) for
 * them; callers of kvs_xfer_server_* send calls and wait for the reader to
 * deliver the reply; provide_done (and the release it may call) may come from
 * any thread, and session_close runs session_end on its caller's thread. x->mu
 * guards the child's state and the tables.
 *
 * Session data: borrowed from session_open until session_end, as in
 * process. session_end is called exactly once per session session_open
 * returned, when it leaves the table: the child reports it closed, its child
 * died (or destroy), or session_close. Whoever takes it out waits until the
 * reader is out of any callback holding its data (cb_key).
 *
 * Tables: sessions (the key the child names a session by -> the caller's
 * session_data), and slots (a block lent to the child, or a put landing in
 * bounce memory), named by idx | gen << 32 so a stale or forged id is
 * refused. When the child ends every slot is given back (release, or put_end
 * with KVS_ECANCELED), so the store's references never outlive the process that
 * held them; when a session ends, its slots are (a child that keeps blocks
 * pins them no longer than its session), and a session has at most MAX_LENT
 * blocks lent at once.
 *
 * Bounce memory: one memfd, mapped read-write here and in the child,
 * allocated in 64 KiB units (first fit). A provided block outside
 * opts.shared is copied there and its store reference released at once.
 *
 * Shared memory (opts.shared, the store's memory tier): the child gets
 * x->sfd, the same memory opened again read-only, never opts.shared.fd.
 * A read-only mapping of a read-write descriptor can be made writable
 * (mprotect), one of a read-only descriptor cannot (EACCES). A read-only
 * descriptor can still be reopened read-write through /proc/self/fd, so
 * create also seals the memory against writes through any later mapping or
 * descriptor (F_SEAL_FUTURE_WRITE) and against resizing: the mappings that
 * exist already (the store's) still write.
 */
#include "kvs_error.h"
#include "kvs_log.h"
#include "ucx_internal.h"
#include "xproc.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MOD          "xfer"
#define UNIT         (64u << 10)
#define STARTS       5u     /* child starts allowed ... */
#define START_WIN_MS 10000u /* ... in this window */
#define HELLO_MS     20000u
#define CALL_MS      15000u
#define OLD_ADDRS    8u

enum { SLOT_FREE, SLOT_LENT, SLOT_PUT };

typedef struct xp_slot {
    uint32_t gen;
    uint32_t next_free; /* SLOT_FREE: the next free slot, UINT32_MAX: none */
    uint8_t kind;
    void *ref;     /* the store's */
    uint8_t held;  /* SLOT_LENT: release(ref) is still owed (not when copied to bounce) */
    void *buf;     /* a put's destination */
    uint64_t boff; /* bounce offset, UINT64_MAX: none */
    uint64_t len;
    uint64_t skey; /* the session it was lent or put for */
} xp_slot;

/* Blocks one session may have lent to the child at once. A well-behaved
 * child never comes near it: in process a session holds at most
 * KVS__MAX_SENDS (65536) layer sends, each block at least one, plus the
 * blocks of its fetch requests still being provided. A child that lends
 * itself blocks without releasing them (one under an attacker's control)
 * pins at most this many per session, and only until the session ends. */
#define MAX_LENT 65536u

typedef struct xp_sess {
    uint64_t key, id;
    void *data;
    int open;      /* session_open returned it: one session_end is owed */
    uint32_t lent; /* SLOT_LENT slots naming it */
    uint32_t pend; /* provide_async calls for it the store has not finished */
    uint32_t begins; /* put_begin_async calls for it the store has not finished */
} xp_sess;

/* Put begins one session may have pending in the store (put_begin_async):
 * the child bounds its own at 256 (ucx_server.c); one that sends more gets
 * KVS_ENOSPC, so it cannot make the store reserve without limit. */
#define MAX_BEGINS 1024u

/* One child's socket; freed when the reader and every caller are done. */
typedef struct xp_link {
    kvs__xp_conn c;
    int pidfd;     /* the child's process (pidfd_open), -1: none */
    unsigned refs; /* under x->mu */
} xp_link;

typedef struct xp_pend { /* a provide_async the store has not finished */
    xp_link *l;
    uint64_t skey;   /* the session it is for */
    uint64_t handle; /* the child's */
} xp_pend;

typedef struct xp_put_pend { /* a put_end_async the store has not finished */
    xp_link *l;
    uint64_t handle; /* the child's */
} xp_put_pend;

typedef struct xp_begin_pend { /* a put_begin_async the store has not finished */
    xp_link *l;
    uint64_t handle; /* the child's */
    uint64_t skey;   /* the session it is for */
    uint64_t len;
} xp_begin_pend;

struct kvs__xp {
    kvs_xfer_store_ops ops;
    kvs_xfer_shared shared;
    char *path, *args[14], nums[7][24];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thr;
    int thr_started, stopping;
    xp_link *link; /* the running child's; NULL when none */
    pid_t pid;
    void *addr;
    size_t alen;
    /* Addresses of the last OLD_ADDRS earlier children: a caller of
     * kvs__xp_address may still be copying one while the child is replaced. */
    void *old_addrs[OLD_ADDRS];
    unsigned old_next;
    xp_sess *sess;
    size_t nsess, capsess;
    uint64_t next_key;
    /* The session whose data the reader has lent to a store callback now (0:
     * none); a thread that takes a session out of the table waits for it
     * (do_sess_drop), as the caller may free the data when it returns. */
    uint64_t cb_key;
    xp_slot *slots;
    uint32_t nslots, free_slot; /* free_slot: head of the free list */
    uint64_t lent, lend_refused;
    /* Slots taken out of the table whose release / put_end has not returned
     * yet: session_end waits for none (wait_given), so it never comes before
     * a release of that session's block (xfer.h). */
    unsigned giving;
    uint64_t pending; /* provide_async, put_end_async and put_begin_async calls the store has
                       * not finished */
    uint64_t restarts, bounce_fails, bounce_copies;
    /* Counters of children gone (their last snapshot, so a restart does not
     * send them backwards; what a child counted after it is lost). */
    kvs_xfer_server_stats base, last;
    uint64_t started_ms[STARTS];
    unsigned start_next, starts;
    uint64_t held; /* reader only: since when no child could be started; 0 */
    /* opts.shared's memory opened again read-only: the child's (-1: none) */
    int sfd;
    /* bounce memory */
    pthread_mutex_t bmu;
    int bfd;
    uint8_t *bbase;
    uint64_t blen;
    uint8_t *bused; /* one byte per unit */
    uint32_t bunits;
    uint8_t *rbuf; /* the reader's message buffer */
};

/* ---- bounce memory ---------------------------------------------------------- */

static uint64_t bounce_alloc(kvs__xp *x, uint64_t len)
{
    uint64_t k = (len + UNIT - 1) / UNIT;
    if (k == 0)
        k = 1;
    pthread_mutex_lock(&x->bmu);
    uint32_t run = 0;
    for (uint32_t i = 0; i < x->bunits && k <= x->bunits; i++) {
        run = x->bused[i] ? 0 : run + 1;
        if (run == k) {
            uint32_t first = i + 1 - (uint32_t)k;
            memset(x->bused + first, 1, k);
            pthread_mutex_unlock(&x->bmu);
            return (uint64_t)first * UNIT;
        }
    }
    pthread_mutex_unlock(&x->bmu);
    return UINT64_MAX;
}

static void bounce_free(kvs__xp *x, uint64_t off, uint64_t len)
{
    if (off == UINT64_MAX)
        return;
    uint64_t k = (len + UNIT - 1) / UNIT;
    pthread_mutex_lock(&x->bmu);
    memset(x->bused + off / UNIT, 0, k ? k : 1);
    pthread_mutex_unlock(&x->bmu);
}

/* ---- links ------------------------------------------------------------------ */

static xp_link *link_get(kvs__xp *x)
{
    pthread_mutex_lock(&x->mu);
    xp_link *l = x->link;
    if (l)
        l->refs++;
    pthread_mutex_unlock(&x->mu);
    return l;
}

static void link_put(kvs__xp *x, xp_link *l)
{
    pthread_mutex_lock(&x->mu);
    unsigned left = --l->refs;
    pthread_mutex_unlock(&x->mu);
    if (left)
        return;
    close(l->c.fd);
    if (l->pidfd >= 0)
        close(l->pidfd);
    kvs__xp_conn_fini(&l->c);
    free(l);
}

/* Ends l's child, and shuts its socket so the reader sees the end even if a
 * process the child started holds the other end open; the reader then
 * reaps it, kills its process group and starts another. Signalled through
 * its pidfd where there is one: a pid read here may have been reaped and
 * reused meanwhile. */
static void child_kill(kvs__xp *x, xp_link *l, const char *why)
{
    pthread_mutex_lock(&x->mu);
    pid_t pid = x->link == l ? x->pid : 0;
    pthread_mutex_unlock(&x->mu);
    if (pid > 0) {
        KVS_LOG_WARN(MOD, "data plane process %d %s: killing it", (int)pid, why);
        if (l->pidfd >= 0)
            (void)syscall(SYS_pidfd_send_signal, l->pidfd, SIGKILL, NULL, 0); /* ESRCH: gone */
        else
            (void)kill(pid, SIGKILL);
    }
    shutdown(l->c.fd, SHUT_RDWR);
}

/* A call to the child got no answer, or a message to it could not be sent,
 * in CALL_MS (KVS_ETIMEDOUT): it is wedged (a UCX deadlock, a stopped
 * process). */
static void call_timed_out(kvs__xp *x, xp_link *l, int rc)
{
    if (rc == KVS_ETIMEDOUT)
        child_kill(x, l, "did not answer or take a message in 15 s");
}

/* Sends to l's child from the reader or a provide_done thread. A failed
 * send: the child is gone (its reader gives back what it held) or wedged. */
static void send_to(kvs__xp *x, xp_link *l, kvs__xp_msg *m, const void *tail, uint32_t n)
{
    call_timed_out(x, l, kvs__xp_send(&l->c, m, tail, n));
}

/* ---- tables (under x->mu) --------------------------------------------------- */

/* The index of the session the child names key, or SIZE_MAX. */
static size_t sess_find(kvs__xp *x, uint64_t key)
{
    for (size_t i = 0; i < x->nsess; i++)
        if (x->sess[i].key == key)
            return i;
    return SIZE_MAX;
}

/* Session key's count of unfinished provide_async calls, moved by d (a
 * session no longer in the table has none). Under x->mu. */
static void sess_pend(kvs__xp *x, uint64_t key, int d)
{
    size_t i = sess_find(x, key);
    if (i != SIZE_MAX && (d > 0 || x->sess[i].pend))
        x->sess[i].pend += (uint32_t)d;
}

/* The same for its unfinished put_begin_async calls. Under x->mu. */
static void sess_begins(kvs__xp *x, uint64_t key, int d)
{
    size_t i = sess_find(x, key);
    if (i != SIZE_MAX && (d > 0 || x->sess[i].begins))
        x->sess[i].begins += (uint32_t)d;
}

/* Takes session i out of the table and waits until no store callback on the
 * reader thread still holds its data. */
static void do_sess_drop(kvs__xp *x, size_t i)
{
    uint64_t key = x->sess[i].key;
    x->sess[i] = x->sess[--x->nsess];
    while (x->cb_key == key)
        pthread_cond_wait(&x->cv, &x->mu);
}

/* Reader thread, before a store callback with the data of session key: 1
 * with *data (until cb_leave it stays valid), 0 when key is not an open
 * session's (closed meanwhile, still opening, or a key never given). */
static int cb_enter(kvs__xp *x, uint64_t key, void **data)
{
    pthread_mutex_lock(&x->mu);
    size_t i = sess_find(x, key);
    if (i != SIZE_MAX && !x->sess[i].open)
        i = SIZE_MAX; /* no client can use it before session_open returns */
    if (i != SIZE_MAX) {
        *data = x->sess[i].data;
        x->cb_key = key;
    }
    pthread_mutex_unlock(&x->mu);
    return i != SIZE_MAX;
}

static void cb_leave(kvs__xp *x)
{
    pthread_mutex_lock(&x->mu);
    x->cb_key = 0;
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
}

/* A free slot's id, or 0 (no memory). */
static uint64_t slot_new(kvs__xp *x, uint8_t kind, void *ref, void *buf, uint64_t boff,
                         uint64_t len, uint64_t skey)
{
    if (x->free_slot == UINT32_MAX) {
        uint32_t n = x->nslots ? x->nslots * 2 : 64;
        xp_slot *s = n > x->nslots ? realloc(x->slots, n * sizeof *s) : NULL;
        if (!s)
            return 0;
        memset(s + x->nslots, 0, (n - x->nslots) * sizeof *s);
        for (uint32_t i = x->nslots; i < n; i++)
            s[i].next_free = i + 1 < n ? i + 1 : UINT32_MAX;
        x->free_slot = x->nslots;
        x->slots = s;
        x->nslots = n;
    }
    uint32_t i = x->free_slot;
    xp_slot *s = &x->slots[i];
    x->free_slot = s->next_free;
    if (++s->gen == 0 && i == 0)
        s->gen = 1; /* id 0 means "none" */
    s->kind = kind;
    s->ref = ref;
    s->held = 0;
    s->buf = buf;
    s->boff = boff;
    s->len = len;
    s->skey = skey;
    return (uint64_t)i | (uint64_t)s->gen << 32;
}

/* Slot i back on the free list; a lent one no longer counts against its
 * session. */
static void slot_free(kvs__xp *x, uint32_t i)
{
    xp_slot *s = &x->slots[i];
    if (s->kind == SLOT_LENT) {
        x->lent--;
        size_t j = sess_find(x, s->skey);
        if (j != SIZE_MAX && x->sess[j].lent)
            x->sess[j].lent--;
    }
    s->kind = SLOT_FREE;
    s->next_free = x->free_slot;
    x->free_slot = i;
}

/* Takes the slot named id if it is of kind: 1 with *out, else 0. */
static int slot_take(kvs__xp *x, uint64_t id, uint8_t kind, xp_slot *out)
{
    uint32_t i = (uint32_t)id;
    if (i >= x->nslots || x->slots[i].kind != kind || x->slots[i].gen != (uint32_t)(id >> 32))
        return 0;
    *out = x->slots[i];
    slot_free(x, i);
    x->giving++; /* slot_given when it has been given back */
    return 1;
}

static void slot_given(kvs__xp *x, unsigned k)
{
    pthread_mutex_lock(&x->mu);
    x->giving -= k;
    if (!x->giving)
        pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
}

/* Waits until every slot taken out of the table has been given back. */
static void wait_given(kvs__xp *x)
{
    pthread_mutex_lock(&x->mu);
    while (x->giving)
        pthread_cond_wait(&x->cv, &x->mu);
    pthread_mutex_unlock(&x->mu);
}

static void slot_give_back(kvs__xp *x, const xp_slot *s)
{
    if (s->kind == SLOT_LENT && s->held)
        x->ops.release(x->ops.ctx, s->ref);
    if (s->kind == SLOT_PUT) {
        kvs_xfer_put_reply ignored;
        memset(&ignored, 0, sizeof ignored);
        x->ops.put_end(x->ops.ctx, s->ref, KVS_ECANCELED, &ignored);
    }
    bounce_free(x, s->boff, s->len);
}

/* Gives back every slot of session skey (every slot when skey is 0): taken
 * under x->mu in batches, given back outside it. The caller has made sure no
 * new slot can name skey (the session left the table) or the child (it is no
 * longer x->link). A session's puts stay (skey != 0): the client's bytes may
 * go on landing in their bounce memory after the session has ended (UCX's
 * tcp endpoint receives after its close; ucx_server.c session_sweep), so
 * only the child's PUT_END, once UCX is done, or its death give them back;
 * bounce memory bounds what a child can hold that way. */
static void slots_give_back(kvs__xp *x, uint64_t skey)
{
    xp_slot batch[64];
    uint32_t from = 0, k;
    do {
        k = 0;
        pthread_mutex_lock(&x->mu);
        for (; from < x->nslots && k < 64; from++) {
            xp_slot *s = &x->slots[from];
            if (s->kind != SLOT_FREE && (!skey || (s->skey == skey && s->kind == SLOT_LENT))) {
                batch[k++] = *s;
                slot_free(x, from);
            }
        }
        x->giving += k;
        pthread_mutex_unlock(&x->mu);
        for (uint32_t i = 0; i < k; i++)
            slot_give_back(x, &batch[i]);
        if (k)
            slot_given(x, k);
    } while (k == 64);
}

/* Bounce memory ran out (under x->mu): 1 when puts of sessions that have
 * ended hold half of it or more. Their clients' bytes may still be landing
 * (ucx_server.c session_sweep), so only the child's end gives that memory
 * back: a peer that started puts and never sent their data would otherwise
 * starve every bounce copy for as long as the child lives. */
static int bounce_starved(kvs__xp *x)
{
    uint64_t held = 0;
    for (uint32_t i = 0; i < x->nslots; i++)
        if (x->slots[i].kind == SLOT_PUT && sess_find(x, x->slots[i].skey) == SIZE_MAX)
            held += x->slots[i].len;
    return held >= x->blen / 2;
}

/* ---- lending a block to the child ------------------------------------------- */

/* Answers the child's PROVIDE handle for session skey: the block src the
 * store lent (rc 0), or rc. A block is lent only while its session is in the
 * table and holds fewer than MAX_LENT; otherwise it goes straight back. */
static void lend(kvs__xp *x, xp_link *l, uint64_t skey, uint64_t handle, int rc,
                 const kvs_xfer_block_src *src)
{
    kvs__xp_msg m = {.type = KVS__XP_PROVIDED, .seq = handle, .rc = rc};
    /* The tail, bounds || seal: a copy, as the store's are borrowed until
     * release, which the bounce copy below comes to first. */
    uint8_t *tail = NULL;
    int starved = 0;
    uint32_t n = 0;
    if (rc == 0 && (src->layers || src->seal_len)) {
        uint64_t nb = src->layers ? ((uint64_t)src->layers + 1) * 8 : 0;
        if (src->seal_len > KVS_XFER_MAX_SEAL || (src->seal_len && !src->seal) ||
            nb + src->seal_len > KVS__XP_TAIL_MAX || !(tail = malloc(nb + src->seal_len))) {
            x->ops.release(x->ops.ctx, src->ref);
            m.rc = rc = KVS_EINTERNAL;
        } else {
            if (nb)
                memcpy(tail, src->bounds, nb);
            if (src->seal_len)
                memcpy(tail + nb, src->seal, src->seal_len);
            n = (uint32_t)nb + src->seal_len;
        }
    }
    if (rc == 0) {
        const uint8_t *b = src->bytes, *sb = x->shared.base;
        void *ref = src->ref;
        uint64_t boff = UINT64_MAX;
        int copied = 0;
        if (x->shared.len && b >= sb && src->len <= x->shared.len &&
            (uint64_t)(b - sb) <= x->shared.len - src->len) {
            m.b = KVS__XP_REGION_SHARED;
            m.c = (uint64_t)(b - sb);
        } else if (b >= x->bbase && src->len <= x->blen &&
                   (uint64_t)(b - x->bbase) <= x->blen - src->len) {
            /* built in kvs__xp_buffer memory: lent in place too; the store's
             * release frees it (kvs__xp_buffer_free), not the slot */
            m.b = KVS__XP_REGION_BOUNCE;
            m.c = (uint64_t)(b - x->bbase);
        } else {
            copied = 1;
            boff = bounce_alloc(x, src->len);
            if (boff != UINT64_MAX)
                memcpy(x->bbase + boff, b, src->len);
            x->ops.release(x->ops.ctx, ref);
            ref = NULL;
            m.b = KVS__XP_REGION_BOUNCE;
            m.c = boff;
        }
        pthread_mutex_lock(&x->mu);
        x->bounce_copies += copied && boff != UINT64_MAX;
        size_t si = sess_find(x, skey);
        if (copied && boff == UINT64_MAX) {
            x->bounce_fails++;
            m.rc = KVS_ENOSPC;
            starved = bounce_starved(x);
        } else if (x->link != l) { /* that child is gone: nothing to send to */
            pthread_mutex_unlock(&x->mu);
            slot_give_back(
                x,
                &(xp_slot){
                    .kind = SLOT_LENT, .ref = ref, .held = !copied, .boff = boff, .len = src->len});
            free(tail);
            return;
        } else if (si == SIZE_MAX || !x->sess[si].open) { /* it ended while the store worked */
            m.rc = KVS_ECANCELED;
        } else if (x->sess[si].lent >= MAX_LENT) {
            x->lend_refused++;
            m.rc = KVS_ENOSPC;
        } else if ((m.a = slot_new(x, SLOT_LENT, ref, NULL, boff, src->len, skey)) == 0) {
            m.rc = KVS_ENOMEM;
        } else {
            x->slots[(uint32_t)m.a].held = !copied;
            x->sess[si].lent++;
            x->lent++;
        }
        pthread_mutex_unlock(&x->mu);
        if (m.rc != 0) {
            slot_give_back(
                x,
                &(xp_slot){
                    .kind = SLOT_LENT, .ref = ref, .held = !copied, .boff = boff, .len = src->len});
            n = 0;
        } else {
            m.d = src->len;
            m.fmt = src->layers;
        }
    }
    /* A failed send: the child is gone, and its reader gives the slot back. */
    send_to(x, l, &m, tail, n);
    free(tail);
    if (starved)
        child_kill(x, l, "holds half its bounce memory for puts of closed sessions");
}

/* A provide_async, put_end_async or put_begin_async the store has finished: drops its link
 * reference and wakes destroy, which waits for every one. */
static void pend_done(kvs__xp *x, xp_link *l)
{
    link_put(x, l);
    pthread_mutex_lock(&x->mu);
    x->pending--;
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
}

void kvs__xp_provide_done(kvs__xp *x, void *handle, int status, const kvs_xfer_block_src *src)
{
    xp_pend *p = handle;
    if (status == 0 && !src)
        status = KVS_EINTERNAL;
    pthread_mutex_lock(&x->mu);
    sess_pend(x, p->skey, -1);
    pthread_mutex_unlock(&x->mu);
    lend(x, p->l, p->skey, p->handle, status > 0 ? KVS_EINTERNAL : status, src);
    xp_link *l = p->l;
    free(p);
    pend_done(x, l);
}

void kvs__xp_put_done(kvs__xp *x, void *handle, int status, const kvs_xfer_put_reply *reply)
{
    xp_put_pend *p = handle;
    kvs__xp_msg m = {
        .type = KVS__XP_PUT_ENDED, .seq = p->handle, .rc = status > 0 ? KVS_EINTERNAL : status};
    if (reply)
        m.reply = *reply;
    pthread_mutex_lock(&x->mu);
    int live = x->link == p->l; /* else that child is gone: nobody to answer */
    pthread_mutex_unlock(&x->mu);
    if (live)
        send_to(x, p->l, &m, NULL, 0);
    xp_link *l = p->l;
    free(p);
    pend_done(x, l);
}

void *kvs__xp_buffer(kvs__xp *x, uint64_t len)
{
    uint64_t off = bounce_alloc(x, len);
    return off == UINT64_MAX ? NULL : x->bbase + off;
}

void kvs__xp_buffer_free(kvs__xp *x, void *buf, uint64_t len)
{
    if (buf)
        bounce_free(x, (uint64_t)((uint8_t *)buf - x->bbase), len);
}

/* ---- the child's requests (on the reader thread) ---------------------------- */

static void on_provide(kvs__xp *x, xp_link *l, const kvs__xp_msg *m, const uint8_t *nonce)
{
    void *data = NULL;
    if (m->n != KVS_XFER_NONCE_LEN) { /* not our child's message */
        lend(x, l, m->a, m->seq, KVS_EINVAL, NULL);
        return;
    }
    if (!cb_enter(x, m->a, &data)) { /* closed meanwhile, or a key we never gave */
        lend(x, l, m->a, m->seq, KVS_ECANCELED, NULL);
        return;
    }
    /* Blocks the store is still building count against the session's bound
     * too: each may hold a store reference and a place in a queue. */
    pthread_mutex_lock(&x->mu);
    size_t si = sess_find(x, m->a); /* an index is good under x->mu only */
    int full = si != SIZE_MAX && x->sess[si].lent + x->sess[si].pend >= MAX_LENT;
    x->lend_refused += full;
    pthread_mutex_unlock(&x->mu);
    if (full) {
        cb_leave(x);
        lend(x, l, m->a, m->seq, KVS_ENOSPC, NULL);
        return;
    }
    if (x->ops.provide_async) {
        xp_pend *p = calloc(1, sizeof *p);
        if (p) {
            p->l = l;
            p->skey = m->a;
            p->handle = m->seq;
            pthread_mutex_lock(&x->mu);
            l->refs++;
            x->pending++;
            sess_pend(x, m->a, 1);
            pthread_mutex_unlock(&x->mu);
            int rc = x->ops.provide_async(x->ops.ctx, data, m->key, m->fmt, nonce, p);
            if (rc == 0) {
                cb_leave(x);
                return; /* kvs__xp_provide_done carries on */
            }
            pthread_mutex_lock(&x->mu);
            x->pending--;
            sess_pend(x, m->a, -1);
            pthread_mutex_unlock(&x->mu);
            link_put(x, l);
            free(p);
            if (rc < 0) {
                cb_leave(x);
                lend(x, l, m->a, m->seq, rc, NULL);
                return;
            }
        }
    }
    kvs_xfer_block_src src = {0};
    int rc = x->ops.provide(x->ops.ctx, data, m->key, m->fmt, nonce, &src);
    cb_leave(x);
    lend(x, l, m->a, m->seq, rc, &src);
}

/* Answers the child's put begin for session skey (type REPLY to its
 * PUT_BEGIN call, or PUT_BEGUN): the store's verdict rc and reply, and for
 * rc 0 its buf and ref, which get a slot and the bounce memory the child's
 * bytes land in. A put begun for a session that has ended meanwhile, or for
 * a child that is gone, is ended at once (KVS_ECANCELED). On the reader, or
 * on the thread of the store's kvs__xp_put_begun. */
static void begin_answer(kvs__xp *x, xp_link *l, uint32_t type, uint64_t seq, uint64_t skey,
                         uint64_t len, int rc, void *buf, void *ref,
                         const kvs_xfer_put_reply *reply)
{
    /* fmt marks the answer to a PUT_BEGIN: a child whose call timed out
     * ends a put it did not expect any more (xproc_main.c) */
    kvs__xp_msg r = {.type = type, .seq = seq, .rc = rc, .fmt = KVS__XP_PUT_BEGIN};
    if (reply)
        r.reply = *reply;
    int starved = 0, live = 1;
    if (r.rc == 0) {
        uint64_t boff = bounce_alloc(x, len);
        xp_slot s = {.kind = SLOT_PUT, .ref = ref, .boff = boff, .len = len};
        pthread_mutex_lock(&x->mu);
        x->bounce_copies += boff != UINT64_MAX;
        if (boff == UINT64_MAX) {
            x->bounce_fails++;
            r.rc = KVS_ENOSPC;
            starved = bounce_starved(x);
        } else if (x->link != l || sess_find(x, skey) == SIZE_MAX) { /* it ended meanwhile */
            r.rc = KVS_ECANCELED;
        } else if (!buf) {
            r.rc = KVS_EINTERNAL;
        } else if ((r.a = slot_new(x, SLOT_PUT, ref, buf, boff, len, skey)) == 0) {
            r.rc = KVS_ENOMEM;
        }
        pthread_mutex_unlock(&x->mu);
        if (r.rc != 0) {
            slot_give_back(x, &s);
            memset(&r.reply, 0, sizeof r.reply);
        }
        r.c = boff;
    }
    pthread_mutex_lock(&x->mu);
    live = x->link == l; /* else that child is gone: nobody to answer */
    pthread_mutex_unlock(&x->mu);
    if (live)
        send_to(x, l, &r, NULL, 0);
    if (starved)
        child_kill(x, l, "holds half its bounce memory for puts of closed sessions");
}

void kvs__xp_put_begun(kvs__xp *x, void *handle, int status, void *buf, void *ref,
                       const kvs_xfer_put_reply *reply)
{
    xp_begin_pend *p = handle;
    pthread_mutex_lock(&x->mu);
    sess_begins(x, p->skey, -1);
    pthread_mutex_unlock(&x->mu);
    begin_answer(x, p->l, KVS__XP_PUT_BEGUN, p->handle, p->skey, p->len,
                 status > 0 ? KVS_EINTERNAL : status, buf, ref, reply);
    xp_link *l = p->l;
    free(p);
    pend_done(x, l);
}

/* The child's PUT_BEGIN (a call: the answer is a REPLY) or PUT_BEGIN_ASYNC
 * (the answer is a PUT_BEGUN). With PUT_BEGIN_ASYNC and a store that has
 * put_begin_async, the store begins it on another thread and
 * kvs__xp_put_begun answers, so the reader goes on with the child's next
 * message (a fetch's provide) meanwhile. */
static void on_put_begin(kvs__xp *x, xp_link *l, const kvs__xp_msg *m, const uint8_t *meta,
                         int async)
{
    uint32_t type = async ? KVS__XP_PUT_BEGUN : KVS__XP_REPLY;
    void *data = NULL, *buf = NULL, *ref = NULL;
    kvs_xfer_put_reply reply;
    memset(&reply, 0, sizeof reply);
    int rc;
    if (!x->ops.put_begin) {
        rc = KVS_EUNIMPL;
    } else if (m->n > KVS_XFER_MAX_META) {
        rc = KVS_EINVAL; /* the in-process server drops such a header */
    } else if (m->b > x->blen) {
        /* Bounce memory could never hold it; and a length near 2^64 would
         * wrap bounce_alloc's unit count, then overrun it in on_put_end. */
        pthread_mutex_lock(&x->mu);
        x->bounce_fails++;
        pthread_mutex_unlock(&x->mu);
        rc = KVS_ENOSPC;
    } else if (!cb_enter(x, m->a, &data)) {
        rc = KVS_ECANCELED;
    } else {
        rc = 1;
        if (async && x->ops.put_begin_async) {
            xp_begin_pend *p = NULL;
            pthread_mutex_lock(&x->mu);
            /* In the table while cb_key names it (do_sess_drop waits). */
            size_t si = sess_find(x, m->a);
            int full = si == SIZE_MAX || x->sess[si].begins >= MAX_BEGINS;
            if (!full && (p = calloc(1, sizeof *p))) {
                p->l = l;
                p->handle = m->seq;
                p->skey = m->a;
                p->len = m->b;
                l->refs++;
                x->pending++;
                x->sess[si].begins++;
            }
            pthread_mutex_unlock(&x->mu);
            if (full) {
                rc = KVS_ENOSPC;
            } else if (p) {
                rc = x->ops.put_begin_async(x->ops.ctx, data, m->key, m->fmt, meta, m->n, m->b, p);
                if (rc == 0) {
                    cb_leave(x);
                    return; /* kvs__xp_put_begun answers */
                }
                pthread_mutex_lock(&x->mu);
                x->pending--;
                sess_begins(x, m->a, -1);
                pthread_mutex_unlock(&x->mu);
                link_put(x, l);
                free(p);
            }
        }
        if (rc > 0)
            rc = x->ops.put_begin(x->ops.ctx, data, m->key, m->fmt, meta, m->n, m->b, &buf, &ref,
                                  &reply);
        cb_leave(x);
    }
    begin_answer(x, l, type, m->seq, m->a, m->b, rc, buf, ref, &reply);
}

/* The child's PUT_END (a call: the answer is a REPLY) or PUT_END_ASYNC
 * (every byte landed; the answer is a PUT_ENDED). The put is copied out of
 * bounce memory into the store's buffer first (the child may write bounce
 * memory at any time; the store checks the copy). With PUT_END_ASYNC and a
 * store that has put_end_async, the store ends it on another thread and
 * kvs__xp_put_done answers, so the reader goes on with the child's next
 * message instead of waiting for the quantization. */
static void on_put_end(kvs__xp *x, xp_link *l, const kvs__xp_msg *m, int async)
{
    kvs__xp_msg r = {.type = async ? KVS__XP_PUT_ENDED : KVS__XP_REPLY, .seq = m->seq};
    xp_slot s;
    pthread_mutex_lock(&x->mu);
    int ok = slot_take(x, m->a, SLOT_PUT, &s);
    pthread_mutex_unlock(&x->mu);
    if (!ok) {
        r.rc = KVS_EINVAL;
        send_to(x, l, &r, NULL, 0);
        return;
    }
    int status = async ? 0 : m->rc > 0 ? KVS_EINTERNAL : m->rc;
    if (status == 0)
        memcpy(s.buf, x->bbase + s.boff, s.len);
    bounce_free(x, s.boff, s.len);
    xp_put_pend *p = async && x->ops.put_end_async ? calloc(1, sizeof *p) : NULL;
    if (p) {
        p->l = l;
        p->handle = m->seq;
        pthread_mutex_lock(&x->mu);
        l->refs++;
        x->pending++;
        pthread_mutex_unlock(&x->mu);
        if (x->ops.put_end_async(x->ops.ctx, s.ref, p) == 0) {
            slot_given(x, 1);
            return; /* kvs__xp_put_done answers */
        }
        pthread_mutex_lock(&x->mu);
        x->pending--;
        pthread_mutex_unlock(&x->mu);
        link_put(x, l);
        free(p);
    }
    r.rc = x->ops.put_end(x->ops.ctx, s.ref, status, &r.reply);
    slot_given(x, 1);
    send_to(x, l, &r, NULL, 0);
}

static void on_message(kvs__xp *x, xp_link *l, const kvs__xp_msg *m, const uint8_t *tail)
{
    xp_slot s;
    switch (m->type) {
    case KVS__XP_REPLY:
        (void)kvs__xp_deliver(&l->c, m, tail);
        break;
    case KVS__XP_PROVIDE:
        on_provide(x, l, m, tail);
        break;
    case KVS__XP_RELEASE: {
        pthread_mutex_lock(&x->mu);
        int ok = slot_take(x, m->a, SLOT_LENT, &s);
        pthread_mutex_unlock(&x->mu);
        if (ok) {
            slot_give_back(x, &s);
            slot_given(x, 1);
        }
        break;
    }
    case KVS__XP_PUT_BEGIN:
        on_put_begin(x, l, m, tail, 0);
        break;
    case KVS__XP_PUT_BEGIN_ASYNC:
        on_put_begin(x, l, m, tail, 1);
        break;
    case KVS__XP_PUT_END:
        on_put_end(x, l, m, 0);
        break;
    case KVS__XP_PUT_END_ASYNC:
        on_put_end(x, l, m, 1);
        break;
    case KVS__XP_SESSION_END: { /* it closed itself (client failed, op timeout) */
        pthread_mutex_lock(&x->mu);
        size_t i = sess_find(x, m->a);
        xp_sess e = i != SIZE_MAX ? x->sess[i] : (xp_sess){0};
        if (i != SIZE_MAX)
            do_sess_drop(x, i);
        pthread_mutex_unlock(&x->mu);
        /* A well-behaved child has released the session's blocks before it
         * says so (ucx_server.c session_close); its puts end later. */
        if (i != SIZE_MAX) {
            slots_give_back(x, m->a);
            wait_given(x);
        }
        if (e.open && x->ops.session_end)
            x->ops.session_end(x->ops.ctx, e.data);
        break;
    }
    default:
        break;
    }
}

/* ---- the child's life ------------------------------------------------------- */

static void reap(pid_t pid, unsigned grace_ms)
{
    siginfo_t si;
    uint64_t until = kvs__now_ms() + grace_ms;
    for (;;) { /* until it has ended; not reaped yet (WNOWAIT) */
        memset(&si, 0, sizeof si);
        int r = waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT);
        if ((r == 0 && si.si_pid == pid) || (r != 0 && errno != EINTR))
            break;
        if (kvs__now_ms() >= until) {
            (void)kill(pid, SIGKILL); /* not reaped: the pid is still its own */
            while (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT) != 0 && errno == EINTR) {
            }
            break;
        }
        usleep(1000);
    }
    /* Whatever it started (its address-check helper; anything a child under
     * an attacker's control forked) ends with it: the group is its own
     * (KVS__SPAWN_GROUP), its sandbox forbids leaving it, and the group's id
     * cannot have been reused while the child is not reaped. */
    (void)kill(-pid, SIGKILL);
    int ws = 0;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
    }
    /* Members of its group that are ours to reap (a process it started with
     * CLONE_PARENT, before its sandbox refused that): SIGKILLed above, so
     * they end; 1 s at most. */
    for (uint64_t end = kvs__now_ms() + 1000; kvs__now_ms() < end;) {
        memset(&si, 0, sizeof si);
        if (waitid(P_PGID, (id_t)pid, &si, WEXITED | WNOHANG) != 0) {
            if (errno == EINTR)
                continue;
            break; /* ECHILD: none left */
        }
        if (si.si_pid == 0)
            usleep(1000); /* some still running */
    }
    if (WIFSIGNALED(ws))
        KVS_LOG_WARN(MOD, "data plane process %d ended by signal %d", (int)pid, WTERMSIG(ws));
    else if (WIFEXITED(ws) && WEXITSTATUS(ws) == KVS__XP_EXIT_WEDGED)
        KVS_LOG_WARN(MOD,
                     "data plane process %d stopped: its shared-memory receive queue was "
                     "wedged (a worker killed while writing into it); starting a fresh one",
                     (int)pid);
    else if (WIFEXITED(ws) && WEXITSTATUS(ws) == KVS__XP_EXIT_STUCK)
        KVS_LOG_WARN(MOD,
                     "data plane process %d stopped: sends to workers that died over shared "
                     "memory never complete in UCX, and each kept the dead worker's segments "
                     "mapped (kvstash_xfer_orphans_stuck); starting a fresh one",
                     (int)pid);
    else if (WIFEXITED(ws) && WEXITSTATUS(ws) != 0)
        KVS_LOG_WARN(MOD, "data plane process %d exited with status %d", (int)pid, WEXITSTATUS(ws));
}

/* Starts a child and waits for its HELLO; on success it is x->link. */
static int child_start(kvs__xp *x)
{
    uint64_t now = kvs__now_ms();
    if (x->starts >= STARTS && now - x->started_ms[x->start_next] < START_WIN_MS)
        return KVS_ENOSPC;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        return KVS_EINTERNAL;
    int big = 4 << 20;
    for (int i = 0; i < 2; i++) {
        (void)setsockopt(sv[i], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
        (void)setsockopt(sv[i], SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    }
    int fds[3] = {sv[1], x->bfd, x->shared.len ? x->sfd : x->bfd};
    pid_t pid;
    /* quiet: UCX_HANDLE_ERRORS=none unless set, so an abort logs UCX's one
     * assertion line and ours, not a backtrace per attack */
    int rc = kvs__spawn(x->path, x->args, fds, 3, KVS__SPAWN_QUIET | KVS__SPAWN_GROUP, &pid);
    close(sv[1]);
    x->started_ms[x->start_next] = now;
    x->start_next = (x->start_next + 1) % STARTS;
    x->starts++;
    if (rc != 0) {
        close(sv[0]);
        return rc;
    }
    kvs__xp_msg *m;
    uint8_t *tail;
    struct pollfd pf = {.fd = sv[0], .events = POLLIN};
    rc = KVS_EUNAVAIL;
    if (poll(&pf, 1, HELLO_MS) == 1 && kvs__xp_recv(sv[0], x->rbuf, &m, &tail) == 1 &&
        m->type == KVS__XP_HELLO && m->n >= 8 && m->n <= KVS__XP_ADDR_MAX) {
        void *addr = malloc(m->n);
        xp_link *l = calloc(1, sizeof *l);
        if (addr && l) {
            memcpy(addr, tail, m->n);
            kvs__xp_conn_init(&l->c, sv[0]);
            l->c.send_ms = CALL_MS; /* a wedged child must not hold our threads */
            l->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
            l->refs = 1; /* x->link's */
            pthread_mutex_lock(&x->mu);
            if (x->addr) {
                free(x->old_addrs[x->old_next]);
                x->old_addrs[x->old_next] = x->addr;
                x->old_next = (x->old_next + 1) % OLD_ADDRS;
            }
            x->addr = addr;
            x->alen = m->n;
            x->link = l;
            x->pid = pid;
            /* destroy began while this child started: its shutdown found no
             * link to wake the reader with, so this one ends at once (the
             * reader would read it for good) */
            if (x->stopping)
                shutdown(sv[0], SHUT_RDWR);
            pthread_mutex_unlock(&x->mu);
            return 0;
        }
        free(addr);
        free(l);
        rc = KVS_ENOMEM;
    }
    close(sv[0]);
    reap(pid, 0);
    return rc;
}

/* The counters of st (not its gauges) added to acc, saturating: a child's
 * figures are its word, and a sum that wrapped would send them back. */
static void stats_add(kvs_xfer_server_stats *acc, const kvs_xfer_server_stats *st)
{
#define ADD(f) acc->f = acc->f + st->f < acc->f ? UINT64_MAX : acc->f + st->f
    ADD(fetch_requests);
    ADD(blocks_sent);
    ADD(bytes_sent);
    ADD(blocks_failed);
    ADD(puts);
    ADD(bytes_received);
    ADD(auth_failures);
    ADD(proto_errors);
    ADD(peer_failures);
    ADD(timeouts);
    ADD(orphans);
    ADD(puts_refused);
    ADD(addr_checks);
    ADD(addr_rejected);
    ADD(addr_check_crashes);
    ADD(addr_check_spawns);
    ADD(addr_check_busy);
#undef ADD
}

/* last = st, but no counter of last goes back: answers to concurrent stats
 * calls can arrive out of order (the child answers on several threads). */
static void stats_newer(kvs_xfer_server_stats *last, const kvs_xfer_server_stats *st)
{
    kvs_xfer_server_stats a = *last;
    *last = *st;
#define KEEP(f) last->f = a.f > st->f ? a.f : st->f
    KEEP(fetch_requests);
    KEEP(blocks_sent);
    KEEP(bytes_sent);
    KEEP(blocks_failed);
    KEEP(puts);
    KEEP(bytes_received);
    KEEP(auth_failures);
    KEEP(proto_errors);
    KEEP(peer_failures);
    KEEP(timeouts);
    KEEP(orphans);
    KEEP(puts_refused);
    KEEP(addr_checks);
    KEEP(addr_rejected);
    KEEP(addr_check_crashes);
    KEEP(addr_check_spawns);
    KEEP(addr_check_busy);
#undef KEEP
}

/* The child's socket closed (it died, or we are stopping): every slot and
 * session of it goes, and the process is reaped. */
static void child_gone(kvs__xp *x, xp_link *l)
{
    pthread_mutex_lock(&x->mu);
    pid_t pid = x->pid;
    int stopping = x->stopping;
    x->link = NULL;
    x->pid = 0;
    stats_add(&x->base, &x->last);
    memset(&x->last, 0, sizeof x->last);
    /* Sessions still opening: their session_open fails (ENOSPC). Open ones
     * end below, one by one (a session_close may take one meanwhile). */
    for (size_t i = 0; i < x->nsess;)
        if (!x->sess[i].open)
            x->sess[i] = x->sess[--x->nsess];
        else
            i++;
    pthread_mutex_unlock(&x->mu);
    /* Before its bounce memory is handed out again: a process it started
     * still maps it. Not reaped yet (below), so the group's id is its own. */
    if (!stopping && pid > 0)
        (void)kill(-pid, SIGKILL);
    kvs__xp_conn_fail(&l->c);
    shutdown(l->c.fd, SHUT_RDWR);
    slots_give_back(x, 0); /* no new slot: x->link is no longer l */
    wait_given(x);
    for (;;) {
        pthread_mutex_lock(&x->mu);
        xp_sess e = x->nsess ? x->sess[--x->nsess] : (xp_sess){0};
        pthread_mutex_unlock(&x->mu);
        if (!e.key)
            break;
        if (x->ops.session_end)
            x->ops.session_end(x->ops.ctx, e.data);
    }
    /* Counted once all it held is back: whoever reads the restart in the
     * stats finds its puts ended, its blocks returned, its sessions over. */
    if (!stopping) {
        pthread_mutex_lock(&x->mu);
        x->restarts++;
        pthread_mutex_unlock(&x->mu);
    }
    if (pid > 0)
        reap(pid, 2000);
    if (!stopping)
        KVS_LOG_WARN(MOD,
                     "data plane process %d ended: its sessions are gone (clients fall "
                     "back to gRPC); starting another",
                     (int)pid);
    link_put(x, l); /* x->link's reference */
}

/* The next message from l's child: 1 with *m and *tail, 0 when it has
 * ended: EOF, or its process is gone (a process it started may hold the
 * socket open: its end is seen on the pidfd); -1 for a malformed message. */
static int next_msg(kvs__xp *x, xp_link *l, kvs__xp_msg **m, uint8_t **tail)
{
    for (;;) {
        ssize_t r = recv(l->c.fd, x->rbuf, sizeof(kvs__xp_msg) + KVS__XP_TAIL_MAX, MSG_DONTWAIT);
        if (r >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return kvs__xp_parse(x->rbuf, r, m, tail);
        if (errno == EINTR)
            continue;
        struct pollfd pf[2] = {{.fd = l->c.fd, .events = POLLIN},
                               {.fd = l->pidfd, .events = POLLIN}};
        if (poll(pf, l->pidfd >= 0 ? 2 : 1, -1) < 0 && errno != EINTR)
            return 0;
        if (l->pidfd >= 0 && (pf[1].revents & POLLIN))
            return 0; /* exited: what it sent last changes nothing */
    }
}

static void *reader_main(void *arg)
{
    kvs__xp *x = arg;
    for (;;) {
        xp_link *l = link_get(x);
        if (!l) {
            pthread_mutex_lock(&x->mu);
            int stop = x->stopping;
            pthread_mutex_unlock(&x->mu);
            if (stop)
                break;
            int rc = child_start(x);
            if (rc == 0 && x->held) {
                KVS_LOG_WARN(MOD, "data plane process started again after %llu ms without one",
                             (unsigned long long)(kvs__now_ms() - x->held));
                x->held = 0;
            } else if (rc != 0 && !x->held) {
                x->held = kvs__now_ms();
                if (rc == KVS_ENOSPC)
                    KVS_LOG_WARN(MOD,
                                 "data plane processes started %u times in %u ms: no "
                                 "UCX until that window passes (Connect answers "
                                 "RESOURCE_EXHAUSTED; gRPC serves)",
                                 STARTS, START_WIN_MS);
                else
                    KVS_LOG_WARN(MOD,
                                 "data plane process cannot start (%s): retrying every "
                                 "200 ms (Connect answers RESOURCE_EXHAUSTED; gRPC serves)",
                                 kvs_strerror(rc));
            }
            if (rc != 0) {
                struct timespec until;
                kvs__deadline_ms(&until, 200);
                pthread_mutex_lock(&x->mu);
                if (!x->stopping)
                    pthread_cond_timedwait(&x->cv, &x->mu, &until);
                pthread_mutex_unlock(&x->mu);
            }
            continue;
        }
        kvs__xp_msg *m;
        uint8_t *tail;
        int r;
        while ((r = next_msg(x, l, &m, &tail)) == 1)
            on_message(x, l, m, tail);
        if (r < 0)
            KVS_LOG_WARN(MOD, "data plane process sent a malformed message: stopping it");
        child_gone(x, l);
        link_put(x, l);
    }
    return NULL;
}

/* ---- kvs_xfer_server's functions -------------------------------------------- */

/* x->sfd: opts.shared's memory, sealed and opened again read-only (the
 * header comment says why). The seals are refused by a memfd made without
 * MFD_ALLOW_SEALING or by a kernel before 5.1: then the child could still
 * write the memory through a reopen while it holds descriptor 5 (it closes
 * it before UCX starts), and we say so. */
static int shared_open(kvs__xp *x)
{
    int fd = x->shared.fd;
    int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE;
    int have = fcntl(fd, F_GET_SEALS);
    if (have < 0 || ((have & seals) != seals && fcntl(fd, F_ADD_SEALS, seals) != 0)) {
        int e = errno;
        /* a kernel before 5.1 knows no F_SEAL_FUTURE_WRITE: keep the size seals */
        if (have >= 0 && e == EINVAL)
            (void)fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
        KVS_LOG_WARN(MOD,
                     "shared memory not sealed against writes (%s): the data plane process "
                     "could reopen it writable",
                     strerror(e));
    }
    char path[48];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    x->sfd = open(path, O_RDONLY | O_CLOEXEC);
    if (x->sfd < 0) {
        KVS_LOG_ERROR(MOD, "reopening the shared memory read-only (%s): %s", path, strerror(errno));
        return KVS_EINTERNAL;
    }
    return 0;
}

int kvs__xp_create(const kvs_xfer_server_opts *o, kvs__xp **out)
{
    /* Both helpers here, so a missing one says so (the child's own check
     * would only end it). */
    if (access(o->isolate, X_OK) != 0 ||
        (o->addr_check && *o->addr_check && access(o->addr_check, X_OK) != 0))
        return KVS_ENOTFOUND;
    kvs__xp *x = calloc(1, sizeof *x);
    if (!x)
        return KVS_ENOMEM;
    x->ops = o->ops;
    x->shared = o->shared;
    x->sfd = -1;
    x->blen = o->bounce_bytes ? o->bounce_bytes : (256ull << 20);
    x->blen = (x->blen + UNIT - 1) / UNIT * UNIT;
    x->bunits = (uint32_t)(x->blen / UNIT);
    x->next_key = 1;
    x->free_slot = UINT32_MAX;
    x->bfd = memfd_create("kvstash-xfer-bounce", MFD_CLOEXEC);
    x->path = strdup(o->isolate);
    x->rbuf = malloc(sizeof(kvs__xp_msg) + KVS__XP_TAIL_MAX);
    x->bused = calloc(x->bunits, 1);
    char *strs[3] = {strdup(o->net_devices ? o->net_devices : ""), strdup(o->tls ? o->tls : ""),
                     strdup(o->addr_check ? o->addr_check : "")};
    if (x->bfd < 0 || !x->path || !x->rbuf || !x->bused || !strs[0] || !strs[1] || !strs[2] ||
        ftruncate(x->bfd, (off_t)x->blen) != 0 ||
        (x->bbase = mmap(NULL, x->blen, PROT_READ | PROT_WRITE, MAP_SHARED, x->bfd, 0)) ==
            MAP_FAILED) {
        x->bbase = NULL;
        for (int i = 0; i < 3; i++)
            free(strs[i]);
        kvs__xp_destroy(x);
        return KVS_ENOMEM;
    }
    if (x->shared.len && shared_open(x) != 0) {
        for (int i = 0; i < 3; i++)
            free(strs[i]);
        kvs__xp_destroy(x);
        return KVS_EINTERNAL;
    }
    /* A wedged address check ends within its wire-up time + 7 s (the
     * helper's alarm), inside the 15 s an OPEN call waits (CALL_MS): else a
     * slow check would have the whole data plane killed as wedged. */
    uint64_t acm = o->addr_check_ms > 6000 ? 6000 : o->addr_check_ms;
    uint64_t v[7] = {o->op_timeout_ms, o->window,    o->min_msg_bytes, o->spin, acm,
                     x->blen,          x->shared.len};
    for (int i = 0; i < 7; i++)
        snprintf(x->nums[i], sizeof x->nums[i], "%llu", (unsigned long long)v[i]);
    char **a = x->args;
    *a++ = x->path;
    *a++ = o->err_mode == KVS_XFER_ERR_PEER ? "peer" : "none";
    for (int i = 0; i < 7; i++)
        *a++ = x->nums[i];
    for (int i = 0; i < 3; i++)
        *a++ = strs[i];
    *a++ = o->ops.put_begin ? "put" : "noput";
    *a = NULL;
    pthread_mutex_init(&x->mu, NULL);
    pthread_mutex_init(&x->bmu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&x->cv, &ca);
    pthread_condattr_destroy(&ca);
    int rc = child_start(x);
    if (rc == 0 && pthread_create(&x->thr, NULL, reader_main, x) != 0)
        rc = KVS_EINTERNAL;
    if (rc != 0) {
        kvs__xp_destroy(x);
        return rc;
    }
    x->thr_started = 1;
    *out = x;
    return 0;
}

int kvs__xp_address(kvs__xp *x, const void **addr, size_t *len)
{
    pthread_mutex_lock(&x->mu);
    *addr = x->addr;
    *len = x->alen;
    pthread_mutex_unlock(&x->mu);
    return *addr ? 0 : KVS_EUNAVAIL;
}

int kvs__xp_session_open(kvs__xp *x, const void *addr, size_t len, void *data,
                         kvs_xfer_session_info *info)
{
    pthread_mutex_lock(&x->mu);
    xp_link *l = x->link;
    if (!l) {
        pthread_mutex_unlock(&x->mu);
        return KVS_ENOSPC; /* restarting */
    }
    if (x->nsess == x->capsess) {
        size_t n = x->capsess ? x->capsess * 2 : 16;
        xp_sess *s = realloc(x->sess, n * sizeof *s);
        if (!s) {
            pthread_mutex_unlock(&x->mu);
            return KVS_ENOMEM;
        }
        x->sess = s;
        x->capsess = n;
    }
    uint64_t key = x->next_key++;
    x->sess[x->nsess++] = (xp_sess){.key = key, .data = data};
    l->refs++;
    pthread_mutex_unlock(&x->mu);
    kvs__xp_msg m = {.type = KVS__XP_OPEN, .a = key}, r;
    uint8_t token[KVS_XFER_TOKEN_LEN];
    int rc = kvs__xp_call(&l->c, &m, addr, (uint32_t)len, &r, token, sizeof token, CALL_MS);
    call_timed_out(x, l, rc);
    if (rc != 0) /* the child ended, or hangs: it is being replaced */
        rc = KVS_ENOSPC;
    else if (r.rc == 0 && r.n != sizeof token)
        rc = KVS_EINTERNAL;
    else
        rc = r.rc > 0 ? KVS_EINTERNAL : r.rc;
    pthread_mutex_lock(&x->mu);
    int found = 0;
    for (size_t i = 0; rc == 0 && i < x->nsess; i++)
        if (x->sess[i].open && x->sess[i].id == r.a)
            rc = KVS_EINTERNAL; /* an id in use: the child is not to be trusted */
    for (size_t i = 0; i < x->nsess; i++) {
        if (x->sess[i].key != key)
            continue;
        found = 1;
        if (rc == 0) {
            x->sess[i].id = r.a;
            x->sess[i].open = 1;
        } else {
            do_sess_drop(x, i); /* data goes back to the caller */
        }
        break;
    }
    pthread_mutex_unlock(&x->mu);
    if (rc == KVS_EINTERNAL && r.rc == 0)
        child_kill(x, l, "gave a new session the id of an open one");
    link_put(x, l);
    if (rc == 0 && !found) /* the child ended meanwhile */
        rc = KVS_ENOSPC;
    if (rc == 0) {
        info->id = r.a;
        memcpy(info->token, token, sizeof token);
    }
    return rc;
}

/* The session leaves the table first (a PROVIDE naming it is refused from
 * then on, and no callback holds its data once that returns), then the child
 * closes it (releasing its blocks), then whatever it did not give back is
 * given back here, and session_end runs on this thread. A session that
 * already ended (closed itself, or its child died) is KVS_ENOTFOUND. */
int kvs__xp_session_close(kvs__xp *x, uint64_t id)
{
    pthread_mutex_lock(&x->mu);
    void *data = NULL;
    uint64_t key = 0;
    for (size_t i = 0; i < x->nsess; i++)
        if (x->sess[i].open && x->sess[i].id == id) {
            data = x->sess[i].data;
            key = x->sess[i].key;
            do_sess_drop(x, i);
            break;
        }
    xp_link *l = key ? x->link : NULL;
    if (l)
        l->refs++;
    pthread_mutex_unlock(&x->mu);
    if (!key)
        return KVS_ENOTFOUND;
    int rc = 0;
    kvs__xp_msg r = {0};
    if (l) {
        kvs__xp_msg m = {.type = KVS__XP_CLOSE, .a = id};
        rc = kvs__xp_call(&l->c, &m, NULL, 0, &r, NULL, 0, CALL_MS);
        call_timed_out(x, l, rc);
        link_put(x, l);
    }
    slots_give_back(x, key);
    wait_given(x); /* a RELEASE of its block the reader is giving back */
    if (x->ops.session_end)
        x->ops.session_end(x->ops.ctx, data);
    /* no answer: the child died or hangs (and is killed), its sessions with it */
    return rc != 0 ? 0 : r.rc > 0 ? KVS_EINTERNAL : r.rc;
}

int kvs__xp_stats(kvs__xp *x, kvs_xfer_server_stats *st)
{
    memset(st, 0, sizeof *st);
    xp_link *l = link_get(x);
    if (l) {
        kvs__xp_msg m = {.type = KVS__XP_STATS}, r;
        kvs_xfer_server_stats c;
        int rc = kvs__xp_call(&l->c, &m, NULL, 0, &r, &c, sizeof c, CALL_MS);
        call_timed_out(x, l, rc);
        int got = rc == 0 && r.n == sizeof c;
        pthread_mutex_lock(&x->mu);
        /* A child that did not answer (dying, wedged) keeps its last snapshot:
         * storing nothing as its last would lose what it counted for good
         * once it is gone, and an answer overtaken by a newer one must not
         * send its counters back. When it ended meanwhile, base holds its last
         * snapshot (adding this answer too would count it twice). */
        if (x->link == l) {
            if (got)
                stats_newer(&x->last, &c);
            *st = x->last;
        }
        pthread_mutex_unlock(&x->mu);
        link_put(x, l);
    }
    pthread_mutex_lock(&x->mu);
    stats_add(st, &x->base);
    /* Ours, not the child's figure: kvstashd's ucx_max_sessions counts on
     * it, and a child's word is worth nothing. */
    st->sessions = 0;
    for (size_t i = 0; i < x->nsess; i++)
        st->sessions += x->sess[i].open != 0;
    st->proc_restarts = x->restarts;
    st->proc_pid = (uint64_t)(x->pid > 0 ? x->pid : 0);
    st->bounce_fails = x->bounce_fails;
    st->bounce_copies = x->bounce_copies;
    st->proc_lent = x->lent;
    st->lend_refused = x->lend_refused;
    pthread_mutex_unlock(&x->mu);
    return 0;
}

void kvs__xp_destroy(kvs__xp *x)
{
    if (!x)
        return;
    if (x->thr_started) {
        pthread_mutex_lock(&x->mu);
        x->stopping = 1;
        if (x->link)
            shutdown(x->link->c.fd, SHUT_RDWR); /* the reader sees EOF */
        pthread_cond_broadcast(&x->cv);
        pthread_mutex_unlock(&x->mu);
        pthread_join(x->thr, NULL);
        /* The store promised to finish every provide_async, put_end_async and
         * put_begin_async. */
        pthread_mutex_lock(&x->mu);
        while (x->pending)
            pthread_cond_wait(&x->cv, &x->mu);
        pthread_mutex_unlock(&x->mu);
        pthread_mutex_destroy(&x->mu);
        pthread_mutex_destroy(&x->bmu);
        pthread_cond_destroy(&x->cv);
    } else if (x->link) { /* create failed after the child started */
        x->stopping = 1;
        child_gone(x, x->link);
    }
    if (x->bbase)
        munmap(x->bbase, x->blen);
    if (x->bfd >= 0)
        close(x->bfd);
    if (x->sfd >= 0)
        close(x->sfd);
    for (unsigned i = 0; i < OLD_ADDRS; i++)
        free(x->old_addrs[i]);
    free(x->addr);
    if (x->args[0])
        for (int i = 9; i < 12; i++)
            free(x->args[i]);
    free(x->path);
    free(x->rbuf);
    free(x->bused);
    free(x->sess);
    free(x->slots);
    free(x);
}
