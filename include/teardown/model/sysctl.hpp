// teardown/model/sysctl.hpp — the model kernel's knobs: their names, the boot options
// (mm_system_options), their checks and the sysctl-style text parsing (part of model/mm.hpp).
//
//   knob                                        typed setter / getter on basic_mm_system     values
//   vm.async_mm_teardown                        set_async_mm_teardown / async_mm_teardown    0 or 1
//   vm.async_mm_teardown_thresh_pages           set_thresh_pages / thresh_pages     0 .. budget::max_cap
//   vm.async_mm_teardown_max_pending_pages      set_max_pending_pages / max_pending 0 .. budget::max_cap
//   vm.async_mm_teardown_min_concurrent_exits   set_min_concurrent_exits / ...      1 .. 2^20 (1: off)
//   vm.swap_async_release                       set_swap_async_release / ...        0 or 1
//   vm.oom_reap_direction                       set_oom_reap_direction / ...        "same" or "other"
//
// A value is a decimal number (one trailing newline allowed, as `echo` writes it) or, for the
// direction, a word (the same newline allowed). Every check throws std::invalid_argument naming
// the knob and ending "; unchanged", and changes nothing.
//
// Who may call what: everything here is a pure function of its arguments (default_*_pages read
// sysconf), callable from any thread.
// Design: docs/design.md, "model/mm.hpp: the kernel's composition, in user space".
#pragma once

#include <unistd.h>

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "teardown/async_teardown.hpp"
#include "teardown/budget.hpp"
#include "teardown/model/mm_struct.hpp"
#include "teardown/model/oom_reaper.hpp"
#include "teardown/reaper.hpp"
#include "teardown/reaper_pool.hpp"

namespace teardown::model {

struct mm_system_options {
  bool async_mm_teardown = false;        // vm.async_mm_teardown: off by default, as in the series
  std::optional<std::uint64_t> thresh_pages{};       // vm.async_mm_teardown_thresh_pages;
                                                    // unset: 64 MiB of pages
  std::optional<std::uint64_t> max_pending_pages{};  // vm.async_mm_teardown_max_pending_pages;
                                                    // unset: a quarter of physical RAM
  bool sync_when_stalled = false;        // async_teardown's watchdog; the series has none
  std::uint64_t min_concurrent_exits = 1;  // vm.async_mm_teardown_min_concurrent_exits: defer
                                          // only while at least this many final exits run at
                                          // once (the swap batch release series); 1 is off, as
                                          // in the mm_reaper patch series
  reaper_options reaper{.name = "mm_reaper"};  // the mm_reaper's; in a pool, every worker's
  std::size_t swap_slots = 0;            // the swap device's size; 0: no swap (swap_out throws)
  bool swap_async_release = true;        // the swap batch release series: exiting tasks hand
                                         // swap entries to a worker ...
  std::uint32_t swap_min_exiting = 2;    // ... while at least this many final exits run at once
                                         // (NR_MIN_EXITING_PROCESSES); at least 1
  reaper_pool_options pool{};            // pooled_mm_system only: workers, steal, steal_after.
                                         // pool.worker must stay default (std::invalid_argument
                                         // otherwise): every worker takes `reaper` above
};

namespace detail {

inline constexpr std::string_view knob_enabled = "vm.async_mm_teardown";
inline constexpr std::string_view knob_thresh = "vm.async_mm_teardown_thresh_pages";
inline constexpr std::string_view knob_max_pending = "vm.async_mm_teardown_max_pending_pages";
inline constexpr std::string_view knob_min_concurrent = "vm.async_mm_teardown_min_concurrent_exits";
inline constexpr std::string_view knob_swap_async_release = "vm.swap_async_release";
inline constexpr std::string_view knob_oom_reap_direction = "vm.oom_reap_direction";
/// The largest vm.async_mm_teardown_min_concurrent_exits: far beyond any number of CPUs.
inline constexpr std::uint64_t max_min_concurrent_exits = std::uint64_t{1} << 20;

inline std::uint64_t default_thresh_pages() noexcept { return (std::uint64_t{64} << 20) / page_size(); }
inline std::uint64_t default_max_pending_pages() noexcept {
  const long pages = sysconf(_SC_PHYS_PAGES);
  return pages > 0 ? static_cast<std::uint64_t>(pages) / 4 : default_thresh_pages();
}

inline std::invalid_argument bad_knob(std::string_view knob, std::string_view value, const std::string& why) {
  return std::invalid_argument("teardown::model: " + std::string(knob) + ": \"" + std::string(value) + "\" " + why +
                               "; unchanged");
}

inline std::uint64_t validated(std::string_view knob, std::uint64_t pages) {
  if (pages > budget::max_cap) {
    throw bad_knob(knob, std::to_string(pages), "is above the largest value, " + std::to_string(budget::max_cap));
  }
  return pages;
}

inline std::uint32_t validated_min_concurrent(std::uint64_t exits) {
  if (exits == 0) throw bad_knob(knob_min_concurrent, "0", "must be at least 1 (1: no gate)");
  if (exits > max_min_concurrent_exits) {
    throw bad_knob(knob_min_concurrent, std::to_string(exits),
                   "is above the largest value, " + std::to_string(max_min_concurrent_exits));
  }
  return static_cast<std::uint32_t>(exits);
}

inline reap_direction parse_direction(std::string_view text) {
  std::string_view word = text;
  if (!word.empty() && word.back() == '\n') word.remove_suffix(1);
  if (word == "same") return reap_direction::same;
  if (word == "other") return reap_direction::other;
  throw bad_knob(knob_oom_reap_direction, text, "must be \"same\" or \"other\"");
}

inline std::uint64_t parse(std::string_view knob, std::string_view text) {
  std::string_view digits = text;
  if (!digits.empty() && digits.back() == '\n') digits.remove_suffix(1);
  std::uint64_t value = 0;
  const char* end = digits.data() + digits.size();
  const auto [stop, error] = std::from_chars(digits.data(), end, value);
  if (digits.empty() || error == std::errc::invalid_argument || stop != end) {
    throw bad_knob(knob, text, "is not a decimal number");
  }
  if (error == std::errc::result_out_of_range) throw bad_knob(knob, text, "is out of range");
  return value;
}

// Refuses, before any worker starts, an option the system would ignore: pool.worker (every
// mm_reaper worker takes mm_system_options::reaper). Throws std::invalid_argument naming it.
inline const mm_system_options& refuse_ignored(const mm_system_options& opts) {
  if (!teardown::detail::is_default_reaper_options(opts.pool.worker)) {
    throw std::invalid_argument(
        "teardown::model: mm_system_options::pool.worker is not used: every mm_reaper worker takes "
        "mm_system_options::reaper (its name gets \"-<i>\"); set reaper and leave pool.worker at its default");
  }
  return opts;
}

// The mm composition's options, every knob checked. Throws std::invalid_argument naming the knob
// for a bad one.
inline async_teardown_options make_options(mm_system_options& opts) {
  async_teardown_options out;
  out.enabled = opts.async_mm_teardown;
  out.threshold = validated(knob_thresh, opts.thresh_pages.value_or(default_thresh_pages()));
  out.max_pending = validated(knob_max_pending, opts.max_pending_pages.value_or(default_max_pending_pages()));
  out.sync_when_stalled = opts.sync_when_stalled;
  out.min_concurrent = validated_min_concurrent(opts.min_concurrent_exits);
  out.reaper = std::move(opts.reaper);
  out.pool = std::move(opts.pool);
  return out;
}

// basic_mm_system::set: dispatches the knob's text to its typed setter.
template <class System>
void sysctl_set(System& system, std::string_view knob, std::string_view value) {
  if (knob == knob_oom_reap_direction) {
    system.set_oom_reap_direction(parse_direction(value));
    return;
  }
  if (knob == knob_enabled && !System::compiled_out) {
    const std::uint64_t on = parse(knob, value);
    if (on > 1) throw bad_knob(knob, value, "must be 0 or 1");
    if constexpr (!System::compiled_out) system.set_async_mm_teardown(on == 1);
  } else if (knob == knob_swap_async_release) {
    const std::uint64_t on = parse(knob, value);
    if (on > 1) throw bad_knob(knob, value, "must be 0 or 1");
    system.set_swap_async_release(on == 1);
  } else if (knob == knob_thresh) {
    system.set_thresh_pages(parse(knob, value));
  } else if (knob == knob_max_pending) {
    system.set_max_pending_pages(parse(knob, value));
  } else if (knob == knob_min_concurrent) {
    system.set_min_concurrent_exits(parse(knob, value));
  } else {
    throw std::invalid_argument("teardown::model: unknown knob \"" + std::string(knob) + "\"");
  }
}

// basic_mm_system::get: the knob's value as text, no newline.
template <class System>
std::string sysctl_get(const System& system, std::string_view knob) {
  if (knob == knob_oom_reap_direction) return to_string(system.oom_reap_direction());
  if (knob == knob_enabled && !System::compiled_out) return system.async_mm_teardown() ? "1" : "0";
  if (knob == knob_thresh) return std::to_string(system.thresh_pages());
  if (knob == knob_max_pending) return std::to_string(system.max_pending());
  if (knob == knob_min_concurrent) return std::to_string(system.min_concurrent_exits());
  if (knob == knob_swap_async_release) return system.swap_async_release() ? "1" : "0";
  throw std::invalid_argument("teardown::model: unknown knob \"" + std::string(knob) + "\"");
}

}  // namespace detail

}  // namespace teardown::model
