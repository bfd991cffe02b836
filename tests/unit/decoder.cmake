# clients/decoder: checkpoint validation, the forward pass against
# stories260K.reference.txt, the paged KV cache, reused blocks, the workload driver and
# KV sample files (tests/unit/test_decoder.c). KVS_MODEL_DIR holds stories260K.bin and
# its reference outputs (models/ in the repository by default);
# without them the test reports "skipped", not "passed".
if(TARGET kvs_decoder)
  set(KVS_MODEL_DIR "${PROJECT_SOURCE_DIR}/models" CACHE PATH
      "Folder with stories260K.bin and stories260K.reference.txt")
  kvs_add_cunit_test(NAME test_decoder SOURCES test_decoder.c LIBS kvs_decoder kvs_kernels m
                     LABELS unit ARGS ${KVS_MODEL_DIR} TIMEOUT 600)
  set_tests_properties(test_decoder PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=2")
endif()
