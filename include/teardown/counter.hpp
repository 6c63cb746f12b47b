// teardown/counter.hpp — an event counter for hot paths on many cores.
//
// The kernel counts queued / sync / rejected teardowns in per-CPU vmstat counters so that
// counting never bounces a cache line between CPUs. sharded_counter is the user-space
// equivalent: a set of shards, each on its own cache line, and each thread adds to the shard
// it was given on its first add.
//
// Who may call what
//   add(n)     any thread, concurrently; also a signal handler. Lock-free (one relaxed fetch_add
//              on the caller's shard; wait-free where fetch_add is a single instruction, as on
//              x86-64 and AArch64 LSE). A thread's very first add of any sharded structure
//              (this one, sharded_llist) also takes its shard index: a scan of a fixed table
//              with compare-and-swap and one pthread_setspecific, lock-free, never allocating.
//              Async-signal-safe, the first add included, even when the handler interrupted
//              its thread inside malloc or inside that thread's own first add (see "Shard
//              indexes"). It cannot fail: under memory exhaustion it counts like any other add.
//   read()     any thread; also a signal handler. Wait-free: walks the shards with relaxed loads.
//   construct  may allocate (std::bad_alloc); not async-signal-safe.
//   The signal-safety above holds for the library's atomics (std_atomics, ao_atomics); with a
//   Sync policy's atomics (a schedule test's) a handler may not call add or read.
//
// Shard indexes. A thread takes the lowest slot no live thread holds in a table of 4096
// (detail::shard_index_registry::slots, one bit each, taken with a CAS) on its first add, and
// gives it back when it exits, so up to S live threads never share one of S shards (S <= 256),
// however threads come and go. With every slot held, a thread takes an index round robin, shared
// and never given back: sharing a shard costs speed, never correctness. Why not sched_getcpu():
// a thread can migrate between reading its CPU number and adding, so a CPU index would still
// need an atomic add and would change under the thread's feet; a stable per-thread index gives
// the same spread without a syscall or vDSO call per add.
//
// Why the first add is async-signal-safe. Nothing on it locks, allocates or registers a
// thread_local destructor (glibc's __cxa_thread_atexit_impl callocs, and ends the process when
// that fails). The index lives in a constant-initialized, trivially destructible thread_local
// word; the slot goes back at thread exit through the destructor of a pthread key made once, at
// load time or by the first sharded structure's constructor, never on the add path. The add path
// stores the slot with pthread_setspecific, which writes into the thread descriptor without
// allocating for glibc's first 32 keys (PTHREAD_KEY_2NDLEVEL_SIZE; a later key's first store on
// a thread callocs a block) and for every key on musl. A key that would allocate (glibc, a
// process that already made 32) or that cannot be made is not used: threads then keep their
// slots until the process ends, and once all are held new threads share (speed only). Reentrancy:
// a handler that runs the first add while the thread is in the middle of its own claims a slot
// too; the one that settles second finds the thread's word already set, gives its slot back and
// uses the word's: one index per thread, nothing leaked. Limits: in an object loaded by
// dlopen(), glibc allocates a thread's copy of that object's thread_locals on the thread's first
// touch of them, so there the first add is async-signal-safe only once the thread has added
// outside a handler. In a fork child the slots of the parent's other threads stay held (those
// threads never exit there); the forking thread keeps its own.
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
// Design: docs/design.md, "sharded_counter".
#pragma once

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <type_traits>

#include "teardown/atomics.hpp"

namespace teardown {

namespace detail {

// The table of shard indexes (see "Shard indexes" in the header comment). Constant-initialized
// and trivially destructible: usable from the first instruction of the program to its last, in
// static destructors and on threads that outlive them. Every operation but prepare() and
// retire() is lock-free and async-signal-safe.
class shard_index_registry {
 public:
  static constexpr std::size_t slots = 4096;
  static constexpr std::size_t none = slots;  // claim() found every slot held

  constexpr shard_index_registry() noexcept = default;
  shard_index_registry(const shard_index_registry&) = delete;
  shard_index_registry& operator=(const shard_index_registry&) = delete;

  static shard_index_registry& instance() noexcept;

  /// The lowest slot no one holds, now held by the caller; none if every slot is held.
  std::size_t claim() noexcept {
    for (std::size_t word = 0; word < words; ++word) {
      std::uint64_t bits = held_[word].load(std::memory_order_relaxed);
      while (bits != ~std::uint64_t{0}) {
        const std::uint64_t lowest_free = ~bits & (bits + 1);
        // relaxed: a slot publishes nothing; the CAS's atomicity alone gives it to one thread.
        if (held_[word].compare_exchange_weak(bits, bits | lowest_free, std::memory_order_relaxed)) {
          return word * 64 + static_cast<std::size_t>(std::countr_zero(lowest_free));
        }
      }
    }
    return none;
  }

  /// Frees a slot claim() returned (none: nothing).
  void give_back(std::size_t slot) noexcept {
    if (slot >= slots) return;
    held_[slot / 64].fetch_and(~(std::uint64_t{1} << (slot % 64)), std::memory_order_relaxed);
  }

  /// A snapshot: true if someone holds `slot`.
  bool held(std::size_t slot) const noexcept {
    return slot < slots && ((held_[slot / 64].load(std::memory_order_relaxed) >> (slot % 64)) & 1) != 0;
  }

  /// The calling thread's word: 0 until its first add, then (index + 1), with owned_bit set when
  /// the index is a slot of its own. Constant-initialized and trivially destructible: no guard,
  /// no allocation, no destructor to register; only the thread and its signal handlers touch it.
  static std::atomic<std::size_t>& this_thread_word() noexcept {
    static constinit thread_local std::atomic<std::size_t> word{0};
    return word;
  }
  static constexpr std::size_t index_of(std::size_t word) noexcept { return (word & ~owned_bit) - 1; }

  /// The calling thread's first add: claim, then settle.
  std::size_t take_for_this_thread() noexcept { return settle_for_this_thread(claim()); }

  /// Makes `claimed` (claim()'s result) the calling thread's index, unless the thread got one
  /// meanwhile (a signal handler ran its first add in between): then `claimed` goes back and the
  /// thread keeps the one it has. Returns the thread's index.
  std::size_t settle_for_this_thread(std::size_t claimed) noexcept {
    const std::size_t word = claimed < slots ? (claimed + 1) | owned_bit : shared_index() + 1;
    std::size_t current = 0;
    // relaxed: the word is this thread's; a handler runs on the thread, in program order.
    if (!this_thread_word().compare_exchange_strong(current, word, std::memory_order_relaxed)) {
      give_back(claimed);
      return index_of(current);
    }
    if (claimed < slots) give_back_at_exit(word);
    return index_of(word);
  }

  /// Makes the thread-exit key, once. Not on the add path: called at load time and by the
  /// sharded structures' constructors (it may take libc's locks).
  void prepare() noexcept {
    if (key_word_.load(std::memory_order_relaxed) != key_absent) return;
    std::uint64_t expected = key_absent;
    if (!key_word_.compare_exchange_strong(expected, key_making, std::memory_order_relaxed)) return;
    std::uint64_t state = key_unusable;
    pthread_key_t key{};
    if (pthread_key_create(&key, &thread_exiting) == 0) {
      if (stores_in_place(key)) {
        state = ready_word(key);
      } else {
        (void)pthread_key_delete(key);
      }
    }
    // Relaxed: the key travels in the word itself, so a reader has nothing else to see.
    key_word_.store(state, std::memory_order_relaxed);
  }

  /// Deletes the key when the code that holds thread_exiting goes away (the end of the
  /// program, or dlclose of the object holding this copy): no thread runs it afterwards.
  void retire() noexcept {
    std::uint64_t seen = key_word_.load(std::memory_order_relaxed);
    if ((seen & state_mask) == key_ready &&
        key_word_.compare_exchange_strong(seen, key_unusable, std::memory_order_relaxed)) {
      (void)pthread_key_delete(key_of(seen));
    }
  }

 private:
  static constexpr std::size_t words = slots / 64;
  static constexpr std::size_t owned_bit = ~(~std::size_t{0} >> 1);
  // key_word_: the state in its low two bits; once key_ready, the key above them. One word, so
  // that whoever reads key_ready has the key too, with no ordering to pair.
  static constexpr std::uint64_t key_absent = 0, key_making = 1, key_ready = 2, key_unusable = 3, state_mask = 3;
  static_assert(std::is_integral_v<pthread_key_t> && sizeof(pthread_key_t) <= 4,
                "teardown: the thread-exit key is kept in one word with its state");
  static constexpr std::uint64_t ready_word(pthread_key_t key) noexcept {
    return (static_cast<std::uint64_t>(key) << 2) | key_ready;
  }
  static constexpr pthread_key_t key_of(std::uint64_t word) noexcept { return static_cast<pthread_key_t>(word >> 2); }

  static_assert(std::atomic<std::uint64_t>::is_always_lock_free && std::atomic<std::size_t>::is_always_lock_free,
                "teardown: sharded structures need lock-free atomics to be async-signal-safe");

  // True if pthread_setspecific(key, ...) never allocates (see the header comment).
  static bool stores_in_place(pthread_key_t key) noexcept {
#if defined(__GLIBC__)
    return static_cast<unsigned long>(key) < 32;  // glibc's PTHREAD_KEY_2NDLEVEL_SIZE
#else
    (void)key;
    return true;
#endif
  }

  // With every slot held: spread over the table, shared.
  std::size_t shared_index() noexcept { return shared_next_.fetch_add(1, std::memory_order_relaxed) % slots; }

  void give_back_at_exit(std::size_t word) noexcept {
    const std::uint64_t key = key_word_.load(std::memory_order_relaxed);
    if ((key & state_mask) != key_ready) return;  // kept until the process ends
    (void)pthread_setspecific(key_of(key), reinterpret_cast<void*>(word));
  }

  // The key's destructor, at thread exit (after the thread's C++ thread_local destructors).
  static void thread_exiting(void* value) noexcept {
    // A later add on this thread (from another key's destructor) takes an index afresh.
    this_thread_word().store(0, std::memory_order_relaxed);
    instance().give_back(index_of(reinterpret_cast<std::uintptr_t>(value)));
  }

  std::atomic<std::uint64_t> held_[words] = {};
  std::atomic<std::size_t> shared_next_{0};
  std::atomic<std::uint64_t> key_word_{key_absent};
};

inline constinit shard_index_registry shard_indexes{};

inline shard_index_registry& shard_index_registry::instance() noexcept { return shard_indexes; }

// Makes the key at load time (before main, while few keys exist) and deletes it when this code
// goes away.
struct shard_index_key_owner {
  shard_index_key_owner() noexcept { shard_indexes.prepare(); }
  ~shard_index_key_owner() { shard_indexes.retire(); }
};
inline const shard_index_key_owner shard_index_key{};

// This thread's index: taken on its first call, given back at thread exit. Lock-free and
// async-signal-safe (see the header comment).
inline std::size_t this_thread_shard_index() noexcept {
  const std::size_t word = shard_index_registry::this_thread_word().load(std::memory_order_relaxed);
  if (word != 0) [[likely]] return shard_index_registry::index_of(word);
  return shard_indexes.take_for_this_thread();
}

}  // namespace detail

/// Atomics: an Atomics policy (atomics.hpp; a Sync policy is one) for the shards' words. A
/// composition counts with its workers' policy, so that a schedule test's weak memory reaches
/// its snapshots (async_teardown::stats).
template <class Atomics = std_atomics>
class basic_sharded_counter {
 public:
  /// shards == 0 picks the number of hardware threads rounded up to a power of two (at least
  /// 1, at most 256). Any other value is clamped to [1, 256] and rounded up to a power of two.
  /// May throw std::bad_alloc.
  explicit basic_sharded_counter(std::size_t shards = 0)
      : mask_(std::bit_ceil(std::clamp<std::size_t>(
                  shards != 0 ? shards : std::thread::hardware_concurrency(), 1, 256)) - 1),
        shards_(std::make_unique<shard[]>(mask_ + 1)) {
    detail::shard_indexes.prepare();  // in case this runs before the load-time call
  }
  basic_sharded_counter(const basic_sharded_counter&) = delete;
  basic_sharded_counter& operator=(const basic_sharded_counter&) = delete;

  /// Lock-free and async-signal-safe, the thread's first add included; see the header
  /// comment. `order` is for callers that read several counters as
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
    typename Atomics::template atomic<std::uint64_t> value{0};
  };

  std::size_t mask_;
  std::unique_ptr<shard[]> shards_;
};

using sharded_counter = basic_sharded_counter<>;

}  // namespace teardown
