// Specification of teardown::budget (add-then-check) and teardown::exact_budget (read, check,
// CAS), and of the RAII reservation they hand out. Everything the two policies share is a typed
// test run on both. The many-thread cap invariant is the BudgetStressTest suite at the end:
// bounded by iteration counts, never by time, and smaller under sanitizers (scaled()).
#include "teardown/budget.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <latch>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "test_support.hpp"

namespace teardown_test {
namespace {

using teardown::budget;
using teardown::exact_budget;

constexpr std::uint64_t max_cap = budget::max_cap;
constexpr std::uint64_t two_to_the_32 = std::uint64_t{1} << 32;
constexpr std::uint64_t uint64_max = std::numeric_limits<std::uint64_t>::max();

// --- Compile-time contract -------------------------------------------------------------------

static_assert(budget::max_cap >= (std::uint64_t{1} << 48), "the contract: max_cap >= 2^48");
static_assert(exact_budget::max_cap == budget::max_cap);
static_assert(!std::is_copy_constructible_v<budget> && !std::is_copy_assignable_v<budget>);
static_assert(!std::is_copy_constructible_v<exact_budget> &&
              !std::is_copy_assignable_v<exact_budget>);
static_assert(!std::is_convertible_v<std::uint64_t, budget>, "the constructor is explicit");
static_assert(noexcept(std::declval<budget&>().try_reserve(1)));
static_assert(noexcept(std::declval<budget&>().release(1)));
static_assert(noexcept(std::declval<budget&>().reserve(1)));
static_assert(noexcept(std::declval<const budget&>().pending()));
static_assert(noexcept(std::declval<const budget&>().cap()));
static_assert(noexcept(std::declval<const budget&>().rejected()));
static_assert(std::is_same_v<decltype(std::declval<budget&>().reserve(1)), teardown::reservation>);
static_assert(std::is_same_v<decltype(std::declval<exact_budget&>().reserve(1)),
                             teardown::exact_reservation>);
static_assert(!std::is_copy_constructible_v<teardown::reservation>);
static_assert(!std::is_copy_assignable_v<teardown::reservation>);
static_assert(std::is_nothrow_move_constructible_v<teardown::reservation>);
static_assert(std::is_nothrow_move_assignable_v<teardown::reservation>);
static_assert(std::is_nothrow_default_constructible_v<teardown::reservation>);
static_assert(!std::is_convertible_v<teardown::reservation, bool>, "operator bool is explicit");

// --- Shared behaviour, on both policies --------------------------------------------------------

using budget_types = ::testing::Types<budget, exact_budget>;

// The reservation type a budget hands out.
template <class Budget>
using reservation_of = decltype(std::declval<Budget&>().reserve(0));

template <class Budget>
class BudgetTest : public ::testing::Test {};

TYPED_TEST_SUITE(BudgetTest, budget_types);

TYPED_TEST(BudgetTest, StartsWithNothingPendingAndTheGivenCap) {
  TypeParam pages(100);
  EXPECT_EQ(pages.pending(), 0u);
  EXPECT_EQ(pages.cap(), 100u);
  EXPECT_EQ(pages.rejected(), 0u);
  EXPECT_EQ(pages.high_water(), 0u);
}

TYPED_TEST(BudgetTest, ReserveThatFitsChargesPending) {
  TypeParam pages(100);
  EXPECT_TRUE(pages.try_reserve(30));
  EXPECT_EQ(pages.pending(), 30u);
  EXPECT_TRUE(pages.try_reserve(25));
  EXPECT_EQ(pages.pending(), 55u);
}

TYPED_TEST(BudgetTest, ReservesThatFillTheCapExactlySucceed) {
  TypeParam pages(100);
  EXPECT_TRUE(pages.try_reserve(60));
  EXPECT_TRUE(pages.try_reserve(40));
  EXPECT_EQ(pages.pending(), 100u);
  EXPECT_EQ(pages.rejected(), 0u);
}

TYPED_TEST(BudgetTest, ReserveThatWouldPassTheCapFailsAndLeavesPendingUnchanged) {
  TypeParam pages(100);
  ASSERT_TRUE(pages.try_reserve(60));
  EXPECT_FALSE(pages.try_reserve(41));
  EXPECT_EQ(pages.pending(), 60u);
  EXPECT_EQ(pages.rejected(), 1u);
}

TYPED_TEST(BudgetTest, ReleaseReturnsExactlyTheCharge) {
  TypeParam pages(100);
  ASSERT_TRUE(pages.try_reserve(30));
  ASSERT_TRUE(pages.try_reserve(20));
  pages.release(30);
  EXPECT_EQ(pages.pending(), 20u);
  pages.release(20);
  EXPECT_EQ(pages.pending(), 0u);
}

TYPED_TEST(BudgetTest, ReleasedRoomCanBeReservedAgain) {
  TypeParam pages(100);
  ASSERT_TRUE(pages.try_reserve(100));
  ASSERT_FALSE(pages.try_reserve(1));
  pages.release(100);
  EXPECT_TRUE(pages.try_reserve(100));
  EXPECT_EQ(pages.pending(), 100u);
}

TYPED_TEST(BudgetTest, ZeroReserveSucceedsAndChargesNothingEvenWhenFull) {
  TypeParam pages(100);
  ASSERT_TRUE(pages.try_reserve(100));
  EXPECT_TRUE(pages.try_reserve(0));
  EXPECT_EQ(pages.pending(), 100u);
  EXPECT_EQ(pages.rejected(), 0u);
}

TYPED_TEST(BudgetTest, ZeroReserveSucceedsOnAZeroCap) {
  TypeParam pages(0);
  EXPECT_TRUE(pages.try_reserve(0));
  EXPECT_EQ(pages.pending(), 0u);
  EXPECT_EQ(pages.rejected(), 0u);
}

TYPED_TEST(BudgetTest, ZeroCapAdmitsNothingPositive) {
  TypeParam pages(0);
  EXPECT_FALSE(pages.try_reserve(1));
  EXPECT_EQ(pages.pending(), 0u);
  EXPECT_EQ(pages.rejected(), 1u);
}

TYPED_TEST(BudgetTest, ReserveLargerThanTheCapFailsWithoutTouchingPending) {
  TypeParam pages(100);
  ASSERT_TRUE(pages.try_reserve(10));
  EXPECT_FALSE(pages.try_reserve(101));
  EXPECT_EQ(pages.pending(), 10u);
  EXPECT_EQ(pages.rejected(), 1u);
  EXPECT_TRUE(pages.try_reserve(90)) << "a failed oversized reserve must leave the room intact";
}

TYPED_TEST(BudgetTest, HugeReservesFailCleanly) {
  TypeParam pages(1000);
  ASSERT_TRUE(pages.try_reserve(400));
  const std::uint64_t huge[] = {uint64_max,        uint64_max - 399, std::uint64_t{1} << 63,
                                max_cap + 1,       max_cap,          max_cap - 1,
                                two_to_the_32 + 1, two_to_the_32,    1001};
  for (const std::uint64_t n : huge) {
    EXPECT_FALSE(pages.try_reserve(n)) << "n = " << n;
    EXPECT_EQ(pages.pending(), 400u) << "n = " << n;
  }
  EXPECT_EQ(pages.rejected(), std::size(huge));
  EXPECT_TRUE(pages.try_reserve(600)) << "the budget still works after huge reserves";
}

TYPED_TEST(BudgetTest, CapOfMaxCapIsAccepted) {
  TypeParam pages(max_cap);
  EXPECT_EQ(pages.cap(), max_cap);
}

TYPED_TEST(BudgetTest, ReserveOfMaxCapFitsAnEmptyMaxCapBudget) {
  TypeParam pages(max_cap);
  EXPECT_TRUE(pages.try_reserve(max_cap));
  EXPECT_EQ(pages.pending(), max_cap);
  EXPECT_FALSE(pages.try_reserve(1));
  pages.release(max_cap);
  EXPECT_EQ(pages.pending(), 0u);
}

TYPED_TEST(BudgetTest, HugeReservesFailCleanlyAgainstAMaxCapBudget) {
  TypeParam pages(max_cap);
  ASSERT_TRUE(pages.try_reserve(12345));
  for (const std::uint64_t n : {uint64_max, uint64_max - 12344, std::uint64_t{1} << 63, max_cap + 1,
                                max_cap, max_cap - 12344}) {
    EXPECT_FALSE(pages.try_reserve(n)) << "n = " << n;
    EXPECT_EQ(pages.pending(), 12345u) << "n = " << n;
  }
  EXPECT_TRUE(pages.try_reserve(max_cap - 12345)) << "exactly the room left still fits";
  EXPECT_EQ(pages.pending(), max_cap);
}

// Charges on either side of 2^32, where add_then_check switches from a blind add to a CAS.
TYPED_TEST(BudgetTest, ReservesAroundTwoToThe32AreChargedExactly) {
  TypeParam pages(std::uint64_t{1} << 34);
  ASSERT_TRUE(pages.try_reserve(two_to_the_32 - 1));
  ASSERT_TRUE(pages.try_reserve(two_to_the_32));
  ASSERT_TRUE(pages.try_reserve(two_to_the_32 + 1));
  EXPECT_EQ(pages.pending(), 3 * two_to_the_32);
  EXPECT_FALSE(pages.try_reserve(two_to_the_32 + 1)) << "one past the cap";
  EXPECT_EQ(pages.pending(), 3 * two_to_the_32);
  EXPECT_TRUE(pages.try_reserve(two_to_the_32));
  EXPECT_EQ(pages.pending(), std::uint64_t{1} << 34);
}

TYPED_TEST(BudgetTest, ConstructorRejectsACapAboveMaxCap) {
  EXPECT_THROW(TypeParam{max_cap + 1}, std::invalid_argument);
  EXPECT_THROW(TypeParam{uint64_max}, std::invalid_argument);
}

TYPED_TEST(BudgetTest, CapErrorNamesTheLimit) {
  try {
    TypeParam pages(max_cap + 1);
    FAIL() << "the constructor accepted max_cap + 1";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("max_cap"), std::string::npos) << error.what();
  }
}

TYPED_TEST(BudgetTest, SetCapRejectsACapAboveMaxCapAndChangesNothing) {
  TypeParam pages(100);
  ASSERT_TRUE(pages.try_reserve(40));
  EXPECT_THROW(pages.set_cap(max_cap + 1), std::invalid_argument);
  EXPECT_THROW(pages.set_cap(uint64_max), std::invalid_argument);
  EXPECT_EQ(pages.cap(), 100u);
  EXPECT_EQ(pages.pending(), 40u);
  EXPECT_FALSE(pages.try_reserve(61)) << "the old cap still binds";
  EXPECT_TRUE(pages.try_reserve(60));
}

TYPED_TEST(BudgetTest, SetCapAcceptsMaxCap) {
  TypeParam pages(100);
  pages.set_cap(max_cap);
  EXPECT_EQ(pages.cap(), max_cap);
  EXPECT_TRUE(pages.try_reserve(max_cap));
}

TYPED_TEST(BudgetTest, RaisingTheCapAdmitsMore) {
  TypeParam pages(100);
  ASSERT_TRUE(pages.try_reserve(100));
  ASSERT_FALSE(pages.try_reserve(50));
  pages.set_cap(150);
  EXPECT_TRUE(pages.try_reserve(50));
  EXPECT_EQ(pages.pending(), 150u);
}

TYPED_TEST(BudgetTest, LoweringTheCapBelowPendingAdmitsNothingNew) {
  TypeParam pages(100);
  ASSERT_TRUE(pages.try_reserve(80));
  pages.set_cap(50);
  EXPECT_EQ(pages.pending(), 80u) << "lowering the cap releases nothing";
  EXPECT_FALSE(pages.try_reserve(1));
  EXPECT_TRUE(pages.try_reserve(0));
  pages.release(20);  // 60 pending, still above 50
  EXPECT_FALSE(pages.try_reserve(1));
  pages.release(10);  // 50 pending: at the cap, not below it
  EXPECT_FALSE(pages.try_reserve(1));
  EXPECT_EQ(pages.pending(), 50u);
}

TYPED_TEST(BudgetTest, AfterLoweringTheCapReservesResumeOncePendingDropsBelowIt) {
  TypeParam pages(100);
  ASSERT_TRUE(pages.try_reserve(80));
  pages.set_cap(50);
  ASSERT_FALSE(pages.try_reserve(1));
  pages.release(40);  // 40 pending, 10 below the new cap
  EXPECT_FALSE(pages.try_reserve(11)) << "the new cap, not the old one, binds";
  EXPECT_TRUE(pages.try_reserve(10));
  EXPECT_EQ(pages.pending(), 50u);
}

TYPED_TEST(BudgetTest, LoweringTheCapToZeroAdmitsOnlyZero) {
  TypeParam pages(100);
  ASSERT_TRUE(pages.try_reserve(10));
  pages.set_cap(0);
  EXPECT_FALSE(pages.try_reserve(1));
  EXPECT_TRUE(pages.try_reserve(0));
  pages.release(10);
  EXPECT_FALSE(pages.try_reserve(1));
  EXPECT_EQ(pages.pending(), 0u);
}

TYPED_TEST(BudgetTest, RejectedCountsEveryFailedReserveAndNothingElse) {
  TypeParam pages(100);
  ASSERT_TRUE(pages.try_reserve(90));           // success: not counted
  ASSERT_TRUE(pages.try_reserve(0));            // zero: not counted
  EXPECT_FALSE(pages.try_reserve(11));          // does not fit
  EXPECT_FALSE(pages.try_reserve(101));         // larger than the cap
  EXPECT_FALSE(pages.try_reserve(uint64_max));  // huge
  EXPECT_EQ(pages.rejected(), 3u);
  pages.release(90);
  EXPECT_EQ(pages.rejected(), 3u) << "releasing does not reset the count";
}

TYPED_TEST(BudgetTest, HighWaterIsTheHighestPendingASuccessfulReserveReached) {
  TypeParam pages(100);
  ASSERT_TRUE(pages.try_reserve(30));
  ASSERT_TRUE(pages.try_reserve(40));
  EXPECT_EQ(pages.high_water(), 70u);
  pages.release(40);
  EXPECT_EQ(pages.high_water(), 70u) << "a release does not lower the high water";
  ASSERT_TRUE(pages.try_reserve(10));
  EXPECT_EQ(pages.high_water(), 70u);
}

TYPED_TEST(BudgetTest, HighWaterIgnoresFailedReserves) {
  TypeParam pages(100);
  ASSERT_TRUE(pages.try_reserve(60));
  ASSERT_FALSE(pages.try_reserve(50));
  ASSERT_FALSE(pages.try_reserve(uint64_max));
  EXPECT_EQ(pages.high_water(), 60u);
}

TYPED_TEST(BudgetTest, ResetHighWaterStartsTheRecordOver) {
  TypeParam pages(100);
  ASSERT_TRUE(pages.try_reserve(70));
  pages.release(30);
  pages.reset_high_water();
  EXPECT_EQ(pages.high_water(), 0u);
  EXPECT_EQ(pages.pending(), 40u) << "resetting the record touches nothing else";
  ASSERT_TRUE(pages.try_reserve(5));
  EXPECT_EQ(pages.high_water(), 45u);
}

// A model of the budget: every reserve decided against the exact pending must come out the
// same way. Single-threaded, neither policy may reject a reserve that fits (add_then_check can
// over-reject only when another thread's failing reserve inflates the counter).
TYPED_TEST(BudgetTest, SingleThreadedReserveThatFitsIsNeverRejected) {
  constexpr std::uint64_t cap = 5 * two_to_the_32;
  TypeParam pages(cap);
  std::mt19937_64 random(20240611);
  std::vector<std::uint64_t> held;
  std::uint64_t model_pending = 0;
  std::uint64_t model_rejected = 0;
  for (std::size_t step = 0; step < scaled(20000); ++step) {
    if (!held.empty() && random() % 3 == 0) {
      const std::size_t which = random() % held.size();
      pages.release(held[which]);
      model_pending -= held[which];
      held[which] = held.back();
      held.pop_back();
    } else {
      // Small (blind add), large (CAS route) and oversized amounts.
      const std::uint64_t n =
          random() % 2 == 0 ? random() % two_to_the_32 : random() % (cap + cap / 4);
      const bool fits = model_pending + n <= cap;
      ASSERT_EQ(pages.try_reserve(n), fits)
          << "step " << step << ": n = " << n << ", pending = " << model_pending;
      if (fits) {
        model_pending += n;
        held.push_back(n);
      } else {
        ++model_rejected;
      }
    }
    ASSERT_EQ(pages.pending(), model_pending) << "step " << step;
  }
  EXPECT_EQ(pages.rejected(), model_rejected);
}

// --- The RAII reservation ----------------------------------------------------------------------

TYPED_TEST(BudgetTest, ReservationHoldsItsChargeUntilDestroyed) {
  TypeParam pages(100);
  {
    auto charge = pages.reserve(30);
    EXPECT_TRUE(charge);
    EXPECT_EQ(charge.amount(), 30u);
    EXPECT_EQ(pages.pending(), 30u);
  }
  EXPECT_EQ(pages.pending(), 0u);
}

TYPED_TEST(BudgetTest, FailedReservationIsFalseAndReleasesNothing) {
  TypeParam pages(100);
  auto held = pages.reserve(95);
  ASSERT_TRUE(held);
  {
    auto charge = pages.reserve(10);
    EXPECT_FALSE(charge);
    EXPECT_EQ(charge.amount(), 0u);
    EXPECT_EQ(pages.rejected(), 1u);
  }
  EXPECT_EQ(pages.pending(), 95u);
}

TYPED_TEST(BudgetTest, ReservationLargerThanTheCapIsFalse) {
  TypeParam pages(100);
  auto charge = pages.reserve(uint64_max);
  EXPECT_FALSE(charge);
  EXPECT_EQ(pages.pending(), 0u);
}

TYPED_TEST(BudgetTest, ZeroReservationIsTrueAndChargesNothing) {
  TypeParam pages(0);
  {
    auto charge = pages.reserve(0);
    EXPECT_TRUE(charge);
    EXPECT_EQ(charge.amount(), 0u);
    EXPECT_EQ(pages.pending(), 0u);
  }
  EXPECT_EQ(pages.pending(), 0u);
}

TYPED_TEST(BudgetTest, DefaultReservationHoldsNothing) {
  reservation_of<TypeParam> nothing;
  EXPECT_FALSE(nothing);
  EXPECT_EQ(nothing.amount(), 0u);
  nothing.reset();
  EXPECT_EQ(nothing.detach(), 0u);
}

TYPED_TEST(BudgetTest, MovingAReservationTransfersTheChargeWhichIsReleasedOnce) {
  TypeParam pages(100);
  auto other = pages.reserve(50);  // a second holder, so that a double release would show
  {
    auto first = pages.reserve(30);
    {
      auto second = std::move(first);
      EXPECT_FALSE(first);  // NOLINT(bugprone-use-after-move): the moved-from state is specified
      EXPECT_EQ(first.amount(), 0u);  // NOLINT(bugprone-use-after-move)
      EXPECT_TRUE(second);
      EXPECT_EQ(second.amount(), 30u);
      EXPECT_EQ(pages.pending(), 80u);
    }
    EXPECT_EQ(pages.pending(), 50u) << "the new owner released the charge";
  }
  EXPECT_EQ(pages.pending(), 50u) << "the moved-from reservation released nothing";
}

TYPED_TEST(BudgetTest, MoveAssignmentReleasesTheOldChargeAndTakesTheNewOne) {
  TypeParam pages(100);
  auto target = pages.reserve(10);
  auto source = pages.reserve(20);
  ASSERT_EQ(pages.pending(), 30u);
  target = std::move(source);
  EXPECT_EQ(pages.pending(), 20u);
  EXPECT_TRUE(target);
  EXPECT_EQ(target.amount(), 20u);
  EXPECT_FALSE(source);  // NOLINT(bugprone-use-after-move)
  target.reset();
  EXPECT_EQ(pages.pending(), 0u);
}

TYPED_TEST(BudgetTest, SelfMoveAssignmentKeepsTheCharge) {
  TypeParam pages(100);
  auto charge = pages.reserve(30);
  auto& same = charge;  // through a reference, so that no compiler warns about the self-move
  charge = std::move(same);
  EXPECT_TRUE(charge);
  EXPECT_EQ(charge.amount(), 30u);
  EXPECT_EQ(pages.pending(), 30u);
}

TYPED_TEST(BudgetTest, DetachHandsTheChargeOverWithoutReleasingIt) {
  TypeParam pages(100);
  std::uint64_t owned = 0;
  {
    auto charge = pages.reserve(30);
    owned = charge.detach();
    EXPECT_FALSE(charge);
    EXPECT_EQ(charge.amount(), 0u);
  }
  EXPECT_EQ(owned, 30u);
  EXPECT_EQ(pages.pending(), 30u) << "the charge stays until released by hand";
  pages.release(owned);
  EXPECT_EQ(pages.pending(), 0u);
}

TYPED_TEST(BudgetTest, ResetReleasesTheChargeNowAndOnlyOnce) {
  TypeParam pages(100);
  auto other = pages.reserve(50);
  {
    auto charge = pages.reserve(30);
    charge.reset();
    EXPECT_FALSE(charge);
    EXPECT_EQ(charge.amount(), 0u);
    EXPECT_EQ(pages.pending(), 50u);
    charge.reset();
    EXPECT_EQ(pages.pending(), 50u);
  }
  EXPECT_EQ(pages.pending(), 50u);
}

// --- Debug checks ------------------------------------------------------------------------------

template <class Budget>
class BudgetDeathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // "threadsafe" re-executes the binary instead of forking a process that may hold other
    // threads' locks, which ThreadSanitizer warns about.
    GTEST_FLAG_SET(death_test_style, "threadsafe");
#ifdef NDEBUG
    GTEST_SKIP() << "the budget's release check is an assert, compiled out by NDEBUG";
#elif !GTEST_HAS_DEATH_TEST
    GTEST_SKIP() << "this platform has no death tests";
#endif
  }
};

TYPED_TEST_SUITE(BudgetDeathTest, budget_types);

TYPED_TEST(BudgetDeathTest, ReleasingMoreThanIsPendingAborts) {
  TypeParam pages(100);
  ASSERT_TRUE(pages.try_reserve(10));
  EXPECT_DEATH(pages.release(11), "releasing more than is pending");
}

// --- Many threads ------------------------------------------------------------------------------

template <class Budget>
class BudgetStressTest : public ::testing::Test {
 protected:
  static constexpr unsigned threads = 8;
  static constexpr std::size_t most_held_per_thread = 4;

  struct outcome {
    std::uint64_t admitted = 0;
    std::uint64_t failed = 0;
  };

  // Each thread reserves amounts drawn by `amount` (given the thread's generator) and holds up to
  // most_held_per_thread charges, releasing one at random when full or on a coin toss. Even
  // threads use try_reserve/release, odd threads RAII reservations. `committed` is the sum of
  // the charges the threads hold: raised just after each successful reserve and lowered just
  // before each release, so it lags what the budget has admitted and must never exceed the cap.
  // Its RMWs are acq_rel to keep them in program order with the budget's relaxed RMWs on weakly
  // ordered hardware; the C++ model itself gives no happens-before through a relaxed counter, so
  // there the check leans on the hardware (on x86-64 every RMW is a full barrier anyway).
  static void storm(std::uint64_t cap, std::size_t steps_per_thread,
                    const std::function<std::uint64_t(std::mt19937_64&)>& amount) {
    Budget pages(cap);
    std::atomic<std::uint64_t> committed{0};
    std::atomic<bool> over_cap{false};
    std::atomic<std::uint64_t> worst{0};
    std::vector<outcome> outcomes(threads);
    std::latch start(threads);
    std::vector<std::thread> workers;
    for (unsigned index = 0; index < threads; ++index) {
      workers.emplace_back([&, index] {
        std::mt19937_64 random(7919 * (index + 1));
        outcome& mine = outcomes[index];
        const bool raii = index % 2 == 1;
        std::vector<std::uint64_t> held;
        std::vector<reservation_of<Budget>> held_raii;
        const auto note_committed = [&](std::uint64_t n) {
          const std::uint64_t now = committed.fetch_add(n, std::memory_order_acq_rel) + n;
          if (now > cap) {
            over_cap.store(true, std::memory_order_relaxed);
            std::uint64_t seen = worst.load(std::memory_order_relaxed);
            while (now > seen &&
                   !worst.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
            }
          }
        };
        const auto release_one = [&] {
          if (raii) {
            const std::size_t which = random() % held_raii.size();
            committed.fetch_sub(held_raii[which].amount(), std::memory_order_acq_rel);
            held_raii[which].reset();
            std::swap(held_raii[which], held_raii.back());
            held_raii.pop_back();
          } else {
            const std::size_t which = random() % held.size();
            committed.fetch_sub(held[which], std::memory_order_acq_rel);
            pages.release(held[which]);
            held[which] = held.back();
            held.pop_back();
          }
        };
        start.arrive_and_wait();
        for (std::size_t step = 0; step < steps_per_thread; ++step) {
          const std::size_t holding = raii ? held_raii.size() : held.size();
          if (holding == most_held_per_thread || (holding > 0 && random() % 3 == 0)) {
            release_one();
            continue;
          }
          const std::uint64_t n = amount(random);
          if (raii) {
            auto charge = pages.reserve(n);
            if (!charge) {
              ++mine.failed;
              continue;
            }
            note_committed(n);
            ++mine.admitted;
            held_raii.push_back(std::move(charge));
          } else {
            if (!pages.try_reserve(n)) {
              ++mine.failed;
              continue;
            }
            note_committed(n);
            ++mine.admitted;
            held.push_back(n);
          }
        }
        while (!held.empty() || !held_raii.empty()) release_one();
      });
    }
    for (auto& worker : workers) worker.join();

    EXPECT_FALSE(over_cap.load()) << "committed reached " << worst.load() << " over a cap of "
                                  << cap;
    EXPECT_EQ(pages.pending(), 0u);
    EXPECT_EQ(committed.load(), 0u);
    EXPECT_LE(pages.high_water(), cap);
    std::uint64_t admitted = 0;
    std::uint64_t failed = 0;
    for (const outcome& each : outcomes) {
      admitted += each.admitted;
      failed += each.failed;
    }
    EXPECT_EQ(pages.rejected(), failed) << "every failed reserve counted once";
    EXPECT_GT(admitted, 0u) << "the storm admitted nothing: it tested nothing";
    EXPECT_GT(failed, 0u) << "the storm never reached the cap: it tested nothing";
  }

  static std::uint64_t between(std::mt19937_64& random, std::uint64_t low, std::uint64_t high) {
    return std::uniform_int_distribution<std::uint64_t>(low, high)(random);
  }
};

TYPED_TEST_SUITE(BudgetStressTest, budget_types);

// Small amounts against a tight cap: the counter sits at the cap most of the time, so most
// reserves race a failing one.
TYPED_TEST(BudgetStressTest, CommittedChargeNeverExceedsATightCap) {
  TestFixture::storm(64, scaled(100000),
                     [](std::mt19937_64& random) { return TestFixture::between(random, 0, 24); });
}

// Every size class at once: zero, blind adds (<= 2^32), CAS-route amounts (> 2^32, <= cap)
// and amounts past the cap up to UINT64_MAX.
TYPED_TEST(BudgetStressTest, CommittedChargeNeverExceedsTheCapWithAmountsOfEverySize) {
  constexpr std::uint64_t cap = 3 * two_to_the_32 + 7;
  TestFixture::storm(cap, scaled(100000), [](std::mt19937_64& random) -> std::uint64_t {
    switch (random() % 10) {
      case 0:
        return 0;
      case 1:
      case 2:
      case 3:
        return TestFixture::between(random, 1, two_to_the_32 / 2);
      case 4:
      case 5:
        return TestFixture::between(random, two_to_the_32 / 2, two_to_the_32);
      case 6:
      case 7:
        return TestFixture::between(random, two_to_the_32 + 1, cap);
      case 8:
        return TestFixture::between(random, cap + 1, max_cap + 1);
      default: {
        const std::uint64_t extremes[] = {max_cap, max_cap + 1, uint64_max, uint64_max - 1,
                                          std::uint64_t{1} << 63};
        return extremes[random() % std::size(extremes)];
      }
    }
  });
}

// A cap of max_cap, with amounts near max_cap that fit only when the budget is nearly empty.
TYPED_TEST(BudgetStressTest, CommittedChargeNeverExceedsAMaxCapWithAmountsNearIt) {
  TestFixture::storm(max_cap, scaled(100000), [](std::mt19937_64& random) -> std::uint64_t {
    switch (random() % 8) {
      case 0:
        return 0;
      case 1:
      case 2:
        return TestFixture::between(random, 1, two_to_the_32);
      case 3:
        return TestFixture::between(random, two_to_the_32 + 1, max_cap / 4);
      case 4:
      case 5:
        return TestFixture::between(random, max_cap - two_to_the_32, max_cap);
      case 6:
        return TestFixture::between(random, max_cap / 2, max_cap);
      default:
        return TestFixture::between(random, max_cap + 1, uint64_max);
    }
  });
}

// When the cap covers every thread's largest holding at once, no reserve can fail under either
// policy: add_then_check over-rejects only behind another reserve that genuinely failed.
TYPED_TEST(BudgetStressTest, NothingIsRejectedWhileEveryThreadsPeakFitsTogether) {
  constexpr std::uint64_t largest = 2 * two_to_the_32;  // both routes of add_then_check
  constexpr std::uint64_t cap = TestFixture::threads * TestFixture::most_held_per_thread * largest;
  TypeParam pages(cap);
  std::latch start(TestFixture::threads);
  std::vector<std::thread> workers;
  for (unsigned index = 0; index < TestFixture::threads; ++index) {
    workers.emplace_back([&, index] {
      std::mt19937_64 random(104729 * (index + 1));
      std::vector<std::uint64_t> held;
      start.arrive_and_wait();
      for (std::size_t step = 0; step < scaled(100000); ++step) {
        if (held.size() == TestFixture::most_held_per_thread ||
            (!held.empty() && random() % 2 == 0)) {
          pages.release(held.back());
          held.pop_back();
        } else {
          const std::uint64_t n = TestFixture::between(random, 0, largest);
          if (pages.try_reserve(n)) held.push_back(n);
        }
      }
      for (const std::uint64_t n : held) pages.release(n);
    });
  }
  for (auto& worker : workers) worker.join();
  EXPECT_EQ(pages.rejected(), 0u);
  EXPECT_EQ(pages.pending(), 0u);
}

}  // namespace
}  // namespace teardown_test
