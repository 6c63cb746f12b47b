# cmake -DSOURCE_DIR=<checkout> -DPREFIX=<install prefix> -DWORK=<dir> -DGENERATOR=<generator>
#       -DCXX=<compiler> [-DMAKE_PROGRAM=<path>] [-DATOMIC_OPS=ON] -P same_interface.cmake
#
# One library, one interface: tests/cmake/same_interface configured by add_subdirectory, by
# FetchContent and by find_package (on PREFIX, a `cmake --install` of the checkout), each writing
# what teardown::teardown hands its consumer (compile definitions, options and features, link
# items). The three must be the same: the optional dependencies follow one rule in every route.
# ATOMIC_OPS=ON compares the routes' opt-in to libatomic_ops instead (TEARDOWN_WITH_ATOMIC_OPS=ON,
# COMPONENTS atomic_ops), which must also be the same, and name libatomic_ops.
cmake_minimum_required(VERSION 3.21)
foreach(var SOURCE_DIR PREFIX WORK GENERATOR CXX)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "pass -D${var}=...")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK}")

set(options -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX}" "-DTEARDOWN_SOURCE_DIR=${SOURCE_DIR}"
    "-DCMAKE_PREFIX_PATH=${PREFIX}" "-DATOMIC_OPS=${ATOMIC_OPS}" --no-warn-unused-cli)
if(MAKE_PROGRAM)
  list(APPEND options "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()

set(first "")
foreach(route add_subdirectory fetchcontent find_package)
  execute_process(
    COMMAND "${CMAKE_COMMAND}" -S "${SOURCE_DIR}/tests/cmake/same_interface" -B "${WORK}/${route}"
            ${options} "-DROUTE=${route}" "-DOUT=${WORK}/${route}.txt"
    RESULT_VARIABLE configured OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT configured EQUAL 0)
    message(FATAL_ERROR "the ${route} consumer did not configure:\n${out}")
  endif()
  file(READ "${WORK}/${route}.txt" interface)
  message(STATUS "${route}:\n${interface}")
  if(first STREQUAL "")
    set(first "${route}")
    set(expected "${interface}")
  elseif(NOT interface STREQUAL expected)
    message(FATAL_ERROR "teardown::teardown differs between routes:\n-- ${first}:\n${expected}"
                        "-- ${route}:\n${interface}")
  endif()
endforeach()

if(ATOMIC_OPS)
  if(NOT expected MATCHES "TEARDOWN_HAVE_ATOMIC_OPS=1" OR NOT expected MATCHES "Atomic_ops::atomic_ops")
    message(FATAL_ERROR "the opt-in to libatomic_ops neither defines TEARDOWN_HAVE_ATOMIC_OPS nor "
                        "links it:\n${expected}")
  endif()
elseif(expected MATCHES "ATOMIC_OPS|SDT")
  message(FATAL_ERROR "without an opt-in, teardown::teardown still decides:\n${expected}")
endif()
message(STATUS "the same in every route")
file(REMOVE_RECURSE "${WORK}")
