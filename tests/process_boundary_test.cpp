// Shadow teardown in programs of their own (built beside this test, paths from CMake):
//   - a plugin that enables it and is then dlclose()d (process_plugin, process_plugin_host): the
//     helper runs code of the plugin, which must stay mapped, so that the helper still ends
//     normally when the host exits;
//   - valgrind, which cannot run the helper (process_valgrind_header, process_valgrind_maps):
//     enable_shadow_teardown() throws std::system_error (ENOTSUP) and the program runs on,
//     instead of valgrind ending it.
// Every wait is bounded at 60 s, a hang guard that fails the test, not a time assertion.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "fork_test_support.hpp"
#include "teardown/process.hpp"

namespace teardown_test {
namespace {

namespace tp = teardown::process;
using namespace std::chrono_literals;


struct finished {
  int status = -1;     // waitpid's; -1: did not finish within the hang guard (then killed)
  std::string output;  // everything it wrote to stdout
};

// Runs argv[0] (searched in PATH) with stdout into a pipe and waits for it.
finished run_program(const std::vector<std::string>& argv) {
  finished result;
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return result;
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    std::vector<char*> args;
    for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(out[1]);
  if (pid < 0) {
    close(out[0]);
    return result;
  }
  const auto give_up = std::chrono::steady_clock::now() + 60s;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(give_up - std::chrono::steady_clock::now());
    pollfd readable{out[0], POLLIN, 0};
    const int polled = left.count() > 0 ? poll(&readable, 1, static_cast<int>(left.count())) : 0;
    if (polled < 0 && errno == EINTR) continue;
    if (polled <= 0) {
      kill(pid, SIGKILL);
      break;
    }
    char buffer[512];
    const ssize_t got = read(out[0], buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    result.output.append(buffer, static_cast<std::size_t>(got));
  }
  close(out[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (std::chrono::steady_clock::now() <= give_up) result.status = status;
  return result;
}

std::string describe(int status) {
  if (status == -1) return "still running after 60 s";
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

// ---- plugins ----------------------------------------------------------------------------------

TEST(ProcessPluginTest, HelperOfADlclosedPluginStillEndsNormallyWhenItsHostExits) {
  if (!tp::shadow_teardown_supported) GTEST_SKIP() << "shadow teardown is Linux on x86-64 only";
  const int code = run_child([] {
    // The helper outlives the host; as a subreaper this process adopts it and sees how it ends.
    CHILD_CHECK(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);
    const finished host = run_program({TEARDOWN_PROCESS_PLUGIN_HOST, TEARDOWN_PROCESS_PLUGIN});
    if (host.status != 0) std::fprintf(stderr, "[child] the host: %s\n", describe(host.status).c_str());
    CHILD_CHECK(host.status == 0);
    const pid_t helper = static_cast<pid_t>(std::atoi(host.output.c_str()));
    CHILD_CHECK(helper > 0);

    int status = -1;
    const auto give_up = std::chrono::steady_clock::now() + 60s;
    pid_t reaped = 0;
    while ((reaped = waitpid(helper, &status, WNOHANG | __WALL)) == 0 && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(1ms);
    }
    if (reaped == 0) kill(helper, SIGKILL);
    if (reaped != helper || status != 0) {
      std::fprintf(stderr, "[child] the helper %d: %s\n", helper,
                   reaped == helper ? describe(status).c_str() : "not reaped");
    }
    CHILD_CHECK(reaped == helper);
    CHILD_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);  // not SIGSEGV in unmapped code
    errno = 0;
    CHILD_CHECK(waitpid(-1, nullptr, WNOHANG | __WALL) == -1 && errno == ECHILD);  // nothing else left
    return 0;
  });
  EXPECT_EQ(code, 0);
}

// ---- valgrind ---------------------------------------------------------------------------------

bool valgrind_installed() { return std::system("valgrind --version > /dev/null 2>&1") == 0; }

// A build of process_valgrind_program: how it finds valgrind, and where it is.
struct valgrind_program {
  const char* detection;
  const char* path;
};
void PrintTo(const valgrind_program& program, std::ostream* out) { *out << program.detection; }

class ProcessValgrindTest : public ::testing::TestWithParam<valgrind_program> {};

TEST_P(ProcessValgrindTest, EnableThrowsSystemErrorUnderValgrindAndTheProgramRunsOn) {
  if (!tp::shadow_teardown_supported) GTEST_SKIP() << "shadow teardown is Linux on x86-64 only";
  if (!valgrind_installed()) GTEST_SKIP() << "valgrind is not installed (Debian: apt-get install valgrind)";
  const finished run = run_program({"valgrind", "-q", "--error-exitcode=99", GetParam().path});
  EXPECT_EQ(describe(run.status), describe(0)) << run.output;
  EXPECT_EQ(run.output.rfind("refused " + std::to_string(ENOTSUP) + " ", 0), 0u) << run.output;
  EXPECT_NE(run.output.find("valgrind"), std::string::npos) << run.output;
}

TEST_P(ProcessValgrindTest, WithoutValgrindTheSameProgramEnables) {
  if (!tp::shadow_teardown_supported) GTEST_SKIP() << "shadow teardown is Linux on x86-64 only";
  const finished run = run_program({GetParam().path});
  EXPECT_EQ(describe(run.status), describe(0)) << run.output;
  EXPECT_EQ(run.output.rfind("enabled ", 0), 0u) << run.output;
}

// With valgrind's header (its client request), and without it (the mappings alone).
INSTANTIATE_TEST_SUITE_P(Detection, ProcessValgrindTest,
                         ::testing::Values(valgrind_program{"ClientRequest", TEARDOWN_PROCESS_VALGRIND_HEADER},
                                           valgrind_program{"Mappings", TEARDOWN_PROCESS_VALGRIND_MAPS}),
                         [](const ::testing::TestParamInfo<valgrind_program>& info) {
                           return std::string(info.param.detection);
                         });

}  // namespace
}  // namespace teardown_test
