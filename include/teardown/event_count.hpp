// teardown/event_count.hpp — wait until a condition on other words holds, without a lost
// wake-up: the eventcount (folly's EventCount, the kernel's wait-queue pattern) on one futex word.
//
// A thread that changes what a waiter looks at (a budget given back, a count that reached its
// target) calls notify_all() after the change. A waiter takes a key with prepare_wait(), then
// reads the condition, and waits with that key only if the condition does not hold yet:
//
//     for (;;) {
//       const auto key = released.prepare_wait();
//       if (budget.pending() <= bytes) break;
//       released.wait_for(key, ns);             // returns at once if a notify came since the key
//     }
//
// Who may call what
//   notify_all()          any thread, concurrently, after its change; never blocks (a futex wake).
//   prepare_wait()        any thread, before it reads the condition.
//   wait(key),            any thread: sleeps while no notify_all() came since prepare_wait()
//   wait_for(key, ns)     returned `key` (wait_for: at most ns). Either may return early (a
//                         spurious wake-up, or a notify for another waiter): read the condition
//                         again with a new key.
//
// Memory ordering: notify_all's bump is a release RMW and prepare_wait's load acquires, so a
// waiter whose key already counts a notify reads the condition as that notifier left it; a
// key read before the bump makes the futex return at once. The condition's own words may be
// relaxed. The word wraps after 2^32 notifies; a waiter that slept across exactly 2^32 of them
// sleeps until its timeout (wait_for) or the next one.
// Design: docs/design.md, "event_count".
#pragma once

#include <atomic>
#include <cstdint>

#include "teardown/sync.hpp"

namespace teardown {

/// Sync: a Sync policy (sync.hpp) with futex_wake_all, for the word and its futex; a schedule
/// test gives it the scheduler's, so its weak memory reaches the two orders.
template <class Sync = std_sync>
class basic_event_count {
 public:
  using key = std::uint32_t;

  void notify_all() noexcept {
    // release: pairs with prepare_wait's acquire; the change is sequenced before this bump.
    word_.fetch_add(1, std::memory_order_release);
    Sync::futex_wake_all(word_);
  }

  key prepare_wait() const noexcept {
    // acquire: pairs with notify_all's release; the caller reads its condition after this.
    return word_.load(std::memory_order_acquire);
  }

  void wait(key seen) noexcept { Sync::futex_wait(word_, seen); }
  void wait_for(key seen, std::uint64_t ns) noexcept { Sync::futex_wait_for(word_, seen, ns); }

 private:
  typename Sync::template atomic<std::uint32_t> word_{0};
};

using event_count = basic_event_count<>;

}  // namespace teardown
