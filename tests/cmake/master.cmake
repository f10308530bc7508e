# Master service integration tests: real kvpool-master processes on loopback, started with
# `kvpoolctl cluster up` (so both tools must be built first).
foreach(T test_master_failover test_master_quorum test_master_soft test_master_restart)
  if(EXISTS ${CMAKE_SOURCE_DIR}/tests/integration/${T}.c)
    kvp_add_test(${T} SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/${T}.c LABEL integration TIMEOUT 120)
    add_dependencies(${T} kvpool-master kvpoolctl)
  endif()
endforeach()
if(TARGET test_master_restart)
  add_dependencies(test_master_restart kvpool-segment)
endif()
# Pure parts of the service (soft-state map, members parser).
kvp_add_test(test_master_service SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_master_service.c LABEL unit TIMEOUT 30)
# The leader's "segment lost" rule (issue 18): blind periods, self-suspicion, evidence.
kvp_add_test(test_master_liveness SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_master_liveness.c LABEL unit TIMEOUT 30)
