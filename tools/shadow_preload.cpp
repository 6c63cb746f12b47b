// libteardown_shadow.so — shadow teardown (teardown/process.hpp) for a program that was not
// written for it: preloaded (LD_PRELOAD, which teardown-run sets), its constructor calls
// enable_shadow_teardown() before the program's main() runs.
//
// Environment (read once, in the constructor):
//   TEARDOWN_SHADOW=0        no helper in this process (an opt-out for one program, or for the
//                            children of a program that run with an edited environment). Its
//                            execs are still given a sanitizer runtime first ("exec", below).
//   TEARDOWN_SHADOW_NICE=N   the helper's nice value, -20..19 (default 19).
//   TEARDOWN_SHADOW_IDLE=1   the helper runs in SCHED_IDLE (0 or 1; default 0).
// A value that is not one of these, or an enable_shadow_teardown() that fails (valgrind:
// ENOTSUP, a sandbox that refuses clone(CLONE_VM)), prints one line on stderr; the program then
// runs unchanged, without a helper. Nothing here ever ends or stops the program.
//
//   TEARDOWN_SHADOW_PRELOAD_ADDED=NAME
//                            set by teardown-run, or by this object's exec wrappers in the parent,
//                            when it put a sanitizer runtime (NAME) first in LD_PRELOAD for an
//                            executable that needs it there: the constructor
//                            takes NAME off LD_PRELOAD again, and this variable away, so that the
//                            program and its children see the environment they would have seen.
//
// The helper is detached (process.hpp, shadow_options::detached): never the program's child, so
// a program that waits for every child with __WALL or __WCLONE, and a tracer (strace -f, gdb)
// that waits for every tracee, end as they would without it, and an exec() leaves no zombie.
// It is the process's one helper: the program's own copy of process.hpp, if it has one, sees it
// (shadow_teardown_enabled, shadow_pid) and controls it (disable_shadow_teardown), through the
// symbol teardown_process_shadow_state_v2, which this object exports.
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
// why) but two kinds (shadow_preload.map): the rendezvous above, and the exec family and
// posix_spawn, whose wrappers ("exec", below) put a sanitizer runtime first in LD_PRELOAD for a
// new image that needs it and otherwise forward each call, unchanged, to the next definition.
// The host sees a constructor, the rendezvous and those wrappers, nothing else.
#include <alloca.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <spawn.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <string>
#include <string_view>
#include <system_error>

#include "parse_int.hpp"
#include "sanitizer_runtime.hpp"
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

// ---- exec: a sanitizer runtime first for the new image --------------------------------------------
//
// teardown-run inspects only the program it runs; a sanitized program that a shell, make or a
// test runner starts later would stop at its start ("ASan runtime does not come first"), because
// this object, in its LD_PRELOAD, loads before the runtime it names as DT_NEEDED. So this object
// wraps the exec family and posix_spawn, exported (shadow_preload.map): a preloaded object comes
// first in symbol lookup, so the program's calls come here (in a sanitized program, after ASan's
// own posix_spawn interceptor, which forwards with RTLD_NEXT to the next definition: this one).
// Each wrapper finds the file the real call will run (PATH searched as glibc searches it for the
// p-variants, a "#!" script followed to its interpreter) and reads it (sanitizer_runtime.hpp, as
// teardown-run does). When that program needs a runtime that LD_PRELOAD in the new environment
// does not name first, and that LD_PRELOAD loads this object into the new image (the one reason
// the runtime would not come first), it passes an environment with the runtime first in
// LD_PRELOAD and TEARDOWN_SHADOW_PRELOAD_ADDED naming it, which the new image's constructor takes
// away again. Then it calls the next definition (libc's, or a later preload's: dlsym(RTLD_NEXT),
// resolved in the constructor): the same function, or, to pass an environment to a variant that
// takes none, execve for execv and execvpe for execvp (which is what glibc's execv and execvp
// are, with environ). Nothing changed, it is the real call with the same arguments. errno is the
// caller's until the real call runs, and a failing call fails with the real call's errno.
//
// Exporting these is safe, the one exception to exporting nothing but the rendezvous: each
// forwards to the next definition, and changes only the new image's environment, only where that
// image could not start otherwise.
//
// Which calls: execve, execv, execvp, execvpe, execl, execlp, execle, fexecve, execveat,
// posix_spawn, posix_spawnp: glibc's own variants and its posix_spawn call its internal __execve,
// never the exported execve, so each is wrapped. system() and popen() run /bin/sh through glibc's
// internal posix_spawn (not wrapped, and nothing to inspect but /bin/sh); the shell then runs the
// command through execve, which is. GNU make runs a recipe through posix_spawn, or through
// /bin/sh. Not seen: the execs of a statically linked program (no libc of ours to wrap), a
// program that cannot be read (mode --x), and a relative path that posix_spawn runs after a
// chdir file action (it is looked up from the caller's directory): those run unchanged.
//
// execve() may be called in a vfork() child or a signal handler: nothing here allocates, locks
// or calls what is not async-signal-safe; buffers are on the stack and of fixed size (about 4 KiB
// in all, 8 KiB for the p-variants, and 13 KiB more only where the environment is edited), and
// what does not fit (over 1,023 variables, an LD_PRELOAD over 4 KiB, a path over PATH_MAX) runs
// the call unchanged.
// execl/execlp/execle build their argv on the stack, sized by the call, as glibc's own do. The
// next definitions are resolved in the constructor; only a program run from another object's
// constructor before ours has run would resolve one at its call (dlsym, not async-signal-safe).
// The inspection costs about 10 us per exec (a dozen system calls), only where LD_PRELOAD names
// this object.
//
// TEARDOWN_SHADOW=0 leaves this process without a helper; its execs are still given the runtime
// first where the new image loads this object, since that image could not start otherwise, and
// the process itself is left as it was (its environ is never written). To leave a subtree alone,
// take this object off its LD_PRELOAD: then nothing is changed.

// This object's file name, as LD_PRELOAD names it (the constructor reads it from the loader).
char library_name[256] = "libteardown_shadow.so";

void find_library_name() noexcept {
  Dl_info info{};
  if (dladdr(&library_name, &info) == 0 || info.dli_fname == nullptr) return;
  const std::string_view name = teardown_tools::file_name(info.dli_fname);
  if (name.empty() || name.size() >= sizeof library_name) return;
  std::memcpy(library_name, name.data(), name.size());
  library_name[name.size()] = '\0';
}

// The next definition of a function, resolved once: in the constructor, or at the first call if
// another object's constructor runs a program before ours has run.
template <class Function>
class next_definition {
 public:
  constexpr explicit next_definition(const char* name) : name_(name) {}
  Function* get() noexcept {
    Function* function = function_.load(std::memory_order_relaxed);
    if (function == nullptr) {
      void* const symbol = dlsym(RTLD_NEXT, name_);
      std::memcpy(&function, &symbol, sizeof function);
      function_.store(function, std::memory_order_relaxed);
    }
    return function;
  }

 private:
  const char* name_;
  std::atomic<Function*> function_{nullptr};
};

using execve_function = int(const char*, char* const[], char* const[]);
using execv_function = int(const char*, char* const[]);
using fexecve_function = int(int, char* const[], char* const[]);
using execveat_function = int(int, const char*, char* const[], char* const[], int);
using spawn_function = int(pid_t*, const char*, const posix_spawn_file_actions_t*, const posix_spawnattr_t*,
                           char* const[], char* const[]);

next_definition<execve_function> next_execve("execve");
next_definition<execv_function> next_execv("execv");
next_definition<execv_function> next_execvp("execvp");
next_definition<execve_function> next_execvpe("execvpe");
next_definition<fexecve_function> next_fexecve("fexecve");
next_definition<execveat_function> next_execveat("execveat");
next_definition<spawn_function> next_posix_spawn("posix_spawn");
next_definition<spawn_function> next_posix_spawnp("posix_spawnp");

void resolve_next_definitions() noexcept {
  (void)next_execve.get(), (void)next_execv.get(), (void)next_execvp.get(), (void)next_execvpe.get();
  (void)next_fexecve.get(), (void)next_execveat.get(), (void)next_posix_spawn.get(), (void)next_posix_spawnp.get();
}

constexpr std::string_view preload_prefix = "LD_PRELOAD=";
constexpr std::string_view added_prefix = "TEARDOWN_SHADOW_PRELOAD_ADDED=";

// LD_PRELOAD in `environment` as the loader reads it (the last entry that sets it); null if none.
const char* preload_of(char* const* environment) noexcept {
  const char* value = nullptr;
  for (char* const* entry = environment; entry != nullptr && *entry != nullptr; ++entry) {
    if (std::string_view(*entry).starts_with(preload_prefix)) value = *entry + preload_prefix.size();
  }
  return value;
}

// Whether the image that `environment` starts needs `runtime` put first: its LD_PRELOAD loads this
// library, and inspect(runtime) finds a runtime that LD_PRELOAD does not name first.
template <class Inspect>
bool runtime_to_add(char* const* environment, teardown_tools::runtime_name& runtime, Inspect inspect) noexcept {
  const char* preload = preload_of(environment);
  if (preload == nullptr || !teardown_tools::preload_names(preload, library_name)) return false;
  const int saved_errno = errno;
  const bool needed = inspect(runtime) && !teardown_tools::preload_names_first(preload, runtime.view());
  errno = saved_errno;
  return needed;
}

// Appends `parts` to `into` (of `capacity` bytes, '\0'-terminated); false if they do not fit.
bool compose(char* into, std::size_t capacity, std::initializer_list<std::string_view> parts) noexcept {
  std::size_t at = 0;
  for (const std::string_view part : parts) {
    if (part.size() >= capacity - at) return false;
    std::memcpy(into + at, part.data(), part.size());
    at += part.size();
  }
  into[at] = '\0';
  return true;
}

// Returns run(environment edited: `runtime` first in LD_PRELOAD, TEARDOWN_SHADOW_PRELOAD_ADDED
// naming it), or run(environment) unchanged if the edit does not fit. Not inlined: its buffers
// take stack only when an edit is needed.
constexpr std::size_t max_environment = 1024;

template <class Run>
[[gnu::noinline]] int with_runtime_first(char* const* environment, const teardown_tools::runtime_name& runtime,
                                         Run run) noexcept {
  char* edited[max_environment];
  char preload[4096];
  char added[added_prefix.size() + sizeof runtime.text];
  std::size_t count = 0;
  bool fits = compose(preload, sizeof preload, {preload_prefix, runtime.view(), ":", preload_of(environment)}) &&
              compose(added, sizeof added, {added_prefix, runtime.view()});
  for (char* const* entry = environment; fits && *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    if (text.starts_with(preload_prefix) || text.starts_with(added_prefix)) continue;
    fits = count + 3 < max_environment;
    if (fits) edited[count++] = *entry;
  }
  if (!fits) return run(environment);
  edited[count++] = preload;
  edited[count++] = added;
  edited[count] = nullptr;
  return run(edited);
}

// Calls plain() when the new image needs no runtime put first, else edited(environment edited).
template <class Inspect, class Plain, class Edited>
int exec_with(char* const* environment, Inspect inspect, Plain plain, Edited edited) noexcept {
  teardown_tools::runtime_name runtime;
  if (!runtime_to_add(environment, runtime, inspect)) return plain();
  return with_runtime_first(environment, runtime, edited);
}

// The inspections: the program at a path, in PATH (the p-variants), open as a descriptor.
auto program_at(int directory, const char* path, int flags) noexcept {
  return [=](teardown_tools::runtime_name& runtime) {
    return teardown_tools::runtime_needed_first(directory, path, flags, runtime);
  };
}

auto program_in_path(const char* file) noexcept {
  return [=](teardown_tools::runtime_name& runtime) {
    char path[PATH_MAX];
    return teardown_tools::find_in_path(file, path) && teardown_tools::runtime_needed_first(AT_FDCWD, path, 0, runtime);
  };
}

// Read through the descriptor, or through /proc/self/fd for an O_PATH one (which cannot be read).
auto program_open_as(int fd) noexcept {
  return [=](teardown_tools::runtime_name& runtime) {
    const int flags = fcntl(fd, F_GETFL);
    if (flags < 0) return false;
    if ((flags & O_PATH) == 0) return teardown_tools::runtime_needed_first(fd, runtime);
    char path[32] = "/proc/self/fd/";
    char digits[12];
    std::size_t count = 0;
    for (unsigned value = static_cast<unsigned>(fd); count == 0 || value != 0; value /= 10) {
      digits[count++] = static_cast<char>('0' + value % 10);
    }
    std::size_t at = std::strlen(path);
    while (count > 0) path[at++] = digits[--count];
    path[at] = '\0';
    return teardown_tools::runtime_needed_first(AT_FDCWD, path, 0, runtime);
  };
}

int no_definition() noexcept {
  errno = ENOSYS;
  return -1;
}

// execve and execvpe, which execl, execle and execlp call directly (not through the PLT).
int exec_path(const char* path, char* const argv[], char* const envp[]) noexcept {
  execve_function* const next = next_execve.get();
  if (next == nullptr) return no_definition();
  return exec_with(
      envp, program_at(AT_FDCWD, path, 0), [&] { return next(path, argv, envp); },
      [&](char* const* environment) { return next(path, argv, environment); });
}

int exec_file(const char* file, char* const argv[], char* const envp[]) noexcept {
  execve_function* const next = next_execvpe.get();
  if (next == nullptr) return no_definition();
  return exec_with(
      envp, program_in_path(file), [&] { return next(file, argv, envp); },
      [&](char* const* environment) { return next(file, argv, environment); });
}

// execl's arguments, from `first` up to the null pointer, as an argv on the stack (sized by the
// call, as glibc's execl sizes its own), then for execle the environment after the null pointer:
// run(argv, envp) is called while they live.
template <class Run>
int with_argument_vector(const char* first, va_list arguments, bool environment_follows, Run run) noexcept {
  va_list counting;
  va_copy(counting, arguments);
  std::size_t argc = 1;
  while (va_arg(counting, char*) != nullptr) ++argc;
  va_end(counting);
  char** const argv = static_cast<char**>(alloca((argc + 1) * sizeof(char*)));
  argv[0] = const_cast<char*>(first);
  for (std::size_t i = 1; i <= argc; ++i) argv[i] = va_arg(arguments, char*);
  char* const* const envp = environment_follows ? va_arg(arguments, char* const*) : environ;
  return run(argv, envp);
}

// Runs once the loader has set up libc and this object, before the program's main(): the helper
// exists before the program allocates much.
__attribute__((constructor)) void teardown_shadow_constructor() noexcept {
  find_library_name();
  resolve_next_definitions();
  enable_from_environment();
}

}  // namespace

// ---- the exported wrappers (shadow_preload.map) ---------------------------------------------------

#define TEARDOWN_SHADOW_EXPORT extern "C" __attribute__((visibility("default")))

TEARDOWN_SHADOW_EXPORT int execve(const char* path, char* const argv[], char* const envp[]) noexcept {
  return exec_path(path, argv, envp);
}

TEARDOWN_SHADOW_EXPORT int execv(const char* path, char* const argv[]) noexcept {
  execv_function* const next = next_execv.get();
  execve_function* const with_environment = next_execve.get();
  if (next == nullptr || with_environment == nullptr) return no_definition();
  return exec_with(
      environ, program_at(AT_FDCWD, path, 0), [&] { return next(path, argv); },
      [&](char* const* environment) { return with_environment(path, argv, environment); });
}

TEARDOWN_SHADOW_EXPORT int execvpe(const char* file, char* const argv[], char* const envp[]) noexcept {
  return exec_file(file, argv, envp);
}

TEARDOWN_SHADOW_EXPORT int execvp(const char* file, char* const argv[]) noexcept {
  execv_function* const next = next_execvp.get();
  execve_function* const with_environment = next_execvpe.get();
  if (next == nullptr || with_environment == nullptr) return no_definition();
  return exec_with(
      environ, program_in_path(file), [&] { return next(file, argv); },
      [&](char* const* environment) { return with_environment(file, argv, environment); });
}

TEARDOWN_SHADOW_EXPORT int execl(const char* path, const char* arg, ...) noexcept {
  va_list arguments;
  va_start(arguments, arg);
  const int result = with_argument_vector(arg, arguments, false, [&](char* const* argv, char* const* envp) {
    return exec_path(path, argv, envp);
  });
  va_end(arguments);
  return result;
}

TEARDOWN_SHADOW_EXPORT int execle(const char* path, const char* arg, ...) noexcept {
  va_list arguments;
  va_start(arguments, arg);
  const int result = with_argument_vector(arg, arguments, true, [&](char* const* argv, char* const* envp) {
    return exec_path(path, argv, envp);
  });
  va_end(arguments);
  return result;
}

TEARDOWN_SHADOW_EXPORT int execlp(const char* file, const char* arg, ...) noexcept {
  va_list arguments;
  va_start(arguments, arg);
  const int result = with_argument_vector(arg, arguments, false, [&](char* const* argv, char* const* envp) {
    return exec_file(file, argv, envp);
  });
  va_end(arguments);
  return result;
}

TEARDOWN_SHADOW_EXPORT int fexecve(int fd, char* const argv[], char* const envp[]) noexcept {
  fexecve_function* const next = next_fexecve.get();
  if (next == nullptr) return no_definition();
  return exec_with(
      envp, program_open_as(fd), [&] { return next(fd, argv, envp); },
      [&](char* const* environment) { return next(fd, argv, environment); });
}

TEARDOWN_SHADOW_EXPORT int execveat(int directory, const char* path, char* const argv[], char* const envp[],
                                    int flags) noexcept {
  execveat_function* const next = next_execveat.get();
  if (next == nullptr) return no_definition();
  const auto by_descriptor = program_open_as(directory);
  const auto by_path = program_at(directory, path, flags);
  return exec_with(
      envp,
      [&](teardown_tools::runtime_name& runtime) {
        return (flags & AT_EMPTY_PATH) != 0 && path[0] == '\0' ? by_descriptor(runtime) : by_path(runtime);
      },
      [&] { return next(directory, path, argv, envp, flags); },
      [&](char* const* environment) { return next(directory, path, argv, environment, flags); });
}

// posix_spawn and posix_spawnp return their error instead of setting errno.
TEARDOWN_SHADOW_EXPORT int posix_spawn(pid_t* pid, const char* path, const posix_spawn_file_actions_t* actions,
                                       const posix_spawnattr_t* attributes, char* const argv[], char* const envp[]) {
  spawn_function* const next = next_posix_spawn.get();
  if (next == nullptr) return ENOSYS;
  return exec_with(
      envp, program_at(AT_FDCWD, path, 0), [&] { return next(pid, path, actions, attributes, argv, envp); },
      [&](char* const* environment) { return next(pid, path, actions, attributes, argv, environment); });
}

TEARDOWN_SHADOW_EXPORT int posix_spawnp(pid_t* pid, const char* file, const posix_spawn_file_actions_t* actions,
                                        const posix_spawnattr_t* attributes, char* const argv[], char* const envp[]) {
  spawn_function* const next = next_posix_spawnp.get();
  if (next == nullptr) return ENOSYS;
  return exec_with(
      envp, program_in_path(file), [&] { return next(pid, file, actions, attributes, argv, envp); },
      [&](char* const* environment) { return next(pid, file, actions, attributes, argv, environment); });
}
