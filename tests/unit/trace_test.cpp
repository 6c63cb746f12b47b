// Specification of teardown/trace.hpp: the USDT probes this very binary carries (read back with
// readelf), the domain (the emitting instance's id: async_teardown, deferred_domain, the model's
// mm_reaper and swap_release) in every event and probe, and the in-process hooks: each field
// delivered exactly, set/clear/hooked, up to max_hooks per event added and removed one by one,
// delivery on the emitting thread, and removal that waits for the calls in flight (in a fork
// child too). The TraceHookStressTest suite races emits with the writers so that
// ThreadSanitizer checks the release/acquire hand-over of a hook and the removal's
// store-buffering argument. Hooks are process-wide state: every test starts and ends with all
// four cleared.

// trace_nosdt_test is this file built a second time without probes, for the one test that
// checks their absence (tests/CMakeLists.txt). The library's own CMake target may force probes
// on in this tree (TEARDOWN_HAVE_SDT, with TEARDOWN_WITH_USDT=ON), so that build takes it back
// before trace.hpp reads it.
#if TEARDOWN_TRACE_TEST_WITHOUT_SDT
#undef TEARDOWN_HAVE_SDT
#define TEARDOWN_NO_SDT 1
#endif

// A program may include <sys/sdt.h> itself before our header (to write its own probes); the
// header must still compile then. Including it first here keeps that true.
#if !defined(TEARDOWN_NO_SDT) && __has_include(<sys/sdt.h>)
#include <sys/sdt.h>
#endif

#include "teardown/trace.hpp"

#include <gtest/gtest.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <latch>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "teardown/async_teardown.hpp"
#include "teardown/deferred.hpp"
#include "teardown/model/mm.hpp"
#include "test_support.hpp"

namespace teardown_test {
namespace {

namespace trace = teardown::trace;
using trace::queue_event;
using trace::reap_event;
using trace::reject_event;
using trace::sync_event;

static_assert(noexcept(trace::queue(0, 0, 0, nullptr, 0)));
static_assert(noexcept(trace::reap(0, 0, 0, 0, 0)));
static_assert(noexcept(trace::sync(0, 0, nullptr)));
static_assert(noexcept(trace::reject(0, 0, 0, 0)));
static_assert(noexcept(trace::queue(0, 0, 0, nullptr, 0, 0)));
static_assert(noexcept(trace::reap(0, 0, 0, 0, 0, 0)));
static_assert(noexcept(trace::sync(0, 0, nullptr, 0)));
static_assert(noexcept(trace::reject(0, 0, 0, 0, 0)));
static_assert(noexcept(trace::hooked<queue_event>()));
static_assert(noexcept(trace::new_domain()));
static_assert(std::is_same_v<trace::hook<queue_event>, void (*)(const queue_event&)>);
static_assert(trace::max_hooks == 8);
static_assert(std::is_same_v<decltype(queue_event::domain), std::uint64_t>);
static_assert(std::is_same_v<decltype(reap_event::domain), std::uint64_t>);
static_assert(std::is_same_v<decltype(sync_event::domain), std::uint64_t>);
static_assert(std::is_same_v<decltype(reject_event::domain), std::uint64_t>);

void clear_all_hooks() {
  trace::clear_hook<queue_event>();
  trace::clear_hook<reap_event>();
  trace::clear_hook<sync_event>();
  trace::clear_hook<reject_event>();
}

// Calls every emit function, so that every probe is compiled into this binary.
void emit_each_event_once() {
  trace::queue(1, 2, 3, "emit_each_event_once", 4, 5);
  trace::reap(1, 2, 3, 4, 5, 6);
  trace::sync(1, 2, "emit_each_event_once", 3);
  trace::reject(1, 2, 3, 4, 5);
}

// --- USDT probes -------------------------------------------------------------------------------

struct probe_note {
  std::string name;
  std::vector<std::string> argument_sizes;  // "8", "-4", ...: the part of each spec before '@'
};

// Runs a shell command and returns its exit status and standard output.
struct command_result {
  int status = -1;
  std::string output;
};

command_result run_command(const std::string& command) {
  command_result result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  std::size_t got = 0;
  while ((got = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) result.output.append(buffer, got);
  const int wait_status = pclose(pipe);
  result.status = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1;
  return result;
}

bool readelf_available() { return run_command("readelf --version >/dev/null 2>&1").status == 0; }

// The stapsdt notes of provider "teardown" in this process's executable. /proc/self/exe would
// name the shell that popen starts, so the path names this process by its pid.
std::vector<probe_note> teardown_probe_notes(std::string& readelf_output) {
  const command_result readelf =
      run_command("readelf -n /proc/" + std::to_string(getpid()) + "/exe 2>&1");
  readelf_output = readelf.output;
  std::vector<probe_note> notes;
  std::istringstream lines(readelf.output);
  std::string line;
  std::string provider;
  bool in_teardown_note = false;
  while (std::getline(lines, line)) {
    const std::size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos) continue;
    line.erase(0, start);
    if (line.rfind("stapsdt", 0) == 0) {  // a new note begins
      provider.clear();
      in_teardown_note = false;
    } else if (line.rfind("Provider: ", 0) == 0) {
      provider = line.substr(10);
    } else if (line.rfind("Name: ", 0) == 0 && provider == "teardown") {
      notes.push_back({line.substr(6), {}});
      in_teardown_note = true;
    } else if (line.rfind("Arguments:", 0) == 0 && in_teardown_note) {
      std::istringstream specs(line.substr(10));
      std::string spec;
      while (specs >> spec) notes.back().argument_sizes.push_back(spec.substr(0, spec.find('@')));
    }
  }
  return notes;
}

// sys/sdt.h writes an argument's size in bytes, negative for a signed type.
template <class Field>
std::string size_spec() {
  const std::string size = std::to_string(sizeof(Field));
  return std::is_signed_v<Field> ? "-" + size : size;
}

class TraceUsdtTest : public ::testing::Test {
 protected:
  void SetUp() override {
    clear_all_hooks();
    emit_each_event_once();
    if (!readelf_available()) GTEST_SKIP() << "readelf (binutils) is not installed";
  }
  void TearDown() override { clear_all_hooks(); }
};

TEST_F(TraceUsdtTest, ProbesForTheEventsItEmitsAreInTheBinaryUnderProviderTeardown) {
#if TEARDOWN_TRACE_USDT
  std::string readelf_output;
  const std::vector<probe_note> notes = teardown_probe_notes(readelf_output);
  ASSERT_NE(readelf_output.find("Provider: teardown"), std::string::npos) << readelf_output;
  std::map<std::string, std::size_t> sites;
  for (const probe_note& note : notes) ++sites[note.name];
  // The four events of an async_teardown, and the boost of the reaper under it.
  for (const char* name : {"queue", "reap", "sync", "reject", "boost"}) {
    EXPECT_GE(sites[name], 1u) << "no teardown:" << name << " probe in the binary";
  }
  EXPECT_EQ(sites.size(), 5u) << "provider teardown has probes other than those five events";
#else
  GTEST_SKIP() << "built without USDT probes (TEARDOWN_TRACE_USDT is 0: no <sys/sdt.h>, or "
                  "TEARDOWN_NO_SDT): install systemtap-sdt-dev to test them";
#endif
}

// Every probe site carries the event's fields in the order of its struct, the domain last (so
// that scripts written for the earlier argument positions keep working). The binary holds the
// sites of async_teardown, deferred_domain and the model too (this file uses them below).
TEST_F(TraceUsdtTest, ProbeArgumentsAreTheEventFieldsInOrder) {
#if TEARDOWN_TRACE_USDT
  const std::map<std::string, std::vector<std::string>> expected = {
      {"queue",
       {size_spec<std::uint64_t>(), size_spec<std::uint64_t>(), size_spec<std::int64_t>(),
        size_spec<const char*>(), size_spec<int>(), size_spec<std::uint64_t>()}},
      {"reap",
       {size_spec<std::uint64_t>(), size_spec<std::uint64_t>(), size_spec<std::uint64_t>(),
        size_spec<int>(), size_spec<std::uint64_t>(), size_spec<std::uint64_t>()}},
      {"sync",
       {size_spec<std::uint64_t>(), size_spec<std::uint64_t>(), size_spec<const char*>(),
        size_spec<std::uint64_t>()}},
      {"reject",
       {size_spec<std::uint64_t>(), size_spec<std::uint64_t>(), size_spec<std::uint64_t>(),
        size_spec<std::uint64_t>(), size_spec<std::uint64_t>()}},
      {"boost",
       {size_spec<std::int64_t>(), size_spec<int>(), size_spec<int>(), size_spec<const char*>(),
        size_spec<std::uint64_t>()}},
  };
  std::string readelf_output;
  const std::vector<probe_note> notes = teardown_probe_notes(readelf_output);
  ASSERT_FALSE(notes.empty()) << readelf_output;
  for (const probe_note& note : notes) {
    const auto wanted = expected.find(note.name);
    ASSERT_NE(wanted, expected.end()) << "unexpected probe teardown:" << note.name;
    EXPECT_EQ(note.argument_sizes, wanted->second) << "teardown:" << note.name;
  }
#else
  GTEST_SKIP() << "built without USDT probes (TEARDOWN_TRACE_USDT is 0)";
#endif
}

#if !TEARDOWN_TRACE_USDT
// Compiled only without probes (trace_nosdt_test, or a machine without <sys/sdt.h>).
TEST_F(TraceUsdtTest, NoProbesWhenBuiltWithoutSdt) {
  std::string readelf_output;
  EXPECT_TRUE(teardown_probe_notes(readelf_output).empty()) << readelf_output;
}
#endif

// --- Hooks -------------------------------------------------------------------------------------

// Records every event a hook receives. Tag tells two recorders of one event apart.
template <class Event, int Tag = 0>
struct recorder {
  static inline std::mutex lock;
  static inline std::vector<Event> events;  // guarded by lock
  static inline std::atomic<std::size_t> calls{0};
  static inline std::atomic<std::thread::id> last_thread{};

  static void hook(const Event& event) {
    calls.fetch_add(1, std::memory_order_relaxed);
    last_thread.store(std::this_thread::get_id(), std::memory_order_relaxed);
    const std::lock_guard guard(lock);
    events.push_back(event);
  }
  static void reset() {
    calls.store(0);
    last_thread.store(std::thread::id{});
    const std::lock_guard guard(lock);
    events.clear();
  }
  static std::vector<Event> received() {
    const std::lock_guard guard(lock);
    return events;
  }
};

// A second recorder for each event, to tell two hooks apart.
template <class Event>
using other_recorder = recorder<Event, 1>;

template <int Tag>
void reset_recorders() {
  recorder<queue_event, Tag>::reset();
  recorder<reap_event, Tag>::reset();
  recorder<sync_event, Tag>::reset();
  recorder<reject_event, Tag>::reset();
}

std::size_t all_recorded_calls() {
  return recorder<queue_event>::calls + recorder<reap_event>::calls + recorder<sync_event>::calls +
         recorder<reject_event>::calls + other_recorder<queue_event>::calls +
         other_recorder<reap_event>::calls + other_recorder<sync_event>::calls +
         other_recorder<reject_event>::calls;
}

class TraceHookTest : public ::testing::Test {
 protected:
  void SetUp() override {
    clear_all_hooks();
    reset_recorders<0>();
    reset_recorders<1>();
  }
  void TearDown() override { clear_all_hooks(); }
};

constexpr std::uint64_t uint64_max = std::numeric_limits<std::uint64_t>::max();

TEST_F(TraceHookTest, QueueHookReceivesEveryFieldExactly) {
  static const char thread_name[] = "producer-7";
  trace::set_hook<queue_event>(&recorder<queue_event>::hook);
  trace::queue(uint64_max, (std::uint64_t{1} << 40) + 3, std::int64_t{1} << 33, thread_name, -1, uint64_max);
  trace::queue(0xdeadbeef, 0, -2, thread_name, 255);
  const auto events = recorder<queue_event>::received();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].id, uint64_max);
  EXPECT_EQ(events[0].cost, (std::uint64_t{1} << 40) + 3);
  EXPECT_EQ(events[0].tid, std::int64_t{1} << 33);
  EXPECT_EQ(events[0].thread_name, thread_name) << "the same pointer, not a copy";
  EXPECT_EQ(events[0].cpu, -1);
  EXPECT_EQ(events[0].domain, uint64_max);
  EXPECT_EQ(events[1].id, 0xdeadbeefu);
  EXPECT_EQ(events[1].cost, 0u);
  EXPECT_EQ(events[1].tid, -2);
  EXPECT_EQ(events[1].thread_name, thread_name);
  EXPECT_EQ(events[1].cpu, 255);
  EXPECT_EQ(events[1].domain, 0u) << "no domain given: 0";
}

TEST_F(TraceHookTest, ReapHookReceivesEveryFieldExactly) {
  trace::set_hook<reap_event>(&recorder<reap_event>::hook);
  trace::reap(uint64_max, 4096, 1024, -1, (std::uint64_t{1} << 50) + 9, uint64_max);
  trace::reap(17, 0, uint64_max, 3, 0);
  const auto events = recorder<reap_event>::received();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].id, uint64_max);
  EXPECT_EQ(events[0].charged_cost, 4096u);
  EXPECT_EQ(events[0].live_cost, 1024u);
  EXPECT_EQ(events[0].cpu, -1);
  EXPECT_EQ(events[0].wait_ns, (std::uint64_t{1} << 50) + 9);
  EXPECT_EQ(events[0].domain, uint64_max);
  EXPECT_EQ(events[1].id, 17u);
  EXPECT_EQ(events[1].charged_cost, 0u);
  EXPECT_EQ(events[1].live_cost, uint64_max);
  EXPECT_EQ(events[1].cpu, 3);
  EXPECT_EQ(events[1].wait_ns, 0u);
  EXPECT_EQ(events[1].domain, 0u);
}

TEST_F(TraceHookTest, SyncHookReceivesEveryFieldExactly) {
  static const char disabled[] = "disabled";
  static const char too_small[] = "too_small";
  trace::set_hook<sync_event>(&recorder<sync_event>::hook);
  trace::sync(uint64_max, 12345, disabled, uint64_max);
  trace::sync(0, uint64_max, too_small);
  const auto events = recorder<sync_event>::received();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].id, uint64_max);
  EXPECT_EQ(events[0].cost, 12345u);
  EXPECT_EQ(events[0].reason, disabled) << "the same pointer, not a copy";
  EXPECT_EQ(events[0].domain, uint64_max);
  EXPECT_EQ(events[1].id, 0u);
  EXPECT_EQ(events[1].cost, uint64_max);
  EXPECT_EQ(events[1].reason, too_small);
  EXPECT_EQ(events[1].domain, 0u);
}

TEST_F(TraceHookTest, RejectHookReceivesEveryFieldExactly) {
  trace::set_hook<reject_event>(&recorder<reject_event>::hook);
  trace::reject(uint64_max, 300, std::uint64_t{1} << 48, 1000, uint64_max);
  trace::reject(5, uint64_max, 0, 0);
  const auto events = recorder<reject_event>::received();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].id, uint64_max);
  EXPECT_EQ(events[0].cost, 300u);
  EXPECT_EQ(events[0].pending, std::uint64_t{1} << 48);
  EXPECT_EQ(events[0].cap, 1000u);
  EXPECT_EQ(events[0].domain, uint64_max);
  EXPECT_EQ(events[1].id, 5u);
  EXPECT_EQ(events[1].cost, uint64_max);
  EXPECT_EQ(events[1].pending, 0u);
  EXPECT_EQ(events[1].cap, 0u);
  EXPECT_EQ(events[1].domain, 0u);
}

TEST_F(TraceHookTest, EveryEmitReachesTheHookOnceInOrder) {
  trace::set_hook<sync_event>(&recorder<sync_event>::hook);
  for (std::uint64_t id = 0; id < 100; ++id) trace::sync(id, id * 3, "in_order");
  const auto events = recorder<sync_event>::received();
  ASSERT_EQ(events.size(), 100u);
  for (std::uint64_t id = 0; id < 100; ++id) {
    EXPECT_EQ(events[id].id, id);
    EXPECT_EQ(events[id].cost, id * 3);
  }
}

TEST_F(TraceHookTest, NothingIsHookedAfterClearing) {
  EXPECT_FALSE(trace::hooked<queue_event>());
  EXPECT_FALSE(trace::hooked<reap_event>());
  EXPECT_FALSE(trace::hooked<sync_event>());
  EXPECT_FALSE(trace::hooked<reject_event>());
}

TEST_F(TraceHookTest, HookedReflectsSetAndClear) {
  trace::set_hook<reap_event>(&recorder<reap_event>::hook);
  EXPECT_TRUE(trace::hooked<reap_event>());
  trace::clear_hook<reap_event>();
  EXPECT_FALSE(trace::hooked<reap_event>());
  trace::set_hook<reap_event>(&recorder<reap_event>::hook);
  EXPECT_TRUE(trace::hooked<reap_event>());
}

TEST_F(TraceHookTest, SetHookWithNullptrClears) {
  trace::set_hook<reject_event>(&recorder<reject_event>::hook);
  trace::set_hook<reject_event>(nullptr);
  EXPECT_FALSE(trace::hooked<reject_event>());
  trace::reject(1, 2, 3, 4);
  EXPECT_EQ(recorder<reject_event>::calls, 0u);
}

TEST_F(TraceHookTest, ClearHookStopsDelivery) {
  trace::set_hook<queue_event>(&recorder<queue_event>::hook);
  trace::queue(1, 2, 3, "before", 4);
  trace::clear_hook<queue_event>();
  trace::queue(5, 6, 7, "after", 8);
  const auto events = recorder<queue_event>::received();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].id, 1u);
}

TEST_F(TraceHookTest, ClearingAnUnhookedEventIsHarmless) {
  trace::clear_hook<sync_event>();
  trace::clear_hook<sync_event>();
  EXPECT_FALSE(trace::hooked<sync_event>());
}

TEST_F(TraceHookTest, SetHookReplacesThePreviousHook) {
  trace::set_hook<sync_event>(&recorder<sync_event>::hook);
  trace::sync(1, 1, "first");
  trace::set_hook<sync_event>(&other_recorder<sync_event>::hook);
  trace::sync(2, 2, "second");
  EXPECT_EQ(recorder<sync_event>::calls, 1u);
  EXPECT_EQ(other_recorder<sync_event>::calls, 1u);
  EXPECT_EQ(other_recorder<sync_event>::received().at(0).id, 2u);
}

TEST_F(TraceHookTest, EachEventHasItsOwnHook) {
  trace::set_hook<queue_event>(&recorder<queue_event>::hook);
  EXPECT_FALSE(trace::hooked<reap_event>());
  EXPECT_FALSE(trace::hooked<sync_event>());
  EXPECT_FALSE(trace::hooked<reject_event>());
  trace::reap(1, 2, 3, 4, 5);
  trace::sync(1, 2, "other_event");
  trace::reject(1, 2, 3, 4);
  EXPECT_EQ(all_recorded_calls(), 0u) << "an event reached another event's hook";
  trace::queue(1, 2, 3, "own_event", 4);
  EXPECT_EQ(recorder<queue_event>::calls, 1u);
  EXPECT_EQ(all_recorded_calls(), 1u);
}

TEST_F(TraceHookTest, UnhookedEmitsCallNothing) {
  emit_each_event_once();
  EXPECT_EQ(all_recorded_calls(), 0u);
}

TEST_F(TraceHookTest, HookRunsOnTheEmittingThread) {
  trace::set_hook<reject_event>(&recorder<reject_event>::hook);
  std::thread::id emitter_id;
  std::thread emitter([&emitter_id] {
    emitter_id = std::this_thread::get_id();
    trace::reject(1, 2, 3, 4);
  });
  emitter.join();
  EXPECT_EQ(recorder<reject_event>::calls, 1u);
  EXPECT_EQ(recorder<reject_event>::last_thread.load(), emitter_id);
  EXPECT_NE(emitter_id, std::this_thread::get_id());
}

TEST_F(TraceHookTest, HookSetOnAnotherThreadReceivesThisThreadsEvents) {
  std::thread setter([] { trace::set_hook<reap_event>(&recorder<reap_event>::hook); });
  setter.join();
  EXPECT_TRUE(trace::hooked<reap_event>());
  trace::reap(9, 8, 7, 6, 5);
  EXPECT_EQ(recorder<reap_event>::calls, 1u);
  EXPECT_EQ(recorder<reap_event>::last_thread.load(), std::this_thread::get_id());
}

// --- Several hooks per event -------------------------------------------------------------------

// Resets recorder<Event, Tag> for every Tag given.
template <class Event, int... Tags>
void reset_tags(std::integer_sequence<int, Tags...>) {
  (recorder<Event, Tags>::reset(), ...);
}

// The message of the Exception that f throws, or "" if it throws none.
template <class Exception, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const Exception& error) {
    return error.what();
  }
  return "";
}

TEST_F(TraceHookTest, TwoHooksOnOneEventAreBothCalled) {
  trace::add_hook<sync_event>(&recorder<sync_event>::hook);
  trace::add_hook<sync_event>(&other_recorder<sync_event>::hook);
  trace::sync(7, 8, "both", 9);
  const auto first = recorder<sync_event>::received();
  const auto second = other_recorder<sync_event>::received();
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(first[0].id, 7u);
  EXPECT_EQ(second[0].id, 7u);
  EXPECT_EQ(second[0].domain, 9u);
}

TEST_F(TraceHookTest, AddHookKeepsAHookThatSetHookInstalled) {
  trace::set_hook<queue_event>(&recorder<queue_event>::hook);
  trace::add_hook<queue_event>(&other_recorder<queue_event>::hook);
  trace::queue(1, 2, 3, "set_and_added", 4);
  EXPECT_EQ(recorder<queue_event>::calls, 1u);
  EXPECT_EQ(other_recorder<queue_event>::calls, 1u);
}

TEST_F(TraceHookTest, RemovingOneHookLeavesTheOther) {
  trace::add_hook<reap_event>(&recorder<reap_event>::hook);
  trace::add_hook<reap_event>(&other_recorder<reap_event>::hook);
  EXPECT_TRUE(trace::remove_hook<reap_event>(&recorder<reap_event>::hook));
  EXPECT_TRUE(trace::hooked<reap_event>()) << "one hook is still installed";
  trace::reap(1, 2, 3, 4, 5);
  EXPECT_EQ(recorder<reap_event>::calls, 0u);
  EXPECT_EQ(other_recorder<reap_event>::calls, 1u);
}

TEST_F(TraceHookTest, HookedUntilTheLastHookIsRemoved) {
  trace::add_hook<reject_event>(&recorder<reject_event>::hook);
  trace::add_hook<reject_event>(&other_recorder<reject_event>::hook);
  EXPECT_TRUE(trace::remove_hook<reject_event>(&other_recorder<reject_event>::hook));
  EXPECT_TRUE(trace::hooked<reject_event>());
  EXPECT_TRUE(trace::remove_hook<reject_event>(&recorder<reject_event>::hook));
  EXPECT_FALSE(trace::hooked<reject_event>());
  trace::reject(1, 2, 3, 4);
  EXPECT_EQ(all_recorded_calls(), 0u);
}

TEST_F(TraceHookTest, AHookBeyondMaxHooksIsRefusedAndChangesNothing) {
  using tags = std::make_integer_sequence<int, trace::max_hooks + 1>;
  reset_tags<reject_event>(tags{});
  [&]<int... Tags>(std::integer_sequence<int, Tags...>) {
    (trace::add_hook<reject_event>(&recorder<reject_event, Tags>::hook), ...);
  }(std::make_integer_sequence<int, trace::max_hooks>{});
  constexpr int ninth = trace::max_hooks;
  const std::string message =
      message_of<std::length_error>([] { trace::add_hook<reject_event>(&recorder<reject_event, ninth>::hook); });
  EXPECT_NE(message.find("teardown::trace::add_hook"), std::string::npos) << message;
  EXPECT_NE(message.find("max_hooks (8)"), std::string::npos) << message;
  trace::reject(1, 2, 3, 4);
  const auto full_set_calls = []<int... Tags>(std::integer_sequence<int, Tags...>) {
    return std::vector<std::size_t>{recorder<reject_event, Tags>::calls.load()...};
  }(std::make_integer_sequence<int, trace::max_hooks>{});
  EXPECT_EQ(full_set_calls, std::vector<std::size_t>(trace::max_hooks, 1)) << "each of the full set, once";
  EXPECT_EQ((recorder<reject_event, ninth>::calls.load()), 0u) << "the refused hook was installed anyway";
  // A removal makes room again.
  EXPECT_TRUE(trace::remove_hook<reject_event>(&recorder<reject_event, 3>::hook));
  trace::add_hook<reject_event>(&recorder<reject_event, ninth>::hook);
  trace::reject(5, 6, 7, 8);
  EXPECT_EQ((recorder<reject_event, ninth>::calls.load()), 1u);
  EXPECT_EQ((recorder<reject_event, 3>::calls.load()), 1u);
  EXPECT_EQ((recorder<reject_event, 0>::calls.load()), 2u);
  reset_tags<reject_event>(tags{});
}

TEST_F(TraceHookTest, AddingANullHookIsRefused) {
  const std::string message = message_of<std::invalid_argument>([] { trace::add_hook<sync_event>(nullptr); });
  EXPECT_NE(message.find("teardown::trace::add_hook"), std::string::npos) << message;
  EXPECT_FALSE(trace::hooked<sync_event>());
}

TEST_F(TraceHookTest, AddingAHookTwiceIsRefusedAndChangesNothing) {
  trace::add_hook<sync_event>(&recorder<sync_event>::hook);
  const std::string message =
      message_of<std::invalid_argument>([] { trace::add_hook<sync_event>(&recorder<sync_event>::hook); });
  EXPECT_NE(message.find("already installed"), std::string::npos) << message;
  trace::sync(1, 2, "once");
  EXPECT_EQ(recorder<sync_event>::calls, 1u) << "called once per emit, not twice";
  EXPECT_TRUE(trace::remove_hook<sync_event>(&recorder<sync_event>::hook));
  EXPECT_FALSE(trace::hooked<sync_event>()) << "one remove undoes the one add";
}

TEST_F(TraceHookTest, RemovingAHookThatIsNotInstalledReturnsFalseAndChangesNothing) {
  EXPECT_FALSE(trace::remove_hook<queue_event>(&recorder<queue_event>::hook)) << "nothing installed";
  trace::add_hook<queue_event>(&recorder<queue_event>::hook);
  EXPECT_FALSE(trace::remove_hook<queue_event>(&other_recorder<queue_event>::hook));
  EXPECT_FALSE(trace::remove_hook<queue_event>(nullptr));
  EXPECT_FALSE(trace::remove_hook<reap_event>(&recorder<reap_event>::hook)) << "another event's";
  EXPECT_TRUE(trace::hooked<queue_event>());
  trace::queue(1, 2, 3, "still_hooked", 4);
  EXPECT_EQ(recorder<queue_event>::calls, 1u);
  EXPECT_TRUE(trace::remove_hook<queue_event>(&recorder<queue_event>::hook));
  EXPECT_FALSE(trace::remove_hook<queue_event>(&recorder<queue_event>::hook)) << "already removed";
}

TEST_F(TraceHookTest, SetHookReplacesEveryAddedHook) {
  trace::add_hook<sync_event>(&recorder<sync_event, 0>::hook);
  trace::add_hook<sync_event>(&recorder<sync_event, 1>::hook);
  recorder<sync_event, 2>::reset();
  trace::set_hook<sync_event>(&recorder<sync_event, 2>::hook);
  trace::sync(1, 2, "replaced");
  EXPECT_EQ((recorder<sync_event, 0>::calls.load()), 0u);
  EXPECT_EQ((recorder<sync_event, 1>::calls.load()), 0u);
  EXPECT_EQ((recorder<sync_event, 2>::calls.load()), 1u);
  EXPECT_FALSE(trace::remove_hook<sync_event>(&recorder<sync_event, 0>::hook)) << "set_hook removed it";
  recorder<sync_event, 2>::reset();
}

TEST_F(TraceHookTest, SetHookWithAnAddedHookKeepsItOnce) {
  trace::add_hook<sync_event>(&recorder<sync_event>::hook);
  trace::add_hook<sync_event>(&other_recorder<sync_event>::hook);
  trace::set_hook<sync_event>(&other_recorder<sync_event>::hook);
  trace::sync(1, 2, "kept_once");
  EXPECT_EQ(recorder<sync_event>::calls, 0u);
  EXPECT_EQ(other_recorder<sync_event>::calls, 1u);
  EXPECT_TRUE(trace::remove_hook<sync_event>(&other_recorder<sync_event>::hook));
  EXPECT_FALSE(trace::hooked<sync_event>());
}

TEST_F(TraceHookTest, ClearHookRemovesEveryAddedHook) {
  trace::add_hook<reap_event>(&recorder<reap_event>::hook);
  trace::add_hook<reap_event>(&other_recorder<reap_event>::hook);
  trace::clear_hook<reap_event>();
  EXPECT_FALSE(trace::hooked<reap_event>());
  trace::reap(1, 2, 3, 4, 5);
  EXPECT_EQ(all_recorded_calls(), 0u);
}

// A hook may install another hook (add_hook takes only the writers' mutex, which no emit holds).
void sync_hook_adding_another(const sync_event& event) {
  recorder<sync_event>::hook(event);
  if (!trace::hooked<queue_event>()) trace::add_hook<queue_event>(&other_recorder<queue_event>::hook);
}

TEST_F(TraceHookTest, AHookMayAddAHook) {
  trace::add_hook<sync_event>(&sync_hook_adding_another);
  trace::sync(1, 2, "adds");
  EXPECT_TRUE(trace::hooked<queue_event>());
  trace::queue(1, 2, 3, "added_by_a_hook", 4);
  EXPECT_EQ(other_recorder<queue_event>::calls, 1u);
}

// A hook that keeps its emit in flight and reports whether a writer removing it returned
// meanwhile. It waits for that return up to a window: a writer that waits for the calls in flight
// never returns within it, so the window only sizes the chance of catching one that does not.
struct held_hook {
  static inline std::atomic<bool> entered{false};
  static inline std::atomic<bool> writer_returned{false};
  static inline std::atomic<bool> writer_returned_while_running{false};

  static void reset() {
    entered.store(false);
    writer_returned.store(false);
    writer_returned_while_running.store(false);
  }
  static void hook(const sync_event& /*event*/) {
    entered.store(true);
    const auto window_end = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
    while (!writer_returned.load() && std::chrono::steady_clock::now() < window_end) std::this_thread::yield();
    writer_returned_while_running.store(writer_returned.load());
  }
};

// Runs `remove` on a thread of its own while held_hook runs on an emitter; true if `remove`
// returned before the hook did.
template <class Remove>
bool writer_returns_while_the_hook_runs(Remove remove) {
  std::thread emitter([] { trace::sync(1, 2, "held"); });
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!held_hook::entered.load() && std::chrono::steady_clock::now() < limit) std::this_thread::yield();
  EXPECT_TRUE(held_hook::entered.load()) << "the emitter never reached the hook";
  std::thread writer([&remove] {
    remove();
    held_hook::writer_returned.store(true);
  });
  writer.join();
  emitter.join();
  return held_hook::writer_returned_while_running.load();
}

TEST_F(TraceHookTest, RemoveHookWaitsForTheCallInFlight) {
  held_hook::reset();
  trace::add_hook<sync_event>(&held_hook::hook);
  EXPECT_FALSE(writer_returns_while_the_hook_runs([] { (void)trace::remove_hook<sync_event>(&held_hook::hook); }))
      << "remove_hook returned while the removed hook was still running";
}

TEST_F(TraceHookTest, ClearHookWaitsForTheCallInFlight) {
  held_hook::reset();
  trace::set_hook<sync_event>(&held_hook::hook);
  EXPECT_FALSE(writer_returns_while_the_hook_runs([] { trace::clear_hook<sync_event>(); }))
      << "clear_hook returned while the removed hook was still running";
}

TEST_F(TraceHookTest, SetHookWaitsForTheReplacedHookInFlight) {
  held_hook::reset();
  trace::set_hook<sync_event>(&held_hook::hook);
  EXPECT_FALSE(
      writer_returns_while_the_hook_runs([] { trace::set_hook<sync_event>(&other_recorder<sync_event>::hook); }))
      << "set_hook returned while the hook it replaced was still running";
}

// A hook that holds its emit until told to let go (bounded, so that a failing test ends).
std::atomic<bool> blocking_hook_entered{false};
std::atomic<bool> blocking_hook_release{false};
void blocking_hook(const reap_event& /*event*/) {
  blocking_hook_entered.store(true);
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!blocking_hook_release.load() && std::chrono::steady_clock::now() < limit) std::this_thread::yield();
}

// In a fork child only the forking thread exists: an emit another thread had in flight never
// ends there, and must not make the child's remove_hook wait for ever.
TEST_F(TraceHookTest, AForkChildRemovesAHookThatAnotherThreadWasRunning) {
  blocking_hook_entered.store(false);
  blocking_hook_release.store(false);
  trace::add_hook<reap_event>(&blocking_hook);
  std::thread emitter([] { trace::reap(1, 2, 3, 4, 5); });
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!blocking_hook_entered.load() && std::chrono::steady_clock::now() < limit) std::this_thread::yield();
  ASSERT_TRUE(blocking_hook_entered.load());
  const pid_t child = fork();
  if (child == 0) {
    const bool removed = trace::remove_hook<reap_event>(&blocking_hook);
    _exit(removed && !trace::hooked<reap_event>() ? 0 : 1);
  }
  bool child_exited = false;
  int status = 0;
  if (child > 0) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      if (waitpid(child, &status, WNOHANG) == child) {
        child_exited = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (!child_exited) {
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
    }
  }
  blocking_hook_release.store(true);
  emitter.join();
  ASSERT_GT(child, 0) << "fork failed";
  EXPECT_TRUE(child_exited) << "the child's remove_hook waited for an emit of a thread it does not have";
  EXPECT_TRUE(child_exited && WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  EXPECT_TRUE(trace::hooked<reap_event>()) << "the parent's hook is its own";
}

// --- Domains -----------------------------------------------------------------------------------

class TraceDomainTest : public TraceHookTest {
 protected:
  void SetUp() override {
    TraceHookTest::SetUp();
    trace::add_hook<queue_event>(&recorder<queue_event>::hook);
    trace::add_hook<reap_event>(&recorder<reap_event>::hook);
    trace::add_hook<sync_event>(&recorder<sync_event>::hook);
    trace::add_hook<reject_event>(&recorder<reject_event>::hook);
  }
};

TEST_F(TraceDomainTest, NewDomainsAreNonzeroAndNeverRepeat) {
  constexpr unsigned threads = 4;
  const std::size_t per_thread = scaled(10000);
  std::vector<std::vector<std::uint64_t>> taken(threads);
  std::vector<std::thread> takers;
  for (unsigned index = 0; index < threads; ++index) {
    takers.emplace_back([&, index] {
      for (std::size_t n = 0; n < per_thread; ++n) taken[index].push_back(trace::new_domain());
    });
  }
  for (auto& taker : takers) taker.join();
  std::set<std::uint64_t> all;
  for (const auto& ids : taken) all.insert(ids.begin(), ids.end());
  EXPECT_EQ(all.size(), threads * per_thread) << "an id was handed out twice";
  EXPECT_EQ(all.count(0), 0u);
}

struct traced_item {
  teardown::llist_node hook;
  std::uint64_t id = 0;
  std::uint64_t size = 0;
  std::uint64_t charge = 0;
};

struct traced_traits {
  static std::uint64_t cost(const traced_item& item) { return item.size; }
  static bool eligible(const traced_item&, std::uint64_t) { return true; }
  static void prepare(traced_item&) {}
  static void destroy(traced_item&) {}
  static std::uint64_t& charge(traced_item& item) { return item.charge; }
  static std::uint64_t id(const traced_item& item) { return item.id; }
};

using traced_async = teardown::async_teardown<traced_item, &traced_item::hook, traced_traits>;

// Each event's domain, looked up by the item id it carries.
template <class Event>
void expect_domains(const std::vector<Event>& events, const std::map<std::uint64_t, std::uint64_t>& domain_of,
                    std::size_t expected_events, const char* what) {
  EXPECT_EQ(events.size(), expected_events) << what;
  for (const Event& event : events) {
    const auto wanted = domain_of.find(event.id);
    if (wanted == domain_of.end()) {
      ADD_FAILURE() << what << ": an event for an item no test put: " << event.id;
    } else {
      EXPECT_EQ(event.domain, wanted->second) << what << " of item " << event.id;
    }
  }
}

TEST_F(TraceDomainTest, TwoAsyncTeardownsTagTheirEventsWithTheirOwnDomains) {
  std::map<std::uint64_t, std::uint64_t> domain_of;
  {
    traced_async first({.threshold = 10, .max_pending = 100});
    traced_async second({.threshold = 10, .max_pending = 100});
    EXPECT_NE(first.trace_domain(), 0u);
    EXPECT_NE(second.trace_domain(), 0u);
    EXPECT_NE(first.trace_domain(), second.trace_domain());
    // Per instance: one queued (then reaped), one below the threshold (sync), one larger than
    // the cap (reject, then sync).
    std::vector<std::unique_ptr<traced_item>> items;
    for (traced_async* async : {&first, &second}) {
      const std::uint64_t base = async == &first ? 100 : 200;
      for (const std::uint64_t size : {50, 1, 1000}) {
        auto item = std::make_unique<traced_item>();
        item->id = base + size;
        item->size = size;
        domain_of[item->id] = async->trace_domain();
        (void)async->put(*item);
        items.push_back(std::move(item));
      }
      async->flush();
    }
  }
  expect_domains(recorder<queue_event>::received(), domain_of, 2, "queue");
  expect_domains(recorder<reap_event>::received(), domain_of, 2, "reap");
  expect_domains(recorder<sync_event>::received(), domain_of, 4, "sync");
  expect_domains(recorder<reject_event>::received(), domain_of, 2, "reject");
}

TEST_F(TraceDomainTest, ADeferredDomainTagsItsEventsWithItsDomain) {
  teardown::deferred_domain first;
  teardown::deferred_domain second;
  EXPECT_NE(first.trace_domain(), 0u);
  EXPECT_NE(first.trace_domain(), second.trace_domain());
  // All allocated before any is freed, so that no address (the events' id) is reused.
  auto* first_big = new std::vector<char>(1 << 20);
  auto* first_small = new int(1);
  auto* second_big = new std::vector<char>(1 << 20);
  auto* second_small = new int(2);
  const auto id = [](const void* object) {
    return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(object));
  };
  const std::map<std::uint64_t, std::uint64_t> domain_of = {{id(first_big), first.trace_domain()},
                                                            {id(first_small), first.trace_domain()},
                                                            {id(second_big), second.trace_domain()},
                                                            {id(second_small), second.trace_domain()}};
  EXPECT_EQ(first.delete_object(first_big), teardown::decision::queued);
  EXPECT_EQ(first.delete_object(first_small), teardown::decision::inline_ineligible);
  EXPECT_EQ(second.delete_object(second_big), teardown::decision::queued);
  EXPECT_EQ(second.delete_object(second_small), teardown::decision::inline_ineligible);
  first.flush();
  second.flush();
  expect_domains(recorder<queue_event>::received(), domain_of, 2, "queue");
  expect_domains(recorder<reap_event>::received(), domain_of, 2, "reap");
  expect_domains(recorder<sync_event>::received(), domain_of, 2, "sync");
}

// The model's mm_reaper and swap-release worker share the probes; the domain tells them apart.
TEST_F(TraceDomainTest, ModelMmReaperAndSwapReleaseTagTheirEventsWithTheirOwnDomains) {
  using teardown::model::mm_system;
  mm_system kernel({.async_mm_teardown = true, .thresh_pages = 0, .swap_slots = 1 << 16, .swap_min_exiting = 1});
  const std::uint64_t mm_reaper = kernel.trace_domain();
  const std::uint64_t swap_release = kernel.swap_release_trace_domain();
  EXPECT_NE(mm_reaper, 0u);
  EXPECT_NE(swap_release, 0u);
  EXPECT_NE(mm_reaper, swap_release);
  // An exit queued for the mm_reaper.
  auto queued = kernel.spawn(100);
  const std::uint64_t queued_mm = queued->mm()->id;
  EXPECT_EQ(queued->exit(), teardown::decision::queued);
  kernel.flush();
  // An exit torn down inline (deferral off) whose 3000 swap entries go to the swap-release
  // worker in three batches.
  kernel.set_async_mm_teardown(false);
  auto swapping = kernel.spawn(3010);
  ASSERT_EQ(kernel.swap_out(*swapping->mm(), 3000), 3000u);
  const std::uint64_t swapping_mm = swapping->mm()->id;
  EXPECT_EQ(swapping->exit(), teardown::decision::inline_disabled);
  kernel.flush_swap_release();
  ASSERT_EQ(kernel.stats().swap.queued, 3u);

  const auto split = [&](const auto& events, const char* what) {
    std::map<std::uint64_t, std::vector<std::uint64_t>> ids_by_domain;
    for (const auto& event : events) ids_by_domain[event.domain].push_back(event.id);
    for (const auto& [domain, ids] : ids_by_domain) {
      EXPECT_TRUE(domain == mm_reaper || domain == swap_release) << what << " from an unknown domain " << domain;
    }
    return ids_by_domain;
  };
  auto queues = split(recorder<queue_event>::received(), "queue");
  EXPECT_EQ(queues[mm_reaper], std::vector<std::uint64_t>{queued_mm});
  EXPECT_EQ(queues[swap_release].size(), 3u) << "the three batches";
  auto reaps = split(recorder<reap_event>::received(), "reap");
  EXPECT_EQ(reaps[mm_reaper], std::vector<std::uint64_t>{queued_mm});
  EXPECT_EQ(reaps[swap_release].size(), 3u);
  EXPECT_EQ(std::set<std::uint64_t>(reaps[swap_release].begin(), reaps[swap_release].end()),
            std::set<std::uint64_t>(queues[swap_release].begin(), queues[swap_release].end()));
  auto syncs = split(recorder<sync_event>::received(), "sync");
  EXPECT_EQ(syncs[mm_reaper], std::vector<std::uint64_t>{swapping_mm});
  EXPECT_TRUE(syncs[swap_release].empty());
}

// --- Many threads ------------------------------------------------------------------------------

class TraceHookStressTest : public TraceHookTest {};

// Written with plain stores before set_hook, read with plain loads by the hook on another
// thread: ThreadSanitizer reports a race unless set_hook publishes with release and the emit
// loads the hook with acquire.
int context_written_before_set_hook = 0;
int context_seen_by_hook = 0;
std::atomic<bool> hook_delivered{false};

void hook_reading_context(const sync_event& /*event*/) {
  context_seen_by_hook = context_written_before_set_hook;
  hook_delivered.store(true, std::memory_order_release);  // pairs with the emitter's acquire
}

TEST_F(TraceHookStressTest, HookSeesWhatTheProgramWroteBeforeSetHook) {
  hook_delivered.store(false);
  // The emitter starts before the hook exists and emits until the hook has run once: bounded
  // by the one set_hook below, not by time.
  std::thread emitter([] {
    while (!hook_delivered.load(std::memory_order_acquire)) {  // pairs with the hook's release
      trace::sync(1, 2, "publication");
    }
  });
  context_written_before_set_hook = 42;
  trace::set_hook<sync_event>(&hook_reading_context);
  emitter.join();
  EXPECT_EQ(context_seen_by_hook, 42);
}

std::atomic<std::uint64_t> first_hook_calls{0};
std::atomic<std::uint64_t> second_hook_calls{0};
std::atomic<bool> torn_event{false};

// Every racing emit sends cost == 2 * id and this thread's own name.
void check_event(const queue_event& event) {
  if (event.cost != 2 * event.id || event.cpu != static_cast<int>(event.id % 64) ||
      std::strcmp(event.thread_name, "racing_emitter") != 0) {
    torn_event.store(true, std::memory_order_relaxed);
  }
}
void first_hook(const queue_event& event) {
  check_event(event);
  first_hook_calls.fetch_add(1, std::memory_order_relaxed);
}
void second_hook(const queue_event& event) {
  check_event(event);
  second_hook_calls.fetch_add(1, std::memory_order_relaxed);
}

// Emitters race two setters that swap between two hooks and none; each emit runs one hook or
// none, whole. Both setters end by clearing, so afterwards the event is unhooked for good.
TEST_F(TraceHookStressTest, EmitsRacingSetHookRunOneHookOrNone) {
  first_hook_calls.store(0);
  second_hook_calls.store(0);
  torn_event.store(false);
  constexpr unsigned emitters = 4;
  constexpr unsigned setters = 2;
  const std::size_t emits_per_thread = scaled(50000);
  std::latch start(emitters + setters);
  std::vector<std::thread> threads;
  for (unsigned index = 0; index < emitters; ++index) {
    threads.emplace_back([&] {
      start.arrive_and_wait();
      for (std::uint64_t id = 0; id < emits_per_thread; ++id) {
        trace::queue(id, 2 * id, 1, "racing_emitter", static_cast<int>(id % 64));
      }
    });
  }
  for (unsigned index = 0; index < setters; ++index) {
    threads.emplace_back([&] {
      start.arrive_and_wait();
      for (std::size_t round = 0; round < scaled(5000); ++round) {
        trace::set_hook<queue_event>(&first_hook);
        trace::set_hook<queue_event>(&second_hook);
        trace::clear_hook<queue_event>();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_FALSE(torn_event.load()) << "a hook received an event it was not sent";
  EXPECT_LE(first_hook_calls.load() + second_hook_calls.load(), emitters * emits_per_thread);
  EXPECT_FALSE(trace::hooked<queue_event>()) << "both setters' last act was clear_hook";
  const std::uint64_t before = first_hook_calls.load() + second_hook_calls.load();
  trace::queue(1, 2, 3, "racing_emitter", 1);
  EXPECT_EQ(first_hook_calls.load() + second_hook_calls.load(), before);
}

// After setters race, the key and the hook agree: the last set_hook decides both.
TEST_F(TraceHookStressTest, AfterRacingSettersTheLastSetHookDecides) {
  constexpr unsigned setters = 4;
  std::latch start(setters);
  std::vector<std::thread> threads;
  for (unsigned index = 0; index < setters; ++index) {
    threads.emplace_back([&] {
      start.arrive_and_wait();
      for (std::size_t round = 0; round < scaled(5000); ++round) {
        trace::set_hook<reject_event>(&other_recorder<reject_event>::hook);
        trace::clear_hook<reject_event>();
      }
      trace::set_hook<reject_event>(&recorder<reject_event>::hook);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_TRUE(trace::hooked<reject_event>());
  trace::reject(1, 2, 3, 4);
  EXPECT_EQ(recorder<reject_event>::calls, 1u);
  EXPECT_EQ(other_recorder<reject_event>::calls, 0u);
}

// After remove_hook returns, the removed hook never runs again, while emitters keep the event
// hooked (a second hook stays installed) and race every removal.
std::atomic<bool> removal_returned{false};
std::atomic<bool> called_after_removal{false};
std::atomic<std::uint64_t> removable_calls{0};
std::atomic<std::uint64_t> counting_calls{0};

void counting_hook(const reap_event& /*event*/) { counting_calls.fetch_add(1, std::memory_order_relaxed); }

void removable_hook(const reap_event& /*event*/) {
  removable_calls.fetch_add(1, std::memory_order_relaxed);
  std::this_thread::yield();  // widens the window in which a remove that does not wait returns
  // Relaxed: the hand-over it checks is remove_hook's own (its wait, and add_hook's release).
  if (removal_returned.load(std::memory_order_relaxed)) called_after_removal.store(true, std::memory_order_relaxed);
}

TEST_F(TraceHookStressTest, ARemovedHookIsNeverCalledAfterRemoveHookReturns) {
  removal_returned.store(false);
  called_after_removal.store(false);
  removable_calls.store(0);
  trace::add_hook<reap_event>(&counting_hook);  // keeps the emitters on the hooked path
  std::atomic<bool> stop{false};
  std::vector<std::thread> emitters;
  for (unsigned index = 0; index < 2; ++index) {
    emitters.emplace_back([&stop] {
      while (!stop.load(std::memory_order_relaxed)) trace::reap(1, 2, 3, 4, 5);
    });
  }
  for (std::size_t round = 0; round < scaled(100); ++round) {
    removal_returned.store(false, std::memory_order_relaxed);
    trace::add_hook<reap_event>(&removable_hook);  // release: the hook sees the store above
    if (round % 2 == 0) {  // every other round, only once the hook has run
      const std::uint64_t before = removable_calls.load(std::memory_order_relaxed);
      while (removable_calls.load(std::memory_order_relaxed) == before) std::this_thread::yield();
    }
    ASSERT_TRUE(trace::remove_hook<reap_event>(&removable_hook));
    removal_returned.store(true, std::memory_order_relaxed);
  }
  stop.store(true);
  for (auto& emitter : emitters) emitter.join();
  EXPECT_FALSE(called_after_removal.load()) << "a hook ran after its remove_hook returned";
  EXPECT_GT(removable_calls.load(), 0u);
}

// Each call returns only once a later call has begun (or the test says stop): two emitters in it
// keep at least one emit in flight at every moment, without a gap.
struct overlapping_hook {
  static inline std::atomic<std::uint64_t> entries{0};
  static inline std::atomic<bool> stop{false};
  static void hook(const reap_event& /*event*/) {
    const std::uint64_t mine = entries.fetch_add(1) + 1;
    while (entries.load() <= mine && !stop.load()) std::this_thread::yield();
  }
};
void another_reap_hook(const reap_event& /*event*/) {}

// A remover waits for the emits in flight without waiting for the ones that begin meanwhile: it
// returns while emitters keep an emit in flight at every moment. (Were every emit counted on one
// side, that count would never read 0.)
TEST_F(TraceHookStressTest, RemoveHookReturnsWhileEmitsOverlapWithoutAGap) {
  overlapping_hook::entries.store(0);
  overlapping_hook::stop.store(false);
  trace::add_hook<reap_event>(&overlapping_hook::hook);
  trace::add_hook<reap_event>(&another_reap_hook);
  std::vector<std::thread> emitters;
  for (int index = 0; index < 2; ++index) {
    emitters.emplace_back([] {
      while (!overlapping_hook::stop.load()) trace::reap(1, 2, 3, 4, 5);
    });
  }
  while (overlapping_hook::entries.load() < 100) std::this_thread::yield();  // overlapping by now
  std::atomic<bool> removed{false};
  std::thread remover([&removed] {
    EXPECT_TRUE(trace::remove_hook<reap_event>(&another_reap_hook));
    removed.store(true);
  });
  // A bound far beyond a right answer: the remover needs each side to drain once.
  const bool returned = eventually([&removed] { return removed.load(); }, std::chrono::seconds(20));
  overlapping_hook::stop.store(true);  // lets a failing remover end
  remover.join();
  for (auto& emitter : emitters) emitter.join();
  EXPECT_TRUE(returned) << "remove_hook waited for emits that began after it";
}

// Counts its calls, and nothing else: cheap enough for emitters that never stop.
template <int Tag>
struct queue_counter {
  static inline std::atomic<std::uint64_t> calls{0};
  static void hook(const queue_event& /*event*/) { calls.fetch_add(1, std::memory_order_relaxed); }
};

// Writers race on one event, adding and removing a hook each, while emitters run: at the end
// exactly the hooks still added are installed, and the key agrees.
TEST_F(TraceHookStressTest, RacingAddAndRemoveKeepTheHooksConsistent) {
  constexpr int writers = 4;
  std::atomic<bool> stop{false};
  std::vector<std::thread> emitters;
  for (unsigned index = 0; index < 2; ++index) {
    emitters.emplace_back([&stop] {
      while (!stop.load(std::memory_order_relaxed)) trace::queue(1, 2, 3, "racing_writers", 4);
    });
  }
  std::latch start(writers);
  std::vector<std::thread> threads;
  const auto churn = [&start]<int Tag>(std::integral_constant<int, Tag>) {
    start.arrive_and_wait();
    for (std::size_t round = 0; round < scaled(300); ++round) {
      trace::add_hook<queue_event>(&queue_counter<Tag>::hook);
      EXPECT_TRUE(trace::remove_hook<queue_event>(&queue_counter<Tag>::hook));
    }
    if (Tag % 2 == 0) trace::add_hook<queue_event>(&queue_counter<Tag>::hook);  // left installed
  };
  threads.emplace_back([&] { churn(std::integral_constant<int, 0>{}); });
  threads.emplace_back([&] { churn(std::integral_constant<int, 1>{}); });
  threads.emplace_back([&] { churn(std::integral_constant<int, 2>{}); });
  threads.emplace_back([&] { churn(std::integral_constant<int, 3>{}); });
  for (auto& thread : threads) thread.join();
  stop.store(true);
  for (auto& emitter : emitters) emitter.join();
  EXPECT_TRUE(trace::hooked<queue_event>());
  const std::uint64_t before[] = {queue_counter<0>::calls, queue_counter<1>::calls, queue_counter<2>::calls,
                                  queue_counter<3>::calls};
  trace::queue(1, 2, 3, "after", 4);
  EXPECT_EQ(queue_counter<0>::calls - before[0], 1u);
  EXPECT_EQ(queue_counter<1>::calls - before[1], 0u);
  EXPECT_EQ(queue_counter<2>::calls - before[2], 1u);
  EXPECT_EQ(queue_counter<3>::calls - before[3], 0u);
  EXPECT_TRUE(trace::remove_hook<queue_event>(&queue_counter<0>::hook));
  EXPECT_TRUE(trace::remove_hook<queue_event>(&queue_counter<2>::hook));
  EXPECT_FALSE(trace::hooked<queue_event>());
}

}  // namespace
}  // namespace teardown_test
