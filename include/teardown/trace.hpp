// teardown/trace.hpp — trace points: USDT probes for perf/bpftrace, and optional in-process hooks.
//
// The kernel series emits two trace points (queue, reap) so that an operator can see what was
// deferred and how long it waited. teardown emits four events — queue, reap, sync, reject — two
// ways at once:
//
//   USDT  When <sys/sdt.h> is available (Debian: systemtap-sdt-dev), every event is a USDT probe
//         under provider `teardown` (teardown:queue, teardown:reap, teardown:sync,
//         teardown:reject). Unattached, a probe is a single nop instruction plus an ELF note;
//         perf, bpftrace and SystemTap attach to it without recompiling, e.g.
//           bpftrace -e 'usdt:./app:teardown:queue { @cost = hist(arg1); }'
//         Arguments are the event's fields in the order of the structs below.
//   hook  A program may register one function per event at run time (set_hook). Each event's
//         hook sits behind a static_key, so an unhooked event costs one relaxed load.
//
// Detection: defining TEARDOWN_HAVE_SDT (to anything; the CMake target does so in its own build
// tree when it finds sys/sdt.h) forces the probes on, defining TEARDOWN_NO_SDT forces them off;
// otherwise __has_include decides.
//
// Who may call what
//   emit functions (trace::queue, ...)  any thread. Wait-free when unhooked; when hooked they
//                                       call the hook on the emitting thread, which must then
//                                       be as cheap and as thread-safe as the caller needs.
//   set_hook / clear_hook               any thread; writers serialize on a mutex per event
//                                       (may block briefly). An emit racing with set_hook may run
//                                       the old hook, the new one, or none. Not from a signal
//                                       handler (the mutex).
//   Signal handlers: an emit is async-signal-safe when unhooked (a nop and a relaxed load);
//   hooked, it is as safe as the hook, which then runs in the handler (the queue event comes
//   from put(), which may be called from a handler).
//
// Strings (thread names, reasons) travel as `const char*`, never as fixed-size copies: a hook or
// a probe reads them during the event, and they must stay valid only for that long.
//
// Memory ordering: set_hook stores the function with release and emit loads it with acquire,
// so whatever the program set up before set_hook (state the hook reads) is visible to a hook
// called on another thread. The key itself is relaxed (see static_key.hpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

#include "teardown/static_key.hpp"

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
};

/// The reaper picked an item up, just before tearing it down (the item may be freed after).
struct reap_event {
  std::uint64_t id;
  std::uint64_t charged_cost;  // what the producer charged (released after the teardown)
  std::uint64_t live_cost;     // a fresh reading just before the teardown; the gap is what
                               // shrank while the item waited
  int cpu;                     // the reaper's CPU, or -1
  std::uint64_t wait_ns;       // from enqueue to now
};

/// An item was torn down inline on the caller; reason is a static string ("disabled", ...).
struct sync_event {
  std::uint64_t id;
  std::uint64_t cost;
  const char* reason;
};

/// An eligible item did not fit the budget and was torn down inline.
struct reject_event {
  std::uint64_t id;
  std::uint64_t cost;
  std::uint64_t pending;  // the budget's pending at the time
  std::uint64_t cap;      // the budget's cap at the time
};

template <class Event>
using hook = void (*)(const Event&);

namespace detail {

// One slot per event type: the hook and the key that gates it. Constant-initialized.
template <class Event>
struct hook_slot {
  static inline static_key key{false};
  static inline std::atomic<hook<Event>> function{nullptr};
  static inline std::mutex writers;  // serializes set_hook, so key and function agree

  static void call(const Event& event) noexcept {
    // acquire: pairs with the release store in set_hook.
    if (const hook<Event> fn = function.load(std::memory_order_acquire)) fn(event);
  }
};

}  // namespace detail

/// Registers fn for Event (queue_event, reap_event, sync_event, reject_event); nullptr clears.
/// May block briefly behind another writer.
template <class Event>
void set_hook(hook<Event> fn) {
  using slot = detail::hook_slot<Event>;
  const std::lock_guard lock(slot::writers);
  slot::function.store(fn, std::memory_order_release);  // pairs with the acquire in call()
  // An emit that still sees the old key value either skips the event or calls whichever
  // function it loads; call() tolerates null.
  slot::key.set(fn != nullptr);
}

template <class Event>
void clear_hook() {
  set_hook<Event>(nullptr);
}

/// True if Event has a hook registered. Wait-free.
template <class Event>
bool hooked() noexcept {
  return detail::hook_slot<Event>::key.enabled();
}

// The emit functions. Each is wait-free when unhooked: a nop (USDT) and one relaxed load.

inline void queue(std::uint64_t id, std::uint64_t cost, std::int64_t tid, const char* thread_name,
                  int cpu) noexcept {
  TEARDOWN_TRACE(queue, id, cost, tid, thread_name, cpu);
  if (hooked<queue_event>()) [[unlikely]] {
    detail::hook_slot<queue_event>::call(queue_event{id, cost, tid, thread_name, cpu});
  }
}

inline void reap(std::uint64_t id, std::uint64_t charged_cost, std::uint64_t live_cost, int cpu,
                 std::uint64_t wait_ns) noexcept {
  TEARDOWN_TRACE(reap, id, charged_cost, live_cost, cpu, wait_ns);
  if (hooked<reap_event>()) [[unlikely]] {
    detail::hook_slot<reap_event>::call(reap_event{id, charged_cost, live_cost, cpu, wait_ns});
  }
}

inline void sync(std::uint64_t id, std::uint64_t cost, const char* reason) noexcept {
  TEARDOWN_TRACE(sync, id, cost, reason);
  if (hooked<sync_event>()) [[unlikely]] {
    detail::hook_slot<sync_event>::call(sync_event{id, cost, reason});
  }
}

inline void reject(std::uint64_t id, std::uint64_t cost, std::uint64_t pending,
                   std::uint64_t cap) noexcept {
  TEARDOWN_TRACE(reject, id, cost, pending, cap);
  if (hooked<reject_event>()) [[unlikely]] {
    detail::hook_slot<reject_event>::call(reject_event{id, cost, pending, cap});
  }
}

}  // namespace teardown::trace
