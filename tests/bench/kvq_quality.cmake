# kvq_quality: quality of our KV quantization (reference quantizer) against per-tensor FP8,
# per-token INT8, q8_0 and KIVI-8 on synthetic or real KV (docs/QUALITY.md). A program,
# not a ctest; also the sample-file generator of tests/integration/cli_calibrate.sh.
add_executable(kvq_quality ${CMAKE_CURRENT_SOURCE_DIR}/kvq_quality.c)
target_link_libraries(kvq_quality PRIVATE kvs_kernels m)
