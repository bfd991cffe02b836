# kvq_speed: GB/s of the CPU tile codec (kernels/cpu) vs memcpy of the same bytes, per ISA;
# validates against the reference before timing. A program, not a ctest:
#   build/tests/bench/kvq_speed [--tiles N] [--reps N] [--isa portable|avx2|avx512]
# With CUDA enabled and tests/bench/kvq_speed_gpu.cu present, that file's
# kvq_speed_gpu() (its own table; 0 ok, 77 no GPU, 1 failure) runs after the CPU part.
add_executable(kvq_speed kvq_speed.c)
target_link_libraries(kvq_speed PRIVATE kvs_kernels m)
if(KVS_CUDA_ENABLED AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/kvq_speed_gpu.cu)
  target_sources(kvq_speed PRIVATE kvq_speed_gpu.cu)
  target_compile_definitions(kvq_speed PRIVATE KVQ_SPEED_GPU)
  target_link_libraries(kvq_speed PRIVATE kvs_cuda CUDA::cudart)
endif()
