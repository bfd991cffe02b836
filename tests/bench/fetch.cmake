# fetch_bench: libkvstash kvs_client_fetch over UCX vs kvs_client_get over gRPC, same
# kvstashd and blocks, same run (stored, fp16, fp32 egress). Not a ctest: run by hand,
# `UCX_TLS=tcp fetch_bench $(pwd)/service/kvstashd`; it starts and stops the server.
if(TARGET kvstashd AND TARGET kvs_transfer)
  add_executable(fetch_bench ${CMAKE_CURRENT_SOURCE_DIR}/fetch_bench.c ${CMAKE_CURRENT_SOURCE_DIR}/bench_chain.c
                 ${PROJECT_SOURCE_DIR}/tests/integration/kvs_server_proc.c)
  target_include_directories(fetch_bench PRIVATE ${PROJECT_SOURCE_DIR}/tests/integration)
  target_link_libraries(fetch_bench PRIVATE kvstash Threads::Threads)
endif()
