kvp_add_test(test_wire SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_wire.c LABEL unit TIMEOUT 60)
