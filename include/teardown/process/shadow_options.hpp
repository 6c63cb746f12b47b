// teardown/process/shadow_options.hpp — shadow teardown's options and its four calls, declared;
// the platform test and the includes every part of process.hpp shares. Part of process.hpp,
// which is the header to include; the contract is there.
//
// Who may call what: plain data; check_shadow_options any thread (throws std::invalid_argument
// naming the field).
// Design: docs/design.md, "process.hpp: shadow teardown of a whole process (Linux x86-64)".
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

#if defined(__linux__)
#include <dlfcn.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#endif

#include "teardown/detail/nice.hpp"
#include "teardown/detail/pidfd.hpp"

#if defined(__linux__) && defined(__x86_64__)
#define TEARDOWN_SHADOW_SUPPORTED 1
#else
#define TEARDOWN_SHADOW_SUPPORTED 0
#endif

// valgrind's client request, exact where its header is installed (Debian: valgrind);
// TEARDOWN_NO_VALGRIND_H leaves it out. A check of the mappings backs it either way.
#if TEARDOWN_SHADOW_SUPPORTED && !defined(TEARDOWN_NO_VALGRIND_H) && defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define TEARDOWN_SHADOW_VALGRIND_H 1
#endif
#endif

namespace teardown::process {

struct shadow_options {
  // The helper's name (/proc/<pid>/comm, ps). Not empty, no NUL; Linux keeps the first 15 bytes.
  std::string name = "teardown-shadow";
  // The helper's stack, rounded up to whole pages, with a PROT_NONE guard page below it. The
  // helper uses a few hundred bytes of it and touches one or two pages: the rest costs address
  // space only.
  std::size_t stack_size = 64 * 1024;
  // The helper's nice value (-20..19), and so the priority of the teardown it runs once the
  // program is gone: by default the lowest, as the kernel series' reaper, so that the teardown
  // yields the CPU to whatever replaces the program. A value below the program's needs
  // CAP_SYS_NICE (else std::system_error EACCES).
  int nice = 19;
  // SCHED_IDLE instead of the normal class: any other runnable task, the waiter included, then
  // preempts the helper at once, and the scheduler counts the helper's CPU as idle when it places
  // a waking task. On a busy machine that keeps the teardown, which starts on the CPU the program
  // just left, from delaying the waiter by a scheduler slice (process_bench measures both), at
  // the price of a teardown that waits longer for spare CPU time, and so memory that stays
  // charged longer.
  bool sched_idle = false;
  // The helper is not the program's child: a short-lived intermediate creates it and exits, so
  // the kernel hands it at once to the nearest subreaper or to init, which reap it. The program's
  // waits, __WALL and __WCLONE included, and a tracer's, never wait for it, and an exec() leaves no
  // zombie behind. disable_shadow_teardown() then kills it and waits for its exit without reaping
  // it. libteardown_shadow.so sets this (see "Detached helpers").
  bool detached = false;

  static constexpr std::size_t min_stack_size = 16 * 1024;
  static constexpr std::size_t max_stack_size = 16 * 1024 * 1024;
};

inline constexpr bool shadow_teardown_supported = TEARDOWN_SHADOW_SUPPORTED != 0;

inline pid_t enable_shadow_teardown(const shadow_options& options = {});
inline void disable_shadow_teardown() noexcept;
inline bool shadow_teardown_enabled() noexcept;
inline pid_t shadow_pid() noexcept;

// ---- end of the public interface ------------------------------------------------------------

namespace detail {

inline void check_shadow_options(const shadow_options& options) {
  if (options.name.empty()) {
    throw std::invalid_argument("teardown::process::enable_shadow_teardown: options.name is empty");
  }
  if (options.name.find('\0') != std::string::npos) {
    throw std::invalid_argument("teardown::process::enable_shadow_teardown: options.name contains a NUL byte");
  }
  if (options.stack_size < shadow_options::min_stack_size || options.stack_size > shadow_options::max_stack_size) {
    throw std::invalid_argument("teardown::process::enable_shadow_teardown: options.stack_size " +
                                std::to_string(options.stack_size) + " is outside [" +
                                std::to_string(shadow_options::min_stack_size) + ", " +
                                std::to_string(shadow_options::max_stack_size) + "]");
  }
  if (!teardown::detail::valid_nice(options.nice)) {
    throw std::invalid_argument("teardown::process::enable_shadow_teardown: options.nice " +
                                std::to_string(options.nice) + " is outside [-20, 19]");
  }
}

}  // namespace detail
}  // namespace teardown::process
