// teardown/reaper/reaper_class.hpp — the reaper class: its members, with their contracts, and its state.
//
// Who may call what, and the memory ordering: teardown/reaper.hpp (include that, not this file). The long member
// bodies live out of line, by concern, in the files included at the end: wake_word.hpp (the producers' path and
// the sleep/wake protocol), cpu_clock.hpp (reading the worker's CPU clock), worker_loop.hpp (the worker's pass
// and teardowns), control.hpp (construction, flush tickets, the hand count, freeze/thaw, stop), drive.hpp
// (driven mode), boost.hpp (priority boosts) and fork.hpp (the fork handlers).
// Fields say who writes them and under which lock; cache lines are grouped by writer.
//
// Design: docs/design.md, "The reaper".
#pragma once

#include <linux/capability.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>

#include "teardown/counter.hpp"
#include "teardown/llist.hpp"
#include "teardown/reaper/driven.hpp"
#include "teardown/reaper/options.hpp"
#include "teardown/reaper/pool_link.hpp"
#include "teardown/reaper/queue_concepts.hpp"
#include "teardown/sync.hpp"
#include "teardown/trace.hpp"
#include "teardown/worker_thread.hpp"

namespace teardown {

template <class T, llist_node T::*Hook, class Fn, class Queue>
class reaper_pool;

namespace detail {

// The calling thread's nice value; empty if the system will not say.
inline std::optional<int> calling_thread_nice() noexcept {
  errno = 0;
  const int value = getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
  if (value == -1 && errno != 0) return std::nullopt;
  return value;
}

// Whether the calling thread may lower a nice value to `target` (setpriority's rule): with
// CAP_SYS_NICE, or an RLIMIT_NICE of at least 20 - target. Asked of the kernel's own limits,
// not by trying: a try would change the nice.
inline bool calling_thread_may_lower_nice_to(int target) noexcept {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct caps[2]{};
  if (syscall(SYS_capget, &header, caps) == 0 && (caps[CAP_SYS_NICE / 32].effective & (1u << (CAP_SYS_NICE % 32)))) {
    return true;
  }
  rlimit limit{};
  if (getrlimit(RLIMIT_NICE, &limit) != 0) return false;
  return limit.rlim_cur == RLIM_INFINITY || static_cast<long long>(limit.rlim_cur) >= 20LL - target;
}

// exit() called from fn on this reaper's worker (deferred.hpp's exit path): if the caller is
// the worker, marks the reaper stopped and tears down, here, the rest of the batch in hand and
// everything queued; returns true. Anywhere else does nothing and returns false.
template <class Reaper>
bool stop_on_own_worker(Reaper& reaper) noexcept;

// A composition's waiter that has waited boost_after (process_reaper's wait_for_budget): boost()
// with `reason` (a static string) in the trace event. Does nothing if the reaper's boost_after
// is 0. Any thread.
template <class Reaper>
bool boost_for_waiter(Reaper& reaper, const char* reason) noexcept;

// The same waiter, past the boost: one round of "Waiters help" (tears down what is queued on
// this thread, asks the worker for half its batch) where no raise is in force. Any thread but
// the reaper's own callbacks; may block (runs teardowns).
template <class Reaper>
void help_for_waiter(Reaper& reaper);

}  // namespace detail

template <class T, llist_node T::*Hook, class Fn, class Queue = llist<T, Hook>>
class reaper final : private detail::fork_participant {
  static_assert(std::is_invocable_v<Fn&, T&>, "reaper: fn must be callable as fn(T&)");
  static_assert(reaper_queue<Queue, T, Hook>,
                "reaper: Queue needs llist's bool add(T&), bool add_batch(llist_chain&&), "
                "llist_batch del_all() and bool empty() const, and a default constructor");

  // The worker's own words, locks, waits, clock and thread: its queue's Sync policy, or
  // std_sync (sync.hpp), so that a test scheduler can drive the whole protocol.
  using sync_ops = sync_of_t<Queue>;
  template <class W>
  using atomic = typename sync_ops::template atomic<W>;
  using mutex_type = typename sync_ops::mutex;
  using condition_type = typename sync_ops::condition_variable;
  using clock_type = typename sync_ops::clock;

  template <class U, llist_node U::*H, class F, class Q>
  friend class reaper_pool;
  template <class Reaper>
  friend bool detail::stop_on_own_worker(Reaper& reaper) noexcept;
  template <class Reaper>
  friend bool detail::boost_for_waiter(Reaper& reaper, const char* reason) noexcept;
  template <class Reaper>
  friend void detail::help_for_waiter(Reaper& reaper);

  // A stealing pool's hooks into its worker and the worker's words its siblings read (pool_link.hpp), owned by
  // the pool; null for a reaper on its own and in a pool that does not steal.
  using pool_link = detail::pool_worker_link<T, Hook, sync_ops>;
  static constexpr std::uint64_t no_watch = ~std::uint64_t{0};

 public:
  using queue_type = Queue;

  /// Starts the worker. Throws std::invalid_argument, starting nothing, for bad options (see
  /// reaper_options); std::system_error if the thread cannot be created.
  explicit reaper(Fn fn, reaper_options opts = {}) : reaper(std::move(fn), std::move(opts), nullptr) {}

 private:
  // reaper_pool's constructor: a worker wired to its pool (link: null, or the pool's, outliving the worker).
  reaper(Fn fn, reaper_options opts, pool_link* link);

 public:
  reaper(const reaper&) = delete;
  reaper& operator=(const reaper&) = delete;

  /// stop(): drains everything queued, then joins; waits without limit (a teardown that
  /// blocks holds it up: stop_for first bounds the wait). Destroying the reaper from its own
  /// callback (fn on the worker, or take or fn inside reap_on_caller) would leave that callback
  /// running on a freed reaper: it writes why to stderr and aborts.
  ~reaper();

  /// Lock-free; see reaper.hpp's table. fn's exceptions on the inline path go to on_error.
  /// Aborts, with a message on stderr, for an item that is already queued.
  void enqueue(T& item) noexcept {
    abort_if_queued(item, "teardown::reaper::enqueue");
    (void)enqueue_item<false>(item);
  }

  /// enqueue() for a whole chain at once: one successful CAS (llist::add_batch) and at most one
  /// kick, however long the chain. Lock-free; leaves the chain empty; O(n) to count it. The
  /// chain joins the queue as if its elements were enqueued back to front (llist::add_batch).
  /// No item in it can be queued already: llist_chain's push refuses such an item.
  void enqueue_chain(llist_chain<T, Hook>&& chain) noexcept;

  /// Blocks until every item enqueued before the call has been torn down. Producers adding
  /// meanwhile cannot starve it: it waits for at most the batch in progress and the next one.
  void flush() { (void)flush_until(clock_type::time_point::max()); }

 private:
  // Linking a queued item again would make a cycle that the worker walks for ever: never
  // survivable, so an abort in every build. Async-signal-safe (enqueue may run in a handler).
  static void abort_if_queued(T& item, std::string_view who) noexcept;

  // enqueue(). With ReportBacklog (a pool's enqueue), an add that found the queue non-empty
  // returns the time the add that made it non-empty took (0 if unknown); otherwise returns 0.
  template <bool ReportBacklog>
  std::uint64_t enqueue_item(T& item) noexcept;

  // After an add that found the queue empty: wake the worker if it sleeps (unless it polls:
  // see "Wake policy"; the RMW stays, for the STOPPED race below).
  void kick_after_first_add() noexcept;

 public:
  /// flush() with a time limit: true if the flush completed in time.
  template <class Rep, class Period>
  bool flush_for(std::chrono::duration<Rep, Period> timeout) {
    return flush_until(clock_type::now() + timeout);
  }

  /// Returns once the worker is parked between items (or gone), holding none: the rest of a
  /// batch it was in the middle of is back on the queue. Freezes nest. May block.
  void freeze();

  /// Undoes one freeze(). Throws std::logic_error, changing nothing, without a matching freeze.
  void thaw();

  /// Drains everything queued, then joins the worker; afterwards enqueue runs fn inline.
  /// Idempotent. May block, without limit: a teardown that never returns holds it up for ever
  /// (stop_for bounds the wait). Refused (std::logic_error) on the worker itself.
  void stop();

  /// stop() that waits at most `timeout`, like an executor's awaitTermination: true iff
  /// everything queued was torn down and the worker joined in time. False leaves the reaper
  /// stopping: the worker goes on with what is left (counted in stats().pending), finishing its
  /// batch and then draining the queue, and enqueue goes on as during a stop() — it queues
  /// until the worker begins its final drain (which takes the item) and tears down inline
  /// after. A later stop, stop_for or the destructor waits for the worker again and joins it;
  /// flush waits for it too (flush_for gives up while it runs). Nothing is lost or torn down
  /// twice.
  /// Refused (std::logic_error) on the worker itself.
  template <class Rep, class Period>
  bool stop_for(std::chrono::duration<Rep, Period> timeout) {
    refuse_on_worker("stop_for");
    if (opts_.driven) return drive_stop(detail::deadline_after<clock_type>(timeout));
    request_stop();
    return await_stop(detail::deadline_after<clock_type>(timeout));
  }

  /// The worker's nice value in force: the options' (or, where the system refused it at the
  /// worker's start, the one the thread inherited) until set_nice changes it; a boost does not
  /// change it. Any thread, fn included; takes a mutex of its own briefly (never the control
  /// mutex: see "Fork").
  int nice() const {
    const std::lock_guard lock(nice_mutex_);
    return nice_;
  }
  /// Sets the worker thread's nice value (setpriority on its thread id) from now on: true if
  /// applied (before the worker starts: kept, and applied at its start), false if the system
  /// refused it (lowering it needs CAP_SYS_NICE or RLIMIT_NICE): nothing changes then, and the
  /// first refused raise sets setup_warning_raise. Applied, it ends a boost: the worker runs at
  /// `value` from now on. Throws std::invalid_argument, changing nothing, outside [-20, 19].
  /// Any thread, fn included; takes a mutex of its own briefly (never the control mutex: see
  /// "Fork").
  bool set_nice(int value);

  /// Raises the worker's priority to boost_nice (empty: the calling thread's nice) until the
  /// worker next finds its queue empty (see "Boost"), for a caller that knows work is urgent.
  /// True if this call raised the worker; false if nothing changed: no worker, a worker already
  /// as urgent, or a raise the system refused (counted in stats().boosts_refused; the first one
  /// also traced and set in setup_warnings as setup_warning_raise). Any thread, fn included;
  /// takes the mutex set_nice takes, briefly.
  bool boost() { return raise_worker("caller"); }

  /// Wakes the worker now if it sleeps, whatever the wake policy (see "Wake policy"): for a
  /// caller that knows the queued work should not wait for the next look. True if it woke a
  /// sleeping worker (counted in stats().hurries). Any thread, fn and signal handlers
  /// included; lock-free, one futex wake at most.
  bool hurry() noexcept;

  /// Asks for one more call of options' after_batch on the worker, even with nothing queued:
  /// for a caller that tore queued items down itself (reap_on_caller) and wants the batch-end
  /// work (a composition's allocator trim) done on the worker for them. Wakes a sleeping
  /// worker; driven, signals work_fd and the next run() makes the call. Several requests
  /// before the call make one call; nothing without an after_batch, or once stopped. Any
  /// thread; lock-free, one futex wake at most.
  void request_after_batch() noexcept;

  /// Driven only: tears down, on the calling thread, what is queued, within `limits` (at least
  /// one item when one is queued and limits.items > 0); the rest of a batch it took waits for the
  /// next run. Consumes work_fd's signal and signals again when it leaves work (`more`). A
  /// frozen or stopped reaper's run does nothing. Runs, driven flushes and stop exclude each
  /// other (the drive lock), so concurrent callers never tear one item down twice.
  /// std::logic_error if not driven, or from fn inside this reaper's run, flush or reap_on_caller.
  /// Blocking: runs the teardowns, and waits for another caller's run in progress.
  drive_result run(drive_limits limits = {}) {
    if (!opts_.driven) {
      throw std::logic_error("teardown::reaper::run: the reaper is not driven (reaper_options::driven)");
    }
    refuse_on_worker("run");
    std::unique_lock drive(drive_mutex_);
    return run_locked(limits, drive);
  }

  /// Driven: an eventfd (EFD_NONBLOCK | EFD_CLOEXEC), readable while run() has work to do
  /// (signalled by the enqueue that makes the queue non-empty, a run that leaves work, a thaw;
  /// read by run). Owned by the reaper: poll it, never close it. -1 when not driven. Wait-free.
  int work_fd() const noexcept { return work_fd_; }

  /// True when called from this reaper's own callback: fn on its worker, or take or fn inside
  /// a reap_on_caller on this thread — where flush, freeze and stop are refused and destroying
  /// the reaper aborts. Wait-free.
  bool in_own_callback() const noexcept {
    return on_worker() || reaping_here::contains(this) || driving_here::contains(this);
  }

  /// Tears queued items down on the calling thread (a pressure valve under memory pressure).
  /// Every item the worker has not taken yet is offered, oldest first, to `take(T&)` (which
  /// may read the item but must not free or re-queue it);
  /// the accepted ones are torn down here (counted in inline_reaped, errors go to on_error as
  /// usual) and the others go back on the queue, where they run behind items added meanwhile.
  /// Returns how many were torn down here. Items the worker already holds are not touched; a
  /// frozen worker holds none (a freeze hands the rest of its batch back), so while frozen every
  /// item not yet started is offered.
  /// Blocking: runs the teardowns, and takes the control mutex briefly. A flush() waits for
  /// every reap_on_caller in progress, and a put-back voids the worker's pass that may have
  /// missed it (see "The barrier"), so an item that went back is still covered. After stop(),
  /// declined items find no worker and are torn down here before the call returns; stop() and
  /// flush() wait for that.
  /// Refused (std::logic_error) on the worker. If take throws, everything not yet torn down
  /// goes back and the exception propagates.
  template <class Take>
  std::size_t reap_on_caller(Take&& take);

  /// True when the oldest queued item has waited longer than the stall threshold (approximate:
  /// the time is taken on the add that found the queue empty). A composition tears down inline
  /// while the worker is stalled.
  bool stalled() const noexcept {
    const std::uint64_t since = oldest_enqueue_ns_.load(std::memory_order_relaxed);
    if (since == 0 || queue_.empty()) return false;
    const std::uint64_t now = sync_ops::now_ns();
    return now > since && now - since > static_cast<std::uint64_t>(opts_.stall_threshold.count());
  }

  /// Wait-free snapshot; counters are read one by one.
  reaper_stats stats() const noexcept;

 private:
  static constexpr std::uint32_t sleeping_bit = 1;
  static constexpr std::uint32_t kicked_bit = 2;
  static constexpr std::uint32_t stopped_bit = 4;

  // In cpu_clock_pins_: the exiting worker has closed its CPU clock (the pinning protocol: cpu_clock.hpp).
  static constexpr std::uint32_t clock_closed_bit = 1u << 31;

  // The worker thread's whole CPU time: read from its CPU clock while it runs (no cost on the
  // worker), its own final reading once it has exited, 0 in a fork child that never had one.
  // Wait-free; the last pin to go after the close makes one futex wake.
  std::uint64_t worker_cpu_ns() const noexcept;

  // On the worker, last: publishes the final CPU time and closes the clock (cpu_clock.hpp).
  void close_cpu_clock() noexcept;

  // ---- the worker -----------------------------------------------------------------------------

  // Runs with every blockable signal blocked (detail::start_thread_with_signals_blocked).
  static void* worker_entry(void* self) {
    static_cast<reaper*>(self)->worker_main();
    return nullptr;
  }

  void worker_main() noexcept;
  void apply_setup() noexcept;

  // Takes the queue into in_flight_, in run order (opts_.order). The watchdog's clock is cleared BEFORE the
  // take: an add that lands after the clear is either in this take or, if after it, finds its clock clear
  // and starts it (enqueue), so a waiting item always has a clock. Cleared only when set, so
  // a poll of an idle queue writes no producer line. sweep: every shard of a sharded queue.
  void take_from_queue(bool sweep) noexcept;

  // The queue's del_all; with sweep, every shard of a sharded queue (its flags aside). Oldest
  // first: del_all().reverse(), in one walk where the queue has a take for it
  // (sharded_llist::del_all_oldest_first; see detail::take_queue).
  llist_batch<T, Hook> take_queue(bool sweep, bool oldest_first) noexcept {
    return detail::take_queue<T, Hook>(queue_, sweep, oldest_first);
  }

  // Runs the batch held in in_flight_ (in run order: take_from_queue and the pool's steal
  // leave it so), with a checkpoint after each item.
  void run_in_flight() noexcept;

  // In a pool: "my last pass found nothing to run, here or at a sibling" (spinning or asleep).
  // Written only on a change; read by siblings' holding() (docs/design.md,
  // "No lost watch").
  void set_idle(bool idle) noexcept;

  // Between items: honour a freeze, and yield if the yield policy says so. True if it looked at
  // the control requests (and may have parked).
  bool checkpoint() noexcept;

  // A freeze in the middle of a batch: the rest of the batch goes back on the queue, under (older
  // than) whatever was queued meanwhile, so that reap_on_caller reaches every item the frozen
  // worker has not started (a drain under memory pressure finds nothing stuck behind a freeze:
  // the OOM reaper series' thawing of a frozen victim, for the queue). The worker takes them
  // again after thaw. A producer racing the hand-back may land under them: an order slip,
  // nothing lost. Worker only; returns how many went back. With `most`: only the first `most`
  // (the items the worker would run next), the share a helping waiter asked for.
  std::size_t hand_back_in_flight(std::size_t most = static_cast<std::size_t>(-1)) noexcept;

  void park_while_frozen(std::unique_lock<mutex_type>& lock) noexcept;

  // Returns false when the worker must stop. Sets flush_target to the flush ticket this
  // iteration's del_all will satisfy.
  bool take_control_requests(std::uint64_t& flush_target) noexcept;

  // False, completing nothing, if items went back on the queue since the pass took its
  // ticket: the pass may have missed them, so the next one (already requested by the
  // put-back) takes the ticket again.
  bool complete_flush(std::uint64_t ticket) noexcept;

  bool spin_found_work() const noexcept;

  // True if the sleep ended at its time limit rather than by a kick.
  bool sleep_until_kicked() noexcept;

  void drain_on_worker() noexcept;

  // ---- tearing down -------------------------------------------------------------------------

  // Inside a catch handler: counts the error and hands it to on_error.
  void report_error() noexcept;

  // CLOCK_THREAD_CPUTIME_ID is a real syscall (no vDSO), so items are timed one by one only
  // when their type asks to be charged; the worker's total is read by stats() instead.
  void tear_down(T& item, bool on_worker) noexcept;

  void tear_down_inline(T& item) noexcept { tear_down(item, /*on_worker=*/false); }

  void call_after_batch() noexcept;
  // True once per request_after_batch() (requests before it coalesce).
  bool take_after_batch_request() noexcept;

  // On a caller: takes whatever is queued (each node goes to exactly one taker) and tears it
  // down here, oldest first. First what a fork child's parked worker held (in held_, in run
  // order; see "Fork").
  void drain_inline() noexcept;

  // ---- control plane ------------------------------------------------------------------------

  // Ends a reap_on_caller: puts the declined items back and lets waiting flushes finish. A put-
  // back voids the worker's pass in progress and every flush ticket completed since the first
  // of the calls in progress began (caller_reaps_since_): those passes may have run while this
  // call, or one it overlaps, held the items, and with overlapping calls an item can pass from
  // one call's put-back to the other's take after the other began. The worker's next pass
  // completes them again (see "The barrier"). Runs inside the call's hand.
  void finish_caller_reap(llist_chain<T, Hook>&& declined) noexcept;

  // Hands (see "The barrier"): a caller that takes items off the queue outside the worker (an
  // inline drain after stop, a reap_on_caller) counts itself on the side that hand_side_bit
  // names before its take, and uncounts after its last teardown. A flush after stop drains,
  // flips the side, and waits for the old side to empty.
  static constexpr std::uint64_t hand_side_bit = std::uint64_t{1} << 63;
  static constexpr std::uint64_t hand_unit(bool side) noexcept { return side ? std::uint64_t{1} << 32 : 1; }
  // Names a side for the data hooks (atomics.hpp): the flip that made it current "writes" the
  // settler's drain there, and a hand counted on it "reads" it (the order open_hand claims).
  const void* hand_side_key(bool side) const noexcept {
    return reinterpret_cast<const char*>(&inline_hands_) + (side ? 1 : 0);
  }

  std::uint64_t open_hand() noexcept;
  void close_hand(std::uint64_t unit) noexcept;

  // drain_inline() as a hand: the path of enqueue after stop and in a fork child.
  void drain_inline_counted() noexcept;

  // Under control_mutex_: waits until no reap_on_caller is in progress. False: the deadline
  // passed first.
  bool await_no_caller_reaps(std::unique_lock<mutex_type>& lock, typename clock_type::time_point deadline);

  // After the worker ended (or in a fork child): waits for every reap_on_caller in progress,
  // tears down what is queued, then waits out every hand counted before that. Flushers take
  // turns from their drain on, so each flip leaves only older hands on the side waited for;
  // hands that a settler which gave up at its deadline left on the other side are waited out
  // before the flip. False: the deadline passed first.
  bool settle_after_stop(typename clock_type::time_point deadline);
  // Waits until no hand is counted on the side(s) `side_mask` covers; false at the deadline.
  bool await_no_hands(std::uint64_t side_mask, typename clock_type::time_point deadline);

  // Under control_mutex_: tell the worker to look at the requests.
  void request_locked() noexcept { control_requested_.store(true, std::memory_order_relaxed); }

  // Returns the state word before the kick.
  std::uint32_t kick() noexcept;

  // A stop in two steps, so that a pool can ask every worker before it waits for any. Step one:
  // the worker drains the queue and ends (a freeze does not hold it: stop overrides it).
  void request_stop() noexcept;

  // Step two: waits, until `deadline`, for the worker to end; then joins it (the first caller to
  // see it ended does; the others wait for that join, which does not block) and tears down
  // here what producers queued while it ended. False: the deadline passed, nothing changed.
  bool await_stop(typename clock_type::time_point deadline);

  // See detail::stop_on_own_worker. The item whose fn called exit() is already off in_flight_,
  // and exit() never returns to it, so nothing runs twice.
  void stop_here_on_own_worker() noexcept;

  bool flush_until(typename clock_type::time_point deadline);

  // A flush in two steps, so that a pool can ask every worker before it waits for any. The
  // ticket: 0 when the reaper is stopped or stopping (the stop drains everything).
  std::uint64_t request_flush() noexcept;

  bool await_flush(std::uint64_t ticket, typename clock_type::time_point deadline);

  bool on_worker() const noexcept {
    // acquire: pairs with the release in worker_main, so worker_thread_ is readable.
    if (!worker_known_.load(std::memory_order_acquire)) return false;
    detail::data_read<sync_ops>(&worker_thread_);
    return pthread_equal(worker_thread_, pthread_self());
  }

  void refuse_on_worker(const char* operation) const;

  // ---- driven mode --------------------------------------------------------------------------

  // Tells the program that run() has work: work_fd, then on_work. Counted in wakeups.
  void signal_work() noexcept;

  // Under the drive lock: take the queue into in_flight_ as the worker's pass does.
  void take_driven(bool sweep) noexcept;

  // Under the drive lock: one item of in_flight_, and the after-batch hook when it was the last.
  void run_one_driven() noexcept;

  // Under the drive lock, between items: true if a freeze holds the driver (the rest of its
  // batch is then back on the queue, where reap_on_caller reaches it). With wait, parks until
  // thaw, stop or `deadline` instead (false at the deadline: `expired`).
  bool driven_frozen(bool wait, typename clock_type::time_point deadline, bool& expired);


  // A run's or a driven flush's hold of the drive lock: counted in drivers_ (under control_mutex_)
  // from before the lock is taken until after it is released, and driving_here for fn
  // (drive.hpp). So a freeze that sees no driver sees no run holding the rest of a batch.
  struct driving_scope;

  // Lock-free check the next run would find something: the held rest or the queue.
  bool driven_more() const noexcept { return !in_flight_.empty() || !queue_.empty(); }

  drive_result run_locked(drive_limits limits, std::unique_lock<mutex_type>& drive);

  // flush() when driven: tears down on the caller, under the drive lock, the held rest and
  // everything on the queue at one take after it (so producers cannot keep it going), then waits
  // for every reap_on_caller in progress; a put-back meanwhile means one more round. A freeze
  // parks it (holding nothing) until thaw or the deadline.
  bool drive_flush(typename clock_type::time_point deadline);

  // stop() when driven: from the STOPPED exchange on, producers tear down inline (as after a
  // worker's end); what was queued or held is torn down here, then the hands are waited out.
  bool drive_stop(typename clock_type::time_point deadline);

  // A deadline is polled, not passed to a timed lock (see settle_after_stop).
  bool lock_before(std::unique_lock<mutex_type>& lock, typename clock_type::time_point deadline);

  // ---- boost -------------------------------------------------------------------------------

  // A priority change to trace once no lock of ours is held (a hook may call into the reaper; boost.hpp).
  struct priority_change;


  // See "Boost". Any thread; takes nice_mutex_ (which may nest inside control_mutex_, never the
  // other way round). True if this call raised the worker.
  bool raise_worker(const char* reason, priority_change& change) noexcept;
  bool raise_worker(const char* reason) noexcept;
  // A raise the system refused: sets setup_warning_raise; true for the first one (to trace).
  bool note_refused_raise() noexcept;
  // A flush or stop waiting, under control_mutex_ (`lock`), for done(): waits up to boost_after
  // and, still waiting, raises the worker (reason: the trace event's). False if the deadline
  // passed first; true otherwise, done() or not (the caller goes on waiting).
  template <class Done>
  bool await_boost_point(std::unique_lock<mutex_type>& lock, typename clock_type::time_point deadline, Done done,
                         const char* reason);

  // See "Waiters help". After await_boost_point's raise, under control_mutex_ (`lock`): while
  // no raise is in force, the worker is not frozen and done() is false, tears down what is
  // queued on this thread (a reap_on_caller that takes everything) and asks the worker to hand
  // back the unstarted half of its batch, then waits boost_after again. False if the deadline
  // passed first.
  template <class Done>
  bool help_while_waiting(std::unique_lock<mutex_type>& lock, typename clock_type::time_point deadline, Done done);
  // One round of it, under control_mutex_ (`lock`, held again on return); false, doing nothing,
  // where the waiter may not help.
  bool help_round(std::unique_lock<mutex_type>& lock);

  // On the worker, when a pass found its queue empty: back to its own nice. A raise that lands
  // after the hint below was read is lowered at the next empty pass. Raising the nice value
  // back is never refused.
  void lower_after_drain() noexcept;

  // ---- fork ---------------------------------------------------------------------------------

  // See "Fork". With fork_policy::never_wait, prepare and parent do nothing: no lock the worker
  // may hold is taken and nothing waits for the worker.
  bool parks_for_fork() const noexcept { return opts_.on_fork == fork_policy::wait_for_item && !on_worker(); }

  void fork_prepare() noexcept override;
  void fork_parent() noexcept override;
  void fork_child() noexcept override;

  // Cache lines are grouped by who writes them, so the worker's per-item writes do not take
  // the producers' line away from them and the other way round.

  // Read-mostly.
  Fn fn_;
  const reaper_options opts_;
  sharded_counter enqueued_;  // its shards live on lines of their own
  pthread_t worker_{};
  pthread_t worker_thread_{};
  atomic<bool> worker_known_{false};
  mutable atomic<std::uint32_t> cpu_clock_pins_{0};  // stats() readers | clock_closed_bit
  atomic<std::uint32_t> setup_warnings_{0};

  pool_link* const link_;  // see pool_link; null: not in a stealing pool
  // 0: producers wake the worker (see "Wake policy").
  const std::uint64_t poll_ns_ = static_cast<std::uint64_t>(opts_.poll_interval.count());
  // Lazy polling's longest look; poll_ns_ when it does not back off.
  const std::uint64_t poll_max_ns_ = std::max(poll_ns_, static_cast<std::uint64_t>(opts_.poll_interval_max.count()));
  const std::uint64_t boost_ns_ = static_cast<std::uint64_t>(opts_.boost_after.count());  // 0: never
  // The constructing thread's nice: what a boost the worker starts itself raises it to.
  const std::optional<int> creator_nice_ = detail::calling_thread_nice();

  // Written by producers (and by the worker when it sleeps and wakes).
  alignas(64) Queue queue_;
  atomic<std::uint32_t> state_{0};  // sleeping_bit | kicked_bit | stopped_bit; RMWs only,
                                         // except single-threaded stores in a fork child
  atomic<std::uint64_t> oldest_enqueue_ns_{0};
  atomic<std::uint64_t> wakeups_{0};

  // Written by the worker for every item (and by the fork child handler, single-threaded).
  alignas(64) llist_batch<T, Hook> in_flight_;
  std::uint64_t last_yield_ns_ = 0;
  bool handed_back_ = false;  // a freeze handed the batch back (worker only)
  std::uint64_t batch_since_ns_ = 0;  // the watchdog clock the current take cleared (worker only)
  std::uint64_t flush_target_ = 0;  // the ticket this pass completes, 0 if none (worker only)
  std::uint64_t last_sleep_limit_ns_ = 0;  // the time limit of the last sleep, 0: none (worker only)
  // In a pool: the rest of the batch while the worker runs an item (taken by a sibling's steal,
  // or back by the worker with an exchange); in a fork child, what the parked worker held
  // (fork_policy::wait_for_item).
  llist<T, Hook, typename sync_ops::atomics_policy> held_;
  atomic<std::uint64_t> stolen_{0};
  atomic<std::uint64_t> reaped_{0};  // also by callers tearing down inline
  atomic<std::uint64_t> batches_{0};
  atomic<std::uint64_t> worker_cpu_ns_{0};
  atomic<std::uint64_t> longest_wait_ns_{0};
  atomic<std::uint64_t> errors_{0};
  atomic<std::uint64_t> inline_reaped_{0};
  atomic<std::uint64_t> yields_{0};
  atomic<std::uint64_t> polls_{0};
  atomic<std::uint64_t> hurries_{0};
  // The limit of the worker's next (or current) look; written by the worker only, read by stats().
  atomic<std::uint64_t> poll_limit_ns_{poll_ns_};
  atomic<std::uint64_t> boosts_{0};
  atomic<std::uint64_t> boosts_refused_{0};
  atomic<bool> child_sweep_{false};  // a fork child's next drain sweeps every shard
  atomic<std::uint64_t> helped_{0};  // items waiters tore down (waiters_help)

  // Control plane: guarded by control_mutex_.
  alignas(64) mutable mutex_type control_mutex_;
  condition_type control_changed_;
  atomic<bool> after_batch_wanted_{false};  // request_after_batch(): taken by the worker's next pass
  atomic<bool> control_requested_{false};  // written under control_mutex_; read as a hint
  bool worker_running_ = false;
  bool worker_parked_ = false;
  bool stop_requested_ = false;
  bool worker_done_ = false;     // worker_main has ended (it may not be joined yet)
  bool worker_joining_ = false;  // a stopper is joining the worker
  bool fork_parking_ = false;  // between fork_prepare and fork_parent/child
  std::uint64_t freeze_depth_ = 0;
  bool share_wanted_ = false;  // a helping waiter asks for half the worker's batch (checkpoint)
  // See "Boost": a nice no boost could undo is not applied; the worker keeps its creator's. Decided
  // here, on the constructing thread (whose credentials and limits the worker inherits), so that
  // nice() says the same before and after the worker starts.
  const bool nice_kept_ = !opts_.driven && opts_.nice_only_if_raisable && boost_ns_ != 0 && creator_nice_ &&
                          opts_.nice > opts_.boost_nice.value_or(*creator_nice_) &&
                          !detail::calling_thread_may_lower_nice_to(opts_.boost_nice.value_or(*creator_nice_));
  int nice_ = nice_kept_ ? *creator_nice_ : opts_.nice;  // applied by the worker at its start (nice_mutex_)
  bool nice_set_ = false;  // set_nice was called before the start: no setup_warning_nice_kept (nice_mutex_)
  pid_t worker_tid_ = 0;   // the worker's thread id while it runs; 0 before and after (nice_mutex_)
  int boosted_nice_ = 0;   // the nice a boost raised the worker to, while boosted_ (nice_mutex_)
  atomic<bool> boosted_{false};  // written under nice_mutex_; read by the worker as a hint
  std::uint64_t flush_requested_ = 0;
  std::uint64_t flush_completed_ = 0;
  std::uint64_t caller_reaps_ = 0;  // reap_on_caller calls in progress
  std::uint64_t caller_reaps_since_ = 0;  // flush_completed_ when caller_reaps_ last left 0
  std::uint64_t put_backs_ = 0;       // reap_on_caller put-backs so far (see "The barrier")
  std::uint64_t pass_put_backs_ = 0;  // put_backs_ when the worker's pass took its flush ticket

  // See open_hand: bit 63 the side new hands count on, bits 0-31 side 0's count, 32-62 side 1's.
  atomic<std::uint64_t> inline_hands_{0};
  mutex_type settle_mutex_;  // flushers after stop take turns (settle_after_stop)
  // Guards nice_, worker_tid_ and the boost; never held across fork(), and taken inside
  // control_mutex_ at most (a flush's boost), never around it, so fn may
  // call nice()/set_nice() of any reaper while a fork() parks its worker.
  mutable mutex_type nice_mutex_;

  // The reapers whose reap_on_caller runs on this thread, however nested.
  struct reaping_tag;
  using reaping_here = detail::calls_here<reaping_tag>;

  // Driven mode. in_flight_ holds the rest of a run's batch between runs, under drive_mutex_,
  // which every run, driven flush and driven stop holds while it tears down (taken before
  // control_mutex_, never inside it but for freeze's try_lock).
  int work_fd_ = -1;
  mutex_type drive_mutex_;
  std::uint64_t drivers_ = 0;   // runs and flushes that hold the drive lock (control_mutex_)
  bool driver_parked_ = false;  // a flush waits for a thaw, holding nothing (control_mutex_)
  std::shared_ptr<detail::drive_gate> gate_;
  // The reapers whose run, flush or stop tears down on this thread, however nested.
  struct driving_tag;
  using driving_here = detail::calls_here<driving_tag>;
};

}  // namespace teardown

#include "teardown/reaper/wake_word.hpp"
#include "teardown/reaper/cpu_clock.hpp"
#include "teardown/reaper/worker_loop.hpp"
#include "teardown/reaper/control.hpp"
#include "teardown/reaper/drive.hpp"
#include "teardown/reaper/boost.hpp"
#include "teardown/reaper/fork.hpp"
