// Specification of the OOM reaper in teardown/model/mm.hpp (seed 003): oom_kill queues the
// victim's mm for the oom_reaper once, holding a struct reference until the reap is over; the
// oom_reaper releases the victim's memory chunk by chunk (real memory: mincore sees the pages go)
// whether or not the victim exits, and while the mm_reaper is frozen; a victim's exit racing the
// oom_reaper, from either end (vm.oom_reap_direction), unmaps every chunk once, tears the mm down
// once, and the pages the two sides count add up to the RSS; the walk's shape per direction;
// reclaim against the walk; the delay; the destructor with a reap still pending; the knob and
// its validation. Thaw on urgency (seed 003's patch 1): a drain while the mm_reaper is frozen in
// the middle of a batch reaches the rest of that batch. The OomReaperStressTest suite races
// kills, exits, CLONE_VM sharers, reclaim, direction flips, freezes and drains.
//
// Nothing here asserts a time. A wait for another thread is a loop on an observable condition;
// the per-test hang_guard turns a hang into an abort naming the test.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "reaper_test_support.hpp"
#include "teardown/model/mm.hpp"
#include "test_support.hpp"

namespace teardown_test {
namespace {

using namespace std::chrono_literals;
using reaper_support::current_test_name;
using reaper_support::hang_guard;
using teardown::decision;
using teardown::model::backing;
using teardown::model::chunk_walk;
using teardown::model::MMF_OOM_REAP_QUEUED;
using teardown::model::MMF_OOM_SKIP;
using teardown::model::mm_struct;
using teardown::model::mm_system;
using teardown::model::mm_system_options;
using teardown::model::oom_reap_stats;
using teardown::model::reap_direction;
using teardown::model::test_flag;

static_assert(noexcept(std::declval<const mm_system&>().stats().oom_reap));
static_assert(noexcept(std::declval<const mm_system&>().oom_reap_direction()));

class OomReaperTest : public ::testing::Test {
 private:
  hang_guard guard_{current_test_name()};
};
using OomReapKnobTest = OomReaperTest;
using ThawOnUrgencyTest = OomReaperTest;
using OomReaperStressTest = OomReaperTest;

constexpr std::uint64_t thresh = 100;

// The feature on with a small threshold; the stall watchdog out of reach (a frozen mm_reaper
// must see queued, never sync_stalled).
mm_system_options async_on() {
  mm_system_options opts;
  opts.async_mm_teardown = true;
  opts.thresh_pages = thresh;
  opts.max_pending_pages = 1'000'000'000;
  opts.reaper.stall_threshold = std::chrono::hours(1);
  return opts;
}

// A struct reference held for the test's lifetime (declare it after the mm_system).
class grabbed {
 public:
  explicit grabbed(mm_struct* mm) : mm_(mm) { mm_system::mmgrab(*mm_); }
  grabbed(const grabbed&) = delete;
  grabbed& operator=(const grabbed&) = delete;
  ~grabbed() { mm_system::mmdrop(*mm_); }
  mm_struct* operator->() const { return mm_; }
  mm_struct& operator*() const { return *mm_; }

 private:
  mm_struct* mm_;
};

std::uint64_t pages_of(std::size_t bytes) { return bytes / mm_system::page_size(); }

chunk_walk walk_of(mm_struct& mm) {
  const std::lock_guard lock(mm.mmap_lock);
  return mm.walk;
}

struct mapping {
  std::byte* base = nullptr;
  std::size_t bytes = 0;
};
mapping mapping_of(mm_struct& mm) {
  const std::lock_guard lock(mm.mmap_lock);
  return {mm.base, mm.mapped_bytes};
}

// mincore over a range: the errno it refused it with (0: mapped) and how many pages are resident.
struct residency {
  int error = 0;
  std::size_t resident = 0;
};
residency residency_of(const mapping& m) {
  std::vector<unsigned char> vec((m.bytes + mm_system::page_size() - 1) / mm_system::page_size());
  residency r;
  if (mincore(m.base, m.bytes, vec.data()) != 0) {
    r.error = errno;
    return r;
  }
  r.resident = static_cast<std::size_t>(
      std::count_if(vec.begin(), vec.end(), [](unsigned char v) { return (v & 1u) != 0; }));
  return r;
}

template <class Pred>
void wait_until(Pred done) {
  while (!done()) std::this_thread::yield();
}

std::string direction_name(const ::testing::TestParamInfo<reap_direction>& info) {
  return teardown::model::to_string(info.param);
}

// --- the knob ---------------------------------------------------------------------------------

TEST_F(OomReapKnobTest, DefaultIsTheOtherEndAndTheTextKnobReadsIt) {
  mm_system kernel;
  EXPECT_EQ(mm_system::knob_oom_reap_direction, "vm.oom_reap_direction");
  EXPECT_EQ(kernel.oom_reap_direction(), reap_direction::other);
  EXPECT_EQ(kernel.get("vm.oom_reap_direction"), "other");
}

TEST_F(OomReapKnobTest, TextKnobTakesSameAndOtherWithOneTrailingNewline) {
  mm_system kernel;
  kernel.set("vm.oom_reap_direction", "same");
  EXPECT_EQ(kernel.oom_reap_direction(), reap_direction::same);
  EXPECT_EQ(kernel.get("vm.oom_reap_direction"), "same");
  kernel.set("vm.oom_reap_direction", "other\n");
  EXPECT_EQ(kernel.oom_reap_direction(), reap_direction::other);
  kernel.set("vm.oom_reap_direction", "same\n");
  EXPECT_EQ(kernel.get("vm.oom_reap_direction"), "same");
}

TEST_F(OomReapKnobTest, MalformedTextIsRefusedNamingTheKnobAndChangesNothing) {
  mm_system kernel;
  kernel.set_oom_reap_direction(reap_direction::same);
  for (const char* bad : {"", "\n", "Same", "OTHER", " same", "same ", "same\n\n", "same\r\n", "0", "1", "othe",
                          "others", "same,other"}) {
    try {
      kernel.set("vm.oom_reap_direction", bad);
      ADD_FAILURE() << "accepted \"" << bad << "\"";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("vm.oom_reap_direction"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("unchanged"), std::string::npos) << e.what();
    }
    EXPECT_EQ(kernel.oom_reap_direction(), reap_direction::same) << "changed by \"" << bad << "\"";
  }
}

TEST_F(OomReapKnobTest, TypedSetterSetsAndRefusesAValueThatIsNoDirection) {
  mm_system kernel;
  kernel.set_oom_reap_direction(reap_direction::same);
  EXPECT_EQ(kernel.get("vm.oom_reap_direction"), "same");
  try {
    kernel.set_oom_reap_direction(static_cast<reap_direction>(7));
    ADD_FAILURE() << "accepted a value that is no direction";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("vm.oom_reap_direction"), std::string::npos) << e.what();
  }
  EXPECT_EQ(kernel.oom_reap_direction(), reap_direction::same);
}

TEST_F(OomReapKnobTest, CompiledOutSystemHasTheKnobAndTheOomReaper) {
  teardown::model::basic_mm_system<teardown::const_key<false>> kernel;
  kernel.set("vm.oom_reap_direction", "same");
  EXPECT_EQ(kernel.get("vm.oom_reap_direction"), "same");
  auto victim = kernel.spawn(thresh * 10);
  grabbed mm(victim->mm());
  EXPECT_EQ(kernel.oom_kill(*victim), 1u);
  kernel.flush_oom_reaper();
  EXPECT_EQ(get_mm_rss(*mm), 0u);
  EXPECT_EQ(kernel.stats().oom_reap.reaper_pages, thresh * 10);
  EXPECT_EQ(victim->exit(), decision::inline_disabled);
  EXPECT_EQ(mm->teardowns.load(), 1u);
}

TEST_F(OomReapKnobTest, NegativeDelayIsRefusedAndChangesNothing) {
  mm_system kernel;
  kernel.set_oom_reap_delay(5ms);
  EXPECT_THROW(kernel.set_oom_reap_delay(-1ns), std::invalid_argument);
  EXPECT_EQ(kernel.oom_reap_delay(), 5ms);
  EXPECT_EQ(mm_system().oom_reap_delay(), 0ns) << "the model's default";
}

// --- the oom_reaper alone -----------------------------------------------------------------------

TEST_F(OomReaperTest, ReleasesAKilledVictimsMemoryEvenIfTheVictimNeverExits) {
  mm_system kernel(async_on());
  const std::uint64_t pages = pages_of(std::size_t{5} << 20);  // three chunks, the last partial
  auto victim = kernel.spawn(pages, backing::real);
  grabbed mm(victim->mm());
  const mapping m = mapping_of(*mm);
  ASSERT_EQ(residency_of(m).resident, pages);

  EXPECT_EQ(kernel.oom_kill(*victim), 1u);
  kernel.flush_oom_reaper();

  const residency after = residency_of(m);
  EXPECT_EQ(after.error, 0) << "the oom_reaper must not unmap: the victim still owns the range";
  EXPECT_EQ(after.resident, 0u) << "mincore: every page released";
  EXPECT_EQ(get_mm_rss(*mm), 0u);
  EXPECT_EQ(mm->teardowns.load(), 0u) << "the oom_reaper never runs __mmput";
  EXPECT_TRUE(test_flag(*mm, MMF_OOM_SKIP)) << "a reaped mm is hidden from the OOM killer";
  const chunk_walk walk = walk_of(*mm);
  EXPECT_EQ(walk.chunks, 3u);
  EXPECT_EQ(walk.reaper_pages, pages);
  EXPECT_EQ(walk.exit_pages, 0u);
  const oom_reap_stats s = kernel.stats().oom_reap;
  EXPECT_EQ(s.queued, 1u);
  EXPECT_EQ(s.reaped, 1u);
  EXPECT_EQ(s.skipped, 0u);
  EXPECT_EQ(s.reaper_pages, pages);
  EXPECT_EQ(s.reaper_chunks, 3u);

  // The victim's exit later unmaps what is left: the range, not pages.
  EXPECT_EQ(victim->exit(), decision::inline_ineligible);
  EXPECT_EQ(mm->teardowns.load(), 1u);
  EXPECT_EQ(residency_of(m).error, ENOMEM) << "mincore: the range is unmapped";
  EXPECT_EQ(walk_of(*mm).exit_pages, 0u);
  EXPECT_EQ(kernel.stats().oom_reap.exit_chunks, 3u);
}

TEST_F(OomReaperTest, ReleasesAVictimsMemoryWhileTheMmReaperIsFrozen) {
  mm_system kernel(async_on());
  kernel.freeze();
  auto queued = kernel.spawn(thresh * 4);
  grabbed queued_mm(queued->mm());
  ASSERT_EQ(queued->exit(), decision::queued);  // behind the frozen mm_reaper
  const std::uint64_t pages = pages_of(std::size_t{4} << 20);
  auto victim = kernel.spawn(pages, backing::real);
  grabbed mm(victim->mm());
  const mapping m = mapping_of(*mm);

  EXPECT_EQ(kernel.oom_kill(*victim), 1u);
  kernel.flush_oom_reaper();

  EXPECT_EQ(residency_of(m).resident, 0u) << "released while the mm_reaper is frozen";
  EXPECT_EQ(kernel.vmstat().reaped, 0u) << "the mm_reaper stayed frozen";
  EXPECT_EQ(queued_mm->teardowns.load(), 0u);
  EXPECT_EQ(victim->exit(), decision::inline_ineligible) << "a victim's exit never waits for the mm_reaper";
  EXPECT_EQ(mm->teardowns.load(), 1u);
  kernel.thaw();
  kernel.flush();
  EXPECT_EQ(queued_mm->teardowns.load(), 1u);
}

TEST_F(OomReaperTest, AnMmIsQueuedOnceHoweverOftenItsHoldersAreKilled) {
  mm_system kernel(async_on());
  auto victim = kernel.spawn(thresh * 10);
  auto sharer = kernel.clone_vm(*victim);
  grabbed mm(victim->mm());
  EXPECT_EQ(kernel.oom_kill(*victim), 2u);
  EXPECT_EQ(kernel.oom_kill(*sharer), 2u);
  EXPECT_EQ(kernel.oom_kill(*victim), 2u);
  EXPECT_TRUE(test_flag(*mm, MMF_OOM_REAP_QUEUED));
  kernel.flush_oom_reaper();
  EXPECT_EQ(kernel.stats().oom_reap.queued, 1u);
  EXPECT_EQ(kernel.stats().oom_reap.reaped, 1u);
  victim.reset();
  sharer.reset();
  EXPECT_EQ(mm->teardowns.load(), 1u);
  EXPECT_EQ(mm->mm_count.read(), 1) << "only our reference is left: the oom_reaper dropped its own";
}

TEST_F(OomReaperTest, HoldsAStructReferenceWhileQueuedAndDropsItWhenDone) {
  mm_system kernel(async_on());
  kernel.set_oom_reap_delay(std::chrono::hours(1));  // queued, not started
  auto victim = kernel.spawn(thresh * 10);
  grabbed mm(victim->mm());
  ASSERT_EQ(mm->mm_count.read(), 2);  // the users' reference and ours
  kernel.oom_kill(*victim);
  EXPECT_EQ(mm->mm_count.read(), 3) << "oom_kill grabbed the struct for the oom_reaper";
  EXPECT_EQ(victim->exit(), decision::inline_ineligible);
  EXPECT_EQ(mm->teardowns.load(), 1u);
  EXPECT_EQ(mm->mm_count.read(), 2) << "the teardown dropped the users' reference, not the oom_reaper's";
  kernel.set_oom_reap_delay(0ns);
  kernel.flush_oom_reaper();
  EXPECT_EQ(mm->mm_count.read(), 1);
  const oom_reap_stats s = kernel.stats().oom_reap;
  EXPECT_EQ(s.skipped, 1u) << "the victim had torn itself down: nothing left to reap";
  EXPECT_EQ(s.reaper_pages, 0u);
  EXPECT_EQ(s.exit_pages, thresh * 10) << "the exit path released every page";
}

TEST_F(OomReaperTest, MarkOomVictimAloneQueuesNothingAndTheExitUnmapsInOneGo) {
  mm_system kernel(async_on());
  auto victim = kernel.spawn(thresh * 10);
  grabbed mm(victim->mm());
  ASSERT_TRUE(kernel.mark_oom_victim(*victim));
  EXPECT_FALSE(test_flag(*mm, MMF_OOM_REAP_QUEUED));
  EXPECT_EQ(victim->exit(), decision::inline_ineligible);
  const chunk_walk walk = walk_of(*mm);
  EXPECT_FALSE(walk.started) << "no oom_reaper: the normal, unchunked teardown";
  EXPECT_TRUE(walk.finished);
  EXPECT_EQ(kernel.stats().oom_reap.queued, 0u);
  EXPECT_EQ(kernel.stats().oom_reap.exit_chunks, 0u);
}

TEST_F(OomReaperTest, ReclaimBeforeTheWalkShrinksWhatItReleasesAndNothingAfterItBegan) {
  mm_system kernel(async_on());
  kernel.set_oom_reap_delay(std::chrono::hours(1));
  const std::uint64_t pages = pages_of(std::size_t{4} << 20);
  auto victim = kernel.spawn(pages, backing::real);
  grabbed mm(victim->mm());
  const mapping m = mapping_of(*mm);
  kernel.oom_kill(*victim);
  EXPECT_EQ(kernel.reclaim(*mm, 100), 100u) << "the walk has not begun: reclaim still works";
  kernel.set_oom_reap_delay(0ns);
  kernel.flush_oom_reaper();
  EXPECT_EQ(walk_of(*mm).rss_at_start, pages - 100);
  EXPECT_EQ(walk_of(*mm).reaper_pages, pages - 100);
  EXPECT_EQ(residency_of(m).resident, 0u);
  EXPECT_EQ(kernel.reclaim(*mm, 1), 0u) << "the walk began: reclaim takes nothing";
  EXPECT_EQ(victim->exit(), decision::inline_ineligible);
  EXPECT_EQ(mm->teardowns.load(), 1u);
}

// --- the race, from either end ------------------------------------------------------------------

class OomReapRaceTest : public OomReaperTest, public ::testing::WithParamInterface<reap_direction> {};

// The victim exits at once on another thread while the oom_reaper walks the same mm: every
// chunk unmapped once, the mm torn down once, each page counted by one side, nothing left.
TEST_P(OomReapRaceTest, RacingExitAndOomReapTearDownOnceAndCountEachPageOnce) {
  mm_system kernel(async_on());
  kernel.set_oom_reap_direction(GetParam());
  const std::uint64_t pages = pages_of(std::size_t{16} << 20);
  std::uint64_t total = 0;
  for (std::size_t rep = 0; rep < scaled(10); ++rep) {
    auto victim = kernel.spawn(pages, backing::real);
    auto sharer = kernel.clone_vm(*victim);  // CLONE_VM: the last of the two exits tears down
    grabbed mm(victim->mm());
    const mapping m = mapping_of(*mm);
    std::optional<decision> victim_exit;
    std::thread exiting([&] {
      wait_until([&] { return victim->killed(); });  // the SIGKILL
      victim_exit = victim->exit();
    });
    EXPECT_EQ(kernel.oom_kill(*sharer), 2u);
    const std::optional<decision> sharer_exit = sharer->exit();
    exiting.join();
    EXPECT_NE(victim_exit.has_value(), sharer_exit.has_value()) << "exactly one of the two exits is the last";
    EXPECT_EQ(victim_exit ? victim_exit : sharer_exit, decision::inline_ineligible);
    kernel.flush_oom_reaper();

    EXPECT_EQ(mm->teardowns.load(), 1u);
    EXPECT_EQ(get_mm_rss(*mm), 0u);
    EXPECT_EQ(residency_of(m).error, ENOMEM) << "mincore: the whole range is unmapped";
    const chunk_walk walk = walk_of(*mm);
    EXPECT_TRUE(walk.finished);
    EXPECT_EQ(walk.unmapped_below, walk.chunks);
    EXPECT_EQ(walk.exit_pages + walk.reaper_pages, pages) << "rep " << rep;
    total += pages;
  }
  const oom_reap_stats s = kernel.stats().oom_reap;
  EXPECT_EQ(s.reaped, s.queued);
  EXPECT_EQ(s.errors, 0u);
  EXPECT_EQ(s.exit_pages + s.reaper_pages, total);
  EXPECT_EQ(s.exit_chunks, scaled(10) * 8) << "every chunk unmapped exactly once";
}

// With the victim alive, sampling the walk while the oom_reaper runs shows where it started:
// from the other end the released run always ends at the top, from the same end it always starts
// at the bottom.
TEST_P(OomReapRaceTest, TheOomReaperWalksFromTheEndTheKnobNames) {
  mm_system kernel(async_on());
  kernel.set_oom_reap_direction(GetParam());
  auto victim = kernel.spawn(std::uint64_t{1} << 22);  // simulated: 8192 chunks of bookkeeping
  grabbed mm(victim->mm());
  kernel.oom_kill(*victim);
  std::size_t samples = 0, wrong = 0;
  for (;;) {
    const chunk_walk walk = walk_of(*mm);
    if (walk.reaped_lo != walk.reaped_hi) {
      ++samples;
      const bool from_the_top = walk.reaped_hi == walk.chunks;
      const bool from_the_bottom = walk.reaped_lo == 0;
      wrong += GetParam() == reap_direction::other ? !from_the_top : !from_the_bottom;
    }
    if (walk.reaped_lo == 0 && walk.reaped_hi == walk.chunks && walk.chunks != 0) break;
  }
  EXPECT_GT(samples, 0u);
  EXPECT_EQ(wrong, 0u) << "of " << samples << " samples";
  EXPECT_EQ(walk_of(*mm).chunks, 8192u);
  kernel.flush_oom_reaper();
  EXPECT_EQ(victim->exit(), decision::inline_ineligible);
}

// From the other end the two sides meet once: the exit path released exactly the chunks below
// the meeting point, the oom_reaper those above it.
TEST_F(OomReaperTest, FromTheOtherEndTheSidesSplitTheMmAtOneMeetingPoint) {
  mm_system kernel(async_on());
  for (int rep = 0; rep < 20; ++rep) {
    auto victim = kernel.spawn(std::uint64_t{1} << 20);  // simulated: 2048 chunks
    grabbed mm(victim->mm());
    kernel.oom_kill(*victim);
    EXPECT_EQ(victim->exit(), decision::inline_ineligible);
    kernel.flush_oom_reaper();
    const chunk_walk walk = walk_of(*mm);
    const std::uint64_t meet = walk.reaped_lo == walk.reaped_hi ? walk.chunks : walk.reaped_lo;
    if (walk.reaped_lo != walk.reaped_hi) {
      EXPECT_EQ(walk.reaped_hi, walk.chunks);
    }
    EXPECT_EQ(walk.exit_pages, meet * walk.chunk_pages) << "rep " << rep;
    EXPECT_EQ(walk.reaper_pages, (walk.chunks - meet) * walk.chunk_pages) << "rep " << rep;
  }
}

INSTANTIATE_TEST_SUITE_P(Directions, OomReapRaceTest, ::testing::Values(reap_direction::same, reap_direction::other),
                         direction_name);

// --- the destructor ---------------------------------------------------------------------------

TEST_F(OomReaperTest, DestroyingTheSystemWithAPendingOomReapFinishesItAndDropsItsReference) {
  std::vector<std::unique_ptr<grabbed>> mms;
  {
    mm_system kernel(async_on());
    kernel.set_oom_reap_delay(std::chrono::hours(1));  // pending until the destructor cuts it short
    for (int i = 0; i < 4; ++i) {
      auto victim = kernel.spawn(pages_of(std::size_t{2} << 20), i % 2 == 0 ? backing::real : backing::simulated);
      mms.push_back(std::make_unique<grabbed>(victim->mm()));
      kernel.oom_kill(*victim);
      EXPECT_EQ(victim->exit(), decision::inline_ineligible);
    }
    EXPECT_EQ(kernel.stats().oom_reap.reaped, 0u) << "still pending";
  }
  for (const auto& mm : mms) {
    EXPECT_EQ((*mm)->mm_count.read(), 1) << "the oom_reaper dropped its reference before the system died";
    EXPECT_EQ((*mm)->teardowns.load(), 1u);
  }
}

TEST_F(OomReaperTest, DestroyingTheSystemRightAfterRacingKillsLeavesNothingBehind) {
  std::vector<std::unique_ptr<grabbed>> mms;
  {
    mm_system kernel(async_on());
    for (int i = 0; i < 16; ++i) {
      auto victim = kernel.spawn(std::uint64_t{1} << 18);
      mms.push_back(std::make_unique<grabbed>(victim->mm()));
      kernel.oom_kill(*victim);
      (void)victim->exit();
    }
  }
  for (const auto& mm : mms) {
    EXPECT_EQ((*mm)->mm_count.read(), 1);
    EXPECT_EQ((*mm)->teardowns.load(), 1u);
  }
}

// --- thaw on urgency (seed 003's patch 1) ----------------------------------------------------

// The mm_reaper is frozen while it is in the middle of a batch of five: the drain that follows
// still reaches the four it had not started, so every queued mm is torn down before the thaw.
TEST_F(ThawOnUrgencyTest, DrainWhileTheMmReaperIsFrozenMidBatchTearsDownTheRestOfTheBatch) {
  mm_system kernel(async_on());
  kernel.freeze();
  std::vector<std::unique_ptr<grabbed>> mms;
  std::vector<std::unique_ptr<mm_system::task>> tasks;
  for (int i = 0; i < 5; ++i) {
    tasks.push_back(kernel.spawn(thresh * 4));
    mms.push_back(std::make_unique<grabbed>(tasks.back()->mm()));
  }
  mm_struct& first = **mms[0];
  std::unique_lock hold(first.mmap_lock);  // the mm_reaper will stop inside the first teardown
  for (auto& t : tasks) ASSERT_EQ(t->exit(), decision::queued);
  kernel.thaw();  // one batch of five
  wait_until([&] { return first.aio.exit_calls() == 2; });  // the mm_reaper is in __mmput(first)
  std::thread freezer([&] { kernel.freeze(); });
  std::this_thread::sleep_for(20ms);  // lets the freeze arrive while the first teardown runs
  hold.unlock();
  freezer.join();  // parked after the first

  const teardown::drain_result drained = kernel.drain(UINT64_MAX);

  EXPECT_EQ(drained.items, 4u) << "the rest of the frozen batch";
  for (const auto& mm : mms) EXPECT_EQ((*mm)->teardowns.load(), 1u) << "torn down while the mm_reaper is frozen";
  EXPECT_EQ(kernel.vmstat().drained, 4u);
  EXPECT_EQ(kernel.vmstat().pending_pages, 0u);
  kernel.thaw();
  kernel.flush();
  EXPECT_EQ(kernel.vmstat().reaped, 5u);
}

// An OOM kill, its victim's exit and a pressure drain all make progress with the mm_reaper
// frozen: the victim's memory and the drained backlog come back before the thaw.
TEST_F(ThawOnUrgencyTest, OomKillAndDrainReleaseMemoryWhileTheMmReaperIsFrozen) {
  mm_system kernel(async_on());
  kernel.freeze();
  std::vector<std::unique_ptr<grabbed>> backlog;
  for (int i = 0; i < 8; ++i) {
    auto t = kernel.spawn(thresh * 10);
    backlog.push_back(std::make_unique<grabbed>(t->mm()));
    ASSERT_EQ(t->exit(), decision::queued);
  }
  auto victim = kernel.spawn(thresh * 50);
  auto sharer = kernel.clone_vm(*victim);
  grabbed mm(victim->mm());
  EXPECT_EQ(kernel.oom_kill(*victim), 2u);
  EXPECT_EQ(victim->exit(), std::nullopt);
  EXPECT_EQ(sharer->exit(), decision::inline_ineligible);
  const teardown::drain_result drained = kernel.drain(thresh * 40);
  kernel.flush_oom_reaper();

  EXPECT_EQ(mm->teardowns.load(), 1u);
  EXPECT_EQ(get_mm_rss(*mm), 0u);
  EXPECT_EQ(drained.items, 4u);
  const oom_reap_stats s = kernel.stats().oom_reap;
  EXPECT_EQ(s.exit_pages + s.reaper_pages, thresh * 50);
  kernel.thaw();
  kernel.flush();
  for (const auto& b : backlog) EXPECT_EQ((*b)->teardowns.load(), 1u);
}

// --- many threads -------------------------------------------------------------------------------

// Kills, exits in any order, CLONE_VM sharers, reclaim, direction flips, mm_reaper freezes and
// drains, all at once: every mm torn down once, and for every mm the oom_reaper was queued for,
// the two sides' pages add up to the RSS its walk started from.
TEST_F(OomReaperStressTest, KillsExitsReclaimFlipsFreezesAndDrainsTearEveryMmDownOnce) {
  mm_system kernel(async_on());
  const std::size_t per_thread = scaled(150);
  constexpr int workers = 3;
  std::mutex mms_lock;
  std::vector<std::unique_ptr<grabbed>> mms;
  std::atomic<bool> done{false};
  std::atomic<int> working{workers};

  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(w) * 7919 + 1);
      for (std::size_t i = 0; i < per_thread; ++i) {
        const bool real = rng() % 8 == 0;
        const std::uint64_t pages = real ? 64 + rng() % 1024 : thresh / 2 + rng() % 200'000;
        auto victim = kernel.spawn(pages, real ? backing::real : backing::simulated);
        mm_struct* mm = victim->mm();
        {
          const std::lock_guard guard(mms_lock);
          mms.push_back(std::make_unique<grabbed>(mm));
        }
        std::unique_ptr<mm_system::task> sharer;
        if (rng() % 3 == 0) sharer = kernel.clone_vm(*victim);
        if (rng() % 4 == 0) (void)kernel.reclaim(*mm, rng() % (pages + 1));
        if (rng() % 4 != 0) {
          // exit(), not reset(): the killer may still be reading the task.
          std::thread killer([&kernel, v = victim.get()] { (void)kernel.oom_kill(*v); });
          if (rng() % 2 == 0) std::this_thread::yield();
          if (sharer && rng() % 2 == 0) (void)sharer->exit();
          (void)victim->exit();
          killer.join();
        }
        sharer.reset();
        victim.reset();
      }
      working.fetch_sub(1);
    });
  }
  threads.emplace_back([&] {  // direction flips
    std::mt19937_64 rng(99);
    while (!done.load()) {
      kernel.set_oom_reap_direction(rng() % 2 == 0 ? reap_direction::same : reap_direction::other);
      std::this_thread::sleep_for(100us);
    }
  });
  threads.emplace_back([&] {  // the freezer and the pressure drain
    while (!done.load()) {
      kernel.freeze();
      (void)kernel.drain(thresh * 1000);
      kernel.thaw();
      std::this_thread::sleep_for(200us);
    }
  });
  wait_until([&] { return working.load() == 0; });
  done.store(true);
  for (std::thread& t : threads) t.join();
  kernel.flush();
  kernel.flush_oom_reaper();

  std::uint64_t walked = 0, queued = 0;
  for (const auto& mm : mms) {
    ASSERT_EQ((*mm)->teardowns.load(), 1u);
    ASSERT_EQ(get_mm_rss(**mm), 0u);
    if (test_flag(**mm, MMF_OOM_REAP_QUEUED)) {
      ++queued;
      const chunk_walk walk = walk_of(**mm);
      ASSERT_TRUE(walk.started);
      ASSERT_EQ(walk.exit_pages + walk.reaper_pages, walk.rss_at_start);
      walked += walk.rss_at_start;
    }
  }
  const oom_reap_stats s = kernel.stats().oom_reap;
  EXPECT_EQ(s.queued, queued);
  EXPECT_EQ(s.reaped, queued);
  EXPECT_EQ(s.errors, 0u);
  EXPECT_EQ(s.exit_pages + s.reaper_pages, walked);
  EXPECT_EQ(kernel.vmstat().pending_pages, 0u);
  EXPECT_EQ(kernel.vmstat().reaped, kernel.vmstat().queued);
}

}  // namespace
}  // namespace teardown_test
