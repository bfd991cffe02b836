# kvs_store_prefault (prefault_memory): the arena is faulted in, no byte changes.
kvs_add_cunit_test(NAME test_store_prefault SOURCES test_store_prefault.c LIBS kvs_store
                   LABELS unit)
