# kvs_client_get_into against kvs_client_get for every fixed-size egress
# format, with layers large enough for the in-place unpack — real kvstashd.
if(TARGET kvstashd)
  kvs_add_cunit_test(NAME test_data_get_into
    SOURCES test_data_get_into.c kvs_server_proc.c kvs_itest.c
    LIBS kvstash kvs_proto PkgConfig::GRPC Threads::Threads
    LABELS integration
    ARGS $<TARGET_FILE:kvstashd>
    TIMEOUT 120)
  target_include_directories(test_data_get_into PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
endif()
