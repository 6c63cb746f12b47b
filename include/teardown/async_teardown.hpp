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
//     async.put(*b);                            // returns a decision; never blocks on the reaper
//     teardown::async_teardown<buffer, &buffer::hook, buffer_traits, teardown::static_key,
//                              teardown::reaper_pool_workers> pooled({.pool = {.workers = 4}});
//
// The pieces: async_teardown/options.hpp (Traits, options, decision, statistics),
// async_teardown/workers.hpp (one_reaper, reaper_pool_workers), async_teardown/composition.hpp
// (put's steps, the class), async_teardown/control.hpp (flush ... stop), worker_control.hpp.
//
// Who may call what (the async_teardown must outlive every call)
//   put, put_chain        any thread, concurrently. Lock-free apart from what Traits does (prepare
//                         may block) and the inline teardowns it decides on. From a signal
//                         handler: async-signal-safe when it queues, provided Traits' functions and
//                         any trace hook are and nothing throws. put of an item still queued (its
//                         hook on_list()) aborts with a message (the error rule).
//   drain                 any thread but a worker; blocking (tears down on the caller).
//   flush, flush_for, freeze, thaw, stop, stop_for
//                         any thread but a worker; may block (reaper.hpp, reaper_pool.hpp). After
//                         stop or stop_for, put tears down inline. stop and the destructor wait
//                         without limit.
//   destructor            stop(). From its own callback (destroy on a worker, or inside drain) it
//                         aborts with a message (see in_own_callback).
//   enable, disable, set_enabled   any thread; writers serialize (static_key). Not from a signal
//                         handler (a mutex); nor the constructor, drain and the rest that may block.
//   nice, set_nice        any thread; take each worker's control mutex briefly.
//   set_threshold, set_max_pending, replace_max_pending, set_min_concurrent, the getters, stats,
//   stalled, worker_stats, worker_count, in_own_callback
//                         any thread; wait-free (the setters validate first and throw
//                         std::invalid_argument, changing nothing).
//   hurry                 any thread; lock-free (reaper::hurry on the worker(s)).
// Old names, one release, deprecated: shutdown, shutdown_for, worker_nice, set_worker_nice,
// reaper_statistics, decision::sync_*, the stats fields sync, rejected, stalled, uncontended.
//
// A polling worker (opts.reaper.poll_interval > 0) is never woken by a put: the composition
// hurries it after a put that leaves hurry_at (default: half the cap) pending, after a put the
// budget refused, and when the cap is lowered while anything is pending.
//
// Memory ordering: the item reaches the worker through its queue (release add, acquire
// del_all), the charge included; knobs and the in-flight count are relaxed; counters publish
// subset after superset (composition.hpp says how a snapshot stays consistent).
// Design: docs/design.md, "async_teardown: the composition".
#pragma once

#include "teardown/async_teardown/composition.hpp"
#include "teardown/async_teardown/control.hpp"
#include "teardown/async_teardown/options.hpp"
#include "teardown/async_teardown/workers.hpp"
#include "teardown/worker_control.hpp"
