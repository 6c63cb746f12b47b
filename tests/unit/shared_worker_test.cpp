// Specification of teardown::shared_worker (shared_worker.hpp): many async_teardown and
// deferred_domain instances on one worker thread, each keeping its own counters, budget and
// trace domain; one domain's shutdown (or destruction) never stops the worker and leaves none
// of its items queued; misuse is refused before anything starts; the default domain runs on
// deferred::default_worker(). The last test drives the domain-shutdown gate under the
// deterministic scheduler, with a planted bug it must catch. Nothing here asserts a time.
#include "teardown/shared_worker.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <latch>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "schedule/scenario_support.hpp"
#include "teardown/async_teardown.hpp"
#include "teardown/deferred.hpp"
#include "teardown/trace.hpp"
#include "test_support.hpp"

namespace {

using teardown::async_teardown_options;
using teardown::decision;

struct item {
  teardown::llist_node hook;
  std::uint64_t cost = 100;
  std::uint64_t charge = 0;
  void* owner = nullptr;
  int domain = -1;                  // which domain it was put to
  std::atomic<int>* torn_down_by = nullptr;  // per-domain count, bumped by that domain's destroy
  int traits_domain = -1;           // which domain's traits destroyed it
  std::atomic<int> destroyed{0};
};

struct owned_traits {
  int domain = 0;
  std::atomic<int>* count = nullptr;
  std::uint64_t cost(const item& i) const { return i.cost; }
  bool eligible(const item&, std::uint64_t) const { return true; }
  void prepare(item&) const {}
  void destroy(item& i) const {
    i.traits_domain = domain;
    if (count != nullptr) count->fetch_add(1, std::memory_order_relaxed);
    i.destroyed.fetch_add(1, std::memory_order_relaxed);
  }
  std::uint64_t& charge(item& i) const { return i.charge; }
  static void*& owner(item& i) { return i.owner; }
};

struct ownerless_traits {
  std::uint64_t cost(const item& i) const { return i.cost; }
  bool eligible(const item&, std::uint64_t) const { return true; }
  void prepare(item&) const {}
  void destroy(item& i) const { i.destroyed.fetch_add(1); }
  std::uint64_t& charge(item& i) const { return i.charge; }
};

using worker_type = teardown::shared_worker<item, &item::hook, owned_traits>;
using domain_type = teardown::async_teardown<item, &item::hook, owned_traits>;

// The process's threads. A sanitizer's runtime starts a thread of its own at the first thread
// creation: one thread started and joined first keeps it out of the differences. A joined thread
// may linger in /proc/self/task for a moment (the count before a test's act read 3 where the
// thread had not yet left, and 2 after): the warm-up waits until its thread's entry is gone
// (bounded by tries, not by time).
std::size_t thread_count() {
  static const bool warmed = [] {
    pid_t warm_tid = 0;
    std::thread([&warm_tid] { warm_tid = ::gettid(); }).join();
    const std::filesystem::path entry = "/proc/self/task/" + std::to_string(warm_tid);
    for (int tries = 0; std::filesystem::exists(entry) && tries < 100'000; ++tries) std::this_thread::yield();
    return true;
  }();
  (void)warmed;
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// A joined thread may linger in /proc/self/task for a moment: the count once it settles at
// `expected` (bounded by tries, not by time), or the last one read.
std::size_t thread_count_settled_at(std::size_t expected) {
  std::size_t n = thread_count();
  for (int tries = 0; n != expected && tries < 10'000; ++tries) {
    std::this_thread::yield();
    n = thread_count();
  }
  return n;
}

async_teardown_options on(const std::shared_ptr<worker_type>& worker,
                          std::uint64_t max_pending = teardown::budget::max_cap) {
  async_teardown_options opts;
  opts.worker = worker;
  opts.max_pending = max_pending;
  return opts;
}

TEST(SharedWorkerTest, EightAsyncDomainsOnOneWorkerAddOneThreadAndCountApart) {
  constexpr int k = 8;
  const std::size_t before = thread_count();
  auto worker = std::make_shared<worker_type>();
  std::vector<std::atomic<int>> counts(k);
  std::vector<std::unique_ptr<domain_type>> domains;
  for (int d = 0; d < k; ++d) domains.push_back(std::make_unique<domain_type>(on(worker), owned_traits{d, &counts[d]}));
  EXPECT_EQ(thread_count(), before + 1);
  std::vector<item> items(static_cast<std::size_t>(k * (k + 1) / 2));
  std::size_t at = 0;
  for (int d = 0; d < k; ++d) {
    for (int i = 0; i <= d; ++i) EXPECT_EQ(domains[d]->put(items[at++]), decision::queued);
  }
  worker->flush();
  for (int d = 0; d < k; ++d) {
    const auto s = domains[d]->stats();
    EXPECT_EQ(s.queued, static_cast<std::uint64_t>(d + 1)) << d;
    EXPECT_EQ(s.reaped, static_cast<std::uint64_t>(d + 1)) << d;
    EXPECT_EQ(s.pending, 0u);
    EXPECT_EQ(counts[d].load(), d + 1);
    EXPECT_EQ(domains[d]->worker_count(), 1u);
  }
  for (const item& i : items) EXPECT_EQ(i.destroyed.load(), 1);
  EXPECT_EQ(worker->stats().reaped, items.size()) << "the shared worker's statistics are every sharer's";
  domains.clear();
  worker.reset();
  EXPECT_EQ(thread_count_settled_at(before), before);
}

TEST(SharedWorkerTest, EightDeferredDomainsOnOneWorkerAddOneThreadAndCountApart) {
  constexpr int k = 8;
  const std::size_t before = thread_count();
  auto worker = std::make_shared<teardown::deferred_worker>();
  std::vector<std::unique_ptr<teardown::deferred_domain>> domains;
  for (int d = 0; d < k; ++d) {
    teardown::deferred_domain_options opts = teardown::deferred_domain::default_options();
    opts.worker = worker;
    opts.max_pending = std::uint64_t{1} << 40;
    domains.push_back(std::make_unique<teardown::deferred_domain>(std::move(opts)));
  }
  EXPECT_EQ(thread_count(), before + 1);
  for (int d = 0; d < k; ++d) {
    for (int i = 0; i <= d; ++i) {
      EXPECT_EQ(domains[d]->delete_object(new std::vector<char>(1 << 20)), decision::queued);
    }
  }
  for (int d = 0; d < k; ++d) {
    domains[d]->flush();
    EXPECT_EQ(domains[d]->stats().queued, static_cast<std::uint64_t>(d + 1));
    EXPECT_EQ(domains[d]->stats().reaped, static_cast<std::uint64_t>(d + 1));
    EXPECT_EQ(domains[d]->stats().pending, 0u);
  }
  domains.clear();
  worker.reset();
  EXPECT_EQ(thread_count_settled_at(before), before);
}

TEST(SharedWorkerTest, AFullBudgetRejectsOnlyItsOwnDomainsPuts) {
  auto worker = std::make_shared<worker_type>();
  domain_type small(on(worker, 150), owned_traits{0});
  domain_type large(on(worker), owned_traits{1});
  worker->freeze();  // nothing is released meanwhile
  std::vector<item> items(6);
  EXPECT_EQ(small.put(items[0]), decision::queued);
  EXPECT_EQ(small.put(items[1]), decision::inline_rejected);
  for (int i = 2; i < 6; ++i) EXPECT_EQ(large.put(items[i]), decision::queued);
  EXPECT_EQ(small.stats().inline_rejected, 1u);
  EXPECT_EQ(large.stats().inline_rejected, 0u);
  worker->thaw();
  worker->flush();
  for (const item& i : items) EXPECT_EQ(i.destroyed.load(), 1);
}

std::atomic<std::uint64_t> reaps_in[2];
std::uint64_t watched[2];
void count_reap(const teardown::trace::reap_event& e) {
  for (int d = 0; d < 2; ++d) {
    if (e.domain == watched[d]) reaps_in[d].fetch_add(1);
  }
}

TEST(SharedWorkerTest, ReapEventsNameTheOwningDomain) {
  auto worker = std::make_shared<worker_type>();
  domain_type a(on(worker), owned_traits{0});
  domain_type b(on(worker), owned_traits{1});
  ASSERT_NE(a.trace_domain(), b.trace_domain());
  watched[0] = a.trace_domain();
  watched[1] = b.trace_domain();
  reaps_in[0] = 0;
  reaps_in[1] = 0;
  teardown::trace::add_hook<teardown::trace::reap_event>(&count_reap);
  std::vector<item> items(5);
  for (int i = 0; i < 2; ++i) a.put(items[i]);
  for (int i = 2; i < 5; ++i) b.put(items[i]);
  worker->flush();
  teardown::trace::remove_hook<teardown::trace::reap_event>(&count_reap);
  EXPECT_EQ(reaps_in[0].load(), 2u);
  EXPECT_EQ(reaps_in[1].load(), 3u);
}

TEST(SharedWorkerTest, ShuttingOneDomainDownLeavesTheOthersQueuing) {
  auto worker = std::make_shared<worker_type>();
  domain_type stopping(on(worker), owned_traits{0});
  domain_type going_on(on(worker), owned_traits{1});
  std::vector<item> items(2000);
  std::atomic<bool> stop{false};
  std::thread other([&] {
    for (std::size_t i = 1000; i < 2000; ++i) EXPECT_EQ(going_on.put(items[i]), decision::queued);
  });
  std::thread putter([&] {
    for (std::size_t i = 0; i < 1000; ++i) {
      const decision d = stopping.put(items[i]);
      EXPECT_TRUE(d == decision::queued || d == decision::inline_stopped);
      if (i == 500) stop = true;
    }
  });
  while (!stop) std::this_thread::yield();
  stopping.stop();
  const auto at_shutdown = stopping.stats();
  EXPECT_EQ(at_shutdown.reaped, at_shutdown.queued) << "shutdown left an item of its own queued";
  putter.join();
  other.join();
  EXPECT_EQ(stopping.stats().reaped, stopping.stats().queued);
  EXPECT_EQ(stopping.stats().queued + stopping.stats().inline_total, 1000u);
  item late;
  EXPECT_EQ(stopping.put(late), decision::inline_stopped);
  EXPECT_EQ(going_on.put(late), decision::queued) << "the shared worker still runs";
  worker->flush();
  EXPECT_EQ(going_on.stats().reaped, 1001u);
  for (std::size_t i = 0; i < 2000; ++i) EXPECT_EQ(items[i].destroyed.load(), 1) << i;
  EXPECT_EQ(late.destroyed.load(), 2);  // once inline, once queued: two puts
}

TEST(SharedWorkerTest, DomainsDestroyedInAnyOrderWhileTheWorkerRuns) {
  auto worker = std::make_shared<worker_type>();
  constexpr int k = 6;
  std::vector<std::atomic<int>> counts(k);
  std::vector<std::unique_ptr<domain_type>> domains;
  for (int d = 0; d < k; ++d) domains.push_back(std::make_unique<domain_type>(on(worker), owned_traits{d, &counts[d]}));
  std::vector<item> items(k * 200);
  for (std::size_t i = 0; i < items.size(); ++i) {
    items[i].domain = static_cast<int>(i % k);
    domains[i % k]->put(items[i]);
  }
  for (int d : {3, 0, 5, 1, 4, 2}) {
    domains[d].reset();  // its destructor leaves nothing of its own queued
    EXPECT_EQ(counts[d].load(), 200) << d;
  }
  for (const item& i : items) {
    EXPECT_EQ(i.destroyed.load(), 1);
    EXPECT_EQ(i.traits_domain, i.domain);
  }
}

TEST(SharedWorkerTest, ConcurrentPutsAreDispatchedToTheDomainThatQueuedThem) {
  auto worker = std::make_shared<worker_type>();
  constexpr int k = 4;
  constexpr std::size_t per_thread = 2000;
  std::vector<std::atomic<int>> counts(k);
  std::vector<std::unique_ptr<domain_type>> domains;
  for (int d = 0; d < k; ++d) domains.push_back(std::make_unique<domain_type>(on(worker), owned_traits{d, &counts[d]}));
  std::vector<item> items(k * per_thread);
  std::vector<std::thread> threads;
  for (int t = 0; t < k; ++t) {
    threads.emplace_back([&, t] {
      for (std::size_t i = 0; i < per_thread; ++i) {
        item& x = items[t * per_thread + i];
        x.domain = static_cast<int>((t + i) % k);
        domains[x.domain]->put(x);
      }
    });
  }
  for (auto& t : threads) t.join();
  worker->flush();
  for (int d = 0; d < k; ++d) {
    EXPECT_EQ(counts[d].load(), static_cast<int>(per_thread));
    EXPECT_EQ(domains[d]->stats().reaped, per_thread);
  }
  for (const item& x : items) EXPECT_EQ(x.traits_domain, x.domain);
}

TEST(SharedWorkerTest, TraitsWithoutAnOwnerSlotRefuseASharedWorkerAndStartNothing) {
  auto worker = std::make_shared<worker_type>();
  const std::size_t before = thread_count();
  async_teardown_options opts;
  opts.worker = worker;
  using ownerless = teardown::async_teardown<item, &item::hook, ownerless_traits>;
  EXPECT_THROW(ownerless bad(opts), std::invalid_argument);
  EXPECT_EQ(thread_count(), before);
  EXPECT_EQ(worker.use_count(), 2) << "the refused composition kept no hold on the worker";
  // And a worker of another kind (a deferred one) for this item type.
  async_teardown_options wrong;
  wrong.worker = std::make_shared<teardown::deferred_worker>();
  const std::size_t with_other = thread_count();
  EXPECT_THROW(domain_type bad(wrong), std::invalid_argument);
  EXPECT_EQ(thread_count(), with_other);
}

TEST(SharedWorkerTest, DefaultDomainRunsOnTheDefaultWorkerAndAUserDomainAddsNoThread) {
  teardown::deferred::default_domain();
  const auto& worker = teardown::deferred::default_worker();
  const std::size_t before = thread_count();
  teardown::deferred_domain_options opts = teardown::deferred_domain::default_options();
  opts.worker = worker;
  {
    teardown::deferred_domain mine(std::move(opts));
    EXPECT_EQ(thread_count(), before);
    EXPECT_EQ(mine.delete_object(new std::vector<char>(1 << 20)), decision::queued);
    EXPECT_EQ(teardown::deferred_delete(new std::vector<char>(1 << 20)), decision::queued);
    mine.flush();
    EXPECT_EQ(mine.stats().reaped, 1u);
  }
  EXPECT_EQ(thread_count(), before);
  const std::uint64_t reaped_before = worker->stats().reaped;
  teardown::deferred_delete(new std::vector<char>(1 << 20));
  teardown::deferred::flush();
  EXPECT_GT(worker->stats().reaped, reaped_before) << "the default domain's items go to the default worker";
}

TEST(SharedWorkerTest, ADomainOnASharedWorkerWorksInAForkChild) {
  auto worker = std::make_shared<worker_type>();
  std::atomic<int> count{0};
  domain_type domain(on(worker), owned_traits{0, &count});
  std::vector<item> items(4);
  worker->freeze();
  for (int i = 0; i < 3; ++i) domain.put(items[i]);
  const pid_t pid = fork();
  if (pid == 0) {
    int failures = 0;
    domain.put(items[3]);  // the child has no worker: torn down inline
    if (items[3].destroyed.load() != 1) ++failures;
    domain.stop();  // what the parent had queued, torn down once here, on the child's copy
    for (int i = 0; i < 3; ++i) failures += items[i].destroyed.load() == 1 ? 0 : 1;
    _exit(failures);
  }
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(count.load(), 0);
  worker->thaw();
  domain.stop();
  EXPECT_EQ(count.load(), 3);
}

TEST(SharedWorkerTest, APoolServesSeveralDomainsWithItsWorkers) {
  using pool_worker = teardown::shared_worker<item, &item::hook, owned_traits, teardown::reaper_pool_workers>;
  using pool_domain = teardown::async_teardown<item, &item::hook, owned_traits, teardown::static_key,
                                               teardown::reaper_pool_workers>;
  const std::size_t before = thread_count();
  teardown::reaper_pool_options pool = pool_worker::default_options();
  pool.workers = 2;
  auto worker = std::make_shared<pool_worker>(pool);
  async_teardown_options opts;
  opts.worker = worker;
  std::atomic<int> a_count{0};
  std::atomic<int> b_count{0};
  {
    pool_domain a(opts, owned_traits{0, &a_count});
    pool_domain b(opts, owned_traits{1, &b_count});
    EXPECT_EQ(thread_count(), before + 2);
    EXPECT_EQ(a.worker_count(), 2u);
    std::vector<item> items(10);
    for (int i = 0; i < 10; ++i) (i % 2 == 0 ? a : b).put(items[i]);
    a.flush();
    EXPECT_EQ(a_count.load(), 5);
    EXPECT_EQ(b_count.load(), 5);
  }
  // Given an own-worker composition's options type, a one_reaper worker is refused.
  async_teardown_options wrong;
  wrong.worker = std::make_shared<worker_type>();
  EXPECT_THROW(pool_domain bad(wrong), std::invalid_argument);
}

struct throwing_traits : owned_traits {
  void destroy(item& i) const {
    owned_traits::destroy(i);
    throw std::runtime_error("destroy failed");
  }
};

TEST(SharedWorkerTest, DestroyErrorsAreCountedByTheDomainWhoseItemThrew) {
  using throwing_worker = teardown::shared_worker<item, &item::hook, throwing_traits>;
  using throwing_domain = teardown::async_teardown<item, &item::hook, throwing_traits>;
  std::atomic<int> reported{0};
  auto opts = throwing_worker::default_options();
  opts.on_error = [&](std::exception_ptr) { reported.fetch_add(1); };
  auto worker = std::make_shared<throwing_worker>(opts);
  async_teardown_options on_it;
  on_it.worker = worker;
  throwing_domain a(on_it);
  throwing_domain b(on_it);
  std::vector<item> items(3);
  a.put(items[0]);
  a.put(items[1]);
  worker->flush();
  b.put(items[2]);
  b.flush();
  EXPECT_EQ(a.stats().errors, 2u);
  EXPECT_EQ(b.stats().errors, 1u);
  EXPECT_EQ(a.stats().reaped, 2u) << "an item whose destroy threw is still reaped, its charge released";
  EXPECT_EQ(a.stats().pending, 0u);
  EXPECT_EQ(worker->stats().errors, 3u);
  EXPECT_EQ(reported.load(), 3) << "the shared worker's on_error hears every sharer's";
}

// A sharer destroyed from the shared worker's callback would flush the worker from itself and
// leave the callback on a freed object: it aborts, saying why.
TEST(SharedWorkerDeathTest, DestroyingADomainFromTheSharedWorkersCallbackAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto worker = std::make_shared<worker_type>();
        auto victim = std::make_unique<domain_type>(on(worker), owned_traits{1});
        domain_type killer(on(worker), owned_traits{0});
        item x;
        static std::unique_ptr<domain_type>* target;
        target = &victim;
        struct hook {
          static void on_reap(const teardown::trace::reap_event&) { target->reset(); }
        };
        // The reap event fires on the worker, inside the killer's reap: it destroys the victim.
        teardown::trace::add_hook<teardown::trace::reap_event>(&hook::on_reap);
        killer.put(x);
        killer.flush();
      },
      "destroyed from its own callback");
}

// ---- the domain-shutdown gate under the deterministic scheduler ------------------------------

namespace sched = teardown::schedule;

struct sched_item {
  teardown::llist_node node;
  std::atomic<int> runs{0};
  sched::stamp published;  // the putter's, before its enqueue (weak memory: schedule.hpp)
  bool gated = true;       // put through the gate (another domain's item: not)
};

// The worker's teardown: a domain that shutdown has given up on must never see an item again.
struct checked_reap {
  std::atomic<bool>* gone;
  void operator()(sched_item& x) const noexcept {
    sched::sync::yield();
    sched::check(!x.gated || !gone->load(std::memory_order_relaxed),
                 "an item was dispatched after its domain's shutdown returned");
    sched::check(sched::ordered_here(x.published), "an item was torn down unordered after its put");
    x.runs.fetch_add(1, std::memory_order_relaxed);
  }
};

using sched_queue = teardown::llist<sched_item, &sched_item::node, sched::sync>;
using sched_reaper = teardown::reaper<sched_item, &sched_item::node, checked_reap, sched_queue>;

// A put races the domain's shutdown (gate close, then a flush of the shared worker, which keeps
// running): the put is either refused and torn down by its caller, or enqueued before the flush.
// Another domain's put on the same worker, not ordered with the shutdown, may make the gated
// put a second add: one that kicks nobody, so that only the gate orders it before the flush.
sched::explore_result put_racing_shutdown(std::uint64_t schedules) {
  return sched::explore({.name = "shared worker: shutdown beside a put", .schedules = schedules},
                        [] {
                          std::atomic<bool> gone{false};
                          sched_item x;
                          sched_item other;
                          other.gated = false;
                          sched_reaper worker(checked_reap{&gone}, sched::scenario::scenario_worker());
                          teardown::detail::domain_gate<sched::sync> gate;
                          sched::thread putter([&] {
                            if (gate.enter()) {
                              x.published = sched::publish();
                              worker.enqueue(x);
                              gate.leave();
                            } else {
                              x.runs.fetch_add(1, std::memory_order_relaxed);  // inline
                            }
                          });
                          sched::thread sharer([&] {
                            other.published = sched::publish();
                            worker.enqueue(other);
                          });
                          (void)gate.close();
                          worker.flush();
                          gone.store(true, std::memory_order_relaxed);
                          putter.join();
                          sharer.join();
                          worker.stop();
                          sched::check(x.runs.load(std::memory_order_relaxed) == 1, "the item was not torn down once");
                          sched::check(other.runs.load(std::memory_order_relaxed) == 1,
                                       "the other domain's item was not torn down once");
                        });
}

// tests/unit/schedule/planted_bugs.py plants a close() that does not wait (gate_skips_wait).
TEST(SharedWorkerScheduleTest, ShutdownWaitsForAPutInFlight) {
  const auto result = put_racing_shutdown(10'000);
  EXPECT_FALSE(result.failure.has_value()) << *result.failure << " (schedule " << result.failed_schedule << ")";
}

}  // namespace

// Driven and shared: no thread at all, one work_fd for every sharer, and a run from any sharer
// (or the worker) tears down every sharer's items, each counted by its own domain.
// A put whose prepare stalls: it holds the domain's gate (entered before the stopped check,
// left after the enqueue).
struct stalling_prepare_traits : owned_traits {
  std::atomic<bool>* in_prepare = nullptr;
  std::latch* release = nullptr;
  void prepare(item&) const {
    in_prepare->store(true);
    release->wait();
  }
};

// stop_for of a domain on a shared worker closes the domain's gate and waits for its puts in
// flight: one still in flight at the deadline makes it false. That put is queued once it goes
// on, and the next stop_for tears it down: nothing lost. On a driven worker nothing else can
// make the first stop_for false (its flush of an empty queue is done on the caller, at once).
void stop_for_gives_up_while_a_put_is_in_flight(bool driven) {
  using stalling_worker = teardown::shared_worker<item, &item::hook, stalling_prepare_traits>;
  std::atomic<bool> in_prepare{false};
  std::latch release(1);
  stalling_prepare_traits traits;
  traits.in_prepare = &in_prepare;
  traits.release = &release;
  stalling_worker::options_type worker_options = stalling_worker::default_options();
  worker_options.driven = driven;
  async_teardown_options opts;
  opts.worker = std::make_shared<stalling_worker>(std::move(worker_options));
  teardown::async_teardown<item, &item::hook, stalling_prepare_traits> domain(std::move(opts), traits);
  item x;
  std::thread putter([&] { EXPECT_EQ(domain.put(x), decision::queued); });
  while (!in_prepare.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_FALSE(domain.stop_for(std::chrono::milliseconds(20))) << "stop_for returned true with a put in flight";
  release.count_down();
  putter.join();
  EXPECT_TRUE(domain.stop_for(std::chrono::seconds(10)));
  EXPECT_EQ(x.destroyed.load(), 1);
}

TEST(SharedWorkerTest, StopForGivesUpAtItsDeadlineWhileAPutIsInFlight) {
  stop_for_gives_up_while_a_put_is_in_flight(/*driven=*/false);
}

TEST(SharedWorkerTest, StopForGivesUpAtItsDeadlineWhileAPutIsInFlightOnADrivenWorker) {
  stop_for_gives_up_while_a_put_is_in_flight(/*driven=*/true);
}

// A destroy that stops its own domain (the last item of a subsystem tearing the subsystem
// down). On a shared worker a put the budget rejects leaves the domain's gate before its inline
// destroy runs, put and put_chain alike: otherwise the stop waits for the very put that calls it
// (here until its deadline: stop_for, so that the failure is a false, not a hang).
struct self_stopping_traits : owned_traits {
  std::function<void()>* on_destroy = nullptr;
  void destroy(item& i) const {
    owned_traits::destroy(i);
    if (*on_destroy) (*on_destroy)();
  }
};

// put(x), or put_chain of a chain of x alone.
template <class Domain>
decision put_alone(Domain& domain, item& x, bool chained) {
  if (!chained) return domain.put(x);
  teardown::llist_chain<item, &item::hook> chain;
  chain.push_back(x);
  return domain.put_chain(std::move(chain));
}

TEST(SharedWorkerTest, ARejectedPutsDestroyMayStopItsOwnDomain) {
  for (const bool chained : {false, true}) {
    std::function<void()> on_destroy;
    self_stopping_traits traits;
    traits.on_destroy = &on_destroy;
    async_teardown_options opts;
    opts.worker = std::make_shared<teardown::shared_worker<item, &item::hook, self_stopping_traits>>();
    opts.max_pending = 10;  // every item here costs 100: rejected, torn down inline
    teardown::async_teardown<item, &item::hook, self_stopping_traits> domain(std::move(opts), traits);
    int stops = 0;
    bool stopped_in_time = true;
    on_destroy = [&] {
      ++stops;
      stopped_in_time = stopped_in_time && domain.stop_for(std::chrono::seconds(5));
    };
    item x;
    EXPECT_EQ(put_alone(domain, x, chained), decision::inline_rejected);
    on_destroy = nullptr;
    EXPECT_EQ(stops, 1);
    EXPECT_TRUE(stopped_in_time) << (chained ? "put_chain" : "put")
                                 << ": the stop waited for the put whose destroy called it";
    EXPECT_EQ(x.destroyed.load(), 1);
  }
}

// The same for a put turned away because the worker stalls (it entered the gate before it asked):
// its destroy thaws the frozen worker and stops the domain, which waits for the queued item.
TEST(SharedWorkerTest, AStalledPutsDestroyMayStopItsOwnDomain) {
  for (const bool chained : {false, true}) {
    using stopping_worker = teardown::shared_worker<item, &item::hook, self_stopping_traits>;
    std::function<void()> on_destroy;
    self_stopping_traits traits;
    traits.on_destroy = &on_destroy;
    stopping_worker::options_type quick = stopping_worker::default_options();
    quick.stall_threshold = std::chrono::milliseconds(1);
    async_teardown_options opts;
    opts.worker = std::make_shared<stopping_worker>(std::move(quick));
    teardown::async_teardown<item, &item::hook, self_stopping_traits> domain(std::move(opts), traits);
    const std::thread::id caller = std::this_thread::get_id();
    int stops = 0;
    bool stopped_in_time = true;
    on_destroy = [&] {
      if (std::this_thread::get_id() != caller) return;  // the queued item, on the worker
      ++stops;
      domain.thaw();
      stopped_in_time = stopped_in_time && domain.stop_for(std::chrono::seconds(5));
    };
    domain.freeze();
    item queued, x;
    ASSERT_EQ(domain.put(queued), decision::queued);
    ASSERT_TRUE(teardown_test::eventually([&] { return domain.stalled(); }));  // past the 1 ms threshold
    EXPECT_EQ(put_alone(domain, x, chained), decision::inline_stalled);
    EXPECT_EQ(stops, 1);
    EXPECT_TRUE(stopped_in_time) << (chained ? "put_chain" : "put")
                                 << ": the stop waited for the put whose destroy called it";
    EXPECT_EQ(queued.destroyed.load(), 1);
    EXPECT_EQ(x.destroyed.load(), 1);
    on_destroy = nullptr;
  }
}

TEST(SharedWorkerTest, ADrivenSharedWorkerStartsNoThreadAndOneRunServesEverySharer) {
  const std::size_t before = thread_count();
  worker_type::options_type driven = worker_type::default_options();
  driven.driven = true;
  auto worker = std::make_shared<worker_type>(std::move(driven));
  std::atomic<int> first_count{0};
  std::atomic<int> second_count{0};
  domain_type first(on(worker), owned_traits{0, &first_count});
  domain_type second(on(worker), owned_traits{1, &second_count});
  EXPECT_EQ(thread_count(), before);
  ASSERT_GE(worker->work_fd(), 0);
  EXPECT_EQ(first.work_fd(), worker->work_fd());
  EXPECT_EQ(second.work_fd(), worker->work_fd());
  std::vector<item> items(6);
  for (std::size_t i = 0; i < items.size(); ++i) {
    EXPECT_EQ((i % 2 == 0 ? first : second).put(items[i]), decision::queued);
  }
  EXPECT_EQ(first.stats().reaped, 0u) << "nothing runs until someone drives";
  const teardown::drive_result ran = first.run();
  EXPECT_EQ(ran.items, items.size());
  EXPECT_FALSE(ran.more);
  EXPECT_EQ(first.stats().reaped, 3u);
  EXPECT_EQ(second.stats().reaped, 3u);
  EXPECT_EQ(first_count.load(), 3);
  EXPECT_EQ(second_count.load(), 3);
  for (const item& i : items) EXPECT_EQ(i.destroyed.load(), 1);
  EXPECT_EQ(second.put(items[0]), decision::queued);
  second.stop();  // flushes the driven worker on this thread
  EXPECT_EQ(items[0].destroyed.load(), 2);
  EXPECT_EQ(second.stats().reaped, 4u);
  EXPECT_EQ(thread_count(), before);
}
