# Eviction policy behaviour (store/policy_prefix.c): scans, returning chains,
# ARC's adaptation, a generated trace. Included by tests/unit/CMakeLists.txt.
kvs_add_cunit_test(NAME test_store_policy SOURCES test_store_policy.c LIBS kvs_trace LABELS unit)

# tests/bench/tracegen.py: same seed, same bytes; every kind loads in kvstash-sim
# and replays under LRU, prefix and Belady (Belady never below the online ones).
find_program(KVS_PYTHON3 python3)
if(KVS_PYTHON3)
  add_test(NAME tracegen_mixes
           COMMAND sh ${PROJECT_SOURCE_DIR}/tests/bench/tracegen_check.sh ${KVS_PYTHON3}
                   ${PROJECT_SOURCE_DIR}/tests/bench/tracegen.py $<TARGET_FILE:kvstash-sim>)
  set_tests_properties(tracegen_mixes PROPERTIES LABELS unit PASS_REGULAR_EXPRESSION "tracegen ok")
endif()
