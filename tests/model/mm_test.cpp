// Specification of teardown/model/mm.hpp: every decision path of mmput_exit() (not the last
// reference, toggle off, below the threshold and at it, MMF_OOM_SKIP, MMF_OOM_TARGETED, budget
// full, after shutdown, queued, and uncontended under the concurrency gate, alone and in a kill
// storm), mmput() always inline and uncounted, the eager exit_aio (an in-flight request blocks
// only the exiting thread, never the reaper), the memoised charge, real backing memory (touched,
// unmapped, reclaimed), the OOM killer (mark before kill, every sharer killed, victims never
// queued), tasks, the knobs and their validation, drain(), freeze/thaw with a backlog. The
// MmSystemStressTest suite races spawns, CLONE_VM sharers, exits, the toggle and OOM kills.
//
// Nothing here asserts a time. A wait for another thread to reach a point is a loop on an
// observable flag; the per-test hang_guard turns a hang into an abort naming the test. Trace
// hooks are process-wide state: every test that sets one clears it when it ends.
#include "teardown/model/mm.hpp"
#include "teardown/worker_control.hpp"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <latch>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
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
#include "test_support.hpp"

namespace teardown {
// gtest prints decisions (and std::optional<decision>) by name.
inline void PrintTo(decision d, std::ostream* os) { *os << to_string(d); }
}  // namespace teardown

namespace teardown_test {
namespace {

using namespace std::chrono_literals;
using reaper_support::current_test_name;
using reaper_support::hang_guard;
using teardown::decision;
using teardown::model::backing;
using teardown::model::mm_struct;
using teardown::model::mm_system;
using teardown::model::mm_system_options;
using teardown::model::MMF_OOM_SKIP;
using teardown::model::MMF_OOM_TARGETED;
using teardown::model::test_flag;
namespace trace = teardown::trace;

static_assert(!std::is_copy_constructible_v<mm_system> && !std::is_copy_assignable_v<mm_system>);
static_assert(noexcept(std::declval<const mm_system&>().vmstat()));
static_assert(noexcept(mm_system::mmget(std::declval<mm_struct&>())));
static_assert(noexcept(mm_system::mmgrab(std::declval<mm_struct&>())));
static_assert(noexcept(mm_system::mmdrop(std::declval<mm_struct&>())));
static_assert(noexcept(std::declval<mm_system&>().mmput(std::declval<mm_struct&>())));

// Every test runs under a hang guard.
class MmTest : public ::testing::Test {
 private:
  hang_guard guard_{current_test_name()};
};
using MmputExitTest = MmTest;
using MmputTest = MmTest;
using AioTest = MmTest;
using MemoisedChargeTest = MmTest;
using RealMemoryTest = MmTest;
using OomTest = MmTest;
using TaskTest = MmTest;
using KnobTest = MmTest;
using DrainTest = MmTest;
using FreezeTest = MmTest;
using MmSystemStressTest = MmTest;

// Small numbers, so that the eligibility and budget boundaries are exact.
constexpr std::uint64_t thresh = 100;
constexpr std::uint64_t large = 1000;  // an RSS well above thresh

// The feature on with a small threshold. The stall watchdog is pushed out of reach: a test
// that freezes the reaper must see queued, never sync_stalled, however slow the machine.
mm_system_options async_on(std::uint64_t max_pending = 1'000'000) {
  mm_system_options opts;
  opts.async_mm_teardown = true;
  opts.thresh_pages = thresh;
  opts.max_pending_pages = max_pending;
  opts.reaper.stall_threshold = std::chrono::hours(1);
  return opts;
}

// A struct reference (mmgrab) held for the test's lifetime, so that the mm can be inspected
// after its teardown. Destroyed before the mm_system if declared after it.
class grabbed {
 public:
  explicit grabbed(mm_struct& mm) : mm_(&mm) { mm_system::mmgrab(mm); }
  explicit grabbed(mm_struct* mm) : grabbed(*mm) {}
  grabbed(const grabbed&) = delete;
  grabbed& operator=(const grabbed&) = delete;
  ~grabbed() { mm_system::mmdrop(*mm_); }
  mm_struct* operator->() const { return mm_; }
  mm_struct& operator*() const { return *mm_; }

 private:
  mm_struct* mm_;
};

std::uint32_t teardowns_of(const mm_struct& mm) { return mm.teardowns.load(); }

// Runs `fn` when the scope ends, even when an ASSERT returns early.
template <class Fn>
class scope_exit {
 public:
  explicit scope_exit(Fn fn) : fn_(std::move(fn)) {}
  scope_exit(const scope_exit&) = delete;
  scope_exit& operator=(const scope_exit&) = delete;
  ~scope_exit() { fn_(); }

 private:
  Fn fn_;
};

// Records every event of one kind while it lives (the hook is a process-global function
// pointer, so the record is global too). Strings are not kept: they are valid only during the
// event.
template <class Event>
class recorder {
 public:
  recorder() {
    {
      const std::lock_guard lock(mutex_);
      events_.clear();
    }
    trace::set_hook<Event>(&record);
  }
  recorder(const recorder&) = delete;
  recorder& operator=(const recorder&) = delete;
  ~recorder() { trace::clear_hook<Event>(); }

  std::vector<Event> events() const {
    const std::lock_guard lock(mutex_);
    return events_;
  }
  std::vector<Event> events_for(std::uint64_t id) const {
    std::vector<Event> found;
    for (const Event& e : events()) {
      if (e.id == id) found.push_back(e);
    }
    return found;
  }

 private:
  static void record(const Event& event) {
    Event copy = event;
    if constexpr (std::is_same_v<Event, trace::queue_event>) copy.thread_name = nullptr;
    if constexpr (std::is_same_v<Event, trace::sync_event>) copy.reason = nullptr;
    const std::lock_guard lock(mutex_);
    events_.push_back(copy);
  }

  static inline std::mutex mutex_;
  static inline std::vector<Event> events_;
};

// Waits (without asserting a time) until `done()`; the hang guard bounds it.
template <class Pred>
void wait_until(Pred done) {
  while (!done()) std::this_thread::yield();
}

// What mincore() says of [base, base + bytes): the residency of each page, or the errno with
// which it refused the range.
struct residency_result {
  int error = 0;                     // 0: the range is mapped
  std::vector<unsigned char> pages;  // bit 0: resident
};

residency_result residency(std::byte* base, std::size_t bytes) {
  residency_result result;
  result.pages.resize((bytes + mm_system::page_size() - 1) / mm_system::page_size());
  if (mincore(base, bytes, result.pages.data()) != 0) result.error = errno;
  return result;
}

std::size_t resident_pages(const std::vector<unsigned char>& vec, std::size_t from, std::size_t to) {
  return static_cast<std::size_t>(
      std::count_if(vec.begin() + static_cast<std::ptrdiff_t>(from), vec.begin() + static_cast<std::ptrdiff_t>(to),
                    [](unsigned char v) { return (v & 1u) != 0; }));
}

// --- mmput_exit: every decision path ----------------------------------------------------------

TEST_F(MmputExitTest, NotTheLastReferenceReturnsNulloptAndTearsNothingDown) {
  mm_system kernel(async_on());
  mm_struct* mm = kernel.mm_alloc(large);
  grabbed held(mm);
  mm_system::mmget(*mm);

  EXPECT_EQ(kernel.mmput_exit(*mm), std::nullopt);

  EXPECT_EQ(teardowns_of(*mm), 0u);
  EXPECT_EQ(mm->aio.exit_calls(), 0u) << "exit_aio is for the last user only";
  EXPECT_EQ(mm->mm_users.read(), 1);
  const auto v = kernel.vmstat();
  EXPECT_EQ(v.queued, 0u);
  EXPECT_EQ(v.sync, 0u);
  kernel.mmput(*mm);
  EXPECT_EQ(teardowns_of(*mm), 1u);
}

TEST_F(MmputExitTest, ToggleOffTearsDownInlineWithoutTheEagerExitAioOrReadingTheRss) {
  mm_system_options opts = async_on();
  opts.async_mm_teardown = false;
  mm_system kernel(opts);
  recorder<trace::sync_event> syncs;
  mm_struct* mm = kernel.mm_alloc(large);
  grabbed held(mm);

  EXPECT_EQ(kernel.mmput_exit(*mm), decision::inline_disabled);

  EXPECT_EQ(teardowns_of(*mm), 1u) << "torn down inline, before mmput_exit returned";
  EXPECT_EQ(mm->aio.exit_calls(), 1u) << "only the teardown's own exit_aio ran";
  const auto events = syncs.events_for(mm->id);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].cost, 0u) << "the RSS is not read while the toggle is off";
  const auto v = kernel.vmstat();
  EXPECT_EQ(v.sync, 1u);
  EXPECT_EQ(v.queued, 0u);
  EXPECT_EQ(v.rejected, 0u);
}

TEST_F(MmputExitTest, RssBelowTheThresholdIsIneligible) {
  mm_system kernel(async_on());
  mm_struct* mm = kernel.mm_alloc(thresh - 1);
  grabbed held(mm);

  EXPECT_EQ(kernel.mmput_exit(*mm), decision::inline_ineligible);

  EXPECT_EQ(teardowns_of(*mm), 1u);
  EXPECT_EQ(mm->aio.exit_calls(), 1u) << "no eager exit_aio for an ineligible mm";
  const auto v = kernel.vmstat();
  EXPECT_EQ(v.sync, 1u);
  EXPECT_EQ(v.queued, 0u);
  EXPECT_EQ(v.pending_pages, 0u);
}

TEST_F(MmputExitTest, RssEqualToTheThresholdIsQueued) {
  mm_system kernel(async_on());
  mm_struct* mm = kernel.mm_alloc(thresh);
  grabbed held(mm);

  EXPECT_EQ(kernel.mmput_exit(*mm), decision::queued);

  kernel.flush();
  EXPECT_EQ(teardowns_of(*mm), 1u);
  EXPECT_EQ(kernel.vmstat().queued, 1u);
}

// A large mm with `flag` set is torn down inline, unprepared, and never queued.
void expect_flag_makes_ineligible(unsigned flag) {
  mm_system kernel(async_on());
  mm_struct* mm = kernel.mm_alloc(large);
  grabbed held(mm);
  teardown::model::set_flag(*mm, flag);

  EXPECT_EQ(kernel.mmput_exit(*mm), decision::inline_ineligible);

  EXPECT_EQ(teardowns_of(*mm), 1u);
  EXPECT_EQ(mm->aio.exit_calls(), 1u);
  EXPECT_EQ(kernel.vmstat().queued, 0u);
}

TEST_F(MmputExitTest, OomSkipMmIsIneligible) { expect_flag_makes_ineligible(MMF_OOM_SKIP); }

TEST_F(MmputExitTest, OomTargetedMmIsIneligible) { expect_flag_makes_ineligible(MMF_OOM_TARGETED); }

TEST_F(MmputExitTest, MmLargerThanTheWholeBudgetIsRejected) {
  mm_system kernel(async_on(/*max_pending=*/large - 1));
  mm_struct* mm = kernel.mm_alloc(large);
  grabbed held(mm);

  EXPECT_EQ(kernel.mmput_exit(*mm), decision::inline_rejected);

  EXPECT_EQ(teardowns_of(*mm), 1u);
  EXPECT_EQ(mm->aio.exit_calls(), 2u) << "the eager exit_aio ran before the budget refused";
  const auto v = kernel.vmstat();
  EXPECT_EQ(v.rejected, 1u);
  EXPECT_EQ(v.sync, 1u) << "rejected is a subset of sync";
  EXPECT_EQ(v.queued, 0u);
  EXPECT_EQ(v.pending_pages, 0u) << "a refused charge leaves nothing pending";
}

TEST_F(MmputExitTest, MmThatDoesNotFitBesideThePendingChargesIsRejected) {
  mm_system kernel(async_on(/*max_pending=*/large + thresh - 1));
  mm_struct* first = kernel.mm_alloc(large);
  mm_struct* second = kernel.mm_alloc(thresh);
  grabbed held_first(first);
  grabbed held_second(second);
  kernel.freeze();

  EXPECT_EQ(kernel.mmput_exit(*first), decision::queued);
  EXPECT_EQ(kernel.mmput_exit(*second), decision::inline_rejected);

  EXPECT_EQ(teardowns_of(*second), 1u) << "the rejected mm is torn down inline";
  EXPECT_EQ(teardowns_of(*first), 0u) << "the reaper is frozen";
  auto v = kernel.vmstat();
  EXPECT_EQ(v.pending_pages, large);
  EXPECT_EQ(v.rejected, 1u);
  EXPECT_EQ(v.sync, 1u);
  EXPECT_LE(v.rejected, v.sync);
  kernel.thaw();
  kernel.flush();
  v = kernel.vmstat();
  EXPECT_EQ(teardowns_of(*first), 1u);
  EXPECT_EQ(v.pending_pages, 0u);
}

TEST_F(MmputExitTest, ExitAfterShutdownIsStopped) {
  mm_system kernel(async_on());
  mm_struct* mm = kernel.mm_alloc(large);
  grabbed held(mm);
  kernel.stop();

  EXPECT_EQ(kernel.mmput_exit(*mm), decision::inline_stopped);

  EXPECT_EQ(teardowns_of(*mm), 1u) << "torn down inline";
  EXPECT_EQ(mm->aio.exit_calls(), 1u) << "decided before the eager exit_aio";
  const auto v = kernel.vmstat();
  EXPECT_EQ(v.sync, 1u);
  EXPECT_EQ(v.queued, 0u);
  EXPECT_EQ(v.pending_pages, 0u);
}

TEST_F(MmputExitTest, ShutdownForTearsDownTheFrozenBacklogAndLaterExitsAreStopped) {
  mm_system kernel(async_on());
  mm_struct* queued = kernel.mm_alloc(large);
  mm_struct* later = kernel.mm_alloc(large);
  grabbed held_queued(queued);  // mm_count keeps the structs readable after their teardown
  grabbed held(later);
  kernel.freeze();
  EXPECT_EQ(kernel.mmput_exit(*queued), decision::queued);
  EXPECT_TRUE(kernel.stop_for(std::chrono::seconds(30)));  // a liveness bound
  EXPECT_EQ(teardowns_of(*queued), 1u);
  EXPECT_EQ(kernel.vmstat().pending_pages, 0u);
  EXPECT_EQ(kernel.mmput_exit(*later), decision::inline_stopped);
  EXPECT_EQ(teardowns_of(*later), 1u);
}

TEST_F(MmputExitTest, QueuedMmIsTornDownOnceByTheReaperAndItsChargeReleased) {
  mm_system kernel(async_on());
  mm_struct* mm = kernel.mm_alloc(large);
  grabbed held(mm);

  EXPECT_EQ(kernel.mmput_exit(*mm), decision::queued);
  kernel.flush();

  EXPECT_EQ(teardowns_of(*mm), 1u);
  EXPECT_EQ(mm->aio.exit_calls(), 2u) << "eagerly on the exiting thread, then again in the teardown";
  EXPECT_TRUE(test_flag(*mm, MMF_OOM_SKIP)) << "exit_mmap hides the mm from the OOM killer";
  EXPECT_EQ(get_mm_rss(*mm), 0u);
  const auto v = kernel.vmstat();
  EXPECT_EQ(v.queued, 1u);
  EXPECT_EQ(v.reaped, 1u);
  EXPECT_EQ(v.sync, 0u);
  EXPECT_EQ(v.pending_pages, 0u);
  const auto r = kernel.stats().reaper;
  EXPECT_EQ(r.reaped, 1u);
  EXPECT_EQ(r.inline_reaped, r.helped) << "the reaper's worker tore it down (or a helping flush), not a caller";
  EXPECT_EQ(kernel.teardowns(), 1u);
}

TEST_F(MmputExitTest, QueuedMmIsChargedItsRssUntilReaped) {
  mm_system kernel(async_on());
  mm_struct* mm = kernel.mm_alloc(large);
  grabbed held(mm);
  kernel.freeze();

  EXPECT_EQ(kernel.mmput_exit(*mm), decision::queued);

  EXPECT_EQ(kernel.vmstat().pending_pages, large);
  EXPECT_EQ(mm->reap_charge, large);
  kernel.thaw();
  kernel.flush();
  EXPECT_EQ(kernel.vmstat().pending_pages, 0u);
}

// --- mmput_exit: the concurrency gate (seed 004) -------------------------------------------------

mm_system_options gated(std::uint64_t min_concurrent_exits) {
  mm_system_options opts = async_on();
  opts.min_concurrent_exits = min_concurrent_exits;
  return opts;
}

TEST_F(MmputExitTest, LoneExitUnderTheGateTearsDownInlineWithoutTheEagerExitAioOrACharge) {
  mm_system kernel(gated(4));
  auto t = kernel.spawn(large);
  grabbed mm(t->mm());

  EXPECT_EQ(t->exit(), decision::inline_uncontended);

  EXPECT_EQ(teardowns_of(*mm), 1u) << "torn down before exit returned";
  EXPECT_EQ(mm->aio.exit_calls(), 1u) << "decided before the eager exit_aio: only the teardown's";
  EXPECT_EQ(mm->reap_charge, 0u) << "never charged";
  const auto v = kernel.vmstat();
  EXPECT_EQ(v.sync, 1u);
  EXPECT_EQ(v.uncontended, 1u);
  EXPECT_EQ(v.queued, 0u);
  EXPECT_EQ(v.pending_pages, 0u);
  EXPECT_EQ(kernel.pending_high_water(), 0u);
}

TEST_F(MmputExitTest, GateDoesNotOverrideTheThresholdOrTheOomFlags) {
  mm_system kernel(gated(4));
  mm_struct* small = kernel.mm_alloc(thresh - 1);
  mm_struct* victim = kernel.mm_alloc(large);
  teardown::model::set_flag(*victim, MMF_OOM_TARGETED);

  EXPECT_EQ(kernel.mmput_exit(*small), decision::inline_ineligible);
  EXPECT_EQ(kernel.mmput_exit(*victim), decision::inline_ineligible);
  EXPECT_EQ(kernel.vmstat().uncontended, 0u);
}

// A kill storm: 32 exits released together under a gate of 4. Each mm has an AIO request in
// flight, so every exit blocks in exit_aio right after deciding — the eager one if it is to be
// queued, its teardown's if it tears down inline — and the test completes the requests only
// once all 32 are blocked. So all 32 decide while none has left: the k-th to enter counts at
// least k exits in flight, and at most 3 (those entering first) can see fewer than 4. Whatever
// the schedule, at least 29 queue.
TEST_F(MmputExitTest, StormOfExitsUnderTheGateQueuesAllButAtMostTheFirstFew) {
  constexpr std::size_t exits = 32;
  constexpr std::uint64_t gate = 4;
  mm_system kernel(gated(gate));
  std::vector<std::unique_ptr<mm_system::task>> tasks;
  std::deque<grabbed> mms;
  for (std::size_t i = 0; i < exits; ++i) {
    tasks.push_back(kernel.spawn(large));
    mms.emplace_back(tasks.back()->mm());
    ASSERT_TRUE(mms.back()->aio.submit());
  }

  std::latch start(exits);
  std::vector<std::optional<decision>> decided(exits);
  std::vector<std::thread> exiters;
  for (std::size_t i = 0; i < exits; ++i) {
    exiters.emplace_back([&, i] {
      start.arrive_and_wait();
      decided[i] = tasks[i]->exit();
    });
  }
  wait_until([&] {
    return std::all_of(mms.begin(), mms.end(), [](const grabbed& mm) { return mm->aio.exit_calls() >= 1; });
  });
  for (grabbed& mm : mms) mm->aio.complete();
  for (std::thread& t : exiters) t.join();
  kernel.flush();

  std::size_t queued = 0, uncontended = 0;
  for (const std::optional<decision>& d : decided) {
    queued += d == decision::queued;
    uncontended += d == decision::inline_uncontended;
  }
  EXPECT_EQ(queued + uncontended, exits) << "every exit either queued or was alone enough";
  EXPECT_LE(uncontended, gate - 1);
  EXPECT_GE(queued, exits - (gate - 1));
  const auto v = kernel.vmstat();
  EXPECT_EQ(v.queued, queued);
  EXPECT_EQ(v.uncontended, uncontended);
  EXPECT_EQ(v.sync, uncontended);
  EXPECT_EQ(v.reaped, queued);
  EXPECT_EQ(v.pending_pages, 0u);
  for (const grabbed& mm : mms) EXPECT_EQ(teardowns_of(*mm), 1u);

  // The storm over, the count is back at zero: a lone exit is alone again.
  auto after = kernel.spawn(large);
  EXPECT_EQ(after->exit(), decision::inline_uncontended);
}

// --- mmput: always inline, never counted -------------------------------------------------------

TEST_F(MmputTest, LastMmputTearsDownInlineAndIsNotCountedEvenWhenEligible) {
  mm_system kernel(async_on());
  mm_struct* mm = kernel.mm_alloc(large * 10);
  grabbed held(mm);

  kernel.mmput(*mm);

  EXPECT_EQ(teardowns_of(*mm), 1u) << "inline, before mmput returned";
  EXPECT_EQ(mm->aio.exit_calls(), 1u);
  const auto v = kernel.vmstat();
  EXPECT_EQ(v.queued, 0u);
  EXPECT_EQ(v.sync, 0u);
  EXPECT_EQ(v.pending_pages, 0u);
  EXPECT_EQ(kernel.teardowns(), 1u);
}

TEST_F(MmputTest, MmputThatIsNotTheLastTearsNothingDown) {
  mm_system kernel(async_on());
  mm_struct* mm = kernel.mm_alloc(large);
  grabbed held(mm);
  mm_system::mmget(*mm);

  kernel.mmput(*mm);

  EXPECT_EQ(teardowns_of(*mm), 0u);
  kernel.mmput(*mm);
  EXPECT_EQ(teardowns_of(*mm), 1u);
}

TEST_F(MmputTest, MmgetNotZeroRefusesAnMmWhoseUsersAreGone) {
  mm_system kernel(async_on());
  mm_struct* mm = kernel.mm_alloc(large);
  grabbed held(mm);
  ASSERT_TRUE(mm_system::mmget_not_zero(*mm));
  kernel.mmput(*mm);
  kernel.mmput(*mm);

  EXPECT_FALSE(mm_system::mmget_not_zero(*mm));
  EXPECT_EQ(mm->mm_users.read(), 0);
}

TEST_F(MmputTest, LastMmdropFreesTheStructAfterTheTeardown) {
  // Observable only through the sanitizers (a leak or a use after free) and the counts: the
  // teardown drops the users' reference, and our mmdrop is then the last.
  mm_system kernel(async_on());
  mm_struct* mm = kernel.mm_alloc(large);
  mm_system::mmgrab(*mm);
  kernel.mmput(*mm);
  EXPECT_EQ(mm->mm_count.read(), 1) << "the teardown dropped the users' reference";
  mm_system::mmdrop(*mm);
}

// --- exit_aio: eager, idempotent, may block ----------------------------------------------------

TEST_F(AioTest, ExitAioIsIdempotent) {
  teardown::model::aio_context aio;
  ASSERT_TRUE(aio.submit());
  aio.complete();

  aio.exit_aio();
  aio.exit_aio();  // returns at once: nothing can be in flight any more

  EXPECT_EQ(aio.exit_calls(), 2u);
  EXPECT_EQ(aio.in_flight(), 0u);
}

TEST_F(AioTest, SubmitAfterExitAioIsRefusedAndStartsNothing) {
  teardown::model::aio_context aio;
  aio.exit_aio();

  EXPECT_FALSE(aio.submit());

  EXPECT_EQ(aio.in_flight(), 0u);
}

TEST_F(AioTest, InFlightAioBlocksOnlyTheExitingThreadNeverTheReaper) {
  mm_system kernel(async_on());
  auto earlier = kernel.spawn(large);
  auto exiting = kernel.spawn(large);
  grabbed earlier_mm(earlier->mm());
  grabbed exiting_mm(exiting->mm());
  ASSERT_TRUE(exiting_mm->aio.submit());
  kernel.freeze();
  ASSERT_EQ(earlier->exit(), decision::queued);

  std::atomic<bool> returned{false};
  std::optional<decision> decided;
  std::thread exiter([&] {
    decided = exiting->exit();
    returned.store(true);
  });
  bool completed = false;
  const scope_exit finish([&] {  // also on an early return: never leave the exiter blocked
    if (!completed) exiting_mm->aio.complete();
    exiter.join();
  });
  wait_until([&] { return exiting_mm->aio.exit_calls() >= 1; });  // inside the eager exit_aio
  kernel.thaw();

  kernel.flush();  // must complete while the exiter is blocked

  EXPECT_EQ(teardowns_of(*earlier_mm), 1u) << "the reaper tore the earlier mm down meanwhile";
  EXPECT_FALSE(returned.load()) << "exit_aio waits for the in-flight request";
  EXPECT_EQ(teardowns_of(*exiting_mm), 0u);
  EXPECT_EQ(kernel.vmstat().queued, 1u) << "nothing is charged or queued before exit_aio returns";
  EXPECT_EQ(kernel.vmstat().pending_pages, 0u);

  completed = true;
  exiting_mm->aio.complete();
  wait_until([&] { return returned.load(); });
  EXPECT_EQ(decided, decision::queued);
  kernel.flush();
  EXPECT_EQ(teardowns_of(*exiting_mm), 1u);
  EXPECT_EQ(exiting_mm->aio.exit_calls(), 2u);
  EXPECT_EQ(kernel.vmstat().pending_pages, 0u);
}

// --- the memoised charge -----------------------------------------------------------------------

TEST_F(MemoisedChargeTest, ReaperReleasesTheChargeNotTheRssThatShrankWhileQueued) {
  recorder<trace::reap_event> reaps;
  mm_system kernel(async_on());
  auto task = kernel.spawn(large);
  grabbed mm(task->mm());
  kernel.freeze();
  ASSERT_EQ(task->exit(), decision::queued);

  EXPECT_EQ(kernel.reclaim(*mm, 600), 600u);
  EXPECT_EQ(kernel.vmstat().pending_pages, large) << "reclaim does not touch the charge";
  kernel.thaw();
  kernel.flush();

  EXPECT_EQ(kernel.vmstat().pending_pages, 0u) << "exactly the memoised charge was released";
  const auto events = reaps.events_for(mm->id);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].charged_cost, large);
  EXPECT_EQ(events[0].live_cost, large - 600);
  EXPECT_GT(events[0].charged_cost, events[0].live_cost);
}

TEST_F(MemoisedChargeTest, ReclaimTakesAtMostTheRss) {
  mm_system kernel(async_on());
  mm_struct* mm = kernel.mm_alloc(large);
  grabbed held(mm);

  EXPECT_EQ(kernel.reclaim(*mm, large * 2), large);
  EXPECT_EQ(kernel.reclaim(*mm, 1), 0u);

  EXPECT_EQ(get_mm_rss(*mm), 0u);
  kernel.mmput(*mm);
}

// --- real backing memory -----------------------------------------------------------------------

TEST_F(RealMemoryTest, SpawnTouchesEveryPage) {
  mm_system kernel(async_on());
  auto task = kernel.spawn(64, backing::real);
  grabbed mm(task->mm());
  std::byte* base = nullptr;
  std::size_t bytes = 0;
  {
    const std::lock_guard lock(mm->mmap_lock);
    base = mm->base;
    bytes = mm->mapped_bytes;
  }
  ASSERT_NE(base, nullptr);
  ASSERT_EQ(bytes, 64 * mm_system::page_size());

  const residency_result resident = residency(base, bytes);

  ASSERT_EQ(resident.error, 0) << "mincore refused the range";
  EXPECT_EQ(resident_pages(resident.pages, 0, 64), 64u);
}

TEST_F(RealMemoryTest, TeardownUnmapsTheRange) {
  mm_system kernel(async_on());
  auto task = kernel.spawn(thresh * 2, backing::real);
  grabbed mm(task->mm());
  std::byte* base = nullptr;
  std::size_t bytes = 0;
  {
    const std::lock_guard lock(mm->mmap_lock);
    base = mm->base;
    bytes = mm->mapped_bytes;
  }
  ASSERT_NE(base, nullptr);
  ASSERT_EQ(task->exit(), decision::queued);

  kernel.flush();
  const residency_result resident = residency(base, bytes);  // at once: nothing else can have
                                                             // mapped the range yet

  EXPECT_EQ(resident.error, ENOMEM) << "mincore: the range should hold only unmapped pages";
  const std::lock_guard lock(mm->mmap_lock);
  EXPECT_EQ(mm->base, nullptr);
  EXPECT_EQ(mm->mapped_bytes, 0u);
}

TEST_F(RealMemoryTest, ReclaimDropsTheTailPages) {
  mm_system kernel(async_on());
  auto task = kernel.spawn(64, backing::real);
  grabbed mm(task->mm());
  std::byte* base = nullptr;
  std::size_t bytes = 0;
  {
    const std::lock_guard lock(mm->mmap_lock);
    base = mm->base;
    bytes = mm->mapped_bytes;
  }

  EXPECT_EQ(kernel.reclaim(*mm, 16), 16u);

  const residency_result resident = residency(base, bytes);
  ASSERT_EQ(resident.error, 0) << "mincore refused the range";
  EXPECT_EQ(resident_pages(resident.pages, 48, 64), 0u) << "the reclaimed tail";
  EXPECT_EQ(resident_pages(resident.pages, 0, 48), 48u) << "the rest";
  EXPECT_EQ(get_mm_rss(*mm), 48u);
}

TEST_F(RealMemoryTest, ReclaimRacingTheReapersTeardownIsSafe) {
  // The mmap lock orders the two: whichever comes second finds what the first left (the
  // sanitizers check the rest).
  mm_system kernel(async_on());
  auto task = kernel.spawn(thresh * 4, backing::real);
  grabbed mm(task->mm());
  std::atomic<bool> go{false};
  std::uint64_t reclaimed = 0;
  std::thread reclaimer([&] {
    wait_until([&] { return go.load(); });
    while (teardowns_of(*mm) == 0) reclaimed += kernel.reclaim(*mm, 1);
  });

  go.store(true);
  EXPECT_EQ(task->exit(), decision::queued);
  kernel.flush();
  reclaimer.join();

  EXPECT_EQ(teardowns_of(*mm), 1u);
  EXPECT_LE(reclaimed, thresh * 4);
  EXPECT_EQ(get_mm_rss(*mm), 0u);
  EXPECT_EQ(kernel.reclaim(*mm, 1), 0u) << "nothing is left to reclaim after the teardown";
  EXPECT_EQ(kernel.vmstat().pending_pages, 0u);
}

TEST_F(RealMemoryTest, MmAllocRefusesAnRssWhoseSizeInBytesOverflows) {
  // rss_pages * page_size wraps to one page: the mapping would be one page while the RSS says
  // 2^52 + 1 pages (4 KiB pages), and reclaim() would then madvise(MADV_DONTNEED) below the
  // mapping, zeroing whatever the process has there. Bad input must be refused instead.
  mm_system kernel;
  const std::uint64_t pages = std::numeric_limits<std::size_t>::max() / mm_system::page_size() + 2;
  mm_struct* mm = nullptr;

  EXPECT_THROW(mm = kernel.mm_alloc(pages, backing::real), std::invalid_argument);

  if (mm != nullptr) {  // never reclaim() it: that is the corruption
    ADD_FAILURE() << "mm_alloc(" << pages << ", real) mapped " << mm->mapped_bytes << " bytes for an RSS of "
                  << get_mm_rss(*mm) << " pages";
    kernel.mmput(*mm);
  }
}

// --- the OOM killer ----------------------------------------------------------------------------

TEST_F(OomTest, OomKillMarksTheMmAndKillsEverySharerAndNoOtherTask) {
  mm_system kernel(async_on());
  auto victim = kernel.spawn(large);
  auto sharer = kernel.clone_vm(*victim);
  auto sharer_of_sharer = kernel.clone_vm(*sharer);
  auto bystander = kernel.spawn(large);
  grabbed victim_mm(victim->mm());
  grabbed bystander_mm(bystander->mm());

  EXPECT_EQ(kernel.oom_kill(*victim), 3u);

  EXPECT_TRUE(test_flag(*victim_mm, MMF_OOM_TARGETED));
  EXPECT_TRUE(victim->killed());
  EXPECT_TRUE(sharer->killed());
  EXPECT_TRUE(sharer_of_sharer->killed());
  EXPECT_FALSE(bystander->killed());
  EXPECT_FALSE(test_flag(*bystander_mm, MMF_OOM_TARGETED));
  EXPECT_EQ(kernel.oom_kills(), 1u);
}

TEST_F(OomTest, KilledHoldersTearDownInlineWhicheverExitsLast) {
  // A killed sharer exits the moment it sees its kill, racing the victim's own exit: the mark
  // was made before any kill, so the final exit is ineligible whoever makes it.
  mm_system kernel(async_on());
  auto victim = kernel.spawn(large);
  auto sharer = kernel.clone_vm(*victim);
  grabbed mm(victim->mm());
  std::optional<decision> sharer_decision;
  std::thread sharer_thread([&] {
    wait_until([&] { return sharer->killed(); });
    sharer_decision = sharer->exit();
  });

  const std::size_t killed = kernel.oom_kill(*victim);
  const std::optional<decision> victim_decision = victim->exit();
  sharer_thread.join();

  EXPECT_EQ(killed, 2u);
  EXPECT_NE(victim_decision.has_value(), sharer_decision.has_value()) << "exactly one exit was the last";
  EXPECT_EQ(victim_decision.value_or(sharer_decision.value_or(decision::queued)), decision::inline_ineligible);
  EXPECT_EQ(teardowns_of(*mm), 1u);
  EXPECT_EQ(kernel.vmstat().queued, 0u);
}

TEST_F(OomTest, ExitsOfKilledTasksNeverQueue) {
  recorder<trace::queue_event> queued;
  mm_system kernel(async_on());
  // Positive control: a plain exit of the same size is queued and traced.
  auto control = kernel.spawn(large);
  const std::uint64_t control_id = control->mm()->id;
  ASSERT_EQ(control->exit(), decision::queued);
  ASSERT_EQ(queued.events_for(control_id).size(), 1u);
  auto victim = kernel.spawn(large);
  auto sharer = kernel.clone_vm(*victim);
  auto other_sharer = kernel.clone_vm(*victim);
  grabbed mm(victim->mm());
  ASSERT_EQ(kernel.oom_kill(*victim), 3u);

  EXPECT_EQ(sharer->exit(), std::nullopt);
  EXPECT_EQ(victim->exit(), std::nullopt);
  EXPECT_EQ(other_sharer->exit(), decision::inline_ineligible);

  EXPECT_TRUE(queued.events_for(mm->id).empty()) << "an OOM victim's mm was queued";
  EXPECT_EQ(teardowns_of(*mm), 1u);
  kernel.flush();
  const auto v = kernel.vmstat();
  EXPECT_EQ(v.queued, 1u) << "the control only";
  EXPECT_EQ(v.sync, 1u);
}

TEST_F(OomTest, MarkOomVictimSetsTheFlagOnly) {
  mm_system kernel(async_on());
  auto victim = kernel.spawn(large);
  auto sharer = kernel.clone_vm(*victim);
  grabbed mm(victim->mm());

  EXPECT_TRUE(kernel.mark_oom_victim(*victim));

  EXPECT_TRUE(test_flag(*mm, MMF_OOM_TARGETED));
  EXPECT_FALSE(victim->killed());
  EXPECT_FALSE(sharer->killed());
  EXPECT_EQ(kernel.oom_kills(), 0u);
  EXPECT_EQ(sharer->exit(), std::nullopt);
  EXPECT_EQ(victim->exit(), decision::inline_ineligible);
}

TEST_F(OomTest, OomKillOfAnExitedTaskKillsNothing) {
  mm_system kernel(async_on());
  auto victim = kernel.spawn(large);
  auto sharer = kernel.clone_vm(*victim);
  grabbed mm(victim->mm());
  ASSERT_EQ(victim->exit(), std::nullopt);

  EXPECT_EQ(kernel.oom_kill(*victim), 0u);

  EXPECT_FALSE(test_flag(*mm, MMF_OOM_TARGETED));
  EXPECT_FALSE(sharer->killed());
  EXPECT_FALSE(victim->killed());
  EXPECT_EQ(kernel.oom_kills(), 0u);
  EXPECT_EQ(sharer->exit(), decision::queued) << "the mm is still eligible";
  kernel.flush();
}

TEST_F(OomTest, MarkOomVictimOfAnExitedTaskMarksNothing) {
  mm_system kernel(async_on());
  auto victim = kernel.spawn(large);
  auto sharer = kernel.clone_vm(*victim);
  grabbed mm(victim->mm());
  ASSERT_EQ(victim->exit(), std::nullopt);

  EXPECT_FALSE(kernel.mark_oom_victim(*victim));

  EXPECT_FALSE(test_flag(*mm, MMF_OOM_TARGETED));
}

TEST_F(OomTest, TargetedFlagIsSticky) {
  mm_system kernel(async_on());
  auto victim = kernel.spawn(large);
  grabbed mm(victim->mm());
  ASSERT_TRUE(kernel.mark_oom_victim(*victim));

  auto later_sharer = kernel.clone_vm(*victim);  // a sharer cloned after the mark
  EXPECT_EQ(kernel.oom_kill(*later_sharer), 2u);
  EXPECT_TRUE(test_flag(*mm, MMF_OOM_TARGETED));
  EXPECT_EQ(victim->exit(), std::nullopt);
  EXPECT_TRUE(test_flag(*mm, MMF_OOM_TARGETED));
  EXPECT_EQ(later_sharer->exit(), decision::inline_ineligible);

  EXPECT_TRUE(test_flag(*mm, MMF_OOM_TARGETED)) << "still set after the teardown";
}

TEST_F(OomTest, CloneVmOfAnExitedTaskThrowsAndCreatesNothing) {
  mm_system kernel(async_on());
  auto task = kernel.spawn(large);
  auto sharer = kernel.clone_vm(*task);
  grabbed mm(task->mm());
  ASSERT_EQ(task->exit(), std::nullopt);

  EXPECT_THROW((void)kernel.clone_vm(*task), std::logic_error);

  EXPECT_EQ(mm->mm_users.read(), 1) << "no reference was taken";
  EXPECT_EQ(sharer->exit(), decision::queued);
  kernel.flush();
}

// --- tasks ---------------------------------------------------------------------------------------

TEST_F(TaskTest, ExitIsIdempotent) {
  mm_system kernel(async_on());
  auto task = kernel.spawn(large);
  grabbed mm(task->mm());

  EXPECT_EQ(task->exit(), decision::queued);
  EXPECT_EQ(task->exit(), std::nullopt);

  EXPECT_EQ(task->mm(), nullptr);
  kernel.flush();
  EXPECT_EQ(teardowns_of(*mm), 1u);
  const auto v = kernel.vmstat();
  EXPECT_EQ(v.queued + v.sync, 1u);
}

TEST_F(TaskTest, DestructorExits) {
  mm_system kernel(async_on());
  auto task = kernel.spawn(large);
  grabbed mm(task->mm());

  task.reset();

  kernel.flush();
  EXPECT_EQ(teardowns_of(*mm), 1u);
  EXPECT_EQ(kernel.vmstat().queued, 1u) << "through the exit path, mmput_exit";
}

TEST_F(TaskTest, DestructorAfterExitDoesNothingMore) {
  mm_system kernel(async_on());
  auto task = kernel.spawn(large);
  grabbed mm(task->mm());
  ASSERT_EQ(task->exit(), decision::queued);

  task.reset();

  kernel.flush();
  EXPECT_EQ(teardowns_of(*mm), 1u);
  const auto v = kernel.vmstat();
  EXPECT_EQ(v.queued + v.sync, 1u);
}

TEST_F(TaskTest, LastOfTheSharersToExitDecides) {
  mm_system kernel(async_on());
  auto task = kernel.spawn(large);
  auto sharer = kernel.clone_vm(*task);
  grabbed mm(task->mm());
  EXPECT_EQ(sharer->mm(), task->mm());

  EXPECT_EQ(task->exit(), std::nullopt);
  EXPECT_EQ(teardowns_of(*mm), 0u);
  EXPECT_EQ(sharer->exit(), decision::queued);

  kernel.flush();
  EXPECT_EQ(teardowns_of(*mm), 1u);
}

// --- knobs -------------------------------------------------------------------------------------

constexpr std::uint64_t max_cap = teardown::budget::max_cap;

// Sets every knob away from its default, so that an unchanged value is not a default.
void set_known_values(mm_system& kernel) {
  kernel.set_async_mm_teardown(true);
  kernel.set_thresh_pages(123);
  kernel.set_max_pending_pages(4567);
  kernel.set_min_concurrent_exits(7);
}

void expect_known_values(const mm_system& kernel) {
  EXPECT_TRUE(kernel.async_mm_teardown());
  EXPECT_EQ(kernel.thresh_pages(), 123u);
  EXPECT_EQ(kernel.max_pending(), 4567u);
  EXPECT_EQ(kernel.min_concurrent_exits(), 7u);
}

TEST_F(KnobTest, DefaultsAreOffSixtyFourMibAndAQuarterOfPhysicalMemory) {
  mm_system kernel;

  EXPECT_FALSE(kernel.async_mm_teardown());
  EXPECT_EQ(kernel.get(mm_system::knob_enabled), "0");
  EXPECT_EQ(kernel.thresh_pages(), mm_system::default_thresh_pages());
  EXPECT_EQ(mm_system::default_thresh_pages(), (std::uint64_t{64} << 20) / mm_system::page_size());
  const long physical = sysconf(_SC_PHYS_PAGES);
  ASSERT_GT(physical, 0);
  EXPECT_EQ(kernel.max_pending(), static_cast<std::uint64_t>(physical) / 4);
  EXPECT_EQ(kernel.max_pending(), mm_system::default_max_pending_pages());
}

TEST_F(KnobTest, SetThreshPagesAboveMaxCapThrowsNamingTheKnobAndChangesNothing) {
  mm_system kernel;
  set_known_values(kernel);

  try {
    kernel.set_thresh_pages(max_cap + 1);
    FAIL() << "accepted max_cap + 1";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(mm_system::knob_thresh), std::string::npos) << e.what();
  }

  expect_known_values(kernel);
}

TEST_F(KnobTest, SetMaxPendingPagesAboveMaxCapThrowsNamingTheKnobAndChangesNothing) {
  mm_system kernel;
  set_known_values(kernel);

  try {
    kernel.set_max_pending_pages(max_cap + 1);
    FAIL() << "accepted max_cap + 1";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(mm_system::knob_max_pending), std::string::npos) << e.what();
  }

  expect_known_values(kernel);
}

TEST_F(KnobTest, TypedSettersAcceptMaxCapAndZero) {
  mm_system kernel;

  kernel.set_thresh_pages(max_cap);
  kernel.set_max_pending_pages(max_cap);
  EXPECT_EQ(kernel.thresh_pages(), max_cap);
  EXPECT_EQ(kernel.max_pending(), max_cap);
  kernel.set_thresh_pages(0);
  kernel.set_max_pending_pages(0);
  EXPECT_EQ(kernel.thresh_pages(), 0u);
  EXPECT_EQ(kernel.max_pending(), 0u);
}

TEST_F(KnobTest, TextInterfaceSetsTheToggle) {
  mm_system kernel;

  kernel.set("vm.async_mm_teardown", "1");
  EXPECT_TRUE(kernel.async_mm_teardown());
  kernel.set("vm.async_mm_teardown", "0");
  EXPECT_FALSE(kernel.async_mm_teardown());
  kernel.set("vm.async_mm_teardown", "1\n");  // as `echo 1 >` writes it
  EXPECT_TRUE(kernel.async_mm_teardown());
}

TEST_F(KnobTest, TextInterfaceSetsThePageKnobs) {
  mm_system kernel;

  kernel.set("vm.async_mm_teardown_thresh_pages", "2");
  kernel.set("vm.async_mm_teardown_max_pending_pages", std::to_string(max_cap) + "\n");

  EXPECT_EQ(kernel.thresh_pages(), 2u);
  EXPECT_EQ(kernel.max_pending(), max_cap);
}

TEST_F(KnobTest, TheToggleWrittenAsTextTakesEffect) {
  mm_system kernel(async_on());
  kernel.set("vm.async_mm_teardown", "0\n");
  mm_struct* off = kernel.mm_alloc(large);
  EXPECT_EQ(kernel.mmput_exit(*off), decision::inline_disabled);
  kernel.set("vm.async_mm_teardown", "1");
  mm_struct* on = kernel.mm_alloc(large);
  EXPECT_EQ(kernel.mmput_exit(*on), decision::queued);
  kernel.flush();
}

TEST_F(KnobTest, GetReturnsTheDecimalValueWithoutNewline) {
  mm_system kernel;
  set_known_values(kernel);

  EXPECT_EQ(kernel.get(mm_system::knob_enabled), "1");
  EXPECT_EQ(kernel.get(mm_system::knob_thresh), "123");
  EXPECT_EQ(kernel.get(mm_system::knob_max_pending), "4567");
  kernel.set_max_pending_pages(max_cap);
  EXPECT_EQ(kernel.get(mm_system::knob_max_pending), std::to_string(max_cap));
}

TEST_F(KnobTest, KnobNamesAreTheSeriesSysctls) {
  EXPECT_EQ(mm_system::knob_enabled, "vm.async_mm_teardown");
  EXPECT_EQ(mm_system::knob_thresh, "vm.async_mm_teardown_thresh_pages");
  EXPECT_EQ(mm_system::knob_max_pending, "vm.async_mm_teardown_max_pending_pages");
}

TEST_F(KnobTest, UnknownKnobIsRefusedNamingItAndChangesNothing) {
  mm_system kernel;
  set_known_values(kernel);

  for (const std::string knob : {"vm.async_mm_teardown_bogus", "VM.ASYNC_MM_TEARDOWN", "vm.async_mm_teardown ", "",
                                 "async_mm_teardown"}) {
    SCOPED_TRACE("knob \"" + knob + "\"");
    try {
      kernel.set(knob, "1");
      ADD_FAILURE() << "set accepted it";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("\"" + knob + "\""), std::string::npos) << e.what();
    }
    EXPECT_THROW((void)kernel.get(knob), std::invalid_argument);
    expect_known_values(kernel);
  }
}

TEST_F(KnobTest, ConstructorRefusesAThresholdAboveMaxCap) {
  mm_system_options opts;
  opts.thresh_pages = max_cap + 1;

  try {
    mm_system kernel(opts);
    FAIL() << "constructed with thresh_pages = max_cap + 1";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(mm_system::knob_thresh), std::string::npos) << e.what();
  }
}

TEST_F(KnobTest, ConstructorRefusesMaxPendingAboveMaxCap) {
  mm_system_options opts;
  opts.max_pending_pages = max_cap + 1;

  try {
    mm_system kernel(opts);
    FAIL() << "constructed with max_pending_pages = max_cap + 1";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(mm_system::knob_max_pending), std::string::npos) << e.what();
  }
}

TEST_F(KnobTest, LoweredThresholdMakesSmallerMmsEligible) {
  mm_system kernel(async_on());
  kernel.set_thresh_pages(10);
  mm_struct* mm = kernel.mm_alloc(10);

  EXPECT_EQ(kernel.mmput_exit(*mm), decision::queued);
  kernel.flush();
}

TEST_F(KnobTest, LoweredMaxPendingRejectsWhatNoLongerFits) {
  mm_system kernel(async_on());
  kernel.set_max_pending_pages(large - 1);
  mm_struct* mm = kernel.mm_alloc(large);

  EXPECT_EQ(kernel.mmput_exit(*mm), decision::inline_rejected);
}

TEST_F(KnobTest, MinConcurrentExitsDefaultsToOneTheGateOff) {
  mm_system kernel(async_on());

  EXPECT_EQ(kernel.min_concurrent_exits(), 1u);
  EXPECT_EQ(kernel.get(mm_system::knob_min_concurrent), "1");
  EXPECT_EQ(mm_system::knob_min_concurrent, "vm.async_mm_teardown_min_concurrent_exits");
  mm_struct* mm = kernel.mm_alloc(large);
  EXPECT_EQ(kernel.mmput_exit(*mm), decision::queued) << "a lone exit queues, as in the series";
  kernel.flush();
  EXPECT_EQ(kernel.vmstat().uncontended, 0u);
}

TEST_F(KnobTest, SetMinConcurrentExitsRefusesZeroAndAboveTheMaxNamingTheKnobAndChangesNothing) {
  mm_system kernel;
  set_known_values(kernel);

  for (const std::uint64_t bad : {std::uint64_t{0}, mm_system::max_min_concurrent_exits + 1,
                                  (std::uint64_t{1} << 32) | 4, std::numeric_limits<std::uint64_t>::max()}) {
    SCOPED_TRACE("min_concurrent_exits " + std::to_string(bad));
    try {
      kernel.set_min_concurrent_exits(bad);
      ADD_FAILURE() << "accepted it";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(mm_system::knob_min_concurrent), std::string::npos) << e.what();
    }
    expect_known_values(kernel);
  }
}

TEST_F(KnobTest, MinConcurrentExitsAcceptsOneToTheMaxTypedAndAsText) {
  mm_system kernel;

  kernel.set_min_concurrent_exits(mm_system::max_min_concurrent_exits);
  EXPECT_EQ(kernel.min_concurrent_exits(), mm_system::max_min_concurrent_exits);
  kernel.set(mm_system::knob_min_concurrent, "4\n");
  EXPECT_EQ(kernel.min_concurrent_exits(), 4u);
  EXPECT_EQ(kernel.get(mm_system::knob_min_concurrent), "4");
  kernel.set(mm_system::knob_min_concurrent, "1");
  EXPECT_EQ(kernel.min_concurrent_exits(), 1u);
}

TEST_F(KnobTest, MinConcurrentExitsWrittenAsTextTakesEffect) {
  mm_system kernel(async_on());
  kernel.set(mm_system::knob_min_concurrent, "2");
  mm_struct* alone = kernel.mm_alloc(large);
  EXPECT_EQ(kernel.mmput_exit(*alone), decision::inline_uncontended);
  kernel.set(mm_system::knob_min_concurrent, "1");
  mm_struct* ungated = kernel.mm_alloc(large);
  EXPECT_EQ(kernel.mmput_exit(*ungated), decision::queued);
  kernel.flush();
}

TEST_F(KnobTest, ConstructorRefusesMinConcurrentExitsZero) {
  mm_system_options opts;
  opts.min_concurrent_exits = 0;

  try {
    mm_system kernel(opts);
    FAIL() << "constructed with min_concurrent_exits = 0";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(mm_system::knob_min_concurrent), std::string::npos) << e.what();
  }
}

// Every malformed text, for every knob: refused, naming the knob, changing none of them.
struct bad_text {
  std::string_view knob;
  std::string value;
  std::string label;  // the test name's suffix
};

void PrintTo(const bad_text& bad, std::ostream* os) { *os << bad.knob << " = \"" << bad.value << '"'; }

std::vector<bad_text> bad_texts() {
  const std::vector<std::pair<std::string, std::string>> malformed = {
      {"-1", "minus_one"},
      {"", "empty"},
      {" 1", "leading_space"},
      {"1 ", "trailing_space"},
      {"0x10", "hex"},
      {"1.0", "decimal_point"},
      {"abc", "letters"},
      {"18446744073709551616", "two_to_the_64"},
      {"99999999999999999999999", "far_out_of_range"},
      {"\n", "newline_only"},
      {"1\n\n", "two_newlines"},
      {"\n1", "leading_newline"},
      {"+1", "plus_sign"},
      {std::string("1\0", 2), "embedded_nul"},
  };
  const std::vector<std::pair<std::string_view, std::string>> knobs = {
      {mm_system::knob_enabled, "toggle"},
      {mm_system::knob_thresh, "thresh"},
      {mm_system::knob_max_pending, "max_pending"},
      {mm_system::knob_min_concurrent, "min_concurrent"},
  };
  std::vector<bad_text> out;
  for (const auto& [knob, knob_label] : knobs) {
    for (const auto& [value, label] : malformed) out.push_back({knob, value, knob_label + "_" + label});
  }
  out.push_back({mm_system::knob_enabled, "2", "toggle_two"});
  out.push_back({mm_system::knob_enabled, "10", "toggle_ten"});
  out.push_back({mm_system::knob_thresh, std::to_string(max_cap + 1), "thresh_above_max_cap"});
  out.push_back({mm_system::knob_max_pending, std::to_string(max_cap + 1) + "\n", "max_pending_above_max_cap"});
  out.push_back({mm_system::knob_min_concurrent, "0", "min_concurrent_zero"});
  out.push_back({mm_system::knob_min_concurrent, "0\n", "min_concurrent_zero_newline"});
  out.push_back({mm_system::knob_min_concurrent, std::to_string(mm_system::max_min_concurrent_exits + 1),
                 "min_concurrent_above_max"});
  out.push_back({mm_system::knob_min_concurrent, "4294967297", "min_concurrent_two_to_the_32_plus_one"});
  return out;
}

class KnobTextRejectionTest : public ::testing::TestWithParam<bad_text> {
 private:
  hang_guard guard_{current_test_name()};
};

TEST_P(KnobTextRejectionTest, IsRefusedNamingTheKnobAndChangesNoKnob) {
  const bad_text& bad = GetParam();
  mm_system kernel;
  set_known_values(kernel);

  try {
    kernel.set(bad.knob, bad.value);
    FAIL() << "accepted \"" << bad.value << "\"";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(bad.knob), std::string::npos) << e.what();
  }

  expect_known_values(kernel);
}

INSTANTIATE_TEST_SUITE_P(MalformedValues, KnobTextRejectionTest, ::testing::ValuesIn(bad_texts()),
                         [](const ::testing::TestParamInfo<bad_text>& info) { return info.param.label; });

// --- drain ---------------------------------------------------------------------------------------

TEST_F(DrainTest, DrainTakesOldestFirstWhatFitsAndTheReaperTheRest) {
  mm_system kernel(async_on());
  kernel.freeze();
  std::vector<mm_struct*> mms = {kernel.mm_alloc(100), kernel.mm_alloc(200), kernel.mm_alloc(300)};
  std::vector<std::unique_ptr<grabbed>> held;
  for (mm_struct* mm : mms) {
    held.push_back(std::make_unique<grabbed>(mm));
    ASSERT_EQ(kernel.mmput_exit(*mm), decision::queued);
  }

  const teardown::drain_result drained = kernel.drain(300);

  EXPECT_EQ(drained.items, 2u);
  EXPECT_EQ(drained.cost, 300u);
  EXPECT_EQ(teardowns_of(*mms[0]), 1u) << "the oldest";
  EXPECT_EQ(teardowns_of(*mms[1]), 1u);
  EXPECT_EQ(teardowns_of(*mms[2]), 0u) << "the newest did not fit beside the older two";
  auto v = kernel.vmstat();
  EXPECT_EQ(v.drained, 2u);
  EXPECT_EQ(v.reaped, 2u);
  EXPECT_EQ(v.pending_pages, 300u);
  kernel.thaw();
  kernel.flush();
  v = kernel.vmstat();
  for (mm_struct* mm : mms) EXPECT_EQ(teardowns_of(*mm), 1u);
  EXPECT_EQ(v.drained, 2u);
  EXPECT_EQ(v.reaped, 3u);
  EXPECT_EQ(v.pending_pages, 0u);
}

TEST_F(DrainTest, DrainPassesOverAnMmThatDoesNotFitAndTakesALaterOne) {
  mm_system kernel(async_on());
  kernel.freeze();
  std::vector<mm_struct*> mms = {kernel.mm_alloc(100), kernel.mm_alloc(300), kernel.mm_alloc(200)};
  std::vector<std::unique_ptr<grabbed>> held;
  for (mm_struct* mm : mms) {
    held.push_back(std::make_unique<grabbed>(mm));
    ASSERT_EQ(kernel.mmput_exit(*mm), decision::queued);
  }

  const teardown::drain_result drained = kernel.drain(300);

  EXPECT_EQ(drained.items, 2u);
  EXPECT_EQ(drained.cost, 300u);
  EXPECT_EQ(teardowns_of(*mms[0]), 1u);
  EXPECT_EQ(teardowns_of(*mms[1]), 0u);
  EXPECT_EQ(teardowns_of(*mms[2]), 1u);
  kernel.thaw();
  kernel.flush();
  for (mm_struct* mm : mms) EXPECT_EQ(teardowns_of(*mm), 1u);
  EXPECT_EQ(kernel.vmstat().pending_pages, 0u);
}

TEST_F(DrainTest, DrainWithNothingQueuedTearsNothingDown) {
  mm_system kernel(async_on());

  const teardown::drain_result drained = kernel.drain(max_cap);

  EXPECT_EQ(drained.items, 0u);
  EXPECT_EQ(drained.cost, 0u);
  EXPECT_EQ(kernel.vmstat().drained, 0u);
}

// --- freeze and thaw with a backlog --------------------------------------------------------------

TEST_F(FreezeTest, FrozenReaperLeavesTheBacklogQueuedAndThawDrainsIt) {
  mm_system kernel(async_on());
  kernel.freeze();
  std::vector<std::unique_ptr<mm_system::task>> tasks;
  std::vector<std::unique_ptr<grabbed>> held;
  for (int i = 0; i < 5; ++i) {
    tasks.push_back(kernel.spawn(large));
    held.push_back(std::make_unique<grabbed>(tasks.back()->mm()));
  }
  for (auto& task : tasks) ASSERT_EQ(task->exit(), decision::queued);

  auto v = kernel.vmstat();
  EXPECT_EQ(v.queued, 5u);
  EXPECT_EQ(v.reaped, 0u);
  EXPECT_EQ(v.pending_pages, 5 * large);
  for (const auto& mm : held) EXPECT_EQ(teardowns_of(**mm), 0u);

  kernel.thaw();
  kernel.flush();
  v = kernel.vmstat();
  EXPECT_EQ(v.reaped, 5u);
  EXPECT_EQ(v.pending_pages, 0u);
  for (const auto& mm : held) EXPECT_EQ(teardowns_of(**mm), 1u);
}

TEST_F(FreezeTest, TogglingOffMidBacklogMakesNewExitsSyncWhileTheBacklogDrains) {
  mm_system kernel(async_on());
  kernel.freeze();
  std::vector<std::unique_ptr<grabbed>> backlog;
  for (int i = 0; i < 3; ++i) {
    mm_struct* mm = kernel.mm_alloc(large);
    backlog.push_back(std::make_unique<grabbed>(mm));
    ASSERT_EQ(kernel.mmput_exit(*mm), decision::queued);
  }

  kernel.set_async_mm_teardown(false);
  mm_struct* late = kernel.mm_alloc(large);
  grabbed late_held(late);
  EXPECT_EQ(kernel.mmput_exit(*late), decision::inline_disabled);
  EXPECT_EQ(teardowns_of(*late), 1u);
  kernel.thaw();
  kernel.flush();

  for (const auto& mm : backlog) EXPECT_EQ(teardowns_of(**mm), 1u);
  const auto v = kernel.vmstat();
  EXPECT_EQ(v.queued, 3u);
  EXPECT_EQ(v.reaped, 3u);
  EXPECT_EQ(v.sync, 1u);
  EXPECT_EQ(v.pending_pages, 0u);
}

TEST_F(FreezeTest, DestroyingTheSystemTearsDownAFrozenBacklog) {
  std::vector<std::unique_ptr<grabbed>> held;  // outlives the system
  {
    mm_system kernel(async_on());
    kernel.freeze();
    for (int i = 0; i < 3; ++i) {
      mm_struct* mm = kernel.mm_alloc(large);
      held.push_back(std::make_unique<grabbed>(mm));
      ASSERT_EQ(kernel.mmput_exit(*mm), decision::queued);
    }
  }
  for (const auto& mm : held) EXPECT_EQ(teardowns_of(**mm), 1u);
}

// --- stress ------------------------------------------------------------------------------------

// Spawners create processes (some with CLONE_VM sharers) and exit random live tasks (so a
// sharer often exits on another thread than its process's spawner) while one thread flips the
// toggle and another OOM-kills or marks random live tasks. Every mm must be torn down exactly
// once, every final exit counted once, the budget settled, and no mm targeted by a successful
// kill or mark ever queued.
TEST_F(MmSystemStressTest, SpawnsExitsTogglesAndOomKillsTearEveryMmDownExactlyOnce) {
  constexpr int spawners = 4;
  const std::size_t processes_per_spawner = scaled(8000);
  recorder<trace::queue_event> queue_events;
  mm_system kernel(async_on(/*max_pending=*/20'000));

  struct process {
    mm_struct* mm = nullptr;  // grabbed until the end
    std::atomic<bool> targeted{false};
  };
  std::mutex registry_mutex;
  std::deque<process> registry;  // stable addresses; guarded by registry_mutex
  struct live_task {
    std::shared_ptr<mm_system::task> task;
    process* owner = nullptr;
  };
  std::mutex pool_mutex;
  std::vector<live_task> pool;  // guarded by pool_mutex
  std::atomic<std::uint64_t> final_exits{0};
  std::atomic<std::uint64_t> successful_kills{0};
  std::atomic<std::uint64_t> flips{0};
  std::atomic<bool> done{false};
  // Spawners go on past their count until the run has shown every path it claims to race: a
  // count, not a time (the hang guard bounds it).
  const auto exercised = [&] {
    const auto v = kernel.vmstat();
    return v.queued > 0 && v.sync > 0 && successful_kills.load(std::memory_order_relaxed) > 0 &&
           flips.load(std::memory_order_relaxed) >= 2;
  };

  const auto exit_task = [&](live_task& t) {
    if (t.task->exit().has_value()) final_exits.fetch_add(1, std::memory_order_relaxed);
  };
  const auto take_random = [&](std::mt19937_64& rng) -> std::optional<live_task> {
    const std::lock_guard lock(pool_mutex);
    if (pool.empty()) return std::nullopt;
    const std::size_t at = rng() % pool.size();
    std::swap(pool[at], pool.back());
    live_task t = std::move(pool.back());
    pool.pop_back();
    return t;
  };

  std::vector<std::thread> threads;
  for (int s = 0; s < spawners; ++s) {
    threads.emplace_back([&, s] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(s) + 1);
      for (std::size_t i = 0; i < processes_per_spawner || !exercised(); ++i) {
        std::shared_ptr<mm_system::task> leader = kernel.spawn(1 + rng() % 2000);
        process* owner = nullptr;
        {
          const std::lock_guard lock(registry_mutex);
          owner = &registry.emplace_back();
          owner->mm = leader->mm();
          mm_system::mmgrab(*owner->mm);
        }
        std::vector<live_task> fresh{{leader, owner}};
        for (std::uint64_t c = rng() % 3; c > 0; --c) fresh.push_back({kernel.clone_vm(*leader), owner});
        const std::size_t born = fresh.size();
        {
          const std::lock_guard lock(pool_mutex);
          for (live_task& t : fresh) pool.push_back(std::move(t));
        }
        for (std::size_t e = 0; e < born; ++e) {
          if (std::optional<live_task> t = take_random(rng)) exit_task(*t);
        }
      }
    });
  }
  threads.emplace_back([&] {  // the toggle
    bool on = false;
    while (!done.load(std::memory_order_relaxed)) {
      kernel.set_async_mm_teardown(on);
      on = !on;
      flips.fetch_add(1, std::memory_order_relaxed);
      std::this_thread::yield();
    }
    kernel.set_async_mm_teardown(true);
  });
  threads.emplace_back([&] {  // the OOM killer
    std::mt19937_64 rng(99);
    while (!done.load(std::memory_order_relaxed)) {
      live_task t;
      {
        const std::lock_guard lock(pool_mutex);
        if (!pool.empty()) t = pool[rng() % pool.size()];  // a copy: the task stays valid while we use it
      }
      if (!t.task) {
        std::this_thread::yield();
        continue;
      }
      // Recorded after the call: a successful kill or mark happened while a holder still held
      // the mm, so its final exit comes later, and must not queue.
      if (rng() % 4 == 0) {
        if (kernel.mark_oom_victim(*t.task)) t.owner->targeted.store(true);
      } else if (kernel.oom_kill(*t.task) > 0) {
        t.owner->targeted.store(true);
        successful_kills.fetch_add(1, std::memory_order_relaxed);
      }
      std::this_thread::yield();
    }
  });
  for (int s = 0; s < spawners; ++s) threads[static_cast<std::size_t>(s)].join();
  done.store(true);
  for (std::size_t t = spawners; t < threads.size(); ++t) threads[t].join();
  for (live_task& t : pool) exit_task(t);
  pool.clear();
  kernel.flush();

  const auto v = kernel.vmstat();
  std::map<std::uint64_t, const process*> by_id;
  std::size_t torn_down_once = 0;
  for (const process& p : registry) {
    by_id[p.mm->id] = &p;
    if (teardowns_of(*p.mm) == 1) ++torn_down_once;
  }
  EXPECT_EQ(torn_down_once, registry.size()) << "every mm torn down exactly once";
  EXPECT_EQ(kernel.teardowns(), registry.size());
  EXPECT_EQ(v.queued + v.sync, final_exits.load()) << "every final exit counted once";
  EXPECT_EQ(final_exits.load(), registry.size());
  EXPECT_EQ(v.reaped, v.queued);
  EXPECT_EQ(v.pending_pages, 0u);
  EXPECT_LE(v.rejected, v.sync);
  EXPECT_LE(kernel.pending_high_water(), kernel.max_pending());

  const auto events = queue_events.events();
  EXPECT_EQ(events.size(), v.queued) << "one queue trace event per queued mm";
  std::set<std::uint64_t> queued_ids;
  std::size_t targeted_and_queued = 0;
  for (const auto& e : events) {
    EXPECT_TRUE(queued_ids.insert(e.id).second) << "mm " << e.id << " queued twice";
    const auto found = by_id.find(e.id);
    ASSERT_NE(found, by_id.end()) << "a queue event for an unknown mm " << e.id;
    if (found->second->targeted.load()) ++targeted_and_queued;
  }
  EXPECT_EQ(targeted_and_queued, 0u) << "an OOM-targeted mm was queued";
  EXPECT_TRUE(exercised());

  for (const process& p : registry) mm_system::mmdrop(*p.mm);
}

// --- CPU accounting (RFC open question 3) -------------------------------------------------------

TEST_F(MmTest, ReaperChargesAQueuedMmsTeardownCpuToItsOwner) {
  mm_system kernel(async_on());
  std::atomic<std::uint64_t> cgroup_cpu_ns{0}, bystander_cpu_ns{0};
  auto owned = kernel.spawn(large, backing::real);
  owned->mm()->cpu_owner = &cgroup_cpu_ns;
  auto other = kernel.spawn(large, backing::real);
  other->mm()->cpu_owner = &bystander_cpu_ns;
  kernel.freeze();
  EXPECT_EQ(owned->exit(), decision::queued);
  kernel.thaw();
  kernel.flush();
  EXPECT_GT(cgroup_cpu_ns.load(), 0u) << "the reaper's CPU for the teardown went to the mm's owner";
  kernel.set_async_mm_teardown(false);
  EXPECT_EQ(other->exit(), decision::inline_disabled);
  EXPECT_EQ(bystander_cpu_ns.load(), 0u) << "an inline teardown is the exiting thread's own CPU";
}

// What one user wrote before its mmput is seen by the teardown another user's final mmput
// starts: mm_users' decrements are acq_rel (the kernel's atomic_dec_and_test), a release sequence
// the last one acquires. The two users share nothing else: the second waits for the first's
// decrement with relaxed loads, so under ThreadSanitizer a decrement that does not release, or a
// last one that does not acquire, leaves cpu_owner's write unordered before the reaper's read.
TEST_F(MmTest, ACpuOwnerSetByOneUserIsSeenByTheTeardownAnotherUsersExitQueues) {
  mm_system kernel(async_on());
  std::atomic<std::uint64_t> cgroup_cpu_ns{0};
  mm_struct* mm = kernel.mm_alloc(large, backing::real);
  // Two users, no tasks: a task's exit takes the tasklist lock, which would order the two. No
  // freeze either: the thaw after the joins would order the reaper after both.
  mm_system::mmget(*mm);
  std::thread one([&] {
    mm->cpu_owner = &cgroup_cpu_ns;
    kernel.mmput(*mm);
  });
  std::thread two([&] {
    while (mm->mm_users.read() != 1) std::this_thread::yield();
    EXPECT_EQ(kernel.mmput_exit(*mm), decision::queued);
  });
  one.join();
  two.join();
  kernel.flush();
  EXPECT_GT(cgroup_cpu_ns.load(), 0u) << "the reaper charged the owner the first user named";
}

// --- the compile-time-off build (CONFIG_ASYNC_MM_TEARDOWN=n) ----------------------------------

using compiled_out_system = teardown::model::basic_mm_system<teardown::const_key<false>>;

template <class System>
concept has_toggle_setter = requires(System& kernel) { kernel.set_async_mm_teardown(true); };

TEST_F(MmTest, CompiledOutSystemTearsEveryExitDownInlineAndStartsNoReaper) {
  compiled_out_system kernel;
  EXPECT_FALSE(kernel.stats().reaper.running) << "no reaper thread in the =n build";
  auto t = kernel.spawn(mm_system::default_thresh_pages() * 4);
  mm_struct* mm = t->mm();
  mm_system::mmgrab(*mm);
  EXPECT_EQ(t->exit(), decision::inline_disabled);
  EXPECT_EQ(mm->teardowns.load(), 1u) << "torn down before mmput_exit returned";
  const auto v = kernel.vmstat();
  EXPECT_EQ(v.queued + v.sync, 0u) << "the =n build has no counters";
  mm_system::mmdrop(*mm);
}

TEST_F(MmTest, CompiledOutSystemKeepsTheGateKnobAndStillTearsDownInline) {
  compiled_out_system kernel;
  kernel.set(mm_system::knob_min_concurrent, "4");
  EXPECT_EQ(kernel.min_concurrent_exits(), 4u);
  EXPECT_THROW(kernel.set_min_concurrent_exits(0), std::invalid_argument);
  auto t = kernel.spawn(mm_system::default_thresh_pages() * 4);
  EXPECT_EQ(t->exit(), decision::inline_disabled);
  EXPECT_EQ(kernel.vmstat().uncontended, 0u);
}

TEST_F(MmTest, CompiledOutSystemHasNoToggleKnobButKeepsTheOthers) {
  compiled_out_system kernel;
  EXPECT_THROW(kernel.set(mm_system::knob_enabled, "1"), std::invalid_argument);
  EXPECT_THROW((void)kernel.get(mm_system::knob_enabled), std::invalid_argument);
  kernel.set(mm_system::knob_thresh, "100");
  EXPECT_EQ(kernel.get(mm_system::knob_thresh), "100");
  static_assert(!has_toggle_setter<compiled_out_system> && has_toggle_setter<mm_system>,
                "the =n build has no toggle to set");
}


// ---- one vocabulary: stats(), stop, nice, the generic pressure names, and the old names -------

// The model kernel is driven by the same verbs as every other worker owner.
static_assert(teardown::worker_control<teardown::model::mm_system>);
static_assert(teardown::worker_control<teardown::model::pooled_mm_system>);

TEST_F(MmTest, StatsGathersEveryPartsCountersInOneSnapshot) {
  mm_system_options opts = async_on();
  opts.swap_slots = 64;
  mm_system kernel(std::move(opts));
  auto queued = kernel.spawn(large);
  EXPECT_EQ(queued->exit(), decision::queued);
  auto victim = kernel.spawn(thresh);
  EXPECT_EQ(kernel.oom_kill(*victim), 1u);
  EXPECT_EQ(victim->exit(), decision::inline_ineligible);
  kernel.flush();
  kernel.flush_oom_reaper();
  const teardown::model::mm_system_stats s = kernel.stats();
  EXPECT_EQ(s.vm.queued, 1u);
  EXPECT_EQ(s.vm.reaped, 1u);
  EXPECT_EQ(s.reaper.reaped, 1u) << "the mm_reaper's own statistics";
  EXPECT_EQ(s.oom_reap.queued, 1u);
  EXPECT_EQ(s.oom_reap.reaped, 1u);
  EXPECT_EQ(s.oom_reaper.reaped, 1u) << "the oom_reaper thread's own statistics";
  EXPECT_EQ(s.swap.used, 0u);
  EXPECT_EQ(s.oom_kills, 1u);
  EXPECT_EQ(s.teardowns, 2u);
  EXPECT_EQ(s.pending_high_water, large);
}

TEST_F(MmTest, StopAndStopForStopBothWorkersAndAreIdempotent) {
  mm_system kernel(async_on());
  kernel.stop();
  kernel.stop();
  EXPECT_TRUE(kernel.stop_for(std::chrono::seconds(30)));
  EXPECT_FALSE(kernel.stats().reaper.running);
  auto t = kernel.spawn(large);
  EXPECT_EQ(t->exit(), decision::inline_stopped);
}

TEST_F(MmTest, NiceIsTheMmReapersAndSetNiceChecksTheRange) {
  mm_system kernel(async_on());
  EXPECT_EQ(kernel.nice(), default_worker_nice(19));
  EXPECT_THROW(kernel.set_nice(20), std::invalid_argument);
  EXPECT_THROW(kernel.set_nice(-21), std::invalid_argument);
  EXPECT_EQ(kernel.nice(), default_worker_nice(19));
  EXPECT_TRUE(kernel.set_nice(19));
}

// Old code still builds, and each old name forwards to its new one.
TEST_F(MmTest, DeprecatedNamesForwardToTheNewOnes) {
  mm_system kernel(async_on(5'000));
  auto t = kernel.spawn(large);
  EXPECT_EQ(t->exit(), decision::queued);
  kernel.flush();
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  EXPECT_EQ(kernel.reaper_statistics().reaped, kernel.stats().reaper.reaped);
  EXPECT_EQ(kernel.oom_reap_statistics().queued, kernel.stats().oom_reap.queued);
  EXPECT_EQ(kernel.oom_reaper_statistics().running, kernel.stats().oom_reaper.running);
  EXPECT_EQ(kernel.swap_statistics().batches, kernel.stats().swap.batches);
  EXPECT_EQ(kernel.mm_reaper_trace_domain(), kernel.trace_domain());
  EXPECT_EQ(kernel.max_pending_pages(), 5'000u);
  EXPECT_TRUE(kernel.replace_max_pending_pages(5'000, 6'000));
  EXPECT_EQ(kernel.max_pending(), 6'000u);
  EXPECT_EQ(kernel.worker_nice(), kernel.nice());
  EXPECT_TRUE(kernel.set_worker_nice(19));
  EXPECT_TRUE(kernel.shutdown_for(std::chrono::seconds(30)));
  kernel.shutdown();
#pragma GCC diagnostic pop
  EXPECT_FALSE(kernel.stats().reaper.running);
}

// pool.worker was silently ignored (every mm_reaper worker takes mm_system_options::reaper): a
// pool.worker that is not default is refused, naming the option, and nothing starts.
TEST_F(KnobTest, ConstructorRefusesAPoolWorkerThatWouldBeIgnored) {
  for (const auto set : {+[](mm_system_options& o) { o.pool.worker.name = "mine"; },
                         +[](mm_system_options& o) { o.pool.worker.nice = 0; },
                         +[](mm_system_options& o) { o.pool.worker.on_error = [](std::exception_ptr) {}; }}) {
    mm_system_options opts = async_on();
    set(opts);
    try {
      teardown::model::pooled_mm_system kernel(std::move(opts));
      ADD_FAILURE() << "a pool.worker that would be ignored was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("pool.worker"), std::string::npos) << e.what();
    }
    mm_system_options plain = async_on();
    set(plain);
    EXPECT_THROW(mm_system{std::move(plain)}, std::invalid_argument) << "mm_system ignores it as well";
  }
  mm_system_options named = async_on();
  named.reaper.name = "mine";
  named.pool.workers = 2;
  teardown::model::pooled_mm_system kernel(std::move(named));  // the way to name the workers
  EXPECT_EQ(kernel.nice(), default_worker_nice(19));
}

}  // namespace
}  // namespace teardown_test
