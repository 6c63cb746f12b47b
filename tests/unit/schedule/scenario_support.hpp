// What the schedule tests' scenarios share: the item they tear down, a teardown that yields, the
// check that each item ran exactly once, a signal from one scenario thread to another, and how
// many schedules a test expects explore to run.
// Scenario code only. The item's plain atomics are the tests' own bookkeeping, not scheduling
// points; a signal's word is a scheduled atomic, each load, store and futex call a point.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "schedule/schedule.hpp"
#include "teardown/llist.hpp"
#include "teardown/reaper.hpp"

namespace teardown::schedule::scenario {

struct item {
  teardown::llist_node node;
  std::atomic<int> runs{0};           // plain atomics: the test's own bookkeeping, not a point
  std::atomic<bool> enqueued{false};  // its enqueue returned
  std::atomic<bool> taken{false};     // a recorded_queue's take took it
  std::atomic<int> taker{-1};         // the thread whose take took it last (a taker_queue's)
  int id = 0;
  stamp published;                    // what its producer had done when it enqueued it
  stamp torn_down;                    // what its teardown had done when it ended (count_runs)
};

// Enqueues x after stamping it: its teardown checks that the stamp happens before it (under
// weak memory, a teardown not ordered after the enqueue reads the item racily).
template <class Reaper>
void publish_and_enqueue(Reaper& reaper, item& x) {
  x.published = publish();
  reaper.enqueue(x);
}

// The options a scenario's worker starts from. No spinning before a sleep: each poll would be a
// point, and the sleep is the protocol. Nice 0, the scenario's own: the scheduler runs one
// thread at a time, so a nice value changes no schedule, but a nice-19 worker shares the
// exploration's CPU with whatever else runs there at 1.5% of its weight (beside one spinner,
// a test took 31 s instead of 4.4 s as root, where the default nice 19 is applied).
inline teardown::reaper_options scenario_worker(teardown::reaper_options opts = {}) {
  opts.spin_polls = 0;
  opts.nice = 0;
  return opts;
}

// A teardown takes time: the yield inside it is where a flush or stop that ought to wait for it
// may try to return.
struct count_runs {
  void operator()(item& x) const noexcept {
    check(ordered_here(x.published), "item " + std::to_string(x.id) + " torn down unordered after its enqueue");
    sync::yield();
    x.torn_down = publish();
    x.runs.fetch_add(1, std::memory_order_relaxed);
  }
};

inline std::vector<item> items(int n) {
  std::vector<item> made(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) made[static_cast<std::size_t>(i)].id = i;
  return made;
}

// A scheduling check (it fails the schedule, which explore reports by name) that each of
// all[from, to) was torn down exactly once, and that its teardown happens before the caller's
// now (a flush or a stop returns ordered after the teardowns it waited for).
inline void expect_once_each(const std::vector<item>& all, const char* when, std::size_t from = 0,
                             std::size_t to = ~std::size_t{0}) {
  for (std::size_t i = from; i < std::min(to, all.size()); ++i) {
    const int runs = all[i].runs.load(std::memory_order_relaxed);
    check(runs == 1, std::string(when) + ": item " + std::to_string(all[i].id) + " torn down " +
                         std::to_string(runs) + " times");
    check(runs != 1 || ordered_here(all[i].torn_down),
          std::string(when) + ": unordered after item " + std::to_string(all[i].id) + "'s teardown");
  }
}

// A scenario thread signals another: sets `word` to 1 and wakes one waiter. `order` is the
// store's: release where the waiter must see what this thread did before.
inline void set_and_wake(atomic<std::uint32_t>& word, std::memory_order order = std::memory_order_relaxed) {
  word.store(1, order);
  sync::futex_wake_one(word);
}

// And waits for the signal: until `word` reads nonzero, futex-waiting on the value it read (so
// the scheduler runs the others). `order` is the load's: acquire where the waiter must see what
// the signaller did before it set the word.
inline void wait_until_set(atomic<std::uint32_t>& word, std::memory_order order = std::memory_order_relaxed) {
  for (std::uint32_t seen; (seen = word.load(order)) == 0;) sync::futex_wait(word, seen);
}

// What explore runs for `asked`: one schedule when replaying, TEARDOWN_SCHEDULES when set, a
// tenth under a sanitizer.
inline std::uint64_t expected_runs(std::uint64_t asked) {
  if (std::getenv("TEARDOWN_SCHEDULE_REPLAY") != nullptr) return 1;
  if (const char* count = std::getenv("TEARDOWN_SCHEDULES")) return std::stoull(count);
  return detail::under_sanitizer() ? asked / 10 : asked;
}

// No schedule failed, and explore ran at least `at_least` (expected_runs of what was asked).
inline void expect_explored(const explore_result& result, std::uint64_t at_least) {
  EXPECT_FALSE(result.failure.has_value()) << *result.failure << " (schedule " << result.failed_schedule << ")";
  EXPECT_GE(result.runs, at_least);
}

}  // namespace teardown::schedule::scenario
