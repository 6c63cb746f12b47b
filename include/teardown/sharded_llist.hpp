// teardown/sharded_llist.hpp — llist with one head per producer thread, for many-core producers.
//
// Every add to an llist is a compare-and-swap on one cache line (792 ns per push at 16
// producers, measured). A sharded_llist keeps K llists, each head on its own line, and a thread
// always adds to the same one. It is a drop-in for llist as the queue of a consumer that sleeps
// and is woken on the empty -> non-empty transition: add, add_batch, del_all and empty have
// llist's signatures and meanings.
//
//     sharded_llist<job, &job::hook> queue;       // K = hardware threads, rounded up to 2^n
//     if (queue.add(j)) wake_consumer();          // true: the consumer needs a kick
//     for (job& j : queue.del_all_oldest_first()) run(j);  // every shard; oldest first per shard
//     queue.del_all_by_shard([](auto&& nodes) { for (job& j : nodes) run(j); });  // newest first
//
// Who may call what at the same time on one sharded_llist: everything with everything, no lock
// ("del_all" is every take: del_all, del_all_oldest_first, del_all_by_shard, del_all_sweep and
// del_all_sweep_oldest_first; each node goes to exactly one taker).
// - add, add_batch, add_to: lock-free (one llist add on the shard and, when the shard was empty,
//   a CAS loop on the summary word). A thread's first call takes its shard index (lock-free, no
//   allocation; counter.hpp). Async-signal-safe, as are del_all and empty (on std_atomics).
// - del_all: wait-free on std_atomics, at most K + 1 exchanges; then del_all walks the taken
//   shards to join them, del_all_oldest_first's one walk is the reversal, del_all_by_shard
//   walks nothing and hands each shard's batch to its visitor.
// - No del_first and no unsynchronized_*: a consumer that sleeps between batches needs neither.
//
// Shards: K is fixed at construction (shard_count()), a power of two. A thread adds to shard
// (its index & (K - 1)); the index is the lowest no live thread holds (counter.hpp's
// detail::this_thread_shard_index), so with at most K live threads adding, none share. More
// threads share: slower, never wrong. add_to(shard, element) picks the shard.
// Order: del_all gives shard 0 first, each shard newest first; del_all_oldest_first shard 0
// first, each shard oldest first; del_all_by_shard visits shard 0 first, each newest first.
// A thread's own adds keep their order; nodes of different shards have none.
//
// The kick (the summary word summary_: a bit per shard, set when the shard goes empty ->
// non-empty, cleared by a take BEFORE it exchanges the shards it read): for every node added
// there is an add that returned true (a kick) such that every del_all that begins after that
// kick has returned takes the node, or another del_all does. So a consumer that calls del_all
// after every kick it receives, and sleeps only when one comes back empty with no kick pending,
// never sleeps on a node. A del_all that reads the word as zero looks at every shard, so a
// del_all that comes back empty saw every shard empty, and a node whose adder stopped between
// its push and its flag (a fork child, a debugger) is not stranded. Spurious kicks happen.
//
// Memory ordering: as llist's. Everything a thread wrote to an element before add(element) (or
// before add_batch of a chain holding it) is visible to the thread that takes it with del_all:
// the shard's release CAS pairs with its acquire exchange. summary_ publishes nothing by itself;
// its release flag CAS and acquire clear only order the pushes before the exchanges that must
// see them. empty() is a relaxed snapshot of K heads, for heuristics and quiescent checks.
//
// Adding twice: as llist's. A node's on_list() is true from its add to any shard until a take
// yields it; adding a node still on a shard aborts. Destroying a sharded_llist that still holds
// nodes aborts with llist's message. Debug checks: those of llist, llist_batch and llist_chain.
// Design: docs/design.md, "sharded_llist: one head per producer thread".
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <thread>
#include <utility>

#include "teardown/atomics.hpp"
#include "teardown/counter.hpp"
#include "teardown/llist.hpp"

namespace teardown {

/// The list. See the header comment for who may call what, the order and the summary word.
template <class T, llist_node T::*Hook, class Atomics = std_atomics>
class sharded_llist {
 public:
  using batch = llist_batch<T, Hook>;
  using chain = llist_chain<T, Hook>;
  using atomics_type = Atomics;

  static constexpr std::size_t max_shards = 256;

  /// The number of hardware threads rounded up to a power of two, in [1, max_shards].
  static std::size_t default_shards() noexcept {
    const std::size_t hardware = std::thread::hardware_concurrency();  // 0: unknown
    return std::bit_ceil(std::clamp<std::size_t>(hardware, 1, max_shards));
  }

  /// `shards` is clamped to [1, max_shards] and rounded up to a power of two; 0 means
  /// default_shards(). May throw std::bad_alloc (the shards are one allocation).
  explicit sharded_llist(std::size_t shards = default_shards())
      : mask_(std::bit_ceil(std::clamp<std::size_t>(shards != 0 ? shards : default_shards(), 1,
                                                    max_shards)) -
              1),
        shards_(std::make_unique<shard[]>(mask_ + 1)) {
    detail::shard_indexes.prepare();  // the thread-exit key, in case this runs before load time's
  }
  sharded_llist(const sharded_llist&) = delete;
  sharded_llist& operator=(const sharded_llist&) = delete;
  ~sharded_llist() = default;  // each shard's llist checks that it holds nothing

  /// Thread-safe, lock-free and async-signal-safe (see the header comment). Adds to the calling
  /// thread's shard. Returns true iff the consumer needs a kick: the shard was empty and no add
  /// has claimed the kick since the last del_all began.
  bool add(T& element) noexcept { return add_to(this_thread_shard(), element); }

  /// Thread-safe and lock-free, as add(). Publishes the whole chain on the calling thread's
  /// shard with one successful CAS and leaves the chain empty. Same return as add(); an empty
  /// chain is a no-op returning false.
  bool add_batch(chain&& nodes) noexcept {
    const std::size_t index = this_thread_shard();
    return shards_[index].list.add_batch(std::move(nodes)) && flag(index);
  }

  /// add() onto shard `index` modulo shard_count() rather than the caller's own. Thread-safe
  /// and lock-free (no shard index is taken). Same return as add().
  bool add_to(std::size_t index, T& element) noexcept {
    index &= mask_;
    return shards_[index].list.add(element) && flag(index);
  }

  /// Thread-safe; wait-free on std_atomics (lock-free on ao_atomics, whose exchange is a CAS
  /// loop). Clears the summary word if it holds flags and takes every shard it flagged, or, if
  /// it held none, every shard that holds nodes; the batch yields shard 0's nodes newest first,
  /// then shard 1's, and so on. Joining the shards walks each taken shard's nodes but the last
  /// one's (see "Cost"): an oldest-first consumer should call del_all_oldest_first() instead of
  /// del_all().reverse(), a newest-first one del_all_by_shard().
  [[nodiscard]] batch del_all() noexcept {
    batch taken;
    // Last shard first: each shard's batch is walked once, to put the ones after it behind it.
    take_shards</*ascending=*/false>(/*sweep=*/false, [&](batch&& nodes) {
      nodes.append(std::move(taken));
      taken = std::move(nodes);
    });
    return taken;
  }

  /// The nodes del_all().reverse() would give, with the order that makes for a consumer that
  /// runs oldest first: shard 0's nodes oldest first, then shard 1's, and so on. One walk over
  /// the nodes taken (each shard's run reversed onto the front of the next shard's: the
  /// reversal ends on the run's first node, the link to the next run), where del_all().reverse()
  /// walks them twice. Thread-safe; the same take as del_all (wait-free on std_atomics).
  [[nodiscard]] batch del_all_oldest_first() noexcept {
    batch taken;
    take_shards</*ascending=*/false>(/*sweep=*/false,
                                     [&](batch&& nodes) { taken.prepend_reversed(std::move(nodes)); });
    return taken;
  }

  /// del_all() without the join: calls visit(batch&&) with each taken shard's nodes (newest
  /// first), shard 0 first, taking each shard just before its visit; no shard comes empty.
  /// The same take as del_all (the summary word is cleared before the first shard is taken).
  /// Allocation-free; O(flagged shards) plus the visits. visit must take every node out of the
  /// batch (range-for, pop_front, or a move into a batch of its own): the batch is destroyed
  /// when visit returns, and with the debug checks on a batch destroyed holding nodes aborts
  /// (with them off, those nodes are lost). visit must not throw (noexcept: a throw
  /// terminates, since the shards not yet taken have lost their flags). It may add to this
  /// list; whether such a node is taken in this call depends on which shard it lands on.
  template <class Visit>
  void del_all_by_shard(Visit&& visit) noexcept {
    take_shards</*ascending=*/true>(/*sweep=*/false, [&](batch&& nodes) { visit(std::move(nodes)); });
  }

  /// del_all() that takes every shard holding nodes, flagged or not: what a barrier needs. A
  /// plain del_all trusts the flags, and an adder preempted between its push and its flag
  /// leaves its shard unflagged while a second adder's node sits behind it; an add that
  /// happened before this call is taken by it (or by a take running beside it). Clears the
  /// summary word first, as del_all does. Thread-safe; K relaxed loads plus one exchange per
  /// non-empty shard, plus the join walk of del_all().
  [[nodiscard]] batch del_all_sweep() noexcept {
    batch taken;
    take_shards</*ascending=*/false>(/*sweep=*/true, [&](batch&& nodes) {
      nodes.append(std::move(taken));
      taken = std::move(nodes);
    });
    return taken;
  }

  /// del_all_sweep()'s take in del_all_oldest_first()'s order, with its one walk.
  [[nodiscard]] batch del_all_sweep_oldest_first() noexcept {
    batch taken;
    take_shards</*ascending=*/false>(/*sweep=*/true,
                                     [&](batch&& nodes) { taken.prepend_reversed(std::move(nodes)); });
    return taken;
  }

  /// Wait-free. A relaxed snapshot of every shard; see "Memory ordering" in the header comment.
  bool empty() const noexcept {
    for (std::size_t i = 0; i <= mask_; ++i) {
      if (!shards_[i].list.empty()) return false;
    }
    return true;
  }

  std::size_t shard_count() const noexcept { return mask_ + 1; }

  /// The shard add() and add_batch() use on the calling thread: the same on every call.
  /// Lock-free and async-signal-safe, the thread's first call included (counter.hpp).
  std::size_t this_thread_shard() const noexcept {
    return detail::this_thread_shard_index() & mask_;
  }

 private:
  // Wide enough for a bit per shard on 64-bit targets, and an AO_t on ao_atomics.
  using word = std::uintptr_t;
  static constexpr std::size_t word_bits = std::numeric_limits<word>::digits;

  // After an add that made shard `index` non-empty: sets its bit; true if this add must kick.
  bool flag(std::size_t index) noexcept {
    const word bit = word{1} << (index % word_bits);
    // A CAS even when the bit is already set (writing the same value): a plain load could read
    // a value older than a concurrent clear, whose del_all may then miss our push (see "The
    // summary word"). The first try expects zero, the word's value whenever this add must kick,
    // so that case costs one CAS and no load.
    word seen = 0;
    // release: pairs with the acquire clear in del_all (directly, or through the later RMWs of
    // this release sequence); it orders our shard push before the taker's shard exchange.
    // Failure is relaxed: we only retry with the fresh value.
    while (!summary_.compare_exchange_weak(seen, seen | bit, std::memory_order_release,
                                           std::memory_order_relaxed)) {
    }
    return seen == 0;
  }

  // The take every del_all variant shares: clears the summary word (if it holds flags) and
  // calls each(batch&&) with every taken shard's nodes, skipping shards that come empty; shard
  // 0 first if Ascending, else last shard first (the order of the exchanges does not matter to
  // "The summary word": each comes after the clear). sweep: every non-empty shard, flags aside.
  template <bool Ascending, class Each>
  void take_shards(bool sweep, Each&& each) noexcept {
    // Clear before taking, and with an RMW (see "The summary word"), but only a word that has
    // flags: a polling consumer then reads lines no producer wrote, and takes none of them
    // away from their producers. Relaxed: a zero read orders nothing (see "Nodes behind a flag
    // not yet set"). The exchange is acquire: it pairs with the release CAS in flag(); a
    // producer whose flag precedes this clear in summary_'s order pushed before it, and the
    // shard exchanges below see that push.
    word flagged = summary_.load(std::memory_order_relaxed);
    if (flagged != 0) flagged = summary_.exchange(0, std::memory_order_acquire);
    const std::size_t count = mask_ + 1;
    if (flagged == 0 || sweep) {
      // Nodes whose adder has not flagged yet (see "Nodes behind a flag not yet set"), or every
      // shard for a sweep.
      for (std::size_t k = 0; k < count; ++k) {
        const std::size_t i = Ascending ? k : count - 1 - k;
        if (!shards_[i].list.empty()) take(i, each);
      }
      return;
    }
    // With more shards than bits, bit b stands for shards b, b + 64, ...: one group of
    // word_bits shards at a time, lowest bit first (Ascending) or highest first.
    const std::size_t group = std::min(count, word_bits);
    for (std::size_t g = 0; g < count / group; ++g) {
      const std::size_t base = Ascending ? g * group : count - group - g * group;
      for (word bits = flagged; bits != 0;) {
        const std::size_t bit = Ascending
                                    ? static_cast<std::size_t>(std::countr_zero(bits))
                                    : word_bits - 1 - static_cast<std::size_t>(std::countl_zero(bits));
        bits &= ~(word{1} << bit);
        take(base + bit, each);
      }
    }
  }

  template <class Each>
  void take(std::size_t i, Each& each) noexcept {
    batch nodes = shards_[i].list.del_all();
    if (!nodes.empty()) each(std::move(nodes));
  }

  struct alignas(64) shard {
    llist<T, Hook, Atomics> list;
  };

  // Read by every add, written only by the constructor: on a line that no add writes.
  std::size_t mask_;  // shard_count() - 1
  std::unique_ptr<shard[]> shards_;

  // Bit i % word_bits set: shard i went empty -> non-empty since the last clear (initially
  // none). Zero: the next add that finds its shard empty kicks. Written only by
  // read-modify-writes (see "The summary word"). Its own line, away from mask_ and shards_,
  // which every add reads.
  alignas(64) typename Atomics::template atomic<word> summary_{0};
};

}  // namespace teardown
