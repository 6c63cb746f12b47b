// teardown/reference_count.hpp — the kernel's reference count (atomic_inc, atomic_inc_not_zero,
// atomic_dec_and_test): the last put sees everything every holder did before its own put.
//
// A holder writes to the object, then puts its reference; whoever puts the last one tears the
// object down (or frees it) and must see all of those writes, whichever holder it is. Every
// change of the count is a read-modify-write, so each put's release heads (or continues) a
// release sequence that the last put's acquire reads from. One type holds that pattern, so that
// its orders are stated, and tested under weak memory, once; the model's mm_users and mm_count
// are two of it.
//
// Who may call what
//   get()           a holder, to make a new reference from its own; lock-free.
//   get_not_zero()  anyone, to take a reference unless the count has reached zero (the object
//                   is being torn down): false then, and nothing taken. Lock-free.
//   put()           a holder, once per reference, after its last access through it; true for
//                   the last, whose caller then owns the teardown. Lock-free.
//   read()          anyone: a lone reading that orders nothing (a test, a log line).
//
// Memory ordering: put's acq_rel pairs with itself across holders (release on every put,
// acquire on the last); get and get_not_zero are relaxed: a new reference is made from a live
// one, and as RMWs they continue the release sequence.
// Design: docs/design.md, "reference_count".
#pragma once

#include <atomic>
#include <cstdint>

#include "teardown/atomics.hpp"

namespace teardown {

/// Atomics: an Atomics policy (atomics.hpp) for the count's word; a schedule test gives it the
/// scheduler's, so its weak memory reaches put's order.
template <class Atomics = std_atomics>
class basic_reference_count {
 public:
  explicit basic_reference_count(std::int32_t initial = 1) noexcept : value_(initial) {}
  basic_reference_count(const basic_reference_count&) = delete;
  basic_reference_count& operator=(const basic_reference_count&) = delete;

  void get() noexcept { value_.fetch_add(1, std::memory_order_relaxed); }

  bool get_not_zero() noexcept {
    std::int32_t seen = value_.load(std::memory_order_relaxed);
    do {
      if (seen == 0) return false;
    } while (!value_.compare_exchange_weak(seen, seen + 1, std::memory_order_relaxed, std::memory_order_relaxed));
    return true;
  }

  [[nodiscard]] bool put() noexcept {
    // acq_rel: the release carries this holder's writes to whoever puts last; the acquire, on
    // the last put, reads from every earlier put's release sequence.
    return value_.fetch_sub(1, std::memory_order_acq_rel) == 1;
  }

  std::int32_t read() const noexcept { return value_.load(std::memory_order_relaxed); }

 private:
  typename Atomics::template atomic<std::int32_t> value_;
};

using reference_count = basic_reference_count<>;

}  // namespace teardown
