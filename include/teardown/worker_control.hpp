// teardown/worker_control.hpp — the control surface every worker-owning type shares.
//
// One vocabulary: the same verb for the same act on reaper, reaper_pool, async_teardown and
// deferred_domain (and the other worker-owning types as they adopt it). worker_control<C> names it:
//
//   flush() / flush_for(d)   wait until everything handed in before the call is torn down
//                            (flush_for: true if that happened within d)
//   freeze() / thaw()        park the worker(s) between items; nests; thaw without a freeze
//                            throws std::logic_error, changing nothing
//   stop() / stop_for(d)     tear down everything queued and join the worker(s); afterwards
//                            everything is torn down inline (stop_for: true if done within d)
//   nice() / set_nice(v)     the worker(s)' nice value; set_nice: true if applied, and
//                            std::invalid_argument, changing nothing, outside [-20, 19]
//   stalled()                the oldest queued item waited past the stall threshold
//   stats()                  the object's own statistics (a composition's worker's: worker_stats())
//
// Who may call what, progress and ordering: each type's own header says (the verbs block, the
// getters are wait-free). The concept checks only that the names exist with these shapes.
//
// Two internal mixins keep the compositions' forwarding in one place:
// detail::forwarded_control<D> gives D the control calls of D::control_target() (deferred_domain
// forwards to its async_teardown), and detail::deprecated_control_names<D> gives D the old names
// for one release (shutdown, shutdown_for, worker_nice, set_worker_nice, reaper_statistics).
// Design: docs/design.md, "One vocabulary: the control surface".
#pragma once

#include <chrono>
#include <concepts>

namespace teardown {

/// The shared control surface; see the header comment.
template <class C>
concept worker_control = requires(C& control, const C& view, std::chrono::milliseconds timeout, int value) {
  control.flush();
  { control.flush_for(timeout) } -> std::convertible_to<bool>;
  control.freeze();
  control.thaw();
  control.stop();
  { control.stop_for(timeout) } -> std::convertible_to<bool>;
  { view.nice() } -> std::convertible_to<int>;
  { control.set_nice(value) } -> std::convertible_to<bool>;
  { view.stalled() } -> std::convertible_to<bool>;
  view.stats();
};

namespace detail {

/// D's control calls, forwarded to D::control_target() (which D lets this class reach).
template <class D>
class forwarded_control {
 public:
  void flush() { target().flush(); }
  template <class Rep, class Period>
  bool flush_for(std::chrono::duration<Rep, Period> timeout) {
    return target().flush_for(timeout);
  }
  void freeze() { target().freeze(); }
  void thaw() { target().thaw(); }
  void stop() { target().stop(); }
  template <class Rep, class Period>
  bool stop_for(std::chrono::duration<Rep, Period> timeout) {
    return target().stop_for(timeout);
  }
  int nice() const { return target().nice(); }
  bool set_nice(int value) { return target().set_nice(value); }
  bool stalled() const noexcept { return target().stalled(); }
  /// The statistics of the worker inside (reaper_stats).
  auto worker_stats() const noexcept { return target().worker_stats(); }

 private:
  decltype(auto) target() { return static_cast<D&>(*this).control_target(); }
  decltype(auto) target() const { return static_cast<const D&>(*this).control_target(); }
};

/// The old names of D's control calls, one release.
template <class D>
class deprecated_control_names {
 public:
  [[deprecated("use stop()")]] void shutdown() { self().stop(); }
  template <class Rep, class Period>
  [[deprecated("use stop_for()")]] bool shutdown_for(std::chrono::duration<Rep, Period> timeout) {
    return self().stop_for(timeout);
  }
  [[deprecated("use nice()")]] int worker_nice() const { return self().nice(); }
  [[deprecated("use set_nice()")]] bool set_worker_nice(int value) { return self().set_nice(value); }
  [[deprecated("use worker_stats()")]] auto reaper_statistics() const noexcept { return self().worker_stats(); }

 private:
  D& self() noexcept { return static_cast<D&>(*this); }
  const D& self() const noexcept { return static_cast<const D&>(*this); }
};

}  // namespace detail
}  // namespace teardown
