// teardown/deferred/node.hpp — the node that carries one deferred object or mapping, the
// composition's traits, and munmap's checks (internal: include teardown/deferred.hpp).
//
// One six-word node per object carries it (hook, memoised charge, the function that frees it,
// the payload, munmap's length, and the owning domain for a shared worker's dispatch: 48 bytes,
// which glibc serves from a 64-byte chunk), so one queue takes objects of every type. A node that
// cannot be allocated sends its object down the inline path (deferred_domain counts it). Nodes
// are recycled (allocate_node, release_node): a shared lock-free stack and a cache per thread.
//
// Any thread. Memory ordering: none of its own; the node and its payload reach the reaper
// through the llist (release add, acquire del_all), and a recycled node comes back the same way.
// Design: docs/design.md, "deferred.hpp: the node".
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <system_error>

#include "teardown/allocator_purge.hpp"
#include "teardown/llist.hpp"
#include "teardown/shared_worker.hpp"

namespace teardown {

namespace detail {

// Frees a payload: deletes an object, or unmaps a range. May throw (a throwing destructor, a
// failed munmap).
using free_function = void (*)(void* payload, std::size_t length);

// One per queued object or range: the single allocation deferring costs.
struct deferred_node {
  llist_node hook;
  std::uint64_t charge = 0;    // the cost, read once; async_teardown memoises the charge here
  free_function free_payload = nullptr;
  void* payload = nullptr;
  std::size_t length = 0;      // munmap's length; 0 for objects
  void* owner = nullptr;       // the domain that queued it, for a shared worker's dispatch
};

// A node done with (its payload freed, or never queued): back on the recycle, or freed (below).
inline void release_node(deferred_node* node) noexcept;

// Frees a node on scope exit (deferred_traits::destroy: even if the payload's free throws).
struct released_node {
  deferred_node* node;
  ~released_node() { release_node(node); }
};

struct deferred_traits {
  static std::uint64_t cost(const deferred_node& node) noexcept { return node.charge; }
  static bool eligible(const deferred_node&, std::uint64_t) noexcept { return true; }
  static void prepare(deferred_node&) noexcept {}
  static void destroy(deferred_node& node) {
    const released_node owned{&node};  // recycled even if the payload's free throws
    node.free_payload(node.payload, node.length);
  }
  static std::uint64_t& charge(deferred_node& node) noexcept { return node.charge; }
  static void*& owner(deferred_node& node) noexcept { return node.owner; }
  // The trace points name the object (or the mapping, or for a chunk its first address: see
  // domain.hpp, "Chunks"), not its node: the inline paths that never allocate a node report the
  // same id.
  static std::uint64_t id(const deferred_node& node) noexcept {
    return reinterpret_cast<std::uintptr_t>(node.payload);
  }
};

template <class T>
void delete_as(void* payload, std::size_t) {
  delete static_cast<T*>(payload);
}

inline void unmap_range(void* addr, std::size_t length) {
  if (::munmap(addr, length) != 0) {
    const int error = errno;  // before the throw allocates
    throw std::system_error(error, std::generic_category(), "teardown::async_munmap: munmap failed");
  }
}

/// Fault injection for tests (not part of the API): the next N node allocations on the calling
/// thread fail, as if the allocator were out of memory; with node_allocations_before_failing
/// = K, only after K more have succeeded (a failure midway through a chunked munmap).
inline thread_local std::uint32_t fail_next_node_allocations = 0;
inline thread_local std::uint32_t node_allocations_before_failing = 0;

// The node recycle: nodes the reaper is done with go back on one shared lock-free stack (an
// llist: add from any thread), and a producer takes the whole stack at once (del_all) into a
// cache of its own, then allocates from that. So a hand-over takes no allocator lock while the
// reaper frees or trims: glibc's malloc_trim holds the arena's mutex while it gives pages back,
// and a producer's malloc of a node waited for it (10,000 buffers of 100 KiB: a free path of
// 80 ms, against 2.5 ms with the trim off). At most recycle_kept nodes wait on the stack (an
// estimate: the count is kept beside the list, not with it); beyond, they are freed. Never
// destroyed: nodes come back during exit, after static destructors began.
struct node_recycle {
  static constexpr std::uint32_t kept_max = 4096;
  llist<deferred_node, &deferred_node::hook> stack;
  std::atomic<std::uint32_t> kept{0};
};
inline node_recycle& shared_node_recycle() noexcept {
  static node_recycle* const recycle = new node_recycle;
  return *recycle;
}

// A thread's cache of recycled nodes, freed when the thread exits; after that (another
// thread-local's destructor deleting through a domain) the thread allocates with new again.
inline thread_local bool node_cache_gone = false;
struct node_cache {
  llist_batch<deferred_node, &deferred_node::hook> nodes;
  node_cache() = default;
  node_cache(const node_cache&) = delete;
  node_cache& operator=(const node_cache&) = delete;
  ~node_cache() {
    node_cache_gone = true;
    while (deferred_node* node = nodes.pop_front()) delete node;
  }
};
inline node_cache& this_thread_node_cache() noexcept {
  static thread_local node_cache cache;
  return cache;
}

inline deferred_node* allocate_node() noexcept {
  if (fail_next_node_allocations != 0) [[unlikely]] {
    if (node_allocations_before_failing != 0) {
      --node_allocations_before_failing;
    } else {
      --fail_next_node_allocations;
      return nullptr;
    }
  }
  // Not under mimalloc: there the recycle left 95 MiB of a freed 400 MiB map resident after the
  // flush and its collect, against 31 MiB with new and delete (alloc_matrix; the cause is not
  // known), and mimalloc's own small-block path takes no lock to wait for.
  if (!node_cache_gone && detect_allocator() != allocator_kind::mimalloc) {
    node_cache& cache = this_thread_node_cache();
    deferred_node* node = cache.nodes.pop_front();
    if (node == nullptr) {
      node_recycle& recycle = shared_node_recycle();
      if (recycle.kept.load(std::memory_order_relaxed) != 0) {
        recycle.kept.store(0, std::memory_order_relaxed);
        cache.nodes = recycle.stack.del_all();  // acquire (llist): the releasing thread's writes
        node = cache.nodes.pop_front();
      }
    }
    if (node != nullptr) return new (node) deferred_node;  // every field as new; trivially destructible
  }
  return new (std::nothrow) deferred_node;
}

inline void release_node(deferred_node* node) noexcept {
  if (detect_allocator() == allocator_kind::mimalloc) {
    delete node;
    return;
  }
  node_recycle& recycle = shared_node_recycle();
  if (recycle.kept.load(std::memory_order_relaxed) >= node_recycle::kept_max) {
    delete node;
    return;
  }
  recycle.kept.fetch_add(1, std::memory_order_relaxed);
  (void)recycle.stack.add(*node);  // release (llist): pairs with allocate_node's del_all
}


inline std::size_t page_size() noexcept {
  static const std::size_t size = [] {
    const long page = sysconf(_SC_PAGESIZE);
    return page > 0 ? static_cast<std::size_t>(page) : std::size_t{4096};
  }();
  return size;
}

// munmap's own checks that can be made without the kernel; throws std::invalid_argument naming
// the problem. Returns the length rounded up to whole pages (what the munmap frees).
inline std::size_t checked_unmap_length(const void* addr, std::size_t length) {
  const auto where = reinterpret_cast<std::uintptr_t>(addr);
  const std::size_t page = page_size();
  if (addr == nullptr) throw std::invalid_argument("teardown::async_munmap: addr is null");
  if (where % page != 0) {
    throw std::invalid_argument("teardown::async_munmap: addr is not a multiple of the page size (" +
                                std::to_string(page) + ")");
  }
  if (length == 0) throw std::invalid_argument("teardown::async_munmap: length is 0");
  // The last byte unmapped is addr + rounded - 1 with rounded = last_offset + 1: it must not wrap.
  const std::size_t last_offset = (length - 1) | (page - 1);
  if (last_offset > std::numeric_limits<std::uintptr_t>::max() - where) {
    throw std::invalid_argument("teardown::async_munmap: addr + length wraps around the address space");
  }
  return last_offset + 1;
}

}  // namespace detail

// ---- the domain -----------------------------------------------------------------------------

/// A worker several deferred_domains share (opts.worker; shared_worker.hpp).
using deferred_worker = shared_worker<detail::deferred_node, &detail::deferred_node::hook, detail::deferred_traits>;

}  // namespace teardown
