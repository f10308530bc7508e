# Runtime (actor) tests: label `actor`; they also run under ASan+UBSan and TSan.
foreach(T order timeout close supervision supervisor hosted watch)
  if(EXISTS ${CMAKE_SOURCE_DIR}/tests/actor/test_runtime_${T}.c)
    kvp_add_test(test_runtime_${T} SOURCES ${CMAKE_SOURCE_DIR}/tests/actor/test_runtime_${T}.c
                 LABEL actor TIMEOUT 60)
  endif()
endforeach()
# Pure runtime pieces and API misuse: label `unit`.
foreach(T containers api err)
  kvp_add_test(test_runtime_${T} SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_runtime_${T}.c
               LABEL unit TIMEOUT 60)
endforeach()
# The spawn ownership rule under injected eventfd/pthread_create failures (link-time wraps).
kvp_add_test(test_runtime_spawn_fail SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_runtime_spawn_fail.c
             LABEL unit TIMEOUT 60)
target_link_options(test_runtime_spawn_fail PRIVATE -Wl,--wrap=eventfd -Wl,--wrap=pthread_create)
