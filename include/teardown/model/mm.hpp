// teardown/model/mm.hpp — a model of the kernel's mm_struct and of the exit path that defers its
// teardown, composed from this library exactly as the RFC series composes the kernel's parts.
//
//     teardown::model::mm_system kernel({.async_mm_teardown = true});
//     auto task = kernel.spawn(/*rss_pages=*/200'000);          // a process with its own mm
//     auto clone = kernel.clone_vm(*task);                     // CLONE_VM: a second holder
//     clone->exit();                                           // not the last reference
//     task->exit();                                            // the last: mmput_exit decides
//     kernel.flush();
//     teardown::model::vmstat v = kernel.vmstat();              // queued, sync, rejected, ...
//
// What is modelled, and how (the kernel's names throughout):
//   mm_struct     mm_users (address-space users) and mm_count (references to the struct);
//                 flags with MMF_OOM_SKIP, MMF_OOM_TARGETED and MMF_OOM_REAP_QUEUED; an RSS in
//                 pages that reclaim() may shrink while the mm is queued; an AIO context whose
//                 exit_aio() is idempotent and blocks until in-flight AIO completes; the
//                 mm_reaper's llist hook and the memoised charge; optionally real memory (an
//                 anonymous mapping of the RSS, touched at creation, unmapped by the teardown),
//                 so teardown costs are real; for an OOM victim, the oom_reaper's hook and the
//                 chunk walk its exit and the oom_reaper share.
//   mm_system     the kernel: mm_alloc, mmget, mmput (always inline), mmput_exit (the deferral
//                 path), mmgrab/mmdrop, tasks (thread groups holding an mm) with exit(),
//                 mark_oom_victim, oom_kill and the oom_reaper thread, reclaim, the knobs
//                 (typed setters and a sysctl-style text interface; vm.oom_reap_direction among
//                 them), flush, drain, freeze/thaw, a vmstat snapshot and oom_reap_stats.
//   mm_reaper     basic_mm_system<Key, Workers>: Workers is async_teardown's worker policy.
//                 mm_system (one_reaper) has the series' single mm_reaper thread;
//                 pooled_mm_system (reaper_pool_workers) a pool of them (RFC open question 2),
//                 sized by mm_system_options::pool, each worker named after
//                 mm_system_options::reaper ("mm_reaper-0", ...) and taking its other options
//                 from it. Everything below holds for either; "the mm_reaper" is the pool then,
//                 and the pool keeps no order between mms that different threads queued. The
//                 swap-release worker and the oom_reaper stay single threads.
//
// mmput_exit(mm), as in the series:
//   if the decrement of mm_users is not the last: return
//   if vm.async_mm_teardown is off:               __mmput inline            (sync)
//   rss = get_mm_rss(mm), once
//   rss < thresh_pages, MMF_OOM_SKIP or MMF_OOM_TARGETED:  __mmput inline   (sync)
//   fewer than min_concurrent_exits final exits in flight, this one included:
//                                                  __mmput inline   (sync, uncontended)
//     (seed 004's gate; at its default, 1, it is off and the exit path is the series')
//   exit_aio(mm), eagerly, on the exiting thread
//   charge rss to pending pages (add-then-check); if over max_pending_pages: inline (sync,
//   rejected); else memoise the charge in the mm and queue it for the reaper   (queued)
// Every other final mmput() tears down inline and is not counted, as in the kernel.
//
// Who may call what (the mm_system must outlive every mm, task and call)
//   mm_alloc, spawn, clone_vm           any thread. May allocate, and with real memory map and
//                                       touch it (may block; throws on failure, changing
//                                       nothing).
//   mmget, mmgrab, mmdrop, mmput        any thread holding the reference they use. Lock-free,
//                                       except the teardown a final mmput/mmdrop runs.
//   mmput_exit                          any thread holding a mm_users reference; the caller's
//                                       own exit path. Lock-free except exit_aio (may block)
//                                       and an inline teardown.
//   task::exit, mark_oom_victim, oom_kill   any thread; take the tasklist lock (may block
//                                       briefly). A task's exit is idempotent. oom_kill's
//                                       hand-off to the oom_reaper is lock-free.
//   flush_oom_reaper                    any thread but the oom_reaper; blocks until every victim
//                                       queued before the call is reaped (its delay included).
//   set_oom_reap_direction, set_oom_reap_delay, oom_reap_statistics   any thread; wait-free.
//   reclaim                             any thread holding mm_count; takes the mm's mmap lock.
//   knobs (set_*, set, get)             any thread; setters validate first and change nothing
//                                       on error (std::invalid_argument naming the knob).
//                                       replace_max_pending_pages, worker_nice and
//                                       set_worker_nice likewise (pressure.hpp's entry points).
//   flush, drain, freeze, thaw, shutdown, shutdown_for   any thread but the reaper; may block
//                                       (shutdown without limit, shutdown_for up to its timeout).
//   vmstat                              any thread; a wait-free snapshot.
//
// The OOM ordering (the series' patch 3/7, argued for this model). MMF_OOM_TARGETED is set
// with a relaxed fetch_or (the kernel's set_bit: an unordered RMW), so its visibility to the
// thread that makes the final mm_users decrement cannot come from the store itself. It comes
// from two facts. (1) Marking happens under the tasklist lock while some task still holds the
// mm; that task sheds it (exit) under the same lock before its own mmput_exit, so the lock
// orders the flag before that task's decrement. (2) Every change of mm_users is a
// read-modify-write, and each decrement is acq_rel: the marking-side task's decrement is a
// release that heads a release sequence continued by every later RMW of mm_users, and the
// final decrement — last in mm_users' modification order, since it reaches zero — is an
// acquire that reads from that sequence. So the flag store happens-before the final
// decrement, whichever task makes it: the victim, a sibling or a CLONE_VM sharer that
// mark_oom_victim never saw. As in the kernel, this is belt and braces: a missed flag would
// only queue a victim (a latency regression), never tear anything down twice or lose it.
//
// The OOM reaper (seed 003). oom_kill, after marking and killing, queues the victim's mm for the
// oom_reaper thread (a teardown::reaper of its own, nice 0, never frozen) and holds a struct
// reference (mmgrab) for it until the reap is over; MMF_OOM_REAP_QUEUED makes that once per mm.
// The oom_reaper releases the victim's memory a chunk (oom_reap_chunk_bytes, 2 MiB) at a time
// with MADV_DONTNEED (the pages go, the mapping stays) while the victim's own exit tears the
// same mm down, also chunk by chunk, from the low end, with munmap. vm.oom_reap_direction says
// where the oom_reaper starts: "other" (the default; seed 003's patch 2) at the high end, walking
// down towards the exit path, "same" at the low end, walking up behind or ahead of it.
// Who releases which chunk is settled per chunk under mmap_lock (mm_struct::walk): a side claims
// a chunk under the lock, drops the lock for its syscall, and retakes it to record the chunk
// done; a side that reaches the chunk the other holds waits for it (the model's page-table lock).
// From the same end, whichever side is ahead does the work and the other trails it, waiting at
// chunk after chunk; from the other end the two work apart and meet once.
// The exit path unmaps every chunk exactly once, in order, and is the only side that unmaps; the
// oom_reaper releases only chunks that are mapped, not yet released and not held by the exit
// path, so it never touches an unmapped range. Each resident page is counted by exactly one
// side, so the two counts add up to the RSS the walk started from, and only the exit path runs
// __mmput, so an mm is still torn down exactly once. An mm no oom reap was queued for is unmapped
// in one munmap under the lock, as before: the normal path pays nothing for this. Once the
// chunked walk has begun, reclaim takes nothing from the mm. The kernel's oom_reaper first
// waits OOM_REAPER_DELAY (2 s) for the victim to exit by itself; the model's delay is 0 unless
// set_oom_reap_delay says otherwise, so that the race happens every time, and the destructor
// cuts a delay short.
//
// Thaw on urgency (seed 003's patch 1: a frozen victim frees nothing). No OOM victim's memory
// waits for the freezable mm_reaper: a victim is never queued (MMF_OOM_TARGETED), its final exit
// tears down on the exiting thread, and the oom_reaper is never frozen. drain() tears queued mms
// down on the caller while the mm_reaper is frozen, the rest of the batch the frozen mm_reaper
// held included (a freeze hands it back to the queue: reaper.hpp).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "teardown/async_teardown.hpp"
#include "teardown/reaper.hpp"
#include "teardown/reaper_pool.hpp"

namespace teardown::model {

/// Flag bits of mm_struct::flags (the kernel's bit numbers).
inline constexpr unsigned MMF_OOM_SKIP = 21;         // hidden from the OOM killer: already reaped
inline constexpr unsigned MMF_OOM_REAP_QUEUED = 25;  // queued for the oom_reaper (once); sticky
inline constexpr unsigned MMF_OOM_TARGETED = 32;     // the target of an in-flight OOM kill; sticky

enum class backing {
  simulated,  // the RSS is only a number: teardown costs nothing real
  real,       // the RSS is an anonymous mapping, touched at creation and unmapped by teardown
};

/// vm.oom_reap_direction: where the oom_reaper starts on a victim the exit path is tearing down
/// from the low end.
enum class reap_direction : std::uint8_t {
  same,   // the low end too, walking up: the two sides meet chunk after chunk
  other,  // the high end, walking down: they meet once, in the middle (seed 003's patch 2)
};

/// "same" or "other", as the knob reads and writes it.
constexpr const char* to_string(reap_direction d) noexcept { return d == reap_direction::same ? "same" : "other"; }

/// The unit of an OOM victim's chunked teardown (a page table's reach on x86-64 with 4 KiB pages).
inline constexpr std::size_t oom_reap_chunk_bytes = std::size_t{2} << 20;

/// The model of an mm's AIO context: exit_aio() is idempotent and blocks until in-flight AIO
/// completes (the reason the series runs it eagerly on the exiting thread).
class aio_context {
 public:
  /// Starts one AIO request; false (and nothing started) once exit_aio() has begun.
  bool submit() noexcept {
    // seq_cst with exit_aio's: a store-load pair on two variables (Dekker). Either exit_aio
    // sees this request in flight and waits for it, or this sees `dead_` and backs out.
    in_flight_.fetch_add(1, std::memory_order_seq_cst);
    if (dead_.load(std::memory_order_seq_cst)) {
      complete();
      return false;
    }
    return true;
  }

  /// Completes one request started by a successful submit().
  void complete() noexcept {
    // release: pairs with the acquire load in exit_aio; the request's effects happen-before
    // the teardown that waited for it.
    in_flight_.fetch_sub(1, std::memory_order_release);
    in_flight_.notify_all();
  }

  /// Idempotent; blocks until no request is in flight. Counts its calls.
  void exit_aio() noexcept {
    dead_.store(true, std::memory_order_seq_cst);  // seq_cst: see submit()
    exit_calls_.fetch_add(1, std::memory_order_relaxed);
    // acquire: pairs with complete()'s release.
    for (std::uint32_t n; (n = in_flight_.load(std::memory_order_acquire)) != 0;) {
      in_flight_.wait(n, std::memory_order_acquire);
    }
  }

  std::uint32_t in_flight() const noexcept { return in_flight_.load(std::memory_order_relaxed); }
  std::uint32_t exit_calls() const noexcept { return exit_calls_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::uint32_t> in_flight_{0};
  std::atomic<bool> dead_{false};
  std::atomic<std::uint32_t> exit_calls_{0};
};

/// Seed 004's swap device, as far as the model needs it: a use count per slot (the kernel's
/// swap_map), so that every release is checked. A slot freed twice is counted, not wrapped.
/// allocate takes a lock (may block briefly); free and the getters are lock-free. Relaxed
/// throughout: a slot holds no data in the model, so freeing one publishes nothing.
class swap_space {
 public:
  explicit swap_space(std::size_t slots) : map_(new std::atomic<std::uint8_t>[slots]), slots_(slots) {
    for (std::size_t at = 0; at < slots_; ++at) map_[at].store(0, std::memory_order_relaxed);
  }

  /// Appends n free slots to `out`, each now in use once. Throws std::length_error, taking
  /// nothing, when fewer than n are free.
  void allocate(std::size_t n, std::vector<std::uint32_t>& out) {
    const std::lock_guard lock(allocate_lock_);
    if (n > slots_ - std::min<std::uint64_t>(used(), slots_)) {
      throw std::length_error("teardown::model::swap_space: " + std::to_string(n) + " slots asked, " +
                              std::to_string(slots_ - used()) + " free");
    }
    out.reserve(out.size() + n);
    for (std::size_t taken = 0; taken < n; cursor_ = (cursor_ + 1) % slots_) {
      std::uint8_t expected = 0;
      // A CAS, not a store: a free on another thread may be making this slot free right now.
      if (map_[cursor_].compare_exchange_strong(expected, 1, std::memory_order_relaxed)) {
        out.push_back(static_cast<std::uint32_t>(cursor_));
        ++taken;
      }
    }
    used_.fetch_add(n, std::memory_order_relaxed);
  }

  /// Drops the slot's use. Lock-free. A slot that is already free is left free and counted in
  /// double_frees() (a bug in the caller).
  void free(std::uint32_t slot) noexcept {
    std::uint8_t uses = map_[slot].load(std::memory_order_relaxed);
    do {
      if (uses == 0) {
        double_frees_.fetch_add(1, std::memory_order_relaxed);
        return;
      }
    } while (!map_[slot].compare_exchange_weak(uses, static_cast<std::uint8_t>(uses - 1), std::memory_order_relaxed));
    used_.fetch_sub(1, std::memory_order_relaxed);
  }

  std::size_t capacity() const noexcept { return slots_; }
  std::uint64_t used() const noexcept { return used_.load(std::memory_order_relaxed); }
  std::uint64_t double_frees() const noexcept { return double_frees_.load(std::memory_order_relaxed); }
  /// The slot's use count now (0: free).
  std::uint8_t uses(std::uint32_t slot) const noexcept { return map_[slot].load(std::memory_order_relaxed); }

 private:
  std::mutex allocate_lock_;
  std::size_t cursor_ = 0;  // guarded by allocate_lock_: where the next search starts
  std::unique_ptr<std::atomic<std::uint8_t>[]> map_;
  std::size_t slots_;
  std::atomic<std::uint64_t> used_{0};
  std::atomic<std::uint64_t> double_frees_{0};
};

/// Where a swap_batch's page comes from: allocate returns nullptr when none can be had (the
/// seed's GFP_ATOMIC | GFP_NOWAIT failing), and the exit path then releases inline.
struct swap_batch_allocator {
  void* (*allocate)(std::size_t bytes) noexcept;
  void (*deallocate)(void* memory) noexcept;
};

/// The default: operator new (nothrow) and operator delete.
inline constexpr swap_batch_allocator default_swap_batch_allocator{
    [](std::size_t bytes) noexcept { return ::operator new(bytes, std::nothrow); },
    [](void* memory) noexcept { ::operator delete(memory); }};

/// A page of swap entries gathered by an exiting task for the swap-release worker (seed 004's
/// mmu_swap_batch): the queue hook, the charge, who frees the page, and the slots.
struct swap_batch {
  static constexpr std::size_t bytes = 4096;
  static constexpr std::size_t header_bytes = 32;
  static constexpr std::size_t capacity = (bytes - header_bytes) / sizeof(std::uint32_t);

  llist_node hook;
  std::uint64_t charge = 0;                       // entries, memoised by put_chain
  void (*deallocate)(void*) noexcept = nullptr;   // the allocator's pair, fixed at allocation
  std::uint32_t count = 0;
  std::uint32_t slots[capacity];
};
static_assert(sizeof(swap_batch) == swap_batch::bytes, "a swap_batch is one page");

/// What the swap release did (seed 004), since the mm_system started.
struct swap_release_stats {
  std::uint64_t used = 0;             // swap slots in use now
  std::uint64_t double_frees = 0;     // slots freed while free: must stay 0
  std::uint64_t batched = 0;          // entries gathered into batches by exiting tasks
  std::uint64_t inline_entries = 0;   // entries released where the teardown ran
  std::uint64_t batches = 0;          // batches built
  std::uint64_t alloc_failures = 0;   // batch allocations that failed: the rest went inline
  std::uint64_t queued = 0;           // batches handed to the swap-release worker
  std::uint64_t sync = 0;             // batches put_chain tore down inline (toggle off, shut down)
  std::uint64_t released = 0;         // batches released, by the worker or inline; after a flush
                                      // with no exit running, released == batches
};

struct mm_struct;

/// The oom_reaper's queue hook, a member of the mm pointing back at it. A type of its own so
/// that the oom_reaper's work is not charged to the mm's cpu_owner as the mm_reaper's is.
struct oom_reap_request {
  llist_node node;
  mm_struct* mm = nullptr;         // set by mm_alloc
  std::uint64_t queued_at_ns = 0;  // written by oom_kill before the enqueue
};

/// Where an OOM victim's chunked teardown stands (see the header comment). Guarded by the mm's
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
  std::atomic<std::int32_t> mm_users{1};  // address-space users; the last mmput tears down
  std::atomic<std::int32_t> mm_count{1};  // struct references (all users together hold one)
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
                                          // cgroup's account; RFC open question 3)
  std::uint64_t id = 0;                   // unique per mm_system, for trace events

  // The real backing memory, guarded by mmap_lock (reclaim and teardown race on it).
  std::mutex mmap_lock;
  std::byte* base = nullptr;
  std::size_t mapped_bytes = 0;

  // Swap entries (seed 004): the slots swap_out() moved pages to. Guarded by mmap_lock; the
  // teardown takes them all.
  std::vector<std::uint32_t> swap_slots;

  // An OOM victim's teardown, shared by its exit path and the oom_reaper (see the header comment).
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

/// A vmstat snapshot: the series' three counters and what the model adds.
struct vmstat {
  std::uint64_t queued = 0;         // async_mm_teardown_queued
  std::uint64_t sync = 0;           // async_mm_teardown_sync: mmput_exit tore down inline
  std::uint64_t rejected = 0;       // async_mm_teardown_rejected: subset of sync
  std::uint64_t stalled = 0;        // subset of sync: the reaper was stalled
  std::uint64_t uncontended = 0;    // subset of sync: fewer than min_concurrent_exits in flight
  std::uint64_t reaped = 0;         // queued mms torn down (by the reaper or by drain)
  std::uint64_t drained = 0;        // subset of reaped: torn down by drain()
  std::uint64_t pending_pages = 0;  // charged and not yet released
};

/// What the oom_reaper and the OOM victims' chunked exits did (seed 003), summed over victims.
/// Times are steady_clock nanoseconds, each on the side's own thread.
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

struct mm_system_options {
  bool async_mm_teardown = false;        // vm.async_mm_teardown: off by default, as in the series
  std::optional<std::uint64_t> thresh_pages{};       // vm.async_mm_teardown_thresh_pages;
                                                    // unset: 64 MiB of pages
  std::optional<std::uint64_t> max_pending_pages{};  // vm.async_mm_teardown_max_pending_pages;
                                                    // unset: a quarter of physical RAM
  bool sync_when_stalled = false;        // async_teardown's watchdog; the series has none
  std::uint64_t min_concurrent_exits = 1;  // vm.async_mm_teardown_min_concurrent_exits: defer
                                          // only while at least this many final exits run at
                                          // once (seed 004); 1 is off, as in the series
  reaper_options reaper{.name = "mm_reaper"};  // the mm_reaper's; in a pool, every worker's
  std::size_t swap_slots = 0;            // the swap device's size; 0: no swap (swap_out throws)
  bool swap_async_release = true;        // seed 004: exiting tasks hand swap entries to a worker
  std::uint32_t swap_min_exiting = 2;    // ... while at least this many final exits run at once
                                         // (NR_MIN_EXITING_PROCESSES); at least 1
  reaper_pool_options pool{};            // pooled_mm_system only: workers, steal, steal_after
                                         // (pool.worker is ignored: reaper above is used)
};

/// The kernel. Key = const_key<false> builds it with the deferral compiled out (the series'
/// CONFIG_ASYNC_MM_TEARDOWN=n): no reaper thread, no toggle knob, every exit inline. Workers
/// picks the mm_reaper: one_reaper (the series') or reaper_pool_workers (a pool).
template <class Key = static_key, class Workers = one_reaper>
class basic_mm_system {
  struct mm_traits {
    basic_mm_system* system;
    std::uint64_t cost(const mm_struct& mm) const noexcept { return get_mm_rss(mm); }
    bool eligible(const mm_struct& mm, std::uint64_t) const noexcept {
      // MMF_OOM_SKIP: already reaped (or pinned by init). MMF_OOM_TARGETED: an OOM victim's
      // memory must come back at once, not behind a nice-19 reaper. Relaxed loads: the header
      // comment says why the flag is visible here.
      return !test_flag(mm, MMF_OOM_SKIP) && !test_flag(mm, MMF_OOM_TARGETED);
    }
    void prepare(mm_struct& mm) noexcept { mm.aio.exit_aio(); }
    void destroy(mm_struct& mm) noexcept { system->mmput_teardown(mm); }
    std::uint64_t& charge(mm_struct& mm) noexcept { return mm.reap_charge; }
    std::uint64_t live_cost(const mm_struct& mm) const noexcept { return get_mm_rss(mm); }
    std::uint64_t id(const mm_struct& mm) const noexcept { return mm.id; }
    std::uint64_t& queued_at(mm_struct& mm) noexcept { return mm.queued_at_ns; }
  };

  // The swap-release worker's composition: a batch costs its entries, and nothing else gates it
  // (the exit path decided before it gathered).
  struct swap_batch_traits {
    basic_mm_system* system;
    std::uint64_t cost(const swap_batch& batch) const noexcept { return batch.count; }
    bool eligible(const swap_batch&, std::uint64_t) const noexcept { return true; }
    void prepare(swap_batch&) noexcept {}
    void destroy(swap_batch& batch) noexcept { system->release_swap_batch(batch); }
    std::uint64_t& charge(swap_batch& batch) noexcept { return batch.charge; }
  };

 public:
  // With the deferral compiled out the toggle knob does not exist, as with CONFIG=n.
  static constexpr bool compiled_out = detail::compiled_off<Key>();

  static constexpr std::string_view knob_enabled = "vm.async_mm_teardown";
  static constexpr std::string_view knob_thresh = "vm.async_mm_teardown_thresh_pages";
  static constexpr std::string_view knob_max_pending = "vm.async_mm_teardown_max_pending_pages";
  static constexpr std::string_view knob_min_concurrent = "vm.async_mm_teardown_min_concurrent_exits";
  static constexpr std::string_view knob_swap_async_release = "vm.swap_async_release";
  /// Fewer swap entries than this are released where the teardown runs (SWAP_CLUSTER_MAX).
  static constexpr std::size_t swap_cluster_max = 32;
  /// The largest vm.async_mm_teardown_min_concurrent_exits: far beyond any number of CPUs.
  static constexpr std::uint64_t max_min_concurrent_exits = std::uint64_t{1} << 20;

  // The kernel's task list (task_struct::tasks): intrusive and circular, so an exit unlinks in
  // O(1) and touches only its two neighbours: no search, no allocation, no free on the exit path
  // (a std::set's erase cost a cold exit more than the rest of its bookkeeping). Guarded by the
  // tasklist lock.
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

  /// A thread group: holds one mm_users reference from creation until exit().
  class task : private task_link {
   public:
    task(const task&) = delete;
    task& operator=(const task&) = delete;
    /// Exits if exit() was not called.
    ~task() { (void)exit(); }

    /// exit_mm: sheds the mm under the tasklist lock, then mmput_exit. Idempotent: the second
    /// call does nothing and returns nullopt. Returns what mmput_exit decided, or nullopt when
    /// this was not the last user of the mm.
    std::optional<decision> exit() {
      mm_struct* mm = nullptr;
      {
        const std::lock_guard lock(system_->tasklist_lock_);
        mm = std::exchange(mm_, nullptr);
        this->unlink();  // a second exit unlinks a lone link: a no-op
      }
      if (mm == nullptr) return std::nullopt;
      return system_->mmput_exit(*mm);
    }

    /// True once an OOM kill swept this task (its SIGKILL is pending).
    bool killed() const noexcept { return killed_.load(std::memory_order_relaxed); }
    /// The task's mm, or nullptr after exit. Valid while the task holds it.
    mm_struct* mm() const {
      const std::lock_guard lock(system_->tasklist_lock_);
      return mm_;
    }

   private:
    friend class basic_mm_system;
    task(basic_mm_system& system, mm_struct& mm) : system_(&system), mm_(&mm) {}

    basic_mm_system* system_;
    mm_struct* mm_;  // guarded by the tasklist lock
    std::atomic<bool> killed_{false};
  };

  /// Throws std::invalid_argument (naming the knob) for a bad knob value, or (pooled) for bad
  /// pool options; std::system_error if the reaper cannot start.
  explicit basic_mm_system(mm_system_options opts = {})
      : swap_(opts.swap_slots == 0 ? nullptr : std::make_unique<swap_space>(opts.swap_slots)),
        swap_min_exiting_(validated_swap_min_exiting(opts.swap_min_exiting)),
        swap_release_(async_teardown_options{.enabled = opts.swap_async_release,
                                             .reaper = {.name = "swap_release", .nice = 0}},
                      swap_batch_traits{this}),
        async_(make_options(opts), mm_traits{this}) {}

  basic_mm_system(const basic_mm_system&) = delete;
  basic_mm_system& operator=(const basic_mm_system&) = delete;

  /// Tears down everything queued, then stops the reaper. Every task must have exited and every
  /// mm been put before. Then the oom_reaper reaps every victim still queued for it (any delay
  /// cut short) and stops, before anything it uses is destroyed.
  ~basic_mm_system() { oom_reaper_stopping_.store(true, std::memory_order_relaxed); }

  static std::size_t page_size() noexcept { return static_cast<std::size_t>(sysconf(_SC_PAGESIZE)); }
  static std::uint64_t default_thresh_pages() noexcept { return (std::uint64_t{64} << 20) / page_size(); }
  static std::uint64_t default_max_pending_pages() noexcept {
    const long pages = sysconf(_SC_PHYS_PAGES);
    return pages > 0 ? static_cast<std::uint64_t>(pages) / 4 : default_thresh_pages();
  }

  // ---- mms --------------------------------------------------------------------------------

  /// The largest RSS an mm may have: its size in bytes must fit a size_t (and the page count
  /// the signed RSS counter).
  static std::uint64_t max_rss_pages() noexcept {
    return std::min<std::uint64_t>(SIZE_MAX / page_size(), static_cast<std::uint64_t>(INT64_MAX));
  }

  /// A new mm with mm_users = mm_count = 1 and the given RSS. With backing::real, maps and
  /// touches rss_pages pages (blocking; throws std::system_error if the mapping fails).
  /// Throws std::invalid_argument, creating nothing, above max_rss_pages().
  mm_struct* mm_alloc(std::uint64_t rss_pages, backing memory = backing::simulated) {
    if (rss_pages > max_rss_pages()) {
      throw std::invalid_argument("teardown::model::mm_alloc: an RSS of " + std::to_string(rss_pages) +
                                  " pages is larger than any address space (at most " +
                                  std::to_string(max_rss_pages()) + ")");
    }
    auto mm = std::make_unique<mm_struct>();
    mm->id = next_id_.fetch_add(1, std::memory_order_relaxed) + 1;
    mm->oom_reap.mm = mm.get();
    mm->rss_pages.store(static_cast<std::int64_t>(rss_pages), std::memory_order_relaxed);
    if (memory == backing::real && rss_pages > 0) {
      const std::size_t bytes = rss_pages * page_size();
      void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (base == MAP_FAILED) throw std::system_error(errno, std::generic_category(), "teardown::model::mm_alloc: mmap");
      mm->base = static_cast<std::byte*>(base);
      mm->mapped_bytes = bytes;
      for (std::size_t at = 0; at < bytes; at += page_size()) mm->base[at] = std::byte{1};  // fault it in
    }
    return mm.release();
  }

  /// Takes a mm_users reference; the caller already holds one. Lock-free.
  static void mmget(mm_struct& mm) noexcept {
    // relaxed: a new reference is made from an existing one, which keeps the mm alive; still an
    // RMW, so it continues the release sequence the OOM argument relies on.
    mm.mm_users.fetch_add(1, std::memory_order_relaxed);
  }

  /// Takes a mm_users reference unless the mm is already being torn down (the kernel's
  /// mmget_not_zero, used by /proc readers). Lock-free.
  static bool mmget_not_zero(mm_struct& mm) noexcept {
    std::int32_t users = mm.mm_users.load(std::memory_order_relaxed);
    do {
      if (users == 0) return false;
    } while (!mm.mm_users.compare_exchange_weak(users, users + 1, std::memory_order_relaxed));
    return true;
  }

  /// Drops a mm_users reference; the last one tears down inline (never deferred, not counted).
  void mmput(mm_struct& mm) noexcept {
    if (release_user(mm)) mmput_teardown(mm);
  }

  /// The exit path's mmput: drops a mm_users reference; the last one decides between the
  /// reaper and an inline teardown (see the header comment). Returns the decision, or nullopt
  /// when this was not the last reference.
  std::optional<decision> mmput_exit(mm_struct& mm) {
    if (!release_user(mm)) return std::nullopt;
    const final_exit_scope exiting(*this);
    return async_.put(mm);
  }

  /// Takes a reference to the struct (not the address space): the mm stays readable after its
  /// teardown until mmdrop. Lock-free.
  static void mmgrab(mm_struct& mm) noexcept { mm.mm_count.fetch_add(1, std::memory_order_relaxed); }

  /// Drops a struct reference; the last frees the mm.
  static void mmdrop(mm_struct& mm) noexcept {
    // acq_rel: release our writes to the mm to the thread that frees it; acquire everyone
    // else's before we free it.
    if (mm.mm_count.fetch_sub(1, std::memory_order_acq_rel) == 1) delete &mm;
  }

  /// Reclaim takes up to `pages` of the mm's RSS (real memory: the tail of the mapping is
  /// discarded with MADV_DONTNEED), even while the mm waits in the queue. Returns the pages
  /// taken. The caller holds mm_count. Takes nothing from an mm whose chunked OOM teardown has
  /// begun (the exit path and the oom_reaper account for every page there).
  std::uint64_t reclaim(mm_struct& mm, std::uint64_t pages) {
    const std::lock_guard lock(mm.mmap_lock);
    const std::uint64_t taken = reclaimable(mm, pages);
    if (taken != 0) reclaim_locked(mm, taken);
    return taken;
  }

  /// Reclaim to swap (seed 004's setting): takes up to `pages` of the mm's RSS as reclaim()
  /// does and gives each page a swap slot, which the mm holds until its teardown releases it.
  /// Returns the pages swapped out. Throws std::logic_error without a swap device
  /// (mm_system_options::swap_slots), std::length_error when the device has too few free slots;
  /// either way nothing changes. The caller holds mm_count.
  std::uint64_t swap_out(mm_struct& mm, std::uint64_t pages) {
    if (!swap_) throw std::logic_error("teardown::model::swap_out: no swap device (mm_system_options::swap_slots is 0)");
    const std::lock_guard lock(mm.mmap_lock);
    const std::uint64_t taken = reclaimable(mm, pages);
    if (taken == 0) return 0;
    const std::size_t before = mm.swap_slots.size();
    swap_->allocate(static_cast<std::size_t>(taken), mm.swap_slots);
    try {
      reclaim_locked(mm, taken);
    } catch (...) {
      for (std::size_t at = before; at < mm.swap_slots.size(); ++at) swap_->free(mm.swap_slots[at]);
      mm.swap_slots.resize(before);
      throw;
    }
    return taken;
  }

  /// The mm's swap entries now. Takes the mm's mmap_lock; the caller holds mm_count.
  static std::size_t swap_entries(mm_struct& mm) {
    const std::lock_guard lock(mm.mmap_lock);
    return mm.swap_slots.size();
  }

  // ---- tasks and the OOM killer -----------------------------------------------------------

  /// A new process: a fresh mm (see mm_alloc) and the task that holds it.
  std::unique_ptr<task> spawn(std::uint64_t rss_pages, backing memory = backing::simulated) {
    mm_struct* mm = mm_alloc(rss_pages, memory);
    try {
      return attach(*mm);  // adopts mm_alloc's reference
    } catch (...) {
      mmput(*mm);
      throw;
    }
  }

  /// clone(CLONE_VM) into a new thread group: a task sharing `sharer`'s mm. Throws
  /// std::logic_error if `sharer` has exited.
  std::unique_ptr<task> clone_vm(task& sharer) {
    const std::lock_guard lock(tasklist_lock_);
    if (sharer.mm_ == nullptr) throw std::logic_error("teardown::model::clone_vm: the sharer has exited");
    mmget(*sharer.mm_);
    return register_task_locked(*sharer.mm_);
  }

  /// Marks the task's mm MMF_OOM_TARGETED (the series' mark_oom_victim). False if the task has
  /// exited (nothing marked).
  bool mark_oom_victim(task& victim) {
    const std::lock_guard lock(tasklist_lock_);
    if (victim.mm_ == nullptr) return false;
    set_flag(*victim.mm_, MMF_OOM_TARGETED);
    return true;
  }

  /// The OOM killer's __oom_kill_process: marks the victim's mm, then kills every task that
  /// holds it (the victim and every CLONE_VM sharer), then queues the mm for the oom_reaper
  /// (once per mm). Returns how many were killed; 0 if the victim has already exited. Depends on
  /// neither reaper's progress: the oom_reaper is never frozen, and the hand-off is lock-free.
  std::size_t oom_kill(task& victim) {
    mm_struct* reap = nullptr;
    std::size_t killed = 0;
    {
      const std::lock_guard lock(tasklist_lock_);
      mm_struct* mm = victim.mm_;
      if (mm == nullptr) return 0;
      // Before any kill: a killed sharer may exit (and make the final decrement) at once; the
      // lock orders this store before every holder's exit (see the header comment).
      set_flag(*mm, MMF_OOM_TARGETED);
      for (task_link* link = tasks_.next; link != &tasks_; link = link->next) {
        task* t = static_cast<task*>(link);
        if (t->mm_ == mm) {
          t->killed_.store(true, std::memory_order_relaxed);  // the SIGKILL: a flag the owner polls
          ++killed;
        }
      }
      oom_kills_.fetch_add(1, std::memory_order_relaxed);
      // The kernel's queue_oom_reaper: test_and_set_bit, so an mm is queued once. Under the lock,
      // like MMF_OOM_TARGETED, so every holder's exit sees it; mmgrab is safe while a task holds
      // the mm, and keeps the struct alive until the oom_reaper is done with it.
      const std::uint64_t queued_bit = std::uint64_t{1} << MMF_OOM_REAP_QUEUED;
      if ((mm->flags.fetch_or(queued_bit, std::memory_order_relaxed) & queued_bit) == 0) {
        mmgrab(*mm);
        reap = mm;
      }
    }
    if (reap != nullptr) {
      reap->oom_reap.queued_at_ns = teardown::detail::monotonic_ns();
      oom_.queued.fetch_add(1, std::memory_order_relaxed);  // before the enqueue: reaped never overtakes it
      oom_reaper_.enqueue(reap->oom_reap);
    }
    return killed;
  }

  // ---- the OOM reaper ---------------------------------------------------------------------

  static constexpr std::string_view knob_oom_reap_direction = "vm.oom_reap_direction";

  /// Where the oom_reaper starts on a victim (read once per victim, when its walk begins).
  reap_direction oom_reap_direction() const noexcept { return oom_reap_direction_.load(std::memory_order_relaxed); }
  /// Throws std::invalid_argument naming the knob, changing nothing, for a value that is neither
  /// reap_direction::same nor reap_direction::other.
  void set_oom_reap_direction(reap_direction direction) {
    if (direction != reap_direction::same && direction != reap_direction::other) {
      throw bad_knob(knob_oom_reap_direction, std::to_string(static_cast<int>(direction)),
                     "is not a direction (\"same\" or \"other\")");
    }
    oom_reap_direction_.store(direction, std::memory_order_relaxed);
  }

  /// How long the oom_reaper leaves a victim to its own exit before reaping it, counted from the
  /// kill: the kernel's OOM_REAPER_DELAY (2 s). The model's default is 0, so that the oom_reaper
  /// races the exit every time. A change applies to victims already waiting. A model parameter,
  /// not a sysctl. Throws std::invalid_argument, changing nothing, for a negative delay.
  std::chrono::nanoseconds oom_reap_delay() const noexcept {
    return std::chrono::nanoseconds(oom_reap_delay_ns_.load(std::memory_order_relaxed));
  }
  void set_oom_reap_delay(std::chrono::nanoseconds delay) {
    if (delay.count() < 0) throw std::invalid_argument("teardown::model::set_oom_reap_delay: negative delay; unchanged");
    oom_reap_delay_ns_.store(static_cast<std::uint64_t>(delay.count()), std::memory_order_relaxed);
  }

  /// Blocks until every victim queued for the oom_reaper before the call has been reaped (and
  /// its struct reference dropped). Waits out the delay, if one is set.
  void flush_oom_reaper() { oom_reaper_.flush(); }

  /// A snapshot; reaped is read before queued, so reaped <= queued.
  oom_reap_stats oom_reap_statistics() const noexcept {
    oom_reap_stats s;
    // acquire: pairs with the release add in oom_reap; the queued add of every victim counted
    // there happened before it (through the oom_reaper's queue).
    s.reaped = oom_.reaped.load(std::memory_order_acquire);
    s.skipped = oom_.skipped.load(std::memory_order_relaxed);
    s.queued = oom_.queued.load(std::memory_order_relaxed);
    s.errors = oom_.errors.load(std::memory_order_relaxed);
    s.reaper_pages = oom_.reaper_pages.load(std::memory_order_relaxed);
    s.reaper_chunks = oom_.reaper_chunks.load(std::memory_order_relaxed);
    s.reaper_work_ns = oom_.reaper_work_ns.load(std::memory_order_relaxed);
    s.reaper_wait_ns = oom_.reaper_wait_ns.load(std::memory_order_relaxed);
    s.exit_pages = oom_.exit_pages.load(std::memory_order_relaxed);
    s.exit_chunks = oom_.exit_chunks.load(std::memory_order_relaxed);
    s.exit_work_ns = oom_.exit_work_ns.load(std::memory_order_relaxed);
    s.exit_wait_ns = oom_.exit_wait_ns.load(std::memory_order_relaxed);
    return s;
  }
  /// The oom_reaper thread's own statistics (CPU time, wake-ups...).
  reaper_stats oom_reaper_statistics() const noexcept { return oom_reaper_.stats(); }

  // ---- knobs ------------------------------------------------------------------------------

  bool async_mm_teardown() const noexcept { return async_.enabled(); }
  void set_async_mm_teardown(bool on)
    requires(!compiled_out)
  {
    async_.set_enabled(on);
  }
  std::uint64_t thresh_pages() const noexcept { return async_.threshold(); }
  void set_thresh_pages(std::uint64_t pages) { async_.set_threshold(validated(knob_thresh, pages)); }
  std::uint64_t max_pending_pages() const noexcept { return async_.max_pending(); }
  void set_max_pending_pages(std::uint64_t pages) { async_.set_max_pending(validated(knob_max_pending, pages)); }
  /// set_max_pending_pages(desired) only if the knob still reads `expected` (a temporary cap
  /// undone without overwriting one set meanwhile: pressure.hpp). Throws as the setter does.
  bool replace_max_pending_pages(std::uint64_t expected, std::uint64_t desired) {
    return async_.replace_max_pending(expected, validated(knob_max_pending, desired));
  }
  /// The mm_reaper's nice value (19 unless mm_system_options::reaper says otherwise), and a new
  /// one: true if applied (the system may refuse a lower value). Throws std::invalid_argument
  /// outside [-20, 19].
  int worker_nice() const { return async_.worker_nice(); }
  bool set_worker_nice(int value) { return async_.set_worker_nice(value); }
  /// The concurrency gate: an eligible final exit tears down inline (decision::sync_uncontended)
  /// while fewer than this many final exits, its own included, are in flight. 1: off.
  std::uint64_t min_concurrent_exits() const noexcept { return async_.min_concurrent(); }
  /// Throws std::invalid_argument naming the knob, changing nothing, for 0 or above
  /// max_min_concurrent_exits.
  void set_min_concurrent_exits(std::uint64_t exits) { async_.set_min_concurrent(validated_min_concurrent(exits)); }

  /// Seed 004's swap release: while on, an exiting task whose teardown runs on its own thread
  /// hands its swap entries, in page-sized batches, to the swap-release worker, provided at
  /// least swap_min_exiting final exits run at once and it holds SWAP_CLUSTER_MAX (32) or more.
  bool swap_async_release() const noexcept { return swap_release_.enabled(); }
  void set_swap_async_release(bool on) { swap_release_.set_enabled(on); }
  std::uint32_t swap_min_exiting() const noexcept { return swap_min_exiting_.load(std::memory_order_relaxed); }
  /// Throws std::invalid_argument, changing nothing, for 0.
  void set_swap_min_exiting(std::uint32_t exits) {
    swap_min_exiting_.store(validated_swap_min_exiting(exits), std::memory_order_relaxed);
  }
  /// Where swap batches come from from now on (each batch is freed by the allocator that made
  /// it). The allocator must outlive the mm_system: only its address is kept, so a temporary
  /// is refused at compile time. Wait-free.
  void set_swap_batch_allocator(const swap_batch_allocator& allocator) noexcept {
    swap_allocator_.store(&allocator, std::memory_order_relaxed);
  }
  void set_swap_batch_allocator(const swap_batch_allocator&&) = delete;

  /// Writes a knob as sysctl would: `set("vm.async_mm_teardown", "1")`. The value is a decimal
  /// number (one trailing newline allowed, as `echo` writes it); the toggle takes 0 or 1;
  /// vm.oom_reap_direction takes "same" or "other" (the same newline allowed).
  /// Throws std::invalid_argument naming the knob, changing nothing, for an unknown knob or a
  /// malformed or out-of-range value.
  void set(std::string_view knob, std::string_view value) {
    if (knob == knob_oom_reap_direction) {
      set_oom_reap_direction(parse_direction(value));
      return;
    }
    if (knob == knob_enabled && !compiled_out) {
      const std::uint64_t on = parse(knob, value);
      if (on > 1) throw bad_knob(knob, value, "must be 0 or 1");
      if constexpr (!compiled_out) set_async_mm_teardown(on == 1);
    } else if (knob == knob_swap_async_release) {
      const std::uint64_t on = parse(knob, value);
      if (on > 1) throw bad_knob(knob, value, "must be 0 or 1");
      set_swap_async_release(on == 1);
    } else if (knob == knob_thresh) {
      set_thresh_pages(parse(knob, value));
    } else if (knob == knob_max_pending) {
      set_max_pending_pages(parse(knob, value));
    } else if (knob == knob_min_concurrent) {
      set_min_concurrent_exits(parse(knob, value));
    } else {
      throw std::invalid_argument("teardown::model: unknown knob \"" + std::string(knob) + "\"");
    }
  }

  /// Reads a knob as sysctl would: the decimal value (vm.oom_reap_direction: "same" or
  /// "other"), no newline. Throws std::invalid_argument for an unknown knob.
  std::string get(std::string_view knob) const {
    if (knob == knob_oom_reap_direction) return to_string(oom_reap_direction());
    if (knob == knob_enabled && !compiled_out) return async_mm_teardown() ? "1" : "0";
    if (knob == knob_thresh) return std::to_string(thresh_pages());
    if (knob == knob_max_pending) return std::to_string(max_pending_pages());
    if (knob == knob_min_concurrent) return std::to_string(min_concurrent_exits());
    if (knob == knob_swap_async_release) return swap_async_release() ? "1" : "0";
    throw std::invalid_argument("teardown::model: unknown knob \"" + std::string(knob) + "\"");
  }

  // ---- the reaper -------------------------------------------------------------------------

  /// Blocks until every mm queued before the call is torn down, and every swap batch queued
  /// before it returns is released.
  void flush() {
    async_.flush();
    swap_release_.flush();
  }
  /// Blocks until every swap batch queued before the call is released.
  void flush_swap_release() { swap_release_.flush(); }
  template <class Rep, class Period>
  bool flush_for(std::chrono::duration<Rep, Period> timeout) {
    return async_.flush_for(timeout);
  }
  /// Tears down queued mms on the caller, oldest first, up to max_pages of memoised charge
  /// (the OOM path draining the queue with a budget: RFC open question 1). Blocking.
  drain_result drain(std::uint64_t max_pages) { return async_.drain(max_pages); }
  /// The freezer: parks the reaper between mms (exits keep queuing behind it). May block.
  void freeze() { async_.freeze(); }
  void thaw() { async_.thaw(); }
  /// Tears down the backlog and stops the reaper, then the swap-release worker; later exits
  /// tear down, and release swap, inline. May block.
  void shutdown() {
    async_.shutdown();
    swap_release_.shutdown();
  }
  /// shutdown() that waits at most `timeout` for both workers together: true iff both drained
  /// and were joined in time. Either way later exits tear down, and release swap, inline; false
  /// leaves the rest queued and counted (vmstat's pending_pages) for a later shutdown, flush or
  /// the destructor (async_teardown::shutdown_for).
  template <class Rep, class Period>
  bool shutdown_for(std::chrono::duration<Rep, Period> timeout) {
    using clock = std::chrono::steady_clock;
    const clock::time_point deadline = teardown::detail::deadline_after(timeout);
    const auto left = [&] {
      return deadline == clock::time_point::max() ? clock::duration::max()
                                                  : std::max(clock::duration::zero(), deadline - clock::now());
    };
    const bool mms = async_.shutdown_for(left());
    const bool swap = swap_release_.shutdown_for(left());
    return mms && swap;
  }
  bool stalled() const noexcept { return async_.stalled(); }

  /// A snapshot (subsets are read before their supersets).
  teardown::model::vmstat vmstat() const noexcept {
    const async_teardown_stats s = async_.stats();
    return {.queued = s.queued,
            .sync = s.sync,
            .rejected = s.rejected,
            .stalled = s.stalled,
            .uncontended = s.uncontended,
            .reaped = s.reaped,
            .drained = s.drained,
            .pending_pages = s.pending};
  }
  /// A snapshot of the swap release (released before batches: released <= batches).
  swap_release_stats swap_statistics() const noexcept {
    const async_teardown_stats worker = swap_release_.stats();
    swap_release_stats s;
    // acquire: pairs with the release add in release_swap_batch; the batch's count came first.
    s.released = swap_counts_.released.load(std::memory_order_acquire);
    s.batches = swap_counts_.batches.load(std::memory_order_relaxed);
    s.batched = swap_counts_.batched.load(std::memory_order_relaxed);
    s.inline_entries = swap_counts_.inline_entries.load(std::memory_order_relaxed);
    s.alloc_failures = swap_counts_.alloc_failures.load(std::memory_order_relaxed);
    s.queued = worker.queued;
    s.sync = worker.sync;
    if (swap_) {
      s.used = swap_->used();
      s.double_frees = swap_->double_frees();
    }
    return s;
  }
  /// The swap device (nullptr without one), for checks.
  const swap_space* swap_device() const noexcept { return swap_.get(); }

  /// The budget's high-water mark of pending pages.
  std::uint64_t pending_high_water() const noexcept { return async_.stats().high_water; }
  /// The mm_reaper's statistics (a pool's: its workers' sums).
  reaper_stats reaper_statistics() const noexcept { return async_.reaper_statistics(); }
  /// The trace domains (trace.hpp) of the mm_reaper's events (a pool's: one for all its workers)
  /// and of the swap-release worker's; distinct and nonzero. The oom_reaper emits no events.
  /// Wait-free.
  std::uint64_t mm_reaper_trace_domain() const noexcept { return async_.trace_domain(); }
  std::uint64_t swap_release_trace_domain() const noexcept { return swap_release_.trace_domain(); }
  std::uint64_t oom_kills() const noexcept { return oom_kills_.load(std::memory_order_relaxed); }
  /// Teardowns of any kind (exit path, inline mmput, reaper, drain).
  std::uint64_t teardowns() const noexcept { return teardowns_.load(std::memory_order_relaxed); }

 private:
  // True if this drop of mm_users was the last.
  static bool release_user(mm_struct& mm) noexcept {
    // acq_rel: the kernel's fully ordered atomic_dec_and_test. Release heads (or continues) the
    // release sequence that carries MMF_OOM_TARGETED; acquire on the final decrement reads from
    // it, so the teardown sees every user's writes and the flag (see the header comment).
    return mm.mm_users.fetch_sub(1, std::memory_order_acq_rel) == 1;
  }

  // __mmput: exit_aio (again: idempotent), exit_mmap, then the users' mm_count reference.
  void mmput_teardown(mm_struct& mm) noexcept {
    mm.aio.exit_aio();
    std::vector<std::uint32_t> swap;  // the mm's swap entries, released after the unmap
    {
      std::unique_lock lock(mm.mmap_lock);
      // An oom_reaper queued for this mm (or already walking it) races this teardown: then chunk
      // by chunk (see the header comment). Otherwise one munmap under the lock, as always. The
      // relaxed flag is visible here for the reason MMF_OOM_TARGETED is; were it missed, the
      // walk's `started`, read under the lock, would still keep the two sides apart.
      if (mm.walk.started || test_flag(mm, MMF_OOM_REAP_QUEUED)) {
        exit_walk(mm, lock);
      } else if (mm.base != nullptr) {
        munmap(mm.base, mm.mapped_bytes);
      }
      mm.base = nullptr;
      mm.mapped_bytes = 0;
      mm.walk.finished = true;
      mm.rss_pages.store(0, std::memory_order_relaxed);
      set_flag(mm, MMF_OOM_SKIP);  // exit_mmap hides the mm from the OOM killer
      swap = std::move(mm.swap_slots);
    }
    release_swap(swap);
    mm.teardowns.fetch_add(1, std::memory_order_relaxed);
    teardowns_.fetch_add(1, std::memory_order_relaxed);
    mmdrop(mm);  // may free mm
  }

  // ---- swap release (seed 004) -------------------------------------------------------------

  // Counts a final exit in flight, and marks this thread as on that exit's path, for its
  // lifetime. Only with a swap device: otherwise an exit pays nothing for it.
  class final_exit_scope {
   public:
    explicit final_exit_scope(basic_mm_system& system) noexcept
        : system_(system.swap_ ? &system : nullptr), outer_(exiting_here) {
      if (system_ == nullptr) return;
      system_->exiting_.fetch_add(1, std::memory_order_relaxed);
      exiting_here = system_;
    }
    final_exit_scope(const final_exit_scope&) = delete;
    final_exit_scope& operator=(const final_exit_scope&) = delete;
    ~final_exit_scope() {
      if (system_ == nullptr) return;
      exiting_here = outer_;
      system_->exiting_.fetch_sub(1, std::memory_order_relaxed);
    }

   private:
    basic_mm_system* system_;
    const basic_mm_system* outer_;
  };

  // The system whose final exit this thread is running, if any: a teardown on the mm_reaper,
  // in drain() or in a plain mmput is not an exiting task's (the seed's task_is_dying()).
  static inline thread_local const basic_mm_system* exiting_here = nullptr;

  // The teardown's swap entries: in page-sized batches to the swap-release worker when the
  // seed's conditions hold, else here. A batch that cannot be allocated ends the gathering; the
  // batches built so far are still queued and every entry not in one is released here, so
  // nothing is lost or released twice.
  void release_swap(const std::vector<std::uint32_t>& slots) noexcept {
    if (slots.empty()) return;
    std::size_t at = 0;
    // Relaxed: the count is a load estimate, as the seed's atomic_read of its exiting count.
    if (exiting_here == this && slots.size() >= swap_cluster_max && swap_release_.enabled() &&
        exiting_.load(std::memory_order_relaxed) >= swap_min_exiting_.load(std::memory_order_relaxed)) {
      const swap_batch_allocator& allocator = *swap_allocator_.load(std::memory_order_relaxed);
      llist_chain<swap_batch, &swap_batch::hook> batches;
      while (at < slots.size()) {
        void* page = allocator.allocate(sizeof(swap_batch));
        if (page == nullptr) {
          swap_counts_.alloc_failures.fetch_add(1, std::memory_order_relaxed);
          break;
        }
        auto* batch = new (page) swap_batch;
        batch->deallocate = allocator.deallocate;
        batch->count = static_cast<std::uint32_t>(std::min(swap_batch::capacity, slots.size() - at));
        std::copy_n(slots.begin() + static_cast<std::ptrdiff_t>(at), batch->count, batch->slots);
        at += batch->count;
        batches.push_back(*batch);  // O(1): the gathering order is the chain's
        swap_counts_.batches.fetch_add(1, std::memory_order_relaxed);
      }
      swap_counts_.batched.fetch_add(at, std::memory_order_relaxed);
      (void)swap_release_.put_chain(std::move(batches));  // queued, or released inline at once
    }
    for (std::size_t rest = at; rest < slots.size(); ++rest) swap_->free(slots[rest]);
    swap_counts_.inline_entries.fetch_add(slots.size() - at, std::memory_order_relaxed);
  }

  // On the swap-release worker (or inline): frees the batch's slots, then its page.
  void release_swap_batch(swap_batch& batch) noexcept {
    for (std::uint32_t at = 0; at < batch.count; ++at) swap_->free(batch.slots[at]);
    void (*deallocate)(void*) noexcept = batch.deallocate;
    batch.~swap_batch();
    deallocate(&batch);
    swap_counts_.released.fetch_add(1, std::memory_order_release);  // pairs with swap_statistics()
  }

  static std::uint32_t validated_swap_min_exiting(std::uint32_t exits) {
    if (exits == 0) throw std::invalid_argument("teardown::model: swap_min_exiting must be at least 1; unchanged");
    return exits;
  }

  // ---- reclaim (under mmap_lock) ----------------------------------------------------------

  // How many of `pages` reclaim may take now: none once a chunked OOM teardown has begun.
  static std::uint64_t reclaimable(const mm_struct& mm, std::uint64_t pages) noexcept {
    return mm.walk.started ? 0 : std::min(pages, get_mm_rss(mm));
  }

  // Drops the tail `taken` pages of the RSS (real memory: MADV_DONTNEED). Throws
  // std::system_error, changing nothing, if madvise fails.
  static void reclaim_locked(mm_struct& mm, std::uint64_t taken) {
    if (mm.base != nullptr) {
      const std::size_t keep = (get_mm_rss(mm) - taken) * page_size();
      if (madvise(mm.base + keep, taken * page_size(), MADV_DONTNEED) != 0) {
        throw std::system_error(errno, std::generic_category(), "teardown::model::reclaim: madvise");
      }
    }
    mm.rss_pages.fetch_sub(static_cast<std::int64_t>(taken), std::memory_order_relaxed);
  }

  // ---- the chunked teardown of an OOM victim (under mmap_lock unless said otherwise) --------

  // At most this many chunks for simulated memory: a huge simulated RSS gets larger chunks, so
  // that a walk costs bounded bookkeeping. Real memory always walks oom_reap_chunk_bytes.
  static constexpr std::uint64_t max_simulated_chunks = std::uint64_t{1} << 16;

  // The first side to arrive lays out the chunks, from the mapping and the RSS as they are now.
  static void start_walk(mm_struct& mm) noexcept {
    chunk_walk& walk = mm.walk;
    if (walk.started) return;
    walk.started = true;
    walk.rss_at_start = get_mm_rss(mm);
    const std::uint64_t natural = std::max<std::uint64_t>(oom_reap_chunk_bytes / page_size(), 1);
    if (mm.base != nullptr) {
      walk.chunk_pages = natural;
      const std::uint64_t chunk_bytes = natural * page_size();
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
    const std::size_t chunk_bytes = mm.walk.chunk_pages * page_size();
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

  // The exit path's side: unmaps every chunk, low to high, each exactly once. It waits for a
  // chunk the oom_reaper holds, then unmaps it too (its pages are gone already: they were the
  // oom_reaper's to count).
  void exit_walk(mm_struct& mm, std::unique_lock<std::mutex>& lock) noexcept {
    chunk_walk& walk = mm.walk;
    start_walk(mm);
    while (walk.unmapped_below < walk.chunks) {
      const std::uint64_t c = walk.unmapped_below;
      if (walk.reaper_busy == c) {
        wait_for_chunk(mm, lock, oom_.exit_wait_ns);
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
      oom_.exit_pages.fetch_add(pages, std::memory_order_relaxed);
      oom_.exit_chunks.fetch_add(1, std::memory_order_relaxed);
      oom_.exit_work_ns.fetch_add(took, std::memory_order_relaxed);
    }
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
  void oom_reap_walk(mm_struct& mm) noexcept {
    std::unique_lock lock(mm.mmap_lock);
    chunk_walk& walk = mm.walk;
    // Torn down already, or hidden from the OOM killer (the kernel's oom_reaper skips an mm
    // with MMF_OOM_SKIP): nothing to do.
    if (walk.finished || (!walk.started && test_flag(mm, MMF_OOM_SKIP))) {
      oom_.skipped.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    start_walk(mm);
    const bool downward = oom_reap_direction_.load(std::memory_order_relaxed) == reap_direction::other;
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
        wait_for_chunk(mm, lock, oom_.reaper_wait_ns);
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
      oom_.reaper_work_ns.fetch_add(took, std::memory_order_relaxed);
      if (!released) {
        oom_.errors.fetch_add(1, std::memory_order_relaxed);  // the exit path will release the rest
        break;
      }
      mark_reaped(walk, c);
      walk.reaper_pages += pages;
      mm.rss_pages.fetch_sub(static_cast<std::int64_t>(pages), std::memory_order_relaxed);
      oom_.reaper_pages.fetch_add(pages, std::memory_order_relaxed);
      oom_.reaper_chunks.fetch_add(1, std::memory_order_relaxed);
      next = downward ? c : c + 1;
    }
    set_flag(mm, MMF_OOM_SKIP);  // as the kernel's oom_reaper does: the OOM killer moves on
  }

  // Waits out the oom reap delay, polling (no timed wait: see STYLE.md on ThreadSanitizer);
  // the destructor cuts it short.
  void wait_oom_reap_delay(std::uint64_t queued_at_ns) const noexcept {
    for (;;) {
      if (oom_reaper_stopping_.load(std::memory_order_relaxed)) return;
      const std::uint64_t delay = oom_reap_delay_ns_.load(std::memory_order_relaxed);
      const std::uint64_t waited = teardown::detail::monotonic_ns() - queued_at_ns;
      if (waited >= delay) return;
      std::this_thread::sleep_for(std::chrono::nanoseconds(std::min<std::uint64_t>(delay - waited, 1'000'000)));
    }
  }

  // On the oom_reaper: one victim.
  void oom_reap(oom_reap_request& request) noexcept {
    mm_struct& mm = *request.mm;
    wait_oom_reap_delay(request.queued_at_ns);
    oom_reap_walk(mm);
    oom_.reaped.fetch_add(1, std::memory_order_release);  // pairs with oom_reap_statistics
    mmdrop(mm);  // oom_kill's reference; may free mm
  }

  std::unique_ptr<task> attach(mm_struct& mm) {
    const std::lock_guard lock(tasklist_lock_);
    return register_task_locked(mm);
  }

  std::unique_ptr<task> register_task_locked(mm_struct& mm) {
    std::unique_ptr<task> created(new task(*this, mm));
    static_cast<task_link&>(*created).link_after(tasks_);
    return created;
  }

  static std::uint64_t validated(std::string_view knob, std::uint64_t pages) {
    if (pages > budget::max_cap) {
      throw bad_knob(knob, std::to_string(pages), "is above the largest value, " + std::to_string(budget::max_cap));
    }
    return pages;
  }

  static std::uint32_t validated_min_concurrent(std::uint64_t exits) {
    if (exits == 0) throw bad_knob(knob_min_concurrent, "0", "must be at least 1 (1: no gate)");
    if (exits > max_min_concurrent_exits) {
      throw bad_knob(knob_min_concurrent, std::to_string(exits),
                     "is above the largest value, " + std::to_string(max_min_concurrent_exits));
    }
    return static_cast<std::uint32_t>(exits);
  }

  static reap_direction parse_direction(std::string_view text) {
    std::string_view word = text;
    if (!word.empty() && word.back() == '\n') word.remove_suffix(1);
    if (word == "same") return reap_direction::same;
    if (word == "other") return reap_direction::other;
    throw bad_knob(knob_oom_reap_direction, text, "must be \"same\" or \"other\"");
  }

  static std::uint64_t parse(std::string_view knob, std::string_view text) {
    std::string_view digits = text;
    if (!digits.empty() && digits.back() == '\n') digits.remove_suffix(1);
    std::uint64_t value = 0;
    const char* end = digits.data() + digits.size();
    const auto [stop, error] = std::from_chars(digits.data(), end, value);
    if (digits.empty() || error == std::errc::invalid_argument || stop != end) {
      throw bad_knob(knob, text, "is not a decimal number");
    }
    if (error == std::errc::result_out_of_range) throw bad_knob(knob, text, "is out of range");
    return value;
  }

  static std::invalid_argument bad_knob(std::string_view knob, std::string_view value, const std::string& why) {
    return std::invalid_argument("teardown::model: " + std::string(knob) + ": \"" + std::string(value) + "\" " + why +
                                 "; unchanged");
  }

  static async_teardown_options make_options(mm_system_options& opts) {
    async_teardown_options out;
    out.enabled = opts.async_mm_teardown;
    out.threshold = validated(knob_thresh, opts.thresh_pages.value_or(default_thresh_pages()));
    out.max_pending = validated(knob_max_pending, opts.max_pending_pages.value_or(default_max_pending_pages()));
    out.sync_when_stalled = opts.sync_when_stalled;
    out.min_concurrent = validated_min_concurrent(opts.min_concurrent_exits);
    out.reaper = std::move(opts.reaper);
    out.pool = std::move(opts.pool);
    return out;
  }

  // Seed 004's swap release: what it uses comes before it, so it stops before any of that dies;
  // it comes before the mm_reaper, which may still release swap while it drains at the end.
  struct swap_counters {  // relaxed, except released (see swap_statistics)
    std::atomic<std::uint64_t> batched{0}, inline_entries{0}, batches{0}, alloc_failures{0}, released{0};
  };
  std::unique_ptr<swap_space> swap_;
  swap_counters swap_counts_;
  std::atomic<std::uint32_t> swap_min_exiting_;
  std::atomic<const swap_batch_allocator*> swap_allocator_{&default_swap_batch_allocator};
  std::atomic<std::uint32_t> exiting_{0};  // final exits in flight (with a swap device only)
  async_teardown<swap_batch, &swap_batch::hook, swap_batch_traits> swap_release_;

  std::atomic<std::uint64_t> next_id_{0};
  std::atomic<std::uint64_t> oom_kills_{0};
  std::atomic<std::uint64_t> teardowns_{0};
  mutable std::mutex tasklist_lock_;
  task_link tasks_;  // the live tasks' list head; guarded by tasklist_lock_

  // The OOM reaper: what it reads comes before it, so it stops before any of that dies.
  struct oom_counters {  // relaxed, except reaped (see oom_reap_statistics)
    std::atomic<std::uint64_t> queued{0}, reaped{0}, skipped{0}, errors{0};
    std::atomic<std::uint64_t> reaper_pages{0}, reaper_chunks{0}, reaper_work_ns{0}, reaper_wait_ns{0};
    std::atomic<std::uint64_t> exit_pages{0}, exit_chunks{0}, exit_work_ns{0}, exit_wait_ns{0};
  };
  struct oom_reap_fn {
    basic_mm_system* system;
    void operator()(oom_reap_request& request) const noexcept { system->oom_reap(request); }
  };
  oom_counters oom_;
  std::atomic<reap_direction> oom_reap_direction_{reap_direction::other};
  std::atomic<std::uint64_t> oom_reap_delay_ns_{0};
  std::atomic<bool> oom_reaper_stopping_{false};  // set by the destructor: no more waiting
  // Not freezable (freeze() is the mm_reaper's), nice 0 like the kernel's oom_reaper kthread.
  reaper<oom_reap_request, &oom_reap_request::node, oom_reap_fn> oom_reaper_{
      oom_reap_fn{this}, reaper_options{.name = "oom_reaper", .nice = 0}};
  // Last: destroyed first, so the backlog is torn down while everything it uses is alive.
  async_teardown<mm_struct, &mm_struct::reap_node, mm_traits, Key, Workers> async_;
};

/// The kernel with the run-time toggle (vm.async_mm_teardown).
using mm_system = basic_mm_system<>;
/// The same with a pool of mm_reaper workers (mm_system_options::pool; RFC open question 2).
using pooled_mm_system = basic_mm_system<static_key, reaper_pool_workers>;

}  // namespace teardown::model
