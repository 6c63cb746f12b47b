# cmake -DSOURCE_DIR=<checkout> -DPREFIX=<install prefix> -DWORK=<dir> -DGENERATOR=<generator>
#       -DCXX=<compiler> [-DMAKE_PROGRAM=<path>] -P find_package_components.cmake
#
# Components that teardown does not have, asked of the installed package: REQUIRED COMPONENTS
# stops the configure with a message that names each of them; COMPONENTS alone leaves
# teardown_FOUND false; OPTIONAL_COMPONENTS finds the package and not them
# (find_package_components/ checks the variables).
cmake_minimum_required(VERSION 3.21)
foreach(var SOURCE_DIR PREFIX WORK GENERATOR CXX)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "pass -D${var}=...")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK}")
set(options -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX}" "-DCMAKE_PREFIX_PATH=${PREFIX}")
if(MAKE_PROGRAM)
  list(APPEND options "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()

foreach(mode required not_required optional)
  execute_process(
    COMMAND "${CMAKE_COMMAND}" -S "${SOURCE_DIR}/tests/cmake/packaging/find_package_components"
            -B "${WORK}/${mode}" ${options} "-DMODE=${mode}"
    RESULT_VARIABLE configured OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message("${out}")
  string(REGEX REPLACE "[ \n]+" " " flat "${out}")  # CMake wraps its messages
  if(mode STREQUAL "required")
    if(configured EQUAL 0)
      message(FATAL_ERROR "REQUIRED COMPONENTS atomic_ops_typo bogus: the configure went on")
    endif()
    string(FIND "${flat}" "teardown has no component atomic_ops_typo, bogus" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "REQUIRED COMPONENTS atomic_ops_typo bogus failed without naming them")
    endif()
  elseif(NOT configured EQUAL 0)
    message(FATAL_ERROR "${mode}: the configure failed")
  endif()
  message(STATUS "${mode}: as expected")
endforeach()
file(REMOVE_RECURSE "${WORK}")
