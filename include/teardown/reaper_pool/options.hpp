// teardown/reaper_pool/options.hpp — a reaper pool's options, and where its workers run.
//
// reaper_pool_options (checked by the pool's constructor: bad values throw std::invalid_argument, creating
// nothing) and the placement helpers: the NUMA nodes' CPUs from sysfs, the split of a CPU set into one group
// per worker, and the workers' thread names. Plain functions of their arguments (numa_node_cpus reads sysfs);
// any thread.
//
// Design: docs/design.md, "Affinity".
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <new>
#include <set>
#include <string>
#include <vector>

#include "teardown/reaper/options.hpp"
#include "teardown/worker_thread.hpp"

namespace teardown {

struct reaper_pool_options {
  std::size_t workers = 0;  // 0: one per NUMA node (see "Affinity"); at most reaper_pool's max_workers
  bool steal = true;        // idle workers take queued items from busy ones (see "Stealing")
  std::chrono::nanoseconds steal_after = std::chrono::milliseconds(1);  // how slow an item, or
                            // how old a backlog, before idle siblings are woken to steal it
  reaper_options worker{};  // every worker's options; name gets "-<i>" (cut to keep 15
                            // characters); cpus, if given, is the set the workers are spread over
};

namespace detail {

inline constexpr std::size_t reaper_pool_max_workers = 1024;

// The CPUs of each NUMA node that has any, in node order, from sysfs (the files libnuma
// reads); empty when the files are missing or unreadable.
inline std::vector<std::vector<int>> numa_node_cpus(const std::string& root = "/sys/devices/system/node") {
  std::vector<std::vector<int>> nodes;
  try {
    for (int node : parse_cpu_list(read_first_line((root + "/online").c_str()))) {
      const std::string list = root + "/node" + std::to_string(node) + "/cpulist";
      const std::set<int> cpus = parse_cpu_list(read_first_line(list.c_str()));
      if (!cpus.empty()) nodes.emplace_back(cpus.begin(), cpus.end());
    }
  } catch (const std::bad_alloc&) {
    throw;
  } catch (...) {  // a malformed list: as if there were no NUMA information
    nodes.clear();
  }
  return nodes;
}

// `cpus` (sorted) in n contiguous groups of nearly equal size; with more groups than CPUs,
// group i gets CPU i mod C. No CPUs: n empty groups (each worker then keeps the reaper's default).
inline std::vector<std::vector<int>> split_cpus(const std::vector<int>& cpus, std::size_t n) {
  std::vector<std::vector<int>> groups(n);
  const std::size_t c = cpus.size();
  if (c == 0) return groups;
  for (std::size_t i = 0; i < n; ++i) {
    if (n > c) {
      groups[i].push_back(cpus[i % c]);
    } else {
      groups[i].assign(cpus.begin() + static_cast<std::ptrdiff_t>(i * c / n),
                       cpus.begin() + static_cast<std::ptrdiff_t>((i + 1) * c / n));
    }
  }
  return groups;
}

// Each worker's CPU preference (see "Affinity"); its size is the number of workers.
// `nodes` is numa_node_cpus(), `base` the CPUs to place workers on (empty: unknown).
inline std::vector<std::vector<int>> plan_worker_cpus(std::size_t workers, const std::vector<std::vector<int>>& nodes,
                                                      const std::vector<int>& base) {
  if (workers != 0) return split_cpus(base, workers);
  std::vector<std::vector<int>> groups;
  for (const std::vector<int>& node : nodes) {
    std::vector<int> usable;
    for (int cpu : node) {
      if (base.empty() || std::binary_search(base.begin(), base.end(), cpu)) usable.push_back(cpu);
    }
    if (!usable.empty()) groups.push_back(std::move(usable));
  }
  if (groups.empty()) groups.push_back(base);  // no NUMA information: one worker
  return groups;
}

// "name-i", the name cut so that the suffix survives Linux's 15 characters.
inline std::string pool_worker_name(const std::string& name, std::size_t index) {
  const std::string suffix = "-" + std::to_string(index);
  return name.substr(0, 15 > suffix.size() ? 15 - suffix.size() : 0) + suffix;
}

}  // namespace detail

}  // namespace teardown
