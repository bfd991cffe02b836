# common/kvs_netdev.c: the interface a listen address is on (kvstashd keeps UCX's
# network transports to it), against this machine's own interface list.
kvs_add_cunit_test(NAME test_netdev SOURCES test_netdev.c LIBS kvs_common LABELS unit)
