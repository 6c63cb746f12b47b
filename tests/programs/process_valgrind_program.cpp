// Run under valgrind by process_boundary_test (built twice: with valgrind's header, and with
// TEARDOWN_NO_VALGRIND_H, where only the mappings tell). valgrind cannot run the helper; the
// program must get std::system_error and run on. Prints one line and exits 0 either way:
//   "enabled <pid>"             not under valgrind (then it disables again)
//   "refused <errno> <what>"    enable_shadow_teardown threw std::system_error
// Anything else exits 1.
#include "teardown/process.hpp"

#include <cstdio>
#include <exception>

int main() {
  try {
    const pid_t helper = teardown::process::enable_shadow_teardown();
    std::printf("enabled %d\n", static_cast<int>(helper));
    teardown::process::disable_shadow_teardown();
  } catch (const std::system_error& e) {
    std::printf("refused %d %s\n", e.code().value(), e.what());
  } catch (const std::exception& e) {
    std::printf("threw %s\n", e.what());
    return 1;
  }
  return 0;
}
