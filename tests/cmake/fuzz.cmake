# Wire fuzz targets (tests/fuzz/). For every normal build: a `fuzz`-labelled ctest per target
# (<target>_replay) that links the target's LLVMFuzzerTestOneInput with tests/fuzz/fuzz_driver.c
# (replays tests/fuzz/corpus/<target>/ plus a few thousand deterministic mutations).
# With -DKVP_FUZZ=ON (CC=clang): the libFuzzer binaries themselves; scripts/fuzz.sh runs them.
# kvp-fuzz-gen-seeds regenerates the seed corpus (see tests/fuzz/gen_seeds.c).
set(KVP_WIRE_FUZZ_TARGETS fuzz_wire_request fuzz_wire_response fuzz_wire_command_batch fuzz_frame
    fuzz_wire_rdma_hello)

if(KVP_FUZZ AND NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "KVP_FUZZ=ON needs clang (libFuzzer): configure with CC=clang")
endif()

add_executable(kvp-fuzz-gen-seeds ${CMAKE_SOURCE_DIR}/tests/fuzz/gen_seeds.c)
target_compile_options(kvp-fuzz-gen-seeds PRIVATE ${KVP_WARN})
target_link_libraries(kvp-fuzz-gen-seeds PRIVATE kvpool_static ${KVP_DEP_LIBS})

foreach(T ${KVP_WIRE_FUZZ_TARGETS})
  kvp_add_test(${T}_replay
    SOURCES ${CMAKE_SOURCE_DIR}/tests/fuzz/${T}.c ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_driver.c
    LABEL fuzz TIMEOUT 120)
  target_compile_definitions(${T}_replay PRIVATE KVP_FUZZ_NAME="${T}")
  if(KVP_FUZZ)
    # wire/envelope.c is compiled into the fuzzer itself so libFuzzer gets coverage of the
    # envelope checks (libkvpool is not built with -fsanitize=fuzzer-no-link); the generated
    # descriptors come from kvp_wire_pb; nothing else but libprotobuf-c is linked, so other
    # modules need not build with clang for these targets.
    add_executable(${T} ${CMAKE_SOURCE_DIR}/tests/fuzz/${T}.c ${CMAKE_SOURCE_DIR}/wire/envelope.c
                        ${CMAKE_SOURCE_DIR}/wire/rdma_hello.c $<TARGET_OBJECTS:kvp_wire_pb>)
    add_dependencies(${T} kvp_wire_gen)
    target_compile_options(${T} PRIVATE -fsanitize=fuzzer,address,undefined -fno-omit-frame-pointer)
    target_link_options(${T} PRIVATE -fsanitize=fuzzer,address,undefined)
    target_link_libraries(${T} PRIVATE ${KVP_DEP_LIBS})
  endif()
endforeach()

# The data-plane token response a segment reads first on a connection (auth/auth_token.c;
# issue 25 item 2). Not a wire-protobuf target: it needs libsodium and auth_token.c.
kvp_add_test(fuzz_dt_response_replay
  SOURCES ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_dt_response.c ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_driver.c
  LABEL fuzz TIMEOUT 120)
target_compile_definitions(fuzz_dt_response_replay PRIVATE KVP_FUZZ_NAME="fuzz_dt_response")
set_tests_properties(fuzz_dt_response_replay PROPERTIES LABELS "fuzz;auth")
if(KVP_FUZZ)
  add_executable(fuzz_dt_response ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_dt_response.c ${CMAKE_SOURCE_DIR}/auth/auth_token.c)
  target_compile_options(fuzz_dt_response PRIVATE -fsanitize=fuzzer,address,undefined -fno-omit-frame-pointer)
  target_link_options(fuzz_dt_response PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_dt_response PRIVATE ${KVP_DEP_LIBS})
endif()
