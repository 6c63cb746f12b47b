// exit_latency: the headline. How long does an exiting process's last mmput take on its own
// thread when the address-space teardown runs inline, and when it is handed to mm_reaper?
//
// The model kernel (teardown/model/mm.hpp) backs each process's RSS with real anonymous memory,
// touched page by page, so the teardown is the kernel's own munmap of that many pages. For each
// size the program exits processes with vm.async_mm_teardown off and on and prints, in the
// format of the RFC's "Numbers" section:
//   exit path    the exiting thread's task->exit() (mmput_exit of the last reference)
//   torn down    from that call until the teardown is done (munmap returned: the pages are free)
//   memory free  from that call until free memory (MemAvailable plus the per-CPU free lists)
//                has recovered, within a tenth of what the process took or 64 MiB; "n/a" when
//                other processes kept it from recovering within 10 s
//   CPU          the reaper's CPU for the teardowns (each from its exit until the teardown was
//                done) against the inline CPU for the same work
// and the same for a reaper that polls its queue (reaper_options::poll_interval, 1 ms unless
// --poll-interval says otherwise; 0 leaves the row out): the exiting thread then only pushes and
// never makes the futex wake; the row's price line gives the idle reaper's CPU and wake-ups per
// second and how much later a teardown starts. Then the lazy reaper (poll_interval_max, 128 ms
// unless --poll-max says otherwise; 0 leaves it out): its idle looks back off from the poll
// interval to that, so it idles almost for free, and nobody hurries these exits (the row waits
// for the worker's own look before its flush, which would hurry it): its line gives the start
// delay that costs.
// plus a process below the threshold (the sync path with the feature on and off) and the
// compile-time-off build (basic_mm_system<const_key<false>>, the kernel's CONFIG=n). Last, a
// busy machine: one process per CPU (--busy) spins at nice 0 while the first size is exited
// inline, deferred to a nice-19 mm_reaper that is never boosted, and deferred with the default
// options, under which the flush that waits for the teardown raises the reaper to its own nice
// (reaper.hpp, "Boost"); it prints memory free, the teardown's CPU and the CPU the spinners lost.
//
//   exit_latency                 1 GiB, 3 repetitions (medians)
//   exit_latency 0.5 2 --reps 5  sizes in GiB; each capped at half of the free memory
//   exit_latency --small         64 MiB, 1 repetition (ctest)
//   exit_latency --poll-interval 10000   the polling row with a 10 ms interval (in us; 0: none)
//   exit_latency --poll-max 0    leaves the lazy row out
//   exit_latency --busy 0        leaves the busy-machine rows out
//   exit_latency --help          the options
// Every time in the table is in milliseconds (the async-on exit path with four decimals: it is
// tens of microseconds).
#include <teardown/model/mm.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "example_args.hpp"

namespace {

using namespace teardown::model;
using clock_type = std::chrono::steady_clock;

double ms_between(clock_type::time_point from, clock_type::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) / 1e6;
}

// Free memory as the kernel has it: MemAvailable plus the pages on the per-CPU free lists
// (/proc/zoneinfo's pageset "count:" lines). Freed pages land on those lists first, and recent
// kernels leave them out of MemAvailable, so a freshly unmapped gigabyte may not show there.
double free_memory() {
  double bytes = 0;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemAvailable:") bytes = kib * 1024;
    meminfo.ignore(64, '\n');
  }
  std::ifstream zoneinfo("/proc/zoneinfo");
  for (std::string line; std::getline(zoneinfo, line);) {
    const std::size_t at = line.find("count: ");
    if (at != std::string::npos) bytes += std::atof(line.c_str() + at + 7) * double(mm_system::page_size());
  }
  return bytes;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0 : values[values.size() / 2];
}

// --busy: processes that spin at our nice value until destroyed (then killed and reaped; they
// also die with us: PR_SET_PDEATHSIG).
class spinners {
 public:
  explicit spinners(int count) {
    std::fflush(nullptr);
    for (int i = 0; i < count; ++i) {
      const pid_t pid = fork();
      if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        volatile unsigned long spin = 0;
        for (;;) spin = spin + 1;
      }
      if (pid > 0) pids_.push_back(pid);
    }
  }
  spinners(const spinners&) = delete;
  spinners& operator=(const spinners&) = delete;
  ~spinners() {
    for (const pid_t pid : pids_) kill(pid, SIGKILL);
    for (const pid_t pid : pids_) waitpid(pid, nullptr, 0);
  }
  int count() const { return static_cast<int>(pids_.size()); }
  // Their CPU per wall-clock ms over the next `window` (this thread sleeps through it).
  double cpu_per_ms(std::chrono::milliseconds window) const {
    const double before = cpu_ms();
    const auto start = clock_type::now();
    std::this_thread::sleep_for(window);
    return (cpu_ms() - before) / ms_between(start, clock_type::now());
  }
  // Their CPU time so far, all together (each child's CPU clock).
  double cpu_ms() const {
    double total = 0;
    for (const pid_t pid : pids_) {
      clockid_t clock{};
      timespec ts{};
      if (clock_getcpuclockid(pid, &clock) == 0 && clock_gettime(clock, &ts) == 0) {
        total += double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) / 1e6;
      }
    }
    return total;
  }

 private:
  std::vector<pid_t> pids_;
};

// While a row runs on a busy machine: the spinners, whose CPU measure_exit samples.
const spinners* busy_spinners = nullptr;

// The wait of the last item a reaper began to tear down (the reap trace point): the start delay.
std::atomic<std::uint64_t> last_reap_wait_ns{0};
void on_reap(const teardown::trace::reap_event& e) { last_reap_wait_ns.store(e.wait_ns, std::memory_order_relaxed); }

struct sample {
  double exit_ms = 0;       // the exiting thread's mmput_exit
  double torn_down_ms = 0;  // until the teardown is done
  double available_ms = 0;  // until free memory recovered
  double exit_cpu_ms = 0;   // CPU of the exiting thread in that call
  double reaper_cpu_ms = 0; // CPU of the reaper from that call until the teardown was done
  double spinners_lost_ms = 0;  // busy rows: the spinners' CPU that (call -> torn down) would have
                                // given them at their rate just before, less what they got
  double start_delay_ms = 0;    // from the exit until the reaper began the teardown (deferred)
};

// Progress goes to a terminal only: "\r" lines would litter a log.
const bool show_progress = isatty(STDERR_FILENO) != 0;

// Spawns a process of `pages`, exits it and measures. `progress` names the populate step.
// unhurried: wait for the reaper's own look before the flush (which would hurry a lazy one).
template <class System>
sample measure_exit(System& kernel, std::uint64_t pages, const char* progress, bool unhurried = false) {
  const auto populate_start = clock_type::now();
  if (show_progress) std::fprintf(stderr, "\r  populating %-40s", progress);
  auto task = kernel.spawn(pages, backing::real);
  if (show_progress) {
    std::fprintf(stderr, "\r  populated  %-40s %.1f s", progress, ms_between(populate_start, clock_type::now()) / 1e3);
  }
  // What the exit should give back, measured from just before it: the populate took seconds,
  // during which other processes move free memory too; the exit takes milliseconds.
  const double populated = double(pages) * double(mm_system::page_size());
  const double before_exit = free_memory();

  sample s;
  const std::uint64_t reaper_cpu_start = kernel.stats().reaper.worker_cpu_ns;
  // The spinners' own rate just before (other load on the machine takes its share of them
  // too): what they lose to the teardown is measured against it.
  const double spinners_rate = busy_spinners != nullptr ? busy_spinners->cpu_per_ms(std::chrono::milliseconds(200)) : 0;
  const double spinners_start = busy_spinners != nullptr ? busy_spinners->cpu_ms() : 0;
  const std::uint64_t reaped_before = kernel.vmstat().reaped;
  last_reap_wait_ns.store(0, std::memory_order_relaxed);
  const double cpu_start = thread_cpu_ms();
  const auto start = clock_type::now();
  task->exit();
  s.exit_ms = ms_between(start, clock_type::now());
  s.exit_cpu_ms = thread_cpu_ms() - cpu_start;
  if (unhurried) {
    const auto give_up = clock_type::now() + std::chrono::minutes(1);
    while (kernel.vmstat().reaped == reaped_before && clock_type::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  kernel.flush();  // the teardown is done once this returns
  s.start_delay_ms = double(last_reap_wait_ns.load(std::memory_order_relaxed)) / 1e6;
  s.torn_down_ms = ms_between(start, clock_type::now());
  if (busy_spinners != nullptr) {
    s.spinners_lost_ms = spinners_rate * s.torn_down_ms - (busy_spinners->cpu_ms() - spinners_start);
  }
  // Only this window: a polling reaper's CPU while it idles is its price, shown apart.
  s.reaper_cpu_ms = double(kernel.stats().reaper.worker_cpu_ns - reaper_cpu_start) / 1e6;
  // Other activity on the machine moves free memory too, hence the slack. Bounded: 10 s; a
  // timeout is reported as not measured (negative).
  const double target = before_exit + populated - std::max(populated / 10, double(64 << 20));
  const auto deadline = clock_type::now() + std::chrono::seconds(10);
  while (free_memory() < target && clock_type::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  s.available_ms = clock_type::now() < deadline ? ms_between(start, clock_type::now()) : -1;
  if (show_progress) std::fprintf(stderr, "\r%-70s\r", "");
  return s;
}

struct row_result {
  std::vector<double> exit_ms, torn_down_ms, available_ms, exit_cpu_ms, spinners_lost_ms, start_delay_ms;
  double reaper_cpu_ms = 0;
};

template <class System>
row_result run_row(System& kernel, std::uint64_t pages, int reps, const char* label, bool unhurried = false) {
  row_result r;
  for (int rep = 0; rep < reps; ++rep) {
    const std::string progress = std::string(label) + " (" + std::to_string(rep + 1) + "/" + std::to_string(reps) + ")";
    const sample s = measure_exit(kernel, pages, progress.c_str(), unhurried);
    r.exit_ms.push_back(s.exit_ms);
    r.torn_down_ms.push_back(s.torn_down_ms);
    r.available_ms.push_back(s.available_ms);
    r.exit_cpu_ms.push_back(s.exit_cpu_ms);
    r.reaper_cpu_ms += s.reaper_cpu_ms;
    r.spinners_lost_ms.push_back(s.spinners_lost_ms);
    r.start_delay_ms.push_back(s.start_delay_ms);
  }
  return r;
}

std::string size_label(double gib) {
  char text[32];
  if (gib >= 1) std::snprintf(text, sizeof text, "%.3g GiB", gib);
  else std::snprintf(text, sizeof text, "%.0f MiB", gib * 1024);
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<double> sizes_gib;
  int reps = 3;
  double poll_us = 1000;
  double poll_max_us = 128000;
  bool small = false;
  int busy = static_cast<int>(std::thread::hardware_concurrency());
  example::command_line cli(
      "exit_latency",
      "The exit-path latency of the model kernel on real memory: vm.async_mm_teardown off and on,\n"
      "a reaper that polls its queue, a process below the threshold and the compile-time-off\n"
      "build. Every time in the table is in milliseconds.");
  cli.operands("SIZE_GIB", sizes_gib, example::at_least(1.0 / 64),
               "sizes to exit, in GiB (default 1; 0.0625 is 64 MiB), each capped at half of the free memory");
  cli.option("--reps", "N", reps, example::between(1, 1000), "repetitions per row; the table shows medians");
  cli.option("--poll-interval", "US", poll_us, example::between(0.0, 1e6),
             "the polling reaper's interval in microseconds; 0 leaves its row out");
  cli.option("--poll-max", "US", poll_max_us, example::between(0.0, 1e7),
             "the lazy reaper's longest idle look in microseconds (poll_interval_max); 0 leaves its row out");
  cli.option("--busy", "N", busy, example::between(0, 1024),
             "processes spinning at nice 0 for the busy-machine rows (default: one per CPU; 0 leaves them out)");
  cli.flag("--small", small, "64 MiB, one repetition (what ctest runs); SIZE_GIB and --reps still apply");
  cli.parse(argc, argv);
  if (small) {
    if (sizes_gib.empty()) sizes_gib = {1.0 / 16};
    if (!cli.given("--reps")) reps = 1;
  }
  if (sizes_gib.empty()) sizes_gib = {1};
  char poll_label[32];  // the interval as the table shows it: in ms, like every time in it
  std::snprintf(poll_label, sizeof poll_label, "%g ms", poll_us / 1e3);
  const double page = double(mm_system::page_size());
  const auto pages_of = [&](double gib) { return std::uint64_t(gib * double(1ull << 30) / page); };

  // The RFC raised max_pending_pages to 3/4 of RAM for its async runs, "so the measurements
  // exercise the reaper, not the backpressure fallback"; so do we.
  mm_system kernel({.async_mm_teardown = false, .max_pending_pages = mm_system::default_max_pending_pages() * 3});
  teardown::model::basic_mm_system<teardown::const_key<false>> compiled_out;
  // The same kernel whose mm_reaper polls: exits only push onto its queue.
  const auto poll_interval = std::chrono::nanoseconds(static_cast<std::int64_t>(poll_us * 1e3));
  mm_system polling({.async_mm_teardown = true,
                     .max_pending_pages = mm_system::default_max_pending_pages() * 3,
                     .reaper = {.name = "mm_reaper_poll", .poll_interval = poll_interval}});
  // ... and whose looks back off while idle, up to poll_max_us (needs a poll interval below it).
  const bool lazy_row = poll_us > 0 && poll_max_us > poll_us;
  char lazy_label[48];
  std::snprintf(lazy_label, sizeof lazy_label, "lazy %g-%g ms", poll_us / 1e3, poll_max_us / 1e3);
  std::optional<mm_system> lazy;
  if (lazy_row) {
    lazy.emplace(mm_system_options{
        .async_mm_teardown = true,
        .max_pending_pages = mm_system::default_max_pending_pages() * 3,
        .reaper = {.name = "mm_reaper_lazy",
                   .poll_interval = poll_interval,
                   .poll_interval_max = std::chrono::nanoseconds(static_cast<std::int64_t>(poll_max_us * 1e3))}});
  }
  teardown::trace::add_hook<teardown::trace::reap_event>(&on_reap);

  std::printf("exit_latency: the model kernel on real memory (%u CPUs, %.1f GiB free, page %zu B), "
              "%d repetition(s), medians\n",
              std::thread::hardware_concurrency(), free_memory() / double(1ull << 30), mm_system::page_size(), reps);
  std::printf("exit path: the exiting thread's last mmput (mmput_exit). torn down, memory free: from that call, "
              "async off / on\n\n");
  std::printf("%-22s %10s %10s %10s %18s %18s %12s\n", "size", "async off", "async on", "reduction", "torn down",
              "memory free", "CPU reaper/");
  std::printf("%-22s %10s %10s %10s %18s %18s %12s\n", "", "(ms)", "(ms)", "", "(ms)", "(ms)", "inline");

  std::vector<double> lazy_start_delays;  // every lazy exit's, all sizes
  for (double gib : sizes_gib) {
    const double cap = free_memory() / 2 / double(1ull << 30);
    if (gib > cap) {
      std::printf("%-22s capped at half of the free memory: %.2f GiB\n", size_label(gib).c_str(), cap);
      gib = cap;
    }
    kernel.set_async_mm_teardown(false);
    const row_result off = run_row(kernel, pages_of(gib), reps, (size_label(gib) + ", async off").c_str());
    kernel.set_async_mm_teardown(true);
    const row_result on = run_row(kernel, pages_of(gib), reps, (size_label(gib) + ", async on").c_str());
    double inline_cpu = 0;
    for (double ms : off.exit_cpu_ms) inline_cpu += ms;
    char torn_down[40], available[40];
    std::snprintf(torn_down, sizeof torn_down, "%.1f / %.1f", median(off.torn_down_ms), median(on.torn_down_ms));
    const auto shown = [](double ms) {
      return ms < 0 ? std::string("n/a") : std::to_string(ms).substr(0, std::to_string(ms).find('.') + 2);
    };
    std::snprintf(available, sizeof available, "%s / %s", shown(median(off.available_ms)).c_str(),
                  shown(median(on.available_ms)).c_str());
    std::printf("%-22s %10.2f %10.4f %9.0fx %18s %18s %12.2f\n", size_label(gib).c_str(), median(off.exit_ms),
                median(on.exit_ms), median(off.exit_ms) / median(on.exit_ms), torn_down, available,
                inline_cpu > 0 ? on.reaper_cpu_ms / inline_cpu : 0.0);
    if (poll_us > 0) {
      const row_result polled =
          run_row(polling, pages_of(gib), reps, (size_label(gib) + ", async on, polling").c_str());
      std::snprintf(torn_down, sizeof torn_down, "%.1f / %.1f", median(off.torn_down_ms), median(polled.torn_down_ms));
      std::snprintf(available, sizeof available, "%s / %s", shown(median(off.available_ms)).c_str(),
                    shown(median(polled.available_ms)).c_str());
      std::printf("%-22s %10s %10.4f %9.0fx %18s %18s %12.2f\n", (size_label(gib) + ", poll " + poll_label).c_str(),
                  "", median(polled.exit_ms), median(off.exit_ms) / median(polled.exit_ms), torn_down, available,
                  inline_cpu > 0 ? polled.reaper_cpu_ms / inline_cpu : 0.0);
    }
    if (lazy_row) {
      const row_result lazed =
          run_row(*lazy, pages_of(gib), reps, (size_label(gib) + ", async on, lazy").c_str(), /*unhurried=*/true);
      lazy_start_delays.insert(lazy_start_delays.end(), lazed.start_delay_ms.begin(), lazed.start_delay_ms.end());
      std::snprintf(torn_down, sizeof torn_down, "%.1f / %.1f", median(off.torn_down_ms), median(lazed.torn_down_ms));
      std::snprintf(available, sizeof available, "%s / %s", shown(median(off.available_ms)).c_str(),
                    shown(median(lazed.available_ms)).c_str());
      std::printf("%-22s %10s %10.4f %9.0fx %18s %18s %12.2f\n", (size_label(gib) + ", " + lazy_label).c_str(), "",
                  median(lazed.exit_ms), median(off.exit_ms) / median(lazed.exit_ms), torn_down, available,
                  inline_cpu > 0 ? lazed.reaper_cpu_ms / inline_cpu : 0.0);
    }
  }
  if (poll_us > 0) {
    // The polling reaper's price while it has nothing to do, over one idle second.
    const teardown::reaper_stats before = polling.stats().reaper;
    const auto idle_start = clock_type::now();
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const teardown::reaper_stats after = polling.stats().reaper;
    const double seconds = ms_between(idle_start, clock_type::now()) / 1e3;
    std::printf(
        "%-22s the idle polling reaper: %.1f ms CPU and %.0f timed wake-ups per second; a teardown starts "
        "up to %s later; its exits made %llu futex wakes\n",
        "", double(after.worker_cpu_ns - before.worker_cpu_ns) / 1e6 / seconds,
        double(after.polls - before.polls) / seconds, poll_label, (unsigned long long)after.wakeups);
  }
  if (lazy_row) {
    // The same for the lazy reaper, whose looks have backed off by now, and the start delay its
    // exits paid: nobody hurried them.
    const teardown::reaper_stats before = lazy->stats().reaper;
    const auto idle_start = clock_type::now();
    std::this_thread::sleep_for(std::chrono::seconds(2));
    const teardown::reaper_stats after = lazy->stats().reaper;
    const double seconds = ms_between(idle_start, clock_type::now()) / 1e3;
    const double cpu_ms_per_s = double(after.worker_cpu_ns - before.worker_cpu_ns) / 1e6 / seconds;
    std::printf(
        "%-22s the idle lazy reaper: %.3f ms CPU (%.3f%% of a CPU) and %.1f timed wake-ups per second; its "
        "teardowns started %.1f ms (median; max %.1f) after the exit, up to %g ms; %llu futex wakes\n",
        "", cpu_ms_per_s, cpu_ms_per_s / 10, double(after.polls - before.polls) / seconds, median(lazy_start_delays),
        lazy_start_delays.empty() ? 0.0 : *std::max_element(lazy_start_delays.begin(), lazy_start_delays.end()),
        poll_max_us / 1e3, (unsigned long long)after.wakeups);
  }

  // Below the threshold the feature must change nothing: both are the inline path.
  const double small_gib = 30.0 / 1024;
  const int small_reps = std::max(5, reps * 3);
  kernel.set_async_mm_teardown(false);
  const row_result small_off = run_row(kernel, pages_of(small_gib), small_reps, "30 MiB, async off");
  kernel.set_async_mm_teardown(true);
  const row_result small_on = run_row(kernel, pages_of(small_gib), small_reps, "30 MiB, async on");
  std::printf("%-22s %10.3f %10.3f %10s (both inline: %+.1f%%)\n", "30 MiB (below thresh)", median(small_off.exit_ms),
              median(small_on.exit_ms), "",
              (median(small_on.exit_ms) / median(small_off.exit_ms) - 1) * 100);

  // The compile-time-off build: no reaper, no knob, no counters. It should match "async off".
  const double control_gib = std::min(sizes_gib.front(), free_memory() / 2 / double(1ull << 30));
  const row_result control = run_row(compiled_out, pages_of(control_gib), reps, "compile-time off");
  std::printf("%-22s %10.2f %10s   (const_key<false>: the deferred path compiled out)\n",
              (size_label(control_gib) + ", =n build").c_str(), median(control.exit_ms), "-");

  if (busy > 0) {
    // A busy machine: the same exit inline, deferred to a reaper that is never boosted, and
    // deferred with the default options (a flush that waits boosts the reaper).
    mm_system unboosted({.async_mm_teardown = true,
                         .max_pending_pages = mm_system::default_max_pending_pages() * 3,
                         .reaper = {.name = "mm_reaper_nb", .boost_after = std::chrono::nanoseconds(0)}});
    const std::uint64_t pages = pages_of(control_gib);
    const std::uint64_t boosts_before = kernel.stats().reaper.boosts;
    const spinners spin(busy);
    busy_spinners = &spin;
    kernel.set_async_mm_teardown(false);
    const row_result off = run_row(kernel, pages, reps, "busy, async off");
    const row_result slow = run_row(unboosted, pages, reps, "busy, async on, no boost");
    kernel.set_async_mm_teardown(true);
    const row_result boosted = run_row(kernel, pages, reps, "busy, async on, boost");
    busy_spinners = nullptr;
    double inline_cpu = 0;
    for (double ms : off.exit_cpu_ms) inline_cpu += ms;
    std::printf("\nbusy machine: %d processes spinning at nice 0 on %u CPUs, %s, medians (ms)\n", spin.count(),
                std::thread::hardware_concurrency(), size_label(control_gib).c_str());
    std::printf("%-22s %10s %12s %12s %12s %14s %14s\n", "", "exit path", "memory free", "of inline", "teardown CPU",
                "spinners lost", "lost/teardown");
    const auto busy_row = [&](const char* label, const row_result& r, double teardown_cpu_total) {
      const double cpu = teardown_cpu_total / double(reps);
      const double back = median(r.available_ms), back_inline = median(off.available_ms);
      std::printf("%-22s %10.4f %12s %12s %12.1f %14.1f %14.2f\n", label, median(r.exit_ms),
                  back < 0 ? "n/a" : std::to_string(int(back + 0.5)).c_str(),
                  back < 0 || back_inline < 0 ? "n/a" : (std::to_string(back / back_inline).substr(0, 4) + "x").c_str(),
                  cpu, median(r.spinners_lost_ms), cpu > 0 ? median(r.spinners_lost_ms) / cpu : 0.0);
    };
    busy_row("async off", off, inline_cpu);
    busy_row("async on, no boost", slow, slow.reaper_cpu_ms);
    busy_row("async on (boost)", boosted, boosted.reaper_cpu_ms);
    std::printf("%-22s the default reaper was boosted %llu times; \"memory free\" waits for the flush, as a\n"
                "%-22s program that needs the memory back does\n",
                "", (unsigned long long)(kernel.stats().reaper.boosts - boosts_before), "");
  }

  const teardown::model::vmstat v = kernel.vmstat();
  std::printf("\nvmstat: queued %llu, sync %llu, rejected %llu, reaped %llu, pending %llu pages\n",
              (unsigned long long)v.queued, (unsigned long long)v.sync, (unsigned long long)v.rejected,
              (unsigned long long)v.reaped, (unsigned long long)v.pending_pages);
  std::printf("seed (bare metal, 32 CPUs, kill -> waitpid): 1 GB 18.01 ms -> 0.14 ms (128x), "
              "30 MB 0.56 -> 0.60 ms, CPU reaper/inline 1.18\n");
  return 0;
}
