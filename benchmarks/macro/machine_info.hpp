// What machine a macro benchmark ran on, read from /proc and uname: shared by exit_matrix,
// pool_bench, process_bench, mm_reaper_tradeoffs and oom_reap_bench, which record it beside their
// figures.
#pragma once

#include <sys/utsname.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>

namespace teardown_bench {

// The first line of a file ("" if it cannot be read): /proc/loadavg, a sysfs setting.
inline std::string first_line(const char* path) {
  std::ifstream file(path);
  std::string line;
  std::getline(file, line);
  return line;
}

// The CPU's model name from /proc/cpuinfo ("model name" on x86, "Model" on some ARM kernels),
// or "unknown".
inline std::string cpu_model() {
  std::ifstream file("/proc/cpuinfo");
  for (std::string line; std::getline(file, line);) {
    if (line.starts_with("model name") || line.starts_with("Model")) {
      const std::size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      const std::size_t start = line.find_first_not_of(" \t", colon + 1);
      return start == std::string::npos ? std::string() : line.substr(start);
    }
  }
  return "unknown";
}

// The running kernel's release (uname -r).
inline std::string kernel_release() {
  utsname uts{};
  uname(&uts);
  return uts.release;
}

// The 1-minute load average, or NaN. Other work on the machine stretches a nice-19 reaper's share
// of a CPU, so a figure means more beside it.
inline double load_average_1m() {
  double load[1] = {NAN};
  return getloadavg(load, 1) == 1 ? load[0] : NAN;
}

// A "Key: value kB" line of /proc/meminfo, in bytes; 0 if the key is absent. `key` includes the
// colon ("MemAvailable:"), so that "MemTotal:" cannot match a longer name.
inline std::uint64_t meminfo_bytes(std::string_view key) {
  std::ifstream file("/proc/meminfo");
  for (std::string line; std::getline(file, line);) {
    if (line.starts_with(key)) return std::strtoull(line.c_str() + key.size(), nullptr, 10) * 1024;
  }
  return 0;
}

}  // namespace teardown_bench
