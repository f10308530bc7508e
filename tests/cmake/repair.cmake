# Drain and repair (issue 7, docs/drain-repair.md): real processes via `kvpoolctl cluster up`
# (needs kvpool-master, kvpool-segment, kvpoolctl built).
kvp_add_test(test_drain_load SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/test_drain_load.c LABEL integration TIMEOUT 90)
kvp_add_test(test_repair_crash SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/test_repair_crash.c LABEL integration TIMEOUT 90)
kvp_add_test(test_drain_edge SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/test_drain_edge.c LABEL integration TIMEOUT 90)
# Multi-host crash: one network namespace per segment host, the "crash" is a link going down
# (needs root and `ip netns`; skips otherwise).
kvp_add_test(test_crash_netns SOURCES ${CMAKE_SOURCE_DIR}/tests/netns/test_crash_netns.c LABEL netns TIMEOUT 120)
