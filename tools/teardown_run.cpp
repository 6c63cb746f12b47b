// teardown-run — runs a program with shadow teardown (teardown/process.hpp), unmodified:
//
//     teardown-run [--nice N] [--idle] [--] PROGRAM [ARG...]
//
// puts libteardown_shadow.so last in LD_PRELOAD (after what was there: a user's libasan, jemalloc,
// tcmalloc or libfaketime keeps its place and its precedence in symbol lookup), sets
// TEARDOWN_SHADOW_NICE / TEARDOWN_SHADOW_IDLE from the options, and execvp()s PROGRAM, which
// then keeps this process's pid. The library is found relative to this executable's real path
// (/proc/self/exe), the way it was installed (<bindir>/<relative path to libdir>), so an install
// prefix that is moved or copied keeps working; in a build tree, beside it.
//
// Sanitizer runtimes (sanitizer_runtime.hpp): GCC's AddressSanitizer (libasan.so, and
// libhwasan.so) refuses to start unless its runtime is the first object after the executable
// ("ASan runtime does not come first in initial library list"), and a program built with
// -fsanitize=address names it as a DT_NEEDED entry, which every LD_PRELOAD object precedes. So
// when PROGRAM is such an executable (read from its ELF dynamic section; a "#!" script is followed
// to its interpreter) and LD_PRELOAD does not name that runtime first already, the runtime goes
// first, by the name PROGRAM needs it by (the loader finds it as it would have, PROGRAM's RUNPATH
// included), and TEARDOWN_SHADOW_PRELOAD_ADDED tells the library to take it off LD_PRELOAD again
// once loaded, so that PROGRAM's children do not inherit it. ASAN_OPTIONS is left alone: with the
// runtime first, the link order ASan verifies is the one it wants. This launcher inspects PROGRAM
// (it is not preloaded itself); every later exec and posix_spawn in the process tree goes through
// the library's exported wrappers of the exec family (shadow_preload.cpp, "exec"), which read the
// new program the same way: a sanitized program that a shell, make or a test runner starts under
// teardown-run gets its runtime first too.
//
// Exit status (before PROGRAM runs; afterwards it is PROGRAM's): 2 for a usage error, 125 when
// the library cannot be found or named in LD_PRELOAD, 126 when PROGRAM cannot be executed, 127
// when it is not found — as env(1) and the shells do.
#include <limits.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "parse_int.hpp"
#include "sanitizer_runtime.hpp"

#ifndef TEARDOWN_RUN_LIBRARY_FROM_BINDIR
#error "TEARDOWN_RUN_LIBRARY_FROM_BINDIR: the library's path relative to the launcher's directory"
#endif
#ifndef TEARDOWN_RUN_LIBRARY_NAME
#error "TEARDOWN_RUN_LIBRARY_NAME: the library's file name"
#endif

namespace {

constexpr const char* usage_text =
    "usage: teardown-run [--nice N] [--idle] [--] PROGRAM [ARG...]\n"
    "Runs PROGRAM with shadow teardown: a helper process that shares its memory pays for the\n"
    "teardown when PROGRAM exits or is killed, so that its parent's waitpid() returns at once.\n"
    "\n"
    "  --nice N   the helper's nice value, -20..19 (default 19)\n"
    "  --idle     the helper runs in SCHED_IDLE\n"
    "  --help     this text\n"
    "\n"
    "Programs that PROGRAM execs get a helper of their own (LD_PRELOAD is inherited); set\n"
    "TEARDOWN_SHADOW=0 in a program's environment to leave it without one. A GCC ASan program,\n"
    "PROGRAM or one started later, gets its runtime first in LD_PRELOAD, as ASan requires.\n";

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "teardown-run: %s\n%s", message.c_str(), "Try 'teardown-run --help'.\n");
  std::exit(2);
}

bool valid_nice(std::string_view text) {
  long value = 0;
  return teardown_tools::parse_int(text, -20, 19, value);
}

bool is_file(const std::string& path) { return access(path.c_str(), R_OK) == 0; }

// The library's absolute, canonical path; exits 125 if it is not there.
std::string find_library() {
  char self[PATH_MAX];
  const ssize_t length = readlink("/proc/self/exe", self, sizeof self - 1);
  if (length <= 0) {
    std::fprintf(stderr, "teardown-run: cannot find my own path (/proc/self/exe): %s\n", std::strerror(errno));
    std::exit(125);
  }
  std::string directory(self, static_cast<std::size_t>(length));
  directory.erase(directory.rfind('/'));
  for (const std::string& candidate :
       {directory + "/" + TEARDOWN_RUN_LIBRARY_FROM_BINDIR + "/" + TEARDOWN_RUN_LIBRARY_NAME,
        directory + "/" + TEARDOWN_RUN_LIBRARY_NAME}) {
    char real[PATH_MAX];
    if (is_file(candidate) && realpath(candidate.c_str(), real) != nullptr) return real;
  }
  std::fprintf(stderr, "teardown-run: %s is not installed beside me (looked in %s/%s and %s)\n",
               TEARDOWN_RUN_LIBRARY_NAME, directory.c_str(), TEARDOWN_RUN_LIBRARY_FROM_BINDIR, directory.c_str());
  std::exit(125);
}

// The sanitizer runtime PROGRAM needs first in the process (see the file comment); "" if none.
std::string runtime_that_must_come_first(const char* program) {
  char path[PATH_MAX];
  teardown_tools::runtime_name runtime;
  if (!teardown_tools::find_in_path(program, path) ||
      !teardown_tools::runtime_needed_first(AT_FDCWD, path, 0, runtime)) {
    return {};
  }
  return runtime.text;
}

}  // namespace

int main(int argc, char** argv) {
  const char* nice = nullptr;
  bool idle = false;
  int at = 1;
  // Options end at the first argument that is not one: PROGRAM's own are never read.
  for (; at < argc; ++at) {
    const std::string_view argument(argv[at]);
    if (argument == "--") {
      ++at;
      break;
    }
    if (argument == "--help" || argument == "-h") {
      std::fputs(usage_text, stdout);
      return 0;
    }
    if (argument == "--idle") {
      idle = true;
    } else if (argument == "--nice" || argument.starts_with("--nice=")) {
      if (argument == "--nice") {
        if (++at == argc) usage_error("--nice needs a value");
        nice = argv[at];
      } else {
        nice = argv[at] + std::strlen("--nice=");
      }
      if (!valid_nice(nice)) usage_error(std::string("--nice ") + nice + ": not an integer in [-20, 19]");
    } else if (argument.size() > 1 && argument[0] == '-') {
      usage_error("unknown option " + std::string(argument));
    } else {
      break;
    }
  }
  if (at == argc) usage_error("no PROGRAM given");

  const std::string library = find_library();
  // The loader splits LD_PRELOAD at spaces and colons: a path with either cannot be named.
  if (library.find_first_of(" :") != std::string::npos) {
    std::fprintf(stderr, "teardown-run: %s has a space or colon in its path, which LD_PRELOAD cannot hold\n",
                 library.c_str());
    return 125;
  }
  const char* existing = std::getenv("LD_PRELOAD");
  const std::string user_preload = existing != nullptr ? existing : "";
  std::string preload = user_preload.empty() ? library : user_preload + ":" + library;
  const std::string runtime = runtime_that_must_come_first(argv[at]);
  const bool add_runtime = !runtime.empty() && !teardown_tools::preload_names_first(user_preload, runtime);
  if (add_runtime) preload = runtime + ":" + preload;
  // An explicit teardown-run wins over a TEARDOWN_SHADOW=0 inherited from above.
  if (unsetenv("TEARDOWN_SHADOW") != 0 || unsetenv("TEARDOWN_SHADOW_PRELOAD_ADDED") != 0 ||
      setenv("LD_PRELOAD", preload.c_str(), 1) != 0 ||
      (add_runtime && setenv("TEARDOWN_SHADOW_PRELOAD_ADDED", runtime.c_str(), 1) != 0) ||
      (nice != nullptr && setenv("TEARDOWN_SHADOW_NICE", nice, 1) != 0) ||
      (idle && setenv("TEARDOWN_SHADOW_IDLE", "1", 1) != 0)) {
    std::fprintf(stderr, "teardown-run: setenv: %s\n", std::strerror(errno));
    return 125;
  }

  execvp(argv[at], argv + at);
  const int error = errno;
  std::fprintf(stderr, "teardown-run: cannot run %s: %s\n", argv[at], std::strerror(error));
  return error == ENOENT ? 127 : 126;
}
