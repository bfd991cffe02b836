# Installation (cmake --install): the binaries an operator runs, in one bin/ directory.
#   install_test   installs into a temporary prefix and checks the layout
add_test(NAME install_test
  COMMAND /bin/sh ${CMAKE_CURRENT_SOURCE_DIR}/install_test.sh ${CMAKE_BINARY_DIR})
set_tests_properties(install_test PROPERTIES LABELS integration TIMEOUT 60
  FAIL_REGULAR_EXPRESSION "not ok - ")
