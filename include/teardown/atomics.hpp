// teardown/atomics.hpp — the Atomics policy: which atomic type the lock-free structures use.
//
// Who may call what
//   Nothing here is called directly by users. A structure such as llist<T, Hook, Atomics>
//   declares its shared words as `typename Atomics::template atomic<W>` and uses only the
//   std::atomic member functions listed below, so a policy can be swapped without touching it:
//
//     load(order)  store(v, order)  exchange(v, order)
//     compare_exchange_weak(expected, desired, success, failure)
//     compare_exchange_strong(expected, desired, success, failure)
//     fetch_add(n, order)  fetch_sub(n, order)              (integral W only)
//
//   A policy may also have data_written(where) and data_read(where), static: a structure calls
//   data_written where a thread's accesses to data outside the policy must happen before another
//   thread's data_read at the same place (llist: a node's link before the add, and del_first's
//   read of it; the reaper: its worker's thread handle, and each read of the worker's CPU clock
//   before the close that lets the thread end). A schedule test's policy checks there that the
//   read happens after the last write of every thread, as a race detector would; std_atomics and
//   ao_atomics have neither, and the calls compile to nothing.
//
//   std_atomics   std::atomic<W>. The default, and the one every other header assumes.
//   ao_atomics    libatomic_ops AO_t operations (present when <atomic_ops.h> is; the CMake
//                 target defines TEARDOWN_HAVE_ATOMIC_OPS when it links the package). W must be a
//                 pointer or an integer no wider than AO_t.
//
// Progress
//   Every operation of std_atomics is what the platform's std::atomic gives (lock-free for
//   pointers and 64-bit integers on the targets we build for; the header static_asserts it).
//   ao_atomics has no exchange primitive, so its exchange() is a compare-and-swap loop:
//   lock-free, not wait-free. A structure documented as wait-free (llist::del_all) is lock-free
//   on that backend; its header says so.
//
// Memory ordering
//   ao_atomics maps each std::memory_order onto the AO suffix with the same meaning:
//   relaxed -> no suffix, acquire -> _acquire, release -> _release, acq_rel -> _full. On GCC
//   and Clang libatomic_ops implements those with __atomic builtins, which ThreadSanitizer
//   sees. It never calls AO_nop_*: a standalone fence is invisible to ThreadSanitizer, so no
//   ordering in this library may rest on one. No structure over an Atomics policy uses
//   memory_order_seq_cst (the reaper pool's and the model AIO context's seq_cst words are their
//   Sync policy's, sync.hpp);
//   ao_atomics accepts it and gives it the strongest AO form it has (a _full RMW, or a _full
//   compare-and-swap standing in for a load or store), which is at least acq_rel.
//
// Design: docs/design.md, "atomics: the policy".
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#if defined(TEARDOWN_HAVE_ATOMIC_OPS) || (!defined(TEARDOWN_NO_ATOMIC_OPS) && __has_include(<atomic_ops.h>))
#include <atomic_ops.h>
#define TEARDOWN_AO_ATOMICS_AVAILABLE 1
#else
#define TEARDOWN_AO_ATOMICS_AVAILABLE 0
#endif

namespace teardown {

/// The default policy: std::atomic.
struct std_atomics {
  template <class W>
  using atomic = std::atomic<W>;

  static constexpr const char* name = "std";
};

namespace detail {
template <class Atomics>
inline void data_written(const void* where) noexcept {
  if constexpr (requires { Atomics::data_written(where); }) Atomics::data_written(where);
}
template <class Atomics>
inline void data_read(const void* where) noexcept {
  if constexpr (requires { Atomics::data_read(where); }) Atomics::data_read(where);
}
}  // namespace detail

static_assert(std::atomic<void*>::is_always_lock_free,
              "teardown needs lock-free pointer atomics on this platform");

#if TEARDOWN_AO_ATOMICS_AVAILABLE

/// libatomic_ops policy. Same interface and orders as std_atomics; see the header comment for
/// exchange() (a CAS loop) and seq_cst (never used by teardown).
struct ao_atomics {
  template <class W>
  class atomic {
    static_assert(std::is_pointer_v<W> || std::is_integral_v<W>,
                  "ao_atomics holds pointers and integers only");
    static_assert(sizeof(W) <= sizeof(AO_t), "ao_atomics: the value must fit in an AO_t");

   public:
    constexpr atomic() noexcept = default;
    constexpr explicit atomic(W initial) noexcept : word_(to_word(initial)) {}
    // Constant initialization for a null pointer (reinterpret_cast is never constexpr), so a
    // namespace-scope structure on this backend can be constinit.
    constexpr atomic(std::nullptr_t) noexcept
      requires std::is_pointer_v<W>
        : word_(0) {}
    atomic(const atomic&) = delete;
    atomic& operator=(const atomic&) = delete;

    W load(std::memory_order order = std::memory_order_seq_cst) const noexcept {
      switch (order) {
        case std::memory_order_relaxed:
          return from_word(AO_load(&word_));
        case std::memory_order_seq_cst:
          // A _full CAS that swaps a value for itself reads the latest value with acq_rel
          // ordering; AO's own AO_load_full would use a fence ThreadSanitizer cannot see.
          return from_word(AO_fetch_compare_and_swap_full(&word_, 0, 0));
        default:  // acquire, consume, acq_rel
          return from_word(AO_load_acquire(&word_));
      }
    }

    void store(W value, std::memory_order order = std::memory_order_seq_cst) noexcept {
      switch (order) {
        case std::memory_order_relaxed:
          AO_store(&word_, to_word(value));
          return;
        case std::memory_order_seq_cst:
          (void)exchange(value, std::memory_order_acq_rel);
          return;
        default:  // release, acq_rel
          AO_store_release(&word_, to_word(value));
          return;
      }
    }

    // AO has no unconditional swap: a CAS loop, lock-free rather than wait-free.
    W exchange(W value, std::memory_order order = std::memory_order_seq_cst) noexcept {
      AO_t seen = AO_load(&word_);
      for (;;) {
        const AO_t previous = cas(seen, to_word(value), order);
        if (previous == seen) return from_word(previous);
        seen = previous;
      }
    }

    // AO's CAS never fails spuriously, so weak and strong are the same.
    bool compare_exchange_weak(W& expected, W desired, std::memory_order success,
                               std::memory_order failure) noexcept {
      return compare_exchange_strong(expected, desired, success, failure);
    }

    bool compare_exchange_strong(W& expected, W desired, std::memory_order success,
                                 std::memory_order failure) noexcept {
      // AO fixes the failure order by the success order (relaxed -> relaxed, release ->
      // relaxed, acquire and full -> acquire), so an acquire failure order needs the form
      // whose failure is acquire.
      const std::memory_order order =
          failure == std::memory_order_acquire && success == std::memory_order_release
              ? std::memory_order_acq_rel
          : failure == std::memory_order_acquire && success == std::memory_order_relaxed
              ? std::memory_order_acquire
              : success;
      const AO_t previous = cas(to_word(expected), to_word(desired), order);
      if (previous == to_word(expected)) return true;
      expected = from_word(previous);
      return false;
    }

    W fetch_add(W n, std::memory_order order = std::memory_order_seq_cst) noexcept
      requires std::is_integral_v<W>
    {
      const AO_t delta = static_cast<AO_t>(n);
      switch (order) {
        case std::memory_order_relaxed:
          return from_word(AO_fetch_and_add(&word_, delta));
        case std::memory_order_acquire:
        case std::memory_order_consume:
          return from_word(AO_fetch_and_add_acquire(&word_, delta));
        case std::memory_order_release:
          return from_word(AO_fetch_and_add_release(&word_, delta));
        default:  // acq_rel, seq_cst
          return from_word(AO_fetch_and_add_full(&word_, delta));
      }
    }

    W fetch_sub(W n, std::memory_order order = std::memory_order_seq_cst) noexcept
      requires std::is_integral_v<W>
    {
      // AO_t arithmetic is unsigned and wraps, so adding the two's complement subtracts.
      return fetch_add(static_cast<W>(AO_t{0} - static_cast<AO_t>(n)), order);
    }

   private:
    static AO_t to_word(W value) noexcept {
      if constexpr (std::is_pointer_v<W>) {
        return reinterpret_cast<AO_t>(value);
      } else {
        return static_cast<AO_t>(value);
      }
    }
    static W from_word(AO_t word) noexcept {
      if constexpr (std::is_pointer_v<W>) {
        return reinterpret_cast<W>(word);
      } else {
        return static_cast<W>(word);
      }
    }

    // Returns the value seen, as AO_fetch_compare_and_swap does.
    AO_t cas(AO_t expected, AO_t desired, std::memory_order order) noexcept {
      switch (order) {
        case std::memory_order_relaxed:
          return AO_fetch_compare_and_swap(&word_, expected, desired);
        case std::memory_order_acquire:
        case std::memory_order_consume:
          return AO_fetch_compare_and_swap_acquire(&word_, expected, desired);
        case std::memory_order_release:
          return AO_fetch_compare_and_swap_release(&word_, expected, desired);
        default:  // acq_rel, seq_cst
          return AO_fetch_compare_and_swap_full(&word_, expected, desired);
      }
    }

    mutable volatile AO_t word_ = 0;
  };

  static constexpr const char* name = "ao";
};

#endif  // TEARDOWN_AO_ATOMICS_AVAILABLE

}  // namespace teardown
