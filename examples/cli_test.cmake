# One command-line check of an example, for ctest: runs PROGRAM with ARGS (one string, split
# like a shell would) and requires exit status STATUS; with STATUS 0, stdout must begin with
# "usage: " (the --help text) and stderr be empty; otherwise stderr must name the program and
# stdout be empty (nothing ran).
#   cmake -DPROGRAM=<path> -DNAME=<example> "-DARGS=--reps -1" -DSTATUS=2 -P cli_test.cmake
separate_arguments(arguments UNIX_COMMAND "${ARGS}")
execute_process(COMMAND "${PROGRAM}" ${arguments}
  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 20)
message(STATUS "${NAME} ${ARGS}: exit ${status}\n-- stdout:\n${out}-- stderr:\n${err}")
if(NOT "${status}" STREQUAL "${STATUS}")
  message(FATAL_ERROR "${NAME} ${ARGS}: exit status ${status}, expected ${STATUS}")
endif()
if(STATUS EQUAL 0)
  if(NOT out MATCHES "^usage: ${NAME} " OR NOT out MATCHES "--help" OR NOT err STREQUAL "")
    message(FATAL_ERROR "${NAME} ${ARGS}: expected the usage on stdout and nothing on stderr")
  endif()
elseif(NOT err MATCHES "^${NAME}: " OR NOT out STREQUAL "")
  message(FATAL_ERROR "${NAME} ${ARGS}: expected one refusal on stderr, naming the program, and no output")
endif()
