# msg_fuzz_grpcio: kvstashd's gRPC surface against hostile messages (python3-grpcio,
# raw bytes). Every RPC, an open and a tenants server, structured messages with
# hostile fields and byte-level mutations of valid ones from a fixed seed; each
# reply must be OK or a client-error status with a message, the reference blocks
# must read back byte-identical afterwards, and SIGTERM must exit 0. With UCX on,
# Connect worker addresses of 8..65536 bytes go to kvstashd's address check
# (kvstash-ucx-addrcheck, next to kvstashd), no longer cut to 7 bytes; the 8-byte
# address that aborted kvstashd in UCX 1.13 is a curated case (INVALID_ARGUMENT,
# server alive). Adds about 2 s to the run (the curated cases wait out the check's
# restart limit). data_plane_abort sends the two UCX 1.13 aborts (13 bytes to the UCX
# tcp port; a Connect naming a listener that answers junk) to a default kvstashd: the
# data plane process (kvstash-xferd) ends and is replaced, kvstashd and every block
# stay (about 1 s). MSG_FUZZ_KNOWN=1 runs known, unfixed bugs (msg_fuzz_grpcio.py),
# among them those two aborts with ucx_isolate = off.
# MSG_FUZZ_SEED / MSG_FUZZ_COUNT in the environment run other or more messages.
if(TARGET kvstashd)
  add_test(NAME msg_fuzz_grpcio
    COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/msg_fuzz_grpcio.py $<TARGET_FILE:kvstashd>)
  set_tests_properties(msg_fuzz_grpcio PROPERTIES
    ENVIRONMENT "PYTHONPATH=${KVS_PY_OUT};PYTHONDONTWRITEBYTECODE=1"
    LABELS integration TIMEOUT 180)
endif()
