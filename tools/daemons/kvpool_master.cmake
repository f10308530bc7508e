# kvpool-master: one member of the Raft metadata quorum (docs/operations.md).
add_executable(kvpool-master ${CMAKE_CURRENT_LIST_DIR}/kvpool_master.c)
target_compile_options(kvpool-master PRIVATE ${KVP_WARN})
target_link_libraries(kvpool-master kvpool_static ${KVP_DEP_LIBS})
add_dependencies(kvpool-master kvp_wire_gen)
