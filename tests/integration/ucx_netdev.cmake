# A kvstashd serving gRPC on loopback keeps UCX's network transports on loopback
# (common/kvs_netdev.h): nothing listens outside loopback; UCX_NET_DEVICES and a
# wildcard listen address leave UCX every interface.
if(TARGET kvstashd)
  add_test(NAME ucx_netdev_test
    COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/ucx_netdev_test.py
            $<TARGET_FILE:kvstashd>)
  set_tests_properties(ucx_netdev_test PROPERTIES LABELS integration TIMEOUT 60
    ENVIRONMENT "PYTHONDONTWRITEBYTECODE=1")
endif()
