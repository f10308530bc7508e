# kvpool-bench: trace parser, offline bounds, pattern (unit); short trace replay (integration).
set(KVP_BENCH_PURE ${CMAKE_SOURCE_DIR}/tools/bench/bench_tracefile.c ${CMAKE_SOURCE_DIR}/tools/bench/bench_bounds.c
    ${CMAKE_SOURCE_DIR}/tools/bench/bench_util.c)
kvp_add_test(test_trace_bounds SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_trace_bounds.c ${KVP_BENCH_PURE}
             LABEL unit TIMEOUT 30)
add_test(NAME test_trace_replay_short_within_bounds
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/trace_replay.sh)
set_tests_properties(test_trace_replay_short_within_bounds PROPERTIES TIMEOUT 90 LABELS integration
  SKIP_RETURN_CODE 77 ENVIRONMENT "KVP_BUILD_DIR=${CMAKE_BINARY_DIR};KVP_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
