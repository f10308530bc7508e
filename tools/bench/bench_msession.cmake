# kvpool-bench-msession: calls/s and CPU per call through the master session against an
# in-process answering master (scripts/bench_msession.sh compares it with a base tree).
add_executable(kvpool-bench-msession ${CMAKE_CURRENT_LIST_DIR}/bench_msession.c)
target_compile_options(kvpool-bench-msession PRIVATE ${KVP_WARN})
target_link_libraries(kvpool-bench-msession kvpool_static ${KVP_DEP_LIBS})
add_dependencies(kvpool-bench-msession kvp_wire_gen)
