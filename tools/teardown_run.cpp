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
// Sanitizer runtimes: GCC's AddressSanitizer (libasan.so, and libhwasan.so) refuses to start
// unless its runtime is the first object after the executable ("ASan runtime does not come first
// in initial library list"), and a program built with -fsanitize=address names it as a DT_NEEDED
// entry, which every LD_PRELOAD object precedes. So when PROGRAM is such an executable (read from
// its ELF dynamic section) and LD_PRELOAD does not name that runtime already, the runtime goes
// first, by the name PROGRAM needs it by (the loader finds it as it would have, PROGRAM's RUNPATH
// included), and TEARDOWN_SHADOW_PRELOAD_ADDED tells the library to take it off LD_PRELOAD again
// once loaded, so that PROGRAM's children do not inherit it. ASAN_OPTIONS is left alone: with the
// runtime first, the link order ASan verifies is the one it wants. Only PROGRAM is inspected: a
// sanitized program that a script or another program runs later needs LD_PRELOAD=libasan.so.N in
// front of teardown-run (which keeps it first).
//
// Exit status (before PROGRAM runs; afterwards it is PROGRAM's): 2 for a usage error, 125 when
// the library cannot be found or named in LD_PRELOAD, 126 when PROGRAM cannot be executed, 127
// when it is not found — as env(1) and the shells do.
#include <elf.h>
#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

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

// PROGRAM as execvp() would find it (a name without '/' is searched in PATH); "" if not found.
std::string resolve_program(const char* name) {
  if (std::strchr(name, '/') != nullptr) return name;
  const char* path = std::getenv("PATH");
  std::string_view directories(path != nullptr ? path : "/usr/local/bin:/bin:/usr/bin");
  for (;;) {
    const std::size_t colon = directories.find(':');
    const std::string_view directory = directories.substr(0, colon);
    const std::string candidate = (directory.empty() ? std::string(".") : std::string(directory)) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    if (colon == std::string_view::npos) return {};
    directories.remove_prefix(colon + 1);
  }
}

// The DT_NEEDED names of a 64-bit little-endian ELF executable; empty for anything else (a
// script, a static program, an unreadable file).
std::vector<std::string> needed_libraries(const std::string& path) {
  std::vector<std::string> needed;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return needed;
  const auto read_at = [fd](void* into, std::size_t bytes, off_t offset) {
    return pread(fd, into, bytes, offset) == static_cast<ssize_t>(bytes);
  };
  Elf64_Ehdr header{};
  std::vector<Elf64_Phdr> segments;
  if (read_at(&header, sizeof header, 0) && std::memcmp(header.e_ident, ELFMAG, SELFMAG) == 0 &&
      header.e_ident[EI_CLASS] == ELFCLASS64 && header.e_ident[EI_DATA] == ELFDATA2LSB &&
      header.e_phentsize == sizeof(Elf64_Phdr) && header.e_phnum < 4096) {
    segments.resize(header.e_phnum);
    if (!read_at(segments.data(), segments.size() * sizeof(Elf64_Phdr), static_cast<off_t>(header.e_phoff))) {
      segments.clear();
    }
  }
  // A virtual address of the file's loaded segments, as a file offset.
  const auto offset_of = [&](Elf64_Addr address, Elf64_Off& offset) {
    for (const Elf64_Phdr& segment : segments) {
      if (segment.p_type == PT_LOAD && address >= segment.p_vaddr && address < segment.p_vaddr + segment.p_filesz) {
        offset = segment.p_offset + (address - segment.p_vaddr);
        return true;
      }
    }
    return false;
  };
  for (const Elf64_Phdr& segment : segments) {
    if (segment.p_type != PT_DYNAMIC || segment.p_filesz > (1u << 20)) continue;
    std::vector<Elf64_Dyn> entries(segment.p_filesz / sizeof(Elf64_Dyn));
    if (!read_at(entries.data(), entries.size() * sizeof(Elf64_Dyn), static_cast<off_t>(segment.p_offset))) break;
    Elf64_Off strings = 0;
    bool have_strings = false;
    for (const Elf64_Dyn& entry : entries) {
      if (entry.d_tag == DT_STRTAB) have_strings = offset_of(entry.d_un.d_ptr, strings);
    }
    if (!have_strings) break;
    for (const Elf64_Dyn& entry : entries) {
      if (entry.d_tag == DT_NULL) break;
      if (entry.d_tag != DT_NEEDED) continue;
      char name[256] = {};
      if (pread(fd, name, sizeof name - 1, static_cast<off_t>(strings + entry.d_un.d_val)) > 0) {
        needed.emplace_back(name);
      }
    }
    break;
  }
  close(fd);
  return needed;
}

// The sanitizer runtime PROGRAM needs first in the process (see the file comment); "" if none.
std::string runtime_that_must_come_first(const char* program) {
  const std::string path = resolve_program(program);
  if (path.empty()) return {};
  for (const std::string& name : needed_libraries(path)) {
    if (name.rfind("libasan.so", 0) == 0 || name.rfind("libhwasan.so", 0) == 0) return name;
  }
  return {};
}

// Whether LD_PRELOAD's list (split at spaces and colons, as the loader does) names `runtime`,
// by that name or as a path ending in it.
bool preload_names(std::string_view list, const std::string& runtime) {
  while (!list.empty()) {
    const std::size_t end = list.find_first_of(" :");
    const std::string_view entry = list.substr(0, end);
    const std::size_t slash = entry.rfind('/');
    if ((slash == std::string_view::npos ? entry : entry.substr(slash + 1)) == runtime) return true;
    if (end == std::string_view::npos) break;
    list.remove_prefix(end + 1);
  }
  return false;
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
  const bool add_runtime = !runtime.empty() && !preload_names(user_preload, runtime);
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
