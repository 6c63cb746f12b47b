// tests/unit/schedule/primitives.hpp — the scheduler's Sync policy (teardown/sync.hpp): atomics
// with a scheduling point and weak memory, futex waits and wakes, the virtual clock, a mutex, a
// condition variable, sleep, yield, thread start and join; and what a scenario calls besides:
// check, publish and ordered_here, thread.
//
// Who may call what: scenarios and the threads they start, through schedule.hpp (see its
// opening); sync is the policy to name in a queue type.
#pragma once

#include "schedule/scheduler.hpp"

namespace teardown::schedule {

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
  static void futex_wake_all(atomic<std::uint32_t>& word) noexcept { detail::futex_wake(word, detail::max_threads); }
  // The data hooks (atomics.hpp): under the scheduler, a read must happen after the write.
  static void data_written(const void* where) noexcept { on_scheduler(&detail::scheduler::data_written, where); }
  static void data_read(const void* where) noexcept { on_scheduler(&detail::scheduler::data_read, where); }
  // A hook's call on the running scheduler, unseen by ThreadSanitizer; nothing outside a run.
  static void on_scheduler(void (detail::scheduler::*hook)(int, const void*), const void* what) noexcept {
    if (detail::scheduler* s = detail::here()) {
      const detail::unseen guard;
      (s->*hook)(detail::self, what);
    }
  }
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

}  // namespace teardown::schedule
