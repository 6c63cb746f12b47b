// teardown-run — runs a program with shadow teardown (teardown/process.hpp), unmodified:
//
//     teardown-run [--nice N] [--idle] [--] PROGRAM [ARG...]
//
// puts libteardown_shadow.so first in LD_PRELOAD (keeping what was there), sets
// TEARDOWN_SHADOW_NICE / TEARDOWN_SHADOW_IDLE from the options, and execvp()s PROGRAM, which
// then keeps this process's pid. The library is found relative to this executable's real path
// (/proc/self/exe), the way it was installed (<bindir>/<relative path to libdir>), so an install
// prefix that is moved or copied keeps working; in a build tree, beside it.
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
    "TEARDOWN_SHADOW=0 in a program's environment to leave it without one.\n";

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
  for (const std::string& candidate : {directory + "/" + TEARDOWN_RUN_LIBRARY_FROM_BINDIR + "/" + TEARDOWN_RUN_LIBRARY_NAME,
                                       directory + "/" + TEARDOWN_RUN_LIBRARY_NAME}) {
    char real[PATH_MAX];
    if (is_file(candidate) && realpath(candidate.c_str(), real) != nullptr) return real;
  }
  std::fprintf(stderr, "teardown-run: %s is not installed beside me (looked in %s/%s and %s)\n",
               TEARDOWN_RUN_LIBRARY_NAME, directory.c_str(), TEARDOWN_RUN_LIBRARY_FROM_BINDIR, directory.c_str());
  std::exit(125);
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
  std::string preload = library;
  if (const char* existing = std::getenv("LD_PRELOAD"); existing != nullptr && *existing != '\0') {
    preload += ":" + std::string(existing);
  }
  // An explicit teardown-run wins over a TEARDOWN_SHADOW=0 inherited from above.
  if (unsetenv("TEARDOWN_SHADOW") != 0 || setenv("LD_PRELOAD", preload.c_str(), 1) != 0 ||
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
