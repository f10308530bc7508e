# kvpool-bench-runtime: kvp_rt actor hop latency / throughput vs a raw czmq inproc PAIR.
add_executable(kvpool-bench-runtime ${CMAKE_CURRENT_LIST_DIR}/bench_runtime.c)
target_compile_options(kvpool-bench-runtime PRIVATE ${KVP_WARN})
target_link_libraries(kvpool-bench-runtime kvpool_static ${KVP_DEP_LIBS})
add_dependencies(kvpool-bench-runtime kvp_wire_gen)
