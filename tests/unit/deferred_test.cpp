// Specification of teardown/deferred.hpp: deferred_deleter with std::unique_ptr and
// std::shared_ptr (big objects destroyed once on the reaper, small ones inline on the caller),
// the cost lookup (deleter cost function, ADL teardown_cost, containers, sizeof), the default
// domain (one instance, flush, shut down at exit with later deletions inline), explicit
// domains, async_munmap (unmaps, refuses bad input changing nothing, reports failures), the
// budget cap and node-allocation failure falling back to inline deletion, shutdown, drain, fork,
// and, in DeferredStressTest, many threads deleting at once with every object destroyed once.
//
// Where an object is destroyed is read in its destructor (the thread's name: the reaper's, or
// the test's). "Not destroyed yet" is shown by freezing the domain's reaper, never by timing:
// nothing here asserts a time, and every test is bounded by counts.
#include "teardown/deferred.hpp"

#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <limits>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "reaper_test_support.hpp"
#include "test_support.hpp"

namespace teardown_test {
namespace {

using reaper_support::current_test_name;
using reaper_support::hang_guard;
using teardown::decision;
using teardown::deferred_deleter;
using teardown::deferred_domain;
using teardown::deferred_ptr;

constexpr std::uint64_t kib = 1024;
constexpr std::uint64_t mib = 1024 * kib;
constexpr const char* reaper_name = "deferred_test";  // the explicit domains' reaper

using teardown_test::under_thread_sanitizer;

class DeferredTest : public ::testing::Test {
 private:
  hang_guard guard_{current_test_name()};
};
using DeferredStressTest = DeferredTest;

std::string this_thread_name() {
  char name[16] = {};
  if (pthread_getname_np(pthread_self(), name, sizeof name) != 0) return "?";
  return name;
}

// Where and how often something was destroyed.
class destruction_log {
 public:
  void record() {
    const std::lock_guard lock(mutex_);
    ++count_;
    thread_ = this_thread_name();
  }
  int count() const {
    const std::lock_guard lock(mutex_);
    return count_;
  }
  std::string thread() const {
    const std::lock_guard lock(mutex_);
    return thread_;
  }

 private:
  mutable std::mutex mutex_;
  int count_ = 0;
  std::string thread_;
};

// Freed on the reaper ("deferred_delete"), or on this thread by a flush that waited and helped
// ("Waiters help": a loaded machine, or an ordinary user's nice-0 reaper), which counts it.
void expect_on_the_reaper(const destruction_log& log, const teardown::deferred_stats& stats) {
  if (log.thread() == "deferred_delete") return;
  EXPECT_EQ(log.thread(), this_thread_name()) << "freed neither on the reaper nor by a helping flush";
  EXPECT_GT(stats.helped, 0u) << "freed on the flushing thread, but no flush helped";
}

// An object whose cost is what it says (teardown_cost, found by ADL) and which logs its end.
struct tracked {
  destruction_log* log;
  std::uint64_t cost;
  ~tracked() { log->record(); }
  friend std::uint64_t teardown_cost(const tracked& object) { return object.cost; }
};

// The same without a teardown_cost: it costs sizeof.
struct plain {
  destruction_log* log;
  ~plain() { log->record(); }
};

teardown::deferred_domain_options test_options() {
  teardown::deferred_domain_options opts = deferred_domain::default_options();
  opts.reaper.name = reaper_name;
  opts.sync_when_stalled = false;  // a frozen reaper must not turn "queued" into "stalled" on a slow machine
  opts.cached_below = 0;  // a big single block is deferred by its bytes under every allocator
  return opts;
}

std::uint64_t big_cost(const plain&) { return mib; }
std::uint64_t small_cost(const tracked&) { return 1; }

// mincore() succeeds on mapped pages and fails with ENOMEM where nothing is mapped.
bool mapped(void* addr, std::size_t length) {
  std::vector<unsigned char> residency((length + 4095) / 4096 + 1);
  return mincore(addr, length, residency.data()) == 0;
}
bool unmapped(void* addr, std::size_t length) {
  std::vector<unsigned char> residency((length + 4095) / 4096 + 1);
  return mincore(addr, length, residency.data()) != 0 && errno == ENOMEM;
}

void* map_touched(std::size_t length) {
  void* addr = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (addr == MAP_FAILED) return nullptr;
  for (std::size_t at = 0; at < length; at += 4096) static_cast<char*>(addr)[at] = 1;
  return addr;
}

// --- unique_ptr and shared_ptr -----------------------------------------------------------------

static_assert(std::is_nothrow_invocable_v<deferred_deleter<tracked>, tracked*>, "deleters are noexcept");
static_assert(std::is_trivially_copyable_v<deferred_deleter<tracked>>);
static_assert(sizeof(deferred_ptr<tracked>) <= 3 * sizeof(void*));

TEST_F(DeferredTest, UniquePtrDestroysABigObjectOnceOnTheReaper) {
  deferred_domain domain(test_options());
  destruction_log log;
  deferred_ptr<tracked> object(new tracked{&log, mib}, deferred_deleter<tracked>{domain});
  domain.freeze();
  object.reset();
  EXPECT_EQ(log.count(), 0) << "queued, not destroyed, while the reaper is frozen";
  domain.thaw();
  domain.flush();
  EXPECT_EQ(log.count(), 1);
  EXPECT_EQ(log.thread(), reaper_name);
  const teardown::deferred_stats stats = domain.stats();
  EXPECT_EQ(stats.queued, 1u);
  EXPECT_EQ(stats.reaped, 1u);
  EXPECT_EQ(stats.inline_total, 0u);
  EXPECT_EQ(stats.pending, 0u);
}

TEST_F(DeferredTest, UniquePtrDestroysASmallObjectInlineOnTheCaller) {
  deferred_domain domain(test_options());
  destruction_log log;
  deferred_ptr<tracked> object(new tracked{&log, kib}, deferred_deleter<tracked>{domain});
  domain.freeze();  // a queued object could not be destroyed now
  object.reset();
  EXPECT_EQ(log.count(), 1);
  EXPECT_EQ(log.thread(), this_thread_name());
  domain.thaw();
  const teardown::deferred_stats stats = domain.stats();
  EXPECT_EQ(stats.queued, 0u);
  EXPECT_EQ(stats.inline_total, 1u);
  EXPECT_EQ(stats.inline_small, 1u);
}

TEST_F(DeferredTest, SharedPtrDestroysABigObjectOnceOnTheReaperWhenTheLastOwnerLetsGo) {
  deferred_domain domain(test_options());
  destruction_log log;
  std::shared_ptr<tracked> first(new tracked{&log, mib}, deferred_deleter<tracked>{domain});
  std::shared_ptr<tracked> second = first;
  domain.freeze();
  first.reset();
  EXPECT_EQ(domain.stats().queued, 0u) << "another owner remains";
  second.reset();
  EXPECT_EQ(domain.stats().queued, 1u);
  EXPECT_EQ(log.count(), 0);
  domain.thaw();
  domain.flush();
  EXPECT_EQ(log.count(), 1);
  EXPECT_EQ(log.thread(), reaper_name);
}

TEST_F(DeferredTest, SharedPtrDestroysASmallObjectInlineOnTheCaller) {
  deferred_domain domain(test_options());
  destruction_log log;
  std::shared_ptr<tracked> object(new tracked{&log, 100}, deferred_deleter<tracked>{domain});
  object.reset();
  EXPECT_EQ(log.count(), 1);
  EXPECT_EQ(log.thread(), this_thread_name());
  EXPECT_EQ(domain.stats().inline_small, 1u);
}

TEST_F(DeferredTest, MakeDeferredUsesTheDefaultDomain) {
  destruction_log log;
  deferred_ptr<tracked> object = teardown::make_deferred<tracked>(&log, mib);
  EXPECT_EQ(object.get_deleter().domain(), nullptr);
  object.reset();
  teardown::deferred::flush();
  EXPECT_EQ(log.count(), 1);
  expect_on_the_reaper(log, teardown::deferred::stats());
}

TEST_F(DeferredTest, ConstObjectsCanBeDeferred) {
  deferred_domain domain(test_options());
  destruction_log log;
  std::unique_ptr<const tracked, deferred_deleter<const tracked>> object(new tracked{&log, mib},
                                                                         deferred_deleter<const tracked>{domain});
  object.reset();
  domain.flush();
  EXPECT_EQ(log.count(), 1);
  EXPECT_EQ(log.thread(), reaper_name);
}

TEST_F(DeferredTest, NullPointerIsANoOp) {
  deferred_domain domain(test_options());
  deferred_deleter<tracked>{domain}(nullptr);
  std::shared_ptr<tracked> empty(nullptr, deferred_deleter<tracked>{domain});
  empty.reset();
  EXPECT_EQ(domain.delete_object(static_cast<tracked*>(nullptr)), decision::inline_ineligible);
  const teardown::deferred_stats stats = domain.stats();
  EXPECT_EQ(stats.queued + stats.inline_total, 0u);
}

// --- What an object costs ----------------------------------------------------------------------

static_assert(teardown::has_teardown_cost<tracked>);
static_assert(!teardown::has_teardown_cost<plain>);
static_assert(!teardown::has_teardown_cost<std::vector<char>>);

TEST_F(DeferredTest, TeardownCostFoundByAdlDecides) {
  deferred_domain domain(test_options());
  destruction_log measured, big_log, small_log;
  EXPECT_EQ(teardown::deferred_cost(tracked{&measured, 12345}), 12345u);
  EXPECT_EQ(domain.delete_object(new tracked{&big_log, mib}), decision::queued);
  EXPECT_EQ(domain.delete_object(new tracked{&small_log, domain.threshold() - 1}), decision::inline_ineligible);
  EXPECT_EQ(small_log.count(), 1);
  domain.flush();
  EXPECT_EQ(big_log.count(), 1);
  EXPECT_EQ(big_log.thread(), reaper_name);
}

TEST_F(DeferredTest, DeleterCostFunctionComesBeforeTeardownCost) {
  deferred_domain domain(test_options());
  destruction_log log;
  // teardown_cost says 1 MiB, the deleter's function says 1 byte: inline.
  deferred_ptr<tracked> object(new tracked{&log, mib}, deferred_deleter<tracked>{domain, &small_cost});
  object.reset();
  EXPECT_EQ(log.count(), 1);
  EXPECT_EQ(log.thread(), this_thread_name());
  EXPECT_EQ(domain.stats().inline_small, 1u);
}

TEST_F(DeferredTest, DeleterCostFunctionMakesAnObjectWithoutTeardownCostBig) {
  deferred_domain domain(test_options());
  destruction_log log;
  deferred_ptr<plain> object(new plain{&log}, deferred_deleter<plain>{domain, &big_cost});
  domain.freeze();
  object.reset();
  EXPECT_EQ(log.count(), 0);
  EXPECT_EQ(domain.stats().pending, mib);
  domain.thaw();
  domain.flush();
  EXPECT_EQ(log.count(), 1);
  EXPECT_EQ(log.thread(), reaper_name);
}

TEST_F(DeferredTest, CaptureLessLambdaIsACostFunction) {
  deferred_domain domain(test_options());
  destruction_log log;
  const auto one_mib = [](const plain&) noexcept -> std::uint64_t { return mib; };
  deferred_ptr<plain> object(new plain{&log}, deferred_deleter<plain>{domain, one_mib});
  object.reset();
  domain.flush();
  EXPECT_EQ(log.thread(), reaper_name);
}

TEST_F(DeferredTest, WithoutACostFunctionAnObjectCostsItsSize) {
  destruction_log log;
  EXPECT_EQ(teardown::deferred_cost(plain{&log}), sizeof(plain));
  EXPECT_EQ(teardown::deferred_cost(std::array<char, 100>{}), 100u);
  deferred_domain domain(test_options());
  EXPECT_EQ(domain.delete_object(new plain{&log}), decision::inline_ineligible);
}

TEST_F(DeferredTest, ContainersCostTheirCapacityOrTheirElements) {
  std::vector<char> reserved;
  reserved.reserve(mib);
  EXPECT_EQ(teardown::deferred_cost(reserved), sizeof reserved + reserved.capacity()) << "capacity, not size";
  std::vector<std::uint64_t> numbers(1000);
  EXPECT_EQ(teardown::deferred_cost(numbers), sizeof numbers + numbers.capacity() * 8);
  std::string text(100000, 'x');
  EXPECT_EQ(teardown::deferred_cost(text), sizeof text + text.capacity());
  std::list<int> linked(1000);
  EXPECT_EQ(teardown::deferred_cost(linked), sizeof linked + 1000 * sizeof(int));
  std::map<int, int> tree{{1, 1}, {2, 2}};
  EXPECT_EQ(teardown::deferred_cost(tree), sizeof tree + 2 * sizeof(std::pair<const int, int>));
  std::deque<char> queue(5000);
  EXPECT_EQ(teardown::deferred_cost(queue), sizeof queue + 5000);
}

TEST_F(DeferredTest, ThrowingCostFunctionDeletesInlineAndCountsAnError) {
  deferred_domain domain(test_options());
  destruction_log log;
  const decision d = domain.delete_object(new plain{&log}, [](const plain&) -> std::uint64_t {
    throw std::runtime_error("cannot measure");
  });
  EXPECT_EQ(d, decision::inline_ineligible);
  EXPECT_EQ(log.count(), 1);
  EXPECT_EQ(log.thread(), this_thread_name());
  EXPECT_EQ(domain.stats().errors, 1u);
  EXPECT_EQ(domain.stats().inline_total, 1u);
}

// --- The default domain ------------------------------------------------------------------------

TEST_F(DeferredTest, DefaultDomainIsOneInstanceWithTheDocumentedDefaults) {
  std::vector<deferred_domain*> seen(4, nullptr);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < seen.size(); ++i) {
    threads.emplace_back([&seen, i] { seen[i] = &teardown::deferred::default_domain(); });
  }
  for (auto& t : threads) t.join();
  for (deferred_domain* domain : seen) EXPECT_EQ(domain, &teardown::deferred::default_domain());
  deferred_domain& domain = teardown::deferred::default_domain();
  // The allocator's (allocator_tuning.hpp): 64 KiB under glibc, 16 KiB under jemalloc.
  const teardown::deferred_tuning tuning = teardown::deferred_tuning_for(teardown::detect_allocator());
  EXPECT_EQ(domain.threshold(), tuning.threshold);
  const bool jemalloc = teardown::detect_allocator() == teardown::allocator_kind::jemalloc;
  EXPECT_EQ(domain.threshold(), jemalloc ? 16 * kib : 64 * kib);
  EXPECT_EQ(domain.min_blocks(), tuning.min_blocks);
  EXPECT_EQ(domain.cached_below(), tuning.cached_below);
  EXPECT_EQ(domain.max_pending(), deferred_domain::default_max_pending());
  EXPECT_GT(domain.max_pending(), 0u);
  EXPECT_LE(domain.max_pending(), teardown::budget::max_cap);
  EXPECT_TRUE(domain.enabled());
}

TEST_F(DeferredTest, DefaultDeleterQueuesOnTheDefaultDomainAndFlushDrainsIt) {
  deferred_domain& domain = teardown::deferred::default_domain();
  const teardown::deferred_stats before = teardown::deferred::stats();
  destruction_log log;
  deferred_ptr<tracked> object(new tracked{&log, mib});
  domain.freeze();
  object.reset();
  EXPECT_EQ(log.count(), 0);
  domain.thaw();
  teardown::deferred::flush();
  EXPECT_EQ(log.count(), 1);
  expect_on_the_reaper(log, teardown::deferred::stats());
  const teardown::deferred_stats after = teardown::deferred::stats();
  EXPECT_EQ(after.queued, before.queued + 1);
  EXPECT_EQ(after.reaped, before.reaped + 1);
}

TEST_F(DeferredTest, DeferredDeleteSaysWhatItDid) {
  destruction_log big_log, small_log;
  EXPECT_EQ(teardown::deferred_delete(new tracked{&big_log, mib}), decision::queued);
  EXPECT_EQ(teardown::deferred_delete(new tracked{&small_log, 1}), decision::inline_ineligible);
  EXPECT_EQ(small_log.count(), 1);
  teardown::deferred::flush();
  EXPECT_EQ(big_log.count(), 1);
  expect_on_the_reaper(big_log, teardown::deferred::stats());
}

TEST_F(DeferredTest, ExplicitDomainsKeepTheirOwnQueueAndStats) {
  teardown::deferred_domain_options other_options = test_options();
  other_options.reaper.name = "other_domain";
  deferred_domain mine(test_options());
  deferred_domain other(other_options);
  destruction_log mine_log, other_log;
  deferred_ptr<tracked>(new tracked{&mine_log, mib}, deferred_deleter<tracked>{mine}).reset();
  deferred_ptr<tracked>(new tracked{&other_log, mib}, deferred_deleter<tracked>{other}).reset();
  mine.flush();
  other.flush();
  EXPECT_EQ(mine_log.thread(), reaper_name);
  EXPECT_EQ(other_log.thread(), "other_domain");
  EXPECT_EQ(mine.stats().queued, 1u);
  EXPECT_EQ(other.stats().queued, 1u);
}

// At exit the default domain is shut down before any static is destroyed (the main thread's
// sentinel): what was queued is destroyed on the reaper, and every static destroyed afterwards,
// whether constructed before or after the domain, is destroyed inline. (Before the sentinel,
// "late", constructed after the domain, was queued behind the closer and destroyed on the
// reaper.) Runs in a child (a death test that exits with 0). deferred_exit_test.cpp has the
// other exit scenarios.
struct announced {
  const char* label;
  ~announced() {
    std::fprintf(stderr, "%s on the %s\n", label, this_thread_name() == "deferred_delete" ? "reaper" : "caller");
  }
  friend std::uint64_t teardown_cost(const announced&) { return mib; }
};

[[noreturn]] void exit_with_deferred_objects_alive() {
  static deferred_ptr<announced> early;  // constructed before the default domain
  teardown::deferred::default_domain().freeze();  // first use: everything queued waits for exit
  static deferred_ptr<announced> late;   // constructed after it
  early.reset(new announced{"early"});
  late.reset(new announced{"late"});
  teardown::deferred_delete(new announced{"queued"});
  std::exit(0);
}

TEST_F(DeferredTest, DefaultDomainIsShutDownAtExitAndDeletionsAfterThatAreInline) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: the domain is first used in it
  EXPECT_EXIT(exit_with_deferred_objects_alive(), ::testing::ExitedWithCode(0),
              "queued on the reaper.*late on the caller.*early on the caller");
}

// --- Explicit domains: budget, allocation failure, toggle, shutdown, drain ------------------------

TEST_F(DeferredTest, FullBudgetForcesInlineDeletion) {
  teardown::deferred_domain_options opts = test_options();
  opts.max_pending = 3 * mib;
  deferred_domain domain(opts);
  std::vector<destruction_log> logs(5);
  domain.freeze();
  std::vector<decision> decisions;
  for (destruction_log& log : logs) decisions.push_back(domain.delete_object(new tracked{&log, mib}));
  EXPECT_EQ(decisions, (std::vector<decision>{decision::queued, decision::queued, decision::queued,
                                              decision::inline_rejected, decision::inline_rejected}));
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(logs[i].count(), 0) << i;
  for (std::size_t i = 3; i < 5; ++i) {
    EXPECT_EQ(logs[i].count(), 1) << i;
    EXPECT_EQ(logs[i].thread(), this_thread_name()) << i;
  }
  teardown::deferred_stats stats = domain.stats();
  EXPECT_EQ(stats.inline_rejected, 2u);
  EXPECT_EQ(stats.pending, 3 * mib);
  domain.thaw();
  domain.flush();
  for (destruction_log& log : logs) EXPECT_EQ(log.count(), 1);
  stats = domain.stats();
  EXPECT_EQ(stats.pending, 0u);
  EXPECT_EQ(stats.high_water, 3 * mib);
}

TEST_F(DeferredTest, FailedNodeAllocationDeletesInlineAndNeverLeaks) {
  deferred_domain domain(test_options());
  destruction_log failed, next;
  teardown::detail::fail_next_node_allocations = 1;
  EXPECT_EQ(domain.delete_object(new tracked{&failed, mib}), decision::inline_no_memory);
  EXPECT_EQ(failed.count(), 1);
  EXPECT_EQ(failed.thread(), this_thread_name());
  EXPECT_EQ(domain.delete_object(new tracked{&next, mib}), decision::queued) << "only one allocation failed";
  domain.flush();
  EXPECT_EQ(next.count(), 1);
  const teardown::deferred_stats stats = domain.stats();
  EXPECT_EQ(stats.inline_no_memory, 1u);
  EXPECT_EQ(stats.inline_rejected, 0u) << "the budget did not refuse anything";
  EXPECT_EQ(stats.inline_total, 1u);
}

TEST_F(DeferredTest, DisabledDomainDeletesEverythingInline) {
  deferred_domain domain(test_options());
  domain.disable();
  destruction_log log;
  EXPECT_EQ(domain.delete_object(new tracked{&log, mib}), decision::inline_disabled);
  EXPECT_EQ(log.thread(), this_thread_name());
  domain.enable();
  EXPECT_EQ(domain.delete_object(new tracked{&log, mib}), decision::queued);
  domain.flush();
  EXPECT_EQ(log.count(), 2);
  EXPECT_EQ(domain.stats().inline_total, 1u);
}

TEST_F(DeferredTest, ShutdownFreesEverythingQueuedAndLaterDeletionsAreInline) {
  deferred_domain domain(test_options());
  std::vector<destruction_log> queued(3);
  domain.freeze();
  for (destruction_log& log : queued) domain.delete_object(new tracked{&log, mib});
  domain.stop();  // overrides the freeze
  for (destruction_log& log : queued) {
    EXPECT_EQ(log.count(), 1);
    EXPECT_EQ(log.thread(), reaper_name);
  }
  destruction_log after;
  EXPECT_EQ(domain.delete_object(new tracked{&after, mib}), decision::inline_stopped);
  EXPECT_EQ(after.count(), 1);
  EXPECT_EQ(after.thread(), this_thread_name());
  domain.stop();  // idempotent
  domain.flush();     // and harmless afterwards
}

TEST_F(DeferredTest, DestroyingADomainFreesEverythingQueued) {
  std::vector<destruction_log> logs(10);
  {
    deferred_domain domain(test_options());
    domain.freeze();
    for (destruction_log& log : logs) domain.delete_object(new tracked{&log, mib});
  }
  for (destruction_log& log : logs) EXPECT_EQ(log.count(), 1);
}

TEST_F(DeferredTest, DrainFreesQueuedObjectsOnTheCallerWithinItsBudget) {
  deferred_domain domain(test_options());
  std::vector<destruction_log> logs(3);
  domain.freeze();
  for (destruction_log& log : logs) domain.delete_object(new tracked{&log, mib});
  const teardown::drain_result drained = domain.drain(2 * mib);
  EXPECT_EQ(drained.items, 2u);
  EXPECT_EQ(drained.cost, 2 * mib);
  EXPECT_EQ(logs[0].thread(), this_thread_name()) << "oldest first";
  EXPECT_EQ(logs[1].thread(), this_thread_name());
  EXPECT_EQ(logs[2].count(), 0);
  domain.thaw();
  domain.flush();
  EXPECT_EQ(logs[2].count(), 1);
  EXPECT_EQ(domain.stats().pending, 0u);
}

// A destructor running on the reaper may delete through the same domain: the inner object
// queues behind it. The second flush covers what the first one's batch queued.
struct nest {
  destruction_log* log;
  deferred_ptr<tracked> inner;
  ~nest() { log->record(); }
  friend std::uint64_t teardown_cost(const nest&) { return mib; }
};

TEST_F(DeferredTest, DestructorOnTheReaperMayDeleteThroughTheSameDomain) {
  deferred_domain domain(test_options());
  destruction_log outer_log, inner_log;
  deferred_ptr<nest> outer(new nest{&outer_log, deferred_ptr<tracked>(new tracked{&inner_log, mib},
                                                                      deferred_deleter<tracked>{domain})},
                           deferred_deleter<nest>{domain});
  outer.reset();
  domain.flush();
  domain.flush();
  EXPECT_EQ(outer_log.count(), 1);
  EXPECT_EQ(inner_log.count(), 1);
  EXPECT_EQ(inner_log.thread(), reaper_name);
  EXPECT_EQ(domain.stats().queued, 2u);
}

// A destructor that throws on the reaper is counted, handed to on_error, and the rest goes on.
struct throws_on_destruction {
  ~throws_on_destruction() noexcept(false) { throw std::runtime_error("destructor failed"); }
  friend std::uint64_t teardown_cost(const throws_on_destruction&) { return mib; }
};

TEST_F(DeferredTest, DestructorThrowingOnTheReaperIsCountedAndTheRestStillRuns) {
  std::atomic<int> reported{0};
  teardown::deferred_domain_options opts = test_options();
  opts.reaper.on_error = [&reported](std::exception_ptr) { reported.fetch_add(1); };
  deferred_domain domain(opts);
  destruction_log after;
  domain.freeze();
  EXPECT_EQ(domain.delete_object(new throws_on_destruction), decision::queued);
  domain.delete_object(new tracked{&after, mib});
  domain.thaw();
  domain.flush();
  EXPECT_EQ(after.count(), 1);
  EXPECT_EQ(domain.stats().errors, 1u);
  EXPECT_EQ(reported.load(), 1);
  EXPECT_EQ(domain.stats().pending, 0u) << "the node and its charge are released anyway";
}

// --- async_munmap ------------------------------------------------------------------------------

TEST_F(DeferredTest, UnmapQueuesABigMappingAndTheReaperUnmapsIt) {
  deferred_domain domain(test_options());
  const std::size_t length = mib;
  void* addr = map_touched(length);
  ASSERT_NE(addr, nullptr);
  domain.freeze();
  EXPECT_EQ(domain.unmap(addr, length), decision::queued);
  EXPECT_TRUE(mapped(addr, length)) << "still mapped while the reaper is frozen";
  EXPECT_EQ(domain.stats().pending, length);
  domain.thaw();
  domain.flush();
  EXPECT_TRUE(unmapped(addr, length));
  EXPECT_EQ(domain.stats().reaped, 1u);
}

TEST_F(DeferredTest, AsyncMunmapUsesTheDefaultDomain) {
  const std::size_t length = 4 * mib;
  void* addr = map_touched(length);
  ASSERT_NE(addr, nullptr);
  EXPECT_EQ(teardown::async_munmap(addr, length), decision::queued);
  teardown::deferred::flush();
  EXPECT_TRUE(unmapped(addr, length));
}

TEST_F(DeferredTest, SmallMappingIsUnmappedInline) {
  deferred_domain domain(test_options());
  const std::size_t length = 4096;
  void* addr = map_touched(length);
  ASSERT_NE(addr, nullptr);
  domain.freeze();
  EXPECT_EQ(domain.unmap(addr, length), decision::inline_ineligible);
  EXPECT_TRUE(unmapped(addr, length));
  domain.thaw();
}

TEST_F(DeferredTest, UnmapChargesTheLengthRoundedUpToPages) {
  teardown::deferred_domain_options opts = test_options();
  opts.threshold = 1;
  deferred_domain domain(opts);
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  void* addr = map_touched(2 * page);
  ASSERT_NE(addr, nullptr);
  domain.freeze();
  EXPECT_EQ(domain.unmap(addr, page + 1), decision::queued);
  EXPECT_EQ(domain.stats().pending, 2 * page);
  domain.thaw();
  domain.flush();
  EXPECT_TRUE(unmapped(addr, 2 * page)) << "munmap's own rounding: the partial page goes too";
}

TEST_F(DeferredTest, BadUnmapInputIsRefusedAndChangesNothing) {
  deferred_domain domain(test_options());
  const std::size_t length = mib;
  char* addr = static_cast<char*>(map_touched(length));
  ASSERT_NE(addr, nullptr);
  const auto refused = [&](void* where, std::size_t bytes) {
    EXPECT_THROW(domain.unmap(where, bytes), std::invalid_argument);
    EXPECT_THROW(teardown::async_munmap(where, bytes), std::invalid_argument);
  };
  const teardown::deferred_stats default_before = teardown::deferred::stats();
  refused(nullptr, length);
  refused(addr + 1, length - 1);                        // unaligned
  refused(addr, 0);                                     // empty
  refused(addr, SIZE_MAX);                              // wraps around
  refused(addr, SIZE_MAX - reinterpret_cast<std::uintptr_t>(addr) + 2);  // ends one past the top
  EXPECT_TRUE(mapped(addr, length));
  EXPECT_EQ(addr[0], 1) << "still readable";
  const teardown::deferred_stats stats = domain.stats();
  EXPECT_EQ(stats.queued + stats.inline_total, 0u);
  const teardown::deferred_stats default_after = teardown::deferred::stats();
  EXPECT_EQ(default_after.queued + default_after.inline_total, default_before.queued + default_before.inline_total);
  ASSERT_EQ(munmap(addr, length), 0);
}

TEST_F(DeferredTest, MunmapFailureIsThrownInlineAndCountedOnTheReaper) {
  if constexpr (sizeof(void*) < 8) GTEST_SKIP() << "needs a 64-bit address space";
  if (under_thread_sanitizer) GTEST_SKIP() << "ThreadSanitizer's munmap interceptor crashes on a non-user address";
  // Above every user address space Linux offers (57 bits): munmap fails with EINVAL.
  void* const kernel = reinterpret_cast<void*>(std::uintptr_t{0xff00'0000'0000'0000});
  std::atomic<int> reported{0};
  teardown::deferred_domain_options opts = test_options();
  opts.reaper.on_error = [&reported](std::exception_ptr error) {
    try {
      std::rethrow_exception(error);
    } catch (const std::system_error& failure) {
      if (failure.code() == std::errc::invalid_argument) reported.fetch_add(1);
    } catch (...) {
    }
  };
  deferred_domain domain(opts);
  EXPECT_THROW(domain.unmap(kernel, 4096), std::system_error);
  EXPECT_EQ(domain.unmap(kernel, mib), decision::queued);
  domain.flush();
  EXPECT_EQ(domain.stats().errors, 1u);
  EXPECT_EQ(reported.load(), 1);
  EXPECT_EQ(domain.stats().pending, 0u);
}

// --- Big buffers -------------------------------------------------------------------------------

// --- the node recycle (node.hpp) ---------------------------------------------------------------

// Empties this thread's cache and the shared stack, so that what follows starts from nothing.
void empty_node_recycle() {
  auto& cache = teardown::detail::this_thread_node_cache();
  while (teardown::detail::deferred_node* node = cache.nodes.pop_front()) delete node;
  auto& recycle = teardown::detail::shared_node_recycle();
  auto taken = recycle.stack.del_all();
  while (teardown::detail::deferred_node* node = taken.pop_front()) delete node;
  recycle.kept.store(0);
}

// Under mimalloc nodes are not recycled (node.hpp): a released node is deleted, and neither the
// thread's cache nor the shared stack ever holds one.
bool recycles_nodes() { return teardown::detect_allocator() != teardown::allocator_kind::mimalloc; }
void expect_no_node_kept() {
  EXPECT_TRUE(teardown::detail::this_thread_node_cache().nodes.empty()) << "a node cached under mimalloc";
  EXPECT_EQ(teardown::detail::shared_node_recycle().kept.load(), 0u) << "a node kept under mimalloc";
}

TEST_F(DeferredTest, AReleasedNodeIsTheNextOneAllocatedWithEveryFieldReset) {
  empty_node_recycle();
  if (!recycles_nodes()) {
    teardown::detail::release_node(teardown::detail::allocate_node());
    expect_no_node_kept();
    return;
  }
  teardown::detail::deferred_node* first = teardown::detail::allocate_node();
  ASSERT_NE(first, nullptr);
  first->charge = 7;
  first->length = 9;
  teardown::detail::release_node(first);
  teardown::detail::deferred_node* again = teardown::detail::allocate_node();
  EXPECT_EQ(again, first) << "the released node was not reused";
  EXPECT_EQ(again->charge, 0u);
  EXPECT_EQ(again->length, 0u);
  EXPECT_FALSE(again->hook.on_list());
  teardown::detail::release_node(again);
}

TEST_F(DeferredTest, TheSharedStackKeepsAtMostKeptMaxNodes) {
  empty_node_recycle();
  constexpr std::uint32_t kept_max = teardown::detail::node_recycle::kept_max;
  for (std::uint32_t i = 0; i < 2 * kept_max; ++i) teardown::detail::release_node(new teardown::detail::deferred_node);
  if (!recycles_nodes()) {
    expect_no_node_kept();
    return;
  }
  auto& recycle = teardown::detail::shared_node_recycle();
  EXPECT_EQ(recycle.kept.load(), kept_max);
  auto taken = recycle.stack.del_all();
  EXPECT_EQ(taken.size(), kept_max) << "the rest were to be freed";
  while (teardown::detail::deferred_node* node = taken.pop_front()) delete node;
  recycle.kept.store(0);
}

// A thread's cache goes with the thread (LeakSanitizer, in the asan preset, sees a node left
// behind); a deletion from a thread-local destructor after that allocates as before.
TEST_F(DeferredTest, AThreadsNodeCacheIsFreedAtItsExitAndLaterDeletionsStillWork) {
  empty_node_recycle();
  deferred_domain domain(test_options());
  struct late_deleter {
    deferred_domain* domain;
    ~late_deleter() { (void)domain->delete_object(new std::vector<char>(std::size_t{1} << 20)); }
  };
  std::thread producer([&] {
    static thread_local late_deleter late{&domain};  // destroyed after the node cache? either way it deletes
    (void)late;
    for (int i = 0; i < 64; ++i) (void)domain.delete_object(new std::vector<char>(std::size_t{1} << 20));
    domain.flush();  // their nodes back on the shared stack
    for (int i = 0; i < 64; ++i) (void)domain.delete_object(new std::vector<char>(std::size_t{1} << 20));
  });
  producer.join();
  domain.flush();
  EXPECT_EQ(domain.stats().queued + domain.stats().inline_total, 129u);
  EXPECT_EQ(domain.stats().reaped, domain.stats().queued);
}

// --- the decision by blocks (allocator_tuning.hpp) -------------------------------------------

TEST_F(DeferredTest, BlocksAreCountedFromTheType) {
  EXPECT_EQ(teardown::deferred_blocks(std::vector<char>(1000)), 1u) << "one buffer";
  EXPECT_EQ(teardown::deferred_blocks(std::list<int>(7)), 8u) << "a node per element, and the list";
  std::vector<std::unique_ptr<int>> owners(5);
  EXPECT_EQ(teardown::deferred_blocks(owners), 6u) << "elements that own memory: one each";
  EXPECT_EQ(teardown::deferred_blocks(std::map<int, int>{{1, 1}, {2, 2}}), 3u);
  destruction_log log;
  EXPECT_EQ(teardown::deferred_blocks(tracked{&log, 1}), 0u) << "its own teardown_cost: unknown";
  EXPECT_EQ(teardown::deferred_blocks(std::array<int, 4>{}), 1u);
}

// min_blocks: an object of that many blocks is deferred though its bytes are below the
// threshold; one block fewer is not. Unknown blocks (a teardown_cost, a cost function) and
// unmaps are judged by their bytes alone.
TEST_F(DeferredTest, AnObjectOfMinBlocksIsDeferredWhateverItsBytes) {
  teardown::deferred_domain_options opts = test_options();
  opts.threshold = mib;
  opts.min_blocks = 16;
  deferred_domain domain(opts);
  domain.freeze();
  EXPECT_EQ(domain.delete_object(new std::list<int>(14)), decision::inline_ineligible) << "15 blocks: the list and 14";
  EXPECT_EQ(domain.delete_object(new std::list<int>(15)), decision::queued) << "16 blocks, 84 bytes";
  EXPECT_EQ(domain.delete_object(new std::vector<std::unique_ptr<int>>(15)), decision::queued);
  EXPECT_EQ(domain.delete_object(new std::vector<char>(1000)), decision::inline_ineligible);
  destruction_log log;
  EXPECT_EQ(domain.delete_object(new tracked{&log, 1000}), decision::inline_ineligible) << "its bytes decide";
  EXPECT_EQ(domain.stats().queued, 2u);
  EXPECT_EQ(domain.stats().inline_small, 3u);
  domain.thaw();
  domain.flush();
  EXPECT_EQ(domain.stats().reaped, 2u);
  EXPECT_EQ(domain.stats().pending, 0u);

  opts.min_blocks = 0;  // off: bytes only
  deferred_domain bytes_only(opts);
  EXPECT_EQ(bytes_only.delete_object(new std::list<int>(1000)), decision::inline_ineligible);
}

// cached_below: under it an object whose blocks the type says is judged by its blocks alone
// (the allocator keeps blocks that size: freeing one costs no more than queuing it).
TEST_F(DeferredTest, BelowCachedBelowOneBigBlockIsFreedInlineAndManyAreDeferred) {
  teardown::deferred_domain_options opts = test_options();
  opts.threshold = 64 * kib;
  opts.min_blocks = 16;
  opts.cached_below = 8 * mib;
  deferred_domain domain(opts);
  domain.freeze();
  EXPECT_EQ(domain.delete_object(new std::vector<char>(4 * mib)), decision::inline_ineligible) << "one block";
  EXPECT_EQ(domain.delete_object(new std::vector<char>(8 * mib)), decision::queued) << "at cached_below: its bytes";
  EXPECT_EQ(domain.delete_object(new std::list<int>(100)), decision::queued) << "many blocks";
  destruction_log log;
  EXPECT_EQ(domain.delete_object(new tracked{&log, 4 * mib}), decision::queued) << "blocks unknown: its bytes";
  EXPECT_EQ(domain.delete_object(new plain{&log}, [](const plain&) { return 4 * mib; }), decision::queued)
      << "a cost function: its bytes";
  void* range = mmap(nullptr, 4 * mib, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(range, MAP_FAILED);
  EXPECT_EQ(domain.unmap(range, 4 * mib), decision::queued) << "a range: its bytes";
  domain.thaw();
  domain.flush();
  EXPECT_EQ(domain.stats().reaped, domain.stats().queued);
  EXPECT_EQ(log.count(), 2);
}

TEST_F(DeferredTest, EachAllocatorHasTheTuningItsSweepsChose) {
  using teardown::allocator_kind;
  using teardown::deferred_tuning_for;
  constexpr std::uint64_t unlimited = std::numeric_limits<std::uint64_t>::max();
  EXPECT_EQ(deferred_tuning_for(allocator_kind::glibc).threshold, 64 * kib);
  EXPECT_EQ(deferred_tuning_for(allocator_kind::glibc).cached_below, 0u);
  EXPECT_EQ(deferred_tuning_for(allocator_kind::jemalloc).threshold, 16 * kib);
  EXPECT_EQ(deferred_tuning_for(allocator_kind::tcmalloc).cached_below, unlimited);
  EXPECT_EQ(deferred_tuning_for(allocator_kind::mimalloc).cached_below, 32 * mib);
  EXPECT_EQ(deferred_tuning_for(allocator_kind::mimalloc).min_blocks, 64u);
  EXPECT_EQ(deferred_tuning_for(allocator_kind::other).threshold, 64 * kib);
  const teardown::deferred_domain_options defaults;
  const teardown::deferred_tuning here = deferred_tuning_for(teardown::detect_allocator());
  EXPECT_EQ(defaults.threshold, here.threshold);
  EXPECT_EQ(defaults.min_blocks, here.min_blocks);
  EXPECT_EQ(defaults.cached_below, here.cached_below);
}

TEST_F(DeferredTest, SixtyFourMiBVectorIsFreedOffThread) {
  deferred_domain domain(test_options());
  const std::size_t size = 64 * mib;
  auto buffer = std::make_unique<std::vector<char>>(size, 'x');
  deferred_ptr<std::vector<char>> owned(buffer.release(), deferred_deleter<std::vector<char>>{domain});
  domain.freeze();
  owned.reset();
  teardown::deferred_stats stats = domain.stats();
  EXPECT_EQ(stats.queued, 1u);
  EXPECT_GE(stats.pending, size) << "charged its capacity";
  domain.thaw();
  domain.flush();
  stats = domain.stats();
  EXPECT_EQ(stats.reaped, 1u);
  EXPECT_EQ(stats.pending, 0u);
}

// The same vector with an allocator that notes the thread that gives the memory back.
template <class T>
struct noting_allocator {
  using value_type = T;
  destruction_log* log;
  explicit noting_allocator(destruction_log* where) noexcept : log(where) {}
  template <class U>
  noting_allocator(const noting_allocator<U>& other) noexcept : log(other.log) {}  // NOLINT
  T* allocate(std::size_t n) { return std::allocator<T>{}.allocate(n); }
  void deallocate(T* p, std::size_t n) noexcept {
    log->record();
    std::allocator<T>{}.deallocate(p, n);
  }
  friend bool operator==(const noting_allocator& a, const noting_allocator& b) noexcept { return a.log == b.log; }
};

TEST_F(DeferredTest, SixtyFourMiBVectorMemoryIsGivenBackOnTheReaper) {
  using noted_vector = std::vector<char, noting_allocator<char>>;
  deferred_domain domain(test_options());
  destruction_log log;
  deferred_ptr<noted_vector> owned(new noted_vector(noting_allocator<char>(&log)),
                                   deferred_deleter<noted_vector>{domain});
  owned->reserve(64 * mib);
  EXPECT_GE(teardown::deferred_cost(*owned), 64 * mib);
  owned.reset();
  domain.flush();
  EXPECT_EQ(log.count(), 1);
  EXPECT_EQ(log.thread(), reaper_name);
}

// --- fork --------------------------------------------------------------------------------------

// What the parent had queued at the fork is destroyed once in the child (on its copy, by its
// flush) and once in the parent; the child's own deletions are inline.
TEST_F(DeferredTest, ForkChildDestroysItsCopyOfTheBacklogOnceAndSoDoesTheParent) {
  deferred_domain domain(test_options());
  std::vector<destruction_log> logs(5);
  domain.freeze();
  for (destruction_log& log : logs) domain.delete_object(new tracked{&log, mib});
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid == 0) {
    int failures = 0;
    destruction_log own;
    if (domain.delete_object(new tracked{&own, mib}) == decision::queued && own.count() != 1) ++failures;
    if (own.count() != 1) ++failures;
    domain.flush();
    for (destruction_log& log : logs) failures += log.count() == 1 ? 0 : 1;
    _exit(failures == 0 ? 0 : 1);
  }
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child lost or repeated a deletion";
  for (destruction_log& log : logs) EXPECT_EQ(log.count(), 0) << "the parent's copies are still queued";
  domain.thaw();
  domain.flush();
  for (destruction_log& log : logs) EXPECT_EQ(log.count(), 1);
}

// --- Stress ------------------------------------------------------------------------------------

// Counts its destruction in its own slot; costs what it is told.
struct counted {
  std::atomic<int>* destroyed;
  std::uint64_t cost;
  ~counted() { destroyed->fetch_add(1, std::memory_order_relaxed); }
  friend std::uint64_t teardown_cost(const counted& object) { return object.cost; }
};

// Each thread deletes its objects through unique_ptr, shared_ptr (the last owner on another
// thread half the time) and deferred_delete-style calls, a third of them small, against a tight
// budget so that rejections happen, while another thread flushes, drains and freezes.
void many_threads_delete(deferred_domain& domain, bool default_domain) {
  constexpr std::size_t threads = 4;
  const std::size_t per_thread = scaled(20'000);
  std::vector<std::atomic<int>> destroyed(threads * per_thread);
  std::atomic<std::size_t> running{threads};
  std::mutex handoff_mutex;
  std::vector<std::shared_ptr<counted>> handoff;  // shared owners released by the next thread

  std::vector<std::thread> workers;
  for (std::size_t t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (std::size_t i = 0; i < per_thread; ++i) {
        const std::size_t id = t * per_thread + i;
        const std::uint64_t cost = i % 3 == 0 ? 100 : 256 * kib;
        auto* object = new counted{&destroyed[id], cost};
        const deferred_deleter<counted> deleter =
            default_domain ? deferred_deleter<counted>{} : deferred_deleter<counted>{domain};
        switch (i % 4) {
          case 0:
            deferred_ptr<counted>(object, deleter).reset();
            break;
          case 1: {
            std::shared_ptr<counted> shared(object, deleter);
            const std::lock_guard lock(handoff_mutex);
            handoff.push_back(shared);  // whoever clears handoff may be the last owner
            if (handoff.size() > 16) handoff.clear();
            break;
          }
          case 2:
            (void)domain.delete_object(object);
            break;
          default:
            deleter(object);
            break;
        }
      }
      running.fetch_sub(1);
    });
  }
  std::thread controller([&] {
    for (std::size_t round = 0; running.load() != 0; ++round) {
      switch (round % 3) {
        case 0: domain.flush(); break;
        case 1: (void)domain.drain(mib); break;
        default:
          domain.freeze();
          std::this_thread::yield();
          domain.thaw();
          break;
      }
    }
  });
  for (auto& w : workers) w.join();
  controller.join();
  {
    const std::lock_guard lock(handoff_mutex);
    handoff.clear();
  }
  domain.flush();

  std::size_t exactly_once = 0;
  for (const auto& count : destroyed) exactly_once += count.load() == 1 ? 1 : 0;
  EXPECT_EQ(exactly_once, destroyed.size()) << "every object destroyed exactly once";
  const teardown::deferred_stats stats = domain.stats();
  EXPECT_EQ(stats.reaped, stats.queued);
  EXPECT_EQ(stats.pending, 0u);
  EXPECT_LE(stats.high_water, stats.cap);
  EXPECT_EQ(stats.errors, 0u);
  if (!default_domain) {
    EXPECT_EQ(stats.queued + stats.inline_total, destroyed.size());
  }
}

TEST_F(DeferredStressTest, ManyThreadsDeleteThroughAnExplicitDomainEachObjectDestroyedOnce) {
  teardown::deferred_domain_options opts = test_options();
  opts.max_pending = 4 * mib;  // 16 queued objects at most: the budget refuses some
  deferred_domain domain(opts);
  many_threads_delete(domain, false);
  EXPECT_GT(domain.stats().queued, 0u);
}

TEST_F(DeferredStressTest, ManyThreadsDeleteThroughTheDefaultDomainEachObjectDestroyedOnce) {
  many_threads_delete(teardown::deferred::default_domain(), true);
}

TEST_F(DeferredStressTest, ManyThreadsUnmapEachMappingExactlyOnce) {
  deferred_domain domain(test_options());
  constexpr std::size_t threads = 4;
  const std::size_t per_thread = scaled(500);
  std::atomic<std::size_t> handed{0};
  std::vector<std::thread> workers;
  for (std::size_t t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (std::size_t i = 0; i < per_thread; ++i) {
        const std::size_t length = (i + t) % 2 == 0 ? 4096 : 256 * kib;
        void* addr = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (addr == MAP_FAILED) continue;
        static_cast<char*>(addr)[0] = 1;
        (void)domain.unmap(addr, length);
        handed.fetch_add(1);
        if (i % 64 == 0) domain.flush();
      }
    });
  }
  for (auto& w : workers) w.join();
  domain.flush();
  const teardown::deferred_stats stats = domain.stats();
  EXPECT_EQ(stats.queued + stats.inline_total, handed.load());
  EXPECT_EQ(stats.reaped, stats.queued);
  EXPECT_EQ(stats.errors, 0u);
  EXPECT_EQ(stats.pending, 0u);
}

// --- One cap for every domain made from default_options() ------------------------------------

// The room left on a default-options domain's budget, the default domain flushed first (nothing
// else in this process holds a charge on it then).
std::uint64_t room_on_the_budget_of(const deferred_domain& domain) {
  teardown::deferred::flush();
  const teardown::deferred_stats s = domain.stats();
  return s.cap - s.pending;
}

TEST_F(DeferredTest, TwoDefaultOptionsDomainsShareOneCap) {
  deferred_domain first(test_options());
  deferred_domain second(test_options());
  first.freeze();
  second.freeze();
  destruction_log filler, refused, later;
  const std::uint64_t room = room_on_the_budget_of(first);
  EXPECT_EQ(first.delete_object(new tracked{&filler, room}), decision::queued);
  EXPECT_EQ(second.delete_object(new tracked{&refused, 64 * kib}), decision::inline_rejected)
      << "64 KiB fits a quarter of memory, but the other domain holds the whole shared cap";
  EXPECT_EQ(refused.count(), 1);
  EXPECT_EQ(refused.thread(), this_thread_name());
  EXPECT_EQ(second.stats().pending, first.stats().pending) << "pending_bytes is the shared budget's";
  EXPECT_EQ(second.stats().inline_rejected, 1u);
  first.thaw();
  first.flush();
  EXPECT_EQ(filler.count(), 1);
  EXPECT_EQ(second.delete_object(new tracked{&later, 64 * kib}), decision::queued)
      << "the first domain's release made room for the second";
  second.thaw();
  second.flush();
  EXPECT_EQ(later.count(), 1);
  EXPECT_EQ(second.stats().pending, 0u);
}

TEST_F(DeferredTest, DefaultDomainSharesTheCapOfDefaultOptionsDomains) {
  deferred_domain mine(test_options());
  mine.freeze();
  destruction_log filler, refused, later;
  const std::uint64_t room = room_on_the_budget_of(mine);
  EXPECT_EQ(mine.delete_object(new tracked{&filler, room}), decision::queued);
  EXPECT_EQ(teardown::deferred_delete(new tracked{&refused, 64 * kib}), decision::inline_rejected)
      << "the default domain is one of the sharers";
  EXPECT_EQ(refused.count(), 1);
  EXPECT_EQ(teardown::deferred::stats().pending, mine.stats().pending);
  mine.thaw();
  mine.flush();
  EXPECT_EQ(teardown::deferred_delete(new tracked{&later, 64 * kib}), decision::queued);
  teardown::deferred::flush();
  EXPECT_EQ(later.count(), 1);
}

TEST_F(DeferredTest, DefaultOptionsNameTheOneProcessWideBudget) {
  const teardown::deferred_domain_options opts = deferred_domain::default_options();
  ASSERT_NE(opts.shared_budget, nullptr);
  EXPECT_EQ(opts.shared_budget, deferred_domain::default_budget());
  EXPECT_EQ(deferred_domain::default_options().shared_budget, opts.shared_budget) << "one budget, not one per call";
  EXPECT_EQ(opts.max_pending, teardown::budget::max_cap) << "left unset: the shared budget's cap is the cap";
  EXPECT_EQ(deferred_domain::default_budget()->cap(), deferred_domain::default_max_pending());
  EXPECT_EQ(teardown::deferred::default_domain().max_pending(), deferred_domain::default_max_pending());
}

TEST_F(DeferredTest, MaxPendingSetOnDefaultOptionsGivesTheDomainABudgetOfItsOwn) {
  teardown::deferred_domain_options opts = test_options();
  opts.max_pending = 3 * mib;
  deferred_domain own(opts);
  deferred_domain sharing(test_options());
  own.freeze();
  teardown::deferred::flush();
  const std::uint64_t shared_before = deferred_domain::default_budget()->pending();
  destruction_log log;
  EXPECT_EQ(own.delete_object(new tracked{&log, 3 * mib}), decision::queued);
  EXPECT_EQ(own.max_pending(), 3 * mib);
  EXPECT_EQ(own.stats().pending, 3 * mib);
  EXPECT_EQ(sharing.max_pending(), deferred_domain::default_max_pending()) << "the shared cap is untouched";
  EXPECT_EQ(deferred_domain::default_budget()->pending(), shared_before) << "the charge is on the domain's own budget";
  own.thaw();
  own.flush();
  EXPECT_EQ(log.count(), 1);
}

TEST_F(DeferredTest, SetMaxPendingOnADefaultOptionsDomainSetsTheSharedCap) {
  deferred_domain first(test_options());
  deferred_domain second(test_options());
  const std::uint64_t before = first.max_pending();
  struct restore_cap {
    std::uint64_t cap;
    ~restore_cap() { deferred_domain::default_budget()->set_cap(cap); }
  } restore{before};
  first.set_max_pending(before / 2);
  EXPECT_EQ(second.max_pending(), before / 2);
  EXPECT_EQ(teardown::deferred::default_domain().max_pending(), before / 2);
  EXPECT_EQ(deferred_domain::default_budget()->cap(), before / 2);
}

// --- shutdown_for, the exit timeout, and destroying a domain from its own destructor ----------

// An object whose destructor blocks until the test releases it.
struct blocking {
  std::atomic<bool>* started;
  std::atomic<bool>* release;
  destruction_log* log;
  ~blocking() {
    started->store(true);
    while (!release->load()) std::this_thread::yield();
    log->record();
  }
  friend std::uint64_t teardown_cost(const blocking&) { return mib; }
};

TEST_F(DeferredTest, ShutdownForReturnsFalseWhileADestructorBlocksThenAShutdownFinishesTheRest) {
  deferred_domain domain(test_options());
  std::atomic<bool> started{false};
  std::atomic<bool> release{false};
  destruction_log blocker_log;
  std::vector<destruction_log> logs(4);
  domain.freeze();
  EXPECT_EQ(domain.delete_object(new blocking{&started, &release, &blocker_log}), decision::queued);
  for (destruction_log& log : logs) EXPECT_EQ(domain.delete_object(new tracked{&log, mib}), decision::queued);
  domain.thaw();
  while (!started.load()) std::this_thread::yield();
  EXPECT_FALSE(domain.stop_for(std::chrono::milliseconds(20)));
  teardown::deferred_stats s = domain.stats();
  EXPECT_EQ(s.queued - s.reaped, 5u) << "the blocked object and the four behind it are still counted";
  EXPECT_EQ(s.pending, 5 * mib);
  destruction_log after;
  EXPECT_EQ(domain.delete_object(new tracked{&after, mib}), decision::inline_stopped);
  EXPECT_EQ(after.count(), 1);
  release.store(true);
  domain.stop();
  EXPECT_EQ(blocker_log.count(), 1);
  for (destruction_log& log : logs) EXPECT_EQ(log.count(), 1);
  s = domain.stats();
  EXPECT_EQ(s.queued, s.reaped);
  EXPECT_EQ(s.pending, 0u);
}

TEST_F(DeferredTest, ShutdownForWithNothingBlockingReturnsTrue) {
  deferred_domain domain(test_options());
  destruction_log log;
  domain.freeze();
  domain.delete_object(new tracked{&log, mib});
  EXPECT_TRUE(domain.stop_for(std::chrono::seconds(30)));  // a liveness bound
  EXPECT_EQ(log.count(), 1);
}

TEST_F(DeferredTest, ExitTimeoutIsUnlimitedByDefaultAndRefusesANegativeLimit) {
  EXPECT_EQ(teardown::deferred::exit_timeout(), std::chrono::nanoseconds::max());
  EXPECT_THROW(teardown::deferred::set_exit_timeout(std::chrono::milliseconds(-1)), std::invalid_argument);
  EXPECT_EQ(teardown::deferred::exit_timeout(), std::chrono::nanoseconds::max()) << "nothing changed";
  teardown::deferred::set_exit_timeout(std::chrono::seconds(2));
  EXPECT_EQ(teardown::deferred::exit_timeout(), std::chrono::seconds(2));
  teardown::deferred::set_exit_timeout(std::chrono::nanoseconds::max());
}

// A destructor that destroys the domain running it.
struct domain_destroyer {
  deferred_domain* domain;
  ~domain_destroyer() { delete domain; }
  friend std::uint64_t teardown_cost(const domain_destroyer&) { return mib; }
};

[[noreturn]] void wait_for_the_abort() {
  for (int i = 0; i < 10'000; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::_Exit(0);  // no abort: the death test reports "did not die"
}

TEST_F(DeferredTest, DestroyingTheDomainFromADestructorOnItsReaperAbortsWithAMessage) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto* domain = new deferred_domain(test_options());
        domain->delete_object(new domain_destroyer{domain});
        wait_for_the_abort();
      },
      "teardown::deferred_domain::~deferred_domain: the domain is destroyed from a destructor");
}

TEST_F(DeferredTest, DestroyingTheDomainFromADestructorInsideItsDrainAbortsWithAMessage) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto* domain = new deferred_domain(test_options());
        domain->freeze();
        domain->delete_object(new domain_destroyer{domain});
        (void)domain->drain(std::numeric_limits<std::uint64_t>::max());
        wait_for_the_abort();
      },
      "teardown::deferred_domain::~deferred_domain: the domain is destroyed from a destructor");
}

// --- Options and the vocabulary ----------------------------------------------------------------

static_assert(teardown::worker_control<deferred_domain>);

// `deferred_domain d({.threshold = ...})` once built async_teardown_options: no shared budget, a
// cap of 2^48 and a reaper named "async_teardown". deferred_domain_options keep deferred's.
TEST_F(DeferredTest, DesignatedOptionsKeepEveryOtherDefaultOfDeferred) {
  deferred_domain domain({.threshold = 1 << 20});
  EXPECT_EQ(domain.threshold(), 1u << 20);
  EXPECT_EQ(domain.max_pending(), deferred_domain::default_budget()->cap()) << "the shared budget's cap";
  EXPECT_NE(domain.max_pending(), teardown::budget::max_cap);
  destruction_log log;
  domain.delete_object(new tracked{&log, 2 * mib});
  domain.flush();
  EXPECT_EQ(log.count(), 1);
  expect_on_the_reaper(log, domain.stats());  // the reaper has deferred's name
  const teardown::deferred_domain_options defaults;
  EXPECT_EQ(defaults.threshold, teardown::default_deferred_tuning().threshold);
  EXPECT_EQ(defaults.trim.after, deferred_domain::default_trim_after);
  EXPECT_EQ(defaults.shared_budget, deferred_domain::default_budget());
  EXPECT_EQ(defaults.reaper.name, "deferred_delete");
}

TEST_F(DeferredTest, OldNamesStillWorkWithTheSameValues) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  // The old constructor takes async_teardown_options, with async_teardown's defaults, as before.
  deferred_domain plain_async(teardown::async_teardown_options{.reaper = {.name = reaper_name}});
  EXPECT_EQ(plain_async.max_pending(), teardown::budget::max_cap);
  // Old code that kept default_options() in an async_teardown_options still builds.
  teardown::async_teardown_options converted = deferred_domain::default_options();
  converted.reaper.name = reaper_name;
  converted.sync_when_stalled = false;
  converted.reaper.nice = 17;  // then 18 below: a raise of the value, which any user may make
  deferred_domain domain(converted);
  EXPECT_EQ(domain.threshold(), teardown::default_deferred_tuning().threshold);
  EXPECT_EQ(domain.max_pending(), deferred_domain::default_budget()->cap());

  destruction_log log;
  domain.freeze();
  EXPECT_EQ(domain.delete_object(new tracked{&log, 1}), decision::sync_ineligible);
  EXPECT_EQ(domain.delete_object(new tracked{&log, mib}), decision::queued);
  teardown::detail::fail_next_node_allocations = 1;
  EXPECT_EQ(domain.delete_object(new tracked{&log, mib}), decision::sync_no_memory);
  const teardown::deferred_stats s = domain.stats();
  EXPECT_EQ(s.freed_inline, 2u);
  EXPECT_EQ(s.freed_inline, s.inline_total);
  EXPECT_EQ(s.small, 1u);
  EXPECT_EQ(s.small, s.inline_small);
  EXPECT_EQ(s.no_memory, 1u);
  EXPECT_EQ(s.no_memory, s.inline_no_memory);
  EXPECT_EQ(s.rejected, s.inline_rejected);
  EXPECT_EQ(s.pending_bytes, mib);
  EXPECT_EQ(s.pending_bytes, s.pending);
  EXPECT_EQ(s.max_pending, s.cap);
  EXPECT_EQ(s.trims, s.trim.trims);
  EXPECT_EQ(s.trimmed_bytes, s.trim.trimmed_bytes);
  EXPECT_EQ(s.trim_cpu_ns, s.trim.trim_cpu_ns);
  EXPECT_EQ(domain.worker_nice(), domain.nice());
  EXPECT_TRUE(domain.set_worker_nice(18));
  EXPECT_EQ(domain.nice(), 18);
  EXPECT_EQ(domain.reaper_statistics().enqueued, domain.worker_stats().enqueued);
  domain.thaw();
  EXPECT_TRUE(domain.shutdown_for(std::chrono::seconds(30)));  // a liveness bound, not a time assertion
  domain.shutdown();
  EXPECT_EQ(log.count(), 3);
  EXPECT_EQ(domain.delete_object(new tracked{&log, mib}), decision::sync_stopped);
  EXPECT_FALSE(domain.reaper_statistics().running);
#pragma GCC diagnostic pop
}

}  // namespace
}  // namespace teardown_test
