# Decoding tiles whose checksums our own code has just verified
# (kvs_block_decode_run_verified, kvs_tile_check_verified, the _verified dequantizers,
# kvs_block_decode_layer's one check per tile): the full path's bytes, only the checksum
# skipped. Included by tests/unit/CMakeLists.txt.
kvs_add_cunit_test(NAME test_kv_block_verified SOURCES test_kv_block_verified.c
                   LIBS kvs_kernels m LABELS unit)
