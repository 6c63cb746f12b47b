// Specification of teardown::sharded_llist on every Atomics backend: the llist members it shares
// (add, add_batch, del_all, empty) with their meanings, the shards, the order del_all yields,
// the structure-wide was-empty signal and the summary word of flagged shards (which shards a
// del_all exchanges, counted by a test policy; an adder held between its push and its flag by
// another); the takes without a join walk (del_all_oldest_first and its sweep, del_all_by_shard:
// order, every node once, empty and unflagged shards); then llist_batch::append, which del_all
// joins the shards with; then the debug check;
// then many-thread stress (suite names ending StressTest): a consumer that sleeps until a
// producer's add returns true (many producers, shards sharing a summary bit, and a hand-off of
// one node at a time), and polling del_all callers beside many producers. The stress suites also
// run on a test-only Atomics policy that pauses at random before every read-modify-write and
// store, which widens the races a lost wake-up needs: a del_all that clears the summary word
// after taking the shards, an add that flags before it pushes, and a clear split into a load and
// a store each failed there on the runs tried (a debug build, 2 loaded cores). Stress runs are
// bounded by node counts, never by time, and shrink under sanitizers.
#include "teardown/sharded_llist.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <latch>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "llist_test_support.hpp"
#include "test_support.hpp"

namespace teardown_test {
namespace {

using teardown::llist;
using teardown::llist_node;
using teardown::sharded_llist;

template <class Atomics>
class ShardedLlistTest : public ::testing::Test {
 protected:
  using list = sharded_llist<item, &item::hook, Atomics>;
  using batch = typename list::batch;
  using chain = typename list::chain;
};

TYPED_TEST_SUITE(ShardedLlistTest, atomics_backends);

// --- Types ---------------------------------------------------------------------------------

using std_sharded = sharded_llist<item, &item::hook>;

TEST(ShardedLlistTypes, QueueMembersHaveLlistsSignatures) {
  // What a consumer of an llist queue (the reaper) calls, with the same types and noexcept.
  using list = std_sharded;
  static_assert(std::is_same_v<decltype(std::declval<list&>().add(std::declval<item&>())), bool>);
  static_assert(
      std::is_same_v<decltype(std::declval<list&>().add_batch(std::declval<item_chain&&>())), bool>);
  static_assert(std::is_same_v<decltype(std::declval<list&>().del_all()), item_batch>);
  static_assert(std::is_same_v<decltype(std::declval<const list&>().empty()), bool>);
  static_assert(noexcept(std::declval<list&>().add(std::declval<item&>())));
  static_assert(noexcept(std::declval<list&>().add_batch(std::declval<item_chain&&>())));
  static_assert(noexcept(std::declval<list&>().del_all()));
  static_assert(noexcept(std::declval<const list&>().empty()));
  static_assert(std::is_same_v<list::batch, item_batch>);
  static_assert(std::is_same_v<list::chain, item_chain>);
}

TEST(ShardedLlistTypes, DefaultAtomicsPolicyIsStdAtomics) {
  static_assert(
      std::is_same_v<std_sharded, sharded_llist<item, &item::hook, teardown::std_atomics>>);
}

TEST(ShardedLlistTypes, ListIsNeitherCopyableNorMovable) {
  static_assert(!std::is_copy_constructible_v<std_sharded>);
  static_assert(!std::is_copy_assignable_v<std_sharded>);
  static_assert(!std::is_move_constructible_v<std_sharded>);
  static_assert(!std::is_move_assignable_v<std_sharded>);
}

TEST(ShardedLlistTypes, DefaultShardCountIsTheHardwareThreadsRoundedUpToAPowerOfTwo) {
  const std::size_t hardware = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t expected =
      std::bit_ceil(std::min<std::size_t>(hardware, std_sharded::max_shards));
  EXPECT_EQ(std_sharded::default_shards(), expected);
  EXPECT_EQ(std_sharded().shard_count(), expected);
  EXPECT_EQ(std_sharded(0).shard_count(), expected);
}

// --- Shards --------------------------------------------------------------------------------

TYPED_TEST(ShardedLlistTest, ShardCountIsRoundedUpToAPowerOfTwo) {
  EXPECT_EQ(typename TestFixture::list(1).shard_count(), 1u);
  EXPECT_EQ(typename TestFixture::list(3).shard_count(), 4u);
  EXPECT_EQ(typename TestFixture::list(4).shard_count(), 4u);
  EXPECT_EQ(typename TestFixture::list(5).shard_count(), 8u);
}

TYPED_TEST(ShardedLlistTest, ShardCountIsAtMostMaxShards) {
  EXPECT_EQ(typename TestFixture::list(100000).shard_count(), TestFixture::list::max_shards);
}

TYPED_TEST(ShardedLlistTest, ThisThreadShardIsTheSameOnEveryCall) {
  typename TestFixture::list list(8);
  const std::size_t shard = list.this_thread_shard();
  EXPECT_LT(shard, list.shard_count());
  EXPECT_EQ(list.this_thread_shard(), shard);
}

TYPED_TEST(ShardedLlistTest, AddGoesToTheCallersShard) {
  typename TestFixture::list list(4);
  const std::size_t own = list.this_thread_shard();
  item a{1}, b{2}, c{3};
  list.add(a);
  list.add_to(own + 1, b);  // another shard
  list.add_to(own, c);
  // c sits on a directly (same shard, newest first); b is on its own.
  const std::vector<int> ids = ids_of(list.del_all());
  const auto at = std::find(ids.begin(), ids.end(), 3);
  ASSERT_NE(at, ids.end());
  ASSERT_NE(at + 1, ids.end());
  EXPECT_EQ(*(at + 1), 1);
  EXPECT_EQ(ids.size(), 3u);
}

TYPED_TEST(ShardedLlistTest, AddToTakesTheShardModuloTheShardCount) {
  typename TestFixture::list list(4);
  item a{1}, b{2};
  list.add_to(1, a);
  list.add_to(5, b);  // shard 1 again
  EXPECT_EQ(ids_of(list.del_all()), (std::vector<int>{2, 1}));
}

TYPED_TEST(ShardedLlistTest, LiveThreadsUpToTheShardCountGetDistinctShards) {
  // Each live thread holds the lowest index no other live thread holds (counter.hpp), so the
  // calling thread and shard_count() - 1 others never share one of shard_count() shards.
  typename TestFixture::list list(4);
  const std::size_t own = list.this_thread_shard();  // held before the others take theirs
  const std::size_t others = list.shard_count() - 1;
  std::vector<std::size_t> shards(others);
  std::latch all_hold_an_index(static_cast<std::ptrdiff_t>(others));
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < others; ++t) {
    threads.emplace_back([&, t] {
      shards[t] = list.this_thread_shard();
      // No thread exits (giving its index back) before all have taken one.
      all_hold_an_index.arrive_and_wait();
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::set<std::size_t> distinct(shards.begin(), shards.end());
  distinct.insert(own);
  EXPECT_EQ(distinct.size(), list.shard_count());
}

// --- add, empty, del_all -------------------------------------------------------------------

TYPED_TEST(ShardedLlistTest, NewListIsEmpty) {
  typename TestFixture::list list(4);
  EXPECT_TRUE(list.empty());
}

TYPED_TEST(ShardedLlistTest, ListIsNotEmptyWhileAnyShardHoldsANode) {
  typename TestFixture::list list(4);
  for (std::size_t shard = 0; shard < list.shard_count(); ++shard) {
    item a{1};
    list.add_to(shard, a);
    EXPECT_FALSE(list.empty()) << "shard " << shard;
    EXPECT_EQ(ids_of(list.del_all()), std::vector<int>{1});
    EXPECT_TRUE(list.empty());
  }
}

TYPED_TEST(ShardedLlistTest, DelAllOnEmptyListReturnsEmptyBatch) {
  typename TestFixture::list list(4);
  auto batch = list.del_all();
  EXPECT_TRUE(batch.empty());
}

TYPED_TEST(ShardedLlistTest, DelAllTakesEveryShardInOneBatch) {
  typename TestFixture::list list(4);
  std::vector<std::unique_ptr<item>> items;
  for (int id = 0; id < 12; ++id) {
    items.push_back(std::make_unique<item>(id));
    list.add_to(static_cast<std::size_t>(id) * 7, *items.back());
  }
  std::vector<int> ids = ids_of(list.del_all());
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_TRUE(list.empty());
  EXPECT_TRUE(list.del_all().empty());
}

// Adds ids 1 to 5 to shards 2, 0, 2, 0 and 3, in that order, to a list of four shards: shard 0
// then holds 2 and 4, shard 2 holds 1 and 3, shard 3 holds 5.
template <class List>
std::vector<std::unique_ptr<item>> add_five_across_shards(List& list) {
  constexpr std::size_t shards[] = {2, 0, 2, 0, 3};
  std::vector<std::unique_ptr<item>> items;
  for (int id = 1; id <= 5; ++id) {
    items.push_back(std::make_unique<item>(id));
    list.add_to(shards[id - 1], *items.back());
  }
  return items;
}

TYPED_TEST(ShardedLlistTest, DelAllYieldsShardZeroFirstAndEachShardNewestFirst) {
  typename TestFixture::list list(4);
  const auto items = add_five_across_shards(list);
  EXPECT_EQ(ids_of(list.del_all()), (std::vector<int>{4, 2, 3, 1, 5}));
}

TYPED_TEST(ShardedLlistTest, ReverseYieldsEachShardOldestFirst) {
  typename TestFixture::list list(4);
  const auto items = add_five_across_shards(list);
  EXPECT_EQ(ids_of(list.del_all().reverse()), (std::vector<int>{5, 1, 3, 2, 4}));
}

// --- del_all_oldest_first, del_all_by_shard: the takes without a join walk -----------------

// Per shard, in shard order, the ids the adds put there, oldest first.
using shard_ids = std::vector<std::vector<int>>;

// `count` items on shards given by a fixed pseudo-random sequence, leaving some shards empty;
// `expected` gets each shard's ids oldest first.
template <class List>
std::vector<std::unique_ptr<item>> add_scattered(List& list, int count, shard_ids& expected) {
  std::vector<std::unique_ptr<item>> items;
  expected.assign(list.shard_count(), {});
  std::uint32_t state = 12345;
  for (int id = 0; id < count; ++id) {
    state = state * 1664525u + 1013904223u;
    // Only shards below 3/4 of the count (and never shard 1): the rest stay empty.
    std::size_t shard = (state >> 8) % (list.shard_count() * 3 / 4 + 1);
    if (shard == 1 && list.shard_count() > 2) shard = 0;
    items.push_back(std::make_unique<item>(id));
    list.add_to(shard, *items.back());
    expected[shard].push_back(id);
  }
  return items;
}

std::vector<int> concatenated(const shard_ids& shards, bool reversed) {
  std::vector<int> ids;
  for (const std::vector<int>& shard : shards) {
    if (reversed) {
      ids.insert(ids.end(), shard.rbegin(), shard.rend());
    } else {
      ids.insert(ids.end(), shard.begin(), shard.end());
    }
  }
  return ids;
}

TYPED_TEST(ShardedLlistTest, DelAllOldestFirstYieldsShardZeroFirstAndEachShardOldestFirst) {
  typename TestFixture::list list(4);
  const auto items = add_five_across_shards(list);
  EXPECT_EQ(ids_of(list.del_all_oldest_first()), (std::vector<int>{2, 4, 1, 3, 5}));
  EXPECT_TRUE(list.empty());
}

TYPED_TEST(ShardedLlistTest, DelAllOldestFirstTakesEveryNodeOnceAcrossManyShards) {
  for (const std::size_t shards : {std::size_t{1}, std::size_t{2}, std::size_t{16}, std::size_t{64},
                                   std::size_t{256}}) {
    typename TestFixture::list list(shards);
    shard_ids expected;
    const auto items = add_scattered(list, 1000, expected);
    EXPECT_EQ(ids_of(list.del_all_oldest_first()), concatenated(expected, false)) << shards << " shards";
    EXPECT_TRUE(list.empty()) << shards << " shards";
    EXPECT_TRUE(list.del_all_oldest_first().empty()) << shards << " shards";
  }
}

TYPED_TEST(ShardedLlistTest, DelAllOldestFirstOfAnEmptyListIsEmpty) {
  typename TestFixture::list list(8);
  EXPECT_TRUE(list.del_all_oldest_first().empty());
  EXPECT_TRUE(list.del_all_sweep_oldest_first().empty());
  int visits = 0;
  list.del_all_by_shard([&](typename TestFixture::batch&&) noexcept { ++visits; });
  EXPECT_EQ(visits, 0);
}

TYPED_TEST(ShardedLlistTest, DelAllOldestFirstOfOneShardIsItsNodesOldestFirst) {
  typename TestFixture::list list(1);
  item a{1}, b{2}, c{3};
  list.add(a);
  list.add(b);
  list.add(c);
  EXPECT_EQ(ids_of(list.del_all_oldest_first()), (std::vector<int>{1, 2, 3}));
}

TYPED_TEST(ShardedLlistTest, DelAllOldestFirstGivesWhatDelAllReverseGivesPerShard) {
  typename TestFixture::list one(16), other(16);
  shard_ids expected, same;
  const auto items = add_scattered(one, 300, expected);
  const auto items_too = add_scattered(other, 300, same);
  // reverse() of the whole batch turns the shards' order around too; per shard it is the same.
  std::vector<int> reversed = ids_of(other.del_all().reverse());
  std::vector<int> by_shard_reversed;
  for (auto shard = same.rbegin(); shard != same.rend(); ++shard) {
    by_shard_reversed.insert(by_shard_reversed.end(), shard->begin(), shard->end());
  }
  EXPECT_EQ(reversed, by_shard_reversed);
  EXPECT_EQ(ids_of(one.del_all_oldest_first()), concatenated(expected, false));
}

TYPED_TEST(ShardedLlistTest, ShardsThatShareASummaryBitAreTakenOldestFirstInShardOrder) {
  typename TestFixture::list list(128);  // shards 5 and 69 share bit 5
  item a{1}, b{2}, c{3}, d{4};
  list.add_to(69, a);
  list.add_to(5, b);
  list.add_to(70, c);
  list.add_to(5, d);
  EXPECT_EQ(ids_of(list.del_all_oldest_first()), (std::vector<int>{2, 4, 1, 3}));
  EXPECT_TRUE(list.empty());
}

TYPED_TEST(ShardedLlistTest, DelAllSweepOldestFirstTakesEveryShardOldestFirst) {
  typename TestFixture::list list(16);
  shard_ids expected;
  const auto items = add_scattered(list, 500, expected);
  EXPECT_EQ(ids_of(list.del_all_sweep_oldest_first()), concatenated(expected, false));
  EXPECT_TRUE(list.empty());
}

TYPED_TEST(ShardedLlistTest, DelAllByShardVisitsEachNonEmptyShardOnceInShardOrderNewestFirst) {
  for (const std::size_t shards : {std::size_t{1}, std::size_t{16}, std::size_t{128}}) {
    typename TestFixture::list list(shards);
    shard_ids expected;
    const auto items = add_scattered(list, 400, expected);
    shard_ids seen;
    list.del_all_by_shard([&](typename TestFixture::batch&& nodes) noexcept {
      seen.push_back(ids_of(nodes));
      EXPECT_TRUE(nodes.empty());
    });
    shard_ids non_empty;
    for (std::vector<int>& shard : expected) {
      if (shard.empty()) continue;
      std::reverse(shard.begin(), shard.end());
      non_empty.push_back(shard);
    }
    EXPECT_EQ(seen, non_empty) << shards << " shards";
    EXPECT_TRUE(list.empty()) << shards << " shards";
  }
}

TYPED_TEST(ShardedLlistTest, DelAllByShardGivesDelAllsNodesInDelAllsOrder) {
  typename TestFixture::list one(8), other(8);
  const auto items = add_five_across_shards(one);
  const auto items_too = add_five_across_shards(other);
  std::vector<int> visited;
  one.del_all_by_shard([&](typename TestFixture::batch&& nodes) noexcept {
    for (item& element : nodes) visited.push_back(element.id);
  });
  EXPECT_EQ(visited, ids_of(other.del_all()));
}

TYPED_TEST(ShardedLlistTest, AddsOfOneThreadComeOutInOrderAfterReverse) {
  typename TestFixture::list list(4);
  const std::size_t own = list.this_thread_shard();
  item a{1}, b{2}, c{3}, x{9};
  list.add(a);
  list.add_to(own + 1, x);
  list.add(b);
  list.add(c);
  std::vector<int> mine;
  for (item& element : list.del_all().reverse()) {
    if (element.id != 9) mine.push_back(element.id);
  }
  EXPECT_EQ(mine, (std::vector<int>{1, 2, 3}));
}

TYPED_TEST(ShardedLlistTest, ElementTakenByDelAllCanBeAddedAgain) {
  typename TestFixture::list list(4);
  item a{1};
  list.add(a);
  EXPECT_EQ(ids_of(list.del_all()), std::vector<int>{1});
  list.add_to(3, a);
  EXPECT_EQ(ids_of(list.del_all()), std::vector<int>{1});
}

// --- The was-empty signal ------------------------------------------------------------------

TYPED_TEST(ShardedLlistTest, FirstAddReturnsTrue) {
  typename TestFixture::list list(4);
  item a{1};
  EXPECT_TRUE(list.add(a));
  (void)ids_of(list.del_all());
}

TYPED_TEST(ShardedLlistTest, SecondAddFromTheSameThreadReturnsFalse) {
  typename TestFixture::list list(4);
  item a{1}, b{2};
  EXPECT_TRUE(list.add(a));
  EXPECT_FALSE(list.add(b));
  (void)ids_of(list.del_all());
}

TYPED_TEST(ShardedLlistTest, AddToAnEmptyShardReturnsFalseWhileTheKickIsPending) {
  // The first add claimed the kick; until a del_all begins, no other add needs to kick.
  typename TestFixture::list list(4);
  item a{1}, b{2}, c{3};
  EXPECT_TRUE(list.add_to(0, a));
  EXPECT_FALSE(list.add_to(1, b));
  EXPECT_FALSE(list.add_to(3, c));
  (void)ids_of(list.del_all());
}

TYPED_TEST(ShardedLlistTest, AddFromAnotherThreadAfterTheFirstAddReturnsFalse) {
  typename TestFixture::list list(4);
  item a{1}, b{2};
  EXPECT_TRUE(list.add(a));
  bool other_result = true;
  std::size_t other_shard = 0;
  std::thread other([&] {
    other_shard = list.this_thread_shard();
    other_result = list.add(b);
  });
  other.join();
  EXPECT_NE(other_shard, list.this_thread_shard());
  EXPECT_FALSE(other_result);
  EXPECT_EQ(ids_of(list.del_all()).size(), 2u);
}

TYPED_TEST(ShardedLlistTest, AddReturnsTrueAgainAfterDelAllTookEverything) {
  typename TestFixture::list list(4);
  item a{1}, b{2}, c{3};
  EXPECT_TRUE(list.add_to(0, a));
  EXPECT_FALSE(list.add_to(1, b));
  EXPECT_EQ(ids_of(list.del_all()).size(), 2u);
  EXPECT_TRUE(list.add_to(1, c));
  (void)ids_of(list.del_all());
}

TYPED_TEST(ShardedLlistTest, AddReturnsTrueAfterADelAllThatFoundNothing) {
  // A del_all re-arms the signal even when it takes nothing: the consumer may sleep after it.
  typename TestFixture::list list(4);
  item a{1}, b{2};
  EXPECT_TRUE(list.add(a));
  EXPECT_EQ(ids_of(list.del_all()).size(), 1u);
  EXPECT_TRUE(list.del_all().empty());
  EXPECT_TRUE(list.add(b));
  (void)ids_of(list.del_all());
}

TYPED_TEST(ShardedLlistTest, SingleShardListSignalsLikeAnLlist) {
  typename TestFixture::list list(1);
  item a{1}, b{2}, c{3};
  EXPECT_TRUE(list.add(a));
  EXPECT_FALSE(list.add_to(7, b));
  EXPECT_EQ(ids_of(list.del_all()), (std::vector<int>{2, 1}));
  EXPECT_TRUE(list.add(c));
  (void)ids_of(list.del_all());
}

// --- The summary word: which shards del_all visits -----------------------------------------

TYPED_TEST(ShardedLlistTest, ShardsThatShareASummaryBitAreAllTakenInShardOrder) {
  // With 128 shards, shards 5 and 69 share bit 5 of the summary word (see "The summary word").
  typename TestFixture::list list(128);
  item a{1}, b{2}, c{3};
  EXPECT_TRUE(list.add_to(69, a));
  EXPECT_FALSE(list.add_to(5, b)) << "the kick is pending: bit 5 is already set";
  EXPECT_FALSE(list.add_to(70, c));
  EXPECT_EQ(ids_of(list.del_all()), (std::vector<int>{2, 1, 3}));
  EXPECT_TRUE(list.empty());
}

TYPED_TEST(ShardedLlistTest, EveryBitOfTheSummaryWordReachesItsShards) {
  typename TestFixture::list list(TestFixture::list::max_shards);
  std::vector<std::unique_ptr<item>> items;
  for (std::size_t shard = 0; shard < list.shard_count(); ++shard) {
    items.push_back(std::make_unique<item>(static_cast<int>(shard)));
    EXPECT_EQ(list.add_to(shard, *items.back()), shard == 0) << "shard " << shard;
  }
  std::vector<int> expected(list.shard_count());
  for (std::size_t shard = 0; shard < expected.size(); ++shard) expected[shard] = static_cast<int>(shard);
  EXPECT_EQ(ids_of(list.del_all()), expected);
  EXPECT_TRUE(list.empty());
}

TYPED_TEST(ShardedLlistTest, AShardTakenAgainAfterItsFlagWasClearedIsFlaggedAgain) {
  typename TestFixture::list list(8);
  item a{1}, b{2};
  EXPECT_TRUE(list.add_to(6, a));
  EXPECT_EQ(ids_of(list.del_all()), std::vector<int>{1});
  EXPECT_TRUE(list.add_to(6, b));
  EXPECT_EQ(ids_of(list.del_all()), std::vector<int>{2});
}

// Counts the exchanges on pointer words: the shard heads (the summary word is an integer).
struct counting_atomics {
  static inline std::atomic<std::size_t> head_exchanges{0};

  template <class W>
  class atomic : public std::atomic<W> {
    using base = std::atomic<W>;

   public:
    using base::base;

    W exchange(W value, std::memory_order order) noexcept {
      if constexpr (std::is_pointer_v<W>) head_exchanges.fetch_add(1, std::memory_order_relaxed);
      return base::exchange(value, order);
    }
  };
};

using counting_list = sharded_llist<item, &item::hook, counting_atomics>;

TEST(ShardedLlistSummaryTest, DelAllExchangesOnlyTheShardsThatWentNonEmpty) {
  counting_list list(16);
  item a{1}, b{2}, c{3};
  list.add_to(3, a);
  list.add_to(9, b);
  list.add_to(9, c);
  counting_atomics::head_exchanges.store(0, std::memory_order_relaxed);
  EXPECT_EQ(ids_of(list.del_all()), (std::vector<int>{1, 3, 2}));
  EXPECT_EQ(counting_atomics::head_exchanges.load(std::memory_order_relaxed), 2u)
      << "a take must not write the line of a shard nobody added to";
}

TEST(ShardedLlistSummaryTest, DelAllOfAnIdleListExchangesNoShard) {
  counting_list list(16);
  item a{1};
  list.add_to(12, a);
  EXPECT_EQ(ids_of(list.del_all()), std::vector<int>{1});
  counting_atomics::head_exchanges.store(0, std::memory_order_relaxed);
  EXPECT_TRUE(list.del_all().empty());
  EXPECT_TRUE(list.del_all().empty());
  EXPECT_EQ(counting_atomics::head_exchanges.load(std::memory_order_relaxed), 0u)
      << "an empty poll must only read the shards";
}

TEST(ShardedLlistSummaryTest, TakesWithoutAJoinExchangeOnlyTheShardsThatWentNonEmpty) {
  counting_list list(16);
  item a{1}, b{2}, c{3}, d{4}, e{5}, f{6};
  list.add_to(3, a);
  list.add_to(9, b);
  list.add_to(9, c);
  counting_atomics::head_exchanges.store(0, std::memory_order_relaxed);
  EXPECT_EQ(ids_of(list.del_all_oldest_first()), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(counting_atomics::head_exchanges.load(std::memory_order_relaxed), 2u);
  list.add_to(0, d);
  list.add_to(15, e);
  list.add_to(15, f);
  counting_atomics::head_exchanges.store(0, std::memory_order_relaxed);
  std::vector<int> visited;
  list.del_all_by_shard([&](item_batch&& nodes) noexcept {
    for (item& element : nodes) visited.push_back(element.id);
  });
  EXPECT_EQ(visited, (std::vector<int>{4, 6, 5}));
  EXPECT_EQ(counting_atomics::head_exchanges.load(std::memory_order_relaxed), 2u);
  counting_atomics::head_exchanges.store(0, std::memory_order_relaxed);
  EXPECT_TRUE(list.del_all_oldest_first().empty());
  list.del_all_by_shard([](item_batch&&) noexcept { ADD_FAILURE() << "visited an empty shard"; });
  EXPECT_EQ(counting_atomics::head_exchanges.load(std::memory_order_relaxed), 0u)
      << "an empty poll must only read the shards";
}

// Stops one chosen add between its push and its flag: the thread that sets stop_before_flag
// waits, just before its first compare-and-swap of an integer word (the summary word), until
// the test releases it.
struct gated_atomics {
  static inline thread_local bool stop_before_flag = false;
  static inline std::atomic<bool> stopped{false};
  static inline std::atomic<bool> released{false};

  static void reset() noexcept {
    stopped.store(false, std::memory_order_relaxed);
    released.store(false, std::memory_order_relaxed);
  }

  static void release() noexcept {
    released.store(true, std::memory_order_release);
    released.notify_all();
  }

  template <class W>
  class atomic : public std::atomic<W> {
    using base = std::atomic<W>;

   public:
    using base::base;

    bool compare_exchange_weak(W& expected, W desired, std::memory_order success,
                               std::memory_order failure) noexcept {
      if constexpr (std::is_integral_v<W>) {
        if (stop_before_flag) {
          stop_before_flag = false;
          // release / acquire: the test sees our push once it sees us stopped, and we see
          // what it did before releasing us.
          stopped.store(true, std::memory_order_release);
          stopped.notify_all();
          released.wait(false, std::memory_order_acquire);
        }
      }
      return base::compare_exchange_weak(expected, desired, success, failure);
    }
  };
};

using gated_list = sharded_llist<item, &item::hook, gated_atomics>;

// A thread that calls add_to(shard, element) and stops before its flag.
class gated_adder {
 public:
  gated_adder(gated_list& list, std::size_t shard, item& element) {
    gated_atomics::reset();
    thread_ = std::thread([this, &list, shard, &element] {
      gated_atomics::stop_before_flag = true;
      kicked_ = list.add_to(shard, element);
      gated_atomics::stop_before_flag = false;
      // release: pairs with the acquire loads below; kicked_ is read after it.
      done_.store(true, std::memory_order_release);
    });
  }
  gated_adder(const gated_adder&) = delete;
  gated_adder& operator=(const gated_adder&) = delete;
  ~gated_adder() { (void)finish(); }

  // True once the add has pushed and stopped; false if it returned without stopping.
  bool stopped() const {
    // acquire: pairs with the release stores of stopped and done_.
    const bool settled = eventually([this] {
      return gated_atomics::stopped.load(std::memory_order_acquire) ||
             done_.load(std::memory_order_acquire);
    });
    return settled && gated_atomics::stopped.load(std::memory_order_acquire);
  }

  // Lets the add go on and returns what it returned.
  bool finish() {
    gated_atomics::release();
    if (thread_.joinable()) thread_.join();
    return kicked_;
  }

 private:
  std::thread thread_;
  std::atomic<bool> done_{false};
  bool kicked_ = false;
};

TEST(ShardedLlistSummaryTest, ANodeWhoseAdderHasNotFlaggedYetIsTakenByADelAllThatFindsNoFlag) {
  // The adder may never get to its flag (a parent's thread in a fork child): a del_all that
  // reads the summary word as zero looks at every shard, so nothing is stranded.
  gated_list list(16);
  item a{1};
  gated_adder adder(list, 2, a);
  ASSERT_TRUE(adder.stopped()) << "the add returned without a compare-and-swap of the summary word";
  EXPECT_EQ(ids_of(list.del_all()), std::vector<int>{1});
  EXPECT_TRUE(adder.finish()) << "its flag found the word zero: a spurious kick, never a missing one";
  EXPECT_TRUE(list.del_all().empty()) << "the late flag names an empty shard";
  EXPECT_TRUE(list.empty());
}

TEST(ShardedLlistSummaryTest, ANodeBehindAPendingFlagIsTakenAfterItsAdderFlags) {
  // While another shard is flagged, del_all visits only that one; the stopped adder's flag,
  // once set, kicks (the word was cleared meanwhile), and the next del_all takes the node.
  gated_list list(16);
  item a{1}, b{2};
  gated_adder adder(list, 2, a);
  ASSERT_TRUE(adder.stopped()) << "the add returned without a compare-and-swap of the summary word";
  EXPECT_TRUE(list.add_to(5, b)) << "the stopped add has not claimed the kick";
  EXPECT_EQ(ids_of(list.del_all()), std::vector<int>{2});
  EXPECT_TRUE(adder.finish()) << "the consumer must come back for the node";
  EXPECT_EQ(ids_of(list.del_all()), std::vector<int>{1});
  EXPECT_TRUE(list.empty());
}

TEST(ShardedLlistSummaryTest, DelAllOldestFirstTrustsTheFlagsAndItsSweepTakesAnUnflaggedShard) {
  // Shard 2's adder stopped between its push and its flag; shard 5 and 11 are flagged.
  gated_list list(16);
  item a{1}, b{2}, c{3}, d{4}, e{5};
  gated_adder adder(list, 2, a);
  ASSERT_TRUE(adder.stopped()) << "the add returned without a compare-and-swap of the summary word";
  list.add_to(11, b);
  list.add_to(5, c);
  list.add_to(11, d);
  list.add_to(2, e);  // behind a, on the unflagged shard: its add does not flag either
  EXPECT_EQ(ids_of(list.del_all_oldest_first()), (std::vector<int>{3, 2, 4}))
      << "a flagged take visits only the flagged shards";
  list.add_to(5, b);
  EXPECT_EQ(ids_of(list.del_all_sweep_oldest_first()), (std::vector<int>{1, 5, 2}))
      << "a sweep takes the unflagged shard too, oldest first, in shard order";
  (void)adder.finish();
  EXPECT_TRUE(list.del_all_oldest_first().empty());
  EXPECT_TRUE(list.empty());
}

TEST(ShardedLlistSummaryTest, DelAllOldestFirstThatFindsNoFlagTakesAnUnflaggedShard) {
  gated_list list(16);
  item a{1}, b{2};
  gated_adder adder(list, 7, a);
  ASSERT_TRUE(adder.stopped()) << "the add returned without a compare-and-swap of the summary word";
  list.add_to(7, b);
  EXPECT_EQ(ids_of(list.del_all_oldest_first()), (std::vector<int>{1, 2}));
  (void)adder.finish();
  EXPECT_TRUE(list.empty());
}

// --- add_batch -----------------------------------------------------------------------------

TYPED_TEST(ShardedLlistTest, AddBatchPublishesTheWholeChainOnTheCallersShard) {
  typename TestFixture::list list(4);
  item a{1}, b{2}, c{3};
  typename TestFixture::chain chain;
  chain.push_front(a);
  chain.push_front(b);
  EXPECT_TRUE(list.add_batch(std::move(chain)));
  EXPECT_TRUE(chain.empty());  // NOLINT(bugprone-use-after-move): add_batch leaves it empty
  list.add_to(list.this_thread_shard(), c);
  EXPECT_EQ(ids_of(list.del_all()), (std::vector<int>{3, 2, 1}));
}

TYPED_TEST(ShardedLlistTest, AddBatchReturnsFalseWhileTheKickIsPending) {
  typename TestFixture::list list(4);
  item a{1}, b{2};
  EXPECT_TRUE(list.add_to(list.this_thread_shard() + 1, a));
  typename TestFixture::chain chain;
  chain.push_back(b);
  EXPECT_FALSE(list.add_batch(std::move(chain)));
  EXPECT_EQ(ids_of(list.del_all()).size(), 2u);
}

TYPED_TEST(ShardedLlistTest, AddBatchOfEmptyChainIsANoOpReturningFalse) {
  typename TestFixture::list list(4);
  typename TestFixture::chain chain;
  EXPECT_FALSE(list.add_batch(std::move(chain)));
  EXPECT_TRUE(list.empty());
  item a{1};
  EXPECT_TRUE(list.add(a)) << "an empty chain must not claim the kick";
  (void)ids_of(list.del_all());
}

// --- llist_batch::append -------------------------------------------------------------------

using std_list = llist<item, &item::hook>;

TEST(LlistBatchAppend, PutsTheOtherBatchBehindThisOne) {
  std_list first, second;
  item a{1}, b{2}, c{3}, d{4};
  first.add(a);
  first.add(b);
  second.add(c);
  second.add(d);
  item_batch front = first.del_all();
  front.append(second.del_all());
  EXPECT_EQ(ids_of(front), (std::vector<int>{2, 1, 4, 3}));
}

TEST(LlistBatchAppend, LeavesTheOtherBatchEmpty) {
  std_list list;
  item a{1};
  list.add(a);
  item_batch front;
  item_batch other = list.del_all();
  front.append(std::move(other));
  EXPECT_TRUE(other.empty());  // NOLINT(bugprone-use-after-move): append leaves it empty
  EXPECT_EQ(ids_of(front), std::vector<int>{1});
}

TEST(LlistBatchAppend, OfAnEmptyBatchChangesNothing) {
  std_list list;
  item a{1}, b{2};
  list.add(a);
  list.add(b);
  item_batch front = list.del_all();
  front.append(item_batch{});
  EXPECT_EQ(ids_of(front), (std::vector<int>{2, 1}));
}

TEST(LlistBatchAppend, AppendedNodesCanBeAddedAgain) {
  std_list first, second;
  item a{1}, b{2};
  first.add(a);
  second.add(b);
  item_batch front = first.del_all();
  front.append(second.del_all());
  for (item& element : front) first.add(element);
  EXPECT_EQ(ids_of(first.del_all()), (std::vector<int>{2, 1}));
}

// --- Debug checks --------------------------------------------------------------------------

struct doomed_widget {
  llist_node hook;
};

// Leaves a node on shard 2 when the list goes out of scope.
[[maybe_unused]] void destroy_a_list_that_holds_a_node() {
  doomed_widget widget;
  sharded_llist<doomed_widget, &doomed_widget::hook> list(4);
  list.add_to(2, widget);
}

TEST(ShardedLlistDeathTest, DestroyingAListThatHoldsNodesAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
#if !TEARDOWN_LLIST_CHECKS
  GTEST_SKIP() << "the llist debug checks are compiled out (NDEBUG without "
                  "TEARDOWN_LLIST_CHECKS=1)";
#elif !GTEST_HAS_DEATH_TEST
  GTEST_SKIP() << "this platform has no death tests";
#else
  EXPECT_DEATH(destroy_a_list_that_holds_a_node(),
               "llist destroyed while still holding nodes.*doomed_widget");
#endif
}

// --- Stress --------------------------------------------------------------------------------

struct stress_item {
  llist_node hook;
  // Written by the producer (plain) right before it adds the node; read (plain) by the taker,
  // so ThreadSanitizer checks the add -> del_all ordering on every node.
  std::size_t producer = 0;
  std::size_t sequence = 0;
  // Atomic so that a node handed to two takers is counted, not merely reported as a race.
  std::atomic<unsigned> taken{0};
};

class stress_nodes {
 public:
  stress_nodes(std::size_t producers, std::size_t per_producer)
      : producers_(producers),
        per_producer_(per_producer),
        nodes_(std::make_unique<stress_item[]>(producers * per_producer)) {}

  std::size_t producers() const noexcept { return producers_; }
  std::size_t per_producer() const noexcept { return per_producer_; }
  std::size_t size() const noexcept { return producers_ * per_producer_; }
  stress_item& at(std::size_t producer, std::size_t sequence) noexcept {
    return nodes_[producer * per_producer_ + sequence];
  }

  // The payload names the node's own slot: the producer's writes arrived intact.
  bool payload_matches(const stress_item& node) const noexcept {
    return node.producer < producers_ && node.sequence < per_producer_ &&
           &node == &nodes_[node.producer * per_producer_ + node.sequence];
  }

  std::size_t taken_other_than(unsigned expected) const noexcept {
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < size(); ++i) {
      if (nodes_[i].taken.load(std::memory_order_relaxed) != expected) ++wrong;
    }
    return wrong;
  }

 private:
  std::size_t producers_;
  std::size_t per_producer_;
  std::unique_ptr<stress_item[]> nodes_;
};

// What one taker saw. Per producer, the sequence numbers a taker meets must increase: a
// producer adds to one shard, and a take of a shard takes all of it.
struct taker_tally {
  explicit taker_tally(std::size_t producers) : next_sequence(producers, 0) {}

  void take(const stress_nodes& nodes, stress_item& node) {
    ++taken;
    node.taken.fetch_add(1, std::memory_order_relaxed);
    if (!nodes.payload_matches(node)) {
      ++payload_mismatches;
      return;
    }
    if (node.sequence < next_sequence[node.producer]) ++out_of_order;
    if (node.sequence != next_sequence[node.producer]) ++gaps;
    next_sequence[node.producer] = node.sequence + 1;
  }

  std::size_t taken = 0;
  std::size_t payload_mismatches = 0;
  std::size_t out_of_order = 0;  // an older node after a newer one of the same producer
  std::size_t gaps = 0;          // a node not directly after the previous one (fine with 2 takers)
  std::vector<std::size_t> next_sequence;
};

// Producer p adds nodes.at(p, 0..n) in order: even producers one by one with add, odd ones in
// chains of chain_length with add_batch; or, given a shard, every producer one by one with
// add_to(shard). `kick` runs after every add that returned true. A producer yields after each
// add so that, on a machine with fewer cores than threads, takers run between adds rather than
// after them all.
template <class List, class Kick>
void produce(List& list, stress_nodes& nodes, std::size_t producer, Kick kick,
             std::optional<std::size_t> shard = std::nullopt) {
  constexpr std::size_t chain_length = 8;
  typename List::chain chain;
  for (std::size_t i = 0; i < nodes.per_producer(); ++i) {
    stress_item& node = nodes.at(producer, i);
    node.producer = producer;
    node.sequence = i;
    if (shard) {
      if (list.add_to(*shard, node)) kick();
      std::this_thread::yield();
      continue;
    }
    if (producer % 2 == 0) {
      if (list.add(node)) kick();
      std::this_thread::yield();
      continue;
    }
    chain.push_front(node);  // the front is the newest, as on the list
    if (chain.size() == chain_length || i + 1 == nodes.per_producer()) {
      if (list.add_batch(std::move(chain))) kick();
      std::this_thread::yield();
    }
  }
}

// A pause of pseudo-random length before every read-modify-write: up to about a microsecond of
// spinning, and now and then a yield of the CPU. Run under it, a producer is often held up
// between its shard push and its exchange of the was-empty word, and a taker between its re-arm
// and its shard exchanges: the windows in which a wrong protocol loses a wake-up grow from a few
// instructions to many, on any number of cores (a bare yield returns at once on an idle core).
struct jittery_atomics {
  static void jitter() noexcept {
    thread_local std::uint32_t state = static_cast<std::uint32_t>(
        std::hash<std::thread::id>{}(std::this_thread::get_id()) | 1);
    state ^= state << 13;  // xorshift32
    state ^= state >> 17;
    state ^= state << 5;
    if (state % 16 == 0) {
      std::this_thread::yield();
      return;
    }
    volatile std::uint32_t sink = 0;
    for (std::uint32_t spin = state % 512; spin != 0; --spin) sink = spin;  // not optimized away
    (void)sink;
  }

  template <class W>
  class atomic : public std::atomic<W> {
    using base = std::atomic<W>;

   public:
    using base::base;

    W exchange(W value, std::memory_order order) noexcept {
      jitter();
      return base::exchange(value, order);
    }
    bool compare_exchange_weak(W& expected, W desired, std::memory_order success,
                               std::memory_order failure) noexcept {
      jitter();
      return base::compare_exchange_weak(expected, desired, success, failure);
    }
    // Stores too: a clear written as a load and a store would leave a window between them.
    void store(W value, std::memory_order order) noexcept {
      jitter();
      base::store(value, order);
    }
  };
};

#if TEARDOWN_AO_ATOMICS_AVAILABLE
using stress_backends =
    ::testing::Types<teardown::std_atomics, teardown::ao_atomics, jittery_atomics>;
#else
using stress_backends = ::testing::Types<teardown::std_atomics, jittery_atomics>;
#endif

template <class Atomics>
class ShardedLlistStressTest : public ::testing::Test {
 protected:
  using list = sharded_llist<stress_item, &stress_item::hook, Atomics>;

  static constexpr std::size_t producer_count = 4;
  static constexpr std::size_t nodes_per_producer = scaled(20000);

  // One consumer that sleeps (std::atomic::wait) whenever del_all comes back empty and is woken
  // only by producers whose add returned true. The consumer stops once it has taken every node;
  // if a wake-up were lost it would sleep with nodes left and no kick to come. The main thread
  // detects exactly that state (asleep, every producer done, no kick since its del_all began),
  // counts it, and kicks it so that the test ends with a failure instead of hanging.
  // shard_of(p), when given, is the shard producer p adds to (with add_to); else each adds to
  // its own (add and add_batch).
  void expect_sleeping_consumer_takes_every_node_once(
      std::size_t shards, std::size_t (*shard_of)(std::size_t) = nullptr) {
    list shared(shards);
    stress_nodes nodes(producer_count, nodes_per_producer);
    std::atomic<std::uint32_t> kicks{0};
    // 0 while the consumer is awake; 1 + the kick count its last del_all started after, once
    // that del_all came back empty and the consumer is about to wait.
    std::atomic<std::uint64_t> idle_after{0};
    std::atomic<bool> consumer_done{false};
    taker_tally tally(producer_count);

    const auto kick = [&kicks] {
      // release: pairs with the consumer's acquire load; its next del_all begins after our add.
      kicks.fetch_add(1, std::memory_order_release);
      kicks.notify_one();
    };

    std::latch start(producer_count + 1);
    std::thread consumer([&] {
      start.arrive_and_wait();
      for (;;) {
        // acquire: pairs with the kick's release (the add that kicked happens before del_all).
        const std::uint32_t seen = kicks.load(std::memory_order_acquire);
        auto batch = shared.del_all();
        if (batch.empty()) {
          if (tally.taken == nodes.size()) break;
          idle_after.store(std::uint64_t{seen} + 1, std::memory_order_release);
          kicks.wait(seen, std::memory_order_acquire);
          idle_after.store(0, std::memory_order_relaxed);
          continue;
        }
        for (stress_item& node : std::move(batch).reverse()) tally.take(nodes, node);
      }
      consumer_done.store(true, std::memory_order_release);
    });
    std::vector<std::thread> producers;
    for (std::size_t p = 0; p < producer_count; ++p) {
      producers.emplace_back([&, p] {
        start.arrive_and_wait();
        produce(shared, nodes, p, kick,
                shard_of != nullptr ? std::optional<std::size_t>(shard_of(p)) : std::nullopt);
      });
    }
    for (std::thread& producer : producers) producer.join();

    // Every add is done, so the kick count is final. A consumer idle after a del_all that began
    // with every kick already counted, yet not done, waits for a kick that will never come.
    std::size_t lost_wakeups = 0;
    while (!consumer_done.load(std::memory_order_acquire)) {
      const std::uint64_t idle = idle_after.load(std::memory_order_acquire);
      if (idle != 0 && idle - 1 == kicks.load(std::memory_order_acquire)) {
        ++lost_wakeups;
        kick();
      }
      std::this_thread::yield();
    }
    consumer.join();

    EXPECT_EQ(lost_wakeups, 0u) << "the consumer slept with nodes left and no kick pending";
    EXPECT_EQ(tally.taken, nodes.size());
    EXPECT_EQ(nodes.taken_other_than(1), 0u);
    EXPECT_EQ(tally.payload_mismatches, 0u);
    EXPECT_EQ(tally.out_of_order, 0u);
    EXPECT_EQ(tally.gaps, 0u) << "one taker must see each producer's nodes in order, none missing";
    EXPECT_GE(kicks.load(std::memory_order_relaxed), 1u);
    EXPECT_TRUE(shared.empty());
  }
};

TYPED_TEST_SUITE(ShardedLlistStressTest, stress_backends);

TYPED_TEST(ShardedLlistStressTest, SleepingConsumerIsNeverLeftAsleepWithAShardPerProducer) {
  this->expect_sleeping_consumer_takes_every_node_once(2 * TestFixture::producer_count);
}

TYPED_TEST(ShardedLlistStressTest, SleepingConsumerIsNeverLeftAsleepWithProducersSharingShards) {
  this->expect_sleeping_consumer_takes_every_node_once(2);
}

// Producers 0 to 3 on shards 0, 64, 1 and 65 of 128: two by two on one bit of the summary word.
std::size_t two_per_summary_bit(std::size_t producer) { return (producer % 2) * 64 + producer / 2; }

TYPED_TEST(ShardedLlistStressTest, SleepingConsumerIsNeverLeftAsleepWithShardsSharingASummaryBit) {
  this->expect_sleeping_consumer_takes_every_node_once(128, two_per_summary_bit);
}

// One node at a time: the producer adds node r (to shard_of(r)) only once the consumer has taken
// node r - 1, so each add races the consumer's next del_all and its fall asleep, the window in
// which a wake-up can be lost; and, when del_all finds no flag and takes a node whose flag is
// still to come, that late flag races the next clear. The producer, waiting for its node to be
// taken, detects a consumer asleep after a del_all that began with every kick counted.
template <class List>
void expect_hand_off_never_leaves_the_consumer_asleep(std::size_t shards,
                                                      std::size_t (*shard_of)(std::size_t)) {
  const std::size_t rounds = scaled(20000);
  List shared(shards);
  stress_nodes nodes(1, rounds);
  std::atomic<std::uint32_t> kicks{0};
  std::atomic<std::uint64_t> idle_after{0};  // as in the test above
  std::atomic<std::size_t> consumed{0};
  taker_tally tally(1);

  const auto kick = [&kicks] {
    // release: pairs with the consumer's acquire load; its next del_all begins after our add.
    kicks.fetch_add(1, std::memory_order_release);
    kicks.notify_one();
  };

  std::thread consumer([&] {
    for (;;) {
      // acquire: pairs with the kick's release (the add that kicked happens before del_all).
      const std::uint32_t seen = kicks.load(std::memory_order_acquire);
      auto batch = shared.del_all();
      if (batch.empty()) {
        if (tally.taken == rounds) return;
        idle_after.store(std::uint64_t{seen} + 1, std::memory_order_release);
        kicks.wait(seen, std::memory_order_acquire);
        idle_after.store(0, std::memory_order_relaxed);
        continue;
      }
      for (stress_item& node : std::move(batch).reverse()) tally.take(nodes, node);
      // release: the producer's acquire load below sees the nodes taken.
      consumed.store(tally.taken, std::memory_order_release);
    }
  });

  std::size_t lost_wakeups = 0;
  for (std::size_t r = 0; r < rounds; ++r) {
    stress_item& node = nodes.at(0, r);
    node.producer = 0;
    node.sequence = r;
    if (shared.add_to(shard_of(r), node)) kick();
    while (consumed.load(std::memory_order_acquire) <= r) {
      // acquire: pairs with the consumer's release store of idle_after, which follows its
      // store of consumed, so a consumer idle after taking node r is not mistaken for a lost one.
      const std::uint64_t idle = idle_after.load(std::memory_order_acquire);
      if (idle != 0 && idle - 1 == kicks.load(std::memory_order_acquire) &&
          consumed.load(std::memory_order_acquire) <= r) {
        ++lost_wakeups;
        kick();
      }
      std::this_thread::yield();
    }
  }
  consumer.join();

  EXPECT_EQ(lost_wakeups, 0u) << "the consumer slept with a node left and no kick pending";
  EXPECT_EQ(tally.taken, rounds);
  EXPECT_EQ(nodes.taken_other_than(1), 0u);
  EXPECT_EQ(tally.payload_mismatches, 0u);
  EXPECT_EQ(tally.gaps, 0u);
  EXPECT_TRUE(shared.empty());
}

TYPED_TEST(ShardedLlistStressTest, SleepingConsumerIsNeverLeftAsleepInAHandOffPerNode) {
  expect_hand_off_never_leaves_the_consumer_asleep<typename TestFixture::list>(
      4, [](std::size_t round) { return round; });
}

TYPED_TEST(ShardedLlistStressTest, SleepingConsumerIsNeverLeftAsleepInAHandOffAcrossSummaryBits) {
  // Rounds alternate between shards 64 apart (one summary bit) and move on every two rounds.
  expect_hand_off_never_leaves_the_consumer_asleep<typename TestFixture::list>(
      128, [](std::size_t round) { return (round % 2) * 64 + (round / 2) % 4; });
}

// taker_count threads poll del_all (never sleeping) while producer_count producers add
// per_producer nodes each, to their own shards, or to shard_of(p) when given. Bounded by the
// node count: each taker stops at the first empty del_all that began after every add.
template <class List>
void expect_takers_take_every_node_exactly_once(std::size_t shards, std::size_t producer_count,
                                                std::size_t taker_count, std::size_t per_producer,
                                                std::size_t (*shard_of)(std::size_t) = nullptr) {
  List shared(shards);
  stress_nodes nodes(producer_count, per_producer);
  std::atomic<std::size_t> producers_finished{0};
  std::vector<taker_tally> tallies(taker_count, taker_tally(producer_count));

  std::latch start(static_cast<std::ptrdiff_t>(producer_count + taker_count));
  std::vector<std::thread> threads;
  for (std::size_t c = 0; c < taker_count; ++c) {
    threads.emplace_back([&, c] {
      start.arrive_and_wait();
      std::size_t empty_polls = 0;
      for (;;) {
        // acquire: pairs with each producer's release increment. Read before del_all: if every
        // add happened before this del_all and it came back empty, nothing is left for us.
        const bool all_added =
            producers_finished.load(std::memory_order_acquire) == producer_count;
        auto batch = shared.del_all();
        if (batch.empty()) {
          if (all_added) return;
          if (++empty_polls % 8 == 0) std::this_thread::yield();
          continue;
        }
        for (stress_item& node : std::move(batch).reverse()) tallies[c].take(nodes, node);
      }
    });
  }
  for (std::size_t p = 0; p < producer_count; ++p) {
    threads.emplace_back([&, p] {
      start.arrive_and_wait();
      produce(shared, nodes, p, [] {},
              shard_of != nullptr ? std::optional<std::size_t>(shard_of(p)) : std::nullopt);
      // release: a taker that sees every producer finished also sees all their adds.
      producers_finished.fetch_add(1, std::memory_order_release);
    });
  }
  for (std::thread& thread : threads) thread.join();

  std::size_t taken = 0;
  for (const taker_tally& tally : tallies) {
    taken += tally.taken;
    EXPECT_EQ(tally.payload_mismatches, 0u);
    EXPECT_EQ(tally.out_of_order, 0u) << "a taker saw a producer's older node after a newer one";
  }
  EXPECT_EQ(taken, nodes.size());
  EXPECT_EQ(nodes.taken_other_than(1), 0u) << "a node went to two takers, or to none";
  EXPECT_TRUE(shared.empty());
}

TYPED_TEST(ShardedLlistStressTest, TwoDelAllCallersTakeEveryNodeExactlyOnce) {
  expect_takers_take_every_node_exactly_once<typename TestFixture::list>(
      TestFixture::producer_count, TestFixture::producer_count, 2, TestFixture::nodes_per_producer);
}

// Producers 0 to 7 on shards 0, 64, 128, 192, 1, 65, 129 and 193 of 256: four on each of two bits
// of the summary word, one in each group of 64 shards.
std::size_t four_per_summary_bit(std::size_t producer) { return (producer % 4) * 64 + producer / 4; }

TYPED_TEST(ShardedLlistStressTest, ManyProducersAndTwoTakersAcrossSummaryBitsTakeEveryNodeOnce) {
  // Every add races both takers' clears and shard exchanges; a flag wiped without its shard
  // taken, or a node taken twice, shows as a count other than 1 (or a taker that never stops).
  expect_takers_take_every_node_exactly_once<typename TestFixture::list>(
      256, 8, 2, TestFixture::nodes_per_producer / 4, four_per_summary_bit);
}

TYPED_TEST(ShardedLlistStressTest, ManyProducersOnTheirOwnShardsAndOneTakerTakeEveryNodeOnce) {
  expect_takers_take_every_node_exactly_once<typename TestFixture::list>(
      16, 8, 1, TestFixture::nodes_per_producer / 2);
}

}  // namespace
}  // namespace teardown_test
