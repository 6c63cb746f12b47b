// The RFC's robustness matrix ("Robustness testing" in the cover letter of seed 000), run on the
// model: one row per scenario, printed as a table with its counters and PASS/FAIL.
//
//   stress_matrix                 short mode (CI): simulated memory, the RFC's sizes in pages
//   stress_matrix --long          real memory (anonymous mappings, touched, unmapped by teardown)
//                                 and twice the repetitions; needs about 10 GiB of free RAM and a
//                                 few minutes (it faults in and frees some 80 GiB in all)
//   stress_matrix --workers N     every row on pooled_mm_system, a reaper_pool of N mm_reaper
//                                 workers (RFC open question 2; 1 <= N <= 1024), instead of
//                                 mm_system's single mm_reaper; combines with --long
//
// Every row runs on a fresh kernel (mm_system, or pooled_mm_system with opts.pool.workers = N and
// the row's other options unchanged) and ends with the same checks: nothing lost and nothing
// torn down twice (each mm's teardown count is exactly 1), queued + sync = final exits,
// rejected <= sync, reaped = queued and pending = 0 after a flush, the mm_reaper's own
// statistics (a pool's: its workers' sums) agreeing with vmstat (as many enqueued as queued, as
// many reaped as reaped, none failed), and the budget's cap held throughout: a monitor thread
// samples the pending counter while the row runs, and the budget's high-water mark (the
// largest total ever admitted) must stay at or under the cap. Under add-then-check the counter
// itself may exceed the cap for an instant while a failing reserve takes its charge back; the
// table counts those samples separately.
//
// With a pool (--workers N). A pool tears every queued mm down exactly once, and freeze, thaw,
// flush, drain and shutdown act on every worker; it keeps no order between mms that different
// threads queued, and its statistics are its workers' sums. Every row's checks hold for it as
// they stand, unweakened and none skipped, because none relies on what a pool gives up:
//   - the frozen-backlog rows (oom kill during backlog, toggle off mid-drain, freeze/thaw,
//     charge memoisation, drain, shutdown, oom kill + drain while frozen) count reaped mms only
//     after a flush, a shutdown or a drain, all of which cover every worker; "nothing reaped
//     while frozen" holds because a pool's freeze parks every worker and refuses steals;
//   - the only order checked is drain's oldest first, among mms one thread queued: kept by a
//     pool (that thread's worker drains its queue oldest first; see pressure_drain);
//   - backpressure and the kill storms test the budget and the gate on the exit path, which
//     one budget and one in-flight count serve whichever worker takes the mm; the swap-batch
//     storm runs with the deferral of mms off (its swap-release worker and the oom_reaper are
//     single threads on either kernel), so on a pool it checks that the pool changes nothing;
//   - no check assumes the mm_reaper is one thread: the trace recorder is locked, the reap
//     events' sums do not depend on which thread tore what down, and the reaper statistics
//     checks compare sums with sums.
// Before the rows a pre-flight checks that the kernel really runs the mm_reaper threads asked
// for (one "mm_reaper", or N named "mm_reaper-<i>"), so that a pool run cannot silently fall
// back to one worker.
//
// Exit status: 0 when every row passes; 2 on a usage error.
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <latch>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <vector>

#include "teardown/model/mm.hpp"
#include "test_support.hpp"

namespace {

using teardown::decision;
using namespace teardown::model;
template <class System>
using task_ptr = std::unique_ptr<typename System::task>;

struct run_mode {
  backing memory = backing::simulated;
  int repeat = 1;           // multiplies the repetition counts
  std::size_t workers = 0;  // --workers N: rows run on pooled_mm_system with N workers; 0: mm_system
};

// The row's options, with the pool sized as asked when the row runs on a pool.
template <class System>
mm_system_options for_system(mm_system_options opts, const run_mode& mode) {
  if constexpr (std::is_same_v<System, pooled_mm_system>) opts.pool.workers = mode.workers;
  return opts;
}

std::uint64_t gib_pages(double gib) {
  return static_cast<std::uint64_t>(gib * double(std::uint64_t{1} << 30)) / mm_system::page_size();
}

// ---- trace recording: which mm ids were queued, and charged vs live at reap -----------------

struct trace_recorder {
  std::mutex lock;
  std::set<std::uint64_t> queued_ids;
  std::uint64_t reaped_charged = 0;
  std::uint64_t reaped_live = 0;

  void clear() {
    const std::lock_guard guard(lock);
    queued_ids.clear();
    reaped_charged = reaped_live = 0;
  }
  bool was_queued(std::uint64_t id) {
    const std::lock_guard guard(lock);
    return queued_ids.count(id) != 0;
  }
};

trace_recorder recorder;

void on_queue(const teardown::trace::queue_event& e) {
  const std::lock_guard guard(recorder.lock);
  recorder.queued_ids.insert(e.id);
}
void on_reap(const teardown::trace::reap_event& e) {
  const std::lock_guard guard(recorder.lock);
  recorder.reaped_charged += e.charged_cost;
  recorder.reaped_live += e.live_cost;
}

// ---- one row ------------------------------------------------------------------------------

struct row {
  std::string name;
  std::uint64_t exits = 0;
  vmstat stats;
  std::uint64_t cap = 0;
  std::uint64_t high_water = 0;
  std::uint64_t samples = 0;
  std::uint64_t counter_over_cap = 0;
  teardown::reaper_stats reaper;  // the mm_reaper's (a pool's: its workers' sums), after the final flush
  std::string detail;
  std::vector<std::string> failures;
};

// A fresh "kernel" for one scenario, the mms it created (each held with mmgrab so it can be
// inspected after its teardown), and the cap monitor. System: mm_system or pooled_mm_system.
template <class System>
class scenario {
 public:
  using task = typename System::task;

  scenario(std::string name, const run_mode& mode, mm_system_options opts)
      : mode_(mode), system_(for_system<System>(std::move(opts), mode)) {
    row_.name = std::move(name);
    recorder.clear();
    monitor_ = std::thread([this] { monitor(); });
  }
  scenario(const scenario&) = delete;
  scenario& operator=(const scenario&) = delete;
  ~scenario() {
    stop_monitor();
    for (mm_struct* mm : mms_) System::mmdrop(*mm);
  }

  System& kernel() { return system_; }

  task_ptr<System> spawn(std::uint64_t pages) {
    task_ptr<System> t = system_.spawn(pages, mode_.memory);
    track(*t->mm());
    return t;
  }

  task_ptr<System> clone_vm(task& sharer) { return system_.clone_vm(sharer); }

  // The task's exit, counted when it made the final mmput_exit.
  std::optional<decision> exit(task& t) {
    std::optional<decision> d = t.exit();
    if (d) final_exits_.fetch_add(1, std::memory_order_relaxed);
    return d;
  }

  std::uint64_t id_of(task& t) { return t.mm()->id; }

  // Freezes the reaper (a pool: every worker) and queues `count` exits of `pages` each behind
  // it (the RFC's backlog), oldest first in the result. All from this thread, so on a pool they
  // all go to this thread's worker, in this order.
  std::vector<mm_struct*> queue_frozen_backlog(int count, std::uint64_t pages) {
    system_.freeze();
    std::vector<mm_struct*> queued;
    for (int i = 0; i < count; ++i) {
      task_ptr<System> t = spawn(pages);
      queued.push_back(t->mm());
      check(exit(*t) == decision::queued, "a backlog exit was not queued");
    }
    return queued;
  }

  void check(bool ok, const std::string& what) {
    if (!ok) {
      const std::lock_guard guard(failures_lock_);
      row_.failures.push_back(what);
    }
  }

  void detail(std::string text) { row_.detail = std::move(text); }

  // The checks every row ends with.
  row finish() {
    system_.flush();
    stop_monitor();
    const vmstat v = system_.vmstat();
    row_.exits = final_exits_.load();
    row_.stats = v;
    row_.cap = system_.max_pending();
    row_.high_water = system_.pending_high_water();
    // After the flush, so every reaped count is in (a pool's: summed over its workers, a stolen
    // mm counted as enqueued by its victim and reaped by its thief, so the sums still match).
    row_.reaper = system_.stats().reaper;
    check(v.queued + v.sync == row_.exits, "queued + sync != exits");
    check(v.rejected <= v.sync, "rejected > sync");
    check(v.stalled <= v.sync, "stalled > sync");
    check(v.reaped == v.queued, "reaped != queued after flush");
    check(v.pending_pages == 0, "pending != 0 after flush");
    check(row_.reaper.enqueued == v.queued, "the mm_reaper's enqueued != vmstat queued");
    check(row_.reaper.reaped == v.reaped, "the mm_reaper's reaped != vmstat reaped");
    check(row_.reaper.inline_reaped >= v.drained, "the mm_reaper counted fewer caller teardowns than drained");
    check(row_.reaper.errors == 0, "a teardown failed on the mm_reaper");
    check(row_.high_water <= row_.cap, "the budget admitted more than the cap");
    check(!monitor_saw_high_water_over_cap_, "monitor: high water above the cap");
    std::size_t lost = 0, twice = 0;
    for (mm_struct* mm : mms_) {
      const std::uint32_t n = mm->teardowns.load();
      lost += n == 0;
      twice += n > 1;
    }
    check(lost == 0, std::to_string(lost) + " mm(s) never torn down");
    check(twice == 0, std::to_string(twice) + " mm(s) torn down twice");
    return row_;
  }

 private:
  void track(mm_struct& mm) {
    System::mmgrab(mm);
    const std::lock_guard guard(mms_lock_);
    mms_.push_back(&mm);
  }

  void monitor() {
    while (!stop_.load(std::memory_order_relaxed)) {
      const std::uint64_t cap = system_.max_pending();
      ++row_.samples;
      if (system_.vmstat().pending_pages > cap) ++row_.counter_over_cap;
      if (system_.pending_high_water() > cap) monitor_saw_high_water_over_cap_ = true;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void stop_monitor() {
    stop_.store(true);
    if (monitor_.joinable()) monitor_.join();
  }

  const run_mode& mode_;
  System system_;
  row row_;
  std::atomic<std::uint64_t> final_exits_{0};
  std::mutex mms_lock_;
  std::vector<mm_struct*> mms_;
  std::mutex failures_lock_;
  std::atomic<bool> stop_{false};
  bool monitor_saw_high_water_over_cap_ = false;  // written by the monitor, read after join
  std::thread monitor_;
};

mm_system_options feature_on(std::uint64_t cap_pages) {
  mm_system_options opts;
  opts.async_mm_teardown = true;
  opts.max_pending_pages = cap_pages;
  return opts;
}

// Exits every task at once, one thread each, and returns the decisions of the final exits.
// while_exiting() runs on the calling thread after the exits are started, before they are joined.
template <class System, class WhileExiting = void (*)()>
std::vector<decision> exit_in_parallel(scenario<System>& s, std::vector<task_ptr<System>>& tasks,
                                       WhileExiting while_exiting = [] {}) {
  std::latch start(static_cast<std::ptrdiff_t>(tasks.size()));
  std::mutex lock;
  std::vector<decision> decisions;
  std::vector<std::thread> threads;
  for (task_ptr<System>& t : tasks) {
    threads.emplace_back([&, task = t.get()] {
      start.arrive_and_wait();
      if (auto d = s.exit(*task)) {
        const std::lock_guard guard(lock);
        decisions.push_back(*d);
      }
    });
  }
  while_exiting();
  for (std::thread& t : threads) t.join();
  tasks.clear();
  return decisions;
}

// A storm that overlaps for certain: each task's mm gets an AIO request in flight, so every exit
// blocks in exit_aio right after deciding (the eager one if queued, the teardown's if inline);
// the requests complete only once every exit is blocked, so all decide while none has left.
template <class System>
std::vector<decision> exit_storm_held_by_aio(scenario<System>& s, std::vector<task_ptr<System>>& tasks) {
  std::vector<mm_struct*> blocked;  // held by the scenario (mmgrab) until it ends
  for (task_ptr<System>& t : tasks) {
    mm_struct* mm = t->mm();
    if (mm->aio.submit()) blocked.push_back(mm);
  }
  s.check(blocked.size() == tasks.size(), "an AIO request was refused: the storm would not overlap");
  return exit_in_parallel(s, tasks, [&] {
    for (mm_struct* mm : blocked) {
      while (mm->aio.exit_calls() == 0) std::this_thread::yield();  // decided, and blocked
    }
    for (mm_struct* mm : blocked) mm->aio.complete();
  });
}

std::size_t count(const std::vector<decision>& ds, decision d) {
  return static_cast<std::size_t>(std::count(ds.begin(), ds.end(), d));
}

// ---- the rows -----------------------------------------------------------------------------

// Cap 1 GiB, 8 parallel 0.5 GiB exits (reaper frozen, so the cap is what binds): only what fits
// is queued, the rest falls back to sync, and the counters say so.
template <class System>
row backpressure(const run_mode& mode) {
  scenario<System> s("backpressure", mode, feature_on(gib_pages(1)));
  std::size_t queued = 0, rejected = 0;
  const int rounds = 2 * mode.repeat;
  for (int round = 0; round < rounds; ++round) {
    s.kernel().freeze();
    std::vector<task_ptr<System>> tasks;
    for (int i = 0; i < 8; ++i) tasks.push_back(s.spawn(gib_pages(0.5)));
    const std::vector<decision> ds = exit_in_parallel(s, tasks);
    s.check(count(ds, decision::queued) >= 1 && count(ds, decision::queued) <= 2,
            "round " + std::to_string(round) + ": " + std::to_string(count(ds, decision::queued)) +
                " queued, expected 1..2 (the cap fits two)");
    s.check(count(ds, decision::queued) + count(ds, decision::inline_rejected) == 8,
            "an exit was neither queued nor rejected");
    queued += count(ds, decision::queued);
    rejected += count(ds, decision::inline_rejected);
    s.kernel().thaw();
    s.kernel().flush();
  }
  s.detail(std::to_string(rounds) + " rounds of 8 x 0.5 GiB under a 1 GiB cap: queued += " + std::to_string(queued) +
           ", sync += " + std::to_string(rejected));
  return s.finish();
}

// The OOM killer fires while 8 GiB of teardowns are queued: the victims (each with a CLONE_VM
// sharer) tear down synchronously and are never queued; the backlog drains alongside.
template <class System>
row oom_kill_during_backlog(const run_mode& mode) {
  scenario<System> s("oom kill during 8 GiB backlog", mode, feature_on(gib_pages(12)));
  s.queue_frozen_backlog(16, gib_pages(0.5));
  const int reps = 3 * mode.repeat;
  std::vector<task_ptr<System>> victims, sharers;
  std::vector<std::uint64_t> victim_ids;
  for (int i = 0; i < reps; ++i) {
    victims.push_back(s.spawn(gib_pages(0.5)));
    sharers.push_back(s.clone_vm(*victims.back()));
    victim_ids.push_back(s.id_of(*victims.back()));
  }
  s.kernel().thaw();  // the backlog drains while the kills happen
  std::vector<std::thread> threads;
  std::atomic<int> victims_synced{0};
  for (int i = 0; i < reps; ++i) {
    const auto at = static_cast<std::size_t>(i);
    for (typename System::task* t : {victims[at].get(), sharers[at].get()}) {
      threads.emplace_back([&s, &victims_synced, t] {
        while (!t->killed()) std::this_thread::yield();  // a pending SIGKILL makes the task exit
        if (auto d = s.exit(*t)) {
          s.check(*d == decision::inline_ineligible, "an OOM victim's final exit was not synchronous");
          victims_synced.fetch_add(1);
        }
      });
    }
  }
  std::size_t killed = 0;
  for (task_ptr<System>& v : victims) killed += s.kernel().oom_kill(*v);
  for (std::thread& t : threads) t.join();
  victims.clear();
  sharers.clear();
  s.check(killed == 2 * static_cast<std::size_t>(reps), "oom_kill did not sweep every sharer");
  for (std::uint64_t id : victim_ids) s.check(!recorder.was_queued(id), "an OOM victim was queued");
  s.detail(std::to_string(reps) + " kills (victim + CLONE_VM sharer) during a 16 x 0.5 GiB backlog: " +
           std::to_string(victims_synced.load()) + " victims sync, " + std::to_string(killed) + " tasks killed");
  return s.finish();
}

// MMF_OOM_TARGETED probes, verified per mm through the queue trace point: a positive control
// first (a plain exit of the same size IS queued), then victims marked by oom_kill and by
// mark_oom_victim, and CLONE_VM pairs swept by one kill, exiting in either order.
template <class System>
row oom_targeted_probes(const run_mode& mode) {
  scenario<System> s("oom-targeted probes", mode, feature_on(gib_pages(12)));
  // Twice the threshold: eligible by size, and cheap enough to repeat with real memory.
  const std::uint64_t size = 2 * s.kernel().thresh_pages();
  task_ptr<System> control = s.spawn(size);
  const std::uint64_t control_id = s.id_of(*control);
  s.check(s.exit(*control) == decision::queued, "positive control: a plain large exit was not queued");
  s.kernel().flush();
  s.check(recorder.was_queued(control_id), "positive control: no queue event");

  std::size_t probes = 0, pair_probes = 0;
  const int reps = static_cast<int>(teardown_test::scaled(20));
  for (int i = 0; i < reps; ++i) {
    task_ptr<System> victim = s.spawn(size);
    const std::uint64_t id = s.id_of(*victim);
    if (i % 2 == 0) {
      s.kernel().oom_kill(*victim);
    } else {
      s.kernel().mark_oom_victim(*victim);  // the task_will_free_mem fast path
    }
    s.check(s.exit(*victim) == decision::inline_ineligible, "a marked victim was not synchronous");
    s.check(!recorder.was_queued(id), "a marked victim was queued");
    ++probes;

    task_ptr<System> first = s.spawn(size);
    task_ptr<System> second = s.clone_vm(*first);
    const std::uint64_t pair_id = s.id_of(*first);
    s.check(s.kernel().oom_kill(i % 2 == 0 ? *first : *second) == 2, "the kill did not sweep both sharers");
    std::vector<task_ptr<System>> pair;
    pair.push_back(std::move(first));
    pair.push_back(std::move(second));
    if (i % 3 == 0) std::swap(pair[0], pair[1]);
    const std::vector<decision> ds = exit_in_parallel(s, pair);
    s.check(ds.size() == 1 && ds[0] == decision::inline_ineligible, "a CLONE_VM pair's final exit was not synchronous");
    s.check(!recorder.was_queued(pair_id), "a CLONE_VM pair produced a queue event");
    ++pair_probes;
  }
  s.detail("positive control queued; " + std::to_string(probes) + " victims and " + std::to_string(pair_probes) +
           " CLONE_VM pairs: no queue event");
  return s.finish();
}

// Disabling mid-drain: the backlog still drains, new exits go sync.
template <class System>
row toggle_mid_drain(const run_mode& mode) {
  scenario<System> s("toggle off mid-drain", mode, feature_on(gib_pages(12)));
  s.queue_frozen_backlog(16, gib_pages(0.5));
  s.kernel().set("vm.async_mm_teardown", "0");
  s.kernel().thaw();
  std::size_t disabled = 0;
  for (int i = 0; i < 8; ++i) {
    task_ptr<System> t = s.spawn(gib_pages(0.5));
    disabled += s.exit(*t) == decision::inline_disabled;
  }
  s.kernel().flush();
  s.check(s.kernel().vmstat().reaped == 16, "the backlog did not drain after the toggle went off");
  s.check(disabled == 8, "an exit after the toggle went off was not sync_disabled");
  s.detail("16 x 0.5 GiB backlog drained with the toggle off; " + std::to_string(disabled) + "/8 new exits sync");
  return s.finish();
}

// 50 rapid toggle cycles while exits run on other threads.
template <class System>
row toggle_cycles(const run_mode& mode) {
  scenario<System> s("50 toggle cycles under exits", mode, feature_on(gib_pages(4)));
  std::atomic<bool> done{false};
  std::vector<std::thread> exiters;
  const std::uint64_t thresh = s.kernel().thresh_pages();
  for (int w = 0; w < 3; ++w) {
    exiters.emplace_back([&, w] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(w) + 1);
      // At least a few exits per thread, then until the toggler is done.
      for (int n = 0; n < 8 || !done.load(std::memory_order_relaxed); ++n) {
        // Around the threshold: some ineligible, most eligible; small enough for real memory.
        task_ptr<System> t = s.spawn(thresh / 2 + rng() % (thresh * 2));
        if (n % 4 == 0) {
          task_ptr<System> sharer = s.clone_vm(*t);
          (void)s.exit(*sharer);
        }
        (void)s.exit(*t);
      }
    });
  }
  for (int cycle = 0; cycle < 50; ++cycle) {
    s.kernel().set_async_mm_teardown(false);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    s.kernel().set_async_mm_teardown(true);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  done.store(true);
  for (std::thread& t : exiters) t.join();
  const vmstat v = s.kernel().vmstat();
  s.detail("3 exiting threads, " + std::to_string(v.queued + v.sync) + " exits across 50 cycles");
  return s.finish();
}

// The freezer with a backlog queued: nothing is torn down while frozen; after thaw the backlog
// drains and the async path works again.
template <class System>
row freeze_thaw(const run_mode& mode) {
  scenario<System> s("freeze with backlog, thaw", mode, feature_on(gib_pages(12)));
  s.queue_frozen_backlog(16, gib_pages(0.5));
  s.check(s.kernel().vmstat().reaped == 0, "the reaper tore down while frozen");
  s.kernel().thaw();
  s.kernel().flush();
  s.check(s.kernel().vmstat().reaped == 16, "the backlog did not drain after thaw");
  task_ptr<System> after = s.spawn(gib_pages(0.5));
  s.check(s.exit(*after) == decision::queued, "the async path did not work after thaw");
  s.detail("16 x 0.5 GiB held while frozen, drained after thaw; a new exit queued");
  return s.finish();
}

// Reclaim shrinks the RSS of queued mms: the reaper releases the memoised charge, so pending
// returns to exactly 0; the reap trace point shows the gap.
template <class System>
row charge_memoisation(const run_mode& mode) {
  scenario<System> s("charge memoisation under reclaim", mode, feature_on(gib_pages(12)));
  const std::vector<mm_struct*> queued = s.queue_frozen_backlog(16, gib_pages(0.5));
  const std::uint64_t charged = s.kernel().vmstat().pending_pages;
  std::uint64_t reclaimed = 0;
  for (std::size_t i = 0; i < queued.size(); ++i) reclaimed += s.kernel().reclaim(*queued[i], gib_pages(0.5) * i / 32);
  s.check(s.kernel().vmstat().pending_pages == charged, "reclaim changed the pending charge");
  s.kernel().thaw();
  s.kernel().flush();
  std::uint64_t seen_charged = 0, seen_live = 0;
  {
    const std::lock_guard guard(recorder.lock);
    seen_charged = recorder.reaped_charged;
    seen_live = recorder.reaped_live;
  }
  s.check(seen_charged == charged, "the reap events' charges do not add up to what was charged");
  s.check(seen_charged - seen_live == reclaimed, "charged - live at reap != pages reclaimed");
  s.detail(std::to_string(charged) + " pages charged, " + std::to_string(reclaimed) +
           " reclaimed while queued; released exactly the charge");
  return s.finish();
}

// A pressure drain (RFC open question 1): with the reaper frozen, drain(2 GiB) tears down the
// oldest queued mms on the caller; the rest are reaped after thaw.
// Oldest first is checked as what both kernels promise: among the mms one thread queued. The
// whole backlog is queued by this thread, so with one mm_reaper the four oldest of its queue are
// the first four queued; a pool keeps no order between threads, but this thread's mms all went
// to its own worker, in order, no steal moves them while the pool is frozen, and drain takes
// each worker's queue oldest first: the same four.
template <class System>
row pressure_drain(const run_mode& mode) {
  scenario<System> s("drain(2 GiB) with backlog", mode, feature_on(gib_pages(12)));
  const std::vector<mm_struct*> queued = s.queue_frozen_backlog(16, gib_pages(0.5));
  const teardown::drain_result drained = s.kernel().drain(gib_pages(2));
  s.check(drained.items == 4, "drain(2 GiB) did not take exactly four 0.5 GiB mms");
  s.check(s.kernel().vmstat().drained == 4, "vmstat drained != 4");
  std::size_t oldest_taken = 0, newer_taken = 0;
  for (std::size_t i = 0; i < queued.size(); ++i) (i < 4 ? oldest_taken : newer_taken) += queued[i]->teardowns.load();
  s.check(oldest_taken == 4 && newer_taken == 0, "drain did not take this thread's four oldest queued mms");
  s.kernel().thaw();
  s.detail("drained " + std::to_string(drained.items) + " mms (" + std::to_string(drained.cost) +
           " pages) on the caller; the rest reaped");
  return s.finish();
}

// Shutdown with a backlog (and the reaper frozen): everything queued is torn down; later exits
// go sync.
template <class System>
row shutdown_with_backlog(const run_mode& mode) {
  scenario<System> s("shutdown with backlog", mode, feature_on(gib_pages(12)));
  s.queue_frozen_backlog(16, gib_pages(0.5));
  s.kernel().stop();
  s.check(s.kernel().vmstat().reaped == 16, "shutdown left part of the backlog");
  task_ptr<System> after = s.spawn(gib_pages(0.5));
  s.check(s.exit(*after) == decision::inline_stopped, "an exit after shutdown was not inline_stopped");
  s.detail("16 x 0.5 GiB backlog torn down by shutdown (frozen reaper); a later exit sync");
  return s.finish();
}

// Seed 004's gate: a kill storm of 32 exits released together under
// vm.async_mm_teardown_min_concurrent_exits = 4 queues its work, and a lone exit afterwards tears
// down inline (uncontended). Deterministic: each mm has an AIO request in flight, so every exit
// blocks in exit_aio right after deciding (the eager one if queued, the teardown's if inline),
// and the requests complete only once all 32 are blocked. All 32 decide while none has left, so
// at most the first 3 to enter can count fewer than 4 exits in flight.
template <class System>
row kill_storm_gate(const run_mode& mode) {
  constexpr std::size_t storm = 32;
  constexpr std::uint64_t gate = 4;
  mm_system_options opts = feature_on(gib_pages(12));
  opts.min_concurrent_exits = gate;
  scenario<System> s("kill storm, gate at 4", mode, std::move(opts));
  const std::uint64_t size = 2 * s.kernel().thresh_pages();  // eligible; 4 GiB in all with real memory
  std::vector<task_ptr<System>> tasks;
  for (std::size_t i = 0; i < storm; ++i) tasks.push_back(s.spawn(size));
  const std::vector<decision> ds = exit_storm_held_by_aio(s, tasks);
  const std::size_t queued = count(ds, decision::queued);
  const std::size_t uncontended = count(ds, decision::inline_uncontended);
  s.check(queued + uncontended == storm, "a storm exit was neither queued nor uncontended");
  s.check(uncontended <= gate - 1, std::to_string(uncontended) + " storm exits uncontended, expected at most 3");
  s.check(queued > 0, "the storm queued nothing");
  s.kernel().flush();
  task_ptr<System> lone = s.spawn(size);
  s.check(s.exit(*lone) == decision::inline_uncontended, "a lone exit after the storm was not sync_uncontended");
  const vmstat v = s.kernel().vmstat();
  s.check(v.uncontended == uncontended + 1, "vmstat uncontended does not match the decisions");
  s.check(v.uncontended <= v.sync, "uncontended > sync");
  s.detail("32 exits released together, gate at 4: " + std::to_string(queued) + " queued, " +
           std::to_string(uncontended) + " uncontended (at most 3); a lone exit afterwards uncontended");
  return s.finish();
}

// Batch pages for swap_batch_storm: every third allocation fails (the seed's GFP_NOWAIT page
// allocation failing under pressure).
std::atomic<std::uint64_t> swap_batch_allocations{0};
const swap_batch_allocator every_third_fails{
    [](std::size_t bytes) noexcept -> void* {
      if ((swap_batch_allocations.fetch_add(1, std::memory_order_relaxed) + 1) % 3 == 0) return nullptr;
      return ::operator new(bytes, std::nothrow);
    },
    [](void* memory) noexcept { ::operator delete(memory); }};

// Seed 004's batches: the same kind of storm, 32 exits that each hold about 4000 swap entries
// and tear down on their own threads (the deferral of whole mms is off), every third batch
// allocation failing. Every exit blocks in its teardown's exit_aio until all 32 are in flight,
// so the first to release its swap sees 32 exits in flight, far above the gate (2): its entries
// go to the swap-release worker, gathered into page-sized batches and queued with one put_chain
// (one CAS); an exit whose allocation fails queues the batches it built and releases the rest
// itself. Afterwards a lone exit releases inline. Nothing lost, nothing released twice: the swap
// device is empty again and every entry was counted once, batched or inline.
template <class System>
row swap_batch_storm(const run_mode& mode) {
  constexpr std::size_t storm = 32;
  mm_system_options opts;
  opts.swap_slots = std::size_t{1} << 18;
  opts.swap_min_exiting = 2;
  scenario<System> s("kill storm, swap batches", mode, std::move(opts));
  s.kernel().set_swap_batch_allocator(every_third_fails);
  const std::uint64_t size = gib_pages(0.125);  // 1 GiB in all with real memory
  std::vector<task_ptr<System>> tasks;
  std::uint64_t swapped = 0;
  for (std::size_t i = 0; i < storm; ++i) {
    tasks.push_back(s.spawn(size));
    swapped += s.kernel().swap_out(*tasks.back()->mm(), 3500 + 97 * i);  // 3 to 4 batches each
  }
  const std::vector<decision> ds = exit_storm_held_by_aio(s, tasks);
  s.check(ds.size() == storm && count(ds, decision::inline_disabled) == storm,
          "a storm exit did not tear down on its own thread");
  s.kernel().flush();
  const swap_release_stats storm_stats = s.kernel().stats().swap;
  task_ptr<System> lone = s.spawn(size);
  swapped += s.kernel().swap_out(*lone->mm(), 3500);
  (void)s.exit(*lone);
  s.kernel().flush();
  const swap_release_stats after = s.kernel().stats().swap;
  s.check(storm_stats.batches > 0 && storm_stats.queued > 0, "the storm queued no swap batch");
  s.check(storm_stats.alloc_failures > 0, "no batch allocation failed: the fallback was not exercised");
  s.check(after.batches == storm_stats.batches, "a lone exit gathered batches under the gate");
  s.check(after.batched + after.inline_entries == swapped, "entries batched + inline != entries swapped out");
  s.check(after.released == after.batches && after.queued + after.sync == after.batches,
          "a swap batch was lost or released twice");
  s.check(after.used == 0, std::to_string(after.used) + " swap slots still in use");
  s.check(after.double_frees == 0, std::to_string(after.double_frees) + " swap slots freed twice");
  s.detail("32 exits x ~4000 swap entries, every 3rd batch allocation failing: " +
           std::to_string(storm_stats.batches) + " batches (" + std::to_string(storm_stats.batched) +
           " entries) queued, " + std::to_string(storm_stats.alloc_failures) + " allocations failed, " +
           std::to_string(storm_stats.inline_entries) + " entries inline; lone exit inline; swap empty");
  return s.finish();
}

// The walk's record for one mm, read under its mmap_lock.
chunk_walk walk_of(mm_struct& mm) {
  const std::lock_guard guard(mm.mmap_lock);
  return mm.walk;
}

// Thaw on urgency (seed 003's patch 1): with the mm_reaper frozen over a 16 x 0.5 GiB backlog,
// an OOM kill of a CLONE_VM pair (the last exit synchronous, the oom_reaper on the same mm) and
// a pressure drain of 2 GiB both release memory before the thaw.
template <class System>
row oom_kill_while_frozen(const run_mode& mode) {
  scenario<System> s("oom kill + drain, reaper frozen", mode, feature_on(gib_pages(12)));
  s.queue_frozen_backlog(16, gib_pages(0.5));
  task_ptr<System> owner = s.spawn(gib_pages(0.5));
  task_ptr<System> victim = s.clone_vm(*owner);  // the victim shares the owner's mm
  mm_struct* mm = victim->mm();          // held by the scenario (mmgrab) until it ends
  s.check(s.kernel().oom_kill(*victim) == 2, "the kill did not sweep the owner too");
  s.check(!s.exit(*victim).has_value(), "the victim's exit was the last");
  s.check(s.exit(*owner) == decision::inline_ineligible, "the last exit of an OOM-killed mm was not synchronous");
  const teardown::drain_result drained = s.kernel().drain(gib_pages(2));
  s.kernel().flush_oom_reaper();
  // Before the thaw: the victim's memory and the drained part of the backlog are back.
  const chunk_walk walk = walk_of(*mm);
  const oom_reap_stats o = s.kernel().stats().oom_reap;
  s.check(mm->teardowns.load() == 1, "the victim's mm was not torn down exactly once while frozen");
  s.check(get_mm_rss(*mm) == 0, "the victim's RSS is not 0 while frozen");
  s.check(walk.exit_pages + walk.reaper_pages == gib_pages(0.5), "the two sides' pages do not add up to the RSS");
  s.check(o.queued == 1 && o.reaped == 1, "the oom_reaper did not take the victim exactly once");
  s.check(drained.items == 4, "drain(2 GiB) did not take four 0.5 GiB mms while frozen");
  s.check(s.kernel().vmstat().reaped == drained.items, "the frozen mm_reaper tore something down");
  s.kernel().thaw();
  s.detail("frozen over 16 x 0.5 GiB: the victim's 0.5 GiB came back (exit " + std::to_string(walk.exit_pages) +
           " + oom_reaper " + std::to_string(walk.reaper_pages) + " pages) and drain took " +
           std::to_string(drained.items) + " mms before thaw");
  return s.finish();
}

// The oom_reaper racing its victims' exits from each end in turn: CLONE_VM pairs, both holders
// exiting on their own threads the moment they are killed. Each mm is torn down once, and the
// pages the two sides released add up to the RSS, per mm and in all.
template <class System>
row oom_reaper_race(const run_mode& mode) {
  scenario<System> s("oom reaper race, both ends", mode, feature_on(gib_pages(12)));
  const std::uint64_t size = mode.memory == backing::real ? gib_pages(0.25) : gib_pages(0.5);
  const int reps = 4 * mode.repeat;
  std::string split;
  for (const reap_direction direction : {reap_direction::same, reap_direction::other}) {
    s.kernel().set_oom_reap_direction(direction);
    const oom_reap_stats before = s.kernel().stats().oom_reap;
    for (int i = 0; i < reps; ++i) {
      task_ptr<System> first = s.spawn(size);
      task_ptr<System> second = s.clone_vm(*first);
      mm_struct* mm = first->mm();
      std::vector<std::thread> exits;
      for (typename System::task* t : {first.get(), second.get()}) {
        exits.emplace_back([&s, t] {
          while (!t->killed()) std::this_thread::yield();
          if (auto d = s.exit(*t)) s.check(*d == decision::inline_ineligible, "a killed pair's last exit was not sync");
        });
      }
      s.check(s.kernel().oom_kill(i % 2 == 0 ? *first : *second) == 2, "the kill did not sweep both sharers");
      for (std::thread& t : exits) t.join();
      s.kernel().flush_oom_reaper();
      const chunk_walk walk = walk_of(*mm);
      s.check(mm->teardowns.load() == 1, "a raced mm was not torn down exactly once");
      s.check(get_mm_rss(*mm) == 0 && walk.finished && walk.unmapped_below == walk.chunks,
              "a raced mm was left with memory or mapped chunks");
      s.check(walk.exit_pages + walk.reaper_pages == size, "a raced mm's two sides do not add up to its RSS");
    }
    const oom_reap_stats after = s.kernel().stats().oom_reap;
    const std::uint64_t exit_pages = after.exit_pages - before.exit_pages;
    const std::uint64_t reaper_pages = after.reaper_pages - before.reaper_pages;
    s.check(exit_pages + reaper_pages == static_cast<std::uint64_t>(reps) * size,
            std::string(to_string(direction)) + ": the pages released do not add up to the RSS");
    split += std::string(split.empty() ? "" : "; ") + to_string(direction) + ": exit " + std::to_string(exit_pages) +
             " + oom_reaper " + std::to_string(reaper_pages);
  }
  s.check(s.kernel().stats().oom_reap.errors == 0, "a MADV_DONTNEED failed");
  s.detail(std::to_string(reps) + " killed CLONE_VM pairs per end, each torn down once; pages " + split);
  return s.finish();
}

// Threads of this process named as the mm_reaper (mm_system's "mm_reaper") or as a pool worker
// ("mm_reaper-<i>"), from /proc/self/task/*/comm.
std::size_t mm_reaper_threads() {
  std::size_t n = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream comm(entry.path() / "comm");
    std::string name;
    if (std::getline(comm, name) && (name == "mm_reaper" || name.rfind("mm_reaper-", 0) == 0)) ++n;
  }
  return n;
}

// The pre-flight: a kernel built with the rows' options runs 1 (mm_system) or mode.workers
// (pooled_mm_system) mm_reaper threads. Each worker names itself when it starts, so this waits
// for them (up to 10 s). Prints only on failure.
template <class System>
bool preflight(const run_mode& mode) {
  const std::size_t expected = std::is_same_v<System, pooled_mm_system> ? mode.workers : 1;
  std::size_t seen = 0;
  {
    System kernel(for_system<System>(feature_on(gib_pages(1)), mode));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while ((seen = mm_reaper_threads()) < expected && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  if (seen != expected) {
    std::printf("pre-flight FAIL: the kernel runs %zu mm_reaper thread(s), expected %zu\n\n", seen, expected);
  }
  return seen == expected;
}

void print(const std::vector<row>& rows, const run_mode& mode) {
  const std::string reapers = mode.workers == 0   ? std::string("1 mm_reaper")
                              : mode.workers == 1 ? std::string("pool of 1 mm_reaper")
                                                  : "pool of " + std::to_string(mode.workers) + " mm_reapers";
  std::printf("teardown stress matrix (%s memory, page %zu B, 0.5 GiB = %llu pages, %s)\n\n",
              mode.memory == backing::real ? "real" : "simulated", mm_system::page_size(),
              static_cast<unsigned long long>(gib_pages(0.5)), reapers.c_str());
  std::printf("%-32s %6s %6s %6s %6s %6s %7s %9s %9s %7s %6s\n", "scenario", "exits", "queued", "sync", "reject",
              "reaped", "pending", "max_admit", "cap", "over*", "result");
  for (const row& r : rows) {
    std::printf("%-32s %6llu %6llu %6llu %6llu %6llu %7llu %9llu %9llu %7llu %6s\n", r.name.c_str(),
                static_cast<unsigned long long>(r.exits), static_cast<unsigned long long>(r.stats.queued),
                static_cast<unsigned long long>(r.stats.sync), static_cast<unsigned long long>(r.stats.rejected),
                static_cast<unsigned long long>(r.stats.reaped), static_cast<unsigned long long>(r.stats.pending_pages),
                static_cast<unsigned long long>(r.high_water), static_cast<unsigned long long>(r.cap),
                static_cast<unsigned long long>(r.counter_over_cap), r.failures.empty() ? "PASS" : "FAIL");
  }
  std::printf("\n* over: monitor samples where the pending counter was above the cap (a failing add-then-check\n"
              "  reserve taking its charge back); max_admit, the budget's high-water mark, is what was admitted.\n\n");
  for (const row& r : rows) {
    std::printf("%s: %s\n", r.name.c_str(), r.detail.c_str());
    if (mode.workers != 0) {
      std::printf("  pool, workers' sums: %llu enqueued, %llu reaped (%llu stolen, %llu on callers)\n",
                  static_cast<unsigned long long>(r.reaper.enqueued), static_cast<unsigned long long>(r.reaper.reaped),
                  static_cast<unsigned long long>(r.reaper.stolen),
                  static_cast<unsigned long long>(r.reaper.inline_reaped));
    }
    for (const std::string& f : r.failures) std::printf("  FAIL: %s\n", f.c_str());
  }
}

template <class System>
std::vector<row> run_rows(const run_mode& mode) {
  std::vector<row> rows;
  for (auto* scenario_fn : {&backpressure<System>, &oom_kill_during_backlog<System>, &oom_targeted_probes<System>,
                            &toggle_mid_drain<System>, &toggle_cycles<System>, &freeze_thaw<System>,
                            &charge_memoisation<System>, &pressure_drain<System>, &shutdown_with_backlog<System>,
                            &kill_storm_gate<System>, &swap_batch_storm<System>, &oom_kill_while_frozen<System>,
                            &oom_reaper_race<System>}) {
    rows.push_back(scenario_fn(mode));
  }
  return rows;
}

// --workers' argument: a decimal count in [1, reaper_pool's max_workers]; nullopt otherwise.
std::optional<std::size_t> parse_workers(const char* text) {
  std::size_t n = 0;
  const char* end = text + std::strlen(text);
  const auto [at, ec] = std::from_chars(text, end, n);
  if (ec != std::errc{} || at != end || text == end || n == 0 || n > teardown::detail::reaper_pool_max_workers) {
    return std::nullopt;
  }
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  run_mode mode;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--long") == 0) {
      mode.memory = backing::real;
      mode.repeat = 2;
    } else if (std::strcmp(argv[i], "--workers") == 0 && i + 1 < argc && parse_workers(argv[i + 1])) {
      mode.workers = *parse_workers(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--long] [--workers N]   (N: mm_reaper pool size, 1 to %zu)\n", argv[0],
                   teardown::detail::reaper_pool_max_workers);
      return 2;
    }
  }
  const bool pool = mode.workers != 0;
  const bool preflight_ok = pool ? preflight<pooled_mm_system>(mode) : preflight<mm_system>(mode);

  teardown::trace::set_hook<teardown::trace::queue_event>(&on_queue);
  teardown::trace::set_hook<teardown::trace::reap_event>(&on_reap);
  const std::vector<row> rows = pool ? run_rows<pooled_mm_system>(mode) : run_rows<mm_system>(mode);
  teardown::trace::clear_hook<teardown::trace::queue_event>();
  teardown::trace::clear_hook<teardown::trace::reap_event>();

  print(rows, mode);
  const bool all_pass =
      preflight_ok && std::all_of(rows.begin(), rows.end(), [](const row& r) { return r.failures.empty(); });
  std::printf("\n%s\n", all_pass ? "ALL PASS" : preflight_ok ? "SOME ROWS FAILED" : "PRE-FLIGHT FAILED");
  return all_pass ? 0 : 1;
}
