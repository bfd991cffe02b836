# rules_bench: what the scheme rules (service/config.h model_rules / tenant_rules) cost a
# Put's header, against the CPU encode of one block measured in the same run.
add_executable(rules_bench rules_bench.c)
target_link_libraries(rules_bench PRIVATE kvs_service)
