// supervisor: restart workers that hold big heaps, and see what the old one's exit costs.
//
// A supervisor (systemd, a job runner) keeps W workers alive. To restart one it stops the old
// one and spawns a replacement at once. Until that one runs the service is a worker short: the
// respawn latency is the old worker's exit (the teardown of its address space) plus the new
// one's spawn (mapping and touching its heap). Deferring the teardown shortens the first part;
// the price is memory: the old heap may still be being freed as the new one fills.
//
// Two halves, each a loop of W workers and R restarts:
//   1. The model kernel (teardown/model/mm.hpp) with real memory: a plain exit, with
//      vm.async_mm_teardown off and then on.
//   2. Real processes (teardown/process_reaper.hpp, teardown/process.hpp): each worker a fork()ed
//      child held by a pidfd, killed with SIGKILL and waited for, with four techniques:
//        kill              pidfd_send_signal, then wait: the exit pays for the teardown
//        kill+mrelease     a process_reaper's kill(): its worker calls process_mrelease, which
//                          frees the heap beside the victim's own exit
//        kill+mrelease+budget   the same, and the respawn first waits until at most half a
//                          heap is still in teardown (process_reaper::wait_for_budget): the
//                          budget bounds the memory held by old heaps when the new one fills
//        shadow            the worker called enable_shadow_teardown(): its helper pays for the
//                          teardown after the wait returns
//      Peak memory is the machine's (MemAvailable plus the per-CPU free lists, sampled every
//      2 ms) above what it was before the first spawn, so other programs' noise shows in it.
//
// Default: 2 workers of 256 MiB, 10 restarts each way (about 10 s). `--small`: 32 MiB heaps, 4
// restarts (ctest runs that). `--model` or `--real`: only that half. `--help` lists them.
#include <teardown/model/mm.hpp>
#include <teardown/process.hpp>
#include <teardown/process_reaper.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "example_args.hpp"

namespace {

using stopwatch = std::chrono::steady_clock;
using teardown::model::backing;
using teardown::model::mm_system;
using ull = unsigned long long;

double ms_between(stopwatch::time_point from, stopwatch::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

// Peak RSS: VmHWM in /proc/self/status (KiB). Writing 5 to /proc/self/clear_refs resets it.
void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }
double peak_rss_mib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024;
  }
  return -1;
}

struct run_result {
  std::vector<double> respawn_ms, exit_ms, spawn_ms;
  double peak_rss_mib = 0;
  int queued = 0;  // restarts whose exit was handed to the reaper; the rest were torn down inline
};

double median(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }
double max_of(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

run_result supervise(mm_system& kernel, int workers, std::uint64_t heap_pages, int restarts) {
  run_result r;
  reset_peak_rss();
  std::vector<std::unique_ptr<mm_system::task>> pool;
  for (int w = 0; w < workers; ++w) pool.push_back(kernel.spawn(heap_pages, backing::real));
  for (int i = 0; i < restarts; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the workers do some work
    auto& slot = pool[static_cast<std::size_t>(i % workers)];
    const auto decided = stopwatch::now();  // the supervisor decides to restart this worker
    if (slot->exit() == teardown::decision::queued) ++r.queued;  // the old one's exit: mmput_exit
    const auto exited = stopwatch::now();
    slot = kernel.spawn(heap_pages, backing::real);  // the replacement, its heap touched
    const auto running = stopwatch::now();
    r.exit_ms.push_back(ms_between(decided, exited));
    r.spawn_ms.push_back(ms_between(exited, running));
    r.respawn_ms.push_back(ms_between(decided, running));
  }
  for (auto& task : pool) task->exit();
  kernel.flush();  // everything queued is freed before the peak is read and the next run starts
  r.peak_rss_mib = peak_rss_mib();
  return r;
}

// ---- real processes ---------------------------------------------------------------------------

// Free memory the way benchmarks/process_bench.cpp measures it: MemAvailable plus the pages on
// the per-CPU free lists, which MemAvailable leaves out.
std::uint64_t free_bytes() {
  std::uint64_t available_kib = 0, pcp_pages = 0;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    if (key == "MemAvailable:") {
      meminfo >> available_kib;
      break;
    }
    meminfo.ignore(1 << 10, '\n');
  }
  std::ifstream zoneinfo("/proc/zoneinfo");
  for (std::string word; zoneinfo >> word;) {
    if (word == "count:") {
      std::uint64_t pages = 0;
      zoneinfo >> pages;
      pcp_pages += pages;
    }
  }
  return available_kib * 1024 + pcp_pages * static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
}

// Samples free memory every 2 ms from its construction on; peak_used() is the most that was
// ever missing against the first sample.
class memory_sampler {
 public:
  memory_sampler() : baseline_(free_bytes()), thread_([this] { run(); }) {}
  ~memory_sampler() {
    stop_.store(true, std::memory_order_relaxed);
    thread_.join();
  }
  double peak_used_mib() const { return static_cast<double>(peak_.load(std::memory_order_relaxed)) / (1 << 20); }

 private:
  void run() {
    while (!stop_.load(std::memory_order_relaxed)) {
      const std::uint64_t now = free_bytes();
      const std::uint64_t used = now < baseline_ ? baseline_ - now : 0;
      if (used > peak_.load(std::memory_order_relaxed)) peak_.store(used, std::memory_order_relaxed);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  const std::uint64_t baseline_;
  std::atomic<std::uint64_t> peak_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

enum class technique { kill, mrelease, mrelease_budget, shadow };
constexpr technique kTechniques[] = {technique::kill, technique::mrelease, technique::mrelease_budget,
                                     technique::shadow};
const char* technique_name(technique t) {
  switch (t) {
    case technique::kill: return "kill";
    case technique::mrelease: return "kill+mrelease";
    case technique::mrelease_budget: return "kill+mrelease+budget";
    case technique::shadow: return "shadow";
  }
  return "?";
}

// A worker: a child that (with shadow) turns on shadow teardown, maps and touches its heap,
// says so with one byte on `ready`, and waits to be killed. Returns once that byte came.
teardown::process::pidfd_process spawn_worker(std::uint64_t heap_bytes, bool shadow) {
  int ready[2];
  if (pipe2(ready, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe2");
  auto child = teardown::process::pidfd_process::spawn([&]() -> int {
    close(ready[0]);
    if (shadow) teardown::process::enable_shadow_teardown();  // throws: the child exits 127
    void* const heap = mmap(nullptr, heap_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (heap == MAP_FAILED) return 2;
    const auto page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
    for (std::uint64_t at = 0; at < heap_bytes; at += page) static_cast<volatile char*>(heap)[at] = 1;
    const char byte = 1;
    if (write(ready[1], &byte, 1) != 1) return 3;
    for (;;) pause();
  });
  close(ready[1]);
  char byte = 0;
  ssize_t got;
  while ((got = read(ready[0], &byte, 1)) < 0 && errno == EINTR) {
  }
  close(ready[0]);
  if (got != 1) {
    child.send_signal(SIGKILL);
    child.wait();
    throw std::runtime_error("a worker died before it was ready (exit status of the spawn: see above)");
  }
  return child;
}

struct real_result {
  std::vector<double> respawn_ms, kill_ms, budget_ms, spawn_ms;
  double peak_over_live_mib = 0;
};

real_result supervise_real(technique t, int workers, std::uint64_t heap_bytes, int restarts,
                           teardown::process::process_reaper& reaper) {
  const bool shadow = t == technique::shadow;
  const bool mrelease = t == technique::mrelease || t == technique::mrelease_budget;
  real_result r;
  memory_sampler memory;
  std::vector<teardown::process::pidfd_process> pool;
  for (int w = 0; w < workers; ++w) pool.push_back(spawn_worker(heap_bytes, shadow));
  for (int i = 0; i < restarts; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the workers do some work
    auto& slot = pool[static_cast<std::size_t>(i % workers)];
    const auto decided = stopwatch::now();
    if (mrelease) {
      reaper.kill(slot);
    } else {
      slot.send_signal(SIGKILL);
    }
    slot.wait();  // the old one is reaped: waitpid returned
    const auto killed = stopwatch::now();
    // At most half a heap may still be coming back when the new one starts filling.
    if (t == technique::mrelease_budget && !reaper.wait_for_budget(heap_bytes / 2, std::chrono::seconds(30))) {
      throw std::runtime_error("the budget did not come down within 30 s");
    }
    const auto budgeted = stopwatch::now();
    slot = spawn_worker(heap_bytes, shadow);
    const auto running = stopwatch::now();
    r.kill_ms.push_back(ms_between(decided, killed));
    r.budget_ms.push_back(ms_between(killed, budgeted));
    r.spawn_ms.push_back(ms_between(budgeted, running));
    r.respawn_ms.push_back(ms_between(decided, running));
  }
  for (auto& worker : pool) {
    worker.send_signal(SIGKILL);
    worker.wait();
  }
  reaper.flush();
  r.peak_over_live_mib = memory.peak_used_mib() - static_cast<double>(workers * heap_bytes) / (1 << 20);
  return r;
}

// The real half. True if every kill reached the reaper's worker and was accounted for.
bool real_half(int workers, int restarts, std::uint64_t heap_mib) {
  std::printf("\nreal processes: %d workers of %llu MiB, %d restarts per technique (SIGKILL, wait, spawn)\n",
              workers, ull{heap_mib}, restarts);
  teardown::process::process_reaper reaper;  // nice 0; no budget of its own: the loop waits on it
  std::vector<real_result> results;
  for (const technique t : kTechniques) results.push_back(supervise_real(t, workers, heap_mib << 20, restarts, reaper));

  std::printf("  %-26s", "milliseconds");
  for (const technique t : kTechniques) std::printf(" %21s", technique_name(t));
  std::printf("\n");
  const auto row = [&](const char* what, auto value) {
    std::printf("  %-26s", what);
    for (const real_result& r : results) std::printf(" %21.2f", value(r));
    std::printf("\n");
  };
  row("respawn latency, median", [](const real_result& r) { return median(r.respawn_ms); });
  row("respawn latency, max", [](const real_result& r) { return max_of(r.respawn_ms); });
  row("  kill -> reaped, median", [](const real_result& r) { return median(r.kill_ms); });
  row("  budget wait, median", [](const real_result& r) { return median(r.budget_ms); });
  row("  spawn part, median", [](const real_result& r) { return median(r.spawn_ms); });
  row("peak above live heaps, MiB", [](const real_result& r) { return r.peak_over_live_mib; });
  const teardown::process::process_reaper_stats s = reaper.stats();
  std::printf("process_reaper: killed %llu, released %llu (%llu MiB), raced %llu, shared_mm %llu, not_dying %llu, "
              "unsupported %llu, failed %llu, in teardown now %llu bytes\n",
              ull{s.killed}, ull{s.released}, ull{s.bytes_released >> 20}, ull{s.raced}, ull{s.shared_mm},
              ull{s.not_dying}, ull{s.unsupported}, ull{s.failed}, ull{s.bytes_in_teardown});
  const std::uint64_t accounted =
      s.released + s.raced + s.shared_mm + s.not_dying + s.unsupported + s.not_permitted + s.failed;
  return s.pending == 0 && s.bytes_in_teardown == 0 && accounted == s.killed;
}

// The model half. True if every exit queued was reaped.
bool model_half(int workers, int restarts, std::uint64_t heap_mib) {
  const std::uint64_t heap_pages = (heap_mib << 20) / mm_system::page_size();
  mm_system kernel;  // vm.async_mm_teardown starts off, as in the series
  // Exits below the threshold (default 64 MiB) are torn down inline: put ours above it.
  kernel.set("vm.async_mm_teardown_thresh_pages", std::to_string(heap_pages / 2));
  // At most one heap may wait for the reaper: the memory held stays under W live heaps, one
  // filling and one being freed. An exit that finds the reaper (nice 19) still busy with the
  // last one is torn down inline and counted as rejected.
  kernel.set("vm.async_mm_teardown_max_pending_pages", std::to_string(heap_pages));

  std::printf("model kernel: %d workers of %llu MiB, %d restarts each way (plain exit, then spawn)\n", workers,
              ull{heap_mib}, restarts);
  kernel.set("vm.async_mm_teardown", "0");
  const run_result off = supervise(kernel, workers, heap_pages, restarts);
  kernel.set("vm.async_mm_teardown", "1");
  const run_result on = supervise(kernel, workers, heap_pages, restarts);

  const auto row = [](const char* what, double a, double b) { std::printf("  %-26s %12.3f %12.3f\n", what, a, b); };
  std::printf("  %-26s %12s %12s\n", "milliseconds", "async off", "async on");
  row("respawn latency, median", median(off.respawn_ms), median(on.respawn_ms));
  row("respawn latency, max", max_of(off.respawn_ms), max_of(on.respawn_ms));
  row("  exit part, median", median(off.exit_ms), median(on.exit_ms));
  row("  exit part, max", max_of(off.exit_ms), max_of(on.exit_ms));
  row("  spawn part, median", median(off.spawn_ms), median(on.spawn_ms));
  std::printf("  %-26s %12d %12d   (of %d; the others were torn down inline)\n", "exits queued", off.queued, on.queued,
              restarts);
  std::printf("  %-26s %8.0f MiB %8.0f MiB   (%llu MiB live: %d workers)\n", "peak RSS (VmHWM)", off.peak_rss_mib,
              on.peak_rss_mib, ull{workers * heap_mib}, workers);

  // pending: charged to the reaper, not yet freed; its high water bounds the old heap held at
  // once. The last two exits come back to back: the second usually finds the first pending.
  const teardown::model::vmstat v = kernel.vmstat();
  std::printf("vmstat: queued %llu, sync %llu, rejected %llu, reaped %llu, pending %llu pages; "
              "pending high water %llu MiB\n",
              ull{v.queued}, ull{v.sync}, ull{v.rejected}, ull{v.reaped}, ull{v.pending_pages},
              ull{kernel.pending_high_water() * mm_system::page_size() >> 20});
  // On a busy machine the nice-19 reaper runs late, exits find it still busy and are torn down
  // inline (rejected above); it is raised to our nice while a batch has waited over 10 ms or a
  // flush waits for it (reaper.hpp, "Boost").
  const teardown::reaper_stats worker = kernel.stats().reaper;
  if (worker.boosts != 0 || worker.boosts_refused != 0) {
    std::printf("the reaper was boosted %llu time(s) (%llu refused): its work waited over 10 ms, a busy machine "
                "or a heap slower than that to free\n",
                ull{worker.boosts}, ull{worker.boosts_refused});
  }
  return v.queued == v.reaped && v.pending_pages == 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool small = false, model_only = false, real_only = false;
  example::command_line cli("supervisor",
                            "Restarts workers that hold big heaps and measures the respawn latency and peak memory:\n"
                            "on the model kernel (vm.async_mm_teardown off / on), then on real processes (kill,\n"
                            "kill + process_mrelease, with a budget wait, shadow teardown). 2 workers of 256 MiB,\n"
                            "10 restarts each way.");
  cli.flag("--small", small, "32 MiB heaps, 4 restarts (what ctest runs)");
  cli.flag("--model", model_only, "only the model kernel half");
  cli.flag("--real", real_only, "only the real processes half");
  cli.parse(argc, argv);
  if (model_only && real_only) cli.refuse("--model and --real exclude each other (give neither for both halves)");
  const bool model = !real_only, real = !model_only;
  const int workers = 2, restarts = small ? 4 : 10;
  const std::uint64_t heap_mib = small ? 32 : 256;
  bool ok = true;
  if (model) ok = model_half(workers, restarts, heap_mib) && ok;
  if (real) ok = real_half(workers, restarts, heap_mib) && ok;
  return ok ? 0 : 1;
}
