# The data path end to end (C): Lookup, Put, Get, Delete, Pin, Unpin, tenants,
# limits, cancellation, 16 concurrent clients — against a real kvstashd.
if(TARGET kvstashd)
  kvs_add_cunit_test(NAME test_data
    SOURCES test_data.c kvs_server_proc.c kvs_itest.c
    LIBS kvstash kvs_proto kvs_kernels kvs_store PkgConfig::GRPC Threads::Threads m
    LABELS integration
    ARGS $<TARGET_FILE:kvstashd>
    TIMEOUT 180)
  target_include_directories(test_data PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
endif()
