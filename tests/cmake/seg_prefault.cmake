# segment_prefault's memory guard (actors/segment/segment.c kvp_seg_prefault_allow).
kvp_add_test(test_seg_prefault SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_seg_prefault.c LABEL unit TIMEOUT 30)
