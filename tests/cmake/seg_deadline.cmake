# The segment server's WRITE receive against a raw, paced TCP client (write deadline, C3).
kvp_add_test(test_seg_write_deadline SOURCES ${CMAKE_SOURCE_DIR}/tests/actor/test_seg_write_deadline.c LABEL actor TIMEOUT 60)
