# Drain and repair (issue 7, docs/drain-repair.md): real processes via `kvpoolctl cluster up`
# (needs kvpool-master, kvpool-segment, kvpoolctl built).
kvp_add_test(test_drain_load SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/test_drain_load.c LABEL integration TIMEOUT 90)
kvp_add_test(test_repair_crash SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/test_repair_crash.c LABEL integration TIMEOUT 90)
kvp_add_test(test_drain_edge SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/test_drain_edge.c LABEL integration TIMEOUT 90)
# Multi-host crash: one network namespace per segment host, the "crash" is a link going down
# (needs root and `ip netns`; skips otherwise).
kvp_add_test(test_crash_netns SOURCES ${CMAKE_SOURCE_DIR}/tests/netns/test_crash_netns.c LABEL netns TIMEOUT 120)
# issue 22: the same drain with the leader's repair scan in slices of 64 table slots (test
# builds), so that each pass is many queries and the service sums them.
if(KVP_FAULT_INJECTION AND TARGET test_drain_load)
  add_test(NAME test_drain_load_slices COMMAND test_drain_load)
  set_tests_properties(test_drain_load_slices PROPERTIES TIMEOUT 90 LABELS integration
    ENVIRONMENT "KVP_BUILD_DIR=${CMAKE_BINARY_DIR};KVP_SOURCE_DIR=${CMAKE_SOURCE_DIR};KVPOOL_TEST_REPAIR_SCAN_SLOTS=64")
endif()
