// teardown/pressure_policy.hpp — a policy that gives a composition's queued memory back while
// the system is short of it, driven by a pressure_monitor (pressure.hpp).
//
//     teardown::pressure_monitor monitor;                          // PSI triggers, or the sampler
//     teardown::deferred_domain domain;                            // (or an async_teardown, an mm_system)
//     teardown::pressure_policy policy(monitor, domain);           // thaw, nice 0, drain, cap 0
//
// A static cap (max_pending) tight enough for the worst moment gives up the fast exit at every
// other moment, and drain() helps only if somebody calls it when memory runs short. The policy
// acts on one composition while, and only while, the monitor reports pressure:
//   (a) thaw      every freeze level of the worker is undone (a frozen worker frees nothing);
//   (b) nice      the worker runs at pressure_nice (0) instead of its own (19);
//   (c) drain     on every event, up to drain_per_event of the queue is torn down on the
//                 monitor thread, oldest first (the composition's drain());
//   (d) cap       max_pending drops to pressure_cap (0): new puts tear down inline;
// and on relief puts back what it changed: the freeze levels it undid, the nice value it found,
// the cap it found (unless a cap was set meanwhile, which then stands: see "The cap rule").
// Every action is counted (pressure_policy_stats) and traced (trace::pressure_event).
//
// Who may call what: Target is any type that satisfies pressure_target (an async_teardown, a
// deferred_domain, a model basic_mm_system; cost units bytes, bytes, pages). The constructor (any
// thread but the monitor's) subscribes and the destructor unsubscribes, then undoes whatever is
// still in force; stats() and options() are wait-free from any thread. One policy per target
// object at a time: the constructor refuses a second (std::invalid_argument, changing nothing),
// on any monitor, until the first is destroyed. Two would each save what the other had changed
// and put it back in subscription order, not in reverse, leaving the second's cap and nice in
// force after both reliefs. The monitor and the target must outlive the policy. Its callbacks
// call only the target's pressure_target entry points. Thawing nests as freeze does: the levels
// the policy undid are its own until relief, when it freezes exactly that many again (a thaw
// someone else makes meanwhile finds no level to undo and throws, as on a worker never frozen).
//
// The cap rule. On pressure the policy records the cap it finds (C) and, if C is above
// pressure_cap, replaces it with pressure_cap. On relief it replaces pressure_cap with C in one
// compare-and-swap: if the cap no longer reads pressure_cap, someone set a cap meanwhile, and
// that cap stands (counted in caps_kept). Policies on different targets that share one budget
// compose when their pressure_cap is the same: the first lowers the cap, the others find it
// there and leave it, and the first puts back the original. With different pressure_caps the
// reliefs would run first-in first-out; give such targets budgets of their own.
//
// Memory ordering: the callbacks run under the monitor's mutex (pressure.hpp). The counters are
// relaxed, except that the policy counts an event (a relief) after its actions and stats() reads
// that count first (a snapshot_count): a snapshot that counts it shows what it did.
// Design: docs/design.md, "Memory pressure: pressure.hpp and pressure_policy.hpp".
#pragma once

#include <algorithm>
#include <atomic>
#include <concepts>
#include <cstdint>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "teardown/async_teardown.hpp"  // drain_result
#include "teardown/budget.hpp"
#include "teardown/pressure.hpp"
#include "teardown/snapshot_count.hpp"
#include "teardown/trace.hpp"

namespace teardown {

namespace detail::pressure_policy_impl {

// The targets that have a policy, so that each target's saved state has one owner. A mutex:
// taken only by a policy's constructor and destructor.
struct claimed {
  static inline std::mutex mutex;
  static inline std::vector<const void*> targets;  // guarded by mutex
};

inline bool claim(const void* target) {
  const std::lock_guard lock(claimed::mutex);
  if (std::find(claimed::targets.begin(), claimed::targets.end(), target) != claimed::targets.end()) return false;
  claimed::targets.push_back(target);
  return true;
}

inline void release(const void* target) noexcept {
  const std::lock_guard lock(claimed::mutex);
  const auto at = std::find(claimed::targets.begin(), claimed::targets.end(), target);
  if (at != claimed::targets.end()) claimed::targets.erase(at);
}

}  // namespace detail::pressure_policy_impl

/// Checked by the policy's constructor (std::invalid_argument naming the field).
struct pressure_policy_options {
  bool thaw = true;              // (a) undo every freeze level while pressure lasts
  bool raise_priority = true;    // (b) run the worker at pressure_nice while pressure lasts
  int pressure_nice = 0;         //     [-20, 19]; applied only if below the worker's own
  std::uint64_t drain_per_event = std::uint64_t{64} << 20;  // (c) cost units per event (bytes;
                                 //     pages for an mm_system); 0: no drain. At most budget::max_cap
  bool lower_cap = true;         // (d) hold max_pending at pressure_cap while pressure lasts
  std::uint64_t pressure_cap = 0;  //   cost units; 0: every new put inline. At most budget::max_cap
};

struct pressure_policy_stats {
  std::uint64_t events = 0;         // on_pressure calls
  std::uint64_t episodes = 0;       // of which began an episode
  std::uint64_t reliefs = 0;
  std::uint64_t thawed = 0;         // freeze levels undone
  std::uint64_t refrozen = 0;       // ... and put back on relief (or at unsubscribe)
  std::uint64_t nice_raised = 0;    // the worker's nice set to pressure_nice, applied
  std::uint64_t nice_refused = 0;   // ... refused by the system
  std::uint64_t nice_restored = 0;
  std::uint64_t drained_items = 0;  // torn down on the monitor thread
  std::uint64_t drained_cost = 0;
  std::uint64_t caps_lowered = 0;
  std::uint64_t caps_restored = 0;
  std::uint64_t caps_kept = 0;      // relief found a cap set meanwhile and left it
  bool active = false;              // between an episode's first event and its relief
};

/// What a pressure_policy acts on: the entry points its callbacks call, in the target's cost
/// unit (bytes for async_teardown and deferred_domain, pages for a model basic_mm_system).
///   trace_domain()                the domain of the policy's trace events
///   max_pending(), replace_max_pending(expected, desired)   the cap, read and replaced by CAS
///   drain(max_cost) -> drain_result   tear queued items down on the caller, oldest first
///   nice(), set_nice(n) -> bool   the worker's nice value (true: applied)
///   freeze(), thaw()              the freezer; thaw() throws std::logic_error when not frozen
template <class Target>
concept pressure_target = requires(Target& target, const Target& read, std::uint64_t n, int nice_value) {
  { read.trace_domain() } -> std::convertible_to<std::uint64_t>;
  { read.max_pending() } -> std::convertible_to<std::uint64_t>;
  { target.replace_max_pending(n, n) } -> std::same_as<bool>;
  { target.drain(n) } -> std::same_as<drain_result>;
  { read.nice() } -> std::convertible_to<int>;
  { target.set_nice(nice_value) } -> std::same_as<bool>;
  target.freeze();
  target.thaw();
};

template <class Target>
class pressure_policy final : private pressure_listener {
  static_assert(pressure_target<Target>,
                "teardown::pressure_policy<Target>: Target must satisfy teardown::pressure_target: trace_domain(), "
                "max_pending(), replace_max_pending(expected, desired) -> bool, drain(max_cost) -> drain_result, "
                "nice(), set_nice(int) -> bool, freeze() and thaw()");

 public:
  /// Subscribes to `monitor`. Throws std::invalid_argument for bad options, or when `target`
  /// already has a policy, changing nothing.
  pressure_policy(pressure_monitor& monitor, Target& target, pressure_policy_options opts = {})
      : monitor_(monitor), target_(target), opts_(validated(opts)), domain_(trace_domain_of(target)) {
    if (!detail::pressure_policy_impl::claim(&target_)) {
      throw std::invalid_argument(
          "teardown::pressure_policy: the target already has a pressure_policy (one per target: two would each "
          "put back what the other changed, in the wrong order)");
    }
    try {
      monitor_.subscribe(*this);
    } catch (...) {
      detail::pressure_policy_impl::release(&target_);
      throw;
    }
  }

  pressure_policy(const pressure_policy&) = delete;
  pressure_policy& operator=(const pressure_policy&) = delete;

  /// Unsubscribes (waiting for a callback in progress), then puts back what is still in force,
  /// as relief would. Never from the monitor thread (std::terminate: it would wait for itself).
  ~pressure_policy() {
    (void)monitor_.unsubscribe(*this);
    restore();
    detail::pressure_policy_impl::release(&target_);  // last: a new policy starts from what we put back
  }

  const pressure_policy_options& options() const noexcept { return opts_; }

  /// A snapshot. events and reliefs are counted after their callback's actions and read first:
  /// a snapshot that counts an event or a relief shows everything it did.
  pressure_policy_stats stats() const noexcept {
    pressure_policy_stats s;
    // First: each is added after its callback's actions (snapshot_count.hpp).
    s.events = events_.read_first();
    s.reliefs = reliefs_.read_first();
    s.episodes = episodes_.load(std::memory_order_relaxed);
    s.thawed = thawed_.load(std::memory_order_relaxed);
    s.refrozen = refrozen_.load(std::memory_order_relaxed);
    s.nice_raised = nice_raised_.load(std::memory_order_relaxed);
    s.nice_refused = nice_refused_.load(std::memory_order_relaxed);
    s.nice_restored = nice_restored_.load(std::memory_order_relaxed);
    s.drained_items = drained_items_.load(std::memory_order_relaxed);
    s.drained_cost = drained_cost_.load(std::memory_order_relaxed);
    s.caps_lowered = caps_lowered_.load(std::memory_order_relaxed);
    s.caps_restored = caps_restored_.load(std::memory_order_relaxed);
    s.caps_kept = caps_kept_.load(std::memory_order_relaxed);
    s.active = active_flag_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  static pressure_policy_options validated(const pressure_policy_options& opts) {
    const auto refuse = [](const std::string& what) {
      throw std::invalid_argument("teardown::pressure_policy: " + what);
    };
    if (!detail::valid_nice(opts.pressure_nice)) {
      refuse("pressure_nice must be in [-20, 19], got " + std::to_string(opts.pressure_nice));
    }
    if (opts.drain_per_event > budget::max_cap) {
      refuse("drain_per_event must be at most " + std::to_string(budget::max_cap));
    }
    if (opts.pressure_cap > budget::max_cap) refuse("pressure_cap must be at most " + std::to_string(budget::max_cap));
    return opts;
  }

  // The target's entry points (pressure_target).
  static std::uint64_t trace_domain_of(Target& target) noexcept { return target.trace_domain(); }
  std::uint64_t cap() const { return target_.max_pending(); }
  bool replace_cap(std::uint64_t expected, std::uint64_t desired) {
    return target_.replace_max_pending(expected, desired);
  }
  int target_nice() const { return target_.nice(); }
  bool set_target_nice(int value) { return target_.set_nice(value); }

  // ---- on the monitor thread (or in the destructor, after unsubscribe) --------------------

  // Acts on its own episode state rather than on `first`: a policy subscribed mid-episode
  // begins its own at the first event it hears.
  void on_pressure(bool, std::uint64_t) override {
    trace::pressure("pressure", events_.read() + 1, domain_);
    if (!active_) {
      active_ = true;
      active_flag_.store(true, std::memory_order_relaxed);
      episodes_.fetch_add(1, std::memory_order_relaxed);
      if (opts_.lower_cap) lower_cap();
      if (opts_.raise_priority) raise_priority();
    }
    // Every event: a freeze made since the last one is undone too.
    if (opts_.thaw) thaw_all();
    if (opts_.drain_per_event != 0) {
      const drain_result drained = target_.drain(opts_.drain_per_event);
      drained_items_.fetch_add(drained.items, std::memory_order_relaxed);
      drained_cost_.fetch_add(drained.cost, std::memory_order_relaxed);
      trace::pressure("drain", drained.cost, domain_);
    }
    // Last: a snapshot that counts this event counts what it did.
    events_.add_last();
  }

  void on_relief() override {
    trace::pressure("relief", 0, domain_);
    restore();
    reliefs_.add_last();  // last: a snapshot that counts this relief sees its restore
  }

  void lower_cap() {
    // A CAS loop: a cap set between the read and the replace is read again, so found_cap_ is
    // always the cap this policy replaced.
    for (std::uint64_t found = cap(); found > opts_.pressure_cap; found = cap()) {
      if (replace_cap(found, opts_.pressure_cap)) {
        found_cap_ = found;
        cap_lowered_ = true;
        caps_lowered_.fetch_add(1, std::memory_order_relaxed);
        trace::pressure("cap", opts_.pressure_cap, domain_);
        return;
      }
    }
  }

  void raise_priority() {
    const int own = target_nice();
    if (own <= opts_.pressure_nice) return;
    found_nice_ = own;
    nice_changed_ = true;  // restored even if refused: set_nice kept the value for a later start
    if (set_target_nice(opts_.pressure_nice)) {
      nice_raised_.fetch_add(1, std::memory_order_relaxed);
      trace::pressure("nice", static_cast<std::uint64_t>(opts_.pressure_nice), domain_);
    } else {
      nice_refused_.fetch_add(1, std::memory_order_relaxed);
      trace::pressure("nice_refused", static_cast<std::uint64_t>(opts_.pressure_nice), domain_);
    }
  }

  void thaw_all() {
    std::uint64_t levels = 0;
    for (;;) {
      try {
        target_.thaw();
      } catch (const std::logic_error&) {  // not frozen (any more): every level is undone
        break;
      }
      ++levels;
    }
    if (levels == 0) return;
    held_levels_ += levels;
    thawed_.fetch_add(levels, std::memory_order_relaxed);
    trace::pressure("thaw", levels, domain_);
  }

  // Relief (or the destructor): everything this episode changed, put back.
  void restore() {
    if (!active_) return;
    active_ = false;
    active_flag_.store(false, std::memory_order_relaxed);
    if (cap_lowered_) {
      cap_lowered_ = false;
      if (replace_cap(opts_.pressure_cap, found_cap_)) {
        caps_restored_.fetch_add(1, std::memory_order_relaxed);
        trace::pressure("cap_restored", found_cap_, domain_);
      } else {
        caps_kept_.fetch_add(1, std::memory_order_relaxed);
        trace::pressure("cap_kept", cap(), domain_);
      }
    }
    if (nice_changed_) {
      nice_changed_ = false;
      if (set_target_nice(found_nice_)) nice_restored_.fetch_add(1, std::memory_order_relaxed);
      trace::pressure("nice", static_cast<std::uint64_t>(found_nice_), domain_);
    }
    if (held_levels_ != 0) {
      const std::uint64_t levels = std::exchange(held_levels_, 0);
      for (std::uint64_t i = 0; i < levels; ++i) target_.freeze();
      refrozen_.fetch_add(levels, std::memory_order_relaxed);
      trace::pressure("refreeze", levels, domain_);
    }
  }

  pressure_monitor& monitor_;
  Target& target_;
  const pressure_policy_options opts_;
  const std::uint64_t domain_;

  // The episode's state: touched by the callbacks (under the monitor's mutex) and by the
  // destructor after unsubscribe returned (which orders it after the last callback).
  bool active_ = false;
  bool cap_lowered_ = false;
  std::uint64_t found_cap_ = 0;
  bool nice_changed_ = false;
  int found_nice_ = 0;
  std::uint64_t held_levels_ = 0;

  snapshot_count events_, reliefs_;
  std::atomic<std::uint64_t> episodes_{0}, thawed_{0}, refrozen_{0};
  std::atomic<std::uint64_t> nice_raised_{0}, nice_refused_{0}, nice_restored_{0};
  std::atomic<std::uint64_t> drained_items_{0}, drained_cost_{0};
  std::atomic<std::uint64_t> caps_lowered_{0}, caps_restored_{0}, caps_kept_{0};
  std::atomic<bool> active_flag_{false};
};

}  // namespace teardown
