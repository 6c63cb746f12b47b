// Specification of teardown::reaper across fork(): the child, whose worker does not exist,
// turns the reaper into its stopped form. Every item it enqueues is torn down exactly once
// (inline, on the child's thread), so is everything queued at fork time, and nothing
// deadlocks: not enqueue, flush, stop, freeze/thaw, nor the destructor. The parent's reaper
// keeps working. With fork_policy::never_wait (the default) fork() waits for nothing of the
// worker's, and the child leaves what the worker had taken to the parent, unread; with
// fork_policy::wait_for_item fork() parks the worker between items and the child tears down
// the rest of its batch too. ReaperForkStressTest forks while another thread keeps
// enqueueing, or while the worker drains a backlog, under both policies.
//
// A child reports through its exit code (0: as specified; otherwise it prints what failed to
// stderr first) and leaves with _exit, so that nothing of the parent (gtest, other threads'
// objects) runs in it. The parent waits for it with a time limit that is a hang guard, not a
// time assertion: a child still running after it is killed and the test fails ("the child
// deadlocked"). Bounded by counts; nothing asserts a time.
#include "teardown/reaper.hpp"
#include "teardown/reaper_pool.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <latch>
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fork_test_support.hpp"
#include "reaper_test_support.hpp"
#include "test_support.hpp"

namespace teardown_test {
namespace {

using namespace reaper_support;
using teardown::fork_policy;

// The options of a reaper whose fork() parks the worker (fork_policy::wait_for_item).
teardown::reaper_options parking(teardown::reaper_options opts = {}) {
  opts.on_fork = fork_policy::wait_for_item;
  return opts;
}

class ReaperForkTest : public ::testing::Test {
 private:
  hang_guard guard_{current_test_name()};
};
using ReaperForkStressTest = ReaperForkTest;

// The parent's reaper still works after a fork: a few enqueue/flush rounds on items of its own.
void expect_parent_reaper_works(job_reaper& reaper) {
  auto jobs = make_jobs(100);
  for (job& j : jobs) {
    reaper.enqueue(j);
    if (j.id % 10 == 9) reaper.flush();
  }
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size()) << "in the parent, after fork";
  EXPECT_TRUE(reaper.stats().running);
}

// --- Fork handlers read no item ------------------------------------------------------------------

// Jobs in a mapping of their own, which can be made inaccessible: a fork handler that reads or
// writes any of them (walks a batch, re-queues it item by item) faults.
class guarded_jobs {
 public:
  explicit guarded_jobs(std::size_t count)
      : count_(count), bytes_(round_up(count * sizeof(job))),
        memory_(mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)) {
    if (memory_ == MAP_FAILED) throw std::runtime_error("guarded_jobs: mmap failed");
    jobs_ = static_cast<job*>(memory_);
    for (std::size_t i = 0; i < count_; ++i) new (&jobs_[i]) job;
    for (std::size_t i = 0; i < count_; ++i) jobs_[i].id = i;
  }
  guarded_jobs(const guarded_jobs&) = delete;
  guarded_jobs& operator=(const guarded_jobs&) = delete;
  ~guarded_jobs() {
    for (std::size_t i = 0; i < count_; ++i) jobs_[i].~job();
    munmap(memory_, bytes_);
  }

  job& operator[](std::size_t i) { return jobs_[i]; }
  std::size_t size() const { return count_; }
  std::size_t ran_exactly_once() const {
    return static_cast<std::size_t>(
        std::count_if(jobs_, jobs_ + count_, [](const job& j) { return j.runs.load() == 1; }));
  }
  int total_runs() const {
    int total = 0;
    for (std::size_t i = 0; i < count_; ++i) total += jobs_[i].runs.load();
    return total;
  }
  void protect(int prot) const { (void)mprotect(memory_, bytes_, prot); }

 private:
  static std::size_t round_up(std::size_t bytes) {
    const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    return (bytes + page - 1) / page * page;
  }
  std::size_t count_;
  std::size_t bytes_;
  void* memory_;
  job* jobs_ = nullptr;
};

// The jobs to make inaccessible across the next fork (nullptr: none): in the parent, while
// the fork handlers run (only with parked workers: a running one would fault), or only in the
// child, while teardown's child handler runs.
std::atomic<const guarded_jobs*> guarded_across_fork{nullptr};
std::atomic<const guarded_jobs*> guarded_in_child{nullptr};

// pthread_atfork runs prepare handlers in reverse order of registration and the parent's and
// child's in order of registration. These are registered during static initialization, before
// the first reaper registers teardown's handlers: this prepare runs after teardown's (every
// worker parked between items, none reading an item), and this child handler before
// teardown's. The parent's handler lifts the guard before teardown's resumes the workers.
void guard_prepare() {
  if (const guarded_jobs* jobs = guarded_across_fork.load()) jobs->protect(PROT_NONE);
}
void guard_parent() {
  if (const guarded_jobs* jobs = guarded_across_fork.load()) jobs->protect(PROT_READ | PROT_WRITE);
}
void guard_child() {
  if (const guarded_jobs* jobs = guarded_in_child.load()) jobs->protect(PROT_NONE);
}
[[maybe_unused]] const int guard_registered = pthread_atfork(&guard_prepare, &guard_parent, &guard_child);

// Registered after teardown's (call it once a reaper exists): in the child, lifts the guard
// after teardown's handler.
void register_child_unguard() {
  static const int registered = pthread_atfork(nullptr, nullptr, [] {
    if (const guarded_jobs* jobs = guarded_across_fork.load()) jobs->protect(PROT_READ | PROT_WRITE);
    if (const guarded_jobs* jobs = guarded_in_child.load()) jobs->protect(PROT_READ | PROT_WRITE);
  });
  (void)registered;
}

// fork_policy::wait_for_item: fork() while a worker is in the middle of a batch of guarded
// jobs: teardown's fork handlers run while the jobs are inaccessible, so one that reads a job
// kills the child (SIGSEGV). The child then tears the rest of the batch down, each job exactly
// once, and so does the parent.
// `enqueue_batch` queues the jobs so that one worker takes them whole; the one it makes the
// oldest (the blocker, not guarded) blocks until the fork waits for the worker. Child exit code
// 2: the worker had finished the batch before the fork asked it to park (a weaker run).
template <class Reaper, class EnqueueBatch>
void fork_reads_no_item_held_or_queued(Reaper& reaper, guarded_jobs& jobs, job& blocker, std::latch& release,
                                       std::atomic<bool>& started, EnqueueBatch enqueue_batch) {
  register_child_unguard();
  enqueue_batch();
  wait_until(started);
  guarded_across_fork.store(&jobs);
  std::atomic<pid_t> forker_tid{0};
  pid_t child = -1;
  std::thread forker([&] {
    forker_tid.store(current_tid());
    child = start_child([&] {
      child_checks check;
      const int ran_at_fork = jobs.total_runs();
      reaper.flush();
      check.expect(jobs.ran_exactly_once() == jobs.size(), "the child tore down every guarded job once");
      check.expect(blocker.runs.load() == 1, "the blocker ran once, before the fork");
      reaper.stop();
      if (check.exit_code() != 0) return check.exit_code();
      return ran_at_fork < static_cast<int>(jobs.size()) ? 0 : 2;
    });
  });
  while (forker_tid.load() == 0) std::this_thread::yield();
  wait_until_asleep(forker_tid.load());  // in fork(), waiting for the blocker
  release.count_down();
  forker.join();
  guarded_across_fork.store(nullptr);
  const int code = wait_child(child);
  EXPECT_TRUE(code == 0 || code == 2) << "child exit code " << code << " (killed by SIGSEGV: a fork handler "
                                      << "read a job)";
  if (code == 2) std::printf("note: the worker was not parked mid-batch at fork time this run\n");
  reaper.flush();
  EXPECT_EQ(jobs.ran_exactly_once(), jobs.size()) << "in the parent";
  EXPECT_EQ(blocker.runs.load(), 1);
}

// fn for the tests above: the blocker reports and waits; a guarded job takes a little while, so
// that the fork finds the worker in the middle of the batch.
job_fn blocker_then_slow(job& blocker, std::latch& release, std::atomic<bool>& started) {
  return [&](job& j) {
    if (&j == &blocker) {
      started.store(true);
      release.wait();
    } else {
      std::this_thread::sleep_for(200us);
    }
    j.runs.fetch_add(1, std::memory_order_relaxed);
  };
}

TEST_F(ReaperForkTest, ForkHandlersReadNoItemTheParkedWorkerHolds) {
  guarded_jobs jobs(200);
  job blocker;
  std::latch release(1);
  std::atomic<bool> started{false};
  job_reaper reaper(blocker_then_slow(blocker, release, started), parking());
  fork_reads_no_item_held_or_queued(reaper, jobs, blocker, release, started, [&] {
    reaper.freeze();
    reaper.enqueue(blocker);
    for (std::size_t i = 0; i < jobs.size(); ++i) reaper.enqueue(jobs[i]);
    reaper.thaw();
  });
}

TEST_F(ReaperForkTest, ForkHandlersReadNoItemAPoolsParkedWorkersHoldOrQueue) {
  guarded_jobs jobs(200);
  job blocker;
  std::latch release(1);
  std::atomic<bool> started{false};
  teardown::reaper_pool_options opts;
  opts.workers = 2;
  opts.steal_after = std::chrono::hours(1);  // no steal from a held batch: the fork finds it held
  opts.worker.name = "fork_pool";
  opts.worker.on_fork = fork_policy::wait_for_item;
  teardown::reaper_pool<job, &job::hook, job_fn> pool(blocker_then_slow(blocker, release, started), opts);
  fork_reads_no_item_held_or_queued(pool, jobs, blocker, release, started, [&] {
    pool.freeze();
    pool.enqueue_to(0, blocker);
    for (std::size_t i = 0; i < jobs.size(); ++i) pool.enqueue_to(i % 3 == 0 ? 1 : 0, jobs[i]);
    pool.thaw();
  });
}

// --- The child ---------------------------------------------------------------------------------

// Leaves the worker frozen with `backlog` queued: what a fork finds queued.
void enqueue_frozen(job_reaper& reaper, std::vector<job>& backlog) {
  reaper.freeze();
  for (job& j : backlog) reaper.enqueue(j);
}

// After the child is done: the parent's reaper, thawed, tears its own copies down exactly once.
void expect_parent_tears_down_its_backlog(job_reaper& reaper, const std::vector<job>& backlog) {
  reaper.thaw();
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(backlog), backlog.size()) << "the parent tears down its own copies once";
}

TEST_F(ReaperForkTest, ChildTearsDownEachItemItEnqueuesExactlyOnceOnItsOwnThread) {
  auto parent_jobs = make_jobs(10);
  auto child_jobs = make_jobs(100);
  std::vector<pid_t> fn_tids(child_jobs.size(), 0);
  job_reaper reaper([&](job& j) {
    j.runs.fetch_add(1, std::memory_order_relaxed);
    if (j.id < fn_tids.size()) fn_tids[j.id] = current_tid();
  });
  for (job& j : parent_jobs) reaper.enqueue(j);
  reaper.flush();

  const int code = run_child([&] {
    child_checks check;
    check.expect(!reaper.stats().running, "stats().running is false in the child");
    for (job& j : child_jobs) {
      reaper.enqueue(j);
      check.expect(j.runs.load() == 1, "item " + std::to_string(j.id) + " torn down before enqueue returned");
      check.expect(fn_tids[j.id] == current_tid(), "item " + std::to_string(j.id) + " torn down on the child's thread");
    }
    reaper.flush();
    check.expect(reaper.flush_for(0ms), "flush_for returns true");
    reaper.stop();
    reaper.stop();
    check.expect(ran_exactly_once(child_jobs) == child_jobs.size(), "every child item ran exactly once");
    check.expect(ran_exactly_once(parent_jobs) == parent_jobs.size(), "parent items did not run again");
    const teardown::reaper_stats stats = reaper.stats();
    check.expect(stats.pending == 0, "nothing pending");
    check.expect(stats.inline_reaped == child_jobs.size(), "the child's items were torn down inline");
    return check.exit_code();
  });
  EXPECT_EQ(code, child_ok);
  EXPECT_EQ(total_runs(child_jobs), 0) << "the child's teardowns happened in the child only";
  expect_parent_reaper_works(reaper);
}

// Frozen at fork: the backlog is in the queue. The child's next enqueue, flush, stop (or
// destructor) takes it.
TEST_F(ReaperForkTest, ChildEnqueueTearsDownTheBacklogQueuedAtForkTime) {
  auto backlog = make_jobs(50);
  auto child_jobs = make_jobs(3);
  job_reaper reaper(counting());
  enqueue_frozen(reaper, backlog);

  const int code = run_child([&] {
    child_checks check;
    check.expect(total_runs(backlog) == 0, "the backlog had not run at fork time");
    reaper.enqueue(child_jobs[0]);
    check.expect(ran_exactly_once(backlog) == backlog.size(), "the child's first enqueue tore down the backlog once");
    reaper.enqueue(child_jobs[1]);
    reaper.flush();
    reaper.enqueue(child_jobs[2]);
    reaper.stop();
    check.expect(ran_exactly_once(backlog) == backlog.size(), "the backlog ran once");
    check.expect(ran_exactly_once(child_jobs) == child_jobs.size(), "the child's items ran once");
    check.expect(reaper.stats().pending == 0, "nothing pending");
    return check.exit_code();
  });
  EXPECT_EQ(code, child_ok);

  EXPECT_EQ(total_runs(backlog), 0) << "the parent is still frozen";
  expect_parent_tears_down_its_backlog(reaper, backlog);
  expect_parent_reaper_works(reaper);
}

TEST_F(ReaperForkTest, ChildFlushTearsDownTheBacklogQueuedAtForkTime) {
  auto backlog = make_jobs(50);
  job_reaper reaper(counting());
  enqueue_frozen(reaper, backlog);
  const int code = run_child([&] {
    child_checks check;
    reaper.flush();
    check.expect(ran_exactly_once(backlog) == backlog.size(), "flush tore down the backlog once");
    reaper.flush();
    check.expect(ran_exactly_once(backlog) == backlog.size(), "a second flush ran nothing again");
    return check.exit_code();
  });
  EXPECT_EQ(code, child_ok);
  expect_parent_tears_down_its_backlog(reaper, backlog);
}

TEST_F(ReaperForkTest, ChildStopTearsDownTheBacklogQueuedAtForkTime) {
  auto backlog = make_jobs(50);
  job_reaper reaper(counting());
  enqueue_frozen(reaper, backlog);
  const int code = run_child([&] {
    child_checks check;
    reaper.stop();
    check.expect(ran_exactly_once(backlog) == backlog.size(), "stop tore down the backlog once");
    return check.exit_code();
  });
  EXPECT_EQ(code, child_ok);
  expect_parent_tears_down_its_backlog(reaper, backlog);
}

// The child leaves the reaper's scope normally (a child that returns from its function, or runs
// static destructors): the destructor must neither hang nor lose the backlog.
TEST_F(ReaperForkTest, ChildMayDestroyTheReaperWhichTearsDownTheBacklog) {
  auto backlog = make_jobs(50);
  std::optional<job_reaper> reaper(std::in_place, counting());
  reaper->freeze();
  for (job& j : backlog) reaper->enqueue(j);
  const int code = run_child([&] {
    child_checks check;
    reaper.reset();
    check.expect(ran_exactly_once(backlog) == backlog.size(), "the destructor tore down the backlog once");
    return check.exit_code();
  });
  EXPECT_EQ(code, child_ok);
  reaper->thaw();
  reaper->flush();
  EXPECT_EQ(ran_exactly_once(backlog), backlog.size());
}

// A stopped reaper drains its queue on the producer of a chain, inside a hand that a flush
// waits out. A producer caught inside such a teardown when fork() copied memory is not in the
// child: its hand must not hold the child's flush or stop for good. Its item is the parent's.
TEST_F(ReaperForkTest, ChildFlushDoesNotWaitForTheHandOfAProducerThatIsNotThere) {
  auto jobs = make_jobs(3);
  std::latch release(1);
  std::atomic<bool> started{false};
  job_reaper reaper(first_item_blocks(release, started));
  reaper.stop();
  std::thread producer([&] {  // a chain: the producer drains the queue with it, inside a hand
    teardown::llist_chain<job, &job::hook> chain;
    chain.push_back(jobs[0]);
    reaper.enqueue_chain(std::move(chain));  // tears job 0 down here, and blocks in it
  });
  while (!started.load()) std::this_thread::sleep_for(1ms);
  const int code = run_child([&] {
    reaper.enqueue(jobs[1]);
    reaper.flush();
    reaper.enqueue(jobs[2]);
    reaper.stop();
    CHILD_CHECK(jobs[1].runs.load() == 1 && jobs[2].runs.load() == 1);
    CHILD_CHECK(jobs[0].runs.load() == 0);
    return child_ok;
  });
  release.count_down();
  producer.join();
  EXPECT_EQ(code, child_ok);
  EXPECT_EQ(jobs[0].runs.load(), 1) << "in the parent";
  EXPECT_EQ(jobs[1].runs.load() + jobs[2].runs.load(), 0) << "the child's items ran in the parent";
}

// A boost in force is the parent worker's: the child, which has no worker, reports none.
// (The worker is held inside an item, so that it does not find its queue empty and lower
// itself back meanwhile.)
TEST_F(ReaperForkTest, AChildOfABoostedWorkerReportsNoBoost) {
  auto jobs = make_jobs(1);
  std::latch release(1);
  std::atomic<bool> started{false};
  job_reaper reaper(first_item_blocks(release, started));
  reaper.enqueue(jobs[0]);
  while (!started.load()) std::this_thread::sleep_for(1ms);
  const bool raised = reaper.boost();
  int code = child_ok;
  if (raised) {
    EXPECT_TRUE(reaper.stats().boosted);
    code = run_child([&] {
      CHILD_CHECK(!reaper.stats().boosted);
      return child_ok;
    });
    EXPECT_TRUE(reaper.stats().boosted) << "in the parent";
  }
  release.count_down();
  reaper.flush();
  EXPECT_EQ(code, child_ok);
  if (!raised) GTEST_SKIP() << "this process may not raise the worker (no CAP_SYS_NICE)";
}

TEST_F(ReaperForkTest, ChildMayFreezeAndThaw) {
  auto child_jobs = make_jobs(2);
  job_reaper reaper(counting());
  const int code = run_child([&] {
    child_checks check;
    reaper.freeze();
    reaper.thaw();
    reaper.enqueue(child_jobs[0]);
    reaper.flush();
    reaper.enqueue(child_jobs[1]);
    check.expect(ran_exactly_once(child_jobs) == child_jobs.size(), "the child's items ran once");
    return check.exit_code();
  });
  EXPECT_EQ(code, child_ok);
  expect_parent_reaper_works(reaper);
}

// fork_policy::wait_for_item: fork() from a thread while the worker is in the middle of an item
// of a batch: the prepare handler waits for the item to finish, the worker parks holding the rest of the batch, and the
// child tears that rest down. The child exits with 0 when it saw the worker parked mid-batch.
TEST_F(ReaperForkTest, ForkWaitsForTheItemInFlightAndTheChildTearsDownTheRestOfTheBatch) {
  auto batch = make_jobs(20);
  std::latch release(1);
  std::atomic<bool> started{false};
  job_reaper reaper(first_item_blocks(release, started), parking());
  enqueue_as_one_batch(reaper, batch);  // one batch of 20; item 0 blocks
  wait_until(started);

  std::atomic<pid_t> forker_tid{0};
  pid_t child = -1;
  std::thread forker([&] {
    forker_tid.store(current_tid());
    child = start_child([&] {
      child_checks check;
      check.expect(batch[0].runs.load() == 1, "the item in flight finished before the fork");
      const int ran_at_fork = total_runs(batch);
      reaper.flush();
      check.expect(ran_exactly_once(batch) == batch.size(), "the child tore down the rest of the batch once");
      if (check.exit_code() != 0) return check.exit_code();
      return ran_at_fork == 1 ? 0 : 2;  // 2: the worker had not parked mid-batch (a weaker run)
    });
  });
  while (forker_tid.load() == 0) std::this_thread::yield();
  wait_until_asleep(forker_tid.load());  // in fork(), waiting for item 0
  release.count_down();
  forker.join();
  const int code = wait_child(child);
  EXPECT_TRUE(code == 0 || code == 2) << "child exit code " << code;
  if (code == 2) std::printf("note: the worker was not parked mid-batch at fork time this run\n");
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(batch), batch.size());
  expect_parent_reaper_works(reaper);
}

// fork_policy::wait_for_item: fn enqueues from the worker (its first enqueue on that thread
// takes sharded_counter's shard registry mutex) while a fork() waits for that very item: the
// fork handlers must not hold that mutex while they wait for the worker.
TEST_F(ReaperForkTest, ForkWaitingForAnItemWhoseFnEnqueuesDoesNotDeadlock) {
  auto jobs = make_jobs(2);
  std::latch release(1);
  std::atomic<bool> started{false};
  job_reaper* self = nullptr;  // published to the worker by the first enqueue
  job_reaper reaper([&](job& j) {
    if (j.id == 0) {
      started.store(true);
      release.wait();
      self->enqueue(jobs[1]);
    }
    j.runs.fetch_add(1, std::memory_order_relaxed);
  }, parking());
  self = &reaper;
  reaper.enqueue(jobs[0]);
  wait_until(started);

  std::atomic<pid_t> forker_tid{0};
  pid_t child = -1;
  std::thread forker([&] {
    forker_tid.store(current_tid());
    child = start_child([&] {
      child_checks check;
      reaper.flush();
      check.expect(ran_exactly_once(jobs) == jobs.size(), "both items ran once in the child");
      return check.exit_code();
    });
  });
  while (forker_tid.load() == 0) std::this_thread::yield();
  wait_until_asleep(forker_tid.load());
  release.count_down();
  forker.join();  // the hang guard reports a deadlock here
  EXPECT_EQ(wait_child(child), child_ok);
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
}

// --- fork_policy::never_wait: fork() waits for nothing of the worker's ----------------------------

// Jobs whose ids start at `first_id`: none is the one that first_item_blocks blocks on.
std::vector<job> jobs_from(std::size_t first_id, std::size_t count) {
  auto jobs = make_jobs(count);
  for (job& j : jobs) j.id += first_id;
  return jobs;
}

// fork() on this thread while item 0 of a batch blocks in fn: it returns at once (with parking
// it would wait for the item: the hang guard reports that). The child tears down what was
// queued and leaves the batch the worker had taken, item 0 and its rest, to the parent.
TEST_F(ReaperForkTest, ForkDoesNotWaitForTheItemInFlightAndTheChildLeavesTheBatchToTheParent) {
  auto batch = make_jobs(20);
  auto queued = jobs_from(100, 10);
  std::latch release(1);
  std::atomic<bool> started{false};
  job_reaper reaper(first_item_blocks(release, started));
  enqueue_as_one_batch(reaper, batch);  // one batch of 20; item 0 blocks
  wait_until(started);
  for (job& j : queued) reaper.enqueue(j);  // on the queue: the worker is in fn

  const int code = run_child([&] {
    child_checks check;
    reaper.flush();
    check.expect(total_runs(batch) == 0, "the child left the worker's batch (the item in fn, the rest) alone");
    check.expect(ran_exactly_once(queued) == queued.size(), "the child tore down what was queued, once");
    auto own = jobs_from(200, 5);
    for (job& j : own) reaper.enqueue(j);
    reaper.stop();
    check.expect(ran_exactly_once(own) == own.size(), "the child's own items ran once");
    check.expect(total_runs(batch) == 0, "the child's stop left the batch alone too");
    return check.exit_code();
  });
  EXPECT_EQ(code, child_ok);
  EXPECT_EQ(total_runs(batch), 0) << "item 0 still blocks in the parent";
  release.count_down();
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(batch), batch.size()) << "the parent tears down its batch once";
  EXPECT_EQ(ran_exactly_once(queued), queued.size());
  expect_parent_reaper_works(reaper);
}

// The same in a pool: worker 0 blocks in fn with the rest of its batch held for stealing, and
// worker 1 blocks in fn too (so it steals nothing from worker 0's queue before worker 0 takes
// it: a worker steals only when its own queue is empty).
TEST_F(ReaperForkTest, ForkDoesNotWaitForAPoolWorkersItemAndTheChildLeavesItsHeldRestToTheParent) {
  auto batch = make_jobs(20);
  job other_blocker;  // id 0: blocks as batch[0] does
  std::latch release(1);
  std::atomic<int> started{0};
  teardown::reaper_pool_options opts;
  opts.workers = 2;
  opts.steal_after = std::chrono::hours(1);  // the rest stays held by worker 0
  opts.worker.name = "fork_pool";
  teardown::reaper_pool<job, &job::hook, job_fn> pool(
      [&](job& j) {
        if (j.id == 0) {
          started.fetch_add(1);
          release.wait();
        }
        j.runs.fetch_add(1, std::memory_order_relaxed);
      },
      opts);
  pool.freeze();
  for (job& j : batch) pool.enqueue_to(0, j);
  pool.enqueue_to(1, other_blocker);
  pool.thaw();
  while (started.load() < 2) std::this_thread::yield();

  const int code = run_child([&] {
    child_checks check;
    pool.flush();
    check.expect(total_runs(batch) == 0, "the child left worker 0's batch alone");
    check.expect(other_blocker.runs.load() == 0, "and worker 1's item in fn");
    auto own = jobs_from(100, 10);
    for (job& j : own) pool.enqueue(j);
    pool.flush();
    check.expect(ran_exactly_once(own) == own.size(), "the child's own items ran once");
    return check.exit_code();
  });
  EXPECT_EQ(code, child_ok);
  release.count_down();
  pool.flush();
  EXPECT_EQ(ran_exactly_once(batch), batch.size()) << "the parent tears down its batch once";
  EXPECT_EQ(other_blocker.runs.load(), 1);
}

// The child handler forgets the running worker's batch unread: the batch's jobs are
// inaccessible in the child while teardown's child handler runs (a handler that walked the
// batch would kill the child with SIGSEGV), and the child's flush runs none of them.
TEST_F(ReaperForkTest, ForkChildHandlerReadsNoItemTheRunningWorkerHolds) {
  register_child_unguard();
  guarded_jobs jobs(200);
  job blocker;
  std::latch release(1);
  std::atomic<bool> started{false};
  job_reaper reaper(blocker_then_slow(blocker, release, started));
  reaper.freeze();
  reaper.enqueue(blocker);  // the oldest: it runs first, and blocks
  for (std::size_t i = 0; i < jobs.size(); ++i) reaper.enqueue(jobs[i]);
  reaper.thaw();
  wait_until(started);
  guarded_in_child.store(&jobs);
  const int code = run_child([&] {
    child_checks check;
    reaper.flush();
    check.expect(jobs.total_runs() == 0, "the child ran none of the worker's batch");
    check.expect(blocker.runs.load() == 0, "nor the item in fn");
    return check.exit_code();
  });
  guarded_in_child.store(nullptr);
  EXPECT_EQ(code, child_ok) << "(killed by SIGSEGV: the child handler read a job)";
  release.count_down();
  reaper.flush();
  EXPECT_EQ(jobs.ran_exactly_once(), jobs.size()) << "in the parent";
  EXPECT_EQ(blocker.runs.load(), 1);
}

TEST_F(ReaperForkTest, EveryLiveReaperIsUsableInTheChild) {
  auto first_jobs = make_jobs(20);
  auto second_jobs = make_jobs(20);
  job_reaper first(counting());
  job_reaper second(counting(), {.spin_polls = 0});
  second.freeze();
  const int code = run_child([&] {
    child_checks check;
    for (std::size_t i = 0; i < 20; ++i) {
      first.enqueue(first_jobs[i]);
      second.enqueue(second_jobs[i]);
    }
    first.flush();
    second.flush();
    check.expect(ran_exactly_once(first_jobs) == 20, "the first reaper's items ran once");
    check.expect(ran_exactly_once(second_jobs) == 20, "the second reaper's items ran once");
    return check.exit_code();
  });
  EXPECT_EQ(code, child_ok);
  second.thaw();
  expect_parent_reaper_works(first);
  expect_parent_reaper_works(second);
}

TEST_F(ReaperForkTest, ForkOfAStoppedReaperLeavesItStoppedInBoth) {
  auto child_jobs = make_jobs(5);
  auto parent_jobs = make_jobs(5);
  job_reaper reaper(counting());
  reaper.stop();
  const int code = run_child([&] {
    child_checks check;
    for (job& j : child_jobs) reaper.enqueue(j);
    check.expect(ran_exactly_once(child_jobs) == child_jobs.size(), "inline in the child");
    return check.exit_code();
  });
  EXPECT_EQ(code, child_ok);
  for (job& j : parent_jobs) reaper.enqueue(j);
  EXPECT_EQ(ran_exactly_once(parent_jobs), parent_jobs.size()) << "inline in the parent";
}

TEST_F(ReaperForkTest, RepeatedForksLeaveTheParentReaperWorking) {
  job_reaper reaper(counting(), {.spin_polls = 0});
  for (int round = 0; round < 10; ++round) {
    auto jobs = make_jobs(5);
    EXPECT_EQ(run_child([&] {
                for (job& j : jobs) reaper.enqueue(j);
                return ran_exactly_once(jobs) == jobs.size() ? 0 : 1;
              }),
              child_ok);
    for (job& j : jobs) reaper.enqueue(j);
    reaper.flush();
    EXPECT_EQ(ran_exactly_once(jobs), jobs.size()) << "round " << round;
  }
}

// A child forked from inside fn (on the worker) may only _exit (or exec); an enqueue there tears
// down inline, since no worker is there to take it. The parent's reaper goes on.
TEST_F(ReaperForkTest, ChildForkedFromFnMayExit) {
  auto jobs = make_jobs(4);
  std::atomic<int> child_code{-1};
  job_reaper* enqueue_in_child = nullptr;
  job_reaper reaper([&](job& j) {
    j.runs.fetch_add(1, std::memory_order_relaxed);
    if (j.id == 0) {
      const pid_t pid = fork();
      if (pid == 0) {
        enqueue_in_child->enqueue(jobs[3]);
        _exit(jobs[3].runs.load() == 1 ? 7 : 8);  // 8: queued for a worker the child has not
      }
      int status = 0;
      waitpid(pid, &status, 0);
      child_code.store(WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    }
  });
  enqueue_in_child = &reaper;
  for (std::size_t i = 0; i < 3; ++i) reaper.enqueue(jobs[i]);
  reaper.flush();
  EXPECT_EQ(child_code.load(), 7) << "8: the child's enqueue left its item queued";
  EXPECT_EQ(jobs[3].runs.load(), 0);  // the child's copy ran, not the parent's
  jobs.pop_back();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size());
  expect_parent_reaper_works(reaper);
}

// --- Forks racing producers --------------------------------------------------------------------

// In a child, after a flush: how the items of one producer's stream (in id order) ran. Each ran
// at most once, and those that did not run before `enqueued_before_fork` form at most `gaps`
// contiguous runs: with wait_for_item none (everything enqueued before the fork was done, queued
// or held by the parked worker, and the child ran it), with never_wait one, the batch the
// worker had taken (one take is the whole queue: a contiguous range of the stream).
void expect_runs_in_stream_order(child_checks& check, const std::vector<job>& jobs, std::size_t enqueued_before_fork,
                                 std::size_t gaps) {
  std::size_t gaps_seen = 0;
  bool in_gap = false;
  for (std::size_t i = 0; i < enqueued_before_fork && i < jobs.size(); ++i) {
    const int runs = jobs[i].runs.load();
    if (runs > 1) {
      check.expect(false, "item " + std::to_string(i) + " ran " + std::to_string(runs) + " times");
      return;
    }
    if (runs == 0 && !in_gap) ++gaps_seen;
    in_gap = runs == 0;
  }
  for (std::size_t i = enqueued_before_fork; i < jobs.size(); ++i) {
    if (jobs[i].runs.load() > 1) {
      check.expect(false, "item " + std::to_string(i) + " ran more than once");
      return;
    }
  }
  check.expect(gaps_seen <= gaps, std::to_string(gaps_seen) + " runs of items enqueued before the fork did not "
                                      "run in the child; at most " + std::to_string(gaps) + " may not");
}

// One thread keeps enqueueing items in id order while this one forks. In each child, after a
// flush, every item ran at most once, and the items enqueued before the fork that did not run
// are what the policy leaves to the parent (expect_runs_in_stream_order). The child then
// enqueues items of its own.
void fork_while_another_thread_keeps_enqueueing(fork_policy policy) {
  const std::size_t count = scaled(200'000);
  constexpr int forks = 5;
  auto jobs = make_jobs(count);
  job_reaper reaper(counting(), {.on_fork = policy});
  std::atomic<std::size_t> enqueued{0};
  std::thread producer([&] {
    for (std::size_t i = 0; i < count; ++i) {
      reaper.enqueue(jobs[i]);
      enqueued.store(i + 1, std::memory_order_release);
    }
  });
  int forked = 0;
  for (int f = 0; f < forks; ++f) {
    // Fork at spread-out points of the stream (a fork after the producer ended is still valid).
    while (enqueued.load(std::memory_order_acquire) < count * static_cast<std::size_t>(f + 1) / (forks + 1) &&
           enqueued.load(std::memory_order_acquire) < count) {
      std::this_thread::yield();
    }
    const std::size_t enqueued_before_fork = enqueued.load(std::memory_order_acquire);
    const int code = run_child([&] {
      child_checks check;
      reaper.flush();
      expect_runs_in_stream_order(check, jobs, enqueued_before_fork, policy == fork_policy::never_wait ? 1 : 0);
      auto own = make_jobs(100);
      for (job& j : own) reaper.enqueue(j);
      reaper.flush();
      check.expect(ran_exactly_once(own) == own.size(), "the child's own items ran once");
      return check.exit_code();
    });
    EXPECT_EQ(code, child_ok) << "fork " << f;
    ++forked;
  }
  producer.join();
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size()) << "in the parent";
  EXPECT_EQ(forked, forks);
}

TEST_F(ReaperForkStressTest, ForkWhileAnotherThreadKeepsEnqueueing) {
  fork_while_another_thread_keeps_enqueueing(fork_policy::never_wait);
}

TEST_F(ReaperForkStressTest, ForkParkingTheWorkerWhileAnotherThreadKeepsEnqueueing) {
  fork_while_another_thread_keeps_enqueueing(fork_policy::wait_for_item);
}

// The worker is busy with one long batch when each fork happens. wait_for_item: it parks between
// items holding the rest of its batch and the child tears that down. never_wait: the child
// leaves the whole batch to the parent. Either way the parent resumes and nothing runs twice.
void fork_while_the_worker_is_busy_with_a_backlog(fork_policy policy) {
  const std::size_t count = scaled(50'000);
  constexpr int forks = 5;
  auto jobs = make_jobs(count);
  std::atomic<std::size_t> done{0};
  job_reaper reaper(
      [&](job& j) {
        j.runs.fetch_add(1, std::memory_order_relaxed);
        done.fetch_add(1, std::memory_order_relaxed);
      },
      {.on_fork = policy});
  reaper.freeze();
  for (job& j : jobs) reaper.enqueue(j);
  reaper.thaw();
  for (int f = 0; f < forks; ++f) {
    while (done.load() < count * static_cast<std::size_t>(f + 1) / (forks + 1)) std::this_thread::yield();
    const int code = run_child([&] {
      child_checks check;
      reaper.flush();
      if (policy == fork_policy::wait_for_item) {
        check.expect(ran_exactly_once(jobs) == jobs.size(), "every item ran exactly once in the child");
      } else {
        expect_runs_in_stream_order(check, jobs, jobs.size(), 1);
      }
      auto own = make_jobs(10);
      for (job& j : own) reaper.enqueue(j);
      check.expect(ran_exactly_once(own) == own.size(), "the child's own items ran once");
      return check.exit_code();
    });
    EXPECT_EQ(code, child_ok) << "fork " << f;
  }
  reaper.flush();
  EXPECT_EQ(ran_exactly_once(jobs), jobs.size()) << "in the parent";
}

TEST_F(ReaperForkStressTest, ForkWhileTheWorkerIsBusyWithABacklog) {
  fork_while_the_worker_is_busy_with_a_backlog(fork_policy::never_wait);
}

TEST_F(ReaperForkStressTest, ForkParkingTheWorkerWhileItIsBusyWithABacklog) {
  fork_while_the_worker_is_busy_with_a_backlog(fork_policy::wait_for_item);
}

}  // namespace
}  // namespace teardown_test
