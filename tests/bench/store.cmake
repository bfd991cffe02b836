# store_bench: index throughput on one core (tests/bench/store_bench.c). Not a ctest;
# run by hand: store_bench [blocks]. Its last line is the RESULT line of issue 4.
add_executable(store_bench ${CMAKE_CURRENT_SOURCE_DIR}/store_bench.c)
target_link_libraries(store_bench PRIVATE kvs_store)
