// The child half of deferred_exit_test.cpp: one exit scenario of the default domain per run,
//
//     deferred_exit_child <scenario> <report fd>
//
// launched by the test with posix_spawn (exit is process-wide, and ThreadSanitizer dislikes
// fork in a threaded process). Each destructor of a queued object writes one byte to the report
// fd: 'o' if the static it uses was still alive, 'X' if it had been destroyed already. Some
// scenarios add a line "pending=<n>". The process's exit code and the bytes are the result;
// the test counts them. Nothing here asserts a time: a destructor that must be "still queued at
// exit" is held back by a frozen reaper or by a flag, never by a sleep.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "teardown/deferred.hpp"

namespace {

int report_fd = -1;

void report(char what) {
  if (::write(report_fd, &what, 1) != 1) std::abort();
}

void report_line(const std::string& line) {
  if (::write(report_fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) std::abort();
}

// A static that the queued objects' destructors use. It owns heap memory and frees it when it
// is destroyed, so that under AddressSanitizer a destructor that runs after it reports a
// heap-use-after-free; elsewhere `alive` tells.
struct registry {
  int* uses = new int(0);
  bool alive = true;
  ~registry() {
    alive = false;
    delete uses;  // the pointer is kept: a late user reads freed memory, as a real program would
  }
};

// Constructed on first use: after the default domain when the scenario touches the domain first.
registry& late_static() {
  static registry instance;
  return instance;
}

// A queued object that uses the late static in its destructor. Costs 1 MiB: always queued.
struct user {
  ~user() {
    registry& r = late_static();
    report(r.alive ? 'o' : 'X');
    ++*r.uses;
  }
  friend std::uint64_t teardown_cost(const user&) { return std::uint64_t{1} << 20; }
};

// A queued object that only reports; the one numbered `exit_at` calls exit(0) from its
// destructor (on the reaper), and the one numbered `block_at` waits for `release` first.
std::atomic<int> exit_at{-1};
std::atomic<int> block_at{-1};
std::atomic<bool> started_blocker{false};
std::atomic<bool> release{false};

struct numbered {
  int number;
  ~numbered() {
    if (number == block_at.load()) {
      started_blocker.store(true);
      while (!release.load()) std::this_thread::yield();
    }
    report('o');
    if (number == exit_at.load()) std::exit(0);
  }
  friend std::uint64_t teardown_cost(const numbered&) { return std::uint64_t{1} << 20; }
};

// (a) N objects queued behind a frozen reaper when main calls exit() (or returns): each
// destructor must see the static constructed after the domain still alive.
constexpr int queued_users = 20;

void queue_users_behind_a_frozen_reaper() {
  teardown::deferred::default_domain().freeze();  // first use, on the main thread
  (void)late_static();                            // constructed after the domain
  for (int i = 0; i < queued_users; ++i) teardown::deferred_delete(new user);
}

[[noreturn]] void wait_for_exit_elsewhere() {
  for (;;) ::pause();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s <scenario> <report fd>\n", argv[0]);
    return 2;
  }
  const std::string scenario = argv[1];
  report_fd = std::atoi(argv[2]);

  if (scenario == "static_after_domain_exit") {
    queue_users_behind_a_frozen_reaper();
    std::exit(0);
  }
  if (scenario == "static_after_domain_return") {
    queue_users_behind_a_frozen_reaper();
    return 0;
  }
  if (scenario == "exit_from_a_destructor_on_the_reaper") {
    // 100 objects; the 50th destructor calls exit(0) on the reaper: all 100 must be destroyed.
    exit_at.store(50);
    teardown::deferred_domain& domain = teardown::deferred::default_domain();
    domain.freeze();
    for (int i = 1; i <= 100; ++i) teardown::deferred_delete(new numbered{i});
    domain.thaw();
    wait_for_exit_elsewhere();
  }
  if (scenario == "exit_from_main_in_the_middle_of_a_batch") {
    // The reaper has taken all 100 in one batch and is inside the first destructor when main
    // calls exit(); each destructor also uses the late static.
    block_at.store(1);
    teardown::deferred_domain& domain = teardown::deferred::default_domain();
    (void)late_static();
    domain.freeze();
    for (int i = 1; i <= 100; ++i) teardown::deferred_delete(new numbered{i});
    for (int i = 0; i < queued_users; ++i) teardown::deferred_delete(new user);
    domain.thaw();
    while (!started_blocker.load()) std::this_thread::yield();
    release.store(true);  // the worker goes on with its batch while exit() runs
    std::exit(0);
  }
  if (scenario == "exit_from_another_thread") {
    // Not the main thread: the closer destroys what is queued (at its place among the statics).
    teardown::deferred_domain& domain = teardown::deferred::default_domain();
    domain.freeze();
    for (int i = 1; i <= 100; ++i) teardown::deferred_delete(new numbered{i});
    std::thread([] { std::exit(0); }).detach();
    wait_for_exit_elsewhere();
  }
  if (scenario == "exit_timeout_leaves_a_blocked_reaper") {
    // The first destructor never returns: with an exit timeout, exit proceeds and what is left
    // is counted. A static constructed before the domain reports the count after the shutdown.
    struct report_pending_at_the_end {
      ~report_pending_at_the_end() {
        const teardown::deferred_stats s = teardown::deferred::stats();
        report_line("pending=" + std::to_string(s.queued - s.reaped) + "\n");
      }
    };
    static report_pending_at_the_end reporter;
    teardown::deferred::set_exit_timeout(std::chrono::milliseconds(100));
    block_at.store(1);
    teardown::deferred_domain& domain = teardown::deferred::default_domain();
    domain.freeze();
    for (int i = 1; i <= 5; ++i) teardown::deferred_delete(new numbered{i});
    domain.thaw();
    while (!started_blocker.load()) std::this_thread::yield();
    std::exit(0);
  }
  std::fprintf(stderr, "unknown scenario %s\n", scenario.c_str());
  return 2;
}
