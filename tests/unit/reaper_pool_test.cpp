// Specification of teardown::reaper_pool, and of teardown::reaper over a sharded_llist queue:
// every item torn down exactly once over 1, 2 and 4 workers with many producers; flush covering
// everything enqueued before it, also while idle workers steal from a blocked one; stealing and
// the rest of a batch behind a blocked item reaching idle siblings while it blocks, and no
// stealing when it is off;
// freeze/thaw across the pool (no fn runs while frozen, a worker frozen mid-batch hands the rest
// back, reap_on_caller reaches everything); stop and the destructor draining every worker;
// errors counted; calls from fn refused; bad options rejected before anything is created; the
// worker count, names and CPU groups (including a fake sysfs NUMA tree); fork: a child enqueues,
// flushes and stops without deadlock or loss, also forked while another thread flushes.
//
// Nothing here asserts a time. Every test is bounded by item counts; a sleep is only ever a
// chance for a wrong implementation to misbehave, or a wait for a thread to be asleep. A lost
// wake-up or a deadlock shows as a hang, which the per-test hang_guard turns into an abort.
#include "teardown/reaper_pool.hpp"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <latch>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "fork_test_support.hpp"
#include "reaper_test_support.hpp"
#include "teardown/sharded_llist.hpp"
#include "test_support.hpp"

namespace teardown_test {
namespace {

using namespace reaper_support;
using namespace std::chrono_literals;
using teardown::reaper_pool_options;

using job_pool = teardown::reaper_pool<job, &job::hook, job_fn>;  // sharded_llist queues
using job_llist_pool = teardown::reaper_pool<job, &job::hook, job_fn, teardown::llist<job, &job::hook>>;
using sharded_reaper = teardown::reaper<job, &job::hook, job_fn, teardown::sharded_llist<job, &job::hook>>;

static_assert(std::is_same_v<job_pool::worker_type::queue_type, teardown::sharded_llist<job, &job::hook>>);
static_assert(std::is_same_v<job_reaper::queue_type, teardown::llist<job, &job::hook>>, "llist stays the default");
static_assert(noexcept(std::declval<job_pool&>().enqueue(std::declval<job&>())));
static_assert(noexcept(std::declval<const job_pool&>().stats()));
static_assert(!std::is_copy_constructible_v<job_pool>);

class ReaperPoolTest : public ::testing::Test {
 private:
  hang_guard guard_{current_test_name()};
};

// --- helpers -----------------------------------------------------------------------------------

reaper_pool_options pool_options(std::size_t workers, bool steal = true, std::chrono::nanoseconds steal_after = 0ns) {
  reaper_pool_options opts;
  opts.workers = workers;
  opts.steal = steal;
  opts.steal_after = steal_after;
  opts.worker.name = "pool_test";
  return opts;
}

std::size_t live_threads() {
  std::size_t count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) ++count;
  return count;
}

std::set<std::string> thread_names() {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    std::string comm = read_text(entry.path().string() + "/comm");
    while (!comm.empty() && (comm.back() == '\n' || comm.back() == '\r')) comm.pop_back();
    names.insert(comm);
  }
  return names;
}

// Sleeps between looks, as wait_until does: a yielding nice-0 loop starves the nice-19 thieves.
void wait_until_all_ran(const std::vector<job>& jobs, std::size_t from = 0) {
  for (std::size_t i = from; i < jobs.size(); ++i) {
    while (jobs[i].runs.load() == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

template <class Pool>
void expect_balanced(const Pool& pool, std::size_t items) {
  const teardown::reaper_stats stats = pool.stats();
  EXPECT_EQ(stats.enqueued, items);
  EXPECT_EQ(stats.reaped, items);
  EXPECT_EQ(stats.pending, 0u);
  std::uint64_t enqueued = 0, reaped = 0, stolen = 0;
  for (std::size_t i = 0; i < pool.worker_count(); ++i) {
    const teardown::reaper_stats s = pool.worker_stats(i);
    enqueued += s.enqueued;
    reaped += s.reaped;
    stolen += s.stolen;
  }
  EXPECT_EQ(enqueued, stats.enqueued);
  EXPECT_EQ(reaped, stats.reaped);
  EXPECT_EQ(stolen, stats.stolen);
}

// --- many producers, N = 1, 2, 4 ---------------------------------------------------------------

class ReaperPoolStressTest : public ::testing::TestWithParam<std::tuple<std::size_t, bool>> {
 private:
  hang_guard guard_{current_test_name()};
};

template <class Pool>
void many_producers_exactly_once(std::size_t workers, bool steal) {
  constexpr std::size_t producers = 6;
  const std::size_t per_producer = scaled(20'000);
  auto jobs = make_jobs(producers * per_producer);
  // Uneven work: every 64th item spins a little, so that queues grow unevenly and get stolen.
  Pool pool(
      [](job& j) {
        if (j.id % 64 == 0) {
          const auto until = std::chrono::steady_clock::now() + 20us;
          while (std::chrono::steady_clock::now() < until) {
          }
        }
        j.runs.fetch_add(1, std::memory_order_relaxed);
      },
      pool_options(workers, steal));
  ASSERT_EQ(pool.worker_count(), workers);
  std::latch go(producers);
  std::vector<std::thread> threads;
  for (std::size_t p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      go.arrive_and_wait();
      for (std::size_t i = 0; i < per_producer; ++i) {
        job& j = jobs[p * per_producer + i];
        // Half the producers aim everything at worker 0: a skew for the thieves.
        if (p % 2 == 0) {
          pool.enqueue_to(0, j);
        } else {
          pool.enqueue(j);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  pool.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  expect_balanced(pool, jobs.size());
  if (!steal || workers == 1) {
    EXPECT_EQ(pool.stats().stolen, 0u);
  }
}

TEST_P(ReaperPoolStressTest, ManyProducersEachItemTornDownExactlyOnce) {
  const auto [workers, steal] = GetParam();
  many_producers_exactly_once<job_pool>(workers, steal);
}

TEST_P(ReaperPoolStressTest, ManyProducersEachItemTornDownExactlyOnceOverLlistQueues) {
  const auto [workers, steal] = GetParam();
  many_producers_exactly_once<job_llist_pool>(workers, steal);
}

// As reaper_test's test of the same name, across the pool with stealing on and skewed
// producers: a flush covers every item whose enqueue returned before it was called, on any
// worker, however the thieves move items meanwhile.
TEST_P(ReaperPoolStressTest, FlushCoversEverythingEnqueuedBeforeItWhileProducersKeepAdding) {
  const auto [workers, steal] = GetParam();
  constexpr std::size_t producers = 4;
  constexpr std::size_t chunks = 40;
  const std::size_t per_producer = scaled(20'000);
  auto jobs = make_jobs(producers * per_producer);
  job_pool pool(
      [](job& j) {
        if (j.id % 128 == 0) std::this_thread::yield();  // a slow item now and then
        j.runs.fetch_add(1, std::memory_order_relaxed);
      },
      pool_options(workers, steal));
  std::vector<std::atomic<std::size_t>> returned(producers);
  std::atomic<std::size_t> flushes_started{0};
  std::vector<std::thread> threads;
  for (std::size_t p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      for (std::size_t i = 0; i < per_producer; ++i) {
        if (i % (per_producer / chunks) == 0) {
          const std::size_t chunk = i / (per_producer / chunks);
          while (flushes_started.load() < chunk) std::this_thread::yield();
        }
        job& j = jobs[p * per_producer + i];
        if (p == 0) {
          pool.enqueue(j);
        } else {
          pool.enqueue_to(0, j);
        }
        returned[p].store(i + 1, std::memory_order_release);
      }
    });
  }
  std::string first_miss;
  std::vector<std::size_t> before(producers);
  for (int flush = 0; first_miss.empty(); ++flush) {
    for (std::size_t p = 0; p < producers; ++p) before[p] = returned[p].load(std::memory_order_acquire);
    const bool producing = std::any_of(before.begin(), before.end(), [&](std::size_t n) { return n < per_producer; });
    flushes_started.fetch_add(1);
    pool.flush();
    for (std::size_t p = 0; p < producers && first_miss.empty(); ++p) {
      for (std::size_t i = 0; i < before[p]; ++i) {
        const job& j = jobs[p * per_producer + i];
        if (j.runs.load(std::memory_order_relaxed) != 1) {
          first_miss = "item " + std::to_string(j.id) + " ran " + std::to_string(j.runs.load()) + " times when flush " +
                       std::to_string(flush) + ", called after its enqueue, returned";
          break;
        }
      }
    }
    if (!producing) break;
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(first_miss, "");
  pool.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  expect_balanced(pool, jobs.size());
  RecordProperty("stolen", static_cast<int>(pool.stats().stolen));
}

TEST_P(ReaperPoolStressTest, ConcurrentFlushesFreezesAndThawsLoseNothing) {
  const auto [workers, steal] = GetParam();
  constexpr std::size_t producers = 3;
  const std::size_t per_producer = scaled(10'000);
  auto jobs = make_jobs(producers * per_producer);
  job_pool pool(counting(), pool_options(workers, steal));
  produce_while_flushing_and_freezing(pool, producers, [&](std::size_t p) {
    for (std::size_t i = 0; i < per_producer; ++i) pool.enqueue_to(p == 0 ? 0 : i, jobs[p * per_producer + i]);
  });
  pool.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  expect_balanced(pool, jobs.size());
}

TEST_P(ReaperPoolStressTest, ProducersRacingStopLoseNothing) {
  const auto [workers, steal] = GetParam();
  constexpr std::size_t producers = 4;
  const std::size_t per_producer = scaled(10'000);
  auto jobs = make_jobs(producers * per_producer);
  std::atomic<std::size_t> started{0};
  job_pool pool(counting(), pool_options(workers, steal));
  std::vector<std::thread> threads;
  for (std::size_t p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      for (std::size_t i = 0; i < per_producer; ++i) {
        pool.enqueue_to(p == 0 ? 0 : i, jobs[p * per_producer + i]);
        if (i == per_producer / 4) started.fetch_add(1);
      }
    });
  }
  while (started.load() < producers) std::this_thread::yield();
  pool.stop();
  for (std::thread& t : threads) t.join();
  pool.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  EXPECT_EQ(pool.stats().pending, 0u);
  EXPECT_FALSE(pool.stats().running);
}

INSTANTIATE_TEST_SUITE_P(Pools, ReaperPoolStressTest,
                         ::testing::Values(std::make_tuple(std::size_t{1}, true), std::make_tuple(std::size_t{2}, true),
                                           std::make_tuple(std::size_t{4}, true),
                                           std::make_tuple(std::size_t{4}, false)),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "Workers" +
                                  (std::get<1>(info.param) ? "Stealing" : "NoStealing");
                         });

// --- stealing ------------------------------------------------------------------------------------

// The index of the pool worker running the caller: its thread name is "<name>-<index>".
std::size_t this_worker_index() {
  char name[16] = {};
  pthread_getname_np(pthread_self(), name, sizeof name);
  const std::string text = name;
  return std::stoul(text.substr(text.rfind('-') + 1));
}

// A worker is stuck in fn on item 0 (whichever took it: a thief may have) while its queue grows:
// idle siblings take every other item from its queue; a flush still waits for item 0, and
// returns once it is done.
void blocked_worker_is_robbed(std::size_t workers) {
  const std::size_t count = scaled(2'000);
  auto jobs = make_jobs(count);
  std::latch release(1);
  std::atomic<bool> started{false};
  std::atomic<std::size_t> blocked{0};
  job_pool pool(
      [&](job& j) {
        if (j.id == 0) {
          blocked.store(this_worker_index());
          started.store(true);
          release.wait();
        }
        j.runs.fetch_add(1, std::memory_order_relaxed);
      },
      pool_options(workers));
  pool.enqueue_to(0, jobs[0]);
  wait_until(started);
  const std::size_t stuck = blocked.load();
  const teardown::reaper_stats stuck_before = pool.worker_stats(stuck);
  for (std::size_t i = 1; i < count; ++i) pool.enqueue_to(stuck, jobs[i]);
  wait_until_all_ran(jobs, 1);  // only thieves can run them: worker `stuck` is in fn on item 0
  EXPECT_EQ(jobs[0].runs.load(), 0);
  EXPECT_EQ(ran_exactly_once(jobs), count - 1);
  EXPECT_GE(pool.stats().stolen, count - 1);
  EXPECT_EQ(pool.worker_stats(stuck).reaped, stuck_before.reaped) << "worker " << stuck << " ran nothing more";
  EXPECT_EQ(pool.worker_stats(stuck).enqueued, stuck_before.enqueued + count - 1);
  EXPECT_FALSE(pool.flush_for(20ms)) << "item 0 is still in fn";

  std::atomic<bool> flushed{false};
  std::thread flusher([&] {
    pool.flush();
    flushed.store(true);
  });
  std::this_thread::sleep_for(10ms);  // a chance for a wrong flush to return early
  EXPECT_FALSE(flushed.load());
  release.count_down();
  flusher.join();
  EXPECT_EQ(ran_exactly_once(jobs), count);
  expect_balanced(pool, count);
}

TEST_F(ReaperPoolTest, IdleSiblingStealsFromABlockedWorkerAndFlushWaitsForTheBlockedItem) {
  blocked_worker_is_robbed(2);
}

TEST_F(ReaperPoolTest, IdleSiblingsStealFromABlockedWorkerAndFlushWaitsForTheBlockedItemFourWorkers) {
  blocked_worker_is_robbed(4);
}

TEST_F(ReaperPoolTest, WithoutStealingNothingLeavesABlockedWorker) {
  auto jobs = make_jobs(50);
  std::latch release(1);
  std::atomic<bool> started{false};
  job_pool pool(first_item_blocks(release, started), pool_options(2, /*steal=*/false));
  pool.enqueue_to(0, jobs[0]);
  wait_until(started);
  for (std::size_t i = 1; i < jobs.size(); ++i) pool.enqueue_to(0, jobs[i]);
  std::this_thread::sleep_for(20ms);  // a chance for a wrong pool to steal
  EXPECT_EQ(total_runs(jobs), 0);
  release.count_down();
  pool.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  EXPECT_EQ(pool.stats().stolen, 0u);
  EXPECT_EQ(pool.worker_stats(1).reaped, 0u);
}

// The thread id of the pool worker named "<name>-<index>".
pid_t worker_tid(std::size_t index) {
  const std::string name = "pool_test-" + std::to_string(index);
  for (;;) {
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
      std::string comm = read_text(entry.path().string() + "/comm");
      while (!comm.empty() && (comm.back() == '\n' || comm.back() == '\r')) comm.pop_back();
      if (comm == name) return static_cast<pid_t>(std::stol(entry.path().filename().string()));
    }
    std::this_thread::sleep_for(1ms);  // not named yet
  }
}

// Waits (at most 30 s: a liveness bound, not a time assertion) until every job of `jobs` from
// `from` on ran; false if some did not.
bool all_ran_within_30s(const std::vector<job>& jobs, std::size_t from) {
  const auto give_up = std::chrono::steady_clock::now() + 30s;
  for (std::size_t i = from; i < jobs.size(); ++i) {
    while (jobs[i].runs.load() == 0) {
      if (std::chrono::steady_clock::now() > give_up) return false;
      std::this_thread::sleep_for(100us);
    }
  }
  return true;
}

// One worker takes a whole batch whose first item blocks: the items behind it, in that worker's
// hands (not on a queue), reach the idle siblings while it still blocks. A flush issued
// meanwhile returns only after the blocked item. Each item runs exactly once.
TEST_F(ReaperPoolTest, TheRestOfABatchBehindABlockedItemReachesIdleSiblingsWhileItBlocks) {
  auto jobs = make_jobs(201);  // job 0 blocks; 200 quick ones behind it
  std::latch release(1);
  std::atomic<bool> started{false};
  job_pool pool(first_item_blocks(release, started), pool_options(4, /*steal=*/true, 1ms));
  pool.freeze();
  for (job& j : jobs) pool.enqueue(j);  // one thread: one worker's queue, oldest first
  pool.thaw();                          // that worker (or a thief of its older half) takes job 0 with the rest
  wait_until(started);
  const bool all_ran = all_ran_within_30s(jobs, 1);
  EXPECT_TRUE(all_ran) << ran_exactly_once(jobs) << " of 200 items ran while item 0 blocked: the rest of its "
                       << "batch is stuck behind it";
  EXPECT_EQ(jobs[0].runs.load(), 0) << "item 0 still blocks";
  EXPECT_GT(pool.stats().stolen, 0u);

  std::atomic<bool> flushed{false};
  std::thread flusher([&] {
    pool.flush();
    flushed.store(true);
  });
  std::this_thread::sleep_for(20ms);  // a chance for a wrong flush to return early
  EXPECT_FALSE(flushed.load()) << "a flush returned while an item enqueued before it still blocks";
  release.count_down();
  flusher.join();
  EXPECT_EQ(jobs[0].runs.load(), 1);
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  expect_balanced(pool, jobs.size());
}

// A thief runs what it steals in the pool's drain order: the older half of the victim's queue,
// oldest first (oldest_first) or newest first (newest_first). Both workers are held in fn while
// six items queue on one of them, so the thief's first steal sees all six at once.
void a_steal_runs_the_older_half_in_run_order(teardown::drain_order order, const std::vector<std::size_t>& first) {
  auto jobs = make_jobs(8);  // 0 and 1 block; 2..7 are the loot
  std::latch release_victim(1), release_thief(1);
  std::atomic<std::size_t> victim{0}, thief{0};
  std::atomic<bool> victim_started{false}, thief_started{false};
  std::mutex ran_mutex;
  std::vector<std::size_t> ran_by_thief;
  reaper_pool_options opts = pool_options(2);
  opts.worker.order = order;
  job_pool pool(
      [&](job& j) {
        if (j.id == 0) {
          victim.store(this_worker_index());
          victim_started.store(true);
          release_victim.wait();
        } else if (j.id == 1) {
          thief.store(this_worker_index());
          thief_started.store(true);
          release_thief.wait();
        } else if (this_worker_index() == thief.load()) {
          const std::lock_guard lock(ran_mutex);
          ran_by_thief.push_back(j.id);
        }
        j.runs.fetch_add(1, std::memory_order_relaxed);
      },
      opts);
  pool.enqueue_to(0, jobs[0]);
  wait_until(victim_started);
  pool.enqueue_to(1 - victim.load(), jobs[1]);  // the other worker, idle: nothing else to steal
  wait_until(thief_started);
  ASSERT_NE(thief.load(), victim.load());
  for (std::size_t i = 2; i < jobs.size(); ++i) pool.enqueue_to(victim.load(), jobs[i]);
  release_thief.count_down();  // it finds its own queue empty and robs the victim
  wait_until_all_ran(jobs, 2);
  {
    const std::lock_guard lock(ran_mutex);
    ASSERT_GE(ran_by_thief.size(), first.size());
    EXPECT_EQ(std::vector<std::size_t>(ran_by_thief.begin(), ran_by_thief.begin() + first.size()), first)
        << "the thief's first steal: the older half of items 2..7, in the pool's run order";
  }
  release_victim.count_down();
  pool.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  expect_balanced(pool, jobs.size());
}

TEST_F(ReaperPoolTest, AThiefRunsTheOlderHalfOfAQueueOldestFirst) {
  a_steal_runs_the_older_half_in_run_order(teardown::drain_order::oldest_first, {2, 3, 4});
}

TEST_F(ReaperPoolTest, AThiefRunsTheOlderHalfOfAQueueNewestFirst) {
  a_steal_runs_the_older_half_in_run_order(teardown::drain_order::newest_first, {4, 3, 2});
}

// A thief robs the queue whose backlog started first, wherever it comes in the thief's scan.
// Three workers are held in fn (jobs 0..2); two of them get a backlog, the older one on the
// worker the thief looks at last; then the third is let go.
TEST_F(ReaperPoolTest, AThiefRobsTheQueueWhoseBacklogIsOldest) {
  auto jobs = make_jobs(3 + 4);  // 0..2 block; 3, 4: the older backlog; 5, 6: the newer
  std::latch release(1);
  std::latch release_thief(1);
  std::array<std::atomic<std::size_t>, 3> held_on{};
  std::array<std::atomic<bool>, 3> started{};
  std::atomic<std::size_t> first_stolen{0};
  job_pool pool(
      [&](job& j) {
        if (j.id < 3) {
          held_on[j.id].store(this_worker_index());
          started[j.id].store(true);
          (j.id == 2 ? release_thief : release).wait();
        } else {
          std::size_t none = 0;
          (void)first_stolen.compare_exchange_strong(none, j.id);
        }
        j.runs.fetch_add(1, std::memory_order_relaxed);
      },
      pool_options(3));
  // Each blocking job goes to a worker not yet held (a sibling may take it, if idle: then that
  // one is held instead), so the three end up on three workers.
  std::set<std::size_t> held;
  for (std::size_t i = 0; i < 3; ++i) {
    std::size_t free_worker = 0;
    while (held.count(free_worker) != 0) ++free_worker;
    pool.enqueue_to(free_worker, jobs[i]);
    wait_until(started[i]);
    held.insert(held_on[i].load());
  }
  ASSERT_EQ(held.size(), 3u);
  const std::size_t thief = held_on[2].load();
  const std::size_t looked_at_first = (thief + 1) % 3;
  const std::size_t looked_at_last = (thief + 2) % 3;
  pool.enqueue_to(looked_at_last, jobs[3]);  // the older backlog
  pool.enqueue_to(looked_at_last, jobs[4]);
  std::this_thread::sleep_for(2ms);  // so that the two backlogs' start times differ
  pool.enqueue_to(looked_at_first, jobs[5]);
  pool.enqueue_to(looked_at_first, jobs[6]);
  release_thief.count_down();
  while (first_stolen.load() == 0) std::this_thread::sleep_for(50us);
  EXPECT_TRUE(first_stolen.load() == 3 || first_stolen.load() == 4)
      << "the thief first ran job " << first_stolen.load() << ", of the newer backlog";
  release.count_down();
  pool.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  expect_balanced(pool, jobs.size());
}

// The sibling is asleep with nothing to watch when a worker takes a batch (one chain) whose
// first item blocks: taking the batch wakes it, and it takes part of the batch while the first
// item still blocks. (This replaced a test of lending, where a slow batch was shared only after
// its slow item had finished; an item that never finishes held the rest for ever.)
TEST_F(ReaperPoolTest, ABatchStartedWhileASiblingSleepsReachesItWhileTheFirstItemBlocks) {
  auto batch = make_jobs(40);  // item 0 blocks
  std::latch release(1);
  std::atomic<bool> started{false};
  job_pool pool(first_item_blocks(release, started), pool_options(2, /*steal=*/true, 1ms));
  const std::size_t holder = pool.this_thread_worker();
  const std::size_t sibling = 1 - holder;
  wait_until_asleep(worker_tid(sibling));  // nothing anywhere: asleep without a time limit
  teardown::llist_chain<job, &job::hook> chain;
  for (job& j : batch) chain.push_front(j);  // front = newest: job 0 is the oldest
  pool.enqueue_chain(std::move(chain));      // one CAS: the holder takes all 40 in one batch
  wait_until(started);
  const bool all_ran = all_ran_within_30s(batch, 1);
  EXPECT_TRUE(all_ran) << ran_exactly_once(batch) << " of 39 items ran while item 0 blocked";
  EXPECT_EQ(batch[0].runs.load(), 0);
  EXPECT_GT(pool.worker_stats(sibling).stolen, 0u) << "worker " << sibling << " took part of the batch";
  release.count_down();
  pool.flush();
  EXPECT_EQ(ran_exactly_once(batch), batch.size());
  expect_balanced(pool, batch.size());
}

// --- flush ---------------------------------------------------------------------------------------

TEST_F(ReaperPoolTest, FlushReturnsOnceEveryItemOnEveryWorkerRanExactlyOnce) {
  auto jobs = make_jobs(1000);
  job_pool pool(counting(), pool_options(3));
  for (job& j : jobs) pool.enqueue_to(j.id, j);
  pool.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  expect_balanced(pool, jobs.size());
}

TEST_F(ReaperPoolTest, FlushOfAnIdlePoolReturns) {
  job_pool pool(counting(), pool_options(2));
  pool.flush();
  EXPECT_TRUE(pool.flush_for(10s));
}

TEST_F(ReaperPoolTest, FlushForReturnsFalseWhileFrozenWithQueuedItems) {
  auto jobs = make_jobs(4);
  job_pool pool(counting(), pool_options(2));
  pool.freeze();
  for (job& j : jobs) pool.enqueue_to(j.id, j);
  EXPECT_FALSE(pool.flush_for(20ms));
  pool.thaw();
  EXPECT_TRUE(pool.flush_for(60s));
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

// --- freeze / thaw -------------------------------------------------------------------------------

TEST_F(ReaperPoolTest, NoFnRunsOnAnyWorkerWhileThePoolIsFrozen) {
  auto jobs = make_jobs(400);
  job_pool pool(counting(), pool_options(4));
  pool.freeze();
  std::vector<std::thread> producers;
  for (std::size_t p = 0; p < 4; ++p) {
    producers.emplace_back([&, p] {
      for (std::size_t i = p; i < jobs.size(); i += 4) pool.enqueue_to(i, jobs[i]);
    });
  }
  for (std::thread& t : producers) t.join();
  std::this_thread::sleep_for(20ms);  // a chance for a worker or a thief to run something
  EXPECT_EQ(total_runs(jobs), 0);
  pool.thaw();
  pool.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

// A worker in the middle of a batch: the pool's freeze returns once it parked, and the rest of
// its batch is back on its queue, where reap_on_caller (across the pool) reaches it.
TEST_F(ReaperPoolTest, FreezeWaitsForAWorkerMidBatchAndReapOnCallerReachesEverythingNotStarted) {
  auto batch = make_jobs(30);
  auto others = make_jobs(10);
  for (job& j : others) j.id += 1000;  // not item 0
  std::latch release(1);
  std::atomic<bool> started{false};
  job_pool pool(first_item_blocks(release, started), pool_options(2, /*steal=*/false));
  pool.freeze();
  for (job& j : batch) pool.enqueue_to(0, j);
  pool.thaw();
  wait_until(started);
  std::atomic<bool> frozen{false};
  std::atomic<pid_t> freezer_tid{0};
  std::thread freezer([&] {
    freezer_tid.store(current_tid());
    pool.freeze();
    frozen.store(true);
  });
  while (freezer_tid.load() == 0) std::this_thread::yield();
  wait_until_asleep(freezer_tid.load());  // in freeze(), waiting for worker 0 to park
  EXPECT_FALSE(frozen.load());
  release.count_down();
  freezer.join();
  for (job& j : others) pool.enqueue_to(1, j);
  std::size_t offered = 0;
  const std::size_t torn_down = pool.reap_on_caller([&](job&) {
    ++offered;
    return true;
  });
  EXPECT_EQ(torn_down, batch.size() - 1 + others.size()) << "all but item 0, which ran before the freeze";
  EXPECT_EQ(offered, torn_down);
  EXPECT_EQ(ran_exactly_once(batch), batch.size());
  EXPECT_EQ(ran_exactly_once(others), others.size());
  EXPECT_EQ(pool.stats().inline_reaped, torn_down);
  pool.thaw();
  pool.flush();
  expect_balanced(pool, batch.size() + others.size());
}

TEST_F(ReaperPoolTest, FreezesNestAndTheWorkersResumeOnlyAfterTheLastThaw) {
  auto jobs = make_jobs(8);
  job_pool pool(counting(), pool_options(2));
  pool.freeze();
  pool.freeze();
  for (job& j : jobs) pool.enqueue_to(j.id, j);
  pool.thaw();
  EXPECT_FALSE(pool.flush_for(20ms));
  EXPECT_EQ(total_runs(jobs), 0);
  pool.thaw();
  pool.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

TEST_F(ReaperPoolTest, ThawWithoutFreezeThrowsLogicErrorAndChangesNothing) {
  auto jobs = make_jobs(8);
  job_pool pool(counting(), pool_options(2));
  EXPECT_THROW(pool.thaw(), std::logic_error);
  pool.freeze();
  pool.thaw();
  EXPECT_THROW(pool.thaw(), std::logic_error);
  for (job& j : jobs) pool.enqueue_to(j.id, j);
  pool.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

// --- stop and the destructor -------------------------------------------------------------------

TEST_F(ReaperPoolTest, StopDrainsEveryWorkersBacklogEvenWhileFrozen) {
  auto jobs = make_jobs(300);
  job_pool pool(counting(), pool_options(3));
  pool.freeze();
  for (job& j : jobs) pool.enqueue_to(j.id, j);
  pool.stop();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  EXPECT_FALSE(pool.stats().running);
  EXPECT_EQ(pool.stats().pending, 0u);
}

TEST_F(ReaperPoolTest, StopIsIdempotentAndAfterItEnqueueRunsFnOnTheCaller) {
  auto jobs = make_jobs(4);
  std::atomic<pid_t> ran_on{0};
  job_pool pool(
      [&](job& j) {
        ran_on.store(current_tid());
        j.runs.fetch_add(1);
      },
      pool_options(2));
  pool.stop();
  pool.stop();
  for (job& j : jobs) {
    pool.enqueue(j);
    EXPECT_EQ(j.runs.load(), 1) << "torn down before enqueue returned";
    EXPECT_EQ(ran_on.load(), current_tid());
  }
  pool.flush();
  pool.freeze();
  pool.thaw();
  EXPECT_EQ(pool.stats().inline_reaped, jobs.size());
}

TEST_F(ReaperPoolTest, DestructorDrainsEveryWorkersBacklog) {
  auto jobs = make_jobs(200);
  {
    job_pool pool(counting(), pool_options(4));
    pool.freeze();
    for (job& j : jobs) pool.enqueue_to(j.id, j);
  }
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

// --- fn's errors and calls from fn -------------------------------------------------------------

TEST_F(ReaperPoolTest, ThrowingFnIsCountedHandedToOnErrorAndTheRestStillRuns) {
  auto jobs = make_jobs(200);
  std::atomic<int> handed{0};
  reaper_pool_options opts = pool_options(3);
  opts.worker.on_error = [&](std::exception_ptr error) {
    try {
      std::rethrow_exception(error);
    } catch (const std::runtime_error&) {
      handed.fetch_add(1);
    }
  };
  job_pool pool(
      [](job& j) {
        j.runs.fetch_add(1);
        if (j.id % 2 == 1) throw std::runtime_error("odd");
      },
      std::move(opts));
  for (job& j : jobs) pool.enqueue_to(j.id % 7, j);
  pool.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  EXPECT_EQ(pool.stats().errors, jobs.size() / 2);
  EXPECT_EQ(handed.load(), static_cast<int>(jobs.size() / 2));
  expect_balanced(pool, jobs.size());
}

TEST_F(ReaperPoolTest, FlushFreezeStopAndReapOnCallerFromFnAreRefusedWithLogicError) {
  auto jobs = make_jobs(1);
  std::atomic<job_pool*> self{nullptr};
  std::atomic<int> refused{0};
  job_pool pool(
      [&](job& j) {
        job_pool& p = *self.load();
        const auto expect_refused = [&](auto&& call) {
          try {
            call();
          } catch (const std::logic_error&) {
            refused.fetch_add(1);
          }
        };
        expect_refused([&] { p.flush(); });
        expect_refused([&] { (void)p.flush_for(1s); });
        expect_refused([&] { p.freeze(); });
        expect_refused([&] { p.stop(); });
        expect_refused([&] { (void)p.reap_on_caller([](job&) { return true; }); });
        j.runs.fetch_add(1);
      },
      pool_options(2));
  self.store(&pool);
  pool.enqueue_to(1, jobs[0]);
  pool.flush();
  EXPECT_EQ(refused.load(), 5);
  EXPECT_EQ(ran_exactly_once(jobs), 1u);
}

// --- options, placement, names, CPUs -----------------------------------------------------------

TEST_F(ReaperPoolTest, BadOptionsAreRejectedWithInvalidArgumentAndNothingIsCreated) {
  const std::size_t threads_before = live_threads();
  std::atomic<int> calls{0};
  const job_fn fn = [&](job&) { calls.fetch_add(1); };
  EXPECT_THROW((void)job_pool(fn, pool_options(job_pool::max_workers + 1)), std::invalid_argument);
  EXPECT_THROW((void)job_pool(fn, pool_options(1'000'000)), std::invalid_argument);
  reaper_pool_options bad_cpu = pool_options(2);
  bad_cpu.worker.cpus = {0, -1};
  EXPECT_THROW((void)job_pool(fn, bad_cpu), std::invalid_argument);
  bad_cpu.worker.cpus = {CPU_SETSIZE};
  EXPECT_THROW((void)job_pool(fn, bad_cpu), std::invalid_argument);
  EXPECT_THROW((void)job_pool(fn, pool_options(2, true, -1ns)), std::invalid_argument);
  EXPECT_EQ(live_threads(), threads_before) << "no worker was started";
  EXPECT_EQ(calls.load(), 0);
}

// A pool's workers are threads: a driven worker (run by the program) would be one that nothing
// runs. Refused for every pool shape, a lone worker and a pool that does not steal included, and
// for what it is (not for the CPUs the pool's placement gave the worker, nor accepted where the
// placement gives none).
TEST_F(ReaperPoolTest, ADrivenWorkerIsRefusedWhateverThePoolsShape) {
  const std::size_t threads_before = live_threads();
  const job_fn fn = [](job&) {};
  for (const auto& [workers, steal] : {std::pair{std::size_t{1}, true}, std::pair{std::size_t{1}, false},
                                        std::pair{std::size_t{2}, false}, std::pair{std::size_t{2}, true}}) {
    reaper_pool_options opts = pool_options(workers, steal);
    opts.worker.driven = true;
    try {
      job_pool pool(fn, opts);
      ADD_FAILURE() << "a pool of " << workers << " workers (steal " << steal << ") took a driven worker";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("reaper_pool: worker.driven"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(live_threads(), threads_before) << "no worker was started";
}

// The NUMA nodes that have a CPU this process may use, read from sysfs here independently.
std::size_t usable_numa_nodes() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return 1;
  std::size_t nodes = 0;
  for (int node = 0; node < 4096; ++node) {
    const std::string path = "/sys/devices/system/node/node" + std::to_string(node) + "/cpulist";
    if (!std::filesystem::exists(path)) continue;
    for (int cpu : teardown::detail::parse_cpu_list(read_text(path))) {
      if (cpu < CPU_SETSIZE && CPU_ISSET(cpu, &allowed)) {
        ++nodes;
        break;
      }
    }
  }
  return std::max<std::size_t>(nodes, 1);
}

TEST_F(ReaperPoolTest, DefaultIsOneWorkerPerNumaNode) {
  job_pool pool(counting());
  EXPECT_EQ(pool.worker_count(), usable_numa_nodes());
  auto jobs = make_jobs(100);
  for (job& j : jobs) pool.enqueue(j);
  pool.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

TEST_F(ReaperPoolTest, ExplicitWorkersSplitTheGivenCpusIntoContiguousGroups) {
  reaper_pool_options opts = pool_options(2);
  opts.worker.cpus = {3, 1, 2, 0, 1};  // sorted and deduplicated first
  job_pool two(counting(), opts);
  EXPECT_EQ(two.worker_cpus(0), (std::vector<int>{0, 1}));
  EXPECT_EQ(two.worker_cpus(1), (std::vector<int>{2, 3}));
  opts.workers = 3;
  opts.worker.cpus = {0, 1};
  job_pool three(counting(), opts);
  EXPECT_EQ(three.worker_cpus(0), (std::vector<int>{0}));
  EXPECT_EQ(three.worker_cpus(1), (std::vector<int>{1}));
  EXPECT_EQ(three.worker_cpus(2), (std::vector<int>{0}));
  EXPECT_THROW((void)three.worker_cpus(3), std::out_of_range);
  EXPECT_THROW((void)three.worker_stats(3), std::out_of_range);
}

TEST_F(ReaperPoolTest, EachWorkerRunsOnItsOwnCpuGroup) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "needs two CPUs";
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE && cpus.size() < 2; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) cpus.push_back(cpu);
  }
  if (cpus.size() < 2) GTEST_SKIP() << "needs two allowed CPUs";
  reaper_pool_options opts = pool_options(2, /*steal=*/false);
  opts.worker.cpus = cpus;
  std::vector<std::atomic<int>> seen_cpu(2);
  auto jobs = make_jobs(2);
  job_pool pool(
      [&](job& j) {
        cpu_set_t mine;
        CPU_ZERO(&mine);
        int only = -1;
        if (sched_getaffinity(0, sizeof mine, &mine) == 0 && CPU_COUNT(&mine) == 1) {
          for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
            if (CPU_ISSET(cpu, &mine)) only = cpu;
          }
        }
        seen_cpu[j.id].store(only);
        j.runs.fetch_add(1);
      },
      opts);
  pool.enqueue_to(0, jobs[0]);
  pool.enqueue_to(1, jobs[1]);
  pool.flush();
  EXPECT_EQ(seen_cpu[0].load(), cpus[0]);
  EXPECT_EQ(seen_cpu[1].load(), cpus[1]);
  EXPECT_EQ(pool.stats().setup_warnings & teardown::setup_warning_affinity, 0u);
}

TEST_F(ReaperPoolTest, WorkersAreNamedWithTheirIndexWithinLinuxsFifteenCharacters) {
  reaper_pool_options opts = pool_options(2);
  opts.worker.name = "poolname";
  job_pool named(counting(), opts);
  opts.worker.name = "averyverylongpoolname";
  job_pool cut(counting(), opts);
  named.flush();  // each worker named itself before its first pass
  cut.flush();
  const std::set<std::string> names = thread_names();
  EXPECT_TRUE(names.count("poolname-0") && names.count("poolname-1"));
  EXPECT_TRUE(names.count("averyverylong-0") && names.count("averyverylong-1"));
}

TEST_F(ReaperPoolTest, AThreadAlwaysEnqueuesToTheSameWorker) {
  job_pool pool(counting(), pool_options(4));
  std::vector<std::thread> threads;
  std::atomic<int> unstable{0};
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&] {
      const std::size_t first = pool.this_thread_worker();
      if (first >= pool.worker_count()) unstable.fetch_add(1);
      for (int i = 0; i < 100; ++i) {
        if (pool.this_thread_worker() != first) unstable.fetch_add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(unstable.load(), 0);
}

TEST_F(ReaperPoolTest, EnqueueChainGoesToThisThreadsWorkerWhole) {
  auto jobs = make_jobs(64);
  job_pool pool(counting(), pool_options(2, /*steal=*/false));
  teardown::llist_chain<job, &job::hook> chain;
  for (job& j : jobs) chain.push_back(j);
  pool.enqueue_chain(std::move(chain));
  pool.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  EXPECT_EQ(pool.worker_stats(pool.this_thread_worker()).enqueued, jobs.size());
}

TEST_F(ReaperPoolTest, SplitCpusMakesContiguousNearlyEqualGroups) {
  using teardown::detail::split_cpus;
  EXPECT_EQ(split_cpus({0, 1, 2, 3, 4}, 2), (std::vector<std::vector<int>>{{0, 1}, {2, 3, 4}}));
  EXPECT_EQ(split_cpus({0, 1, 2, 3}, 4), (std::vector<std::vector<int>>{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(split_cpus({4, 8}, 3), (std::vector<std::vector<int>>{{4}, {8}, {4}}));
  EXPECT_EQ(split_cpus({}, 2), (std::vector<std::vector<int>>{{}, {}}));
}

// A fake /sys/devices/system/node: node 1 has memory but no CPU, node 2 a split list.
TEST_F(ReaperPoolTest, NumaNodesAreReadFromSysfsAndEachGetsItsUsableCpus) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("teardown_numa_" + std::to_string(getpid()));
  fs::remove_all(root);
  const auto write = [&](const fs::path& path, const std::string& text) {
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text << "\n";
  };
  write(root / "online", "0-2");
  write(root / "node0" / "cpulist", "0-3");
  write(root / "node1" / "cpulist", "");
  write(root / "node2" / "cpulist", "4-7,12");
  using teardown::detail::numa_node_cpus;
  using teardown::detail::plan_worker_cpus;
  const auto nodes = numa_node_cpus(root.string());
  EXPECT_EQ(nodes, (std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7, 12}}));
  // Only housekeeping CPUs 1, 2, 5 and 12 are usable: two workers, one per node.
  EXPECT_EQ(plan_worker_cpus(0, nodes, {1, 2, 5, 12}), (std::vector<std::vector<int>>{{1, 2}, {5, 12}}));
  // A node without a usable CPU gets no worker.
  EXPECT_EQ(plan_worker_cpus(0, nodes, {1, 2}), (std::vector<std::vector<int>>{{1, 2}}));
  // No NUMA information: one worker on the base CPUs.
  EXPECT_EQ(numa_node_cpus((root / "missing").string()), (std::vector<std::vector<int>>{}));
  EXPECT_EQ(plan_worker_cpus(0, {}, {0, 1}), (std::vector<std::vector<int>>{{0, 1}}));
  EXPECT_EQ(plan_worker_cpus(2, nodes, {0, 1, 2, 3}), (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  write(root / "online", "0-");  // malformed: as if there were no NUMA information
  EXPECT_EQ(numa_node_cpus(root.string()), (std::vector<std::vector<int>>{}));
  fs::remove_all(root);
}

// --- reaper over a sharded_llist -----------------------------------------------------------------

TEST_F(ReaperPoolTest, ReaperOverAShardedQueueTearsDownEveryItemOfManyProducersOnce) {
  constexpr std::size_t producers = 8;
  const std::size_t per_producer = scaled(10'000);
  auto jobs = make_jobs(producers * per_producer);
  sharded_reaper reaper(counting());
  std::latch go(producers);
  std::vector<std::thread> threads;
  for (std::size_t p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      go.arrive_and_wait();
      for (std::size_t i = 0; i < per_producer; ++i) {
        reaper.enqueue(jobs[p * per_producer + i]);
        if (i % 1000 == 999) reaper.flush();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  EXPECT_EQ(reaper.stats().enqueued, jobs.size());
  EXPECT_EQ(reaper.stats().reaped, jobs.size());
}

TEST_F(ReaperPoolTest, ReaperOverAShardedQueueFrozenMidBatchHandsTheRestBackToReapOnCaller) {
  auto batch = make_jobs(25);
  std::latch release(1);
  std::atomic<bool> started{false};
  sharded_reaper reaper(first_item_blocks(release, started));
  reaper.freeze();
  for (job& j : batch) reaper.enqueue(j);
  reaper.thaw();
  wait_until(started);
  std::atomic<pid_t> freezer_tid{0};
  std::thread freezer([&] {
    freezer_tid.store(current_tid());
    reaper.freeze();
  });
  while (freezer_tid.load() == 0) std::this_thread::yield();
  wait_until_asleep(freezer_tid.load());  // in freeze(), waiting for the item in flight
  release.count_down();
  freezer.join();
  EXPECT_EQ(reaper.reap_on_caller([](job&) { return true; }), batch.size() - 1);
  EXPECT_EQ(ran_exactly_once(batch), batch.size());
  reaper.thaw();
  reaper.flush();
}

TEST_F(ReaperPoolTest, ReaperOverAShardedQueueWakesForEveryItemEnqueuedIntoAnEmptyQueue) {
  // Ping-pong: each item alone, each flushed: a lost wake-up would hang here.
  auto jobs = make_jobs(scaled(2'000));
  sharded_reaper reaper(counting(), {.spin_polls = 0});
  for (job& j : jobs) {
    reaper.enqueue(j);
    while (j.runs.load() == 0) std::this_thread::yield();
  }
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

// --- fork ------------------------------------------------------------------------------------------

TEST_F(ReaperPoolTest, ForkChildEnqueuesInlineTearsDownTheBacklogAndStopsWithoutDeadlock) {
  auto backlog = make_jobs(60);
  auto child_jobs = make_jobs(20);
  job_pool pool(counting(), pool_options(3));
  pool.freeze();
  for (job& j : backlog) pool.enqueue_to(j.id, j);  // queued on every worker at fork time
  const int code = run_child([&] {
    child_checks check;
    for (job& j : child_jobs) {
      pool.enqueue(j);
      check.expect(j.runs.load() == 1, "an item the child enqueues is torn down before enqueue returns");
    }
    pool.flush();
    check.expect(ran_exactly_once(backlog) == backlog.size(), "the child tore down the backlog once");
    pool.freeze();
    pool.thaw();
    pool.stop();
    check.expect(!pool.stats().running, "no worker in the child");
    return check.exit_code();
  });
  EXPECT_EQ(code, child_ok);
  EXPECT_EQ(total_runs(backlog), 0) << "the parent's copies wait for thaw";
  pool.thaw();
  pool.flush();
  EXPECT_EQ(ran_exactly_once(backlog), backlog.size());
  auto after = make_jobs(100);
  for (job& j : after) pool.enqueue_to(j.id, j);
  pool.flush();
  EXPECT_EQ(ran_exactly_once(after), after.size()) << "the parent's pool still works";
}

// Forks while other threads flush (taking the steal mutex), enqueue (skewed, so that thieves
// steal) and freeze: each child flushes, enqueues and stops; none may deadlock.
TEST_F(ReaperPoolTest, ForkWhileOtherThreadsFlushStealAndFreezeLeavesAUsableChild) {
  const std::size_t per_round = scaled(2'000);
  constexpr int forks = 8;
  auto jobs = make_jobs(per_round * forks);
  job_pool pool(counting(), pool_options(3));
  std::atomic<bool> done{false};
  std::atomic<std::size_t> produced{0};
  std::thread producer([&] {
    for (job& j : jobs) {
      pool.enqueue_to(0, j);
      produced.fetch_add(1);
    }
  });
  std::thread flusher([&] {
    while (!done.load()) pool.flush();
  });
  std::thread freezer([&] {
    while (!done.load()) {
      pool.freeze();
      pool.thaw();
    }
  });
  for (int f = 0; f < forks; ++f) {
    while (produced.load() < per_round * static_cast<std::size_t>(f)) std::this_thread::yield();
    auto child_jobs = make_jobs(10);
    const int code = run_child([&] {
      child_checks check;
      pool.flush();
      for (job& j : child_jobs) pool.enqueue(j);
      pool.flush();
      check.expect(ran_exactly_once(child_jobs) == child_jobs.size(), "the child's items ran once");
      pool.stop();
      return check.exit_code();
    });
    EXPECT_EQ(code, child_ok) << "fork " << f;
  }
  producer.join();
  done.store(true);
  flusher.join();
  freezer.join();
  pool.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  expect_balanced(pool, jobs.size());
}

// --- stop_for: shutdown with a deadline ---------------------------------------------------------

TEST_F(ReaperPoolTest, StopForWithNothingBlockingDrainsEveryWorkerAndReturnsTrue) {
  auto jobs = make_jobs(300);
  job_pool pool(counting(), pool_options(3));
  pool.freeze();
  for (job& j : jobs) pool.enqueue_to(j.id, j);
  EXPECT_TRUE(pool.stop_for(30s));  // a liveness bound, not a time assertion
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  EXPECT_FALSE(pool.stats().running);
  EXPECT_EQ(pool.stats().pending, 0u);
}

// Worker 0 is stuck in a teardown: stop_for gives up, worker 1 still drains and ends, the rest
// stays counted, and a later stop finishes it, each item once.
TEST_F(ReaperPoolTest, StopForReturnsFalseWhileOneWorkerBlocksAndTheRestIsFinishedLater) {
  auto stuck = make_jobs(10);  // worker 0; item 0 blocks
  auto free_running = make_jobs(50);
  for (job& j : free_running) j.id += 1000;  // never the blocking id
  std::latch release(1);
  std::atomic<bool> started{false};
  job_pool pool(first_item_blocks(release, started), pool_options(2, /*steal=*/false));
  pool.freeze();
  for (job& j : stuck) pool.enqueue_to(0, j);
  for (job& j : free_running) pool.enqueue_to(1, j);
  pool.thaw();
  wait_until(started);
  EXPECT_FALSE(pool.stop_for(20ms));
  // The other worker drains and ends on its own. Its running flag drops as its final drain
  // begins, before that drain is done: wait for both (30 s: a liveness bound).
  const auto worker_1_done = [&] {
    const teardown::reaper_stats s = pool.worker_stats(1);
    return s.reaped == free_running.size() && !s.running;
  };
  EXPECT_TRUE(eventually(worker_1_done, 30s)) << "worker 1 did not drain its 50 items and end within 30 s";
  EXPECT_EQ(ran_exactly_once(free_running), free_running.size());
  EXPECT_EQ(total_runs(stuck), 0);
  EXPECT_EQ(pool.stats().pending, stuck.size());
  release.count_down();
  pool.stop();
  EXPECT_EQ(ran_exactly_once(stuck), stuck.size());
  EXPECT_EQ(pool.stats().pending, 0u);
}

TEST_F(ReaperPoolTest, EnqueueAndFlushAfterATimedOutStopForLoseNothing) {
  auto stuck = make_jobs(10);
  auto later = make_jobs(20);
  for (job& j : later) j.id += 1000;
  std::latch release(1);
  std::atomic<bool> started{false};
  job_pool pool(first_item_blocks(release, started), pool_options(2, /*steal=*/false));
  pool.freeze();
  for (job& j : stuck) pool.enqueue_to(0, j);
  pool.thaw();
  wait_until(started);
  ASSERT_FALSE(pool.stop_for(1ms));
  for (job& j : later) pool.enqueue_to(j.id, j);  // worker 0: queued behind the blocker; worker 1: inline
  EXPECT_FALSE(pool.flush_for(1ms));
  release.count_down();
  pool.flush();
  EXPECT_EQ(ran_exactly_once(stuck), stuck.size());
  EXPECT_EQ(ran_exactly_once(later), later.size());
  EXPECT_EQ(pool.stats().pending, 0u);
}

TEST_F(ReaperPoolTest, StopForCalledFromFnIsRefusedWithLogicError) {
  std::atomic<bool> refused{false};
  job_pool* self = nullptr;
  job_pool pool(
      [&](job& j) {
        try {
          (void)self->stop_for(1s);
        } catch (const std::logic_error& e) {
          refused.store(std::string(e.what()).find("teardown::reaper_pool::stop_for") != std::string::npos);
        }
        j.runs.fetch_add(1);
      },
      pool_options(2));
  self = &pool;
  job j;
  pool.enqueue(j);
  pool.flush();
  EXPECT_TRUE(refused.load());
}

// --- Destroying the pool from its own callback: a clear abort, never a use-after-free ----------

[[noreturn]] void wait_for_the_abort() {
  for (int i = 0; i < 10'000; ++i) std::this_thread::sleep_for(1ms);
  std::_Exit(0);  // no abort: the death test reports "did not die"
}

class ReaperPoolDeathTest : public ReaperPoolTest {
 protected:
  void SetUp() override {
    GTEST_FLAG_SET(death_test_style, "threadsafe");  // other threads exist: re-execute
#if !GTEST_HAS_DEATH_TEST
    GTEST_SKIP() << "this platform has no death tests";
#endif
  }
};

TEST_F(ReaperPoolDeathTest, DestroyingThePoolFromFnOnAWorkerAbortsWithAMessage) {
  EXPECT_DEATH(
      {
        static job j;
        job_pool* pool = nullptr;
        pool = new job_pool([&pool](job&) { delete pool; }, pool_options(2));
        pool->enqueue(j);
        wait_for_the_abort();
      },
      "teardown::reaper_pool::~reaper_pool: the pool is destroyed from one of its own workers");
}

TEST_F(ReaperPoolDeathTest, DestroyingThePoolFromTakeInsideReapOnCallerAbortsWithAMessage) {
  EXPECT_DEATH(
      {
        static job j;
        auto* pool = new job_pool(counting(), pool_options(2));
        pool->freeze();
        pool->enqueue_to(1, j);
        (void)pool->reap_on_caller([&](job&) {
          delete pool;
          return false;
        });
        wait_for_the_abort();
      },
      "teardown::reaper_pool::~reaper_pool: the pool is destroyed from take or fn inside its own reap_on_caller");
}

}  // namespace
}  // namespace teardown_test

namespace teardown_test {
namespace {

// --- An item enqueued twice --------------------------------------------------------------------

TEST_F(ReaperPoolDeathTest, EnqueueOfAnItemStillQueuedAbortsWithAMessage) {
  for (bool steal : {false, true}) {
    auto jobs = make_jobs(1);
    job_pool pool(counting(), pool_options(2, steal));
    pool.freeze();  // the item stays queued
    pool.enqueue_to(0, jobs[0]);
    EXPECT_DEATH(pool.enqueue(jobs[0]),
                 "teardown::reaper_pool::enqueue: the item is already queued \\(element type .*job\\)");
    EXPECT_DEATH(pool.enqueue_to(1, jobs[0]), "teardown::reaper_pool::enqueue: the item is already queued");
    pool.thaw();
    pool.flush();
    EXPECT_EQ(jobs[0].runs.load(), 1);
  }
}

// --- Options -----------------------------------------------------------------------------------

TEST_F(ReaperPoolTest, InvalidWorkerOptionsAreRefusedNamingTheFieldBeforeAnyThreadStarts) {
  const std::size_t threads_before = live_threads();
  std::atomic<int> calls{0};
  const job_fn fn = [&](job&) { calls.fetch_add(1); };
  const auto refused_field = [&](const teardown::reaper_options& worker) -> std::string {
    reaper_pool_options opts = pool_options(2);
    opts.worker = worker;
    try {
      job_pool pool(fn, opts);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "accepted";
  };
  EXPECT_NE(refused_field({.nice = 20}).find("teardown::reaper_pool: worker.nice"), std::string::npos);
  EXPECT_NE(refused_field({.nice = -21}).find("teardown::reaper_pool: worker.nice"), std::string::npos);
  EXPECT_NE(refused_field({.stall_threshold = -1ns}).find("teardown::reaper_pool: worker.stall_threshold"),
            std::string::npos);
  EXPECT_NE(refused_field({.yield_after = -1ns}).find("teardown::reaper_pool: worker.yield_after"), std::string::npos);
  EXPECT_EQ(live_threads(), threads_before) << "no worker was started";
  EXPECT_EQ(calls.load(), 0);
}

TEST_F(ReaperPoolTest, StatsSumTheWorkersYields) {
  auto jobs = make_jobs(100);
  reaper_pool_options opts = pool_options(2, /*steal=*/false);
  opts.worker.yield_after = 1ns;
  job_pool pool(counting(), opts);
  for (std::size_t i = 0; i < jobs.size(); ++i) pool.enqueue_to(i, jobs[i]);
  pool.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  EXPECT_EQ(pool.stats().yields, pool.worker_stats(0).yields + pool.worker_stats(1).yields);
  EXPECT_GT(pool.worker_stats(0).yields, 0u);
  EXPECT_GT(pool.worker_stats(1).yields, 0u);
}

}  // namespace
}  // namespace teardown_test
