# Service hygiene (issue 24, items 2 and 3): sd_notify without libsystemd, and real kvpool-master
# and kvpool-segment processes started from mooncake_master's flags under a fake NOTIFY_SOCKET.
kvp_add_test(test_sdnotify SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_sdnotify.c LABEL unit TIMEOUT 30)
if(EXISTS ${CMAKE_SOURCE_DIR}/tests/integration/test_master_service_units.c)
  kvp_add_test(test_master_service_units SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/test_master_service_units.c
               LABEL integration TIMEOUT 120)
  add_dependencies(test_master_service_units kvpool-master kvpool-segment)
endif()
# The systemd units of packaging/systemd/ (systemd-analyze verify when installed).
add_test(NAME test_systemd_units COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/systemd_units.sh)
set_tests_properties(test_systemd_units PROPERTIES TIMEOUT 60 LABELS integration
  ENVIRONMENT "KVP_BUILD_DIR=${CMAKE_BINARY_DIR};KVP_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
# Structured logs: log_format json (runtime/log.c).
kvp_add_test(test_log_format SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_log_format.c LABEL unit TIMEOUT 30)
# The master service as a runtime actor (issue 23): serves from its actor, stops by message.
kvp_add_test(test_master_actor SOURCES ${CMAKE_SOURCE_DIR}/tests/actor/test_master_actor.c
             LABEL integration TIMEOUT 60)
