// teardown/reaper.hpp — a dedicated worker thread that tears items down off the caller's path.
//
// The kernel's mm_reaper made a component: one thread fed through an llist, woken only on the empty -> non-empty
// transition, running at nice 19 with an affinity preference for the housekeeping CPUs, freezable between items.
// This umbrella is what a user includes; the parts are in teardown/reaper/ (options, driven mode, the queue
// concepts, the class and, out of line, its wake word, CPU clock, worker loop, control plane, boost and fork).
//
//     auto reap = [](buffer& b) { delete &b; };                // void(T&); may throw
//     teardown::reaper<buffer, &buffer::hook, decltype(reap)> reaper(reap, {.name = "buf_reaper"});
//     reaper.enqueue(*b);                                      // lock-free; returns at once
//     reaper.flush();                                          // everything enqueued so far is done
//
// Who may call what (the reaper must outlive every call, enqueue included):
//   enqueue, enqueue_chain           any thread, concurrently; lock-free. One futex wake at most: only when the
//                                    add found the queue empty AND the worker is asleep AND poll_interval is 0
//                                    ("Wake policy"); with a poll_interval, never. After stop(), and in a fork
//                                    child, fn(item) runs on the caller instead. Async-signal-safe while the
//                                    worker runs, a thread's first enqueue included (no lock, no allocation:
//                                    counter.hpp); after stop() and in a fork child as safe as fn (and on_error).
//                                    An item still queued (its hook on_list(): fn has not started on it) is a
//                                    program bug: enqueue writes why to stderr (write(2)) and aborts, in every
//                                    build. A chain's items are checked as they are pushed onto it.
//   hurry                            any thread, concurrently; lock-free, async-signal-safe; one futex wake at most.
//   request_after_batch              any thread, concurrently; lock-free; one futex wake at most. The worker's next
//                                    pass calls options' after_batch even without a batch (driven: the next run).
//   flush, flush_for                 any thread but the worker; may block (waits for the worker, or helps:
//                                    "Waiters help"). See "The barrier" for exactly what a flush waits for.
//   freeze, thaw                     any thread but the worker; freeze may block until the worker is parked
//                                    between items. Freezes nest; thaw without freeze throws. A worker frozen in
//                                    the middle of a batch hands the rest of it back to the queue, so that
//                                    reap_on_caller reaches everything not yet started.
//   stop, stop_for                   any thread but the worker; may block (drains or helps, joins). Idempotent. stop
//                                    and the destructor wait without limit; stop_for gives up after a timeout and
//                                    leaves the rest to the still-running worker (see stop_for).
//   destructor                       stop(). Never from the reaper's own callback (fn, or take/fn inside
//                                    reap_on_caller): that aborts with a message (it would be a use-after-free),
//                                    as in_own_callback() tells beforehand.
//   stats, stalled, in_own_callback  any thread; wait-free snapshots. stats reads the worker's CPU clock only
//                                    while the worker cannot exit: the exiting worker waits for such a read to
//                                    end, and stats then makes one futex wake.
//   fn                               runs on the worker; also on callers after stop(), in a fork child, on a
//                                    caller that races stop(), and on a waiter that helps; concurrently.
//                                    flush/freeze/stop from fn throw std::logic_error (it would wait for itself).
//                                    With fork_policy::wait_for_item, fn must not construct or destroy a reaper,
//                                    nor call another reaper's flush, freeze, stop or reap_on_caller ("Fork").
//   nice, set_nice, boost            any thread, fn included (this reaper's or another's); each takes a mutex of
//                                    its own briefly, never the control mutex, so a fork() never waits for it.
//   run                              driven only; any thread, several at once (they take turns: the drive lock),
//                                    never from fn. Blocking: tears down on the caller.
//   work_fd                          any thread; wait-free. Poll it; never close it.
//   drive_handle                     any thread, after the reaper's end too (then it does nothing).
//   on_work                          called by an enqueue (or a run, thaw, put-back) on that thread: must be
//                                    cheap and must not call the reaper but later, through the handle.
//   Not async-signal-safe: constructor, flush, freeze, thaw, stop, reap_on_caller, run, destructor (and, with
//   on_work, enqueue beyond what on_work is).
//
// Memory ordering: the queue is an llist (release add, acquire del_all): fn sees what a producer wrote to the item
// before enqueue. A kick is a release RMW on the state word, acquired by the exchange that ends the worker's sleep,
// so its next del_all sees that add. Control requests (flush, freeze, stop) travel under a mutex; a relaxed flag
// tells the worker to look, a kick wakes it. Design: docs/design.md, "The reaper".
#pragma once

#include "teardown/reaper/options.hpp"
#include "teardown/reaper/driven.hpp"
#include "teardown/reaper/queue_concepts.hpp"
#include "teardown/reaper/reaper_class.hpp"
