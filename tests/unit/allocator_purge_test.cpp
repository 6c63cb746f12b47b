// teardown/allocator_purge.hpp: the allocator that serves malloc is the one detected, and its
// purge, run by a deferred_domain's trimmer, gives a big structure's memory back. tests/
// CMakeLists.txt runs this program (with allocator_trim_test, deferred_test and
// async_teardown_test) a second time under each of jemalloc, tcmalloc and mimalloc, LD_PRELOADed,
// and the allocator LD_PRELOAD names is the one expected; without one, glibc's malloc (and
// under a sanitizer, whose allocator is none of the four, allocator_kind::other).
// Resident-set figures are asserted, never durations.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "teardown/allocator_purge.hpp"
#include "teardown/allocator_trim.hpp"
#include "teardown/deferred.hpp"

#include "test_support.hpp"

namespace teardown_test {
namespace {

using namespace std::chrono_literals;


// The allocator LD_PRELOAD names (tests/CMakeLists.txt preloads one Debian library at a time),
// else glibc's (none under a sanitizer).
std::string expected_allocator() {
  const char* preloaded = std::getenv("LD_PRELOAD");
  const std::string preload = preloaded != nullptr ? preloaded : "";
  for (const char* allocator : {"jemalloc", "tcmalloc", "mimalloc"}) {
    if (preload.find(allocator) != std::string::npos) return allocator;
  }
#if defined(__GLIBC__)
  // A sanitizer's allocator serves malloc under ASan and TSan.
  return teardown_test::under_sanitizer ? "other" : "glibc";
#else
  return "other";
#endif
}

TEST(AllocatorPurgeTest, TheDetectedAllocatorIsTheOneServingMalloc) {
  EXPECT_EQ(std::string(teardown::allocator_name()), expected_allocator());
  EXPECT_EQ(teardown::allocator_name(), teardown::allocator_name(teardown::detect_allocator()));
  EXPECT_EQ(teardown::detect_allocator(), teardown::detect_allocator()) << "looked up once";
}

TEST(AllocatorPurgeTest, ThePurgeCallsSomethingExactlyWhereAnAllocatorIsKnown) {
  const bool known = teardown::detect_allocator() != teardown::allocator_kind::other;
  EXPECT_EQ(teardown::detail::allocator_purge(0) >= 0, known);
  EXPECT_EQ(teardown::collect_here(), known);
}

// A big structure: many blocks of a few sizes, every page touched, with small live blocks
// between them (so that glibc cannot give them back by shrinking the heap's top).
struct structure {
  std::vector<std::unique_ptr<char[]>> blocks;
  std::size_t bytes = 0;
  friend std::uint64_t teardown_cost(const structure& s) { return s.bytes; }  // what it frees
};

// Builds `total` bytes of structure, hands it to a default domain and flushes: the resident set
// must come back within 5% of the garbage + 16 MiB of where it started, with the library's
// default options and nothing more from the test.
void expect_a_flushed_structure_leaves_the_resident_set_near_its_start(std::size_t total) {
  if (teardown::detect_allocator() == teardown::allocator_kind::other) {
    GTEST_SKIP() << "no purge known for this allocator (a sanitizer's, or none of glibc, jemalloc, tcmalloc, "
                    "mimalloc): the trimmer trims nothing";
  }
  if (teardown::detect_allocator() == teardown::allocator_kind::mimalloc) {
    // docs/guide.md's recipe for mimalloc: no decommit delay (MIMALLOC_DECOMMIT_DELAY=0; 15 is
    // mi_option_decommit_delay in mimalloc 2.0, mi_option_purge_delay from 2.1), so that a
    // collect gives free pages back at once rather than at some later allocation.
    using option_set = void (*)(int, long);
    auto* set = reinterpret_cast<option_set>(dlsym(RTLD_DEFAULT, "mi_option_set"));
    ASSERT_NE(set, nullptr);
    set(15, 0);
  }
  teardown::deferred_domain_options opts = teardown::deferred_domain::default_options();
  opts.reaper.name = "purge_rss";
  opts.threshold = 1;  // the warm-up structure is queued too; the trim options are the defaults
  teardown::deferred_domain domain(std::move(opts));
  // A first round warms the allocator up (its metadata, the worker's cache): what stays of it
  // is not this structure's garbage.
  const std::uint64_t start_rss = [&] {
    auto* warm = new structure;
    warm->blocks.emplace_back(new char[std::size_t{1} << 20]);
    teardown::deferred_deleter<structure>{domain}(warm);
    domain.flush();
    (void)teardown::collect_here();
    return teardown::detail::resident_bytes();
  }();
  ASSERT_NE(start_rss, 0u) << "/proc/self/statm unreadable";
  const std::uint64_t trims_before = domain.stats().trim.trims;

  auto* garbage = new structure;
  std::vector<std::unique_ptr<char[]>> keepers;
  constexpr std::size_t sizes[] = {std::size_t{4} << 10, std::size_t{16} << 10, std::size_t{64} << 10,
                                   std::size_t{256} << 10};
  for (std::size_t i = 0; garbage->bytes < total; ++i) {
    const std::size_t size = sizes[i % 4];
    garbage->blocks.emplace_back(new char[size]);
    std::memset(garbage->blocks.back().get(), 1, size);
    garbage->bytes += size;
    if (i % 16 == 0) keepers.emplace_back(new char[64]);
  }
  const std::uint64_t full_rss = teardown::detail::resident_bytes();
  ASSERT_GT(full_rss, start_rss + total / 2) << "the structure was not resident";

  teardown::deferred_deleter<structure>{domain}(garbage);  // freed on the reaper, then trimmed there
  // The flush returns once the reaper trimmed what is left (and, under mimalloc, this thread
  // collected what the reaper freed into its heap): no wait, no collect of the test's own.
  domain.flush();
  ASSERT_GT(domain.stats().trim.trims, trims_before) << "the flush returned before the reaper trimmed";
  const std::uint64_t end_rss = teardown::detail::resident_bytes();
  const std::uint64_t above = end_rss > start_rss ? end_rss - start_rss : 0;
  const std::uint64_t allowed = total / 20 + (std::uint64_t{16} << 20);
  EXPECT_LE(above, allowed) << teardown::allocator_name() << ": " << (above >> 20) << " MiB above the start of "
                            << (total >> 20) << " MiB freed (resident: start " << (start_rss >> 20) << " MiB, full "
                            << (full_rss >> 20) << " MiB, end " << (end_rss >> 20) << " MiB)";
  ::testing::Test::RecordProperty("allocator", teardown::allocator_name());
  ::testing::Test::RecordProperty("rss_above_start_kib", std::to_string(above >> 10));
}

// Above the trimmer's default `after` (64 MiB): trimmed at the batch's end.
TEST(AllocatorPurgeTest, ADeferredFreeOfABigStructureLeavesTheResidentSetNearWhereItStarted) {
  expect_a_flushed_structure_leaves_the_resident_set_near_its_start(std::size_t{128} << 20);
}

// Below it: trimmed because the flush settles (the trim floor is 4 MiB).
TEST(AllocatorPurgeTest, AFlushedStructureSmallerThanTheTrimmersAfterIsGivenBackToo) {
  expect_a_flushed_structure_leaves_the_resident_set_near_its_start(std::size_t{48} << 20);
}

}  // namespace
}  // namespace teardown_test
