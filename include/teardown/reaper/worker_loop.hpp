// teardown/reaper/worker_loop.hpp — the worker: its pass over the queue, checkpoints, parking, tearing down.
//
// Out-of-line members of teardown::reaper (reaper_class.hpp declares them, with their contracts, and includes
// this file at its end). Include teardown/reaper.hpp, not this file.
//
// Design: docs/design.md, "The reaper".
#pragma once

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/types.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "teardown/reaper/reaper_class.hpp"
#include "teardown/worker_thread.hpp"

namespace teardown {

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::worker_main() noexcept {
  worker_thread_ = pthread_self();
  detail::data_written<sync_ops>(&worker_thread_);
  worker_known_.store(true, std::memory_order_release);  // pairs with the acquire in on_worker
  apply_setup();
  bool polled_idle = false;  // the last sleep ended at its poll limit: no spin before the next
  for (;;) {
    if (control_requested_.load(std::memory_order_relaxed)) {
      if (!take_control_requests(flush_target_)) break;
    }
    // The pass that completes a flush ticket sweeps every shard of a sharded queue (see "The
    // barrier"); other passes take what the queue's del_all gives.
    take_from_queue(/*sweep=*/flush_target_ != 0);
    // In a pool, an empty queue means: help a sibling first. A steal here, between taking
    // this pass's ticket and completing it, runs before any ticket requested after it.
    if (in_flight_.empty() && link_ != nullptr) {
      std::size_t taken = 0;
      in_flight_ = link_->steal(link_->pool, link_->index, taken);
      if (taken != 0) stolen_.fetch_add(taken, std::memory_order_relaxed);
    }
    const bool took = !in_flight_.empty();
    if (took) {
      if (link_ != nullptr) set_idle(false);
      run_in_flight();
      (void)take_after_batch_request();  // this call serves it too
      if (opts_.after_batch) call_after_batch();
    } else if (take_after_batch_request()) {
      call_after_batch();  // asked for without a batch (request_after_batch)
    }
    // A batch a freeze handed back is not done: its flush waits for the pass that takes it
    // again. (The rest of a batch a sibling took is that sibling's; docs/design.md,
    // "Flush with stealing".)
    const bool handed_back = std::exchange(handed_back_, false);
    if (flush_target_ != 0 && !handed_back) {
      // A put-back since this pass began (see "The barrier") leaves the ticket for the next.
      if (!complete_flush(flush_target_)) continue;
      flush_target_ = 0;
    }
    if (took) {
      polled_idle = false;
      if (poll_ns_ != 0) poll_limit_ns_.store(poll_ns_, std::memory_order_relaxed);  // back to the short look
      continue;
    }
    if (link_ != nullptr) set_idle(true);  // a sibling's holding() may now wake this one
    lower_after_drain();
    // A worker that polls an idle queue does not spin at every look: the spin is for the
    // burst right after a batch or a kick.
    if (!polled_idle && spin_found_work()) continue;
    polled_idle = sleep_until_kicked() && poll_ns_ != 0;
    // Lazy polling: a look that ended at its limit doubles the next one (a pass that then
    // takes work brings it back to poll_interval).
    const std::uint64_t limit = poll_limit_ns_.load(std::memory_order_relaxed);
    if (polled_idle && poll_max_ns_ > poll_ns_ && last_sleep_limit_ns_ == limit) {  // not a pool's watch
      poll_limit_ns_.store(limit > poll_max_ns_ / 2 ? poll_max_ns_ : 2 * limit, std::memory_order_relaxed);
    }
  }
  // Stop: announce STOPPED first, then drain. A producer whose kick comes after the exchange
  // reads STOPPED and drains on its own thread, so the drain below ends even while
  // producers keep adding (draining first could be kept busy for ever).
  // acquire: pairs with every producer's kick before ours, so their adds are visible to the
  // drain below (without it the drain may miss one: the item would stay queued after stop).
  // No release: a producer that reads STOPPED reads nothing else of ours.
  (void)state_.exchange(stopped_bit, std::memory_order_acquire);
  drain_on_worker();
  close_cpu_clock();
  // A stop_for that gave up, and whoever calls stop, flush or the destructor later, wait for
  // this (not for the join, which nobody may be doing yet).
  {
    const std::lock_guard nice_lock(nice_mutex_);
    worker_tid_ = 0;  // from here the id may be reused: set_nice must not name it
    boosted_.store(false, std::memory_order_relaxed);  // no worker runs, raised or not
  }
  const std::lock_guard lock(control_mutex_);
  worker_done_ = true;
  control_changed_.notify_all();
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::apply_setup() noexcept {
  std::uint32_t warnings = 0;
#if defined(__linux__)
  const std::string name = opts_.name.substr(0, 15);
  if (pthread_setname_np(pthread_self(), name.c_str()) != 0) warnings |= setup_warning_name;
  const int policy = opts_.policy == sched_policy::batch  ? SCHED_BATCH
                     : opts_.policy == sched_policy::idle ? SCHED_IDLE
                                                          : SCHED_OTHER;
  sched_param param{};
  if (sched_setscheduler(0, policy, &param) != 0) warnings |= setup_warning_policy;
  {
    // Under the mutex set_nice takes: its value and this thread's id are read as one.
    const std::lock_guard lock(nice_mutex_);
    worker_tid_ = static_cast<pid_t>(syscall(SYS_gettid));
    if (nice_kept_ && !nice_set_) warnings |= setup_warning_nice_kept;  // nice_ is the creator's
    if (setpriority(PRIO_PROCESS, static_cast<id_t>(worker_tid_), nice_) != 0) {
      warnings |= setup_warning_nice;
      // nice() reports the nice in force: the one this thread inherited.
      errno = 0;
      const int inherited = getpriority(PRIO_PROCESS, static_cast<id_t>(worker_tid_));
      if (errno == 0) nice_ = inherited;
    }
  }
  std::vector<int> cpus = opts_.cpus;
  try {
    if (cpus.empty()) cpus = detail::housekeeping_cpus();
  } catch (...) {
    cpus.clear();
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) {
    if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(static_cast<std::size_t>(cpu), &set);
  }
  if (CPU_COUNT(&set) == 0 || sched_setaffinity(0, sizeof set, &set) != 0) warnings |= setup_warning_affinity;
#endif
  // fetch_or: a raise refused before the worker got here keeps its bit.
  setup_warnings_.fetch_or(warnings, std::memory_order_relaxed);
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::take_from_queue(bool sweep) noexcept {
  batch_since_ns_ = oldest_enqueue_ns_.load(std::memory_order_relaxed);
  if (batch_since_ns_ != 0) batch_since_ns_ = oldest_enqueue_ns_.exchange(0, std::memory_order_relaxed);
  in_flight_ = take_queue(sweep, opts_.order == drain_order::oldest_first);
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::run_in_flight() noexcept {
  batches_.fetch_add(1, std::memory_order_relaxed);
  const std::uint64_t since = std::exchange(batch_since_ns_, 0);
  if (since != 0) {
    const std::uint64_t now = sync_ops::now_ns();
    if (now > since && now - since > longest_wait_ns_.load(std::memory_order_relaxed)) {
      longest_wait_ns_.store(now - since, std::memory_order_relaxed);  // the worker is the only writer
    }
    // A batch that waited past boost_after: the worker was starved (or frozen) while it
    // waited, and will be again while it runs the batch.
    // The time limit of the worker's last sleep is its own choice, not a wait.
    if (boost_ns_ != 0 && now > since && now - since > boost_ns_ + last_sleep_limit_ns_) {
      (void)raise_worker("backlog");
    }
  }
  if (link_ == nullptr) {
    while (T* item = in_flight_.pop_front()) {
      tear_down(*item, /*on_worker=*/true);
      checkpoint();
    }
    return;
  }
  // In a pool: while an item runs, the rest of the batch waits in held_, where an idle
  // sibling may take it (docs/design.md, "In a pool"); after the item, an exchange
  // takes back whatever is still there. The item about to run is already off the batch.
  bool announced = false;
  while (T* item = in_flight_.pop_front()) {
    const bool holding = !in_flight_.empty();
    if (holding) {
      const std::uint64_t now = sync_ops::now_ns();
      if (announced) {
        link_->item_started_ns.store(now, std::memory_order_relaxed);
      } else {
        // seq_cst: the batch's first start time pairs with the watchers' scan (docs/design.md,
        // "No lost watch").
        link_->item_started_ns.store(now, std::memory_order_seq_cst);
      }
      (void)held_.replace_all(std::move(in_flight_));  // empty: only this thread puts nodes there
      if (!announced) {
        announced = true;
        link_->holding(link_->pool, link_->index);
      }
    }
    tear_down(*item, /*on_worker=*/true);
    if (holding) in_flight_ = held_.del_all();  // ours again, or nothing: a sibling took it
    checkpoint();
  }
  if (announced) link_->item_started_ns.store(0, std::memory_order_relaxed);
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::set_idle(bool idle) noexcept {
  // relaxed: a holder's scan reads the flag after it read our watch's seq_cst store of
  // watching, which this store is sequenced before (see "No lost watch").
  if (link_->idle.load(std::memory_order_relaxed) == idle) return;
  link_->idle.store(idle, std::memory_order_relaxed);
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline bool reaper<T, Hook, Fn, Queue>::checkpoint() noexcept {
  if (opts_.yield_after.count() > 0) {
    const std::uint64_t now = sync_ops::now_ns();
    if (now - last_yield_ns_ > static_cast<std::uint64_t>(opts_.yield_after.count())) {
      sync_ops::yield();
      yields_.fetch_add(1, std::memory_order_relaxed);
      last_yield_ns_ = sync_ops::now_ns();
    }
  }
  if (control_requested_.load(std::memory_order_relaxed)) {
    std::unique_lock lock(control_mutex_);
    if (freeze_depth_ > 0 && !stop_requested_) {
      (void)hand_back_in_flight();
    } else if (std::exchange(share_wanted_, false)) {
      // A waiter helps (see "Waiters help"): the items this worker would run next go back on
      // the queue, where its reap_on_caller takes them; the worker keeps the later half.
      const std::size_t rest = in_flight_.size();
      (void)hand_back_in_flight(rest - rest / 2);
    }
    park_while_frozen(lock);
    return true;
  }
  return false;
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline std::size_t reaper<T, Hook, Fn, Queue>::hand_back_in_flight(std::size_t most) noexcept {
  if (in_flight_.empty() || most == 0) return 0;
  std::size_t count = 0;
  llist_chain<T, Hook> rest;  // front = newest, as on the queue
  while (count < most) {
    T* item = in_flight_.pop_front();
    if (item == nullptr) break;
    ++count;
    if (opts_.order == drain_order::oldest_first) {
      rest.push_front(*item);  // in_flight_ ran oldest first
    } else {
      rest.push_back(*item);  // in_flight_ ran newest first
    }
  }
  llist_batch<T, Hook> newer = queue_.del_all();  // newest first
  llist_chain<T, Hook> on_top;
  while (T* item = newer.pop_front()) on_top.push_back(*item);
  (void)queue_.add_batch(std::move(rest));
  (void)queue_.add_batch(std::move(on_top));
  // The watchdog's clock starts now if nothing else had started it: stalled() then sees the
  // items waiting behind the freeze, as it sees a frozen backlog.
  std::uint64_t unset = 0;
  (void)oldest_enqueue_ns_.compare_exchange_strong(unset, sync_ops::now_ns(), std::memory_order_relaxed);
  handed_back_ = true;
  return count;
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::park_while_frozen(std::unique_lock<mutex_type>& lock) noexcept {
  // A fork parks the worker even while it drains for stop(): the child must not copy an item
  // in the middle of fn.
  while ((freeze_depth_ > 0 && !stop_requested_) || fork_parking_) {
    worker_parked_ = true;
    control_changed_.notify_all();
    control_changed_.wait(lock);
  }
  worker_parked_ = false;
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline bool reaper<T, Hook, Fn, Queue>::take_control_requests(std::uint64_t& flush_target) noexcept {
  std::unique_lock lock(control_mutex_);
  park_while_frozen(lock);
  if (stop_requested_) return false;
  if (flush_requested_ > flush_completed_) {
    flush_target = flush_requested_;
    pass_put_backs_ = put_backs_;  // a put-back after this, before the take, voids the pass
  }
  control_requested_.store(false, std::memory_order_relaxed);  // under control_mutex_
  return true;
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline bool reaper<T, Hook, Fn, Queue>::complete_flush(std::uint64_t ticket) noexcept {
  const std::lock_guard lock(control_mutex_);
  if (put_backs_ != pass_put_backs_) {
    pass_put_backs_ = put_backs_;
    request_locked();
    return false;
  }
  flush_completed_ = std::max(flush_completed_, ticket);
  control_changed_.notify_all();
  return true;
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::drain_on_worker() noexcept {
  for (;;) {
    take_from_queue(/*sweep=*/true);
    if (in_flight_.empty()) return;
    run_in_flight();
  }
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::report_error() noexcept {
  errors_.fetch_add(1, std::memory_order_relaxed);
  if (opts_.on_error) {
    try {
      opts_.on_error(std::current_exception());
    } catch (...) {  // on_error's own failure must not take the backlog down with it
    }
  }
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::tear_down(T& item, bool on_worker) noexcept {
  std::atomic<std::uint64_t>* owner = nullptr;
  std::uint64_t cpu_before = 0;
  if constexpr (cpu_accounted<T>) {
    owner = teardown_cpu_owner(item);
    if (owner != nullptr) cpu_before = detail::thread_cpu_ns();
  }
  try {
    fn_(item);  // may free item
  } catch (...) {
    report_error();
  }
  if constexpr (cpu_accounted<T>) {
    if (owner != nullptr) owner->fetch_add(detail::thread_cpu_ns() - cpu_before, std::memory_order_relaxed);
  }
  if (!on_worker) inline_reaped_.fetch_add(1, std::memory_order_relaxed);
  reaped_.fetch_add(1, std::memory_order_relaxed);
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::call_after_batch() noexcept {
  try {
    opts_.after_batch();
  } catch (...) {
    report_error();
  }
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::drain_inline() noexcept {
  if (!held_.empty()) {
    for (T& item : held_.del_all()) tear_down_inline(item);
  }
  for (;;) {
    // A fork child's first drain sweeps: a producer of the parent may have pushed onto a
    // shard and not flagged it, and that producer is not here to do it.
    const bool sweep = child_sweep_.load(std::memory_order_relaxed) &&
                       child_sweep_.exchange(false, std::memory_order_relaxed);
    auto batch = take_queue(sweep, /*oldest_first=*/true);
    if (batch.empty()) return;
    for (T& item : batch) tear_down_inline(item);
  }
}

}  // namespace teardown
