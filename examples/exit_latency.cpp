// exit_latency: the headline. How long does an exiting process's last mmput take on its own
// thread when the address-space teardown runs inline, and when it is handed to mm_reaper?
//
// The model kernel (teardown/model/mm.hpp) backs each process's RSS with real anonymous memory,
// touched page by page, so the teardown is the kernel's own munmap of that many pages. For each
// size the program exits processes with vm.async_mm_teardown off and on and prints one table,
// medians in ms, with a legend under it that defines every column:
//   wall, CPU    the exit path: the exiting thread's task->exit() (mmput_exit of the last
//                reference), its wall time and its own CPU time (CLOCK_THREAD_CPUTIME_ID), the
//                wall clock read outside the CPU clock and each less what the readings cost
//                around nothing. Wall above CPU means the thread was preempted (on a busy
//                machine, e.g. in the reaper's futex wake): the async-on wall time moves with
//                the machine's load, its CPU time does not
//   reduction    async-off wall time over this row's async-on wall time
//   torn down    from that call until the teardown is done (munmap returned), async off / on
//   memory free  from that call until free memory (MemAvailable plus the per-CPU free lists)
//                has recovered, within a tenth of what the process took or 64 MiB; "n/a" when
//                other processes kept it from recovering within 10 s
//   CPU reaper/inline  the reaper's CPU per teardown (from its exit until done) over the exiting
//                thread's CPU per teardown inline, means over the exits: a ratio, 1 = same work
// Rows: the default reaper (the exit wakes it: a futex wake); a reaper that polls its queue
// (reaper_options::poll_interval, 1 ms unless --poll-interval says otherwise; 0 leaves the row
// out), whose exits only push; the lazy reaper (poll_interval_max, 128 ms unless --poll-max says
// otherwise; 0 leaves it out), whose idle looks back off up to that and whose exits nobody
// hurries (the row waits for the worker's own look before its flush, which would hurry it); a
// process below the threshold (inline with the feature on and off); the compile-time-off build
// (basic_mm_system<const_key<false>>, the kernel's CONFIG=n). Under the table: the idle price
// of the polling and the lazy reaper (both over the same second), the main kernel's vmstat, and
// the mm_reaper patch series' own published figure, labelled as such: it is not measured here.
// The async off/on rows exit --reps times (3); the poll, lazy and compiled-out rows, which
// illustrate, exit once unless --reps is given, so that the default run stays well under 15 s.
//
// With --busy N (default 0: left out, and the output says how to add them), a busy machine: N
// processes spin at nice 0 while the first size is exited inline, deferred to a nice-19
// mm_reaper that is never boosted, and deferred with the default options, under which a flush
// that waits raises the reaper to the flusher's nice (reaper.hpp, "Boost"; how many raises were
// made and refused, and how many items waiting flushes tore down themselves, is printed). Run as
// root, the rows come twice: root's, then an ordinary user's (uid 65534, no capabilities, from a
// child that drops root and runs this program with --busy-only), whose reaper keeps nice 0
// because no raise could undo a nice 19 there (reaper.hpp, "Boost"). Beside memory free and
// the teardown's CPU it prints the spinners' share of the CPUs they could use, over the 200 ms
// before the exit and from the exit until the teardown was done: each a fraction of a bound, so
// never negative. (Not "the CPU the spinners lost", their rate before times the window less what
// they got: other load moves that rate, and the difference went negative.) The no-boost row
// takes seconds per exit: a nice-19 thread gets about 1.5% of a CPU beside nice-0 spinners.
//
//   exit_latency                 1 GiB, medians of 3; 5 to 10 s on 2 CPUs
//   exit_latency 0.5 2 --reps 5  sizes in GiB; each capped at half of the free memory
//   exit_latency --small         64 MiB, 1 repetition (ctest)
//   exit_latency --poll-interval 10000   the polling row with a 10 ms interval (in us; 0: none)
//   exit_latency --poll-max 0    leaves the lazy row out
//   exit_latency --busy 2        adds the busy-machine rows, 2 spinners (about a minute)
//   exit_latency --help          the options
#include <teardown/model/mm.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
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

// The exit's measurement: the wall clock read outside the thread's CPU clock, so that whatever
// adds CPU time adds wall time too, and wall above CPU is time the thread did not run. The CPU
// clock is a syscall: read cold (after a populate) its entry and return add microseconds to a
// call that takes a few, so the readings come warm (warm_clock_reads), and what the readings
// cost around nothing, the least of 101 tries (measure_clock_reads), is taken off both times.
struct exit_clock {
  clock_type::time_point wall;
  double cpu_ms;
};
exit_clock read_before() {
  exit_clock c;
  c.wall = clock_type::now();
  c.cpu_ms = thread_cpu_ms();
  return c;
}
exit_clock read_after() {
  exit_clock c;
  c.cpu_ms = thread_cpu_ms();
  c.wall = clock_type::now();
  return c;
}
void warm_clock_reads() {
  for (int i = 0; i < 3; ++i) (void)read_after();
}
double empty_wall_ms = 0, empty_cpu_ms = 0;  // set once by measure_clock_reads()
void measure_clock_reads() {
  empty_wall_ms = empty_cpu_ms = 1e9;
  for (int i = 0; i < 101; ++i) {
    const exit_clock before = read_before();
    const exit_clock after = read_after();
    empty_wall_ms = std::min(empty_wall_ms, ms_between(before.wall, after.wall));
    empty_cpu_ms = std::min(empty_cpu_ms, after.cpu_ms - before.cpu_ms);
  }
}

// The CPUs this process may run on (its affinity mask; the spinners inherit it).
int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
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
// also die with us: PR_SET_PDEATHSIG). Each spins by reading its own CPU clock and publishing it
// in memory shared with us: another process's CPU clock, read from outside, lags by up to a
// scheduler tick while that process runs (the kernel adds the running slice only to a thread's
// own clock), which made a share of 112% over a 12 ms window. Published this way, between
// stretches of plain spinning, it lags by one stretch: microseconds of CPU.
class spinners {
 public:
  explicit spinners(int count) {
    void* shared = mmap(nullptr, sizeof(published) * std::size_t(std::max(count, 1)), PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) return;  // no spinners: the rows say "0 processes"
    cpu_ns_ = static_cast<published*>(shared);
    for (int i = 0; i < count; ++i) new (&cpu_ns_[i]) published(0);
    std::fflush(nullptr);
    for (int i = 0; i < count; ++i) {
      const pid_t pid = fork();
      if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        for (;;) {
          volatile unsigned long spin = 0;
          for (int n = 0; n < 10000; ++n) spin = spin + 1;
          timespec ts{};
          clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
          cpu_ns_[i].store(std::uint64_t(ts.tv_sec) * 1000000000u + std::uint64_t(ts.tv_nsec),
                           std::memory_order_relaxed);
        }
      }
      if (pid > 0) pids_.push_back(pid);
    }
    mapped_ = std::size_t(std::max(count, 1));
    slots_ = std::size_t(count);
  }
  spinners(const spinners&) = delete;
  spinners& operator=(const spinners&) = delete;
  ~spinners() {
    for (const pid_t pid : pids_) kill(pid, SIGKILL);
    for (const pid_t pid : pids_) waitpid(pid, nullptr, 0);
    if (cpu_ns_ != nullptr) munmap(cpu_ns_, sizeof(published) * mapped_);
  }
  int count() const { return static_cast<int>(pids_.size()); }
  // The CPUs they can fill at most: one each, no more than the machine lends us.
  int cpus_they_can_use() const { return std::max(1, std::min(count(), usable_cpus())); }
  // Their CPU time over the next `window` (this thread sleeps through it) over the CPU they
  // could have had in it. The window encloses both readings of their clocks, so at most 1 (plus
  // one clock read's lag over the window).
  double share_over(std::chrono::milliseconds window) const {
    const auto start = clock_type::now();
    const double before = cpu_ms();
    std::this_thread::sleep_for(window);
    const double got = cpu_ms() - before;
    return got / (double(cpus_they_can_use()) * ms_between(start, clock_type::now()));
  }
  // Their CPU time so far, all together, as each last published it.
  double cpu_ms() const {
    double total = 0;
    // Every slot: one whose fork failed stays 0.
    for (std::size_t i = 0; i < slots_; ++i) total += double(cpu_ns_[i].load(std::memory_order_relaxed)) / 1e6;
    return total;
  }

 private:
  using published = std::atomic<std::uint64_t>;  // lock-free, so it works across processes
  static_assert(published::is_always_lock_free);
  std::vector<pid_t> pids_;
  published* cpu_ns_ = nullptr;  // one per spinner, in a MAP_SHARED mapping
  std::size_t mapped_ = 0;
  std::size_t slots_ = 0;  // the spinners asked for (pids_ may hold fewer)
};

// While a row runs on a busy machine: the spinners, whose CPU measure_exit samples.
const spinners* busy_spinners = nullptr;

// The wait of the last item a reaper began to tear down (the reap trace point): the start delay.
std::atomic<std::uint64_t> last_reap_wait_ns{0};
void on_reap(const teardown::trace::reap_event& e) { last_reap_wait_ns.store(e.wait_ns, std::memory_order_relaxed); }

struct sample {
  double exit_ms = 0;                // the exiting thread's mmput_exit, wall-clock
  double exit_cpu_ms = 0;            // CPU of the exiting thread in that call
  double torn_down_ms = 0;           // until the teardown is done
  double available_ms = 0;           // until free memory recovered; negative: not within 10 s
  double reaper_cpu_ms = 0;          // CPU of the reaper from that call until the teardown was done
  double start_delay_ms = 0;         // from the exit until the reaper began the teardown (deferred)
  double spinners_share = 0;         // busy rows: the spinners' CPU from the call until torn down, over
                                     // the CPU they could have had in that time (0..1)
  double spinners_share_before = 0;  // the same over the 200 ms before the exit
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
  const std::uint64_t reaped_before = kernel.vmstat().reaped;
  last_reap_wait_ns.store(0, std::memory_order_relaxed);
  // The spinners' share just before, so that other load on the machine shows beside theirs
  // during the teardown; this window too encloses both readings of their clocks.
  if (busy_spinners != nullptr) s.spinners_share_before = busy_spinners->share_over(std::chrono::milliseconds(200));
  const auto window_start = clock_type::now();
  const double spinners_start = busy_spinners != nullptr ? busy_spinners->cpu_ms() : 0;
  warm_clock_reads();
  const exit_clock before = read_before();
  task->exit();
  const exit_clock after = read_after();
  const auto start = before.wall;
  s.exit_ms = ms_between(before.wall, after.wall) - empty_wall_ms;
  s.exit_cpu_ms = after.cpu_ms - before.cpu_ms - empty_cpu_ms;
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
    const double got = busy_spinners->cpu_ms() - spinners_start;
    const double window = ms_between(window_start, clock_type::now());
    s.spinners_share = got / (double(busy_spinners->cpus_they_can_use()) * window);
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
  std::vector<double> exit_ms, exit_cpu_ms, torn_down_ms, available_ms, start_delay_ms, spinners_share,
      spinners_share_before;
  double reaper_cpu_ms = 0;  // all repetitions together
  double exit_cpu_total_ms() const {
    double total = 0;
    for (double ms : exit_cpu_ms) total += ms;
    return total;
  }
};

template <class System>
row_result run_row(System& kernel, std::uint64_t pages, int reps, const std::string& label, bool unhurried = false) {
  row_result r;
  for (int rep = 0; rep < reps; ++rep) {
    const std::string progress = label + " (" + std::to_string(rep + 1) + "/" + std::to_string(reps) + ")";
    const sample s = measure_exit(kernel, pages, progress.c_str(), unhurried);
    r.exit_ms.push_back(s.exit_ms);
    r.exit_cpu_ms.push_back(s.exit_cpu_ms);
    r.torn_down_ms.push_back(s.torn_down_ms);
    r.available_ms.push_back(s.available_ms);
    r.reaper_cpu_ms += s.reaper_cpu_ms;
    r.start_delay_ms.push_back(s.start_delay_ms);
    r.spinners_share.push_back(s.spinners_share);
    r.spinners_share_before.push_back(s.spinners_share_before);
  }
  return r;
}

std::string size_label(double gib) {
  char text[32];
  if (gib >= 1) std::snprintf(text, sizeof text, "%.3g GiB", gib);
  else std::snprintf(text, sizeof text, "%.0f MiB", gib * 1024);
  return text;
}

// A number with `decimals` decimals; a negative one (not measured) as "n/a".
std::string fixed(double value, int decimals) {
  if (value < 0) return "n/a";
  char text[32];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

// A time in ms: to 0.01 ms from 1 ms up, to 0.1 us below (an exit that only queues).
std::string shown_ms(double ms) { return fixed(ms, ms >= 1 ? 2 : 4); }

// The main table's columns: one format for its header and its rows.
constexpr const char* table_format = "%-24s %9s %9s %9s %9s %9s %16s %16s %9s\n";

// One row: `on` against `off`. with_off: print the async-off columns too (the first row of a size).
void print_row(const std::string& label, const row_result& off, const row_result& on, bool with_off) {
  const double off_wall = median(off.exit_ms), on_wall = median(on.exit_ms);
  const std::string torn_down = fixed(median(off.torn_down_ms), 1) + " / " + fixed(median(on.torn_down_ms), 1);
  const std::string memory_free = fixed(median(off.available_ms), 1) + " / " + fixed(median(on.available_ms), 1);
  // Per exit, as the rows may have run different numbers of exits.
  const double inline_cpu = off.exit_cpu_total_ms() / double(off.exit_cpu_ms.size());
  const double reaper_cpu = on.reaper_cpu_ms / double(on.exit_ms.size());
  std::printf(table_format, label.c_str(), with_off ? fixed(off_wall, 2).c_str() : "",
              with_off ? fixed(median(off.exit_cpu_ms), 2).c_str() : "", fixed(on_wall, 4).c_str(),
              fixed(median(on.exit_cpu_ms), 4).c_str(), (fixed(off_wall / on_wall, 0) + "x").c_str(), torn_down.c_str(),
              memory_free.c_str(), inline_cpu > 0 ? fixed(reaper_cpu / inline_cpu, 2).c_str() : "n/a");
}

// The busy rows' user: "root", or "uid N" (an ordinary user's rows).
std::string user_label() { return geteuid() == 0 ? "root" : "uid " + std::to_string(geteuid()); }

constexpr const char* busy_format = "%-30s %9s %9s %12s %12s %12s %18s\n";

void print_busy_header() {
  std::printf("%-30s %19s %12s %12s %12s %18s\n", "", "---- exit path ----", "memory free", "memory free", "teardown",
              "spinners' share");
  std::printf(busy_format, "", "wall", "CPU", "", "/ inline", "CPU", "before / during");
}

// The busy-machine rows for this process's user (`who`): the same exit inline, deferred to a
// reaper that is never boosted, and deferred with the default options (a flush that waits
// raises the reaper, or, where no raise can be in force, tears down itself). Returns the CPUs
// the spinners could use.
int run_busy_rows(mm_system& kernel, std::uint64_t pages, int reps, int busy, const std::string& who) {
  mm_system unboosted({.async_mm_teardown = true,
                       .max_pending_pages = mm_system::default_max_pending_pages() * 3,
                       .reaper = {.name = "mm_reaper_nb", .boost_after = std::chrono::nanoseconds(0)}});
  const spinners spin(busy);
  busy_spinners = &spin;
  kernel.set_async_mm_teardown(false);
  const row_result off = run_row(kernel, pages, reps, "busy, async off");
  const row_result slow = run_row(unboosted, pages, reps, "busy, async on, no boost");
  kernel.set_async_mm_teardown(true);
  const teardown::reaper_stats before = kernel.stats().reaper;
  const row_result boosted = run_row(kernel, pages, reps, "busy, async on, boost");
  const teardown::reaper_stats after = kernel.stats().reaper;
  busy_spinners = nullptr;
  const auto busy_row = [&](const char* what, const row_result& r, double teardown_cpu_total) {
    const double back = median(r.available_ms), back_inline = median(off.available_ms);
    const std::string relative = back < 0 || back_inline <= 0 ? "n/a" : fixed(back / back_inline, 2) + "x";
    const std::string share =
        fixed(median(r.spinners_share_before) * 100, 0) + "% / " + fixed(median(r.spinners_share) * 100, 0) + "%";
    std::printf(busy_format, (who + ": " + what).c_str(), shown_ms(median(r.exit_ms)).c_str(),
                shown_ms(median(r.exit_cpu_ms)).c_str(), fixed(back, 1).c_str(), relative.c_str(),
                fixed(teardown_cpu_total / double(reps), 1).c_str(), share.c_str());
  };
  busy_row("async off", off, off.exit_cpu_total_ms());
  busy_row("async on, no boost", slow, slow.reaper_cpu_ms);
  busy_row("async on, default", boosted, boosted.reaper_cpu_ms);
  const auto times = [](std::uint64_t n) { return std::to_string(n) + (n == 1 ? " time" : " times"); };
  std::printf("%-30s the reaper (nice %d) was raised %s, refused %s; waiters tore down %llu item(s)\n", "",
              kernel.nice(), times(after.boosts - before.boosts).c_str(),
              times(after.boosts_refused - before.boosts_refused).c_str(),
              static_cast<unsigned long long>(after.helped - before.helped));
  std::fflush(stdout);
  return spin.cpus_they_can_use();
}

// The same rows as uid 65534 with no capabilities (what setpriv --reuid=65534 --regid=65534
// --clear-groups --inh-caps=-all gives): this program again, with --busy-only, in a child that
// drops root first. It prints its rows under ours; if it cannot start, one line says why.
void rerun_busy_rows_unprivileged(const char* self, double gib, int reps, int busy) {
  std::fflush(stdout);
  const std::string size = std::to_string(gib), reps_text = std::to_string(reps), busy_text = std::to_string(busy);
  const pid_t child = fork();
  if (child == 0) {
    constexpr uid_t nobody = 65534;
    if (setgroups(0, nullptr) != 0 || setresgid(nobody, nobody, nobody) != 0 ||
        setresuid(nobody, nobody, nobody) != 0) {
      std::printf("%-30s could not become uid 65534: %s\n", "uid 65534:", std::strerror(errno));
      _exit(1);
    }
    execl("/proc/self/exe", self, size.c_str(), "--reps", reps_text.c_str(), "--busy", busy_text.c_str(),
          "--busy-only", static_cast<char*>(nullptr));
    std::printf("%-30s could not run this program again as uid 65534: %s\n", "uid 65534:", std::strerror(errno));
    _exit(1);
  }
  if (child < 0) {
    std::printf("%-30s no rows: fork failed: %s\n", "uid 65534:", std::strerror(errno));
    return;
  }
  int status = 0;
  waitpid(child, &status, 0);
}

// This process's RLIMIT_NICE soft limit as the legend shows it ("0": no nice below 20 - 0).
std::string rlimit_nice_text() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NICE, &limit) != 0) return "unknown";
  return limit.rlim_cur == RLIM_INFINITY ? "unlimited" : std::to_string(limit.rlim_cur);
}

void print_busy_legend(int spinner_cpus, bool with_unprivileged) {
  std::printf(
      "  wall, CPU    as above; the spinners share the CPUs with the exiting thread, so inline, wall is above CPU\n"
      "  memory free  from the exit call until the flush returned and free memory was back (as above); / inline:\n"
      "               over the same user's async off row (1.00x: as soon as inline)\n"
      "  teardown CPU per exit (mean): the exiting thread's CPU time inline, the reaper's deferred (not the\n"
      "               waiters' share, when they helped)\n"
      "  spinners' share  the spinners' CPU time over what %d CPU(s) could give them (one per spinner, at most\n"
      "               the CPUs here), in the 200 ms before the exit / from the exit call until the teardown was\n"
      "               done; 100%% = they lost nothing; other load on the machine lowers both\n"
      "  rows         no boost: a nice-19 reaper that is never raised (boost_after = 0) gets about 1.5%% of a CPU\n"
      "               beside them; default: after 10 ms a waiting flush raises the reaper to the flushing\n"
      "               thread's nice until its queue is empty; where no raise can be in force (an ordinary\n"
      "               user's reaper keeps its creator's nice) the flush tears queued items down itself\n"
      "               (\"waiters help\")\n",
      spinner_cpus);
  if (with_unprivileged) {
    std::printf(
        "  root, uid 65534  this run's user, then the same rows as an ordinary user (uid 65534, no capabilities,\n"
        "               RLIMIT_NICE %s), in a child process that dropped root\n",
        rlimit_nice_text().c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<double> sizes_gib;
  int reps = 3;
  double poll_us = 1000;
  double poll_max_us = 128000;
  bool small = false;
  int busy = 0;
  const int cpus = usable_cpus();
  example::command_line cli(
      "exit_latency",
      "The exit-path latency of the model kernel on real memory: vm.async_mm_teardown off and on,\n"
      "a reaper that polls its queue, a lazy one, a process below the threshold and the\n"
      "compile-time-off build; with --busy, the same exit on a busy machine. Times in milliseconds;\n"
      "a legend under each table defines its columns.");
  cli.operands("SIZE_GIB", sizes_gib, example::at_least(1.0 / 64),
               "sizes to exit, in GiB (default 1; 0.0625 is 64 MiB), each capped at half of the free memory");
  cli.option("--reps", "N", reps, example::between(1, 1000),
             "exits per row, the table shows their medians; without --reps the poll, lazy and compiled-out rows "
             "exit once, to keep the run short");
  cli.option("--poll-interval", "US", poll_us, example::between(0.0, 1e6),
             "the polling reaper's interval in microseconds; 0 leaves its row out");
  cli.option("--poll-max", "US", poll_max_us, example::between(0.0, 1e7),
             "the lazy reaper's longest idle look in microseconds (poll_interval_max); 0 leaves its row out");
  cli.option("--busy", "N", busy, example::between(0, 1024),
             "adds the busy-machine rows, with N processes spinning at nice 0 (one per CPU here: " +
                 std::to_string(cpus) + "); they take about a minute; 0 leaves them out");
  cli.flag("--small", small, "64 MiB, one repetition (what ctest runs); SIZE_GIB and --reps still apply");
  bool busy_only = false;
  cli.flag("--busy-only", busy_only,
           "only the busy-machine rows of the first size, no header or legend (run as root, --busy runs them "
           "again this way as uid 65534)");
  cli.parse(argc, argv);
  if (small) {
    if (sizes_gib.empty()) sizes_gib = {1.0 / 16};
    if (!cli.given("--reps")) reps = 1;
  }
  // The poll, lazy and compiled-out rows illustrate; the async off/on rows are the measurement.
  const int side_reps = cli.given("--reps") ? reps : 1;
  if (sizes_gib.empty()) sizes_gib = {1};
  char poll_label[32];  // the interval as the table shows it: in ms, like every time in it
  std::snprintf(poll_label, sizeof poll_label, "%g ms", poll_us / 1e3);
  const double page = double(mm_system::page_size());
  const auto pages_of = [&](double gib) { return std::uint64_t(gib * double(1ull << 30) / page); };

  // The RFC raised max_pending_pages to 3/4 of RAM for its async runs, "so the measurements
  // exercise the reaper, not the backpressure fallback"; so do we.
  mm_system kernel({.async_mm_teardown = false, .max_pending_pages = mm_system::default_max_pending_pages() * 3});
  if (busy_only) {
    teardown::trace::add_hook<teardown::trace::reap_event>(&on_reap);
    measure_clock_reads();
    const double gib = std::min(sizes_gib.front(), free_memory() / 2 / double(1ull << 30));
    (void)run_busy_rows(kernel, pages_of(gib), reps, busy > 0 ? busy : cpus, user_label());
    return 0;
  }
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
  const double thresh_mib = double(kernel.thresh_pages()) * page / double(1 << 20);
  measure_clock_reads();

  const int small_reps = std::max(5, reps * 3);  // the 30 MiB rows: cheap, and their difference is small
  std::printf(
      "exit_latency: the model kernel on real memory (%d CPUs, %.1f GiB free, page %zu B); times in ms,\n"
      "  each the median of %d exit(s) (30 MiB: %d",
      cpus, free_memory() / double(1ull << 30), mm_system::page_size(), reps, small_reps);
  if (side_reps != reps) std::printf("; poll, lazy and compiled out: %d, as --reps was not given", side_reps);
  std::printf(")\n\n");
  std::printf("%-24s %19s %19s %9s %16s %16s %9s\n", "", "---- async off ----", "---- async on -----", "", "", "",
              "CPU");
  std::printf(table_format, "size", "wall", "CPU", "wall", "CPU", "reduction", "torn down", "memory free", "reaper/");
  std::printf(table_format, "", "", "", "", "", "", "off / on", "off / on", "inline");

  std::vector<double> lazy_start_delays;  // every lazy exit's, all sizes
  for (double gib : sizes_gib) {
    const double cap = free_memory() / 2 / double(1ull << 30);
    if (gib > cap) {
      std::printf("%-24s capped at half of the free memory: %.2f GiB\n", size_label(gib).c_str(), cap);
      gib = cap;
    }
    kernel.set_async_mm_teardown(false);
    const row_result off = run_row(kernel, pages_of(gib), reps, size_label(gib) + ", async off");
    kernel.set_async_mm_teardown(true);
    const row_result on = run_row(kernel, pages_of(gib), reps, size_label(gib) + ", async on");
    print_row(size_label(gib), off, on, /*with_off=*/true);
    if (poll_us > 0) {
      const row_result polled = run_row(polling, pages_of(gib), side_reps, size_label(gib) + ", async on, polling");
      print_row(size_label(gib) + ", poll " + poll_label, off, polled, /*with_off=*/false);
    }
    if (lazy_row) {
      const row_result lazed =
          run_row(*lazy, pages_of(gib), side_reps, size_label(gib) + ", async on, lazy", /*unhurried=*/true);
      lazy_start_delays.insert(lazy_start_delays.end(), lazed.start_delay_ms.begin(), lazed.start_delay_ms.end());
      print_row(size_label(gib) + ", " + lazy_label, off, lazed, /*with_off=*/false);
    }
  }

  // Below the threshold the feature must change nothing: both are the inline path.
  const double small_gib = 30.0 / 1024;
  kernel.set_async_mm_teardown(false);
  const row_result small_off = run_row(kernel, pages_of(small_gib), small_reps, "30 MiB, async off");
  kernel.set_async_mm_teardown(true);
  const row_result small_on = run_row(kernel, pages_of(small_gib), small_reps, "30 MiB, async on");
  std::printf("%-24s %9.3f %9.3f %9.3f %9.3f   both inline: on/off %+.1f%% (noise)\n", "30 MiB, below threshold",
              median(small_off.exit_ms), median(small_off.exit_cpu_ms), median(small_on.exit_ms),
              median(small_on.exit_cpu_ms), (median(small_on.exit_ms) / median(small_off.exit_ms) - 1) * 100);

  // The compile-time-off build: no reaper, no knob, no counters. It should match "async off".
  const double control_gib = std::min(sizes_gib.front(), free_memory() / 2 / double(1ull << 30));
  const row_result control = run_row(compiled_out, pages_of(control_gib), side_reps, "compile-time off");
  std::printf("%-24s %9.2f %9.2f %9s %9s   const_key<false>: the deferred path compiled out\n",
              (size_label(control_gib) + ", compiled out").c_str(), median(control.exit_ms),
              median(control.exit_cpu_ms), "-", "-");

  std::printf(
      "\n  wall, CPU    the exit path: the exiting thread's last mmput (mmput_exit), its wall-clock time and that\n"
      "               thread's CPU time in the call (CLOCK_THREAD_CPUTIME_ID), each less what reading the clocks\n"
      "               costs here (%.2f and %.2f us). Wall above CPU by more than a microsecond: the thread was\n"
      "               preempted (on a busy machine, e.g. in the reaper's futex wake): load, not the library's work\n"
      "  reduction    async off wall / this row's async on wall\n"
      "  torn down    from the exit call until the teardown was done (pages unmapped), async off / async on\n"
      "  memory free  from the exit call until free memory (MemAvailable + per-CPU free lists) was back, within\n"
      "               64 MiB or a tenth of the size, async off / async on; n/a: not within 10 s (other load)\n"
      "  CPU reaper/inline  the reaper's CPU time per teardown (from the exit until done) over the exiting\n"
      "               thread's per teardown inline, means over the exits: a ratio, 1.00 = the same work\n"
      "  rows         async off: torn down on the exiting thread; async on: queued to the mm_reaper (nice 19),\n"
      "               which the exit wakes (a futex wake); poll: a reaper that looks at its queue at that interval,\n"
      "               so the exit makes no wake; lazy: its idle looks back off to the longer interval and nobody\n"
      "               hurries its exits; below threshold: under %.0f MiB, inline either way; compiled out:\n"
      "               basic_mm_system<const_key<false>>, the kernel's CONFIG=n, which should match async off\n",
      empty_wall_ms * 1e3, empty_cpu_ms * 1e3, thresh_mib);

  // The idle price of the polling and the lazy reaper, over the same second: by now (the two rows
  // above took a while) the lazy reaper's looks have backed off to their longest.
  if (poll_us > 0 || lazy_row) {
    const teardown::reaper_stats poll_before = polling.stats().reaper;
    const teardown::reaper_stats lazy_before = lazy_row ? lazy->stats().reaper : teardown::reaper_stats{};
    const auto idle_start = clock_type::now();
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const teardown::reaper_stats poll_after = polling.stats().reaper;
    const teardown::reaper_stats lazy_after = lazy_row ? lazy->stats().reaper : teardown::reaper_stats{};
    const double seconds = ms_between(idle_start, clock_type::now()) / 1e3;
    std::printf("\nidle reapers, over the same second (CPU time per second of wall time; 10 ms/s is 1%% of a CPU):\n");
    if (poll_us > 0) {
      std::printf(
          "  poll %-8s %.2f ms/s CPU, %.0f timed wake-ups/s; a teardown starts up to %s after the exit; its\n"
          "%15s exits made %llu futex wakes\n",
          poll_label, double(poll_after.worker_cpu_ns - poll_before.worker_cpu_ns) / 1e6 / seconds,
          double(poll_after.polls - poll_before.polls) / seconds, poll_label, "",
          (unsigned long long)poll_after.wakeups);
    }
    if (lazy_row) {
      std::printf(
          "  %-13s %.3f ms/s CPU, %.1f timed wake-ups/s; its teardowns started %.2f ms (median; max %.2f)\n"
          "%15s after the exit, at most %g ms; its exits made %llu futex wakes\n",
          lazy_label, double(lazy_after.worker_cpu_ns - lazy_before.worker_cpu_ns) / 1e6 / seconds,
          double(lazy_after.polls - lazy_before.polls) / seconds, median(lazy_start_delays),
          *std::max_element(lazy_start_delays.begin(), lazy_start_delays.end()), "", poll_max_us / 1e3,
          (unsigned long long)lazy_after.wakeups);
    }
  }

  if (busy > 0) {
    const std::uint64_t pages = pages_of(control_gib);
    std::printf("\nbusy machine: %d process%s spinning at nice 0 on %d CPUs, %s, medians of %d exit(s), in ms\n",
                busy, busy == 1 ? "" : "es", cpus, size_label(control_gib).c_str(), reps);
    print_busy_header();
    const int spinner_cpus = run_busy_rows(kernel, pages, reps, busy, user_label());
    // Root's rows say what a privileged process gets; most users are not root: the same rows
    // again as an ordinary user (uid 65534, no capabilities), in a child that runs only them.
    const bool also_unprivileged = geteuid() == 0;
    if (also_unprivileged) rerun_busy_rows_unprivileged(argv[0], control_gib, reps, busy);
    print_busy_legend(spinner_cpus, also_unprivileged);
  }

  const teardown::model::vmstat v = kernel.vmstat();
  std::printf(
      "\nvmstat (the async off/on kernel, all its exits): queued to the reaper %llu, torn down inline (sync)"
      " %llu,\n  of which refused by the budget (rejected) %llu; reaped %llu; pending %llu pages\n",
      (unsigned long long)v.queued, (unsigned long long)v.sync, (unsigned long long)v.rejected,
      (unsigned long long)v.reaped, (unsigned long long)v.pending_pages);
  if (busy == 0) {
    std::printf(
        "\nThe busy-machine rows are left out (they take about a minute): `exit_latency --busy %d`\n"
        "  (or scripts/demo.sh --busy %d) adds the same exit with %d processes spinning at nice 0.\n",
        cpus, cpus, cpus);
  }
  std::printf(
      "\nPublished, not measured by this run: the mm_reaper Linux patch series' cover letter, on bare metal\n"
      "  with 32 CPUs (kill -> waitpid of a real process): 1 GB 18.01 -> 0.14 ms (128x),\n"
      "  30 MB 0.56 -> 0.60 ms, CPU reaper/inline 1.18.\n");
  return 0;
}
