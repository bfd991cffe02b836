# decode_verified_bench: CPU per byte of decoding a stored int8 block to fp16 with each
# tile checked in full vs with the checksum skipped where our own code has just verified
# it (kv_block.h: kvs_block_decode_run_verified, kvs_block_decode_layer's one check per
# tile). Validates before timing that every way writes the bytes of the plain C
# reference (kernels/ref/, tile by tile). A program, not a ctest:
# build/tests/bench/decode_verified_bench [--reps N] [--layers L] [--heads H]
add_executable(decode_verified_bench decode_verified_bench.c)
target_link_libraries(decode_verified_bench PRIVATE kvs_kernels m)
