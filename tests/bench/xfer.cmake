# xfer_bench: UCX data-plane fetch bandwidth vs ucx_perftest -t ucp_am_bw (same size, same
# transport, same run), KV tokens/s, time to the first layer, Redis GET of the same bytes.
# Not a ctest: run by hand, `xfer_bench [--sizes 0.5,4,32] [--reps 5] [--err peer|none]`;
# its last line is `RESULT shm_ratio=.. tcp_ratio=.. vs_redis_tokens=..` (docs/BENCHMARKS.md).
# Redis needs libhiredis (pkg-config hiredis); without it the Redis figure is skipped (nan).
if(TARGET kvs_transfer)
  add_executable(xfer_bench ${CMAKE_CURRENT_LIST_DIR}/xfer_bench.c)
  target_link_libraries(xfer_bench PRIVATE kvs_transfer kvs_kernels Threads::Threads m)
  # XFER_BENCH_ISOLATE=shared|bounce runs the server's UCX in this build's kvstash-xferd.
  target_compile_definitions(xfer_bench PRIVATE KVS_BENCH_XFERD="$<TARGET_FILE:kvstash-xferd>")
  add_dependencies(xfer_bench kvstash-xferd)
  pkg_check_modules(XFER_HIREDIS QUIET IMPORTED_TARGET hiredis)
  if(XFER_HIREDIS_FOUND)
    target_link_libraries(xfer_bench PRIVATE PkgConfig::XFER_HIREDIS)
    target_compile_definitions(xfer_bench PRIVATE KVS_HAVE_HIREDIS)
  else()
    message(STATUS "xfer_bench: libhiredis not found, the Redis comparison is skipped")
  endif()
endif()
