// supervisor: restart workers that hold big heaps, and see what the old one's exit costs.
//
// A supervisor (systemd, a job runner) keeps W workers alive. To restart one it lets it exit —
// a plain exit, not an OOM kill — and spawns a replacement at once. Until that one runs the
// service is a worker short: the respawn latency is the old worker's exit (the teardown of its
// address space) plus the new one's spawn (mapping and touching its heap). With
// vm.async_mm_teardown=1 the exit hands the old address space to the mm_reaper thread and
// returns at once; the price is memory: the old heap may still be being freed as the new fills.
//
// This runs that loop on the model kernel (teardown/model/mm.hpp) with real memory, knob off
// then on, and prints both parts of the latency and the peak RSS. Default: 2 workers of 256 MiB,
// 10 restarts each way (about 4 s). `--small`: 32 MiB heaps, 4 restarts (ctest runs that).
#include <teardown/model/mm.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

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

}  // namespace

int main(int argc, char** argv) {
  const bool small = argc > 1 && std::strcmp(argv[1], "--small") == 0;
  const int workers = 2, restarts = small ? 4 : 10;
  const std::uint64_t heap_mib = small ? 32 : 256;
  const std::uint64_t heap_pages = (heap_mib << 20) / mm_system::page_size();
  mm_system kernel;  // vm.async_mm_teardown starts off, as in the series
  // Exits below the threshold (default 64 MiB) are torn down inline: put ours above it.
  kernel.set("vm.async_mm_teardown_thresh_pages", std::to_string(heap_pages / 2));
  // At most one heap may wait for the reaper: the memory held stays under W live heaps, one
  // filling and one being freed. An exit that finds the reaper (nice 19) still busy with the
  // last one is torn down inline and counted as rejected.
  kernel.set("vm.async_mm_teardown_max_pending_pages", std::to_string(heap_pages));

  std::printf("supervisor: %d workers of %llu MiB, %d restarts each way (plain exit, then spawn)\n", workers,
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
  return v.queued == v.reaped && v.pending_pages == 0 ? 0 : 1;
}
