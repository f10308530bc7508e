kvp_add_test(test_config SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_config.c LABEL unit TIMEOUT 30)
# The example program and kvpoolctl's data commands against a local cluster (examples/run_example.sh).
add_test(NAME test_example_and_data_cli_cluster_bytes_verified
         COMMAND bash ${CMAKE_SOURCE_DIR}/examples/run_example.sh)
set_tests_properties(test_example_and_data_cli_cluster_bytes_verified PROPERTIES TIMEOUT 120
  LABELS integration ENVIRONMENT "KVP_BUILD_DIR=${CMAKE_BINARY_DIR};KVP_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
