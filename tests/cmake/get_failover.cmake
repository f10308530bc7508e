# Get failover past a silent peer (contract C4, actors/client/batch_get.c silent-peer rule): real
# processes via `kvpoolctl cluster up` (needs the tools built); the second case uses the transfer
# engine's fault injection and skips without KVP_FAULT_INJECTION.
kvp_add_test(test_get_silent_peer SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/test_get_silent_peer.c LABEL integration TIMEOUT 90)
