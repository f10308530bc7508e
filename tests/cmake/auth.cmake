# Authentication and tenants (issue 25, docs/security.md).
# Pure: request scope per tenant, roles, the refusal log, key names.
kvp_add_test(test_auth_scope SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_auth_scope.c LABEL unit TIMEOUT 30)
# Real processes (`kvpoolctl cluster up`, 1 master, 2 segments): every refusal on the control and
# Raft ports, tenants isolated, roles, tenant_id, quota eviction.
kvp_add_test(test_auth_cluster SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/test_auth_cluster.c LABEL integration TIMEOUT 120)
set_tests_properties(test_auth_cluster PROPERTIES LABELS "integration;auth")
set_tests_properties(test_auth_scope PROPERTIES LABELS "unit;auth")
# The data-plane token on a segment's data port: every refusal (no token, garbage, forged,
# altered, replayed, stolen, expired, another segment's) while an authorised connection is served.
kvp_add_test(test_seg_token SOURCES ${CMAKE_SOURCE_DIR}/tests/actor/test_seg_token.c LABEL auth TIMEOUT 60)
set_tests_properties(test_seg_token PROPERTIES LABELS "actor;auth;seg")
# issue 22: the same cluster test with an over-quota tenant's candidates walked in slices of 64
# table slots (test builds), the FSM read lock let go between two.
if(KVP_FAULT_INJECTION AND TARGET test_auth_cluster)
  add_test(NAME test_auth_cluster_quota_slices COMMAND test_auth_cluster)
  set_tests_properties(test_auth_cluster_quota_slices PROPERTIES TIMEOUT 120 LABELS "integration;auth"
    ENVIRONMENT "KVP_BUILD_DIR=${CMAKE_BINARY_DIR};KVP_SOURCE_DIR=${CMAKE_SOURCE_DIR};KVPOOL_TEST_QUOTA_SCAN_SLOTS=64")
endif()
