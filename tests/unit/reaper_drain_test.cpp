// Specification of teardown::reaper::reap_on_caller, the pressure valve async_teardown::drain is
// built on: what it offers and in which order, where accepted items are torn down and how they
// are counted, what happens to declined items (back on the queue, torn down once by the worker;
// inline when the reaper has stopped meanwhile), a take that throws, the refusal on the worker,
// flush() staying correct while a caller holds items it will decline, and a freeze in the middle
// of a batch handing the rest back so that a drain while frozen reaches it. The
// ReaperDrainStressTest suite races producers, caller reaps and flushes.
//
// Nothing here asserts a time. A sleep is only ever a chance for a wrong implementation to
// misbehave; a hang shows as an abort from the per-test hang_guard naming the test.
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <latch>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "reaper_test_support.hpp"
#include "teardown/reaper.hpp"
#include "test_support.hpp"

namespace teardown_test {
namespace {

using namespace reaper_support;
using namespace std::chrono_literals;

class ReaperDrainTest : public ::testing::Test {
 private:
  hang_guard guard_{current_test_name()};
};
using ReaperDrainStressTest = ReaperDrainTest;

// fn that counts and records, in order, which item ran on which thread.
struct recorder {
  std::mutex mutex;
  std::vector<std::size_t> order;          // guarded by mutex
  std::vector<std::thread::id> threads;    // guarded by mutex

  job_fn fn() {
    return [this](job& j) {
      {
        const std::lock_guard lock(mutex);
        order.push_back(j.id);
        threads.push_back(std::this_thread::get_id());
      }
      j.runs.fetch_add(1, std::memory_order_relaxed);
    };
  }
  std::vector<std::size_t> ran() {
    const std::lock_guard lock(mutex);
    return order;
  }
  std::thread::id thread_of(std::size_t id) {
    const std::lock_guard lock(mutex);
    for (std::size_t at = 0; at < order.size(); ++at) {
      if (order[at] == id) return threads[at];
    }
    return {};
  }
};

// --- What is offered, and where it is torn down ------------------------------------------------

TEST_F(ReaperDrainTest, TakeIsOfferedEveryQueuedItemOldestFirst) {
  auto jobs = make_jobs(10);
  job_reaper reaper(counting());
  reaper.freeze();
  for (job& j : jobs) reaper.enqueue(j);
  std::vector<std::size_t> offered;
  (void)reaper.reap_on_caller([&](job& j) {
    offered.push_back(j.id);
    return false;
  });
  std::vector<std::size_t> expected(jobs.size());
  for (std::size_t i = 0; i < expected.size(); ++i) expected[i] = i;
  EXPECT_EQ(offered, expected);
  reaper.thaw();
}

TEST_F(ReaperDrainTest, AcceptedItemsAreTornDownOldestFirstOnTheCallingThreadAndCounted) {
  auto jobs = make_jobs(10);
  recorder seen;
  job_reaper reaper(seen.fn());
  reaper.freeze();
  for (job& j : jobs) reaper.enqueue(j);
  const std::size_t torn_down = reaper.reap_on_caller([](job& j) { return j.id % 2 == 0; });
  EXPECT_EQ(torn_down, 5u);
  EXPECT_EQ(seen.ran(), (std::vector<std::size_t>{0, 2, 4, 6, 8}));
  for (std::size_t id : {0u, 2u, 4u, 6u, 8u}) EXPECT_EQ(seen.thread_of(id), std::this_thread::get_id());
  const teardown::reaper_stats stats = reaper.stats();
  EXPECT_EQ(stats.inline_reaped, 5u);
  EXPECT_EQ(stats.reaped, 5u);
  EXPECT_EQ(stats.pending, 5u);
  reaper.thaw();
}

TEST_F(ReaperDrainTest, DeclinedItemsGoBackAndTheWorkerTearsThemDownExactlyOnce) {
  auto jobs = make_jobs(10);
  recorder seen;
  job_reaper reaper(seen.fn(), {.waiters_help = false});  // the declined run on the worker, not a helping flush
  reaper.freeze();
  for (job& j : jobs) reaper.enqueue(j);
  (void)reaper.reap_on_caller([](job& j) { return j.id % 2 == 0; });
  for (std::size_t id : {1u, 3u, 5u, 7u, 9u}) EXPECT_EQ(jobs[id].runs.load(), 0) << "job " << id;
  reaper.thaw();
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  EXPECT_EQ(seen.ran(), (std::vector<std::size_t>{0, 2, 4, 6, 8, 1, 3, 5, 7, 9}))
      << "the declined keep their order";
  for (std::size_t id : {1u, 3u, 5u, 7u, 9u}) EXPECT_NE(seen.thread_of(id), std::this_thread::get_id());
  const teardown::reaper_stats stats = reaper.stats();
  EXPECT_EQ(stats.reaped, 10u);
  EXPECT_EQ(stats.inline_reaped, 5u);
  EXPECT_EQ(stats.pending, 0u);
}

TEST_F(ReaperDrainTest, DeclinedItemsRunBehindItemsEnqueuedMeanwhile) {
  auto jobs = make_jobs(3);
  recorder seen;
  job_reaper reaper(seen.fn());
  reaper.freeze();
  reaper.enqueue(jobs[0]);
  reaper.enqueue(jobs[1]);
  (void)reaper.reap_on_caller([&](job& j) {
    if (j.id == 0) reaper.enqueue(jobs[2]);  // arrives while the caller holds 0 and 1
    return false;
  });
  reaper.thaw();
  reaper.flush();
  EXPECT_EQ(seen.ran(), (std::vector<std::size_t>{2, 0, 1}));
}

TEST_F(ReaperDrainTest, ItemsTheWorkerAlreadyHoldsAreNotOffered) {
  auto jobs = make_jobs(6);
  std::latch release(1);
  std::atomic<bool> started{false};
  job_reaper reaper(first_item_blocks(release, started));
  reaper.freeze();
  for (std::size_t i = 0; i < 4; ++i) reaper.enqueue(jobs[i]);
  reaper.thaw();
  wait_until(started);  // the worker holds 0..3 and is stuck on 0
  reaper.enqueue(jobs[4]);
  reaper.enqueue(jobs[5]);
  std::vector<std::size_t> offered;
  const std::size_t torn_down = reaper.reap_on_caller([&](job& j) {
    offered.push_back(j.id);
    return true;
  });
  EXPECT_EQ(offered, (std::vector<std::size_t>{4, 5}));
  EXPECT_EQ(torn_down, 2u);
  release.count_down();
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

// A freeze lands while the worker is in the middle of a batch: it hands the rest back, so a
// drain while frozen is offered every item not started yet, oldest first (in either drain order:
// the rest keeps its ages), and nothing is left behind the freeze. Job 0 runs first and blocks.
void frozen_mid_batch_hands_the_rest_back(teardown::drain_order order) {
  auto jobs = make_jobs(6);
  std::latch release(1);
  std::atomic<bool> started{false};
  job_reaper reaper(first_item_blocks(release, started), {.order = order});
  const bool oldest_first = order == teardown::drain_order::oldest_first;
  reaper.freeze();  // one batch
  for (std::size_t i = 0; i < jobs.size(); ++i) reaper.enqueue(jobs[oldest_first ? i : jobs.size() - 1 - i]);
  reaper.thaw();
  wait_until(started);  // the worker holds 0..5 and is stuck on 0
  std::atomic<pid_t> freezer_tid{0};
  std::thread freezer([&] {
    freezer_tid.store(static_cast<pid_t>(::syscall(SYS_gettid)));
    reaper.freeze();
  });
  while (freezer_tid.load() == 0) std::this_thread::sleep_for(1ms);
  wait_until_asleep(freezer_tid.load());  // in freeze(), waiting for item 0 to end
  release.count_down();
  freezer.join();  // parked after item 0
  std::vector<std::size_t> offered;
  const std::size_t torn_down = reaper.reap_on_caller([&](job& j) {
    offered.push_back(j.id);
    return true;
  });
  const std::vector<std::size_t> oldest_first_rest =
      oldest_first ? std::vector<std::size_t>{1, 2, 3, 4, 5} : std::vector<std::size_t>{5, 4, 3, 2, 1};
  EXPECT_EQ(offered, oldest_first_rest) << "the rest of the frozen batch, oldest first";
  EXPECT_EQ(torn_down, 5u);
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size()) << "all torn down while the worker stayed frozen";
  reaper.thaw();
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

TEST_F(ReaperDrainTest, WorkerFrozenMidBatchHandsTheRestBackAndTheDrainReachesIt) {
  frozen_mid_batch_hands_the_rest_back(teardown::drain_order::oldest_first);
}

TEST_F(ReaperDrainTest, WorkerFrozenMidBatchHandsTheRestBackUnderNewestFirstToo) {
  frozen_mid_batch_hands_the_rest_back(teardown::drain_order::newest_first);
}

// The handed-back rest keeps its place under items queued while the worker was busy, and the
// flush that batch was to complete waits for the pass that takes the rest again.
TEST_F(ReaperDrainTest, HandedBackItemsStayOlderThanItemsQueuedMeanwhileAndFlushStillCoversThem) {
  auto jobs = make_jobs(5);
  std::latch release(1);
  std::atomic<bool> started{false};
  job_reaper reaper(first_item_blocks(release, started));
  reaper.freeze();
  for (std::size_t i = 0; i < 3; ++i) reaper.enqueue(jobs[i]);
  std::atomic<bool> flushed{false};
  std::thread flusher([&] {
    reaper.flush();
    flushed.store(true);
  });
  std::this_thread::sleep_for(20ms);  // lets the flush ask before the batch is taken
  reaper.thaw();
  wait_until(started);  // the worker holds 0..2, the batch the flush waits for, stuck on 0
  reaper.enqueue(jobs[3]);
  reaper.enqueue(jobs[4]);
  std::thread freezer([&] { reaper.freeze(); });
  std::this_thread::sleep_for(20ms);  // lets the freeze arrive while item 0 runs
  release.count_down();
  freezer.join();
  std::vector<std::size_t> offered;
  (void)reaper.reap_on_caller([&](job& j) {
    offered.push_back(j.id);
    return false;  // all go back
  });
  EXPECT_EQ(offered, (std::vector<std::size_t>{1, 2, 3, 4}));
  std::this_thread::sleep_for(20ms);  // a chance for a wrong flush to return early
  EXPECT_FALSE(flushed.load()) << "the flush returned while items it covers were still queued";
  reaper.thaw();
  flusher.join();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

TEST_F(ReaperDrainTest, EmptyQueueOffersNothing) {
  job_reaper reaper(counting());
  int offered = 0;
  EXPECT_EQ(reaper.reap_on_caller([&](job&) { return ++offered > 0; }), 0u);
  EXPECT_EQ(offered, 0);
}

// --- Refusals and exceptions -------------------------------------------------------------------

TEST_F(ReaperDrainTest, CalledFromFnOnTheWorkerIsRefusedWithLogicError) {
  auto jobs = make_jobs(2);
  std::atomic<bool> refused{false};
  job_reaper* self = nullptr;  // published to the worker by the enqueue below
  job_reaper reaper([&](job& j) {
    if (j.id == 0) {
      try {
        (void)self->reap_on_caller([](job&) { return true; });
      } catch (const std::logic_error&) {
        refused.store(true);
      }
    }
    j.runs.fetch_add(1, std::memory_order_relaxed);
  });
  self = &reaper;
  reaper.freeze();
  reaper.enqueue(jobs[0]);
  reaper.enqueue(jobs[1]);
  reaper.thaw();
  reaper.flush();
  EXPECT_TRUE(refused.load());
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size()) << "the refused call took nothing";
  EXPECT_EQ(reaper.stats().inline_reaped, reaper.stats().helped) << "on a caller only as a helping flush";
}

// One level removed: A.flush() from B's fn inside B.reap_on_caller, itself inside A's
// reap_on_caller (same reaper type). The flush would wait for A's call that encloses it: refused
// as it is from A's own callback, not a deadlock.
TEST_F(ReaperDrainTest, AFlushInsideAnotherReapersReapOnCallerInsideOursIsRefused) {
  auto a_jobs = make_jobs(1);
  auto b_jobs = make_jobs(1);
  job_reaper* a = nullptr;
  job_reaper* b = nullptr;
  bool refused_flush = false;
  bool refused_freeze = false;
  bool b_in_a_callback = false;
  job_reaper b_reaper([&](job& j) {
    b_in_a_callback = a->in_own_callback();
    try {
      a->flush();
    } catch (const std::logic_error&) {
      refused_flush = true;
    }
    try {
      a->freeze();
    } catch (const std::logic_error&) {
      refused_freeze = true;
    }
    j.runs.fetch_add(1, std::memory_order_relaxed);
  });
  job_reaper a_reaper([&](job& j) {
    (void)b->reap_on_caller([](job&) { return true; });
    j.runs.fetch_add(1, std::memory_order_relaxed);
  });
  a = &a_reaper;
  b = &b_reaper;
  a_reaper.freeze();
  b_reaper.freeze();
  a_reaper.enqueue(a_jobs[0]);
  b_reaper.enqueue(b_jobs[0]);
  EXPECT_EQ(a_reaper.reap_on_caller([](job&) { return true; }), 1u);
  EXPECT_TRUE(b_in_a_callback);
  EXPECT_TRUE(refused_flush);
  EXPECT_TRUE(refused_freeze);
  EXPECT_FALSE(a_reaper.in_own_callback());
  a_reaper.thaw();
  b_reaper.thaw();
  a_reaper.flush();
  EXPECT_EQ(ran_exactly_once(a_jobs), a_jobs.size());
  EXPECT_EQ(ran_exactly_once(b_jobs), b_jobs.size());
}

TEST_F(ReaperDrainTest, FlushFreezeAndStopFromTakeOrFnOnTheCallerAreRefusedWithLogicError) {
  auto jobs = make_jobs(2);
  std::atomic<int> refused_in_fn{0};
  job_reaper* self = nullptr;
  job_reaper reaper([&](job& j) {
    // On the caller inside reap_on_caller: each of these would wait for that very call.
    for (auto control : {+[](job_reaper& r) { r.flush(); }, +[](job_reaper& r) { r.freeze(); },
                         +[](job_reaper& r) { r.stop(); }}) {
      try {
        control(*self);
      } catch (const std::logic_error&) {
        refused_in_fn.fetch_add(1);
      }
    }
    j.runs.fetch_add(1, std::memory_order_relaxed);
  });
  self = &reaper;
  reaper.freeze();
  reaper.enqueue(jobs[0]);
  reaper.enqueue(jobs[1]);
  bool refused_in_take = false;
  const std::size_t taken = reaper.reap_on_caller([&](job& j) {
    if (j.id == 1) {
      try {
        reaper.flush();
      } catch (const std::logic_error&) {
        refused_in_take = true;
      }
    }
    return j.id == 0;
  });
  EXPECT_EQ(taken, 1u);
  EXPECT_TRUE(refused_in_take);
  EXPECT_EQ(refused_in_fn.load(), 3) << "flush, freeze and stop from fn on the caller";
  reaper.thaw();
  reaper.flush();  // outside reap_on_caller the same thread may flush again
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

TEST_F(ReaperDrainTest, ThrowingTakePropagatesAndEveryItemIsStillTornDownExactlyOnce) {
  auto jobs = make_jobs(6);
  job_reaper reaper(counting());
  reaper.freeze();
  for (job& j : jobs) reaper.enqueue(j);
  EXPECT_THROW((void)reaper.reap_on_caller([](job& j) {
                 if (j.id == 3) throw std::runtime_error("take failed");
                 return j.id < 2;  // accepts 0 and 1, declines 2
               }),
               std::runtime_error);
  EXPECT_EQ(jobs[0].runs.load(), 1);
  EXPECT_EQ(jobs[1].runs.load(), 1);
  for (std::size_t id = 2; id < jobs.size(); ++id) EXPECT_EQ(jobs[id].runs.load(), 0) << "job " << id;
  EXPECT_EQ(reaper.stats().inline_reaped, 2u);
  reaper.thaw();
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  EXPECT_EQ(reaper.stats().pending, 0u);
}

TEST_F(ReaperDrainTest, ThrowingFnOnTheCallerIsCountedHandedToOnErrorAndTheRestStillRuns) {
  auto jobs = make_jobs(3);
  std::atomic<int> reported{0};
  std::thread::id reported_on;
  job_reaper reaper(
      [](job& j) {
        j.runs.fetch_add(1, std::memory_order_relaxed);
        if (j.id == 0) throw std::runtime_error("fn failed");
      },
      {.on_error = [&](std::exception_ptr) {
        reported_on = std::this_thread::get_id();
        reported.fetch_add(1);
      }});
  reaper.freeze();
  for (job& j : jobs) reaper.enqueue(j);
  std::size_t torn_down = 0;
  EXPECT_NO_THROW(torn_down = reaper.reap_on_caller([](job&) { return true; }));
  EXPECT_EQ(torn_down, 3u);
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  EXPECT_EQ(reported.load(), 1);
  EXPECT_EQ(reported_on, std::this_thread::get_id());
  EXPECT_EQ(reaper.stats().errors, 1u);
  reaper.thaw();
}

// --- flush and stop while a caller holds items -------------------------------------------------

// The caller holds two queued items (it will decline them) while the worker, thawed, finds the
// queue empty and could complete a flush requested meanwhile. The flush must still cover the two
// items: they were enqueued before it was called.
TEST_F(ReaperDrainTest, FlushConcurrentWithADecliningCallerReturnsOnlyAfterTheDeclinedItemsRan) {
  auto jobs = make_jobs(2);
  job_reaper reaper(counting());
  reaper.freeze();
  for (job& j : jobs) reaper.enqueue(j);
  std::latch release(1);
  std::atomic<bool> holding{false};
  std::thread caller([&] {
    (void)reaper.reap_on_caller([&](job& j) {
      if (j.id == 0) {
        holding.store(true);
        release.wait();
      }
      return false;
    });
  });
  wait_until(holding);
  reaper.thaw();  // the worker finds nothing: the caller holds both items
  std::atomic<bool> flushed{false};
  std::vector<int> runs_when_flushed;
  std::thread flusher([&] {
    reaper.flush();
    for (const job& j : jobs) runs_when_flushed.push_back(j.runs.load());
    flushed.store(true);
  });
  std::this_thread::sleep_for(20ms);  // a chance for a wrong flush to complete on the empty queue
  EXPECT_FALSE(flushed.load()) << "flush returned while the caller still held items";
  release.count_down();
  caller.join();
  flusher.join();
  EXPECT_EQ(runs_when_flushed, (std::vector<int>{1, 1}));
}

// stop() cannot wait for items a caller holds; the caller, finding the reaper stopped when it
// puts its declined items back, tears them down itself.
TEST_F(ReaperDrainTest, ItemsDeclinedAfterTheReaperStoppedAreTornDownInline) {
  auto jobs = make_jobs(2);
  recorder seen;
  job_reaper reaper(seen.fn());
  reaper.freeze();
  for (job& j : jobs) reaper.enqueue(j);
  std::latch release(1);
  std::atomic<bool> holding{false};
  std::size_t torn_down = 99;
  std::thread::id caller_id;
  std::thread caller([&] {
    caller_id = std::this_thread::get_id();
    torn_down = reaper.reap_on_caller([&](job& j) {
      if (j.id == 0) {
        holding.store(true);
        release.wait();
      }
      return false;
    });
  });
  wait_until(holding);
  // stop() overrides the freeze; the worker drains an empty queue and exits, and stop() then
  // waits for the caller, whose declined items find the reaper stopped.
  std::thread stopper([&] { reaper.stop(); });
  EXPECT_TRUE(teardown_test::eventually([&] { return !reaper.stats().running; }));
  release.count_down();
  caller.join();
  stopper.join();
  EXPECT_EQ(torn_down, 0u) << "none was accepted";
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  EXPECT_EQ(seen.thread_of(0), caller_id);
  EXPECT_EQ(seen.thread_of(1), caller_id);
  const teardown::reaper_stats stats = reaper.stats();
  EXPECT_EQ(stats.pending, 0u) << "nothing left queued";
  EXPECT_EQ(stats.inline_reaped, 2u);
  EXPECT_FALSE(stats.running);
}

TEST_F(ReaperDrainTest, ReapOnCallerAfterStopFindsNothingQueued) {
  auto jobs = make_jobs(1);
  job_reaper reaper(counting());
  reaper.stop();
  reaper.enqueue(jobs[0]);  // runs inline
  EXPECT_EQ(reaper.reap_on_caller([](job&) { return true; }), 0u);
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

// --- Many threads ------------------------------------------------------------------------------

TEST_F(ReaperDrainStressTest, ProducersCallerReapsAndFlushesTearEachItemDownExactlyOnce) {
  constexpr std::size_t producers = 3;
  const std::size_t per_producer = scaled(20'000);
  auto jobs = make_jobs(producers * per_producer);
  job_reaper reaper(counting());
  std::atomic<bool> done{false};
  std::latch go(producers + 2);
  std::vector<std::thread> threads;
  for (std::size_t p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      go.arrive_and_wait();
      for (std::size_t i = 0; i < per_producer; ++i) reaper.enqueue(jobs[p * per_producer + i]);
    });
  }
  std::size_t caller_torn_down = 0;
  std::size_t caller_reaps = 0;
  std::thread caller([&] {
    std::mt19937 random(42);
    go.arrive_and_wait();
    while (!done.load()) {
      const std::uint32_t accept_one_in = 1 + random() % 4;
      caller_torn_down += reaper.reap_on_caller([&](job&) { return random() % accept_one_in == 0; });
      ++caller_reaps;
    }
  });
  std::size_t flushes = 0;
  std::thread flusher([&] {
    go.arrive_and_wait();
    while (!done.load()) {
      reaper.flush();
      ++flushes;
    }
  });
  for (std::thread& t : threads) t.join();
  done.store(true);
  caller.join();
  flusher.join();
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  EXPECT_EQ(total_runs(jobs), static_cast<int>(jobs.size()));
  const teardown::reaper_stats stats = reaper.stats();
  EXPECT_EQ(stats.enqueued, jobs.size());
  EXPECT_EQ(stats.reaped, jobs.size());
  EXPECT_EQ(stats.inline_reaped, caller_torn_down);
  EXPECT_EQ(stats.pending, 0u);
  RecordProperty("caller_torn_down", static_cast<int>(caller_torn_down));
  RecordProperty("caller_reaps", static_cast<int>(caller_reaps));
  RecordProperty("flushes", static_cast<int>(flushes));
}

// A flush called while a caller is between taking and putting back must cover what that caller
// declines: each round enqueues a chunk, races a declining caller and a flush, and checks the
// chunk right after the flush returns.
TEST_F(ReaperDrainStressTest, EveryFlushCoversItemsADecliningCallerHeldWhileItRan) {
  const std::size_t rounds = scaled(300);
  constexpr std::size_t chunk = 16;
  auto jobs = make_jobs(rounds * chunk);
  job_reaper reaper(counting());
  std::string first_miss;
  for (std::size_t round = 0; round < rounds && first_miss.empty(); ++round) {
    for (std::size_t i = 0; i < chunk; ++i) reaper.enqueue(jobs[round * chunk + i]);
    std::latch go(2);
    std::thread caller([&] {
      go.arrive_and_wait();
      (void)reaper.reap_on_caller([](job&) {
        std::this_thread::yield();
        return false;
      });
    });
    go.arrive_and_wait();
    reaper.flush();
    for (std::size_t i = 0; i < chunk && first_miss.empty(); ++i) {
      const job& j = jobs[round * chunk + i];
      if (j.runs.load() != 1) first_miss = "round " + std::to_string(round) + ": job " + std::to_string(j.id);
    }
    caller.join();
  }
  EXPECT_EQ(first_miss, "");
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

}  // namespace
}  // namespace teardown_test
