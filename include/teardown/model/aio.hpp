// teardown/model/aio.hpp — the model of an mm's AIO context (part of model/mm.hpp).
//
// exit_aio() is idempotent and blocks until in-flight AIO completes: the reason the mm_reaper
// patch series runs it eagerly on the exiting thread, before the mm is queued.
//
// Who may call what
//   submit, complete        any thread; lock-free. complete() only for a successful submit().
//   exit_aio                any thread; blocks while a request is in flight. Idempotent.
//   in_flight, exit_calls   any thread; wait-free snapshots (relaxed).
//
// Memory ordering: submit() and exit_aio() are a store-load pair on two variables (Dekker), each
// write and each read seq_cst: either exit_aio sees the request in flight and waits for it, or
// submit sees the context dead and backs out. complete()'s release pairs with exit_aio's load,
// so a request's effects happen-before the teardown that waited for it.
// Design: docs/design.md, "model/mm.hpp: the kernel's composition, in user space".
#pragma once

#include <atomic>
#include <cstdint>

#include "teardown/sync.hpp"

namespace teardown::model {

/// The model of an mm's AIO context: exit_aio() is idempotent and blocks until in-flight AIO
/// completes (the reason the series runs it eagerly on the exiting thread). Sync: the words and
/// the futex (sync.hpp, with futex_wake_all); a schedule test gives it the scheduler's.
template <class Sync = std_sync>
class basic_aio_context {
 public:
  /// Starts one AIO request; false (and nothing started) once exit_aio() has begun.
  bool submit() noexcept {
    // seq_cst with exit_aio's: a store-load pair on two variables (Dekker). Either exit_aio
    // sees this request in flight and waits for it, or this sees `dead_` and backs out.
    in_flight_.fetch_add(1, std::memory_order_seq_cst);
    if (dead_.load(std::memory_order_seq_cst) != 0) {
      complete();
      return false;
    }
    return true;
  }

  /// Completes one request started by a successful submit().
  void complete() noexcept {
    // release: pairs with the acquire load in exit_aio; the request's effects happen-before
    // the teardown that waited for it.
    in_flight_.fetch_sub(1, std::memory_order_release);
    Sync::futex_wake_all(in_flight_);
  }

  /// Idempotent; blocks until no request is in flight. Counts its calls.
  void exit_aio() noexcept {
    dead_.store(1, std::memory_order_seq_cst);  // seq_cst: see submit()
    exit_calls_.fetch_add(1, std::memory_order_relaxed);
    // seq_cst: the read of the Dekker pair (see submit()); an acquire load may read the count
    // from before a submit whose seq_cst load of dead_ came before our store (store
    // buffering), and both sides go on. It also acquires, pairing with complete()'s release.
    for (std::uint32_t n; (n = in_flight_.load(std::memory_order_seq_cst)) != 0;) Sync::futex_wait(in_flight_, n);
  }

  std::uint32_t in_flight() const noexcept { return in_flight_.load(std::memory_order_relaxed); }
  std::uint32_t exit_calls() const noexcept { return exit_calls_.load(std::memory_order_relaxed); }

 private:
  typename Sync::template atomic<std::uint32_t> in_flight_{0};
  typename Sync::template atomic<std::uint32_t> dead_{0};  // 1 once exit_aio() has begun
  typename Sync::template atomic<std::uint32_t> exit_calls_{0};
};

using aio_context = basic_aio_context<>;

}  // namespace teardown::model
