# Client module tests: the master session (actor) and the client library (integration).
kvp_add_test(test_msession SOURCES ${CMAKE_SOURCE_DIR}/tests/actor/test_msession.c LABEL actor TIMEOUT 60)
# The client library against the real master FSM behind an in-process fake master service and
# three real segment data-plane servers (no Raft, no processes).
kvp_add_test(test_client_fakemaster SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/test_client_fakemaster.c LABEL actor TIMEOUT 90)
# Real processes: 3 kvpool-master + 3 kvpool-segment via `kvpoolctl cluster up` (needs the tools built).
kvp_add_test(test_client_cluster SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/test_client_cluster.c LABEL integration TIMEOUT 120)
kvp_add_test(test_client_cluster_loss SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/test_client_cluster_loss.c LABEL integration TIMEOUT 90)
# The client's memory of unreachable segments (reads try them last): pure, fake clock.
kvp_add_test(test_client_avoid SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_client_avoid.c LABEL unit TIMEOUT 30)
# The calls added for language bindings (issue 16), against a real cluster (3 masters, 1 segment).
kvp_add_test(test_client_api_ext SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/test_client_api_ext.c LABEL integration TIMEOUT 120)
# GPU staging (issue 17) against the CUDA driver double (tests/lib/fakecuda) and a model network.
kvp_add_test(test_client_devstage SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_client_devstage.c LABEL unit TIMEOUT 120)
add_dependencies(test_client_devstage kvp_fakecuda)
# Registered-range table: replaced tables are freed; lookups during changes (TSan stage too).
kvp_add_test(test_client_devmem_regs SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_client_devmem_regs.c LABEL unit TIMEOUT 60)
add_dependencies(test_client_devmem_regs kvp_fakecuda)
# Device pointers end to end: real cluster + the CUDA driver double (issue 17).
kvp_add_test(test_client_gpu SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/test_client_gpu.c LABEL integration TIMEOUT 120)
add_dependencies(test_client_gpu kvp_fakecuda)
# kvpoolctl segment-lost ends a withheld episode (3 of 4 segments dead, no client traffic).
kvp_add_test(test_segment_lost_cmd SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/test_segment_lost_cmd.c LABEL integration TIMEOUT 90)
# The breaker when the quorum is lost but a master still answers "not leader" (issue 18 item 3).
kvp_add_test(test_client_quorum_lost SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/test_client_quorum_lost.c LABEL integration TIMEOUT 90)
