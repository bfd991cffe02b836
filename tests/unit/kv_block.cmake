# KV blocks (kernels/block/kv_block.h): layout, round trips, streaming decode, egress
# requantization, hostile blocks. Included by tests/unit/CMakeLists.txt.
kvs_add_cunit_test(NAME test_kv_block SOURCES test_kv_block.c LIBS kvs_kernels m LABELS unit)
