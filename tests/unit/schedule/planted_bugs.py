#!/usr/bin/env python3
"""Plants each bug the deterministic scheduler must find, one at a time, and runs the schedule
test that explores its protocol: a caught bug prints the schedule that failed (replay it with
TEARDOWN_SCHEDULE_REPLAY=<name>). Each header is restored afterwards, even on an error; run it
in a scratch checkout or copy anyway (`git worktree add --detach /tmp/plant`, or a copy of the
tree), since it edits headers in place. Needs the default preset configured there, or --build.

Usage: tests/unit/schedule/planted_bugs.py [--root DIR] [--build DIR] [--check] [name...]   (default: every bug)
  --root DIR    the tree whose include/ gets the plants (default: the one holding this script)
  --build DIR   a configured build folder of that tree (default: the default preset's)
  --check       only checks that each plant's text is in its header exactly once (ctest
                lint.planted_bugs: a header edit that a plant no longer matches fails there)
"""
import argparse
import pathlib
import subprocess
import sys

parser = argparse.ArgumentParser()
parser.add_argument('--root', type=pathlib.Path, default=pathlib.Path(__file__).resolve().parents[3])
parser.add_argument('--build', type=pathlib.Path)
parser.add_argument('--check', action='store_true')
parser.add_argument('names', nargs='*')
args = parser.parse_args()
root = args.root.resolve()
build = args.build.resolve() if args.build else None
H = 'include/teardown/'
WAKE = H + 'reaper/wake_word.hpp'      # the producers' path and the wake word
LOOP = H + 'reaper/worker_loop.hpp'    # the worker's pass
CONTROL = H + 'reaper/control.hpp'     # flush tickets, the hand count, freeze, stop
QUEUE = H + 'reaper/queue_concepts.hpp'
CLASS = H + 'reaper/reaper_class.hpp'
DRIVE = H + 'reaper/drive.hpp'         # driven runs and flushes
STEAL = H + 'reaper_pool/stealing.hpp'
BOOST = H + 'reaper/boost.hpp'         # the boost and waiters help
T = H + 'trace.hpp'
# name: (file, text to replace (exactly once), the bug, the schedule tests that must catch it
#        [, the test program: reaper_schedule_test unless named])
plants = {
 'wake': (WAKE, """  const std::uint32_t previous = state_.fetch_or(kicked_bit, std::memory_order_release);
  if (previous & stopped_bit) {
    drain_inline_counted();""", """  const std::uint32_t previous = state_.load(std::memory_order_acquire);
  state_.fetch_or(kicked_bit, std::memory_order_release);
  if (previous & stopped_bit) {
    drain_inline_counted();""", 'ScheduleTest.WakeSleep*'),
 'putback': (LOOP,
             "  if (put_backs_ != pass_put_backs_) {\n    pass_put_backs_ = put_backs_;\n    request_locked();\n"
             "    return false;",
             "  if (false && put_backs_ != pass_put_backs_) {\n    pass_put_backs_ = put_backs_;\n"
             "    request_locked();\n    return false;", 'ScheduleTest.FlushIsABarrierBesideReapOnCaller'),
 'shardflags': (QUEUE, "    if (sweep) {\n      if constexpr (has_oldest_first_sweep",
                "    if (false && sweep) {\n      if constexpr (has_oldest_first_sweep",
                'ScheduleTest.FlushOverAShardedQueueSeesEveryShard'),
 'putback_own_start': (CONTROL, "if (caller_reaps_++ == 0) caller_reaps_since_ = flush_completed_;",
                       "caller_reaps_++;\n    caller_reaps_since_ = flush_completed_;",
                       'ScheduleTest.FlushWaitsThroughOverlappingPutBacks'),
 'driver_uncounted_first': (DRIVE,
                            "    if (drive.owns_lock()) drive.unlock();\n    const std::lock_guard lock(self.control_mutex_);\n"
                            "    --self.drivers_;\n    self.control_changed_.notify_all();",
                            "    {\n      const std::lock_guard lock(self.control_mutex_);\n      --self.drivers_;\n"
                            "      self.control_changed_.notify_all();\n    }\n    if (drive.owns_lock()) drive.unlock();",
                            'DrivenScheduleTest.AFreezeReturnsOnlyOnceNoRunHoldsItems', 'reaper_driven_schedule_test'),
 'flush_skips_drive_lock': (DRIVE,
                            "  std::unique_lock drive(drive_mutex_, std::defer_lock);\n"
                            "  if (!lock_before(drive, deadline)) return false;\n  std::uint64_t put_backs = 0;",
                            "  for (T& item : take_queue(true, true)) tear_down(item, true);\n  return true;\n"
                            "  std::unique_lock drive(drive_mutex_, std::defer_lock);\n"
                            "  if (!lock_before(drive, deadline)) return false;\n  std::uint64_t put_backs = 0;",
                            'DrivenScheduleTest.RunFlushAndEnqueue*', 'reaper_driven_schedule_test'),
 'gate_skips_wait': (H + 'shared_worker.hpp', "    if (!wait) return seen == closed_bit;",
                     "    if (true || !wait) return seen == closed_bit;",
                     'SharedWorkerScheduleTest.ShutdownWaitsForAPutInFlight', 'shared_worker_test'),
 'uncounted_drain': (CONTROL, "  const std::uint64_t unit = open_hand();\n  drain_inline();\n  close_hand(unit);",
                     "  drain_inline();", 'CompositionScheduleTest.StopWaitsForAnInlineDrain*',
                     'composition_schedule_test'),  # ScheduleTest.StopCovers* meets it once in thousands
 # (A stop that does not wait for caller_reaps_ is no longer caught anywhere: reap_on_caller counts
 # itself as a hand for the whole call, and stop waits for hands. The plant is retired; the wait
 # stays until its removal is argued.)
 'freeze_early': (CONTROL,
                  "control_changed_.wait(lock, [&] { return worker_parked_ || !worker_running_ || stop_requested_; });",
                  "control_changed_.wait(lock, [&] { return true || worker_parked_ || !worker_running_ || "
                  "stop_requested_; });", 'ScheduleTest.FreezeParks*'),
 'pool_trusts_round': (STEAL, "if (steal_events_ == seen) return true;",
                       "if (steal_events_ == seen || true) return true;", 'ScheduleTest.PoolFlush*'),
 'watchdog_after_take': (LOOP, """  batch_since_ns_ = oldest_enqueue_ns_.load(std::memory_order_relaxed);
  if (batch_since_ns_ != 0) batch_since_ns_ = oldest_enqueue_ns_.exchange(0, std::memory_order_relaxed);
  in_flight_ = take_queue(sweep, opts_.order == drain_order::oldest_first);""",
                         """  in_flight_ = take_queue(sweep, opts_.order == drain_order::oldest_first);
  batch_since_ns_ = oldest_enqueue_ns_.load(std::memory_order_relaxed);
  if (batch_since_ns_ != 0) batch_since_ns_ = oldest_enqueue_ns_.exchange(0, std::memory_order_relaxed);""",
                         'ScheduleTest.StallWatchdog*'),
 'nice_takes_control': (CLASS, "  int nice() const {\n    const std::lock_guard lock(nice_mutex_);",
                        "  int nice() const {\n    const std::lock_guard lock(control_mutex_);",
                        'ScheduleTest.ForkParks*'),
 'share_keeps_ticket': (LOOP, "      (void)hand_back_in_flight(rest - rest / 2);\n",
                        "      (void)hand_back_in_flight(rest - rest / 2);\n      handed_back_ = false;\n",
                        'HelpScheduleTest.*', 'reaper_help_schedule_test'),
 'help_uncounted': (BOOST, "  const std::size_t helped = reap_on_caller([](T&) noexcept { return true; });",
                    "  std::size_t helped = 0;\n"
                    "  for (T& item : take_queue(false, true)) { tear_down_inline(item); ++helped; }",
                    'HelpScheduleTest.*', 'reaper_help_schedule_test'),
 'thaw_wakes_one': (CONTROL, "  --freeze_depth_;\n  control_changed_.notify_all();",
                    "  --freeze_depth_;\n  control_changed_.notify_one();",
                    'CompositionScheduleTest.ThawWakes*', 'composition_schedule_test'),
 # caught only with spurious wake-ups (TEARDOWN_SCHEDULE_SPURIOUS=0 misses it):
 'flush_waits_once': (CONTROL,
                      "    control_changed_.wait(lock, done);\n"
                      "  } else if (!control_changed_.wait_until(lock, deadline, done)) {\n"
                      "    return false;\n  }\n  if (ticket != 0",
                      "    if (!done()) control_changed_.wait(lock);\n"
                      "  } else if (!control_changed_.wait_until(lock, deadline, done)) {\n"
                      "    return false;\n  }\n  if (ticket != 0", 'ScheduleTest.FlushIsABarrierBesideReapOnCaller'),
 'settle_skips_stale_side': (CONTROL, "  if (!await_no_hands(current_side ? side0_mask : side1_mask, deadline)) return false;",
                             "  (void)current_side;", 'BarrierTest.ASettlerAfterOneThatGaveUp*', 'barrier_test'),
 'emit_twice': (T, "if (fn == nullptr || std::find(called.begin(), called.begin() + calls, fn) != "
                "called.begin() + calls) continue;", "if (fn == nullptr) continue;", 'ScheduleTest.OneEmit*'),
 # Weakened memory orders, caught by the weak memory model (memory_model.hpp); weakened_orders.py
 # tries every one:
 'push_relaxed': (H + 'llist.hpp', "} while (!head_.compare_exchange_weak(head, first, std::memory_order_release,",
                  "} while (!head_.compare_exchange_weak(head, first, std::memory_order_relaxed,",
                  'LlistScheduleTest.*', 'llist_schedule_test'),
 'del_all_relaxed': (H + 'llist.hpp', "return batch(head_.exchange(nullptr, std::memory_order_acquire));",
                     "return batch(head_.exchange(nullptr, std::memory_order_relaxed));",
                     'LlistScheduleTest.*', 'llist_schedule_test'),
 # del_first's first read of the head relaxed: it reads the new head's link unordered after the
 # add that wrote it (the link hooks, atomics.hpp).
 'del_first_relaxed': (H + 'llist.hpp', "llist_node* first = head_.load(std::memory_order_acquire);",
                       "llist_node* first = head_.load(std::memory_order_relaxed);",
                       'LlistScheduleTest.DelFirst*', 'llist_schedule_test'),
 'replace_all_no_release': (H + 'llist.hpp', "std::exchange(nodes.first_, nullptr), std::memory_order_acq_rel)",
                            "std::exchange(nodes.first_, nullptr), std::memory_order_acquire)",
                            'LlistScheduleTest.ReplaceAll*', 'llist_schedule_test'),
 'replace_all_no_acquire': (H + 'llist.hpp', "std::exchange(nodes.first_, nullptr), std::memory_order_acq_rel)",
                            "std::exchange(nodes.first_, nullptr), std::memory_order_release)",
                            'LlistScheduleTest.ReplaceAll*', 'llist_schedule_test'),
 'woken_no_acquire': (WAKE, "  previous = state_.exchange(0, std::memory_order_acquire);",
                      "  previous = state_.exchange(0, std::memory_order_relaxed);", 'ScheduleTest.WakeSleepNever*'),
 'kick_no_release': (WAKE, "  // reads this kick or a later RMW. No acquire: reading STOPPED, we drain through the llist's\n"
                     "  // own acquire and read nothing else the worker wrote.\n"
                     "  const std::uint32_t previous = state_.fetch_or(kicked_bit, std::memory_order_release);",
                     "  // reads this kick or a later RMW.\n"
                     "  const std::uint32_t previous = state_.fetch_or(kicked_bit, std::memory_order_relaxed);",
                     'ScheduleTest.WakeSleepNever*'),
 'close_hand_relaxed': (CONTROL, "  inline_hands_.fetch_sub(unit, std::memory_order_release);",
                        "  inline_hands_.fetch_sub(unit, std::memory_order_relaxed);",
                        'CompositionScheduleTest.StopWaitsForAnInlineDrain*', 'composition_schedule_test'),
 'emit_count_acq_rel': (T, "    in_flight.count[side].fetch_add(1, std::memory_order_seq_cst);",
                        "    in_flight.count[side].fetch_add(1, std::memory_order_acq_rel);",
                        'ScheduleTest.RemoveHookWaits*'),
 'remove_store_release': (T, "          function.store(nullptr, std::memory_order_seq_cst);",
                          "          function.store(nullptr, std::memory_order_release);", 'ScheduleTest.RemoveHookWaits*'),
 'hook_done_relaxed': (T, "    in_flight.count[side].fetch_sub(1, std::memory_order_release);",
                       "    in_flight.count[side].fetch_sub(1, std::memory_order_relaxed);", 'ScheduleTest.RemoveHookWaits*'),
 # The trimmer through async_teardown under the scheduler: a drain that trims on its caller.
 'drain_trims_on_caller': (H + 'async_teardown/composition.hpp',
                           "        on_workers([](auto& workers) { workers.request_after_batch(); });",
                           "        (void)trimmer_.after_batch();", 'CompositionScheduleTest.AsyncTeardown*',
                           'composition_schedule_test'),
 # A drain that asks for no batch end: what it freed waits for the worker's next batch, and with
 # none coming, stays untrimmed.
 'drain_asks_no_trim': (H + 'async_teardown/composition.hpp',
                        "        on_workers([](auto& workers) { workers.request_after_batch(); });",
                        "        (void)0;", 'CompositionScheduleTest.WhatADrainFrees*', 'composition_schedule_test'),
 # Weakened orders: the worker's CPU figure published with its clock's close (a reader that finds
 # the clock closed reads 0), and the STOPPED exchange of a stop on the worker's own thread (the
 # exit path: its last pass misses a put whose kick came before it).
 'clock_close_relaxed': (H + 'reaper/cpu_clock.hpp',
                         "fetch_or(clock_closed_bit, std::memory_order_acq_rel)",
                         "fetch_or(clock_closed_bit, std::memory_order_acquire)",
                         'ScheduleTest.CpuTimeReadBesideTheWorkersExit*'),
 # The clock's close release only (as it was until the clock hooks showed it): a reader done
 # before the close is not ordered before the worker's thread ends.
 'clock_close_no_acquire': (H + 'reaper/cpu_clock.hpp',
                            "fetch_or(clock_closed_bit, std::memory_order_acq_rel)",
                            "fetch_or(clock_closed_bit, std::memory_order_release)",
                            'ScheduleTest.CpuTimeReadBesideTheWorkersExit*'),
 'own_worker_stop_relaxed': (CONTROL,
                             "  (void)state_.exchange(stopped_bit, std::memory_order_acquire);\n  for (;;) {",
                             "  (void)state_.exchange(stopped_bit, std::memory_order_relaxed);\n  for (;;) {",
                             'CompositionScheduleTest.AShutdownOnTheWorker*', 'composition_schedule_test'),
 # The pool's no lost watch: the holder's scan loads watching acquire only (a store-buffering
 # pair with the sleeper's store of false: both miss each other, and the sibling sleeps for good).
 'lost_watch': (STEAL, "    if (links_[j]->watching.load(std::memory_order_seq_cst)) continue;",
                "    if (links_[j]->watching.load(std::memory_order_acquire)) continue;",
                'ScheduleTest.AHeldBatchBehindABlockedItem*'),
 # stats()' snapshot order: reaped counted relaxed (a snapshot then sees reaped above queued).
 'reaped_unordered': (H + 'async_teardown/composition.hpp',
                      "        self->reaped_.add(1, std::memory_order_release);",
                      "        self->reaped_.add(1, std::memory_order_relaxed);",
                      'CompositionScheduleTest.AStatsSnapshot*', 'composition_schedule_test'),
 # The sharded queue's summary word: a flag set relaxed, so the worker woken by it may take its
 # shard before the push and sleep with the item queued.
 'summary_flag_relaxed': (H + 'sharded_llist.hpp', "summary_.compare_exchange_weak(seen, seen | bit, std::memory_order_release,",
                          "summary_.compare_exchange_weak(seen, seen | bit, std::memory_order_relaxed,",
                          'ScheduleTest.WakeSleepOverAShardedQueue*'),
 # snapshot_count (the pressure policy's, the process reaper's and the model's stats): the count
 # added relaxed, so a snapshot reads it ahead of the work it counts.
 'snapshot_count_relaxed': (H + 'snapshot_count.hpp', "value_.fetch_add(n, std::memory_order_release);",
                            "value_.fetch_add(n, std::memory_order_relaxed);",
                            'SnapshotCountScheduleTest.*', 'llist_schedule_test'),
 # event_count (the process reaper's wait_for_budget): the key taken relaxed, so a waiter reads
 # the last key with an older budget and sleeps with nobody left to notify it.
 'event_count_key_relaxed': (H + 'event_count.hpp', "return word_.load(std::memory_order_acquire);",
                             "return word_.load(std::memory_order_relaxed);",
                             'EventCountScheduleTest.*', 'llist_schedule_test'),
 # reference_count (the model's mm_users and mm_count): put only a release, so the last put
 # reads from another holder's put without being ordered after that holder's writes.
 'reference_count_put_release': (H + 'reference_count.hpp', "value_.fetch_sub(1, std::memory_order_acq_rel) == 1;",
                                 "value_.fetch_sub(1, std::memory_order_release) == 1;",
                                 'ReferenceCountScheduleTest.*', 'llist_schedule_test'),
 # The model's AIO context: exit_aio's read of the Dekker pair acquire only (it was, until this
 # scenario showed a request left in flight after exit_aio returned).
 'aio_exit_reads_acquire': (H + 'model/aio.hpp', "(n = in_flight_.load(std::memory_order_seq_cst)) != 0;",
                            "(n = in_flight_.load(std::memory_order_acquire)) != 0;",
                            'CompositionScheduleTest.ExitAio*', 'composition_schedule_test'),
 # The trimmer's protocol (allocator_trim_test: gates and flushes, not the scheduler) and the
 # deferred domain's decision (deferred_test):
 'flush_unsettled': (H + 'async_teardown/control.hpp',
                     "      trimmer_.begin_settle();\n      open_ = true;\n      (void)ask_for_trim();", "      return;",
                     'AllocatorTrimTest.AFlushReturnsOnce*', 'allocator_trim_test'),
 'inline_uncounted': (H + 'async_teardown/composition.hpp', "      if (cost != 0) trimmer_.freed(cost);",
                      "      (void)cost;", 'AllocatorTrimTest.WhatAnInline*:AllocatorTrimTest.ADeferredDomainsSmall*',
                      'allocator_trim_test'),
 'sharer_unregistered': (H + 'async_teardown/composition.hpp',
                         "          if (self->trimmer_.enabled()) self->shared_->add_batch_end(self, &trim_at_batch_end);",
                         "          (void)&trim_at_batch_end;", 'AllocatorTrimTest.ASharedWorkersSharer*',
                         'allocator_trim_test'),
 'blocks_ignored': (H + 'deferred/domain.hpp', "      if (min_blocks_ != 0 && blocks >= min_blocks_) defer = true;",
                    "      (void)min_blocks_;", 'DeferredTest.AnObjectOfMinBlocks*', 'deferred_test'),
 'cached_below_ignored': (H + 'deferred/domain.hpp', "      if (bytes < cached_below_) defer = false;",
                          "      (void)cached_below_;", 'DeferredTest.BelowCachedBelow*', 'deferred_test'),
}
names = args.names or list(plants)
stale = [f'{name}: its text is in {plants[name][0]} {(root / plants[name][0]).read_text().count(plants[name][1])} '
         'times, not once' for name in names if (root / plants[name][0]).read_text().count(plants[name][1]) != 1]
if args.check or stale:
    for line in stale:
        print(line)
    print(f'planted_bugs --check: {len(names)} plants, {len(stale)} stale')
    sys.exit(1 if stale else 0)
for name in names:
    f, old, new, flt, *program = plants[name]
    program = program[0] if program else 'reaper_schedule_test'
    path = root / f
    text = path.read_text()
    assert text.count(old) == 1, (name, text.count(old))
    path.write_text(text.replace(old, new))
    try:
        where = ['--preset', 'default'] if build is None else [str(build)]
        b = subprocess.run(['cmake', '--build', *where, '-j1', '--target', program],
                           cwd=root, capture_output=True, text=True)
        if b.returncode != 0:
            print(f'== {name}: BUILD FAILED\n' + b.stdout[-2000:]); continue
        binary = (build or root / 'build/default') / 'tests' / program
        r = subprocess.run(['timeout', '600', str(binary), f'--gtest_filter={flt}'],
                           cwd=root, capture_output=True, text=True)
        out = r.stdout + r.stderr
        lines = [l for l in out.splitlines() if 'schedule' in l.lower() and any(
            w in l.lower() for w in ('fail', 'deadlock', 'livelock', 'replay'))]
        print(f'== {name} ({flt}): rc={r.returncode}')
        for l in (lines or out.splitlines()[-8:])[:6]: print('   ', l[:400])
        print('   ', [l for l in out.splitlines() if l.startswith('[  ')][-3:])
    finally:
        path.write_text(text)
    sys.stdout.flush()
