// teardown/model/mm.hpp — a model of the kernel's mm_struct and of the exit path that defers its
// teardown, composed from this library exactly as the mm_reaper patch series composes the
// kernel's parts. The umbrella: include it for every name of teardown::model.
//
//     teardown::model::mm_system kernel({.async_mm_teardown = true});
//     auto task = kernel.spawn(/*rss_pages=*/200'000);          // a process with its own mm
//     auto clone = kernel.clone_vm(*task);                     // CLONE_VM: a second holder
//     clone->exit();                                           // not the last reference
//     task->exit();                                            // the last: mmput_exit decides
//     kernel.flush();
//     teardown::model::vmstat v = kernel.vmstat();              // queued, sync, rejected, ...
//     teardown::model::mm_system_stats s = kernel.stats();      // every part's counters
//
// What is modelled, one concept per header (the kernel's names throughout):
//   model/aio.hpp         aio_context: exit_aio() is idempotent and blocks until in-flight AIO
//                         completes.
//   model/mm_struct.hpp   mm_struct: mm_users, mm_count, the MMF_* flags, an RSS in pages that
//                         reclaim() may shrink while the mm is queued, the mm_reaper's hook and
//                         memoised charge, optionally real memory (an anonymous mapping of the
//                         RSS, touched at creation, unmapped by the teardown), the oom_reaper's
//                         hook and the chunk walk; the task list's link.
//   model/swap.hpp        swap_space (a use count per slot) and swap_release, the worker an
//                         exiting task hands its swap entries to in page-sized batches (the swap
//                         batch release series).
//   model/oom_reaper.hpp  oom_reaper: the OOM reaper thread and both sides of an OOM victim's
//                         chunked teardown; vm.oom_reap_direction (the OOM reaper series).
//   model/sysctl.hpp      mm_system_options and the knobs: names, checks, sysctl-style text.
//   model/stats.hpp       vmstat and mm_system_stats: what the kernel counts.
//   model/system.hpp      basic_mm_system, the kernel: mm_alloc, mmget, mmput, mmput_exit,
//                         mmgrab/mmdrop, tasks, mark_oom_victim, oom_kill, reclaim, swap_out,
//                         flush, drain, freeze/thaw, stop/stop_for, nice/set_nice, vmstat,
//                         stats; mm_system (one mm_reaper) and pooled_mm_system (a pool).
//
// Who may call what, and the memory ordering: each header says so for its part; system.hpp has
// the kernel's table and the mmput_exit decision. The arguments (the OOM ordering, the chunk
// walk, thaw on urgency) are in the design document.
// Design: docs/design.md, "model/mm.hpp: the kernel's composition, in user space".
#pragma once

#include "teardown/model/aio.hpp"
#include "teardown/model/mm_struct.hpp"
#include "teardown/model/oom_reaper.hpp"
#include "teardown/model/stats.hpp"
#include "teardown/model/swap.hpp"
#include "teardown/model/sysctl.hpp"
#include "teardown/model/system.hpp"
