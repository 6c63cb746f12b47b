// teardown/deferred/allocator_tuning.hpp — when deleting on the caller costs less than queuing,
// by the allocator that serves malloc: the defaults of deferred_domain_options' threshold,
// min_blocks and cached_below.
//
// What a free costs the caller depends on the allocator (allocator_matrix's sweeps, in
// docs/benchmarks.md, "Under other allocators"; ns per object, inline against handed over):
//   glibc     a big block's free returns its pages (a munmap, or a heap trim when many go at
//             once): 10,000 frees of 100 KiB cost 86 ms inline and 1 ms handed over. 64 KiB.
//   jemalloc  a free from 16 KiB up (its large size classes) costs microseconds: 16 KiB.
//   tcmalloc  keeps every freed block in its page heap, of any size: a free costs tens of
//             nanoseconds up to 64 MiB and 2 microseconds for 1 GiB, always less than queuing.
//             The size alone never defers a block: cached_below is unlimited.
//   mimalloc  keeps blocks up to 16 MiB (tens to hundreds of nanoseconds); a 64 MiB block goes
//             back to the system at its free (5 ms): cached_below 32 MiB.
// Under each, an object of many blocks (a node container) costs its blocks: from 16 blocks of
// 64 bytes deferring wins under glibc, jemalloc and tcmalloc, from 64 under mimalloc (at 16
// it loses some 20 ns there).
//
//     teardown::deferred_tuning t = teardown::deferred_tuning_for(teardown::detect_allocator());
//
// Who may call what: deferred_tuning_for, any thread, constexpr; default_deferred_tuning, any
// thread (its first call looks the allocator up: allocator_purge.hpp).
// Design: docs/design.md, "deferred.hpp: the threshold by allocator".
#pragma once

#include <cstdint>
#include <limits>

#include "teardown/allocator_purge.hpp"

namespace teardown {

/// The three defaults a deferred_domain_options takes from the allocator.
struct deferred_tuning {
  std::uint64_t threshold;     // bytes below which an object or a range is deleted inline
  std::uint64_t min_blocks;    // an object of at least this many blocks is deferred, whatever
                               // its bytes (deferred_blocks); 0: bytes only
  std::uint64_t cached_below;  // an object of known blocks under this many bytes is judged by
                               // its blocks alone: the allocator keeps blocks that size
};

constexpr deferred_tuning deferred_tuning_for(allocator_kind kind) noexcept {
  constexpr std::uint64_t kib = 1024;
  switch (kind) {
    case allocator_kind::jemalloc: return {16 * kib, 16, 0};
    case allocator_kind::tcmalloc: return {64 * kib, 16, std::numeric_limits<std::uint64_t>::max()};
    case allocator_kind::mimalloc: return {64 * kib, 64, 32 * kib * kib};
    case allocator_kind::glibc:
    case allocator_kind::other: break;
  }
  return {64 * kib, 16, 0};
}

/// The tuning of the allocator this process runs with.
inline deferred_tuning default_deferred_tuning() noexcept { return deferred_tuning_for(detect_allocator()); }

}  // namespace teardown
