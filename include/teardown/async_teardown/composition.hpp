// teardown/async_teardown/composition.hpp — async_teardown: toggle, eligibility, eager step,
// budget, queue.
//
// put(item), in this order (each step is the kernel series' but 4, the swap-release series';
// the comments in put() say why):
//   1. toggle off                     -> inline                    decision::inline_disabled
//      with the gate on (min_concurrent > 1), this put counts as in flight from here until it
//      returns, whatever it decides
//   2. cost = traits.cost(item), read once
//   3. cost < threshold, or !traits.eligible(item, cost)  -> inline    decision::inline_ineligible
//   4. the gate is on and fewer than min_concurrent puts are in flight, this one included
//                                     -> inline                    decision::inline_uncontended
//   5. the reaper is stalled (watchdog) -> inline                  decision::inline_stalled
//      the composition was stopped    -> inline                    decision::inline_stopped
//   6. traits.prepare(item), on the caller, before anything is charged
//   7. budget.try_reserve(cost) fails -> inline                    decision::inline_rejected
//   8. traits.charge(item) = cost; count; trace; hand to the reaper    decision::queued
// The reaper runs traits.destroy(item) and then releases exactly traits.charge(item), the
// charge memoised at step 8 — never a fresh cost reading, which may have shrunk meanwhile.
// put_chain(chain) takes the same steps for a chain of items as one unit: the threshold on the
// summed cost, one gate count, one reservation, one enqueue; an empty chain is decision::empty.
// An item that is still queued (its hook on_list()) handed to put again is a programming error:
// put writes why to stderr and aborts (detail::fatal_misuse), as llist::add and reaper::enqueue.
//
// Memory ordering: the item's contents reach the worker through its queue (release add, acquire
// del_all; a pool's steal passes them on with the same pair), the charge included, since it is
// written before the enqueue. The threshold, the toggle, min_concurrent and the in-flight count
// are relaxed: they publish nothing (the count is a load estimate; a stale reading only moves
// one decision between inline and queued). Counters: a subset is added after its superset, with
// release, and stats() reads it first, with acquire (reaped likewise before queued), so a
// snapshot taken while puts run never shows a subset larger than its superset, on any CPU. Once
// flush() returns with no put running, reaped == queued and pending == 0.
//
// With Key = const_key<false> the deferred path is compiled out, whatever Workers says: no
// worker thread, no counters, no trace points, no in-flight count (min_concurrent is kept but
// unused); put() is traits.destroy(item) and returns inline_disabled; worker_count() is 0.
// Design: docs/design.md, "async_teardown: the composition".
#pragma once

#include <unistd.h>

#include <algorithm>
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
#include "teardown/async_teardown/control.hpp"
#include "teardown/async_teardown/detail.hpp"
#include "teardown/async_teardown/options.hpp"
#include "teardown/budget.hpp"
#include "teardown/counter.hpp"
#include "teardown/detail/fatal.hpp"
#include "teardown/llist.hpp"
#include "teardown/reaper.hpp"
#include "teardown/reaper_pool.hpp"
#include "teardown/reaper_pool/workers.hpp"
#include "teardown/shared_worker.hpp"
#include "teardown/static_key.hpp"
#include "teardown/sync.hpp"
#include "teardown/trace.hpp"
#include "teardown/worker_control.hpp"

namespace teardown {

class deferred_domain;

template <class T, llist_node T::*Hook, class Traits, class Key = static_key, class Workers = one_reaper>
  requires teardown_traits<Traits, T>
class async_teardown
    : public detail::async_control<async_teardown<T, Hook, Traits, Key, Workers>, Workers, detail::compiled_off<Key>()>,
      public detail::deprecated_control_names<async_teardown<T, Hook, Traits, Key, Workers>> {
  static constexpr bool runtime_toggle = requires(Key& key) { key.set(true); };
  static constexpr bool compiled_out = detail::compiled_off<Key>();
  using control = detail::async_control<async_teardown, Workers, compiled_out>;
  friend control;  // the control calls reach the worker(s) through on_workers

  struct reap_fn {
    async_teardown* self;
    void operator()(T& item) const { self->reap(item); }
  };
  using reaper_type = typename Workers::template type<T, Hook, reap_fn>;
  // Only Traits whose items name their owner can use a shared worker.
  static constexpr bool shareable = owner_traits<Traits, T>;
  using shared_type = std::conditional_t<shareable, shared_worker<T, Hook, Traits, Workers>, shared_worker_base>;
  using gate_pass = detail::gate_pass<detail::domain_gate<>>;  // a shared worker's: see put()
  // Over the workers' Sync policy, so that a schedule test interleaves its callers too.
  using trimmer_type = basic_allocator_trimmer<typename detail::workers_sync<Workers>::type>;
  // The event counters on the same policy: stats()' snapshot order under a schedule test's weak memory.
  using counter_type = basic_sharded_counter<typename detail::workers_sync<Workers>::type>;

 public:
  /// Starts the worker(s) (unless the deferred path is compiled out). Throws
  /// std::invalid_argument naming the field, starting nothing, if max_pending >
  /// budget::max_cap (or is set along with shared_budget), min_concurrent == 0, opts.reaper is
  /// refused as a reaper's options are (reaper_options), opts.pool.worker is not default (every
  /// worker takes opts.reaper), or (reaper_pool_workers) the pool's options are bad (see reaper_pool);
  /// std::system_error if a thread cannot start (the workers made so far are stopped).
  /// `async_teardown a({})` means the defaults.
  explicit async_teardown(async_teardown_options opts = {}, Traits traits = Traits{})
      : async_teardown(validated_options(std::move(opts)), std::move(traits), checked_tag{}) {}

  // Deleted copy takes a non-const reference: a const one would be a candidate for
  // `async_teardown a({})` too ({} making a temporary async_teardown), and the call ambiguous.
  async_teardown(async_teardown&) = delete;
  async_teardown& operator=(const async_teardown&) = delete;

  /// stop(): tears down everything still queued, then joins the reaper. May block, without
  /// limit (stop_for bounds the wait first). Destroying the composition from its own
  /// callback (destroy on its worker, or inside its drain) would leave that callback on a freed
  /// object: it writes why to stderr and aborts.
  ~async_teardown() {
    if constexpr (!compiled_out) {
      if (this->in_own_callback()) {
        detail::fatal_misuse(
            "teardown::async_teardown::~async_teardown: destroyed from its own callback (Traits::destroy on its "
            "worker, or inside its drain); that callback would go on using the freed object. Destroy it from "
            "another thread, after drain returns.\n");
      }
      if (shared()) {
        this->stop();  // its items off the shared worker before its members go
        if constexpr (shareable) shared_->remove_batch_end(this);  // waits for a trim of ours in progress
      }
    }
  }

  /// Queues the item or tears it down inline; see the header comment for the steps. Aborts, with
  /// a message on stderr, for an item that is still queued (as reaper::enqueue does).
  decision put(T& item) {
    // Before every step: tearing down or queuing an item that is on a list would corrupt it.
    if ((item.*Hook).on_list()) [[unlikely]] {
      abort_already_queued();
    }
    if constexpr (compiled_out) {
      traits_.destroy(item);
      return decision::inline_disabled;
    } else {
      // The cost is not even read while the toggle is off: the disabled path pays the branch.
      if (!toggle_.enabled()) return tear_down_inline(item, 0, decision::inline_disabled);
      // The gate off (1) keeps the shared count off the path: a load and a branch, no RMW. On,
      // this put counts from here to every return, its inline teardown included: an exit that
      // tears down on its own CPU is exactly the load the gate measures.
      const std::uint32_t min_concurrent = min_concurrent_.load(std::memory_order_relaxed);
      const detail::in_flight_scope counted(min_concurrent > 1 ? &in_flight_.value : nullptr);
      // Read once: the same figure decides eligibility and is charged (it may shrink later).
      const std::uint64_t cost = traits_.cost(std::as_const(item));
      if (cost < threshold_.load(std::memory_order_relaxed) || !traits_.eligible(std::as_const(item), cost)) {
        return tear_down_inline(item, cost, decision::inline_ineligible);
      }
      // Steps 4 and 5 (refusal()). After eligibility: like the threshold it is a policy (on the
      // load, not the size), and stopped and stalled go on counting only items that would
      // otherwise have been queued.
      // Before prepare and the reserve: an item kept inline is not prepared for a queue it will
      // not join (prepare may block), and never touches the budget (a charge taken and given
      // back would, under add-then-check, push concurrent puts into rejection for nothing).
      gate_pass pass;  // a shared worker's: held from the stopped check to the enqueue
      if (const decision why = refusal(counted, min_concurrent, pass); why != decision::queued) {
        pass.leave();  // before destroy, which may stop this composition
        return tear_down_inline(item, cost, why);
      }
      // Eager step before charging: if it blocks, only this caller waits, never the reaper
      // and everything queued behind this item.
      traits_.prepare(item);
      if (!budget_.try_reserve(cost)) {
        pass.leave();
        trace::reject(item_id(item), cost, budget_.pending(), budget_.cap(), trace_domain_);
        if (lazy_) (void)this->hurry();  // the budget is full: what is queued must go now
        return tear_down_inline(item, cost, decision::inline_rejected);
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

  /// Puts a chain of items as one unit (the swap-release series' page-sized batches): the steps
  /// of put(), but one gate count, one reservation of the summed cost and one enqueue (a single CAS and at
  /// most one wake-up), or every item torn down inline, for the same reason. The reaper and
  /// drain() then take the items one by one, each releasing its own memoised charge. The
  /// threshold applies to the sum; Traits::eligible is asked of each item, and one refusal
  /// keeps the whole chain inline. Consumes the chain, except that if prepare throws the
  /// exception propagates and the chain is left with the caller, nothing torn down, charged or
  /// counted (prepare must be idempotent). If destroy throws inline, the rest of the chain is
  /// still torn down and the first exception is rethrown. An empty chain is a no-op returning
  /// decision::empty (nothing counted or traced).
  decision put_chain(llist_chain<T, Hook>&& chain) {
    if (chain.empty()) return decision::empty;
    if constexpr (compiled_out) {
      return tear_down_chain_inline(std::move(chain), decision::inline_disabled, /*costed=*/false);
    } else {
      // As in put(): no cost is read while the toggle is off.
      if (!toggle_.enabled()) return tear_down_chain_inline(std::move(chain), decision::inline_disabled, false);
      const std::uint32_t min_concurrent = min_concurrent_.load(std::memory_order_relaxed);
      const detail::in_flight_scope counted(min_concurrent > 1 ? &in_flight_.value : nullptr);
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
        return tear_down_chain_inline(std::move(chain), decision::inline_ineligible);
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
        if (lazy_) (void)this->hurry();  // as in put()
        return tear_down_chain_inline(std::move(chain), decision::inline_rejected);
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

  /// Pressure valve (for the question whether the OOM path could drain the queue under a budget):
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
      // What the drain freed is counted (reap) but never trimmed here, on a caller: the worker
      // trims it, asked to run its batch-end call even if nothing else is queued (a shared
      // worker's runs every sharer's, ours among them).
      if (result.items != 0 && trimmer_.due()) {
        on_workers([](auto& workers) { workers.request_after_batch(); });
      }
    }
    return result;
  }

  bool enabled() const noexcept { return toggle_.enabled(); }
  void enable() requires(runtime_toggle) { toggle_.enable(); }
  void disable() requires(runtime_toggle) { toggle_.disable(); }
  void set_enabled(bool on) requires(runtime_toggle) { toggle_.set(on); }

  std::uint64_t threshold() const noexcept { return threshold_.load(std::memory_order_relaxed); }
  void set_threshold(std::uint64_t cost) noexcept { threshold_.store(cost, std::memory_order_relaxed); }
  /// The concurrency gate: an eligible item is torn down inline (decision::inline_uncontended)
  /// while fewer than this many puts, its own included, are in flight. 1: off. Wait-free.
  std::uint32_t min_concurrent() const noexcept { return min_concurrent_.load(std::memory_order_relaxed); }
  /// Throws std::invalid_argument, changing nothing, for 0. Wait-free. A put already running
  /// keeps the value it read at its entry.
  void set_min_concurrent(std::uint32_t puts) {
    min_concurrent_.store(detail::validated_min_concurrent(puts), std::memory_order_relaxed);
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

  /// A snapshot; see the ordering paragraph in the header comment (options.hpp names the fields).
  async_teardown_stats stats() const noexcept {
    async_teardown_stats s;
    if constexpr (!compiled_out) {
      // Each subset with acquire before its superset: a snapshot that sees a subset's add (a
      // release, made after the superset's) sees the superset's too. reaped's release comes
      // after queued's add through the llist's release/acquire.
      s.drained = drained_.read(std::memory_order_acquire);
      s.reaped = reaped_.read(std::memory_order_acquire);
      s.queued = queued_.read();
      s.inline_rejected = inline_rejected_.read(std::memory_order_acquire);
      s.inline_stalled = inline_stalled_.read(std::memory_order_acquire);
      s.inline_uncontended = inline_uncontended_.read(std::memory_order_acquire);
      s.inline_small = inline_small_.read(std::memory_order_acquire);
      s.inline_total = inline_total_.read();
      const reaper_stats worker = on_workers([](const auto& workers) { return workers.stats(); });
      s.errors = shared() ? errors_.read() : worker.errors;
      s.helped = worker.helped;
    }
    s.pending = budget_.pending();
    s.cap = budget_.cap();
    s.high_water = budget_.high_water();
    s.trim = trimmer_.stats();
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    s.sync = s.inline_total;  // the old names, one release
    s.rejected = s.inline_rejected;
    s.stalled = s.inline_stalled;
    s.uncontended = s.inline_uncontended;
#pragma GCC diagnostic pop
    return s;
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
        budget_owner_(detail::async_budget(opts)),
        budget_(*budget_owner_),
        sync_when_stalled_(opts.sync_when_stalled),
        trimmer_(opts.trim),
        hurry_at_(opts.hurry_at),
        lazy_(opts.worker != nullptr ? opts.worker->polls() : opts.reaper.poll_interval.count() != 0),
        shared_(adopt_worker(opts)),
        reaper_(start_reaper(this, std::move(opts))) {}

  // The error rule's "already queued": the same answer as llist::add and reaper::enqueue.
  [[noreturn]] static void abort_already_queued() noexcept {
    detail::write_to_stderr("teardown::async_teardown::put: the item is already queued (element type ");
    detail::write_to_stderr(detail::type_name<T>());
    detail::fatal_misuse("); an item may be put again only once its destroy has started\n");
  }

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

  // A polling worker is not woken by puts (docs/design.md, "Wake policy"): a put that leaves
  // hurry_at (or half the cap) pending wakes it, so that the budget does not fill while it sleeps.
  void hurry_if_due() noexcept {
    const std::uint64_t mark = hurry_at_ != 0 ? hurry_at_ : budget_.cap() / 2;
    if (budget_.pending() >= mark) (void)this->hurry();
  }

  // A lower cap (set by hand or by a pressure policy) wants the memory back now.
  void hurry_after_lowered_cap() noexcept {
    if constexpr (!compiled_out) {
      if (lazy_ && budget_.pending() != 0) (void)this->hurry();
    }
  }

  // Everything refused before anything is built (the pool checks its own options as well).
  static async_teardown_options&& validated_options(async_teardown_options&& opts) {
    const bool polls = opts.worker != nullptr ? opts.worker->polls() : opts.reaper.poll_interval.count() != 0;
    return detail::validated_async_options(std::move(opts), /*can_share=*/shareable || compiled_out, polls);
  }

  friend class deferred_domain;

  // Constructs the reaper in place (the optional is initialized straight from the returned
  // prvalue): optional::emplace would first reset it, which GCC 12 reads, wrongly, as a possible
  // use of an uninitialized reaper (-Wmaybe-uninitialized at -O1 and above).
  // The Workers policy turns the options into the worker's (a pool's from opts.pool and
  // opts.reaper).
  static std::optional<reaper_type> start_reaper(async_teardown* self, async_teardown_options&& opts) {
    if constexpr (compiled_out) {
      return std::nullopt;
    } else {
      if (self->shared()) {
        // Unregistered by the destructor, once this composition's items are off the worker.
        if constexpr (shareable) {
          if (self->trimmer_.enabled()) self->shared_->add_batch_end(self, &trim_at_batch_end);
        }
        return std::nullopt;
      }
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

  std::uint64_t item_id(const T& item) const noexcept {
    if constexpr (requires { traits_.id(item); }) {
      return static_cast<std::uint64_t>(traits_.id(item));
    } else {
      return reinterpret_cast<std::uintptr_t>(&item);
    }
  }

  // Steps 4 and 5 of put(): queued when nothing refuses the item, else why not.
  decision refusal(const detail::in_flight_scope& counted, std::uint32_t min_concurrent, gate_pass& pass) noexcept {
    // The gate, read now rather than at entry, so that puts which entered since count too.
    if (counted.counts() && in_flight_.value.load(std::memory_order_relaxed) < min_concurrent) {
      return decision::inline_uncontended;
    }
    if (stopped_.load(std::memory_order_relaxed)) return decision::inline_stopped;
    if (shared() && !pass.enter(gate_)) return decision::inline_stopped;
    if (sync_when_stalled_ && this->stalled()) return decision::inline_stalled;
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
    inline_total_.add();  // before its subsets; release: pairs with the acquire reads in stats()
    if (why == decision::inline_rejected) inline_rejected_.add(1, std::memory_order_release);
    if (why == decision::inline_stalled) inline_stalled_.add(1, std::memory_order_release);
    if (why == decision::inline_uncontended) inline_uncontended_.add(1, std::memory_order_release);
    if (why == decision::inline_ineligible) inline_small_.add(1, std::memory_order_release);
    trace::sync(item_id(item), cost, to_string(why), trace_domain_);
    traits_.destroy(item);
    note_inline_free(cost);
    return why;
  }

  // What a teardown on a producer freed stays as resident as what the worker freed: the trimmer
  // counts it too (after the destroy), for the worker's next batch end or the next flush's
  // settle. It asks for no trim of its own: under an allocator whose frees go inline (tcmalloc's
  // and mimalloc's single blocks) a purge every `after` of them would hold the allocator's lock
  // against the very frees it follows (tcmalloc buffers: the free path 1.3 ms inline, 88 ms
  // with a trim per 64 MiB freed). Never a trim here; after stop nothing trims.
  void note_inline_free(std::uint64_t cost) noexcept {
    if constexpr (!compiled_out) {
      if (cost != 0) trimmer_.freed(cost);
    }
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
    // Released, counted and its cost handed to the trimmer even if destroy throws: the item is
    // gone either way, and releasing twice or never would drift the budget. The trimmer counts
    // after the destroy, once the memory is free: a count taken before could be consumed by a
    // trim (a pool sibling's, or the worker's beside a drain) that ran before the free.
    struct settle {
      async_teardown* self;
      std::uint64_t charge;
      ~settle() {
        self->budget_.release(charge);
        self->reaped_.add(1, std::memory_order_release);  // pairs with the acquire read in stats()
        self->trimmer_.freed(charge);
      }
    };
    if (!shared()) {
      const settle settle_after_destroy{this, charge};
      traits_.destroy(item);  // may free item
      return;
    }
    {
      const settle settle_after_destroy{this, charge};
      try {
        traits_.destroy(item);
      } catch (...) {
        errors_.add();  // this composition's; the shared worker counts and reports it too
        throw;
      }
    }
    // The trim is the shared worker's batch end (trim_at_batch_end), on the worker only.
  }

  // A shared worker's batch end for this composition (shared_worker::add_batch_end): its trim
  // when due, on the worker, as its own reaper's after_batch would.
  static void trim_at_batch_end(void* self) noexcept {
    (void)static_cast<async_teardown*>(self)->trimmer_.after_batch();
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
  trimmer_type trimmer_;  // before reaper_: its workers call it
  const std::uint64_t hurry_at_;  // options' hurry_at (0: half the cap)
  const bool lazy_;               // the worker polls: puts hurry it (see hurry_if_due)
  std::atomic<bool> stopped_{false};
  // Written by every put while the gate is on: a line of its own, so that it never invalidates
  // the read-mostly knobs above.
  struct alignas(64) padded_count {
    std::atomic<std::uint32_t> value{0};
  } in_flight_;
  counter_type queued_;
  counter_type inline_total_;
  counter_type inline_rejected_;
  counter_type inline_stalled_;
  counter_type inline_uncontended_;
  counter_type inline_small_;
  counter_type reaped_;
  counter_type drained_;
  counter_type errors_;  // a shared worker's destroy errors (its own worker counts them)
  detail::domain_gate<> gate_;  // shared worker only
  detail::shared_client<T> client_{this, &async_teardown::reap_shared};
  const pid_t created_in_ = getpid();
  std::shared_ptr<shared_type> shared_;  // before reaper_ (constructed first; it decides)
  // Last: constructed after, and destroyed (stopped, drained) before, everything reap() uses.
  std::optional<reaper_type> reaper_;
};
}  // namespace teardown
