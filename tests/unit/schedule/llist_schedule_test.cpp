// llist and sharded_llist under the deterministic scheduler with weak memory (memory_model.hpp):
// each node carries a stamp of what its adder (or the last owner that parked it) had done, and
// whoever takes it checks that the stamp happens before the take. A weakened order on a path
// that publishes nodes (an add's release, a take's acquire, replace_all's acq_rel, the sharded
// summary word's pair) leaves a take unordered after a stamp: the schedule fails. The same file
// holds the other primitives whose orders publish: snapshot_count (a snapshot that reads it
// first must not see it ahead of a count made before its add), event_count (a waiter that
// takes its key before it reads a relaxed condition must not sleep through the change) and
// reference_count (the last put sees what every holder did before its own put).
#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "schedule/scenario_support.hpp"
#include "schedule/schedule.hpp"
#include "teardown/event_count.hpp"
#include "teardown/llist.hpp"
#include "teardown/reference_count.hpp"
#include "teardown/sharded_llist.hpp"
#include "teardown/snapshot_count.hpp"

namespace {

namespace sched = teardown::schedule;
using namespace teardown::schedule::scenario;

using list = teardown::llist<item, &item::node, sched::sync>;
using sharded = teardown::sharded_llist<item, &item::node, sched::sync>;

constexpr std::uint64_t schedules = 10'000;

// The taker's side of every scenario: a node it took is ordered after its stamp, and counted.
void took(item& x, const char* how) {
  sched::check(sched::ordered_here(x.published),
               std::string(how) + ": node " + std::to_string(x.id) + " taken unordered after its add");
  x.runs.fetch_add(1, std::memory_order_relaxed);
}

void add_stamped(auto& to, item& x) {
  x.published = sched::publish();
  (void)to.add(x);
}

// Two adders (one add at a time, one a chain of two in one CAS) and a del_all loop.
TEST(LlistScheduleTest, AddsAndAChainArePublishedToDelAll) {
  const auto result = sched::explore({.name = "llist add/del_all", .schedules = schedules}, [] {
    std::vector<item> all = items(4);
    list l;
    {
      sched::thread one([&] {
        add_stamped(l, all[0]);
        add_stamped(l, all[1]);
      });
      sched::thread chained([&] {
        list::chain c;
        all[2].published = sched::publish();
        all[3].published = all[2].published;
        c.push_back(all[2]);
        c.push_back(all[3]);
        (void)l.add_batch(std::move(c));
      });
      for (std::size_t seen = 0; seen < all.size(); sched::sync::yield()) {
        for (item& x : l.del_all()) {
          took(x, "del_all");
          ++seen;
        }
      }
    }
    expect_once_each(all, "after del_all took them all");
  });
  expect_explored(result, expected_runs(schedules));
}

// del_first: one popper beside two adders.
TEST(LlistScheduleTest, DelFirstTakesEachAddedNodeOnceAndOrdered) {
  const auto result = sched::explore({.name = "llist del_first", .schedules = schedules}, [] {
    std::vector<item> all = items(4);
    list l;
    {
      sched::thread a([&] {
        add_stamped(l, all[0]);
        add_stamped(l, all[1]);
      });
      sched::thread b([&] {
        add_stamped(l, all[2]);
        add_stamped(l, all[3]);
      });
      for (std::size_t seen = 0; seen < all.size();) {
        if (item* x = l.del_first()) {
          took(*x, "del_first");
          ++seen;
        } else {
          sched::sync::yield();
        }
      }
    }
    expect_once_each(all, "after del_first took them all");
  });
  expect_explored(result, expected_runs(schedules));
}

// replace_all, as a worker parks the rest of its batch where a thief may take it: the owner
// takes what an adder published, stamps each node anew (its own writes), parks them, and gets
// back whatever was added meanwhile; a thief takes the parked nodes.
TEST(LlistScheduleTest, ReplaceAllPublishesTheParkedRunAndTakesWhatWasAdded) {
  const auto result = sched::explore({.name = "llist replace_all", .schedules = schedules}, [] {
    std::vector<item> all = items(4);
    list l;
    {
      sched::thread adder([&] {
        for (item& x : all) add_stamped(l, x);
      });
      sched::thread owner([&] {
        list mine;
        for (item& x : l.del_all()) {
          took(x, "del_all before replace_all");
          x.runs.fetch_sub(1, std::memory_order_relaxed);  // counted once, by whoever keeps it
          x.published = sched::publish();
          (void)mine.unsynchronized_add(x);
        }
        for (item& x : l.replace_all(mine.unsynchronized_del_all())) took(x, "replace_all's return");
      });
      sched::thread thief([&] {
        for (item& x : l.del_all()) took(x, "a thief's del_all");
      });
    }
    for (item& x : l.del_all()) took(x, "the last del_all");
    expect_once_each(all, "after the owner, the thief and the last take");
  });
  expect_explored(result, expected_runs(schedules));
}

// sharded_llist: adders on two shards, a consumer taking by flags, oldest first, then a sweep.
TEST(LlistScheduleTest, ShardedAddsArePublishedThroughTheSummaryWord) {
  const auto result = sched::explore({.name = "sharded_llist add/del_all", .schedules = schedules}, [] {
    std::vector<item> all = items(4);
    sharded l(4);
    {
      sched::thread a([&] {
        all[0].published = sched::publish();
        (void)l.add_to(0, all[0]);
        all[1].published = sched::publish();
        (void)l.add_to(1, all[1]);
      });
      sched::thread b([&] {
        all[2].published = sched::publish();
        (void)l.add_to(2, all[2]);
        all[3].published = sched::publish();
        (void)l.add_to(1, all[3]);
      });
      for (int round = 0; round < 3; ++round) {
        for (item& x : l.del_all()) took(x, "sharded del_all");
        for (item& x : l.del_all_oldest_first()) took(x, "sharded del_all_oldest_first");
      }
    }
    for (item& x : l.del_all_sweep()) took(x, "sharded sweep");
    expect_once_each(all, "after the last sweep");
  });
  expect_explored(result, expected_runs(schedules));
}

// snapshot_count: two threads each count a piece of work in a plain relaxed count, then in the
// snapshot count; a reader takes snapshots as a stats() does, the snapshot count first. A
// snapshot never shows the snapshot count ahead of the work count (weakening add_last's release
// or read_first's acquire lets the second read see an older work count).
TEST(SnapshotCountScheduleTest, ASnapshotNeverShowsTheCountAheadOfTheWorkItCounts) {
  const auto result = sched::explore({.name = "snapshot_count", .schedules = schedules}, [] {
    typename sched::sync::template atomic<std::uint64_t> work{0};
    teardown::basic_snapshot_count<sched::sync> done;
    const auto count_two = [&] {
      for (int piece = 0; piece < 2; ++piece) {
        work.fetch_add(1, std::memory_order_relaxed);
        done.add_last();
      }
    };
    {
      sched::thread a(count_two);
      sched::thread b(count_two);
      for (std::uint64_t seen = 0; seen < 4;) {
        seen = done.read_first();
        const std::uint64_t worked = work.load(std::memory_order_relaxed);
        sched::check(seen <= worked, "a snapshot shows " + std::to_string(seen) + " done of " +
                                         std::to_string(worked) + " pieces of work");
        if (seen < 4) sched::sync::yield();
      }
    }
    sched::check(done.read() == 4, "every add_last counted");
  });
  expect_explored(result, expected_runs(schedules));
}

// event_count: a worker gives back two charges of a relaxed budget, notifying after each (the
// process reaper's wait_for_budget, which has no Sync policy of its own); a waiter takes its key,
// then reads the budget, and sleeps on the key until the budget is empty. It always wakes:
// weakening notify_all's release or prepare_wait's acquire lets the waiter take the last key
// with an older budget, and sleep with nobody left to notify it (a deadlock the scheduler
// reports).
TEST(EventCountScheduleTest, AWaiterThatTakesItsKeyFirstNeverSleepsThroughTheLastRelease) {
  const auto result = sched::explore({.name = "event_count", .schedules = schedules}, [] {
    typename sched::sync::template atomic<std::uint64_t> pending{2};
    teardown::basic_event_count<sched::sync> returned;
    {
      sched::thread worker([&] {
        for (int charge = 0; charge < 2; ++charge) {
          pending.fetch_sub(1, std::memory_order_relaxed);
          returned.notify_all();
        }
      });
      for (;;) {
        const auto key = returned.prepare_wait();
        if (pending.load(std::memory_order_relaxed) == 0) break;
        returned.wait(key);
      }
    }
    sched::check(pending.load(std::memory_order_relaxed) == 0, "the waiter left with the budget not empty");
  });
  expect_explored(result, expected_runs(schedules));
}

// reference_count (the model's mm_users and mm_count): three holders, one of them made by get()
// from another's reference, and a fourth taken by get_not_zero() while the count may already be
// zero, each stamp what it did through its reference, then put it. Whoever puts last tears
// down, and every holder's stamp happens before that (weakening put's acq_rel to release or
// to acquire lets the last put read from a put it is not ordered after). The thread that starts
// another beside a sibling of its own is also the scheduler's case of a thread handle reused
// within a run.
TEST(ReferenceCountScheduleTest, TheLastPutSeesWhatEveryHolderDidBeforeItsOwnPut) {
  const auto result = sched::explore({.name = "reference_count", .schedules = schedules}, [] {
    teardown::basic_reference_count<sched::sync> count(2);
    std::array<sched::stamp, 4> done{};
    std::array<bool, 4> held{true, true, false, false};
    int teardowns = 0;
    const auto put = [&](std::size_t holder) {
      done[holder] = sched::publish();
      if (!count.put()) return;
      ++teardowns;
      for (std::size_t h = 0; h < done.size(); ++h) {
        sched::check(!held[h] || sched::ordered_here(done[h]),
                     "the last put is unordered after holder " + std::to_string(h) + "'s use");
      }
    };
    {
      sched::thread first([&] {
        count.get();  // a reference for the thread it starts, made from its own
        held[2] = true;
        sched::thread second([&] { put(2); });
        put(0);
      });
      sched::thread late([&] {
        if (count.get_not_zero()) {
          held[3] = true;
          put(3);
        }
      });
      put(1);
    }
    sched::check(teardowns == 1, "torn down " + std::to_string(teardowns) + " times");
    sched::check(count.read() == 0, "the count ended at " + std::to_string(count.read()));
  });
  expect_explored(result, expected_runs(schedules));
}

}  // namespace
