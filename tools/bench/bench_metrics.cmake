# kvpool-bench-metrics: the client's metrics hooks alone, ns per call (issue 24).
add_executable(kvpool-bench-metrics ${CMAKE_CURRENT_LIST_DIR}/bench_metrics.c)
target_compile_options(kvpool-bench-metrics PRIVATE ${KVP_WARN})
target_link_libraries(kvpool-bench-metrics kvpool_static ${KVP_DEP_LIBS})
add_dependencies(kvpool-bench-metrics kvp_wire_gen)
