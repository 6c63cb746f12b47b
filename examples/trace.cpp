// trace: watch every teardown decision as it happens — queue, reap, sync and reject.
//
// Each decision of async_teardown (and so of the model kernel's mmput_exit) is a trace point,
// emitted two ways at once:
//
//   hooks  In-process: teardown::trace::add_hook<Event>(fn) installs a plain function (a function
//          pointer, no captures: keep its state in globals), up to 8 per event, each called on
//          the thread that emits the event; remove_hook<Event>(fn) removes one and returns once
//          no call of it is running. This program uses them (two on the queue event).
//   USDT   Probes teardown:queue, :reap, :sync and :reject for bpftrace, perf or SystemTap, in
//          the binary only if <sys/sdt.h> was found at build time (Debian: systemtap-sdt-dev;
//          trace.hpp then defines TEARDOWN_TRACE_USDT to 1). Unattached, each is one nop.
//          Start bpftrace, then this program (or add `-c ./build/default/examples/trace`):
//     sudo bpftrace -l 'usdt:./build/default/examples/trace:teardown:*'
//     sudo bpftrace -e 'usdt:./build/default/examples/trace:teardown:queue { @cost = hist(arg1); }'
//     sudo bpftrace -e 'usdt:./build/default/examples/trace:teardown:reap
//         { @shrunk_while_queued = hist(arg1 - arg2); @wait_us = hist(arg4 / 1000); }'
//     sudo bpftrace -e 'usdt:./build/default/examples/trace:teardown:sync { @[str(arg2)] = count(); }'
//     sudo bpftrace -e 'usdt:./build/default/examples/trace:teardown:queue { @cost[arg5] = hist(arg1); }'
//   Probe arguments are the event's fields in order, the domain last: queue(id, cost, tid,
//   thread_name, cpu, domain), reap(id, charged_cost, live_cost, cpu, wait_ns, domain), sync(id,
//   cost, reason, domain), reject(id, cost, pending, cap, domain). The domain names the instance
//   that emitted the event (here the mm_reaper's async_teardown; the swap-release worker has its
//   own): its trace_domain().
//
// Below: one exit on the model kernel for each path (simulated memory, so it takes
// milliseconds), each event printed as it arrives. Costs are in pages. It takes no options but
// `--help`.
#include <teardown/model/mm.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <thread>

#include "example_args.hpp"

namespace {

namespace trace = teardown::trace;
using teardown::model::mm_system;
using ull = unsigned long long;

// The recorder: hooks see only their event, so what they share lives here. Atomics: the reap
// hook runs on the mm_reaper thread, the others on the exiting one.
std::atomic<int> queue_events{0}, reap_events{0}, sync_events{0}, reject_events{0};
std::atomic<std::uint64_t> mm_reaper_domain{0};   // the kernel's, set before any hook runs
std::atomic<std::uint64_t> mm_reaper_queued_cost{0};

void on_queue(const trace::queue_event& e) {
  queue_events.fetch_add(1, std::memory_order_relaxed);
  std::printf("    queue   mm %llu, cost %llu, by tid %lld (\"%s\") on cpu %d, domain %llu\n", ull{e.id},
              ull{e.cost}, static_cast<long long>(e.tid), e.thread_name, e.cpu, ull{e.domain});
}
// A second hook on the same event: what one instance queued, told apart by the domain.
void tally_mm_reaper(const trace::queue_event& e) {
  if (e.domain == mm_reaper_domain.load(std::memory_order_relaxed)) {
    mm_reaper_queued_cost.fetch_add(e.cost, std::memory_order_relaxed);
  }
}
void on_reap(const trace::reap_event& e) {
  reap_events.fetch_add(1, std::memory_order_relaxed);
  std::printf("    reap    mm %llu, charged %llu, live %llu (%llu shrank while queued), waited %.3f ms, cpu %d\n",
              ull{e.id}, ull{e.charged_cost}, ull{e.live_cost}, ull{e.charged_cost - e.live_cost},
              static_cast<double>(e.wait_ns) / 1e6, e.cpu);
}
void on_sync(const trace::sync_event& e) {
  sync_events.fetch_add(1, std::memory_order_relaxed);
  std::printf("    sync    mm %llu, cost %llu, torn down inline: %s\n", ull{e.id}, ull{e.cost}, e.reason);
}
void on_reject(const trace::reject_event& e) {
  reject_events.fetch_add(1, std::memory_order_relaxed);
  std::printf("    reject  mm %llu, cost %llu: pending %llu + cost > cap %llu\n", ull{e.id}, ull{e.cost},
              ull{e.pending}, ull{e.cap});
}

}  // namespace

int main(int argc, char** argv) {
  example::command_line cli(
      "trace",
      "One exit of the model kernel per teardown decision (queue, reap, sync, reject), each trace\n"
      "event printed by an in-process hook as it arrives. The same events are USDT probes\n"
      "(provider teardown) for bpftrace, perf or SystemTap: see README.md.");
  cli.parse(argc, argv);
  std::printf("trace: built with USDT probes: %s\n",
              TEARDOWN_TRACE_USDT ? "yes (teardown:queue, :reap, :sync, :reject)" : "no (<sys/sdt.h> not found)");
  mm_system kernel({.async_mm_teardown = true, .thresh_pages = 10'000, .max_pending_pages = 100'000});
  mm_reaper_domain.store(kernel.trace_domain(), std::memory_order_relaxed);  // add_hook publishes it
  std::printf("the mm_reaper's trace domain is %llu\n", ull{kernel.trace_domain()});

  trace::add_hook<trace::queue_event>(on_queue);
  trace::add_hook<trace::queue_event>(tally_mm_reaper);
  trace::add_hook<trace::reap_event>(on_reap);
  trace::add_hook<trace::sync_event>(on_sync);
  trace::add_hook<trace::reject_event>(on_reject);

  std::printf("1. a 60000-page exit, queued; reclaim takes 20000 pages while it waits (reaper frozen 5 ms)\n");
  kernel.freeze();
  auto big = kernel.spawn(60'000);
  teardown::model::mm_struct* mm = big->mm();
  mm_system::mmgrab(*mm);  // a struct reference, so that we may reclaim from the queued mm
  big->exit();
  kernel.reclaim(*mm, 20'000);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  kernel.thaw();
  kernel.flush();  // returns once the reaper has torn it down (after its reap event)
  mm_system::mmdrop(*mm);

  std::printf("2. a 500-page exit: below vm.async_mm_teardown_thresh_pages (10000)\n");
  kernel.spawn(500)->exit();

  std::printf("3. a 60000-page exit with vm.async_mm_teardown_max_pending_pages lowered to 50000\n");
  kernel.set("vm.async_mm_teardown_max_pending_pages", "50000");
  kernel.spawn(60'000)->exit();
  kernel.set("vm.async_mm_teardown_max_pending_pages", "100000");

  std::printf("4. an OOM victim: its memory must come back at once\n");
  auto victim = kernel.spawn(60'000);
  kernel.oom_kill(*victim);
  victim->exit();

  std::printf("5. vm.async_mm_teardown=0: torn down inline, its cost not even read\n");
  kernel.set("vm.async_mm_teardown", "0");
  kernel.spawn(60'000)->exit();

  trace::remove_hook<trace::queue_event>(on_queue);
  trace::remove_hook<trace::queue_event>(tally_mm_reaper);
  trace::remove_hook<trace::reap_event>(on_reap);
  trace::remove_hook<trace::sync_event>(on_sync);
  trace::remove_hook<trace::reject_event>(on_reject);
  std::printf("6. hooks removed: this exit prints nothing (a USDT probe would still fire)\n");
  kernel.set("vm.async_mm_teardown", "1");
  kernel.spawn(60'000)->exit();
  kernel.flush();

  const teardown::model::vmstat v = kernel.vmstat();
  std::printf("events seen: queue %d, reap %d, sync %d, reject %d; vmstat: queued %llu, sync %llu, rejected %llu, "
              "reaped %llu; the mm_reaper's queue events carried %llu pages\n",
              queue_events.load(), reap_events.load(), sync_events.load(), reject_events.load(), ull{v.queued},
              ull{v.sync}, ull{v.rejected}, ull{v.reaped}, ull{mm_reaper_queued_cost.load()});
  const bool as_expected = queue_events == 1 && reap_events == 1 && sync_events == 4 && reject_events == 1 &&
                           v.queued == 2 && v.reaped == 2 && v.sync == 4 && v.rejected == 1 &&
                           mm_reaper_queued_cost == 60'000;
  return as_expected ? 0 : 1;
}
