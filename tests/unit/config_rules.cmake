# service/config.c's rule lists (model_rules, tenant_rules): parsing, canonical text,
# which rule applies, the config file's [model.*] / [tenant.*] sections, and the
# calibration profiles model rules name (service/profiles.h).
kvs_add_cunit_test(NAME test_config_rules SOURCES test_config_rules.c LIBS kvs_service kvs_kernels
                   LABELS unit)
