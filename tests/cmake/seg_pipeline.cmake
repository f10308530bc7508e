# The segment server's answers to requests pipelined on one connection (batched answers, order).
kvp_add_test(test_seg_pipeline SOURCES ${CMAKE_SOURCE_DIR}/tests/actor/test_seg_pipeline.c LABEL actor TIMEOUT 60)
