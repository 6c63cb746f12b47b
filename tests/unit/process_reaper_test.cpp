// Specification of teardown::process::pidfd_process and process_reaper (process_reaper.hpp): the
// supervisor's side of real processes.
//
// Every case runs real children: forked by pidfd_process::spawn, each populating at most 64 MiB
// of anonymous memory with MADV_POPULATE_WRITE (the kernel faults the pages in, so no sanitizer
// shadow is touched) and then waiting to be killed. The fixture checks that each case leaves no
// child behind (alive or zombie) and no descriptor open.
//
// Whether a SIGKILLed victim's memory is reaped by process_mrelease (released) or by its own exit
// (raced: it detached its mm first) is a race the kernel decides; the cases that need "released"
// try a few victims in turn and say how each ended. The syscall errors the kernel will not
// produce on demand (ENOSYS, EPERM, EINVAL for ever) are injected through options.mrelease.
// Nothing asserts a time: every wait is a liveness bound that fails the test.
#include "teardown/process_reaper.hpp"

#include <gtest/gtest.h>
#include <linux/capability.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "fork_test_support.hpp"
#include "teardown/process.hpp"
#include "test_support.hpp"

namespace {

using teardown::process::exit_status;
using teardown::process::pidfd_process;
using teardown::process::process_reaper;
using teardown::process::process_reaper_options;
using teardown::process::process_reaper_stats;
using namespace std::chrono_literals;

constexpr std::size_t mib = 1024 * 1024;
constexpr std::size_t victim_bytes = 64 * mib;

std::size_t open_descriptors() {
  std::size_t count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) ++count;
  return count;
}

// Populates `bytes` of private anonymous memory without a user-space write (a sanitizer's
// shadow stays untouched); memset where the kernel lacks MADV_POPULATE_WRITE (5.14).
void populate(std::size_t bytes) {
  void* memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) _exit(120);
#if defined(MADV_POPULATE_WRITE)
  if (madvise(memory, bytes, MADV_POPULATE_WRITE) == 0) return;
#else
  if (madvise(memory, bytes, 23) == 0) return;
#endif
  std::memset(memory, 1, bytes);
}

// A child that runs `setup`, populates `bytes`, says so with one byte and waits to be killed.
// Returns once it is ready. `report` (optional) is written by setup into the pipe too.
pidfd_process spawn_victim(std::size_t bytes, const std::function<void()>& setup = {}) {
  int ready[2];
  if (pipe2(ready, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe2");
  pidfd_process child = pidfd_process::spawn([&] {
    ::close(ready[0]);
    if (setup) setup();
    populate(bytes);
    const char byte = 1;
    if (::write(ready[1], &byte, 1) != 1) _exit(121);
    for (;;) pause();
  });
  ::close(ready[1]);
  char byte = 0;
  const ssize_t got = ::read(ready[0], &byte, 1);
  ::close(ready[0]);
  EXPECT_EQ(got, 1) << "the victim died before it was ready";
  return child;
}

std::uint64_t own_anonymous_rss() { return teardown::process::detail::anonymous_rss_bytes(getpid()); }

// What the trace hooks saw, for one reaper's domain.
struct recorded {
  static inline std::mutex mutex;
  static inline std::vector<teardown::trace::process_kill_event> kills;
  static inline std::vector<teardown::trace::process_release_event> releases;
  static inline std::vector<std::string> results;
  static void on_kill(const teardown::trace::process_kill_event& event) {
    const std::lock_guard lock(mutex);
    kills.push_back(event);
  }
  static void on_release(const teardown::trace::process_release_event& event) {
    const std::lock_guard lock(mutex);
    releases.push_back(event);
    results.emplace_back(event.result);
  }
  static void reset() {
    const std::lock_guard lock(mutex);
    kills.clear();
    releases.clear();
    results.clear();
  }
};

class ProcessReaperTest : public ::testing::Test {
 protected:
  void SetUp() override {
    descriptors_before_ = open_descriptors();
    recorded::reset();
    teardown::trace::set_hook<teardown::trace::process_kill_event>(&recorded::on_kill);
    teardown::trace::set_hook<teardown::trace::process_release_event>(&recorded::on_release);
  }
  void TearDown() override {
    teardown::trace::clear_hook<teardown::trace::process_kill_event>();
    teardown::trace::clear_hook<teardown::trace::process_release_event>();
    int status = 0;
    errno = 0;
    EXPECT_EQ(waitpid(-1, &status, WNOHANG | __WALL), -1) << "a child (alive or zombie) was left behind";
    EXPECT_EQ(errno, ECHILD);
    EXPECT_EQ(open_descriptors(), descriptors_before_) << "a descriptor was left open";
  }

  // Kills victims one after another until process_mrelease reaps one (at most `tries`), waiting
  // for each; the kernel decides whether the victim detaches its mm before the worker's call.
  static bool kill_until_released(process_reaper& reaper, int tries, std::uint64_t& charged) {
    for (int attempt = 0; attempt < tries; ++attempt) {
      pidfd_process victim = spawn_victim(victim_bytes);
      const std::uint64_t released_before = reaper.stats().released;
      EXPECT_TRUE(reaper.kill(victim));
      reaper.flush();
      EXPECT_EQ(victim.wait().signal, SIGKILL);
      const process_reaper_stats stats = reaper.stats();
      if (stats.unsupported != 0) return false;
      if (stats.released > released_before) {
        const std::lock_guard lock(recorded::mutex);
        charged = recorded::releases.back().bytes;
        return true;
      }
    }
    return false;
  }

  std::size_t descriptors_before_ = 0;
};

bool kernel_has_process_mrelease() {
  errno = 0;
  (void)teardown::process::process_mrelease_syscall(-1, 0);
  return errno != ENOSYS;
}

#define SKIP_WITHOUT_PROCESS_MRELEASE()                                                          \
  do {                                                                                            \
    if (!kernel_has_process_mrelease()) {                                                         \
      GTEST_SKIP() << "this kernel has no process_mrelease (ENOSYS: Linux before 5.15, or a "     \
                      "seccomp filter)";                                                         \
    }                                                                                             \
  } while (false)

// ---- pidfd_process ------------------------------------------------------------------------------

TEST_F(ProcessReaperTest, SpawnedChildRunsItsMainAndWaitReturnsItsExitCode) {
  pidfd_process child = pidfd_process::spawn([] { return 7; });
  ASSERT_TRUE(child);
  EXPECT_GT(child.pid(), 0);
  EXPECT_GE(child.fd(), 3);
  const exit_status status = child.wait();
  EXPECT_EQ(status.exit_code, 7);
  EXPECT_EQ(status.signal, 0);
  EXPECT_TRUE(child.exited());
  EXPECT_EQ(child.wait().exit_code, 7) << "a second wait returns the same status";
  EXPECT_FALSE(child.send_signal(SIGKILL)) << "a reaped child is gone: the pidfd reaches nothing";
}

TEST_F(ProcessReaperTest, ChildWhoseMainThrowsExitsWith127) {
  pidfd_process child = pidfd_process::spawn([]() -> int { throw std::runtime_error("child main failed"); });
  EXPECT_EQ(child.wait().exit_code, 127);
}

TEST_F(ProcessReaperTest, TryWaitSaysNothingWhileTheChildRuns) {
  pidfd_process child = spawn_victim(mib);
  EXPECT_FALSE(child.try_wait().has_value());
  EXPECT_FALSE(child.exited());
  EXPECT_TRUE(child.send_signal(SIGKILL));
  ASSERT_TRUE(teardown_test::eventually([&] { return child.exited(); }));
  const auto status = child.try_wait();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->signal, SIGKILL);
  EXPECT_EQ(status->exit_code, -1);
}

TEST_F(ProcessReaperTest, MovedFromAndDefaultObjectsNameNoProcess) {
  pidfd_process child = pidfd_process::spawn([] { return 0; });
  pidfd_process moved = std::move(child);
  EXPECT_FALSE(child);  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  EXPECT_THROW(child.wait(), std::logic_error);
  EXPECT_THROW((void)child.send_signal(SIGKILL), std::logic_error);
  pidfd_process none;
  EXPECT_FALSE(none);
  EXPECT_THROW((void)none.exited(), std::logic_error);
  EXPECT_EQ(moved.wait().exit_code, 0);
}

TEST_F(ProcessReaperTest, AdoptRefusesPidsThatNameNoSingleProcess) {
  EXPECT_THROW((void)pidfd_process::adopt(0), std::invalid_argument);
  EXPECT_THROW((void)pidfd_process::adopt(-1), std::invalid_argument);
  pidfd_process child = pidfd_process::spawn([] { return 0; });
  const pid_t pid = child.pid();
  (void)child.wait();
  try {
    (void)pidfd_process::adopt(pid);  // reaped: no such process (unless the pid was reused)
  } catch (const std::system_error& error) {
    EXPECT_EQ(error.code().value(), ESRCH) << error.what();
  }
}

// A process that is not our child: a grandchild, whose parent (our child) waits for it.
TEST_F(ProcessReaperTest, AdoptedNonChildIsKilledAndReleasedButWaitSaysItIsNotOurChild) {
  SKIP_WITHOUT_PROCESS_MRELEASE();
  int report[2];
  ASSERT_EQ(pipe2(report, O_CLOEXEC), 0);
  pidfd_process parent = pidfd_process::spawn([&] {
    ::close(report[0]);
    const pid_t grandchild = fork();
    if (grandchild == 0) {
      populate(victim_bytes);
      const pid_t self = getpid();
      if (::write(report[1], &self, sizeof self) != sizeof self) _exit(121);
      for (;;) pause();
    }
    ::close(report[1]);
    int status = 0;
    while (waitpid(grandchild, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL ? 0 : 1;
  });
  ::close(report[1]);
  pid_t grandchild = 0;
  ASSERT_EQ(::read(report[0], &grandchild, sizeof grandchild), static_cast<ssize_t>(sizeof grandchild));
  ::close(report[0]);

  pidfd_process victim = pidfd_process::adopt(grandchild);
  EXPECT_EQ(victim.pid(), grandchild);
  process_reaper reaper;
  EXPECT_TRUE(reaper.kill(victim));
  reaper.flush();
  const process_reaper_stats stats = reaper.stats();
  EXPECT_EQ(stats.killed, 1u);
  EXPECT_EQ(stats.released + stats.raced, 1u) << "process_mrelease works on any process we may kill";
  EXPECT_EQ(stats.bytes_in_teardown, 0u);
  try {
    (void)victim.wait();
    ADD_FAILURE() << "wait() on a process that is not our child returned";
  } catch (const std::system_error& error) {
    EXPECT_EQ(error.code().value(), ECHILD);
    EXPECT_NE(std::string(error.what()).find("not a child of this process"), std::string::npos) << error.what();
  }
  EXPECT_TRUE(teardown_test::eventually([&] { return victim.exited(); })) << "exited() works for any process";
  EXPECT_EQ(parent.wait().exit_code, 0) << "our child reaped its own child, killed by SIGKILL";
}

// ---- process_reaper: the kernel's answers -------------------------------------------------------

TEST_F(ProcessReaperTest, KillOfASpawnedChildReleasesAndCountsItsMemory) {
  SKIP_WITHOUT_PROCESS_MRELEASE();
  process_reaper reaper;
  std::uint64_t charged = 0;
  const bool released = kill_until_released(reaper, 20, charged);
  const process_reaper_stats stats = reaper.stats();
  ASSERT_TRUE(released) << "no victim of " << stats.killed << " was reaped by process_mrelease ("
                        << stats.raced << " detached their mm first)";
  EXPECT_EQ(stats.released + stats.raced, stats.killed) << "each victim counted once";
  EXPECT_EQ(stats.pending, 0u);
  EXPECT_EQ(stats.bytes_in_teardown, 0u);
  EXPECT_TRUE(stats.mrelease_supported);
  // The charge is the anonymous RSS read at kill time: what the child populated, plus what it
  // shares copy-on-write with us (at most our own anonymous RSS) and its runtime's.
  EXPECT_GE(charged, victim_bytes);
  EXPECT_LE(charged, victim_bytes + own_anonymous_rss() + 64 * mib);
  EXPECT_GE(stats.bytes_released, charged);
  const std::lock_guard lock(recorded::mutex);
  ASSERT_EQ(recorded::kills.size(), stats.killed);
  ASSERT_EQ(recorded::releases.size(), stats.killed);
  EXPECT_EQ(recorded::kills.back().domain, reaper.trace_domain());
  EXPECT_NE(reaper.trace_domain(), 0u);
  EXPECT_EQ(recorded::kills.back().signal, SIGKILL);
  EXPECT_EQ(recorded::kills.back().bytes, charged);
  EXPECT_EQ(recorded::releases.back().domain, reaper.trace_domain());
  EXPECT_EQ(recorded::releases.back().pid, recorded::kills.back().pid);
  EXPECT_EQ(recorded::results.back(), "released");
  EXPECT_EQ(recorded::releases.back().tries, 1u);
}

TEST_F(ProcessReaperTest, ExitedButUnreapedChildIsCountedAsRacedAndNotRetried) {
  SKIP_WITHOUT_PROCESS_MRELEASE();
  process_reaper reaper;
  pidfd_process child = pidfd_process::spawn([] { return 0; });
  ASSERT_TRUE(teardown_test::eventually([&] { return child.exited(); }));
  EXPECT_TRUE(reaper.kill(child)) << "a zombie takes the signal";
  reaper.flush();
  const process_reaper_stats stats = reaper.stats();
  EXPECT_EQ(stats.raced, 1u);
  EXPECT_EQ(stats.retries, 0u);
  EXPECT_EQ(stats.released, 0u);
  EXPECT_EQ(stats.bytes_in_teardown, 0u);
  EXPECT_EQ(child.wait().exit_code, 0);
}

TEST_F(ProcessReaperTest, ReapedChildIsNotKilledAndNothingIsCounted) {
  process_reaper reaper;
  pidfd_process child = pidfd_process::spawn([] { return 0; });
  (void)child.wait();
  EXPECT_FALSE(reaper.kill(child));
  reaper.flush();
  const process_reaper_stats stats = reaper.stats();
  EXPECT_EQ(stats.killed, 0u);
  EXPECT_EQ(stats.pending, 0u);
  EXPECT_EQ(stats.worker.enqueued, 0u);
  EXPECT_EQ(stats.bytes_in_teardown, 0u);
}

// A signal that does not kill: the kernel refuses (EINVAL, not dying) every time; the worker
// tries a bounded number of times and lets the charge go.
TEST_F(ProcessReaperTest, SignalThatDoesNotKillIsCountedNotDyingAfterBoundedRetries) {
  SKIP_WITHOUT_PROCESS_MRELEASE();
  process_reaper reaper({.retries = 3, .retry_interval = 1ms});
  pidfd_process victim = spawn_victim(victim_bytes, [] { signal(SIGUSR1, SIG_IGN); });
  EXPECT_TRUE(reaper.kill(victim, SIGUSR1));
  reaper.flush();
  process_reaper_stats stats = reaper.stats();
  EXPECT_EQ(stats.not_dying, 1u);
  EXPECT_EQ(stats.retries, 3u);
  EXPECT_EQ(stats.bytes_in_teardown, 0u);
  EXPECT_FALSE(victim.exited());
  {
    const std::lock_guard lock(recorded::mutex);
    ASSERT_EQ(recorded::results.size(), 1u);
    EXPECT_EQ(recorded::results[0], "not_dying");
    EXPECT_EQ(recorded::releases[0].tries, 4u);
  }
  EXPECT_TRUE(reaper.kill(victim));  // now for real
  reaper.flush();
  stats = reaper.stats();
  EXPECT_EQ(stats.released + stats.raced, 1u);
  EXPECT_EQ(victim.wait().signal, SIGKILL);
}

// ---- process_reaper: injected answers -----------------------------------------------------------

struct injected {
  static inline std::atomic<int> error{0};
  static inline std::atomic<int> calls{0};
  static int mrelease(int, unsigned) {
    calls.fetch_add(1);
    errno = error.load();
    return -1;
  }
  static void set(int value) {
    error = value;
    calls = 0;
  }
};

TEST_F(ProcessReaperTest, EnosysFallsBackToWaitingForTheExitAndSaysSo) {
  injected::set(ENOSYS);
  process_reaper reaper({.mrelease = &injected::mrelease});
  // A victim that ignores the signal: the worker waits for an exit that only our SIGKILL below
  // brings, so the charge is seen held until then.
  pidfd_process victim = spawn_victim(victim_bytes, [] { signal(SIGUSR1, SIG_IGN); });
  EXPECT_TRUE(reaper.kill(victim, SIGUSR1));
  EXPECT_GE(reaper.bytes_in_teardown(), victim_bytes);
  EXPECT_FALSE(reaper.wait_for_budget(0, 20ms)) << "the charge is held while the victim lives";
  EXPECT_TRUE(victim.send_signal(SIGKILL));
  EXPECT_TRUE(reaper.wait_for_budget(0, 60s)) << "the charge goes back once the victim has exited";
  reaper.flush();
  process_reaper_stats stats = reaper.stats();
  EXPECT_EQ(stats.unsupported, 1u);
  EXPECT_FALSE(stats.mrelease_supported);
  EXPECT_EQ(injected::calls.load(), 1);
  EXPECT_EQ(victim.wait().signal, SIGKILL);

  pidfd_process second = spawn_victim(mib);
  EXPECT_TRUE(reaper.kill(second));
  reaper.flush();
  stats = reaper.stats();
  EXPECT_EQ(stats.unsupported, 2u);
  EXPECT_EQ(injected::calls.load(), 1) << "after ENOSYS the call is not made again";
  EXPECT_TRUE(second.exited());
  EXPECT_EQ(second.wait().signal, SIGKILL);
}

TEST_F(ProcessReaperTest, EpermIsCountedAsNotPermittedAndTheExitIsWaitedFor) {
  injected::set(EPERM);
  process_reaper reaper({.mrelease = &injected::mrelease});
  pidfd_process victim = spawn_victim(victim_bytes);
  EXPECT_TRUE(reaper.kill(victim));
  reaper.flush();
  const process_reaper_stats stats = reaper.stats();
  EXPECT_EQ(stats.not_permitted, 1u);
  EXPECT_TRUE(stats.mrelease_supported);
  EXPECT_EQ(stats.bytes_in_teardown, 0u);
  EXPECT_TRUE(victim.exited());
  EXPECT_EQ(victim.wait().signal, SIGKILL);
}

TEST_F(ProcessReaperTest, InjectedEsrchIsRacedAndNeverRetried) {
  injected::set(ESRCH);
  process_reaper reaper({.mrelease = &injected::mrelease});
  pidfd_process victim = spawn_victim(mib);
  EXPECT_TRUE(reaper.kill(victim));
  reaper.flush();
  const process_reaper_stats stats = reaper.stats();
  EXPECT_EQ(stats.raced, 1u);
  EXPECT_EQ(stats.retries, 0u);
  EXPECT_EQ(injected::calls.load(), 1);
  EXPECT_EQ(victim.wait().signal, SIGKILL);
}

// EINVAL for ever (a kernel that keeps refusing), even once the victim is gone: the retries end.
TEST_F(ProcessReaperTest, EinvalForEverEndsAfterTheRetryBound) {
  injected::set(EINVAL);
  process_reaper reaper({.retries = 5, .retry_interval = 1ms, .mrelease = &injected::mrelease});
  pidfd_process victim = spawn_victim(mib);
  EXPECT_TRUE(reaper.kill(victim));
  reaper.flush();
  const process_reaper_stats stats = reaper.stats();
  EXPECT_EQ(stats.not_dying, 1u);
  EXPECT_EQ(stats.retries, 5u);
  EXPECT_EQ(injected::calls.load(), 6);
  EXPECT_EQ(stats.bytes_in_teardown, 0u);
  EXPECT_EQ(victim.wait().signal, SIGKILL);
}

TEST_F(ProcessReaperTest, OtherErrorsAreCountedAsFailed) {
  injected::set(EBADF);
  process_reaper reaper({.mrelease = &injected::mrelease});
  pidfd_process victim = spawn_victim(mib);
  EXPECT_TRUE(reaper.kill(victim));
  reaper.flush();
  EXPECT_EQ(reaper.stats().failed, 1u);
  EXPECT_EQ(injected::calls.load(), 1);
  EXPECT_EQ(reaper.bytes_in_teardown(), 0u);
  EXPECT_EQ(victim.wait().signal, SIGKILL);
}

// ---- shared mm ------------------------------------------------------------------------------------

// A victim that enabled shadow teardown shares its mm with a CLONE_VM helper, which is not
// exiting: the kernel refuses to reap (EINVAL) until the victim has detached (ESRCH). Counted as
// shared_mm when the worker's call came first, raced otherwise; never hangs.
TEST_F(ProcessReaperTest, VictimSharingItsMmWithAHelperIsCountedAsSharedMm) {
  SKIP_WITHOUT_PROCESS_MRELEASE();
  if (!teardown::process::shadow_teardown_supported) GTEST_SKIP() << "no shadow teardown on this platform";
  // The helpers outlive their victims by an instant; as a subreaper we reap them ourselves.
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  process_reaper reaper({.retries = 100000, .retry_interval = 1ms});  // ends at the exit, not the bound
  int attempts = 0;
  for (; attempts < 20 && reaper.stats().shared_mm == 0; ++attempts) {
    int report[2];
    ASSERT_EQ(pipe2(report, O_CLOEXEC), 0);
    pidfd_process victim = spawn_victim(victim_bytes, [&] {
      ::close(report[0]);
      const pid_t helper = teardown::process::enable_shadow_teardown();
      if (::write(report[1], &helper, sizeof helper) != sizeof helper) _exit(121);
    });
    ::close(report[1]);
    pid_t helper = 0;
    ASSERT_EQ(::read(report[0], &helper, sizeof helper), static_cast<ssize_t>(sizeof helper));
    ::close(report[0]);
    EXPECT_TRUE(reaper.kill(victim));
    reaper.flush();
    EXPECT_EQ(victim.wait().signal, SIGKILL);
    int status = 0;
    ASSERT_EQ(waitpid(helper, &status, __WALL), helper) << "the helper ends after its program";
  }
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 0), 0);
  const process_reaper_stats stats = reaper.stats();
  EXPECT_EQ(stats.shared_mm, 1u) << "in " << attempts << " victims, " << stats.raced << " detached first";
  EXPECT_EQ(stats.shared_mm + stats.raced, stats.killed);
  EXPECT_EQ(stats.released, 0u) << "the kernel never reaps an mm another live process uses";
  EXPECT_EQ(stats.not_dying, 0u);
  EXPECT_EQ(stats.bytes_in_teardown, 0u);
}

// ---- budget, back-pressure, lifetime --------------------------------------------------------------

// An mrelease that holds the worker until the test opens the gate.
struct gated {
  static inline std::atomic<bool> open{true};
  static inline std::atomic<int> entered{0};
  static int mrelease(int pidfd, unsigned flags) {
    entered.fetch_add(1);
    while (!open.load()) std::this_thread::sleep_for(100us);
    return teardown::process::process_mrelease_syscall(pidfd, flags);
  }
  // Closes the gate, kills `victim` through `reaper` (built with mrelease = &gated::mrelease)
  // and returns true once the worker waits at the gate, holding the victim's charge.
  [[nodiscard]] static bool kill_into_the_gate(process_reaper& reaper, const pidfd_process& victim) {
    open = false;
    entered = 0;
    return reaper.kill(victim) && teardown_test::eventually([] { return entered.load() == 1; });
  }
};

TEST_F(ProcessReaperTest, WaitForBudgetReturnsOnceTheBytesInTeardownAreUnderTheBound) {
  process_reaper reaper({.mrelease = &gated::mrelease});
  pidfd_process victim = spawn_victim(victim_bytes);
  ASSERT_TRUE(gated::kill_into_the_gate(reaper, victim));
  EXPECT_GE(reaper.bytes_in_teardown(), victim_bytes);
  EXPECT_EQ(reaper.stats().pending, 1u);
  EXPECT_TRUE(reaper.wait_for_budget(reaper.bytes_in_teardown(), 0ms)) << "already at or under the bound";
  EXPECT_FALSE(reaper.wait_for_budget(0, 20ms)) << "the worker holds the charge behind the gate";
  gated::open = true;
  EXPECT_TRUE(reaper.wait_for_budget(0, 60s));
  EXPECT_EQ(reaper.bytes_in_teardown(), 0u);
  EXPECT_EQ(victim.wait().signal, SIGKILL);
}

// A wait_for_budget that waits past the worker's boost_after raises a worker configured below
// the waiter's priority (reaper.hpp, "Boost"), and the drained worker lowers itself again.
TEST_F(ProcessReaperTest, AWaitForBudgetThatWaitsRaisesTheWorkerUntilItIsDrained) {
  errno = 0;
  const int waiter_nice = getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
  if (waiter_nice >= 19) GTEST_SKIP() << "the test runs at nice 19: no waiter is more urgent than the worker";
  if (const auto why = teardown_test::nice_lowering_refused(waiter_nice)) GTEST_SKIP() << *why;
  process_reaper reaper({.nice = 19, .mrelease = &gated::mrelease});
  pidfd_process victim = spawn_victim(victim_bytes);
  ASSERT_TRUE(gated::kill_into_the_gate(reaper, victim));
  if (reaper.stats().worker.setup_warnings & teardown::setup_warning_nice) {
    gated::open = true;
    GTEST_SKIP() << "setpriority(19) was refused";
  }
  std::thread waiter([&] { EXPECT_TRUE(reaper.wait_for_budget(0, 60s)); });
  const bool raised = teardown_test::eventually([&] { return reaper.stats().worker.boosted; }, 20s);
  gated::open = true;
  waiter.join();
  EXPECT_TRUE(raised) << "the waiting wait_for_budget never raised the worker";
  EXPECT_EQ(reaper.stats().worker.boosts, 1u);
  EXPECT_TRUE(teardown_test::eventually([&] { return !reaper.stats().worker.boosted; }, 20s));
  EXPECT_EQ(victim.wait().signal, SIGKILL);
}

// Only the first release waits at the gate: the worker held in one, while whoever else makes a
// release passes.
struct first_gated {
  static inline std::atomic<bool> open{true};
  static inline std::atomic<int> entered{0};
  static int mrelease(int pidfd, unsigned flags) {
    if (entered.fetch_add(1) == 0) {
      while (!open.load()) std::this_thread::sleep_for(100us);
    }
    return teardown::process::process_mrelease_syscall(pidfd, flags);
  }
};

// Waiters help (reaper.hpp): the worker (at nice 0, the waiter's own: nothing to raise) is held
// in its first release; a second kill waits on the queue. A wait_for_budget that has waited
// boost_after makes that kill and release itself, and returns once the bytes are under its
// bound, while the worker still holds the first.
TEST_F(ProcessReaperTest, AWaitForBudgetMakesTheQueuedKillsItselfWhileTheWorkerIsHeld) {
  process_reaper reaper({.mrelease = &first_gated::mrelease});
  first_gated::open = false;
  first_gated::entered = 0;
  pidfd_process held = spawn_victim(victim_bytes);
  pidfd_process queued = spawn_victim(victim_bytes);
  ASSERT_TRUE(reaper.kill(held));
  ASSERT_TRUE(teardown_test::eventually([] { return first_gated::entered.load() == 1; }));
  const std::uint64_t held_bytes = reaper.bytes_in_teardown();
  ASSERT_TRUE(reaper.kill(queued));
  ASSERT_GT(reaper.bytes_in_teardown(), held_bytes);
  const bool under = reaper.wait_for_budget(held_bytes, 60s);
  const auto stats = reaper.stats();
  first_gated::open = true;
  EXPECT_TRUE(under) << "the waiter did not make the queued kill itself";
  EXPECT_EQ(stats.worker.helped, 1u);
  EXPECT_EQ(stats.bytes_in_teardown, held_bytes) << "the worker still holds the first";
  EXPECT_TRUE(reaper.wait_for_budget(0, 60s));
  EXPECT_EQ(held.wait().signal, SIGKILL);
  EXPECT_EQ(queued.wait().signal, SIGKILL);
}

// fork() on another thread while the worker waits inside a release (here the release call
// itself, behind a gate; in life a victim that handles SIGTERM on a kernel without
// process_mrelease): fork() does not wait for it, and the child's budget holds none of the
// parent's charges. The limit below is a hang guard: a fork still blocked after it has waited
// for the worker, and the gate is then opened so that the test ends.
TEST_F(ProcessReaperTest, ForkWhileTheWorkerWaitsInAReleaseDoesNotWaitAndTheChildOwesNothing) {
  process_reaper reaper({.mrelease = &gated::mrelease});
  pidfd_process victim = spawn_victim(victim_bytes);
  ASSERT_TRUE(gated::kill_into_the_gate(reaper, victim));
  ASSERT_GE(reaper.bytes_in_teardown(), victim_bytes);
  std::atomic<bool> forked{false};
  pid_t child = -1;
  std::thread forker([&] {
    child = teardown_test::start_child([&] {
      teardown_test::child_checks check;
      check.expect(reaper.bytes_in_teardown() == 0, "the child owes none of the parent's charges");
      check.expect(reaper.wait_for_budget(0, 0ms), "wait_for_budget(0) returns at once in the child");
      reaper.flush();
      return check.exit_code();
    });
    forked = true;
  });
  const bool returned = teardown_test::eventually([&] { return forked.load(); }, 30s);
  EXPECT_TRUE(returned) << "fork() waited for the worker's release";
  EXPECT_GE(reaper.bytes_in_teardown(), victim_bytes) << "the parent's worker still holds the charge";
  gated::open = true;
  forker.join();
  EXPECT_EQ(teardown_test::wait_child(child), teardown_test::child_ok);
  EXPECT_TRUE(reaper.wait_for_budget(0, 60s));
  EXPECT_EQ(victim.wait().signal, SIGKILL);
}

// The state a victim is in once its main thread called pthread_exit(): the leader a zombie, whose
// /proc/PID/statm reads zero, while another thread keeps the memory mapped. Made with raw
// system calls (a CLONE_THREAD thread that only blocks, then the leader's own exit), since a fork
// child of a threaded program may not start threads under every runtime (ThreadSanitizer dies,
// and intercepts glibc's clone()). The new thread runs nothing but the asm below, on no stack of
// its own use: returns its tid, or -errno; -ENOSYS where this file has no such asm.
long start_blocked_thread(void* stack_top) {
  constexpr unsigned long flags = CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM;
#if defined(__x86_64__)
  long result = SYS_clone;
  register long parent_tid __asm__("rdx") = 0;
  register long child_tid __asm__("r10") = 0;
  register long tls __asm__("r8") = 0;
  __asm__ volatile(
      "syscall\n\t"
      "test %%rax, %%rax\n\t"
      "jnz 1f\n\t"
      "2: mov %[pause], %%eax\n\t"  // the new thread: pause() for ever (SIGKILL ends it)
      "syscall\n\t"
      "jmp 2b\n\t"
      "1:\n\t"
      : "+a"(result)
      : "D"(flags), "S"(stack_top), "r"(parent_tid), "r"(child_tid), "r"(tls), [pause] "i"(SYS_pause)
      : "rcx", "r11", "memory");
  return result;
#elif defined(__aarch64__)
  register long x8 __asm__("x8") = SYS_clone;
  register long x0 __asm__("x0") = static_cast<long>(flags);
  register void* x1 __asm__("x1") = stack_top;
  register long x2 __asm__("x2") = 0;
  register long x3 __asm__("x3") = 0;
  register long x4 __asm__("x4") = 0;
  __asm__ volatile(
      "svc #0\n\t"
      "cbnz x0, 1f\n\t"
      "2: mov x0, #0\n\t"  // the new thread: ppoll(NULL, 0, NULL, NULL) for ever
      "mov x1, #0\n\t"
      "mov x2, #0\n\t"
      "mov x3, #0\n\t"
      "mov x8, %[ppoll]\n\t"
      "svc #0\n\t"
      "b 2b\n\t"
      "1:\n\t"
      : "+r"(x0), "+r"(x1), "+r"(x2), "+r"(x3)
      : "r"(x8), "r"(x4), [ppoll] "i"(SYS_ppoll)
      : "memory");
  return x0;
#else
  (void)stack_top;
  (void)flags;
  return -ENOSYS;
#endif
}

bool leader_is_zombie(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const std::size_t at = text.rfind(')');
  return at != std::string::npos && at + 2 < text.size() && text[at + 2] == 'Z';
}

TEST_F(ProcessReaperTest, VictimWhoseMainThreadExitedIsChargedWhatItsOtherThreadsHold) {
  int ready[2];
  ASSERT_EQ(pipe2(ready, O_CLOEXEC), 0);
  pidfd_process victim = pidfd_process::spawn([&] {
    ::close(ready[0]);
    populate(victim_bytes);
    constexpr std::size_t stack_bytes = 64 * 1024;
    void* stack = mmap(nullptr, stack_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (stack == MAP_FAILED) _exit(120);
    const long started = start_blocked_thread(static_cast<char*>(stack) + stack_bytes);
    if (started == -ENOSYS) _exit(124);
    if (started < 0) _exit(122);
    const char byte = 1;
    if (::write(ready[1], &byte, 1) != 1) _exit(121);
    syscall(SYS_exit, 0);  // this thread only, as pthread_exit() ends
    _exit(123);
  });
  ::close(ready[1]);
  char byte = 0;
  const ssize_t got = ::read(ready[0], &byte, 1);
  ::close(ready[0]);
  if (got != 1) {
    const exit_status status = victim.wait();
    if (status.exit_code == 124) GTEST_SKIP() << "no raw clone for this architecture in the test";
    FAIL() << "the victim died before it was ready: exit " << status.exit_code << ", signal " << status.signal;
  }
  ASSERT_TRUE(teardown_test::eventually([&] { return leader_is_zombie(victim.pid()); }));
  ASSERT_FALSE(victim.exited()) << "the helper thread keeps the process alive";

  gated::open = false;
  gated::entered = 0;
  process_reaper reaper({.mrelease = &gated::mrelease});
  EXPECT_TRUE(reaper.kill(victim));
  EXPECT_GE(reaper.bytes_in_teardown(), victim_bytes) << "charged what the leader's statm says, not what is held";
  EXPECT_FALSE(reaper.wait_for_budget(victim_bytes / 2, 0ms));
  gated::open = true;
  reaper.flush();
  EXPECT_EQ(reaper.bytes_in_teardown(), 0u);
  {
    const std::lock_guard lock(recorded::mutex);
    EXPECT_EQ(recorded::kills.size(), 1u);
    if (!recorded::kills.empty()) {
      EXPECT_GE(recorded::kills.back().bytes, victim_bytes);
    }
  }
  EXPECT_EQ(victim.wait().signal, SIGKILL);
}

// pthread_exit() in the child's main unwinds with abi::__forced_unwind: spawn's catch of the
// child's exceptions lets it through, and the thread ends as the call says. spawn is called from
// a thread of our own, so that the unwind ends at that thread's start (the main thread's would
// cross gtest's catch (...), which stops it). The child's exit() then runs its atexit handlers:
// the last one registered ends it with 42.
TEST_F(ProcessReaperTest, ChildWhoseMainCallsPthreadExitIsNotAborted) {
#if defined(__clang__) && defined(__has_feature)
#if __has_feature(thread_sanitizer)
  GTEST_SKIP() << "Clang's ThreadSanitizer runtime (14) crashes when a thread of a fork child calls "
                  "pthread_exit(), with no library code involved (a plain fork() then pthread_exit() "
                  "exits 66 there); GCC's runs this case";
#endif
#endif
  struct call {
    pidfd_process child;
    std::string error;
    static void* run(void* self) {
      auto* me = static_cast<call*>(self);
      try {
        me->child = pidfd_process::spawn([] {
          std::atexit([] { _exit(42); });
          pthread_exit(nullptr);
        });
      } catch (const std::exception& e) {
        me->error = e.what();
      }
      return nullptr;
    }
  } spawned;
  pthread_t thread;
  ASSERT_EQ(pthread_create(&thread, nullptr, &call::run, &spawned), 0);
  ASSERT_EQ(pthread_join(thread, nullptr), 0);
  ASSERT_TRUE(spawned.child) << spawned.error;
  const exit_status status = spawned.child.wait();
  EXPECT_EQ(status.signal, 0) << "the child was killed (SIGABRT: the forced unwind was swallowed)";
  EXPECT_EQ(status.exit_code, 42);
}

TEST_F(ProcessReaperTest, KillWhoseChargeDoesNotFitReleasesOnTheCaller) {
  injected::set(ESRCH);
  process_reaper reaper({.budget_bytes = mib, .mrelease = &injected::mrelease});
  pidfd_process victim = spawn_victim(victim_bytes);
  EXPECT_TRUE(reaper.kill(victim));
  // Done before kill returned: no flush.
  const process_reaper_stats stats = reaper.stats();
  EXPECT_EQ(stats.over_budget, 1u);
  EXPECT_EQ(stats.raced, 1u);
  EXPECT_EQ(stats.pending, 0u);
  EXPECT_EQ(stats.worker.enqueued, 0u);
  EXPECT_EQ(stats.bytes_in_teardown, 0u);
  EXPECT_EQ(victim.wait().signal, SIGKILL);
}

// process_mrelease behind a gate the test opens: holds the worker inside a release.
struct release_gate {
  static inline std::atomic<bool> open{false};
  static inline std::atomic<int> calls{0};
  static int mrelease(int pidfd, unsigned flags) {
    calls.fetch_add(1);
    while (!open.load()) std::this_thread::sleep_for(1ms);
    return teardown::process::process_mrelease_syscall(pidfd, flags);
  }
  static void close() {
    open.store(false);
    calls.store(0);
  }
};

// lmkd's order: the worker sends the signal and calls process_mrelease right after, so a
// victim queued behind a release in progress is not signalled until the worker gets to it.
TEST_F(ProcessReaperTest, TheWorkerSendsTheSignalRightBeforeItsRelease) {
  release_gate::close();
  process_reaper reaper({.mrelease = &release_gate::mrelease});
  pidfd_process first = spawn_victim(mib);
  pidfd_process second = spawn_victim(mib);
  ASSERT_TRUE(reaper.kill(first));
  ASSERT_TRUE(teardown_test::eventually([] { return release_gate::calls.load() >= 1; }));
  ASSERT_TRUE(reaper.kill(second));
  // The worker is held in the first one's release: nobody has signalled the second yet.
  EXPECT_FALSE(second.exited());
  EXPECT_FALSE(second.try_wait().has_value());
  release_gate::open.store(true);
  reaper.flush();
  EXPECT_EQ(first.wait().signal, SIGKILL);
  EXPECT_EQ(second.wait().signal, SIGKILL);
  EXPECT_EQ(reaper.stats().killed, 2u);
  EXPECT_EQ(reaper.stats().pending, 0u);
}

// signal_on_worker = false: kill() sends the signal itself, whatever the worker is doing.
TEST_F(ProcessReaperTest, SignalOnTheCallerKillsBeforeKillReturns) {
  release_gate::close();
  process_reaper reaper({.mrelease = &release_gate::mrelease, .signal_on_worker = false});
  pidfd_process first = spawn_victim(mib);
  pidfd_process second = spawn_victim(mib);
  ASSERT_TRUE(reaper.kill(first));
  ASSERT_TRUE(teardown_test::eventually([] { return release_gate::calls.load() >= 1; }));
  ASSERT_TRUE(reaper.kill(second));
  EXPECT_EQ(second.wait().signal, SIGKILL);  // while the worker is still held in the first
  EXPECT_EQ(release_gate::calls.load(), 1);
  release_gate::open.store(true);
  reaper.flush();
  EXPECT_EQ(first.wait().signal, SIGKILL);
  EXPECT_EQ(reaper.stats().pending, 0u);
}

TEST_F(ProcessReaperTest, DestructionReleasesEveryQueuedProcess) {
  gated::open = false;
  gated::entered = 0;
  std::vector<pidfd_process> victims;
  for (int i = 0; i < 4; ++i) victims.push_back(spawn_victim(mib));
  {
    process_reaper reaper({.mrelease = &gated::mrelease});
    for (const pidfd_process& victim : victims) EXPECT_TRUE(reaper.kill(victim));
    ASSERT_TRUE(teardown_test::eventually([] { return gated::entered.load() == 1; }));
    EXPECT_EQ(reaper.stats().pending, 4u) << "one in the worker, three queued";
    gated::open = true;
  }  // the destructor drains
  {
    const std::lock_guard lock(recorded::mutex);
    EXPECT_EQ(recorded::releases.size(), 4u) << "every queued process was released before the destructor returned";
  }
  for (pidfd_process& victim : victims) EXPECT_EQ(victim.wait().signal, SIGKILL);
}

TEST_F(ProcessReaperTest, AfterStopKillReleasesOnTheCaller) {
  injected::set(ESRCH);
  process_reaper reaper({.mrelease = &injected::mrelease});
  reaper.stop();
  pidfd_process victim = spawn_victim(mib);
  EXPECT_TRUE(reaper.kill(victim));
  const process_reaper_stats stats = reaper.stats();
  EXPECT_EQ(stats.raced, 1u);
  EXPECT_EQ(stats.worker.inline_reaped, 1u);
  EXPECT_EQ(victim.wait().signal, SIGKILL);
}

TEST_F(ProcessReaperTest, StopForGivesUpWhileAReleaseRunsAndALaterStopFinishesIt) {
  gated::open = false;
  gated::entered = 0;
  pidfd_process victim = spawn_victim(mib);
  process_reaper reaper({.mrelease = &gated::mrelease});
  EXPECT_TRUE(reaper.kill(victim));
  ASSERT_TRUE(teardown_test::eventually([] { return gated::entered.load() == 1; }));
  EXPECT_FALSE(reaper.stop_for(20ms)) << "the worker is held in its release";
  gated::open = true;
  EXPECT_TRUE(reaper.stop_for(30s));
  EXPECT_EQ(reaper.stats().pending, 0u);
  EXPECT_EQ(victim.wait().signal, SIGKILL);
}

TEST_F(ProcessReaperTest, WorkerStatsAreTheUnderlyingReapersAsInStats) {
  injected::set(ESRCH);
  process_reaper reaper({.mrelease = &injected::mrelease});
  pidfd_process victim = spawn_victim(mib);
  EXPECT_TRUE(reaper.kill(victim));
  reaper.flush();
  EXPECT_EQ(reaper.worker_stats().reaped, 1u);
  EXPECT_EQ(reaper.worker_stats().reaped, reaper.stats().worker.reaped);
  EXPECT_EQ(victim.wait().signal, SIGKILL);
}

TEST_F(ProcessReaperTest, NiceIsTheOptionsUntilSetNiceChangesItAndBadValuesAreRefused) {
  process_reaper reaper({.nice = 5});
  // 5, or for an ordinary user the caller's nice: no nice is applied that no boost could undo.
  EXPECT_EQ(reaper.nice(), teardown_test::default_worker_nice(5));
  EXPECT_TRUE(reaper.set_nice(7)) << "raising the nice value needs no privilege";
  EXPECT_EQ(reaper.nice(), 7);
  EXPECT_THROW((void)reaper.set_nice(20), std::invalid_argument);
  EXPECT_THROW((void)reaper.set_nice(-21), std::invalid_argument);
  EXPECT_EQ(reaper.nice(), 7) << "a refused value changes nothing";
}

// Drops (or gives back) CAP_KILL from the calling thread's effective set: capabilities are per
// thread, so the rest of the process keeps it. False if the kernel refuses.
bool set_own_kill_capability(bool effective) {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (syscall(SYS_capget, &header, data) != 0) return false;
  if (effective) {
    data[0].effective |= 1u << CAP_KILL;
  } else {
    data[0].effective &= ~(1u << CAP_KILL);
  }
  return syscall(SYS_capset, &header, data) == 0;
}

// No permission to signal the process: kill() throws EPERM and nothing is charged or counted.
TEST_F(ProcessReaperTest, KillWithoutPermissionThrowsAndChangesNothing) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root, to start a victim under another user id";
  process_reaper reaper;
  pidfd_process victim = spawn_victim(mib, [] {
    if (setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0) _exit(122);
  });
  ASSERT_FALSE(victim.exited()) << "the victim could not take another user id";
  ASSERT_TRUE(set_own_kill_capability(false)) << "capset refused to drop CAP_KILL";
  try {
    (void)reaper.kill(victim);
    ADD_FAILURE() << "kill() of another user's process without CAP_KILL succeeded";
  } catch (const std::system_error& error) {
    EXPECT_EQ(error.code().value(), EPERM) << error.what();
  }
  ASSERT_TRUE(set_own_kill_capability(true));
  const process_reaper_stats stats = reaper.stats();
  EXPECT_EQ(stats.killed, 0u);
  EXPECT_EQ(stats.worker.enqueued, 0u);
  EXPECT_EQ(stats.bytes_in_teardown, 0u);
  EXPECT_FALSE(victim.exited());
  EXPECT_TRUE(victim.send_signal(SIGKILL));
  EXPECT_EQ(victim.wait().signal, SIGKILL);
}

// The two USDT probes carry the events' fields in order, the domain last (trace.hpp).
TEST_F(ProcessReaperTest, UsdtProbesCarryTheEventFieldsInOrder) {
#if TEARDOWN_TRACE_USDT
  FILE* readelf = popen(("readelf -n /proc/" + std::to_string(getpid()) + "/exe 2>/dev/null").c_str(), "r");
  ASSERT_NE(readelf, nullptr);
  std::string notes;
  char buffer[4096];
  for (std::size_t got = 0; (got = std::fread(buffer, 1, sizeof buffer, readelf)) > 0;) notes.append(buffer, got);
  if (pclose(readelf) != 0 || notes.empty()) GTEST_SKIP() << "readelf (binutils) is not installed";
  // The argument specs of a probe: "-8@..." is a signed 8-byte value; only the sizes are checked.
  const auto sizes_of = [&](const std::string& name) {
    const std::size_t at = notes.find("Name: " + name + "\n");
    if (at == std::string::npos) return std::string("(no probe)");
    const std::size_t arguments = notes.find("Arguments:", at);
    const std::string line = notes.substr(arguments + 10, notes.find('\n', arguments) - arguments - 10);
    std::string sizes;
    for (std::size_t spec = line.find_first_not_of(' '); spec != std::string::npos;
         spec = line.find_first_not_of(' ', line.find(' ', spec))) {
      sizes += line.substr(spec, line.find('@', spec) - spec) + " ";
    }
    return sizes;
  };
  EXPECT_EQ(sizes_of("process_kill"), "-8 8 -4 8 ");          // pid, bytes, signal, domain
  EXPECT_EQ(sizes_of("process_release"), "-8 8 8 4 8 8 ");    // pid, bytes, result, tries, wait_ns, domain
#else
  GTEST_SKIP() << "built without USDT probes (TEARDOWN_TRACE_USDT is 0)";
#endif
}

// ---- bad input ------------------------------------------------------------------------------------

TEST_F(ProcessReaperTest, BadOptionsAreRefusedNamingTheField) {
  const auto refused = [](process_reaper_options options, const char* field) {
    try {
      process_reaper reaper(std::move(options));
      ADD_FAILURE() << "accepted bad " << field;
    } catch (const std::invalid_argument& error) {
      EXPECT_NE(std::string(error.what()).find("teardown::process::process_reaper"), std::string::npos);
      EXPECT_NE(std::string(error.what()).find(field), std::string::npos) << error.what();
    }
  };
  refused({.name = ""}, "name");
  refused({.name = std::string("a\0b", 3)}, "name");
  refused({.nice = 20}, "nice");
  refused({.nice = -21}, "nice");
  refused({.budget_bytes = teardown::budget::max_cap + 1}, "budget_bytes");
  refused({.retry_interval = -1ms}, "retry_interval");
  refused({.exit_wait = -1ms}, "exit_wait");
  refused({.mrelease = nullptr}, "mrelease");
}

TEST_F(ProcessReaperTest, BadKillsAreRefusedAndChangeNothing) {
  process_reaper reaper;
  pidfd_process none;
  EXPECT_THROW((void)reaper.kill(none), std::invalid_argument);
  pidfd_process victim = spawn_victim(mib);
  EXPECT_THROW((void)reaper.kill(victim, 0), std::invalid_argument);
  EXPECT_THROW((void)reaper.kill(victim, SIGRTMAX + 1), std::invalid_argument);
  EXPECT_FALSE(victim.exited());
  const process_reaper_stats stats = reaper.stats();
  EXPECT_EQ(stats.killed, 0u);
  EXPECT_EQ(stats.bytes_in_teardown, 0u);
  EXPECT_TRUE(victim.send_signal(SIGKILL));
  EXPECT_EQ(victim.wait().signal, SIGKILL);
}

}  // namespace
