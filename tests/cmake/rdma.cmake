# RDMA (issue 20, docs/rdma.md): the verbs test double itself, and against it the building
# blocks of the rdma transport (wr_id slots, credits, the ERR+drain / wedged fence, MR chunks and
# chunk-clamped spans, QP bring-up and GID selection, NIC choice). Only with libibverbs found.
if(KVP_HAVE_VERBS)
  kvp_add_test(test_fakeverbs SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_fakeverbs.c LABEL unit TIMEOUT 60)
  kvp_add_test(test_rdma_fence SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_rdma_fence.c LABEL unit TIMEOUT 60)
  kvp_add_test(test_rdma_chunk SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_rdma_chunk.c LABEL unit TIMEOUT 60)
  kvp_add_test(test_rdma_qp SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_rdma_qp.c LABEL unit TIMEOUT 60)
  kvp_add_test(test_rdma_xport SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_rdma_xport.c LABEL unit TIMEOUT 120)
  kvp_add_test(test_xport_rdma SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_xport_rdma.c LABEL unit TIMEOUT 120)
  # FenceWriter/Fenced: the leader's hold (fence_track), the segment's half, and both with the
  # FSM's quarantine on the double (a late WRITE past fence_grace_ms never lands in reused space)
  kvp_add_test(test_rdma_fence_writer SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_rdma_fence_writer.c LABEL unit TIMEOUT 60)
  # the per-writer fence: fence_track's merging, FenceWriter.writers toward segments with
  # fence_selectors (fence-all toward older ones), and on the double a failed writer fenced while
  # another writer's QPs stay up and its late WRITE never lands in reused space
  kvp_add_test(test_rdma_fence_selector SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_rdma_fence_selector.c LABEL unit TIMEOUT 60)
  kvp_add_test(test_client_devrdma SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_client_devrdma.c LABEL unit TIMEOUT 60)
  add_dependencies(test_client_devrdma kvp_fakecuda)
  # C2 at the engine on the rdma transport over the double (test_xfer_fence's rounds)
  kvp_add_test(test_xfer_fence_rdma SOURCES ${CMAKE_SOURCE_DIR}/tests/actor/test_xfer_fence_rdma.c LABEL actor TIMEOUT 120)
  # issue 20 end to end: segment server (RDMA_HELLO on its TCP port) + engine on the rdma transport
  kvp_add_test(test_xfer_rdma_e2e SOURCES ${CMAKE_SOURCE_DIR}/tests/actor/test_xfer_rdma_e2e.c LABEL actor TIMEOUT 120)
  # the fault rules' fencing cases (test_fence_faults) with the engine on the rdma transport and
  # the segment server's RDMA side, over the double (issue 20: C2 fence tests on rdma)
  if(KVP_FAULT_INJECTION)
    kvp_add_test(test_fence_faults_rdma SOURCES ${CMAKE_SOURCE_DIR}/tests/actor/test_fence_faults.c LABEL actor TIMEOUT 60)
    target_compile_definitions(test_fence_faults_rdma PRIVATE KVP_FENCE_RDMA=1)
    # test_fence_client through the public client with protocol=rdma (kvp_verbs_ops_set_test)
    kvp_add_test(test_fence_client_rdma SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/test_fence_client.c LABEL integration TIMEOUT 120)
    target_compile_definitions(test_fence_client_rdma PRIVATE KVP_FENCE_RDMA=1)
  endif()
  # test_fence_peer with the segment child's RDMA side and the engine on the rdma transport, over
  # one verbs double shared by the two processes (tests/lib/fakeverbs_shared.h)
  kvp_add_test(test_fence_peer_rdma SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/test_fence_peer.c LABEL integration TIMEOUT 90)
  target_compile_definitions(test_fence_peer_rdma PRIVATE KVP_FENCE_RDMA=1)
  kvp_add_test(test_rdma_topo SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_rdma_topo.c LABEL unit TIMEOUT 30)
endif()
# kvpool-bench-rdma: CPU per posted and reaped slice, rdma on the double vs tcp on loopback
# (issue 20's benchmark; figures only, never a test). Needs the double, hence here.
if(KVP_HAVE_VERBS)
  add_executable(kvpool-bench-rdma ${CMAKE_SOURCE_DIR}/tools/bench/bench_rdma.c)
  target_compile_options(kvpool-bench-rdma PRIVATE ${KVP_WARN})
  target_link_libraries(kvpool-bench-rdma PRIVATE kvp_testlib kvpool_static ${KVP_DEP_LIBS})
endif()
