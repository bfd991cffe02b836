# common/kvs_putmac.c: the seal of a put over UCX (AES-256-GMAC) against OpenSSL's own
# `openssl mac ... GMAC` (a known answer), every byte it covers, and the replay window.
kvs_add_cunit_test(NAME test_putmac SOURCES test_putmac.c LIBS kvs_putmac LABELS unit)
