// teardown/allocator_trim.hpp — give freed heap memory back to the system, from a worker.
//
// Freed is not returned: malloc keeps what a program frees for its next allocations. glibc
// gives a free chunk back only when it was mmap()ed (from 128 KiB up, until a large free raises
// that threshold) or when it ends the heap; a gigabyte of medium objects freed behind one live
// block stays resident; jemalloc, tcmalloc and mimalloc keep freed pages too, each until its own
// decay or purge. A trim hands the free pages back: by default the purge of the allocator that
// serves malloc, found at run time (allocator_purge.hpp: malloc_trim(0) under glibc, mallctl's
// arena purge under jemalloc, ReleaseFreeMemory under tcmalloc, mi_collect under mimalloc).
// That costs milliseconds for a big heap: on a producer it is a stall, on the worker that just
// freed the memory it costs nobody's latency. So a composition's worker calls after_batch()
// once per batch, and the trimmer trims when the batches since the last trim freed at least
// `after` (in the composition's cost units: bytes for a deferred_domain): at most one trim per
// `after` freed, and at most `after` left untrimmed once the worker is idle. A min_interval
// caps the rate further, at a price: what is freed within it after a trim waits for a batch
// after it, and with no further batch stays in the heap, until a flush (whose trim the interval
// does not hold back).
//
//     allocator_trimmer trimmer({.after = 64 << 20});
//     trimmer.freed(bytes);      // once the memory is free (after the destroy), any thread
//     trimmer.after_batch();     // on the worker only, after a batch: trims when due
//
// Who may call what
//   constructor   any thread; std::invalid_argument, building nothing, for a negative
//                 min_interval or a null trim function while after is not 0.
//   freed         any thread, concurrently, after the memory it counts is free (a trim that
//                 runs before the free cannot return it, and would consume its count);
//                 wait-free (one relaxed RMW; nothing when off).
//   after_batch   the threads that may trim: a composition calls it on its workers only, never
//                 on a producer, and not once its worker has stopped. Concurrent calls trim at
//                 most once per min_interval between them (a CAS claims the trim); blocking
//                 while it trims. The trim consumes, with one exchange, exactly the count it
//                 read: a count added meanwhile stays for the next trim.
//   due           any thread; wait-free: after_batch would find enough freed (interval aside).
//   begin_settle, end_settle
//                 any thread; wait-free. Between them (a flush waiting), a batch end trims
//                 once settle_floor() (after / 16) is freed: a flush leaves at most that much.
//   collect_after_flush
//                 the thread whose flush completed; blocking while it collects (mimalloc only).
//   stats         any thread; wait-free.
// basic_allocator_trimmer<Sync> is the same over a Sync policy's atomics and clock (sync.hpp):
// an async_teardown's trimmer takes its workers' policy, a test scheduler's in schedule tests.
//
// A trim function that returns a negative value could call nothing (the default under an
// allocator it does not know, allocator_kind::other): that is not a trim, and is not counted
// in trims, trimmed_bytes or trim_cpu_ns. What a trim returned is measured as the process's
// resident set just before the call less just after it (/proc/self/statm): the allocator's own
// statistics do not see pages it madvise()s away. Other threads allocating or freeing
// meanwhile move that figure too.
// Design: docs/design.md, "allocator_trim: giving freed memory back".
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#if defined(__GLIBC__)  // defined by the C library's headers above
#include <malloc.h>
#endif

#include "teardown/allocator_purge.hpp"
#include "teardown/sync.hpp"
#include "teardown/worker_thread.hpp"

namespace teardown {

namespace detail {

// glibc's malloc_trim whatever serves malloc; elsewhere nothing to call (returns 0: nothing
// released). The trimmer's default is allocator_purge (allocator_purge.hpp) instead.
inline int system_malloc_trim(std::size_t pad) noexcept {
#if defined(__GLIBC__)
  return malloc_trim(pad);
#else
  (void)pad;
  return 0;
#endif
}

// This process's resident set in bytes (/proc/self/statm), 0 if unreadable.
inline std::uint64_t resident_bytes() noexcept {
  const int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char text[128];
  const ssize_t got = read(fd, text, sizeof text - 1);
  close(fd);
  if (got <= 0) return 0;
  text[got] = '\0';
  char* at = text;
  (void)std::strtoull(at, &at, 10);  // size
  const unsigned long long pages = std::strtoull(at, nullptr, 10);
  return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace detail

struct trim_options {
  std::uint64_t after = 0;  // trim once the batches since the last trim freed this much (the
                            // composition's cost units: bytes for a deferred_domain); 0: never
  std::chrono::nanoseconds min_interval{0};  // at most one trim per interval; 0: no limit but after
  int (*trim)(std::size_t pad) = &detail::allocator_purge;  // the allocator's purge, found at
                            // run time (allocator_purge.hpp); a function of the program's may
                            // stand in. A negative return: nothing could be called, no trim
};

struct trim_stats {
  std::uint64_t trims = 0;           // trims made
  std::uint64_t trimmed_bytes = 0;   // what they returned: the resident set's drop across each
  std::uint64_t trim_cpu_ns = 0;     // the CPU they took, on the threads that trimmed
};

/// The trimmer over a Sync policy's atomics and clock (sync.hpp): std_sync in programs
/// (allocator_trimmer), a test scheduler's where a schedule test interleaves its callers.
template <class Sync = std_sync>
class basic_allocator_trimmer {
  template <class W>
  using atomic = typename Sync::template atomic<W>;

 public:
  explicit basic_allocator_trimmer(trim_options opts = {}) : opts_(validated(opts)) {}
  basic_allocator_trimmer(const basic_allocator_trimmer&) = delete;
  basic_allocator_trimmer& operator=(const basic_allocator_trimmer&) = delete;

  bool enabled() const noexcept { return opts_.after != 0; }

  void freed(std::uint64_t cost) noexcept {
    if (!enabled()) return;
    freed_since_trim_.fetch_add(cost, std::memory_order_relaxed);
    freed_total_.fetch_add(cost, std::memory_order_relaxed);
  }

  /// True once the batches since the last trim freed `after`, or, while a settle is open, at
  /// least settle_floor() (ignoring min_interval).
  bool due() const noexcept {
    if (!enabled()) return false;
    const std::uint64_t freed = freed_since_trim_.load(std::memory_order_relaxed);
    return freed >= opts_.after || (freed >= settle_floor() && settling_.load(std::memory_order_relaxed) != 0);
  }

  /// While a settle is open (a flush waiting for the worker), a batch end trims what is left once
  /// it reaches this: 1/16 of `after` (4 MiB of the default 64 MiB), so that a flush leaves at
  /// most that much untrimmed instead of `after`, and a flush of a few small items trims nothing.
  std::uint64_t settle_floor() const noexcept { return std::max<std::uint64_t>(opts_.after / 16, 1); }

  /// Opens and closes a settle (any thread; counted, so settles may overlap). The worker reads
  /// the count relaxed: a settle opened before a flush's request is visible to the pass that
  /// serves the flush through the flush's own hand-off (the reaper's control mutex).
  void begin_settle() noexcept { settling_.fetch_add(1, std::memory_order_relaxed); }
  void end_settle() noexcept { settling_.fetch_sub(1, std::memory_order_relaxed); }

  /// On the thread whose flush just completed (its settle closed): under mimalloc with the
  /// default trim, collect_here() once settle_floor() more was freed since the last such
  /// collect. mimalloc queues a block another thread frees for the heap of the thread that
  /// allocated it, and only that thread's collect gives it back: the worker's purge cannot,
  /// the flushing thread (often the one that built what it flushed) can. True if it collected;
  /// blocking while it does (mi_collect(true): milliseconds on a big heap).
  bool collect_after_flush() noexcept {
    if (!enabled() || opts_.trim != &detail::allocator_purge) return false;
    if (detect_allocator() != allocator_kind::mimalloc) return false;
    const std::uint64_t total = freed_total_.load(std::memory_order_relaxed);
    std::uint64_t last = collected_at_.load(std::memory_order_relaxed);
    if (total - last < settle_floor()) return false;
    // One collect per floor freed among concurrent flushes; the loser's flush collects nothing.
    if (!collected_at_.compare_exchange_strong(last, total, std::memory_order_relaxed)) return false;
    return collect_here();
  }

  // True if it trimmed (a trim function that returned a negative value did not).
  bool after_batch() noexcept {
    if (!due()) return false;
    const std::uint64_t now = Sync::now_ns();
    std::uint64_t last = last_trim_ns_.load(std::memory_order_relaxed);
    // A settle (a flush waiting for its memory) is not rate-capped: it was asked for.
    const bool settling = settling_.load(std::memory_order_relaxed) != 0;
    if (!settling && last != 0 && now - last < static_cast<std::uint64_t>(opts_.min_interval.count())) return false;
    // Claims this trim; a concurrent caller that loses sees the new time and waits its interval.
    if (!last_trim_ns_.compare_exchange_strong(last, now, std::memory_order_relaxed)) return false;
    // Consumes what was counted so far, and only that: a freed() after this exchange stays for
    // the next trim (a store of 0 would drop a count that came between the load and the store;
    // a fetch_sub of the value due() read could go below zero when two claims race at
    // min_interval 0). Relaxed: the count is a heuristic of what is free, no data rides on it.
    (void)freed_since_trim_.exchange(0, std::memory_order_relaxed);
    const std::uint64_t resident_before = detail::resident_bytes();
    const std::uint64_t cpu_before = detail::thread_cpu_ns();
    if (opts_.trim(0) < 0) return false;  // nothing to call: not a trim
    const std::uint64_t cpu = detail::thread_cpu_ns() - cpu_before;
    const std::uint64_t resident_after = detail::resident_bytes();
    trims_.fetch_add(1, std::memory_order_relaxed);
    if (resident_before > resident_after) {
      trimmed_bytes_.fetch_add(resident_before - resident_after, std::memory_order_relaxed);
    }
    trim_cpu_ns_.fetch_add(cpu, std::memory_order_relaxed);
    return true;
  }

  trim_stats stats() const noexcept {
    return {trims_.load(std::memory_order_relaxed), trimmed_bytes_.load(std::memory_order_relaxed),
            trim_cpu_ns_.load(std::memory_order_relaxed)};
  }

 private:
  static trim_options validated(trim_options opts) {
    if (opts.min_interval.count() < 0) {
      throw std::invalid_argument("teardown::allocator_trimmer: trim.min_interval is negative (" +
                                  std::to_string(opts.min_interval.count()) + " ns)");
    }
    if (opts.after != 0 && opts.trim == nullptr) {
      throw std::invalid_argument("teardown::allocator_trimmer: trim.trim is null while trim.after is " +
                                  std::to_string(opts.after) + " (0 turns trimming off)");
    }
    return opts;
  }

  const trim_options opts_;
  atomic<std::uint64_t> freed_since_trim_{0};
  atomic<std::uint64_t> freed_total_{0};
  atomic<std::uint32_t> settling_{0};  // open settles (begin_settle)
  atomic<std::uint64_t> collected_at_{0};  // freed_total_ at the last collect_after_flush
  atomic<std::uint64_t> last_trim_ns_{0};  // 0: never trimmed
  atomic<std::uint64_t> trims_{0};
  atomic<std::uint64_t> trimmed_bytes_{0};
  atomic<std::uint64_t> trim_cpu_ns_{0};
};

using allocator_trimmer = basic_allocator_trimmer<>;

}  // namespace teardown
