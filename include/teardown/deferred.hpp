// teardown/deferred.hpp — deferred_delete: destroy big objects and unmap big mappings off the
// caller's thread.
//
// Destroying a huge object (a cache, an arena, a 1 GiB std::vector) or munmap()ing a large
// mapping takes milliseconds: the kernel frees every page, and a destructor may walk millions
// of nodes. On a latency path that is a stall. The kernel series moves an exiting process's
// address-space teardown to its mm_reaper thread; this header does the same for C++ objects:
//
//     teardown::deferred_ptr<cache> c = teardown::make_deferred<cache>(args);   // a unique_ptr
//     c.reset();                          // big: destroyed on the reaper; small: right here
//     std::shared_ptr<cache> s(new cache, teardown::deferred_deleter<cache>{});
//     teardown::async_munmap(addr, length);     // big mappings are unmapped on the reaper
//     teardown::deferred::flush();              // everything handed over so far is gone
//
//     teardown::deferred_domain mine(opts);     // an instance of your own: its own thread,
//     teardown::deferred_ptr<cache> p(new cache, teardown::deferred_deleter<cache>{mine});
//     opts.worker = teardown::deferred::default_worker();   // ... or the default domain's thread
//     teardown::deferred_domain light(opts);                 // (shared_worker.hpp): no new thread
//
// A deleter measures the object (its cost, in bytes), deletes it inline when that is below the
// threshold, and otherwise hands it to its domain's async_teardown: one six-word node per
// object carries it (hook, memoised charge, the function that frees it, the payload, munmap's
// length, and the owning domain for a shared worker's dispatch: 48 bytes, which glibc serves
// from a 64-byte chunk where the five words took 48), so one queue takes objects of every type. The budget (max_pending) bounds the bytes
// waiting to be freed; past it, deletion falls back to inline: a reaper that falls behind costs
// latency, never an out-of-memory kill. So does a node that cannot be allocated.
//
// Who may call what (an explicit domain must outlive every call and every deleter naming it)
//   deferred_deleter::operator(), deferred_delete, deferred_domain::delete_object
//                       any thread, concurrently; noexcept. Queuing is as lock-free as the
//                       allocator: the cost function, one node allocation, one budget RMW, one
//                       llist CAS (a thread's very first call takes a mutex once: counter
//                       shards). Inline deletion runs the destructor here, blocking as it does.
//                       A destructor that throws terminates the program when it runs here (the
//                       deleter is noexcept, as std::default_delete's callers are); on the
//                       reaper it is counted in errors and handed to reaper.on_error.
//   async_munmap, deferred_domain::unmap
//                       the same, but may throw: std::invalid_argument for bad input (nothing
//                       changes), std::system_error if an inline munmap fails.
//   flush, flush_for, drain, freeze, thaw, shutdown, shutdown_for
//                       any thread but the domain's reaper (a destructor running there is
//                       refused with std::logic_error: it would wait for itself); may block.
//                       shutdown (and the destructor) wait without limit; shutdown_for gives up
//                       after a timeout, leaving the rest to the still-running reaper.
//   ~deferred_domain    any thread but the domain's own reaper and its drain (a destructor it
//                       runs that destroys the domain aborts with a message).
//   stats, enabled, threshold, max_pending, set_threshold, trace_domain, replace_max_pending
//                       any thread; wait-free (replace_max_pending: lock-free).
//   worker_nice, set_worker_nice   any thread; take the reaper's nice mutex briefly.
//   enable, disable, set_enabled, set_max_pending
//                       any thread; writers serialize (may block briefly). set_max_pending on
//                       a domain sharing a budget sets the shared cap.
//   default_max_pending, default_budget, default_options
//                       any thread. default_max_pending reads memory_limit() (a few small
//                       files; noexcept). default_budget's first call creates the budget
//                       (thread-safe; may throw std::bad_alloc); later calls are wait-free.
//   deferred::default_domain, deferred::flush, deferred::stats
//                       any thread, any time, even during and after static destruction (see
//                       below). The first call creates the domain (thread-safe, blocking; it
//                       throws std::system_error if the reaper cannot start, and the deleters,
//                       deferred_delete and async_munmap then free inline); later calls are
//                       wait-free, but for each thread's first, which reads its thread id (and
//                       on the main thread allocates once, to arm the exit sentinel).
//   deferred::set_exit_timeout, deferred::exit_timeout
//                       any thread, any time; wait-free.
//   deferred::default_worker
//                       any thread. The first call starts the default domain's worker (one
//                       thread, "deferred_delete"; std::system_error if it cannot); never
//                       destroyed. Domains given it (opts.worker) add no thread; they follow
//                       shared_worker.hpp's rules (freeze and flush act on it, for every sharer).
//
// What an object costs (the bytes its destruction frees: compared with the threshold and
// charged to the budget), first match wins:
//   1. the deleter's cost function: deferred_deleter<T>{cost} or {domain, cost}, where cost is
//      a std::uint64_t (*)(const T&) (a capture-less lambda converts);
//   2. teardown_cost(const T&), found by argument-dependent lookup only: declare it in T's
//      namespace or as a hidden friend;
//   3. T has capacity() and value_type (std::vector, std::string): sizeof(T) + capacity() *
//      sizeof(value_type), so a 1 GiB std::vector<char> costs 1 GiB whatever its size();
//   4. T is an allocator-aware container with size() (std::deque, std::list, std::map,
//      std::unordered_map...): sizeof(T) + size() * sizeof(value_type);
//   5. sizeof(T).
// 3 and 4 are shallow: a std::vector<std::string> counts the strings' headers, not their
// characters. Give such types a teardown_cost; teardown::deferred_cost(object) is steps 2-5, to
// build one on. A cost function that throws is counted in errors; that object is deleted inline.
//
// Knobs (async_teardown_options; deferred_domain::default_options() holds these defaults, which
// plain async_teardown_options{} does not: start from default_options()):
//   threshold = 64 KiB    below it, deleting inline is cheaper than queuing: queuing costs a
//                         node allocation and free (on two threads) and a cache miss on the
//                         reaper, and freeing a small block costs about as much. glibc serves
//                         blocks from 128 KiB up (its initial mmap threshold) with mmap and
//                         gives them back with munmap: those are worth deferring.
//   max_pending = a quarter of memory (memory_limit.hpp: the tightest of physical RAM and
//                         every cgroup v1/v2 memory limit above this process), in bytes, ONE
//                         cap shared by every domain made from default_options(), the default
//                         domain included (default_budget()): N such domains hold a quarter,
//                         not N quarters. Deferring holds memory longer; this caps how much.
//                         Set max_pending on default_options() for a budget of the domain's
//                         own; set it where another limit applies (RLIMIT_AS).
//   sync_when_stalled = true: while the reaper's oldest queued object has waited longer than
//                         reaper.stall_threshold (1 s), deletions are inline (a destructor that
//                         blocks on the reaper must not make everything else wait behind it).
//   trim = {.after = 64 MiB}: freed is not returned — glibc keeps freed medium blocks in its
//                         heap (and raises its mmap threshold after the first large free), so
//                         RSS stays up after a deferred delete. After a batch, once the batches
//                         since its last trim freed 64 MiB, the reaper calls malloc_trim: on
//                         the reaper only, never on a deleting thread, in a drain or after
//                         shutdown (allocator_trim.hpp; stats(): trims, trimmed_bytes,
//                         trim_cpu_ns). At most 64 MiB stays untrimmed; trim.after = 0 turns it
//                         off.
//   reaper: named "deferred_delete", nice 19, on the housekeeping CPUs (reaper.hpp).
//
// The default domain (deferred::default_domain(): what deferred_deleter<T>{}, deferred_delete
// and async_munmap use) runs on deferred::default_worker(), a shared worker other domains may
// use too. At exit the default domain's shutdown also stops that worker (draining every
// sharer's queue; from then on every sharer deletes inline), within the exit timeout. It is
// created on first use and never destroyed, so no deleter can ever
// reach a dead domain. It is shut down once at exit (everything queued is destroyed, the reaper
// joined; every deletion after that is inline on its caller, so none is lost or destroyed
// twice), by the first of:
//   - the main thread's sentinel: a thread_local armed by the first default_domain() call on
//     the main thread (the one that creates the domain, or the first deletion there). When main
//     returns or calls exit(), [basic.start.term] destroys that thread's thread_locals before any
//     static, so everything queued is destroyed while every static is still alive, and statics
//     destroyed afterwards are deleted inline, in the order the program destroys them.
//   - exit() called from a destructor running on the reaper: the closer (below) then runs on
//     the reaper itself, at its place among the statics; it frees the rest of the reaper's batch
//     and the queue right there, and deletions from then on are inline. The object whose
//     destructor called exit() is not destroyed again (exit() does not return to it).
//   - the closer, a function-local static constructed right after the domain: the fallback, at
//     its own place in static destruction (reverse order of construction).
// Where it stops: exit() from any thread but main (the reaper's included), and a main thread
// that never called default_domain() before exit, reach only the closer: statics constructed
// after the domain are destroyed before it, while the reaper may still be destroying objects
// that use them (call default_domain() early in main, or shut the domain down before such an
// exit). No sentinel is armed on other threads: at their ordinary exit it could not tell a
// thread's end from the process's, and would cost every thread a destructor.
// pthread_exit() from main runs the sentinel too: the domain is shut down then, and deletions are
// inline for the rest of the process. quick_exit, _exit, abort and a fatal signal run no
// destructors: what is queued then is left to the operating system (flush() first). exit()
// called by a destructor that drain() runs is not handled: the domain is not shut down (that
// would wait for the drain) and the rest of that drain's batch is left to the operating system.
// The shutdown waits without limit; deferred::set_exit_timeout(d)
// bounds it: after d, exit proceeds, what is left stays counted (stats(): queued - reaped) and
// is left to the operating system, with the reaper still destroying objects while the statics
// go. A program with hidden symbol visibility has one default domain per shared object. Its
// first use must not come from a destructor running on another domain's reaper (a reaper's fn
// must not construct a reaper: reaper.hpp); a program whose queued destructors delete through
// the default domain calls deferred::default_domain() early.
//
// fork(): the reaper handles it (reaper.hpp). In the child, deletions run inline, and what the
// parent had queued is destroyed in the child by its next deletion, flush or exit: once in each
// process, each on its own copy. The same holds for queued munmaps (the child inherited the
// mappings).
//
// async_munmap hands the range over: until it is unmapped the caller must not touch it, nor
// mmap(MAP_FIXED) over it (the deferred munmap would remove the new mapping); flush() first to
// reuse the addresses. Plain mmap never returns addresses that are still mapped.
//
// Memory ordering: nothing here adds any. The node and the object reach the reaper through the
// llist (release add, acquire del_all), so a destructor on the reaper sees everything the
// caller wrote to the object before deleting it. Counters and knobs are relaxed.
#pragma once

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>

#include "teardown/async_teardown.hpp"
#include "teardown/budget.hpp"
#include "teardown/counter.hpp"
#include "teardown/llist.hpp"
#include "teardown/memory_limit.hpp"
#include "teardown/reaper.hpp"
#include "teardown/shared_worker.hpp"
#include "teardown/trace.hpp"

namespace teardown {

// ---- cost -----------------------------------------------------------------------------------

namespace detail::cost_lookup {

// Hides every teardown_cost outside T's associated namespaces: only ADL finds candidates.
void teardown_cost() = delete;

template <class T>
concept adl_cost = requires(const T& object) {
  { teardown_cost(object) } -> std::convertible_to<std::uint64_t>;
};

template <class T>
std::uint64_t call(const T& object) {
  return static_cast<std::uint64_t>(teardown_cost(object));
}

}  // namespace detail::cost_lookup

/// T has a teardown_cost(const T&) that argument-dependent lookup finds.
template <class T>
concept has_teardown_cost = detail::cost_lookup::adl_cost<T>;

namespace detail {

template <class T>
concept capacity_container = requires(const T& container) {
  typename T::value_type;
  { container.capacity() } -> std::convertible_to<std::uint64_t>;
};

template <class T>
concept sized_container = requires(const T& container) {
  typename T::value_type;
  typename T::allocator_type;
  { container.size() } -> std::convertible_to<std::uint64_t>;
};

// sizeof(T) + count * element, saturating at the largest uint64_t instead of wrapping.
inline std::uint64_t container_bytes(std::uint64_t header, std::uint64_t count, std::uint64_t element) noexcept {
  constexpr std::uint64_t most = std::numeric_limits<std::uint64_t>::max();
  if (element != 0 && count > (most - header) / element) return most;
  return header + count * element;
}

}  // namespace detail

/// Steps 2-5 of the cost lookup (see the header comment): what a deferred_deleter without a
/// cost function charges for `object`, in bytes.
template <class T>
std::uint64_t deferred_cost(const T& object) {
  if constexpr (has_teardown_cost<T>) {
    return detail::cost_lookup::call(object);
  } else if constexpr (detail::capacity_container<T>) {
    return detail::container_bytes(sizeof(T), static_cast<std::uint64_t>(object.capacity()),
                                   sizeof(typename T::value_type));
  } else if constexpr (detail::sized_container<T>) {
    return detail::container_bytes(sizeof(T), static_cast<std::uint64_t>(object.size()),
                                   sizeof(typename T::value_type));
  } else {
    return sizeof(T);
  }
}

// ---- the node and the composition's traits ----------------------------------------------------

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

struct deferred_traits {
  static std::uint64_t cost(const deferred_node& node) noexcept { return node.charge; }
  static bool eligible(const deferred_node&, std::uint64_t) noexcept { return true; }
  static void prepare(deferred_node&) noexcept {}
  static void destroy(deferred_node& node) {
    const std::unique_ptr<deferred_node> owned(&node);  // freed even if the payload's free throws
    node.free_payload(node.payload, node.length);
  }
  static std::uint64_t& charge(deferred_node& node) noexcept { return node.charge; }
  static void*& owner(deferred_node& node) noexcept { return node.owner; }
  // The trace points name the object (or the mapping), not its node: the inline paths that
  // never allocate a node report the same id.
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
/// thread fail, as if the allocator were out of memory.
inline thread_local std::uint32_t fail_next_node_allocations = 0;

inline deferred_node* allocate_node() noexcept {
  if (fail_next_node_allocations != 0) [[unlikely]] {
    --fail_next_node_allocations;
    return nullptr;
  }
  return new (std::nothrow) deferred_node;
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

namespace detail {
struct default_domain_exit;
}  // namespace detail

/// A snapshot of a domain's counters. queued + freed_inline = deletions and unmaps handed in
/// (null pointers aside); small, rejected and no_memory are subsets of freed_inline. Once
/// flush() returns with nothing being handed in, reaped == queued and pending_bytes == 0. On a
/// shared budget (default_options()), pending_bytes, max_pending and high_water are the shared
/// budget's, every sharer's together: pending_bytes is 0 once each sharer has flushed.
struct deferred_stats {
  std::uint64_t queued = 0;         // handed to the reaper
  std::uint64_t reaped = 0;         // queued ones freed (by the reaper, or by drain or shutdown)
  std::uint64_t freed_inline = 0;   // freed on the caller, for any reason; of which:
  std::uint64_t small = 0;          //   the cost was below the threshold
  std::uint64_t rejected = 0;       //   the budget (max_pending) was full
  std::uint64_t no_memory = 0;      //   the node could not be allocated
  std::uint64_t errors = 0;         // a destructor threw or a munmap failed on the reaper, or a
                                    // cost function threw
  std::uint64_t pending_bytes = 0;  // queued and not yet freed
  std::uint64_t max_pending = 0;    // the budget's cap
  std::uint64_t high_water = 0;     // the highest pending_bytes so far
  std::uint64_t trims = 0;          // allocator trims the reaper made (see "Knobs": trim)
  std::uint64_t trimmed_bytes = 0;  // what they gave back: the resident set's drop across each
  std::uint64_t trim_cpu_ns = 0;    // the reaper's CPU in them
};

class deferred_domain {
 public:
  /// Below this many bytes an object is deleted inline (see "Knobs").
  static constexpr std::uint64_t default_threshold = std::uint64_t{64} << 10;
  /// The reaper trims the allocator once batches freed this many bytes (see "Knobs").
  static constexpr std::uint64_t default_trim_after = std::uint64_t{64} << 20;

  /// A quarter of memory (see "Knobs"); 1 GiB if the system does not say.
  static std::uint64_t default_max_pending() noexcept {
    const std::uint64_t memory = memory_limit();
    const std::uint64_t quarter = memory != 0 ? memory / 4 : std::uint64_t{1} << 30;
    return std::min(quarter, budget::max_cap);
  }

  /// The budget every domain made from default_options() shares, the default domain's
  /// included: one cap of default_max_pending() for all of them. Created on first use
  /// (thread-safe; may throw std::bad_alloc), never destroyed (a domain created during static
  /// destruction still finds it).
  static const std::shared_ptr<budget>& default_budget() {
    static const std::shared_ptr<budget>* const shared =
        new std::shared_ptr<budget>(std::make_shared<budget>(default_max_pending()));
    return *shared;
  }

  /// The defaults described under "Knobs", for a caller to adjust: shared_budget is
  /// default_budget() and max_pending is left unset (budget::max_cap).
  static async_teardown_options default_options() {
    async_teardown_options opts;
    opts.threshold = default_threshold;
    opts.shared_budget = default_budget();
    opts.reaper.name = "deferred_delete";
    opts.trim.after = default_trim_after;
    return opts;
  }

  /// Starts the reaper. Options from default_options() with max_pending set by hand give the
  /// domain a budget of its own with that cap (the shared one is dropped). Throws
  /// std::invalid_argument if max_pending > budget::max_cap (or is set along with another
  /// shared budget), std::system_error if the thread cannot start.
  explicit deferred_domain(async_teardown_options opts = default_options())
      : async_(own_cap_if_set(std::move(opts))) {}

  /// Frees everything still queued (the reaper drains it), then joins the reaper. May block,
  /// without limit (shutdown_for first bounds the wait). Every deleter naming this domain must
  /// be gone (or never used again) by then. Destroying the domain from a destructor it runs
  /// (on its reaper, or inside its drain) aborts with a message: that destructor's caller would
  /// go on using the freed domain.
  ~deferred_domain() {
    if (async_.in_own_callback()) {
      detail::fatal_misuse(
          "teardown::deferred_domain::~deferred_domain: the domain is destroyed from a destructor (or munmap) it "
          "runs itself, on its reaper or inside its drain; the reaper would go on using the freed domain. "
          "Destroy it from another thread.\n");
    }
  }

  deferred_domain(const deferred_domain&) = delete;
  deferred_domain& operator=(const deferred_domain&) = delete;

  /// Deletes `object` (allocated with new) on the reaper or inline; says which and why. Its cost
  /// comes from steps 2-5 of the lookup. A null pointer does nothing (sync_ineligible, not
  /// counted). No memory for the node: sync_no_memory (counted in no_memory).
  template <class T>
  decision delete_object(T* object) noexcept {
    return delete_object(object, [](const T& o) { return deferred_cost(o); });
  }

  /// The same with a cost function: cost(const T&) -> bytes.
  template <class T, class Cost>
    requires std::invocable<Cost&, const T&>
  decision delete_object(T* object, Cost&& cost) noexcept {
    static_assert(!std::is_void_v<T> && sizeof(T) > 0, "deferred delete of an incomplete type");
    static_assert(!std::is_array_v<T>, "deferred delete of an array: its length is unknown; use a std::vector");
    static_assert(!std::is_polymorphic_v<T> || std::has_virtual_destructor_v<T>,
                  "deleting a polymorphic type through a pointer to a base without a virtual destructor");
    if (object == nullptr) return decision::sync_ineligible;
    void* const payload = const_cast<void*>(static_cast<const volatile void*>(object));
    if (!async_.enabled()) {
      return free_inline(disabled_, "disabled", &detail::delete_as<T>, payload, 0, 0, decision::sync_disabled);
    }
    std::uint64_t bytes = 0;
    try {
      bytes = static_cast<std::uint64_t>(std::invoke(cost, std::as_const(*object)));
    } catch (...) {
      return free_inline(cost_errors_, "cost_error", &detail::delete_as<T>, payload, 0, 0, decision::sync_ineligible);
    }
    return hand_over(&detail::delete_as<T>, payload, 0, bytes);
  }

  /// munmap(addr, length) on the reaper, or inline below the threshold; returns the decision.
  /// Bad input — a null or unaligned addr, a zero length, a range that wraps — throws
  /// std::invalid_argument and changes nothing. An inline munmap that fails throws
  /// std::system_error (nothing was unmapped); one that fails on the reaper is counted in
  /// errors and handed to the reaper's on_error. The charge is length rounded up to pages.
  decision unmap(void* addr, std::size_t length) {
    const std::size_t bytes = detail::checked_unmap_length(addr, length);
    if (!async_.enabled()) {
      return free_inline(disabled_, "disabled", &detail::unmap_range, addr, length, bytes, decision::sync_disabled);
    }
    return hand_over(&detail::unmap_range, addr, length, bytes);
  }

  /// Blocks until everything handed over before the call is freed.
  /// Driven mode (opts.reaper.driven): the reaper's run and work_fd (reaper.hpp, "Driven mode").
  drive_result run(drive_limits limits = {}) { return async_.run(limits); }
  int work_fd() const noexcept { return async_.work_fd(); }

  void flush() { async_.flush(); }
  /// flush() with a time limit: true if it completed in time.
  template <class Rep, class Period>
  bool flush_for(std::chrono::duration<Rep, Period> timeout) {
    return async_.flush_for(timeout);
  }
  /// Pressure valve: frees queued objects on the caller, oldest first, while their charges fit
  /// in max_bytes (those the reaper already holds are left to it). Blocking.
  drain_result drain(std::uint64_t max_bytes) { return async_.drain(max_bytes); }
  /// Parks the reaper between objects (deletions keep queuing, up to max_pending); nests.
  void freeze() { async_.freeze(); }
  /// Undoes one freeze(); throws std::logic_error, changing nothing, without one.
  void thaw() { async_.thaw(); }
  /// Frees everything queued and joins the reaper; afterwards every deletion is inline.
  /// Idempotent. May block, without limit.
  void shutdown() { async_.shutdown(); }
  /// shutdown() that waits at most `timeout`: true iff everything queued was freed and the
  /// reaper joined in time. Either way every deletion is inline from now on. False leaves the
  /// rest queued and counted (stats().pending_bytes, queued - reaped), the reaper still freeing
  /// it; a later shutdown, shutdown_for, flush or the destructor waits for it again. Nothing is
  /// lost or freed twice.
  template <class Rep, class Period>
  bool shutdown_for(std::chrono::duration<Rep, Period> timeout) {
    return async_.shutdown_for(timeout);
  }

  /// Off: everything is deleted inline (no node, no queue).
  bool enabled() const noexcept { return async_.enabled(); }
  void enable() { async_.enable(); }
  void disable() { async_.disable(); }
  void set_enabled(bool on) { async_.set_enabled(on); }

  std::uint64_t threshold() const noexcept { return async_.threshold(); }
  void set_threshold(std::uint64_t bytes) noexcept { async_.set_threshold(bytes); }
  std::uint64_t max_pending() const noexcept { return async_.max_pending(); }
  /// Throws std::invalid_argument, changing nothing, above budget::max_cap. On a shared budget
  /// (default_options()) it sets the shared cap, for every domain sharing it.
  void set_max_pending(std::uint64_t bytes) { async_.set_max_pending(bytes); }
  /// async_teardown::replace_max_pending: the cap replaced only if it still reads `expected`.
  bool replace_max_pending(std::uint64_t expected, std::uint64_t desired) {
    return async_.replace_max_pending(expected, desired);
  }
  /// The reaper's nice value, and a new one (async_teardown::set_worker_nice: true if applied).
  int worker_nice() const { return async_.worker_nice(); }
  bool set_worker_nice(int value) { return async_.set_worker_nice(value); }

  /// A snapshot; each subset is read before its superset.
  deferred_stats stats() const noexcept {
    deferred_stats s;
    const std::uint64_t small = small_.read();
    const std::uint64_t no_memory = no_memory_.read();
    const std::uint64_t cost_errors = cost_errors_.read();
    const std::uint64_t disabled = disabled_.read();
    const async_teardown_stats queue = async_.stats();
    s.queued = queue.queued;
    s.reaped = queue.reaped;
    s.freed_inline = queue.sync + small + no_memory + cost_errors + disabled;
    s.small = small;
    s.rejected = queue.rejected;
    s.no_memory = no_memory;
    s.errors = queue.errors + cost_errors;
    s.pending_bytes = queue.pending;
    s.max_pending = queue.cap;
    s.high_water = queue.high_water;
    s.trims = queue.trim.trims;
    s.trimmed_bytes = queue.trim.trimmed_bytes;
    s.trim_cpu_ns = queue.trim.trim_cpu_ns;
    return s;
  }

  /// The reaper's own statistics (worker CPU time, wake-ups, batches...).
  reaper_stats reaper_statistics() const noexcept { return async_.reaper_statistics(); }

  /// The trace domain every event of this domain carries (its async_teardown's; trace.hpp).
  std::uint64_t trace_domain() const noexcept { return async_.trace_domain(); }

 private:
  friend struct detail::default_domain_exit;

  using queue_type = async_teardown<detail::deferred_node, &detail::deferred_node::hook, detail::deferred_traits>;

  // "Start from default_options() and set max_pending" asks for that cap: a budget of its own.
  static async_teardown_options own_cap_if_set(async_teardown_options&& opts) {
    if (opts.max_pending != budget::max_cap && opts.shared_budget != nullptr && opts.shared_budget == default_budget()) {
      opts.shared_budget = nullptr;
    }
    return std::move(opts);
  }

  // The default domain's shutdown at exit (see "The default domain"). exit() called from a
  // destructor on the reaper: the rest of its batch and the queue are freed on it, here. Anywhere
  // else: shutdown, bounded by `limit` (nanoseconds::max(): none). Inside this domain's drain
  // the shutdown is refused (it would wait for itself) and nothing changes.
  void shutdown_at_exit(std::chrono::nanoseconds limit) noexcept {
    if (async_.shut_down_on_own_worker()) return;
    try {
      if (async_.shared()) {
        // The default worker's last moment too: stopping it drains every sharer's queue, and
        // a frozen worker (which a flush would wait for) as well.
        (void)async_.shut_down_with_worker(limit);
      } else if (limit == std::chrono::nanoseconds::max()) {
        async_.shutdown();
      } else {
        (void)async_.shutdown_for(limit);
      }
    } catch (...) {  // refused: exit() called inside drain()
    }
  }

  // The cost is known: inline below the threshold; otherwise a node, and put() decides.
  decision hand_over(detail::free_function free_payload, void* payload, std::size_t length, std::uint64_t bytes) {
    // No node for what is deleted inline anyway: the small path allocates nothing.
    if (bytes < async_.threshold()) {
      return free_inline(small_, "ineligible", free_payload, payload, length, bytes, decision::sync_ineligible);
    }
    detail::deferred_node* node = detail::allocate_node();
    if (node == nullptr) {
      return free_inline(no_memory_, to_string(decision::sync_no_memory), free_payload, payload, length, bytes,
                         decision::sync_no_memory);
    }
    node->charge = bytes;
    node->free_payload = free_payload;
    node->payload = payload;
    node->length = length;
    return async_.put(*node);  // frees node and payload inline if it does not queue them
  }

  // `reason` is the sync trace point's: put()'s reasons, plus "no_memory" and "cost_error".
  decision free_inline(sharded_counter& counter, const char* reason, detail::free_function free_payload, void* payload,
                       std::size_t length, std::uint64_t bytes, decision why) {
    counter.add();
    trace::sync(reinterpret_cast<std::uintptr_t>(payload), bytes, reason, async_.trace_domain());
    free_payload(payload, length);
    return why;
  }

  // Frees on the caller without a node: counted here; async_ counts what went through put().
  sharded_counter small_;
  sharded_counter no_memory_;
  sharded_counter cost_errors_;
  sharded_counter disabled_;
  queue_type async_;  // last: destroyed (drained) first
};

// ---- the default domain -----------------------------------------------------------------------

namespace detail {

// The exit-time shutdown's limit, in nanoseconds; the largest value means none.
inline std::atomic<std::int64_t> default_domain_exit_timeout_ns{std::numeric_limits<std::int64_t>::max()};

// The default domains' worker: created on first use, never destroyed (as the default domain),
// so a domain made during static destruction still finds it. Its thread is stopped at exit,
// after the default domain's shutdown.
inline const std::shared_ptr<deferred_worker>& default_worker() {
  static const std::shared_ptr<deferred_worker>* const worker = [] {
    reaper_options opts;
    opts.name = "deferred_delete";
    return new std::shared_ptr<deferred_worker>(std::make_shared<deferred_worker>(std::move(opts)));
  }();
  return *worker;
}

// Shuts the default domain down at exit, once: from the main thread's sentinel, before any
// static is destroyed, or else from the closer, at its place among the statics. The domain
// itself is never destroyed.
struct default_domain_exit {
  static void shut_down(deferred_domain& domain) noexcept {
    static std::atomic<bool> done{false};  // trivially destructible: usable during static destruction
    if (done.exchange(true, std::memory_order_relaxed)) return;
    domain.shutdown_at_exit(std::chrono::nanoseconds(default_domain_exit_timeout_ns.load(std::memory_order_relaxed)));
  }

};

// A function-local static constructed right after the default domain: the fallback for an exit
// whose thread has no sentinel.
struct default_domain_closer {
  deferred_domain* domain;
  ~default_domain_closer() { default_domain_exit::shut_down(*domain); }
};

// Armed on the main thread only: [basic.start.term] destroys the thread_local objects of the
// thread that returns from main or calls exit() before any object with static storage duration,
// so this destructor runs before every static destructor, whenever the static was constructed.
struct main_thread_exit_sentinel {
  deferred_domain* domain;
  ~main_thread_exit_sentinel() { default_domain_exit::shut_down(*domain); }
};

// Whether this thread has been considered for the sentinel: a trivially destructible flag, so
// that threads that are not main pay nothing at their exit.
inline thread_local bool exit_sentinel_considered = false;

// The first use of the default domain on each thread: the main thread (tid == pid) arms its
// sentinel. Allocates once on that thread (the thread_local destructor's registration).
inline void consider_exit_sentinel(deferred_domain& domain) noexcept {
  exit_sentinel_considered = true;
#if defined(__linux__)
  if (static_cast<pid_t>(syscall(SYS_gettid)) != getpid()) return;
  thread_local main_thread_exit_sentinel sentinel{&domain};
  (void)sentinel;
#else
  (void)domain;
#endif
}

}  // namespace detail

namespace deferred {

/// The process-wide domain, created with deferred_domain::default_options() on first use from
/// any thread; shut down at exit, never destroyed (see the header comment). The first call on
/// the main thread arms the shutdown that runs before static destruction.
inline deferred_domain& default_domain() {
  static deferred_domain* const domain = [] {
    async_teardown_options opts = deferred_domain::default_options();
    opts.worker = detail::default_worker();
    auto* created = new deferred_domain(std::move(opts));
    static const detail::default_domain_closer closer{created};  // registered after the domain
    return created;
  }();
  if (!detail::exit_sentinel_considered) [[unlikely]] detail::consider_exit_sentinel(*domain);
  return *domain;
}

/// The worker the default domain runs on (one thread, "deferred_delete"), created on first use
/// and never destroyed; stopped at exit after the default domain. A deferred_domain given it
/// (opts.worker = deferred::default_worker()) adds no thread. Throws std::system_error if the
/// thread cannot start.
inline const std::shared_ptr<deferred_worker>& default_worker() { return detail::default_worker(); }

/// Bounds the default domain's shutdown at exit: after `limit`, exit() proceeds, and what the
/// reaper has not freed yet is left to the operating system (still counted in stats() as queued
/// and not reaped; the reaper goes on freeing while the statics are destroyed, until the process
/// ends). std::chrono::nanoseconds::max(), the default, means no limit. Throws
/// std::invalid_argument, changing nothing, for a negative limit. Any thread, any time; wait-free.
inline void set_exit_timeout(std::chrono::nanoseconds limit) {
  if (limit.count() < 0) throw std::invalid_argument("teardown::deferred::set_exit_timeout: the limit is negative");
  detail::default_domain_exit_timeout_ns.store(limit.count(), std::memory_order_relaxed);
}

/// The limit set_exit_timeout set; nanoseconds::max() for none.
inline std::chrono::nanoseconds exit_timeout() noexcept {
  return std::chrono::nanoseconds(detail::default_domain_exit_timeout_ns.load(std::memory_order_relaxed));
}

/// default_domain().flush(): blocks until everything handed to it before the call is freed.
inline void flush() { default_domain().flush(); }

/// default_domain().stats().
inline deferred_stats stats() { return default_domain().stats(); }

}  // namespace deferred

namespace detail {

// The default domain, or nullptr if it cannot be created (no thread, no memory): the callers
// that must not throw then free inline.
inline deferred_domain* default_domain_or_null() noexcept {
  try {
    return &deferred::default_domain();
  } catch (...) {
    return nullptr;
  }
}

}  // namespace detail

// ---- the deleter ------------------------------------------------------------------------------

/// A deleter for std::unique_ptr<T, deferred_deleter<T>> and std::shared_ptr<T>: deletes through
/// a domain (the default one unless given). Two pointers wide, trivially copyable. Not
/// convertible between types (a cost function is typed): for a hierarchy, use
/// deferred_deleter<Base> throughout (Base needs a virtual destructor, as with delete).
template <class T>
class deferred_deleter {
 public:
  using cost_function = std::uint64_t (*)(const T&);

  /// The default domain; the cost by lookup (steps 2-5).
  constexpr deferred_deleter() noexcept = default;
  constexpr explicit deferred_deleter(deferred_domain& through) noexcept : domain_(&through) {}
  /// A null cost function means the lookup.
  constexpr explicit deferred_deleter(cost_function measure) noexcept : cost_(measure) {}
  constexpr deferred_deleter(deferred_domain& through, cost_function measure) noexcept
      : domain_(&through), cost_(measure) {}

  void operator()(T* object) const noexcept {
    deferred_domain* target = domain_ != nullptr ? domain_ : detail::default_domain_or_null();
    if (target == nullptr) {
      delete object;  // the default domain's reaper could not start: as std::default_delete
    } else if (cost_ != nullptr) {
      (void)target->delete_object(object, cost_);
    } else {
      (void)target->delete_object(object);
    }
  }

  /// The domain it deletes through; nullptr for the default one.
  deferred_domain* domain() const noexcept { return domain_; }
  cost_function cost() const noexcept { return cost_; }

 private:
  deferred_domain* domain_ = nullptr;
  cost_function cost_ = nullptr;
};

/// A std::unique_ptr that deletes through a domain.
template <class T>
using deferred_ptr = std::unique_ptr<T, deferred_deleter<T>>;

/// new T(args...) in a deferred_ptr on the default domain (new T{args...} for an aggregate).
template <class T, class... Args>
  requires(!std::is_array_v<T>)
deferred_ptr<T> make_deferred(Args&&... args) {
  if constexpr (std::is_constructible_v<T, Args...>) {
    return deferred_ptr<T>(new T(std::forward<Args>(args)...));
  } else {
    return deferred_ptr<T>(new T{std::forward<Args>(args)...});
  }
}

/// Deletes `object` through the default domain; see deferred_domain::delete_object. If the
/// default domain cannot be created (its reaper cannot start), deletes inline: sync_stopped.
template <class T>
decision deferred_delete(T* object) noexcept {
  deferred_domain* domain = detail::default_domain_or_null();
  if (domain == nullptr) {
    delete object;
    return decision::sync_stopped;
  }
  return domain->delete_object(object);
}

/// munmap(addr, length) through the default domain; see deferred_domain::unmap. Bad input is
/// refused before the default domain is even created. If it cannot be created, unmaps inline
/// (sync_stopped).
inline decision async_munmap(void* addr, std::size_t length) {
  (void)detail::checked_unmap_length(addr, length);
  deferred_domain* domain = detail::default_domain_or_null();
  if (domain == nullptr) {
    detail::unmap_range(addr, length);
    return decision::sync_stopped;
  }
  return domain->unmap(addr, length);
}

}  // namespace teardown
