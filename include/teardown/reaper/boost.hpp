// teardown/reaper/boost.hpp — priority boosts: set_nice, raising the worker and lowering it after a drain.
//
// Out-of-line members of teardown::reaper (reaper_class.hpp declares them, with their contracts, and includes
// this file at its end). Include teardown/reaper.hpp, not this file.
//
// Design: docs/design.md, "Boost".
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>

#include "teardown/reaper/reaper_class.hpp"
#include "teardown/trace.hpp"
#include "teardown/worker_thread.hpp"

namespace teardown {

// A priority change to trace once no lock of ours is held (a hook may call into the reaper).
template <class T, llist_node T::*Hook, class Fn, class Queue>
struct reaper<T, Hook, Fn, Queue>::priority_change {
  pid_t tid = 0;  // 0: nothing changed
  int before = 0;
  int after = 0;
  const char* reason = nullptr;
  void emit(std::uint64_t domain) const noexcept {
    if (tid != 0) trace::boost(tid, before, after, reason, domain);
  }
};

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline bool reaper<T, Hook, Fn, Queue>::set_nice(int value) {
  if (!detail::valid_nice(value)) {
    throw std::invalid_argument("teardown::reaper::set_nice: nice must be in [-20, 19], got " + std::to_string(value));
  }
  priority_change refusal;
  {
    const std::lock_guard lock(nice_mutex_);
    if (opts_.driven || worker_tid_ == 0) {
      nice_ = value;  // applied by the worker at its start; driven: no thread of ours to apply it to
      nice_set_ = true;  // nothing is boosted: no worker runs (a driven reaper never has one)
      return !opts_.driven;
    }
    if (setpriority(PRIO_PROCESS, static_cast<id_t>(worker_tid_), value) == 0) {
      nice_ = value;
      boosted_.store(false, std::memory_order_relaxed);  // under nice_mutex_
      return true;
    }
    // Refused (a more urgent value without the privilege): nice_ stays the nice in force.
    if (note_refused_raise()) refusal = {worker_tid_, nice_, value, "refused"};
  }
  refusal.emit(opts_.trace_domain);
  return false;
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline bool reaper<T, Hook, Fn, Queue>::note_refused_raise() noexcept {
  const std::uint32_t before = setup_warnings_.fetch_or(setup_warning_raise, std::memory_order_relaxed);
  return (before & setup_warning_raise) == 0;
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline bool reaper<T, Hook, Fn, Queue>::raise_worker(const char* reason, priority_change& change) noexcept {
  std::optional<int> target = opts_.boost_nice;
  if (!target) target = on_worker() ? creator_nice_ : detail::calling_thread_nice();
  if (!target) return false;
  const std::lock_guard lock(nice_mutex_);
  if (worker_tid_ == 0) return false;
  const int current = boosted_.load(std::memory_order_relaxed) ? boosted_nice_ : nice_;
  if (*target >= current) return false;  // already as urgent: nothing to change
  if (setpriority(PRIO_PROCESS, static_cast<id_t>(worker_tid_), *target) != 0) {
    boosts_refused_.fetch_add(1, std::memory_order_relaxed);
    // Said once: the first refusal is traced and sets a setup_warning bit; the next ones are
    // counted only (a process without the privilege would otherwise trace every flush).
    if (note_refused_raise()) change = {worker_tid_, current, *target, "refused"};
    return false;
  }
  change = {worker_tid_, current, *target, reason};
  boosted_nice_ = *target;
  boosted_.store(true, std::memory_order_relaxed);  // under nice_mutex_
  boosts_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline bool reaper<T, Hook, Fn, Queue>::raise_worker(const char* reason) noexcept {
  priority_change change;
  const bool raised = raise_worker(reason, change);
  change.emit(opts_.trace_domain);
  return raised;
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::lower_after_drain() noexcept {
  if (!boosted_.load(std::memory_order_relaxed)) return;
  priority_change change;
  {
    const std::lock_guard lock(nice_mutex_);
    if (!boosted_.load(std::memory_order_relaxed)) return;  // set_nice ended it
    (void)setpriority(PRIO_PROCESS, static_cast<id_t>(worker_tid_), nice_);
    boosted_.store(false, std::memory_order_relaxed);
    change = {worker_tid_, boosted_nice_, nice_, "drained"};
  }
  change.emit(opts_.trace_domain);
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
template <class Done>
inline bool reaper<T, Hook, Fn, Queue>::await_boost_point(std::unique_lock<mutex_type>& lock,
                                                         typename clock_type::time_point deadline, Done done,
                                                         const char* reason) {
  if (boost_ns_ == 0 || done()) return true;
  const auto boost_at = clock_type::now() + opts_.boost_after;
  if (control_changed_.wait_until(lock, std::min(boost_at, deadline), done)) return true;
  if (clock_type::now() >= deadline) return false;
  // Still waiting: raise the worker, under the control mutex, so that the worker completes what
  // is waited for (a flush's ticket), and then lowers itself, after the raise.
  priority_change change;
  (void)raise_worker(reason, change);
  lock.unlock();
  change.emit(opts_.trace_domain);
  lock.lock();
  return help_while_waiting(lock, deadline, done);
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
template <class Done>
inline bool reaper<T, Hook, Fn, Queue>::help_while_waiting(std::unique_lock<mutex_type>& lock,
                                                          typename clock_type::time_point deadline, Done done) {
  while (!done() && help_round(lock)) {
    if (done()) return true;
    const auto again = std::min(clock_type::now() + opts_.boost_after, deadline);
    if (control_changed_.wait_until(lock, again, done)) return true;
    if (clock_type::now() >= deadline) return false;
  }
  return true;
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline bool reaper<T, Hook, Fn, Queue>::help_round(std::unique_lock<mutex_type>& lock) {
  // A raise in force (boosted_: written under nice_mutex_, read here as a hint) lets the worker
  // run at the waiter's nice: waiting costs no more than the work. Frozen: the freezer holds
  // the worker back on purpose, and a fork's parking must not meet a teardown here.
  if (!opts_.waiters_help || boost_ns_ == 0 || boosted_.load(std::memory_order_relaxed) || freeze_depth_ != 0 ||
      fork_parking_ || !worker_running_ || worker_done_) {
    return false;
  }
  share_wanted_ = true;  // the worker hands back the unstarted half at its next checkpoint
  request_locked();
  lock.unlock();
  const std::size_t helped = reap_on_caller([](T&) noexcept { return true; });
  if (helped != 0) {
    helped_.fetch_add(helped, std::memory_order_relaxed);
    request_after_batch();  // the batch-end work (a composition's trim) for what this freed, on the worker
    // The work ran at the waiter's priority: a boost of the work, by moving it.
    const int worker_nice = nice();
    trace::boost(detail::this_thread_tid(), worker_nice, detail::calling_thread_nice().value_or(worker_nice),
                 "help", opts_.trace_domain);
  }
  lock.lock();
  return true;
}

template <class Reaper>
bool detail::boost_for_waiter(Reaper& reaper, const char* reason) noexcept {
  return reaper.boost_ns_ != 0 && reaper.raise_worker(reason);
}

template <class Reaper>
void detail::help_for_waiter(Reaper& reaper) {
  std::unique_lock lock(reaper.control_mutex_);
  (void)reaper.help_round(lock);
}

}  // namespace teardown
