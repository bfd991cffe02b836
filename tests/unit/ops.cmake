# The operator surfaces of kvstashd (C2): the server's Prometheus renderer against
# libkvstash's, and the request-trace recorder against kvstash-sim's trace loader.
kvs_add_cunit_test(NAME test_prom SOURCES test_prom.c
                   LIBS kvs_service kvstash m LABELS unit)
kvs_add_cunit_test(NAME test_trace_rec SOURCES test_trace_rec.c
                   LIBS kvs_service kvs_trace LABELS unit)
