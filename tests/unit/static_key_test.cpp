// Specification of teardown::static_key, teardown::counting_static_key and teardown::const_key.
// The StaticKeyStressTest and CountingStaticKeyStressTest suites race writers against readers
// spinning on enabled(): ThreadSanitizer checks that the relaxed read is race-free, and the
// state after the writers are joined is checked against the last value written. Every loop is
// bounded by a write count, never by time.
#include "teardown/static_key.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <latch>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "test_support.hpp"

namespace teardown_test {
namespace {

using teardown::const_key;
using teardown::counting_static_key;
using teardown::static_key;

// --- Compile-time contract -------------------------------------------------------------------

static_assert(const_key<true>::enabled(), "const_key<true> is a constant true");
static_assert(!const_key<false>::enabled(), "const_key<false> is a constant false");
static_assert(noexcept(const_key<false>::enabled()));

// The shape a composition uses to compile its deferred path out: on const_key<false> the
// deferred branch is discarded at compile time.
template <class Key>
constexpr int chosen_path() {
  if constexpr (Key::enabled()) {
    return 1;  // deferred
  } else {
    return 0;  // inline
  }
}
static_assert(chosen_path<const_key<false>>() == 0);
static_assert(chosen_path<const_key<true>>() == 1);

static_assert(!std::is_copy_constructible_v<static_key> && !std::is_copy_assignable_v<static_key>);
static_assert(!std::is_convertible_v<bool, static_key>, "the constructor is explicit");
static_assert(std::is_nothrow_default_constructible_v<static_key>);
static_assert(noexcept(std::declval<const static_key&>().enabled()));
static_assert(!std::is_copy_constructible_v<counting_static_key>);
static_assert(noexcept(std::declval<const counting_static_key&>().enabled()));

// The constexpr constructors: keys at namespace scope are constant-initialized, so they are
// usable from other static initializers in any order.
constinit static_key constant_off_key;
constinit static_key constant_on_key{true};
constinit counting_static_key constant_counting_key;

// --- static_key --------------------------------------------------------------------------------

TEST(StaticKeyTest, IsOffByDefault) {
  const static_key key;
  EXPECT_FALSE(key.enabled());
}

TEST(StaticKeyTest, StartsInTheStateGivenToTheConstructor) {
  const static_key on(true);
  const static_key off(false);
  EXPECT_TRUE(on.enabled());
  EXPECT_FALSE(off.enabled());
}

TEST(StaticKeyTest, ConstantInitializedKeysHoldTheirInitialState) {
  EXPECT_FALSE(constant_off_key.enabled());
  EXPECT_TRUE(constant_on_key.enabled());
  EXPECT_FALSE(constant_counting_key.enabled());
}

TEST(StaticKeyTest, EnableTurnsItOn) {
  static_key key;
  key.enable();
  EXPECT_TRUE(key.enabled());
}

TEST(StaticKeyTest, DisableTurnsItOff) {
  static_key key(true);
  key.disable();
  EXPECT_FALSE(key.enabled());
}

TEST(StaticKeyTest, SetStoresTheGivenValue) {
  static_key key;
  key.set(true);
  EXPECT_TRUE(key.enabled());
  key.set(false);
  EXPECT_FALSE(key.enabled());
}

TEST(StaticKeyTest, RepeatedWritesOfTheSameValueAreIdempotent) {
  static_key key;
  key.enable();
  key.enable();
  key.set(true);
  EXPECT_TRUE(key.enabled());
  key.disable();
  key.disable();
  key.set(false);
  EXPECT_FALSE(key.enabled());
}

// --- counting_static_key -----------------------------------------------------------------------

TEST(CountingStaticKeyTest, IsOffWithAZeroCountByDefault) {
  const counting_static_key key;
  EXPECT_FALSE(key.enabled());
  EXPECT_EQ(key.count(), 0u);
}

TEST(CountingStaticKeyTest, IncTurnsItOn) {
  counting_static_key key;
  key.inc();
  EXPECT_TRUE(key.enabled());
  EXPECT_EQ(key.count(), 1u);
}

TEST(CountingStaticKeyTest, StaysOnWhileAnyIncIsOutstanding) {
  counting_static_key key;
  key.inc();
  key.inc();
  key.inc();
  key.dec();
  key.dec();
  EXPECT_TRUE(key.enabled());
  EXPECT_EQ(key.count(), 1u);
}

TEST(CountingStaticKeyTest, TheLastDecTurnsItOff) {
  counting_static_key key;
  key.inc();
  key.inc();
  key.dec();
  key.dec();
  EXPECT_FALSE(key.enabled());
  EXPECT_EQ(key.count(), 0u);
}

TEST(CountingStaticKeyTest, DecOnAFreshKeyThrowsLogicErrorAndChangesNothing) {
  counting_static_key key;
  EXPECT_THROW(key.dec(), std::logic_error);
  EXPECT_EQ(key.count(), 0u);
  EXPECT_FALSE(key.enabled());
}

TEST(CountingStaticKeyTest, DecBelowZeroAfterBalancedUseThrowsAndChangesNothing) {
  counting_static_key key;
  key.inc();
  key.dec();
  EXPECT_THROW(key.dec(), std::logic_error);
  EXPECT_EQ(key.count(), 0u);
  EXPECT_FALSE(key.enabled());
}

TEST(CountingStaticKeyTest, KeyStillCountsAfterARefusedDec) {
  counting_static_key key;
  EXPECT_THROW(key.dec(), std::logic_error);
  key.inc();
  EXPECT_TRUE(key.enabled());
  EXPECT_EQ(key.count(), 1u) << "the refused dec must not have wrapped the count";
  key.dec();
  EXPECT_FALSE(key.enabled());
}

TEST(CountingStaticKeyTest, RefusedDecSaysWhatWentWrong) {
  counting_static_key key;
  try {
    key.dec();
    FAIL() << "dec below zero did not throw";
  } catch (const std::logic_error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("counting_static_key"), std::string::npos) << message;
    EXPECT_NE(message.find("zero"), std::string::npos) << message;
  }
}

// --- Many threads ------------------------------------------------------------------------------

constexpr unsigned writer_threads = 4;
constexpr unsigned reader_threads = 2;

// Readers spin on enabled() until told to stop: the relaxed read racing every write is what
// ThreadSanitizer checks. Each reader counts what it saw so that the loads are not dead code.
class spinning_readers {
 public:
  template <class Key>
  explicit spinning_readers(const Key& key) {
    for (unsigned index = 0; index < reader_threads; ++index) {
      readers_.emplace_back([this, &key] {
        std::uint64_t seen_on = 0;
        while (!stop_.load(std::memory_order_acquire)) {  // pairs with the release in stop()
          if (key.enabled()) ++seen_on;
        }
        seen_on_.fetch_add(seen_on, std::memory_order_relaxed);
      });
    }
  }
  spinning_readers(const spinning_readers&) = delete;
  spinning_readers& operator=(const spinning_readers&) = delete;
  ~spinning_readers() { stop(); }

  void stop() {
    stop_.store(true, std::memory_order_release);  // pairs with the acquire in the loop
    for (auto& reader : readers_) {
      if (reader.joinable()) reader.join();
    }
  }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> seen_on_{0};
  std::vector<std::thread> readers_;
};

// Each writer's sequence of writes: random, and ending with `last`.
std::vector<bool> writes_ending_with(bool last, unsigned seed) {
  std::mt19937 random(seed);
  std::vector<bool> writes(scaled(2000));
  for (std::size_t i = 0; i + 1 < writes.size(); ++i) writes[i] = random() % 2 == 0;
  writes.back() = last;
  return writes;
}

// Writers using set(), enable() and disable() alike.
void write_all(static_key& key, const std::vector<bool>& writes) {
  for (std::size_t i = 0; i < writes.size(); ++i) {
    if (i % 2 == 0) {
      key.set(writes[i]);
    } else if (writes[i]) {
      key.enable();
    } else {
      key.disable();
    }
  }
}

// When every racing writer's final write is the same value, that value is the last one written
// whichever writer takes the mutex last.
TEST(StaticKeyStressTest, RacingWritersWhoseLastWritesAgreeLeaveThatValue) {
  for (const bool last : {true, false}) {
    static_key key(!last);
    spinning_readers readers(key);
    std::latch start(writer_threads);
    std::vector<std::thread> writers;
    for (unsigned index = 0; index < writer_threads; ++index) {
      writers.emplace_back([&, index] {
        const std::vector<bool> writes = writes_ending_with(last, 31 * index + (last ? 1 : 2));
        start.arrive_and_wait();
        write_all(key, writes);
      });
    }
    for (auto& writer : writers) writer.join();
    EXPECT_EQ(key.enabled(), last) << "last value written: " << last;
    readers.stop();
  }
}

// Writers that disagree race; one final write after they are joined decides the state.
TEST(StaticKeyStressTest, AWriteAfterTheRacingWritersJoinedDecidesTheState) {
  for (const bool final_value : {true, false}) {
    static_key key;
    spinning_readers readers(key);
    std::latch start(writer_threads);
    std::vector<std::thread> writers;
    for (unsigned index = 0; index < writer_threads; ++index) {
      writers.emplace_back([&, index] {
        // Half the writers end on true, half on false.
        const std::vector<bool> writes = writes_ending_with(index % 2 == 0, 97 * index + 5);
        start.arrive_and_wait();
        write_all(key, writes);
      });
    }
    for (auto& writer : writers) writer.join();
    key.set(final_value);
    EXPECT_EQ(key.enabled(), final_value);
    readers.stop();
  }
}

// Writers serialized by join order: after each one returns, the key holds its last write.
TEST(StaticKeyStressTest, WritersSerializedByJoinOrderLeaveTheLastWritersValue) {
  static_key key;
  spinning_readers readers(key);
  for (unsigned index = 0; index < 2 * writer_threads; ++index) {
    const bool last = (index * 7 + 3) % 3 == 0;
    const std::vector<bool> writes = writes_ending_with(last, 13 * index + 11);
    std::thread writer([&] { write_all(key, writes); });
    writer.join();
    EXPECT_EQ(key.enabled(), last) << "after writer " << index;
  }
  readers.stop();
}

TEST(CountingStaticKeyStressTest, ConcurrentIncDecPairsLeaveItOffWithZeroCount) {
  counting_static_key key;
  spinning_readers readers(key);
  std::latch start(writer_threads);
  std::vector<std::thread> users;
  for (unsigned index = 0; index < writer_threads; ++index) {
    users.emplace_back([&, index] {
      start.arrive_and_wait();
      for (std::size_t round = 0; round < scaled(2000); ++round) {
        // Nest a few holds deep now and then, so that the count climbs past 1.
        const unsigned depth = 1 + (round + index) % 3;
        for (unsigned hold = 0; hold < depth; ++hold) key.inc();
        for (unsigned hold = 0; hold < depth; ++hold) key.dec();
      }
    });
  }
  for (auto& user : users) user.join();
  readers.stop();
  EXPECT_EQ(key.count(), 0u);
  EXPECT_FALSE(key.enabled());
}

// A user holding the key open keeps it on, whatever other users inc and dec meanwhile.
TEST(CountingStaticKeyStressTest, OtherUsersIncDecPairsNeverTurnOffAHeldKey) {
  counting_static_key key;
  key.inc();  // held by this thread for the whole test
  std::atomic<bool> seen_off{false};
  std::atomic<bool> stop{false};
  std::vector<std::thread> readers;
  for (unsigned index = 0; index < reader_threads; ++index) {
    readers.emplace_back([&] {
      while (!stop.load(std::memory_order_acquire)) {  // pairs with the release below
        if (!key.enabled()) seen_off.store(true, std::memory_order_relaxed);
      }
    });
  }
  std::latch start(writer_threads);
  std::vector<std::thread> users;
  for (unsigned index = 0; index < writer_threads; ++index) {
    users.emplace_back([&] {
      start.arrive_and_wait();
      for (std::size_t round = 0; round < scaled(2000); ++round) {
        key.inc();
        key.dec();
      }
    });
  }
  for (auto& user : users) user.join();
  stop.store(true, std::memory_order_release);  // pairs with the acquire in the readers
  for (auto& reader : readers) reader.join();
  EXPECT_FALSE(seen_off.load()) << "a reader saw the key off while this thread held it";
  EXPECT_EQ(key.count(), 1u);
  EXPECT_TRUE(key.enabled());
  key.dec();
  EXPECT_FALSE(key.enabled());
}

}  // namespace
}  // namespace teardown_test
