// Specification of teardown::sharded_counter: single-threaded arithmetic, the shard count, and
// in the ShardedCounterStressTest suite the two concurrent promises of read(): exact once the
// adders are joined, and never decreasing between successive reads by one thread while they
// run. Bounded by add counts, never by time; smaller under sanitizers (scaled()).
#include "teardown/counter.hpp"

#include <errno.h>
#include <pthread.h>
#include <signal.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <latch>
#include <limits>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "test_support.hpp"

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define TEARDOWN_TEST_UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define TEARDOWN_TEST_UNDER_SANITIZER 1
#endif
#endif
#ifndef TEARDOWN_TEST_UNDER_SANITIZER
#define TEARDOWN_TEST_UNDER_SANITIZER 0
#endif

namespace teardown_test {

// --- Allocation watch ----------------------------------------------------------------------------
// A thread may ask that its own allocations be counted, or refused (malloc returns null,
// operator new throws std::bad_alloc). Without a sanitizer the test replaces malloc, calloc,
// realloc and the aligned allocators, forwarding to glibc's own (glibc routes its internal
// allocations through the replacement too); under a sanitizer, whose runtime owns malloc, it
// counts through the sanitizer's allocation hook and cannot refuse.
namespace alloc_watch {
inline thread_local constinit bool counting = false;
inline thread_local constinit bool refusing = false;
inline thread_local constinit std::size_t seen = 0;
inline bool note() noexcept {  // true: refuse this allocation
  if (counting) ++seen;
  return refusing;
}
#if defined(__GLIBC__) && !TEARDOWN_TEST_UNDER_SANITIZER
inline constexpr bool can_refuse = true;
#else
inline constexpr bool can_refuse = false;
#endif
bool watching() noexcept;  // false: allocations cannot be seen in this build
}  // namespace alloc_watch

}  // namespace teardown_test

#if defined(__GLIBC__) && !TEARDOWN_TEST_UNDER_SANITIZER
extern "C" {
void* __libc_malloc(std::size_t);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void* __libc_memalign(std::size_t, std::size_t);

void* malloc(std::size_t size) {
  if (teardown_test::alloc_watch::note()) return errno = ENOMEM, nullptr;
  return __libc_malloc(size);
}
void* calloc(std::size_t count, std::size_t size) {
  if (teardown_test::alloc_watch::note()) return errno = ENOMEM, nullptr;
  return __libc_calloc(count, size);
}
void* realloc(void* block, std::size_t size) {
  if (teardown_test::alloc_watch::note()) return errno = ENOMEM, nullptr;
  return __libc_realloc(block, size);
}
void* memalign(std::size_t alignment, std::size_t size) {
  if (teardown_test::alloc_watch::note()) return errno = ENOMEM, nullptr;
  return __libc_memalign(alignment, size);
}
void* aligned_alloc(std::size_t alignment, std::size_t size) { return memalign(alignment, size); }
int posix_memalign(void** out, std::size_t alignment, std::size_t size) {
  void* block = memalign(alignment, size);
  if (block == nullptr) return ENOMEM;
  *out = block;
  return 0;
}
}
#elif TEARDOWN_TEST_UNDER_SANITIZER
extern "C" int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void*, std::size_t),
                                                         void (*free_hook)(const volatile void*));
namespace {
// Both hooks must be given (the runtime refuses a null one and returns 0).
const int alloc_watch_hooked = __sanitizer_install_malloc_and_free_hooks(
    [](const volatile void*, std::size_t) { (void)teardown_test::alloc_watch::note(); }, [](const volatile void*) {});
}  // namespace
#endif

namespace teardown_test {
#if TEARDOWN_TEST_UNDER_SANITIZER
bool alloc_watch::watching() noexcept { return alloc_watch_hooked != 0; }
#else
bool alloc_watch::watching() noexcept { return true; }
#endif
namespace {

using teardown::sharded_counter;

static_assert(!std::is_copy_constructible_v<sharded_counter>);
static_assert(!std::is_copy_assignable_v<sharded_counter>);
static_assert(!std::is_convertible_v<std::size_t, sharded_counter>, "the constructor is explicit");
static_assert(noexcept(std::declval<sharded_counter&>().add(1)));
static_assert(noexcept(std::declval<const sharded_counter&>().read()));
static_assert(noexcept(std::declval<const sharded_counter&>().shard_count()));

// --- One thread --------------------------------------------------------------------------------

TEST(ShardedCounterTest, StartsAtZero) {
  const sharded_counter events;
  EXPECT_EQ(events.read(), 0u);
}

TEST(ShardedCounterTest, AddWithoutAnAmountAddsOne) {
  sharded_counter events;
  events.add();
  events.add();
  EXPECT_EQ(events.read(), 2u);
}

TEST(ShardedCounterTest, AddAddsTheGivenAmount) {
  sharded_counter events;
  events.add(40);
  events.add(2);
  EXPECT_EQ(events.read(), 42u);
}

TEST(ShardedCounterTest, AddingZeroChangesNothing) {
  sharded_counter events;
  events.add(7);
  events.add(0);
  EXPECT_EQ(events.read(), 7u);
}

TEST(ShardedCounterTest, ReadDoesNotChangeTheCount) {
  sharded_counter events;
  events.add(5);
  EXPECT_EQ(events.read(), 5u);
  EXPECT_EQ(events.read(), 5u);
}

TEST(ShardedCounterTest, LargeAmountsAddExactly) {
  sharded_counter events;
  const std::uint64_t big = std::uint64_t{1} << 62;
  events.add(big);
  events.add(big);
  events.add(3);
  EXPECT_EQ(events.read(), 2 * big + 3);
}

TEST(ShardedCounterTest, CountersAreIndependent) {
  sharded_counter queued(4);
  sharded_counter rejected(4);
  queued.add(3);
  rejected.add(1);
  EXPECT_EQ(queued.read(), 3u);
  EXPECT_EQ(rejected.read(), 1u);
}

// Threads that run one after another land on different shards; read() sums them all.
TEST(ShardedCounterTest, ReadSumsAddsFromEveryThread) {
  sharded_counter events(4);
  std::uint64_t expected = 0;
  for (std::uint64_t index = 1; index <= 10; ++index) {
    std::thread adder([&events, index] { events.add(index); });
    adder.join();
    expected += index;
  }
  events.add(100);
  EXPECT_EQ(events.read(), expected + 100);
}

// --- Shard count -------------------------------------------------------------------------------

TEST(ShardedCounterTest, ShardCountIsTheRequestRoundedUpToAPowerOfTwo) {
  const std::pair<std::size_t, std::size_t> request_and_count[] = {
      {1, 1}, {2, 2},  {3, 4},   {4, 4},    {5, 8},     {7, 8},
      {8, 8}, {9, 16}, {64, 64}, {65, 128}, {200, 256}, {256, 256}};
  for (const auto& [requested, expected] : request_and_count) {
    EXPECT_EQ(sharded_counter(requested).shard_count(), expected) << "requested " << requested;
  }
}

TEST(ShardedCounterTest, ShardCountIsClampedTo256) {
  for (const std::size_t requested :
       {std::size_t{257}, std::size_t{511}, std::size_t{1000}, std::size_t{1} << 20,
        std::numeric_limits<std::size_t>::max()}) {
    EXPECT_EQ(sharded_counter(requested).shard_count(), 256u) << "requested " << requested;
  }
}

TEST(ShardedCounterTest, EveryRequestGivesAPowerOfTwoBetweenOneAnd256NotBelowIt) {
  for (std::size_t requested = 1; requested <= 300; ++requested) {
    const std::size_t count = sharded_counter(requested).shard_count();
    EXPECT_TRUE(std::has_single_bit(count)) << "requested " << requested << ", got " << count;
    EXPECT_GE(count, std::min<std::size_t>(requested, 256)) << "requested " << requested;
    EXPECT_LE(count, 256u) << "requested " << requested;
    EXPECT_LT(count, 2 * requested) << "requested " << requested << ": rounded past the next power";
  }
}

TEST(ShardedCounterTest, DefaultShardCountFollowsTheHardwareThreads) {
  const std::size_t hardware = std::thread::hardware_concurrency();
  const std::size_t expected = std::bit_ceil(std::clamp<std::size_t>(hardware, 1, 256));
  EXPECT_EQ(sharded_counter().shard_count(), expected) << hardware << " hardware threads";
  EXPECT_EQ(sharded_counter(0).shard_count(), expected) << "0 asks for the default";
}

TEST(ShardedCounterTest, OneShardCountsEverythingExactly) {
  sharded_counter events(1);
  ASSERT_EQ(events.shard_count(), 1u);
  std::thread other([&events] { events.add(5); });
  other.join();
  events.add(6);
  EXPECT_EQ(events.read(), 11u);
}

// --- Many threads ------------------------------------------------------------------------------

constexpr unsigned adder_threads = 8;

// Thread `index` adds (index + 1) on every step, with add() and add(n) alike.
void add_known_amounts(sharded_counter& events, unsigned index, std::size_t steps) {
  for (std::size_t step = 0; step < steps; ++step) {
    if (index == 0) {
      events.add();
    } else {
      events.add(index + 1);
    }
  }
}

std::uint64_t known_total(std::size_t steps) {
  std::uint64_t total = 0;
  for (unsigned index = 0; index < adder_threads; ++index) {
    total += std::uint64_t{index + 1} * steps;
  }
  return total;
}

// One shard (every thread on the same line), fewer shards than threads, and more.
// White-box: the shard index a thread holds (teardown::detail) decides which shard it adds to.
TEST(ShardedCounterShardIndexTest, LiveThreadsHoldDistinctIndexes) {
  constexpr int threads = 8;
  std::vector<std::size_t> indexes(threads);
  std::latch all_hold(threads);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      indexes[t] = teardown::detail::this_thread_shard_index();
      all_hold.arrive_and_wait();  // nobody exits (and gives its index back) before all hold one
    });
  }
  for (auto& w : workers) w.join();
  std::sort(indexes.begin(), indexes.end());
  EXPECT_EQ(std::adjacent_find(indexes.begin(), indexes.end()), indexes.end());
}

TEST(ShardedCounterShardIndexTest, AnExitedThreadsIndexIsGivenToTheNextThread) {
  (void)teardown::detail::this_thread_shard_index();  // the main thread holds its own
  std::size_t first = 0;
  std::size_t second = 0;
  std::thread([&] { first = teardown::detail::this_thread_shard_index(); }).join();
  std::thread([&] { second = teardown::detail::this_thread_shard_index(); }).join();
  EXPECT_EQ(first, second);
}

// --- A thread's first add: no allocation, no lock, no thread-exit registration -----------------
// What makes add async-signal-safe (a handler may run a thread's first add while the thread is
// inside malloc) and keeps it noexcept for real (no allocation that could fail).

TEST(ShardedCounterFirstAddTest, AllocatesNothing) {
  ASSERT_TRUE(alloc_watch::watching()) << "the sanitizer refused the allocation hook";
  sharded_counter events(4);
  std::size_t allocations = 0;
  std::thread fresh([&] {  // a fresh thread: its first add takes its shard index
    alloc_watch::seen = 0;
    alloc_watch::counting = true;
    events.add(3);
    alloc_watch::counting = false;
    allocations = alloc_watch::seen;
  });
  fresh.join();
  EXPECT_EQ(allocations, 0u) << "a thread's first add allocated";
  EXPECT_EQ(events.read(), 3u);
}

// Out of memory, the first add still counts: it neither terminates nor loses the add.
TEST(ShardedCounterFirstAddTest, CountsWhenEveryAllocationFails) {
  if (!alloc_watch::can_refuse) {
    GTEST_SKIP() << "the sanitizer runtime owns malloc: a test cannot make it fail "
                    "(AllocatesNothing shows there that the first add does not allocate)";
  }
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // In a child process: before the fix, glibc ends the process when it cannot register a
  // thread_local's destructor ("failed to register TLS destructor: out of memory").
  EXPECT_EXIT(
      {
        sharded_counter events(4);
        std::thread fresh([&] {
          alloc_watch::refusing = true;
          events.add(5);
          alloc_watch::refusing = false;
        });
        fresh.join();
        std::exit(events.read() == 5 ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

// White-box: the registry of shard indexes (teardown::detail::shard_index_registry).
using registry = teardown::detail::shard_index_registry;

// A handler that runs the thread's first add between the interrupted first add's claim of a
// slot and its settling keeps one slot for the thread and gives the other back.
TEST(ShardedCounterShardIndexTest, AFirstAddInterruptedByAnotherKeepsOneSlotAndGivesTheOtherBack) {
  std::size_t claimed = 0;
  std::size_t inner = 0;
  std::size_t settled = 0;
  bool claimed_still_held = true;
  std::thread fresh([&] {
    claimed = registry::instance().claim();           // the interrupted add, half-way
    inner = teardown::detail::this_thread_shard_index();  // the handler's add, start to end
    settled = registry::instance().settle_for_this_thread(claimed);  // the interrupted add resumes
    claimed_still_held = registry::instance().held(claimed);
    EXPECT_EQ(teardown::detail::this_thread_shard_index(), inner) << "the thread's index changed";
  });
  fresh.join();
  ASSERT_LT(claimed, registry::slots);
  EXPECT_NE(inner, claimed);
  EXPECT_EQ(settled, inner) << "both adds of the thread must use the same index";
  EXPECT_FALSE(claimed_still_held) << "the slot the interrupted add claimed was not given back";
}

// More live threads than slots: the rest share indexes, and their adds still count.
TEST(ShardedCounterShardIndexTest, WithEverySlotTakenAThreadSharesAnIndexAndStillCounts) {
  std::vector<std::size_t> taken;
  for (std::size_t slot = registry::instance().claim(); slot < registry::slots; slot = registry::instance().claim()) {
    taken.push_back(slot);
  }
  sharded_counter events(4);
  std::size_t index = 0;
  std::thread crowded([&] {
    events.add(2);
    index = teardown::detail::this_thread_shard_index();
  });
  crowded.join();
  for (const std::size_t slot : taken) registry::instance().give_back(slot);
  EXPECT_LT(index, registry::slots);
  EXPECT_EQ(events.read(), 2u);
  // A later thread gets a slot of its own again.
  std::size_t later = registry::slots;
  std::thread([&] { later = teardown::detail::this_thread_shard_index(); }).join();
  EXPECT_FALSE(registry::instance().held(later)) << "a slot was not given back at thread exit";
}

// A real signal: a handler's add on a thread that never added (its first add runs in the
// handler) and then the thread's own adds use one index.
std::atomic<std::size_t> handler_index{0};
void add_in_handler(int) {
  handler_index.store(teardown::detail::this_thread_shard_index(), std::memory_order_relaxed);
}

TEST(ShardedCounterShardIndexTest, AFirstAddInASignalHandlerGivesTheThreadItsIndex) {
  struct sigaction action {};
  action.sa_handler = &add_in_handler;
  sigemptyset(&action.sa_mask);
  struct sigaction old {};
  ASSERT_EQ(sigaction(SIGUSR2, &action, &old), 0);
  std::size_t after = 0;
  std::thread fresh([&] {
    pthread_kill(pthread_self(), SIGUSR2);  // delivered before pthread_kill returns
    after = teardown::detail::this_thread_shard_index();
  });
  fresh.join();
  sigaction(SIGUSR2, &old, nullptr);
  EXPECT_EQ(after, handler_index.load());
}

TEST(ShardedCounterStressTest, ReadAfterJoiningTheAddersIsTheExactSum) {
  for (const std::size_t shards : {std::size_t{1}, std::size_t{4}, std::size_t{64}}) {
    sharded_counter events(shards);
    const std::size_t steps = scaled(100000);
    std::latch start(adder_threads);
    std::vector<std::thread> adders;
    for (unsigned index = 0; index < adder_threads; ++index) {
      adders.emplace_back([&, index] {
        start.arrive_and_wait();
        add_known_amounts(events, index, steps);
      });
    }
    for (auto& adder : adders) adder.join();
    EXPECT_EQ(events.read(), known_total(steps)) << shards << " shards";
  }
}

TEST(ShardedCounterStressTest, SuccessiveReadsDuringConcurrentAddsNeverDecrease) {
  for (const std::size_t shards : {std::size_t{1}, std::size_t{4}, std::size_t{64}}) {
    sharded_counter events(shards);
    const std::size_t steps = scaled(100000);
    const std::uint64_t total = known_total(steps);
    std::atomic<unsigned> adders_done{0};
    std::latch start(adder_threads + 1);
    std::vector<std::thread> adders;
    for (unsigned index = 0; index < adder_threads; ++index) {
      adders.emplace_back([&, index] {
        start.arrive_and_wait();
        add_known_amounts(events, index, steps);
        adders_done.fetch_add(1, std::memory_order_release);  // pairs with the reader's acquire
      });
    }
    std::uint64_t reads = 0;
    std::uint64_t previous = 0;
    std::uint64_t decreases = 0;
    std::uint64_t above_total = 0;
    start.arrive_and_wait();
    // Read until every adder has finished, then once more.
    bool last_round = false;
    while (!last_round) {
      last_round = adders_done.load(std::memory_order_acquire) == adder_threads;
      const std::uint64_t now = events.read();
      ++reads;
      if (now < previous) ++decreases;
      if (now > total) ++above_total;
      previous = now;
    }
    for (auto& adder : adders) adder.join();
    EXPECT_EQ(decreases, 0u) << shards << " shards, " << reads << " reads";
    EXPECT_EQ(above_total, 0u) << shards << " shards: a read exceeded everything ever added";
    EXPECT_EQ(previous, total) << shards << " shards: the read after the last add is exact";
  }
}

}  // namespace
}  // namespace teardown_test
