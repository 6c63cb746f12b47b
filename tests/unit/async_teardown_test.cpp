// Specification of teardown::async_teardown, the composition: every decision put() can take and
// the order in which it takes them (toggle, cost read once, threshold and eligibility, the
// concurrency gate, stopped, stalled, the eager prepare, the budget), the memoised charge the
// reaper releases, destroy's exceptions on either side, drain(), the const_key<false> form, the
// knobs, the counters and the trace points. AsyncTeardownStressTest adds many producers racing
// toggles, drains, gate switches and shutdown.
//
// Nothing here asserts a time. A sleep is only ever a chance for a wrong implementation to
// misbehave, or the stated setup of a behaviour (the stall threshold); waits are bounded loops,
// and a hang shows as an abort from the per-test hang_guard naming the test.
#include "teardown/async_teardown.hpp"

#include <gtest/gtest.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <iterator>
#include <latch>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "reaper_test_support.hpp"
#include "test_support.hpp"

namespace teardown_test {
namespace {

using namespace std::chrono_literals;
using reaper_support::current_test_name;
using reaper_support::current_tid;
using reaper_support::hang_guard;
using teardown::async_teardown_options;
using teardown::decision;
using teardown::llist_node;
namespace trace = teardown::trace;

// What put() never wrote: a charge still holding this was never memoised.
constexpr std::uint64_t unset_charge = 0xdeadbeef;

// An item whose behaviour each test sets: its cost (which may shrink while it is queued), its
// eligibility, and what prepare and destroy do besides counting.
struct item {
  llist_node hook;
  std::uint64_t id = 0;
  std::atomic<std::uint64_t> size{0};  // the live cost: cost() and live_cost() read it
  bool eligible = true;
  std::uint64_t charge = unset_charge;
  std::uint64_t queued_at = 0;
  std::function<void(item&)> on_prepare;  // runs inside prepare; may throw or block
  std::function<void(item&)> on_destroy;  // runs inside destroy; may throw or block
  std::atomic<int> prepared{0};
  std::thread::id destroyed_on;  // written before `destroyed` is counted
  std::atomic<int> destroyed{0};
};

// What the traits saw, shared by every copy of them.
struct traits_log {
  std::atomic<int> cost_reads{0};
  std::atomic<int> eligible_calls{0};
  std::atomic<std::uint64_t> cost_seen_by_eligible{0};
  std::mutex order_mutex;
  std::vector<std::uint64_t> destroy_order;  // guarded by order_mutex
};

struct item_traits {
  traits_log* log = nullptr;

  std::uint64_t cost(const item& i) const {
    log->cost_reads.fetch_add(1);
    return i.size.load();
  }
  bool eligible(const item& i, std::uint64_t cost) const {
    log->eligible_calls.fetch_add(1);
    log->cost_seen_by_eligible.store(cost);
    return i.eligible;
  }
  void prepare(item& i) const {
    i.prepared.fetch_add(1);
    if (i.on_prepare) i.on_prepare(i);
  }
  void destroy(item& i) const {
    {
      const std::lock_guard lock(log->order_mutex);
      log->destroy_order.push_back(i.id);
    }
    i.destroyed_on = std::this_thread::get_id();
    i.destroyed.fetch_add(1);  // release: publishes destroyed_on
    if (i.on_destroy) i.on_destroy(i);
  }
  std::uint64_t& charge(item& i) const { return i.charge; }
  std::uint64_t live_cost(const item& i) const { return i.size.load(); }
  std::uint64_t id(const item& i) const { return i.id; }
  std::uint64_t& queued_at(item& i) const { return i.queued_at; }
};

using item_async = teardown::async_teardown<item, &item::hook, item_traits>;
using compiled_out_async = teardown::async_teardown<item, &item::hook, item_traits, teardown::const_key<false>>;

static_assert(!std::is_copy_constructible_v<item_async> && !std::is_copy_assignable_v<item_async>);
template <class Async>
concept switchable = requires(Async& a) {
  a.enable();
  a.disable();
  a.set_enabled(true);
};
static_assert(switchable<item_async>);
static_assert(!switchable<compiled_out_async>, "a const_key cannot be switched on");
static_assert(noexcept(std::declval<const item_async&>().stats()));

static_assert(std::string_view(teardown::to_string(decision::queued)) == "queued");
static_assert(std::string_view(teardown::to_string(decision::inline_disabled)) == "disabled");
static_assert(std::string_view(teardown::to_string(decision::inline_ineligible)) == "ineligible");
static_assert(std::string_view(teardown::to_string(decision::inline_rejected)) == "rejected");
static_assert(std::string_view(teardown::to_string(decision::inline_stalled)) == "stalled");
static_assert(std::string_view(teardown::to_string(decision::inline_stopped)) == "stopped");
static_assert(std::string_view(teardown::to_string(decision::inline_no_memory)) == "no_memory");

std::vector<item> make_items(std::initializer_list<std::uint64_t> sizes) {
  std::vector<item> items(sizes.size());
  std::size_t at = 0;
  for (std::uint64_t size : sizes) {
    items[at].id = at;
    items[at].size.store(size);
    ++at;
  }
  return items;
}


// The defaults, but a flush only waits: the tests that check an item ran on the worker, not on
// a flush that waited and helped ("Waiters help").
async_teardown_options worker_only() { return {.reaper = {.name = "async_teardown", .waiters_help = false}}; }

// A reaper whose oldest queued item counts as stalled after a millisecond.
async_teardown_options stalls_quickly(bool sync_when_stalled = true) {
  return {.sync_when_stalled = sync_when_stalled, .reaper = {.name = "async_teardown", .stall_threshold = 1ms}};
}

// --- Trace recording ---------------------------------------------------------------------------

struct reap_record {
  std::uint64_t id, charged_cost, live_cost, wait_ns;
  int cpu;
};
struct queue_record {
  std::uint64_t id, cost;
  std::int64_t tid;
  std::string thread_name;
  int cpu;
};
struct sync_record {
  std::uint64_t id, cost;
  std::string reason;
};

struct trace_log {
  std::mutex mutex;
  std::vector<queue_record> queues;
  std::vector<reap_record> reaps;
  std::vector<sync_record> syncs;
  std::vector<trace::reject_event> rejects;
};

trace_log& traced() {
  static trace_log log;
  return log;
}

// Registers a hook for each of the four events for its lifetime. The hooks are process-global,
// so it clears them (and what they recorded) on both ends.
class trace_recording {
 public:
  trace_recording() {
    clear_log();
    trace::set_hook<trace::queue_event>([](const trace::queue_event& e) {
      const std::lock_guard lock(traced().mutex);
      traced().queues.push_back({e.id, e.cost, e.tid, e.thread_name, e.cpu});
    });
    trace::set_hook<trace::reap_event>([](const trace::reap_event& e) {
      const std::lock_guard lock(traced().mutex);
      traced().reaps.push_back({e.id, e.charged_cost, e.live_cost, e.wait_ns, e.cpu});
    });
    trace::set_hook<trace::sync_event>([](const trace::sync_event& e) {
      const std::lock_guard lock(traced().mutex);
      traced().syncs.push_back({e.id, e.cost, e.reason});
    });
    trace::set_hook<trace::reject_event>([](const trace::reject_event& e) {
      const std::lock_guard lock(traced().mutex);
      traced().rejects.push_back(e);
    });
  }
  trace_recording(const trace_recording&) = delete;
  trace_recording& operator=(const trace_recording&) = delete;
  ~trace_recording() {
    trace::clear_hook<trace::queue_event>();
    trace::clear_hook<trace::reap_event>();
    trace::clear_hook<trace::sync_event>();
    trace::clear_hook<trace::reject_event>();
    clear_log();
  }

 private:
  static void clear_log() {
    const std::lock_guard lock(traced().mutex);
    traced().queues.clear();
    traced().reaps.clear();
    traced().syncs.clear();
    traced().rejects.clear();
  }
};

// --- Fixture -----------------------------------------------------------------------------------

class AsyncTeardownTest : public ::testing::Test {
 protected:
  item_traits traits() { return item_traits{&log_}; }
  traits_log& log() { return log_; }
  std::vector<std::uint64_t> destroy_order() {
    const std::lock_guard lock(log_.order_mutex);
    return log_.destroy_order;
  }

 private:
  traits_log log_;
  hang_guard guard_{current_test_name()};
};
using AsyncTeardownStressTest = AsyncTeardownTest;

// --- queued ------------------------------------------------------------------------------------

TEST_F(AsyncTeardownTest, QueuesAnEligibleItemThatFitsAndTheReaperDestroysItOnce) {
  auto items = make_items({100});
  item_async async(worker_only(), traits());
  EXPECT_EQ(async.put(items[0]), decision::queued);
  EXPECT_EQ(items[0].prepared.load(), 1);
  async.flush();
  EXPECT_EQ(items[0].destroyed.load(), 1);
  EXPECT_NE(items[0].destroyed_on, std::this_thread::get_id()) << "destroyed on the reaper";
  EXPECT_EQ(items[0].charge, 100u) << "the charge is memoised in the item";
  const teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.queued, 1u);
  EXPECT_EQ(s.inline_total, 0u);
  EXPECT_EQ(s.reaped, 1u);
  EXPECT_EQ(s.pending, 0u);
  EXPECT_EQ(s.high_water, 100u);
}

TEST_F(AsyncTeardownTest, QueuedItemWaitsBehindAFrozenReaperAndIsChargedUntilDestroyed) {
  auto items = make_items({100});
  item_async async({}, traits());
  async.freeze();
  EXPECT_EQ(async.put(items[0]), decision::queued);
  EXPECT_EQ(items[0].destroyed.load(), 0);
  EXPECT_EQ(async.stats().pending, 100u);
  async.thaw();
  async.flush();
  EXPECT_EQ(items[0].destroyed.load(), 1);
  EXPECT_EQ(async.stats().pending, 0u);
}

// --- sync_disabled -----------------------------------------------------------------------------

TEST_F(AsyncTeardownTest, DisabledTearsDownInlineWithoutReadingTheCost) {
  auto items = make_items({100});
  item_async async({.enabled = false}, traits());
  EXPECT_EQ(async.put(items[0]), decision::inline_disabled);
  EXPECT_EQ(log().cost_reads.load(), 0) << "the disabled path reads nothing";
  EXPECT_EQ(log().eligible_calls.load(), 0);
  EXPECT_EQ(items[0].prepared.load(), 0);
  EXPECT_EQ(items[0].destroyed.load(), 1) << "torn down before put returned";
  EXPECT_EQ(items[0].destroyed_on, std::this_thread::get_id());
  EXPECT_EQ(items[0].charge, unset_charge);
  const teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.inline_total, 1u);
  EXPECT_EQ(s.queued, 0u);
  EXPECT_EQ(s.inline_rejected, 0u);
  EXPECT_EQ(s.pending, 0u);
}

TEST_F(AsyncTeardownTest, EnableDisableAndSetEnabledSwitchBetweenQueuingAndInline) {
  auto items = make_items({10, 10, 10, 10, 10});
  item_async async({.enabled = false}, traits());
  EXPECT_FALSE(async.enabled());
  EXPECT_EQ(async.put(items[0]), decision::inline_disabled);
  async.enable();
  EXPECT_TRUE(async.enabled());
  EXPECT_EQ(async.put(items[1]), decision::queued);
  async.disable();
  EXPECT_FALSE(async.enabled());
  EXPECT_EQ(async.put(items[2]), decision::inline_disabled);
  async.set_enabled(true);
  EXPECT_TRUE(async.enabled());
  EXPECT_EQ(async.put(items[3]), decision::queued);
  async.set_enabled(false);
  EXPECT_EQ(async.put(items[4]), decision::inline_disabled);
  async.flush();
  for (const item& i : items) EXPECT_EQ(i.destroyed.load(), 1) << "item " << i.id;
  EXPECT_EQ(log().cost_reads.load(), 2) << "only the two enabled puts read the cost";
}

// --- sync_ineligible ---------------------------------------------------------------------------

TEST_F(AsyncTeardownTest, CostBelowTheThresholdIsTornDownInlineUnprepared) {
  auto items = make_items({99});
  item_async async({.threshold = 100}, traits());
  EXPECT_EQ(async.put(items[0]), decision::inline_ineligible);
  EXPECT_EQ(items[0].prepared.load(), 0);
  EXPECT_EQ(items[0].destroyed.load(), 1);
  EXPECT_EQ(items[0].destroyed_on, std::this_thread::get_id());
  EXPECT_EQ(async.stats().inline_total, 1u);
  EXPECT_EQ(async.stats().pending, 0u);
}

TEST_F(AsyncTeardownTest, CostEqualToTheThresholdIsEligible) {
  auto items = make_items({100});
  item_async async({.threshold = 100}, traits());
  EXPECT_EQ(async.put(items[0]), decision::queued);
  async.flush();
  EXPECT_EQ(items[0].destroyed.load(), 1);
}

TEST_F(AsyncTeardownTest, ItemTheTraitsCallIneligibleIsTornDownInlineUnprepared) {
  auto items = make_items({100});
  items[0].eligible = false;
  item_async async({}, traits());
  EXPECT_EQ(async.put(items[0]), decision::inline_ineligible);
  EXPECT_EQ(log().eligible_calls.load(), 1);
  EXPECT_EQ(log().cost_seen_by_eligible.load(), 100u) << "eligible() is handed the cost read";
  EXPECT_EQ(items[0].prepared.load(), 0);
  EXPECT_EQ(items[0].destroyed.load(), 1);
  EXPECT_EQ(items[0].destroyed_on, std::this_thread::get_id());
}

TEST_F(AsyncTeardownTest, SetThresholdChangesWhatIsEligible) {
  auto items = make_items({50, 50, 50});
  item_async async({}, traits());
  EXPECT_EQ(async.threshold(), 0u);
  EXPECT_EQ(async.put(items[0]), decision::queued);
  async.set_threshold(51);
  EXPECT_EQ(async.threshold(), 51u);
  EXPECT_EQ(async.put(items[1]), decision::inline_ineligible);
  async.set_threshold(50);
  EXPECT_EQ(async.put(items[2]), decision::queued);
  async.flush();
}

TEST_F(AsyncTeardownTest, CostIsReadExactlyOncePerPut) {
  auto items = make_items({100, 100, 5});
  item_async async({.threshold = 10, .max_pending = 100}, traits());
  async.freeze();
  EXPECT_EQ(async.put(items[0]), decision::queued);
  EXPECT_EQ(log().cost_reads.load(), 1);
  EXPECT_EQ(async.put(items[1]), decision::inline_rejected);
  EXPECT_EQ(log().cost_reads.load(), 2);
  EXPECT_EQ(async.put(items[2]), decision::inline_ineligible);
  EXPECT_EQ(log().cost_reads.load(), 3);
  async.thaw();
  async.flush();
  EXPECT_EQ(log().cost_reads.load(), 3) << "the reaper releases the memoised charge; it reads no cost";
}

// --- sync_rejected -----------------------------------------------------------------------------

TEST_F(AsyncTeardownTest, ChargeThatDoesNotFitIsRejectedAndTornDownInline) {
  auto items = make_items({60, 50});
  item_async async({.max_pending = 100}, traits());
  async.freeze();
  EXPECT_EQ(async.put(items[0]), decision::queued);
  EXPECT_EQ(async.put(items[1]), decision::inline_rejected);
  EXPECT_EQ(items[1].destroyed.load(), 1) << "torn down before put returned";
  EXPECT_EQ(items[1].destroyed_on, std::this_thread::get_id());
  EXPECT_EQ(items[1].charge, unset_charge);
  EXPECT_EQ(items[1].prepared.load(), 1) << "prepare runs before the reserve is tried";
  const teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.queued, 1u);
  EXPECT_EQ(s.inline_total, 1u) << "a rejected item is counted in sync";
  EXPECT_EQ(s.inline_rejected, 1u) << "and in rejected";
  EXPECT_EQ(s.pending, 60u) << "the failed reserve took nothing";
  async.thaw();
  async.flush();
  EXPECT_EQ(items[0].destroyed.load(), 1);
}

TEST_F(AsyncTeardownTest, ItemFitsAgainOnceTheReaperReleasedTheCharge) {
  auto items = make_items({60, 50, 50});
  item_async async({.max_pending = 100}, traits());
  async.freeze();
  EXPECT_EQ(async.put(items[0]), decision::queued);
  EXPECT_EQ(async.put(items[1]), decision::inline_rejected);
  async.thaw();
  async.flush();
  EXPECT_EQ(async.put(items[2]), decision::queued);
  async.flush();
  EXPECT_EQ(async.stats().pending, 0u);
}

TEST_F(AsyncTeardownTest, ItemCostingMoreThanTheWholeCapIsRejected) {
  auto items = make_items({101});
  item_async async({.max_pending = 100}, traits());
  EXPECT_EQ(async.put(items[0]), decision::inline_rejected);
  EXPECT_EQ(async.stats().pending, 0u);
  EXPECT_EQ(async.stats().inline_rejected, 1u);
}

// --- sync_stalled ------------------------------------------------------------------------------

TEST_F(AsyncTeardownTest, StalledReaperMakesEligibleItemsTearDownInlineUnprepared) {
  auto items = make_items({10, 10});
  item_async async(stalls_quickly(), traits());
  async.freeze();
  ASSERT_EQ(async.put(items[0]), decision::queued) << "an empty queue is never stalled";
  ASSERT_TRUE(eventually([&] { return async.stalled(); }));  // the oldest item waits past the 1 ms threshold
  EXPECT_EQ(async.put(items[1]), decision::inline_stalled);
  EXPECT_EQ(items[1].prepared.load(), 0);
  EXPECT_EQ(items[1].destroyed.load(), 1);
  EXPECT_EQ(items[1].destroyed_on, std::this_thread::get_id());
  EXPECT_EQ(items[1].charge, unset_charge);
  const teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.inline_stalled, 1u);
  EXPECT_EQ(s.inline_total, 1u) << "stalled is a subset of sync";
  EXPECT_EQ(s.inline_rejected, 0u);
  EXPECT_EQ(s.pending, 10u);
  async.thaw();
  async.flush();
  EXPECT_FALSE(async.stalled()) << "the queue is empty again";
  EXPECT_EQ(items[0].destroyed.load(), 1);
}

TEST_F(AsyncTeardownTest, StalledReaperStillGetsItemsWhenSyncWhenStalledIsOff) {
  auto items = make_items({10, 10});
  item_async async(stalls_quickly(/*sync_when_stalled=*/false), traits());
  async.freeze();
  ASSERT_EQ(async.put(items[0]), decision::queued);
  ASSERT_TRUE(eventually([&] { return async.stalled(); }));
  EXPECT_EQ(async.put(items[1]), decision::queued);
  EXPECT_EQ(async.stats().inline_stalled, 0u);
  async.thaw();
  async.flush();
  EXPECT_EQ(items[1].destroyed.load(), 1);
}

TEST_F(AsyncTeardownTest, StalledIsDecidedBeforeTheBudgetIsTried) {
  auto items = make_items({60, 50});
  async_teardown_options opts = stalls_quickly();
  opts.max_pending = 100;
  item_async async(std::move(opts), traits());
  async.freeze();
  ASSERT_EQ(async.put(items[0]), decision::queued);
  ASSERT_TRUE(eventually([&] { return async.stalled(); }));
  EXPECT_EQ(async.put(items[1]), decision::inline_stalled) << "it would not fit either";
  EXPECT_EQ(async.stats().inline_rejected, 0u);
  async.thaw();
}

TEST_F(AsyncTeardownTest, IneligibleIsDecidedBeforeStalled) {
  auto items = make_items({10, 10});
  items[1].eligible = false;
  item_async async(stalls_quickly(), traits());
  async.freeze();
  ASSERT_EQ(async.put(items[0]), decision::queued);
  ASSERT_TRUE(eventually([&] { return async.stalled(); }));
  EXPECT_EQ(async.put(items[1]), decision::inline_ineligible);
  EXPECT_EQ(async.stats().inline_stalled, 0u);
  async.thaw();
}

// --- sync_stopped and shutdown -----------------------------------------------------------------

TEST_F(AsyncTeardownTest, PutAfterShutdownTearsDownInlineUnprepared) {
  auto items = make_items({10});
  item_async async({}, traits());
  async.stop();
  EXPECT_EQ(async.put(items[0]), decision::inline_stopped);
  EXPECT_EQ(items[0].prepared.load(), 0);
  EXPECT_EQ(items[0].destroyed.load(), 1);
  EXPECT_EQ(items[0].destroyed_on, std::this_thread::get_id());
  EXPECT_EQ(async.stats().inline_total, 1u);
  EXPECT_EQ(async.stats().pending, 0u);
  EXPECT_FALSE(async.worker_stats().running);
}

TEST_F(AsyncTeardownTest, DisabledAndIneligibleAreDecidedBeforeStopped) {
  auto items = make_items({10, 5});
  item_async async({.threshold = 10}, traits());
  async.stop();
  EXPECT_EQ(async.put(items[1]), decision::inline_ineligible);
  async.disable();
  EXPECT_EQ(async.put(items[0]), decision::inline_disabled);
}

TEST_F(AsyncTeardownTest, ShutdownTearsDownWhatIsQueuedEvenWhileFrozenAndIsIdempotent) {
  auto items = make_items({10, 20, 30});
  item_async async({}, traits());
  async.freeze();
  for (item& i : items) EXPECT_EQ(async.put(i), decision::queued);
  async.stop();
  for (const item& i : items) EXPECT_EQ(i.destroyed.load(), 1) << "item " << i.id;
  EXPECT_EQ(async.stats().pending, 0u);
  EXPECT_EQ(async.stats().reaped, 3u);
  async.stop();
  async.flush();  // returns at once
  EXPECT_EQ(async.stats().reaped, 3u);
}

TEST_F(AsyncTeardownTest, DestructorTearsDownWhatIsQueued) {
  auto items = make_items({10, 20});
  {
    item_async async({}, traits());
    async.freeze();
    for (item& i : items) EXPECT_EQ(async.put(i), decision::queued);
  }
  for (const item& i : items) EXPECT_EQ(i.destroyed.load(), 1) << "item " << i.id;
}

// --- sync_uncontended: the concurrency gate ----------------------------------------------------

static_assert(std::string_view(teardown::to_string(decision::inline_uncontended)) == "uncontended");
// A new decision took the next free number: the values stored or logged before it kept theirs.
static_assert(std::string_view(teardown::to_string(decision::empty)) == "empty");
static_assert(static_cast<int>(decision::empty) == 8);
static_assert(static_cast<int>(decision::inline_stopped) == 5 && static_cast<int>(decision::inline_no_memory) == 6 &&
              static_cast<int>(decision::inline_uncontended) == 7);

TEST_F(AsyncTeardownTest, GateIsOffByDefaultAndALonePutIsQueuedAsBefore) {
  auto items = make_items({10});
  item_async async({}, traits());
  EXPECT_EQ(async.min_concurrent(), 1u);
  EXPECT_EQ(async.put(items[0]), decision::queued);
  async.flush();
  const teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.queued, 1u);
  EXPECT_EQ(s.inline_uncontended, 0u);
}

TEST_F(AsyncTeardownTest, LonePutUnderTheGateIsTornDownInlineUnpreparedAndUncharged) {
  auto items = make_items({100});
  const trace_recording recording;
  item_async async({.min_concurrent = 2}, traits());
  EXPECT_EQ(async.put(items[0]), decision::inline_uncontended);
  EXPECT_EQ(items[0].prepared.load(), 0) << "the gate is decided before prepare";
  EXPECT_EQ(items[0].destroyed.load(), 1) << "torn down before put returned";
  EXPECT_EQ(items[0].destroyed_on, std::this_thread::get_id());
  EXPECT_EQ(items[0].charge, unset_charge);
  const teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.inline_total, 1u);
  EXPECT_EQ(s.inline_uncontended, 1u) << "a subset of sync";
  EXPECT_EQ(s.queued, 0u);
  EXPECT_EQ(s.inline_rejected, 0u);
  EXPECT_EQ(s.pending, 0u);
  EXPECT_EQ(s.high_water, 0u) << "and before the reserve: the budget was never touched";
  const std::lock_guard lock(traced().mutex);
  ASSERT_EQ(traced().syncs.size(), 1u);
  EXPECT_EQ(traced().syncs[0].reason, "uncontended");
  EXPECT_EQ(traced().syncs[0].cost, 100u);
  EXPECT_TRUE(traced().rejects.empty());
}

TEST_F(AsyncTeardownTest, DisabledAndIneligibleAreDecidedBeforeUncontended) {
  auto items = make_items({100, 5, 100});
  items[2].eligible = false;
  item_async async({.enabled = false, .threshold = 10, .min_concurrent = 2}, traits());
  EXPECT_EQ(async.put(items[0]), decision::inline_disabled);
  EXPECT_EQ(log().cost_reads.load(), 0) << "the disabled path still reads nothing";
  async.enable();
  EXPECT_EQ(async.put(items[1]), decision::inline_ineligible) << "below the threshold";
  EXPECT_EQ(async.put(items[2]), decision::inline_ineligible) << "refused by the traits";
  EXPECT_EQ(async.stats().inline_uncontended, 0u);
  EXPECT_EQ(async.stats().inline_total, 3u);
}

// The gate is a policy, like the threshold: stalled and stopped count only items that would
// otherwise have been queued.
TEST_F(AsyncTeardownTest, UncontendedIsDecidedBeforeStalledAndStopped) {
  auto items = make_items({10, 10, 10});
  item_async async(stalls_quickly(), traits());
  async.freeze();
  ASSERT_EQ(async.put(items[0]), decision::queued);
  ASSERT_TRUE(eventually([&] { return async.stalled(); }));
  async.set_min_concurrent(2);
  EXPECT_EQ(async.put(items[1]), decision::inline_uncontended);
  EXPECT_EQ(async.stats().inline_stalled, 0u);
  async.thaw();
  async.stop();
  EXPECT_EQ(async.put(items[2]), decision::inline_uncontended);
  const teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.inline_uncontended, 2u);
  EXPECT_EQ(s.inline_stalled, 0u);
  EXPECT_EQ(s.inline_total, 2u);
}

TEST_F(AsyncTeardownTest, SetMinConcurrentSwitchesTheGateAtRunTime) {
  auto items = make_items({10, 10, 10});
  item_async async({}, traits());
  async.set_min_concurrent(2);
  EXPECT_EQ(async.min_concurrent(), 2u);
  EXPECT_EQ(async.put(items[0]), decision::inline_uncontended);
  async.set_min_concurrent(1);
  EXPECT_EQ(async.min_concurrent(), 1u);
  EXPECT_EQ(async.put(items[1]), decision::queued);
  async.set_min_concurrent(3);
  EXPECT_EQ(async.put(items[2]), decision::inline_uncontended);
  async.flush();
}

TEST_F(AsyncTeardownTest, SetMinConcurrentRefusesZeroAndChangesNothing) {
  item_async async({.min_concurrent = 3}, traits());
  EXPECT_THROW(async.set_min_concurrent(0), std::invalid_argument);
  EXPECT_EQ(async.min_concurrent(), 3u);
  async.set_min_concurrent(UINT32_MAX);
  EXPECT_EQ(async.min_concurrent(), UINT32_MAX);
}

TEST_F(AsyncTeardownTest, ConstructorRefusesMinConcurrentZero) {
  EXPECT_THROW(item_async({.min_concurrent = 0}, traits()), std::invalid_argument);
}

TEST_F(AsyncTeardownTest, CompiledOutKeepsMinConcurrentButPutStaysInline) {
  auto items = make_items({100});
  compiled_out_async async({.min_concurrent = 2}, traits());
  EXPECT_EQ(async.min_concurrent(), 2u);
  EXPECT_THROW(async.set_min_concurrent(0), std::invalid_argument);
  EXPECT_EQ(async.put(items[0]), decision::inline_disabled);
  EXPECT_EQ(async.stats().inline_uncontended, 0u);
}

// The in-flight count is undone on every return, a throwing inline teardown included: a lone
// put afterwards still finds itself alone.
TEST_F(AsyncTeardownTest, ThrowingInlineTeardownUnderTheGateLeavesNothingInFlight) {
  auto items = make_items({10, 10, 10});
  items[0].on_destroy = [](item&) { throw std::runtime_error("destroy failed"); };
  item_async async({.min_concurrent = 2}, traits());
  EXPECT_THROW((void)async.put(items[0]), std::runtime_error);
  EXPECT_EQ(async.put(items[1]), decision::inline_uncontended);
  EXPECT_EQ(async.put(items[2]), decision::inline_uncontended);
  EXPECT_EQ(async.stats().inline_uncontended, 3u) << "counted before destroy threw";
}

// Traits whose eligible() holds each put until `overlap` puts have entered: every one of them
// is counted in flight (the count is taken before cost()) when the first one reaches the gate.
struct overlapping_traits : item_traits {
  std::latch* entered = nullptr;
  bool eligible(const item& i, std::uint64_t cost) const {
    entered->arrive_and_wait();
    return item_traits::eligible(i, cost);
  }
};
using overlapping_async = teardown::async_teardown<item, &item::hook, overlapping_traits>;

// Runs `overlap` puts at once, each held in eligible() until all have entered and held again
// after its decision (in prepare, or in its inline teardown) until all have decided: every put
// reaches the gate with exactly `overlap` puts in flight. Returns the decisions.
std::vector<decision> overlapping_puts(traits_log& log, std::ptrdiff_t overlap, std::uint32_t min_concurrent) {
  std::vector<item> items(static_cast<std::size_t>(overlap));
  std::latch entered(overlap);
  std::latch decided(overlap);
  for (item& i : items) {
    i.size.store(10);
    i.on_prepare = [&](item&) { decided.arrive_and_wait(); };
    // Only the inline teardown holds: an item the reaper destroys was prepared first.
    i.on_destroy = [&](item& self) {
      if (self.prepared.load() == 0) decided.arrive_and_wait();
    };
  }
  overlapping_traits traits;
  traits.log = &log;
  traits.entered = &entered;
  overlapping_async async({.min_concurrent = min_concurrent}, traits);
  std::vector<decision> decisions(items.size());
  std::vector<std::thread> threads;
  for (std::size_t at = 0; at < items.size(); ++at) {
    threads.emplace_back([&, at] { decisions[at] = async.put(items[at]); });
  }
  for (std::thread& t : threads) t.join();
  async.flush();
  for (const item& i : items) EXPECT_EQ(i.destroyed.load(), 1) << "item " << i.id;
  const teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.queued + s.inline_total, items.size());
  EXPECT_EQ(s.inline_uncontended, static_cast<std::uint64_t>(std::count(decisions.begin(), decisions.end(),
                                                                  decision::inline_uncontended)));
  return decisions;
}

TEST_F(AsyncTeardownTest, PutsOverlappingAtLeastMinConcurrentAreQueued) {
  for (std::uint32_t gate : {2u, 4u}) {
    SCOPED_TRACE("min_concurrent " + std::to_string(gate));
    const std::vector<decision> decisions = overlapping_puts(log(), 4, gate);
    EXPECT_EQ(std::count(decisions.begin(), decisions.end(), decision::queued), 4)
        << "four puts in flight meet a gate of " << gate;
  }
}

TEST_F(AsyncTeardownTest, PutsOverlappingFewerThanMinConcurrentAreTornDownInline) {
  const std::vector<decision> decisions = overlapping_puts(log(), 4, 5);
  EXPECT_EQ(std::count(decisions.begin(), decisions.end(), decision::inline_uncontended), 4);
}

// --- prepare -----------------------------------------------------------------------------------

TEST_F(AsyncTeardownTest, PrepareRunsOnceOnTheCallerBeforeAnythingIsCharged) {
  auto items = make_items({10, 20});
  item_async* self = nullptr;
  std::uint64_t pending_seen = 0;
  std::uint64_t charge_seen = 0;
  std::thread::id prepared_on;
  items[1].on_prepare = [&](item& i) {
    pending_seen = self->stats().pending;
    charge_seen = i.charge;
    prepared_on = std::this_thread::get_id();
  };
  item_async async({}, traits());
  self = &async;
  async.freeze();
  EXPECT_EQ(async.put(items[0]), decision::queued);
  EXPECT_EQ(async.put(items[1]), decision::queued);
  EXPECT_EQ(items[1].prepared.load(), 1);
  EXPECT_EQ(pending_seen, 10u) << "item 1 was not charged yet when it was prepared";
  EXPECT_EQ(charge_seen, unset_charge) << "nor memoised";
  EXPECT_EQ(prepared_on, std::this_thread::get_id());
  async.thaw();
  async.flush();
  EXPECT_EQ(items[1].prepared.load(), 1) << "the reaper does not prepare again";
}

TEST_F(AsyncTeardownTest, PrepareThatThrowsPropagatesAndLeavesTheItemUntouched) {
  auto items = make_items({10});
  bool fail = true;
  items[0].on_prepare = [&](item&) {
    if (fail) throw std::runtime_error("prepare failed");
  };
  item_async async({}, traits());
  EXPECT_THROW((void)async.put(items[0]), std::runtime_error);
  EXPECT_EQ(items[0].destroyed.load(), 0);
  EXPECT_EQ(items[0].charge, unset_charge);
  teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.queued, 0u);
  EXPECT_EQ(s.inline_total, 0u);
  EXPECT_EQ(s.pending, 0u);
  fail = false;
  EXPECT_EQ(async.put(items[0]), decision::queued) << "the item can be put again";
  async.flush();
  EXPECT_EQ(items[0].destroyed.load(), 1);
  EXPECT_EQ(async.stats().pending, 0u);
}

TEST_F(AsyncTeardownTest, BlockingPrepareStallsOnlyItsCaller) {
  auto items = make_items({10, 10, 10});
  std::latch release(1);
  std::atomic<bool> blocked{false};
  items[1].on_prepare = [&](item&) {
    blocked.store(true);
    release.wait();
  };
  item_async async({}, traits());
  EXPECT_EQ(async.put(items[0]), decision::queued);
  std::thread slow([&] { EXPECT_EQ(async.put(items[1]), decision::queued); });
  reaper_support::wait_until(blocked);
  EXPECT_EQ(async.put(items[2]), decision::queued);
  async.flush();  // would hang if the blocked prepare held the reaper up
  EXPECT_EQ(items[0].destroyed.load(), 1);
  EXPECT_EQ(items[2].destroyed.load(), 1);
  EXPECT_EQ(items[1].destroyed.load(), 0);
  EXPECT_EQ(async.stats().pending, 0u) << "the blocked item is not charged yet";
  release.count_down();
  slow.join();
  async.flush();
  EXPECT_EQ(items[1].destroyed.load(), 1);
}

// --- The memoised charge -----------------------------------------------------------------------

TEST_F(AsyncTeardownTest, ReaperReleasesTheMemoisedChargeEvenIfTheLiveCostShrank) {
  auto items = make_items({100, 40});
  item_async async({}, traits());
  async.freeze();
  EXPECT_EQ(async.put(items[0]), decision::queued);
  EXPECT_EQ(async.put(items[1]), decision::queued);
  items[0].size.store(30);  // reclaimed while it waited
  items[1].size.store(0);
  EXPECT_EQ(async.stats().pending, 140u);
  async.thaw();
  async.flush();
  EXPECT_EQ(async.stats().pending, 0u) << "exactly what was charged came back";
  EXPECT_EQ(items[0].charge, 100u);
}

TEST_F(AsyncTeardownTest, ThrowingDestroyOnTheReaperIsCountedReportedAndStillReleasesTheCharge) {
  auto items = make_items({100, 50});
  items[0].on_destroy = [](item&) { throw std::runtime_error("destroy failed"); };
  std::atomic<int> reported{0};
  async_teardown_options opts;
  opts.reaper.on_error = [&](std::exception_ptr error) {
    try {
      std::rethrow_exception(error);
    } catch (const std::runtime_error&) {
      reported.fetch_add(1);
    }
  };
  item_async async(std::move(opts), traits());
  async.freeze();
  EXPECT_EQ(async.put(items[0]), decision::queued);
  EXPECT_EQ(async.put(items[1]), decision::queued);
  async.thaw();
  async.flush();
  EXPECT_EQ(reported.load(), 1);
  EXPECT_EQ(items[1].destroyed.load(), 1) << "the rest of the backlog still ran";
  const teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.errors, 1u);
  EXPECT_EQ(s.reaped, 2u);
  EXPECT_EQ(s.pending, 0u);
}

TEST_F(AsyncTeardownTest, ThrowingDestroyInlinePropagatesFromPut) {
  auto items = make_items({100, 1});
  for (item& i : items) i.on_destroy = [](item&) { throw std::runtime_error("destroy failed"); };
  item_async async({.enabled = false, .threshold = 10}, traits());
  EXPECT_THROW((void)async.put(items[0]), std::runtime_error);
  async.enable();
  EXPECT_THROW((void)async.put(items[1]), std::runtime_error) << "ineligible";
  const teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.inline_total, 2u) << "the decision was taken and counted before destroy threw";
  EXPECT_EQ(s.errors, 0u) << "errors counts the reaper's side only";
  EXPECT_EQ(s.pending, 0u);
}

TEST_F(AsyncTeardownTest, DestroyMayFreeTheItem) {
  struct heap_traits {
    std::atomic<int>* freed;
    std::uint64_t cost(const item& i) const { return i.size.load(); }
    bool eligible(const item& i, std::uint64_t) const { return i.eligible; }
    void prepare(item&) const {}
    void destroy(item& i) const {
      delete &i;
      freed->fetch_add(1);
    }
    std::uint64_t& charge(item& i) const { return i.charge; }
    std::uint64_t live_cost(const item& i) const { return i.size.load(); }
    std::uint64_t id(const item& i) const { return i.id; }
    std::uint64_t& queued_at(item& i) const { return i.queued_at; }
  };
  const trace_recording recording;  // the trace points must not touch a freed item
  std::atomic<int> freed{0};
  teardown::async_teardown<item, &item::hook, heap_traits> async({.threshold = 10, .max_pending = 1000},
                                                                 heap_traits{&freed});
  int puts = 0;
  for (std::uint64_t size : {5u, 50u, 500u, 900u, 50u}) {  // ineligible, queued..., rejected
    auto* i = new item;
    i->size.store(size);
    (void)async.put(*i);
    ++puts;
  }
  async.drain(60);
  async.flush();
  EXPECT_EQ(freed.load(), puts);  // and AddressSanitizer sees no use after free
  EXPECT_EQ(async.stats().pending, 0u);
}

// --- Counters ----------------------------------------------------------------------------------

TEST_F(AsyncTeardownTest, AfterFlushQueuedPlusSyncIsPutsReapedIsQueuedAndNothingIsPending) {
  auto items = make_items({5, 40, 40, 40, 5, 40, 40, 40, 40, 40});
  item_async async({.threshold = 10, .max_pending = 100}, traits());
  std::uint64_t queued = 0;
  for (std::size_t at = 0; at < items.size(); ++at) {
    if (at == 3) async.freeze();
    if (at == 8) {
      async.thaw();
      async.flush();
    }
    if (async.put(items[at]) == decision::queued) ++queued;
  }
  async.flush();
  const teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.queued, queued);
  EXPECT_EQ(s.queued + s.inline_total, items.size());
  EXPECT_EQ(s.reaped, s.queued);
  EXPECT_LE(s.inline_rejected, s.inline_total);
  EXPECT_GE(s.inline_rejected, 1u);
  EXPECT_EQ(s.pending, 0u);
  EXPECT_EQ(s.cap, 100u);
  EXPECT_LE(s.high_water, 100u);
  for (const item& i : items) EXPECT_EQ(i.destroyed.load(), 1) << "item " << i.id;
}

// --- The budget's cap --------------------------------------------------------------------------

TEST_F(AsyncTeardownTest, SetMaxPendingAboveMaxCapThrowsAndLeavesTheCapUnchanged) {
  item_async async({.max_pending = 100}, traits());
  EXPECT_THROW(async.set_max_pending(teardown::budget::max_cap + 1), std::invalid_argument);
  EXPECT_EQ(async.max_pending(), 100u);
  EXPECT_EQ(async.stats().cap, 100u);
  async.set_max_pending(teardown::budget::max_cap);
  EXPECT_EQ(async.max_pending(), teardown::budget::max_cap);
}

TEST_F(AsyncTeardownTest, ConstructorRefusesMaxPendingAboveMaxCap) {
  EXPECT_THROW(item_async({.max_pending = teardown::budget::max_cap + 1}, traits()), std::invalid_argument);
}

TEST_F(AsyncTeardownTest, LoweredMaxPendingRejectsWhatNoLongerFitsAndRaisedAdmitsIt) {
  auto items = make_items({60, 30, 30});
  item_async async({.max_pending = 100}, traits());
  async.freeze();
  EXPECT_EQ(async.put(items[0]), decision::queued);
  async.set_max_pending(50);  // below what is pending
  EXPECT_EQ(async.put(items[1]), decision::inline_rejected);
  async.set_max_pending(90);
  EXPECT_EQ(async.put(items[2]), decision::queued);
  EXPECT_EQ(async.stats().pending, 90u);
  async.thaw();
  async.flush();
  EXPECT_EQ(async.stats().pending, 0u);
}

// --- drain -------------------------------------------------------------------------------------

TEST_F(AsyncTeardownTest, DrainTearsDownOldestFirstOnTheCallerOnlyItemsWhoseChargesFit) {
  auto items = make_items({10, 50, 20, 5, 1});
  item_async async({}, traits());
  async.freeze();
  for (item& i : items) EXPECT_EQ(async.put(i), decision::queued);
  const teardown::drain_result drained = async.drain(35);
  EXPECT_EQ(drained.items, 3u);
  EXPECT_EQ(drained.cost, 35u);
  EXPECT_EQ(destroy_order(), (std::vector<std::uint64_t>{0, 2, 3}))
      << "10 fits, 50 does not, 20 and 5 fill the 35, 1 no longer fits";
  for (std::size_t at : {0u, 2u, 3u}) EXPECT_EQ(items[at].destroyed_on, std::this_thread::get_id());
  const teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.drained, 3u);
  EXPECT_EQ(s.reaped, 3u);
  EXPECT_EQ(s.pending, 51u);
  async.thaw();
}

TEST_F(AsyncTeardownTest, ItemsDrainDeclinedAreLeftToTheReaperAndFlushCompletesThem) {
  auto items = make_items({10, 50, 20});
  item_async async(worker_only(), traits());
  async.freeze();
  for (item& i : items) EXPECT_EQ(async.put(i), decision::queued);
  (void)async.drain(30);
  EXPECT_EQ(items[1].destroyed.load(), 0);
  async.thaw();
  async.flush();
  EXPECT_EQ(items[1].destroyed.load(), 1);
  EXPECT_NE(items[1].destroyed_on, std::this_thread::get_id()) << "the reaper took it";
  for (const item& i : items) EXPECT_EQ(i.destroyed.load(), 1) << "item " << i.id;
  const teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.drained, 2u);
  EXPECT_EQ(s.reaped, 3u);
  EXPECT_EQ(s.reaped, s.queued);
  EXPECT_EQ(s.pending, 0u);
}

TEST_F(AsyncTeardownTest, DrainOfZeroTakesNothingThatCostsAnything) {
  auto items = make_items({1, 2});
  item_async async({}, traits());
  EXPECT_EQ(async.drain(100).items, 0u) << "nothing queued";
  async.freeze();
  for (item& i : items) EXPECT_EQ(async.put(i), decision::queued);
  const teardown::drain_result drained = async.drain(0);
  EXPECT_EQ(drained.items, 0u);
  EXPECT_EQ(drained.cost, 0u);
  EXPECT_EQ(async.stats().drained, 0u);
  EXPECT_EQ(async.stats().pending, 3u);
  async.thaw();
  async.flush();
  EXPECT_EQ(async.stats().pending, 0u);
}

TEST_F(AsyncTeardownTest, DrainedItemWhoseDestroyThrowsIsCountedAndItsChargeReleased) {
  auto items = make_items({10, 10});
  items[0].on_destroy = [](item&) { throw std::runtime_error("destroy failed"); };
  item_async async({}, traits());
  async.freeze();
  for (item& i : items) EXPECT_EQ(async.put(i), decision::queued);
  teardown::drain_result drained;
  EXPECT_NO_THROW(drained = async.drain(100));
  EXPECT_EQ(drained.items, 2u) << "the rest still drained";
  const teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.errors, 1u);
  EXPECT_EQ(s.reaped, 2u);
  EXPECT_EQ(s.pending, 0u);
  async.thaw();
}

// drained is documented as a subset of reaped, and a snapshot as never showing a subset larger
// than its superset. A drain in the middle of a teardown is the moment to look.
TEST_F(AsyncTeardownTest, SnapshotTakenWhileADrainTearsDownShowsDrainedAsASubsetOfReaped) {
  auto items = make_items({10});
  std::latch release(1);
  std::atomic<bool> in_destroy{false};
  items[0].on_destroy = [&](item&) {
    in_destroy.store(true);
    release.wait();
  };
  item_async async({}, traits());
  async.freeze();
  EXPECT_EQ(async.put(items[0]), decision::queued);
  std::thread drainer([&] { (void)async.drain(100); });
  reaper_support::wait_until(in_destroy);
  const teardown::async_teardown_stats during = async.stats();
  release.count_down();
  drainer.join();
  EXPECT_LE(during.drained, during.reaped);
  const teardown::async_teardown_stats after = async.stats();
  EXPECT_EQ(after.drained, 1u);
  EXPECT_EQ(after.reaped, 1u);
  async.thaw();
}

// --- put_chain: a chain as one unit ---------------------------------------------------------------

using item_chain = teardown::llist_chain<item, &item::hook>;

item_chain chain_of(std::vector<item>& items) {
  item_chain chain;
  for (item& i : items) chain.push_back(i);
  return chain;
}

// Leaves a chain empty so that its debug check has nothing to report; the items stay alive.
std::size_t unlink_all(item_chain& chain) {
  std::size_t unlinked = 0;
  while (chain.pop_front() != nullptr) ++unlinked;
  return unlinked;
}

TEST_F(AsyncTeardownTest, PutChainQueuesEveryItemUnderOneChargeAndEachReleasesItsOwn) {
  auto items = make_items({10, 20, 30});
  item_async async(worker_only(), traits());
  async.freeze();
  item_chain chain = chain_of(items);
  EXPECT_EQ(async.put_chain(std::move(chain)), decision::queued);
  EXPECT_TRUE(chain.empty()) << "consumed";
  EXPECT_EQ(log().cost_reads.load(), 3) << "each cost read once";
  for (const item& i : items) {
    EXPECT_EQ(i.charge, i.size.load()) << "item " << i.id << ": its own charge is memoised";
    EXPECT_EQ(i.prepared.load(), 1);
    EXPECT_EQ(i.destroyed.load(), 0);
  }
  teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.queued, 3u);
  EXPECT_EQ(s.pending, 60u);
  EXPECT_EQ(async.worker_stats().enqueued, 3u);
  async.thaw();
  async.flush();
  for (const item& i : items) {
    EXPECT_EQ(i.destroyed.load(), 1) << "item " << i.id;
    EXPECT_NE(i.destroyed_on, std::this_thread::get_id());
  }
  s = async.stats();
  EXPECT_EQ(s.reaped, 3u);
  EXPECT_EQ(s.pending, 0u);
  EXPECT_EQ(s.high_water, 60u);
}

TEST_F(AsyncTeardownTest, PutChainWhoseSumDoesNotFitIsRejectedWholeAndTornDownInline) {
  auto items = make_items({30, 30});
  item_async async({.max_pending = 50}, traits());
  EXPECT_EQ(async.put_chain(chain_of(items)), decision::inline_rejected) << "each fits alone, the sum does not";
  for (const item& i : items) {
    EXPECT_EQ(i.destroyed.load(), 1);
    EXPECT_EQ(i.destroyed_on, std::this_thread::get_id());
  }
  const teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.inline_total, 2u);
  EXPECT_EQ(s.inline_rejected, 2u);
  EXPECT_EQ(s.queued, 0u);
  EXPECT_EQ(s.pending, 0u);
}

TEST_F(AsyncTeardownTest, PutChainAppliesTheThresholdToTheSum) {
  auto small = make_items({30, 20});
  auto smaller = make_items({20, 20});
  item_async async({.threshold = 50}, traits());
  EXPECT_EQ(async.put_chain(chain_of(small)), decision::queued) << "50 >= 50, though each is below it";
  EXPECT_EQ(async.put_chain(chain_of(smaller)), decision::inline_ineligible);
  for (const item& i : smaller) EXPECT_EQ(i.prepared.load(), 0) << "inline items are not prepared";
  async.flush();
  EXPECT_EQ(async.stats().queued, 2u);
  EXPECT_EQ(async.stats().inline_total, 2u);
}

TEST_F(AsyncTeardownTest, OneIneligibleItemKeepsTheWholeChainInline) {
  auto items = make_items({10, 10, 10});
  items[1].eligible = false;
  item_async async({}, traits());
  EXPECT_EQ(async.put_chain(chain_of(items)), decision::inline_ineligible);
  for (const item& i : items) {
    EXPECT_EQ(i.destroyed.load(), 1);
    EXPECT_EQ(i.destroyed_on, std::this_thread::get_id());
    EXPECT_EQ(i.prepared.load(), 0);
  }
  EXPECT_EQ(async.stats().pending, 0u);
}

TEST_F(AsyncTeardownTest, PutChainWhileDisabledReadsNoCostAndTearsDownEveryItemInline) {
  auto items = make_items({10, 20});
  item_async async({.enabled = false}, traits());
  EXPECT_EQ(async.put_chain(chain_of(items)), decision::inline_disabled);
  EXPECT_EQ(log().cost_reads.load(), 0);
  for (const item& i : items) EXPECT_EQ(i.destroyed.load(), 1);
  EXPECT_EQ(async.stats().inline_total, 2u);
}

TEST_F(AsyncTeardownTest, PutChainAfterShutdownAndUnderTheGateIsInlineForThatReason) {
  auto lone = make_items({10, 10});
  item_async gated({.min_concurrent = 2}, traits());
  EXPECT_EQ(gated.put_chain(chain_of(lone)), decision::inline_uncontended) << "a chain is one put in flight";
  EXPECT_EQ(gated.stats().inline_uncontended, 2u);

  auto late = make_items({10, 10});
  item_async stopped({}, traits());
  stopped.stop();
  EXPECT_EQ(stopped.put_chain(chain_of(late)), decision::inline_stopped);
  for (const item& i : late) EXPECT_EQ(i.destroyed.load(), 1);
}

TEST_F(AsyncTeardownTest, EmptyChainIsANoOp) {
  item_async async({}, traits());
  EXPECT_EQ(async.put_chain(item_chain{}), decision::empty) << "not inline_ineligible: nothing was torn down";
  const teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.queued + s.inline_total, 0u);
}

TEST_F(AsyncTeardownTest, PutChainWhosePrepareThrowsLeavesTheChainWithTheCaller) {
  auto items = make_items({10, 10, 10});
  items[1].on_prepare = [](item&) { throw std::runtime_error("prepare failed"); };
  item_async async({}, traits());
  item_chain chain = chain_of(items);
  EXPECT_THROW((void)async.put_chain(std::move(chain)), std::runtime_error);
  EXPECT_EQ(chain.size(), 3u) << "nothing taken from the caller's chain";
  for (const item& i : items) EXPECT_EQ(i.destroyed.load(), 0);
  const teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.queued + s.inline_total, 0u);
  EXPECT_EQ(s.pending, 0u);
  EXPECT_EQ(unlink_all(chain), 3u);
}

TEST_F(AsyncTeardownTest, PutChainWhoseInlineDestroyThrowsStillTearsDownTheRestAndRethrowsTheFirst) {
  auto items = make_items({10, 10, 10});
  items[0].on_destroy = [](item&) { throw std::runtime_error("first"); };
  items[2].on_destroy = [](item&) { throw std::logic_error("second"); };
  item_async async({.enabled = false}, traits());
  EXPECT_THROW((void)async.put_chain(chain_of(items)), std::runtime_error);
  for (const item& i : items) EXPECT_EQ(i.destroyed.load(), 1) << "item " << i.id;
}

TEST_F(AsyncTeardownTest, DrainTakesTheItemsOfAQueuedChainOneByOne) {
  auto items = make_items({10, 20, 30});
  item_async async({}, traits());
  async.freeze();
  EXPECT_EQ(async.put_chain(chain_of(items)), decision::queued);
  const teardown::drain_result drained = async.drain(40);
  EXPECT_EQ(drained.items, 2u);
  EXPECT_EQ(drained.cost, 40u);
  EXPECT_EQ(destroy_order(), (std::vector<std::uint64_t>{2, 0}))
      << "the chain joins the queue back to front: 30 first, then 20 no longer fits, 10 does";
  EXPECT_EQ(async.stats().pending, 20u);
  async.thaw();
  async.flush();
  EXPECT_EQ(items[1].destroyed.load(), 1);
  EXPECT_EQ(async.stats().pending, 0u);
}

TEST_F(AsyncTeardownTest, CompiledOutPutChainDestroysEveryItemInline) {
  auto items = make_items({10, 20});
  compiled_out_async async({}, traits());
  EXPECT_EQ(async.put_chain(chain_of(items)), decision::inline_disabled);
  for (const item& i : items) EXPECT_EQ(i.destroyed.load(), 1);
}

// --- const_key<false>: the deferred path compiled out -------------------------------------------

std::size_t live_threads() {
  return static_cast<std::size_t>(std::distance(std::filesystem::directory_iterator("/proc/self/task"),
                                                std::filesystem::directory_iterator()));
}

TEST_F(AsyncTeardownTest, CompiledOutPutDestroysInlineAndStartsNoReaper) {
  auto items = make_items({100});
  const std::size_t threads_before = live_threads();
  compiled_out_async async({.threshold = 0, .max_pending = 1000}, traits());
  EXPECT_EQ(live_threads(), threads_before) << "no reaper thread";
  EXPECT_FALSE(async.worker_stats().running);
  EXPECT_FALSE(async.enabled());
  EXPECT_EQ(async.put(items[0]), decision::inline_disabled);
  EXPECT_EQ(items[0].destroyed.load(), 1);
  EXPECT_EQ(items[0].destroyed_on, std::this_thread::get_id());
  EXPECT_EQ(log().cost_reads.load(), 0);
  EXPECT_EQ(items[0].prepared.load(), 0);
  EXPECT_EQ(items[0].charge, unset_charge);
  const teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.queued, 0u);
  EXPECT_EQ(s.inline_total, 0u) << "no counters";
  EXPECT_EQ(s.inline_rejected, 0u);
  EXPECT_EQ(s.inline_stalled, 0u);
  EXPECT_EQ(s.reaped, 0u);
  EXPECT_EQ(s.drained, 0u);
  EXPECT_EQ(s.errors, 0u);
  EXPECT_EQ(s.pending, 0u);
  EXPECT_EQ(s.high_water, 0u);
}

TEST_F(AsyncTeardownTest, CompiledOutControlCallsReturnAtOnce) {
  compiled_out_async async({}, traits());
  EXPECT_EQ(async.drain(100).items, 0u);
  async.flush();
  EXPECT_TRUE(async.flush_for(1s));
  async.freeze();
  EXPECT_THROW(async.thaw(), std::logic_error);
  EXPECT_FALSE(async.stalled());
  EXPECT_FALSE(async.hurry()) << "no worker to wake";
  EXPECT_FALSE(async.in_own_callback());
  EXPECT_EQ(async.worker_count(), 0u);
  EXPECT_TRUE(async.stop_for(1s));
  async.stop();
}

TEST_F(AsyncTeardownTest, CompiledOutPutEmitsNoTraceEvent) {
  auto items = make_items({100});
  const trace_recording recording;
  compiled_out_async async({}, traits());
  (void)async.put(items[0]);
  const std::lock_guard lock(traced().mutex);
  EXPECT_TRUE(traced().syncs.empty());
  EXPECT_TRUE(traced().queues.empty());
}

// --- Trace points ------------------------------------------------------------------------------

TEST_F(AsyncTeardownTest, QueueEventCarriesIdCostAndTheProducingThread) {
  auto items = make_items({0, 77});
  const trace_recording recording;
  item_async async({}, traits());
  std::int64_t producer_tid = 0;
  std::thread producer([&] {
    pthread_setname_np(pthread_self(), "td-producer");  // before its first put
    producer_tid = current_tid();
    EXPECT_EQ(async.put(items[1]), decision::queued);
  });
  producer.join();
  async.flush();
  const std::lock_guard lock(traced().mutex);
  ASSERT_EQ(traced().queues.size(), 1u);
  const queue_record& q = traced().queues[0];
  EXPECT_EQ(q.id, 1u);
  EXPECT_EQ(q.cost, 77u);
  EXPECT_EQ(q.tid, producer_tid);
  EXPECT_EQ(q.thread_name, "td-producer");
  EXPECT_GE(q.cpu, 0);
}

TEST_F(AsyncTeardownTest, ReapEventCarriesTheChargedAndTheLiveCostAndTheWait) {
  auto items = make_items({100});
  const trace_recording recording;
  item_async async({}, traits());
  async.freeze();
  EXPECT_EQ(async.put(items[0]), decision::queued);
  items[0].size.store(30);
  std::this_thread::sleep_for(5ms);  // the wait the event must cover
  async.thaw();
  async.flush();
  const std::lock_guard lock(traced().mutex);
  ASSERT_EQ(traced().reaps.size(), 1u);
  const reap_record& r = traced().reaps[0];
  EXPECT_EQ(r.id, 0u);
  EXPECT_EQ(r.charged_cost, 100u);
  EXPECT_EQ(r.live_cost, 30u);
  EXPECT_GE(r.wait_ns, 5'000'000u);
  EXPECT_GE(r.cpu, 0);
  EXPECT_TRUE(traced().syncs.empty()) << "a queued item emits no sync event";
}

TEST_F(AsyncTeardownTest, SyncEventsCarryTheCostAndTheDecisionsName) {
  auto items = make_items({100, 5, 200, 10, 10, 10});
  const trace_recording recording;
  async_teardown_options opts = stalls_quickly();
  opts.threshold = 10;
  opts.max_pending = 100;
  opts.enabled = false;
  item_async async(std::move(opts), traits());
  EXPECT_EQ(async.put(items[0]), decision::inline_disabled);
  async.enable();
  EXPECT_EQ(async.put(items[1]), decision::inline_ineligible);
  EXPECT_EQ(async.put(items[2]), decision::inline_rejected);
  async.freeze();
  ASSERT_EQ(async.put(items[3]), decision::queued);
  ASSERT_TRUE(eventually([&] { return async.stalled(); }));
  EXPECT_EQ(async.put(items[4]), decision::inline_stalled);
  async.stop();
  EXPECT_EQ(async.put(items[5]), decision::inline_stopped);
  const std::lock_guard lock(traced().mutex);
  ASSERT_EQ(traced().syncs.size(), 5u);
  const std::vector<std::pair<std::uint64_t, std::string>> expected = {
      {0, "disabled"}, {1, "ineligible"}, {2, "rejected"}, {4, "stalled"}, {5, "stopped"}};
  for (std::size_t at = 0; at < expected.size(); ++at) {
    EXPECT_EQ(traced().syncs[at].id, expected[at].first);
    EXPECT_EQ(traced().syncs[at].reason, expected[at].second);
  }
  EXPECT_EQ(traced().syncs[0].cost, 0u) << "the disabled path never read the cost";
  EXPECT_EQ(traced().syncs[1].cost, 5u);
  EXPECT_EQ(traced().syncs[2].cost, 200u);
  EXPECT_EQ(traced().syncs[3].cost, 10u);
  EXPECT_EQ(traced().syncs[4].cost, 10u);
}

TEST_F(AsyncTeardownTest, RejectEventCarriesTheCostThePendingAndTheCap) {
  auto items = make_items({60, 50});
  const trace_recording recording;
  item_async async({.max_pending = 100}, traits());
  async.freeze();
  EXPECT_EQ(async.put(items[0]), decision::queued);
  EXPECT_EQ(async.put(items[1]), decision::inline_rejected);
  {
    const std::lock_guard lock(traced().mutex);
    ASSERT_EQ(traced().rejects.size(), 1u);
    const trace::reject_event& r = traced().rejects[0];
    EXPECT_EQ(r.id, 1u);
    EXPECT_EQ(r.cost, 50u);
    EXPECT_EQ(r.pending, 60u);
    EXPECT_EQ(r.cap, 100u);
    ASSERT_EQ(traced().syncs.size(), 1u) << "a rejected item also emits its sync event";
    EXPECT_EQ(traced().syncs[0].reason, "rejected");
  }
  async.thaw();
}

TEST_F(AsyncTeardownTest, TraceIdDefaultsToTheItemsAddress) {
  struct minimal_traits {
    std::uint64_t cost(const item& i) const { return i.size.load(); }
    bool eligible(const item&, std::uint64_t) const { return true; }
    void prepare(item&) const {}
    void destroy(item&) const {}
    std::uint64_t& charge(item& i) const { return i.charge; }
  };
  auto items = make_items({7});
  const trace_recording recording;
  teardown::async_teardown<item, &item::hook, minimal_traits> async;
  EXPECT_EQ(async.put(items[0]), decision::queued);
  async.flush();
  const auto address = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(&items[0]));
  const std::lock_guard lock(traced().mutex);
  ASSERT_EQ(traced().queues.size(), 1u);
  EXPECT_EQ(traced().queues[0].id, address);
  ASSERT_EQ(traced().reaps.size(), 1u);
  EXPECT_EQ(traced().reaps[0].id, address);
  EXPECT_EQ(traced().reaps[0].live_cost, 7u) << "without live_cost, the charge";
}

// --- Many threads ------------------------------------------------------------------------------

std::vector<item> random_items(std::size_t count, std::uint64_t max_cost, std::uint32_t seed) {
  std::vector<item> items(count);
  std::mt19937 random(seed);
  std::uniform_int_distribution<std::uint64_t> cost(1, max_cost);
  for (std::size_t at = 0; at < count; ++at) {
    items[at].id = at;
    items[at].size.store(cost(random));
  }
  return items;
}

// Producers put items of random costs into a small budget while one thread toggles the key and
// drains, and another samples the counters. Afterwards every item was destroyed exactly once and
// the counters add up. Under add-then-check, pending() may show a failing reserve's charge for
// an instant, so the sampled pending is bounded by the cap plus one item per producer; the
// budget's high-water mark, which only successful reserves set, must never pass the cap.
TEST_F(AsyncTeardownStressTest, ProducersTogglesAndDrainsLoseNothingAndNeverOverAdmit) {
  constexpr std::size_t producers = 4;
  constexpr std::uint64_t cap = 5000;
  constexpr std::uint64_t max_cost = 200;
  const std::size_t per_producer = scaled(20'000);
  auto items = random_items(producers * per_producer, max_cost, 20240611);
  // nice 0: on a small machine a nice-19 reaper behind six busy threads would leave the budget
  // full and nearly every put rejected, which exercises only one path.
  item_async async({.threshold = 10, .max_pending = cap, .reaper = {.name = "async_teardown", .nice = 0}}, traits());
  std::atomic<bool> done{false};
  std::atomic<std::uint64_t> queued{0};
  std::latch go(producers + 2);

  std::vector<std::thread> threads;
  for (std::size_t p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      go.arrive_and_wait();
      std::uint64_t mine = 0;
      for (std::size_t i = 0; i < per_producer; ++i) {
        if (async.put(items[p * per_producer + i]) == decision::queued) ++mine;
        if (i % 16 == 0) std::this_thread::yield();  // lets the reaper in now and then
      }
      queued.fetch_add(mine);
    });
  }
  std::uint64_t drained = 0;
  std::thread controller([&] {
    std::mt19937 random(7);
    go.arrive_and_wait();
    while (!done.load()) {
      async.set_enabled(random() % 4 != 0);  // enabled three times out of four
      drained += async.drain(random() % 400).items;
      std::this_thread::yield();
    }
    async.enable();
  });
  std::string monitor_failure;
  std::uint64_t samples = 0;
  std::uint64_t highest_sampled_pending = 0;
  std::thread monitor([&] {
    go.arrive_and_wait();
    while (!done.load() && monitor_failure.empty()) {
      const teardown::async_teardown_stats s = async.stats();
      ++samples;
      highest_sampled_pending = std::max(highest_sampled_pending, s.pending);
      if (s.pending > cap + producers * max_cost) monitor_failure = "pending " + std::to_string(s.pending);
      if (s.high_water > cap) monitor_failure = "high water " + std::to_string(s.high_water);
      if (s.inline_rejected > s.inline_total) monitor_failure = "rejected > sync";
      if (s.inline_stalled > s.inline_total) monitor_failure = "stalled > sync";
      if (s.reaped > s.queued) monitor_failure = "reaped > queued";
      std::this_thread::yield();
    }
  });
  for (std::thread& t : threads) t.join();
  done.store(true);
  controller.join();
  monitor.join();
  async.flush();

  EXPECT_EQ(monitor_failure, "");
  const teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.queued, queued.load());
  EXPECT_EQ(s.queued + s.inline_total, items.size());
  EXPECT_EQ(s.reaped, s.queued);
  EXPECT_EQ(s.drained, drained);
  EXPECT_LE(s.drained, s.reaped);
  EXPECT_EQ(s.pending, 0u);
  EXPECT_LE(s.high_water, cap);
  const auto once = std::count_if(items.begin(), items.end(), [](const item& i) { return i.destroyed.load() == 1; });
  EXPECT_EQ(static_cast<std::size_t>(once), items.size());
  RecordProperty("queued", static_cast<int>(s.queued));
  RecordProperty("rejected", static_cast<int>(s.inline_rejected));
  RecordProperty("drained", static_cast<int>(s.drained));
  RecordProperty("samples", static_cast<int>(samples));
  RecordProperty("highest_sampled_pending", static_cast<int>(highest_sampled_pending));
}

// Producers put while a controller switches the gate between off, 2 and 3 puts, so that puts
// which began under one setting end under another, and a monitor checks that uncontended stays a
// subset of sync in every snapshot. Afterwards every item was destroyed once, the counters add
// up, and nothing is left in flight: a lone put under the gate finds itself alone.
TEST_F(AsyncTeardownStressTest, ProducersRacingGateSwitchesLeaveNothingInFlight) {
  constexpr std::size_t producers = 4;
  const std::size_t per_producer = scaled(10'000);
  auto items = random_items(producers * per_producer + 1, 100, 2024);
  item& lone = items.back();
  item_async async({.reaper = {.name = "async_teardown", .nice = 0}}, traits());
  std::atomic<bool> done{false};
  std::latch go(producers + 2);
  std::vector<std::thread> threads;
  for (std::size_t p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      go.arrive_and_wait();
      for (std::size_t i = 0; i < per_producer; ++i) (void)async.put(items[p * per_producer + i]);
    });
  }
  std::thread controller([&] {
    std::mt19937 random(11);
    go.arrive_and_wait();
    while (!done.load()) {
      async.set_min_concurrent(static_cast<std::uint32_t>(random() % 3 + 1));
      std::this_thread::yield();
    }
  });
  std::string monitor_failure;
  std::thread monitor([&] {
    go.arrive_and_wait();
    while (!done.load() && monitor_failure.empty()) {
      const teardown::async_teardown_stats s = async.stats();
      if (s.inline_uncontended > s.inline_total) monitor_failure = "uncontended > sync";
      if (s.inline_rejected > s.inline_total) monitor_failure = "rejected > sync";
      std::this_thread::yield();
    }
  });
  for (std::size_t p = 0; p < producers; ++p) threads[p].join();
  done.store(true);
  controller.join();
  monitor.join();
  async.flush();

  EXPECT_EQ(monitor_failure, "");
  async.set_min_concurrent(2);
  EXPECT_EQ(async.put(lone), decision::inline_uncontended) << "a put left counted in flight";
  const teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.queued + s.inline_total, items.size());
  EXPECT_LE(s.inline_uncontended, s.inline_total);
  EXPECT_GE(s.inline_uncontended, 1u);
  EXPECT_EQ(s.reaped, s.queued);
  EXPECT_EQ(s.pending, 0u);
  const auto once = std::count_if(items.begin(), items.end(), [](const item& i) { return i.destroyed.load() == 1; });
  EXPECT_EQ(static_cast<std::size_t>(once), items.size());
  RecordProperty("queued", static_cast<int>(s.queued));
  RecordProperty("uncontended", static_cast<int>(s.inline_uncontended));
}

TEST_F(AsyncTeardownStressTest, ProducersRacingShutdownLoseNothing) {
  constexpr std::size_t producers = 4;
  const std::size_t per_producer = scaled(10'000);
  auto items = random_items(producers * per_producer, 100, 99);
  item_async async({.max_pending = 2000}, traits());
  std::atomic<std::size_t> started{0};
  std::vector<std::thread> threads;
  for (std::size_t p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      for (std::size_t i = 0; i < per_producer; ++i) {
        (void)async.put(items[p * per_producer + i]);
        if (i == per_producer / 4) started.fetch_add(1);
      }
    });
  }
  while (started.load() < producers) std::this_thread::yield();
  async.stop();  // the producers are a quarter through: the rest race the stop
  for (std::thread& t : threads) t.join();
  async.flush();
  const teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.queued + s.inline_total, items.size());
  EXPECT_EQ(s.reaped, s.queued);
  EXPECT_EQ(s.pending, 0u);
  const auto once = std::count_if(items.begin(), items.end(), [](const item& i) { return i.destroyed.load() == 1; });
  EXPECT_EQ(static_cast<std::size_t>(once), items.size());
}

// --- One budget shared by several compositions --------------------------------------------------

TEST_F(AsyncTeardownTest, SharedBudgetCapsTwoCompositionsTogether) {
  auto items = make_items({60, 50, 40, 50});
  const auto shared = std::make_shared<teardown::budget>(100);
  item_async first({.shared_budget = shared}, traits());
  item_async second({.shared_budget = shared}, traits());
  first.freeze();
  second.freeze();
  EXPECT_EQ(first.put(items[0]), decision::queued);
  EXPECT_EQ(second.put(items[1]), decision::inline_rejected)
      << "50 fits a cap of 100 on its own, but the other composition holds 60 of the shared 100";
  EXPECT_EQ(second.put(items[2]), decision::queued) << "40 fits what is left";
  EXPECT_EQ(shared->pending(), 100u);
  EXPECT_EQ(first.stats().pending, 100u) << "pending is the shared budget's: every sharer's charges";
  EXPECT_EQ(second.stats().pending, 100u);
  EXPECT_EQ(second.stats().inline_rejected, 1u);
  EXPECT_EQ(first.stats().inline_rejected, 0u) << "the decision counters stay each composition's own";
  EXPECT_EQ(first.max_pending(), 100u);
  first.thaw();
  first.flush();
  EXPECT_EQ(shared->pending(), 40u) << "the first composition's reaper released its 60 to the shared budget";
  EXPECT_EQ(second.put(items[3]), decision::queued) << "the released charge is room for the other composition";
  second.thaw();
  second.flush();
  EXPECT_EQ(shared->pending(), 0u);
  EXPECT_EQ(shared->high_water(), 100u);
  for (const item& i : items) EXPECT_EQ(i.destroyed.load(), 1) << i.id;
}

TEST_F(AsyncTeardownTest, CompositionDestroyedWithQueuedItemsReleasesThemToTheSharedBudget) {
  auto items = make_items({70});
  const auto shared = std::make_shared<teardown::budget>(100);
  {
    item_async async({.shared_budget = shared}, traits());
    async.freeze();
    EXPECT_EQ(async.put(items[0]), decision::queued);
    EXPECT_EQ(shared->pending(), 70u);
  }
  EXPECT_EQ(items[0].destroyed.load(), 1);
  EXPECT_EQ(shared->pending(), 0u);
  EXPECT_EQ(shared.use_count(), 1) << "the composition let go of the shared budget";
}

TEST_F(AsyncTeardownTest, MaxPendingAlongWithASharedBudgetIsRefused) {
  const auto shared = std::make_shared<teardown::budget>(100);
  try {
    item_async async({.max_pending = 50, .shared_budget = shared}, traits());
    FAIL() << "constructed with both max_pending and shared_budget";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("teardown::async_teardown"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("shared_budget"), std::string::npos) << e.what();
  }
  EXPECT_EQ(shared->cap(), 100u) << "nothing changed";
  EXPECT_EQ(shared.use_count(), 1);
}

TEST_F(AsyncTeardownTest, SetMaxPendingOnASharedBudgetSetsTheSharedCap) {
  auto items = make_items({60});
  const auto shared = std::make_shared<teardown::budget>(100);
  item_async first({.shared_budget = shared}, traits());
  item_async second({.shared_budget = shared}, traits());
  first.set_max_pending(50);
  EXPECT_EQ(shared->cap(), 50u);
  EXPECT_EQ(second.max_pending(), 50u) << "one cap for every sharer";
  EXPECT_EQ(second.put(items[0]), decision::inline_rejected);
  EXPECT_THROW(second.set_max_pending(teardown::budget::max_cap + 1), std::invalid_argument);
  EXPECT_EQ(shared->cap(), 50u) << "a refused cap changes nothing";
}

// Two compositions, each with its own producers, on one small shared budget: the budget's
// high-water mark never passes the cap, every item is destroyed once, and the counters add up.
TEST_F(AsyncTeardownStressTest, TwoCompositionsOnASharedBudgetNeverOverAdmitTogether) {
  constexpr std::size_t producers_each = 2;
  constexpr std::uint64_t cap = 3000;
  constexpr std::uint64_t max_cost = 200;
  const std::size_t per_producer = scaled(10'000);
  auto items = random_items(2 * producers_each * per_producer, max_cost, 7);
  const auto shared = std::make_shared<teardown::budget>(cap);
  const async_teardown_options opts{.threshold = 10, .shared_budget = shared,
                                    .reaper = {.name = "async_teardown", .nice = 0}};
  item_async first(opts, traits());
  item_async second(opts, traits());
  std::latch go(2 * producers_each);
  std::vector<std::thread> threads;
  for (std::size_t p = 0; p < 2 * producers_each; ++p) {
    threads.emplace_back([&, p] {
      item_async& async = p % 2 == 0 ? first : second;
      go.arrive_and_wait();
      for (std::size_t i = 0; i < per_producer; ++i) {
        (void)async.put(items[p * per_producer + i]);
        if (i % 16 == 0) std::this_thread::yield();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  first.flush();
  second.flush();
  const teardown::async_teardown_stats a = first.stats();
  const teardown::async_teardown_stats b = second.stats();
  EXPECT_EQ(a.queued + a.inline_total + b.queued + b.inline_total, items.size());
  EXPECT_EQ(a.reaped, a.queued);
  EXPECT_EQ(b.reaped, b.queued);
  EXPECT_GT(a.queued + b.queued, 0u);
  EXPECT_EQ(shared->pending(), 0u);
  EXPECT_LE(shared->high_water(), cap);
  const auto once = std::count_if(items.begin(), items.end(), [](const item& i) { return i.destroyed.load() == 1; });
  EXPECT_EQ(static_cast<std::size_t>(once), items.size());
}

}  // namespace
}  // namespace teardown_test

namespace teardown_test {
namespace {

// --- Constructors and options ------------------------------------------------------------------

// Traits with no state, so that `async_teardown a({})` needs nothing else.
struct plain_item {
  llist_node hook;
  std::uint64_t charge = 0;
  std::atomic<int> destroyed{0};
};
struct plain_traits {
  static std::uint64_t cost(const plain_item&) { return 1; }
  static bool eligible(const plain_item&, std::uint64_t) { return true; }
  static void prepare(plain_item&) {}
  static void destroy(plain_item& i) { i.destroyed.fetch_add(1); }
  static std::uint64_t& charge(plain_item& i) { return i.charge; }
};
using plain_async = teardown::async_teardown<plain_item, &plain_item::hook, plain_traits>;
using plain_pooled_async = teardown::async_teardown<plain_item, &plain_item::hook, plain_traits, teardown::static_key,
                                                    teardown::reaper_pool_workers>;
static_assert(!std::is_copy_constructible_v<plain_async> && !std::is_move_constructible_v<plain_async>);
static_assert(!std::is_copy_assignable_v<plain_async>);

template <class Async>
void expect_defaults_and_a_working_put(Async& async) {
  const teardown::async_teardown_options defaults;
  EXPECT_TRUE(async.enabled());
  EXPECT_EQ(async.threshold(), defaults.threshold);
  EXPECT_EQ(async.max_pending(), defaults.max_pending);
  EXPECT_EQ(async.min_concurrent(), defaults.min_concurrent);
  plain_item one;
  EXPECT_EQ(async.put(one), decision::queued);
  async.flush();
  EXPECT_EQ(one.destroyed.load(), 1);
}

TEST_F(AsyncTeardownTest, EmptyBracesMeanTheDefaultOptions) {
  plain_async async({});
  expect_defaults_and_a_working_put(async);
  plain_pooled_async pooled({});
  expect_defaults_and_a_working_put(pooled);
  plain_async with_traits({}, plain_traits{});
  expect_defaults_and_a_working_put(with_traits);
}

std::size_t live_task_count() {
  return static_cast<std::size_t>(std::distance(std::filesystem::directory_iterator("/proc/self/task"),
                                                std::filesystem::directory_iterator()));
}

TEST_F(AsyncTeardownTest, InvalidOptionsAreRefusedNamingTheFieldBeforeAnyThreadStarts) {
  const std::size_t threads_before = live_task_count();
  const auto refusal = [](async_teardown_options opts) -> std::string {
    try {
      plain_async async(std::move(opts));
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "accepted";
  };
  const auto names = [](const std::string& what, const std::string& field) {
    return what.find("teardown::async_teardown: " + field) != std::string::npos;
  };
  EXPECT_TRUE(names(refusal({.reaper = {.nice = 20}}), "reaper.nice"));
  EXPECT_TRUE(names(refusal({.reaper = {.nice = -21}}), "reaper.nice"));
  EXPECT_TRUE(names(refusal({.reaper = {.stall_threshold = -1ns}}), "reaper.stall_threshold"));
  EXPECT_TRUE(names(refusal({.reaper = {.yield_after = -1ns}}), "reaper.yield_after"));
  EXPECT_TRUE(names(refusal({.max_pending = teardown::budget::max_cap + 1}), "max_pending"));
  EXPECT_TRUE(names(refusal({.min_concurrent = 0}), "min_concurrent"));
  // The compiled-out form starts no worker, but bad options are bad there too.
  EXPECT_THROW((teardown::async_teardown<plain_item, &plain_item::hook, plain_traits, teardown::const_key<false>>(
                   {.reaper = {.nice = 20}})),
               std::invalid_argument);
  EXPECT_EQ(live_task_count(), threads_before) << "no worker was started";
}

// --- shutdown_for: shutdown with a deadline -----------------------------------------------------

TEST_F(AsyncTeardownTest, ShutdownForWithNothingBlockingTearsDownEverythingAndReturnsTrue) {
  auto items = make_items({10, 20, 30});
  item_async async({}, traits());
  async.freeze();
  for (item& i : items) EXPECT_EQ(async.put(i), decision::queued);
  EXPECT_TRUE(async.stop_for(30s));  // a liveness bound, not a time assertion
  for (const item& i : items) EXPECT_EQ(i.destroyed.load(), 1) << "item " << i.id;
  EXPECT_EQ(async.stats().pending, 0u);
  EXPECT_FALSE(async.worker_stats().running);
}

// destroy blocks: shutdown_for gives up, what is left stays queued and charged, puts are inline
// from then on, and a later shutdown finishes the rest, each item once.
TEST_F(AsyncTeardownTest, ShutdownForReturnsFalseWhileDestroyBlocksAndLeavesTheRestCounted) {
  auto items = make_items({10, 20, 30, 40});
  std::atomic<bool> started{false};
  std::atomic<bool> release{false};
  items[0].on_destroy = [&](item&) {
    started.store(true);
    while (!release.load()) std::this_thread::yield();
  };
  item_async async({}, traits());
  async.freeze();
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(async.put(items[i]), decision::queued);
  async.thaw();
  ASSERT_TRUE(eventually([&] { return started.load(); }));
  EXPECT_FALSE(async.stop_for(20ms));
  EXPECT_EQ(async.stats().pending, 60u) << "the charges of the three items: none released yet";
  EXPECT_EQ(async.worker_stats().pending, 3u);
  EXPECT_EQ(async.put(items[3]), decision::inline_stopped);
  EXPECT_EQ(items[3].destroyed.load(), 1);
  EXPECT_EQ(items[3].destroyed_on, std::this_thread::get_id());
  release.store(true);
  async.stop();
  for (const item& i : items) EXPECT_EQ(i.destroyed.load(), 1) << "item " << i.id;
  EXPECT_EQ(async.stats().pending, 0u);
  EXPECT_EQ(async.stats().reaped, 3u);
}

TEST_F(AsyncTeardownTest, ShutdownForOnACompiledOutCompositionReturnsTrue) {
  compiled_out_async async({}, traits());
  EXPECT_TRUE(async.stop_for(0s));
}

// --- Destroying the composition from its own callback: a clear abort -------------------------

[[noreturn]] void wait_for_the_abort() {
  for (int i = 0; i < 10'000; ++i) std::this_thread::sleep_for(1ms);
  std::_Exit(0);  // no abort: the death test reports "did not die"
}

class AsyncTeardownDeathTest : public AsyncTeardownTest {
 protected:
  AsyncTeardownDeathTest() { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(AsyncTeardownDeathTest, DestroyingTheCompositionFromDestroyOnItsWorkerAbortsWithAMessage) {
  EXPECT_DEATH(
      {
        static auto items = make_items({10});
        item_async* async = nullptr;
        items[0].on_destroy = [&async](item&) { delete async; };
        async = new item_async({}, traits());
        (void)async->put(items[0]);
        wait_for_the_abort();
      },
      "teardown::async_teardown::~async_teardown: destroyed from its own callback");
}

TEST_F(AsyncTeardownDeathTest, DestroyingTheCompositionFromDestroyInsideDrainAbortsWithAMessage) {
  EXPECT_DEATH(
      {
        static auto items = make_items({10});
        item_async* async = nullptr;
        items[0].on_destroy = [&async](item&) { delete async; };
        async = new item_async({}, traits());
        async->freeze();
        (void)async->put(items[0]);
        (void)async->drain(100);
        wait_for_the_abort();
      },
      "teardown::async_teardown::~async_teardown: destroyed from its own callback");
}

// --- The old names (one release, deprecated): same values ---------------------------------------

struct reap_nothing {
  void operator()(item&) const {}
};
static_assert(teardown::worker_control<item_async>);
static_assert(teardown::worker_control<compiled_out_async>);
static_assert(teardown::worker_control<teardown::reaper<item, &item::hook, reap_nothing>>);
static_assert(teardown::worker_control<teardown::reaper_pool<item, &item::hook, reap_nothing>>);

TEST_F(AsyncTeardownTest, CostBelowTheThresholdCountsInInlineSmall) {
  auto items = make_items({99, 100});
  item_async async({.threshold = 100}, traits());
  EXPECT_EQ(async.put(items[0]), decision::inline_ineligible);
  EXPECT_EQ(async.put(items[1]), decision::queued);
  async.flush();
  const teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.inline_small, 1u);
  EXPECT_EQ(s.inline_total, 1u);
  EXPECT_EQ(s.inline_no_memory, 0u) << "only deferred_domain allocates a node";
}

TEST_F(AsyncTeardownTest, OldNamesStillWorkWithTheSameValues) {
  auto items = make_items({10, 100, 100, 100});
  // Nice 17, then 18: a raise of the value, which any user may make (lowering it needs a privilege).
  item_async async({.threshold = 50, .max_pending = 100, .reaper = {.name = "async_teardown", .nice = 17}}, traits());
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  static_assert(decision::sync_disabled == decision::inline_disabled);
  static_assert(decision::sync_ineligible == decision::inline_ineligible);
  static_assert(decision::sync_rejected == decision::inline_rejected);
  static_assert(decision::sync_stalled == decision::inline_stalled);
  static_assert(decision::sync_stopped == decision::inline_stopped);
  static_assert(decision::sync_uncontended == decision::inline_uncontended);
  static_assert(decision::sync_no_memory == decision::inline_no_memory);
  EXPECT_STREQ(teardown::to_string(decision::sync_rejected), "rejected");
  EXPECT_EQ(async.put(items[0]), decision::sync_ineligible);
  async.freeze();
  EXPECT_EQ(async.put(items[1]), decision::queued);
  EXPECT_EQ(async.put(items[2]), decision::sync_rejected);
  const teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.sync, 2u);
  EXPECT_EQ(s.sync, s.inline_total);
  EXPECT_EQ(s.rejected, 1u);
  EXPECT_EQ(s.rejected, s.inline_rejected);
  EXPECT_EQ(s.stalled, s.inline_stalled);
  EXPECT_EQ(s.uncontended, s.inline_uncontended);
  EXPECT_EQ(async.worker_nice(), async.nice());
  EXPECT_TRUE(async.set_worker_nice(18));
  EXPECT_EQ(async.nice(), 18);
  EXPECT_THROW((void)async.set_worker_nice(20), std::invalid_argument);
  EXPECT_EQ(async.reaper_statistics().enqueued, async.worker_stats().enqueued);
  async.thaw();
  EXPECT_TRUE(async.shutdown_for(30s));  // a liveness bound, not a time assertion
  async.shutdown();  // idempotent, as stop()
  EXPECT_EQ(async.put(items[3]), decision::sync_stopped);
  EXPECT_FALSE(async.reaper_statistics().running);
#pragma GCC diagnostic pop
  for (const item& i : items) EXPECT_EQ(i.destroyed.load(), 1) << "item " << i.id;
}

// --- An item put while still queued: the error rule's abort, as llist::add and reaper::enqueue ---

TEST_F(AsyncTeardownDeathTest, PutOfAnItemStillQueuedAbortsWithAMessage) {
  const auto put_twice = [this] {
    static auto items = make_items({100});
    static item_async async({}, traits());
    async.freeze();  // the item stays queued
    if (async.put(items[0]) != decision::queued) std::_Exit(0);
    (void)async.put(items[0]);
    std::_Exit(0);  // no abort: the death test reports "did not die"
  };
  EXPECT_DEATH(put_twice(),
               "teardown::async_teardown::put: the item is already queued \\(element type teardown_test::");
}

TEST_F(AsyncTeardownDeathTest, PutOfAnItemOnACallersChainAbortsOnEveryPath) {
  const auto put_chained = [](auto& async) {
    static auto items = make_items({100});
    static teardown::llist_chain<item, &item::hook> chain;
    chain.push_back(items[0]);
    (void)async.put(items[0]);  // not torn down inline either
    std::_Exit(0);
  };
  const auto disabled = [&] {
    item_async async({.enabled = false}, traits());
    put_chained(async);
  };
  const auto compiled_out = [&] {
    compiled_out_async async({}, traits());
    put_chained(async);
  };
  EXPECT_DEATH(disabled(), "teardown::async_teardown::put: the item is already queued");
  EXPECT_DEATH(compiled_out(), "teardown::async_teardown::put: the item is already queued");
}

TEST_F(AsyncTeardownTest, AnItemOnACallersChainStillGoesThroughPutChain) {
  auto items = make_items({100});
  teardown::llist_chain<item, &item::hook> chain;
  chain.push_back(items[0]);
  item_async disabled({.enabled = false}, traits());
  EXPECT_EQ(disabled.put_chain(std::move(chain)), decision::inline_disabled);
  EXPECT_EQ(items[0].destroyed.load(), 1);
}

}  // namespace
}  // namespace teardown_test
