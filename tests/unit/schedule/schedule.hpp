// tests/unit/schedule/schedule.hpp — a deterministic scheduler for the worker protocols.
//
// The real headers run on real threads, but one at a time: every atomic operation, futex wait
// or wake, lock, condition wait, sleep, thread start and join of a thread under the scheduler
// is a point where the scheduler picks which thread runs next. A schedule is the sequence of
// those picks; it is made from a seed (PCT or a random walk) or enumerated (exhaustive, with a
// bound on preemptions), so a failing schedule is printed as a name that replays it.
//
//     teardown::schedule::explore({.name = "flush"}, [] {
//       reaper<item, &item::node, fn, llist<item, &item::node, schedule::sync>> r(fn{}, opts);
//       schedule::thread producer([&] { r.enqueue(x); });
//       r.flush();
//       schedule::check(x.torn_down, "flush returned before x was torn down");
//     });
//
// Files: scheduler.hpp (the scheduler: slots, picks, time, wake-ups), primitives.hpp (the Sync
// policy and what scenarios call), memory_model.hpp (weak memory), this one (explore). A test
// includes this one.
//
// Who may call what
//   explore                 a test's thread, not under the scheduler; one explore at a time.
//   check, thread, sync     inside a scenario (the function explore runs) and the threads it
//                           starts; sync is the Sync policy (teardown/sync.hpp) to name in the
//                           queue type of the reaper or pool under test.
//   publish, ordered_here   inside a scenario: a stamp of what this thread has done, and
//                           whether a stamp happens before the caller's now (weak memory).
//
// How a run goes. explore starts thread 0 on the scenario; threads it starts (schedule::thread,
// and a reaper's worker through sync::start_thread) join the run. At each point the strategy
// picks among the runnable threads. No thread runnable and none waiting with a limit is a
// deadlock: the run is reported as failed, with its name, and the process aborts (the blocked
// threads cannot be unwound). A run that passes max_steps is reported as failed too, and its
// threads are let run freely to their end.
//
// Time is virtual (clock, sync::now_ns). It moves on by yield_ns at each yield: a spinning
// thread spends time, so a timed wait (a sleep, a futex or condition wait with a limit) ends
// once the yields of others have carried the clock to its deadline. When no thread is runnable,
// or the only runnable one yields, the clock jumps to the earliest deadline of a timed wait,
// which ends; a wait whose deadline has already passed ends at the next pick. Time moves no other
// way: atomics, locks and reads of the clock take none, so polls, boosts and a pool's steal_after
// come where a schedule puts them.
//
// Memory. The scheduled atomics are weakly ordered (memory_model.hpp): a load may read an
// older store where C++ allows it (stale_per_mille of the loads that have a choice, under pct
// and random; exhaustive runs are sequentially consistent), an RMW whose write changes nothing
// may read one, and happens-before is tracked with vector clocks. A scenario stamps an item
// before it hands it over (publish) and whoever uses it checks ordered_here: a weakened
// release or acquire on the way fails the schedule.
//
// Wake-ups. A wake of one thread (futex_wake_one, notify_one, an unlock) wakes whichever waiter
// the schedule picks (uniformly under pct and random, every choice under exhaustive), not the
// longest waiting. Under pct and random, at each pick with probability spurious_per_mille / 1000
// a thread in a futex or condition wait wakes spuriously, as the Sync contract allows: a wait
// must re-check its condition. A sleep, a join and a run in which every thread waits never do.
//
// Strategies
//   pct          probabilistic concurrency testing: random thread priorities, the running
//                thread lowered at depth - 1 random steps; finds any bug of depth d with
//                probability >= 1 / (n k^(d-1)) per run (n threads, k steps).
//   random       a uniform pick at every point.
//   mixed        pct and random in turn (the default): PCT reaches deep orderings of few
//                preemptions, the random walk the shallow ones with many switches.
//   exhaustive   depth first over every schedule with at most preemption_bound preemptions
//                (a switch away from a thread that could go on), up to `schedules` runs.
//
// Environment: TEARDOWN_SCHEDULES=N runs N schedules per explore instead of the test's count;
// TEARDOWN_SCHEDULE_REPLAY=<name> (as printed: "pct:17", "random:3", "exhaustive:0.2.1") runs
// that one schedule; TEARDOWN_SCHEDULE_TRACE=1 prints every switch of the runs;
// TEARDOWN_SCHEDULE_SPURIOUS=N, TEARDOWN_SCHEDULE_STALE=N and TEARDOWN_SCHEDULE_YIELD_NS=N set
// spurious_per_mille, stale_per_mille and yield_ns.
#pragma once

#include <sched.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "schedule/primitives.hpp"
#include "schedule/scheduler.hpp"

namespace teardown::schedule {

namespace detail {

inline std::optional<std::string> environment(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

constexpr bool under_sanitizer() {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  return true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
  return true;
#else
  return false;
#endif
#else
  return false;
#endif
}

struct run_outcome {
  std::optional<std::string> failure;
  std::uint64_t steps = 0;
  int threads = 0;
  std::vector<decision> decisions;
  std::uint64_t stale_reads = 0;
};

inline void* run_scenario(void* scenario) {
  (*static_cast<const std::function<void()>*>(scenario))();
  return nullptr;
}

inline run_outcome run_once(const explore_options& opts, strategy kind, std::uint64_t seed,
                            std::vector<std::size_t> forced, std::uint64_t expected_steps, bool trace,
                            const std::function<void()>& scenario, const std::string& name) {
  scheduler s(opts, kind, seed, std::move(forced), expected_steps, trace);
  s.set_name(name);
  active.store(&s, std::memory_order_release);
  const int first = s.add_thread(-1);
  auto* b = new boot{&s, first, &run_scenario, const_cast<std::function<void()>*>(&scenario)};
  pthread_t os{};
  if (pthread_create(&os, nullptr, &trampoline, b) != 0) {
    delete b;
    s.fatal("cannot start the scenario's thread");
  }
  s.set_os_thread(first, os);
  s.start(first);
  all_done_signal().acquire();
  pthread_join(os, nullptr);
  active.store(nullptr, std::memory_order_release);
  return {s.failure(), s.steps(), s.threads(), s.decisions(), s.stale_reads()};
}

inline std::string name_of(strategy kind, std::uint64_t seed, std::uint64_t steps,
                           const std::vector<std::size_t>& path) {
  switch (kind) {
    case strategy::mixed:  // a run is one or the other
    case strategy::pct: return "pct:" + std::to_string(seed) + ":" + std::to_string(steps);
    case strategy::random: return "random:" + std::to_string(seed);
    case strategy::exhaustive: {
      std::string name = "exhaustive:";
      for (std::size_t i = 0; i < path.size(); ++i) name += (i ? "." : "") + std::to_string(path[i]);
      return name;
    }
  }
  return "?";
}

// "pct:SEED:STEPS", "random:SEED", "exhaustive:I.J.K": the strategy, seed, PCT's step estimate
// and the exhaustive path. False if the name is not one of these.
inline bool parse_name(const std::string& name, strategy& kind, std::uint64_t& seed, std::uint64_t& steps,
                       std::vector<std::size_t>& path) {
  const auto numbers = [](const std::string& text, char separator) {
    std::vector<std::uint64_t> out;
    std::size_t at = 0;
    while (at <= text.size() && !text.empty()) {
      const std::size_t end = std::min(text.find(separator, at), text.size());
      out.push_back(std::stoull(text.substr(at, end - at)));
      at = end + 1;
    }
    return out;
  };
  try {
    if (name.rfind("pct:", 0) == 0) {
      const auto n = numbers(name.substr(4), ':');
      if (n.size() != 2) return false;
      kind = strategy::pct, seed = n[0], steps = n[1];
      return true;
    }
    if (name.rfind("random:", 0) == 0) {
      kind = strategy::random, seed = std::stoull(name.substr(7));
      return true;
    }
    if (name.rfind("exhaustive:", 0) == 0) {
      kind = strategy::exhaustive;
      for (std::uint64_t i : numbers(name.substr(11), '.')) path.push_back(static_cast<std::size_t>(i));
      return true;
    }
  } catch (const std::exception&) {
  }
  return false;
}

// The next exhaustive path after a run that took `decisions`, or nullopt when every schedule
// within the bound has been run.
inline std::optional<std::vector<std::size_t>> next_path(const std::vector<decision>& decisions, int bound) {
  for (std::size_t i = decisions.size(); i-- > 0;) {
    const decision& d = decisions[i];
    for (std::size_t alt = d.taken + 1; alt < d.options.size(); ++alt) {
      const int cost = d.preemptions_before + (d.self_runnable ? 1 : 0);
      if (cost > bound) break;
      std::vector<std::size_t> path;
      for (std::size_t j = 0; j < i; ++j) path.push_back(decisions[j].taken);
      path.push_back(alt);
      return path;
    }
  }
  return std::nullopt;
}

// Pins the calling thread, and so every thread it starts (the scenario's, the library's
// workers, whose housekeeping CPUs are taken within the inherited mask), to one CPU, and gives
// the old mask back at the end. One thread runs at a time anyway; on one CPU a hand-off is a
// wake on the same run queue, which the blocking waker leaves to the woken thread at once.
// Across CPUs a busy machine makes each hand-off wait for a slice of whatever else runs there:
// with two spinning processes on 2 CPUs, 200 schedules took 224 s instead of 0.6 s.
//
// The CPU is claimed, so that explorations running side by side (ctest -j) take different ones:
// the first CPU of the mask whose abstract socket "teardown-schedule-cpu-N" this process can
// bind (the kernel frees it when the socket closes or the process dies; no file, so users share
// it). When every CPU is claimed, the CPU the thread runs on. Pinned to whichever CPU it woke on,
// two explorations could share one CPU while the other ran a spinner alone: beside two spinners
// the suite took 311 s once, and 243 s with the claim.
class one_cpu {
 public:
  one_cpu() noexcept {
    if (sched_getaffinity(0, sizeof saved_, &saved_) != 0) return;
    int cpu = -1;
    for (int candidate = 0; candidate < CPU_SETSIZE && cpu < 0; ++candidate) {
      if (CPU_ISSET(static_cast<std::size_t>(candidate), &saved_) && claim(candidate)) cpu = candidate;
    }
    if (cpu < 0) cpu = sched_getcpu();
    if (cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(static_cast<std::size_t>(cpu), &saved_)) return;
    cpu_set_t only;
    CPU_ZERO(&only);
    CPU_SET(static_cast<std::size_t>(cpu), &only);
    pinned_ = sched_setaffinity(0, sizeof only, &only) == 0;
  }
  ~one_cpu() {
    if (pinned_) (void)sched_setaffinity(0, sizeof saved_, &saved_);
    if (claim_fd_ >= 0) close(claim_fd_);
  }
  one_cpu(const one_cpu&) = delete;
  one_cpu& operator=(const one_cpu&) = delete;

 private:
  bool claim(int cpu) noexcept {
    const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    const int length =
        std::snprintf(address.sun_path + 1, sizeof address.sun_path - 1, "teardown-schedule-cpu-%d", cpu);
    const auto size = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + static_cast<std::size_t>(length));
    if (bind(fd, reinterpret_cast<const sockaddr*>(&address), size) != 0) {
      close(fd);
      return false;
    }
    claim_fd_ = fd;
    return true;
  }

  cpu_set_t saved_{};
  bool pinned_ = false;
  int claim_fd_ = -1;
};

}  // namespace detail

/// Runs `scenario` under opts.schedules schedules (see the header comment), stopping at the
/// first that fails. Prints a line with what it explored, and for a failure the schedule's name.
inline explore_result explore(explore_options opts, const std::function<void()>& scenario) {
  const detail::one_cpu pinned;
  const bool trace = detail::environment("TEARDOWN_SCHEDULE_TRACE").has_value();
  if (const auto rate = detail::environment("TEARDOWN_SCHEDULE_SPURIOUS")) opts.spurious_per_mille = std::stoi(*rate);
  if (const auto step = detail::environment("TEARDOWN_SCHEDULE_YIELD_NS")) opts.yield_ns = std::stoull(*step);
  if (const auto stale = detail::environment("TEARDOWN_SCHEDULE_STALE")) opts.stale_per_mille = std::stoi(*stale);
  if (const auto count = detail::environment("TEARDOWN_SCHEDULES")) {
    opts.schedules = std::stoull(*count);
  } else if (detail::under_sanitizer()) {
    opts.schedules = std::max<std::uint64_t>(opts.schedules / 10, 1);
  }
  explore_result result;
  const auto note_run = [&](const detail::run_outcome& outcome, const std::string& name) {
    ++result.runs;
    result.stale_reads += outcome.stale_reads;
    result.longest_run_steps = std::max(result.longest_run_steps, outcome.steps);
    result.most_threads = std::max(result.most_threads, static_cast<std::uint64_t>(outcome.threads));
    if (outcome.failure) {
      result.failure = outcome.failure;
      result.failed_schedule = name;
    }
  };
  if (const auto replay = detail::environment("TEARDOWN_SCHEDULE_REPLAY")) {
    strategy kind{};
    std::uint64_t seed = 0, steps = 0;
    std::vector<std::size_t> path;
    if (!detail::parse_name(*replay, kind, seed, steps, path)) {
      result.failure = "TEARDOWN_SCHEDULE_REPLAY: not a schedule name: " + *replay;
      return result;
    }
    opts.kind = kind;
    note_run(detail::run_once(opts, kind, seed, path, steps, trace, scenario, *replay), *replay);
  } else if (opts.kind == strategy::exhaustive) {
    std::vector<std::size_t> path;
    while (result.runs < opts.schedules) {
      const std::string name = detail::name_of(opts.kind, 0, 0, path);
      const detail::run_outcome outcome = detail::run_once(opts, opts.kind, 0, path, 0, trace, scenario, name);
      std::vector<std::size_t> taken;
      for (const detail::decision& d : outcome.decisions) taken.push_back(d.taken);
      note_run(outcome, detail::name_of(opts.kind, 0, 0, taken));
      if (result.failure) break;
      const auto next = detail::next_path(outcome.decisions, opts.preemption_bound);
      if (!next) {
        result.exhausted = true;
        break;
      }
      path = *next;
    }
  } else {
    std::uint64_t expected_steps = 1000;
    for (std::uint64_t i = 0; i < opts.schedules && !result.failure; ++i) {
      const std::uint64_t seed = opts.seed + i;
      const strategy kind = opts.kind != strategy::mixed ? opts.kind : i % 2 == 0 ? strategy::pct : strategy::random;
      const std::string name = detail::name_of(kind, seed, expected_steps, {});
      const detail::run_outcome outcome = detail::run_once(opts, kind, seed, {}, expected_steps, trace, scenario, name);
      note_run(outcome, name);
      // PCT's change points fall within the longest run seen: a guess beyond it wastes them.
      expected_steps = std::max(result.longest_run_steps, std::uint64_t{1});
    }
  }
  std::fprintf(stderr, "schedule: %s: %llu runs (%s), up to %llu steps and %llu threads, %llu stale reads%s%s%s\n",
               opts.name, static_cast<unsigned long long>(result.runs),
               opts.kind == strategy::mixed ? "pct and random" : opts.kind == strategy::pct ? "pct"
               : opts.kind == strategy::random                            ? "random"
                                                                          : "exhaustive",
               static_cast<unsigned long long>(result.longest_run_steps),
               static_cast<unsigned long long>(result.most_threads),
               static_cast<unsigned long long>(result.stale_reads), result.exhausted ? ", all within the bound" : "",
               result.failure ? "; FAILED under " : "", result.failure ? result.failed_schedule.c_str() : "");
  if (result.failure) {
    std::fprintf(stderr, "schedule: %s: %s\nschedule: replay with TEARDOWN_SCHEDULE_REPLAY=%s\n", opts.name,
                 result.failure->c_str(), result.failed_schedule.c_str());
  }
  return result;
}

}  // namespace teardown::schedule
