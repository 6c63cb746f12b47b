// teardown/teardown.hpp — the umbrella header: includes every public header of the library.
// Including a single component header (teardown/llist.hpp, ...) is cheaper and equally valid.
#pragma once

#include "teardown/allocator_trim.hpp"
#include "teardown/async_teardown.hpp"
#include "teardown/atomics.hpp"
#include "teardown/budget.hpp"
#include "teardown/counter.hpp"
#include "teardown/deferred.hpp"
#include "teardown/llist.hpp"
#include "teardown/memory_limit.hpp"
#include "teardown/pressure_policy.hpp"
#include "teardown/reaper.hpp"
#include "teardown/reaper_pool.hpp"
#include "teardown/shared_worker.hpp"
#include "teardown/sharded_llist.hpp"
#include "teardown/static_key.hpp"
#include "teardown/trace.hpp"
