// Driven mode (reaper.hpp, "Driven mode"): no thread of ours; the program runs the teardowns
// through run(), told by work_fd or on_work; flush, freeze, stop and the compositions keep
// their meaning.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <latch>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "teardown/async_teardown.hpp"
#include "teardown/deferred.hpp"
#include "teardown/reaper.hpp"
#include "reaper_test_support.hpp"
#include "test_support.hpp"

namespace {

using namespace std::chrono_literals;
using teardown_test::reaper_support::held_until_go;

struct item {
  teardown::llist_node node;
  std::atomic<int> runs{0};
};

struct count_runs {
  std::atomic<std::uint64_t>* total = nullptr;
  void operator()(item& x) const noexcept {
    x.runs.fetch_add(1, std::memory_order_relaxed);
    if (total != nullptr) total->fetch_add(1, std::memory_order_relaxed);
  }
};

using driven_reaper = teardown::reaper<item, &item::node, count_runs>;

teardown::reaper_options driven(teardown::reaper_options opts = {}) {
  opts.driven = true;
  return opts;
}

std::size_t thread_count() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
}

using fn_reaper = teardown::reaper<item, &item::node, std::function<void(item&)>>;

// fn: reports `started`, then holds each item until `go`.
void expect_once_each(const std::vector<item>& all) {
  for (const item& x : all) EXPECT_EQ(x.runs.load(), 1);
}

TEST(DrivenTest, WorkFdIsMinusOneWithoutDriven) {
  driven_reaper reaper(count_runs{});
  EXPECT_EQ(reaper.work_fd(), -1);
  EXPECT_THROW((void)reaper.run(), std::logic_error);
}

TEST(DrivenTest, WorkFdIsReadableAfterTheFirstEnqueueAndRunConsumesIt) {
  driven_reaper reaper(count_runs{}, driven());
  ASSERT_GE(reaper.work_fd(), 0);
  EXPECT_FALSE(readable(reaper.work_fd()));
  std::vector<item> all(3);
  reaper.enqueue(all[0]);
  EXPECT_TRUE(readable(reaper.work_fd()));
  reaper.enqueue(all[1]);
  reaper.enqueue(all[2]);
  EXPECT_EQ(reaper.stats().wakeups, 1u);  // only the empty -> non-empty enqueue signals
  EXPECT_EQ(all[0].runs.load(), 0);       // nothing runs until the program drives
  const teardown::drive_result result = reaper.run();
  EXPECT_EQ(result.items, 3u);
  EXPECT_FALSE(result.more);
  EXPECT_FALSE(readable(reaper.work_fd()));
  expect_once_each(all);
  const teardown::reaper_stats s = reaper.stats();
  EXPECT_EQ(s.reaped, 3u);
  EXPECT_EQ(s.pending, 0u);
  EXPECT_EQ(s.batches, 1u) << "the run took the three in one batch";
  EXPECT_FALSE(s.running);
  EXPECT_EQ(reaper.run().items, 0u);
  EXPECT_EQ(reaper.stats().batches, 1u) << "a run that finds nothing takes no batch";
}

// A lower bound, not a timing assertion, as for a worker: the item was enqueued before a 20 ms
// sleep and run after it, so the recorded wait cannot be shorter.
TEST(DrivenTest, LongestWaitCoversTheTimeAnItemWaitedForARun) {
  driven_reaper reaper(count_runs{}, driven());
  std::vector<item> all(1);
  reaper.enqueue(all[0]);
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(reaper.run().items, 1u);
  EXPECT_GE(reaper.stats().longest_wait_ns, std::uint64_t{20'000'000});
}

TEST(DrivenTest, BoundedRunLeavesTheRestAndSignalsAgain) {
  driven_reaper reaper(count_runs{}, driven());
  std::vector<item> all(7);
  for (item& x : all) reaper.enqueue(x);
  teardown::drive_result result = reaper.run({.items = 2});
  EXPECT_EQ(result.items, 2u);
  EXPECT_TRUE(result.more);
  EXPECT_TRUE(readable(reaper.work_fd()));
  EXPECT_EQ(reaper.stats().pending, 5u);
  // A time limit already spent still runs one item.
  result = reaper.run({.time = 0ns});
  EXPECT_EQ(result.items, 1u);
  EXPECT_TRUE(result.more);
  result = reaper.run({.items = 0});
  EXPECT_EQ(result.items, 0u);
  // A time limit not yet spent lets the items limit end the run.
  result = reaper.run({.items = 2, .time = std::chrono::hours(1)});
  EXPECT_EQ(result.items, 2u);
  EXPECT_TRUE(result.more);
  result = reaper.run();
  EXPECT_EQ(result.items, 2u);
  EXPECT_FALSE(result.more);
  EXPECT_FALSE(readable(reaper.work_fd()));
  expect_once_each(all);
}

// Every item costs 1 and counts its teardowns.
struct unit_traits {
  std::uint64_t cost(const item&) const { return 1; }
  bool eligible(const item&, std::uint64_t) const { return true; }
  void prepare(item&) const {}
  void destroy(item& x) const { x.runs.fetch_add(1); }
  std::uint64_t& charge(item&) { return charged; }
  std::uint64_t charged = 0;
};

TEST(DrivenTest, NoThreadIsStarted) {
  const std::size_t before = thread_count();
  std::vector<item> all(4);
  {
    driven_reaper reaper(count_runs{}, driven());
    for (item& x : all) reaper.enqueue(x);
    EXPECT_EQ(thread_count(), before);
  }
  expect_once_each(all);  // the destructor stopped, on this thread
  teardown::async_teardown_options opts;
  opts.reaper.driven = true;
  teardown::async_teardown<item, &item::node, unit_traits> async(opts);
  std::vector<item> more(2);
  for (item& x : more) EXPECT_EQ(async.put(x), teardown::decision::queued);
  auto domain_opts = teardown::deferred_domain::default_options();
  domain_opts.reaper.driven = true;
  teardown::deferred_domain domain(domain_opts);
  EXPECT_EQ(domain.delete_object(new std::vector<char>(1 << 20), [](const auto&) { return 1u << 20; }),
            teardown::decision::queued);
  EXPECT_EQ(thread_count(), before);
  EXPECT_EQ(async.run().items, 2u);
  EXPECT_EQ(domain.run().items, 1u);
}

TEST(DrivenTest, FlushIsABarrierWithAConcurrentProducer) {
  std::atomic<std::uint64_t> total{0};
  driven_reaper reaper(count_runs{&total}, driven());
  std::vector<item> mine(100), theirs(2000);
  std::atomic<bool> go{false};
  std::thread producer([&] {
    while (!go.load()) std::this_thread::yield();
    for (item& x : theirs) reaper.enqueue(x);
  });
  go.store(true);
  for (std::size_t round = 0; round < mine.size(); round += 10) {
    for (std::size_t i = round; i < round + 10; ++i) reaper.enqueue(mine[i]);
    reaper.flush();
    for (std::size_t i = 0; i < round + 10; ++i) ASSERT_EQ(mine[i].runs.load(), 1);
  }
  producer.join();
  std::vector<item> last(10);
  for (item& x : last) reaper.enqueue(x);
  EXPECT_TRUE(reaper.flush_for(30s)) << "a driven flush_for that tore everything down answered false";
  EXPECT_TRUE(reaper.stop_for(30s)) << "a driven stop_for with nothing to wait for answered false";
  expect_once_each(mine);
  expect_once_each(theirs);
  expect_once_each(last);
  EXPECT_EQ(total.load(), mine.size() + theirs.size() + last.size());
}

TEST(DrivenTest, FreezeMakesRunDoNothingUntilThaw) {
  driven_reaper reaper(count_runs{}, driven());
  std::vector<item> all(4);
  for (item& x : all) reaper.enqueue(x);
  EXPECT_EQ(reaper.run({.items = 1}).items, 1u);  // the rest is held between runs
  reaper.freeze();
  EXPECT_EQ(reaper.run().items, 0u);
  EXPECT_FALSE(readable(reaper.work_fd()));  // consumed; thaw signals again
  // A frozen reaper holds nothing: reap_on_caller reaches every item not started.
  std::size_t offered = 0;
  (void)reaper.reap_on_caller([&](item&) { ++offered; return false; });
  EXPECT_EQ(offered, 3u);
  EXPECT_FALSE(reaper.flush_for(1ms));  // waits for the thaw, until its deadline
  EXPECT_EQ(reaper.run().items, 0u);   // still frozen: consumes what the flush signalled
  EXPECT_FALSE(readable(reaper.work_fd()));
  reaper.thaw();
  EXPECT_TRUE(readable(reaper.work_fd())) << "the last thaw did not signal the work held back";
  EXPECT_EQ(reaper.run().items, 3u);
  expect_once_each(all);
  EXPECT_THROW(reaper.thaw(), std::logic_error);
}

TEST(DrivenTest, StopTearsDownEverythingOnceAndLaterEnqueuesRunInline) {
  std::vector<item> all(6);
  driven_reaper reaper(count_runs{}, driven());
  for (item& x : all) reaper.enqueue(x);
  (void)reaper.run({.items = 2});
  reaper.stop();
  expect_once_each(all);
  item late;
  reaper.enqueue(late);  // after stop: torn down inline, on the caller
  EXPECT_EQ(late.runs.load(), 1);
  EXPECT_EQ(reaper.run().items, 0u);
  EXPECT_TRUE(reaper.flush_for(30s)) << "after stop nothing is left to wait for";
  reaper.stop();  // idempotent
  const teardown::reaper_stats s = reaper.stats();
  EXPECT_EQ(s.reaped, 7u);
  EXPECT_EQ(s.inline_reaped, 1u);
  EXPECT_FALSE(s.running);
}

// A stop waits for a producer whose teardown after an earlier stop still runs (in a hand, on the
// producer). It waits without the drive lock, so a run() meanwhile returns, with nothing to do.
TEST(DrivenTest, AStopWaitingForAProducersTeardownLeavesTheDriveLockFree) {
  std::atomic<bool> started{false};
  std::atomic<bool> go{false};
  fn_reaper reaper(held_until_go(started, go), driven());
  reaper.stop();
  item late;
  std::thread producer([&] {
    teardown::llist_chain<item, &item::node> chain;
    chain.push_back(late);
    reaper.enqueue_chain(std::move(chain));  // torn down here, inside a hand, and it blocks
  });
  ASSERT_TRUE(teardown_test::eventually([&] { return started.load(); }));
  std::atomic<pid_t> stopper_tid{0};
  std::thread stopper([&] {
    stopper_tid.store(static_cast<pid_t>(::syscall(SYS_gettid)));
    reaper.stop();
  });
  ASSERT_TRUE(teardown_test::eventually([&] { return stopper_tid.load() != 0; }));
  teardown_test::reaper_support::wait_until_asleep(stopper_tid.load());  // in stop, waiting for the producer's hand
  std::atomic<bool> ran{false};
  std::thread runner([&] {
    EXPECT_EQ(reaper.run().items, 0u);
    ran.store(true);
  });
  // A bound far beyond a right answer (which needs nothing from the producer).
  EXPECT_TRUE(teardown_test::eventually([&] { return ran.load(); }, 10s))
      << "run() waited for a stop that waits for a producer's teardown";
  go.store(true);
  producer.join();
  stopper.join();
  runner.join();
  EXPECT_EQ(late.runs.load(), 1);
  EXPECT_EQ(reaper.stats().inline_reaped, 1u);
}

// A run holds the drive lock while fn runs: flush_for and stop_for wait for that lock no longer
// than their deadline. Then, once the run returns, stop tears down the rest.
TEST(DrivenTest, FlushForAndStopForGiveUpAtTheirDeadlineWhileARunHoldsTheDriveLock) {
  std::atomic<bool> started{false};
  std::atomic<bool> go{false};
  fn_reaper reaper(held_until_go(started, go), driven());
  std::vector<item> all(2);
  reaper.enqueue(all[0]);
  std::thread runner([&] { (void)reaper.run({.items = 1}); });
  ASSERT_TRUE(teardown_test::eventually([&] { return started.load(); }));
  reaper.enqueue(all[1]);
  const teardown_test::go_at_the_latest watchdog(go, 20s);
  teardown_test::expect_gave_up_before_go(reaper.flush_for(20ms), go, "flush_for (for the run's drive lock)");
  teardown_test::expect_gave_up_before_go(reaper.stop_for(20ms), go, "stop_for (for the run's drive lock)");
  go.store(true);
  runner.join();
  reaper.stop();
  expect_once_each(all);
}

TEST(DrivenTest, ThreadOnlyOptionsAreRefusedNamingTheField) {
  const auto refused = [](teardown::reaper_options opts, const char* field) {
    try {
      driven_reaper reaper(count_runs{}, std::move(opts));
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
      return true;
    }
    return false;
  };
  const std::size_t before = thread_count();
  EXPECT_TRUE(refused(driven({.poll_interval = 1ms}), "poll_interval"));
  EXPECT_TRUE(refused(driven({.cpus = {0}}), "cpus"));
  EXPECT_TRUE(refused(driven({.policy = teardown::sched_policy::idle}), "policy"));
  EXPECT_TRUE(refused(driven({.boost_nice = 0}), "boost_nice"));
  EXPECT_TRUE(refused(driven({.nice_only_if_raisable = false}), "nice_only_if_raisable"));
  EXPECT_TRUE(refused(driven({.yield_after = 1ms}), "yield_after"));
  EXPECT_TRUE(refused(driven({.on_fork = teardown::fork_policy::wait_for_item}), "on_fork"));
  EXPECT_TRUE(refused({.on_work = [](teardown::drive_handle) {}}, "on_work"));
  EXPECT_EQ(thread_count(), before);
  driven_reaper reaper(count_runs{}, driven());  // the defaults are fine
  EXPECT_FALSE(reaper.hurry());
  EXPECT_FALSE(reaper.set_nice(10));  // no thread to apply it to; kept
  EXPECT_EQ(reaper.nice(), 10);
}

TEST(DrivenTest, RunAndFlushFromItsOwnFnAreRefused) {
  fn_reaper* self = nullptr;
  int refused = 0;
  fn_reaper reaper(
      [&](item& x) {
        x.runs.fetch_add(1);
        try {
          (void)self->run();
        } catch (const std::logic_error&) {
          ++refused;
        }
        try {
          self->flush();
        } catch (const std::logic_error&) {
          ++refused;
        }
        EXPECT_TRUE(self->in_own_callback());
      },
      driven());
  self = &reaper;
  item x;
  reaper.enqueue(x);
  EXPECT_EQ(reaper.run().items, 1u);
  EXPECT_EQ(refused, 2);
  EXPECT_FALSE(reaper.in_own_callback());
}

// One level removed: A.run(), A.flush() and A's drive_handle from B's fn inside B.run(), itself
// inside A's run (same reaper type). Each would wait for A's run that encloses it: refused, not a
// deadlock.
TEST(DrivenTest, RunFlushAndHandleInsideAnotherReapersRunInsideOursAreRefused) {
  fn_reaper* a = nullptr;
  fn_reaper* b = nullptr;
  teardown::drive_handle a_handle;
  int refused = 0;
  const auto refused_here = [&](auto&& call) {
    try {
      call();
    } catch (const std::logic_error&) {
      ++refused;
    }
  };
  fn_reaper b_reaper(
      [&](item& x) {
        x.runs.fetch_add(1);
        refused_here([&] { (void)a->run(); });
        refused_here([&] { a->flush(); });
        refused_here([&] { (void)a_handle(); });
        EXPECT_TRUE(a->in_own_callback());
      },
      driven());
  fn_reaper a_reaper(
      [&](item& x) {
        x.runs.fetch_add(1);
        EXPECT_EQ(b->run().items, 1u);
      },
      driven({.on_work = [&](teardown::drive_handle h) { a_handle = h; }}));
  a = &a_reaper;
  b = &b_reaper;
  item in_a;
  item in_b;
  b_reaper.enqueue(in_b);
  a_reaper.enqueue(in_a);
  EXPECT_EQ(a_handle().items, 1u);
  EXPECT_EQ(refused, 3);
  EXPECT_EQ(in_a.runs.load(), 1);
  EXPECT_EQ(in_b.runs.load(), 1);
  EXPECT_FALSE(a_reaper.in_own_callback());
}

TEST(DrivenTest, HandleDoesNothingAfterTheReaperIsDestroyed) {
  teardown::drive_handle kept;
  std::vector<item> all(2);
  {
    driven_reaper reaper(count_runs{}, driven({.on_work = [&](teardown::drive_handle h) { kept = h; }}));
    reaper.enqueue(all[0]);
    EXPECT_EQ(kept({.items = 1}).items, 1u);
    reaper.enqueue(all[1]);
  }
  EXPECT_EQ(kept().items, 0u);
  EXPECT_FALSE(kept().more);
  expect_once_each(all);
  EXPECT_EQ(teardown::drive_handle{}().items, 0u);
}

struct toy_executor {
  std::deque<std::function<void()>> tasks;
  void post(std::function<void()> task) { tasks.push_back(std::move(task)); }
  std::size_t run_all() {
    std::size_t ran = 0;
    while (!tasks.empty()) {
      auto task = std::move(tasks.front());
      tasks.pop_front();
      task();
      ++ran;
    }
    return ran;
  }
};

TEST(DrivenTest, PostToRunsSlicesOnTheExecutor) {
  toy_executor executor;
  std::vector<item> all(10);
  {
    driven_reaper reaper(count_runs{}, driven({.on_work = teardown::post_to(executor, {.items = 3})}));
    for (item& x : all) reaper.enqueue(x);
    EXPECT_EQ(executor.tasks.size(), 1u);
    EXPECT_EQ(executor.run_all(), 4u);  // 3 + 3 + 3 + 1: each slice that leaves more posts again
    expect_once_each(all);
    item late;
    reaper.enqueue(late);
    EXPECT_EQ(executor.tasks.size(), 1u);
    reaper.flush();  // late is torn down here; the posted run finds nothing
    EXPECT_EQ(late.runs.load(), 1);
  }
  EXPECT_EQ(executor.run_all(), 1u);  // after the reaper is gone: harmless
}

TEST(DrivenTest, StressTestConcurrentRunsAndProducersTearDownEachItemOnce) {
  constexpr std::size_t producers = 3, per_producer = 5000;
  std::vector<item> all(producers * per_producer);
  std::atomic<std::uint64_t> total{0};
  driven_reaper reaper(count_runs{&total}, driven());
  std::atomic<bool> done{false};
  std::vector<std::thread> drivers;
  for (int d = 0; d < 2; ++d) {
    drivers.emplace_back([&] {
      while (!done.load()) {
        pollfd p{reaper.work_fd(), POLLIN, 0};
        if (::poll(&p, 1, 1) == 1) (void)reaper.run({.items = 7});
      }
    });
  }
  std::vector<std::thread> adders;
  for (std::size_t t = 0; t < producers; ++t) {
    adders.emplace_back([&, t] {
      for (std::size_t i = 0; i < per_producer; ++i) reaper.enqueue(all[t * per_producer + i]);
      if (t == 0) reaper.flush();
    });
  }
  for (auto& a : adders) a.join();
  reaper.flush();
  done.store(true);
  for (auto& d : drivers) d.join();
  expect_once_each(all);
  EXPECT_EQ(total.load(), all.size());
  EXPECT_EQ(reaper.stats().pending, 0u);
}

TEST(DrivenTest, DeferredDomainCountsWhatItsRunsFree) {
  auto opts = teardown::deferred_domain::default_options();
  opts.reaper.driven = true;
  teardown::deferred_domain domain(opts);
  ASSERT_GE(domain.work_fd(), 0);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(domain.delete_object(new std::vector<char>(1 << 20), [](const auto&) { return 1u << 20; }),
              teardown::decision::queued);
  }
  EXPECT_TRUE(readable(domain.work_fd()));
  EXPECT_EQ(domain.stats().pending, 4u << 20);
  const teardown::drive_result result = domain.run({.items = 3});
  EXPECT_EQ(result.items, 3u);
  EXPECT_TRUE(result.more);
  EXPECT_EQ(domain.stats().reaped, 3u);
  domain.flush();
  const teardown::deferred_stats s = domain.stats();
  EXPECT_EQ(s.queued, 4u);
  EXPECT_EQ(s.reaped, 4u);
  EXPECT_EQ(s.pending, 0u);
  EXPECT_FALSE(domain.worker_stats().running);
}

// run and work_fd are for one reaper: a pool's workers are threads.
template <class Async>
concept drivable = requires(Async& async) {
  async.run();
  async.work_fd();
};
static_assert(drivable<teardown::async_teardown<item, &item::node, unit_traits>>);
static_assert(!drivable<teardown::async_teardown<item, &item::node, unit_traits, teardown::static_key,
                                                 teardown::reaper_pool_workers>>);

TEST(DrivenTest, APoolRefusesDrivenWorkers) {
  teardown::async_teardown_options opts;
  opts.reaper.driven = true;
  opts.pool.workers = 2;
  const std::size_t before = thread_count();
  using pooled = teardown::async_teardown<item, &item::node, unit_traits, teardown::static_key,
                                          teardown::reaper_pool_workers>;
  EXPECT_THROW(pooled{opts}, std::invalid_argument);
  EXPECT_EQ(thread_count(), before);
}

TEST(DrivenTest, AsyncTeardownCountsWhatItsRunsTearDown) {
  teardown::async_teardown_options opts;
  opts.reaper.driven = true;
  teardown::async_teardown<item, &item::node, unit_traits> async(opts);
  std::vector<item> all(3);
  for (item& x : all) EXPECT_EQ(async.put(x), teardown::decision::queued);
  EXPECT_EQ(async.stats().pending, 3u);
  EXPECT_EQ(async.run({.items = 2}).items, 2u);
  EXPECT_EQ(async.stats().reaped, 2u);
  async.flush();
  const teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.queued, 3u);
  EXPECT_EQ(s.reaped, 3u);
  EXPECT_EQ(s.pending, 0u);
  expect_once_each(all);
}

// A fork while another thread is inside run (holding the drive lock): the child's flush,
// enqueue and destructor must not wait for that thread, which does not exist there.
TEST(DrivenTest, ForkChildNeverWaitsForTheDriveLock) {
  std::latch inside(1), release(1);
  bool blocked_once = false;
  fn_reaper reaper(
      [&](item& x) {
        x.runs.fetch_add(1);
        if (!std::exchange(blocked_once, true)) {
          inside.count_down();
          release.wait();
        }
      },
      driven());
  std::vector<item> all(2);
  for (item& x : all) reaper.enqueue(x);
  std::thread driver([&] { (void)reaper.run(); });
  inside.wait();
  const pid_t child = ::fork();
  if (child == 0) {
    item late;
    reaper.flush();
    reaper.enqueue(late);  // the child's stopped form: inline
    reaper.stop();
    ::_exit(late.runs.load() == 1 ? 0 : 3);
  }
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  release.count_down();
  driver.join();
  reaper.flush();
  expect_once_each(all);
}

}  // namespace
