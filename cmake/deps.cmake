# Dependencies: all Debian packages, found through pkg-config. A missing one stops
# the configure step with the package to install (scripts/install-deps.sh installs all).
find_package(PkgConfig)
if(NOT PKG_CONFIG_FOUND)
  message(FATAL_ERROR "pkg-config not found: apt-get install pkg-config (or run scripts/install-deps.sh)")
endif()

set(KVP_DEP_LIBS "")
set(KVP_DEP_INCS "")
# kvp_require(<pkg-config name> <debian package>)
macro(kvp_require PCNAME DEBPKG)
  string(TOUPPER "${PCNAME}" _v)
  string(REPLACE "-" "_" _v "${_v}")
  pkg_check_modules(KVPDEP_${_v} QUIET ${PCNAME})
  if(NOT KVPDEP_${_v}_FOUND)
    message(FATAL_ERROR "missing dependency '${PCNAME}': apt-get install ${DEBPKG} (or run scripts/install-deps.sh)")
  endif()
  list(APPEND KVP_DEP_LIBS ${KVPDEP_${_v}_LINK_LIBRARIES})
  list(APPEND KVP_DEP_INCS ${KVPDEP_${_v}_INCLUDE_DIRS})
endmacro()

kvp_require(libczmq libczmq-dev)
kvp_require(libzmq libzmq3-dev)
kvp_require(libsodium libsodium-dev)  # Ed25519 data-plane tokens (auth/auth_token.c)
kvp_require(raft libraft-dev)
kvp_require(libuv libuv1-dev)
kvp_require(liblz4 liblz4-dev)
kvp_require(libprotobuf-c libprotobuf-c-dev)
kvp_require(jansson libjansson-dev)
kvp_require(libxxhash libxxhash-dev)
kvp_require(libmicrohttpd libmicrohttpd-dev)   # the /metrics endpoint (metrics/)
find_program(PROTOC_C protoc-c)
if(NOT PROTOC_C)
  message(FATAL_ERROR "protoc-c not found: apt-get install protobuf-c-compiler")
endif()
if(KVP_TESTS)
  pkg_check_modules(CMOCKA QUIET cmocka)
  if(NOT CMOCKA_FOUND)
    message(FATAL_ERROR "missing dependency 'cmocka': apt-get install libcmocka-dev")
  endif()
endif()
# RDMA (issue 20, docs/rdma.md): optional. With rdma-core's libibverbs (Debian libibverbs-dev)
# the verbs ops table (actors/transfer/rdma/), the verbs test double (tests/lib/fakeverbs.c) and
# their tests are built, with -Werror against the real headers; without it they are left out
# and kvpool is TCP only. -DKVP_RDMA=OFF leaves them out on purpose.
option(KVP_RDMA "Build the RDMA verbs layer when libibverbs is found" ON)
set(KVP_HAVE_VERBS OFF)
set(KVP_PC_VERBS "")   # kvpool.pc Requires.private, for static linking
if(KVP_RDMA)
  pkg_check_modules(KVPDEP_LIBIBVERBS QUIET libibverbs)
  if(KVPDEP_LIBIBVERBS_FOUND)
    set(KVP_HAVE_VERBS ON)
    set(KVP_PC_VERBS " libibverbs")
    add_compile_definitions(KVP_HAVE_VERBS=1)
    list(APPEND KVP_DEP_LIBS ${KVPDEP_LIBIBVERBS_LINK_LIBRARIES})
    list(APPEND KVP_DEP_INCS ${KVPDEP_LIBIBVERBS_INCLUDE_DIRS})
  else()
    message(STATUS "libibverbs not found (apt-get install libibverbs-dev): RDMA verbs layer not built")
  endif()
endif()
find_package(Threads REQUIRED)
list(APPEND KVP_DEP_LIBS Threads::Threads m ${CMAKE_DL_LIBS})  # dl: devmem.c loads the CUDA driver if present
include_directories(${KVP_DEP_INCS})

set_property(GLOBAL PROPERTY KVP_MODULE_OBJECTS "")
# kvp_module(NAME src...): an object library with our warnings; its objects go into libkvpool.
function(kvp_module NAME)
  add_library(${NAME} OBJECT ${ARGN})
  target_compile_options(${NAME} PRIVATE ${KVP_WARN})
  set_property(GLOBAL APPEND PROPERTY KVP_MODULE_OBJECTS $<TARGET_OBJECTS:${NAME}>)
endfunction()

# kvp_add_test(NAME SOURCES src... LABEL l [TIMEOUT s]): one cmocka binary, linked to libkvpool
# statically and the test helpers in tests/lib, registered with CTest.
function(kvp_add_test NAME)
  cmake_parse_arguments(T "" "LABEL;TIMEOUT" "SOURCES" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  # A limit is set for a RelWithDebInfo build. Sanitizer builds run the same work several times
  # slower (TSan 5-15x on this code, ASan about 2x), and on a loaded 2-core CI machine the TSan
  # stage's test_xfer_tcp, test_fence_client and test_client_fakemaster passed alone but hit
  # their limits at load 35-45: scale the limit, not the work the test checks.
  if(KVP_TSAN)
    math(EXPR T_TIMEOUT "${T_TIMEOUT} * 3")
  elseif(KVP_SANITIZE)
    math(EXPR T_TIMEOUT "${T_TIMEOUT} * 2")
  endif()
  add_executable(${NAME} ${T_SOURCES})
  target_compile_options(${NAME} PRIVATE ${KVP_WARN})
  target_link_libraries(${NAME} PRIVATE kvp_testlib kvpool_static ${CMOCKA_LINK_LIBRARIES} ${KVP_DEP_LIBS})
  add_test(NAME ${NAME} COMMAND ${NAME})
  set_tests_properties(${NAME} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS ${T_LABEL}
    ENVIRONMENT "KVP_BUILD_DIR=${CMAKE_BINARY_DIR};KVP_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
endfunction()
