# decoder_faults: the decoder with a kvstashd that is gone, and with blocks that fail
# their checksum on the SSD tier — full prefill / recomputation, never a crash, never a
# bad block used (tests/integration/decoder_faults.sh).
if(TARGET kvstash_decoder AND TARGET kvstashd AND TARGET kvstash_cli)
  add_test(NAME decoder_faults
    COMMAND /bin/sh ${CMAKE_CURRENT_SOURCE_DIR}/decoder_faults.sh $<TARGET_FILE:kvstash_decoder>
            $<TARGET_FILE:kvstashd> $<TARGET_FILE:kvstash_cli> ${KVS_MODEL_DIR})
  set_tests_properties(decoder_faults PROPERTIES LABELS integration TIMEOUT 300
    SKIP_RETURN_CODE 77 FAIL_REGULAR_EXPRESSION "not ok - ")
endif()
