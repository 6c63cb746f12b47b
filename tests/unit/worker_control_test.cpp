// worker_control.hpp: the control surface every worker-owning type shares. Which types satisfy
// the concept (and which shapes do not), and that generic code written against the concept alone
// drives a reaper, a reaper_pool, an async_teardown and a deferred_domain alike: what was handed in
// before flush or stop is torn down exactly once, a freeze holds it back until the thaw, and
// set_nice refuses a value outside [-20, 19].
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "teardown/async_teardown.hpp"
#include "teardown/deferred.hpp"
#include "teardown/llist.hpp"
#include "teardown/reaper.hpp"
#include "teardown/reaper_pool.hpp"
#include "teardown/worker_control.hpp"

namespace teardown_test {
namespace {

using namespace std::chrono_literals;

struct item {
  teardown::llist_node hook;
  std::atomic<int>* torn_down = nullptr;
  std::uint64_t charge = 0;  // async_teardown's memoised charge
};

struct count_teardown {
  void operator()(item& i) const { i.torn_down->fetch_add(1, std::memory_order_relaxed); }
};

struct item_traits {
  std::uint64_t cost(const item&) const noexcept { return 1 << 20; }
  bool eligible(const item&, std::uint64_t) const noexcept { return true; }
  void prepare(item&) const noexcept {}
  void destroy(item& i) const noexcept { i.torn_down->fetch_add(1, std::memory_order_relaxed); }
  std::uint64_t& charge(item& i) const noexcept { return i.charge; }
};

using lone_reaper = teardown::reaper<item, &item::hook, count_teardown>;
using pool = teardown::reaper_pool<item, &item::hook, count_teardown>;
using composition = teardown::async_teardown<item, &item::hook, item_traits>;

static_assert(teardown::worker_control<lone_reaper>);
static_assert(teardown::worker_control<pool>);
static_assert(teardown::worker_control<composition>);
static_assert(teardown::worker_control<teardown::deferred_domain>);

// Shapes that are not the control surface: a missing verb, a getter that is not const.
struct no_stop_for {
  void flush();
  bool flush_for(std::chrono::milliseconds);
  void freeze();
  void thaw();
  void stop();
  int nice() const;
  bool set_nice(int);
  bool stalled() const;
  int stats() const;
};
struct mutable_nice {
  void flush();
  bool flush_for(std::chrono::milliseconds);
  void freeze();
  void thaw();
  void stop();
  bool stop_for(std::chrono::milliseconds);
  int nice();
  bool set_nice(int);
  bool stalled() const;
  int stats() const;
};
static_assert(!teardown::worker_control<no_stop_for>);
static_assert(!teardown::worker_control<mutable_nice>);
static_assert(!teardown::worker_control<int>);

// Generic code that knows only the concept.
template <teardown::worker_control C>
void renice_and_flush(C& control) {
  EXPECT_THROW((void)control.set_nice(20), std::invalid_argument);
  EXPECT_TRUE(control.set_nice(control.nice()));
  EXPECT_TRUE(control.flush_for(30s));  // a liveness bound, not a time assertion
  EXPECT_FALSE(control.stalled());
}

template <teardown::worker_control C, class Hand>
void drive_through_the_concept(C& control, Hand hand) {
  std::atomic<int> torn_down{0};
  std::vector<item> items(8);
  for (item& i : items) i.torn_down = &torn_down;
  control.freeze();
  for (std::size_t k = 0; k < 4; ++k) hand(items[k]);
  EXPECT_FALSE(control.flush_for(0ms)) << "a frozen worker tore an item down";
  EXPECT_EQ(torn_down.load(), 0);
  control.thaw();
  renice_and_flush(control);
  EXPECT_EQ(torn_down.load(), 4);
  for (std::size_t k = 4; k < items.size(); ++k) hand(items[k]);
  EXPECT_TRUE(control.stop_for(30s));
  control.stop();  // idempotent
  EXPECT_EQ(torn_down.load(), 8) << "stop left an item queued, or tore one down twice";
}

TEST(WorkerControlTest, ALoneReaperIsDrivenThroughTheConcept) {
  lone_reaper reaper(count_teardown{});
  drive_through_the_concept(reaper, [&](item& i) { reaper.enqueue(i); });
}

TEST(WorkerControlTest, AReaperPoolIsDrivenThroughTheConcept) {
  teardown::reaper_pool_options opts;
  opts.workers = 2;
  pool workers(count_teardown{}, opts);
  drive_through_the_concept(workers, [&](item& i) { workers.enqueue(i); });
}

TEST(WorkerControlTest, AnAsyncTeardownIsDrivenThroughTheConcept) {
  teardown::async_teardown_options opts;
  opts.threshold = 0;
  opts.sync_when_stalled = false;
  composition async(std::move(opts));
  drive_through_the_concept(async, [&](item& i) { EXPECT_EQ(async.put(i), teardown::decision::queued); });
}

TEST(WorkerControlTest, ADeferredDomainIsDrivenThroughTheConcept) {
  teardown::deferred_domain_options opts;
  opts.threshold = 0;
  opts.sync_when_stalled = false;
  opts.shared_budget = nullptr;  // a budget of its own
  opts.max_pending = std::uint64_t{1} << 30;
  teardown::deferred_domain domain(opts);
  drive_through_the_concept(domain, [&](item& i) {
    std::atomic<int>* counter = i.torn_down;
    struct counted {
      std::atomic<int>* counter;
      ~counted() { counter->fetch_add(1, std::memory_order_relaxed); }
    };
    EXPECT_EQ(domain.delete_object(new counted{counter}), teardown::decision::queued);
  });
}

}  // namespace
}  // namespace teardown_test
