// teardown/static_key.hpp — runtime and compile-time toggles for a deferred path.
//
// The kernel gates mm_reaper behind a static key (default off): the disabled path costs a
// patched-out branch. User space cannot patch code, so the nearest equivalent is one relaxed
// load of a flag that is almost never written; its cache line stays shared in every core's
// cache and the branch predicts perfectly. Where even that is too much, const_key<false> makes
// the deferred path a compile-time dead branch (the kernel's CONFIG_ASYNC_MM_TEARDOWN=n).
//
// Who may call what
//   static_key::enabled()              any thread, any time. Wait-free: one relaxed load.
//   static_key::enable/disable/set     any thread; writers serialize on a mutex (may block
//                                      briefly behind another writer, never behind a reader).
//   counting_static_key::inc/dec       any thread; serialized the same way.
//   const_key<On>::enabled()           constexpr.
//
// Memory ordering: enabled() is relaxed because the key publishes no data. It only chooses a
// path, and each path must be correct whichever value it reads: a reader that sees the old
// value an instant after a write simply takes the path it would have taken a moment earlier.
// Anything a path needs (a queue, a worker) must already be published by its own
// synchronization before the key can be turned on. Writers are serialized by a mutex, so once
// concurrent writers have all returned, the key holds the value of the last writer to take
// the mutex — "the last value written".
// Design: docs/design.md, "static_key, counting_static_key, const_key".
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <stdexcept>

namespace teardown {

/// A runtime on/off switch whose read is one relaxed load. Default off.
class static_key {
 public:
  constexpr explicit static_key(bool enabled = false) noexcept : enabled_(enabled) {}
  static_key(const static_key&) = delete;
  static_key& operator=(const static_key&) = delete;

  /// Wait-free. See "Memory ordering" in the header comment for why relaxed is enough.
  bool enabled() const noexcept { return enabled_.load(std::memory_order_relaxed); }

  /// May block behind another writer.
  void enable() { set(true); }
  /// May block behind another writer.
  void disable() { set(false); }
  /// May block behind another writer.
  void set(bool on) {
    const std::lock_guard lock(writers_);
    // Relaxed: the mutex orders writers among themselves; readers need no ordering.
    enabled_.store(on, std::memory_order_relaxed);
  }

 private:
  std::atomic<bool> enabled_;
  std::mutex writers_;  // serializes set(); never taken by enabled()
};

/// The counting form (the kernel's static_key_slow_inc/dec): enabled while the count is
/// positive, so independent users can each hold the path open. dec() below zero is refused.
class counting_static_key {
 public:
  constexpr counting_static_key() noexcept = default;
  counting_static_key(const counting_static_key&) = delete;
  counting_static_key& operator=(const counting_static_key&) = delete;

  /// Wait-free: one relaxed load.
  bool enabled() const noexcept { return enabled_.load(std::memory_order_relaxed); }

  /// May block behind another writer.
  void inc() {
    const std::lock_guard lock(writers_);
    if (count_ == UINT64_MAX) throw std::overflow_error("teardown::counting_static_key::inc: count would overflow");
    if (count_++ == 0) enabled_.store(true, std::memory_order_relaxed);  // ordered by writers_
  }

  /// May block behind another writer. Throws std::logic_error, changing nothing, when the
  /// count is already zero: a dec without a matching inc is a caller's bug.
  void dec() {
    const std::lock_guard lock(writers_);
    if (count_ == 0) {
      throw std::logic_error("teardown::counting_static_key::dec: count is already zero (dec without a matching inc)");
    }
    if (--count_ == 0) enabled_.store(false, std::memory_order_relaxed);  // ordered by writers_
  }

  /// The number of outstanding inc() calls. May block behind a writer.
  std::uint64_t count() const {
    const std::lock_guard lock(writers_);
    return count_;
  }

 private:
  std::atomic<bool> enabled_{false};
  mutable std::mutex writers_;
  std::uint64_t count_ = 0;  // guarded by writers_
};

/// A key fixed at compile time. const_key<false> lets a composition compile its deferred path
/// out entirely: `if (Key::enabled())` on a constant false is removed by the compiler.
template <bool On>
struct const_key {
  static constexpr bool enabled() noexcept { return On; }
};

}  // namespace teardown
