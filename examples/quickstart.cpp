// quickstart: four producer threads hand heap-allocated work items to one consumer through a
// teardown::llist. Producers never block; the consumer wakes only when a push found the list
// empty, takes everything with one del_all(), runs the items oldest first and frees them.
// `--producers N` and `--items N` (per producer) change the load; `--help` lists them.
#include <teardown/llist.hpp>

#include "example_args.hpp"

#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

struct work_item {
  teardown::llist_node hook;  // the list links through this member; no allocation per push
  int producer = 0;
  long payload = 0;
};

int main(int argc, char** argv) {
  int producers = 4;
  int items_per_producer = 25'000;
  example::command_line cli("quickstart",
                            "Producer threads hand work items to one consumer through a teardown::llist.");
  cli.option("--producers", "N", producers, example::between(1, 256), "producer threads");
  cli.option("--items", "N", items_per_producer, example::between(1, 10'000'000), "items each producer pushes");
  cli.parse(argc, argv);
  teardown::llist<work_item, &work_item::hook> queue;
  std::atomic<int> wakeups{0};  // the consumer's doorbell: bumped on empty -> non-empty only
  std::atomic<int> producers_done{0};

  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      for (int i = 0; i < items_per_producer; ++i) {
        auto* item = new work_item{.hook = {}, .producer = p, .payload = i};
        if (queue.add(*item)) {  // true: the list was empty, so the consumer may be asleep
          wakeups.fetch_add(1, std::memory_order_release);
          wakeups.notify_one();
        }
      }
      producers_done.fetch_add(1, std::memory_order_release);
      wakeups.fetch_add(1, std::memory_order_release);  // a last ring so the consumer sees "done"
      wakeups.notify_one();
    });
  }

  long items = 0, batches = 0, sum = 0;
  for (;;) {
    const bool finished = producers_done.load(std::memory_order_acquire) == producers;
    auto batch = queue.del_all();
    if (!batch.empty()) ++batches;
    for (work_item& item : std::move(batch).reverse()) {  // oldest first; the loop may free item
      sum += item.payload;
      ++items;
      delete &item;
    }
    if (finished && queue.empty()) break;
    // The rings seen so far, then "done" again: the last producer's final ring may already be
    // in seen_rings (it rang while we ran the batch), and waiting for a later one would be for ever.
    const int seen_rings = wakeups.load(std::memory_order_acquire);
    if (queue.empty() && producers_done.load(std::memory_order_acquire) != producers) {
      wakeups.wait(seen_rings, std::memory_order_acquire);
    }
  }
  for (auto& t : threads) t.join();

  std::printf("quickstart: %d producers pushed %ld items; the consumer took them in %ld batches "
              "(%.1f items per batch) and freed them all (payload sum %ld)\n",
              producers, items, batches, static_cast<double>(items) / static_cast<double>(batches), sum);
  return items == long{producers} * items_per_producer ? 0 : 1;
}
