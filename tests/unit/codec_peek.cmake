# kvs_codec_peek_scheme (service/codec.c): the scheme Lookup reports, from the 64 header
# bytes the store copies under its lock; damaged, short and randomly mutated heads.
kvs_add_cunit_test(NAME test_codec_peek SOURCES test_codec_peek.c LIBS kvs_service kvs_kernels
                   LABELS unit)
