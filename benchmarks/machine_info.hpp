// What machine a macro benchmark ran on, read from /proc: shared by exit_matrix, rfc_questions
// and oom_reap_bench, which record it beside their figures.
#pragma once

#include <fstream>
#include <string>

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

}  // namespace teardown_bench
