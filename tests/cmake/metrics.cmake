# Metrics (issue 24): the metrics module and the tests' Prometheus format checker, then real
# kvpool-master and kvpool-segment processes scraped over HTTP.
kvp_add_test(test_metrics SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_metrics.c LABEL actor TIMEOUT 60)
if(EXISTS ${CMAKE_SOURCE_DIR}/tests/integration/test_metrics_cluster.c)
  kvp_add_test(test_metrics_cluster SOURCES ${CMAKE_SOURCE_DIR}/tests/integration/test_metrics_cluster.c
               LABEL integration TIMEOUT 180)
  add_dependencies(test_metrics_cluster kvpool-master kvpool-segment kvpoolctl)
endif()
