// tests/unit/schedule/schedule.hpp — a deterministic scheduler for the worker protocols.
//
// The real headers run on real threads, but one at a time: every atomic operation, futex wait
// or wake, lock, condition wait, sleep, thread start and join of a thread under the scheduler
// is a point where the scheduler picks which thread runs next. A schedule is the sequence of
// those picks; it is made from a seed (PCT or a random walk) or enumerated (exhaustive, with a
// bound on preemptions), so a failing schedule is printed as a name that replays it.
//
//     teardown::schedule::explore({.name = "flush"}, [] {
//       reaper<item, &item::node, fn, llist<item, &item::node, schedule::sync>> r(fn{}, opts);
//       schedule::thread producer([&] { r.enqueue(x); });
//       r.flush();
//       schedule::check(x.torn_down, "flush returned before x was torn down");
//     });
//
// Who may call what
//   explore                 a test's thread, not under the scheduler; one explore at a time.
//   check, thread, sync     inside a scenario (the function explore runs) and the threads it
//                           starts; sync is the Sync policy (teardown/sync.hpp) to name in the
//                           queue type of the reaper or pool under test.
//   publish, ordered_here   inside a scenario: a stamp of what this thread has done, and
//                           whether a stamp happens before the caller's now (weak memory).
//
// How a run goes. explore starts thread 0 on the scenario; threads it starts (schedule::thread,
// and a reaper's worker through sync::start_thread) join the run. At each point the strategy
// picks among the runnable threads. No thread runnable and none waiting with a limit is a
// deadlock: the run is reported as failed, with its name, and the process aborts (the blocked
// threads cannot be unwound). A run that passes max_steps is reported as failed too, and its
// threads are let run freely to their end.
//
// Time is virtual (clock, sync::now_ns). It moves on by yield_ns at each yield: a spinning
// thread spends time, so a timed wait (a sleep, a futex or condition wait with a limit) ends
// once the yields of others have carried the clock to its deadline. When no thread is runnable,
// or the only runnable one yields, the clock jumps to the earliest deadline of a timed wait,
// which ends; a wait whose deadline has already passed ends at the next pick. Time moves no other
// way: atomics, locks and reads of the clock take none, so polls, boosts and a pool's steal_after
// come where a schedule puts them.
//
// Memory. The scheduled atomics are weakly ordered (memory_model.hpp): a load may read an
// older store where C++ allows it (stale_per_mille of the loads that have a choice, under pct
// and random; exhaustive runs are sequentially consistent), an RMW whose write changes nothing
// may read one, and happens-before is tracked with vector clocks. A scenario stamps an item
// before it hands it over (publish) and whoever uses it checks ordered_here: a weakened
// release or acquire on the way fails the schedule.
//
// Wake-ups. A wake of one thread (futex_wake_one, notify_one, an unlock) wakes whichever waiter
// the schedule picks (uniformly under pct and random, every choice under exhaustive), not the
// longest waiting. Under pct and random, at each pick with probability spurious_per_mille / 1000
// a thread in a futex or condition wait wakes spuriously, as the Sync contract allows: a wait
// must re-check its condition. A sleep, a join and a run in which every thread waits never do.
//
// Strategies
//   pct          probabilistic concurrency testing: random thread priorities, the running
//                thread lowered at depth - 1 random steps; finds any bug of depth d with
//                probability >= 1 / (n k^(d-1)) per run (n threads, k steps).
//   random       a uniform pick at every point.
//   mixed        pct and random in turn (the default): PCT reaches deep orderings of few
//                preemptions, the random walk the shallow ones with many switches.
//   exhaustive   depth first over every schedule with at most preemption_bound preemptions
//                (a switch away from a thread that could go on), up to `schedules` runs.
//
// Environment: TEARDOWN_SCHEDULES=N runs N schedules per explore instead of the test's count;
// TEARDOWN_SCHEDULE_REPLAY=<name> (as printed: "pct:17", "random:3", "exhaustive:0.2.1") runs
// that one schedule; TEARDOWN_SCHEDULE_TRACE=1 prints every switch of the runs;
// TEARDOWN_SCHEDULE_SPURIOUS=N, TEARDOWN_SCHEDULE_STALE=N and TEARDOWN_SCHEDULE_YIELD_NS=N set
// spurious_per_mille, stale_per_mille and yield_ns.
#pragma once

#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#if defined(__linux__)
#include <linux/futex.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <random>
#include <semaphore>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "schedule/memory_model.hpp"
#include "teardown/atomics.hpp"
#include "teardown/worker_thread.hpp"

namespace teardown::schedule {

enum class strategy { mixed, pct, random, exhaustive };

struct explore_options {
  const char* name = "scenario";
  strategy kind = strategy::mixed;
  std::uint64_t schedules = 10'000;   // runs (TEARDOWN_SCHEDULES overrides; sanitizers: / 10)
  int pct_depth = 3;                  // pct: d (d - 1 priority change points per run)
  int preemption_bound = 2;           // exhaustive
  std::uint64_t max_steps = 200'000;  // a run longer than this fails (livelock)
  std::uint64_t seed = 1;             // pct, random: run i uses seed + i
  std::uint64_t yield_ns = 1'000;     // virtual time a yield takes (see "Time" in the header)
  int spurious_per_mille = 5;         // pct, random: the chance at each pick that a futex or
                                      // condition waiter is woken spuriously (0: never)
  int stale_per_mille = 100;          // pct, random: the share of loads with a choice that read
                                      // an older store (memory_model.hpp; 0: always the latest)
};

struct explore_result {
  std::uint64_t runs = 0;
  std::uint64_t stale_reads = 0;      // loads that read an older store, over all runs
  std::uint64_t longest_run_steps = 0;
  std::uint64_t most_threads = 0;
  bool exhausted = false;             // exhaustive: every schedule within the bound was run
  std::optional<std::string> failure;  // the first failed run's message
  std::string failed_schedule;         // its name, for TEARDOWN_SCHEDULE_REPLAY
};

namespace detail {

// Released by the last thread of a run; the test's thread waits for it.
inline std::binary_semaphore& all_done_signal() {
  static std::binary_semaphore done{0};
  return done;
}
constexpr std::uint64_t no_deadline = ~std::uint64_t{0};

enum class status { unused, runnable, blocked, done };

struct thread_slot {
  std::binary_semaphore go{0};
  status state = status::unused;
  const void* waiting_on = nullptr;    // the word a blocked thread waits on; nullptr: a sleep
  std::uint64_t deadline = no_deadline;
  bool timed_out = false;
  bool may_wake_spuriously = false;    // a futex or condition wait (not a sleep, a join or a yield)
  double priority = 0;                 // pct
  pthread_t os_thread{};
};

struct decision {
  std::vector<int> options;  // the runnable threads, in the order they are tried
  std::size_t taken = 0;     // index into options
  int preemptions_before = 0;
  bool self_runnable = false;  // options[0] is the running thread: any other is a preemption
};

class scheduler {
 public:
  scheduler(const explore_options& opts, strategy kind, std::uint64_t seed, std::vector<std::size_t> forced,
            std::uint64_t expected_steps, bool trace)
      : opts_(opts), kind_(kind), rng_(seed), aux_rng_(seed ^ 0x9e3779b97f4a7c15ull), forced_(std::move(forced)),
        trace_(trace), memory_rng_(seed ^ 0x5851f42d4c957f2dull),
        stale_per_mille_(kind == strategy::exhaustive ? 0 : opts.stale_per_mille) {
    if (kind_ == strategy::pct) {
      std::uniform_int_distribution<std::uint64_t> step(1, std::max<std::uint64_t>(expected_steps, 1));
      for (int i = 1; i < opts_.pct_depth; ++i) change_points_.push_back(step(rng_));
    }
    now_ = teardown::detail::monotonic_ns();
  }

  // ---- threads ----------------------------------------------------------------------------

  // A thread started by `parent` (-1: the run's first): it starts knowing what its parent did.
  int add_thread(int parent) {
    const int k = next_slot_++;
    if (k >= max_threads) fatal("more threads than the scheduler holds");
    thread_slot& t = slots_[static_cast<std::size_t>(k)];
    if (parent >= 0) clocks_[static_cast<std::size_t>(k)] = clocks_[static_cast<std::size_t>(parent)];
    clocks_[static_cast<std::size_t>(k)][static_cast<std::size_t>(k)] = 1;
    if (parent >= 0) ++clocks_[static_cast<std::size_t>(parent)][static_cast<std::size_t>(parent)];
    t.state = status::runnable;
    std::uniform_real_distribution<double> priority(1000.0, 2000.0);
    t.priority = priority(rng_);
    live_.fetch_add(1, std::memory_order_relaxed);
    return k;
  }

  void set_os_thread(int k, pthread_t os) { slot(k).os_thread = os; }
  int find_thread(pthread_t os) const {
    for (int k = 0; k < next_slot_; ++k) {
      if (pthread_equal(slots_[static_cast<std::size_t>(k)].os_thread, os)) return k;
    }
    return -1;
  }
  int threads() const { return next_slot_; }

  // A new thread's first instruction under the scheduler: wait to be picked.
  void enter(int k) {
    slot(k).go.acquire();
  }

  // The thread's last: wakes its joiners, hands the CPU on. True if it was the last thread.
  bool finish(int k) {
    if (!free_run()) {
      thread_slot& t = slot(k);
      t.state = status::done;
      wake_all(&t);
      if (live_.fetch_sub(1, std::memory_order_acq_rel) == 1) return true;
      const int next = pick(/*self_runnable=*/false);
      hand_to(next, k, /*wait=*/false);
      return false;
    }
    return live_.fetch_sub(1, std::memory_order_acq_rel) == 1;
  }

  bool done(int k) const { return slots_[static_cast<std::size_t>(k)].state == status::done; }
  // A join of thread k (done) by `self`: what k did happens before what self does next.
  void joined(int self, int k) {
    join_into(clocks_[static_cast<std::size_t>(self)], clocks_[static_cast<std::size_t>(k)]);
  }

  // ---- memory (memory_model.hpp) ------------------------------------------------------------

  memory_thread memory(int self) {
    return {self, clocks_[static_cast<std::size_t>(self)], run_, &choose_store_of, this};
  }
  // A stamp of what `self` has done so far (publish()), and whether it happens before now.
  std::pair<int, std::uint32_t> stamp(int self) {
    return {self, ++clocks_[static_cast<std::size_t>(self)][static_cast<std::size_t>(self)]};
  }
  bool ordered(int self, std::pair<int, std::uint32_t> stamp) const {
    return stamp.first < 0 ||
           clocks_[static_cast<std::size_t>(self)][static_cast<std::size_t>(stamp.first)] >= stamp.second;
  }
  std::uint64_t stale_reads() const { return stale_reads_; }
  // What a joiner of thread k blocks on (finish wakes it).
  const void* joinable(int k) const { return &slots_[static_cast<std::size_t>(k)]; }
  // The run's first pick: thread k (thread 0, the scenario) starts.
  void start(int k) {
    current_ = k;
    slot(k).go.release();
  }

  // ---- points -----------------------------------------------------------------------------

  void point(int self) {
    if (free_run()) return;
    if (++steps_ > opts_.max_steps) {
      fail("the run passed " + std::to_string(opts_.max_steps) + " steps (a livelock, or max_steps is too low)");
      release_all(self);
      return;
    }
    const int next = pick(/*self_runnable=*/true);
    hand_to(next, self, /*wait=*/true);
  }

  // A yield (a spin loop's): the clock moves on by yield_ns (a spinning thread spends time), and
  // the next step goes to another runnable thread if there is one (the highest under PCT), so a
  // spinner of high priority cannot starve the thread it waits for, and priorities stay as PCT
  // set them. With none runnable but a timed wait, the clock jumps to its deadline (the spinner
  // waits for time to pass, as every thread would); with neither, the yield returns.
  void yield(int self) {
    if (free_run()) return;
    ++steps_;
    advance(opts_.yield_ns);
    thread_slot& me = slot(self);
    const auto others = [&] {
      for (int k = 0; k < next_slot_; ++k) {
        if (k != self && slots_[static_cast<std::size_t>(k)].state == status::runnable) return true;
      }
      return false;
    };
    if (!others() && !expire_earliest(self)) return;
    me.state = status::blocked;  // out of this one pick
    me.waiting_on = &me;
    me.deadline = no_deadline;
    me.may_wake_spuriously = false;
    const int next = pick(/*self_runnable=*/false);
    me.state = status::runnable;  // runnable again for every later pick
    hand_to(next, self, /*wait=*/true);
  }

  // Blocks the thread on `word` (nullptr: a sleep) until woken or, with a deadline, timed out
  // (once the clock reaches it). Returns true if it timed out. Wakes may come spuriously: in a
  // free run, and where may_wake_spuriously, when the schedule injects one.
  bool block(int self, const void* word, std::uint64_t deadline, bool may_wake_spuriously = false) {
    if (free_run()) return false;
    thread_slot& t = slot(self);
    t.state = status::blocked;
    t.waiting_on = word;
    t.deadline = deadline;
    t.timed_out = false;
    t.may_wake_spuriously = may_wake_spuriously;
    ++steps_;
    const int next = pick(/*self_runnable=*/false);
    hand_to(next, self, /*wait=*/true);
    return t.timed_out;
  }

  // Wakes up to `most` of the threads blocked on `word`. Which ones, when more wait, is the
  // schedule's choice (a decision of its own under exhaustive), as a futex promises no order.
  int wake(const void* word, int most) {
    if (free_run() || word == nullptr) return 0;
    std::vector<int> waiters;
    for (int k = 0; k < next_slot_; ++k) {
      const thread_slot& t = slots_[static_cast<std::size_t>(k)];
      if (t.state == status::blocked && t.waiting_on == word) waiters.push_back(k);
    }
    int woken = 0;
    while (woken < most && !waiters.empty()) {
      const std::size_t at = waiters.size() == 1 ? 0 : choose(waiters);
      slot(waiters[at]).state = status::runnable;
      waiters.erase(waiters.begin() + static_cast<std::ptrdiff_t>(at));
      ++woken;
    }
    return woken;
  }
  void wake_all(const void* word) { (void)wake(word, max_threads); }

  std::uint64_t now_ns() const { return now_; }

  // ---- the run's verdict --------------------------------------------------------------------

  void fail(std::string why) {
    const std::lock_guard lock(failure_mutex_);
    if (!failure_) failure_ = std::move(why);
  }
  std::optional<std::string> failure() const {
    const std::lock_guard lock(failure_mutex_);
    return failure_;
  }
  bool free_run() const { return free_run_.load(std::memory_order_acquire); }
  std::uint64_t steps() const { return steps_; }
  std::uint64_t spurious_wakeups() const { return spurious_wakeups_; }
  const std::vector<decision>& decisions() const { return decisions_; }
  [[noreturn]] void fatal(const std::string& why) {
    std::fprintf(stderr, "schedule: %s: %s (schedule %s)\n", opts_.name, why.c_str(), name_.c_str());
    std::fflush(stderr);
    std::abort();
  }
  void set_name(std::string name) { name_ = std::move(name); }

 private:
  // The store a load reads, among those the model allows: the latest but for stale_per_mille.
  static std::uint64_t choose_store_of(void* self, std::uint64_t oldest, std::uint64_t latest) {
    auto& s = *static_cast<scheduler*>(self);
    if (s.stale_per_mille_ <= 0) return latest;
    std::uniform_int_distribution<int> per_mille(0, 999);
    if (per_mille(s.memory_rng_) >= s.stale_per_mille_) return latest;
    std::uniform_int_distribution<std::uint64_t> older(oldest, latest - 1);
    ++s.stale_reads_;
    const std::uint64_t read = older(s.memory_rng_);
    if (s.trace_) {
      std::fprintf(stderr, "  step %llu: thread %d reads store %llu of %llu\n",
                   static_cast<unsigned long long>(s.steps_), s.current_, static_cast<unsigned long long>(read),
                   static_cast<unsigned long long>(latest));
    }
    return read;
  }

  thread_slot& slot(int k) { return slots_[static_cast<std::size_t>(k)]; }

  // The clock moves on by ns; the timed waits it passes end.
  void advance(std::uint64_t ns) {
    now_ += ns;
    for (int k = 0; k < next_slot_; ++k) {
      thread_slot& t = slot(k);
      if (t.state == status::blocked && t.deadline != no_deadline && t.deadline <= now_) {
        t.state = status::runnable;
        t.timed_out = true;
      }
    }
  }

  // The clock jumps to the earliest deadline of a timed wait (not `self`'s), which ends. False
  // if no thread waits with a limit.
  bool expire_earliest(int self) {
    int earliest = -1;
    for (int k = 0; k < next_slot_; ++k) {
      const thread_slot& t = slots_[static_cast<std::size_t>(k)];
      if (k != self && t.state == status::blocked && t.deadline != no_deadline &&
          (earliest < 0 || t.deadline < slots_[static_cast<std::size_t>(earliest)].deadline)) {
        earliest = k;
      }
    }
    if (earliest < 0) return false;
    advance(slot(earliest).deadline - std::min(now_, slot(earliest).deadline));
    return true;
  }

  // An index into `among` (threads, two or more), the schedule's choice: uniform under pct and
  // random, a decision under exhaustive (the first by default; not a preemption).
  std::size_t choose(const std::vector<int>& among) {
    if (kind_ != strategy::exhaustive) {
      std::uniform_int_distribution<std::size_t> any(0, among.size() - 1);
      return any(aux_rng_);
    }
    decision d;
    d.options = among;
    d.preemptions_before = preemptions_;
    const std::size_t at = decisions_.size();
    d.taken = at < forced_.size() ? forced_[at] : 0;
    if (d.taken >= d.options.size()) fatal("a replayed schedule does not fit this run (not deterministic?)");
    const std::size_t taken = d.taken;
    decisions_.push_back(std::move(d));
    return taken;
  }

  // Under pct and random, now and then a futex or condition waiter wakes for no reason (the
  // Sync contract allows it, so every wait must re-check). Only beside a runnable thread: a run
  // in which every thread waits is still a deadlock.
  void maybe_wake_spuriously() {
    if (kind_ == strategy::exhaustive || opts_.spurious_per_mille <= 0) return;
    std::uniform_int_distribution<int> per_mille(0, 999);
    if (per_mille(aux_rng_) >= opts_.spurious_per_mille) return;
    std::vector<int> waiters;
    for (int k = 0; k < next_slot_; ++k) {
      const thread_slot& t = slots_[static_cast<std::size_t>(k)];
      if (t.state == status::blocked && t.may_wake_spuriously) waiters.push_back(k);
    }
    if (waiters.empty()) return;
    std::uniform_int_distribution<std::size_t> any(0, waiters.size() - 1);
    slot(waiters[any(aux_rng_)]).state = status::runnable;
    ++spurious_wakeups_;
  }

  // The next thread to run; the calling thread is among the runnable ones if self_runnable.
  int pick(bool self_runnable) {
    advance(0);  // a wait whose deadline has passed ends
    std::vector<int> runnable;
    for (int k = 0; k < next_slot_; ++k) {
      if (slots_[static_cast<std::size_t>(k)].state == status::runnable) runnable.push_back(k);
    }
    if (runnable.empty()) {
      // Nothing can run: the earliest timed wait ends, and the clock jumps to its deadline.
      if (!expire_earliest(-1)) fatal("deadlock: every thread waits and none with a time limit");
      for (int k = 0; k < next_slot_; ++k) {
        if (slots_[static_cast<std::size_t>(k)].state == status::runnable) runnable.push_back(k);
      }
    } else {
      maybe_wake_spuriously();
      runnable.clear();
      for (int k = 0; k < next_slot_; ++k) {
        if (slots_[static_cast<std::size_t>(k)].state == status::runnable) runnable.push_back(k);
      }
    }
    if (runnable.size() == 1) return runnable.front();
    switch (kind_) {
      case strategy::random: {
        std::uniform_int_distribution<std::size_t> any(0, runnable.size() - 1);
        return runnable[any(rng_)];
      }
      case strategy::mixed:  // explore gives each run one of the two
      case strategy::pct: {
        for (std::size_t i = 0; i < change_points_.size(); ++i) {
          if (change_points_[i] == steps_ && self_runnable) slot(current_).priority = static_cast<double>(i);
        }
        int best = runnable.front();
        for (int k : runnable) {
          if (slots_[static_cast<std::size_t>(k)].priority > slots_[static_cast<std::size_t>(best)].priority) best = k;
        }
        return best;
      }
      case strategy::exhaustive: {
        // The default first: the current thread if it can go on (no preemption), else the
        // lowest; then the others in order.
        decision d;
        const int first = self_runnable ? current_ : runnable.front();
        d.options.push_back(first);
        for (int k : runnable) {
          if (k != first) d.options.push_back(k);
        }
        d.preemptions_before = preemptions_;
        d.self_runnable = self_runnable;
        const std::size_t at = decisions_.size();
        d.taken = at < forced_.size() ? forced_[at] : 0;
        if (d.taken >= d.options.size()) fatal("a replayed schedule does not fit this run (not deterministic?)");
        const int chosen = d.options[d.taken];
        if (self_runnable && chosen != current_) ++preemptions_;
        decisions_.push_back(std::move(d));
        return chosen;
      }
    }
    return runnable.front();
  }

  void hand_to(int next, int self, bool wait) {
    if (next == self) {
      current_ = self;
      return;
    }
    if (trace_) std::fprintf(stderr, "  step %llu: %d -> %d\n", static_cast<unsigned long long>(steps_), self, next);
    current_ = next;
    slot(next).go.release();
    if (wait) {
      slot(self).go.acquire();
      current_ = self;
    }
  }

  // From here on every thread runs freely: the blocked ones return from their waits as if
  // woken spuriously, and the primitives fall back to real futexes.
  void release_all(int self) {
    free_run_.store(true, std::memory_order_release);
    for (int k = 0; k < next_slot_; ++k) {
      if (k != self && slots_[static_cast<std::size_t>(k)].state != status::done) slot(k).go.release();
    }
  }

  const explore_options& opts_;
  strategy kind_;
  std::mt19937_64 rng_;
  std::mt19937_64 aux_rng_;  // wake choices and spurious wake-ups: PCT's draws stay as they were
  std::vector<std::size_t> forced_;
  bool trace_;
  std::vector<std::uint64_t> change_points_;
  std::array<thread_slot, max_threads> slots_{};
  int next_slot_ = 0;
  int current_ = 0;
  int preemptions_ = 0;
  std::uint64_t steps_ = 0;
  std::uint64_t spurious_wakeups_ = 0;
  std::uint64_t now_ = 0;
  std::atomic<int> live_{0};
  std::atomic<bool> free_run_{false};
  std::vector<decision> decisions_;
  mutable std::mutex failure_mutex_;
  std::optional<std::string> failure_;
  std::string name_;
  std::mt19937_64 memory_rng_;  // stale reads: schedules' draws stay as they were
  int stale_per_mille_;
  std::uint64_t stale_reads_ = 0;
  std::array<vclock, max_threads> clocks_{};
  // Histories left by an earlier run start over (store_history::renew).
  inline static std::atomic<std::uint64_t> runs_made_{0};
  std::uint64_t run_ = runs_made_.fetch_add(1, std::memory_order_relaxed) + 1;
};

// The active scheduler lives in a page that a fork child sees zeroed (MADV_WIPEONFORK): there
// the forking thread is alone, so from the first fork handler on every primitive is the real
// one, as in a free run. Null if the kernel refuses the advice (fork_safe() says so).
struct active_page {
  std::atomic<scheduler*>* slot = nullptr;
  bool wiped_on_fork = false;
  active_page() {
    void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) std::abort();
    wiped_on_fork = madvise(page, 4096, MADV_WIPEONFORK) == 0;
    slot = new (page) std::atomic<scheduler*>(nullptr);
  }
};
inline active_page active_storage;
inline std::atomic<scheduler*>& active = *active_storage.slot;
/// True if a scenario may fork: the child then runs without the scheduler.
inline bool fork_safe() { return active_storage.wiped_on_fork; }
inline thread_local int self = -1;  // this thread's index under the active scheduler; -1: none

// The active scheduler if the calling thread runs under it (and not freely), else nullptr.
inline scheduler* here() noexcept {
  scheduler* s = active.load(std::memory_order_acquire);
  return s != nullptr && self >= 0 && !s->free_run() ? s : nullptr;
}

// ThreadSanitizer sees none of the scheduler's own work: neither its accesses (its state passes
// from thread to thread at each switch) nor its synchronisation (the hand-off at each switch,
// which would order every access of one thread before the next thread's). So under the tsan
// presets the only ordering ThreadSanitizer sees between the scenario's threads is the code's
// own: its atomics with the orders it asked for, its locks, thread start and join. A weakened
// order that leaves plain data unordered is then a race it reports. Held across a switch: the
// blocked thread is the one ignoring, and only until it runs again and leaves.
#if defined(__SANITIZE_THREAD__)
#define TEARDOWN_SCHEDULE_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TEARDOWN_SCHEDULE_UNDER_TSAN 1
#endif
#endif
#if defined(TEARDOWN_SCHEDULE_UNDER_TSAN)
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
extern "C" void AnnotateIgnoreSyncBegin(const char* file, int line);
extern "C" void AnnotateIgnoreSyncEnd(const char* file, int line);
struct unseen {
  unseen() {
    __tsan_ignore_thread_begin();
    AnnotateIgnoreSyncBegin(__FILE__, __LINE__);
  }
  ~unseen() {
    AnnotateIgnoreSyncEnd(__FILE__, __LINE__);
    __tsan_ignore_thread_end();
  }
  unseen(const unseen&) = delete;
  unseen& operator=(const unseen&) = delete;
};
#else
struct unseen {
  unseen() {}  // NOLINT: user-provided, so an unused guard draws no warning
};
#endif

inline void point() {
  if (scheduler* s = here()) {
    const unseen guard;
    s->point(self);
  }
}

struct boot {
  scheduler* sched;
  int index;
  void* (*entry)(void*);
  void* arg;
};

inline void* trampoline(void* raw) {
  const boot b = *static_cast<boot*>(raw);
  delete static_cast<boot*>(raw);
  self = b.index;
  {
    const unseen guard;
    b.sched->enter(b.index);
  }
  void* result = b.entry(b.arg);
  bool last = false;
  {
    const unseen guard;
    last = b.sched->finish(b.index);
  }
  self = -1;
  if (last) all_done_signal().release();
  return result;
}

}  // namespace detail

// ---- the Sync policy --------------------------------------------------------------------------

/// std::atomic with a scheduling point before every operation and, for a thread under the
/// scheduler, weak memory (memory_model.hpp): a load may read an older store. The word itself
/// always holds the latest store, and every operation also runs on it with its own order (so
/// ThreadSanitizer sees the orders the code asked for).
template <class W>
class atomic {
 public:
  constexpr atomic() noexcept = default;
  constexpr atomic(W initial) noexcept : word_(initial) {}  // NOLINT: as std::atomic's
  atomic(const atomic&) = delete;
  atomic& operator=(const atomic&) = delete;
  constexpr ~atomic() { delete history_; }  // constexpr: a literal type, for constinit slots

  W load(std::memory_order order = std::memory_order_seq_cst) const noexcept {
    detail::point();
    const W latest = word_.load(order);
    if (detail::scheduler* s = detail::here()) {
      const detail::unseen guard;
      return history().load(s->memory(detail::self), latest, order);
    }
    return latest;
  }
  void store(W value, std::memory_order order = std::memory_order_seq_cst) noexcept {
    detail::point();
    const W previous = word_.load(std::memory_order_relaxed);  // one thread at a time, or a free run
    word_.store(value, order);
    if (detail::scheduler* s = detail::here()) {
      const detail::unseen guard;
      history().write(s->memory(detail::self), previous, value, order, false);
    }
  }
  W exchange(W value, std::memory_order order = std::memory_order_seq_cst) noexcept {
    return rmw(order, [&](W) { return value; });
  }
  bool compare_exchange_weak(W& expected, W desired, std::memory_order success, std::memory_order failure) noexcept {
    return compare_exchange_strong(expected, desired, success, failure);  // never fails spuriously
  }
  bool compare_exchange_weak(W& expected, W desired, std::memory_order order = std::memory_order_seq_cst) noexcept {
    return compare_exchange_strong(expected, desired, order, detail::load_part(order));
  }
  bool compare_exchange_strong(W& expected, W desired, std::memory_order success, std::memory_order failure) noexcept {
    detail::point();
    if (detail::scheduler* s = detail::here()) {
      // A failure may read an older store whose value differs from `expected`.
      const W latest = word_.load(std::memory_order_relaxed);
      const auto same = [](W v) { return v; };
      std::optional<W> read;
      {
        const detail::unseen guard;
        read = history().early_rmw(s->memory(detail::self), latest, failure, same, true, expected);
      }
      if (read) {
        (void)word_.load(failure);  // the load ThreadSanitizer sees
        expected = *read;
        return false;
      }
    }
    const W before = expected;
    const bool swapped = word_.compare_exchange_strong(expected, desired, success, failure);
    if (detail::scheduler* s = detail::here()) {
      const detail::unseen guard;
      if (swapped) {
        history().write(s->memory(detail::self), before, desired, success, true);
      } else {
        history().failed_rmw(s->memory(detail::self), expected, failure);
      }
    }
    return swapped;
  }
  bool compare_exchange_strong(W& expected, W desired, std::memory_order order = std::memory_order_seq_cst) noexcept {
    return compare_exchange_strong(expected, desired, order, detail::load_part(order));
  }
  W fetch_add(W n, std::memory_order order = std::memory_order_seq_cst) noexcept
    requires std::is_integral_v<W>
  {
    return rmw(order, [&](W old) { return static_cast<W>(old + n); });
  }
  W fetch_sub(W n, std::memory_order order = std::memory_order_seq_cst) noexcept
    requires std::is_integral_v<W>
  {
    return rmw(order, [&](W old) { return static_cast<W>(old - n); });
  }
  W fetch_or(W n, std::memory_order order = std::memory_order_seq_cst) noexcept
    requires std::is_integral_v<W>
  {
    return rmw(order, [&](W old) { return static_cast<W>(old | n); });
  }
  W fetch_and(W n, std::memory_order order = std::memory_order_seq_cst) noexcept
    requires std::is_integral_v<W>
  {
    return rmw(order, [&](W old) { return static_cast<W>(old & n); });
  }
  W fetch_xor(W n, std::memory_order order = std::memory_order_seq_cst) noexcept
    requires std::is_integral_v<W>
  {
    return rmw(order, [&](W old) { return static_cast<W>(old ^ n); });
  }

  /// The word itself, for a real futex when the run goes on freely.
  std::atomic<W>& raw() noexcept { return word_; }
  const std::atomic<W>& raw() const noexcept { return word_; }

 private:
  // A read-modify-write: `next` of the latest value, as one compare-exchange on the word (the
  // only writer while a run is scheduled; a loop for a free run).
  template <class Next>
  W rmw(std::memory_order order, Next next) noexcept {
    detail::point();
    W old = word_.load(std::memory_order_relaxed);
    if (detail::scheduler* s = detail::here()) {
      std::optional<W> read;
      {
        const detail::unseen guard;
        read = history().early_rmw(s->memory(detail::self), old, order, next);
      }
      if (read) {
        (void)word_.load(detail::load_part(order));  // the load ThreadSanitizer sees
        return *read;
      }
    }
    while (!word_.compare_exchange_weak(old, next(old), order, std::memory_order_relaxed)) {
    }
    if (detail::scheduler* s = detail::here()) {
      const detail::unseen guard;
      history().write(s->memory(detail::self), old, next(old), order, true);
    }
    return old;
  }

  // Only the thread the scheduler runs touches it (one at a time; a free run never does).
  detail::store_history<W>& history() const {
    if (history_ == nullptr) history_ = new detail::store_history<W>();
    return *history_;
  }

  std::atomic<W> word_{};
  mutable detail::store_history<W>* history_ = nullptr;
};

struct sync;

namespace detail {

inline void futex_wait_until(atomic<std::uint32_t>& word, std::uint32_t expected, std::uint64_t deadline) {
  if (scheduler* s = here()) {
    const unseen guard;
    s->point(self);
    if (here() != nullptr) {
      if (word.raw().load(std::memory_order_relaxed) != expected) return;
      (void)s->block(self, &word, deadline, /*may_wake_spuriously=*/true);
      return;
    }
  }
  // Free run (or not under the scheduler): a real wait, bounded so a lost wake cannot hang.
  teardown::detail::futex_wait_for(word.raw(), expected, 1'000'000);
}

inline void futex_wake(atomic<std::uint32_t>& word, int most) {
  if (scheduler* s = here()) {
    const unseen guard;
    s->point(self);
    if (scheduler* still = here()) {
      (void)still->wake(&word, most);
      return;
    }
  }
  if (most == 1) {
    teardown::detail::futex_wake_one(word.raw());
  } else {
    syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word.raw()), FUTEX_WAKE_PRIVATE, most, nullptr, nullptr, 0);
  }
}

inline std::uint64_t now_ns() noexcept {
  scheduler* s = active.load(std::memory_order_acquire);
  if (s == nullptr || self < 0) return teardown::detail::monotonic_ns();
  const unseen guard;
  if (!s->free_run()) return s->now_ns();
  return std::max(s->now_ns(), teardown::detail::monotonic_ns());
}

}  // namespace detail

/// The scheduler's clock: virtual time, moved by yields and when every thread waits (see the header).
struct clock {
  using rep = std::int64_t;
  using period = std::nano;
  using duration = std::chrono::nanoseconds;
  using time_point = std::chrono::time_point<clock>;
  static constexpr bool is_steady = true;
  static time_point now() noexcept { return time_point(duration(static_cast<rep>(detail::now_ns()))); }
};

namespace detail {
inline std::uint64_t deadline_of(clock::time_point tp) {
  if (tp == clock::time_point::max()) return no_deadline;
  const auto ns = tp.time_since_epoch().count();
  return ns < 0 ? 0 : static_cast<std::uint64_t>(ns);
}
}  // namespace detail

/// A futex mutex (three states, as in Drepper's "Futexes are tricky") over scheduled atomics.
class mutex {
 public:
  mutex() = default;
  mutex(const mutex&) = delete;
  mutex& operator=(const mutex&) = delete;

  void lock() {
    std::uint32_t c = 0;
    // acquire: pairs with unlock's release; the holder's writes are seen by the next holder.
    if (state_.compare_exchange_strong(c, 1, std::memory_order_acquire, std::memory_order_relaxed)) return;
    if (c != 2) c = state_.exchange(2, std::memory_order_acquire);
    while (c != 0) {
      detail::futex_wait_until(state_, 2, detail::no_deadline);
      c = state_.exchange(2, std::memory_order_acquire);
    }
  }
  bool try_lock() {
    std::uint32_t c = 0;
    return state_.compare_exchange_strong(c, 1, std::memory_order_acquire, std::memory_order_relaxed);
  }
  void unlock() {
    // release: pairs with lock's acquire.
    if (state_.fetch_sub(1, std::memory_order_release) != 1) {
      state_.store(0, std::memory_order_release);
      detail::futex_wake(state_, 1);
    }
  }

 private:
  atomic<std::uint32_t> state_{0};  // 0 free, 1 held, 2 held with waiters
};

/// A condition variable over a sequence word: a notify bumps it and wakes; a wait sleeps while
/// it has not moved. Spurious wake-ups happen, as the standard allows.
class condition_variable {
 public:
  condition_variable() = default;
  condition_variable(const condition_variable&) = delete;
  condition_variable& operator=(const condition_variable&) = delete;

  void notify_one() {
    seq_.fetch_add(1, std::memory_order_relaxed);  // ordered by the caller's mutex, if any
    detail::futex_wake(seq_, 1);
  }
  void notify_all() {
    seq_.fetch_add(1, std::memory_order_relaxed);
    detail::futex_wake(seq_, detail::max_threads);
  }
  void wait(std::unique_lock<mutex>& lock) { (void)wait_until(lock, clock::time_point::max()); }
  template <class Predicate>
  void wait(std::unique_lock<mutex>& lock, Predicate done) {
    while (!done()) wait(lock);
  }
  template <class Clock, class Duration>
  std::cv_status wait_until(std::unique_lock<mutex>& lock, std::chrono::time_point<Clock, Duration> until) {
    const std::uint64_t deadline = detail::deadline_of(std::chrono::time_point_cast<clock::duration>(until));
    const std::uint32_t seen = seq_.load(std::memory_order_relaxed);
    lock.unlock();
    detail::futex_wait_until(seq_, seen, deadline);
    lock.lock();
    return deadline != detail::no_deadline && detail::now_ns() >= deadline ? std::cv_status::timeout
                                                                            : std::cv_status::no_timeout;
  }
  template <class Clock, class Duration, class Predicate>
  bool wait_until(std::unique_lock<mutex>& lock, std::chrono::time_point<Clock, Duration> until, Predicate done) {
    while (!done()) {
      if (wait_until(lock, until) == std::cv_status::timeout) return done();
    }
    return true;
  }

 private:
  atomic<std::uint32_t> seq_{0};
};

/// The Sync policy to name in a queue type: llist<T, Hook, schedule::sync>.
struct sync {
  template <class W>
  using atomic = schedule::atomic<W>;
  static constexpr const char* name = "schedule";
  using atomics_policy = sync;
  using mutex = schedule::mutex;
  using condition_variable = schedule::condition_variable;
  using clock = schedule::clock;

  static std::uint64_t now_ns() noexcept { return detail::now_ns(); }
  static std::uint64_t coarse_now_ns() noexcept { return detail::now_ns(); }
  static void futex_wait(atomic<std::uint32_t>& word, std::uint32_t expected) noexcept {
    detail::futex_wait_until(word, expected, detail::no_deadline);
  }
  static void futex_wait_for(atomic<std::uint32_t>& word, std::uint32_t expected, std::uint64_t ns) noexcept {
    const std::uint64_t now = detail::now_ns();
    detail::futex_wait_until(word, expected, ns > detail::no_deadline - now - 1 ? detail::no_deadline - 1 : now + ns);
  }
  static void futex_wake_one(atomic<std::uint32_t>& word) noexcept { detail::futex_wake(word, 1); }
  template <class Rep, class Period>
  static void sleep_for(std::chrono::duration<Rep, Period> duration) {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(duration).count();
    if (detail::scheduler* s = detail::here()) {
      const detail::unseen guard;
      s->point(detail::self);
      if (detail::here() != nullptr) {
        const std::uint64_t wait_ns = static_cast<std::uint64_t>(std::max<std::int64_t>(ns, 1));
        (void)s->block(detail::self, nullptr, detail::now_ns() + wait_ns);
        return;
      }
    }
    std::this_thread::sleep_for(duration);
  }
  static void yield() noexcept {
    if (detail::scheduler* s = detail::here()) {
      const detail::unseen guard;
      s->yield(detail::self);
    }
  }
  static int start_thread(pthread_t* thread, void* (*entry)(void*), void* arg) noexcept;
  static int join_thread(pthread_t thread) noexcept;
};

namespace detail {

// Starts a thread under the active scheduler (the caller is under it), or a plain one.
inline int start_scheduled(pthread_t* thread, void* (*entry)(void*), void* arg) noexcept {
  scheduler* s = here();
  if (s == nullptr) return teardown::detail::start_thread_with_signals_blocked(thread, entry, arg);
  int k = 0;
  {
    const unseen guard;
    k = s->add_thread(self);
  }
  auto* b = new boot{s, k, entry, arg};
  const int error = teardown::detail::start_thread_with_signals_blocked(thread, &trampoline, b);
  if (error != 0) {
    delete b;
    s->fatal("pthread_create failed under the scheduler");
  }
  const unseen guard;
  s->set_os_thread(k, *thread);
  s->point(self);
  return 0;
}

inline int join_scheduled(pthread_t thread) noexcept {
  if (scheduler* s = here()) {
    const unseen guard;
    const int k = s->find_thread(thread);
    s->point(self);
    while (k >= 0 && here() != nullptr && !s->done(k)) (void)s->block(self, s->joinable(k), no_deadline);
    if (k >= 0 && here() != nullptr) s->joined(self, k);
  }
  return pthread_join(thread, nullptr);
}

}  // namespace detail

inline int sync::start_thread(pthread_t* thread, void* (*entry)(void*), void* arg) noexcept {
  return detail::start_scheduled(thread, entry, arg);
}
inline int sync::join_thread(pthread_t thread) noexcept { return detail::join_scheduled(thread); }

/// Inside a scenario: records a failed expectation (the first one is the run's verdict). The
/// run goes on, so the scenario's threads end as they would.
inline void check(bool ok, const std::string& what) {
  if (ok) return;
  if (detail::scheduler* s = detail::active.load(std::memory_order_acquire)) {
    const detail::unseen guard;
    s->fail(what);
  }
}

/// What a thread has done so far, as a stamp (memory_model.hpp): a scenario takes one before it
/// hands an item over, and the thread that uses the item asks ordered_here(stamp).
struct stamp {
  int thread = -1;  // -1: not under the scheduler; ordered everywhere
  std::uint32_t epoch = 0;
};
inline stamp publish() {
  if (detail::scheduler* s = detail::here()) {
    const detail::unseen guard;
    const auto [thread, epoch] = s->stamp(detail::self);
    return {thread, epoch};
  }
  return {};
}
/// True if what the stamp covers happens before the caller's now (through thread start and
/// join, and release/acquire pairs of the scheduled atomics), or either is not under the scheduler.
inline bool ordered_here(stamp published) {
  if (detail::scheduler* s = detail::here()) {
    const detail::unseen guard;
    return s->ordered(detail::self, {published.thread, published.epoch});
  }
  return true;
}

/// A thread of the scenario, under the scheduler; joined by join() or the destructor.
class thread {
 public:
  explicit thread(std::function<void()> fn) : fn_(std::make_unique<std::function<void()>>(std::move(fn))) {
    if (sync::start_thread(&os_, &run, fn_.get()) != 0) throw std::runtime_error("schedule::thread: cannot start");
    joinable_ = true;
  }
  thread(const thread&) = delete;
  thread& operator=(const thread&) = delete;
  ~thread() { join(); }
  void join() {
    if (!joinable_) return;
    joinable_ = false;
    (void)sync::join_thread(os_);
  }

 private:
  static void* run(void* fn) {
    (*static_cast<std::function<void()>*>(fn))();
    return nullptr;
  }
  std::unique_ptr<std::function<void()>> fn_;
  pthread_t os_{};
  bool joinable_ = false;
};

namespace detail {

inline std::optional<std::string> environment(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

constexpr bool under_sanitizer() {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  return true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
  return true;
#else
  return false;
#endif
#else
  return false;
#endif
}

struct run_outcome {
  std::optional<std::string> failure;
  std::uint64_t steps = 0;
  int threads = 0;
  std::vector<decision> decisions;
  std::uint64_t stale_reads = 0;
};

inline void* run_scenario(void* scenario) {
  (*static_cast<const std::function<void()>*>(scenario))();
  return nullptr;
}

inline run_outcome run_once(const explore_options& opts, strategy kind, std::uint64_t seed,
                            std::vector<std::size_t> forced, std::uint64_t expected_steps, bool trace,
                            const std::function<void()>& scenario, const std::string& name) {
  scheduler s(opts, kind, seed, std::move(forced), expected_steps, trace);
  s.set_name(name);
  active.store(&s, std::memory_order_release);
  const int first = s.add_thread(-1);
  auto* b = new boot{&s, first, &run_scenario, const_cast<std::function<void()>*>(&scenario)};
  pthread_t os{};
  if (pthread_create(&os, nullptr, &trampoline, b) != 0) {
    delete b;
    s.fatal("cannot start the scenario's thread");
  }
  s.set_os_thread(first, os);
  s.start(first);
  all_done_signal().acquire();
  pthread_join(os, nullptr);
  active.store(nullptr, std::memory_order_release);
  return {s.failure(), s.steps(), s.threads(), s.decisions(), s.stale_reads()};
}

inline std::string name_of(strategy kind, std::uint64_t seed, std::uint64_t steps,
                           const std::vector<std::size_t>& path) {
  switch (kind) {
    case strategy::mixed:  // a run is one or the other
    case strategy::pct: return "pct:" + std::to_string(seed) + ":" + std::to_string(steps);
    case strategy::random: return "random:" + std::to_string(seed);
    case strategy::exhaustive: {
      std::string name = "exhaustive:";
      for (std::size_t i = 0; i < path.size(); ++i) name += (i ? "." : "") + std::to_string(path[i]);
      return name;
    }
  }
  return "?";
}

// "pct:SEED:STEPS", "random:SEED", "exhaustive:I.J.K": the strategy, seed, PCT's step estimate
// and the exhaustive path. False if the name is not one of these.
inline bool parse_name(const std::string& name, strategy& kind, std::uint64_t& seed, std::uint64_t& steps,
                       std::vector<std::size_t>& path) {
  const auto numbers = [](const std::string& text, char separator) {
    std::vector<std::uint64_t> out;
    std::size_t at = 0;
    while (at <= text.size() && !text.empty()) {
      const std::size_t end = std::min(text.find(separator, at), text.size());
      out.push_back(std::stoull(text.substr(at, end - at)));
      at = end + 1;
    }
    return out;
  };
  try {
    if (name.rfind("pct:", 0) == 0) {
      const auto n = numbers(name.substr(4), ':');
      if (n.size() != 2) return false;
      kind = strategy::pct, seed = n[0], steps = n[1];
      return true;
    }
    if (name.rfind("random:", 0) == 0) {
      kind = strategy::random, seed = std::stoull(name.substr(7));
      return true;
    }
    if (name.rfind("exhaustive:", 0) == 0) {
      kind = strategy::exhaustive;
      for (std::uint64_t i : numbers(name.substr(11), '.')) path.push_back(static_cast<std::size_t>(i));
      return true;
    }
  } catch (const std::exception&) {
  }
  return false;
}

// The next exhaustive path after a run that took `decisions`, or nullopt when every schedule
// within the bound has been run.
inline std::optional<std::vector<std::size_t>> next_path(const std::vector<decision>& decisions, int bound) {
  for (std::size_t i = decisions.size(); i-- > 0;) {
    const decision& d = decisions[i];
    for (std::size_t alt = d.taken + 1; alt < d.options.size(); ++alt) {
      const int cost = d.preemptions_before + (d.self_runnable ? 1 : 0);
      if (cost > bound) break;
      std::vector<std::size_t> path;
      for (std::size_t j = 0; j < i; ++j) path.push_back(decisions[j].taken);
      path.push_back(alt);
      return path;
    }
  }
  return std::nullopt;
}

}  // namespace detail

/// Runs `scenario` under opts.schedules schedules (see the header comment), stopping at the
/// first that fails. Prints a line with what it explored, and for a failure the schedule's name.
inline explore_result explore(explore_options opts, const std::function<void()>& scenario) {
  const bool trace = detail::environment("TEARDOWN_SCHEDULE_TRACE").has_value();
  if (const auto rate = detail::environment("TEARDOWN_SCHEDULE_SPURIOUS")) opts.spurious_per_mille = std::stoi(*rate);
  if (const auto step = detail::environment("TEARDOWN_SCHEDULE_YIELD_NS")) opts.yield_ns = std::stoull(*step);
  if (const auto stale = detail::environment("TEARDOWN_SCHEDULE_STALE")) opts.stale_per_mille = std::stoi(*stale);
  if (const auto count = detail::environment("TEARDOWN_SCHEDULES")) {
    opts.schedules = std::stoull(*count);
  } else if (detail::under_sanitizer()) {
    opts.schedules = std::max<std::uint64_t>(opts.schedules / 10, 1);
  }
  explore_result result;
  const auto note_run = [&](const detail::run_outcome& outcome, const std::string& name) {
    ++result.runs;
    result.stale_reads += outcome.stale_reads;
    result.longest_run_steps = std::max(result.longest_run_steps, outcome.steps);
    result.most_threads = std::max(result.most_threads, static_cast<std::uint64_t>(outcome.threads));
    if (outcome.failure) {
      result.failure = outcome.failure;
      result.failed_schedule = name;
    }
  };
  if (const auto replay = detail::environment("TEARDOWN_SCHEDULE_REPLAY")) {
    strategy kind{};
    std::uint64_t seed = 0, steps = 0;
    std::vector<std::size_t> path;
    if (!detail::parse_name(*replay, kind, seed, steps, path)) {
      result.failure = "TEARDOWN_SCHEDULE_REPLAY: not a schedule name: " + *replay;
      return result;
    }
    opts.kind = kind;
    note_run(detail::run_once(opts, kind, seed, path, steps, trace, scenario, *replay), *replay);
  } else if (opts.kind == strategy::exhaustive) {
    std::vector<std::size_t> path;
    while (result.runs < opts.schedules) {
      const std::string name = detail::name_of(opts.kind, 0, 0, path);
      const detail::run_outcome outcome = detail::run_once(opts, opts.kind, 0, path, 0, trace, scenario, name);
      std::vector<std::size_t> taken;
      for (const detail::decision& d : outcome.decisions) taken.push_back(d.taken);
      note_run(outcome, detail::name_of(opts.kind, 0, 0, taken));
      if (result.failure) break;
      const auto next = detail::next_path(outcome.decisions, opts.preemption_bound);
      if (!next) {
        result.exhausted = true;
        break;
      }
      path = *next;
    }
  } else {
    std::uint64_t expected_steps = 1000;
    for (std::uint64_t i = 0; i < opts.schedules && !result.failure; ++i) {
      const std::uint64_t seed = opts.seed + i;
      const strategy kind = opts.kind != strategy::mixed ? opts.kind : i % 2 == 0 ? strategy::pct : strategy::random;
      const std::string name = detail::name_of(kind, seed, expected_steps, {});
      const detail::run_outcome outcome = detail::run_once(opts, kind, seed, {}, expected_steps, trace, scenario, name);
      note_run(outcome, name);
      // PCT's change points fall within the longest run seen: a guess beyond it wastes them.
      expected_steps = std::max(result.longest_run_steps, std::uint64_t{1});
    }
  }
  std::fprintf(stderr, "schedule: %s: %llu runs (%s), up to %llu steps and %llu threads, %llu stale reads%s%s%s\n",
               opts.name, static_cast<unsigned long long>(result.runs),
               opts.kind == strategy::mixed ? "pct and random" : opts.kind == strategy::pct ? "pct"
               : opts.kind == strategy::random                            ? "random"
                                                                          : "exhaustive",
               static_cast<unsigned long long>(result.longest_run_steps),
               static_cast<unsigned long long>(result.most_threads),
               static_cast<unsigned long long>(result.stale_reads), result.exhausted ? ", all within the bound" : "",
               result.failure ? "; FAILED under " : "", result.failure ? result.failed_schedule.c_str() : "");
  if (result.failure) {
    std::fprintf(stderr, "schedule: %s: %s\nschedule: replay with TEARDOWN_SCHEDULE_REPLAY=%s\n", opts.name,
                 result.failure->c_str(), result.failed_schedule.c_str());
  }
  return result;
}

}  // namespace teardown::schedule
