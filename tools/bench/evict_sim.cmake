# kvpool-evict-sim: the master's eviction policies replayed offline on a trace (docs/eviction.md).
add_executable(kvpool-evict-sim ${CMAKE_CURRENT_LIST_DIR}/evict_sim.c ${CMAKE_CURRENT_LIST_DIR}/bench_tracefile.c
  ${CMAKE_CURRENT_LIST_DIR}/bench_util.c)
target_compile_options(kvpool-evict-sim PRIVATE ${KVP_WARN})
target_link_libraries(kvpool-evict-sim kvpool_static ${KVP_DEP_LIBS})
add_dependencies(kvpool-evict-sim kvp_wire_gen)
