// Specification of teardown::pressure_monitor (the policy's: tests/unit/pressure_policy_test.cpp),
// driven from an injected event source: eventfds the test writes to stand in for the PSI trigger fd (events)
// and for relief, so the monitor's real poll loop runs and nothing waits on the kernel. The
// windows are an hour long unless a test is about the quiet-window relief itself, so that relief
// comes only when the test sends it. Nothing asserts a time: waits are bounded (eventually()).
#include "teardown/pressure.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "pressure_test_support.hpp"
#include "test_support.hpp"

namespace teardown_test {
namespace {

using namespace std::chrono_literals;
using teardown::pressure_monitor;
using teardown::pressure_monitor_options;
using teardown::pressure_source;

// Counts its callbacks; optionally blocks inside on_pressure until released.
class counting_listener final : public teardown::pressure_listener {
 public:
  void on_pressure(bool first, std::uint64_t events) override {
    entered.store(true);
    while (hold.load()) std::this_thread::sleep_for(1ms);
    if (first) firsts.fetch_add(1);
    last_events.store(events);
    pressures.fetch_add(1);
  }
  void on_relief() override { reliefs.fetch_add(1); }

  std::atomic<bool> hold{false};
  std::atomic<bool> entered{false};
  std::atomic<int> pressures{0};
  std::atomic<int> firsts{0};
  std::atomic<int> reliefs{0};
  std::atomic<std::uint64_t> last_events{0};
};

// ---- the monitor ------------------------------------------------------------------------------

TEST(PressureMonitorTest, TriggerLineIsStallAndWindowInMicroseconds) {
  EXPECT_EQ(pressure_monitor::trigger_line(teardown::psi_line::some, 150ms, 2s), "some 150000 2000000");
  EXPECT_EQ(pressure_monitor::trigger_line(teardown::psi_line::full, 1s, 10s), "full 1000000 10000000");
}

TEST(PressureMonitorTest, BadOptionsAreRefusedNamingTheField) {
  injected_source source;
  const auto refused = [](pressure_monitor_options opts, const std::string& field) {
    try {
      pressure_monitor monitor(std::move(opts));
      ADD_FAILURE() << "accepted bad " << field;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("teardown::pressure_monitor"), std::string::npos) << e.what();
    }
  };
  pressure_monitor_options psi;  // automatic: the PSI rules apply
  psi.window = 400ms;
  refused(psi, "window");
  psi.window = 11s;
  refused(psi, "window");
  psi.window = 2s;
  psi.stall = 3s;
  refused(psi, "stall");
  psi.stall = 0us;
  refused(psi, "stall");
  psi.stall = 150ms;
  psi.relief_windows = 0;
  refused(psi, "relief_windows");
  psi.relief_windows = 2;
  psi.sample_interval = 0ms;
  refused(psi, "sample_interval");
  psi.sample_interval = 500ms;
  psi.sample_percent = 100;
  refused(psi, "sample_percent");
  psi.sample_percent = 0;
  refused(psi, "sample_percent");
  psi.sample_percent = 90;
  psi.event_fd = 0;
  refused(psi, "event_fd");
  psi.event_fd = -1;
  psi.name = std::string("a\0b", 3);
  refused(psi, "name");
  pressure_monitor_options injected = source.options();
  injected.event_fd = -1;
  refused(injected, "event_fd");
  injected = source.options();
  injected.window = 0us;
  refused(injected, "window");
}

TEST(PressureMonitorTest, AutomaticResolvesToASourceAndSaysWhich) {
  pressure_monitor monitor;
  EXPECT_NE(monitor.source(), pressure_source::automatic);
  EXPECT_FALSE(monitor.description().empty());
  std::printf("automatic source here: %s, %s\n", teardown::to_string(monitor.source()),
              monitor.description().c_str());
  if (monitor.source() != pressure_source::sampled) {
    // The unprivileged rule: a PSI window in force is a multiple of 2 s.
    EXPECT_EQ(monitor.window().count() % 2'000'000, 0);
  }
}

TEST(PressureMonitorTest, AWindowTheKernelRefusesIsRoundedUpToTwoSecondsOrSampled) {
  pressure_monitor_options opts;
  opts.window = 1s;  // refused unprivileged (EINVAL); accepted with CAP_SYS_RESOURCE
  pressure_monitor monitor(opts);
  std::printf("window 1 s: %s\n", monitor.description().c_str());
  if (monitor.source() == pressure_source::sampled) {
    EXPECT_NE(monitor.description().find("PSI triggers not used"), std::string::npos);
  } else {
    EXPECT_TRUE(monitor.window() == 1s || monitor.window() == 2s) << monitor.window().count();
  }
}

TEST(PressureMonitorTest, AnEventBeginsAnEpisodeAndEachLaterOneIsCounted) {
  injected_source source;
  pressure_monitor monitor(source.options());
  counting_listener listener;
  monitor.subscribe(listener);
  EXPECT_FALSE(monitor.under_pressure());
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return listener.pressures.load() == 1; }));
  EXPECT_TRUE(monitor.under_pressure());
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return listener.pressures.load() == 2; }));
  EXPECT_EQ(listener.firsts.load(), 1);
  EXPECT_EQ(listener.last_events.load(), 2u);
  const teardown::pressure_monitor_stats s = monitor.stats();
  EXPECT_EQ(s.events, 2u);
  EXPECT_EQ(s.episodes, 1u);
  EXPECT_EQ(s.reliefs, 0u);
  EXPECT_FALSE(s.nice_refused);
  monitor.unsubscribe(listener);
}

TEST(PressureMonitorTest, InjectedReliefEndsTheEpisodeAndTheNextEventBeginsAnother) {
  injected_source source;
  pressure_monitor monitor(source.options());
  counting_listener listener;
  monitor.subscribe(listener);
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return listener.pressures.load() == 1; }));
  source.signal_relief();
  ASSERT_TRUE(eventually([&] { return listener.reliefs.load() == 1; }));
  EXPECT_FALSE(monitor.under_pressure());
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return listener.pressures.load() == 2; }));
  EXPECT_EQ(listener.firsts.load(), 2);
  EXPECT_EQ(monitor.stats().episodes, 2u);
  EXPECT_EQ(monitor.stats().reliefs, 1u);
  monitor.unsubscribe(listener);
}

TEST(PressureMonitorTest, QuietWindowsBringReliefWithoutBeingTold) {
  injected_source source;
  pressure_monitor_options opts = source.options(20ms);
  opts.relief_fd = -1;
  opts.relief_windows = 3;
  pressure_monitor monitor(opts);
  counting_listener listener;
  monitor.subscribe(listener);
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return listener.reliefs.load() == 1; }, 30s));
  EXPECT_EQ(listener.pressures.load(), 1);
  EXPECT_FALSE(monitor.under_pressure());
  monitor.unsubscribe(listener);
}

TEST(PressureMonitorTest, NoCallbackRunsOnceUnsubscribeReturns) {
  injected_source source;
  pressure_monitor monitor(source.options());
  counting_listener blocked, witness;
  monitor.subscribe(blocked);
  monitor.subscribe(witness);
  blocked.hold.store(true);
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return blocked.entered.load(); }));
  std::atomic<bool> returned{false};
  std::thread unsubscriber([&] {
    EXPECT_TRUE(monitor.unsubscribe(blocked));
    returned.store(true);
  });
  std::this_thread::sleep_for(50ms);  // a chance for a wrong unsubscribe to return early
  EXPECT_FALSE(returned.load()) << "unsubscribe returned while the listener's callback still ran";
  blocked.hold.store(false);
  unsubscriber.join();
  EXPECT_EQ(blocked.pressures.load(), 1);  // the callback in progress finished before it returned
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return witness.pressures.load() == 2; }));
  EXPECT_EQ(blocked.pressures.load(), 1);
  EXPECT_FALSE(monitor.unsubscribe(blocked));
  monitor.unsubscribe(witness);
}

TEST(PressureMonitorTest, SubscribingTwiceIsRefused) {
  injected_source source;
  pressure_monitor monitor(source.options());
  counting_listener listener;
  monitor.subscribe(listener);
  EXPECT_THROW(monitor.subscribe(listener), std::invalid_argument);
  EXPECT_TRUE(monitor.unsubscribe(listener));
  EXPECT_FALSE(monitor.unsubscribe(listener));
}

// A callback that unsubscribes itself, or stops the monitor, would wait for itself: refused.
class self_unsubscriber final : public teardown::pressure_listener {
 public:
  explicit self_unsubscriber(pressure_monitor& m) : monitor(m) {}
  void on_pressure(bool, std::uint64_t) override {
    try {
      monitor.unsubscribe(*this);
    } catch (const std::logic_error&) {
      refused_unsubscribe.store(true);
    }
    try {
      monitor.stop();
    } catch (const std::logic_error&) {
      refused_stop.store(true);
    }
    done.store(true);
  }
  void on_relief() override {}
  pressure_monitor& monitor;
  std::atomic<bool> refused_unsubscribe{false}, refused_stop{false}, done{false};
};

TEST(PressureMonitorTest, UnsubscribeOrStopFromACallbackIsRefused) {
  injected_source source;
  pressure_monitor monitor(source.options());
  self_unsubscriber listener(monitor);
  monitor.subscribe(listener);
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return listener.done.load(); }));
  EXPECT_TRUE(listener.refused_unsubscribe.load());
  EXPECT_TRUE(listener.refused_stop.load());
  EXPECT_TRUE(monitor.unsubscribe(listener));
}

TEST(PressureMonitorTest, StopIsIdempotentAndLeavesTheCallersFdOpen) {
  injected_source source;
  auto opts = source.options();
  const int fd = opts.event_fd;
  {
    pressure_monitor monitor(opts);
    monitor.stop();
    monitor.stop();
  }
  EXPECT_NE(fcntl(fd, F_GETFD), -1);
}

// The child shares the parent's stop eventfd: stopping its copy must not stop the parent's thread.
TEST(PressureMonitorTest, AForkChildStoppingItsCopyLeavesTheParentsMonitorRunning) {
  injected_source source;
  pressure_monitor monitor(source.options());
  counting_listener listener;
  monitor.subscribe(listener);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    alarm(30);  // a hang shows as SIGALRM, not as a stuck test
    monitor.stop();
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  source.signal_event();
  EXPECT_TRUE(eventually([&] { return listener.pressures.load() == 1; }, 30s)) << "the parent's monitor stopped";
  monitor.unsubscribe(listener);
}

// The fallback: a fake /proc/meminfo with little available memory makes every sample an event.
TEST(PressureMonitorTest, TheSamplerCountsALowMemAvailableAsAnEvent) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("pressure_test." + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string meminfo = (dir / "meminfo").string();
  {
    std::ofstream out(meminfo);
    out << "MemTotal:       1000000 kB\nMemFree:          10000 kB\nMemAvailable:     50000 kB\n";
  }
  {
    pressure_monitor_options opts;
    opts.source = pressure_source::sampled;
    opts.sample_interval = 10ms;
    opts.meminfo = meminfo.c_str();
    opts.files.cgroup = "/nonexistent";  // no cgroup levels: meminfo alone
    pressure_monitor monitor(opts);
    EXPECT_EQ(monitor.source(), pressure_source::sampled);
    counting_listener listener;
    monitor.subscribe(listener);
    ASSERT_TRUE(eventually([&] { return listener.pressures.load() >= 2; }));
    {
      std::ofstream out(meminfo);  // plenty available again
      out << "MemTotal:       1000000 kB\nMemFree:         900000 kB\nMemAvailable:    900000 kB\n";
    }
    ASSERT_TRUE(eventually([&] { return listener.reliefs.load() == 1; }));
    EXPECT_GE(monitor.stats().samples, 2u);
    monitor.unsubscribe(listener);
  }
  std::filesystem::remove_all(dir);
}

// A null path is refused up front: the sampler would read through it on the monitor thread.
TEST(PressureMonitorTest, NullPathOptionsAreRefusedNamingTheField) {
  const auto refused = [](pressure_monitor_options opts, const std::string& field) {
    try {
      pressure_monitor monitor(std::move(opts));
      ADD_FAILURE() << "accepted a null " << field;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "a null " << field << " threw something other than std::invalid_argument: " << e.what();
    }
  };
  pressure_monitor_options opts;
  opts.proc_pressure = nullptr;
  refused(opts, "proc_pressure");
  opts = {};
  opts.files.cgroup = nullptr;
  refused(opts, "files.cgroup");
  opts = {};
  opts.files.mountinfo = nullptr;
  refused(opts, "files.mountinfo");
  opts = {};
  opts.files.root = nullptr;
  refused(opts, "files.root");
  opts = {};
  opts.source = pressure_source::sampled;
  opts.meminfo = nullptr;
  refused(opts, "meminfo");
}

// relief_windows x window far beyond what the clock holds: relief never comes from the quiet
// windows (it would come at once if the deadline wrapped), only when sent.
TEST(PressureMonitorTest, QuietTimeBeyondTheClockNeverBringsReliefByItself) {
  struct shape {
    std::chrono::microseconds window;
    std::uint32_t relief_windows;
  };
  for (const shape s : {shape{std::chrono::hours(1), 10'000'000}, shape{10s, 1'000'000'000},
                        shape{std::chrono::microseconds::max(), 1}, shape{std::chrono::hours(1), UINT32_MAX}}) {
    SCOPED_TRACE(std::to_string(s.window.count()) + " us x " + std::to_string(s.relief_windows));
    injected_source source;
    pressure_monitor_options opts = source.options(s.window);
    opts.relief_windows = s.relief_windows;
    pressure_monitor monitor(opts);
    counting_listener listener;
    monitor.subscribe(listener);
    source.signal_event();
    ASSERT_TRUE(eventually([&] { return listener.pressures.load() == 1; }));
    source.signal_event();
    ASSERT_TRUE(eventually([&] { return listener.pressures.load() == 2; }));
    EXPECT_EQ(listener.reliefs.load(), 0);
    EXPECT_EQ(listener.firsts.load(), 1) << "relief came between the two events";
    EXPECT_TRUE(monitor.under_pressure());
    source.signal_relief();
    ASSERT_TRUE(eventually([&] { return listener.reliefs.load() == 1; }));
    monitor.unsubscribe(listener);
  }
}

// A pipe written and then closed polls POLLIN | POLLHUP at once: the data is an event, and the
// hang-up ends the watching without turning the injected monitor into a sampler.
TEST(PressureMonitorTest, AnInjectedPipeWrittenThenClosedDeliversItsEventAndStaysInjected) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("pressure_test.pipe." + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string meminfo = (dir / "meminfo").string();
  {
    std::ofstream out(meminfo);  // a sample of this would be an event
    out << "MemTotal:       1000000 kB\nMemFree:          10000 kB\nMemAvailable:     10000 kB\n";
  }
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_CLOEXEC | O_NONBLOCK), 0);
  const std::uint64_t one = 1;
  ASSERT_EQ(::write(fds[1], &one, sizeof one), static_cast<ssize_t>(sizeof one));
  ::close(fds[1]);
  {
    injected_source relief;
    pressure_monitor_options opts = relief.options();
    opts.event_fd = fds[0];
    opts.sample_interval = 1ms;
    opts.meminfo = meminfo.c_str();
    opts.files.cgroup = "/nonexistent";
    pressure_monitor monitor(opts);
    counting_listener listener;
    monitor.subscribe(listener);
    ASSERT_TRUE(eventually([&] { return monitor.stats().lost == 1; }));
    relief.signal_relief();
    ASSERT_TRUE(eventually([&] { return listener.reliefs.load() == 1; }));
    // The monitor's counts, not the listener's: the event may come before subscribe().
    EXPECT_EQ(monitor.stats().events, 1u) << "the written event was lost, or a sample made more";
    EXPECT_EQ(monitor.stats().samples, 0u) << "an injected monitor sampled the meminfo";
    EXPECT_EQ(monitor.source(), pressure_source::injected);
    monitor.unsubscribe(listener);
  }
  ::close(fds[0]);
  std::filesystem::remove_all(dir);
}

// automatic, when the cgroup's memory.pressure cannot take a trigger (here a regular file, as for a
// user the cgroup's file is EACCES) and the machine's can: the description says why the cgroup's
// was not used, as it does when the monitor samples.
TEST(PressureMonitorTest, AutomaticSaysWhyTheCgroupsFileWasNotUsed) {
  const std::filesystem::path root =
      std::filesystem::temp_directory_path() / ("pressure_test.cgroup." + std::to_string(getpid()));
  const auto write = [&](const std::string& path, const std::string& content) {
    std::filesystem::create_directories((root / path).parent_path());
    std::ofstream(root / path) << content;
  };
  write("proc/self/cgroup", "0::/app.slice\n");
  write("proc/self/mountinfo", "26 22 0:23 / /sys/fs/cgroup rw,relatime shared:9 - cgroup2 cgroup2 rw\n");
  write("sys/fs/cgroup/app.slice/memory.pressure", "");
  const std::string cgroup = (root / "proc/self/cgroup").string();
  const std::string mountinfo = (root / "proc/self/mountinfo").string();
  const std::string prefix = root.string();
  {
    pressure_monitor_options opts;
    opts.files = {.cgroup = cgroup.c_str(), .mountinfo = mountinfo.c_str(), .root = prefix.c_str()};
    pressure_monitor monitor(opts);
    std::printf("cgroup file refused: %s, %s\n", teardown::to_string(monitor.source()),
                monitor.description().c_str());
    EXPECT_NE(monitor.source(), pressure_source::psi_cgroup);
    EXPECT_NE(monitor.description().find("app.slice/memory.pressure: not a PSI pressure file"), std::string::npos)
        << monitor.description();
  }
  std::filesystem::remove_all(root);
}

// A regular file takes the trigger's write but never reports pressure: refused as a trigger.
TEST(PressureMonitorTest, ARegularFileIsRefusedAsAPsiTrigger) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("pressure_test.file." + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string fake = (dir / "memory").string();
  { std::ofstream out(fake); }
  {
    pressure_monitor_options opts;
    opts.source = pressure_source::psi_system;
    opts.proc_pressure = fake.c_str();
    try {
      pressure_monitor monitor(opts);
      ADD_FAILURE() << "a regular file was taken as a PSI trigger: " << monitor.description();
    } catch (const std::system_error& e) {
      EXPECT_NE(std::string(e.what()).find("not a PSI pressure file"), std::string::npos) << e.what();
    }
    opts.source = pressure_source::automatic;
    opts.files.cgroup = "/nonexistent";  // no cgroup trigger either
    pressure_monitor monitor(opts);
    EXPECT_EQ(monitor.source(), pressure_source::sampled) << monitor.description();
    EXPECT_NE(monitor.description().find("not a PSI pressure file"), std::string::npos) << monitor.description();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace teardown_test
