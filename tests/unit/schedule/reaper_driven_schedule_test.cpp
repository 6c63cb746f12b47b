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



constexpr std::uint64_t schedules = 10'000;


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

// A driven stop beside an enqueue that nothing orders with it: the stop's STOPPED exchange
// acquires every kick before it, so its drain takes that add; a kick after it reads STOPPED
// and its producer drains. Once the stop and the enqueues returned, nothing is left queued.
TEST(DrivenScheduleTest, AnEnqueueRacingADrivenStopIsTornDownByTheStopOrByItsProducer) {
  const auto result = sched::explore({.name = "driven stop beside an enqueue", .schedules = schedules}, [] {
    std::vector<item> all = items(2);
    {
      driven_reaper<sched::sync> reaper(count_runs{}, driven());
      sched::thread producer([&] {
        publish_and_enqueue(reaper, all[0]);
        publish_and_enqueue(reaper, all[1]);
      });
      reaper.stop();
      producer.join();
      expect_once_each(all, "once the stop and the enqueues returned");
    }
    expect_once_each(all, "after the destructor");
  });
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

// Driven mode as a program wires it: on_work posts each signal's drive_handle to an executor
// thread, which runs it, while the main thread enqueues, flushes and then destroys the reaper.
// Every item is torn down once and before the flush or the destructor that waited for it; a
// handle run once the destructor has returned finds no reaper and does nothing. The handles'
// gate is locked with the reaper's Sync mutex, so its waits are the scheduler's too.
TEST(DrivenScheduleTest, HandlesPostedToAnExecutorRunBesideFlushAndDestruction) {
  const auto result = sched::explore({.name = "drive handles on an executor", .schedules = schedules}, [] {
    std::vector<item> all = items(3);
    struct mailbox {
      sched::mutex lock;
      std::vector<teardown::drive_handle> posted;  // under lock
      sched::atomic<std::uint32_t> count{0};       // posted, or a last post-less wake (done)
      std::atomic<bool> reaper_gone{false};
    } box;
    sched::thread executor([&box] {
      std::size_t ran = 0;
      for (;;) {
        teardown::drive_handle next;
        bool have = false;
        {
          const std::lock_guard hold(box.lock);
          if (ran < box.posted.size()) {
            next = box.posted[ran++];
            have = true;
          }
        }
        if (have) {
          const bool gone_before = box.reaper_gone.load(std::memory_order_relaxed);
          const teardown::drive_result did = next({.items = 2});
          sched::check(!gone_before || did.items == 0, "a handle ran teardowns after its reaper was destroyed");
          continue;
        }
        const std::uint32_t seen = box.count.load(std::memory_order_acquire);
        if (box.reaper_gone.load(std::memory_order_relaxed)) {
          const std::lock_guard hold(box.lock);
          if (ran == box.posted.size()) return;
          continue;
        }
        sched::sync::futex_wait(box.count, seen);
      }
    });
    {
      teardown::reaper_options opts = driven();
      opts.on_work = [&box](teardown::drive_handle handle) {
        {
          const std::lock_guard hold(box.lock);
          box.posted.push_back(std::move(handle));
        }
        box.count.fetch_add(1, std::memory_order_release);
        sched::sync::futex_wake_one(box.count);
      };
      driven_reaper<sched::sync> reaper(count_runs{}, opts);
      publish_and_enqueue(reaper, all[0]);
      publish_and_enqueue(reaper, all[1]);
      reaper.flush();
      expect_once_each(all, "flush after enqueue", 0, 2);
      publish_and_enqueue(reaper, all[2]);
    }  // the destructor waits for a handle's run in progress, then stops
    expect_once_each(all, "after the destructor", 0, all.size());
    box.reaper_gone.store(true, std::memory_order_relaxed);
    box.count.fetch_add(1, std::memory_order_release);
    sched::sync::futex_wake_one(box.count);
    executor.join();
  });
  expect_explored(result, expected_runs(schedules));
}

}  // namespace
