// teardown/model/swap.hpp — the swap device and its release worker (part of model/mm.hpp), after
// the swap batch release series ("mm: tlb swap entries batch async release").
//
// An exiting task whose teardown runs on its own thread hands its swap entries, in page-sized
// batches (swap_batch), to the swap-release worker (an async_teardown of its own, nice 0),
// provided the toggle is on, at least min_exiting final exits run at once, and it holds
// cluster_max (SWAP_CLUSTER_MAX, 32) entries or more. Otherwise, and for every entry a failed
// batch allocation left out, the entries are released where the teardown runs. Each entry is
// released once: batched + inline_entries = the entries the teardowns took.
//
// Who may call what (swap_release is a part of basic_mm_system, which calls it)
//   swap_space::allocate          any thread; takes a lock (may block briefly); throws
//                                 std::length_error, taking nothing, when too few are free.
//   swap_space::free, getters     any thread; lock-free.
//   swap_release::release         the teardown of an mm, on any thread; never blocks.
//   final_exit_scope              the exit path, around a final exit's put (counts it).
//   enabled, set_enabled, min_exiting, set_min_exiting, set_allocator, stats, trace_domain
//                                 any thread; wait-free (set_min_exiting throws
//                                 std::invalid_argument for 0, changing nothing).
//   flush, stop, stop_for         any thread but the worker; may block.
//
// Memory ordering: the slot map and the counters are relaxed (a slot holds no data in the model,
// so freeing one publishes nothing), except `released`, a snapshot_count: added last after a
// batch's slots are freed, read first by stats(), so released <= batches.
// Design: docs/design.md, "model/mm.hpp: the kernel's composition, in user space".
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "teardown/async_teardown.hpp"
#include "teardown/llist.hpp"
#include "teardown/snapshot_count.hpp"

namespace teardown::model {

/// The swap device of the swap batch release series, as far as the model needs it: a use count
/// per slot (the kernel's swap_map), so that every release is checked. A slot freed twice is
/// counted, not wrapped. allocate takes a lock (may block briefly); free and the getters are
/// lock-free. Relaxed throughout: a slot holds no data in the model, so freeing one publishes
/// nothing.
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
/// series' GFP_ATOMIC | GFP_NOWAIT failing), and the exit path then releases inline.
struct swap_batch_allocator {
  void* (*allocate)(std::size_t bytes) noexcept;
  void (*deallocate)(void* memory) noexcept;
};

/// The default: operator new (nothrow) and operator delete.
inline constexpr swap_batch_allocator default_swap_batch_allocator{
    [](std::size_t bytes) noexcept { return ::operator new(bytes, std::nothrow); },
    [](void* memory) noexcept { ::operator delete(memory); }};

/// A page of swap entries gathered by an exiting task for the swap-release worker (the series'
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

/// What the swap release did (the swap batch release series), since the mm_system started.
struct swap_release_stats {
  std::uint64_t used = 0;             // swap slots in use now
  std::uint64_t double_frees = 0;     // slots freed while free: must stay 0
  std::uint64_t batched = 0;          // entries gathered into batches by exiting tasks
  std::uint64_t inline_entries = 0;   // entries released where the teardown ran
  std::uint64_t batches = 0;          // batches built
  std::uint64_t alloc_failures = 0;   // batch allocations that failed: the rest went inline
  std::uint64_t queued = 0;           // batches handed to the swap-release worker
  std::uint64_t sync = 0;             // batches put_chain tore down inline (toggle off, stopped)
  std::uint64_t released = 0;         // batches released, by the worker or inline; after a flush
                                      // with no exit running, released == batches
};

/// The swap device (if any) and its release worker: a part of basic_mm_system.
class swap_release {
  // The worker's composition: a batch costs its entries, and nothing else gates it (the exit
  // path decided before it gathered).
  struct batch_traits {
    swap_release* owner;
    std::uint64_t cost(const swap_batch& batch) const noexcept { return batch.count; }
    bool eligible(const swap_batch&, std::uint64_t) const noexcept { return true; }
    void prepare(swap_batch&) noexcept {}
    void destroy(swap_batch& batch) noexcept { owner->release_batch(batch); }
    std::uint64_t& charge(swap_batch& batch) noexcept { return batch.charge; }
  };

 public:
  /// Fewer swap entries than this are released where the teardown runs (SWAP_CLUSTER_MAX).
  static constexpr std::size_t cluster_max = 32;

  /// `slots` 0: no swap device. Throws std::invalid_argument for min_exiting 0, std::system_error
  /// if the worker cannot start.
  swap_release(std::size_t slots, bool async_release, std::uint32_t min_exiting)
      : device_(slots == 0 ? nullptr : std::make_unique<swap_space>(slots)),
        min_exiting_(validated_min_exiting(min_exiting)),
        worker_(async_teardown_options{.enabled = async_release, .reaper = {.name = "swap_release", .nice = 0}},
                batch_traits{this}) {}

  swap_release(const swap_release&) = delete;
  swap_release& operator=(const swap_release&) = delete;

  // Counts a final exit in flight, and marks this thread as on that exit's path, for its
  // lifetime. Only with a swap device: otherwise an exit pays nothing for it.
  class final_exit_scope {
   public:
    explicit final_exit_scope(swap_release& release) noexcept
        : release_(release.device_ ? &release : nullptr), outer_(exiting_here) {
      if (release_ == nullptr) return;
      release_->exiting_.fetch_add(1, std::memory_order_relaxed);
      exiting_here = release_;
    }
    final_exit_scope(const final_exit_scope&) = delete;
    final_exit_scope& operator=(const final_exit_scope&) = delete;
    ~final_exit_scope() {
      if (release_ == nullptr) return;
      exiting_here = outer_;
      release_->exiting_.fetch_sub(1, std::memory_order_relaxed);
    }

   private:
    swap_release* release_;
    const swap_release* outer_;
  };

  /// The swap device, or nullptr without one.
  swap_space* device() noexcept { return device_.get(); }
  const swap_space* device() const noexcept { return device_.get(); }

  bool enabled() const noexcept { return worker_.enabled(); }
  void set_enabled(bool on) { worker_.set_enabled(on); }
  std::uint32_t min_exiting() const noexcept { return min_exiting_.load(std::memory_order_relaxed); }
  /// Throws std::invalid_argument, changing nothing, for 0.
  void set_min_exiting(std::uint32_t exits) {
    min_exiting_.store(validated_min_exiting(exits), std::memory_order_relaxed);
  }
  /// The allocator must outlive this object: only its address is kept.
  void set_allocator(const swap_batch_allocator& allocator) noexcept {
    allocator_.store(&allocator, std::memory_order_relaxed);
  }

  /// Blocks until every batch queued before the call is released.
  void flush() { worker_.flush(); }
  /// Releases the backlog and stops the worker; later batches are released inline. May block.
  void stop() { worker_.stop(); }
  /// stop() that waits at most `timeout`: true iff the worker drained and was joined in time.
  template <class Rep, class Period>
  bool stop_for(std::chrono::duration<Rep, Period> timeout) {
    return worker_.stop_for(timeout);
  }
  std::uint64_t trace_domain() const noexcept { return worker_.trace_domain(); }

  /// A snapshot of the swap release (released before batches: released <= batches).
  swap_release_stats stats() const noexcept {
    const async_teardown_stats worker = worker_.stats();
    swap_release_stats s;
    // First: added after the batch's count (snapshot_count.hpp).
    s.released = counts_.released.read_first();
    s.batches = counts_.batches.load(std::memory_order_relaxed);
    s.batched = counts_.batched.load(std::memory_order_relaxed);
    s.inline_entries = counts_.inline_entries.load(std::memory_order_relaxed);
    s.alloc_failures = counts_.alloc_failures.load(std::memory_order_relaxed);
    s.queued = worker.queued;
    s.sync = worker.inline_total;
    if (device_) {
      s.used = device_->used();
      s.double_frees = device_->double_frees();
    }
    return s;
  }

  // The teardown's swap entries: in page-sized batches to the swap-release worker when the
  // series' conditions hold, else here. A batch that cannot be allocated ends the gathering; the
  // batches built so far are still queued and every entry not in one is released here, so
  // nothing is lost or released twice.
  void release(const std::vector<std::uint32_t>& slots) noexcept {
    if (slots.empty()) return;
    std::size_t at = 0;
    // Relaxed: the count is a load estimate, as the series' atomic_read of its exiting count.
    if (exiting_here == this && slots.size() >= cluster_max && worker_.enabled() &&
        exiting_.load(std::memory_order_relaxed) >= min_exiting_.load(std::memory_order_relaxed)) {
      const swap_batch_allocator& allocator = *allocator_.load(std::memory_order_relaxed);
      llist_chain<swap_batch, &swap_batch::hook> batches;
      while (at < slots.size()) {
        void* page = allocator.allocate(sizeof(swap_batch));
        if (page == nullptr) {
          counts_.alloc_failures.fetch_add(1, std::memory_order_relaxed);
          break;
        }
        auto* batch = new (page) swap_batch;
        batch->deallocate = allocator.deallocate;
        batch->count = static_cast<std::uint32_t>(std::min(swap_batch::capacity, slots.size() - at));
        std::copy_n(slots.begin() + static_cast<std::ptrdiff_t>(at), batch->count, batch->slots);
        at += batch->count;
        batches.push_back(*batch);  // O(1): the gathering order is the chain's
        counts_.batches.fetch_add(1, std::memory_order_relaxed);
      }
      counts_.batched.fetch_add(at, std::memory_order_relaxed);
      (void)worker_.put_chain(std::move(batches));  // queued, or released inline at once
    }
    for (std::size_t rest = at; rest < slots.size(); ++rest) device_->free(slots[rest]);
    counts_.inline_entries.fetch_add(slots.size() - at, std::memory_order_relaxed);
  }

 private:
  // On the swap-release worker (or inline): frees the batch's slots, then its page.
  void release_batch(swap_batch& batch) noexcept {
    for (std::uint32_t at = 0; at < batch.count; ++at) device_->free(batch.slots[at]);
    void (*deallocate)(void*) noexcept = batch.deallocate;
    batch.~swap_batch();
    deallocate(&batch);
    counts_.released.add_last();  // after the batch's slots and its count
  }

  static std::uint32_t validated_min_exiting(std::uint32_t exits) {
    if (exits == 0) throw std::invalid_argument("teardown::model: swap_min_exiting must be at least 1; unchanged");
    return exits;
  }

  // The swap release whose final exit this thread is running, if any: a teardown on the
  // mm_reaper, in drain() or in a plain mmput is not an exiting task's (the series'
  // task_is_dying()).
  static inline thread_local const swap_release* exiting_here = nullptr;

  // What the worker uses comes before it, so it stops before any of that dies.
  struct counters {  // relaxed, except released (see stats)
    std::atomic<std::uint64_t> batched{0}, inline_entries{0}, batches{0}, alloc_failures{0};
    snapshot_count released;
  };
  std::unique_ptr<swap_space> device_;
  counters counts_;
  std::atomic<std::uint32_t> min_exiting_;
  std::atomic<const swap_batch_allocator*> allocator_{&default_swap_batch_allocator};
  std::atomic<std::uint32_t> exiting_{0};  // final exits in flight (with a swap device only)
  async_teardown<swap_batch, &swap_batch::hook, batch_traits> worker_;
};

}  // namespace teardown::model
