# kernels/calib: sample files, calibration statistics, profiles, static scales in the
# reference quantizer (tests/unit/test_calib.c).
kvs_add_cunit_test(NAME test_calib SOURCES test_calib.c LIBS kvs_kernels m LABELS unit)
