// Shadow teardown's helper runs none of the program's code, even when the program is built to
// call its own code around every function: this file is compiled with -finstrument-functions
// (GCC) or -finstrument-functions-after-inlining (Clang, whose -O0 -finstrument-functions does
// not link with libstdc++ 12), so every function in it, process.hpp's included, calls the hooks
// below on entry and exit unless it is marked no_instrument_function.
//
// The hooks stand for a profiler's: they touch a thread_local, as such hooks do, and count the
// calls made by any process that is neither the test nor its forked program, which leaves the
// helper. The counters are in a MAP_SHARED page, which the helper (one address space with its
// program) and a forked program share with the test. The helper must make no call at all: not
// while it sets up, not in its wait loop, not when it exits.
#include "teardown/process.hpp"
#include "test_support.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <new>
#include <sstream>
#include <string>
#include <thread>

namespace {

struct hook_counts {
  pid_t test = 0;     // the test process; 0: not counting
  pid_t program = 0;  // a forked program, once it has said so
  pid_t helper = 0;   // the forked program's helper
  int foreign_calls = 0;
};

// Set once, before main, by a function that runs before any test: the hooks see it or nullptr.
hook_counts* counts = nullptr;
thread_local long hook_depth = 0;

}  // namespace

extern "C" {
__attribute__((no_instrument_function)) void __cyg_profile_func_enter(void*, void*);
__attribute__((no_instrument_function)) void __cyg_profile_func_exit(void*, void*);
}

namespace {

__attribute__((no_instrument_function)) void count_call() {
  hook_counts* const c = __atomic_load_n(&counts, __ATOMIC_RELAXED);
  if (c == nullptr) return;
  const pid_t test = __atomic_load_n(&c->test, __ATOMIC_RELAXED);
  if (test == 0) return;
  const pid_t self = getpid();
  if (self != test && self != __atomic_load_n(&c->program, __ATOMIC_RELAXED)) {
    __atomic_fetch_add(&c->foreign_calls, 1, __ATOMIC_RELAXED);
  }
}

}  // namespace

extern "C" {
__attribute__((no_instrument_function)) void __cyg_profile_func_enter(void*, void*) {
  ++hook_depth;
  count_call();
}
__attribute__((no_instrument_function)) void __cyg_profile_func_exit(void*, void*) {
  --hook_depth;
  count_call();
}
}

namespace {

namespace tp = teardown::process;
using namespace std::chrono_literals;
using teardown_test::eventually;

const bool counts_mapped = [] {
  void* const page = mmap(nullptr, sizeof(hook_counts), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (page != MAP_FAILED) __atomic_store_n(&counts, new (page) hook_counts, __ATOMIC_RELAXED);
  return page != MAP_FAILED;
}();

std::string proc(pid_t pid, const char* what) {
  std::ifstream file("/proc/" + std::to_string(pid) + "/" + what);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

char state_of(pid_t pid) {
  const std::string stat = proc(pid, "stat");
  const std::size_t close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() ? '\0' : stat[close + 2];
}

// Whether signal `signal` is pending for `pid` (thread or process-wide).
bool signal_pending(pid_t pid, int signal) {
  std::istringstream status(proc(pid, "status"));
  const std::uint64_t bit = std::uint64_t{1} << (signal - 1);
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("SigPnd:", 0) == 0 || line.rfind("ShdPnd:", 0) == 0) {
      if (std::strtoull(line.c_str() + 7, nullptr, 16) & bit) return true;
    }
  }
  return false;
}

bool blocked_in_ppoll(pid_t pid) { return proc(pid, "syscall").rfind(std::to_string(SYS_ppoll) + " ", 0) == 0; }


__attribute__((noinline)) void instrumented_call() { asm volatile(""); }

int foreign_calls() { return __atomic_load_n(&counts->foreign_calls, __ATOMIC_RELAXED); }

class ProcessInstrumentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!tp::shadow_teardown_supported) GTEST_SKIP() << "shadow teardown is Linux on x86-64 only";
    ASSERT_TRUE(counts_mapped);
    __atomic_store_n(&counts->foreign_calls, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&counts->program, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&counts->test, getpid(), __ATOMIC_RELAXED);
  }
  void TearDown() override {
    if (counts != nullptr) __atomic_store_n(&counts->test, 0, __ATOMIC_RELAXED);
    tp::disable_shadow_teardown();
  }
};

TEST_F(ProcessInstrumentTest, HooksSeeTheirOwnProcessesOnly) {
  // The check itself works: calls from this process are not counted, calls from a third process
  // are.
  EXPECT_GT(hook_depth, 0) << "this test's own function has entered";
  EXPECT_EQ(foreign_calls(), 0);
  const pid_t third = fork();
  if (third == 0) {
    instrumented_call();  // from a process that is neither
    _exit(0);
  }
  ASSERT_GT(third, 0);
  int status = 0;
  ASSERT_EQ(waitpid(third, &status, 0), third);
  EXPECT_GT(foreign_calls(), 0) << "the hooks do not run, or do not count";
}

TEST_F(ProcessInstrumentTest, HelperCallsNoHookWhileSettingUpWaitingAndBeingKilled) {
  // Enabled on a thread that then ends: the helper's first wait (on that thread's tid word) wakes,
  // finds the program still in its address space, and goes on to its ppoll loop.
  pid_t helper = 0;
  std::thread([&] { helper = tp::enable_shadow_teardown(); }).join();
  ASSERT_GT(helper, 0);
  ASSERT_TRUE(eventually([&] { return blocked_in_ppoll(helper); }));
  EXPECT_EQ(foreign_calls(), 0) << "the helper ran the program's hooks while it set up or watched the thread";
  // Through its wait loop once: SIGHUP wakes it, it reads the signal, finds its parent alive and
  // waits again.
  ASSERT_EQ(kill(helper, SIGHUP), 0);
  ASSERT_TRUE(eventually([&] { return !signal_pending(helper, SIGHUP) && blocked_in_ppoll(helper); }));
  EXPECT_EQ(state_of(helper), 'S');
  EXPECT_EQ(foreign_calls(), 0) << "the helper ran the program's hooks in its wait loop";
  tp::disable_shadow_teardown();
  EXPECT_EQ(foreign_calls(), 0);
}

TEST_F(ProcessInstrumentTest, HelperCallsNoHookWhenItsProgramExits) {
  std::fflush(stdout);
  std::fflush(stderr);
  // Not counting until the program has said who it is: its first calls (the fork handlers) come
  // before.
  __atomic_store_n(&counts->test, 0, __ATOMIC_RELAXED);
  const pid_t program = fork();
  if (program == 0) {
    __atomic_store_n(&counts->program, getpid(), __ATOMIC_RELAXED);
    __atomic_store_n(&counts->test, getppid(), __ATOMIC_RELAXED);
    int code = 0;
    try {
      __atomic_store_n(&counts->helper, tp::enable_shadow_teardown(), __ATOMIC_RELAXED);
    } catch (...) {
      code = 2;
    }
    _exit(code);  // closes the pipe's write end: the helper wakes and exits
  }
  ASSERT_GT(program, 0);
  int status = 0;
  ASSERT_EQ(waitpid(program, &status, 0), program);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the program could not enable";
  const pid_t helper = __atomic_load_n(&counts->helper, __ATOMIC_RELAXED);
  ASSERT_GT(helper, 0);
  // Gone, or a zombie of whoever adopted it: its last instruction has run.
  EXPECT_TRUE(eventually([&] {
    const char state = state_of(helper);
    return state == '\0' || state == 'Z' || state == 'X';
  })) << "the helper outlived its program";
  EXPECT_EQ(foreign_calls(), 0) << "the helper ran the program's hooks";
}

}  // namespace
