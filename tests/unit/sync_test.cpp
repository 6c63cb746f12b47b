// The Sync policy (sync.hpp) as a worker relies on it: std_sync's types are the standard ones, its clocks
// agree with its steady clock, its futex waits and wakes, its sleeps and threads do what the header says,
// and sync_of_t picks a queue's policy only when that policy is a whole Sync policy.
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>

#include "teardown/atomics.hpp"
#include "teardown/llist.hpp"
#include "teardown/sharded_llist.hpp"
#include "teardown/sync.hpp"

namespace {

using teardown::std_sync;
using namespace std::chrono_literals;

std::uint64_t steady_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

struct node {
  teardown::llist_node hook;
};

// An Atomics policy that is not a Sync policy (no mutex, clock, futex...).
struct atomics_only : teardown::std_atomics {};

// A whole Sync policy, distinct from std_sync, as tests/schedule's scheduler policy is.
struct other_sync : std_sync {};

TEST(SyncTest, StdSyncIsASyncPolicyOverTheStandardTypes) {
  static_assert(teardown::sync_policy<std_sync>);
  static_assert(teardown::sync_policy<other_sync>);
  static_assert(!teardown::sync_policy<atomics_only>);
  static_assert(!teardown::sync_policy<teardown::std_atomics>);
  static_assert(std::is_same_v<std_sync::atomics_policy, teardown::std_atomics>);
  static_assert(std::is_same_v<std_sync::atomic<std::uint32_t>, std::atomic<std::uint32_t>>);
  static_assert(std::is_same_v<std_sync::mutex, std::mutex>);
  static_assert(std::is_same_v<std_sync::condition_variable, std::condition_variable>);
  static_assert(std::is_same_v<std_sync::clock, std::chrono::steady_clock>);
  SUCCEED();
}

TEST(SyncTest, AWorkerOverADefaultQueueUsesStdSync) {
  static_assert(std::is_same_v<teardown::sync_of_t<teardown::llist<node, &node::hook>>, std_sync>);
  static_assert(std::is_same_v<teardown::sync_of_t<teardown::sharded_llist<node, &node::hook>>, std_sync>);
  // An Atomics policy that is not a Sync policy leaves the worker on std_sync.
  static_assert(std::is_same_v<teardown::sync_of_t<teardown::llist<node, &node::hook, atomics_only>>, std_sync>);
  SUCCEED();
}

TEST(SyncTest, AWorkerOverAQueueWithASyncPolicyUsesThatPolicy) {
  static_assert(std::is_same_v<teardown::sync_of_t<teardown::llist<node, &node::hook, other_sync>>, other_sync>);
  static_assert(
      std::is_same_v<teardown::sync_of_t<teardown::sharded_llist<node, &node::hook, other_sync>>, other_sync>);
  SUCCEED();
}

TEST(SyncTest, NowNsIsTheSteadyClockInNanoseconds) {
  const std::uint64_t before = steady_ns();
  const std::uint64_t now = std_sync::now_ns();
  const std::uint64_t after = steady_ns();
  EXPECT_LE(before, now);
  EXPECT_LE(now, after);
}

TEST(SyncTest, NowNsNeverGoesBack) {
  std::uint64_t last = std_sync::now_ns();
  for (int i = 0; i < 10000; ++i) {
    const std::uint64_t now = std_sync::now_ns();
    ASSERT_GE(now, last);
    last = now;
  }
}

TEST(SyncTest, CoarseNowNsLagsNowNsByAtMostATick) {
  // The coarse clock is the same monotonic clock read at the last tick: never ahead of now_ns (beyond
  // the tick it rounds to), and behind it by a scheduler tick or so. 100 ms is far beyond any tick.
  for (int i = 0; i < 100; ++i) {
    const std::uint64_t coarse = std_sync::coarse_now_ns();
    const std::uint64_t now = std_sync::now_ns();
    EXPECT_LE(coarse, now + 20'000'000u);
    EXPECT_LE(now - std::min(now, coarse), 100'000'000u);
  }
}

TEST(SyncTest, FutexWaitReturnsAtOnceWhenTheWordIsNotTheExpectedValue) {
  std::atomic<std::uint32_t> word{1};
  const auto start = std::chrono::steady_clock::now();
  std_sync::futex_wait(word, 0);  // would sleep for ever if it did not compare first
  std_sync::futex_wait_for(word, 0, 10'000'000'000u);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(SyncTest, FutexWaitForEndsAtItsLimitWithoutAWake) {
  std::atomic<std::uint32_t> word{0};
  const auto start = std::chrono::steady_clock::now();
  // Waits may end spuriously, so loop until the limit as the worker does; the loop must end.
  const std::uint64_t until = std_sync::now_ns() + 20'000'000u;
  for (std::uint64_t now = std_sync::now_ns(); now < until; now = std_sync::now_ns()) {
    std_sync::futex_wait_for(word, 0, until - now);
  }
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_GE(waited, 20ms);
  EXPECT_LT(waited, 10s);
}

TEST(SyncTest, FutexWakeOneWakesASleepingWaiter) {
  std::atomic<std::uint32_t> word{0};
  std::atomic<bool> woke{false};
  std::atomic<bool> waiting{false};
  std::thread waiter([&] {
    waiting.store(true);
    // A 30 s limit per wait: without the wake the waiter would still be asleep when the check below runs.
    while (word.load() == 0) std_sync::futex_wait_for(word, 0, 30'000'000'000u);
    woke.store(true);
  });
  while (!waiting.load()) std::this_thread::yield();
  std::this_thread::sleep_for(20ms);  // most likely asleep in the futex by now
  const auto start = std::chrono::steady_clock::now();
  word.store(1);
  std_sync::futex_wake_one(word);
  waiter.join();
  EXPECT_TRUE(woke.load());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
}

TEST(SyncTest, SleepForSleepsAtLeastTheDuration) {
  const auto start = std::chrono::steady_clock::now();
  std_sync::sleep_for(15ms);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 15ms);
}

TEST(SyncTest, YieldReturns) {
  for (int i = 0; i < 100; ++i) std_sync::yield();
  SUCCEED();
}

struct thread_probe {
  void* arg_seen = nullptr;
  bool sigint_blocked = false;
  bool sigterm_blocked = false;
  bool sigusr1_blocked = false;
  bool sigsegv_blocked = true;
  bool sigbus_blocked = true;
};

void* probe_entry(void* arg) {
  auto* probe = static_cast<thread_probe*>(arg);
  probe->arg_seen = arg;
  sigset_t mask;
  sigemptyset(&mask);
  pthread_sigmask(SIG_SETMASK, nullptr, &mask);
  probe->sigint_blocked = sigismember(&mask, SIGINT) == 1;
  probe->sigterm_blocked = sigismember(&mask, SIGTERM) == 1;
  probe->sigusr1_blocked = sigismember(&mask, SIGUSR1) == 1;
  probe->sigsegv_blocked = sigismember(&mask, SIGSEGV) == 1;
  probe->sigbus_blocked = sigismember(&mask, SIGBUS) == 1;
  return nullptr;
}

TEST(SyncTest, StartThreadRunsTheEntryWithItsArgumentAndJoinThreadWaitsForIt) {
  thread_probe probe;
  pthread_t thread{};
  ASSERT_EQ(std_sync::start_thread(&thread, &probe_entry, &probe), 0);
  EXPECT_EQ(std_sync::join_thread(thread), 0);
  EXPECT_EQ(probe.arg_seen, &probe);  // join_thread returned after the entry ran
}

TEST(SyncTest, StartedThreadBlocksProcessSignalsButNotFaults) {
  thread_probe probe;
  pthread_t thread{};
  ASSERT_EQ(std_sync::start_thread(&thread, &probe_entry, &probe), 0);
  ASSERT_EQ(std_sync::join_thread(thread), 0);
  EXPECT_TRUE(probe.sigint_blocked);
  EXPECT_TRUE(probe.sigterm_blocked);
  EXPECT_TRUE(probe.sigusr1_blocked);
  EXPECT_FALSE(probe.sigsegv_blocked);  // a fault fn causes is delivered to the worker itself
  EXPECT_FALSE(probe.sigbus_blocked);
}

TEST(SyncTest, StartThreadLeavesTheCallersSignalMaskAsItWas) {
  sigset_t before;
  sigset_t after;
  sigemptyset(&before);
  sigemptyset(&after);
  pthread_sigmask(SIG_SETMASK, nullptr, &before);
  thread_probe probe;
  pthread_t thread{};
  ASSERT_EQ(std_sync::start_thread(&thread, &probe_entry, &probe), 0);
  ASSERT_EQ(std_sync::join_thread(thread), 0);
  pthread_sigmask(SIG_SETMASK, nullptr, &after);
  for (const int signal_number : {SIGINT, SIGTERM, SIGUSR1, SIGUSR2, SIGHUP}) {
    EXPECT_EQ(sigismember(&before, signal_number), sigismember(&after, signal_number)) << signal_number;
  }
}

TEST(SyncTest, MutexAndConditionVariableHandAValueAcrossThreads) {
  // What the reaper's control plane does with them: a request under the mutex, a wait with a predicate.
  std_sync::mutex mutex;
  std_sync::condition_variable changed;
  int value = 0;
  std::thread producer([&] {
    const std::lock_guard lock(mutex);
    value = 42;
    changed.notify_all();
  });
  std::unique_lock lock(mutex);
  const bool seen = changed.wait_until(lock, std_sync::clock::now() + 30s, [&] { return value == 42; });
  lock.unlock();
  producer.join();
  EXPECT_TRUE(seen);
}

TEST(SyncTest, ConditionWaitUntilEndsAtItsDeadline) {
  std_sync::mutex mutex;
  std_sync::condition_variable never;
  std::unique_lock lock(mutex);
  const auto start = std_sync::clock::now();
  EXPECT_FALSE(never.wait_until(lock, start + 10ms, [] { return false; }));
  EXPECT_GE(std_sync::clock::now() - start, 10ms);
}

}  // namespace
