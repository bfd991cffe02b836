# kvstashd's SIGHUP reload of its config file, against a real kvstashd: run-time
# settings the file changed apply, restart-only ones wait, SetConfig values the
# file did not change stay, and a bad file (syntax, refused value, unreadable
# profile, unknown tenant) changes nothing.
kvs_add_cunit_test(NAME test_reload
  SOURCES test_reload.c kvs_server_proc.c kvs_itest.c
  LIBS kvstash PkgConfig::GRPC Threads::Threads
  LABELS integration
  ARGS $<TARGET_FILE:kvstashd>
  TIMEOUT 120)
target_include_directories(test_reload PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
