# Client-side decode (kvstash.h kvs_decode_at): fp16/bf16/fp32 Gets decoded by
# libkvstash from the stored tiles equal the server's rendering byte for byte —
# real kvstashd — and a corrupt stored tile is KVS_EFORMAT (a replaying fake server).
if(TARGET kvstashd)
  kvs_add_cunit_test(NAME test_data_decode
    SOURCES test_data_decode.c kvs_server_proc.c kvs_itest.c
    LIBS kvstash kvs_proto PkgConfig::GRPC Threads::Threads
    LABELS integration
    ARGS $<TARGET_FILE:kvstashd>
    TIMEOUT 120)
  target_include_directories(test_data_decode PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
endif()
