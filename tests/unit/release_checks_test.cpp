// The refusals of an item added twice hold in a release build. This file is compiled with
// NDEBUG and with the llist debug checks off (TEARDOWN_LLIST_CHECKS=0), whatever the preset:
// on_list() keeps its meaning, llist's add aborts with its message, reaper and reaper_pool's
// enqueue abort with theirs, and so does async_teardown::put (the error rule's one answer).
#ifndef NDEBUG
#define NDEBUG 1
#endif
#undef TEARDOWN_LLIST_CHECKS
#define TEARDOWN_LLIST_CHECKS 0

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <thread>
#include <utility>

#include "llist_on_list_spec.hpp"  // NOLINT(bugprone-suspicious-include): on_list() with NDEBUG
#include "reaper_test_support.hpp"
#include "teardown/async_teardown.hpp"
#include "teardown/llist.hpp"
#include "teardown/reaper.hpp"
#include "teardown/reaper_pool.hpp"
#include "test_support.hpp"

namespace teardown_test {
namespace {

using namespace reaper_support;
using namespace std::chrono_literals;

static_assert(TEARDOWN_LLIST_CHECKS == 0, "built as a release build would be");

using job_pool = teardown::reaper_pool<job, &job::hook, job_fn>;

class ReleaseDoubleAddTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GTEST_FLAG_SET(death_test_style, "threadsafe");  // other threads exist: re-execute
#if !GTEST_HAS_DEATH_TEST
    GTEST_SKIP() << "this platform has no death tests";
#endif
  }

 private:
  hang_guard guard_{current_test_name()};
};

TEST_F(ReleaseDoubleAddTest, LlistAddOfANodeStillOnAListAborts) {
  on_list_spec::widget w;
  teardown::llist<on_list_spec::widget, &on_list_spec::widget::hook> list;
  list.add(w);
  EXPECT_DEATH(list.add(w), "llist::add: node is already on a list, chain or batch \\(element type .*widget\\)");
  teardown::llist_chain<on_list_spec::widget, &on_list_spec::widget::hook> chain;
  EXPECT_DEATH(chain.push_back(w), "llist_chain::push_back: node is already on a list");
  EXPECT_EQ(list.del_first(), &w);
}

TEST_F(ReleaseDoubleAddTest, ReaperEnqueueOfAnItemStillQueuedAborts) {
  auto jobs = make_jobs(1);
  job_reaper reaper(counting());
  reaper.freeze();
  reaper.enqueue(jobs[0]);
  EXPECT_DEATH(reaper.enqueue(jobs[0]),
               "teardown::reaper::enqueue: the item is already queued \\(element type .*job\\)");
  reaper.thaw();
  reaper.flush();
  EXPECT_EQ(jobs[0].runs.load(), 1);
}

TEST_F(ReleaseDoubleAddTest, ReaperPoolEnqueueOfAnItemStillQueuedAborts) {
  auto jobs = make_jobs(1);
  teardown::reaper_pool_options opts;
  opts.workers = 2;
  job_pool pool(counting(), opts);
  pool.freeze();
  pool.enqueue_to(0, jobs[0]);
  EXPECT_DEATH(pool.enqueue(jobs[0]), "teardown::reaper_pool::enqueue: the item is already queued");
  pool.thaw();
  pool.flush();
  EXPECT_EQ(jobs[0].runs.load(), 1);
}

TEST_F(ReleaseDoubleAddTest, FnMayEnqueueTheItemItIsTearingDownAgain) {
  // The worker's batch marks each item off before fn sees it, in release builds too.
  job again;
  job_reaper* self = nullptr;
  job_reaper reaper([&](job& j) {
    if (j.runs.fetch_add(1) < 2) self->enqueue(j);
  });
  self = &reaper;
  reaper.enqueue(again);
  while (again.runs.load() < 3) std::this_thread::sleep_for(100us);
  reaper.flush();
  EXPECT_EQ(again.runs.load(), 3);
}

struct counted_item {
  teardown::llist_node hook;
  std::uint64_t charge = 0;
  std::atomic<int> destroyed{0};
};
struct counted_traits {
  static std::uint64_t cost(const counted_item&) { return 10; }
  static bool eligible(const counted_item&, std::uint64_t) { return true; }
  static void prepare(counted_item&) {}
  static void destroy(counted_item& i) { i.destroyed.fetch_add(1); }
  static std::uint64_t& charge(counted_item& i) { return i.charge; }
};

TEST_F(ReleaseDoubleAddTest, AsyncTeardownPutOfAnItemStillQueuedAborts) {
  teardown::async_teardown<counted_item, &counted_item::hook, counted_traits> async({});
  counted_item i;
  async.freeze();
  ASSERT_EQ(async.put(i), teardown::decision::queued);
  EXPECT_DEATH((void)async.put(i),
               "teardown::async_teardown::put: the item is already queued \\(element type .*counted_item\\)");
  EXPECT_EQ(i.destroyed.load(), 0);
  async.thaw();
  async.flush();
  EXPECT_EQ(i.destroyed.load(), 1);
}

}  // namespace
}  // namespace teardown_test
