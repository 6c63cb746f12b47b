// teardown/sync.hpp — the Sync policy: everything a worker protocol synchronizes with.
//
// Who may call what
//   Nothing here is called directly by users. reaper and reaper_pool take their Sync policy
//   from their queue: when the queue's Atomics policy (llist<T, Hook, Atomics>,
//   sharded_llist<T, Hook, Atomics>) is also a Sync policy, the worker's own words, locks,
//   futex waits, clock, sleeps and thread use it too; otherwise they use std_sync. So a test
//   that names one policy in the queue type runs the whole protocol — producers' adds, the
//   worker's state word, flush tickets, held batches, hand counts — on its primitives.
//   tests/unit/schedule/ does that to run the real headers under a scheduler that picks which
//   thread runs at every atomic and futex operation.
//
//   A Sync policy S has, besides the Atomics members (atomic<W>, name):
//     S::atomics_policy                 the Atomics policy for the structures the worker holds
//     S::mutex, S::condition_variable   std::mutex / std::condition_variable's interfaces
//                                       (lock, unlock, try_lock; wait, wait_until with and
//                                       without a predicate, notify_one, notify_all)
//     S::clock                          a steady clock (now(), time_point, duration)
//     S::now_ns(), S::coarse_now_ns()   S::clock's now in nanoseconds (coarse: may lag by a
//                                       tick, for checks that tolerate it); noexcept
//     S::futex_wait(word, expected), S::futex_wait_for(word, expected, ns),
//     S::futex_wake_one(word)           over S::atomic<std::uint32_t>; waits may end spuriously
//     S::futex_wake_all(word)           (optional: the model's AIO context uses it)
//     S::data_written(where), S::data_read(where)
//                                       (optional) the data hooks, as for Atomics (atomics.hpp)
//     S::sleep_for(duration), S::yield()
//     S::start_thread(pthread_t*, entry, arg), S::join_thread(pthread_t)
//                                       start_thread_with_signals_blocked and pthread_join
//
//   std_sync is what the headers used before the policy existed: it adds no indirection, so a
//   reaper over a default queue compiles to the same code.
//
// Design: docs/design.md, "sync: the worker's policy, and the deterministic scheduler".
#pragma once

#include <pthread.h>
#include <sched.h>

#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "teardown/atomics.hpp"
#include "teardown/worker_thread.hpp"

namespace teardown {

/// The default Sync policy: std::atomic, std::mutex, std::condition_variable, steady_clock, a
/// private futex and pthreads.
struct std_sync : std_atomics {
  using atomics_policy = std_atomics;
  using mutex = std::mutex;
  using condition_variable = std::condition_variable;
  using clock = std::chrono::steady_clock;

  static std::uint64_t now_ns() noexcept { return detail::monotonic_ns(); }
  static std::uint64_t coarse_now_ns() noexcept { return detail::coarse_monotonic_ns(); }
  static void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected) noexcept {
    detail::futex_wait(word, expected);
  }
  static void futex_wait_for(std::atomic<std::uint32_t>& word, std::uint32_t expected, std::uint64_t ns) noexcept {
    detail::futex_wait_for(word, expected, ns);
  }
  static void futex_wake_one(std::atomic<std::uint32_t>& word) noexcept { detail::futex_wake_one(word); }
  static void futex_wake_all(std::atomic<std::uint32_t>& word) noexcept { detail::futex_wake_all(word); }
  template <class Rep, class Period>
  static void sleep_for(std::chrono::duration<Rep, Period> duration) {
    std::this_thread::sleep_for(duration);
  }
  static void yield() noexcept { sched_yield(); }
  static int start_thread(pthread_t* thread, void* (*entry)(void*), void* arg) noexcept {
    return detail::start_thread_with_signals_blocked(thread, entry, arg);
  }
  static int join_thread(pthread_t thread) noexcept { return pthread_join(thread, nullptr); }
};

/// What reaper and reaper_pool need of a Sync policy (see the header comment).
template <class S>
concept sync_policy = requires(typename S::template atomic<std::uint32_t>& word, pthread_t* thread) {
  typename S::atomics_policy;
  typename S::mutex;
  typename S::condition_variable;
  typename S::clock;
  { S::now_ns() } -> std::same_as<std::uint64_t>;
  { S::coarse_now_ns() } -> std::same_as<std::uint64_t>;
  S::futex_wait(word, std::uint32_t{0});
  S::futex_wait_for(word, std::uint32_t{0}, std::uint64_t{0});
  S::futex_wake_one(word);
  S::yield();
  { S::start_thread(thread, static_cast<void* (*)(void*)>(nullptr), nullptr) } -> std::same_as<int>;
};

namespace detail {

// The Sync policy of a worker over Queue: the queue's Atomics policy when that is a Sync
// policy, std_sync otherwise.
template <class Queue>
struct sync_of {
  using type = std_sync;
};
template <class Queue>
  requires sync_policy<typename Queue::atomics_type>
struct sync_of<Queue> {
  using type = typename Queue::atomics_type;
};

// The Sync policy a Workers policy (async_teardown's) names for its workers (`using sync =`),
// std_sync where it names none: the composition's own words (its trimmer's) take it too.
template <class Workers>
struct workers_sync {
  using type = std_sync;
};
template <class Workers>
  requires sync_policy<typename Workers::sync>
struct workers_sync<Workers> {
  using type = typename Workers::sync;
};

}  // namespace detail

template <class Queue>
using sync_of_t = typename detail::sync_of<Queue>::type;

}  // namespace teardown
