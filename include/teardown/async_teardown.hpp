// teardown/async_teardown.hpp — the composition: toggle, eligibility, eager step, budget, queue.
//
// The kernel series' mmput_exit(), generalised to any type. put(item) either hands the item to
// a reaper thread (or a pool of them) or tears it down on the caller, and says which and why:
//
//     struct buffer_traits {
//       std::uint64_t cost(const buffer& b) const { return b.bytes; }
//       bool eligible(const buffer&, std::uint64_t) const { return true; }
//       void prepare(buffer&) {}                      // the eager step (exit_aio)
//       void destroy(buffer& b) { delete &b; }        // may free the item
//       std::uint64_t& charge(buffer& b) { return b.charge; }   // where the charge is memoised
//     };
//     teardown::async_teardown<buffer, &buffer::hook, buffer_traits> async({.threshold = 1 << 20});
//     async.put(*b);                                  // returns a decision; never blocks on the reaper
//     teardown::async_teardown<buffer, &buffer::hook, buffer_traits, teardown::static_key,
//                              teardown::reaper_pool_workers> pooled({.pool = {.workers = 4}});
//
// put(item), in this order (each step is the kernel's but 4, seed 004's; the comments in put()
// say why):
//   1. toggle off                   -> destroy inline                      decision::sync_disabled
//      with the gate on (min_concurrent > 1), this put counts as in flight from here until it
//      returns, whatever it decides
//   2. cost = traits.cost(item), read once
//   3. cost < threshold, or !traits.eligible(item, cost)  -> inline       decision::sync_ineligible
//   4. the gate is on and fewer than min_concurrent puts are in flight, this one included
//                                     -> inline                          decision::sync_uncontended
//   5. the reaper is stalled (watchdog) -> inline                         decision::sync_stalled
//      the composition was shut down  -> inline                          decision::sync_stopped
//   6. traits.prepare(item), on the caller, before anything is charged
//   7. budget.try_reserve(cost) fails -> inline                           decision::sync_rejected
//   8. traits.charge(item) = cost; count; trace; hand to the reaper       decision::queued
// The reaper runs traits.destroy(item) and then releases exactly traits.charge(item), the
// charge memoised at step 8 — never a fresh cost reading, which may have shrunk meanwhile.
// put_chain(chain) takes the same steps for a chain of items as one unit (seed 004's page-sized
// batches): the threshold on the summed cost, one gate count, one reservation, one enqueue.
//
// The concurrency gate (seed 004: defer only when at least NR_MIN_EXITING_PROCESSES exit at
// once). Under light load an inline teardown is the cheapest and runs cache-hot on the CPU that
// used the item; in a storm of puts, handing the work to one reaper frees the CPUs the
// foreground needs. min_concurrent = 1 (the default) is the kernel series' behaviour: no gate.
// What it costs: with the gate off, one relaxed load of min_concurrent and a branch, no RMW;
// with it on, a relaxed fetch_add at step 1 and a relaxed fetch_sub at the return, on one
// in-flight counter that every putting CPU writes (a contended cache line, padded away from
// everything else), plus one relaxed load at step 4. A put that began before the gate was
// switched on is not counted, so just after the switch the count may read low (erring towards
// inline); each put undoes only its own count, so the count never drifts.
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
// One cap for several compositions: opts.shared_budget. Each reserves from and releases to the
// shared budget exactly as to its own (step 7; the reaper's release), so budget.hpp's cap
// invariant holds for all of them together. set_max_pending then sets the shared cap.
//
// The worker (Workers, the 5th template parameter; chosen at compile time):
//   one_reaper (the default)  one reaper thread, as the kernel's single mm_reaper.
//   reaper_pool_workers       a reaper_pool (reaper_pool.hpp; RFC open question 2): several
//                             workers over sharded queues, with work stealing. opts.pool says
//                             how many and how they steal; opts.reaper is every worker's options
//                             (opts.pool.worker is ignored), the names getting "-<i>", so the
//                             same options serve either policy. Each put goes to the putting
//                             thread's worker; drain, flush, freeze, thaw and shutdown act on
//                             every worker; the reaper's statistics are the workers' sums.
//   opts.worker               a shared_worker (shared_worker.hpp): one worker (or pool) for many
//                             compositions over the same T, Hook, Traits and Workers; Traits
//                             then needs a static owner(T&) -> void*&, which put writes. Its
//                             counters, budget, knobs and trace domain stay this composition's;
//                             flush, freeze and thaw act on the shared worker (every sharer);
//                             shutdown and the destructor stop this composition's queuing, wait
//                             for its puts in flight and flush, never stopping the worker.
// Everything below holds for either. The pool keeps no order between items that different
// threads put (a steal may overtake), so drain's "oldest first" is per putting thread.
//
// Who may call what (the async_teardown must outlive every call)
//   put, put_chain            any thread, concurrently. Lock-free apart from what Traits does
//                             (prepare may block) and the inline teardowns it decides on.
//                             put_chain takes a chain the caller built alone (llist_chain,
//                             O(1) push_back) and queues or tears down all of it as one unit.
//                             From a signal handler: async-signal-safe when it queues (toggle,
//                             gate, budget, counters, the thread's identity, trace emission and
//                             the enqueue lock nothing and allocate nothing, a thread's first put
//                             included), provided Traits' functions and any trace hook are and
//                             nothing throws (an exception allocates); an inline decision runs
//                             destroy on the caller, so it is as safe as destroy.
//                             put refuses an item that is still queued (its hook on_list())
//                             with std::invalid_argument, changing nothing; such an item never
//                             gets into a chain (llist_chain's push aborts).
//   drain                     any thread but a worker; blocking (tears down on the caller).
//   flush, flush_for, freeze, thaw, shutdown, shutdown_for
//                             any thread but a worker; may block (see reaper.hpp,
//                             reaper_pool.hpp). After shutdown or shutdown_for, put tears down
//                             inline. shutdown and the destructor wait without limit.
//   destructor                shutdown(). From its own callback (destroy on a worker, or
//                             inside drain) it aborts with a message (see in_own_callback).
//   enable, disable, set_enabled   any thread; writers serialize (static_key). Not from a
//                             signal handler (a mutex); nor the constructor, drain and the rest
//                             that may block. The worker threads block signals (reaper.hpp).
//   worker_nice, set_worker_nice   any thread; take each worker's control mutex briefly.
//   set_threshold, set_max_pending, replace_max_pending, set_min_concurrent, the getters, stats, stalled,
//   reaper_statistics, worker_count, in_own_callback
//                             any thread; wait-free (set_max_pending and set_min_concurrent
//                             validate first and throw std::invalid_argument, changing nothing).
//   hurry                     any thread; lock-free (reaper::hurry on the worker(s)).
//
// A polling worker (opts.reaper.poll_interval > 0, lazy with poll_interval_max; reaper.hpp's
// "Wake policy") is never woken by a put. The composition hurries it instead: after a put that
// leaves hurry_at (default: half the cap) pending, after a put the budget refused, and when the
// cap is lowered (set_max_pending, replace_max_pending: a pressure policy's temporary cap) while
// anything is pending. flush, freeze and shutdown wake it as always.
//
// Memory ordering: the item's contents reach the worker through its queue (release add, acquire
// del_all; a pool's steal passes them on with the same pair), the charge included, since it is
// written before the enqueue. The threshold, the toggle, min_concurrent and the in-flight count
// are relaxed: they publish nothing (the count is a load estimate; a stale reading only moves
// one decision between inline and queued). Counters are relaxed except where a snapshot needs
// one counter's add to carry another's (see Counters).
//
// Counters (stats()): queued + sync = items put (put_chain counts each item of its chain);
// rejected, stalled and uncontended are subsets of sync; reaped counts queued items torn down, by the reaper or by drain (drained is that subset);
// once flush() returns with no put running, reaped == queued and pending == 0 (on a shared
// budget, pending is every sharer's: 0 once each has flushed). A subset is
// added after its superset, with release, and the snapshot reads it first, with acquire (reaped
// likewise before queued), so a snapshot taken while puts run never shows a subset larger than
// its superset, on any CPU.
//
// With Key = const_key<false> the deferred path is compiled out, whatever Workers says: no
// worker thread, no counters, no trace points, no in-flight count (min_concurrent is kept but
// unused); put() is traits.destroy(item) and returns sync_disabled; worker_count() is 0.
#pragma once

#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "teardown/allocator_trim.hpp"
#include "teardown/budget.hpp"
#include "teardown/counter.hpp"
#include "teardown/llist.hpp"
#include "teardown/reaper.hpp"
#include "teardown/reaper_pool.hpp"
#include "teardown/shared_worker.hpp"
#include "teardown/static_key.hpp"
#include "teardown/trace.hpp"

namespace teardown {

class deferred_domain;

/// What put() did with an item. Everything but `queued` means it was torn down inline. The
/// numbers are stable: a new decision takes the next free one, wherever it is listed.
enum class decision : std::uint8_t {
  queued = 0,            // charged to the budget and handed to the reaper
  sync_disabled = 1,     // the toggle is off
  sync_ineligible = 2,   // cost below the threshold, or Traits::eligible refused it
  sync_rejected = 3,     // eligible, but the charge did not fit the budget
  sync_stalled = 4,      // eligible, but the reaper is stalled: queuing would only pile up behind it
  sync_stopped = 5,      // eligible, but the composition was shut down
  sync_uncontended = 7,  // eligible, but fewer than min_concurrent puts were in flight: inline is
                         // cheaper while the CPUs are not crowded (the concurrency gate)
  sync_no_memory = 6,    // eligible, but a layer above (deferred.hpp) could not allocate its node;
                         // async_teardown::put itself never returns it
};

/// "queued", "disabled", "ineligible", "rejected", "stalled", "stopped", "uncontended",
/// "no_memory": also the reasons the sync trace point carries.
constexpr const char* to_string(decision d) noexcept {
  switch (d) {
    case decision::queued: return "queued";
    case decision::sync_disabled: return "disabled";
    case decision::sync_ineligible: return "ineligible";
    case decision::sync_rejected: return "rejected";
    case decision::sync_stalled: return "stalled";
    case decision::sync_stopped: return "stopped";
    case decision::sync_uncontended: return "uncontended";
    case decision::sync_no_memory: return "no_memory";
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
  bool sync_when_stalled = true;              // the watchdog: see decision::sync_stalled
  std::uint32_t min_concurrent = 1;           // the gate: see decision::sync_uncontended; 1 is
                                              // off, 0 is refused (std::invalid_argument)
  reaper_options reaper{.name = "async_teardown"};  // the worker's; with a pool, every worker's
                                                    // (its trace_domain is replaced by this
                                                    // composition's trace_domain())
  reaper_pool_options pool{};  // reaper_pool_workers only: workers, steal, steal_after; its
                               // worker member is ignored (reaper above is used instead)
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

/// async_teardown's worker: one reaper thread (the default; the kernel's single mm_reaper).
/// A Workers policy names the worker type, which offers reaper's enqueue, enqueue_chain,
/// flush, flush_for, freeze, thaw, stop, reap_on_caller, stalled and stats, and builds the
/// second argument of its constructor (after the teardown function) from the options.
struct one_reaper {
  template <class T, llist_node T::*Hook, class Fn>
  using type = reaper<T, Hook, Fn>;
  using options = reaper_options;
  /// opts.reaper; opts.pool is unused.
  static reaper_options worker_options(async_teardown_options&& opts) { return std::move(opts.reaper); }
};

/// ... or a pool of them (RFC open question 2): a reaper_pool over sharded queues.
struct reaper_pool_workers {
  template <class T, llist_node T::*Hook, class Fn>
  using type = reaper_pool<T, Hook, Fn>;
  using options = reaper_pool_options;
  /// opts.pool, with opts.reaper as every worker's options (opts.pool.worker is replaced).
  static reaper_pool_options worker_options(async_teardown_options&& opts) {
    reaper_pool_options pool = std::move(opts.pool);
    pool.worker = std::move(opts.reaper);
    return pool;
  }
};

struct async_teardown_stats {
  std::uint64_t queued = 0;      // put() handed the item to the reaper
  std::uint64_t sync = 0;        // put() tore the item down inline, for any reason
  std::uint64_t rejected = 0;    // subset of sync: the budget refused the charge
  std::uint64_t stalled = 0;     // subset of sync: the reaper was stalled
  std::uint64_t uncontended = 0;  // subset of sync: fewer than min_concurrent puts in flight
  std::uint64_t reaped = 0;      // queued items torn down (by the reaper or by drain)
  std::uint64_t drained = 0;     // subset of reaped: torn down by drain() on a caller
  std::uint64_t errors = 0;      // destroy threw on the reaper or in drain (on a shared worker:
                                 // this composition's own items only)
  std::uint64_t pending = 0;     // the budget: charged and not yet released, in cost units
  std::uint64_t cap = 0;         // the budget's cap
  std::uint64_t high_water = 0;  // the budget's highest pending
  // On a shared budget these three are the shared budget's: every sharer's charges together.
  trim_stats trim{};             // the worker(s)' allocator trims (options' trim)
};

/// What drain() tore down on the caller.
struct drain_result {
  std::uint64_t items = 0;
  std::uint64_t cost = 0;  // the sum of their memoised charges
};

namespace detail {

// The producing thread's identity for the queue trace point, taken once per thread: the name
// is the one the thread had at its first traced put. Constant-initialized, trivially
// destructible thread_locals filled on first use, so that a put from a signal handler neither
// allocates nor registers a destructor; gettid and pthread_getname_np on the calling thread
// (prctl) are system calls. A handler that interrupts the filling fills it too, with the same
// values.
struct thread_identity {
  std::int64_t tid = 0;
  char name[16] = {};
};

inline const thread_identity& this_thread_identity() noexcept {
  static constinit thread_local thread_identity identity{};
  static constinit thread_local std::atomic<bool> known{false};
  // acquire: pairs with the release below, made by this thread or by a signal handler on it
  // (no other thread touches these); it keeps the compiler from reading identity before known.
  if (!known.load(std::memory_order_acquire)) {
#if defined(__linux__)
    identity.tid = syscall(SYS_gettid);
    if (pthread_getname_np(pthread_self(), identity.name, sizeof identity.name) != 0) identity.name[0] = '\0';
#endif
    known.store(true, std::memory_order_release);  // identity is complete before known is true
  }
  return identity;
}

// True for a compile-time key that is off (const_key<false>): the deferred path compiles out.
template <class Key>
constexpr bool compiled_off() noexcept {
  if constexpr (requires(Key& key) { key.set(true); }) {
    return false;
  } else {
    return !Key::enabled();
  }
}

template <class Key>
Key make_key(bool on) {
  if constexpr (std::is_constructible_v<Key, bool>) {
    return Key(on);
  } else {
    return Key{};
  }
}

inline int current_cpu() noexcept {
#if defined(__linux__)
  return sched_getcpu();
#else
  return -1;
#endif
}

}  // namespace detail

template <class T, llist_node T::*Hook, class Traits, class Key = static_key, class Workers = one_reaper>
  requires teardown_traits<Traits, T>
class async_teardown {
  static constexpr bool runtime_toggle = requires(Key& key) { key.set(true); };
  static constexpr bool compiled_out = detail::compiled_off<Key>();

  struct reap_fn {
    async_teardown* self;
    void operator()(T& item) const { self->reap(item); }
  };
  using reaper_type = typename Workers::template type<T, Hook, reap_fn>;
  // Only Traits whose items name their owner can use a shared worker.
  static constexpr bool shareable = owner_traits<Traits, T>;
  using shared_type = std::conditional_t<shareable, shared_worker<T, Hook, Traits, Workers>, shared_worker_base>;

 public:
  /// Starts the worker(s) (unless the deferred path is compiled out). Throws
  /// std::invalid_argument naming the field, starting nothing, if max_pending >
  /// budget::max_cap (or is set along with shared_budget), min_concurrent == 0, opts.reaper is
  /// refused as a reaper's options are (reaper_options), or (reaper_pool_workers) the pool's
  /// options are bad (see reaper_pool);
  /// std::system_error if a thread cannot start (the workers made so far are stopped).
  /// `async_teardown a({})` means the defaults.
  explicit async_teardown(async_teardown_options opts = {}, Traits traits = Traits{})
      : async_teardown(validated_options(std::move(opts)), std::move(traits), checked_tag{}) {}

  // Deleted copy takes a non-const reference: a const one would be a candidate for
  // `async_teardown a({})` too ({} making a temporary async_teardown), and the call ambiguous.
  async_teardown(async_teardown&) = delete;
  async_teardown& operator=(const async_teardown&) = delete;

  /// Shuts down: tears down everything still queued, then joins the reaper. May block, without
  /// limit (shutdown_for bounds the wait first). Destroying the composition from its own
  /// callback (destroy on its worker, or inside its drain) would leave that callback on a freed
  /// object: it writes why to stderr and aborts.
  ~async_teardown() {
    if constexpr (!compiled_out) {
      if (in_own_callback()) {
        detail::fatal_misuse(
            "teardown::async_teardown::~async_teardown: destroyed from its own callback (Traits::destroy on its "
            "worker, or inside its drain); that callback would go on using the freed object. Destroy it from "
            "another thread, after drain returns.\n");
      }
      if (shared()) shutdown();  // its items off the shared worker before its members go
    }
  }

  /// Queues the item or tears it down inline; see the header comment for the steps. Throws
  /// std::invalid_argument, changing nothing, for an item that is still queued.
  decision put(T& item) {
    // Before every step: tearing down or queuing an item that is on a list would corrupt it.
    if ((item.*Hook).on_list()) [[unlikely]] {
      throw std::invalid_argument("teardown::async_teardown::put: the item is already queued (on a list, chain or batch)");
    }
    if constexpr (compiled_out) {
      traits_.destroy(item);
      return decision::sync_disabled;
    } else {
      // The cost is not even read while the toggle is off: the disabled path pays the branch.
      if (!toggle_.enabled()) return tear_down_inline(item, 0, decision::sync_disabled);
      // The gate off (1) keeps the shared count off the path: a load and a branch, no RMW. On,
      // this put counts from here to every return, its inline teardown included: an exit that
      // tears down on its own CPU is exactly the load the gate measures.
      const std::uint32_t min_concurrent = min_concurrent_.load(std::memory_order_relaxed);
      const in_flight_scope counted(min_concurrent > 1 ? &in_flight_.value : nullptr);
      // Read once: the same figure decides eligibility and is charged (it may shrink later).
      const std::uint64_t cost = traits_.cost(std::as_const(item));
      if (cost < threshold_.load(std::memory_order_relaxed) || !traits_.eligible(std::as_const(item), cost)) {
        return tear_down_inline(item, cost, decision::sync_ineligible);
      }
      // Steps 4 and 5 (refusal()). After eligibility: like the threshold it is a policy (on the load, not the size), and
      // stopped and stalled go on counting only items that would otherwise have been queued.
      // Before prepare and the reserve: an item kept inline is not prepared for a queue it will
      // not join (prepare may block), and never touches the budget (a charge taken and given
      // back would, under add-then-check, push concurrent puts into rejection for nothing).
      gate_pass pass;  // a shared worker's: held from the stopped check to the enqueue
      if (const decision why = refusal(counted, min_concurrent, pass); why != decision::queued) {
        pass.leave();  // before destroy, which may shut this composition down
        return tear_down_inline(item, cost, why);
      }
      // Eager step before charging: if it blocks, only this caller waits, never the reaper
      // and everything queued behind this item.
      traits_.prepare(item);
      if (!budget_.try_reserve(cost)) {
        pass.leave();
        trace::reject(item_id(item), cost, budget_.pending(), budget_.cap(), trace_domain_);
        if (lazy_) (void)hurry();  // the budget is full: what is queued must go now
        return tear_down_inline(item, cost, decision::sync_rejected);
      }
      traits_.charge(item) = cost;
      name_owner(item);
      if constexpr (requires { traits_.queued_at(item); }) traits_.queued_at(item) = detail::monotonic_ns();
      // Who and where cost a cold exit path more than the enqueue itself: gathered only when
      // the emit can be seen.
      if (trace::observable<trace::queue_event>()) {
        const detail::thread_identity& who = detail::this_thread_identity();
        trace::queue(item_id(item), cost, who.tid, who.name, detail::current_cpu(), trace_domain_);
      }
      queued_.add();  // before the enqueue: reaped never overtakes queued
      on_workers([&](auto& workers) { workers.enqueue(item); });
      pass.leave();
      if (lazy_) hurry_if_due();
      return decision::queued;
    }
  }

  /// Puts a chain of items as one unit (seed 004's page-sized batches): the steps of put(), but
  /// one gate count, one reservation of the summed cost and one enqueue (a single CAS and at
  /// most one wake-up), or every item torn down inline, for the same reason. The reaper and
  /// drain() then take the items one by one, each releasing its own memoised charge. The
  /// threshold applies to the sum; Traits::eligible is asked of each item, and one refusal
  /// keeps the whole chain inline. Consumes the chain, except that if prepare throws the
  /// exception propagates and the chain is left with the caller, nothing torn down, charged or
  /// counted (prepare must be idempotent). If destroy throws inline, the rest of the chain is
  /// still torn down and the first exception is rethrown. An empty chain is a no-op returning
  /// sync_ineligible.
  decision put_chain(llist_chain<T, Hook>&& chain) {
    if (chain.empty()) return decision::sync_ineligible;
    if constexpr (compiled_out) {
      return tear_down_chain_inline(std::move(chain), decision::sync_disabled, /*costed=*/false);
    } else {
      // As in put(): no cost is read while the toggle is off.
      if (!toggle_.enabled()) return tear_down_chain_inline(std::move(chain), decision::sync_disabled, false);
      const std::uint32_t min_concurrent = min_concurrent_.load(std::memory_order_relaxed);
      const in_flight_scope counted(min_concurrent > 1 ? &in_flight_.value : nullptr);
      // Each cost read once and memoised at once (the chain is still private to this thread):
      // the inline path traces it, the reaper releases it.
      std::uint64_t total = 0;
      std::size_t items = 0;
      bool eligible = true;
      chain.for_each([&](T& item) {
        const std::uint64_t cost = traits_.cost(std::as_const(item));
        traits_.charge(item) = cost;
        total = cost > UINT64_MAX - total ? UINT64_MAX : total + cost;  // saturates: never admitted
        ++items;
        eligible = eligible && traits_.eligible(std::as_const(item), cost);
      });
      if (total < threshold_.load(std::memory_order_relaxed) || !eligible) {
        return tear_down_chain_inline(std::move(chain), decision::sync_ineligible);
      }
      gate_pass pass;  // as in put()
      if (const decision why = refusal(counted, min_concurrent, pass); why != decision::queued) {
        pass.leave();
        return tear_down_chain_inline(std::move(chain), why);
      }
      chain.for_each([&](T& item) { traits_.prepare(item); });
      if (!budget_.try_reserve(total)) {
        pass.leave();
        chain.for_each([&](T& item) {
          trace::reject(item_id(item), traits_.charge(item), budget_.pending(), budget_.cap(), trace_domain_);
        });
        if (lazy_) (void)hurry();  // as in put()
        return tear_down_chain_inline(std::move(chain), decision::sync_rejected);
      }
      chain.for_each([&](T& item) { name_owner(item); });
      const std::uint64_t now = detail::monotonic_ns();
      if constexpr (requires(T& each) { traits_.queued_at(each); }) {
        chain.for_each([&](T& item) { traits_.queued_at(item) = now; });
      }
      if (trace::observable<trace::queue_event>()) {  // as in put()
        const detail::thread_identity& who = detail::this_thread_identity();
        const int cpu = detail::current_cpu();
        chain.for_each([&](T& item) {
          trace::queue(item_id(item), traits_.charge(item), who.tid, who.name, cpu, trace_domain_);
        });
      }
      queued_.add(items);  // before the enqueue: reaped never overtakes queued
      on_workers([&](auto& workers) { workers.enqueue_chain(std::move(chain)); });
      pass.leave();
      if (lazy_) hurry_if_due();
      return decision::queued;
    }
  }

  /// Pressure valve (RFC open question 1: the OOM path could drain the queue with a budget):
  /// tears down queued items on the caller, oldest first, taking each whose memoised charge
  /// still fits in max_cost. Items the reaper already holds are left to it. With a pool, the
  /// workers' queues are visited in turn, each oldest first per putting thread, under one
  /// max_cost. Blocking.
  drain_result drain(std::uint64_t max_cost) {
    drain_result result;
    if constexpr (!compiled_out) {
      const draining_scope draining(this);
      on_workers([&](auto& workers) {
        return workers.reap_on_caller([&](T& item) {
          if (!owns(item)) return false;  // another sharer's
          const std::uint64_t charge = traits_.charge(item);
        if (charge > max_cost - result.cost) return false;
          result.cost += charge;
          ++result.items;
          return true;
        });
      });
      // After the teardowns (and their reaped counts): a subset never overtakes its superset.
      // release: pairs with the acquire read in stats().
      if (result.items != 0) drained_.add(result.items, std::memory_order_release);
    }
    return result;
  }

  /// Driven mode (opts.reaper.driven, or a driven shared worker's; one_reaper only): reaper::run
  /// and reaper::work_fd, the shared worker's for every sharer. A
  /// compiled-out composition queues nothing: run does nothing and work_fd is -1.
  // Member templates, so that an explicit instantiation over a pool does not reach them.
  template <class W = Workers>
    requires std::same_as<W, one_reaper>
  drive_result run(drive_limits limits = {}) {
    if constexpr (compiled_out) return {};
    else return on_workers([&](auto& workers) { return workers.run(limits); });  // a shared worker's too
  }
  template <class W = Workers>
    requires std::same_as<W, one_reaper>
  int work_fd() const noexcept {
    if constexpr (compiled_out) return -1;
    else return on_workers([](const auto& workers) { return workers.work_fd(); });
  }

  /// Blocks until everything queued before the call (to any worker) is torn down.
  void flush() {
    if constexpr (!compiled_out) on_workers([](auto& workers) { workers.flush(); });
  }
  template <class Rep, class Period>
  bool flush_for(std::chrono::duration<Rep, Period> timeout) {
    if constexpr (!compiled_out) return on_workers([&](auto& workers) { return workers.flush_for(timeout); });
    return true;
  }

  /// Parks the reaper (every worker of a pool) between items; nests. May block. Puts keep
  /// queuing behind a frozen reaper until its oldest item has waited past the stall threshold;
  /// from then on the watchdog (if on) tears new items down inline, as for a starved reaper: a
  /// frozen reaper makes no progress either.
  void freeze() {
    if constexpr (!compiled_out) on_workers([](auto& workers) { workers.freeze(); });
  }
  /// Undoes one freeze(); throws std::logic_error, changing nothing, without one.
  void thaw() {
    if constexpr (compiled_out) throw std::logic_error("teardown::async_teardown::thaw: not frozen");
    else on_workers([](auto& workers) { workers.thaw(); });
  }

  /// Tears down everything queued and joins the reaper (every worker); afterwards put tears
  /// down inline (decision::sync_stopped). Idempotent. May block, without limit.
  void shutdown() {
    if constexpr (!compiled_out) {
      stopped_.store(true, std::memory_order_relaxed);
      if (shared()) {
        // Never stops the shared worker: no put of ours enqueues any more, then ours are done.
        (void)gate_.close(/*wait=*/!forked());
        on_workers([](auto& workers) { workers.flush(); });
      } else {
        reaper_->stop();
      }
    }
  }

  /// shutdown() that waits at most `timeout`: true iff everything queued was torn down and the
  /// worker(s) joined in time. Either way put tears down inline from now on (sync_stopped).
  /// False leaves what is left queued and counted (stats().pending, reaper_statistics().pending)
  /// with the worker(s) still working on it; a later shutdown, shutdown_for, flush or the
  /// destructor waits for them again. Nothing is lost or torn down twice.
  template <class Rep, class Period>
  bool shutdown_for(std::chrono::duration<Rep, Period> timeout) {
    if constexpr (compiled_out) {
      return true;
    } else {
      stopped_.store(true, std::memory_order_relaxed);
      if (shared()) {
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        const std::uint64_t deadline_ns = std_sync::now_ns() + static_cast<std::uint64_t>(std::max<std::int64_t>(
                                              0, std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count()));
        if (!gate_.close(/*wait=*/!forked(), deadline_ns)) return false;
        const auto left = std::max(deadline - std::chrono::steady_clock::now(), std::chrono::steady_clock::duration(0));
        return on_workers([&](auto& workers) { return workers.flush_for(left); });
      }
      return reaper_->stop_for(timeout);
    }
  }

  /// True when called from this composition's own callback: Traits::destroy on its worker, or
  /// inside its drain on this thread. Wait-free.
  bool in_own_callback() const noexcept {
    if constexpr (compiled_out) return false;
    else return on_workers([](const auto& workers) { return workers.in_own_callback(); });
  }

  /// True when the reaper's oldest queued item (in a pool: any worker's) has waited past its
  /// stall threshold.
  bool stalled() const noexcept {
    if constexpr (compiled_out) return false;
    else return on_workers([](const auto& workers) { return workers.stalled(); });
  }

  bool enabled() const noexcept { return toggle_.enabled(); }
  void enable() requires(runtime_toggle) { toggle_.enable(); }
  void disable() requires(runtime_toggle) { toggle_.disable(); }
  void set_enabled(bool on) requires(runtime_toggle) { toggle_.set(on); }

  std::uint64_t threshold() const noexcept { return threshold_.load(std::memory_order_relaxed); }
  void set_threshold(std::uint64_t cost) noexcept { threshold_.store(cost, std::memory_order_relaxed); }
  /// The concurrency gate: an eligible item is torn down inline (decision::sync_uncontended)
  /// while fewer than this many puts, its own included, are in flight. 1: off. Wait-free.
  std::uint32_t min_concurrent() const noexcept { return min_concurrent_.load(std::memory_order_relaxed); }
  /// Throws std::invalid_argument, changing nothing, for 0. Wait-free. A put already running
  /// keeps the value it read at its entry.
  void set_min_concurrent(std::uint32_t puts) {
    min_concurrent_.store(validated_min_concurrent(puts), std::memory_order_relaxed);
  }
  std::uint64_t max_pending() const noexcept { return budget_.cap(); }
  /// Throws std::invalid_argument, changing nothing, above budget::max_cap. Lowering it below
  /// what is pending queues nothing new until the reaper brings pending under it. On a shared
  /// budget this sets the shared cap, for every composition sharing it (see shared_budget).
  void set_max_pending(std::uint64_t cap) {
    const std::uint64_t before = budget_.cap();
    budget_.set_cap(cap);
    if (cap < before) hurry_after_lowered_cap();
  }
  /// set_max_pending(desired) only if the cap still reads `expected` (budget::replace_cap): true
  /// if replaced. A temporary cap (pressure.hpp) is undone with it, so that a cap set meanwhile
  /// stands. Throws std::invalid_argument, changing nothing, above budget::max_cap. Lock-free.
  bool replace_max_pending(std::uint64_t expected, std::uint64_t desired) {
    if (!budget_.replace_cap(expected, desired)) return false;
    if (desired < expected) hurry_after_lowered_cap();
    return true;
  }

  /// Wakes the worker(s) now if they sleep, whatever the wake policy (reaper::hurry): for a
  /// caller that knows what is queued must not wait for a polling worker's next look. True if
  /// a sleeping worker was woken. Lock-free; any thread.
  bool hurry() noexcept {
    if constexpr (compiled_out) return false;
    else return on_workers([](auto& workers) { return workers.hurry() != 0; });
  }

  /// The worker(s)' nice value (reaper::nice); opts.reaper.nice until set_worker_nice.
  int worker_nice() const {
    if constexpr (compiled_out) return 0;
    else return on_workers([](const auto& workers) { return workers.nice(); });
  }
  /// reaper::set_nice on the worker(s): true if applied (the system may refuse a lower value).
  /// Throws std::invalid_argument, changing nothing, outside [-20, 19]. Takes each worker's
  /// control mutex briefly.
  bool set_worker_nice(int value) {
    if (!detail::valid_nice(value)) {
      throw std::invalid_argument("teardown::async_teardown::set_worker_nice: nice must be in [-20, 19], got " +
                                  std::to_string(value));
    }
    if constexpr (compiled_out) return true;  // no worker
    else return on_workers([&](auto& workers) { return workers.set_nice(value); });
  }

  /// A snapshot; see "Counters" in the header comment.
  async_teardown_stats stats() const noexcept {
    async_teardown_stats s;
    if constexpr (!compiled_out) {
      // Each subset with acquire before its superset: a snapshot that sees a subset's add (a
      // release, made after the superset's) sees the superset's too. reaped's release comes
      // after queued's add through the llist's release/acquire.
      s.drained = drained_.read(std::memory_order_acquire);
      s.reaped = reaped_.read(std::memory_order_acquire);
      s.queued = queued_.read();
      s.rejected = rejected_.read(std::memory_order_acquire);
      s.stalled = stalled_.read(std::memory_order_acquire);
      s.uncontended = uncontended_.read(std::memory_order_acquire);
      s.sync = sync_.read();
      s.errors = shared() ? errors_.read() : reaper_->stats().errors;
    }
    s.pending = budget_.pending();
    s.cap = budget_.cap();
    s.high_water = budget_.high_water();
    s.trim = trimmer_.stats();
    return s;
  }

  /// The worker's own statistics (worker CPU, wake-ups, batches...); a pool's, summed over its
  /// workers (reaper_pool::stats).
  /// On a shared worker: the shared worker's, every sharer's items together.
  reaper_stats reaper_statistics() const noexcept {
    if constexpr (compiled_out) return {};
    else return on_workers([](const auto& workers) { return workers.stats(); });
  }

  /// How many worker threads tear down queued items: 1 for one_reaper, the pool's size for
  /// reaper_pool_workers, 0 when the deferred path is compiled out. Fixed at construction.
  std::size_t worker_count() const noexcept {
    if constexpr (compiled_out) {
      return 0;
    } else if constexpr (requires(const reaper_type& workers) { workers.worker_count(); }) {
      return on_workers([](const auto& workers) { return workers.worker_count(); });
    } else {
      return 1;
    }
  }

  Traits& traits() noexcept { return traits_; }
  const Traits& traits() const noexcept { return traits_; }

  /// This instance's trace domain (trace.hpp): process-unique, nonzero, fixed at construction,
  /// carried by every event it emits (a pool's workers share it). Wait-free.
  std::uint64_t trace_domain() const noexcept { return trace_domain_; }

 private:
  struct checked_tag {};

  async_teardown(async_teardown_options&& opts, Traits&& traits, checked_tag)
      : traits_(std::move(traits)),
        toggle_(detail::make_key<Key>(opts.enabled)),
        threshold_(opts.threshold),
        min_concurrent_(opts.min_concurrent),
        budget_owner_(make_budget(opts)),
        budget_(*budget_owner_),
        sync_when_stalled_(opts.sync_when_stalled),
        trimmer_(opts.trim),
        hurry_at_(opts.hurry_at),
        lazy_(opts.worker != nullptr ? opts.worker->polls() : opts.reaper.poll_interval.count() != 0),
        shared_(adopt_worker(opts)),
        reaper_(start_reaper(this, std::move(opts))) {}

  // ---- a shared worker (shared_worker.hpp) ----

  bool shared() const noexcept {
    if constexpr (shareable && !compiled_out) return shared_ != nullptr;
    else return false;
  }

  // f(the worker(s)): the shared worker's or this composition's own.
  template <class F>
  decltype(auto) on_workers(F&& f) {
    if constexpr (shareable) {
      if (shared_ != nullptr) return f(shared_->workers());
    }
    return f(*reaper_);
  }
  template <class F>
  decltype(auto) on_workers(F&& f) const {
    if constexpr (shareable) {
      if (shared_ != nullptr) return f(std::as_const(shared_->workers()));
    }
    return f(*reaper_);
  }

  // One put's pass through the gate, left at the latest when the put returns.
  class gate_pass {
   public:
    gate_pass() = default;
    gate_pass(const gate_pass&) = delete;
    gate_pass& operator=(const gate_pass&) = delete;
    ~gate_pass() { leave(); }
    bool enter(detail::domain_gate<>& gate) noexcept {
      if (!gate.enter()) return false;
      gate_ = &gate;
      return true;
    }
    void leave() noexcept {
      if (gate_ != nullptr) gate_->leave();
      gate_ = nullptr;
    }

   private:
    detail::domain_gate<>* gate_ = nullptr;
  };

  // Written before the enqueue, so the worker's del_all (acquire) sees it.
  void name_owner(T& item) noexcept {
    if constexpr (shareable) {
      if (shared()) Traits::owner(item) = &client_;
    }
  }
  bool owns(T& item) const noexcept {
    if constexpr (shareable) {
      if (shared()) return Traits::owner(item) == &client_;
    }
    (void)item;
    return true;
  }

  // A fork child: no parent put is left to leave the gate, and the child has no worker.
  bool forked() const noexcept { return getpid() != created_in_; }

  // The calling thread is inside this composition's drain: no trim there.
  static inline thread_local const void* draining_ = nullptr;
  struct draining_scope {
    const void* before;
    explicit draining_scope(const void* self) noexcept : before(draining_) { draining_ = self; }
    draining_scope(const draining_scope&) = delete;
    draining_scope& operator=(const draining_scope&) = delete;
    ~draining_scope() { draining_ = before; }
  };

  static void reap_shared(void* self, T& item) { static_cast<async_teardown*>(self)->reap(item); }

  // The shared worker, checked; null for a worker of its own.
  static std::shared_ptr<shared_type> adopt_worker(const async_teardown_options& opts) {
    if constexpr (compiled_out || !shareable) {
      return nullptr;
    } else {
      if (opts.worker == nullptr) return nullptr;
      if (opts.worker->kind() != shared_type::kind_tag()) {
        throw std::invalid_argument(
            "teardown::async_teardown: worker is a shared_worker for another item type, hook, Traits or Workers "
            "policy");
      }
      return std::static_pointer_cast<shared_type>(opts.worker);
    }
  }

  // A polling worker is not woken by puts (reaper.hpp's "Wake policy"): a put that leaves
  // hurry_at (or half the cap) pending wakes it, so that the budget does not fill while it sleeps.
  void hurry_if_due() noexcept {
    const std::uint64_t mark = hurry_at_ != 0 ? hurry_at_ : budget_.cap() / 2;
    if (budget_.pending() >= mark) (void)hurry();
  }

  // A lower cap (set by hand or by a pressure policy) wants the memory back now.
  void hurry_after_lowered_cap() noexcept {
    if constexpr (!compiled_out) {
      if (lazy_ && budget_.pending() != 0) (void)hurry();
    }
  }

  // Everything refused before anything is built (the pool checks its own options as well).
  static async_teardown_options&& validated_options(async_teardown_options&& opts) {
    (void)validated_min_concurrent(opts.min_concurrent);
    if (opts.max_pending > budget::max_cap) {
      throw std::invalid_argument("teardown::async_teardown: max_pending must be at most " +
                                  std::to_string(budget::max_cap) + ", got " + std::to_string(opts.max_pending));
    }
    opts.reaper = detail::validated_reaper_options(std::move(opts.reaper), "teardown::async_teardown", "reaper.");
    if (opts.worker != nullptr && !shareable && !compiled_out) {
      throw std::invalid_argument(
          "teardown::async_teardown: worker (a shared worker) is set, but Traits has no static owner(T&) -> void*& "
          "for the worker to find the composition that queued an item");
    }
    const bool polls = opts.worker != nullptr ? opts.worker->polls() : opts.reaper.poll_interval.count() != 0;
    if (opts.hurry_at != 0 && !polls) {
      throw std::invalid_argument("teardown::async_teardown: hurry_at (" + std::to_string(opts.hurry_at) +
                                  ") is set without reaper.poll_interval; a worker that polls is the one a put must "
                                  "hurry (without polling, puts wake it)");
    }
    return std::move(opts);
  }

  friend class deferred_domain;

  // deferred.hpp's exit path for a domain on the default worker: shut down, then stop the shared
  // worker itself (for every sharer), the whole within `limit` (nanoseconds::max(): none).
  bool shut_down_with_worker(std::chrono::nanoseconds limit) {
    if constexpr (compiled_out) {
      return true;
    } else {
      stopped_.store(true, std::memory_order_relaxed);
      if (limit == std::chrono::nanoseconds::max()) {
        (void)gate_.close(!forked());
        on_workers([](auto& workers) { workers.stop(); });
        return true;
      }
      const auto deadline = std::chrono::steady_clock::now() + limit;
      if (!gate_.close(!forked(), std_sync::now_ns() + static_cast<std::uint64_t>(limit.count()))) return false;
      const auto left = std::max(deadline - std::chrono::steady_clock::now(), std::chrono::steady_clock::duration(0));
      return on_workers([&](auto& workers) { return workers.stop_for(left); });
    }
  }

  // deferred.hpp's exit path: exit() called from destroy on this composition's own worker. Marks
  // it shut down and tears down, on this thread, the rest of the worker's batch and everything
  // queued (one_reaper only); false, changing nothing, anywhere else.
  bool shut_down_on_own_worker() noexcept {
    if constexpr (compiled_out || !std::is_same_v<Workers, one_reaper>) {
      return false;
    } else {
      // A shared worker is stopped for every sharer: this runs only at exit.
      if (!on_workers([](auto& workers) { return detail::stop_on_own_worker(workers); })) return false;
      stopped_.store(true, std::memory_order_relaxed);
      if (shared()) (void)gate_.close(/*wait=*/false);  // the worker is stopped: puts go inline
      return true;
    }
  }

  // Constructs the reaper in place (the optional is initialized straight from the returned
  // prvalue): optional::emplace would first reset it, which GCC 12 reads, wrongly, as a possible
  // use of an uninitialized reaper (-Wmaybe-uninitialized at -O1 and above).
  // The Workers policy turns the options into the worker's (a pool's from opts.pool and
  // opts.reaper).
  static std::optional<reaper_type> start_reaper(async_teardown* self, async_teardown_options&& opts) {
    if constexpr (compiled_out) {
      return std::nullopt;
    } else {
      if (self->shared()) return std::nullopt;
      opts.reaper.trace_domain = self->trace_domain_;  // the boost events are this composition's
      if (self->trimmer_.enabled()) {
        // On the worker(s) only: a trim never runs on a producer.
        opts.reaper.after_batch = [self, theirs = std::move(opts.reaper.after_batch)] {
          if (theirs) theirs();
          (void)self->trimmer_.after_batch();
        };
      }
      return std::optional<reaper_type>(std::in_place, reap_fn{self}, Workers::worker_options(std::move(opts)));
    }
  }

  // The budget puts reserve from: the shared one, or one of its own (validating max_pending).
  static std::shared_ptr<budget> make_budget(const async_teardown_options& opts) {
    if (opts.shared_budget == nullptr) return std::make_shared<budget>(opts.max_pending);
    if (opts.max_pending != budget::max_cap) {
      throw std::invalid_argument("teardown::async_teardown: max_pending (" + std::to_string(opts.max_pending) +
                                  ") and shared_budget are both set: a composition on a shared budget has no "
                                  "cap of its own (set shared_budget to null for one)");
    }
    return opts.shared_budget;
  }

  static std::uint32_t validated_min_concurrent(std::uint32_t puts) {
    if (puts == 0) {
      throw std::invalid_argument("teardown::async_teardown: min_concurrent must be at least 1 (1: no gate)");
    }
    return puts;
  }

  // Counts one put in flight for its lifetime, or nothing (the gate was off at its entry). Each
  // put undoes only its own increment, so switching the gate never unbalances the count.
  class in_flight_scope {
   public:
    explicit in_flight_scope(std::atomic<std::uint32_t>* count) noexcept : count_(count) {
      if (count_ != nullptr) count_->fetch_add(1, std::memory_order_relaxed);
    }
    in_flight_scope(const in_flight_scope&) = delete;
    in_flight_scope& operator=(const in_flight_scope&) = delete;
    ~in_flight_scope() {
      if (count_ != nullptr) count_->fetch_sub(1, std::memory_order_relaxed);
    }
    bool counts() const noexcept { return count_ != nullptr; }

   private:
    std::atomic<std::uint32_t>* count_;
  };

  std::uint64_t item_id(const T& item) const noexcept {
    if constexpr (requires { traits_.id(item); }) {
      return static_cast<std::uint64_t>(traits_.id(item));
    } else {
      return reinterpret_cast<std::uintptr_t>(&item);
    }
  }

  // Steps 4 and 5 of put(): queued when nothing refuses the item, else why not.
  decision refusal(const in_flight_scope& counted, std::uint32_t min_concurrent, gate_pass& pass) noexcept {
    // The gate, read now rather than at entry, so that puts which entered since count too.
    if (counted.counts() && in_flight_.value.load(std::memory_order_relaxed) < min_concurrent) {
      return decision::sync_uncontended;
    }
    if (stopped_.load(std::memory_order_relaxed)) return decision::sync_stopped;
    if (shared() && !pass.enter(gate_)) return decision::sync_stopped;
    if (sync_when_stalled_ && stalled()) return decision::sync_stalled;
    return decision::queued;
  }

  // put_chain's inline path: every item, with its memoised cost when it was read (costed); the
  // first exception from destroy is rethrown once the rest are torn down.
  decision tear_down_chain_inline(llist_chain<T, Hook>&& chain, decision why, bool costed = true) {
    std::exception_ptr first_error;
    while (T* item = chain.pop_front()) {
      try {
        if constexpr (compiled_out) {
          traits_.destroy(*item);
        } else {
          (void)tear_down_inline(*item, costed ? traits_.charge(*item) : 0, why);
        }
      } catch (...) {
        if (!first_error) first_error = std::current_exception();
      }
    }
    if (first_error) std::rethrow_exception(first_error);
    return why;
  }

  decision tear_down_inline(T& item, std::uint64_t cost, decision why) {
    sync_.add();  // before its subsets; release: pairs with the acquire reads in stats()
    if (why == decision::sync_rejected) rejected_.add(1, std::memory_order_release);
    if (why == decision::sync_stalled) stalled_.add(1, std::memory_order_release);
    if (why == decision::sync_uncontended) uncontended_.add(1, std::memory_order_release);
    trace::sync(item_id(item), cost, to_string(why), trace_domain_);
    traits_.destroy(item);
    return why;
  }

  // On the reaper (or on a drain caller): the teardown of a queued item.
  void reap(T& item) {
    const std::uint64_t charge = traits_.charge(item);
    std::uint64_t live = charge;
    if constexpr (requires { traits_.live_cost(item); }) live = traits_.live_cost(std::as_const(item));
    std::uint64_t waited = 0;
    if constexpr (requires { traits_.queued_at(item); }) {
      const std::uint64_t now = detail::monotonic_ns();
      const std::uint64_t since = traits_.queued_at(item);
      waited = now > since ? now - since : 0;
    }
    trace::reap(item_id(item), charge, live, detail::current_cpu(), waited, trace_domain_);  // before destroy frees it
    // Released and counted even if destroy throws: the item is gone either way, and releasing
    // twice or never would drift the budget.
    struct settle {
      async_teardown* self;
      std::uint64_t charge;
      ~settle() {
        self->budget_.release(charge);
        self->reaped_.add(1, std::memory_order_release);  // pairs with the acquire read in stats()
      }
    } settle_after_destroy{this, charge};
    trimmer_.freed(charge);
    if (!shared()) {
      traits_.destroy(item);  // may free item
      return;
    }
    try {
      traits_.destroy(item);
    } catch (...) {
      errors_.add();  // this composition's; the shared worker counts and reports it too
      throw;
    }
    // No after_batch of its own on a shared worker: a trim when due after each item, never in
    // a drain.
    if (draining_ != this) (void)trimmer_.after_batch();
  }

  Traits traits_;
  Key toggle_;
  std::atomic<std::uint64_t> threshold_;
  std::atomic<std::uint32_t> min_concurrent_;
  // Beside the knobs put() reads anyway, on lines no other thread writes; a USDT probe may name
  // it as a memory operand, so an unhooked event does not even load it.
  const std::uint64_t trace_domain_ = trace::new_domain();
  // Its own budget, or the shared one (kept alive here while items charged to it are queued).
  std::shared_ptr<budget> budget_owner_;
  budget& budget_;
  const bool sync_when_stalled_;
  allocator_trimmer trimmer_;  // before reaper_: its workers call it
  const std::uint64_t hurry_at_;  // options' hurry_at (0: half the cap)
  const bool lazy_;               // the worker polls: puts hurry it (see hurry_if_due)
  std::atomic<bool> stopped_{false};
  // Written by every put while the gate is on: a line of its own, so that it never invalidates
  // the read-mostly knobs above.
  struct alignas(64) padded_count {
    std::atomic<std::uint32_t> value{0};
  } in_flight_;
  sharded_counter queued_;
  sharded_counter sync_;
  sharded_counter rejected_;
  sharded_counter stalled_;
  sharded_counter uncontended_;
  sharded_counter reaped_;
  sharded_counter drained_;
  sharded_counter errors_;  // a shared worker's destroy errors (its own worker counts them)
  detail::domain_gate<> gate_;  // shared worker only
  detail::shared_client<T> client_{this, &async_teardown::reap_shared};
  const pid_t created_in_ = getpid();
  std::shared_ptr<shared_type> shared_;  // before reaper_ (constructed first; it decides)
  // Last: constructed after, and destroyed (stopped, drained) before, everything reap() uses.
  std::optional<reaper_type> reaper_;
};

}  // namespace teardown
