// teardown/deferred/default_domain.hpp — the process-wide domain, its worker, and its shutdown
// at exit.
//
// deferred::default_domain() (what deferred_deleter<T>{}, deferred_delete and async_munmap use)
// runs on deferred::default_worker(), a shared worker other domains may use too. It is created on
// first use and never destroyed, so no deleter can ever reach a dead domain. It is stopped once
// at exit (everything queued is destroyed, the worker stopped, for every sharer; every deletion
// after that is inline on its caller, so none is lost or destroyed twice), by the first of:
//   - the main thread's sentinel, a thread_local armed by the first default_domain() call on the
//     main thread: [basic.start.term] destroys it before any static, so what is queued is
//     destroyed while every static is still alive;
//   - exit() called from a destructor running on the reaper: the rest of its batch and the
//     queue are freed right there, on the reaper;
//   - the closer, a function-local static constructed right after the domain: the fallback, at
//     its own place in static destruction.
// exit() from another thread than main, or before main's first default_domain() call, reaches
// only the closer (call default_domain() early in main). quick_exit, _exit, abort and a fatal
// signal run no destructors. deferred::set_exit_timeout(d) bounds the shutdown; what is left
// stays counted (queued - reaped) and is left to the operating system.
//
// Who may call what
//   deferred::default_domain, deferred::flush, deferred::stats
//                       any thread, any time, even during and after static destruction. The
//                       first call creates the domain (thread-safe, blocking; std::system_error
//                       if the reaper cannot start: the deleters then free inline); later calls
//                       are wait-free, but each thread's first reads its thread id.
//   deferred::set_exit_timeout, deferred::exit_timeout   any thread, any time; wait-free.
//   deferred::default_worker   any thread; the first call starts the worker ("deferred_delete").
//
// Memory ordering: the exit flag is one relaxed exchange (only its atomicity matters); the
// timeout is relaxed (it publishes nothing).
// Design: docs/design.md, "deferred.hpp: the default domain at exit".
#pragma once

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <utility>

#include "teardown/deferred/domain.hpp"
#include "teardown/deferred/node.hpp"
#include "teardown/reaper.hpp"

namespace teardown {

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
    deferred_domain_options opts;
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

}  // namespace teardown
