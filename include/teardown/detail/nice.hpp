// teardown/detail/nice.hpp — the nice range setpriority(2) accepts, checked once for every
// option and setter that takes a nice value (reaper, pool, compositions, process.hpp's helper).
// Internal: not part of the API. Includes nothing: process.hpp keeps its footprint small.
//
// Who may call what: any thread; constexpr.
// Design: docs/design.md, "The shared internal layer".
#pragma once

namespace teardown::detail {

// The nice values setpriority(2) accepts.
inline constexpr int min_nice = -20;
inline constexpr int max_nice = 19;
constexpr bool valid_nice(int value) noexcept { return value >= min_nice && value <= max_nice; }

}  // namespace teardown::detail
