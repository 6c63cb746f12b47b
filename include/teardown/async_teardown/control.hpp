// teardown/async_teardown/control.hpp — async_teardown's control calls (internal: include
// teardown/async_teardown.hpp): flush, freeze, thaw, stop, nice, stalled, hurry, the worker's
// statistics, driven mode, and deferred.hpp's exit hooks.
//
// A base of async_teardown (CRTP): every call goes to the composition's worker(s), its own or a
// shared worker's (D::on_workers), so that the control surface (worker_control.hpp) is written
// once, apart from put and the counters. Who may call what: async_teardown.hpp's table.
//
// Memory ordering: the stopped flag is relaxed (a put that races stop may still queue; the
// stopped worker then tears it down on that caller). Everything else is the worker's
// (reaper.hpp, reaper_pool.hpp) and the shared worker's gate (shared_worker.hpp).
// Design: docs/design.md, "async_teardown: the composition".
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "teardown/allocator_trim.hpp"
#include "teardown/detail/clock.hpp"
#include "teardown/reaper.hpp"
#include "teardown/reaper_pool/workers.hpp"
#include "teardown/sync.hpp"

namespace teardown::detail {

/// D: the async_teardown (which befriends this class); Workers: its policy; CompiledOut: the
/// deferred path is compiled out (no worker).
template <class D, class Workers, bool CompiledOut>
class async_control {
 public:
  /// Driven mode (opts.reaper.driven, or a driven shared worker's; one_reaper only): reaper::run
  /// and reaper::work_fd, the shared worker's for every sharer. A
  /// compiled-out composition queues nothing: run does nothing and work_fd is -1.
  // Member templates, so that an explicit instantiation over a pool does not reach them.
  template <class W = Workers>
    requires std::same_as<W, one_reaper>
  drive_result run(drive_limits limits = {}) {
    if constexpr (CompiledOut) return {};
    else return self().on_workers([&](auto& workers) { return workers.run(limits); });  // a shared worker's too
  }
  template <class W = Workers>
    requires std::same_as<W, one_reaper>
  int work_fd() const noexcept {
    if constexpr (CompiledOut) return -1;
    else return self().on_workers([](const auto& workers) { return workers.work_fd(); });
  }

  /// Blocks until everything queued before the call (to any worker) is torn down. With a
  /// trimmer, the worker also trims what is left once it reaches the trimmer's settle_floor()
  /// before the flush returns; under mimalloc the calling thread then collects
  /// (allocator_trimmer::collect_after_flush).
  void flush() { (void)flush_until(std::chrono::steady_clock::time_point::max()); }
  template <class Rep, class Period>
  bool flush_for(std::chrono::duration<Rep, Period> timeout) {
    return flush_until(detail::deadline_after(timeout));
  }

  /// Parks the reaper (every worker of a pool) between items; nests. May block. Puts keep
  /// queuing behind a frozen reaper until its oldest item has waited past the stall threshold;
  /// from then on the watchdog (if on) tears new items down inline, as for a starved reaper: a
  /// frozen reaper makes no progress either.
  void freeze() {
    if constexpr (!CompiledOut) self().on_workers([](auto& workers) { workers.freeze(); });
  }
  /// Undoes one freeze(); throws std::logic_error, changing nothing, without one.
  void thaw() {
    if constexpr (CompiledOut) throw std::logic_error("teardown::async_teardown::thaw: not frozen");
    else self().on_workers([](auto& workers) { workers.thaw(); });
  }

  /// Tears down everything queued and joins the reaper (every worker); afterwards put tears
  /// down inline (decision::inline_stopped). Idempotent. May block, without limit.
  void stop() { (void)stop_until(std::chrono::steady_clock::time_point::max()); }

  /// stop() that waits at most `timeout`: true iff everything queued was torn down and the
  /// worker(s) joined in time. Either way put tears down inline from now on (inline_stopped).
  /// False leaves what is left queued and counted (stats().pending, worker_stats().pending)
  /// with the worker(s) still working on it; a later stop, stop_for, flush or the destructor
  /// waits for them again. Nothing is lost or torn down twice.
  template <class Rep, class Period>
  bool stop_for(std::chrono::duration<Rep, Period> timeout) {
    return stop_until(detail::deadline_after(timeout));
  }

  /// True when called from this composition's own callback: Traits::destroy on its worker, or
  /// inside its drain on this thread. Wait-free.
  bool in_own_callback() const noexcept {
    if constexpr (CompiledOut) return false;
    else return self().on_workers([](const auto& workers) { return workers.in_own_callback(); });
  }

  /// True when the reaper's oldest queued item (in a pool: any worker's) has waited past its
  /// stall threshold.
  bool stalled() const noexcept {
    if constexpr (CompiledOut) return false;
    else return self().on_workers([](const auto& workers) { return workers.stalled(); });
  }
  /// Wakes the worker(s) now if they sleep, whatever the wake policy (reaper::hurry): for a
  /// caller that knows what is queued must not wait for a polling worker's next look. True if
  /// a sleeping worker was woken. Lock-free; any thread.
  bool hurry() noexcept {
    if constexpr (CompiledOut) return false;
    else return self().on_workers([](auto& workers) { return workers.hurry() != 0; });
  }

  /// The worker(s)' nice value in force (reaper::nice); opts.reaper.nice until set_nice.
  int nice() const {
    if constexpr (CompiledOut) return 0;
    else return self().on_workers([](const auto& workers) { return workers.nice(); });
  }
  /// reaper::set_nice on the worker(s): true if applied (the system may refuse a lower value:
  /// then nothing changes).
  /// Throws std::invalid_argument, changing nothing, outside [-20, 19]. Takes each worker's
  /// control mutex briefly.
  bool set_nice(int value) {
    if (!detail::valid_nice(value)) {
      throw std::invalid_argument("teardown::async_teardown::set_nice: nice must be in [-20, 19], got " +
                                  std::to_string(value));
    }
    if constexpr (CompiledOut) return true;  // no worker
    else return self().on_workers([&](auto& workers) { return workers.set_nice(value); });
  }

  /// The worker's own statistics (worker CPU, wake-ups, batches...); a pool's, summed over its
  /// workers (reaper_pool::stats).
  /// On a shared worker: the shared worker's, every sharer's items together.
  reaper_stats worker_stats() const noexcept {
    if constexpr (CompiledOut) return {};
    else return self().on_workers([](const auto& workers) { return workers.stats(); });
  }

  /// How many worker threads tear down queued items: 1 for one_reaper, the pool's size for
  /// reaper_pool_workers, 0 when the deferred path is compiled out. Fixed at construction.
  std::size_t worker_count() const noexcept {
    if constexpr (CompiledOut) {
      return 0;
    } else {
      return self().on_workers([](const auto& workers) -> std::size_t {
        if constexpr (requires { workers.worker_count(); }) return workers.worker_count();
        else return 1;
      });
    }
  }

 protected:
  // deferred.hpp's exit path for a domain on the default worker: shut down, then stop the shared
  // worker itself (for every sharer), the whole within `limit` (nanoseconds::max(): none).
  // A compiled-out composition has no worker to stop (deferred_domain is never compiled out).
  bool shut_down_with_worker(std::chrono::nanoseconds limit)
    requires(!CompiledOut)
  {
    const auto deadline = detail::deadline_after(limit);
    self().stopped_.store(true, std::memory_order_relaxed);
    if (!close_gate_until(deadline)) return false;
    return on_workers_until(
        deadline, [](auto& workers) { workers.stop(); },
        [](auto& workers, auto left) { return workers.stop_for(left); });
  }

  // deferred.hpp's exit path: exit() called from destroy on this composition's own worker. Marks
  // it shut down and tears down, on this thread, the rest of the worker's batch and everything
  // queued; false, changing nothing, anywhere else. For one reaper only (one_reaper, or a
  // policy derived from it over another Sync) and never compiled out, as deferred_domain's is.
  bool shut_down_on_own_worker() noexcept
    requires(!CompiledOut && std::is_base_of_v<one_reaper, Workers>)
  {
    // A shared worker is stopped for every sharer: this runs only at exit.
    if (!self().on_workers([](auto& workers) { return detail::stop_on_own_worker(workers); })) return false;
    self().stopped_.store(true, std::memory_order_relaxed);
    if (self().shared()) (void)self().gate_.close(/*wait=*/false);  // the worker is stopped: inline
    return true;
  }

 private:
  // A flush's settle (allocator_trimmer::begin_settle): while the flush waits, a batch end on the
  // worker trims what is left; asked for at once when it is already due, so that a flush that
  // finds nothing queued still trims what earlier batches left. A completed flush then collects
  // on this thread where the allocator needs it.
  class flush_settle {
   public:
    explicit flush_settle(D& owner) noexcept : owner_(owner), trimmer_(owner.trimmer_) {
      if (!trimmer_.enabled()) return;
      trimmer_.begin_settle();
      open_ = true;
      (void)ask_for_trim();
    }
    flush_settle(const flush_settle&) = delete;
    flush_settle& operator=(const flush_settle&) = delete;
    // After the flush: what was freed after the worker's last batch end (a helping waiter's or
    // a drain's frees, whose own trim request the flush's ticket may have overtaken) is still
    // due. True if so: a second flush then returns after the batch end this asked for (the
    // request comes before that flush's ticket, so the pass completing it has served it).
    bool left_untrimmed() noexcept { return open_ && ask_for_trim(); }
    void completed() noexcept { completed_ = true; }
    ~flush_settle() {
      if (!open_) return;
      trimmer_.end_settle();
      if (completed_) (void)trimmer_.collect_after_flush();
    }

   private:
    bool ask_for_trim() noexcept {
      if (!trimmer_.due()) return false;
      owner_.on_workers([](auto& workers) { workers.request_after_batch(); });
      return true;
    }

    D& owner_;
    typename D::trimmer_type& trimmer_;
    bool open_ = false;
    bool completed_ = false;
  };

  // flush() (deadline max: none) and flush_for: one path, so that both settle and collect alike.
  bool flush_until(std::chrono::steady_clock::time_point deadline) {
    if constexpr (CompiledOut) {
      return true;
    } else {
      const auto flush_workers = [&] {
        return on_workers_until(
            deadline, [](auto& workers) { workers.flush(); },
            [](auto& workers, auto left) { return workers.flush_for(left); });
      };
      flush_settle settle(self());
      if (!flush_workers()) return false;
      if (settle.left_untrimmed() && !flush_workers()) return false;
      settle.completed();
      return true;
    }
  }

  // stop() (deadline max: none) and stop_for: one path.
  bool stop_until(std::chrono::steady_clock::time_point deadline) {
    if constexpr (CompiledOut) {
      return true;
    } else {
      self().stopped_.store(true, std::memory_order_relaxed);
      if (!self().shared()) {
        return on_workers_until(
            deadline, [](auto& workers) { workers.stop(); },
            [](auto& workers, auto left) { return workers.stop_for(left); });
      }
      // Never stops the shared worker: no put of ours enqueues any more, then ours are done.
      if (!close_gate_until(deadline)) return false;
      return on_workers_until(
          deadline, [](auto& workers) { workers.flush(); },
          [](auto& workers, auto left) { return workers.flush_for(left); });
    }
  }

  // untimed(workers) without a deadline; otherwise timed(workers, what is left of it), its answer.
  template <class Untimed, class Timed>
  bool on_workers_until(std::chrono::steady_clock::time_point deadline, Untimed untimed, Timed timed) {
    return self().on_workers([&](auto& workers) {
      if (deadline == std::chrono::steady_clock::time_point::max()) {
        untimed(workers);
        return true;
      }
      return static_cast<bool>(timed(workers, left_until(deadline)));
    });
  }

  static std::chrono::steady_clock::duration left_until(std::chrono::steady_clock::time_point deadline) {
    const auto now = std::chrono::steady_clock::now();
    return deadline > now ? deadline - now : std::chrono::steady_clock::duration::zero();
  }

  // Closes the gate to new puts (a shared worker's sharers; unused otherwise) and waits, until
  // the deadline, for the puts it had admitted. Not in a fork child: their threads are not there.
  bool close_gate_until(std::chrono::steady_clock::time_point deadline) {
    if (deadline == std::chrono::steady_clock::time_point::max()) {
      (void)self().gate_.close(/*wait=*/!self().forked());
      return true;
    }
    const auto left_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left_until(deadline)).count();
    return self().gate_.close(/*wait=*/!self().forked(), std_sync::now_ns() + static_cast<std::uint64_t>(left_ns));
  }

  D& self() noexcept { return static_cast<D&>(*this); }
  const D& self() const noexcept { return static_cast<const D&>(*this); }
};

}  // namespace teardown::detail
