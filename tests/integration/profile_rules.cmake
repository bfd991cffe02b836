# A model rule's calibration profile (profile = PATH): the per-tensor scales a Put
# takes from it (stored tiles inspected), a namespace of another shape, a bad
# profile at start and in SetConfig — against a real kvstashd.
if(TARGET kvstashd)
  kvs_add_cunit_test(NAME test_profile_rules
    SOURCES test_profile_rules.c kvs_server_proc.c kvs_itest.c
    LIBS kvstash kvs_kernels PkgConfig::GRPC Threads::Threads m
    LABELS integration
    ARGS $<TARGET_FILE:kvstashd>
    TIMEOUT 120)
  target_include_directories(test_profile_rules PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
endif()
