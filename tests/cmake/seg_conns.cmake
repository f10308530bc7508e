# The segment server as an event-driven actor: idle connections cost no threads, stallers and
# garbage are dropped without delaying others, the per-connection in-flight cap.
kvp_add_test(test_seg_conns SOURCES ${CMAKE_SOURCE_DIR}/tests/actor/test_seg_conns.c LABEL actor TIMEOUT 180)
