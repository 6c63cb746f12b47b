// Waiters help (reaper.hpp, "Waiters help") under the deterministic scheduler (schedule.hpp): the
// real headers, every atomic, lock and futex operation a point where the scheduler picks the
// thread that runs. Two flushes (one a flush_for) wait while the worker is held in its first
// item; each that has waited boost_after with no raise in force tears down what is queued and
// asks the worker for the unstarted half of its batch, while a producer and a reap_on_caller
// that declines some items run beside them. Asserted: each flush returns only once everything
// enqueued before it is torn down, flush_for answers true, nothing runs twice, and across the
// schedules the waiters did help (the scenario reaches what it names). A failure prints the
// schedule (TEARDOWN_SCHEDULE_REPLAY).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "schedule/scenario_support.hpp"
#include "schedule/schedule.hpp"
#include "teardown/llist.hpp"
#include "teardown/reaper.hpp"

namespace {

namespace sched = teardown::schedule;
using namespace teardown::schedule::scenario;
using namespace std::chrono_literals;


// Item 0 blocks until `go` is set (the worker held in the middle of its batch); every teardown
// yields, a point inside it.
struct held_first {
  sched::atomic<std::uint32_t>* go;
  void operator()(item& x) const noexcept {
    if (x.id == 0) wait_until_set(*go);
    sched::sync::yield();
    x.runs.fetch_add(1, std::memory_order_relaxed);
  }
};

using queue = teardown::llist<item, &item::node, sched::sync>;
using helping_reaper = teardown::reaper<item, &item::node, held_first, queue>;

// One waiter flushes without a deadline, the other with one it never reaches (a virtual 10 s:
// the clock jumps there only if every thread waits, which a lost wake-up would leave them
// doing). The timed one must answer true, also when its own help completed what it waited for.
void flush_or_flush_for(helping_reaper& reaper, bool timed) {
  if (!timed) {
    reaper.flush();
  } else {
    sched::check(reaper.flush_for(std::chrono::seconds(10)),
                 "flush_for answered false: it gave up, or would not say it was done");
  }
}



TEST(HelpScheduleTest, HelpingFlushesWaitForEverythingBeforeThemAndNothingRunsTwice) {
  constexpr std::uint64_t schedules = 10'000;
  static std::atomic<std::uint64_t> helped_runs{0};
  static std::atomic<std::uint64_t> helped_items{0};
  helped_runs = 0;
  helped_items = 0;
  const auto result = sched::explore({.name = "waiters help", .schedules = schedules}, [] {
    std::vector<item> all(8);
    for (std::size_t i = 0; i < all.size(); ++i) all[i].id = static_cast<int>(i);
    sched::atomic<std::uint32_t> go{0};
    // scenario_worker's nice 0: the waiters' own, so no raise can be in force (an ordinary user's worker).
    helping_reaper reaper(held_first{&go}, scenario_worker({.boost_after = 1ms}));
    for (std::size_t i = 0; i < 6; ++i) publish_and_enqueue(reaper, all[i]);
    const auto flusher = [&](bool timed) {
      flush_or_flush_for(reaper, timed);
      expect_once_each(all, "a flush returned", 0, 6);
    };
    sched::thread first([&] { flusher(false); });
    sched::thread second([&] { flusher(true); });
    sched::thread producer([&] {
      publish_and_enqueue(reaper, all[6]);
      publish_and_enqueue(reaper, all[7]);
    });
    sched::thread caller([&] { (void)reaper.reap_on_caller([](item& x) { return x.id % 2 == 1; }); });
    // The worker stays in item 0 until every waiter has waited a few boost_afters.
    sched::sync::sleep_for(std::chrono::milliseconds(5));
    set_and_wake(go);  // the worker, the only waiter
    first.join();
    second.join();
    producer.join();
    caller.join();
    reaper.stop();
    expect_once_each(all, "after stop", 0, all.size());
    const std::uint64_t helped = reaper.stats().helped;
    if (helped != 0) {
      helped_runs.fetch_add(1, std::memory_order_relaxed);
      helped_items.fetch_add(helped, std::memory_order_relaxed);
    }
  });
  expect_explored(result, expected_runs(schedules));
  EXPECT_GT(helped_runs.load(), 0u) << "no schedule reached a helping waiter";
  std::printf("waiters helped in %llu of %llu schedules (%llu items)\n",
              static_cast<unsigned long long>(helped_runs.load()), static_cast<unsigned long long>(result.runs),
              static_cast<unsigned long long>(helped_items.load()));
}

// The share alone: the worker holds all eight items as one batch and is caught in the first; two
// flushes wait. After item 0 the worker hands the unstarted half back, a flush takes it, and
// the other flush must not return while those are still in the helper's hands.
TEST(HelpScheduleTest, AShareInAHelpersHandsKeepsTheOtherFlushWaiting) {
  constexpr std::uint64_t schedules = 10'000;
  const auto result = sched::explore({.name = "waiters help, the share", .schedules = schedules}, [] {
    std::vector<item> all(8);
    for (std::size_t i = 0; i < all.size(); ++i) all[i].id = static_cast<int>(i);
    sched::atomic<std::uint32_t> go{0};
    helping_reaper reaper(held_first{&go}, scenario_worker({.boost_after = 1ms}));
    reaper.freeze();  // one batch: the worker takes all eight at the thaw
    for (item& x : all) publish_and_enqueue(reaper, x);
    reaper.thaw();
    const auto flusher = [&](bool timed) {
      flush_or_flush_for(reaper, timed);
      expect_once_each(all, "a flush returned", 0, all.size());
    };
    sched::thread first([&] { flusher(false); });
    sched::thread second([&] { flusher(true); });
    sched::sync::sleep_for(std::chrono::milliseconds(3));
    set_and_wake(go);  // the worker, the only waiter
    first.join();
    second.join();
    reaper.stop();
    expect_once_each(all, "after stop", 0, all.size());
  });
  expect_explored(result, expected_runs(schedules));
}

}  // namespace
