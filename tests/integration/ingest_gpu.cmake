# Quantize on ingest on the GPU (service/codec.c KVS_CODEC_GPU, --ingest-backend gpu):
# the blocks equal the CPU's byte for byte, in-process and through a real kvstashd.
# Only in CUDA builds; exits 77 (skipped) without a usable GPU, after checking that
# kvstashd --ingest-backend gpu then refuses to start. tests/gpu/run.sh runs it too.
if(KVS_CUDA_ENABLED AND TARGET kvstashd)
  kvs_add_cunit_test(NAME test_ingest_gpu
    SOURCES test_ingest_gpu.c kvs_server_proc.c kvs_itest.c
    LIBS kvstash kvs_service PkgConfig::GRPC Threads::Threads m
    LABELS "integration;gpu"
    ARGS $<TARGET_FILE:kvstashd>
    TIMEOUT 300)
  target_include_directories(test_ingest_gpu PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}
                             ${PROJECT_SOURCE_DIR}/tests/gpu)
endif()
