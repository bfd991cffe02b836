# The index's hash table and token slots (store/index.c): growth, churn with
# tombstones, deletes, keys sharing a home slot and tag, token ids of many lengths,
# and 20 lookup threads (more than the 16 read stripes) beside two writers. Label tsan:
# the ThreadSanitizer build runs it too (the read stripes and the writer flag).
kvs_add_cunit_test(NAME test_store_table SOURCES test_store_table.c LIBS kvs_store Threads::Threads
                   LABELS "unit;tsan")
