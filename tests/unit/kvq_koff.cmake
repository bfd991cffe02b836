# Per-channel key offsets (kv_format.h rule 5): the trimmed-midrange rule, the reference
# tile codec with offsets, hostile and forged offset tiles, blocks that carry them.
# Included by tests/unit/CMakeLists.txt.
kvs_add_cunit_test(NAME test_kvq_koff SOURCES test_kvq_koff.c LIBS kvs_kernels m LABELS unit)
