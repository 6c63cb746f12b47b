// teardown/process_reaper.hpp — the supervisor's side of real processes (Linux): kill a process
// through a pidfd, and give its memory back from a worker of ours while it exits.
//
//     teardown::process::process_reaper reaper({.budget_bytes = 4ull << 30});
//     auto child = teardown::process::pidfd_process::spawn([] { return run_service(); });
//     ...
//     reaper.kill(child);                             // SIGKILL; the worker calls process_mrelease
//     child.wait();                                   // reap it (our child)
//     reaper.wait_for_budget(1ull << 30, 30s);        // at most 1 GiB still coming back: respawn
//
// A killed process frees its address space on its own exit path, one page table at a time:
// SIGKILL to waitpid of a 2 GiB child takes 0.6 to 0.7 s. process_mrelease(pidfd) (Linux 5.15)
// lets another task reap the anonymous memory of a process that is dying, the way the kernel's
// oom_reaper does, concurrently with the victim's own exit: measured on the same child, 0.34 s
// with the call made from another thread right after the kill. Android's lmkd does this (kill by
// pidfd_send_signal, then process_mrelease from a small thread pool). process_reaper is that, on
// a library reaper (reaper.hpp): a lock-free enqueue, a worker that blocks signals, a budget of
// the bytes in teardown, counters and trace points. docs/design.md, "Processes: the supervisor's
// side", has the reasoning; this comment is the contract.
//
// Who may call what (none of it is async-signal-safe: kill allocates, the rest may block)
//   pidfd_process::spawn    any thread. fork(), then pidfd_open in the parent while the child
//                           waits for a byte on a socket: the pidfd names the child before the
//                           child can exit, so no other waiter (SIGCHLD set to SIG_IGN, a thread's
//                           wait(-1)) can reap it and hand its pid to another process first. The
//                           child runs child_main() and _exits with its result (0 for void, 127
//                           if it throws); fork() runs the atfork handlers, this library's
//                           included. pthread_exit() in child_main is not caught: its unwind
//                           goes on through the frames the child copied from the caller, and
//                           the child ends as a last thread's pthread_exit ends a process.
//                           Throws std::system_error, leaving nothing behind.
//   pidfd_process::adopt    any thread: pidfd_open(pid). Any process we may see, child or not.
//                           Throws std::invalid_argument for pid <= 0, std::system_error (ESRCH:
//                           no such process) otherwise.
//   send_signal, exited,    any thread, one object at a time (it is not synchronized); may block
//   wait, try_wait          only in wait(). wait/try_wait reap our own child (waitid P_PIDFD);
//                           for a process that is not our child they throw std::system_error
//                           ECHILD saying so (poll fd(), or exited(), for any process).
//   ~pidfd_process          closes the pidfd. It never kills and never reaps: a child it names
//                           stays a zombie until someone waits for it.
//   process_reaper::kill    any thread, concurrently; not from the reaper's own callback (a trace
//                           hook). Reads the anonymous RSS (a live thread's when the main
//                           thread has exited), charges it, checks with signal 0 that the
//                           process is there and may be signalled, and enqueues (lock-free) a
//                           copy of the pidfd; returns at once. The worker sends the signal and
//                           calls process_mrelease right after (lmkd's order, which wins the race
//                           with the victim's exit; options.signal_on_worker = false sends it
//                           here instead). When the charge does not fit the budget, signal and
//                           release run here, on the caller, before kill returns (counted in
//                           over_budget): that is the back-pressure. After stop(), and in a fork
//                           child, they run here too.
//   flush, stop             any thread but the worker; block (flush: until every process killed
//                           before the call is done; stop: the same, then joins the worker).
//   wait_for_budget         any thread but the worker; blocks until bytes_in_teardown() <= bytes
//                           or the timeout. No lock: a futex on a word bumped after each release.
//                           A wait longer than 10 ms raises the worker to the waiter's nice until
//                           it is drained (reaper.hpp, "Boost"; a worker at nice 0, the default,
//                           is raised only by a waiter of negative nice).
//   stats, bytes_in_teardown, trace_domain   any thread; wait-free snapshots.
//   destructor              stop(): every process queued is still released, on the worker.
//
// What the worker does with each killed process (the edge cases, each counted once in stats):
//   released       process_mrelease returned 0: the anonymous memory is reaped (bytes_released
//                  adds the charge).
//   raced          ESRCH: the process had already detached its mm (its exit had reached
//                  exit_mm: tens of microseconds after SIGKILL when it gets a CPU at once) or was
//                  gone: its own exit is freeing the memory, and the call cannot help. Never
//                  retried; the charge goes back once the exit has ended (the pidfd polls
//                  readable, at most exit_wait), so bytes_in_teardown stays true. Which of
//                  released and raced a SIGKILL gets is a race between the victim reaching
//                  exit_mm and the worker's call: the counters say how often each won.
//   not_dying      EINVAL, still after options.retries further tries, each after a wait of up
//                  to retry_interval on the pidfd (which ends as soon as the process exits): the
//                  signal did not kill it (a handled SIGTERM, a pid namespace's init). Nothing is
//                  in teardown; the charge goes back.
//   shared_mm      EINVAL after SIGKILL, and then ESRCH once the victim exited: SIGKILL marks the
//                  whole process as exiting before pidfd_send_signal returns, so the kernel
//                  refused because another process that is not exiting shares the mm (a CLONE_VM
//                  helper, such as enable_shadow_teardown()'s, or a vfork child). That process
//                  frees the memory when it exits; the library cannot see when. After any other
//                  signal the two causes look alike, and such a victim counts as raced. A
//                  victim that has not detached within the retries counts as not_dying.
//   unsupported    ENOSYS (Linux before 5.15, or a seccomp filter): the worker waits on the pidfd
//                  for the exit instead (at most exit_wait), and calls process_mrelease no more
//                  (stats().mrelease_supported turns false).
//   not_permitted  EPERM or EACCES (an LSM, a seccomp filter): waits for the exit, as above.
//   failed         anything else (EAGAIN or EINTR still after the retries, EBADF).
// In every case the charge is released when the worker is done with the process, and the copy
// of the pidfd closed. The reaper never reaps (waits for) a process: that stays the owner's job.
//
// No lost wake-up in wait_for_budget: the worker releases a charge, then bumps the word with a
// release RMW and wakes every waiter; a waiter reads the word with acquire, then the budget, and
// sleeps only while the word still holds what it read. So a release that the waiter's budget
// read missed bumped the word after the waiter's read of it, and the futex does not sleep.
//
// Memory ordering: the items travel through the reaper's llist (release add, acquire del_all),
// so the worker sees the pidfd and the charge kill wrote. Counters are relaxed, but done_ is
// added last with release and read first with acquire, so pending (killed - done) is never
// negative in a snapshot. The budget is relaxed (budget.hpp); the word above orders it.
//
// Signals and fork: the worker is a reaper's, started with every signal blocked. fork() waits
// for nothing of the worker's, not even a release that waits for its victim's exit (reaper.hpp,
// "Fork": fork_policy::never_wait). In a fork child this reaper releases inline; the processes
// still queued at the fork are released there too, and those the worker had taken are left to
// the parent. The child's budget starts empty: bytes_in_teardown() and wait_for_budget there
// count only what the child killed. The pidfds it holds are close-on-exec.
#pragma once

#if !defined(__linux__)
#error "teardown/process_reaper.hpp: Linux only (pidfd_open, pidfd_send_signal, process_mrelease)"
#endif

#include <cxxabi.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>

#include "teardown/budget.hpp"
#include "teardown/detail/pidfd.hpp"
#include "teardown/llist.hpp"
#include "teardown/reaper.hpp"
#include "teardown/trace.hpp"
#include "teardown/worker_thread.hpp"

namespace teardown::process {

/// How a process ended: exit_code >= 0 if it called exit, else the signal that killed it.
struct exit_status {
  int exit_code = -1;
  int signal = 0;
};

/// A process named by a pidfd, which keeps naming it (and only it) after its pid is reused.
/// Move-only; the destructor closes the pidfd and does nothing else (see "Who may call what").
class pidfd_process {
 public:
  pidfd_process() noexcept = default;
  pidfd_process(pidfd_process&& other) noexcept
      : fd_(std::exchange(other.fd_, -1)), pid_(std::exchange(other.pid_, 0)), status_(other.status_) {}
  pidfd_process& operator=(pidfd_process&& other) noexcept {
    if (this != &other) {
      close_fd();
      fd_ = std::exchange(other.fd_, -1);
      pid_ = std::exchange(other.pid_, 0);
      status_ = other.status_;
    }
    return *this;
  }
  pidfd_process(const pidfd_process&) = delete;
  pidfd_process& operator=(const pidfd_process&) = delete;
  ~pidfd_process() { close_fd(); }

  /// Forks a child that runs child_main() and _exits with its result (int, or 0 for void; 127
  /// if it throws; pthread_exit() is let through). The child must keep to what a fork child of
  /// a threaded program may do.
  template <class F>
  static pidfd_process spawn(F&& child_main);

  /// pidfd_open(pid): any process we may see, our child or not.
  static pidfd_process adopt(pid_t pid);

  pid_t pid() const noexcept { return pid_; }
  int fd() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }

  /// pidfd_send_signal. False if the process is gone (reaped); a zombie takes the signal (and
  /// ignores it). Throws std::system_error for EPERM and the like, std::logic_error when empty.
  bool send_signal(int signal) const;

  /// True once the process has exited (the pidfd polls readable); for any process. Wait-free
  /// apart from one poll system call.
  bool exited() const;

  /// Blocks until our child exits, reaps it and returns how it ended (again on later calls).
  /// std::system_error ECHILD for a process that is not our child (or was reaped by someone
  /// else), std::logic_error when empty.
  exit_status wait();
  /// wait() without blocking: nullopt while the child runs.
  std::optional<exit_status> try_wait();

 private:
  pidfd_process(int fd, pid_t pid) noexcept : fd_(fd), pid_(pid) {}
  std::optional<exit_status> wait_with(int options, const char* who);
  void require(const char* who) const;
  void close_fd() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  int fd_ = -1;
  pid_t pid_ = 0;
  std::optional<exit_status> status_{};  // set once wait() reaped the child
};

/// What the worker made of one killed process (see "What the worker does" above).
enum class release_result : std::uint8_t { released, raced, not_dying, shared_mm, unsupported, not_permitted, failed };

inline const char* to_string(release_result result) noexcept {
  switch (result) {
    case release_result::released: return "released";
    case release_result::raced: return "raced";
    case release_result::not_dying: return "not_dying";
    case release_result::shared_mm: return "shared_mm";
    case release_result::unsupported: return "unsupported";
    case release_result::not_permitted: return "not_permitted";
    case release_result::failed: return "failed";
  }
  return "unknown";
}

/// process_mrelease(2) itself: 0, or -1 with errno set. The default of
/// process_reaper_options::mrelease.
inline int process_mrelease_syscall(int pidfd, unsigned flags) noexcept;

/// Checked by the constructor, which throws std::invalid_argument naming the field and starts
/// nothing: an empty name or one holding a NUL byte, nice outside [-20, 19], budget_bytes above
/// budget::max_cap, a negative retry_interval or exit_wait, a null mrelease.
struct process_reaper_options {
  std::string name = "process_reaper";  // the worker thread's name (Linux keeps 15 bytes)
  int nice = 0;  // the worker's nice value: 0, not the reaper's 19, because memory coming back
                 // sooner is the point (lmkd's reapers run at its own priority)
  std::uint64_t budget_bytes = budget::max_cap;  // bytes in teardown at most; a kill whose
                                                 // charge does not fit releases on the caller
  std::uint32_t retries = 50;  // further process_mrelease calls after EINVAL, EAGAIN or EINTR
  std::chrono::nanoseconds retry_interval = std::chrono::milliseconds(2);  // the wait on the
                               // pidfd before each retry; ends early when the process exits
  std::chrono::nanoseconds exit_wait = std::chrono::seconds(30);  // ENOSYS / EPERM: how long
                               // the worker waits for the exit before it lets the charge go
  // The call itself: for tests (inject ENOSYS, EPERM, ESRCH) and for programs whose seccomp
  // filter or kernel needs another route. Called on the worker (or inline); 0 or -1 and errno.
  int (*mrelease)(int pidfd, unsigned flags) = &process_mrelease_syscall;
  // Who sends the signal. true (lmkd's order): the worker, right before process_mrelease. It is
  // already running when the victim starts to die, so its call reaches the mm before the
  // victim's exit detaches it (else the call finds no mm: raced, and the exit frees it alone).
  // The price: kill() returns before the signal is sent, and a kill queued behind a release in
  // progress waits for it. false: kill() sends it on the caller, and the worker races the exit.
  bool signal_on_worker = true;
};

struct process_reaper_stats {
  std::uint64_t killed = 0;          // processes kill() took (the signal: its or the worker's)
  std::uint64_t released = 0;        // process_mrelease reaped the mm
  std::uint64_t bytes_released = 0;  // the charges of those
  std::uint64_t raced = 0;           // ESRCH: gone before the call
  std::uint64_t not_dying = 0;       // EINVAL after every retry
  std::uint64_t shared_mm = 0;       // another process shares the mm
  std::uint64_t unsupported = 0;     // ENOSYS: waited for the exit instead
  std::uint64_t not_permitted = 0;   // EPERM / EACCES: waited for the exit instead
  std::uint64_t failed = 0;          // any other error
  std::uint64_t retries = 0;         // process_mrelease calls beyond the first, all processes
  std::uint64_t over_budget = 0;     // released on kill()'s caller: the charge did not fit
  std::uint64_t pending = 0;         // killed, not yet done (a snapshot)
  std::uint64_t bytes_in_teardown = 0;  // charged, not yet released
  bool mrelease_supported = true;    // false once the call said ENOSYS
  reaper_stats worker{};             // the underlying reaper's
};

class process_reaper;

// ---- end of the public interface ------------------------------------------------------------

namespace detail {

[[noreturn]] inline void throw_system_error(int error, const std::string& what) {
  throw std::system_error(error, std::generic_category(), "teardown::process::" + what);
}

// The pidfd's process has exited: the pidfd polls readable. Waits at most `timeout` (0: a
// look). EINTR restarts with what is left.
inline bool wait_for_exit(int pidfd, std::chrono::nanoseconds timeout) noexcept {
  const std::uint64_t until = teardown::detail::monotonic_ns() + static_cast<std::uint64_t>(timeout.count());
  for (;;) {
    const std::uint64_t now = teardown::detail::monotonic_ns();
    const std::uint64_t left = now < until ? until - now : 0;
    timespec limit{static_cast<time_t>(left / 1'000'000'000u), static_cast<long>(left % 1'000'000'000u)};
    pollfd poll_fd{pidfd, POLLIN, 0};
    const int ready = ppoll(&poll_fd, 1, &limit, nullptr);
    if (ready > 0) return true;
    if (ready == 0 || errno != EINTR) return false;
  }
}

// One statm file's resident minus shared, in pages; false if it cannot be read.
inline bool statm_anonymous_pages(const char* path, std::uint64_t& pages) noexcept {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char text[160];
  ssize_t got = 0;
  do {
    got = ::read(fd, text, sizeof text - 1);
  } while (got < 0 && errno == EINTR);
  ::close(fd);
  if (got <= 0) return false;
  text[got] = '\0';
  unsigned long long size = 0, resident = 0, shared = 0;
  if (std::sscanf(text, "%llu %llu %llu", &size, &resident, &shared) != 3 || shared > resident) return false;
  pages = resident - shared;
  return true;
}

// The process's anonymous RSS in bytes (statm's resident minus shared: what a reap can free),
// 0 if /proc cannot tell. The caller checks afterwards that the pid still named its process.
// /proc/PID/statm is the thread group leader's: once the main thread has exited
// (pthread_exit) it reads zero while the other threads keep the mm. Every thread shares that
// mm, so a live one's task/TID/statm tells instead.
inline std::uint64_t anonymous_rss_bytes(pid_t pid) noexcept {
  const auto page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%ld/statm", static_cast<long>(pid));
  std::uint64_t pages = 0;
  if (statm_anonymous_pages(path, pages) && pages != 0) return pages * page;
  std::snprintf(path, sizeof path, "/proc/%ld/task", static_cast<long>(pid));
  DIR* tasks = ::opendir(path);
  if (tasks == nullptr) return 0;
  std::uint64_t most = 0;
  while (const dirent* entry = ::readdir(tasks)) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    std::snprintf(path, sizeof path, "/proc/%ld/task/%.20s/statm", static_cast<long>(pid), entry->d_name);
    // A thread that exited reads zero; any live one reads the mm's.
    if (statm_anonymous_pages(path, pages) && pages > most) most = pages;
  }
  ::closedir(tasks);
  return most * page;
}

inline void futex_wake_all(std::atomic<std::uint32_t>& word) noexcept {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

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

namespace detail {

// The child's side of spawn: child_main's result, 127 if it throws. pthread_exit() (or a
// cancellation) unwinds with abi::__forced_unwind, which the runtime aborts the process for if it
// is caught and not rethrown: it goes on, and the thread ends as asked. The ABI makes that
// exception's object null, so binding the handler's reference trips UBSan's null check, which
// is off here for that alone (GCC turns UBSan off only whole).
template <class F>
#if defined(__clang__)
__attribute__((no_sanitize("null")))
#else
__attribute__((no_sanitize_undefined))
#endif
int run_child_main(F& child_main) {
  try {
    if constexpr (std::is_void_v<std::invoke_result_t<F&>>) {
      child_main();
      return 0;
    } else {
      return static_cast<int>(child_main());
    }
#if defined(__GLIBCXX__)
  } catch (abi::__forced_unwind&) {  // libstdc++ only: libc++abi never enters a handler for it
    throw;
#endif
  } catch (const std::exception& error) {
    std::fprintf(stderr, "teardown::process::pidfd_process::spawn: the child threw: %s\n", error.what());
  } catch (...) {
    std::fprintf(stderr, "teardown::process::pidfd_process::spawn: the child threw\n");
  }
  return 127;
}

}  // namespace detail

inline int process_mrelease_syscall(int pidfd, unsigned flags) noexcept {
  return static_cast<int>(syscall(detail::nr_process_mrelease, pidfd, flags));
}

// ---- pidfd_process ----------------------------------------------------------------------------

template <class F>
pidfd_process pidfd_process::spawn(F&& child_main) {
  // The child waits for one byte: sent once the pidfd exists. A socket, not a pipe, so that the
  // send cannot raise SIGPIPE (MSG_NOSIGNAL) if the child was killed meanwhile; and a byte, not
  // EOF, so that a copy of our end leaked into a concurrent fork cannot hold the child up.
  int go[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, go) != 0) {
    detail::throw_system_error(errno, "pidfd_process::spawn: socketpair");
  }
  std::fflush(nullptr);  // else the child's exit would write our buffered output a second time
  const pid_t pid = fork();
  if (pid < 0) {
    const int error = errno;
    ::close(go[0]);
    ::close(go[1]);
    detail::throw_system_error(error, "pidfd_process::spawn: fork");
  }
  if (pid == 0) {
    ::close(go[0]);
    char byte = 0;
    ssize_t got = 0;
    do {
      got = ::recv(go[1], &byte, 1, 0);
    } while (got < 0 && errno == EINTR);
    ::close(go[1]);
    if (got != 1) _exit(127);  // the parent gave up
    const int code = detail::run_child_main(child_main);
    std::fflush(nullptr);
    _exit(code);
  }
  ::close(go[1]);
  const long fd = syscall(detail::nr_pidfd_open, pid, 0);
  if (fd < 0) {
    const int error = errno;
    ::kill(pid, SIGKILL);  // still our unreaped child: the pid is still its own
    ::close(go[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    detail::throw_system_error(error, "pidfd_process::spawn: pidfd_open");
  }
  const char byte = 1;
  while (::send(go[0], &byte, 1, MSG_NOSIGNAL) < 0 && errno == EINTR) {
  }
  ::close(go[0]);  // a child killed meanwhile: the send failed, and the pidfd still names it
  return pidfd_process(static_cast<int>(fd), pid);
}

inline pidfd_process pidfd_process::adopt(pid_t pid) {
  if (pid <= 0) {
    throw std::invalid_argument("teardown::process::pidfd_process::adopt: pid " + std::to_string(pid) +
                                " names no single process");
  }
  const long fd = syscall(detail::nr_pidfd_open, pid, 0);
  if (fd < 0) detail::throw_system_error(errno, "pidfd_process::adopt: pidfd_open(" + std::to_string(pid) + ")");
  return pidfd_process(static_cast<int>(fd), pid);
}

inline void pidfd_process::require(const char* who) const {
  if (fd_ < 0) {
    throw std::logic_error(std::string("teardown::process::pidfd_process::") + who + ": the object names no process");
  }
}

inline bool pidfd_process::send_signal(int signal) const {
  require("send_signal");
  if (syscall(detail::nr_pidfd_send_signal, fd_, signal, nullptr, 0) == 0) return true;
  if (errno == ESRCH) return false;
  detail::throw_system_error(errno, "pidfd_process::send_signal(" + std::to_string(signal) + ") to pid " +
                                 std::to_string(pid_));
}

inline bool pidfd_process::exited() const {
  require("exited");
  return detail::wait_for_exit(fd_, std::chrono::nanoseconds(0));
}

inline exit_status pidfd_process::wait() { return *wait_with(0, "wait"); }

inline std::optional<exit_status> pidfd_process::try_wait() { return wait_with(WNOHANG, "try_wait"); }

inline std::optional<exit_status> pidfd_process::wait_with(int options, const char* who) {
  require(who);
  if (status_) return status_;
  siginfo_t info{};
  // __WALL: a child whose exit signal is not SIGCHLD (a CLONE_VM helper) is waited for too.
  while (syscall(SYS_waitid, detail::waitid_by_pidfd, fd_, &info, WEXITED | __WALL | options, nullptr) != 0) {
    if (errno == EINTR) continue;
    if (errno == ECHILD) {
      detail::throw_system_error(ECHILD, std::string("pidfd_process::") + who + ": pid " + std::to_string(pid_) +
                                      " is not a child of this process, or was reaped by someone else; "
                                      "wait for any process's exit with exited() or by polling fd()");
    }
    detail::throw_system_error(errno, std::string("pidfd_process::") + who + ": waitid");
  }
  if (info.si_pid == 0) return std::nullopt;  // WNOHANG: still running
  exit_status status;
  if (info.si_code == CLD_EXITED) {
    status.exit_code = info.si_status;
  } else {
    status.signal = info.si_status;
  }
  status_ = status;
  return status_;
}

// ---- process_reaper ---------------------------------------------------------------------------

class process_reaper final : private teardown::detail::fork_participant {
 public:
  /// Starts the worker. std::invalid_argument for bad options (starting nothing), see
  /// process_reaper_options; std::system_error if the thread cannot start.
  explicit process_reaper(process_reaper_options options = {})
      : options_(validated(std::move(options))),
        budget_(options_.budget_bytes),
        reaper_(finish_fn{this}, reaper_options{.name = options_.name, .nice = options_.nice, .trace_domain = trace_domain_}) {
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

  /// Blocks until bytes_in_teardown() <= bytes, at most `timeout`; true if it got there.
  template <class Rep, class Period>
  bool wait_for_budget(std::uint64_t bytes, std::chrono::duration<Rep, Period> timeout);

  /// The charges of the processes killed and not yet done. Wait-free.
  std::uint64_t bytes_in_teardown() const noexcept { return budget_.pending(); }
  /// Wait-free snapshot; counters are read one by one.
  process_reaper_stats stats() const noexcept;
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
  std::atomic<std::uint32_t> released_word_{0};  // bumped after each charge goes back
  std::atomic<bool> mrelease_supported_{true};
  std::atomic<std::uint64_t> killed_{0};
  std::atomic<std::uint64_t> done_{0};
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
  // release: pairs with the acquire in stats(): a snapshot that sees this item done sees its
  // counters, and sees it killed.
  done_.fetch_add(1, std::memory_order_release);
  // release: pairs with wait_for_budget's acquire load (see "No lost wake-up").
  released_word_.fetch_add(1, std::memory_order_release);
  detail::futex_wake_all(released_word_);
}

template <class Rep, class Period>
bool process_reaper::wait_for_budget(std::uint64_t bytes, std::chrono::duration<Rep, Period> timeout) {
  if (reaper_.in_own_callback()) {
    throw std::logic_error("teardown::process::process_reaper::wait_for_budget: called from the worker; it would "
                           "wait for itself");
  }
  const auto deadline = teardown::detail::deadline_after(timeout);
  // Once the wait passes the worker's boost_after, the worker runs at this thread's nice until
  // it is drained (reaper.hpp, "Boost").
  const auto boost_at = std::chrono::steady_clock::now() + reaper_options{}.boost_after;
  bool boosted = false;
  for (;;) {
    // acquire: pairs with finish()'s release bump, so the budget read below sees its release.
    const std::uint32_t seen = released_word_.load(std::memory_order_acquire);
    if (budget_.pending() <= bytes) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    if (!boosted && now >= boost_at) {
      boosted = true;
      (void)teardown::detail::boost_for_waiter(reaper_, "budget");
    }
    const auto wake_at = boosted ? deadline : std::min(deadline, boost_at);
    const auto left = wake_at == std::chrono::steady_clock::time_point::max()
                          ? std::chrono::nanoseconds(std::chrono::seconds(1))
                          : std::chrono::duration_cast<std::chrono::nanoseconds>(wake_at - now);
    teardown::detail::futex_wait_for(released_word_, seen, static_cast<std::uint64_t>(left.count()));
  }
}

inline process_reaper_stats process_reaper::stats() const noexcept {
  process_reaper_stats s;
  // acquire: pairs with finish()'s release; read first, so killed (read after) is at least done.
  const std::uint64_t done = done_.load(std::memory_order_acquire);
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
