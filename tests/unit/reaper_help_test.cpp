// Waiters help (reaper.hpp, "Waiters help"): a flush or stop that has waited boost_after while no
// raise is in force tears queued items down on its own thread, and asks the worker for the
// unstarted half of the batch it holds; every item still runs exactly once, the flush still
// returns only once everything enqueued before it is torn down, stats().helped counts the items
// and a "help" boost event names the helping thread. The worker here runs at nice 0, the
// waiter's own, so no raise can be in force, as for an ordinary user whose worker keeps its
// creator's nice. Gates, not sleeps, decide who runs what; no test asserts a duration.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <latch>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "teardown/reaper.hpp"
#include "teardown/reaper_pool.hpp"
#include "teardown/trace.hpp"

#include "reaper_test_support.hpp"
#include "test_support.hpp"

namespace teardown_test {
namespace {

using namespace reaper_support;
using namespace std::chrono_literals;
using teardown::reaper_options;

// A job that says which thread tore it down.
struct traced_job {
  llist_node hook;
  std::size_t id = 0;
  std::atomic<int> runs{0};
  std::atomic<pid_t> ran_on{0};
};

using traced_fn = std::function<void(traced_job&)>;
using traced_reaper = teardown::reaper<traced_job, &traced_job::hook, traced_fn>;

reaper_options helping_options(std::uint64_t domain = 0) {
  return {.name = "help_test", .nice = 0, .boost_after = 1ms, .trace_domain = domain};
}

// fn: item 0 reports `started` and blocks until `release`; every item records its thread.
traced_fn first_blocks(std::latch& release, std::atomic<bool>& started) {
  return [&release, &started](traced_job& j) {
    if (j.id == 0) {
      started.store(true);
      release.wait();
    }
    j.ran_on.store(current_tid(), std::memory_order_relaxed);
    j.runs.fetch_add(1, std::memory_order_relaxed);
  };
}

std::size_t exactly_once(const std::vector<traced_job>& jobs) {
  std::size_t once = 0;
  for (const traced_job& j : jobs) once += j.runs.load() == 1 ? 1 : 0;
  return once;
}

// The "help" boost events of one trace domain: (helping tid, items it says nothing of).
class help_recorder {
 public:
  explicit help_recorder(std::uint64_t domain) {
    const std::lock_guard lock(mutex_);
    domain_ = domain;
    tids_.clear();
    teardown::trace::add_hook(&record);
  }
  ~help_recorder() { (void)teardown::trace::remove_hook(&record); }
  std::vector<pid_t> tids() const {
    const std::lock_guard lock(mutex_);
    return tids_;
  }

 private:
  static void record(const teardown::trace::boost_event& event) {
    const std::lock_guard lock(mutex_);
    if (event.domain == domain_ && std::string(event.reason) == "help") tids_.push_back(static_cast<pid_t>(event.tid));
  }
  static inline std::mutex mutex_;
  static inline std::uint64_t domain_ = 0;
  static inline std::vector<pid_t> tids_;
};

// The worker is caught in item 0; items 1..8 wait on the queue. A flush waits boost_after, finds
// nothing to raise, and tears the eight down itself; it returns once the worker finishes item 0.
TEST(ReaperHelpTest, AFlushTearsDownWhatIsQueuedWhileTheWorkerIsHeld) {
  hang_guard guard(current_test_name());
  const std::uint64_t domain = teardown::trace::new_domain();
  help_recorder helps(domain);
  std::latch release(1);
  std::atomic<bool> started{false};
  std::vector<traced_job> jobs(9);
  for (std::size_t i = 0; i < jobs.size(); ++i) jobs[i].id = i;
  traced_reaper reaper(first_blocks(release, started), helping_options(domain));
  reaper.enqueue(jobs[0]);
  wait_until(started);
  for (std::size_t i = 1; i < jobs.size(); ++i) reaper.enqueue(jobs[i]);
  std::atomic<pid_t> flusher_tid{0};
  std::atomic<bool> flushed{false};
  std::thread flusher([&] {
    flusher_tid.store(current_tid());
    reaper.flush();
    flushed.store(true);
  });
  ASSERT_TRUE(eventually([&] { return reaper.stats().helped == 8; })) << "the flush never helped";
  EXPECT_FALSE(flushed.load()) << "the flush returned while the worker still held item 0";
  release.count_down();
  flusher.join();
  EXPECT_EQ(exactly_once(jobs), jobs.size());
  for (std::size_t i = 1; i < jobs.size(); ++i) EXPECT_EQ(jobs[i].ran_on.load(), flusher_tid.load()) << "item " << i;
  EXPECT_NE(jobs[0].ran_on.load(), flusher_tid.load());
  const auto stats = reaper.stats();
  EXPECT_EQ(stats.helped, 8u);
  EXPECT_EQ(stats.reaped, 9u);
  EXPECT_FALSE(stats.boosted);
  const std::vector<pid_t> tids = helps.tids();
  ASSERT_FALSE(tids.empty()) << "no help trace event";
  for (pid_t tid : tids) EXPECT_EQ(tid, flusher_tid.load());
}

// The same with waiters_help off: the flush only waits, and a bounded one gives up.
TEST(ReaperHelpTest, WithWaitersHelpOffAFlushOnlyWaits) {
  hang_guard guard(current_test_name());
  std::latch release(1);
  std::atomic<bool> started{false};
  std::vector<traced_job> jobs(5);
  for (std::size_t i = 0; i < jobs.size(); ++i) jobs[i].id = i;
  reaper_options opts = helping_options();
  opts.waiters_help = false;
  traced_reaper reaper(first_blocks(release, started), opts);
  reaper.enqueue(jobs[0]);
  wait_until(started);
  for (std::size_t i = 1; i < jobs.size(); ++i) reaper.enqueue(jobs[i]);
  EXPECT_FALSE(reaper.flush_for(50ms));
  EXPECT_EQ(reaper.stats().helped, 0u);
  EXPECT_EQ(reaper.stats().reaped, 0u);
  release.count_down();
  reaper.flush();
  EXPECT_EQ(exactly_once(jobs), jobs.size());
  EXPECT_EQ(reaper.stats().inline_reaped, 0u);
}

// A bounded flush or stop that helps still gives up at its deadline: it tears down what it
// could take, then, the worker still holding item 0, answers false instead of helping on.
TEST(ReaperHelpTest, AFlushForAndAStopForHelpThenGiveUpAtTheirDeadlineWhileTheWorkerHoldsAnItem) {
  hang_guard guard(current_test_name());
  std::latch release(1);
  std::atomic<bool> started{false};
  std::vector<traced_job> jobs(6);
  for (std::size_t i = 0; i < jobs.size(); ++i) jobs[i].id = i;
  traced_reaper reaper(first_blocks(release, started), helping_options());
  reaper.enqueue(jobs[0]);
  wait_until(started);
  for (std::size_t i = 1; i < 4; ++i) reaper.enqueue(jobs[i]);
  bool released = false;
  const auto release_once = [&] {
    if (!std::exchange(released, true)) release.count_down();
  };
  const auto answer_within = [&](auto bounded_wait) {
    std::atomic<bool> returned{false};
    bool answer = true;
    std::thread waiter([&] {
      answer = bounded_wait();
      returned.store(true);
    });
    const bool in_time = eventually([&] { return returned.load(); }, 20s);
    if (!in_time) release_once();  // lets a waiter that helps on past its deadline end
    waiter.join();
    EXPECT_TRUE(in_time) << "a bounded wait went on helping past its deadline";
    return answer;
  };
  EXPECT_FALSE(answer_within([&] { return reaper.flush_for(1s); }));
  for (std::size_t i = 4; i < jobs.size(); ++i) reaper.enqueue(jobs[i]);
  EXPECT_FALSE(answer_within([&] { return reaper.stop_for(1s); }));
  EXPECT_EQ(reaper.stats().helped, 5u) << "the bounded waits tore down what was queued";
  EXPECT_EQ(jobs[0].runs.load(), 0) << "item 0 is still the worker's";
  release_once();
  reaper.stop();
  EXPECT_EQ(exactly_once(jobs), jobs.size());
}

// A stop (the default domain's exit protocol is one) helps the same way.
TEST(ReaperHelpTest, AStopTearsDownWhatIsQueuedWhileTheWorkerIsHeld) {
  hang_guard guard(current_test_name());
  std::latch release(1);
  std::atomic<bool> started{false};
  std::vector<traced_job> jobs(7);
  for (std::size_t i = 0; i < jobs.size(); ++i) jobs[i].id = i;
  traced_reaper reaper(first_blocks(release, started), helping_options());
  reaper.enqueue(jobs[0]);
  wait_until(started);
  for (std::size_t i = 1; i < jobs.size(); ++i) reaper.enqueue(jobs[i]);
  std::thread stopper([&] { reaper.stop(); });
  ASSERT_TRUE(eventually([&] { return reaper.stats().helped == 6; })) << "the stop never helped";
  release.count_down();
  stopper.join();
  EXPECT_EQ(exactly_once(jobs), jobs.size());
  EXPECT_FALSE(reaper.stats().running);
}

// The worker holds one batch of 9 and is caught in its first item. The flush asks for a share;
// once item 0 ends, the worker hands back the unstarted half, which the flush tears down, while
// the worker's own later items wait (up to a bound) for that help to be seen.
TEST(ReaperHelpTest, AHelperTakesTheUnstartedHalfOfTheWorkersBatch) {
  hang_guard guard(current_test_name());
  std::latch release(1);
  std::atomic<bool> started{false};
  std::vector<traced_job> jobs(9);
  for (std::size_t i = 0; i < jobs.size(); ++i) jobs[i].id = i;
  std::atomic<pid_t> flusher_tid{0};
  std::atomic<std::size_t> on_flusher{0};
  const auto give_up = std::chrono::steady_clock::now() + 20s;
  traced_fn fn = [&](traced_job& j) {
    const bool here_flusher = current_tid() == flusher_tid.load();
    if (j.id == 0) {
      started.store(true);
      release.wait();
    } else if (!here_flusher) {
      // The worker's own items wait for the helper to have taken some: without a share, none.
      while (on_flusher.load() == 0 && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(50us);
    }
    if (here_flusher) on_flusher.fetch_add(1);
    j.ran_on.store(current_tid(), std::memory_order_relaxed);
    j.runs.fetch_add(1, std::memory_order_relaxed);
  };
  traced_reaper reaper(fn, helping_options());
  reaper.freeze();
  for (traced_job& j : jobs) reaper.enqueue(j);
  reaper.thaw();
  wait_until(started);
  std::thread flusher([&] {
    flusher_tid.store(current_tid());
    reaper.flush();
  });
  // Item 0 ends once the flush has waited a few boost_afters (its share request is then in
  // place; if not yet, the worker sees it at its next item's end: slower, the same outcome).
  ASSERT_TRUE(eventually([&] { return flusher_tid.load() != 0; }));
  std::this_thread::sleep_for(30ms);
  release.count_down();
  flusher.join();
  EXPECT_EQ(exactly_once(jobs), jobs.size());
  EXPECT_GE(on_flusher.load(), 1u) << "the worker never handed back any of its batch";
  EXPECT_EQ(reaper.stats().helped, on_flusher.load());
}

// What a helper tore down gets the worker's batch-end work (a composition's allocator trim):
// here the helper's last item waits until the worker has run its own batch's after_batch and
// gone to sleep; the help then asks for one more, which the sleeping worker makes.
TEST(ReaperHelpTest, TheWorkerRunsAfterBatchForWhatAHelperTookDown) {
  hang_guard guard(current_test_name());
  std::latch release(1);
  std::atomic<bool> started{false};
  std::atomic<int> after_batch_calls{0};
  std::atomic<std::size_t> helped_so_far{0};
  std::atomic<pid_t> worker_tid{0};
  std::vector<traced_job> jobs(9);
  for (std::size_t i = 0; i < jobs.size(); ++i) jobs[i].id = i;
  traced_fn fn = [&](traced_job& j) {
    if (j.id == 0) {
      worker_tid.store(current_tid());
      started.store(true);
      release.wait();
    } else if (j.id == jobs.size() - 1) {
      // The flush's last item: the worker has finished its batch and sleeps.
      while (after_batch_calls.load() == 0) std::this_thread::sleep_for(50us);
      wait_until_asleep(worker_tid.load());
    } else {
      helped_so_far.fetch_add(1);
    }
    j.runs.fetch_add(1, std::memory_order_relaxed);
  };
  reaper_options opts = helping_options();
  opts.after_batch = [&] { after_batch_calls.fetch_add(1); };
  traced_reaper reaper(fn, opts);
  reaper.enqueue(jobs[0]);
  wait_until(started);
  for (std::size_t i = 1; i < jobs.size(); ++i) reaper.enqueue(jobs[i]);
  std::thread flusher([&] { reaper.flush(); });
  ASSERT_TRUE(eventually([&] { return helped_so_far.load() == jobs.size() - 2; })) << "the flush never helped";
  release.count_down();  // the worker ends its batch: after_batch once, then sleeps
  flusher.join();
  EXPECT_EQ(exactly_once(jobs), jobs.size());
  EXPECT_EQ(reaper.stats().helped, jobs.size() - 1);
  EXPECT_TRUE(eventually([&] { return after_batch_calls.load() == 2; }, 20s))
      << "after_batch ran " << after_batch_calls.load() << " time(s): not for what the helper tore down";
}

// In a pool every worker's flush helps with its own queue.
TEST(ReaperHelpTest, APoolFlushHelpsEachWorker) {
  hang_guard guard(current_test_name());
  std::latch release(1);
  std::atomic<bool> started{false};
  std::vector<traced_job> jobs(6);
  for (std::size_t i = 0; i < jobs.size(); ++i) jobs[i].id = i;
  using pool_type = teardown::reaper_pool<traced_job, &traced_job::hook, traced_fn>;
  pool_type pool(first_blocks(release, started), {.workers = 1, .worker = helping_options()});
  pool.enqueue(jobs[0]);
  wait_until(started);
  for (std::size_t i = 1; i < jobs.size(); ++i) pool.enqueue(jobs[i]);
  std::thread flusher([&] { pool.flush(); });
  ASSERT_TRUE(eventually([&] { return pool.stats().helped == 5; })) << "the pool's flush never helped";
  release.count_down();
  flusher.join();
  EXPECT_EQ(exactly_once(jobs), jobs.size());
}

}  // namespace
}  // namespace teardown_test
