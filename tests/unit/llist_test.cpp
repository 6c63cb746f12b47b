// Single-threaded specification of teardown::llist, llist_batch and llist_chain, run on every
// Atomics backend; the debug checks are covered by death tests at the end. The concurrent
// behaviour is in llist_stress_test.cpp.
#include "teardown/llist.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "llist_test_support.hpp"
#include "test_support.hpp"

#if defined(__SANITIZE_ADDRESS__)
#define TEARDOWN_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEARDOWN_TEST_ASAN 1
#endif
#endif
#ifdef TEARDOWN_TEST_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace teardown_test {
namespace {

using teardown::llist;
using teardown::llist_node;

// An element that sits on two lists at once through two hooks.
struct two_hook_item {
  explicit two_hook_item(int id_) : id(id_) {}
  int id;
  llist_node first_hook;
  llist_node second_hook;
};

template <class List>
std::vector<int> take_all_ids(List& list) {
  return ids_of(list.del_all());
}

template <class Atomics>
class LlistTest : public ::testing::Test {
 protected:
  using list = llist<item, &item::hook, Atomics>;
  using batch = typename list::batch;
  using chain = typename list::chain;
};

TYPED_TEST_SUITE(LlistTest, atomics_backends);

// --- Types ---------------------------------------------------------------------------------

using std_list = llist<item, &item::hook>;

TEST(LlistTypes, DefaultAtomicsPolicyIsStdAtomics) {
  static_assert(std::is_same_v<std_list, llist<item, &item::hook, teardown::std_atomics>>);
}

TEST(LlistTypes, BatchIsMoveOnly) {
  static_assert(!std::is_copy_constructible_v<item_batch>);
  static_assert(!std::is_copy_assignable_v<item_batch>);
  static_assert(std::is_nothrow_move_constructible_v<item_batch>);
  static_assert(std::is_nothrow_move_assignable_v<item_batch>);
  static_assert(std::is_same_v<std_list::batch, item_batch>);
}

TEST(LlistTypes, ChainIsMoveOnly) {
  static_assert(!std::is_copy_constructible_v<item_chain>);
  static_assert(!std::is_copy_assignable_v<item_chain>);
  static_assert(std::is_nothrow_move_constructible_v<item_chain>);
  static_assert(std::is_nothrow_move_assignable_v<item_chain>);
  static_assert(std::is_same_v<std_list::chain, item_chain>);
}

TEST(LlistTypes, ListIsNeitherCopyableNorMovable) {
  static_assert(!std::is_copy_constructible_v<std_list>);
  static_assert(!std::is_copy_assignable_v<std_list>);
  static_assert(!std::is_move_constructible_v<std_list>);
  static_assert(!std::is_move_assignable_v<std_list>);
}

TEST(LlistTypes, RangeForOverBatchYieldsElementReferences) {
  using reference = decltype(*std::declval<item_batch&>().begin());
  static_assert(std::is_same_v<reference, item&>);
}

TEST(LlistTypes, NodeIsDefaultConstructibleAndCopyable) {
  static_assert(std::is_nothrow_default_constructible_v<llist_node>);
  static_assert(std::is_nothrow_copy_constructible_v<llist_node>);
  static_assert(std::is_nothrow_copy_assignable_v<llist_node>);
}

// --- add, empty, del_all ---------------------------------------------------------------------

TYPED_TEST(LlistTest, NewListIsEmpty) {
  typename TestFixture::list list;
  EXPECT_TRUE(list.empty());
}

TYPED_TEST(LlistTest, ListIsNotEmptyAfterAdd) {
  item a{1};
  typename TestFixture::list list;
  list.add(a);
  EXPECT_FALSE(list.empty());
  take_all_ids(list);
}

TYPED_TEST(LlistTest, AddReturnsTrueOnlyWhenListWasEmpty) {
  item a{1}, b{2}, c{3};
  typename TestFixture::list list;
  EXPECT_TRUE(list.add(a));
  EXPECT_FALSE(list.add(b));
  EXPECT_FALSE(list.add(c));
  take_all_ids(list);
}

TYPED_TEST(LlistTest, AddReturnsTrueAgainAfterDelAllEmptiedTheList) {
  item a{1}, b{2};
  typename TestFixture::list list;
  list.add(a);
  take_all_ids(list);
  EXPECT_TRUE(list.add(b));
  take_all_ids(list);
}

TYPED_TEST(LlistTest, DelAllYieldsNewestFirst) {
  item a{1}, b{2}, c{3};
  typename TestFixture::list list;
  list.add(a);
  list.add(b);
  list.add(c);
  EXPECT_EQ(take_all_ids(list), (std::vector<int>{3, 2, 1}));
}

TYPED_TEST(LlistTest, DelAllLeavesTheListEmpty) {
  item a{1}, b{2};
  typename TestFixture::list list;
  list.add(a);
  list.add(b);
  auto batch = list.del_all();
  EXPECT_TRUE(list.empty());
  EXPECT_TRUE(list.del_all().empty());
  ids_of(batch);
}

TYPED_TEST(LlistTest, DelAllOnEmptyListReturnsEmptyBatch) {
  typename TestFixture::list list;
  auto batch = list.del_all();
  EXPECT_TRUE(batch.empty());
  EXPECT_EQ(batch.size(), 0u);
  EXPECT_EQ(batch.pop_front(), nullptr);
}

TYPED_TEST(LlistTest, ElementTakenByDelAllCanBeAddedAgain) {
  item a{1};
  typename TestFixture::list list;
  list.add(a);
  take_all_ids(list);
  list.add(a);
  EXPECT_EQ(take_all_ids(list), (std::vector<int>{1}));
}

// --- llist_batch -----------------------------------------------------------------------------

TYPED_TEST(LlistTest, ReverseYieldsOldestFirst) {
  item a{1}, b{2}, c{3};
  typename TestFixture::list list;
  list.add(a);
  list.add(b);
  list.add(c);
  EXPECT_EQ(ids_of(list.del_all().reverse()), (std::vector<int>{1, 2, 3}));
}

TYPED_TEST(LlistTest, ReverseLeavesTheSourceBatchEmpty) {
  item a{1}, b{2};
  typename TestFixture::list list;
  list.add(a);
  list.add(b);
  auto batch = list.del_all();
  auto reversed = std::move(batch).reverse();
  EXPECT_TRUE(batch.empty());  // NOLINT(bugprone-use-after-move): reverse() documents this
  EXPECT_EQ(ids_of(reversed), (std::vector<int>{1, 2}));
}

TYPED_TEST(LlistTest, ReverseOfEmptyBatchIsEmpty) {
  typename TestFixture::list list;
  EXPECT_TRUE(list.del_all().reverse().empty());
}

TYPED_TEST(LlistTest, BatchSizeCountsItsNodes) {
  item a{1}, b{2}, c{3};
  typename TestFixture::list list;
  list.add(a);
  list.add(b);
  list.add(c);
  auto batch = list.del_all();
  EXPECT_EQ(batch.size(), 3u);
  EXPECT_FALSE(batch.empty());
  ids_of(batch);
}

TYPED_TEST(LlistTest, BatchPopFrontTakesNewestThenReturnsNullWhenEmpty) {
  item a{1}, b{2};
  typename TestFixture::list list;
  list.add(a);
  list.add(b);
  auto batch = list.del_all();
  EXPECT_EQ(batch.pop_front(), &b);
  EXPECT_EQ(batch.size(), 1u);
  EXPECT_EQ(batch.pop_front(), &a);
  EXPECT_TRUE(batch.empty());
  EXPECT_EQ(batch.pop_front(), nullptr);
}

TYPED_TEST(LlistTest, BatchMoveConstructionTransfersItsNodes) {
  item a{1}, b{2};
  typename TestFixture::list list;
  list.add(a);
  list.add(b);
  auto source = list.del_all();
  auto target = std::move(source);
  EXPECT_TRUE(source.empty());  // NOLINT(bugprone-use-after-move): a moved-from batch is empty
  EXPECT_EQ(ids_of(target), (std::vector<int>{2, 1}));
}

TYPED_TEST(LlistTest, BatchMoveAssignmentTransfersItsNodes) {
  item a{1}, b{2};
  typename TestFixture::list list;
  list.add(a);
  list.add(b);
  auto source = list.del_all();
  typename TestFixture::batch target;
  target = std::move(source);
  EXPECT_TRUE(source.empty());  // NOLINT(bugprone-use-after-move): a moved-from batch is empty
  EXPECT_EQ(ids_of(target), (std::vector<int>{2, 1}));
}

TYPED_TEST(LlistTest, DefaultConstructedBatchIsEmpty) {
  typename TestFixture::batch batch;
  EXPECT_TRUE(batch.empty());
  EXPECT_TRUE(batch.begin() == batch.end());
}

TYPED_TEST(LlistTest, RangeForBodyMayDestroyTheElement) {
  typename TestFixture::list list;
  for (int id = 1; id <= 5; ++id) list.add(*new item{id});
  std::vector<int> seen;
  for (item& element : list.del_all()) {
    seen.push_back(element.id);
    delete &element;  // ASan reports a use after free if iteration touches it again
  }
  EXPECT_EQ(seen, (std::vector<int>{5, 4, 3, 2, 1}));
}

TYPED_TEST(LlistTest, RangeForBodyMayAddTheElementBackToTheSameList) {
  item a{1}, b{2}, c{3};
  typename TestFixture::list list;
  list.add(a);
  list.add(b);
  list.add(c);
  for (item& element : list.del_all()) list.add(element);
  // Taken newest first (3, 2, 1) and re-added in that order, so 1 is now the newest.
  EXPECT_EQ(take_all_ids(list), (std::vector<int>{1, 2, 3}));
}

TYPED_TEST(LlistTest, RangeForBodyMayAddTheElementToAnotherList) {
  item a{1}, b{2}, c{3};
  typename TestFixture::list from;
  typename TestFixture::list to;
  from.add(a);
  from.add(b);
  from.add(c);
  for (item& element : from.del_all().reverse()) to.add(element);
  EXPECT_TRUE(from.empty());
  EXPECT_EQ(take_all_ids(to), (std::vector<int>{3, 2, 1}));
}

TYPED_TEST(LlistTest, RangeForLeftEarlyLeavesTheRestInTheBatch) {
  item a{1}, b{2}, c{3};
  typename TestFixture::list list;
  list.add(a);
  list.add(b);
  list.add(c);
  auto batch = list.del_all();
  for (item& element : batch) {
    if (element.id == 3) break;
  }
  EXPECT_EQ(ids_of(batch), (std::vector<int>{2, 1}));
}

// --- llist_batch::append and prepend_reversed: joins that walk as little as they can ----------

TYPED_TEST(LlistTest, AppendOfAnEmptyBatchKeepsThisBatchAsItWas) {
  item a{1}, b{2};
  typename TestFixture::list list;
  list.add(a);
  list.add(b);
  auto batch = list.del_all();
  batch.append(typename TestFixture::batch{});
  EXPECT_EQ(ids_of(batch), (std::vector<int>{2, 1}));
}

TYPED_TEST(LlistTest, AppendOntoAnEmptyBatchTakesTheOtherWhole) {
  item a{1}, b{2};
  typename TestFixture::list list;
  list.add(a);
  list.add(b);
  typename TestFixture::batch batch;
  auto other = list.del_all();
  batch.append(std::move(other));
  EXPECT_TRUE(other.empty());  // NOLINT(bugprone-use-after-move): append leaves it empty
  EXPECT_EQ(ids_of(batch), (std::vector<int>{2, 1}));
}

TYPED_TEST(LlistTest, AppendOfTwoEmptyBatchesIsEmpty) {
  typename TestFixture::batch batch;
  batch.append(typename TestFixture::batch{});
  EXPECT_TRUE(batch.empty());
}

// What "no walk" means is observable only under AddressSanitizer: the nodes of the batch that
// is appended to are poisoned, so any read of their links aborts the test. Elsewhere this test
// checks only the order (the poisoning is a no-op).
TYPED_TEST(LlistTest, AppendOfAnEmptyBatchReadsNoNodeOfThisBatch) {
  auto a = std::make_unique<item>(1);
  auto b = std::make_unique<item>(2);
  typename TestFixture::list list;
  list.add(*a);
  list.add(*b);
  auto batch = list.del_all();
#ifdef TEARDOWN_TEST_ASAN
  ASAN_POISON_MEMORY_REGION(&a->hook, sizeof a->hook);
  ASAN_POISON_MEMORY_REGION(&b->hook, sizeof b->hook);
#endif
  batch.append(typename TestFixture::batch{});
#ifdef TEARDOWN_TEST_ASAN
  ASAN_UNPOISON_MEMORY_REGION(&a->hook, sizeof a->hook);
  ASAN_UNPOISON_MEMORY_REGION(&b->hook, sizeof b->hook);
#endif
  EXPECT_EQ(ids_of(batch), (std::vector<int>{2, 1}));
}

TYPED_TEST(LlistTest, PrependReversedReadsNoNodeOfThisBatch) {
  auto a = std::make_unique<item>(1);
  auto b = std::make_unique<item>(2);
  item c{3}, d{4};
  typename TestFixture::list list, run;
  list.add(*a);
  list.add(*b);
  run.add(c);
  run.add(d);
  auto batch = list.del_all();  // 2, 1
#ifdef TEARDOWN_TEST_ASAN
  ASAN_POISON_MEMORY_REGION(&a->hook, sizeof a->hook);
  ASAN_POISON_MEMORY_REGION(&b->hook, sizeof b->hook);
#endif
  batch.prepend_reversed(run.del_all());  // 4, 3 reversed: 3, 4
#ifdef TEARDOWN_TEST_ASAN
  ASAN_UNPOISON_MEMORY_REGION(&a->hook, sizeof a->hook);
  ASAN_UNPOISON_MEMORY_REGION(&b->hook, sizeof b->hook);
#endif
  EXPECT_EQ(ids_of(batch), (std::vector<int>{3, 4, 2, 1}));
}

TYPED_TEST(LlistTest, PrependReversedLeavesTheRunEmpty) {
  item a{1};
  typename TestFixture::list list;
  list.add(a);
  typename TestFixture::batch batch;
  auto run = list.del_all();
  batch.prepend_reversed(std::move(run));
  EXPECT_TRUE(run.empty());  // NOLINT(bugprone-use-after-move): prepend_reversed leaves it empty
  EXPECT_EQ(ids_of(batch), std::vector<int>{1});
}

TYPED_TEST(LlistTest, PrependReversedOfAnEmptyRunChangesNothing) {
  item a{1}, b{2};
  typename TestFixture::list list;
  list.add(a);
  list.add(b);
  auto batch = list.del_all();
  batch.prepend_reversed(typename TestFixture::batch{});
  EXPECT_EQ(ids_of(batch), (std::vector<int>{2, 1}));
}

// --- llist_chain and add_batch ---------------------------------------------------------------

TYPED_TEST(LlistTest, AddBatchReturnsTrueWhenListWasEmpty) {
  item a{1}, b{2};
  typename TestFixture::list list;
  typename TestFixture::chain chain;
  chain.push_front(a);
  chain.push_front(b);
  EXPECT_TRUE(list.add_batch(std::move(chain)));
  take_all_ids(list);
}

TYPED_TEST(LlistTest, AddBatchReturnsFalseWhenListHeldNodes) {
  item a{1}, b{2};
  typename TestFixture::list list;
  list.add(a);
  typename TestFixture::chain chain;
  chain.push_front(b);
  EXPECT_FALSE(list.add_batch(std::move(chain)));
  take_all_ids(list);
}

TYPED_TEST(LlistTest, AddBatchPublishesTheWholeChain) {
  item a{1}, b{2}, c{3};
  typename TestFixture::list list;
  typename TestFixture::chain chain;
  chain.push_front(a);
  chain.push_front(b);
  chain.push_front(c);
  list.add_batch(std::move(chain));
  auto batch = list.del_all();
  EXPECT_EQ(batch.size(), 3u);
  ids_of(batch);
}

TYPED_TEST(LlistTest, AddBatchLeavesTheChainEmpty) {
  item a{1}, b{2};
  typename TestFixture::list list;
  typename TestFixture::chain chain;
  chain.push_front(a);
  chain.push_back(b);
  list.add_batch(std::move(chain));
  EXPECT_TRUE(chain.empty());  // NOLINT(bugprone-use-after-move): add_batch documents this
  EXPECT_EQ(chain.size(), 0u);
  take_all_ids(list);
}

TYPED_TEST(LlistTest, AddBatchOfEmptyChainOnEmptyListIsNoOpReturningFalse) {
  typename TestFixture::list list;
  EXPECT_FALSE(list.add_batch(typename TestFixture::chain{}));
  EXPECT_TRUE(list.empty());
}

TYPED_TEST(LlistTest, AddBatchOfEmptyChainLeavesListUnchanged) {
  item a{1}, b{2};
  typename TestFixture::list list;
  list.add(a);
  list.add(b);
  EXPECT_FALSE(list.add_batch(typename TestFixture::chain{}));
  EXPECT_EQ(take_all_ids(list), (std::vector<int>{2, 1}));
}

TYPED_TEST(LlistTest, ChainPushFrontOrderMatchesSuccessiveAdds) {
  item a{1}, b{2};
  typename TestFixture::list list;
  typename TestFixture::chain chain;
  chain.push_front(a);
  chain.push_front(b);
  list.add_batch(std::move(chain));
  // As add(a), add(b): b is the newest.
  EXPECT_EQ(take_all_ids(list), (std::vector<int>{2, 1}));
}

TYPED_TEST(LlistTest, ChainPushBackAppendsAnOlderElement) {
  item a{1}, b{2}, c{3};
  typename TestFixture::list list;
  typename TestFixture::chain chain;
  chain.push_back(a);
  chain.push_back(b);
  chain.push_front(c);
  list.add_batch(std::move(chain));
  EXPECT_EQ(take_all_ids(list), (std::vector<int>{3, 1, 2}));
}

TYPED_TEST(LlistTest, AddBatchPutsTheChainInFrontOfExistingNodes) {
  item a{1}, b{2}, c{3}, d{4};
  typename TestFixture::list list;
  list.add(a);
  list.add(b);
  typename TestFixture::chain chain;
  chain.push_front(c);
  chain.push_front(d);
  list.add_batch(std::move(chain));
  EXPECT_EQ(take_all_ids(list), (std::vector<int>{4, 3, 2, 1}));
}

TYPED_TEST(LlistTest, ChainSizeCountsItsNodes) {
  item a{1}, b{2}, c{3};
  typename TestFixture::chain chain;
  EXPECT_TRUE(chain.empty());
  chain.push_front(a);
  chain.push_back(b);
  chain.push_front(c);
  EXPECT_FALSE(chain.empty());
  EXPECT_EQ(chain.size(), 3u);
  typename TestFixture::list list;
  list.add_batch(std::move(chain));
  take_all_ids(list);
}

TYPED_TEST(LlistTest, ChainForEachVisitsFrontToBackAndLeavesTheChainAsItWas) {
  item a{1}, b{2}, c{3};
  typename TestFixture::chain chain;
  chain.push_back(a);
  chain.push_back(b);
  chain.push_front(c);
  std::vector<int> seen;
  chain.for_each([&](item& element) { seen.push_back(element.id); });
  EXPECT_EQ(seen, (std::vector<int>{3, 1, 2}));
  EXPECT_EQ(chain.size(), 3u);
  typename TestFixture::list list;
  list.add_batch(std::move(chain));
  EXPECT_EQ(take_all_ids(list), (std::vector<int>{3, 1, 2}));
}

TYPED_TEST(LlistTest, ChainPopFrontUnlinksTheFrontAndEmptiesTheChain) {
  item a{1}, b{2};
  typename TestFixture::chain chain;
  EXPECT_EQ(chain.pop_front(), nullptr);
  chain.push_back(a);
  chain.push_back(b);
  EXPECT_EQ(chain.pop_front(), &a);
  EXPECT_EQ(chain.pop_front(), &b);
  EXPECT_EQ(chain.pop_front(), nullptr);
  EXPECT_TRUE(chain.empty());
  chain.push_back(a);  // popped nodes are unlinked: they may join a chain again
  EXPECT_EQ(chain.size(), 1u);
  typename TestFixture::list list;
  list.add(b);
  list.add_batch(std::move(chain));
  EXPECT_EQ(take_all_ids(list), (std::vector<int>{1, 2}));
}

TYPED_TEST(LlistTest, ChainMoveTransfersItsNodes) {
  item a{1}, b{2};
  typename TestFixture::chain source;
  source.push_back(a);
  source.push_back(b);
  typename TestFixture::chain moved = std::move(source);
  typename TestFixture::chain assigned;
  assigned = std::move(moved);
  EXPECT_TRUE(source.empty());  // NOLINT(bugprone-use-after-move): a moved-from chain is empty
  EXPECT_TRUE(moved.empty());   // NOLINT(bugprone-use-after-move)
  typename TestFixture::list list;
  list.add_batch(std::move(assigned));
  EXPECT_EQ(take_all_ids(list), (std::vector<int>{1, 2}));
}

TYPED_TEST(LlistTest, ElementsOfABatchCanFormANewChain) {
  item a{1}, b{2}, c{3};
  typename TestFixture::list list;
  list.add(a);
  list.add(b);
  list.add(c);
  typename TestFixture::chain chain;
  for (item& element : list.del_all()) chain.push_back(element);
  list.add_batch(std::move(chain));
  EXPECT_EQ(take_all_ids(list), (std::vector<int>{3, 2, 1}));
}

// --- del_first -------------------------------------------------------------------------------

TYPED_TEST(LlistTest, DelFirstPopsTheNewestElement) {
  item a{1}, b{2}, c{3};
  typename TestFixture::list list;
  list.add(a);
  list.add(b);
  list.add(c);
  EXPECT_EQ(list.del_first(), &c);
  EXPECT_EQ(list.del_first(), &b);
  EXPECT_EQ(list.del_first(), &a);
  EXPECT_TRUE(list.empty());
}

TYPED_TEST(LlistTest, DelFirstReturnsNullOnEmptyList) {
  typename TestFixture::list list;
  EXPECT_EQ(list.del_first(), nullptr);
  EXPECT_TRUE(list.empty());
}

TYPED_TEST(LlistTest, DelFirstLeavesTheOlderElementsInOrder) {
  item a{1}, b{2}, c{3};
  typename TestFixture::list list;
  list.add(a);
  list.add(b);
  list.add(c);
  EXPECT_EQ(list.del_first(), &c);
  EXPECT_EQ(take_all_ids(list), (std::vector<int>{2, 1}));
}

TYPED_TEST(LlistTest, ElementTakenByDelFirstCanBeAddedAgain) {
  item a{1}, b{2};
  typename TestFixture::list list;
  list.add(a);
  list.add(b);
  item* taken = list.del_first();
  ASSERT_EQ(taken, &b);
  EXPECT_FALSE(list.add(*taken));
  EXPECT_EQ(take_all_ids(list), (std::vector<int>{2, 1}));
}

TYPED_TEST(LlistTest, AddAfterDelFirstEmptiedTheListReturnsTrue) {
  item a{1};
  typename TestFixture::list list;
  list.add(a);
  EXPECT_EQ(list.del_first(), &a);
  EXPECT_TRUE(list.add(a));
  take_all_ids(list);
}

// --- unsynchronized_* ------------------------------------------------------------------------

TYPED_TEST(LlistTest, UnsynchronizedAddReturnsWhatAddWould) {
  item a{1}, b{2};
  typename TestFixture::list list;
  EXPECT_TRUE(list.unsynchronized_add(a));
  EXPECT_FALSE(list.unsynchronized_add(b));
  take_all_ids(list);
}

TYPED_TEST(LlistTest, UnsynchronizedAddOrdersLikeAdd) {
  item a{1}, b{2}, c{3};
  typename TestFixture::list list;
  list.unsynchronized_add(a);
  list.add(b);
  list.unsynchronized_add(c);
  EXPECT_EQ(take_all_ids(list), (std::vector<int>{3, 2, 1}));
}

TYPED_TEST(LlistTest, UnsynchronizedDelAllTakesEverythingNewestFirst) {
  item a{1}, b{2}, c{3};
  typename TestFixture::list list;
  list.add(a);
  list.add(b);
  list.add(c);
  EXPECT_EQ(ids_of(list.unsynchronized_del_all()), (std::vector<int>{3, 2, 1}));
  EXPECT_TRUE(list.empty());
}

TYPED_TEST(LlistTest, UnsynchronizedDelAllOnEmptyListReturnsEmptyBatch) {
  typename TestFixture::list list;
  EXPECT_TRUE(list.unsynchronized_del_all().empty());
}

// --- Hooks and copies ------------------------------------------------------------------------

template <class Atomics>
using first_list = llist<two_hook_item, &two_hook_item::first_hook, Atomics>;
template <class Atomics>
using second_list = llist<two_hook_item, &two_hook_item::second_hook, Atomics>;

TYPED_TEST(LlistTest, ElementCanBeOnTwoListsThroughTwoHooks) {
  two_hook_item a{1}, b{2};
  first_list<TypeParam> first;
  second_list<TypeParam> second;
  first.add(a);
  first.add(b);
  second.add(b);
  second.add(a);
  EXPECT_EQ(ids_of(first.del_all()), (std::vector<int>{2, 1}));
  EXPECT_EQ(ids_of(second.del_all()), (std::vector<int>{1, 2}));
}

TYPED_TEST(LlistTest, TakingAnElementOffOneListLeavesItOnTheOther) {
  two_hook_item a{1};
  first_list<TypeParam> first;
  second_list<TypeParam> second;
  first.add(a);
  second.add(a);
  EXPECT_EQ(first.del_first(), &a);
  EXPECT_FALSE(second.empty());
  EXPECT_EQ(second.del_first(), &a);
}

TYPED_TEST(LlistTest, CopyOfAnElementOnAListCanBeAddedWhileTheOriginalStays) {
  item original{1};
  typename TestFixture::list list;
  list.add(original);
  item copy = original;
  copy.id = 2;
  EXPECT_FALSE(list.add(copy));
  EXPECT_EQ(take_all_ids(list), (std::vector<int>{2, 1}));
}

TYPED_TEST(LlistTest, CopyAssigningOntoAnElementOnAListKeepsItOnTheList) {
  item on_list{1};
  item other{2};
  typename TestFixture::list list;
  list.add(on_list);
  on_list = other;  // copies id 2, must not copy other's (unlinked) hook state
  EXPECT_EQ(take_all_ids(list), (std::vector<int>{2}));
}

TYPED_TEST(LlistTest, ListDestroyedEmptyAfterUseIsFine) {
  item a{1};
  {
    typename TestFixture::list list;
    list.add(a);
    EXPECT_EQ(list.del_first(), &a);
  }
  typename TestFixture::list again;
  EXPECT_TRUE(again.add(a));
  take_all_ids(again);
}

// --- Debug checks ----------------------------------------------------------------------------

// The element type the death tests misuse; its name must appear in every message.
struct doomed_widget {
  llist_node hook;
};

template <class Atomics>
class LlistDeathTest : public ::testing::Test {
 protected:
  using list = llist<doomed_widget, &doomed_widget::hook, Atomics>;
  using batch = typename list::batch;
  using chain = typename list::chain;

  void SetUp() override {
    // "fast" forks a process that may hold other threads' locks; ThreadSanitizer warns about
    // that, and "threadsafe" (re-execute the binary) is correct everywhere.
    GTEST_FLAG_SET(death_test_style, "threadsafe");
#if !TEARDOWN_LLIST_CHECKS
    GTEST_SKIP() << "the llist debug checks are compiled out (NDEBUG without "
                    "TEARDOWN_LLIST_CHECKS=1)";
#elif !GTEST_HAS_DEATH_TEST
    GTEST_SKIP() << "this platform has no death tests";
#endif
  }

  // The parent process never runs the death statement, so the list it set up still holds its
  // nodes: take them off so that the list's own destructor check stays quiet.
  static void drain(batch& nodes) {
    while (nodes.pop_front() != nullptr) {
    }
  }
  static void drain(list& nodes) {
    batch taken = nodes.del_all();
    drain(taken);
  }
};

TYPED_TEST_SUITE(LlistDeathTest, atomics_backends);

TYPED_TEST(LlistDeathTest, AddingANodeAlreadyOnAListAborts) {
  doomed_widget widget;
  typename TestFixture::list list;
  list.add(widget);
  EXPECT_DEATH(list.add(widget), "already on a list.*doomed_widget");
  TestFixture::drain(list);
}

TYPED_TEST(LlistDeathTest, AddingANodeAlreadyOnAnotherListAborts) {
  doomed_widget widget;
  typename TestFixture::list first;
  typename TestFixture::list second;
  first.add(widget);
  EXPECT_DEATH(second.add(widget), "already on a list.*doomed_widget");
  TestFixture::drain(first);
}

TYPED_TEST(LlistDeathTest, AddingTheOnlyNodeOfAListAgainAborts) {
  // The last node links to nullptr rather than to another node: still "on a list".
  doomed_widget widget;
  typename TestFixture::list list;
  list.add(widget);
  EXPECT_DEATH(list.add(widget), "already on a list.*doomed_widget");
  TestFixture::drain(list);
}

TYPED_TEST(LlistDeathTest, UnsynchronizedAddOfANodeOnAListAborts) {
  doomed_widget first, second;
  typename TestFixture::list list;
  list.add(first);
  list.add(second);
  EXPECT_DEATH(list.unsynchronized_add(first), "already on a list.*doomed_widget");
  TestFixture::drain(list);
}

TYPED_TEST(LlistDeathTest, AddingANodeStillInABatchAborts) {
  doomed_widget older, newer;
  typename TestFixture::list list;
  list.add(older);
  list.add(newer);
  auto batch = list.del_all();
  EXPECT_DEATH(list.add(older), "already on a list.*doomed_widget");
  EXPECT_DEATH(list.add(newer), "already on a list.*doomed_widget");
  TestFixture::drain(batch);
}

TYPED_TEST(LlistDeathTest, AddingANodeStillInAChainAborts) {
  doomed_widget front, back;
  typename TestFixture::list list;
  typename TestFixture::chain chain;
  chain.push_back(back);
  chain.push_front(front);
  EXPECT_DEATH(list.add(front), "already on a list.*doomed_widget");
  EXPECT_DEATH(list.add(back), "already on a list.*doomed_widget");
  list.add_batch(std::move(chain));
  TestFixture::drain(list);
}

TYPED_TEST(LlistDeathTest, PushingANodeAlreadyOnAListIntoAChainAborts) {
  doomed_widget widget;
  typename TestFixture::list list;
  list.add(widget);
  typename TestFixture::chain chain;
  EXPECT_DEATH(chain.push_front(widget), "already on a list.*doomed_widget");
  EXPECT_DEATH(chain.push_back(widget), "already on a list.*doomed_widget");
  TestFixture::drain(list);
}

TYPED_TEST(LlistDeathTest, PushingANodeTwiceIntoAChainAborts) {
  doomed_widget widget;
  typename TestFixture::chain chain;
  chain.push_back(widget);
  EXPECT_DEATH(chain.push_back(widget), "already on a list.*doomed_widget");
  typename TestFixture::list list;
  list.add_batch(std::move(chain));
  TestFixture::drain(list);
}

TYPED_TEST(LlistDeathTest, DestroyingAListThatHoldsNodesAborts) {
  EXPECT_DEATH(
      {
        doomed_widget widget;
        typename TestFixture::list list;
        list.add(widget);
      },
      "would be lost.*doomed_widget");
}

TYPED_TEST(LlistDeathTest, DestroyingABatchThatHoldsNodesAborts) {
  EXPECT_DEATH(
      {
        doomed_widget widget;
        typename TestFixture::list list;
        list.add(widget);
        auto batch = list.del_all();
      },
      "would be lost.*doomed_widget");
}

TYPED_TEST(LlistDeathTest, DestroyingABatchLeftEarlyByRangeForAborts) {
  EXPECT_DEATH(
      {
        doomed_widget first;
        doomed_widget second;
        typename TestFixture::list list;
        list.add(first);
        list.add(second);
        for (doomed_widget& widget : list.del_all()) {
          (void)widget;
          break;
        }
      },
      "would be lost.*doomed_widget");
}

TYPED_TEST(LlistDeathTest, DestroyingAChainThatHoldsNodesAborts) {
  EXPECT_DEATH(
      {
        doomed_widget widget;
        typename TestFixture::chain chain;
        chain.push_back(widget);
      },
      "would be lost.*doomed_widget");
}

TYPED_TEST(LlistDeathTest, MoveAssigningOverABatchThatHoldsNodesAborts) {
  EXPECT_DEATH(
      {
        doomed_widget first;
        doomed_widget second;
        typename TestFixture::list list;
        list.add(first);
        auto target = list.del_all();
        list.add(second);
        target = list.del_all();
      },
      "assigned over.*doomed_widget");
}

TYPED_TEST(LlistDeathTest, MoveAssigningOverAChainThatHoldsNodesAborts) {
  EXPECT_DEATH(
      {
        doomed_widget first;
        doomed_widget second;
        typename TestFixture::chain target;
        target.push_back(first);
        typename TestFixture::chain source;
        source.push_back(second);
        target = std::move(source);
      },
      "assigned over.*doomed_widget");
}

TYPED_TEST(LlistDeathTest, DestroyingEmptiedContainersIsSilent) {
  // The counterpart of the tests above: after the nodes were taken, nothing aborts.
  doomed_widget widget;
  {
    typename TestFixture::list list;
    typename TestFixture::chain chain;
    chain.push_back(widget);
    list.add_batch(std::move(chain));
    auto batch = list.del_all();
    EXPECT_EQ(batch.pop_front(), &widget);
  }
  SUCCEED();
}

}  // namespace
}  // namespace teardown_test

// --- on_list ---------------------------------------------------------------------------------

#include "llist_on_list_spec.hpp"  // NOLINT(bugprone-suspicious-include): shared with release_checks_test

namespace teardown_test {
namespace {

// Adding a node that is still on a list aborts in every build, not only with the debug checks:
// release_checks_test.cpp runs the same with NDEBUG. Here: the message and its element type.
TEST(LlistDoubleAddTest, AddingANodeStillOnAListAbortsNamingTheElementType) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  static_assert(noexcept(std::declval<const llist_node&>().on_list()));
  on_list_spec::widget w;
  llist<on_list_spec::widget, &on_list_spec::widget::hook> list;
  list.add(w);
  EXPECT_DEATH(list.add(w),
               "teardown: llist::add: node is already on a list, chain or batch \\(element type .*widget\\)");
  EXPECT_EQ(list.del_first(), &w);
}

}  // namespace
}  // namespace teardown_test
