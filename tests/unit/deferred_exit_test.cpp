// Specification of the default domain at process exit (deferred.hpp, "The default domain"):
// what is queued when main returns or exit() is called is destroyed before any static is
// destroyed (a destructor may use a static constructed after the domain), exit() called from a
// destructor running on the reaper destroys the rest rather than dropping it, and an exit
// timeout lets exit proceed past a destructor that never returns, counting what it leaves.
//
// Each scenario runs in a fresh process, tests/programs/deferred_exit_child.cpp, started with
// posix_spawn: exit is process-wide, and ThreadSanitizer does not support fork in a threaded
// process. The child reports one byte per destructor through a pipe ('o': the static it used
// was alive; 'X': already destroyed). The 30 s limit is a hang guard, not a time assertion.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <string>
#include <vector>

extern char** environ;

namespace teardown_test {
namespace {

struct child_result {
  int exit_code = -1;     // -1: did not exit normally (signal, or killed by the hang guard)
  std::string report;     // everything the child wrote to the report pipe
  std::string how_it_ended;

  long count(char c) const { return static_cast<long>(std::count(report.begin(), report.end(), c)); }
};

child_result run_scenario(const std::string& scenario) {
  child_result result;
  int fds[2] = {-1, -1};
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "pipe2 failed: errno " << errno;
    return result;
  }
  // Only the write end goes to the child, as fd 3 (dup2 clears FD_CLOEXEC on the copy).
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 3);
  std::string path = TEARDOWN_DEFERRED_EXIT_CHILD;
  std::string fd = "3";
  std::vector<char*> argv{path.data(), const_cast<char*>(scenario.c_str()), fd.data(), nullptr};
  pid_t pid = -1;
  const int error = posix_spawn(&pid, path.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (error != 0) {
    ::close(fds[0]);
    ADD_FAILURE() << "posix_spawn " << path << " failed: error " << error;
    return result;
  }
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  bool hung = false;
  for (;;) {
    pollfd p{fds[0], POLLIN, 0};
    const int ready = ::poll(&p, 1, 100);
    if (ready > 0) {
      char buffer[256];
      const ssize_t got = ::read(fds[0], buffer, sizeof buffer);
      if (got > 0) {
        result.report.append(buffer, static_cast<std::size_t>(got));
        continue;
      }
      if (got == 0) break;  // every writer is gone: the child has exited
      if (errno == EINTR) continue;
      break;
    }
    if (ready < 0 && errno != EINTR) break;
    if (std::chrono::steady_clock::now() > give_up) {
      hung = true;
      ::kill(pid, SIGKILL);
      break;
    }
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (hung) {
    result.how_it_ended = "hung: still running after 30 s, killed";
  } else if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
    result.how_it_ended = "exit code " + std::to_string(result.exit_code);
  } else if (WIFSIGNALED(status)) {
    result.how_it_ended = "killed by signal " + std::to_string(WTERMSIG(status));
  }
  return result;
}

// The queued objects' destructors use a static constructed after the domain: when exit() is
// called on the main thread they all run before it is destroyed (the main thread's exit
// sentinel drains the domain before any static is destroyed).
TEST(DeferredExitTest, ExitFromMainDestroysWhatIsQueuedBeforeAnyStatic) {
  const child_result child = run_scenario("static_after_domain_exit");
  EXPECT_EQ(child.exit_code, 0) << child.how_it_ended;
  EXPECT_EQ(child.count('o'), 20) << "report: " << child.report;
  EXPECT_EQ(child.count('X'), 0) << "destructors that ran after the static they use was destroyed";
}

TEST(DeferredExitTest, ReturnFromMainDestroysWhatIsQueuedBeforeAnyStatic) {
  const child_result child = run_scenario("static_after_domain_return");
  EXPECT_EQ(child.exit_code, 0) << child.how_it_ended;
  EXPECT_EQ(child.count('o'), 20) << "report: " << child.report;
  EXPECT_EQ(child.count('X'), 0) << "destructors that ran after the static they use was destroyed";
}

// exit() called from the 50th of 100 destructors, on the reaper: the other 50 are destroyed too.
TEST(DeferredExitTest, ExitFromADestructorOnTheReaperDestroysTheRest) {
  const child_result child = run_scenario("exit_from_a_destructor_on_the_reaper");
  EXPECT_EQ(child.exit_code, 0) << child.how_it_ended;
  EXPECT_EQ(child.count('o'), 100) << "objects destroyed before the process ended";
}

// exit() from main while the reaper is in the middle of a batch: the batch and the queue are
// finished before any static is destroyed.
TEST(DeferredExitTest, ExitFromMainInTheMiddleOfABatchDestroysEverything) {
  const child_result child = run_scenario("exit_from_main_in_the_middle_of_a_batch");
  EXPECT_EQ(child.exit_code, 0) << child.how_it_ended;
  EXPECT_EQ(child.count('o'), 120) << "report: " << child.report;
  EXPECT_EQ(child.count('X'), 0);
}

// exit() from a thread that is neither main nor the reaper: the fallback, the closer among the
// statics, still destroys everything queued.
TEST(DeferredExitTest, ExitFromAnotherThreadStillDestroysEverything) {
  const child_result child = run_scenario("exit_from_another_thread");
  EXPECT_EQ(child.exit_code, 0) << child.how_it_ended;
  EXPECT_EQ(child.count('o'), 100);
}

// With set_exit_timeout, a destructor that never returns does not hold exit() up: the process
// exits, and the four objects behind it are left to the operating system, counted as pending.
TEST(DeferredExitTest, ExitTimeoutLetsExitProceedPastABlockedDestructorAndCountsWhatIsLeft) {
  const child_result child = run_scenario("exit_timeout_leaves_a_blocked_reaper");
  EXPECT_EQ(child.exit_code, 0) << child.how_it_ended;
  EXPECT_EQ(child.count('o'), 0) << "the blocker never finishes, so nothing behind it runs";
  EXPECT_NE(child.report.find("pending=5\n"), std::string::npos) << "report: " << child.report;
}

}  // namespace
}  // namespace teardown_test
