# cmake -DSOURCE_DIR=<checkout> -DWORK=<dir> -DGENERATOR=<generator> -DCXX=<compiler>
#       [-DMAKE_PROGRAM=<path>] -P header_only_install.cmake
#
# The header-only install, as a user does it: configure a fresh tree where only a compiler and
# CMake count (GoogleTest and Google Benchmark hidden; libatomic_ops and <sys/sdt.h> left to be
# found, as on the build machine that used to bake them in), then `cmake --install` without
# building anything. Checks what the prefix holds, that nothing of the build machine's optional
# packages is in it, and the version file's rules. WORK/prefix is the fixture the consumer tests
# (install.find_package, install.pkg_config) build against.
cmake_minimum_required(VERSION 3.21)  # the policies a consumer of the package has
foreach(var SOURCE_DIR WORK GENERATOR CXX)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "pass -D${var}=...")
  endif()
endforeach()
set(build "${WORK}/build")
set(prefix "${WORK}/prefix")
file(REMOVE_RECURSE "${WORK}")

set(options -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX}"
    -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON -DCMAKE_DISABLE_FIND_PACKAGE_benchmark=ON)
if(MAKE_PROGRAM)
  list(APPEND options "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
execute_process(COMMAND "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${build}" ${options}
                RESULT_VARIABLE configured OUTPUT_VARIABLE out ERROR_VARIABLE out)
message("${out}")
if(NOT configured EQUAL 0)
  message(FATAL_ERROR "a plain configure without GoogleTest and Google Benchmark failed")
endif()
foreach(said "teardown: tests off: GTest not found" "teardown: benchmarks off: benchmark not found")
  string(FIND "${out}" "${said}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the configure did not say '${said}'")
  endif()
endforeach()

execute_process(COMMAND "${CMAKE_COMMAND}" --install "${build}" --prefix "${prefix}"
                RESULT_VARIABLE installed)
if(NOT installed EQUAL 0)
  message(FATAL_ERROR "cmake --install without a build failed: ${installed}")
endif()

foreach(expected
    include/teardown/teardown.hpp include/teardown/llist.hpp include/teardown/model/mm.hpp
    share/cmake/teardown/teardownConfig.cmake share/cmake/teardown/teardownConfigVersion.cmake
    share/cmake/teardown/teardownTargets.cmake share/cmake/teardown/FindAtomic_ops.cmake
    share/pkgconfig/teardown.pc)
  if(NOT EXISTS "${prefix}/${expected}")
    message(FATAL_ERROR "the header-only install lacks ${expected}")
  endif()
endforeach()
# Nothing was built, so no tool may be there (they install once built, component teardown_tools),
# nor the directories they would go to: no empty directory is left anywhere (tools/ installs with
# install(TARGETS ... OPTIONAL), whose destination CMake creates before it finds nothing to copy).
file(GLOB_RECURSE tools "${prefix}/*teardown-run*" "${prefix}/*teardown_shadow*")
if(tools)
  message(FATAL_ERROR "tools installed although none was built: ${tools}")
endif()
file(GLOB top RELATIVE "${prefix}" LIST_DIRECTORIES true "${prefix}/*")
if(NOT top STREQUAL "include;share")
  message(FATAL_ERROR "the header-only install holds '${top}', expected include and share only")
endif()
include("${CMAKE_CURRENT_LIST_DIR}/../no_empty_directory.cmake")
teardown_expect_no_empty_directory("${prefix}" "the header-only install")

# The build machine has libatomic_ops and <sys/sdt.h>; the package must not say so.
file(READ "${prefix}/share/pkgconfig/teardown.pc" pc)
file(READ "${prefix}/share/cmake/teardown/teardownTargets.cmake" targets)
foreach(file_and_text "teardown.pc|${pc}" "teardownTargets.cmake|${targets}")
  string(REGEX MATCH "^[^|]*" name "${file_and_text}")
  foreach(baked "atomic_ops" "TEARDOWN_HAVE_" "TEARDOWN_NO_")
    if(file_and_text MATCHES "\n[^#\n]*${baked}")
      message(FATAL_ERROR "${name} carries '${baked}' from the build machine:\n${file_and_text}")
    endif()
  endforeach()
endforeach()
if(pc MATCHES "\nRequires")
  message(FATAL_ERROR "teardown.pc requires another package:\n${pc}")
endif()

# The version file: 0.x-safe (0.1 is not 0.2) and architecture-independent (a 32-bit consumer
# may use it). Each case: requested version, then compatible or not.
function(check_version requested expected)
  set(PACKAGE_FIND_VERSION "${requested}")
  string(REPLACE "." ";" parts "${requested}")
  list(LENGTH parts PACKAGE_FIND_VERSION_COUNT)
  list(APPEND parts 0 0 0)
  list(GET parts 0 PACKAGE_FIND_VERSION_MAJOR)
  list(GET parts 1 PACKAGE_FIND_VERSION_MINOR)
  list(GET parts 2 PACKAGE_FIND_VERSION_PATCH)
  set(CMAKE_SIZEOF_VOID_P 4)
  include("${prefix}/share/cmake/teardown/teardownConfigVersion.cmake")
  if(PACKAGE_VERSION_UNSUITABLE)
    message(FATAL_ERROR "the version file refuses a 32-bit consumer (not ARCH_INDEPENDENT)")
  endif()
  if(NOT PACKAGE_VERSION_COMPATIBLE STREQUAL expected)
    message(FATAL_ERROR "version ${PACKAGE_VERSION} for a request of ${requested}: compatible "
                        "'${PACKAGE_VERSION_COMPATIBLE}', expected ${expected}")
  endif()
  message(STATUS "version ${PACKAGE_VERSION} for ${requested}: compatible ${expected}")
endfunction()
file(READ "${prefix}/share/cmake/teardown/teardownConfigVersion.cmake" version_file)
string(REGEX MATCH "set\\(PACKAGE_VERSION \"([0-9]+)\\.([0-9]+)\\.([0-9]+)\"\\)" _ "${version_file}")
set(major "${CMAKE_MATCH_1}")
set(minor "${CMAKE_MATCH_2}")
math(EXPR next_minor "${minor} + 1")
math(EXPR next_major "${major} + 1")
check_version("${major}.${minor}" TRUE)
check_version("${major}.${minor}.0" TRUE)
check_version("${next_major}.0" FALSE)
if(major EQUAL 0)
  # Before 1.0 each minor version is its own API.
  check_version("0.${next_minor}" FALSE)
  if(minor GREATER 0)
    math(EXPR previous_minor "${minor} - 1")
    check_version("0.${previous_minor}" FALSE)
  endif()
endif()
