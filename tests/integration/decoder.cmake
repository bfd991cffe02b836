# decoder_cli: kvstash-decoder end to end without a server — reference ids, hostile
# checkpoints, usage errors, --dump-kv read back by `kvstash calibrate` and kvq_quality,
# the workload's RESULT line (tests/integration/decoder_cli.sh). kvq_quality comes from
# tests/bench (added after this folder, hence KVS_BUILD_BENCH rather than TARGET).
set(KVS_MODEL_DIR "${PROJECT_SOURCE_DIR}/models" CACHE PATH
    "Folder with stories260K.bin and stories260K.reference.txt")
if(TARGET kvstash_decoder AND TARGET kvstash_cli AND KVS_BUILD_BENCH)
  add_test(NAME decoder_cli
    COMMAND /bin/sh ${CMAKE_CURRENT_SOURCE_DIR}/decoder_cli.sh $<TARGET_FILE:kvstash_decoder>
            $<TARGET_FILE:kvstash_cli> $<TARGET_FILE:kvq_quality> ${KVS_MODEL_DIR})
  set_tests_properties(decoder_cli PROPERTIES LABELS integration TIMEOUT 300
    SKIP_RETURN_CODE 77 FAIL_REGULAR_EXPRESSION "not ok - ")
endif()

# decoder_server: the workload through a real kvstashd — for each scheme the server run
# equals the in-process --local-quant run (same quantizer, same defaults), blocks stored
# by one run serve the next, fp16 egress, errors (tests/integration/decoder_server.sh).
if(TARGET kvstash_decoder AND TARGET kvstashd)
  add_test(NAME decoder_server
    COMMAND /bin/sh ${CMAKE_CURRENT_SOURCE_DIR}/decoder_server.sh $<TARGET_FILE:kvstash_decoder>
            $<TARGET_FILE:kvstashd> ${KVS_MODEL_DIR})
  set_tests_properties(decoder_server PROPERTIES LABELS integration TIMEOUT 600
    SKIP_RETURN_CODE 77 FAIL_REGULAR_EXPRESSION "not ok - ")
endif()
