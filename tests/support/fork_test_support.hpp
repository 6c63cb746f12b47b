// Running a check in a fork()ed child, shared by reaper_fork_test.cpp, reaper_pool_test.cpp and
// process_test.cpp. A child reports through its exit code (0: as specified; otherwise it prints
// what failed to stderr first) and leaves with _exit, so that nothing of the parent (gtest,
// other threads' objects) runs in it. The parent waits with a time limit that is a hang guard,
// not a time assertion: a child still running after it is killed and the test fails ("the child
// deadlocked"). A header of its own rather than part of test_support.hpp, which every test
// includes, so that only the tests that fork see these names.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <thread>

namespace teardown_test {

// What a child body uses instead of gtest's assertions: each failed check is printed to stderr;
// the exit code says whether any failed.
class child_checks {
 public:
  void expect(bool ok, const std::string& what) {
    if (!ok) {
      std::fprintf(stderr, "[child %d] check failed: %s\n", static_cast<int>(getpid()), what.c_str());
      ++failures_;
    }
  }
  int exit_code() const { return failures_ == 0 ? 0 : 1; }

 private:
  int failures_ = 0;
};

// The child's exit code when it ran `body` fully; anything else is a failure in the child.
inline constexpr int child_ok = 0;

// Forks; the child runs `body` and _exits with its result (or with 3 if it threw).
inline pid_t start_child(const std::function<int()>& body) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid == 0) {
    int code = 3;
    try {
      code = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[child %d] threw: %s\n", static_cast<int>(getpid()), e.what());
    } catch (...) {
      std::fprintf(stderr, "[child %d] threw\n", static_cast<int>(getpid()));
    }
    std::fflush(stderr);
    _exit(code);
  }
  return pid;
}

// Waits for the child and returns its exit code, or -1 (and a test failure) if it could not be
// forked, died of a signal, or has not exited after `limit`, when it is killed.
inline int wait_child(pid_t pid, std::chrono::seconds limit = std::chrono::seconds(30)) {
  if (pid < 0) {
    ADD_FAILURE() << "fork failed";
    return -1;
  }
  const auto give_up = std::chrono::steady_clock::now() + limit;
  for (;;) {
    int status = 0;
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) {
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      ADD_FAILURE() << "the child died of signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : -1);
      return -1;
    }
    if (done < 0) {
      ADD_FAILURE() << "waitpid failed";
      return -1;
    }
    if (std::chrono::steady_clock::now() > give_up) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      ADD_FAILURE() << "the child deadlocked: still running after " << limit.count() << " s; killed";
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

inline int run_child(const std::function<int()>& body) { return wait_child(start_child(body)); }

// In a run_child body: prints the failed condition and leaves the body with exit code 1.
#define CHILD_CHECK(condition)                                                              \
  do {                                                                                      \
    if (!(condition)) {                                                                     \
      std::fprintf(stderr, "[child] %s:%d: %s is false\n", __FILE__, __LINE__, #condition); \
      return 1;                                                                             \
    }                                                                                       \
  } while (false)

}  // namespace teardown_test
