# Per-channel key offsets (kv_format.h rule 5) in a real kvstashd (C): the
# key_offsets setting, a model rule's key_offsets and SetConfig decide which
# Puts (gRPC, and UCX where the build has it) store KVS_BLOCK_F_KOFF blocks;
# every egress format decodes them as kernels/block does.
if(TARGET kvstashd)
  kvs_add_cunit_test(NAME test_data_koff
    SOURCES test_data_koff.c kvs_server_proc.c kvs_itest.c
    LIBS kvstash kvs_kernels kvs_proto PkgConfig::GRPC Threads::Threads
    LABELS integration
    ARGS $<TARGET_FILE:kvstashd>
    TIMEOUT 120)
  target_include_directories(test_data_koff PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  if(TARGET kvs_transfer)
    target_compile_definitions(test_data_koff PRIVATE KVS_TEST_UCX=1)
    set_tests_properties(test_data_koff PROPERTIES ENVIRONMENT "UCX_TLS=tcp")
  endif()
endif()
