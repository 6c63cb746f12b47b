// Specification of teardown::reaper (everything but fork(), which reaper_fork_test.cpp covers):
// exactly-once teardown and its order, the wake-up protocol (ping-pong into an empty queue, the
// worker sleeping every time), flush, freeze/thaw, stop and the destructor, fn's exceptions, the
// calls fn may not make, flush_for, stalled(), the worker's name, nice value, policy and idle
// CPU use read back from /proc, per-item CPU accounting, and setup warnings. The
// ReaperStressTest suite adds many producers and flushes racing them.
//
// Nothing here asserts a time. Every test is bounded by item counts; a sleep is only ever a
// chance for a wrong implementation to misbehave (never needed for a right one to pass), or the
// stated setup of a behaviour (flush_for's timeout, the stall threshold). A lost wake-up or a
// deadlock shows as a hang, which the per-test hang_guard turns into an abort naming the test.
#include "teardown/reaper.hpp"
#include "teardown/sharded_llist.hpp"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <iterator>
#include <latch>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "reaper_test_support.hpp"
#include "test_support.hpp"

namespace teardown_test {
namespace {

using namespace reaper_support;

using namespace std::chrono_literals;
using teardown::drain_order;
using teardown::llist_node;
using teardown::reaper_options;

static_assert(!std::is_copy_constructible_v<job_reaper> && !std::is_copy_assignable_v<job_reaper>);
static_assert(noexcept(std::declval<job_reaper&>().enqueue(std::declval<job&>())), "enqueue is noexcept");
static_assert(noexcept(std::declval<const job_reaper&>().stats()));
static_assert(noexcept(std::declval<const job_reaper&>().stalled()));
static_assert(!teardown::cpu_accounted<job>, "job has no teardown_cpu_owner");


// Every test runs under a hang guard.
class ReaperTest : public ::testing::Test {
 private:
  hang_guard guard_{current_test_name()};
};
using ReaperStressTest = ReaperTest;

// --- /proc helpers -----------------------------------------------------------------------------

std::string task_comm(pid_t tid) {
  std::string comm = read_text("/proc/self/task/" + std::to_string(tid) + "/comm");
  while (!comm.empty() && (comm.back() == '\n' || comm.back() == '\r')) comm.pop_back();
  return comm;
}

// Field `number` (1-based, as in proc(5)) of /proc/self/task/<tid>/stat. The name in field 2
// may hold spaces and parentheses, so the fields from 3 on are counted after its last ')'.
long long task_stat_field(pid_t tid, int number) {
  const std::string stat = read_text("/proc/self/task/" + std::to_string(tid) + "/stat");
  const std::size_t close = stat.rfind(')');
  if (close == std::string::npos || number < 3) return -1;
  std::istringstream rest(stat.substr(close + 1));
  std::string field;
  for (int at = 3; at <= number; ++at) {
    if (!(rest >> field)) return -1;
  }
  return std::stoll(field);
}

constexpr int stat_utime = 14;   // clock ticks in user mode
constexpr int stat_stime = 15;   // clock ticks in kernel mode
constexpr int stat_nice = 19;
constexpr int stat_policy = 41;

// The ids of this process's threads whose name is `name`.
std::vector<pid_t> tasks_named(const std::string& name) {
  std::vector<pid_t> found;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    const pid_t tid = static_cast<pid_t>(std::stol(entry.path().filename().string()));
    if (task_comm(tid) == name) found.push_back(tid);
  }
  return found;
}

// --- Exactly once, and in order ----------------------------------------------------------------

TEST_F(ReaperTest, FlushReturnsOnceEveryEnqueuedItemWasTornDownExactlyOnce) {
  auto jobs = make_jobs(1000);
  job_reaper reaper(counting());
  for (job& j : jobs) reaper.enqueue(j);
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

TEST_F(ReaperTest, StatsCountEnqueuedReapedAndPendingConsistently) {
  auto jobs = make_jobs(10);
  job_reaper reaper(counting());
  reaper.freeze();
  for (job& j : jobs) reaper.enqueue(j);
  teardown::reaper_stats before = reaper.stats();
  EXPECT_EQ(before.enqueued, 10u);
  EXPECT_EQ(before.reaped, 0u);
  EXPECT_EQ(before.pending, 10u);
  reaper.thaw();
  reaper.flush();
  teardown::reaper_stats after = reaper.stats();
  EXPECT_EQ(after.enqueued, 10u);
  EXPECT_EQ(after.reaped, 10u);
  EXPECT_EQ(after.pending, 0u);
  EXPECT_EQ(after.errors, 0u);
  EXPECT_EQ(after.inline_reaped, after.helped) << "the worker tore everything down (or a helping flush)";
  EXPECT_GE(after.batches, 1u);
  EXPECT_TRUE(after.running);
}

TEST_F(ReaperTest, FnRunsOnTheWorkerNotOnTheCaller) {
  auto jobs = make_jobs(3);
  std::mutex seen_mutex;
  std::vector<std::thread::id> seen;
  // waiters_help off: a flush that waited would tear down on this thread ("Waiters help").
  job_reaper reaper(
      [&](job&) {
        const std::lock_guard lock(seen_mutex);
        seen.push_back(std::this_thread::get_id());
      },
      {.waiters_help = false});
  for (job& j : jobs) reaper.enqueue(j);
  reaper.flush();
  const std::lock_guard lock(seen_mutex);
  ASSERT_EQ(seen.size(), 3u);
  for (const std::thread::id& id : seen) EXPECT_NE(id, std::this_thread::get_id());
}

// Freezing first puts the whole backlog into one batch: fn then sees the enqueue order.
TEST_F(ReaperTest, DrainsOldestFirstByDefault) {
  auto jobs = make_jobs(20);
  std::vector<std::size_t> order;  // written by the worker; read after flush()
  job_reaper reaper([&](job& j) { order.push_back(j.id); });
  reaper.freeze();
  for (job& j : jobs) reaper.enqueue(j);
  reaper.thaw();
  reaper.flush();
  std::vector<std::size_t> expected(jobs.size());
  for (std::size_t i = 0; i < expected.size(); ++i) expected[i] = i;
  EXPECT_EQ(order, expected);
}

TEST_F(ReaperTest, NewestFirstOptionDrainsNewestFirst) {
  auto jobs = make_jobs(20);
  std::vector<std::size_t> order;
  job_reaper reaper([&](job& j) { order.push_back(j.id); }, {.order = drain_order::newest_first});
  reaper.freeze();
  for (job& j : jobs) reaper.enqueue(j);
  reaper.thaw();
  reaper.flush();
  std::vector<std::size_t> expected(jobs.size());
  for (std::size_t i = 0; i < expected.size(); ++i) expected[i] = expected.size() - 1 - i;
  EXPECT_EQ(order, expected);
}

TEST_F(ReaperTest, FnSeesWhatTheProducerWroteBeforeEnqueue) {
  struct payload_job {
    llist_node hook;
    int payload = 0;  // plain: published by enqueue
    int seen = 0;
  };
  std::vector<payload_job> jobs(100);
  auto fn = [](payload_job& j) { j.seen = j.payload; };
  teardown::reaper<payload_job, &payload_job::hook, decltype(fn)> reaper(fn);
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    jobs[i].payload = static_cast<int>(i) + 1;
    reaper.enqueue(jobs[i]);
  }
  reaper.flush();
  for (std::size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(jobs[i].seen, static_cast<int>(i) + 1);
}

TEST_F(ReaperTest, FnMayFreeTheItem) {
  struct heap_job {
    llist_node hook;
  };
  std::atomic<int> freed{0};
  auto fn = [&freed](heap_job& j) {
    delete &j;
    freed.fetch_add(1, std::memory_order_relaxed);
  };
  teardown::reaper<heap_job, &heap_job::hook, decltype(fn)> reaper(fn);
  for (int i = 0; i < 100; ++i) reaper.enqueue(*new heap_job);
  reaper.flush();
  EXPECT_EQ(freed.load(), 100);  // and AddressSanitizer sees no use after free
}

TEST_F(ReaperTest, FnMayEnqueueAnotherItem) {
  auto jobs = make_jobs(2);
  job_reaper* self = nullptr;  // set before the first enqueue, which publishes it to the worker
  job_reaper reaper([&](job& j) {
    j.runs.fetch_add(1, std::memory_order_relaxed);
    if (j.id == 0) self->enqueue(jobs[1]);
  });
  self = &reaper;
  reaper.enqueue(jobs[0]);
  reaper.flush();  // covers jobs[0]; jobs[1] was enqueued meanwhile, so flush again
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(jobs), 2u);
}

TEST_F(ReaperTest, YieldAfterOptionStillTearsEverythingDown) {
  auto jobs = make_jobs(200);
  job_reaper reaper(counting(), {.yield_after = 1ns});
  for (job& j : jobs) reaper.enqueue(j);
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

// --- No lost wake-up ---------------------------------------------------------------------------

// Every enqueue goes into an empty queue and the producer then waits for fn: with spin_polls = 0
// the worker goes to sleep between items, so each round trip exercises the sleep/kick race. A
// lost wake-up hangs, and the hang guard reports it.
void ping_pong(std::uint32_t spin_polls) {
  // Never fewer than 2,000 round trips, even under a sanitizer.
  const std::size_t rounds = std::max<std::size_t>(scaled(20'000), 2'000);
  auto jobs = make_jobs(rounds);
  std::atomic<int> done{0};
  job_reaper reaper(
      [&done](job& j) {
        j.runs.fetch_add(1, std::memory_order_relaxed);
        done.fetch_add(1, std::memory_order_release);
        done.notify_one();
      },
      {.spin_polls = spin_polls});
  for (std::size_t round = 0; round < rounds; ++round) {
    reaper.enqueue(jobs[round]);
    const int target = static_cast<int>(round) + 1;
    for (int now = done.load(std::memory_order_acquire); now < target; now = done.load(std::memory_order_acquire)) {
      done.wait(now, std::memory_order_acquire);
    }
  }
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(jobs), rounds);
  const teardown::reaper_stats stats = reaper.stats();
  EXPECT_EQ(stats.reaped, rounds);
  EXPECT_LE(stats.wakeups, rounds) << "at most one wake-up per enqueue into an empty queue";
  ::testing::Test::RecordProperty("wakeups", std::to_string(stats.wakeups) + " of " + std::to_string(rounds));
  if (spin_polls == 0) {
    EXPECT_GT(stats.wakeups, 0u) << "a worker that never spins must have been woken";
  }
}

TEST_F(ReaperTest, EnqueueIntoAnEmptyQueueAlwaysWakesAWorkerThatNeverSpins) { ping_pong(0); }

TEST_F(ReaperTest, EnqueueIntoAnEmptyQueueAlwaysWakesAWorkerWithTheDefaultSpin) { ping_pong(256); }

TEST_F(ReaperTest, EnqueueMakesNoWakeupCallWhileTheWorkerIsNotAsleep) {
  auto jobs = make_jobs(100);
  job_reaper reaper(counting(), {.spin_polls = 0});
  reaper.freeze();  // parked between items, not asleep on the futex
  const std::uint64_t wakeups_before = reaper.stats().wakeups;
  for (job& j : jobs) reaper.enqueue(j);
  EXPECT_EQ(reaper.stats().wakeups, wakeups_before);
  reaper.thaw();
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

// --- Freeze and thaw ---------------------------------------------------------------------------

TEST_F(ReaperTest, FreezeWaitsForTheItemInFlightToFinish) {
  auto jobs = make_jobs(1);
  std::latch release(1);
  std::atomic<bool> started{false};
  std::atomic<bool> finished{false};
  job_reaper reaper([&](job&) {
    started.store(true);
    release.wait();
    finished.store(true);
  });
  reaper.enqueue(jobs[0]);
  wait_until(started);

  std::atomic<bool> freeze_returned{false};
  std::atomic<bool> finished_when_freeze_returned{false};
  std::thread freezer([&] {
    reaper.freeze();
    finished_when_freeze_returned.store(finished.load());
    freeze_returned.store(true);
  });
  std::this_thread::sleep_for(20ms);  // a chance for a wrong freeze to return early
  EXPECT_FALSE(freeze_returned.load()) << "freeze returned while fn was still running";
  release.count_down();
  freezer.join();
  EXPECT_TRUE(finished_when_freeze_returned.load()) << "freeze returned before the item in flight finished";
  reaper.thaw();
}

TEST_F(ReaperTest, ItemsEnqueuedWhileFrozenWaitForThaw) {
  auto jobs = make_jobs(5);
  job_reaper reaper(counting());
  reaper.freeze();
  for (job& j : jobs) reaper.enqueue(j);
  EXPECT_FALSE(reaper.flush_for(50ms));  // gives a frozen worker every chance to run them
  EXPECT_EQ(total_runs(jobs), 0);
  reaper.thaw();
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

// The freeze lands in the middle of a batch: the worker parks between two items and runs
// nothing more until thaw, not even the rest of the batch it holds.
TEST_F(ReaperTest, WorkerFrozenInTheMiddleOfABatchRunsNothingMoreUntilThaw) {
  auto jobs = make_jobs(20);
  std::latch release(1);
  std::atomic<bool> started{false};
  job_reaper reaper(first_item_blocks(release, started));
  enqueue_as_one_batch(reaper, jobs);  // one batch of 20; item 0 blocks
  wait_until(started);
  std::thread freezer([&] { reaper.freeze(); });
  std::this_thread::sleep_for(20ms);  // lets the freeze request arrive while item 0 runs
  release.count_down();
  freezer.join();
  const int ran_when_frozen = total_runs(jobs);
  EXPECT_GE(ran_when_frozen, 1);
  EXPECT_FALSE(reaper.flush_for(50ms));
  EXPECT_EQ(total_runs(jobs), ran_when_frozen) << "a frozen worker ran items";
  reaper.thaw();
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

TEST_F(ReaperTest, FreezesNestAndTheWorkerResumesOnlyAfterTheLastThaw) {
  auto jobs = make_jobs(3);
  job_reaper reaper(counting());
  reaper.freeze();
  reaper.freeze();
  for (job& j : jobs) reaper.enqueue(j);
  reaper.thaw();
  EXPECT_FALSE(reaper.flush_for(50ms));
  EXPECT_EQ(total_runs(jobs), 0) << "one thaw of two freezes resumed the worker";
  reaper.thaw();
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

TEST_F(ReaperTest, FreezeOfAnIdleWorkerReturns) {
  job_reaper reaper(counting());
  reaper.freeze();
  reaper.thaw();
  auto jobs = make_jobs(1);
  reaper.enqueue(jobs[0]);
  reaper.flush();
  EXPECT_EQ(jobs[0].runs.load(), 1);
}

TEST_F(ReaperTest, ThawWithoutFreezeThrowsLogicErrorAndChangesNothing) {
  auto jobs = make_jobs(1);
  job_reaper reaper(counting());
  EXPECT_THROW(reaper.thaw(), std::logic_error);
  reaper.freeze();
  reaper.thaw();
  EXPECT_THROW(reaper.thaw(), std::logic_error) << "one thaw more than freezes";
  reaper.enqueue(jobs[0]);
  reaper.flush();
  EXPECT_EQ(jobs[0].runs.load(), 1);
}

// --- fn throws ---------------------------------------------------------------------------------

TEST_F(ReaperTest, ThrowingFnIsCountedHandedToOnErrorAndTheBacklogStillRuns) {
  auto jobs = make_jobs(10);
  std::vector<std::string> messages;  // written on the worker; read after flush()
  std::vector<std::thread::id> error_threads;
  std::thread::id fn_thread;
  reaper_options opts;
  opts.on_error = [&](std::exception_ptr error) {
    error_threads.push_back(std::this_thread::get_id());
    try {
      std::rethrow_exception(error);
    } catch (const std::runtime_error& e) {
      messages.emplace_back(e.what());
    } catch (...) {
      messages.emplace_back("not a std::runtime_error");
    }
  };
  job_reaper reaper(
      [&](job& j) {
        fn_thread = std::this_thread::get_id();
        j.runs.fetch_add(1, std::memory_order_relaxed);
        if (j.id == 3) throw std::runtime_error("job 3 failed");
      },
      std::move(opts));
  reaper.freeze();
  for (job& j : jobs) reaper.enqueue(j);  // one batch: the items after job 3 are in it
  reaper.thaw();
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  EXPECT_EQ(reaper.stats().errors, 1u);
  EXPECT_EQ(reaper.stats().reaped, 10u);
  EXPECT_EQ(messages, std::vector<std::string>{"job 3 failed"});
  ASSERT_EQ(error_threads.size(), 1u);
  EXPECT_EQ(error_threads[0], fn_thread) << "on_error runs on the tearing-down thread";
}

TEST_F(ReaperTest, ThrowingFnWithoutOnErrorIsCounted) {
  auto jobs = make_jobs(6);
  job_reaper reaper([](job& j) {
    j.runs.fetch_add(1, std::memory_order_relaxed);
    if (j.id % 2 == 0) throw 42;  // not even a std::exception
  });
  for (job& j : jobs) reaper.enqueue(j);
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  EXPECT_EQ(reaper.stats().errors, 3u);
}

TEST_F(ReaperTest, ThrowingOnErrorIsContained) {
  auto jobs = make_jobs(10);
  std::atomic<int> on_error_calls{0};
  reaper_options opts;
  opts.on_error = [&](std::exception_ptr) {
    on_error_calls.fetch_add(1);
    throw std::runtime_error("on_error failed too");
  };
  job_reaper reaper(
      [](job& j) {
        j.runs.fetch_add(1, std::memory_order_relaxed);
        throw std::runtime_error("fn failed");
      },
      std::move(opts));
  reaper.freeze();
  for (job& j : jobs) reaper.enqueue(j);
  reaper.thaw();
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  EXPECT_EQ(on_error_calls.load(), 10);
  EXPECT_EQ(reaper.stats().errors, 10u);
  EXPECT_TRUE(reaper.stats().running);
}

TEST_F(ReaperTest, ThrowingFnOnTheInlinePathAfterStopGoesToOnError) {
  auto jobs = make_jobs(1);
  std::atomic<int> on_error_calls{0};
  reaper_options opts;
  opts.on_error = [&](std::exception_ptr) { on_error_calls.fetch_add(1); };
  job_reaper reaper(
      [](job& j) {
        j.runs.fetch_add(1, std::memory_order_relaxed);
        throw std::runtime_error("fn failed");
      },
      std::move(opts));
  reaper.stop();
  reaper.enqueue(jobs[0]);  // noexcept: must not let fn's exception out
  EXPECT_EQ(jobs[0].runs.load(), 1);
  EXPECT_EQ(on_error_calls.load(), 1);
  EXPECT_EQ(reaper.stats().errors, 1u);
}

// A lower bound, not a timing assertion: the item was enqueued before a 20 ms sleep and taken
// after it, so the recorded wait cannot be shorter. A later batch that waited less leaves the
// longest where it was.
TEST_F(ReaperTest, LongestWaitCoversTheTimeAnItemWaitedWhileFrozen) {
  auto jobs = make_jobs(2);
  job_reaper reaper(counting());
  reaper.freeze();
  reaper.enqueue(jobs[0]);
  std::this_thread::sleep_for(20ms);
  reaper.thaw();
  reaper.flush();
  const std::uint64_t longest = reaper.stats().longest_wait_ns;
  EXPECT_GE(longest, std::uint64_t{20'000'000});
  reaper.enqueue(jobs[1]);  // taken at once: almost always a shorter wait
  reaper.flush();
  EXPECT_GE(reaper.stats().longest_wait_ns, longest) << "the longest wait is a maximum: it never goes down";
}

// --- Stop and the destructor -------------------------------------------------------------------

TEST_F(ReaperTest, StopDrainsTheBacklog) {
  auto jobs = make_jobs(500);
  job_reaper reaper(counting());
  for (job& j : jobs) reaper.enqueue(j);
  reaper.stop();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  EXPECT_FALSE(reaper.stats().running);
  EXPECT_EQ(reaper.stats().pending, 0u);
}

TEST_F(ReaperTest, StopOverridesFreezeAndDrainsTheBacklog) {
  auto jobs = make_jobs(100);
  job_reaper reaper(counting());
  reaper.freeze();
  for (job& j : jobs) reaper.enqueue(j);
  reaper.stop();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  EXPECT_FALSE(reaper.stats().running);
}

TEST_F(ReaperTest, StopOverridesAFreezeThatParkedTheWorkerMidBatch) {
  auto jobs = make_jobs(20);
  std::latch release(1);
  std::atomic<bool> started{false};
  job_reaper reaper(first_item_blocks(release, started));
  enqueue_as_one_batch(reaper, jobs);
  wait_until(started);
  std::thread freezer([&] { reaper.freeze(); });
  std::this_thread::sleep_for(20ms);
  release.count_down();
  freezer.join();
  reaper.stop();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

TEST_F(ReaperTest, StopIsIdempotent) {
  auto jobs = make_jobs(10);
  job_reaper reaper(counting());
  for (job& j : jobs) reaper.enqueue(j);
  reaper.stop();
  reaper.stop();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  EXPECT_FALSE(reaper.stats().running);
}

// Whichever of two concurrent stop() calls does the work, neither returns before the drain.
TEST_F(ReaperTest, ConcurrentStopsBothReturnOnlyAfterTheDrain) {
  auto jobs = make_jobs(50);
  std::latch release(1);
  std::atomic<bool> started{false};
  job_reaper reaper(first_item_blocks(release, started));
  for (job& j : jobs) reaper.enqueue(j);
  wait_until(started);
  std::atomic<int> ran_when_returned[2] = {-1, -1};
  std::thread stoppers[2];
  for (int s = 0; s < 2; ++s) {
    stoppers[s] = std::thread([&, s] {
      reaper.stop();
      ran_when_returned[s].store(total_runs(jobs));
    });
  }
  std::this_thread::sleep_for(20ms);  // both stops are (very likely) waiting now
  release.count_down();
  for (std::thread& stopper : stoppers) stopper.join();
  EXPECT_EQ(ran_when_returned[0].load(), 50);
  EXPECT_EQ(ran_when_returned[1].load(), 50);
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

TEST_F(ReaperTest, EnqueueAfterStopRunsFnInlineOnTheCaller) {
  auto jobs = make_jobs(3);
  std::vector<std::thread::id> threads;  // inline: on this thread
  job_reaper reaper([&](job& j) {
    threads.push_back(std::this_thread::get_id());
    j.runs.fetch_add(1, std::memory_order_relaxed);
  });
  reaper.stop();
  for (job& j : jobs) {
    reaper.enqueue(j);
    EXPECT_EQ(j.runs.load(), 1) << "torn down before enqueue returned";
  }
  EXPECT_EQ(threads, std::vector<std::thread::id>(3, std::this_thread::get_id()));
  const teardown::reaper_stats stats = reaper.stats();
  EXPECT_EQ(stats.inline_reaped, 3u);
  EXPECT_EQ(stats.reaped, 3u);
  EXPECT_EQ(stats.enqueued, 3u);
  EXPECT_EQ(stats.pending, 0u);
}

TEST_F(ReaperTest, FlushAfterStopReturnsTrueAtOnce) {
  job_reaper reaper(counting());
  reaper.stop();
  reaper.flush();
  EXPECT_TRUE(reaper.flush_for(0ms));
}

// A stopped reaper drains its queue on the producer of a chain, inside a hand that flushes
// wait out. While that teardown blocks, flush_for gives up at its deadline, also when another
// flush, without a deadline, waits for the same hand first (settlers take turns: the second
// must not wait for the first past its own deadline); the flush without one returns after it.
TEST_F(ReaperTest, FlushForGivesUpAtItsDeadlineWhileAProducersTeardownAfterStopRuns) {
  auto jobs = make_jobs(1);
  std::atomic<bool> started{false};
  std::atomic<bool> go{false};
  job_reaper reaper(held_until_go(started, go));
  reaper.stop();
  std::thread producer([&] {
    teardown::llist_chain<job, &job::hook> chain;
    chain.push_back(jobs[0]);
    reaper.enqueue_chain(std::move(chain));  // tears job 0 down here, and blocks in it
  });
  while (!started.load()) std::this_thread::sleep_for(1ms);
  EXPECT_FALSE(reaper.flush_for(20ms)) << "flush_for returned true while a producer's teardown ran";
  std::atomic<bool> flushed{false};
  std::thread flusher([&] {
    reaper.flush();
    flushed.store(true);
  });
  // A safety net, so that a flush_for that waits for the other flush fails instead of hanging.
  std::thread safety_net([&] {
    for (int ms = 0; ms < 10'000 && !go.load(); ++ms) std::this_thread::sleep_for(1ms);
    go.store(true);
  });
  std::this_thread::sleep_for(20ms);  // most often the flusher's turn comes first; the test holds either way
  EXPECT_FALSE(reaper.flush_for(20ms)) << "flush_for returned true while a producer's teardown ran (or only "
                                          "after waiting for the other flush)";
  EXPECT_FALSE(flushed.load()) << "flush returned while a producer's teardown ran";
  go.store(true);
  producer.join();
  flusher.join();
  safety_net.join();
  EXPECT_EQ(jobs[0].runs.load(), 1);
  EXPECT_TRUE(reaper.flush_for(10s));
}

TEST_F(ReaperTest, FreezeAfterStopReturnsAtOnce) {
  job_reaper reaper(counting());
  reaper.stop();
  reaper.freeze();
  reaper.thaw();
}

// pthread_t values are recycled: a thread started after the worker was joined may get the
// worker's old pthread_t. It must not be mistaken for the worker and refused.
TEST_F(ReaperTest, ThreadsStartedAfterStopMayFlushFreezeAndStop) {
  job_reaper reaper(counting());
  auto jobs = make_jobs(1);
  reaper.enqueue(jobs[0]);
  reaper.stop();
  for (int attempt = 0; attempt < 8; ++attempt) {
    std::thread later([&] {
      EXPECT_NO_THROW(reaper.flush()) << "attempt " << attempt;
      EXPECT_NO_THROW(reaper.freeze()) << "attempt " << attempt;
      EXPECT_NO_THROW(reaper.thaw()) << "attempt " << attempt;
      EXPECT_NO_THROW(reaper.stop()) << "attempt " << attempt;
    });
    later.join();
  }
}

TEST_F(ReaperTest, DestructorDrainsTheBacklog) {
  auto jobs = make_jobs(500);
  {
    job_reaper reaper(counting());
    for (job& j : jobs) reaper.enqueue(j);
  }
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

TEST_F(ReaperTest, DestructorDrainsTheBacklogOfAFrozenWorker) {
  auto jobs = make_jobs(100);
  {
    job_reaper reaper(counting());
    reaper.freeze();
    for (job& j : jobs) reaper.enqueue(j);
  }  // no thaw: the destructor's stop overrides the freeze
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

// --- What fn may not call ----------------------------------------------------------------------

TEST_F(ReaperTest, StopFlushAndFreezeCalledFromFnAreRefusedWithLogicError) {
  auto jobs = make_jobs(1);
  std::vector<std::string> refused;  // written on the worker; read after flush()
  job_reaper* self = nullptr;        // published to the worker by the enqueue below
  job_reaper reaper([&](job&) {
    const auto attempt = [&](const char* what, auto&& call) {
      try {
        call();
        refused.push_back(std::string(what) + ": NOT refused");
      } catch (const std::logic_error&) {
        refused.push_back(what);
      }
    };
    attempt("flush", [&] { self->flush(); });
    attempt("flush_for", [&] { (void)self->flush_for(1s); });
    attempt("freeze", [&] { self->freeze(); });
    attempt("stop", [&] { self->stop(); });
  });
  self = &reaper;
  reaper.enqueue(jobs[0]);
  reaper.flush();
  EXPECT_EQ(refused, (std::vector<std::string>{"flush", "flush_for", "freeze", "stop"}));
  EXPECT_TRUE(reaper.stats().running) << "the refused stop changed nothing";
  EXPECT_EQ(reaper.stats().errors, 0u);
}

// --- flush_for ---------------------------------------------------------------------------------

TEST_F(ReaperTest, FlushForReturnsFalseWhileFrozenWithAQueuedItem) {
  auto jobs = make_jobs(1);
  job_reaper reaper(counting());
  reaper.freeze();
  reaper.enqueue(jobs[0]);
  EXPECT_FALSE(reaper.flush_for(50ms));
  reaper.thaw();
  EXPECT_TRUE(reaper.flush_for(60s));
  EXPECT_EQ(jobs[0].runs.load(), 1);
}

TEST_F(ReaperTest, FlushForReturnsTrueOnceTheItemsRan) {
  auto jobs = make_jobs(100);
  job_reaper reaper(counting());
  for (job& j : jobs) reaper.enqueue(j);
  EXPECT_TRUE(reaper.flush_for(60s));
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  EXPECT_TRUE(reaper.flush_for(60s)) << "nothing queued";
}

// --- stalled() ---------------------------------------------------------------------------------

TEST_F(ReaperTest, StalledWhenTheOldestItemWaitedPastTheThreshold) {
  auto jobs = make_jobs(1);
  job_reaper reaper(counting(), {.stall_threshold = 1ms});
  EXPECT_FALSE(reaper.stalled()) << "nothing queued";
  reaper.freeze();
  reaper.enqueue(jobs[0]);
  std::this_thread::sleep_for(20ms);  // 20 times the threshold
  EXPECT_TRUE(reaper.stalled());
  reaper.thaw();
  reaper.flush();
  EXPECT_FALSE(reaper.stalled()) << "the queue is empty again";
}

TEST_F(ReaperTest, NotStalledBelowTheDefaultThreshold) {
  auto jobs = make_jobs(1);
  job_reaper reaper(counting());
  reaper.freeze();
  reaper.enqueue(jobs[0]);
  std::this_thread::sleep_for(20ms);  // far below the default second
  EXPECT_FALSE(reaper.stalled());
  reaper.thaw();
}

// --- The worker thread as the system sees it ---------------------------------------------------

// The fn of a reaper whose worker a test inspects in /proc: it records the worker's thread id.
struct worker_probe {
  std::vector<job> jobs = make_jobs(1);
  std::atomic<pid_t> tid{0};
  job_fn fn() {
    return [this](job&) { tid.store(current_tid()); };
  }
  // Runs an item through `reaper` (so its setup is done) and returns the worker's thread id.
  pid_t worker_tid(job_reaper& reaper) {
    reaper.enqueue(jobs[0]);
    reaper.flush();
    // A flush that waited past boost_after (a sanitizer on a loaded machine) raised the worker,
    // which lowers itself once drained: maybe only after the flush returned.
    EXPECT_TRUE(eventually([&] { return !reaper.stats().boosted; }));
    return tid.load();
  }
};

TEST_F(ReaperTest, WorkerThreadCarriesTheConfiguredName) {
  worker_probe probe;
  job_reaper reaper(probe.fn(), {.name = "td_reaper_test"});
  const pid_t worker = probe.worker_tid(reaper);
  ASSERT_EQ(reaper.stats().setup_warnings & teardown::setup_warning_name, 0u);
  EXPECT_EQ(tasks_named("td_reaper_test"), std::vector<pid_t>{worker});
}

TEST_F(ReaperTest, LongNameIsTruncatedTo15Characters) {
  worker_probe probe;
  job_reaper reaper(probe.fn(), {.name = "td_reaper_name_that_is_too_long"});
  const pid_t worker = probe.worker_tid(reaper);
  EXPECT_EQ(reaper.stats().setup_warnings & teardown::setup_warning_name, 0u);
  EXPECT_EQ(task_comm(worker), "td_reaper_name_");
}

// 19 where a boost could raise it back; an ordinary user's worker keeps the caller's nice ("Boost").
TEST_F(ReaperTest, WorkerRunsAtNice19ByDefaultWhereABoostCouldUndoIt) {
  const long long caller_nice = task_stat_field(current_tid(), stat_nice);
  worker_probe probe;
  job_reaper reaper(probe.fn());
  const pid_t worker = probe.worker_tid(reaper);
  if (reaper.stats().setup_warnings & teardown::setup_warning_nice) {
    GTEST_SKIP() << "setpriority was refused here (setup_warning_nice)";
  }
  EXPECT_EQ(task_stat_field(worker, stat_nice), default_worker_nice(19));
  EXPECT_EQ(reaper.nice(), default_worker_nice(19)) << "nice() is the nice in force";
  EXPECT_EQ(task_stat_field(current_tid(), stat_nice), caller_nice) << "the caller's nice is untouched";
}

TEST_F(ReaperTest, NiceOptionIsApplied) {
  worker_probe probe;
  job_reaper reaper(probe.fn(), {.nice = 7});
  const pid_t worker = probe.worker_tid(reaper);
  if (reaper.stats().setup_warnings & teardown::setup_warning_nice) {
    GTEST_SKIP() << "setpriority(7) was refused here (setup_warning_nice)";
  }
  EXPECT_EQ(task_stat_field(worker, stat_nice), default_worker_nice(7));
  worker_probe forced_probe;
  job_reaper forced(forced_probe.fn(), {.nice = 7, .nice_only_if_raisable = false});
  EXPECT_EQ(task_stat_field(forced_probe.worker_tid(forced), stat_nice), 7) << "applied for every user";
}

TEST_F(ReaperTest, BatchAndIdlePoliciesAreApplied) {
  for (const auto& [policy, linux_policy] :
       {std::pair{teardown::sched_policy::batch, SCHED_BATCH}, std::pair{teardown::sched_policy::idle, SCHED_IDLE}}) {
    worker_probe probe;
    job_reaper reaper(probe.fn(), {.policy = policy});
    const pid_t worker = probe.worker_tid(reaper);
    if (reaper.stats().setup_warnings & teardown::setup_warning_policy) {
      GTEST_SKIP() << "sched_setscheduler was refused here (setup_warning_policy)";
    }
    EXPECT_EQ(task_stat_field(worker, stat_policy), linux_policy);
  }
}

// This asserts CPU use, not time: over 400 ms an idle worker must not accumulate more than one
// clock tick of user + system time (a spinning or busy-polling worker would accumulate ~40).
TEST_F(ReaperTest, IdleWorkerUsesNoMeasurableCpu) {
  worker_probe probe;
  job_reaper reaper(probe.fn());
  const pid_t worker = probe.worker_tid(reaper);
  const long long before = task_stat_field(worker, stat_utime) + task_stat_field(worker, stat_stime);
  std::this_thread::sleep_for(400ms);
  const long long after = task_stat_field(worker, stat_utime) + task_stat_field(worker, stat_stime);
  ASSERT_GE(before, 0);
  EXPECT_LE(after - before, 1) << "clock ticks of CPU used by an idle worker";
}

// --- Per-item CPU accounting -------------------------------------------------------------------

struct owned_job {
  llist_node hook;
  std::atomic<std::uint64_t>* owner = nullptr;
};
// Found by argument-dependent lookup.
std::atomic<std::uint64_t>* teardown_cpu_owner(owned_job& j) { return j.owner; }

static_assert(teardown::cpu_accounted<owned_job>);

std::uint64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(ts.tv_nsec);
}

// Burns `ns` of this thread's CPU time (bounded by CPU time, so the same on any machine).
void burn_cpu(std::uint64_t ns) {
  const std::uint64_t start = thread_cpu_ns();
  volatile std::uint64_t sink = 0;
  while (thread_cpu_ns() - start < ns) {
    for (int i = 0; i < 1000; ++i) sink = sink + static_cast<std::uint64_t>(i);
  }
}

TEST_F(ReaperTest, CpuSpentInFnIsChargedToTheItemsOwner) {
  constexpr std::uint64_t burn_ns = 1'000'000;  // 1 ms of CPU per item
  std::atomic<std::uint64_t> first_owner{0};
  std::atomic<std::uint64_t> second_owner{0};
  std::vector<owned_job> jobs(3);
  jobs[0].owner = &first_owner;
  jobs[1].owner = &second_owner;
  jobs[2].owner = &first_owner;
  auto fn = [](owned_job&) { burn_cpu(burn_ns); };
  teardown::reaper<owned_job, &owned_job::hook, decltype(fn)> reaper(fn);
  for (owned_job& j : jobs) reaper.enqueue(j);
  reaper.flush();
  EXPECT_GE(first_owner.load(), 2 * burn_ns) << "two items' CPU";
  EXPECT_GE(second_owner.load(), burn_ns);
  EXPECT_GE(reaper.stats().worker_cpu_ns, 3 * burn_ns);
  // Each item is charged what its fn took, not the worker's CPU so far: the charges are a part
  // of the worker's whole.
  EXPECT_LE(first_owner.load() + second_owner.load(), reaper.stats().worker_cpu_ns);
}

TEST_F(ReaperTest, ItemWithoutAnOwnerIsStillAccountedToTheWorker) {
  std::vector<owned_job> jobs(1);  // owner stays nullptr
  auto fn = [](owned_job&) { burn_cpu(1'000'000); };
  teardown::reaper<owned_job, &owned_job::hook, decltype(fn)> reaper(fn);
  reaper.enqueue(jobs[0]);
  reaper.flush();
  EXPECT_GT(reaper.stats().worker_cpu_ns, 0u);
}

// --- Setup warnings ----------------------------------------------------------------------------

TEST_F(ReaperTest, ImpossibleAffinityIsReportedAndTheReaperStillWorks) {
  auto jobs = make_jobs(10);
  job_reaper reaper(counting(), {.cpus = {100000}});
  for (job& j : jobs) reaper.enqueue(j);
  reaper.flush();
  EXPECT_NE(reaper.stats().setup_warnings & teardown::setup_warning_affinity, 0u);
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

// --- Many threads ------------------------------------------------------------------------------

void many_producers(std::uint32_t spin_polls) {
  constexpr std::size_t producers = 4;
  const std::size_t per_producer = scaled(20'000);
  auto jobs = make_jobs(producers * per_producer);
  job_reaper reaper(counting(), {.spin_polls = spin_polls});
  std::latch go(producers);
  std::vector<std::thread> threads;
  for (std::size_t p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      go.arrive_and_wait();
      for (std::size_t i = 0; i < per_producer; ++i) reaper.enqueue(jobs[p * per_producer + i]);
    });
  }
  for (std::thread& t : threads) t.join();
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  const teardown::reaper_stats stats = reaper.stats();
  EXPECT_EQ(stats.enqueued, jobs.size());
  EXPECT_EQ(stats.reaped, jobs.size());
  EXPECT_EQ(stats.pending, 0u);
}

TEST_F(ReaperStressTest, FourProducersEachItemTornDownExactlyOnce) { many_producers(256); }

TEST_F(ReaperStressTest, FourProducersEachItemTornDownExactlyOnceWithAWorkerThatNeverSpins) {
  many_producers(0);
}

// Each producer publishes how many of its items' enqueue calls have returned; a flush must cover
// every item counted before the flush was called, however many keep arriving behind it. The
// producers go in chunks, each chunk released by the start of a flush, so that the flushes
// really overlap the enqueues.
TEST_F(ReaperStressTest, FlushCoversEverythingEnqueuedBeforeItWhileProducersKeepAdding) {
  constexpr std::size_t producers = 4;
  constexpr std::size_t chunks = 40;
  const std::size_t per_producer = scaled(40'000);
  auto jobs = make_jobs(producers * per_producer);
  job_reaper reaper(counting());
  std::vector<std::atomic<std::size_t>> returned(producers);  // per producer: enqueues returned
  std::atomic<std::size_t> flushes_started{0};
  std::vector<std::thread> threads;
  for (std::size_t p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      for (std::size_t i = 0; i < per_producer; ++i) {
        if (i % (per_producer / chunks) == 0) {
          const std::size_t chunk = i / (per_producer / chunks);
          while (flushes_started.load() < chunk) std::this_thread::yield();
        }
        reaper.enqueue(jobs[p * per_producer + i]);
        returned[p].store(i + 1, std::memory_order_release);  // this enqueue returned
      }
    });
  }
  std::string first_miss;
  int flushes_while_producing = 0;
  std::vector<std::size_t> before(producers);
  for (int flush = 0; first_miss.empty(); ++flush) {
    for (std::size_t p = 0; p < producers; ++p) before[p] = returned[p].load(std::memory_order_acquire);
    const bool producing =
        std::any_of(before.begin(), before.end(), [&](std::size_t n) { return n < per_producer; });
    flushes_started.fetch_add(1);  // releases the next chunk, to be enqueued during this flush
    reaper.flush();
    for (std::size_t p = 0; p < producers && first_miss.empty(); ++p) {
      for (std::size_t i = 0; i < before[p]; ++i) {
        const job& j = jobs[p * per_producer + i];
        if (j.runs.load(std::memory_order_relaxed) != 1) {
          first_miss = "item " + std::to_string(j.id) + " ran " + std::to_string(j.runs.load()) +
                       " times when flush " + std::to_string(flush) + ", called after its enqueue, returned";
          break;
        }
      }
    }
    if (producing) ++flushes_while_producing;
    if (!producing) break;
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(first_miss, "");
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  RecordProperty("flushes_while_producing", flushes_while_producing);
}

TEST_F(ReaperStressTest, ConcurrentFlushesFreezesAndThawsLoseNothing) {
  constexpr std::size_t producers = 2;
  const std::size_t per_producer = scaled(20'000);
  auto jobs = make_jobs(producers * per_producer);
  job_reaper reaper(counting());
  produce_while_flushing_and_freezing(reaper, producers, [&](std::size_t p) {
    for (std::size_t i = 0; i < per_producer; ++i) reaper.enqueue(jobs[p * per_producer + i]);
  });
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

TEST_F(ReaperStressTest, ProducersRacingStopLoseNothing) {
  constexpr std::size_t producers = 4;
  const std::size_t per_producer = scaled(10'000);
  auto jobs = make_jobs(producers * per_producer);
  std::atomic<std::size_t> started{0};
  job_reaper reaper(counting());
  std::vector<std::thread> threads;
  for (std::size_t p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      for (std::size_t i = 0; i < per_producer; ++i) {
        reaper.enqueue(jobs[p * per_producer + i]);
        if (i == per_producer / 4) started.fetch_add(1);
      }
    });
  }
  while (started.load() < producers) std::this_thread::yield();
  reaper.stop();  // the producers are a quarter through: the rest go inline or race the stop
  for (std::thread& t : threads) t.join();
  reaper.flush();  // takes anything a producer left queued while racing the stop
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  EXPECT_EQ(reaper.stats().pending, 0u);
}

// --- stop_for: shutdown with a deadline ---------------------------------------------------------

TEST_F(ReaperTest, StopForWithNothingBlockingDrainsJoinsAndReturnsTrue) {
  auto jobs = make_jobs(200);
  job_reaper reaper(counting());
  reaper.freeze();
  for (job& j : jobs) reaper.enqueue(j);
  EXPECT_TRUE(reaper.stop_for(30s));  // a liveness bound, not a time assertion
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  EXPECT_FALSE(reaper.stats().running);
  EXPECT_EQ(reaper.stats().pending, 0u);
}

// A teardown that blocks: stop_for gives up, leaving everything queued and counted; once the
// teardown is released a later stop finishes the job, each item once.
TEST_F(ReaperTest, StopForReturnsFalseWhileATeardownBlocksAndLeavesTheRestCounted) {
  auto jobs = make_jobs(20);
  std::latch release(1);
  std::atomic<bool> started{false};
  job_reaper reaper(first_item_blocks(release, started));
  enqueue_as_one_batch(reaper, jobs);
  wait_until(started);
  EXPECT_FALSE(reaper.stop_for(20ms));
  EXPECT_EQ(reaper.stats().pending, 20u) << "the blocked item and the 19 behind it";
  EXPECT_EQ(total_runs(jobs), 0);
  release.count_down();
  reaper.stop();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  EXPECT_EQ(reaper.stats().pending, 0u);
  EXPECT_FALSE(reaper.stats().running);
}

// A reap_on_caller that began before the worker's end may still put items back: stop waits for
// it, but stop_for and a flush_for after the worker's end no longer than their deadline. Once the
// caller declines its item, a stop tears it down.
TEST_F(ReaperTest, StopForAndFlushForGiveUpAtTheirDeadlineWhileAReapOnCallerHoldsItsTake) {
  auto jobs = make_jobs(1);
  std::atomic<bool> taking{false};
  std::atomic<bool> go{false};
  job_reaper reaper([](job& j) { j.runs.fetch_add(1); });
  reaper.freeze();  // the item waits on the queue for the caller
  reaper.enqueue(jobs[0]);
  std::thread caller([&] {
    (void)reaper.reap_on_caller([&](job&) {
      taking.store(true);
      while (!go.load()) std::this_thread::sleep_for(1ms);
      return false;  // declined: put back, or torn down here if the worker has ended
    });
  });
  wait_until(taking);
  const go_at_the_latest watchdog(go, 20s);
  expect_gave_up_before_go(reaper.stop_for(20ms), go, "stop_for (for the caller's reap)");
  expect_gave_up_before_go(reaper.flush_for(20ms), go, "flush_for (for the caller's reap)");
  go.store(true);
  caller.join();
  reaper.stop();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

// After stop, an enqueued chain is torn down on its producer, inside a hand that every later stop
// waits for: stop_for waits for that hand, and for the settle turn of a stop already waiting for it, no
// longer than its deadline.
TEST_F(ReaperTest, StopForGivesUpAtItsDeadlineWhileAProducersTeardownAfterStopIsInItsHands) {
  auto jobs = make_jobs(1);
  std::atomic<bool> started{false};
  std::atomic<bool> go{false};
  job_reaper reaper(held_until_go(started, go));
  reaper.stop();
  std::thread producer([&] {
    teardown::llist_chain<job, &job::hook> chain;
    chain.push_back(jobs[0]);
    reaper.enqueue_chain(std::move(chain));  // the reaper is stopped: torn down here, inside a hand
  });
  wait_until(started);
  const go_at_the_latest watchdog(go, 20s);
  expect_gave_up_before_go(reaper.stop_for(20ms), go, "stop_for (for the producer's hand)");
  std::atomic<pid_t> settler_tid{0};
  std::thread settler([&] {
    settler_tid.store(current_tid());
    reaper.stop();  // holds the settle turn while it waits for the hand
  });
  ASSERT_TRUE(eventually([&] { return settler_tid.load() != 0; }));
  wait_until_asleep(settler_tid.load());
  expect_gave_up_before_go(reaper.stop_for(20ms), go, "stop_for (for the settle turn)");
  go.store(true);
  producer.join();
  settler.join();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

TEST_F(ReaperTest, StopForAgainAfterATimeoutReturnsTrueOnceTheTeardownReturns) {
  auto jobs = make_jobs(20);
  std::latch release(1);
  std::atomic<bool> started{false};
  job_reaper reaper(first_item_blocks(release, started));
  enqueue_as_one_batch(reaper, jobs);
  wait_until(started);
  EXPECT_FALSE(reaper.stop_for(1ms));
  EXPECT_FALSE(reaper.stop_for(0s)) << "a zero timeout only looks";
  release.count_down();
  EXPECT_TRUE(reaper.stop_for(30s));
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

// After a stop_for that timed out, enqueue goes on as during a stop: nothing it hands over is
// lost or run twice, and flush waits for the worker (flush_for gives up while it is blocked).
TEST_F(ReaperTest, EnqueueAndFlushAfterATimedOutStopForLoseNothing) {
  auto jobs = make_jobs(20);
  auto later = make_jobs(10);
  std::latch release(1);
  std::atomic<bool> started{false};
  job_reaper reaper(first_item_blocks(release, started));
  enqueue_as_one_batch(reaper, jobs);
  wait_until(started);
  ASSERT_FALSE(reaper.stop_for(1ms));
  for (job& j : later) reaper.enqueue(j);
  EXPECT_FALSE(reaper.flush_for(1ms));
  release.count_down();
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  EXPECT_EQ(ran_exactly_once(later), later.size());
  EXPECT_EQ(reaper.stats().pending, 0u);
  job one_more;
  reaper.enqueue(one_more);  // the worker has ended: inline
  EXPECT_EQ(one_more.runs.load(), 1);
}

TEST_F(ReaperTest, DestructorAfterATimedOutStopForFinishesTheJob) {
  auto jobs = make_jobs(20);
  std::latch release(1);
  std::atomic<bool> started{false};
  {
    job_reaper reaper(first_item_blocks(release, started));
    enqueue_as_one_batch(reaper, jobs);
    wait_until(started);
    EXPECT_FALSE(reaper.stop_for(1ms));
    release.count_down();
  }  // the destructor waits (without limit) and joins
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

TEST_F(ReaperTest, StopForCalledFromFnIsRefusedWithLogicError) {
  std::atomic<bool> refused{false};
  job_reaper* self = nullptr;
  job_reaper reaper([&](job& j) {
    try {
      (void)self->stop_for(1s);
    } catch (const std::logic_error& e) {
      refused.store(std::string(e.what()).find("teardown::reaper::stop_for") != std::string::npos);
    }
    j.runs.fetch_add(1);
  });
  self = &reaper;
  job j;
  reaper.enqueue(j);
  reaper.flush();
  EXPECT_TRUE(refused.load());
  EXPECT_EQ(j.runs.load(), 1);
}

// --- Destroying the reaper from its own callback: a clear abort, never a use-after-free ------------

// The death statement waits (bounded) for the abort; a reaper that does not abort ends the child
// with exit code 0, which the death test reports as "did not die".
[[noreturn]] void wait_for_the_abort() {
  for (int i = 0; i < 10'000; ++i) std::this_thread::sleep_for(1ms);
  std::_Exit(0);
}

class ReaperDeathTest : public ReaperTest {
 protected:
  void SetUp() override {
    GTEST_FLAG_SET(death_test_style, "threadsafe");  // other threads exist: re-execute
#if !GTEST_HAS_DEATH_TEST
    GTEST_SKIP() << "this platform has no death tests";
#endif
  }
};

TEST_F(ReaperDeathTest, DestroyingTheReaperFromFnOnItsWorkerAbortsWithAMessage) {
  EXPECT_DEATH(
      {
        static job j;
        job_reaper* reaper = nullptr;
        reaper = new job_reaper([&reaper](job&) { delete reaper; });
        reaper->enqueue(j);
        wait_for_the_abort();
      },
      "teardown::reaper::~reaper: the reaper is destroyed from its own worker \\(from fn\\)");
}

TEST_F(ReaperDeathTest, DestroyingTheReaperFromTakeInsideReapOnCallerAbortsWithAMessage) {
  EXPECT_DEATH(
      {
        static job j;
        auto* reaper = new job_reaper(counting());
        reaper->freeze();
        reaper->enqueue(j);
        (void)reaper->reap_on_caller([&](job&) {
          delete reaper;
          return false;
        });
        wait_for_the_abort();
      },
      "teardown::reaper::~reaper: the reaper is destroyed from take or fn inside its own reap_on_caller");
}

TEST_F(ReaperDeathTest, DestroyingTheReaperFromFnInsideReapOnCallerAbortsWithAMessage) {
  EXPECT_DEATH(
      {
        static job j;
        job_reaper* reaper = nullptr;
        std::atomic<bool> frozen{false};
        reaper = new job_reaper([&](job&) {
          if (frozen.load()) delete reaper;  // only inside reap_on_caller: the worker is frozen
        });
        reaper->freeze();
        frozen.store(true);
        reaper->enqueue(j);
        (void)reaper->reap_on_caller([](job&) { return true; });
        wait_for_the_abort();
      },
      "teardown::reaper::~reaper: the reaper is destroyed from take or fn inside its own reap_on_caller");
}

TEST_F(ReaperTest, InOwnCallbackIsTrueOnlyInsideTheReapersOwnCallbacks) {
  std::atomic<int> inside_fn{-1};
  job_reaper* self = nullptr;
  job_reaper reaper([&](job&) { inside_fn.store(self->in_own_callback() ? 1 : 0); });
  self = &reaper;
  EXPECT_FALSE(reaper.in_own_callback());
  job j;
  reaper.enqueue(j);
  reaper.flush();
  EXPECT_EQ(inside_fn.load(), 1);
  reaper.freeze();
  job k;
  reaper.enqueue(k);
  bool inside_take = false;
  (void)reaper.reap_on_caller([&](job&) {
    inside_take = reaper.in_own_callback();
    return false;
  });
  EXPECT_TRUE(inside_take);
  EXPECT_FALSE(reaper.in_own_callback());
  reaper.thaw();
}

}  // namespace
}  // namespace teardown_test

// --- Probes: sched_yield and pthread_getcpuclockid seen from inside ------------------------------
//
// Defined in the test executable, these two interpose libc's for the whole process (calls from
// the headers bind to them): they count the worker's sched_yield calls, and let one stats() call
// hold the window between deciding to read the worker's CPU clock and reading it.

namespace teardown_test::probes {

// sched_yield calls made on threads named "yield_probe".
std::atomic<std::uint64_t> probe_yields{0};

// Set on the thread whose next pthread_getcpuclockid call holds until stop() has returned (or
// a second has passed, which is all a correct stats() allows: stop() cannot return meanwhile).
thread_local bool hold_clock_read = false;
std::atomic<int> held_clock_reads{0};
std::atomic<bool> stop_returned{false};
std::atomic<bool> clock_read_after_join{false};

}  // namespace teardown_test::probes

extern "C" int sched_yield() noexcept {
  char name[16] = {};
  if (pthread_getname_np(pthread_self(), name, sizeof name) == 0 && std::strcmp(name, "yield_probe") == 0) {
    teardown_test::probes::probe_yields.fetch_add(1);
  }
  return static_cast<int>(syscall(SYS_sched_yield));
}

extern "C" int pthread_getcpuclockid(pthread_t thread, clockid_t* clock) noexcept {
  using real_fn = int (*)(pthread_t, clockid_t*) noexcept;
  static const auto real = reinterpret_cast<real_fn>(dlsym(RTLD_NEXT, "pthread_getcpuclockid"));
  namespace probes = teardown_test::probes;
  if (std::exchange(probes::hold_clock_read, false)) {
    probes::held_clock_reads.fetch_add(1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (!probes::stop_returned.load() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (probes::stop_returned.load()) probes::clock_read_after_join.store(true);
  }
  return real(thread, clock);
}

namespace teardown_test {
namespace {

std::size_t live_threads() {
  return static_cast<std::size_t>(std::distance(std::filesystem::directory_iterator("/proc/self/task"),
                                                std::filesystem::directory_iterator()));
}

// --- stats() and the worker's CPU clock ----------------------------------------------------------

// stats() reads the worker's CPU clock through its pthread_t. A stats() call that decided to
// read it while the worker ran must finish the read before stop() joins the worker: after the
// join the pthread_t names nothing, or another thread. The probe holds the read until stop()
// returns; stop() must not return while it is held.
TEST_F(ReaperTest, StatsNeverReadsTheCpuClockOfAJoinedWorker) {
  probes::stop_returned.store(false);
  probes::clock_read_after_join.store(false);
  probes::held_clock_reads.store(0);
  auto jobs = make_jobs(1);
  job_reaper reaper(counting());
  reaper.enqueue(jobs[0]);
  reaper.flush();
  std::uint64_t cpu_seen = 0;
  std::thread reader([&] {
    probes::hold_clock_read = true;
    cpu_seen = reaper.stats().worker_cpu_ns;
  });
  while (probes::held_clock_reads.load() == 0) std::this_thread::sleep_for(1ms);
  reaper.stop();
  probes::stop_returned.store(true);
  reader.join();
  EXPECT_FALSE(probes::clock_read_after_join.load())
      << "stop() joined the worker while stats() was about to read its clock";
  EXPECT_GT(cpu_seen, 0u);
  EXPECT_GE(reaper.stats().worker_cpu_ns, cpu_seen) << "the final figure is read after every live reading";
}

// Many readers racing stop(): under ASan and TSan nothing is reported, and the figure is the
// final one afterwards.
TEST_F(ReaperTest, StatsRacingStopFromManyThreadsIsSafe) {
  for (int round = 0; round < 10; ++round) {
    auto jobs = make_jobs(10);
    job_reaper reaper(counting(), {.nice = 0});  // not starved by the readers on a small machine
    for (job& j : jobs) reaper.enqueue(j);
    std::atomic<bool> done{false};
    std::vector<std::thread> readers;
    for (int r = 0; r < 2; ++r) {
      readers.emplace_back([&] {
        while (!done.load()) {
          (void)reaper.stats();
          std::this_thread::yield();
        }
      });
    }
    reaper.stop();
    done.store(true);
    for (std::thread& t : readers) t.join();
    EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
    const teardown::reaper_stats s = reaper.stats();
    EXPECT_FALSE(s.running);
    EXPECT_EQ(s.worker_cpu_ns, reaper.stats().worker_cpu_ns) << "stopped: a fixed final figure";
  }
}

// --- yield_after ---------------------------------------------------------------------------------

TEST_F(ReaperTest, YieldAfterMakesTheWorkerCallSchedYieldAndCountsIt) {
  probes::probe_yields.store(0);
  auto jobs = make_jobs(200);
  // yield_after = 1 ns: more than that always passes between two checkpoints, and the first
  // checkpoint yields at once.
  job_reaper reaper(counting(), {.name = "yield_probe", .yield_after = 1ns});
  for (job& j : jobs) reaper.enqueue(j);
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  const std::uint64_t yields = reaper.stats().yields;
  EXPECT_GT(yields, 0u);
  EXPECT_GE(probes::probe_yields.load(), yields) << "every counted yield is a sched_yield call on the worker";
}

TEST_F(ReaperTest, WithoutYieldAfterTheWorkerNeverYields) {
  probes::probe_yields.store(0);
  auto jobs = make_jobs(200);
  job_reaper reaper(counting(), {.name = "yield_probe"});
  for (job& j : jobs) reaper.enqueue(j);
  reaper.flush();
  EXPECT_EQ(reaper.stats().yields, 0u);
  EXPECT_EQ(probes::probe_yields.load(), 0u);
}

// --- An item enqueued twice --------------------------------------------------------------------

TEST_F(ReaperDeathTest, EnqueueOfAnItemStillQueuedAbortsWithAMessage) {
  auto jobs = make_jobs(1);
  job_reaper reaper(counting());
  reaper.freeze();  // the item stays queued
  reaper.enqueue(jobs[0]);
  EXPECT_DEATH(reaper.enqueue(jobs[0]),
               "teardown::reaper::enqueue: the item is already queued \\(element type .*job\\)");
  reaper.thaw();
  reaper.flush();
  EXPECT_EQ(jobs[0].runs.load(), 1);
}

TEST_F(ReaperDeathTest, EnqueueAfterStopRefusesAnItemOnAChainRatherThanTearItDown) {
  auto jobs = make_jobs(1);
  job_reaper reaper(counting());
  reaper.stop();
  teardown::llist_chain<job, &job::hook> chain;
  chain.push_back(jobs[0]);
  EXPECT_DEATH(reaper.enqueue(jobs[0]), "teardown::reaper::enqueue: the item is already queued");
  reaper.enqueue_chain(std::move(chain));  // inline, after stop
  EXPECT_EQ(jobs[0].runs.load(), 1);
}

TEST_F(ReaperTest, FnMayEnqueueTheItemItIsTearingDownAgain) {
  // The worker takes each item off its batch before fn sees it, so fn may queue it again.
  job again;
  job_reaper* self = nullptr;
  job_reaper reaper([&](job& j) {
    if (j.runs.fetch_add(1) < 2) self->enqueue(j);
  });
  self = &reaper;
  reaper.enqueue(again);
  while (again.runs.load() < 3) std::this_thread::sleep_for(100us);
  reaper.flush();
  EXPECT_EQ(again.runs.load(), 3);
}

// --- Options -----------------------------------------------------------------------------------

TEST_F(ReaperTest, InvalidOptionsAreRefusedNamingTheFieldBeforeAnyThreadStarts) {
  using namespace std::string_literals;
  struct refused {
    reaper_options opts;
    const char* field;
  };
  const std::vector<refused> cases = {
      {{.nice = 20}, "nice"},
      {{.nice = -21}, "nice"},
      {{.cpus = {0, -1}}, "cpus"},
      {{.policy = static_cast<teardown::sched_policy>(7)}, "policy"},
      {{.order = static_cast<drain_order>(7)}, "order"},
      {{.stall_threshold = -1ns}, "stall_threshold"},
      {{.yield_after = -1ns}, "yield_after"},
      {{.name = "bad\0name"s}, "name"},
  };
  const std::size_t threads_before = live_threads();
  std::atomic<int> calls{0};
  for (const refused& c : cases) {
    try {
      job_reaper reaper([&](job&) { calls.fetch_add(1); }, c.opts);
      ADD_FAILURE() << c.field << ": accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("teardown::reaper: ") + c.field), std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(live_threads(), threads_before) << "no worker was started";
  EXPECT_EQ(calls.load(), 0);
}

TEST_F(ReaperTest, BoundaryOptionsAreAccepted) {
  for (const reaper_options& opts : {reaper_options{.nice = -20}, reaper_options{.nice = 19},
                                     reaper_options{.stall_threshold = 0ns, .yield_after = 0ns}}) {
    auto jobs = make_jobs(3);
    job_reaper reaper(counting(), opts);  // nice -20 may be refused by the kernel: a setup warning
    for (job& j : jobs) reaper.enqueue(j);
    reaper.flush();
    EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  }
}

}  // namespace
}  // namespace teardown_test

// ---- a sharded queue: the one-walk oldest-first take -----------------------------------------

namespace teardown_test {
namespace {

using namespace reaper_support;
using teardown::drain_order;
using teardown::llist_batch;

// Each thread enqueues onto the shard it sets here.
thread_local std::size_t enqueue_shard = 0;

struct chosen_shard_queue : teardown::sharded_llist<job, &job::hook> {
  chosen_shard_queue() : sharded_llist(4) {}
  bool add(job& item) noexcept { return add_to(enqueue_shard, item); }
};

// Wraps del_all (as a queue that pauses or counts its takes would): the reaper must keep
// calling it, not the base's one-walk take.
struct counted_take_queue : chosen_shard_queue {
  static inline std::atomic<int> del_alls{0};
  llist_batch<job, &job::hook> del_all() noexcept {
    del_alls.fetch_add(1, std::memory_order_relaxed);
    return chosen_shard_queue::del_all();
  }
};

static_assert(teardown::detail::has_oldest_first_take<chosen_shard_queue, job, &job::hook>);
static_assert(!teardown::detail::has_oldest_first_take<counted_take_queue, job, &job::hook>);
static_assert(!teardown::detail::has_oldest_first_take<teardown::llist<job, &job::hook>, job, &job::hook>);

// Jobs 0..19 onto shards 2, 0, 1, 2, 0, 1, ... (shard 3 stays empty); per shard in that order.
std::vector<std::size_t> enqueue_across_shards(auto& reaper, std::vector<job>& jobs,
                                               std::vector<std::vector<std::size_t>>& per_shard) {
  per_shard.assign(4, {});
  for (job& j : jobs) {
    enqueue_shard = (j.id + 2) % 3;
    per_shard[enqueue_shard].push_back(j.id);
    reaper.enqueue(j);
  }
  enqueue_shard = 0;
  std::vector<std::size_t> oldest_first;
  for (const auto& shard : per_shard) oldest_first.insert(oldest_first.end(), shard.begin(), shard.end());
  return oldest_first;
}

TEST_F(ReaperTest, AShardedQueueDrainsShardZeroFirstAndEachShardOldestFirst) {
  auto jobs = make_jobs(20);
  std::vector<std::size_t> order;  // written by the worker; read after flush()
  teardown::reaper<job, &job::hook, job_fn, chosen_shard_queue> reaper([&](job& j) { order.push_back(j.id); });
  reaper.freeze();  // the whole backlog in one take
  std::vector<std::vector<std::size_t>> per_shard;
  const std::vector<std::size_t> expected = enqueue_across_shards(reaper, jobs, per_shard);
  reaper.thaw();
  reaper.flush();
  EXPECT_EQ(order, expected);
}

TEST_F(ReaperTest, AShardedQueueDrainsEachShardNewestFirstWhenAsked) {
  auto jobs = make_jobs(20);
  std::vector<std::size_t> order;
  teardown::reaper<job, &job::hook, job_fn, chosen_shard_queue> reaper(
      [&](job& j) { order.push_back(j.id); }, {.order = drain_order::newest_first});
  reaper.freeze();
  std::vector<std::vector<std::size_t>> per_shard;
  (void)enqueue_across_shards(reaper, jobs, per_shard);
  reaper.thaw();
  reaper.flush();
  std::vector<std::size_t> expected;
  for (const auto& shard : per_shard) expected.insert(expected.end(), shard.rbegin(), shard.rend());
  EXPECT_EQ(order, expected);
}

TEST_F(ReaperTest, ReapOnCallerTakesAShardedQueueOldestFirstPerShardInShardOrder) {
  auto jobs = make_jobs(20);
  std::vector<std::size_t> order;
  teardown::reaper<job, &job::hook, job_fn, chosen_shard_queue> reaper([&](job& j) { order.push_back(j.id); });
  reaper.freeze();
  std::vector<std::vector<std::size_t>> per_shard;
  const std::vector<std::size_t> expected = enqueue_across_shards(reaper, jobs, per_shard);
  EXPECT_EQ(reaper.reap_on_caller([](job&) { return true; }), 20u);
  EXPECT_EQ(order, expected);
  reaper.thaw();
}

TEST_F(ReaperTest, AQueueThatWrapsDelAllStillHasItsDelAllCalledForAnOldestFirstTake) {
  auto jobs = make_jobs(20);
  std::vector<std::size_t> order;
  teardown::reaper<job, &job::hook, job_fn, counted_take_queue> reaper([&](job& j) { order.push_back(j.id); });
  reaper.freeze();
  std::vector<std::vector<std::size_t>> per_shard;
  (void)enqueue_across_shards(reaper, jobs, per_shard);
  counted_take_queue::del_alls.store(0, std::memory_order_relaxed);
  EXPECT_EQ(reaper.reap_on_caller([](job&) { return true; }), 20u);
  EXPECT_EQ(counted_take_queue::del_alls.load(std::memory_order_relaxed), 1);
  // del_all().reverse(): each shard oldest first, the shards last first.
  std::vector<std::size_t> expected;
  for (auto shard = per_shard.rbegin(); shard != per_shard.rend(); ++shard) {
    expected.insert(expected.end(), shard->begin(), shard->end());
  }
  EXPECT_EQ(order, expected);
  reaper.thaw();
}

}  // namespace
}  // namespace teardown_test
