// The host of process_plugin (process_boundary_test): dlopen()s the plugin named by argv[1],
// lets it enable shadow teardown, prints the helper's pid, dlclose()s the plugin and runs on
// (maps and touches fresh memory, which may land where the plugin was), then exits normally.
// Its exit closes the helper's pipe: the helper wakes up in whatever is mapped where its code
// was. Exit codes: 0 as planned; 2 dlopen, 3 dlsym, 4 the plugin could not enable, 5 dlclose.
#include <dlfcn.h>
#include <sys/mman.h>

#include <cstdio>
#include <cstring>
#include <iostream>

int main(int argc, char** argv) {
  if (argc != 2) return 1;
  void* const plugin = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (plugin == nullptr) {
    std::fprintf(stderr, "dlopen: %s\n", dlerror());
    return 2;
  }
  void* const symbol = dlsym(plugin, "teardown_plugin_enable_shadow_teardown");
  if (symbol == nullptr) return 3;
  int (*enable)() noexcept = nullptr;
  std::memcpy(&enable, &symbol, sizeof enable);
  const int helper = enable();
  if (helper <= 0) return 4;
  // Through libstdc++, so that the host itself needs it: loaded with the plugin instead, it
  // would bind some of its symbols to the plugin's copies, and glibc would never unload the plugin.
  std::cout << helper << std::endl;
  if (dlclose(plugin) != 0) return 5;
  for (int i = 0; i < 16; ++i) {
    const std::size_t size = std::size_t{1} << 20;
    void* const memory = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory != MAP_FAILED) std::memset(memory, 0xcc, size);
  }
  return 0;
}
