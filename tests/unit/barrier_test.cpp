// flush() and stop() as barriers under schedules that the friendly ones of a 2-CPU stress never
// produce. Each test forces one interleaving: a thread is paused at a chosen point through the
// library's own customisation points (the reaper's Queue parameter, sharded_llist's Atomics
// parameter, a teardown function that blocks) and released when the others have reached theirs.
// The library code itself is unchanged. What each checks is behaviour: an item enqueued before
// flush() (or stop()) was called is torn down, exactly once, when the call returns; a fork() is
// not held up by a teardown function that calls nice(); one emit calls a hook once.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "fork_test_support.hpp"
#include "reaper_test_support.hpp"
#include "teardown/reaper.hpp"
#include "teardown/sharded_llist.hpp"
#include "teardown/trace.hpp"
#include "test_support.hpp"

namespace {

using namespace std::chrono_literals;
using namespace teardown_test::reaper_support;
using teardown_test::child_checks;
using teardown_test::child_ok;
using teardown_test::run_child;
using teardown::llist;
using teardown::llist_batch;

// A point where one thread waits until the test lets it go on.
class pause_point {
 public:
  // On the paused thread: announces arrival, then waits for release().
  void arrive_and_wait() {
    std::unique_lock lock(mutex_);
    arrived_ = true;
    changed_.notify_all();
    changed_.wait(lock, [&] { return released_; });
  }
  void wait_for_arrival() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return arrived_; });
  }
  void release() {
    const std::lock_guard lock(mutex_);
    released_ = true;
    changed_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool arrived_ = false;
  bool released_ = false;
};

// Returns once `done` is set or thread `tid` sleeps (two samples 5 ms apart): a thread blocked
// in flush() or stop(), or one that already returned from it. It only picks the moment to
// release the next thread; no outcome depends on how long anything took.
void wait_until_returned_or_asleep(const std::atomic<bool>& done, const std::atomic<pid_t>& tid) {
  while (tid.load() == 0) std::this_thread::yield();
  for (;;) {
    if (done.load()) return;
    if (task_state(tid.load()) == 'S') {
      std::this_thread::sleep_for(5ms);
      if (done.load() || task_state(tid.load()) == 'S') return;
    }
    std::this_thread::sleep_for(1ms);
  }
}

// A call that may block (flush, stop) on a thread of its own. `call` returns what the test
// reads right after the call returned.
class blocking_call {
 public:
  explicit blocking_call(std::function<int()> call)
      : thread_([this, call = std::move(call)] {
          tid_.store(current_tid());
          seen_at_return_.store(call());
          returned_.store(true);
        }) {}
  blocking_call(const blocking_call&) = delete;
  blocking_call& operator=(const blocking_call&) = delete;
  ~blocking_call() {
    if (thread_.joinable()) thread_.join();
  }
  void wait_until_returned_or_asleep() const { ::wait_until_returned_or_asleep(returned_, tid_); }
  // Joins; what `call` read at its return.
  int join() {
    thread_.join();
    return seen_at_return_.load();
  }

 private:
  std::atomic<pid_t> tid_{0};
  std::atomic<bool> returned_{false};
  std::atomic<int> seen_at_return_{-1};
  std::thread thread_;  // last: starts once the rest exists
};

// A reap_on_caller on a thread of its own that holds `item` (enqueued here, while the worker is
// frozen, so that the worker leaves it to the caller) until release(), then declines it: back
// on the queue, or torn down inline if the reaper has stopped meanwhile.
template <class Reaper>
class caller_holding {
 public:
  caller_holding(Reaper& reaper, job& item) {
    reaper.freeze();
    reaper.enqueue(item);
    thread_ = std::thread([this, &reaper] {
      (void)reaper.reap_on_caller([this](job&) {
        holds_.arrive_and_wait();
        return false;
      });
    });
    holds_.wait_for_arrival();
  }
  caller_holding(const caller_holding&) = delete;
  caller_holding& operator=(const caller_holding&) = delete;
  ~caller_holding() { release_and_join(); }
  void release_and_join() {
    if (!thread_.joinable()) return;
    holds_.release();
    thread_.join();
  }

 private:
  pause_point holds_;
  std::thread thread_;
};

// ---- a queue whose worker-side takes can be paused ---------------------------------------------

// Called on the worker's del_all when set: before the take (false) and after it (true). Each
// take reads the pointer once; a test clears it and then stops its reaper (joining the worker)
// before anything the hook uses goes out of scope.
std::atomic<const std::function<void(bool after)>*> worker_take_hook{nullptr};
std::atomic<pid_t> worker_tid{0};

struct gated_queue : llist<job, &job::hook> {
  llist_batch<job, &job::hook> del_all() noexcept {
    const auto* hook = current_tid() == worker_tid.load() ? worker_take_hook.load() : nullptr;
    if (hook != nullptr) (*hook)(false);
    llist_batch<job, &job::hook> taken = llist<job, &job::hook>::del_all();
    if (hook != nullptr) (*hook)(true);
    return taken;
  }
};

using gated_reaper = teardown::reaper<job, &job::hook, job_fn, gated_queue>;

// Learns the worker's thread id: one item whose fn records it.
template <class Reaper>
void learn_worker_tid(Reaper& reaper, std::atomic<pid_t>& probe_tid) {
  job probe;
  probe.id = 999;
  reaper.enqueue(probe);
  reaper.flush();
  worker_tid.store(probe_tid.load());
}

// fn: counts; item 999 records the worker's tid; an item whose id is in `blocking` waits at
// its pause point first.
job_fn scripted_fn(std::atomic<pid_t>& probe_tid, std::function<void(job&)> before = {}) {
  return [&probe_tid, before = std::move(before)](job& j) {
    if (j.id == 999) {
      probe_tid.store(current_tid());
      return;
    }
    if (before) before(j);
    j.runs.fetch_add(1);
  };
}

class BarrierTest : public ::testing::Test {
 protected:
  void TearDown() override {
    worker_take_hook.store(nullptr);
    worker_tid.store(0);
  }
  hang_guard guard_{current_test_name()};
};

// A reap_on_caller holds item X while the worker's pass for a flush ticket takes an empty
// queue; the caller declines X and puts it back before the pass completes the ticket. The
// flush must not return until X is torn down.
TEST_F(BarrierTest, FlushWaitsForAnItemReapOnCallerPutBackDuringThePass) {
  std::atomic<pid_t> probe{0};
  gated_reaper reaper(scripted_fn(probe));
  learn_worker_tid(reaper, probe);

  job x;
  x.id = 1;
  caller_holding caller(reaper, x);
  reaper.thaw();
  // The worker's take after the thaw finds nothing and it goes to sleep: the next take is the
  // flush's pass.
  wait_until_asleep(worker_tid.load());

  // The worker's first take after this: paused after it took (nothing: the caller holds X).
  // Its second take: paused before it takes, until the flush has returned or is blocked.
  pause_point pass_took;
  pause_point next_take;
  std::atomic<int> takes{0};
  const std::function<void(bool)> take_hook = [&](bool after) {
    const int n = takes.load();
    if (n == 0 && after) {
      takes.store(1);
      pass_took.arrive_and_wait();
    } else if (n == 1 && !after) {
      takes.store(2);
      next_take.arrive_and_wait();
    }
  };
  worker_take_hook.store(&take_hook);

  blocking_call flusher([&] {
    reaper.flush();
    return x.runs.load();
  });
  pass_took.wait_for_arrival();
  caller.release_and_join();  // X goes back, after the pass's take and before it completes
  pass_took.release();
  // Before the worker takes again: the flush has either returned (early) or waits for it.
  next_take.wait_for_arrival();
  flusher.wait_until_returned_or_asleep();
  next_take.release();
  EXPECT_EQ(flusher.join(), 1) << "flush() returned before X, put back by reap_on_caller, was torn down";
  worker_take_hook.store(nullptr);
  reaper.stop();
  EXPECT_EQ(x.runs.load(), 1);
}

// stop_for returns true only when everything is torn down: here X is in a reap_on_caller's
// hands when the worker has already ended.
TEST_F(BarrierTest, StopWaitsForAnItemInAReapOnCallersHands) {
  job_reaper reaper(counting());
  job x;
  x.id = 1;
  caller_holding caller(reaper, x);
  (void)reaper.stop_for(0ns);  // asks the worker to end; it may or may not have ended yet
  EXPECT_TRUE(teardown_test::eventually([&] { return !reaper.stats().running; }));

  std::atomic<bool> result{false};
  blocking_call stopper([&] {
    result.store(reaper.stop_for(1h));
    return x.runs.load();
  });
  stopper.wait_until_returned_or_asleep();
  caller.release_and_join();
  const int runs_at_return = stopper.join();
  EXPECT_TRUE(result.load());
  EXPECT_EQ(runs_at_return, 1) << "stop_for returned true while a reap_on_caller still held X";
  EXPECT_EQ(x.runs.load(), 1);
}

// After stop, a producer's inline drain has taken Z (enqueued before the stop) and is still
// tearing down what it took when stop() and flush() are called: both wait for it.
TEST_F(BarrierTest, StopAndFlushWaitForAnInlineDrainThatTookAnEarlierItem) {
  std::atomic<pid_t> probe{0};
  pause_point w_blocks;
  gated_reaper reaper(scripted_fn(probe, [&](job& j) {
    if (j.id == 2) w_blocks.arrive_and_wait();  // W: first of the inline drain's batch
  }));
  learn_worker_tid(reaper, probe);

  job w;  // taken with Z by the inline drain, torn down first (oldest first)
  w.id = 2;
  job z;
  z.id = 3;
  reaper.freeze();
  reaper.enqueue(w);
  reaper.enqueue(z);

  // The worker's final drain: paused before its take, so that the producer's drain takes W, Z.
  pause_point final_take;
  std::atomic<bool> paused_once{false};
  const std::function<void(bool)> take_hook = [&](bool after) {
    if (!after && !paused_once.exchange(true)) final_take.arrive_and_wait();
  };
  worker_take_hook.store(&take_hook);
  blocking_call stopper([&] {
    reaper.stop();  // overrides the freeze
    return z.runs.load();
  });
  final_take.wait_for_arrival();
  EXPECT_FALSE(reaper.stats().running);  // STOPPED is published before the final drain

  job a;
  a.id = 4;
  std::thread producer([&] { reaper.enqueue(a); });  // inline: A, then drains W and Z
  w_blocks.wait_for_arrival();
  final_take.release();  // the worker's final drain finds nothing and the worker ends

  stopper.wait_until_returned_or_asleep();
  blocking_call flusher([&] {
    reaper.flush();
    return z.runs.load();
  });
  flusher.wait_until_returned_or_asleep();
  w_blocks.release();
  producer.join();
  EXPECT_EQ(stopper.join(), 1) << "stop() returned while an inline drain still held Z";
  EXPECT_EQ(flusher.join(), 1) << "flush() after stop returned while an inline drain still held Z";
  EXPECT_EQ(w.runs.load(), 1);
  EXPECT_EQ(z.runs.load(), 1);
  EXPECT_EQ(a.runs.load(), 1);
}

// ---- a sharded queue whose adder is preempted between its push and its flag ------------------

// Paused before the summary word's flag CAS when set on the adding thread.
thread_local std::function<void()>* pause_before_flag = nullptr;

struct flag_pausing_atomics {
  template <class W>
  struct atomic : std::atomic<W> {
    using std::atomic<W>::atomic;
    using std::atomic<W>::operator=;
    bool compare_exchange_weak(W& expected, W desired, std::memory_order success,
                               std::memory_order failure) noexcept {
      if constexpr (std::is_same_v<W, std::uintptr_t>) {
        if (pause_before_flag != nullptr) (*std::exchange(pause_before_flag, nullptr))();
      }
      return std::atomic<W>::compare_exchange_weak(expected, desired, success, failure);
    }
  };
};

// Each thread adds to the shard the test gives it.
thread_local std::size_t my_shard = 0;

// Two shards, each thread adding to my_shard; the worker's takes (flagged or sweeping) go
// through worker_take_hook like gated_queue's.
struct two_shard_queue : teardown::sharded_llist<job, &job::hook, flag_pausing_atomics> {
  using base = teardown::sharded_llist<job, &job::hook, flag_pausing_atomics>;
  two_shard_queue() : base(2) {}
  bool add(job& item) noexcept { return add_to(my_shard, item); }
  llist_batch<job, &job::hook> del_all() noexcept {
    return gated([&] { return base::del_all(); });
  }
  llist_batch<job, &job::hook> del_all_sweep() noexcept {
    return gated([&] { return base::del_all_sweep(); });
  }

 private:
  template <class Take>
  static llist_batch<job, &job::hook> gated(Take take) {
    const auto* hook = current_tid() == worker_tid.load() ? worker_take_hook.load() : nullptr;
    if (hook != nullptr) (*hook)(false);
    llist_batch<job, &job::hook> taken = take();
    if (hook != nullptr) (*hook)(true);
    return taken;
  }
};

// A thread that enqueues `item` onto `shard` and is preempted between the push and the shard's
// flag: constructed once it is paused there; finish() lets it flag and joins it.
template <class Reaper>
class adder_paused_before_flag {
 public:
  adder_paused_before_flag(Reaper& reaper, std::size_t shard, job& item)
      : thread_([this, &reaper, shard, &item] {
          my_shard = shard;
          pause_before_flag = &pause_;
          reaper.enqueue(item);
        }) {
    paused_.wait_for_arrival();
  }
  adder_paused_before_flag(const adder_paused_before_flag&) = delete;
  adder_paused_before_flag& operator=(const adder_paused_before_flag&) = delete;
  ~adder_paused_before_flag() { finish(); }
  void finish() {
    paused_.release();
    if (thread_.joinable()) thread_.join();
  }

 private:
  pause_point paused_;
  std::function<void()> pause_ = [this] { paused_.arrive_and_wait(); };
  std::thread thread_;  // last: starts once the members above exist
};

// In the parent, at fork time: shard 1's flag is set though the shard is empty (its adder Z
// flagged it after a reap_on_caller had already taken z), and Y's adder pushed onto shard 0
// and is preempted before its flag; that adder does not exist in the child, so nobody will
// flag shard 0 there. A take that trusts the flags takes shard 1, finds nothing and ends the
// drain. The child's flush must take Y anyway (its first drain sweeps every shard).
TEST_F(BarrierTest, ForkChildFlushTakesAShardWhoseProducerStoppedBeforeItsFlag) {
  teardown::reaper<job, &job::hook, job_fn, two_shard_queue> reaper([](job& j) { j.runs.fetch_add(1); });
  job y, z;
  reaper.freeze();  // the worker takes nothing

  {
    adder_paused_before_flag adder_z(reaper, 1, z);
    EXPECT_EQ(reaper.reap_on_caller([](job&) { return true; }), 1u) << "z taken before its flag";
  }  // shard 1 is flagged and empty

  adder_paused_before_flag adder_y(reaper, 0, y);
  const int code = run_child([&] {
    child_checks check;
    reaper.flush();
    check.expect(y.runs.load() == 1, "the child's flush took Y from its unflagged shard");
    return check.exit_code();
  });
  EXPECT_EQ(code, child_ok);
  adder_y.finish();
  reaper.thaw();
  reaper.flush();
  EXPECT_EQ(y.runs.load(), 1) << "in the parent";
  EXPECT_EQ(z.runs.load(), 1);
}

// Y adds to shard 0 and is preempted before its flag; X adds behind it (not the first add, so
// it flags nothing) and flushes while shard 1 is flagged. The flush's pass must take shard 0.
TEST_F(BarrierTest, FlushOverAShardedQueueTakesAShardWhoseFlagIsNotSetYet) {
  std::atomic<pid_t> probe{0};
  teardown::reaper<job, &job::hook, job_fn, two_shard_queue> reaper(scripted_fn(probe));
  learn_worker_tid(reaper, probe);
  job y, x, z;
  y.id = 1;
  x.id = 2;
  z.id = 3;
  reaper.freeze();  // the worker takes nothing until the flush's ticket is asked for

  adder_paused_before_flag adder_y(reaper, 0, y);
  std::thread adder_z([&] {
    my_shard = 1;
    reaper.enqueue(z);  // flags shard 1
  });
  adder_z.join();
  my_shard = 0;
  reaper.enqueue(x);  // behind Y on shard 0: not the first add, no flag

  // The worker's take after the flush's pass: paused before it takes, until the flush has
  // returned or waits for more.
  pause_point second_take;
  std::atomic<int> takes{0};
  const std::function<void(bool)> take_hook = [&](bool after) {
    if (!after && takes.fetch_add(1) == 1) second_take.arrive_and_wait();
  };
  worker_take_hook.store(&take_hook);
  blocking_call flusher([&] {
    reaper.flush();
    return x.runs.load();
  });
  flusher.wait_until_returned_or_asleep();  // its ticket is asked for
  reaper.thaw();
  second_take.wait_for_arrival();
  flusher.wait_until_returned_or_asleep();
  second_take.release();
  adder_y.finish();
  EXPECT_EQ(flusher.join(), 1) << "flush() returned with X still on an unflagged shard";
  worker_take_hook.store(nullptr);
  reaper.stop();
  EXPECT_EQ(x.runs.load(), 1);
  EXPECT_EQ(y.runs.load(), 1);
  EXPECT_EQ(z.runs.load(), 1);
}

// ---- the stall watchdog ------------------------------------------------------------------------

// An add that lands right after the worker's take, while the taken item blocks: its wait is
// what the watchdog must see.
TEST_F(BarrierTest, StallWatchdogSeesAnAddThatLandsRightAfterTheWorkersTake) {
  std::atomic<pid_t> probe{0};
  pause_point b_blocks;
  teardown::reaper_options options;
  options.stall_threshold = 0ns;
  gated_reaper reaper(scripted_fn(probe,
                                  [&](job& j) {
                                    if (j.id == 1) b_blocks.arrive_and_wait();
                                  }),
                      options);
  learn_worker_tid(reaper, probe);

  job b, a, c;
  b.id = 1;
  a.id = 2;
  c.id = 3;
  pause_point after_take;
  std::atomic<bool> paused_once{false};
  const std::function<void(bool)> take_hook = [&](bool after) {
    if (after && !paused_once.exchange(true)) after_take.arrive_and_wait();
  };
  worker_take_hook.store(&take_hook);
  reaper.enqueue(b);
  after_take.wait_for_arrival();  // the worker took B
  reaper.enqueue(a);              // the first add to the emptied queue
  after_take.release();
  b_blocks.wait_for_arrival();  // B blocks the worker
  reaper.enqueue(c);            // behind A
  const bool seen = teardown_test::eventually([&] { return reaper.stalled(); }, 10s);
  EXPECT_TRUE(seen) << "two items wait behind a blocked item and stalled() stays false";
  b_blocks.release();
  reaper.flush();
  EXPECT_FALSE(reaper.stalled());
  EXPECT_EQ(a.runs.load() + b.runs.load() + c.runs.load(), 3);
  worker_take_hook.store(nullptr);
  reaper.stop();
}

// ---- two settlers after stop ----------------------------------------------------------------------

// Paused on the adding thread, when set: before the add (enqueue has read the state word) and
// after it (before the kick).
thread_local std::function<void()>* pause_before_add = nullptr;
thread_local std::function<void()>* pause_after_add = nullptr;

struct add_pausing_queue : llist<job, &job::hook> {
  bool add(job& item) noexcept {
    if (pause_before_add != nullptr) (*std::exchange(pause_before_add, nullptr))();
    const bool first = llist<job, &job::hook>::add(item);
    if (pause_after_add != nullptr) (*std::exchange(pause_after_add, nullptr))();
    return first;
  }
};

// A producer that enqueues `x` on a thread of its own, read "running" and is paused before its
// add while `reaper` stops, then adds x and is paused again before its kick: x is queued behind
// a worker that has ended. release_kick() lets its enqueue go on (its kick reads STOPPED and its
// own drain takes whatever is still queued) and joins it.
class producer_paused_after_add {
 public:
  template <class Reaper>
  producer_paused_after_add(Reaper& reaper, job& x)
      : thread_([this, &reaper, &x] {
          pause_before_add = &pause_before_;
          pause_after_add = &pause_after_;
          reaper.enqueue(x);
        }) {
    before_add_.wait_for_arrival();
    reaper.stop();  // the worker ends before x is on the queue
    before_add_.release();
    after_add_.wait_for_arrival();  // x queued, not kicked
  }
  producer_paused_after_add(const producer_paused_after_add&) = delete;
  producer_paused_after_add& operator=(const producer_paused_after_add&) = delete;
  ~producer_paused_after_add() {
    if (thread_.joinable()) release_kick();
  }
  void release_kick() {
    after_add_.release();
    thread_.join();
  }

 private:
  pause_point before_add_;
  pause_point after_add_;
  std::function<void()> pause_before_ = [this] { before_add_.arrive_and_wait(); };
  std::function<void()> pause_after_ = [this] { after_add_.arrive_and_wait(); };
  std::thread thread_;  // last: starts once the pauses above exist
};

// X's producer read "running" and is preempted before its add while the reaper stops; it then
// adds X and is preempted again before its kick. A flush after stop drains X and tears it down
// (X's fn blocks). The producer's kick reads STOPPED and its own drain finds nothing, so X's
// enqueue returns. A second flush must wait for the first one's teardown of X: that drain is
// not a hand, so the second must not flip and wait out the old side while it runs.
TEST_F(BarrierTest, FlushAfterStopWaitsForAnotherSettlersDrain) {
  pause_point x_in_fn;
  teardown::reaper<job, &job::hook, job_fn, add_pausing_queue> reaper([&](job& j) {
    if (j.id == 1) x_in_fn.arrive_and_wait();
    j.runs.fetch_add(1);
  });
  job x;
  x.id = 1;
  producer_paused_after_add producer(reaper, x);
  blocking_call first([&] {
    reaper.flush();
    return x.runs.load();
  });
  x_in_fn.wait_for_arrival();  // the first flush's drain took X
  producer.release_kick();  // X's enqueue returned
  blocking_call second([&] {
    reaper.flush();
    return x.runs.load();
  });
  second.wait_until_returned_or_asleep();
  x_in_fn.release();
  EXPECT_EQ(second.join(), 1) << "flush() returned while another settler still tore X down";
  EXPECT_EQ(first.join(), 1);
}

// A settler that gives up (flush_for after stop, at its deadline) has flipped the hand side
// while a producer's inline drain still holds X, whose own enqueue has returned. The next
// settler flips back: it must still wait for that hand, counted before its drain, rather than
// only for the side its own flip retired (it returned with X still in fn).
TEST_F(BarrierTest, ASettlerAfterOneThatGaveUpStillWaitsForTheOlderHand) {
  pause_point x_in_fn;
  teardown::reaper<job, &job::hook, job_fn, add_pausing_queue> reaper([&](job& j) {
    if (j.id == 1) x_in_fn.arrive_and_wait();
    j.runs.fetch_add(1);
  });
  job x;
  x.id = 1;
  job y;
  y.id = 2;
  producer_paused_after_add x_producer(reaper, x);
  std::thread y_producer([&] { reaper.enqueue(y); });  // Y inline, then its drain (a hand) takes X
  x_in_fn.wait_for_arrival();
  x_producer.release_kick();  // X's enqueue has returned; X is in Y's producer's hands
  EXPECT_FALSE(reaper.flush_for(1ms)) << "the first settler gives up, its flip made";
  blocking_call second([&] {
    reaper.flush();
    return x.runs.load();
  });
  second.wait_until_returned_or_asleep();
  x_in_fn.release();
  EXPECT_EQ(second.join(), 1) << "flush() returned while an older hand still tore X down";
  y_producer.join();
  EXPECT_EQ(x.runs.load(), 1);
  EXPECT_EQ(y.runs.load(), 1);
}

// ---- fork while fn calls into a reaper ------------------------------------------------------------

// Forks on another thread while a worker is paused in fn at `in_fn`, waits until that fork()
// has returned or sleeps (in a handler, waiting for the worker), then lets fn go on. Returns
// whether fork() had returned before fn went on; the child must exit as specified. A fork
// that deadlocks hangs in the join (the hang guard reports it).
bool fork_while_fn_is_paused(pause_point& in_fn) {
  std::atomic<bool> forked{false};
  std::atomic<pid_t> forker_tid{0};
  std::atomic<int> child_status{-1};
  std::thread forker([&] {
    forker_tid.store(current_tid());
    const pid_t pid = teardown_test::start_child([] { return teardown_test::child_ok; });
    forked.store(true);
    child_status.store(teardown_test::wait_child(pid));
  });
  wait_until_returned_or_asleep(forked, forker_tid);
  const bool returned_first = forked.load();
  in_fn.release();
  forker.join();
  EXPECT_EQ(child_status.load(), teardown_test::child_ok);
  return returned_first;
}

// With fork_policy::wait_for_item fork() parks the worker between items; a teardown function
// that calls set_nice() (of its own reaper, or nice() of another) on the way must not deadlock
// it.
TEST_F(BarrierTest, ForkWhileTheTeardownFunctionCallsNiceDoesNotDeadlock) {
  // The fork handlers park the reapers in address order: reapers[0] is parked (its control
  // plane held across the fork) before reapers[1], whose fn calls its nice().
  const teardown::reaper_options parking{.on_fork = teardown::fork_policy::wait_for_item};
  std::array<std::optional<job_reaper>, 3> reapers;
  pause_point in_fn;
  reapers[0].emplace(counting(), parking);
  reapers[1].emplace(
      [&](job& j) {
        in_fn.arrive_and_wait();
        (void)reapers[1]->set_nice(19);
        (void)reapers[0]->nice();
        (void)reapers[2]->nice();
        j.runs.fetch_add(1);
      },
      parking);
  reapers[2].emplace(counting(), parking);
  job_reaper& reaper = *reapers[1];
  job x;
  x.id = 1;
  reaper.enqueue(x);
  in_fn.wait_for_arrival();
  (void)fork_while_fn_is_paused(in_fn);  // the fork waits for the park
  reaper.flush();
  EXPECT_EQ(x.runs.load(), 1);
}

// By default fork() waits for nothing of the workers': a teardown function that flushes another
// reaper, or reaps on its caller, while a fork() runs does not deadlock it (parking would hold
// reapers[0]'s control mutex across the fork and wait for reapers[1]'s worker, which waits for
// that mutex).
TEST_F(BarrierTest, ForkWhileTheTeardownFunctionFlushesAnotherReaperDoesNotDeadlock) {
  std::array<std::optional<job_reaper>, 2> reapers;
  pause_point in_fn;
  job y;
  reapers[0].emplace(counting());
  reapers[1].emplace([&](job& j) {
    in_fn.arrive_and_wait();
    reapers[0]->enqueue(y);
    reapers[0]->flush();
    (void)reapers[0]->reap_on_caller([](job&) { return true; });
    j.runs.fetch_add(1);
  });
  job x;
  x.id = 1;
  reapers[1]->enqueue(x);
  in_fn.wait_for_arrival();
  EXPECT_TRUE(fork_while_fn_is_paused(in_fn)) << "fork() waited for the worker in fn";
  reapers[1]->flush();
  EXPECT_EQ(x.runs.load(), 1);
  EXPECT_EQ(y.runs.load(), 1);
}

// ---- trace hooks ---------------------------------------------------------------------------------

std::atomic<int> f_calls{0};
pause_point* f_pause = nullptr;
void hook_f(const teardown::trace::reject_event&) {
  if (f_calls.fetch_add(1) == 0 && f_pause != nullptr) f_pause->arrive_and_wait();
}
void hook_g(const teardown::trace::reject_event&) {}

// While remove_hook(f) waits out an emit that is inside f, other threads add g (into f's old
// slot) and f again (into the next): the running emit must not call f a second time.
TEST_F(BarrierTest, OneEmitCallsAHookOnceWhileItIsRemovedAndAddedAgain) {
  namespace trace = teardown::trace;
  trace::clear_hook<trace::reject_event>();
  pause_point inside_f;
  f_pause = &inside_f;
  f_calls.store(0);
  trace::add_hook<trace::reject_event>(&hook_f);
  std::thread emitter([] { trace::reject(1, 1, 0, 0); });
  inside_f.wait_for_arrival();
  std::thread remover([] { (void)trace::remove_hook<trace::reject_event>(&hook_f); });
  // f's slot is empty once the remover has taken it out (it then waits for the emit).
  while (teardown::trace::detail::hook_slot<trace::reject_event>::functions[0].load() != nullptr) {
    std::this_thread::yield();
  }
  trace::add_hook<trace::reject_event>(&hook_g);  // into slot 0
  trace::add_hook<trace::reject_event>(&hook_f);  // into slot 1, behind the running emit
  inside_f.release();
  emitter.join();
  remover.join();
  EXPECT_EQ(f_calls.load(), 1) << "one emit called f twice";
  f_pause = nullptr;
  trace::clear_hook<trace::reject_event>();
}

}  // namespace
