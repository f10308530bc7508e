# kvpool-rdma-probe: RDMA devices through the verbs ops table (scripts/rdma-check.sh, docs/rdma.md).
if(KVP_HAVE_VERBS)
  add_executable(kvpool-rdma-probe ${CMAKE_CURRENT_LIST_DIR}/rdma_probe.c)
  target_compile_options(kvpool-rdma-probe PRIVATE ${KVP_WARN})
  target_link_libraries(kvpool-rdma-probe kvpool_static ${KVP_DEP_LIBS})
  add_dependencies(kvpool-rdma-probe kvp_wire_gen)
endif()
