// Shared helpers for the teardown test suite: the Atomics backends every typed test runs on,
// and the sanitizer-aware sizing of stress tests.
#pragma once

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <optional>
#include <string>
#include <thread>

#include "teardown/atomics.hpp"

namespace teardown_test {

// True when this translation unit is built with ThreadSanitizer or AddressSanitizer. GCC
// announces them with __SANITIZE_THREAD__ / __SANITIZE_ADDRESS__, Clang with __has_feature.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
inline constexpr bool under_sanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
inline constexpr bool under_sanitizer = true;
#else
inline constexpr bool under_sanitizer = false;
#endif
#else
inline constexpr bool under_sanitizer = false;
#endif

// True under ThreadSanitizer alone (its munmap interceptor, for one, crashes on a non-user address).
#if defined(__SANITIZE_THREAD__)
inline constexpr bool under_thread_sanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool under_thread_sanitizer = true;
#else
inline constexpr bool under_thread_sanitizer = false;
#endif
#else
inline constexpr bool under_thread_sanitizer = false;
#endif

// A stress-test size: n normally, about a tenth of it (at least 1) under a sanitizer, which
// slows every atomic and memory access by an order of magnitude. Fewer objects per run also
// make races surface sooner (crossbeam does the same).
constexpr std::size_t scaled(std::size_t n) noexcept {
  return under_sanitizer ? std::max<std::size_t>(n / 10, 1) : n;
}

// Every typed test runs on each Atomics policy this build offers. The instances keep gtest's
// numeric names (Suite/0, Suite/1): CMake's gtest_discover_tests turns those into CTest names
// that end in the policy, e.g. "LlistTest.DelAllYieldsNewestFirst<teardown::ao_atomics>".
#if TEARDOWN_AO_ATOMICS_AVAILABLE
using atomics_backends = ::testing::Types<teardown::std_atomics, teardown::ao_atomics>;
#else
using atomics_backends = ::testing::Types<teardown::std_atomics>;
#endif

// Waits for done() to hold; false if it still does not after `limit`, a bound far beyond any
// right answer: a hang guard that turns a wrong setup into a failure, not a time assertion.
template <class Predicate>
[[nodiscard]] bool eventually(Predicate done, std::chrono::nanoseconds limit = std::chrono::seconds(60)) {
  const auto give_up = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return true;
}

// Sets `go` once `limit` has passed, unless the test set it first: a test that holds a teardown
// until `go` checks that a timed wait returned while `go` was still false, and when the wait
// ignores its deadline, this lets the teardown go so that the test ends (and fails).
class go_at_the_latest {
 public:
  go_at_the_latest(std::atomic<bool>& go, std::chrono::nanoseconds limit)
      : thread_([&go, limit] {
          (void)eventually([&] { return go.load(); }, limit);
          go.store(true);
        }) {}
  go_at_the_latest(const go_at_the_latest&) = delete;
  go_at_the_latest& operator=(const go_at_the_latest&) = delete;
  ~go_at_the_latest() { thread_.join(); }

 private:
  std::thread thread_;
};

// The two checks of a timed wait under go_at_the_latest: it answered false, and it did so before
// `go` let go of what it waited for. `what` names the wait in the failure.
inline void expect_gave_up_before_go(bool answer, const std::atomic<bool>& go, const char* what) {
  EXPECT_FALSE(answer) << what << " answered true while what it waits for was held";
  EXPECT_FALSE(go.load()) << what << " waited past its deadline";
}

// Why this process may not lower a thread's nice from 19 to `to` (no CAP_SYS_NICE and an
// RLIMIT_NICE that does not reach it: an ordinary user), or nothing where it may. Asked of the
// kernel itself, on a thread of its own: a test of the privileged path skips with this reason,
// and the unprivileged path is the one such a process runs.
inline std::optional<std::string> nice_lowering_refused(int to) {
  int error = 0;
  std::thread probe([&] {
    const auto tid = static_cast<id_t>(syscall(SYS_gettid));
    if (setpriority(PRIO_PROCESS, tid, 19) != 0 || setpriority(PRIO_PROCESS, tid, to) != 0) error = errno;
  });
  probe.join();
  if (error == 0) return std::nullopt;
  rlimit limit{};
  (void)getrlimit(RLIMIT_NICE, &limit);
  return "lowering a thread's nice from 19 to " + std::to_string(to) + " is refused here (" + std::strerror(error) +
         "; no CAP_SYS_NICE, RLIMIT_NICE " +
         (limit.rlim_cur == RLIM_INFINITY ? std::string("unlimited") : std::to_string(limit.rlim_cur)) +
         "): the privileged path cannot be tested as this user";
}

// The nice a reaper's worker runs at when its options ask for `asked` and keep the default rule
// (a boost on, nice_only_if_raisable): `asked` where this process may raise it back to the calling
// thread's nice, that nice elsewhere (an ordinary user: no nice is applied that no boost could undo).
inline int default_worker_nice(int asked = 19) {
  errno = 0;
  const int caller = getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
  if (asked <= caller || !nice_lowering_refused(caller)) return asked;
  return caller;
}

}  // namespace teardown_test
