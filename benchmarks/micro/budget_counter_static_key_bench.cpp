// budget_counter_static_key_bench (gate_bench before) — teardown's gate primitives (budget,
// static_key, sharded_counter) beside their peers and the physical limits, all in one binary and
// one run.
//
// Every case runs on 1 up to the hardware thread count of threads (ThreadRange, so 1, 2, 4, ...
// and the top count), with real (wall) time. Every thread runs the same number of iterations in
// the same wall time, and each counts its operations as items. Google Benchmark's Time is wall
// time / the iterations of ALL threads together; the summary derives everything from
// items_per_second instead (all threads' operations per wall second), so that it holds for the
// static_key rows too, whose iteration is 8 calls:
//   ns/op, all threads together  = 1e9 / items_per_second            (what a throughput limit
//                                                                     is compared on)
//   ns/op on one thread          = threads * 1e9 / items_per_second  (what each caller pays)
// Each case runs for at least 0.2 s unless --benchmark_min_time says otherwise. After the console
// table the binary prints one summary table per group (medians when repeated).
//
// budget — one op = try_reserve(n) and, when it succeeds, release(n); n = 8, opaque to the
// compiler. Every thread works on the same counter. ns/op is wall time / all threads' ops.
// The rejected_per_op counter (rejected reserves / all threads' ops) shows that none failed.
//   budget/add_then_check     teardown::budget, cap = max_cap (nothing is rejected)
//   budget/exact              teardown::exact_budget, cap = max_cap
//   peer/mutex_budget         std::mutex + uint64 pending: the same check under the lock, and the
//                             release under the lock again (two lock/unlock pairs per op)
//   limit/fetch_add_pair      fetch_add(n) then fetch_sub(n) on one alignas(64) atomic<uint64_t>:
//                             the two read-modify-writes of one shared line that any reserve +
//                             release on a shared counter must do. The goal is judged against it.
//   limit/fetch_add           one fetch_add(n) per op, for reference
// The summary divides each row's time by both limits' at the same thread count.
//
// budget_tight — the same counter, saturated: cap = threads * 64 * n / 2, and each thread holds
// every charge it wins for 64 of its own ops (a ring of 64 slots: op k first releases what op
// k-64 won, then tries to reserve n into the slot). Any window of 64 ops per thread can hold
// only half its reserves, so about half must fail; rejected_per_op says how many did.
//   budget_tight/add_then_check, budget_tight/exact
//
// static_key — a call bumps one of two thread-private counters (benchmark::DoNotOptimize keeps
// each bump); the rows differ only in what picks the counter. An iteration is 8 calls in a row,
// each with its own check (see kCallsPerIteration). The summary gives ns per call on one thread
// (threads * 1e9 / items_per_second) and the difference to limit/no_check.
//   limit/no_check            no gate: always the inline counter
//   const_key/false           if (const_key<false>::enabled()) deferred else inline
//   static_key/off            if (key.enabled()) deferred else inline, key never enabled
//   static_key/on             the same with a key enabled before the run (the deferred counter)
//
// counter — one op = one add of 1. The summary gives ns per add on one thread (threads * 1e9 /
// items_per_second) and the ratio of that at the top thread count to that at 1 thread; flat =
// 1.00.
//   counter/sharded           teardown::sharded_counter, default shards (hardware threads)
//   counter/sharded_256       the same with 256 shards, the most it takes
//   peer/shared_atomic        one alignas(64) atomic<uint64_t>, fetch_add(1, relaxed)
//   limit/own_line_fetch_add  fetch_add(1, relaxed) on an atomic on the thread's own line: the
//                             least any atomic per-thread shard costs
//   limit/thread_local_plain  a plain (non-atomic) ++ of a thread_local uint64 in memory: the
//                             no-sharing limit, the kernel's this_cpu_inc without a lock prefix
// sharded_counter deals shard indexes to threads round-robin on a thread's first add, process-
// wide, never reused; Google Benchmark starts fresh threads for every run, so a run's threads may
// land on one shard (with the default 2 shards of a 2-thread machine, any 2-thread run whose
// worker got an index of the main thread's parity). Both sharded rows report shared_shard = the
// fraction of the run's threads whose shard another of its threads also uses (0 = the intended
// spread); the summary prints its mean over the repetitions. With 256 shards a collision needs
// the process to have dealt 256 indexes, which this binary does not reach on small machines.
//
// Shared state of a case is built by thread 0 before the timed loop and torn down after it: the
// loop's start barrier (inside state.end()) orders the build before any thread's first use, and
// its stop barrier orders every thread's last op before the teardown.
#include <benchmark/benchmark.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "bench_support.hpp"
#include "teardown/budget.hpp"
#include "teardown/counter.hpp"
#include "teardown/static_key.hpp"

namespace {

constexpr double kMinTimeSeconds = 0.2;
// The charge per reserve: pages of a small mm. Passed through DoNotOptimize so that the compiler
// cannot fold the budget's size checks, as it could not in a caller charging a real RSS.
constexpr std::uint64_t kCharge = 8;
// budget_tight: how many of its own ops a thread holds a won charge for.
constexpr std::size_t kHoldOps = 64;
// static_key: gated calls per loop iteration. One call per iteration makes a loop of about one
// cycle whose time here swung between 0.27 and 1.0 ns with nothing but its offset in the binary
// changed (a loop straddling a fetch boundary), checked or not; with eight in a row the rows moved
// by 0.01 ns (GCC 12) to 0.13 ns (Clang 14) over the same offsets.
constexpr std::size_t kCallsPerIteration = 8;

std::uint64_t opaque_charge() noexcept {
  std::uint64_t n = kCharge;
  benchmark::DoNotOptimize(n);
  return n;
}

// Built by thread 0 before the loop, deleted by thread 0 after it (see the header comment).
template <class Shared>
Shared* current = nullptr;

// Runs `body(shared)` once per iteration, with the run's shared object built from `make()` by
// thread 0; the reference is taken once, after the start barrier, so the loop does not reload it.
template <class Shared, class Make, class Body>
void run_shared(benchmark::State& state, Make make, Body body) {
  if (state.thread_index() == 0) current<Shared> = make();
  auto it = state.begin();
  const auto end = state.end();  // the start barrier
  Shared& shared = *current<Shared>;
  for (; it != end; ++it) body(shared);
  // `it != end` ran the stop barrier: every thread is done with `shared`.
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0) delete std::exchange(current<Shared>, nullptr);
}

// ---- budget ----

template <class Budget>
struct alignas(64) budget_case {
  explicit budget_case(std::uint64_t cap) : budget(cap) {}
  Budget budget;
};

struct alignas(64) mutex_budget {
  explicit mutex_budget(std::uint64_t cap) : cap(cap) {}

  bool try_reserve(std::uint64_t n) {
    const std::lock_guard lock(mutex);
    if (n > cap - pending) return false;  // pending <= cap always, so cap - pending cannot wrap
    pending += n;
    return true;
  }
  void release(std::uint64_t n) {
    const std::lock_guard lock(mutex);
    pending -= n;
  }

  std::mutex mutex;
  std::uint64_t pending = 0;  // guarded by mutex
  std::uint64_t cap;          // guarded by mutex
};

template <class Budget>
struct budget_of {
  using type = budget_case<Budget>;
  static Budget& get(type& c) noexcept { return c.budget; }
};
template <>
struct budget_of<mutex_budget> {
  using type = mutex_budget;
  static mutex_budget& get(type& c) noexcept { return c; }
};

// Room for everything: every reserve fits.
template <class Budget>
void reserve_release(benchmark::State& state) {
  using shared_t = typename budget_of<Budget>::type;
  const std::uint64_t n = opaque_charge();
  std::uint64_t rejected = 0;
  run_shared<shared_t>(
      state, [] { return new shared_t(teardown::budget::max_cap); },
      [&](shared_t& shared) {
        Budget& budget = budget_of<Budget>::get(shared);
        if (budget.try_reserve(n)) {
          budget.release(n);
        } else {
          ++rejected;
        }
      });
  state.counters["rejected_per_op"] =
      benchmark::Counter(static_cast<double>(rejected), benchmark::Counter::kAvgIterations);
}

// A tight cap: each thread holds what it wins for kHoldOps of its ops; cap = half of that demand.
template <class Budget>
void reserve_release_tight(benchmark::State& state) {
  using shared_t = budget_case<Budget>;
  const std::uint64_t n = opaque_charge();
  const std::uint64_t cap = static_cast<std::uint64_t>(state.threads()) * kHoldOps * kCharge / 2;
  std::array<std::uint64_t, kHoldOps> held{};  // the charge op k won, in slot k % kHoldOps
  std::size_t slot = 0;
  std::uint64_t rejected = 0;
  run_shared<shared_t>(
      state, [cap] { return new shared_t(cap); },
      [&](shared_t& shared) {
        Budget& budget = shared.budget;
        if (held[slot] != 0) budget.release(held[slot]);
        if (budget.try_reserve(n)) {
          held[slot] = n;
        } else {
          held[slot] = 0;
          ++rejected;
        }
        slot = (slot + 1) % kHoldOps;
      });
  // What is still held dies with the budget: releasing it here would race with thread 0's delete.
  state.counters["rejected_per_op"] =
      benchmark::Counter(static_cast<double>(rejected), benchmark::Counter::kAvgIterations);
}

struct alignas(64) fetch_add_pair_limit {
  void op(std::uint64_t n) noexcept {
    value.fetch_add(n, std::memory_order_relaxed);
    value.fetch_sub(n, std::memory_order_relaxed);
  }
  std::atomic<std::uint64_t> value{0};
};

struct alignas(64) fetch_add_limit {
  void op(std::uint64_t n) noexcept { value.fetch_add(n, std::memory_order_relaxed); }
  std::atomic<std::uint64_t> value{0};
};

template <class Limit>
void limit_op(benchmark::State& state) {
  const std::uint64_t n = opaque_charge();
  run_shared<Limit>(
      state, [] { return new Limit(); }, [n](Limit& limit) { limit.op(n); });
}

// ---- static_key ----

// Each key alone on its cache line, so that nothing written shares a line with a key.
struct alignas(64) padded_key {
  explicit constexpr padded_key(bool on) noexcept : key(on) {}
  teardown::static_key key;
};
padded_key key_off{false};
padded_key key_on{true};

struct off_gate {
  static bool enabled() noexcept { return key_off.key.enabled(); }
};
struct on_gate {
  static bool enabled() noexcept { return key_on.key.enabled(); }
};

// kCallsPerIteration copies of `call()` in a row, each a separate call site.
template <class Call>
inline void repeat_calls(Call& call) {
  [&]<std::size_t... I>(std::index_sequence<I...>) { (((void)I, call()), ...); }
  (std::make_index_sequence<kCallsPerIteration>{});
}

struct ungated_call {
  void operator()() noexcept {
    ++inline_count;
    benchmark::DoNotOptimize(inline_count);
  }
  std::uint64_t inline_count = 0;
};

template <class Gate>
struct gated_call {
  void operator()() noexcept {
    if (Gate::enabled()) {
      ++deferred_count;
      benchmark::DoNotOptimize(deferred_count);
    } else {
      ++inline_count;
      benchmark::DoNotOptimize(inline_count);
    }
  }
  std::uint64_t inline_count = 0;
  std::uint64_t deferred_count = 0;
};

template <class Call>
void calls(benchmark::State& state) {
  Call call;
  for (auto _ : state) repeat_calls(call);
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(kCallsPerIteration));
}

// ---- counter ----

struct sharded_case {
  sharded_case(std::size_t shards, int threads)
      : counter(shards), shard_of(static_cast<std::size_t>(threads)) {}
  teardown::sharded_counter counter;
  std::vector<std::size_t> shard_of;  // per thread index; each thread writes only its own
};

// Shards == 0: the constructor's default (hardware threads, rounded up to a power of two).
template <std::size_t Shards>
void sharded(benchmark::State& state) {
  const auto threads = static_cast<std::size_t>(state.threads());
  const auto me = static_cast<std::size_t>(state.thread_index());
  if (me == 0) current<sharded_case> = new sharded_case(Shards, state.threads());
  auto it = state.begin();
  const auto end = state.end();  // the start barrier
  sharded_case& shared = *current<sharded_case>;
  // The shard add() will use: the same index and mask as sharded_counter::add.
  shared.shard_of[me] =
      teardown::detail::this_thread_shard_index() & (shared.counter.shard_count() - 1);
  for (; it != end; ++it) shared.counter.add(1);
  state.SetItemsProcessed(state.iterations());
  if (me != 0) return;

  std::size_t on_shared_shard = 0;
  for (std::size_t i = 0; i < threads; ++i) {
    if (std::count(shared.shard_of.begin(), shared.shard_of.end(), shared.shard_of[i]) > 1) {
      ++on_shared_shard;
    }
  }
  state.counters["shared_shard"] =
      static_cast<double>(on_shared_shard) / static_cast<double>(threads);
  const std::uint64_t expected = static_cast<std::uint64_t>(state.iterations()) * threads;
  const std::uint64_t counted = shared.counter.read();
  delete std::exchange(current<sharded_case>, nullptr);
  if (counted != expected) state.SkipWithError("sharded_counter::read() lost or invented adds");
}

struct alignas(64) shared_atomic_case {
  std::atomic<std::uint64_t> value{0};
};

void shared_atomic(benchmark::State& state) {
  run_shared<shared_atomic_case>(
      state, [] { return new shared_atomic_case(); },
      [](shared_atomic_case& c) { c.value.fetch_add(1, std::memory_order_relaxed); });
}

struct own_line_case {
  struct alignas(64) line {
    std::atomic<std::uint64_t> value{0};
  };
  explicit own_line_case(int threads) : lines(static_cast<std::size_t>(threads)) {}
  std::vector<line> lines;
};

void own_line_fetch_add(benchmark::State& state) {
  const auto me = static_cast<std::size_t>(state.thread_index());
  if (me == 0) current<own_line_case> = new own_line_case(state.threads());
  auto it = state.begin();
  const auto end = state.end();  // the start barrier
  std::atomic<std::uint64_t>& mine = current<own_line_case>->lines[me].value;
  for (; it != end; ++it) mine.fetch_add(1, std::memory_order_relaxed);
  state.SetItemsProcessed(state.iterations());
  if (me == 0) delete std::exchange(current<own_line_case>, nullptr);
}

thread_local std::uint64_t plain_count = 0;

void thread_local_plain(benchmark::State& state) {
  for (auto _ : state) {
    plain_count = plain_count + 1;
    benchmark::ClobberMemory();  // the store happens every op, as a counter others sum must
  }
  benchmark::DoNotOptimize(plain_count);
  state.SetItemsProcessed(state.iterations());
}

// ---- the summary ----

enum class group_t { budget, budget_tight, static_key, counter };

struct row_t {
  std::string name;
  group_t group;
};
std::vector<row_t> rows;  // in registration order

// The console table as usual, then a summary per group (medians when repeated).
class gate_reporter : public teardown_bench::summary_reporter {
 public:
  using summary_reporter::summary_reporter;

 private:
  void print_summary(std::FILE* out) const override {
    const std::vector<std::int64_t>& thread_counts = runs().thread_counts();
    const std::int64_t top = thread_counts.back();

    // budget
    header(out, group_t::budget,
           "budget: ns per op (try_reserve(8) + release(8)), all threads together (1e9 /\n"
           "items_per_second), and that divided by limit/fetch_add_pair's | limit/fetch_add's\n"
           "at the same thread count (lower is better; the inverse is the throughput ratio)");
    for_rows(group_t::budget, [&](const std::string& name) {
      line(out, name, [&](std::int64_t t) {
        const double time = value(name, t).time;
        const double pair = value("limit/fetch_add_pair", t).time;
        const double single = value("limit/fetch_add", t).time;
        if (time <= 0 || pair <= 0 || single <= 0) return std::string("-");
        return format("%.1f ns %.2fx|%.2fx", time, time / pair, time / single);
      });
    });
    {
      const double att = value("budget/add_then_check", top).time;
      const double pair = value("limit/fetch_add_pair", top).time;
      const double single = value("limit/fetch_add", top).time;
      if (att > 0 && pair > 0 && single > 0) {
        std::fprintf(out,
                     "goal (>= 0.90x): budget/add_then_check throughput at %lld threads = %.2fx "
                     "limit/fetch_add_pair's (%.2fx limit/fetch_add's)\n",
                     static_cast<long long>(top), pair / att, single / att);
      }
    }

    header(out, group_t::budget_tight,
           "budget_tight: ns per op, all threads together (1e9 / items_per_second), and rejected\n"
           "reserves per op (about half must fail; more is over-rejection)");
    for_rows(group_t::budget_tight, [&](const std::string& name) {
      line(out, name, [&](std::int64_t t) {
        const sample_t s = value(name, t);
        if (s.time <= 0) return std::string("-");
        return format("%.1f ns %.3f rej", s.time, s.rejected_per_op);
      });
    });

    header(out, group_t::static_key,
           "static_key: ns per call on one thread (threads x 1e9 / items_per_second) and the\n"
           "difference to limit/no_check's");
    for_rows(group_t::static_key, [&](const std::string& name) {
      line(out, name, [&](std::int64_t t) {
        const double call = per_thread(name, t);
        const double base = per_thread("limit/no_check", t);
        if (call <= 0 || base <= 0) return std::string("-");
        return format("%.3f ns %+.3f", call, call - base);
      });
    });
    for (std::int64_t t : thread_counts) {
      const double off = per_thread("static_key/off", t);
      const double base = per_thread("limit/no_check", t);
      if (off > 0 && base > 0) {
        std::fprintf(
            out,
            "goal (<= 0.5 ns): static_key/off - limit/no_check at %lld thread%s = %+.3f ns/call\n",
            static_cast<long long>(t), t == 1 ? "" : "s", off - base);
      }
    }

    const bool counters =
        header(out, group_t::counter,
               "counter: ns per add on one thread (threads x 1e9 / items_per_second), and the top\n"
               "thread count's over 1 thread's");
    for_rows(
        group_t::counter,
        [&](const std::string& name) {
          line(out, name, [&](std::int64_t t) {
            const double add = per_thread(name, t);
            if (add <= 0) return std::string("-");
            const double shared = shared_shard(name, t);
            return shared >= 0 ? format("%.2f ns sh %.2f", add, shared) : format("%.2f ns", add);
          });
          const double first = per_thread(name, thread_counts.front());
          const double last = per_thread(name, top);
          if (first > 0 && last > 0) std::fprintf(out, "  %6.2fx", last / first);
          std::fprintf(out, "\n");
        },
        /*newline=*/false);
    for (const char* name : {"counter/sharded", "counter/sharded_256"}) {
      const double first = per_thread(name, thread_counts.front());
      const double last = per_thread(name, top);
      if (first > 0 && last > 0 && top != thread_counts.front()) {
        std::fprintf(out,
                     "goal (flat, 1.00x): %s ns/add per thread at %lld threads / at %lld = %.2fx\n",
                     name, static_cast<long long>(top),
                     static_cast<long long>(thread_counts.front()), last / first);
      }
    }
    if (counters)
      std::fprintf(out,
                   "(sh = shared_shard, mean over repetitions: the fraction of threads on a shard "
                   "another thread of the run uses)\n");
  }

  struct sample_t {
    double time = 0;  // ns per op, all threads together: 1e9 / items_per_second
    double rejected_per_op = -1;
    double shared_shard = -1;
  };

  static sample_t sample(const Run& run) {
    sample_t s;
    if (const auto it = run.counters.find("items_per_second");
        it != run.counters.end() && it->second.value > 0) {
      s.time = 1e9 / it->second.value;
    }
    if (const auto it = run.counters.find("rejected_per_op"); it != run.counters.end()) {
      s.rejected_per_op = it->second.value;
    }
    if (const auto it = run.counters.find("shared_shard"); it != run.counters.end()) {
      s.shared_shard = it->second.value;
    }
    return s;
  }

  static std::string format(const char* fmt, double a, double b = 0, double c = 0) {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, fmt, a, b, c);
    return buffer;
  }

  // Prints the group's title and column heads; false (and nothing printed) if it has no results.
  bool header(std::FILE* out, group_t group, const char* title) const {
    if (std::none_of(rows.begin(), rows.end(),
                     [&](const row_t& r) { return r.group == group && has(r.name); })) {
      return false;
    }
    std::fprintf(out, "\n%s\n%-26s", title, "threads");
    for (std::int64_t t : runs().thread_counts()) {
      std::fprintf(out, "%26lld", static_cast<long long>(t));
    }
    if (group == group_t::counter) std::fprintf(out, "  %7s", "top/1");
    std::fprintf(out, "\n");
    return true;
  }

  template <class Print>
  void for_rows(group_t group, Print print, bool newline = true) const {
    for (const row_t& r : rows) {
      if (r.group != group || !has(r.name)) continue;
      print(r.name);
      if (newline) std::fprintf(stdout, "\n");
    }
  }

  template <class Cell>
  void line(std::FILE* out, const std::string& name, Cell cell) const {
    std::fprintf(out, "%-26s", name.c_str());
    for (std::int64_t t : runs().thread_counts()) std::fprintf(out, "%26s", cell(t).c_str());
  }

  bool has(const std::string& name) const { return runs().has(name); }

  // The median aggregate when repeated (its counters are the medians too), else the only run.
  sample_t value(const std::string& name, std::int64_t threads) const {
    const Run* run = runs().median(name, threads);
    return run == nullptr ? sample_t{} : sample(*run);
  }

  // The mean over the repetitions when repeated, else the only run's; -1 if there is none.
  double shared_shard(const std::string& name, std::int64_t threads) const {
    const Run* run = runs().aggregate(name, threads, "mean");
    if (run == nullptr) run = runs().median(name, threads);
    return run == nullptr ? -1 : sample(*run).shared_shard;
  }

  // ns per op on one thread: every thread ran the same ops in the same wall time.
  double per_thread(const std::string& name, std::int64_t threads) const {
    return value(name, threads).time * static_cast<double>(threads);
  }
};

// A benchmark's own MinTime would override --benchmark_min_time, so it is set only when the
// command line does not ask for another.
bool default_min_time = true;

void register_case(const char* name, group_t group, void (*function)(benchmark::State&),
                   int max_threads) {
  rows.push_back({name, group});
  auto* benchmark =
      benchmark::RegisterBenchmark(name, function)->ThreadRange(1, max_threads)->UseRealTime();
  if (default_min_time) benchmark->MinTime(kMinTimeSeconds);
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]).starts_with("--benchmark_min_time")) default_min_time = false;
  }
  const int hardware_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  register_case("budget/add_then_check", group_t::budget, reserve_release<teardown::budget>,
                hardware_threads);
  register_case("budget/exact", group_t::budget, reserve_release<teardown::exact_budget>,
                hardware_threads);
  register_case("peer/mutex_budget", group_t::budget, reserve_release<mutex_budget>,
                hardware_threads);
  register_case("limit/fetch_add_pair", group_t::budget, limit_op<fetch_add_pair_limit>,
                hardware_threads);
  register_case("limit/fetch_add", group_t::budget, limit_op<fetch_add_limit>, hardware_threads);

  register_case("budget_tight/add_then_check", group_t::budget_tight,
                reserve_release_tight<teardown::budget>, hardware_threads);
  register_case("budget_tight/exact", group_t::budget_tight,
                reserve_release_tight<teardown::exact_budget>, hardware_threads);

  register_case("limit/no_check", group_t::static_key, calls<ungated_call>, hardware_threads);
  register_case("const_key/false", group_t::static_key,
                calls<gated_call<teardown::const_key<false>>>, hardware_threads);
  register_case("static_key/off", group_t::static_key, calls<gated_call<off_gate>>,
                hardware_threads);
  register_case("static_key/on", group_t::static_key, calls<gated_call<on_gate>>, hardware_threads);

  register_case("counter/sharded", group_t::counter, sharded<0>, hardware_threads);
  register_case("counter/sharded_256", group_t::counter, sharded<256>, hardware_threads);
  register_case("peer/shared_atomic", group_t::counter, shared_atomic, hardware_threads);
  register_case("limit/own_line_fetch_add", group_t::counter, own_line_fetch_add, hardware_threads);
  register_case("limit/thread_local_plain", group_t::counter, thread_local_plain, hardware_threads);

  benchmark::AddCustomContext("budget_counter_static_key_bench charge per reserve",
                              std::to_string(kCharge));
  benchmark::AddCustomContext("budget_counter_static_key_bench budget_tight hold ops",
                              std::to_string(kHoldOps));
  benchmark::AddCustomContext("budget_counter_static_key_bench sharded_counter shards",
                              std::to_string(teardown::sharded_counter().shard_count()));
#ifdef NDEBUG
  benchmark::AddCustomContext("teardown asserts", "off (NDEBUG)");
#else
  benchmark::AddCustomContext("teardown asserts", "on");
  std::fputs("budget_counter_static_key_bench: built without NDEBUG: budget::release's assert is in the "
             "timings\n",
             stderr);
#endif

  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  gate_reporter reporter(isatty(STDOUT_FILENO) ? benchmark::ConsoleReporter::OO_ColorTabular
                                               : benchmark::ConsoleReporter::OO_Tabular);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
