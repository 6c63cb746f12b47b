// deferred_delete: free a 1 GiB std::vector<char> without paying for it on the caller's thread.
//
// Giving a big buffer back is not free: the kernel has to release every page of it, which takes
// tens of milliseconds for a gigabyte. A std::unique_ptr whose deleter is
// teardown::deferred_deleter hands the buffer to a reaper thread instead: the caller's reset()
// returns at once, and the reaper (nice 19) frees the memory in the background. Small objects
// are still deleted inline, where that is cheaper than queuing them. On a busy machine the
// reaper's flush() raises its priority while it waits (it says so when it did).
//
// The program frees one touched buffer the deferred way and one of the same size inline, and
// prints what each cost the caller. `--small` uses 64 MiB instead of 1 GiB (ctest runs that);
// `--help` lists the options.
#include <teardown/deferred.hpp>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <memory>
#include <vector>

#include "example_args.hpp"

namespace {

using buffer = std::vector<char>;
using stopwatch = std::chrono::steady_clock;

double ms_since(stopwatch::time_point start) {
  return std::chrono::duration<double, std::milli>(stopwatch::now() - start).count();
}

// A buffer of `bytes` with every page written, so the kernel has really backed all of it.
std::unique_ptr<buffer> touched_buffer(std::size_t bytes) {
  auto data = std::make_unique<buffer>(bytes);
  for (std::size_t at = 0; at < bytes; at += 4096) (*data)[at] = 1;
  return data;
}

}  // namespace

int main(int argc, char** argv) {
  bool small = false;
  example::command_line cli(
      "deferred_delete",
      "Frees a touched 1 GiB std::vector<char> through teardown::deferred_deleter, and one inline,\n"
      "and prints what each cost the caller.");
  cli.flag("--small", small, "64 MiB instead of 1 GiB (what ctest runs)");
  cli.parse(argc, argv);
  const std::size_t bytes = small ? std::size_t{64} << 20 : std::size_t{1} << 30;

  // The default domain is created on first use; creating it here keeps its thread start out of
  // the timing below. (Your own: teardown::deferred_domain mine(options), then
  // teardown::deferred_deleter<buffer>{mine}.)
  teardown::deferred_domain& domain = teardown::deferred::default_domain();
  std::printf("deferred_delete: threshold %llu KiB, at most %llu MiB pending\n",
              static_cast<unsigned long long>(domain.threshold() >> 10),
              static_cast<unsigned long long>(domain.max_pending() >> 20));

  // 1. Deferred. deferred_ptr<buffer> is std::unique_ptr<buffer, teardown::deferred_deleter<buffer>>.
  //    A vector costs its capacity (1 GiB here), far above the threshold: reset() queues it.
  teardown::deferred_ptr<buffer> deferred(touched_buffer(bytes).release());
  const stopwatch::time_point release_start = stopwatch::now();
  deferred.reset();
  const double deferred_release_ms = ms_since(release_start);

  // flush() waits until the reaper has freed everything handed over so far. A real program
  // rarely needs it; here it shows how long the reaper worked, and keeps the two runs apart.
  const stopwatch::time_point flush_start = stopwatch::now();
  teardown::deferred::flush();
  const double reaper_ms = ms_since(flush_start);

  // 2. Inline, for comparison: the same-sized buffer freed on this thread.
  std::unique_ptr<buffer> inline_buffer = touched_buffer(bytes);
  const stopwatch::time_point inline_start = stopwatch::now();
  inline_buffer.reset();
  const double inline_release_ms = ms_since(inline_start);

  std::printf("freeing a touched %zu MiB std::vector<char>, as seen by the caller:\n", bytes >> 20);
  std::printf("  deferred: %9.3f ms   (then flush() waited %.3f ms for the reaper)\n", deferred_release_ms,
              reaper_ms);
  std::printf("  inline:   %9.3f ms\n", inline_release_ms);
  // On a busy machine the nice-19 reaper gets a sliver of a CPU; a flush() that waits longer
  // than the reaper's boost_after (10 ms) raises it to this thread's nice until it is drained.
  const teardown::reaper_stats worker = domain.worker_stats();
  if (worker.boosts != 0) {
    std::printf("  (the reaper was boosted %llu time(s) while flush() waited: a busy machine, or a free slower than\n"
                "   10 ms; without the boost its wait would grow with the load)\n",
                static_cast<unsigned long long>(worker.boosts));
  }
  if (worker.helped != 0) {
    std::printf("  (flush() tore down %llu queued item(s) itself while it waited: no raise of the reaper was in\n"
                "   force, as for an ordinary user, whose reaper keeps its creator's nice)\n",
                static_cast<unsigned long long>(worker.helped));
  }

  // 3. A small object is deleted inline: queuing it would cost more than deleting it.
  const teardown::decision small_one = teardown::deferred_delete(new buffer(1000));
  std::printf("a 1000-byte vector: %s (deleted inline, below the threshold)\n", teardown::to_string(small_one));

  // 4. shared_ptr takes the same deleter; the last owner to let go triggers it.
  std::shared_ptr<buffer> shared(touched_buffer(bytes / 4).release(), teardown::deferred_deleter<buffer>{});
  std::shared_ptr<buffer> another_owner = shared;
  shared.reset();
  another_owner.reset();  // queued here
  teardown::deferred::flush();

  const teardown::deferred_stats stats = teardown::deferred::stats();
  std::printf("stats: queued %llu, reaped %llu, freed inline %llu (below the threshold %llu, budget full %llu), "
              "pending %llu bytes, high water %llu MiB\n",
              static_cast<unsigned long long>(stats.queued), static_cast<unsigned long long>(stats.reaped),
              static_cast<unsigned long long>(stats.inline_total), static_cast<unsigned long long>(stats.inline_small),
              static_cast<unsigned long long>(stats.inline_rejected), static_cast<unsigned long long>(stats.pending),
              static_cast<unsigned long long>(stats.high_water >> 20));
  // Whatever is still queued when main returns is freed at exit, before the reaper is joined.
  return stats.queued == stats.reaped && stats.pending == 0 ? 0 : 1;
}
