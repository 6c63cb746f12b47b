// teardown/sharded_llist.hpp — llist with one head per producer thread, for many-core producers.
//
// Every add to an llist is a compare-and-swap on one cache line; with many producers that line
// is what they all wait for (792 ns per push at 16 producers, measured). A sharded_llist keeps
// K llists, each head on a cache line of its own, and a thread always adds to the same one, so
// producers on different shards never write the same line. It is a drop-in for llist as the
// queue of a consumer that sleeps and is woken on the empty -> non-empty transition: add,
// add_batch, del_all and empty have llist's signatures and meanings.
//
//     sharded_llist<job, &job::hook> queue;       // K = hardware threads, rounded up to 2^n
//     if (queue.add(j)) wake_consumer();          // true: the consumer needs a kick
//     for (job& j : queue.del_all().reverse()) run(j);   // every shard; oldest first per shard
//
// Who may call what at the same time on one sharded_llist ("-": no lock needed):
//
//                             add / add_batch / add_to   del_all   empty
//     add / add_batch / add_to           -                  -        -
//     del_all                            -                  -        -
//     empty                              -                  -        -
//
// - add, add_batch and add_to race with anything. Lock-free: one llist add on the shard, and
//   at most one exchange on a shared word (see "Was-empty signal"). A thread's first call of
//   any of teardown's sharded structures (this one or sharded_counter) also takes the thread's
//   shard index: lock-free too, with no allocation (counter.hpp). Async-signal-safe, the first
//   call included, as are del_all and empty (on std_atomics; see llist.hpp).
// - del_all races with adds and with other del_all callers; each node goes to exactly one of
//   them. Wait-free on std_atomics: K + 1 exchanges and a walk over the nodes it takes (below).
// - There is no del_first: popping one node would have to pick a shard, would carry llist's
//   single-consumer rule (the ABA note in llist.hpp) on that shard, and would need a rule for
//   re-arming the was-empty signal when a consumer empties the list one node at a time. A
//   consumer that sleeps between batches does not need it. No unsynchronized_* either.
//
// Shards: K is fixed at construction (shard_count()), a power of two so that picking the shard
// is a mask. A thread adds to shard (its index & (K - 1)), the index it got on its first call
// (counter.hpp's detail::this_thread_shard_index: the lowest index no live thread holds, given
// back when the thread exits; with more than 4096 live threads, shared). Not sched_getcpu(): a thread migrates between reading its CPU
// and adding, so a CPU index would not stay with the thread. With at most K live threads
// adding, no two share a shard, however threads come and go (a round-robin counter would pair
// them up after thread churn). More threads than shards share: that costs speed, never
// correctness. add_to(shard, element) adds to a shard of the caller's choosing.
//
// Order: del_all concatenates the shards, shard 0 first, each newest first; reverse() makes
// each shard oldest first. A thread adds to one shard, so its own adds keep their order; there
// is no order between nodes of different shards. Joining the shards walks each taken shard's
// nodes but the last shard's to find its end: O(n) in the nodes taken, which a consumer then
// walks anyway (the walk brings their lines to its cache).
//
// Was-empty signal. llist::add returns true when the list was empty, and that adder kicks the
// consumer. Here a shard going empty -> non-empty is not enough (the consumer may be awake,
// busy with another shard's nodes, or asleep with every shard empty), and reading all K heads
// on every add would bring back the shared line. Instead one word, armed_, says "the consumer
// side has started taking everything: the next producer to find its shard empty must kick".
// - add: push to the shard (llist's release CAS). If the shard was non-empty, return false. If
//   it was empty, return armed_.exchange(false): true for the first such add since the last
//   re-arm, which kicks.
// - del_all: FIRST armed_.exchange(true) (re-arm), THEN exchange every shard's head.
// Every write to armed_ is a read-modify-write, so they fall in one modification order and each
// reads the value just before it. Call an add that returns true a kick. The guarantee: for every
// node added there is a kick (the node's own add, or an earlier or still-running one) such that
// every del_all that begins after that kick has returned takes the node, or finds it already
// taken by another del_all. So a consumer that calls del_all after every kick it receives, and
// sleeps only when one comes back empty with no kick pending, never sleeps on a node.
// Why: let add(x) push x onto shard s, and let z be the node whose push made s non-empty most
// recently before x's (z = x if x found s empty). No take of s falls between z's push and x's
// in s's order, so the first take of s after z's push takes x. z's adder exchanges armed_ (it
// may not have yet: its add is still running, and until it does, nodes behind z wait, as nodes
// behind an llist adder that has not kicked yet do). If that exchange E read true, E is the
// kick. If it read false, walk back through armed_'s order: before E come only producer
// exchanges back to the last re-arm (or the initial true), and the first of them, F, read true
// and kicked. No re-arm lies between F and E. A del_all D that begins after F returned re-arms
// at R, after F (F happens before R), hence after E. E is a release and R an acquire, and everything between
// them on armed_ is an RMW (E's release sequence), so E synchronizes with R: z's push happens
// before D's exchange of s, which therefore comes after z's push in s's order and takes x unless
// an earlier take after z's push did. Had D re-armed with a plain store, or had the producer
// skipped the exchange on reading false, D's store and the producer's load could each miss the
// other's write (store buffering), and x would sit unseen behind a sleeping consumer.
// Spurious kicks can happen (an add between a re-arm and that del_all's exchange of its shard
// kicks though del_all takes its node); they cost the consumer one empty del_all.
//
// Cost. A producer writes its own shard's line on every add, and the shared armed_ line only
// when its shard went empty -> non-empty: at most once per shard per taking of that shard,
// i.e. per consumer pass. So sharding pays when shards stay non-empty between passes (a
// consumer busy with a batch, bursts of adds); if the consumer drains every shard after each
// add, each add costs two RMWs, one of them on armed_, which then is as contended as an llist
// head. del_all costs one RMW on armed_ and K exchanges, each a line transfer if its shard was
// written since the last pass, plus the walk above. empty() is K relaxed loads.
//
// Memory ordering: as llist's. Everything a thread wrote to an element before add(element) (or
// before add_batch of a chain holding it) is visible to the thread that takes it with del_all:
// the shard's release CAS pairs with its acquire exchange. armed_ publishes nothing by itself;
// its release/acquire pair only orders the pushes before the exchanges that must see them (the
// argument above). Neither side needs the other half of acq_rel: a producer reads nothing the
// consumer wrote, and a kick carries its own ordering to the consumer. empty() is a relaxed snapshot of K heads read one after another, for
// heuristics and quiescent checks, like llist::empty().
//
// Adding twice: as llist's (see llist.hpp). A node's on_list() is true from its add to any
// shard until the batch from del_all yields it; adding a node still on a shard aborts.
// Debug checks: those of llist, llist_batch and llist_chain (see llist.hpp). Destroying a
// sharded_llist that still holds nodes aborts with llist's message, from the shard that has them.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <memory>
#include <thread>
#include <utility>

#include "teardown/atomics.hpp"
#include "teardown/counter.hpp"
#include "teardown/llist.hpp"

namespace teardown {

/// The list. See the header comment for who may call what, the order and the was-empty signal.
template <class T, llist_node T::*Hook, class Atomics = std_atomics>
class sharded_llist {
 public:
  using batch = llist_batch<T, Hook>;
  using chain = llist_chain<T, Hook>;

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
  /// thread's shard. Returns true iff the consumer needs a kick: the shard was
  /// empty and no add has claimed the kick since the last del_all began.
  bool add(T& element) noexcept { return add_to(this_thread_shard(), element); }

  /// Thread-safe and lock-free, as add(). Publishes the whole chain on the calling thread's
  /// shard with one successful CAS and leaves the chain empty. Same return as add(); an empty
  /// chain is a no-op returning false.
  bool add_batch(chain&& nodes) noexcept {
    return shards_[this_thread_shard()].list.add_batch(std::move(nodes)) && claim_kick();
  }

  /// add() onto shard `index` modulo shard_count() rather than the caller's own. Thread-safe
  /// and lock-free (no shard index is taken). Same return as add().
  bool add_to(std::size_t index, T& element) noexcept {
    return shards_[index & mask_].list.add(element) && claim_kick();
  }

  /// Thread-safe; wait-free on std_atomics (lock-free on ao_atomics, whose exchange is a CAS
  /// loop). Re-arms the was-empty signal, then takes every shard; the batch yields shard 0's
  /// nodes newest first, then shard 1's, and so on. O(nodes taken) to join the shards.
  [[nodiscard]] batch del_all() noexcept {
    // Re-arm before taking, and with an RMW (see "Was-empty signal"). acquire: pairs with the
    // release exchange in claim_kick(); a producer whose exchange precedes this one in armed_'s
    // order pushed before it, and the shard exchanges below see that push.
    (void)armed_.exchange(true, std::memory_order_acquire);
    batch taken;
    // Last shard first: each shard's batch is walked once, to put the ones after it behind it.
    for (std::size_t i = mask_ + 1; i-- > 0;) {
      batch nodes = shards_[i].list.del_all();
      if (nodes.empty()) continue;
      nodes.append(std::move(taken));
      taken = std::move(nodes);
    }
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
  // After an add that made its shard non-empty: true if this add must kick the consumer.
  bool claim_kick() noexcept {
    // An exchange even when armed_ already reads false: a plain load could read a value older
    // than a concurrent re-arm, whose del_all may then miss our push (see "Was-empty signal").
    // release: pairs with the acquire re-arm in del_all (directly, or through the later RMWs of
    // this release sequence); it orders our shard push before the taker's shard exchange.
    return armed_.exchange(false, std::memory_order_release);
  }

  struct alignas(64) shard {
    llist<T, Hook, Atomics> list;
  };

  // Read by every add, written only by the constructor: on a line that no add writes.
  std::size_t mask_;  // shard_count() - 1
  std::unique_ptr<shard[]> shards_;

  // true: a del_all has begun since the last kick (initially: no kick yet); the next add that
  // finds its shard empty kicks. Written only by read-modify-writes (see "Was-empty signal").
  // Its own line, away from mask_ and shards_, which every add reads.
  alignas(64) typename Atomics::template atomic<bool> armed_{true};
};

}  // namespace teardown
