# The client's object checksum (actors/client/checksum.c, checksum_avx2.c).
kvp_add_test(test_client_checksum SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_client_checksum.c LABEL unit TIMEOUT 30)
