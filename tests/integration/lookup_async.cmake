# kvs_client_lookup_async (and the synchronous Lookup it shares code with)
# against a real kvstashd: same answers as kvs_client_lookup, many calls
# outstanding, a closed loop from the callbacks, errors, close with calls
# in flight.
if(TARGET kvstashd)
  kvs_add_cunit_test(NAME test_data_lookup_async
    SOURCES test_data_lookup_async.c kvs_server_proc.c kvs_itest.c
    LIBS kvstash PkgConfig::GRPC Threads::Threads
    LABELS integration
    ARGS $<TARGET_FILE:kvstashd>
    TIMEOUT 120)
  target_include_directories(test_data_lookup_async PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
endif()
# The same against kvstashd --threads 1: no non-polling queue, one worker
# serves every method (server.c); the stop must find no call left over.
if(TARGET test_data_lookup_async)
  add_test(NAME test_data_lookup_async_threads1
           COMMAND test_data_lookup_async $<TARGET_FILE:kvstashd> 1)
  set_tests_properties(test_data_lookup_async_threads1 PROPERTIES TIMEOUT 120
                       LABELS integration)
endif()
# ThreadSanitizer builds: libgrpc is not instrumented (tsan_grpc.supp; the
# client annotates its completion hand-off, client_int.h), and UCX's memory
# hooks (libucm's madvise at thread exit) crash under TSan, so they are off.
if(KVS_SANITIZE STREQUAL "thread" AND TARGET test_data_lookup_async)
  set_tests_properties(test_data_lookup_async test_data_lookup_async_threads1 PROPERTIES
    ENVIRONMENT "UCX_MEM_EVENTS=no;TSAN_OPTIONS=suppressions=${CMAKE_CURRENT_SOURCE_DIR}/tsan_grpc.supp halt_on_error=1")
endif()
