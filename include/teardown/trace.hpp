// teardown/trace.hpp — trace points: USDT probes for perf/bpftrace, and optional in-process hooks.
//
// Events: queue, reap, sync, reject (async_teardown and its peers), pressure (a memory-pressure
// policy, pressure.hpp), process_kill and process_release (process_reaper), boost (a worker's
// priority raised while work waited, reaper.hpp "Boost"). Each is emitted two ways at once:
//   USDT  where <sys/sdt.h> exists (TEARDOWN_HAVE_SDT forces on, TEARDOWN_NO_SDT off), a probe
//         under provider `teardown`: a nop plus an ELF note until a tracer attaches, e.g.
//           bpftrace -e 'usdt:./app:teardown:queue { @cost[arg5] = hist(arg1); }'
//         Arguments are the fields of the structs below, the domain last:
//           queue  (id, cost, tid, thread_name, cpu, domain)             arg5 = domain
//           reap   (id, charged_cost, live_cost, cpu, wait_ns, domain)   arg5 = domain
//           sync   (id, cost, reason, domain)                            arg3 = domain
//           reject (id, cost, pending, cap, domain)                      arg4 = domain
//           pressure (action, amount, domain)                            arg2 = domain
//           process_kill    (pid, bytes, signal, domain)                 arg3 = domain
//           process_release (pid, bytes, result, tries, wait_ns, domain) arg5 = domain
//           boost  (tid, nice_before, nice_after, reason, domain)        arg4 = domain
//   hook  up to max_hooks (8) functions per event, installed at run time; each event's hooks sit
//         behind a static_key, so an unhooked event costs one relaxed load.
// The domain: each emitting instance takes a process-unique nonzero id (new_domain(), its
// trace_domain()) and carries it in every event; 0: emitted by no instance. Strings travel as
// `const char*`, valid for the event only.
//
// Who may call what
//   emit functions (trace::queue, ...)  any thread, and signal handlers: wait-free and
//                                       async-signal-safe (no lock, no allocation). Hooks run on
//                                       the emitting thread and must be as cheap, thread-safe
//                                       and signal-safe as the caller needs.
//   add_hook                            any thread, a hook included; writers serialize on a
//                                       mutex per event. Throws, changing nothing:
//                                       std::invalid_argument (nullptr, or already installed),
//                                       std::length_error (the event has max_hooks already).
//   remove_hook, set_hook, clear_hook   any thread but a hook's and a signal handler. Blocking:
//                                       returns once no emit that could have loaded a removed
//                                       hook still runs, so a removed hook is never called
//                                       again. remove_hook of a hook not installed returns
//                                       false; set_hook(fn) replaces every hook (nullptr: none).
//   hooked                              any thread; wait-free.
// An emit racing with a writer may or may not call a hook being added, and may still call one
// being removed (once), until that remove returns; each emit calls each hook at most once, in no
// specified order. A child forked from inside a hook, or during a writer, may only exec or _exit.
//
// Memory ordering: a hook is installed with a release store and loaded by the emit with acquire
// (seq_cst, which includes it), so whatever the program set up before add_hook is visible to a
// hook called on another thread. Removal is the store-buffering pattern, all four accesses
// seq_cst: the emit counts itself in flight, then loads the hooks; the writer stores nullptr,
// then reads the counts. So either the emit loads nullptr, or the writer sees it counted and
// waits for its release decrement (which its acquire read of 0 pairs with). set_hook empties the
// later slots relaxed and exchanges the first with seq_cst last: emits load the slots in order,
// so that exchange stands for them all. The key itself is relaxed (static_key.hpp).
// Design: docs/design.md, "trace points".
#pragma once

#include <pthread.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>

#include "teardown/static_key.hpp"
#include "teardown/sync.hpp"

#if defined(TEARDOWN_HAVE_SDT) || (!defined(TEARDOWN_NO_SDT) && __has_include(<sys/sdt.h>))
#include <sys/sdt.h>
#define TEARDOWN_TRACE_USDT 1
// The arguments are counted here and handed to the fixed-arity STAP_PROBE<n>, which <sys/sdt.h>
// always defines; its own variadic STAP_PROBEV exists only if SDT_USE_VARIADIC was defined
// before the translation unit's first include of <sys/sdt.h>, which a header cannot ensure.
#define TEARDOWN_TRACE_COUNT_(...) \
  TEARDOWN_TRACE_COUNT_IMPL_(__VA_ARGS__, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define TEARDOWN_TRACE_COUNT_IMPL_(a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, n, ...) n
#define TEARDOWN_TRACE_PROBE_(n) TEARDOWN_TRACE_PROBE_IMPL_(n)
#define TEARDOWN_TRACE_PROBE_IMPL_(n) STAP_PROBE##n
/// Emits USDT probe teardown:<event> with 1 to 12 arguments (integers or pointers).
#define TEARDOWN_TRACE(event, ...) \
  TEARDOWN_TRACE_PROBE_(TEARDOWN_TRACE_COUNT_(__VA_ARGS__))(teardown, event, __VA_ARGS__)
#else
#define TEARDOWN_TRACE_USDT 0
#define TEARDOWN_TRACE(event, ...) ((void)0)
#endif

namespace teardown::trace {

/// An item entered the queue (emitted by the producer, after the item is charged).
struct queue_event {
  std::uint64_t id;          // the caller's identity for the item (e.g. its address)
  std::uint64_t cost;        // the charge taken from the budget
  std::int64_t tid;          // the producing thread's kernel thread id
  const char* thread_name;   // the producing thread's name
  int cpu;                   // the CPU the producer ran on, or -1
  std::uint64_t domain;      // the emitting instance's trace_domain(); 0: none
};

/// The reaper picked an item up, just before tearing it down (the item may be freed after).
struct reap_event {
  std::uint64_t id;
  std::uint64_t charged_cost;  // what the producer charged (released after the teardown)
  std::uint64_t live_cost;     // a fresh reading just before the teardown; the gap is what
                               // shrank while the item waited
  int cpu;                     // the reaper's CPU, or -1
  std::uint64_t wait_ns;       // from enqueue to now
  std::uint64_t domain;
};

/// An item was torn down inline on the caller; reason is a static string ("disabled", ...).
struct sync_event {
  std::uint64_t id;
  std::uint64_t cost;
  const char* reason;
  std::uint64_t domain;
};

/// An eligible item did not fit the budget and was torn down inline.
struct reject_event {
  std::uint64_t id;
  std::uint64_t cost;
  std::uint64_t pending;  // the budget's pending at the time
  std::uint64_t cap;      // the budget's cap at the time
  std::uint64_t domain;
};

/// A memory-pressure policy acted on an instance (pressure.hpp). action is a static string:
/// "pressure" (an event arrived; amount: events so far), "relief" (amount: 0), "thaw" (amount:
/// freeze levels undone), "refreeze" (levels put back), "nice" (amount: the nice value set),
/// "nice_refused", "drain" (amount: cost units torn down), "cap" (amount: the cap set),
/// "cap_restored" (the cap put back), "cap_kept" (amount: a cap set meanwhile, left in place).
struct pressure_event {
  const char* action;
  std::uint64_t amount;
  std::uint64_t domain;
};

/// A process_reaper sent a signal to a process (process_reaper.hpp), after charging its RSS.
struct process_kill_event {
  std::int64_t pid;
  std::uint64_t bytes;   // its anonymous RSS read just before the signal: the charge
  int signal;
  std::uint64_t domain;
};

/// A process_reaper is done with a killed process; result is a static string ("released",
/// "raced", "unsupported", "not_permitted", "shared_mm", "not_dying", "failed").
struct process_release_event {
  std::int64_t pid;
  std::uint64_t bytes;    // the charge taken at kill time (released now)
  const char* result;
  std::uint32_t tries;    // process_mrelease calls made for it
  std::uint64_t wait_ns;  // from the signal to now
  std::uint64_t domain;
};

/// A reaper's worker changed priority because work waited for it (docs/design.md, "Boost"): raised
/// (nice_after < nice_before) or, once its queue was empty, lowered back to its own nice.
/// reason is a static string: "flush" (a flush waited), "stop" (a stop waited for the final
/// drain), "budget" (a wait_for_budget waited),
/// "backlog" (the worker found its batch old), "caller" (boost() was called), "drained" (the
/// lowering), "refused" (the reaper's first raise the system refused, a boost or a set_nice:
/// nice_after is the nice asked for; later refusals are counted, not traced).
struct boost_event {
  std::int64_t tid;  // the worker's thread id; for reason "help", the waiting thread that tore
                     // queued items down itself (nice_before: the worker's, nice_after: its own)
  int nice_before;
  int nice_after;
  const char* reason;
  std::uint64_t domain;
};

/// The eight events, the only ones hooks can be installed for.
template <class Event>
concept event = std::is_same_v<Event, queue_event> || std::is_same_v<Event, reap_event> ||
                std::is_same_v<Event, sync_event> || std::is_same_v<Event, reject_event> ||
                std::is_same_v<Event, pressure_event> || std::is_same_v<Event, process_kill_event> ||
                std::is_same_v<Event, process_release_event> || std::is_same_v<Event, boost_event>;

template <class Event>
using hook = void (*)(const Event&);

/// The most hooks one event holds at once.
inline constexpr std::size_t max_hooks = 8;

/// A new trace domain: process-unique (per copy of this header's counter) and nonzero. Every
/// instance that emits events takes one at construction. Wait-free.
inline std::uint64_t new_domain() noexcept {
  // Relaxed: the ids only have to differ, and a single RMW counter hands out each value once.
  static constinit std::atomic<std::uint64_t> last{0};
  return last.fetch_add(1, std::memory_order_relaxed) + 1;
}

namespace detail {

inline void forget_in_flight_after_fork() noexcept;

// Once per process (per copy of this header), from the first install: the child handler only.
inline void register_fork_handler() {
  static const int error = pthread_atfork(nullptr, nullptr, &forget_in_flight_after_fork);
  if (error != 0) throw std::system_error(error, std::generic_category(), "teardown::trace: pthread_atfork failed");
}

// One per event type: its hooks, the key that gates them, and the count of emits in flight
// that a remover waits out. Constant-initialized, so usable before main and from any handler.
// Sync is the policy of its words, locks and waits (sync.hpp): std_sync for the public
// functions below, the deterministic scheduler's in tests/unit/schedule.
template <class Event, class Sync = std_sync>
struct hook_slot {
  template <class W>
  using atomic = typename Sync::template atomic<W>;

  static constinit inline static_key key{false};
  // Read-mostly: written by writers only.
  static constinit inline std::array<atomic<hook<Event>>, max_hooks> functions{};
  // Written by every hooked emit: a line of its own. The emit counts itself on the side that
  // phase names; a remover flips phase so that the side it waits on only drains.
  struct alignas(64) in_flight_counts {
    std::array<atomic<std::uint64_t>, 2> count{};
    atomic<std::uint32_t> phase{0};
  };
  static constinit inline in_flight_counts in_flight{};
  static constinit inline typename Sync::mutex writers;  // serializes the writers: slots and key agree
  static constinit inline typename Sync::mutex drainers;  // serializes the waits, so no two flip phase

  static void call(const Event& event) noexcept {
    // Relaxed: phase only steers which side a remover drains first; either side is counted.
    const std::uint32_t side = in_flight.phase.load(std::memory_order_relaxed) & 1u;
    // seq_cst: pairs with the remover's seq_cst store of nullptr and read of the count (the
    // store-buffering pattern in the header comment): counted before the hooks are loaded.
    in_flight.count[side].fetch_add(1, std::memory_order_seq_cst);
    // A hook removed from one slot may be added again into a later one while this emit runs
    // (remove_hook waits for us, but add_hook does not): each hook is called once per emit.
    std::array<hook<Event>, max_hooks> called{};
    std::size_t calls = 0;
    for (atomic<hook<Event>>& slot : functions) {
      // seq_cst (so acquire): pairs with the release store of add_hook/set_hook, and with the
      // remover's seq_cst store of nullptr.
      const hook<Event> fn = slot.load(std::memory_order_seq_cst);
      if (fn == nullptr || std::find(called.begin(), called.begin() + calls, fn) != called.begin() + calls) continue;
      called[calls++] = fn;
      fn(event);
    }
    // release: pairs with the acquire (seq_cst) read of 0 in drain(): the hooks' work happens
    // before the remove returns.
    in_flight.count[side].fetch_sub(1, std::memory_order_release);
  }

  // Waits until every emit that may have loaded a hook removed before this call has finished.
  // Each side is drained while new emits count on the other, so the wait ends under any load.
  static void drain() {
    const std::lock_guard lock(drainers);
    const std::uint32_t first = in_flight.phase.load(std::memory_order_relaxed) & 1u;
    in_flight.phase.store(first ^ 1u, std::memory_order_relaxed);  // a hint, ordered by nothing
    wait_until_idle(first);
    in_flight.phase.store(first, std::memory_order_relaxed);
    wait_until_idle(first ^ 1u);
  }

  static void wait_until_idle(std::uint32_t side) {
    // seq_cst: pairs with the emit's seq_cst increment (see call()); reading 0 is also an
    // acquire of the release decrements.
    for (unsigned spins = 0; in_flight.count[side].load(std::memory_order_seq_cst) != 0; ++spins) {
      if (spins < 1000) {
        Sync::yield();
      } else {
        Sync::sleep_for(std::chrono::microseconds(50));  // a hook that blocks
      }
    }
  }

  // The writers (add_hook, remove_hook, set_hook below).
  static void add(hook<Event> fn) {
    if (fn == nullptr) throw std::invalid_argument("teardown::trace::add_hook: the hook is nullptr");
    const std::lock_guard lock(writers);
    atomic<hook<Event>>* free = nullptr;
    for (atomic<hook<Event>>& function : functions) {
      const hook<Event> installed = function.load(std::memory_order_relaxed);  // only writers store
      if (installed == fn) {
        throw std::invalid_argument("teardown::trace::add_hook: this hook is already installed for the event");
      }
      if (installed == nullptr && free == nullptr) free = &function;
    }
    if (free == nullptr) {
      throw std::length_error("teardown::trace::add_hook: the event already has max_hooks (" +
                              std::to_string(max_hooks) + ") hooks");
    }
    register_fork_handler();
    free->store(fn, std::memory_order_release);  // pairs with the acquire (seq_cst) load in call()
    // After the store: an emit that sees the key on early finds no hook yet, and skips it.
    key.set(true);
  }

  static bool remove(hook<Event> fn) {
    if (fn == nullptr) return false;
    {
      const std::lock_guard lock(writers);
      bool found = false;
      bool others = false;
      for (atomic<hook<Event>>& function : functions) {
        const hook<Event> installed = function.load(std::memory_order_relaxed);  // only writers store
        if (installed == fn) {
          // seq_cst: pairs with the emit's seq_cst increment and load (see call()).
          function.store(nullptr, std::memory_order_seq_cst);
          found = true;
        } else if (installed != nullptr) {
          others = true;
        }
      }
      if (!found) return false;
      if (!others) key.set(false);
    }
    // Outside writers: a hook may add_hook while this waits for it.
    drain();
    return true;
  }

  static void replace(hook<Event> fn) {
    bool removed = false;
    {
      const std::lock_guard lock(writers);
      if (fn != nullptr) register_fork_handler();
      // The other slots are emptied before fn lands in the first: an emit that loads fn there
      // then sees them empty (emits load the slots in order), so it never calls fn twice.
      for (std::size_t index = 1; index < max_hooks; ++index) {
        // relaxed: the seq_cst exchange of the first slot below publishes these. An emit that
        // loads that exchange's value (or a later one) in the first slot is ordered after it,
        // so it finds these slots empty; one that loads an older value there did so before
        // the exchange in the seq_cst order, so its count came before drain()'s reads of it.
        removed |= functions[index].exchange(nullptr, std::memory_order_relaxed) != nullptr;
      }
      // seq_cst: releases fn (and the emptied slots above) to the emit's acquire load, and
      // removes the old first hook: pairs with the emit's seq_cst increment and load (call()).
      const hook<Event> old = functions[0].exchange(fn, std::memory_order_seq_cst);
      removed |= old != nullptr && old != fn;
      key.set(fn != nullptr);
    }
    if (removed) drain();
  }

  // In a fork child only the forking thread exists: the emits the other threads had in flight
  // will never finish there, so their counts must not make a remover wait.
  static void forget_in_flight() noexcept {
    in_flight.count[0].store(0, std::memory_order_relaxed);
    in_flight.count[1].store(0, std::memory_order_relaxed);
  }
};

inline void forget_in_flight_after_fork() noexcept {
  hook_slot<queue_event>::forget_in_flight();
  hook_slot<reap_event>::forget_in_flight();
  hook_slot<sync_event>::forget_in_flight();
  hook_slot<reject_event>::forget_in_flight();
  hook_slot<pressure_event>::forget_in_flight();
  hook_slot<process_kill_event>::forget_in_flight();
  hook_slot<process_release_event>::forget_in_flight();
  hook_slot<boost_event>::forget_in_flight();
}


}  // namespace detail

/// Installs fn as one more hook for Event (queue_event, reap_event, sync_event, reject_event,
/// pressure_event, process_kill_event, process_release_event, boost_event).
/// Throws, changing nothing, std::invalid_argument if fn is nullptr or already installed for
/// Event, std::length_error if Event already has max_hooks hooks (std::system_error if the
/// fork handler cannot be registered). May block briefly behind another writer. Safe from a hook.
template <event Event>
void add_hook(hook<Event> fn) {
  detail::hook_slot<Event>::add(fn);
}

/// Removes fn from Event's hooks and waits until no emit that may have loaded it is running:
/// once it returns, fn is never called again for Event. Returns false, doing nothing, if fn is
/// not installed (nullptr included). Blocking; never from a hook or a signal handler.
template <event Event>
bool remove_hook(hook<Event> fn) {
  return detail::hook_slot<Event>::remove(fn);
}

/// Replaces every hook of Event with fn (nullptr: removes them all), then waits as remove_hook
/// does for the hooks it removed. An emit racing with it calls the old hooks, fn, or a mix,
/// each at most once. Blocking; never from a hook or a signal handler.
template <event Event>
void set_hook(hook<Event> fn) {
  detail::hook_slot<Event>::replace(fn);
}

/// Removes every hook of Event and waits as remove_hook does. Blocking; never from a hook or a
/// signal handler.
template <event Event>
void clear_hook() {
  set_hook<Event>(nullptr);
}

/// True if Event has at least one hook installed. Wait-free.
template <event Event>
bool hooked() noexcept {
  return detail::hook_slot<Event>::key.enabled();
}

/// True if an emit of Event can be seen: the build has USDT probes (a tracer may be attached)
/// or a hook is installed. An emitter whose arguments cost something to gather (the queueing
/// thread's CPU) skips gathering them when this is false. Wait-free.
template <event Event>
bool observable() noexcept {
  return TEARDOWN_TRACE_USDT != 0 || hooked<Event>();
}

// The emit functions. Each is wait-free when unhooked: a nop (USDT) and one relaxed load. The
// domain is the last argument of each (0: not emitted by an instance).

inline void queue(std::uint64_t id, std::uint64_t cost, std::int64_t tid, const char* thread_name, int cpu,
                  std::uint64_t domain = 0) noexcept {
  TEARDOWN_TRACE(queue, id, cost, tid, thread_name, cpu, domain);
  if (hooked<queue_event>()) [[unlikely]] {
    detail::hook_slot<queue_event>::call(queue_event{id, cost, tid, thread_name, cpu, domain});
  }
}

inline void reap(std::uint64_t id, std::uint64_t charged_cost, std::uint64_t live_cost, int cpu,
                 std::uint64_t wait_ns, std::uint64_t domain = 0) noexcept {
  TEARDOWN_TRACE(reap, id, charged_cost, live_cost, cpu, wait_ns, domain);
  if (hooked<reap_event>()) [[unlikely]] {
    detail::hook_slot<reap_event>::call(reap_event{id, charged_cost, live_cost, cpu, wait_ns, domain});
  }
}

inline void sync(std::uint64_t id, std::uint64_t cost, const char* reason, std::uint64_t domain = 0) noexcept {
  TEARDOWN_TRACE(sync, id, cost, reason, domain);
  if (hooked<sync_event>()) [[unlikely]] {
    detail::hook_slot<sync_event>::call(sync_event{id, cost, reason, domain});
  }
}

inline void reject(std::uint64_t id, std::uint64_t cost, std::uint64_t pending, std::uint64_t cap,
                   std::uint64_t domain = 0) noexcept {
  TEARDOWN_TRACE(reject, id, cost, pending, cap, domain);
  if (hooked<reject_event>()) [[unlikely]] {
    detail::hook_slot<reject_event>::call(reject_event{id, cost, pending, cap, domain});
  }
}

inline void pressure(const char* action, std::uint64_t amount, std::uint64_t domain = 0) noexcept {
  TEARDOWN_TRACE(pressure, action, amount, domain);
  if (hooked<pressure_event>()) [[unlikely]] {
    detail::hook_slot<pressure_event>::call(pressure_event{action, amount, domain});
  }
}

inline void process_kill(std::int64_t pid, std::uint64_t bytes, int signal, std::uint64_t domain = 0) noexcept {
  TEARDOWN_TRACE(process_kill, pid, bytes, signal, domain);
  if (hooked<process_kill_event>()) [[unlikely]] {
    detail::hook_slot<process_kill_event>::call(process_kill_event{pid, bytes, signal, domain});
  }
}

inline void process_release(std::int64_t pid, std::uint64_t bytes, const char* result, std::uint32_t tries,
                            std::uint64_t wait_ns, std::uint64_t domain = 0) noexcept {
  TEARDOWN_TRACE(process_release, pid, bytes, result, tries, wait_ns, domain);
  if (hooked<process_release_event>()) [[unlikely]] {
    detail::hook_slot<process_release_event>::call(process_release_event{pid, bytes, result, tries, wait_ns, domain});
  }
}

inline void boost(std::int64_t tid, int nice_before, int nice_after, const char* reason,
                  std::uint64_t domain = 0) noexcept {
  TEARDOWN_TRACE(boost, tid, nice_before, nice_after, reason, domain);
  if (hooked<boost_event>()) [[unlikely]] {
    detail::hook_slot<boost_event>::call(boost_event{tid, nice_before, nice_after, reason, domain});
  }
}

}  // namespace teardown::trace
