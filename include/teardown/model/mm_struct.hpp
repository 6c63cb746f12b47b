// teardown/model/mm_struct.hpp — the model mm_struct and its flags (part of model/mm.hpp).
//
// An mm_struct is created by basic_mm_system::mm_alloc and freed by the mmdrop that takes
// mm_count to zero. Its fields are public, as in the kernel; each says who writes it:
//   mm_users      address-space users; the last mmput tears down (a reference_count).
//   mm_count      struct references; all users together hold one (a reference_count).
//   flags         MMF_OOM_SKIP, MMF_OOM_TARGETED, MMF_OOM_REAP_QUEUED; relaxed RMWs (set_bit).
//   rss_pages     approximate (get_mm_rss); reclaim may shrink it while the mm is queued.
//   aio           aio.hpp's context: exit_aio is idempotent and may block.
//   reap_node, reap_charge, queued_at_ns   the mm_reaper's hook, its memoised charge and the
//                 enqueue time, written by mmput_exit before the enqueue.
//   cpu_owner     where the mm_reaper adds the CPU time of this mm's teardown (a cgroup's
//                 account; the question whose CPU the teardown is), if set before the exit.
//   base, mapped_bytes, swap_slots   the real backing memory and the swap entries: mmap_lock.
//   oom_reap, walk, chunk_released   an OOM victim's teardown, shared by its exit path and the
//                 oom_reaper (oom_reaper.hpp): the walk under mmap_lock.
//
// Memory ordering: MMF_OOM_TARGETED is set with a relaxed fetch_or; it reaches the thread that
// makes the final mm_users decrement through the tasklist lock and the release sequence of
// mm_users' puts (reference_count.hpp; the argument: docs/design.md, "The model's OOM ordering").
// Design: docs/design.md, "model/mm.hpp: the kernel's composition, in user space".
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <system_error>
#include <vector>

#include "teardown/llist.hpp"
#include "teardown/model/aio.hpp"
#include "teardown/reference_count.hpp"

namespace teardown::model {

/// Flag bits of mm_struct::flags (the kernel's bit numbers).
inline constexpr unsigned MMF_OOM_SKIP = 21;         // hidden from the OOM killer: already reaped
inline constexpr unsigned MMF_OOM_REAP_QUEUED = 25;  // queued for the oom_reaper (once); sticky
inline constexpr unsigned MMF_OOM_TARGETED = 32;     // the target of an in-flight OOM kill; sticky

enum class backing {
  simulated,  // the RSS is only a number: teardown costs nothing real
  real,       // the RSS is an anonymous mapping, touched at creation and unmapped by teardown
};

struct mm_struct;

/// The oom_reaper's queue hook, a member of the mm pointing back at it. A type of its own so
/// that the oom_reaper's work is not charged to the mm's cpu_owner as the mm_reaper's is.
struct oom_reap_request {
  llist_node node;
  mm_struct* mm = nullptr;         // set by mm_alloc
  std::uint64_t queued_at_ns = 0;  // written by oom_kill before the enqueue
};

/// Where an OOM victim's chunked teardown stands (oom_reaper.hpp). Guarded by the mm's
/// mmap_lock; written by the exit path and the oom_reaper only.
struct chunk_walk {
  static constexpr std::uint64_t none = UINT64_MAX;

  bool started = false;            // a side began the walk; reclaim takes nothing from here on
  bool finished = false;           // the teardown unmapped everything (chunked or in one go)
  std::uint64_t chunks = 0;        // chunk c covers pages [c * chunk_pages, (c + 1) * chunk_pages)
  std::uint64_t chunk_pages = 0;
  std::uint64_t rss_at_start = 0;  // resident then: the first rss_at_start pages (reclaim only
                                   // ever drops the tail)
  std::uint64_t unmapped_below = 0;  // the exit path unmapped chunks [0, unmapped_below) ...
  bool exit_busy = false;            // ... and is unmapping chunk unmapped_below, lock dropped
  std::uint64_t reaped_lo = 0;       // the oom_reaper released chunks [reaped_lo, reaped_hi)
  std::uint64_t reaped_hi = 0;       // (those below unmapped_below are unmapped as well)
  std::uint64_t reaper_busy = none;  // the chunk the oom_reaper is releasing, lock dropped
  std::uint64_t exit_pages = 0;      // pages the exit path's munmaps released
  std::uint64_t reaper_pages = 0;    // pages the oom_reaper's MADV_DONTNEED released

  /// The pages of chunk c that were resident when the walk started.
  std::uint64_t pages_in(std::uint64_t c) const noexcept {
    const std::uint64_t first = c * chunk_pages;
    return first >= rss_at_start ? 0 : std::min(chunk_pages, rss_at_start - first);
  }
  /// Still holds its pages: neither unmapped nor released.
  bool resident(std::uint64_t c) const noexcept {
    return c >= unmapped_below && !(c >= reaped_lo && c < reaped_hi);
  }
};

/// The model mm_struct. Created by mm_system::mm_alloc; freed by the mmdrop that takes
/// mm_count to zero. Fields are public, as in the kernel, with who writes each.
struct mm_struct {
  reference_count mm_users;  // address-space users; the last mmput tears down
  reference_count mm_count;  // struct references (all users together hold one)
  std::atomic<std::uint64_t> flags{0};    // MMF_* bits; set with relaxed RMWs (see header)
  std::atomic<std::int64_t> rss_pages{0};  // approximate; reclaim may shrink it at any time
  aio_context aio;
  llist_node reap_node;                   // the reaper's queue hook
  std::uint64_t reap_charge = 0;          // written by mmput_exit before the enqueue; the reaper
                                          // releases exactly this
  std::uint64_t queued_at_ns = 0;         // written by mmput_exit before the enqueue
  std::atomic<std::uint32_t> teardowns{0};  // __mmput runs: 1 once torn down, never more
  std::atomic<std::uint64_t>* cpu_owner = nullptr;  // if set before the exit: where the reaper
                                          // adds the CPU nanoseconds of this mm's teardown (a
                                          // cgroup's account; the question whose CPU it is)
  std::uint64_t id = 0;                   // unique per mm_system, for trace events

  // The real backing memory, guarded by mmap_lock (reclaim and teardown race on it).
  std::mutex mmap_lock;
  std::byte* base = nullptr;
  std::size_t mapped_bytes = 0;

  // Swap entries (the swap batch release series): the slots swap_out() moved pages to. Guarded
  // by mmap_lock; the teardown takes them all.
  std::vector<std::uint32_t> swap_slots;

  // An OOM victim's teardown, shared by its exit path and the oom_reaper (oom_reaper.hpp).
  oom_reap_request oom_reap{};             // the oom_reaper's hook; queued at most once
  chunk_walk walk;                         // guarded by mmap_lock
  std::condition_variable chunk_released;  // with mmap_lock: a side let go of a chunk
};

inline bool test_flag(const mm_struct& mm, unsigned bit) noexcept {
  return (mm.flags.load(std::memory_order_relaxed) >> bit) & 1u;
}
inline void set_flag(mm_struct& mm, unsigned bit) noexcept {
  mm.flags.fetch_or(std::uint64_t{1} << bit, std::memory_order_relaxed);  // set_bit: unordered
}
/// The approximate RSS (the kernel's get_mm_rss, a per-CPU counter sum): never negative.
inline std::uint64_t get_mm_rss(const mm_struct& mm) noexcept {
  return static_cast<std::uint64_t>(std::max<std::int64_t>(mm.rss_pages.load(std::memory_order_relaxed), 0));
}

/// Found by the reaper (argument-dependent lookup; reaper.hpp's cpu_accounted): the teardown
/// of an mm that names a cpu_owner is timed on the reaper and charged there.
inline std::atomic<std::uint64_t>* teardown_cpu_owner(mm_struct& mm) noexcept { return mm.cpu_owner; }

namespace detail {

/// The page size (basic_mm_system::page_size()).
inline std::size_t page_size() noexcept { return static_cast<std::size_t>(sysconf(_SC_PAGESIZE)); }

/// Drops a struct reference; the last frees the mm (basic_mm_system::mmdrop()).
inline void mmdrop(mm_struct& mm) noexcept {
  // put(): the last sees every holder's writes to the mm before it frees it.
  if (mm.mm_count.put()) delete &mm;
}

/// mm_alloc's real backing memory: maps rss_pages pages and touches each (blocking). Throws
/// std::system_error, mapping nothing, if the mapping fails.
inline void map_real(mm_struct& mm, std::uint64_t rss_pages) {
  const std::size_t bytes = rss_pages * page_size();
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) throw std::system_error(errno, std::generic_category(), "teardown::model::mm_alloc: mmap");
  mm.base = static_cast<std::byte*>(base);
  mm.mapped_bytes = bytes;
  for (std::size_t at = 0; at < bytes; at += page_size()) mm.base[at] = std::byte{1};  // fault it in
}

/// Reclaim (under mmap_lock): how many of `pages` may be taken now: none once a chunked OOM
/// teardown has begun.
inline std::uint64_t reclaimable(const mm_struct& mm, std::uint64_t pages) noexcept {
  return mm.walk.started ? 0 : std::min(pages, get_mm_rss(mm));
}

/// Reclaim (under mmap_lock): drops the tail `taken` pages of the RSS (real memory:
/// MADV_DONTNEED). Throws std::system_error, changing nothing, if madvise fails.
inline void reclaim_locked(mm_struct& mm, std::uint64_t taken) {
  if (mm.base != nullptr) {
    const std::size_t keep = (get_mm_rss(mm) - taken) * page_size();
    if (madvise(mm.base + keep, taken * page_size(), MADV_DONTNEED) != 0) {
      throw std::system_error(errno, std::generic_category(), "teardown::model::reclaim: madvise");
    }
  }
  mm.rss_pages.fetch_sub(static_cast<std::int64_t>(taken), std::memory_order_relaxed);
}

/// The kernel's task list (task_struct::tasks): intrusive and circular, so an exit unlinks in
/// O(1) and touches only its two neighbours: no search, no allocation, no free on the exit path
/// (a std::set's erase cost a cold exit more than the rest of its bookkeeping). Guarded by the
/// tasklist lock (basic_mm_system::task_link).
struct task_link {
  task_link() noexcept = default;
  task_link(const task_link&) = delete;
  task_link& operator=(const task_link&) = delete;

  void link_after(task_link& at) noexcept {
    prev = &at;
    next = at.next;
    at.next->prev = this;
    at.next = this;
  }
  void unlink() noexcept {
    prev->next = next;
    next->prev = prev;
    prev = next = this;
  }

  task_link* prev = this;
  task_link* next = this;
};

}  // namespace detail

}  // namespace teardown::model
