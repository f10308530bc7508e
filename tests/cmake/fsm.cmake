# Master FSM and its allocator (actors/master/fsm/fsm*.c, alloc.c).
kvp_add_test(test_alloc SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_alloc.c LABEL unit TIMEOUT 120)
kvp_add_test(test_fsm SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_fsm.c LABEL unit TIMEOUT 60)
kvp_add_test(test_fsm_snap SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_fsm_snap.c LABEL unit TIMEOUT 120)
kvp_add_test(test_fsm_random SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_fsm_random.c LABEL unit TIMEOUT 120)
kvp_add_test(test_fsm_memory SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_fsm_memory.c LABEL unit TIMEOUT 120)
# The quarantine's release rule by committed feature level (FIFO below 5, per entry from 5).
kvp_add_test(test_fsm_quarantine SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_fsm_quarantine.c LABEL unit TIMEOUT 60)
kvp_add_test(test_fsm_reserve SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_fsm_reserve.c LABEL unit TIMEOUT 60)
# Level 6: the put's intent committed while its bytes move (pending, sealed, revoked, snapshots).
kvp_add_test(test_fsm_intent SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_fsm_intent.c LABEL unit TIMEOUT 60)
# issue 22: bounded walks (repair scan slices, per-tenant use kept on apply) equal the full walk.
kvp_add_test(test_fsm_scale SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_fsm_scale.c LABEL unit TIMEOUT 60)
# issue 22: the FSM's raft-thread holds at scale (apply of a group entry, snapshot steps), in the
# thread's own CPU; prints figures (docs/bench.md "Master scale"), not a test.
add_executable(bench_fsm_scale ${CMAKE_SOURCE_DIR}/tests/unit/bench_fsm_scale.c)
target_compile_options(bench_fsm_scale PRIVATE ${KVP_WARN})
target_link_libraries(bench_fsm_scale PRIVATE kvpool_static ${KVP_DEP_LIBS})
# issue 22: the event-triggered walks over every object (eviction list, tenant candidates,
# SegmentLost, Unmount, RemoveAll), one hold each in the thread's CPU; prints figures, not a test.
add_executable(bench_fsm_walks ${CMAKE_SOURCE_DIR}/tests/unit/bench_fsm_walks.c)
target_compile_options(bench_fsm_walks PRIVATE ${KVP_WARN})
target_link_libraries(bench_fsm_walks PRIVATE kvpool_static ${KVP_DEP_LIBS})
# issue 22: PutStart's placement without sorting equals the sort's on random states.
kvp_add_test(test_fsm_place SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_fsm_place.c LABEL unit TIMEOUT 60)
