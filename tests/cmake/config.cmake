kvp_add_test(test_config SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_config.c LABEL unit TIMEOUT 30)
