// llist_bench — producer scaling of teardown::llist against its peers and the physical limit.
//
// Every case runs the same scenario: N producer threads (the benchmark's threads, 1 up to the
// hardware thread count) each push nodes as fast as they can, and ONE consumer thread takes
// everything in a loop (llist::del_all, or the peer's pop-all) and hands the nodes back. One
// iteration is one push; the reported time is wall time per push over all producers together
// (real time / total pushes, so 1e9 / items_per_second), and that is what the ratios compare.
// At the top producer count the consumer is one thread more than the hardware has: that is the
// intended load (a producer per hardware thread, plus the worker that drains them).
// Each case runs for at least 0.2 s unless --benchmark_min_time says otherwise. After the
// console table, the binary prints every case's time per push and its ratio to limit/fetch_add
// at the same producer count (medians when repeated), and sharded_llist/std's time per push
// divided by llist/std's at the highest producer count.
//
//   llist/std                 teardown::llist<..., std_atomics>: add / del_all
//   llist/ao                  teardown::llist<..., ao_atomics>: add / del_all (libatomic_ops)
//   sharded_llist/std         teardown::sharded_llist<..., std_atomics>, default shard count (the
//                             hardware threads): add to the producer's own shard / del_all of
//                             every shard. Up to the hardware thread count, no two producers
//                             share a shard, so each push writes a line no other producer does
//                             (plus the shared was-empty word when its shard was empty).
//                             limit/fetch_add is the floor for one shared line only: this case
//                             may go below it.
//   limit/fetch_add           one atomic<uint64_t> on its own cache line: producers fetch_add(1),
//                             the consumer exchange(0)s it. No push can beat one contended RMW on
//                             one line, so this is the floor the others are divided by.
//   peer/boost_lockfree_stack boost::lockfree::stack<node*>: bounded_push / consume_all_atomic
//   peer/ck_stack_upmc        Concurrency Kit: ck_stack_push_upmc / ck_stack_batch_pop_upmc
//   peer/urcu_lfs             liburcu: cds_lfs_push / __cds_lfs_pop_all
//   peer/mutex_vector         std::mutex + std::vector<node*>: push_back / swap under the lock
//
// Nodes: each producer owns a pool (a ring of kPoolNodes nodes, allocated before timing starts),
// so nothing is allocated in the timed loop. A node carries an in_flight flag: the producer sets
// it before pushing, the consumer clears it (release) once it has read the node for the last
// time, and the producer reuses the node only after seeing it clear (acquire). If the consumer
// falls a whole pool behind, the producer yields until it catches up: that wait is part of the
// measured push, the same for every case. The consumer yields when a take comes back empty.
// limit/fetch_add has no nodes.
//
// The consumer-bound case (consumer_bound/<case>/producers:P, for llist/std, sharded_llist/std
// and sharded_llist/std with 16 shards) turns this around: the benchmark's one thread is the
// consumer, taking in a loop without yielding, and P more threads push from their pools as fast
// as it hands nodes back. One iteration is one take; items/s counts the nodes the consumer
// took, and the summary prints each case's items/s and its ratio to llist/std's at the same P.
// It measures what a take costs the consumer: sharded_llist takes only the shards its summary
// word flags, where a single head takes one line.
//
// The random-order consumer-bound case (consumer_bound/random/<list>/<take>/producers:P, P = 1, 2,
// 16, 64): the same loop, but each producer's pool walks a fixed random permutation of its nodes
// (seeded; the seed is in the JSON context) instead of the ring, and the pools hold
// kRandomTotalNodes nodes together (32 MiB), far more than the L2 and the L3 of the machines we
// run on: every node the consumer reads is a cache miss, as when real programs recycle their
// objects in any order. So each pass over the taken nodes costs what it costs in a program, and
// a take that walks them once more (sharded_llist's del_all joining its shards) shows. <take>:
// newest_first (llist: del_all(); sharded_llist: del_all_by_shard, which joins nothing) and
// oldest_first as a reaper takes (llist: del_all().reverse(); sharded_llist:
// del_all_oldest_first(), one walk). Where the library lacks those (an older build compared
// before/after) the sharded cases fall back to del_all() and del_all().reverse(). At 1 and 2
// producers the sharded_llist has the default shard count and each producer adds to its own
// shard; at 16 and 64 it has 64 shards and producer p adds with add_to(p). The summary prints
// items/s, the ratio to llist's with the same take at the same P, and ns per node; the counter
// nodes_per_take says whether the consumer found work (near 1: it polled an empty list). One
// iteration is one take that found nodes (the empty ones before it included), after a warm-up
// of two pools' worth of nodes, since the batch size settles only once the pools went round.
//
// Peers whose package CMake did not find are compiled out (TEARDOWN_BENCH_HAVE_BOOST, _CK,
// _URCU) and named on stderr and in the JSON context as skipped.
#include <benchmark/benchmark.h>

#include <unistd.h>

#include <algorithm>
#include <concepts>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "bench_support.hpp"
#include "teardown/llist.hpp"
#include "teardown/sharded_llist.hpp"

#ifndef TEARDOWN_BENCH_HAVE_BOOST
#define TEARDOWN_BENCH_HAVE_BOOST 0
#endif
#ifndef TEARDOWN_BENCH_HAVE_CK
#define TEARDOWN_BENCH_HAVE_CK 0
#endif
#ifndef TEARDOWN_BENCH_HAVE_URCU
#define TEARDOWN_BENCH_HAVE_URCU 0
#endif

#if TEARDOWN_BENCH_HAVE_BOOST
#include <boost/lockfree/stack.hpp>
#endif
#if TEARDOWN_BENCH_HAVE_CK
// ck_stack.h is C: two of its inline functions assign ck_pr_fas_ptr's void* to an entry
// pointer, which C++ rejects. Its CK_F_* guards let us supply those two ourselves; the one we
// use is CK 0.7.1's ck_stack_batch_pop_upmc with the cast added (declared first: the header's
// mpmc variant calls it), the other we never call.
#define CK_F_STACK_BATCH_POP_UPMC
#define CK_F_STACK_PUSH_MPNC
struct ck_stack;
struct ck_stack_entry;
static inline ck_stack_entry* ck_stack_batch_pop_upmc(ck_stack* target);
#include <ck_stack.h>
static inline ck_stack_entry* ck_stack_batch_pop_upmc(ck_stack* target) {
  auto* entry = static_cast<ck_stack_entry*>(ck_pr_fas_ptr(&target->head, nullptr));
  ck_pr_fence_load();
  return entry;
}
#endif
#if TEARDOWN_BENCH_HAVE_URCU
// urcu is measured through its inline (LGPL) functions (_cds_lfs_push, ___cds_lfs_pop_all), as
// teardown and ck are, not through a library call per push. urcu 0.13's static header does not
// compile as C++: its _blocking helpers pass a cds_lfs_stack* where C's transparent union
// converts it. The two overloads below, declared before that header, do the conversion; we never
// call the _blocking helpers.
#include <urcu/lfstack.h>
static inline cds_lfs_node* ___cds_lfs_pop(cds_lfs_stack* s);
static inline cds_lfs_head* ___cds_lfs_pop_all(cds_lfs_stack* s);
#include <urcu/static/lfstack.h>
static inline cds_lfs_node* ___cds_lfs_pop(cds_lfs_stack* s) {
  cds_lfs_stack_ptr_t stack;
  stack.s = s;
  return ___cds_lfs_pop(stack);
}
static inline cds_lfs_head* ___cds_lfs_pop_all(cds_lfs_stack* s) {
  cds_lfs_stack_ptr_t stack;
  stack.s = s;
  return ___cds_lfs_pop_all(stack);
}
#endif

namespace {

// Per producer. 16384 nodes of 64 bytes = 1 MiB, small enough to stay in L2/L3; at a few ns per
// push that is on the order of 100 us of pushing before a descheduled consumer stalls a producer.
constexpr std::size_t kPoolNodes = std::size_t{1} << 14;
constexpr double kMinTimeSeconds = 0.2;

// One cache line per node, so that a producer writing one node never shares a line with the
// consumer reading its neighbour. The hooks of every case live side by side; each case uses one.
struct alignas(64) bench_node {
  teardown::llist_node hook;
#if TEARDOWN_BENCH_HAVE_CK
  ck_stack_entry_t ck_entry{};
#endif
#if TEARDOWN_BENCH_HAVE_URCU
  cds_lfs_node urcu_entry{};
#endif
  // true from the producer's push until the consumer is done with the node.
  std::atomic<bool> in_flight{false};
};

// The consumer is done with n: the producer may rewrite it.
void hand_back(bench_node& n) noexcept {
  // release: pairs with the acquire in node_pool::take; the consumer's reads of n (its links)
  // happen before the producer's next writes to it.
  n.in_flight.store(false, std::memory_order_release);
}

template <class Member>
bench_node& owner_of(Member* member, std::size_t offset) noexcept {
  return *reinterpret_cast<bench_node*>(reinterpret_cast<unsigned char*>(member) - offset);
}

class alignas(64) node_pool {
 public:
  node_pool() : nodes_(new bench_node[kPoolNodes]) {}

  // The next node of the ring, once the consumer has handed it back.
  bench_node& take() noexcept {
    bench_node& n = nodes_[next_];
    next_ = (next_ + 1) & (kPoolNodes - 1);
    // acquire: pairs with the release in hand_back().
    while (n.in_flight.load(std::memory_order_acquire)) std::this_thread::yield();
    // relaxed: the node is private until the push, whose release publishes this store.
    n.in_flight.store(true, std::memory_order_relaxed);
    return n;
  }

  // take(), or nullptr once `stop` is set while the node is still out (the consumer-bound case
  // stops its consumer first, so a producer waiting for a node must not wait for ever).
  bench_node* take_unless(const std::atomic<bool>& stop) noexcept {
    bench_node& n = nodes_[next_];
    // acquire: pairs with the release in hand_back().
    while (n.in_flight.load(std::memory_order_acquire)) {
      if (stop.load(std::memory_order_relaxed)) return nullptr;
      std::this_thread::yield();
    }
    next_ = (next_ + 1) & (kPoolNodes - 1);
    // relaxed: as in take().
    n.in_flight.store(true, std::memory_order_relaxed);
    return &n;
  }

 private:
  std::unique_ptr<bench_node[]> nodes_;
  std::size_t next_ = 0;
};

// ---- The cases. Each has push(node) (or push() for the limit) and take_all(), which takes
// ---- everything, hands every node back, and returns whether it found anything.

// A list with add() and del_all(): llist, or sharded_llist, on which each producer thread adds
// to its own shard.
template <class List>
struct alignas(64) intrusive_list_case {
  static constexpr bool uses_nodes = true;
  explicit intrusive_list_case(std::size_t /*capacity*/) {}

  // A sharded_llist of `shards` shards.
  explicit intrusive_list_case(std::size_t /*capacity*/, std::size_t shards) : list(shards) {}

  void push(bench_node& n) noexcept { (void)list.add(n); }
  bool take_all() noexcept {
    auto batch = list.del_all();
    if (batch.empty()) return false;
    // The batch unlinks each node before yielding it, so it may be handed back at once.
    for (bench_node& n : batch) hand_back(n);
    return true;
  }
  // take_all() for the consumer-bound case: the number of nodes taken.
  std::size_t take_counted() noexcept {
    std::size_t taken = 0;
    for (bench_node& n : list.del_all()) {
      hand_back(n);
      ++taken;
    }
    return taken;
  }

  List list;
};

template <class Atomics>
using llist_case = intrusive_list_case<teardown::llist<bench_node, &bench_node::hook, Atomics>>;

template <class Atomics>
using sharded_llist_case = intrusive_list_case<teardown::sharded_llist<bench_node, &bench_node::hook, Atomics>>;

struct alignas(64) fetch_add_limit {
  static constexpr bool uses_nodes = false;
  explicit fetch_add_limit(std::size_t /*capacity*/) {}

  // The orders a queue needs (release push, acquire take); on x86 every RMW is a full barrier
  // anyway, so this is the bare cost of one contended lock-prefixed instruction.
  void push() noexcept { counter.fetch_add(1, std::memory_order_release); }
  bool take_all() noexcept { return counter.exchange(0, std::memory_order_acquire) != 0; }

  std::atomic<std::uint64_t> counter{0};
};

#if TEARDOWN_BENCH_HAVE_BOOST
// Boost's stack is not intrusive: each push takes an internal node from the stack's freelist
// (a second CAS, on a line the consumer also writes when it frees nodes). The freelist is sized
// up front and bounded_push never allocates; failing to push would be a bug in this harness.
struct alignas(64) boost_case {
  static constexpr bool uses_nodes = true;
  // + a few: consume_all_atomic frees its internal node only after the functor has handed the
  // element back, so a producer can push that element again before the internal node is free.
  explicit boost_case(std::size_t capacity) : stack(capacity + 64) {}

  void push(bench_node& n) noexcept {
    if (!stack.bounded_push(&n)) {
      std::fputs("llist_bench: boost::lockfree::stack freelist exhausted\n", stderr);
      std::abort();
    }
  }
  bool take_all() noexcept {
    return stack.consume_all_atomic([](bench_node* n) { hand_back(*n); }) != 0;
  }

  boost::lockfree::stack<bench_node*> stack;
};
#endif

#if TEARDOWN_BENCH_HAVE_CK
// ck_stack "upmc": unique producers (no node pushed twice at once), multiple consumers. Push is
// a load + CAS loop; batch_pop is one fetch-and-store, like del_all.
struct alignas(64) ck_case {
  static constexpr bool uses_nodes = true;
  explicit ck_case(std::size_t /*capacity*/) {}

  void push(bench_node& n) noexcept { ck_stack_push_upmc(&stack, &n.ck_entry); }
  bool take_all() noexcept {
    ck_stack_entry_t* entry = ck_stack_batch_pop_upmc(&stack);
    if (entry == nullptr) return false;
    while (entry != nullptr) {
      ck_stack_entry_t* next = entry->next;  // read before the node goes back to its producer
      hand_back(owner_of(entry, offsetof(bench_node, ck_entry)));
      entry = next;
    }
    return true;
  }

  ck_stack_t stack = CK_STACK_INITIALIZER;
};
#endif

#if TEARDOWN_BENCH_HAVE_URCU
// The inline names: _cds_lfs_push is cds_lfs_push, ___cds_lfs_pop_all is __cds_lfs_pop_all.
// urcu/lfstack.h synchronization rules, for this use: cds_lfs_push needs no synchronization
// with anything; __cds_lfs_pop_all needs none with push nor with other pop_all callers. The RCU
// read lock, mutex or single-consumer rule in that header is only for stacks on which
// __cds_lfs_pop (single pop, ABA-prone) is also called, and the grace period before reusing a
// node applies only to that RCU scheme. This case never calls __cds_lfs_pop, so the consumer
// calls __cds_lfs_pop_all bare and a node goes back to its producer as soon as the consumer has
// read its next link. (cds_lfs_pop_all_blocking would add a pthread mutex for nothing.)
struct alignas(64) urcu_case {
  static constexpr bool uses_nodes = true;
  explicit urcu_case(std::size_t /*capacity*/) { ___cds_lfs_init(&stack); }

  // C++ ignores the transparent union of the C API: build the argument by hand.
  cds_lfs_stack_ptr_t handle() noexcept {
    cds_lfs_stack_ptr_t ptr;
    ptr._s = &stack;
    return ptr;
  }

  void push(bench_node& n) noexcept { (void)_cds_lfs_push(handle(), &n.urcu_entry); }
  bool take_all() noexcept {
    cds_lfs_head* head = ___cds_lfs_pop_all(handle());
    if (head == nullptr) return false;
    cds_lfs_node* node;
    cds_lfs_node* next;
    // _safe: reads node->next before the body hands node back.
    cds_lfs_for_each_safe(head, node, next) {
      hand_back(owner_of(node, offsetof(bench_node, urcu_entry)));
    }
    return true;
  }

  __cds_lfs_stack stack;
};
#endif

// The lock everyone reaches for first. Both vectors are reserved for every node that can be in
// flight, so push_back never allocates.
struct alignas(64) mutex_vector_case {
  static constexpr bool uses_nodes = true;
  explicit mutex_vector_case(std::size_t capacity) {
    pending.reserve(capacity);
    taken.reserve(capacity);
  }

  void push(bench_node& n) {
    std::lock_guard<std::mutex> lock(mutex);
    pending.push_back(&n);
  }
  bool take_all() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      pending.swap(taken);
    }
    if (taken.empty()) return false;
    for (bench_node* n : taken) hand_back(*n);
    taken.clear();
    return true;
  }

  std::mutex mutex;
  std::vector<bench_node*> pending;  // guarded by mutex
  std::vector<bench_node*> taken;    // the consumer's own
};

// ---- The random-order consumer-bound case.

// All producers' pools together: 2^19 nodes of 64 bytes, 32 MiB.
constexpr std::size_t kRandomTotalNodes = std::size_t{1} << 19;
constexpr std::uint64_t kRandomSeed = 20261202;

// A pool whose take() walks a fixed random permutation of its nodes, so that consecutive pushes
// (and hence consecutive nodes of a taken batch) sit far apart in memory.
class random_node_pool {
 public:
  random_node_pool(std::size_t nodes, std::uint64_t seed)
      : nodes_(new bench_node[nodes]), order_(nodes), size_(nodes) {
    std::iota(order_.begin(), order_.end(), std::uint32_t{0});
    std::mt19937_64 random(seed);
    std::shuffle(order_.begin(), order_.end(), random);
  }

  // As node_pool::take_unless.
  bench_node* take_unless(const std::atomic<bool>& stop) noexcept {
    bench_node& n = nodes_[order_[next_]];
    // acquire: pairs with the release in hand_back().
    while (n.in_flight.load(std::memory_order_acquire)) {
      if (stop.load(std::memory_order_relaxed)) return nullptr;
      std::this_thread::yield();
    }
    next_ = next_ + 1 == size_ ? 0 : next_ + 1;
    // relaxed: as in node_pool::take().
    n.in_flight.store(true, std::memory_order_relaxed);
    return &n;
  }

 private:
  std::unique_ptr<bench_node[]> nodes_;
  std::vector<std::uint32_t> order_;
  std::size_t size_;
  std::size_t next_ = 0;
};

enum class take_kind { newest_first, oldest_first };

// What this build of the library offers (the before/after comparison builds older ones too).
template <class List>
concept has_oldest_first_take = requires(List& list) {
  { list.del_all_oldest_first() } -> std::same_as<typename List::batch>;
};
template <class List>
concept has_take_by_shard = requires(List& list) {
  list.del_all_by_shard([](typename List::batch&&) noexcept {});
};

// The list and the take. Shards: 0 for an llist; for a sharded_llist its shard count (0: the
// default) and whether producer p adds with add_to(p) (a shard each) or add().
template <class List, take_kind Take>
struct random_case {
  static constexpr bool sharded = !std::is_same_v<List, teardown::llist<bench_node, &bench_node::hook>>;
  using batch = typename List::batch;

  explicit random_case(std::size_t shards, bool own_shards) : list(make(shards)), add_to(own_shards) {}

  static std::unique_ptr<List> make(std::size_t shards) {
    if constexpr (sharded) {
      return std::make_unique<List>(shards);
    } else {
      (void)shards;
      return std::make_unique<List>();
    }
  }

  void push(bench_node& n, std::size_t producer) noexcept {
    if constexpr (sharded) {
      if (add_to) {
        (void)list->add_to(producer, n);
        return;
      }
    }
    (void)producer;
    (void)list->add(n);
  }

  static std::size_t hand_back_all(batch& nodes) noexcept {
    std::size_t taken = 0;
    for (bench_node& n : nodes) {
      hand_back(n);
      ++taken;
    }
    return taken;
  }

  std::size_t take_counted() noexcept {
    if constexpr (Take == take_kind::newest_first) {
      if constexpr (has_take_by_shard<List>) {
        std::size_t taken = 0;
        list->del_all_by_shard([&taken](batch&& nodes) noexcept { taken += hand_back_all(nodes); });
        return taken;
      } else {
        batch nodes = list->del_all();
        return hand_back_all(nodes);
      }
    } else {
      if constexpr (has_oldest_first_take<List>) {
        batch nodes = list->del_all_oldest_first();
        return hand_back_all(nodes);
      } else {
        batch nodes = list->del_all().reverse();
        return hand_back_all(nodes);
      }
    }
  }

  std::unique_ptr<List> list;
  bool add_to;
};

// One producer thread per pool, pushing each node its pool hands it (push(node, p)) until `stop`;
// the consumer-bound cases' producers. The caller joins them.
template <class Pool, class Push>
std::vector<std::thread> start_producers(std::vector<Pool>& pools, const std::atomic<bool>& stop, Push push) {
  std::vector<std::thread> threads;
  for (std::size_t p = 0; p < pools.size(); ++p) {
    threads.emplace_back([&pools, &stop, push, p] {
      while (!stop.load(std::memory_order_relaxed)) {
        bench_node* n = pools[p].take_unless(stop);
        if (n == nullptr) break;
        push(*n, p);
      }
    });
  }
  return threads;
}

template <class Case>
void consumer_bound_random(benchmark::State& state, std::size_t producers, std::size_t shards, bool own_shards) {
  Case shared(shards, own_shards);
  std::vector<random_node_pool> pools;
  pools.reserve(producers);
  for (std::size_t p = 0; p < producers; ++p) pools.emplace_back(kRandomTotalNodes / producers, kRandomSeed + p);
  // Relaxed, as in consumer_bound.
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads =
      start_producers(pools, stop, [&shared](bench_node& n, std::size_t p) { shared.push(n, p); });

  // The batch size settles only after the pools have gone round: the first takes find a few
  // nodes, later ones about what the consumer handed back during its last walk. Without a
  // warm-up the benchmark would size its run by a few cheap takes and then run far too long.
  for (std::size_t warm = 0; warm < 2 * kRandomTotalNodes;) warm += shared.take_counted();
  // One iteration is one take that found nodes; empty takes are counted in nodes_per_take.
  std::size_t taken = 0;
  std::size_t takes = 0;
  for (auto _ : state) {
    std::size_t got = 0;
    do {
      got = shared.take_counted();
      ++takes;
    } while (got == 0);
    taken += got;
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(taken));
  state.counters["nodes_per_take"] =
      benchmark::Counter(static_cast<double>(taken) / static_cast<double>(std::max<std::size_t>(takes, 1)));

  stop.store(true, std::memory_order_relaxed);
  for (std::thread& thread : threads) thread.join();
  while (shared.take_counted() != 0) {
  }
}

using single_head = teardown::llist<bench_node, &bench_node::hook>;
using sharded_head = teardown::sharded_llist<bench_node, &bench_node::hook>;

constexpr std::string_view kRandom = "consumer_bound/random/";
constexpr std::size_t kRandomProducers[] = {1, 2, 16, 64};
const char* const kRandomLists[] = {"llist", "sharded_llist"};
const char* const kRandomTakes[] = {"newest_first", "oldest_first"};

std::string random_name(std::string_view list, std::string_view take, std::size_t producers) {
  return std::string(kRandom) + std::string(list) + "/" + std::string(take) + "/producers:" +
         std::to_string(producers);
}

// ---- The harness.

template <class Case>
struct run_context {
  explicit run_context(int producers)
      : shared(static_cast<std::size_t>(producers) * kPoolNodes),
        pools(Case::uses_nodes ? static_cast<std::size_t>(producers) : 0) {}

  void consume() {
    // acquire: pairs with the release store in stop_consumer(); when the consumer sees stop,
    // every push is done, so the final take_all() finds the rest.
    while (!stop.load(std::memory_order_acquire)) {
      if (!shared.take_all()) std::this_thread::yield();
    }
    shared.take_all();
  }

  void stop_consumer() {
    stop.store(true, std::memory_order_release);
    consumer.join();
  }

  alignas(64) Case shared;
  alignas(64) std::atomic<bool> stop{false};
  std::vector<node_pool> pools;
  std::thread consumer;
};

// Set by thread 0 before the benchmark loop starts and cleared after it ends. The loop's start
// barrier orders the store before any producer's first read, and its end barrier orders every
// producer's last push before thread 0 tears the run down.
template <class Case>
run_context<Case>* current_run = nullptr;

template <class Case>
void producer_scaling(benchmark::State& state) {
  if (state.thread_index() == 0) {
    auto* run = new run_context<Case>(state.threads());
    run->consumer = std::thread([run] { run->consume(); });
    current_run<Case> = run;
  }

  for (auto _ : state) {
    run_context<Case>& run = *current_run<Case>;
    if constexpr (Case::uses_nodes) {
      run.shared.push(run.pools[static_cast<std::size_t>(state.thread_index())].take());
    } else {
      run.shared.push();
    }
  }
  state.SetItemsProcessed(state.iterations());

  if (state.thread_index() == 0) {
    run_context<Case>* run = std::exchange(current_run<Case>, nullptr);
    run->stop_consumer();
    delete run;
  }
}

// The consumer-bound case. The benchmark's own thread is the consumer: one iteration is one
// take (take_counted(), never a yield when it comes back empty), and the items are the nodes
// taken, so items_per_second is what the consumer moves. `producers` more threads push from
// their pools as fast as the consumer hands nodes back. Shards: 0 for an llist or a
// sharded_llist of the default shard count, else a sharded_llist of that many.
template <class Case, std::size_t Shards>
void consumer_bound(benchmark::State& state, std::size_t producers) {
  std::unique_ptr<Case> shared;
  if constexpr (Shards == 0) {
    shared = std::make_unique<Case>(producers * kPoolNodes);
  } else {
    shared = std::make_unique<Case>(producers * kPoolNodes, Shards);
  }
  std::vector<node_pool> pools(producers);
  // Relaxed: it only ends the producers' loops; the joins below order their pushes before the
  // final drain.
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads =
      start_producers(pools, stop, [&shared](bench_node& n, std::size_t) { shared->push(n); });

  std::size_t taken = 0;
  for (auto _ : state) taken += shared->take_counted();
  state.SetItemsProcessed(static_cast<std::int64_t>(taken));
  state.counters["nodes_per_take"] = benchmark::Counter(
      static_cast<double>(taken) / static_cast<double>(std::max<benchmark::IterationCount>(state.iterations(), 1)));

  stop.store(true, std::memory_order_relaxed);
  for (std::thread& thread : threads) thread.join();
  while (shared->take_counted() != 0) {
  }
}

// The consumer-bound cases (registered as "consumer_bound/<case>/producers:<P>", one thread:
// the consumer) and the producer counts they run at.
constexpr std::string_view kConsumerBound = "consumer_bound/";
const char* const kConsumerBoundCases[] = {"llist/std", "sharded_llist/std",
                                           "sharded_llist/std/16_shards"};

std::string consumer_bound_name(std::string_view name, std::size_t producers) {
  return std::string(kConsumerBound) + std::string(name) + "/producers:" + std::to_string(producers);
}

// The console table as usual, then each push-side case's time per push divided by
// limit/fetch_add's at the same producer count, then the consumer-bound cases' items per second
// and their ratio to llist/std's (medians when --benchmark_repetitions > 1).
class ratio_reporter : public teardown_bench::summary_reporter {
 public:
  ratio_reporter(OutputOptions options, std::size_t max_producers)
      : summary_reporter(options), max_producers_(max_producers) {}

 private:
  void print_summary(std::FILE* out) const override {
    print_push_side(out);
    print_consumer_bound(out);
    print_random(out);
  }

  // The goals: with random-order nodes, a sharded_llist's consumer moves at least 0.95x the
  // single head's items at 1 and 2 producers, and at 16 and 64 spends at most 1.1x its ns per
  // node.
  void print_random(std::FILE* out) const {
    bool any = false;
    for (const char* list : kRandomLists) {
      for (const char* take : kRandomTakes) {
        for (std::size_t p : kRandomProducers) any |= random_rate(list, take, p) > 0;
      }
    }
    if (!any) return;
    std::fprintf(out, "\nconsumer-bound, random-order nodes: M items/s, ratio to llist with the same take, "
                      "ns per node, nodes per take:\n");
    std::fprintf(out, "%-40s", "producers");
    for (std::size_t p : kRandomProducers) std::fprintf(out, "%40zu", p);
    std::fprintf(out, "\n");
    for (const char* take : kRandomTakes) {
      for (const char* list : kRandomLists) {
        const std::string row = std::string(list) + "/" + take;
        std::fprintf(out, "%-40s", row.c_str());
        for (std::size_t p : kRandomProducers) {
          const double rate = random_rate(list, take, p);
          const double single = random_rate("llist", take, p);
          if (rate <= 0) {
            std::fprintf(out, "%40s", "-");
            continue;
          }
          char cell[64];
          std::snprintf(cell, sizeof cell, "%.1f M/s %.2fx %.1f ns %.0f/take", rate / 1e6,
                        single > 0 ? rate / single : 0.0, 1e9 / rate, random_counter(list, take, p, "nodes_per_take"));
          std::fprintf(out, "%40s", cell);
        }
        std::fprintf(out, "\n");
      }
    }
  }

  double random_counter(std::string_view list, std::string_view take, std::size_t producers,
                        const char* counter) const {
    const Run* run = runs().median(random_name(list, take, producers), 1);
    if (run == nullptr) return 0;
    const auto it = run->counters.find(counter);
    return it == run->counters.end() ? 0 : it->second.value;
  }

  double random_rate(std::string_view list, std::string_view take, std::size_t producers) const {
    return random_counter(list, take, producers, "items_per_second");
  }

  void print_push_side(std::FILE* out) const {
    const std::vector<std::int64_t>& thread_counts = runs().thread_counts();
    std::fprintf(out, "\nns per push (all producers together) and ratio to limit/fetch_add:\n");
    std::fprintf(out, "%-28s", "producers");
    for (std::int64_t threads : thread_counts) {
      std::fprintf(out, "%24lld", static_cast<long long>(threads));
    }
    std::fprintf(out, "\n");
    for (const std::string& name : runs().names()) {
      if (std::string_view(name).starts_with(kConsumerBound)) continue;
      std::fprintf(out, "%-28s", name.c_str());
      for (std::int64_t threads : thread_counts) {
        const double time = value(name, threads);
        const double limit = value("limit/fetch_add", threads);
        if (time <= 0) {
          std::fprintf(out, "%24s", "-");
        } else if (limit <= 0) {
          std::fprintf(out, "%12.1f ns%9s", time, "");
        } else {
          std::fprintf(out, "%12.1f ns %7.2fx", time, time / limit);
        }
      }
      std::fprintf(out, "\n");
    }

    // The point of sharding: at the highest producer count, how much of llist's time per push
    // is left when each producer has a head of its own.
    const std::int64_t top = thread_counts.empty() ? 0 : thread_counts.back();
    const double sharded = value("sharded_llist/std", top);
    const double single = value("llist/std", top);
    if (sharded > 0 && single > 0) {
      std::fprintf(out,
                   "\nsharded / single-head at %lld producers: sharded_llist/std %.1f ns / "
                   "llist/std %.1f ns = %.2fx\n",
                   static_cast<long long>(top), sharded, single, sharded / single);
    }
  }

  // The goal: at low producer counts, a sharded_llist's consumer moves nearly as many items as
  // a single head's.
  void print_consumer_bound(std::FILE* out) const {
    bool any = false;
    for (const char* name : kConsumerBoundCases) {
      for (std::size_t p = 1; p <= max_producers_; ++p) any |= items_per_second(name, p) > 0;
    }
    if (!any) return;
    std::fprintf(out, "\nconsumer-bound: M items/s taken by the one consumer, and ratio to llist/std:\n");
    std::fprintf(out, "%-28s", "producers");
    for (std::size_t p = 1; p <= max_producers_; ++p) std::fprintf(out, "%24zu", p);
    std::fprintf(out, "\n");
    for (const char* name : kConsumerBoundCases) {
      std::fprintf(out, "%-28s", name);
      for (std::size_t p = 1; p <= max_producers_; ++p) {
        const double rate = items_per_second(name, p);
        const double single = items_per_second("llist/std", p);
        if (rate <= 0) {
          std::fprintf(out, "%24s", "-");
        } else if (single <= 0) {
          std::fprintf(out, "%12.1f M/s%8s", rate / 1e6, "");
        } else {
          std::fprintf(out, "%12.1f M/s %6.2fx", rate / 1e6, rate / single);
        }
      }
      std::fprintf(out, "\n");
    }
  }

  // ns per push, all producers together; 0 if the case did not run at that count.
  double value(const std::string& name, std::int64_t threads) const {
    const Run* run = runs().median(name, threads);
    return run == nullptr ? 0 : run->GetAdjustedRealTime();
  }

  // Items per second taken by the consumer-bound case's consumer; 0 if it did not run.
  double items_per_second(std::string_view name, std::size_t producers) const {
    const Run* run = runs().median(consumer_bound_name(name, producers), 1);
    if (run == nullptr) return 0;
    const auto it = run->counters.find("items_per_second");
    return it == run->counters.end() ? 0 : it->second.value;
  }

  std::size_t max_producers_;
};

// A benchmark's own MinTime would override --benchmark_min_time, so it is set only when the
// command line does not ask for another.
bool default_min_time = true;

template <class Case>
void register_case(const char* name, int max_producers) {
  auto* benchmark = benchmark::RegisterBenchmark(name, producer_scaling<Case>)
                        ->ThreadRange(1, max_producers)
                        ->UseRealTime();
  if (default_min_time) benchmark->MinTime(kMinTimeSeconds);
}

template <class Case, std::size_t Shards = 0>
void register_consumer_bound(const char* name, int max_producers) {
  for (int p = 1; p <= max_producers; ++p) {
    auto* benchmark = benchmark::RegisterBenchmark(
        consumer_bound_name(name, static_cast<std::size_t>(p)).c_str(),
        consumer_bound<Case, Shards>, static_cast<std::size_t>(p));
    benchmark->UseRealTime();
    if (default_min_time) benchmark->MinTime(kMinTimeSeconds);
  }
}

[[maybe_unused]] void skipped(const char* name, const char* why) {
  std::fprintf(stderr, "llist_bench: %s skipped: %s\n", name, why);
  benchmark::AddCustomContext(std::string("skipped ") + name, why);
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]).starts_with("--benchmark_min_time")) default_min_time = false;
  }
  const int hardware_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  register_case<llist_case<teardown::std_atomics>>("llist/std", hardware_threads);
  register_case<sharded_llist_case<teardown::std_atomics>>("sharded_llist/std", hardware_threads);
#if TEARDOWN_AO_ATOMICS_AVAILABLE
  register_case<llist_case<teardown::ao_atomics>>("llist/ao", hardware_threads);
#else
  skipped("llist/ao", "built without libatomic_ops (<atomic_ops.h>)");
#endif
  register_case<fetch_add_limit>("limit/fetch_add", hardware_threads);
#if TEARDOWN_BENCH_HAVE_BOOST
  register_case<boost_case>("peer/boost_lockfree_stack", hardware_threads);
#else
  skipped("peer/boost_lockfree_stack", "built without Boost.Lockfree");
#endif
#if TEARDOWN_BENCH_HAVE_CK
  register_case<ck_case>("peer/ck_stack_upmc", hardware_threads);
#else
  skipped("peer/ck_stack_upmc", "built without Concurrency Kit (pkg-config ck)");
#endif
#if TEARDOWN_BENCH_HAVE_URCU
  register_case<urcu_case>("peer/urcu_lfs", hardware_threads);
#else
  skipped("peer/urcu_lfs", "built without liburcu (pkg-config liburcu-cds)");
#endif
  register_case<mutex_vector_case>("peer/mutex_vector", hardware_threads);

  register_consumer_bound<llist_case<teardown::std_atomics>>(kConsumerBoundCases[0],
                                                             hardware_threads);
  register_consumer_bound<sharded_llist_case<teardown::std_atomics>>(kConsumerBoundCases[1],
                                                                     hardware_threads);
  register_consumer_bound<sharded_llist_case<teardown::std_atomics>, 16>(kConsumerBoundCases[2],
                                                                         hardware_threads);

  for (std::size_t p : kRandomProducers) {
    // At 16 and 64 producers: 64 shards, producer p on shard p; below, the default shards.
    const bool own_shards = p > 2;
    const std::size_t shards = own_shards ? 64 : 0;
    const auto add = [&](const char* list, const char* take, auto* run) {
      auto* benchmark = benchmark::RegisterBenchmark(random_name(list, take, p).c_str(), run, p, shards, own_shards);
      benchmark->UseRealTime();
      if (default_min_time) benchmark->MinTime(kMinTimeSeconds);
    };
    add("llist", "newest_first", consumer_bound_random<random_case<single_head, take_kind::newest_first>>);
    add("sharded_llist", "newest_first", consumer_bound_random<random_case<sharded_head, take_kind::newest_first>>);
    add("llist", "oldest_first", consumer_bound_random<random_case<single_head, take_kind::oldest_first>>);
    add("sharded_llist", "oldest_first", consumer_bound_random<random_case<sharded_head, take_kind::oldest_first>>);
  }
  benchmark::AddCustomContext("llist_bench random-order pool nodes (all producers)", std::to_string(kRandomTotalNodes));
  benchmark::AddCustomContext("llist_bench random-order seed", std::to_string(kRandomSeed) + " + producer index");
  benchmark::AddCustomContext("llist_bench sharded takes",
                              has_oldest_first_take<sharded_head> && has_take_by_shard<sharded_head>
                                  ? "del_all_by_shard, del_all_oldest_first"
                                  : "del_all, del_all().reverse() (this library has no other)");
  benchmark::AddCustomContext("llist_bench consumer", "1 thread, in addition to the producers");
  benchmark::AddCustomContext("llist_bench pool nodes per producer", std::to_string(kPoolNodes));
  benchmark::AddCustomContext("teardown llist checks", TEARDOWN_LLIST_CHECKS ? "on" : "off");
  if (TEARDOWN_LLIST_CHECKS) {
    std::fputs("llist_bench: built with teardown's debug checks on (no NDEBUG): llist timings "
               "include them\n",
               stderr);
  }

  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  ratio_reporter reporter(isatty(STDOUT_FILENO) ? benchmark::ConsoleReporter::OO_ColorTabular
                                                : benchmark::ConsoleReporter::OO_Tabular,
                          static_cast<std::size_t>(hardware_threads));
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
