// tests/unit/schedule/scheduler.hpp — the deterministic scheduler itself: the threads' slots,
// the picks (PCT, random walk, bounded enumeration), virtual time, wake-ups, the vector clocks of
// the weak memory model, and the active scheduler a thread finds itself under.
//
// Who may call what: primitives.hpp and schedule.hpp's explore only; scenarios use schedule.hpp.
// How a run goes, time, memory and wake-ups: schedule.hpp's opening.
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
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
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

constexpr std::uint64_t no_deadline = ~std::uint64_t{0};

enum class status { unused, runnable, blocked, done };

// A thread's turn: given by release(), waited for by acquire(). A bare futex, where
// std::binary_semaphore spins with sched_yield before it sleeps: a yield hands the CPU to
// whatever else runs there, so on a busy machine each hand-off waited out another process's
// slice (the help scenarios ran 50 times slower beside two spinning processes).
class turn {
 public:
  void release() noexcept {
    word_.store(1, std::memory_order_release);
    teardown::detail::futex_wake_one(word_);
  }
  void acquire() noexcept {
    while (word_.exchange(0, std::memory_order_acquire) == 0) teardown::detail::futex_wait(word_, 0);
  }

 private:
  std::atomic<std::uint32_t> word_{0};
};

// Released by the last thread of a run; the test's thread waits for it. A turn too: the test's
// thread shares the exploration's CPU, and a semaphore that spins and yields before it sleeps
// kept it runnable there through every run, so that beside a spinner on that CPU the scenario's
// threads got a fraction of their share (a test took 54 s instead of 4.4 s).
inline turn& all_done_signal() {
  static turn done;
  return done;
}

struct thread_slot {
  turn go;
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
  // The newest slot with that handle: a pthread_t is reused once its thread is joined, so an
  // older slot with the same value is a thread already joined (one that started a sibling of
  // its joiner, say), and the newest is the live one.
  int find_thread(pthread_t os) const {
    for (int k = next_slot_ - 1; k >= 0; --k) {
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
  // The data hooks (atomics.hpp): each thread's last data_written at a place is stamped, and a
  // data_read there that is not ordered after every one of them fails the run, as a data race
  // would (a thread's earlier writes there are covered by its last).
  void data_written(int self, const void* where) {
    auto& last = writes_[where];
    const auto mine = std::find_if(last.begin(), last.end(), [&](const auto& s) { return s.first == self; });
    if (mine != last.end()) {
      *mine = stamp(self);
    } else {
      last.push_back(stamp(self));
    }
  }
  void data_read(int self, const void* where) {
    for (const auto& written : writes_[where]) {
      if (!ordered(self, written)) {
        fail("data read unordered after its write (a data hook: an llist link, the worker's thread handle, "
             "the pool's worker table, a hand's side, a read of the worker's CPU clock)");
      }
    }
  }
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
  std::unordered_map<const void*, std::vector<std::pair<int, std::uint32_t>>> writes_;  // data_written's
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

}  // namespace teardown::schedule
