// teardown/counter.hpp — an event counter for hot paths on many cores.
//
// The kernel counts queued / sync / rejected teardowns in per-CPU vmstat counters so that
// counting never bounces a cache line between CPUs. sharded_counter is the user-space
// equivalent: a set of shards, each on its own cache line, and each thread adds to the shard
// it was given on its first add.
//
// Who may call what
//   add(n)     any thread, concurrently. Lock-free (one relaxed fetch_add on the caller's shard;
//              wait-free where fetch_add is a single instruction, as on x86-64 and AArch64 LSE).
//   read()     any thread. Wait-free: walks the shards with relaxed loads.
//
// Why not sched_getcpu(): a thread can migrate between reading its CPU number and adding, so a
// CPU index would still need an atomic add and would change under the thread's feet; a stable
// per-thread index gives the same spread without a syscall or vDSO call per add. Threads are
// dealt shard indexes round-robin on first use, process-wide, and an index is never reused; so
// the first S threads of a process never share one of S shards, and later threads wrap around
// (sharing a shard costs speed, never correctness).
//
// Snapshot semantics of read(): the sum of the shards, each read once. It is not an atomic
// snapshot of all shards: adds that run during read() may or may not be included. For a
// counter that is only ever added to, successive reads by one thread never decrease (each shard
// is read coherently), and once every add has happened-before the read (say, after the adders
// were joined), read() is exact.
//
// Memory ordering: all relaxed. A counter publishes no data; nothing may be inferred about
// other memory from a value read here.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>

namespace teardown {

namespace detail {

// A process-wide, stable index per thread: 0, 1, 2, ... in order of first use.
inline std::size_t this_thread_shard_index() noexcept {
  static std::atomic<std::size_t> next_index{0};
  thread_local const std::size_t index = next_index.fetch_add(1, std::memory_order_relaxed);
  return index;
}

}  // namespace detail

class sharded_counter {
 public:
  /// shards == 0 picks the number of hardware threads rounded up to a power of two (at least
  /// 1, at most 256). Any other value is clamped to [1, 256] and rounded up to a power of two.
  /// May throw std::bad_alloc.
  explicit sharded_counter(std::size_t shards = 0)
      : mask_(std::bit_ceil(std::clamp<std::size_t>(
                  shards != 0 ? shards : std::thread::hardware_concurrency(), 1, 256)) - 1),
        shards_(std::make_unique<shard[]>(mask_ + 1)) {}
  sharded_counter(const sharded_counter&) = delete;
  sharded_counter& operator=(const sharded_counter&) = delete;

  /// Lock-free; see the header comment.
  void add(std::uint64_t n = 1) noexcept {
    shards_[detail::this_thread_shard_index() & mask_].value.fetch_add(n, std::memory_order_relaxed);
  }

  /// Wait-free; see "Snapshot semantics" in the header comment.
  std::uint64_t read() const noexcept {
    std::uint64_t sum = 0;
    for (std::size_t i = 0; i <= mask_; ++i) sum += shards_[i].value.load(std::memory_order_relaxed);
    return sum;
  }

  std::size_t shard_count() const noexcept { return mask_ + 1; }

 private:
  struct alignas(64) shard {
    std::atomic<std::uint64_t> value{0};
  };

  std::size_t mask_;
  std::unique_ptr<shard[]> shards_;
};

}  // namespace teardown
