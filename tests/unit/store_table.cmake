# The index's hash table and token slots (store/index.c): growth, churn with
# tombstones, deletes, keys sharing a home slot and tag, token ids of many lengths.
kvs_add_cunit_test(NAME test_store_table SOURCES test_store_table.c LIBS kvs_store LABELS unit)
