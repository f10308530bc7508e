# Fencing (issue 6, contracts C2/C3): the client over real segment servers and the real master
# FSM behind a fake service, with the transfer engine's fault injection (needs KVP_FAULT_INJECTION).
if(KVP_FAULT_INJECTION)
  kvp_add_test(test_fence_client SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/test_fence_client.c LABEL integration TIMEOUT 120)
endif()
