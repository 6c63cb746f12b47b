// The reaper's wake policy (reaper_options::poll_interval, reaper.hpp "Wake policy"): with a
// poll interval, producers never wake the worker (no futex wake on the enqueue path), every item
// still runs, and the control plane (flush, freeze, stop, fork) wakes the worker at once instead
// of waiting for its next look. Lazy polling (poll_interval_max): idle looks back off and work
// brings them back; hurry() (a reaper's, a pool's, a fork's, async_teardown's past its mark, on
// a refused charge or a lowered cap) wakes the worker at once. The tests assert behaviour:
// counts, and that a call returns at all (bounded by a hang guard), never how long anything took.
#include <gtest/gtest.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cstddef>
#include <filesystem>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "teardown/async_teardown.hpp"
#include "teardown/model/mm.hpp"
#include "teardown/reaper.hpp"
#include "teardown/reaper_pool.hpp"

#include "fork_test_support.hpp"
#include "reaper_test_support.hpp"
#include "test_support.hpp"

namespace teardown_test {
namespace {

using namespace reaper_support;
using namespace std::chrono_literals;
using teardown::reaper_options;

std::size_t live_threads() {
  return static_cast<std::size_t>(std::distance(std::filesystem::directory_iterator("/proc/self/task"),
                                                std::filesystem::directory_iterator()));
}

// Enqueues `jobs` one at a time, each once the worker is asleep in futex() (its spin is off), so
// that every enqueue finds the queue empty and the worker sleeping: the case where a producer
// of the default policy makes its futex wake.
void enqueue_each_into_a_sleeping_worker(job_reaper& reaper, pid_t worker, std::vector<job>& jobs) {
  for (job& j : jobs) {
    wait_until_asleep(worker);
    reaper.enqueue(j);
    ASSERT_TRUE(eventually([&] { return j.runs.load() == 1; })) << "item " << j.id << " never ran";
  }
}

TEST(ReaperPollTest, DefaultPolicyWakesASleepingWorkerFromTheProducer) {
  // The control for the next test: the same steps with poll_interval 0 count one wake each.
  const hang_guard guard(current_test_name());
  auto jobs = make_jobs(5);  // outlives the reaper: the worker's last writes to them end at its join
  job_reaper reaper(counting(), {.name = "wake_probe", .spin_polls = 0});
  const pid_t worker = thread_named("wake_probe");
  enqueue_each_into_a_sleeping_worker(reaper, worker, jobs);
  EXPECT_EQ(reaper.stats().wakeups, jobs.size());
  EXPECT_EQ(reaper.stats().polls, 0u) << "an untimed sleep never ends at a limit";
}

TEST(ReaperPollTest, PollingWorkerRunsEveryItemWithoutAnyProducerWake) {
  const hang_guard guard(current_test_name());
  auto jobs = make_jobs(5);
  job_reaper reaper(counting(), {.name = "poll_probe", .spin_polls = 0, .poll_interval = 2ms});
  const pid_t worker = thread_named("poll_probe");
  enqueue_each_into_a_sleeping_worker(reaper, worker, jobs);
  const teardown::reaper_stats s = reaper.stats();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  EXPECT_EQ(s.wakeups, 0u) << "a producer made a futex wake";
  EXPECT_EQ(s.reaped, jobs.size());
  EXPECT_EQ(s.inline_reaped, s.helped) << "the worker (or a helping waiter), not the producer, ran them";
  EXPECT_GT(s.polls, 0u) << "the worker found the items at the end of timed sleeps";
}

TEST(ReaperPollTest, PollingWorkerTakesABurstFromManyProducers) {
  const hang_guard guard(current_test_name());
  const std::size_t per_producer = scaled(2000);
  std::vector<std::vector<job>> jobs(4);
  job_reaper reaper(counting(), {.poll_interval = 1ms});
  std::vector<std::thread> producers;
  for (auto& mine : jobs) {
    mine = make_jobs(per_producer);
    producers.emplace_back([&reaper, &mine] {
      for (job& j : mine) reaper.enqueue(j);
    });
  }
  for (std::thread& t : producers) t.join();
  ASSERT_TRUE(eventually([&] { return reaper.stats().reaped == 4 * per_producer; })) << "items were left queued";
  for (const auto& mine : jobs) EXPECT_EQ(ran_exactly_once(mine), mine.size());
  EXPECT_EQ(reaper.stats().wakeups, 0u);
}

// A worker that looks at its queue once an hour: flush, freeze and stop must still return,
// because the control plane wakes it; a wait for the next look would outlast the hang guard.
constexpr auto kHour = std::chrono::hours(1);

TEST(ReaperPollTest, FlushFreezeAndStopWakeAWorkerThatPollsHourly) {
  const hang_guard guard(current_test_name());
  auto first = make_jobs(3);
  auto last = make_jobs(3);
  job_reaper reaper(counting(), {.name = "hourly", .spin_polls = 0, .poll_interval = kHour});
  const pid_t worker = thread_named("hourly");
  wait_until_asleep(worker);
  for (job& j : first) reaper.enqueue(j);
  reaper.flush();  // returns: every item enqueued before it has run
  EXPECT_EQ(ran_exactly_once(first), first.size());

  wait_until_asleep(worker);
  reaper.freeze();  // returns: the worker is parked
  reaper.thaw();

  wait_until_asleep(worker);
  for (job& j : last) reaper.enqueue(j);
  reaper.stop();  // returns: drains and joins
  EXPECT_EQ(ran_exactly_once(last), last.size());
  EXPECT_EQ(reaper.stats().inline_reaped, reaper.stats().helped) << "the worker (or the helping stop) drained them";
  EXPECT_EQ(reaper.stats().wakeups, 0u);
}

TEST(ReaperPollTest, StopForAndTheDestructorReturnOnAWorkerThatPollsHourly) {
  const hang_guard guard(current_test_name());
  auto jobs = make_jobs(2);
  {
    job_reaper reaper(counting(), {.name = "hourly_stop", .spin_polls = 0, .poll_interval = kHour});
    wait_until_asleep(thread_named("hourly_stop"));
    reaper.enqueue(jobs[0]);
    EXPECT_TRUE(reaper.stop_for(kHour));
  }
  {
    job_reaper reaper(counting(), {.name = "hourly_dtor", .spin_polls = 0, .poll_interval = kHour});
    wait_until_asleep(thread_named("hourly_dtor"));
    reaper.enqueue(jobs[1]);
  }  // the destructor stops it
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

TEST(ReaperPollTest, ForkParksAndResumesAWorkerThatPollsHourly) {
  const hang_guard guard(current_test_name());
  auto in_child = make_jobs(1);
  auto after = make_jobs(2);
  job_reaper reaper(counting(), {.name = "hourly_fork", .spin_polls = 0, .poll_interval = kHour});
  wait_until_asleep(thread_named("hourly_fork"));
  const pid_t child = start_child([&] {
    child_checks check;
    reaper.enqueue(in_child[0]);  // the child's stopped form: runs inline
    check.expect(in_child[0].runs.load() == 1, "the child's enqueue ran fn inline");
    return check.exit_code();
  });
  EXPECT_EQ(wait_child(child), child_ok);
  for (job& j : after) reaper.enqueue(j);
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(after), after.size());
}

TEST(ReaperPollTest, PoolOfPollingWorkersMakesNoProducerWake) {
  const hang_guard guard(current_test_name());
  using job_pool = teardown::reaper_pool<job, &job::hook, job_fn>;
  auto jobs = make_jobs(scaled(500));
  job_pool pool(counting(), {.workers = 2, .worker = {.spin_polls = 0, .poll_interval = 1ms}});
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    pool.enqueue_to(i, jobs[i]);
    if (i % 50 == 0) std::this_thread::sleep_for(2ms);  // let the workers fall asleep now and then
  }
  ASSERT_TRUE(eventually([&] { return pool.stats().reaped == jobs.size(); })) << "items were left queued";
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  EXPECT_EQ(pool.stats().wakeups, 0u);
  pool.stop();
}

TEST(ReaperPollTest, TheModelKernelForwardsThePollIntervalToItsReaper) {
  const hang_guard guard(current_test_name());
  using teardown::model::mm_system;
  mm_system kernel({.async_mm_teardown = true,
                    .thresh_pages = 1,
                    .reaper = {.name = "mm_reaper", .spin_polls = 0, .poll_interval = 1ms}});
  wait_until_asleep(thread_named("mm_reaper"));
  auto task = kernel.spawn(16);
  EXPECT_EQ(task->exit(), teardown::decision::queued);
  ASSERT_TRUE(eventually([&] { return kernel.vmstat().reaped == 1; })) << "the queued mm was never torn down";
  EXPECT_EQ(kernel.stats().reaper.wakeups, 0u) << "the exiting thread made a futex wake";
}

// ---- Lazy polling: looks that back off while idle, and hurries (reaper.hpp "Wake policy") ----

// Long enough that an item waiting for the next look would outlast every wait below: each
// wait for an item to run is a wait for a hurry (or a control call) to have woken the worker.
constexpr auto kNoLook = 20s;

TEST(ReaperLazyTest, IdleLooksBackOffToTheMaximumAndWorkBringsThemBack) {
  const hang_guard guard(current_test_name());
  auto jobs = make_jobs(1);
  job_reaper reaper(counting(), {.name = "lazy_backoff", .spin_polls = 0, .poll_interval = 1ms,
                                 .poll_interval_max = kHour});
  // The first look is poll_interval; a worker that already finished a look or two (a slow start
  // of this thread: 1 ms goes by fast under a sanitizer on a loaded machine) has doubled it.
  const std::uint64_t first = reaper.stats().poll_limit_ns;
  EXPECT_TRUE(first >= 1'000'000 && first % 1'000'000 == 0 && std::has_single_bit(first / 1'000'000))
      << "the first look is poll_interval, doubled by each look since: " << first << " ns";
  // Each idle look doubles the next: 1, 2, 4, ... ms; 64 ms is reached after about 127 ms idle.
  const std::uint64_t backed_off = 64'000'000;
  ASSERT_TRUE(eventually([&] { return reaper.stats().poll_limit_ns >= backed_off; }, kNoLook))
      << "the idle worker's looks did not back off: limit " << reaper.stats().poll_limit_ns << " ns";
  EXPECT_GE(reaper.stats().polls, 6u) << "1 + 2 + ... + 32 ms: six looks ended at their limit";
  reaper.enqueue(jobs[0]);
  EXPECT_TRUE(reaper.hurry()) << "the worker was asleep in a long look";
  ASSERT_TRUE(eventually([&] { return jobs[0].runs.load() == 1; }, kNoLook)) << "the hurried worker never ran it";
  // The pass that took the item brought the limit back to poll_interval; it then backs off again
  // (1 + 2 + ... ms), so for tens of milliseconds it reads below 64 ms.
  EXPECT_TRUE(eventually([&] { return reaper.stats().poll_limit_ns < backed_off; }, kNoLook))
      << "work did not bring the looks back to poll_interval";
  EXPECT_EQ(reaper.stats().wakeups, 0u) << "a producer made a futex wake";
  EXPECT_EQ(reaper.stats().hurries, 1u);
}

TEST(ReaperLazyTest, HurryWakesAWorkerThatPollsHourlyAndCountsOnlyRealWakes) {
  const hang_guard guard(current_test_name());
  auto jobs = make_jobs(2);
  job_reaper reaper(counting(), {.name = "lazy_hurry", .spin_polls = 0, .poll_interval = kHour});
  const pid_t worker = thread_named("lazy_hurry");
  wait_until_asleep(worker);
  reaper.enqueue(jobs[0]);
  EXPECT_TRUE(reaper.hurry());
  ASSERT_TRUE(eventually([&] { return jobs[0].runs.load() == 1; }, kNoLook)) << "hurry did not wake the worker";
  wait_until_asleep(worker);
  reaper.enqueue(jobs[1]);
  EXPECT_TRUE(reaper.hurry());
  ASSERT_TRUE(eventually([&] { return jobs[1].runs.load() == 1; }, kNoLook));
  EXPECT_EQ(reaper.stats().hurries, 2u);
  EXPECT_EQ(reaper.stats().wakeups, 0u) << "enqueue made a futex wake";
  reaper.stop();
  EXPECT_FALSE(reaper.hurry()) << "there is no worker to wake after stop";
  EXPECT_EQ(reaper.stats().hurries, 2u);
}

TEST(ReaperLazyTest, AForkInTheParentHurriesAWorkerThatPollsHourly) {
  const hang_guard guard(current_test_name());
  auto jobs = make_jobs(1);
  job_reaper reaper(counting(), {.name = "lazy_fork", .spin_polls = 0, .poll_interval = kHour,
                                 .poll_interval_max = kHour});
  wait_until_asleep(thread_named("lazy_fork"));
  reaper.enqueue(jobs[0]);  // no wake: the next look is an hour away
  const pid_t child = start_child([] { return child_ok; });
  EXPECT_EQ(wait_child(child), child_ok);
  ASSERT_TRUE(eventually([&] { return jobs[0].runs.load() == 1; }, kNoLook)) << "the fork did not hurry the worker";
  EXPECT_EQ(reaper.stats().hurries, 1u);
}

TEST(ReaperLazyTest, APoolHurriesEverySleepingWorker) {
  const hang_guard guard(current_test_name());
  using job_pool = teardown::reaper_pool<job, &job::hook, job_fn>;
  auto jobs = make_jobs(2);
  job_pool pool(counting(), {.workers = 2, .steal = false,
                             .worker = {.name = "lazy_pool", .spin_polls = 0, .poll_interval = kHour}});
  wait_until_asleep(thread_named("lazy_pool-0"));
  wait_until_asleep(thread_named("lazy_pool-1"));
  pool.enqueue_to(0, jobs[0]);
  pool.enqueue_to(1, jobs[1]);
  EXPECT_EQ(pool.hurry(), 2u);
  ASSERT_TRUE(eventually([&] { return ran_exactly_once(jobs) == jobs.size(); }, kNoLook)) << "a worker was not hurried";
  EXPECT_EQ(pool.stats().hurries, 2u);
  EXPECT_EQ(pool.stats().wakeups, 0u);
}

// async_teardown hurries a polling worker when its pending cost passes hurry_at, when the budget
// refuses a charge, and when its cap is lowered (a pressure policy's way).
struct costed {
  teardown::llist_node hook;
  std::uint64_t cost = 0;
  std::uint64_t charge = 0;
  std::atomic<int> destroyed{0};
};
struct costed_traits {
  std::uint64_t cost(const costed& c) const { return c.cost; }
  bool eligible(const costed&, std::uint64_t) const { return true; }
  void prepare(costed&) const {}
  void destroy(costed& c) const { c.destroyed.fetch_add(1); }
  std::uint64_t& charge(costed& c) const { return c.charge; }
};
using lazy_async = teardown::async_teardown<costed, &costed::hook, costed_traits>;

teardown::async_teardown_options lazy_async_options(const char* name, std::uint64_t cap, std::uint64_t hurry_at) {
  return {.max_pending = cap,
          .reaper = {.name = name, .spin_polls = 0, .poll_interval = kHour},
          .hurry_at = hurry_at};
}

TEST(ReaperLazyTest, APutThatPassesTheMarkHurriesAndOneBelowItDoesNot) {
  const hang_guard guard(current_test_name());
  costed below, past;
  below.cost = 40;
  past.cost = 20;
  lazy_async async(lazy_async_options("lazy_mark", 100, 0));  // hurry_at 0: half the cap, 50
  wait_until_asleep(thread_named("lazy_mark"));
  EXPECT_EQ(async.put(below), teardown::decision::queued);
  EXPECT_EQ(async.worker_stats().hurries, 0u) << "40 pending is below the mark of 50";
  EXPECT_EQ(async.put(past), teardown::decision::queued);  // 60 pending
  ASSERT_TRUE(eventually([&] { return async.stats().reaped == 2; }, kNoLook)) << "the put past the mark did not hurry";
  EXPECT_EQ(async.worker_stats().hurries, 1u);
  EXPECT_EQ(below.destroyed.load() + past.destroyed.load(), 2);
}

TEST(ReaperLazyTest, ARefusedChargeHurriesTheWorker) {
  const hang_guard guard(current_test_name());
  costed queued, refused;
  queued.cost = 60;
  refused.cost = 60;
  lazy_async async(lazy_async_options("lazy_refused", 100, 1000));  // a mark no put reaches
  wait_until_asleep(thread_named("lazy_refused"));
  EXPECT_EQ(async.put(queued), teardown::decision::queued);
  EXPECT_EQ(async.worker_stats().hurries, 0u);
  EXPECT_EQ(async.put(refused), teardown::decision::inline_rejected);  // 120 > 100: inline
  ASSERT_TRUE(eventually([&] { return async.stats().reaped == 1; }, kNoLook)) << "the refusal did not hurry";
  EXPECT_EQ(async.worker_stats().hurries, 1u);
}

TEST(ReaperLazyTest, LoweringTheCapHurriesTheWorkerAndRaisingItDoesNot) {
  const hang_guard guard(current_test_name());
  costed first;
  first.cost = 10;
  lazy_async async(lazy_async_options("lazy_cap", 100, 1000));
  wait_until_asleep(thread_named("lazy_cap"));
  EXPECT_EQ(async.put(first), teardown::decision::queued);
  async.set_max_pending(200);
  EXPECT_TRUE(async.replace_max_pending(200, 300));
  EXPECT_EQ(async.worker_stats().hurries, 0u) << "a raised cap is no reason to hurry";
  EXPECT_TRUE(async.replace_max_pending(300, 5));  // what a pressure policy does under pressure
  ASSERT_TRUE(eventually([&] { return async.stats().reaped == 1; }, kNoLook)) << "the lowered cap did not hurry";
  EXPECT_EQ(async.worker_stats().hurries, 1u);
}

// async_teardown's own hurry(): true when it woke the sleeping worker; false once stopped.
TEST(ReaperLazyTest, AnAsyncTeardownsHurryWakesItsSleepingWorker) {
  const hang_guard guard(current_test_name());
  costed queued;
  queued.cost = 10;
  lazy_async async(lazy_async_options("lazy_ahurry", 100, 1000));  // a mark no put reaches
  wait_until_asleep(thread_named("lazy_ahurry"));
  EXPECT_EQ(async.put(queued), teardown::decision::queued);
  EXPECT_TRUE(async.hurry()) << "the worker was asleep in an hourly look";
  ASSERT_TRUE(eventually([&] { return async.stats().reaped == 1; }, kNoLook)) << "hurry did not wake the worker";
  async.stop();
  EXPECT_FALSE(async.hurry()) << "there is no worker to wake after stop";
}

TEST(ReaperLazyTest, BadLazyOptionsAreRefusedNamingTheField) {
  const std::size_t threads_before = live_threads();
  const auto refused = [](reaper_options opts, const char* field) {
    try {
      job_reaper reaper(counting(), std::move(opts));
      ADD_FAILURE() << "accepted: " << field;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  refused({.poll_interval = 1ms, .poll_interval_max = -1ns}, "poll_interval_max is negative");
  refused({.poll_interval_max = 10ms}, "poll_interval_max is set without a poll_interval");
  refused({.poll_interval = 10ms, .poll_interval_max = 1ms}, "poll_interval_max (1000000 ns) is below poll_interval");
  try {
    lazy_async async({.reaper = {.name = "lazy_bad"}, .hurry_at = 10});
    ADD_FAILURE() << "hurry_at without a poll_interval was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("hurry_at (10) is set without reaper.poll_interval"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(live_threads(), threads_before) << "no worker was started";
}

TEST(ReaperPollTest, NegativePollIntervalIsRefusedNamingTheField) {
  const std::size_t threads_before = live_threads();
  try {
    job_reaper reaper(counting(), {.poll_interval = -1ns});
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("teardown::reaper: poll_interval"), std::string::npos) << e.what();
  }
  using job_pool = teardown::reaper_pool<job, &job::hook, job_fn>;
  try {
    job_pool pool(counting(), {.workers = 2, .worker = {.poll_interval = -1ms}});
    ADD_FAILURE() << "the pool accepted it";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("worker.poll_interval"), std::string::npos) << e.what();
  }
  EXPECT_EQ(live_threads(), threads_before) << "no worker was started";
}

}  // namespace
}  // namespace teardown_test
