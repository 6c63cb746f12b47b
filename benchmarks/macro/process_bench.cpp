// process_bench — what a waiter gains from shadow teardown (process.hpp) and a supervisor from
// process_mrelease (process_reaper.hpp), and where the cost went. A plain program, not Google
// Benchmark: each measurement is a real process populated with gigabytes, repeated (--reps) and
// summarised as median / min / max. JSON on stdout (or --out); progress and a table on stderr.
//
//   process_bench [--sizes 1,4] [--reps 3] [--quick] [--out FILE] [--mem-fraction F] [--no-thp]
//                 [--busy N] [--vma-mib M]
//     --sizes LIST   GiB each program populates (default 1,4); --quick: 0.25 and 1 repetition
//     --reps N       repetitions (default 3); within each, the techniques (below) take turns, so
//                    that drift hits them alike
//     --mem-fraction populate at most F of MemAvailable (default 0.6); a size above is skipped
//     --no-thp       PR_SET_THP_DISABLE for the programs: 4 KiB pages whatever the system says
//                    (the default leaves the system's setting, recorded in "machine")
//     --vma-mib M    map the program's memory as mappings of M MiB each, a PROT_NONE page between
//                    (so the kernel keeps them apart), as an allocator's arenas and heaps are;
//                    default: one mapping. The kernel's exit path unmaps from the lowest
//                    address up; process_mrelease, on a kernel with the OOM reaper's reverse
//                    walk (6.18 here has it: benchmarks/macro/mrelease_order.cpp, its output in
//                    benchmarks/results/quiet-2cpus-2026-12-01/mrelease_order.txt), from the
//                    highest mapping down, so with many mappings the
//                    two start from opposite ends instead of one trailing the other
//     --busy N       a busy machine: N processes spin at nice 0 for the whole run (one per CPU
//                    is the case a supervisor meets under load), so that the victim's exit, the
//                    reaper's worker and the helpers compete for the CPUs
//
// Five techniques take turns. The program side: "none" (no helper), "nice19"
// (enable_shadow_teardown() with the default options: the helper at nice 19) or "idle" (with
// sched_idle = true: the helper in SCHED_IDLE). The supervisor side: kill(2) from this process,
// or ("mrelease": true) a process_reaper's kill(): pidfd_send_signal, then process_mrelease on
// its worker thread, which reaps the anonymous memory while the program exits.
//   kill              none,   kill(2)           the baseline: the exit pays for the teardown
//   kill+mrelease     none,   process_reaper    what Android's lmkd does
//   shadow            nice19, kill(2)
//   shadow-idle       idle,   kill(2)
//   shadow+mrelease   nice19, process_reaper    the kernel refuses (EINVAL: the helper shares
//                                               the mm and is not dying); counted as shared_mm
// One measurement: a fork()ed program (with a helper: enable_shadow_teardown() first, timed as
// enable_us) maps --sizes GiB of anonymous memory, touches every page, reports and blocks. Then,
// from this process:
//   kill_to_waitpid_ms  SIGKILL -> waitpid() returning: what a supervisor, a shell or a test
//                       harness waits for. Without a helper this includes the whole teardown.
//   held_at_waitpid_gib how much of the program's memory was still not free when waitpid()
//                       returned (free memory before populating minus free memory then).
//   memory_back_ms      SIGKILL -> the free memory back within 10% of the size of its value
//                       before populating (polled about every 1 ms; bounded at 30 s + 10 s per
//                       GiB, a repetition that hits the bound counts it, memory_back_timeouts).
//   helper_gone_ms      with a helper: SIGKILL -> the helper has exited (gone from /proc or a
//                       zombie), i.e. its teardown is done.
//   outcomes            with mrelease: what the reaper's worker saw, summed over the repetitions
//                       (process_reaper_stats: released, raced, shared_mm, ...).
// Free memory is MemAvailable plus the pages on the per-CPU free lists (/proc/zoneinfo
// "count:"), which MemAvailable leaves out and which can hold hundreds of MiB per CPU since
// Linux 6.7 (exit_matrix.cpp's memory_gauge explains it). memory_back_ms says whether the
// teardown cost vanished or only moved off the waiter's path.
//
// JSON: {"benchmark": "process_bench", "machine": {...}, "config": {...},
//        "rows": [{"size_gib", "technique", "helper" ("none" | "nice19" | "idle"), "mrelease",
//                  "reps", "kill_to_waitpid_ms" {S}, "held_at_waitpid_gib" {S},
//                  "memory_back_ms" {S}, ["helper_gone_ms" {S}, "enable_us" {S}],
//                  ["outcomes" {...}], ["memory_back_timeouts"], ["skipped"]}]}
//        {S} = {"median", "min", "max"}
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "teardown/process.hpp"
#include "teardown/process_reaper.hpp"

#include "machine_info.hpp"
#include "macro_support.hpp"

namespace {

using teardown_bench::json_object;
using teardown_bench::ms_between;
using teardown_bench::progress;
using teardown_bench::strprintf;
using teardown_bench::summarize;
using teardown_bench::summary;

using clock_type = std::chrono::steady_clock;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// ---- options --------------------------------------------------------------------------------

struct options {
  std::vector<double> sizes_gib{1, 4};
  int reps = 3;
  double mem_fraction = 0.6;
  bool quick = false;
  bool no_thp = false;
  int busy = 0;
  int vma_mib = 0;  // 0: one mapping
  std::string out;
};

constexpr const char* kUsage =
    "usage: process_bench [--sizes 1,4] [--reps 3] [--quick] [--out FILE] [--mem-fraction F] [--no-thp]\n"
    "  --sizes LIST      GiB each program populates (default 1,4)\n"
    "  --reps N          repetitions (default 3)\n"
    "  --quick           0.25 GiB, 1 repetition (explicit flags win)\n"
    "  --out FILE        write the JSON there (default: stdout)\n"
    "  --mem-fraction F  populate at most F of MemAvailable (default 0.6)\n"
    "  --no-thp          4 KiB pages for the programs (PR_SET_THP_DISABLE)\n"
    "  --busy N          N processes spinning at nice 0 for the whole run (default 0)\n"
    "  --vma-mib M       the program's memory as mappings of M MiB (default: one mapping)\n";

constexpr teardown_bench::command_line kCommandLine{"process_bench", kUsage};

options parse_options(int argc, char** argv) {
  options opts;
  // Applied after --quick's defaults, which they override.
  const teardown_bench::command_line::given given = kCommandLine.parse(argc, argv, {"--quick", "--no-thp"});
  opts.quick = given.has("--quick");
  opts.no_thp = given.has("--no-thp");
  if (opts.quick) {
    opts.sizes_gib = {0.25};
    opts.reps = 1;
  }
  for (const auto& [name, value] : given.flags) {
    if (name == "--sizes") {
      opts.sizes_gib.clear();
      for (const std::string& part : teardown_bench::split_list(value)) {
        opts.sizes_gib.push_back(kCommandLine.positive(name, part));
      }
    } else if (name == "--reps") {
      opts.reps = kCommandLine.count(name, value, 1000);
    } else if (name == "--mem-fraction") {
      opts.mem_fraction = kCommandLine.positive(name, value);
      if (opts.mem_fraction > 0.95) kCommandLine.usage_error("--mem-fraction: at most 0.95");
    } else if (name == "--vma-mib") {
      opts.vma_mib = kCommandLine.count(name, value, 1 << 20);
    } else if (name == "--busy") {
      opts.busy = kCommandLine.count(name, value, 1024);
    } else if (name == "--out") {
      opts.out = value;
    } else {
      kCommandLine.usage_error("unknown flag " + name);
    }
  }
  return opts;
}

// ---- free memory ------------------------------------------------------------------------------

std::string read_all(const char* path) {
  std::string text;
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return text;
  char buffer[16384];
  ssize_t got;
  while ((got = read(fd, buffer, sizeof buffer)) > 0) text.append(buffer, static_cast<std::size_t>(got));
  close(fd);
  return text;
}

std::uint64_t meminfo_bytes(std::string_view field) {
  const std::string text = read_all("/proc/meminfo");
  const std::size_t at = text.find(field);
  if (at == std::string::npos) throw std::runtime_error("/proc/meminfo has no " + std::string(field));
  return std::strtoull(text.c_str() + at + field.size(), nullptr, 10) * 1024;  // the file says kB
}

// MemAvailable plus the pages on the per-CPU free lists.
std::uint64_t free_bytes() {
  const std::string zones = read_all("/proc/zoneinfo");
  constexpr std::string_view key = "count:";
  std::uint64_t pages = 0;
  for (std::size_t at = zones.find(key); at != std::string::npos; at = zones.find(key, at + key.size())) {
    pages += std::strtoull(zones.c_str() + at + key.size(), nullptr, 10);
  }
  return meminfo_bytes("MemAvailable:") + pages * static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
}

// Gone from /proc, or a zombie: its exit, teardown included, is complete.
bool ended(pid_t pid) {
  const std::string stat = read_all(("/proc/" + std::to_string(pid) + "/stat").c_str());
  const std::size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return true;
  const char state = stat[close + 2];
  return state == 'Z' || state == 'X';
}

// ---- one measurement ------------------------------------------------------------------------

struct program_report {
  int error = 0;  // errno of the failed step, 0 if none
  int step = 0;   // 1 enable_shadow_teardown, 2 mmap
  pid_t helper = 0;
  double enable_us = NAN;
};

// The program: a fork()ed child of this single-threaded benchmark. Never returns.
enum class helper_kind { none, nice19, idle };

const char* kind_name(helper_kind kind) {
  return kind == helper_kind::none ? "none" : kind == helper_kind::nice19 ? "nice19" : "idle";
}

// The program's side (a helper or not) and the supervisor's (kill(2), or a process_reaper).
struct technique {
  const char* name;
  helper_kind helper;
  bool mrelease;
};
constexpr technique kTechniques[] = {
    {"kill", helper_kind::none, false},     {"kill+mrelease", helper_kind::none, true},
    {"shadow", helper_kind::nice19, false}, {"shadow-idle", helper_kind::idle, false},
    {"shadow+mrelease", helper_kind::nice19, true},
};
constexpr int kTechniqueCount = static_cast<int>(std::size(kTechniques));

[[noreturn]] void program_main(int report_fd, std::size_t bytes, helper_kind kind, bool no_thp, std::size_t vma_bytes) {
  // Dies with the benchmark, whatever happens to it.
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) _exit(1);
  if (no_thp) (void)prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0);
  program_report report;
  if (kind != helper_kind::none) {
    const auto start = clock_type::now();
    try {
      report.helper = teardown::process::enable_shadow_teardown({.sched_idle = kind == helper_kind::idle});
      report.enable_us = ms_between(start, clock_type::now()) * 1e3;
    } catch (const std::system_error& e) {
      report.error = e.code().value();
      report.step = 1;
    }
  }
  if (report.error == 0) {
    // One mapping, or chunks of vma_bytes with a PROT_NONE page after each (which splits them
    // into separate VMAs that the kernel cannot merge back).
    const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    const std::size_t chunk = vma_bytes == 0 ? bytes : vma_bytes;
    const std::size_t chunks = (bytes + chunk - 1) / chunk;
    const std::size_t span = vma_bytes == 0 ? bytes : chunks * (chunk + page);
    void* const base = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
      report.error = errno;
      report.step = 2;
    } else {
      auto* const bytes_at = static_cast<volatile unsigned char*>(base);
      for (std::size_t c = 0; c < chunks; ++c) {
        const std::size_t start = vma_bytes == 0 ? 0 : c * (chunk + page);
        const std::size_t length = std::min(chunk, bytes - c * chunk);
        if (vma_bytes != 0 && mprotect(const_cast<unsigned char*>(bytes_at) + start + chunk, page, PROT_NONE) != 0) {
          report.error = errno;
          report.step = 2;
          break;
        }
        for (std::size_t at = start; at < start + length; at += page) bytes_at[at] = 1;
      }
    }
  }
  if (write(report_fd, &report, sizeof report) != static_cast<ssize_t>(sizeof report)) _exit(3);
  for (;;) pause();
}

struct sample {
  double kill_to_waitpid_ms = NAN;
  double held_at_waitpid_gib = NAN;
  double memory_back_ms = NAN;
  double helper_gone_ms = NAN;
  double enable_us = NAN;
  bool memory_back_timed_out = false;
};

// killer: the process_reaper for the mrelease techniques, null for kill(2).
sample measure(double bytes, helper_kind kind, bool no_thp, std::size_t vma_bytes,
               teardown::process::process_reaper* killer) {
  const bool shadow = kind != helper_kind::none;
  const std::uint64_t before = free_bytes();
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe2");
  std::fflush(stderr);
  const pid_t program = fork();
  if (program == 0) {
    close(fds[0]);
    program_main(fds[1], static_cast<std::size_t>(bytes), kind, no_thp, vma_bytes);
  }
  const int fork_error = errno;
  close(fds[1]);
  if (program < 0) {
    close(fds[0]);
    throw std::system_error(fork_error, std::generic_category(), "fork");
  }
  // Kills and reaps the program on every path out of here.
  struct program_guard {
    pid_t pid;
    bool reaped = false;
    ~program_guard() {
      if (reaped) return;
      kill(pid, SIGKILL);
      while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
  } guard{program};

  const int timeout_ms = 30'000 + static_cast<int>(10'000 * bytes / kGiB);
  const auto report = teardown_bench::read_child_report<program_report>(fds[0], timeout_ms, "the program");
  if (report.error != 0) {
    throw std::system_error(report.error, std::generic_category(),
                            report.step == 1 ? "program: enable_shadow_teardown" : "program: mmap");
  }

  sample s;
  s.enable_us = report.enable_us;
  // The pidfd is opened before the clock starts: a supervisor holds one from the spawn.
  std::optional<teardown::process::pidfd_process> pidfd;
  if (killer != nullptr) pidfd = teardown::process::pidfd_process::adopt(program);
  const auto start = clock_type::now();
  if (killer != nullptr) {
    killer->kill(*pidfd);
  } else {
    kill(program, SIGKILL);
  }
  while (waitpid(program, nullptr, 0) < 0 && errno == EINTR) {
  }
  guard.reaped = true;
  const auto reaped = clock_type::now();
  s.kill_to_waitpid_ms = ms_between(start, reaped);
  const std::uint64_t at_waitpid = free_bytes();
  s.held_at_waitpid_gib = at_waitpid < before ? static_cast<double>(before - at_waitpid) / kGiB : 0.0;

  // Until the memory is back and, with a helper, the helper is gone; the helper ends by itself
  // (its program died), so a helper still there at the bound is killed and the run fails.
  const auto slack = static_cast<std::uint64_t>(0.1 * bytes);
  const std::uint64_t target = before > slack ? before - slack : 0;
  const auto deadline = start + std::chrono::milliseconds(30'000 + static_cast<int>(10'000 * bytes / kGiB));
  std::optional<clock_type::time_point> memory_back, helper_gone;
  for (;;) {
    const auto now = clock_type::now();
    if (!helper_gone && (!shadow || ended(report.helper))) helper_gone = now;
    if (!memory_back && free_bytes() >= target) memory_back = clock_type::now();
    if (memory_back && helper_gone) break;
    if (now > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (shadow && !helper_gone) {
    kill(report.helper, SIGKILL);
    throw std::runtime_error("the helper outlived its program");
  }
  if (killer != nullptr) killer->flush();  // its worker is done with this one before the next
  s.memory_back_timed_out = !memory_back;
  s.memory_back_ms = ms_between(start, memory_back.value_or(clock_type::now()));
  if (shadow) s.helper_gone_ms = ms_between(start, *helper_gone);
  return s;
}

// What the process_reaper's worker saw for one technique: stats() differences, summed.
struct outcome_counts {
  std::uint64_t released = 0, raced = 0, shared_mm = 0, not_dying = 0, other = 0;

  void add(const teardown::process::process_reaper_stats& before,
           const teardown::process::process_reaper_stats& after) {
    released += after.released - before.released;
    raced += after.raced - before.raced;
    shared_mm += after.shared_mm - before.shared_mm;
    not_dying += after.not_dying - before.not_dying;
    other += (after.unsupported - before.unsupported) + (after.not_permitted - before.not_permitted) +
             (after.failed - before.failed);
  }
  json_object json() const {
    return json_object()
        .set("released", released)
        .set("raced", raced)
        .set("shared_mm", shared_mm)
        .set("not_dying", not_dying)
        .set("other", other);
  }
  std::string text() const {
    return strprintf("released %llu raced %llu shared_mm %llu other %llu", static_cast<unsigned long long>(released),
                     static_cast<unsigned long long>(raced), static_cast<unsigned long long>(shared_mm),
                     static_cast<unsigned long long>(not_dying + other));
  }
};

// ---- the machine ------------------------------------------------------------------------------

json_object machine() {
  return json_object()
      .set("cpus", static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)))
      .set("mem_total_gib", static_cast<double>(meminfo_bytes("MemTotal:")) / kGiB)
      .set("mem_available_gib", static_cast<double>(meminfo_bytes("MemAvailable:")) / kGiB)
      .set("page_size", static_cast<int>(sysconf(_SC_PAGESIZE)))
      .set("cpu_model", teardown_bench::cpu_model())
      .set("kernel", teardown_bench::kernel_release())
      .set("transparent_hugepage", teardown_bench::first_line("/sys/kernel/mm/transparent_hugepage/enabled"))
      .set("load_average_1m", teardown_bench::load_average_1m());
}

}  // namespace

int main(int argc, char** argv) {
  const options opts = parse_options(argc, argv);
  if (!teardown::process::shadow_teardown_supported) {
    std::fprintf(stderr, "process_bench: shadow teardown is not supported on this platform\n");
    return 1;
  }
  try {
    const json_object machine_json = machine();
    // One supervisor's reaper for every mrelease measurement (nice 0, its default).
    teardown::process::process_reaper killer;
    const teardown_bench::cpu_hogs hogs(opts.busy);
    std::vector<json_object> rows;
    std::vector<std::string> table;
    const auto run_start = clock_type::now();
    for (const double gib : opts.sizes_gib) {
      const double bytes = gib * kGiB;
      const double available = static_cast<double>(meminfo_bytes("MemAvailable:"));
      std::optional<std::string> skipped;
      if (bytes > opts.mem_fraction * available) {
        skipped = strprintf("%.3g GiB is more than %.2f of MemAvailable (%.1f GiB)", gib, opts.mem_fraction,
                            available / kGiB);
      }
      std::vector<sample> samples[kTechniqueCount];
      outcome_counts outcomes[kTechniqueCount];
      for (int rep = 0; rep < opts.reps && !skipped; ++rep) {
        for (int t = 0; t < kTechniqueCount; ++t) {
          const technique& tech = kTechniques[t];
          const bool shadow = tech.helper != helper_kind::none;
          progress("%.3g GiB, %s, rep %d/%d: ", gib, tech.name, rep + 1, opts.reps);
          try {
            const teardown::process::process_reaper_stats before = killer.stats();
            const sample s = measure(bytes, tech.helper, opts.no_thp, std::size_t(opts.vma_mib) << 20,
                                     tech.mrelease ? &killer : nullptr);
            if (tech.mrelease) outcomes[t].add(before, killer.stats());
            samples[t].push_back(s);
            progress("kill->waitpid %.2f ms, held at waitpid %.2f GiB, memory back %.1f ms", s.kill_to_waitpid_ms,
                     s.held_at_waitpid_gib, s.memory_back_ms);
            if (shadow) progress(", helper gone %.1f ms, enable %.0f us", s.helper_gone_ms, s.enable_us);
            progress("\n");
          } catch (const std::exception& e) {
            skipped = std::string("failed: ") + e.what();
            progress("%s\n", skipped->c_str());
            break;
          }
        }
      }
      for (int t = 0; t < kTechniqueCount; ++t) {
        const technique& tech = kTechniques[t];
        const bool shadow = tech.helper != helper_kind::none;
        const std::vector<sample>& got = samples[t];
        auto pick = [&](double sample::*field) {
          std::vector<double> values;
          for (const sample& s : got) values.push_back(s.*field);
          return summarize(values);
        };
        json_object row;
        row.set("size_gib", gib).set("technique", tech.name).set("helper", kind_name(tech.helper))
            .set("mrelease", tech.mrelease).set("reps", static_cast<int>(got.size()));
        if (skipped) row.set("skipped", *skipped);
        if (!got.empty()) {
          const summary waitpid_ms = pick(&sample::kill_to_waitpid_ms);
          const summary held = pick(&sample::held_at_waitpid_gib);
          const summary back = pick(&sample::memory_back_ms);
          row.set("kill_to_waitpid_ms", waitpid_ms).set("held_at_waitpid_gib", held).set("memory_back_ms", back);
          std::string gone = "             -";
          if (shadow) {
            const summary helper = pick(&sample::helper_gone_ms);
            row.set("helper_gone_ms", helper).set("enable_us", pick(&sample::enable_us));
            gone = strprintf("%14.1f", helper.median);
          }
          if (tech.mrelease) row.set("outcomes", outcomes[t].json());
          const int timeouts = static_cast<int>(
              std::count_if(got.begin(), got.end(), [](const sample& s) { return s.memory_back_timed_out; }));
          if (timeouts != 0) row.set("memory_back_timeouts", timeouts);
          table.push_back(strprintf("%6.3g  %-15s  %8.2f [%8.2f, %8.2f]  %8.2f  %14.1f  %s  %s", gib, tech.name,
                                    waitpid_ms.median, waitpid_ms.min, waitpid_ms.max, held.median, back.median,
                                    gone.c_str(), tech.mrelease ? outcomes[t].text().c_str() : ""));
        } else if (skipped) {
          table.push_back(strprintf("%6.3g  %-15s  skipped: %s", gib, tech.name, skipped->c_str()));
        }
        rows.push_back(std::move(row));
      }
    }

    json_object config;
    config.set("reps", opts.reps)
        .set("mem_fraction", opts.mem_fraction)
        .set("quick", opts.quick)
        .set("thp_disabled_for_programs", opts.no_thp)
        .set("busy_processes", opts.busy)
        .set("vma_mib", opts.vma_mib)
        .set(
            "note",
            "Real fork()ed programs, anonymous memory touched page by page, killed with SIGKILL. "
            "helper nice19: the program called teardown::process::enable_shadow_teardown() first (default "
            "options: the helper at nice 19); idle: with sched_idle = true (SCHED_IDLE). mrelease: killed by a "
            "teardown::process::process_reaper (pidfd_send_signal, then process_mrelease on its worker). Free memory = "
            "MemAvailable + per-CPU free list pages (/proc/zoneinfo count:). Times from the SIGKILL.");
    const std::string json = teardown_bench::rows_document("process_bench", machine_json, config, rows);

    const std::string conditions =
        (opts.busy != 0 ? strprintf(", %d busy processes at nice 0", opts.busy) : std::string()) +
        (opts.vma_mib != 0 ? strprintf(", mappings of %d MiB", opts.vma_mib) : std::string());
    std::fprintf(
        stderr,
        "\nprocess_bench: medians of %d repetitions%s; times in ms from the SIGKILL; held GiB: not yet free when\n"
        "waitpid() returned\n"
        "   GiB  technique        kill->waitpid ms [min, max]      held GiB  memory back ms  helper gone ms  "
        "mrelease\n",
        opts.reps, conditions.c_str());
    for (const std::string& line : table) std::fprintf(stderr, "%s\n", line.c_str());
    std::fprintf(stderr, "total %.1f s\n", ms_between(run_start, clock_type::now()) / 1e3);
    if (!teardown_bench::write_document("process_bench", opts.out, json)) return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "process_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
