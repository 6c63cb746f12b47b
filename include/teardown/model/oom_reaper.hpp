// teardown/model/oom_reaper.hpp — the OOM reaper and its chunk walk (part of model/mm.hpp), after
// the OOM reaper series (zhongjinji, v10).
//
// oom_kill, after marking and killing, queues the victim's mm here (once: MMF_OOM_REAP_QUEUED)
// and holds a struct reference (mmgrab) for it, which the reap drops. The oom_reaper thread (a
// teardown::reaper of its own, nice 0, never frozen) releases the victim's memory a chunk
// (oom_reap_chunk_bytes, 2 MiB) at a time with MADV_DONTNEED, while the victim's own exit
// (exit_walk, from __mmput) unmaps the same mm chunk by chunk from the low end:
//
//   side          starts at                          per chunk        counts
//   exit path     the low end, walking up            munmap, once     exit_pages, exit_chunks
//   oom_reaper    "other" (default): the high end,   MADV_DONTNEED,   reaper_pages, reaper_chunks
//                 walking down; "same": the low end  mapped ones only
//
// Who releases which chunk is settled per chunk under mmap_lock (mm_struct::walk): a side claims
// a chunk under the lock, drops the lock for its syscall, retakes it to record the chunk done,
// and waits for a chunk the other side holds. Each resident page is counted by exactly one side;
// only the exit path unmaps and runs __mmput, so an mm is torn down exactly once. An mm no reap
// was queued for is unmapped in one munmap, as before. The reaper first waits the reap delay
// (the kernel's OOM_REAPER_DELAY; the model's default 0), which begin_stopping() cuts short.
//
// Who may call what (oom_reaper is a part of basic_mm_system, which calls it)
//   queue                  oom_kill, holding an mm_count reference for the reaper; lock-free.
//   exit_walk              __mmput, holding mmap_lock (dropped and retaken per chunk).
//   flush                  any thread but the oom_reaper; blocks until every victim queued
//                          before the call is reaped (its delay included).
//   direction, set_direction, delay, set_delay, stats, worker_stats, begin_stopping
//                          any thread; wait-free.
//
// Memory ordering: the walk is guarded by mmap_lock; the counters are relaxed, except `reaped`, a
// snapshot_count: added last after a victim's walk and read first by stats(), so
// reaped <= queued in every snapshot.
// Design: docs/design.md, "The model's OOM reaper and its chunk walk".
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <utility>

#include "teardown/model/mm_struct.hpp"
#include "teardown/reaper.hpp"
#include "teardown/snapshot_count.hpp"

namespace teardown::model {

/// vm.oom_reap_direction: where the oom_reaper starts on a victim the exit path is tearing down
/// from the low end.
enum class reap_direction : std::uint8_t {
  same,   // the low end too, walking up: the two sides meet chunk after chunk
  other,  // the high end, walking down: they meet once, in the middle (the OOM reaper series' patch 2)
};

/// "same" or "other", as the knob reads and writes it.
constexpr const char* to_string(reap_direction d) noexcept { return d == reap_direction::same ? "same" : "other"; }

/// The unit of an OOM victim's chunked teardown (a page table's reach on x86-64 with 4 KiB pages).
inline constexpr std::size_t oom_reap_chunk_bytes = std::size_t{2} << 20;

/// What the oom_reaper and the OOM victims' chunked exits did (the OOM reaper series), summed
/// over victims. Times are steady_clock nanoseconds, each on the side's own thread.
struct oom_reap_stats {
  std::uint64_t queued = 0;          // victims oom_kill queued for the oom_reaper (once per mm)
  std::uint64_t reaped = 0;          // victims the oom_reaper is done with
  std::uint64_t skipped = 0;         // subset of reaped: already torn down (or MMF_OOM_SKIP)
  std::uint64_t errors = 0;          // a MADV_DONTNEED failed; the exit path released the rest
  std::uint64_t reaper_pages = 0;    // pages the oom_reaper released (MADV_DONTNEED)
  std::uint64_t reaper_chunks = 0;   // chunks it released
  std::uint64_t reaper_work_ns = 0;  // its time in madvise
  std::uint64_t reaper_wait_ns = 0;  // its time waiting for a chunk the exit path held
  std::uint64_t exit_pages = 0;      // pages the victims' exit paths released (munmap)
  std::uint64_t exit_chunks = 0;     // chunks they unmapped
  std::uint64_t exit_work_ns = 0;    // their time in munmap
  std::uint64_t exit_wait_ns = 0;    // their time waiting for a chunk the oom_reaper held
};

/// The oom_reaper thread and both sides of the chunk walk: a part of basic_mm_system.
class oom_reaper {
 public:
  /// Starts the thread "oom_reaper" at nice 0. Throws std::system_error if it cannot start.
  oom_reaper() = default;
  oom_reaper(const oom_reaper&) = delete;
  oom_reaper& operator=(const oom_reaper&) = delete;

  /// From now on no victim waits out the delay (the owner's destructor calls this first).
  void begin_stopping() noexcept { stopping_.store(true, std::memory_order_relaxed); }

  /// Queues a victim; the caller holds a struct reference (mmgrab) that the reap drops.
  void queue(mm_struct& mm) {
    mm.oom_reap.queued_at_ns = teardown::detail::monotonic_ns();
    counts_.queued.fetch_add(1, std::memory_order_relaxed);  // before the enqueue: reaped never overtakes it
    reaper_.enqueue(mm.oom_reap);
  }

  reap_direction direction() const noexcept { return direction_.load(std::memory_order_relaxed); }
  void set_direction(reap_direction direction) noexcept { direction_.store(direction, std::memory_order_relaxed); }
  std::chrono::nanoseconds delay() const noexcept {
    return std::chrono::nanoseconds(delay_ns_.load(std::memory_order_relaxed));
  }
  /// The caller has refused a negative delay.
  void set_delay(std::chrono::nanoseconds delay) noexcept {
    delay_ns_.store(static_cast<std::uint64_t>(delay.count()), std::memory_order_relaxed);
  }

  void flush() { reaper_.flush(); }

  /// A snapshot; reaped is read before queued, so reaped <= queued.
  oom_reap_stats stats() const noexcept {
    oom_reap_stats s;
    // First (snapshot_count.hpp): the queued add of every victim counted in reaped happened
    // before that add (through the oom_reaper's queue).
    s.reaped = counts_.reaped.read_first();
    s.skipped = counts_.skipped.load(std::memory_order_relaxed);
    s.queued = counts_.queued.load(std::memory_order_relaxed);
    s.errors = counts_.errors.load(std::memory_order_relaxed);
    s.reaper_pages = counts_.reaper_pages.load(std::memory_order_relaxed);
    s.reaper_chunks = counts_.reaper_chunks.load(std::memory_order_relaxed);
    s.reaper_work_ns = counts_.reaper_work_ns.load(std::memory_order_relaxed);
    s.reaper_wait_ns = counts_.reaper_wait_ns.load(std::memory_order_relaxed);
    s.exit_pages = counts_.exit_pages.load(std::memory_order_relaxed);
    s.exit_chunks = counts_.exit_chunks.load(std::memory_order_relaxed);
    s.exit_work_ns = counts_.exit_work_ns.load(std::memory_order_relaxed);
    s.exit_wait_ns = counts_.exit_wait_ns.load(std::memory_order_relaxed);
    return s;
  }
  /// The oom_reaper thread's own statistics (CPU time, wake-ups...).
  reaper_stats worker_stats() const noexcept { return reaper_.stats(); }

  // The exit path's side (under mmap_lock): unmaps every chunk, low to high, each exactly once.
  // It waits for a chunk the oom_reaper holds, then unmaps it too (its pages are gone already:
  // they were the oom_reaper's to count).
  void exit_walk(mm_struct& mm, std::unique_lock<std::mutex>& lock) noexcept {
    chunk_walk& walk = mm.walk;
    start_walk(mm);
    while (walk.unmapped_below < walk.chunks) {
      const std::uint64_t c = walk.unmapped_below;
      if (walk.reaper_busy == c) {
        wait_for_chunk(mm, lock, counts_.exit_wait_ns);
        continue;
      }
      const std::uint64_t pages = walk.resident(c) ? walk.pages_in(c) : 0;
      const auto [at, bytes] = chunk_range(mm, c);
      walk.exit_busy = true;
      lock.unlock();
      const std::uint64_t start = teardown::detail::monotonic_ns();
      if (at != nullptr) munmap(at, bytes);
      const std::uint64_t took = teardown::detail::monotonic_ns() - start;
      lock.lock();
      walk.exit_busy = false;
      walk.unmapped_below = c + 1;
      walk.exit_pages += pages;
      mm.rss_pages.fetch_sub(static_cast<std::int64_t>(pages), std::memory_order_relaxed);
      mm.chunk_released.notify_all();
      counts_.exit_pages.fetch_add(pages, std::memory_order_relaxed);
      counts_.exit_chunks.fetch_add(1, std::memory_order_relaxed);
      counts_.exit_work_ns.fetch_add(took, std::memory_order_relaxed);
    }
  }

 private:
  // At most this many chunks for simulated memory: a huge simulated RSS gets larger chunks, so
  // that a walk costs bounded bookkeeping. Real memory always walks oom_reap_chunk_bytes.
  static constexpr std::uint64_t max_simulated_chunks = std::uint64_t{1} << 16;

  // The first side to arrive lays out the chunks, from the mapping and the RSS as they are now.
  static void start_walk(mm_struct& mm) noexcept {
    chunk_walk& walk = mm.walk;
    if (walk.started) return;
    walk.started = true;
    walk.rss_at_start = get_mm_rss(mm);
    const std::uint64_t natural = std::max<std::uint64_t>(oom_reap_chunk_bytes / detail::page_size(), 1);
    if (mm.base != nullptr) {
      walk.chunk_pages = natural;
      const std::uint64_t chunk_bytes = natural * detail::page_size();
      walk.chunks = (mm.mapped_bytes + chunk_bytes - 1) / chunk_bytes;
    } else {
      walk.chunk_pages = std::max(natural, (walk.rss_at_start + max_simulated_chunks - 1) / max_simulated_chunks);
      walk.chunks = (walk.rss_at_start + walk.chunk_pages - 1) / walk.chunk_pages;
    }
  }

  // Chunk c of a real mapping; {nullptr, 0} for simulated memory. base and mapped_bytes stay put
  // until the exit path has unmapped the last chunk.
  static std::pair<std::byte*, std::size_t> chunk_range(const mm_struct& mm, std::uint64_t c) noexcept {
    if (mm.base == nullptr) return {nullptr, 0};
    const std::size_t chunk_bytes = mm.walk.chunk_pages * detail::page_size();
    const std::size_t begin = c * chunk_bytes;
    return {mm.base + begin, std::min(chunk_bytes, mm.mapped_bytes - begin)};
  }

  // Sleeps until the other side lets go of a chunk (mmap_lock dropped meanwhile); the caller
  // looks again. The time goes to `waited`.
  static void wait_for_chunk(mm_struct& mm, std::unique_lock<std::mutex>& lock,
                             std::atomic<std::uint64_t>& waited) noexcept {
    const std::uint64_t since = teardown::detail::monotonic_ns();
    mm.chunk_released.wait(lock);
    waited.fetch_add(teardown::detail::monotonic_ns() - since, std::memory_order_relaxed);
  }

  // Records chunk c released by the oom_reaper. Its walk is contiguous, except that walking up
  // it may jump over chunks the exit path has unmapped: the old run then lies wholly below
  // unmapped_below, and only the new one matters.
  static void mark_reaped(chunk_walk& walk, std::uint64_t c) noexcept {
    if (walk.reaped_lo != walk.reaped_hi && c == walk.reaped_hi) {
      ++walk.reaped_hi;
    } else if (walk.reaped_lo != walk.reaped_hi && c + 1 == walk.reaped_lo) {
      --walk.reaped_lo;
    } else {
      walk.reaped_lo = c;
      walk.reaped_hi = c + 1;
    }
  }

  // The oom_reaper's side: releases (MADV_DONTNEED) every chunk that is still mapped and not
  // held by the exit path, from the end the knob names. Takes mmap_lock itself.
  void reap_walk(mm_struct& mm) noexcept {
    std::unique_lock lock(mm.mmap_lock);
    chunk_walk& walk = mm.walk;
    // Torn down already, or hidden from the OOM killer (the kernel's oom_reaper skips an mm
    // with MMF_OOM_SKIP): nothing to do.
    if (walk.finished || (!walk.started && test_flag(mm, MMF_OOM_SKIP))) {
      counts_.skipped.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    start_walk(mm);
    const bool downward = direction_.load(std::memory_order_relaxed) == reap_direction::other;
    std::uint64_t next = downward ? walk.chunks : 0;  // downward: the next chunk is next - 1
    for (;;) {
      std::uint64_t c = 0;
      if (downward) {
        if (next == 0 || next - 1 < walk.unmapped_below) break;  // the exit path has the rest
        c = next - 1;
      } else {
        c = std::max(next, walk.unmapped_below);  // skip what the exit path has unmapped
        if (c >= walk.chunks) break;
      }
      if (walk.exit_busy && c == walk.unmapped_below) {
        wait_for_chunk(mm, lock, counts_.reaper_wait_ns);
        continue;
      }
      // c is mapped (at or above unmapped_below, not the exit path's), and not released (the
      // walk never comes back to a chunk): all of its pages are still there.
      const std::uint64_t pages = walk.pages_in(c);
      const auto [at, bytes] = chunk_range(mm, c);
      walk.reaper_busy = c;
      lock.unlock();
      const std::uint64_t start = teardown::detail::monotonic_ns();
      const bool released = at == nullptr || madvise(at, bytes, MADV_DONTNEED) == 0;
      const std::uint64_t took = teardown::detail::monotonic_ns() - start;
      lock.lock();
      walk.reaper_busy = chunk_walk::none;
      mm.chunk_released.notify_all();
      counts_.reaper_work_ns.fetch_add(took, std::memory_order_relaxed);
      if (!released) {
        counts_.errors.fetch_add(1, std::memory_order_relaxed);  // the exit path will release the rest
        break;
      }
      mark_reaped(walk, c);
      walk.reaper_pages += pages;
      mm.rss_pages.fetch_sub(static_cast<std::int64_t>(pages), std::memory_order_relaxed);
      counts_.reaper_pages.fetch_add(pages, std::memory_order_relaxed);
      counts_.reaper_chunks.fetch_add(1, std::memory_order_relaxed);
      next = downward ? c : c + 1;
    }
    set_flag(mm, MMF_OOM_SKIP);  // as the kernel's oom_reaper does: the OOM killer moves on
  }

  // Waits out the oom reap delay, polling (no timed wait: see STYLE.md on ThreadSanitizer);
  // begin_stopping() cuts it short.
  void wait_delay(std::uint64_t queued_at_ns) const noexcept {
    for (;;) {
      if (stopping_.load(std::memory_order_relaxed)) return;
      const std::uint64_t delay = delay_ns_.load(std::memory_order_relaxed);
      const std::uint64_t waited = teardown::detail::monotonic_ns() - queued_at_ns;
      if (waited >= delay) return;
      std::this_thread::sleep_for(std::chrono::nanoseconds(std::min<std::uint64_t>(delay - waited, 1'000'000)));
    }
  }

  // On the oom_reaper: one victim.
  void reap(oom_reap_request& request) noexcept {
    mm_struct& mm = *request.mm;
    wait_delay(request.queued_at_ns);
    reap_walk(mm);
    counts_.reaped.add_last();  // after the walk
    detail::mmdrop(mm);  // oom_kill's reference; may free mm
  }

  // What the thread reads comes before it, so it stops before any of that dies.
  struct counters {  // relaxed, except reaped (see stats)
    std::atomic<std::uint64_t> queued{0}, skipped{0}, errors{0};
    snapshot_count reaped;
    std::atomic<std::uint64_t> reaper_pages{0}, reaper_chunks{0}, reaper_work_ns{0}, reaper_wait_ns{0};
    std::atomic<std::uint64_t> exit_pages{0}, exit_chunks{0}, exit_work_ns{0}, exit_wait_ns{0};
  };
  struct reap_fn {
    oom_reaper* owner;
    void operator()(oom_reap_request& request) const noexcept { owner->reap(request); }
  };
  counters counts_;
  std::atomic<reap_direction> direction_{reap_direction::other};
  std::atomic<std::uint64_t> delay_ns_{0};
  std::atomic<bool> stopping_{false};  // set by begin_stopping: no more waiting
  // Not freezable (freeze() is the mm_reaper's), nice 0 like the kernel's oom_reaper kthread.
  reaper<oom_reap_request, &oom_reap_request::node, reap_fn> reaper_{reap_fn{this},
                                                                   reaper_options{.name = "oom_reaper", .nice = 0}};
};

}  // namespace teardown::model
