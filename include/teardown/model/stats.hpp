// teardown/model/stats.hpp — what the model kernel counts (part of model/mm.hpp): vmstat, the
// mm_reaper patch series' three counters and the model's, and mm_system_stats, every part's
// counters in one aggregate (basic_mm_system::stats()).
//
// Who may call what: these are plain values; basic_mm_system::vmstat() and stats() fill them,
// wait-free, from any thread.
//
// Memory ordering: each part is a snapshot of its own with its own guarantee (a subset is read
// before its superset: reaped <= queued, released <= batches); the parts of one mm_system_stats
// are not taken at one instant.
// Design: docs/design.md, "model/mm.hpp: the kernel's composition, in user space".
#pragma once

#include <cstdint>

#include "teardown/model/oom_reaper.hpp"
#include "teardown/model/swap.hpp"
#include "teardown/reaper.hpp"

namespace teardown::model {

/// A vmstat snapshot: the series' three counters and what the model adds.
struct vmstat {
  std::uint64_t queued = 0;         // async_mm_teardown_queued
  std::uint64_t sync = 0;           // async_mm_teardown_sync: mmput_exit tore down inline
  std::uint64_t rejected = 0;       // async_mm_teardown_rejected: subset of sync
  std::uint64_t stalled = 0;        // subset of sync: the reaper was stalled
  std::uint64_t uncontended = 0;    // subset of sync: fewer than min_concurrent_exits in flight
  std::uint64_t reaped = 0;         // queued mms torn down (by the reaper or by drain)
  std::uint64_t drained = 0;        // subset of reaped: torn down by drain()
  std::uint64_t pending_pages = 0;  // charged and not yet released
};

/// Everything basic_mm_system counts, in one snapshot (stats()). Each part is a snapshot of its
/// own with its own guarantees (subsets before supersets); the parts are not taken at one instant.
struct mm_system_stats {
  teardown::model::vmstat vm;      // the exit path's counters, as vmstat()
  reaper_stats reaper;             // the mm_reaper's (a pool's: its workers' sums)
  oom_reap_stats oom_reap;         // the oom_reaper and the victims' chunked exits
  reaper_stats oom_reaper;         // the oom_reaper thread's own (CPU time, wake-ups...)
  swap_release_stats swap;         // the swap release
  std::uint64_t pending_high_water = 0;  // the budget's high-water mark of pending pages
  std::uint64_t oom_kills = 0;
  std::uint64_t teardowns = 0;     // teardowns of any kind (exit path, inline mmput, reaper, drain)
};

}  // namespace teardown::model
