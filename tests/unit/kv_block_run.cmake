# kvs_block_decode_run (kernels/block/kv_block.h): one layer's K or V tiles cut out of a
# block, as a Get in the stored format sends them, decode to kvs_block_decode_layer's
# bytes; hostile runs are refused. Included by tests/unit/CMakeLists.txt.
kvs_add_cunit_test(NAME test_kv_block_run SOURCES test_kv_block_run.c LIBS kvs_kernels m
                   LABELS unit)
