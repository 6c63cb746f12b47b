// teardown/detail/cpus.hpp — CPU sets: the kernel's CPU list format, and the CPUs a worker
// prefers (online, minus isolcpus= and nohz_full=, within this process's mask). Internal: not
// part of the API. (The NUMA node lists a pool places its workers by are reaper_pool.hpp's,
// numa_node_cpus and plan_worker_cpus.)
//
// Who may call what: any thread; they allocate and read sysfs, so not async-signal-safe.
// parse_cpu_list throws std::invalid_argument / std::out_of_range (std::stoi) on a malformed
// number; housekeeping_cpus may throw std::bad_alloc.
// Design: docs/design.md, "The shared internal layer".
#pragma once

#include <sched.h>

#include <algorithm>
#include <cstddef>
#include <fstream>
#include <set>
#include <string>
#include <vector>

namespace teardown::detail {

// "0-3,8,10-11" -> {0,1,2,3,8,10,11}
inline std::set<int> parse_cpu_list(const std::string& text) {
  std::set<int> cpus;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string part = text.substr(at, comma - at);
    at = comma + 1;
    if (part.empty() || part[0] < '0' || part[0] > '9') continue;
    const std::size_t dash = part.find('-');
    const int first = std::stoi(part.substr(0, dash));
    const int last = dash == std::string::npos ? first : std::stoi(part.substr(dash + 1));
    for (int cpu = first; cpu <= last; ++cpu) cpus.insert(cpu);
  }
  return cpus;
}

inline std::string read_first_line(const char* path) {
  std::ifstream file(path);
  std::string line;
  std::getline(file, line);
  return line;
}

// The housekeeping CPUs: online, minus isolcpus= and nohz_full=, within this process's mask.
inline std::vector<int> housekeeping_cpus() {
  std::set<int> cpus = parse_cpu_list(read_first_line("/sys/devices/system/cpu/online"));
  for (const char* excluded : {"/sys/devices/system/cpu/isolated", "/sys/devices/system/cpu/nohz_full"}) {
    for (int cpu : parse_cpu_list(read_first_line(excluded))) cpus.erase(cpu);
  }
  std::vector<int> result;
#if defined(__linux__)
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0) {
    for (int cpu : cpus) {
      if (cpu >= 0 && cpu < CPU_SETSIZE && CPU_ISSET(static_cast<std::size_t>(cpu), &allowed)) result.push_back(cpu);
    }
  }
#endif
  return result;
}

}  // namespace teardown::detail
