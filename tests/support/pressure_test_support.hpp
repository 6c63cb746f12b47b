// The pressure tests' injected source: two eventfds the test owns, as a pressure_monitor's
// injected event and relief descriptors (pressure_test.cpp, pressure_policy_test.cpp).
#pragma once

#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <stdexcept>

#include "teardown/pressure.hpp"

namespace teardown_test {

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

  teardown::pressure_monitor_options options(std::chrono::microseconds window = std::chrono::hours(1)) const {
    teardown::pressure_monitor_options opts;
    opts.source = teardown::pressure_source::injected;
    opts.event_fd = events_;
    opts.relief_fd = relief_;
    opts.window = window;
    opts.stall = std::min<std::chrono::microseconds>(window, std::chrono::milliseconds(150));
    opts.name = "pressure_test";  // the monitor thread's name
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

}  // namespace teardown_test
