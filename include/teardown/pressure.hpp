// teardown/pressure.hpp — memory pressure as Linux reports it: a PSI monitor that tells its
// subscribers when the system (or the process's cgroup) is short of memory, and when it is not.
//
//     teardown::pressure_monitor monitor;                          // PSI triggers, or the sampler
//     teardown::pressure_policy policy(monitor, domain);           // pressure_policy.hpp: thaw,
//                                                                  // nice 0, drain, cap 0
//
// PSI (/proc/pressure/memory, a cgroup v2's memory.pressure) wakes a poll() on a trigger
// ("some 150000 2000000": 150 ms of stall within 2 s), as Android's lmkd and systemd-oomd use
// it. The monitor turns those wake-ups into pressure and relief for its pressure_listeners.
//
// Where the events come from (pressure_source), first that works under `automatic`:
//   psi_cgroup   a trigger on the memory.pressure of the process's own (non-root) cgroup v2;
//   psi_system   a trigger on /proc/pressure/memory (under automatic, description() says why the
//                cgroup's was not used: e.g. EACCES, for a user who does not own the cgroup);
//   sampled      no trigger could be registered: every sample_interval, each memory cgroup above
//                the process (usage against limit) and /proc/meminfo; a sample at or over
//                sample_percent of a limit, or MemAvailable under (100 - sample_percent)% of
//                MemTotal, is an event. description() says why the triggers were not used;
//   injected     an fd the caller owns (event_fd; relief_fd optional): each read of data is an
//                event. Once it hangs up or errs, the monitor stops watching it (lost) and never
//                samples. Tests drive the real poll loop with it.
// A trigger's rules: threshold in (0, window], window in [500 ms, 10 s], unprivileged windows a
// multiple of 2 s (an EINVAL window is retried once rounded up: window() says what is in force);
// the file must be on procfs or cgroup2 (anything else is refused as a PSI source).
// Relief: relief_windows windows (sampled: intervals) without an event; saturating, never wrapping.
//
// The monitor thread: one, named (opts.name), nice 0, every signal blocked (worker_thread.hpp),
// poll() on the trigger fd (or event_fd) and on an eventfd that stop() writes. Callbacks run
// there, one at a time, in subscription order.
//
// Who may call what (the monitor must outlive every subscription and every call)
//   constructor          any thread; opens the files, registers the trigger, starts the thread.
//                        std::invalid_argument naming the field for bad options (a null path
//                        among them; nothing started), std::system_error if the thread or eventfd
//                        cannot be made, or a PSI source named explicitly cannot be had
//                        (automatic falls back instead).
//   subscribe            any thread but the monitor's; blocks while a callback runs. Refuses a
//                        listener already subscribed (std::invalid_argument).
//   unsubscribe          any thread but the monitor's (from a callback: std::logic_error); blocks
//                        while a callback runs. When it returns, no callback of that listener
//                        runs or will run.
//   stop, stop_for,      any thread but the monitor's; stop the thread and close the fds
//   destructor           (stop_for: gives up after its timeout, the monitor still stopping).
//                        Idempotent. Subscribers get no relief from it.
//   source, window, description, stats, under_pressure   any thread; stats wait-free.
// A fork child has no monitor thread: its subscriptions get no events, and stop and the
// destructor there only close the fds.
//
// Memory ordering: the subscriber list and every callback are under one mutex: whatever a
// subscriber did before subscribe is visible to its callbacks, and whatever a callback did is
// visible after unsubscribe returns. The counters are relaxed.
// Design: docs/design.md, "Memory pressure: pressure.hpp and pressure_policy.hpp".
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "teardown/detail/event_fd.hpp"
#include "teardown/memory_limit.hpp"
#include "teardown/pressure/files.hpp"
#include "teardown/trace.hpp"
#include "teardown/worker_thread.hpp"

namespace teardown {

enum class pressure_source { automatic, psi_cgroup, psi_system, sampled, injected };
/// PSI's two lines: "some" (at least one task stalled on memory), "full" (all non-idle tasks).
enum class psi_line { some, full };

constexpr const char* to_string(pressure_source s) noexcept {
  switch (s) {
    case pressure_source::automatic: return "automatic";
    case pressure_source::psi_cgroup: return "psi_cgroup";
    case pressure_source::psi_system: return "psi_system";
    case pressure_source::sampled: return "sampled";
    case pressure_source::injected: return "injected";
  }
  return "unknown";
}

/// Checked by the constructor (std::invalid_argument naming the field, nothing started).
struct pressure_monitor_options {
  pressure_source source = pressure_source::automatic;
  psi_line line = psi_line::some;
  std::chrono::microseconds stall = std::chrono::milliseconds(150);  // per window; (0, window]
  std::chrono::microseconds window = std::chrono::seconds(2);        // [500 ms, 10 s]; injected:
                                                                     // any positive value
  std::uint32_t relief_windows = 2;   // relief after this many quiet windows; at least 1
  std::chrono::milliseconds sample_interval = std::chrono::milliseconds(500);  // sampled: > 0
  std::uint32_t sample_percent = 90;  // sampled: [1, 99] (see the header comment)
  int event_fd = -1;                  // injected: the fd polled for events (required there)
  int relief_fd = -1;                 // injected, optional: readable means relief now (the
                                      // quiet windows still bring it too)
  std::string name = "pressure";      // the thread's name (Linux keeps 15 chars); no NUL
  memory_limit_sources files{};       // where the cgroup files are found (tests)
  const char* proc_pressure = "/proc/pressure/memory";  // none of the paths may be null
  const char* meminfo = "/proc/meminfo";
};

struct pressure_monitor_stats {
  std::uint64_t events = 0;     // trigger wake-ups (or pressured samples, or injected events)
  std::uint64_t episodes = 0;   // pressure began (the first event after relief, or ever)
  std::uint64_t reliefs = 0;    // relief_windows passed without an event
  std::uint64_t samples = 0;    // sampled: samples taken
  std::uint64_t lost = 0;       // the trigger fd reported POLLERR (its cgroup went away): the
                                // monitor goes on sampling; or the injected fd hung up or erred:
                                // it goes on without it, and does not sample
  bool under_pressure = false;
  bool nice_refused = false;    // the thread could not set nice 0
};

/// What a subscriber implements. Both run on the monitor thread, one callback at a time, under
/// the monitor's mutex: they must not subscribe, unsubscribe or stop (refused: they would wait
/// for themselves); they may block (a drain), which delays the next event.
class pressure_listener {
 public:
  /// An event: `first` for the one that begins an episode; `events` counts the episode's.
  virtual void on_pressure(bool first, std::uint64_t events) = 0;
  /// relief_windows windows passed without an event.
  virtual void on_relief() = 0;

 protected:
  pressure_listener() = default;
  pressure_listener(const pressure_listener&) = default;
  pressure_listener& operator=(const pressure_listener&) = default;
  ~pressure_listener() = default;
};

class pressure_monitor {
 public:
  static constexpr std::chrono::microseconds min_window = std::chrono::milliseconds(500);
  static constexpr std::chrono::microseconds max_window = std::chrono::seconds(10);
  static constexpr std::chrono::microseconds unprivileged_step = std::chrono::seconds(2);

  explicit pressure_monitor(pressure_monitor_options opts = {}) : opts_(validated(std::move(opts))) {
    window_ = opts_.window;
    open_source();
    try {
      stop_.open("teardown::pressure_monitor: eventfd");
    } catch (...) {
      close_source();
      throw;
    }
    if (const int error = detail::start_thread_with_signals_blocked(&thread_, &pressure_monitor::entry, this);
        error != 0) {
      stop_.close();
      close_source();
      throw std::system_error(error, std::generic_category(), "teardown::pressure_monitor: cannot start the thread");
    }
  }

  pressure_monitor(const pressure_monitor&) = delete;
  pressure_monitor& operator=(const pressure_monitor&) = delete;

  ~pressure_monitor() { stop(); }

  /// Stops the thread and closes what the monitor opened (event_fd is the caller's). Idempotent.
  void stop() {
    refuse_on_monitor("stop");
    const std::lock_guard lock(stop_mutex_);
    if (joined_) return;
    // In a fork child the thread does not exist: joining it would wait for ever.
    if (creator_.here()) {
      (void)stop_.notify();
      pthread_join(thread_, nullptr);
    }
    joined_ = true;
    stop_.close();
    close_source();
  }

  /// stop() that waits at most `timeout` for the thread (only a callback that blocks holds it
  /// up): true iff the thread was joined and the fds closed in time. False leaves the monitor
  /// stopping: the thread ends after its callback, and a later stop, stop_for or the
  /// destructor joins it.
  template <class Rep, class Period>
  bool stop_for(std::chrono::duration<Rep, Period> timeout) {
    refuse_on_monitor("stop_for");
    const auto deadline = detail::deadline_after(timeout);
    const std::lock_guard lock(stop_mutex_);
    if (joined_) return true;
    if (creator_.here()) {
      (void)stop_.notify();
      // Relaxed: finished_ only says the join below will not wait on a callback; the join
      // itself orders everything the thread did before this thread goes on.
      while (finished_.load(std::memory_order_relaxed) == 0) {
        const auto now = std::chrono::steady_clock::now();
        if (now >= deadline) return false;
        const auto left = deadline == std::chrono::steady_clock::time_point::max()
                              ? std::chrono::nanoseconds(std::chrono::seconds(1))
                              : std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now);
        detail::futex_wait_for(finished_, 0, static_cast<std::uint64_t>(left.count()));
      }
      pthread_join(thread_, nullptr);
    }
    joined_ = true;
    stop_.close();
    close_source();
    return true;
  }

  /// Adds a listener; its callbacks run from the next event on.
  void subscribe(pressure_listener& listener) {
    refuse_on_monitor("subscribe");
    const std::lock_guard lock(mutex_);
    if (std::find(listeners_.begin(), listeners_.end(), &listener) != listeners_.end()) {
      throw std::invalid_argument("teardown::pressure_monitor::subscribe: the listener is already subscribed");
    }
    listeners_.push_back(&listener);
  }

  /// Removes a listener: true if it was subscribed. Once it returns, none of its callbacks runs.
  bool unsubscribe(pressure_listener& listener) {
    refuse_on_monitor("unsubscribe");
    const std::lock_guard lock(mutex_);
    const auto at = std::find(listeners_.begin(), listeners_.end(), &listener);
    if (at == listeners_.end()) return false;
    listeners_.erase(at);
    return true;
  }

  /// Where the events come from (never automatic: what it resolved to).
  pressure_source source() const noexcept { return source_; }
  /// The PSI window in force (the options', or rounded up to 2 s: see the header comment);
  /// sampled: the sample interval.
  std::chrono::microseconds window() const noexcept { return window_; }
  /// One line: the file and trigger, or what is sampled and why the triggers were not used.
  const std::string& description() const noexcept { return description_; }
  bool under_pressure() const noexcept { return pressured_.load(std::memory_order_relaxed); }

  pressure_monitor_stats stats() const noexcept {
    pressure_monitor_stats s;
    s.events = events_.load(std::memory_order_relaxed);
    s.episodes = episodes_.load(std::memory_order_relaxed);
    s.reliefs = reliefs_.load(std::memory_order_relaxed);
    s.samples = samples_.load(std::memory_order_relaxed);
    s.lost = lost_.load(std::memory_order_relaxed);
    s.under_pressure = pressured_.load(std::memory_order_relaxed);
    s.nice_refused = nice_refused_.load(std::memory_order_relaxed);
    return s;
  }

  /// The trigger line the options make: "some 150000 2000000" (stall and window in µs).
  static std::string trigger_line(psi_line line, std::chrono::microseconds stall, std::chrono::microseconds window) {
    return std::string(line == psi_line::some ? "some " : "full ") + std::to_string(stall.count()) + " " +
           std::to_string(window.count());
  }

 private:
  static pressure_monitor_options validated(pressure_monitor_options opts) {
    const auto refuse = [](const std::string& what) {
      throw std::invalid_argument("teardown::pressure_monitor: " + what);
    };
    if (opts.source != pressure_source::automatic && opts.source != pressure_source::psi_cgroup &&
        opts.source != pressure_source::psi_system && opts.source != pressure_source::sampled &&
        opts.source != pressure_source::injected) {
      refuse("source is not a pressure_source value");
    }
    if (opts.line != psi_line::some && opts.line != psi_line::full) refuse("line is not a psi_line value");
    if (opts.source == pressure_source::injected) {
      // No kernel behind it: any positive window (the relief unit) will do.
      if (opts.window.count() <= 0) refuse("window must be positive");
    } else if (opts.window < min_window || opts.window > max_window) {
      refuse("window must be in [500 ms, 10 s] (the kernel's PSI rule), got " + std::to_string(opts.window.count()) +
             " us");
    }
    if (opts.stall.count() <= 0 || opts.stall > opts.window) {
      refuse("stall must be in (0, window], got " + std::to_string(opts.stall.count()) + " us");
    }
    if (opts.relief_windows == 0) refuse("relief_windows must be at least 1");
    if (opts.sample_interval.count() <= 0) refuse("sample_interval must be positive");
    if (opts.sample_percent < 1 || opts.sample_percent > 99) {
      refuse("sample_percent must be in [1, 99], got " + std::to_string(opts.sample_percent));
    }
    if (opts.source == pressure_source::injected && opts.event_fd < 0) refuse("source injected needs an event_fd");
    if (opts.source != pressure_source::injected && (opts.event_fd >= 0 || opts.relief_fd >= 0)) {
      refuse("event_fd or relief_fd is set but source is not injected");
    }
    if (opts.name.find('\0') != std::string::npos) refuse("name holds a NUL byte");
    // Every path is read on the way (the trigger, the fallback's sampler, the cgroup discovery),
    // some only on the monitor thread: a null one is refused here, before anything starts.
    const std::pair<const char*, const char*> paths[] = {{opts.proc_pressure, "proc_pressure"},
                                                         {opts.meminfo, "meminfo"},
                                                         {opts.files.cgroup, "files.cgroup"},
                                                         {opts.files.mountinfo, "files.mountinfo"},
                                                         {opts.files.root, "files.root"}};
    for (const auto& [path, field] : paths) {
      if (path == nullptr) refuse(std::string(field) + " is a null path");
    }
    return opts;
  }

  void refuse_on_monitor(const char* what) const {
    if (detail::thread_owner<pressure_monitor>::is(this)) {
      throw std::logic_error(std::string("teardown::pressure_monitor::") + what +
                             ": called from a callback on the monitor thread; it would wait for itself");
    }
  }

  // ---- the source ---------------------------------------------------------------------------

  void open_source() {
    using detail::memory_limit_impl::version;
    std::string cgroup_pressure;  // the v2 cgroup's memory.pressure, not the root's
    std::vector<detail::pressure_impl::sampled_level> levels;
    detail::memory_limit_impl::for_each_memory_cgroup(
        opts_.files, [&](char* dir, std::size_t length, std::size_t stop, version which) noexcept {
          try {
            std::string path(dir, length);
            if (which == version::v2 && length > stop) cgroup_pressure = path + "/memory.pressure";
            // Every level from the process's cgroup up to the mount point.
            for (;;) {
              if (which == version::v2) {
                levels.push_back({path + "/memory.current", path + "/memory.max"});
              } else {
                levels.push_back({path + "/memory.usage_in_bytes", path + "/memory.limit_in_bytes"});
              }
              if (path.size() <= stop) break;
              path.resize(std::max(stop, path.rfind('/')));
            }
          } catch (...) {  // no memory for a path: that hierarchy is not sampled
          }
        });
    levels_ = std::move(levels);

    if (opts_.source == pressure_source::injected) {
      source_ = pressure_source::injected;
      description_ = "injected: fd " + std::to_string(opts_.event_fd);
      return;
    }
    std::string why_not;
    if (opts_.source == pressure_source::automatic || opts_.source == pressure_source::psi_cgroup) {
      if (cgroup_pressure.empty()) {
        why_not = "no cgroup v2 of its own (the root's memory.pressure is the system's)";
      } else if (try_trigger(cgroup_pressure, /*proc=*/false, why_not)) {
        source_ = pressure_source::psi_cgroup;
        return;
      }
      if (opts_.source == pressure_source::psi_cgroup) {
        throw std::system_error(std::make_error_code(std::errc::not_supported),
                                "teardown::pressure_monitor: psi_cgroup: " + why_not);
      }
    }
    if (opts_.source == pressure_source::automatic || opts_.source == pressure_source::psi_system) {
      std::string why;
      if (try_trigger(opts_.proc_pressure, /*proc=*/true, why)) {
        source_ = pressure_source::psi_system;
        // The whole machine's pressure instead of this cgroup's: say why.
        if (!why_not.empty()) description_ += " (the cgroup's not used: " + why_not + ")";
        return;
      }
      if (opts_.source == pressure_source::psi_system) {
        throw std::system_error(std::make_error_code(std::errc::not_supported),
                                "teardown::pressure_monitor: psi_system: " + why);
      }
      why_not += why_not.empty() ? why : "; " + why;
    }
    source_ = pressure_source::sampled;
    window_ = std::chrono::duration_cast<std::chrono::microseconds>(opts_.sample_interval);
    description_ = "sampled every " + std::to_string(opts_.sample_interval.count()) + " ms: " +
                   std::to_string(levels_.size()) + " cgroup level(s) and " + opts_.meminfo;
    if (!why_not.empty()) description_ += " (PSI triggers not used: " + why_not + ")";
  }

  static constexpr decltype(statfs::f_type) proc_magic = 0x9fa0;        // PROC_SUPER_MAGIC
  static constexpr decltype(statfs::f_type) cgroup2_magic = 0x63677270;  // CGROUP2_SUPER_MAGIC

  // Opens `path` and writes the trigger; on EINVAL with a window that is not a multiple of 2 s,
  // once more with the window rounded up to one (the unprivileged rule). True: trigger_fd_ set.
  bool try_trigger(const std::string& path, bool proc, std::string& why_not) {
    std::chrono::microseconds window = opts_.window;
    for (int attempt = 0; attempt < 2; ++attempt) {
      const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK);
      if (fd < 0) {
        why_not = path + ": open: " + std::strerror(errno);
        return false;
      }
      // Any writable file takes the trigger's line; only PSI's (on procfs, or a cgroup2
      // file) ever reports pressure. Anything else would be a trigger that never fires.
      struct statfs fs {};
      if (::fstatfs(fd, &fs) != 0 || (fs.f_type != proc_magic && fs.f_type != cgroup2_magic)) {
        ::close(fd);
        why_not = path + ": not a PSI pressure file (on neither procfs nor cgroup2)";
        return false;
      }
      const std::string line = trigger_line(opts_.line, opts_.stall, window);
      // /proc/pressure/* overwrites the last byte written with NUL: include one.
      if (detail::pressure_impl::write_all(fd, line.c_str(), line.size() + (proc ? 1 : 0))) {
        trigger_fd_ = fd;
        window_ = window;
        description_ = "psi trigger \"" + line + "\" on " + path;
        if (window != opts_.window) description_ += " (window rounded up to a multiple of 2 s: unprivileged)";
        return true;
      }
      const int error = errno;
      ::close(fd);
      why_not = path + ": trigger \"" + line + "\": " + std::strerror(error);
      if (error != EINVAL || window.count() % unprivileged_step.count() == 0) return false;
      window = (window / unprivileged_step + 1) * unprivileged_step;
      if (window > max_window || opts_.stall > window) return false;
    }
    return false;
  }

  void close_source() noexcept {
    if (trigger_fd_ >= 0) ::close(trigger_fd_);
    trigger_fd_ = -1;
  }

  // A sample: true if some level is at or over sample_percent of its limit, or MemAvailable is
  // under (100 - sample_percent)% of MemTotal.
  bool sample() const noexcept {
    using detail::memory_limit_impl::read_bytes;
    const std::uint64_t percent = opts_.sample_percent;
    const std::uint64_t physical = opts_.files.physical;
    for (const auto& level : levels_) {
      std::uint64_t usage = 0, limit = 0;
      if (!read_bytes(level.usage.c_str(), usage) || !read_bytes(level.limit.c_str(), limit)) continue;
      if (limit == 0 || (physical != 0 && limit >= physical) || limit >= (std::uint64_t{1} << 62)) continue;
      if (usage >= limit / 100 * percent) return true;
    }
    std::uint64_t total = 0, available = 0;
    if (detail::pressure_impl::read_meminfo(opts_.meminfo, total, available) && total != 0) {
      if (available < total / 100 * (100 - percent)) return true;
    }
    return false;
  }

  // ---- the thread ---------------------------------------------------------------------------

  static void* entry(void* self) {
    auto* const monitor = static_cast<pressure_monitor*>(self);
    monitor->run();
    // Relaxed: stop_for joins the thread after reading it, and the join is what orders (the
    // thread is done with the monitor but for this word, so the join waits only for its exit).
    monitor->finished_.store(1, std::memory_order_relaxed);
    detail::futex_wake_all(monitor->finished_);
    return nullptr;
  }

  void run() noexcept {
    detail::thread_owner<pressure_monitor>::mark(this);
#if defined(__linux__)
    (void)detail::name_this_thread(opts_.name);
    if (!detail::set_thread_nice(detail::this_thread_tid(), 0)) nice_refused_.store(true, std::memory_order_relaxed);
#endif
    using clock = std::chrono::steady_clock;
    const bool sampled = source_ == pressure_source::sampled;
    const int watched = source_ == pressure_source::injected ? opts_.event_fd : trigger_fd_;
    const bool injected = source_ == pressure_source::injected;
    // Relief: this long without an event.
    const clock::duration quiet = quiet_time(window_, opts_.relief_windows);
    // Saturating: a deadline beyond the clock's end is never reached (it must not wrap).
    const auto relief_at = [&](clock::time_point since) {
      return quiet > clock::time_point::max() - since ? clock::time_point::max() : since + quiet;
    };
    clock::time_point last_event{};
    clock::time_point next_sample = clock::now() + opts_.sample_interval;
    std::uint64_t episode_events = 0;
    bool pressured = false;
    bool watching = watched >= 0 && !sampled;
    bool sampling = sampled;  // an injected monitor never samples, even once its fd is gone
    int relief_fd = source_ == pressure_source::injected ? opts_.relief_fd : -1;
    for (;;) {
      // A PSI trigger fd always polls readable (the kernel's default mask): its event is POLLPRI.
      const short wanted = source_ == pressure_source::injected ? POLLIN : POLLPRI;
      pollfd fds[3] = {{stop_.fd(), POLLIN, 0}, {watching ? watched : -1, wanted, 0}, {relief_fd, POLLIN, 0}};
      const clock::time_point now = clock::now();
      clock::time_point wake = clock::time_point::max();
      if (sampling) wake = next_sample;
      if (pressured) wake = std::min(wake, relief_at(last_event));
      int timeout = -1;
      if (wake != clock::time_point::max()) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(std::max(wake - now, clock::duration::zero()));
        timeout = static_cast<int>(std::min<std::int64_t>(left.count(), 60'000));
      }
      const int ready = ::poll(fds, 3, timeout);
      if (ready < 0 && errno != EINTR) break;  // cannot happen with valid fds: stop looking
      if (fds[0].revents & POLLIN) break;
      bool event = false;
      const short got = watching ? fds[1].revents : 0;
      if (injected && got != 0) {
        // The data first: a pipe written and then closed polls POLLIN | POLLHUP at once.
        bool ended = false;
        if (got & POLLIN) {
          char sink[8];
          const ssize_t got_bytes = ::read(opts_.event_fd, sink, sizeof sink);  // consume it (eventfd: the counter)
          event = got_bytes > 0;
          ended = got_bytes == 0;  // end of file: the writer is gone
        }
        if (!event && (ended || (got & (POLLERR | POLLNVAL | POLLHUP)))) {
          // Nothing more will come: stop watching. Still injected, so no sampling: relief_fd
          // and the quiet windows still bring relief.
          lost_.fetch_add(1, std::memory_order_relaxed);
          watching = false;
        }
      } else if (got & (POLLERR | POLLNVAL | POLLHUP)) {
        // The trigger's cgroup went away: sample from now on.
        lost_.fetch_add(1, std::memory_order_relaxed);
        watching = false;
        sampling = true;
        next_sample = clock::now() + opts_.sample_interval;
      } else if (got & wanted) {
        event = true;
      }
      if (sampling && clock::now() >= next_sample) {
        next_sample = clock::now() + opts_.sample_interval;
        samples_.fetch_add(1, std::memory_order_relaxed);
        event = event || sample();
      }
      if (event) {
        last_event = clock::now();
        events_.fetch_add(1, std::memory_order_relaxed);
        const bool first = !pressured;
        if (first) {
          pressured = true;
          episode_events = 0;
          episodes_.fetch_add(1, std::memory_order_relaxed);
          pressured_.store(true, std::memory_order_relaxed);
        }
        ++episode_events;
        dispatch([&](pressure_listener& l) { l.on_pressure(first, episode_events); });
      }
      bool relief_now = false;
      if (fds[2].revents & POLLIN) {
        char sink[8];
        (void)!::read(relief_fd, sink, sizeof sink);
        relief_now = true;
      } else if (fds[2].revents & (POLLERR | POLLNVAL | POLLHUP)) {
        relief_fd = -1;  // closed: the quiet windows alone bring relief
      }
      // An injected relief read together with an event comes after it (the order it was sent).
      if (pressured && (relief_now || (!event && clock::now() >= relief_at(last_event)))) {
        pressured = false;
        pressured_.store(false, std::memory_order_relaxed);
        reliefs_.fetch_add(1, std::memory_order_relaxed);
        dispatch([](pressure_listener& l) { l.on_relief(); });
      }
    }
  }

  // relief_windows x window, saturated at the clock's range (an injected window may be an hour,
  // and 10 s x 2^32 windows is beyond it too).
  static std::chrono::steady_clock::duration quiet_time(std::chrono::microseconds window, std::uint32_t windows) {
    using clock_duration = std::chrono::steady_clock::duration;
    const auto limit = std::chrono::duration_cast<std::chrono::microseconds>(clock_duration::max()).count();
    if (windows == 0 || window.count() > limit / windows) return clock_duration::max();
    return std::chrono::duration_cast<clock_duration>(window * windows);
  }

  template <class Call>
  void dispatch(Call&& call) noexcept {
    const std::lock_guard lock(mutex_);
    for (pressure_listener* listener : listeners_) {
      try {
        call(*listener);
      } catch (...) {  // a listener's failure is its own; the others still hear of it
      }
    }
  }

  const pressure_monitor_options opts_;
  pressure_source source_ = pressure_source::sampled;
  std::chrono::microseconds window_{};
  std::string description_;
  std::vector<detail::pressure_impl::sampled_level> levels_;
  int trigger_fd_ = -1;
  detail::event_fd stop_;  // stop() writes it; the poll loop ends when it is readable
  pthread_t thread_{};
  const detail::creator_process creator_;  // the process the thread runs in
  std::mutex stop_mutex_;
  bool joined_ = false;  // guarded by stop_mutex_

  std::mutex mutex_;  // the listeners, and every callback
  std::vector<pressure_listener*> listeners_;

  std::atomic<std::uint64_t> events_{0}, episodes_{0}, reliefs_{0}, samples_{0}, lost_{0};
  std::atomic<bool> pressured_{false};
  std::atomic<bool> nice_refused_{false};
  std::atomic<std::uint32_t> finished_{0};  // 1 once run() returned (a futex word: stop_for)
};

}  // namespace teardown
