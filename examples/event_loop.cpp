// event_loop — bring your own thread: an epoll loop that serves a 1 ms timer tick and the
// deferred domain's work_fd, and tears down 1 GiB of buffers in bounded slices between ticks.
// No thread of the library's runs: the domain is driven (reaper_options::driven), and each
// readable work_fd gets one run of at most --slice buffers and --budget-us microseconds, so a
// tick is never late by more than one slice (watch the worst lateness as --slice grows).
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "example_args.hpp"
#include "teardown/deferred.hpp"

namespace {

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

std::size_t thread_count() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  example::command_line cli("event_loop",
                            "an epoll loop that tears down buffers in bounded slices through a driven deferred domain");
  std::uint64_t mib = 1024;
  std::uint64_t buffer_kib = 1024;
  std::uint64_t slice = 2;
  std::uint64_t budget_us = 500;
  std::uint64_t per_tick = 1;  // 1 GiB a second: more, and the tick itself (allocating) overruns 1 ms
  std::uint64_t tick_us = 1000;
  cli.option("--mib", "N", mib, example::at_least<std::uint64_t>(1), "MiB of buffers to tear down");
  cli.option("--buffer-kib", "N", buffer_kib, example::between<std::uint64_t>(4, 1 << 20), "KiB per buffer");
  cli.option("--slice", "N", slice, example::at_least<std::uint64_t>(1), "buffers per run at most");
  cli.option("--budget-us", "N", budget_us, example::at_least<std::uint64_t>(1), "microseconds per run at most");
  cli.option("--per-tick", "N", per_tick, example::at_least<std::uint64_t>(1), "buffers freed by each tick");
  cli.option("--tick-us", "N", tick_us, example::at_least<std::uint64_t>(100), "timer period in microseconds");
  cli.parse(argc, argv);

  const std::size_t threads_before = thread_count();
  auto opts = teardown::deferred_domain::default_options();
  opts.reaper.driven = true;
  opts.max_pending = std::uint64_t{4} << 30;  // a budget of its own, above what we queue
  opts.shared_budget = nullptr;
  teardown::deferred_domain domain(opts);

  const int timer = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  const int epoll = ::epoll_create1(EPOLL_CLOEXEC);
  if (timer < 0 || epoll < 0) {
    std::perror("event_loop: timerfd_create/epoll_create1");
    return 1;
  }
  const timespec period{0, static_cast<long>(tick_us * 1000)};
  const itimerspec spec{period, period};
  (void)::timerfd_settime(timer, 0, &spec, nullptr);
  epoll_event on_timer{.events = EPOLLIN, .data = {.fd = timer}};
  epoll_event on_work{.events = EPOLLIN, .data = {.fd = domain.work_fd()}};
  (void)::epoll_ctl(epoll, EPOLL_CTL_ADD, timer, &on_timer);
  (void)::epoll_ctl(epoll, EPOLL_CTL_ADD, domain.work_fd(), &on_work);

  const std::size_t buffer_bytes = static_cast<std::size_t>(buffer_kib) << 10;
  const std::uint64_t buffers = std::max<std::uint64_t>(1, (mib << 20) / buffer_bytes);
  std::uint64_t handed = 0, ticks = 0, runs = 0, worst_late_ns = 0;
  std::vector<std::uint64_t> lateness_ns;  // one per served tick: the worst alone is noise on a busy machine
  lateness_ns.reserve(static_cast<std::size_t>(buffers / per_tick + 16));
  const std::uint64_t start = now_ns();
  std::uint64_t next_tick = start + tick_us * 1000;
  for (;;) {
    const teardown::deferred_stats s = domain.stats();
    if (handed == buffers && s.reaped + s.inline_total >= buffers) break;
    epoll_event events[2];
    const int ready = ::epoll_wait(epoll, events, 2, 100);
    for (int i = 0; i < ready; ++i) {
      if (events[i].data.fd == timer) {
        std::uint64_t expirations = 0;
        if (::read(timer, &expirations, sizeof expirations) != sizeof expirations) continue;
        const std::uint64_t now = now_ns();
        // How late this turn of the loop served the tick that fired first.
        const std::uint64_t late = now > next_tick ? now - next_tick : 0;
        worst_late_ns = std::max(worst_late_ns, late);
        lateness_ns.push_back(late);
        next_tick += expirations * tick_us * 1000;
        ticks += expirations;
        // The tick's own work: retire a few buffers (a cache eviction, a closed session).
        for (std::uint64_t b = 0; b < per_tick && handed < buffers; ++b, ++handed) {
          auto* buffer = new std::vector<char>(buffer_bytes);  // zeroed: its pages are touched
          (void)domain.delete_object(buffer, [&](const std::vector<char>&) { return buffer_bytes; });
        }
      } else {
        (void)domain.run({.items = slice, .time = std::chrono::microseconds(budget_us)});
        ++runs;
      }
    }
  }
  const double seconds = static_cast<double>(now_ns() - start) / 1e9;
  const teardown::deferred_stats s = domain.stats();
  std::sort(lateness_ns.begin(), lateness_ns.end());
  const double p99_us =
      lateness_ns.empty() ? 0.0 : static_cast<double>(lateness_ns[lateness_ns.size() * 99 / 100]) / 1e3;
  std::printf("event_loop: freed %llu MiB (%llu buffers of %llu KiB, %llu on the loop, %llu inline) in %.2f s; "
              "%llu runs of at most %llu buffers; tick lateness p99 %.1f us, worst %.1f us over %llu ticks; "
              "library threads started: %zu\n",
              static_cast<unsigned long long>((buffers * buffer_bytes) >> 20), static_cast<unsigned long long>(buffers),
              static_cast<unsigned long long>(buffer_kib), static_cast<unsigned long long>(s.reaped),
              static_cast<unsigned long long>(s.inline_total), seconds, static_cast<unsigned long long>(runs),
              static_cast<unsigned long long>(slice), p99_us, static_cast<double>(worst_late_ns) / 1e3,
              static_cast<unsigned long long>(ticks), thread_count() - threads_before);
  ::close(epoll);
  ::close(timer);
  return thread_count() == threads_before ? 0 : 1;
}
