# cmake -DBUILD_DIR=<strict build> -DTARGET=<target> [-DCONFIG=<type>] [-DRUN=<program>] -P build.cmake
# Builds one target of the strict consumer (a header's translation unit, or the instantiation
# program) and, with RUN, runs the program. Fails on the first compiler warning (-Werror).
execute_process(COMMAND "${CMAKE_COMMAND}" --build "${BUILD_DIR}" --target "${TARGET}" --config "${CONFIG}"
                RESULT_VARIABLE built)
if(NOT built EQUAL 0)
  message(FATAL_ERROR "${TARGET} does not build warning-free (see the compiler output above)")
endif()
if(RUN)
  execute_process(COMMAND "${RUN}" RESULT_VARIABLE ran)
  if(NOT ran EQUAL 0)
    message(FATAL_ERROR "${RUN} failed: ${ran}")
  endif()
endif()
