# The reference tile codec and the validation of untrusted tiles (kernels/ref/kvq_ref.c,
# kernels/kvq_tile.c): golden bytes, round trips, hostile tiles. Included by
# tests/unit/CMakeLists.txt.
kvs_add_cunit_test(NAME test_kvq_tile SOURCES test_kvq_tile.c LIBS kvs_kernels m LABELS unit)
