// Specification of deferred_domain::unmap and async_munmap in chunks (teardown/deferred/domain.hpp,
// "Chunks"): a range longer than unmap_chunk is queued as one item per chunk, put as one unit
// (one reservation of the whole charge, all chunks or none); every page is unmapped exactly once
// and nothing past the range; the option is validated; the threshold, the toggle and the cap
// judge the whole range; a drain (and a waiting flush that helps) reaches the chunks a frozen
// or busy reaper has not started; a node allocation that fails midway leaves the rest to one
// inline munmap; stats and trace events count and name each chunk.
//
// "Not unmapped yet" is shown by freezing the reaper (or keeping it busy in an earlier item),
// never by timing. Each range is a mapping of a memfd of its own, between two guard pages of the
// same file that must stay mapped; where each page stands is read from /proc/self/maps: a page
// is still mapped while a mapping of that file covers it. (Not "nothing is mapped there": once
// a page is unmapped, any thread of the process, the sanitizers' runtimes included, may map
// something of its own into the hole.)
#include "teardown/deferred.hpp"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <latch>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "reaper_test_support.hpp"
#include "test_support.hpp"

namespace teardown_test {
namespace {

using reaper_support::current_test_name;
using reaper_support::hang_guard;
using reaper_support::wait_until;
using reaper_support::wait_until_asleep;
using teardown::decision;
using teardown::deferred_domain;
namespace trace = teardown::trace;

constexpr std::uint64_t mib = std::uint64_t{1} << 20;

using teardown_test::under_thread_sanitizer;

std::size_t page() { return teardown::detail::page_size(); }

class DeferredMunmapTest : public ::testing::Test {
 protected:
  void TearDown() override {
    teardown::detail::fail_next_node_allocations = 0;
    teardown::detail::node_allocations_before_failing = 0;
  }

 private:
  hang_guard guard_{current_test_name()};
};
using DeferredMunmapStressTest = DeferredMunmapTest;

// A domain of its own (own reaper, own budget: pending is this domain's alone), cutting ranges
// into `chunk` bytes; threshold 1 so that any range queues unless a test says otherwise.
teardown::deferred_domain_options options(std::size_t chunk) {
  teardown::deferred_domain_options opts = deferred_domain::default_options();
  opts.reaper.name = "munmap_test";
  opts.sync_when_stalled = false;  // a frozen reaper must not turn "queued" into "stalled"
  opts.shared_budget = nullptr;
  opts.threshold = 1;
  opts.unmap_chunk = chunk;
  return opts;
}

// The pages of the process's address space that a mapping of the file with this inode covers,
// as [begin, end) address ranges (/proc/self/maps; its device is the memfd's, on tmpfs).
std::vector<std::pair<std::uintptr_t, std::uintptr_t>> mappings_of(ino_t inode) {
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> found;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    std::istringstream fields(line);
    std::string range, perms, offset, device;
    unsigned long long ino = 0;
    if (!(fields >> range >> perms >> offset >> device >> ino) || ino != inode) continue;
    const std::size_t dash = range.find('-');
    found.emplace_back(std::stoull(range.substr(0, dash), nullptr, 16),
                       std::stoull(range.substr(dash + 1), nullptr, 16));
  }
  return found;
}

// `length` bytes (rounded up to pages) of a memfd of its own, mapped shared and touched unless
// told otherwise, between two guard pages of the same mapping. The destructor unmaps only the
// guards: the range itself is the domain's to unmap, and once unmapped its addresses may belong
// to someone else. The file's pages go with its descriptor, closed there too.
class region {
 public:
  explicit region(std::size_t length, bool touch = true) : length_(length), pages_((length + page() - 1) / page()) {
    fd_ = static_cast<int>(syscall(SYS_memfd_create, "munmap_test", 0));
    if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "memfd_create");
    struct stat st{};
    if (ftruncate(fd_, static_cast<off_t>((pages_ + 2) * page())) != 0 || fstat(fd_, &st) != 0) {
      throw std::system_error(errno, std::generic_category(), "ftruncate/fstat");
    }
    inode_ = st.st_ino;
    void* base = mmap(nullptr, (pages_ + 2) * page(), PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (base == MAP_FAILED) throw std::system_error(errno, std::generic_category(), "mmap");
    base_ = static_cast<char*>(base);
    base_[0] = 1;
    base_[(pages_ + 1) * page()] = 1;
    if (touch) {
      for (std::size_t i = 0; i < pages_; ++i) addr()[i * page()] = 1;
    }
  }
  region(const region&) = delete;
  region& operator=(const region&) = delete;
  ~region() {
    (void)munmap(base_, page());
    (void)munmap(base_ + (pages_ + 1) * page(), page());
    (void)close(fd_);
  }

  char* addr() const { return base_ + page(); }
  std::size_t length() const { return length_; }
  std::size_t pages() const { return pages_; }
  std::size_t bytes() const { return pages_ * page(); }

  // Pages [first, last) of the range still mapped to the file.
  std::size_t mapped_pages(std::size_t first, std::size_t last) const {
    const auto mappings = mappings_of(inode_);
    std::size_t count = 0;
    for (std::size_t i = first; i < last; ++i) count += covered(mappings, addr() + i * page()) ? 1 : 0;
    return count;
  }
  std::size_t unmapped_pages(std::size_t first, std::size_t last) const {
    return (last - first) - mapped_pages(first, last);
  }
  std::size_t mapped_pages() const { return mapped_pages(0, pages_); }
  bool all_unmapped() const { return unmapped_pages(0, pages_) == pages_; }
  bool guards_mapped() const {
    const auto mappings = mappings_of(inode_);
    return covered(mappings, base_) && covered(mappings, base_ + (pages_ + 1) * page());
  }

 private:
  static bool covered(const std::vector<std::pair<std::uintptr_t, std::uintptr_t>>& mappings, const char* at) {
    const auto where = reinterpret_cast<std::uintptr_t>(at);
    return std::any_of(mappings.begin(), mappings.end(),
                       [&](const auto& m) { return m.first <= where && where < m.second; });
  }

  std::size_t length_;
  std::size_t pages_;
  int fd_ = -1;
  ino_t inode_ = 0;
  char* base_ = nullptr;
};

// Every page gone, both guards still there.
void expect_exactly_unmapped(const region& r) {
  EXPECT_TRUE(r.all_unmapped()) << r.mapped_pages() << " of " << r.pages() << " pages still mapped";
  EXPECT_TRUE(r.guards_mapped()) << "a munmap strayed past the range";
}

// An object whose destructor reports that it started and then waits: a reaper kept busy.
struct blocker {
  std::atomic<bool>* started;
  std::latch* release;
  ~blocker() {
    started->store(true);
    release->wait();
  }
  friend std::uint64_t teardown_cost(const blocker&) { return mib; }
};

// --- the option --------------------------------------------------------------------------------

TEST_F(DeferredMunmapTest, ChunkIsEightMibByDefaultAndMustBeWholePages) {
  EXPECT_EQ(deferred_domain::default_unmap_chunk, 8 * mib);
  EXPECT_EQ(deferred_domain::default_options().unmap_chunk, 8 * mib);
  EXPECT_EQ(teardown::deferred::default_domain().unmap_chunk(), 8 * mib);
  for (const std::size_t bad : {std::size_t{1}, page() - 1, page() + 1, 3 * page() / 2}) {
    EXPECT_THROW(deferred_domain{options(bad)}, std::invalid_argument) << bad;
  }
  EXPECT_EQ(deferred_domain{options(0)}.unmap_chunk(), 0u) << "0: never cut";
  EXPECT_EQ(deferred_domain{options(2 * page())}.unmap_chunk(), 2 * page());
}

// --- where the chunks begin and end ------------------------------------------------------------

TEST_F(DeferredMunmapTest, ChunkBoundariesCoverTheRangeOnceAndNothingPastIt) {
  const std::size_t chunk = 4 * page();
  struct shape {
    std::size_t length;
    std::uint64_t chunks;
  };
  const shape shapes[] = {
      {chunk, 1},                   // exactly one chunk: not cut
      {chunk + 1, 2},               // one byte more: a second chunk of one partial page
      {3 * chunk, 3},               // a multiple of the chunk
      {3 * chunk + page(), 4},      // one page more
      {3 * chunk + 100, 4},         // a tail that is not a multiple of the page
      {2 * page() - 1, 1},          // shorter than a chunk, not a multiple of the page
  };
  for (const shape& s : shapes) {
    SCOPED_TRACE("length " + std::to_string(s.length));
    region r(s.length);
    deferred_domain domain(options(chunk));
    domain.freeze();
    EXPECT_EQ(domain.unmap(r.addr(), r.length()), decision::queued);
    teardown::deferred_stats stats = domain.stats();
    EXPECT_EQ(stats.queued, s.chunks);
    EXPECT_EQ(stats.pending, r.bytes()) << "the whole range's charge, rounded up to pages";
    EXPECT_EQ(r.mapped_pages(), r.pages()) << "nothing unmapped while the reaper is frozen";
    domain.thaw();
    domain.flush();
    stats = domain.stats();
    EXPECT_EQ(stats.reaped, s.chunks);
    EXPECT_EQ(stats.pending, 0u);
    EXPECT_EQ(stats.errors, 0u);
    EXPECT_EQ(stats.inline_total, 0u);
    expect_exactly_unmapped(r);
  }
}

TEST_F(DeferredMunmapTest, ALongRangeIsCutIntoAtMostMaxUnmapChunks) {
  constexpr std::size_t max = deferred_domain::max_unmap_chunks;
  struct shape {
    std::size_t pages;
    std::uint64_t chunks;
  };
  const shape shapes[] = {
      {max, max},                // one page each: just at the limit
      {max + 1, (max + 2) / 2},  // one more: two pages each
      {2 * max + 3, 684},        // three pages each: ceil((2 * 1024 + 3) / 3)
  };
  for (const shape& s : shapes) {
    SCOPED_TRACE(std::to_string(s.pages) + " pages");
    region r(s.pages * page(), /*touch=*/false);
    deferred_domain domain(options(page()));
    domain.freeze();
    EXPECT_EQ(domain.unmap(r.addr(), r.length()), decision::queued);
    EXPECT_EQ(domain.stats().queued, s.chunks);
    EXPECT_LE(domain.stats().queued, max);
    EXPECT_EQ(domain.stats().pending, r.bytes());
    domain.thaw();
    domain.flush();
    EXPECT_EQ(domain.stats().reaped, s.chunks);
    expect_exactly_unmapped(r);
  }
}

TEST_F(DeferredMunmapTest, AsyncMunmapCutsThroughTheDefaultDomain) {
  region r(20 * mib);  // 8 + 8 + 4 MiB
  teardown::deferred::flush();
  const teardown::deferred_stats before = teardown::deferred::stats();
  EXPECT_EQ(teardown::async_munmap(r.addr(), r.length()), decision::queued);
  teardown::deferred::flush();
  const teardown::deferred_stats after = teardown::deferred::stats();
  EXPECT_EQ(after.queued - before.queued, 3u);
  EXPECT_EQ(after.reaped - before.reaped, 3u);
  expect_exactly_unmapped(r);
}

// --- the whole range is judged before it is cut ------------------------------------------------

TEST_F(DeferredMunmapTest, TheThresholdJudgesTheWholeRangeNotEachChunk) {
  const std::size_t chunk = 4 * page();
  teardown::deferred_domain_options opts = options(chunk);
  opts.threshold = 2 * chunk;  // above every chunk
  deferred_domain domain(opts);
  domain.freeze();
  region big(3 * chunk);
  EXPECT_EQ(domain.unmap(big.addr(), big.length()), decision::queued) << "each chunk is below the threshold";
  EXPECT_EQ(domain.stats().queued, 3u);
  EXPECT_EQ(big.mapped_pages(), big.pages());
  region small(2 * chunk - page());
  EXPECT_EQ(domain.unmap(small.addr(), small.length()), decision::inline_ineligible);
  EXPECT_TRUE(small.all_unmapped()) << "below the threshold: unmapped here, while the reaper is frozen";
  teardown::deferred_stats stats = domain.stats();
  EXPECT_EQ(stats.inline_small, 1u) << "one item: not cut";
  EXPECT_EQ(stats.inline_total, 1u);
  domain.thaw();
  domain.flush();
  stats = domain.stats();
  EXPECT_EQ(stats.reaped, 3u);
  expect_exactly_unmapped(big);
  expect_exactly_unmapped(small);
}

TEST_F(DeferredMunmapTest, DisabledOrLongerThanTheCapIsOneInlineItem) {
  const std::size_t chunk = 4 * page();
  teardown::deferred_domain_options opts = options(chunk);
  opts.max_pending = 8 * page();
  deferred_domain domain(opts);
  // Every region first: a later mmap could land in the hole an earlier unmap left.
  region off(3 * chunk);
  region over(3 * chunk);  // 12 pages against a cap of 8
  region fits(2 * chunk);  // just the cap
  domain.freeze();

  domain.disable();
  EXPECT_EQ(domain.unmap(off.addr(), off.length()), decision::inline_disabled);
  EXPECT_TRUE(off.all_unmapped());
  EXPECT_EQ(domain.stats().inline_total, 1u);
  domain.enable();

  EXPECT_EQ(domain.unmap(over.addr(), over.length()), decision::inline_rejected);
  EXPECT_TRUE(over.all_unmapped()) << "refused by the budget: unmapped here";
  teardown::deferred_stats stats = domain.stats();
  EXPECT_EQ(stats.inline_rejected, 1u) << "longer than the cap: one item, never cut";
  EXPECT_EQ(stats.inline_total, 2u);
  EXPECT_EQ(stats.queued, 0u);

  EXPECT_EQ(domain.unmap(fits.addr(), fits.length()), decision::queued);
  stats = domain.stats();
  EXPECT_EQ(stats.queued, 2u);
  EXPECT_EQ(stats.pending, 8 * page());
  domain.thaw();
  domain.flush();
  EXPECT_EQ(domain.stats().pending, 0u);
  expect_exactly_unmapped(off);
  expect_exactly_unmapped(over);
  expect_exactly_unmapped(fits);
}

TEST_F(DeferredMunmapTest, TheBudgetTakesEveryChunkOrNone) {
  const std::size_t chunk = 4 * page();
  teardown::deferred_domain_options opts = options(chunk);
  opts.max_pending = 32 * page();
  deferred_domain domain(opts);
  // Every region first: a later mmap could land in the hole an earlier unmap left.
  region first(3 * chunk);
  region refused(6 * chunk);
  region fits(5 * chunk);
  domain.freeze();
  EXPECT_EQ(domain.unmap(first.addr(), first.length()), decision::queued);
  EXPECT_EQ(domain.stats().pending, 12 * page());

  // 24 more pages do not fit beside 12 under 32, though five of its six chunks would.
  EXPECT_EQ(domain.unmap(refused.addr(), refused.length()), decision::inline_rejected);
  EXPECT_TRUE(refused.all_unmapped()) << "every chunk unmapped here, while the reaper is frozen";
  teardown::deferred_stats stats = domain.stats();
  EXPECT_EQ(stats.queued, 3u) << "no chunk of the refused range queued";
  EXPECT_EQ(stats.pending, 12 * page());
  EXPECT_EQ(stats.inline_rejected, 6u) << "refused by put: one count per chunk";
  EXPECT_EQ(stats.inline_total, 6u);

  // 12 + 20 = 32: exactly the cap.
  EXPECT_EQ(domain.unmap(fits.addr(), fits.length()), decision::queued);
  stats = domain.stats();
  EXPECT_EQ(stats.queued, 8u);
  EXPECT_EQ(stats.pending, 32 * page());
  domain.thaw();
  domain.flush();
  stats = domain.stats();
  EXPECT_EQ(stats.reaped, 8u);
  EXPECT_EQ(stats.pending, 0u);
  EXPECT_EQ(stats.high_water, 32 * page());
  expect_exactly_unmapped(first);
  expect_exactly_unmapped(refused);
  expect_exactly_unmapped(fits);
}

TEST_F(DeferredMunmapTest, ChunksAreChargedWhatTheWholeRangeIs) {
  const std::size_t length = 13 * page() - 100;
  for (const std::size_t chunk : {std::size_t{0}, 4 * page(), page()}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    deferred_domain domain(options(chunk));
    region r(length);
    domain.freeze();
    EXPECT_EQ(domain.unmap(r.addr(), r.length()), decision::queued);
    EXPECT_EQ(domain.stats().pending, 13 * page());
    EXPECT_EQ(domain.stats().high_water, 13 * page());
    domain.thaw();
    domain.flush();
    EXPECT_EQ(domain.stats().pending, 0u);
    expect_exactly_unmapped(r);
  }
}

// --- sharing the work --------------------------------------------------------------------------

// While the reaper is frozen, a drain is offered every chunk, lowest first, and takes what fits;
// the same range as one item could only be taken whole.
TEST_F(DeferredMunmapTest, ADrainTakesSomeChunksOfARangeWhileTheReaperIsFrozen) {
  const std::size_t chunk = 16 * page();
  {
    deferred_domain domain(options(chunk));
    region r(5 * chunk);
    domain.freeze();
    EXPECT_EQ(domain.unmap(r.addr(), r.length()), decision::queued);
    EXPECT_EQ(domain.drain(chunk - page()).items, 0u) << "no chunk fits";
    const teardown::drain_result drained = domain.drain(2 * chunk);
    EXPECT_EQ(drained.items, 2u);
    EXPECT_EQ(drained.cost, 2 * chunk);
    EXPECT_EQ(r.unmapped_pages(0, 32), 32u) << "the two lowest chunks, on this thread";
    EXPECT_EQ(r.mapped_pages(32, r.pages()), r.pages() - 32) << "the rest waits for the reaper";
    teardown::deferred_stats stats = domain.stats();
    EXPECT_EQ(stats.drained, 2u);
    EXPECT_EQ(stats.reaped, 2u);
    EXPECT_EQ(stats.pending, 3 * chunk);
    domain.thaw();
    domain.flush();
    stats = domain.stats();
    EXPECT_EQ(stats.reaped, 5u);
    EXPECT_EQ(stats.drained, 2u);
    EXPECT_EQ(stats.pending, 0u);
    expect_exactly_unmapped(r);
  }
  {
    deferred_domain whole(options(0));
    region r(5 * chunk);
    whole.freeze();
    EXPECT_EQ(whole.unmap(r.addr(), r.length()), decision::queued);
    EXPECT_EQ(whole.drain(2 * chunk).items, 0u) << "one item of five chunks' charge";
    EXPECT_EQ(r.mapped_pages(), r.pages());
    whole.thaw();
    whole.flush();
    expect_exactly_unmapped(r);
  }
}

// The reaper is busy with an earlier item (a destructor that waits): the chunks queued behind it
// are not the reaper's yet, and a drain unmaps them on the caller while the reaper still holds it.
TEST_F(DeferredMunmapTest, ADrainUnmapsTheChunksABusyReaperHasNotTaken) {
  const std::size_t chunk = 16 * page();
  deferred_domain domain(options(chunk));
  std::atomic<bool> started{false};
  std::latch release(1);
  EXPECT_EQ(domain.delete_object(new blocker{&started, &release}), decision::queued);
  wait_until(started);  // the reaper's batch held only the blocker
  region r(5 * chunk);
  EXPECT_EQ(domain.unmap(r.addr(), r.length()), decision::queued);
  const teardown::drain_result drained = domain.drain(3 * chunk);
  EXPECT_EQ(drained.items, 3u);
  EXPECT_EQ(r.unmapped_pages(0, 48), 48u) << "the three lowest chunks, here, while the reaper is busy";
  EXPECT_EQ(r.mapped_pages(48, r.pages()), r.pages() - 48);
  release.count_down();
  domain.flush();
  const teardown::deferred_stats stats = domain.stats();
  EXPECT_EQ(stats.queued, 6u);
  EXPECT_EQ(stats.reaped, 6u);
  EXPECT_EQ(stats.drained, 3u);
  EXPECT_EQ(stats.pending, 0u);
  expect_exactly_unmapped(r);
}

// The same busy reaper, and a flush that waits for it: the waiter tears the queued chunks down
// itself (the reaper runs at nice 0, so no raise can be in force and the waiter helps), and
// every chunk is gone while the reaper is still held by the blocker. (The same range as one
// item would be helped the same way here: what chunks add is shown by the drain tests.)
TEST_F(DeferredMunmapTest, AWaitingFlushUnmapsTheChunksABusyReaperHasNotTaken) {
  using namespace std::chrono_literals;
  const std::size_t chunk = 16 * page();
  teardown::deferred_domain_options opts = options(chunk);
  opts.reaper.waiters_help = true;  // the default; said here because the test is about it
  opts.reaper.nice = 0;
  opts.reaper.boost_after = 1ms;
  deferred_domain domain(opts);
  std::atomic<bool> started{false};
  std::latch release(1);
  EXPECT_EQ(domain.delete_object(new blocker{&started, &release}), decision::queued);
  wait_until(started);
  region r(5 * chunk);
  EXPECT_EQ(domain.unmap(r.addr(), r.length()), decision::queued);
  std::atomic<bool> flushed{false};
  std::thread flusher([&] {
    domain.flush();
    flushed.store(true);
  });
  while (!r.all_unmapped()) std::this_thread::sleep_for(1ms);  // the hang guard bounds it
  EXPECT_FALSE(flushed.load()) << "the flush still waits for the blocker";
  release.count_down();
  flusher.join();
  const teardown::deferred_stats stats = domain.stats();
  EXPECT_EQ(stats.reaped, 6u);
  EXPECT_EQ(stats.drained, 0u) << "helped, not drained";
  EXPECT_EQ(stats.pending, 0u);
  expect_exactly_unmapped(r);
}

// The reaper took the blocker and every chunk as one batch: while it holds them no drain reaches
// them. A freeze that lands while the blocker runs hands the rest back, and a drain then takes
// the low chunks.
TEST_F(DeferredMunmapTest, AFreezeHandsBackTheChunksOfTheReapersBatchToADrain) {
  const std::size_t chunk = 16 * page();
  deferred_domain domain(options(chunk));
  std::atomic<bool> started{false};
  std::latch release(1);
  region r(5 * chunk);
  domain.freeze();
  EXPECT_EQ(domain.delete_object(new blocker{&started, &release}), decision::queued);
  EXPECT_EQ(domain.unmap(r.addr(), r.length()), decision::queued);
  domain.thaw();
  wait_until(started);  // the reaper holds the blocker and the five chunks behind it
  EXPECT_EQ(domain.drain(std::numeric_limits<std::uint64_t>::max()).items, 0u)
      << "chunks in the reaper's batch are out of a drain's reach";
  std::atomic<pid_t> freezer_tid{0};
  std::thread freezer([&] {
    freezer_tid.store(static_cast<pid_t>(syscall(SYS_gettid)));
    domain.freeze();
  });
  while (freezer_tid.load() == 0) std::this_thread::yield();
  wait_until_asleep(freezer_tid.load());  // in freeze(), waiting for the blocker to end
  release.count_down();
  freezer.join();  // parked after the blocker, the rest of its batch handed back
  EXPECT_EQ(r.mapped_pages(), r.pages()) << "no chunk started before the freeze";
  const teardown::drain_result drained = domain.drain(2 * chunk);
  EXPECT_EQ(drained.items, 2u);
  EXPECT_EQ(r.unmapped_pages(0, 32), 32u) << "the two lowest chunks, while the reaper is frozen";
  EXPECT_EQ(r.mapped_pages(32, r.pages()), r.pages() - 32);
  domain.thaw();
  domain.flush();
  EXPECT_EQ(domain.stats().reaped, 6u);
  EXPECT_EQ(domain.stats().pending, 0u);
  expect_exactly_unmapped(r);
}

// --- no memory for a node ----------------------------------------------------------------------

TEST_F(DeferredMunmapTest, ANodeAllocationThatFailsMidwayLeavesTheRestToOneInlineMunmap) {
  const std::size_t chunk = 16 * page();
  deferred_domain domain(options(chunk));
  region r(5 * chunk);
  domain.freeze();
  teardown::detail::node_allocations_before_failing = 2;
  teardown::detail::fail_next_node_allocations = 1;
  EXPECT_EQ(domain.unmap(r.addr(), r.length()), decision::queued) << "the first two chunks";
  EXPECT_EQ(teardown::detail::fail_next_node_allocations, 0u) << "the third allocation failed";
  EXPECT_EQ(r.mapped_pages(0, 32), 32u) << "the two queued chunks wait for the reaper";
  EXPECT_EQ(r.unmapped_pages(32, r.pages()), r.pages() - 32) << "the rest, unmapped here";
  teardown::deferred_stats stats = domain.stats();
  EXPECT_EQ(stats.queued, 2u);
  EXPECT_EQ(stats.inline_no_memory, 1u) << "the rest is one item";
  EXPECT_EQ(stats.inline_total, 1u);
  EXPECT_EQ(stats.pending, 2 * chunk) << "only the queued chunks are charged";
  domain.thaw();
  domain.flush();
  stats = domain.stats();
  EXPECT_EQ(stats.reaped, 2u);
  EXPECT_EQ(stats.pending, 0u);
  expect_exactly_unmapped(r);
}

TEST_F(DeferredMunmapTest, NoNodeForTheFirstChunkUnmapsTheWholeRangeInline) {
  const std::size_t chunk = 16 * page();
  deferred_domain domain(options(chunk));
  region r(5 * chunk);
  domain.freeze();
  teardown::detail::fail_next_node_allocations = 1;
  EXPECT_EQ(domain.unmap(r.addr(), r.length()), decision::inline_no_memory);
  EXPECT_TRUE(r.all_unmapped());
  const teardown::deferred_stats stats = domain.stats();
  EXPECT_EQ(stats.queued, 0u);
  EXPECT_EQ(stats.inline_no_memory, 1u);
  EXPECT_EQ(stats.inline_total, 1u);
  EXPECT_EQ(stats.pending, 0u);
  domain.thaw();
  expect_exactly_unmapped(r);
}

// The chunks built before the failure fall below the threshold: they go inline too.
TEST_F(DeferredMunmapTest, ChunksBuiltBeforeAFailureAreStillJudgedByTheThreshold) {
  const std::size_t chunk = 16 * page();
  teardown::deferred_domain_options opts = options(chunk);
  opts.threshold = 3 * chunk;
  deferred_domain domain(opts);
  region r(5 * chunk);
  domain.freeze();
  teardown::detail::node_allocations_before_failing = 2;
  teardown::detail::fail_next_node_allocations = 1;
  EXPECT_EQ(domain.unmap(r.addr(), r.length()), decision::inline_ineligible);
  EXPECT_TRUE(r.all_unmapped());
  const teardown::deferred_stats stats = domain.stats();
  EXPECT_EQ(stats.queued, 0u);
  EXPECT_EQ(stats.inline_no_memory, 1u);
  EXPECT_EQ(stats.inline_small, 2u) << "the two chunks, refused by put_chain's threshold on their sum";
  EXPECT_EQ(stats.inline_total, 3u);
  EXPECT_EQ(stats.pending, 0u);
  domain.thaw();
  expect_exactly_unmapped(r);
}

// The rest's inline munmap fails: the chunks built so far are freed, not queued, and nothing
// was unmapped (LeakSanitizer, in the asan build, sees a node left behind).
TEST_F(DeferredMunmapTest, AFailedInlineMunmapOfTheRestQueuesNothingAndLeaksNoNode) {
  if constexpr (sizeof(void*) < 8) GTEST_SKIP() << "needs a 64-bit address space";
  if (under_thread_sanitizer) GTEST_SKIP() << "ThreadSanitizer's munmap interceptor crashes on a non-user address";
  // Above every user address space Linux offers (57 bits): munmap fails with EINVAL.
  void* const kernel = reinterpret_cast<void*>(std::uintptr_t{0xff00'0000'0000'0000});
  const std::size_t chunk = 16 * page();
  deferred_domain domain(options(chunk));
  teardown::detail::node_allocations_before_failing = 2;
  teardown::detail::fail_next_node_allocations = 1;
  EXPECT_THROW(domain.unmap(kernel, 5 * chunk), std::system_error);
  domain.flush();
  const teardown::deferred_stats stats = domain.stats();
  EXPECT_EQ(stats.queued, 0u) << "the two chunks built before the failure were not put";
  EXPECT_EQ(stats.reaped, 0u);
  EXPECT_EQ(stats.errors, 0u);
  EXPECT_EQ(stats.pending, 0u);
  EXPECT_EQ(stats.inline_no_memory, 1u);
}

// --- trace events ------------------------------------------------------------------------------

template <class Event>
struct recorded {
  static inline std::mutex lock;
  static inline std::vector<Event> events;
  static void hook(const Event& event) {
    const std::lock_guard guard(lock);
    events.push_back(event);
  }
  // This domain's events since the last call.
  static std::vector<Event> take(std::uint64_t domain) {
    const std::lock_guard guard(lock);
    std::vector<Event> mine;
    for (const Event& e : events) {
      if (e.domain == domain) mine.push_back(e);
    }
    events.clear();
    return mine;
  }
};

template <class Event>
class hooked {
 public:
  hooked() {
    (void)recorded<Event>::take(0);
    trace::add_hook<Event>(&recorded<Event>::hook);
  }
  hooked(const hooked&) = delete;
  hooked& operator=(const hooked&) = delete;
  ~hooked() { (void)trace::remove_hook<Event>(&recorded<Event>::hook); }
};

// id -> cost, for events of one kind.
template <class Event, class Cost>
std::map<std::uint64_t, std::uint64_t> by_id(const std::vector<Event>& events, Cost cost) {
  std::map<std::uint64_t, std::uint64_t> costs;
  for (const Event& e : events) {
    EXPECT_EQ(costs.count(e.id), 0u) << "id " << e.id << " twice";
    costs[e.id] = cost(e);
  }
  return costs;
}

TEST_F(DeferredMunmapTest, EachChunkHasItsOwnQueueAndReapEventNamedByItsFirstAddress) {
  const hooked<trace::queue_event> queue_hook;
  const hooked<trace::reap_event> reap_hook;
  const hooked<trace::sync_event> sync_hook;
  const std::size_t chunk = 4 * page();
  deferred_domain domain(options(chunk));
  const std::uint64_t id = domain.trace_domain();
  region r(3 * chunk + 100);  // 4 + 4 + 4 + 1 pages
  const auto at = [&](std::size_t offset) { return reinterpret_cast<std::uintptr_t>(r.addr() + offset); };
  const std::map<std::uint64_t, std::uint64_t> expected = {
      {at(0), chunk}, {at(chunk), chunk}, {at(2 * chunk), chunk}, {at(3 * chunk), page()}};
  domain.freeze();
  EXPECT_EQ(domain.unmap(r.addr(), r.length()), decision::queued);
  EXPECT_EQ(by_id(recorded<trace::queue_event>::take(id), [](const trace::queue_event& e) { return e.cost; }),
            expected);
  domain.thaw();
  domain.flush();
  EXPECT_EQ(
      by_id(recorded<trace::reap_event>::take(id), [](const trace::reap_event& e) { return e.charged_cost; }),
      expected)
      << "each chunk reaped once, with the charge it was queued with";
  EXPECT_TRUE(recorded<trace::sync_event>::take(id).empty());
  expect_exactly_unmapped(r);

  // A node that cannot be allocated for the second chunk: one queue event for the first, one
  // sync event "no_memory" for the rest, named by its first address. Together: the range once.
  region s(3 * chunk + 100);
  teardown::detail::node_allocations_before_failing = 1;
  teardown::detail::fail_next_node_allocations = 1;
  domain.freeze();
  EXPECT_EQ(domain.unmap(s.addr(), s.length()), decision::queued);
  const auto queued = recorded<trace::queue_event>::take(id);
  ASSERT_EQ(queued.size(), 1u);
  EXPECT_EQ(queued[0].id, reinterpret_cast<std::uintptr_t>(s.addr()));
  EXPECT_EQ(queued[0].cost, chunk);
  const auto inline_events = recorded<trace::sync_event>::take(id);
  ASSERT_EQ(inline_events.size(), 1u);
  EXPECT_EQ(inline_events[0].id, reinterpret_cast<std::uintptr_t>(s.addr() + chunk));
  EXPECT_EQ(inline_events[0].cost, 2 * chunk + page());
  EXPECT_STREQ(inline_events[0].reason, "no_memory");
  domain.thaw();
  domain.flush();
  EXPECT_EQ(recorded<trace::reap_event>::take(id).size(), 1u);
  expect_exactly_unmapped(s);
}

// --- many threads ------------------------------------------------------------------------------

// Threads unmap ranges in chunks while another drains bits of the queue and another freezes and
// thaws the reaper: every chunk is reaped exactly once (by the reaper or a drain), without an
// error, and no munmap strays past its range.
TEST_F(DeferredMunmapStressTest, ChunksOfManyRangesAreUnmappedExactlyOnceWhileDrainsTakeSome) {
  const hooked<trace::queue_event> queue_hook;
  const hooked<trace::reap_event> reap_hook;
  const std::size_t chunk = 4 * page();
  deferred_domain domain(options(chunk));
  const std::uint64_t id = domain.trace_domain();
  constexpr std::size_t threads = 3;
  const std::size_t per_thread = scaled(60);
  std::vector<std::vector<std::unique_ptr<region>>> regions(threads);
  for (std::size_t t = 0; t < threads; ++t) {
    for (std::size_t i = 0; i < per_thread; ++i) {
      regions[t].push_back(std::make_unique<region>((i % 7 + 2) * chunk - (i % 3) * 100));
    }
  }
  std::atomic<bool> done{false};
  std::thread drainer([&] {
    std::uint64_t budget = chunk;
    while (!done.load()) {
      (void)domain.drain(budget);
      budget = budget % (8 * chunk) + chunk;
    }
  });
  std::thread freezer([&] {
    while (!done.load()) {
      domain.freeze();
      std::this_thread::yield();
      domain.thaw();
    }
  });
  std::vector<std::thread> producers;
  for (std::size_t t = 0; t < threads; ++t) {
    producers.emplace_back([&, t] {
      for (auto& r : regions[t]) EXPECT_EQ(domain.unmap(r->addr(), r->length()), decision::queued);
    });
  }
  for (auto& p : producers) p.join();
  done.store(true);
  drainer.join();
  freezer.join();
  domain.flush();
  const teardown::deferred_stats stats = domain.stats();
  EXPECT_EQ(stats.reaped, stats.queued);
  EXPECT_EQ(stats.inline_total, 0u);
  EXPECT_EQ(stats.errors, 0u);
  EXPECT_EQ(stats.pending, 0u);
  const auto queued = by_id(recorded<trace::queue_event>::take(id), [](const trace::queue_event& e) { return e.cost; });
  const auto reaped =
      by_id(recorded<trace::reap_event>::take(id), [](const trace::reap_event& e) { return e.charged_cost; });
  EXPECT_EQ(queued.size(), stats.queued);
  EXPECT_EQ(reaped, queued) << "every chunk reaped once";
  // Each range's guards are still there (no munmap strayed past a range). Its own pages are not
  // probed here: once unmapped, their addresses may be mapped again by any other mapping this
  // process makes meanwhile (ThreadSanitizer's runtime put 20 pages of its own into one such
  // hole); the single-threaded tests above probe them. That each chunk was unmapped once is
  // what the reap events, the stats and errors == 0 say.
  for (const auto& mine : regions) {
    for (const auto& r : mine) EXPECT_TRUE(r->guards_mapped());
  }
}

}  // namespace
}  // namespace teardown_test
