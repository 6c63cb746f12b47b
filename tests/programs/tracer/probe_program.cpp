// tracer_probes: fires every USDT probe of trace.hpp with arguments this program knows, for
// bpftrace_test.sh, which runs it under bpftrace and compares what bpftrace printed with what
// this program wrote.
//
// Usage: tracer_probes FILE   writes one line per event to FILE, in the format of the bpftrace
//                             script in bpftrace_test.sh (the two must agree field for field),
//                             only when every check passed
// Exit status: 0 when every event below was seen with the arguments the program expects, 1 when
// not, 2 for a bad command line, 77 when the build has no USDT probes (no <sys/sdt.h>).
//
// Each line is written by a hook (trace::add_hook): the emit function hands its arguments to the
// USDT probe and to the hook in the same call, so the hook's line is what the probe got. The
// program checks those lines against what it knows it did; the test then checks that bpftrace
// read the same values from the probes, one line each, the domain last.
//
// Two sources of events:
//   direct     every emit function called once with fixed arguments, each field distinct from
//              the others (so an argument out of place shows), 64-bit values above 2^32 (so a
//              truncation shows), and the signed fields negative (so a lost sign shows);
//   instances  an async_teardown (queue, reap, sync for three reasons, reject) and a
//              process_reaper that kills a child (process_kill, process_release), and the
//              async_teardown's worker raised for a backlog and lowered again (boost): what the
//              library itself emits, carrying each instance's trace_domain().
#include <teardown/async_teardown.hpp>
#include <teardown/process_reaper.hpp>
#include <teardown/trace.hpp>

#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <csignal>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

namespace {

namespace trace = teardown::trace;
using ull = unsigned long long;

// Written by the hooks, on whichever thread emits (the reapers' included).
std::mutex lines_mutex;
std::vector<std::string> lines;

void record(const char* format, ...) __attribute__((format(printf, 1, 2)));
void record(const char* format, ...) {
  char text[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof text, format, args);
  va_end(args);
  const std::lock_guard lock(lines_mutex);
  lines.emplace_back(text);
}

// The formats: the bpftrace script in bpftrace_test.sh prints the same, from arg0, arg1, ...
void on_queue(const trace::queue_event& e) {
  record("queue id=%llu cost=%llu tid=%lld thread=%s cpu=%d domain=%llu", ull{e.id}, ull{e.cost},
         static_cast<long long>(e.tid), e.thread_name, e.cpu, ull{e.domain});
}
void on_reap(const trace::reap_event& e) {
  record("reap id=%llu charged=%llu live=%llu cpu=%d wait_ns=%llu domain=%llu", ull{e.id}, ull{e.charged_cost},
         ull{e.live_cost}, e.cpu, ull{e.wait_ns}, ull{e.domain});
}
void on_sync(const trace::sync_event& e) {
  record("sync id=%llu cost=%llu reason=%s domain=%llu", ull{e.id}, ull{e.cost}, e.reason, ull{e.domain});
}
void on_reject(const trace::reject_event& e) {
  record("reject id=%llu cost=%llu pending=%llu cap=%llu domain=%llu", ull{e.id}, ull{e.cost}, ull{e.pending},
         ull{e.cap}, ull{e.domain});
}
void on_pressure(const trace::pressure_event& e) {
  record("pressure action=%s amount=%llu domain=%llu", e.action, ull{e.amount}, ull{e.domain});
}
void on_process_kill(const trace::process_kill_event& e) {
  record("process_kill pid=%lld bytes=%llu signal=%d domain=%llu", static_cast<long long>(e.pid), ull{e.bytes},
         e.signal, ull{e.domain});
}
void on_process_release(const trace::process_release_event& e) {
  record("process_release pid=%lld bytes=%llu result=%s tries=%u wait_ns=%llu domain=%llu",
         static_cast<long long>(e.pid), ull{e.bytes}, e.result, e.tries, ull{e.wait_ns}, ull{e.domain});
}

void on_boost(const trace::boost_event& e) {
  record("boost tid=%lld before=%d after=%d reason=%s domain=%llu", static_cast<long long>(e.tid), e.nice_before,
         e.nice_after, e.reason, ull{e.domain});
}

void install_hooks() {
  trace::add_hook<trace::queue_event>(on_queue);
  trace::add_hook<trace::reap_event>(on_reap);
  trace::add_hook<trace::sync_event>(on_sync);
  trace::add_hook<trace::reject_event>(on_reject);
  trace::add_hook<trace::pressure_event>(on_pressure);
  trace::add_hook<trace::process_kill_event>(on_process_kill);
  trace::add_hook<trace::process_release_event>(on_process_release);
  trace::add_hook<trace::boost_event>(on_boost);
}

void remove_hooks() {
  trace::remove_hook<trace::queue_event>(on_queue);
  trace::remove_hook<trace::reap_event>(on_reap);
  trace::remove_hook<trace::sync_event>(on_sync);
  trace::remove_hook<trace::reject_event>(on_reject);
  trace::remove_hook<trace::pressure_event>(on_pressure);
  trace::remove_hook<trace::process_kill_event>(on_process_kill);
  trace::remove_hook<trace::process_release_event>(on_process_release);
  trace::remove_hook<trace::boost_event>(on_boost);
}

// ---- direct emits -----------------------------------------------------------------------------

// Every field of an event differs from the others; the domain is last and large.
void emit_direct() {
  trace::queue(0x1000000000000001ull, 0x1000000000000002ull, -1003, "direct-thread", -1, 0x1000000000000006ull);
  trace::reap(0x2000000000000001ull, 0x2000000000000002ull, 0x2000000000000003ull, -2, 0x2000000000000005ull,
              0x2000000000000006ull);
  trace::sync(0x3000000000000001ull, 0x3000000000000002ull, "direct-reason", 0x3000000000000004ull);
  trace::reject(0x4000000000000001ull, 0x4000000000000002ull, 0x4000000000000003ull, 0x4000000000000004ull,
                0x4000000000000005ull);
  trace::pressure("direct-action", 0x5000000000000002ull, 0x5000000000000003ull);
  trace::process_kill(-6001, 0x6000000000000002ull, -6003, 0x6000000000000004ull);
  trace::process_release(-7001, 0x7000000000000002ull, "direct-result", 0x70000004u, 0x7000000000000005ull,
                         0x7000000000000006ull);
  trace::boost(-8001, -8002, -8003, "direct-boost", 0x8000000000000005ull);
}

const std::vector<std::string> direct_lines = {
    "queue id=1152921504606846977 cost=1152921504606846978 tid=-1003 thread=direct-thread cpu=-1 "
    "domain=1152921504606846982",
    "reap id=2305843009213693953 charged=2305843009213693954 live=2305843009213693955 cpu=-2 "
    "wait_ns=2305843009213693957 domain=2305843009213693958",
    "sync id=3458764513820540929 cost=3458764513820540930 reason=direct-reason domain=3458764513820540932",
    "reject id=4611686018427387905 cost=4611686018427387906 pending=4611686018427387907 "
    "cap=4611686018427387908 domain=4611686018427387909",
    "pressure action=direct-action amount=5764607523034234882 domain=5764607523034234883",
    "process_kill pid=-6001 bytes=6917529027641081858 signal=-6003 domain=6917529027641081860",
    "process_release pid=-7001 bytes=8070450532247928834 result=direct-result tries=1879048196 "
    "wait_ns=8070450532247928837 domain=8070450532247928838",
    "boost tid=-8001 before=-8002 after=-8003 reason=direct-boost domain=9223372036854775813",
};

// ---- an async_teardown ------------------------------------------------------------------------

struct item {
  teardown::llist_node hook;
  std::uint64_t id = 0;
  std::uint64_t cost = 0;
  std::uint64_t live = 0;  // what live_cost reads at the reap
  std::uint64_t charge = 0;
  std::uint64_t queued_at = 0;
};

struct item_traits {
  std::uint64_t cost(const item& i) const { return i.cost; }
  bool eligible(const item&, std::uint64_t) const { return true; }
  void prepare(item&) {}
  void destroy(item& i) { delete &i; }
  std::uint64_t& charge(item& i) { return i.charge; }
  std::uint64_t live_cost(const item& i) const { return i.live; }
  std::uint64_t id(const item& i) const { return i.id; }
  std::uint64_t& queued_at(item& i) { return i.queued_at; }
};

struct failure_count {
  int failures = 0;
  void check(bool ok, const std::string& what) {
    if (ok) return;
    std::fprintf(stderr, "tracer_probes: FAILED: %s\n", what.c_str());
    ++failures;
  }
};

bool has_line(const std::string& line) {
  const std::lock_guard lock(lines_mutex);
  for (const std::string& seen : lines) {
    if (seen == line) return true;
  }
  return false;
}

// The one recorded line that starts with `prefix`, or "" (and a failure) if not exactly one.
std::string only_line(failure_count& result, const std::string& prefix) {
  const std::lock_guard lock(lines_mutex);
  std::string found;
  int matches = 0;
  for (const std::string& seen : lines) {
    if (seen.rfind(prefix, 0) == 0) {
      found = seen;
      ++matches;
    }
  }
  if (matches != 1) {
    std::fprintf(stderr, "tracer_probes: FAILED: %d events begin with \"%s\", expected 1\n", matches, prefix.c_str());
    ++result.failures;
    return "";
  }
  return found;
}

// threshold 100, cap 1000. While the reaper is frozen: 101 (cost 500) is queued; 102 (cost 10)
// is below the threshold; 103 (cost 800) does not fit beside 101. Then the toggle goes off for
// 104, and the reaper is thawed: 101 is reaped, with 200 of its cost gone while it waited, by a
// worker raised to this thread's nice first: by itself, finding the batch older than
// boost_after, or by the flush, if the worker has not run for boost_after after the thaw.
void run_async_teardown(failure_count& result) {
  teardown::async_teardown<item, &item::hook, item_traits> async(
      {.threshold = 100, .max_pending = 1000, .reaper = {.name = "probe-reaper"}});
  const std::uint64_t domain = async.trace_domain();
  async.freeze();
  result.check(async.put(*new item{.hook = {}, .id = 101, .cost = 500, .live = 300}) == teardown::decision::queued,
               "item 101 is queued");
  result.check(async.put(*new item{.hook = {}, .id = 102, .cost = 10, .live = 10}) ==
                   teardown::decision::inline_ineligible,
               "item 102 is torn down inline, below the threshold");
  result.check(async.put(*new item{.hook = {}, .id = 103, .cost = 800, .live = 800}) ==
                   teardown::decision::inline_rejected,
               "item 103 is rejected by the budget");
  async.disable();
  result.check(async.put(*new item{.hook = {}, .id = 104, .cost = 900, .live = 900}) ==
                   teardown::decision::inline_disabled,
               "item 104 is torn down inline, the toggle off");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past boost_after (10 ms)
  async.thaw();
  async.flush();
  // The worker lowers itself once it finds the queue empty, after the flush, and emits that
  // event after it clears its boosted flag: wait for the event itself (bounded).
  const std::string drained = " after=19 reason=drained domain=" + std::to_string(async.trace_domain());
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  const auto seen_drained = [&] {
    const std::lock_guard lock(lines_mutex);
    for (const std::string& seen : lines) {
      if (seen.rfind("boost tid=", 0) == 0 && seen.ends_with(drained)) return true;
    }
    return false;
  };
  // Without the privilege to raise it back (an ordinary user), the worker keeps this thread's nice
  // and is never raised (setup_warning_nice_kept); a raise refused all the same is traced once.
  const std::uint32_t warnings = async.worker_stats().setup_warnings;
  const bool nice_kept = (warnings & teardown::setup_warning_nice_kept) != 0;
  const bool raise_refused = (warnings & teardown::setup_warning_raise) != 0;
  while (!nice_kept && !raise_refused && getpriority(PRIO_PROCESS, static_cast<id_t>(gettid())) < 19 &&
         !seen_drained() && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  const std::string d = " domain=" + std::to_string(domain);
  const std::string tid = std::to_string(static_cast<long long>(gettid()));
  const std::string queued = only_line(result, "queue id=101 ");
  result.check(queued.rfind("queue id=101 cost=500 tid=" + tid + " thread=probe-main cpu=", 0) == 0 &&
                   queued.ends_with(d),
               "the queue event of item 101: " + queued);
  const std::string reaped = only_line(result, "reap id=101 ");
  result.check(reaped.rfind("reap id=101 charged=500 live=300 cpu=", 0) == 0 && reaped.ends_with(d) &&
                   reaped.find(" wait_ns=0 ") == std::string::npos,
               "the reap event of item 101 (it waited while the reaper was frozen): " + reaped);
  result.check(has_line("sync id=102 cost=10 reason=ineligible" + d), "the sync event of item 102");
  result.check(has_line("reject id=103 cost=800 pending=500 cap=1000" + d), "the reject event of item 103");
  result.check(has_line("sync id=103 cost=800 reason=rejected" + d), "the sync event of item 103");
  // Toggle off: the cost is not even read (the kernel's mmput with the feature off).
  const std::string disabled = only_line(result, "sync id=104 ");
  result.check(disabled.rfind("sync id=104 cost=", 0) == 0 && disabled.ends_with(" reason=disabled" + d),
               "the sync event of item 104: " + disabled);
  const int own_nice = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
  if (own_nice < 19) {
    const std::string nice = std::to_string(own_nice);
    int raised = 0, lowered = 0, refused = 0;
    {
      const std::lock_guard lock(lines_mutex);
      for (const std::string& seen : lines) {
        if (seen.rfind("boost tid=", 0) != 0 || !seen.ends_with(d)) continue;
        // The worker raises itself for the backlog when it takes the batch, unless the flush's
        // raise came first (the worker had not run for boost_after after the thaw).
        raised += seen.find(" before=19 after=" + nice + " reason=backlog" + d) != std::string::npos ||
                  seen.find(" before=19 after=" + nice + " reason=flush" + d) != std::string::npos;
        lowered += seen.find(" before=" + nice + " after=19 reason=drained" + d) != std::string::npos;
        refused += seen.find(" before=19 after=" + nice + " reason=refused" + d) != std::string::npos;
      }
    }
    if (nice_kept) {
      result.check(refused == 0 && raised == 0 && lowered == 0,
                   "no boost event: the worker kept this thread's nice (" + std::to_string(refused) + " refused, " +
                       std::to_string(raised) + " raised, " + std::to_string(lowered) + " lowered)");
    } else if (raise_refused) {
      // Said once: the first refusal is traced, the later ones only counted.
      result.check(refused == 1 && raised == 0 && lowered == 0,
                   "one boost event, the refused raise from 19 to " + nice + " (" + std::to_string(refused) +
                       " refused, " + std::to_string(raised) + " raised, " + std::to_string(lowered) + " lowered)");
    } else {
      result.check(raised == 1,
                   "one boost event (backlog or flush), from 19 to " + nice + " (" + std::to_string(raised) + ")");
      result.check(lowered == 1,
                   "one boost event for the drained worker, back to 19 (" + std::to_string(lowered) + ")");
    }
  }
}

// ---- a process_reaper -------------------------------------------------------------------------

void run_process_reaper(failure_count& result) {
  teardown::process::process_reaper reaper;
  const std::uint64_t domain = reaper.trace_domain();
  auto child = teardown::process::pidfd_process::spawn([]() -> int {
    for (;;) pause();
  });
  const std::string pid = std::to_string(static_cast<long long>(child.pid()));
  result.check(reaper.kill(child), "the process_reaper kills the child");
  child.wait();
  reaper.flush();

  const std::string d = " domain=" + std::to_string(domain);
  const std::string killed = only_line(result, "process_kill pid=" + pid + " ");
  result.check(killed.ends_with(" signal=" + std::to_string(SIGKILL) + d), "the process_kill event: " + killed);
  const std::string released = only_line(result, "process_release pid=" + pid + " ");
  result.check(released.ends_with(d), "the process_release event: " + released);
  // The release carries the charge the kill took.
  const std::size_t bytes_at = killed.find(" bytes=");
  const std::string bytes =
      bytes_at == std::string::npos ? "?" : killed.substr(bytes_at, killed.find(' ', bytes_at + 1) - bytes_at);
  result.check(released.find(bytes + " result=") != std::string::npos,
               "the release carries the kill's charge (" + bytes + "): " + released);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 || std::strncmp(argv[1], "-", 1) == 0) {
    std::fprintf(stderr, "usage: tracer_probes FILE\n");
    return 2;
  }
  if (!TEARDOWN_TRACE_USDT) {
    std::printf("tracer_probes: built without USDT probes (<sys/sdt.h> not found: Debian systemtap-sdt-dev)\n");
    return 77;
  }
  pthread_setname_np(pthread_self(), "probe-main");
  // A tracer reads a string argument without faulting its page in (bpf_probe_read_user_str
  // in a uprobe may not sleep): a literal on a page this process has not touched yet reads as
  // "" (CI saw `thread=` for the first direct emit, 2 runs in 12 here). Every page mapped now,
  // the literals' included, is made resident first; unlocking leaves them mapped.
  if (mlockall(MCL_CURRENT) == 0) (void)munlockall();

  failure_count result;
  install_hooks();
  emit_direct();
  for (const std::string& line : direct_lines) result.check(has_line(line), "the direct event: " + line);
  run_async_teardown(result);
  run_process_reaper(result);
  remove_hooks();
  std::printf("tracer_probes: %zu events, %d failures\n", lines.size(), result.failures);
  if (result.failures != 0) return 1;

  // Only a run that passed writes FILE: the test reads its presence as "ran to the end".
  std::ofstream out(argv[1]);
  for (const std::string& line : lines) out << line << '\n';
  out.close();
  if (!out) {
    std::fprintf(stderr, "tracer_probes: cannot write %s\n", argv[1]);
    return 1;
  }
  return 0;
}
