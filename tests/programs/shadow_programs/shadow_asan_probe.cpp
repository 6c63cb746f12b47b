// A GCC -fsanitize=address program (libasan.so its first DT_NEEDED): it must start and end with
// its own status under teardown-run. It allocates, so that ASan's allocator runs.
#include <cstdio>
#include <memory>

int main() {
  auto bytes = std::make_unique<char[]>(4096);
  bytes[4095] = 1;
  std::printf("asan probe %d\n", bytes[4095]);
  return 3;
}
