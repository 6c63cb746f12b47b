// teardown/detail/clock.hpp — the library's clocks and its one deadline rule. Internal: not part
// of the API.
//
// Who may call what: any thread; all but deadline_after are async-signal-safe.
//   monotonic_ns          steady_clock in nanoseconds (vDSO)
//   coarse_monotonic_ns   the last tick (CLOCK_MONOTONIC_COARSE): for checks that tolerate a few ms
//   thread_cpu_ns         the calling thread's CPU time (a real system call, no vDSO)
//   deadline_after        now + timeout, saturating at time_point::max() instead of overflowing
// Design: docs/design.md, "The shared internal layer".
#pragma once

#include <chrono>
#include <cstdint>
#include <ctime>

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
