# kvpool-bench: trace replay (main job), offline bounds, kv / metadata benchmarks. docs/bench.md.
# Sources listed explicitly: tools/bench/bench_runtime.c belongs to another target.
set(KVP_BENCH_SRC
  ${CMAKE_CURRENT_LIST_DIR}/bench_main.c
  ${CMAKE_CURRENT_LIST_DIR}/bench_trace.c
  ${CMAKE_CURRENT_LIST_DIR}/bench_tracefile.c
  ${CMAKE_CURRENT_LIST_DIR}/bench_bounds.c
  ${CMAKE_CURRENT_LIST_DIR}/bench_util.c
  ${CMAKE_CURRENT_LIST_DIR}/bench_cpu.c
  ${CMAKE_CURRENT_LIST_DIR}/bench_cluster.c
  ${CMAKE_CURRENT_LIST_DIR}/bench_kv.c
  ${CMAKE_CURRENT_LIST_DIR}/bench_kernel.c
  ${CMAKE_CURRENT_LIST_DIR}/bench_meta.c
  ${CMAKE_CURRENT_LIST_DIR}/bench_meta_pipe.c)
add_executable(kvpool-bench ${KVP_BENCH_SRC})
target_compile_options(kvpool-bench PRIVATE ${KVP_WARN})
target_link_libraries(kvpool-bench kvpool_static ${KVP_DEP_LIBS})
add_dependencies(kvpool-bench kvp_wire_gen)
