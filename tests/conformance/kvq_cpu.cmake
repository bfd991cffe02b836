# The fast CPU path (kernels/cpu) against the reference, byte for byte, on every ISA the
# machine supports (test_kvq_cpu.c). Included by tests/conformance/CMakeLists.txt.
kvs_add_cunit_test(NAME test_kvq_cpu SOURCES test_kvq_cpu.c LIBS kvs_kernels m
                   LABELS conformance TIMEOUT 600)
# The automatic choice obeys KVSTASH_CPU_ISA (capped at what the machine has).
add_test(NAME test_kvq_cpu_env COMMAND test_kvq_cpu --expect-isa avx2)
set_tests_properties(test_kvq_cpu_env PROPERTIES ENVIRONMENT KVSTASH_CPU_ISA=avx2
                     LABELS conformance TIMEOUT 60)
