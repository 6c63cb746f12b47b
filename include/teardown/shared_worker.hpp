// teardown/shared_worker.hpp — one worker thread (or pool) for many compositions.
//
// Every async_teardown and deferred_domain starts a worker of its own by default. A program
// with many instances wants a cap on threads: a shared_worker owns one reaper (or a reaper_pool,
// through the same Workers policy as async_teardown) whose teardown function hands each item
// back to the composition that queued it:
//
//     auto worker = std::make_shared<teardown::shared_worker<buffer, &buffer::hook, buffer_traits>>();
//     teardown::async_teardown<buffer, &buffer::hook, buffer_traits> a({.worker = worker});
//     teardown::async_teardown<buffer, &buffer::hook, buffer_traits> b({.worker = worker});
//
// Dispatch needs the item to name its owner: Traits gets a static owner(T&) -> void*&, a slot
// put() writes before the enqueue and the worker reads. A composition given a shared worker
// whose Traits lack it, or a worker for another T, Hook, Traits or Workers, refuses at
// construction (std::invalid_argument, starting nothing).
//
// Kept per composition: the counters (stats(), errors included), the budget (its own or its
// shared_budget), the threshold, the toggle, the concurrency gate, the trace domain (each reap
// event names the owning composition's), the allocator trimmer. Shared: the worker's own
// statistics (worker_stats() is the shared worker's), its nice value, hurry, the stall
// watchdog, and boost events (which carry the shared worker's trace_domain()).
//
// Who may call what on a composition given a shared worker (besides async_teardown's table)
//   put, put_chain      as without one, plus two RMWs on the composition's gate word (below).
//   flush, flush_for    flush the shared worker: they wait for every sharer's items queued
//                       before the call, a stronger barrier than the composition's own.
//   freeze, thaw        freeze and thaw the shared worker: the worker parks for every sharer
//                       (their puts keep queuing behind it, each up to its own budget), and
//                       a sharer's stop or flush waits for the thaw.
//   drain               offers only this composition's items; the others' are declined and go
//                       back on the queue (behind items added meanwhile).
//   stop, stop_for, destructor
//                       never stop the shared worker. The composition stops queuing (puts
//                       tear down inline, inline_stopped), waits until every put of its own that
//                       passed the stopped check has enqueued (the gate), then flushes the
//                       shared worker, so no item of its own is left queued. stop_for
//                       bounds both waits. A put blocked in prepare holds the wait up.
//                       Destroying a composition from the shared worker's callback (any
//                       sharer's destroy on the worker, or inside a drain) aborts with a message.
// The shared worker itself
//   constructor         any thread; starts the worker(s) (reaper's errors).
//   flush, flush_for, freeze, thaw, stop, stop_for
//                       any thread but the worker; reaper's meaning, for every sharer. After a
//                       stop, every sharer's queued puts are torn down on the putting thread.
//   stats, stalled, hurry, trace_domain, in_own_callback
//                       any thread; as reaper's.
//   run, work_fd        driven mode (options' driven, one_reaper): reaper's, for every
//                       sharer's items; a sharer's run and work_fd forward here.
//   add_batch_end, remove_batch_end   the compositions' trims at the batch end; any thread; a
//                       mutex the worker holds while it calls them (remove waits for a call).
//   destructor          stop(); it outlives each composition (each holds a std::shared_ptr).
//
// Memory ordering: the item (its owner slot included, written before the enqueue) reaches the worker through the
// queue (release add, acquire del_all). The gate, one 32-bit word per composition (a closed bit and the puts in
// flight past the stopped check): a put's increment is relaxed (the word's RMWs are totally ordered), its
// decrement once enqueued a release; stop's closing fetch_or and its waits' loads are acquire, so every
// admitted put's enqueue happens before the flush that follows.
//
// Design: docs/design.md, "The shared worker's gate".
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "teardown/llist.hpp"
#include "teardown/reaper.hpp"
#include "teardown/reaper_pool.hpp"
#include "teardown/reaper_pool/workers.hpp"  // the Workers policies (one_reaper, reaper_pool_workers)
#include "teardown/sync.hpp"
#include "teardown/trace.hpp"

namespace teardown {

namespace detail {

// A composition's side of the shared worker: what the owner slot points at.
template <class T>
struct shared_client {
  void* self = nullptr;
  void (*reap)(void* self, T& item) = nullptr;
};

// The domain-shutdown gate (see "The gate").
template <class Sync = std_sync>
class domain_gate {
 public:
  static constexpr std::uint32_t closed_bit = 1u << 31;

  // True: admitted, leave() must follow. False: closed, nothing to undo.
  bool enter() noexcept {
    // relaxed: the word's RMWs are totally ordered; closing reads this add or we read closed.
    if ((word_.fetch_add(1, std::memory_order_relaxed) & closed_bit) == 0) return true;
    leave();
    return false;
  }
  void leave() noexcept {
    // release: pairs with close()'s acquire loads, so the enqueue before it is visible.
    if (word_.fetch_sub(1, std::memory_order_release) == (closed_bit | 1)) Sync::futex_wake_one(word_);
  }
  bool closed() const noexcept { return (word_.load(std::memory_order_relaxed) & closed_bit) != 0; }

  // Closes and, if `wait`, waits until no admitted put is left, until deadline_ns (Sync's
  // clock; ~0: none). True if none is left.
  bool close(bool wait = true, std::uint64_t deadline_ns = ~std::uint64_t{0}) noexcept {
    // acquire: pairs with leave()'s release when no put is in flight.
    std::uint32_t seen = word_.fetch_or(closed_bit, std::memory_order_acquire) | closed_bit;
    if (!wait) return seen == closed_bit;
    while (seen != closed_bit) {
      if (deadline_ns == ~std::uint64_t{0}) {
        Sync::futex_wait(word_, seen);
      } else {
        const std::uint64_t now = Sync::now_ns();
        if (now >= deadline_ns) return false;
        Sync::futex_wait_for(word_, seen, deadline_ns - now);
      }
      seen = word_.load(std::memory_order_acquire);  // pairs with leave()'s release
    }
    Sync::futex_wake_one(word_);  // another closer may wait too: pass the wake on
    return true;
  }

 private:
  typename Sync::template atomic<std::uint32_t> word_{0};
};

}  // namespace detail

/// What every shared_worker is to async_teardown_options: the composition checks the kind
/// (T, Hook, Traits, Workers) before it uses one.
class shared_worker_base {
 public:
  virtual ~shared_worker_base() = default;
  const void* kind() const noexcept { return kind_; }
  /// The worker polls (poll_interval > 0): compositions hurry it as they would their own.
  bool polls() const noexcept { return polls_; }

 protected:
  shared_worker_base(const void* kind, bool polls) noexcept : kind_(kind), polls_(polls) {}

 private:
  const void* kind_;
  bool polls_;
};

/// Traits whose items name their owner: static owner(T&) -> void*&.
template <class Traits, class T>
concept owner_traits = requires(T& item) {
  { Traits::owner(item) } -> std::same_as<void*&>;
};

template <class T, llist_node T::*Hook, class Traits, class Workers = one_reaper>
class shared_worker final : public shared_worker_base {
  static_assert(owner_traits<Traits, T>, "shared_worker: Traits needs a static owner(T&) -> void*&");

  struct dispatch {
    void operator()(T& item) const {
      auto* client = static_cast<detail::shared_client<T>*>(Traits::owner(item));
      client->reap(client->self, item);  // may free item
    }
  };

 public:
  using workers_type = typename Workers::template type<T, Hook, dispatch>;
  using options_type = typename Workers::options;

  static const void* kind_tag() noexcept {
    static const char tag = 0;
    return &tag;
  }

  /// Starts the worker(s); throws as reaper (or reaper_pool) does, starting nothing.
  explicit shared_worker(options_type opts = default_options())
      : shared_worker_base(kind_tag(), polls(opts)), workers_(dispatch{}, with_domain(std::move(opts))) {}

  static options_type default_options() {
    options_type opts{};
    if constexpr (requires { opts.name; }) opts.name = "shared_worker";
    else opts.worker.name = "shared_worker";
    return opts;
  }

  void flush() { workers_.flush(); }
  template <class Rep, class Period>
  bool flush_for(std::chrono::duration<Rep, Period> timeout) {
    return workers_.flush_for(timeout);
  }
  void freeze() { workers_.freeze(); }
  void thaw() { workers_.thaw(); }
  void stop() { workers_.stop(); }
  template <class Rep, class Period>
  bool stop_for(std::chrono::duration<Rep, Period> timeout) {
    return workers_.stop_for(timeout);
  }
  /// Wakes a polling worker at once (reaper::hurry, reaper_pool::hurry).
  auto hurry() noexcept { return workers_.hurry(); }
  /// Driven mode (options' driven; one_reaper only): reaper::run and reaper::work_fd, for
  /// every sharer's items. A sharer's own run and work_fd are these.
  template <class W = Workers>
    requires std::same_as<W, one_reaper>
  drive_result run(drive_limits limits = {}) {
    return workers_.run(limits);
  }
  template <class W = Workers>
    requires std::same_as<W, one_reaper>
  int work_fd() const noexcept {
    return workers_.work_fd();
  }
  reaper_stats stats() const noexcept { return workers_.stats(); }
  bool stalled() const noexcept { return workers_.stalled(); }
  bool in_own_callback() const noexcept { return workers_.in_own_callback(); }
  std::uint64_t trace_domain() const noexcept { return trace_domain_; }

  /// The worker(s) themselves, for the compositions (not part of the API).
  workers_type& workers() noexcept { return workers_; }

  /// The sharers' batch ends (a composition's trim), for the compositions: `end(key)` is called
  /// on the worker after each batch, and once after request_after_batch() on the workers, until
  /// remove_batch_end(key) returns (which waits for a call in progress). Not part of the API.
  void add_batch_end(void* key, void (*end)(void*)) {
    const std::lock_guard lock(batch_ends_mutex_);
    batch_ends_.push_back({key, end});
  }
  void remove_batch_end(void* key) noexcept {
    const std::lock_guard lock(batch_ends_mutex_);
    std::erase_if(batch_ends_, [key](const batch_end& e) { return e.key == key; });
  }

 private:
  static bool polls(const options_type& opts) noexcept {
    if constexpr (requires { opts.poll_interval; }) return opts.poll_interval.count() != 0;
    else return opts.worker.poll_interval.count() != 0;
  }
  options_type with_domain(options_type opts) {
    auto& worker = [&]() -> reaper_options& {
      if constexpr (requires { opts.trace_domain; }) return opts;
      else return opts.worker;
    }();
    worker.trace_domain = trace_domain_;
    worker.after_batch = [this, theirs = std::move(worker.after_batch)] {
      if (theirs) theirs();
      run_batch_ends();
    };
    return opts;
  }

  // On the worker. Under the mutex: a sharer that removes itself waits for its call to end.
  void run_batch_ends() noexcept {
    const std::lock_guard lock(batch_ends_mutex_);
    for (const batch_end& e : batch_ends_) e.end(e.key);
  }

  struct batch_end {
    void* key;
    void (*end)(void*);
  };

  const std::uint64_t trace_domain_ = trace::new_domain();
  std::mutex batch_ends_mutex_;
  std::vector<batch_end> batch_ends_;  // the sharers' (batch_ends_mutex_)
  workers_type workers_;  // last: stopped (drained) first
};

}  // namespace teardown
