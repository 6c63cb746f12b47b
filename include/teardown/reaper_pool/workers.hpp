// teardown/reaper_pool/workers.hpp — the Workers policies: who tears down what a composition
// (async_teardown, or a shared_worker for many) queues.
//
//   one_reaper (the default)  one reaper thread, as the kernel's single mm_reaper.
//   reaper_pool_workers       a reaper_pool (reaper_pool.hpp; the question whether one reaper or
//                             several should serve the queue): several workers over sharded
//                             queues, with work stealing. opts.pool says how many and how they
//                             steal; opts.reaper is every worker's options, the names getting
//                             "-<i>", so the same options serve either policy (opts.pool.worker
//                             must stay default: async_teardown refuses it otherwise).
//
// A Workers policy names the worker type, which offers reaper's enqueue, enqueue_chain, flush,
// flush_for, freeze, thaw, stop, reap_on_caller, stalled and stats, and builds the second
// argument of its constructor (after the teardown function) from a composition's options (an
// async_teardown_options rvalue: its reaper and pool members).
//
// On the workers' floor, below both of its users: shared_worker.hpp and async_teardown/ include
// it (async_teardown/workers.hpp, the name it had before, forwards here).
//
// Stateless: no ordering of its own.
// Design: docs/design.md, "async_teardown: the composition".
#pragma once

#include <type_traits>
#include <utility>

#include "teardown/llist.hpp"
#include "teardown/reaper.hpp"
#include "teardown/reaper_pool.hpp"

namespace teardown {

/// async_teardown's worker: one reaper thread (the default; the kernel's single mm_reaper).
struct one_reaper {
  template <class T, llist_node T::*Hook, class Fn>
  using type = reaper<T, Hook, Fn>;
  using options = reaper_options;
  /// opts.reaper (opts: an async_teardown_options rvalue); opts.pool is unused.
  template <class Options>
    requires(!std::is_reference_v<Options>)
  static reaper_options worker_options(Options&& opts) {
    return std::move(opts.reaper);
  }
};

/// ... or a pool of them: a reaper_pool over sharded queues.
struct reaper_pool_workers {
  template <class T, llist_node T::*Hook, class Fn>
  using type = reaper_pool<T, Hook, Fn>;
  using options = reaper_pool_options;
  /// opts.pool, with opts.reaper as every worker's options (opts.pool.worker, checked to be
  /// default, is replaced); opts: an async_teardown_options rvalue.
  template <class Options>
    requires(!std::is_reference_v<Options>)
  static reaper_pool_options worker_options(Options&& opts) {
    reaper_pool_options pool = std::move(opts.pool);
    pool.worker = std::move(opts.reaper);
    return pool;
  }
};

}  // namespace teardown
