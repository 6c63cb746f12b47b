// Specification of teardown::pressure_policy (pressure_policy.hpp) and of the entry points it
// drives, on a pressure_monitor fed from an injected event source: eventfds the test writes to
// stand in for the PSI trigger fd (events) and for relief, so the monitor's real poll loop runs
// and nothing waits on the kernel. The windows are an hour long, so that relief comes only when
// the test sends it. Nothing asserts a time: waits are bounded (eventually()).
#include "teardown/pressure_policy.hpp"

#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "teardown/async_teardown.hpp"
#include "teardown/deferred.hpp"
#include "teardown/model/mm.hpp"
#include "teardown/trace.hpp"
#include "reaper_test_support.hpp"
#include "pressure_test_support.hpp"
#include "test_support.hpp"

namespace teardown_test {
namespace {

using namespace std::chrono_literals;
using teardown::pressure_monitor;
using teardown::pressure_monitor_options;
using teardown::pressure_policy;
using teardown::pressure_policy_options;
using teardown::pressure_source;

// ---- the policy -------------------------------------------------------------------------------

struct item {
  teardown::llist_node hook;
  std::uint64_t id = 0;
  std::uint64_t cost = 10;
  std::uint64_t charge = 0;
};

struct destroy_log {
  std::mutex mutex;
  std::vector<std::uint64_t> order;
};

struct item_traits {
  destroy_log* log;
  std::uint64_t cost(const item& i) const { return i.cost; }
  bool eligible(const item&, std::uint64_t) const { return true; }
  void prepare(item&) {}
  void destroy(item& i) {
    const std::lock_guard lock(log->mutex);
    log->order.push_back(i.id);
  }
  std::uint64_t& charge(item& i) { return i.charge; }
};

using composition = teardown::async_teardown<item, &item::hook, item_traits>;

// The kernel's nice value of this process's thread named `name` (/proc/self/task/*/stat field
// 19), or nullopt if there is no such thread.
std::optional<int> thread_nice(const std::string& name) {
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string seen;
    if (!std::getline(comm, seen) || seen != name) continue;
    std::ifstream stat(task.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    std::size_t at = text.rfind(')');  // the name may hold spaces; the fields follow it
    if (at == std::string::npos) return std::nullopt;
    std::istringstream fields(text.substr(at + 2));
    std::string field;
    for (int i = 3; i <= 19 && fields >> field; ++i) {
      if (i == 19) return std::stoi(field);
    }
  }
  return std::nullopt;
}

teardown::async_teardown_options composition_options(std::uint64_t cap = 1'000) {
  teardown::async_teardown_options opts;
  opts.max_pending = cap;
  opts.sync_when_stalled = false;  // a frozen worker's backlog stays queued however long
  opts.reaper.name = "pressure_items";
  // At 19 for every user: these tests are about the policy's raise, and its refusal.
  opts.reaper.nice_only_if_raisable = false;
  return opts;
}

TEST(PressureEntryPointsTest, ReplaceCapReplacesOnlyTheCapItExpects) {
  teardown::budget budget(100);
  EXPECT_FALSE(budget.replace_cap(50, 10));
  EXPECT_EQ(budget.cap(), 100u);
  EXPECT_TRUE(budget.replace_cap(100, 10));
  EXPECT_EQ(budget.cap(), 10u);
  EXPECT_THROW(budget.replace_cap(10, teardown::budget::max_cap + 1), std::invalid_argument);
  EXPECT_EQ(budget.cap(), 10u);
}

TEST(PressureEntryPointsTest, SetWorkerNiceChangesTheWorkerThreadItself) {
  destroy_log log;
  composition async(composition_options(), item_traits{&log});
  ASSERT_TRUE(eventually([] { return thread_nice("pressure_items").has_value(); }));
  ASSERT_TRUE(eventually([] { return thread_nice("pressure_items") == 19; }));
  EXPECT_THROW(async.set_nice(20), std::invalid_argument);
  EXPECT_THROW(async.set_nice(-21), std::invalid_argument);
  EXPECT_EQ(async.nice(), 19);
  if (!async.set_nice(0)) {
    GTEST_SKIP() << "lowering a thread's nice value is refused here (no CAP_SYS_NICE, RLIMIT_NICE 0)";
  }
  EXPECT_EQ(async.nice(), 0);
  EXPECT_EQ(thread_nice("pressure_items"), 0);
  EXPECT_TRUE(async.set_nice(19));
  EXPECT_EQ(thread_nice("pressure_items"), 19);
}

TEST(PressurePolicyTest, BadOptionsAreRefusedNamingTheField) {
  injected_source source;
  pressure_monitor monitor(source.options());
  destroy_log log;
  composition async(composition_options(), item_traits{&log});
  const auto refused = [&](pressure_policy_options opts, const std::string& field) {
    try {
      pressure_policy policy(monitor, async, opts);
      ADD_FAILURE() << "accepted bad " << field;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  refused({.pressure_nice = 20}, "pressure_nice");
  refused({.pressure_nice = -21}, "pressure_nice");
  refused({.drain_per_event = teardown::budget::max_cap + 1}, "drain_per_event");
  refused({.pressure_cap = teardown::budget::max_cap + 1}, "pressure_cap");
}

TEST(PressurePolicyTest, PressureThawsRaisesPriorityLowersTheCapAndReliefPutsItAllBack) {
  injected_source source;
  pressure_monitor monitor(source.options());
  destroy_log log;
  std::vector<item> items(5);
  item late;
  late.id = 99;
  composition async(composition_options(1'000), item_traits{&log});
  ASSERT_EQ(async.nice(), 19);
  async.freeze();
  async.freeze();  // two levels: both undone, both put back
  for (std::size_t i = 0; i < items.size(); ++i) {
    items[i].id = i;
    ASSERT_EQ(async.put(items[i]), teardown::decision::queued);
  }
  pressure_policy policy(monitor, async, {.drain_per_event = 0});
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return policy.stats().events == 1; }));
  pressure_policy_options defaults;
  EXPECT_EQ(defaults.pressure_nice, 0);
  EXPECT_EQ(policy.stats().thawed, 2u);
  EXPECT_TRUE(policy.stats().active);
  // Thawed: the worker tears the backlog down by itself.
  async.flush();
  EXPECT_EQ(async.stats().reaped, 5u);
  // The cap: new puts stay inline while pressure lasts.
  EXPECT_EQ(async.max_pending(), 0u);
  EXPECT_EQ(async.put(late), teardown::decision::inline_rejected);
  // Nice: 0 where the system allows it (here, with CAP_SYS_NICE), counted either way.
  const teardown::pressure_policy_stats during = policy.stats();
  EXPECT_EQ(during.nice_raised + during.nice_refused, 1u);
  if (during.nice_raised == 1) {
    EXPECT_EQ(async.nice(), 0);
    EXPECT_EQ(thread_nice("pressure_items"), 0);  // the thread itself, as the kernel sees it
  } else {
    // Refused (an ordinary user): nice() is the nice in force, as the kernel sees it.
    EXPECT_EQ(async.nice(), 19);
    EXPECT_EQ(thread_nice("pressure_items"), 19);
  }

  source.signal_relief();
  ASSERT_TRUE(eventually([&] { return policy.stats().reliefs == 1; }));
  const teardown::pressure_policy_stats after = policy.stats();
  EXPECT_FALSE(after.active);
  EXPECT_EQ(async.max_pending(), 1'000u);
  EXPECT_EQ(after.caps_restored, 1u);
  EXPECT_EQ(async.nice(), 19);
  EXPECT_EQ(thread_nice("pressure_items"), 19);
  EXPECT_EQ(after.refrozen, 2u);
  // Frozen twice again: two thaws succeed, the third finds nothing.
  async.thaw();
  async.thaw();
  EXPECT_THROW(async.thaw(), std::logic_error);
}

TEST(PressurePolicyTest, EachEventDrainsABoundedAmountOldestFirstOnTheMonitorThread) {
  injected_source source;
  pressure_monitor monitor(source.options());
  destroy_log log;
  std::vector<item> items(6);
  composition async(composition_options(1'000), item_traits{&log});
  async.freeze();
  for (std::size_t i = 0; i < items.size(); ++i) {
    items[i].id = i;
    ASSERT_EQ(async.put(items[i]), teardown::decision::queued);
  }
  // No thaw: the worker stays frozen, so only the drain tears anything down.
  pressure_policy policy(monitor, async, {.thaw = false, .drain_per_event = 25});
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return policy.stats().events == 1; }));
  EXPECT_EQ(policy.stats().drained_items, 2u);  // 10 + 10 fit in 25, a third does not
  EXPECT_EQ(policy.stats().drained_cost, 20u);
  {
    const std::lock_guard lock(log.mutex);
    EXPECT_EQ(log.order, (std::vector<std::uint64_t>{0, 1}));
  }
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return policy.stats().events == 2; }));
  EXPECT_EQ(policy.stats().drained_items, 4u);
  EXPECT_EQ(async.stats().pending, 20u);
  {
    const std::lock_guard lock(log.mutex);
    EXPECT_EQ(log.order, (std::vector<std::uint64_t>{0, 1, 2, 3}));
  }
  async.thaw();
}

TEST(PressurePolicyTest, AFreezeMadeDuringPressureIsUndoneAtTheNextEvent) {
  injected_source source;
  pressure_monitor monitor(source.options());
  destroy_log log;
  composition async(composition_options(), item_traits{&log});
  pressure_policy policy(monitor, async, {.drain_per_event = 0});
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return policy.stats().events == 1; }));
  EXPECT_EQ(policy.stats().thawed, 0u);  // nothing was frozen
  async.freeze();
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return policy.stats().events == 2; }));
  EXPECT_EQ(policy.stats().thawed, 1u);
  source.signal_relief();
  ASSERT_TRUE(eventually([&] { return policy.stats().reliefs == 1; }));
  EXPECT_EQ(policy.stats().refrozen, 1u);
  async.thaw();
  EXPECT_THROW(async.thaw(), std::logic_error);
}

// The cap rule: relief puts back the cap it found, unless a cap was set meanwhile.
TEST(PressurePolicyTest, ACapSetDuringPressureStandsAfterRelief) {
  injected_source source;
  pressure_monitor monitor(source.options());
  destroy_log log;
  composition async(composition_options(1'000), item_traits{&log});
  pressure_policy policy(monitor, async, {.drain_per_event = 0, .pressure_cap = 30});
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return policy.stats().events == 1; }));
  EXPECT_EQ(async.max_pending(), 30u);
  async.set_max_pending(500);  // the user's, meanwhile
  source.signal_relief();
  ASSERT_TRUE(eventually([&] { return policy.stats().reliefs == 1; }));
  EXPECT_EQ(async.max_pending(), 500u);
  EXPECT_EQ(policy.stats().caps_kept, 1u);
  EXPECT_EQ(policy.stats().caps_restored, 0u);
  // The next episode finds 500 and puts 500 back.
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return policy.stats().events == 2; }));
  EXPECT_EQ(async.max_pending(), 30u);
  source.signal_relief();
  ASSERT_TRUE(eventually([&] { return policy.stats().reliefs == 2; }));
  EXPECT_EQ(async.max_pending(), 500u);
  EXPECT_EQ(policy.stats().caps_restored, 1u);
}

TEST(PressurePolicyTest, ACapAlreadyBelowThePressureCapIsLeftAlone) {
  injected_source source;
  pressure_monitor monitor(source.options());
  destroy_log log;
  composition async(composition_options(10), item_traits{&log});
  pressure_policy policy(monitor, async, {.drain_per_event = 0, .pressure_cap = 30});
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return policy.stats().events == 1; }));
  EXPECT_EQ(async.max_pending(), 10u);
  EXPECT_EQ(policy.stats().caps_lowered, 0u);
  source.signal_relief();
  ASSERT_TRUE(eventually([&] { return policy.stats().reliefs == 1; }));
  EXPECT_EQ(async.max_pending(), 10u);
}

TEST(PressurePolicyTest, DestroyingThePolicyDuringPressurePutsEverythingBack) {
  injected_source source;
  pressure_monitor monitor(source.options());
  destroy_log log;
  composition async(composition_options(1'000), item_traits{&log});
  async.freeze();
  {
    pressure_policy policy(monitor, async, {.drain_per_event = 0});
    source.signal_event();
    ASSERT_TRUE(eventually([&] { return policy.stats().events == 1; }));
    EXPECT_EQ(async.max_pending(), 0u);
  }
  EXPECT_EQ(async.max_pending(), 1'000u);
  EXPECT_EQ(async.nice(), 19);
  async.thaw();  // frozen again, once
  EXPECT_THROW(async.thaw(), std::logic_error);
  // Unsubscribed: a later event reaches nothing of it.
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return monitor.stats().events == 2; }));
  EXPECT_EQ(async.max_pending(), 1'000u);
}

TEST(PressurePolicyTest, OptionsCanSwitchEachActionOff) {
  injected_source source;
  pressure_monitor monitor(source.options());
  destroy_log log;
  item queued;
  queued.id = 1;
  composition async(composition_options(1'000), item_traits{&log});
  async.freeze();
  ASSERT_EQ(async.put(queued), teardown::decision::queued);
  pressure_policy policy(monitor, async,
                         {.thaw = false, .raise_priority = false, .drain_per_event = 0, .lower_cap = false});
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return policy.stats().events == 1; }));
  const teardown::pressure_policy_stats s = policy.stats();
  EXPECT_EQ(s.thawed + s.nice_raised + s.nice_refused + s.drained_items + s.caps_lowered, 0u);
  EXPECT_EQ(async.max_pending(), 1'000u);
  EXPECT_EQ(async.nice(), 19);
  EXPECT_EQ(async.stats().pending, 10u);
  async.thaw();
}

TEST(PressurePolicyTest, PressureHurriesALazyWorkerThatWouldLookOnlyHourly) {
  // A worker that polls hourly with no producer wake (reaper.hpp, "Wake policy"): the policy's
  // only action here is the lowered cap, and lowering it hurries the worker, which then tears
  // the queued item down itself. Without the hurry the item would wait an hour.
  injected_source source;
  pressure_monitor monitor(source.options());
  destroy_log log;
  item queued;
  queued.id = 1;
  teardown::async_teardown_options opts = composition_options(1'000);
  opts.reaper.spin_polls = 0;
  opts.reaper.poll_interval = std::chrono::hours(1);
  opts.hurry_at = 1'000;  // no put reaches the mark: only the pressure may hurry
  composition async(std::move(opts), item_traits{&log});
  reaper_support::wait_until_asleep(reaper_support::thread_named("pressure_items"));  // in its hourly look
  ASSERT_EQ(async.put(queued), teardown::decision::queued);
  pressure_policy policy(monitor, async, {.thaw = false, .raise_priority = false, .drain_per_event = 0});
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return policy.stats().events == 1; }));
  EXPECT_EQ(policy.stats().drained_items, 0u);
  EXPECT_TRUE(eventually([&] { return async.stats().reaped == 1; }, std::chrono::seconds(20)))
      << "the lowered cap did not hurry the polling worker";
  EXPECT_EQ(async.stats().drained, 0u) << "the worker, not the monitor thread, tore it down";
  EXPECT_EQ(async.worker_stats().hurries, 1u);
}

std::mutex trace_mutex;
std::vector<std::string> trace_actions;  // guarded by trace_mutex
void record_pressure(const teardown::trace::pressure_event& e) {
  const std::lock_guard lock(trace_mutex);
  trace_actions.emplace_back(e.action);
}

TEST(PressurePolicyTest, EveryActionIsTracedWithTheTargetsDomain) {
  injected_source source;
  pressure_monitor monitor(source.options());
  destroy_log log;
  item queued;
  queued.id = 1;
  composition async(composition_options(1'000), item_traits{&log});
  async.freeze();
  ASSERT_EQ(async.put(queued), teardown::decision::queued);
  teardown::trace::add_hook<teardown::trace::pressure_event>(&record_pressure);
  {
    pressure_policy policy(monitor, async, {.thaw = false});
    source.signal_event();
    ASSERT_TRUE(eventually([&] { return policy.stats().events == 1; }));
    source.signal_relief();
    ASSERT_TRUE(eventually([&] { return policy.stats().reliefs == 1; }));
  }
  teardown::trace::remove_hook<teardown::trace::pressure_event>(&record_pressure);
  const std::lock_guard lock(trace_mutex);
  for (const char* action : {"pressure", "cap", "drain", "relief", "cap_restored"}) {
    EXPECT_NE(std::find(trace_actions.begin(), trace_actions.end(), action), trace_actions.end()) << action;
  }
  EXPECT_TRUE(std::find(trace_actions.begin(), trace_actions.end(), "nice") != trace_actions.end() ||
              std::find(trace_actions.begin(), trace_actions.end(), "nice_refused") != trace_actions.end());
  async.thaw();
}

TEST(PressurePolicyTest, ADeferredDomainsFrozenBacklogIsGivenBack) {
  injected_source source;
  pressure_monitor monitor(source.options());
  teardown::deferred_domain_options opts = teardown::deferred_domain::default_options();
  opts.max_pending = 64u << 20;  // a budget of its own
  opts.threshold = 0;
  opts.sync_when_stalled = false;
  teardown::deferred_domain domain(opts);
  domain.freeze();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(domain.delete_object(new std::vector<char>(1 << 20)), teardown::decision::queued);
  }
  ASSERT_GT(domain.stats().pending, 0u);
  pressure_policy policy(monitor, domain);
  source.signal_event();
  // The reaper releases an item's charge before it counts the item reaped: wait for both.
  ASSERT_TRUE(eventually([&] { return domain.stats().pending == 0 && domain.stats().reaped == 4u; }));
  EXPECT_EQ(domain.max_pending(), 0u);
  EXPECT_EQ(domain.delete_object(new std::vector<char>(1 << 20)), teardown::decision::inline_rejected);
  source.signal_relief();
  ASSERT_TRUE(eventually([&] { return policy.stats().reliefs == 1; }));
  EXPECT_EQ(domain.max_pending(), 64u << 20);
  domain.thaw();
}

TEST(PressurePolicyTest, AnMmSystemsFrozenBacklogIsGivenBackInPages) {
  injected_source source;
  pressure_monitor monitor(source.options());
  teardown::model::mm_system kernel({.async_mm_teardown = true, .thresh_pages = 1, .max_pending_pages = 10'000,
                                     .reaper = {.name = "mm_reaper", .nice_only_if_raisable = false}});
  kernel.freeze();
  for (int i = 0; i < 3; ++i) {
    auto task = kernel.spawn(/*rss_pages=*/100);
    EXPECT_EQ(task->exit(), teardown::decision::queued);
  }
  EXPECT_EQ(kernel.vmstat().pending_pages, 300u);
  pressure_policy policy(monitor, kernel, {.thaw = false, .drain_per_event = 200});
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return policy.stats().events == 1; }));
  EXPECT_EQ(policy.stats().drained_cost, 200u);  // pages
  EXPECT_EQ(kernel.vmstat().pending_pages, 100u);
  EXPECT_EQ(kernel.max_pending(), 0u);
  source.signal_relief();
  ASSERT_TRUE(eventually([&] { return policy.stats().reliefs == 1; }));
  EXPECT_EQ(kernel.max_pending(), 10'000u);
  EXPECT_EQ(kernel.nice(), 19);
  kernel.thaw();
  kernel.flush();
}

// Two policies on one target would each put back what the other changed, in the wrong order
// (the callbacks run in subscription order): the second is refused, and changes nothing.
TEST(PressurePolicyTest, ASecondPolicyOnTheSameTargetIsRefused) {
  injected_source source;
  pressure_monitor monitor(source.options());
  destroy_log log;
  composition async(composition_options(1'000), item_traits{&log});
  composition other(composition_options(1'000), item_traits{&log});
  {
    pressure_policy first(monitor, async, {.pressure_nice = 5, .drain_per_event = 0, .pressure_cap = 30});
    try {
      pressure_policy second(monitor, async, {.pressure_nice = 0, .drain_per_event = 0, .pressure_cap = 10});
      ADD_FAILURE() << "a second policy on the same target was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("already"), std::string::npos) << e.what();
    }
    pressure_policy elsewhere(monitor, other, {.drain_per_event = 0});  // another target: fine
    source.signal_event();
    ASSERT_TRUE(eventually([&] { return first.stats().events == 1 && elsewhere.stats().events == 1; }));
    EXPECT_EQ(async.max_pending(), 30u) << "the refused policy acted";
    source.signal_relief();
    ASSERT_TRUE(eventually([&] { return first.stats().reliefs == 1; }));
    EXPECT_EQ(async.max_pending(), 1'000u);
    EXPECT_EQ(async.nice(), 19);
  }
  // The first one gone, the target takes a policy again.
  pressure_policy again(monitor, async, {.drain_per_event = 0});
  EXPECT_EQ(again.stats().events, 0u);
}

// ---- the target concept -----------------------------------------------------------------------

// Every composition the library offers is a pressure_target; anything else is refused at compile
// time by pressure_policy's static_assert, which names every entry point.
static_assert(teardown::pressure_target<composition>);
static_assert(teardown::pressure_target<teardown::deferred_domain>);
static_assert(teardown::pressure_target<teardown::model::mm_system>);
static_assert(teardown::pressure_target<teardown::model::pooled_mm_system>);
static_assert(teardown::pressure_target<teardown::model::basic_mm_system<teardown::const_key<false>>>);
static_assert(!teardown::pressure_target<int>);
static_assert(!teardown::pressure_target<destroy_log>);

// The model speaks the generic names in pages, and its old special-cased names still forward.
TEST(PressureEntryPointsTest, TheModelsGenericEntryPointsAreItsPagesKnob) {
  teardown::model::mm_system kernel(
      {.max_pending_pages = 500, .reaper = {.name = "mm_reaper", .nice_only_if_raisable = false}});
  EXPECT_EQ(kernel.max_pending(), 500u);
  EXPECT_EQ(kernel.get("vm.async_mm_teardown_max_pending_pages"), "500");
  EXPECT_FALSE(kernel.replace_max_pending(400, 10));
  EXPECT_TRUE(kernel.replace_max_pending(500, 10));
  EXPECT_EQ(kernel.max_pending(), 10u);
  EXPECT_THROW(kernel.replace_max_pending(10, teardown::budget::max_cap + 1), std::invalid_argument);
  EXPECT_EQ(kernel.max_pending(), 10u);
  EXPECT_NE(kernel.trace_domain(), 0u);
  EXPECT_NE(kernel.trace_domain(), kernel.swap_release_trace_domain());
  EXPECT_EQ(kernel.nice(), 19);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  EXPECT_EQ(kernel.max_pending_pages(), 10u);
  EXPECT_TRUE(kernel.replace_max_pending_pages(10, 20));
  EXPECT_EQ(kernel.mm_reaper_trace_domain(), kernel.trace_domain());
  EXPECT_EQ(kernel.worker_nice(), kernel.nice());
#pragma GCC diagnostic pop
  EXPECT_EQ(kernel.max_pending(), 20u);
}

}  // namespace
}  // namespace teardown_test
