# putmac_bench: what the seal of a UCX put costs per byte (kvs_putmac_seal on the worker,
# kvs_putmac_verify in kvstashd) against memcpy of the same bytes and against
# HMAC-SHA256 (the design the eighth session wrote down), in the same run. Validates
# first. A program, not a ctest: build/tests/bench/putmac_bench [--reps N]
pkg_check_modules(PUTMAC_BENCH_CRYPTO REQUIRED IMPORTED_TARGET libcrypto)
add_executable(putmac_bench putmac_bench.c)
target_link_libraries(putmac_bench PRIVATE kvs_putmac PkgConfig::PUTMAC_BENCH_CRYPTO m)
