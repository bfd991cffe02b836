# service/config.c's rule lists (model_rules, tenant_rules): parsing, canonical text,
# which rule applies, the config file's [model.*] / [tenant.*] sections.
kvs_add_cunit_test(NAME test_config_rules SOURCES test_config_rules.c LIBS kvs_service
                   LABELS unit)
