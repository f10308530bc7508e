# Memory pressure (issue 8): the pure eviction policy, and eviction / leases / soft pin on a real
# local cluster (kvpoolctl cluster up; needs the tools built). docs/eviction.md.
kvp_add_test(test_evict_policy SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_evict_policy.c LABEL unit TIMEOUT 30)
kvp_add_test(test_evict_cluster SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/test_evict_cluster.c LABEL integration TIMEOUT 180)
# issue 22: the same cluster test with the leader's eviction list read in slices of 64 table slots
# (test builds), so that each listing is a pass of many queries that the service puts together,
# and each round's victims in EvictCmds of at most 3 keys.
if(KVP_FAULT_INJECTION AND TARGET test_evict_cluster)
  add_test(NAME test_evict_cluster_slices COMMAND test_evict_cluster)
  set_tests_properties(test_evict_cluster_slices PROPERTIES TIMEOUT 180 LABELS integration
    ENVIRONMENT "KVP_BUILD_DIR=${CMAKE_BINARY_DIR};KVP_SOURCE_DIR=${CMAKE_SOURCE_DIR};KVPOOL_TEST_EVICT_SCAN_SLOTS=64;KVPOOL_TEST_EVICT_CMD_KEYS=3")
endif()
