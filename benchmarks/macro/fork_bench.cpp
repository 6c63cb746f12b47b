// fork_bench — what fork() costs a program whose teardown worker is busy on a starved machine,
// against the same program with no worker. With fork_policy::wait_for_item the library's
// pthread_atfork handlers park every live worker between items across fork(); a worker at
// nice 19 behind processes at nice 0 gets a sliver of a CPU, and one in a blocking call (a
// process_reaper waiting for its victim) parks only when the call returns. The default,
// fork_policy::never_wait, waits for neither: the question is how much of a worker's wait
// lands on fork() under each.
// A plain program, not Google Benchmark: each row runs in a fresh child of this process, so
// that no row's threads, queue or memory disturbs the next; the rows share one run, one set of
// spinners and one machine, and their ratios are what to read.
//
//   fork_bench [--busy N] [--forks K] [--items M] [--json FILE] [--quick]
//     --busy N    N processes spin (for(;;)) at nice 0 for the whole run (default 2; 0: none)
//     --forks K   forks per row (default 20, at most 200)
//     --items M   items every row allocates, and the reaper rows queue (default 4000000)
//     --json FILE write the JSON there (default: stdout); --out FILE is the same (run.sh's)
//     --quick     400000 items and 5 forks (explicit flags win): a smoke test
//
// Every row allocates M items of 16 bytes (the hook and a flag, all touched) and then forks K
// times; each child _exit(0)s at once. Only the fork() call is timed, in the parent (steady
// clock around it); waitpid and a 20 ms pause come between forks, untimed.
//   none            the memory alone: no worker, nothing queued
//   reaper          one teardown::reaper (default options: nice 19, fork_policy::never_wait)
//                   with all M items queued; each item's fn spins about 1 us of CPU
//                   (calibrated at the start), so the backlog outlasts the forks; before a
//                   fork, a queue below M/2 is refilled with the items already torn down
//                   ("refills")
//   reaper_parked   reaper with on_fork = fork_policy::wait_for_item: fork() parks the worker
//                   between items, so it waits for the starved worker to be scheduled
//   pool            a teardown::reaper_pool of 2 workers (default options), the items dealt
//                   round-robin over them
//   pool_parked     pool with worker.on_fork = fork_policy::wait_for_item
//   process_reaper  a teardown::process::process_reaper (default options, its worker at nice 0,
//                   but retries = 1 and retry_interval = exit_wait = 2 s) whose worker is
//                   inside its wait for a victim that handles SIGTERM: before a fork with no
//                   kill in flight, kill(victim, SIGTERM), then this row waits until the worker
//                   has counted its first retry (the kernel refuses process_mrelease for a
//                   process that is not dying), so the fork meets the worker in its 2 s wait
//                   on the victim's pidfd. Same memory as the other rows, none of it queued
// Per row: p50, p90 and max of the K fork times (nearest rank), and for each row but none the
// ratio p90 / none's p90 and whether it meets p90 <= 1.3 x none's p90 + 2 ms, the goal fork()
// must meet with a busy worker. "queued at fork" is what the worker still had (stats().pending:
// items, or kills) just before each fork.
//
// JSON: {"benchmark": "fork_bench", "machine": {...}, "config": {...},
//        "rows": [{"row", "forks", "fork_ms": {"p50", "p90", "max", "min"}, "fork_us_each": [...],
//                  "queued_at_fork": [...], "refills", "setup_s", ["p90_over_none", "goal_ms",
//                  "meets_goal"], ["failed"]}]}
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "teardown/process_reaper.hpp"
#include "teardown/reaper.hpp"
#include "teardown/reaper_pool.hpp"

#include "machine_info.hpp"
#include "macro_support.hpp"

namespace {

using teardown_bench::json_object;
using teardown_bench::ms_between;
using teardown_bench::progress;
using teardown_bench::strprintf;

using clock_type = std::chrono::steady_clock;

constexpr int kMostForks = 200;  // a row's report must fit one atomic pipe write
constexpr auto kBetweenForks = std::chrono::milliseconds(20);
constexpr auto kVictimWait = std::chrono::seconds(2);  // the process_reaper's retry_interval, exit_wait
constexpr std::size_t kPoolWorkers = 2;

// ---- options --------------------------------------------------------------------------------

struct options {
  int busy = 2;
  int forks = 20;
  int items = 4'000'000;
  bool quick = false;
  std::string json;
};

constexpr const char* kUsage =
    "usage: fork_bench [--busy N] [--forks K] [--items M] [--json FILE] [--quick]\n"
    "  --busy N      N processes spinning at nice 0 for the whole run (default 2; 0: none)\n"
    "  --forks K     forks per row (default 20, at most 200)\n"
    "  --items M     items each row allocates, and the reaper rows queue (default 4000000)\n"
    "  --json FILE   write the JSON there (default: stdout); --out FILE is the same\n"
    "  --quick       400000 items, 5 forks (explicit flags win)\n";

constexpr teardown_bench::command_line kCommandLine{"fork_bench", kUsage};

options parse_options(int argc, char** argv) {
  options opts;
  const teardown_bench::command_line::given given = kCommandLine.parse(argc, argv, {"--quick"});
  opts.quick = given.has("--quick");
  if (opts.quick) {
    opts.items = 400'000;
    opts.forks = 5;
  }
  for (const auto& [name, value] : given.flags) {
    if (name == "--busy") {
      opts.busy = value == "0" ? 0 : kCommandLine.count(name, value, 1024);
    } else if (name == "--forks") {
      opts.forks = kCommandLine.count(name, value, kMostForks);
    } else if (name == "--items") {
      opts.items = kCommandLine.count(name, value, 1 << 30);
    } else if (name == "--json" || name == "--out") {
      opts.json = value;
    } else {
      kCommandLine.usage_error("unknown flag " + name);
    }
  }
  return opts;
}

// ---- the items ------------------------------------------------------------------------------

// Spins `steps` steps of a loop the compiler must keep.
void burn(std::uint64_t steps) noexcept {
  volatile std::uint64_t step = 0;
  for (std::uint64_t i = 0; i < steps; ++i) step = step + 1;
}

// How many of burn's steps take about 1 us of this thread's CPU time: the fastest of a few
// trials, since a neighbour on the machine (another vCPU, the hypervisor) only slows one down.
std::uint64_t steps_per_microsecond() {
  constexpr std::uint64_t kSteps = 4'000'000;
  double fastest_us = INFINITY;
  for (int trial = 0; trial < 5; ++trial) {
    const double start = teardown_bench::thread_cpu_ms();
    burn(kSteps);
    fastest_us = std::min(fastest_us, (teardown_bench::thread_cpu_ms() - start) * 1e3);
  }
  return std::max<std::uint64_t>(1, static_cast<std::uint64_t>(static_cast<double>(kSteps) / fastest_us));
}

struct item {
  teardown::llist_node hook;
  std::atomic<bool> idle{true};  // not queued: fn has run on it, or it was never enqueued
};

struct spin_fn {
  std::uint64_t steps;
  // release: pairs with enqueue_idle's exchange, which enqueues the item again only after this.
  void operator()(item& it) const noexcept {
    burn(steps);
    it.idle.store(true, std::memory_order_release);
  }
};

using item_reaper = teardown::reaper<item, &item::hook, spin_fn>;
using item_pool = teardown::reaper_pool<item, &item::hook, spin_fn>;

// Hands every idle item to enqueue(index, item): the first fill, and a refill.
template <class Enqueue>
void enqueue_idle(std::span<item> items, Enqueue&& enqueue) {
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (items[i].idle.exchange(false, std::memory_order_acquire)) enqueue(i, items[i]);
  }
}

// ---- one row --------------------------------------------------------------------------------

// reaper and pool at their default options (fork_policy::never_wait); the _parked rows with
// on_fork = fork_policy::wait_for_item, the protocol that parks the workers across fork().
enum class row_kind { none, reaper, reaper_parked, pool, pool_parked, process_reaper };
constexpr const char* kRowNames[] = {"none", "reaper", "reaper_parked", "pool", "pool_parked", "process_reaper"};

// What a row's child sends back, in one write.
struct row_report {
  int forks = 0;
  double fork_ms[kMostForks] = {};
  std::uint64_t queued[kMostForks] = {};
  std::uint64_t refills = 0;
  double setup_s = 0;
  char failed[160] = {};  // why the row stopped short; empty if it did not
};
static_assert(sizeof(row_report) <= PIPE_BUF, "a row's report must fit one atomic pipe write");

// A row in its child: the options, the report it fills, and when it began (setup_s is the time
// from here to the first fork: the allocation, and the queue's fill or the victim's start).
struct row {
  const options& opts;
  row_report& report;
  clock_type::time_point start = clock_type::now();
};

// Forks opts.forks times, calling before_fork() (which returns what is queued) ahead of each.
template <class BeforeFork>
void time_forks(row& r, BeforeFork&& before_fork) {
  r.report.setup_s = ms_between(r.start, clock_type::now()) / 1e3;
  for (int f = 0; f < r.opts.forks; ++f) {
    r.report.queued[f] = before_fork();
    const auto start = clock_type::now();
    const pid_t child = fork();
    if (child == 0) _exit(0);
    const auto forked = clock_type::now();
    if (child < 0) throw std::system_error(errno, std::generic_category(), "fork");
    while (waitpid(child, nullptr, 0) < 0 && errno == EINTR) {
    }
    r.report.fork_ms[f] = ms_between(start, forked);
    r.report.forks = f + 1;
    std::this_thread::sleep_for(kBetweenForks);
  }
}

// The reaper and pool rows: all items queued, and queued again whenever the queue falls below
// half of them.
template <class Reaper, class Enqueue>
void time_forks_with_backlog(row& r, std::span<item> items, Reaper& reaper, Enqueue&& enqueue) {
  enqueue_idle(items, enqueue);
  time_forks(r, [&] {
    if (reaper.stats().pending < items.size() / 2) {
      enqueue_idle(items, enqueue);
      ++r.report.refills;
    }
    return reaper.stats().pending;
  });
}

void on_sigterm(int) {}

// The process_reaper row: its worker waits for a victim that survives SIGTERM.
void time_forks_with_victim(row& r) {
  int ready[2];
  if (pipe2(ready, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe2");
  teardown::process::pidfd_process victim = teardown::process::pidfd_process::spawn([&] {
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) return 1;
    struct sigaction handle {};
    handle.sa_handler = on_sigterm;
    if (sigaction(SIGTERM, &handle, nullptr) != 0) return 1;
    const char byte = 1;
    if (write(ready[1], &byte, 1) != 1) return 1;
    for (;;) pause();
  });
  close(ready[1]);
  char byte = 0;
  const bool handles = read(ready[0], &byte, 1) == 1;
  close(ready[0]);
  if (!handles) throw std::runtime_error("the victim died before it handled SIGTERM");
  {
    teardown::process::process_reaper killer({.retries = 1, .retry_interval = kVictimWait, .exit_wait = kVictimWait});
    time_forks(r, [&] {
      const teardown::process::process_reaper_stats before = killer.stats();
      if (before.pending == 0) {
        if (!killer.kill(victim, SIGTERM)) throw std::runtime_error("the victim is gone");
        // The worker sends the signal, is refused (the victim is not dying), counts a retry and
        // waits on the pidfd: from that count on, it is in the wait.
        const auto deadline = clock_type::now() + kVictimWait / 2;
        while (killer.stats().retries == before.retries) {
          if (clock_type::now() > deadline) throw std::runtime_error("the worker did not reach its wait in time");
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      }
      return killer.stats().pending;
    });
    victim.send_signal(SIGKILL);  // ends the worker's wait at once; the destructor drains
  }
  victim.wait();
}

// The child's side of a row. Never returns: a reaper still holding its backlog is not destroyed
// (its drain would take minutes at nice 19), nor are the items it holds; the process ends with
// them.
[[noreturn]] void row_main(int report_fd, row_kind kind, const options& opts, std::uint64_t steps) {
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) _exit(1);
  auto report = std::make_unique<row_report>();
  row r{opts, *report};
  try {
    const auto count = static_cast<std::size_t>(opts.items);
    // Every line touched by its constructor; never freed, as the reapers are never destroyed.
    const std::span<item> items(new item[count], count);
    const spin_fn fn{steps};
    switch (kind) {
      case row_kind::none:
        time_forks(r, [] { return std::uint64_t{0}; });
        break;
      case row_kind::reaper:
      case row_kind::reaper_parked: {
        const teardown::fork_policy on_fork =
            kind == row_kind::reaper ? teardown::fork_policy::never_wait : teardown::fork_policy::wait_for_item;
        auto* const reaper = new item_reaper(fn, {.on_fork = on_fork});  // never destroyed: see above
        time_forks_with_backlog(r, items, *reaper, [&](std::size_t, item& it) { reaper->enqueue(it); });
        break;
      }
      case row_kind::pool:
      case row_kind::pool_parked: {
        teardown::reaper_pool_options pool_opts{.workers = kPoolWorkers};
        if (kind == row_kind::pool_parked) pool_opts.worker.on_fork = teardown::fork_policy::wait_for_item;
        auto* const pool = new item_pool(fn, pool_opts);
        time_forks_with_backlog(r, items, *pool,
                                [&](std::size_t i, item& it) { pool->enqueue_to(i % kPoolWorkers, it); });
        break;
      }
      case row_kind::process_reaper:
        time_forks_with_victim(r);
        break;
    }
  } catch (const std::exception& e) {
    std::snprintf(report->failed, sizeof report->failed, "%s", e.what());
  }
  const bool sent = write(report_fd, report.get(), sizeof *report) == static_cast<ssize_t>(sizeof *report);
  _exit(sent ? 0 : 3);
}

row_report run_row(row_kind kind, const options& opts, std::uint64_t steps) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe2");
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child == 0) {
    close(fds[0]);
    row_main(fds[1], kind, opts, steps);
  }
  const int fork_error = errno;
  close(fds[1]);
  if (child < 0) {
    close(fds[0]);
    throw std::system_error(fork_error, std::generic_category(), "fork (a row)");
  }
  int status = 0;
  const auto reap = [&] {
    while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
  };
  try {
    const auto report = teardown_bench::read_child_report<row_report>(fds[0], 600'000, "the row");
    reap();
    return report;
  } catch (const std::runtime_error& e) {
    kill(child, SIGKILL);
    reap();
    if (WIFSIGNALED(status) && WTERMSIG(status) != SIGKILL) {
      throw std::runtime_error(strprintf("%s (%s)", e.what(), strsignal(WTERMSIG(status))));
    }
    throw;
  }
}

// ---- the summary ------------------------------------------------------------------------------

// The nearest-rank percentile q (0 < q <= 1) of sorted samples.
double percentile(const std::vector<double>& sorted, double q) {
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[std::max<std::size_t>(rank, 1) - 1];
}

struct fork_summary {
  double p50 = NAN, p90 = NAN, max = NAN, min = NAN;
};

fork_summary summarize_forks(const row_report& report) {
  std::vector<double> ms(report.fork_ms, report.fork_ms + report.forks);
  if (ms.empty()) return {};
  std::sort(ms.begin(), ms.end());
  return {percentile(ms, 0.5), percentile(ms, 0.9), ms.back(), ms.front()};
}

}  // namespace

int main(int argc, char** argv) {
  const options opts = parse_options(argc, argv);
  try {
    const json_object machine_json = teardown_bench::machine_object();
    const std::uint64_t steps = steps_per_microsecond();  // before the spinners: a CPU of its own
    const int nice = getpriority(PRIO_PROCESS, 0);
    progress("fork_bench: %d items of %zu bytes, %d forks per row, %d busy processes at nice %d; fn = %llu steps "
             "(about 1 us)\n",
             opts.items, sizeof(item), opts.forks, opts.busy, nice, static_cast<unsigned long long>(steps));
    const auto run_start = clock_type::now();
    std::vector<row_report> reports;
    {
      const teardown_bench::cpu_hogs hogs(opts.busy);
      for (const row_kind kind : {row_kind::none, row_kind::reaper, row_kind::reaper_parked, row_kind::pool,
                                  row_kind::pool_parked, row_kind::process_reaper}) {
        progress("%s: ", kRowNames[static_cast<int>(kind)]);
        reports.push_back(run_row(kind, opts, steps));
        const row_report& report = reports.back();
        for (int f = 0; f < report.forks; ++f) progress("%.1f ", report.fork_ms[f]);
        progress(report.failed[0] != '\0' ? "failed: %s\n" : "%s\n", report.failed);
      }
    }

    const fork_summary none = summarize_forks(reports[0]);
    const double goal_ms = 1.3 * none.p90 + 2.0;
    std::vector<json_object> rows;
    std::vector<std::string> table;
    for (std::size_t i = 0; i < reports.size(); ++i) {
      const row_report& report = reports[i];
      const fork_summary s = summarize_forks(report);
      const std::vector<std::uint64_t> queued(report.queued, report.queued + report.forks);
      std::vector<std::uint64_t> each_us;
      for (int f = 0; f < report.forks; ++f)
        each_us.push_back(static_cast<std::uint64_t>(std::lround(report.fork_ms[f] * 1e3)));
      json_object row;
      row.set("row", kRowNames[i]).set("forks", report.forks)
          .set("fork_ms", json_object().set("p50", s.p50).set("p90", s.p90).set("max", s.max).set("min", s.min))
          .set("fork_us_each", each_us).set("queued_at_fork", queued).set("refills", report.refills)
          .set("setup_s", report.setup_s);
      std::string ratio = "-", verdict = "-";
      if (i != 0) {
        const bool meets = s.p90 <= goal_ms;
        row.set("p90_over_none", s.p90 / none.p90).set("goal_ms", goal_ms).set("meets_goal", meets);
        ratio = strprintf("%.2fx", s.p90 / none.p90);
        verdict = meets ? "meets" : "misses";
      }
      if (report.failed[0] != '\0') row.set("failed", report.failed);
      const auto fewest = queued.empty() ? 0 : *std::min_element(queued.begin(), queued.end());
      table.push_back(strprintf("%-15s %9.2f %9.2f %9.2f %10s  %-6s %13llu %8llu %8.2f%s%s", kRowNames[i], s.p50,
                                s.p90, s.max, ratio.c_str(), verdict.c_str(), static_cast<unsigned long long>(fewest),
                                static_cast<unsigned long long>(report.refills), report.setup_s,
                                report.failed[0] != '\0' ? "  failed: " : "", report.failed));
      rows.push_back(std::move(row));
    }

    json_object config;
    config.set("busy_processes", opts.busy).set("busy_nice", nice).set("forks", opts.forks).set("items", opts.items)
        .set("item_bytes", static_cast<int>(sizeof(item))).set("fn_steps", steps).set("quick", opts.quick)
        .set("pool_workers", static_cast<int>(kPoolWorkers))
        .set("victim_wait_ms", static_cast<int>(std::chrono::milliseconds(kVictimWait).count()))
        .set("goal", "p90 <= 1.3 x none's p90 + 2 ms")
        .set("note",
             "Each row in a fresh child process; fork() alone timed in the parent (steady clock), the child "
             "_exit(0)s at once; 20 ms and waitpid between forks, untimed. Workers at their default options "
             "(reaper, pool: nice 19; process_reaper: nice 0, retries 1, retry_interval 2 s). queued_at_fork: "
             "stats().pending just before each fork. Percentiles by nearest rank.");
    const std::string json = teardown_bench::rows_document("fork_bench", machine_json, config, rows);

    std::fprintf(stderr,
                 "\nfork_bench: fork() in ms, %d forks per row, %d busy processes at nice %d, %d items of %zu bytes\n"
                 "goal: p90 <= 1.3 x none's p90 + 2 ms = %.2f ms\n"
                 "row                   p50       p90       max   p90/none  goal    queued (min)  refills  setup s\n",
                 opts.forks, opts.busy, nice, opts.items, sizeof(item), goal_ms);
    for (const std::string& line : table) std::fprintf(stderr, "%s\n", line.c_str());
    std::fprintf(stderr, "total %.1f s\n", ms_between(run_start, clock_type::now()) / 1e3);
    if (!teardown_bench::write_document("fork_bench", opts.json, json)) return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fork_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
