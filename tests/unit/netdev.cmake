# common/kvs_netdev.c: the interface an address is on or is reached through (kvstashd
# and libkvstash keep UCX on loopback when gRPC is on loopback), against this
# machine's own interface list.
kvs_add_cunit_test(NAME test_netdev SOURCES test_netdev.c LIBS kvs_common LABELS unit)
