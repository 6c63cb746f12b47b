// pool_bench — RFC open question 2 (one reaper, per-node reapers, or a pool?) on real memory:
// how fast a reaper_pool drains M concurrent 0.5 GiB teardowns, against the physical limit of
// the same M teardowns run inline, concurrently, on M threads. A plain program, not Google
// Benchmark: each row is a multi-millisecond measurement with its own repetitions, summarised
// as median / min / max. JSON on stdout (or --out), progress and a table on stderr.
//
// An item is an anonymous private mapping of --each GiB (0.5), populated with MAP_POPULATE
// before any timing starts; its teardown is munmap(). Every repetition maps the M items afresh
// (populated by up to one thread per CPU) and then tears them down in one of these ways, all
// of them in turn within a repetition so that drift hits them alike:
//   inline             M threads, one per item, released together by a std::latch; each
//                      munmaps its own item. seconds: from the release until the last munmap
//                      returned. The peer and the physical limit here: every CPU can help.
//   pool               a reaper_pool with W workers (--workers, default 1, 2 and the number of
//                      hardware threads; W CPU groups, steal on, steal_after 1 ms): M producer
//                      threads released together, each enqueues its own item (M concurrent
//                      exits); seconds: from the release until flush() returned.
//   pool_one_producer  the same pool, all M items enqueued by one thread: the workers share
//                      them only by stealing (from the queue, and from the rest of a batch
//                      whose item has run steal_after; the worker the thread maps to takes
//                      the burst).
//   single_reaper      one teardown::reaper (the seed's design), M producers as for pool.
// gib_per_s = M * each / median seconds; ratio_to_inline = gib_per_s / inline's (the acceptance
// figure: pool with W = hardware threads >= 0.8). The workers run at the reaper's default nice
// 19 (--nice): on an idle machine that changes nothing; on a loaded one (load_average_1m) it
// measures the workers' share of the CPUs rather than their drain rate, and --nice 0 gives them
// the inline threads' own priority.
//
// Memory rule: M * each is at most --max-gib (8) and at most --mem-fraction (0.6) of
// MemAvailable; a larger M is cut down to fit and "capped" says so.
//
// JSON:
//   {"benchmark": "pool_bench",
//    "machine": {"cpus", "mem_total_gib", "mem_available_gib", "cpu_model", "kernel",
//                "load_average_1m", "thp"},
//    "config": {"m", "each_gib", "reps", "workers": [...], "nice", "quick", [capped]},
//    "rows": [{"kind", "m", "each_gib", ["workers"], "seconds" {S}, "gib_per_s",
//              "ratio_to_inline", ["stolen" (median over reps), "per_worker_reaped" (last rep)]}]}
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <latch>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "teardown/reaper.hpp"
#include "teardown/reaper_pool.hpp"

#include "machine_info.hpp"
#include "macro_support.hpp"

namespace {

using teardown_bench::json_object;
using teardown_bench::meminfo_bytes;
using teardown_bench::progress;
using teardown_bench::summarize;
using teardown_bench::summary;

using clock_type = std::chrono::steady_clock;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// ---- options ----------------------------------------------------------------------------------

struct options {
  std::string out;
  int m = 0;  // 0: 2 x hardware threads
  double each_gib = 0.5;
  int reps = 3;
  std::vector<int> workers;  // empty: 1, 2, hardware threads
  double max_gib = 8;
  double mem_fraction = 0.6;
  int nice = 19;  // the workers' (reaper_options::nice)
  bool quick = false;
};

constexpr const char* kUsage =
    "usage: pool_bench [--out FILE] [--m M] [--each GIB] [--reps N] [--workers 1,2,16]\n"
    "                  [--max-gib GIB] [--mem-fraction F] [--nice N] [--quick]\n"
    "  --m M             concurrent items (default 2 x hardware threads, cut to the memory rule)\n"
    "  --each GIB        size of each item (default 0.5)\n"
    "  --reps N          repetitions (default 3)\n"
    "  --workers LIST    pool sizes (default 1, 2 and the number of hardware threads)\n"
    "  --max-gib GIB     populate at most this much at once (default 8)\n"
    "  --mem-fraction F  and at most F of MemAvailable (default 0.6)\n"
    "  --nice N          the pool's and the single reaper's workers' nice value (default 19, the\n"
    "                    reaper's; 0 = the inline threads' own, for a loaded machine)\n"
    "  --quick           smoke test: M 4, each 0.125, reps 1 (other flags override)\n";

constexpr teardown_bench::command_line kCommandLine{"pool_bench", kUsage};

options parse_options(int argc, char** argv) {
  options opts;
  const teardown_bench::command_line::given given = kCommandLine.parse(argc, argv, {"--quick"});
  opts.quick = given.has("--quick");
  if (opts.quick) {
    opts.m = 4;
    opts.each_gib = 0.125;
    opts.reps = 1;
  }
  for (const auto& [name, value] : given.flags) {
    if (name == "--out") {
      opts.out = value;
    } else if (name == "--m") {
      opts.m = kCommandLine.count(name, value);
    } else if (name == "--each") {
      opts.each_gib = kCommandLine.positive(name, value);
    } else if (name == "--reps") {
      opts.reps = kCommandLine.count(name, value);
    } else if (name == "--workers") {
      opts.workers.clear();
      for (const std::string& part : teardown_bench::split_list(value)) {
        const int w = kCommandLine.count(name, part);
        if (w > static_cast<int>(teardown::detail::reaper_pool_max_workers))
          kCommandLine.usage_error("--workers: at most 1024");
        opts.workers.push_back(w);
      }
    } else if (name == "--max-gib") {
      opts.max_gib = kCommandLine.positive(name, value);
    } else if (name == "--nice") {
      char* end = nullptr;
      const long value_nice = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || value_nice < -20 || value_nice > 19)
        kCommandLine.usage_error("--nice: -20 to 19");
      opts.nice = static_cast<int>(value_nice);
    } else if (name == "--mem-fraction") {
      opts.mem_fraction = kCommandLine.positive(name, value);
      if (opts.mem_fraction > 0.95) kCommandLine.usage_error("--mem-fraction: at most 0.95");
    } else {
      kCommandLine.usage_error("unknown flag " + name);
    }
  }
  return opts;
}

double seconds_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// ---- items ------------------------------------------------------------------------------------

struct item {
  teardown::llist_node hook;
  void* addr = nullptr;
  std::size_t len = 0;
};

void tear_down(item& it) noexcept {
  if (it.addr != nullptr && munmap(it.addr, it.len) != 0) std::abort();
  it.addr = nullptr;
}

struct unmapper {
  void operator()(item& it) const noexcept { tear_down(it); }
};

using pool_type = teardown::reaper_pool<item, &item::hook, unmapper>;
using single_type = teardown::reaper<item, &item::hook, unmapper>;

// Maps and populates `count` items of `bytes` each, up to one thread per CPU.
std::vector<item> populate(int count, std::size_t bytes) {
  std::vector<item> items(static_cast<std::size_t>(count));
  std::atomic<int> next{0};
  std::atomic<int> failed_errno{0};
  const int threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, count);
  std::vector<std::jthread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      for (int i; (i = next.fetch_add(1)) < count;) {
        void* addr = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        if (addr == MAP_FAILED) {
          failed_errno.store(errno);
          continue;
        }
        items[static_cast<std::size_t>(i)].addr = addr;
        items[static_cast<std::size_t>(i)].len = bytes;
      }
    });
  }
  for (std::jthread& t : workers) t.join();
  if (const int error = failed_errno.load(); error != 0) {
    for (item& it : items) tear_down(it);
    throw std::system_error(error, std::generic_category(), "mmap");
  }
  return items;
}

// ---- one teardown of M items, each way ----------------------------------------------------------

double run_inline(std::vector<item>& items) {
  const std::size_t m = items.size();
  std::latch ready(static_cast<std::ptrdiff_t>(m) + 1);
  std::latch go(1);
  std::latch done(static_cast<std::ptrdiff_t>(m));
  std::vector<std::jthread> threads;
  for (std::size_t i = 0; i < m; ++i) {
    threads.emplace_back([&, i] {
      ready.arrive_and_wait();
      go.wait();
      tear_down(items[i]);
      done.count_down();
    });
  }
  ready.arrive_and_wait();
  const auto start = clock_type::now();
  go.count_down();
  done.wait();
  const auto end = clock_type::now();
  return seconds_between(start, end);
}

// M producer threads (one item each) or one, released together; returns the time from the
// release to the return of flush().
template <class Reaper>
double run_queued(Reaper& reaper, std::vector<item>& items, bool one_producer) {
  const std::size_t m = items.size();
  const std::size_t producers = one_producer ? 1 : m;
  std::latch ready(static_cast<std::ptrdiff_t>(producers) + 1);
  std::latch go(1);
  std::latch enqueued(static_cast<std::ptrdiff_t>(producers));
  std::vector<std::jthread> threads;
  for (std::size_t p = 0; p < producers; ++p) {
    threads.emplace_back([&, p] {
      ready.arrive_and_wait();
      go.wait();
      if (one_producer) {
        for (item& it : items) reaper.enqueue(it);
      } else {
        reaper.enqueue(items[p]);
      }
      enqueued.count_down();
    });
  }
  ready.arrive_and_wait();
  const auto start = clock_type::now();
  go.count_down();
  enqueued.wait();
  reaper.flush();
  const auto end = clock_type::now();
  return seconds_between(start, end);
}

struct variant {
  std::string kind;  // inline, pool, pool_one_producer, single_reaper
  int workers = 0;   // pool sizes only
  std::vector<double> seconds;
  std::vector<double> stolen;
  std::vector<std::uint64_t> per_worker_reaped;  // last repetition
};

}  // namespace

int main(int argc, char** argv) {
  options opts = parse_options(argc, argv);
  try {
    const int hardware = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    if (opts.m == 0) opts.m = 2 * hardware;
    if (opts.workers.empty()) opts.workers = {1, 2, hardware};
    std::sort(opts.workers.begin(), opts.workers.end());
    opts.workers.erase(std::unique(opts.workers.begin(), opts.workers.end()), opts.workers.end());

    const std::uint64_t available = meminfo_bytes("MemAvailable:");
    const std::size_t bytes = static_cast<std::size_t>(opts.each_gib * kGiB) / 4096 * 4096;
    if (bytes == 0) kCommandLine.usage_error("--each: below one page");
    const double limit = std::min(opts.max_gib * kGiB, opts.mem_fraction * static_cast<double>(available));
    const int wanted_m = opts.m;
    opts.m = std::max(1, std::min(opts.m, static_cast<int>(limit / static_cast<double>(bytes))));
    const bool capped = opts.m < wanted_m;
    if (capped) progress("M cut from %d to %d by the memory rule (%.2f GiB)\n", wanted_m, opts.m, limit / kGiB);

    std::vector<variant> variants;
    variants.push_back({"inline", 0, {}, {}, {}});
    for (int w : opts.workers) variants.push_back({"pool", w, {}, {}, {}});
    for (int w : opts.workers) {
      if (w > 1) variants.push_back({"pool_one_producer", w, {}, {}, {}});
    }
    variants.push_back({"single_reaper", 0, {}, {}, {}});

    const auto total_start = clock_type::now();
    for (int rep = 0; rep < opts.reps; ++rep) {
      for (variant& v : variants) {
        progress("rep %d %-18s W=%-3d populate %d x %.3g GiB ... ", rep, v.kind.c_str(), v.workers, opts.m,
                 static_cast<double>(bytes) / kGiB);
        std::vector<item> items = populate(opts.m, bytes);
        double seconds = 0;
        if (v.kind == "inline") {
          seconds = run_inline(items);
        } else if (v.kind == "single_reaper") {
          single_type reaper(unmapper{}, {.name = "pool_bench", .nice = opts.nice});
          seconds = run_queued(reaper, items, false);
        } else {
          teardown::reaper_pool_options pool_opts;
          pool_opts.workers = static_cast<std::size_t>(v.workers);
          pool_opts.worker.name = "pool_bench";
          pool_opts.worker.nice = opts.nice;
          pool_type pool(unmapper{}, pool_opts);
          seconds = run_queued(pool, items, v.kind == "pool_one_producer");
          const teardown::reaper_stats stats = pool.stats();
          v.stolen.push_back(static_cast<double>(stats.stolen));
          v.per_worker_reaped.clear();
          for (std::size_t i = 0; i < pool.worker_count(); ++i) {
            v.per_worker_reaped.push_back(pool.worker_stats(i).reaped);
          }
        }
        for (item& it : items) {
          if (it.addr != nullptr) throw std::runtime_error("an item was not torn down");
        }
        v.seconds.push_back(seconds);
        progress("%.3f s, %.2f GiB/s\n", seconds, opts.m * static_cast<double>(bytes) / kGiB / seconds);
      }
    }

    const double gib = opts.m * static_cast<double>(bytes) / kGiB;
    const double inline_rate = gib / summarize(variants.front().seconds).median;
    std::vector<json_object> rows;
    std::vector<std::string> table;
    char line[256];
    std::snprintf(line, sizeof line, "%-18s %4s %10s %10s %9s  %s", "kind", "W", "median_s", "GiB/s", "/inline",
                  "stolen, per-worker items (last rep)");
    table.emplace_back(line);
    for (const variant& v : variants) {
      const summary s = summarize(v.seconds);
      const double rate = gib / s.median;
      json_object row;
      row.set("kind", v.kind).set("m", opts.m).set("each_gib", static_cast<double>(bytes) / kGiB);
      if (v.workers != 0) row.set("workers", v.workers);
      row.set("seconds", s).set("gib_per_s", rate).set("ratio_to_inline", rate / inline_rate);
      std::string extra;
      if (!v.stolen.empty()) {
        const double stolen = summarize(v.stolen).median;
        row.set("stolen", stolen).set("per_worker_reaped", v.per_worker_reaped);
        extra = std::to_string(static_cast<long long>(stolen)) + ", [";
        for (std::size_t i = 0; i < v.per_worker_reaped.size(); ++i) {
          extra += (i == 0 ? "" : " ") + std::to_string(v.per_worker_reaped[i]);
        }
        extra += "]";
      }
      rows.push_back(row);
      std::snprintf(line, sizeof line, "%-18s %4s %10.3f %10.2f %9.2f  %s", v.kind.c_str(),
                    v.workers != 0 ? std::to_string(v.workers).c_str() : "-", s.median, rate, rate / inline_rate,
                    extra.c_str());
      table.emplace_back(line);
    }

    json_object machine;
    machine.set("cpus", hardware)
        .set("mem_total_gib", static_cast<double>(meminfo_bytes("MemTotal:")) / kGiB)
        .set("mem_available_gib", static_cast<double>(available) / kGiB)
        .set("cpu_model", teardown_bench::cpu_model())
        .set("kernel", teardown_bench::kernel_release())
        .set("load_average_1m", teardown_bench::load_average_1m())
        .set("thp", teardown_bench::first_line("/sys/kernel/mm/transparent_hugepage/enabled"));
    json_object config;
    config.set("m", opts.m).set("each_gib", static_cast<double>(bytes) / kGiB).set("reps", opts.reps);
    config.set("workers", opts.workers).set("nice", opts.nice).set("quick", opts.quick);
    if (capped) config.set("capped", "M cut down by the memory rule from " + std::to_string(wanted_m));

    const std::string json = teardown_bench::rows_document("pool_bench", machine, config, rows);

    std::fprintf(stderr, "\npool_bench: M = %d items of %.3g GiB (%.2f GiB), %d reps, %d CPUs\n", opts.m,
                 static_cast<double>(bytes) / kGiB, gib, opts.reps, hardware);
    for (const std::string& row : table) std::fprintf(stderr, "%s\n", row.c_str());
    std::fprintf(stderr, "total %.1f s\n", seconds_between(total_start, clock_type::now()));
    if (!teardown_bench::write_document("pool_bench", opts.out, json)) return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pool_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
