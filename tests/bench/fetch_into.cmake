# fetch_into_bench: kvstash-decoder's fetch into its fp32 KV pages (docs/DECODER.md
# "Fetching into the pages"): kvs_client_fetch with a copying / widening callback vs
# kvs_client_fetch_into (fp32; fp16 widened in place by the decoder's own code), over UCX
# and gRPC, against memcpy of the page bytes, same kvstashd, same run; validates every
# method's pages byte for byte first. Not a ctest: run by hand,
# `UCX_TLS=tcp fetch_into_bench $(pwd)/service/kvstashd [--blocks 16] [--rounds 60]`
# (or --server HOST:PORT); it starts and stops the server. Last line: RESULT ...
if(TARGET kvstashd AND TARGET kvs_transfer AND TARGET kvs_decoder)
  add_executable(fetch_into_bench ${CMAKE_CURRENT_SOURCE_DIR}/fetch_into_bench.c
                 ${PROJECT_SOURCE_DIR}/tests/integration/kvs_server_proc.c)
  target_include_directories(fetch_into_bench PRIVATE ${PROJECT_SOURCE_DIR}/tests/integration)
  target_link_libraries(fetch_into_bench PRIVATE kvs_decoder kvstash Threads::Threads m)
endif()
