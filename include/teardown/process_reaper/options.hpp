// teardown/process_reaper/options.hpp — process_reaper's options, its statistics and what
// the worker made of each killed process (release_result). Part of process_reaper.hpp, which is
// the header to include; the contract, and what each release_result means, is there.
//
// Who may call what: plain data; to_string and process_mrelease_syscall any thread
// (async-signal-safe: a switch, one system call).
// Design: docs/design.md, "Processes: the supervisor's side (process_reaper.hpp, Linux)".
#pragma once

#if !defined(__linux__)
#error "teardown/process_reaper/options.hpp: Linux only (process_mrelease)"
#endif

#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "teardown/budget.hpp"
#include "teardown/detail/pidfd.hpp"
#include "teardown/reaper.hpp"

namespace teardown::process {

/// What the worker made of one killed process; each is counted once in stats(). In every case
/// the charge is released when the worker is done with the process, and its copy of the pidfd
/// closed; the reaper never reaps (waits for) a process: that stays the owner's job.
///   released       process_mrelease returned 0: the anonymous memory is reaped (bytes_released
///                  adds the charge).
///   raced          ESRCH: the process had already detached its mm (its exit had reached
///                  exit_mm) or was gone: its own exit frees the memory. Never retried; the charge
///                  goes back once the exit has ended (the pidfd polls readable, at most
///                  exit_wait), so bytes_in_teardown stays true.
///   not_dying      EINVAL, still after options.retries further tries, each after a wait of up
///                  to retry_interval on the pidfd: the signal did not kill it (a handled
///                  SIGTERM, a pid namespace's init). The charge goes back.
///   shared_mm      EINVAL after SIGKILL, then ESRCH once the victim exited: another process
///                  that is not exiting shares the mm (a CLONE_VM helper, a vfork child); it
///                  frees the memory when it exits. After any other signal this counts as raced.
///   unsupported    ENOSYS (Linux before 5.15, a seccomp filter): the worker waits on the pidfd
///                  for the exit instead (at most exit_wait) and calls process_mrelease no more
///                  (stats().mrelease_supported turns false).
///   not_permitted  EPERM or EACCES (an LSM, a seccomp filter): waits for the exit, as above.
///   failed         anything else (EAGAIN or EINTR still after the retries, EBADF).
enum class release_result : std::uint8_t {
  released,
  raced,
  not_dying,
  shared_mm,
  unsupported,
  not_permitted,
  failed,
};

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


inline int process_mrelease_syscall(int pidfd, unsigned flags) noexcept {
  return static_cast<int>(syscall(detail::nr_process_mrelease, pidfd, flags));
}

}  // namespace teardown::process
