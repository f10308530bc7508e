# kvpool-segment: contributes one memory region to the pool (docs/data-plane.md).
add_executable(kvpool-segment ${CMAKE_CURRENT_LIST_DIR}/kvpool_segment.c)
target_compile_options(kvpool-segment PRIVATE ${KVP_WARN})
target_link_libraries(kvpool-segment kvpool_static ${KVP_DEP_LIBS})
add_dependencies(kvpool-segment kvp_wire_gen)
