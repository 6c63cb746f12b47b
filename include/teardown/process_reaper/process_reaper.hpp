// teardown/process_reaper/process_reaper.hpp — process_reaper: kill a process through its
// pidfd and give its memory back with process_mrelease from a worker of ours. Part of
// process_reaper.hpp, which is the header to include; the contract is there.
// Design: docs/design.md, "Processes: the supervisor's side (process_reaper.hpp, Linux)".
#pragma once

#if !defined(__linux__)
#error "teardown/process_reaper/process_reaper.hpp: Linux only (pidfd_send_signal, process_mrelease)"
#endif

#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include "teardown/budget.hpp"
#include "teardown/event_count.hpp"
#include "teardown/detail/clock.hpp"
#include "teardown/detail/fork.hpp"
#include "teardown/detail/nice.hpp"
#include "teardown/detail/pidfd.hpp"
#include "teardown/llist.hpp"
#include "teardown/process_reaper/anonymous_rss.hpp"
#include "teardown/process_reaper/options.hpp"
#include "teardown/process_reaper/pidfd_process.hpp"
#include "teardown/reaper.hpp"
#include "teardown/snapshot_count.hpp"
#include "teardown/trace.hpp"

namespace teardown::process {

namespace detail {

// One killed process on its way through the reaper.
struct killed_process {
  llist_node hook;
  int pidfd = -1;  // our own copy, closed when done
  pid_t pid = 0;
  int signal = 0;
  std::uint64_t bytes = 0;  // the charge
  bool charged = false;     // bytes are reserved on the budget
  bool signal_pending = false;  // the worker sends the signal (signal_on_worker)
  std::uint32_t fork_epoch = 0;  // the process_reaper's fork epoch when charged
  std::uint64_t killed_ns = 0;
  ~killed_process() {
    if (pidfd >= 0) ::close(pidfd);
  }
};

}  // namespace detail

class process_reaper final : private teardown::detail::fork_participant {
 public:
  /// Starts the worker. std::invalid_argument for bad options (starting nothing), see
  /// process_reaper_options; std::system_error if the thread cannot start.
  explicit process_reaper(process_reaper_options options = {})
      : options_(validated(std::move(options))),
        budget_(options_.budget_bytes),
        reaper_(finish_fn{this},
                reaper_options{.name = options_.name, .nice = options_.nice, .trace_domain = trace_domain_}) {
    teardown::detail::fork_registry::instance().add(this);
  }
  process_reaper(const process_reaper&) = delete;
  process_reaper& operator=(const process_reaper&) = delete;
  /// stop(): every process still queued is released first.
  ~process_reaper() { teardown::detail::fork_registry::instance().remove(this); }

  /// Charges the process's anonymous RSS, sends `signal` through its pidfd and hands a copy of
  /// the pidfd to the worker, which calls process_mrelease on it. Returns false, changing
  /// nothing, if the process is gone (reaped) already. Throws, changing nothing:
  /// std::invalid_argument for an empty process or a signal outside [1, SIGRTMAX];
  /// std::system_error when the signal is refused (EPERM) or the pidfd cannot be copied.
  bool kill(const pidfd_process& process, int signal = SIGKILL);

  /// Blocks until every process killed before the call is done (charges released).
  void flush() { reaper_.flush(); }
  /// flush(), then joins the worker; afterwards kill() releases on its caller. Idempotent.
  void stop() { reaper_.stop(); }
  /// stop() that waits at most `timeout`: true iff every process queued was released and the
  /// worker joined in time. False leaves it stopping (reaper::stop_for): nothing is lost, and a
  /// later stop, stop_for or the destructor waits for the rest.
  template <class Rep, class Period>
  bool stop_for(std::chrono::duration<Rep, Period> timeout) {
    return reaper_.stop_for(timeout);
  }

  /// The worker's nice value in force (reaper::nice): options.nice until set_nice changes it.
  int nice() const { return reaper_.nice(); }
  /// Sets the worker's nice value from now on: true if applied, false if the system refused
  /// (lowering it needs CAP_SYS_NICE; nothing changes). std::invalid_argument, changing
  /// nothing, outside [-20, 19].
  bool set_nice(int value) {
    if (!teardown::detail::valid_nice(value)) {
      throw std::invalid_argument("teardown::process::process_reaper::set_nice: nice must be in [-20, 19], got " +
                                  std::to_string(value));
    }
    return reaper_.set_nice(value);
  }

  /// Blocks until bytes_in_teardown() <= bytes, at most `timeout`; true if it got there.
  template <class Rep, class Period>
  bool wait_for_budget(std::uint64_t bytes, std::chrono::duration<Rep, Period> timeout);

  /// The charges of the processes killed and not yet done. Wait-free.
  std::uint64_t bytes_in_teardown() const noexcept { return budget_.pending(); }
  /// Wait-free snapshot; counters are read one by one.
  process_reaper_stats stats() const noexcept;
  /// The underlying reaper's statistics alone (stats().worker). Wait-free.
  reaper_stats worker_stats() const noexcept { return reaper_.stats(); }
  /// This instance's trace domain (trace.hpp): carried by its process_kill / process_release.
  std::uint64_t trace_domain() const noexcept { return trace_domain_; }

 private:
  using item = detail::killed_process;

  struct finish_fn {
    process_reaper* owner;
    void operator()(item& killed) const noexcept { owner->finish(killed); }
  };

  static process_reaper_options validated(process_reaper_options options) {
    const auto refuse = [](const std::string& what) {
      throw std::invalid_argument("teardown::process::process_reaper: " + what);
    };
    if (options.name.empty()) refuse("name is empty");
    if (options.budget_bytes > budget::max_cap) {
      refuse("budget_bytes " + std::to_string(options.budget_bytes) + " exceeds budget::max_cap (2^48)");
    }
    if (options.retry_interval.count() < 0) refuse("retry_interval is negative");
    if (options.exit_wait.count() < 0) refuse("exit_wait is negative");
    if (options.mrelease == nullptr) refuse("mrelease is null");
    // nice and the name's NUL byte, with the same words as the reaper's own check.
    (void)teardown::detail::validated_reaper_options(reaper_options{.name = options.name, .nice = options.nice},
                                                     "teardown::process::process_reaper");
    return options;
  }

  release_result release_memory(item& killed, std::uint32_t& tries) noexcept;
  void finish(item& killed) noexcept;

  // A fork child starts with an empty budget: the charges it inherited are the parent's (its
  // worker goes on releasing them, and one it had in hand never comes back in the child), so
  // an item charged before the fork releases nothing there (see "Signals and fork").
  void fork_prepare() noexcept override {}
  void fork_parent() noexcept override {}
  void fork_child() noexcept override {
    ++fork_epoch_;
    new (&budget_) budget(options_.budget_bytes);  // single-threaded here; nothing else holds it
  }

  std::atomic<std::uint64_t>& counter_for(release_result result) noexcept {
    switch (result) {
      case release_result::released: return released_;
      case release_result::raced: return raced_;
      case release_result::not_dying: return not_dying_;
      case release_result::shared_mm: return shared_mm_;
      case release_result::unsupported: return unsupported_;
      case release_result::not_permitted: return not_permitted_;
      case release_result::failed: break;
    }
    return failed_;
  }

  const process_reaper_options options_;
  const std::uint64_t trace_domain_ = trace::new_domain();
  budget budget_;
  std::uint32_t fork_epoch_ = 0;  // fork children this object lives in; written only by fork_child
  event_count charge_returned_;  // notified after each charge goes back
  std::atomic<bool> mrelease_supported_{true};
  std::atomic<std::uint64_t> killed_{0};
  snapshot_count done_;
  std::atomic<std::uint64_t> released_{0};
  std::atomic<std::uint64_t> bytes_released_{0};
  std::atomic<std::uint64_t> raced_{0};
  std::atomic<std::uint64_t> not_dying_{0};
  std::atomic<std::uint64_t> shared_mm_{0};
  std::atomic<std::uint64_t> unsupported_{0};
  std::atomic<std::uint64_t> not_permitted_{0};
  std::atomic<std::uint64_t> failed_{0};
  std::atomic<std::uint64_t> retries_{0};
  std::atomic<std::uint64_t> over_budget_{0};
  // Last: destroyed first, so that its final drain finds everything above alive.
  reaper<item, &item::hook, finish_fn> reaper_;
};

inline bool process_reaper::kill(const pidfd_process& process, int signal) {
  if (!process) throw std::invalid_argument("teardown::process::process_reaper::kill: the process is empty");
  if (signal < 1 || signal > SIGRTMAX) {
    throw std::invalid_argument("teardown::process::process_reaper::kill: signal " + std::to_string(signal) +
                                " is outside [1, SIGRTMAX]");
  }
  // Everything that can fail comes before the signal, so a refusal changes nothing.
  auto killed = std::make_unique<item>();
  killed->pidfd = fcntl(process.fd(), F_DUPFD_CLOEXEC, 3);
  if (killed->pidfd < 0) detail::throw_system_error(errno, "process_reaper::kill: cannot copy the pidfd");
  killed->pid = process.pid();
  killed->signal = signal;
  // The RSS is read through the pid, then the pidfd is asked whether its process is still
  // there: an unreaped process keeps its pid, so the reading was that process's.
  const std::uint64_t bytes = detail::anonymous_rss_bytes(killed->pid);
  if (syscall(detail::nr_pidfd_send_signal, killed->pidfd, 0, nullptr, 0) != 0) {
    if (errno == ESRCH) return false;
    detail::throw_system_error(errno, "process_reaper::kill: pid " + std::to_string(killed->pid));
  }
  killed->bytes = bytes;
  killed->fork_epoch = fork_epoch_;
  killed->charged = budget_.try_reserve(bytes);
  // Released here (over budget) or the worker's: either way the release follows the signal at once.
  killed->signal_pending = options_.signal_on_worker;
  if (!killed->signal_pending) {
    if (syscall(detail::nr_pidfd_send_signal, killed->pidfd, signal, nullptr, 0) != 0) {
      const int error = errno;
      if (killed->charged) budget_.release(bytes);
      if (error == ESRCH) return false;
      detail::throw_system_error(error, "process_reaper::kill: pidfd_send_signal(" + std::to_string(signal) +
                                            ") to pid " + std::to_string(killed->pid));
    }
    killed->killed_ns = teardown::detail::monotonic_ns();
    trace::process_kill(killed->pid, bytes, signal, trace_domain_);
  }
  killed_.fetch_add(1, std::memory_order_relaxed);
  if (!killed->charged) {
    over_budget_.fetch_add(1, std::memory_order_relaxed);
    finish(*killed.release());  // here, on the caller: the back-pressure
    return true;
  }
  reaper_.enqueue(*killed.release());  // the worker deletes it
  return true;
}

// The protocol of "What the worker does with each killed process".
inline release_result process_reaper::release_memory(item& killed, std::uint32_t& tries) noexcept {
  const auto wait_for_exit = [&] { (void)detail::wait_for_exit(killed.pidfd, options_.exit_wait); };
  if (killed.signal_pending) {
    // kill() checked with signal 0 that the process was there and that we may signal it; what
    // changed since is counted, never thrown: a process reaped meanwhile (ESRCH) exited on its
    // own and is raced; a refusal now (its credentials changed) is not_permitted.
    if (syscall(detail::nr_pidfd_send_signal, killed.pidfd, killed.signal, nullptr, 0) != 0) {
      const int error = errno;
      if (error == ESRCH) return release_result::raced;
      return error == EPERM ? release_result::not_permitted : release_result::failed;
    }
    killed.killed_ns = teardown::detail::monotonic_ns();
    trace::process_kill(killed.pid, killed.bytes, killed.signal, trace_domain_);
  }
  if (!mrelease_supported_.load(std::memory_order_relaxed)) {
    wait_for_exit();
    return release_result::unsupported;
  }
  bool refused_after_sigkill = false;
  for (;;) {
    ++tries;
    errno = 0;
    if (options_.mrelease(killed.pidfd, 0) == 0) return release_result::released;
    const int error = errno;
    switch (error) {
      case ESRCH:
        // The process detached its mm first: its own exit frees (or freed) the memory. The
        // charge goes back once that exit has ended, so that bytes_in_teardown stays true.
        wait_for_exit();
        return refused_after_sigkill ? release_result::shared_mm : release_result::raced;
      case ENOSYS:
        mrelease_supported_.store(false, std::memory_order_relaxed);
        wait_for_exit();
        return release_result::unsupported;
      case EPERM:
      case EACCES:
        wait_for_exit();
        return release_result::not_permitted;
      case EINVAL:
      case EAGAIN:
      case EINTR:
        if (error == EINVAL && killed.signal == SIGKILL) refused_after_sigkill = true;
        if (tries > options_.retries) return error == EINVAL ? release_result::not_dying : release_result::failed;
        retries_.fetch_add(1, std::memory_order_relaxed);
        (void)detail::wait_for_exit(killed.pidfd, options_.retry_interval);  // returns early on exit
        break;
      default:
        return release_result::failed;
    }
  }
}

inline void process_reaper::finish(item& killed) noexcept {
  std::uint32_t tries = 0;
  const release_result result = release_memory(killed, tries);
  counter_for(result).fetch_add(1, std::memory_order_relaxed);
  if (result == release_result::released) bytes_released_.fetch_add(killed.bytes, std::memory_order_relaxed);
  const std::uint64_t now = teardown::detail::monotonic_ns();
  trace::process_release(killed.pid, killed.bytes, to_string(result), tries,
                         now > killed.killed_ns ? now - killed.killed_ns : 0, trace_domain_);
  const bool charged = killed.charged && killed.fork_epoch == fork_epoch_;  // see fork_child
  const std::uint64_t bytes = killed.bytes;
  delete &killed;  // closes our copy of the pidfd
  if (charged) budget_.release(bytes);
  // Last: a snapshot that sees this item done sees its counters, and sees it killed.
  done_.add_last();
  charge_returned_.notify_all();  // after the budget's release: see "No lost wake-up"
}

template <class Rep, class Period>
bool process_reaper::wait_for_budget(std::uint64_t bytes, std::chrono::duration<Rep, Period> timeout) {
  if (reaper_.in_own_callback()) {
    throw std::logic_error("teardown::process::process_reaper::wait_for_budget: called from the worker; it would "
                           "wait for itself");
  }
  const auto deadline = teardown::detail::deadline_after(timeout);
  // Once the wait passes the worker's boost_after, the worker runs at this thread's nice until
  // it is drained (docs/design.md, "Boost").
  const auto boost_at = std::chrono::steady_clock::now() + reaper_options{}.boost_after;
  bool boosted = false;
  for (;;) {
    // The key first, then the budget (event_count.hpp): a release after the key wakes the wait.
    const event_count::key seen = charge_returned_.prepare_wait();
    if (budget_.pending() <= bytes) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    if (!boosted && now >= boost_at) {
      boosted = true;
      (void)teardown::detail::boost_for_waiter(reaper_, "budget");
    }
    if (boosted) {
      // No raise in force (an ordinary user's worker): the kills still queued are made and
      // released here ("Waiters help"), then the wait goes on for what the worker holds.
      teardown::detail::help_for_waiter(reaper_);
      if (budget_.pending() <= bytes) return true;
    }
    const auto wake_at = boosted ? std::min(deadline, std::chrono::steady_clock::now() + reaper_options{}.boost_after)
                                 : std::min(deadline, boost_at);
    const auto left = wake_at == std::chrono::steady_clock::time_point::max()
                          ? std::chrono::nanoseconds(std::chrono::seconds(1))
                          : std::chrono::duration_cast<std::chrono::nanoseconds>(wake_at - now);
    charge_returned_.wait_for(seen, static_cast<std::uint64_t>(left.count()));
  }
}

inline process_reaper_stats process_reaper::stats() const noexcept {
  process_reaper_stats s;
  // First (snapshot_count.hpp), so killed (read after) is at least done.
  const std::uint64_t done = done_.read_first();
  s.released = released_.load(std::memory_order_relaxed);
  s.bytes_released = bytes_released_.load(std::memory_order_relaxed);
  s.raced = raced_.load(std::memory_order_relaxed);
  s.not_dying = not_dying_.load(std::memory_order_relaxed);
  s.shared_mm = shared_mm_.load(std::memory_order_relaxed);
  s.unsupported = unsupported_.load(std::memory_order_relaxed);
  s.not_permitted = not_permitted_.load(std::memory_order_relaxed);
  s.failed = failed_.load(std::memory_order_relaxed);
  s.retries = retries_.load(std::memory_order_relaxed);
  s.over_budget = over_budget_.load(std::memory_order_relaxed);
  s.killed = killed_.load(std::memory_order_relaxed);
  s.pending = s.killed > done ? s.killed - done : 0;
  s.bytes_in_teardown = budget_.pending();
  s.mrelease_supported = mrelease_supported_.load(std::memory_order_relaxed);
  s.worker = reaper_.stats();
  return s;
}

}  // namespace teardown::process
