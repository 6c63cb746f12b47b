// teardown/reaper_pool.hpp — several reaper workers over sharded queues, with work stealing.
//
// One reaper thread cannot keep up with a machine's worth of teardowns. A reaper_pool is N reaper workers, each
// with its own queue (a sharded_llist by default), its own name and its own CPUs, behind one enqueue / flush /
// freeze / stop interface. Everything a reaper promises holds per worker: each worker is a reaper<T, Hook, Fn,
// Queue>. Options and CPU placement: reaper_pool/options.hpp; stealing and the pool flush: reaper_pool/stealing.hpp.
//
//     auto reap = [](buffer& b) { delete &b; };                // void(T&); copied per worker
//     teardown::reaper_pool<buffer, &buffer::hook, decltype(reap)> pool(reap, {.workers = 4});
//     pool.enqueue(*b);                                        // to this thread's worker
//     pool.flush();                                            // every worker, every item so far
//
// Who may call what (the pool must outlive every call, enqueue included):
//   enqueue, enqueue_to, enqueue_chain  any thread, concurrently; lock-free. Syscalls as reaper::enqueue (one futex
//                                       wake when the add found the worker's queue empty and the worker asleep),
//                                       plus, with stealing on, at most one kick of a sibling (a futex wake if it
//                                       sleeps) when the add found a backlog older than steal_after. With
//                                       worker.poll_interval > 0: no syscall, no sibling kick. After stop(), and
//                                       in a fork child, fn runs inline on the caller. Async-signal-safe as
//                                       reaper::enqueue (the worker is the thread's shard index modulo N, taken
//                                       without a lock or an allocation). An item still queued aborts with a
//                                       message, as in reaper::enqueue. Every worker blocks signals as a reaper.
//   flush, flush_for                    any thread but a worker; may block. Every item enqueued before the call,
//                                       on any worker, is torn down when it returns (true).
//   freeze, thaw                        any thread but a worker; freeze may block until every worker is parked
//                                       between items, holding none. Nest like reaper's. thaw without a freeze
//                                       throws std::logic_error and changes nothing; a thaw must follow a
//                                       freeze() that returned (one racing its own freeze is a bug).
//   stop, stop_for                      any thread but a worker; may block (each worker drains, then joins).
//                                       Idempotent. stop and the destructor wait without limit; stop_for gives up
//                                       after a timeout, leaving the rest to the workers.
//   destructor                          stop(). From the pool's own callback (fn, or take/fn inside
//                                       reap_on_caller) it aborts with a message (see in_own_callback).
//   nice, set_nice                      any thread; reaper's, on every worker.
//   hurry                               any thread; reaper's, on every worker: lock-free, one futex wake per
//                                       sleeping worker at most.
//   request_after_batch                 any thread; reaper's, on the first worker only (one after_batch call).
//   reap_on_caller                      any thread but a worker; may block (runs teardowns): reaper's, on every
//                                       worker in turn; returns the sum.
//   stats, worker_stats, stalled        any thread; wait-free snapshots. worker_stats throws std::out_of_range
//                                       for an index >= worker_count().
//   worker_cpus, in_own_callback        any thread; wait-free. worker_cpus throws as worker_stats does.
//   fn                                  as for reaper, on every worker: copies of fn run at once on different
//                                       workers (and on callers after stop); on_error likewise. flush, freeze,
//                                       stop or reap_on_caller on the pool from fn (or from reap_on_caller's
//                                       take) throw std::logic_error.
//
// Memory ordering: as reaper's, per item: a producer's release add pairs with the acquire del_all of whichever
// worker takes the item, thief included; a put-back is a release add_batch after that acquire, and a held batch
// moves by exchanges on held_ (the holder's release replace_all, the taker's acquire del_all), so the next taker
// sees the producer's writes too. A link's item_started_ns, watching and idle (reaper/pool_link.hpp) carry no
// data: seq_cst only where "No lost watch" says, relaxed hints elsewhere. Pool control (steal_events_, freeze
// depth, exclusive flushes, stopping) lives under steal_mutex_; steal_refused_ is a relaxed hint of it,
// re-checked under the mutex before any steal. ready_ (release, at the end of the constructor; acquire in steal
// and watch) publishes workers_ to the workers; holding reads it relaxed, ordered after the
// constructor through the items it holds. Wakes of siblings use the reaper's kick: an RMW on the sibling's
// state word (no lost wake-up).
//
// Design: docs/design.md, "The reaper pool".
#pragma once

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "teardown/counter.hpp"
#include "teardown/llist.hpp"
#include "teardown/reaper.hpp"
#include "teardown/reaper_pool/options.hpp"
#include "teardown/sharded_llist.hpp"

namespace teardown {

template <class T, llist_node T::*Hook, class Fn, class Queue = sharded_llist<T, Hook>>
class reaper_pool final : private detail::fork_participant {
  static_assert(std::is_copy_constructible_v<Fn>, "reaper_pool: fn is copied into every worker");

  // The pool's own words, locks and clock: its queue's Sync policy, as its workers' (sync.hpp).
  using sync_ops = sync_of_t<Queue>;
  template <class W>
  using atomic = typename sync_ops::template atomic<W>;
  using mutex_type = typename sync_ops::mutex;
  using clock_type = typename sync_ops::clock;

 public:
  using worker_type = reaper<T, Hook, Fn, Queue>;
  static constexpr std::size_t max_workers = detail::reaper_pool_max_workers;

  /// Starts the workers. Throws std::invalid_argument, creating nothing, if opts.workers >
  /// max_workers, a CPU in opts.worker.cpus is outside [0, CPU_SETSIZE), steal_after < 0, or
  /// opts.worker is refused as a reaper's options are (reaper_options; named "worker.<field>");
  /// std::system_error if a thread cannot be created (the workers made so far are stopped).
  explicit reaper_pool(Fn fn, reaper_pool_options opts = {})
      : opts_(validated(std::move(opts))),
        cpus_(plan(opts_)),
        count_(cpus_.size()),
        steal_after_ns_(static_cast<std::uint64_t>(opts_.steal_after.count())),
        stealing_(opts_.steal && count_ > 1) {
    // Every link exists before the first worker starts (a worker's hooks read its siblings' links).
    for (std::size_t i = 0; stealing_ && i < count_; ++i) {
      auto& link = *links_.emplace_back(std::make_unique<link_type>());
      link.pool = this;
      link.index = i;
      link.steal = &reaper_pool::steal_entry;
      link.watch = &reaper_pool::watch_entry;
      link.holding = &reaper_pool::holding_entry;
    }
    workers_.reserve(count_);
    for (std::size_t i = 0; i < count_; ++i) {
      reaper_options worker = opts_.worker;
      worker.name = detail::pool_worker_name(opts_.worker.name, i);
      worker.cpus = cpus_[i];
      workers_.emplace_back(new worker_type(fn, std::move(worker), stealing_ ? links_[i].get() : nullptr));
    }
    detail::fork_registry::instance().add(this);
    const std::lock_guard lock(steal_mutex_);
    detail::data_written<sync_ops>(&workers_);  // complete (a schedule test checks its readers)
    // release: steal's acquire load then sees workers_ complete.
    ready_.store(true, std::memory_order_release);
    update_steal_hint_locked();
  }

  reaper_pool(const reaper_pool&) = delete;
  reaper_pool& operator=(const reaper_pool&) = delete;

  /// stop(), then the workers are destroyed. May block, without limit (stop_for bounds the
  /// wait first). Destroying the pool from its own callback (fn on one of its workers, or take
  /// or fn inside its reap_on_caller) would leave that callback on a freed pool: it writes why to
  /// stderr and aborts.
  ~reaper_pool() {
    if (on_a_worker()) {
      detail::fatal_misuse(
          "teardown::reaper_pool::~reaper_pool: the pool is destroyed from one of its own workers (from fn); the "
          "worker would go on using the freed pool. Destroy it from another thread.\n");
    }
    if (in_own_callback()) {
      detail::fatal_misuse(
          "teardown::reaper_pool::~reaper_pool: the pool is destroyed from take or fn inside its own "
          "reap_on_caller; the call would go on using the freed pool. Destroy it after reap_on_caller returns.\n");
    }
    stop();
    detail::fork_registry::instance().remove(this);
  }

  /// To this thread's worker (see "Placement"). Lock-free; see "Who may call what".
  void enqueue(T& item) noexcept { enqueue_to(this_thread_worker(), item); }

  /// To worker `worker` modulo worker_count(). Lock-free, as enqueue(). Aborts, with a message
  /// on stderr, for an item that is already queued (reaper::enqueue).
  void enqueue_to(std::size_t worker, T& item) noexcept {
    worker_type::abort_if_queued(item, "teardown::reaper_pool::enqueue");
    const std::size_t index = worker % count_;
    worker_type& target = *workers_[index];
    if (!stealing_) {
      target.enqueue(item);
      return;
    }
    const std::uint64_t since = target.template enqueue_item<true>(item);
    if (since != 0) wake_for_backlog(index, since);
  }

  /// reaper::enqueue_chain on this thread's worker: one CAS and at most one kick for the chain.
  void enqueue_chain(llist_chain<T, Hook>&& chain) noexcept {
    workers_[this_thread_worker()]->enqueue_chain(std::move(chain));
  }

  /// Blocks until every item enqueued (to any worker) before the call has been torn down.
  void flush() { (void)flush_until(clock_type::time_point::max()); }

  /// flush() with a time limit: true if the flush completed in time.
  template <class Rep, class Period>
  bool flush_for(std::chrono::duration<Rep, Period> timeout) {
    return flush_until(clock_type::now() + timeout);
  }

  /// Returns once every worker is parked between items (or gone), holding none: all that is
  /// not done is on the queues, where reap_on_caller reaches it. Steals stop first. Nests.
  void freeze() {
    refuse_on_workers("freeze");
    {
      const std::lock_guard lock(steal_mutex_);
      ++freeze_depth_;
      update_steal_hint_locked();
    }
    for (const auto& worker : workers_) worker->freeze();
  }

  /// Undoes one freeze() on every worker. Throws std::logic_error, changing nothing, when the
  /// pool is not frozen.
  void thaw() {
    {
      const std::lock_guard lock(steal_mutex_);
      if (freeze_depth_ == 0) throw std::logic_error("teardown::reaper_pool::thaw: the pool is not frozen");
      --freeze_depth_;
      update_steal_hint_locked();
    }
    for (const auto& worker : workers_) worker->thaw();
  }

  /// The workers' nice value (reaper::nice; they share one).
  int nice() const { return workers_.front()->nice(); }
  /// reaper::set_nice on every worker: true if every one applied it. Throws
  /// std::invalid_argument, changing nothing, outside [-20, 19].
  bool set_nice(int value) {
    bool applied = true;
    for (const auto& worker : workers_) applied = worker->set_nice(value) && applied;
    return applied;
  }

  /// reaper::hurry on every worker: the number of sleeping workers it woke.
  std::size_t hurry() noexcept {
    std::size_t woken = 0;
    for (const auto& worker : workers_) {
      if (worker->hurry()) ++woken;
    }
    return woken;
  }

  /// reaper::request_after_batch on the first worker: one after_batch call on a worker.
  void request_after_batch() noexcept { workers_.front()->request_after_batch(); }

  /// Stops stealing, then asks every worker to stop and waits for each: each drains its queue,
  /// then is joined. Afterwards enqueue runs fn inline. Idempotent. May block, without limit.
  void stop() {
    refuse_on_workers("stop");
    (void)stop_until(clock_type::time_point::max());
  }

  /// stop() that waits at most `timeout` in all: true iff every worker drained its queue and was
  /// joined in time. False leaves the pool stopping, as reaper::stop_for leaves a worker: the
  /// workers not yet joined go on with what is left (counted in stats().pending), enqueue
  /// queues to a worker until it begins its final drain and tears down inline after, and a
  /// later stop, stop_for, flush or the destructor finishes the job. Nothing is lost or torn
  /// down twice.
  template <class Rep, class Period>
  bool stop_for(std::chrono::duration<Rep, Period> timeout) {
    refuse_on_workers("stop_for");
    return stop_until(detail::deadline_after<clock_type>(timeout));
  }

  /// True when called from the pool's own callback: fn on one of its workers, or take or fn
  /// inside its reap_on_caller on this thread. Wait-free.
  bool in_own_callback() const noexcept {
    return std::any_of(workers_.begin(), workers_.end(), [](const auto& worker) { return worker->in_own_callback(); });
  }

  /// reaper::reap_on_caller on every worker in turn; returns how many were torn down here.
  /// If take throws, the workers not yet visited are left alone and the exception propagates.
  template <class Take>
  std::size_t reap_on_caller(Take&& take) {
    refuse_on_workers("reap_on_caller");
    std::size_t torn_down = 0;
    for (const auto& worker : workers_) torn_down += worker->reap_on_caller(take);
    return torn_down;
  }

  /// True if any worker is stalled (reaper::stalled).
  bool stalled() const noexcept {
    return std::any_of(workers_.begin(), workers_.end(), [](const auto& worker) { return worker->stalled(); });
  }

  /// The workers' stats added up (longest_wait_ns, poll_limit_ns: the longest; setup_warnings:
  /// OR; running, boosted: any). enqueued counts items where they were enqueued, reaped where they were torn down,
  /// so only the sums balance; pending is computed from the sums.
  reaper_stats stats() const noexcept {
    reaper_stats sum;
    for (const auto& worker : workers_) {
      const reaper_stats s = worker->stats();
      sum.enqueued += s.enqueued;
      sum.reaped += s.reaped;
      sum.errors += s.errors;
      sum.batches += s.batches;
      sum.inline_reaped += s.inline_reaped;
      sum.wakeups += s.wakeups;
      sum.worker_cpu_ns += s.worker_cpu_ns;
      sum.longest_wait_ns = std::max(sum.longest_wait_ns, s.longest_wait_ns);
      sum.setup_warnings |= s.setup_warnings;
      sum.running = sum.running || s.running;
      sum.stolen += s.stolen;
      sum.yields += s.yields;
      sum.polls += s.polls;
      sum.boosts += s.boosts;
      sum.boosts_refused += s.boosts_refused;
      sum.helped += s.helped;
      sum.boosted = sum.boosted || s.boosted;
      sum.hurries += s.hurries;
      sum.poll_limit_ns = std::max(sum.poll_limit_ns, s.poll_limit_ns);
    }
    sum.pending = sum.enqueued > sum.reaped ? sum.enqueued - sum.reaped : 0;
    return sum;
  }

  /// One worker's stats (its pending may read 0 while it ran more than was enqueued to it).
  reaper_stats worker_stats(std::size_t worker) const { return workers_.at(worker)->stats(); }

  std::size_t worker_count() const noexcept { return count_; }

  /// The CPUs worker `worker` was asked to prefer (empty: the reaper's default, the
  /// housekeeping CPUs). Whether the kernel agreed shows in its setup_warnings.
  const std::vector<int>& worker_cpus(std::size_t worker) const { return cpus_.at(worker); }

  /// The worker enqueue() on this thread goes to. Lock-free and async-signal-safe.
  std::size_t this_thread_worker() const noexcept {
    return count_ == 1 ? 0 : detail::this_thread_shard_index() % count_;
  }

 private:
  // reaper's pool_link, named without instantiating reaper (reaper_pool<...>::max_workers must not).
  using link_type = detail::pool_worker_link<T, Hook, sync_of_t<Queue>>;

  static constexpr int optimistic_rounds = 2;  // flush rounds that let steals go on
  static constexpr std::uint64_t min_watch_ns = 1'000'000;  // a watching sleep's least length

  static reaper_pool_options validated(reaper_pool_options opts) {
    if (opts.workers > max_workers) {
      throw std::invalid_argument("teardown::reaper_pool: workers must be at most " + std::to_string(max_workers) +
                                  ", got " + std::to_string(opts.workers));
    }
    for (int cpu : opts.worker.cpus) {
      if (cpu < 0 || cpu >= CPU_SETSIZE) {
        throw std::invalid_argument("teardown::reaper_pool: CPU " + std::to_string(cpu) + " is outside [0, " +
                                    std::to_string(CPU_SETSIZE) + ")");
      }
    }
    if (opts.steal_after.count() < 0) throw std::invalid_argument("teardown::reaper_pool: steal_after is negative");
    if (opts.worker.driven) {
      throw std::invalid_argument("teardown::reaper_pool: worker.driven: a pool's workers are threads (drive a lone "
                                  "reaper instead)");
    }
    opts.worker = detail::validated_reaper_options(std::move(opts.worker), "teardown::reaper_pool", "worker.");
    return opts;
  }

  static std::vector<std::vector<int>> plan(const reaper_pool_options& opts) {
    std::vector<int> base = opts.worker.cpus;
    if (base.empty()) {
      try {
        base = detail::housekeeping_cpus();
      } catch (const std::bad_alloc&) {
        throw;
      } catch (...) {  // unreadable or malformed sysfs: the reapers' own default
        base.clear();
      }
    }
    std::sort(base.begin(), base.end());
    base.erase(std::unique(base.begin(), base.end()), base.end());
    std::vector<std::vector<int>> nodes;
    if (opts.workers == 0) nodes = detail::numa_node_cpus();
    return detail::plan_worker_cpus(opts.workers, nodes, base);
  }

  // Every worker is asked before any is waited for, so they drain side by side; a worker that
  // ended is joined even after the deadline has passed for an earlier one.
  bool stop_until(typename clock_type::time_point deadline) {
    {
      const std::lock_guard lock(steal_mutex_);
      stopping_ = true;
      update_steal_hint_locked();
    }
    for (const auto& worker : workers_) worker->request_stop();
    bool all = true;
    for (const auto& worker : workers_) all = worker->await_stop(deadline) && all;
    return all;
  }

  bool flush_until(typename clock_type::time_point deadline);

  // ---- the workers' hooks (on a worker thread) ------------------------------------------------

  static llist_batch<T, Hook> steal_entry(void* pool, std::size_t thief, std::size_t& taken) noexcept {
    return static_cast<reaper_pool*>(pool)->steal(thief, taken);
  }

  static std::uint64_t watch_entry(void* pool, std::size_t watcher) noexcept {
    return static_cast<reaper_pool*>(pool)->watch(watcher);
  }

  static void holding_entry(void* pool, std::size_t holder) noexcept {
    static_cast<reaper_pool*>(pool)->holding(holder);
  }

  // The thief's own queue is empty: the older half of the oldest sibling backlog, if any; else
  // the front half of the rest of the batch a sibling has run one item of for steal_after.
  llist_batch<T, Hook> steal(std::size_t thief, std::size_t& taken) noexcept;

  llist_batch<T, Hook> steal_queued(std::size_t thief, std::size_t& taken) noexcept;

  // A chain as a batch in the chain's order (front first), through a private list.
  static llist_batch<T, Hook> as_batch(llist_chain<T, Hook>&& chain) noexcept;

  // The held rest of the batch of the sibling whose item has run longest, if at least
  // steal_after: the thief takes the front half (rounded up: what the victim would have run
  // next), the other half goes on the victim's queue, where the victim (or another thief) finds
  // it. Under steal_mutex_, as a queue steal: it moves items between workers.
  llist_batch<T, Hook> steal_held(std::size_t thief, std::size_t& taken) noexcept;

  // Before worker `watcher` sleeps (see "No lost watch"): no_watch if no sibling holds a
  // batch; else how long until the longest-running held item reaches steal_after (0: steal
  // now), at least min_watch_ns while steals are refused or the holder's item is young.
  std::uint64_t watch(std::size_t watcher) noexcept;

  // Worker `holder` has just put the rest of a new batch in held_: wake every idle sibling
  // that sleeps without a limit (see "No lost watch").
  void holding(std::size_t holder) noexcept;

  // ---- waking siblings ------------------------------------------------------------------------

  // A producer's add found worker `index`'s queue non-empty since `since`.
  void wake_for_backlog(std::size_t index, std::uint64_t since) noexcept;

  // Relaxed snapshots (hints). Idle: its last pass found nothing to run, at home or at a
  // sibling, and no kick is pending: it spins or sleeps. Unkicked: no kick pending (idle, or
  // busy with a batch).
  bool idle(std::size_t worker) const noexcept {
    return links_[worker]->idle.load(std::memory_order_relaxed) && unkicked(*workers_[worker]);
  }
  static bool unkicked(const worker_type& worker) noexcept {
    return (worker.state_.load(std::memory_order_relaxed) & (worker_type::kicked_bit | worker_type::stopped_bit)) == 0;
  }

  // Kicks up to `most` siblings of worker `from` (nearest after it first) with the reaper's
  // kick, an RMW that no sleep can miss: a sleeping one wakes, a spinning one will not sleep;
  // either makes another pass, finds its queue empty and steals. Idle ones first, then busy
  // ones not yet kicked: the kick makes a busy sibling look for work to steal once more before
  // it next sleeps, which closes the window between its last steal attempt and its sleep.
  std::size_t wake_idle_siblings(std::size_t from, std::size_t most) noexcept;

  // ---- control ---------------------------------------------------------------------------------

  bool steals_refused_locked() const noexcept {
    return !stealing_ || !ready_.load(std::memory_order_relaxed) || stopping_ || freeze_depth_ > 0 ||
           exclusive_flushes_ > 0;
  }

  void update_steal_hint_locked() noexcept { steal_refused_.store(steals_refused_locked(), std::memory_order_relaxed); }

  bool on_a_worker() const noexcept {
    return std::any_of(workers_.begin(), workers_.end(), [](const auto& worker) { return worker->on_worker(); });
  }

  void refuse_on_workers(const char* operation) const {
    for (const auto& worker : workers_) {
      if (worker->on_worker() || worker_type::reaping_here::contains(worker.get())) {
        throw std::logic_error(std::string("teardown::reaper_pool::") + operation +
                               ": called from one of the pool's workers (fn) or from reap_on_caller; it would "
                               "wait for itself");
      }
    }
  }

  // ---- fork ---------------------------------------------------------------------------------

  void fork_prepare() noexcept override {}
  void fork_parent() noexcept override {}
  void fork_child() noexcept override {
    // Single-threaded here. A thread that held steal_mutex_ for a moment does not exist in the
    // child; nor do the workers. Start the mutex over (as reaper does its condition variable).
    new (&steal_mutex_) mutex_type;
    freeze_depth_ = 0;
    exclusive_flushes_ = 0;
    stopping_ = true;
    steal_refused_.store(true, std::memory_order_relaxed);
  }

  // Read-only after construction.
  const reaper_pool_options opts_;
  const std::vector<std::vector<int>> cpus_;  // each worker's CPU preference
  const std::size_t count_;
  const std::uint64_t steal_after_ns_;
  const bool stealing_;  // opts_.steal and more than one worker
  atomic<bool> ready_{false};

  // Guarded by steal_mutex_ (see "Flush with stealing").
  mutex_type steal_mutex_;
  std::uint64_t steal_events_ = 0;       // steals that moved items
  std::uint64_t freeze_depth_ = 0;       // pool freezes not yet thawed
  std::uint64_t exclusive_flushes_ = 0;  // flushes in their steal-free round
  bool stopping_ = false;
  atomic<bool> steal_refused_{true};  // written under steal_mutex_; read as a hint

  // Each stealing worker's link (reaper/pool_link.hpp); empty when the pool does not steal. Written before the
  // first worker starts; outlives the workers.
  std::vector<std::unique_ptr<link_type>> links_;
  // Last: destroyed first, while what their hooks use still exists.
  std::vector<std::unique_ptr<worker_type>> workers_;
};

}  // namespace teardown

#include "teardown/reaper_pool/stealing.hpp"
