# segment_prefault's guards (host memory, memory cgroup) and the hugetlb region (actors/segment/).
kvp_add_test(test_seg_prefault SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_seg_prefault.c LABEL unit TIMEOUT 30)
# Its cgroup guard (actors/segment/memcg.c), on cgroup trees built in a temporary directory.
kvp_add_test(test_seg_memcg SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_seg_memcg.c LABEL unit TIMEOUT 30)
# A real memory cgroup below global_segment_size: the prefault stops, no OOM kill (root; skipped
# without a writable memory cgroup).
add_test(NAME test_seg_memcg_limit COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/seg_memcg.sh)
set_tests_properties(test_seg_memcg_limit PROPERTIES TIMEOUT 60 LABELS integration
  SKIP_RETURN_CODE 77 ENVIRONMENT "KVP_BUILD_DIR=${CMAKE_BINARY_DIR};KVP_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
# A segment on hugetlb pages, reserved for the test (root; RUN_SERIAL so that no other test's
# segment takes them; skipped without root or when the kernel does not give the pages).
add_test(NAME test_seg_hugetlb COMMAND bash ${CMAKE_SOURCE_DIR}/tests/integration/seg_hugetlb.sh)
set_tests_properties(test_seg_hugetlb PROPERTIES TIMEOUT 60 LABELS integration RUN_SERIAL TRUE
  SKIP_RETURN_CODE 77 ENVIRONMENT "KVP_BUILD_DIR=${CMAKE_BINARY_DIR};KVP_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
