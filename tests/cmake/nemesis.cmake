# Issue 18's nemesis suite: one binary, one CTest entry per scenario (a fresh cluster of 3 masters
# and 4 segments in network namespaces each). Needs root, `ip netns` and `nft` (skips otherwise).
# RUN_SERIAL: the scenarios measure windows of a few client_ttl (2 s); a parallel CPU-heavy test
# on a 2-core runner would turn them into noise.
add_executable(test_nemesis ${CMAKE_SOURCE_DIR}/tests/netns/test_nemesis.c)
target_compile_options(test_nemesis PRIVATE ${KVP_WARN})
target_link_libraries(test_nemesis PRIVATE kvp_testlib kvpool_static ${CMOCKA_LINK_LIBRARIES} ${KVP_DEP_LIBS})
add_dependencies(test_nemesis kvpool-master kvpool-segment)
foreach(S masters_paused masters_cut_from_segments two_segments_killed asymmetric leader_isolated
          segment_stopped masters_down masters_killed raftlog_disk_full raftlog_slow_fsync)
  add_test(NAME test_nemesis_${S} COMMAND test_nemesis ${S})
  set_tests_properties(test_nemesis_${S} PROPERTIES TIMEOUT 120 LABELS netns RUN_SERIAL TRUE
    ENVIRONMENT "KVP_BUILD_DIR=${CMAKE_BINARY_DIR};KVP_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
endforeach()
