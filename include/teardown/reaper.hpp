// teardown/reaper.hpp — a dedicated worker thread that tears items down off the caller's path.
//
// The kernel's mm_reaper made a component: one thread fed through an llist, woken only on the
// empty -> non-empty transition, running at nice 19 with an affinity preference for the
// housekeeping CPUs, freezable between items.
//
//     auto reap = [](buffer& b) { delete &b; };                // void(T&); may throw
//     teardown::reaper<buffer, &buffer::hook, decltype(reap)> reaper(reap, {.name = "buf_reaper"});
//     reaper.enqueue(*b);                                      // lock-free; returns at once
//     reaper.flush();                                          // everything enqueued so far is done
//
// Who may call what (the reaper must outlive every call, enqueue included)
//   enqueue              any thread, concurrently. Lock-free. Makes a syscall (one futex wake)
//   enqueue_chain        only when its add found the queue empty AND the worker is asleep AND
//                        poll_interval is 0 (see "Wake policy"); with a poll_interval, never.
//   hurry                any thread, concurrently; lock-free, async-signal-safe; one futex
//                        wake at most (see "Wake policy").
//                        After stop(), and in a fork child, it runs fn(item) on the caller instead.
//                        Async-signal-safe while the worker runs, a thread's first enqueue
//                        included (no lock, no allocation: counter.hpp); after stop() and in a
//                        fork child it runs fn inline, so it is then as safe as fn (and on_error).
//                        An item still queued (its hook on_list(): fn has not started on it) is
//                        a program bug: enqueue writes why to stderr (write(2)) and aborts, in
//                        every build. A chain's items are checked as they are pushed onto it.
//   flush, flush_for     any thread but the worker; may block (waits for the worker). See "The
//                        barrier" for exactly what a flush waits for.
//   freeze, thaw         any thread but the worker; freeze may block until the worker is parked
//                        between items. Freezes nest; thaw without freeze throws. A worker
//                        frozen in the middle of a batch hands the rest of it back to the
//                        queue, so that reap_on_caller reaches everything not yet started.
//   stop, stop_for       any thread but the worker; may block (drains, then joins). Idempotent.
//                        stop and the destructor wait without limit; stop_for gives up after a
//                        timeout and leaves the rest to the still-running worker (see stop_for).
//   destructor           stop(). Never from the reaper's own callback (fn, or take/fn inside
//                        reap_on_caller): that aborts with a message (it would be a
//                        use-after-free), as in_own_callback() tells beforehand.
//   stats, stalled,      any thread; wait-free snapshots. stats reads the worker's CPU clock
//   in_own_callback      only while the worker cannot exit (see worker_cpu_ns()); the exiting
//                        worker waits for such a read to end, and stats then makes one futex
//                        wake.
//   fn                   runs on the worker; also on callers after stop(), in a fork child, and
//                        on a caller that races stop(). It must accept distinct items
//                        concurrently. Calling flush/freeze/stop from fn is refused with
//                        std::logic_error (it would wait for itself). With
//                        fork_policy::wait_for_item, fn must not construct or destroy a reaper,
//                        nor call another reaper's flush, freeze, stop or reap_on_caller: a
//                        fork() on another thread waits for fn to finish while it holds the
//                        registry of live reapers and the control mutexes of those it parked.
//   nice, set_nice,      any thread, fn included (this reaper's or another's); take a mutex of
//   boost                their own briefly, never the control mutex, so a fork() that parks the
//                        worker never waits for them.
//   run                  driven only; any thread, several at once (they take turns: the drive
//                        lock), never from fn. Blocking: tears down on the caller.
//   work_fd              any thread; wait-free. Poll it; never close it.
//   drive_handle         any thread, after the reaper's end too (then it does nothing).
//   on_work              called by an enqueue (or a run, thaw, put-back) on that thread: must be
//                        cheap and must not call the reaper but later, through the handle.
//   constructor, flush, freeze, thaw, stop, reap_on_caller, run, destructor: not
//   async-signal-safe (with on_work, neither is enqueue beyond what on_work is).
//
// Signals. The worker blocks every signal sent to the process from its first instruction (all
// but SIGKILL, SIGSTOP, the C library's internal ones and the synchronous fault signals), as
// liburcu's call_rcu threads do: a signal meant for the program (kill, a terminal's SIGINT,
// SIGTERM meant for a sigwait thread) is never delivered on it. The fault signals (SIGSEGV,
// SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS) stay unblocked on purpose: a fault that fn causes
// on the worker is delivered to the worker itself, so a crash reporter or a sanitizer's report
// runs for it (to a thread that blocks a fault signal the kernel forces the default action).
//
// No lost wake-up. The worker publishes SLEEPING in a state word with an atomic exchange before
// it sleeps; a producer whose add found the queue empty sets KICKED with an atomic fetch_or and
// makes the futex syscall only if it read SLEEPING. All writes to the state word are
// read-modify-writes, so they are totally ordered and each reads the latest value: either the
// kick comes first, and the worker's SLEEPING exchange reads KICKED and does not sleep, or the
// worker's exchange comes first, and the kick reads SLEEPING and wakes it. Items added behind a
// non-empty queue need no kick, because the kick of the add that made it non-empty covers them.
// tests/model/reaper_wakeup.pml checks this with the spin model checker.
//
// Wake policy. The futex wake costs the producer a syscall whose price grows with how long the
// worker's CPU has been idle (the kernel or hypervisor waking a halted CPU: about 2 us after
// 20 us idle, 8 us after 200 ms on the VM in docs/benchmarks.md). poll_interval > 0 moves that
// cost to the worker: a kick that finds SLEEPING wakes nobody, and the worker never sleeps
// longer than poll_interval before it looks at the queue again. The argument above
// is unchanged but for its last step: the kick's RMW still orders the add before the worker's
// next look, and that look comes within poll_interval instead of at once. Only the producers'
// kick is silent: flush, freeze, stop, reap_on_caller and fork still wake the worker, so none
// of them waits an interval. The price: about 1 / poll_interval timed wake-ups a second while
// idle (stats().polls, stats().worker_cpu_ns), and a teardown that starts up to poll_interval
// later. The default, 0, keeps the producer's wake.
// Lazy polling (poll_interval_max > poll_interval; call_rcu's lazy callbacks): each look that
// ends at its limit and finds nothing doubles the next limit, up to poll_interval_max, and a
// pass that takes work brings it back to poll_interval, so an idle worker wakes about
// 1 / poll_interval_max times a second and a burst is looked at every poll_interval. A
// teardown then starts up to poll_interval_max late, unless someone hurries: hurry() wakes the
// worker at once whatever the policy (the kernel's lazy/hurry split), and so do flush, freeze,
// stop, reap_on_caller and fork (in the parent, after the fork). async_teardown hurries when
// its pending cost passes a mark, when the budget refuses a charge and when its cap is lowered
// (a pressure policy's cap); stats().hurries counts the hurries that woke a sleeping worker,
// stats().poll_limit_ns is the limit of the worker's current look.
//
// Boost. A worker at nice 19 behind busy threads of nice 0 gets about 1.5% of a CPU, so memory
// that a waiter needs back comes back 50 times later than inline. So, as the kernel boosts a
// starved RCU callback thread for its waiters, the worker's priority
// is raised to the waiter's nice (boost_nice, when set) once work has waited boost_after (10
// ms; 0 = never): by a flush or flush_for still waiting after boost_after, by the worker
// itself when the batch it takes waited longer than boost_after beyond its own sleep limit
// (it was starved, or frozen), by a composition's boost() (process_reaper's wait_for_budget),
// and it is lowered back to the worker's nice by the worker at the first pass that finds its
// queue empty. Each raise is counted (stats().boosts) and traced (trace::boost, with the
// lowering); a raise the system refuses — lowering a nice value needs CAP_SYS_NICE or an
// RLIMIT_NICE that allows it — is counted in boosts_refused and changes nothing. set_nice ends
// a boost. A flush's raise is made under the control mutex, so the worker completes the
// ticket, and lowers itself, after it.
//
// Memory ordering: the queue is an llist (release add, acquire del_all), so fn sees everything a
// producer wrote to the item before enqueue. The state word's RMWs are acq_rel: a worker that
// reads KICKED synchronizes with the kicking producer, so its next del_all sees that add.
// Control requests (flush, freeze, stop) travel under a mutex; a relaxed flag tells the worker
// to look, and a kick wakes it.
//
// The queue. reaper<T, Hook, Fn, Queue> feeds its worker through a Queue, llist<T, Hook> by
// default; sharded_llist<T, Hook> gives many-core producers a head each. Any type with llist's
// add / add_batch / del_all / empty and their meanings fits (the reaper_queue concept below):
// the wake-up argument above needs only that add returns true for an add that the consumer's
// next del_all might otherwise miss (llist: the empty -> non-empty transition; sharded_llist:
// its was-empty signal), and that every del_all call takes each node it sees exactly once.
// For drain_order::oldest_first the reaper takes with del_all().reverse(), or, where the queue
// declares del_all_oldest_first() (del_all_sweep_oldest_first() for a sweep) in the same class
// as its del_all (del_all_sweep), with that: sharded_llist's, which costs one walk where the
// join and the reversal are two. A queue that wraps del_all in a derived class keeps having its
// del_all called (detail::take_queue). When the queue's Atomics policy is also a Sync policy
// (sync.hpp), the worker's own words, locks, waits, clock and thread use it too: that is how
// tests/schedule runs this protocol under a deterministic scheduler. Otherwise std_sync.
//
// In a pool (reaper_pool.hpp) a worker has three more steps, all on the worker and all off for
// a reaper on its own (whose per-item path is unchanged). (1) When its own queue is empty it
// asks the pool for work (a steal) before it spins and sleeps: part of a sibling's queue, or
// part of the rest of a batch a sibling has been running one item of for steal_after. (2) While
// it runs an item of a batch, the rest of the batch waits in held_, an llist: before the item
// one exchange puts it there (replace_all, release), after the item one exchange takes back
// whatever is still there (del_all, acquire). A sibling's steal takes it with the same kind of
// exchange, so each node has exactly one owner at a time, and whoever takes a node sees what
// its producer wrote. The worker never reads an item it no longer owns. Per item: two
// uncontended exchanges and a clock read, only for an item that has others behind it. (3)
// Before it sleeps, it asks the pool how long it may sleep (watch): while a sibling holds a
// batch, no longer than until that sibling's item has run steal_after; and when it first puts
// a batch in held_, it wakes the siblings that sleep without a limit (holding). So the rest of
// a batch behind an item that blocks reaches an idle sibling within about steal_after, while
// the item still blocks. Stolen items run on the thief and are counted in its reaped (and in
// stolen); they were counted as enqueued by the victim. A frozen pool steals nothing; a worker
// parks between items only after it took its held rest back, so a freeze still hands the rest
// of a batch back to the queue.
//
// The barrier. flush() returns after every item whose enqueue (or enqueue_chain) returned
// before flush() was called has been torn down, wherever the item was when flush() began: on
// the queue, in the worker's batch, in the rest of a batch that a pool sibling stole, in the
// hands of a reap_on_caller (taken, or declined and put back), or being torn down inline by
// a caller after stop(). flush_for says true only under the same condition. stop() and a
// stop_for that says true promise the same for every item whose enqueue returned before they
// were called (not before they returned: an enqueue that read the state word before the
// worker's end may add its item behind another producer's kick that is still to come, and
// return before that kick's drain; tests/model/flush_barrier.pml checks the promise as it is
// written here).
// One mechanism gives all of it: a worker pass completes a flush ticket only if nothing went
// back on the queue since the pass took it (a put-back invalidates the pass; a later pass
// completes the ticket), a flush waits for every reap_on_caller in progress, and after stop
// every caller that drains inline counts itself in a two-sided hand count that a flush, after
// its own drain, waits out (each side drains while new callers count on the other, so the
// wait ends while producers keep going; flushers take turns from their drain on, and a
// reap_on_caller that finds the worker stopped tears its declined items down itself rather
// than putting them back where a newer hand could take them). Over a sharded queue the pass that completes a
// ticket sweeps every shard, not only the flagged ones: an adder preempted between its push
// and its flag must not hide an item that another adder on its shard already flushed.
//
// Driven mode (reaper_options::driven): no thread of ours; the program runs the teardowns on
// its own thread (an event loop, an executor) with run(limits), at most limits.items items and
// no new one after limits.time, at least one if any is queued. Where a worker would be woken —
// the enqueue that makes the queue non-empty, counted in stats().wakeups — work_fd() (an
// eventfd) becomes readable and on_work(handle) is called; a run reads work_fd before it takes
// the queue (an add after the take finds the queue empty and signals again, so no signal is
// lost), keeps the rest of its batch for the next run, and signals again when it leaves work
// (drive_result::more). Runs, a driven flush and stop hold the drive lock while they tear down,
// so each taken item has one owner, as the worker's batch does. The rest is as with a worker:
// flush tears down, on its caller, what was queued or held when it took the drive lock and
// waits out reap_on_caller as "The barrier" says; freeze makes a run return between items
// (a frozen run does nothing) and a waiting flush park, with the rest of the batch handed back
// to the queue; thaw signals again; stop and the destructor tear down everything on the caller,
// and later enqueues tear down inline; after_batch runs on the thread that finished a batch;
// the stall clock is the queue's (the rest a run keeps is held, as a worker's batch is).
// hurry() returns false and set_nice applies nothing (no thread). A drive_handle outlives the
// reaper harmlessly: the destructor nulls the handles' shared gate under its mutex (waiting
// for a handle's run in progress), and a later h(limits) does nothing. In a fork child the
// drive lock is started over (its holder does not exist there) and a run's held rest is the
// parent's, forgotten unread as a worker's batch is.
//
// Fork. By default (fork_policy::never_wait) fork() waits for nothing of the worker's: no
// handler takes a lock the worker may hold or waits for it to reach a point between items, so
// a fork costs what it would without a reaper, however starved the worker or long the item in
// progress (a process_reaper's release waiting for its victim). The parent's worker runs on. In
// the child the worker does not exist: the reaper turns into its stopped form — enqueue tears
// down inline, and what was queued when fork() copied the queue (each head is one word written
// by atomic RMWs, so an add or a take is in the copy or not) is torn down by the child's next
// enqueue, flush, stop or destructor; that first drain sweeps every shard of a sharded queue.
// What the worker had taken off the queue (the item in fn, the rest of its batch, in a pool
// its held rest) is the parent's teardown in progress, copied at an instruction the child
// cannot know: the child forgets it unread. It is torn down once, by the parent, never twice;
// the child's copy of that memory stays allocated in the child (copy-on-write shares its pages
// until either side writes them). fork_policy::wait_for_item is for a child that must tear
// down its copy of everything: pthread_atfork handlers park every worker between items across
// fork() (so fork() waits for the item in progress, and for a starved worker to be scheduled),
// the parent resumes, and the child tears down the rest of the batch too. Either way each
// handler is O(1) in the items queued or held: none reads an item, so fork() costs no time per
// item and no copy-on-write fault on the items' pages. Nothing deadlocks or is torn down
// twice. (A child forked from inside fn itself may only exec or _exit.)
#pragma once

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#if defined(__linux__)
#include <linux/futex.h>
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "teardown/counter.hpp"
#include "teardown/llist.hpp"
#include "teardown/sync.hpp"
#include "teardown/trace.hpp"
#include "teardown/worker_thread.hpp"

namespace teardown {

enum class drain_order { oldest_first, newest_first };
enum class sched_policy { other, batch, idle };

/// What a fork() on another thread does about a running worker (see "Fork" in the header
/// comment).
enum class fork_policy {
  never_wait,     // fork() waits for nothing of the worker's; the child leaves the batch the
                  // worker had taken to the parent
  wait_for_item,  // fork() waits for the worker to finish its item and park between items; the
                  // child tears down the rest of the batch too
};

/// How much one driven run (reaper::run) may do: at most `items` teardowns, and no new one
/// once `time` has passed since the run began (the one in progress is never cut short).
struct drive_limits {
  std::size_t items = std::numeric_limits<std::size_t>::max();
  std::chrono::nanoseconds time = std::chrono::nanoseconds::max();
};

/// What a driven run did: `items` torn down; `more`: work is left (the run signalled it again).
struct drive_result {
  std::size_t items = 0;
  bool more = false;
};

namespace detail {
// Shared by a driven reaper and its drive_handles: the destructor nulls `reaper` under `mutex`,
// so a handle that runs later finds nothing to run.
struct drive_gate {
  std::mutex mutex;
  void* reaper = nullptr;
  drive_result (*run)(void* reaper, drive_limits limits) = nullptr;
};
inline thread_local const drive_gate* gate_here = nullptr;  // the gate whose run this thread is in
}  // namespace detail

/// A driven reaper's run, callable later from anywhere (an executor's task): h(limits) runs
/// reaper::run(limits) if the reaper still exists and does nothing (returns {}) once it has
/// been destroyed. Copyable; thread-safe; may block (it runs teardowns, and a destructor waits
/// for a run that a handle is in). Calling it from inside its own run throws std::logic_error.
class drive_handle {
 public:
  drive_handle() = default;
  drive_result operator()(drive_limits limits = {}) const {
    if (!gate_) return {};
    if (detail::gate_here == gate_.get()) {
      throw std::logic_error("teardown::drive_handle: called from inside its own reaper's run");
    }
    const std::lock_guard lock(gate_->mutex);
    if (gate_->reaper == nullptr) return {};
    const struct here_scope {
      const detail::drive_gate* previous;
      explicit here_scope(const detail::drive_gate* gate) noexcept : previous(std::exchange(detail::gate_here, gate)) {}
      ~here_scope() { detail::gate_here = previous; }
    } here(gate_.get());
    return gate_->run(gate_->reaper, limits);
  }
  explicit drive_handle(std::shared_ptr<detail::drive_gate> gate) noexcept : gate_(std::move(gate)) {}

 private:
  std::shared_ptr<detail::drive_gate> gate_;
};

/// An on_work callable that posts a run to `executor` (anything with post(callable), which
/// must outlive the reaper's last signal): `executor.post([h, limits] { h(limits); })`.
template <class Executor>
auto post_to(Executor& executor, drive_limits limits = {}) {
  return [target = &executor, limits](drive_handle handle) {
    target->post([handle, limits] { (void)handle(limits); });
  };
}

/// Checked by the constructor before any thread starts: a nice or boost_nice value outside
/// [-20, 19], a negative CPU, stall_threshold, yield_after, poll_interval, poll_interval_max or
/// boost_after, a poll_interval_max without a poll_interval or below it, a policy, order or
/// on_fork that is not one of the enum's values, or a name holding a NUL byte is refused with
/// std::invalid_argument naming the field. With driven, so is every option that only a thread
/// of ours could honour: poll_interval, poll_interval_max, cpus, policy, boost_nice, yield_after
/// and on_fork = wait_for_item; on_work without driven is refused too. (name and nice are kept
/// but name no thread: nice() reports the value.)
struct reaper_options {
  std::string name = "reaper";                       // worker thread name (Linux keeps 15 chars)
  int nice = 19;                                     // applied to the worker thread; [-20, 19]
  std::function<void(std::exception_ptr)> on_error{};  // called on the tearing-down thread when fn throws
  std::vector<int> cpus{};               // affinity preference; empty: the housekeeping CPUs
                                         // (online minus isolated and nohz_full). The thread
                                         // may be re-affined later by anyone.
  sched_policy policy = sched_policy::other;
  drain_order order = drain_order::oldest_first;
  std::uint32_t spin_polls = 256;        // polls of the queue before sleeping; 0 = never spin
  std::chrono::nanoseconds stall_threshold = std::chrono::seconds(1);  // see stalled()
  std::chrono::nanoseconds yield_after = std::chrono::nanoseconds(0);  // yield the CPU between
                                         // items once this much time passed since the last
                                         // yield; 0 = never (cond_resched)
  std::chrono::nanoseconds poll_interval = std::chrono::nanoseconds(0);  // 0: an enqueue that
                                         // finds the worker asleep wakes it (a futex wake);
                                         // > 0: enqueue never wakes it, the idle worker looks
                                         // at the queue at least this often ("Wake policy")
  std::chrono::nanoseconds poll_interval_max = std::chrono::nanoseconds(0);  // lazy polling: an
                                         // idle worker's looks back off (doubling) from
                                         // poll_interval up to this; 0 = no back-off. Needs a
                                         // poll_interval, and not below it
  fork_policy on_fork = fork_policy::never_wait;  // see "Fork"
  std::chrono::nanoseconds boost_after = std::chrono::milliseconds(10);  // how long work waits
                                         // before the worker's priority is raised ("Boost");
                                         // 0 = never boost
  std::optional<int> boost_nice{};       // the nice a boost raises the worker to; empty: the
                                         // waiting thread's own (the constructing thread's for
                                         // a backlog the worker finds itself)
  std::uint64_t trace_domain = 0;        // carried by the worker's boost trace events
  std::function<void()> after_batch{};   // called on the worker after each batch it ran (never
                                         // on a caller; driven: on the thread whose run or
                                         // flush finished the batch); an exception goes to on_error
  bool driven = false;                   // no thread of ours: the program runs the teardowns
                                         // with run() (see "Driven mode")
  // Driven only: called when work becomes runnable (the enqueue that makes the queue non-empty,
  // a run that leaves work behind, a thaw), on that thread, enqueue included. It must be cheap
  // and must not call the reaper, except later through the handle (post it somewhere).
  // An exception goes to on_error.
  std::function<void(drive_handle)> on_work{};
};

/// Setup steps the worker could not apply: reported in reaper_stats, never fatal.
enum setup_warning : std::uint32_t {
  setup_warning_name = 1u << 0,      // pthread_setname_np refused
  setup_warning_nice = 1u << 1,      // setpriority refused
  setup_warning_policy = 1u << 2,    // sched_setscheduler refused
  setup_warning_affinity = 1u << 3,  // sched_setaffinity refused, or no CPU left to prefer
};

struct reaper_stats {
  std::uint64_t enqueued = 0;         // enqueue calls
  std::uint64_t reaped = 0;           // items torn down, by the worker or inline
  std::uint64_t pending = 0;          // enqueued - reaped (a snapshot; may be briefly stale)
  std::uint64_t errors = 0;           // fn (or after_batch) threw
  std::uint64_t batches = 0;          // non-empty batches the worker took
  std::uint64_t inline_reaped = 0;    // items torn down on a caller (after stop, in a fork child)
  std::uint64_t wakeups = 0;          // futex wakes made by producers
  std::uint64_t worker_cpu_ns = 0;    // the worker thread's CPU time (polling included)
  std::uint64_t longest_wait_ns = 0;  // longest time from a batch's first enqueue to its take
  std::uint32_t setup_warnings = 0;   // setup_warning bits
  bool running = false;               // a worker thread exists
  std::uint64_t stolen = 0;           // items this worker took from its siblings' queues (in a
                                      // reaper_pool; counted in reaped here, in enqueued there)
  std::uint64_t yields = 0;           // times the worker yielded the CPU (yield_after)
  std::uint64_t polls = 0;            // sleeps that ended at their time limit, not by a kick
                                      // (poll_interval; in a pool also the steal watch)
  std::uint64_t boosts = 0;           // times the worker's priority was raised ("Boost")
  std::uint64_t boosts_refused = 0;   // raises the system refused (no CAP_SYS_NICE and an
                                      // RLIMIT_NICE below the nice asked for)
  bool boosted = false;               // the worker runs raised now
  std::uint64_t hurries = 0;          // hurry() calls (own or a composition's) that woke the
                                      // sleeping worker
  std::uint64_t poll_limit_ns = 0;    // the time limit of the worker's current or last look
                                      // (poll_interval, backed off up to poll_interval_max);
                                      // 0 without a poll_interval
};

namespace detail {

template <class Member>
struct member_owner {};
template <class R, class C>
struct member_owner<R C::*> {
  using type = C;
};

// Queue has `take` (del_all_oldest_first, del_all_sweep_oldest_first: one walk where
// del_all().reverse() is two) declared by the same class as `plain` (del_all, del_all_sweep),
// so it is the same take. A queue that wraps del_all (a derived type that hides it) keeps
// having its del_all called: its inherited one-walk take is not that del_all.
template <auto Take, auto Plain>
concept same_take = requires {
  typename member_owner<decltype(Take)>::type;
  typename member_owner<decltype(Plain)>::type;
} && std::same_as<typename member_owner<decltype(Take)>::type, typename member_owner<decltype(Plain)>::type>;

template <class Queue, class T, llist_node T::*Hook>
concept has_oldest_first_take = requires(Queue& queue) {
  { queue.del_all_oldest_first() } -> std::same_as<llist_batch<T, Hook>>;
} && same_take<&Queue::del_all_oldest_first, &Queue::del_all>;

template <class Queue, class T, llist_node T::*Hook>
concept has_sweep = requires(Queue& queue) {
  { queue.del_all_sweep() } -> std::same_as<llist_batch<T, Hook>>;
};

template <class Queue, class T, llist_node T::*Hook>
concept has_oldest_first_sweep = has_sweep<Queue, T, Hook> && requires(Queue& queue) {
  { queue.del_all_sweep_oldest_first() } -> std::same_as<llist_batch<T, Hook>>;
} && same_take<&Queue::del_all_sweep_oldest_first, &Queue::del_all_sweep>;

// The queue's del_all (with sweep: every shard of a sharded queue, its flags aside), in the
// order given: oldest_first is del_all().reverse(), in one walk when the queue has one.
template <class T, llist_node T::*Hook, class Queue>
llist_batch<T, Hook> take_queue(Queue& queue, bool sweep, bool oldest_first) noexcept {
  if constexpr (has_sweep<Queue, T, Hook>) {
    if (sweep) {
      if constexpr (has_oldest_first_sweep<Queue, T, Hook>) {
        if (oldest_first) return queue.del_all_sweep_oldest_first();
      }
      llist_batch<T, Hook> taken = queue.del_all_sweep();
      return oldest_first ? std::move(taken).reverse() : std::move(taken);
    }
  }
  (void)sweep;  // llist's del_all already takes everything
  if constexpr (has_oldest_first_take<Queue, T, Hook>) {
    if (oldest_first) return queue.del_all_oldest_first();
  }
  llist_batch<T, Hook> taken = queue.del_all();
  return oldest_first ? std::move(taken).reverse() : std::move(taken);
}

}  // namespace detail

/// What a reaper needs of its queue: llist's add, add_batch, del_all and empty, with their
/// meanings (see "The queue" in the header comment). Default-constructed by the reaper.
template <class Queue, class T, llist_node T::*Hook>
concept reaper_queue = std::default_initializable<Queue> && requires(Queue& queue, const Queue& view, T& item,
                                                                     llist_chain<T, Hook>&& chain) {
  { queue.add(item) } -> std::same_as<bool>;
  { queue.add_batch(std::move(chain)) } -> std::same_as<bool>;
  { queue.del_all() } -> std::same_as<llist_batch<T, Hook>>;
  { view.empty() } -> std::same_as<bool>;
};

template <class T, llist_node T::*Hook, class Fn, class Queue>
class reaper_pool;

/// Optional CPU accounting (RFC open question 3): if `teardown_cpu_owner(item)` is found by
/// argument-dependent lookup and returns std::atomic<std::uint64_t>*, the CPU nanoseconds fn
/// spends on that item are added there. It is called before fn (which may free the item), and
/// what it returns must outlive the teardown.
template <class T>
concept cpu_accounted = requires(T& item) {
  { teardown_cpu_owner(item) } -> std::convertible_to<std::atomic<std::uint64_t>*>;
};

namespace detail {

// The options, unless one of them cannot mean what it says: then std::invalid_argument naming
// `who` (the class refusing them) and the field (`field` prefixes its name: "worker." in a pool).
inline reaper_options validated_reaper_options(reaper_options opts, const char* who, const char* field = "") {
  const auto refuse = [&](const std::string& what) {
    throw std::invalid_argument(std::string(who) + ": " + field + what);
  };
  if (!detail::valid_nice(opts.nice)) refuse("nice must be in [-20, 19], got " + std::to_string(opts.nice));
  if (opts.boost_nice && !detail::valid_nice(*opts.boost_nice)) {
    refuse("boost_nice must be in [-20, 19], got " + std::to_string(*opts.boost_nice));
  }
  for (int cpu : opts.cpus) {
    if (cpu < 0) refuse("cpus holds " + std::to_string(cpu) + "; a CPU number is never negative");
  }
  if (opts.policy != sched_policy::other && opts.policy != sched_policy::batch && opts.policy != sched_policy::idle) {
    refuse("policy is not a sched_policy value");
  }
  if (opts.order != drain_order::oldest_first && opts.order != drain_order::newest_first) {
    refuse("order is not a drain_order value");
  }
  if (opts.on_fork != fork_policy::never_wait && opts.on_fork != fork_policy::wait_for_item) {
    refuse("on_fork is not a fork_policy value");
  }
  if (opts.stall_threshold.count() < 0) {
    refuse("stall_threshold is negative (" + std::to_string(opts.stall_threshold.count()) + " ns)");
  }
  if (opts.yield_after.count() < 0) {
    refuse("yield_after is negative (" + std::to_string(opts.yield_after.count()) + " ns); 0 means never");
  }
  if (opts.poll_interval.count() < 0) {
    refuse("poll_interval is negative (" + std::to_string(opts.poll_interval.count()) +
           " ns); 0 means producers wake the worker");
  }
  if (opts.poll_interval_max.count() < 0) {
    refuse("poll_interval_max is negative (" + std::to_string(opts.poll_interval_max.count()) +
           " ns); 0 means no back-off");
  }
  if (opts.poll_interval_max.count() != 0 && opts.poll_interval.count() == 0) {
    refuse("poll_interval_max is set without a poll_interval; lazy polling backs off from poll_interval");
  }
  if (opts.poll_interval_max.count() != 0 && opts.poll_interval_max < opts.poll_interval) {
    refuse("poll_interval_max (" + std::to_string(opts.poll_interval_max.count()) + " ns) is below poll_interval (" +
           std::to_string(opts.poll_interval.count()) + " ns)");
  }
  if (opts.boost_after.count() < 0) {
    refuse("boost_after is negative (" + std::to_string(opts.boost_after.count()) + " ns); 0 means never boost");
  }
  if (opts.name.find('\0') != std::string::npos) refuse("name holds a NUL byte");
  if (opts.on_work && !opts.driven) refuse("on_work is set without driven; only a driven reaper signals work");
  if (opts.driven) {
    const auto no_thread = [&](const char* what) { refuse(std::string(what) + " is set with driven; no thread of ours runs"); };
    if (opts.poll_interval.count() != 0) no_thread("poll_interval");
    if (opts.poll_interval_max.count() != 0) no_thread("poll_interval_max");
    if (!opts.cpus.empty()) no_thread("cpus");
    if (opts.policy != sched_policy::other) no_thread("policy");
    if (opts.boost_nice) no_thread("boost_nice");
    if (opts.yield_after.count() != 0) no_thread("yield_after");
    if (opts.on_fork != fork_policy::never_wait) no_thread("on_fork");
  }
  return opts;
}

// The calling thread's nice value; empty if the system will not say.
inline std::optional<int> calling_thread_nice() noexcept {
  errno = 0;
  const int value = getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
  if (value == -1 && errno != 0) return std::nullopt;
  return value;
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

  // A pool's hooks into its worker (see "In a pool" in the header comment); all null for a
  // reaper on its own. Set before the worker starts and never changed; all run on the worker.
  struct pool_link {
    void* pool = nullptr;
    std::size_t index = 0;  // this worker's index in the pool
    // Called when the worker's own queue is empty: a batch taken from a sibling's queue or
    // from the rest of a sibling's batch (newest first), its size in `taken`.
    llist_batch<T, Hook> (*steal)(void* pool, std::size_t thief, std::size_t& taken) noexcept = nullptr;
    // Called before the worker sleeps: how long it may sleep before it looks for a held batch
    // to take (no_watch: until kicked; 0: look now).
    std::uint64_t (*watch)(void* pool, std::size_t watcher) noexcept = nullptr;
    // Called once per batch, when the worker first puts the rest of it in held_: wakes the
    // siblings that sleep without watching.
    void (*holding)(void* pool, std::size_t holder) noexcept = nullptr;
  };
  static constexpr std::uint64_t no_watch = ~std::uint64_t{0};

 public:
  using queue_type = Queue;

  /// Starts the worker. Throws std::invalid_argument, starting nothing, for bad options (see
  /// reaper_options); std::system_error if the thread cannot be created.
  explicit reaper(Fn fn, reaper_options opts = {}) : reaper(std::move(fn), std::move(opts), pool_link{}) {}

 private:
  // reaper_pool's constructor: a worker wired to its pool.
  reaper(Fn fn, reaper_options opts, pool_link link)
      : fn_(std::move(fn)), opts_(detail::validated_reaper_options(std::move(opts), "teardown::reaper")), link_(link) {
    if (opts_.driven) {
      if (link_.pool != nullptr) throw std::invalid_argument("teardown::reaper_pool: worker.driven: a pool's workers are threads");
      work_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
      if (work_fd_ < 0) throw std::system_error(errno, std::generic_category(), "teardown::reaper: cannot create work_fd");
      gate_ = std::make_shared<detail::drive_gate>();
      gate_->reaper = this;
      gate_->run = [](void* self, drive_limits limits) { return static_cast<reaper*>(self)->run(limits); };
      detail::fork_registry::instance().add(this);
      return;  // no thread: the program drives (see "Driven mode")
    }
    {
      const std::lock_guard lock(control_mutex_);
      worker_running_ = true;
    }
    detail::fork_registry::instance().add(this);
    if (const int error = sync_ops::start_thread(&worker_, &reaper::worker_entry, this); error != 0) {
      detail::fork_registry::instance().remove(this);
      throw std::system_error(error, std::generic_category(), "teardown::reaper: cannot start the worker");
    }
  }

 public:
  reaper(const reaper&) = delete;
  reaper& operator=(const reaper&) = delete;

  /// stop(): drains everything queued, then joins; waits without limit (a teardown that
  /// blocks holds it up: stop_for first bounds the wait). Destroying the reaper from its own
  /// callback (fn on the worker, or take or fn inside reap_on_caller) would leave that callback
  /// running on a freed reaper: it writes why to stderr and aborts.
  ~reaper() {
    if (on_worker()) {
      detail::fatal_misuse(
          "teardown::reaper::~reaper: the reaper is destroyed from its own worker (from fn); the worker would go "
          "on using the freed reaper. Destroy it from another thread.\n");
    }
    if (reaping_here_ == this) {
      detail::fatal_misuse(
          "teardown::reaper::~reaper: the reaper is destroyed from take or fn inside its own reap_on_caller; the "
          "call would go on using the freed reaper. Destroy it after reap_on_caller returns.\n");
    }
    if (driving_here_ == this) {
      detail::fatal_misuse(
          "teardown::reaper::~reaper: the reaper is destroyed from fn inside its own run or flush; the call would "
          "go on using the freed reaper. Destroy it after run returns.\n");
    }
    if (gate_) {
      const std::lock_guard lock(gate_->mutex);  // waits for a handle's run in progress
      gate_->reaper = nullptr;
    }
    stop();
    detail::fork_registry::instance().remove(this);
    if (work_fd_ >= 0) ::close(work_fd_);
  }

  /// Lock-free; see the header comment. fn's exceptions on the inline path go to on_error.
  /// Aborts, with a message on stderr, for an item that is already queued.
  void enqueue(T& item) noexcept {
    abort_if_queued(item, "teardown::reaper::enqueue");
    (void)enqueue_item<false>(item);
  }

  /// enqueue() for a whole chain at once: one successful CAS (llist::add_batch) and at most one
  /// kick, however long the chain. Lock-free; leaves the chain empty; O(n) to count it. The
  /// chain joins the queue as if its elements were enqueued back to front (llist::add_batch).
  /// No item in it can be queued already: llist_chain's push refuses such an item.
  void enqueue_chain(llist_chain<T, Hook>&& chain) noexcept {
    if (chain.empty()) return;
    enqueued_.add(chain.size());
    // acquire: pairs with the worker's STOPPED exchange, as in enqueue().
    if (state_.load(std::memory_order_acquire) & stopped_bit) {
      (void)queue_.add_batch(std::move(chain));
      drain_inline_counted();  // takes the chain back, with anything queued from before
      return;
    }
    if (!queue_.add_batch(std::move(chain))) return;  // the kick of the first add covers it
    kick_after_first_add();
  }

  /// Blocks until every item enqueued before the call has been torn down. Producers adding
  /// meanwhile cannot starve it: it waits for at most the batch in progress and the next one.
  void flush() { (void)flush_until(clock_type::time_point::max()); }

 private:
  // Linking a queued item again would make a cycle that the worker walks for ever: never
  // survivable, so an abort in every build. Async-signal-safe (enqueue may run in a handler).
  static void abort_if_queued(T& item, std::string_view who) noexcept {
    if ((item.*Hook).on_list()) [[unlikely]] {
      detail::write_to_stderr(who);
      detail::write_to_stderr(": the item is already queued (element type ");
      detail::write_to_stderr(detail::type_name<T>());
      detail::write_to_stderr("); an item may be enqueued again only once fn has started on it\n");
      std::abort();
    }
  }

  // enqueue(). With ReportBacklog (a pool's enqueue), an add that found the queue non-empty
  // returns the time the add that made it non-empty took (0 if unknown); otherwise returns 0.
  template <bool ReportBacklog>
  std::uint64_t enqueue_item(T& item) noexcept {
    enqueued_.add();
    // acquire: pairs with the worker's STOPPED exchange, so the inline path below sees the
    // queue as the worker left it.
    if (state_.load(std::memory_order_acquire) & stopped_bit) {
      tear_down_inline(item);
      drain_inline_counted();  // anything still queued from before (a fork child, a race with stop)
      return 0;
    }
    if (!queue_.add(item)) {  // not the first: the kick of the first covers this item
      // The watchdog's clock is set by the add that found the queue empty; if the worker's
      // take cleared it after that add, the first add to see it clear starts it again.
      std::uint64_t since = oldest_enqueue_ns_.load(std::memory_order_relaxed);
      if (since == 0) {
        const std::uint64_t now = sync_ops::now_ns();
        if (oldest_enqueue_ns_.compare_exchange_strong(since, now, std::memory_order_relaxed)) since = now;
      }
      if constexpr (ReportBacklog) return since;
      return 0;
    }
    kick_after_first_add();
    return 0;
  }

  // After an add that found the queue empty: wake the worker if it sleeps (unless it polls:
  // see "Wake policy"; the RMW stays, for the STOPPED race below).
  void kick_after_first_add() noexcept {
    oldest_enqueue_ns_.store(sync_ops::now_ns(), std::memory_order_relaxed);
    // acq_rel: release publishes the add to a worker that reads KICKED; acquire pairs with the
    // worker's STOPPED exchange for the drain below.
    const std::uint32_t previous = state_.fetch_or(kicked_bit, std::memory_order_acq_rel);
    if (previous & stopped_bit) {
      drain_inline_counted();  // the worker is gone and may not have seen this item
    } else if (opts_.driven) {
      signal_work();
    } else if ((previous & sleeping_bit) && poll_ns_ == 0) {
      wakeups_.fetch_add(1, std::memory_order_relaxed);
      sync_ops::futex_wake_one(state_);
    }
  }

 public:
  /// flush() with a time limit: true if the flush completed in time.
  template <class Rep, class Period>
  bool flush_for(std::chrono::duration<Rep, Period> timeout) {
    return flush_until(clock_type::now() + timeout);
  }

  /// Returns once the worker is parked between items (or gone), holding none: the rest of a
  /// batch it was in the middle of is back on the queue. Freezes nest. May block.
  void freeze() {
    refuse_on_worker("freeze");
    std::unique_lock lock(control_mutex_);
    ++freeze_depth_;
    request_locked();
    if (opts_.driven) {
      control_changed_.wait(lock, [&] { return !driving_ || driver_parked_ || stop_requested_; });
      lock.unlock();
      // Between runs the rest of a batch is held: hand it back, so reap_on_caller reaches it. A
      // drive lock taken by someone else is a run that hands it back itself when it sees the freeze.
      if (drive_mutex_.try_lock()) {
        lock.lock();
        if (freeze_depth_ > 0 && !stop_requested_) (void)hand_back_in_flight();
        handed_back_ = false;
        lock.unlock();
        drive_mutex_.unlock();
      }
      return;
    }
    lock.unlock();
    kick();
    lock.lock();
    control_changed_.wait(lock, [&] { return worker_parked_ || !worker_running_ || stop_requested_; });
  }

  /// Undoes one freeze(). Throws std::logic_error, changing nothing, without a matching freeze.
  void thaw() {
    std::unique_lock lock(control_mutex_);
    if (freeze_depth_ == 0) throw std::logic_error("teardown::reaper::thaw: the reaper is not frozen");
    --freeze_depth_;
    control_changed_.notify_all();
    // A frozen run did nothing and a freeze handed the rest back: say again that work waits.
    if (opts_.driven && freeze_depth_ == 0 && !stop_requested_ && !queue_.empty()) {
      lock.unlock();
      signal_work();
    }
  }

  /// Drains everything queued, then joins the worker; afterwards enqueue runs fn inline.
  /// Idempotent. May block, without limit: a teardown that never returns holds it up for ever
  /// (stop_for bounds the wait). Refused (std::logic_error) on the worker itself.
  void stop() {
    refuse_on_worker("stop");
    if (opts_.driven) {
      (void)drive_stop(clock_type::time_point::max());
      return;
    }
    request_stop();
    (void)await_stop(clock_type::time_point::max());
  }

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

  /// The worker's nice value: the options' until set_nice changes it. Any thread, fn included;
  /// takes a mutex of its own briefly (never the control mutex: see "Fork").
  int nice() const {
    const std::lock_guard lock(nice_mutex_);
    return nice_;
  }
  /// Sets the worker thread's nice value (setpriority on its thread id) from now on: true if
  /// applied, false if the system refused it (lowering it needs CAP_SYS_NICE or RLIMIT_NICE;
  /// the value is kept either way, for a worker not yet started). Ends a boost: the worker runs
  /// at `value` from now on. Throws std::invalid_argument, changing nothing, outside [-20, 19].
  /// Any thread, fn included; takes a mutex of its own briefly (never the control mutex: see
  /// "Fork").
  bool set_nice(int value) {
    if (!detail::valid_nice(value)) {
      throw std::invalid_argument("teardown::reaper::set_nice: nice must be in [-20, 19], got " + std::to_string(value));
    }
    const std::lock_guard lock(nice_mutex_);
    nice_ = value;
    boosted_.store(false, std::memory_order_relaxed);  // under nice_mutex_
    if (opts_.driven) return false;  // no thread of ours to apply it to
    return worker_tid_ == 0 || setpriority(PRIO_PROCESS, static_cast<id_t>(worker_tid_), value) == 0;
  }

  /// Raises the worker's priority to boost_nice (empty: the calling thread's nice) until the
  /// worker next finds its queue empty (see "Boost"), for a caller that knows work is urgent.
  /// True if the worker now runs at that nice or a more urgent one; false if there is no worker
  /// or the system refused (counted in stats().boosts_refused). Any thread, fn included; takes
  /// the mutex set_nice takes, briefly.
  bool boost() { return raise_worker("caller"); }

  /// Wakes the worker now if it sleeps, whatever the wake policy (see "Wake policy"): for a
  /// caller that knows the queued work should not wait for the next look. True if it woke a
  /// sleeping worker (counted in stats().hurries). Any thread, fn and signal handlers
  /// included; lock-free, one futex wake at most.
  bool hurry() noexcept {
    if (opts_.driven) return false;  // no thread to wake: work_fd / on_work already said so
    if (!(kick() & sleeping_bit)) return false;
    hurries_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  /// Driven only: tears down, on the calling thread, what is queued, within `limits` (at least
  /// one item when one is queued and limits.items > 0); the rest of a batch it took waits for the
  /// next run. Consumes work_fd's signal and signals again when it leaves work (`more`). A
  /// frozen or stopped reaper's run does nothing. Runs, driven flushes and stop exclude each
  /// other (the drive lock), so concurrent callers never tear one item down twice.
  /// std::logic_error if not driven, or from fn inside this reaper's run, flush or reap_on_caller.
  /// Blocking: runs the teardowns, and waits for another caller's run in progress.
  drive_result run(drive_limits limits = {}) {
    if (!opts_.driven) throw std::logic_error("teardown::reaper::run: the reaper is not driven (reaper_options::driven)");
    refuse_on_worker("run");
    const std::lock_guard drive(drive_mutex_);
    return run_locked(limits);
  }

  /// Driven: an eventfd (EFD_NONBLOCK | EFD_CLOEXEC), readable while run() has work to do
  /// (signalled by the enqueue that makes the queue non-empty, a run that leaves work, a thaw;
  /// read by run). Owned by the reaper: poll it, never close it. -1 when not driven. Wait-free.
  int work_fd() const noexcept { return work_fd_; }

  /// True when called from this reaper's own callback: fn on its worker, or take or fn inside
  /// a reap_on_caller on this thread — where flush, freeze and stop are refused and destroying
  /// the reaper aborts. Wait-free.
  bool in_own_callback() const noexcept { return on_worker() || reaping_here_ == this || driving_here_ == this; }

  /// Tears queued items down on the calling thread (a pressure valve: RFC open question 1).
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
  std::size_t reap_on_caller(Take&& take) {
    refuse_on_worker("reap_on_caller");
    std::uint64_t completed_before = 0;
    {
      const std::lock_guard lock(control_mutex_);
      ++caller_reaps_;
      completed_before = flush_completed_;
    }
    // Counted as a hand (see "The barrier") before the take, until everything taken is torn
    // down or back on the queue: a flush after stop waits for it.
    const struct hand_scope {
      reaper& self;
      const std::uint64_t unit;
      explicit hand_scope(reaper& owner) noexcept : self(owner), unit(owner.open_hand()) {}
      ~hand_scope() { self.close_hand(unit); }
    } hand(*this);
    llist_batch<T, Hook> offered = take_queue(/*sweep=*/false, /*oldest_first=*/true);
    llist_chain<T, Hook> declined;  // front = newest, as on the queue
    // take and fn run below on this thread: a flush, freeze or stop from them would wait for
    // this very call, so they are refused as they are on the worker.
    const struct reaping_here_scope {
      const reaper* previous;
      explicit reaping_here_scope(const reaper* self) noexcept : previous(std::exchange(reaping_here_, self)) {}
      ~reaping_here_scope() { reaping_here_ = previous; }
    } reaping_here(this);
    std::size_t torn_down = 0;
    while (T* item = offered.pop_front()) {
      bool here = false;
      try {
        here = take(*item);
      } catch (...) {
        declined.push_front(*item);
        while (T* rest = offered.pop_front()) declined.push_front(*rest);
        finish_caller_reap(std::move(declined), completed_before);
        throw;
      }
      if (!here) {
        declined.push_front(*item);
        continue;
      }
      tear_down_inline(*item);  // may free item
      ++torn_down;
    }
    finish_caller_reap(std::move(declined), completed_before);
    return torn_down;
  }

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
  reaper_stats stats() const noexcept {
    reaper_stats s;
    s.enqueued = enqueued_.read();
    s.reaped = reaped_.load(std::memory_order_relaxed);
    s.pending = s.enqueued > s.reaped ? s.enqueued - s.reaped : 0;
    s.errors = errors_.load(std::memory_order_relaxed);
    s.batches = batches_.load(std::memory_order_relaxed);
    s.inline_reaped = inline_reaped_.load(std::memory_order_relaxed);
    s.wakeups = wakeups_.load(std::memory_order_relaxed);
    s.worker_cpu_ns = worker_cpu_ns();
    s.longest_wait_ns = longest_wait_ns_.load(std::memory_order_relaxed);
    s.setup_warnings = setup_warnings_.load(std::memory_order_relaxed);
    s.running = !opts_.driven && (state_.load(std::memory_order_relaxed) & stopped_bit) == 0;
    s.stolen = stolen_.load(std::memory_order_relaxed);
    s.yields = yields_.load(std::memory_order_relaxed);
    s.polls = polls_.load(std::memory_order_relaxed);
    s.boosts = boosts_.load(std::memory_order_relaxed);
    s.boosts_refused = boosts_refused_.load(std::memory_order_relaxed);
    s.boosted = boosted_.load(std::memory_order_relaxed);
    s.hurries = hurries_.load(std::memory_order_relaxed);
    s.poll_limit_ns = poll_limit_ns_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  static constexpr std::uint32_t sleeping_bit = 1;
  static constexpr std::uint32_t kicked_bit = 2;
  static constexpr std::uint32_t stopped_bit = 4;

  // The worker's CPU clock is readable through its pthread_t only while the thread exists. A
  // stats() call pins the clock (a count in cpu_clock_pins_) while it reads it; the exiting
  // worker publishes its final CPU time, closes the clock (clock_closed_bit) and waits until no
  // pin is left before it returns, so stop() joins it only after every read of its clock ended.
  // Pins and the close are RMWs on one word: a pin taken before the close is waited for, one
  // taken after it sees the close and reads the final figure instead.
  static constexpr std::uint32_t clock_closed_bit = 1u << 31;

  // The worker thread's whole CPU time: read from its CPU clock while it runs (no cost on the
  // worker), its own final reading once it has exited, 0 in a fork child that never had one.
  // Wait-free; the last pin to go after the close makes one futex wake.
  std::uint64_t worker_cpu_ns() const noexcept {
    // A closed clock is never pinned again, so readers cannot keep the exiting worker waiting:
    // each pins at most once after the close. acquire (both): pairs with the release close in
    // close_cpu_clock(), so a reader that finds the clock closed sees the figure stored there.
    if (cpu_clock_pins_.load(std::memory_order_acquire) & clock_closed_bit) {
      return worker_cpu_ns_.load(std::memory_order_relaxed);
    }
    const std::uint32_t pins = cpu_clock_pins_.fetch_add(1, std::memory_order_acquire);
    std::uint64_t live = 0;
    bool read_live = false;
    // acquire: pairs with the release store in worker_main, so worker_thread_ is readable.
    if (!(pins & clock_closed_bit) && worker_known_.load(std::memory_order_acquire)) {
      clockid_t clock{};
      timespec ts{};
      if (pthread_getcpuclockid(worker_thread_, &clock) == 0 && clock_gettime(clock, &ts) == 0) {
        live = static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(ts.tv_nsec);
        read_live = true;
      }
    }
    // release: pairs with the acquire load in close_cpu_clock(): our clock read is over before
    // the worker exits.
    if (cpu_clock_pins_.fetch_sub(1, std::memory_order_release) == (clock_closed_bit | 1)) {
      sync_ops::futex_wake_one(cpu_clock_pins_);  // the worker may wait for the last pin
    }
    return read_live ? live : worker_cpu_ns_.load(std::memory_order_relaxed);
  }

  // On the worker, last: see clock_closed_bit. The figure is stored twice: before the close, for
  // readers that find the clock closed while pins drain, and after, so that the final figure is
  // at least every live reading (each ended before the drain). Only a reader in between may see
  // less than an earlier live reading: by the CPU time of a futex wake and a clock read.
  void close_cpu_clock() noexcept {
    worker_cpu_ns_.store(detail::thread_cpu_ns(), std::memory_order_relaxed);
    // release: pairs with the acquire pin in worker_cpu_ns(), publishing the figure above.
    std::uint32_t pins = cpu_clock_pins_.fetch_or(clock_closed_bit, std::memory_order_release) | clock_closed_bit;
    while (pins != clock_closed_bit) {
      sync_ops::futex_wait(cpu_clock_pins_, pins);
      // acquire: pairs with the release unpin in worker_cpu_ns().
      pins = cpu_clock_pins_.load(std::memory_order_acquire);
    }
    worker_cpu_ns_.store(detail::thread_cpu_ns(), std::memory_order_relaxed);  // stop()'s join publishes it
  }

  // ---- the worker -----------------------------------------------------------------------------

  // Runs with every blockable signal blocked (detail::start_thread_with_signals_blocked).
  static void* worker_entry(void* self) {
    static_cast<reaper*>(self)->worker_main();
    return nullptr;
  }

  void worker_main() noexcept {
    worker_thread_ = pthread_self();
    worker_known_.store(true, std::memory_order_release);  // pairs with the acquire in on_worker
    apply_setup();
    bool polled_idle = false;  // the last sleep ended at its poll limit: no spin before the next
    for (;;) {
      if (control_requested_.load(std::memory_order_relaxed)) {
        if (!take_control_requests(flush_target_)) break;
      }
      // The pass that completes a flush ticket sweeps every shard of a sharded queue (see "The
      // barrier"); other passes take what the queue's del_all gives.
      take_from_queue(/*sweep=*/flush_target_ != 0);
      // In a pool, an empty queue means: help a sibling first. A steal here, between taking
      // this pass's ticket and completing it, runs before any ticket requested after it.
      if (in_flight_.empty() && link_.steal != nullptr) {
        std::size_t taken = 0;
        in_flight_ = link_.steal(link_.pool, link_.index, taken);
        if (taken != 0) stolen_.fetch_add(taken, std::memory_order_relaxed);
      }
      const bool took = !in_flight_.empty();
      if (took) {
        if (link_.steal != nullptr) set_idle(false);
        run_in_flight();
        if (opts_.after_batch) call_after_batch();
      }
      // A batch a freeze handed back is not done: its flush waits for the pass that takes it
      // again. (The rest of a batch a sibling took is that sibling's; see "Flush with
      // stealing" in reaper_pool.hpp.)
      const bool handed_back = std::exchange(handed_back_, false);
      if (flush_target_ != 0 && !handed_back) {
        // A put-back since this pass began (see "The barrier") leaves the ticket for the next.
        if (!complete_flush(flush_target_)) continue;
        flush_target_ = 0;
      }
      if (took) {
        polled_idle = false;
        if (poll_ns_ != 0) poll_limit_ns_.store(poll_ns_, std::memory_order_relaxed);  // back to the short look
        continue;
      }
      if (link_.steal != nullptr) set_idle(true);  // a sibling's holding() may now wake this one
      lower_after_drain();
      // A worker that polls an idle queue does not spin at every look: the spin is for the
      // burst right after a batch or a kick.
      if (!polled_idle && spin_found_work()) continue;
      polled_idle = sleep_until_kicked() && poll_ns_ != 0;
      // Lazy polling: a look that ended at its limit doubles the next one (a pass that then
      // takes work brings it back to poll_interval).
      const std::uint64_t limit = poll_limit_ns_.load(std::memory_order_relaxed);
      if (polled_idle && poll_max_ns_ > poll_ns_ && last_sleep_limit_ns_ == limit) {  // not a pool's watch
        poll_limit_ns_.store(limit > poll_max_ns_ / 2 ? poll_max_ns_ : 2 * limit, std::memory_order_relaxed);
      }
    }
    // Stop: announce STOPPED first, then drain. A producer whose kick comes after the exchange
    // reads STOPPED and drains on its own thread, so the drain below ends even while
    // producers keep adding (draining first could be kept busy for ever).
    // acq_rel: acquire pairs with every producer's kick before ours (their adds are then
    // visible to the drain below); release pairs with enqueue's acquire loads.
    (void)state_.exchange(stopped_bit, std::memory_order_acq_rel);
    drain_on_worker();
    close_cpu_clock();
    // A stop_for that gave up, and whoever calls stop, flush or the destructor later, wait for
    // this (not for the join, which nobody may be doing yet).
    {
      const std::lock_guard nice_lock(nice_mutex_);
      worker_tid_ = 0;  // from here the id may be reused: set_nice must not name it
    }
    const std::lock_guard lock(control_mutex_);
    worker_done_ = true;
    control_changed_.notify_all();
  }

  void apply_setup() noexcept {
    std::uint32_t warnings = 0;
#if defined(__linux__)
    const std::string name = opts_.name.substr(0, 15);
    if (pthread_setname_np(pthread_self(), name.c_str()) != 0) warnings |= setup_warning_name;
    const int policy = opts_.policy == sched_policy::batch  ? SCHED_BATCH
                       : opts_.policy == sched_policy::idle ? SCHED_IDLE
                                                            : SCHED_OTHER;
    sched_param param{};
    if (sched_setscheduler(0, policy, &param) != 0) warnings |= setup_warning_policy;
    {
      // Under the mutex set_nice takes: its value and this thread's id are read as one.
      const std::lock_guard lock(nice_mutex_);
      worker_tid_ = static_cast<pid_t>(syscall(SYS_gettid));
      if (setpriority(PRIO_PROCESS, static_cast<id_t>(worker_tid_), nice_) != 0) warnings |= setup_warning_nice;
    }
    std::vector<int> cpus = opts_.cpus;
    try {
      if (cpus.empty()) cpus = detail::housekeeping_cpus();
    } catch (...) {
      cpus.clear();
    }
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int cpu : cpus) {
      if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(static_cast<std::size_t>(cpu), &set);
    }
    if (CPU_COUNT(&set) == 0 || sched_setaffinity(0, sizeof set, &set) != 0) warnings |= setup_warning_affinity;
#endif
    setup_warnings_.store(warnings, std::memory_order_relaxed);
  }

  // Takes the queue into in_flight_, in run order (opts_.order). The watchdog's clock is cleared BEFORE the take: an add
  // that lands after the clear is either in this take or, if after it, finds its clock clear
  // and starts it (enqueue), so a waiting item always has a clock. Cleared only when set, so
  // a poll of an idle queue writes no producer line. sweep: every shard of a sharded queue.
  void take_from_queue(bool sweep) noexcept {
    batch_since_ns_ = oldest_enqueue_ns_.load(std::memory_order_relaxed);
    if (batch_since_ns_ != 0) batch_since_ns_ = oldest_enqueue_ns_.exchange(0, std::memory_order_relaxed);
    in_flight_ = take_queue(sweep, opts_.order == drain_order::oldest_first);
  }

  // The queue's del_all; with sweep, every shard of a sharded queue (its flags aside). Oldest
  // first: del_all().reverse(), in one walk where the queue has a take for it
  // (sharded_llist::del_all_oldest_first; see detail::take_queue).
  llist_batch<T, Hook> take_queue(bool sweep, bool oldest_first) noexcept {
    return detail::take_queue<T, Hook>(queue_, sweep, oldest_first);
  }

  // Runs the batch held in in_flight_ (in run order: take_from_queue and the pool's steal
  // leave it so), with a checkpoint after each item.
  void run_in_flight() noexcept {
    batches_.fetch_add(1, std::memory_order_relaxed);
    const std::uint64_t since = std::exchange(batch_since_ns_, 0);
    if (since != 0) {
      const std::uint64_t now = sync_ops::now_ns();
      if (now > since && now - since > longest_wait_ns_.load(std::memory_order_relaxed)) {
        longest_wait_ns_.store(now - since, std::memory_order_relaxed);  // the worker is the only writer
      }
      // A batch that waited past boost_after: the worker was starved (or frozen) while it
      // waited, and will be again while it runs the batch.
      // The time limit of the worker's last sleep is its own choice, not a wait.
      if (boost_ns_ != 0 && now > since && now - since > boost_ns_ + last_sleep_limit_ns_) {
        (void)raise_worker("backlog");
      }
    }
    if (link_.steal == nullptr) {
      while (T* item = in_flight_.pop_front()) {
        tear_down(*item, /*on_worker=*/true);
        checkpoint();
      }
      return;
    }
    // In a pool: while an item runs, the rest of the batch waits in held_, where an idle
    // sibling may take it (see "In a pool" in the header comment); after the item, an exchange
    // takes back whatever is still there. The item about to run is already off the batch.
    bool announced = false;
    while (T* item = in_flight_.pop_front()) {
      const bool holding = !in_flight_.empty();
      if (holding) {
        const std::uint64_t now = sync_ops::now_ns();
        if (announced) {
          item_started_ns_.store(now, std::memory_order_relaxed);
        } else {
          // seq_cst: the batch's first start time pairs with the watchers' scan (reaper_pool.hpp,
          // "No lost watch").
          item_started_ns_.store(now, std::memory_order_seq_cst);
        }
        (void)held_.replace_all(std::move(in_flight_));  // empty: only this thread puts nodes there
        if (!announced) {
          announced = true;
          link_.holding(link_.pool, link_.index);
        }
      }
      tear_down(*item, /*on_worker=*/true);
      if (holding) in_flight_ = held_.del_all();  // ours again, or nothing: a sibling took it
      checkpoint();
    }
    if (announced) item_started_ns_.store(0, std::memory_order_relaxed);
  }

  // In a pool: "my last pass found nothing to run, here or at a sibling" (spinning or asleep).
  // Written only on a change; read by siblings' holding() (see "No lost watch" in
  // reaper_pool.hpp).
  void set_idle(bool idle) noexcept {
    if (idle_.load(std::memory_order_relaxed) == idle) return;
    if (idle) {
      idle_.store(true, std::memory_order_seq_cst);  // seq_cst: pairs with holding()'s scan
    } else {
      idle_.store(false, std::memory_order_relaxed);
    }
  }

  // Between items: honour a freeze, and yield if the yield policy says so. True if it looked at
  // the control requests (and may have parked).
  bool checkpoint() noexcept {
    if (opts_.yield_after.count() > 0) {
      const std::uint64_t now = sync_ops::now_ns();
      if (now - last_yield_ns_ > static_cast<std::uint64_t>(opts_.yield_after.count())) {
        sync_ops::yield();
        yields_.fetch_add(1, std::memory_order_relaxed);
        last_yield_ns_ = sync_ops::now_ns();
      }
    }
    if (control_requested_.load(std::memory_order_relaxed)) {
      std::unique_lock lock(control_mutex_);
      if (freeze_depth_ > 0 && !stop_requested_) (void)hand_back_in_flight();
      park_while_frozen(lock);
      return true;
    }
    return false;
  }

  // A freeze in the middle of a batch: the rest of the batch goes back on the queue, under (older
  // than) whatever was queued meanwhile, so that reap_on_caller reaches every item the frozen
  // worker has not started (a drain under memory pressure finds nothing stuck behind a freeze:
  // seed 003's thawing of an OOM victim, for the queue). The worker takes them again after thaw.
  // A producer racing the hand-back may land under them: an order slip, nothing lost. Worker
  // only; returns how many went back.
  std::size_t hand_back_in_flight() noexcept {
    if (in_flight_.empty()) return 0;
    std::size_t count = 0;
    llist_chain<T, Hook> rest;  // front = newest, as on the queue
    while (T* item = in_flight_.pop_front()) {
      ++count;
      if (opts_.order == drain_order::oldest_first) {
        rest.push_front(*item);  // in_flight_ ran oldest first
      } else {
        rest.push_back(*item);  // in_flight_ ran newest first
      }
    }
    llist_batch<T, Hook> newer = queue_.del_all();  // newest first
    llist_chain<T, Hook> on_top;
    while (T* item = newer.pop_front()) on_top.push_back(*item);
    (void)queue_.add_batch(std::move(rest));
    (void)queue_.add_batch(std::move(on_top));
    // The watchdog's clock starts now if nothing else had started it: stalled() then sees the
    // items waiting behind the freeze, as it sees a frozen backlog.
    std::uint64_t unset = 0;
    (void)oldest_enqueue_ns_.compare_exchange_strong(unset, sync_ops::now_ns(), std::memory_order_relaxed);
    handed_back_ = true;
    return count;
  }

  void park_while_frozen(std::unique_lock<mutex_type>& lock) noexcept {
    // A fork parks the worker even while it drains for stop(): the child must not copy an item
    // in the middle of fn.
    while ((freeze_depth_ > 0 && !stop_requested_) || fork_parking_) {
      worker_parked_ = true;
      control_changed_.notify_all();
      control_changed_.wait(lock);
    }
    worker_parked_ = false;
  }

  // Returns false when the worker must stop. Sets flush_target to the flush ticket this
  // iteration's del_all will satisfy.
  bool take_control_requests(std::uint64_t& flush_target) noexcept {
    std::unique_lock lock(control_mutex_);
    park_while_frozen(lock);
    if (stop_requested_) return false;
    if (flush_requested_ > flush_completed_) {
      flush_target = flush_requested_;
      pass_put_backs_ = put_backs_;  // a put-back after this, before the take, voids the pass
    }
    control_requested_.store(false, std::memory_order_relaxed);  // under control_mutex_
    return true;
  }

  // False, completing nothing, if items went back on the queue since the pass took its
  // ticket: the pass may have missed them, so the next one (already requested by the
  // put-back) takes the ticket again.
  bool complete_flush(std::uint64_t ticket) noexcept {
    const std::lock_guard lock(control_mutex_);
    if (put_backs_ != pass_put_backs_) {
      pass_put_backs_ = put_backs_;
      request_locked();
      return false;
    }
    flush_completed_ = std::max(flush_completed_, ticket);
    control_changed_.notify_all();
    return true;
  }

  bool spin_found_work() const noexcept {
    for (std::uint32_t poll = 0; poll < opts_.spin_polls; ++poll) {
      if (!queue_.empty() || control_requested_.load(std::memory_order_relaxed)) return true;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    return false;
  }

  // True if the sleep ended at its time limit rather than by a kick.
  bool sleep_until_kicked() noexcept {
    bool limited = false;  // slept with a time limit
    // acq_rel: acquire pairs with a producer's kick (its add is then visible to our next
    // del_all); release lets a later kick's acquire see our state.
    std::uint32_t previous = state_.exchange(sleeping_bit, std::memory_order_acq_rel);
    last_sleep_limit_ns_ = 0;
    if (!(previous & kicked_bit)) {
      // In a pool, a sibling may hold a batch: sleep no longer than the pool says. A polling
      // worker sleeps no longer than its interval: producers do not wake it.
      std::uint64_t most = link_.watch != nullptr ? link_.watch(link_.pool, link_.index) : no_watch;
      if (poll_ns_ != 0) most = std::min(most, poll_limit_ns_.load(std::memory_order_relaxed));
      if (most != no_watch) last_sleep_limit_ns_ = most;
      if (most == no_watch) {
        // Sleeps only while the word still says SLEEPING; a kick changes it first.
        while (state_.load(std::memory_order_relaxed) == sleeping_bit) sync_ops::futex_wait(state_, sleeping_bit);
      } else if (most != 0) {
        limited = true;
        const std::uint64_t until = sync_ops::now_ns() + most;
        for (std::uint64_t now = sync_ops::now_ns();
             state_.load(std::memory_order_relaxed) == sleeping_bit && now < until; now = sync_ops::now_ns()) {
          sync_ops::futex_wait_for(state_, sleeping_bit, until - now);
        }
      }
    }
    // acq_rel: reading KICKED (set before or while we slept) synchronizes with that producer.
    previous = state_.exchange(0, std::memory_order_acq_rel);
    const bool timed_out = limited && previous == sleeping_bit;  // nobody kicked: the limit ended it
    if (timed_out) polls_.fetch_add(1, std::memory_order_relaxed);
    return timed_out;
  }

  void drain_on_worker() noexcept {
    for (;;) {
      take_from_queue(/*sweep=*/true);
      if (in_flight_.empty()) return;
      run_in_flight();
    }
  }

  // ---- tearing down -------------------------------------------------------------------------

  // Inside a catch handler: counts the error and hands it to on_error.
  void report_error() noexcept {
    errors_.fetch_add(1, std::memory_order_relaxed);
    if (opts_.on_error) {
      try {
        opts_.on_error(std::current_exception());
      } catch (...) {  // on_error's own failure must not take the backlog down with it
      }
    }
  }

  // CLOCK_THREAD_CPUTIME_ID is a real syscall (no vDSO), so items are timed one by one only
  // when their type asks to be charged; the worker's total is read by stats() instead.
  void tear_down(T& item, bool on_worker) noexcept {
    std::atomic<std::uint64_t>* owner = nullptr;
    std::uint64_t cpu_before = 0;
    if constexpr (cpu_accounted<T>) {
      owner = teardown_cpu_owner(item);
      if (owner != nullptr) cpu_before = detail::thread_cpu_ns();
    }
    try {
      fn_(item);  // may free item
    } catch (...) {
      report_error();
    }
    if constexpr (cpu_accounted<T>) {
      if (owner != nullptr) owner->fetch_add(detail::thread_cpu_ns() - cpu_before, std::memory_order_relaxed);
    }
    if (!on_worker) inline_reaped_.fetch_add(1, std::memory_order_relaxed);
    reaped_.fetch_add(1, std::memory_order_relaxed);
  }

  void tear_down_inline(T& item) noexcept { tear_down(item, /*on_worker=*/false); }

  void call_after_batch() noexcept {
    try {
      opts_.after_batch();
    } catch (...) {
      report_error();
    }
  }

  // On a caller: takes whatever is queued (each node goes to exactly one taker) and tears it
  // down here, oldest first. First what a fork child's parked worker held (in held_, in run
  // order; see "Fork").
  void drain_inline() noexcept {
    if (!held_.empty()) {
      for (T& item : held_.del_all()) tear_down_inline(item);
    }
    for (;;) {
      // A fork child's first drain sweeps: a producer of the parent may have pushed onto a
      // shard and not flagged it, and that producer is not here to do it.
      const bool sweep = child_sweep_.load(std::memory_order_relaxed) &&
                         child_sweep_.exchange(false, std::memory_order_relaxed);
      auto batch = take_queue(sweep, /*oldest_first=*/true);
      if (batch.empty()) return;
      for (T& item : batch) tear_down_inline(item);
    }
  }

  // ---- control plane ------------------------------------------------------------------------

  // Ends a reap_on_caller: puts the declined items back and lets waiting flushes finish. A
  // flush ticket the worker completed while this call held items proves nothing about them,
  // so such tickets are completed again by the worker's next pass over the queue.
  // Ends a reap_on_caller: puts the declined items back and lets waiting flushes finish. A put-
  // back voids the worker's pass in progress and every flush ticket completed since this call
  // began (those passes may have run while this call held the items): the worker's next pass
  // completes them again (see "The barrier"). Runs inside the call's hand.
  void finish_caller_reap(llist_chain<T, Hook>&& declined, std::uint64_t completed_before) noexcept {
    // Stopped already (an RMW that changes nothing: like the kick below, it is ordered against
    // the worker's STOPPED exchange): no worker will take them, and a put-back now could hand
    // an item enqueued before a settling flush to a hand counted after its flip, which that
    // flush does not wait for. Torn down here instead, inside this call's hand. Not stopped:
    // this call began before the worker ended, so a flush after stop waits for it
    // (caller_reaps_) and a put-back is safe.
    if (!declined.empty() && (state_.fetch_add(0, std::memory_order_acq_rel) & stopped_bit)) {
      while (T* item = declined.pop_front()) tear_down_inline(*item);
    }
    const bool requeued = !declined.empty();
    if (requeued) {
      const bool first = queue_.add_batch(std::move(declined));
      if (first) oldest_enqueue_ns_.store(sync_ops::now_ns(), std::memory_order_relaxed);
      if (first && opts_.driven && !(state_.load(std::memory_order_relaxed) & stopped_bit)) signal_work();
      // An RMW, not a load: like enqueue's kick, it is ordered against the worker's STOPPED
      // exchange, so either the worker's final drain sees the items put back or this sees
      // STOPPED and tears them down here, still inside this call's hand.
      if (kick() & stopped_bit) drain_inline();
    }
    std::unique_lock lock(control_mutex_);
    --caller_reaps_;
    if (requeued) {
      ++put_backs_;
      if (flush_completed_ > completed_before) flush_completed_ = completed_before;
    }
    const bool flush_waits = flush_requested_ > flush_completed_;
    if (flush_waits) request_locked();
    control_changed_.notify_all();
    lock.unlock();
    if (flush_waits) (void)kick();  // after the request: the worker looks at it
  }

  // Hands (see "The barrier"): a caller that takes items off the queue outside the worker (an
  // inline drain after stop, a reap_on_caller) counts itself on the side that hand_side_bit
  // names before its take, and uncounts after its last teardown. A flush after stop drains,
  // flips the side, and waits for the old side to empty.
  static constexpr std::uint64_t hand_side_bit = std::uint64_t{1} << 63;
  static constexpr std::uint64_t hand_unit(bool side) noexcept { return side ? std::uint64_t{1} << 32 : 1; }

  std::uint64_t open_hand() noexcept {
    std::uint64_t seen = inline_hands_.load(std::memory_order_relaxed);
    std::uint64_t unit = 0;
    // acq_rel: pairs with the flusher's flip. Counted before the flip: the flusher sees us. After
    // it: we read the flip, so the flusher's own drain happened before our take, and everything
    // we take was added after that drain.
    do {
      unit = hand_unit((seen & hand_side_bit) != 0);
    } while (!inline_hands_.compare_exchange_weak(seen, seen + unit, std::memory_order_acq_rel,
                                                  std::memory_order_relaxed));
    return unit;
  }

  void close_hand(std::uint64_t unit) noexcept {
    // release: pairs with the flusher's acquire read of zero: our teardowns happen before its
    // flush returns.
    inline_hands_.fetch_sub(unit, std::memory_order_release);
  }

  // drain_inline() as a hand: the path of enqueue after stop and in a fork child.
  void drain_inline_counted() noexcept {
    const std::uint64_t unit = open_hand();
    drain_inline();
    close_hand(unit);
  }

  // Under control_mutex_: waits until no reap_on_caller is in progress. False: the deadline
  // passed first.
  bool await_no_caller_reaps(std::unique_lock<mutex_type>& lock, typename clock_type::time_point deadline) {
    const auto no_caller_reaps = [&] { return caller_reaps_ == 0; };
    if (deadline == clock_type::time_point::max()) {
      control_changed_.wait(lock, no_caller_reaps);
      return true;
    }
    return control_changed_.wait_until(lock, deadline, no_caller_reaps);
  }

  // After the worker ended (or in a fork child): waits for every reap_on_caller in progress,
  // tears down what is queued, then waits out every hand counted before that. Flushers take
  // turns from their drain on, so each flip leaves only older hands on the side waited for. False: the deadline
  // passed first.
  bool settle_after_stop(typename clock_type::time_point deadline) {
    {
      std::unique_lock lock(control_mutex_);
      if (!await_no_caller_reaps(lock, deadline)) return false;
    }
    // One settler at a time from its drain on: a settler's own drain is not a hand, so a second
    // settler must not flip and wait out the old side while the first still tears down what
    // its drain took (the checks of tests/model/flush_barrier.pml found that schedule).
    // A deadline is polled, not passed to a timed lock: the sanitizers' runtimes do not all
    // intercept pthread_mutex_clocklock.
    std::unique_lock turn(settle_mutex_, std::defer_lock);
    if (deadline == clock_type::time_point::max()) {
      turn.lock();
    } else {
      while (!turn.try_lock()) {
        if (clock_type::now() >= deadline) return false;
        sync_ops::sleep_for(std::chrono::microseconds(50));
      }
    }
    drain_inline();
    // acq_rel: pairs with open_hand (see there).
    const std::uint64_t before = inline_hands_.fetch_xor(hand_side_bit, std::memory_order_acq_rel);
    const std::uint64_t side_mask = (before & hand_side_bit) != 0 ? (std::uint64_t{0x7fffffff} << 32) : 0xffffffffu;
    // acquire: pairs with close_hand's release decrement.
    for (unsigned spins = 0; (inline_hands_.load(std::memory_order_acquire) & side_mask) != 0; ++spins) {
      if (clock_type::now() >= deadline) return false;
      if (spins < 1000) {
        sync_ops::yield();
      } else {
        sync_ops::sleep_for(std::chrono::microseconds(50));  // a teardown that takes long
      }
    }
    return true;
  }

  // Under control_mutex_: tell the worker to look at the requests.
  void request_locked() noexcept { control_requested_.store(true, std::memory_order_relaxed); }

  // Returns the state word before the kick.
  std::uint32_t kick() noexcept {
    // acq_rel for the same reasons as in enqueue.
    const std::uint32_t previous = state_.fetch_or(kicked_bit, std::memory_order_acq_rel);
    if (previous & sleeping_bit) sync_ops::futex_wake_one(state_);
    return previous;
  }

  // A stop in two steps, so that a pool can ask every worker before it waits for any. Step one:
  // the worker drains the queue and ends (a freeze does not hold it: stop overrides it).
  void request_stop() noexcept {
    std::unique_lock lock(control_mutex_);
    if (!worker_running_ || stop_requested_) return;
    stop_requested_ = true;
    request_locked();
    control_changed_.notify_all();  // a worker parked by a freeze: stop overrides it
    lock.unlock();
    kick();
  }

  // Step two: waits, until `deadline`, for the worker to end; then joins it (the first caller to
  // see it ended does; the others wait for that join, which does not block) and tears down
  // here what producers queued while it ended. False: the deadline passed, nothing changed.
  bool await_stop(typename clock_type::time_point deadline) {
    std::unique_lock lock(control_mutex_);
    const auto ended = [&] { return worker_done_ || !worker_running_; };
    if (deadline == clock_type::time_point::max()) {
      control_changed_.wait(lock, ended);
    } else if (!control_changed_.wait_until(lock, deadline, ended)) {
      return false;
    }
    if (worker_running_ && !worker_joining_) {
      worker_joining_ = true;
      lock.unlock();
      if (const int error = sync_ops::join_thread(worker_); error != 0) std::terminate();
      lock.lock();
      worker_known_.store(false, std::memory_order_relaxed);  // its pthread_t may be reused
      worker_running_ = false;
      control_changed_.notify_all();
    } else {
      control_changed_.wait(lock, [&] { return !worker_running_; });
    }
    lock.unlock();
    // A fork child, items whose producers raced the end of the worker, and everything in
    // a caller's hands.
    return settle_after_stop(deadline);
  }

  // See detail::stop_on_own_worker. The item whose fn called exit() is already off in_flight_,
  // and exit() never returns to it, so nothing runs twice.
  void stop_here_on_own_worker() noexcept {
    {
      const std::lock_guard lock(control_mutex_);
      stop_requested_ = true;
      request_locked();
      control_changed_.notify_all();
    }
    // acq_rel, as the worker's own STOPPED exchange at the end of worker_main: acquire pairs
    // with every producer's kick before it (their adds are visible to the drain below); release
    // pairs with enqueue's acquire loads, so producers tear down inline from now on.
    (void)state_.exchange(stopped_bit, std::memory_order_acq_rel);
    for (;;) {
      while (T* item = in_flight_.pop_front()) tear_down(*item, /*on_worker=*/true);
      in_flight_ = take_queue(/*sweep=*/false, opts_.order == drain_order::oldest_first);
      if (in_flight_.empty()) return;
    }
  }

  bool flush_until(typename clock_type::time_point deadline) {
    refuse_on_worker("flush");
    if (opts_.driven) return drive_flush(deadline);
    return await_flush(request_flush(), deadline);
  }

  // A flush in two steps, so that a pool can ask every worker before it waits for any. The
  // ticket: 0 when the reaper is stopped or stopping (the stop drains everything).
  std::uint64_t request_flush() noexcept {
    std::unique_lock lock(control_mutex_);
    if (!worker_running_ || stop_requested_) return 0;
    const std::uint64_t ticket = ++flush_requested_;
    request_locked();
    lock.unlock();
    kick();
    return ticket;
  }

  bool await_flush(std::uint64_t ticket, typename clock_type::time_point deadline) {
    std::unique_lock lock(control_mutex_);
    // Ticket 0: stopped, or stopping; the stop drains everything. Either way, once the worker
    // has ended, what it did not tear down is on the queue or in a caller's hands.
    const auto worker_gone = [&] { return !worker_running_ || worker_done_; };
    const auto done = [&] {
      return (ticket != 0 && flush_completed_ >= ticket && caller_reaps_ == 0) || worker_gone();
    };
    if (boost_ns_ != 0 && !done()) {
      // Waited boost_after and still waiting: raise the worker (see "Boost"). Under the control
      // mutex, so the worker completes this ticket, and then lowers itself, after the raise.
      const auto boost_at = clock_type::now() + opts_.boost_after;
      if (!control_changed_.wait_until(lock, std::min(boost_at, deadline), done)) {
        if (clock_type::now() >= deadline) return false;
        priority_change change;
        (void)raise_worker("flush", change);
        lock.unlock();
        change.emit(opts_.trace_domain);
        lock.lock();
      }
    }
    if (deadline == clock_type::time_point::max()) {
      control_changed_.wait(lock, done);
    } else if (!control_changed_.wait_until(lock, deadline, done)) {
      return false;
    }
    if (ticket != 0 && flush_completed_ >= ticket && caller_reaps_ == 0) return true;
    lock.unlock();
    return settle_after_stop(deadline);
  }

  bool on_worker() const noexcept {
    // acquire: pairs with the release in worker_main, so worker_thread_ is readable.
    return worker_known_.load(std::memory_order_acquire) && pthread_equal(worker_thread_, pthread_self());
  }

  void refuse_on_worker(const char* operation) const {
    if (on_worker()) {
      throw std::logic_error(std::string("teardown::reaper::") + operation +
                             ": called from the reaper's own worker (fn); it would wait for itself");
    }
    if (reaping_here_ == this) {
      throw std::logic_error(std::string("teardown::reaper::") + operation +
                             ": called from take or fn inside reap_on_caller; it would wait for itself");
    }
    if (driving_here_ == this) {
      throw std::logic_error(std::string("teardown::reaper::") + operation +
                             ": called from fn inside the reaper's own run or flush; it would wait for itself");
    }
  }

  // ---- driven mode --------------------------------------------------------------------------

  // Tells the program that run() has work: work_fd, then on_work. Counted in wakeups.
  void signal_work() noexcept {
    wakeups_.fetch_add(1, std::memory_order_relaxed);
    const std::uint64_t one = 1;
    (void)!::write(work_fd_, &one, sizeof one);  // EAGAIN only with the counter near 2^64: still readable
    if (opts_.on_work) {
      try {
        opts_.on_work(drive_handle(gate_));
      } catch (...) {
        report_error();
      }
    }
  }

  // Under the drive lock: take the queue into in_flight_ as the worker's pass does.
  void take_driven(bool sweep) noexcept {
    take_from_queue(sweep);
    if (in_flight_.empty()) return;
    batches_.fetch_add(1, std::memory_order_relaxed);
    const std::uint64_t since = std::exchange(batch_since_ns_, 0);
    const std::uint64_t now = since != 0 ? sync_ops::now_ns() : 0;
    if (since != 0 && now > since && now - since > longest_wait_ns_.load(std::memory_order_relaxed)) {
      longest_wait_ns_.store(now - since, std::memory_order_relaxed);  // written under the drive lock only
    }
  }

  // Under the drive lock: one item of in_flight_, and the after-batch hook when it was the last.
  void run_one_driven() noexcept {
    T* item = in_flight_.pop_front();
    tear_down(*item, /*on_worker=*/true);
    if (in_flight_.empty() && opts_.after_batch) call_after_batch();
  }

  // Under the drive lock, between items: true if a freeze holds the driver (the rest of its
  // batch is then back on the queue, where reap_on_caller reaches it). With wait, parks until
  // thaw, stop or `deadline` instead (false at the deadline: `expired`).
  bool driven_frozen(bool wait, typename clock_type::time_point deadline, bool& expired) {
    if (!control_requested_.load(std::memory_order_relaxed)) return false;
    std::unique_lock lock(control_mutex_);
    if (freeze_depth_ == 0 || stop_requested_) {
      if (freeze_depth_ == 0) control_requested_.store(false, std::memory_order_relaxed);  // under control_mutex_
      return false;
    }
    (void)hand_back_in_flight();
    handed_back_ = false;
    driver_parked_ = true;
    control_changed_.notify_all();
    if (!wait) return true;
    const auto thawed = [&] { return freeze_depth_ == 0 || stop_requested_; };
    if (deadline == clock_type::time_point::max()) {
      control_changed_.wait(lock, thawed);
    } else if (!control_changed_.wait_until(lock, deadline, thawed)) {
      expired = true;
    }
    driver_parked_ = false;
    return true;
  }

  // driving_ on (under control_mutex_) while this thread tears down, driving_here_ for fn.
  struct driving_scope {
    reaper& self;
    const reaper* previous;
    explicit driving_scope(reaper& owner) noexcept : self(owner), previous(std::exchange(driving_here_, &owner)) {}
    ~driving_scope() {
      driving_here_ = previous;
      const std::lock_guard lock(self.control_mutex_);
      self.driving_ = false;
      self.driver_parked_ = false;
      self.control_changed_.notify_all();
    }
  };

  // Lock-free check the next run would find something: the held rest or the queue.
  bool driven_more() const noexcept { return !in_flight_.empty() || !queue_.empty(); }

  drive_result run_locked(drive_limits limits) {
    std::uint64_t value = 0;
    // Read before the take: an add after the take finds the queue empty and signals again.
    (void)!::read(work_fd_, &value, sizeof value);
    {
      const std::lock_guard lock(control_mutex_);
      if (stop_requested_) return {};
      if (freeze_depth_ > 0) {
        (void)hand_back_in_flight();  // a frozen reaper holds nothing; thaw signals
        handed_back_ = false;
        return {};
      }
      driving_ = true;
    }
    const driving_scope scope(*this);
    const bool timed = limits.time != std::chrono::nanoseconds::max();
    const std::uint64_t start = timed ? sync_ops::now_ns() : 0;
    const std::uint64_t budget_ns = limits.time.count() > 0 ? static_cast<std::uint64_t>(limits.time.count()) : 0;
    drive_result result;
    bool expired = false;
    while (result.items < limits.items) {
      if (driven_frozen(/*wait=*/false, clock_type::time_point::max(), expired)) return {result.items, false};
      if (in_flight_.empty()) take_driven(/*sweep=*/false);
      if (in_flight_.empty()) break;
      run_one_driven();
      ++result.items;
      if (timed && sync_ops::now_ns() - start >= budget_ns) break;
    }
    result.more = driven_more();
    if (result.more) signal_work();
    return result;
  }

  // flush() when driven: tears down on the caller, under the drive lock, the held rest and
  // everything on the queue at one take after it (so producers cannot keep it going), then waits
  // for every reap_on_caller in progress; a put-back meanwhile means one more round. A freeze
  // parks it (holding nothing) until thaw or the deadline.
  bool drive_flush(typename clock_type::time_point deadline) {
    if constexpr (planted_flush_skips_drive_lock) {
      for (T& item : take_queue(/*sweep=*/true, /*oldest_first=*/true)) tear_down(item, /*on_worker=*/true);
      return true;
    }
    std::unique_lock drive(drive_mutex_, std::defer_lock);
    if (!lock_before(drive, deadline)) return false;
    std::uint64_t put_backs = 0;
    {
      std::unique_lock lock(control_mutex_);
      if (state_.load(std::memory_order_relaxed) & stopped_bit) {  // stop has drained (it held the drive lock)
        lock.unlock();
        drive.unlock();
        return settle_after_stop(deadline);
      }
      driving_ = true;
      put_backs = put_backs_;
    }
    const driving_scope scope(*this);
    for (;;) {
      bool took = false;
      bool expired = false;
      for (;;) {
        if (driven_frozen(/*wait=*/true, deadline, expired)) {
          if (expired) return false;
          took = false;  // what was handed back is on the queue again
        }
        if (in_flight_.empty()) {
          if (took) break;
          take_driven(/*sweep=*/true);
          took = true;
          if (in_flight_.empty()) break;
        }
        run_one_driven();
      }
      std::unique_lock lock(control_mutex_);
      if (!await_no_caller_reaps(lock, deadline)) return false;
      if (put_backs_ == put_backs) break;
      put_backs = put_backs_;
    }
    if (driven_more()) signal_work();  // added meanwhile: the take above left it
    return true;
  }

  // stop() when driven: from the STOPPED exchange on, producers tear down inline (as after a
  // worker's end); what was queued or held is torn down here, then the hands are waited out.
  bool drive_stop(typename clock_type::time_point deadline) {
    {
      const std::lock_guard lock(control_mutex_);
      stop_requested_ = true;
      control_changed_.notify_all();  // a flush parked by a freeze: stop overrides it
    }
    std::unique_lock drive(drive_mutex_, std::defer_lock);
    if (!lock_before(drive, deadline)) return false;
    if (!(state_.load(std::memory_order_relaxed) & stopped_bit)) {
      // acq_rel, as the worker's STOPPED exchange: acquire pairs with every producer's kick
      // before it (their adds are visible to the drain below); release pairs with enqueue's
      // acquire loads, so producers tear down inline from now on.
      (void)state_.exchange(stopped_bit, std::memory_order_acq_rel);
      const reaper* previous = std::exchange(driving_here_, this);
      for (;;) {
        while (!in_flight_.empty()) run_one_driven();
        take_driven(/*sweep=*/true);
        if (in_flight_.empty()) break;
      }
      driving_here_ = previous;
    }
    drive.unlock();
    return settle_after_stop(deadline);
  }

  // A deadline is polled, not passed to a timed lock (see settle_after_stop).
  bool lock_before(std::unique_lock<mutex_type>& lock, typename clock_type::time_point deadline) {
    if (deadline == clock_type::time_point::max()) {
      lock.lock();
      return true;
    }
    while (!lock.try_lock()) {
      if (clock_type::now() >= deadline) return false;
      sync_ops::sleep_for(std::chrono::microseconds(50));
    }
    return true;
  }

  // A bug planted for tests/schedule (a Sync policy that declares it): a driven flush that
  // does not take the drive lock, draining only the queue, so it can return while another
  // caller's run is in fn or holds the rest of its batch.
  static constexpr bool planted_flush_skips_drive_lock = [] {
    if constexpr (requires { sync_ops::planted_flush_skips_drive_lock; }) {
      return sync_ops::planted_flush_skips_drive_lock;
    } else {
      return false;
    }
  }();

  // ---- boost -------------------------------------------------------------------------------

  // A priority change to trace once no lock of ours is held (a hook may call into the reaper).
  struct priority_change {
    pid_t tid = 0;  // 0: nothing changed
    int before = 0;
    int after = 0;
    const char* reason = nullptr;
    void emit(std::uint64_t domain) const noexcept {
      if (tid != 0) trace::boost(tid, before, after, reason, domain);
    }
  };

  // See "Boost". Any thread; takes nice_mutex_ (which may nest inside control_mutex_, never the
  // other way round). True if the worker now runs at the boost's nice or a more urgent one.
  bool raise_worker(const char* reason, priority_change& change) noexcept {
    std::optional<int> target = opts_.boost_nice;
    if (!target) target = on_worker() ? creator_nice_ : detail::calling_thread_nice();
    if (!target) return false;
    const std::lock_guard lock(nice_mutex_);
    if (worker_tid_ == 0) return false;
    const int current = boosted_.load(std::memory_order_relaxed) ? boosted_nice_ : nice_;
    if (*target >= current) return true;
    change = {worker_tid_, current, *target, reason};
    if (setpriority(PRIO_PROCESS, static_cast<id_t>(worker_tid_), *target) != 0) {
      boosts_refused_.fetch_add(1, std::memory_order_relaxed);
      change.reason = "refused";
      return false;
    }
    boosted_nice_ = *target;
    boosted_.store(true, std::memory_order_relaxed);  // under nice_mutex_
    boosts_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  bool raise_worker(const char* reason) noexcept {
    priority_change change;
    const bool raised = raise_worker(reason, change);
    change.emit(opts_.trace_domain);
    return raised;
  }

  // On the worker, when a pass found its queue empty: back to its own nice. A raise that lands
  // after the hint below was read is lowered at the next empty pass. Raising the nice value
  // back is never refused.
  void lower_after_drain() noexcept {
    if (!boosted_.load(std::memory_order_relaxed)) return;
    priority_change change;
    {
      const std::lock_guard lock(nice_mutex_);
      if (!boosted_.load(std::memory_order_relaxed)) return;  // set_nice ended it
      (void)setpriority(PRIO_PROCESS, static_cast<id_t>(worker_tid_), nice_);
      boosted_.store(false, std::memory_order_relaxed);
      change = {worker_tid_, boosted_nice_, nice_, "drained"};
    }
    change.emit(opts_.trace_domain);
  }

  // ---- fork ---------------------------------------------------------------------------------

  // See "Fork". With fork_policy::never_wait, prepare and parent do nothing: no lock the worker
  // may hold is taken and nothing waits for the worker.
  bool parks_for_fork() const noexcept { return opts_.on_fork == fork_policy::wait_for_item && !on_worker(); }

  void fork_prepare() noexcept override {
    if (!parks_for_fork()) return;
    std::unique_lock lock(control_mutex_);
    if (worker_running_) {
      fork_parking_ = true;
      request_locked();
      control_changed_.notify_all();
      lock.unlock();
      kick();
      lock.lock();
      // Parked between items, or gone (a stop() that was joining it has finished).
      control_changed_.wait(lock, [&] { return worker_parked_ || !worker_running_ || worker_done_; });
    }
    lock.release();  // stays locked across fork(); parent/child unlock it
  }

  void fork_parent() noexcept override {
    // A fork doubles what the parent's pages may cost (copy on write): a lazy worker looks now.
    if (poll_ns_ != 0 && !on_worker()) (void)hurry();
    if (!parks_for_fork()) return;
    fork_parking_ = false;
    control_changed_.notify_all();
    control_mutex_.unlock();
  }

  void fork_child() noexcept override {
    if (on_worker() || driving_here_ == this) {
      // fork() from inside fn: the child's only thread is a copy of the worker in the middle
      // of fn. Such a child may only exec or _exit; enqueue there tears down inline.
      state_.store(stopped_bit, std::memory_order_relaxed);
      return;
    }
    // Single-threaded here. The worker does not exist in the child: become the stopped form.
    const bool parked = parks_for_fork();
    if (parked) {
      // What the parked worker still held moves to held_ whole (one exchange, not a walk: a
      // fork must not cost time in proportion to the backlog, nor touch the items' pages),
      // where the child's next enqueue, flush, stop or destructor tears it down (drain_inline).
      (void)held_.replace_all(std::move(in_flight_));  // held_ is empty: taken back before parking
    } else {
      // The worker was running when fork() copied memory: what it had taken is the parent's
      // teardown in progress, copied at an instruction the child cannot know. Forget it
      // unread (both are plain pointer writes; no item is touched).
      std::move(in_flight_).forget();
      held_.del_all().forget();
      // A thread that held the control mutex (the worker, a flush) is not here: start it over.
      // No thread waits here, so no flush is outstanding.
      new (&control_mutex_) mutex_type;
      // Driven: a run or flush on another thread held the drive lock, and that thread is not here.
      new (&drive_mutex_) mutex_type;
      driving_ = false;
      driver_parked_ = false;
      flush_completed_ = flush_requested_;
      worker_joining_ = false;
    }
    worker_running_ = false;
    worker_parked_ = false;
    fork_parking_ = false;
    freeze_depth_ = 0;
    worker_tid_ = 0;
    stop_requested_ = true;
    worker_known_.store(false, std::memory_order_relaxed);
    state_.store(stopped_bit, std::memory_order_relaxed);
    child_sweep_.store(true, std::memory_order_relaxed);
    inline_hands_.store(0, std::memory_order_relaxed);  // the other threads' hands are not here
    caller_reaps_ = 0;
    boosted_.store(false, std::memory_order_relaxed);
    // nice_mutex_ is not held across fork (see "Fork"): a thread that held it is not here.
    new (&nice_mutex_) mutex_type;
    new (&settle_mutex_) mutex_type;
    // The parked worker was a waiter on control_changed_; it does not exist here, and glibc's
    // pthread_cond_destroy would wait for it forever. Start over with a fresh one.
    new (&control_changed_) condition_type;
    if (parked) control_mutex_.unlock();
  }

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

  const pool_link link_;
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
  atomic<std::uint64_t> item_started_ns_{0};  // in a pool: when the item now run with a
                                                   // held rest started; 0: nothing held
  atomic<bool> watching_{false};  // in a pool: asleep with a time limit (see watch)
  atomic<std::uint64_t> stolen_{0};
  atomic<bool> idle_{false};  // see set_idle
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

  // Control plane: guarded by control_mutex_.
  alignas(64) mutable mutex_type control_mutex_;
  condition_type control_changed_;
  atomic<bool> control_requested_{false};  // written under control_mutex_; read as a hint
  bool worker_running_ = false;
  bool worker_parked_ = false;
  bool stop_requested_ = false;
  bool worker_done_ = false;     // worker_main has ended (it may not be joined yet)
  bool worker_joining_ = false;  // a stopper is joining the worker
  bool fork_parking_ = false;  // between fork_prepare and fork_parent/child
  std::uint64_t freeze_depth_ = 0;
  int nice_ = opts_.nice;  // set_nice's; applied by the worker at its start (nice_mutex_)
  pid_t worker_tid_ = 0;   // the worker's thread id while it runs; 0 before and after (nice_mutex_)
  int boosted_nice_ = 0;   // the nice a boost raised the worker to, while boosted_ (nice_mutex_)
  atomic<bool> boosted_{false};  // written under nice_mutex_; read by the worker as a hint
  std::uint64_t flush_requested_ = 0;
  std::uint64_t flush_completed_ = 0;
  std::uint64_t caller_reaps_ = 0;  // reap_on_caller calls in progress
  std::uint64_t put_backs_ = 0;       // reap_on_caller put-backs so far (see "The barrier")
  std::uint64_t pass_put_backs_ = 0;  // put_backs_ when the worker's pass took its flush ticket

  // See open_hand: bit 63 the side new hands count on, bits 0-31 side 0's count, 32-62 side 1's.
  atomic<std::uint64_t> inline_hands_{0};
  mutex_type settle_mutex_;  // flushers after stop take turns (settle_after_stop)
  // Guards nice_, worker_tid_ and the boost; never held across fork(), and taken inside
  // control_mutex_ at most (a flush's boost), never around it, so fn may
  // call nice()/set_nice() of any reaper while a fork() parks its worker.
  mutable mutex_type nice_mutex_;

  // The reaper whose reap_on_caller runs on this thread, if any.
  static inline thread_local const reaper* reaping_here_ = nullptr;

  // Driven mode. in_flight_ holds the rest of a run's batch between runs, under drive_mutex_,
  // which every run, driven flush and driven stop holds while it tears down (taken before
  // control_mutex_, never inside it but for freeze's try_lock).
  int work_fd_ = -1;
  mutex_type drive_mutex_;
  bool driving_ = false;        // a run or flush is tearing down (control_mutex_)
  bool driver_parked_ = false;  // that flush waits for a thaw, holding nothing (control_mutex_)
  std::shared_ptr<detail::drive_gate> gate_;
  // The reaper whose run, flush or stop tears down on this thread, if any.
  static inline thread_local const reaper* driving_here_ = nullptr;
};

template <class Reaper>
bool detail::stop_on_own_worker(Reaper& reaper) noexcept {
  if (!reaper.on_worker()) return false;
  reaper.stop_here_on_own_worker();
  return true;
}

template <class Reaper>
bool detail::boost_for_waiter(Reaper& reaper, const char* reason) noexcept {
  return reaper.boost_ns_ != 0 && reaper.raise_worker(reason);
}

}  // namespace teardown
