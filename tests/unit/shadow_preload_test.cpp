// Specification of libteardown_shadow.so and teardown-run (tools/): shadow teardown for a program
// that no one here wrote — Debian's /usr/bin/python3 — run from a fresh `cmake --install` of this
// build tree, into a prefix that is then moved (the launcher must find the library wherever the
// prefix lies).
//
// Each case starts `<prefix>/bin/teardown-run ... /usr/bin/python3 program.py SIZE` with pipes on
// its standard streams. The Python program allocates and touches SIZE bytes, prints
// "ready <pid>", then obeys one command a line (fork, reap, exec, exec-opt-out, threads, join)
// and answers with a line. The test finds the helpers through /proc: processes named
// "teardown-shadow" (process.hpp's default name) that share the program's address space (kcmp;
// the library's helpers are detached, children of init), or, ended, the program's zombies.
//
// The cases with tracers, __WALL waiters, sanitizers, other preloads, re-exec, a pids limit and
// cleared FD_CLOEXEC run tests/programs/shadow_programs/ (shadow_probe, with its own copy of
// process.hpp, and a GCC -fsanitize=address program), each bounded at 60 s. The sanitized program
// is also started by what teardown-run runs (a shell, env, make, a script's "#!", and
// shadow_exec_launcher on every route of the exec family and posix_spawn): the library's exec
// wrappers must put its runtime first, and fail as the real calls fail.
//
// Nothing asserts a time. Every wait is bounded at 60 s, a hang guard that fails the test. That
// waitpid() returns before the memory is freed is proved by order, as in process_test: the
// helper is stopped before the program is killed, so it cannot have freed anything when
// waitpid() returns; resumed, it frees the memory and ends by itself.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <linux/kcmp.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "test_support.hpp"

extern char** environ;

namespace teardown_test {
namespace {

namespace fs = std::filesystem;

constexpr const char* kPython = "/usr/bin/python3";  // Debian's; `python3` on PATH may be a shim
constexpr const char* kHelperName = "teardown-shadow";
constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

// The program. Commands and answers are one line each.
constexpr const char* kProgram = R"PY(import os, signal, sys, threading

size = int(sys.argv[1])
memory = bytearray(size)
for at in range(0, size, 4096):  # touch every page
    memory[at] = 1
print("ready", os.getpid(), flush=True)

threads = []
stop = threading.Event()
for line in sys.stdin:
    command = line.split()
    if command[0] == "fork":
        child = os.fork()
        # One write(2) per line (atomic on a pipe): parent and child share stdout, and print's
        # pieces of two processes may interleave.
        if child == 0:
            os.write(1, b"child %d\n" % os.getpid())
            while True:
                signal.pause()
        os.write(1, b"forked %d\n" % child)
    elif command[0] == "reap":
        os.kill(int(command[1]), signal.SIGKILL)
        print("reaped", os.waitpid(int(command[1]), 0)[0], flush=True)
    elif command[0] == "exec":
        os.execv(sys.executable, [sys.executable, __file__, command[1]])
    elif command[0] == "exec-opt-out":
        os.execve(sys.executable, [sys.executable, __file__, command[1]], dict(os.environ, TEARDOWN_SHADOW="0"))
    elif command[0] == "threads":
        for _ in range(int(command[1])):
            thread = threading.Thread(target=lambda: (bytearray(1 << 20), stop.wait()))
            thread.start()
            threads.append(thread)
        print("threads", threading.active_count(), flush=True)
    elif command[0] == "join":
        stop.set()
        for thread in threads:
            thread.join()
        print("joined", threading.active_count(), flush=True)
    elif command[0] == "environment":
        print("environment", os.environ.get(command[1], "-"), flush=True)
)PY";

// ---- /proc and free memory --------------------------------------------------------------------

std::string read_text(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

struct process_stat {
  char state = '\0';  // '\0': no such process
  std::string comm;
  pid_t parent = 0;
};

process_stat stat_of(pid_t pid) {
  const std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
  const std::size_t open = stat.find('('), close = stat.rfind(')');
  process_stat result;
  if (open == std::string::npos || close == std::string::npos || close + 4 >= stat.size()) return result;
  result.comm = stat.substr(open + 1, close - open - 1);
  result.state = stat[close + 2];
  result.parent = static_cast<pid_t>(std::atol(stat.c_str() + close + 4));
  return result;
}

// Gone, or a zombie: its exit, and so the teardown of what it alone mapped, is complete.
bool ended(pid_t pid) {
  const char state = stat_of(pid).state;
  return state == '\0' || state == 'Z' || state == 'X';
}

// Whether two processes share one address space.
bool share_memory(pid_t a, pid_t b) { return syscall(SYS_kcmp, a, b, KCMP_VM, 0, 0) == 0; }

// The helpers of `program`, named teardown-shadow: the live ones (sharing its address space,
// whoever their parent is), or the ended ones (its zombies).
std::vector<pid_t> helpers_of(pid_t program, bool live) {
  std::vector<pid_t> found;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator("/proc", error)) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::atol(name.c_str()));
    const process_stat stat = stat_of(pid);
    if (stat.comm != kHelperName) continue;
    const bool dead = stat.state == 'Z' || stat.state == 'X' || stat.state == '\0';
    if (live ? !dead && (stat.parent == program || share_memory(program, pid)) : dead && stat.parent == program) {
      found.push_back(pid);
    }
  }
  return found;
}

long vm_rss_bytes(pid_t pid) {
  std::istringstream status(read_text("/proc/" + std::to_string(pid) + "/status"));
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6) * 1024;
  }
  return -1;
}

// The pipes a process holds ("pipe:[inode]").
std::set<std::string> pipes_of(pid_t pid) {
  std::set<std::string> pipes;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", error)) {
    const std::string target = fs::read_symlink(entry.path(), error).string();
    if (target.rfind("pipe:", 0) == 0) pipes.insert(target);
  }
  return pipes;
}

std::size_t open_descriptors() {
  std::size_t count = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator("/proc/self/fd")) ++count;
  return count;
}

std::uint64_t meminfo_bytes(const std::string& field) {
  const std::string text = read_text("/proc/meminfo");
  const std::size_t at = text.find(field);
  return at == std::string::npos ? 0 : std::strtoull(text.c_str() + at + field.size(), nullptr, 10) * 1024;
}

// Free memory as benchmarks/process_bench.cpp counts it: MemAvailable plus the pages on the
// per-CPU free lists (/proc/zoneinfo "count:"), which MemAvailable leaves out.
std::uint64_t free_bytes() {
  const std::string zones = read_text("/proc/zoneinfo");
  const std::string key = "count:";
  std::uint64_t pages = 0;
  for (std::size_t at = zones.find(key); at != std::string::npos; at = zones.find(key, at + key.size())) {
    pages += std::strtoull(zones.c_str() + at + key.size(), nullptr, 10);
  }
  return meminfo_bytes("MemAvailable:") + pages * static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
}

double gib(double bytes) { return bytes / static_cast<double>(kGiB); }

// ---- the install ------------------------------------------------------------------------------

// `cmake --install` of this build tree into a fresh prefix, which is then renamed: every case
// runs the launcher from the moved prefix. Once per test process, removed at its end.
class installed_prefix : public ::testing::Environment {
 public:
  static fs::path launcher() { return root_ / "moved" / TEARDOWN_INSTALL_BINDIR / "teardown-run"; }
  static fs::path library() { return root_ / "moved" / TEARDOWN_INSTALL_LIBDIR / "libteardown_shadow.so"; }
  static fs::path program() { return root_ / "program.py"; }
  static const std::string& failure() { return failure_; }

  void SetUp() override {
    char pattern[] = "/tmp/teardown-shadow-preload-test.XXXXXX";
    if (mkdtemp(pattern) == nullptr) {
      failure_ = std::string("mkdtemp: ") + std::strerror(errno);
      return;
    }
    root_ = pattern;
    const fs::path staged = root_ / "staged";
    const std::string command = std::string("'") + TEARDOWN_CMAKE_COMMAND + "' --install '" + TEARDOWN_BUILD_DIR +
                                "' --prefix '" + staged.string() + "' > '" + (root_ / "install.log").string() +
                                "' 2>&1";
    const int status = std::system(command.c_str());
    if (status != 0) {
      failure_ = "cmake --install failed (status " + std::to_string(status) + "): " + read_text(root_ / "install.log");
      return;
    }
    std::error_code error;
    fs::rename(staged, root_ / "moved", error);
    if (error) failure_ = "cannot move the prefix: " + error.message();
    std::ofstream(program()) << kProgram;
  }
  void TearDown() override {
    std::error_code error;
    if (!root_.empty()) fs::remove_all(root_, error);
  }

 private:
  static inline fs::path root_;
  static inline std::string failure_;
};

[[maybe_unused]] ::testing::Environment* const install_environment =
    ::testing::AddGlobalTestEnvironment(new installed_prefix);

// ---- a program run through the launcher ---------------------------------------------------------

class launched {
 public:
  // Runs `arguments` with stdin, stdout and stderr on pipes, with `extra` added to (or, as
  // "NAME", removed from) the environment; with `own_group`, in a process group of its own, so
  // that a case that hangs can end everything it started. (Not by default: a group of its own is
  // orphaned when the program dies, and the kernel then sends SIGHUP and SIGCONT to its stopped
  // members, which would resume a helper that a case stopped.)
  explicit launched(const std::vector<std::string>& arguments, const std::vector<std::string>& extra = {},
                    bool own_group = false)
      : own_group_(own_group) {
    int in[2], out[2], err[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "pipe2: " << std::strerror(errno);
      return;
    }
    std::vector<std::string> environment;
    for (char** variable = environ; *variable != nullptr; ++variable) {
      const std::string text(*variable);
      const std::string name = text.substr(0, text.find('='));
      bool replaced = false;
      for (const std::string& change : extra) replaced |= change.substr(0, change.find('=')) == name;
      if (!replaced) environment.push_back(text);
    }
    for (const std::string& change : extra) {
      if (change.find('=') != std::string::npos) environment.push_back(change);
    }
    std::vector<char*> argv, envp;
    for (const std::string& argument : arguments) argv.push_back(const_cast<char*>(argument.c_str()));
    argv.push_back(nullptr);
    for (const std::string& variable : environment) envp.push_back(const_cast<char*>(variable.c_str()));
    envp.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_adddup2(&actions, err[1], 2);
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    if (own_group) {
      posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
      posix_spawnattr_setpgroup(&attributes, 0);
    }
    const int error = posix_spawn(&pid_, argv[0], &actions, &attributes, argv.data(), envp.data());
    posix_spawnattr_destroy(&attributes);
    posix_spawn_file_actions_destroy(&actions);
    close(in[0]);
    close(out[1]);
    close(err[1]);
    to_ = in[1];
    from_ = out[0];
    errors_ = err[0];
    if (error != 0) {
      ADD_FAILURE() << "posix_spawn " << arguments[0] << ": " << std::strerror(error);
      pid_ = 0;
    }
  }
  launched(const launched&) = delete;
  launched& operator=(const launched&) = delete;
  ~launched() {
    if (pid_ > 0 && !reaped_) (void)kill_and_wait();
    for (const int fd : {to_, from_, errors_}) {
      if (fd >= 0) close(fd);
    }
  }

  pid_t pid() const { return pid_; }

  // The next line on its stdout ("" at EOF, or after 60 s: a hang guard).
  std::string line() {
    for (;;) {
      const std::size_t end = buffered_.find('\n');
      if (end != std::string::npos) {
        std::string result = buffered_.substr(0, end);
        buffered_.erase(0, end + 1);
        return result;
      }
      pollfd ready{from_, POLLIN, 0};
      if (poll(&ready, 1, 60'000) <= 0) return {};
      char chunk[4096];
      const ssize_t got = read(from_, chunk, sizeof chunk);
      if (got <= 0) return {};
      buffered_.append(chunk, static_cast<std::size_t>(got));
    }
  }

  // The number after `word` on the next line, or 0 if the line says something else.
  pid_t expect(const std::string& word) {
    const std::string text = line();
    EXPECT_EQ(text.rfind(word + " ", 0), 0u) << "expected \"" << word << " ...\", got \"" << text << "\"";
    return text.rfind(word + " ", 0) == 0 ? static_cast<pid_t>(std::atol(text.c_str() + word.size() + 1)) : 0;
  }

  void send(const std::string& command) {
    const std::string text = command + "\n";
    ASSERT_EQ(write(to_, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  }

  // Closes its stdin and waits for it to exit by itself; its status.
  int finish() {
    close(to_);
    to_ = -1;
    return wait();
  }

  // Closes its stdin and waits up to `seconds` for it to exit by itself: its status, or nothing
  // (after killing it, and its whole process group if it has one of its own) if it did not.
  std::optional<int> finish_within(int seconds) {
    close(to_);
    to_ = -1;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    for (;;) {
      int status = 0;
      const pid_t got = waitpid(pid_, &status, WNOHANG);
      if (got == pid_) {
        reaped_ = true;
        return status;
      }
      if (std::chrono::steady_clock::now() > give_up) {
        kill(own_group_ ? -pid_ : pid_, SIGKILL);
        (void)wait();
        return std::nullopt;
      }
      usleep(10'000);
    }
  }

  int kill_and_wait() {
    kill(pid_, SIGKILL);
    return wait();
  }

  // Everything it wrote on stderr (call once it has exited).
  std::string errors() {
    std::string text;
    char chunk[4096];
    ssize_t got;
    while ((got = read(errors_, chunk, sizeof chunk)) > 0) text.append(chunk, static_cast<std::size_t>(got));
    return text;
  }

 private:
  int wait() {
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    reaped_ = true;
    return status;
  }

  bool own_group_ = false;
  pid_t pid_ = 0;
  bool reaped_ = false;
  int to_ = -1, from_ = -1, errors_ = -1;
  std::string buffered_;
};

std::vector<std::string> python(std::size_t bytes, const std::vector<std::string>& options = {}) {
  std::vector<std::string> arguments{installed_prefix::launcher().string()};
  arguments.insert(arguments.end(), options.begin(), options.end());
  arguments.insert(arguments.end(), {kPython, installed_prefix::program().string(), std::to_string(bytes)});
  return arguments;
}

// Kills, at the end of a case, what a failed case may have left running.
class stray_killer {
 public:
  stray_killer() = default;
  stray_killer(const stray_killer&) = delete;
  stray_killer& operator=(const stray_killer&) = delete;
  ~stray_killer() {
    for (const pid_t pid : pids_) {
      if (pid > 0 && !ended(pid) && stat_of(pid).comm == kHelperName) kill(pid, SIGKILL);
    }
  }
  void add(pid_t pid) { pids_.push_back(pid); }

 private:
  std::vector<pid_t> pids_;
};

class ShadowPreloadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(installed_prefix::failure(), "");
    if (access(kPython, X_OK) != 0) GTEST_SKIP() << kPython << " is not installed (Debian: apt-get install python3)";
    descriptors_before_ = open_descriptors();
  }
  void TearDown() override {
    if (descriptors_before_ != 0) {
      EXPECT_EQ(open_descriptors(), descriptors_before_) << "a descriptor leaked";
    }
  }

  // The program's one live helper (and a failure if it has none or several).
  pid_t only_helper(pid_t program) {
    const std::vector<pid_t> helpers = helpers_of(program, true);
    EXPECT_EQ(helpers.size(), 1u) << "live helpers of " << program;
    for (const pid_t helper : helpers) strays_.add(helper);
    return helpers.size() == 1 ? helpers.front() : 0;
  }

  stray_killer strays_;

 private:
  std::size_t descriptors_before_ = 0;
};

// ---- memory: waitpid first, the teardown afterwards ------------------------------------------------

TEST_F(ShadowPreloadTest, KilledPythonIsReapedBeforeItsGibIsFreedAndTheGibComesBackAfterwards) {
  std::optional<launched> p(std::in_place, python(kGiB));
  const pid_t program = p->expect("ready");
  ASSERT_EQ(program, p->pid()) << "teardown-run exec()s the program in its own process";
  const pid_t helper = only_helper(program);
  ASSERT_NE(helper, 0);
  EXPECT_GE(vm_rss_bytes(helper), static_cast<long>(kGiB)) << "the helper shares the program's memory";

  // Freeze the helper: nothing can be torn down until it is resumed.
  ASSERT_EQ(kill(helper, SIGSTOP), 0);
  ASSERT_TRUE(eventually([&] { return stat_of(helper).state == 'T'; }));
  const std::uint64_t before_kill = free_bytes();
  const int status = p->kill_and_wait();
  const std::uint64_t at_waitpid = free_bytes();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  // waitpid() has returned; the GiB is still mapped (by the stopped helper) and not free.
  const long helper_rss = vm_rss_bytes(helper);
  EXPECT_GE(helper_rss, static_cast<long>(kGiB));
  const double freed_by_waitpid = static_cast<double>(at_waitpid) - static_cast<double>(before_kill);
  EXPECT_LT(freed_by_waitpid, 0.5 * kGiB) << "the program's exit freed its memory itself";
  EXPECT_NE(stat_of(helper).parent, program) << "handed to a subreaper or init";
  EXPECT_EQ(p->errors(), "");
  p.reset();

  // Resumed, the helper finds its program gone, exits and frees the GiB.
  ASSERT_EQ(kill(helper, SIGCONT), 0);
  EXPECT_TRUE(eventually([&] { return ended(helper); })) << "the helper outlived its program";
  std::uint64_t back = 0;
  EXPECT_TRUE(eventually([&] { return (back = free_bytes()) >= at_waitpid + kGiB / 2; }))
      << "the memory never came back: " << gib(static_cast<double>(back) - static_cast<double>(at_waitpid))
      << " GiB since waitpid";
  std::printf("held at waitpid (helper stopped): helper VmRSS %.3f GiB, free memory %+.3f GiB from the kill to "
              "waitpid, %+.3f GiB from waitpid to the helper's end\n",
              gib(static_cast<double>(helper_rss)), gib(freed_by_waitpid),
              gib(static_cast<double>(back) - static_cast<double>(at_waitpid)));
}

TEST_F(ShadowPreloadTest, KilledPythonsHelperEndsByItselfAndLeavesNothing) {
  // Nothing frozen: the helper runs its teardown as it would in production. The figures are
  // printed, not asserted (they depend on the machine's load).
  std::optional<launched> p(std::in_place, python(kGiB));
  const pid_t program = p->expect("ready");
  const pid_t helper = only_helper(program);
  ASSERT_NE(helper, 0);
  const std::uint64_t before_kill = free_bytes();
  const auto start = std::chrono::steady_clock::now();
  const int status = p->kill_and_wait();
  const auto reaped = std::chrono::steady_clock::now();
  const std::uint64_t at_waitpid = free_bytes();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  p.reset();
  EXPECT_TRUE(eventually([&] { return ended(helper); })) << "the helper outlived its program";
  const auto helper_gone = std::chrono::steady_clock::now();
  const std::uint64_t after = free_bytes();
  // (The helper's VmRSS says nothing here: the kernel detaches the mm from a task before it tears
  // it down, so an exiting helper shows none while it still frees.)
  std::printf("kill -> waitpid %.3f ms; free memory from the kill: %+.3f GiB at waitpid, %+.3f GiB once the "
              "helper is gone (kill -> gone %.1f ms)\n",
              std::chrono::duration<double, std::milli>(reaped - start).count(),
              gib(static_cast<double>(at_waitpid) - static_cast<double>(before_kill)),
              gib(static_cast<double>(after) - static_cast<double>(before_kill)),
              std::chrono::duration<double, std::milli>(helper_gone - start).count());
}

TEST_F(ShadowPreloadTest, PythonThatExitsByItselfTakesItsHelperWithIt) {
  launched p(python(64 << 20));
  const pid_t program = p.expect("ready");
  const pid_t helper = only_helper(program);
  ASSERT_NE(helper, 0);
  const int status = p.finish();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(p.errors(), "");
  EXPECT_TRUE(eventually([&] { return ended(helper); })) << "the helper outlived its program";
}

// ---- fork, exec, threads (as libteardown_shadow.so documents them) ---------------------------------

TEST_F(ShadowPreloadTest, ForkChildRunsWithoutAHelperAndTheParentKeepsItsOwn) {
  launched p(python(64 << 20));
  const pid_t program = p.expect("ready");
  const pid_t helper = only_helper(program);
  ASSERT_NE(helper, 0);
  const std::set<std::string> helper_pipes = pipes_of(helper);  // its read end only
  ASSERT_EQ(helper_pipes.size(), 1u);
  EXPECT_EQ(pipes_of(program).count(*helper_pipes.begin()), 1u) << "the program holds the write end";

  p.send("fork");
  // Two lines, in either order: the parent's, and the child's once its fork() has returned.
  pid_t child = 0;
  for (int i = 0; i < 2; ++i) {
    const std::string text = p.line();
    if (text.rfind("child ", 0) == 0) {
      child = static_cast<pid_t>(std::atol(text.c_str() + 6));
    } else {
      EXPECT_EQ(text.rfind("forked ", 0), 0u) << text;
    }
  }
  ASSERT_GT(child, 0);
  EXPECT_TRUE(helpers_of(child, true).empty()) << "a fork child gets no helper";
  EXPECT_TRUE(helpers_of(child, false).empty());
  EXPECT_EQ(pipes_of(child).count(*helper_pipes.begin()), 0u) << "the fork child kept the helper's pipe";
  EXPECT_EQ(only_helper(program), helper) << "the parent keeps its helper";

  p.send("reap " + std::to_string(child));
  EXPECT_EQ(p.expect("reaped"), child);
  EXPECT_EQ(only_helper(program), helper);
  EXPECT_FALSE(ended(helper));
  p.kill_and_wait();
  EXPECT_TRUE(eventually([&] { return ended(helper); })) << "the helper outlived its program";
  EXPECT_EQ(p.errors(), "");
}

TEST_F(ShadowPreloadTest, ExecEndsTheOldImagesHelperAndTheNewImageGetsItsOwn) {
  launched p(python(256 << 20));
  const pid_t program = p.expect("ready");
  const pid_t old_helper = only_helper(program);
  ASSERT_NE(old_helper, 0);

  p.send("exec 0");
  EXPECT_EQ(p.expect("ready"), program) << "exec keeps the pid";
  // The old image's helper exited (freeing that image), and stays the new image's zombie.
  EXPECT_TRUE(eventually([&] { return ended(old_helper); })) << "the old helper kept the old image";
  const pid_t new_helper = only_helper(program);
  EXPECT_NE(new_helper, 0);
  EXPECT_NE(new_helper, old_helper);
  EXPECT_EQ(vm_rss_bytes(program), vm_rss_bytes(new_helper)) << "the new helper shares the new image";

  p.kill_and_wait();
  EXPECT_TRUE(eventually([&] { return ended(new_helper); })) << "the helper outlived its program";
  EXPECT_EQ(p.errors(), "");
}

TEST_F(ShadowPreloadTest, ExecWithTeardownShadowZeroLeavesTheNewImageWithoutAHelper) {
  launched p(python(64 << 20));
  const pid_t program = p.expect("ready");
  const pid_t old_helper = only_helper(program);
  ASSERT_NE(old_helper, 0);

  p.send("exec-opt-out 0");
  EXPECT_EQ(p.expect("ready"), program);
  EXPECT_TRUE(eventually([&] { return ended(old_helper); })) << "the old helper kept the old image";
  EXPECT_TRUE(helpers_of(program, true).empty()) << "TEARDOWN_SHADOW=0 must leave it without a helper";
  p.kill_and_wait();
  EXPECT_EQ(p.errors(), "") << "opting out is silent";
}

TEST_F(ShadowPreloadTest, PythonThreadsShareTheOneHelper) {
  launched p(python(64 << 20));
  const pid_t program = p.expect("ready");
  const pid_t helper = only_helper(program);
  ASSERT_NE(helper, 0);

  p.send("threads 8");
  EXPECT_EQ(p.expect("threads"), 9);
  EXPECT_EQ(only_helper(program), helper) << "threads neither add helpers nor replace the one";
  p.send("join");
  EXPECT_EQ(p.expect("joined"), 1);
  EXPECT_EQ(only_helper(program), helper) << "the helper outlives the threads";
  EXPECT_FALSE(ended(helper));

  p.kill_and_wait();
  EXPECT_TRUE(eventually([&] { return ended(helper); })) << "the helper outlived its program";
  EXPECT_EQ(p.errors(), "");
}

// ---- options and failures ---------------------------------------------------------------------------

TEST_F(ShadowPreloadTest, NiceAndIdleReachTheHelper) {
  launched p(python(0, {"--nice", "7", "--idle"}));
  const pid_t program = p.expect("ready");
  const pid_t helper = only_helper(program);
  ASSERT_NE(helper, 0);
  const std::string text = read_text("/proc/" + std::to_string(helper) + "/stat");
  std::istringstream fields(text.substr(text.rfind(')') + 2));
  std::vector<std::string> stat{"", "", ""};  // numbered as in proc(5): 1 and 2 precede the ')'
  for (std::string field; fields >> field;) stat.push_back(field);
  ASSERT_GT(stat.size(), 41u);
  EXPECT_EQ(stat[19], "7") << "nice";
  EXPECT_EQ(stat[41], std::to_string(SCHED_IDLE)) << "policy";
  p.kill_and_wait();
  EXPECT_TRUE(eventually([&] { return ended(helper); }));
}

TEST_F(ShadowPreloadTest, BadEnvironmentValueRunsPythonUnchangedWithOneLineOnStderr) {
  for (const std::string setting :
       {"TEARDOWN_SHADOW_NICE=abc", "TEARDOWN_SHADOW_NICE=20", "TEARDOWN_SHADOW_NICE= 5", "TEARDOWN_SHADOW_IDLE=yes",
        "TEARDOWN_SHADOW=on"}) {
    SCOPED_TRACE(setting);
    launched p({kPython, installed_prefix::program().string(), "0"},
               {setting, "LD_PRELOAD=" + installed_prefix::library().string()});
    const pid_t program = p.expect("ready");
    EXPECT_TRUE(helpers_of(program, true).empty()) << "no helper with a bad value";
    const int status = p.finish();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the program ran to its end";
    const std::string errors = p.errors();
    const std::string variable = setting.substr(0, setting.find('='));
    EXPECT_EQ(errors.rfind("libteardown_shadow.so: " + variable + "=", 0), 0u) << errors;
    EXPECT_EQ(std::count(errors.begin(), errors.end(), '\n'), 1) << "one line: " << errors;
  }
}

TEST_F(ShadowPreloadTest, UnderValgrindPythonRunsUnchangedWithOneLineOnStderr) {
  if (access("/usr/bin/valgrind", X_OK) != 0)
    GTEST_SKIP() << "valgrind is not installed (Debian: apt-get install valgrind)";
  // valgrind keeps LD_PRELOAD for the program it runs: the library loads there, finds valgrind
  // (which would end the program for a clone(CLONE_VM) process) and stands aside.
  launched p({installed_prefix::launcher().string(), "/usr/bin/valgrind", "-q", kPython,
              installed_prefix::program().string(), "0"});
  EXPECT_GT(p.expect("ready"), 0);
  const int status = p.finish();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the program ran to its end";
  const std::string errors = p.errors();
  EXPECT_EQ(errors.rfind("libteardown_shadow.so: ", 0), 0u) << errors;
  EXPECT_NE(errors.find("valgrind"), std::string::npos) << errors;
  EXPECT_EQ(std::count(errors.begin(), errors.end(), '\n'), 1) << "one line: " << errors;
}

// ---- the launcher -----------------------------------------------------------------------------------

TEST_F(ShadowPreloadTest, LauncherPutsTheLibraryLastInLdPreloadAfterWhatWasThere) {
  launched p(python(0), {"LD_PRELOAD=libm.so.6"});
  p.expect("ready");
  p.send("environment LD_PRELOAD");
  const std::string text = p.line();
  std::error_code error;
  EXPECT_EQ(text, "environment libm.so.6:" + fs::canonical(installed_prefix::library(), error).string());
  p.kill_and_wait();
  EXPECT_EQ(p.errors(), "");
}

TEST_F(ShadowPreloadTest, LauncherUsageErrorsExitWithStatusTwoAndAMessage) {
  const std::string launcher = installed_prefix::launcher().string();
  for (const std::vector<std::string>& arguments :
       std::vector<std::vector<std::string>>{{launcher},
                                             {launcher, "--"},
                                             {launcher, "--idle"},
                                             {launcher, "--bogus", kPython},
                                             {launcher, "--nice"},
                                             {launcher, "--nice", "20", kPython},
                                             {launcher, "--nice=-21", kPython},
                                             {launcher, "--nice", "five", kPython}}) {
    std::string shown;
    for (const std::string& argument : arguments) shown += " " + argument;
    SCOPED_TRACE(shown);
    launched p(arguments);
    const int status = p.finish();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << "status " << status;
    const std::string errors = p.errors();
    EXPECT_EQ(errors.rfind("teardown-run: ", 0), 0u) << errors;
  }
  {
    launched help({launcher, "--help"});
    EXPECT_EQ(help.line().rfind("usage: teardown-run ", 0), 0u);
    const int status = help.finish();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  {
    launched missing({launcher, "/nonexistent/program"});
    const int status = missing.finish();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 127);
    EXPECT_NE(missing.errors().find("/nonexistent/program"), std::string::npos);
  }
}


// ---- tracers, waiters, sanitizers, other preloads, re-exec, limits (tests/programs/shadow_programs) -

std::vector<std::string> probe(const std::vector<std::string>& arguments) {
  std::vector<std::string> command{installed_prefix::launcher().string(), TEARDOWN_SHADOW_PROBE};
  command.insert(command.end(), arguments.begin(), arguments.end());
  return command;
}

std::string status_text(const std::optional<int>& status) {
  if (!status) return "still running after 60 s (killed)";
  if (WIFEXITED(*status)) return "exit " + std::to_string(WEXITSTATUS(*status));
  if (WIFSIGNALED(*status)) return "signal " + std::to_string(WTERMSIG(*status));
  return "status " + std::to_string(*status);
}

std::string exited_with(int code) { return "exit " + std::to_string(code); }

// A program that waits for every child with __WALL until ECHILD (a supervisor's reap loop) would
// wait for a helper that is its child, and the helper ends only with the program.
TEST_F(ShadowPreloadTest, WallWaiterUnderTheLauncherReapsItsChildrenAndEndsWithItsStatus) {
  launched p(probe({"wall", "3"}), {}, true);
  const std::optional<int> status = p.finish_within(60);
  EXPECT_EQ(status_text(status), exited_with(7));
  if (status) {
    EXPECT_EQ(p.line(), "reaped 3") << "the helper is none of its children";
  }
  EXPECT_EQ(p.errors(), "");
}

// strace -f waits (with __WALL) for every process it follows: the program, and what the program
// clones, until none is left.
TEST_F(ShadowPreloadTest, StraceFollowingTheProgramEndsByItselfWithTheProgramsStatus) {
  if (access("/usr/bin/strace", X_OK) != 0) GTEST_SKIP() << "strace is not installed (Debian: apt-get install strace)";
  char trace[] = "/tmp/teardown-shadow-strace.XXXXXX";
  const int fd = mkstemp(trace);
  ASSERT_GE(fd, 0);
  close(fd);
  for (const std::vector<std::string>& arguments : {std::vector<std::string>{"exit", "5"}, {"wall", "2"}}) {
    SCOPED_TRACE(arguments[0]);
    std::vector<std::string> command{"/usr/bin/strace", "-f", "-o", trace};
    for (const std::string& argument : probe(arguments)) command.push_back(argument);
    launched p(command, {}, true);
    const std::optional<int> status = p.finish_within(60);
    const std::string errors = p.errors();
    if (status && WIFEXITED(*status) && WEXITSTATUS(*status) == 1 && errors.find("PTRACE") != std::string::npos) {
      unlink(trace);
      GTEST_SKIP() << "strace cannot trace here: " << errors;
    }
    EXPECT_EQ(status_text(status), exited_with(arguments[0] == "exit" ? 5 : 7)) << errors;
  }
  unlink(trace);
}

// The program's own copy of process.hpp sees the helper that the preload library started, gets
// it back from enable (no second helper), and ends it with disable: the README's remedy before a
// __WALL loop reaches it.
TEST_F(ShadowPreloadTest, ProgramsOwnCopyOfTheApiSeesAndControlsThePreloadedHelper) {
  launched p(probe({"api"}), {}, true);
  const std::string before = p.line();
  const pid_t helper = before.rfind("before 1 ", 0) == 0 ? static_cast<pid_t>(std::atol(before.c_str() + 9)) : 0;
  EXPECT_GT(helper, 0) << "the API does not see the preloaded helper: \"" << before << "\"";
  if (helper > 0) strays_.add(helper);
  EXPECT_EQ(p.line(), "enable " + std::to_string(helper)) << "enable must return the one helper";
  EXPECT_EQ(p.line(), "after 0 0");
  if (helper > 0) {
    EXPECT_TRUE(eventually([&] { return ended(helper); })) << "disable did not end the helper";
  }
  const std::optional<int> status = p.finish_within(60);
  EXPECT_EQ(status_text(status), exited_with(0));
  EXPECT_EQ(p.errors(), "");
}

// GCC's ASan runtime insists on coming first in the process (libasan.so, the program's first
// DT_NEEDED, after which every LD_PRELOAD object would load).
TEST_F(ShadowPreloadTest, GccAddressSanitizerProgramRunsWithItsOwnStatus) {
  const std::string asan_probe = TEARDOWN_SHADOW_ASAN_PROBE;
  if (asan_probe.empty()) GTEST_SKIP() << "no GCC -fsanitize=address probe in this build (Clang links ASan statically)";
  for (const std::string& user_preload : {std::string(), std::string("LD_PRELOAD=libasan.so.8")}) {
    SCOPED_TRACE(user_preload);
    std::vector<std::string> extra;
    if (!user_preload.empty()) extra.push_back(user_preload);
    launched p({installed_prefix::launcher().string(), asan_probe}, extra, true);
    const std::optional<int> status = p.finish_within(60);
    const std::string errors = p.errors();
    if (user_preload.empty() || errors.find("cannot be preloaded") == std::string::npos) {
      EXPECT_EQ(status_text(status), exited_with(3)) << errors;
      EXPECT_EQ(p.line(), "asan probe 1");
      EXPECT_EQ(errors, "");
    }
  }
}

// Another preload keeps its place and the program its status; the helper is there as usual.
TEST_F(ShadowPreloadTest, JemallocPreloadedProgramKeepsItsAllocatorAndItsStatus) {
  const std::string jemalloc = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
  if (access(jemalloc.c_str(), R_OK) != 0) {
    GTEST_SKIP() << jemalloc << " is not installed (Debian: apt-get install libjemalloc2)";
  }
  launched p(probe({"cloexec"}), {"LD_PRELOAD=" + jemalloc});
  const pid_t program = p.expect("ready");
  const std::string maps = read_text("/proc/" + std::to_string(program) + "/maps");
  EXPECT_NE(maps.find("libjemalloc.so.2"), std::string::npos);
  EXPECT_NE(maps.find("libteardown_shadow.so"), std::string::npos);
  EXPECT_NE(only_helper(program), 0);
  p.kill_and_wait();
  launched q(probe({"exit", "5"}), {"LD_PRELOAD=" + jemalloc}, true);
  EXPECT_EQ(status_text(q.finish_within(60)), exited_with(5));
  EXPECT_EQ(q.errors(), "");
}

// Each image's helper exits at the exec; a helper that is the program's child would stay its
// zombie, one per exec, and no wait() of the program's reaps them.
TEST_F(ShadowPreloadTest, ReexecTwoHundredTimesLeavesNoZombieHelpers) {
  launched p(probe({"reexec", "200"}), {}, true);
  const std::optional<int> status = p.finish_within(60);
  EXPECT_EQ(status_text(status), exited_with(0));
  EXPECT_EQ(p.line(), "zombies 0");
  EXPECT_EQ(p.errors(), "");
}

// The same under a pids cgroup with pids.max=40: zombies count against it, and the program could
// no longer fork. A cgroup of its own (v1 pids controller, else v2), created and removed here.
TEST_F(ShadowPreloadTest, ReexecTwoHundredTimesUnderPidsMaxFortyCanStillFork) {
  std::string root;
  for (const std::string candidate : {"/sys/fs/cgroup/pids", "/sys/fs/cgroup"}) {
    if (access((candidate + "/cgroup.procs").c_str(), W_OK) != 0) continue;
    if (candidate == "/sys/fs/cgroup" &&
        read_text(candidate + "/cgroup.subtree_control").find("pids") == std::string::npos) {
      continue;
    }
    root = candidate;
    break;
  }
  if (root.empty()) {
    GTEST_SKIP() << "no writable pids cgroup (neither a v1 pids hierarchy at /sys/fs/cgroup/pids nor v2 at "
                    "/sys/fs/cgroup with pids in cgroup.subtree_control)";
  }
  const std::string group = root + "/teardown-shadow-test-" + std::to_string(getpid());
  if (mkdir(group.c_str(), 0755) != 0) GTEST_SKIP() << "cannot create " << group << ": " << std::strerror(errno);
  {
    std::ofstream limit(group + "/pids.max");
    limit << "40\n";
  }
  if (read_text(group + "/pids.max") != "40\n") {
    rmdir(group.c_str());
    GTEST_SKIP() << "cannot set " << group << "/pids.max";
  }
  // The helpers that exit are reaped by the nearest subreaper, else init. Under a pids limit they
  // count until then, so the reaper must be prompt; this machine's init may reap orphans only
  // every second or so. A prompt subreaper (shadow_probe's "reaper", as systemd, tini or
  // docker-init are) runs the program.
  std::vector<std::string> command{"/bin/sh", "-c", "echo $$ > '" + group + "/cgroup.procs' && exec \"$@\"", "sh",
                                   TEARDOWN_SHADOW_PROBE, "reaper"};
  for (const std::string& argument : probe({"reexec", "200"})) command.push_back(argument);
  {
    launched p(command, {}, true);
    const std::optional<int> status = p.finish_within(60);
    EXPECT_EQ(status_text(status), exited_with(0));
    std::string out;
    for (std::string text = p.line(); !text.empty(); text = p.line()) out += text + "\n";
    EXPECT_EQ(out, "zombies 0\nfork ok\n");
    EXPECT_EQ(p.errors(), "");
  }
  // The last helper leaves the group when init has reaped it.
  EXPECT_TRUE(eventually([&] { return rmdir(group.c_str()) == 0; }, std::chrono::seconds(10)))
      << "cannot remove " << group;
}

// A program that clears FD_CLOEXEC on every descriptor before exec() hands the pipe's write end
// to its new image: the old image's helper must still end at the exec, freeing the old image.
TEST_F(ShadowPreloadTest, ExecAfterClearingCloexecEverywhereEndsTheOldImagesHelper) {
  launched p(probe({"cloexec"}), {}, true);
  const pid_t program = p.expect("ready");
  const pid_t old_helper = only_helper(program);
  ASSERT_NE(old_helper, 0);
  p.send("go");
  EXPECT_EQ(p.expect("ready"), program);
  EXPECT_TRUE(eventually([&] { return ended(old_helper); }, std::chrono::seconds(10)))
      << "the old image's helper lives on beside the new image";
  EXPECT_NE(only_helper(program), 0) << "the new image has its own";
  EXPECT_EQ(status_text(p.finish_within(60)), exited_with(0));
  EXPECT_EQ(p.errors(), "");
}

// ---- sanitized programs that the program runs (the library's exec wrappers) --------------------------

// The cases below start the GCC ASan probe through something that teardown-run runs: a shell,
// env, make, a launcher on each route of the exec family and posix_spawn. Skipped where there is
// no probe (Clang) or where it does not start even alone (no libasan): a pass must mean it ran.
class ShadowPreloadSanitizedChildTest : public ShadowPreloadTest {
 protected:
  void SetUp() override {
    ShadowPreloadTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (asan_probe_.empty()) {
      GTEST_SKIP() << "no GCC -fsanitize=address probe in this build (Clang links ASan statically)";
    }
    launched alone({asan_probe_}, {}, true);
    const std::optional<int> status = alone.finish_within(60);
    const std::string errors = alone.errors();
    if (status_text(status) != exited_with(3)) {
      GTEST_SKIP() << "the ASan probe does not run here even alone (" << status_text(status) << "): " << errors;
    }
  }

  // The probe's lines for "environment": the runtime was taken off again, so its children inherit
  // LD_PRELOAD as it was.
  std::string probe_environment() const {
    std::error_code error;
    return "asan probe 1\nLD_PRELOAD=" + fs::canonical(installed_prefix::library(), error).string() +
           "\nTEARDOWN_SHADOW_PRELOAD_ADDED=-\n";
  }

  static std::string probe_directory() { return fs::path(TEARDOWN_SHADOW_ASAN_PROBE).parent_path().string(); }
  static std::string path_with_probe() {
    const char* path = std::getenv("PATH");
    return "PATH=" + probe_directory() + ":" + (path != nullptr ? path : "/bin:/usr/bin");
  }

  static std::string all_lines(launched& p) {
    std::string out;
    for (std::string text = p.line(); !text.empty(); text = p.line()) out += text + "\n";
    return out;
  }

  const std::string asan_probe_ = TEARDOWN_SHADOW_ASAN_PROBE;
};

// `teardown-run make check`: a shell, env or make starts the sanitized program, which teardown-run
// never sees; the library's execve (dash), execvp (env) or posix_spawn (make) put its runtime first.
TEST_F(ShadowPreloadSanitizedChildTest, ShellAndEnvStartASanitizedProgramWithItsOwnStatus) {
  const std::string launcher = installed_prefix::launcher().string();
  for (const std::vector<std::string>& command :
       {std::vector<std::string>{launcher, "/bin/sh", "-c", asan_probe_ + " environment"},
        {launcher, "/bin/sh", "-c", asan_probe_ + " environment; exit $?"},
        {launcher, "/usr/bin/env", asan_probe_, "environment"}}) {
    SCOPED_TRACE(command[1] + " " + command[2]);
    launched p(command, {}, true);
    const std::optional<int> status = p.finish_within(60);
    const std::string errors = p.errors();
    EXPECT_EQ(status_text(status), exited_with(3)) << errors;
    EXPECT_EQ(all_lines(p), probe_environment());
    EXPECT_EQ(errors, "");
  }
}

// The runtime is the sanitized program's alone: the shell's other children, and the sanitized
// program's own children, see LD_PRELOAD as teardown-run set it, without the runtime.
TEST_F(ShadowPreloadSanitizedChildTest, NeitherTheShellsOtherChildrenNorTheSanitizedProgramsInheritTheRuntime) {
  std::error_code error;
  const std::string library = fs::canonical(installed_prefix::library(), error).string();
  launched p({installed_prefix::launcher().string(), "/bin/sh", "-c",
              asan_probe_ + " spawn /usr/bin/printenv LD_PRELOAD; echo status $?; /usr/bin/printenv LD_PRELOAD; "
                            "/usr/bin/printenv TEARDOWN_SHADOW_PRELOAD_ADDED || echo unset"},
             {}, true);
  const std::optional<int> status = p.finish_within(60);
  const std::string errors = p.errors();
  EXPECT_EQ(status_text(status), exited_with(0)) << errors;
  EXPECT_EQ(all_lines(p), "asan probe 1\n" + library + "\nstatus 0\n" + library + "\nunset\n");
  EXPECT_EQ(errors, "");
  // A sanitized program that starts another: through ASan's own posix_spawnp, then ours.
  launched q({installed_prefix::launcher().string(), asan_probe_, "spawn", asan_probe_, "environment"}, {}, true);
  const std::optional<int> nested = q.finish_within(60);
  const std::string nested_errors = q.errors();
  EXPECT_EQ(status_text(nested), exited_with(3)) << nested_errors;
  EXPECT_EQ(all_lines(q), "asan probe 1\n" + probe_environment());
  EXPECT_EQ(nested_errors, "");
}

TEST_F(ShadowPreloadSanitizedChildTest, EveryExecAndSpawnRouteStartsASanitizedProgram) {
  for (const std::string route : {"execve", "execv", "execvp", "execvpe", "execl", "execlp", "execle", "fexecve",
                                  "fexecve_opath", "execveat", "vfork", "posix_spawn", "posix_spawnp", "system",
                                  "popen"}) {
    SCOPED_TRACE(route);
    const bool searches = route == "execvp" || route == "execvpe" || route == "execlp" || route == "posix_spawnp";
    const std::string program = searches ? fs::path(asan_probe_).filename().string() : asan_probe_;
    launched p({installed_prefix::launcher().string(), TEARDOWN_SHADOW_EXEC_LAUNCHER, route, program, "environment"},
               {path_with_probe()}, true);
    const std::optional<int> status = p.finish_within(60);
    const std::string errors = p.errors();
    EXPECT_EQ(status_text(status), exited_with(3)) << errors;
    EXPECT_EQ(all_lines(p), probe_environment());
    EXPECT_EQ(errors, "");
  }
}

TEST_F(ShadowPreloadSanitizedChildTest, MakeRecipesStartASanitizedProgram) {
  if (access("/usr/bin/make", X_OK) != 0) GTEST_SKIP() << "make is not installed (Debian: apt-get install make)";
  char directory[] = "/tmp/teardown-shadow-make.XXXXXX";
  ASSERT_NE(mkdtemp(directory), nullptr);
  // One recipe line make runs itself (posix_spawn), one it hands to /bin/sh.
  std::ofstream(std::string(directory) + "/Makefile")
      << "check:\n\t" << asan_probe_ << " status 0\n\t" << asan_probe_ << " status 0 && true\n";
  launched p({installed_prefix::launcher().string(), "/usr/bin/make", "-s", "-C", directory, "check"}, {}, true);
  const std::optional<int> status = p.finish_within(60);
  const std::string errors = p.errors();
  EXPECT_EQ(status_text(status), exited_with(0)) << errors;
  EXPECT_EQ(all_lines(p), "asan probe 1\nasan probe 1\n");
  EXPECT_EQ(errors, "");
  std::error_code error;
  fs::remove_all(directory, error);
}

// A "#!" script whose interpreter is the sanitized program: the kernel execs the interpreter.
TEST_F(ShadowPreloadSanitizedChildTest, ScriptWithASanitizedInterpreterStarts) {
  char directory[] = "/tmp/teardown-shadow-script.XXXXXX";
  ASSERT_NE(mkdtemp(directory), nullptr);
  const std::string script = std::string(directory) + "/script";
  std::ofstream(script) << "#!" << asan_probe_ << "\n";
  ASSERT_EQ(chmod(script.c_str(), 0755), 0);
  launched p({installed_prefix::launcher().string(), "/bin/sh", "-c", script}, {}, true);
  const std::optional<int> status = p.finish_within(60);
  const std::string errors = p.errors();
  EXPECT_EQ(status_text(status), exited_with(3)) << errors;
  EXPECT_EQ(p.line(), "asan probe 1");
  EXPECT_EQ(errors, "");
  std::error_code error;
  fs::remove_all(directory, error);
}

// TEARDOWN_SHADOW=0 leaves the shell without a helper; its sanitized child, which loads the
// library all the same (LD_PRELOAD is inherited), still gets its runtime first.
TEST_F(ShadowPreloadSanitizedChildTest, OptedOutShellStillStartsItsSanitizedChild) {
  launched p({installed_prefix::launcher().string(), "/usr/bin/env", "TEARDOWN_SHADOW=0", "/bin/sh", "-c",
              asan_probe_ + " environment"},
             {}, true);
  const std::optional<int> status = p.finish_within(60);
  const std::string errors = p.errors();
  EXPECT_EQ(status_text(status), exited_with(3)) << errors;
  EXPECT_EQ(all_lines(p), probe_environment());
  EXPECT_EQ(errors, "");
}

// A failing exec or spawn fails as it does without the library: the same error, the same status
// (the wrappers' own reads of the file must leave errno as the caller had it).
TEST_F(ShadowPreloadTest, ExecAndSpawnFailuresAreTheSameWithTheLibrary) {
  char directory[] = "/tmp/teardown-shadow-errors.XXXXXX";
  ASSERT_NE(mkdtemp(directory), nullptr);
  const std::string plain = std::string(directory) + "/not-executable";
  std::ofstream(plain) << "\x7f" "ELF";
  const std::string library = installed_prefix::library().string();
  for (const std::string route : {"execve", "execv", "execvp", "execvpe", "execl", "execlp", "execle", "execveat",
                                  "vfork", "posix_spawn", "posix_spawnp"}) {
    for (const std::string& target : {std::string("/nonexistent/program"), std::string(directory), plain,
                                      std::string("no-such-program-anywhere")}) {
      SCOPED_TRACE(route + " " + target);
      std::string without_out, with_out;
      std::optional<int> without_status, with_status;
      for (const bool preloaded : {false, true}) {
        std::vector<std::string> extra{preloaded ? "LD_PRELOAD=" + library : "LD_PRELOAD"};
        launched p({TEARDOWN_SHADOW_EXEC_LAUNCHER, route, target}, extra, true);
        (preloaded ? with_status : without_status) = p.finish_within(60);
        (preloaded ? with_out : without_out) = p.line();
      }
      EXPECT_EQ(status_text(with_status), status_text(without_status));
      EXPECT_EQ(with_out, without_out);
      EXPECT_NE(without_out, "") << "the route did not fail";
    }
  }
  std::error_code error;
  fs::remove_all(directory, error);
}

}  // namespace
}  // namespace teardown_test
