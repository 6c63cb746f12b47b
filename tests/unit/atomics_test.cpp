// The Atomics policies (atomics.hpp) as a structure uses them: every operation the header lists, on each
// policy this build offers (std_atomics, and ao_atomics where <atomic_ops.h> is), with the results
// std::atomic documents. One behaviour per test; the concurrent ones count, they do not time.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include "teardown/atomics.hpp"
#include "test_support.hpp"

namespace {

template <class Policy>
class AtomicsTest : public ::testing::Test {};
TYPED_TEST_SUITE(AtomicsTest, teardown_test::atomics_backends);

constexpr std::memory_order every_order[] = {std::memory_order_relaxed, std::memory_order_acquire,
                                             std::memory_order_release, std::memory_order_acq_rel,
                                             std::memory_order_seq_cst};

// The load orders std::atomic allows (a load may not be release or acq_rel).
constexpr std::memory_order load_orders[] = {std::memory_order_relaxed, std::memory_order_acquire,
                                             std::memory_order_seq_cst};
constexpr std::memory_order store_orders[] = {std::memory_order_relaxed, std::memory_order_release,
                                              std::memory_order_seq_cst};

TEST(StdAtomicsTest, IsStdAtomic) {
  static_assert(std::is_same_v<teardown::std_atomics::atomic<int*>, std::atomic<int*>>);
  static_assert(std::is_same_v<teardown::std_atomics::atomic<std::uint64_t>, std::atomic<std::uint64_t>>);
  EXPECT_EQ(std::string_view(teardown::std_atomics::name), "std");
}

#if TEARDOWN_AO_ATOMICS_AVAILABLE
TEST(AoAtomicsTest, IsNamedAo) { EXPECT_EQ(std::string_view(teardown::ao_atomics::name), "ao"); }

// A namespace-scope pointer word on the AO backend is constant-initialized (no static-init order issue).
constinit teardown::ao_atomics::atomic<int*> ao_null_word{nullptr};

TEST(AoAtomicsTest, NullPointerWordIsConstantInitialized) { EXPECT_EQ(ao_null_word.load(), nullptr); }
#endif

TYPED_TEST(AtomicsTest, StoreThenLoadReadsTheValueInEveryOrder) {
  typename TypeParam::template atomic<std::uint64_t> word{0};
  std::uint64_t value = 1;
  for (const std::memory_order store : store_orders) {
    for (const std::memory_order load : load_orders) {
      value = value * 3 + 1;
      word.store(value, store);
      EXPECT_EQ(word.load(load), value);
    }
  }
}

TYPED_TEST(AtomicsTest, ConstructorSetsTheInitialValue) {
  int target = 0;
  typename TypeParam::template atomic<int*> pointer{&target};
  typename TypeParam::template atomic<std::uint32_t> number{7};
  EXPECT_EQ(pointer.load(std::memory_order_relaxed), &target);
  EXPECT_EQ(number.load(std::memory_order_relaxed), 7u);
}

TYPED_TEST(AtomicsTest, ExchangeReturnsThePreviousValueAndStoresTheNew) {
  int a = 0;
  int b = 0;
  typename TypeParam::template atomic<int*> word{&a};
  for (const std::memory_order order : every_order) {
    EXPECT_EQ(word.exchange(&b, order), &a);
    EXPECT_EQ(word.exchange(&a, order), &b);
  }
  EXPECT_EQ(word.load(), &a);
}

TYPED_TEST(AtomicsTest, CompareExchangeSucceedsOnlyOnTheExpectedValue) {
  typename TypeParam::template atomic<std::uint64_t> word{5};
  std::uint64_t expected = 4;
  EXPECT_FALSE(word.compare_exchange_strong(expected, 9, std::memory_order_acq_rel, std::memory_order_acquire));
  EXPECT_EQ(expected, 5u);  // a failed compare-exchange reports what it saw
  EXPECT_EQ(word.load(), 5u);
  EXPECT_TRUE(word.compare_exchange_strong(expected, 9, std::memory_order_acq_rel, std::memory_order_acquire));
  EXPECT_EQ(expected, 5u);
  EXPECT_EQ(word.load(), 9u);
}

TYPED_TEST(AtomicsTest, CompareExchangeHonoursEveryOrderPair) {
  // The success/failure pairs the library's structures use; each must behave as a CAS.
  const std::pair<std::memory_order, std::memory_order> pairs[] = {
      {std::memory_order_relaxed, std::memory_order_relaxed}, {std::memory_order_release, std::memory_order_relaxed},
      {std::memory_order_release, std::memory_order_acquire}, {std::memory_order_relaxed, std::memory_order_acquire},
      {std::memory_order_acquire, std::memory_order_acquire}, {std::memory_order_acq_rel, std::memory_order_relaxed},
      {std::memory_order_acq_rel, std::memory_order_acquire}, {std::memory_order_seq_cst, std::memory_order_seq_cst},
  };
  typename TypeParam::template atomic<std::uint32_t> word{0};
  std::uint32_t value = 0;
  for (const auto& [success, failure] : pairs) {
    std::uint32_t stale = value + 100;
    EXPECT_FALSE(word.compare_exchange_strong(stale, value + 1, success, failure));
    EXPECT_EQ(stale, value);
    // A weak CAS may fail spuriously (never on AO); retried, it succeeds.
    std::uint32_t expected = value;
    while (!word.compare_exchange_weak(expected, value + 1, success, failure)) {
      ASSERT_EQ(expected, value);
    }
    ++value;
    EXPECT_EQ(word.load(), value);
  }
}

TYPED_TEST(AtomicsTest, FetchAddAndFetchSubReturnThePreviousValue) {
  typename TypeParam::template atomic<std::uint64_t> word{10};
  for (const std::memory_order order : every_order) {
    EXPECT_EQ(word.fetch_add(5, order), 10u);
    EXPECT_EQ(word.fetch_sub(5, order), 15u);
  }
  EXPECT_EQ(word.load(), 10u);
}

TYPED_TEST(AtomicsTest, FetchSubWrapsAnUnsignedWordLikeStdAtomic) {
  typename TypeParam::template atomic<std::uint32_t> word{1};
  EXPECT_EQ(word.fetch_sub(2), 1u);
  EXPECT_EQ(word.load(), 0xffffffffu);
  EXPECT_EQ(word.fetch_add(1), 0xffffffffu);
  EXPECT_EQ(word.load(), 0u);
}

TYPED_TEST(AtomicsTest, FetchSubGoesNegativeOnASignedWord) {
  typename TypeParam::template atomic<std::int64_t> word{3};
  EXPECT_EQ(word.fetch_sub(5), 3);
  EXPECT_EQ(word.load(), -2);
  EXPECT_EQ(word.fetch_add(-3), -2);
  EXPECT_EQ(word.load(), -5);
}

TYPED_TEST(AtomicsTest, ConcurrentFetchAddsLoseNoIncrement) {
  typename TypeParam::template atomic<std::uint64_t> word{0};
  constexpr int threads = 4;
  const int adds = static_cast<int>(teardown_test::scaled(20000));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int i = 0; i < adds; ++i) word.fetch_add(1, std::memory_order_relaxed);
    });
  }
  for (auto& thread : pool) thread.join();
  EXPECT_EQ(word.load(), std::uint64_t{threads} * static_cast<std::uint64_t>(adds));
}

TYPED_TEST(AtomicsTest, ConcurrentExchangesHandEachValueOnExactlyOnce) {
  // Every thread swaps in its own values; the value each exchange returns is one nobody else got. With
  // a lost or duplicated swap (a broken CAS loop on AO), the sum of what came back would differ.
  constexpr std::uint64_t threads = 4;
  const std::uint64_t swaps = teardown_test::scaled(10000);
  typename TypeParam::template atomic<std::uint64_t> word{0};
  std::vector<std::uint64_t> sums(threads, 0);
  std::vector<std::thread> pool;
  for (std::uint64_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (std::uint64_t i = 1; i <= swaps; ++i) sums[t] += word.exchange(t * swaps + i, std::memory_order_acq_rel);
    });
  }
  for (auto& thread : pool) thread.join();
  std::uint64_t returned = word.load();  // the last value in was never returned
  for (const std::uint64_t sum : sums) returned += sum;
  const std::uint64_t n = threads * swaps;
  EXPECT_EQ(returned, n * (n + 1) / 2);  // 0 + every value swapped in, each once
}

TYPED_TEST(AtomicsTest, ReleaseStorePublishesToAnAcquireLoad) {
  // The pairing every "pairs with" comment in the library relies on: data written before a release store
  // is seen by a thread whose acquire load reads that store.
  for (int round = 0; round < 200; ++round) {
    int data = 0;
    typename TypeParam::template atomic<int*> published{nullptr};
    std::thread reader([&] {
      int* seen = nullptr;
      while ((seen = published.load(std::memory_order_acquire)) == nullptr) std::this_thread::yield();
      EXPECT_EQ(*seen, round + 1);
    });
    data = round + 1;
    published.store(&data, std::memory_order_release);
    reader.join();
  }
}

}  // namespace
