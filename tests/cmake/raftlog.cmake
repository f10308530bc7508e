# raftlog tests: entry/snapshot codecs, FSM glue on raft's fixture, 3 real nodes on loopback.
kvp_add_test(test_raftlog_entry SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_raftlog_entry.c LABEL unit TIMEOUT 60)
kvp_add_test(test_raftlog_fixture SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_raftlog_fixture.c LABEL unit TIMEOUT 60)
# Incremental snapshots of the master FSM on the fixture (issue 22).
kvp_add_test(test_raftlog_snapshot SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_raftlog_snapshot.c LABEL unit TIMEOUT 120)
kvp_add_test(test_raftlog_cluster SOURCES ${CMAKE_SOURCE_DIR}/tests/actor/test_raftlog_cluster.c LABEL actor TIMEOUT 120)
# Fuzz target for the entry decoder: libFuzzer build with KVP_FUZZ=ON (clang), and always a
# replay run of a generated corpus as an ordinary ctest.
kvp_add_test(fuzz_raft_entry_replay SOURCES ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_raft_entry.c LABEL fuzz TIMEOUT 60)
if(KVP_FUZZ)
  add_executable(fuzz_raft_entry ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_raft_entry.c)
  target_compile_definitions(fuzz_raft_entry PRIVATE KVP_LIBFUZZER=1)
  target_compile_options(fuzz_raft_entry PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_options(fuzz_raft_entry PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_raft_entry PRIVATE kvpool_static ${KVP_DEP_LIBS})
endif()
# Throughput of a single-node raftlog (not a ctest: prints figures). Run from a build dir on
# an ordinary disk: ./raftlog_bench [dir]
add_executable(raftlog_bench ${CMAKE_SOURCE_DIR}/tests/actor/test_raftlog_bench.c)
target_compile_options(raftlog_bench PRIVATE ${KVP_WARN})
target_link_libraries(raftlog_bench PRIVATE kvpool_static ${KVP_DEP_LIBS})
# The master at scale (issue 22; not a ctest: prints figures): scripts/bench-scale.sh runs it
# against a real 3-master cluster of $KVP_BUILD_DIR.
add_executable(bench_master_scale ${CMAKE_SOURCE_DIR}/tests/integration/bench_master_scale.c)
target_compile_options(bench_master_scale PRIVATE ${KVP_WARN})
target_link_libraries(bench_master_scale PRIVATE kvp_testlib kvpool_static ${KVP_DEP_LIBS})
