/*
 * leases.h — which tenant owns which Lookup lease.
 *
 * The store numbers leases but does not know tenants' rights over them; the
 * service records the owner of every lease it hands out so that Get and
 * Unpin release only the caller's own leases (a lease id from another
 * tenant is "unknown", as an expired one is).
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

/* Records lease id (non-zero) of tenant, valid for ttl_ms from now. 0 or KVS_ENOMEM. */
int kvs_lease_reg_add(kvs_lease_reg *r, uint64_t id, uint16_t tenant, uint32_t ttl_ms);

/* 1 and forgets the lease when id is a live lease of tenant; 0 otherwise. */
int kvs_lease_reg_take(kvs_lease_reg *r, uint64_t id, uint16_t tenant);

/* Leases recorded and not yet taken or pruned (expired ones may linger). */
uint64_t kvs_lease_reg_count(kvs_lease_reg *r);

#endif /* KVS_LEASES_H */
