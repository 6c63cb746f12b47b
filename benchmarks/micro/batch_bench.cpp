// batch_bench — what handing work over as a chain saves (seed 004's page-sized batches, made
// generic as async_teardown::put_chain), beside one put per item and the physical limit, in one
// binary and one run.
//
// An iteration hands N items over (N = the argument: 1, 16, 256, 1016 — 1016 is a swap_batch's
// capacity), then waits until they are all torn down. Only the hand-over is timed (manual time:
// two steady_clock reads around it, no PauseTiming, whose own cost would swamp a short chain),
// and the reaper is frozen meanwhile, so that neither its wake-up nor its del_all racing the
// producer lands in one case's timing and not another's.
// Each case runs 10000 iterations and reports items_per_second; ns per item = 1e9 /
// items_per_second.
//   async/put_each        N calls of async_teardown::put on a running reaper: N cost reads, N
//                         reservations, N CAS on the queue head (racing the reaper's del_all)
//   async/put_chain       push_back N items into an llist_chain, one put_chain: N cost reads,
//                         one reservation, one CAS, at most one wake-up
//   limit/llist_add_each  N llist::add on a list nobody else touches: the floor of N publishes
//   limit/llist_add_batch push_back N items and one llist::add_batch: the floor of publishing a
//                         chain (what put_chain adds to it is the composition's own work)
// The teardown itself is trivial (a counter), so the figures are the hand-over's cost alone.
#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

#include "teardown/async_teardown.hpp"
#include "teardown/llist.hpp"

namespace {

struct job {
  teardown::llist_node hook;
  std::uint64_t cost = 1;
  std::uint64_t charge = 0;
};

std::atomic<std::uint64_t> torn_down{0};

struct job_traits {
  std::uint64_t cost(const job& j) const noexcept { return j.cost; }
  bool eligible(const job&, std::uint64_t) const noexcept { return true; }
  void prepare(job&) noexcept {}
  void destroy(job&) noexcept { torn_down.fetch_add(1, std::memory_order_relaxed); }
  std::uint64_t& charge(job& j) noexcept { return j.charge; }
};

using job_async = teardown::async_teardown<job, &job::hook, job_traits>;
using job_chain = teardown::llist_chain<job, &job::hook>;
using job_list = teardown::llist<job, &job::hook>;

// Lets a frozen reaper tear down what was handed over, then freezes it again.
void thawed_flush(job_async& async) {
  async.thaw();
  async.flush();
  async.freeze();
}

// Times hand_over() alone, then runs settle() untimed, every iteration.
template <class HandOver, class Settle>
void timed_hand_over(benchmark::State& state, HandOver hand_over, Settle settle) {
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    hand_over();
    const auto stop = std::chrono::steady_clock::now();
    state.SetIterationTime(std::chrono::duration<double>(stop - start).count());
    settle();
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

void put_each(benchmark::State& state) {
  std::vector<job> jobs(static_cast<std::size_t>(state.range(0)));
  job_async async({.reaper = {.name = "batch_bench"}});
  async.freeze();
  timed_hand_over(
      state, [&] { for (job& j : jobs) benchmark::DoNotOptimize(async.put(j)); }, [&] { thawed_flush(async); });
  async.thaw();
}

void put_chain(benchmark::State& state) {
  std::vector<job> jobs(static_cast<std::size_t>(state.range(0)));
  job_async async({.reaper = {.name = "batch_bench"}});
  async.freeze();
  timed_hand_over(
      state,
      [&] {
        job_chain chain;
        for (job& j : jobs) chain.push_back(j);
        benchmark::DoNotOptimize(async.put_chain(std::move(chain)));
      },
      [&] { thawed_flush(async); });
  async.thaw();
}

void llist_add_each(benchmark::State& state) {
  std::vector<job> jobs(static_cast<std::size_t>(state.range(0)));
  job_list list;
  timed_hand_over(
      state, [&] { for (job& j : jobs) benchmark::DoNotOptimize(list.add(j)); },
      [&] { for (job& j : list.del_all()) benchmark::DoNotOptimize(&j); });
}

void llist_add_batch(benchmark::State& state) {
  std::vector<job> jobs(static_cast<std::size_t>(state.range(0)));
  job_list list;
  timed_hand_over(
      state,
      [&] {
        job_chain chain;
        for (job& j : jobs) chain.push_back(j);
        benchmark::DoNotOptimize(list.add_batch(std::move(chain)));
      },
      [&] { for (job& j : list.del_all()) benchmark::DoNotOptimize(&j); });
}

void lengths(benchmark::internal::Benchmark* b) {
  for (int n : {1, 16, 256, 1016}) b->Arg(n);
  // A fixed count: with manual time, Google Benchmark would run until the timed part alone
  // reached its minimum time, and the untimed freeze/flush/thaw of every iteration (tens of
  // microseconds against a hand-over of tens of nanoseconds) would stretch that to minutes.
  b->UseManualTime()->Iterations(10000);
}

BENCHMARK(put_each)->Name("async/put_each")->Apply(lengths);
BENCHMARK(put_chain)->Name("async/put_chain")->Apply(lengths);
BENCHMARK(llist_add_each)->Name("limit/llist_add_each")->Apply(lengths);
BENCHMARK(llist_add_batch)->Name("limit/llist_add_batch")->Apply(lengths);

}  // namespace

BENCHMARK_MAIN();
