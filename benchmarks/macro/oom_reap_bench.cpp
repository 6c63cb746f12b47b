// oom_reap_bench — seed 003's measurement on the model kernel with real memory: an OOM victim's
// exit racing the oom_reaper, with the oom_reaper walking from the same end as the exit path or
// from the other end (vm.oom_reap_direction), and what each side spent. A plain program, not
// Google Benchmark: each case is a macro measurement of milliseconds to seconds, repeated
// (--reps) and summarised as median / min / max. JSON on stdout (or --out); progress and the
// table, laid out as the seed's, on stderr.
//
//   oom_reap_bench [--size GiB] [--reps N] [--quick] [--out FILE] [--thp]
//     --size GiB   the victim's RSS (default 4); --quick: 0.25 GiB and 3 repetitions
//     --reps N     repetitions (default 5); the cases take turns within each repetition
//     --out FILE   write the JSON there
//     --thp        leave transparent huge pages to the system's setting; by default the process
//                  turns them off (PR_SET_THP_DISABLE) so that the victim is 4 KiB pages with page
//                  tables to walk, as on the seed's machine, whatever the machine's default
//
// The cases. A victim is a model task whose mm is an anonymous mapping of --size, touched page
// by page (teardown::model::mm_system::spawn with backing::real).
//   race_other   vm.oom_reap_direction = other: oom_kill(victim), then at once victim->exit() on
//                this thread. oom_kill queues the mm for the oom_reaper thread, which starts
//                releasing 2 MiB chunks (MADV_DONTNEED) from the high end; the exit tears the mm
//                down (munmap) 2 MiB at a time from the low end. They meet once.
//   race_same    the same with vm.oom_reap_direction = same: both start at the low end; whichever
//                leads does the work and the other trails it, waiting for the chunk it holds.
//   exit_alone   a victim that is not killed exits: its teardown is one munmap of the whole
//                mapping (the normal path, no oom_reaper): the physical reference for the exit.
//   reaper_alone oom_kill with the victim left alive until the oom_reaper is done (its whole
//                walk, from the other end), then the victim exits (munmap of emptied chunks).
// Measured per case and repetition:
//   kill_to_released_ms   oom_kill (exit_alone: exit) until the victim's memory is all released:
//                         the exit() call returned, which happens only once every chunk is
//                         unmapped (the exit path waits for a chunk the oom_reaper holds);
//                         reaper_alone: until flush_oom_reaper() returned
//   exit_work_ms, exit_wait_ms, exit_pages, exit_chunks        the exit path's time in munmap,
//                         its time waiting for a chunk the oom_reaper held, what it released
//   reaper_work_ms, reaper_wait_ms, reaper_pages, reaper_chunks the oom_reaper's, likewise (madvise)
//   exit_cpu_ms           CLOCK_THREAD_CPUTIME_ID of this thread across exit()
//   reaper_cpu_ms         the oom_reaper thread's CPU time across the case (its polling included)
//   exit_call_ms          the exit() call alone
// The per-side figures come from mm_system::stats().oom_reap (differences across the case,
// read after flush_oom_reaper()); exit_alone has none (it does not walk chunks).
//
// What user space can and cannot reproduce (read the numbers with this in mind). In the kernel
// the oom_reaper and exit_mmap walk the victim's page tables and fight over the page-table (pte)
// spinlocks of the same 2 MiB regions when they start from the same end; seed 003 measured 33.1
// units waiting for pte locks and 167.1 in all, against 1.0 and 132.6 from the other end. Here
// both sides are threads of this one process working on one mapping of it: the exit path calls
// munmap per chunk (the process's mmap_lock taken for write, and the VMA split or shrunk), the
// oom_reaper calls madvise(MADV_DONTNEED) per chunk (mmap_lock for read, or only the VMA's lock
// on kernels with per-VMA locking for madvise). Between them the model's own rule applies: a
// per-mm std::mutex taken per chunk to claim and to retire it, and a side that reaches the chunk
// the other holds sleeps on a condition variable until it is let go (the model's stand-in for
// the pte lock, counted as "waiting" below). So the two sides contend on that mutex, on the real
// mmap_lock / VMA lock and on the page allocator's locks as they free pages, never on each
// other's page-table locks in the way the seed describes; and a waiting side sleeps rather than
// spins, so "waiting" is not "running" as it is for a spinlock. Whether the seed's effect shows
// here is an open measurement, and this program reports whatever it sees. The model also has no
// OOM_REAPER_DELAY (its delay is 0), so the two sides race every time; a victim is one process
// of many threads here, not a dying process, and munmap may shoot down TLBs on the CPUs running
// this program's other threads.
//
// JSON: {"benchmark": "oom_reap_bench", "machine": {...}, "config": {...},
//        "cases": [{"case", "size_gib", "reps", "kill_to_released_ms" {S}, "exit_call_ms" {S},
//                   "exit_work_ms" {S}, "exit_wait_ms" {S}, "exit_pages" {S}, "exit_chunks" {S},
//                   "reaper_work_ms" {S}, "reaper_wait_ms" {S}, "reaper_pages" {S},
//                   "reaper_chunks" {S}, "exit_cpu_ms" {S}, "reaper_cpu_ms" {S}}],
//        "seed": {...}}      {S} = {"median", "min", "max"}
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "teardown/model/mm.hpp"

#include "machine_info.hpp"
#include "macro_support.hpp"

namespace {

using teardown::model::backing;
using teardown::model::mm_system;
using teardown::model::oom_reap_stats;
using teardown::model::reap_direction;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

struct options {
  double size_gib = 4.0;
  int reps = 5;
  bool quick = false;
  bool thp = false;
  std::string out;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "oom_reap_bench: %s\n"
               "usage: oom_reap_bench [--size GiB] [--reps N] [--quick] [--out FILE] [--thp]\n"
               "  --size GiB  the victim's RSS (default 4)\n"
               "  --reps N    repetitions (default 5)\n"
               "  --quick     0.25 GiB and 3 repetitions (explicit --size/--reps still win)\n"
               "  --out FILE  write the JSON there (default: stdout)\n"
               "  --thp       keep the system's transparent huge page setting (default: off for us)\n",
               why);
  std::exit(2);
}

options parse_options(int argc, char** argv) {
  options o;
  bool size_set = false, reps_set = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage("a flag is missing its value");
      return argv[++i];
    };
    if (arg == "--quick") {
      o.quick = true;
    } else if (arg == "--thp") {
      o.thp = true;
    } else if (arg == "--size") {
      o.size_gib = std::atof(value());
      size_set = true;
      if (!(o.size_gib > 0)) usage("--size must be a positive number of GiB");
    } else if (arg == "--reps") {
      o.reps = std::atoi(value());
      reps_set = true;
      if (o.reps < 1) usage("--reps must be at least 1");
    } else if (arg == "--out") {
      o.out = value();
    } else {
      usage(("unknown flag " + std::string(arg)).c_str());
    }
  }
  if (o.quick) {
    if (!size_set) o.size_gib = 0.25;
    if (!reps_set) o.reps = 3;
  }
  return o;
}

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

std::uint64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(ts.tv_nsec);
}

double ms(std::uint64_t ns) { return static_cast<double>(ns) / 1e6; }

using teardown_bench::cpu_model;
using teardown_bench::first_line;
using teardown_bench::json_object;
using teardown_bench::meminfo_bytes;
using teardown_bench::summarize;
using teardown_bench::summary;

// One repetition of one case.
struct sample {
  double kill_to_released_ms = 0, exit_call_ms = 0;
  double exit_work_ms = 0, exit_wait_ms = 0, exit_pages = 0, exit_chunks = 0;
  double reaper_work_ms = 0, reaper_wait_ms = 0, reaper_pages = 0, reaper_chunks = 0;
  double exit_cpu_ms = 0, reaper_cpu_ms = 0;
};

// The fields of a sample, by name, in JSON order.
const std::vector<std::pair<const char*, double sample::*>>& fields() {
  static const std::vector<std::pair<const char*, double sample::*>> list = {
      {"kill_to_released_ms", &sample::kill_to_released_ms},
      {"exit_call_ms", &sample::exit_call_ms},
      {"exit_work_ms", &sample::exit_work_ms},
      {"exit_wait_ms", &sample::exit_wait_ms},
      {"exit_pages", &sample::exit_pages},
      {"exit_chunks", &sample::exit_chunks},
      {"reaper_work_ms", &sample::reaper_work_ms},
      {"reaper_wait_ms", &sample::reaper_wait_ms},
      {"reaper_pages", &sample::reaper_pages},
      {"reaper_chunks", &sample::reaper_chunks},
      {"exit_cpu_ms", &sample::exit_cpu_ms},
      {"reaper_cpu_ms", &sample::reaper_cpu_ms},
  };
  return list;
}

enum class kind { race_other, race_same, exit_alone, reaper_alone };
constexpr kind kCases[] = {kind::race_other, kind::race_same, kind::exit_alone, kind::reaper_alone};

const char* name_of(kind k) {
  switch (k) {
    case kind::race_other: return "race_other";
    case kind::race_same: return "race_same";
    case kind::exit_alone: return "exit_alone";
    case kind::reaper_alone: return "reaper_alone";
  }
  return "?";
}

// Runs one case on a fresh mm_system (its own oom_reaper thread), one victim.
sample run_case(kind k, std::uint64_t pages) {
  mm_system kernel;  // vm.async_mm_teardown off: every exit is on the exiting thread
  kernel.set_oom_reap_direction(k == kind::race_same ? reap_direction::same : reap_direction::other);
  auto victim = kernel.spawn(pages, backing::real);
  const oom_reap_stats before = kernel.stats().oom_reap;
  const std::uint64_t reaper_cpu_before = kernel.stats().oom_reaper.worker_cpu_ns;
  sample s;
  const std::uint64_t start = now_ns();
  std::uint64_t released = 0, exit_start = 0, exit_end = 0, cpu_before = 0, cpu_after = 0;
  switch (k) {
    case kind::race_other:
    case kind::race_same:
      (void)kernel.oom_kill(*victim);
      exit_start = now_ns();
      cpu_before = thread_cpu_ns();
      (void)victim->exit();
      cpu_after = thread_cpu_ns();
      exit_end = released = now_ns();
      kernel.flush_oom_reaper();
      break;
    case kind::exit_alone:
      exit_start = start;
      cpu_before = thread_cpu_ns();
      (void)victim->exit();
      cpu_after = thread_cpu_ns();
      exit_end = released = now_ns();
      break;
    case kind::reaper_alone:
      (void)kernel.oom_kill(*victim);
      kernel.flush_oom_reaper();
      released = now_ns();
      exit_start = now_ns();
      cpu_before = thread_cpu_ns();
      (void)victim->exit();
      cpu_after = thread_cpu_ns();
      exit_end = now_ns();
      break;
  }
  const oom_reap_stats after = kernel.stats().oom_reap;
  s.kill_to_released_ms = ms(released - start);
  s.exit_call_ms = ms(exit_end - exit_start);
  s.exit_work_ms = ms(after.exit_work_ns - before.exit_work_ns);
  s.exit_wait_ms = ms(after.exit_wait_ns - before.exit_wait_ns);
  s.exit_pages = static_cast<double>(after.exit_pages - before.exit_pages);
  s.exit_chunks = static_cast<double>(after.exit_chunks - before.exit_chunks);
  s.reaper_work_ms = ms(after.reaper_work_ns - before.reaper_work_ns);
  s.reaper_wait_ms = ms(after.reaper_wait_ns - before.reaper_wait_ns);
  s.reaper_pages = static_cast<double>(after.reaper_pages - before.reaper_pages);
  s.reaper_chunks = static_cast<double>(after.reaper_chunks - before.reaper_chunks);
  s.exit_cpu_ms = ms(cpu_after - cpu_before);
  s.reaper_cpu_ms = ms(kernel.stats().oom_reaper.worker_cpu_ns - reaper_cpu_before);
  if (k == kind::exit_alone) s.exit_pages = static_cast<double>(pages);  // one munmap, not counted by the walk
  return s;
}

double median_of(const std::vector<sample>& samples, double sample::*field) {
  std::vector<double> v;
  for (const sample& s : samples) v.push_back(s.*field);
  return summarize(std::move(v)).median;
}

double median_sum(const std::vector<sample>& samples, double sample::*a, double sample::*b) {
  std::vector<double> v;
  for (const sample& s : samples) v.push_back(s.*a + s.*b);
  return summarize(std::move(v)).median;
}

// The seed's table, our rows: medians; "a + b" cells are the exit path + the oom_reaper.
void print_table(const std::map<kind, std::vector<sample>>& results, const options& o, std::uint64_t pages) {
  const auto& other = results.at(kind::race_other);
  const auto& same = results.at(kind::race_same);
  auto cell = [](double v) {
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "%.1f", v);
    return std::string(buffer);
  };
  auto pair = [&](const std::vector<sample>& r, double sample::*a, double sample::*b) {
    return cell(median_of(r, a)) + " + " + cell(median_of(r, b));
  };
  auto pages_pair = [&](const std::vector<sample>& r) {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, "%.0f + %.0f", median_of(r, &sample::exit_pages),
                  median_of(r, &sample::reaper_pages));
    return std::string(buffer);
  };
  std::fprintf(stderr, "\noom_reap_bench: %.2f GiB victim (%llu pages), median of %d, times in ms\n", o.size_gib,
               static_cast<unsigned long long>(pages), o.reps);
  const char* rule = "+----------------------------------------+----------------------+----------------------+\n";
  std::fprintf(stderr, "%s| %-38s | %-20s | %-20s |\n%s", rule, "Category", "other end (seed 003)", "same end", rule);
  auto row = [&](const char* what, const std::string& a, const std::string& b) {
    std::fprintf(stderr, "| %-38s | %20s | %20s |\n", what, a.c_str(), b.c_str());
  };
  row("kill -> memory released (wall)", cell(median_of(other, &sample::kill_to_released_ms)),
      cell(median_of(same, &sample::kill_to_released_ms)));
  row("Total running time (in syscalls)", cell(median_sum(other, &sample::exit_work_ms, &sample::reaper_work_ms)),
      cell(median_sum(same, &sample::exit_work_ms, &sample::reaper_work_ms)));
  row("  (exit munmap + reaper madvise)", pair(other, &sample::exit_work_ms, &sample::reaper_work_ms),
      pair(same, &sample::exit_work_ms, &sample::reaper_work_ms));
  row("Time waiting for the other's chunk", cell(median_sum(other, &sample::exit_wait_ms, &sample::reaper_wait_ms)),
      cell(median_sum(same, &sample::exit_wait_ms, &sample::reaper_wait_ms)));
  row("  (exit + reaper)", pair(other, &sample::exit_wait_ms, &sample::reaper_wait_ms),
      pair(same, &sample::exit_wait_ms, &sample::reaper_wait_ms));
  row("CPU time (exit thread + oom_reaper)", pair(other, &sample::exit_cpu_ms, &sample::reaper_cpu_ms),
      pair(same, &sample::exit_cpu_ms, &sample::reaper_cpu_ms));
  row("Pages released (exit + reaper)", pages_pair(other), pages_pair(same));
  std::fprintf(stderr, "%s", rule);
  const auto& exit_alone = results.at(kind::exit_alone);
  const auto& reaper_alone = results.at(kind::reaper_alone);
  std::fprintf(stderr,
               "references: exit alone (one munmap, no oom_reaper) %s ms; oom_reaper alone (its whole walk) %s ms,\n"
               "            then the victim's exit over the emptied chunks %s ms\n",
               cell(median_of(exit_alone, &sample::kill_to_released_ms)).c_str(),
               cell(median_of(reaper_alone, &sample::kill_to_released_ms)).c_str(),
               cell(median_of(reaper_alone, &sample::exit_call_ms)).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse_options(argc, argv);
  if (!o.thp && prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0) std::perror("oom_reap_bench: PR_SET_THP_DISABLE");
  const std::uint64_t pages = static_cast<std::uint64_t>(o.size_gib * kGiB) / mm_system::page_size();
  const double available_gib = static_cast<double>(meminfo_bytes("MemAvailable:")) / kGiB;
  if (o.size_gib > 0.6 * available_gib) {
    std::fprintf(stderr, "oom_reap_bench: a %.2f GiB victim is more than 0.6 of MemAvailable (%.2f GiB); use --size\n",
                 o.size_gib, available_gib);
    return 1;
  }

  std::map<kind, std::vector<sample>> results;
  for (int rep = 0; rep < o.reps; ++rep) {
    // The cases take turns, starting one further each repetition, so drift hits them alike.
    for (std::size_t i = 0; i < std::size(kCases); ++i) {
      const kind k = kCases[(i + static_cast<std::size_t>(rep)) % std::size(kCases)];
      const sample s = run_case(k, pages);
      results[k].push_back(s);
      std::fprintf(
          stderr,
          "rep %d %-12s kill->released %8.1f ms  exit %7.1f+%6.1f wait  reaper %7.1f+%6.1f wait  pages %.0f+%.0f\n",
          rep, name_of(k), s.kill_to_released_ms, s.exit_work_ms, s.exit_wait_ms, s.reaper_work_ms, s.reaper_wait_ms,
          s.exit_pages, s.reaper_pages);
    }
  }

  const json_object machine = json_object()
                                  .set("cpus", static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)))
                                  .set("mem_total_gib", static_cast<double>(meminfo_bytes("MemTotal:")) / kGiB)
                                  .set("mem_available_gib", available_gib)
                                  .set("page_size", static_cast<std::uint64_t>(mm_system::page_size()))
                                  .set("cpu_model", cpu_model())
                                  .set("kernel", teardown_bench::kernel_release())
                                  .set("thp_system", first_line("/sys/kernel/mm/transparent_hugepage/enabled"))
                                  .set("load_average_1m", teardown_bench::load_average_1m());
  const json_object config = json_object()
                                 .set("size_gib", o.size_gib)
                                 .set("pages", pages)
                                 .set("reps", o.reps)
                                 .set("quick", o.quick)
                                 .set("thp_disabled_for_us", !o.thp)
                                 .set("chunk_bytes", static_cast<std::uint64_t>(teardown::model::oom_reap_chunk_bytes))
                                 .set("oom_reap_delay_ms", 0);
  std::string json =
      "{\"benchmark\": \"oom_reap_bench\", \"machine\": " + machine.str() + ", \"config\": " + config.str();
  json += ", \"cases\": [";
  for (const kind k : kCases) {
    json_object row;
    row.set("case", name_of(k)).set("size_gib", o.size_gib).set("reps", static_cast<std::uint64_t>(results[k].size()));
    for (const auto& [name, field] : fields()) {
      std::vector<double> v;
      for (const sample& s : results[k]) v.push_back(s.*field);
      row.set(name, summarize(std::move(v)));
    }
    json += (k == kCases[0] ? "" : ", ") + row.str();
  }
  json += "], \"seed\": {\"source\": \"seed 003, PATCH v10 2/2 (arm64, perf; units as reported)\", "
          "\"other_end\": {\"total\": 132.6, \"exit_mmap\": 72.4, \"reaper\": 60.2, \"pte_wait\": 1.0, "
          "\"pte_wait_exit\": 0.4, \"pte_wait_reaper\": 0.6}, "
          "\"same_end\": {\"total\": 167.1, \"exit_mmap\": 90.7, \"reaper\": 76.4, \"pte_wait\": 33.1, "
          "\"pte_wait_exit\": 10.0, \"pte_wait_reaper\": 23.1}}}\n";

  print_table(results, o, pages);
  if (o.out.empty()) {
    std::fputs(json.c_str(), stdout);
  } else {
    std::ofstream(o.out) << json;
    std::fprintf(stderr, "wrote %s\n", o.out.c_str());
  }
  return 0;
}
