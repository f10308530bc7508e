# The segment server's WRITE receive against a raw, paced TCP client (write deadline, C3).
kvp_add_test(test_seg_write_deadline SOURCES ${CMAKE_SOURCE_DIR}/tests/actor/test_seg_write_deadline.c LABEL actor TIMEOUT 60)
# Range verification (issue 21): a real segment checksums ranges of its region on the fake
# master's ask (HeartbeatResp.verify), refuses ranges outside it, splits a large one across beats.
kvp_add_test(test_seg_verify SOURCES ${CMAKE_SOURCE_DIR}/tests/actor/test_seg_verify.c LABEL actor TIMEOUT 60)
# The segment's range-verify queue alone (seg_verify.h): stepped hashing, refusals, bounds.
kvp_add_test(test_seg_verify_queue SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_seg_verify_queue.c LABEL unit TIMEOUT 30)
