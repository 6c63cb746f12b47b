// teardown/async_teardown/detail.hpp — async_teardown's internal helpers (do not depend on them
// directly): the producer's identity and CPU for the trace points, the key helpers, the
// in-flight count of the concurrency gate, a put's pass through a shared worker's gate, and
// the option checks (among them the one that refuses a pool.worker).
//
// Memory ordering: this_thread_identity's flag is ordered by signal fences, one thread and its
// signal handlers being all that touch it (see there); the in-flight count is relaxed (a load
// estimate, it publishes nothing).
// Design: docs/design.md, "async_teardown: the composition".
#pragma once

#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__linux__)
#include <pthread.h>
#endif

#include <atomic>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "teardown/async_teardown/options.hpp"
#include "teardown/budget.hpp"
#include "teardown/reaper.hpp"

namespace teardown::detail {

// The producing thread's identity for the queue trace point, taken once per thread: the name
// is the one the thread had at its first traced put. Constant-initialized, trivially
// destructible thread_locals filled on first use, so that a put from a signal handler neither
// allocates nor registers a destructor; gettid and pthread_getname_np on the calling thread
// (prctl) are system calls. A handler that interrupts the filling fills it too, with the same
// values.
struct thread_identity {
  std::int64_t tid = 0;
  char name[16] = {};
};

inline const thread_identity& this_thread_identity() noexcept {
  static constinit thread_local thread_identity identity{};
  static constinit thread_local std::atomic<bool> known{false};
  // Only this thread and a signal handler on it touch these, so the order to keep is the
  // compiler's: a signal fence, not a hardware one. The acquire fence pairs with the release
  // fence below: a true known read here means identity is complete.
  const bool filled = known.load(std::memory_order_relaxed);
  std::atomic_signal_fence(std::memory_order_acquire);
  if (!filled) {
#if defined(__linux__)
    identity.tid = syscall(SYS_gettid);
    if (pthread_getname_np(pthread_self(), identity.name, sizeof identity.name) != 0) identity.name[0] = '\0';
#endif
    std::atomic_signal_fence(std::memory_order_release);  // identity is complete before known is true
    known.store(true, std::memory_order_relaxed);
  }
  return identity;
}

// True for a compile-time key that is off (const_key<false>): the deferred path compiles out.
template <class Key>
constexpr bool compiled_off() noexcept {
  if constexpr (requires(Key& key) { key.set(true); }) {
    return false;
  } else {
    return !Key::enabled();
  }
}

template <class Key>
Key make_key(bool on) {
  if constexpr (std::is_constructible_v<Key, bool>) {
    return Key(on);
  } else {
    return Key{};
  }
}

inline int current_cpu() noexcept {
#if defined(__linux__)
  return sched_getcpu();
#else
  return -1;
#endif
}

// Counts one put in flight for its lifetime, or nothing (the gate was off at its entry). Each
// put undoes only its own increment, so switching the gate never unbalances the count.
class in_flight_scope {
 public:
  explicit in_flight_scope(std::atomic<std::uint32_t>* count) noexcept : count_(count) {
    if (count_ != nullptr) count_->fetch_add(1, std::memory_order_relaxed);
  }
  in_flight_scope(const in_flight_scope&) = delete;
  in_flight_scope& operator=(const in_flight_scope&) = delete;
  ~in_flight_scope() {
    if (count_ != nullptr) count_->fetch_sub(1, std::memory_order_relaxed);
  }
  bool counts() const noexcept { return count_ != nullptr; }

 private:
  std::atomic<std::uint32_t>* count_;
};

// One put's pass through a shared worker's gate (shared_worker.hpp's domain_gate), left at the
// latest when the put returns.
template <class Gate>
class gate_pass {
 public:
  gate_pass() = default;
  gate_pass(const gate_pass&) = delete;
  gate_pass& operator=(const gate_pass&) = delete;
  ~gate_pass() { leave(); }
  bool enter(Gate& gate) noexcept {
    if (!gate.enter()) return false;
    gate_ = &gate;
    return true;
  }
  void leave() noexcept {
    if (gate_ != nullptr) gate_->leave();
    gate_ = nullptr;
  }

 private:
  Gate* gate_ = nullptr;
};

inline std::uint32_t validated_min_concurrent(std::uint32_t puts) {
  if (puts == 0) {
    throw std::invalid_argument("teardown::async_teardown: min_concurrent must be at least 1 (1: no gate)");
  }
  return puts;
}

// The budget puts reserve from: the shared one, or one of its own (validating max_pending).
inline std::shared_ptr<budget> async_budget(const async_teardown_options& opts) {
  if (opts.shared_budget == nullptr) return std::make_shared<budget>(opts.max_pending);
  if (opts.max_pending != budget::max_cap) {
    throw std::invalid_argument("teardown::async_teardown: max_pending (" + std::to_string(opts.max_pending) +
                                ") and shared_budget are both set: a composition on a shared budget has no "
                                "cap of its own (set shared_budget to null for one)");
  }
  return opts.shared_budget;
}

// Everything async_teardown refuses before anything is built (the pool checks its own options as
// well). can_share: Traits has owner() (or the path is compiled out); polls: the worker polls.
inline async_teardown_options&& validated_async_options(async_teardown_options&& opts, bool can_share, bool polls) {
  (void)validated_min_concurrent(opts.min_concurrent);
  if (opts.max_pending > budget::max_cap) {
    throw std::invalid_argument("teardown::async_teardown: max_pending must be at most " +
                                std::to_string(budget::max_cap) + ", got " + std::to_string(opts.max_pending));
  }
  opts.reaper = validated_reaper_options(std::move(opts.reaper), "teardown::async_teardown", "reaper.");
  if (!is_default_reaper_options(opts.pool.worker)) {
    throw std::invalid_argument(
        "teardown::async_teardown: pool.worker is set, but a composition gives every worker opts.reaper "
        "(names get \"-<i>\"); set opts.reaper instead and leave pool.worker default");
  }
  if (opts.worker != nullptr && !can_share) {
    throw std::invalid_argument(
        "teardown::async_teardown: worker (a shared worker) is set, but Traits has no static owner(T&) -> void*& "
        "for the worker to find the composition that queued an item");
  }
  if (opts.hurry_at != 0 && !polls) {
    throw std::invalid_argument("teardown::async_teardown: hurry_at (" + std::to_string(opts.hurry_at) +
                                ") is set without reaper.poll_interval; a worker that polls is the one a put must "
                                "hurry (without polling, puts wake it)");
  }
  return std::move(opts);
}

}  // namespace teardown::detail
