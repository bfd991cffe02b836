# test_kvq_cuda: the CUDA tile kernels (kernels/cuda, kvs_cuda_quantize_tiles /
# kvs_cuda_dequantize_tiles) == the C reference (kernels/ref/kvq_ref.c), byte for byte.
# Self-contained (no CUnit) so tests/gpu/CMakeLists.txt can build it on a GPU machine
# without our apt deps. Exits 77 (skipped) where no GPU is found, as in CI.
if(KVS_CUDA_ENABLED)
  add_executable(test_kvq_cuda ${CMAKE_CURRENT_LIST_DIR}/test_kvq_cuda.c)
  target_link_libraries(test_kvq_cuda PRIVATE kvs_cuda kvs_kernels kvs_common)
  add_test(NAME test_kvq_cuda COMMAND test_kvq_cuda)
  set_tests_properties(test_kvq_cuda PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
                       LABELS "conformance;gpu")
endif()
