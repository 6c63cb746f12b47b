// teardown/deferred.hpp — deferred_delete: destroy big objects and unmap big mappings off the
// caller's thread.
//
// Destroying a huge object (a cache, an arena, a 1 GiB std::vector) or munmap()ing a large
// mapping takes milliseconds: the kernel frees every page, and a destructor may walk millions
// of nodes. On a latency path that is a stall. The kernel series moves an exiting process's
// address-space teardown to its mm_reaper thread; this header does the same for C++ objects:
//
//     teardown::deferred_ptr<cache> c = teardown::make_deferred<cache>(args);   // a unique_ptr
//     c.reset();                          // big: destroyed on the reaper; small: right here
//     std::shared_ptr<cache> s(new cache, teardown::deferred_deleter<cache>{});
//     teardown::async_munmap(addr, length);     // big mappings are unmapped on the reaper
//     teardown::deferred::flush();              // everything handed over so far is gone
//
//     teardown::deferred_domain mine({.threshold = 1 << 20});  // its own thread, deferred's
//     teardown::deferred_ptr<cache> p(new cache, teardown::deferred_deleter<cache>{mine});
//     teardown::deferred_domain light({.worker = teardown::deferred::default_worker()});
//                                               // ... or the default domain's thread: no new one
//
// A deleter measures the object (its cost, in bytes), deletes it inline when that is below the
// threshold, and otherwise hands it to its domain's async_teardown in a small node, so one queue
// takes objects of every type. The budget (max_pending) bounds the bytes waiting to be freed;
// past it, deletion falls back to inline: a reaper that falls behind costs latency, never an
// out-of-memory kill. So does a node that cannot be allocated.
//
// The pieces, one concept each:
//   deferred/cost.hpp            what an object costs (deferred_cost, teardown_cost)
//   deferred/node.hpp            the node, the composition's traits, munmap's checks
//   deferred/domain.hpp          deferred_domain, deferred_domain_options, deferred_stats; the
//                                knobs and the who-may-call-what table
//   deferred/default_domain.hpp  deferred::default_domain and its shutdown at exit
//   deferred/deleters.hpp        deferred_deleter, deferred_ptr, make_deferred, deferred_delete,
//                                async_munmap
// A deferred_domain offers the control surface of worker_control.hpp (flush, freeze, thaw, stop,
// nice, stalled, stats ...), forwarded to its async_teardown.
//
// fork(): the reaper handles it (reaper.hpp). In the child, deletions run inline, and what the
// parent had queued is destroyed in the child by its next deletion, flush or exit: once in each
// process, each on its own copy. The same holds for queued munmaps.
//
// Memory ordering: nothing here adds any. The node and the object reach the reaper through the
// llist (release add, acquire del_all), so a destructor on the reaper sees everything the
// caller wrote to the object before deleting it. Counters and knobs are relaxed.
// Design: docs/design.md, "deferred.hpp: deferred_delete".
#pragma once

#include "teardown/deferred/cost.hpp"
#include "teardown/deferred/default_domain.hpp"
#include "teardown/deferred/deleters.hpp"
#include "teardown/deferred/domain.hpp"
#include "teardown/deferred/node.hpp"
