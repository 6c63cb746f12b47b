// Specification of async_teardown's worker policy (async_teardown<T, Hook, Traits, Key,
// Workers>) with a pool of reaper workers (reaper_pool_workers), and of pooled_mm_system: every
// item put from many threads reaped exactly once with the charges balancing; the worker count;
// opts.reaper supplying every worker's options (names with "-<i>", on_error) and opts.pool.worker
// refused (std::invalid_argument) rather than silently ignored; drain across the workers
// (oldest first per putting thread, within the budget);
// freeze/thaw holding every worker; shutdown, then puts inline; put_chain; the stall watchdog;
// the const_key<false> form starting no thread; bad pool options refused with no thread left; the
// model with a pool (every mm torn down exactly once, vmstat balancing). The default worker
// (one_reaper) is async_teardown_test's and mm_test's subject; here it only shows that the
// defaults are unchanged and that opts.pool does not touch it. PooledAsyncTeardownStressTest
// races producers against flush, freeze, thaw and drain.
//
// Nothing here asserts a time. A sleep is only ever a chance for a wrong implementation to
// misbehave, or the stated setup of a behaviour (the stall threshold); waits are bounded loops,
// and a hang shows as an abort from the per-test hang_guard naming the test.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <latch>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "reaper_test_support.hpp"
#include "teardown/async_teardown.hpp"
#include "teardown/model/mm.hpp"
#include "test_support.hpp"

namespace teardown_test {
namespace {

using namespace std::chrono_literals;
using reaper_support::current_test_name;
using reaper_support::hang_guard;
using teardown::async_teardown_options;
using teardown::decision;
using teardown::llist_node;

struct item {
  llist_node hook;
  std::uint64_t id = 0;
  std::uint64_t cost = 0;
  std::uint64_t charge = 0;
  bool throws = false;           // destroy throws (after counting)
  std::thread::id destroyed_on;  // written before `destroyed` is counted
  std::atomic<int> destroyed{0};
};

// What the traits saw, shared by every copy of them.
struct traits_log {
  std::mutex mutex;
  std::vector<std::uint64_t> destroy_order;  // guarded by mutex
};

struct item_traits {
  traits_log* log = nullptr;
  std::uint64_t cost(const item& i) const { return i.cost; }
  bool eligible(const item&, std::uint64_t) const { return true; }
  void prepare(item&) const {}
  void destroy(item& i) const {
    {
      const std::lock_guard lock(log->mutex);
      log->destroy_order.push_back(i.id);
    }
    i.destroyed_on = std::this_thread::get_id();
    i.destroyed.fetch_add(1);
    if (i.throws) throw std::runtime_error("destroy failed");
  }
  std::uint64_t& charge(item& i) const { return i.charge; }
};

using item_chain = teardown::llist_chain<item, &item::hook>;
using pooled_async =
    teardown::async_teardown<item, &item::hook, item_traits, teardown::static_key, teardown::reaper_pool_workers>;
using single_async = teardown::async_teardown<item, &item::hook, item_traits>;
using compiled_out_pooled =
    teardown::async_teardown<item, &item::hook, item_traits, teardown::const_key<false>, teardown::reaper_pool_workers>;

// The defaults are what they were: one reaper thread, the runtime toggle.
static_assert(std::is_same_v<single_async, teardown::async_teardown<item, &item::hook, item_traits,
                                                                    teardown::static_key, teardown::one_reaper>>);
static_assert(std::is_same_v<teardown::model::mm_system,
                             teardown::model::basic_mm_system<teardown::static_key, teardown::one_reaper>>);
static_assert(std::is_same_v<teardown::model::pooled_mm_system,
                             teardown::model::basic_mm_system<teardown::static_key, teardown::reaper_pool_workers>>);
static_assert(!std::is_copy_constructible_v<pooled_async> && !std::is_copy_assignable_v<pooled_async>);
static_assert(noexcept(std::declval<const pooled_async&>().stats()));
static_assert(noexcept(std::declval<const pooled_async&>().worker_count()));
static_assert(noexcept(std::declval<const pooled_async&>().worker_stats()));

// Designated initializers written before the pool member existed still compile.
[[maybe_unused]] const async_teardown_options old_style{.enabled = true, .reaper = {.name = "x", .nice = 0}};
[[maybe_unused]] const teardown::model::mm_system_options old_mm_style{.async_mm_teardown = true,
                                                                        .swap_min_exiting = 2};

// Two workers; the stall watchdog out of reach, so that a frozen pool sees queued, never
// sync_stalled, however slow the machine.
async_teardown_options two_workers(std::string name = "pooled") {
  async_teardown_options opts;
  opts.reaper.name = std::move(name);
  opts.reaper.stall_threshold = std::chrono::hours(1);
  opts.pool.workers = 2;
  return opts;
}

std::vector<item> make_items(std::size_t count, std::uint64_t cost) {
  std::vector<item> items(count);
  for (std::size_t at = 0; at < count; ++at) {
    items[at].id = at;
    items[at].cost = cost;
  }
  return items;
}

std::vector<item> random_items(std::size_t count, std::uint64_t max_cost, std::uint32_t seed) {
  std::vector<item> items(count);
  std::mt19937 random(seed);
  std::uniform_int_distribution<std::uint64_t> cost(1, max_cost);
  for (std::size_t at = 0; at < count; ++at) {
    items[at].id = at;
    items[at].cost = cost(random);
  }
  return items;
}

std::size_t destroyed_once(const std::vector<item>& items) {
  return static_cast<std::size_t>(
      std::count_if(items.begin(), items.end(), [](const item& i) { return i.destroyed.load() == 1; }));
}

// Runs put_slice(p) on `threads` threads that are all alive at once (so each holds a distinct
// placement index while it puts), and joins them.
template <class PutSlice>
void put_from_threads(std::size_t threads, PutSlice put_slice) {
  std::latch go(static_cast<std::ptrdiff_t>(threads));
  std::vector<std::thread> producers;
  for (std::size_t p = 0; p < threads; ++p) {
    producers.emplace_back([&, p] {
      go.arrive_and_wait();
      put_slice(p);
    });
  }
  for (std::thread& t : producers) t.join();
}


std::size_t live_threads() {
  return static_cast<std::size_t>(std::distance(std::filesystem::directory_iterator("/proc/self/task"),
                                                std::filesystem::directory_iterator()));
}

std::set<std::string> thread_names() {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream file(entry.path() / "comm");
    std::string name;
    if (std::getline(file, name)) names.insert(name);
  }
  return names;
}

bool has_name_starting_with(const std::string& prefix) {
  const std::set<std::string> names = thread_names();
  return std::any_of(names.begin(), names.end(), [&](const std::string& n) { return n.rfind(prefix, 0) == 0; });
}

class PooledAsyncTeardownTest : public ::testing::Test {
 protected:
  item_traits traits() { return item_traits{&log_}; }
  std::vector<std::uint64_t> destroy_order() {
    const std::lock_guard lock(log_.mutex);
    return log_.destroy_order;
  }

 private:
  traits_log log_;
  hang_guard guard_{current_test_name()};
};
using PooledAsyncTeardownStressTest = PooledAsyncTeardownTest;

// --- every item once ---------------------------------------------------------------------------

TEST_F(PooledAsyncTeardownTest, ItemsPutFromManyThreadsAreEachReapedExactlyOnceAndTheChargesBalance) {
  constexpr std::size_t producers = 4;
  const std::size_t per_producer = scaled(5'000);
  auto items = random_items(producers * per_producer, 100, 7);
  pooled_async async(two_workers(), traits());
  std::atomic<std::uint64_t> queued{0};
  std::uint64_t total_cost = 0;
  for (const item& i : items) total_cost += i.cost;

  put_from_threads(producers, [&](std::size_t p) {
    std::uint64_t mine = 0;
    for (std::size_t k = 0; k < per_producer; ++k) {
      if (async.put(items[p * per_producer + k]) == decision::queued) ++mine;
    }
    queued.fetch_add(mine);
  });
  async.flush();

  EXPECT_EQ(destroyed_once(items), items.size());
  const teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.queued, queued.load());
  EXPECT_EQ(s.queued, items.size()) << "no threshold, no cap: everything queued";
  EXPECT_EQ(s.inline_total, 0u);
  EXPECT_EQ(s.reaped, s.queued);
  EXPECT_EQ(s.pending, 0u);
  EXPECT_EQ(s.errors, 0u);
  EXPECT_LE(s.high_water, total_cost);
  const teardown::reaper_stats r = async.worker_stats();
  EXPECT_EQ(r.enqueued, s.queued) << "the workers' sums";
  EXPECT_EQ(r.reaped, s.queued);
  EXPECT_EQ(r.pending, 0u);
  EXPECT_TRUE(r.running);
}

// --- workers and their options -----------------------------------------------------------------

TEST_F(PooledAsyncTeardownTest, WorkerCountIsThePoolsSizeAndEachWorkerIsNamedAfterOptsReaper) {
  async_teardown_options opts = two_workers("pooled");
  pooled_async async(std::move(opts), traits());
  EXPECT_EQ(async.worker_count(), 2u);
  async.flush();  // each worker has run its setup (its name included) before its first pass
  EXPECT_TRUE(eventually([] {
    const std::set<std::string> names = thread_names();
    return names.count("pooled-0") == 1 && names.count("pooled-1") == 1;
  }));
}

// opts.reaper is every worker's options: a pool.worker that is not default would be ignored, so
// it is refused, naming the field, before any thread starts; each field of reaper_options counts.
TEST_F(PooledAsyncTeardownTest, PoolWorkerOptionsAreRefusedNotIgnored) {
  const std::vector<std::function<void(teardown::reaper_options&)>> set_one = {
      [](teardown::reaper_options& o) { o.name = "ignored"; },
      [](teardown::reaper_options& o) { o.nice = 0; },
      [](teardown::reaper_options& o) { o.on_error = [](std::exception_ptr) {}; },
      [](teardown::reaper_options& o) { o.cpus = {0}; },
      [](teardown::reaper_options& o) { o.policy = teardown::sched_policy::batch; },
      [](teardown::reaper_options& o) { o.order = teardown::drain_order::newest_first; },
      [](teardown::reaper_options& o) { o.spin_polls = 1; },
      [](teardown::reaper_options& o) { o.stall_threshold = 2s; },
      [](teardown::reaper_options& o) { o.yield_after = 1ms; },
      [](teardown::reaper_options& o) { o.poll_interval = 1ms; },
      [](teardown::reaper_options& o) { o.poll_interval_max = 2ms; },
      [](teardown::reaper_options& o) { o.on_fork = teardown::fork_policy::wait_for_item; },
      [](teardown::reaper_options& o) { o.boost_after = 0ms; },
      [](teardown::reaper_options& o) { o.boost_nice = 0; },
      [](teardown::reaper_options& o) { o.trace_domain = 1; },
      [](teardown::reaper_options& o) { o.after_batch = [] {}; },
      [](teardown::reaper_options& o) { o.driven = true; },
      [](teardown::reaper_options& o) { o.on_work = [](teardown::drive_handle) {}; },
  };
  const std::size_t threads_before = thread_names().size();
  for (std::size_t field = 0; field < set_one.size(); ++field) {
    async_teardown_options pooled = two_workers("refused");
    set_one[field](pooled.pool.worker);
    try {
      pooled_async async(std::move(pooled), traits());
      ADD_FAILURE() << "field " << field << " of pool.worker was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string_view(e.what()).find("pool.worker is set"), std::string_view::npos) << e.what();
    }
    async_teardown_options single = two_workers("refused");
    set_one[field](single.pool.worker);
    EXPECT_THROW(single_async(std::move(single), traits()), std::invalid_argument) << "field " << field;
  }
  EXPECT_FALSE(has_name_starting_with("refused"));
  EXPECT_EQ(thread_names().size(), threads_before) << "no thread started";
}

TEST_F(PooledAsyncTeardownTest, DefaultNameIsCutSoThatEachWorkersSuffixSurvives) {
  async_teardown_options opts;
  opts.pool.workers = 2;
  pooled_async async(std::move(opts), traits());
  async.flush();
  EXPECT_TRUE(eventually([] {
    const std::set<std::string> names = thread_names();
    return names.count("async_teardow-0") == 1 && names.count("async_teardow-1") == 1;
  }));
}

TEST_F(PooledAsyncTeardownTest, OneReaperIgnoresThePoolOptionsAndCountsOneWorker) {
  async_teardown_options opts = two_workers("single");
  opts.pool.workers = teardown::reaper_pool<item, &item::hook, item_traits>::max_workers + 1;  // never read
  single_async async(std::move(opts), traits());
  EXPECT_EQ(async.worker_count(), 1u);
  async.flush();
  EXPECT_TRUE(eventually([] { return thread_names().count("single") == 1; }));
  EXPECT_FALSE(has_name_starting_with("single-"));
}

TEST_F(PooledAsyncTeardownTest, OptsReaperOnErrorServesEveryWorker) {
  constexpr std::size_t producers = 2;
  constexpr std::size_t per_producer = 8;
  auto items = make_items(producers * per_producer, 1);
  for (item& i : items) i.throws = true;
  std::atomic<int> reported{0};
  async_teardown_options opts = two_workers();
  opts.reaper.on_error = [&reported](std::exception_ptr) { reported.fetch_add(1); };
  pooled_async async(std::move(opts), traits());

  put_from_threads(producers, [&](std::size_t p) {
    for (std::size_t k = 0; k < per_producer; ++k) EXPECT_EQ(async.put(items[p * per_producer + k]), decision::queued);
  });
  async.flush();

  EXPECT_EQ(destroyed_once(items), items.size());
  EXPECT_EQ(reported.load(), static_cast<int>(items.size()));
  const teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.errors, items.size());
  EXPECT_EQ(s.reaped, items.size()) << "counted and released even though destroy threw";
  EXPECT_EQ(s.pending, 0u);
}

// --- drain -------------------------------------------------------------------------------------

// Equal costs, so the budget takes the first items offered. The pool offers each worker's queue
// in turn, oldest first per putting thread; so what a thread put is drained as a prefix of its
// puts, in their order, whichever worker holds them.
TEST_F(PooledAsyncTeardownTest, DrainAcrossThePoolTakesEachThreadsOldestItemsWithinTheBudget) {
  constexpr std::size_t producers = 2;
  constexpr std::size_t per_producer = 10;
  auto items = make_items(producers * per_producer, 10);
  async_teardown_options opts = two_workers();
  opts.reaper.waiters_help = false;  // what the drain left runs on the workers, not on a helping flush
  pooled_async async(opts, traits());
  async.freeze();
  put_from_threads(producers, [&](std::size_t p) {
    for (std::size_t k = 0; k < per_producer; ++k) EXPECT_EQ(async.put(items[p * per_producer + k]), decision::queued);
  });

  const teardown::drain_result drained = async.drain(75);
  EXPECT_EQ(drained.items, 7u) << "seven charges of 10 fit in 75, an eighth does not";
  EXPECT_EQ(drained.cost, 70u);
  const std::vector<std::uint64_t> order = destroy_order();
  ASSERT_EQ(order.size(), 7u) << "nothing but the drain ran: the pool is frozen";
  for (std::size_t p = 0; p < producers; ++p) {
    std::vector<std::uint64_t> mine;
    for (std::uint64_t id : order) {
      if (id / per_producer == p) mine.push_back(id);
    }
    for (std::size_t k = 0; k < mine.size(); ++k) {
      EXPECT_EQ(mine[k], p * per_producer + k) << "producer " << p << ": its oldest first, in its order";
    }
  }
  for (std::uint64_t id : order) EXPECT_EQ(items[id].destroyed_on, std::this_thread::get_id());
  teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.drained, 7u);
  EXPECT_EQ(s.reaped, 7u);
  EXPECT_EQ(s.pending, 130u);

  async.thaw();
  async.flush();
  EXPECT_EQ(destroyed_once(items), items.size());
  for (const item& i : items) {
    if (std::find(order.begin(), order.end(), i.id) == order.end()) {
      EXPECT_NE(i.destroyed_on, std::this_thread::get_id()) << "item " << i.id << ": left to the workers";
    }
  }
  s = async.stats();
  EXPECT_EQ(s.drained, 7u);
  EXPECT_EQ(s.reaped, s.queued);
  EXPECT_EQ(s.queued, items.size());
  EXPECT_EQ(s.pending, 0u);
}

TEST_F(PooledAsyncTeardownTest, DrainOfAFrozenPoolReachesEveryWorkersQueue) {
  constexpr std::size_t producers = 4;
  constexpr std::size_t per_producer = 25;
  auto items = make_items(producers * per_producer, 3);
  pooled_async async(two_workers(), traits());
  async.freeze();
  put_from_threads(producers, [&](std::size_t p) {
    for (std::size_t k = 0; k < per_producer; ++k) EXPECT_EQ(async.put(items[p * per_producer + k]), decision::queued);
  });

  const teardown::drain_result drained = async.drain(std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(drained.items, items.size());
  EXPECT_EQ(drained.cost, 3 * items.size());
  EXPECT_EQ(destroyed_once(items), items.size());
  for (const item& i : items) EXPECT_EQ(i.destroyed_on, std::this_thread::get_id());
  EXPECT_EQ(async.stats().pending, 0u);
  EXPECT_EQ(async.drain(100).items, 0u) << "nothing left on any worker";
  async.thaw();
}

// --- freeze, thaw, shutdown --------------------------------------------------------------------

TEST_F(PooledAsyncTeardownTest, FrozenPoolDestroysNothingUntilItsLastThaw) {
  constexpr std::size_t producers = 2;
  constexpr std::size_t per_producer = 50;
  auto items = make_items(producers * per_producer, 2);
  pooled_async async(two_workers(), traits());
  async.freeze();
  async.freeze();  // nests
  put_from_threads(producers, [&](std::size_t p) {
    for (std::size_t k = 0; k < per_producer; ++k) EXPECT_EQ(async.put(items[p * per_producer + k]), decision::queued);
  });
  std::this_thread::sleep_for(20ms);  // a chance for a worker that ignored the freeze
  EXPECT_EQ(destroy_order().size(), 0u);
  EXPECT_EQ(async.stats().pending, 2 * items.size());

  async.thaw();
  std::this_thread::sleep_for(20ms);  // still frozen once
  EXPECT_EQ(destroy_order().size(), 0u);
  EXPECT_EQ(async.stats().reaped, 0u);

  async.thaw();
  async.flush();
  EXPECT_EQ(destroyed_once(items), items.size());
  EXPECT_EQ(async.stats().pending, 0u);
  EXPECT_THROW(async.thaw(), std::logic_error) << "not frozen";
}

TEST_F(PooledAsyncTeardownTest, ShutdownTearsDownEveryWorkersBacklogAndLaterPutsAreSyncStopped) {
  constexpr std::size_t producers = 2;
  constexpr std::size_t per_producer = 10;
  auto items = make_items(producers * per_producer + 1, 5);
  item& late = items.back();
  pooled_async async(two_workers(), traits());
  async.freeze();
  put_from_threads(producers, [&](std::size_t p) {
    for (std::size_t k = 0; k < per_producer; ++k) EXPECT_EQ(async.put(items[p * per_producer + k]), decision::queued);
  });

  async.stop();  // overrides the freeze
  EXPECT_EQ(destroyed_once(items), items.size() - 1);
  EXPECT_FALSE(async.worker_stats().running) << "every worker joined";
  EXPECT_EQ(async.put(late), decision::inline_stopped);
  EXPECT_EQ(late.destroyed.load(), 1);
  EXPECT_EQ(late.destroyed_on, std::this_thread::get_id());
  async.stop();  // idempotent
  const teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.queued, items.size() - 1);
  EXPECT_EQ(s.reaped, s.queued);
  EXPECT_EQ(s.inline_total, 1u);
  EXPECT_EQ(s.pending, 0u);
}

// --- put_chain ---------------------------------------------------------------------------------

TEST_F(PooledAsyncTeardownTest, PutChainQueuesEachThreadsChainUnderOneChargeAndEveryItemIsReapedOnce) {
  constexpr std::size_t producers = 2;
  constexpr std::size_t per_chain = 5;
  auto items = make_items(producers * per_chain, 10);
  pooled_async async(two_workers(), traits());
  async.freeze();
  put_from_threads(producers, [&](std::size_t p) {
    item_chain chain;
    for (std::size_t k = 0; k < per_chain; ++k) chain.push_back(items[p * per_chain + k]);
    EXPECT_EQ(async.put_chain(std::move(chain)), decision::queued);
    EXPECT_TRUE(chain.empty()) << "consumed";
  });
  EXPECT_EQ(async.stats().pending, 10 * items.size());
  EXPECT_EQ(async.worker_stats().enqueued, items.size());
  for (const item& i : items) EXPECT_EQ(i.charge, 10u) << "item " << i.id << ": its own charge is memoised";

  async.thaw();
  async.flush();
  EXPECT_EQ(destroyed_once(items), items.size());
  const teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.queued, items.size());
  EXPECT_EQ(s.reaped, items.size());
  EXPECT_EQ(s.pending, 0u);
}

// --- the stall watchdog ------------------------------------------------------------------------

TEST_F(PooledAsyncTeardownTest, StalledWorkerMakesLaterPutsTearDownInline) {
  auto items = make_items(2, 1);
  async_teardown_options opts = two_workers();
  opts.reaper.stall_threshold = 1ms;  // every worker's
  pooled_async async(std::move(opts), traits());
  async.freeze();
  EXPECT_EQ(async.put(items[0]), decision::queued);
  EXPECT_TRUE(eventually([&] { return async.stalled(); }));
  EXPECT_EQ(async.put(items[1]), decision::inline_stalled);
  EXPECT_EQ(items[1].destroyed.load(), 1);
  async.thaw();
  async.flush();
  EXPECT_FALSE(async.stalled());
  EXPECT_EQ(destroyed_once(items), items.size());
  EXPECT_EQ(async.stats().inline_stalled, 1u);
}

// --- const_key<false> and bad options ----------------------------------------------------------

TEST_F(PooledAsyncTeardownTest, CompiledOutPoolStartsNoThreadAndTearsDownInline) {
  auto items = make_items(1, 100);
  const std::size_t threads_before = live_threads();
  async_teardown_options opts;
  opts.pool.workers = 4;
  compiled_out_pooled async(std::move(opts), traits());
  EXPECT_TRUE(eventually([&] { return live_threads() == threads_before; })) << "no worker thread";
  EXPECT_EQ(async.worker_count(), 0u);
  EXPECT_FALSE(async.worker_stats().running);
  EXPECT_EQ(async.put(items[0]), decision::inline_disabled);
  EXPECT_EQ(items[0].destroyed.load(), 1);
  EXPECT_EQ(items[0].destroyed_on, std::this_thread::get_id());
  EXPECT_EQ(async.drain(100).items, 0u);
  async.flush();
  EXPECT_TRUE(async.flush_for(1s));
  async.freeze();
  EXPECT_THROW(async.thaw(), std::logic_error);
  async.stop();
}

TEST_F(PooledAsyncTeardownTest, BadPoolOptionsAreRefusedByTheConstructorLeavingNoThread) {
  const std::size_t threads_before = live_threads();
  {
    async_teardown_options opts = two_workers();
    opts.pool.workers = teardown::reaper_pool<item, &item::hook, item_traits>::max_workers + 1;
    EXPECT_THROW(pooled_async(std::move(opts), traits()), std::invalid_argument);
  }
  {
    async_teardown_options opts = two_workers();
    opts.pool.steal_after = -1ns;
    EXPECT_THROW(pooled_async(std::move(opts), traits()), std::invalid_argument);
  }
  {
    async_teardown_options opts = two_workers();
    opts.reaper.cpus = {-1};  // opts.reaper is every worker's: the pool validates its CPUs
    EXPECT_THROW(pooled_async(std::move(opts), traits()), std::invalid_argument);
  }
  EXPECT_TRUE(eventually([&] { return live_threads() == threads_before; }))
      << "nothing started, or everything started was stopped";
}

TEST_F(PooledAsyncTeardownTest, PoolWorkerCpusAreRefusedLikeTheRestOfPoolWorker) {
  async_teardown_options opts = two_workers();
  opts.pool.worker.cpus = {-1};  // once silently ignored
  EXPECT_THROW(pooled_async(std::move(opts), traits()), std::invalid_argument);
}

// --- pooled_mm_system --------------------------------------------------------------------------

using teardown::model::mm_struct;
using teardown::model::pooled_mm_system;

teardown::model::mm_system_options pooled_kernel_options() {
  teardown::model::mm_system_options opts;
  opts.async_mm_teardown = true;
  opts.thresh_pages = 100;
  opts.max_pending_pages = 1'000'000'000;
  opts.reaper.stall_threshold = std::chrono::hours(1);
  opts.pool.workers = 2;
  return opts;
}

using PooledMmSystemTest = PooledAsyncTeardownTest;

TEST_F(PooledMmSystemTest, EveryExitedMmIsTornDownExactlyOnceAndVmstatBalances) {
  constexpr std::size_t threads = 4;
  const std::size_t per_thread = scaled(500);
  pooled_mm_system kernel(pooled_kernel_options());
  std::vector<std::vector<mm_struct*>> held(threads);  // one mmgrab each, dropped at the end
  std::atomic<std::uint64_t> queued{0}, sync{0};

  put_from_threads(threads, [&](std::size_t t) {
    std::mt19937 random(static_cast<std::uint32_t>(t + 1));
    std::uniform_int_distribution<std::uint64_t> rss(10, 1'000);  // some below the threshold
    for (std::size_t k = 0; k < per_thread; ++k) {
      auto task = kernel.spawn(rss(random));
      mm_struct* mm = task->mm();
      pooled_mm_system::mmgrab(*mm);
      held[t].push_back(mm);
      const std::optional<decision> decided = task->exit();
      ASSERT_TRUE(decided.has_value()) << "the only user: its exit is the final one";
      (*decided == decision::queued ? queued : sync).fetch_add(1);
    }
  });
  kernel.flush();

  std::size_t exits = 0;
  for (const std::vector<mm_struct*>& mine : held) {
    for (mm_struct* mm : mine) {
      EXPECT_EQ(mm->teardowns.load(), 1u) << "mm " << mm->id;
      ++exits;
    }
  }
  EXPECT_EQ(exits, threads * per_thread);
  const teardown::model::vmstat v = kernel.vmstat();
  EXPECT_EQ(v.queued, queued.load());
  EXPECT_EQ(v.sync, sync.load());
  EXPECT_EQ(v.queued + v.sync, exits);
  EXPECT_GT(v.queued, 0u);
  EXPECT_GT(v.sync, 0u);
  EXPECT_EQ(v.reaped, v.queued);
  EXPECT_EQ(v.pending_pages, 0u);
  EXPECT_EQ(kernel.teardowns(), exits);
  EXPECT_EQ(kernel.stats().reaper.enqueued, v.queued) << "the workers' sums";
  EXPECT_TRUE(eventually([] {
    const std::set<std::string> names = thread_names();
    return names.count("mm_reaper-0") == 1 && names.count("mm_reaper-1") == 1;
  }));
  for (const std::vector<mm_struct*>& mine : held) {
    for (mm_struct* mm : mine) pooled_mm_system::mmdrop(*mm);
  }
}

TEST_F(PooledMmSystemTest, FreezeDrainAndThawActOnThePool) {
  constexpr std::size_t tasks = 6;
  pooled_mm_system kernel(pooled_kernel_options());
  std::vector<mm_struct*> held;
  kernel.freeze();
  for (std::size_t k = 0; k < tasks; ++k) {
    auto task = kernel.spawn(200);
    held.push_back(task->mm());
    pooled_mm_system::mmgrab(*held.back());
    EXPECT_EQ(task->exit(), decision::queued);
  }
  EXPECT_EQ(kernel.vmstat().pending_pages, 200 * tasks);
  const teardown::drain_result drained = kernel.drain(500);
  EXPECT_EQ(drained.items, 2u) << "two charges of 200 fit in 500, a third does not";
  EXPECT_EQ(drained.cost, 400u);
  kernel.thaw();
  kernel.flush();
  for (mm_struct* mm : held) EXPECT_EQ(mm->teardowns.load(), 1u) << "mm " << mm->id;
  const teardown::model::vmstat v = kernel.vmstat();
  EXPECT_EQ(v.queued, tasks);
  EXPECT_EQ(v.reaped, tasks);
  EXPECT_EQ(v.drained, 2u);
  EXPECT_EQ(v.pending_pages, 0u);
  for (mm_struct* mm : held) pooled_mm_system::mmdrop(*mm);
}

TEST_F(PooledMmSystemTest, BadPoolOptionsAreRefused) {
  const std::size_t threads_before = live_threads();
  teardown::model::mm_system_options opts = pooled_kernel_options();
  opts.pool.workers = teardown::reaper_pool<item, &item::hook, item_traits>::max_workers + 1;
  EXPECT_THROW(pooled_mm_system{std::move(opts)}, std::invalid_argument);
  EXPECT_TRUE(eventually([&] { return live_threads() == threads_before; }))
      << "every thread it had started was stopped";
}

// --- Many threads ------------------------------------------------------------------------------

// Producers put items of random costs into a small budget while one controller freezes, drains
// and thaws the pool and another flushes it, and a monitor samples the counters. Afterwards every
// item was destroyed exactly once, the counters add up and the budget never admitted past its
// cap (the sampled pending may show a failing reserve's charge for an instant: at most one item
// per producer above the cap).
TEST_F(PooledAsyncTeardownStressTest, ProducersRacingFlushFreezeThawAndDrainLoseNothing) {
  constexpr std::size_t producers = 4;
  constexpr std::uint64_t cap = 5'000;
  constexpr std::uint64_t max_cost = 200;
  const std::size_t per_producer = scaled(20'000);
  auto items = random_items(producers * per_producer, max_cost, 20260101);
  async_teardown_options opts = two_workers();
  opts.threshold = 10;
  opts.max_pending = cap;
  opts.reaper.nice = 0;  // on a small machine nice-19 workers behind busy threads leave the budget full
  opts.reaper.stall_threshold = 50ms;  // the watchdog takes part too
  opts.pool.steal_after = 0ns;         // steals as soon as it can
  pooled_async async(std::move(opts), traits());
  std::atomic<bool> done{false};
  std::atomic<std::uint64_t> queued{0};
  std::latch go(producers + 3);

  std::vector<std::thread> threads;
  for (std::size_t p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      go.arrive_and_wait();
      std::uint64_t mine = 0;
      for (std::size_t k = 0; k < per_producer; ++k) {
        if (async.put(items[p * per_producer + k]) == decision::queued) ++mine;
        if (k % 16 == 0) std::this_thread::yield();
      }
      queued.fetch_add(mine);
    });
  }
  std::uint64_t drained = 0;
  std::uint64_t freezes = 0;
  std::thread freezer([&] {
    std::mt19937 random(11);
    go.arrive_and_wait();
    while (!done.load()) {
      async.freeze();
      ++freezes;
      drained += async.drain(random() % 400).items;
      async.thaw();
      std::this_thread::yield();
    }
  });
  std::uint64_t flushes = 0;
  std::thread flusher([&] {
    go.arrive_and_wait();
    while (!done.load()) {
      if (flushes % 2 == 0) {
        async.flush();
      } else {
        (void)async.flush_for(1ms);
      }
      ++flushes;
      std::this_thread::yield();
    }
  });
  std::string monitor_failure;
  std::thread monitor([&] {
    go.arrive_and_wait();
    while (!done.load() && monitor_failure.empty()) {
      const teardown::async_teardown_stats s = async.stats();
      if (s.pending > cap + producers * max_cost) monitor_failure = "pending " + std::to_string(s.pending);
      if (s.high_water > cap) monitor_failure = "high water " + std::to_string(s.high_water);
      if (s.reaped > s.queued) monitor_failure = "reaped > queued";
      if (s.drained > s.reaped) monitor_failure = "drained > reaped";
      if (s.inline_rejected > s.inline_total) monitor_failure = "rejected > sync";
      if (s.inline_stalled > s.inline_total) monitor_failure = "stalled > sync";
      std::this_thread::yield();
    }
  });
  for (std::thread& t : threads) t.join();
  done.store(true);
  freezer.join();
  flusher.join();
  monitor.join();
  async.flush();

  EXPECT_EQ(monitor_failure, "");
  EXPECT_EQ(destroyed_once(items), items.size());
  const teardown::async_teardown_stats s = async.stats();
  EXPECT_EQ(s.queued, queued.load());
  EXPECT_EQ(s.queued + s.inline_total, items.size());
  EXPECT_EQ(s.reaped, s.queued);
  EXPECT_EQ(s.drained, drained);
  EXPECT_EQ(s.pending, 0u);
  EXPECT_LE(s.high_water, cap);
  EXPECT_EQ(s.errors, 0u);
  const teardown::reaper_stats r = async.worker_stats();
  EXPECT_EQ(r.enqueued, s.queued);
  EXPECT_EQ(r.reaped, s.queued);
  RecordProperty("queued", static_cast<int>(s.queued));
  RecordProperty("rejected", static_cast<int>(s.inline_rejected));
  RecordProperty("stalled", static_cast<int>(s.inline_stalled));
  RecordProperty("drained", static_cast<int>(s.drained));
  RecordProperty("stolen", static_cast<int>(r.stolen));
  RecordProperty("freezes", static_cast<int>(freezes));
  RecordProperty("flushes", static_cast<int>(flushes));
}

}  // namespace
}  // namespace teardown_test
