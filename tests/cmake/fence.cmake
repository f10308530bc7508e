# Fencing (issue 6, contracts C2/C3): the client over real segment servers and the real master
# FSM behind a fake service, with the transfer engine's fault injection (needs KVP_FAULT_INJECTION).
if(KVP_FAULT_INJECTION)
  kvp_add_test(test_fence_client SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/test_fence_client.c LABEL integration TIMEOUT 120)
  # The fault rules one by one (engine + a real segment server, and the local transport).
  kvp_add_test(test_fence_faults SOURCES ${CMAKE_SOURCE_DIR}/tests/actor/test_fence_faults.c LABEL actor TIMEOUT 60)
endif()
# A frozen (SIGSTOP) and a killed (SIGKILL) segment process under the transfer engine.
kvp_add_test(test_fence_peer SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/test_fence_peer.c LABEL integration TIMEOUT 90)
# Client and segment in two network namespaces joined by veth, nftables drops the data traffic
# past the timeout (root; skips with a message otherwise).
kvp_add_test(test_fence_netns SOURCES ${CMAKE_SOURCE_DIR}/tests/netns/test_fence_netns.c LABEL netns TIMEOUT 120)
# Hot-path cost: READ throughput printed (compare a -DKVP_FAULT_INJECTION=ON and an OFF build).
kvp_add_test(test_fence_hotpath SOURCES ${CMAKE_SOURCE_DIR}/tests/actor/test_fence_hotpath.c LABEL actor TIMEOUT 120)
