// teardown/pressure.hpp — memory pressure drives the teardown: a PSI monitor, and a policy that
// gives queued memory back while the system is short of it.
//
//     teardown::pressure_monitor monitor;                          // PSI triggers, or the sampler
//     teardown::deferred_domain domain;                            // (or an async_teardown, an mm_system)
//     teardown::pressure_policy policy(monitor, domain);           // thaw, nice 0, drain, cap 0
//
// Memory that is queued is not free, and a frozen or starved worker holds it longer. Linux says
// when memory is tight: PSI (/proc/pressure/memory, a cgroup v2's memory.pressure) wakes a
// poll() on a trigger ("some 150000 2000000": 150 ms of stall within 2 s), which is what
// Android's lmkd, systemd-oomd and oomd act on. The monitor turns those wake-ups into pressure
// and relief; a policy subscribed to it acts on one composition while pressure lasts:
//   (a) thaw      every freeze level of the worker is undone (a frozen worker frees nothing);
//   (b) nice      the worker runs at pressure_nice (0) instead of its own (19);
//   (c) drain     on every event, up to drain_per_event of the queue is torn down on the
//                 monitor thread, oldest first (the composition's drain());
//   (d) cap       max_pending drops to pressure_cap (0): new puts tear down inline;
// and on relief puts back what it changed: the freeze levels it undid, the nice value it found,
// the cap it found (unless a cap was set meanwhile, which then stands: see "The cap rule").
// Every action is counted (pressure_policy_stats) and traced (trace::pressure_event).
//
// Where the events come from (pressure_source), first that works under `automatic`:
//   psi_cgroup   a trigger on the memory.pressure of the process's cgroup v2, when that cgroup
//                is not the root of the hierarchy and has the file (the root's is the system's);
//   psi_system   a trigger on /proc/pressure/memory;
//   sampled      no trigger could be registered: every sample_interval the monitor reads the
//                usage of each memory cgroup above the process (v2 memory.current against
//                memory.max, v1 memory.usage_in_bytes against memory.limit_in_bytes; the files
//                memory_limit.hpp finds) and /proc/meminfo; a sample at or over sample_percent
//                of a limit, or with MemAvailable under (100 - sample_percent)% of MemTotal,
//                counts as an event. Coarse: v1's usage counts page cache, which reclaim takes
//                back cheaply. description() says why the triggers were not used;
//   injected     an fd the caller owns (event_fd): each time it polls readable is an event (an
//                eventfd or a pipe; the monitor reads up to 8 bytes to consume it). Tests drive
//                the real poll loop with it; relief_fd, if given, brings relief the same way.
// A trigger's rules (the kernel's psi_trigger_create): threshold in (0, window], window in
// [500 ms, 10 s], and a writer without CAP_SYS_RESOURCE may only use windows that are a
// multiple of 2 s (its triggers ride the 2 s averaging work, so events come at that pace). The
// options are checked against the first two; a window the kernel refuses (EINVAL) that is not
// a multiple of 2 s is retried once rounded up to one (window() says what is in force). Writing
// the trigger to /proc/pressure/memory includes the terminating NUL (the kernel overwrites the
// last byte written with one); a cgroup file takes the plain string.
//
// Relief. A trigger only says "pressure"; the kernel sends at most one event per window while
// the stall lasts. The monitor calls it relief when relief_windows windows (sampled: sample
// intervals) pass without an event: the poll loop's own timeout, so an injected source shows it
// as it shows events. The averages are not used: avg10 lags the stall by seconds either way.
//
// The monitor thread: one, named (opts.name), nice 0, every signal sent to the process blocked
// (worker_thread.hpp), poll() on the trigger fd (or event_fd) and on an eventfd that stop()
// writes. Callbacks run there, one at a time, in subscription order.
//
// Who may call what (the monitor must outlive every subscription and every call)
//   constructor          any thread; opens the files, registers the trigger, starts the thread.
//                        Throws std::invalid_argument naming the field for bad options
//                        (nothing started), std::system_error if the thread or eventfd cannot
//                        be made. A PSI source named explicitly that cannot be had throws
//                        std::system_error too; automatic falls back instead.
//   subscribe            any thread but the monitor's; blocks while a callback runs. Refuses a
//                        listener already subscribed (std::invalid_argument).
//   unsubscribe          any thread but the monitor's (from a callback it would wait for
//                        itself: std::logic_error); blocks while a callback runs. When it
//                        returns, no callback of that listener runs or will run: the callbacks
//                        and (un)subscription take one mutex, and the list is read under it.
//   stop, destructor     any thread but the monitor's; stop the thread and close the fds.
//                        Idempotent. Subscribers get no relief from it (a policy restores on its
//                        own unsubscribe).
//   source, window, description, stats, under_pressure   any thread; stats wait-free.
// A fork child has no monitor thread: its subscriptions get no events, and stop and the
// destructor there only close the fds.
//
// pressure_policy<Target>: Target is an async_teardown, a deferred_domain or a model
// basic_mm_system (its cost units: bytes, bytes, pages). The policy subscribes in its
// constructor and unsubscribes in its destructor, then undoes whatever is still in force; the
// target must outlive it. Its callbacks call only the target's own entry points: drain, freeze,
// thaw, max_pending / replace_max_pending (mm_system: ..._pages), worker_nice and
// set_worker_nice. Thawing nests as freeze does: the levels the policy undid are its own until
// relief, when it freezes exactly that many again (a thaw someone else makes meanwhile finds no
// level to undo and throws, as on a worker never frozen).
//
// The cap rule. On pressure the policy records the cap it finds (C) and, if C is above
// pressure_cap, replaces it with pressure_cap. On relief it replaces pressure_cap with C in one
// compare-and-swap: if the cap no longer reads pressure_cap, someone set a cap meanwhile, and
// that cap stands (counted in caps_kept). Several policies on one shared budget compose: each
// puts back what it found, and the first to lower it found the original.
//
// Memory ordering: the subscriber list and every callback are under one mutex: whatever a
// subscriber did before subscribe is visible to its callbacks, and whatever a callback did is
// visible after unsubscribe returns. The counters are relaxed, except that a policy counts an
// event (a relief) after its actions with release and stats() reads that count first with
// acquire: a snapshot that counts it shows what it did.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/syscall.h>
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

#include "teardown/async_teardown.hpp"
#include "teardown/budget.hpp"
#include "teardown/memory_limit.hpp"
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
  const char* proc_pressure = "/proc/pressure/memory";
  const char* meminfo = "/proc/meminfo";
};

struct pressure_monitor_stats {
  std::uint64_t events = 0;     // trigger wake-ups (or pressured samples, or injected events)
  std::uint64_t episodes = 0;   // pressure began (the first event after relief, or ever)
  std::uint64_t reliefs = 0;    // relief_windows passed without an event
  std::uint64_t samples = 0;    // sampled: samples taken
  std::uint64_t lost = 0;       // the trigger fd reported POLLERR (its cgroup went away); the
                                // monitor goes on sampling
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

namespace detail::pressure_impl {

inline bool write_all(int fd, const char* data, std::size_t length) noexcept {
  while (length > 0) {
    const ssize_t written = ::write(fd, data, length);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return false;
    data += written;
    length -= static_cast<std::size_t>(written);
  }
  return true;
}

// "MemTotal:  123 kB" -> 123 * 1024 for each of the two keys; false if either is missing.
inline bool read_meminfo(const char* path, std::uint64_t& total, std::uint64_t& available) noexcept {
  using memory_limit_impl::line_reader;
  line_reader reader(path);
  std::string_view line;
  bool have_total = false, have_available = false;
  const auto number = [](std::string_view rest, std::uint64_t& out) noexcept {
    std::uint64_t value = 0;
    bool digits = false;
    for (const char c : rest) {
      if (c >= '0' && c <= '9') {
        value = value * 10 + static_cast<std::uint64_t>(c - '0');
        digits = true;
      } else if (digits) {
        break;
      }
    }
    out = value * 1024;
    return digits;
  };
  while (reader.next(line)) {
    if (line.substr(0, 9) == "MemTotal:") have_total = number(line.substr(9), total);
    if (line.substr(0, 13) == "MemAvailable:") have_available = number(line.substr(13), available);
  }
  return have_total && have_available;
}

// One memory cgroup level the sampler reads: its usage file and its limit file.
struct sampled_level {
  std::string usage;
  std::string limit;
};

}  // namespace detail::pressure_impl

class pressure_monitor {
 public:
  static constexpr std::chrono::microseconds min_window = std::chrono::milliseconds(500);
  static constexpr std::chrono::microseconds max_window = std::chrono::seconds(10);
  static constexpr std::chrono::microseconds unprivileged_step = std::chrono::seconds(2);

  explicit pressure_monitor(pressure_monitor_options opts = {}) : opts_(validated(std::move(opts))) {
    window_ = opts_.window;
    open_source();
    stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (stop_fd_ < 0) {
      const int error = errno;
      close_source();
      throw std::system_error(error, std::generic_category(), "teardown::pressure_monitor: eventfd");
    }
    if (const int error = detail::start_thread_with_signals_blocked(&thread_, &pressure_monitor::entry, this);
        error != 0) {
      ::close(stop_fd_);
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
    if (::getpid() == creator_) {
      const std::uint64_t one = 1;
      (void)detail::pressure_impl::write_all(stop_fd_, reinterpret_cast<const char*>(&one), sizeof one);
      pthread_join(thread_, nullptr);
    }
    joined_ = true;
    ::close(stop_fd_);
    close_source();
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
    return opts;
  }

  void refuse_on_monitor(const char* what) const {
    if (on_monitor_ == this) {
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
    static_cast<pressure_monitor*>(self)->run();
    return nullptr;
  }

  void run() noexcept {
    on_monitor_ = this;
#if defined(__linux__)
    const std::string name = opts_.name.substr(0, 15);
    (void)pthread_setname_np(pthread_self(), name.c_str());
    if (setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 0) != 0) {
      nice_refused_.store(true, std::memory_order_relaxed);
    }
#endif
    using clock = std::chrono::steady_clock;
    const bool sampled = source_ == pressure_source::sampled;
    const int watched = source_ == pressure_source::injected ? opts_.event_fd : trigger_fd_;
    const auto quiet = window_ * opts_.relief_windows;  // relief: this long without an event
    clock::time_point last_event{};
    clock::time_point next_sample = clock::now() + opts_.sample_interval;
    std::uint64_t episode_events = 0;
    bool pressured = false;
    bool watching = watched >= 0 && !sampled;
    int relief_fd = source_ == pressure_source::injected ? opts_.relief_fd : -1;
    for (;;) {
      // A PSI trigger fd always polls readable (the kernel's default mask): its event is POLLPRI.
      const short wanted = source_ == pressure_source::injected ? POLLIN : POLLPRI;
      pollfd fds[3] = {{stop_fd_, POLLIN, 0}, {watching ? watched : -1, wanted, 0}, {relief_fd, POLLIN, 0}};
      const clock::time_point now = clock::now();
      clock::time_point wake = clock::time_point::max();
      if (!watching) wake = next_sample;
      if (pressured) wake = std::min(wake, last_event + quiet);
      int timeout = -1;
      if (wake != clock::time_point::max()) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(std::max(wake - now, clock::duration::zero()));
        timeout = static_cast<int>(std::min<std::int64_t>(left.count(), 60'000));
      }
      const int ready = ::poll(fds, 3, timeout);
      if (ready < 0 && errno != EINTR) break;  // cannot happen with valid fds: stop looking
      if (fds[0].revents & POLLIN) break;
      bool event = false;
      if (watching && (fds[1].revents & (POLLERR | POLLNVAL | POLLHUP))) {
        // The trigger's cgroup went away (or the injected fd closed): sample from now on.
        lost_.fetch_add(1, std::memory_order_relaxed);
        watching = false;
        next_sample = clock::now() + opts_.sample_interval;
      } else if (watching && (fds[1].revents & wanted)) {
        event = true;
        if (source_ == pressure_source::injected) {
          char sink[8];
          (void)!::read(opts_.event_fd, sink, sizeof sink);  // consume it (eventfd: the counter)
        }
      }
      if (!watching && clock::now() >= next_sample) {
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
      if (pressured && (relief_now || (!event && clock::now() >= last_event + quiet))) {
        pressured = false;
        pressured_.store(false, std::memory_order_relaxed);
        reliefs_.fetch_add(1, std::memory_order_relaxed);
        dispatch([](pressure_listener& l) { l.on_relief(); });
      }
    }
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
  int stop_fd_ = -1;
  pthread_t thread_{};
  const pid_t creator_ = ::getpid();  // the process the thread runs in
  std::mutex stop_mutex_;
  bool joined_ = false;  // guarded by stop_mutex_

  std::mutex mutex_;  // the listeners, and every callback
  std::vector<pressure_listener*> listeners_;

  std::atomic<std::uint64_t> events_{0}, episodes_{0}, reliefs_{0}, samples_{0}, lost_{0};
  std::atomic<bool> pressured_{false};
  std::atomic<bool> nice_refused_{false};

  static inline thread_local const pressure_monitor* on_monitor_ = nullptr;
};

// ---- the policy -------------------------------------------------------------------------------

/// Checked by the policy's constructor (std::invalid_argument naming the field).
struct pressure_policy_options {
  bool thaw = true;              // (a) undo every freeze level while pressure lasts
  bool raise_priority = true;    // (b) run the worker at pressure_nice while pressure lasts
  int pressure_nice = 0;         //     [-20, 19]; applied only if below the worker's own
  std::uint64_t drain_per_event = std::uint64_t{64} << 20;  // (c) cost units per event (bytes;
                                 //     pages for an mm_system); 0: no drain. At most budget::max_cap
  bool lower_cap = true;         // (d) hold max_pending at pressure_cap while pressure lasts
  std::uint64_t pressure_cap = 0;  //   cost units; 0: every new put inline. At most budget::max_cap
};

struct pressure_policy_stats {
  std::uint64_t events = 0;         // on_pressure calls
  std::uint64_t episodes = 0;       // of which began an episode
  std::uint64_t reliefs = 0;
  std::uint64_t thawed = 0;         // freeze levels undone
  std::uint64_t refrozen = 0;       // ... and put back on relief (or at unsubscribe)
  std::uint64_t nice_raised = 0;    // set_worker_nice(pressure_nice) applied
  std::uint64_t nice_refused = 0;   // ... refused by the system
  std::uint64_t nice_restored = 0;
  std::uint64_t drained_items = 0;  // torn down on the monitor thread
  std::uint64_t drained_cost = 0;
  std::uint64_t caps_lowered = 0;
  std::uint64_t caps_restored = 0;
  std::uint64_t caps_kept = 0;      // relief found a cap set meanwhile and left it
  bool active = false;              // between an episode's first event and its relief
};

template <class Target>
class pressure_policy final : private pressure_listener {
 public:
  /// Subscribes to `monitor`. Throws std::invalid_argument for bad options, changing nothing.
  pressure_policy(pressure_monitor& monitor, Target& target, pressure_policy_options opts = {})
      : monitor_(monitor), target_(target), opts_(validated(opts)), domain_(trace_domain_of(target)) {
    monitor_.subscribe(*this);
  }

  pressure_policy(const pressure_policy&) = delete;
  pressure_policy& operator=(const pressure_policy&) = delete;

  /// Unsubscribes (waiting for a callback in progress), then puts back what is still in force,
  /// as relief would. Never from the monitor thread (std::terminate: it would wait for itself).
  ~pressure_policy() {
    (void)monitor_.unsubscribe(*this);
    restore();
  }

  const pressure_policy_options& options() const noexcept { return opts_; }

  /// A snapshot. events and reliefs are counted after their callback's actions and read first:
  /// a snapshot that counts an event or a relief shows everything it did.
  pressure_policy_stats stats() const noexcept {
    pressure_policy_stats s;
    // acquire, first: pair with the release adds made after each callback's actions.
    s.events = events_.load(std::memory_order_acquire);
    s.reliefs = reliefs_.load(std::memory_order_acquire);
    s.episodes = episodes_.load(std::memory_order_relaxed);
    s.thawed = thawed_.load(std::memory_order_relaxed);
    s.refrozen = refrozen_.load(std::memory_order_relaxed);
    s.nice_raised = nice_raised_.load(std::memory_order_relaxed);
    s.nice_refused = nice_refused_.load(std::memory_order_relaxed);
    s.nice_restored = nice_restored_.load(std::memory_order_relaxed);
    s.drained_items = drained_items_.load(std::memory_order_relaxed);
    s.drained_cost = drained_cost_.load(std::memory_order_relaxed);
    s.caps_lowered = caps_lowered_.load(std::memory_order_relaxed);
    s.caps_restored = caps_restored_.load(std::memory_order_relaxed);
    s.caps_kept = caps_kept_.load(std::memory_order_relaxed);
    s.active = active_flag_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  static pressure_policy_options validated(const pressure_policy_options& opts) {
    const auto refuse = [](const std::string& what) {
      throw std::invalid_argument("teardown::pressure_policy: " + what);
    };
    if (opts.pressure_nice < -20 || opts.pressure_nice > 19) {
      refuse("pressure_nice must be in [-20, 19], got " + std::to_string(opts.pressure_nice));
    }
    if (opts.drain_per_event > budget::max_cap) {
      refuse("drain_per_event must be at most " + std::to_string(budget::max_cap));
    }
    if (opts.pressure_cap > budget::max_cap) refuse("pressure_cap must be at most " + std::to_string(budget::max_cap));
    return opts;
  }

  // The target's entry points under either naming (mm_system's are in pages).
  static std::uint64_t trace_domain_of(Target& target) noexcept {
    if constexpr (requires { target.mm_reaper_trace_domain(); }) return target.mm_reaper_trace_domain();
    else return target.trace_domain();
  }
  std::uint64_t cap() const {
    if constexpr (requires { target_.max_pending_pages(); }) return target_.max_pending_pages();
    else return target_.max_pending();
  }
  bool replace_cap(std::uint64_t expected, std::uint64_t desired) {
    if constexpr (requires { target_.replace_max_pending_pages(expected, desired); }) {
      return target_.replace_max_pending_pages(expected, desired);
    } else {
      return target_.replace_max_pending(expected, desired);
    }
  }

  // ---- on the monitor thread (or in the destructor, after unsubscribe) --------------------

  // Acts on its own episode state rather than on `first`: a policy subscribed mid-episode
  // begins its own at the first event it hears.
  void on_pressure(bool, std::uint64_t) override {
    trace::pressure("pressure", events_.load(std::memory_order_relaxed) + 1, domain_);
    if (!active_) {
      active_ = true;
      active_flag_.store(true, std::memory_order_relaxed);
      episodes_.fetch_add(1, std::memory_order_relaxed);
      if (opts_.lower_cap) lower_cap();
      if (opts_.raise_priority) raise_priority();
    }
    // Every event: a freeze made since the last one is undone too.
    if (opts_.thaw) thaw_all();
    if (opts_.drain_per_event != 0) {
      const drain_result drained = target_.drain(opts_.drain_per_event);
      drained_items_.fetch_add(drained.items, std::memory_order_relaxed);
      drained_cost_.fetch_add(drained.cost, std::memory_order_relaxed);
      trace::pressure("drain", drained.cost, domain_);
    }
    // Last, release: pairs with the acquire read in stats(), so a snapshot that counts this
    // event counts what it did.
    events_.fetch_add(1, std::memory_order_release);
  }

  void on_relief() override {
    trace::pressure("relief", 0, domain_);
    restore();
    reliefs_.fetch_add(1, std::memory_order_release);  // last; pairs with stats()' acquire
  }

  void lower_cap() {
    // A CAS loop: a cap set between the read and the replace is read again, so found_cap_ is
    // always the cap this policy replaced.
    for (std::uint64_t found = cap(); found > opts_.pressure_cap; found = cap()) {
      if (replace_cap(found, opts_.pressure_cap)) {
        found_cap_ = found;
        cap_lowered_ = true;
        caps_lowered_.fetch_add(1, std::memory_order_relaxed);
        trace::pressure("cap", opts_.pressure_cap, domain_);
        return;
      }
    }
  }

  void raise_priority() {
    const int own = target_.worker_nice();
    if (own <= opts_.pressure_nice) return;
    found_nice_ = own;
    nice_changed_ = true;  // restored even if refused: set_nice kept the value for a later start
    if (target_.set_worker_nice(opts_.pressure_nice)) {
      nice_raised_.fetch_add(1, std::memory_order_relaxed);
      trace::pressure("nice", static_cast<std::uint64_t>(opts_.pressure_nice), domain_);
    } else {
      nice_refused_.fetch_add(1, std::memory_order_relaxed);
      trace::pressure("nice_refused", static_cast<std::uint64_t>(opts_.pressure_nice), domain_);
    }
  }

  void thaw_all() {
    std::uint64_t levels = 0;
    for (;;) {
      try {
        target_.thaw();
      } catch (const std::logic_error&) {  // not frozen (any more): every level is undone
        break;
      }
      ++levels;
    }
    if (levels == 0) return;
    held_levels_ += levels;
    thawed_.fetch_add(levels, std::memory_order_relaxed);
    trace::pressure("thaw", levels, domain_);
  }

  // Relief (or the destructor): everything this episode changed, put back.
  void restore() {
    if (!active_) return;
    active_ = false;
    active_flag_.store(false, std::memory_order_relaxed);
    if (cap_lowered_) {
      cap_lowered_ = false;
      if (replace_cap(opts_.pressure_cap, found_cap_)) {
        caps_restored_.fetch_add(1, std::memory_order_relaxed);
        trace::pressure("cap_restored", found_cap_, domain_);
      } else {
        caps_kept_.fetch_add(1, std::memory_order_relaxed);
        trace::pressure("cap_kept", cap(), domain_);
      }
    }
    if (nice_changed_) {
      nice_changed_ = false;
      if (target_.set_worker_nice(found_nice_)) nice_restored_.fetch_add(1, std::memory_order_relaxed);
      trace::pressure("nice", static_cast<std::uint64_t>(found_nice_), domain_);
    }
    if (held_levels_ != 0) {
      const std::uint64_t levels = std::exchange(held_levels_, 0);
      for (std::uint64_t i = 0; i < levels; ++i) target_.freeze();
      refrozen_.fetch_add(levels, std::memory_order_relaxed);
      trace::pressure("refreeze", levels, domain_);
    }
  }

  pressure_monitor& monitor_;
  Target& target_;
  const pressure_policy_options opts_;
  const std::uint64_t domain_;

  // The episode's state: touched by the callbacks (under the monitor's mutex) and by the
  // destructor after unsubscribe returned (which orders it after the last callback).
  bool active_ = false;
  bool cap_lowered_ = false;
  std::uint64_t found_cap_ = 0;
  bool nice_changed_ = false;
  int found_nice_ = 0;
  std::uint64_t held_levels_ = 0;

  std::atomic<std::uint64_t> events_{0}, episodes_{0}, reliefs_{0}, thawed_{0}, refrozen_{0};
  std::atomic<std::uint64_t> nice_raised_{0}, nice_refused_{0}, nice_restored_{0};
  std::atomic<std::uint64_t> drained_items_{0}, drained_cost_{0};
  std::atomic<std::uint64_t> caps_lowered_{0}, caps_restored_{0}, caps_kept_{0};
  std::atomic<bool> active_flag_{false};
};

}  // namespace teardown
