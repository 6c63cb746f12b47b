// teardown/snapshot_count.hpp — the count a stats() snapshot reads first, so that the snapshot
// never shows it ahead of the work it counts.
//
// Several snapshots keep a relation between their counts: reaped <= queued, released <=
// batches, an event counted only together with everything it did. The count that must not run
// ahead is added last, after the work and the other counts, and read first: a snapshot that
// sees an add then sees everything the adding thread did before it. One type holds that
// pattern, so that its two orders are stated, and tested under weak memory, once.
//
// Who may call what
//   add_last(n)   any thread, concurrently, after the work it counts; lock-free.
//   read_first()  any thread, before it reads the counts that must not lag behind this one.
//   read()        any thread: a lone reading that orders nothing (a trace point, a log line).
//
// Memory ordering: add_last's release pairs with read_first's acquire; read() is relaxed.
// Design: docs/design.md, "sharded_counter".
#pragma once

#include <atomic>
#include <cstdint>

#include "teardown/atomics.hpp"

namespace teardown {

/// Atomics: an Atomics policy (atomics.hpp) for the count's word; a schedule test gives it the
/// scheduler's, so its weak memory reaches the two orders.
template <class Atomics = std_atomics>
class basic_snapshot_count {
 public:
  void add_last(std::uint64_t n = 1) noexcept {
    // release: pairs with read_first's acquire; the work counted is sequenced before this add.
    value_.fetch_add(n, std::memory_order_release);
  }

  std::uint64_t read_first() const noexcept {
    // acquire: pairs with add_last's release; the caller reads its other counts after this.
    return value_.load(std::memory_order_acquire);
  }

  std::uint64_t read() const noexcept { return value_.load(std::memory_order_relaxed); }

 private:
  typename Atomics::template atomic<std::uint64_t> value_{0};
};

using snapshot_count = basic_snapshot_count<>;

}  // namespace teardown
