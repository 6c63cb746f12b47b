// The element and helpers that llist_test.cpp and sharded_llist_test.cpp share, so that both
// lists are specified on the same element and read their batches the same way.
#pragma once

#include <vector>

#include "teardown/llist.hpp"

namespace teardown_test {

// The hook deliberately does not sit at offset 0, so every test also checks that the list
// finds the element from its hook.
struct item {
  explicit item(int id_) : id(id_) {}
  int id;
  teardown::llist_node hook;
};

using item_batch = teardown::llist_batch<item, &item::hook>;
using item_chain = teardown::llist_chain<item, &item::hook>;

// Drains a batch with range-for and returns the ids in the order it yielded them.
template <class Batch>
std::vector<int> ids_of(Batch&& batch) {
  std::vector<int> ids;
  for (auto& element : batch) ids.push_back(element.id);
  return ids;
}

}  // namespace teardown_test
