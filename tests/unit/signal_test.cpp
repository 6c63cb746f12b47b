// Signals and teardown's threads: every thread the library starts blocks every signal sent to
// the process (all but the fault signals, which stay deliverable) from its first instruction,
// so a process-directed signal never lands on one; and enqueue is
// async-signal-safe: a handler may enqueue even when it interrupted its thread inside malloc,
// and a thread's first enqueue may happen there.
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <dirent.h>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "teardown/async_teardown.hpp"
#include "teardown/deferred.hpp"
#include "teardown/model/mm.hpp"
#include "teardown/reaper.hpp"
#include "teardown/reaper_pool.hpp"
#include "test_support.hpp"

namespace teardown_test {
namespace {

using namespace std::chrono_literals;

// --- /proc/self/task ---------------------------------------------------------------------------

std::set<pid_t> task_ids() {
  std::set<pid_t> tids;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return tids;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] >= '0' && entry->d_name[0] <= '9') tids.insert(static_cast<pid_t>(std::atoi(entry->d_name)));
  }
  closedir(dir);
  return tids;
}

std::string task_name(pid_t tid) {
  std::ifstream file("/proc/self/task/" + std::to_string(tid) + "/comm");
  std::string name;
  std::getline(file, name);
  return name;
}

// SigBlk of /proc/self/task/<tid>/status: bit (n - 1) is signal n.
std::uint64_t blocked_signals(pid_t tid) {
  std::ifstream file("/proc/self/task/" + std::to_string(tid) + "/status");
  std::string line;
  while (std::getline(file, line)) {
    if (line.rfind("SigBlk:", 0) == 0) return std::stoull(line.substr(7), nullptr, 16);
  }
  return 0;
}

constexpr std::uint64_t bit(int signal) { return std::uint64_t{1} << (signal - 1); }

// What "every blockable signal" is: signals 1 to 64 but SIGKILL and SIGSTOP (the kernel refuses
// to block them), glibc's two internal signals, 32 (SIGCANCEL, thread cancellation) and 33
// (SIGSETXID, setuid & co. across threads), which glibc's sigfillset leaves out and its
// pthread_sigmask never blocks, and the synchronous fault signals, which the library leaves
// unblocked so that a fault in fn reaches the program's handler (reaper.hpp, "Signals").
// ThreadSanitizer and AddressSanitizer change nothing here: their pthread_create interceptors
// block signals around the real call and the new thread restores the creator's mask, the one
// the library gives it.
constexpr std::uint64_t fault_signal_bits =
    bit(SIGSEGV) | bit(SIGBUS) | bit(SIGFPE) | bit(SIGILL) | bit(SIGTRAP) | bit(SIGSYS);
constexpr std::uint64_t every_blockable_signal =
    ~(bit(SIGKILL) | bit(SIGSTOP) | bit(32) | bit(33) | fault_signal_bits);

std::string signal_list(std::uint64_t mask) {
  std::ostringstream out;
  for (int signal = 1; signal <= 64; ++signal) {
    if (mask & bit(signal)) out << ' ' << signal;
  }
  return out.str();
}

// Runs `body` on a fresh thread whose signal mask is empty, as a program's thread that never
// touched its mask: the library threads it starts must not inherit that.
void on_thread_with_empty_mask(const std::function<void()>& body) {
  std::thread runner([&] {
    sigset_t none;
    sigemptyset(&none);
    ASSERT_EQ(pthread_sigmask(SIG_SETMASK, &none, nullptr), 0);
    body();
  });
  runner.join();
}

// The tasks that appeared since `before` and carry one of `names` (a worker names itself once
// it runs, so this waits, up to a generous 30 s, until every name is there).
std::map<pid_t, std::string> library_threads(const std::set<pid_t>& before, const std::vector<std::string>& names) {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  for (;;) {
    std::map<pid_t, std::string> found;
    std::multiset<std::string> seen;
    for (const pid_t tid : task_ids()) {
      if (before.count(tid) != 0) continue;
      const std::string name = task_name(tid);
      if (std::find(names.begin(), names.end(), name) == names.end()) continue;
      found.emplace(tid, name);
      seen.insert(name);
    }
    bool all = true;
    for (const std::string& name : names) {
      all = all && seen.count(name) >= static_cast<std::size_t>(std::count(names.begin(), names.end(), name));
    }
    if (all) return found;
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "the library threads did not all appear (and name themselves) within 30 s";
      return found;
    }
    std::this_thread::sleep_for(1ms);
  }
}

void expect_every_blockable_signal_blocked(const std::map<pid_t, std::string>& threads) {
  ASSERT_FALSE(threads.empty());
  for (const auto& [tid, name] : threads) {
    const std::uint64_t blocked = blocked_signals(tid);
    EXPECT_EQ(blocked & every_blockable_signal, every_blockable_signal)
        << "thread " << tid << " (" << name << ") does not block signals"
        << signal_list(every_blockable_signal & ~blocked);
    EXPECT_EQ(blocked & fault_signal_bits, 0u)
        << "thread " << tid << " (" << name << ") blocks fault signals" << signal_list(blocked & fault_signal_bits);
  }
}

// --- Items and the library's thread-starting objects -------------------------------------------

struct item {
  teardown::llist_node hook;
  std::uint64_t charge = 0;
};

std::atomic<std::uint64_t> torn_down{0};

struct count_teardown {
  void operator()(item&) const noexcept { torn_down.fetch_add(1, std::memory_order_relaxed); }
};

struct item_traits {
  std::uint64_t cost(const item&) const noexcept { return 1; }
  bool eligible(const item&, std::uint64_t) const noexcept { return true; }
  void prepare(item&) noexcept {}
  void destroy(item&) noexcept { torn_down.fetch_add(1, std::memory_order_relaxed); }
  std::uint64_t& charge(item& i) noexcept { return i.charge; }
};

using item_reaper = teardown::reaper<item, &item::hook, count_teardown>;
using item_pool = teardown::reaper_pool<item, &item::hook, count_teardown>;
using item_async = teardown::async_teardown<item, &item::hook, item_traits>;
using item_async_pool =
    teardown::async_teardown<item, &item::hook, item_traits, teardown::static_key, teardown::reaper_pool_workers>;

teardown::reaper_options named(const char* name) {
  teardown::reaper_options opts;
  opts.name = name;
  return opts;
}

teardown::async_teardown_options async_options(const char* name) {
  teardown::async_teardown_options opts;
  opts.reaper = named(name);
  opts.sync_when_stalled = false;  // every put from a handler takes the queued path
  opts.pool.workers = 2;
  return opts;
}

// Every kind of thread the library starts, made on the calling thread; the names they take.
struct every_library_thread {
  item_reaper reaper{count_teardown{}, named("sig_reaper")};
  item_pool pool{count_teardown{}, {.workers = 2, .worker = named("sig_pool")}};
  item_async async{async_options("sig_async")};
  item_async_pool async_pool{async_options("sig_apool")};
  teardown::model::mm_system mm{};

  every_library_thread() { (void)teardown::deferred::default_domain(); }

  static std::vector<std::string> names() {
    return {"sig_reaper", "sig_pool-0", "sig_pool-1", "sig_async", "sig_apool-0", "sig_apool-1",
            "mm_reaper", "oom_reaper", "swap_release"};
  }
};

// --- (a) every library thread blocks every blockable signal ------------------------------------

TEST(LibraryThreadSignalsTest, AReaperWorkerBlocksEveryBlockableSignal) {
  on_thread_with_empty_mask([] {
    const std::set<pid_t> before = task_ids();
    item_reaper reaper(count_teardown{}, named("sig_reaper"));
    expect_every_blockable_signal_blocked(library_threads(before, {"sig_reaper"}));
  });
}

TEST(LibraryThreadSignalsTest, EveryReaperPoolWorkerBlocksEveryBlockableSignal) {
  on_thread_with_empty_mask([] {
    const std::set<pid_t> before = task_ids();
    item_pool pool(count_teardown{}, {.workers = 3, .worker = named("sig_pool")});
    expect_every_blockable_signal_blocked(library_threads(before, {"sig_pool-0", "sig_pool-1", "sig_pool-2"}));
  });
}

TEST(LibraryThreadSignalsTest, AsyncTeardownsWorkerBlocksEveryBlockableSignal) {
  on_thread_with_empty_mask([] {
    const std::set<pid_t> before = task_ids();
    item_async async(async_options("sig_async"));
    expect_every_blockable_signal_blocked(library_threads(before, {"sig_async"}));
  });
}

TEST(LibraryThreadSignalsTest, AsyncTeardownsPoolWorkersBlockEveryBlockableSignal) {
  on_thread_with_empty_mask([] {
    const std::set<pid_t> before = task_ids();
    item_async_pool async(async_options("sig_apool"));
    expect_every_blockable_signal_blocked(library_threads(before, {"sig_apool-0", "sig_apool-1"}));
  });
}

TEST(LibraryThreadSignalsTest, TheDefaultDeferredDomainsWorkerBlocksEveryBlockableSignal) {
  on_thread_with_empty_mask([] {
    const std::set<pid_t> before = task_ids();
    (void)teardown::deferred::default_domain();
    // Created by an earlier test of this process, if any: then it is not new, so look it up
    // among all tasks.
    const std::map<pid_t, std::string> found = library_threads({}, {"deferred_delete"});
    expect_every_blockable_signal_blocked(found);
    (void)before;
  });
}

TEST(LibraryThreadSignalsTest, TheMmModelsWorkersBlockEveryBlockableSignal) {
  on_thread_with_empty_mask([] {
    const std::set<pid_t> before = task_ids();
    teardown::model::mm_system mm{};  // starts the mm_reaper, the oom_reaper and the swap-release worker
    expect_every_blockable_signal_blocked(library_threads(before, {"mm_reaper", "oom_reaper", "swap_release"}));
  });
}

// --- (b) a process-directed signal never lands on a library thread -----------------------------

std::atomic<int> handled_elsewhere{0};
std::atomic<pid_t> handled_on{0};

void count_misdelivery(int) {
  handled_on.store(static_cast<pid_t>(syscall(SYS_gettid)), std::memory_order_relaxed);
  handled_elsewhere.fetch_add(1, std::memory_order_release);  // pairs with the sender's acquire
}

// The program's pattern: its objects (and so the library threads) exist before main blocks
// SIGTERM and SIGUSR1 for a sigwait thread. Every kill(getpid()) must reach the sigwait thread.
TEST(LibraryThreadSignalsTest, AProcessDirectedSignalIsTakenBySigwaitNeverByALibraryThread) {
  std::unique_ptr<every_library_thread> library;
  on_thread_with_empty_mask([&] { library = std::make_unique<every_library_thread>(); });
  (void)library_threads({}, every_library_thread::names());  // all running and named

  // A handler, not the default action: a signal that lands on a library thread is counted
  // there instead of ending the test process.
  struct sigaction counting {};
  counting.sa_handler = &count_misdelivery;
  sigemptyset(&counting.sa_mask);
  struct sigaction old_term {};
  struct sigaction old_usr1 {};
  ASSERT_EQ(sigaction(SIGTERM, &counting, &old_term), 0);
  ASSERT_EQ(sigaction(SIGUSR1, &counting, &old_usr1), 0);

  sigset_t waited;
  sigemptyset(&waited);
  sigaddset(&waited, SIGTERM);
  sigaddset(&waited, SIGUSR1);
  sigset_t test_mask;
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &waited, &test_mask), 0);

  std::atomic<int> taken_by_sigwait{0};
  std::atomic<bool> stop{false};
  std::thread waiter([&] {  // inherits the blocked set
    const timespec tick{0, 50'000'000};
    while (!stop.load(std::memory_order_relaxed)) {
      if (sigtimedwait(&waited, nullptr, &tick) > 0) taken_by_sigwait.fetch_add(1, std::memory_order_release);
    }
  });

  constexpr int signals = 200;
  int sent = 0;
  for (; sent < signals && handled_elsewhere.load(std::memory_order_acquire) == 0; ++sent) {
    ASSERT_EQ(kill(getpid(), sent % 2 == 0 ? SIGTERM : SIGUSR1), 0);
    // One at a time: a second standard signal sent while the first is pending would merge.
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (taken_by_sigwait.load(std::memory_order_acquire) + handled_elsewhere.load(std::memory_order_acquire) <=
               sent &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
    if (taken_by_sigwait.load(std::memory_order_acquire) + handled_elsewhere.load(std::memory_order_acquire) <=
        sent) {
      ADD_FAILURE() << "signal " << sent << " was taken by neither the sigwait thread nor a handler within 30 s "
                    << "(a library thread took it and has not run the handler yet)";
      break;
    }
  }
  stop.store(true, std::memory_order_relaxed);
  waiter.join();

  EXPECT_EQ(handled_elsewhere.load(), 0)
      << "a process-directed signal ran the handler on thread " << handled_on.load() << " ("
      << task_name(handled_on.load()) << "), not the sigwait thread";
  EXPECT_EQ(taken_by_sigwait.load(), sent);

  library.reset();
  ASSERT_EQ(pthread_sigmask(SIG_SETMASK, &test_mask, nullptr), 0);
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGUSR1, &old_usr1, nullptr);
}

// --- (c) a handler's enqueue, inside malloc, on the thread's first enqueue ---------------------

struct handler_targets {
  item_reaper* reaper = nullptr;
  item_async* async = nullptr;
  item_pool* pool = nullptr;
  item* items = nullptr;  // three per round, allocated before the round
};

std::atomic<handler_targets*> targets{nullptr};
std::atomic<bool> handler_done{false};

// Touches nothing but lock-free atomics and the library's enqueue paths.
void enqueue_from_handler(int) {
  handler_targets* const to = targets.load(std::memory_order_acquire);  // pairs with the release store
  to->reaper->enqueue(to->items[0]);
  (void)to->async->put(to->items[1]);
  to->pool->enqueue(to->items[2]);
  handler_done.store(true, std::memory_order_release);  // pairs with the acquire loads below
}

// Allocates and frees assorted sizes: small ones from glibc's per-thread cache, middling ones
// under the arena lock, large ones by mmap (a system call made with the arena lock held).
void churn_malloc(const std::atomic<bool>& stop, std::atomic<bool>& started) {
  static constexpr std::size_t sizes[] = {24, 1500, 9000, 64 * 1024, 200 * 1024, 3000, 40, 700 * 1024, 17000};
  std::size_t turn = 0;
  started.store(true, std::memory_order_release);
  while (!stop.load(std::memory_order_acquire)) {
    void* blocks[4];
    for (void*& block : blocks) {
      block = std::malloc(sizes[turn++ % std::size(sizes)]);
      if (block != nullptr) static_cast<volatile char*>(block)[0] = 1;
    }
    for (void* block : blocks) std::free(block);
  }
}

// A hang (the handler deadlocked on a lock its own thread holds) must fail the test, not the
// ctest timeout: after a generous 30 s the process reports and exits.
void wait_or_exit(const std::atomic<bool>& flag, int round) {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (!flag.load(std::memory_order_acquire)) {
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "round " << round
                    << ": the signal handler's enqueue did not return within 30 s; it deadlocked on a lock its own "
                       "thread held (it interrupted malloc)";
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(1);
    }
    std::this_thread::yield();
  }
}

// Under ThreadSanitizer the handler cannot interrupt malloc (TSan delays signals to the end of
// its malloc interceptor), but TSan reports any allocation made inside a handler as a
// "signal-unsafe call inside of a signal", which fails the test there instead.
TEST(SignalHandlerEnqueueTest, AFirstEnqueueInAHandlerThatInterruptedMallocNeverHangs) {
  torn_down.store(0);
  item_reaper reaper(count_teardown{}, named("sig_reaper"));
  item_async async(async_options("sig_async"));
  item_pool pool(count_teardown{}, {.workers = 2, .worker = named("sig_pool")});
  constexpr int rounds = 400;
  std::vector<item> items(static_cast<std::size_t>(rounds) * 3);
  handler_targets to{&reaper, &async, &pool, nullptr};

  struct sigaction enqueue_action {};
  enqueue_action.sa_handler = &enqueue_from_handler;
  sigemptyset(&enqueue_action.sa_mask);
  struct sigaction old_action {};
  ASSERT_EQ(sigaction(SIGUSR2, &enqueue_action, &old_action), 0);

  for (int round = 0; round < rounds; ++round) {
    to.items = &items[static_cast<std::size_t>(round) * 3];
    targets.store(&to, std::memory_order_release);  // pairs with the handler's acquire
    handler_done.store(false, std::memory_order_relaxed);
    std::atomic<bool> started{false};
    std::thread churner([&] { churn_malloc(handler_done, started); });  // a fresh thread: no shard index yet
    while (!started.load(std::memory_order_acquire)) std::this_thread::yield();
    // Let it get into its loop; the point in malloc where the signal lands varies by round.
    std::this_thread::sleep_for(std::chrono::microseconds(round % 97));
    ASSERT_EQ(pthread_kill(churner.native_handle(), SIGUSR2), 0);
    wait_or_exit(handler_done, round);
    churner.join();
  }
  sigaction(SIGUSR2, &old_action, nullptr);

  reaper.flush();
  async.flush();
  pool.flush();
  EXPECT_EQ(reaper.stats().enqueued, static_cast<std::uint64_t>(rounds));
  EXPECT_EQ(pool.stats().enqueued, static_cast<std::uint64_t>(rounds));
  EXPECT_EQ(async.stats().queued, static_cast<std::uint64_t>(rounds));
  EXPECT_EQ(torn_down.load(), static_cast<std::uint64_t>(rounds) * 3);
}

// --- a fault in fn reaches the program's handler ---------------------------------------------

// The program's SIGSEGV handler, as a crash reporter would install it: it must run on the worker
// for a fault that fn causes there (a blocked fault signal would make the kernel kill the process
// with the default action instead, and the exit code would say SIGSEGV, not 42).
extern "C" void crash_reporter(int) { _exit(42); }

struct faulting_teardown {
  volatile int* page;  // mapped PROT_NONE: a store there faults without undefined behaviour
  void operator()(item&) const noexcept { *page = 1; }
};

[[noreturn]] void fault_on_a_worker(void* mapped) {
  struct sigaction action {};
  action.sa_handler = &crash_reporter;
  sigemptyset(&action.sa_mask);
  sigaction(SIGSEGV, &action, nullptr);
  teardown::reaper<item, &item::hook, faulting_teardown> reaper(faulting_teardown{static_cast<volatile int*>(mapped)},
                                                                 named("sig_fault"));
  item victim;
  reaper.enqueue(victim);
  reaper.flush();
  std::_Exit(0);  // not reached: the fault ends the process
}

TEST(LibraryThreadSignalsTest, AFaultInFnRunsTheProgramsHandlerOnTheWorker) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  void* mapped = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mapped, MAP_FAILED);
  EXPECT_EXIT(fault_on_a_worker(mapped), ::testing::ExitedWithCode(42), "");
  munmap(mapped, 4096);
}

}  // namespace
}  // namespace teardown_test
