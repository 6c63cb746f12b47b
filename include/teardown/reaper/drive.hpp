// teardown/reaper/drive.hpp — driven mode: run, the driven flush and stop, work_fd.
//
// Out-of-line members of teardown::reaper (reaper_class.hpp declares them, with their contracts, and includes
// this file at its end). Include teardown/reaper.hpp, not this file.
//
// Design: docs/design.md, "Driven mode".
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <utility>

#include "teardown/reaper/reaper_class.hpp"

namespace teardown {

// Counted in drivers_ by the caller (under control_mutex_) before the scope begins; the scope
// releases the drive lock first and uncounts after, so a freeze waiting for no driver cannot
// return while a run still holds the rest of its batch under that lock.
template <class T, llist_node T::*Hook, class Fn, class Queue>
struct reaper<T, Hook, Fn, Queue>::driving_scope {
  reaper& self;
  std::unique_lock<mutex_type>& drive;
  typename driving_here::scope here;
  driving_scope(reaper& owner, std::unique_lock<mutex_type>& drive_lock) noexcept
      : self(owner), drive(drive_lock), here(&owner) {}
  ~driving_scope() {
    if (drive.owns_lock()) drive.unlock();
    const std::lock_guard lock(self.control_mutex_);
    --self.drivers_;
    self.control_changed_.notify_all();
  }
};

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::signal_work() noexcept {
  wakeups_.fetch_add(1, std::memory_order_relaxed);
  const std::uint64_t one = 1;
  (void)!::write(work_fd_, &one, sizeof one);  // EAGAIN only with the counter near 2^64: still readable
  if (opts_.on_work) {
    try {
      opts_.on_work(drive_handle(gate_));
    } catch (...) {
      report_error();
    }
  }
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::take_driven(bool sweep) noexcept {
  take_from_queue(sweep);
  if (in_flight_.empty()) return;
  batches_.fetch_add(1, std::memory_order_relaxed);
  const std::uint64_t since = std::exchange(batch_since_ns_, 0);
  const std::uint64_t now = since != 0 ? sync_ops::now_ns() : 0;
  if (since != 0 && now > since && now - since > longest_wait_ns_.load(std::memory_order_relaxed)) {
    longest_wait_ns_.store(now - since, std::memory_order_relaxed);  // written under the drive lock only
  }
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::run_one_driven() noexcept {
  T* item = in_flight_.pop_front();
  tear_down(*item, /*on_worker=*/true);
  if (in_flight_.empty() && opts_.after_batch) call_after_batch();
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline bool reaper<T, Hook, Fn, Queue>::driven_frozen(bool wait, typename clock_type::time_point deadline,
                                                     bool& expired) {
  if (!control_requested_.load(std::memory_order_relaxed)) return false;
  std::unique_lock lock(control_mutex_);
  if (freeze_depth_ == 0 || stop_requested_) {
    if (freeze_depth_ == 0) control_requested_.store(false, std::memory_order_relaxed);  // under control_mutex_
    return false;
  }
  (void)hand_back_in_flight();
  handed_back_ = false;
  if (!wait) return true;  // a run: it returns now, and a freeze waits until it has
  driver_parked_ = true;
  control_changed_.notify_all();
  const auto thawed = [&] { return freeze_depth_ == 0 || stop_requested_; };
  if (deadline == clock_type::time_point::max()) {
    control_changed_.wait(lock, thawed);
  } else if (!control_changed_.wait_until(lock, deadline, thawed)) {
    expired = true;
  }
  driver_parked_ = false;
  return true;
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline drive_result reaper<T, Hook, Fn, Queue>::run_locked(drive_limits limits,
                                                           std::unique_lock<mutex_type>& drive) {
  std::uint64_t value = 0;
  // Read before the take: an add after the take finds the queue empty and signals again.
  (void)!::read(work_fd_, &value, sizeof value);
  {
    const std::lock_guard lock(control_mutex_);
    if (stop_requested_) return {};
    if (freeze_depth_ > 0) {
      (void)hand_back_in_flight();  // a frozen reaper holds nothing; thaw signals
      handed_back_ = false;
      return {};
    }
    ++drivers_;
  }
  const driving_scope scope(*this, drive);
  const bool timed = limits.time != std::chrono::nanoseconds::max();
  const std::uint64_t start = timed ? sync_ops::now_ns() : 0;
  const std::uint64_t budget_ns = limits.time.count() > 0 ? static_cast<std::uint64_t>(limits.time.count()) : 0;
  drive_result result;
  bool expired = false;
  while (result.items < limits.items) {
    if (driven_frozen(/*wait=*/false, clock_type::time_point::max(), expired)) return {result.items, false};
    if (in_flight_.empty()) take_driven(/*sweep=*/false);
    if (in_flight_.empty()) break;
    run_one_driven();
    ++result.items;
    if (timed && sync_ops::now_ns() - start >= budget_ns) break;
  }
  result.more = driven_more();
  if (!result.more && take_after_batch_request()) call_after_batch();  // request_after_batch
  if (result.more) signal_work();
  return result;
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline bool reaper<T, Hook, Fn, Queue>::drive_flush(typename clock_type::time_point deadline) {
  std::unique_lock drive(drive_mutex_, std::defer_lock);
  if (!lock_before(drive, deadline)) return false;
  std::uint64_t put_backs = 0;
  {
    std::unique_lock lock(control_mutex_);
    if (state_.load(std::memory_order_relaxed) & stopped_bit) {  // stop has drained (it held the drive lock)
      lock.unlock();
      drive.unlock();
      return settle_after_stop(deadline);
    }
    ++drivers_;
    put_backs = put_backs_;
  }
  const driving_scope scope(*this, drive);
  for (;;) {
    bool took = false;
    bool expired = false;
    for (;;) {
      if (driven_frozen(/*wait=*/true, deadline, expired)) {
        if (expired) return false;
        took = false;  // what was handed back is on the queue again
      }
      if (in_flight_.empty()) {
        if (took) break;
        take_driven(/*sweep=*/true);
        took = true;
        if (in_flight_.empty()) break;
      }
      run_one_driven();
    }
    std::unique_lock lock(control_mutex_);
    if (!await_no_caller_reaps(lock, deadline)) return false;
    if (put_backs_ == put_backs) break;
    put_backs = put_backs_;
  }
  if (driven_more()) signal_work();  // added meanwhile: the take above left it
  return true;
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline bool reaper<T, Hook, Fn, Queue>::drive_stop(typename clock_type::time_point deadline) {
  {
    const std::lock_guard lock(control_mutex_);
    stop_requested_ = true;
    control_changed_.notify_all();  // a flush parked by a freeze: stop overrides it
  }
  std::unique_lock drive(drive_mutex_, std::defer_lock);
  if (!lock_before(drive, deadline)) return false;
  if (!(state_.load(std::memory_order_relaxed) & stopped_bit)) {
    // acquire, as the worker's STOPPED exchange: pairs with every producer's kick before it,
    // so their adds are visible to the drain below. From here producers tear down inline.
    (void)state_.exchange(stopped_bit, std::memory_order_acquire);
    const typename driving_here::scope here(this);
    for (;;) {
      while (!in_flight_.empty()) run_one_driven();
      take_driven(/*sweep=*/true);
      if (in_flight_.empty()) break;
    }
  }
  drive.unlock();
  return settle_after_stop(deadline);
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline bool reaper<T, Hook, Fn, Queue>::lock_before(std::unique_lock<mutex_type>& lock,
                                             typename clock_type::time_point deadline) {
  if (deadline == clock_type::time_point::max()) {
    lock.lock();
    return true;
  }
  while (!lock.try_lock()) {
    if (clock_type::now() >= deadline) return false;
    sync_ops::sleep_for(std::chrono::microseconds(50));
  }
  return true;
}

}  // namespace teardown
