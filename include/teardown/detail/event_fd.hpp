// teardown/detail/event_fd.hpp — an eventfd (EFD_CLOEXEC | EFD_NONBLOCK) that one thread polls
// and another writes to wake it: pressure_monitor's stop. Internal: not part of the API.
//
// Who may call what: open and close, the owner only (not concurrently with notify); notify, any
// thread (async-signal-safe: one write(2)); fd, any thread once open returned.
// Memory ordering: none of its own. The write and the poll that sees it are a system call pair;
// what the writer did before notify is visible to the thread it wakes only through the owner's
// own synchronization (pressure_monitor: the join that follows).
// Design: docs/design.md, "The shared internal layer".
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <system_error>

namespace teardown::detail {

class event_fd {
 public:
  // Throws std::system_error(errno, `what`) if the kernel refuses.
  void open(const std::string& what) {
    fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd_ < 0) throw std::system_error(errno, std::generic_category(), what);
  }
  // Adds one: the fd polls readable from then on. EINTR restarts; false if the write failed.
  bool notify() const noexcept {
    const std::uint64_t one = 1;
    for (;;) {
      const ssize_t written = ::write(fd_, &one, sizeof one);
      if (written < 0 && errno == EINTR) continue;
      return written == static_cast<ssize_t>(sizeof one);
    }
  }
  void close() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd() const noexcept { return fd_; }

 private:
  int fd_ = -1;
};

}  // namespace teardown::detail
