# The UCX data plane wired into kvstashd and libkvstash (I): Connect, kvs_client_fetch over
# UCX compared with gRPC Get, tenant isolation, --ucx off fallback, bad Connect payloads.
#   test_connect      UCX_TLS=tcp
#   test_connect_shm  UCX_TLS=posix,self with UCX_MM_ERROR_HANDLING=y (shared memory under
#                     peer error handling; no cma, so no ptrace rights needed)
#   test_connect_inprocess  UCX_TLS=tcp, ucx_isolate = off (UCX inside kvstashd)
if(NOT TARGET kvstashd OR NOT TARGET kvs_transfer)
  return()
endif()
kvs_add_cunit_test(NAME test_connect
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_connect.c ${CMAKE_CURRENT_LIST_DIR}/kvs_server_proc.c
          ${CMAKE_CURRENT_LIST_DIR}/kvs_itest.c
          ${PROJECT_SOURCE_DIR}/tests/support/kvs_dying_worker.c
  LIBS kvstash kvs_transfer kvs_putmac kvs_proto PkgConfig::GRPC Threads::Threads
  LABELS "integration;xfer"
  ARGS $<TARGET_FILE:kvstashd>
  TIMEOUT 180)
target_include_directories(test_connect PRIVATE ${CMAKE_CURRENT_LIST_DIR})
# the "hostile" suite runs kvstashd with this test build as its data plane process
add_dependencies(test_connect kvstash-xferd-hostile)
set_tests_properties(test_connect PROPERTIES ENVIRONMENT "UCX_TLS=tcp")
add_test(NAME test_connect_shm COMMAND test_connect $<TARGET_FILE:kvstashd>)
set_tests_properties(test_connect_shm PROPERTIES TIMEOUT 180 LABELS "integration;xfer"
  ENVIRONMENT "UCX_TLS=posix,self;UCX_MM_ERROR_HANDLING=y")
# decoder_ucx: kvstash-decoder --ucx (kvs_client_fetch) gives the gRPC run's exact figures,
# and its blocks came over UCX (tests/integration/decoder_ucx.sh).
if(TARGET kvstash_decoder AND TARGET kvstash_cli)
  add_test(NAME decoder_ucx
    COMMAND /bin/sh ${CMAKE_CURRENT_LIST_DIR}/decoder_ucx.sh $<TARGET_FILE:kvstash_decoder>
            $<TARGET_FILE:kvstashd> $<TARGET_FILE:kvstash_cli> ${PROJECT_SOURCE_DIR}/models)
  set_tests_properties(decoder_ucx PROPERTIES LABELS "integration;xfer" TIMEOUT 300
    SKIP_RETURN_CODE 77 FAIL_REGULAR_EXPRESSION "not ok - " ENVIRONMENT "UCX_TLS=tcp")
endif()
# ucx_users: on one host UCX shared memory works only for a worker under kvstashd's user;
# another user's Connect is refused with the reason and its blocks come over gRPC
# (tests/integration/ucx_users.sh; root only, 77 otherwise).
if(TARGET kvstash_decoder AND TARGET kvstash_cli)
  add_test(NAME ucx_users
    COMMAND /bin/sh ${CMAKE_CURRENT_LIST_DIR}/ucx_users.sh $<TARGET_FILE:kvstash_decoder>
            $<TARGET_FILE:kvstashd> $<TARGET_FILE:kvstash_cli> ${PROJECT_SOURCE_DIR}/models)
  set_tests_properties(ucx_users PROPERTIES LABELS "integration;xfer" TIMEOUT 300
    SKIP_RETURN_CODE 77 FAIL_REGULAR_EXPRESSION "not ok - ")
endif()
# The same tests with UCX inside kvstashd (ucx_isolate = off; the default runs it in
# kvstash-xferd, transfer/xproc.c).
add_test(NAME test_connect_inprocess COMMAND test_connect $<TARGET_FILE:kvstashd>)
set_tests_properties(test_connect_inprocess PROPERTIES TIMEOUT 180 LABELS "integration;xfer"
  ENVIRONMENT "UCX_TLS=tcp;KVS_TEST_UCX_ISOLATE=off")
# The same tests with kvstashd rendering egress formats on its ingest pool
# (KVS_UCX_RENDER_POOL=1: provide_async in service/data_connect.c), and ending
# every UCX put on the thread that serves the data plane (KVS_UCX_PUT_END_MAX=1: no
# staged bytes may wait for a put-end thread).
add_test(NAME test_connect_render_pool COMMAND test_connect $<TARGET_FILE:kvstashd>)
set_tests_properties(test_connect_render_pool PROPERTIES TIMEOUT 180 LABELS "integration;xfer"
  ENVIRONMENT "UCX_TLS=tcp;KVS_UCX_RENDER_POOL=1;KVS_UCX_PUT_END_MAX=1")
# ThreadSanitizer builds (as lookup_async.cmake): libgrpc is not instrumented, so its
# reports are suppressed (tsan_grpc.supp), and UCX's memory hooks are off. Without them a
# TSan run of these tests drowns in gRPC reports and misses their deadlines.
if(KVS_SANITIZE STREQUAL "thread")
  foreach(t test_connect test_connect_shm test_connect_inprocess test_connect_render_pool)
    if(TEST ${t})
      set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT "UCX_MEM_EVENTS=no"
        "TSAN_OPTIONS=suppressions=${CMAKE_CURRENT_LIST_DIR}/tsan_grpc.supp halt_on_error=1")
    endif()
  endforeach()
endif()
