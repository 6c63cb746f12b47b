// teardown/process_reaper/pidfd_process.hpp — a process named by a pidfd (Linux): spawn a
// child or adopt any process, signal it, see its exit, reap our own child. Part of
// process_reaper.hpp, which is the header to include; the contract is there.
//
// Who may call what: spawn and adopt, any thread; one object's members, one thread at a time
// (the object is not synchronized). wait() blocks; the rest make one system call each. Errors
// throw std::system_error ("teardown::process::pidfd_process::<call>: ..."), std::logic_error
// for an empty object, std::invalid_argument for adopt(pid <= 0).
// Design: docs/design.md, "Processes: the supervisor's side (process_reaper.hpp, Linux)".
#pragma once

#if !defined(__linux__)
#error "teardown/process_reaper/pidfd_process.hpp: Linux only (pidfd_open, pidfd_send_signal)"
#endif

#include <cxxabi.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>

#include "teardown/detail/clock.hpp"
#include "teardown/detail/pidfd.hpp"

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

}  // namespace teardown::process
