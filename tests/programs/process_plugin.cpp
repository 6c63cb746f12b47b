// A plugin that enables shadow teardown (process_boundary_test): its host dlopen()s it, calls
// this, and dlclose()s it while the helper, which runs code of this object, lives on.
#include "teardown/process.hpp"

extern "C" __attribute__((visibility("default"))) int teardown_plugin_enable_shadow_teardown() noexcept {
  try {
    return static_cast<int>(teardown::process::enable_shadow_teardown());
  } catch (...) {
    return -1;
  }
}
