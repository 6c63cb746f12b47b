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
//     for (job& j : queue.del_all_oldest_first()) run(j);  // every shard; oldest first per shard
//     queue.del_all_by_shard([](auto&& nodes) { for (job& j : nodes) run(j); });  // newest first
//
// Who may call what at the same time on one sharded_llist ("-": no lock needed; "del_all" is
// every take: del_all, del_all_oldest_first, del_all_by_shard, del_all_sweep and
// del_all_sweep_oldest_first):
//
//                             add / add_batch / add_to   del_all   empty
//     add / add_batch / add_to           -                  -        -
//     del_all                            -                  -        -
//     empty                              -                  -        -
//
// - add, add_batch and add_to race with anything. Lock-free: one llist add on the shard and, when
//   the shard was empty, one compare-and-swap loop on the shared summary word (see "The summary
//   word"), which retries only when another thread changed that word in between. A thread's
//   first call of any of teardown's sharded structures (this one or sharded_counter) also takes
//   the thread's shard index: lock-free too, with no allocation (counter.hpp). Async-signal-safe,
//   the first call included, as are del_all and empty (on std_atomics; see llist.hpp).
// - del_all races with adds and with other del_all callers; each node goes to exactly one of
//   them. Wait-free on std_atomics: a load of the summary word and, if it holds flags, one
//   exchange of it and one exchange per flagged shard; if it holds none, a relaxed load of
//   every shard and one exchange per shard found non-empty (at most K + 1 exchanges). Then
//   del_all walks the nodes it takes to join the shards (see "Order"); del_all_oldest_first's
//   one walk is the reversal an oldest-first consumer needs anyway, and del_all_by_shard walks
//   nothing but hands each shard's batch to its visitor. Every take variant is the same take.
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
// Order: del_all concatenates the shards it takes, shard 0 first, each newest first; reverse()
// makes each shard oldest first (and the shards last first). del_all_oldest_first gives shard 0
// first, each shard oldest first (del_all().reverse() per shard, the shards in del_all's order);
// del_all_by_shard visits shard 0's batch first, each newest first. A thread adds to one shard,
// so its own adds keep their order; there is no order between nodes of different shards.
// Joining: a batch is a singly linked run that knows only its first node, so del_all's join
// walks each taken shard's nodes but the last shard's to find its end: one more pass over the
// nodes a consumer then walks anyway, which costs a cache miss per node when the nodes are
// scattered in memory (recycled in random order, as in real programs). del_all_oldest_first
// has no join walk: it reverses each taken shard's run onto the front of the runs already
// taken (last shard first), and the reversal ends on the run's first node, which is the link;
// so an oldest-first take costs one walk, as llist's del_all().reverse() does.
// del_all_by_shard joins nothing.
//
// The summary word. One word, summary_, holds a bit per shard (shard i has bit i mod 64; with
// more than 64 shards a bit stands for every shard of its residue). A set bit says "this shard
// went empty -> non-empty since the last del_all cleared the word". It serves two ends: del_all
// visits only flagged shards instead of all K (a take at low producer counts touches two lines,
// not K + 1), and the word's being zero is the was-empty signal's "armed" state.
// - add: push to the shard (llist's release CAS). If the shard was non-empty, return false. If
//   it was empty, set the shard's bit with a CAS loop (release) and return whether the word was
//   zero just before: true for the first flag since the last clear, and that add kicks.
// - del_all: load the word (relaxed). If it holds flags: FIRST summary_.exchange(0) (acquire;
//   clear and read the flags), THEN exchange every shard whose bit that read. If the load (or
//   the exchange) read zero, it takes no shard by flag; instead it loads every head (relaxed)
//   and exchanges each non-empty one (see "Nodes behind a flag not yet set"). A poll of an idle
//   list thus writes nothing: it leaves every line with its producer.
// llist::add returns true when the list was empty; here a shard going empty -> non-empty is not
// enough (the consumer may be awake, busy with another shard's nodes, or asleep with every shard
// empty), and reading all K heads on every add would bring back the shared line.
// Every write to summary_ is a read-modify-write, so they fall in one modification order and each
// reads the value just before it. Call an add that returns true a kick. The guarantee: for every
// node added there is a kick (the node's own add, or an earlier or still-running one) such that
// every del_all that begins after that kick has returned takes the node, or another del_all
// (earlier, or running beside it) does. So a consumer that calls del_all after every kick it
// receives, and sleeps only when one comes back empty with no kick pending, never sleeps on a
// node.
// Why: let add(x) push x onto shard s, and let z be the node whose push made s non-empty most
// recently before x's (z = x if x found s empty). No take of s falls between z's push and x's in
// s's order, so the first take of s after z's push takes x. z's adder then flags s with a CAS E
// (it may not have yet: its add is still running, and until it does, nodes behind z wait for a
// del_all that finds the word zero, as nodes behind an llist adder that has not kicked yet wait).
// If E read zero, E is the kick. If not, walk back through summary_'s order: before E come only
// producer flags back to the last clear (or the initial zero), and the first of them, F, read
// zero and kicked. No clear lies between F and E. A del_all D that begins after F returned reads
// the word after F (F happens before its load, which therefore reads F's value or a later one).
// If D read flags, it clears at R, after F, hence after E; if it read zero, that zero is later
// than F's value, so a clear lies after F, hence after E. Either way a clear follows E. The
// first clear after E reads s's bit (only a clear removes a bit), and its del_all (D, or one
// running beside or before it) exchanges s. E is a release and
// the clear an acquire, and everything between them on summary_ is an RMW (E's release
// sequence), so E synchronizes with the clear: z's push happens before that del_all's exchange
// of s, which therefore comes after z's push in s's order and takes x unless an earlier take
// after z's push did.
// "del_all" here is any take variant (all share one take): the argument uses only that a take
// clears before it exchanges the shards it read, never the order of those exchanges, nor how
// long after the clear they come (del_all_by_shard runs a visit between two of them).
// The races this rules out, each of which loses a node: a del_all that clears after taking the
// shards (a push between its take of s and its clear is flagged, then the flag is wiped: nothing
// visits s until the list happens to go quiet); an adder that flags before it pushes (a del_all
// between the flag and the push clears the flag, finds s empty, and the push comes with no flag
// and no kick); and a clear by plain store, or a producer that skips its CAS because it reads
// its bit set, where each side could miss the other's write (store buffering).
// Spurious kicks and visits happen (an add between a clear and that del_all's exchange of its
// shard kicks and flags though del_all takes its node): they cost one empty del_all, or one
// exchange of an empty shard.
//
// Nodes behind a flag not yet set. Between an adder's push and its flag, its shard is non-empty
// but unflagged. A del_all that reads the word as zero therefore looks at every shard (a relaxed
// load each, which costs nothing on a shard no producer wrote since the last take) and takes
// those that hold nodes. So a del_all that comes back empty saw every shard empty, one by one;
// a consumer that drains until del_all comes back empty takes every node whose add has
// returned; and a node whose adder stopped for good between the two steps (a thread of the
// parent in a fork child, a thread stopped in a debugger) is not stranded. Taking such a shard
// early only makes its adder's flag a spurious one.
//
// Cost. A producer writes its own shard's line on every add, and the shared summary line only
// when its shard went empty -> non-empty: at most once per shard per taking of that shard, i.e.
// per consumer pass. So sharding pays when shards stay non-empty between passes (a consumer busy
// with a batch, bursts of adds); if the consumer drains every shard after each add, each add
// costs two RMWs, one of them on the summary word, which then is as contended as an llist head.
// A take costs a load and an RMW of the summary word and one exchange per flagged shard (each a
// line transfer: a producer wrote it), or 1 + K relaxed loads and no write when nothing is
// flagged (lines the consumer already holds, unless a producer wrote them); then del_all walks
// the nodes of every taken shard but the last (the join above), del_all_oldest_first walks
// every node once (the reversal), and del_all_by_shard walks none (O(flagged shards) plus the
// visits). empty() is K relaxed loads.
//
// Memory ordering: as llist's. Everything a thread wrote to an element before add(element) (or
// before add_batch of a chain holding it) is visible to the thread that takes it with del_all:
// the shard's release CAS pairs with its acquire exchange. summary_ publishes nothing by itself;
// its release/acquire pair only orders the pushes before the exchanges that must see them (the
// argument above). Neither side needs the other half of acq_rel: a producer reads nothing the
// consumer wrote, and a kick carries its own ordering to the consumer. empty() is a relaxed
// snapshot of K heads read one after another, for heuristics and quiescent checks, like
// llist::empty().
//
// Adding twice: as llist's (see llist.hpp). A node's on_list() is true from its add to any
// shard until the batch from del_all yields it; adding a node still on a shard aborts.
// Debug checks: those of llist, llist_batch and llist_chain (see llist.hpp). Destroying a
// sharded_llist that still holds nodes aborts with llist's message, from the shard that has them.
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
