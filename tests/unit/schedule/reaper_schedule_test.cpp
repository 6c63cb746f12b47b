// The reaper's and the pool's protocols under the deterministic scheduler (schedule.hpp): the
// real headers, every atomic and futex operation of theirs a point where the scheduler picks
// the thread that runs. Each test explores one protocol and asserts what its header promises;
// a failure prints the schedule's name (TEARDOWN_SCHEDULE_REPLAY=<name> replays it).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <stdexcept>
#include <cstdint>
#include <string>
#include <vector>

#include "schedule/scenario_support.hpp"
#include "schedule/schedule.hpp"
#include "teardown/llist.hpp"
#include "teardown/reaper.hpp"
#include "teardown/reaper_pool.hpp"
#include "teardown/sharded_llist.hpp"
#include "teardown/trace.hpp"

namespace {

namespace sched = teardown::schedule;
using namespace teardown::schedule::scenario;



using queue = teardown::llist<item, &item::node, sched::sync>;
using sharded_queue = teardown::sharded_llist<item, &item::node, sched::sync>;
using scheduled_reaper = teardown::reaper<item, &item::node, count_runs, queue>;
using sharded_reaper = teardown::reaper<item, &item::node, count_runs, sharded_queue>;


void enqueue_each(auto& reaper, std::vector<item>& all, std::size_t from, std::size_t to) {
  for (std::size_t i = from; i < to; ++i) {
    publish_and_enqueue(reaper, all[i]);
    all[i].enqueued.store(true, std::memory_order_relaxed);
  }
}



constexpr std::uint64_t schedules = 10'000;

// Wake/sleep: producers' kicks against the worker's SLEEPING exchange. A lost wake-up leaves
// the worker asleep with items queued while the scenario waits for them: a deadlock, which the
// scheduler reports with the schedule's name.
template <class Queue>
void wake_sleep_never_loses_a_wake_up(const char* name) {
  const auto result = sched::explore({.name = name, .schedules = schedules}, [] {
    std::vector<item> all = items(4);
    sched::atomic<std::uint32_t> reaped{0};
    struct signal_runs {
      sched::atomic<std::uint32_t>* reaped;
      void operator()(item& x) const noexcept {
        x.runs.fetch_add(1, std::memory_order_relaxed);
        reaped->fetch_add(1, std::memory_order_relaxed);
        sched::sync::futex_wake_one(*reaped);
      }
    };
    teardown::reaper<item, &item::node, signal_runs, Queue> reaper(signal_runs{&reaped}, scenario_worker());
    {
      sched::thread a([&] { enqueue_each(reaper, all, 0, 2); });
      sched::thread b([&] { enqueue_each(reaper, all, 2, 4); });
    }
    // Waits for the worker alone: no flush, no stop, which would wake it themselves.
    for (std::uint32_t seen; (seen = reaped.load(std::memory_order_relaxed)) < all.size();) {
      sched::sync::futex_wait(reaped, seen);
    }
    expect_once_each(all, "after the worker ran them");
  });
  expect_explored(result, expected_runs(schedules));
}

TEST(ScheduleTest, WakeSleepNeverLosesAWakeUp) { wake_sleep_never_loses_a_wake_up<queue>("wake/sleep"); }

// The same over a sharded queue, the producers on two shards: a worker woken by one flag must
// find that shard's push (the summary word's release/acquire pair), or it sleeps with the item
// queued, the only kick spent.
TEST(ScheduleTest, WakeSleepOverAShardedQueueNeverLosesAWakeUp) {
  struct two_shards : sharded_queue {
    two_shards() : sharded_queue(2) {}
  };
  wake_sleep_never_loses_a_wake_up<two_shards>("sharded wake/sleep");
}

// The same protocol, small enough to enumerate: one producer, one item, every schedule with at
// most two preemptions.
TEST(ScheduleTest, WakeSleepExhaustivelyWithinTwoPreemptions) {
  const auto result = sched::explore(
      {.name = "wake/sleep, exhaustive", .kind = sched::strategy::exhaustive, .schedules = 200'000,
       .preemption_bound = 2},
      [] {
        item x;
        sched::atomic<std::uint32_t> reaped{0};
        struct signal_runs {
          sched::atomic<std::uint32_t>* reaped;
          void operator()(item& it) const noexcept {
            it.runs.fetch_add(1, std::memory_order_relaxed);
            set_and_wake(*reaped);
          }
        };
        teardown::reaper<item, &item::node, signal_runs, queue> reaper(signal_runs{&reaped}, scenario_worker());
        sched::thread producer([&] { publish_and_enqueue(reaper, x); });
        wait_until_set(reaped);
        producer.join();
        sched::check(x.runs.load(std::memory_order_relaxed) == 1, "the item ran other than once");
      });
  EXPECT_FALSE(result.failure.has_value()) << *result.failure << " (schedule " << result.failed_schedule << ")";
  if (std::getenv("TEARDOWN_SCHEDULE_REPLAY") == nullptr && std::getenv("TEARDOWN_SCHEDULES") == nullptr) {
    EXPECT_TRUE(result.exhausted) << "stopped after " << result.runs << " schedules";
  }
}

// Flush tickets, with reap_on_caller taking and putting back: each flush waits for the items
// whose enqueue returned before it was called, wherever they are.
TEST(ScheduleTest, FlushIsABarrierBesideReapOnCaller) {
  const auto result = sched::explore({.name = "flush", .schedules = schedules}, [] {
    std::vector<item> all = items(4);
    scheduled_reaper reaper(count_runs{}, scenario_worker());
    sched::thread producer([&] {
      enqueue_each(reaper, all, 0, 2);
      reaper.flush();
      expect_once_each(all, "flush after enqueue", 0, 2);
    });
    sched::thread caller([&] {
      // Takes the odd ones, declines (puts back) the even ones.
      (void)reaper.reap_on_caller([](item& x) { return x.id % 2 == 1; });
    });
    enqueue_each(reaper, all, 2, 4);
    reaper.flush();
    for (std::size_t i = 2; i < 4; ++i) {
      sched::check(all[i].runs.load(std::memory_order_relaxed) == 1,
                   "flush returned before item " + std::to_string(i) + " was torn down");
    }
    producer.join();
    caller.join();
    reaper.stop();
    expect_once_each(all, "after stop");
  });
  expect_explored(result, expected_runs(schedules));
}

// Two reap_on_caller calls that overlap and put back what they took. The first holds the item
// while the worker completes the flush's ticket on the empty queue (a sleep: in the scheduler,
// time moves only once every other thread is blocked); the second begins then, takes the item
// the first puts back, and holds it while the worker completes the same ticket again. The flush
// must still wait until the item is torn down: a put-back voids every completion since the
// first of the overlapping calls began, not only since its own.
TEST(ScheduleTest, FlushWaitsThroughOverlappingPutBacks) {
  const auto result = sched::explore({.name = "overlapping put-backs", .schedules = schedules / 20}, [] {
    std::vector<item> all = items(1);
    scheduled_reaper reaper(count_runs{}, scenario_worker());
    reaper.freeze();  // until the first caller holds the item
    enqueue_each(reaper, all, 0, 1);
    sched::atomic<std::uint32_t> held{0};  // bit 0: the first holds the item, bit 1: the second
    sched::atomic<std::uint32_t> go{0};    // the same bits: that caller may put it back
    const auto caller = [&](std::uint32_t bit) {
      return [&, bit] {
        (void)reaper.reap_on_caller([&, bit](item&) {
          held.fetch_or(bit, std::memory_order_relaxed);
          sched::sync::futex_wake_one(held);
          for (std::uint32_t seen; !((seen = go.load(std::memory_order_relaxed)) & bit);) {
            sched::sync::futex_wait(go, seen);
          }
          return false;
        });
      };
    };
    const auto release = [&](std::uint32_t bit) {
      go.fetch_or(bit, std::memory_order_relaxed);
      sched::sync::futex_wake_one(go);
    };
    sched::thread first(caller(1));
    for (std::uint32_t seen; !((seen = held.load(std::memory_order_relaxed)) & 1);) sched::sync::futex_wait(held, seen);
    reaper.thaw();
    sched::thread flusher([&] {
      reaper.flush();
      sched::check(all[0].runs.load(std::memory_order_relaxed) == 1, "flush returned before the item was torn down");
    });
    sched::sync::sleep_for(std::chrono::milliseconds(1));  // the worker has completed the ticket
    sched::thread second(caller(2));
    release(1);
    first.join();
    sched::sync::sleep_for(std::chrono::milliseconds(1));  // and again, if the second holds the item
    release(2);
    second.join();
    flusher.join();
    reaper.stop();
    expect_once_each(all, "after stop");
  });
  expect_explored(result, expected_runs(schedules / 20));
}

// Freeze/thaw: fn never starts while frozen; a freeze that returns has the worker parked
// between items; everything runs once after the thaw.
TEST(ScheduleTest, FreezeParksTheWorkerAndThawResumesIt) {
  const auto result = sched::explore({.name = "freeze/thaw", .schedules = schedules}, [] {
    std::vector<item> all = items(4);
    std::atomic<bool> frozen{false};
    struct frozen_check {
      std::atomic<bool>* frozen;
      void operator()(item& x) const noexcept {
        sched::check(!frozen->load(std::memory_order_relaxed), "fn ran while the reaper was frozen");
        x.runs.fetch_add(1, std::memory_order_relaxed);
      }
    };
    teardown::reaper<item, &item::node, frozen_check, queue> reaper(frozen_check{&frozen}, scenario_worker());
    sched::thread producer([&] { enqueue_each(reaper, all, 0, 4); });
    reaper.freeze();
    frozen.store(true, std::memory_order_relaxed);
    sched::sync::yield();  // let the producer (and a worker that did not park) go on
    frozen.store(false, std::memory_order_relaxed);
    reaper.thaw();
    producer.join();
    reaper.flush();
    expect_once_each(all, "after thaw and flush");
  });
  expect_explored(result, expected_runs(schedules));
}

// stop and stop_for beside producers and a reap_on_caller: everything enqueued before stop was
// called is torn down when it returns; everything enqueued at all, exactly once.
TEST(ScheduleTest, StopCoversWhatWasEnqueuedBeforeItAndNothingRunsTwice) {
  const auto result = sched::explore({.name = "stop", .schedules = schedules}, [] {
    std::vector<item> all = items(5);
    {
      scheduled_reaper reaper(count_runs{}, scenario_worker());
      reaper.freeze();  // so that 0 and 1 wait on the queue for whoever takes them: a stop overrides it
      enqueue_each(reaper, all, 0, 2);
      // The producer enqueues once the worker has published its end (stats().running is
      // false from then on): its add finds the reaper stopped and drains inline, racing the
      // worker's final drain and stop's settling for items 0 and 1.
      sched::thread producer([&] {
        while (reaper.stats().running) sched::sync::yield();
        enqueue_each(reaper, all, 2, 4);
      });
      sched::thread caller([&] { (void)reaper.reap_on_caller([](item& x) { return x.id == 0; }); });
      std::vector<bool> before(all.size());
      for (std::size_t i = 0; i < all.size(); ++i) before[i] = all[i].enqueued.load(std::memory_order_relaxed);
      const bool stopped = reaper.stop_for(std::chrono::nanoseconds(0));
      if (!stopped) reaper.stop();
      for (std::size_t i = 0; i < all.size(); ++i) {
        if (before[i]) {
          sched::check(all[i].runs.load(std::memory_order_relaxed) == 1 && sched::ordered_here(all[i].torn_down),
                       "stop returned before item " + std::to_string(i) + ", enqueued before it, was torn down"
                       " (or unordered after its teardown)");
        }
      }
      enqueue_each(reaper, all, 4, 5);  // after stop: torn down inline
      producer.join();
      caller.join();
    }
    expect_once_each(all, "after the reaper's end");
  });
  expect_explored(result, expected_runs(schedules));
}

// An enqueue that nothing orders with stop: its kick comes before the worker's STOPPED exchange
// (the worker's final drain must then see its add: that exchange acquires the kick) or after it
// (the producer reads STOPPED and drains on its own thread). Either way, once stop and the
// enqueue have both returned, the item is torn down: none is left queued for the destructor.
TEST(ScheduleTest, AnEnqueueRacingTheWorkersEndIsTornDownByStopOrByItsProducer) {
  const auto result = sched::explore({.name = "enqueue beside the worker's end", .schedules = schedules}, [] {
    std::vector<item> all = items(2);
    {
      scheduled_reaper reaper(count_runs{}, scenario_worker());
      sched::thread producer([&] { enqueue_each(reaper, all, 0, 2); });
      reaper.stop();
      producer.join();
      expect_once_each(all, "once stop and the enqueues returned");
    }
    expect_once_each(all, "after the reaper's end");
  });
  expect_explored(result, expected_runs(schedules));
}

// The worker's CPU clock read beside its exit (the pinning protocol, cpu_clock.hpp): a stats()
// reader pins the live clock or, once the worker has closed it, reads the figure the worker
// published before the close. Either way a reader that saw the worker's CPU time never sees 0
// afterwards, and the figure stop() leaves is at least every reading (each live one ended
// before the worker's last clock read).
TEST(ScheduleTest, CpuTimeReadBesideTheWorkersExitNeverGoesBack) {
  const auto result = sched::explore({.name = "cpu clock beside the worker's exit", .schedules = schedules}, [] {
    std::vector<item> all = items(1);
    scheduled_reaper reaper(count_runs{}, scenario_worker());
    std::vector<std::uint64_t> seen;
    sched::thread reader([&] {
      bool running = true;
      while (running) {
        const teardown::reaper_stats s = reaper.stats();
        seen.push_back(s.worker_cpu_ns);
        running = s.running;
        sched::sync::yield();
      }
      seen.push_back(reaper.stats().worker_cpu_ns);  // once more, after the close
    });
    enqueue_each(reaper, all, 0, 1);
    reaper.stop();
    reader.join();
    const std::uint64_t final_figure = reaper.stats().worker_cpu_ns;
    bool saw_time = false;
    for (const std::uint64_t ns : seen) {
      sched::check(!saw_time || ns != 0, "a stats() after one that read the worker's CPU time read 0");
      sched::check(ns <= final_figure, "the CPU time after stop is less than a reading before it");
      saw_time = saw_time || ns != 0;
    }
    expect_once_each(all, "after stop");
  });
  expect_explored(result, expected_runs(schedules));
}

// Sharded flags: an adder preempted between its push and its shard's flag must not hide an
// item that another adder on the same shard then flushes. Each producer thread has its own
// shard index; two shards make them share one whenever the indexes collide.
TEST(ScheduleTest, FlushOverAShardedQueueSeesEveryShard) {
  const auto result = sched::explore({.name = "sharded flush", .schedules = schedules}, [] {
    std::vector<item> all = items(3);
    struct two_shards : sharded_queue {
      two_shards() : sharded_queue(2) {}
    };
    teardown::reaper<item, &item::node, count_runs, two_shards> reaper(count_runs{}, scenario_worker());
    // Three adders on two shards: two of them share one.
    std::vector<std::unique_ptr<sched::thread>> producers;
    for (std::size_t i = 0; i < all.size(); ++i) {
      producers.push_back(std::make_unique<sched::thread>([&, i] {
        enqueue_each(reaper, all, i, i + 1);
        reaper.flush();
        sched::check(all[i].runs.load(std::memory_order_relaxed) == 1,
                     "flush returned before item " + std::to_string(i) + ", enqueued before it, was torn down");
      }));
    }
    producers.clear();
  });
  expect_explored(result, expected_runs(schedules));
}

// A pool: flush rounds over two workers while an idle one steals queued items or the held rest
// of a sibling's batch (a slow item: its fn yields, and virtual time passes while it does, so a
// watching sibling's sleep ends and steal_after ripens). Each flush covers its caller's items
// wherever they went; nothing runs twice. The queues record which thread's take took each item:
// one torn down on another thread came out of a held batch (a queue steal takes through a take
// of its own), and some runs must have one.
struct taker_queue : sharded_queue {
  taker_queue() = default;  // not an aggregate: sharded_llist's constructor is explicit
  static teardown::llist_batch<item, &item::node> record(teardown::llist_batch<item, &item::node> taken) noexcept {
    teardown::llist_chain<item, &item::node> chain;  // as in recorded_queue below: the same batch back
    while (item* x = taken.pop_front()) {
      x->taker.store(sched::detail::self, std::memory_order_relaxed);
      chain.push_back(*x);
    }
    teardown::llist<item, &item::node> shape;
    (void)shape.add_batch(std::move(chain));
    return shape.del_all();
  }
  teardown::llist_batch<item, &item::node> del_all() noexcept { return record(sharded_queue::del_all()); }
  teardown::llist_batch<item, &item::node> del_all_sweep() noexcept { return record(sharded_queue::del_all_sweep()); }
};
std::atomic<int> held_steals{0};
struct count_runs_and_held {
  void operator()(item& x) const noexcept {
    if (x.taker.load(std::memory_order_relaxed) != sched::detail::self) held_steals.fetch_add(1);
    count_runs{}(x);
  }
};

TEST(ScheduleTest, PoolFlushCoversStolenAndHeldItems) {
  std::uint64_t runs_with_held_steals = 0;
  const auto result = sched::explore({.name = "pool steal/flush", .schedules = schedules}, [&] {
    std::vector<item> all = items(4);
    held_steals.store(0);
    {
      teardown::reaper_pool<item, &item::node, count_runs_and_held, taker_queue> pool(
          count_runs_and_held{},
          {.workers = 2, .steal_after = std::chrono::microseconds(1), .worker = scenario_worker()});
      sched::thread producer([&] {
        enqueue_each(pool, all, 0, 3);
        pool.flush();
        expect_once_each(all, "pool flush after enqueue", 0, 3);
      });
      enqueue_each(pool, all, 3, 4);
      pool.flush();
      sched::check(all[3].runs.load(std::memory_order_relaxed) == 1, "pool flush returned before item 3 was torn down");
    }
    expect_once_each(all, "after the pool's end");
    if (held_steals.load() != 0) ++runs_with_held_steals;
  });
  expect_explored(result, expected_runs(schedules));
  std::fprintf(stderr, "pool steal/flush: %llu runs stole a held batch\n",
               static_cast<unsigned long long>(runs_with_held_steals));
  if (result.runs >= 100) {
    EXPECT_GT(runs_with_held_steals, 0u) << "no run took the held path (steal_held)";
  }
}

// No lost watch (reaper_pool.hpp, docs/design.md): a sibling that sleeps without a limit must
// not miss a batch put in held_. In each of three rounds the first item to start blocks until the
// rest of its batch is torn down, which only the other worker can do, by stealing it: that
// worker either watched the batch's start (its limit brings it back when steal_after ripens) or
// was seen idle and not watching by the holder's scan, which kicks it. Each later round meets a
// sibling that may have watched in the one before (its watching flag goes from true to false
// beside the holder's scan). A sibling that sleeps for good beside the blocked holder is a deadlock,
// reported with the schedule's name; a rest that goes missing leaves the holder blocked for good,
// a hang that ctest's timeout fails. No boost: a flush that helped would wait with a limit, and
// a lost watch would be a livelock past max_steps (then a real hang) instead of a deadlock. Half
// the loads that may read an older store do (the default is a tenth): the lost watch needs the
// holder's load of `watching` to read the true of the sibling's last watch, and with the
// holder's seq_cst load weakened to acquire (planted_bugs.py: lost_watch) pct:79 deadlocks;
// at a tenth, 10,000 schedules could miss it.
constexpr std::size_t kRounds = 3;
constexpr std::size_t kBatch = 3;
std::atomic<int> first_to_start[kRounds];
sched::atomic<std::uint32_t> rest_done[kRounds];
struct first_waits_for_the_rest {
  void operator()(item& x) const noexcept {
    const std::size_t round = static_cast<std::size_t>(x.id) / kBatch;
    int none = -1;
    if (first_to_start[round].compare_exchange_strong(none, x.id, std::memory_order_relaxed)) {
      for (std::uint32_t seen; (seen = rest_done[round].load(std::memory_order_acquire)) < kBatch - 1;) {
        sched::sync::futex_wait(rest_done[round], seen);
      }
      count_runs{}(x);
      return;
    }
    count_runs{}(x);
    rest_done[round].fetch_add(1, std::memory_order_release);
    sched::sync::futex_wake_one(rest_done[round]);
  }
};

// The thief keeps the older half of the held rest and puts the newer half back on the victim's
// queue in the pool's run order: both orders, half the schedules each.
void held_batch_is_stolen_by_the_idle_sibling(teardown::drain_order order, const char* name) {
  const bool oldest_first = order == teardown::drain_order::oldest_first;
  const sched::explore_options opts{.name = name,
                                    .schedules = schedules / 2,
                                    .seed = oldest_first ? 1 : 1 + schedules / 2,  // seeds of their own
                                    .stale_per_mille = 500};
  const auto result = sched::explore(opts, [order] {
    std::vector<item> all = items(static_cast<int>(kRounds * kBatch));
    for (std::size_t r = 0; r < kRounds; ++r) {
      first_to_start[r].store(-1, std::memory_order_relaxed);
      rest_done[r].store(0, std::memory_order_relaxed);
    }
    {
      teardown::reaper_options worker = scenario_worker();
      worker.order = order;
      worker.boost_after = std::chrono::nanoseconds(0);
      teardown::reaper_pool<item, &item::node, first_waits_for_the_rest, sharded_queue> pool(
          first_waits_for_the_rest{}, {.workers = 2, .steal_after = std::chrono::microseconds(1), .worker = worker});
      for (std::size_t r = 0; r < kRounds; ++r) {
        teardown::llist_chain<item, &item::node> batch;  // one worker takes the round's items at once
        for (std::size_t i = r * kBatch; i < (r + 1) * kBatch; ++i) {
          all[i].published = sched::publish();
          batch.push_back(all[i]);
        }
        pool.enqueue_chain(std::move(batch));
        pool.flush();
        expect_once_each(all, "pool flush", r * kBatch, (r + 1) * kBatch);
      }
    }
  });
  expect_explored(result, expected_runs(schedules / 2));
}

TEST(ScheduleTest, AHeldBatchBehindABlockedItemIsStolenByTheIdleSibling) {
  held_batch_is_stolen_by_the_idle_sibling(teardown::drain_order::oldest_first, "pool no lost watch");
}

TEST(ScheduleTest, AHeldBatchBehindABlockedItemIsStolenByTheIdleSiblingNewestFirst) {
  held_batch_is_stolen_by_the_idle_sibling(teardown::drain_order::newest_first, "pool no lost watch, newest first");
}

// The stall watchdog: while the item in fn blocks, an item left on the queue behind it makes
// stalled() true once it has waited the threshold — including an add that lands while the
// worker takes its batch. A queue that records what each take took tells the scenario which
// items are still queued.
struct recorded_queue : queue {
  teardown::llist_batch<item, &item::node> del_all() noexcept {
    teardown::llist_batch<item, &item::node> taken = queue::del_all();
    // A batch's iteration consumes it: the items go through a chain and a private list, which
    // gives them back as a batch in the same order.
    teardown::llist_chain<item, &item::node> chain;
    while (item* x = taken.pop_front()) {
      x->taken.store(true, std::memory_order_relaxed);
      chain.push_back(*x);
    }
    teardown::llist<item, &item::node> shape;
    (void)shape.add_batch(std::move(chain));
    return shape.del_all();
  }
};

TEST(ScheduleTest, StallWatchdogSeesAnItemQueuedBehindABlockedOne) {
  const auto result = sched::explore({.name = "stall watchdog", .schedules = schedules}, [] {
    std::vector<item> all = items(3);
    struct block_first {
      void operator()(item& x) const noexcept {
        if (x.id == 0) sched::sync::sleep_for(std::chrono::milliseconds(500));
        x.runs.fetch_add(1, std::memory_order_relaxed);
      }
    };
    teardown::reaper<item, &item::node, block_first, recorded_queue> reaper(
        block_first{}, scenario_worker({.stall_threshold = std::chrono::milliseconds(2)}));
    publish_and_enqueue(reaper, all[0]);
    all[0].enqueued.store(true, std::memory_order_relaxed);
    {
      sched::thread producer([&] { enqueue_each(reaper, all, 1, 3); });
    }
    sched::sync::sleep_for(std::chrono::milliseconds(100));  // item 0 still blocks (500 ms)
    // Every enqueue has returned: an item no take has taken is on the queue.
    bool queued = false;
    for (const item& x : all) queued = queued || !x.taken.load(std::memory_order_relaxed);
    if (queued) {
      sched::check(reaper.stalled(), "an item queued for 100 ms behind a blocked one, and stalled() is false");
    }
    reaper.flush();
    expect_once_each(all, "after flush");
  });
  expect_explored(result, expected_runs(schedules));
}

// Fork parking (fork_policy::wait_for_item): fork() parks the workers between items across the
// fork while fn calls a reaper's nice() (allowed from fn) and a producer enqueues. Nothing
// deadlocks; the child (which exits at once) runs without the scheduler; in the parent
// everything runs once.
TEST(ScheduleTest, ForkParksTheWorkerWhileFnCallsNice) {
  if (!sched::detail::fork_safe()) {
    GTEST_SKIP() << "madvise(MADV_WIPEONFORK) refused: a child would run under the scheduler";
  }
  const auto result = sched::explore({.name = "fork parking", .schedules = schedules}, [] {
    std::vector<item> all = items(3);
    struct calls_nice {
      const std::function<int()>* nice;
      void operator()(item& x) const noexcept {
        (void)(*nice)();
        sched::sync::yield();
        x.runs.fetch_add(1, std::memory_order_relaxed);
      }
    };
    // Two reapers, each fn calling the other's nice(): the registry parks them one after the
    // other, so one worker may still be in fn while the other's control mutex is held.
    std::function<int()> nice_of_first, nice_of_second;
    using nice_reaper = teardown::reaper<item, &item::node, calls_nice, queue>;
    const teardown::reaper_options parks = scenario_worker({.on_fork = teardown::fork_policy::wait_for_item});
    nice_reaper first(calls_nice{&nice_of_second}, parks);
    nice_reaper second(calls_nice{&nice_of_first}, parks);
    nice_of_first = [&] { return first.nice(); };
    nice_of_second = [&] { return second.nice(); };
    enqueue_each(first, all, 0, 1);
    sched::thread producer([&] {
      enqueue_each(second, all, 1, 2);
      enqueue_each(first, all, 2, 3);
    });
    const pid_t child = fork();
    if (child == 0) _exit(0);
    sched::check(child > 0, "fork failed");
    if (child > 0) {
      int status = 0;
      sched::check(waitpid(child, &status, 0) == child && WIFEXITED(status), "the child did not exit cleanly");
    }
    producer.join();
    first.flush();
    second.flush();
    expect_once_each(all, "after the fork and a flush");
  });
  expect_explored(result, expected_runs(schedules));
}

// The lazy policy and the boost: a worker that polls (producers do not wake it, its look's
// limit grows from poll_interval to poll_interval_max while it finds nothing), raised once work
// has waited boost_after (or, unprivileged, the raise refused and the waiting flush helping;
// reaper_help_schedule_test explores the help), beside producers, a hurry() and flushes. Every
// item is torn down once, and before the flush that waited for it.
struct {
  std::uint64_t polls = 0, boosts = 0;  // runs that took each path
} lazy_seen;
TEST(ScheduleTest, ALazyPollingWorkerWithBoostAndHelpFlushesEverything) {
  constexpr std::uint64_t lazy_schedules = 10'000;
  const auto result = sched::explore({.name = "lazy polling, boost, help", .schedules = lazy_schedules}, [] {
    std::vector<item> all = items(5);
    teardown::reaper_options opts = scenario_worker();
    opts.poll_interval = std::chrono::microseconds(20);
    opts.poll_interval_max = std::chrono::microseconds(200);
    opts.boost_after = std::chrono::microseconds(5);
    opts.boost_nice = -1;  // above the worker's 0: raised as root, refused as an ordinary user
    struct slow_runs {  // a teardown takes longer than boost_after: a waiting flush helps
      void operator()(item& x) const noexcept {
        sched::sync::sleep_for(std::chrono::microseconds(10));
        count_runs{}(x);
      }
    };
    teardown::reaper<item, &item::node, slow_runs, queue> reaper(slow_runs{}, opts);
    enqueue_each(reaper, all, 0, 1);
    {
      sched::thread a([&] { enqueue_each(reaper, all, 1, 3); });
      sched::thread b([&] {
        enqueue_each(reaper, all, 3, 4);
        (void)reaper.hurry();
      });
      reaper.flush();
      expect_once_each(all, "flush after enqueue", 0, 1);
    }
    reaper.flush();
    sched::sync::sleep_for(std::chrono::microseconds(500));  // idle, unkicked: its looks end at their limit
    enqueue_each(reaper, all, 4, 5);
    reaper.flush();
    expect_once_each(all, "the last flush");
    const teardown::reaper_stats stats = reaper.stats();
    lazy_seen.polls += stats.polls != 0;
    lazy_seen.boosts += stats.boosts + stats.boosts_refused + stats.helped != 0;
  });
  expect_explored(result, expected_runs(lazy_schedules));
  // The paths are taken, not only allowed: in some runs a look ended at its limit, and the
  // worker was raised (or, unprivileged, the raise refused or a flush helped).
  EXPECT_GT(lazy_seen.polls, 0u);
  EXPECT_GT(lazy_seen.boosts, 0u);
  std::fprintf(stderr, "lazy polling: runs with a poll %llu, with a boost or help %llu\n",
               static_cast<unsigned long long>(lazy_seen.polls), static_cast<unsigned long long>(lazy_seen.boosts));
}

// Hook add/remove beside an emit: while remove_hook(f) waits out the emit that is calling f,
// other threads add g and f again (f may land in a later slot). The emit calls each hook at
// most once.
using scheduled_hooks = teardown::trace::detail::hook_slot<teardown::trace::queue_event, sched::sync>;
std::atomic<int> f_calls{0};
void hook_f(const teardown::trace::queue_event&) {
  sched::sync::yield();  // a hook takes time: the writers run meanwhile
  f_calls.fetch_add(1, std::memory_order_relaxed);
}
void hook_g(const teardown::trace::queue_event&) {}

TEST(ScheduleTest, OneEmitCallsEachHookOnceWhileHooksComeAndGo) {
  const auto result = sched::explore({.name = "hook add/remove", .schedules = schedules}, [] {
    scheduled_hooks::replace(nullptr);  // every run starts with no hook
    scheduled_hooks::add(&hook_f);
    f_calls.store(0, std::memory_order_relaxed);
    sched::thread emitter([] {
      scheduled_hooks::call(teardown::trace::queue_event{});
      const int calls = f_calls.load(std::memory_order_relaxed);
      sched::check(calls <= 1, "one emit called the same hook " + std::to_string(calls) + " times");
    });
    sched::thread remover([] { (void)scheduled_hooks::remove(&hook_f); });
    sched::thread adder([] {
      scheduled_hooks::add(&hook_g);
      try {
        scheduled_hooks::add(&hook_f);
      } catch (const std::invalid_argument&) {  // f not removed yet: still installed
      }
    });
    emitter.join();
    remover.join();
    adder.join();
    scheduled_hooks::replace(nullptr);
  });
  expect_explored(result, expected_runs(schedules));
}

// Hooks under weak memory: an emit that calls h sees what its adder did before add_hook, and a
// remove_hook(h) that returns has waited out every emit that may call h (what h did happens
// before the return, and no emit calls h afterwards): the store-buffering pair of the emit's
// count and slot load against the remover's slot store and count load.
sched::stamp h_installed;  // the adder's, before add
sched::stamp h_last_call;  // h's, at the end of each call
std::atomic<int> h_running{0};
std::atomic<bool> h_removed{false};
void hook_h(const teardown::trace::queue_event&) {
  sched::check(sched::ordered_here(h_installed), "a hook was called unordered after its add");
  sched::check(!h_removed.load(std::memory_order_relaxed), "a hook was called after its remove returned");
  h_running.fetch_add(1, std::memory_order_relaxed);
  sched::sync::yield();
  h_last_call = sched::publish();
  h_running.fetch_sub(1, std::memory_order_relaxed);
}

// How the hook goes: remove_hook(h), or set_hook(g) replacing h in the first slot or a later one.
enum class hook_goes { removed, replaced_first, replaced_later };

sched::explore_result explore_hook_goes(const char* name, hook_goes how) {
  return sched::explore({.name = name, .schedules = schedules}, [how] {
    scheduled_hooks::replace(nullptr);
    h_installed = {};
    h_last_call = {};
    h_removed.store(false, std::memory_order_relaxed);
    sched::thread adder([how] {
      if (how == hook_goes::replaced_later) scheduled_hooks::add(&hook_g);  // h lands in slot 1
      h_installed = sched::publish();
      scheduled_hooks::add(&hook_h);
    });
    sched::thread emitter([] {
      scheduled_hooks::call(teardown::trace::queue_event{});
      scheduled_hooks::call(teardown::trace::queue_event{});
    });
    adder.join();
    if (how == hook_goes::removed) {
      sched::check(scheduled_hooks::remove(&hook_h), "remove_hook did not find the hook its adder installed");
    } else {
      scheduled_hooks::replace(&hook_g);
    }
    h_removed.store(true, std::memory_order_relaxed);
    sched::check(h_running.load(std::memory_order_relaxed) == 0, "the hook still ran when its removal returned");
    sched::check(sched::ordered_here(h_last_call), "the removal returned unordered after the hook's last call");
    emitter.join();
    scheduled_hooks::replace(nullptr);
  });
}

TEST(ScheduleTest, RemoveHookWaitsOutEveryEmitThatMayCallIt) {
  expect_explored(explore_hook_goes("hook remove under weak memory", hook_goes::removed), expected_runs(schedules));
}

TEST(ScheduleTest, SetHookWaitsOutEveryEmitThatMayCallTheHookItReplaces) {
  expect_explored(explore_hook_goes("set_hook over the first slot", hook_goes::replaced_first),
                  expected_runs(schedules));
  expect_explored(explore_hook_goes("set_hook over a later slot", hook_goes::replaced_later),
                  expected_runs(schedules));
}

}  // namespace
