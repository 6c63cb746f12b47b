// The reaper's wake policy (reaper_options::poll_interval, reaper.hpp "Wake policy"): with a
// poll interval, producers never wake the worker (no futex wake on the enqueue path), every item
// still runs, and the control plane (flush, freeze, stop, fork) wakes the worker at once instead
// of waiting for its next look. The tests assert behaviour: counts, and that a call returns at
// all (bounded by a hang guard), never how long anything took.
#include <gtest/gtest.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <filesystem>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

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

// The tid of this process's thread named `name` (/proc/self/task/*/comm), once it exists.
pid_t thread_named(const std::string& name) {
  std::optional<pid_t> found;
  EXPECT_TRUE(eventually([&] {
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
      std::string comm = read_text(entry.path().string() + "/comm");
      if (!comm.empty() && comm.back() == '\n') comm.pop_back();
      if (comm == name) {
        found = static_cast<pid_t>(std::stoi(entry.path().filename().string()));
        return true;
      }
    }
    return false;
  })) << "no thread named " << name;
  return found.value_or(-1);
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
  EXPECT_EQ(s.inline_reaped, 0u) << "the worker, not the producer, ran them";
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
  EXPECT_EQ(reaper.stats().inline_reaped, 0u) << "the worker drained them";
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
  EXPECT_EQ(kernel.reaper_statistics().wakeups, 0u) << "the exiting thread made a futex wake";
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
