// exit_matrix — the seed RFC's benchmark matrix ("Numbers" in the cover letter of seed 000), side
// by side, on the model kernel with real memory, in one run. A plain program, not Google
// Benchmark: every row is a macro measurement of milliseconds to seconds with its own
// repetitions, summarised as median / min / max. JSON on stdout (or --out), progress lines and a
// table at the end on stderr.
//
// The model. A "process" is a teardown::model task whose mm is backed by real memory: spawn()
// maps an anonymous region of the RSS and touches every page; its exit() runs mmput_exit, which
// tears the mm down inline (munmap on the exiting thread) or queues it for the mm_reaper thread
// (nice 19). Three kernels take turns within each repetition, so that drift hits them alike:
//   off            teardown::model::mm_system, vm.async_mm_teardown = 0
//   on             the same with vm.async_mm_teardown = 1 and max_pending_pages raised to 3/4 of
//                  RAM, as the seed does "so the measurements exercise the reaper, not the
//                  backpressure fallback" (the default RAM/4 would send a large mm back to the
//                  sync path)
//   compiled_out   basic_mm_system<teardown::const_key<false>>: no reaper, no toggle (CONFIG=n)
// Unlike a kernel exit, all model processes live in this one process: a teardown is munmap of a
// mapping in a multi-threaded process (it may shoot down TLBs on the CPUs running our other
// threads) rather than exit_mmap of a dying mm. The shadow_peer row uses real processes.
//
// The rows (kind in the JSON):
//   exit_latency      per size (--sizes, GiB) and kernel: populate one process, then
//                     exit_path_ms   the task->exit() that drops the last reference, on the
//                                    calling thread (the seed's "kill -> reap" analogue)
//                     memory_back_ms from the start of that exit until flush() returned AND
//                                    the free memory is back within 10% of the process size of
//                                    its value before populating, polled about every 1 ms;
//                                    bounded (5 s + 1 s per GiB). A repetition that hits the
//                                    bound counts the bound and is counted in
//                                    memory_back_timeouts. Free memory = MemAvailable plus the
//                                    pages on the per-CPU free lists (memory_gauge says why).
//                     reduction      on rows: off median / on median of exit_path_ms.
//                     decisions      {"queued", "sync"}: what mmput_exit decided, all reps
//                                    (off and on rows), so an on row shows that it queued.
//   simultaneous      M (--m) processes of --each GiB (0.5), all populated first (in parallel),
//                     then exited at once from M threads released by one std::latch.
//                     tail_ms          from the first exit's start until every process is torn
//                                      down: the exits returned, flush() returned and the memory
//                                      is back (as above, for all M)
//                     exit_path_max_ms the slowest single exit() call
//                     exits_done_ms    from the first exit's start until the last exit() call
//                                      returned: what the seed's "tail until ALL reaped" measures
//   below_threshold   a 30 MiB process (below the 64 MiB default threshold: the sync path either
//                     way), async off vs on, exit_path_ms over --below-reps (21) repetitions.
//   drain             a backlog of --drain-backlog GiB in --each GiB processes is queued behind a
//                     frozen reaper (freeze()); seconds = thaw() until flush() returns;
//                     gib_per_s = backlog / median seconds.
//   cpu_conservation  5 consecutive teardowns of --cpu-size GiB, one process at a time: async
//                     off, the exiting thread's CLOCK_THREAD_CPUTIME_ID over the five exit()
//                     calls; async on, the reaper's worker_cpu_ns over a fully drained window
//                     (flushed before the first exit, flushed after each, read after the last).
//                     The reaper's figure includes its polling and wake-ups. ratio =
//                     reaper / inline (medians over the repetitions).
//   shadow_peer       the process-level technique QEMU uses (-run-with async-teardown=on), on real
//                     processes. A fork()ed child maps and touches --sizes GiB, and the parent
//                     times SIGKILL -> waitpid() returning (kill_to_waitpid_ms). With shadow, the
//                     child first makes a process of its own with clone(CLONE_VM | CLONE_PARENT |
//                     SIGCHLD) on a small static stack: it shares the child's mm (one more
//                     mm_users reference), blocks in ppoll, and is our child too (CLONE_PARENT),
//                     so we can reap it. The killed child's exit then only drops its reference;
//                     the teardown is paid when we kill the shadow (shadow_teardown_ms, SIGKILL ->
//                     waitpid). memory_held_by_shadow says whether the free memory was still down
//                     by half the size once the child was reaped, in every repetition. Both
//                     processes set PR_SET_PDEATHSIG = SIGKILL, and every pid is killed and
//                     reaped on every path out, so nothing outlives a repetition.
//   exit_breakdown    the first size: one deferred exit taken apart, inline / deferred with the default
//                     wake / deferred with a polling reaper (--poll-interval-us, 1000) / deferred
//                     with a lazy one (poll_interval_max --poll-max-us, 128000) in turn. The lazy
//                     row waits for the worker's own look before its flush (a flush would hurry
//                     it), so its start delay and torn_down_ms are those of an exit nobody waits for.
//                     The queue trace point's hook stamps the moment the enqueue is reached, so
//                     bookkeeping_us = exit() start -> enqueue reached (task::exit, mmput_exit,
//                     put's steps) and enqueue_and_wake_us = the rest (the enqueue, its futex wake);
//                     the reap hook gives teardown_start_delay_us. torn_down_ms = exit() start
//                     -> flush() returned (the munmap done); memory_back_ms as above (on a busy
//                     machine other processes move it); teardown_cpu_ms (inline: the exiting
//                     thread's CPU; deferred: the worker's); CAL / RES interrupts (all CPUs) and
//                     the worker's context switches from exit() start to flush(). Each as a
//                     ratio to inline too. Then exit_breakdown_warm: the same split for
//                     simulated mms exited back to back (nothing evicts the caches between).
//   placement         the first size: the same teardown inline with the exiting thread pinned
//                     to CPU 0, and deferred with the reaper at nice 19 (default), nice 0, pinned
//                     to CPU 0 (same CPU) or 1 (other), same CPU at nice 0, and same CPU polling.
//   wake_vs_idle      a bare reaper, trivial items: the producer's enqueue after the worker (and
//                     the producer) slept 0.02 / 2 / 20 / 200 ms, default wake vs polling, with
//                     the time until fn started.
//   poll_price        a bare reaper idle for 1 s at poll intervals 0 (the wake), 100 us, the
//                     chosen one and 10 ms, and lazy (the chosen one backing off to
//                     --poll-max-us, measured once backed off): its CPU per second and timed
//                     wake-ups per second, then the time from an enqueue to fn starting (lazy:
//                     each enqueue after 2 to 4 x --poll-max-us idle, spread evenly).
//   busy_machine      the first size on a busy machine: --busy processes (one per CPU by
//                     default) spin at nice 0 while the teardown runs inline, deferred to a
//                     nice-19 reaper that is never boosted (boost_after 0), and deferred with the
//                     default options (a flush that waits raises the worker). The exit_breakdown
//                     columns, plus spinners_lost_cpu_ms (the spinners' CPU rate over the 200 ms
//                     before the exit, times exit() start -> flush() returned, less the CPU they
//                     got in that window) and lost_cpu_vs_teardown_cpu.
//
// The memory rule: nothing populates more than --mem-fraction (0.6) of MemAvailable, read just
// before each row. A row that does not fit is "skipped" with the reason and no measurements; the
// drain backlog is cut down to fit instead ("capped" says so; the row keeps its measurements).
// A row whose run failed (an mmap refused, an exit not queued, a child that never reported) is
// "skipped": "failed: ..." and keeps whatever repetitions it completed.
//
// The seed's figures ("seed" objects) are the cover letter's, from bare metal with 32 CPUs and
// 32 GB, kernel exits; they are not ours and are there to be read beside ours. Where the letter
// says GB, the figure is taken as written.
//
// JSON. Timings are std::chrono::steady_clock; a summary {S} is {"median", "min", "max"} in the
// unit its key names; [optional] fields appear only where they apply.
//   {"benchmark": "exit_matrix",
//    "machine": {"cpus", "mem_total_gib", "mem_available_gib", "page_size", "cpu_model", "kernel",
//                "load_average_1m"},
//    "config": {"reps", "thresh_pages", "max_pending_pages", "note", "below_reps", "each_gib",
//               "mem_fraction", "quick"},
//    "rows": [ one object per row, "kind" first and "seed" last:
//      exit_latency      size_gib, async ("off" | "on" | "compiled_out"), exit_path_ms {S},
//                        memory_back_ms {S}, [reduction], [decisions], [memory_back_timeouts]
//      simultaneous      m, size_gib, async ("off" | "on"), tail_ms {S}, exit_path_max_ms {S},
//                        exits_done_ms {S}, decisions, [memory_back_timeouts]
//      below_threshold   size_mib, async, exit_path_ms {S}, reps, decisions
//      drain             backlog_gib, processes, size_gib, seconds {S}, gib_per_s, [capped]
//      cpu_conservation  size_gib, teardowns (5), inline_cpu_ms, reaper_cpu_ms, ratio,
//                        on_exit_path_cpu_ms (the exit path's own CPU with async on), reps
//      shadow_peer       size_gib, shadow (bool), kill_to_waitpid_ms {S}, [shadow_teardown_ms {S},
//                        memory_held_by_shadow]
//      exit_breakdown,   size_gib, kernel, exit_path_us {S}, [bookkeeping_us {S},
//      placement,        enqueue_and_wake_us {S}, teardown_start_delay_us {S}], worker_idle_ms {S},
//      busy_machine
//                        torn_down_ms {S}, memory_back_ms {S}, teardown_cpu_ms {S},
//                        cal_interrupts {S}, res_interrupts {S}, worker_context_switches {S},
//                        exit_fraction_of_inline, torn_down_vs_inline, memory_back_vs_inline,
//                        cpu_vs_inline, reps; busy_machine also spinners_lost_cpu_ms {S},
//                        lost_cpu_vs_teardown_cpu
//      exit_breakdown_warm  size_gib, kernel, exit_path_us {S}, bookkeeping_us {S},
//                        enqueue_and_wake_us {S}, samples
//      wake_vs_idle      idle_ms, policy, enqueue_ns {S}, teardown_start_us {S},
//                        wakeups_per_enqueue, samples
//      poll_price        poll_interval_us (0: the wake), poll_interval_max_us (0: no back-off),
//                        idle_cpu_us_per_s, polls_per_s,
//                        teardown_start_us {S}, enqueue_ns {S}
//      any row           [skipped] (the reason; a skipped row may lack its measurements),
//                        [seed] {"source", the seed's figures under our keys, "measure"}]}
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
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
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <latch>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "teardown/model/mm.hpp"

#include "machine_info.hpp"
#include "macro_support.hpp"

namespace {

using teardown_bench::json_object;
using teardown_bench::ms_between;
using teardown_bench::progress;
using teardown_bench::strprintf;
using teardown_bench::summarize;
using teardown_bench::summary;
using teardown_bench::thread_cpu_ms;

using clock_type = std::chrono::steady_clock;
using teardown::model::backing;
using on_off_kernel = teardown::model::mm_system;
using compiled_out_kernel = teardown::model::basic_mm_system<teardown::const_key<false>>;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;
constexpr int kTeardownsPerCpuWindow = 5;
constexpr double kBelowThresholdMiB = 30;
constexpr const char* kSeedSource = "seed 000 cover letter, bare metal 32 CPUs";

// ---- options --------------------------------------------------------------------------------

constexpr std::string_view kRowKinds[] = {"exit_latency", "simultaneous",     "below_threshold", "drain",
                                          "cpu_conservation", "shadow_peer", "exit_breakdown", "wake_vs_idle",
                                          "poll_price",   "placement", "busy_machine"};

struct options {
  std::string out;  // empty: stdout
  int reps = 3;
  int below_reps = 21;
  std::vector<double> sizes_gib{1, 4, 16};
  std::vector<int> m{8, 16, 32};
  double each_gib = 0.5;
  double drain_backlog_gib = 16;
  double cpu_size_gib = 4;  // the seed's five 4GB teardowns
  double mem_fraction = 0.6;
  double poll_interval_us = 1000;  // the polling kernel's reaper_options::poll_interval
  double poll_max_us = 128000;     // the lazy kernel's reaper_options::poll_interval_max
  int busy = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));  // busy_machine's spinners
  bool quick = false;
  std::vector<std::string> rows{std::begin(kRowKinds), std::end(kRowKinds)};

  bool wants(std::string_view kind) const { return std::find(rows.begin(), rows.end(), kind) != rows.end(); }
};

constexpr const char* kUsage =
    "usage: exit_matrix [--out FILE] [--reps N] [--sizes 1,4,16] [--m 8,16,32] [--quick]\n"
    "                   [--rows exit_latency,simultaneous,below_threshold,drain,cpu_conservation,shadow_peer,\n"
    "                           exit_breakdown,placement,wake_vs_idle,poll_price,busy_machine]\n"
    "                   [--each GIB] [--below-reps N] [--drain-backlog GIB] [--cpu-size GIB]\n"
    "                   [--mem-fraction F] [--poll-interval-us US] [--poll-max-us US] [--busy N]\n"
    "  --out FILE          write the JSON there (default: stdout)\n"
    "  --reps N            repetitions per row (default 3)\n"
    "  --sizes LIST        GiB per process for exit_latency and shadow_peer (default 1,4,16)\n"
    "  --m LIST            simultaneous exits (default 8,16,32)\n"
    "  --each GIB          size of each process in simultaneous and drain (default 0.5)\n"
    "  --below-reps N      repetitions of below_threshold (default 21)\n"
    "  --drain-backlog GIB the drain row's backlog (default 16; cut down to fit the memory rule)\n"
    "  --cpu-size GIB      each of cpu_conservation's five teardowns (default 4, as the seed)\n"
    "  --mem-fraction F    populate at most F of MemAvailable (default 0.6)\n"
    "  --poll-interval-us US  the polling kernel's reaper poll_interval (default 1000)\n"
    "  --poll-max-us US    the lazy kernel's poll_interval_max: idle looks back off up to it (default 128000)\n"
    "  --busy N            busy_machine's spinning processes (default: one per CPU)\n"
    "  --quick             smoke test in seconds: sizes 0.25, M 2,4, each 0.25, reps 1,\n"
    "                      below-reps 5, drain-backlog 1, cpu-size 0.25 (other flags override)\n"
    "  --rows LIST         run only these row kinds\n";

constexpr teardown_bench::command_line kCommandLine{"exit_matrix", kUsage};

options parse_options(int argc, char** argv) {
  // Explicit flags win over --quick whatever their order: gather them first, apply after.
  options opts;
  const teardown_bench::command_line::given given = kCommandLine.parse(argc, argv, {"--quick"});
  opts.quick = given.has("--quick");
  if (opts.quick) {
    opts.reps = 1;
    opts.below_reps = 5;
    opts.sizes_gib = {0.25};
    opts.m = {2, 4};
    opts.each_gib = 0.25;
    opts.drain_backlog_gib = 1;
    opts.cpu_size_gib = 0.25;
  }
  for (const auto& [name, value] : given.flags) {
    if (name == "--out") {
      opts.out = value;
    } else if (name == "--reps") {
      opts.reps = kCommandLine.count(name, value);
    } else if (name == "--below-reps") {
      opts.below_reps = kCommandLine.count(name, value);
    } else if (name == "--sizes") {
      opts.sizes_gib.clear();
      for (const std::string& part : teardown_bench::split_list(value))
        opts.sizes_gib.push_back(kCommandLine.positive(name, part));
    } else if (name == "--m") {
      opts.m.clear();
      for (const std::string& part : teardown_bench::split_list(value))
        opts.m.push_back(kCommandLine.count(name, part));
    } else if (name == "--each") {
      opts.each_gib = kCommandLine.positive(name, value);
    } else if (name == "--drain-backlog") {
      opts.drain_backlog_gib = kCommandLine.positive(name, value);
    } else if (name == "--cpu-size") {
      opts.cpu_size_gib = kCommandLine.positive(name, value);
    } else if (name == "--mem-fraction") {
      opts.mem_fraction = kCommandLine.positive(name, value);
      if (opts.mem_fraction > 0.95) kCommandLine.usage_error("--mem-fraction: at most 0.95");
    } else if (name == "--poll-interval-us") {
      opts.poll_interval_us = kCommandLine.positive(name, value);
    } else if (name == "--poll-max-us") {
      opts.poll_max_us = kCommandLine.positive(name, value);
    } else if (name == "--busy") {
      opts.busy = kCommandLine.count(name, value);
    } else if (name == "--rows") {
      opts.rows.clear();
      for (const std::string& part : teardown_bench::split_list(value)) {
        if (std::find(std::begin(kRowKinds), std::end(kRowKinds), part) == std::end(kRowKinds)) {
          kCommandLine.usage_error("--rows: unknown row kind \"" + part + "\"");
        }
        opts.rows.push_back(part);
      }
    } else {
      kCommandLine.usage_error("unknown flag " + name);
    }
  }
  return opts;
}

// ---- /proc/meminfo and /proc/zoneinfo ---------------------------------------------------------

// Reads the two files through descriptors kept open, from offset 0 each time.
//
// Why both: since Linux 6.7 the per-CPU free lists (PCP) grow on a freeing CPU up to high_max
// (zone pages / 8, spread over the CPUs: 784 MiB per CPU on the 24 GiB machine of the first
// runs), and pages on them count as neither MemFree nor MemAvailable. A freshly unmapped
// gigabyte may therefore not show in MemAvailable at all, while the next allocation takes it
// straight back from the list. Pages on those lists are free, so the memory-back measure adds
// them: MemAvailable + the "count:" of every pageset in /proc/zoneinfo.
class memory_gauge {
 public:
  memory_gauge()
      : meminfo_fd_(open("/proc/meminfo", O_RDONLY | O_CLOEXEC)),
        zoneinfo_fd_(open("/proc/zoneinfo", O_RDONLY | O_CLOEXEC)) {
    if (meminfo_fd_ < 0) throw std::system_error(errno, std::generic_category(), "open /proc/meminfo");
  }
  memory_gauge(const memory_gauge&) = delete;
  memory_gauge& operator=(const memory_gauge&) = delete;
  ~memory_gauge() {
    close(meminfo_fd_);
    if (zoneinfo_fd_ >= 0) close(zoneinfo_fd_);
  }

  std::uint64_t available_bytes() const { return meminfo_field("MemAvailable:"); }
  std::uint64_t total_bytes() const { return meminfo_field("MemTotal:"); }

  // MemAvailable plus the pages on the per-CPU free lists (MemAvailable alone without
  // /proc/zoneinfo).
  std::uint64_t free_bytes() const { return available_bytes() + per_cpu_list_pages() * page_size_; }

 private:
  static void read_whole(int fd, std::string& into, const char* what) {
    into.resize(std::max<std::size_t>(into.capacity(), 16384));
    std::size_t filled = 0;
    for (;;) {
      if (filled == into.size()) into.resize(into.size() * 2);
      const ssize_t got = pread(fd, into.data() + filled, into.size() - filled, static_cast<off_t>(filled));
      if (got < 0) throw std::system_error(errno, std::generic_category(), what);
      if (got == 0) break;
      filled += static_cast<std::size_t>(got);
    }
    into.resize(filled);
  }

  std::uint64_t meminfo_field(std::string_view field) const {
    read_whole(meminfo_fd_, buffer_, "read /proc/meminfo");
    const std::size_t at = buffer_.find(field);
    if (at == std::string::npos) throw std::runtime_error("/proc/meminfo has no " + std::string(field));
    return std::strtoull(buffer_.c_str() + at + field.size(), nullptr, 10) * 1024;  // the file says kB
  }

  std::uint64_t per_cpu_list_pages() const {
    if (zoneinfo_fd_ < 0) return 0;
    read_whole(zoneinfo_fd_, buffer_, "read /proc/zoneinfo");
    constexpr std::string_view key = "count:";
    std::uint64_t pages = 0;
    for (std::size_t at = buffer_.find(key); at != std::string::npos; at = buffer_.find(key, at + key.size())) {
      pages += std::strtoull(buffer_.c_str() + at + key.size(), nullptr, 10);
    }
    return pages;
  }

  int meminfo_fd_;
  int zoneinfo_fd_;  // -1 where unreadable
  std::uint64_t page_size_ = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  mutable std::string buffer_;
};

// The three kernels a row compares (see the header comment).
enum class mode { off, on, compiled_out };

const char* name_of(mode m) {
  switch (m) {
    case mode::off: return "off";
    case mode::on: return "on";
    case mode::compiled_out: return "compiled_out";
  }
  return "?";
}

// ---- the seed's figures -----------------------------------------------------------------------

json_object seed_object() { return json_object().set("source", kSeedSource); }

// kill, async off -> on, and the CONFIG=n control (ms); memory back: the single-rep
// nr_free_pages watcher readings the letter gives for 16GB.
struct seed_exit {
  double gib, off_ms, on_ms;
  double compiled_out_ms;      // NAN where the letter has none
  double off_back_ms, on_back_ms;  // NAN where the letter has none
};
constexpr seed_exit kSeedExit[] = {
    {1, 18.01, 0.14, 18.01, NAN, NAN},
    {4, 73.71, 0.14, NAN, NAN, NAN},
    {16, 282.16, 0.15, 282.14, 283, 240},
};

double seed_ms(const seed_exit& seed, mode m) {
  return m == mode::off ? seed.off_ms : m == mode::on ? seed.on_ms : seed.compiled_out_ms;
}

// M simultaneous 0.5GB exits, tail until all reaped (ms).
struct seed_simultaneous {
  int m;
  double off_ms, on_ms;
};
constexpr seed_simultaneous kSeedSimultaneous[] = {{8, 40.64, 0.15}, {16, 79.99, 0.17}, {32, 157.42, 0.32}};

// ---- the kernels ------------------------------------------------------------------------------

std::uint64_t raised_max_pending_pages() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  return pages > 0 ? static_cast<std::uint64_t>(pages) / 4 * 3 : on_off_kernel::default_max_pending_pages();
}

teardown::model::mm_system_options kernel_options(bool async) {
  teardown::model::mm_system_options opts;
  opts.async_mm_teardown = async;
  if (async) opts.max_pending_pages = raised_max_pending_pages();
  return opts;
}

std::uint64_t pages_for(double bytes) {
  return static_cast<std::uint64_t>(bytes) / on_off_kernel::page_size();
}

// One kernel of each mode, alive together so that the repetitions can take turns.
struct kernels {
  on_off_kernel off{kernel_options(false)};
  on_off_kernel on{kernel_options(true)};
  compiled_out_kernel compiled_out{kernel_options(false)};

  // Calls fn with the kernel of that mode.
  template <class Fn>
  decltype(auto) with(mode m, Fn&& fn) {
    switch (m) {
      case mode::off: return fn(off);
      case mode::on: return fn(on);
      case mode::compiled_out: break;
    }
    return fn(compiled_out);
  }
};

// Counts mmput_exit's decisions over a row, so that an async-on row shows it really queued.
struct decision_counts {
  int queued = 0;
  int sync = 0;

  void add(std::optional<teardown::decision> d) {
    if (!d) return;
    (*d == teardown::decision::queued ? queued : sync) += 1;
  }
  json_object json() const { return json_object().set("queued", queued).set("sync", sync); }
};

// ---- counters for the breakdown rows ------------------------------------------------------------

// The sum over CPUs of one /proc/interrupts line ("CAL", "RES", "TLB"), 0 if absent.
std::uint64_t interrupts_named(std::string_view name) {
  std::ifstream file("/proc/interrupts");
  std::string line;
  const std::string key = std::string(name) + ":";
  while (std::getline(file, line)) {
    const std::size_t at = line.find_first_not_of(' ');
    if (at == std::string::npos || line.compare(at, key.size(), key) != 0) continue;
    std::uint64_t sum = 0;
    const char* p = line.c_str() + at + key.size();
    for (;;) {
      char* end = nullptr;
      const unsigned long long v = std::strtoull(p, &end, 10);
      if (end == p) break;
      sum += v;
      p = end;
    }
    return sum;
  }
  return 0;
}

// This process's thread named `name` (/proc/self/task/*/comm), or -1.
pid_t thread_named(const std::string& name) {
  for (int attempt = 0; attempt < 1000; ++attempt) {
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
      std::ifstream comm(entry.path() / "comm");
      std::string line;
      std::getline(comm, line);
      if (line == name) return static_cast<pid_t>(std::stoi(entry.path().filename().string()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return -1;
}

// voluntary + nonvoluntary context switches of thread `tid` so far.
std::uint64_t context_switches(pid_t tid) {
  if (tid < 0) return 0;
  std::ifstream status("/proc/self/task/" + std::to_string(tid) + "/status");
  std::uint64_t sum = 0;
  for (std::string line; std::getline(status, line);) {
    if (line.find("ctxt_switches:") != std::string::npos)
      sum += std::strtoull(line.c_str() + line.find(':') + 1, nullptr, 10);
  }
  return sum;
}

// Pins the calling thread to `cpu` for its lifetime (no-op for cpu < 0); restores the old mask.
class pinned_here {
 public:
  explicit pinned_here(int cpu) {
    if (cpu < 0 || sched_getaffinity(0, sizeof old_, &old_) != 0) return;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(static_cast<std::size_t>(cpu), &one);
    pinned_ = sched_setaffinity(0, sizeof one, &one) == 0;
  }
  pinned_here(const pinned_here&) = delete;
  pinned_here& operator=(const pinned_here&) = delete;
  ~pinned_here() {
    if (pinned_) (void)sched_setaffinity(0, sizeof old_, &old_);
  }

 private:
  cpu_set_t old_{};
  bool pinned_ = false;
};

// The trace hooks of the breakdown: when the producer reached the enqueue (after every step of
// the model's bookkeeping), and how long the reaper's item waited before its teardown began.
std::atomic<std::uint64_t> g_queue_reached_ns{0};
std::atomic<std::uint64_t> g_reap_wait_ns{0};
void on_queue(const teardown::trace::queue_event&) {
  g_queue_reached_ns.store(teardown::detail::monotonic_ns(), std::memory_order_relaxed);
}
void on_reap(const teardown::trace::reap_event& e) { g_reap_wait_ns.store(e.wait_ns, std::memory_order_relaxed); }

// ---- the matrix -------------------------------------------------------------------------------

class matrix {
 public:
  explicit matrix(options opts) : opts_(std::move(opts)) {}

  void run() {
    if (opts_.wants("exit_latency")) exit_latency();
    if (opts_.wants("simultaneous")) simultaneous();
    if (opts_.wants("below_threshold")) below_threshold();
    if (opts_.wants("drain")) drain();
    if (opts_.wants("cpu_conservation")) cpu_conservation();
    if (opts_.wants("shadow_peer")) shadow_peer();
    if (opts_.wants("exit_breakdown")) exit_breakdown();
    if (opts_.wants("wake_vs_idle")) wake_vs_idle();
    if (opts_.wants("poll_price")) poll_price();
    if (opts_.wants("placement")) placement();
    if (opts_.wants("busy_machine")) busy_machine();
  }

  json_object machine(std::uint64_t available_at_start) const {
    return json_object()
        .set("cpus", static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)))
        .set("mem_total_gib", static_cast<double>(mem_.total_bytes()) / kGiB)
        .set("mem_available_gib", static_cast<double>(available_at_start) / kGiB)
        .set("page_size", static_cast<int>(on_off_kernel::page_size()))
        .set("cpu_model", teardown_bench::cpu_model())
        .set("kernel", teardown_bench::kernel_release())
        .set("load_average_1m", teardown_bench::load_average_1m());
  }

  json_object config() const {
    return json_object()
        .set("reps", opts_.reps)
        .set("thresh_pages", on_off_kernel::default_thresh_pages())
        .set("max_pending_pages", raised_max_pending_pages())
        .set("note",
             "async-on runs raise max_pending_pages to 3/4 of RAM, as the seed does, so the "
             "measurements exercise the reaper, not the backpressure fallback; thresh_pages is the "
             "default (64 MiB). Model processes are anonymous mappings of this one process, touched "
             "page by page; their teardown is munmap (inline, or on the nice-19 mm_reaper thread). "
             "memory_back counts as free MemAvailable plus the pages on the per-CPU free lists "
             "(/proc/zoneinfo count:), which MemAvailable leaves out and which hold up to 1/8 of a zone "
             "since Linux 6.7. "
             "shadow_peer uses real fork()ed processes. Seed figures are the cover letter's bare-metal "
             "32-CPU kernel numbers, not ours.")
        .set("below_reps", opts_.below_reps)
        .set("each_gib", opts_.each_gib)
        .set("mem_fraction", opts_.mem_fraction)
        .set("quick", opts_.quick);
  }

  const std::vector<json_object>& rows() const { return rows_; }
  const std::vector<std::string>& table() const { return table_; }

 private:
  // ---- helpers ----

  // The reason a row that populates `bytes` at once may not run, or nullopt if it fits.
  std::optional<std::string> over_memory_rule(double bytes) const {
    const double available = static_cast<double>(mem_.available_bytes());
    if (bytes <= opts_.mem_fraction * available) return std::nullopt;
    return strprintf("needs %.2f GiB populated at once, above %.0f%% of MemAvailable (%.2f GiB)", bytes / kGiB,
                  opts_.mem_fraction * 100, available / kGiB);
  }

  // Polls the free memory (memory_gauge::free_bytes) about every millisecond until it is within
  // 10% of `bytes` of `before`; the time it was first seen there, or nullopt once the bound
  // (5 s + 1 s per GiB) has passed.
  std::optional<clock_type::time_point> wait_memory_back(std::uint64_t before, double bytes) const {
    const auto slack = static_cast<std::uint64_t>(0.1 * bytes);
    const std::uint64_t target = before > slack ? before - slack : 0;
    const auto deadline = clock_type::now() + std::chrono::milliseconds(5000 + static_cast<int>(1000 * bytes / kGiB));
    for (;;) {
      const std::uint64_t available = mem_.free_bytes();
      const auto now = clock_type::now();
      if (available >= target) return now;
      if (now > deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  // A task populated with real memory, timed on stderr.
  template <class Kernel>
  static std::unique_ptr<typename Kernel::task> populate(Kernel& kernel, double bytes) {
    progress("populating %.3g GiB ... ", bytes / kGiB);
    const auto start = clock_type::now();
    auto task = kernel.spawn(pages_for(bytes), backing::real);
    progress("%.1f s", ms_between(start, clock_type::now()) / 1e3);
    return task;
  }

  // `count` tasks of `bytes` each, populated by up to one thread per CPU.
  template <class Kernel>
  static std::vector<std::unique_ptr<typename Kernel::task>> populate_many(Kernel& kernel, int count, double bytes) {
    progress("populating %d x %.3g GiB ... ", count, bytes / kGiB);
    const auto start = clock_type::now();
    std::vector<std::unique_ptr<typename Kernel::task>> tasks(static_cast<std::size_t>(count));
    std::atomic<int> next{0};
    std::exception_ptr failure;
    std::mutex failure_lock;
    const int workers = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, count);
    std::vector<std::jthread> threads;  // joined on every way out
    for (int w = 0; w < workers; ++w) {
      threads.emplace_back([&] {
        for (int i; (i = next.fetch_add(1, std::memory_order_relaxed)) < count;) {
          try {
            tasks[static_cast<std::size_t>(i)] = kernel.spawn(pages_for(bytes), backing::real);
          } catch (...) {
            const std::lock_guard lock(failure_lock);
            if (!failure) failure = std::current_exception();
          }
        }
      });
    }
    for (std::jthread& t : threads) t.join();
    if (failure) std::rethrow_exception(failure);  // the tasks made so far exit as they go
    progress("%.1f s", ms_between(start, clock_type::now()) / 1e3);
    return tasks;
  }

  // The seed's figures come last in a row, after ours.
  void add_row(json_object row) {
    row.move_to_end("seed");
    rows_.push_back(std::move(row));
  }

  void heading(const char* line) { table_.emplace_back(line); }

  // ---- exit_latency ----

  struct exit_sample {
    double exit_path_ms = NAN;
    double memory_back_ms = NAN;
    bool timed_out = false;
    std::optional<teardown::decision> decided;
  };

  // Populates one process, then times its exit and the return of its memory.
  template <class Kernel>
  exit_sample timed_exit(Kernel& kernel, double bytes, bool wait_back) {
    const std::uint64_t before = mem_.free_bytes();
    auto task = populate(kernel, bytes);
    exit_sample sample;
    const auto start = clock_type::now();
    sample.decided = task->exit();
    const auto exited = clock_type::now();
    kernel.flush();
    sample.exit_path_ms = ms_between(start, exited);
    if (wait_back) {
      const auto back = wait_memory_back(before, bytes);
      sample.timed_out = !back;
      sample.memory_back_ms = ms_between(start, back.value_or(clock_type::now()));
    }
    return sample;
  }

  void exit_latency() {
    heading(
        "exit_latency      size GiB  async         exit_path ms med [min, max]       memory_back ms med [min, max]   "
        "reduction   seed exit_path");
    constexpr mode kModes[] = {mode::off, mode::on, mode::compiled_out};
    for (const double gib : opts_.sizes_gib) {
      const double bytes = gib * kGiB;
      const seed_exit* seed = nullptr;
      for (const seed_exit& s : kSeedExit) {
        if (s.gib == gib) seed = &s;
      }
      auto row_for = [&](mode m) {
        json_object row;
        row.set("kind", "exit_latency").set("size_gib", gib).set("async", name_of(m));
        return row;
      };
      auto seed_for = [&](mode m) -> std::optional<json_object> {
        if (seed == nullptr) return std::nullopt;
        const double ms = seed_ms(*seed, m);
        if (std::isnan(ms)) return std::nullopt;
        json_object o = seed_object();
        o.set("exit_path_ms", ms).set("measure", "SIGKILL -> waitpid() returns, median");
        const double back = m == mode::off ? seed->off_back_ms : m == mode::on ? seed->on_back_ms : NAN;
        if (!std::isnan(back)) {
          o.set("memory_back_ms", back)
              .set("memory_back_measure", "nr_free_pages recovered after the kill, single-rep watcher reading");
        }
        if (m == mode::on) o.set("reduction", seed->off_ms / seed->on_ms);
        if (m == mode::compiled_out)
          o.set("measure", "CONFIG_ASYNC_MM_TEARDOWN=n build, SIGKILL -> waitpid() returns, median");
        return o;
      };

      if (const auto why = over_memory_rule(bytes)) {
        for (const mode m : kModes) {
          json_object row = row_for(m);
          row.set("skipped", *why);
          if (auto s = seed_for(m)) row.set("seed", *s);
          add_row(std::move(row));
          table_.push_back(strprintf("                  %8.3g  %-12s  skipped: %s", gib, name_of(m), why->c_str()));
        }
        continue;
      }

      kernels k;
      std::vector<double> exit_ms[3], back_ms[3];
      int timeouts[3] = {};
      decision_counts decisions[3];
      std::optional<std::string> failed;
      for (int rep = 0; rep < opts_.reps && !failed; ++rep) {
        for (const mode m : kModes) {
          const int i = static_cast<int>(m);
          progress("exit_latency %.3g GiB async=%s rep %d/%d: ", gib, name_of(m), rep + 1, opts_.reps);
          try {
            const exit_sample s = k.with(m, [&](auto& kernel) { return timed_exit(kernel, bytes, true); });
            exit_ms[i].push_back(s.exit_path_ms);
            back_ms[i].push_back(s.memory_back_ms);
            timeouts[i] += s.timed_out ? 1 : 0;
            decisions[i].add(s.decided);
            progress(", exit %.3f ms, memory back %.1f ms%s (%s)\n", s.exit_path_ms, s.memory_back_ms,
                     s.timed_out ? " (timed out)" : "", s.decided ? teardown::to_string(*s.decided) : "not last");
          } catch (const std::exception& e) {
            failed = std::string("failed: ") + e.what();
            progress("%s\n", failed->c_str());
            break;
          }
        }
      }

      const summary off_exit = summarize(exit_ms[0]);
      for (const mode m : kModes) {
        const int i = static_cast<int>(m);
        json_object row = row_for(m);
        if (failed) row.set("skipped", *failed);
        if (!exit_ms[i].empty()) {
          const summary e = summarize(exit_ms[i]);
          const summary b = summarize(back_ms[i]);
          row.set("exit_path_ms", e).set("memory_back_ms", b);
          if (timeouts[i] != 0) row.set("memory_back_timeouts", timeouts[i]);
          double reduction = NAN;
          if (m == mode::on && !exit_ms[0].empty()) {
            reduction = off_exit.median / e.median;
            row.set("reduction", reduction);
          }
          if (m != mode::compiled_out) row.set("decisions", decisions[i].json());
          const auto s = seed_for(m);
          table_.push_back(
              strprintf("                  %8.3g  %-12s  %9.3f [%9.3f, %9.3f]    %9.1f [%9.1f, %9.1f]  %9s   %s", gib,
                        name_of(m), e.median, e.min, e.max, b.median, b.min, b.max,
                        std::isnan(reduction) ? "" : strprintf("%.1fx", reduction).c_str(),
                        s ? strprintf("%.2f ms", seed_ms(*seed, m)).c_str() : ""));
        }
        if (auto s = seed_for(m)) row.set("seed", *s);
        add_row(std::move(row));
      }
    }
  }

  // ---- simultaneous ----

  struct simultaneous_sample {
    double tail_ms = NAN;
    double exit_path_max_ms = NAN;
    double exits_done_ms = NAN;
    bool timed_out = false;
    decision_counts decisions;
  };

  template <class Kernel>
  simultaneous_sample simultaneous_exits(Kernel& kernel, int m, double bytes_each) {
    const std::uint64_t before = mem_.free_bytes();
    auto tasks = populate_many(kernel, m, bytes_each);
    const auto count = static_cast<std::size_t>(m);
    std::vector<clock_type::time_point> began(count), ended(count);
    std::vector<std::optional<teardown::decision>> decided(count);
    std::latch start(m);
    std::vector<std::thread> threads;
    threads.reserve(count);
    for (std::size_t i = 0; i < count; ++i) {
      threads.emplace_back([&, i] {
        start.arrive_and_wait();
        began[i] = clock_type::now();
        decided[i] = tasks[i]->exit();
        ended[i] = clock_type::now();
      });
    }
    for (std::thread& t : threads) t.join();
    kernel.flush();
    const auto back = wait_memory_back(before, bytes_each * m);

    simultaneous_sample sample;
    const auto first = *std::min_element(began.begin(), began.end());
    const auto last = *std::max_element(ended.begin(), ended.end());
    double slowest = 0;
    for (std::size_t i = 0; i < count; ++i) {
      slowest = std::max(slowest, ms_between(began[i], ended[i]));
      sample.decisions.add(decided[i]);
    }
    sample.timed_out = !back;
    sample.tail_ms = ms_between(first, back.value_or(clock_type::now()));
    sample.exit_path_max_ms = slowest;
    sample.exits_done_ms = ms_between(first, last);
    return sample;
  }

  void simultaneous() {
    heading(
        "simultaneous      M   GiB each  async  tail ms med [min, max]              exit_path_max ms med [min, max]  "
        "exits_done ms  seed off -> on");
    constexpr mode kModes[] = {mode::off, mode::on};
    for (const int m : opts_.m) {
      const double bytes_each = opts_.each_gib * kGiB;
      const seed_simultaneous* seed = nullptr;
      for (const seed_simultaneous& s : kSeedSimultaneous) {
        if (s.m == m && opts_.each_gib == 0.5) seed = &s;
      }
      auto row_for = [&](mode md) {
        json_object row;
        row.set("kind", "simultaneous").set("m", m).set("size_gib", opts_.each_gib).set("async", name_of(md));
        if (seed != nullptr) {
          json_object o = seed_object();
          o.set("exits_done_ms", md == mode::off ? seed->off_ms : seed->on_ms)
              .set("measure", "SIGKILL of all M -> the last waitpid() returns (tail until ALL reaped), median");
          row.set("seed", o);
        }
        return row;
      };
      if (const auto why = over_memory_rule(bytes_each * m)) {
        for (const mode md : kModes) add_row(row_for(md).set("skipped", *why));
        table_.push_back(strprintf("                  %3d  %8.3g  skipped: %s", m, opts_.each_gib, why->c_str()));
        continue;
      }

      kernels k;
      std::vector<double> tail[2], slowest[2], done[2];
      int timeouts[2] = {};
      decision_counts decisions[2];
      std::optional<std::string> failed;
      for (int rep = 0; rep < opts_.reps && !failed; ++rep) {
        for (const mode md : kModes) {
          const int i = static_cast<int>(md);
          progress("simultaneous M=%d x %.3g GiB async=%s rep %d/%d: ", m, opts_.each_gib, name_of(md), rep + 1,
                   opts_.reps);
          try {
            const simultaneous_sample s =
                k.with(md, [&](auto& kernel) { return simultaneous_exits(kernel, m, bytes_each); });
            tail[i].push_back(s.tail_ms);
            slowest[i].push_back(s.exit_path_max_ms);
            done[i].push_back(s.exits_done_ms);
            timeouts[i] += s.timed_out ? 1 : 0;
            decisions[i].queued += s.decisions.queued;
            decisions[i].sync += s.decisions.sync;
            progress(", tail %.1f ms, slowest exit %.3f ms, all exits done %.3f ms%s\n", s.tail_ms, s.exit_path_max_ms,
                     s.exits_done_ms, s.timed_out ? " (memory back timed out)" : "");
          } catch (const std::exception& e) {
            failed = std::string("failed: ") + e.what();
            progress("%s\n", failed->c_str());
            break;
          }
        }
      }
      for (const mode md : kModes) {
        const int i = static_cast<int>(md);
        json_object row = row_for(md);
        if (failed) row.set("skipped", *failed);
        if (!tail[i].empty()) {
          const summary t = summarize(tail[i]);
          const summary s = summarize(slowest[i]);
          const summary d = summarize(done[i]);
          row.set("tail_ms", t)
              .set("exit_path_max_ms", s)
              .set("exits_done_ms", d)
              .set("decisions", decisions[i].json());
          if (timeouts[i] != 0) row.set("memory_back_timeouts", timeouts[i]);
          table_.push_back(strprintf(
              "                  %3d  %8.3g  %-5s  %9.1f [%9.1f, %9.1f]    %9.3f [%9.3f, %9.3f]   %9.3f      %s", m,
              opts_.each_gib, name_of(md), t.median, t.min, t.max, s.median, s.min, s.max, d.median,
              seed != nullptr ? strprintf("%.2f -> %.2f ms", seed->off_ms, seed->on_ms).c_str() : ""));
        }
        add_row(std::move(row));
      }
    }
  }

  // ---- below_threshold ----

  void below_threshold() {
    heading("below_threshold   MiB  async  exit_path ms med [min, max]       seed");
    const double bytes = kBelowThresholdMiB * kMiB;
    constexpr mode kModes[] = {mode::off, mode::on};
    auto row_for = [&](mode md) {
      json_object row;
      row.set("kind", "below_threshold").set("size_mib", kBelowThresholdMiB).set("async", name_of(md));
      json_object seed = seed_object();
      seed.set("exit_path_ms", md == mode::off ? 0.56 : 0.60)
          .set("measure", "30MB process, feature OFF -> ON, sync path either way, median");
      row.set("seed", seed);
      return row;
    };
    if (const auto why = over_memory_rule(bytes)) {
      for (const mode md : kModes) add_row(row_for(md).set("skipped", *why));
      table_.push_back(strprintf("                  skipped: %s", why->c_str()));
      return;
    }
    kernels k;
    std::vector<double> exit_ms[2];
    decision_counts decisions[2];
    progress("below_threshold %g MiB x %d reps, off and on in turn ", kBelowThresholdMiB, opts_.below_reps);
    for (int rep = 0; rep < opts_.below_reps; ++rep) {
      for (const mode md : kModes) {
        const int i = static_cast<int>(md);
        const exit_sample s = k.with(md, [&](auto& kernel) {
          auto task = kernel.spawn(pages_for(bytes), backing::real);
          exit_sample sample;
          const auto start = clock_type::now();
          sample.decided = task->exit();
          sample.exit_path_ms = ms_between(start, clock_type::now());
          kernel.flush();
          return sample;
        });
        exit_ms[i].push_back(s.exit_path_ms);
        decisions[i].add(s.decided);
      }
      progress(".");
    }
    progress("\n");
    for (const mode md : kModes) {
      const int i = static_cast<int>(md);
      const summary e = summarize(exit_ms[i]);
      json_object row = row_for(md);
      row.set("exit_path_ms", e).set("reps", opts_.below_reps).set("decisions", decisions[i].json());
      add_row(std::move(row));
      table_.push_back(strprintf("                  %3g  %-5s  %9.3f [%9.3f, %9.3f]    %.2f ms", kBelowThresholdMiB,
                                 name_of(md), e.median, e.min, e.max, md == mode::off ? 0.56 : 0.60));
    }
    const double off = summarize(exit_ms[0]).median, on = summarize(exit_ms[1]).median;
    table_.push_back(strprintf("                  on / off = %.3f (seed: 0.60 / 0.56 = %.3f)", on / off, 0.60 / 0.56));
  }

  // ---- drain ----

  void drain() {
    heading("drain             backlog GiB  seconds med [min, max]          GiB/s   seed");
    int count = std::max(1, static_cast<int>(std::llround(opts_.drain_backlog_gib / opts_.each_gib)));
    const double bytes_each = opts_.each_gib * kGiB;
    std::optional<std::string> capped;
    const double allowed = opts_.mem_fraction * static_cast<double>(mem_.available_bytes());
    if (count * bytes_each > allowed) {
      const int fits = static_cast<int>(allowed / bytes_each);
      capped = strprintf(
          "backlog cut from %d to %d x %.3g GiB: %.2f GiB would be above %.0f%% of MemAvailable (%.2f GiB)", count,
          fits, opts_.each_gib, count * opts_.each_gib, opts_.mem_fraction * 100, allowed / opts_.mem_fraction / kGiB);
      count = fits;
    }
    const double backlog_gib = count * opts_.each_gib;
    json_object row;
    row.set("kind", "drain").set("backlog_gib", backlog_gib).set("processes", count).set("size_gib", opts_.each_gib);
    json_object seed = seed_object();
    seed.set("backlog_gb", 16.4)
        .set("seconds", 0.650)
        .set("gb_per_s", 25.0)
        .set("measure", "16.4GB backlog (32 x 0.5GB) returned in 650ms, one reaper; GB as the letter writes them");
    if (count < 1) {
      add_row(row.set("skipped", *capped).set("seed", seed));
      table_.push_back(strprintf("                  skipped: %s", capped->c_str()));
      return;
    }
    if (capped) row.set("capped", *capped);

    std::vector<double> seconds;
    std::optional<std::string> failed;
    on_off_kernel kernel(kernel_options(true));
    for (int rep = 0; rep < opts_.reps; ++rep) {
      progress("drain %.3g GiB backlog rep %d/%d: ", backlog_gib, rep + 1, opts_.reps);
      try {
        const std::uint64_t before = mem_.free_bytes();
        auto tasks = populate_many(kernel, count, bytes_each);
        kernel.freeze();
        decision_counts decisions;
        for (auto& task : tasks) decisions.add(task->exit());
        const auto start = clock_type::now();
        kernel.thaw();
        kernel.flush();
        const double s = ms_between(start, clock_type::now()) / 1e3;
        if (decisions.queued != count) {
          kernel.flush();
          throw std::runtime_error(strprintf("only %d of %d exits were queued", decisions.queued, count));
        }
        seconds.push_back(s);
        progress(", drained in %.3f s (%.2f GiB/s)\n", s, backlog_gib / s);
        (void)wait_memory_back(before, count * bytes_each);  // settle before the next repetition
      } catch (const std::exception& e) {
        failed = std::string("failed: ") + e.what();
        progress("%s\n", failed->c_str());
        break;
      }
    }
    if (failed) row.set("skipped", *failed);
    if (!seconds.empty()) {
      const summary s = summarize(seconds);
      row.set("seconds", s).set("gib_per_s", backlog_gib / s.median);
      table_.push_back(
          strprintf("                  %11.3g  %7.3f [%7.3f, %7.3f]      %7.2f   ~25 GB/s (16.4GB in 650ms)%s",
                    backlog_gib, s.median, s.min, s.max, backlog_gib / s.median, capped ? " (capped)" : ""));
    }
    add_row(std::move(row.set("seed", seed)));
  }

  // ---- cpu_conservation ----

  void cpu_conservation() {
    heading("cpu_conservation  GiB x 5  inline CPU ms  reaper CPU ms  ratio   seed");
    const double gib = opts_.cpu_size_gib;
    const double bytes = gib * kGiB;
    json_object row;
    row.set("kind", "cpu_conservation").set("size_gib", gib).set("teardowns", kTeardownsPerCpuWindow);
    json_object seed = seed_object();
    seed.set("inline_cpu_ms", 372.0)
        .set("reaper_cpu_ms", 440.0)
        .set("ratio", 1.18)
        .set("measure", "5 consecutive 4GB teardowns: exit-path CPU inline vs mm_reaper kthread CPU (schedstat)");
    if (const auto why = over_memory_rule(bytes)) {
      add_row(row.set("skipped", *why).set("seed", seed));
      table_.push_back(strprintf("                  %7.3g  skipped: %s", gib, why->c_str()));
      return;
    }
    kernels k;
    std::vector<double> inline_ms, reaper_ms, on_exit_ms;
    std::optional<std::string> failed;
    for (int rep = 0; rep < opts_.reps && !failed; ++rep) {
      try {
        double inline_total = 0;
        for (int t = 0; t < kTeardownsPerCpuWindow; ++t) {
          progress("cpu_conservation inline rep %d/%d teardown %d/%d: ", rep + 1, opts_.reps, t + 1,
                   kTeardownsPerCpuWindow);
          auto task = populate(k.off, bytes);
          const double before = thread_cpu_ms();
          (void)task->exit();
          const double spent = thread_cpu_ms() - before;
          inline_total += spent;
          progress(", exit-path CPU %.2f ms\n", spent);
        }
        k.on.flush();
        const std::uint64_t worker_before = k.on.stats().reaper.worker_cpu_ns;
        double exit_path_total = 0;
        int queued = 0;
        for (int t = 0; t < kTeardownsPerCpuWindow; ++t) {
          progress("cpu_conservation reaper rep %d/%d teardown %d/%d: ", rep + 1, opts_.reps, t + 1,
                   kTeardownsPerCpuWindow);
          auto task = populate(k.on, bytes);
          const double before = thread_cpu_ms();
          const auto decided = task->exit();
          exit_path_total += thread_cpu_ms() - before;
          queued += decided == teardown::decision::queued ? 1 : 0;
          k.on.flush();
          progress("\n");
        }
        const double reaper_total =
            static_cast<double>(k.on.stats().reaper.worker_cpu_ns - worker_before) / 1e6;
        if (queued != kTeardownsPerCpuWindow) {
          throw std::runtime_error(strprintf("only %d of %d exits were queued", queued, kTeardownsPerCpuWindow));
        }
        inline_ms.push_back(inline_total);
        reaper_ms.push_back(reaper_total);
        on_exit_ms.push_back(exit_path_total);
        progress("cpu_conservation rep %d/%d: inline %.1f ms, reaper %.1f ms, ratio %.2f\n", rep + 1, opts_.reps,
                 inline_total, reaper_total, reaper_total / inline_total);
      } catch (const std::exception& e) {
        failed = std::string("failed: ") + e.what();
        progress("%s\n", failed->c_str());
      }
    }
    if (failed) row.set("skipped", *failed);
    if (!inline_ms.empty()) {
      const double inline_median = summarize(inline_ms).median;
      const double reaper_median = summarize(reaper_ms).median;
      row.set("inline_cpu_ms", inline_median)
          .set("reaper_cpu_ms", reaper_median)
          .set("ratio", reaper_median / inline_median)
          .set("on_exit_path_cpu_ms", summarize(on_exit_ms).median)
          .set("reps", static_cast<int>(inline_ms.size()));
      table_.push_back(strprintf("                  %7.3g  %13.1f  %13.1f  %5.2f   372 -> 440 ms, 1.18 (5 x 4GB)", gib,
                                 inline_median, reaper_median, reaper_median / inline_median));
    }
    add_row(std::move(row.set("seed", seed)));
  }

  // ---- shadow_peer ----

  // Kills and reaps, on every path out, each child it still holds.
  class child_guard {
   public:
    child_guard() = default;
    child_guard(const child_guard&) = delete;
    child_guard& operator=(const child_guard&) = delete;
    ~child_guard() {
      for (const pid_t pid : pids_) {
        kill(pid, SIGKILL);
        reap(pid);
      }
    }
    void hold(pid_t pid) { pids_.push_back(pid); }
    // Waits for the child to end; it is no longer held.
    void release(pid_t pid) {
      reap(pid);
      pids_.erase(std::remove(pids_.begin(), pids_.end(), pid), pids_.end());
    }

   private:
    static void reap(pid_t pid) {
      int status = 0;
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
    }
    std::vector<pid_t> pids_;
  };

  struct shadow_sample {
    double kill_to_waitpid_ms = NAN;
    double shadow_teardown_ms = NAN;
    bool memory_held = false;
  };

  shadow_sample shadow_run(double bytes, bool with_shadow);

  void shadow_peer() {
    heading(
        "shadow_peer       GiB  shadow  kill->waitpid ms med [min, max]    shadow teardown ms med [min, max]  memory "
        "held");
    for (const double gib : opts_.sizes_gib) {
      const double bytes = gib * kGiB;
      auto row_for = [&](bool shadow) {
        json_object row;
        row.set("kind", "shadow_peer").set("size_gib", gib).set("shadow", shadow);
        return row;
      };
      if (const auto why = over_memory_rule(bytes)) {
        for (const bool shadow : {false, true}) add_row(row_for(shadow).set("skipped", *why));
        table_.push_back(strprintf("                  %3g  skipped: %s", gib, why->c_str()));
        continue;
      }
      std::vector<double> plain_ms, shadowed_ms, shadow_teardown_ms;
      bool always_held = true;
      std::optional<std::string> failed;
      for (int rep = 0; rep < opts_.reps && !failed; ++rep) {
        for (const bool shadow : {false, true}) {
          progress("shadow_peer %.3g GiB shadow=%s rep %d/%d: ", gib, shadow ? "yes" : "no", rep + 1, opts_.reps);
          try {
            const shadow_sample s = shadow_run(bytes, shadow);
            if (shadow) {
              shadowed_ms.push_back(s.kill_to_waitpid_ms);
              shadow_teardown_ms.push_back(s.shadow_teardown_ms);
              always_held = always_held && s.memory_held;
              progress(", kill -> waitpid %.3f ms, shadow teardown %.1f ms, memory %s\n", s.kill_to_waitpid_ms,
                       s.shadow_teardown_ms, s.memory_held ? "held by the shadow" : "NOT held");
            } else {
              plain_ms.push_back(s.kill_to_waitpid_ms);
              progress(", kill -> waitpid %.1f ms\n", s.kill_to_waitpid_ms);
            }
          } catch (const std::exception& e) {
            failed = std::string("failed: ") + e.what();
            progress("%s\n", failed->c_str());
            break;
          }
        }
      }
      for (const bool shadow : {false, true}) {
        json_object row = row_for(shadow);
        if (failed) row.set("skipped", *failed);
        const std::vector<double>& samples = shadow ? shadowed_ms : plain_ms;
        if (!samples.empty()) {
          const summary k = summarize(samples);
          row.set("kill_to_waitpid_ms", k);
          std::string tail;
          if (shadow) {
            const summary t = summarize(shadow_teardown_ms);
            row.set("shadow_teardown_ms", t).set("memory_held_by_shadow", always_held);
            tail = strprintf("%9.1f [%9.1f, %9.1f]        %s", t.median, t.min, t.max, always_held ? "yes" : "NO");
          }
          table_.push_back(strprintf("                  %3g  %-6s  %9.3f [%9.3f, %9.3f]       %s", gib,
                                     shadow ? "yes" : "no", k.median, k.min, k.max, tail.c_str()));
        }
        add_row(std::move(row));
      }
    }
  }

  // ---- exit_breakdown and placement: one teardown, every counter ----

  // One kernel of a breakdown row: its label, the kernel, whether its exits are deferred, the
  // CPU the exiting thread is pinned to (-1: none), its reaper thread's name and tid.
  struct labelled_kernel {
    std::string label;
    std::unique_ptr<on_off_kernel> kernel;
    bool deferred;
    int exit_cpu = -1;
    std::string worker_name{};
    pid_t worker = -1;
    bool unhurried = false;  // the row waits for the teardown before its flush (which would hurry it)
  };

  static labelled_kernel make_kernel(std::string label, bool async, teardown::reaper_options reaper,
                                     int exit_cpu = -1) {
    teardown::model::mm_system_options opts = kernel_options(async);
    std::string name = reaper.name;
    opts.reaper = std::move(reaper);
    labelled_kernel k{std::move(label), std::make_unique<on_off_kernel>(std::move(opts)), async, exit_cpu, name};
    k.worker = thread_named(k.worker_name);
    return k;
  }

  struct teardown_sample {
    double exit_us = NAN;            // the exiting thread's task->exit()
    double bookkeeping_us = NAN;     // exit() start -> the enqueue reached (queue trace hook)
    double enqueue_us = NAN;         // the enqueue reached -> exit() returned (the wake included)
    double start_delay_us = NAN;     // the item's wait before the reaper began its teardown
    double worker_idle_ms = NAN;     // how long the reaper had had nothing to do
    double torn_down_ms = NAN;       // exit() start -> flush() returned: the munmap is done
    double memory_back_ms = NAN;
    double teardown_cpu_ms = NAN;    // inline: the exiting thread's CPU; deferred: the worker's
    double cal = 0, res = 0;         // function-call and rescheduling interrupts, all CPUs,
                                     // exit() start -> flush() returned
    double worker_switches = 0;      // the worker's context switches in that window
    double spinners_lost_ms = NAN;   // busy_machine: the CPU the spinners would have had in that
                                     // window at their rate over the 200 ms before, less what
                                     // they got
    bool timed_out = false;
    std::optional<teardown::decision> decided;
  };

  teardown_sample measured_teardown(labelled_kernel& k, double bytes) {
    on_off_kernel& kernel = *k.kernel;
    const pinned_here pin(k.exit_cpu);
    const auto idle_since = clock_type::now();  // the previous teardown was flushed before this
    const std::uint64_t before = mem_.free_bytes();
    auto task = populate(kernel, bytes);
    teardown_sample s;
    const std::uint64_t worker_cpu_before = kernel.stats().reaper.worker_cpu_ns;
    const std::uint64_t reaped_before = kernel.stats().reaper.reaped;
    const std::uint64_t switches_before = context_switches(k.worker);
    const std::uint64_t cal_before = interrupts_named("CAL"), res_before = interrupts_named("RES");
    g_queue_reached_ns.store(0);
    g_reap_wait_ns.store(0);
    // The spinners' own rate just before (other load on the machine takes its share of them
    // too): what they lose to the teardown is measured against it.
    const double spinners_rate = busy_ != nullptr ? busy_->cpu_per_ms(std::chrono::milliseconds(200)) : 0;
    const double spinners_before = busy_ != nullptr ? busy_->cpu_ms() : 0;
    const double cpu_before = thread_cpu_ms();
    const auto start = clock_type::now();
    const std::uint64_t start_ns = teardown::detail::monotonic_ns();
    s.decided = task->exit();
    const std::uint64_t end_ns = teardown::detail::monotonic_ns();
    const double exit_cpu = thread_cpu_ms() - cpu_before;
    // A lazy worker's own look, not the flush's wake, starts an unhurried kernel's teardown.
    if (k.unhurried) wait_for_reaped(kernel, reaped_before + 1);
    kernel.flush();
    s.torn_down_ms = ms_between(start, clock_type::now());
    if (busy_ != nullptr) {
      s.spinners_lost_ms = spinners_rate * s.torn_down_ms - (busy_->cpu_ms() - spinners_before);
    }
    // The counters cover exit() start -> flush() returned: the teardown, not the wait below.
    s.cal = static_cast<double>(interrupts_named("CAL") - cal_before);
    s.res = static_cast<double>(interrupts_named("RES") - res_before);
    s.worker_switches = static_cast<double>(context_switches(k.worker) - switches_before);
    const std::uint64_t worker_cpu_after = kernel.stats().reaper.worker_cpu_ns;
    const auto back = wait_memory_back(before, bytes);
    s.exit_us = static_cast<double>(end_ns - start_ns) / 1e3;
    s.worker_idle_ms = ms_between(idle_since, start);
    s.timed_out = !back;
    s.memory_back_ms = ms_between(start, back.value_or(clock_type::now()));
    const std::uint64_t reached = g_queue_reached_ns.load();
    if (k.deferred && reached >= start_ns && reached <= end_ns) {
      s.bookkeeping_us = static_cast<double>(reached - start_ns) / 1e3;
      s.enqueue_us = static_cast<double>(end_ns - reached) / 1e3;
      s.start_delay_us = static_cast<double>(g_reap_wait_ns.load()) / 1e3;
    }
    s.teardown_cpu_ms =
        k.deferred ? static_cast<double>(worker_cpu_after - worker_cpu_before) / 1e6 : exit_cpu;
    return s;
  }

  // Until the reaper has torn down `reaped` items in all (at most a minute: a lost teardown
  // shows as a start delay of that size, and the flush after it still completes the row).
  static void wait_for_reaped(on_off_kernel& kernel, std::uint64_t reaped) {
    const auto give_up = clock_type::now() + std::chrono::minutes(1);
    while (kernel.stats().reaper.reaped < reaped && clock_type::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // Runs every kernel in turn, opts_.reps times, and adds one row per kernel; ratios against
  // the first (the inline kernel).
  void teardown_rows(const char* kind, double gib, std::vector<labelled_kernel>& kernels) {
    const double bytes = gib * kGiB;
    if (const auto why = over_memory_rule(bytes)) {
      for (const labelled_kernel& k : kernels) {
        add_row(json_object().set("kind", kind).set("size_gib", gib).set("kernel", k.label).set("skipped", *why));
      }
      table_.push_back(strprintf("                  %6.3g  skipped: %s", gib, why->c_str()));
      return;
    }
    teardown::trace::add_hook<teardown::trace::queue_event>(&on_queue);
    teardown::trace::add_hook<teardown::trace::reap_event>(&on_reap);
    std::vector<std::vector<teardown_sample>> samples(kernels.size());
    std::optional<std::string> failed;
    for (int rep = 0; rep < opts_.reps && !failed; ++rep) {
      for (std::size_t i = 0; i < kernels.size(); ++i) {
        progress("%s %.3g GiB %s rep %d/%d: ", kind, gib, kernels[i].label.c_str(), rep + 1, opts_.reps);
        try {
          const teardown_sample s = measured_teardown(kernels[i], bytes);
          const bool queued = s.decided == teardown::decision::queued;
          if (queued != kernels[i].deferred) throw std::runtime_error("an exit was not decided as the kernel says");
          samples[i].push_back(s);
          progress(", exit %.1f us, memory back %.1f ms, CPU %.1f ms, CAL %.0f, RES %.0f\n", s.exit_us,
                   s.memory_back_ms, s.teardown_cpu_ms, s.cal, s.res);
        } catch (const std::exception& e) {
          failed = std::string("failed: ") + e.what();
          progress("%s\n", failed->c_str());
          break;
        }
      }
    }
    (void)teardown::trace::remove_hook<teardown::trace::queue_event>(&on_queue);
    (void)teardown::trace::remove_hook<teardown::trace::reap_event>(&on_reap);
    const auto column = [&](std::size_t i, double teardown_sample::*field) {
      std::vector<double> values;
      for (const teardown_sample& s : samples[i]) {
        if (!std::isnan(s.*field)) values.push_back(s.*field);
      }
      return values;
    };
    const auto median_of = [&](std::size_t i, double teardown_sample::*field) {
      const std::vector<double> values = column(i, field);
      return values.empty() ? NAN : summarize(values).median;
    };
    const double inline_exit = median_of(0, &teardown_sample::exit_us);
    const double inline_back = median_of(0, &teardown_sample::memory_back_ms);
    const double inline_torn = median_of(0, &teardown_sample::torn_down_ms);
    const double inline_cpu = median_of(0, &teardown_sample::teardown_cpu_ms);
    for (std::size_t i = 0; i < kernels.size(); ++i) {
      json_object row;
      row.set("kind", kind).set("size_gib", gib).set("kernel", kernels[i].label);
      if (failed) row.set("skipped", *failed);
      if (!samples[i].empty()) {
        const auto put = [&](const char* key, double teardown_sample::*field) {
          const std::vector<double> values = column(i, field);
          if (!values.empty()) row.set(key, summarize(values));
        };
        put("exit_path_us", &teardown_sample::exit_us);
        put("bookkeeping_us", &teardown_sample::bookkeeping_us);
        put("enqueue_and_wake_us", &teardown_sample::enqueue_us);
        put("teardown_start_delay_us", &teardown_sample::start_delay_us);
        put("worker_idle_ms", &teardown_sample::worker_idle_ms);
        put("torn_down_ms", &teardown_sample::torn_down_ms);
        put("memory_back_ms", &teardown_sample::memory_back_ms);
        put("teardown_cpu_ms", &teardown_sample::teardown_cpu_ms);
        put("cal_interrupts", &teardown_sample::cal);
        put("res_interrupts", &teardown_sample::res);
        put("worker_context_switches", &teardown_sample::worker_switches);
        put("spinners_lost_cpu_ms", &teardown_sample::spinners_lost_ms);
        const double exit = median_of(i, &teardown_sample::exit_us);
        const double back = median_of(i, &teardown_sample::memory_back_ms);
        const double torn = median_of(i, &teardown_sample::torn_down_ms);
        const double cpu = median_of(i, &teardown_sample::teardown_cpu_ms);
        row.set("exit_fraction_of_inline", exit / inline_exit)
            .set("torn_down_vs_inline", torn / inline_torn)
            .set("memory_back_vs_inline", back / inline_back)
            .set("cpu_vs_inline", cpu / inline_cpu)
            .set("reps", static_cast<int>(samples[i].size()));
        table_.push_back(strprintf(
            "                  %6.3g  %-18s %9.2f  1/%-7.0f %7.2f %8.2f %9.1f  %7.1f %6.3f  %7.1f %6.3f  %7.1f %6.3f  "
            "%5.0f %5.0f %5.0f",
            gib, kernels[i].label.c_str(), exit, inline_exit / exit, median_of(i, &teardown_sample::bookkeeping_us),
            median_of(i, &teardown_sample::enqueue_us), median_of(i, &teardown_sample::start_delay_us), torn,
            torn / inline_torn, back, back / inline_back, cpu, cpu / inline_cpu, median_of(i, &teardown_sample::cal),
            median_of(i, &teardown_sample::res), median_of(i, &teardown_sample::worker_switches)));
        const double lost = median_of(i, &teardown_sample::spinners_lost_ms);
        if (!std::isnan(lost)) {
          row.set("lost_cpu_vs_teardown_cpu", lost / cpu);
          table_.push_back(strprintf(
              "                  %6.3g  %-18s the spinners lost %.1f ms of CPU meanwhile: %.2f x the teardown's", gib,
              kernels[i].label.c_str(), lost, lost / cpu));
        }
      }
      add_row(std::move(row));
    }
  }

  static constexpr const char* kTeardownHeading =
      "%-17s GiB  kernel              exit us  of inline  bookkp  enq+wake  start us  torn ms  /inl    back ms /inl    "
      "CPU ms  /inl    CAL   RES   w.csw";

  // The deferred exit split into the model's bookkeeping (task::exit, mmput_exit, put's steps up
  // to the enqueue), the enqueue with its wake, and the teardown's start delay, for the default
  // wake and the polling reaper, beside the inline exit.
  void exit_breakdown() {
    heading(strprintf(kTeardownHeading, "exit_breakdown").c_str());
    const auto poll = std::chrono::nanoseconds(static_cast<std::int64_t>(opts_.poll_interval_us * 1e3));
    {
      const double gib = opts_.sizes_gib.front();  // the goal's size; the others add only time
      std::vector<labelled_kernel> kernels;
      kernels.push_back(make_kernel("inline", false, {.name = "mmr_inline"}));
      kernels.push_back(make_kernel("deferred_wake", true, {.name = "mmr_wake"}));
      kernels.push_back(make_kernel(strprintf("deferred_poll_%gus", opts_.poll_interval_us), true,
                                    {.name = "mmr_poll", .poll_interval = poll}));
      kernels.push_back(lazy_kernel());
      teardown_rows("exit_breakdown", gib, kernels);
      warm_breakdown(gib, kernels);
    }
  }

  // The lazy policy: polls that back off from --poll-interval-us to --poll-max-us while idle.
  // Unhurried: the row waits for the worker's own look before its flush.
  labelled_kernel lazy_kernel() const {
    labelled_kernel k = make_kernel(strprintf("deferred_lazy_%g-%gus", opts_.poll_interval_us, opts_.poll_max_us), true,
                                    {.name = "mmr_lazy", .poll_interval = us(opts_.poll_interval_us),
                                     .poll_interval_max = us(opts_.poll_max_us)});
    k.unhurried = true;
    return k;
  }

  static std::chrono::nanoseconds us(double microseconds) {
    return std::chrono::nanoseconds(static_cast<std::int64_t>(microseconds * 1e3));
  }

  // The same split with warm caches: simulated mms of the same size (no memory to populate, so
  // nothing evicts the lines the exit path touches), exited back to back with a flush between,
  // so the reaper had been idle only microseconds. Beside the cold exits above it separates the
  // cost of the instructions from the cost of the cache and TLB misses after a populate.
  void warm_breakdown(double gib, std::vector<labelled_kernel>& kernels) {
    const int count = opts_.quick ? 50 : 400;
    teardown::trace::add_hook<teardown::trace::queue_event>(&on_queue);
    for (labelled_kernel& k : kernels) {
      if (!k.deferred) continue;
      std::vector<double> exit_us, bookkeeping_us, enqueue_us;
      for (int n = 0; n < count; ++n) {
        auto task = k.kernel->spawn(pages_for(gib * kGiB), backing::simulated);
        g_queue_reached_ns.store(0);
        const std::uint64_t start_ns = teardown::detail::monotonic_ns();
        const auto decided = task->exit();
        const std::uint64_t end_ns = teardown::detail::monotonic_ns();
        const std::uint64_t reached = g_queue_reached_ns.load();
        k.kernel->flush();
        if (decided != teardown::decision::queued || reached < start_ns || reached > end_ns) continue;
        exit_us.push_back(static_cast<double>(end_ns - start_ns) / 1e3);
        bookkeeping_us.push_back(static_cast<double>(reached - start_ns) / 1e3);
        enqueue_us.push_back(static_cast<double>(end_ns - reached) / 1e3);
      }
      if (exit_us.empty()) continue;
      const summary e = summarize(exit_us), b = summarize(bookkeeping_us), q = summarize(enqueue_us);
      add_row(json_object()
                  .set("kind", "exit_breakdown_warm")
                  .set("size_gib", gib)
                  .set("kernel", k.label)
                  .set("exit_path_us", e)
                  .set("bookkeeping_us", b)
                  .set("enqueue_and_wake_us", q)
                  .set("samples", static_cast<int>(exit_us.size())));
      table_.push_back(strprintf("                  %6.3g  %-18s %9.2f  (warm: simulated mm, back to back) %7.2f %8.2f",
                                 gib, k.label.c_str(), e.median, b.median, q.median));
    }
    (void)teardown::trace::remove_hook<teardown::trace::queue_event>(&on_queue);
  }

  // Where the reaper's extra CPU and the late memory go. The same teardown inline (the exiting
  // thread pinned to CPU 0) and deferred with the reaper placed and prioritised five ways, the
  // last also polling (no wake on the exit path); CAL counts the cross-CPU function calls (TLB
  // shootdowns among them), RES the wake-ups.
  void placement() {
    heading(strprintf(kTeardownHeading, "placement").c_str());
    const double gib = opts_.sizes_gib.front();
    const int cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
    const int other = cpus > 1 ? 1 : 0;
    std::vector<labelled_kernel> kernels;
    kernels.push_back(make_kernel("inline_cpu0", false, {.name = "mmr_inline"}, 0));
    kernels.push_back(make_kernel("reaper_default", true, {.name = "mmr_default"}, 0));
    kernels.push_back(make_kernel("reaper_nice0", true, {.name = "mmr_nice0", .nice = 0}, 0));
    kernels.push_back(make_kernel("reaper_same_cpu", true, {.name = "mmr_same", .cpus = {0}}, 0));
    kernels.push_back(make_kernel("reaper_other_cpu", true, {.name = "mmr_other", .cpus = {other}}, 0));
    kernels.push_back(make_kernel("reaper_same_nice0", true, {.name = "mmr_same0", .nice = 0, .cpus = {0}}, 0));
    const auto poll = std::chrono::nanoseconds(static_cast<std::int64_t>(opts_.poll_interval_us * 1e3));
    kernels.push_back(
        make_kernel("poll_same_cpu", true, {.name = "mmr_poll_same", .cpus = {0}, .poll_interval = poll}, 0));
    teardown_rows("placement", gib, kernels);
  }

  // The same teardown on a busy machine: opts_.busy processes spin at nice 0 (one per CPU by
  // default) while it runs inline, deferred to a nice-19 reaper that is never boosted, and
  // deferred with the default options (the flush that waits raises the worker: reaper.hpp,
  // "Boost"). Beside memory back and the teardown's CPU, what the spinners lost meanwhile.
  void busy_machine() {
    heading(strprintf(kTeardownHeading, "busy_machine").c_str());
    const double gib = opts_.sizes_gib.front();
    std::vector<labelled_kernel> kernels;
    kernels.push_back(make_kernel("inline", false, {.name = "mmr_busy_inl"}));
    kernels.push_back(
        make_kernel("deferred_no_boost", true, {.name = "mmr_busy_nb", .boost_after = std::chrono::nanoseconds(0)}));
    kernels.push_back(make_kernel("deferred_boost", true, {.name = "mmr_busy_boost"}));
    {
      const teardown_bench::cpu_hogs hogs(opts_.busy);
      busy_ = &hogs;
      teardown_rows("busy_machine", gib, kernels);
      busy_ = nullptr;
    }
    for (std::size_t i = 1; i < kernels.size(); ++i) {
      table_.push_back(
          strprintf("                  %6.3g  %-18s %d spinners at nice 0; the worker was boosted %llu times", gib,
                    kernels[i].label.c_str(), opts_.busy,
                    static_cast<unsigned long long>(kernels[i].kernel->stats().reaper.boosts)));
    }
  }

  // ---- wake_vs_idle and poll_price: a bare reaper, a trivial item ----

  struct probe_item {
    teardown::llist_node hook;
  };
  static inline std::atomic<std::uint64_t> probe_started_ns{0};
  struct probe_fn {
    void operator()(probe_item&) const noexcept {
      probe_started_ns.store(teardown::detail::monotonic_ns(),
                             std::memory_order_release);  // pairs with the waiter's acquire
    }
  };
  using probe_reaper = teardown::reaper<probe_item, &probe_item::hook, probe_fn>;

  struct enqueue_samples {
    std::vector<double> enqueue_ns, start_us;
  };

  // `count` enqueues, each after the reaper has been idle `idle` (the producer sleeps too).
  // `spread`: the n-th enqueue comes after idle + spread * n / count, so that they meet a
  // lazy worker's growing looks at different phases.
  static enqueue_samples sample_enqueues(probe_reaper& reaper, std::chrono::microseconds idle, int count,
                                         std::chrono::microseconds spread = std::chrono::microseconds(0)) {
    enqueue_samples out;
    probe_item item;
    for (int n = 0; n < count; ++n) {
      reaper.flush();
      std::this_thread::sleep_for(idle + spread * n / count);
      probe_started_ns.store(0, std::memory_order_relaxed);
      const std::uint64_t t0 = teardown::detail::monotonic_ns();
      reaper.enqueue(item);
      const std::uint64_t t1 = teardown::detail::monotonic_ns();
      std::uint64_t started = 0;
      while ((started = probe_started_ns.load(std::memory_order_acquire)) == 0) std::this_thread::yield();
      out.enqueue_ns.push_back(static_cast<double>(t1 - t0));
      out.start_us.push_back(static_cast<double>(started - t0) / 1e3);
    }
    return out;
  }

  // The wake's cost on the producer as a function of how long the worker slept, against the
  // polling reaper's enqueue (no wake) after the same idle time.
  void wake_vs_idle() {
    heading(
        "wake_vs_idle      idle ms  policy         enqueue ns p50 [min, max]       teardown start us p50 [max]   "
        "wakeups/enq");
    const auto poll = std::chrono::nanoseconds(static_cast<std::int64_t>(opts_.poll_interval_us * 1e3));
    struct level {
      std::chrono::microseconds idle;
      int count;
    };
    const level levels[] = {{std::chrono::microseconds(20), 200}, {std::chrono::microseconds(2000), 100},
                            {std::chrono::microseconds(20000), 40}, {std::chrono::microseconds(200000), 12}};
    probe_reaper wake(probe_fn{}, {.name = "probe_wake", .spin_polls = 0});
    probe_reaper polling(probe_fn{}, {.name = "probe_poll", .spin_polls = 0, .poll_interval = poll});
    for (const level& l : levels) {
      const int count = opts_.quick ? std::max(3, l.count / 10) : l.count;
      for (int policy = 0; policy < 2; ++policy) {
        probe_reaper& reaper = policy == 0 ? wake : polling;
        const std::string name = policy == 0 ? "wake" : strprintf("poll_%gus", opts_.poll_interval_us);
        progress("wake_vs_idle %.3g ms %s x %d ... ", l.idle.count() / 1e3, name.c_str(), count);
        const std::uint64_t wakeups_before = reaper.stats().wakeups;
        const enqueue_samples s = sample_enqueues(reaper, l.idle, count);
        const double wakeups = static_cast<double>(reaper.stats().wakeups - wakeups_before) / count;
        const summary e = summarize(s.enqueue_ns);
        const summary st = summarize(s.start_us);
        progress("p50 %.0f ns\n", e.median);
        add_row(json_object()
                    .set("kind", "wake_vs_idle")
                    .set("idle_ms", l.idle.count() / 1e3)
                    .set("policy", name)
                    .set("enqueue_ns", e)
                    .set("teardown_start_us", st)
                    .set("wakeups_per_enqueue", wakeups)
                    .set("samples", count));
        table_.push_back(
            strprintf("                  %7.3g  %-13s  %9.0f [%9.0f, %9.0f]      %9.1f [%9.1f]            %.2f",
                      l.idle.count() / 1e3, name.c_str(), e.median, e.min, e.max, st.median, st.max, wakeups));
      }
    }
  }

  // What polling costs: the idle worker's CPU and timed wake-ups per second, and how much later a
  // teardown starts, for a few intervals; the wake policy beside them.
  void poll_price() {
    heading("poll_price        interval us  idle CPU us/s  polls/s   teardown start us p50 [max]");
    std::vector<double> intervals_us = {0, 100, opts_.poll_interval_us, 10000};
    std::sort(intervals_us.begin(), intervals_us.end());
    intervals_us.erase(std::unique(intervals_us.begin(), intervals_us.end()), intervals_us.end());
    std::vector<std::pair<double, double>> policies;  // {poll_interval, poll_interval_max} in us
    for (const double us : intervals_us) policies.emplace_back(us, 0);
    policies.emplace_back(opts_.poll_interval_us, opts_.poll_max_us);  // lazy
    const auto window = std::chrono::milliseconds(opts_.quick ? 200 : 1000);
    for (const auto& [us, max_us] : policies) {
      const bool lazy = max_us > us;
      probe_reaper reaper(probe_fn{}, {.name = "probe_price", .spin_polls = 256, .poll_interval = this->us(us),
                                       .poll_interval_max = this->us(max_us)});
      reaper.flush();
      // A lazy worker is measured once its looks have backed off, as after any idle spell.
      std::this_thread::sleep_for(lazy ? std::chrono::milliseconds(static_cast<std::int64_t>(2 * max_us / 1e3))
                                       : std::chrono::milliseconds(20));
      const teardown::reaper_stats before = reaper.stats();
      const auto start = clock_type::now();
      std::this_thread::sleep_for(window);
      const teardown::reaper_stats after = reaper.stats();
      const double seconds = ms_between(start, clock_type::now()) / 1e3;
      const double cpu_us_per_s = static_cast<double>(after.worker_cpu_ns - before.worker_cpu_ns) / 1e3 / seconds;
      const double polls_per_s = static_cast<double>(after.polls - before.polls) / seconds;
      // Teardown start: enqueues at arbitrary phases of the interval (a lazy one's after idle
      // spells from 2 to 4 x poll_interval_max, which its looks have backed off through).
      const auto lazy_idle = std::chrono::microseconds(static_cast<std::int64_t>(2 * max_us));
      const enqueue_samples s = lazy ? sample_enqueues(reaper, lazy_idle, opts_.quick ? 4 : 12, lazy_idle)
                                     : sample_enqueues(reaper, std::chrono::microseconds(3000), opts_.quick ? 10 : 50);
      const summary st = summarize(s.start_us);
      const std::string name = us == 0 ? "wake" : lazy ? strprintf("%g-%g", us, max_us) : strprintf("%g", us);
      progress("poll_price %s: %.1f us CPU/s, %.0f polls/s, start p50 %.1f us\n", name.c_str(), cpu_us_per_s,
               polls_per_s, st.median);
      add_row(json_object()
                  .set("kind", "poll_price")
                  .set("poll_interval_us", us)
                  .set("poll_interval_max_us", max_us)
                  .set("idle_cpu_us_per_s", cpu_us_per_s)
                  .set("polls_per_s", polls_per_s)
                  .set("teardown_start_us", st)
                  .set("enqueue_ns", summarize(s.enqueue_ns)));
      table_.push_back(strprintf("                  %11s  %13.1f  %7.0f   %9.1f [%9.1f]", name.c_str(), cpu_us_per_s,
                                 polls_per_s, st.median, st.max));
    }
  }

  options opts_;
  const teardown_bench::cpu_hogs* busy_ = nullptr;  // busy_machine's spinners while it runs
  memory_gauge mem_;
  std::vector<json_object> rows_;
  std::vector<std::string> table_;
};

// ---- the shadow_peer processes ----------------------------------------------------------------
//
// After fork() in a multi-threaded program the child may only make async-signal-safe calls:
// everything below runs on plain system calls, and the shadow runs on a static stack in the
// child's (shared) memory.

struct child_report {
  int error = 0;     // errno of the step that failed, 0 if none
  int step = 0;      // 1 mmap, 2 clone
  pid_t shadow = 0;  // the shadow's pid (our child too, by CLONE_PARENT)
};

struct shadow_arguments {
  pid_t grandparent = 0;  // this benchmark: the shadow's parent, by CLONE_PARENT
  int report_fd = -1;
};

alignas(64) unsigned char shadow_stack[64 * 1024];
shadow_arguments shadow_args;  // in the child's memory, which the shadow shares

[[noreturn]] void block_for_ever() {
  for (;;) syscall(SYS_ppoll, nullptr, 0, nullptr, nullptr, 0);  // no descriptors, no timeout
}

int shadow_main(void* arg) {
  const auto* args = static_cast<const shadow_arguments*>(arg);
  // Dies with the benchmark; the check closes the race with a benchmark that died first.
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != args->grandparent) _exit(1);
  close(args->report_fd);
  block_for_ever();
}

[[noreturn]] void child_main(int report_fd, pid_t parent, std::size_t bytes, bool with_shadow) {
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(1);
  child_report report;
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    report.error = errno;
    report.step = 1;
  } else {
    const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    auto* bytes_at = static_cast<volatile unsigned char*>(base);
    for (std::size_t at = 0; at < bytes; at += page) bytes_at[at] = 1;  // fault it in
    if (with_shadow) {
      shadow_args = {parent, report_fd};
      // A process of its own (no CLONE_THREAD), so the child's exit does not wait for it.
      const int pid =
          clone(shadow_main, shadow_stack + sizeof shadow_stack, CLONE_VM | CLONE_PARENT | SIGCHLD, &shadow_args);
      if (pid < 0) {
        report.error = errno;
        report.step = 2;
      } else {
        report.shadow = pid;
      }
    }
  }
  if (write(report_fd, &report, sizeof report) != static_cast<ssize_t>(sizeof report)) _exit(3);
  if (report.error != 0) _exit(2);
  block_for_ever();
}

matrix::shadow_sample matrix::shadow_run(double bytes, bool with_shadow) {
  const std::uint64_t before = mem_.free_bytes();
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe2");
  child_guard children;
  const pid_t parent = getpid();
  progress("populating %.3g GiB in a child ... ", bytes / kGiB);
  const auto populate_start = clock_type::now();
  const pid_t child = fork();
  if (child == 0) {
    close(pipe_fds[0]);
    child_main(pipe_fds[1], parent, static_cast<std::size_t>(bytes), with_shadow);
  }
  const int fork_error = errno;
  close(pipe_fds[1]);
  if (child < 0) {
    close(pipe_fds[0]);
    throw std::system_error(fork_error, std::generic_category(), "fork");
  }
  children.hold(child);

  // The child's report, within a bound that allows a slow populate.
  const int timeout_ms = 30'000 + static_cast<int>(10'000 * bytes / kGiB);
  const auto report = teardown_bench::read_child_report<child_report>(pipe_fds[0], timeout_ms, "the child");
  if (report.shadow > 0) children.hold(report.shadow);
  if (report.error != 0) {
    throw std::system_error(report.error, std::generic_category(),
                            report.step == 1 ? "child: mmap" : "child: clone(CLONE_VM)");
  }
  progress("%.1f s", ms_between(populate_start, clock_type::now()) / 1e3);

  shadow_sample sample;
  const auto start = clock_type::now();
  kill(child, SIGKILL);
  children.release(child);
  sample.kill_to_waitpid_ms = ms_between(start, clock_type::now());
  if (with_shadow) {
    sample.memory_held = mem_.free_bytes() + static_cast<std::uint64_t>(bytes / 2) < before;
    const auto shadow_start = clock_type::now();
    kill(report.shadow, SIGKILL);
    children.release(report.shadow);
    sample.shadow_teardown_ms = ms_between(shadow_start, clock_type::now());
  }
  (void)wait_memory_back(before, bytes);  // settle before the next repetition
  return sample;
}

void print_table(const std::vector<std::string>& table) {
  std::fprintf(stderr, "\nexit_matrix (ours; the seed's figures are bare-metal 32-CPU kernel numbers)\n");
  for (const std::string& line : table) std::fprintf(stderr, "%s\n", line.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const options opts = parse_options(argc, argv);
  try {
    matrix bench(opts);
    const std::uint64_t available_at_start = memory_gauge().available_bytes();
    const json_object machine = bench.machine(available_at_start);
    const json_object config = bench.config();
    const auto start = clock_type::now();
    bench.run();

    const std::string json = teardown_bench::rows_document("exit_matrix", machine, config, bench.rows());

    print_table(bench.table());
    std::fprintf(stderr, "total %.1f s\n", ms_between(start, clock_type::now()) / 1e3);
    if (!teardown_bench::write_document("exit_matrix", opts.out, json)) return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "exit_matrix: %s\n", e.what());
    return 1;
  }
  return 0;
}
