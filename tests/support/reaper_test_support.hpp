// Helpers shared by the tests of teardown::reaper and of what runs on it (reaper_test.cpp,
// reaper_fork_test.cpp, reaper_pool_test.cpp, reaper_drain_test.cpp and the model's tests): the
// item type, counting fns, a thread's state from /proc, a stress driver, and the hang guard
// that turns a deadlock into a clear failure instead of a CI timeout.
#pragma once

#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <latch>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "teardown/reaper.hpp"

#include "test_support.hpp"

namespace teardown_test::reaper_support {

using namespace std::chrono_literals;
using teardown::llist_node;

// An item: its id and how many times fn tore it down.
struct job {
  llist_node hook;
  std::size_t id = 0;
  std::atomic<int> runs{0};
};

using job_fn = std::function<void(job&)>;
using job_reaper = teardown::reaper<job, &job::hook, job_fn>;

inline std::vector<job> make_jobs(std::size_t count) {
  std::vector<job> jobs(count);
  for (std::size_t i = 0; i < count; ++i) jobs[i].id = i;
  return jobs;
}

// fn that only counts.
inline job_fn counting() {
  return [](job& j) { j.runs.fetch_add(1, std::memory_order_relaxed); };
}

// How many of `jobs` ran exactly once; the rest ran never or more than once.
inline std::size_t ran_exactly_once(const std::vector<job>& jobs) {
  return static_cast<std::size_t>(std::count_if(
      jobs.begin(), jobs.end(), [](const job& j) { return j.runs.load(std::memory_order_relaxed) == 1; }));
}

inline int total_runs(const std::vector<job>& jobs) {
  int total = 0;
  for (const job& j : jobs) total += j.runs.load(std::memory_order_relaxed);
  return total;
}

inline pid_t current_tid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

// The whole of a (small) file, "" if it cannot be read: a /proc entry.
inline std::string read_text(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// The scheduler state ('R', 'S', ...) of one of this process's threads.
inline char task_state(pid_t tid) {
  const std::string stat = read_text("/proc/self/task/" + std::to_string(tid) + "/stat");
  const std::size_t close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() ? '?' : stat[close + 2];
}

// Returns once thread `tid` is asleep (two samples 5 ms apart): to see a thread that is blocked
// in freeze() or in a fork() handler, waiting for a worker to finish its item.
inline void wait_until_asleep(pid_t tid) {
  for (;;) {
    if (task_state(tid) == 'S') {
      std::this_thread::sleep_for(5ms);
      if (task_state(tid) == 'S') return;
    }
    std::this_thread::sleep_for(1ms);
  }
}

// The tid of this process's thread named `name` (/proc/self/task/*/comm), once it exists.
inline pid_t thread_named(const std::string& name) {
  std::optional<pid_t> found;
  EXPECT_TRUE(eventually([&] {
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
      std::string comm = read_text(entry.path().string() + "/comm");
      if (!comm.empty() && comm.back() == '\n') comm.pop_back();
      if (comm == name) {
        found = static_cast<pid_t>(std::stoi(entry.path().filename().string()));
        return true;
      }
    }
    return false;
  })) << "no thread named " << name;
  return found.value_or(-1);
}

// Aborts the process with a clear message if the test has not finished after `limit`: a guard
// against hangs (a lost wake-up, a deadlock), not a time assertion. Every test finishes in
// seconds; the limit is generous even under ThreadSanitizer on a loaded machine.
class hang_guard {
 public:
  explicit hang_guard(std::string what, std::chrono::seconds limit = 60s)
      : thread_([this, what = std::move(what), limit] {
          std::unique_lock lock(mutex_);
          if (!finished_changed_.wait_for(lock, limit, [this] { return finished_; })) {
            std::fprintf(stderr, "\nHANG: %s has not finished after %lld s: a lost wake-up or a deadlock. Aborting.\n",
                         what.c_str(), static_cast<long long>(limit.count()));
            std::fflush(stderr);
            std::abort();
          }
        }) {}
  hang_guard(const hang_guard&) = delete;
  hang_guard& operator=(const hang_guard&) = delete;
  ~hang_guard() {
    {
      const std::lock_guard lock(mutex_);
      finished_ = true;
    }
    finished_changed_.notify_one();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable finished_changed_;
  bool finished_ = false;
  std::thread thread_;
};

inline std::string current_test_name() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::string(info->test_suite_name()) + "." + info->name();
}

// fn that counts, except that item 0 first reports `started` and then blocks until `release`
// is counted down: a worker caught in the middle of a batch.
inline job_fn first_item_blocks(std::latch& release, std::atomic<bool>& started) {
  return [&release, &started](job& j) {
    if (j.id == 0) {
      started.store(true);
      release.wait();
    }
    j.runs.fetch_add(1, std::memory_order_relaxed);
  };
}

// fn for any item with a `runs` count: says it started, then holds the item until `go`.
inline auto held_until_go(std::atomic<bool>& started, std::atomic<bool>& go) {
  return [&started, &go](auto& item) {
    started.store(true);
    while (!go.load()) std::this_thread::sleep_for(1ms);
    item.runs.fetch_add(1);
  };
}

// Enqueues every job while the worker is frozen, so that it takes them as one batch.
inline void enqueue_as_one_batch(job_reaper& reaper, std::vector<job>& jobs) {
  reaper.freeze();
  for (job& j : jobs) reaper.enqueue(j);
  reaper.thaw();
}

// Sleeps between looks rather than yielding: a nice-0 thread that yields in a loop keeps a nice-19
// worker off its CPU (CFS passes over a yielder only to an entity not far ahead in vruntime),
// and on a loaded machine the flag's writer could starve for the hang guard's minute.
inline void wait_until(const std::atomic<bool>& flag) {
  while (!flag.load()) std::this_thread::sleep_for(std::chrono::microseconds(50));
}

// Runs produce(p) on `producers` threads while one more thread keeps flushing `reaper` (a reaper
// or a reaper_pool) and another keeps freezing and thawing it; returns once every producer has
// returned and the two have stopped. The caller flushes and counts.
template <class Reaper, class Produce>
void produce_while_flushing_and_freezing(Reaper& reaper, std::size_t producers, Produce produce) {
  std::atomic<bool> stop_controlling{false};
  std::vector<std::thread> threads;
  for (std::size_t p = 0; p < producers; ++p) threads.emplace_back([&produce, p] { produce(p); });
  std::thread flusher([&] {
    while (!stop_controlling.load()) reaper.flush();
  });
  std::thread freezer([&] {
    while (!stop_controlling.load()) {
      reaper.freeze();
      std::this_thread::yield();
      reaper.thaw();
    }
  });
  for (std::thread& t : threads) t.join();
  stop_controlling.store(true);
  flusher.join();
  freezer.join();
}

}  // namespace teardown_test::reaper_support
