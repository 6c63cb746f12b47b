// Specification of llist_node::on_list(): true from the add or chain push that links a node
// until a pop (a batch's or chain's pop_front or range-for, del_first) takes it off; the same
// for sharded_llist. Included by llist_test.cpp, and by release_checks_test.cpp, which is built
// with NDEBUG: on_list() must not depend on the debug checks.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "teardown/llist.hpp"
#include "teardown/sharded_llist.hpp"
#include "test_support.hpp"

namespace teardown_test::on_list_spec {

struct widget {
  teardown::llist_node hook;
  int id = 0;
};

template <class Atomics>
class LlistOnListTest : public ::testing::Test {
 protected:
  using list = teardown::llist<widget, &widget::hook, Atomics>;
  using batch = typename list::batch;
  using chain = typename list::chain;

  // Empties the list so that its destructor (checked in debug builds) finds nothing.
  static void drain(list& nodes) {
    for (widget& w : nodes.del_all()) (void)w;
  }
};

TYPED_TEST_SUITE(LlistOnListTest, atomics_backends);

TYPED_TEST(LlistOnListTest, AFreshOrCopiedNodeIsOnNothing) {
  widget w;
  EXPECT_FALSE(w.hook.on_list());
  typename TestFixture::list list;
  list.add(w);
  const widget copy = w;  // a copy gets a fresh hook, never the original's place
  EXPECT_FALSE(copy.hook.on_list());
  EXPECT_TRUE(w.hook.on_list());
  TestFixture::drain(list);
}

TYPED_TEST(LlistOnListTest, ANodeIsOnFromItsAddUntilDelFirstTakesIt) {
  widget older, newer;
  typename TestFixture::list list;
  list.add(older);  // the last node links to nullptr: still on the list
  EXPECT_TRUE(older.hook.on_list());
  list.add(newer);
  EXPECT_TRUE(newer.hook.on_list());
  EXPECT_EQ(list.del_first(), &newer);
  EXPECT_FALSE(newer.hook.on_list());
  EXPECT_TRUE(older.hook.on_list());
  EXPECT_EQ(list.del_first(), &older);
  EXPECT_FALSE(older.hook.on_list());
}

TYPED_TEST(LlistOnListTest, ADelAllBatchKeepsItsNodesOnUntilItYieldsEachOne) {
  std::vector<widget> ws(3);
  typename TestFixture::list list;
  for (widget& w : ws) list.add(w);
  typename TestFixture::batch taken = list.del_all().reverse();
  for (const widget& w : ws) EXPECT_TRUE(w.hook.on_list()) << "on the batch";
  std::size_t yielded = 0;
  for (widget& w : taken) {
    EXPECT_EQ(&w, &ws[yielded]);
    EXPECT_FALSE(w.hook.on_list()) << "off before the loop body sees it";
    for (std::size_t later = yielded + 1; later < ws.size(); ++later) EXPECT_TRUE(ws[later].hook.on_list());
    ++yielded;
  }
  EXPECT_EQ(yielded, ws.size());
}

TYPED_TEST(LlistOnListTest, TheLoopBodyMayAddTheYieldedNodeAgain) {
  std::vector<widget> ws(3);
  typename TestFixture::list first;
  typename TestFixture::list second;
  for (widget& w : ws) first.add(w);
  for (widget& w : first.del_all()) second.add(w);
  for (const widget& w : ws) EXPECT_TRUE(w.hook.on_list());
  std::size_t moved = 0;
  for (widget& w : second.del_all()) {
    EXPECT_FALSE(w.hook.on_list());
    ++moved;
  }
  EXPECT_EQ(moved, ws.size());
}

TYPED_TEST(LlistOnListTest, AppendedBatchesKeepTheirNodesOnUntilYielded) {
  widget a, b;
  typename TestFixture::list first;
  typename TestFixture::list second;
  first.add(a);
  second.add(b);
  typename TestFixture::batch joined = first.del_all();
  joined.append(second.del_all());
  EXPECT_TRUE(a.hook.on_list());
  EXPECT_TRUE(b.hook.on_list());
  EXPECT_EQ(joined.pop_front(), &a);
  EXPECT_FALSE(a.hook.on_list());
  EXPECT_TRUE(b.hook.on_list());
  EXPECT_EQ(joined.pop_front(), &b);
  EXPECT_FALSE(b.hook.on_list());
}

TYPED_TEST(LlistOnListTest, AChainsNodesAreOnUntilPoppedAndStayOnWhenPublished) {
  widget front, back;
  typename TestFixture::chain chain;
  chain.push_back(back);
  chain.push_front(front);
  EXPECT_TRUE(front.hook.on_list());
  EXPECT_TRUE(back.hook.on_list());
  EXPECT_EQ(chain.pop_front(), &front);
  EXPECT_FALSE(front.hook.on_list());
  typename TestFixture::list list;
  list.add_batch(std::move(chain));
  EXPECT_TRUE(back.hook.on_list());
  EXPECT_EQ(list.del_all().pop_front(), &back);
  EXPECT_FALSE(back.hook.on_list());
}

TYPED_TEST(LlistOnListTest, UnsynchronizedAddAndDelAllMarkLikeTheirThreadSafeTwins) {
  widget w;
  typename TestFixture::list list;
  list.unsynchronized_add(w);
  EXPECT_TRUE(w.hook.on_list());
  typename TestFixture::batch taken = list.unsynchronized_del_all();
  EXPECT_TRUE(w.hook.on_list());
  EXPECT_EQ(taken.pop_front(), &w);
  EXPECT_FALSE(w.hook.on_list());
}

TEST(ShardedLlistOnList, ANodeIsOnFromItsAddToAnyShardUntilTheBatchYieldsIt) {
  teardown::sharded_llist<widget, &widget::hook> queue(4);
  std::vector<widget> ws(3);
  queue.add_to(0, ws[0]);
  queue.add_to(3, ws[1]);
  queue.add(ws[2]);
  for (const widget& w : ws) EXPECT_TRUE(w.hook.on_list());
  auto taken = queue.del_all();  // the shards joined into one batch
  for (const widget& w : ws) EXPECT_TRUE(w.hook.on_list());
  std::size_t yielded = 0;
  for (widget& w : taken) {
    EXPECT_FALSE(w.hook.on_list());
    ++yielded;
  }
  EXPECT_EQ(yielded, ws.size());
}

}  // namespace teardown_test::on_list_spec
