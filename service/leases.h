/*
 * leases.h — which tenant owns which Lookup lease.
 *
 * The store numbers leases but does not know tenants' rights over them; the
 * service records the owner of every lease it hands out so that Get and
 * Unpin release only the caller's own leases (a lease id from another
 * tenant is "unknown", as an expired one is).
 *
 * It also bounds what one tenant's leases hold (kvs_lease_reg_add's
 * max_blocks).
 *
 * Thread-safe (one mutex). Entries go when taken or, lazily, once expired.
 */
#ifndef KVS_LEASES_H
#define KVS_LEASES_H

#include <stdint.h>

typedef struct kvs_lease_reg kvs_lease_reg;

/* 0 or KVS_ENOMEM. */
int kvs_lease_reg_open(kvs_lease_reg **out);
void kvs_lease_reg_close(kvs_lease_reg *r);

/* Records lease id (non-zero) of tenant, holding blocks blocks, valid for
 * ttl_ms from now. 0; KVS_ENOSPC (nothing recorded; *held, when not NULL,
 * gets what the tenant's leases hold) when the tenant's live leases would
 * then hold more than max_blocks blocks: one tenant must not take the
 * store's holds (a fixed number for all tenants) from the others;
 * KVS_ENOMEM. */
int kvs_lease_reg_add(kvs_lease_reg *r, uint64_t id, uint16_t tenant, uint32_t ttl_ms,
                      uint32_t blocks, uint64_t max_blocks, uint64_t *held);

/* Blocks held by tenant's live leases (after pruning expired ones). */
uint64_t kvs_lease_reg_held(kvs_lease_reg *r, uint16_t tenant);

/* 1 and forgets the lease when id is a live lease of tenant; 0 otherwise. */
int kvs_lease_reg_take(kvs_lease_reg *r, uint64_t id, uint16_t tenant);

/* Leases recorded and not yet taken or pruned (expired ones may linger). */
uint64_t kvs_lease_reg_count(kvs_lease_reg *r);

#endif /* KVS_LEASES_H */
