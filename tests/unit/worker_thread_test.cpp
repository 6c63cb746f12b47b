// Specification of worker_thread.hpp and the shared internal layer it includes (detail/): the
// worker's own setup (name, thread id, nice, CPUs), the thread start with signals blocked, the
// on-this-thread mark, the futex, the clocks' deadline rule, the CPU list parser, the fork
// registry and the creator check, the stop eventfd and the nice range.
#include "teardown/worker_thread.hpp"

#include <gtest/gtest.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "fork_test_support.hpp"
#include "teardown/detail/event_fd.hpp"

namespace {

using namespace std::chrono_literals;
namespace detail = teardown::detail;

std::string comm_of(pid_t tid) {
  std::ifstream file("/proc/self/task/" + std::to_string(tid) + "/comm");
  std::string name;
  std::getline(file, name);
  return name;
}

// Runs `body` on a thread of its own (so that name, nice and affinity changes stay there).
void on_a_new_thread(const std::function<void()>& body) { std::thread(body).join(); }

TEST(WorkerThreadSetupTest, NameThisThreadNamesOnlyTheCallingThread) {
  const std::string before = comm_of(detail::this_thread_tid());
  on_a_new_thread([] {
    EXPECT_TRUE(detail::name_this_thread("wt-test"));
    EXPECT_EQ(comm_of(detail::this_thread_tid()), "wt-test");
  });
  EXPECT_EQ(comm_of(detail::this_thread_tid()), before);
}

TEST(WorkerThreadSetupTest, NameThisThreadKeepsTheFirstFifteenBytes) {
  on_a_new_thread([] {
    EXPECT_TRUE(detail::name_this_thread("a-name-longer-than-fifteen"));
    EXPECT_EQ(comm_of(detail::this_thread_tid()), "a-name-longer-t");
  });
}

TEST(WorkerThreadSetupTest, ThisThreadTidIsTheKernelIdAndDiffersPerThread) {
  const pid_t here = detail::this_thread_tid();
  EXPECT_EQ(here, static_cast<pid_t>(syscall(SYS_gettid)));
  pid_t there = 0;
  on_a_new_thread([&] { there = detail::this_thread_tid(); });
  EXPECT_NE(there, 0);
  EXPECT_NE(there, here);
}

TEST(WorkerThreadSetupTest, SetThreadNiceChangesThatThreadOnly) {
  errno = 0;
  const int mine = getpriority(PRIO_PROCESS, static_cast<id_t>(detail::this_thread_tid()));
  ASSERT_EQ(errno, 0);
  on_a_new_thread([mine] {
    const pid_t tid = detail::this_thread_tid();
    const int target = mine < detail::max_nice ? mine + 1 : mine;  // raising needs no privilege
    EXPECT_TRUE(detail::set_thread_nice(tid, target));
    errno = 0;
    EXPECT_EQ(getpriority(PRIO_PROCESS, static_cast<id_t>(tid)), target);
  });
  errno = 0;
  EXPECT_EQ(getpriority(PRIO_PROCESS, static_cast<id_t>(detail::this_thread_tid())), mine);
}

TEST(WorkerThreadSetupTest, SetThreadNiceOfNoSuchThreadIsRefused) {
  // An id above pid_max's ceiling (2^22) names no thread: ESRCH.
  EXPECT_FALSE(detail::set_thread_nice(static_cast<pid_t>(1) << 30, 0));
}

TEST(WorkerThreadSetupTest, PreferCpusPinsTheCallingThread) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  int first = -1;
  for (int cpu = 0; cpu < CPU_SETSIZE && first < 0; ++cpu) {
    if (CPU_ISSET(static_cast<std::size_t>(cpu), &allowed)) first = cpu;
  }
  ASSERT_GE(first, 0);
  on_a_new_thread([first] {
    EXPECT_TRUE(detail::prefer_cpus({first}));
    cpu_set_t now;
    CPU_ZERO(&now);
    ASSERT_EQ(sched_getaffinity(0, sizeof now, &now), 0);
    EXPECT_EQ(CPU_COUNT(&now), 1);
    EXPECT_TRUE(CPU_ISSET(static_cast<std::size_t>(first), &now));
  });
}

TEST(WorkerThreadSetupTest, PreferCpusWithNoUsableCpuIsRefusedAndChangesNothing) {
  on_a_new_thread([] {
    cpu_set_t before;
    CPU_ZERO(&before);
    ASSERT_EQ(sched_getaffinity(0, sizeof before, &before), 0);
    EXPECT_FALSE(detail::prefer_cpus({-1, CPU_SETSIZE}));
    cpu_set_t after;
    CPU_ZERO(&after);
    ASSERT_EQ(sched_getaffinity(0, sizeof after, &after), 0);
    EXPECT_TRUE(CPU_EQUAL(&before, &after));
  });
}

TEST(WorkerThreadSetupTest, PreferCpusEmptyMeansTheHousekeepingCpus) {
  const std::vector<int> housekeeping = detail::housekeeping_cpus();
  if (housekeeping.empty()) GTEST_SKIP() << "no housekeeping CPU within this process's mask";
  on_a_new_thread([&] {
    EXPECT_TRUE(detail::prefer_cpus({}));
    cpu_set_t now;
    CPU_ZERO(&now);
    ASSERT_EQ(sched_getaffinity(0, sizeof now, &now), 0);
    EXPECT_EQ(CPU_COUNT(&now), static_cast<int>(housekeeping.size()));
    for (const int cpu : housekeeping) EXPECT_TRUE(CPU_ISSET(static_cast<std::size_t>(cpu), &now)) << cpu;
  });
}

TEST(CpuListTest, ParsesRangesAndSinglesAndSkipsJunk) {
  EXPECT_EQ(detail::parse_cpu_list("0-3,8,10-11"), (std::set<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(detail::parse_cpu_list(""), std::set<int>{});
  EXPECT_EQ(detail::parse_cpu_list("5"), std::set<int>{5});
  EXPECT_EQ(detail::parse_cpu_list("(null),2,,x,4-4"), (std::set<int>{2, 4}));
}

TEST(CpuListTest, HousekeepingCpusAreWithinTheAffinityMask) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  for (const int cpu : detail::housekeeping_cpus()) {
    EXPECT_TRUE(CPU_ISSET(static_cast<std::size_t>(cpu), &allowed)) << cpu;
  }
}

struct mask_report {
  bool usr1_blocked = false;
  bool term_blocked = false;
  bool segv_blocked = true;
  bool bus_blocked = true;
};

void* report_mask(void* raw) {
  auto* report = static_cast<mask_report*>(raw);
  sigset_t mask;
  pthread_sigmask(SIG_SETMASK, nullptr, &mask);
  report->usr1_blocked = sigismember(&mask, SIGUSR1) == 1;
  report->term_blocked = sigismember(&mask, SIGTERM) == 1;
  report->segv_blocked = sigismember(&mask, SIGSEGV) == 1;
  report->bus_blocked = sigismember(&mask, SIGBUS) == 1;
  return nullptr;
}

TEST(ThreadStartTest, TheNewThreadBlocksEverySignalButTheFaultSignals) {
  mask_report report;
  pthread_t thread{};
  ASSERT_EQ(detail::start_thread_with_signals_blocked(&thread, &report_mask, &report), 0);
  ASSERT_EQ(pthread_join(thread, nullptr), 0);
  EXPECT_TRUE(report.usr1_blocked);
  EXPECT_TRUE(report.term_blocked);
  EXPECT_FALSE(report.segv_blocked);
  EXPECT_FALSE(report.bus_blocked);
}

TEST(ThreadStartTest, TheCallersMaskIsRestored) {
  sigset_t before;
  pthread_sigmask(SIG_SETMASK, nullptr, &before);
  mask_report report;
  pthread_t thread{};
  ASSERT_EQ(detail::start_thread_with_signals_blocked(&thread, &report_mask, &report), 0);
  sigset_t after;
  pthread_sigmask(SIG_SETMASK, nullptr, &after);
  ASSERT_EQ(pthread_join(thread, nullptr), 0);
  EXPECT_EQ(sigismember(&after, SIGUSR1), sigismember(&before, SIGUSR1));
  EXPECT_EQ(sigismember(&after, SIGTERM), sigismember(&before, SIGTERM));
}

struct owner_a {};
struct owner_b {};

TEST(ThreadOwnerTest, OnlyTheMarkedThreadIsTheOwnersAndOnlyForThatOwner) {
  owner_a a;
  owner_a other;
  owner_b b;
  EXPECT_FALSE(detail::thread_owner<owner_a>::is(&a));
  bool on_thread = false, other_on_thread = true, b_on_thread = true, null_on_thread = true;
  on_a_new_thread([&] {
    detail::thread_owner<owner_a>::mark(&a);
    on_thread = detail::thread_owner<owner_a>::is(&a);
    other_on_thread = detail::thread_owner<owner_a>::is(&other);
    b_on_thread = detail::thread_owner<owner_b>::is(&b);
    null_on_thread = detail::thread_owner<owner_a>::is(nullptr);
  });
  EXPECT_TRUE(on_thread);
  EXPECT_FALSE(other_on_thread);
  EXPECT_FALSE(b_on_thread);
  EXPECT_FALSE(null_on_thread);
  EXPECT_FALSE(detail::thread_owner<owner_a>::is(&a));  // the mark stayed on its thread
}

TEST(FutexTest, WaitReturnsAtOnceWhenTheWordDiffers) {
  std::atomic<std::uint32_t> word{1};
  detail::futex_wait(word, 0);  // would hang if it slept
  detail::futex_wait_for(word, 0, 10'000'000'000u);
  SUCCEED();
}

TEST(FutexTest, WaitForEndsByItself) {
  std::atomic<std::uint32_t> word{0};
  const auto start = std::chrono::steady_clock::now();
  detail::futex_wait_for(word, 0, 20'000'000u);  // 20 ms
  // Only a lower bound (spurious wake-ups aside, it slept): no test asserts an upper time.
  EXPECT_GE(std::chrono::steady_clock::now() - start, 1ms);
}

TEST(FutexTest, WakeAllWakesEveryWaiter) {
  std::atomic<std::uint32_t> word{0};
  std::atomic<int> awake{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < 4; ++i) {
    waiters.emplace_back([&] {
      while (word.load(std::memory_order_acquire) == 0) detail::futex_wait(word, 0);
      awake.fetch_add(1);
    });
  }
  std::this_thread::sleep_for(20ms);  // let them sleep (not required for correctness)
  word.store(1, std::memory_order_release);
  detail::futex_wake_all(word);
  for (auto& t : waiters) t.join();
  EXPECT_EQ(awake.load(), 4);
}

TEST(FutexTest, WakeOneWakesAWaiter) {
  std::atomic<std::uint32_t> word{0};
  std::thread waiter([&] {
    while (word.load(std::memory_order_acquire) == 0) detail::futex_wait(word, 0);
  });
  std::this_thread::sleep_for(10ms);
  word.store(1, std::memory_order_release);
  detail::futex_wake_one(word);
  waiter.join();
  SUCCEED();
}

TEST(ClockTest, DeadlineAfterSaturatesInsteadOfOverflowing) {
  using clock = std::chrono::steady_clock;
  EXPECT_EQ(detail::deadline_after(std::chrono::hours::max()), clock::time_point::max());
  EXPECT_EQ(detail::deadline_after(std::chrono::nanoseconds::max()), clock::time_point::max());
  const auto before = clock::now();
  const auto zero = detail::deadline_after(0s);
  const auto past = detail::deadline_after(-5s);  // the past: now, not earlier
  const auto after = clock::now();
  EXPECT_GE(zero, before);
  EXPECT_LE(zero, after);
  EXPECT_GE(past, before);
  EXPECT_LE(past, after);
  const auto soon = detail::deadline_after(1h);
  EXPECT_GE(soon, before + 1h);
  EXPECT_LT(soon, clock::time_point::max());
}

TEST(ClockTest, ClocksMoveForward) {
  const std::uint64_t mono = detail::monotonic_ns();
  const std::uint64_t cpu = detail::thread_cpu_ns();
  volatile std::uint64_t spin = 0;
  for (int i = 0; i < 1'000'000; ++i) spin = spin + 1;
  EXPECT_GT(detail::monotonic_ns(), mono);
  EXPECT_GT(detail::thread_cpu_ns(), cpu);
  EXPECT_GT(detail::coarse_monotonic_ns(), 0u);
}

TEST(NiceTest, ValidNiceIsSetprioritysRange) {
  EXPECT_TRUE(detail::valid_nice(-20));
  EXPECT_TRUE(detail::valid_nice(0));
  EXPECT_TRUE(detail::valid_nice(19));
  EXPECT_FALSE(detail::valid_nice(-21));
  EXPECT_FALSE(detail::valid_nice(20));
  static_assert(detail::min_nice == -20 && detail::max_nice == 19);
}

struct counting_participant final : detail::fork_participant {
  std::atomic<int> prepared{0}, parents{0}, children{0};
  void fork_prepare() noexcept override { prepared.fetch_add(1); }
  void fork_parent() noexcept override { parents.fetch_add(1); }
  void fork_child() noexcept override { children.fetch_add(1); }
};

TEST(ForkTest, TheRegistryRunsEachParticipantsHandlersAroundFork) {
  counting_participant participant;
  detail::fork_registry::instance().add(&participant);
  const int code = teardown_test::run_child([&] {
    // In the child: prepare ran before the fork, child after it; parent not.
    return participant.prepared.load() == 1 && participant.children.load() == 1 && participant.parents.load() == 0
               ? 0
               : 1;
  });
  detail::fork_registry::instance().remove(&participant);
  EXPECT_EQ(code, 0);
  EXPECT_EQ(participant.prepared.load(), 1);
  EXPECT_EQ(participant.parents.load(), 1);
  EXPECT_EQ(participant.children.load(), 0);
  // Removed: a later fork calls it no more.
  EXPECT_EQ(teardown_test::run_child([] { return 0; }), 0);
  EXPECT_EQ(participant.prepared.load(), 1);
}

TEST(ForkTest, CreatorProcessIsHereOnlyInTheProcessThatMadeIt) {
  const detail::creator_process creator;
  EXPECT_TRUE(creator.here());
  EXPECT_EQ(creator.pid(), getpid());
  EXPECT_EQ(teardown_test::run_child([&] { return creator.here() ? 1 : 0; }), 0);
}

TEST(EventFdTest, NotifyMakesItReadableAndCloseForgetsIt) {
  detail::event_fd stop;
  stop.open("worker_thread_test: eventfd");
  ASSERT_GE(stop.fd(), 0);
  pollfd fds{stop.fd(), POLLIN, 0};
  EXPECT_EQ(poll(&fds, 1, 0), 0);
  EXPECT_TRUE(stop.notify());
  EXPECT_EQ(poll(&fds, 1, 0), 1);
  EXPECT_TRUE(fds.revents & POLLIN);
  stop.close();
  EXPECT_EQ(stop.fd(), -1);
  stop.close();  // idempotent
}

}  // namespace
