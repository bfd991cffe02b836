# decoder_cli: kvstash-decoder end to end without a server — reference ids, hostile
# checkpoints, usage errors, --dump-kv read back by `kvstash calibrate` and kvq_quality,
# the workload's RESULT line (tests/integration/decoder_cli.sh). kvq_quality comes from
# tests/bench (added after this folder, hence KVS_BUILD_BENCH rather than TARGET).
if(TARGET kvstash_decoder AND TARGET kvstash_cli AND KVS_BUILD_BENCH)
  set(KVS_MODEL_DIR "${PROJECT_SOURCE_DIR}/../shared/models" CACHE PATH
      "Folder with stories260K.bin and stories260K.reference.txt")
  add_test(NAME decoder_cli
    COMMAND /bin/sh ${CMAKE_CURRENT_SOURCE_DIR}/decoder_cli.sh $<TARGET_FILE:kvstash_decoder>
            $<TARGET_FILE:kvstash_cli> $<TARGET_FILE:kvq_quality> ${KVS_MODEL_DIR})
  set_tests_properties(decoder_cli PROPERTIES LABELS integration TIMEOUT 300
    SKIP_RETURN_CODE 77 FAIL_REGULAR_EXPRESSION "not ok - ")
endif()
