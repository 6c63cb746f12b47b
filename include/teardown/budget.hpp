// teardown/budget.hpp — a reservation counter that bounds how much deferred work may be pending.
//
// The kernel series charges each queued mm's RSS to a pending-pages budget before queuing it,
// and tears down inline when the charge does not fit. `budget` is that counter:
//
//     teardown::budget pending(max_pending_pages);
//     if (pending.try_reserve(rss)) { item.charge = rss; queue(item); }   // reaper: release(charge)
//     else tear_down_inline(item);
//
// Who may call what
//   try_reserve, release, reserve     any thread, concurrently. try_reserve and release are
//                                     lock-free (add_then_check: one or two fetch_adds; exact:
//                                     a CAS loop that retries only when another thread moved
//                                     the counter in between).
//   pending, cap, rejected, high_water   any thread; wait-free relaxed snapshots.
//   set_cap, reset_high_water         any thread; wait-free single stores.
//   replace_cap                       any thread; lock-free (one CAS).
//   Signal handlers: try_reserve, reserve, release and the snapshots are async-signal-safe
//   (lock-free atomics, nothing else). Whatever throws (the constructor, set_cap's refusal) is
//   not: an exception allocates.
//
// Two policies
//   add_then_check (`budget`, the default): add first, then look; on overshoot subtract back
//     and fail. One RMW on success: the cheapest possible under contention. A failing reserve
//     inflates the counter for an instant, so a racing reserve that would have fit may fail
//     too: it can over-reject, never over-admit. Fits hot paths where a spurious fallback only
//     costs the inline path (the kernel's choice).
//   exact (`exact_budget`): read, check, compare-and-swap. Never rejects a reserve that fits at
//     the instant it is decided, but every contending thread retries its CAS. Fits low rates,
//     or caps so tight that a spurious rejection matters.
//
// Guarantees (both policies)
//   - The sum of successful, not yet released reservations never exceeds the cap, at any
//     instant, under any number of threads.
//   - n == 0 always succeeds; n > cap fails without touching the counter.
//   - Nothing can wrap the counter: cap <= max_cap = 2^48, and a reserve of more than 2^32 takes
//     the exact (CAS) route even in add_then_check, so the transient overshoot is at most
//     2^32 per thread inside try_reserve. Wrapping 2^64 would take about 2^32 threads there
//     at once; Linux caps a whole system at 2^22 tasks (PID_MAX_LIMIT).
//   - Lowering the cap below what is pending admits nothing new (n > 0) until pending drops
//     below the new cap.
//   - release(n) must return exactly what a successful reserve charged; releasing more than is
//     pending is a caller's bug, caught in debug builds.
//
// Memory ordering: all relaxed. The budget publishes no data; it only counts, and every
// read-modify-write of one atomic is totally ordered (its modification order) whatever the
// memory order, which is all the cap invariant needs. A successful add leaves the counter at or
// under the cap, and the counter is never less than the committed sum (failed adds only inflate
// it), so the committed sum is at or under the cap when it grows. Whatever the reserved item
// publishes travels through its own queue.
// Design: docs/design.md, "budget: add-then-check reservation".
#pragma once

#include <atomic>
#include <cassert>
#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace teardown {

/// Policy tags for basic_budget; see the header comment for when each fits.
struct add_then_check {};
struct exact {};

template <class Budget>
class basic_reservation;

template <class Policy>
class basic_budget {
  static_assert(std::is_same_v<Policy, add_then_check> || std::is_same_v<Policy, exact>,
                "teardown::basic_budget: Policy is add_then_check or exact");

 public:
  /// The largest accepted cap: 2^48 (with 4 KiB pages, a 1 EiB bound).
  static constexpr std::uint64_t max_cap = std::uint64_t{1} << 48;

  /// Throws std::invalid_argument if cap > max_cap.
  explicit basic_budget(std::uint64_t cap) : cap_(validated(cap, "constructor")) {}
  basic_budget(const basic_budget&) = delete;
  basic_budget& operator=(const basic_budget&) = delete;

  /// Lock-free. Charges n if it fits under the cap. See the header comment for each policy.
  [[nodiscard]] bool try_reserve(std::uint64_t n) noexcept {
    if (n == 0) return true;
    const std::uint64_t cap = cap_.load(std::memory_order_relaxed);
    if (n > cap) return reject();
    if constexpr (std::is_same_v<Policy, add_then_check>) {
      if (n <= largest_blind_add) {
        const std::uint64_t after = pending_.fetch_add(n, std::memory_order_relaxed) + n;
        if (after > cap) {
          pending_.fetch_sub(n, std::memory_order_relaxed);
          return reject();
        }
        note_high_water(after);
        return true;
      }
    }
    return reserve_by_cas(n, cap);
  }

  /// Lock-free (one fetch_sub). Returns a charge taken by a successful reserve.
  void release(std::uint64_t n) noexcept {
    [[maybe_unused]] const std::uint64_t before = pending_.fetch_sub(n, std::memory_order_relaxed);
    assert(before >= n && "teardown::budget::release: releasing more than is pending");
  }

  /// A RAII reserve: the returned reservation releases on destruction unless detached.
  /// Test it for success with operator bool.
  [[nodiscard]] basic_reservation<basic_budget> reserve(std::uint64_t n) noexcept {
    if (!try_reserve(n)) return {};
    return basic_reservation<basic_budget>(*this, n);
  }

  /// What is charged now. Under add_then_check a racing failed reserve may show briefly.
  std::uint64_t pending() const noexcept { return pending_.load(std::memory_order_relaxed); }
  std::uint64_t cap() const noexcept { return cap_.load(std::memory_order_relaxed); }
  /// Failed try_reserve calls so far (n > cap included).
  std::uint64_t rejected() const noexcept { return rejected_.load(std::memory_order_relaxed); }
  /// The highest pending seen by a successful reserve since construction or the last
  /// reset_high_water(). Under add_then_check it may include a racing reserve's charge that
  /// was about to be taken back; it never exceeds the cap in force at that reserve.
  std::uint64_t high_water() const noexcept { return high_water_.load(std::memory_order_relaxed); }
  void reset_high_water() noexcept { high_water_.store(0, std::memory_order_relaxed); }

  /// Same validation as the constructor: throws std::invalid_argument, changing nothing, if
  /// cap > max_cap. Wait-free otherwise.
  void set_cap(std::uint64_t cap) { cap_.store(validated(cap, "set_cap"), std::memory_order_relaxed); }
  /// set_cap(desired) only if the cap is still `expected` (one CAS): true if it was replaced.
  /// Lets a temporary cap be undone without overwriting a cap someone set meanwhile. Throws
  /// std::invalid_argument, changing nothing, if desired > max_cap. Lock-free.
  bool replace_cap(std::uint64_t expected, std::uint64_t desired) {
    desired = validated(desired, "replace_cap");
    return cap_.compare_exchange_strong(expected, desired, std::memory_order_relaxed);
  }

 private:
  // Blind adds above this size would let a few concurrent threads overshoot by a lot; they go
  // through the CAS route instead (see "Guarantees").
  static constexpr std::uint64_t largest_blind_add = std::uint64_t{1} << 32;

  static std::uint64_t validated(std::uint64_t cap, const char* where) {
    if (cap > max_cap) {
      throw std::invalid_argument(std::string("teardown::budget::") + where + ": cap " +
                                  std::to_string(cap) + " exceeds max_cap 2^48 (" +
                                  std::to_string(max_cap) + ")");
    }
    return cap;
  }

  bool reserve_by_cas(std::uint64_t n, std::uint64_t cap) noexcept {
    std::uint64_t seen = pending_.load(std::memory_order_relaxed);
    do {
      // cap >= n here, so cap - n cannot wrap; seen + n cannot either (seen < 2^55).
      if (seen > cap - n) return reject();
    } while (!pending_.compare_exchange_weak(seen, seen + n, std::memory_order_relaxed,
                                             std::memory_order_relaxed));
    note_high_water(seen + n);
    return true;
  }

  bool reject() noexcept {
    rejected_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }

  // Cheap in the common case: one relaxed load of a line that is rarely written.
  void note_high_water(std::uint64_t value) noexcept {
    std::uint64_t seen = high_water_.load(std::memory_order_relaxed);
    while (value > seen &&
           !high_water_.compare_exchange_weak(seen, value, std::memory_order_relaxed,
                                              std::memory_order_relaxed)) {
    }
  }

  // Two cache lines: the written words (pending_ on every reserve and release, rejected_ on
  // failures) on one, the read-mostly words on the other. Sharing one line was measured slower
  // under contention: every read of cap_ then waited for the line another core was writing.
  alignas(64) std::atomic<std::uint64_t> pending_{0};
  std::atomic<std::uint64_t> rejected_{0};
  alignas(64) std::atomic<std::uint64_t> cap_;
  std::atomic<std::uint64_t> high_water_{0};
};

/// The binding-contract budget: add-then-check.
class budget : public basic_budget<add_then_check> {
 public:
  using basic_budget::basic_budget;
};

/// The read-check-CAS budget: no spurious rejections, more retries under contention.
class exact_budget : public basic_budget<exact> {
 public:
  using basic_budget::basic_budget;
};

/// A charge held on a budget; move-only. Released on destruction unless detach()ed into an item,
/// which then owns the charge and must release exactly detach()'s result. Not thread-safe (one
/// owner), but its release is the budget's thread-safe release.
template <class Budget>
class basic_reservation {
 public:
  basic_reservation() noexcept = default;
  basic_reservation(basic_reservation&& other) noexcept
      : budget_(std::exchange(other.budget_, nullptr)), amount_(std::exchange(other.amount_, 0)) {}
  basic_reservation& operator=(basic_reservation&& other) noexcept {
    if (this != &other) {
      reset();
      budget_ = std::exchange(other.budget_, nullptr);
      amount_ = std::exchange(other.amount_, 0);
    }
    return *this;
  }
  basic_reservation(const basic_reservation&) = delete;
  basic_reservation& operator=(const basic_reservation&) = delete;
  ~basic_reservation() { reset(); }

  /// True if the reserve succeeded (an amount of 0 included) and the charge is still held.
  explicit operator bool() const noexcept { return budget_ != nullptr; }
  std::uint64_t amount() const noexcept { return amount_; }

  /// Hands the charge over: nothing is released now; the caller owns `amount` and must
  /// release exactly that later.
  [[nodiscard]] std::uint64_t detach() noexcept {
    budget_ = nullptr;
    return std::exchange(amount_, 0);
  }

  /// Releases the charge now (no-op if none is held).
  void reset() noexcept {
    if (budget_ != nullptr) std::exchange(budget_, nullptr)->release(std::exchange(amount_, 0));
  }

 private:
  template <class Policy>
  friend class basic_budget;
  basic_reservation(Budget& budget, std::uint64_t amount) noexcept : budget_(&budget), amount_(amount) {}

  Budget* budget_ = nullptr;
  std::uint64_t amount_ = 0;
};

using reservation = basic_reservation<basic_budget<add_then_check>>;
using exact_reservation = basic_reservation<basic_budget<exact>>;

}  // namespace teardown
