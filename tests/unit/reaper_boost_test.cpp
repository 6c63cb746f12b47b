// The reaper's boost (reaper.hpp, "Boost"): a flush that has waited boost_after, a batch the
// worker finds older than boost_after, and boost() raise the worker to the waiter's nice (or
// boost_nice); the worker lowers itself back to its own nice at the first pass that finds its
// queue empty; each raise is counted and traced, a raise the system refuses is counted and
// changes nothing, and set_nice ends a boost. The tests read the worker's nice from the kernel
// (getpriority on its thread id) and wait for states with a bound; none asserts a duration.
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <latch>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
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

int nice_of(pid_t tid) {
  errno = 0;
  const int value = getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
  EXPECT_FALSE(value == -1 && errno != 0) << "getpriority(" << tid << "): " << std::strerror(errno);
  return value;
}

int own_nice() { return nice_of(current_tid()); }

// The boost events of one trace domain, as (reason, nice_before, nice_after).
struct recorded_boost {
  std::string reason;
  int before = 0;
  int after = 0;
};

class boost_recorder {
 public:
  explicit boost_recorder(std::uint64_t domain) {
    {
      const std::lock_guard lock(mutex_);
      events_.clear();
    }
    domain_.store(domain);
    teardown::trace::add_hook<teardown::trace::boost_event>(&record);
  }
  ~boost_recorder() {
    teardown::trace::remove_hook<teardown::trace::boost_event>(&record);
    domain_.store(0);
  }
  boost_recorder(const boost_recorder&) = delete;
  boost_recorder& operator=(const boost_recorder&) = delete;

  std::vector<recorded_boost> events() const {
    const std::lock_guard lock(mutex_);
    return events_;
  }

 private:
  static void record(const teardown::trace::boost_event& e) {
    if (e.domain != domain_.load()) return;
    const std::lock_guard lock(mutex_);
    events_.push_back({e.reason, e.nice_before, e.nice_after});
  }
  static inline std::atomic<std::uint64_t> domain_{0};
  static inline std::mutex mutex_;
  static inline std::vector<recorded_boost> events_;
};

// fn for a reaper whose first item (id 0) reports the worker's thread id and blocks until
// `release` counts down; every item counts its runs.
struct blocking_first {
  std::latch release{1};
  std::atomic<bool> started{false};
  std::atomic<pid_t> worker{0};
  std::atomic<int> nice_at_start{-100};  // the worker's nice when item 1 started

  job_fn fn() {
    return [this](job& j) {
      if (j.id == 0) {
        worker.store(current_tid());
        started.store(true);
        release.wait();
      } else if (j.id == 1) {
        nice_at_start.store(own_nice());
      }
      j.runs.fetch_add(1);
    };
  }
};

class ReaperBoostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (own_nice() >= 19) GTEST_SKIP() << "the test runs at nice 19: no waiter is more urgent than the worker";
  }
  hang_guard guard_{current_test_name()};
};

TEST_F(ReaperBoostTest, AFlushThatWaitsRaisesTheWorkerToTheFlushersNiceAndTheWorkerLowersItselfOnceDrained) {
  if (const auto why = nice_lowering_refused(own_nice())) GTEST_SKIP() << *why;
  const std::uint64_t domain = teardown::trace::new_domain();
  boost_recorder recorder(domain);
  blocking_first probe;
  auto jobs = make_jobs(3);
  job_reaper reaper(probe.fn(), {.name = "boost_flush", .boost_after = 1ms, .trace_domain = domain});
  reaper.enqueue(jobs[0]);
  wait_until(probe.started);
  const pid_t worker = probe.worker.load();
  if (reaper.stats().setup_warnings & teardown::setup_warning_nice) GTEST_SKIP() << "setpriority(19) was refused";
  // A worker that took job 0 more than boost_after after its enqueue (a loaded machine) raised
  // itself for that backlog; set_nice ends such a boost, so the flush below starts from 19.
  EXPECT_TRUE(reaper.set_nice(19));
  EXPECT_EQ(nice_of(worker), 19);
  const std::uint64_t boosts_before = reaper.stats().boosts;
  const std::size_t events_before = recorder.events().size();
  for (std::size_t i = 1; i < jobs.size(); ++i) reaper.enqueue(jobs[i]);

  const int flusher_nice = own_nice();
  std::thread flusher([&] { reaper.flush(); });
  ASSERT_TRUE(eventually([&] { return reaper.stats().boosted; }, 20s)) << "the waiting flush never raised the worker";
  EXPECT_EQ(nice_of(worker), flusher_nice);
  EXPECT_EQ(reaper.stats().boosts, boosts_before + 1);
  EXPECT_EQ(reaper.nice(), 19) << "nice() keeps the worker's own value";

  probe.release.count_down();
  flusher.join();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  EXPECT_EQ(probe.nice_at_start.load(), flusher_nice) << "the items behind the blocked one ran raised";
  ASSERT_TRUE(eventually([&] { return !reaper.stats().boosted; }, 20s)) << "the drained worker never lowered itself";
  EXPECT_EQ(nice_of(worker), 19);
  EXPECT_EQ(reaper.stats().boosts, boosts_before + 1);
  EXPECT_EQ(reaper.stats().boosts_refused, 0u);

  std::vector<recorded_boost> events = recorder.events();
  events.erase(events.begin(), events.begin() + static_cast<std::ptrdiff_t>(events_before));
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].reason, "flush");
  EXPECT_EQ(events[0].before, 19);
  EXPECT_EQ(events[0].after, flusher_nice);
  EXPECT_EQ(events[1].reason, "drained");
  EXPECT_EQ(events[1].before, flusher_nice);
  EXPECT_EQ(events[1].after, 19);
}

// A stop waits for the worker's final drain (a program's exit waits there for its deferred
// teardowns): once it has waited boost_after, it raises the worker as a waiting flush does.
TEST_F(ReaperBoostTest, AStopThatWaitsRaisesTheWorkerForItsFinalDrain) {
  if (const auto why = nice_lowering_refused(own_nice())) GTEST_SKIP() << *why;
  const std::uint64_t domain = teardown::trace::new_domain();
  boost_recorder recorder(domain);
  blocking_first probe;
  auto jobs = make_jobs(2);
  job_reaper reaper(probe.fn(), {.name = "boost_stop", .boost_after = 1ms, .trace_domain = domain});
  reaper.enqueue(jobs[0]);
  wait_until(probe.started);
  if (reaper.stats().setup_warnings & teardown::setup_warning_nice) GTEST_SKIP() << "setpriority(19) was refused";
  EXPECT_TRUE(reaper.set_nice(19));  // ends a backlog boost the worker may have made itself
  const std::size_t events_before = recorder.events().size();
  reaper.enqueue(jobs[1]);
  const int stopper_nice = own_nice();
  std::thread stopper([&] { reaper.stop(); });
  const bool raised = eventually([&] { return nice_of(probe.worker.load()) == stopper_nice; }, 20s);
  probe.release.count_down();
  stopper.join();
  EXPECT_TRUE(raised) << "the waiting stop never raised the worker";
  EXPECT_EQ(probe.nice_at_start.load(), stopper_nice) << "the item behind the blocked one ran raised";
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  std::vector<recorded_boost> events = recorder.events();
  events.erase(events.begin(), events.begin() + static_cast<std::ptrdiff_t>(events_before));
  ASSERT_GE(events.size(), 1u);
  EXPECT_EQ(events[0].reason, "stop");
  EXPECT_EQ(events[0].before, 19);
  EXPECT_EQ(events[0].after, stopper_nice);
  EXPECT_FALSE(reaper.stats().boosted) << "no worker runs after stop, raised or not";
}

// A bounded flush or stop whose deadline comes before boost_after gives up at its deadline: it
// neither raises the worker nor, where no raise is possible (an ordinary user's worker keeps its
// creator's nice), helps.
TEST_F(ReaperBoostTest, AFlushForOrStopForEndingBeforeBoostAfterNeitherRaisesNorHelps) {
  blocking_first probe;
  auto jobs = make_jobs(3);
  job_reaper reaper(probe.fn(), {.name = "boost_late", .boost_after = std::chrono::hours(1)});
  reaper.enqueue(jobs[0]);
  wait_until(probe.started);
  reaper.enqueue(jobs[1]);
  EXPECT_FALSE(reaper.flush_for(30ms));
  reaper.enqueue(jobs[2]);
  EXPECT_FALSE(reaper.stop_for(30ms));
  const auto stats = reaper.stats();
  EXPECT_EQ(stats.boosts, 0u);
  EXPECT_EQ(stats.boosts_refused, 0u);
  EXPECT_EQ(stats.helped, 0u);
  EXPECT_FALSE(stats.boosted);
  probe.release.count_down();
  reaper.stop();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

TEST_F(ReaperBoostTest, BoostAfterZeroNeverRaisesTheWorker) {
  blocking_first probe;
  auto jobs = make_jobs(2);
  job_reaper reaper(probe.fn(), {.name = "boost_never", .boost_after = 0ns});
  reaper.enqueue(jobs[0]);
  wait_until(probe.started);
  reaper.enqueue(jobs[1]);
  std::thread flusher([&] { reaper.flush(); });
  // Long past the default boost_after: a boost would have come by now.
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(reaper.stats().boosted);
  probe.release.count_down();
  flusher.join();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  EXPECT_EQ(reaper.stats().boosts, 0u);
  if (!(reaper.stats().setup_warnings & teardown::setup_warning_nice)) {
    EXPECT_EQ(probe.nice_at_start.load(), 19);
  }
}

TEST_F(ReaperBoostTest, ABatchTheWorkerFindsOlderThanBoostAfterRaisesItToTheConstructingThreadsNice) {
  if (const auto why = nice_lowering_refused(own_nice())) GTEST_SKIP() << *why;
  const std::uint64_t domain = teardown::trace::new_domain();
  boost_recorder recorder(domain);
  auto jobs = make_jobs(3);
  std::atomic<pid_t> worker{0};
  std::atomic<int> nice_in_fn{-100};
  job_reaper reaper(
      [&](job& j) {
        if (j.id == 0) {
          worker.store(current_tid());
          nice_in_fn.store(own_nice());
        }
        j.runs.fetch_add(1);
      },
      {.name = "boost_backlog", .boost_after = 1ms, .trace_domain = domain});
  if (reaper.stats().setup_warnings & teardown::setup_warning_nice) GTEST_SKIP() << "setpriority(19) was refused";
  reaper.freeze();
  for (job& j : jobs) reaper.enqueue(j);
  std::this_thread::sleep_for(5ms);  // the batch's age passes boost_after
  reaper.thaw();
  // Not a flush: its own boost would hide the worker's.
  ASSERT_TRUE(eventually([&] { return ran_exactly_once(jobs) == jobs.size(); }));
  EXPECT_EQ(nice_in_fn.load(), own_nice());
  ASSERT_TRUE(eventually([&] { return !reaper.stats().boosted; }, 20s));
  EXPECT_EQ(nice_of(worker.load()), 19);
  const std::vector<recorded_boost> events = recorder.events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].reason, "backlog");
  EXPECT_EQ(events[1].reason, "drained");
}

TEST_F(ReaperBoostTest, BoostNiceIsTheLevelWhenSet) {
  if (const auto why = nice_lowering_refused(5)) GTEST_SKIP() << *why;
  blocking_first probe;
  auto jobs = make_jobs(2);
  // boost_after far away: item 0 waiting past it (TSan on a loaded machine) would make the worker
  // raise itself to 5 for its backlog, and the boost below would find nothing to change.
  job_reaper reaper(probe.fn(), {.name = "boost_level", .boost_after = std::chrono::hours(1), .boost_nice = 5});
  reaper.enqueue(jobs[0]);
  wait_until(probe.started);
  if (reaper.stats().setup_warnings & teardown::setup_warning_nice) GTEST_SKIP() << "setpriority(19) was refused";
  EXPECT_TRUE(reaper.boost());
  EXPECT_EQ(nice_of(probe.worker.load()), 5);
  EXPECT_FALSE(reaper.boost()) << "already at the level: nothing changes";
  EXPECT_EQ(reaper.stats().boosts, 1u);
  reaper.enqueue(jobs[1]);
  probe.release.count_down();
  reaper.flush();
  EXPECT_EQ(probe.nice_at_start.load(), 5);
  ASSERT_TRUE(eventually([&] { return !reaper.stats().boosted; }, 20s));
  EXPECT_EQ(nice_of(probe.worker.load()), 19);
}

TEST_F(ReaperBoostTest, AWorkerAlreadyAsUrgentAsTheCallerIsNotRaised) {
  blocking_first probe;
  auto jobs = make_jobs(1);
  job_reaper reaper(probe.fn(), {.name = "boost_urgent", .nice = own_nice()});
  reaper.enqueue(jobs[0]);
  wait_until(probe.started);
  EXPECT_FALSE(reaper.boost()) << "nothing changed";
  EXPECT_EQ(reaper.stats().boosts, 0u);
  EXPECT_FALSE(reaper.stats().boosted);
  probe.release.count_down();
  reaper.flush();
}

TEST_F(ReaperBoostTest, SetNiceEndsABoost) {
  if (const auto why = nice_lowering_refused(std::min(own_nice(), 10))) GTEST_SKIP() << *why;
  blocking_first probe;
  auto jobs = make_jobs(2);
  // boost_after far away: on a loaded machine the flush below would otherwise raise the worker
  // itself before item 1 starts, and item 1 would run at the flusher's nice, not at 10.
  job_reaper reaper(probe.fn(), {.name = "boost_set_nice", .boost_after = std::chrono::hours(1)});
  reaper.enqueue(jobs[0]);
  wait_until(probe.started);
  if (reaper.stats().setup_warnings & teardown::setup_warning_nice) GTEST_SKIP() << "setpriority(19) was refused";
  ASSERT_TRUE(reaper.boost());
  ASSERT_TRUE(reaper.stats().boosted);
  ASSERT_TRUE(reaper.set_nice(10));
  EXPECT_FALSE(reaper.stats().boosted);
  EXPECT_EQ(nice_of(probe.worker.load()), 10);
  reaper.enqueue(jobs[1]);
  probe.release.count_down();
  reaper.flush();
  EXPECT_EQ(probe.nice_at_start.load(), 10);
  EXPECT_EQ(nice_of(probe.worker.load()), 10) << "the drained worker has no boost to undo";
}

// capset(2) changes only the calling thread's capabilities: the thread that boosts below loses
// CAP_SYS_NICE, the rest of the test process keeps it.
bool drop_cap_sys_nice_on_this_thread() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (syscall(SYS_capget, &header, data) != 0) return false;
  data[CAP_SYS_NICE / 32].effective &= ~(1u << (CAP_SYS_NICE % 32));
  return syscall(SYS_capset, &header, data) == 0;
}

// Why a thread without CAP_SYS_NICE would not be refused a raise to `to` here: an RLIMIT_NICE
// that reaches it. Nothing where it would be refused.
std::optional<std::string> nice_limit_allows(int to) {
  rlimit nice_limit{};
  if (getrlimit(RLIMIT_NICE, &nice_limit) != 0) return std::string("getrlimit(RLIMIT_NICE) failed");
  if (nice_limit.rlim_cur != RLIM_INFINITY && nice_limit.rlim_cur < static_cast<rlim_t>(20 - to)) return std::nullopt;
  return "RLIMIT_NICE " + std::to_string(nice_limit.rlim_cur) + " lets any thread lower the worker's nice to " +
         std::to_string(to);
}

TEST_F(ReaperBoostTest, ARaiseTheSystemRefusesIsCountedTracedAndChangesNothing) {
  const int caller_nice = own_nice();
  if (const auto why = nice_limit_allows(caller_nice)) GTEST_SKIP() << *why;
  const std::uint64_t domain = teardown::trace::new_domain();
  boost_recorder recorder(domain);
  blocking_first probe;
  auto jobs = make_jobs(1);
  // boost_after far away: the flush below must not raise the worker itself (on a loaded machine a nice-19
  // worker takes longer than the default 10 ms to finish, and that raise would be a second event).
  // nice_only_if_raisable off: the worker goes to 19 even where no raise could undo it (an
  // ordinary user), the state whose refused raise this test is about.
  job_reaper reaper(probe.fn(), {.name = "boost_refused",
                                 .boost_after = std::chrono::hours(1),
                                 .nice_only_if_raisable = false,
                                 .trace_domain = domain});
  reaper.enqueue(jobs[0]);
  wait_until(probe.started);
  if (reaper.stats().setup_warnings & teardown::setup_warning_nice) GTEST_SKIP() << "setpriority(19) was refused";
  std::optional<bool> raised;
  bool dropped = false;
  std::thread unprivileged([&] {
    dropped = drop_cap_sys_nice_on_this_thread();
    if (dropped) raised = reaper.boost();
  });
  unprivileged.join();
  if (!dropped) {
    probe.release.count_down();
    GTEST_SKIP() << "capset refused to drop CAP_SYS_NICE: " << std::strerror(errno);
  }
  EXPECT_EQ(raised, std::optional<bool>(false));
  EXPECT_EQ(nice_of(probe.worker.load()), 19);
  const teardown::reaper_stats s = reaper.stats();
  EXPECT_EQ(s.boosts_refused, 1u);
  EXPECT_EQ(s.boosts, 0u);
  EXPECT_FALSE(s.boosted);
  probe.release.count_down();
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  const std::vector<recorded_boost> events = recorder.events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].reason, "refused");
  EXPECT_EQ(events[0].before, 19);
  EXPECT_EQ(events[0].after, caller_nice);
}

// A raise refused by the system changes nothing and is said once: set_nice keeps the nice in force
// (nice() and the thread agree), boost() says false, the first refusal alone is traced and sets
// setup_warning_raise; every refused boost is counted. A thread that may raise then still can: the
// reaper compares the nice in force, not the refused request.
TEST_F(ReaperBoostTest, ARefusedSetNiceChangesNothingAndTheRefusalIsSaidOnce) {
  const int caller_nice = own_nice();
  if (const auto why = nice_limit_allows(caller_nice)) GTEST_SKIP() << *why;
  const std::uint64_t domain = teardown::trace::new_domain();
  boost_recorder recorder(domain);
  blocking_first probe;
  auto jobs = make_jobs(1);
  job_reaper reaper(probe.fn(), {.name = "boost_said_once", .boost_after = std::chrono::hours(1),
                                 .nice_only_if_raisable = false, .trace_domain = domain});
  reaper.enqueue(jobs[0]);
  wait_until(probe.started);
  if (reaper.stats().setup_warnings & teardown::setup_warning_nice) GTEST_SKIP() << "setpriority(19) was refused";
  EXPECT_EQ(reaper.stats().setup_warnings & teardown::setup_warning_raise, 0u);
  bool dropped = false;
  std::optional<bool> applied;
  std::optional<bool> first_boost;
  std::optional<bool> second_boost;
  std::thread unprivileged([&] {
    dropped = drop_cap_sys_nice_on_this_thread();
    if (!dropped) return;
    applied = reaper.set_nice(caller_nice);
    first_boost = reaper.boost();
    second_boost = reaper.boost();
  });
  unprivileged.join();
  if (!dropped) {
    probe.release.count_down();
    GTEST_SKIP() << "capset refused to drop CAP_SYS_NICE: " << std::strerror(errno);
  }
  EXPECT_EQ(applied, std::optional<bool>(false));
  EXPECT_EQ(first_boost, std::optional<bool>(false));
  EXPECT_EQ(second_boost, std::optional<bool>(false));
  EXPECT_EQ(reaper.nice(), 19) << "the nice in force, not the refused request";
  EXPECT_EQ(nice_of(probe.worker.load()), 19);
  teardown::reaper_stats s = reaper.stats();
  EXPECT_NE(s.setup_warnings & teardown::setup_warning_raise, 0u);
  EXPECT_EQ(s.boosts_refused, 2u);
  EXPECT_EQ(s.boosts, 0u);
  std::vector<recorded_boost> events = recorder.events();
  ASSERT_EQ(events.size(), 1u) << "three refusals, said once";
  EXPECT_EQ(events[0].reason, "refused");
  EXPECT_EQ(events[0].before, 19);
  EXPECT_EQ(events[0].after, caller_nice);
  if (!nice_lowering_refused(caller_nice)) {
    EXPECT_TRUE(reaper.boost()) << "this thread may raise the worker: the refused set_nice left nothing behind";
    EXPECT_EQ(nice_of(probe.worker.load()), caller_nice);
    EXPECT_EQ(reaper.stats().boosts, 1u);
  }
  probe.release.count_down();
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

// The nice a boost could not undo is not applied: a reaper made by a thread that may not lower a
// nice value back (here, one that dropped CAP_SYS_NICE, with an RLIMIT_NICE that does not reach
// its nice) keeps its worker at that thread's nice, says so in setup_warnings, and nice() agrees;
// a thread that may raise it back gets the nice it asked for. With nice_only_if_raisable off, or
// without a boost, the nice is applied either way.
TEST_F(ReaperBoostTest, ANiceNoBoostCouldUndoIsNotAppliedAndTheWorkerKeepsItsCreatorsNice) {
  const int caller_nice = own_nice();
  if (const auto why = nice_limit_allows(caller_nice)) GTEST_SKIP() << *why;
  struct made {
    int nice = -100;
    int nice_reported = -100;
    int nice_reported_at_once = -100;  // right after the constructor: the same, started or not
    std::uint32_t warnings = 0;
  };
  const auto make = [&](reaper_options opts, bool drop) {
    std::optional<made> result;
    std::thread creator([&] {
      if (drop && !drop_cap_sys_nice_on_this_thread()) return;
      blocking_first probe;
      auto jobs = make_jobs(1);
      job_reaper reaper(probe.fn(), std::move(opts));
      const int at_once = reaper.nice();
      reaper.enqueue(jobs[0]);
      wait_until(probe.started);
      result = made{nice_of(probe.worker.load()), reaper.nice(), at_once, reaper.stats().setup_warnings};
      probe.release.count_down();
      reaper.flush();
    });
    creator.join();
    return result;
  };
  const auto unraisable = make({.name = "nice_kept"}, /*drop=*/true);
  if (!unraisable) GTEST_SKIP() << "capset refused to drop CAP_SYS_NICE: " << std::strerror(errno);
  EXPECT_EQ(unraisable->nice, caller_nice) << "a nice-19 worker no boost could raise again";
  EXPECT_EQ(unraisable->nice_reported, caller_nice);
  EXPECT_EQ(unraisable->nice_reported_at_once, caller_nice) << "nice() does not depend on the worker's start";
  EXPECT_NE(unraisable->warnings & teardown::setup_warning_nice_kept, 0u);
  EXPECT_EQ(unraisable->warnings & teardown::setup_warning_nice, 0u);
  for (const auto& opts : {reaper_options{.name = "nice_forced", .nice_only_if_raisable = false},
                           reaper_options{.name = "nice_no_boost", .boost_after = std::chrono::nanoseconds(0)}}) {
    const auto applied = make(opts, /*drop=*/true);
    ASSERT_TRUE(applied.has_value());
    EXPECT_EQ(applied->nice, 19) << opts.name;
    EXPECT_EQ(applied->warnings & teardown::setup_warning_nice_kept, 0u) << opts.name;
  }
  if (!nice_lowering_refused(caller_nice)) {
    const auto raisable = make({.name = "nice_applied"}, /*drop=*/false);
    ASSERT_TRUE(raisable.has_value());
    EXPECT_EQ(raisable->nice, 19) << "this thread may raise the worker back: the nice is applied";
    EXPECT_EQ(raisable->warnings & teardown::setup_warning_nice_kept, 0u);
  }
}

TEST_F(ReaperBoostTest, APoolFlushRaisesTheWorkerItWaitsForAndThePoolCountsIt) {
  if (const auto why = nice_lowering_refused(own_nice())) GTEST_SKIP() << *why;
  using job_pool = teardown::reaper_pool<job, &job::hook, job_fn>;
  blocking_first probe;
  auto jobs = make_jobs(2);
  job_pool pool(probe.fn(), {.workers = 2, .steal = false, .worker = {.name = "boost_pool", .boost_after = 1ms}});
  pool.enqueue(jobs[0]);
  wait_until(probe.started);
  if (pool.stats().setup_warnings & teardown::setup_warning_nice) GTEST_SKIP() << "setpriority(19) was refused";
  std::thread flusher([&] { pool.flush(); });
  ASSERT_TRUE(eventually([&] { return pool.stats().boosted; }, 20s));
  EXPECT_EQ(nice_of(probe.worker.load()), own_nice());
  probe.release.count_down();
  flusher.join();
  EXPECT_GE(pool.stats().boosts, 1u);
  ASSERT_TRUE(eventually([&] { return !pool.stats().boosted; }, 20s));
  EXPECT_EQ(nice_of(probe.worker.load()), 19);
  pool.enqueue(jobs[1]);
  pool.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

TEST_F(ReaperBoostTest, BadBoostOptionsAreRefusedNamingTheField) {
  for (const auto& [opts, field] : {std::pair{reaper_options{.boost_after = -1ns}, "boost_after"},
                                    std::pair{reaper_options{.boost_nice = 20}, "boost_nice"},
                                    std::pair{reaper_options{.boost_nice = -21}, "boost_nice"}}) {
    try {
      job_reaper reaper(counting(), opts);
      ADD_FAILURE() << field << ": accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("teardown::reaper: ") + field), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace teardown_test
