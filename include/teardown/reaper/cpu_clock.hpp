// teardown/reaper/cpu_clock.hpp — reading the worker's CPU clock while it may exit (the pinning protocol).
//
// Out-of-line members of teardown::reaper (reaper_class.hpp declares them, with their contracts, and includes
// this file at its end). Include teardown/reaper.hpp, not this file.
//
// The worker's CPU clock is readable through its pthread_t only while the thread exists. A stats() call pins the
// clock (a count in cpu_clock_pins_) while it reads it; the exiting worker publishes its final CPU time, closes
// the clock (clock_closed_bit) and waits until no pin is left before it returns, so stop() joins it only after
// every read of its clock ended. Pins and the close are RMWs on one word: a pin taken before the close is waited
// for, one taken after it sees the close and reads the final figure instead.
// close_cpu_clock stores the figure twice: before the close, for readers that find the clock closed while pins
// drain, and after, so that the final figure is at least every live reading (each ended before the drain). Only
// a reader in between may see less than an earlier live reading: by the CPU time of a futex wake and a clock
// read.
//
// Design: docs/design.md, "The reaper".
#pragma once

#include <pthread.h>

#include <cstdint>
#include <ctime>

#include "teardown/reaper/reaper_class.hpp"
#include "teardown/worker_thread.hpp"

namespace teardown {

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline std::uint64_t reaper<T, Hook, Fn, Queue>::worker_cpu_ns() const noexcept {
  // A closed clock is never pinned again, so readers cannot keep the exiting worker waiting:
  // each pins at most once after the close. acquire (both): pairs with the release close in
  // close_cpu_clock(), so a reader that finds the clock closed sees the figure stored there.
  if (cpu_clock_pins_.load(std::memory_order_acquire) & clock_closed_bit) {
    return worker_cpu_ns_.load(std::memory_order_relaxed);
  }
  const std::uint32_t pins = cpu_clock_pins_.fetch_add(1, std::memory_order_acquire);
  std::uint64_t live = 0;
  bool read_live = false;
  // acquire: pairs with the release store in worker_main, so worker_thread_ is readable.
  if (!(pins & clock_closed_bit) && worker_known_.load(std::memory_order_acquire)) {
    clockid_t clock{};
    timespec ts{};
    detail::data_read<sync_ops>(&worker_thread_);
    if (pthread_getcpuclockid(worker_thread_, &clock) == 0 && clock_gettime(clock, &ts) == 0) {
      live = static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(ts.tv_nsec);
      read_live = true;
    }
    detail::data_written<sync_ops>(&cpu_clock_pins_);  // this clock read, before the close (a schedule test)
  }
  // release: pairs with the acquire load in close_cpu_clock(): our clock read is over before
  // the worker exits.
  if (cpu_clock_pins_.fetch_sub(1, std::memory_order_release) == (clock_closed_bit | 1)) {
    sync_ops::futex_wake_one(cpu_clock_pins_);  // the worker may wait for the last pin
  }
  return read_live ? live : worker_cpu_ns_.load(std::memory_order_relaxed);
}

template <class T, llist_node T::*Hook, class Fn, class Queue>
inline void reaper<T, Hook, Fn, Queue>::close_cpu_clock() noexcept {
  worker_cpu_ns_.store(detail::thread_cpu_ns(), std::memory_order_relaxed);
  // acq_rel. Release: pairs with the acquire pin in worker_cpu_ns(), publishing the figure above.
  // Acquire: pairs with the release unpin of a reader that was done before this (no wait
  // below then), so its clock read happens before the thread ends.
  std::uint32_t pins = cpu_clock_pins_.fetch_or(clock_closed_bit, std::memory_order_acq_rel) | clock_closed_bit;
  while (pins != clock_closed_bit) {
    sync_ops::futex_wait(cpu_clock_pins_, pins);
    // acquire: pairs with the release unpin in worker_cpu_ns().
    pins = cpu_clock_pins_.load(std::memory_order_acquire);
  }
  detail::data_read<sync_ops>(&cpu_clock_pins_);  // every clock read is over: the thread may end
  worker_cpu_ns_.store(detail::thread_cpu_ns(), std::memory_order_relaxed);  // stop()'s join publishes it
}

}  // namespace teardown
