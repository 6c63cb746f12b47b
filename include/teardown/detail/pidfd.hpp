// teardown/detail/pidfd.hpp — the pidfd system calls' numbers, for process.hpp and
// process_reaper.hpp. Internal: not part of the API.
//
// The same numbers on every architecture this library builds for (the unified syscall table
// from Linux 5.1 on); older C library headers lack the SYS_ names.
// Design: docs/design.md, "The shared internal layer".
#pragma once

namespace teardown::process::detail {

inline constexpr long nr_pidfd_send_signal = 424;  // Linux 5.1
inline constexpr long nr_pidfd_open = 434;         // Linux 5.3
inline constexpr long nr_process_mrelease = 448;   // Linux 5.15
inline constexpr int waitid_by_pidfd = 3;          // P_PIDFD for waitid, Linux 5.4

}  // namespace teardown::process::detail
