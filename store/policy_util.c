/*
 * policy_util.c — the heap and list that the eviction policies share.
 *
 * Both store entry ids (u32) and keep their links inside the entries (plink),
 * so a policy costs no allocation per block except the heap's id array.
 * Heap order: smaller pkey first, then older last_access — every heap policy
 * breaks ties towards LRU. Growth failure of the heap array aborts: a policy
 * that silently forgot a candidate would break the capacity invariant.
 */
#include "policy.h"

#include "kvs_error.h"

#include <stdlib.h>

static int less(const kvs__entry *E, uint32_t a, uint32_t b)
{
    if (E[a].pkey != E[b].pkey)
        return E[a].pkey < E[b].pkey;
    if (E[a].last_access != E[b].last_access)
        return E[a].last_access < E[b].last_access;
    return a < b;
}

static void place(kvs__heap *h, kvs__entry *E, uint32_t i, uint32_t e)
{
    h->a[i] = e;
    E[e].plink[0] = i;
}

static void sift_up(kvs__heap *h, kvs__entry *E, uint32_t i)
{
    uint32_t e = h->a[i];
    while (i > 0) {
        uint32_t p = (i - 1) / 2;
        if (!less(E, e, h->a[p]))
            break;
        place(h, E, i, h->a[p]);
        i = p;
    }
    place(h, E, i, e);
}

static void sift_down(kvs__heap *h, kvs__entry *E, uint32_t i)
{
    uint32_t e = h->a[i];
    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && less(E, h->a[c + 1], h->a[c]))
            c++;
        if (!less(E, h->a[c], e))
            break;
        place(h, E, i, h->a[c]);
        i = c;
    }
    place(h, E, i, e);
}

int kvs__heap_push(kvs__heap *h, kvs__entry *E, uint32_t e)
{
    if (h->n == h->cap) {
        uint32_t nc = h->cap ? h->cap * 2 : 1024;
        uint32_t *na = realloc(h->a, (size_t)nc * sizeof *na);
        KVS_ASSERT(na != NULL);
        h->a = na;
        h->cap = nc;
    }
    h->a[h->n] = e;
    E[e].plink[0] = h->n;
    sift_up(h, E, h->n++);
    return 0;
}

void kvs__heap_del(kvs__heap *h, kvs__entry *E, uint32_t e)
{
    uint32_t i = E[e].plink[0];
    KVS_ASSERT(i < h->n && h->a[i] == e);
    uint32_t last = h->a[--h->n];
    E[e].plink[0] = KVS__NIL;
    if (i == h->n)
        return;
    place(h, E, i, last);
    sift_up(h, E, i);
    sift_down(h, E, E[last].plink[0]);
}

void kvs__heap_fix(kvs__heap *h, kvs__entry *E, uint32_t e)
{
    uint32_t i = E[e].plink[0];
    KVS_ASSERT(i < h->n && h->a[i] == e);
    sift_up(h, E, i);
    sift_down(h, E, E[e].plink[0]);
}

void kvs__heap_free(kvs__heap *h)
{
    free(h->a);
    h->a = NULL;
    h->n = h->cap = 0;
}

void kvs__list_init(kvs__list *l)
{
    l->head = l->tail = KVS__NIL;
    l->n = 0;
}

void kvs__list_push_head(kvs__list *l, kvs__entry *E, uint32_t e)
{
    E[e].plink[0] = KVS__NIL;
    E[e].plink[1] = l->head;
    if (l->head != KVS__NIL)
        E[l->head].plink[0] = e;
    else
        l->tail = e;
    l->head = e;
    l->n++;
}

void kvs__list_push_tail(kvs__list *l, kvs__entry *E, uint32_t e)
{
    E[e].plink[1] = KVS__NIL;
    E[e].plink[0] = l->tail;
    if (l->tail != KVS__NIL)
        E[l->tail].plink[1] = e;
    else
        l->head = e;
    l->tail = e;
    l->n++;
}

void kvs__list_del(kvs__list *l, kvs__entry *E, uint32_t e)
{
    uint32_t p = E[e].plink[0], n = E[e].plink[1];
    if (p != KVS__NIL)
        E[p].plink[1] = n;
    else
        l->head = n;
    if (n != KVS__NIL)
        E[n].plink[0] = p;
    else
        l->tail = p;
    E[e].plink[0] = E[e].plink[1] = KVS__NIL;
    l->n--;
}
