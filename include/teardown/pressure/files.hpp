// teardown/pressure/files.hpp — what pressure_monitor reads and writes besides its poll loop:
// a whole write (the PSI trigger line), /proc/meminfo's two numbers, one sampled cgroup level.
// Internal: part of pressure.hpp.
//
// Who may call what: any thread; no allocation in write_all and read_meminfo (line_reader reads
// into a fixed buffer), so they are safe on the monitor thread in any state.
// Design: docs/design.md, "Memory pressure: pressure.hpp and pressure_policy.hpp".
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "teardown/memory_limit.hpp"

namespace teardown {

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

}  // namespace teardown
