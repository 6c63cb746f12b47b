// teardown/reaper/wake_word.hpp — the producers' path and the wake word (enqueue, kick, the sleep/wake protocol).
//
// Out-of-line members of teardown::reaper (reaper_class.hpp declares them, with their contracts, and includes
// this file at its end). Include teardown/reaper.hpp, not this file.
//
// No lost wake-up. The worker publishes SLEEPING in a state word with an atomic exchange before it sleeps; a
// producer whose add found the queue empty sets KICKED with an atomic fetch_or and makes the futex syscall only
// if it read SLEEPING. All writes to the state word are read-modify-writes, so they are totally ordered and each
// reads the latest value: either the kick comes first, and the worker's SLEEPING exchange reads KICKED and does
// not sleep, or the worker's exchange comes first, and the kick reads SLEEPING and wakes it. Items added behind a
// non-empty queue need no kick, because the kick of the add that made it non-empty covers them.
// tests/model/spin/reaper_wakeup.pml checks this with the spin model checker. With a poll_interval the producers'
// kick wakes nobody and the worker looks again within the interval ("Wake policy").
//
// Design: docs/design.md, "No lost wake-up".
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <utility>

#include "teardown/reaper/reaper_class.hpp"
#include "teardown/detail/fatal.hpp"

namespace teardown {

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::enqueue_chain(llist_chain<T, Hook>&& chain) noexcept {
  if (chain.empty()) return;
  enqueued_.add(chain.size());
  // relaxed, as in enqueue().
  if (state_.load(std::memory_order_relaxed) & stopped_bit) {
    (void)queue_.add_batch(std::move(chain));
    drain_inline_counted();  // takes the chain back, with anything queued from before
    return;
  }
  if (!queue_.add_batch(std::move(chain))) return;  // the kick of the first add covers it
  kick_after_first_add();
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::abort_if_queued(T& item, std::string_view who) noexcept {
  if ((item.*Hook).on_list()) [[unlikely]] {
    detail::write_to_stderr(who);
    detail::write_to_stderr(": the item is already queued (element type ");
    detail::write_to_stderr(detail::type_name<T>());
    detail::write_to_stderr("); an item may be enqueued again only once fn has started on it\n");
    std::abort();
  }
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
template <bool ReportBacklog>
inline std::uint64_t reaper<T, Hook, Fn, Queue>::enqueue_item(T& item) noexcept {
  enqueued_.add();
  // relaxed: STOPPED only decides the path. The inline path reads nothing the worker wrote
  // but the queue, which it takes with the llist's own acquire. A stale read queues the item:
  // the kick of the add that found the queue empty, an RMW, then reads STOPPED and drains.
  if (state_.load(std::memory_order_relaxed) & stopped_bit) {
    tear_down_inline(item);
    drain_inline_counted();  // anything still queued from before (a fork child, a race with stop)
    return 0;
  }
  if (!queue_.add(item)) {  // not the first: the kick of the first covers this item
    // The watchdog's clock is set by the add that found the queue empty; if the worker's
    // take cleared it after that add, the first add to see it clear starts it again.
    std::uint64_t since = oldest_enqueue_ns_.load(std::memory_order_relaxed);
    if (since == 0) {
      const std::uint64_t now = sync_ops::now_ns();
      if (oldest_enqueue_ns_.compare_exchange_strong(since, now, std::memory_order_relaxed)) since = now;
    }
    if constexpr (ReportBacklog) return since;
    return 0;
  }
  kick_after_first_add();
  return 0;
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::kick_after_first_add() noexcept {
  oldest_enqueue_ns_.store(sync_ops::now_ns(), std::memory_order_relaxed);
  // release: publishes the add to the worker, whose wake or STOPPED exchange (an acquire)
  // reads this kick or a later RMW. No acquire: reading STOPPED, we drain through the llist's
  // own acquire and read nothing else the worker wrote.
  const std::uint32_t previous = state_.fetch_or(kicked_bit, std::memory_order_release);
  if (previous & stopped_bit) {
    drain_inline_counted();  // the worker is gone and may not have seen this item
  } else if (opts_.driven) {
    signal_work();
  } else if ((previous & sleeping_bit) && poll_ns_ == 0) {
    wakeups_.fetch_add(1, std::memory_order_relaxed);
    sync_ops::futex_wake_one(state_);
  }
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline bool reaper<T, Hook, Fn, Queue>::hurry() noexcept {
  if (opts_.driven) return false;  // no thread to wake: work_fd / on_work already said so
  if (!(kick() & sleeping_bit)) return false;
  hurries_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::request_after_batch() noexcept {
  if (!opts_.after_batch) return;
  // release: pairs with the acquire exchange in take_after_batch_request, so what the caller did
  // before (the memory it freed, the trimmer's count) is visible to the after_batch it asks for.
  after_batch_wanted_.store(true, std::memory_order_release);
  if (opts_.driven) {
    signal_work();
  } else {
    (void)kick();  // a worker past its last look at the flag sleeps no longer than this kick
  }
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline bool reaper<T, Hook, Fn, Queue>::take_after_batch_request() noexcept {
  // The load first: the flag is almost always clear, and a load does not take the line.
  // acquire: pairs with request_after_batch's release store.
  return after_batch_wanted_.load(std::memory_order_relaxed) &&
         after_batch_wanted_.exchange(false, std::memory_order_acquire);
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline bool reaper<T, Hook, Fn, Queue>::spin_found_work() const noexcept {
  for (std::uint32_t poll = 0; poll < opts_.spin_polls; ++poll) {
    if (!queue_.empty() || control_requested_.load(std::memory_order_relaxed)) return true;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  return false;
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline bool reaper<T, Hook, Fn, Queue>::sleep_until_kicked() noexcept {
  bool limited = false;  // slept with a time limit
  // relaxed: an RMW, so ordered against every kick all the same (no lost wake-up). A kick it
  // reads is acquired by the exchange below, which always follows and reads this write or a
  // later RMW (the kick's release sequence); a producer reads none of our data after a kick.
  std::uint32_t previous = state_.exchange(sleeping_bit, std::memory_order_relaxed);
  last_sleep_limit_ns_ = 0;
  if (!(previous & kicked_bit)) {
    // In a pool, a sibling may hold a batch: sleep no longer than the pool says. A polling
    // worker sleeps no longer than its interval: producers do not wake it.
    std::uint64_t most = link_ != nullptr ? link_->watch(link_->pool, link_->index) : no_watch;
    if (poll_ns_ != 0) most = std::min(most, poll_limit_ns_.load(std::memory_order_relaxed));
    if (most != no_watch) last_sleep_limit_ns_ = most;
    if (most == no_watch) {
      // Sleeps only while the word still says SLEEPING; a kick changes it first.
      while (state_.load(std::memory_order_relaxed) == sleeping_bit) sync_ops::futex_wait(state_, sleeping_bit);
    } else if (most != 0) {
      limited = true;
      const std::uint64_t until = sync_ops::now_ns() + most;
      for (std::uint64_t now = sync_ops::now_ns();
           state_.load(std::memory_order_relaxed) == sleeping_bit && now < until; now = sync_ops::now_ns()) {
        sync_ops::futex_wait_for(state_, sleeping_bit, until - now);
      }
    }
  }
  // acquire: reading KICKED (set before or while we slept, or a later RMW of its release
  // sequence) synchronizes with that producer's release, so our next del_all sees its add.
  // No release: a producer reads none of our data after its kick.
  previous = state_.exchange(0, std::memory_order_acquire);
  const bool timed_out = limited && previous == sleeping_bit;  // nobody kicked: the limit ended it
  if (timed_out) polls_.fetch_add(1, std::memory_order_relaxed);
  return timed_out;
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline std::uint32_t reaper<T, Hook, Fn, Queue>::kick() noexcept {
  // release, as in enqueue: what the caller did before (a request, a put-back's add) is
  // visible to the worker's wake exchange.
  const std::uint32_t previous = state_.fetch_or(kicked_bit, std::memory_order_release);
  if (previous & sleeping_bit) sync_ops::futex_wake_one(state_);
  return previous;
}

}  // namespace teardown
