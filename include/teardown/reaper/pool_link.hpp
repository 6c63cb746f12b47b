// teardown/reaper/pool_link.hpp — what a reaper_pool owns for each of its workers when it steals.
//
// A reaper on its own carries none of this: its link is null. A stealing pool makes one link per worker before
// any worker starts, hands the worker a pointer to it, and keeps it until the workers are gone.
//   pool, index, steal, watch, holding   set before the worker starts, never changed; the hooks run on the
//                                        worker (docs/design.md, "In a pool").
//   item_started_ns, idle                written by the worker only; read by its siblings (the pool's hooks).
//   watching                             written by the worker (in the pool's watch hook); read by siblings.
// Memory ordering: these words carry no data. seq_cst only where "No lost watch" says (the batch's first
// item_started_ns on both sides, watching = false and the holder's load of it), relaxed elsewhere: idle and
// watching = true are read after that seq_cst pair, which orders them; items themselves move by the exchanges
// on the worker's held_ list.
//
// Design: docs/design.md, "In a pool".
#pragma once

#include <cstddef>
#include <cstdint>

#include "teardown/llist.hpp"

namespace teardown::detail {

template <class T, llist_node T::*Hook, class Sync>
struct alignas(64) pool_worker_link {  // a line of its own: the worker writes it, siblings read it
  template <class W>
  using atomic = typename Sync::template atomic<W>;

  void* pool = nullptr;
  std::size_t index = 0;  // this worker's index in the pool
  // Called when the worker's own queue is empty: a batch taken from a sibling's queue or from the rest of a
  // sibling's batch (in the thief's run order), its size in `taken`.
  llist_batch<T, Hook> (*steal)(void* pool, std::size_t thief, std::size_t& taken) noexcept = nullptr;
  // Called before the worker sleeps: how long it may sleep before it looks for a held batch to take
  // (reaper's no_watch: until kicked; 0: look now).
  std::uint64_t (*watch)(void* pool, std::size_t watcher) noexcept = nullptr;
  // Called once per batch, when the worker first puts the rest of it in held_: wakes the siblings that sleep
  // without watching.
  void (*holding)(void* pool, std::size_t holder) noexcept = nullptr;

  atomic<std::uint64_t> item_started_ns{0};  // when the item now run with a held rest started; 0: nothing held
  atomic<bool> watching{false};              // asleep with a time limit (see the pool's watch)
  atomic<bool> idle{false};                  // the worker's last pass found nothing to run (reaper::set_idle)
};

}  // namespace teardown::detail
