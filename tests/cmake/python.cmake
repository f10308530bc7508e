# The Python binding's tests (python/tests/, pytest from Debian's python3-pytest) against real
# local clusters started by the tests (`kvpoolctl cluster up`). Run with the interpreter the
# module was built for (KVP_PYTHON_EXECUTABLE: /usr/bin/python3 on Debian). Any non-zero pytest
# exit fails the test, including 5 (no tests collected) and a missing pytest module.
if(TARGET kvpool_python)
  foreach(T store failover drain devmem alias robust)
    add_test(NAME test_python_${T}
             COMMAND ${KVP_PYTHON_EXECUTABLE} -m pytest -q -p no:cacheprovider -o addopts=
                     ${CMAKE_SOURCE_DIR}/python/tests/test_${T}.py)
    set_tests_properties(test_python_${T} PROPERTIES
      LABELS "python;integration" TIMEOUT 240
      ENVIRONMENT "KVP_BUILD_DIR=${CMAKE_BINARY_DIR};PYTHONDONTWRITEBYTECODE=1")
  endforeach()
  # cmake --install and the offline wheel (python/tests/install_check.sh)
  add_test(NAME test_python_install COMMAND ${CMAKE_SOURCE_DIR}/python/tests/install_check.sh)
  set_tests_properties(test_python_install PROPERTIES
    LABELS "python;integration" TIMEOUT 300
    ENVIRONMENT "KVP_BUILD_DIR=${CMAKE_BINARY_DIR};KVP_PYTHON=${KVP_PYTHON_EXECUTABLE}")
  # examples/python/run.sh: the README's example (local cluster + hicache_example.py)
  add_test(NAME test_python_example COMMAND ${CMAKE_SOURCE_DIR}/examples/python/run.sh)
  set_tests_properties(test_python_example PROPERTIES
    LABELS "python;integration" TIMEOUT 120
    ENVIRONMENT "KVP_BUILD_DIR=${CMAKE_BINARY_DIR};KVP_PYTHON=${KVP_PYTHON_EXECUTABLE}")
endif()
