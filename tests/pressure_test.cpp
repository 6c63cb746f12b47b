// Specification of teardown::pressure_monitor and teardown::pressure_policy, driven from an
// injected event source: eventfds the test writes to stand in for the PSI trigger fd (events)
// and for relief, so the monitor's real poll loop runs and nothing waits on the kernel. The
// windows are an hour long unless a test is about the quiet-window relief itself, so that relief
// comes only when the test sends it. Nothing asserts a time: waits are bounded (eventually()).
#include "teardown/pressure_policy.hpp"

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

#include "teardown/async_teardown.hpp"
#include "teardown/deferred.hpp"
#include "teardown/model/mm.hpp"
#include "teardown/trace.hpp"
#include "reaper_test_support.hpp"
#include "test_support.hpp"

namespace teardown_test {
namespace {

using namespace std::chrono_literals;
using teardown::pressure_monitor;
using teardown::pressure_monitor_options;
using teardown::pressure_policy;
using teardown::pressure_policy_options;
using teardown::pressure_source;

// Two eventfds the test owns: one event per signal_event(), relief per signal_relief().
class injected_source {
 public:
  injected_source() : events_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)), relief_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    if (events_ < 0 || relief_ < 0) throw std::runtime_error("eventfd failed");
  }
  ~injected_source() {
    ::close(events_);
    ::close(relief_);
  }
  injected_source(const injected_source&) = delete;
  injected_source& operator=(const injected_source&) = delete;

  pressure_monitor_options options(std::chrono::microseconds window = std::chrono::hours(1)) const {
    pressure_monitor_options opts;
    opts.source = pressure_source::injected;
    opts.event_fd = events_;
    opts.relief_fd = relief_;
    opts.window = window;
    opts.stall = std::min<std::chrono::microseconds>(window, 150ms);
    opts.name = "pressure_test";
    return opts;
  }
  void signal_event() const { bump(events_); }
  void signal_relief() const { bump(relief_); }

 private:
  static void bump(int fd) {
    const std::uint64_t one = 1;
    ASSERT_EQ(::write(fd, &one, sizeof one), static_cast<ssize_t>(sizeof one));
  }
  int events_;
  int relief_;
};

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
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("pressure_test." + std::to_string(getpid()));
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
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("pressure_test.pipe." + std::to_string(getpid()));
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

// A regular file takes the trigger's write but never reports pressure: refused as a trigger.
TEST(PressureMonitorTest, ARegularFileIsRefusedAsAPsiTrigger) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("pressure_test.file." + std::to_string(getpid()));
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

// ---- the policy -------------------------------------------------------------------------------

struct item {
  teardown::llist_node hook;
  std::uint64_t id = 0;
  std::uint64_t cost = 10;
  std::uint64_t charge = 0;
};

struct destroy_log {
  std::mutex mutex;
  std::vector<std::uint64_t> order;
};

struct item_traits {
  destroy_log* log;
  std::uint64_t cost(const item& i) const { return i.cost; }
  bool eligible(const item&, std::uint64_t) const { return true; }
  void prepare(item&) {}
  void destroy(item& i) {
    const std::lock_guard lock(log->mutex);
    log->order.push_back(i.id);
  }
  std::uint64_t& charge(item& i) { return i.charge; }
};

using composition = teardown::async_teardown<item, &item::hook, item_traits>;

// The kernel's nice value of this process's thread named `name` (/proc/self/task/*/stat field
// 19), or nullopt if there is no such thread.
std::optional<int> thread_nice(const std::string& name) {
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string seen;
    if (!std::getline(comm, seen) || seen != name) continue;
    std::ifstream stat(task.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    std::size_t at = text.rfind(')');  // the name may hold spaces; the fields follow it
    if (at == std::string::npos) return std::nullopt;
    std::istringstream fields(text.substr(at + 2));
    std::string field;
    for (int i = 3; i <= 19 && fields >> field; ++i) {
      if (i == 19) return std::stoi(field);
    }
  }
  return std::nullopt;
}

teardown::async_teardown_options composition_options(std::uint64_t cap = 1'000) {
  teardown::async_teardown_options opts;
  opts.max_pending = cap;
  opts.sync_when_stalled = false;  // a frozen worker's backlog stays queued however long
  opts.reaper.name = "pressure_items";
  return opts;
}

TEST(PressureEntryPointsTest, ReplaceCapReplacesOnlyTheCapItExpects) {
  teardown::budget budget(100);
  EXPECT_FALSE(budget.replace_cap(50, 10));
  EXPECT_EQ(budget.cap(), 100u);
  EXPECT_TRUE(budget.replace_cap(100, 10));
  EXPECT_EQ(budget.cap(), 10u);
  EXPECT_THROW(budget.replace_cap(10, teardown::budget::max_cap + 1), std::invalid_argument);
  EXPECT_EQ(budget.cap(), 10u);
}

TEST(PressureEntryPointsTest, SetWorkerNiceChangesTheWorkerThreadItself) {
  destroy_log log;
  composition async(composition_options(), item_traits{&log});
  ASSERT_TRUE(eventually([] { return thread_nice("pressure_items").has_value(); }));
  ASSERT_TRUE(eventually([] { return thread_nice("pressure_items") == 19; }));
  EXPECT_THROW(async.set_nice(20), std::invalid_argument);
  EXPECT_THROW(async.set_nice(-21), std::invalid_argument);
  EXPECT_EQ(async.nice(), 19);
  if (!async.set_nice(0)) {
    GTEST_SKIP() << "lowering a thread's nice value is refused here (no CAP_SYS_NICE, RLIMIT_NICE 0)";
  }
  EXPECT_EQ(async.nice(), 0);
  EXPECT_EQ(thread_nice("pressure_items"), 0);
  EXPECT_TRUE(async.set_nice(19));
  EXPECT_EQ(thread_nice("pressure_items"), 19);
}

TEST(PressurePolicyTest, BadOptionsAreRefusedNamingTheField) {
  injected_source source;
  pressure_monitor monitor(source.options());
  destroy_log log;
  composition async(composition_options(), item_traits{&log});
  const auto refused = [&](pressure_policy_options opts, const std::string& field) {
    try {
      pressure_policy policy(monitor, async, opts);
      ADD_FAILURE() << "accepted bad " << field;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  refused({.pressure_nice = 20}, "pressure_nice");
  refused({.pressure_nice = -21}, "pressure_nice");
  refused({.drain_per_event = teardown::budget::max_cap + 1}, "drain_per_event");
  refused({.pressure_cap = teardown::budget::max_cap + 1}, "pressure_cap");
}

TEST(PressurePolicyTest, PressureThawsRaisesPriorityLowersTheCapAndReliefPutsItAllBack) {
  injected_source source;
  pressure_monitor monitor(source.options());
  destroy_log log;
  std::vector<item> items(5);
  item late;
  late.id = 99;
  composition async(composition_options(1'000), item_traits{&log});
  ASSERT_EQ(async.nice(), 19);
  async.freeze();
  async.freeze();  // two levels: both undone, both put back
  for (std::size_t i = 0; i < items.size(); ++i) {
    items[i].id = i;
    ASSERT_EQ(async.put(items[i]), teardown::decision::queued);
  }
  pressure_policy policy(monitor, async, {.drain_per_event = 0});
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return policy.stats().events == 1; }));
  pressure_policy_options defaults;
  EXPECT_EQ(defaults.pressure_nice, 0);
  EXPECT_EQ(policy.stats().thawed, 2u);
  EXPECT_TRUE(policy.stats().active);
  // Thawed: the worker tears the backlog down by itself.
  async.flush();
  EXPECT_EQ(async.stats().reaped, 5u);
  // The cap: new puts stay inline while pressure lasts.
  EXPECT_EQ(async.max_pending(), 0u);
  EXPECT_EQ(async.put(late), teardown::decision::inline_rejected);
  // Nice: 0 where the system allows it (here, with CAP_SYS_NICE), counted either way.
  const teardown::pressure_policy_stats during = policy.stats();
  EXPECT_EQ(during.nice_raised + during.nice_refused, 1u);
  if (during.nice_raised == 1) {
    EXPECT_EQ(async.nice(), 0);
    EXPECT_EQ(thread_nice("pressure_items"), 0);  // the thread itself, as the kernel sees it
  }

  source.signal_relief();
  ASSERT_TRUE(eventually([&] { return policy.stats().reliefs == 1; }));
  const teardown::pressure_policy_stats after = policy.stats();
  EXPECT_FALSE(after.active);
  EXPECT_EQ(async.max_pending(), 1'000u);
  EXPECT_EQ(after.caps_restored, 1u);
  EXPECT_EQ(async.nice(), 19);
  EXPECT_EQ(thread_nice("pressure_items"), 19);
  EXPECT_EQ(after.refrozen, 2u);
  // Frozen twice again: two thaws succeed, the third finds nothing.
  async.thaw();
  async.thaw();
  EXPECT_THROW(async.thaw(), std::logic_error);
}

TEST(PressurePolicyTest, EachEventDrainsABoundedAmountOldestFirstOnTheMonitorThread) {
  injected_source source;
  pressure_monitor monitor(source.options());
  destroy_log log;
  std::vector<item> items(6);
  composition async(composition_options(1'000), item_traits{&log});
  async.freeze();
  for (std::size_t i = 0; i < items.size(); ++i) {
    items[i].id = i;
    ASSERT_EQ(async.put(items[i]), teardown::decision::queued);
  }
  // No thaw: the worker stays frozen, so only the drain tears anything down.
  pressure_policy policy(monitor, async, {.thaw = false, .drain_per_event = 25});
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return policy.stats().events == 1; }));
  EXPECT_EQ(policy.stats().drained_items, 2u);  // 10 + 10 fit in 25, a third does not
  EXPECT_EQ(policy.stats().drained_cost, 20u);
  {
    const std::lock_guard lock(log.mutex);
    EXPECT_EQ(log.order, (std::vector<std::uint64_t>{0, 1}));
  }
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return policy.stats().events == 2; }));
  EXPECT_EQ(policy.stats().drained_items, 4u);
  EXPECT_EQ(async.stats().pending, 20u);
  {
    const std::lock_guard lock(log.mutex);
    EXPECT_EQ(log.order, (std::vector<std::uint64_t>{0, 1, 2, 3}));
  }
  async.thaw();
}

TEST(PressurePolicyTest, AFreezeMadeDuringPressureIsUndoneAtTheNextEvent) {
  injected_source source;
  pressure_monitor monitor(source.options());
  destroy_log log;
  composition async(composition_options(), item_traits{&log});
  pressure_policy policy(monitor, async, {.drain_per_event = 0});
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return policy.stats().events == 1; }));
  EXPECT_EQ(policy.stats().thawed, 0u);  // nothing was frozen
  async.freeze();
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return policy.stats().events == 2; }));
  EXPECT_EQ(policy.stats().thawed, 1u);
  source.signal_relief();
  ASSERT_TRUE(eventually([&] { return policy.stats().reliefs == 1; }));
  EXPECT_EQ(policy.stats().refrozen, 1u);
  async.thaw();
  EXPECT_THROW(async.thaw(), std::logic_error);
}

// The cap rule: relief puts back the cap it found, unless a cap was set meanwhile.
TEST(PressurePolicyTest, ACapSetDuringPressureStandsAfterRelief) {
  injected_source source;
  pressure_monitor monitor(source.options());
  destroy_log log;
  composition async(composition_options(1'000), item_traits{&log});
  pressure_policy policy(monitor, async, {.drain_per_event = 0, .pressure_cap = 30});
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return policy.stats().events == 1; }));
  EXPECT_EQ(async.max_pending(), 30u);
  async.set_max_pending(500);  // the user's, meanwhile
  source.signal_relief();
  ASSERT_TRUE(eventually([&] { return policy.stats().reliefs == 1; }));
  EXPECT_EQ(async.max_pending(), 500u);
  EXPECT_EQ(policy.stats().caps_kept, 1u);
  EXPECT_EQ(policy.stats().caps_restored, 0u);
  // The next episode finds 500 and puts 500 back.
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return policy.stats().events == 2; }));
  EXPECT_EQ(async.max_pending(), 30u);
  source.signal_relief();
  ASSERT_TRUE(eventually([&] { return policy.stats().reliefs == 2; }));
  EXPECT_EQ(async.max_pending(), 500u);
  EXPECT_EQ(policy.stats().caps_restored, 1u);
}

TEST(PressurePolicyTest, ACapAlreadyBelowThePressureCapIsLeftAlone) {
  injected_source source;
  pressure_monitor monitor(source.options());
  destroy_log log;
  composition async(composition_options(10), item_traits{&log});
  pressure_policy policy(monitor, async, {.drain_per_event = 0, .pressure_cap = 30});
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return policy.stats().events == 1; }));
  EXPECT_EQ(async.max_pending(), 10u);
  EXPECT_EQ(policy.stats().caps_lowered, 0u);
  source.signal_relief();
  ASSERT_TRUE(eventually([&] { return policy.stats().reliefs == 1; }));
  EXPECT_EQ(async.max_pending(), 10u);
}

TEST(PressurePolicyTest, DestroyingThePolicyDuringPressurePutsEverythingBack) {
  injected_source source;
  pressure_monitor monitor(source.options());
  destroy_log log;
  composition async(composition_options(1'000), item_traits{&log});
  async.freeze();
  {
    pressure_policy policy(monitor, async, {.drain_per_event = 0});
    source.signal_event();
    ASSERT_TRUE(eventually([&] { return policy.stats().events == 1; }));
    EXPECT_EQ(async.max_pending(), 0u);
  }
  EXPECT_EQ(async.max_pending(), 1'000u);
  EXPECT_EQ(async.nice(), 19);
  async.thaw();  // frozen again, once
  EXPECT_THROW(async.thaw(), std::logic_error);
  // Unsubscribed: a later event reaches nothing of it.
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return monitor.stats().events == 2; }));
  EXPECT_EQ(async.max_pending(), 1'000u);
}

TEST(PressurePolicyTest, OptionsCanSwitchEachActionOff) {
  injected_source source;
  pressure_monitor monitor(source.options());
  destroy_log log;
  item queued;
  queued.id = 1;
  composition async(composition_options(1'000), item_traits{&log});
  async.freeze();
  ASSERT_EQ(async.put(queued), teardown::decision::queued);
  pressure_policy policy(monitor, async,
                         {.thaw = false, .raise_priority = false, .drain_per_event = 0, .lower_cap = false});
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return policy.stats().events == 1; }));
  const teardown::pressure_policy_stats s = policy.stats();
  EXPECT_EQ(s.thawed + s.nice_raised + s.nice_refused + s.drained_items + s.caps_lowered, 0u);
  EXPECT_EQ(async.max_pending(), 1'000u);
  EXPECT_EQ(async.nice(), 19);
  EXPECT_EQ(async.stats().pending, 10u);
  async.thaw();
}

TEST(PressurePolicyTest, PressureHurriesALazyWorkerThatWouldLookOnlyHourly) {
  // A worker that polls hourly with no producer wake (reaper.hpp, "Wake policy"): the policy's
  // only action here is the lowered cap, and lowering it hurries the worker, which then tears
  // the queued item down itself. Without the hurry the item would wait an hour.
  injected_source source;
  pressure_monitor monitor(source.options());
  destroy_log log;
  item queued;
  queued.id = 1;
  teardown::async_teardown_options opts = composition_options(1'000);
  opts.reaper.spin_polls = 0;
  opts.reaper.poll_interval = std::chrono::hours(1);
  opts.hurry_at = 1'000;  // no put reaches the mark: only the pressure may hurry
  composition async(std::move(opts), item_traits{&log});
  reaper_support::wait_until_asleep(reaper_support::thread_named("pressure_items"));  // in its hourly look
  ASSERT_EQ(async.put(queued), teardown::decision::queued);
  pressure_policy policy(monitor, async, {.thaw = false, .raise_priority = false, .drain_per_event = 0});
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return policy.stats().events == 1; }));
  EXPECT_EQ(policy.stats().drained_items, 0u);
  EXPECT_TRUE(eventually([&] { return async.stats().reaped == 1; }, std::chrono::seconds(20)))
      << "the lowered cap did not hurry the polling worker";
  EXPECT_EQ(async.stats().drained, 0u) << "the worker, not the monitor thread, tore it down";
  EXPECT_EQ(async.worker_stats().hurries, 1u);
}

std::mutex trace_mutex;
std::vector<std::string> trace_actions;  // guarded by trace_mutex
void record_pressure(const teardown::trace::pressure_event& e) {
  const std::lock_guard lock(trace_mutex);
  trace_actions.emplace_back(e.action);
}

TEST(PressurePolicyTest, EveryActionIsTracedWithTheTargetsDomain) {
  injected_source source;
  pressure_monitor monitor(source.options());
  destroy_log log;
  item queued;
  queued.id = 1;
  composition async(composition_options(1'000), item_traits{&log});
  async.freeze();
  ASSERT_EQ(async.put(queued), teardown::decision::queued);
  teardown::trace::add_hook<teardown::trace::pressure_event>(&record_pressure);
  {
    pressure_policy policy(monitor, async, {.thaw = false});
    source.signal_event();
    ASSERT_TRUE(eventually([&] { return policy.stats().events == 1; }));
    source.signal_relief();
    ASSERT_TRUE(eventually([&] { return policy.stats().reliefs == 1; }));
  }
  teardown::trace::remove_hook<teardown::trace::pressure_event>(&record_pressure);
  const std::lock_guard lock(trace_mutex);
  for (const char* action : {"pressure", "cap", "drain", "relief", "cap_restored"}) {
    EXPECT_NE(std::find(trace_actions.begin(), trace_actions.end(), action), trace_actions.end()) << action;
  }
  EXPECT_TRUE(std::find(trace_actions.begin(), trace_actions.end(), "nice") != trace_actions.end() ||
              std::find(trace_actions.begin(), trace_actions.end(), "nice_refused") != trace_actions.end());
  async.thaw();
}

TEST(PressurePolicyTest, ADeferredDomainsFrozenBacklogIsGivenBack) {
  injected_source source;
  pressure_monitor monitor(source.options());
  teardown::deferred_domain_options opts = teardown::deferred_domain::default_options();
  opts.max_pending = 64u << 20;  // a budget of its own
  opts.threshold = 0;
  opts.sync_when_stalled = false;
  teardown::deferred_domain domain(opts);
  domain.freeze();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(domain.delete_object(new std::vector<char>(1 << 20)), teardown::decision::queued);
  }
  ASSERT_GT(domain.stats().pending, 0u);
  pressure_policy policy(monitor, domain);
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return domain.stats().pending == 0; }));
  EXPECT_EQ(domain.stats().reaped, 4u);
  EXPECT_EQ(domain.max_pending(), 0u);
  EXPECT_EQ(domain.delete_object(new std::vector<char>(1 << 20)), teardown::decision::inline_rejected);
  source.signal_relief();
  ASSERT_TRUE(eventually([&] { return policy.stats().reliefs == 1; }));
  EXPECT_EQ(domain.max_pending(), 64u << 20);
  domain.thaw();
}

TEST(PressurePolicyTest, AnMmSystemsFrozenBacklogIsGivenBackInPages) {
  injected_source source;
  pressure_monitor monitor(source.options());
  teardown::model::mm_system kernel({.async_mm_teardown = true, .thresh_pages = 1, .max_pending_pages = 10'000});
  kernel.freeze();
  for (int i = 0; i < 3; ++i) {
    auto task = kernel.spawn(/*rss_pages=*/100);
    EXPECT_EQ(task->exit(), teardown::decision::queued);
  }
  EXPECT_EQ(kernel.vmstat().pending_pages, 300u);
  pressure_policy policy(monitor, kernel, {.thaw = false, .drain_per_event = 200});
  source.signal_event();
  ASSERT_TRUE(eventually([&] { return policy.stats().events == 1; }));
  EXPECT_EQ(policy.stats().drained_cost, 200u);  // pages
  EXPECT_EQ(kernel.vmstat().pending_pages, 100u);
  EXPECT_EQ(kernel.max_pending_pages(), 0u);
  source.signal_relief();
  ASSERT_TRUE(eventually([&] { return policy.stats().reliefs == 1; }));
  EXPECT_EQ(kernel.max_pending_pages(), 10'000u);
  EXPECT_EQ(kernel.worker_nice(), 19);
  kernel.thaw();
  kernel.flush();
}

// Two policies on one target would each put back what the other changed, in the wrong order
// (the callbacks run in subscription order): the second is refused, and changes nothing.
TEST(PressurePolicyTest, ASecondPolicyOnTheSameTargetIsRefused) {
  injected_source source;
  pressure_monitor monitor(source.options());
  destroy_log log;
  composition async(composition_options(1'000), item_traits{&log});
  composition other(composition_options(1'000), item_traits{&log});
  {
    pressure_policy first(monitor, async, {.pressure_nice = 5, .drain_per_event = 0, .pressure_cap = 30});
    try {
      pressure_policy second(monitor, async, {.pressure_nice = 0, .drain_per_event = 0, .pressure_cap = 10});
      ADD_FAILURE() << "a second policy on the same target was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("already"), std::string::npos) << e.what();
    }
    pressure_policy elsewhere(monitor, other, {.drain_per_event = 0});  // another target: fine
    source.signal_event();
    ASSERT_TRUE(eventually([&] { return first.stats().events == 1 && elsewhere.stats().events == 1; }));
    EXPECT_EQ(async.max_pending(), 30u) << "the refused policy acted";
    source.signal_relief();
    ASSERT_TRUE(eventually([&] { return first.stats().reliefs == 1; }));
    EXPECT_EQ(async.max_pending(), 1'000u);
    EXPECT_EQ(async.nice(), 19);
  }
  // The first one gone, the target takes a policy again.
  pressure_policy again(monitor, async, {.drain_per_event = 0});
  EXPECT_EQ(again.stats().events, 0u);
}

}  // namespace
}  // namespace teardown_test
