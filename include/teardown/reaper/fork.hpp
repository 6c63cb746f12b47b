// teardown/reaper/fork.hpp — the fork handlers (fork_policy::never_wait and wait_for_item).
//
// Out-of-line members of teardown::reaper (reaper_class.hpp declares them, with their contracts, and includes
// this file at its end). Include teardown/reaper.hpp, not this file.
//
// Design: docs/design.md, "Fork".
#pragma once

#include <mutex>
#include <new>
#include <utility>

#include "teardown/reaper/reaper_class.hpp"
#include "teardown/worker_thread.hpp"

namespace teardown {

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::fork_prepare() noexcept {
  if (!parks_for_fork()) return;
  std::unique_lock lock(control_mutex_);
  if (worker_running_) {
    fork_parking_ = true;
    request_locked();
    control_changed_.notify_all();
    lock.unlock();
    kick();
    lock.lock();
    // Parked between items, or gone (a stop() that was joining it has finished).
    control_changed_.wait(lock, [&] { return worker_parked_ || !worker_running_ || worker_done_; });
  }
  lock.release();  // stays locked across fork(); parent/child unlock it
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::fork_parent() noexcept {
  // A fork doubles what the parent's pages may cost (copy on write): a lazy worker looks now.
  if (poll_ns_ != 0 && !on_worker()) (void)hurry();
  if (!parks_for_fork()) return;
  fork_parking_ = false;
  control_changed_.notify_all();
  control_mutex_.unlock();
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::fork_child() noexcept {
  if (on_worker() || driving_here::contains(this)) {
    // fork() from inside fn: the child's only thread is a copy of the worker in the middle
    // of fn. Such a child may only exec or _exit; enqueue there tears down inline.
    state_.store(stopped_bit, std::memory_order_relaxed);
    return;
  }
  // Single-threaded here. The worker does not exist in the child: become the stopped form.
  const bool parked = parks_for_fork();
  if (parked) {
    // What the parked worker still held moves to held_ whole (one exchange, not a walk: a
    // fork must not cost time in proportion to the backlog, nor touch the items' pages),
    // where the child's next enqueue, flush, stop or destructor tears it down (drain_inline).
    (void)held_.replace_all(std::move(in_flight_));  // held_ is empty: taken back before parking
  } else {
    // The worker was running when fork() copied memory: what it had taken is the parent's
    // teardown in progress, copied at an instruction the child cannot know. Forget it
    // unread (both are plain pointer writes; no item is touched).
    std::move(in_flight_).forget();
    held_.del_all().forget();
    // A thread that held the control mutex (the worker, a flush) is not here: start it over.
    // No thread waits here, so no flush is outstanding.
    new (&control_mutex_) mutex_type;
    // Driven: a run or flush on another thread held the drive lock, and that thread is not here.
    new (&drive_mutex_) mutex_type;
    drivers_ = 0;
    driver_parked_ = false;
    flush_completed_ = flush_requested_;
    worker_joining_ = false;
  }
  worker_running_ = false;
  worker_parked_ = false;
  fork_parking_ = false;
  freeze_depth_ = 0;
  worker_tid_ = 0;
  stop_requested_ = true;
  worker_known_.store(false, std::memory_order_relaxed);
  state_.store(stopped_bit, std::memory_order_relaxed);
  child_sweep_.store(true, std::memory_order_relaxed);
  inline_hands_.store(0, std::memory_order_relaxed);  // the other threads' hands are not here
  caller_reaps_ = 0;
  boosted_.store(false, std::memory_order_relaxed);
  // nice_mutex_ is not held across fork (see "Fork"): a thread that held it is not here.
  new (&nice_mutex_) mutex_type;
  new (&settle_mutex_) mutex_type;
  // The parked worker was a waiter on control_changed_; it does not exist here, and glibc's
  // pthread_cond_destroy would wait for it forever. Start over with a fresh one.
  new (&control_changed_) condition_type;
  if (parked) control_mutex_.unlock();
}

}  // namespace teardown
