# The data path's pure modules (C): the tenant table (INI parsing, bearer
# authentication, model patterns), the lease-owner registry, the layer-list
# setting, and the codec bridge to kernels/ (block size, encode + measured error,
# egress formats).
kvs_add_cunit_test(NAME test_service_data SOURCES test_service_data.c
                   LIBS kvs_service kvs_kernels m LABELS unit)
