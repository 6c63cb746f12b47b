// Shared by the benchmark programs' summary reporters. A summary compares cases at the same
// thread count, so it can only be printed once every case has run; meanwhile Google Benchmark
// hands a reporter its runs one batch at a time, and with --benchmark_repetitions it sends each
// repetition and each aggregate (mean, median, ...) as a run of its own. Gathering the runs here
// means every summary picks its one figure per case and thread count by the same rule, whether
// the benchmark was repeated or not, instead of each reporter keeping its own copy of that rule.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace teardown_bench {

// The runs a reporter has been handed, by benchmark function name (the registered name, without
// "/threads:N" and the like) and thread count. Runs that failed are left out, so a case whose
// every run failed reads as one that did not run.
class run_table {
 public:
  using Run = benchmark::BenchmarkReporter::Run;

  // Call from the reporter's ReportRuns with every batch.
  void add(const std::vector<Run>& runs) {
    for (const Run& run : runs) {
      if (run.error_occurred) continue;
      const std::string& name = run.run_name.function_name;
      if (std::find(names_.begin(), names_.end(), name) == names_.end()) names_.push_back(name);
      const auto at = std::lower_bound(thread_counts_.begin(), thread_counts_.end(), run.threads);
      if (at == thread_counts_.end() || *at != run.threads) thread_counts_.insert(at, run.threads);

      cell_t& cell = cells_[{name, run.threads}];
      if (run.run_type == Run::RT_Aggregate) {
        cell.aggregates.insert_or_assign(run.aggregate_name, run);
      } else {
        // Kept in order of time so that median() can take the middle one.
        const auto by_time = [](const Run& a, const Run& b) {
          return a.GetAdjustedRealTime() < b.GetAdjustedRealTime();
        };
        cell.runs.insert(std::upper_bound(cell.runs.begin(), cell.runs.end(), run, by_time), run);
      }
    }
  }

  bool empty() const { return cells_.empty(); }

  // Every function name seen, in the order each first ran (for the benchmarks here, the order
  // they were registered in).
  const std::vector<std::string>& names() const { return names_; }

  // Every thread count seen, in ascending order.
  const std::vector<std::int64_t>& thread_counts() const { return thread_counts_; }

  // Whether name ran at any thread count.
  bool has(const std::string& name) const {
    return std::any_of(thread_counts_.begin(), thread_counts_.end(), [&](std::int64_t threads) {
      return cells_.count({name, threads}) != 0;
    });
  }

  // The run to report for name at threads: the median aggregate when the benchmark was repeated,
  // else its only run. Google Benchmark sends aggregates whenever two or more repetitions
  // succeed, so the second case never holds more than one run; should it hold more, the one in
  // the middle by time (the later of the two middle ones) is taken. Null if it did not run.
  const Run* median(const std::string& name, std::int64_t threads) const {
    const cell_t* cell = find(name, threads);
    if (cell == nullptr) return nullptr;
    if (const Run* run = find_aggregate(*cell, "median")) return run;
    if (cell->runs.empty()) return nullptr;
    return &cell->runs[cell->runs.size() / 2];
  }

  // The aggregate of that name ("mean", "stddev", ...) over the repetitions of name at threads;
  // null when the benchmark was not repeated or did not run.
  const Run* aggregate(const std::string& name, std::int64_t threads,
                       const std::string& aggregate_name) const {
    const cell_t* cell = find(name, threads);
    return cell == nullptr ? nullptr : find_aggregate(*cell, aggregate_name);
  }

 private:
  struct cell_t {
    std::map<std::string, Run> aggregates;  // by aggregate name, when repeated
    std::vector<Run> runs;                  // the plain runs (repetitions), fastest first
  };

  const cell_t* find(const std::string& name, std::int64_t threads) const {
    const auto it = cells_.find({name, threads});
    return it == cells_.end() ? nullptr : &it->second;
  }

  static const Run* find_aggregate(const cell_t& cell, const std::string& aggregate_name) {
    const auto it = cell.aggregates.find(aggregate_name);
    return it == cell.aggregates.end() ? nullptr : &it->second;
  }

  std::vector<std::string> names_;
  std::vector<std::int64_t> thread_counts_;
  std::map<std::pair<std::string, std::int64_t>, cell_t> cells_;
};

// Google Benchmark's console table as usual and then, once every benchmark has run, a summary
// that a derived class prints from the runs gathered meanwhile. The summary is left out when no
// benchmark ran (all were filtered out or failed).
class summary_reporter : public benchmark::ConsoleReporter {
 public:
  using ConsoleReporter::ConsoleReporter;

  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    runs_.add(runs);
  }

  void Finalize() override {
    ConsoleReporter::Finalize();
    if (runs_.empty()) return;
    // The table goes through std::cout, the summary through stdio: flush so that neither lands
    // inside the other.
    std::fflush(stdout);
    print_summary(stdout);
    std::fflush(stdout);
  }

 protected:
  virtual void print_summary(std::FILE* out) const = 0;

  const run_table& runs() const { return runs_; }

 private:
  run_table runs_;
};

}  // namespace teardown_bench
