# Memory pressure (issue 8): the pure eviction policy, and eviction / leases / soft pin on a real
# local cluster (kvpoolctl cluster up; needs the tools built). docs/eviction.md.
kvp_add_test(test_evict_policy SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_evict_policy.c LABEL unit TIMEOUT 30)
kvp_add_test(test_evict_cluster SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/test_evict_cluster.c LABEL integration TIMEOUT 180)
