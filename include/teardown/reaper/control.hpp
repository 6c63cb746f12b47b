// teardown/reaper/control.hpp — the control plane: construction, flush tickets, the hand count, freeze/thaw, stop.
//
// Out-of-line members of teardown::reaper (reaper_class.hpp declares them, with their contracts, and includes
// this file at its end). Include teardown/reaper.hpp, not this file.
//
// Design: docs/design.md, "The barrier".
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

#include "teardown/reaper/reaper_class.hpp"
#include "teardown/detail/fatal.hpp"
#include "teardown/worker_thread.hpp"

namespace teardown {

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline reaper<T, Hook, Fn, Queue>::reaper(Fn fn, reaper_options opts, pool_link* link)
    : fn_(std::move(fn)), opts_(detail::validated_reaper_options(std::move(opts), "teardown::reaper")), link_(link) {
  if (opts_.driven) {
    if (link_ != nullptr) {
      throw std::invalid_argument("teardown::reaper_pool: worker.driven: a pool's workers are threads");
    }
    work_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (work_fd_ < 0) {
      throw std::system_error(errno, std::generic_category(), "teardown::reaper: cannot create work_fd");
    }
    gate_ = std::make_shared<detail::drive_gate_over<mutex_type>>();
    gate_->reaper = this;
    gate_->run = [](void* self, drive_limits limits) { return static_cast<reaper*>(self)->run(limits); };
    detail::fork_registry::instance().add(this);
    return;  // no thread: the program drives (see "Driven mode")
  }
  {
    const std::lock_guard lock(control_mutex_);
    worker_running_ = true;
  }
  detail::fork_registry::instance().add(this);
  if (const int error = sync_ops::start_thread(&worker_, &reaper::worker_entry, this); error != 0) {
    detail::fork_registry::instance().remove(this);
    throw std::system_error(error, std::generic_category(), "teardown::reaper: cannot start the worker");
  }
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline reaper<T, Hook, Fn, Queue>::~reaper() {
  if (on_worker()) {
    detail::fatal_misuse(
        "teardown::reaper::~reaper: the reaper is destroyed from its own worker (from fn); the worker would go "
        "on using the freed reaper. Destroy it from another thread.\n");
  }
  if (reaping_here::contains(this)) {
    detail::fatal_misuse(
        "teardown::reaper::~reaper: the reaper is destroyed from take or fn inside its own reap_on_caller; the "
        "call would go on using the freed reaper. Destroy it after reap_on_caller returns.\n");
  }
  if (driving_here::contains(this)) {
    detail::fatal_misuse(
        "teardown::reaper::~reaper: the reaper is destroyed from fn inside its own run or flush; the call would "
        "go on using the freed reaper. Destroy it after run returns.\n");
  }
  if (gate_) {
    const std::lock_guard lock(*gate_);  // waits for a handle's run in progress
    gate_->reaper = nullptr;
  }
  stop();
  detail::fork_registry::instance().remove(this);
  if (work_fd_ >= 0) ::close(work_fd_);
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::freeze() {
  refuse_on_worker("freeze");
  std::unique_lock lock(control_mutex_);
  ++freeze_depth_;
  request_locked();
  if (opts_.driven) {
    control_changed_.wait(lock, [&] { return drivers_ == 0 || driver_parked_ || stop_requested_; });
    lock.unlock();
    // Between runs the rest of a batch is held: hand it back, so reap_on_caller reaches it. No
    // driver is counted, so a drive lock taken by someone else is a run or flush that began after
    // the freeze: it hands the rest back itself when it sees the freeze (or the driver is parked,
    // having handed it back).
    if (drive_mutex_.try_lock()) {
      lock.lock();
      if (freeze_depth_ > 0 && !stop_requested_) (void)hand_back_in_flight();
      handed_back_ = false;
      lock.unlock();
      drive_mutex_.unlock();
    }
    return;
  }
  lock.unlock();
  kick();
  lock.lock();
  control_changed_.wait(lock, [&] { return worker_parked_ || !worker_running_ || stop_requested_; });
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::thaw() {
  std::unique_lock lock(control_mutex_);
  if (freeze_depth_ == 0) throw std::logic_error("teardown::reaper::thaw: the reaper is not frozen");
  --freeze_depth_;
  control_changed_.notify_all();
  // A frozen run did nothing and a freeze handed the rest back: say again that work waits.
  if (opts_.driven && freeze_depth_ == 0 && !stop_requested_ && !queue_.empty()) {
    lock.unlock();
    signal_work();
  }
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::stop() {
  refuse_on_worker("stop");
  if (opts_.driven) {
    (void)drive_stop(clock_type::time_point::max());
    return;
  }
  request_stop();
  (void)await_stop(clock_type::time_point::max());
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
template <class Take>
inline std::size_t reaper<T, Hook, Fn, Queue>::reap_on_caller(Take&& take) {
  refuse_on_worker("reap_on_caller");
  {
    const std::lock_guard lock(control_mutex_);
    if (caller_reaps_++ == 0) caller_reaps_since_ = flush_completed_;
  }
  // Counted as a hand (see "The barrier") before the take, until everything taken is torn
  // down or back on the queue: a flush after stop waits for it.
  const struct hand_scope {
    reaper& self;
    const std::uint64_t unit;
    explicit hand_scope(reaper& owner) noexcept : self(owner), unit(owner.open_hand()) {}
    ~hand_scope() { self.close_hand(unit); }
  } hand(*this);
  llist_batch<T, Hook> offered = take_queue(/*sweep=*/false, /*oldest_first=*/true);
  llist_chain<T, Hook> declined;  // front = newest, as on the queue
  // take and fn run below on this thread: a flush, freeze or stop from them would wait for
  // this very call, so they are refused as they are on the worker.
  const typename reaping_here::scope reaping(this);
  std::size_t torn_down = 0;
  while (T* item = offered.pop_front()) {
    bool here = false;
    try {
      here = take(*item);
    } catch (...) {
      declined.push_front(*item);
      while (T* rest = offered.pop_front()) declined.push_front(*rest);
      finish_caller_reap(std::move(declined));
      throw;
    }
    if (!here) {
      declined.push_front(*item);
      continue;
    }
    tear_down_inline(*item);  // may free item
    ++torn_down;
  }
  finish_caller_reap(std::move(declined));
  return torn_down;
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline reaper_stats reaper<T, Hook, Fn, Queue>::stats() const noexcept {
  reaper_stats s;
  s.enqueued = enqueued_.read();
  s.reaped = reaped_.load(std::memory_order_relaxed);
  s.pending = s.enqueued > s.reaped ? s.enqueued - s.reaped : 0;
  s.errors = errors_.load(std::memory_order_relaxed);
  s.batches = batches_.load(std::memory_order_relaxed);
  s.inline_reaped = inline_reaped_.load(std::memory_order_relaxed);
  s.wakeups = wakeups_.load(std::memory_order_relaxed);
  s.worker_cpu_ns = worker_cpu_ns();
  s.longest_wait_ns = longest_wait_ns_.load(std::memory_order_relaxed);
  s.setup_warnings = setup_warnings_.load(std::memory_order_relaxed);
  s.running = !opts_.driven && (state_.load(std::memory_order_relaxed) & stopped_bit) == 0;
  s.stolen = stolen_.load(std::memory_order_relaxed);
  s.yields = yields_.load(std::memory_order_relaxed);
  s.polls = polls_.load(std::memory_order_relaxed);
  s.boosts = boosts_.load(std::memory_order_relaxed);
  s.boosts_refused = boosts_refused_.load(std::memory_order_relaxed);
  s.boosted = boosted_.load(std::memory_order_relaxed);
  s.helped = helped_.load(std::memory_order_relaxed);
  s.hurries = hurries_.load(std::memory_order_relaxed);
  s.poll_limit_ns = poll_limit_ns_.load(std::memory_order_relaxed);
  return s;
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::finish_caller_reap(llist_chain<T, Hook>&& declined) noexcept {
  // Stopped already (an RMW that changes nothing: like the kick below, it is ordered against
  // the worker's STOPPED exchange): no worker will take them, and a put-back now could hand
  // an item enqueued before a settling flush to a hand counted after its flip, which that
  // flush does not wait for. Torn down here instead, inside this call's hand. Not stopped:
  // this call began before the worker ended, so a flush after stop waits for it
  // (caller_reaps_) and a put-back is safe.
  // relaxed: the RMW's place in the word's order decides; no data rides on it.
  if (!declined.empty() && (state_.fetch_add(0, std::memory_order_relaxed) & stopped_bit)) {
    while (T* item = declined.pop_front()) tear_down_inline(*item);
  }
  const bool requeued = !declined.empty();
  if (requeued) {
    const bool first = queue_.add_batch(std::move(declined));
    if (first) oldest_enqueue_ns_.store(sync_ops::now_ns(), std::memory_order_relaxed);
    if (first && opts_.driven && !(state_.load(std::memory_order_relaxed) & stopped_bit)) signal_work();
    // An RMW, not a load: like enqueue's kick, it is ordered against the worker's STOPPED
    // exchange, so either the worker's final drain sees the items put back or this sees
    // STOPPED and tears them down here, still inside this call's hand.
    if (kick() & stopped_bit) drain_inline();
  }
  std::unique_lock lock(control_mutex_);
  --caller_reaps_;
  if (requeued) {
    ++put_backs_;
    flush_completed_ = std::min(flush_completed_, caller_reaps_since_);
  }
  const bool flush_waits = flush_requested_ > flush_completed_;
  if (flush_waits) request_locked();
  control_changed_.notify_all();
  lock.unlock();
  if (flush_waits) (void)kick();  // after the request: the worker looks at it
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline std::uint64_t reaper<T, Hook, Fn, Queue>::open_hand() noexcept {
  std::uint64_t seen = inline_hands_.load(std::memory_order_relaxed);
  std::uint64_t unit = 0;
  // acquire: pairs with the flusher's release flip. After the flip, we read it, so the
  // flusher's own drain happened before our take, and everything we take was added after that
  // drain. Counted before the flip, we need no release: the flip (an RMW) reads our count, and
  // the flusher waits for our close, whose release orders our teardowns.
  do {
    unit = hand_unit((seen & hand_side_bit) != 0);
  } while (!inline_hands_.compare_exchange_weak(seen, seen + unit, std::memory_order_acquire,
                                                std::memory_order_relaxed));
  // For a schedule test: a hand on a side a flip made current is ordered after that flip.
  detail::data_read<sync_ops>(hand_side_key((seen & hand_side_bit) != 0));
  return unit;
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::close_hand(std::uint64_t unit) noexcept {
  // release: pairs with the flusher's acquire read of zero: our teardowns happen before its
  // flush returns.
  inline_hands_.fetch_sub(unit, std::memory_order_release);
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::drain_inline_counted() noexcept {
  const std::uint64_t unit = open_hand();
  drain_inline();
  close_hand(unit);
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline bool reaper<T, Hook, Fn, Queue>::await_no_caller_reaps(std::unique_lock<mutex_type>& lock,
                                                       typename clock_type::time_point deadline) {
  const auto no_caller_reaps = [&] { return caller_reaps_ == 0; };
  if (deadline == clock_type::time_point::max()) {
    control_changed_.wait(lock, no_caller_reaps);
    return true;
  }
  return control_changed_.wait_until(lock, deadline, no_caller_reaps);
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline bool reaper<T, Hook, Fn, Queue>::settle_after_stop(typename clock_type::time_point deadline) {
  {
    std::unique_lock lock(control_mutex_);
    if (!await_no_caller_reaps(lock, deadline)) return false;
  }
  // One settler at a time from its drain on: a settler's own drain is not a hand, so a second
  // settler must not flip and wait out the old side while the first still tears down what
  // its drain took (the checks of tests/model/spin/flush_barrier.pml found that schedule).
  // A deadline is polled, not passed to a timed lock: the sanitizers' runtimes do not all
  // intercept pthread_mutex_clocklock.
  std::unique_lock turn(settle_mutex_, std::defer_lock);
  if (deadline == clock_type::time_point::max()) {
    turn.lock();
  } else {
    while (!turn.try_lock()) {
      if (clock_type::now() >= deadline) return false;
      sync_ops::sleep_for(std::chrono::microseconds(50));
    }
  }
  drain_inline();
  constexpr std::uint64_t side0_mask = 0xffffffffu;
  constexpr std::uint64_t side1_mask = std::uint64_t{0x7fffffff} << 32;
  // Hands still open on the side this flip makes current again: a settler before us flipped
  // and gave up at its deadline while they were open. They are older than our drain, so we
  // wait for them first; no new hand joins that side until we flip, so this wait ends.
  // (Flipping first would mix them with new hands, and we would wait only for the other side.)
  // relaxed: only settlers flip, one at a time under settle_mutex_, which we hold.
  const bool current_side = (inline_hands_.load(std::memory_order_relaxed) & hand_side_bit) != 0;
  if (!await_no_hands(current_side ? side0_mask : side1_mask, deadline)) return false;
  // release: pairs with open_hand's acquire (see there): our drain happens before the take of
  // a hand that reads the flip. Nothing of the hands counted before it is read here.
  detail::data_written<sync_ops>(hand_side_key(!current_side));  // our drain, for a schedule test
  const std::uint64_t before = inline_hands_.fetch_xor(hand_side_bit, std::memory_order_release);
  return await_no_hands((before & hand_side_bit) != 0 ? side1_mask : side0_mask, deadline);
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline bool reaper<T, Hook, Fn, Queue>::await_no_hands(std::uint64_t side_mask,
                                                       typename clock_type::time_point deadline) {
  // acquire: pairs with close_hand's release decrement.
  for (unsigned spins = 0; (inline_hands_.load(std::memory_order_acquire) & side_mask) != 0; ++spins) {
    if (clock_type::now() >= deadline) return false;
    if (spins < 1000) {
      sync_ops::yield();
    } else {
      sync_ops::sleep_for(std::chrono::microseconds(50));  // a teardown that takes long
    }
  }
  return true;
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::request_stop() noexcept {
  std::unique_lock lock(control_mutex_);
  if (!worker_running_ || stop_requested_) return;
  stop_requested_ = true;
  request_locked();
  control_changed_.notify_all();  // a worker parked by a freeze: stop overrides it
  lock.unlock();
  kick();
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline bool reaper<T, Hook, Fn, Queue>::await_stop(typename clock_type::time_point deadline) {
  std::unique_lock lock(control_mutex_);
  const auto ended = [&] { return worker_done_ || !worker_running_; };
  // The worker's final drain: a program's exit waits here for its deferred teardowns.
  if (!await_boost_point(lock, deadline, ended, "stop")) return false;
  if (deadline == clock_type::time_point::max()) {
    control_changed_.wait(lock, ended);
  } else if (!control_changed_.wait_until(lock, deadline, ended)) {
    return false;
  }
  if (worker_running_ && !worker_joining_) {
    worker_joining_ = true;
    lock.unlock();
    if (const int error = sync_ops::join_thread(worker_); error != 0) std::terminate();
    lock.lock();
    worker_known_.store(false, std::memory_order_relaxed);  // its pthread_t may be reused
    worker_running_ = false;
    control_changed_.notify_all();
  } else {
    control_changed_.wait(lock, [&] { return !worker_running_; });
  }
  lock.unlock();
  // A fork child, items whose producers raced the end of the worker, and everything in
  // a caller's hands.
  return settle_after_stop(deadline);
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::stop_here_on_own_worker() noexcept {
  {
    const std::lock_guard lock(control_mutex_);
    stop_requested_ = true;
    request_locked();
    control_changed_.notify_all();
  }
  // acquire, as the worker's own STOPPED exchange at the end of worker_main: pairs with every
  // producer's kick before it, so their adds are visible to the drain below.
  (void)state_.exchange(stopped_bit, std::memory_order_acquire);
  for (;;) {
    while (T* item = in_flight_.pop_front()) tear_down(*item, /*on_worker=*/true);
    in_flight_ = take_queue(/*sweep=*/false, opts_.order == drain_order::oldest_first);
    if (in_flight_.empty()) return;
  }
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline bool reaper<T, Hook, Fn, Queue>::flush_until(typename clock_type::time_point deadline) {
  refuse_on_worker("flush");
  if (opts_.driven) return drive_flush(deadline);
  return await_flush(request_flush(), deadline);
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline std::uint64_t reaper<T, Hook, Fn, Queue>::request_flush() noexcept {
  std::unique_lock lock(control_mutex_);
  if (!worker_running_ || stop_requested_) return 0;
  const std::uint64_t ticket = ++flush_requested_;
  request_locked();
  lock.unlock();
  kick();
  return ticket;
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline bool reaper<T, Hook, Fn, Queue>::await_flush(std::uint64_t ticket, typename clock_type::time_point deadline) {
  std::unique_lock lock(control_mutex_);
  // Ticket 0: stopped, or stopping; the stop drains everything. Either way, once the worker
  // has ended, what it did not tear down is on the queue or in a caller's hands.
  const auto worker_gone = [&] { return !worker_running_ || worker_done_; };
  const auto done = [&] {
    return (ticket != 0 && flush_completed_ >= ticket && caller_reaps_ == 0) || worker_gone();
  };
  if (!await_boost_point(lock, deadline, done, "flush")) return false;
  if (deadline == clock_type::time_point::max()) {
    control_changed_.wait(lock, done);
  } else if (!control_changed_.wait_until(lock, deadline, done)) {
    return false;
  }
  if (ticket != 0 && flush_completed_ >= ticket && caller_reaps_ == 0) return true;
  lock.unlock();
  return settle_after_stop(deadline);
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::refuse_on_worker(const char* operation) const {
  if (on_worker()) {
    throw std::logic_error(std::string("teardown::reaper::") + operation +
                           ": called from the reaper's own worker (fn); it would wait for itself");
  }
  if (reaping_here::contains(this)) {
    throw std::logic_error(std::string("teardown::reaper::") + operation +
                           ": called from take or fn inside reap_on_caller; it would wait for itself");
  }
  if (driving_here::contains(this)) {
    throw std::logic_error(std::string("teardown::reaper::") + operation +
                           ": called from fn inside the reaper's own run or flush; it would wait for itself");
  }
}

template <class Reaper>
bool detail::stop_on_own_worker(Reaper& reaper) noexcept {
  if (!reaper.on_worker()) return false;
  reaper.stop_here_on_own_worker();
  return true;
}

}  // namespace teardown
