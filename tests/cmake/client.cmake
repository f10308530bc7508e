# Client module tests: the master session (actor) and the client library (integration).
kvp_add_test(test_msession SOURCES ${CMAKE_SOURCE_DIR}/tests/actor/test_msession.c LABEL actor TIMEOUT 60)
