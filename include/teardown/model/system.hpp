// teardown/model/system.hpp — basic_mm_system, the model kernel (part of model/mm.hpp): mm_alloc,
// mmget, mmput (always inline), mmput_exit (the deferral path), mmgrab/mmdrop, tasks with exit(),
// mark_oom_victim, oom_kill, reclaim and swap_out, the knobs (sysctl.hpp), flush, drain,
// freeze/thaw, stop, and the statistics (vmstat, stats).
//
// mmput_exit(mm), as in the mm_reaper patch series:
//   if the decrement of mm_users is not the last: return
//   if vm.async_mm_teardown is off:                              __mmput inline   (sync)
//   rss = get_mm_rss(mm), once
//   rss < thresh_pages, MMF_OOM_SKIP or MMF_OOM_TARGETED:         __mmput inline   (sync)
//   fewer than min_concurrent_exits final exits in flight, this one included:
//                                                                __mmput inline   (sync, uncontended)
//     (the swap batch release series' gate; at its default, 1, it is off and the path is the series')
//   exit_aio(mm), eagerly, on the exiting thread
//   charge rss to pending pages (add-then-check); over max_pending: inline        (sync, rejected)
//   else memoise the charge in the mm and queue it for the mm_reaper               (queued)
// Every other final mmput() tears down inline and is not counted, as in the kernel.
//
// Who may call what (the mm_system must outlive every mm, task and call)
//   mm_alloc, spawn, clone_vm     any thread. May allocate, and with real memory map and touch it
//                                 (may block; throws on failure, changing nothing).
//   mmget, mmgrab, mmdrop, mmput  any thread holding the reference they use. Lock-free, except
//                                 the teardown a final mmput/mmdrop runs.
//   mmput_exit                    any thread holding a mm_users reference; the caller's own exit
//                                 path. Lock-free except exit_aio (may block) and an inline teardown.
//   task::exit, mark_oom_victim, oom_kill   any thread; take the tasklist lock (may block
//                                 briefly). A task's exit is idempotent. oom_kill's hand-off to
//                                 the oom_reaper is lock-free.
//   flush_oom_reaper              any thread but the oom_reaper; blocks until every victim queued
//                                 before the call is reaped (its delay included).
//   set_oom_reap_direction, set_oom_reap_delay   any thread; wait-free.
//   reclaim, swap_out             any thread holding mm_count; take the mm's mmap lock.
//   knobs (set_*, set, get), replace_max_pending, nice, set_nice   any thread; setters validate
//                                 first and change nothing on error (std::invalid_argument
//                                 naming the knob). pressure_policy.hpp's entry points.
//   flush, drain, freeze, thaw, stop, stop_for   any thread but the reaper; may block (stop
//                                 without limit, stop_for up to its timeout).
//   vmstat, stats, trace_domain   any thread; wait-free snapshots.
//
// The mm_reaper is Workers' (async_teardown's worker policy): one_reaper (mm_system) has the
// series' single mm_reaper thread; reaper_pool_workers (pooled_mm_system) a pool of them, sized by
// mm_system_options::pool, each named after mm_system_options::reaper ("mm_reaper-0", ...).
// Everything holds for either; the pool keeps no order between mms that different threads queued.
// The swap-release worker (swap.hpp) and the oom_reaper (oom_reaper.hpp) stay single threads.
//
// Memory ordering: every change of mm_users is an RMW and every decrement acq_rel, so the final
// decrement sees every user's writes and MMF_OOM_TARGETED (docs/design.md, "The model's OOM
// ordering"). No OOM victim's memory waits for the freezable mm_reaper (docs/design.md, "The
// model's thaw on urgency").
// Design: docs/design.md, "model/mm.hpp: the kernel's composition, in user space".
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "teardown/async_teardown.hpp"
#include "teardown/model/mm_struct.hpp"
#include "teardown/model/oom_reaper.hpp"
#include "teardown/model/stats.hpp"
#include "teardown/model/swap.hpp"
#include "teardown/model/sysctl.hpp"
#include "teardown/reaper.hpp"
#include "teardown/reaper_pool.hpp"

namespace teardown::model {

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

 public:
  // With the deferral compiled out the toggle knob does not exist, as with CONFIG=n.
  static constexpr bool compiled_out = teardown::detail::compiled_off<Key>();

  static constexpr std::string_view knob_enabled = detail::knob_enabled;
  static constexpr std::string_view knob_thresh = detail::knob_thresh;
  static constexpr std::string_view knob_max_pending = detail::knob_max_pending;
  static constexpr std::string_view knob_min_concurrent = detail::knob_min_concurrent;
  static constexpr std::string_view knob_swap_async_release = detail::knob_swap_async_release;
  static constexpr std::string_view knob_oom_reap_direction = detail::knob_oom_reap_direction;
  /// Fewer swap entries than this are released where the teardown runs (SWAP_CLUSTER_MAX).
  static constexpr std::size_t swap_cluster_max = swap_release::cluster_max;
  /// The largest vm.async_mm_teardown_min_concurrent_exits: far beyond any number of CPUs.
  static constexpr std::uint64_t max_min_concurrent_exits = detail::max_min_concurrent_exits;

  using task_link = detail::task_link;  // the kernel's task list (mm_struct.hpp)

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

  /// Throws std::invalid_argument (naming the knob) for a bad knob value, or for a pool.worker
  /// that is not default, or (pooled) for bad pool options; std::system_error if a worker
  /// cannot start.
  explicit basic_mm_system(mm_system_options opts = {})
      : swap_release_(detail::refuse_ignored(opts).swap_slots, opts.swap_async_release, opts.swap_min_exiting),
        async_(detail::make_options(opts), mm_traits{this}) {}

  basic_mm_system(const basic_mm_system&) = delete;
  basic_mm_system& operator=(const basic_mm_system&) = delete;

  /// Tears down everything queued, then stops the reaper. Every task must have exited and every
  /// mm been put before. Then the oom_reaper reaps every victim still queued for it (any delay
  /// cut short) and stops, before anything it uses is destroyed.
  ~basic_mm_system() { oom_.begin_stopping(); }

  static std::size_t page_size() noexcept { return detail::page_size(); }
  static std::uint64_t default_thresh_pages() noexcept { return detail::default_thresh_pages(); }
  static std::uint64_t default_max_pending_pages() noexcept { return detail::default_max_pending_pages(); }

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
    if (memory == backing::real && rss_pages > 0) detail::map_real(*mm, rss_pages);
    return mm.release();
  }

  /// Takes a mm_users reference; the caller already holds one. Lock-free.
  static void mmget(mm_struct& mm) noexcept {
    // A new reference from an existing one: still an RMW, so it continues the release sequence
    // the OOM argument relies on (reference_count.hpp).
    mm.mm_users.get();
  }

  /// Takes a mm_users reference unless the mm is already being torn down (the kernel's
  /// mmget_not_zero, used by /proc readers). Lock-free.
  static bool mmget_not_zero(mm_struct& mm) noexcept {
    return mm.mm_users.get_not_zero();
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
    const swap_release::final_exit_scope exiting(swap_release_);
    return async_.put(mm);
  }

  /// Takes a reference to the struct (not the address space): the mm stays readable after its
  /// teardown until mmdrop. Lock-free.
  static void mmgrab(mm_struct& mm) noexcept { mm.mm_count.get(); }

  /// Drops a struct reference; the last frees the mm.
  static void mmdrop(mm_struct& mm) noexcept { detail::mmdrop(mm); }

  /// Reclaim takes up to `pages` of the mm's RSS (real memory: the tail of the mapping is
  /// discarded with MADV_DONTNEED), even while the mm waits in the queue. Returns the pages
  /// taken. The caller holds mm_count. Takes nothing from an mm whose chunked OOM teardown has
  /// begun (the exit path and the oom_reaper account for every page there).
  std::uint64_t reclaim(mm_struct& mm, std::uint64_t pages) {
    const std::lock_guard lock(mm.mmap_lock);
    const std::uint64_t taken = detail::reclaimable(mm, pages);
    if (taken != 0) detail::reclaim_locked(mm, taken);
    return taken;
  }

  /// Reclaim to swap (the swap batch release series' setting): takes up to `pages` of the mm's
  /// RSS as reclaim() does and gives each page a swap slot, which the mm holds until its teardown
  /// releases it.
  /// Returns the pages swapped out. Throws std::logic_error without a swap device
  /// (mm_system_options::swap_slots), std::length_error when the device has too few free slots;
  /// either way nothing changes. The caller holds mm_count.
  std::uint64_t swap_out(mm_struct& mm, std::uint64_t pages) {
    swap_space* const device = swap_release_.device();
    if (device == nullptr) {
      throw std::logic_error("teardown::model::swap_out: no swap device (mm_system_options::swap_slots is 0)");
    }
    const std::lock_guard lock(mm.mmap_lock);
    const std::uint64_t taken = detail::reclaimable(mm, pages);
    if (taken == 0) return 0;
    const std::size_t before = mm.swap_slots.size();
    device->allocate(static_cast<std::size_t>(taken), mm.swap_slots);
    try {
      detail::reclaim_locked(mm, taken);
    } catch (...) {
      for (std::size_t at = before; at < mm.swap_slots.size(); ++at) device->free(mm.swap_slots[at]);
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
      // lock orders this store before every holder's exit (see "The model's OOM ordering").
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
    if (reap != nullptr) oom_.queue(*reap);
    return killed;
  }


  // ---- the OOM reaper (oom_reaper.hpp) ------------------------------------------------------

  /// Where the oom_reaper starts on a victim (read once per victim, when its walk begins).
  reap_direction oom_reap_direction() const noexcept { return oom_.direction(); }
  /// Throws std::invalid_argument naming the knob, changing nothing, for a value that is neither
  /// reap_direction::same nor reap_direction::other.
  void set_oom_reap_direction(reap_direction direction) {
    if (direction != reap_direction::same && direction != reap_direction::other) {
      throw detail::bad_knob(knob_oom_reap_direction, std::to_string(static_cast<int>(direction)),
                             "is not a direction (\"same\" or \"other\")");
    }
    oom_.set_direction(direction);
  }

  /// How long the oom_reaper leaves a victim to its own exit before reaping it, counted from the
  /// kill: the kernel's OOM_REAPER_DELAY (2 s). The model's default is 0, so that the oom_reaper
  /// races the exit every time. A change applies to victims already waiting. A model parameter,
  /// not a sysctl. Throws std::invalid_argument, changing nothing, for a negative delay.
  std::chrono::nanoseconds oom_reap_delay() const noexcept { return oom_.delay(); }
  void set_oom_reap_delay(std::chrono::nanoseconds delay) {
    if (delay.count() < 0) {
      throw std::invalid_argument("teardown::model::set_oom_reap_delay: negative delay; unchanged");
    }
    oom_.set_delay(delay);
  }

  /// Blocks until every victim queued for the oom_reaper before the call has been reaped (and
  /// its struct reference dropped). Waits out the delay, if one is set.
  void flush_oom_reaper() { oom_.flush(); }

  // ---- knobs (sysctl.hpp) -------------------------------------------------------------------

  bool async_mm_teardown() const noexcept { return async_.enabled(); }
  void set_async_mm_teardown(bool on)
    requires(!compiled_out)
  {
    async_.set_enabled(on);
  }
  std::uint64_t thresh_pages() const noexcept { return async_.threshold(); }
  void set_thresh_pages(std::uint64_t pages) { async_.set_threshold(detail::validated(knob_thresh, pages)); }
  /// vm.async_mm_teardown_max_pending_pages, in pages.
  std::uint64_t max_pending() const noexcept { return async_.max_pending(); }
  void set_max_pending_pages(std::uint64_t pages) {
    async_.set_max_pending(detail::validated(knob_max_pending, pages));
  }
  /// set_max_pending_pages(desired) only if the knob still reads `expected` (a temporary cap
  /// undone without overwriting one set meanwhile: pressure_policy.hpp). Throws as the setter does.
  bool replace_max_pending(std::uint64_t expected, std::uint64_t desired) {
    return async_.replace_max_pending(expected, detail::validated(knob_max_pending, desired));
  }
  [[deprecated("use max_pending()")]] std::uint64_t max_pending_pages() const noexcept { return max_pending(); }
  [[deprecated("use replace_max_pending()")]] bool replace_max_pending_pages(std::uint64_t expected,
                                                                             std::uint64_t desired) {
    return replace_max_pending(expected, desired);
  }
  /// The mm_reaper's nice value (19 unless mm_system_options::reaper says otherwise), and a new
  /// one: true if applied (the system may refuse a lower value). Throws std::invalid_argument
  /// outside [-20, 19].
  int nice() const { return async_.nice(); }
  bool set_nice(int value) { return async_.set_nice(value); }
  [[deprecated("use nice()")]] int worker_nice() const { return nice(); }
  [[deprecated("use set_nice()")]] bool set_worker_nice(int value) { return set_nice(value); }
  /// The concurrency gate: an eligible final exit tears down inline (decision::inline_uncontended)
  /// while fewer than this many final exits, its own included, are in flight. 1: off.
  std::uint64_t min_concurrent_exits() const noexcept { return async_.min_concurrent(); }
  /// Throws std::invalid_argument naming the knob, changing nothing, for 0 or above
  /// max_min_concurrent_exits.
  void set_min_concurrent_exits(std::uint64_t exits) {
    async_.set_min_concurrent(detail::validated_min_concurrent(exits));
  }

  /// The swap batch release series' swap release: while on, an exiting task whose teardown runs
  /// on its own thread hands its swap entries, in page-sized batches, to the swap-release worker,
  /// provided at least swap_min_exiting final exits run at once and it holds SWAP_CLUSTER_MAX
  /// (32) or more.
  bool swap_async_release() const noexcept { return swap_release_.enabled(); }
  void set_swap_async_release(bool on) { swap_release_.set_enabled(on); }
  std::uint32_t swap_min_exiting() const noexcept { return swap_release_.min_exiting(); }
  /// Throws std::invalid_argument, changing nothing, for 0.
  void set_swap_min_exiting(std::uint32_t exits) { swap_release_.set_min_exiting(exits); }
  /// Where swap batches come from from now on (each batch is freed by the allocator that made
  /// it). The allocator must outlive the mm_system: only its address is kept, so a temporary
  /// is refused at compile time. Wait-free.
  void set_swap_batch_allocator(const swap_batch_allocator& allocator) noexcept {
    swap_release_.set_allocator(allocator);
  }
  void set_swap_batch_allocator(const swap_batch_allocator&&) = delete;

  /// Writes a knob as sysctl would: `set("vm.async_mm_teardown", "1")` (sysctl.hpp: the values).
  /// Throws std::invalid_argument naming the knob, changing nothing, for an unknown knob or a
  /// malformed or out-of-range value.
  void set(std::string_view knob, std::string_view value) { detail::sysctl_set(*this, knob, value); }
  /// Reads a knob as sysctl would: the decimal value (vm.oom_reap_direction: "same" or
  /// "other"), no newline. Throws std::invalid_argument for an unknown knob.
  std::string get(std::string_view knob) const { return detail::sysctl_get(*this, knob); }

  // ---- the workers --------------------------------------------------------------------------

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
  /// (the OOM path draining the queue with a budget). Blocking.
  drain_result drain(std::uint64_t max_pages) { return async_.drain(max_pages); }
  /// The freezer: parks the reaper between mms (exits keep queuing behind it). May block.
  void freeze() { async_.freeze(); }
  void thaw() { async_.thaw(); }
  /// Tears down the backlog and stops the reaper, then the swap-release worker; later exits
  /// tear down, and release swap, inline. May block.
  void stop() {
    async_.stop();
    swap_release_.stop();
  }
  /// stop() that waits at most `timeout` for both workers together: true iff both drained
  /// and were joined in time. Either way later exits tear down, and release swap, inline; false
  /// leaves the rest queued and counted (vmstat's pending_pages) for a later stop, flush or
  /// the destructor (async_teardown::shutdown_for).
  template <class Rep, class Period>
  bool stop_for(std::chrono::duration<Rep, Period> timeout) {
    using clock = std::chrono::steady_clock;
    const clock::time_point deadline = teardown::detail::deadline_after(timeout);
    const auto left = [&] {
      return deadline == clock::time_point::max() ? clock::duration::max()
                                                  : std::max(clock::duration::zero(), deadline - clock::now());
    };
    const bool mms = async_.stop_for(left());
    const bool swap = swap_release_.stop_for(left());
    return mms && swap;
  }
  [[deprecated("use stop()")]] void shutdown() { stop(); }
  template <class Rep, class Period>
  [[deprecated("use stop_for()")]] bool shutdown_for(std::chrono::duration<Rep, Period> timeout) {
    return stop_for(timeout);
  }
  bool stalled() const noexcept { return async_.stalled(); }

  // ---- statistics ---------------------------------------------------------------------------

  /// A snapshot (subsets are read before their supersets).
  teardown::model::vmstat vmstat() const noexcept {
    const async_teardown_stats s = async_.stats();
    return {.queued = s.queued,
            .sync = s.inline_total,
            .rejected = s.inline_rejected,
            .stalled = s.inline_stalled,
            .uncontended = s.inline_uncontended,
            .reaped = s.reaped,
            .drained = s.drained,
            .pending_pages = s.pending};
  }
  /// Everything counted, part by part (mm_system_stats says what each part holds).
  mm_system_stats stats() const noexcept {
    mm_system_stats s;
    s.vm = vmstat();
    s.reaper = async_.worker_stats();
    s.oom_reap = oom_.stats();
    s.oom_reaper = oom_.worker_stats();
    s.swap = swap_release_.stats();
    s.pending_high_water = pending_high_water();
    s.oom_kills = oom_kills();
    s.teardowns = teardowns();
    return s;
  }
  [[deprecated("use stats().reaper")]] reaper_stats reaper_statistics() const noexcept {
    return async_.worker_stats();
  }
  [[deprecated("use stats().oom_reap")]] oom_reap_stats oom_reap_statistics() const noexcept { return oom_.stats(); }
  [[deprecated("use stats().oom_reaper")]] reaper_stats oom_reaper_statistics() const noexcept {
    return oom_.worker_stats();
  }
  [[deprecated("use stats().swap")]] swap_release_stats swap_statistics() const noexcept {
    return swap_release_.stats();
  }
  /// The swap device (nullptr without one), for checks.
  const swap_space* swap_device() const noexcept { return swap_release_.device(); }

  /// The budget's high-water mark of pending pages.
  std::uint64_t pending_high_water() const noexcept { return async_.stats().high_water; }
  /// The trace domains (trace.hpp) of the mm_reaper's events (a pool's: one for all its workers)
  /// and of the swap-release worker's; distinct and nonzero. The oom_reaper emits no events.
  /// Wait-free.
  std::uint64_t trace_domain() const noexcept { return async_.trace_domain(); }
  std::uint64_t swap_release_trace_domain() const noexcept { return swap_release_.trace_domain(); }
  [[deprecated("use trace_domain()")]] std::uint64_t mm_reaper_trace_domain() const noexcept {
    return trace_domain();
  }
  std::uint64_t oom_kills() const noexcept { return oom_kills_.load(std::memory_order_relaxed); }
  /// Teardowns of any kind (exit path, inline mmput, reaper, drain).
  std::uint64_t teardowns() const noexcept { return teardowns_.load(std::memory_order_relaxed); }

 private:
  // True if this drop of mm_users was the last.
  static bool release_user(mm_struct& mm) noexcept {
    // The kernel's fully ordered atomic_dec_and_test: each put's release heads (or continues) the
    // release sequence that carries MMF_OOM_TARGETED, and the final put's acquire reads from it,
    // so the teardown sees every user's writes and the flag ("The model's OOM ordering").
    return mm.mm_users.put();
  }

  // __mmput: exit_aio (again: idempotent), exit_mmap, then the users' mm_count reference.
  void mmput_teardown(mm_struct& mm) noexcept {
    mm.aio.exit_aio();
    std::vector<std::uint32_t> swap;  // the mm's swap entries, released after the unmap
    {
      std::unique_lock lock(mm.mmap_lock);
      // An oom_reaper queued for this mm (or already walking it) races this teardown: then chunk
      // by chunk (oom_reaper.hpp). Otherwise one munmap under the lock, as always. The relaxed
      // flag is visible here for the reason MMF_OOM_TARGETED is; were it missed, the walk's
      // `started`, read under the lock, would still keep the two sides apart.
      if (mm.walk.started || test_flag(mm, MMF_OOM_REAP_QUEUED)) {
        oom_.exit_walk(mm, lock);
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
    swap_release_.release(swap);
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
    static_cast<task_link&>(*created).link_after(tasks_);
    return created;
  }

  // The swap release (swap.hpp): what it uses comes before it, so it stops before any of that
  // dies; it comes before the mm_reaper, which may still release swap while it drains at the end.
  swap_release swap_release_;

  std::atomic<std::uint64_t> next_id_{0};
  std::atomic<std::uint64_t> oom_kills_{0};
  std::atomic<std::uint64_t> teardowns_{0};
  mutable std::mutex tasklist_lock_;
  task_link tasks_;  // the live tasks' list head; guarded by tasklist_lock_

  // The OOM reaper (oom_reaper.hpp): what it reads comes before it, so it stops before any of
  // that dies.
  oom_reaper oom_;
  // Last: destroyed first, so the backlog is torn down while everything it uses is alive.
  async_teardown<mm_struct, &mm_struct::reap_node, mm_traits, Key, Workers> async_;
};

/// The kernel with the run-time toggle (vm.async_mm_teardown).
using mm_system = basic_mm_system<>;
/// The same with a pool of mm_reaper workers (mm_system_options::pool; the question whether
/// the mm_reaper should be a pool).
using pooled_mm_system = basic_mm_system<static_key, reaper_pool_workers>;

}  // namespace teardown::model
