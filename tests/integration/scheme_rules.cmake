# The scheme per model and per tenant, skip layers, the fp16 fallback and the
# tenants' quotas (config file sections, GetConfig / SetConfig at run time),
# against a real kvstashd through python3-grpcio.
add_test(NAME scheme_rules_grpcio
  COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/scheme_rules.py $<TARGET_FILE:kvstashd>)
set_tests_properties(scheme_rules_grpcio PROPERTIES
  ENVIRONMENT "PYTHONPATH=${KVS_PY_OUT};PYTHONDONTWRITEBYTECODE=1"
  LABELS integration TIMEOUT 120)
