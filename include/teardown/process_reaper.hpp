// teardown/process_reaper.hpp — the supervisor's side of real processes (Linux): kill a process
// through a pidfd, and give its memory back from a worker of ours while it exits.
//
//     teardown::process::process_reaper reaper({.budget_bytes = 4ull << 30});
//     auto child = teardown::process::pidfd_process::spawn([] { return run_service(); });
//     reaper.kill(child);                             // SIGKILL; the worker calls process_mrelease
//     child.wait();                                   // reap it (our child)
//     reaper.wait_for_budget(1ull << 30, 30s);        // at most 1 GiB still coming back: respawn
//
// process_mrelease(pidfd) (Linux 5.15) reaps a dying process's anonymous memory from another
// task, as the kernel's oom_reaper does, concurrently with the victim's own exit (lmkd's order:
// pidfd_send_signal, then process_mrelease). process_reaper is that on a library reaper: a
// lock-free enqueue, a worker that blocks signals, a budget of the bytes in teardown, counters.
//
// Who may call what (none of it is async-signal-safe: kill allocates, the rest may block)
//   pidfd_process::spawn   any thread: fork(); pidfd_open in the parent before the child may run
//                          (so no other waiter can reap it first); the child runs child_main()
//                          and _exits with its result (0 for void, 127 if it throws).
//   pidfd_process::adopt   any thread: pidfd_open(pid) of any process we may see.
//   send_signal, exited,   any thread, one object at a time; may block only in wait(). wait and
//   wait, try_wait         try_wait reap our own child (waitid P_PIDFD); not our child: ECHILD.
//   ~pidfd_process         closes the pidfd; never kills, never reaps.
//   process_reaper::kill   any thread, concurrently; not from the reaper's own callback. Charges
//                          the anonymous RSS, checks with signal 0 that the process may be
//                          signalled, enqueues a copy of the pidfd and returns; the worker sends
//                          the signal and calls process_mrelease (signal_on_worker = false: the
//                          signal is sent here). Over budget, after stop() or in a fork child,
//                          signal and release run on the caller (the back-pressure).
//   flush, stop, stop_for  any thread but the worker; block (flush: until every process killed
//                          before it is done; stop: the same, then joins; stop_for: at most d).
//   wait_for_budget        any thread but the worker; blocks until bytes_in_teardown() <= bytes
//                          or the timeout (a futex on a word bumped after each release). A wait
//                          past 10 ms raises the worker to the waiter's nice (docs/design.md, "Boost").
//   nice, set_nice         any thread: the worker's nice value (options.nice at start).
//   stats, worker_stats, bytes_in_teardown, trace_domain   any thread; wait-free snapshots.
//   destructor             stop(): every process queued is still released, on the worker.
// What the worker makes of each process: release_result (process_reaper/options.hpp).
//
// No lost wake-up in wait_for_budget: the worker releases a charge, then notifies an
// event_count (event_count.hpp); a waiter takes its key, then reads the budget, and sleeps only
// while no notify came since the key.
//
// Memory ordering: the items travel through the reaper's llist (release add, acquire del_all),
// so the worker sees the pidfd and the charge kill wrote. Counters are relaxed, but done_ is
// added last with release and read first with acquire, so pending (killed - done) is never
// negative in a snapshot. The budget is relaxed (budget.hpp); the event_count above orders it.
//
// Fork: fork() waits for nothing of the worker's (fork_policy::never_wait). A fork child
// releases inline, starts with an empty budget, and releases the processes still queued at the
// fork; those the worker had taken are left to the parent. The pidfds are close-on-exec.
//
//   process_reaper/pidfd_process.hpp    exit_status, pidfd_process
//   process_reaper/options.hpp          release_result, process_reaper_options, _stats
//   process_reaper/anonymous_rss.hpp    the charge: a process's anonymous RSS (internal)
//   process_reaper/process_reaper.hpp   process_reaper
// Design: docs/design.md, "Processes: the supervisor's side (process_reaper.hpp, Linux)".
#pragma once

#if !defined(__linux__)
#error "teardown/process_reaper.hpp: Linux only (pidfd_open, pidfd_send_signal, process_mrelease)"
#endif

#include "teardown/process_reaper/options.hpp"
#include "teardown/process_reaper/pidfd_process.hpp"
#include "teardown/process_reaper/process_reaper.hpp"
