// mm_reaper_tradeoffs (rfc_questions before): what the model kernel, on real memory, can say
// about the RFC's open questions 1, 2, 3 and 6 (seed 000's cover letter): the max_pending_pages
// default, one reaper or several, CPU accounting, the freeze latency bound. docs/rfc-questions.md
// explains each answer and its limits; this program produces the tables there. Not a Google
// Benchmark program: each case is a scenario of seconds on real memory, repeated a few times,
// and reported as medians and maxima.
//
//   Q1  the max_pending_pages default. A supervisor kills a worker of S and respawns one of the
//       same size at once, R times, under each cap: off, W/16, W/8, W/4, W/2 and unlimited,
//       where W = 4 S is the RAM of a machine sized to the workload (on it the worker is a
//       quarter of RAM: the largest process the RFC's RAM/4 default still defers). Per cap:
//       the old worker's exit-path latency (median, max), kill -> replacement populated, the
//       process's peak RSS above its baseline while old and new overlap (VmHWM, reset with
//       /proc/self/clear_refs "5"; else a MemAvailable low-water mark sampled by a thread), and
//       how many kills were queued and how many fell back to the inline teardown. Twice: with a
//       spare CPU for the reaper, and with supervisor and reaper pinned to one CPU (no spare
//       CPU: the nice-19 reaper falls behind, and the cap decides how much piles up). (c) Near
//       a memory limit: the process in a memory cgroup of its own whose limit leaves room for
//       old + new beside a page cache a thread keeps reading; the mm_reaper
//       frozen; no cap, a static cap of S, and no cap with a pressure_policy on a real PSI
//       trigger. Per policy: exit latency, peak held, pressure episodes, and how long memory
//       stayed queued while the monitor reported pressure.
//   Q2  one reaper or several. M processes of S exit at the same instant, one thread each;
//       their teardowns run inline on those threads (today's kernel), or go to K reapers: K
//       independent mm_systems, each with its own mm_reaper, the processes spread round-robin.
//       Per case: the tail (release -> every page unmapped) and the aggregate GiB/s.
//   Q3  CPU accounting. Two "cgroups" (std::atomic<uint64_t> accounts, set as mm->cpu_owner
//       before the exit) own 3 and 1 processes of the same size. Inline, each teardown's CPU is
//       on the exiting thread (CLOCK_THREAD_CPUTIME_ID); deferred, the reaper times each mm and
//       adds it to the owner's account. The two accounts against the reaper's whole CPU delta.
//   Q6  the freeze latency bound. With the reaper tearing down a backlog of mms of one size,
//       freeze() is called at pseudo-random moments and timed until it returns, per size, next
//       to one item's wall time (inline, and on the reaper from the reap trace point): the
//       worker parks only between items.
//
// Flags:
//   --quick            sizes of 32-256 MiB and few repetitions: a few seconds (a smoke test)
//   --questions 1,2,3,6   run only these
//   --q1-pressure-only    Q1's table (c) alone: near a memory limit, no cap / static cap /
//                      pressure_policy (needs a v1 memory cgroup it may create; else skipped)
//   --q1-busy-ms N     Q1 (c): the supervisor's busy time after each respawn (default 1000)
//   --q1-stall-ms N    Q1 (c): the PSI trigger's stall threshold per 2 s window (default 150)
//   --q1-tight         Q1 (c): a limit with room for the steady state only (no queued worker)
//   --out FILE         write every sample, the summaries and the machine as JSON
//   --scale F          multiply every size by F (default 1; each size is still capped so that
//                      what one question holds at once stays under 60% of MemAvailable)
//   --reps N           repetitions per case (default: 5 in Q1 and Q2, 2 in Q3; Q6 repeats its
//                      backlog until it has 10 freeze samples per size, at most 8 times)
// The default run holds at most 2 GiB populated at any moment (times --scale) and takes about
// a minute on a quiet 2-CPU machine.
#include <teardown/memory_limit.hpp>
#include <teardown/model/mm.hpp>
#include <teardown/pressure_policy.hpp>

#include "machine_info.hpp"
#include "macro_support.hpp"

#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <latch>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

using namespace teardown::model;
using clock_type = std::chrono::steady_clock;
using task_ptr = std::unique_ptr<mm_system::task>;

constexpr double bytes_per_gib = double(std::uint64_t{1} << 30);

using teardown_bench::ms_between;
using teardown_bench::thread_cpu_ms;

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 != 0 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

double maximum(const std::vector<double>& values) {
  return values.empty() ? 0 : *std::max_element(values.begin(), values.end());
}

std::string size_label(double gib) {
  char text[32];
  if (gib >= 1) std::snprintf(text, sizeof text, "%.3g GiB", gib);
  else std::snprintf(text, sizeof text, "%.0f MiB", gib * 1024);
  return text;
}

std::uint64_t pages_of(double gib) {
  return std::max<std::uint64_t>(1, std::uint64_t(gib * bytes_per_gib / double(mm_system::page_size())));
}

double gib_of(std::uint64_t pages) { return double(pages) * double(mm_system::page_size()) / bytes_per_gib; }

// ---- /proc ------------------------------------------------------------------------------------

// A "Key: value kB" line of a /proc file, in KiB; 0 if absent.
std::uint64_t proc_kib(const char* path, const char* key) {
  std::ifstream file(path);
  std::string line;
  const std::size_t key_length = std::strlen(key);
  while (std::getline(file, line)) {
    if (line.compare(0, key_length, key) == 0 && line.size() > key_length && line[key_length] == ':') {
      return std::strtoull(line.c_str() + key_length + 1, nullptr, 10);
    }
  }
  return 0;
}

double mem_available_gib() { return double(proc_kib("/proc/meminfo", "MemAvailable")) / (1 << 20); }
double rss_gib() { return double(proc_kib("/proc/self/status", "VmRSS")) / (1 << 20); }

using teardown_bench::cpu_model;
using teardown_bench::first_line;

// The CPUs this process may run on (what the reapers and exiting threads can use).
unsigned usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return unsigned(CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

// ---- JSON -------------------------------------------------------------------------------------

// Just enough JSON for the results: null, bool, numbers, strings, arrays, objects (keys kept in
// insertion order), indented. A tree rather than macro_support.hpp's one-line json_object, since
// the questions nest tables in tables; numbers and strings are written the same way.
class json {
 public:
  json() = default;
  json(bool value) : kind_(kind::boolean), boolean_(value) {}
  template <std::integral I>
    requires(!std::same_as<I, bool>)
  json(I value) : kind_(kind::integer), text_(std::to_string(value)) {}
  json(double value) : kind_(kind::number), number_(value) {}
  json(std::string value) : kind_(kind::string), text_(std::move(value)) {}
  json(const char* value) : json(std::string(value)) {}
  json(const std::vector<double>& values) : kind_(kind::array) {
    for (double v : values) items_.emplace_back(v);
  }

  static json object() { return json(kind::object); }
  static json array() { return json(kind::array); }

  // Object member, added if new.
  json& operator[](const std::string& key) {
    kind_ = kind::object;
    for (auto& [name, value] : members_) {
      if (name == key) return value;
    }
    return members_.emplace_back(key, json()).second;
  }
  void push(json value) {
    kind_ = kind::array;
    items_.push_back(std::move(value));
  }

  std::string dump(int depth = 0) const {
    const std::string pad(std::size_t(depth + 1) * 2, ' ');
    const std::string end_pad(std::size_t(depth) * 2, ' ');
    switch (kind_) {
      case kind::null: return "null";
      case kind::boolean: return boolean_ ? "true" : "false";
      case kind::integer: return text_;
      case kind::number: return teardown_bench::json_number(number_);
      case kind::string: return teardown_bench::json_quoted(text_);
      case kind::array: {
        if (items_.empty()) return "[]";
        // Arrays of plain values stay on one line.
        const bool flat = std::all_of(items_.begin(), items_.end(), [](const json& item) {
          return item.kind_ != kind::object && item.kind_ != kind::array;
        });
        std::string out = "[";
        for (std::size_t i = 0; i < items_.size(); ++i) {
          out += i == 0 ? "" : ",";
          out += flat ? (i == 0 ? "" : " ") : "\n" + pad;
          out += items_[i].dump(depth + 1);
        }
        return out + (flat ? "]" : "\n" + end_pad + "]");
      }
      case kind::object: {
        if (members_.empty()) return "{}";
        std::string out = "{";
        for (std::size_t i = 0; i < members_.size(); ++i) {
          out += (i == 0 ? "\n" : ",\n") + pad + teardown_bench::json_quoted(members_[i].first) + ": " +
                 members_[i].second.dump(depth + 1);
        }
        return out + "\n" + end_pad + "}";
      }
    }
    return "null";
  }

 private:
  enum class kind { null, boolean, integer, number, string, array, object };
  explicit json(kind k) : kind_(k) {}

  kind kind_ = kind::null;
  bool boolean_ = false;
  double number_ = 0;
  std::string text_;
  std::vector<std::pair<std::string, json>> members_;
  std::vector<json> items_;
};

json vmstat_json(const vmstat& v) {
  json out = json::object();
  out["queued"] = v.queued;
  out["sync"] = v.sync;
  out["rejected"] = v.rejected;
  out["reaped"] = v.reaped;
  out["pending_pages"] = v.pending_pages;
  return out;
}

// ---- the run ----------------------------------------------------------------------------------

struct settings {
  bool quick = false;
  bool q1_pressure_only = false;  // Q1's table (c) alone
  int q1_busy_ms = 1000;          // Q1 (c): the supervisor's busy time after each respawn
  int q1_stall_ms = 150;          // Q1 (c): the trigger's stall threshold (pressure_monitor_options::stall)
  bool q1_tight = false;          // Q1 (c): the limit leaves no room for a queued worker
  double scale = 1;
  int reps = 0;  // 0: each question's default
  unsigned cpus = 1;
  bool show_progress = false;
};

// Progress goes to a terminal only: "\r" lines would litter a log.
void progress(const settings& run, const std::string& what) {
  if (run.show_progress) std::fprintf(stderr, "\r  %-70.70s", what.c_str());
}
void progress_done(const settings& run) {
  if (run.show_progress) std::fprintf(stderr, "\r%-74s\r", "");
}

// The size per process, in GiB, such that `at_once` of them stay under 60% of MemAvailable.
double fitted_gib(double wanted, double at_once, const char* question) {
  const double limit = 0.6 * mem_available_gib() / at_once;
  if (wanted <= limit) return wanted;
  std::printf("  (%s: %s per process capped to %s: %g of them must fit in 60%% of MemAvailable)\n", question,
              size_label(wanted).c_str(), size_label(limit).c_str(), at_once);
  return limit;
}

// A kernel for these measurements: the feature as asked, a threshold below every size used
// here (16 MiB), the given cap (unlimited by default) and the reaper's CPUs (empty: all).
std::unique_ptr<mm_system> make_kernel(bool async, std::uint64_t max_pending = teardown::budget::max_cap,
                                       std::vector<int> reaper_cpus = {}) {
  return std::make_unique<mm_system>(
      mm_system_options{.async_mm_teardown = async,
                        .thresh_pages = pages_of(1.0 / 64),
                        .max_pending_pages = max_pending,
                        .reaper = {.name = "mm_reaper", .cpus = std::move(reaper_cpus)}});
}

// Pins the calling thread to one CPU while it lives; restores its mask after.
class pinned_thread {
 public:
  explicit pinned_thread(int cpu) {
    have_previous_ = sched_getaffinity(0, sizeof previous_, &previous_) == 0;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0)
      throw std::runtime_error("mm_reaper_tradeoffs: cannot pin to a CPU");
  }
  ~pinned_thread() {
    if (have_previous_) sched_setaffinity(0, sizeof previous_, &previous_);
  }
  pinned_thread(const pinned_thread&) = delete;
  pinned_thread& operator=(const pinned_thread&) = delete;

 private:
  cpu_set_t previous_{};
  bool have_previous_ = false;
};

int first_usable_cpu() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &set)) return cpu;
    }
  }
  return 0;
}

// One process of `pages` (real memory) in each of `where`, populated on up to `threads`
// threads at once.
std::vector<task_ptr> spawn_all(const std::vector<mm_system*>& where, std::uint64_t pages, unsigned threads) {
  std::vector<task_ptr> tasks(where.size());
  std::atomic<std::size_t> next{0};
  std::mutex failure_lock;
  std::exception_ptr failure;
  const auto work = [&] {
    for (std::size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < where.size();) {
      try {
        tasks[i] = where[i]->spawn(pages, backing::real);
      } catch (...) {
        const std::lock_guard lock(failure_lock);
        if (!failure) failure = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < std::min<std::size_t>(threads, where.size()); ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
  return tasks;
}

// Exits every task at the same instant, one thread each. Returns the instant they were released
// and each exit's own duration (ms).
struct exit_wave {
  clock_type::time_point released;
  std::vector<double> exit_ms;
};

exit_wave exit_all_at_once(std::vector<task_ptr>& tasks) {
  exit_wave wave;
  wave.exit_ms.resize(tasks.size());
  std::latch ready(std::ptrdiff_t(tasks.size()));
  std::latch go(1);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    threads.emplace_back([&, i] {
      ready.count_down();
      go.wait();
      const auto start = clock_type::now();
      tasks[i]->exit();
      wave.exit_ms[i] = ms_between(start, clock_type::now());
    });
  }
  ready.wait();
  wave.released = clock_type::now();
  go.count_down();
  for (std::thread& t : threads) t.join();
  return wave;
}

// The process's peak RSS since reset(), above a baseline. VmHWM when /proc/self/clear_refs
// accepts "5" (Linux 4.0+, which resets it); otherwise a thread samples MemAvailable every
// millisecond and the peak is how far it fell (other processes move that too).
class peak_meter {
 public:
  peak_meter() {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5" << std::flush;
    exact_ = clear.good();
  }
  ~peak_meter() { stop_sampler(); }
  peak_meter(const peak_meter&) = delete;
  peak_meter& operator=(const peak_meter&) = delete;

  const char* method() const {
    return exact_ ? "VmHWM after clear_refs 5" : "MemAvailable low-water mark (1 ms samples)";
  }

  // The baseline: what the process (or the machine) holds with none of the measured memory.
  void set_baseline() {
    baseline_rss_ = rss_gib();
    baseline_available_ = mem_available_gib();
  }
  void reset() {
    if (exact_) {
      std::ofstream clear("/proc/self/clear_refs");
      clear << "5" << std::flush;
      return;
    }
    stop_sampler();
    lowest_available_.store(mem_available_gib(), std::memory_order_relaxed);
    sampling_.store(true, std::memory_order_relaxed);
    sampler_ = std::thread([this] {
      while (sampling_.load(std::memory_order_relaxed)) {
        const double now = mem_available_gib();
        if (now < lowest_available_.load(std::memory_order_relaxed))
          lowest_available_.store(now, std::memory_order_relaxed);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
  }
  // GiB above the baseline at the peak.
  double peak_gib() {
    if (exact_) return double(proc_kib("/proc/self/status", "VmHWM")) / (1 << 20) - baseline_rss_;
    stop_sampler();
    return baseline_available_ - lowest_available_.load(std::memory_order_relaxed);
  }

 private:
  void stop_sampler() {
    sampling_.store(false, std::memory_order_relaxed);
    if (sampler_.joinable()) sampler_.join();
  }

  bool exact_ = false;
  double baseline_rss_ = 0;
  double baseline_available_ = 0;
  std::atomic<bool> sampling_{false};
  std::atomic<double> lowest_available_{0};
  std::thread sampler_;
};

// ---- Q1: the max_pending_pages default ----------------------------------------------------------

// One table of Q1: every cap, `reps` kill-and-respawn cycles of a worker of `size` GiB. With
// `shared_cpu` >= 0 the supervisor and the reaper are pinned to that one CPU: a machine with no
// spare CPU, where the nice-19 reaper runs only when the supervisor lets it.
json q1_table(const settings& run, double size, int reps, int shared_cpu) {
  const std::uint64_t pages = pages_of(size);
  const std::uint64_t ram_pages = 4 * pages;  // W: the worker is a quarter of it
  struct cap_case {
    const char* label;
    bool async;
    std::uint64_t cap_pages;
  };
  const std::vector<cap_case> caps = {
      {"off", false, 0},
      {"W/16", true, ram_pages / 16},
      {"W/8", true, ram_pages / 8},
      {"W/4", true, ram_pages / 4},
      {"W/2", true, ram_pages / 2},
      {"unlimited", true, teardown::budget::max_cap},
  };

  std::printf("%-10s %9s %10s %10s %10s %10s %10s %6s %7s %9s\n", "cap", "cap", "exit p50", "exit max", "ready p50",
              "peak held", "peak held", "queued", "fell", "pending");
  std::printf("%-10s %9s %10s %10s %10s %10s %10s %6s %7s %9s\n", "", "(GiB)", "(ms)", "(ms)", "(ms)", "(GiB)", "(S)",
              "", "back", "max (S)");
  json table = json::object();
  table["size_gib"] = size;
  table["reps"] = reps;
  table["ram_gib"] = gib_of(ram_pages);
  table["shared_cpu"] = shared_cpu;
  json rows = json::array();
  peak_meter meter;
  table["peak_method"] = meter.method();
  const std::string where = shared_cpu >= 0 ? "Q1 (one CPU) cap " : "Q1 cap ";
  for (const cap_case& cap : caps) {
    const auto kernel = make_kernel(cap.async, cap.async ? cap.cap_pages : teardown::budget::max_cap,
                                    shared_cpu >= 0 ? std::vector<int>{shared_cpu} : std::vector<int>{});
    std::optional<pinned_thread> pin;
    if (shared_cpu >= 0) pin.emplace(shared_cpu);
    meter.set_baseline();
    progress(run, where + cap.label + ": populating");
    auto worker = kernel->spawn(pages, backing::real);
    meter.reset();
    std::vector<double> exit_ms, ready_ms;
    for (int rep = 0; rep < reps; ++rep) {
      progress(run, where + cap.label + ": kill and respawn " + std::to_string(rep + 1) + "/" + std::to_string(reps));
      const auto kill = clock_type::now();
      worker->exit();
      exit_ms.push_back(ms_between(kill, clock_type::now()));
      worker = kernel->spawn(pages, backing::real);
      ready_ms.push_back(ms_between(kill, clock_type::now()));
    }
    const double peak = meter.peak_gib();  // before the flush: the supervisor would not wait for it
    const vmstat v = kernel->vmstat();
    const std::uint64_t high_water = kernel->pending_high_water();
    worker->exit();
    kernel->flush();
    pin.reset();
    progress_done(run);

    const bool bounded = cap.async && cap.cap_pages < teardown::budget::max_cap;
    char cap_gib[16] = "-";
    if (bounded) std::snprintf(cap_gib, sizeof cap_gib, "%.3g", gib_of(cap.cap_pages));
    std::printf("%-10s %9s %10.3f %10.3f %10.1f %10.2f %10.2f %6llu %7llu %9.2f\n", cap.label, cap_gib,
                median(exit_ms), maximum(exit_ms), median(ready_ms), peak, peak / size, (unsigned long long)v.queued,
                (unsigned long long)v.sync, double(high_water) / double(pages));
    json row = json::object();
    row["cap"] = cap.label;
    row["async"] = cap.async;
    row["cap_pages"] = cap.async ? cap.cap_pages : 0;
    row["cap_gib"] = bounded ? json(gib_of(cap.cap_pages)) : json();
    row["exit_ms"] = exit_ms;
    row["exit_ms_median"] = median(exit_ms);
    row["exit_ms_max"] = maximum(exit_ms);
    row["ready_ms"] = ready_ms;
    row["ready_ms_median"] = median(ready_ms);
    row["peak_held_gib"] = peak;
    row["peak_held_workers"] = peak / size;
    row["pending_high_water_pages"] = high_water;
    row["pending_high_water_workers"] = double(high_water) / double(pages);
    row["vmstat"] = vmstat_json(v);
    rows.push(std::move(row));
  }
  table["rows"] = std::move(rows);
  return table;
}


// ---- Q1 (c): near a memory limit, with memory pressure ----------------------------------------

// Writes `text` to a cgroup file; false (with errno's text in `why`) if refused.
bool write_cgroup_file(const std::string& path, const std::string& text, std::string& why) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    why = path + ": " + std::strerror(errno);
    return false;
  }
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  if (!ok) why = path + ": write " + text + ": " + std::strerror(errno);
  ::close(fd);
  return ok;
}

// This process in a memory cgroup of its own (a child of its v1 memory cgroup) limited to
// `limit` bytes, with a page-cache working set a thread keeps re-reading: the memory a real
// machine fills the rest of its limit with. When deferred memory grows, the cgroup reclaims that
// cache (a memory stall for PSI) instead of killing, up to the limit. Undone by the destructor.
class near_limit {
 public:
  bool enter(std::uint64_t limit, std::uint64_t cache_bytes, int reader_cpu, std::string& why) {
    teardown::detail::memory_limit_impl::for_each_memory_cgroup(
        teardown::memory_limit_sources{},
        [&](char* dir, std::size_t length, std::size_t, teardown::detail::memory_limit_impl::version which) noexcept {
          if (which == teardown::detail::memory_limit_impl::version::v1) parent_.assign(dir, length);
        });
    if (parent_.empty()) {
      why = "no cgroup v1 memory controller for this process";
      return false;
    }
    cgroup_ = parent_ + "/rfc_q1_pressure_" + std::to_string(::getpid());
    if (::mkdir(cgroup_.c_str(), 0755) != 0) {
      why = "mkdir " + cgroup_ + ": " + std::strerror(errno);
      cgroup_.clear();
      return false;
    }
    if (!write_cgroup_file(cgroup_ + "/memory.limit_in_bytes", std::to_string(limit), why)) return false;
    directory_ = std::filesystem::temp_directory_path() / ("rfc_q1_pressure." + std::to_string(::getpid()));
    std::filesystem::create_directories(directory_);
    file_ = (directory_ / "cache").string();
    {
      const int fd = ::open(file_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (fd < 0) {
        why = file_ + ": " + std::strerror(errno);
        return false;
      }
      std::vector<char> block(1 << 20, 'c');
      for (std::uint64_t done = 0; done < cache_bytes; done += block.size()) {
        if (::write(fd, block.data(), block.size()) != static_cast<ssize_t>(block.size())) break;
      }
      (void)::fsync(fd);
      (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // read again inside the cgroup
      ::close(fd);
    }
    if (!write_cgroup_file(cgroup_ + "/cgroup.procs", "0", why)) return false;  // the whole process
    moved_ = true;
    reading_.store(true);
    reader_ = std::thread([this, reader_cpu] {
      if (reader_cpu >= 0) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(reader_cpu, &one);
        (void)sched_setaffinity(0, sizeof one, &one);
      }
      static char buffer[1 << 16];
      while (reading_.load()) {
        const int fd = ::open(file_.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) return;
        while (reading_.load() && ::read(fd, buffer, sizeof buffer) > 0) {
        }
        ::close(fd);
      }
    });
    return true;
  }

  ~near_limit() {
    reading_.store(false);
    if (reader_.joinable()) reader_.join();
    std::string ignored;
    if (moved_) (void)write_cgroup_file(parent_ + "/cgroup.procs", "0", ignored);
    if (!cgroup_.empty()) {
      for (int attempt = 0; attempt < 100 && ::rmdir(cgroup_.c_str()) != 0 && errno == EBUSY; ++attempt) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    if (!directory_.empty()) {
      std::error_code error;
      std::filesystem::remove_all(directory_, error);
    }
  }

 private:
  std::string parent_, cgroup_, file_;
  std::filesystem::path directory_;
  bool moved_ = false;
  std::atomic<bool> reading_{false};
  std::thread reader_;
};

// Q1 (c): kill-and-respawn near a memory limit with the mm_reaper frozen (seed 003: a frozen
// reaper frees nothing), under three policies: no cap, the tightest static cap that still
// defers a worker (S), and no cap with a pressure_policy (thaw, nice 0, drain, cap 0 while PSI
// reports stall). Between kills the supervisor keeps its CPU busy for `busy_ms`.
json q1_pressure_table(const settings& run, double size, int reps, int shared_cpu) {
  json table = json::object();
  const std::uint64_t pages = pages_of(size);
  const std::uint64_t bytes = pages * mm_system::page_size();
  // The limit leaves room for the live worker and its replacement beside a page cache of reps
  // workers' size, 128 MiB to spare: the first worker queued (its replacement filling beside it)
  // fits, and every further one pushes its size of cache out (reclaim, refaults: memory stall).
  // Even the no-cap row, reps workers queued, stays under the limit with anonymous memory alone
  // (no swap: past it is the OOM killer). --q1-tight leaves out the replacement's room: the
  // steady state (one live worker and the cache) fits, and the first queued worker already
  // pushes cache out.
  const std::uint64_t cache = std::uint64_t(reps) * bytes;
  const std::uint64_t baseline = std::uint64_t(rss_gib() * bytes_per_gib);
  const std::uint64_t limit = baseline + (run.q1_tight ? 1 : 2) * bytes + cache + (std::uint64_t{128} << 20);
  const int busy_ms = run.q1_busy_ms;
  int reader_cpu = -1;
  for (int cpu = 0; cpu < CPU_SETSIZE && reader_cpu < 0; ++cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_ISSET(cpu, &set) && cpu != shared_cpu) reader_cpu = cpu;
  }
  near_limit rig;
  std::string why;
  if (!rig.enter(limit, cache, reader_cpu, why)) {
    std::printf("skipped: %s\n", why.c_str());
    table["skipped"] = why;
    return table;
  }
  teardown::pressure_monitor monitor({.stall = std::chrono::milliseconds(run.q1_stall_ms)});
  std::printf("limit %s (baseline + %d S + a page cache of %s + 128 MiB); supervisor busy %d ms after each respawn.\n"
              "pressure source: %s\n\n",
              size_label(double(limit) / bytes_per_gib).c_str(), run.q1_tight ? 1 : 2,
              size_label(double(cache) / bytes_per_gib).c_str(),
              busy_ms, monitor.description().c_str());
  table["size_gib"] = size;
  table["reps"] = reps;
  table["limit_bytes"] = limit;
  table["cache_bytes"] = cache;
  table["busy_ms"] = busy_ms;
  table["stall_ms"] = run.q1_stall_ms;
  table["tight"] = run.q1_tight;
  table["pressure_source"] = monitor.description();
  std::printf("%-10s %10s %10s %10s %10s %9s %6s %7s %10s\n", "policy", "exit p50", "exit max", "peak held",
              "peak held", "pressure", "queued", "fell", "queued in");
  std::printf("%-10s %10s %10s %10s %10s %9s %6s %7s %10s\n", "", "(ms)", "(ms)", "(GiB)", "(S)", "episodes", "",
              "back", "press. (s)");
  struct policy_case {
    const char* label;
    std::uint64_t cap_pages;
    bool pressure;
  };
  const std::vector<policy_case> cases = {
      {"no cap", teardown::budget::max_cap, false},
      {"static S", pages, false},
      {"pressure", teardown::budget::max_cap, true},
  };
  json rows = json::array();
  peak_meter meter;
  table["peak_method"] = meter.method();
  for (const policy_case& c : cases) {
    const auto kernel = make_kernel(true, c.cap_pages, std::vector<int>{shared_cpu});
    std::optional<teardown::pressure_policy<mm_system>> policy;
    if (c.pressure) policy.emplace(monitor, *kernel);
    const teardown::pressure_monitor_stats before = monitor.stats();
    std::optional<pinned_thread> pin;
    pin.emplace(shared_cpu);
    meter.set_baseline();
    progress(run, std::string("Q1 (c) ") + c.label + ": populating");
    auto worker = kernel->spawn(pages, backing::real);
    kernel->freeze();  // a frozen mm_reaper (a frozen container's): only a thaw or a drain frees
    meter.reset();
    // "Queued while pressure is high": a sampler adds up the time during which the monitor
    // reports pressure and the budget holds anything.
    std::atomic<bool> sampling{true};
    std::atomic<std::uint64_t> queued_under_pressure_ms{0};
    std::thread sampler([&] {
      while (sampling.load()) {
        if (monitor.under_pressure() && kernel->vmstat().pending_pages != 0) queued_under_pressure_ms.fetch_add(10);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    });
    std::vector<double> exit_ms;
    for (int rep = 0; rep < reps; ++rep) {
      progress(run, std::string("Q1 (c) ") + c.label + ": kill and respawn " + std::to_string(rep + 1) + "/" +
                        std::to_string(reps));
      const auto kill = clock_type::now();
      worker->exit();
      exit_ms.push_back(ms_between(kill, clock_type::now()));
      worker = kernel->spawn(pages, backing::real);
      const auto busy_until = clock_type::now() + std::chrono::milliseconds(busy_ms);
      while (clock_type::now() < busy_until) {
      }
    }
    const double peak = meter.peak_gib();
    const vmstat v = kernel->vmstat();
    sampling.store(false);
    sampler.join();
    const teardown::pressure_monitor_stats after = monitor.stats();
    worker->exit();
    pin.reset();
    policy.reset();  // puts back what it changed: the freeze included
    kernel->thaw();
    kernel->flush();
    progress_done(run);
    std::printf("%-10s %10.3f %10.3f %10.2f %10.2f %9llu %6llu %7llu %10.2f\n", c.label, median(exit_ms),
                maximum(exit_ms), peak, peak / size, (unsigned long long)(after.episodes - before.episodes),
                (unsigned long long)v.queued, (unsigned long long)v.sync,
                double(queued_under_pressure_ms.load()) / 1e3);
    json row = json::object();
    row["policy"] = c.label;
    row["exit_ms"] = exit_ms;
    row["exit_ms_median"] = median(exit_ms);
    row["exit_ms_max"] = maximum(exit_ms);
    row["peak_held_gib"] = peak;
    row["peak_held_workers"] = peak / size;
    row["pressure_episodes"] = after.episodes - before.episodes;
    row["pressure_events"] = after.events - before.events;
    row["queued_under_pressure_s"] = double(queued_under_pressure_ms.load()) / 1e3;
    row["vmstat"] = vmstat_json(v);
    rows.push(std::move(row));
    std::this_thread::sleep_for(std::chrono::seconds(5));  // let the episode end before the next row
  }
  table["rows"] = std::move(rows);
  return table;
}

json question_1(const settings& run) {
  const int reps = run.reps > 0 ? run.reps : run.quick ? 3 : 5;
  // Spare CPU: at most old + new at once. One CPU: the whole run's workers may pile up.
  const double size = fitted_gib((run.quick ? 0.125 : 1.0) * run.scale, 2, "Q1");
  const double starved_size = fitted_gib((run.quick ? 1.0 / 32 : 0.25) * run.scale, reps + 1, "Q1, one CPU");
  const int shared_cpu = first_usable_cpu();

  std::printf("\nQ1: the max_pending_pages default. A supervisor kills a worker of S and respawns one of the\n"
              "same size at once, %d times per cap. W = 4 S: a machine on which the worker is a quarter of\n"
              "RAM. exit: the old worker's exit path. ready: kill -> replacement populated. peak held: the\n"
              "process's peak RSS above its baseline (old + new), in GiB and in workers (S). queued / fell\n"
              "back: the kills deferred / torn down inline (vmstat). pending max: the budget's high water.\n",
              reps);
  json result = json::object();
  const int near_reps = run.reps > 0 ? run.reps : run.quick ? 4 : 6;
  const double near_size =
      fitted_gib((run.quick ? 1.0 / 16 : 0.125) * run.scale, 2.0 * near_reps + 2, "Q1, near a limit");
  if (run.q1_pressure_only) {
    std::printf("\n(c) near a memory limit, with pressure: S = %s, %d kills per policy, supervisor and reaper on\n"
                "CPU %d.\n",
                size_label(near_size).c_str(), near_reps, shared_cpu);
    result["near_limit"] = q1_pressure_table(run, near_size, near_reps, shared_cpu);
    return result;
  }
  std::printf("\n(a) spare CPU: S = %s; the reaper may run on any of the %u CPUs.\n\n", size_label(size).c_str(),
              run.cpus);
  result["spare_cpu"] = q1_table(run, size, reps, -1);
  std::printf("\n(b) no spare CPU: S = %s; supervisor and reaper pinned to CPU %d, so the nice-19 reaper\n"
              "runs only in what the supervisor leaves (a busy machine).\n\n",
              size_label(starved_size).c_str(), shared_cpu);
  result["no_spare_cpu"] = q1_table(run, starved_size, reps, shared_cpu);
  std::printf("\n(c) near a memory limit, with pressure: S = %s, %d kills per policy, supervisor and reaper on\n"
              "CPU %d.\n",
              size_label(near_size).c_str(), near_reps, shared_cpu);
  result["near_limit"] = q1_pressure_table(run, near_size, near_reps, shared_cpu);
  std::printf("\nA cap below S sends every kill inline. Above it, each multiple of S the cap allows is one more\n"
              "old worker that may still be held while its replacement faults in.\n");
  return result;
}

// ---- Q2: one reaper or several ----------------------------------------------------------------

json question_2(const settings& run) {
  const int reps = run.reps > 0 ? run.reps : run.quick ? 2 : 5;
  const std::size_t processes = run.quick ? 4 : 8;
  const double size = fitted_gib((run.quick ? 1.0 / 16 : 0.25) * run.scale, double(processes), "Q2");
  const std::uint64_t pages = pages_of(size);
  const double total = gib_of(pages) * double(processes);

  std::vector<int> reaper_counts = {1, 2};
  for (int k = 4; k <= int(run.cpus); k *= 2) reaper_counts.push_back(k);

  std::printf("\nQ2: one reaper or several. %zu processes of %s (%s in all) exit at the same instant, one\n"
              "thread each. tail: release -> every page unmapped. %u CPUs usable here.\n",
              processes, size_label(size).c_str(), size_label(total).c_str(), run.cpus);
  if (run.cpus <= 2) {
    std::printf("Only %u CPU(s) here: more reapers than CPUs cannot help (they would only take turns on\n"
                "the same CPUs), so K stops at 2.\n",
                run.cpus);
  }
  std::printf("\n%-28s %10s %10s %10s %14s\n", "teardown by", "tail p50", "tail max", "GiB/s", "exit path max");
  std::printf("%-28s %10s %10s %10s %14s\n", "", "(ms)", "(ms)", "(p50)", "(ms, p50)");

  json result = json::object();
  result["processes"] = processes;
  result["size_gib"] = size;
  result["reps"] = reps;
  result["cpus"] = run.cpus;
  json rows = json::array();

  // reapers == 0: inline on the exiting threads.
  std::vector<int> cases = {0};
  cases.insert(cases.end(), reaper_counts.begin(), reaper_counts.end());
  for (int reapers : cases) {
    std::vector<double> tail_ms, exit_max_ms;
    const std::string label = reapers == 0 ? "inline, " + std::to_string(processes) + " exiting threads"
                                           : std::to_string(reapers) + (reapers == 1 ? " reaper" : " reapers");
    for (int rep = 0; rep < reps; ++rep) {
      progress(run, "Q2 " + label + ": populating " + std::to_string(rep + 1) + "/" + std::to_string(reps));
      std::vector<std::unique_ptr<mm_system>> kernels;
      for (int k = 0; k < std::max(reapers, 1); ++k) kernels.push_back(make_kernel(reapers > 0));
      std::vector<mm_system*> where;
      for (std::size_t i = 0; i < processes; ++i) where.push_back(kernels[i % kernels.size()].get());
      std::vector<task_ptr> tasks = spawn_all(where, pages, run.cpus);
      progress(run, "Q2 " + label + ": exiting " + std::to_string(rep + 1) + "/" + std::to_string(reps));
      const exit_wave wave = exit_all_at_once(tasks);
      for (const auto& kernel : kernels) kernel->flush();
      tail_ms.push_back(ms_between(wave.released, clock_type::now()));
      exit_max_ms.push_back(maximum(wave.exit_ms));
      for (const auto& kernel : kernels) {
        const vmstat v = kernel->vmstat();
        if (reapers > 0 && v.sync != 0) std::printf("  (warning: %llu exits fell back)\n", (unsigned long long)v.sync);
      }
    }
    progress_done(run);
    std::printf("%-28s %10.1f %10.1f %10.2f %14.3f\n", label.c_str(), median(tail_ms), maximum(tail_ms),
                total / (median(tail_ms) / 1e3), median(exit_max_ms));
    json row = json::object();
    row["teardown_by"] = label;
    row["reapers"] = reapers;
    row["tail_ms"] = tail_ms;
    row["tail_ms_median"] = median(tail_ms);
    row["tail_ms_max"] = maximum(tail_ms);
    row["gib_per_s"] = total / (median(tail_ms) / 1e3);
    row["exit_path_max_ms"] = exit_max_ms;
    row["exit_path_max_ms_median"] = median(exit_max_ms);
    rows.push(std::move(row));
  }
  result["rows"] = std::move(rows);
  return result;
}

// ---- Q3: CPU accounting -----------------------------------------------------------------------

json question_3(const settings& run) {
  const int reps = run.reps > 0 ? run.reps : run.quick ? 1 : 2;
  const std::size_t per_group[2] = {3, 1};
  const std::size_t processes = per_group[0] + per_group[1];
  const double size = fitted_gib((run.quick ? 1.0 / 16 : 0.5) * run.scale, double(processes), "Q3");
  const std::uint64_t pages = pages_of(size);
  const char* const groups[2] = {"A", "B"};

  // Per cgroup, summed over the repetitions: inline CPU on the exiting thread, and deferred: the
  // exiting thread's CPU and what the reaper charged to the account.
  double inline_ms[2] = {0, 0}, deferred_exit_ms[2] = {0, 0}, reaper_ms[2] = {0, 0};
  double worker_delta_ms = 0;
  for (int rep = 0; rep < reps; ++rep) {
    for (const bool async : {false, true}) {
      progress(run, std::string("Q3 ") + (async ? "deferred" : "inline") + ": populating " + std::to_string(rep + 1) +
                        "/" + std::to_string(reps));
      const auto kernel = make_kernel(async);
      std::vector<task_ptr> tasks = spawn_all(std::vector<mm_system*>(processes, kernel.get()), pages, run.cpus);
      std::atomic<std::uint64_t> account[2] = {0, 0};
      const std::uint64_t worker_before = kernel->stats().reaper.worker_cpu_ns;
      progress(run, std::string("Q3 ") + (async ? "deferred" : "inline") + ": exiting");
      for (std::size_t i = 0; i < processes; ++i) {
        const int group = i < per_group[0] ? 0 : 1;
        tasks[i]->mm()->cpu_owner = &account[group];  // this cgroup's account
        const double before = thread_cpu_ms();
        tasks[i]->exit();
        (async ? deferred_exit_ms : inline_ms)[group] += thread_cpu_ms() - before;
      }
      kernel->flush();
      if (async) {
        worker_delta_ms += double(kernel->stats().reaper.worker_cpu_ns - worker_before) / 1e6;
        for (int g = 0; g < 2; ++g) reaper_ms[g] += double(account[g].load()) / 1e6;
      }
    }
  }
  progress_done(run);

  std::printf("\nQ3: CPU accounting. Cgroup A owns %zu processes of %s, B owns %zu; each process exits, %d\n"
              "time(s) inline and %d deferred. CPU in ms, summed over the repetitions.\n\n",
              per_group[0], size_label(size).c_str(), per_group[1], reps, reps);
  std::printf("%-8s %16s %16s %18s %10s\n", "cgroup", "inline: exiting", "deferred:", "deferred: reaper,", "reaper /");
  std::printf("%-8s %16s %16s %18s %10s\n", "", "thread", "exiting thread", "charged to owner", "inline");
  json result = json::object();
  result["size_gib"] = size;
  result["reps"] = reps;
  json rows = json::array();
  for (int g = 0; g < 2; ++g) {
    std::printf("%-8s %16.2f %16.3f %18.2f %10.2f\n", groups[g], inline_ms[g], deferred_exit_ms[g], reaper_ms[g],
                inline_ms[g] > 0 ? reaper_ms[g] / inline_ms[g] : 0.0);
    json row = json::object();
    row["cgroup"] = groups[g];
    row["processes"] = per_group[g];
    row["inline_exiting_thread_cpu_ms"] = inline_ms[g];
    row["deferred_exiting_thread_cpu_ms"] = deferred_exit_ms[g];
    row["deferred_reaper_charged_cpu_ms"] = reaper_ms[g];
    rows.push(std::move(row));
  }
  const double charged = reaper_ms[0] + reaper_ms[1];
  const double inline_total = inline_ms[0] + inline_ms[1];
  std::printf("%-8s %16.2f %16.3f %18.2f %10.2f\n", "A + B", inline_total, deferred_exit_ms[0] + deferred_exit_ms[1],
              charged, inline_total > 0 ? charged / inline_total : 0.0);
  std::printf(
      "\nreaper thread CPU over the deferred runs: %.2f ms; charged to A + B: %.2f ms (%.1f%%); the rest,\n"
      "%.2f ms, is the worker's own polling, wake-ups and bookkeeping, which no owner is charged for.\n"
      "Share charged to A: %.1f%% (it owns %zu of the %zu processes).\n",
      worker_delta_ms, charged, worker_delta_ms > 0 ? 100 * charged / worker_delta_ms : 0.0, worker_delta_ms - charged,
      charged > 0 ? 100 * reaper_ms[0] / charged : 0.0, per_group[0], processes);
  result["rows"] = std::move(rows);
  result["reaper_worker_cpu_delta_ms"] = worker_delta_ms;
  result["charged_ms"] = charged;
  result["unattributed_ms"] = worker_delta_ms - charged;
  result["inline_total_ms"] = inline_total;
  return result;
}

// ---- Q6: the freeze latency bound -------------------------------------------------------------

std::uint64_t now_ns() {
  return std::uint64_t(
      std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now().time_since_epoch()).count());
}

// The reap trace point fires on the reaper just before each teardown. Its timestamps give each
// item's wall time on the reaper, and how many items started while a freeze() waited.
struct reap_log {
  static constexpr std::size_t capacity = 1024;
  static inline std::atomic<std::size_t> count{0};
  static inline std::atomic<std::uint64_t> start_ns[capacity];

  static void on_reap(const teardown::trace::reap_event&) {
    const std::size_t at = count.fetch_add(1, std::memory_order_relaxed);
    if (at < capacity) start_ns[at].store(now_ns(), std::memory_order_relaxed);
  }
};

json question_6(const settings& run) {
  const std::vector<double> sizes =
      run.quick ? std::vector<double>{1.0 / 16, 1.0 / 8, 1.0 / 4} : std::vector<double>{0.25, 0.5, 1.0};
  const double backlog_gib = (run.quick ? 0.5 : 2.0) * run.scale;
  const std::size_t wanted_samples = run.quick ? 2 : 10;
  std::mt19937 random(6);  // fixed: the same freeze moments each run

  std::printf("\nQ6: the freeze latency bound. The reaper tears down a backlog of about %s of mms of one\n"
              "size; freeze() is called at pseudo-random moments, timed until it returns, then thaw().\n"
              "inline: one mm of that size torn down on the caller. on reaper: each item's wall time on\n"
              "the reaper (reap trace point to the next, frozen time excluded). freeze / item: a freeze's\n"
              "latency over the wall time of the item it waited for. started: items the reaper began while\n"
              "one freeze() waited (1 only when the request met the start of the next item).\n\n",
              size_label(backlog_gib).c_str());
  std::printf("%-8s %5s %7s %8s %8s %8s %9s %9s %8s %7s\n", "mm size", "items", "freezes", "inline", "on reaper",
              "reaper", "freeze", "freeze", "freeze /", "started");
  std::printf("%-8s %5s %7s %8s %8s %8s %9s %9s %8s %7s\n", "", "", "", "(ms)", "p50 (ms)", "max (ms)", "p50 (ms)",
              "max (ms)", "item max", "max");

  json result = json::object();
  result["backlog_gib"] = backlog_gib;
  json rows = json::array();

  // Control: a reaper with nothing to do parks at once.
  {
    const auto kernel = make_kernel(true);
    std::vector<double> idle_ms;
    for (int i = 0; i < 5; ++i) {
      const auto start = clock_type::now();
      kernel->freeze();
      idle_ms.push_back(ms_between(start, clock_type::now()));
      kernel->thaw();
    }
    std::printf("%-8s %5s %7zu %8s %8s %8s %9.3f %9.3f %8s %7s\n", "idle", "0", idle_ms.size(), "-", "-", "-",
                median(idle_ms), maximum(idle_ms), "-", "-");
    json row = json::object();
    row["size"] = "idle";
    row["freeze_ms"] = idle_ms;
    row["freeze_ms_median"] = median(idle_ms);
    row["freeze_ms_max"] = maximum(idle_ms);
    rows.push(std::move(row));
  }

  teardown::trace::set_hook<teardown::trace::reap_event>(&reap_log::on_reap);
  for (double wanted : sizes) {
    const std::size_t items = std::max<std::size_t>(2, std::size_t(std::lround(backlog_gib / (wanted * run.scale))));
    const double size = fitted_gib(wanted * run.scale, double(items), "Q6");
    const std::uint64_t pages = pages_of(size);
    const auto kernel = make_kernel(true);

    kernel->set_async_mm_teardown(false);
    progress(run, "Q6 " + size_label(size) + ": one inline teardown");
    auto single = kernel->spawn(pages, backing::real);
    const auto single_start = clock_type::now();
    single->exit();
    const double inline_ms = ms_between(single_start, clock_type::now());
    kernel->set_async_mm_teardown(true);

    std::vector<double> freeze_ms, item_ms, freeze_over_item;
    std::uint64_t started_max = 0;
    std::atomic<std::uint64_t> reaper_cpu_ns{0};
    std::size_t torn_down = 0;
    for (int rep = 0; freeze_ms.size() < wanted_samples && rep < 8; ++rep) {
      progress(run, "Q6 " + size_label(size) + ": populating a backlog of " + std::to_string(items));
      std::vector<task_ptr> tasks = spawn_all(std::vector<mm_system*>(items, kernel.get()), pages, run.cpus);
      // A small mm queued behind the backlog: its reap marks the end of the last real item.
      tasks.push_back(kernel->spawn(kernel->thresh_pages(), backing::real));
      progress(run, "Q6 " + size_label(size) + ": freezing during the drain");
      reap_log::count.store(0, std::memory_order_relaxed);  // the reaper is idle: nothing queued
      struct frozen_span {
        std::uint64_t parked_ns, thawed_ns;
        std::size_t started;  // items begun by then: the last is the one the freeze waited for
        double latency_ms;
      };
      std::vector<frozen_span> spans;
      for (std::size_t i = 0; i < tasks.size(); ++i) {
        if (i < items) tasks[i]->mm()->cpu_owner = &reaper_cpu_ns;  // not the marker
        tasks[i]->exit();
      }
      std::uniform_real_distribution<double> delay(0.1 * inline_ms, 0.9 * inline_ms);
      for (;;) {
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(delay(random)));
        const vmstat before = kernel->vmstat();
        if (before.reaped >= before.queued) break;  // drained: a freeze now would find the reaper idle
        const std::size_t started_before = reap_log::count.load(std::memory_order_relaxed);
        const auto start = clock_type::now();
        kernel->freeze();
        const auto parked = clock_type::now();
        const std::size_t started = reap_log::count.load(std::memory_order_relaxed);
        kernel->thaw();
        const std::uint64_t thawed = now_ns();
        spans.push_back(
            {std::uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(parked.time_since_epoch()).count()),
             thawed, started, ms_between(start, parked)});
        started_max = std::max<std::uint64_t>(started_max, started - started_before);
      }
      kernel->flush();
      torn_down += items;

      // Each real item's wall time on the reaper: from its start to the next one's (the last
      // one's: to the marker's), less the time the reaper spent parked in between.
      const std::size_t logged = std::min(reap_log::count.load(std::memory_order_relaxed), reap_log::capacity);
      std::vector<double> walls(std::min(items, logged > 0 ? logged - 1 : 0));
      for (std::size_t i = 0; i < walls.size(); ++i) {
        const std::uint64_t begin = reap_log::start_ns[i].load(std::memory_order_relaxed);
        const std::uint64_t end = reap_log::start_ns[i + 1].load(std::memory_order_relaxed);
        std::uint64_t parked = 0;
        for (const frozen_span& span : spans) {
          if (span.parked_ns >= begin && span.thawed_ns <= end) parked += span.thawed_ns - span.parked_ns;
        }
        walls[i] = double(end - begin - std::min(parked, end - begin)) / 1e6;
        item_ms.push_back(walls[i]);
      }
      // Freezes that waited for a real item (not for the marker).
      for (const frozen_span& span : spans) {
        if (span.started == 0 || span.started > walls.size()) continue;
        freeze_ms.push_back(span.latency_ms);
        if (walls[span.started - 1] > 0) freeze_over_item.push_back(span.latency_ms / walls[span.started - 1]);
      }
    }
    progress_done(run);
    const double cpu_per_item = double(reaper_cpu_ns.load()) / 1e6 / double(torn_down);
    std::printf("%-8s %5zu %7zu %8.1f %8.1f %8.1f %9.1f %9.1f %8.2f %7llu\n", size_label(size).c_str(), items,
                freeze_ms.size(), inline_ms, median(item_ms), maximum(item_ms), median(freeze_ms), maximum(freeze_ms),
                maximum(freeze_over_item), (unsigned long long)started_max);
    json row = json::object();
    row["size_gib"] = size;
    row["items"] = items;
    row["inline_one_item_ms"] = inline_ms;
    row["reaper_item_wall_ms"] = item_ms;
    row["reaper_item_wall_ms_median"] = median(item_ms);
    row["reaper_item_wall_ms_max"] = maximum(item_ms);
    row["reaper_cpu_per_item_ms"] = cpu_per_item;
    row["freeze_ms"] = freeze_ms;
    row["freeze_ms_median"] = median(freeze_ms);
    row["freeze_ms_max"] = maximum(freeze_ms);
    row["freeze_over_item_in_progress_max"] = maximum(freeze_over_item);
    row["items_started_during_a_freeze_max"] = started_max;
    rows.push(std::move(row));
  }
  teardown::trace::clear_hook<teardown::trace::reap_event>();
  std::printf("\nA freeze waits for the item in progress and never for the backlog behind it: freeze / item\n"
              "stays at or below 1. The bound is one item as the reaper runs it: at nice 19 on a busy\n"
              "machine that wall time can be several times the inline one.\n");
  result["rows"] = std::move(rows);
  return result;
}

json machine_json(const settings& run) {
  utsname name{};
  uname(&name);
  json machine = json::object();
  machine["cpus_usable"] = run.cpus;
  machine["cpus_online"] = std::thread::hardware_concurrency();
  machine["cpu_model"] = cpu_model();
  machine["mem_total_gib"] = double(proc_kib("/proc/meminfo", "MemTotal")) / (1 << 20);
  machine["mem_available_gib"] = mem_available_gib();
  machine["kernel"] = std::string(name.sysname) + " " + name.release;
  machine["page_size"] = mm_system::page_size();
  machine["loadavg_at_start"] = first_line("/proc/loadavg");
  return machine;
}

int usage(const char* program) {
  std::fprintf(stderr,
               "usage: %s [--quick] [--questions 1,2,3,6] [--q1-pressure-only] [--q1-busy-ms N] [--q1-stall-ms N] "
               "[--q1-tight] [--out FILE] [--scale F] [--reps N]\n",
               program);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  settings run;
  run.cpus = usable_cpus();
  run.show_progress = isatty(STDERR_FILENO) != 0;
  std::set<int> questions = {1, 2, 3, 6};
  std::string out_path;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--quick") {
      run.quick = true;
    } else if (arg == "--questions" && has_value) {
      questions.clear();
      const std::string list = argv[++i];
      for (std::size_t at = 0; at < list.size();) {
        const std::size_t comma = std::min(list.find(',', at), list.size());
        const int q = std::atoi(list.substr(at, comma - at).c_str());
        if (q != 1 && q != 2 && q != 3 && q != 6) {
          std::fprintf(stderr, "%s: --questions takes 1, 2, 3 and 6 (4 and 5 are not modelled)\n", argv[0]);
          return 2;
        }
        questions.insert(q);
        at = comma + 1;
      }
    } else if (arg == "--q1-busy-ms" && has_value) {
      run.q1_busy_ms = std::atoi(argv[++i]);
      if (run.q1_busy_ms < 0) return usage(argv[0]);
    } else if (arg == "--q1-tight") {
      run.q1_tight = true;
    } else if (arg == "--q1-stall-ms" && has_value) {
      run.q1_stall_ms = std::atoi(argv[++i]);
      if (run.q1_stall_ms < 1 || run.q1_stall_ms > 2000) return usage(argv[0]);
    } else if (arg == "--q1-pressure-only") {
      run.q1_pressure_only = true;
      questions = {1};
    } else if (arg == "--out" && has_value) {
      out_path = argv[++i];
    } else if (arg == "--scale" && has_value) {
      run.scale = std::atof(argv[++i]);
      if (!(run.scale > 0)) return usage(argv[0]);
    } else if (arg == "--reps" && has_value) {
      run.reps = std::atoi(argv[++i]);
      if (run.reps < 1) return usage(argv[0]);
    } else {
      return usage(argv[0]);
    }
  }

  json results = json::object();
  results["program"] = "mm_reaper_tradeoffs";
  results["mode"] = run.quick ? "quick" : "full";
  results["scale"] = run.scale;
  results["machine"] = machine_json(run);
  std::printf("mm_reaper_tradeoffs (%s): the model kernel on real memory. %u CPUs usable, %s, %.1f GiB RAM (%.1f GiB\n"
              "available), load average %s. Reapers run at nice 19, as mm_reaper does.\n",
              run.quick ? "--quick" : "full run", run.cpus, cpu_model().c_str(),
              double(proc_kib("/proc/meminfo", "MemTotal")) / (1 << 20), mem_available_gib(),
              first_line("/proc/loadavg").c_str());

  const auto start = clock_type::now();
  try {
    if (questions.count(1) != 0) results["q1"] = question_1(run);
    if (questions.count(2) != 0) results["q2"] = question_2(run);
    if (questions.count(3) != 0) results["q3"] = question_3(run);
    if (questions.count(6) != 0) results["q6"] = question_6(run);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "mm_reaper_tradeoffs: %s\n", error.what());
    return 1;
  }
  const double seconds = ms_between(start, clock_type::now()) / 1e3;
  results["machine"]["loadavg_at_end"] = first_line("/proc/loadavg");
  results["seconds"] = seconds;
  std::printf("\n%.1f s; load average at the end %s\n", seconds, first_line("/proc/loadavg").c_str());

  if (!out_path.empty()) {
    std::ofstream out(out_path);
    out << results.dump() << "\n";
    if (!out) {
      std::fprintf(stderr, "mm_reaper_tradeoffs: cannot write %s\n", out_path.c_str());
      return 1;
    }
    std::printf("results: %s\n", out_path.c_str());
  }
  return 0;
}
