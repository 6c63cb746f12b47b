// teardown/detail/futex.hpp — a private futex on a 32-bit atomic word (std::atomic::wait where
// there is no futex). Internal: not part of the API.
//
// Who may call what: any thread. The waits block and may return spuriously (the caller re-reads
// its word); the wakes are async-signal-safe. The futex orders nothing by itself: a waker
// changes the word with a release operation before it wakes, and a waiter reads it with acquire
// before it decides to sleep (each caller names that pair where it does so).
// Design: docs/design.md, "The shared internal layer".
#pragma once

#include <atomic>
#include <cstdint>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>
#else
#include <algorithm>
#include <ctime>
#endif

namespace teardown::detail {

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

// Wakes every waiter (process_reaper's wait_for_budget: any number of threads wait on one word).
inline void futex_wake_all(std::atomic<std::uint32_t>& word) noexcept {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
#else
  word.notify_all();
#endif
}

}  // namespace teardown::detail
