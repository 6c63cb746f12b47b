// The program every consumer project builds: it uses the library the way a user would, through
// whichever of the four routes its CMakeLists.txt chose, and fails loudly if anything is off.
#include <teardown/teardown.hpp>

#include <cstdio>
#include <thread>

namespace {

struct buffer {
  teardown::llist_node hook;
  int id = 0;
};

template <class Atomics>
int round_trip(const char* backend) {
  teardown::llist<buffer, &buffer::hook, Atomics> list;
  buffer items[3];
  for (int i = 0; i < 3; ++i) items[i].id = i;
  const bool first_was_empty = list.add(items[0]);
  std::thread other([&] { list.add(items[1]); });
  other.join();
  list.add(items[2]);
  int taken = 0;
  for (buffer& b : list.del_all().reverse()) taken += b.id + 1;
  std::printf("consumer (%s atomics): was-empty %d, took %d\n", backend, first_was_empty, taken);
  return first_was_empty && taken == 6 ? 0 : 1;
}

}  // namespace

int main() {
  int failures = round_trip<teardown::std_atomics>("std");
#if TEARDOWN_AO_ATOMICS_AVAILABLE  // where the header found <atomic_ops.h>, opted in or not
  failures += round_trip<teardown::ao_atomics>("libatomic_ops");
#endif
  return failures;
}
