# Block store (store/): keys and their vectors, the index and eviction policies,
# trace replay (kvstash-sim). Included by tests/unit/CMakeLists.txt.
kvs_add_cunit_test(NAME test_store_keys SOURCES test_store_keys.c LIBS kvs_store LABELS unit)
kvs_add_cunit_test(NAME test_store_index SOURCES test_store_index.c LIBS kvs_store Threads::Threads
                   LABELS unit)
kvs_add_cunit_test(NAME test_store_sim SOURCES test_store_sim.c LIBS kvs_trace LABELS unit)
target_compile_definitions(test_store_sim PRIVATE
                           KVS_STORE_TESTDATA="${PROJECT_SOURCE_DIR}/store/testdata")

# The kvstash-sim command line on the hand-worked trace (see test_store_sim.c for
# the arithmetic) and on a trace whose line 4 is malformed (exit 1, line named).
add_test(NAME store_sim_cli_tiny
         COMMAND kvstash-sim --trace ${PROJECT_SOURCE_DIR}/store/testdata/tiny.jsonl
                 --capacity-blocks 3 --policy lru)
set_tests_properties(store_sim_cli_tiny PROPERTIES LABELS unit
                     PASS_REGULAR_EXPRESSION "^policy=lru capacity=3 hit=0\\.5000\n$")
# Put lines (kvstashd --record-trace) are inserted, not requests (test_store_sim.c).
add_test(NAME store_sim_cli_puts
         COMMAND kvstash-sim --trace ${PROJECT_SOURCE_DIR}/store/testdata/puts.jsonl
                 --capacity-blocks 3,1000 --policy lru)
set_tests_properties(store_sim_cli_puts PROPERTIES LABELS unit
                     PASS_REGULAR_EXPRESSION
                     "^policy=lru capacity=3 hit=0\\.2500\npolicy=lru capacity=1000 hit=0\\.5000\n$")
add_test(NAME store_sim_cli_malformed
         COMMAND sh -c "$<TARGET_FILE:kvstash-sim> --trace ${PROJECT_SOURCE_DIR}/store/testdata/bad_line4.jsonl --capacity-blocks 3 2>&1; test $? -eq 1 && echo EXIT1")
set_tests_properties(store_sim_cli_malformed PROPERTIES LABELS unit
                     PASS_REGULAR_EXPRESSION "bad_line4.jsonl:4: malformed trace line.*EXIT1")

# Payloads: two-phase writes, read references, leases, quotas, watermarks, priorities,
# the SSD tier (corruption is dropped, never served) and the fault tier (every Nth I/O).
kvs_add_cunit_test(NAME test_store_payload SOURCES test_store_payload.c LIBS kvs_store LABELS unit)

# Many threads at once: writers, leased readers checking bytes, deletes, pins, tunables,
# policy switches, with and without the SSD tier. Label tsan: tests/run-all.sh builds
# and runs it a third time under ThreadSanitizer (build-tsan, KVS_SANITIZE=thread).
kvs_add_cunit_test(NAME test_store_stress SOURCES test_store_stress.c LIBS kvs_store
                   Threads::Threads LABELS "unit;tsan")
