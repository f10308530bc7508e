# Transfer engine, segment data-plane server and segment runtime tests (actors/transfer, actors/segment).
kvp_add_test(test_xfer_resolve SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_xfer_resolve.c LABEL unit TIMEOUT 30)
# 180 s (540 s under TSan): its TSan run took 252 s at load 28 on the shared 2-core machine
# (49 s in the last CI run); a 360 s limit left a margin of 1.4 there.
kvp_add_test(test_xfer_tcp SOURCES ${CMAKE_SOURCE_DIR}/tests/actor/test_xfer_tcp.c LABEL actor TIMEOUT 180)
kvp_add_test(test_seg_runtime SOURCES ${CMAKE_SOURCE_DIR}/tests/actor/test_seg_runtime.c LABEL actor TIMEOUT 60)
kvp_add_test(test_xfer_throughput SOURCES ${CMAKE_SOURCE_DIR}/tests/actor/test_xfer_throughput.c LABEL actor TIMEOUT 120)
kvp_add_test(test_xfer_fence SOURCES ${CMAKE_SOURCE_DIR}/tests/actor/test_xfer_fence.c LABEL actor TIMEOUT 120)
# The engine as actors (issue 19): a call returns after its batch actor's fini (C2), a stop waits for
# the fence, one batch over two transfer actors.
kvp_add_test(test_xfer_actors SOURCES ${CMAKE_SOURCE_DIR}/tests/actor/test_xfer_actors.c LABEL actor TIMEOUT 60)
kvp_add_test(test_xfer_spec SOURCES ${CMAKE_SOURCE_DIR}/tests/actor/test_xfer_spec.c LABEL actor TIMEOUT 300)
# kvpool-segment as a process (signals, stdout line) against a fake master; needs the tool.
kvp_add_test(test_seg_daemon SOURCES ${CMAKE_SOURCE_DIR}/tests/actor/test_seg_daemon.c LABEL integration TIMEOUT 60)
if(TARGET kvpool-segment)
  add_dependencies(test_seg_daemon kvpool-segment)
endif()
