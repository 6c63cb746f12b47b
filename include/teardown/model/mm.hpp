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
//                 flags with MMF_OOM_SKIP and MMF_OOM_TARGETED; an RSS in pages that reclaim()
//                 may shrink while the mm is queued; an AIO context whose exit_aio() is
//                 idempotent and blocks until in-flight AIO completes; the llist hook and the
//                 memoised charge; optionally real memory (an anonymous mapping of the RSS,
//                 touched at creation, unmapped by the teardown), so teardown costs are real.
//   mm_system     the kernel: mm_alloc, mmget, mmput (always inline), mmput_exit (the deferral
//                 path), mmgrab/mmdrop, tasks (thread groups holding an mm) with exit(),
//                 mark_oom_victim, oom_kill, reclaim, the three knobs (typed setters and a
//                 sysctl-style text interface), flush, drain, freeze/thaw and a vmstat snapshot.
//
// mmput_exit(mm), as in the series:
//   if the decrement of mm_users is not the last: return
//   if vm.async_mm_teardown is off:               __mmput inline            (sync)
//   rss = get_mm_rss(mm), once
//   rss < thresh_pages, MMF_OOM_SKIP or MMF_OOM_TARGETED:  __mmput inline   (sync)
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
//                                       briefly). A task's exit is idempotent.
//   reclaim                             any thread holding mm_count; takes the mm's mmap lock.
//   knobs (set_*, set, get)             any thread; setters validate first and change nothing
//                                       on error (std::invalid_argument naming the knob).
//   flush, drain, freeze, thaw, shutdown   any thread but the reaper; may block.
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
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

#include "teardown/async_teardown.hpp"

namespace teardown::model {

/// Flag bits of mm_struct::flags (the kernel's bit numbers).
inline constexpr unsigned MMF_OOM_SKIP = 21;      // hidden from the OOM killer: already reaped
inline constexpr unsigned MMF_OOM_TARGETED = 32;  // the target of an in-flight OOM kill; sticky

enum class backing {
  simulated,  // the RSS is only a number: teardown costs nothing real
  real,       // the RSS is an anonymous mapping, touched at creation and unmapped by teardown
};

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
  std::uint64_t reaped = 0;         // queued mms torn down (by the reaper or by drain)
  std::uint64_t drained = 0;        // subset of reaped: torn down by drain()
  std::uint64_t pending_pages = 0;  // charged and not yet released
};

struct mm_system_options {
  bool async_mm_teardown = false;        // vm.async_mm_teardown: off by default, as in the series
  std::optional<std::uint64_t> thresh_pages{};       // vm.async_mm_teardown_thresh_pages;
                                                    // unset: 64 MiB of pages
  std::optional<std::uint64_t> max_pending_pages{};  // vm.async_mm_teardown_max_pending_pages;
                                                    // unset: a quarter of physical RAM
  bool sync_when_stalled = false;        // async_teardown's watchdog; the series has none
  reaper_options reaper{.name = "mm_reaper"};
};

/// The kernel. Key = const_key<false> builds it with the deferral compiled out (the series'
/// CONFIG_ASYNC_MM_TEARDOWN=n): no reaper thread, no toggle knob, every exit inline.
template <class Key = static_key>
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

 public:
  // With the deferral compiled out the toggle knob does not exist, as with CONFIG=n.
  static constexpr bool compiled_out = detail::compiled_off<Key>();

  static constexpr std::string_view knob_enabled = "vm.async_mm_teardown";
  static constexpr std::string_view knob_thresh = "vm.async_mm_teardown_thresh_pages";
  static constexpr std::string_view knob_max_pending = "vm.async_mm_teardown_max_pending_pages";

  /// A thread group: holds one mm_users reference from creation until exit().
  class task {
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
        system_->tasks_.erase(this);
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

  /// Throws std::invalid_argument (naming the knob) for a bad knob value, std::system_error if
  /// the reaper cannot start.
  explicit basic_mm_system(mm_system_options opts = {})
      : async_(make_options(opts), mm_traits{this}) {}

  basic_mm_system(const basic_mm_system&) = delete;
  basic_mm_system& operator=(const basic_mm_system&) = delete;

  /// Tears down everything queued, then stops the reaper. Every task must have exited and every
  /// mm been put before.
  ~basic_mm_system() = default;

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
    mm->rss_pages.store(static_cast<std::int64_t>(rss_pages), std::memory_order_relaxed);
    if (memory == backing::real && rss_pages > 0) {
      const std::size_t bytes = static_cast<std::size_t>(rss_pages) * page_size();
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
  /// taken. The caller holds mm_count.
  std::uint64_t reclaim(mm_struct& mm, std::uint64_t pages) {
    const std::lock_guard lock(mm.mmap_lock);
    const std::uint64_t rss = get_mm_rss(mm);
    const std::uint64_t taken = std::min(pages, rss);
    if (taken == 0) return 0;
    if (mm.base != nullptr) {
      const std::size_t keep = static_cast<std::size_t>(rss - taken) * page_size();
      if (madvise(mm.base + keep, static_cast<std::size_t>(taken) * page_size(), MADV_DONTNEED) != 0) {
        throw std::system_error(errno, std::generic_category(), "teardown::model::reclaim: madvise");
      }
    }
    mm.rss_pages.fetch_sub(static_cast<std::int64_t>(taken), std::memory_order_relaxed);
    return taken;
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
  /// holds it (the victim and every CLONE_VM sharer). Returns how many were killed; 0 if the
  /// victim has already exited.
  std::size_t oom_kill(task& victim) {
    const std::lock_guard lock(tasklist_lock_);
    mm_struct* mm = victim.mm_;
    if (mm == nullptr) return 0;
    // Before any kill: a killed sharer may exit (and make the final decrement) at once; the
    // lock orders this store before every holder's exit (see the header comment).
    set_flag(*mm, MMF_OOM_TARGETED);
    std::size_t killed = 0;
    for (task* t : tasks_) {
      if (t->mm_ == mm) {
        t->killed_.store(true, std::memory_order_relaxed);  // the SIGKILL: a flag the owner polls
        ++killed;
      }
    }
    oom_kills_.fetch_add(1, std::memory_order_relaxed);
    return killed;
  }

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

  /// Writes a knob as sysctl would: `set("vm.async_mm_teardown", "1")`. The value is a decimal
  /// number (one trailing newline allowed, as `echo` writes it); the toggle takes 0 or 1.
  /// Throws std::invalid_argument naming the knob, changing nothing, for an unknown knob or a
  /// malformed or out-of-range value.
  void set(std::string_view knob, std::string_view value) {
    if (knob == knob_enabled && !compiled_out) {
      const std::uint64_t on = parse(knob, value);
      if (on > 1) throw bad_knob(knob, value, "must be 0 or 1");
      if constexpr (!compiled_out) set_async_mm_teardown(on == 1);
    } else if (knob == knob_thresh) {
      set_thresh_pages(parse(knob, value));
    } else if (knob == knob_max_pending) {
      set_max_pending_pages(parse(knob, value));
    } else {
      throw std::invalid_argument("teardown::model: unknown knob \"" + std::string(knob) + "\"");
    }
  }

  /// Reads a knob as sysctl would: the decimal value, no newline. Throws std::invalid_argument
  /// for an unknown knob.
  std::string get(std::string_view knob) const {
    if (knob == knob_enabled && !compiled_out) return async_mm_teardown() ? "1" : "0";
    if (knob == knob_thresh) return std::to_string(thresh_pages());
    if (knob == knob_max_pending) return std::to_string(max_pending_pages());
    throw std::invalid_argument("teardown::model: unknown knob \"" + std::string(knob) + "\"");
  }

  // ---- the reaper -------------------------------------------------------------------------

  /// Blocks until every mm queued before the call is torn down.
  void flush() { async_.flush(); }
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
  /// Tears down the backlog and stops the reaper; later exits tear down inline. May block.
  void shutdown() { async_.shutdown(); }
  bool stalled() const noexcept { return async_.stalled(); }

  /// A snapshot (subsets are read before their supersets).
  teardown::model::vmstat vmstat() const noexcept {
    const async_teardown_stats s = async_.stats();
    return {s.queued, s.sync, s.rejected, s.stalled, s.reaped, s.drained, s.pending};
  }
  /// The budget's high-water mark of pending pages.
  std::uint64_t pending_high_water() const noexcept { return async_.stats().high_water; }
  reaper_stats reaper_statistics() const noexcept { return async_.reaper_statistics(); }
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
    {
      const std::lock_guard lock(mm.mmap_lock);
      if (mm.base != nullptr) {
        munmap(mm.base, mm.mapped_bytes);
        mm.base = nullptr;
        mm.mapped_bytes = 0;
      }
      mm.rss_pages.store(0, std::memory_order_relaxed);
      set_flag(mm, MMF_OOM_SKIP);  // exit_mmap hides the mm from the OOM killer
    }
    mm.teardowns.fetch_add(1, std::memory_order_relaxed);
    teardowns_.fetch_add(1, std::memory_order_relaxed);
    mmdrop(mm);  // may free mm
  }

  std::unique_ptr<task> attach(mm_struct& mm) {
    const std::lock_guard lock(tasklist_lock_);
    return register_task_locked(mm);
  }

  std::unique_ptr<task> register_task_locked(mm_struct& mm) {
    std::unique_ptr<task> created(new task(*this, mm));
    tasks_.insert(created.get());
    return created;
  }

  static std::uint64_t validated(std::string_view knob, std::uint64_t pages) {
    if (pages > budget::max_cap) {
      throw bad_knob(knob, std::to_string(pages), "is above the largest value, " + std::to_string(budget::max_cap));
    }
    return pages;
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
    out.reaper = std::move(opts.reaper);
    return out;
  }

  std::atomic<std::uint64_t> next_id_{0};
  std::atomic<std::uint64_t> oom_kills_{0};
  std::atomic<std::uint64_t> teardowns_{0};
  mutable std::mutex tasklist_lock_;
  std::set<task*> tasks_;  // live tasks; guarded by tasklist_lock_
  // Last: destroyed first, so the backlog is torn down while everything it uses is alive.
  async_teardown<mm_struct, &mm_struct::reap_node, mm_traits, Key> async_;
};

/// The kernel with the run-time toggle (vm.async_mm_teardown).
using mm_system = basic_mm_system<>;

}  // namespace teardown::model
