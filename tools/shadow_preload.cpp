// libteardown_shadow.so — shadow teardown (teardown/process.hpp) for a program that was not
// written for it: preloaded (LD_PRELOAD, which teardown-run sets), its constructor calls
// enable_shadow_teardown() before the program's main() runs.
//
// Environment (read once, in the constructor):
//   TEARDOWN_SHADOW=0        do nothing in this process (an opt-out for one program, or for the
//                            children of a program that run with an edited environment).
//   TEARDOWN_SHADOW_NICE=N   the helper's nice value, -20..19 (default 19).
//   TEARDOWN_SHADOW_IDLE=1   the helper runs in SCHED_IDLE (0 or 1; default 0).
// A value that is not one of these, or an enable_shadow_teardown() that fails (valgrind:
// ENOTSUP, a sandbox that refuses clone(CLONE_VM)), prints one line on stderr; the program then
// runs unchanged, without a helper. Nothing here ever ends or stops the program.
//
//   TEARDOWN_SHADOW_PRELOAD_ADDED=NAME
//                            set by teardown-run when it put a sanitizer runtime (NAME) first in
//                            LD_PRELOAD for an executable that needs it there: the constructor
//                            takes NAME off LD_PRELOAD again, and this variable away, so that the
//                            program and its children see the environment they would have seen.
//
// The helper is detached (process.hpp, shadow_options::detached): never the program's child, so
// a program that waits for every child with __WALL or __WCLONE, and a tracer (strace -f, gdb)
// that waits for every tracee, end as they would without it, and an exec() leaves no zombie.
// It is the process's one helper: the program's own copy of process.hpp, if it has one, sees it
// (shadow_teardown_enabled, shadow_pid) and controls it (disable_shadow_teardown), through the
// one symbol this object exports (teardown_process_shadow_state_v1).
//
// Where it goes: every process that loads this object gets its own helper. The dynamic loader
// loads it into each program image started with it in LD_PRELOAD, and the variable is inherited:
//   - exec(): the old image's helper exits (its pipe is close-on-exec, and it watches the thread
//     that started it, which an exec() ends even where the program cleared FD_CLOEXEC) and frees
//     the old image; init reaps it. The new image loads this object again and gets a new helper
//     (process.hpp, "exec()").
//   - fork(): the child has no helper (process.hpp's fork handler), until it exec()s.
//   - threads: one helper per process, whichever threads come and go.
//   - setuid and setgid programs ignore LD_PRELOAD with a '/' in it, and statically linked
//     programs have no loader: those run without a helper.
//
// Built without sanitizers in every preset (a sanitizer's runtime must be the first object of a
// process, which a preloaded object into an uninstrumented program can never be; teardown-run
// places this object last in LD_PRELOAD, after the user's preloads), with
// libstdc++ and libgcc linked in statically and every symbol local (tools/CMakeLists.txt says
// why): the host sees a constructor and nothing else.
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <system_error>

#include "parse_int.hpp"
#include "teardown/process.hpp"

namespace {

// One line on stderr, with one writev(2): stdio is the program's, and this allocates nothing.
void say(std::string_view text) noexcept {
  constexpr std::string_view prefix = "libteardown_shadow.so: ";
  constexpr std::string_view suffix = "; the program runs without shadow teardown\n";
  iovec parts[3] = {{const_cast<char*>(prefix.data()), prefix.size()},
                    {const_cast<char*>(text.data()), text.size()},
                    {const_cast<char*>(suffix.data()), suffix.size()}};
  while (writev(STDERR_FILENO, parts, 3) < 0 && errno == EINTR) {
  }
}

using teardown_tools::parse_int;

// The options from the environment; false (and one line said) if a value is bad.
bool options_from_environment(teardown::process::shadow_options& options) {
  if (const char* nice = std::getenv("TEARDOWN_SHADOW_NICE"); nice != nullptr) {
    long value = 0;
    if (!parse_int(nice, -20, 19, value)) {
      say(std::string("TEARDOWN_SHADOW_NICE=\"") + nice + "\" is not an integer in [-20, 19]");
      return false;
    }
    options.nice = static_cast<int>(value);
  }
  if (const char* idle = std::getenv("TEARDOWN_SHADOW_IDLE"); idle != nullptr) {
    const std::string_view text(idle);
    if (text != "0" && text != "1") {
      say(std::string("TEARDOWN_SHADOW_IDLE=\"") + idle + "\" is neither 0 nor 1");
      return false;
    }
    options.sched_idle = text == "1";
  }
  return true;
}

// Takes the sanitizer runtime that teardown-run added back off LD_PRELOAD (the loader has read
// the variable already; the program and its children must not inherit the addition).
void remove_added_preload() {
  const char* added = std::getenv("TEARDOWN_SHADOW_PRELOAD_ADDED");
  if (added == nullptr) return;
  const std::string name(added);
  (void)unsetenv("TEARDOWN_SHADOW_PRELOAD_ADDED");
  const char* preload = std::getenv("LD_PRELOAD");
  if (preload == nullptr || name.empty()) return;
  const std::string_view list(preload);
  if (list.rfind(name + ":", 0) == 0) (void)setenv("LD_PRELOAD", std::string(list.substr(name.size() + 1)).c_str(), 1);
}

// Everything is caught here: an exception must never leave this object (the host may be C, and
// nothing above us could catch it).
void enable_from_environment() noexcept {
  const int saved_errno = errno;  // the program's startup must see what it would have seen
  try {
    remove_added_preload();
    const char* enabled = std::getenv("TEARDOWN_SHADOW");
    if (enabled != nullptr && std::string_view(enabled) != "1") {
      if (std::string_view(enabled) != "0") {
        say(std::string("TEARDOWN_SHADOW=\"") + enabled + "\" is neither 0 nor 1");
      }
    } else {
      teardown::process::shadow_options options;
      options.detached = true;
      if (options_from_environment(options)) (void)teardown::process::enable_shadow_teardown(options);
    }
  } catch (const std::exception& e) {
    say(e.what());
  } catch (...) {
    say("enable_shadow_teardown failed");
  }
  errno = saved_errno;
}

// Runs once the loader has set up libc and this object, before the program's main(): the helper
// exists before the program allocates much.
__attribute__((constructor)) void teardown_shadow_constructor() noexcept { enable_from_environment(); }

}  // namespace
