# kvpoolctl: the operator CLI (tools/kvpoolctl/kvpoolctl*.c; docs/operations.md). kvpoolctl_data.c, when
# present, provides the data commands; otherwise a weak fallback in kvpoolctl.c reports them
# as not built.
file(GLOB KVPCTL_SRC ${CMAKE_CURRENT_LIST_DIR}/kvpoolctl*.c)
add_executable(kvpoolctl ${KVPCTL_SRC})
target_compile_options(kvpoolctl PRIVATE ${KVP_WARN})
target_link_libraries(kvpoolctl kvpool_static ${KVP_DEP_LIBS})
add_dependencies(kvpoolctl kvp_wire_gen)
