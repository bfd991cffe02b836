# xfer_connect_bench: what the UCX address check (xfer.h opts.addr_check, the
# kvstash-ucx-addrcheck helper) costs a Connect (session_open alone, and open + connect +
# first fetch, check off/on alternating, tcp and shm), and what it lets through (mutants of a
# real client's worker address offered to a server child; server deaths recorded). Not a
# ctest: run by hand, `xfer_connect_bench [--clients 40] [--rounds 6] [--mutants 300]
# [--seed 7]`; its last line is `RESULT check_ms_tcp=.. check_ms_shm=.. connect_ratio_tcp=..
# connect_ratio_shm=.. mutants=.. check_killed=.. ucx_refused=.. accepted=.. server_deaths=..`
# (docs/BENCHMARKS.md, "Connect: the address check").
if(TARGET kvs_transfer AND TARGET kvstash-ucx-addrcheck)
  add_executable(xfer_connect_bench ${CMAKE_CURRENT_LIST_DIR}/xfer_connect_bench.c)
  target_link_libraries(xfer_connect_bench PRIVATE kvs_transfer kvs_kernels Threads::Threads m)
  target_compile_definitions(xfer_connect_bench PRIVATE
    KVS_BENCH_ADDRCHECK="$<TARGET_FILE:kvstash-ucx-addrcheck>")
  add_dependencies(xfer_connect_bench kvstash-ucx-addrcheck)
endif()
