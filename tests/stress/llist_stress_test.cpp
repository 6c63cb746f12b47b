// Many-thread stress tests of teardown::llist on every Atomics backend: producers add while
// consumers take, and at the end every node must have been taken exactly once (or exactly the
// number of rounds it was recycled for). Each run is bounded by node counts, never by time, and
// shrinks under sanitizers (teardown_test::scaled). Producers write each node's payload with
// plain stores just before adding it and consumers read it with plain loads, so
// ThreadSanitizer checks the list's add -> take ordering guarantee on every node.
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <latch>
#include <memory>
#include <thread>
#include <vector>

#include "teardown/llist.hpp"
#include "test_support.hpp"

namespace teardown_test {
namespace {

using teardown::llist_node;

struct stress_item {
  llist_node hook;
  // Written by the producer (plain) right before it adds the node.
  std::size_t producer = 0;
  std::size_t sequence = 0;
  // Written only by the single recycling consumer.
  unsigned rounds = 0;
  // How many times a consumer took the node. Atomic so that a node wrongly handed to two
  // consumers is counted, not merely reported as a race.
  std::atomic<unsigned> taken{0};
};

// Every node the producers will add, nodes_per_producer for each producer.
class stress_nodes {
 public:
  stress_nodes(std::size_t producers, std::size_t nodes_per_producer)
      : per_producer_(nodes_per_producer),
        count_(producers * nodes_per_producer),
        nodes_(std::make_unique<stress_item[]>(count_)) {}

  std::size_t size() const noexcept { return count_; }
  std::size_t per_producer() const noexcept { return per_producer_; }

  stress_item& at(std::size_t producer, std::size_t sequence) noexcept {
    return nodes_[producer * per_producer_ + sequence];
  }

  // A consumer's view of a node it took: its payload names its own slot, which holds only if the
  // producer's writes are visible (and the pointer came from the list intact).
  bool payload_matches(const stress_item& node) const noexcept {
    return node.sequence < per_producer_ &&
           &node == &nodes_[node.producer * per_producer_ + node.sequence];
  }

  // How many nodes were taken a number of times other than `expected`.
  std::size_t taken_other_than(unsigned expected) const noexcept {
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < count_; ++i) {
      if (nodes_[i].taken.load(std::memory_order_relaxed) != expected) ++wrong;
    }
    return wrong;
  }

 private:
  std::size_t per_producer_;
  std::size_t count_;
  std::unique_ptr<stress_item[]> nodes_;
};

// What a consumer does each time it finds the list empty: poll again at once a few times, since
// racing the very next add is the interleaving these tests are after, then yield so that the
// producers get a CPU on a machine with fewer cores than threads.
class idle_backoff {
 public:
  void operator()() noexcept {
    if (++empty_polls_ % 8 == 0) std::this_thread::yield();
  }

 private:
  std::size_t empty_polls_ = 0;
};

// What one consumer thread saw.
struct consumer_tally {
  std::size_t taken = 0;
  std::size_t non_empty_batches = 0;
  std::size_t payload_mismatches = 0;
  std::size_t was_empty_readds = 0;  // recycling only: re-adds that found the list empty
};

enum class publish { one_by_one, in_chains };

// Producer threads: producer p adds nodes.at(p, 0..n) in order, once everyone has reached the
// start latch, and counts the adds that found the list empty. A producer yields after every
// add (or chain) so that, even with fewer cores than threads, consumers run between the adds
// rather than after them all: without that, a 2-core machine often drains everything in one
// batch, and a consumer rarely loses a compare-and-swap to a producer, which is the interleaving
// the ordering checks need.
template <class List>
class producer_group {
 public:
  static constexpr std::size_t chain_length = 8;

  producer_group(List& list, stress_nodes& nodes, std::size_t count, std::latch& start,
                 publish how) {
    threads_.reserve(count);
    for (std::size_t p = 0; p < count; ++p) {
      threads_.emplace_back([this, &list, &nodes, &start, how, p] {
        start.arrive_and_wait();
        const std::size_t was_empty =
            how == publish::one_by_one ? add_one_by_one(list, nodes, p) : add_in_chains(list, nodes, p);
        was_empty_adds_.fetch_add(was_empty, std::memory_order_relaxed);
        // release: a consumer that sees every producer finished also sees all their adds.
        finished_.fetch_add(1, std::memory_order_release);
      });
    }
  }

  producer_group(const producer_group&) = delete;
  producer_group& operator=(const producer_group&) = delete;
  ~producer_group() { join(); }

  // True once every producer has made its last add.
  bool finished() const noexcept {
    return finished_.load(std::memory_order_acquire) == threads_.size();
  }

  void join() {
    for (std::thread& thread : threads_) {
      if (thread.joinable()) thread.join();
    }
  }

  std::size_t was_empty_adds() const noexcept {
    return was_empty_adds_.load(std::memory_order_relaxed);
  }

 private:
  static std::size_t add_one_by_one(List& list, stress_nodes& nodes, std::size_t producer) {
    std::size_t was_empty = 0;
    for (std::size_t i = 0; i < nodes.per_producer(); ++i) {
      stress_item& node = nodes.at(producer, i);
      node.producer = producer;
      node.sequence = i;
      if (list.add(node)) ++was_empty;
      std::this_thread::yield();
    }
    return was_empty;
  }

  static std::size_t add_in_chains(List& list, stress_nodes& nodes, std::size_t producer) {
    std::size_t was_empty = 0;
    typename List::chain chain;
    for (std::size_t i = 0; i < nodes.per_producer(); ++i) {
      stress_item& node = nodes.at(producer, i);
      node.producer = producer;
      node.sequence = i;
      chain.push_front(node);
      if (chain.size() == chain_length || i + 1 == nodes.per_producer()) {
        if (list.add_batch(std::move(chain))) ++was_empty;  // leaves the chain empty
        std::this_thread::yield();
      }
    }
    return was_empty;
  }

  std::vector<std::thread> threads_;
  std::atomic<std::size_t> finished_{0};
  std::atomic<std::size_t> was_empty_adds_{0};
};

// One consumer's share of the work, through del_all, until the producers are finished and the
// list is empty. Several may run at once.
template <class List>
consumer_tally consume_with_del_all(List& list, const producer_group<List>& producers,
                                    const stress_nodes& nodes) {
  consumer_tally tally;
  idle_backoff idle;
  for (;;) {
    // Read before del_all: if every add had happened before this del_all and it came back
    // empty, nothing is left for this consumer.
    const bool producers_finished = producers.finished();
    auto batch = list.del_all();
    if (batch.empty()) {
      if (producers_finished) return tally;
      idle();
      continue;
    }
    ++tally.non_empty_batches;
    for (stress_item& node : batch) {
      ++tally.taken;
      if (!nodes.payload_matches(node)) ++tally.payload_mismatches;
      node.taken.fetch_add(1, std::memory_order_relaxed);
    }
  }
}

template <class Atomics>
class LlistStressTest : public ::testing::Test {
 protected:
  using list = teardown::llist<stress_item, &stress_item::hook, Atomics>;
  using producers = producer_group<list>;

  static constexpr std::size_t producer_count = 4;
  static constexpr std::size_t nodes_per_producer = scaled(20000);

  // Producers publish every node the given way while one consumer loops del_all: each node is
  // taken exactly once, intact, and every non-empty batch began with exactly one add (or
  // add_batch) that found the list empty.
  void expect_one_del_all_consumer_takes_every_node_once(publish how) {
    list shared_list;
    std::latch start(producer_count + 1);
    consumer_tally tally;
    {
      producers adders(shared_list, nodes_, producer_count, start, how);
      std::thread consumer([&] {
        start.arrive_and_wait();
        tally = consume_with_del_all(shared_list, adders, nodes_);
      });
      consumer.join();
      adders.join();

      EXPECT_EQ(tally.non_empty_batches, adders.was_empty_adds())
          << "each non-empty del_all batch must begin with exactly one add that found the list empty";
    }
    EXPECT_EQ(tally.taken, nodes_.size());
    EXPECT_EQ(nodes_.taken_other_than(1), 0u);
    EXPECT_EQ(tally.payload_mismatches, 0u);
    EXPECT_TRUE(shared_list.empty());
  }

  stress_nodes nodes_{producer_count, nodes_per_producer};
};

TYPED_TEST_SUITE(LlistStressTest, atomics_backends);

TYPED_TEST(LlistStressTest, SingleDelAllConsumerTakesEveryNodeExactlyOnce) {
  this->expect_one_del_all_consumer_takes_every_node_once(publish::one_by_one);
}

TYPED_TEST(LlistStressTest, AddBatchProducersWithDelAllConsumerDeliverEveryNodeExactlyOnce) {
  this->expect_one_del_all_consumer_takes_every_node_once(publish::in_chains);
}

TYPED_TEST(LlistStressTest, ConcurrentDelAllConsumersEachTakeDistinctNodes) {
  constexpr std::size_t consumer_count = 3;
  typename TestFixture::list list;
  std::latch start(TestFixture::producer_count + consumer_count);
  std::vector<consumer_tally> tallies(consumer_count);
  {
    typename TestFixture::producers producers(list, this->nodes_, TestFixture::producer_count,
                                              start, publish::one_by_one);
    std::vector<std::thread> consumers;
    for (std::size_t c = 0; c < consumer_count; ++c) {
      consumers.emplace_back([&, c] {
        start.arrive_and_wait();
        tallies[c] = consume_with_del_all(list, producers, this->nodes_);
      });
    }
    for (std::thread& consumer : consumers) consumer.join();
    producers.join();

    std::size_t non_empty_batches = 0;
    for (const consumer_tally& tally : tallies) non_empty_batches += tally.non_empty_batches;
    EXPECT_EQ(non_empty_batches, producers.was_empty_adds());
  }
  std::size_t taken = 0;
  std::size_t payload_mismatches = 0;
  for (const consumer_tally& tally : tallies) {
    taken += tally.taken;
    payload_mismatches += tally.payload_mismatches;
  }
  EXPECT_EQ(taken, this->nodes_.size());
  EXPECT_EQ(this->nodes_.taken_other_than(1), 0u) << "a node went to two consumers, or to none";
  EXPECT_EQ(payload_mismatches, 0u);
  EXPECT_TRUE(list.empty());
}

TYPED_TEST(LlistStressTest, SingleDelFirstConsumerTakesEveryNodeExactlyOnce) {
  // Several rounds over the same nodes: the ordering checks depend on the consumer losing a
  // compare-and-swap to a producer and retrying, which a single short round under a sanitizer
  // does not always provoke. Each round must deliver every node exactly once.
  constexpr unsigned rounds = 4;
  typename TestFixture::list list;
  consumer_tally tally;
  for (unsigned round = 0; round < rounds; ++round) {
    std::latch start(TestFixture::producer_count + 1);
    typename TestFixture::producers producers(list, this->nodes_, TestFixture::producer_count,
                                              start, publish::one_by_one);
    std::thread consumer([&] {
      start.arrive_and_wait();
      idle_backoff idle;
      for (;;) {
        const bool producers_finished = producers.finished();
        stress_item* node = list.del_first();
        if (node == nullptr) {
          if (producers_finished) return;
          idle();
          continue;
        }
        ++tally.taken;
        if (!this->nodes_.payload_matches(*node)) ++tally.payload_mismatches;
        node->taken.fetch_add(1, std::memory_order_relaxed);
      }
    });
    consumer.join();
  }
  EXPECT_EQ(tally.taken, this->nodes_.size() * rounds);
  EXPECT_EQ(this->nodes_.taken_other_than(rounds), 0u);
  EXPECT_EQ(tally.payload_mismatches, 0u);
  EXPECT_TRUE(list.empty());
}

TYPED_TEST(LlistStressTest, RecyclingConsumerTakesEveryNodeOncePerRound) {
  // The consumer puts each node it takes back on the list until the node has been taken
  // `rounds` times, alternating single adds and one add_batch per batch, while the producers
  // are still adding.
  constexpr unsigned rounds = 4;
  typename TestFixture::list list;
  std::latch start(TestFixture::producer_count + 1);
  consumer_tally tally;
  {
    typename TestFixture::producers producers(list, this->nodes_, TestFixture::producer_count,
                                              start, publish::one_by_one);
    std::thread consumer([&] {
      start.arrive_and_wait();
      idle_backoff idle;
      for (bool as_chain = false;; as_chain = !as_chain) {
        const bool producers_finished = producers.finished();
        auto batch = list.del_all();
        if (batch.empty()) {
          if (producers_finished) return;
          idle();
          continue;
        }
        ++tally.non_empty_batches;
        typename TestFixture::list::chain again;
        for (stress_item& node : batch) {
          ++tally.taken;
          if (!this->nodes_.payload_matches(node)) ++tally.payload_mismatches;
          node.taken.fetch_add(1, std::memory_order_relaxed);
          if (++node.rounds == rounds) continue;
          if (as_chain) {
            again.push_back(node);
          } else if (list.add(node)) {
            ++tally.was_empty_readds;
          }
        }
        if (list.add_batch(std::move(again))) ++tally.was_empty_readds;
      }
    });
    consumer.join();
    producers.join();

    EXPECT_EQ(tally.non_empty_batches, producers.was_empty_adds() + tally.was_empty_readds);
  }
  EXPECT_EQ(tally.taken, this->nodes_.size() * rounds);
  EXPECT_EQ(this->nodes_.taken_other_than(rounds), 0u);
  EXPECT_EQ(tally.payload_mismatches, 0u);
  EXPECT_TRUE(list.empty());
}

}  // namespace
}  // namespace teardown_test
