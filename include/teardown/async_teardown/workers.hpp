// teardown/async_teardown/workers.hpp — the Workers policies (one_reaper, reaper_pool_workers),
// under the name they had before they moved below their users: they live in
// teardown/reaper_pool/workers.hpp, which shared_worker.hpp and async_teardown/ include. This
// header forwards there, so that code including it keeps building.
//
// Design: docs/design.md, "async_teardown: the composition".
#pragma once

#include "teardown/async_teardown/options.hpp"  // what worker_options takes
#include "teardown/reaper_pool/workers.hpp"
