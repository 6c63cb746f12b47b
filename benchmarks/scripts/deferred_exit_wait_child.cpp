// The child of deferred_exit_wait.py: 0.45 GiB touched, then "deferred" resets a deferred_ptr and
// returns from main (the default domain's exit protocol drains it), "leak" never frees it (the
// kernel frees it at exit), "inline" deletes it. Writes one byte when main's work is done.
#include <teardown/deferred.hpp>
#include <unistd.h>

#include <cstring>
#include <vector>

int main(int argc, char** argv) {
  const std::size_t bytes = std::size_t{450} << 20;
  const char* mode = argc > 1 ? argv[1] : "deferred";
  if (std::strcmp(mode, "deferred") == 0) {
    auto big = teardown::make_deferred<std::vector<char>>(bytes, 'x');
    big.reset();
  } else if (std::strcmp(mode, "leak") == 0) {
    (void)new std::vector<char>(bytes, 'x');
  } else {
    delete new std::vector<char>(bytes, 'x');
  }
  (void)!write(1, "e", 1);  // the parent's clock starts here
  return 0;
}
