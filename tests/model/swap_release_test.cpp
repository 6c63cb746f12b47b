// Specification of the model's swap release (seed 004, in teardown/model/mm.hpp): swap_out and
// the swap device's checks, when an exiting task hands its swap entries to the swap-release
// worker (its own exit path, SWAP_CLUSTER_MAX entries, at least swap_min_exiting final exits in
// flight, the toggle) and when it releases them itself, page-sized batches queued with one
// put_chain, and the fallback when a batch cannot be allocated: the batches built so far are
// queued, every other entry is released inline, nothing is lost or released twice.
// SwapReleaseStressTest runs concurrent exits while every k-th batch allocation fails.
//
// Nothing here asserts a time. A wait for another thread is a loop on an observable state; the
// per-test hang_guard turns a hang into an abort naming the test.
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "reaper_test_support.hpp"
#include "teardown/model/mm.hpp"
#include "test_support.hpp"

namespace teardown_test {
namespace {

using reaper_support::current_test_name;
using reaper_support::hang_guard;
using teardown::decision;
using teardown::model::mm_struct;
using teardown::model::mm_system;
using teardown::model::mm_system_options;
using teardown::model::swap_batch;
using teardown::model::swap_batch_allocator;
using teardown::model::swap_release_stats;
using teardown::model::swap_space;

static_assert(sizeof(swap_batch) == 4096);
static_assert(swap_batch::capacity == 1016);

// A batch allocator that fails the allocations the test names: every `fail_every`-th, or all
// from `fail_from` on (1-based; 0: never). One process-wide instance; each test resets it.
struct failing_allocations {
  std::atomic<std::uint64_t> made{0};
  std::atomic<std::uint64_t> fail_every{0};
  std::atomic<std::uint64_t> fail_from{0};
  std::atomic<std::int64_t> live{0};  // allocated and not yet freed

  void reset(std::uint64_t every, std::uint64_t from) {
    made.store(0);
    fail_every.store(every);
    fail_from.store(from);
  }
};
failing_allocations failing;

const swap_batch_allocator failing_allocator{
    [](std::size_t bytes) noexcept -> void* {
      const std::uint64_t n = failing.made.fetch_add(1) + 1;
      const std::uint64_t every = failing.fail_every.load();
      const std::uint64_t from = failing.fail_from.load();
      if ((every != 0 && n % every == 0) || (from != 0 && n >= from)) return nullptr;
      void* memory = ::operator new(bytes, std::nothrow);
      if (memory != nullptr) failing.live.fetch_add(1);
      return memory;
    },
    [](void* memory) noexcept {
      failing.live.fetch_sub(1);
      ::operator delete(memory);
    }};

class SwapReleaseTest : public ::testing::Test {
 protected:
  SwapReleaseTest() { failing.reset(0, 0); }
  ~SwapReleaseTest() override { EXPECT_EQ(failing.live.load(), 0) << "every batch page freed"; }

  // A system with swap, the deferral of whole mms off (every exit tears down on its own
  // thread) and the swap gate at `min_exiting`.
  static mm_system_options with_swap(std::uint32_t min_exiting = 1) {
    return {.async_mm_teardown = false, .swap_slots = 1 << 16, .swap_min_exiting = min_exiting};
  }

  // A task with `swapped` of its pages in swap.
  static std::unique_ptr<mm_system::task> swapped_task(mm_system& kernel, std::uint64_t swapped) {
    auto task = kernel.spawn(swapped + 10);
    EXPECT_EQ(kernel.swap_out(*task->mm(), swapped), swapped);
    return task;
  }

  // Nothing lost, nothing twice: the device is back to empty, every slot free.
  static void expect_swap_all_free(const mm_system& kernel) {
    const swap_space& device = *kernel.swap_device();
    EXPECT_EQ(device.used(), 0u);
    EXPECT_EQ(device.double_frees(), 0u);
    for (std::uint32_t slot = 0; slot < device.capacity(); ++slot) {
      if (device.uses(slot) != 0) {
        ADD_FAILURE() << "slot " << slot << " still in use";
        return;
      }
    }
  }

 private:
  hang_guard guard_{current_test_name()};
};
using SwapReleaseStressTest = SwapReleaseTest;

// --- the swap device and swap_out --------------------------------------------------------------

TEST_F(SwapReleaseTest, SwapOutMovesPagesFromTheRssToSwapSlots) {
  mm_system kernel(with_swap());
  auto task = kernel.spawn(100);
  mm_struct& mm = *task->mm();
  EXPECT_EQ(kernel.swap_out(mm, 40), 40u);
  EXPECT_EQ(teardown::model::get_mm_rss(mm), 60u);
  EXPECT_EQ(mm_system::swap_entries(mm), 40u);
  EXPECT_EQ(kernel.swap_device()->used(), 40u);
  EXPECT_EQ(kernel.swap_out(mm, 1000), 60u) << "at most the RSS";
  EXPECT_EQ(kernel.swap_out(mm, 1), 0u);
  (void)task->exit();
  kernel.flush();
  expect_swap_all_free(kernel);
}

TEST_F(SwapReleaseTest, SwapOutWithoutASwapDeviceThrowsAndChangesNothing) {
  mm_system kernel;
  auto task = kernel.spawn(100);
  EXPECT_EQ(kernel.swap_device(), nullptr);
  EXPECT_THROW((void)kernel.swap_out(*task->mm(), 10), std::logic_error);
  EXPECT_EQ(teardown::model::get_mm_rss(*task->mm()), 100u);
  EXPECT_EQ(mm_system::swap_entries(*task->mm()), 0u);
}

TEST_F(SwapReleaseTest, SwapOutBeyondTheFreeSlotsThrowsAndChangesNothing) {
  mm_system kernel({.swap_slots = 50});
  auto task = kernel.spawn(100);
  EXPECT_EQ(kernel.swap_out(*task->mm(), 30), 30u);
  EXPECT_THROW((void)kernel.swap_out(*task->mm(), 30), std::length_error);
  EXPECT_EQ(teardown::model::get_mm_rss(*task->mm()), 70u);
  EXPECT_EQ(mm_system::swap_entries(*task->mm()), 30u);
  EXPECT_EQ(kernel.swap_device()->used(), 30u);
  (void)task->exit();
  expect_swap_all_free(kernel);
}

TEST_F(SwapReleaseTest, SwapSpaceCountsASecondFreeInsteadOfWrapping) {
  swap_space device(4);
  std::vector<std::uint32_t> slots;
  device.allocate(2, slots);
  ASSERT_EQ(slots.size(), 2u);
  EXPECT_NE(slots[0], slots[1]);
  device.free(slots[0]);
  device.free(slots[0]);
  EXPECT_EQ(device.double_frees(), 1u);
  EXPECT_EQ(device.uses(slots[0]), 0u);
  EXPECT_EQ(device.used(), 1u);
  device.allocate(3, slots);
  EXPECT_EQ(device.used(), 4u) << "freed slots are found again";
  EXPECT_THROW(device.allocate(1, slots), std::length_error);
}

// --- where the entries are released ------------------------------------------------------------

TEST_F(SwapReleaseTest, ExitingTaskHandsItsEntriesToTheWorkerInPageSizedBatches) {
  mm_system kernel(with_swap(1));
  auto task = swapped_task(kernel, 3000);
  EXPECT_EQ(task->exit(), decision::inline_disabled);
  kernel.flush();
  const swap_release_stats s = kernel.stats().swap;
  EXPECT_EQ(s.batches, 3u) << "1016 + 1016 + 968";
  EXPECT_EQ(s.batched, 3000u);
  EXPECT_EQ(s.inline_entries, 0u);
  EXPECT_EQ(s.queued, 3u) << "one put_chain of three batches";
  EXPECT_EQ(s.released, 3u);
  expect_swap_all_free(kernel);
}

TEST_F(SwapReleaseTest, FewerThanSwapClusterMaxEntriesAreReleasedInline) {
  mm_system kernel(with_swap(1));
  auto task = swapped_task(kernel, mm_system::swap_cluster_max - 1);
  (void)task->exit();
  const swap_release_stats s = kernel.stats().swap;
  EXPECT_EQ(s.batches, 0u);
  EXPECT_EQ(s.inline_entries, mm_system::swap_cluster_max - 1);
  expect_swap_all_free(kernel);
}

TEST_F(SwapReleaseTest, ALoneExitUnderTheDefaultGateReleasesInline) {
  mm_system kernel(with_swap(2));  // NR_MIN_EXITING_PROCESSES
  auto task = swapped_task(kernel, 3000);
  (void)task->exit();
  const swap_release_stats s = kernel.stats().swap;
  EXPECT_EQ(s.batches, 0u);
  EXPECT_EQ(s.inline_entries, 3000u);
  expect_swap_all_free(kernel);
}

// Two final exits in flight: one blocked in exit_aio (its mm queues: it is above the threshold),
// the other torn down on its own thread (below it) while the first still runs.
TEST_F(SwapReleaseTest, AnExitOverlappingAnotherHandsItsEntriesToTheWorker) {
  mm_system kernel({.async_mm_teardown = true, .thresh_pages = 10'000, .swap_slots = 1 << 16, .swap_min_exiting = 2});
  auto blocked = kernel.spawn(20'000);
  mm_struct& blocked_mm = *blocked->mm();
  mm_system::mmgrab(blocked_mm);
  ASSERT_TRUE(blocked_mm.aio.submit());
  std::thread exiting([&] { EXPECT_EQ(blocked->exit(), decision::queued); });
  while (blocked_mm.aio.exit_calls() == 0) std::this_thread::yield();  // in exit_aio: in flight

  auto task = swapped_task(kernel, 2000);
  EXPECT_EQ(task->exit(), decision::inline_ineligible);
  blocked_mm.aio.complete();
  exiting.join();
  kernel.flush();
  const swap_release_stats s = kernel.stats().swap;
  EXPECT_EQ(s.batches, 2u);
  EXPECT_EQ(s.batched, 2000u);
  EXPECT_EQ(s.inline_entries, 0u);
  expect_swap_all_free(kernel);
  mm_system::mmdrop(blocked_mm);
}

TEST_F(SwapReleaseTest, TeardownOnTheMmReaperReleasesItsEntriesThere) {
  mm_system kernel({.async_mm_teardown = true, .thresh_pages = 0, .swap_slots = 1 << 16, .swap_min_exiting = 1});
  auto task = swapped_task(kernel, 3000);
  EXPECT_EQ(task->exit(), decision::queued);
  kernel.flush();
  const swap_release_stats s = kernel.stats().swap;
  EXPECT_EQ(s.batches, 0u) << "the mm_reaper is not an exiting task";
  EXPECT_EQ(s.inline_entries, 3000u);
  expect_swap_all_free(kernel);
}

TEST_F(SwapReleaseTest, PlainMmputReleasesInline) {
  mm_system kernel(with_swap(1));
  mm_struct* mm = kernel.mm_alloc(3010);
  EXPECT_EQ(kernel.swap_out(*mm, 3000), 3000u);
  kernel.mmput(*mm);
  EXPECT_EQ(kernel.stats().swap.batches, 0u);
  EXPECT_EQ(kernel.stats().swap.inline_entries, 3000u);
  expect_swap_all_free(kernel);
}

TEST_F(SwapReleaseTest, ToggleOffReleasesInlineAndTheKnobReadsAndWritesIt) {
  mm_system kernel(with_swap(1));
  EXPECT_EQ(kernel.get("vm.swap_async_release"), "1") << "on by default, as in the seed";
  kernel.set("vm.swap_async_release", "0\n");
  EXPECT_FALSE(kernel.swap_async_release());
  EXPECT_THROW(kernel.set("vm.swap_async_release", "2"), std::invalid_argument);
  EXPECT_EQ(kernel.get("vm.swap_async_release"), "0");
  auto task = swapped_task(kernel, 3000);
  (void)task->exit();
  EXPECT_EQ(kernel.stats().swap.batches, 0u);
  EXPECT_EQ(kernel.stats().swap.inline_entries, 3000u);
  expect_swap_all_free(kernel);
}

TEST_F(SwapReleaseTest, SwapMinExitingOfZeroIsRefusedAndChangesNothing) {
  EXPECT_THROW(mm_system({.swap_slots = 10, .swap_min_exiting = 0}), std::invalid_argument);
  mm_system kernel(with_swap(3));
  EXPECT_THROW(kernel.set_swap_min_exiting(0), std::invalid_argument);
  EXPECT_EQ(kernel.swap_min_exiting(), 3u);
}

// --- batch allocation failing -----------------------------------------------------------------

TEST_F(SwapReleaseTest, FailedBatchAllocationQueuesTheBatchesBuiltAndReleasesTheRestInline) {
  mm_system kernel(with_swap(1));
  kernel.set_swap_batch_allocator(failing_allocator);
  failing.reset(0, 2);  // the second allocation fails
  auto task = swapped_task(kernel, 3000);
  (void)task->exit();
  kernel.flush();
  const swap_release_stats s = kernel.stats().swap;
  EXPECT_EQ(s.alloc_failures, 1u);
  EXPECT_EQ(s.batches, 1u);
  EXPECT_EQ(s.batched, swap_batch::capacity);
  EXPECT_EQ(s.inline_entries, 3000u - swap_batch::capacity);
  EXPECT_EQ(s.queued, 1u);
  EXPECT_EQ(s.released, 1u);
  expect_swap_all_free(kernel);
}

TEST_F(SwapReleaseTest, FailedFirstAllocationReleasesEverythingInline) {
  mm_system kernel(with_swap(1));
  kernel.set_swap_batch_allocator(failing_allocator);
  failing.reset(0, 1);
  auto task = swapped_task(kernel, 3000);
  (void)task->exit();
  const swap_release_stats s = kernel.stats().swap;
  EXPECT_EQ(s.alloc_failures, 1u);
  EXPECT_EQ(s.batches, 0u);
  EXPECT_EQ(s.queued + s.sync, 0u) << "nothing to put";
  EXPECT_EQ(s.inline_entries, 3000u);
  expect_swap_all_free(kernel);
}

TEST_F(SwapReleaseTest, BatchesBuiltAfterShutdownAreReleasedInlineAtOnce) {
  mm_system kernel(with_swap(1));
  kernel.set_swap_batch_allocator(failing_allocator);
  kernel.stop();
  auto task = swapped_task(kernel, 3000);
  (void)task->exit();
  const swap_release_stats s = kernel.stats().swap;
  EXPECT_EQ(s.batches, 3u);
  EXPECT_EQ(s.sync, 3u) << "put_chain after shutdown: decision::inline_stopped";
  EXPECT_EQ(s.released, 3u);
  expect_swap_all_free(kernel);
}

// --- stress ------------------------------------------------------------------------------------

// Exits on many threads at once, racing the worker, every third batch allocation failing:
// every swap entry is released exactly once and every page freed. (The gate is off here so
// that every exit gathers; the stress matrix runs the gated kill storm.)
TEST_F(SwapReleaseStressTest, ConcurrentExitsWithFailingAllocationsReleaseEveryEntryOnce) {
  // Room for every entry at once: the worker may lag behind all the exits (the seed review's
  // "higher peak usage"), and a full device would make swap_out throw on a producer thread.
  mm_system_options opts = with_swap(1);
  opts.swap_slots = std::size_t{1} << 20;
  mm_system kernel(std::move(opts));
  kernel.set_swap_batch_allocator(failing_allocator);
  failing.reset(3, 0);
  const std::size_t threads = 4;
  const std::size_t exits_per_thread = scaled(40);  // at most 4 x 40 x 2600 = 416000 entries
  std::vector<std::thread> exiting;
  std::atomic<std::uint64_t> swapped{0};
  for (std::size_t t = 0; t < threads; ++t) {
    exiting.emplace_back([&, t] {
      for (std::size_t i = 0; i < exits_per_thread; ++i) {
        const std::uint64_t entries = 100 + (t * 7919 + i * 104729) % 2500;
        auto task = kernel.spawn(entries + 1);
        kernel.swap_out(*task->mm(), entries);
        swapped.fetch_add(entries);
        (void)task->exit();
      }
    });
  }
  for (std::thread& t : exiting) t.join();
  kernel.flush();
  const swap_release_stats s = kernel.stats().swap;
  EXPECT_EQ(s.batched + s.inline_entries, swapped.load()) << "each entry counted once";
  EXPECT_GT(s.batches, 0u);
  EXPECT_GT(s.alloc_failures, 0u);
  EXPECT_EQ(s.released, s.batches);
  EXPECT_EQ(s.queued + s.sync, s.batches);
  expect_swap_all_free(kernel);
}

}  // namespace
}  // namespace teardown_test

namespace teardown_test {
namespace {

// --- the allocator's lifetime --------------------------------------------------------------------

// set_swap_batch_allocator keeps only the allocator's address, so a temporary would dangle as
// soon as the call returns (ASan: stack-use-after-scope at the next exit): it must not compile.
template <class System>
concept accepts_a_temporary_allocator = requires(System& kernel) {
  kernel.set_swap_batch_allocator(swap_batch_allocator{nullptr, nullptr});
};
template <class System>
concept accepts_a_named_allocator = requires(System& kernel, const swap_batch_allocator& allocator) {
  kernel.set_swap_batch_allocator(allocator);
};

TEST(SwapBatchAllocatorTest, ATemporaryAllocatorDoesNotCompileANamedOneDoes) {
  static_assert(!accepts_a_temporary_allocator<mm_system>);
  static_assert(!accepts_a_temporary_allocator<teardown::model::pooled_mm_system>);
  static_assert(accepts_a_named_allocator<mm_system>);
  static_assert(accepts_a_named_allocator<teardown::model::pooled_mm_system>);
  SUCCEED();
}

}  // namespace
}  // namespace teardown_test
