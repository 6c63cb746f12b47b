# teardown_expect_no_empty_directory(<root> <what>): stops the script, naming the directory, if
# anything below <root> is an empty directory (an install that made a destination for files it
# did not have: tools/ installs its targets with install(TARGETS ... OPTIONAL), whose destination
# CMake creates regardless). Included by the install checks run with cmake -P.
function(teardown_expect_no_empty_directory root what)
  file(GLOB_RECURSE entries LIST_DIRECTORIES true "${root}/*")
  foreach(entry IN LISTS entries)
    file(GLOB children LIST_DIRECTORIES true "${entry}/*" "${entry}/.*")
    if(IS_DIRECTORY "${entry}" AND NOT children)
      message(FATAL_ERROR "${what} left an empty directory: ${entry}")
    endif()
  endforeach()
endfunction()
