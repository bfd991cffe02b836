# store_payload_bench: the store's payload path (two-phase puts vs memcpy, read refs,
# SSD demotion/promotion vs raw files) on one core. Not a ctest; run by hand:
# store_payload_bench [blocks] [bytes] [ssd dir]. Last line: RESULT ...
add_executable(store_payload_bench ${CMAKE_CURRENT_SOURCE_DIR}/store_payload_bench.c)
target_link_libraries(store_payload_bench PRIVATE kvs_store)
