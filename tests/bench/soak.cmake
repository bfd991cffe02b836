# soak_bench: resident memory of kvstashd, kvstash-xferd and a libkvstash client over a
# long run of UCX fetches and puts (every block by rendezvous), then of gRPC Get and Put as
# the baseline, same run; growth as KiB per 10,000 ops (UCX 1.13's AM-rendezvous leak); then
# a churn of UCX sessions opened and closed, with workers SIGKILLed mid-fetch.
# Not a ctest: run by hand, `SOAK_SECONDS=120 UCX_TLS=tcp soak_bench $(pwd)/service/kvstashd`;
# its last line is `RESULT ucx_xferd_kib_per_10k=.. ucx_kvstashd_kib_per_10k=..
# ucx_client_kib_per_10k=.. grpc_kvstashd_kib_per_10k=..` (docs/BENCHMARKS.md, "Data
# plane: soak").
if(TARGET kvstashd AND TARGET kvs_transfer)
  # the churn's dying worker: tests/support/kvs_dying_worker.c (on the calling thread here;
  # it needs kvs_itest.c and what that links all the same)
  add_executable(soak_bench ${CMAKE_CURRENT_SOURCE_DIR}/soak_bench.c ${CMAKE_CURRENT_SOURCE_DIR}/bench_chain.c
                 ${PROJECT_SOURCE_DIR}/tests/integration/kvs_server_proc.c
                 ${PROJECT_SOURCE_DIR}/tests/integration/kvs_itest.c
                 ${PROJECT_SOURCE_DIR}/tests/support/kvs_dying_worker.c)
  target_include_directories(soak_bench PRIVATE ${PROJECT_SOURCE_DIR}/tests/integration)
  target_link_libraries(soak_bench PRIVATE kvstash kvs_transfer kvs_proto kvs_test_support
                        PkgConfig::GRPC Threads::Threads)
endif()
