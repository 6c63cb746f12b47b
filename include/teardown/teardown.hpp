// teardown/teardown.hpp — the umbrella header: every public header of the library but the model
// (teardown/model/mm.hpp) and the process side (teardown/process.hpp, teardown/process_reaper.hpp),
// which a program includes by name. Including a single component header (teardown/llist.hpp, ...)
// is cheaper and equally valid.
// Design: docs/design.md, "Layers: which file holds what, and who includes whom".
#pragma once

#include "teardown/allocator_trim.hpp"
#include "teardown/async_teardown.hpp"
#include "teardown/atomics.hpp"
#include "teardown/budget.hpp"
#include "teardown/counter.hpp"
#include "teardown/deferred.hpp"
#include "teardown/event_count.hpp"
#include "teardown/llist.hpp"
#include "teardown/memory_limit.hpp"
#include "teardown/pressure_policy.hpp"
#include "teardown/reaper.hpp"
#include "teardown/reference_count.hpp"
#include "teardown/reaper_pool.hpp"
#include "teardown/shared_worker.hpp"
#include "teardown/sharded_llist.hpp"
#include "teardown/static_key.hpp"
#include "teardown/trace.hpp"
#include "teardown/worker_control.hpp"
