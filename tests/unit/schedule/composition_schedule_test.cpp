// The reaper's control plane under the deterministic scheduler (schedule.hpp), where the other
// schedule tests leave a gap: a thaw with two waiters on the control condition (caught only since
// a wake of one wakes the waiter the schedule picks), and stop beside an inline drain of items a
// reap_on_caller put back (a window the stop scenario of reaper_schedule_test meets once in
// thousands of schedules). Each is caught by a plant in planted_bugs.py. A failure prints the
// schedule's name (TEARDOWN_SCHEDULE_REPLAY=<name>).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "schedule/scenario_support.hpp"
#include "schedule/schedule.hpp"
#include "teardown/async_teardown.hpp"
#include "teardown/llist.hpp"
#include "teardown/model/aio.hpp"
#include "teardown/reaper.hpp"

namespace {

namespace sched = teardown::schedule;
using namespace teardown::schedule::scenario;



using queue = teardown::llist<item, &item::node, sched::sync>;
using scheduled_reaper = teardown::reaper<item, &item::node, count_runs, queue>;



constexpr std::uint64_t schedules = 10'000;


// A flush that waits from before a freeze, and the thaw: while frozen, two threads wait on the
// control condition, the flusher (its ticket not done) and the parked worker. The thaw must
// wake both: a thaw that wakes one (notify_one) wakes the flusher in the schedules that pick
// it, which waits again, and the worker stays parked: a deadlock (planted_bugs.py:
// thaw_wakes_one). No boost, so that the flusher waits without a limit and does not help.
TEST(CompositionScheduleTest, ThawWakesAFlushThatWaitedFromBeforeTheFreeze) {
  const auto result = sched::explore({.name = "flush across freeze/thaw", .schedules = schedules}, [] {
    std::vector<item> all = items(2);
    teardown::reaper_options opts = scenario_worker();
    opts.boost_after = std::chrono::nanoseconds(0);
    scheduled_reaper reaper(count_runs{}, opts);
    for (item& x : all) publish_and_enqueue(reaper, x);
    sched::thread flusher([&] {
      reaper.flush();
      expect_once_each(all, "flush after enqueue");
    });
    reaper.freeze();
    // Ends once every other thread waits (or the yields of a teardown carry the clock there):
    // the flusher on its ticket, unless the worker completed it before parking.
    sched::sync::sleep_for(std::chrono::milliseconds(1));
    reaper.thaw();
    flusher.join();
    reaper.stop();
    expect_once_each(all, "after stop");
  });
  expect_explored(result, expected_runs(schedules));
}

// stop() against an inline drain of items a reap_on_caller put back. Items 0 and 1 wait on a
// frozen reaper; a caller takes them and holds them until stop() is about to be called, then
// declines them: put back before the worker's end, they go to whoever takes first, the worker's
// final drain or a producer whose enqueue, once the worker has published its end, finds the
// reaper stopped and drains inline. stop() must return only once both are torn down: it waits
// out the caller's reap and every inline drain in progress (a hand). An inline drain that is not
// counted as a hand lets stop return while the producer still tears an item down
// (planted_bugs.py: uncounted_drain); items 0 and 1 take a millisecond each,
// so that stop, if it does not wait, returns meanwhile.
TEST(CompositionScheduleTest, StopWaitsForAnInlineDrainOfPutBackItems) {
  const auto result = sched::explore({.name = "stop beside a put-back and an inline drain", .schedules = schedules},
                                     [] {
    std::vector<item> all = items(3);
    {
      teardown::reaper_options opts = scenario_worker();
      opts.boost_after = std::chrono::nanoseconds(0);
      struct slow_first_two {
        void operator()(item& x) const noexcept {
          if (x.id < 2) sched::sync::sleep_for(std::chrono::milliseconds(1));
          count_runs{}(x);
        }
      };
      teardown::reaper<item, &item::node, slow_first_two, queue> reaper(slow_first_two{}, opts);
      reaper.freeze();
      publish_and_enqueue(reaper, all[0]);
      publish_and_enqueue(reaper, all[1]);
      sched::atomic<std::uint32_t> held{0};
      sched::atomic<std::uint32_t> go{0};
      sched::thread caller([&] {
        (void)reaper.reap_on_caller([&](item&) {
          set_and_wake(held);
          wait_until_set(go);
          return false;
        });
      });
      wait_until_set(held);
      sched::thread producer([&] {
        while (reaper.stats().running) sched::sync::yield();  // the worker has published its end
        publish_and_enqueue(reaper, all[2]);  // finds the reaper stopped: tears down inline, and drains
      });
      set_and_wake(go);
      reaper.stop();
      // Items 0 and 1, enqueued before stop: torn down once, and before stop returned.
      expect_once_each(all, "when stop returned", 0, 2);
      producer.join();
      caller.join();
    }
    expect_once_each(all, "after the reaper's end");
  });
  expect_explored(result, expected_runs(schedules));
}

// async_teardown through its public API, its worker on the scheduler's queue (the Workers policy
// below): two producers put items, a third thread drains what fits a cost, the main thread
// flushes meanwhile and again at the end. Under weak memory each item's destroy is ordered after
// its put; every item is destroyed once; after the last flush nothing is pending and the budget
// holds nothing; the trimmer's trims ran on the worker only (never on a producer or a drainer,
// whose inline and drained frees it counts), at least one of them.
struct piece {
  teardown::llist_node node;
  std::uint64_t charge = 0;
  sched::stamp published;
  std::atomic<int> runs{0};
  int id = 0;
};
thread_local bool on_a_scenario_thread = false;  // the scenario's own threads, not the worker
std::atomic<int> trims_on_callers{0};
std::atomic<int> trims{0};
int counting_trim(std::size_t) {
  if (on_a_scenario_thread) trims_on_callers.fetch_add(1, std::memory_order_relaxed);
  trims.fetch_add(1, std::memory_order_relaxed);
  return 0;
}
struct piece_traits {
  std::uint64_t cost(const piece&) const noexcept { return 100; }
  bool eligible(const piece&, std::uint64_t) const noexcept { return true; }
  void prepare(piece&) const noexcept {}
  void destroy(piece& x) const noexcept {
    sched::check(sched::ordered_here(x.published),
                 "piece " + std::to_string(x.id) + " destroyed unordered after its put");
    sched::sync::yield();
    x.runs.fetch_add(1, std::memory_order_relaxed);
  }
  std::uint64_t& charge(piece& x) const noexcept { return x.charge; }
};
struct scheduled_one_reaper : teardown::one_reaper {
  template <class T, teardown::llist_node T::*Hook, class Fn>
  using type = teardown::reaper<T, Hook, Fn, teardown::llist<T, Hook, sched::sync>>;
  using sync = sched::sync;  // the composition's trimmer too
};
using scheduled_composition =
    teardown::async_teardown<piece, &piece::node, piece_traits, teardown::static_key, scheduled_one_reaper>;

TEST(CompositionScheduleTest, AsyncTeardownPutsDrainsFlushesAndTrimsOnTheWorker) {
  const auto result = sched::explore({.name = "async_teardown put/drain/flush/trim", .schedules = schedules}, [] {
    on_a_scenario_thread = true;
    trims_on_callers.store(0, std::memory_order_relaxed);
    trims.store(0, std::memory_order_relaxed);
    std::vector<piece> all(5);
    for (std::size_t i = 0; i < all.size(); ++i) all[i].id = static_cast<int>(i);
    teardown::async_teardown_options opts;
    opts.max_pending = 250;  // two queued at most: the others are rejected, torn down inline
    opts.reaper = scenario_worker(opts.reaper);
    opts.reaper.boost_after = std::chrono::nanoseconds(0);
    opts.trim = {.after = 200, .trim = &counting_trim};
    {
      scheduled_composition composition(opts);
      const auto put = [&](std::size_t i) {
        all[i].published = sched::publish();
        (void)composition.put(all[i]);
      };
      {
        sched::thread a([&] {
          on_a_scenario_thread = true;
          put(0);
          put(1);
          put(2);
        });
        sched::thread b([&] {
          on_a_scenario_thread = true;
          put(3);
          put(4);
        });
        sched::thread drainer([&] {
          on_a_scenario_thread = true;
          (void)composition.drain(150);
        });
        composition.flush();
      }
      composition.flush();
      for (const piece& x : all) {
        sched::check(x.runs.load(std::memory_order_relaxed) == 1,
                     "piece " + std::to_string(x.id) + " destroyed " + std::to_string(x.runs.load()) + " times");
      }
      const auto stats = composition.stats();
      sched::check(stats.reaped == stats.queued && stats.pending == 0,
                   "after the last flush: queued " + std::to_string(stats.queued) + ", reaped " +
                       std::to_string(stats.reaped) + ", pending " + std::to_string(stats.pending));
      sched::check(trims.load(std::memory_order_relaxed) >= 1, "500 cost units freed and no trim (after = 200)");
      composition.stop();
    }
    sched::check(trims_on_callers.load(std::memory_order_relaxed) == 0, "a trim ran on a producer or a drainer");
  });
  expect_explored(result, expected_runs(schedules));
}

// The trimmer's promise without a flush: once the worker is idle, at most `after` is left
// untrimmed, whoever freed it. A drainer races the worker for three pieces (300 units, after =
// 200), and the main thread waits for a trim without flushing (a flush would ask for one
// itself): the worker must trim on its own batch end or on the batch end the drain asks for
// (request_after_batch), reading the drain's count through that request under weak memory. A
// trim that never comes is a deadlock; every trim is on the worker.
TEST(CompositionScheduleTest, WhatADrainFreesIsTrimmedOnTheIdleWorkerWithoutAFlush) {
  const auto result = sched::explore({.name = "async_teardown drain then trim", .schedules = schedules}, [] {
    on_a_scenario_thread = true;
    trims_on_callers.store(0, std::memory_order_relaxed);
    trims.store(0, std::memory_order_relaxed);
    static sched::atomic<std::uint32_t> trimmed{0};  // counting_trim's, for the wait below
    trimmed.store(0, std::memory_order_relaxed);
    std::vector<piece> all(3);
    for (std::size_t i = 0; i < all.size(); ++i) all[i].id = static_cast<int>(i);
    teardown::async_teardown_options opts;
    opts.reaper = scenario_worker(opts.reaper);
    opts.trim = {.after = 200, .trim = [](std::size_t pad) {
                   const int returned = counting_trim(pad);
                   trimmed.fetch_add(1, std::memory_order_relaxed);
                   sched::sync::futex_wake_one(trimmed);
                   return returned;
                 }};
    {
      scheduled_composition composition(opts);
      for (piece& x : all) {
        x.published = sched::publish();
        (void)composition.put(x);
      }
      sched::thread drainer([&] {
        on_a_scenario_thread = true;
        (void)composition.drain(~std::uint64_t{0});
      });
      drainer.join();
      for (std::uint32_t seen; (seen = trimmed.load(std::memory_order_relaxed)) == 0;) {
        sched::sync::futex_wait(trimmed, seen);
      }
      composition.stop();
    }
    for (const piece& x : all) {
      sched::check(x.runs.load(std::memory_order_relaxed) == 1,
                   "piece " + std::to_string(x.id) + " destroyed " + std::to_string(x.runs.load()) + " times");
    }
    sched::check(trims_on_callers.load(std::memory_order_relaxed) == 0, "a trim ran on a producer or a drainer");
  });
  expect_explored(result, expected_runs(schedules));
}


// stats() beside every way a put ends (async_teardown.hpp, "each subset before its superset"):
// small pieces go inline (inline_small), a put with no other in flight goes inline
// (min_concurrent 2: inline_uncontended), a full budget rejects (inline_rejected), a put
// behind a teardown that outlasts the stall threshold goes inline (inline_stalled), the rest
// queue and are reaped by the worker or drained (drained within reaped). The counters are on
// the workers' Sync policy, so under weak memory a reader's snapshot may see a subset's add
// only with the superset's before it: never drained > reaped > queued, nor inline subsets
// above inline_total.
struct sized_piece_traits : piece_traits {
  std::uint64_t cost(const piece& x) const noexcept { return x.id % 3 == 2 ? 10 : 100; }
};
using stats_composition =
    teardown::async_teardown<piece, &piece::node, sized_piece_traits, teardown::static_key, scheduled_one_reaper>;

TEST(CompositionScheduleTest, AStatsSnapshotNeverSeesASubsetAboveItsSuperset) {
  // Runs in which each way of ending was taken: the scenario must reach all of them.
  std::uint64_t drained = 0, rejected = 0, uncontended = 0, small = 0, stalled = 0;
  const auto result = sched::explore({.name = "async_teardown stats snapshots", .schedules = schedules}, [&] {
    std::vector<piece> all(6);
    for (std::size_t i = 0; i < all.size(); ++i) all[i].id = static_cast<int>(i);
    teardown::async_teardown_options opts;
    opts.threshold = 50;        // cost 10 (ids 2, 5): inline_small
    opts.max_pending = 250;     // two queued at most: inline_rejected
    opts.min_concurrent = 2;    // a put alone: inline_uncontended
    opts.reaper = scenario_worker(opts.reaper);
    opts.reaper.stall_threshold = std::chrono::nanoseconds(0);  // any wait behind a teardown: inline_stalled
    {
      stats_composition composition(opts);
      const auto put = [&](std::size_t from, std::size_t to) {
        for (std::size_t i = from; i < to; ++i) {
          all[i].published = sched::publish();
          (void)composition.put(all[i]);
        }
      };
      const auto check_snapshot = [&] {
        const auto s = composition.stats();
        sched::check(s.drained <= s.reaped && s.reaped <= s.queued,
                     "a snapshot with drained " + std::to_string(s.drained) + ", reaped " + std::to_string(s.reaped) +
                         ", queued " + std::to_string(s.queued));
        sched::check(s.inline_rejected + s.inline_stalled + s.inline_uncontended + s.inline_small <= s.inline_total,
                     "a snapshot with inline subsets (rejected " + std::to_string(s.inline_rejected) +
                         ", uncontended " + std::to_string(s.inline_uncontended) + ", small " +
                         std::to_string(s.inline_small) + ", stalled " + std::to_string(s.inline_stalled) +
                         ") above inline_total " + std::to_string(s.inline_total));
      };
      {
        sched::thread a([&] { put(0, 3); });
        sched::thread b([&] { put(3, 6); });
        sched::thread drainer([&] { (void)composition.drain(~std::uint64_t{0}); });
        for (int snapshot = 0; snapshot < 3; ++snapshot) check_snapshot();
      }
      composition.flush();
      check_snapshot();
      const auto end = composition.stats();
      drained += end.drained != 0;
      rejected += end.inline_rejected != 0;
      uncontended += end.inline_uncontended != 0;
      small += end.inline_small != 0;
      stalled += end.inline_stalled != 0;
      for (const piece& x : all) {
        sched::check(x.runs.load(std::memory_order_relaxed) == 1,
                     "piece " + std::to_string(x.id) + " destroyed " + std::to_string(x.runs.load()) + " times");
      }
    }
  });
  expect_explored(result, expected_runs(schedules));
  if (result.runs >= 100) {
    EXPECT_GT(drained, 0u);
    EXPECT_GT(rejected, 0u);
    EXPECT_GT(uncontended, 0u);
    EXPECT_GT(small, 0u);
    EXPECT_GT(stalled, 0u);
  }
  std::fprintf(stderr,
               "stats snapshots: runs with drained %llu, rejected %llu, uncontended %llu, small %llu, stalled %llu\n",
               static_cast<unsigned long long>(drained), static_cast<unsigned long long>(rejected),
               static_cast<unsigned long long>(uncontended), static_cast<unsigned long long>(small),
               static_cast<unsigned long long>(stalled));
}

// The exit path (deferred.hpp: exit() called from a destructor on the worker): the destroy stops
// its own worker and tears down, on it, the rest of the batch and everything queued, while a
// producer puts. exit() never returns, so the destroy then waits here until the checks are
// done: each piece whose put has returned is torn down by then, by the worker's last pass (its
// STOPPED exchange acquires the kick of every put before it) or by its producer (whose kick
// found the worker stopped).
std::function<bool()> shut_down_here;  // the scenario's composition's shut_down_on_own_worker
sched::atomic<std::uint32_t> exit_done{0};
sched::atomic<std::uint32_t> exit_may_return{0};
struct exit_traits : piece_traits {
  void destroy(piece& x) const noexcept {
    piece_traits::destroy(x);
    if (x.id != 0) return;
    sched::check(shut_down_here(),
                 "shut_down_on_own_worker refused on the worker");
    set_and_wake(exit_done, std::memory_order_release);
    wait_until_set(exit_may_return, std::memory_order_acquire);
  }
};
// The exit path's entry, which deferred_domain reaches as async_teardown's friend.
struct exit_composition
    : teardown::async_teardown<piece, &piece::node, exit_traits, teardown::static_key, scheduled_one_reaper> {
  using async_teardown::async_teardown;
  using async_teardown::shut_down_on_own_worker;
};

TEST(CompositionScheduleTest, AShutdownOnTheWorkerTearsDownWhatProducersPutBesideIt) {
  const auto result = sched::explore({.name = "async_teardown shut down on its worker", .schedules = schedules}, [] {
    exit_done.store(0, std::memory_order_relaxed);
    exit_may_return.store(0, std::memory_order_relaxed);
    std::vector<piece> all(3);
    for (std::size_t i = 0; i < all.size(); ++i) all[i].id = static_cast<int>(i);
    teardown::async_teardown_options opts;
    opts.reaper = scenario_worker(opts.reaper);
    {
      exit_composition composition(opts);
      shut_down_here = [&] { return composition.shut_down_on_own_worker(); };
      const auto put = [&](std::size_t i) {
        all[i].published = sched::publish();
        (void)composition.put(all[i]);
      };
      sched::thread producer([&] {
        put(1);
        put(2);
      });
      put(0);
      wait_until_set(exit_done, std::memory_order_acquire);
      producer.join();
      for (const piece& x : all) {
        sched::check(x.runs.load(std::memory_order_relaxed) == 1,
                     "piece " + std::to_string(x.id) + " destroyed " + std::to_string(x.runs.load()) +
                         " times once the worker shut itself down and its put returned");
      }
      set_and_wake(exit_may_return, std::memory_order_release);
    }
    for (const piece& x : all) {
      sched::check(x.runs.load(std::memory_order_relaxed) == 1,
                   "piece " + std::to_string(x.id) + " destroyed " + std::to_string(x.runs.load()) + " times");
    }
  });
  expect_explored(result, expected_runs(schedules));
}

// The model's AIO context: two submitters beside exit_aio. A submit either backs out or its
// request is waited for (the Dekker pair: each side's seq_cst write, then its read of the other
// side's word), and what a request did happens before the exit_aio that waited for it
// (complete's release, exit_aio's acquire). Plain flags stand for what the threads did: the
// scheduler runs one thread at a time, so they need no ordering of their own.
TEST(CompositionScheduleTest, ExitAioWaitsForEveryRequestASubmitStarted) {
  const auto result = sched::explore({.name = "aio submit/exit_aio", .schedules = 10'000}, [] {
    teardown::model::basic_aio_context<sched::sync> aio;
    struct request {
      sched::stamp did{};
      bool completed = false;
    };
    std::vector<request> requests(2);
    bool exited = false;
    {
      std::vector<std::unique_ptr<sched::thread>> submitters;
      for (request& r : requests) {
        submitters.push_back(std::make_unique<sched::thread>([&] {
          if (!aio.submit()) return;
          sched::check(!exited, "a request is in flight after exit_aio returned");
          r.did = sched::publish();
          r.completed = true;
          aio.complete();
        }));
      }
      aio.exit_aio();
      exited = true;
      for (const request& r : requests) {
        if (r.completed) sched::check(sched::ordered_here(r.did), "exit_aio returned unordered after a request");
      }
    }
    sched::check(aio.in_flight() == 0 && aio.exit_calls() == 1, "every request completed; one exit_aio");
  });
  expect_explored(result, expected_runs(10'000));
}

}  // namespace
