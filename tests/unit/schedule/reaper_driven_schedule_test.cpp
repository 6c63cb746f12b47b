// Driven mode (reaper.hpp, "Driven mode") under the deterministic scheduler (schedule.hpp):
// concurrent run(), flush() and enqueue through chosen interleavings, and a planted bug the
// exploration must find. A failure prints the schedule's name (TEARDOWN_SCHEDULE_REPLAY=<name>).
#include <gtest/gtest.h>

#include <atomic>
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



template <class Sync>
using driven_reaper = teardown::reaper<item, &item::node, count_runs, teardown::llist<item, &item::node, Sync>>;

teardown::reaper_options driven() {
  teardown::reaper_options opts;
  opts.driven = true;
  return opts;
}



constexpr std::uint64_t schedules = 2'000;


// Two callers' bounded runs, a producer and two flushes: each flush returns only after what was
// enqueued before it is torn down; every item is torn down exactly once. (planted_bugs.py plants
// a driven flush that skips the drive lock: flush_skips_drive_lock.)
template <class Sync>
sched::explore_result explore_run_flush_enqueue(const char* name) {
  return sched::explore({.name = name, .schedules = schedules}, [] {
    std::vector<item> all = items(5);
    {
      driven_reaper<Sync> reaper(count_runs{}, driven());
      sched::thread driver_a([&] { (void)reaper.run({.items = 1}); });
      sched::thread driver_b([&] { (void)reaper.run({.items = 2}); });
      sched::thread producer([&] {
        publish_and_enqueue(reaper, all[0]);
        publish_and_enqueue(reaper, all[1]);
        reaper.flush();
        expect_once_each(all, "flush after enqueue", 0, 2);
      });
      publish_and_enqueue(reaper, all[2]);
      publish_and_enqueue(reaper, all[3]);
      reaper.flush();
      expect_once_each(all, "flush after enqueue", 2, 4);
      driver_a.join();
      driver_b.join();
      producer.join();
      publish_and_enqueue(reaper, all[4]);
    }  // the destructor's stop tears down what is left
    expect_once_each(all, "after the destructor", 0, all.size());
  });
}

TEST(DrivenScheduleTest, RunFlushAndEnqueueTearDownEachItemOnceAndFlushIsABarrier) {
  const auto result = explore_run_flush_enqueue<sched::sync>("driven run/flush/enqueue");
  expect_explored(result, expected_runs(schedules));
}

// Freeze against runs and a flush: fn never starts while frozen, and everything runs once.
TEST(DrivenScheduleTest, FreezeParksRunsAndFlushUntilThaw) {
  const auto result = sched::explore({.name = "driven freeze", .schedules = schedules}, [] {
    std::vector<item> all = items(3);
    std::atomic<bool> frozen{false};
    struct frozen_check {
      std::atomic<bool>* frozen;
      void operator()(item& x) const noexcept {
        sched::check(!frozen->load(std::memory_order_relaxed), "fn ran while the reaper was frozen");
        x.runs.fetch_add(1, std::memory_order_relaxed);
      }
    };
    teardown::reaper<item, &item::node, frozen_check, teardown::llist<item, &item::node, sched::sync>> reaper(
        frozen_check{&frozen}, driven());
    for (item& x : all) publish_and_enqueue(reaper, x);
    sched::thread driver([&] {
      (void)reaper.run({.items = 1});
      (void)reaper.run({.items = 1});
    });
    sched::thread flusher([&] { reaper.flush(); });
    reaper.freeze();
    frozen.store(true, std::memory_order_relaxed);
    sched::sync::yield();
    frozen.store(false, std::memory_order_relaxed);
    reaper.thaw();
    driver.join();
    flusher.join();
    expect_once_each(all, "after thaw and flush", 0, all.size());
  });
  expect_explored(result, expected_runs(schedules));
}

// A freeze against a bounded run that ends holding the rest of its batch: once freeze returns,
// nothing is held by a run, so everything not yet torn down is on the queue, where a
// reap_on_caller during the freeze is offered it.
TEST(DrivenScheduleTest, AFreezeReturnsOnlyOnceNoRunHoldsItems) {
  const auto result = sched::explore({.name = "driven freeze after a bounded run", .schedules = schedules}, [] {
    std::vector<item> all = items(4);
    driven_reaper<sched::sync> reaper(count_runs{}, driven());
    for (item& x : all) publish_and_enqueue(reaper, x);
    sched::thread driver([&] { (void)reaper.run({.items = 1}); });
    reaper.freeze();
    std::size_t offered = 0;
    (void)reaper.reap_on_caller([&](item&) {
      ++offered;
      return false;
    });
    std::size_t torn_down = 0;
    for (const item& x : all) torn_down += static_cast<std::size_t>(x.runs.load(std::memory_order_relaxed));
    sched::check(offered + torn_down == all.size(),
                 "frozen: " + std::to_string(offered) + " offered and " + std::to_string(torn_down) +
                     " torn down of " + std::to_string(all.size()) + ": the rest is held by a run");
    reaper.thaw();
    driver.join();
    reaper.flush();
    expect_once_each(all, "after thaw and flush", 0, all.size());
  });
  expect_explored(result, expected_runs(schedules));
}

}  // namespace
