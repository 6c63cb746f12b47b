// teardown/deferred/domain.hpp — deferred_domain: deletes objects and unmaps ranges on its
// reaper, or inline, through an async_teardown of nodes (deferred/node.hpp).
//
// Who may call what (a domain must outlive every call and every deleter naming it)
//   delete_object        any thread, concurrently; noexcept. Queuing is as lock-free as the
//                        allocator (the cost function, one node allocation, one budget RMW, one
//                        llist CAS). Inline deletion runs the destructor here; one that throws
//                        terminates (noexcept); on the reaper it is counted in errors.
//   unmap                the same, but may throw: std::invalid_argument for bad input (nothing
//                        changes), std::system_error if an inline munmap fails.
//   flush, flush_for, drain, freeze, thaw, stop, stop_for
//                        any thread but the domain's reaper (a destructor running there is
//                        refused with std::logic_error: it would wait for itself); may block.
//                        stop and the destructor wait without limit; stop_for gives up after a
//                        timeout, leaving the rest to the still-running reaper. After either,
//                        every deletion is inline.
//   ~deferred_domain     any thread but the domain's own reaper and its drain (aborts there).
//   stats, stalled, enabled, threshold, max_pending, set_threshold, trace_domain, unmap_chunk,
//   replace_max_pending, worker_stats   any thread; wait-free (replace_max_pending: lock-free).
//   nice, set_nice       any thread; take the reaper's nice mutex briefly.
//   enable, disable, set_enabled, set_max_pending
//                        any thread; writers serialize. set_max_pending on a shared budget sets
//                        the shared cap.
//   default_max_pending, default_budget, default_options
//                        any thread. default_budget's first call creates the budget
//                        (thread-safe; may throw std::bad_alloc); later calls are wait-free.
// Old names, one release, deprecated: shutdown, shutdown_for, worker_nice, set_worker_nice,
// reaper_statistics, the constructor from async_teardown_options, the stats fields
// freed_inline, small, rejected, no_memory, pending_bytes, max_pending, trims, trimmed_bytes,
// trim_cpu_ns.
//
// Knobs (deferred_domain_options{}): threshold, min_blocks and cached_below by the allocator
// that serves malloc (allocator_tuning.hpp: under glibc 64 KiB, 16 blocks, 0): an object is
// deferred if its bytes reach the threshold, unless the type says its blocks (deferred_blocks)
// and its bytes are under cached_below, or if its blocks reach min_blocks; a range by its bytes
// alone. max_pending: a quarter of memory (memory_limit.hpp), ONE cap shared by every domain
// on the defaults (default_budget()): set max_pending for a budget of the domain's own;
// sync_when_stalled; trim.after = 64 MiB (the reaper runs the allocator's purge after batches
// that freed that much); reaper named "deferred_delete", nice 19, on the housekeeping CPUs; unmap_chunk
// = 8 MiB (below).
//
// Chunks. unmap() queues a range longer than unmap_chunk as chunks (unmap_chunk bytes each from
// addr, at most max_unmap_chunks = 1024: a longer range gets longer ones), each an item, so that
// what the reaper has not taken (or a freeze handed back) goes to drain() and to a flush that
// helps piece by piece. The toggle, the threshold and the cap judge the whole range first (else
// one item, unmapped inline in one munmap); cut, it is put as one unit (put_chain: one charge,
// all chunks queue or none). stats count each chunk as an item; each has its own trace events,
// id its first address. No node for a chunk midway: the chunks built are put and the rest is
// unmapped inline in one munmap (inline_no_memory). Every page is unmapped once. Chunks freed
// out of order split the VMA for a while (vm.max_map_count). docs/design.md, "async_munmap in
// chunks".
//
// Memory ordering: nothing here adds any. The node and the object reach the reaper through the
// llist (release add, acquire del_all), so a destructor on the reaper sees everything the
// caller wrote to the object before deleting it. Counters and knobs are relaxed.
// Design: docs/design.md, "deferred.hpp: the domain and its knobs".
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "teardown/allocator_trim.hpp"
#include "teardown/async_teardown.hpp"
#include "teardown/budget.hpp"
#include "teardown/counter.hpp"
#include "teardown/deferred/allocator_tuning.hpp"
#include "teardown/deferred/cost.hpp"
#include "teardown/deferred/node.hpp"
#include "teardown/detail/fatal.hpp"
#include "teardown/llist.hpp"
#include "teardown/memory_limit.hpp"
#include "teardown/reaper.hpp"
#include "teardown/trace.hpp"
#include "teardown/worker_control.hpp"

namespace teardown {

namespace detail {

struct default_domain_exit;

// A quarter of memory (see "Knobs"); 1 GiB if the system does not say.
inline std::uint64_t deferred_default_max_pending() noexcept {
  const std::uint64_t memory = memory_limit();
  const std::uint64_t quarter = memory != 0 ? memory / 4 : std::uint64_t{1} << 30;
  return std::min(quarter, budget::max_cap);
}

// deferred_domain_options::unmap_chunk, checked: 0 or a multiple of the page size (a chunk must
// begin on a page, as munmap's addr must).
inline std::size_t validated_unmap_chunk(std::size_t chunk) {
  if (chunk % page_size() != 0) {
    throw std::invalid_argument("teardown::deferred_domain: unmap_chunk must be 0 or a multiple of the page size (" +
                                std::to_string(page_size()) + ")");
  }
  return chunk;
}

// The chunk a range of `bytes` (whole pages) is cut into: 0 for one item (chunking off, or the
// range no longer than a chunk); else `chunk`, grown to whole pages so that there are at most
// `max_chunks` pieces (a huge sparse reservation must not cost a node and a syscall per 8 MiB).
inline std::size_t unmap_chunk_for(std::size_t bytes, std::size_t chunk, std::size_t max_chunks) noexcept {
  if (chunk == 0 || bytes <= chunk) return 0;
  if ((bytes - 1) / chunk < max_chunks) return chunk;  // ceil(bytes / chunk) <= max_chunks
  const std::size_t page = page_size();
  const std::size_t least = (bytes - 1) / max_chunks + 1;  // ceil(bytes / max_chunks)
  return (least + page - 1) / page * page;  // no wrap: least <= bytes / 1024 + 1
}

// The budget every domain on the defaults shares; see deferred_domain::default_budget.
inline const std::shared_ptr<budget>& deferred_default_budget() {
  static const std::shared_ptr<budget>* const shared =
      new std::shared_ptr<budget>(std::make_shared<budget>(deferred_default_max_pending()));
  return *shared;
}

}  // namespace detail

// The struct's own special members touch the deprecated members: not a use.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
/// A snapshot of a domain's counters, with async_teardown_stats' names and meanings. queued +
/// inline_total = deletions and unmaps handed in (null pointers aside); inline_small,
/// inline_rejected, inline_stalled, inline_uncontended and inline_no_memory are subsets of
/// inline_total. Once flush() returns with nothing being handed in, reaped == queued and
/// pending == 0. On a shared budget (the default), pending, cap and high_water are the shared
/// budget's, every sharer's together: pending is 0 once each sharer has flushed.
struct deferred_stats {
  std::uint64_t queued = 0;              // handed to the reaper
  std::uint64_t reaped = 0;              // queued ones freed (by the reaper, or by drain or stop)
  std::uint64_t drained = 0;             // subset of reaped: freed by drain() on a caller
  std::uint64_t errors = 0;              // a destructor threw or a munmap failed on the reaper, or
                                         // a cost function threw
  std::uint64_t inline_total = 0;        // freed on the caller, for any reason; of which:
  std::uint64_t inline_rejected = 0;     //   the budget (max_pending) was full
  std::uint64_t inline_stalled = 0;      //   the reaper was stalled (sync_when_stalled)
  std::uint64_t inline_uncontended = 0;  //   fewer than min_concurrent deletions in flight
  std::uint64_t inline_small = 0;        //   the cost was below the threshold
  std::uint64_t inline_no_memory = 0;    //   the node could not be allocated
  std::uint64_t pending = 0;             // bytes queued and not yet freed
  std::uint64_t cap = 0;                 // the budget's cap
  std::uint64_t high_water = 0;          // the highest pending so far
  trim_stats trim{};                     // the reaper's allocator trims (see "Knobs": trim)
  std::uint64_t helped = 0;              // queued ones a waiting flush or stop freed itself
                                         // (the reaper's "Waiters help"; on a shared worker,
                                         // every sharer's together)

  // The old names, one release, filled with their old values.
  [[deprecated("use inline_total")]] std::uint64_t freed_inline = 0;
  [[deprecated("use inline_small")]] std::uint64_t small = 0;  // without put()'s own threshold check
  [[deprecated("use inline_rejected")]] std::uint64_t rejected = 0;
  [[deprecated("use inline_no_memory")]] std::uint64_t no_memory = 0;
  [[deprecated("use pending")]] std::uint64_t pending_bytes = 0;
  [[deprecated("use cap")]] std::uint64_t max_pending = 0;
  [[deprecated("use trim.trims")]] std::uint64_t trims = 0;
  [[deprecated("use trim.trimmed_bytes")]] std::uint64_t trimmed_bytes = 0;
  [[deprecated("use trim.trim_cpu_ns")]] std::uint64_t trim_cpu_ns = 0;
};
#pragma GCC diagnostic pop

/// deferred_domain's options, with deferred's defaults (see "Knobs"). The fields mean what
/// async_teardown_options' fields of the same names mean; there is no pool (one reaper).
struct deferred_domain_options {
  bool enabled = true;                            // the toggle's initial state
  // Bytes below which deletion is inline, and the two rules for heap objects beside it (see
  // "Knobs"): the allocator's (allocator_tuning.hpp), found at run time.
  std::uint64_t threshold = default_deferred_tuning().threshold;
  std::uint64_t min_blocks = default_deferred_tuning().min_blocks;      // deferred from this many blocks
  std::uint64_t cached_below = default_deferred_tuning().cached_below;  // blocks, not bytes, below
  // The cap: unset (budget::max_cap) means the shared budget's; set by hand, a budget of the
  // domain's own with this cap (shared_budget, if it is default_budget(), is dropped).
  std::uint64_t max_pending = budget::max_cap;
  std::shared_ptr<budget> shared_budget = detail::deferred_default_budget();  // null: its own
  bool sync_when_stalled = true;                  // the watchdog (decision::inline_stalled)
  std::uint32_t min_concurrent = 1;               // the concurrency gate; 1 is off
  reaper_options reaper{.name = "deferred_delete"};
  trim_options trim{.after = std::uint64_t{64} << 20};
  std::uint64_t hurry_at = 0;                     // async_teardown_options::hurry_at
  std::shared_ptr<shared_worker_base> worker = nullptr;  // e.g. deferred::default_worker()
  // unmap() queues a longer range as pieces of this many bytes, each an item of its own, so
  // that a drain or a helping waiter can take the pieces the reaper has not started (see
  // "Chunks"). 0: one item, whatever the length. Otherwise a multiple of the page size.
  std::size_t unmap_chunk = std::size_t{8} << 20;

  /// For code written against the old constructor, one release.
  [[deprecated("deferred_domain takes deferred_domain_options")]] operator async_teardown_options() const {
    return {.enabled = enabled,
            .threshold = threshold,
            .max_pending = max_pending,
            .shared_budget = shared_budget,
            .sync_when_stalled = sync_when_stalled,
            .min_concurrent = min_concurrent,
            .reaper = reaper,
            .pool = {},
            .trim = trim,
            .hurry_at = hurry_at,
            .worker = worker};
  }
};

class deferred_domain : public detail::forwarded_control<deferred_domain>,
                        public detail::deprecated_control_names<deferred_domain> {
 public:
  /// Below this many bytes an object is deleted inline (see "Knobs").
  static constexpr std::uint64_t default_threshold = std::uint64_t{64} << 10;
  /// The reaper trims the allocator once batches freed this many bytes (see "Knobs").
  static constexpr std::uint64_t default_trim_after = std::uint64_t{64} << 20;
  /// unmap() queues a longer range in pieces of this many bytes (see "Chunks").
  static constexpr std::size_t default_unmap_chunk = std::size_t{8} << 20;
  /// At most this many pieces per range: a longer one gets longer pieces (see "Chunks").
  static constexpr std::size_t max_unmap_chunks = 1024;

  /// A quarter of memory (see "Knobs"); 1 GiB if the system does not say.
  static std::uint64_t default_max_pending() noexcept { return detail::deferred_default_max_pending(); }

  /// The budget every domain made from default_options() shares, the default domain's
  /// included: one cap of default_max_pending() for all of them. Created on first use
  /// (thread-safe; may throw std::bad_alloc), never destroyed (a domain created during static
  /// destruction still finds it).
  static const std::shared_ptr<budget>& default_budget() { return detail::deferred_default_budget(); }

  /// The defaults described under "Knobs": deferred_domain_options{}.
  static deferred_domain_options default_options() { return {}; }

  /// Starts the reaper. Options with max_pending set by hand give the domain a budget of its
  /// own with that cap (the shared default_budget() is dropped). Throws std::invalid_argument,
  /// starting nothing, if max_pending > budget::max_cap (or is set along with another shared
  /// budget) or unmap_chunk is not a multiple of the page size; std::system_error if the thread
  /// cannot start. `deferred_domain d({.threshold = 1 << 20})` keeps every other default of
  /// deferred_domain_options.
  explicit deferred_domain(deferred_domain_options opts = {})
      : unmap_chunk_(detail::validated_unmap_chunk(opts.unmap_chunk)),
        threshold_(opts.threshold),
        min_blocks_(opts.min_blocks),
        cached_below_(opts.cached_below),
        async_(queue_options(std::move(opts))) {}

  /// The old constructor, one release: async_teardown_options carry async_teardown's defaults
  /// (no shared budget, a cap of 2^48, a worker named "async_teardown"), not deferred's.
  template <class Options>
    requires std::same_as<Options, async_teardown_options>
  [[deprecated("pass deferred_domain_options (deferred's defaults)")]] explicit deferred_domain(Options opts)
      : threshold_(opts.threshold), async_(without_threshold(own_cap_if_set(std::move(opts)))) {}

  /// Frees everything still queued (the reaper drains it), then joins the reaper. May block,
  /// without limit (stop_for first bounds the wait). Every deleter naming this domain must
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
  /// comes from steps 2-5 of the lookup. A null pointer does nothing (inline_ineligible, not
  /// counted). No memory for the node: inline_no_memory (counted in inline_no_memory).
  template <class T>
  decision delete_object(T* object) noexcept {
    return delete_costed(object, [](const T& o) { return deferred_cost(o); }, /*by_lookup=*/true);
  }

  /// The same with a cost function: cost(const T&) -> bytes (its blocks unknown: the bytes decide).
  template <class T, class Cost>
    requires std::invocable<Cost&, const T&>
  decision delete_object(T* object, Cost&& cost) noexcept {
    return delete_costed(object, std::forward<Cost>(cost), /*by_lookup=*/false);
  }

  /// munmap(addr, length) on the reaper, or inline below the threshold; returns the decision.
  /// Bad input — a null or unaligned addr, a zero length, a range that wraps — throws
  /// std::invalid_argument and changes nothing. An inline munmap that fails throws
  /// std::system_error (nothing was unmapped); one that fails on the reaper is counted in
  /// errors and handed to the reaper's on_error. The charge is length rounded up to pages.
  /// A range longer than unmap_chunk() is queued in chunks, one item each, all or none (one
  /// reservation of the whole charge): see "Chunks" for what is counted and traced. Queued
  /// chunks return queued; refused, every chunk is unmapped here (the others still are if one
  /// munmap fails; the first error is thrown).
  decision unmap(void* addr, std::size_t length) {
    const std::size_t bytes = detail::checked_unmap_length(addr, length);
    if (!async_.enabled()) {
      return free_inline(disabled_, "disabled", &detail::unmap_range, addr, length, bytes, decision::inline_disabled);
    }
    const std::size_t chunk = detail::unmap_chunk_for(bytes, unmap_chunk_, max_unmap_chunks);
    // Below the threshold the small path allocates nothing; above the cap no reservation can
    // succeed, so the range goes inline as one munmap rather than chunk by chunk.
    if (chunk == 0 || bytes < threshold() || bytes > async_.max_pending()) {
      return hand_over(&detail::unmap_range, addr, length, bytes, bytes >= threshold());
    }
    return hand_over_chunks(static_cast<char*>(addr), length, bytes, chunk);
  }

  /// The chunk length unmap() cuts longer ranges into; 0: none (options' unmap_chunk).
  std::size_t unmap_chunk() const noexcept { return unmap_chunk_; }

  /// Driven mode (opts.reaper.driven): the reaper's run and work_fd (docs/design.md, "Driven mode").
  drive_result run(drive_limits limits = {}) { return async_.run(limits); }
  int work_fd() const noexcept { return async_.work_fd(); }

  /// Pressure valve: frees queued objects on the caller, oldest first, while their charges fit
  /// in max_bytes (those the reaper already holds are left to it). Blocking.
  drain_result drain(std::uint64_t max_bytes) { return async_.drain(max_bytes); }

  // flush, flush_for, freeze, thaw, stop, stop_for, nice, set_nice, stalled, worker_stats:
  // detail::forwarded_control, to async_ (see the header comment's table).

  /// Off: everything is deleted inline (no node, no queue).
  bool enabled() const noexcept { return async_.enabled(); }
  void enable() { async_.enable(); }
  void disable() { async_.disable(); }
  void set_enabled(bool on) { async_.set_enabled(on); }

  std::uint64_t threshold() const noexcept { return threshold_.load(std::memory_order_relaxed); }
  void set_threshold(std::uint64_t bytes) noexcept { threshold_.store(bytes, std::memory_order_relaxed); }
  /// Options' min_blocks and cached_below (see "Knobs"), fixed at construction.
  std::uint64_t min_blocks() const noexcept { return min_blocks_; }
  std::uint64_t cached_below() const noexcept { return cached_below_; }
  std::uint64_t max_pending() const noexcept { return async_.max_pending(); }
  /// Throws std::invalid_argument, changing nothing, above budget::max_cap. On a shared budget
  /// (default_options()) it sets the shared cap, for every domain sharing it.
  void set_max_pending(std::uint64_t bytes) { async_.set_max_pending(bytes); }
  /// async_teardown::replace_max_pending: the cap replaced only if it still reads `expected`.
  bool replace_max_pending(std::uint64_t expected, std::uint64_t desired) {
    return async_.replace_max_pending(expected, desired);
  }
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
    s.drained = queue.drained;
    s.errors = queue.errors + cost_errors;
    s.inline_total = queue.inline_total + small + no_memory + cost_errors + disabled;
    s.inline_rejected = queue.inline_rejected;
    s.inline_stalled = queue.inline_stalled;
    s.inline_uncontended = queue.inline_uncontended;
    s.inline_small = small + queue.inline_small;  // below the threshold here, or in put()
    s.inline_no_memory = no_memory;
    s.pending = queue.pending;
    s.cap = queue.cap;
    s.high_water = queue.high_water;
    s.trim = queue.trim;
    s.helped = queue.helped;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    s.freed_inline = s.inline_total;  // the old names, one release, with their old values
    s.small = small;
    s.rejected = s.inline_rejected;
    s.no_memory = s.inline_no_memory;
    s.pending_bytes = s.pending;
    s.max_pending = s.cap;
    s.trims = s.trim.trims;
    s.trimmed_bytes = s.trim.trimmed_bytes;
    s.trim_cpu_ns = s.trim.trim_cpu_ns;
#pragma GCC diagnostic pop
    return s;
  }

  /// The trace domain every event of this domain carries (its async_teardown's; trace.hpp).
  std::uint64_t trace_domain() const noexcept { return async_.trace_domain(); }

 private:
  friend struct detail::default_domain_exit;
  friend class detail::forwarded_control<deferred_domain>;

  using queue_type = async_teardown<detail::deferred_node, &detail::deferred_node::hook, detail::deferred_traits>;

  queue_type& control_target() noexcept { return async_; }
  const queue_type& control_target() const noexcept { return async_; }

  // deferred_domain_options as its queue's options; a max_pending set by hand asks for that
  // cap: a budget of its own (own_cap_if_set).
  static async_teardown_options queue_options(deferred_domain_options&& opts) {
    async_teardown_options queue;
    queue.enabled = opts.enabled;
    queue.threshold = 0;  // judged here (worth_deferring), before a node is made
    queue.max_pending = opts.max_pending;
    queue.shared_budget = std::move(opts.shared_budget);
    queue.sync_when_stalled = opts.sync_when_stalled;
    queue.min_concurrent = opts.min_concurrent;
    queue.reaper = std::move(opts.reaper);
    queue.trim = opts.trim;
    queue.hurry_at = opts.hurry_at;
    queue.worker = std::move(opts.worker);
    return own_cap_if_set(std::move(queue));
  }

  static async_teardown_options without_threshold(async_teardown_options&& opts) {
    opts.threshold = 0;  // judged here, as queue_options' (threshold_ took it)
    return std::move(opts);
  }

  // "Start from the defaults and set max_pending" asks for that cap: a budget of its own.
  static async_teardown_options own_cap_if_set(async_teardown_options&& opts) {
    const bool default_shared = opts.shared_budget != nullptr && opts.shared_budget == default_budget();
    if (opts.max_pending != budget::max_cap && default_shared) {
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
        async_.stop();
      } else {
        (void)async_.stop_for(limit);
      }
    } catch (...) {  // refused: exit() called inside drain()
    }
  }

  // delete_object's body; by_lookup: the cost is the lookup's, so the type's blocks are known too.
  template <class T, class Cost>
  decision delete_costed(T* object, Cost&& cost, bool by_lookup) noexcept {
    static_assert(!std::is_void_v<T> && sizeof(T) > 0, "deferred delete of an incomplete type");
    static_assert(!std::is_array_v<T>, "deferred delete of an array: its length is unknown; use a std::vector");
    static_assert(!std::is_polymorphic_v<T> || std::has_virtual_destructor_v<T>,
                  "deleting a polymorphic type through a pointer to a base without a virtual destructor");
    if (object == nullptr) return decision::inline_ineligible;
    void* const payload = const_cast<void*>(static_cast<const volatile void*>(object));
    if (!async_.enabled()) {
      return free_inline(disabled_, "disabled", &detail::delete_as<T>, payload, 0, 0, decision::inline_disabled);
    }
    std::uint64_t bytes = 0;
    std::uint64_t blocks = 0;
    try {
      bytes = static_cast<std::uint64_t>(std::invoke(cost, std::as_const(*object)));
      if (by_lookup) blocks = deferred_blocks(std::as_const(*object));
    } catch (...) {
      return free_inline(cost_errors_, "cost_error", &detail::delete_as<T>, payload, 0, 0, decision::inline_ineligible);
    }
    return hand_over(&detail::delete_as<T>, payload, 0, bytes, worth_deferring(bytes, blocks));
  }


  // The bytes against the threshold, and for a heap object whose blocks the type says (blocks
  // != 0): below cached_below its blocks alone decide; from min_blocks it is deferred whatever
  // its bytes (see "Knobs").
  bool worth_deferring(std::uint64_t bytes, std::uint64_t blocks) const noexcept {
    bool defer = bytes >= threshold();
    if (blocks != 0) {
      if (bytes < cached_below_) defer = false;
      if (min_blocks_ != 0 && blocks >= min_blocks_) defer = true;
    }
    return defer;
  }

  // The cost is known and judged: inline if not worth deferring; otherwise a node, and put()
  // decides (the queue's own threshold is 0: this domain judges).
  decision hand_over(detail::free_function free_payload, void* payload, std::size_t length, std::uint64_t bytes,
                     bool defer) {
    // No node for what is deleted inline anyway: the small path allocates nothing.
    if (!defer) {
      return free_inline(small_, "ineligible", free_payload, payload, length, bytes, decision::inline_ineligible);
    }
    detail::deferred_node* node = detail::allocate_node();
    if (node == nullptr) {
      return free_inline(no_memory_, to_string(decision::inline_no_memory), free_payload, payload, length, bytes,
                         decision::inline_no_memory);
    }
    node->charge = bytes;
    node->free_payload = free_payload;
    node->payload = payload;
    node->length = length;
    return async_.put(*node);  // frees node and payload inline if it does not queue them
  }

  // unmap() of a range longer than `chunk`: a chain of nodes, low chunk first in line, put as
  // one unit (put_chain: the threshold on the sum, one reservation of the whole charge, one
  // enqueue), so the budget sees the same charge as for one item. A node that cannot be
  // allocated ends the chain: the rest of the range is unmapped here first (if that throws,
  // the chain's nodes are freed and nothing was unmapped), then the chain is put.
  decision hand_over_chunks(char* addr, std::size_t length, std::size_t bytes, std::size_t chunk) {
    llist_chain<detail::deferred_node, &detail::deferred_node::hook> chain;
    std::size_t offset = 0;  // a multiple of chunk, so of the page: each piece starts on a page
    while (offset < length) {
      detail::deferred_node* node = detail::allocate_node();
      if (node == nullptr) break;
      const std::size_t piece = std::min(chunk, length - offset);  // the last may end mid-page
      node->charge = std::min(chunk, bytes - offset);             // whole pages, as munmap frees
      node->free_payload = &detail::unmap_range;
      node->payload = addr + offset;
      node->length = piece;
      // push_front: after add_batch the front is the newest, so the lowest chunk is the oldest
      // (the reaper and drain take it first).
      chain.push_front(*node);
      offset += piece;
    }
    if (offset < length) {
      try {
        (void)free_inline(no_memory_, to_string(decision::inline_no_memory), &detail::unmap_range, addr + offset,
                          length - offset, bytes - offset, decision::inline_no_memory);
      } catch (...) {
        while (detail::deferred_node* node = chain.pop_front()) detail::release_node(node);
        throw;
      }
      if (chain.empty()) return decision::inline_no_memory;
      // What was built is judged on its own, as put_chain would judge a chain (its sum).
      // Every piece is unmapped even if one munmap fails; the first error is thrown.
      if (std::min<std::uint64_t>(offset, bytes) < threshold()) {
        std::exception_ptr first_error;
        while (detail::deferred_node* node = chain.pop_front()) {
          void* const piece = node->payload;
          const std::size_t piece_length = node->length;
          const std::uint64_t charge = node->charge;
          detail::release_node(node);
          try {
            (void)free_inline(small_, "ineligible", &detail::unmap_range, piece, piece_length, charge,
                              decision::inline_ineligible);
          } catch (...) {
            if (!first_error) first_error = std::current_exception();
          }
        }
        if (first_error) std::rethrow_exception(first_error);
        return decision::inline_ineligible;
      }
    }
    return async_.put_chain(std::move(chain));  // unmaps every chunk inline if it does not queue them
  }

  // `reason` is the sync trace point's: put()'s reasons, plus "no_memory" and "cost_error".
  decision free_inline(sharded_counter& counter, const char* reason, detail::free_function free_payload, void* payload,
                       std::size_t length, std::uint64_t bytes, decision why) {
    counter.add();
    trace::sync(reinterpret_cast<std::uintptr_t>(payload), bytes, reason, async_.trace_domain());
    free_payload(payload, length);
    async_.note_inline_free(bytes);  // the trimmer's too
    return why;
  }

  // Frees on the caller without a node: counted here; async_ counts what went through put().
  sharded_counter small_;
  sharded_counter no_memory_;
  sharded_counter cost_errors_;
  sharded_counter disabled_;
  const std::size_t unmap_chunk_ = default_unmap_chunk;  // checked before async_ starts a thread
  std::atomic<std::uint64_t> threshold_;  // set_threshold; relaxed, a knob as async_teardown's
  const std::uint64_t min_blocks_ = 0;
  const std::uint64_t cached_below_ = 0;
  queue_type async_;  // last: destroyed (drained) first
};

}  // namespace teardown
