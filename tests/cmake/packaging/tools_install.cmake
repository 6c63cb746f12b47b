# cmake -DSOURCE_DIR=<checkout> -DWORK=<dir> -DGENERATOR=<generator> -DCXX=<compiler>
#       [-DMAKE_PROGRAM=<path>] -P tools_install.cmake
#
# The tools alone, as README.md says to install them: a plain configure (the tests configured
# where GoogleTest is installed, but not built), `cmake --build --target teardown-run
# teardown_shadow`, `cmake --install --component teardown_tools`. Checks that no test was built,
# that the prefix holds the two tools and nothing else, and that the installed teardown-run
# preloads the installed library.
cmake_minimum_required(VERSION 3.21)
foreach(var SOURCE_DIR WORK GENERATOR CXX)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "pass -D${var}=...")
  endif()
endforeach()
set(build "${WORK}/build")
set(prefix "${WORK}/prefix")
file(REMOVE_RECURSE "${WORK}")

set(options -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX}")
if(MAKE_PROGRAM)
  list(APPEND options "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
# run(<what> <command>...): runs it, stops with its output if it fails.
function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message("${out}")
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "${what} failed (${result})")
  endif()
endfunction()
run("the configure" "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${build}" ${options})
run("building the two tools" "${CMAKE_COMMAND}" --build "${build}" --target teardown-run teardown_shadow)
file(GLOB_RECURSE tests "${build}/tests/*_test")
if(tests)
  message(FATAL_ERROR "building the tools built tests too: ${tests}")
endif()
run("installing the teardown_tools component"
    "${CMAKE_COMMAND}" --install "${build}" --component teardown_tools --prefix "${prefix}")

file(GLOB_RECURSE installed RELATIVE "${prefix}" LIST_DIRECTORIES false "${prefix}/*")
list(SORT installed)
list(LENGTH installed count)
list(GET installed 0 run_path)
if(NOT count EQUAL 2 OR NOT run_path MATCHES "^bin/teardown-run$"
   OR NOT installed MATCHES ";lib[^;]*/libteardown_shadow\\.so$")
  message(FATAL_ERROR "the teardown_tools component installed '${installed}', expected "
                      "bin/teardown-run and lib.../libteardown_shadow.so only")
endif()
execute_process(COMMAND "${prefix}/bin/teardown-run" -- sh -c "echo \"$LD_PRELOAD\""
                RESULT_VARIABLE result OUTPUT_VARIABLE preload OUTPUT_STRIP_TRAILING_WHITESPACE)
list(GET installed 1 library)
string(FIND "${preload}" "${prefix}/${library}" at REVERSE)  # last in LD_PRELOAD
string(LENGTH "${preload}" preload_length)
string(LENGTH "${prefix}/${library}" library_length)
math(EXPR expected_at "${preload_length} - ${library_length}")
if(NOT result EQUAL 0 OR at EQUAL -1 OR NOT at EQUAL expected_at)
  message(FATAL_ERROR "the installed teardown-run (${result}) preloads '${preload}', expected "
                      "${prefix}/${library}")
endif()
message(STATUS "teardown_tools: ${installed}; teardown-run preloads ${preload}")
file(REMOVE_RECURSE "${WORK}")
