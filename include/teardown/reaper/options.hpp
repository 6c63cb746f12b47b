// teardown/reaper/options.hpp — a reaper's options and statistics.
//
// drain_order, sched_policy, fork_policy, reaper_options (checked by the constructor: bad values throw
// std::invalid_argument naming the field, before any thread starts), setup_warning and reaper_stats (a snapshot
// that reaper::stats() fills counter by counter; each field may be briefly stale). Plain values: no thread
// rules of their own.
//
// Design: docs/design.md, "The reaper".
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "teardown/reaper/driven.hpp"
#include "teardown/worker_thread.hpp"

namespace teardown {

enum class drain_order { oldest_first, newest_first };
enum class sched_policy { other, batch, idle };

/// What a fork() on another thread does about a running worker (see "Fork").
enum class fork_policy {
  never_wait,     // fork() waits for nothing of the worker's; the child leaves the batch the
                  // worker had taken to the parent
  wait_for_item,  // fork() waits for the worker to finish its item and park between items; the
                  // child tears down the rest of the batch too
};


/// Checked by the constructor before any thread starts: a nice or boost_nice value outside
/// [-20, 19], a negative CPU, stall_threshold, yield_after, poll_interval, poll_interval_max or
/// boost_after, a poll_interval_max without a poll_interval or below it, a policy, order or
/// on_fork that is not one of the enum's values, or a name holding a NUL byte is refused with
/// std::invalid_argument naming the field. With driven, so is every option that only a thread
/// of ours could honour: poll_interval, poll_interval_max, cpus, policy, boost_nice,
/// nice_only_if_raisable = false, yield_after and on_fork = wait_for_item; on_work without driven
/// is refused too. (name and nice are kept but name no thread: nice() reports the value.)
struct reaper_options {
  std::string name = "reaper";                       // worker thread name (Linux keeps 15 chars)
  int nice = 19;                                     // applied to the worker thread; [-20, 19]
  std::function<void(std::exception_ptr)> on_error{};  // called on the tearing-down thread when fn throws
  std::vector<int> cpus{};               // affinity preference; empty: the housekeeping CPUs
                                         // (online minus isolated and nohz_full). The thread
                                         // may be re-affined later by anyone.
  sched_policy policy = sched_policy::other;
  drain_order order = drain_order::oldest_first;
  std::uint32_t spin_polls = 256;        // polls of the queue before sleeping; 0 = never spin
  std::chrono::nanoseconds stall_threshold = std::chrono::seconds(1);  // see stalled()
  std::chrono::nanoseconds yield_after = std::chrono::nanoseconds(0);  // yield the CPU between
                                         // items once this much time passed since the last
                                         // yield; 0 = never (cond_resched)
  std::chrono::nanoseconds poll_interval = std::chrono::nanoseconds(0);  // 0: an enqueue that
                                         // finds the worker asleep wakes it (a futex wake);
                                         // > 0: enqueue never wakes it, the idle worker looks
                                         // at the queue at least this often ("Wake policy")
  std::chrono::nanoseconds poll_interval_max = std::chrono::nanoseconds(0);  // lazy polling: an
                                         // idle worker's looks back off (doubling) from
                                         // poll_interval up to this; 0 = no back-off. Needs a
                                         // poll_interval, and not below it
  fork_policy on_fork = fork_policy::never_wait;  // see "Fork"
  std::chrono::nanoseconds boost_after = std::chrono::milliseconds(10);  // how long work waits
                                         // before the worker's priority is raised ("Boost");
                                         // 0 = never boost
  std::optional<int> boost_nice{};       // the nice a boost raises the worker to; empty: the
                                         // waiting thread's own (the constructing thread's for
                                         // a backlog the worker finds itself)
  bool nice_only_if_raisable = true;     // with a boost (boost_after > 0): `nice` is applied at
                                         // the start only where the system would let a boost
                                         // raise the worker back (CAP_SYS_NICE, or an
                                         // RLIMIT_NICE reaching boost_nice or the constructing
                                         // thread's nice); elsewhere the worker keeps the
                                         // constructing thread's nice (setup_warning_nice_kept),
                                         // as the peers' threads do: an unprivileged nice-19
                                         // worker could never be raised again ("Boost")
  bool waiters_help = true;              // a flush or stop that has waited boost_after while no
                                         // raise is in force (refused, or nothing to raise: the
                                         // worker already runs at the waiter's nice) tears
                                         // queued items down itself, and asks the worker for
                                         // the unstarted half of its batch ("Waiters help")
  std::uint64_t trace_domain = 0;        // carried by the worker's boost trace events
  std::function<void()> after_batch{};   // called on the worker after each batch it ran (never
                                         // on a caller; driven: on the thread whose run or
                                         // flush finished the batch); an exception goes to on_error
  bool driven = false;                   // no thread of ours: the program runs the teardowns
                                         // with run() (see "Driven mode")
  // Driven only: called when work becomes runnable (the enqueue that makes the queue non-empty,
  // a run that leaves work behind, a thaw), on that thread, enqueue included. It must be cheap
  // and must not call the reaper, except later through the handle (post it somewhere).
  // An exception goes to on_error.
  std::function<void(drive_handle)> on_work{};
};

/// Setup steps the worker could not apply: reported in reaper_stats, never fatal.
enum setup_warning : std::uint32_t {
  setup_warning_name = 1u << 0,      // pthread_setname_np refused
  setup_warning_nice = 1u << 1,      // setpriority refused
  setup_warning_policy = 1u << 2,    // sched_setscheduler refused
  setup_warning_affinity = 1u << 3,  // sched_setaffinity refused, or no CPU left to prefer
  setup_warning_raise = 1u << 4,     // a raise (a boost, a set_nice to a more urgent value) was
                                     // refused: no CAP_SYS_NICE, and RLIMIT_NICE does not reach it
  setup_warning_nice_kept = 1u << 5, // `nice` was not applied: no boost could raise the worker
                                     // back (nice_only_if_raisable); it runs at its creator's nice
};

struct reaper_stats {
  std::uint64_t enqueued = 0;         // enqueue calls
  std::uint64_t reaped = 0;           // items torn down, by the worker or inline
  std::uint64_t pending = 0;          // enqueued - reaped (a snapshot; may be briefly stale)
  std::uint64_t errors = 0;           // fn (or after_batch) threw
  std::uint64_t batches = 0;          // non-empty batches the worker took
  std::uint64_t inline_reaped = 0;    // items torn down on a caller (after stop, in a fork child)
  std::uint64_t wakeups = 0;          // futex wakes made by producers
  std::uint64_t worker_cpu_ns = 0;    // the worker thread's CPU time (polling included)
  std::uint64_t longest_wait_ns = 0;  // longest time from a batch's first enqueue to its take
  std::uint32_t setup_warnings = 0;   // setup_warning bits
  bool running = false;               // a worker thread exists
  std::uint64_t stolen = 0;           // items this worker took from its siblings' queues (in a
                                      // reaper_pool; counted in reaped here, in enqueued there)
  std::uint64_t yields = 0;           // times the worker yielded the CPU (yield_after)
  std::uint64_t polls = 0;            // sleeps that ended at their time limit, not by a kick
                                      // (poll_interval; in a pool also the steal watch)
  std::uint64_t boosts = 0;           // times the worker's priority was raised ("Boost")
  std::uint64_t boosts_refused = 0;   // raises the system refused (no CAP_SYS_NICE and an
                                      // RLIMIT_NICE below the nice asked for)
  bool boosted = false;               // the worker runs raised now
  std::uint64_t helped = 0;           // items a waiting flush or stop tore down itself
                                      // (waiters_help; counted in reaped and inline_reaped too)
  std::uint64_t hurries = 0;          // hurry() calls (own or a composition's) that woke the
                                      // sleeping worker
  std::uint64_t poll_limit_ns = 0;    // the time limit of the worker's current or last look
                                      // (poll_interval, backed off up to poll_interval_max);
                                      // 0 without a poll_interval
};

namespace detail {

// The options, unless one of them cannot mean what it says: then std::invalid_argument naming
// `who` (the class refusing them) and the field (`field` prefixes its name: "worker." in a pool).
inline reaper_options validated_reaper_options(reaper_options opts, const char* who, const char* field = "") {
  const auto refuse = [&](const std::string& what) {
    throw std::invalid_argument(std::string(who) + ": " + field + what);
  };
  if (!detail::valid_nice(opts.nice)) refuse("nice must be in [-20, 19], got " + std::to_string(opts.nice));
  if (opts.boost_nice && !detail::valid_nice(*opts.boost_nice)) {
    refuse("boost_nice must be in [-20, 19], got " + std::to_string(*opts.boost_nice));
  }
  for (int cpu : opts.cpus) {
    if (cpu < 0) refuse("cpus holds " + std::to_string(cpu) + "; a CPU number is never negative");
  }
  if (opts.policy != sched_policy::other && opts.policy != sched_policy::batch && opts.policy != sched_policy::idle) {
    refuse("policy is not a sched_policy value");
  }
  if (opts.order != drain_order::oldest_first && opts.order != drain_order::newest_first) {
    refuse("order is not a drain_order value");
  }
  if (opts.on_fork != fork_policy::never_wait && opts.on_fork != fork_policy::wait_for_item) {
    refuse("on_fork is not a fork_policy value");
  }
  if (opts.stall_threshold.count() < 0) {
    refuse("stall_threshold is negative (" + std::to_string(opts.stall_threshold.count()) + " ns)");
  }
  if (opts.yield_after.count() < 0) {
    refuse("yield_after is negative (" + std::to_string(opts.yield_after.count()) + " ns); 0 means never");
  }
  if (opts.poll_interval.count() < 0) {
    refuse("poll_interval is negative (" + std::to_string(opts.poll_interval.count()) +
           " ns); 0 means producers wake the worker");
  }
  if (opts.poll_interval_max.count() < 0) {
    refuse("poll_interval_max is negative (" + std::to_string(opts.poll_interval_max.count()) +
           " ns); 0 means no back-off");
  }
  if (opts.poll_interval_max.count() != 0 && opts.poll_interval.count() == 0) {
    refuse("poll_interval_max is set without a poll_interval; lazy polling backs off from poll_interval");
  }
  if (opts.poll_interval_max.count() != 0 && opts.poll_interval_max < opts.poll_interval) {
    refuse("poll_interval_max (" + std::to_string(opts.poll_interval_max.count()) + " ns) is below poll_interval (" +
           std::to_string(opts.poll_interval.count()) + " ns)");
  }
  if (opts.boost_after.count() < 0) {
    refuse("boost_after is negative (" + std::to_string(opts.boost_after.count()) + " ns); 0 means never boost");
  }
  if (opts.name.find('\0') != std::string::npos) refuse("name holds a NUL byte");
  if (opts.on_work && !opts.driven) refuse("on_work is set without driven; only a driven reaper signals work");
  if (opts.driven) {
    const auto no_thread = [&](const char* what) {
      refuse(std::string(what) + " is set with driven; no thread of ours runs");
    };
    if (opts.poll_interval.count() != 0) no_thread("poll_interval");
    if (opts.poll_interval_max.count() != 0) no_thread("poll_interval_max");
    if (!opts.cpus.empty()) no_thread("cpus");
    if (opts.policy != sched_policy::other) no_thread("policy");
    if (opts.boost_nice) no_thread("boost_nice");
    if (!opts.nice_only_if_raisable) no_thread("nice_only_if_raisable");
    if (opts.yield_after.count() != 0) no_thread("yield_after");
    if (opts.on_fork != fork_policy::never_wait) no_thread("on_fork");
  }
  return opts;
}

// True when every field of `opts` is as a default-constructed reaper_options has it: how a
// composition tells an option it would ignore (a pool.worker) from one left alone. The structured
// binding names every field, so a field added to reaper_options stops this compiling until it is
// compared here too. boost_nice's default is empty; it is tested so rather than compared with an
// empty optional (GCC 12 at -O1 with the sanitizers warns that the empty one's value may be read).
inline bool is_default_reaper_options(const reaper_options& opts) {
  const reaper_options none{};
  const auto& [name, nice_value, on_error, cpus, policy, order, spin_polls, stall_threshold, yield_after,
               poll_interval, poll_interval_max, on_fork, boost_after, boost_nice, nice_only_if_raisable,
               waiters_help, trace_domain, after_batch, driven, on_work] = opts;
  return name == none.name && nice_value == none.nice && !on_error && cpus == none.cpus && policy == none.policy &&
         order == none.order && spin_polls == none.spin_polls && stall_threshold == none.stall_threshold &&
         yield_after == none.yield_after && poll_interval == none.poll_interval &&
         poll_interval_max == none.poll_interval_max && on_fork == none.on_fork && boost_after == none.boost_after &&
         !boost_nice.has_value() && nice_only_if_raisable == none.nice_only_if_raisable &&
         waiters_help == none.waiters_help && trace_domain == none.trace_domain && !after_batch &&
         driven == none.driven && !on_work;
}

}  // namespace detail

}  // namespace teardown
