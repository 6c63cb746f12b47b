// teardown/reaper_pool/stealing.hpp — a pool's stealing, watching and waking, and its flush.
//
// Out-of-line members of teardown::reaper_pool (reaper_pool.hpp declares them and includes this file at its
// end): the workers' steal / watch / holding hooks (on a worker thread), a producer's wake of an idle sibling
// for a backlog, and the pool flush's rounds. Include teardown/reaper_pool.hpp, not this file.
// Memory ordering: a steal happens entirely under steal_mutex_ (pick, del_all, put the rest back) and counts in
// steal_events_ there; the holder and the watchers use seq_cst where "No lost watch" says, relaxed hints elsewhere.
//
// Design: docs/design.md, "Stealing".
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <vector>

#include "teardown/llist.hpp"
#include "teardown/reaper_pool.hpp"

namespace teardown {

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline bool reaper_pool<T, Hook, Fn, Queue>::flush_until(typename clock_type::time_point deadline) {
  refuse_on_workers("flush");
  std::vector<std::uint64_t> tickets(count_);
  std::uint64_t seen = 0;
  {
    const std::lock_guard lock(steal_mutex_);
    seen = steal_events_;
  }
  // Ends the exclusive round however the flush leaves.
  struct exclusive_round {
    reaper_pool* pool = nullptr;
    ~exclusive_round() {
      if (pool == nullptr) return;
      const std::lock_guard lock(pool->steal_mutex_);
      --pool->exclusive_flushes_;
      pool->update_steal_hint_locked();
    }
  } exclusive;
  for (int round = 0;; ++round) {
    if (round == optimistic_rounds) {
      const std::lock_guard lock(steal_mutex_);
      ++exclusive_flushes_;
      update_steal_hint_locked();
      exclusive.pool = this;
    }
    // Ask every worker before waiting for any: the workers drain side by side.
    for (std::size_t i = 0; i < count_; ++i) tickets[i] = workers_[i]->request_flush();
    for (std::size_t i = 0; i < count_; ++i) {
      if (!workers_[i]->await_flush(tickets[i], deadline)) return false;
    }
    if (exclusive.pool != nullptr) return true;  // no steal could happen during this round
    const std::lock_guard lock(steal_mutex_);
    if (steal_events_ == seen) return true;  // no item changed worker during this round
    seen = steal_events_;
  }
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline llist_batch<T, Hook> reaper_pool<T, Hook, Fn, Queue>::steal(std::size_t thief, std::size_t& taken) noexcept {
  taken = 0;
  // acquire: pairs with the constructor's release; workers_ is complete.
  if (!ready_.load(std::memory_order_acquire) || steal_refused_.load(std::memory_order_relaxed)) return {};
  detail::data_read<sync_ops>(&workers_);
  llist_batch<T, Hook> batch = steal_queued(thief, taken);
  if (batch.empty()) batch = steal_held(thief, taken);
  return batch;
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline llist_batch<T, Hook> reaper_pool<T, Hook, Fn, Queue>::steal_queued(std::size_t thief,
                                                                         std::size_t& taken) noexcept {
  // The victim: the non-empty queue whose backlog started first; one without a start time
  // (its worker cleared it when it took a batch) only when none has one. Snapshots: a
  // victim may have emptied meanwhile, and then there is nothing to take.
  std::size_t victim = count_;
  std::uint64_t oldest = std::numeric_limits<std::uint64_t>::max();
  for (std::size_t k = 1; k < count_; ++k) {
    const std::size_t j = (thief + k) % count_;
    const std::uint64_t since = workers_[j]->oldest_enqueue_ns_.load(std::memory_order_relaxed);
    const std::uint64_t key = since != 0 ? since : std::numeric_limits<std::uint64_t>::max();
    if ((victim == count_ || key < oldest) && !workers_[j]->queue_.empty()) {
      victim = j;
      oldest = key;
    }
  }
  if (victim == count_) return {};
  worker_type& from = *workers_[victim];
  std::unique_lock lock(steal_mutex_);
  if (steals_refused_locked()) return {};
  // In the thief's run order (see reaper/worker_loop.hpp's take_from_queue): oldest first in one walk
  // where the queue has a take for it.
  const bool oldest_first = opts_.worker.order == drain_order::oldest_first;
  llist_batch<T, Hook> batch = detail::take_queue<T, Hook>(from.queue_, /*sweep=*/false, oldest_first);
  if (batch.empty()) return batch;
  ++steal_events_;  // see "Flush with stealing": under the mutex, with the del_all and put-back
  const std::size_t size = batch.size();
  taken = size - size / 2;
  llist_chain<T, Hook> rest;  // the newer half stays with the victim; front = newest
  if (!oldest_first) {
    for (std::size_t i = 0; i < size / 2; ++i) rest.push_back(*batch.pop_front());
  }
  llist_chain<T, Hook> mine;  // oldest first: the older half, in run order
  if (oldest_first) {
    for (std::size_t i = 0; i < taken; ++i) mine.push_back(*batch.pop_front());
    while (T* item = batch.pop_front()) rest.push_front(*item);
  }
  const bool left_some = !rest.empty();
  // Back on the victim's queue; a kick if it had emptied, as for a first enqueue. The victim
  // cannot be stopped here: steals end (under this mutex) before the pool stops a worker.
  if (from.queue_.add_batch(std::move(rest))) from.kick_after_first_add();
  lock.unlock();
  if (left_some) (void)wake_idle_siblings(thief, 1);
  if (!oldest_first) return batch;  // the older half, newest first: run order
  return as_batch(std::move(mine));
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline llist_batch<T, Hook> reaper_pool<T, Hook, Fn, Queue>::as_batch(llist_chain<T, Hook>&& chain) noexcept {
  llist<T, Hook> shape;  // private to this call: no other thread sees it
  (void)shape.add_batch(std::move(chain));
  return shape.del_all();
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline llist_batch<T, Hook> reaper_pool<T, Hook, Fn, Queue>::steal_held(std::size_t thief,
                                                                       std::size_t& taken) noexcept {
  const std::uint64_t now = sync_ops::now_ns();
  std::size_t victim = count_;
  std::uint64_t earliest = std::numeric_limits<std::uint64_t>::max();
  for (std::size_t k = 1; k < count_; ++k) {
    const std::size_t j = (thief + k) % count_;
    const std::uint64_t started = links_[j]->item_started_ns.load(std::memory_order_relaxed);
    if (started == 0 || started >= earliest || now - std::min(now, started) < steal_after_ns_) continue;
    if (workers_[j]->held_.empty()) continue;
    victim = j;
    earliest = started;
  }
  if (victim == count_) return {};
  worker_type& from = *workers_[victim];
  std::unique_lock lock(steal_mutex_);
  if (steals_refused_locked()) return {};
  llist_batch<T, Hook> held = from.held_.del_all();  // run order; acquire: pairs with the victim's replace_all
  if (held.empty()) return held;  // the victim took it back
  ++steal_events_;  // see "Flush with stealing"
  const std::size_t size = held.size();
  const bool oldest_first = opts_.worker.order == drain_order::oldest_first;
  llist_chain<T, Hook> mine;  // in run order, as the thief runs it
  llist_chain<T, Hook> rest;  // front = newest, as on a queue
  taken = size - size / 2;
  for (std::size_t i = 0; i < size; ++i) {
    T& item = *held.pop_front();
    if (i < taken) {
      mine.push_back(item);
    } else if (oldest_first) {
      rest.push_front(item);  // run order is oldest first
    } else {
      rest.push_back(item);  // run order is newest first
    }
  }
  const bool left_some = !rest.empty();
  if (from.queue_.add_batch(std::move(rest))) from.kick_after_first_add();  // not stopped: as in steal_queued
  lock.unlock();
  if (left_some) (void)wake_idle_siblings(thief, 1);
  return as_batch(std::move(mine));
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline std::uint64_t reaper_pool<T, Hook, Fn, Queue>::watch(std::size_t watcher) noexcept {
  // acquire: as in steal(). A sibling's item_started_ns stamp does not order workers_ for us:
  // only a batch's first stamp is seq_cst, a later one relaxed (a schedule test found a watch
  // that read one and then workers_ unordered).
  if (!ready_.load(std::memory_order_acquire)) return worker_type::no_watch;
  link_type& self = *links_[watcher];
  // seq_cst: pairs with holding()'s load of watching (see "No lost watch").
  self.watching.store(false, std::memory_order_seq_cst);
  std::uint64_t earliest = 0;
  bool stealable = false;
  for (std::size_t k = 1; k < count_; ++k) {
    const std::size_t j = (watcher + k) % count_;
    // seq_cst: pairs with the holder's first item_started_ns store of a batch.
    const std::uint64_t started = links_[j]->item_started_ns.load(std::memory_order_seq_cst);
    if (started == 0) continue;
    if (earliest == 0 || started < earliest) earliest = started;
    detail::data_read<sync_ops>(&workers_);
    if (!workers_[j]->held_.empty()) stealable = true;
  }
  if (earliest == 0) return worker_type::no_watch;
  // relaxed: a holder that reads true skips its kick, and we come back at our limit anyway; a
  // seq_cst load never reads this store in place of a later false (it is sequenced before it).
  self.watching.store(true, std::memory_order_relaxed);
  if (steal_refused_.load(std::memory_order_relaxed)) return min_watch_ns;
  const std::uint64_t now = sync_ops::now_ns();
  const std::uint64_t ripe = earliest + steal_after_ns_;
  if (now >= ripe) return stealable ? 0 : min_watch_ns;
  return std::max(ripe - now, min_watch_ns);
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper_pool<T, Hook, Fn, Queue>::holding(std::size_t holder) noexcept {
  // Relaxed, unlike steal(): the holder holds items enqueued after the constructor returned,
  // and its take of them acquired that, workers_ complete included.
  if (!ready_.load(std::memory_order_relaxed)) return;
  for (std::size_t k = 1; k < count_; ++k) {
    const std::size_t j = (holder + k) % count_;
    // seq_cst: pairs with watch()'s seq_cst store of false (see "No lost watch"). Reading it,
    // we synchronize with the sibling, so the relaxed idle load below sees its set_idle(true),
    // sequenced before that store.
    if (links_[j]->watching.load(std::memory_order_seq_cst)) continue;
    if (!links_[j]->idle.load(std::memory_order_relaxed)) continue;
    detail::data_read<sync_ops>(&workers_);
    (void)workers_[j]->kick();
  }
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper_pool<T, Hook, Fn, Queue>::wake_for_backlog(std::size_t index, std::uint64_t since) noexcept {
  // Polling workers (reaper_options::poll_interval): a producer never wakes anyone; an idle
  // sibling finds the backlog and steals at its next look.
  if (workers_[index]->poll_ns_ != 0) return;
  if (steal_after_ns_ != 0) {
    const std::uint64_t now = sync_ops::coarse_now_ns();
    if (now < since || now - since < steal_after_ns_) return;
  }
  if (steal_refused_.load(std::memory_order_relaxed)) return;
  (void)wake_idle_siblings(index, 1);
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline std::size_t reaper_pool<T, Hook, Fn, Queue>::wake_idle_siblings(std::size_t from, std::size_t most) noexcept {
  std::size_t woken = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (std::size_t k = 1; k < count_ && woken < most; ++k) {
      const std::size_t j = (from + k) % count_;
      if (!(pass == 0 ? idle(j) : unkicked(*workers_[j]))) continue;
      (void)workers_[j]->kick();
      ++woken;
    }
  }
  return woken;
}

}  // namespace teardown
