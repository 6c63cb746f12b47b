// Specification of teardown::process (process.hpp): shadow teardown for a whole process.
//
// Most cases run a "program": a child forked from the test that enables shadow teardown, maybe
// populates memory, reports its helper's pid through a pipe and then waits for the test, which
// kills it (or tells it to exit) and watches what happens to the helper through /proc. The
// helper is the program's child, so it is reaped by whoever adopts it (a subreaper or init) or,
// where init does not reap, stays a zombie: both count as "ended" here; a zombie has freed its
// memory. Cases about the API alone enable in the test process itself and disable at the end.
//
// Nothing asserts a time. Every wait for something the kernel does next (a helper ending, a
// signal being consumed) is a loop bounded at 60 s, a hang guard: reaching the bound fails the
// test, it does not measure anything. That waitpid() returns before the teardown is proved by
// order, not speed: the helper is stopped (SIGSTOP) before the program is killed, so it cannot
// have torn anything down when waitpid() returns, and /proc shows it still mapping the memory.
#include "teardown/process.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "fork_test_support.hpp"
#include "test_support.hpp"

namespace teardown_test {
namespace {

namespace tp = teardown::process;
using namespace std::chrono_literals;

// The exec case's new image: this same binary, started with this variable set, parks here before
// gtest runs and stays alive until the test kills it.
constexpr const char* kParkVariable = "TEARDOWN_PROCESS_TEST_PARK";
[[maybe_unused]] const bool parked_after_exec = [] {
  if (std::getenv(kParkVariable) != nullptr) {
    for (;;) pause();
  }
  return false;
}();

// What a program populates before it is killed: enough for a teardown that takes a while.
constexpr std::size_t kPopulateBytes = (under_sanitizer ? 64u : 256u) << 20;

// ---- /proc -----------------------------------------------------------------------------------

std::string read_text(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

std::string proc(pid_t pid, const char* what) { return read_text("/proc/" + std::to_string(pid) + "/" + what); }

// The scheduler state of a process ('S', 'T', 'Z', ...), or '\0' once /proc has no such pid.
char state_of(pid_t pid) {
  const std::string stat = proc(pid, "stat");
  const std::size_t close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() ? '\0' : stat[close + 2];
}

// Field `number` of /proc/<pid>/stat, counted as proc(5) does (1: pid, 3: state, 19: nice,
// 41: policy); "" if absent.
std::string stat_field(pid_t pid, int number) {
  const std::string stat = proc(pid, "stat");
  const std::size_t close = stat.rfind(')');
  if (close == std::string::npos) return {};
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  for (int at = 3; at <= number && fields >> field; ++at) {
    if (at == number) return field;
  }
  return {};
}

// Gone, or a zombie: either way its exit is complete and its memory freed.
bool ended(pid_t pid) {
  const char state = state_of(pid);
  return state == '\0' || state == 'Z' || state == 'X';
}

// A field of /proc/<pid>/status ("PPid", "VmRSS", "ShdPnd"...), without the name; "" if absent.
std::string status_field(pid_t pid, const std::string& name) {
  std::istringstream status(proc(pid, "status"));
  for (std::string line; std::getline(status, line);) {
    if (line.rfind(name + ":", 0) == 0) {
      const std::size_t start = line.find_first_not_of(" \t", name.size() + 1);
      return start == std::string::npos ? std::string() : line.substr(start);
    }
  }
  return {};
}

long status_number(pid_t pid, const std::string& name) {
  const std::string value = status_field(pid, name);
  return value.empty() ? -1 : std::strtol(value.c_str(), nullptr, 10);
}

std::string comm_of(pid_t pid) {
  std::string comm = proc(pid, "comm");
  if (!comm.empty() && comm.back() == '\n') comm.pop_back();
  return comm;
}

// Every process whose parent is `parent`, zombies included.
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> children;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const auto pid = static_cast<pid_t>(std::stol(name));
    if (status_number(pid, "PPid") == parent) children.push_back(pid);
  }
  return children;
}

// Whether one mapping in /proc/<pid>/maps covers [address, address + size) (adjacent mappings
// may have merged with it).
bool maps_cover(pid_t pid, unsigned long address, std::size_t size) {
  std::istringstream maps(proc(pid, "maps"));
  for (std::string line; std::getline(maps, line);) {
    unsigned long start = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &start, &end) == 2 && start <= address && address + size <= end) {
      return true;
    }
  }
  return false;
}

// Where each descriptor of `pid` points ("pipe:[123]", "anon_inode:[signalfd]", a path).
std::vector<std::string> descriptors_of(const std::string& pid) {
  std::vector<std::string> targets;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/" + pid + "/fd", error)) {
    targets.push_back(std::filesystem::read_symlink(entry.path(), error).string());
  }
  return targets;
}

std::size_t open_descriptors() { return descriptors_of("self").size(); }

std::string pipe_name(int fd) {
  std::error_code error;
  return std::filesystem::read_symlink("/proc/self/fd/" + std::to_string(fd), error).string();
}


// Whether signal `signal` is pending for pid (thread or process-wide).
bool signal_pending(pid_t pid, int signal) {
  const std::uint64_t bit = std::uint64_t{1} << (signal - 1);
  for (const char* field : {"SigPnd", "ShdPnd"}) {
    if (std::strtoull(status_field(pid, field).c_str(), nullptr, 16) & bit) return true;
  }
  return false;
}

// Blocked in ppoll, the helper's only wait: /proc/<pid>/syscall starts with the call's number.
bool blocked_in_ppoll(pid_t pid) {
  const std::string call = proc(pid, "syscall");
  return call.rfind(std::to_string(SYS_ppoll) + " ", 0) == 0;
}

// Touches every page of a fresh mapping of `bytes`; returns false if the mapping failed.
bool populate(std::size_t bytes) {
  void* const base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return false;
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  auto* const bytes_at = static_cast<volatile unsigned char*>(base);
  for (std::size_t at = 0; at < bytes; at += page) bytes_at[at] = 1;
  return true;
}

// Kills, on every path out of a test, the processes it made that are not its children (a
// helper, a grandchild) and that are still there.
class stray_killer {
 public:
  stray_killer() = default;
  stray_killer(const stray_killer&) = delete;
  stray_killer& operator=(const stray_killer&) = delete;
  ~stray_killer() {
    for (const pid_t pid : pids_) {
      if (pid > 0 && !ended(pid)) kill(pid, SIGKILL);
    }
  }
  void add(pid_t pid) { pids_.push_back(pid); }

 private:
  std::vector<pid_t> pids_;
};

// ---- the program: a forked child --------------------------------------------------------------

// What a program reports once it is set up.
struct report {
  pid_t helper = 0;
  pid_t other = 0;      // a second pid some cases need (a grandchild)
  char failure[256] = {};  // non-empty: what went wrong in the program
};

void fail_report(report& r, const std::string& what) {
  std::snprintf(r.failure, sizeof r.failure, "%s", what.c_str());
}

// A child that runs `setup`, sends the report, and then waits: for a byte on its command pipe
// (then it exits normally, with _exit so that nothing of the test process's state runs in it) or
// to be killed. It holds the report pipe's write end until it dies, so the test's read sees EOF
// only then, unless something else holds it too.
class program {
 public:
  // after_report, if any, runs in the child once the report is sent (an exec, say); if it returns,
  // the child waits as usual.
  explicit program(const std::function<void(report&)>& setup, const std::function<void()>& after_report = {}) {
    int to_test[2];
    int to_program[2];
    if (pipe2(to_test, O_CLOEXEC) != 0) throw std::runtime_error("pipe2");
    if (pipe2(to_program, O_CLOEXEC) != 0) {
      close(to_test[0]);
      close(to_test[1]);
      throw std::runtime_error("pipe2");
    }
    std::fflush(stdout);
    std::fflush(stderr);
    pid_ = fork();
    if (pid_ == 0) {
      close(to_test[0]);
      close(to_program[1]);
      report r;
      try {
        setup(r);
      } catch (const std::exception& e) {
        fail_report(r, std::string("the program threw: ") + e.what());
      }
      if (write(to_test[1], &r, sizeof r) != static_cast<ssize_t>(sizeof r)) _exit(3);
      if (after_report) after_report();
      char command = 0;
      while (read(to_program[0], &command, 1) < 0 && errno == EINTR) {
      }
      _exit(0);
    }
    close(to_test[1]);
    close(to_program[0]);
    report_fd_ = to_test[0];
    command_fd_ = to_program[1];
    if (pid_ < 0) {
      close(report_fd_);
      close(command_fd_);
      throw std::runtime_error("fork");
    }
    // Bounded by the hang guard's 60 s: a program that never reports fails the test.
    pollfd ready{report_fd_, POLLIN, 0};
    int polled;
    while ((polled = poll(&ready, 1, 60'000)) < 0 && errno == EINTR) {
    }
    ssize_t got = -1;
    if (polled == 1) {
      while ((got = read(report_fd_, &report_, sizeof report_)) < 0 && errno == EINTR) {
      }
    }
    if (got != static_cast<ssize_t>(sizeof report_)) fail_report(report_, "the program did not report");
  }
  program(const program&) = delete;
  program& operator=(const program&) = delete;
  ~program() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      wait();
    }
    close(report_fd_);
    close(command_fd_);
  }

  pid_t pid() const { return pid_; }
  const report& reported() const { return report_; }

  // SIGKILL, then waitpid(); returns the wait status.
  int kill_and_wait() {
    kill(pid_, SIGKILL);
    return wait();
  }
  // Tells the program to exit normally, then waitpid(); returns the wait status.
  int exit_and_wait() {
    const char command = 'x';
    if (write(command_fd_, &command, 1) != 1) ADD_FAILURE() << "cannot reach the program";
    return wait();
  }

  // Whether the report pipe has reached EOF (every write end closed) within the hang guard.
  bool report_pipe_reaches_eof() {
    return eventually([&] {
      char byte = 0;
      const int flags = fcntl(report_fd_, F_GETFL);
      fcntl(report_fd_, F_SETFL, flags | O_NONBLOCK);
      const ssize_t got = read(report_fd_, &byte, 1);
      fcntl(report_fd_, F_SETFL, flags);
      return got == 0;
    });
  }

 private:
  int wait() {
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    reaped_ = true;
    return status;
  }

  pid_t pid_ = -1;
  bool reaped_ = false;
  int report_fd_ = -1;
  int command_fd_ = -1;
  report report_;
};

// The usual program: enables shadow teardown, populates memory, reports its helper.
void enable_and_populate(report& r) {
  r.helper = tp::enable_shadow_teardown();
  if (!populate(kPopulateBytes)) fail_report(r, "mmap failed");
}

// ---- a child that reports through its exit code (run_child, fork_test_support.hpp) ------------


// A seccomp filter that makes one system call fail with EPERM (optionally only when its first
// argument is `first_argument`), for this process and every process it creates from now on.
bool refuse_with_eperm(int number, std::optional<unsigned> first_argument = std::nullopt) {
  std::vector<sock_filter> code = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<unsigned>(number), 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  if (first_argument) {
    code.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[0])));
    code.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, *first_argument, 1, 0));
    code.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
  }
  code.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM));
  const sock_fprog program{static_cast<unsigned short>(code.size()), code.data()};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) == 0;
}

// ---- cases that enable in the test process ----------------------------------------------------

// Disables at the end of each case, and checks that the case left no descriptor behind.
class ProcessShadowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!tp::shadow_teardown_supported) GTEST_SKIP() << "shadow teardown is Linux on x86-64 only";
    descriptors_before_ = open_descriptors();
  }
  void TearDown() override {
    tp::disable_shadow_teardown();
    if (tp::shadow_teardown_supported) {
      EXPECT_EQ(open_descriptors(), descriptors_before_) << "a descriptor leaked";
    }
  }

 private:
  std::size_t descriptors_before_ = 0;
};

TEST_F(ProcessShadowTest, EnableStartsANamedHelperThatSharesTheAddressSpace) {
  EXPECT_FALSE(tp::shadow_teardown_enabled());
  EXPECT_EQ(tp::shadow_pid(), 0);
  const pid_t helper = tp::enable_shadow_teardown();
  ASSERT_GT(helper, 0);
  EXPECT_TRUE(tp::shadow_teardown_enabled());
  EXPECT_EQ(tp::shadow_pid(), helper);
  EXPECT_EQ(comm_of(helper), "teardown-shadow");
  EXPECT_EQ(status_number(helper, "PPid"), getpid());
  EXPECT_EQ(status_number(helper, "Tgid"), helper) << "a process of its own, not a thread of ours";

  // A mapping made after the helper started, and what we write there, are the helper's too:
  // one address space.
  constexpr std::size_t size = 1 << 20;
  void* const mapping = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mapping, MAP_FAILED);
  const auto address = reinterpret_cast<unsigned long>(mapping);
  EXPECT_TRUE(maps_cover(helper, address, size));
  const std::uint64_t written = 0x5eed'0000'0000'0000u ^ static_cast<std::uint64_t>(helper);
  *static_cast<volatile std::uint64_t*>(mapping) = written;
  const int mem = open(("/proc/" + std::to_string(helper) + "/mem").c_str(), O_RDONLY | O_CLOEXEC);
  if (mem >= 0) {  // reading another process's memory may be refused (Yama); the maps stay
    std::uint64_t read_back = 0;
    EXPECT_EQ(pread(mem, &read_back, sizeof read_back, static_cast<off_t>(address)), 8);
    EXPECT_EQ(read_back, written);
    close(mem);
  }
  munmap(mapping, size);

  // By default the helper, and so the teardown it will run, has the lowest priority of the
  // normal class.
  EXPECT_EQ(stat_field(helper, 19), "19");
  EXPECT_EQ(stat_field(helper, 41), std::to_string(SCHED_OTHER));
}

TEST_F(ProcessShadowTest, NameAndNiceComeFromTheOptionsAndLinuxKeepsFifteenBytes) {
  const pid_t helper = tp::enable_shadow_teardown({.name = "a-rather-long-helper-name", .nice = 7});
  EXPECT_EQ(comm_of(helper), "a-rather-long-h");
  EXPECT_EQ(stat_field(helper, 19), "7");
}

TEST_F(ProcessShadowTest, SchedIdleOptionPutsTheHelperInTheIdleClass) {
  const pid_t helper = tp::enable_shadow_teardown({.sched_idle = true});
  EXPECT_EQ(stat_field(helper, 41), std::to_string(SCHED_IDLE));
}

TEST_F(ProcessShadowTest, EnableAgainReturnsTheSameHelperAndIgnoresItsOptions) {
  const pid_t helper = tp::enable_shadow_teardown({.name = "first"});
  EXPECT_EQ(tp::enable_shadow_teardown({.name = "second"}), helper);
  EXPECT_EQ(comm_of(helper), "first");
  EXPECT_EQ(children_of(getpid()), std::vector<pid_t>{helper});
  // The options of a repeated call are still checked.
  EXPECT_THROW(tp::enable_shadow_teardown({.stack_size = 1}), std::invalid_argument);
  EXPECT_EQ(tp::shadow_pid(), helper);
}

TEST_F(ProcessShadowTest, BadOptionsThrowInvalidArgumentAndCreateNothing) {
  const std::size_t descriptors = open_descriptors();
  const std::vector<tp::shadow_options> bad = {
      {.stack_size = tp::shadow_options::min_stack_size - 1},
      {.stack_size = 0},
      {.stack_size = tp::shadow_options::max_stack_size + 1},
      {.name = ""},
      {.name = std::string("nul\0inside", 10)},
      {.nice = 20},
      {.nice = -21},
  };
  for (const tp::shadow_options& options : bad) {
    EXPECT_THROW(tp::enable_shadow_teardown(options), std::invalid_argument);
    EXPECT_FALSE(tp::shadow_teardown_enabled());
    EXPECT_EQ(tp::shadow_pid(), 0);
    EXPECT_TRUE(children_of(getpid()).empty());
    EXPECT_EQ(open_descriptors(), descriptors);
  }
  // The bounds themselves are accepted.
  EXPECT_GT(tp::enable_shadow_teardown({.stack_size = tp::shadow_options::min_stack_size}), 0);
  tp::disable_shadow_teardown();
  EXPECT_GT(tp::enable_shadow_teardown({.stack_size = tp::shadow_options::max_stack_size}), 0);
}

TEST_F(ProcessShadowTest, HelperKeepsOnlyItsOwnDescriptorsAndWorksFromTheRoot) {
  int ours[2];
  ASSERT_EQ(pipe(ours), 0);  // inheritable on purpose
  const pid_t helper = tp::enable_shadow_teardown();
  const std::vector<std::string> descriptors = descriptors_of(std::to_string(helper));
  ASSERT_EQ(descriptors.size(), 2u);
  std::vector<std::string> kinds;
  for (const std::string& target : descriptors) {
    EXPECT_NE(target, pipe_name(ours[0])) << "the helper holds our pipe";
    kinds.push_back(target.rfind("pipe:", 0) == 0 ? "pipe" : target);
  }
  std::sort(kinds.begin(), kinds.end());
  EXPECT_EQ(kinds, (std::vector<std::string>{"anon_inode:[signalfd]", "pipe"}));
  std::error_code error;
  EXPECT_EQ(std::filesystem::read_symlink("/proc/" + std::to_string(helper) + "/cwd", error), "/");
  close(ours[0]);
  close(ours[1]);
}

// Whether this kernel (and sandbox) offers pidfds: then the program holds the helper's too.
bool pidfds_available() {
  const long fd = syscall(SYS_pidfd_open, getpid(), 0);
  if (fd < 0) return false;
  close(static_cast<int>(fd));
  return true;
}

TEST_F(ProcessShadowTest, DisableKillsAndReapsTheHelper) {
  const std::size_t descriptors = open_descriptors();
  const pid_t helper = tp::enable_shadow_teardown();
  EXPECT_EQ(open_descriptors(), descriptors + (pidfds_available() ? 2 : 1))
      << "the program keeps the pipe's write end and, where the kernel has them, the helper's pidfd";
  tp::disable_shadow_teardown();
  EXPECT_FALSE(tp::shadow_teardown_enabled());
  EXPECT_EQ(state_of(helper), '\0') << "reaped, not left a zombie";
  EXPECT_EQ(open_descriptors(), descriptors);
  tp::disable_shadow_teardown();  // a no-op now
  const pid_t again = tp::enable_shadow_teardown();
  EXPECT_GT(again, 0);
  EXPECT_TRUE(tp::shadow_teardown_enabled());
}

// Detached (what libteardown_shadow.so uses): the helper is handed to a subreaper or init at
// once, so no wait of ours sees it, __WALL included; disable still ends it, and leaves nothing.
TEST_F(ProcessShadowTest, DetachedHelperIsNoChildOfOursAndDisableEndsIt) {
  const std::size_t descriptors = open_descriptors();
  tp::shadow_options options;
  options.detached = true;
  const pid_t helper = tp::enable_shadow_teardown(options);
  ASSERT_GT(helper, 0);
  EXPECT_EQ(tp::shadow_pid(), helper);
  EXPECT_NE(status_number(helper, "PPid"), getpid()) << "still our child";
  EXPECT_EQ(children_of(getpid()).size(), 0u) << "the intermediate, or the helper, is left among our children";
  int status = 0;
  EXPECT_EQ(waitpid(-1, &status, WNOHANG | __WALL), -1) << "a __WALL wait of ours sees something";
  EXPECT_EQ(errno, ECHILD);
  EXPECT_EQ(tp::enable_shadow_teardown(), helper) << "a second enable returns the one helper";
  tp::disable_shadow_teardown();
  EXPECT_FALSE(tp::shadow_teardown_enabled());
  EXPECT_TRUE(eventually([&] { return ended(helper); })) << "disable did not end it";
  EXPECT_EQ(open_descriptors(), descriptors);
}

TEST_F(ProcessShadowTest, AKilledHelperIsReportedAndEnableStartsANewOne) {
  const pid_t helper = tp::enable_shadow_teardown();
  ASSERT_EQ(kill(helper, SIGKILL), 0);
  // The kernel clears the shared word when the helper exits.
  ASSERT_TRUE(eventually([] { return !tp::shadow_teardown_enabled(); }));
  EXPECT_EQ(tp::shadow_pid(), 0);
  EXPECT_EQ(state_of(helper), 'Z') << "our zombie until the next enable or disable";
  const pid_t replacement = tp::enable_shadow_teardown();
  EXPECT_NE(replacement, helper);
  EXPECT_EQ(state_of(helper), '\0') << "enable reaped the dead helper";
  EXPECT_EQ(children_of(getpid()), std::vector<pid_t>{replacement});
}

TEST_F(ProcessShadowTest, ForkChildHasNoHelperUntilItEnablesOne) {
  const pid_t helper = tp::enable_shadow_teardown();
  // The helper's end of its pipe is "pipe:[inode]"; the child must hold no end of that pipe.
  std::string helper_pipe;
  for (const std::string& target : descriptors_of(std::to_string(helper))) {
    if (target.rfind("pipe:", 0) == 0) helper_pipe = target;
  }
  ASSERT_FALSE(helper_pipe.empty());
  const int code = run_child([&] {
    CHILD_CHECK(!tp::shadow_teardown_enabled());
    CHILD_CHECK(tp::shadow_pid() == 0);
    const std::vector<std::string> mine = descriptors_of("self");
    CHILD_CHECK(std::find(mine.begin(), mine.end(), helper_pipe) == mine.end());
    const pid_t own = tp::enable_shadow_teardown();
    CHILD_CHECK(own > 0 && own != helper);
    CHILD_CHECK(status_number(own, "PPid") == getpid());
    CHILD_CHECK(tp::shadow_pid() == own);
    tp::disable_shadow_teardown();
    return 0;
  });
  EXPECT_EQ(code, 0);
  EXPECT_EQ(tp::shadow_pid(), helper) << "the child's exit did not touch the parent's helper";
  EXPECT_FALSE(ended(helper));
}

// A sandbox that refuses the clone: std::system_error with its errno, and nothing changed.
TEST(ProcessShadowFailureTest, RefusedCloneThrowsSystemErrorAndLeavesNothing) {
  if (!tp::shadow_teardown_supported) GTEST_SKIP() << "shadow teardown is Linux on x86-64 only";
  const int code = run_child([] {
    const std::size_t descriptors = open_descriptors();
    CHILD_CHECK(refuse_with_eperm(SYS_clone));
    try {
      tp::enable_shadow_teardown();
      CHILD_CHECK(!"enable_shadow_teardown did not throw");
    } catch (const std::system_error& e) {
      CHILD_CHECK(e.code().value() == EPERM);
      CHILD_CHECK(std::string(e.what()).find("clone") != std::string::npos);
    }
    CHILD_CHECK(!tp::shadow_teardown_enabled());
    CHILD_CHECK(children_of(getpid()).empty());
    CHILD_CHECK(open_descriptors() == descriptors);
    return 0;
  });
  EXPECT_EQ(code, 0);
}

// A step that fails in the helper itself (here prctl(PR_SET_PDEATHSIG), refused by a filter the
// helper inherits): the helper is killed and reaped, and the error names the step.
TEST(ProcessShadowFailureTest, HelperSetupFailureThrowsSystemErrorAndLeavesNothing) {
  if (!tp::shadow_teardown_supported) GTEST_SKIP() << "shadow teardown is Linux on x86-64 only";
  const int code = run_child([] {
    const std::size_t descriptors = open_descriptors();
    CHILD_CHECK(refuse_with_eperm(SYS_prctl, PR_SET_PDEATHSIG));
    try {
      tp::enable_shadow_teardown();
      CHILD_CHECK(!"enable_shadow_teardown did not throw");
    } catch (const std::system_error& e) {
      CHILD_CHECK(e.code().value() == EPERM);
      CHILD_CHECK(std::string(e.what()).find("PR_SET_PDEATHSIG") != std::string::npos);
    }
    CHILD_CHECK(!tp::shadow_teardown_enabled());
    CHILD_CHECK(children_of(getpid()).empty());
    CHILD_CHECK(open_descriptors() == descriptors);
    return 0;
  });
  EXPECT_EQ(code, 0);
}

// ---- a helper reaped behind the library's back, its pid taken by another process ------------
//
// A waiter of the program's with __WALL (a supervisor's "reap everything" loop) reaps the helper
// once someone killed it; its pid is then free, and the next process may get it. disable and
// enable must then signal nothing: the process with that pid is not ours to kill. The cases run
// as pid 1 of a new pid namespace, where ns_last_pid makes the reuse certain rather than likely.

constexpr int kSkipped = 77;  // a scenario's exit code: the environment refused (reason on stderr)

// Runs `scenario` as pid 1 of a new pid namespace; its exit code, or kSkipped.
int run_in_new_pid_namespace(const std::function<int()>& scenario) {
  return run_child([&] {
    if (unshare(CLONE_NEWPID) != 0) {
      std::fprintf(stderr, "unshare(CLONE_NEWPID): %s\n", std::strerror(errno));
      return kSkipped;
    }
    const pid_t init = start_child(scenario);
    if (init < 0) return 3;
    int status = 0;
    while (waitpid(init, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFSIGNALED(status)) std::fprintf(stderr, "[child] the scenario died of signal %d\n", WTERMSIG(status));
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  });
}

// Kills the helper behind the library's back and reaps it as a __WALL waiter does, then starts a
// process of ours (parked in pause()) that takes the helper's pid. Returns it, or -1 with the
// reason on stderr.
pid_t reap_helper_and_reuse_its_pid(pid_t helper) {
  int status = 0;
  if (kill(helper, SIGKILL) != 0 || waitpid(helper, &status, __WALL) != helper) {
    std::fprintf(stderr, "[child] cannot kill and reap the helper %d: %s\n", helper, std::strerror(errno));
    return -1;
  }
  const int fd = open("/proc/sys/kernel/ns_last_pid", O_WRONLY | O_CLOEXEC);
  const std::string last = std::to_string(helper - 1);
  const bool set = fd >= 0 && write(fd, last.data(), last.size()) == static_cast<ssize_t>(last.size());
  if (!set) std::fprintf(stderr, "[child] cannot write ns_last_pid: %s\n", std::strerror(errno));
  if (fd >= 0) close(fd);
  if (!set) return -1;
  const pid_t other = fork();
  if (other == 0) {
    for (;;) pause();
  }
  if (other != helper) {
    std::fprintf(stderr, "[child] the new process got pid %d, not the helper's %d\n", other, helper);
    if (other > 0) kill(other, SIGKILL);
    return -1;
  }
  return other;
}

// Ends `other` with a SIGTERM of ours; true if that is what ended it (a SIGKILL sent before would
// have won: a process dies of the first fatal signal).
bool only_we_signalled(pid_t other) {
  kill(other, SIGTERM);
  int status = 0;
  while (waitpid(other, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) return true;
  std::fprintf(stderr, "[child] process %d, which took the helper's pid, was ended by signal %d\n", other,
               WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return false;
}

// pid 1 of the new namespace: disable, then enable, each after the helper's pid went to another
// process.
int reused_pid_scenario() {
  const pid_t helper = tp::enable_shadow_teardown();
  const pid_t other = reap_helper_and_reuse_its_pid(helper);
  CHILD_CHECK(other > 0);
  CHILD_CHECK(!tp::shadow_teardown_enabled());
  tp::disable_shadow_teardown();
  CHILD_CHECK(only_we_signalled(other));

  const pid_t second = tp::enable_shadow_teardown();
  const pid_t next_other = reap_helper_and_reuse_its_pid(second);
  CHILD_CHECK(next_other > 0);
  const pid_t third = tp::enable_shadow_teardown();  // retires the dead helper, starts a new one
  CHILD_CHECK(third > 0 && third != next_other);
  CHILD_CHECK(tp::shadow_pid() == third);
  CHILD_CHECK(only_we_signalled(next_other));
  tp::disable_shadow_teardown();
  CHILD_CHECK(!tp::shadow_teardown_enabled());
  return 0;
}

// A seccomp filter that takes pidfds away, as a kernel before 5.2 (or a strict sandbox) would:
// clone with CLONE_PIDFD fails with EINVAL, pidfd_open and pidfd_send_signal with ENOSYS.
bool refuse_pidfds() {
  constexpr unsigned clone_pidfd = 0x00001000;
  const sock_filter code[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_pidfd_open, 3, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_pidfd_send_signal, 2, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone, 2, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[0])),  // the flags' low half
      BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, clone_pidfd, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EINVAL),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  const sock_fprog program{static_cast<unsigned short>(std::size(code)), const_cast<sock_filter*>(code)};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) == 0;
}

void skip_or_expect_success(int code) {
  if (code == kSkipped) GTEST_SKIP() << "the environment refuses a new pid namespace (see stderr)";
  EXPECT_EQ(code, 0);
}

TEST(ProcessShadowPidReuseTest, DisableAndEnableNeverSignalAProcessThatTookTheReapedHelpersPid) {
  if (!tp::shadow_teardown_supported) GTEST_SKIP() << "shadow teardown is Linux on x86-64 only";
  skip_or_expect_success(run_in_new_pid_namespace(reused_pid_scenario));
}

// The same without pidfds: the library then goes by the shared word, which the kernel clears
// when the helper exits, before its pid can be reaped and reused.
TEST(ProcessShadowPidReuseTest, WithoutPidfdsDisableAndEnableStillSpareThatProcess) {
  if (!tp::shadow_teardown_supported) GTEST_SKIP() << "shadow teardown is Linux on x86-64 only";
  skip_or_expect_success(run_in_new_pid_namespace([] {
    CHILD_CHECK(refuse_pidfds());
    const std::size_t descriptors = open_descriptors();
    tp::enable_shadow_teardown();
    CHILD_CHECK(open_descriptors() == descriptors + 1);  // the pipe's write end, no pidfd
    tp::disable_shadow_teardown();
    return reused_pid_scenario();
  }));
}

// A thread that waits for every child with __WALL, as some supervisors do, races disable for the
// helper's exit status: whichever reaps it, disable returns, and enable works again.
TEST(ProcessShadowWallWaiterTest, DisableAndEnableWorkWhileAWallWaiterReapsTheHelper) {
  if (!tp::shadow_teardown_supported) GTEST_SKIP() << "shadow teardown is Linux on x86-64 only";
  const int code = run_child([] {
    const pid_t helper = tp::enable_shadow_teardown();
    pid_t reaped = 0;
    int error = 0;
    std::thread waiter([&] {
      int status = 0;
      while ((reaped = waitpid(-1, &status, __WALL)) < 0 && errno == EINTR) {
      }
      error = errno;
    });
    tp::disable_shadow_teardown();
    waiter.join();
    CHILD_CHECK(reaped == helper || (reaped == -1 && error == ECHILD));
    CHILD_CHECK(!tp::shadow_teardown_enabled());
    const pid_t again = tp::enable_shadow_teardown();
    CHILD_CHECK(again > 0 && tp::shadow_pid() == again);
    tp::disable_shadow_teardown();
    CHILD_CHECK(children_of(getpid()).empty());
    return 0;
  });
  EXPECT_EQ(code, 0);
}

#if !TEARDOWN_SHADOW_SUPPORTED
// Elsewhere than Linux on x86-64 (compiled only there, so that no build carries a test that can
// only skip): bad options are still std::invalid_argument, then ENOSYS.
TEST(ProcessShadowPlatformTest, UnsupportedPlatformsCheckTheOptionsThenThrowEnosys) {
  EXPECT_THROW(tp::enable_shadow_teardown({.stack_size = 0}), std::invalid_argument);
  try {
    tp::enable_shadow_teardown();
    ADD_FAILURE() << "enable_shadow_teardown did not throw";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().value(), ENOSYS);
  }
  EXPECT_FALSE(tp::shadow_teardown_enabled());
  EXPECT_EQ(tp::shadow_pid(), 0);
  tp::disable_shadow_teardown();
}
#endif

// The helper's code runs with the creating thread's thread pointer and outside any sanitizer's
// knowledge: it must call nothing but itself and touch no thread-local storage (%fs), in
// whatever build this is (sanitizer, optimization level, compiler). Checked on this binary's
// machine code.
TEST(ProcessShadowCodeTest, HelperCodeCallsNothingElseAndTouchesNoThreadLocalStorage) {
  if (!tp::shadow_teardown_supported) GTEST_SKIP() << "shadow teardown is Linux on x86-64 only";
  if (std::system("objdump --version > /dev/null 2>&1 && nm --version > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "objdump or nm (binutils) is not installed";
  }
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  // The helper's functions are teardown::process::detail::helper_*: mangled, the prefix, the
  // name's length, "helper_".
  const std::string prefix = "_ZN8teardown7process6detail";
  const auto helper_symbol_at = [&](const std::string& text, std::size_t at) {
    if (text.compare(at, prefix.size(), prefix) != 0) return false;
    const std::size_t name = text.find_first_not_of("0123456789", at + prefix.size());
    return name != at + prefix.size() && text.compare(name, 7, "helper_") == 0;
  };
  std::vector<std::string> symbols;
  {
    std::FILE* nm = popen(("nm --defined-only '" + exe + "'").c_str(), "r");
    ASSERT_NE(nm, nullptr);
    char line[1024];
    while (std::fgets(line, sizeof line, nm) != nullptr) {
      const std::string text(line);
      const std::size_t at = text.find(prefix);
      if (at == std::string::npos || !helper_symbol_at(text, at)) continue;
      symbols.push_back(text.substr(at, text.find_first_of(" \n", at) - at));
    }
    pclose(nm);
  }
  ASSERT_TRUE(std::any_of(symbols.begin(), symbols.end(),
                          [](const std::string& s) { return s.find("helper_main") != std::string::npos; }));
  for (const std::string& symbol : symbols) {
    const std::string command = "objdump -d --no-show-raw-insn --disassemble=" + symbol + " '" + exe + "'";
    std::FILE* objdump = popen(command.c_str(), "r");
    ASSERT_NE(objdump, nullptr);
    char line[1024];
    int instructions = 0;
    while (std::fgets(line, sizeof line, objdump) != nullptr) {
      const std::string text(line);
      const std::size_t tab = text.find(":\t");
      if (tab == std::string::npos) continue;
      ++instructions;
      EXPECT_EQ(text.find("%fs"), std::string::npos) << symbol << " touches thread-local storage: " << text;
      const std::size_t mnemonic = tab + 2;
      const bool branch = text.compare(mnemonic, 4, "call") == 0 || text.compare(mnemonic, 1, "j") == 0;
      if (!branch) continue;
      // helper_clone's one indirect call is the new process's entry (helper_main, or a detached
      // helper's intermediate), made on the new stack.
      if (symbol.find("helper_clone") == std::string::npos) {
        EXPECT_EQ(text.find('*', mnemonic), std::string::npos) << symbol << " branches indirectly: " << text;
      }
      // A direct branch's target is printed as <symbol> or <symbol+offset>.
      const std::size_t target = text.find('<', mnemonic);
      if (target != std::string::npos) {
        EXPECT_TRUE(helper_symbol_at(text, target + 1)) << symbol << " leaves the helper's code: " << text;
      }
    }
    pclose(objdump);
    EXPECT_GT(instructions, 0) << "no machine code found for " << symbol;
  }
}

// ---- cases with a program -----------------------------------------------------------------

class ProcessShadowProgramTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!tp::shadow_teardown_supported) GTEST_SKIP() << "shadow teardown is Linux on x86-64 only";
    descriptors_before_ = open_descriptors();
  }
  void TearDown() override {
    if (tp::shadow_teardown_supported) {
      EXPECT_EQ(open_descriptors(), descriptors_before_) << "a descriptor leaked";
    }
  }

  stray_killer strays_;

 private:
  std::size_t descriptors_before_ = 0;
};

TEST_F(ProcessShadowProgramTest, WaitpidReturnsWhileTheHelperStillHoldsTheProgramsMemory) {
  std::optional<program> p(std::in_place, enable_and_populate);
  ASSERT_STREQ(p->reported().failure, "");
  const pid_t helper = p->reported().helper;
  strays_.add(helper);
  // Freeze the helper: whatever happens next, it cannot tear anything down until we resume it.
  ASSERT_EQ(kill(helper, SIGSTOP), 0);
  ASSERT_TRUE(eventually([&] { return state_of(helper) == 'T'; }));

  const int status = p->kill_and_wait();
  // waitpid() has returned: the program is dead and reaped...
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  // ...while its memory is still mapped, by the (stopped) helper that now holds the only
  // reference: the teardown has not happened yet.
  EXPECT_EQ(state_of(helper), 'T');
  EXPECT_GE(status_number(helper, "VmRSS") * 1024, static_cast<long>(kPopulateBytes / 2));
  EXPECT_NE(status_number(helper, "PPid"), p->pid()) << "handed to a subreaper or init";
  errno = 0;
  EXPECT_EQ(waitpid(helper, nullptr, WNOHANG | __WALL), -1) << "the helper is not the waiter's child";
  EXPECT_EQ(errno, ECHILD);
  // The report pipe reaches EOF though the helper lives: it closed what it inherited.
  EXPECT_TRUE(p->report_pipe_reaches_eof());
  p.reset();

  // Resumed, it finds its program gone and exits by itself, freeing the memory.
  ASSERT_EQ(kill(helper, SIGCONT), 0);
  EXPECT_TRUE(eventually([&] { return ended(helper); })) << "the helper outlived its program";
}

TEST_F(ProcessShadowProgramTest, KilledProgramsHelperEndsByItselfAndLeavesNothing) {
  std::optional<program> p(std::in_place, enable_and_populate);
  ASSERT_STREQ(p->reported().failure, "");
  const pid_t helper = p->reported().helper;
  strays_.add(helper);
  EXPECT_EQ(comm_of(helper), "teardown-shadow");
  EXPECT_EQ(status_number(helper, "PPid"), p->pid());

  const int status = p->kill_and_wait();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  errno = 0;
  EXPECT_EQ(waitpid(helper, nullptr, WNOHANG | __WALL), -1);
  EXPECT_EQ(errno, ECHILD);
  EXPECT_TRUE(p->report_pipe_reaches_eof());
  EXPECT_TRUE(eventually([&] { return ended(helper); })) << "the helper outlived its program";
  p.reset();
}

TEST_F(ProcessShadowProgramTest, HelperEndsWhenItsProgramExitsNormally) {
  program p(enable_and_populate);
  ASSERT_STREQ(p.reported().failure, "");
  const pid_t helper = p.reported().helper;
  strays_.add(helper);
  const int status = p.exit_and_wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_TRUE(eventually([&] { return ended(helper); })) << "the helper outlived its program";
}

TEST_F(ProcessShadowProgramTest, HelperEndsOnItsProgramsDeathEvenWhenItsPipeLeaked) {
  // The program leaks everything, the pipe's write end included, into a grandchild made with a
  // raw fork (no pthread_atfork handlers run), which outlives it: only the parent-death signal
  // can end the helper.
  program p([](report& r) {
    r.helper = tp::enable_shadow_teardown();
    const long grandchild = syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);  // a fork, as a raw system call
    if (grandchild == 0) {
      for (;;) syscall(SYS_ppoll, nullptr, 0, nullptr, nullptr, 0);
    }
    if (grandchild < 0) fail_report(r, "fork failed");
    r.other = static_cast<pid_t>(grandchild);
  });
  ASSERT_STREQ(p.reported().failure, "");
  const pid_t helper = p.reported().helper;
  const pid_t grandchild = p.reported().other;
  strays_.add(helper);
  strays_.add(grandchild);
  p.kill_and_wait();
  EXPECT_TRUE(eventually([&] { return ended(helper); })) << "the helper outlived its program";
  EXPECT_FALSE(ended(grandchild)) << "the pipe's write end was still open";
}

TEST_F(ProcessShadowProgramTest, HelperOutlivesTheThreadThatCreatedIt) {
  // PR_SET_PDEATHSIG fires when the creating thread exits; the helper must see that its process
  // lives on and stay.
  program p([](report& r) {
    pid_t creator = 0;
    std::thread thread([&] {
      r.helper = tp::enable_shadow_teardown();
      creator = static_cast<pid_t>(syscall(SYS_gettid));
    });
    thread.join();
    // Once the thread is released, its exit has sent the signal.
    const std::string task = "/proc/self/task/" + std::to_string(creator);
    if (!eventually([&] { return !std::filesystem::exists(task); })) fail_report(r, "the thread never went away");
  });
  ASSERT_STREQ(p.reported().failure, "");
  const pid_t helper = p.reported().helper;
  strays_.add(helper);
  // The helper consumes the signal and goes back to its wait.
  ASSERT_TRUE(eventually([&] {
    return ended(helper) || (!signal_pending(helper, SIGHUP) && blocked_in_ppoll(helper));
  }));
  EXPECT_FALSE(ended(helper)) << "the helper died with the thread, not the process";
  EXPECT_EQ(status_number(helper, "PPid"), p.pid());

  p.kill_and_wait();
  EXPECT_TRUE(eventually([&] { return ended(helper); })) << "the helper outlived its program";
}

// The helper's first wait is on the enabling thread's tid word, whose futex the kernel wakes
// once, for one waiter: a pthread_join() that queued first takes that wake. The helper must still
// go on (it looks at the word again), or it would never learn of its program's exit.
TEST_F(ProcessShadowProgramTest, HelperOfAThreadThatWasJoinedStillEndsWithItsProgram) {
  program p([](report& r) {
    std::thread thread([&] {
      r.helper = tp::enable_shadow_teardown();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the joiner waits first
    });
    thread.join();
  });
  ASSERT_STREQ(p.reported().failure, "");
  const pid_t helper = p.reported().helper;
  strays_.add(helper);
  ASSERT_TRUE(eventually([&] { return ended(helper) || blocked_in_ppoll(helper); }, std::chrono::seconds(10)))
      << "the helper still waits for a thread that is gone";
  EXPECT_FALSE(ended(helper));
  p.kill_and_wait();
  EXPECT_TRUE(eventually([&] { return ended(helper); })) << "the helper outlived its program";
}

TEST_F(ProcessShadowProgramTest, ExecEndsTheHelperWhichFreesTheOldImage) {
  // exec replaces the program's mm, not the helper's: a helper that stayed would keep the whole
  // old image alive for as long as the program runs. The exec closes the helper's pipe instead.
  program p(enable_and_populate, [] {
    setenv(kParkVariable, "1", 1);
    char name[] = "teardown-parked";
    char* const argv[] = {name, nullptr};
    execv("/proc/self/exe", argv);
  });
  ASSERT_STREQ(p.reported().failure, "");
  const pid_t helper = p.reported().helper;
  strays_.add(helper);
  EXPECT_TRUE(eventually([&] { return ended(helper); })) << "the helper kept the old image";
  EXPECT_FALSE(ended(p.pid())) << "the program itself must live on";
  EXPECT_TRUE(eventually([&] { return proc(p.pid(), "cmdline").rfind("teardown-parked", 0) == 0; }));
  // The new image knows nothing of it: it stays that image's zombie, its memory freed.
  EXPECT_EQ(state_of(helper), 'Z');
  EXPECT_EQ(status_number(helper, "PPid"), p.pid());
  p.kill_and_wait();
}

}  // namespace
}  // namespace teardown_test
