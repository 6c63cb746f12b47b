// A GCC -fsanitize=address program (libasan.so its first DT_NEEDED): it must start and end with
// its own status under teardown-run, run directly or by a program that teardown-run runs. It
// allocates, so that ASan's allocator runs.
//   (no argument)   prints "asan probe 1", returns 3
//   status N        the same, returns N
//   environment     the same, then "LD_PRELOAD=..." and "TEARDOWN_SHADOW_PRELOAD_ADDED=..." as the
//                   program sees them, which its children inherit ("-" for unset); returns 3
//   spawn CMD...    the same as no argument, then runs CMD (posix_spawnp, which ASan intercepts
//                   and forwards to the next definition) and waits; returns CMD's exit status
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>

int main(int argc, char** argv) {
  auto bytes = std::make_unique<char[]>(4096);
  bytes[4095] = 1;
  std::printf("asan probe %d\n", bytes[4095]);
  if (argc > 2 && std::strcmp(argv[1], "status") == 0) return std::atoi(argv[2]);
  if (argc > 1 && std::strcmp(argv[1], "environment") == 0) {
    for (const char* name : {"LD_PRELOAD", "TEARDOWN_SHADOW_PRELOAD_ADDED"}) {
      const char* value = std::getenv(name);
      std::printf("%s=%s\n", name, value != nullptr ? value : "-");
    }
  }
  if (argc > 2 && std::strcmp(argv[1], "spawn") == 0) {
    std::fflush(stdout);
    pid_t child = 0;
    int status = 0;
    if (posix_spawnp(&child, argv[2], nullptr, nullptr, argv + 2, environ) != 0) return 4;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status)) return 5;
    return WEXITSTATUS(status);
  }
  return 3;
}
