# A corrupt block fetched over UCX by libkvstash with client-side decode (kvs_client_fetch
# in fp16): a tile flipped in kvstashd's memory tier (sent as is, refused by the client's
# check) and flipped SSD files (refused and dropped by kvstashd). KVS_EFORMAT / DATA_LOSS,
# only the good layers handed on, no gRPC fallback, the session still up.
#   test_connect_faults      UCX_TLS=tcp
#   test_connect_faults_shm  UCX_TLS=posix,self with UCX_MM_ERROR_HANDLING=y
if(NOT TARGET kvstashd OR NOT TARGET kvs_transfer)
  return()
endif()
kvs_add_cunit_test(NAME test_connect_faults
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_connect_faults.c
          ${CMAKE_CURRENT_LIST_DIR}/kvs_server_proc.c ${CMAKE_CURRENT_LIST_DIR}/kvs_itest.c
  LIBS kvstash PkgConfig::GRPC Threads::Threads
  LABELS "integration;xfer"
  ARGS $<TARGET_FILE:kvstashd>
  TIMEOUT 180)
target_include_directories(test_connect_faults PRIVATE ${CMAKE_CURRENT_LIST_DIR})
set_tests_properties(test_connect_faults PROPERTIES ENVIRONMENT "UCX_TLS=tcp")
add_test(NAME test_connect_faults_shm COMMAND test_connect_faults $<TARGET_FILE:kvstashd>)
set_tests_properties(test_connect_faults_shm PROPERTIES TIMEOUT 180 LABELS "integration;xfer"
  ENVIRONMENT "UCX_TLS=posix,self;UCX_MM_ERROR_HANDLING=y")
