# Operator and client surface of kvstashd (C2), black-box against a real server:
#   metrics_test   GET /metrics (libmicrohttpd) against the Stats RPC rendered by the CLI
#   tls_test       TLS listener with a CA and certificate made by the openssl CLI
#   trace_test     --record-trace, then kvstash-sim replays the recording
#   cli_data_test  the CLI's data commands (lookup, put, get, delete, pin, unpin, bench)
#   data_grpcio    python3-grpcio as an independent client of Lookup, Put and Get
add_test(NAME metrics_test
  COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/metrics_test.py
          $<TARGET_FILE:kvstashd> $<TARGET_FILE:kvstash_cli>)
set_tests_properties(metrics_test PROPERTIES LABELS integration TIMEOUT 120
  ENVIRONMENT "PYTHONDONTWRITEBYTECODE=1")

add_test(NAME tls_test
  COMMAND /bin/sh ${CMAKE_CURRENT_SOURCE_DIR}/tls_test.sh $<TARGET_FILE:kvstashd>
          $<TARGET_FILE:kvstash_cli> ${KVS_PY_OUT})
set_tests_properties(tls_test PROPERTIES LABELS integration TIMEOUT 120
  FAIL_REGULAR_EXPRESSION "not ok - ")

if(TARGET kvstash-sim)
  add_test(NAME trace_test
    COMMAND /bin/sh ${CMAKE_CURRENT_SOURCE_DIR}/trace_test.sh $<TARGET_FILE:kvstashd>
            $<TARGET_FILE:kvstash_cli> $<TARGET_FILE:kvstash-sim>)
  set_tests_properties(trace_test PROPERTIES LABELS integration TIMEOUT 120
    FAIL_REGULAR_EXPRESSION "not ok - ")
endif()

add_test(NAME cli_data_test
  COMMAND /bin/sh ${CMAKE_CURRENT_SOURCE_DIR}/cli_data_test.sh $<TARGET_FILE:kvstashd>
          $<TARGET_FILE:kvstash_cli>)
set_tests_properties(cli_data_test PROPERTIES LABELS integration TIMEOUT 120
  FAIL_REGULAR_EXPRESSION "not ok - ")

add_test(NAME data_grpcio
  COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/data_grpcio.py $<TARGET_FILE:kvstashd>
          $<TARGET_FILE:kvstash_cli>)
set_tests_properties(data_grpcio PROPERTIES
  ENVIRONMENT "PYTHONPATH=${KVS_PY_OUT};PYTHONDONTWRITEBYTECODE=1"
  LABELS integration TIMEOUT 120)
