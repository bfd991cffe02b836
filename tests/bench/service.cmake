# service_bench: kvstashd over gRPC on loopback against redis-server on loopback
# (Lookup QPS/latency at 1, 4, 16 clients; Put/Get MB/s and KV tokens/s vs Redis
# SET/GET; --fetch-only: kvs_client_fetch over UCX, stored vs decoded to fp16, vs Redis GET).
# Not a ctest: run by hand, `service_bench $(pwd)/service/kvstashd`;
# it starts and stops both servers itself. Needs libhiredis-dev.
pkg_check_modules(HIREDIS IMPORTED_TARGET hiredis)
if(HIREDIS_FOUND AND TARGET kvstashd)
  add_executable(service_bench ${CMAKE_CURRENT_SOURCE_DIR}/service_bench.c)
  target_link_libraries(service_bench PRIVATE kvstash PkgConfig::HIREDIS Threads::Threads m)
else()
  message(STATUS "hiredis not found: service_bench not built (apt-get install libhiredis-dev)")
endif()
