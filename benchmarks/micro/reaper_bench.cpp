// reaper_bench — teardown::reaper against a condition-variable handoff and liburcu's call_rcu
// worker, all in one binary and one run: what enqueue costs the caller with the worker asleep
// and awake, how long a sleeping worker takes to start on an item, and how many trivial items
// a worker drains per second.
//
// The peers. Each is one worker thread fed by producers; each item is a 64-byte node
// (alignas(64)) that carries the hooks of all three.
//   reaper     teardown::reaper<node, &node::hook, fn>: enqueue()
//   condvar    std::mutex + reserved std::vector<node*>: push_back under the lock, and
//              notify_one after unlocking when the worker said it waits (a flag under the
//              lock); the worker swaps the vector out under the lock and tears down unlocked.
//              Optionally it polls a "has work" hint before waiting, as the reaper spins.
//   call_rcu   liburcu 0.13, urcu-memb flavour (the default liburcu): call_rcu() onto a
//              call_rcu_data of the run's own (create_call_rcu_data, set as the producing
//              thread's with set_thread_call_rcu_data; every producer thread is registered with
//              rcu_register_thread, as call_rcu requires). Its worker waits for a grace period
//              before running a batch, sleeps 10 ms after each wake-up (poll(NULL, 0, 10)) so as
//              to batch, and with URCU_CALL_RCU_RT never sleeps on its futex but polls every
//              10 ms, so that call_rcu never makes a syscall. It is the nearest C library with a
//              worker that frees items off the caller's path; the grace period is work the
//              reaper does not do.
//
// The cases.
//   enqueue_asleep/<peer>      the worker is asleep in the kernel before every enqueue: the
//                              producer waits until the previous item was torn down and the
//                              worker's /proc/self/task/<tid>/syscall names futex (the worker is
//                              blocked in FUTEX_WAIT), then enqueues into the empty queue. The
//                              reaper runs with spin_polls = 0, the condvar worker waits at once,
//                              call_rcu's worker is the default (non-RT) kind. Fixed sample
//                              counts (kAsleepSamples; call_rcu kAsleepSamplesCallRcu: each of
//                              its samples takes > 10 ms).
//     counters  p50_ns, p99_ns         the enqueue call, per call
//               wake_p50_ns, _p99_ns   from just before the enqueue call to the first
//                                      instruction of fn on the worker (the wake-to-start latency)
//               wakes_per_op           futex wakes the producer made per enqueue: the reaper's
//                                      stats().wakeups, the condvar's notify_one calls; call_rcu
//                                      does not say (benchmarks/scripts/syscalls.sh counts the
//                                      reaper's syscalls themselves)
//   enqueue_asleep_1ms/<peer>  the same, but the producer keeps busy for a further 1 ms once the
//                              worker sleeps, so that the worker's CPU has been idle that long
//                              (kAsleepIdleSamples samples). On a VM an idle vCPU is halted in
//                              the host, and waking it costs more the longer it has been idle.
//     <peer> = reaper (default options: nice 19), reaper_nice0 (nice = 0, as the condvar and
//     call_rcu workers run), condvar, call_rcu.
//   enqueue_awake/<peer>       the worker never sleeps and the producer streams: enqueues back
//                              to back from a pool of kPoolNodes recycled nodes. The reaper runs
//                              with spin_polls = UINT32_MAX (it polls between batches and never
//                              reaches the sleep), the condvar worker polls its hint likewise,
//                              call_rcu's worker is URCU_CALL_RCU_RT. p50_ns, p99_ns,
//                              wakes_per_op; the reaper also reports batches_per_op, the share
//                              of enqueues that found the queue empty (one batch each).
//   enqueue_awake_empty/<peer> the same awake workers, but each enqueue goes into an EMPTY queue:
//                              after each item the producer waits (spinning) until fn has run,
//                              then kSettleNs more so that the worker is done with the item and
//                              polling again. The costliest path that makes no syscall (the
//                              reaper's kick), and pickup_p50_ns / _p99_ns, from the enqueue to
//                              fn on a polling worker. Not for call_rcu: its RT worker looks only
//                              every 10 ms.
//   drain/<peer>               ThreadRange(1, hardware threads) producers, each streaming its
//                              own pool of kPoolNodes recycled nodes, with every peer as it ships
//                              (reaper: default options, spin_polls 256 and nice 19; condvar:
//                              waits at once; call_rcu: the default kind). A producer whose next
//                              node is still in flight waits (yields, then sleeps 20 us at a
//                              time), so the rate is the drain rate once the worker is the
//                              bottleneck. items_per_second = all producers' enqueues per wall
//                              second; pool_wait_share = the share of a producer's time spent
//                              waiting for a node (mean over producers): near 1, the worker (or,
//                              for call_rcu, its 10 ms batching with kPoolNodes in flight per
//                              producer) sets the rate; near 0, the producers do.
//                              drain/reaper_nice0 is the reaper with nice = 0, and
//                              drain/reaper_yield_50us the reaper with yield_after = 50 µs.
//                              drain/reaper_same_cpu and drain/reaper_apart pin 1 producer to
//                              CPU 0 and the worker to CPU 0 (sharing it) or to CPU 1: the two
//                              placements an unpinned run falls into (docs/benchmarks.md, "Drain
//                              rate"). drain/reaper_poll_1ms is the reaper with poll_interval =
//                              1 ms (producers never wake it).
//
// Trivial items: fn (or the callback) does only what the case needs: in the drain and stream
// cases it hands the node back to its producer (one release store); in the latency cases it
// reads the clock, notes the worker's thread id once, and counts.
//
// Per-call timing. Each enqueue is timed on its own: `lfence; rdtsc; lfence` before the call and
// `rdtscp; lfence` after it (x86-64; std::chrono::steady_clock elsewhere), into a preallocated
// vector (at most kMaxSamples per run, taken at an even stride beyond that). The clock's own
// cost, the median of 100001 empty start/stop pairs measured at startup, is subtracted from
// every sample (never below 0); ticks are converted to ns with a rate calibrated against
// steady_clock over 50 ms at startup. The resolution is the clock's: on the AMD Zen 4 guest of
// docs/benchmarks.md successive TSC reads differ by multiples of 26 ticks (10 ns), so the
// smallest figures come in 10 ns steps. The wake and pickup latencies compare a tick read on the
// producer with one read on the worker: the TSC is the kernel's clocksource here (it checks
// that it is synchronized across CPUs). The rate and the subtracted cost are in the JSON context
// and on stderr. The latency cases' Time column includes the waiting between calls and means
// nothing; their counters are the result. Only the drain cases' time is a throughput.
//
// After the console table the binary prints a summary: per peer the p50/p99 of each latency
// case with its p50's ratio to the condvar peer's, the drain rates with their ratio to the
// condvar peer's, and a goal line per acceptance goal (medians when repeated).
//
// --mode=syscalls[,K] runs no benchmark: it makes K (default 1000) enqueues with the worker
// awake and an empty queue, K back to back with the worker awake, and K each into an empty
// queue with the worker asleep, each enqueue between two marker syscalls (write(-1, ...), which
// fails with EBADF), and prints stats().wakeups per phase. Run it under strace -f; the script
// benchmarks/scripts/syscalls.sh does that and counts the producer's syscalls between the markers.
//
// Shared state of a case is built by thread 0 before the timed loop and torn down after it: the
// loop's start barrier (inside state.end()) orders the build before any thread's first use, and
// its stop barrier orders every thread's last enqueue before the teardown.
#include <benchmark/benchmark.h>

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "bench_support.hpp"
#include "teardown/reaper.hpp"

#ifndef TEARDOWN_BENCH_HAVE_CALL_RCU
#define TEARDOWN_BENCH_HAVE_CALL_RCU 0
#endif

#if TEARDOWN_BENCH_HAVE_CALL_RCU
// The library calls (urcu_memb_call_rcu and friends), not the inline LGPL versions: call_rcu
// has no inline version, and registration must go through the library anyway. Without
// URCU_API_MAP the header names only the urcu_memb_* symbols.
#include <urcu/urcu-memb.h>
#endif

namespace {

constexpr double kMinTimeSeconds = 0.2;
// Nodes per producer pool in the stream and drain cases: 16384 x 64 bytes = 1 MiB.
constexpr std::size_t kPoolNodes = std::size_t{1} << 14;
constexpr std::int64_t kAsleepSamples = 2000;
constexpr std::int64_t kAsleepSamplesCallRcu = 300;
// enqueue_asleep_1ms: how long the worker has been asleep (its CPU idle) before each enqueue.
constexpr std::uint64_t kIdleNs = 1'000'000;
constexpr std::int64_t kAsleepIdleSamples = 500;
// enqueue_awake_empty: how long the producer lets the worker finish an item (its bookkeeping
// after fn) before the next enqueue, so that the enqueue finds it polling an empty queue.
constexpr std::uint64_t kSettleNs = 5000;
constexpr std::size_t kMaxSamples = std::size_t{1} << 22;  // 32 MiB of samples at most per run

void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// ---- the clock ----

struct tick_clock {
#if defined(__x86_64__)
  static std::uint64_t start() noexcept {
    _mm_lfence();
    const std::uint64_t t = __rdtsc();
    _mm_lfence();
    return t;
  }
  static std::uint64_t stop() noexcept {
    unsigned aux;
    const std::uint64_t t = __rdtscp(&aux);
    _mm_lfence();
    return t;
  }
  static constexpr const char* name = "lfence;rdtsc;lfence ... rdtscp;lfence";
#else
  static std::uint64_t start() noexcept { return steady_ns(); }
  static std::uint64_t stop() noexcept { return steady_ns(); }
  static constexpr const char* name = "std::chrono::steady_clock";
#endif
  static std::uint64_t steady_ns() noexcept {
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                          std::chrono::steady_clock::now().time_since_epoch())
                                          .count());
  }

  // Set once by calibrate() before anything runs.
  static inline double ticks_per_ns = 1.0;
  static inline std::uint64_t overhead_ticks = 0;

  static void calibrate() {
    const std::uint64_t ns0 = steady_ns();
    const std::uint64_t t0 = start();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const std::uint64_t ns1 = steady_ns();
    const std::uint64_t t1 = start();
    ticks_per_ns = static_cast<double>(t1 - t0) / static_cast<double>(ns1 - ns0);
    if (!(ticks_per_ns > 0)) ticks_per_ns = 1.0;
    std::vector<std::uint64_t> empty(100001);
    for (std::uint64_t& e : empty) {
      const std::uint64_t a = start();
      const std::uint64_t b = stop();
      e = b - a;
    }
    std::nth_element(empty.begin(), empty.begin() + static_cast<std::ptrdiff_t>(empty.size() / 2),
                     empty.end());
    overhead_ticks = empty[empty.size() / 2];
  }

  // A timed interval in ns, less the clock's own cost.
  static double interval_ns(std::uint64_t from, std::uint64_t to) noexcept {
    const std::uint64_t ticks = to > from ? to - from : 0;
    return static_cast<double>(ticks > overhead_ticks ? ticks - overhead_ticks : 0) / ticks_per_ns;
  }
};

// Samples of one run, kept at an even stride once there are more than kMaxSamples.
class sample_set {
 public:
  explicit sample_set(std::int64_t expected) {
    const auto n = static_cast<std::size_t>(std::max<std::int64_t>(expected, 1));
    stride_ = (n + kMaxSamples - 1) / kMaxSamples;
    values_.reserve(std::min(n, kMaxSamples) + 1);
  }
  void add(double ns) {
    if (seen_++ % stride_ == 0 && values_.size() < values_.capacity()) values_.push_back(ns);
  }
  // The q-quantile (0 < q <= 1): the smallest sample with at least q of them at or below it.
  double quantile(double q) {
    if (values_.empty()) return 0;
    auto rank = static_cast<std::size_t>(q * static_cast<double>(values_.size()) + 0.999999);
    rank = std::clamp<std::size_t>(rank, 1, values_.size());
    std::nth_element(values_.begin(), values_.begin() + static_cast<std::ptrdiff_t>(rank - 1),
                     values_.end());
    return values_[rank - 1];
  }
  std::size_t size() const { return values_.size(); }

 private:
  std::vector<double> values_;
  std::size_t stride_ = 1;
  std::size_t seen_ = 0;
};

// ---- items ----

struct alignas(64) node {
  teardown::llist_node hook;
#if TEARDOWN_BENCH_HAVE_CALL_RCU
  rcu_head rcu{};
#endif
  // true from the producer's enqueue until the worker is done with the node.
  std::atomic<bool> in_flight{false};
};

// What fn does with a node, in the latency cases: note when it started, on which thread, and
// count. One case runs at a time, so one probe serves them all; reset() before each run.
struct alignas(64) probe_t {
  std::atomic<std::uint64_t> started_ticks{0};
  std::atomic<std::uint64_t> count{0};
  std::atomic<long> worker_tid{0};

  void reset() {
    started_ticks.store(0, std::memory_order_relaxed);
    count.store(0, std::memory_order_relaxed);
    worker_tid.store(0, std::memory_order_relaxed);
  }
};
probe_t probe;

struct record_start {
  static void run(node& /*n*/) noexcept {
    probe.started_ticks.store(tick_clock::start(), std::memory_order_relaxed);
    if (probe.worker_tid.load(std::memory_order_relaxed) == 0) {
      probe.worker_tid.store(syscall(SYS_gettid), std::memory_order_relaxed);
    }
    // release: the producer that sees the count sees started_ticks and worker_tid.
    probe.count.fetch_add(1, std::memory_order_release);
  }
};

// What fn does in the stream and drain cases: give the node back to its producer's pool.
struct hand_back {
  static void run(node& n) noexcept {
    // release: pairs with the acquire in node_pool::take; the worker's last reads of the node
    // happen before the producer rewrites it.
    n.in_flight.store(false, std::memory_order_release);
  }
};

class node_pool {
 public:
  node_pool() : nodes_(new node[kPoolNodes]) {}

  // The next node of the ring, once the worker has handed it back. Adds up the time waited.
  node& take() noexcept {
    node& n = nodes_[next_];
    next_ = (next_ + 1) & (kPoolNodes - 1);
    // acquire: pairs with the release in hand_back::run.
    if (n.in_flight.load(std::memory_order_acquire)) {
      const std::uint64_t since = tick_clock::steady_ns();
      for (unsigned spin = 0; n.in_flight.load(std::memory_order_acquire); ++spin) {
        if (spin < 64) {
          std::this_thread::yield();
        } else {
          // A worker at nice 19 may not get a CPU while producers yield to each other.
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
      }
      wait_ns_ += tick_clock::steady_ns() - since;
    }
    // relaxed: the node is private until the enqueue, which publishes this store.
    n.in_flight.store(true, std::memory_order_relaxed);
    return n;
  }

  std::uint64_t wait_ns() const noexcept { return wait_ns_; }

 private:
  std::unique_ptr<node[]> nodes_;
  std::size_t next_ = 0;
  std::uint64_t wait_ns_ = 0;
};

// ---- the peers ----

enum class worker_mode {
  sleepy,   // goes to sleep as soon as the queue is empty
  awake,    // never sleeps while the run lasts
  shipped,  // as the peer ships (the reaper's and call_rcu's defaults; the condvar waits at once)
};

struct peer_config {
  worker_mode mode = worker_mode::shipped;
  int nice = 19;        // the reaper only
  int yield_us = 0;     // the reaper only: reaper_options::yield_after, in microseconds
  int worker_cpu = -1;  // the reaper only: pin the worker there (reaper_options::cpus); -1: no
  int poll_us = 0;      // the reaper only: reaper_options::poll_interval, in microseconds
};

template <class Work>
struct reaper_fn {
  void operator()(node& n) const noexcept { Work::run(n); }
};

template <class Work>
class reaper_peer {
 public:
  static constexpr const char* name = "reaper";

  explicit reaper_peer(const peer_config& config, std::size_t /*capacity*/)
      : reaper_(reaper_fn<Work>{}, options(config)) {}

  void producer_begin() noexcept {}
  void producer_end() noexcept {}
  void enqueue(node& n) noexcept { reaper_.enqueue(n); }
  std::uint64_t wakeups() const noexcept { return reaper_.stats().wakeups; }
  std::uint64_t batches() const noexcept { return reaper_.stats().batches; }
  static constexpr bool counts_wakeups = true;

 private:
  static teardown::reaper_options options(const peer_config& config) {
    teardown::reaper_options opts;
    opts.name = "bench_reaper";
    opts.nice = config.nice;
    opts.yield_after = std::chrono::microseconds(config.yield_us);
    opts.poll_interval = std::chrono::microseconds(config.poll_us);
    if (config.worker_cpu >= 0) opts.cpus = {config.worker_cpu};
    if (config.mode == worker_mode::sleepy) opts.spin_polls = 0;
    if (config.mode == worker_mode::awake) opts.spin_polls = std::numeric_limits<std::uint32_t>::max();
    return opts;
  }

  teardown::reaper<node, &node::hook, reaper_fn<Work>> reaper_;
};

template <class Work>
class condvar_peer {
 public:
  static constexpr const char* name = "condvar";

  condvar_peer(const peer_config& config, std::size_t capacity)
      : spin_polls_(config.mode == worker_mode::awake ? std::numeric_limits<std::uint32_t>::max() : 0) {
    pending_.reserve(capacity);
    taken_.reserve(capacity);
    worker_ = std::thread([this] { run(); });
  }

  ~condvar_peer() {
    bool wake;
    {
      const std::lock_guard lock(mutex_);
      stop_ = true;
      wake = std::exchange(waiting_, false);
    }
    has_work_.store(true, std::memory_order_relaxed);
    if (wake) cv_.notify_one();
    worker_.join();
  }

  void producer_begin() noexcept {}
  void producer_end() noexcept {}

  void enqueue(node& n) {
    bool wake;
    {
      const std::lock_guard lock(mutex_);
      if (pending_.empty() && spin_polls_ != 0) has_work_.store(true, std::memory_order_relaxed);
      pending_.push_back(&n);
      wake = std::exchange(waiting_, false);  // only one producer wakes a waiting worker
    }
    if (wake) {
      notifies_.fetch_add(1, std::memory_order_relaxed);
      cv_.notify_one();
    }
  }

  std::uint64_t wakeups() const noexcept { return notifies_.load(std::memory_order_relaxed); }
  std::uint64_t batches() const noexcept { return 0; }
  static constexpr bool counts_wakeups = true;

 private:
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      if (!pending_.empty()) {
        pending_.swap(taken_);
        has_work_.store(false, std::memory_order_relaxed);  // under the lock, like the set
        lock.unlock();
        for (node* n : taken_) Work::run(*n);
        taken_.clear();
        lock.lock();
        continue;
      }
      if (stop_) return;
      if (spin_polls_ != 0) {
        lock.unlock();
        for (std::uint32_t poll = 0; poll < spin_polls_ && !has_work_.load(std::memory_order_relaxed);
             ++poll) {
          cpu_relax();
        }
        lock.lock();
        if (!pending_.empty() || stop_) continue;
      }
      waiting_ = true;
      cv_.wait(lock, [&] { return !pending_.empty() || stop_; });
      waiting_ = false;  // a producer clears it when it notifies; a stop may not have
    }
  }

  const std::uint32_t spin_polls_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<node*> pending_;  // guarded by mutex_
  bool waiting_ = false;        // guarded by mutex_: the worker is (about to be) in cv_.wait
  bool stop_ = false;           // guarded by mutex_
  alignas(64) std::atomic<bool> has_work_{false};  // a hint for the polling worker
  alignas(64) std::atomic<std::uint64_t> notifies_{0};
  std::vector<node*> taken_;  // the worker's own
  std::thread worker_;
};

#if TEARDOWN_BENCH_HAVE_CALL_RCU
template <class Work>
class call_rcu_peer {
 public:
  static constexpr const char* name = "call_rcu";

  call_rcu_peer(const peer_config& config, std::size_t /*capacity*/)
      : data_(urcu_memb_create_call_rcu_data(config.mode == worker_mode::awake ? URCU_CALL_RCU_RT : 0,
                                             -1)) {}

  ~call_rcu_peer() {
    // Every producer has called producer_end (the benchmark's stop barrier is behind us). Run
    // what is queued, wait a grace period as call_rcu_data_free requires after the threads
    // dropped the data, and stop the worker.
    urcu_memb_barrier();
    urcu_memb_synchronize_rcu();
    urcu_memb_call_rcu_data_free(data_);
  }

  // On each producing thread, outside the timed calls.
  void producer_begin() noexcept {
    urcu_memb_register_thread();
    urcu_memb_set_thread_call_rcu_data(data_);
  }
  void producer_end() noexcept {
    urcu_memb_set_thread_call_rcu_data(nullptr);
    urcu_memb_unregister_thread();
  }

  void enqueue(node& n) noexcept { urcu_memb_call_rcu(&n.rcu, &callback); }

  std::uint64_t wakeups() const noexcept { return 0; }
  std::uint64_t batches() const noexcept { return 0; }
  static constexpr bool counts_wakeups = false;

 private:
  static void callback(rcu_head* head) {
    Work::run(*reinterpret_cast<node*>(reinterpret_cast<unsigned char*>(head) - offsetof(node, rcu)));
  }

  call_rcu_data* data_;
};
#endif

// ---- waiting for the worker to sleep ----

// Reads /proc/self/task/<tid>/syscall: "running" while the thread runs, else the number of the
// syscall it is blocked in first. A blocked futex() there means FUTEX_WAIT: the worker is asleep.
class sleep_watch {
 public:
  explicit sleep_watch(long tid) {
    const std::string path = "/proc/self/task/" + std::to_string(tid) + "/syscall";
    fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  }
  ~sleep_watch() {
    if (fd_ >= 0) close(fd_);
  }
  sleep_watch(const sleep_watch&) = delete;
  sleep_watch& operator=(const sleep_watch&) = delete;

  bool usable() const noexcept { return fd_ >= 0; }

  bool in_futex() const noexcept {
    char text[32];
    const ssize_t n = pread(fd_, text, sizeof text - 1, 0);
    if (n <= 0) return false;
    text[n] = '\0';
    char* end = nullptr;
    const long number = std::strtol(text, &end, 10);
    return end != text && number == SYS_futex;
  }

  // Until the worker is blocked in futex(); false after a second without.
  bool wait_until_asleep() const noexcept {
    const std::uint64_t give_up = tick_clock::steady_ns() + 1'000'000'000u;
    while (!in_futex()) {
      if (tick_clock::steady_ns() > give_up) return false;
      cpu_relax();
    }
    return true;
  }

 private:
  int fd_ = -1;
};

bool wait_for_count(std::uint64_t expected, std::uint64_t timeout_ns = 2'000'000'000u) {
  const std::uint64_t give_up = tick_clock::steady_ns() + timeout_ns;
  // acquire: pairs with the release in record_start::run.
  while (probe.count.load(std::memory_order_acquire) < expected) {
    if (tick_clock::steady_ns() > give_up) return false;
    cpu_relax();
  }
  return true;
}

void spin_for_ns(std::uint64_t ns) noexcept {
  const std::uint64_t until = tick_clock::steady_ns() + ns;
  while (tick_clock::steady_ns() < until) cpu_relax();
}

void set_percentiles(benchmark::State& state, const char* prefix, sample_set& samples) {
  const std::string p(prefix);
  state.counters[p + "p50_ns"] = samples.quantile(0.50);
  state.counters[p + "p99_ns"] = samples.quantile(0.99);
}

// ---- the latency cases (one producer: the benchmark's thread) ----

template <template <class> class Peer, int Nice, std::uint64_t IdleNs, int PollUs = 0>
void enqueue_asleep(benchmark::State& state) {
  probe.reset();
  node item;  // first: it must outlive the peer
  Peer<record_start> peer({worker_mode::sleepy, Nice, 0, -1, PollUs}, 16);
  peer.producer_begin();
  // A first item, untimed: the worker's tid, and the producer's first-call costs.
  peer.enqueue(item);
  if (!wait_for_count(1)) {
    state.SkipWithError("the worker did not run the first item");
    peer.producer_end();
    return;
  }
  const sleep_watch watch(probe.worker_tid.load(std::memory_order_relaxed));
  if (!watch.usable()) {
    state.SkipWithError("cannot read /proc/self/task/<tid>/syscall");
    peer.producer_end();
    return;
  }
  const std::uint64_t wakeups_before = peer.wakeups();
  sample_set enqueue_ns(state.max_iterations);
  sample_set wake_ns(state.max_iterations);
  std::uint64_t done = 1;
  for (auto _ : state) {
    if (!watch.wait_until_asleep()) {
      state.SkipWithError("the worker did not go to sleep in futex() within a second");
      break;
    }
    spin_for_ns(IdleNs);  // the worker's CPU stays idle meanwhile; this one keeps busy
    const std::uint64_t t0 = tick_clock::start();
    peer.enqueue(item);
    const std::uint64_t t1 = tick_clock::stop();
    ++done;
    if (!wait_for_count(done)) {
      state.SkipWithError("the worker did not run an item within 2 s");
      break;
    }
    enqueue_ns.add(tick_clock::interval_ns(t0, t1));
    wake_ns.add(tick_clock::interval_ns(t0, probe.started_ticks.load(std::memory_order_relaxed)));
  }
  const std::uint64_t wakeups = peer.wakeups() - wakeups_before;
  peer.producer_end();
  set_percentiles(state, "", enqueue_ns);
  set_percentiles(state, "wake_", wake_ns);
  if (Peer<record_start>::counts_wakeups) {
    state.counters["wakes_per_op"] =
        benchmark::Counter(static_cast<double>(wakeups), benchmark::Counter::kAvgIterations);
  }
}

// Each enqueue into an empty queue, the worker polling all the while.
template <template <class> class Peer>
void enqueue_awake_empty(benchmark::State& state) {
  probe.reset();
  node item;  // first: it must outlive the peer
  Peer<record_start> peer({worker_mode::awake}, 16);
  peer.producer_begin();
  peer.enqueue(item);
  if (!wait_for_count(1)) {
    state.SkipWithError("the worker did not run the first item");
    peer.producer_end();
    return;
  }
  const std::uint64_t wakeups_before = peer.wakeups();
  sample_set enqueue_ns(state.max_iterations);
  sample_set pickup_ns(state.max_iterations);
  std::uint64_t done = 1;
  for (auto _ : state) {
    const std::uint64_t t0 = tick_clock::start();
    peer.enqueue(item);
    const std::uint64_t t1 = tick_clock::stop();
    ++done;
    if (!wait_for_count(done)) {
      state.SkipWithError("the worker did not run an item within 2 s");
      break;
    }
    spin_for_ns(kSettleNs);  // the worker finishes the item and is back to polling
    enqueue_ns.add(tick_clock::interval_ns(t0, t1));
    pickup_ns.add(tick_clock::interval_ns(t0, probe.started_ticks.load(std::memory_order_relaxed)));
  }
  const std::uint64_t wakeups = peer.wakeups() - wakeups_before;
  peer.producer_end();
  set_percentiles(state, "", enqueue_ns);
  set_percentiles(state, "pickup_", pickup_ns);
  state.counters["wakes_per_op"] =
      benchmark::Counter(static_cast<double>(wakeups), benchmark::Counter::kAvgIterations);
}

// Back-to-back enqueues from a recycled pool, the worker never sleeping.
template <template <class> class Peer>
void enqueue_awake(benchmark::State& state) {
  node_pool pool;  // first: the peer drains into it when it is destroyed
  Peer<hand_back> peer({worker_mode::awake}, kPoolNodes);
  peer.producer_begin();
  peer.enqueue(pool.take());  // the producer's first-call costs, untimed
  const std::uint64_t wakeups_before = peer.wakeups();
  const std::uint64_t batches_before = peer.batches();
  sample_set enqueue_ns(state.max_iterations);
  for (auto _ : state) {
    node& n = pool.take();
    const std::uint64_t t0 = tick_clock::start();
    peer.enqueue(n);
    const std::uint64_t t1 = tick_clock::stop();
    enqueue_ns.add(tick_clock::interval_ns(t0, t1));
  }
  const std::uint64_t wakeups = peer.wakeups() - wakeups_before;
  const std::uint64_t batches = peer.batches() - batches_before;
  peer.producer_end();
  set_percentiles(state, "", enqueue_ns);
  if (Peer<hand_back>::counts_wakeups) {
    state.counters["wakes_per_op"] =
        benchmark::Counter(static_cast<double>(wakeups), benchmark::Counter::kAvgIterations);
  }
  if (std::string_view(Peer<hand_back>::name) == "reaper") {
    state.counters["batches_per_op"] =
        benchmark::Counter(static_cast<double>(batches), benchmark::Counter::kAvgIterations);
  }
}

// ---- the drain rate (1 up to the hardware thread count of producers) ----

template <class Peer>
struct drain_run {
  drain_run(const peer_config& config, int producers)
      : pools(static_cast<std::size_t>(producers)),
        peer(config, static_cast<std::size_t>(producers) * kPoolNodes) {}
  std::vector<node_pool> pools;  // first: the peer drains into them when it is destroyed
  Peer peer;
};

template <class Peer>
drain_run<Peer>* current_drain = nullptr;
// Producers other than thread 0 that are done with the run (their pool and producer_end): after
// the stop barrier nothing else tells thread 0 when it may delete the run.
std::atomic<int> drain_producers_done{0};

// Pins the calling thread to one CPU for its lifetime (cpu < 0: does nothing), then restores.
class pinned_thread {
 public:
  explicit pinned_thread(int cpu) {
    if (cpu < 0 || sched_getaffinity(0, sizeof old_, &old_) != 0) return;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(static_cast<std::size_t>(cpu), &one);
    pinned_ = sched_setaffinity(0, sizeof one, &one) == 0;
  }
  pinned_thread(const pinned_thread&) = delete;
  pinned_thread& operator=(const pinned_thread&) = delete;
  ~pinned_thread() {
    if (pinned_) (void)sched_setaffinity(0, sizeof old_, &old_);
  }

 private:
  cpu_set_t old_{};
  bool pinned_ = false;
};

template <template <class> class Peer, int Nice = 19, int YieldUs = 0, int WorkerCpu = -1, int ProducerCpu = -1,
          int PollUs = 0>
void drain(benchmark::State& state) {
  using run_t = drain_run<Peer<hand_back>>;
  const pinned_thread pin(ProducerCpu);
  if (state.thread_index() == 0) {
    drain_producers_done.store(0, std::memory_order_relaxed);  // the start barrier publishes it
    current_drain<Peer<hand_back>> =
        new run_t({worker_mode::shipped, Nice, YieldUs, WorkerCpu, PollUs}, state.threads());
  }
  auto it = state.begin();
  const auto end = state.end();  // the start barrier
  run_t& run = *current_drain<Peer<hand_back>>;
  node_pool& pool = run.pools[static_cast<std::size_t>(state.thread_index())];
  run.peer.producer_begin();
  const std::uint64_t started = tick_clock::steady_ns();
  for (; it != end; ++it) run.peer.enqueue(pool.take());
  // `it != end` ran the stop barrier: every producer is done enqueueing.
  const std::uint64_t elapsed = tick_clock::steady_ns() - started;
  const std::uint64_t waited = pool.wait_ns();
  run.peer.producer_end();
  state.SetItemsProcessed(state.iterations());
  state.counters["pool_wait_share"] = benchmark::Counter(
      elapsed == 0 ? 0.0 : static_cast<double>(waited) / static_cast<double>(elapsed), benchmark::Counter::kAvgThreads);
  if (state.thread_index() != 0) {
    // release: pairs with thread 0's acquire; this thread's last use of the run comes before.
    drain_producers_done.fetch_add(1, std::memory_order_release);
    return;
  }
  while (drain_producers_done.load(std::memory_order_acquire) < state.threads() - 1) std::this_thread::yield();
  // The peer's destructor drains (reaper: stop; condvar: the worker finishes the vector;
  // call_rcu: rcu_barrier), so every node is back before the pools go.
  delete std::exchange(current_drain<Peer<hand_back>>, nullptr);
}

// ---- the summary ----

class reaper_reporter : public teardown_bench::summary_reporter {
 public:
  using summary_reporter::summary_reporter;

 private:
  void print_summary(std::FILE* out) const override {
    static const char* const peers[] = {"reaper", "reaper_nice0", "condvar", "call_rcu"};
    const auto table = [&](const char* title, const char* const (&groups)[4], const char* const (&heads)[4],
                           const char* const (&prefixes)[4]) {
      std::fprintf(out, "\n%s\n%-13s", title, "peer");
      for (const char* head : heads) {
        if (head != nullptr) std::fprintf(out, "%-27s", head);
      }
      std::fprintf(out, "\n");
      for (const char* peer : peers) {
        bool any = false;
        for (const char* group : groups) any = any || (group != nullptr && has(std::string(group) + peer));
        if (!any) continue;
        std::fprintf(out, "%-13s", peer);
        for (std::size_t i = 0; i < 4; ++i) {
          if (groups[i] != nullptr) std::fprintf(out, "%-27s", cell(groups[i], peer, prefixes[i]).c_str());
        }
        std::fprintf(out, "\n");
      }
    };
    table("enqueue cost on the caller, ns per call: p50/p99 (clock cost subtracted) and p50 / condvar's",
          {"enqueue_asleep/", "enqueue_asleep_1ms/", "enqueue_awake/", "enqueue_awake_empty/"},
          {"asleep", "asleep for 1 ms", "awake, stream", "awake, empty queue"}, {"", "", "", ""});
    table("enqueue to fn starting on the worker, ns: p50/p99 and p50 / condvar's",
          {"enqueue_asleep/", "enqueue_asleep_1ms/", "enqueue_awake_empty/", nullptr},
          {"wake (asleep)", "wake (asleep for 1 ms)", "pickup (awake, polling)", nullptr},
          {"wake_", "wake_", "pickup_", ""});
    std::fprintf(out, "\nfutex wakes per enqueue (the reaper's stats().wakeups, the condvar's notify_one calls)\n");
    for (const char* peer : {"reaper", "reaper_nice0", "condvar"}) {
      const std::string p(peer);
      if (!has("enqueue_asleep/" + p) && !has("enqueue_awake/" + p)) continue;
      std::fprintf(out, "%-13sasleep %s, asleep for 1 ms %s, awake stream %s, awake empty queue %s\n", peer,
                   number("enqueue_asleep/" + p, "wakes_per_op", "%.3f").c_str(),
                   number("enqueue_asleep_1ms/" + p, "wakes_per_op", "%.3f").c_str(),
                   number("enqueue_awake/" + p, "wakes_per_op", "%.3f").c_str(),
                   number("enqueue_awake_empty/" + p, "wakes_per_op", "%.3f").c_str());
    }
    if (has("enqueue_awake/reaper")) {
      std::fprintf(out, "reaper awake stream: batches per enqueue %s (the share that found the queue empty)\n",
                   number("enqueue_awake/reaper", "batches_per_op", "%.4f").c_str());
    }

    const std::vector<std::int64_t>& threads = runs().thread_counts();
    bool drain_header = false;
    for (const std::string& name : runs().names()) {
      if (name.rfind("drain/", 0) != 0) continue;
      if (!drain_header) {
        std::fprintf(out, "\ndrain rate, Mitems/s (all producers together), / condvar's, and w = the share of "
                          "the producers' time spent waiting for a free node\n%-20s", "producers");
        for (std::int64_t t : threads) std::fprintf(out, "%26lld", static_cast<long long>(t));
        std::fprintf(out, "\n");
        drain_header = true;
      }
      std::fprintf(out, "%-20s", name.c_str());
      for (std::int64_t t : threads) {
        const double rate = counter(name, t, "items_per_second");
        const double base = counter("drain/condvar", t, "items_per_second");
        const double waits = counter(name, t, "pool_wait_share");
        char text[64];
        if (rate <= 0) {
          std::snprintf(text, sizeof text, "-");
        } else if (base > 0) {
          std::snprintf(text, sizeof text, "%.2f %6.3fx w%.2f", rate / 1e6, rate / base, waits);
        } else {
          std::snprintf(text, sizeof text, "%.2f w%.2f", rate / 1e6, waits);
        }
        std::fprintf(out, "%26s", text);
      }
      std::fprintf(out, "\n");
    }

    const double stream = counter("enqueue_awake/reaper", 1, "p50_ns");
    const double empty = counter("enqueue_awake_empty/reaper", 1, "p50_ns");
    if (stream >= 0 || empty >= 0) {
      std::fprintf(out,
                   "\ngoal (awake: p50 <= 300 ns and no syscall): reaper p50 %.0f ns (stream), %.0f ns (empty "
                   "queue); futex wakes per enqueue %.3f, %.3f (syscalls.sh counts every syscall)\n",
                   stream, empty, counter("enqueue_awake/reaper", 1, "wakes_per_op"),
                   counter("enqueue_awake_empty/reaper", 1, "wakes_per_op"));
    }
    if (has("enqueue_asleep/reaper")) {
      std::fprintf(
          out, "goal (asleep: one futex wake): reaper futex wakes per enqueue %.3f (asleep), %.3f (asleep for 1 ms)\n",
          counter("enqueue_asleep/reaper", 1, "wakes_per_op"), counter("enqueue_asleep_1ms/reaper", 1, "wakes_per_op"));
    }
  }

  bool has(const std::string& name) const { return runs().has(name); }

  // A counter of the median run (median aggregate when repeated); -1 when absent.
  double counter(const std::string& name, std::int64_t threads, const std::string& key) const {
    const Run* run = runs().median(name, threads);
    if (run == nullptr) return -1;
    const auto it = run->counters.find(key);
    return it == run->counters.end() ? -1 : it->second.value;
  }

  std::string number(const std::string& name, const char* key, const char* format) const {
    const double value = counter(name, 1, key);
    if (value < 0) return "-";
    char text[32];
    std::snprintf(text, sizeof text, format, value);
    return text;
  }

  // "p50/p99 (ratio of p50 to condvar's)".
  std::string cell(const std::string& group, const std::string& peer, const std::string& prefix) const {
    const double p50 = counter(group + peer, 1, prefix + "p50_ns");
    const double p99 = counter(group + peer, 1, prefix + "p99_ns");
    if (p50 < 0 || p99 < 0) return "-";
    const double base = counter(group + "condvar", 1, prefix + "p50_ns");
    char text[64];
    if (base > 0) {
      std::snprintf(text, sizeof text, "%.0f/%.0f (%.2fx)", p50, p99, p50 / base);
    } else {
      std::snprintf(text, sizeof text, "%.0f/%.0f", p50, p99);
    }
    return text;
  }
};

// ---- --mode=syscalls ----

void marker(const char* text) noexcept {
  // Fails with EBADF; strace shows it with its text, and it touches no stream.
  (void)syscall(SYS_write, -1, text, std::strlen(text));
}

int syscall_mode(std::uint64_t k) {
  const long tid = syscall(SYS_gettid);
  std::printf("producer tid %ld, %llu enqueues per phase\n", tid, static_cast<unsigned long long>(k));
  std::fflush(stdout);
  {
    // Awake, empty queue: the worker polls; each enqueue kicks it without a syscall.
    probe.reset();
    node item;
    reaper_peer<record_start> peer({worker_mode::awake}, 16);
    peer.enqueue(item);
    if (!wait_for_count(1, 30'000'000'000u)) return 1;
    const std::uint64_t before = peer.wakeups();
    marker("phase awake_empty begin");
    for (std::uint64_t i = 0; i < k; ++i) {
      marker("enqueue begin");
      peer.enqueue(item);
      marker("enqueue end");
      if (!wait_for_count(i + 2, 30'000'000'000u)) return 1;
    }
    marker("phase awake_empty end");
    std::printf("awake, empty queue: %llu enqueues, stats().wakeups +%llu\n",
                static_cast<unsigned long long>(k),
                static_cast<unsigned long long>(peer.wakeups() - before));
  }
  {
    // Awake, back to back: every node distinct; the worker polls between batches.
    std::vector<node> items(k + 1);
    probe.reset();
    reaper_peer<record_start> peer({worker_mode::awake}, 16);
    peer.enqueue(items[k]);
    if (!wait_for_count(1, 30'000'000'000u)) return 1;
    const std::uint64_t before = peer.wakeups();
    const std::uint64_t batches_before = peer.batches();
    marker("phase awake_stream begin");
    for (std::uint64_t i = 0; i < k; ++i) {
      marker("enqueue begin");
      peer.enqueue(items[i]);
      marker("enqueue end");
    }
    marker("phase awake_stream end");
    if (!wait_for_count(k + 1, 30'000'000'000u)) return 1;
    std::printf("awake, back to back: %llu enqueues, stats().wakeups +%llu, stats().batches +%llu\n",
                static_cast<unsigned long long>(k),
                static_cast<unsigned long long>(peer.wakeups() - before),
                static_cast<unsigned long long>(peer.batches() - batches_before));
  }
  // Asleep: each enqueue once the worker is blocked in futex(); with poll_us, a polling worker
  // (reaper_options::poll_interval), whose producers only push.
  const auto asleep = [&](const char* phase, int poll_us) {
    probe.reset();
    node item;
    reaper_peer<record_start> peer({worker_mode::sleepy, 19, 0, -1, poll_us}, 16);
    peer.enqueue(item);
    if (!wait_for_count(1, 30'000'000'000u)) return false;
    const sleep_watch watch(probe.worker_tid.load(std::memory_order_relaxed));
    if (!watch.usable()) return false;
    const std::uint64_t before = peer.wakeups();
    marker((std::string("phase ") + phase + " begin").c_str());
    for (std::uint64_t i = 0; i < k; ++i) {
      if (!watch.wait_until_asleep()) {
        std::fputs("reaper_bench: the worker did not go to sleep in futex() within a second\n", stderr);
        return false;
      }
      marker("enqueue begin");
      peer.enqueue(item);
      marker("enqueue end");
      if (!wait_for_count(i + 2, 30'000'000'000u)) return false;
    }
    marker((std::string("phase ") + phase + " end").c_str());
    std::printf("%s: %llu enqueues, stats().wakeups +%llu\n", phase, static_cast<unsigned long long>(k),
                static_cast<unsigned long long>(peer.wakeups() - before));
    return true;
  };
  if (!asleep("asleep", 0)) return 1;
  if (!asleep("asleep_polling", 1000)) return 1;
  return 0;
}

// ---- registration ----

// A benchmark's own MinTime would override --benchmark_min_time, so it is set only when the
// command line does not ask for another.
bool default_min_time = true;

benchmark::internal::Benchmark* timed(benchmark::internal::Benchmark* benchmark) {
  if (default_min_time) benchmark->MinTime(kMinTimeSeconds);
  return benchmark;
}

[[maybe_unused]] void skipped(const char* name, const char* why) {
  std::fprintf(stderr, "reaper_bench: %s skipped: %s\n", name, why);
  benchmark::AddCustomContext(std::string("skipped ") + name, why);
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg(argv[i]);
    if (arg.starts_with("--benchmark_min_time")) default_min_time = false;
    if (arg.starts_with("--mode=syscalls")) {
      tick_clock::calibrate();
      std::uint64_t k = 1000;
      if (const auto comma = arg.find(','); comma != std::string_view::npos) {
        k = std::strtoull(std::string(arg.substr(comma + 1)).c_str(), nullptr, 10);
      }
      return syscall_mode(k == 0 ? 1 : k);
    }
  }
  tick_clock::calibrate();
  const int hardware_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  constexpr std::uint64_t idle = kIdleNs;
  benchmark::RegisterBenchmark("enqueue_asleep/reaper", enqueue_asleep<reaper_peer, 19, 0>)
      ->Iterations(kAsleepSamples);
  benchmark::RegisterBenchmark("enqueue_asleep/reaper_nice0", enqueue_asleep<reaper_peer, 0, 0>)
      ->Iterations(kAsleepSamples);
  // The polling reaper asleep (poll_interval 1 ms): the producer only pushes; wake-to-start is
  // then the rest of the worker's interval.
  benchmark::RegisterBenchmark("enqueue_asleep/reaper_poll_1ms", enqueue_asleep<reaper_peer, 19, 0, 1000>)
      ->Iterations(kAsleepIdleSamples);
  benchmark::RegisterBenchmark("enqueue_asleep/condvar", enqueue_asleep<condvar_peer, 0, 0>)
      ->Iterations(kAsleepSamples);
#if TEARDOWN_BENCH_HAVE_CALL_RCU
  benchmark::RegisterBenchmark("enqueue_asleep/call_rcu", enqueue_asleep<call_rcu_peer, 0, 0>)
      ->Iterations(kAsleepSamplesCallRcu);
#endif
  benchmark::RegisterBenchmark("enqueue_asleep_1ms/reaper", enqueue_asleep<reaper_peer, 19, idle>)
      ->Iterations(kAsleepIdleSamples);
  benchmark::RegisterBenchmark("enqueue_asleep_1ms/reaper_nice0", enqueue_asleep<reaper_peer, 0, idle>)
      ->Iterations(kAsleepIdleSamples);
  benchmark::RegisterBenchmark("enqueue_asleep_1ms/condvar", enqueue_asleep<condvar_peer, 0, idle>)
      ->Iterations(kAsleepIdleSamples);
#if TEARDOWN_BENCH_HAVE_CALL_RCU
  benchmark::RegisterBenchmark("enqueue_asleep_1ms/call_rcu", enqueue_asleep<call_rcu_peer, 0, idle>)
      ->Iterations(kAsleepSamplesCallRcu);
#endif
  timed(benchmark::RegisterBenchmark("enqueue_awake/reaper", enqueue_awake<reaper_peer>));
  timed(benchmark::RegisterBenchmark("enqueue_awake/condvar", enqueue_awake<condvar_peer>));
#if TEARDOWN_BENCH_HAVE_CALL_RCU
  timed(benchmark::RegisterBenchmark("enqueue_awake/call_rcu", enqueue_awake<call_rcu_peer>));
#endif
  timed(benchmark::RegisterBenchmark("enqueue_awake_empty/reaper", enqueue_awake_empty<reaper_peer>));
  timed(benchmark::RegisterBenchmark("enqueue_awake_empty/condvar", enqueue_awake_empty<condvar_peer>));

  timed(benchmark::RegisterBenchmark("drain/reaper", drain<reaper_peer>)
            ->ThreadRange(1, hardware_threads)
            ->UseRealTime());
  timed(benchmark::RegisterBenchmark("drain/reaper_nice0", drain<reaper_peer, 0>)
            ->ThreadRange(1, hardware_threads)
            ->UseRealTime());
  // The yield policy's price: a clock read per item, and sched_yield() every 50 µs of draining.
  timed(benchmark::RegisterBenchmark("drain/reaper_yield_50us", drain<reaper_peer, 19, 50>)
            ->ThreadRange(1, hardware_threads)
            ->UseRealTime());
  // The two placements of one producer and the worker, pinned (needs 2 CPUs for "apart").
  timed(benchmark::RegisterBenchmark("drain/reaper_same_cpu", drain<reaper_peer, 19, 0, 0, 0>)
            ->Threads(1)
            ->UseRealTime());
  if (hardware_threads > 1) {
    timed(
        benchmark::RegisterBenchmark("drain/reaper_apart", drain<reaper_peer, 19, 0, 1, 0>)->Threads(1)->UseRealTime());
  }
  timed(benchmark::RegisterBenchmark("drain/reaper_poll_1ms", drain<reaper_peer, 19, 0, -1, -1, 1000>)
            ->ThreadRange(1, hardware_threads)
            ->UseRealTime());
  timed(benchmark::RegisterBenchmark("drain/condvar", drain<condvar_peer>)
            ->ThreadRange(1, hardware_threads)
            ->UseRealTime());
#if TEARDOWN_BENCH_HAVE_CALL_RCU
  timed(benchmark::RegisterBenchmark("drain/call_rcu", drain<call_rcu_peer>)
            ->ThreadRange(1, hardware_threads)
            ->UseRealTime());
#else
  skipped("call_rcu", "built without liburcu (pkg-config liburcu)");
#endif

  char text[64];
  std::snprintf(text, sizeof text, "%.4f", tick_clock::ticks_per_ns);
  benchmark::AddCustomContext("reaper_bench clock", tick_clock::name);
  benchmark::AddCustomContext("reaper_bench clock ticks per ns", text);
  std::snprintf(text, sizeof text, "%.1f ns (%llu ticks), subtracted from every sample",
                static_cast<double>(tick_clock::overhead_ticks) / tick_clock::ticks_per_ns,
                static_cast<unsigned long long>(tick_clock::overhead_ticks));
  benchmark::AddCustomContext("reaper_bench clock cost", text);
  benchmark::AddCustomContext("reaper_bench pool nodes per producer", std::to_string(kPoolNodes));
  std::fprintf(stderr, "reaper_bench: clock %s, %.4f ticks/ns, own cost %.1f ns subtracted\n",
               tick_clock::name, tick_clock::ticks_per_ns,
               static_cast<double>(tick_clock::overhead_ticks) / tick_clock::ticks_per_ns);

  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  reaper_reporter reporter(isatty(STDOUT_FILENO) ? benchmark::ConsoleReporter::OO_ColorTabular
                                                 : benchmark::ConsoleReporter::OO_Tabular);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
