# raftlog tests: entry/snapshot codecs, FSM glue on raft's fixture, 3 real nodes on loopback.
kvp_add_test(test_raftlog_entry SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_raftlog_entry.c LABEL unit TIMEOUT 60)
kvp_add_test(test_raftlog_fixture SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_raftlog_fixture.c LABEL unit TIMEOUT 60)
kvp_add_test(test_raftlog_cluster SOURCES ${CMAKE_SOURCE_DIR}/tests/actor/test_raftlog_cluster.c LABEL actor TIMEOUT 120)
