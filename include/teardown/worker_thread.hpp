// teardown/worker_thread.hpp — what every thread the library starts stands on: the worker's own
// setup (its name, its nice value, the CPUs it prefers), over the shared internal layer in
// teardown/detail/. Everything is in teardown::detail, for reaper.hpp, reaper_pool.hpp,
// pressure.hpp and the compositions; do not depend on it directly.
//
//   name_this_thread(name)          pthread_setname_np on the calling thread (Linux keeps 15 bytes)
//   this_thread_tid()               the calling thread's kernel id (gettid)
//   set_thread_nice(tid, nice)      setpriority on one thread (not the process)
//   prefer_cpus(cpus)               sched_setaffinity of the calling thread to `cpus` (empty:
//                                   the housekeeping CPUs)
// and, from the detail files it includes (one concept each):
//   detail/clock.hpp          monotonic_ns, coarse_monotonic_ns, thread_cpu_ns, deadline_after
//   detail/futex.hpp          futex_wait, futex_wait_for, futex_wake_one, futex_wake_all
//   detail/thread_start.hpp   start_thread_with_signals_blocked (the one pthread_create),
//                             fault_signals, thread_owner (is the calling thread an object's own)
//   detail/cpus.hpp           parse_cpu_list, read_first_line, housekeeping_cpus
//   detail/fork.hpp           fork_participant, fork_registry (every live worker's atfork
//                             handlers, under one registry lock), creator_process
//   detail/nice.hpp           min_nice, max_nice, valid_nice
//   detail/fatal.hpp          fatal_misuse, write_to_stderr, type_name
//
// Who may call what: all of it any thread. The setup functions act on the calling thread (or
// the thread named by tid) and report refusal by returning false: a worker counts it as a
// warning and runs on. Futex waits and the registry's add/remove may block; the clocks,
// futex wakes and fatal_misuse are async-signal-safe.
// Design: docs/design.md, "The shared internal layer".
#pragma once

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>
#if defined(__linux__)
#include <linux/futex.h>
#endif

// What this header included before the split, which its includers may still lean on.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "teardown/detail/clock.hpp"
#include "teardown/detail/cpus.hpp"
#include "teardown/detail/fatal.hpp"
#include "teardown/detail/fork.hpp"
#include "teardown/detail/futex.hpp"
#include "teardown/detail/nice.hpp"
#include "teardown/detail/thread_start.hpp"

namespace teardown::detail {

// Names the calling thread (/proc/self/task/TID/comm): the first 15 bytes of `name`. False if
// refused (or not Linux). The caller has refused a name holding a NUL byte.
inline bool name_this_thread(const std::string& name) noexcept {
#if defined(__linux__)
  char truncated[16] = {};
  name.copy(truncated, sizeof truncated - 1);
  return pthread_setname_np(pthread_self(), truncated) == 0;
#else
  (void)name;
  return false;
#endif
}

// The calling thread's kernel thread id; 0 where there is none (not Linux).
inline pid_t this_thread_tid() noexcept {
#if defined(__linux__)
  return static_cast<pid_t>(syscall(SYS_gettid));
#else
  return 0;
#endif
}

// setpriority(PRIO_PROCESS, tid): Linux applies a nice value per thread. False if refused
// (EACCES: lower than allowed without CAP_SYS_NICE; ESRCH: no such thread), or not Linux.
inline bool set_thread_nice(pid_t tid, int nice) noexcept {
#if defined(__linux__)
  return setpriority(PRIO_PROCESS, static_cast<id_t>(tid), nice) == 0;
#else
  (void)tid;
  (void)nice;
  return false;
#endif
}

// Pins the calling thread to `cpus` (empty: the housekeeping CPUs). Numbers outside
// [0, CPU_SETSIZE) are left out. False if no CPU is left or the kernel refuses (or not Linux).
inline bool prefer_cpus(std::vector<int> cpus) noexcept {
#if defined(__linux__)
  try {
    if (cpus.empty()) cpus = housekeeping_cpus();
  } catch (...) {
    cpus.clear();
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  for (const int cpu : cpus) {
    if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(static_cast<std::size_t>(cpu), &set);
  }
  return CPU_COUNT(&set) != 0 && sched_setaffinity(0, sizeof set, &set) == 0;
#else
  (void)cpus;
  return false;
#endif
}

}  // namespace teardown::detail
