# kvs_store_lookup_leased_info (store/payload.c): kvstashd's Lookup in one store call —
# same matches and lease as lookup_leased, payload heads, SSD blocks, tenants, and
# accesses counted once (eviction order equals the plain lookup's under every policy).
# Label tsan: tests/run-all.sh's ThreadSanitizer build runs it (its threads case) too.
kvs_add_cunit_test(NAME test_store_lookup_info SOURCES test_store_lookup_info.c LIBS kvs_store
                   Threads::Threads LABELS "unit;tsan")
