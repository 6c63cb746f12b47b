# cmake -DSOURCE_DIR=<checkout> -DWORK=<dir> -P tests_need_gtest.cmake
#
# A plain configure builds without GoogleTest; the presets that run tests must not. Checks that
# every test preset's configure preset sets TEARDOWN_BUILD_TESTS to ON (itself or through what it
# inherits), and that the default preset, with GoogleTest hidden, stops the configure and names
# the package.
cmake_minimum_required(VERSION 3.21)  # the policies a consumer of the package has
foreach(var SOURCE_DIR WORK)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "pass -D${var}=...")
  endif()
endforeach()
file(READ "${SOURCE_DIR}/CMakePresets.json" presets)

# tests_option(<configure preset> <out>): TEARDOWN_BUILD_TESTS as the preset resolves it (its own
# value, else the first of its inherits' that has one).
function(tests_option name out)
  string(JSON count LENGTH "${presets}" configurePresets)
  math(EXPR last "${count} - 1")
  foreach(i RANGE ${last})
    string(JSON this GET "${presets}" configurePresets ${i} name)
    if(NOT this STREQUAL name)
      continue()
    endif()
    string(JSON value ERROR_VARIABLE missing GET "${presets}" configurePresets ${i}
           cacheVariables TEARDOWN_BUILD_TESTS)
    if(NOT missing)
      set(${out} "${value}" PARENT_SCOPE)
      return()
    endif()
    string(JSON type ERROR_VARIABLE none TYPE "${presets}" configurePresets ${i} inherits)
    set(parents "")
    if(type STREQUAL "ARRAY")
      string(JSON n LENGTH "${presets}" configurePresets ${i} inherits)
      math(EXPR n_last "${n} - 1")
      foreach(j RANGE ${n_last})
        string(JSON parent GET "${presets}" configurePresets ${i} inherits ${j})
        list(APPEND parents "${parent}")
      endforeach()
    elseif(type STREQUAL "STRING")
      string(JSON parents GET "${presets}" configurePresets ${i} inherits)
    endif()
    foreach(parent IN LISTS parents)
      tests_option("${parent}" value)
      if(NOT value STREQUAL "")
        set(${out} "${value}" PARENT_SCOPE)
        return()
      endif()
    endforeach()
  endforeach()
  set(${out} "" PARENT_SCOPE)
endfunction()

string(JSON count LENGTH "${presets}" testPresets)
math(EXPR last "${count} - 1")
foreach(i RANGE ${last})
  string(JSON hidden ERROR_VARIABLE visible GET "${presets}" testPresets ${i} hidden)
  if(hidden STREQUAL "ON")
    continue()
  endif()
  string(JSON name GET "${presets}" testPresets ${i} name)
  string(JSON configure GET "${presets}" testPresets ${i} configurePreset)
  tests_option("${configure}" value)
  if(NOT value STREQUAL "ON")
    message(FATAL_ERROR "test preset '${name}' configures with '${configure}', whose "
                        "TEARDOWN_BUILD_TESTS is '${value}', not ON: it would pass without tests")
  endif()
  message(STATUS "test preset ${name}: configure preset ${configure}, TEARDOWN_BUILD_TESTS=ON")
endforeach()

file(REMOVE_RECURSE "${WORK}")
execute_process(COMMAND "${CMAKE_COMMAND}" --preset default -B "${WORK}"
                        -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON
                WORKING_DIRECTORY "${SOURCE_DIR}"
                RESULT_VARIABLE configured OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(configured EQUAL 0)
  message(FATAL_ERROR "the default preset configured without GoogleTest:\n${out}")
endif()
string(REGEX REPLACE "[ \n]+" " " flat "${out}")  # CMake wraps its error messages
string(FIND "${flat}" "TEARDOWN_BUILD_TESTS is ON but GTest was not found" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the default preset failed without GoogleTest, but not for that:\n${out}")
endif()
message(STATUS "the default preset without GoogleTest stops: TEARDOWN_BUILD_TESTS is ON but GTest was not found")
file(REMOVE_RECURSE "${WORK}")
