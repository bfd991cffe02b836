# cli_calibrate: `kvstash calibrate` on sample files written by kvq_quality --write-sample
# (tests/bench), so it needs the benchmark programs; no kvstashd involved.
if(KVS_BUILD_BENCH AND TARGET kvstash_cli)
  add_test(NAME cli_calibrate
    COMMAND /bin/sh ${CMAKE_CURRENT_SOURCE_DIR}/cli_calibrate.sh $<TARGET_FILE:kvstash_cli>
            $<TARGET_FILE:kvq_quality>)
  set_tests_properties(cli_calibrate PROPERTIES LABELS integration TIMEOUT 180
    FAIL_REGULAR_EXPRESSION "not ok - ")
endif()
