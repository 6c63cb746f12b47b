// alloc_matrix — deferred teardown under the allocator the process runs with (glibc's, or one
// LD_PRELOADed: jemalloc, tcmalloc, mimalloc; benchmarks/scripts/alloc_matrix.py runs this
// program once per allocator). For three shapes of garbage, freed inline (plain delete), handed
// off (the same deletes posted to one plain thread at nice 19, no library: the limit of any
// deferral, since what a free costs off the allocating thread is the allocator's) and deferred
// (teardown::deferred_delete on the default domain: the library's default options, whatever
// its trim does when run), it measures the free path on the caller, the resident set
// left after the flush and the library's trim, the peak resident set over rounds of build and
// free with no flush between, and the CPU the frees took (the caller's inline, the reaper's
// deferred). A crossover sweep times the free path per object for buffers of 4 KiB to 64 MiB,
// inline against deferred (a domain whose threshold is 0, so that every buffer is queued): the
// size below which deferring loses says where each allocator's default threshold (and
// cached_below) should be (allocator_tuning.hpp); a node sweep does the same for objects of 1
// to 1024 blocks of 64 bytes (min_blocks).
// A plain program, not Google Benchmark; each case runs in a fresh child (an untouched heap).
//
//   alloc_matrix [--allocator NAME] [--scale S] [--rounds N] [--shapes LIST] [--trim LIST]
//                [--sweep-reps N] [--no-sweep] [--no-matrix] [--json FILE] [--quick]
//     --allocator NAME  the name the rows carry (default: the one detected, see below); the
//                       program says so when the detected allocator is another
//     --scale S         multiplies every shape (default 1: a 1 GiB vector, 4 M map entries,
//                       10,000 buffers of 100 KiB) and the sweep's 64 MiB per child
//     --rounds N        build/free rounds per case (default 10)
//     --shapes LIST     of vector,map,buffers (default all three)
//     --trim LIST       the deferred modes, each a row (default: default):
//                         default      the library's default options (the default domain)
//                         off          the same, trim.after = 0 (no trim)
//                         malloc_trim, jemalloc, tcmalloc, mimalloc
//                                      default options but this purge as trim.trim: glibc's
//                                      malloc_trim(0) (whatever serves malloc: the library's
//                                      default before it detected the allocator),
//                                      mallctl("thread.tcache.flush") + ("arena.4096.purge"),
//                                      MallocExtension_MarkThreadIdle() +
//                                      MallocExtension_ReleaseFreeMemory(), mi_collect(true)
//                         native       the purge of the allocator detected at run time
//                       Two that name the same purge (native and malloc_trim under glibc) run
//                       once, as the first.
//                       (the explicit ones on a domain of default_options() that shares the
//                       default domain's worker thread: only the trim function differs)
//     --sweep-reps N    children per size and mode in the sweep (default 3; 3 timed rounds each)
//     --no-sweep, --no-matrix   leave that part out
//     --json FILE       write the JSON there (default: stdout); --out FILE is the same
//     --quick           a smoke test: --scale 0.0625 --rounds 3 --sweep-reps 1, sweep 4/64/1024 KiB
//
// The allocator is detected by the symbols the process resolves (dlsym(RTLD_DEFAULT)): mallctl
// (jemalloc), MallocExtension_ReleaseFreeMemory (tcmalloc), mi_collect (mimalloc), else glibc.
//
// Matrix, per shape and mode, in a fresh child: RSS at the start (statm); the peak reset
// (/proc/self/clear_refs 5); N rounds of build (every page written) and free; then the flush
// (deferred), a wait of up to 300 ms for a trim that ends after the flush, 20 ms, and the RSS
// again. Rows: free_ms (median/min/max over the rounds: the caller's free path), garbage_mib
// (what round 1's build added to the RSS), rss_after_mib (RSS after, less the start),
// rss_limit_mib (5% of garbage + 16 MiB: the goal), peak_mib (VmHWM over the rounds, or the
// highest RSS read after a build where clear_refs is refused), caller_cpu_ms (the caller's CPU
// in its free paths, all rounds), worker_cpu_ms (the reaper's CPU across the rounds, the flush
// and the trims; handed off: the plain thread's), cpu_ms (worker_cpu_ms + caller_cpu_ms), trims,
// trimmed_mib, trim_cpu_ms, flush_ms, handed_over, queued and the domain's inline frees by reason
// (inline_stalled: the stall watchdog; inline_rejected: the budget; inline_other).
// Sweep, per size and mode: `--sweep-reps` children, each frees a warm-up round (timed as
// cold_ns_per_object: the child's first frees of that size) then 3 timed rounds (the allocator's
// steady state: glibc's mmap threshold raised, caches filled) of count = 64 MiB / size (32 to
// 16384) buffers; ns_per_object (median/min/max), cold_ns_per_object (over the children).
//
// JSON: {"benchmark": "alloc_matrix", "machine": {...}, "config": {...}, "rows": [
//          {"part": "matrix", "allocator", "shape", "mode", "trim", ...the figures above},
//          {"part": "sweep", "allocator", "size_kib", "mode", "objects", "ns_per_object"}]}
#include <dlfcn.h>
#include <fcntl.h>
#include <malloc.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "teardown/allocator_trim.hpp"
#include "teardown/deferred.hpp"

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

constexpr int kMaxRounds = 64;
constexpr double kMiB = 1 << 20;

// ---- the allocator and its purge ----------------------------------------------------------

void* symbol(const char* name) { return dlsym(RTLD_DEFAULT, name); }

using mallctl_fn = int (*)(const char*, void*, std::size_t*, void*, std::size_t);
using release_fn = void (*)();
using collect_fn = void (*)(bool);

const char* detected_allocator() {
  if (symbol("mallctl") != nullptr) return "jemalloc";
  if (symbol("MallocExtension_ReleaseFreeMemory") != nullptr) return "tcmalloc";
  if (symbol("mi_collect") != nullptr) return "mimalloc";
  return "glibc";
}

// The purges, as trim_options::trim functions. Each resolves its symbol when called: a name
// picked on the command line is checked first (trim_function), so none is missing here.
// jemalloc and tcmalloc first hand the calling thread's cache (the reaper's: it did the frees)
// back to the arenas, then purge them. 4096 is MALLCTL_ARENAS_ALL.
int jemalloc_purge(std::size_t) {
  static const auto mallctl = reinterpret_cast<mallctl_fn>(symbol("mallctl"));
  if (mallctl == nullptr) return 0;
  (void)mallctl("thread.tcache.flush", nullptr, nullptr, nullptr, 0);
  return mallctl("arena.4096.purge", nullptr, nullptr, nullptr, 0) == 0 ? 1 : 0;
}
int tcmalloc_release(std::size_t) {
  static const auto idle = reinterpret_cast<release_fn>(symbol("MallocExtension_MarkThreadIdle"));
  static const auto release = reinterpret_cast<release_fn>(symbol("MallocExtension_ReleaseFreeMemory"));
  if (idle != nullptr) idle();
  if (release != nullptr) release();
  return 1;
}
int mimalloc_collect(std::size_t) {
  static const auto collect = reinterpret_cast<collect_fn>(symbol("mi_collect"));
  if (collect != nullptr) collect(true);
  return 1;
}
int glibc_malloc_trim(std::size_t pad) { return malloc_trim(pad); }

struct trim_choice {
  std::string name;              // as given: default, off, malloc_trim, jemalloc, ..., native
  std::string resolved;          // native: the purge it stands for
  int (*fn)(std::size_t) = nullptr;  // null: the default domain as it is (default) or no trim (off)
};

// ---- options ------------------------------------------------------------------------------

struct options {
  std::string allocator;
  double scale = 1;
  int rounds = 10;
  std::vector<std::string> shapes{"vector", "map", "buffers"};
  std::vector<trim_choice> trims;
  int sweep_reps = 3;
  std::vector<int> sweep_kib{4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384, 65536};
  std::vector<int> sweep_nodes{1, 4, 16, 64, 256, 1024};  // the node sweep: blocks of 64 bytes
  bool sweep = true;
  bool matrix = true;
  bool quick = false;
  std::string json;
};

constexpr const char* kUsage =
    "usage: alloc_matrix [--allocator NAME] [--scale S] [--rounds N] [--shapes LIST] [--trim LIST]\n"
    "                    [--sweep-reps N] [--sweep-sizes L] [--sweep-nodes L] [--no-sweep] [--no-matrix]\n"
    "                    [--json FILE] [--quick]\n"
    "  --allocator NAME  the rows' allocator name (default: the one detected)\n"
    "  --scale S         multiplies every shape: 1 GiB vector, 4 M map entries, 10,000 x 100 KiB (default 1)\n"
    "  --rounds N        build/free rounds per case, no flush between (default 10, at most 64)\n"
    "  --shapes LIST     of vector,map,buffers (default all)\n"
    "  --trim LIST       deferred modes: default (the library's default options), off, malloc_trim,\n"
    "                    jemalloc, tcmalloc, mimalloc, native (the detected allocator's purge); default: default\n"
    "  --sweep-reps N    crossover sweep: children per size and mode (default 3)\n"
    "  --sweep-sizes L   the size sweep's buffer sizes in KiB (default 4,8,...,1024,4096,16384,65536)\n"
    "  --sweep-nodes L   the node sweep's blocks per object (default 1,4,16,64,256,1024)\n"
    "  --no-sweep        no crossover sweep; --no-matrix: the sweep only\n"
    "  --json FILE       write the JSON there (default: stdout); --out FILE is the same\n"
    "  --quick           --scale 0.0625 --rounds 3 --sweep-reps 1, sweep 4/64/1024 KiB (explicit flags win)\n";

constexpr teardown_bench::command_line kCommandLine{"alloc_matrix", kUsage};

trim_choice trim_function(const std::string& name) {
  trim_choice c{name, name, nullptr};
  std::string purge = name;
  if (name == "native") {
    const std::string allocator = detected_allocator();
    purge = allocator == "glibc" ? "malloc_trim" : allocator;
    c.resolved = purge;
  }
  if (name == "default" || name == "off") return c;
  if (purge == "malloc_trim") {
    c.fn = &glibc_malloc_trim;
  } else if (purge == "jemalloc") {
    if (symbol("mallctl") == nullptr) kCommandLine.usage_error("--trim jemalloc: no mallctl in this process");
    c.fn = &jemalloc_purge;
  } else if (purge == "tcmalloc") {
    if (symbol("MallocExtension_ReleaseFreeMemory") == nullptr)
      kCommandLine.usage_error("--trim tcmalloc: no MallocExtension_ReleaseFreeMemory in this process");
    c.fn = &tcmalloc_release;
  } else if (purge == "mimalloc") {
    if (symbol("mi_collect") == nullptr) kCommandLine.usage_error("--trim mimalloc: no mi_collect in this process");
    c.fn = &mimalloc_collect;
  } else {
    kCommandLine.usage_error("--trim: unknown \"" + name + "\"");
  }
  return c;
}

options parse_options(int argc, char** argv) {
  options opts;
  const auto given = kCommandLine.parse(argc, argv, {"--quick", "--no-sweep", "--no-matrix"});
  opts.quick = given.has("--quick");
  opts.sweep = !given.has("--no-sweep");
  opts.matrix = !given.has("--no-matrix");
  if (opts.quick) {
    opts.scale = 0.0625;
    opts.rounds = 3;
    opts.sweep_reps = 1;
    opts.sweep_kib = {4, 64, 1024};
    opts.sweep_nodes = {1, 64};
  }
  std::vector<std::string> trims{"default"};
  for (const auto& [name, value] : given.flags) {
    if (name == "--allocator") {
      opts.allocator = value;
    } else if (name == "--scale") {
      opts.scale = kCommandLine.positive(name, value);
    } else if (name == "--rounds") {
      opts.rounds = kCommandLine.count(name, value, kMaxRounds);
    } else if (name == "--shapes") {
      opts.shapes = teardown_bench::split_list(value);
      for (const std::string& s : opts.shapes) {
        if (s != "vector" && s != "map" && s != "buffers") kCommandLine.usage_error("--shapes: unknown \"" + s + "\"");
      }
    } else if (name == "--trim") {
      trims = teardown_bench::split_list(value);
    } else if (name == "--sweep-reps") {
      opts.sweep_reps = kCommandLine.count(name, value, 100);
    } else if (name == "--sweep-sizes" || name == "--sweep-nodes") {
      std::vector<int>& list = name == "--sweep-sizes" ? opts.sweep_kib : opts.sweep_nodes;
      list.clear();
      for (const std::string& item : teardown_bench::split_list(value)) {
        list.push_back(kCommandLine.count(name, item, name == "--sweep-sizes" ? 1 << 20 : 1 << 16));
      }
    } else if (name == "--json" || name == "--out") {
      opts.json = value;
    } else {
      kCommandLine.usage_error("unknown flag " + name);
    }
  }
  for (const std::string& t : trims) {
    trim_choice c = trim_function(t);
    const bool same = std::any_of(opts.trims.begin(), opts.trims.end(), [&](const trim_choice& o) {
      return o.name == c.name || (c.fn != nullptr && o.fn == c.fn);
    });
    if (!same) opts.trims.push_back(std::move(c));
  }
  if (opts.allocator.empty()) opts.allocator = detected_allocator();
  return opts;
}

// ---- memory readings ----------------------------------------------------------------------

double resident_mib() { return static_cast<double>(teardown::detail::resident_bytes()) / kMiB; }

// Resets the peak resident set (VmHWM) to the current one; false where the kernel refuses.
bool reset_peak() {
  const int fd = open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = write(fd, "5", 1) == 1;
  close(fd);
  return ok;
}

// VmHWM in MiB, NaN if unreadable.
double peak_mib() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return NAN;
  char line[256];
  double kib = NAN;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, "VmHWM:", 6) == 0) kib = std::strtod(line + 6, nullptr);
  }
  std::fclose(f);
  return kib / 1024;
}

// ---- the shapes ---------------------------------------------------------------------------

// The limit of any deferral: the same deletes on one plain thread, no library (a locked
// vector of deletes, no budget, no trim, nothing inline), at the reaper's nice 19. What the
// allocator charges for a free on a thread other than the one that allocated is in its CPU;
// the library's worker CPU over this one is what the library adds.
class handoff_thread {
 public:
  handoff_thread() : thread_([this] { run(); }) {}
  handoff_thread(const handoff_thread&) = delete;
  handoff_thread& operator=(const handoff_thread&) = delete;
  ~handoff_thread() {
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }

  void post(std::function<void()> free) {
    {
      const std::lock_guard lock(mutex_);
      posted_.push_back(std::move(free));
    }
    changed_.notify_all();
  }

  // Waits until every delete posted so far has run; the thread's CPU so far.
  double drain_and_cpu_ms() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return posted_.empty() && !busy_; });
    return cpu_ms_;
  }

 private:
  void run() {
    (void)setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 19);
    std::unique_lock lock(mutex_);
    for (;;) {
      changed_.wait(lock, [&] { return stopping_ || !posted_.empty(); });
      if (posted_.empty()) return;
      std::vector<std::function<void()>> batch;
      batch.swap(posted_);
      busy_ = true;
      lock.unlock();
      for (std::function<void()>& free : batch) free();
      batch.clear();
      lock.lock();
      busy_ = false;
      cpu_ms_ = thread_cpu_ms();
      changed_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::function<void()>> posted_;
  bool busy_ = false;
  bool stopping_ = false;
  double cpu_ms_ = 0;
  std::thread thread_;  // last: starts once the rest is built
};

// How a case frees: inline (plain delete), handed to a plain thread, through the default
// domain (deferred_delete), or through a domain of its own (deferred_deleter naming it).
struct free_path {
  bool deferred = false;
  teardown::deferred_domain* domain = nullptr;  // null: the default domain
  handoff_thread* handoff = nullptr;            // set: posted there (deferred is false)

  template <class T>
  void operator()(T* object) const noexcept {
    if (handoff != nullptr) {
      handoff->post([object] { delete object; });
    } else if (!deferred) {
      delete object;
    } else if (domain == nullptr) {
      (void)teardown::deferred_delete(object);
    } else {
      teardown::deferred_deleter<T>{*domain}(object);
    }
  }
};

template <class T>
using owned = std::unique_ptr<T, free_path>;

using big_map = std::unordered_map<std::uint64_t, std::string>;
using buffer = std::vector<char>;

struct shape_sizes {
  std::size_t vector_bytes;
  std::size_t map_entries;
  std::size_t buffers;
  std::size_t buffer_bytes = std::size_t{100} << 10;
};

shape_sizes sizes_for(double scale) {
  return {static_cast<std::size_t>(scale * static_cast<double>(std::size_t{1} << 30)) & ~std::size_t{4095},
          std::max<std::size_t>(1, static_cast<std::size_t>(scale * 4'000'000)),
          std::max<std::size_t>(1, static_cast<std::size_t>(scale * 10'000))};
}

// One round's garbage of a shape, built (every page written); free() frees it on the caller's
// path (timed by the caller) and says how many objects were handed over.
class garbage {
 public:
  garbage(const std::string& shape, const shape_sizes& sizes, free_path path) : path_(path) {
    if (shape == "vector") {
      vector_ = owned<buffer>(new buffer(sizes.vector_bytes, 'x'), path);
    } else if (shape == "map") {
      map_ = owned<big_map>(new big_map, path);
      map_->reserve(sizes.map_entries);
      for (std::size_t i = 0; i < sizes.map_entries; ++i) {
        // 32 characters: beyond the short-string buffer, so every value is a heap block too.
        map_->emplace(i, std::string(32, static_cast<char>('a' + i % 26)));
      }
    } else {
      buffers_.reserve(sizes.buffers);
      for (std::size_t i = 0; i < sizes.buffers; ++i) {
        buffers_.emplace_back(new buffer(sizes.buffer_bytes, 'x'), path);
      }
    }
  }

  std::size_t free() {
    if (vector_ || map_) {
      vector_.reset();
      map_.reset();
      return 1;
    }
    const std::size_t n = buffers_.size();
    for (owned<buffer>& b : buffers_) b.reset();
    // The array that held them too: under glibc its free can be the one that merges the freed
    // buffers into the heap's top and gives them back (brk), which belongs to the free path.
    std::vector<owned<buffer>>().swap(buffers_);
    return n;
  }

 private:
  free_path path_;
  owned<buffer> vector_{nullptr, free_path{}};
  owned<big_map> map_{nullptr, free_path{}};
  std::vector<owned<buffer>> buffers_;
};

// ---- a matrix case, in a child ------------------------------------------------------------

struct case_report {
  int rounds = 0;
  double free_ms[kMaxRounds] = {};
  double start_mib = 0;
  double garbage_mib = 0;
  double rss_after_mib = 0;
  double peak_mib = 0;
  bool peak_is_hwm = false;
  double caller_cpu_ms = 0;
  double worker_cpu_ms = 0;
  double flush_ms = 0;
  std::uint64_t trims = 0;
  double trimmed_mib = 0;
  double trim_cpu_ms = 0;
  std::uint64_t queued = 0;
  std::uint64_t handed = 0;
  std::uint64_t inline_stalled = 0;   // freed inline by the domain: the stall watchdog
  std::uint64_t inline_rejected = 0;  //   the budget full
  std::uint64_t inline_other = 0;     //   any other reason
  char failed[160] = {};
};

// The domain a deferred case frees through: null (the default domain) for "default"; else one
// of default_options() on the default domain's worker with this trim.
std::unique_ptr<teardown::deferred_domain> domain_for(const trim_choice& trim) {
  if (trim.name == "default") return nullptr;
  teardown::deferred_domain_options opts = teardown::deferred_domain::default_options();
  opts.worker = teardown::deferred::default_worker();
  if (trim.fn == nullptr) {
    opts.trim.after = 0;
  } else {
    opts.trim.trim = trim.fn;
  }
  return std::make_unique<teardown::deferred_domain>(std::move(opts));
}

// A case's free path: inline, handed to a plain thread, or deferred with `trim`.
struct case_mode {
  enum { inline_free, handoff, deferred } kind = inline_free;
  const trim_choice* trim = nullptr;  // deferred only
};

case_report run_case(const std::string& shape, const shape_sizes& sizes, int rounds, case_mode mode) {
  case_report r;
  const trim_choice* const trim = mode.kind == case_mode::deferred ? mode.trim : nullptr;
  std::unique_ptr<teardown::deferred_domain> own;
  std::unique_ptr<handoff_thread> handoff;
  teardown::deferred_domain* stats_domain = nullptr;
  free_path path;
  if (mode.kind == case_mode::handoff) {
    handoff = std::make_unique<handoff_thread>();
    path.handoff = handoff.get();
  }
  if (trim != nullptr) {
    own = domain_for(*trim);
    path = {true, own.get()};
    stats_domain = own ? own.get() : &teardown::deferred::default_domain();  // starts the worker
  }
  const teardown::deferred_stats before = stats_domain ? stats_domain->stats() : teardown::deferred_stats{};
  const double worker_before =
      stats_domain ? static_cast<double>(stats_domain->worker_stats().worker_cpu_ns) / 1e6 : 0.0;
  r.start_mib = resident_mib();
  r.peak_is_hwm = reset_peak();
  double highest = r.start_mib;
  r.rounds = rounds;
  for (int round = 0; round < rounds; ++round) {
    garbage g(shape, sizes, path);
    const double built = resident_mib();
    highest = std::max(highest, built);
    if (round == 0) r.garbage_mib = built - r.start_mib;
    const double cpu = thread_cpu_ms();
    const auto start = clock_type::now();
    r.handed += g.free();
    r.free_ms[round] = ms_between(start, clock_type::now());
    r.caller_cpu_ms += thread_cpu_ms() - cpu;
  }
  r.peak_mib = r.peak_is_hwm ? peak_mib() : highest;
  if (handoff != nullptr) {
    const auto flush_start = clock_type::now();
    r.worker_cpu_ms = handoff->drain_and_cpu_ms();
    r.flush_ms = ms_between(flush_start, clock_type::now());
  }
  if (stats_domain != nullptr) {
    const auto flush_start = clock_type::now();
    stats_domain->flush();
    r.flush_ms = ms_between(flush_start, clock_type::now());
    // A trim runs after its batch's last delete, so it may end after the flush: wait for one
    // (bounded; none comes when none was due, or the trim is off).
    const std::uint64_t trims_at_flush = stats_domain->stats().trim.trims;
    const auto give_up = clock_type::now() + std::chrono::milliseconds(300);
    const bool trims_on = trim == nullptr || trim->name != "off";
    while (trims_on && stats_domain->stats().trim.trims == trims_at_flush && clock_type::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  r.rss_after_mib = resident_mib() - r.start_mib;
  if (stats_domain != nullptr) {
    const teardown::deferred_stats s = stats_domain->stats();
    r.worker_cpu_ms = static_cast<double>(stats_domain->worker_stats().worker_cpu_ns) / 1e6 - worker_before;
    r.trims = s.trim.trims - before.trim.trims;
    r.trimmed_mib = static_cast<double>(s.trim.trimmed_bytes - before.trim.trimmed_bytes) / kMiB;
    r.trim_cpu_ms = static_cast<double>(s.trim.trim_cpu_ns - before.trim.trim_cpu_ns) / 1e6;
    r.queued = s.queued - before.queued;
    r.inline_stalled = s.inline_stalled - before.inline_stalled;
    r.inline_rejected = s.inline_rejected - before.inline_rejected;
    r.inline_other = s.inline_total - before.inline_total - r.inline_stalled - r.inline_rejected;
  }
  return r;
}

// Runs `work` in a fresh child of this process and returns the Report it writes back.
template <class Report, class Work>
Report in_child(Work work) {
  return teardown_bench::in_child<Report>(work, 600'000);
}

// ---- a sweep case, in a child -------------------------------------------------------------

constexpr int kSweepRounds = 3;

struct sweep_report {
  std::size_t objects = 0;
  double cold_ns_per_object = 0;  // the warm-up round: the child's first frees of this size
  double ns_per_object[kSweepRounds] = {};
  char failed[160] = {};
};

// 64 MiB of objects per round (scaled), 32 to 16384 of them; from 4 MiB up, at least 8.
std::size_t sweep_count(std::size_t bytes, double scale) {
  const double total = scale * 64 * kMiB;
  const std::size_t fewest = bytes >= 4 * kMiB ? 8 : 32;
  return std::clamp<std::size_t>(static_cast<std::size_t>(total / static_cast<double>(bytes)), fewest, 16384);
}

// The node sweep's object: `nodes` separately allocated blocks of 64 bytes behind one vector
// (the cost lookup counts the vector's own bytes, not the blocks': well under any threshold).
using node_block = std::unique_ptr<char[]>;
using node_object = std::vector<node_block>;
constexpr std::size_t kNodeBytes = 64;

node_object* make_nodes(std::size_t nodes) {
  auto* object = new node_object;
  object->reserve(nodes);
  for (std::size_t i = 0; i < nodes; ++i) {
    object->emplace_back(new char[kNodeBytes]);
    object->back()[0] = 'x';
  }
  return object;
}

// Per round, `count` objects of `nodes` blocks; 16 MiB of blocks per round (scaled), 32 to 16384 objects.
std::size_t node_sweep_count(std::size_t nodes, double scale) {
  const double total = scale * 16 * kMiB;
  return std::clamp<std::size_t>(static_cast<std::size_t>(total / static_cast<double>(nodes * kNodeBytes)), 32, 16384);
}

// One child of either sweep: `make(i)` builds object i, each round frees them all on the free
// path (timed), and a deferred one flushes between rounds.
template <class T, class Make>
sweep_report run_sweep_of(std::size_t count, bool deferred, Make make) {
  sweep_report r;
  r.objects = count;
  std::unique_ptr<teardown::deferred_domain> own;
  free_path path;
  if (deferred) {
    // The default options but the threshold: every object is queued, whatever its size.
    teardown::deferred_domain_options opts = teardown::deferred_domain::default_options();
    opts.worker = teardown::deferred::default_worker();
    opts.threshold = 0;
    opts.cached_below = 0;  // nor judged by its blocks
    own = std::make_unique<teardown::deferred_domain>(std::move(opts));
    path = {true, own.get()};
  }
  std::vector<owned<T>> buffers;
  buffers.reserve(count);
  for (int round = -1; round < kSweepRounds; ++round) {  // round -1: the untimed warm-up
    for (std::size_t i = 0; i < count; ++i) buffers.emplace_back(make(), path);
    const auto start = clock_type::now();
    for (owned<T>& b : buffers) b.reset();
    const double ms = ms_between(start, clock_type::now());
    buffers.clear();
    (round >= 0 ? r.ns_per_object[round] : r.cold_ns_per_object) = ms * 1e6 / static_cast<double>(count);
    if (own) own->flush();
  }
  if (own && own->stats().queued < count * (kSweepRounds + 1)) {
    std::snprintf(r.failed, sizeof r.failed, "only %llu of %zu objects were queued",
                  static_cast<unsigned long long>(own->stats().queued), count * (kSweepRounds + 1));
  }
  return r;
}

sweep_report run_sweep(std::size_t bytes, std::size_t count, bool deferred) {
  return run_sweep_of<buffer>(count, deferred, [bytes] { return new buffer(bytes, 'x'); });
}
sweep_report run_node_sweep(std::size_t nodes, std::size_t count, bool deferred) {
  return run_sweep_of<node_object>(count, deferred, [nodes] { return make_nodes(nodes); });
}

std::string mode_name(case_mode mode) {
  if (mode.kind == case_mode::inline_free) return "inline";
  if (mode.kind == case_mode::handoff) return "handoff";
  if (mode.trim->name == "default") return "deferred";
  return "deferred+" + mode.trim->name;
}

}  // namespace

int main(int argc, char** argv) {
  const options opts = parse_options(argc, argv);
  try {
    const std::string detected = detected_allocator();
    if (opts.allocator != detected) {
      progress("alloc_matrix: --allocator %s, but the process runs %s (by its symbols)\n", opts.allocator.c_str(),
               detected.c_str());
    }
    const shape_sizes sizes = sizes_for(opts.scale);
    const auto started = clock_type::now();
    std::vector<json_object> rows;
    std::vector<std::string> table;
    if (opts.matrix) {
      for (const std::string& shape : opts.shapes) {
        // Inline first, then the plain hand-off (the limit), then each deferred mode, so that the
        // modes of a shape run side by side.
        std::vector<case_mode> modes{{case_mode::inline_free}, {case_mode::handoff}};
        for (const trim_choice& t : opts.trims) modes.push_back({case_mode::deferred, &t});
        double inline_free = NAN;
        double inline_peak = NAN;
        double inline_cpu = NAN;
        double handoff_cpu = NAN;
        for (const case_mode mode : modes) {
          const std::string name = mode_name(mode);
          const trim_choice* const trim = mode.kind == case_mode::deferred ? mode.trim : nullptr;
          progress("%s %s %s: ", opts.allocator.c_str(), shape.c_str(), name.c_str());
          const case_report r = in_child<case_report>([&] { return run_case(shape, sizes, opts.rounds, mode); });
          const summary free_ms = summarize(std::vector<double>(r.free_ms, r.free_ms + r.rounds));
          const double limit = 0.05 * r.garbage_mib + 16;
          // The CPU the frees took: the caller's inline; handed over or deferred, the other
          // thread's and the caller's (its hand-overs, and what the domain freed inline after all).
          const double cpu = r.worker_cpu_ms + r.caller_cpu_ms;
          if (mode.kind == case_mode::inline_free) {
            inline_free = free_ms.median;
            inline_peak = r.peak_mib;
            inline_cpu = cpu;
          } else if (mode.kind == case_mode::handoff) {
            handoff_cpu = cpu;
          }
          const std::string queued =
              trim == nullptr ? std::string()
                              : strprintf(", %llu of %llu queued (inline: %llu stalled, %llu budget, %llu other)",
                                          static_cast<unsigned long long>(r.queued),
                                          static_cast<unsigned long long>(r.handed),
                                          static_cast<unsigned long long>(r.inline_stalled),
                                          static_cast<unsigned long long>(r.inline_rejected),
                                          static_cast<unsigned long long>(r.inline_other));
          progress("free %.3f ms, garbage %.0f MiB, RSS after %.0f MiB, peak %.0f MiB, CPU %.0f ms%s%s%s\n",
                   free_ms.median, r.garbage_mib, r.rss_after_mib, r.peak_mib, cpu, queued.c_str(),
                   r.failed[0] != '\0' ? ", failed: " : "", r.failed);
          json_object row;
          row.set("part", "matrix").set("allocator", opts.allocator).set("shape", shape).set("mode", name)
              .set("trim", trim == nullptr ? std::string("none") : trim->resolved).set("rounds", r.rounds)
              .set("objects_per_round", static_cast<std::uint64_t>(r.handed / std::max(1, r.rounds)))
              .set("free_ms", free_ms).set("start_mib", r.start_mib).set("garbage_mib", r.garbage_mib)
              .set("rss_after_mib", r.rss_after_mib).set("rss_limit_mib", limit).set("peak_mib", r.peak_mib)
              .set("peak_is_vmhwm", r.peak_is_hwm).set("caller_cpu_ms", r.caller_cpu_ms)
              .set("worker_cpu_ms", r.worker_cpu_ms).set("flush_ms", r.flush_ms).set("trims", r.trims)
              .set("trimmed_mib", r.trimmed_mib).set("trim_cpu_ms", r.trim_cpu_ms).set("cpu_ms", cpu)
              .set("handed_over", r.handed).set("queued", r.queued).set("inline_stalled", r.inline_stalled)
              .set("inline_rejected", r.inline_rejected).set("inline_other", r.inline_other);
          if (r.failed[0] != '\0') row.set("failed", r.failed);
          rows.push_back(std::move(row));
          const char* const columns =
              "%-8s %-8s %-20s %10.3f %8.2f %8.0f %8.0f %7.0f %8.0f %6.2f %8.0f %6.2f %6.2f %5llu";
          table.push_back(strprintf(columns, opts.allocator.c_str(), shape.c_str(), name.c_str(), free_ms.median,
                                    free_ms.median / inline_free, r.garbage_mib, r.rss_after_mib, limit, r.peak_mib,
                                    r.peak_mib / inline_peak, cpu, cpu / inline_cpu,
                                    mode.kind == case_mode::inline_free ? NAN : cpu / handoff_cpu,
                                    static_cast<unsigned long long>(r.trims)));
        }
      }
    }
    std::vector<std::string> sweep_table;
    std::vector<std::string> node_table;
    // One point of a sweep: children interleaved inline, deferred, inline...; `key` names the
    // point's variable in the rows ("size_kib" or "nodes").
    auto sweep_point = [&](const char* part, const char* key, int value, std::size_t count, auto run,
                           std::vector<std::string>& lines) {
      std::vector<double> warm[2];
      std::vector<double> cold[2];
      std::string failed;
      for (int rep = 0; rep < opts.sweep_reps; ++rep) {
        for (const bool deferred : {false, true}) {
          const sweep_report r = in_child<sweep_report>([&] { return run(count, deferred); });
          warm[deferred].insert(warm[deferred].end(), r.ns_per_object, r.ns_per_object + kSweepRounds);
          cold[deferred].push_back(r.cold_ns_per_object);
          if (r.failed[0] != '\0') failed = r.failed;
        }
      }
      const summary in = summarize(warm[0]);
      const summary de = summarize(warm[1]);
      const summary in_cold = summarize(cold[0]);
      const summary de_cold = summarize(cold[1]);
      progress("%s %s %s %d x %zu: warm inline %.0f ns, deferred %.0f ns; cold inline %.0f ns, deferred %.0f ns"
               " per object%s%s\n", opts.allocator.c_str(), part, key, value, count, in.median, de.median,
               in_cold.median, de_cold.median, failed.empty() ? "" : ", failed: ", failed.c_str());
      for (const bool deferred : {false, true}) {
        json_object row;
        row.set("part", part).set("allocator", opts.allocator).set(key, value)
            .set("mode", deferred ? "deferred" : "inline").set("objects", static_cast<std::uint64_t>(count))
            .set("ns_per_object", deferred ? de : in).set("cold_ns_per_object", deferred ? de_cold : in_cold);
        if (!failed.empty()) row.set("failed", failed);
        rows.push_back(std::move(row));
      }
      lines.push_back(strprintf("%-8s %8d %7zu %12.0f %8.0f %7.2f %12.0f %8.0f %7.2f", opts.allocator.c_str(), value,
                                count, in.median, de.median, de.median / in.median, in_cold.median, de_cold.median,
                                de_cold.median / in_cold.median));
    };
    if (opts.sweep) {
      for (const int kib : opts.sweep_kib) {
        const std::size_t bytes = static_cast<std::size_t>(kib) << 10;
        sweep_point("sweep", "size_kib", kib, sweep_count(bytes, opts.scale),
                    [bytes](std::size_t count, bool deferred) { return run_sweep(bytes, count, deferred); },
                    sweep_table);
      }
      for (const int nodes : opts.sweep_nodes) {
        const auto n = static_cast<std::size_t>(nodes);
        sweep_point("node_sweep", "nodes", nodes, node_sweep_count(n, opts.scale),
                    [n](std::size_t count, bool deferred) { return run_node_sweep(n, count, deferred); }, node_table);
      }
    }
    const double seconds = ms_between(started, clock_type::now()) / 1e3;
    json_object config;
    std::string trims;
    for (const trim_choice& t : opts.trims) trims += (trims.empty() ? "" : ",") + t.name;
    config.set("allocator", opts.allocator).set("allocator_detected", detected).set("scale", opts.scale)
        .set("rounds", opts.rounds).set("vector_bytes", static_cast<std::uint64_t>(sizes.vector_bytes))
        .set("map_entries", static_cast<std::uint64_t>(sizes.map_entries))
        .set("buffers", static_cast<std::uint64_t>(sizes.buffers))
        .set("buffer_bytes", static_cast<std::uint64_t>(sizes.buffer_bytes)).set("trims", trims)
        .set("sweep_reps", opts.sweep_reps).set("sweep_rounds_per_child", kSweepRounds).set("quick", opts.quick)
        .set("default_threshold", teardown::default_deferred_tuning().threshold)
        .set("default_min_blocks", teardown::default_deferred_tuning().min_blocks)
        .set("default_cached_below", teardown::default_deferred_tuning().cached_below)
        .set("default_trim_after", static_cast<std::uint64_t>(teardown::deferred_domain::default_trim_after))
        .set("ld_preload", std::getenv("LD_PRELOAD") != nullptr ? std::getenv("LD_PRELOAD") : "")
        .set("seconds", seconds);
    const std::string json =
        teardown_bench::rows_document("alloc_matrix", teardown_bench::machine_object(), config, rows);
    if (!teardown_bench::write_document("alloc_matrix", opts.json, json)) return 1;
    if (!table.empty()) {
      progress("\nalloc    shape    mode                 free ms  /inline  garbage RSS-aft   limit     peak  /inl"
               "   CPU ms  /inl /hand trims\n");
      for (const std::string& line : table) progress("%s\n", line.c_str());
    }
    if (!sweep_table.empty()) {
      progress("\nalloc    size KiB objects  warm: inline deferred def/inl  cold: inline deferred def/inl"
               " (ns/object)\n");
      for (const std::string& line : sweep_table) progress("%s\n", line.c_str());
    }
    if (!node_table.empty()) {
      progress("\nalloc       nodes objects  warm: inline deferred def/inl  cold: inline deferred def/inl"
               " (ns/object)\n");
      for (const std::string& line : node_table) progress("%s\n", line.c_str());
    }
    progress("%.0f s\n", seconds);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "alloc_matrix: %s\n", e.what());
    return 1;
  }
}
