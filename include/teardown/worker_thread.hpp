// teardown/worker_thread.hpp — what every thread the library starts stands on. Internal: the
// names live in teardown::detail, for reaper.hpp, reaper_pool.hpp and the compositions; do not
// depend on them directly.
//
//   monotonic_ns, coarse_monotonic_ns, thread_cpu_ns
//                                 clocks (the CPU clock is a real syscall, no vDSO)
//   futex_wait, futex_wait_for,   a private futex on a 32-bit atomic word (std::atomic::wait
//   futex_wake_one                elsewhere); waits may return spuriously
//   start_thread_with_signals_blocked
//                                 the one pthread_create of the library: the new thread blocks
//                                 every signal sent to the process from its first instruction,
//                                 the fault signals excepted (reaper.hpp, "Signals")
//   parse_cpu_list, housekeeping_cpus
//                                 the CPUs a worker prefers: online minus isolcpus= / nohz_full=
//   fork_participant, fork_registry
//                                 every live worker's pthread_atfork handlers, run under one
//                                 registry lock from prepare to parent/child
//   fatal_misuse                  a misuse a destructor cannot refuse: a message with write(2)
//                                 (async-signal-safe, no allocation), then abort
//   deadline_after                now + timeout, saturating instead of overflowing
//
// Who may call what: all of it any thread; futex waits and the registry's add/remove may block;
// the clocks, futex_wake_one and fatal_misuse are async-signal-safe.
#pragma once

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>
#if defined(__linux__)
#include <linux/futex.h>
#endif

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

#include "teardown/detail/fatal.hpp"

namespace teardown::detail {

inline std::uint64_t monotonic_ns() noexcept {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

// A coarse clock (the last tick; no vDSO time computation): for checks that tolerate a few ms.
inline std::uint64_t coarse_monotonic_ns() noexcept {
  timespec ts{};
#if defined(CLOCK_MONOTONIC_COARSE)
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
#else
  clock_gettime(CLOCK_MONOTONIC, &ts);
#endif
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(ts.tv_nsec);
}

inline std::uint64_t thread_cpu_ns() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(ts.tv_nsec);
}

// Sleeps while `word` holds `expected`; may return spuriously. Linux: a private futex.
inline void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected) noexcept {
#if defined(__linux__)
  static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
#else
  word.wait(expected, std::memory_order_relaxed);
#endif
}

// futex_wait for at most `ns` nanoseconds.
inline void futex_wait_for(std::atomic<std::uint32_t>& word, std::uint32_t expected, std::uint64_t ns) noexcept {
#if defined(__linux__)
  timespec timeout{};
  timeout.tv_sec = static_cast<time_t>(ns / 1'000'000'000u);
  timeout.tv_nsec = static_cast<long>(ns % 1'000'000'000u);
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, &timeout, nullptr, 0);
#else
  (void)word;
  (void)expected;
  const timespec pause{0, static_cast<long>(std::min<std::uint64_t>(ns, 1'000'000))};  // a poll
  nanosleep(&pause, nullptr);
#endif
}

inline void futex_wake_one(std::atomic<std::uint32_t>& word) noexcept {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
#else
  word.notify_one();
#endif
}

// The synchronous fault signals: raised by the kernel on the thread that faults, never left
// blocked on a library thread (see "Signals" in the header comment).
inline constexpr int fault_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS};

// pthread_create for every thread the library starts: the new thread blocks every signal sent
// to the process (all but SIGKILL, SIGSTOP, the C library's internal ones and the fault signals)
// from its first instruction, as liburcu's call_rcu threads do, so that a signal meant for the
// program never runs a handler (or the default action) on it. The creating thread blocks that
// set around the call and the new thread inherits it; the caller's own mask is restored before
// returning.
inline int start_thread_with_signals_blocked(pthread_t* thread, void* (*entry)(void*), void* arg) noexcept {
  sigset_t every;
  sigfillset(&every);
  for (const int fault : fault_signals) sigdelset(&every, fault);
  sigset_t callers;
  if (const int error = pthread_sigmask(SIG_SETMASK, &every, &callers); error != 0) return error;
  const int error = pthread_create(thread, nullptr, entry, arg);
  (void)pthread_sigmask(SIG_SETMASK, &callers, nullptr);
  return error;
}

// "0-3,8,10-11" -> {0,1,2,3,8,10,11}
inline std::set<int> parse_cpu_list(const std::string& text) {
  std::set<int> cpus;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string part = text.substr(at, comma - at);
    at = comma + 1;
    if (part.empty() || part[0] < '0' || part[0] > '9') continue;
    const std::size_t dash = part.find('-');
    const int first = std::stoi(part.substr(0, dash));
    const int last = dash == std::string::npos ? first : std::stoi(part.substr(dash + 1));
    for (int cpu = first; cpu <= last; ++cpu) cpus.insert(cpu);
  }
  return cpus;
}

inline std::string read_first_line(const char* path) {
  std::ifstream file(path);
  std::string line;
  std::getline(file, line);
  return line;
}

// The housekeeping CPUs: online, minus isolcpus= and nohz_full=, within this process's mask.
inline std::vector<int> housekeeping_cpus() {
  std::set<int> cpus = parse_cpu_list(read_first_line("/sys/devices/system/cpu/online"));
  for (const char* excluded : {"/sys/devices/system/cpu/isolated", "/sys/devices/system/cpu/nohz_full"}) {
    for (int cpu : parse_cpu_list(read_first_line(excluded))) cpus.erase(cpu);
  }
  std::vector<int> result;
#if defined(__linux__)
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0) {
    for (int cpu : cpus) {
      if (cpu >= 0 && cpu < CPU_SETSIZE && CPU_ISSET(static_cast<std::size_t>(cpu), &allowed)) result.push_back(cpu);
    }
  }
#endif
  return result;
}

// Every live reaper (a pool's workers included), for the pthread_atfork handlers.
class fork_participant {
 public:
  virtual void fork_prepare() noexcept = 0;
  virtual void fork_parent() noexcept = 0;
  virtual void fork_child() noexcept = 0;

 protected:
  ~fork_participant() = default;
};

class fork_registry {
 public:
  static fork_registry& instance() {
    // Never destroyed: a fork may happen while static destructors run.
    static fork_registry* const registry = [] {
      auto* created = new fork_registry;
      // No ordering against the shard index registry's handlers is needed: it has none (it
      // takes no lock; counter.hpp), so a worker parked here never waits on it.
      pthread_atfork(&prepare, &parent, &child);
      return created;
    }();
    return *registry;
  }

  void add(fork_participant* participant) {
    const std::lock_guard lock(mutex_);
    participants_.insert(participant);
  }
  void remove(fork_participant* participant) noexcept {
    const std::lock_guard lock(mutex_);
    participants_.erase(participant);
  }

 private:
  // The registry stays locked from prepare to parent/child, so no reaper is created or
  // destroyed across the fork.
  static void prepare() noexcept {
    instance().mutex_.lock();
    for (fork_participant* p : instance().participants_) p->fork_prepare();
  }
  static void parent() noexcept {
    for (fork_participant* p : instance().participants_) p->fork_parent();
    instance().mutex_.unlock();
  }
  static void child() noexcept {
    for (fork_participant* p : instance().participants_) p->fork_child();
    instance().mutex_.unlock();
  }

  std::mutex mutex_;
  std::set<fork_participant*> participants_;  // guarded by mutex_
};

// The nice values setpriority(2) accepts.
inline constexpr int min_nice = -20;
inline constexpr int max_nice = 19;
constexpr bool valid_nice(int value) noexcept { return value >= min_nice && value <= max_nice; }

// now + timeout on Clock, saturating at time_point::max() (no limit) instead of overflowing.
template <class Clock = std::chrono::steady_clock, class Rep, class Period>
typename Clock::time_point deadline_after(std::chrono::duration<Rep, Period> timeout) {
  using clock = Clock;
  const typename clock::time_point now = clock::now();
  if (timeout <= std::chrono::duration<Rep, Period>::zero()) return now;
  if (std::chrono::duration_cast<std::chrono::duration<double>>(timeout) >=
      std::chrono::duration_cast<std::chrono::duration<double>>(clock::time_point::max() - now)) {
    return clock::time_point::max();
  }
  return now + std::chrono::duration_cast<typename clock::duration>(timeout);
}

}  // namespace teardown::detail
