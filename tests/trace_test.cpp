// Specification of teardown/trace.hpp: the USDT probes this very binary carries (read back with
// readelf), and the in-process hooks: each field delivered exactly, set/clear/hooked, one hook
// per event, delivery on the emitting thread. The TraceHookStressTest suite races emits with
// set_hook so that ThreadSanitizer checks the release/acquire hand-over of the hook. Hooks are
// process-wide state: every test starts and ends with all four cleared.

// trace_nosdt_test is this file built a second time without probes, for the one test that
// checks their absence (tests/CMakeLists.txt). The library's own CMake target forces probes on
// in this tree (TEARDOWN_HAVE_SDT), so that build takes it back before trace.hpp reads it.
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
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <latch>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

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
static_assert(noexcept(trace::hooked<queue_event>()));
static_assert(std::is_same_v<trace::hook<queue_event>, void (*)(const queue_event&)>);

void clear_all_hooks() {
  trace::clear_hook<queue_event>();
  trace::clear_hook<reap_event>();
  trace::clear_hook<sync_event>();
  trace::clear_hook<reject_event>();
}

// Calls every emit function, so that every probe is compiled into this binary.
void emit_each_event_once() {
  trace::queue(1, 2, 3, "emit_each_event_once", 4);
  trace::reap(1, 2, 3, 4, 5);
  trace::sync(1, 2, "emit_each_event_once");
  trace::reject(1, 2, 3, 4);
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

TEST_F(TraceUsdtTest, ProbesForAllFourEventsAreInTheBinaryUnderProviderTeardown) {
#if TEARDOWN_TRACE_USDT
  std::string readelf_output;
  const std::vector<probe_note> notes = teardown_probe_notes(readelf_output);
  ASSERT_NE(readelf_output.find("Provider: teardown"), std::string::npos) << readelf_output;
  std::map<std::string, std::size_t> sites;
  for (const probe_note& note : notes) ++sites[note.name];
  for (const char* name : {"queue", "reap", "sync", "reject"}) {
    EXPECT_GE(sites[name], 1u) << "no teardown:" << name << " probe in the binary";
  }
  EXPECT_EQ(sites.size(), 4u) << "provider teardown has probes other than the four events";
#else
  GTEST_SKIP() << "built without USDT probes (TEARDOWN_TRACE_USDT is 0: no <sys/sdt.h>, or "
                  "TEARDOWN_NO_SDT): install systemtap-sdt-dev to test them";
#endif
}

// Every probe site carries the event's fields in the order of its struct.
TEST_F(TraceUsdtTest, ProbeArgumentsAreTheEventFieldsInOrder) {
#if TEARDOWN_TRACE_USDT
  const std::map<std::string, std::vector<std::string>> expected = {
      {"queue",
       {size_spec<std::uint64_t>(), size_spec<std::uint64_t>(), size_spec<std::int64_t>(),
        size_spec<const char*>(), size_spec<int>()}},
      {"reap",
       {size_spec<std::uint64_t>(), size_spec<std::uint64_t>(), size_spec<std::uint64_t>(),
        size_spec<int>(), size_spec<std::uint64_t>()}},
      {"sync", {size_spec<std::uint64_t>(), size_spec<std::uint64_t>(), size_spec<const char*>()}},
      {"reject",
       {size_spec<std::uint64_t>(), size_spec<std::uint64_t>(), size_spec<std::uint64_t>(),
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
  trace::queue(uint64_max, (std::uint64_t{1} << 40) + 3, std::int64_t{1} << 33, thread_name, -1);
  trace::queue(0xdeadbeef, 0, -2, thread_name, 255);
  const auto events = recorder<queue_event>::received();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].id, uint64_max);
  EXPECT_EQ(events[0].cost, (std::uint64_t{1} << 40) + 3);
  EXPECT_EQ(events[0].tid, std::int64_t{1} << 33);
  EXPECT_EQ(events[0].thread_name, thread_name) << "the same pointer, not a copy";
  EXPECT_EQ(events[0].cpu, -1);
  EXPECT_EQ(events[1].id, 0xdeadbeefu);
  EXPECT_EQ(events[1].cost, 0u);
  EXPECT_EQ(events[1].tid, -2);
  EXPECT_EQ(events[1].thread_name, thread_name);
  EXPECT_EQ(events[1].cpu, 255);
}

TEST_F(TraceHookTest, ReapHookReceivesEveryFieldExactly) {
  trace::set_hook<reap_event>(&recorder<reap_event>::hook);
  trace::reap(uint64_max, 4096, 1024, -1, (std::uint64_t{1} << 50) + 9);
  trace::reap(17, 0, uint64_max, 3, 0);
  const auto events = recorder<reap_event>::received();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].id, uint64_max);
  EXPECT_EQ(events[0].charged_cost, 4096u);
  EXPECT_EQ(events[0].live_cost, 1024u);
  EXPECT_EQ(events[0].cpu, -1);
  EXPECT_EQ(events[0].wait_ns, (std::uint64_t{1} << 50) + 9);
  EXPECT_EQ(events[1].id, 17u);
  EXPECT_EQ(events[1].charged_cost, 0u);
  EXPECT_EQ(events[1].live_cost, uint64_max);
  EXPECT_EQ(events[1].cpu, 3);
  EXPECT_EQ(events[1].wait_ns, 0u);
}

TEST_F(TraceHookTest, SyncHookReceivesEveryFieldExactly) {
  static const char disabled[] = "disabled";
  static const char too_small[] = "too_small";
  trace::set_hook<sync_event>(&recorder<sync_event>::hook);
  trace::sync(uint64_max, 12345, disabled);
  trace::sync(0, uint64_max, too_small);
  const auto events = recorder<sync_event>::received();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].id, uint64_max);
  EXPECT_EQ(events[0].cost, 12345u);
  EXPECT_EQ(events[0].reason, disabled) << "the same pointer, not a copy";
  EXPECT_EQ(events[1].id, 0u);
  EXPECT_EQ(events[1].cost, uint64_max);
  EXPECT_EQ(events[1].reason, too_small);
}

TEST_F(TraceHookTest, RejectHookReceivesEveryFieldExactly) {
  trace::set_hook<reject_event>(&recorder<reject_event>::hook);
  trace::reject(uint64_max, 300, std::uint64_t{1} << 48, 1000);
  trace::reject(5, uint64_max, 0, 0);
  const auto events = recorder<reject_event>::received();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].id, uint64_max);
  EXPECT_EQ(events[0].cost, 300u);
  EXPECT_EQ(events[0].pending, std::uint64_t{1} << 48);
  EXPECT_EQ(events[0].cap, 1000u);
  EXPECT_EQ(events[1].id, 5u);
  EXPECT_EQ(events[1].cost, uint64_max);
  EXPECT_EQ(events[1].pending, 0u);
  EXPECT_EQ(events[1].cap, 0u);
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

}  // namespace
}  // namespace teardown_test
