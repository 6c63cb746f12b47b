// Real memory stall drives the policy. Four child processes in a memory cgroup of their own,
// limited to 32 MiB, read a 48 MiB file over and over: every pass charges the file's page cache
// to the cgroup, which is over its limit, so each read reclaims (direct reclaim in the charge,
// a memory stall for PSI) and refaults what it just evicted. On this machine's kernel that keeps
// "some" memory stall around a third of the time, far over the trigger's 150 ms in 2 s. The
// test registers a real PSI trigger (pressure_monitor's automatic source), freezes an
// async_teardown over a backlog, and checks that while the children still run a trigger fired
// and the default policy thawed the worker and the backlog was given back.
//
// The cgroup is a child of this process's own memory cgroup (v1: the hierarchy this machine's
// memory controller lives on). Where it cannot be made or limited, or no PSI trigger can be
// registered, the test says why and is skipped. Everything it creates — the children (killed,
// and killed with this process too: PR_SET_PDEATHSIG), the cgroup (removed), the file and its
// directory — goes at the end, on failure as well. At most 48 MiB on disk and 32 MiB of cache.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "teardown/async_teardown.hpp"
#include "teardown/memory_limit.hpp"
#include "teardown/pressure_policy.hpp"
#include "test_support.hpp"

namespace teardown_test {
namespace {

using namespace std::chrono_literals;

constexpr std::uint64_t cgroup_limit = std::uint64_t{32} << 20;
constexpr std::uint64_t file_size = std::uint64_t{48} << 20;
constexpr int readers = 4;

// This process's memory cgroup directory on a v1 hierarchy, or "" (memory_limit.hpp finds it).
std::string own_v1_memory_cgroup() {
  std::string found;
  teardown::detail::memory_limit_impl::for_each_memory_cgroup(
      teardown::memory_limit_sources{},
      [&](char* dir, std::size_t length, std::size_t, teardown::detail::memory_limit_impl::version which) noexcept {
        if (which == teardown::detail::memory_limit_impl::version::v1) found.assign(dir, length);
      });
  return found;
}

bool write_file(const std::string& path, const std::string& text, std::string& why) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    why = path + ": open: " + std::strerror(errno);
    return false;
  }
  const ssize_t written = ::write(fd, text.data(), text.size());
  const int error = errno;
  ::close(fd);
  if (written != static_cast<ssize_t>(text.size())) {
    why = path + ": write \"" + text + "\": " + std::strerror(error);
    return false;
  }
  return true;
}

// Everything the test makes, undone in reverse whatever happens.
struct stall_rig {
  std::string cgroup;                 // made by us; removed
  std::filesystem::path directory;    // made by us; removed with the file
  std::vector<pid_t> children;        // killed and reaped

  ~stall_rig() {
    for (const pid_t child : children) ::kill(child, SIGKILL);
    for (const pid_t child : children) {
      while (::waitpid(child, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
    if (!cgroup.empty()) {
      // The last reaped child's cgroup membership may take a moment to go.
      for (int attempt = 0; attempt < 100 && ::rmdir(cgroup.c_str()) != 0 && errno == EBUSY; ++attempt) {
        std::this_thread::sleep_for(10ms);
      }
      if (::access(cgroup.c_str(), F_OK) == 0) std::fprintf(stderr, "could not remove %s\n", cgroup.c_str());
    }
    if (!directory.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(directory, ignored);
    }
  }

  // A reader: joins the cgroup, then reads the file until killed. Async-signal-safe calls only
  // (this process has threads), and it dies with its parent.
  bool start_reader(const std::string& file, std::string& why) {
    const std::string procs = cgroup + "/cgroup.procs";
    const pid_t child = ::fork();
    if (child < 0) {
      why = std::string("fork: ") + std::strerror(errno);
      return false;
    }
    if (child == 0) {
      (void)::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() == 1) ::_exit(3);
      const int procs_fd = ::open(procs.c_str(), O_WRONLY | O_CLOEXEC);
      if (procs_fd < 0 || ::write(procs_fd, "0", 1) != 1) ::_exit(4);  // "0": the writer itself
      ::close(procs_fd);
      static char buffer[1 << 16];
      ::alarm(120);  // a last bound, should the parent forget it
      for (;;) {
        const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) ::_exit(5);
        while (::read(fd, buffer, sizeof buffer) > 0) {
        }
        ::close(fd);
      }
    }
    children.push_back(child);
    return true;
  }

  bool all_running() {
    for (const pid_t child : children) {
      int status = 0;
      if (::waitpid(child, &status, WNOHANG) != 0) return false;
    }
    return true;
  }
};

// /proc/pressure/memory's "some ... total=": the system's memory stall so far, in µs (0 if
// unreadable; printed only).
std::uint64_t some_total_us() {
  std::FILE* f = std::fopen("/proc/pressure/memory", "re");
  if (f == nullptr) return 0;
  unsigned long long total = 0;
  if (std::fscanf(f, "some avg10=%*f avg60=%*f avg300=%*f total=%llu", &total) != 1) total = 0;
  std::fclose(f);
  return total;
}

struct item {
  teardown::llist_node hook;
  std::uint64_t charge = 0;
};

struct item_traits {
  std::atomic<int>* destroyed;
  static std::uint64_t cost(const item&) { return std::uint64_t{1} << 20; }
  static bool eligible(const item&, std::uint64_t) { return true; }
  static void prepare(item&) {}
  void destroy(item&) { destroyed->fetch_add(1); }
  static std::uint64_t& charge(item& i) { return i.charge; }
};

TEST(PressureIntegrationTest, RealMemoryStallFiresATriggerAndTheBacklogIsGivenBackWhileItLasts) {
  stall_rig rig;
  const std::string parent = own_v1_memory_cgroup();
  if (parent.empty()) GTEST_SKIP() << "no cgroup v1 memory controller for this process (/proc/self/cgroup)";
  const std::string cgroup = parent + "/teardown_pressure_" + std::to_string(::getpid());
  if (::mkdir(cgroup.c_str(), 0755) != 0) {
    GTEST_SKIP() << "cannot create a memory cgroup: mkdir " << cgroup << ": " << std::strerror(errno);
  }
  rig.cgroup = cgroup;
  std::string why;
  if (!write_file(cgroup + "/memory.limit_in_bytes", std::to_string(cgroup_limit), why)) {
    GTEST_SKIP() << "cannot limit the memory cgroup: " << why;
  }

  // The file, written by this process and then dropped from the page cache, so that the
  // children's reads charge it to their cgroup.
  rig.directory = std::filesystem::temp_directory_path() / ("teardown_pressure." + std::to_string(::getpid()));
  std::filesystem::create_directories(rig.directory);
  const std::string file = (rig.directory / "data").string();
  {
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    std::vector<char> block(1 << 20, 'x');
    for (std::uint64_t done = 0; done < file_size; done += block.size()) {
      ASSERT_EQ(::write(fd, block.data(), block.size()), static_cast<ssize_t>(block.size()));
    }
    ASSERT_EQ(::fsync(fd), 0);
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }

  teardown::pressure_monitor monitor;  // automatic: the cgroup v2 file, /proc/pressure/memory...
  std::printf("monitor: %s\n", monitor.description().c_str());
  if (monitor.source() == teardown::pressure_source::sampled) {
    GTEST_SKIP() << "no PSI trigger could be registered: " << monitor.description();
  }

  // A backlog behind a frozen worker: 16 items of 1 MiB.
  std::atomic<int> destroyed{0};
  teardown::async_teardown_options opts;
  opts.sync_when_stalled = false;
  opts.reaper.name = "pressure_itest";
  teardown::async_teardown<item, &item::hook, item_traits> async(opts, item_traits{&destroyed});
  async.freeze();
  std::vector<item> items(16);
  for (item& i : items) ASSERT_EQ(async.put(i), teardown::decision::queued);
  ASSERT_EQ(async.stats().pending, std::uint64_t{16} << 20);

  teardown::pressure_policy policy(monitor, async);  // the defaults

  const std::uint64_t stall_before = some_total_us();
  for (int i = 0; i < readers; ++i) ASSERT_TRUE(rig.start_reader(file, why)) << why;

  // Liveness bound only: the trigger's 2 s window fires within a few windows of stall. The
  // thawed worker may empty the queue while the policy's callback is still running; its
  // counters are final once it has counted the event (stats() reads that count first).
  const bool given_back =
      eventually([&] { return async.stats().pending == 0 && policy.stats().events >= 1; }, 60s);
  const bool stall_lasted = rig.all_running();
  const teardown::pressure_monitor_stats seen = monitor.stats();
  const teardown::pressure_policy_stats acted = policy.stats();
  std::printf("system 'some' memory stall meanwhile: %llu us\n",
              static_cast<unsigned long long>(some_total_us() - stall_before));
  std::printf("events %llu, thawed %llu, drained %llu items, cap lowered %llu, nice raised %llu/refused %llu\n",
              static_cast<unsigned long long>(seen.events), static_cast<unsigned long long>(acted.thawed),
              static_cast<unsigned long long>(acted.drained_items), static_cast<unsigned long long>(acted.caps_lowered),
              static_cast<unsigned long long>(acted.nice_raised), static_cast<unsigned long long>(acted.nice_refused));
  EXPECT_TRUE(given_back) << "the backlog was still queued after 60 s of stall; trigger events: " << seen.events;
  EXPECT_TRUE(stall_lasted) << "a reader exited before the backlog was given back";
  EXPECT_GE(seen.events, 1u);
  EXPECT_GE(acted.events, 1u);
  EXPECT_EQ(acted.thawed, 1u);
  EXPECT_EQ(destroyed.load(), 16);
  if (acted.active) {
    EXPECT_EQ(async.max_pending(), 0u);  // the cap, while pressure lasts
  }
}

}  // namespace
}  // namespace teardown_test
