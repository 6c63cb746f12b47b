// teardown/reaper/queue_concepts.hpp — what a reaper needs of its queue and of its items.
//
// reaper_queue: llist's add / add_batch / del_all / empty with their meanings: add returns true for an add that
// the consumer's next del_all might otherwise miss (llist: the empty -> non-empty transition; sharded_llist: its
// was-empty signal), and every del_all takes each node it sees exactly once. detail::take_queue takes oldest
// first in one walk where the queue declares such a take in the same class as its del_all. cpu_accounted: an
// item type that names who is charged for its teardown's CPU time.
//
// Design: docs/design.md, "The queue".
#pragma once

#include <atomic>
#include <concepts>
#include <cstdint>
#include <utility>

#include "teardown/llist.hpp"

namespace teardown {

namespace detail {

template <class Member>
struct member_owner {};
template <class R, class C>
struct member_owner<R C::*> {
  using type = C;
};

// Queue has `take` (del_all_oldest_first, del_all_sweep_oldest_first: one walk where
// del_all().reverse() is two) declared by the same class as `plain` (del_all, del_all_sweep),
// so it is the same take. A queue that wraps del_all (a derived type that hides it) keeps
// having its del_all called: its inherited one-walk take is not that del_all.
template <auto Take, auto Plain>
concept same_take = requires {
  typename member_owner<decltype(Take)>::type;
  typename member_owner<decltype(Plain)>::type;
} && std::same_as<typename member_owner<decltype(Take)>::type, typename member_owner<decltype(Plain)>::type>;

template <class Queue, class T, llist_node T::*Hook>
concept has_oldest_first_take = requires(Queue& queue) {
  { queue.del_all_oldest_first() } -> std::same_as<llist_batch<T, Hook>>;
} && same_take<&Queue::del_all_oldest_first, &Queue::del_all>;

template <class Queue, class T, llist_node T::*Hook>
concept has_sweep = requires(Queue& queue) {
  { queue.del_all_sweep() } -> std::same_as<llist_batch<T, Hook>>;
};

template <class Queue, class T, llist_node T::*Hook>
concept has_oldest_first_sweep = has_sweep<Queue, T, Hook> && requires(Queue& queue) {
  { queue.del_all_sweep_oldest_first() } -> std::same_as<llist_batch<T, Hook>>;
} && same_take<&Queue::del_all_sweep_oldest_first, &Queue::del_all_sweep>;

// The queue's del_all (with sweep: every shard of a sharded queue, its flags aside), in the
// order given: oldest_first is del_all().reverse(), in one walk when the queue has one.
template <class T, llist_node T::*Hook, class Queue>
llist_batch<T, Hook> take_queue(Queue& queue, bool sweep, bool oldest_first) noexcept {
  if constexpr (has_sweep<Queue, T, Hook>) {
    if (sweep) {
      if constexpr (has_oldest_first_sweep<Queue, T, Hook>) {
        if (oldest_first) return queue.del_all_sweep_oldest_first();
      }
      llist_batch<T, Hook> taken = queue.del_all_sweep();
      return oldest_first ? std::move(taken).reverse() : std::move(taken);
    }
  }
  (void)sweep;  // llist's del_all already takes everything
  if constexpr (has_oldest_first_take<Queue, T, Hook>) {
    if (oldest_first) return queue.del_all_oldest_first();
  }
  llist_batch<T, Hook> taken = queue.del_all();
  return oldest_first ? std::move(taken).reverse() : std::move(taken);
}

}  // namespace detail

/// What a reaper needs of its queue: llist's add, add_batch, del_all and empty, with their
/// meanings (docs/design.md, "The queue"). Default-constructed by the reaper.
template <class Queue, class T, llist_node T::*Hook>
concept reaper_queue = std::default_initializable<Queue> && requires(Queue& queue, const Queue& view, T& item,
                                                                     llist_chain<T, Hook>&& chain) {
  { queue.add(item) } -> std::same_as<bool>;
  { queue.add_batch(std::move(chain)) } -> std::same_as<bool>;
  { queue.del_all() } -> std::same_as<llist_batch<T, Hook>>;
  { view.empty() } -> std::same_as<bool>;
};

/// Optional CPU accounting (whose CPU the teardown is): if `teardown_cpu_owner(item)` is found by
/// argument-dependent lookup and returns std::atomic<std::uint64_t>*, the CPU nanoseconds fn
/// spends on that item are added there. It is called before fn (which may free the item), and
/// what it returns must outlive the teardown.
template <class T>
concept cpu_accounted = requires(T& item) {
  { teardown_cpu_owner(item) } -> std::convertible_to<std::atomic<std::uint64_t>*>;
};

}  // namespace teardown
