// teardown/counter.hpp — an event counter for hot paths on many cores.
//
// The kernel counts queued / sync / rejected teardowns in per-CPU vmstat counters so that
// counting never bounces a cache line between CPUs. sharded_counter is the user-space
// equivalent: a set of shards, each on its own cache line, and each thread adds to the shard
// it was given on its first add.
//
// Who may call what
//   add(n)     any thread, concurrently. Lock-free (one relaxed fetch_add on the caller's shard;
//              wait-free where fetch_add is a single instruction, as on x86-64 and AArch64 LSE),
//              except a thread's very first add of any sharded_counter, which takes its shard
//              index under a mutex (may block briefly) and may allocate.
//   read()     any thread. Wait-free: walks the shards with relaxed loads.
//
// Why not sched_getcpu(): a thread can migrate between reading its CPU number and adding, so a
// CPU index would still need an atomic add and would change under the thread's feet; a stable
// per-thread index gives the same spread without a syscall or vDSO call per add. A thread takes
// the lowest index no live thread holds on its first add (process-wide, under a mutex, once per
// thread) and gives it back when it exits, so up to S live threads never share one of S shards,
// however threads come and go. More live threads than shards wrap around: sharing a shard costs
// speed, never correctness.
//
// Snapshot semantics of read(): the sum of the shards, each read once. It is not an atomic
// snapshot of all shards: adds that run during read() may or may not be included. For a
// counter that is only ever added to, successive reads by one thread never decrease (each shard
// is read coherently), and once every add has happened-before the read (say, after the adders
// were joined), read() is exact.
//
// Memory ordering: relaxed by default. A counter publishes no data; nothing may be inferred
// about other memory from a value read here. A caller that keeps two counters in a relation (a
// subset counted after its superset, say) may add to the later one with release and read it
// first with acquire: a reader that sees that add then also sees every add made before it.
#pragma once

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace teardown {

namespace detail {

// Hands each live thread the lowest shard index no other live thread holds, and takes it back
// when the thread exits, so that at most S live threads never share one of S shards however
// threads come and go. Taken once per thread (a mutex), never on the add path. Deliberately
// never destroyed: a thread may exit after static destructors have run.
class shard_index_registry {
 public:
  static shard_index_registry& instance() {
    static shard_index_registry* const registry = [] {
      auto* created = new shard_index_registry;
      // A fork while another thread holds the mutex would leave it locked in the child.
      pthread_atfork([] { instance().mutex_.lock(); }, [] { instance().mutex_.unlock(); },
                     [] { instance().mutex_.unlock(); });
      return created;
    }();
    return *registry;
  }

  // Returned when the registry cannot grow (out of memory): the thread then shares shard 0
  // and gives nothing back.
  static constexpr std::size_t unowned = static_cast<std::size_t>(-1);

  std::size_t acquire() noexcept {
    const std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < in_use_.size(); ++i) {
      if (!in_use_[i]) {
        in_use_[i] = true;
        return i;
      }
    }
    try {
      in_use_.push_back(true);
    } catch (const std::bad_alloc&) {
      return unowned;
    }
    return in_use_.size() - 1;
  }

  void release(std::size_t index) noexcept {
    if (index == unowned) return;
    const std::lock_guard lock(mutex_);
    in_use_[index] = false;
  }

 private:
  std::mutex mutex_;
  std::vector<bool> in_use_;  // guarded by mutex_
};

// This thread's index: taken on first use, returned at thread exit.
inline std::size_t this_thread_shard_index() noexcept {
  struct holder {
    std::size_t index = shard_index_registry::instance().acquire();
    ~holder() { shard_index_registry::instance().release(index); }
  };
  thread_local const holder held;
  return held.index == shard_index_registry::unowned ? 0 : held.index;
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

  /// Lock-free; see the header comment. `order` is for callers that read several counters as
  /// one snapshot (see "Memory ordering").
  void add(std::uint64_t n = 1, std::memory_order order = std::memory_order_relaxed) noexcept {
    shards_[detail::this_thread_shard_index() & mask_].value.fetch_add(n, order);
  }

  /// Wait-free; see "Snapshot semantics" in the header comment.
  std::uint64_t read(std::memory_order order = std::memory_order_relaxed) const noexcept {
    std::uint64_t sum = 0;
    for (std::size_t i = 0; i <= mask_; ++i) sum += shards_[i].value.load(order);
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
