// Specification of pressure_monitor's stop_for (pressure.hpp) and of its use of the shared
// thread layer (worker_thread.hpp): the monitor thread's name and nice, the refusal of its own
// calls from a callback. The monitor's events and relief are pressure_test.cpp's.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>

#include "teardown/pressure.hpp"
#include "test_support.hpp"

namespace {

using namespace std::chrono_literals;
using teardown::pressure_monitor;
using teardown::pressure_monitor_options;
using teardown::pressure_source;

class event_source {
 public:
  event_source() : fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    if (fd_ < 0) throw std::runtime_error("eventfd failed");
  }
  ~event_source() { ::close(fd_); }
  event_source(const event_source&) = delete;
  event_source& operator=(const event_source&) = delete;

  pressure_monitor_options options(const std::string& name = "pm_unit_test") const {
    pressure_monitor_options opts;
    opts.source = pressure_source::injected;
    opts.event_fd = fd_;
    opts.window = std::chrono::hours(1);
    opts.name = name;
    return opts;
  }
  void signal() const {
    const std::uint64_t one = 1;
    ASSERT_EQ(::write(fd_, &one, sizeof one), static_cast<ssize_t>(sizeof one));
  }

 private:
  int fd_;
};

// Blocks in on_pressure while `hold`; may run a call of the monitor's from there.
class holding_listener final : public teardown::pressure_listener {
 public:
  void on_pressure(bool, std::uint64_t) override {
    if (from_callback) from_callback();
    entered.store(true);
    while (hold.load()) std::this_thread::sleep_for(1ms);
  }
  void on_relief() override {}

  std::atomic<bool> hold{false};
  std::atomic<bool> entered{false};
  std::function<void()> from_callback;
};

TEST(PressureMonitorStopTest, StopForWithAnIdleThreadStopsAndIsIdempotent) {
  event_source source;
  pressure_monitor monitor(source.options());
  EXPECT_TRUE(monitor.stop_for(30s));
  EXPECT_TRUE(monitor.stop_for(0s)) << "already stopped";
  monitor.stop();  // and stop after it is a no-op
}

TEST(PressureMonitorStopTest, StopForGivesUpWhileACallbackBlocksAndALaterStopJoins) {
  event_source source;
  pressure_monitor monitor(source.options());
  holding_listener listener;
  listener.hold = true;
  monitor.subscribe(listener);
  source.signal();
  ASSERT_TRUE(teardown_test::eventually([&] { return listener.entered.load(); }));
  EXPECT_FALSE(monitor.stop_for(20ms)) << "the callback holds the thread";
  listener.hold = false;
  EXPECT_TRUE(monitor.stop_for(30s));
  EXPECT_EQ(monitor.stats().events, 1u);
}

TEST(PressureMonitorStopTest, StopForFromACallbackIsRefused) {
  event_source source;
  pressure_monitor monitor(source.options());
  holding_listener listener;
  std::atomic<bool> refused{false};
  listener.from_callback = [&] {
    try {
      (void)monitor.stop_for(1s);
    } catch (const std::logic_error& error) {
      refused = std::string(error.what()).find("stop_for") != std::string::npos;
    }
  };
  monitor.subscribe(listener);
  source.signal();
  ASSERT_TRUE(teardown_test::eventually([&] { return listener.entered.load(); }));
  EXPECT_TRUE(refused.load());
  EXPECT_TRUE(monitor.stop_for(30s));
}

// The monitor thread, found by its name among this process's threads.
std::string nice_of_thread_named(const std::string& name) {
  DIR* tasks = ::opendir("/proc/self/task");
  if (tasks == nullptr) return "";
  std::string found;
  while (const dirent* entry = ::readdir(tasks)) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    const std::string dir = std::string("/proc/self/task/") + entry->d_name;
    std::ifstream comm(dir + "/comm");
    std::string comm_name;
    std::getline(comm, comm_name);
    if (comm_name != name) continue;
    std::ifstream stat(dir + "/stat");
    std::string line;
    std::getline(stat, line);
    // Field 19 is nice; the fields after the ")" that closes comm start at field 3.
    std::size_t at = line.rfind(')') + 2;
    for (int field = 3; field < 19; ++field) at = line.find(' ', at) + 1;
    found = line.substr(at, line.find(' ', at) - at);
  }
  ::closedir(tasks);
  return found;
}

TEST(PressureMonitorStopTest, TheThreadIsNamedAndRunsAtNiceZero) {
  event_source source;
  pressure_monitor monitor(source.options("pm-a-long-thread-name"));
  std::string nice;
  ASSERT_TRUE(teardown_test::eventually([&] {
    nice = nice_of_thread_named("pm-a-long-threa");  // Linux keeps 15 bytes
    return !nice.empty();
  }));
  if (monitor.stats().nice_refused) GTEST_SKIP() << "this process may not run a thread at nice 0";
  EXPECT_EQ(nice, "0");
  EXPECT_TRUE(monitor.stop_for(30s));
}

}  // namespace
