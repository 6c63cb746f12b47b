// teardown/async_teardown/options.hpp — what async_teardown is told and what it answers: its
// options, Traits, decision, statistics and drain_result.
//
// Traits (an object, stored by value; its functions may be static):
//   cost(const T&) -> uint64_t            the size of the teardown, in budget units
//   eligible(const T&, uint64_t cost) -> bool
//   prepare(T&)                            eager step; may block; must be idempotent if destroy
//                                          repeats it. If it throws, put propagates the
//                                          exception and leaves the item alone (not torn
//                                          down, not charged, not counted)
//   destroy(T&)                            the teardown; may free the item; may throw (counted
//                                          in errors and handed to the reaper's on_error when it
//                                          runs there, propagated when it runs inline)
//   charge(T&) -> uint64_t&                where the charge is memoised
//   optional: live_cost(const T&) -> uint64_t   for the reap trace point (default: cost)
//             id(const T&) -> uint64_t          for the trace points (default: the address)
//             queued_at(T&) -> uint64_t&        where put stores the enqueue time, so the reap
//                                               trace point carries the wait
//
// Statistics ("inline": torn down on the calling thread instead of queued). queued +
// inline_total = items put (put_chain counts each item of its chain); inline_rejected,
// inline_stalled, inline_uncontended and inline_small are subsets of inline_total; reaped counts
// queued items torn down, by the reaper or by drain (drained is that subset). The names are
// deferred_stats' too (deferred/domain.hpp). The old names (sync, rejected, stalled, uncontended;
// decision::sync_*) stay one release, deprecated, with the same values.
//
// Plain data: no ordering of its own.
// Design: docs/design.md, "async_teardown: the composition".
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>

#include "teardown/allocator_trim.hpp"
#include "teardown/budget.hpp"
#include "teardown/reaper.hpp"
#include "teardown/reaper_pool.hpp"

namespace teardown {

class shared_worker_base;  // shared_worker.hpp, which includes this header

/// What put() did with an item. Everything but `queued` and `empty` means it was torn down
/// inline. The numbers are stable: a new decision takes the next free one, wherever it is listed.
enum class decision : std::uint8_t {
  queued = 0,              // charged to the budget and handed to the reaper
  inline_disabled = 1,     // the toggle is off
  inline_ineligible = 2,   // cost below the threshold, or Traits::eligible refused it
  inline_rejected = 3,     // eligible, but the charge did not fit the budget
  inline_stalled = 4,      // eligible, but the reaper is stalled: queuing would only pile up behind it
  inline_stopped = 5,      // eligible, but the composition was stopped
  inline_uncontended = 7,  // eligible, but fewer than min_concurrent puts were in flight: inline is
                           // cheaper while the CPUs are not crowded (the concurrency gate)
  inline_no_memory = 6,    // eligible, but a layer above (deferred.hpp) could not allocate its node;
                           // async_teardown::put itself never returns it
  empty = 8,               // put_chain of an empty chain: nothing torn down, nothing queued
  // The old names, one release: the same values.
  sync_disabled [[deprecated("use decision::inline_disabled")]] = 1,
  sync_ineligible [[deprecated("use decision::inline_ineligible")]] = 2,
  sync_rejected [[deprecated("use decision::inline_rejected")]] = 3,
  sync_stalled [[deprecated("use decision::inline_stalled")]] = 4,
  sync_stopped [[deprecated("use decision::inline_stopped")]] = 5,
  sync_no_memory [[deprecated("use decision::inline_no_memory")]] = 6,
  sync_uncontended [[deprecated("use decision::inline_uncontended")]] = 7,
};

/// "queued", "disabled", "ineligible", "rejected", "stalled", "stopped", "uncontended",
/// "no_memory", "empty": also the reasons the sync trace point carries (deferred.hpp adds
/// "cost_error", for a cost function that threw).
constexpr const char* to_string(decision d) noexcept {
  switch (d) {
    case decision::queued: return "queued";
    case decision::inline_disabled: return "disabled";
    case decision::inline_ineligible: return "ineligible";
    case decision::inline_rejected: return "rejected";
    case decision::inline_stalled: return "stalled";
    case decision::inline_stopped: return "stopped";
    case decision::inline_uncontended: return "uncontended";
    case decision::inline_no_memory: return "no_memory";
    case decision::empty: return "empty";
  }
  return "unknown";
}

/// What async_teardown needs from Traits; see the header comment.
template <class Traits, class T>
concept teardown_traits = requires(Traits& traits, T& item, const T& view, std::uint64_t cost) {
  { traits.cost(view) } -> std::convertible_to<std::uint64_t>;
  { traits.eligible(view, cost) } -> std::convertible_to<bool>;
  traits.prepare(item);
  traits.destroy(item);
  { traits.charge(item) } -> std::same_as<std::uint64_t&>;
};

struct async_teardown_options {
  bool enabled = true;                        // the toggle's initial state (a const_key ignores it)
  std::uint64_t threshold = 0;                // items costing less are torn down inline
  std::uint64_t max_pending = budget::max_cap;  // the budget's cap, in cost units
  // A budget shared with other compositions (one cap for all of them), or null: a budget of
  // its own with cap max_pending. With one, leave max_pending at its default (the shared
  // budget's cap is the cap): anything else is refused (std::invalid_argument).
  std::shared_ptr<budget> shared_budget = nullptr;
  bool sync_when_stalled = true;              // the watchdog: see decision::inline_stalled
  std::uint32_t min_concurrent = 1;           // the gate: see decision::inline_uncontended; 1 is
                                              // off, 0 is refused (std::invalid_argument)
  reaper_options reaper{.name = "async_teardown"};  // the worker's; with a pool, every worker's
                                                    // (its trace_domain is replaced by this
                                                    // composition's trace_domain())
  reaper_pool_options pool{};  // reaper_pool_workers only: workers, steal, steal_after. Its
                               // worker member must stay default (reaper above is every
                               // worker's options): anything else is refused
                               // (std::invalid_argument), never silently ignored
  trim_options trim{};         // the worker(s) trim the allocator after batches that freed
                               // trim.after cost units (allocator_trim.hpp); off by default
  std::uint64_t hurry_at = 0;  // with a polling worker (reaper.poll_interval > 0, which never
                               // wakes for a put): a put that leaves this much cost pending
                               // hurries it (reaper::hurry); 0 = half the cap. Without a
                               // poll_interval it is refused: every put that needs it wakes the
                               // worker already
  // A worker shared with other compositions (shared_worker.hpp), or null: a worker of its own.
  // With one, reaper and pool are unused; Traits needs a static owner(T&) -> void*&, and the
  // worker must be a shared_worker<T, Hook, Traits, Workers> (else std::invalid_argument).
  // Ignored when the deferred path is compiled out (const_key<false>).
  std::shared_ptr<shared_worker_base> worker = nullptr;
};

// The struct's own special members touch the deprecated members: not a use.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
struct async_teardown_stats {
  std::uint64_t queued = 0;              // put() handed the item to the reaper
  std::uint64_t reaped = 0;              // queued items torn down (by the reaper or by drain)
  std::uint64_t drained = 0;             // subset of reaped: torn down by drain() on a caller
  std::uint64_t errors = 0;              // destroy threw on the reaper or in drain (on a shared
                                         // worker: this composition's own items only)
  std::uint64_t inline_total = 0;        // put() tore the item down inline, for any reason
  std::uint64_t inline_rejected = 0;     // subset of inline_total: the budget refused the charge
  std::uint64_t inline_stalled = 0;      // subset of inline_total: the reaper was stalled
  std::uint64_t inline_uncontended = 0;  // subset of inline_total: fewer than min_concurrent
                                         // puts in flight
  std::uint64_t inline_small = 0;        // subset of inline_total: below the threshold, or
                                         // Traits::eligible refused it
  std::uint64_t inline_no_memory = 0;    // always 0 here (deferred_stats counts it)
  std::uint64_t pending = 0;             // the budget: charged and not yet released, in cost units
  std::uint64_t cap = 0;                 // the budget's cap
  std::uint64_t high_water = 0;          // the budget's highest pending
  // On a shared budget these three are the shared budget's: every sharer's charges together.
  trim_stats trim{};                     // the worker(s)' allocator trims (options' trim)
  std::uint64_t helped = 0;              // items a waiting flush or stop tore down itself (the
                                         // worker's "Waiters help"; on a shared worker, every
                                         // sharer's together); counted in reaped too

  // The old names, one release, filled with the same values.
  [[deprecated("use inline_total")]] std::uint64_t sync = 0;
  [[deprecated("use inline_rejected")]] std::uint64_t rejected = 0;
  [[deprecated("use inline_stalled")]] std::uint64_t stalled = 0;
  [[deprecated("use inline_uncontended")]] std::uint64_t uncontended = 0;
};
#pragma GCC diagnostic pop

/// What drain() tore down on the caller.
struct drain_result {
  std::uint64_t items = 0;
  std::uint64_t cost = 0;  // the sum of their memoised charges
};

}  // namespace teardown
