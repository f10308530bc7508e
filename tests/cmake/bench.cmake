# kvpool-bench: trace parser, offline bounds, pattern (unit); short trace replay (integration).
set(KVP_BENCH_PURE ${CMAKE_SOURCE_DIR}/tools/bench_tracefile.c ${CMAKE_SOURCE_DIR}/tools/bench_bounds.c
    ${CMAKE_SOURCE_DIR}/tools/bench_util.c)
kvp_add_test(test_trace_bounds SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_trace_bounds.c ${KVP_BENCH_PURE}
             LABEL unit TIMEOUT 30)
