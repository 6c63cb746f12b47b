// teardown/reaper/driven.hpp — driven mode's public pieces: drive_limits, drive_result, drive_handle, post_to.
//
// A driven reaper (reaper_options::driven) has no thread of its own: the program runs the teardowns on its own
// thread with reaper::run(limits), told by work_fd() and on_work(handle) that work is waiting.
//   drive_handle   copyable; any thread, after the reaper's end too (then it does nothing and returns {});
//                  may block (it runs teardowns, and the reaper's destructor waits for a run a handle is in).
//                  Called from inside its own run it throws std::logic_error.
//   post_to        builds an on_work callable that posts a run to an executor.
// Memory ordering: the destructor nulls the shared gate under its lock, which every handle's run holds, so a
// run never starts on a destroyed reaper. The lock is a mutex of the reaper's Sync policy (sync.hpp), so a
// deterministic scheduler sees the gate as it sees the rest of the reaper.
//
// Design: docs/design.md, "Driven mode".
#pragma once

#include <chrono>
#include <cstddef>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <utility>

#include "teardown/detail/thread_start.hpp"

namespace teardown {

/// How much one driven run (reaper::run) may do: at most `items` teardowns, and no new one
/// once `time` has passed since the run began (the one in progress is never cut short).
struct drive_limits {
  std::size_t items = std::numeric_limits<std::size_t>::max();
  std::chrono::nanoseconds time = std::chrono::nanoseconds::max();
};

/// What a driven run did: `items` torn down; `more`: work is left (the run signalled it again).
struct drive_result {
  std::size_t items = 0;
  bool more = false;
};

namespace detail {
// Shared by a driven reaper and its drive_handles: the destructor nulls `reaper` under the
// gate's lock, so a handle that runs later finds nothing to run. Lockable (lock, unlock) over
// the mutex of the reaper's Sync policy: drive_gate_over<Mutex>.
struct drive_gate {
  void* reaper = nullptr;
  drive_result (*run)(void* reaper, drive_limits limits) = nullptr;
  virtual void lock() = 0;
  virtual void unlock() noexcept = 0;
  virtual ~drive_gate() = default;
};
template <class Mutex>
struct drive_gate_over final : drive_gate {
  void lock() override { mutex.lock(); }
  void unlock() noexcept override { mutex.unlock(); }
  Mutex mutex;
};
using gate_runs_here = calls_here<drive_gate>;  // the gates whose run this thread is in
}  // namespace detail

/// A driven reaper's run, callable later from anywhere (an executor's task): h(limits) runs
/// reaper::run(limits) if the reaper still exists and does nothing (returns {}) once it has
/// been destroyed. Copyable; thread-safe; may block (it runs teardowns, and a destructor waits
/// for a run that a handle is in). Calling it from inside its own run throws std::logic_error.
class drive_handle {
 public:
  drive_handle() = default;
  drive_result operator()(drive_limits limits = {}) const {
    if (!gate_) return {};
    if (detail::gate_runs_here::contains(gate_.get())) {
      throw std::logic_error("teardown::drive_handle: called from inside its own reaper's run");
    }
    const std::lock_guard lock(*gate_);
    if (gate_->reaper == nullptr) return {};
    const detail::gate_runs_here::scope here(gate_.get());
    return gate_->run(gate_->reaper, limits);
  }
  explicit drive_handle(std::shared_ptr<detail::drive_gate> gate) noexcept : gate_(std::move(gate)) {}

 private:
  std::shared_ptr<detail::drive_gate> gate_;
};

/// An on_work callable that posts a run to `executor` (anything with post(callable), which
/// must outlive the reaper's last signal): `executor.post([h, limits] { h(limits); })`.
template <class Executor>
auto post_to(Executor& executor, drive_limits limits = {}) {
  return [target = &executor, limits](drive_handle handle) {
    target->post([handle, limits] { (void)handle(limits); });
  };
}

}  // namespace teardown
