// teardown/reaper_pool.hpp — several reaper workers over sharded queues, with work stealing.
//
// RFC open question 2: one reaper, one per NUMA node, or a pool? The seed's single mm_reaper
// drained about 25 GB/s while 32 concurrent inline exits reached about 101 GB/s: one thread
// cannot keep up with a machine's worth of teardowns. A reaper_pool is N reaper workers, each
// with its own queue (a sharded_llist by default), its own name and its own CPUs, behind one
// enqueue/flush/freeze/stop interface. Everything a reaper promises (no lost wake-up, fn's
// errors counted and handed to on_error, freeze handing back a batch, stop draining, fork
// safety) holds per worker, because each worker is a reaper<T, Hook, Fn, Queue>.
//
//     auto reap = [](buffer& b) { delete &b; };                // void(T&); copied per worker
//     teardown::reaper_pool<buffer, &buffer::hook, decltype(reap)> pool(reap, {.workers = 4});
//     pool.enqueue(*b);                                        // to this thread's worker
//     pool.flush();                                            // every worker, every item so far
//
// Who may call what (the pool must outlive every call, enqueue included)
//   enqueue, enqueue_to,  any thread, concurrently. Lock-free. Syscalls as reaper::enqueue (one
//   enqueue_chain         futex wake when the add found the worker's queue empty and the worker
//                         asleep), plus, with stealing on, at most one kick of a sibling (a futex
//                         wake if it sleeps) when the add found a backlog older than steal_after.
//                         With worker.poll_interval > 0: no syscall, no sibling kick (reaper.hpp,
//                         "Wake policy"; the siblings find the backlog when they next look).
//                         After stop(), and in a fork child, fn runs inline on the caller.
//                         Async-signal-safe as reaper::enqueue (while the workers run; then as
//                         safe as fn): the worker is the thread's shard index modulo N, taken
//                         without a lock or an allocation, and a backlog's kick is an RMW and
//                         at most a futex wake. Every worker blocks signals as a reaper does.
//                         An item still queued aborts with a message, as in reaper::enqueue.
//   flush, flush_for      any thread but a worker; may block. Every item enqueued before the
//                         call, on any worker, is torn down when it returns (true).
//   freeze, thaw          any thread but a worker; freeze may block until every worker is parked
//                         between items, holding none. Nest like reaper's. thaw without a
//                         freeze throws std::logic_error and changes nothing; a thaw must
//                         follow a freeze() that returned (one racing its own freeze is a bug).
//   stop, stop_for        any thread but a worker; may block (each worker drains, then joins).
//                         Idempotent. stop and the destructor wait without limit; stop_for
//                         gives up after a timeout, leaving the rest to the workers.
//   destructor            stop(). From the pool's own callback (fn, or take/fn inside
//                         reap_on_caller) it aborts with a message (see in_own_callback).
//   nice, set_nice        any thread; reaper's, on every worker.
//   hurry                 any thread; reaper's, on every worker: lock-free, one futex wake per
//                         sleeping worker at most.
//   reap_on_caller        any thread but a worker; may block (runs teardowns): reaper's, on
//                         every worker in turn; returns the sum.
//   stats, worker_stats,  any thread; wait-free snapshots (worker_stats and worker_cpus throw
//   stalled, worker_cpus, std::out_of_range for an index >= worker_count()).
//   in_own_callback
//   fn                    as for reaper, on every worker: copies of fn run at once on different
//                         workers (and on callers after stop); on_error likewise. Calling
//                         flush, freeze, stop or reap_on_caller on the pool from fn (or from
//                         reap_on_caller's take) is refused with std::logic_error.
//
// Placement. enqueue goes to worker (this thread's index modulo N), the index counter.hpp's
// detail::this_thread_shard_index() hands out: stable for a thread's life and the lowest no
// live thread holds, so live threads have distinct indices and N producers alive at once
// spread over the workers round-robin (threads that took an index for another reason, such as
// a pool worker that re-queued items, hold places in that rotation). It is the index
// sharded_llist uses for its shard too, so two producers on one worker share a head only when
// more than K (its shard count) threads are alive: the spread of one K-shard queue. It is taken
// once per thread, lock-free. enqueue_to(i, item) picks worker i instead.
//
// Affinity. workers = 0 makes one worker per NUMA node that has an allowed housekeeping CPU
// (online, not isolated or nohz_full, in this process's mask), each preferring its node's
// CPUs; a machine with one node gets one worker. workers = N splits those CPUs into N
// contiguous groups in CPU-number order (with more workers than CPUs, worker i gets CPU
// i mod C). worker.cpus, when given, replaces the housekeeping CPUs as the set to split. Node
// CPUs are read from /sys/devices/system/node/online and nodeN/cpulist: the same files libnuma's
// numa_node_to_cpus() reads. Linking libnuma would buy nothing more (a worker frees memory, it
// does not allocate, so no memory policy is needed) and would force every consumer of this
// header-only INTERFACE target to find and link it; without sysfs the pool has one worker.
//
// Stealing (steal = true, N > 1). Each worker is a reaper with three hooks into the pool
// (reaper.hpp, "In a pool"):
// - steal: a worker whose own queue is empty, before it spins and sleeps, takes the older half
//   (rounded up) of the queue of the sibling whose backlog is oldest; the newer half goes back
//   on the victim's queue (with a kick if that made it non-empty). If no sibling has a queue, it
//   takes the front half (rounded up: what the victim would run next) of the held rest of the
//   batch of the sibling whose item has run longest, once that item has run steal_after; the
//   other half goes on the victim's queue. Stolen items run on the thief.
// - holding: a worker running one item of a batch keeps the rest in its held_ list (one
//   exchange puts it there, one takes it back after the item), so a slow or blocked item holds
//   nothing hostage. When it first does so for a batch, it kicks every idle sibling that sleeps
//   without a time limit.
// - watch: a worker about to sleep while a sibling holds a batch sleeps no longer than until
//   that sibling's item has run steal_after (at least 1 ms), then looks again (steal). So the
//   rest of a batch behind an item that blocks reaches an idle sibling within about steal_after.
// - a producer whose add found a backlog older than steal_after (CLOCK_MONOTONIC_COARSE: a
//   scheduler tick's granularity) kicks one sibling: an idle one if any, else a busy one not
//   yet kicked, which then looks for work to steal before it next sleeps. steal_after = 0 makes
//   both immediate.
// A thief that took part of a queue or of a held batch and left the rest kicks one more sibling
// the same way, so a burst spreads over idle workers in a few steps. Steals are refused while
// the pool is frozen, stopping, or in the last round of a flush (below). The item a worker is
// running is never taken from it. Order: each worker drains oldest first, but the pool keeps no
// order between items (a steal or a put-back can overtake items added meanwhile, and the items
// behind a slow one run before it ends).
//
// No lost watch. A sibling that sleeps without a limit must not miss a batch put in held_. Both
// sides use seq_cst, so their operations fall in one total order: the holder stores its
// batch's first item_started_ns_, then loads each sibling's watching_ and idle_ (and kicks one
// that reads idle and not watching); a worker going to sleep stores idle_ = true (when it went
// idle), then watching_ = false, then loads every sibling's item_started_ns_ (and sleeps
// without a limit only if all read 0). Either the holder's store comes first, and the sleeper's
// load sees it, or the sleeper's stores come first, and the holder reads idle and not watching
// (or a later value: the sibling went busy, or watched again, and looks again before it
// sleeps) and kicks it, an RMW on its state word that no sleep misses (reaper.hpp). A watching
// sibling needs no kick: it looks again when its limit ends.
//
// Flush with stealing. A pool flush asks every worker for a flush ticket, then waits for all of
// them (one "round"). A worker's ticket completes only after a pass over its queue that began
// after the request and took everything (reaper.hpp); so it covers every item that, at the
// request, was in that worker's queue, in its hands, or in a reap_on_caller on it, as long as
// nothing moves the item to another worker meanwhile. Only a steal moves items between workers,
// from a queue or from a held batch (the victim's pass then ends without the items it lost,
// and its ticket may complete: the steal is what the round must notice). So: a steal
// happens entirely under steal_mutex_ (pick the items, del_all, put the rest back) and
// increments steal_events_ there; a round reads steal_events_ under the mutex before it asks for
// tickets and after every ticket completed. If no steal happened in between, every item
// enqueued before the flush was, at the first read, in some worker's queue or hands (or done)
// and stayed with that worker, whose ticket covers it: the round proves the flush. A steal
// before the first read happened before the tickets were asked for: the thief runs a stolen
// batch in the same pass as the steal, before any ticket requested after it completes, and
// the put-back half is on the victim's queue. A steal after the last read cannot take such an
// item: that item's worker took it in a pass that happened before the read. If a steal did
// happen in between, the round proves nothing and another round follows (items move at most
// once per steal, and the next round's tickets are asked for after it). After two such rounds
// the third is exclusive: steals are refused until it ends, so it proves the flush on its own
// and the flush always ends, even while producers and thieves keep going. Why not refuse steals
// during every flush: a flush right after a burst (drain everything now) is the common case,
// and the burst would then be drained with no help; here it is drained under the first round,
// with stealing, and the later rounds find the workers idle.
//
// Memory ordering: as reaper's, per item: a producer's release add pairs with the acquire
// del_all of whichever worker takes the item, thief included; a put-back is a release add_batch
// after that acquire, and a held batch moves by exchanges on held_ (the holder's release
// replace_all, the taker's acquire del_all), so the next taker sees the producer's writes too.
// item_started_ns_, watching_ and idle_ carry no data: seq_cst only where "No lost watch" says,
// relaxed hints elsewhere. Pool control
// (steal_events_, freeze depth, exclusive flushes, stopping) lives under steal_mutex_;
// steal_refused_ is a relaxed hint of it, re-checked under the mutex before any steal. ready_
// (release, at the end of the constructor; acquire in the hooks) publishes workers_ to the
// workers, which may start stealing before the last sibling exists otherwise. Wakes of siblings
// use the reaper's kick: an RMW on the sibling's state word (no lost wake-up as in reaper.hpp).
//
// Fork: every worker handles fork() itself (reaper.hpp, "Fork": by default fork() waits for no
// worker, and each child reaper forgets what its worker had taken, held rest included; with
// worker.on_fork = wait_for_item the workers park across the fork and the child tears that down
// too). steal_mutex_ is held only for a few list operations, never across fn or a wait, and
// never by a parked worker (workers park only between items or at the top of a pass, outside a
// steal). Another thread, or a running worker, may hold it for a moment when fork() runs; so the
// pool, a fork participant too, gives the child a fresh unlocked mutex and clears the freeze
// depth (as the child's reapers do), and marks itself stopping: the child has no workers to
// steal. No handler, the pool's or a worker's, reads an item, so fork() costs no time per queued
// or held item.
#pragma once

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "teardown/counter.hpp"
#include "teardown/llist.hpp"
#include "teardown/reaper.hpp"
#include "teardown/sharded_llist.hpp"

namespace teardown {

struct reaper_pool_options {
  std::size_t workers = 0;  // 0: one per NUMA node (see "Affinity"); at most reaper_pool's max_workers
  bool steal = true;        // idle workers take queued items from busy ones (see "Stealing")
  std::chrono::nanoseconds steal_after = std::chrono::milliseconds(1);  // how slow an item, or
                            // how old a backlog, before idle siblings are woken to steal it
  reaper_options worker{};  // every worker's options; name gets "-<i>" (cut to keep 15
                            // characters); cpus, if given, is the set the workers are spread over
};

namespace detail {

inline constexpr std::size_t reaper_pool_max_workers = 1024;

// The CPUs of each NUMA node that has any, in node order, from sysfs (the files libnuma
// reads); empty when the files are missing or unreadable.
inline std::vector<std::vector<int>> numa_node_cpus(const std::string& root = "/sys/devices/system/node") {
  std::vector<std::vector<int>> nodes;
  try {
    for (int node : parse_cpu_list(read_first_line((root + "/online").c_str()))) {
      const std::string list = root + "/node" + std::to_string(node) + "/cpulist";
      const std::set<int> cpus = parse_cpu_list(read_first_line(list.c_str()));
      if (!cpus.empty()) nodes.emplace_back(cpus.begin(), cpus.end());
    }
  } catch (const std::bad_alloc&) {
    throw;
  } catch (...) {  // a malformed list: as if there were no NUMA information
    nodes.clear();
  }
  return nodes;
}

// `cpus` (sorted) in n contiguous groups of nearly equal size; with more groups than CPUs,
// group i gets CPU i mod C. No CPUs: n empty groups (each worker then keeps the reaper's default).
inline std::vector<std::vector<int>> split_cpus(const std::vector<int>& cpus, std::size_t n) {
  std::vector<std::vector<int>> groups(n);
  const std::size_t c = cpus.size();
  if (c == 0) return groups;
  for (std::size_t i = 0; i < n; ++i) {
    if (n > c) {
      groups[i].push_back(cpus[i % c]);
    } else {
      groups[i].assign(cpus.begin() + static_cast<std::ptrdiff_t>(i * c / n),
                       cpus.begin() + static_cast<std::ptrdiff_t>((i + 1) * c / n));
    }
  }
  return groups;
}

// Each worker's CPU preference (see "Affinity"); its size is the number of workers.
// `nodes` is numa_node_cpus(), `base` the CPUs to place workers on (empty: unknown).
inline std::vector<std::vector<int>> plan_worker_cpus(std::size_t workers, const std::vector<std::vector<int>>& nodes,
                                                      const std::vector<int>& base) {
  if (workers != 0) return split_cpus(base, workers);
  std::vector<std::vector<int>> groups;
  for (const std::vector<int>& node : nodes) {
    std::vector<int> usable;
    for (int cpu : node) {
      if (base.empty() || std::binary_search(base.begin(), base.end(), cpu)) usable.push_back(cpu);
    }
    if (!usable.empty()) groups.push_back(std::move(usable));
  }
  if (groups.empty()) groups.push_back(base);  // no NUMA information: one worker
  return groups;
}

// "name-i", the name cut so that the suffix survives Linux's 15 characters.
inline std::string pool_worker_name(const std::string& name, std::size_t index) {
  const std::string suffix = "-" + std::to_string(index);
  return name.substr(0, 15 > suffix.size() ? 15 - suffix.size() : 0) + suffix;
}

}  // namespace detail

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
    workers_.reserve(count_);
    for (std::size_t i = 0; i < count_; ++i) {
      reaper_options worker = opts_.worker;
      worker.name = detail::pool_worker_name(opts_.worker.name, i);
      worker.cpus = cpus_[i];
      typename worker_type::pool_link link;
      if (stealing_) {
        link.pool = this;
        link.index = i;
        link.steal = &reaper_pool::steal_entry;
        link.watch = &reaper_pool::watch_entry;
        link.holding = &reaper_pool::holding_entry;
      }
      workers_.emplace_back(new worker_type(fn, std::move(worker), link));
    }
    detail::fork_registry::instance().add(this);
    const std::lock_guard lock(steal_mutex_);
    // release: the hooks' acquire loads then see workers_ complete.
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

  bool flush_until(typename clock_type::time_point deadline) {
    refuse_on_workers("flush");
    std::vector<std::uint64_t> tickets(count_);
    std::uint64_t seen = 0;
    {
      const std::lock_guard lock(steal_mutex_);
      seen = steal_events_;
    }
    // Ends the exclusive round however the flush leaves.
    struct exclusive_round {
      reaper_pool* pool = nullptr;
      ~exclusive_round() {
        if (pool == nullptr) return;
        const std::lock_guard lock(pool->steal_mutex_);
        --pool->exclusive_flushes_;
        pool->update_steal_hint_locked();
      }
    } exclusive;
    for (int round = 0;; ++round) {
      if (round == optimistic_rounds) {
        const std::lock_guard lock(steal_mutex_);
        ++exclusive_flushes_;
        update_steal_hint_locked();
        exclusive.pool = this;
      }
      // Ask every worker before waiting for any: the workers drain side by side.
      for (std::size_t i = 0; i < count_; ++i) tickets[i] = workers_[i]->request_flush();
      for (std::size_t i = 0; i < count_; ++i) {
        if (!workers_[i]->await_flush(tickets[i], deadline)) return false;
      }
      if (exclusive.pool != nullptr) return true;  // no steal could happen during this round
      const std::lock_guard lock(steal_mutex_);
      if (steal_events_ == seen) return true;  // no item changed worker during this round
      seen = steal_events_;
    }
  }

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
  llist_batch<T, Hook> steal(std::size_t thief, std::size_t& taken) noexcept {
    taken = 0;
    // acquire: pairs with the constructor's release; workers_ is complete.
    if (!ready_.load(std::memory_order_acquire) || steal_refused_.load(std::memory_order_relaxed)) return {};
    llist_batch<T, Hook> batch = steal_queued(thief, taken);
    if (batch.empty()) batch = steal_held(thief, taken);
    return batch;
  }

  llist_batch<T, Hook> steal_queued(std::size_t thief, std::size_t& taken) noexcept {
    // The victim: the non-empty queue whose backlog started first; one without a start time
    // (its worker cleared it when it took a batch) only when none has one. Snapshots: a
    // victim may have emptied meanwhile, and then there is nothing to take.
    std::size_t victim = count_;
    std::uint64_t oldest = std::numeric_limits<std::uint64_t>::max();
    for (std::size_t k = 1; k < count_; ++k) {
      const std::size_t j = (thief + k) % count_;
      const std::uint64_t since = workers_[j]->oldest_enqueue_ns_.load(std::memory_order_relaxed);
      const std::uint64_t key = since != 0 ? since : std::numeric_limits<std::uint64_t>::max();
      if ((victim == count_ || key < oldest) && !workers_[j]->queue_.empty()) {
        victim = j;
        oldest = key;
      }
    }
    if (victim == count_) return {};
    worker_type& from = *workers_[victim];
    std::unique_lock lock(steal_mutex_);
    if (steals_refused_locked()) return {};
    // In the thief's run order (see reaper.hpp's take_from_queue): oldest first in one walk
    // where the queue has a take for it.
    const bool oldest_first = opts_.worker.order == drain_order::oldest_first;
    llist_batch<T, Hook> batch = detail::take_queue<T, Hook>(from.queue_, /*sweep=*/false, oldest_first);
    if (batch.empty()) return batch;
    ++steal_events_;  // see "Flush with stealing": under the mutex, with the del_all and put-back
    const std::size_t size = batch.size();
    taken = size - size / 2;
    llist_chain<T, Hook> rest;  // the newer half stays with the victim; front = newest
    if (!oldest_first) {
      for (std::size_t i = 0; i < size / 2; ++i) rest.push_back(*batch.pop_front());
    }
    llist_chain<T, Hook> mine;  // oldest first: the older half, in run order
    if (oldest_first) {
      for (std::size_t i = 0; i < taken; ++i) mine.push_back(*batch.pop_front());
      while (T* item = batch.pop_front()) rest.push_front(*item);
    }
    const bool left_some = !rest.empty();
    // Back on the victim's queue; a kick if it had emptied, as for a first enqueue. The victim
    // cannot be stopped here: steals end (under this mutex) before the pool stops a worker.
    if (from.queue_.add_batch(std::move(rest))) from.kick_after_first_add();
    lock.unlock();
    if (left_some) (void)wake_idle_siblings(thief, 1);
    if (!oldest_first) return batch;  // the older half, newest first: run order
    return as_batch(std::move(mine));
  }

  // A chain as a batch in the chain's order (front first), through a private list.
  static llist_batch<T, Hook> as_batch(llist_chain<T, Hook>&& chain) noexcept {
    llist<T, Hook> shape;  // private to this call: no other thread sees it
    (void)shape.add_batch(std::move(chain));
    return shape.del_all();
  }

  // The held rest of the batch of the sibling whose item has run longest, if at least
  // steal_after: the thief takes the front half (rounded up: what the victim would have run
  // next), the other half goes on the victim's queue, where the victim (or another thief) finds
  // it. Under steal_mutex_, as a queue steal: it moves items between workers.
  llist_batch<T, Hook> steal_held(std::size_t thief, std::size_t& taken) noexcept {
    const std::uint64_t now = sync_ops::now_ns();
    std::size_t victim = count_;
    std::uint64_t earliest = std::numeric_limits<std::uint64_t>::max();
    for (std::size_t k = 1; k < count_; ++k) {
      const std::size_t j = (thief + k) % count_;
      const std::uint64_t started = workers_[j]->item_started_ns_.load(std::memory_order_relaxed);
      if (started == 0 || started >= earliest || now - std::min(now, started) < steal_after_ns_) continue;
      if (workers_[j]->held_.empty()) continue;
      victim = j;
      earliest = started;
    }
    if (victim == count_) return {};
    worker_type& from = *workers_[victim];
    std::unique_lock lock(steal_mutex_);
    if (steals_refused_locked()) return {};
    llist_batch<T, Hook> held = from.held_.del_all();  // run order; acquire: pairs with the victim's replace_all
    if (held.empty()) return held;  // the victim took it back
    ++steal_events_;  // see "Flush with stealing"
    const std::size_t size = held.size();
    const bool oldest_first = opts_.worker.order == drain_order::oldest_first;
    llist_chain<T, Hook> mine;  // in run order, as the thief runs it
    llist_chain<T, Hook> rest;  // front = newest, as on a queue
    taken = size - size / 2;
    for (std::size_t i = 0; i < size; ++i) {
      T& item = *held.pop_front();
      if (i < taken) {
        mine.push_back(item);
      } else if (oldest_first) {
        rest.push_front(item);  // run order is oldest first
      } else {
        rest.push_back(item);  // run order is newest first
      }
    }
    const bool left_some = !rest.empty();
    if (from.queue_.add_batch(std::move(rest))) from.kick_after_first_add();  // not stopped: as in steal_queued
    lock.unlock();
    if (left_some) (void)wake_idle_siblings(thief, 1);
    return as_batch(std::move(mine));
  }

  // Before worker `watcher` sleeps (see "No lost watch"): no_watch if no sibling holds a
  // batch; else how long until the longest-running held item reaches steal_after (0: steal
  // now), at least min_watch_ns while steals are refused or the holder's item is young.
  std::uint64_t watch(std::size_t watcher) noexcept {
    // acquire: as in steal().
    if (!ready_.load(std::memory_order_acquire)) return worker_type::no_watch;
    worker_type& self = *workers_[watcher];
    // seq_cst: pairs with holding()'s load of watching_ (see "No lost watch").
    self.watching_.store(false, std::memory_order_seq_cst);
    std::uint64_t earliest = 0;
    bool stealable = false;
    for (std::size_t k = 1; k < count_; ++k) {
      const worker_type& sibling = *workers_[(watcher + k) % count_];
      // seq_cst: pairs with the holder's first item_started_ns_ store of a batch.
      const std::uint64_t started = sibling.item_started_ns_.load(std::memory_order_seq_cst);
      if (started == 0) continue;
      if (earliest == 0 || started < earliest) earliest = started;
      if (!sibling.held_.empty()) stealable = true;
    }
    if (earliest == 0) return worker_type::no_watch;
    self.watching_.store(true, std::memory_order_seq_cst);  // seq_cst: as above
    if (steal_refused_.load(std::memory_order_relaxed)) return min_watch_ns;
    const std::uint64_t now = sync_ops::now_ns();
    const std::uint64_t ripe = earliest + steal_after_ns_;
    if (now >= ripe) return stealable ? 0 : min_watch_ns;
    return std::max(ripe - now, min_watch_ns);
  }

  // Worker `holder` has just put the rest of a new batch in held_: wake every idle sibling
  // that sleeps without a limit (see "No lost watch").
  void holding(std::size_t holder) noexcept {
    // acquire: as in steal().
    if (!ready_.load(std::memory_order_acquire)) return;
    for (std::size_t k = 1; k < count_; ++k) {
      worker_type& sibling = *workers_[(holder + k) % count_];
      // seq_cst: both pair with watch()'s stores and set_idle(true) (see "No lost watch").
      if (sibling.watching_.load(std::memory_order_seq_cst)) continue;
      if (!sibling.idle_.load(std::memory_order_seq_cst)) continue;
      (void)sibling.kick();
    }
  }

  // ---- waking siblings ------------------------------------------------------------------------

  // A producer's add found worker `index`'s queue non-empty since `since`.
  void wake_for_backlog(std::size_t index, std::uint64_t since) noexcept {
    // Polling workers (reaper_options::poll_interval): a producer never wakes anyone; an idle
    // sibling finds the backlog and steals at its next look.
    if (workers_[index]->poll_ns_ != 0) return;
    if (steal_after_ns_ != 0) {
      const std::uint64_t now = sync_ops::coarse_now_ns();
      if (now < since || now - since < steal_after_ns_) return;
    }
    if (steal_refused_.load(std::memory_order_relaxed)) return;
    (void)wake_idle_siblings(index, 1);
  }

  // Relaxed snapshots (hints). Idle: its last pass found nothing to run, at home or at a
  // sibling, and no kick is pending: it spins or sleeps. Unkicked: no kick pending (idle, or
  // busy with a batch).
  static bool idle(const worker_type& worker) noexcept {
    return worker.idle_.load(std::memory_order_relaxed) && unkicked(worker);
  }
  static bool unkicked(const worker_type& worker) noexcept {
    return (worker.state_.load(std::memory_order_relaxed) & (worker_type::kicked_bit | worker_type::stopped_bit)) == 0;
  }

  // Kicks up to `most` siblings of worker `from` (nearest after it first) with the reaper's
  // kick, an RMW that no sleep can miss: a sleeping one wakes, a spinning one will not sleep;
  // either makes another pass, finds its queue empty and steals. Idle ones first, then busy
  // ones not yet kicked: the kick makes a busy sibling look for work to steal once more before
  // it next sleeps, which closes the window between its last steal attempt and its sleep.
  std::size_t wake_idle_siblings(std::size_t from, std::size_t most) noexcept {
    std::size_t woken = 0;
    for (int pass = 0; pass < 2; ++pass) {
      for (std::size_t k = 1; k < count_ && woken < most; ++k) {
        worker_type& sibling = *workers_[(from + k) % count_];
        if (!(pass == 0 ? idle(sibling) : unkicked(sibling))) continue;
        (void)sibling.kick();
        ++woken;
      }
    }
    return woken;
  }

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
      if (worker->on_worker() || worker_type::reaping_here_ == worker.get()) {
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

  // Last: destroyed first, while what their hooks use still exists.
  std::vector<std::unique_ptr<worker_type>> workers_;
};

}  // namespace teardown
