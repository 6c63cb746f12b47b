# cmake -DBUILD_DIR=<teardown build> -DSTAGING=<prefix> -P stage_install.cmake
# Installs teardown into a fresh staging prefix so the
# find_package and pkg-config consumers see exactly what `cmake --install` produces.
file(REMOVE_RECURSE "${STAGING}")
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${STAGING}"
                RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "cmake --install failed: ${result}")
endif()
foreach(expected
    "include/teardown/llist.hpp"
    "share/cmake/teardown/teardownConfig.cmake"
    "share/cmake/teardown/teardownConfigVersion.cmake"
    "share/cmake/teardown/teardownTargets.cmake"
    "share/pkgconfig/teardown.pc")
  if(NOT EXISTS "${STAGING}/${expected}")
    message(FATAL_ERROR "the install is missing ${expected}")
  endif()
endforeach()
# Whether this build's tools were built or not, the install leaves no empty directory.
include("${CMAKE_CURRENT_LIST_DIR}/no_empty_directory.cmake")
teardown_expect_no_empty_directory("${STAGING}" "the install")
