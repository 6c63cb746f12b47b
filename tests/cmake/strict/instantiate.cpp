// The strict consumer's program: an explicit instantiation of each class template instantiates
// every member function whose constraints hold, so a warning in any of them fails the build
// with -Werror (a header included alone only checks what does not depend on a template
// parameter). main() then runs one item through each path, which proves the program links and
// runs with the standard library it was built against.
#include <teardown/teardown.hpp>
#include <teardown/model/mm.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>

namespace {

struct item {
  teardown::llist_node hook;
  std::uint64_t bytes = 0;
  std::uint64_t charge = 0;
  bool destroyed = false;
};

struct item_traits {
  std::uint64_t cost(const item& i) const { return i.bytes; }
  bool eligible(const item&, std::uint64_t) const { return true; }
  void prepare(item&) {}
  void destroy(item& i) { i.destroyed = true; }
  std::uint64_t& charge(item& i) { return i.charge; }
};

struct mark_destroyed {
  void operator()(item& i) const { i.destroyed = true; }
};

struct payload {
  std::uint64_t bytes = 0;
};

}  // namespace

template class teardown::llist<item, &item::hook>;
#if TEARDOWN_AO_ATOMICS_AVAILABLE
template class teardown::llist<item, &item::hook, teardown::ao_atomics>;
#endif
template class teardown::llist_batch<item, &item::hook>;
template class teardown::llist_chain<item, &item::hook>;
template class teardown::sharded_llist<item, &item::hook>;
template class teardown::basic_budget<teardown::add_then_check>;
template class teardown::basic_budget<teardown::exact>;
template class teardown::basic_reservation<teardown::budget>;
template class teardown::basic_reservation<teardown::exact_budget>;
template class teardown::reaper<item, &item::hook, mark_destroyed>;
template class teardown::reaper_pool<item, &item::hook, mark_destroyed>;
template class teardown::async_teardown<item, &item::hook, item_traits>;
template class teardown::async_teardown<item, &item::hook, item_traits, teardown::static_key,
                                        teardown::reaper_pool_workers>;
template class teardown::deferred_deleter<payload>;
template class teardown::model::basic_mm_system<>;
template class teardown::model::basic_mm_system<teardown::static_key, teardown::reaper_pool_workers>;
template class teardown::pressure_policy<teardown::async_teardown<item, &item::hook, item_traits>>;
template class teardown::pressure_policy<teardown::deferred_domain>;
template class teardown::pressure_policy<teardown::model::basic_mm_system<>>;

int main() {
  int failures = 0;

  item queued;
  queued.bytes = 4096;
  {
    teardown::reaper<item, &item::hook, mark_destroyed> reaper{mark_destroyed{}};
    reaper.enqueue(queued);
    reaper.flush();
  }
  failures += queued.destroyed ? 0 : 1;

  item put;
  put.bytes = 4096;
  {
    teardown::async_teardown<item, &item::hook, item_traits> async;
    (void)async.put(put);
    failures += async.flush_for(std::chrono::seconds(30)) ? 0 : 1;
  }
  failures += put.destroyed ? 0 : 1;

  // The deferral compiled out (a const_key<false>): every put is inline. Its members that only
  // a runtime toggle has are never called, so it cannot be instantiated explicitly above.
  item inline_put;
  {
    teardown::async_teardown<item, &item::hook, item_traits, teardown::const_key<false>> compiled_out;
    (void)compiled_out.put(inline_put);
  }
  failures += inline_put.destroyed ? 0 : 1;

  teardown::deferred_domain domain;
  {
    const teardown::deferred_ptr<payload> deferred(new payload{.bytes = 64},
                                                   teardown::deferred_deleter<payload>(domain));
  }
  domain.flush();

  std::printf("strict consumer: %d failure(s)\n", failures);
  return failures;
}
