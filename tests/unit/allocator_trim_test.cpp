// teardown/allocator_trim.hpp and a deferred_domain's trim: the trimmer trims once the freed
// cost reaches `after` and at most once per `min_interval`; a domain trims on its reaper after a
// batch, never on a deleting thread, not in a drain and not after shutdown; a real malloc_trim
// gives a fragmented heap's free pages back (the resident set drops). The trimmer's protocol:
// a trim never consumes the count of memory not yet freed, what a drain freed is trimmed on
// the idle worker, and a stopped shared worker's inline teardowns never trim on the producer.
// Counts and thread ids are asserted, never durations (a bounded wait on a condition is a
// safety net only).
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "teardown/allocator_trim.hpp"
#include "teardown/async_teardown.hpp"
#include "teardown/deferred.hpp"

#include "reaper_test_support.hpp"
#include "test_support.hpp"

namespace teardown_test {
namespace {

using namespace std::chrono_literals;

pid_t current_tid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

// An injected trim: records the thread of every call.
struct trim_recorder {
  static inline std::mutex mutex;
  static inline std::condition_variable called;
  static inline std::vector<pid_t> callers;
  static int trim(std::size_t) {
    const std::lock_guard lock(mutex);
    callers.push_back(current_tid());
    called.notify_all();
    return 0;
  }
  // Waits until `n` calls were made; false if they were not within a generous bound (a safety
  // net for a test that fails: a passing test never reaches it).
  static bool wait_for(std::size_t n) {
    std::unique_lock lock(mutex);
    return called.wait_for(lock, 20s, [n] { return callers.size() >= n; });
  }
  static std::vector<pid_t> calls() {
    const std::lock_guard lock(mutex);
    return callers;
  }
  static void reset() {
    const std::lock_guard lock(mutex);
    callers.clear();
  }
};

class AllocatorTrimTest : public ::testing::Test {
 protected:
  void SetUp() override { trim_recorder::reset(); }
};

TEST_F(AllocatorTrimTest, TrimsOnceTheFreedCostReachesAfterAndAtMostOncePerInterval) {
  teardown::allocator_trimmer trimmer({.after = 100, .min_interval = 1h, .trim = &trim_recorder::trim});
  trimmer.freed(60);
  EXPECT_FALSE(trimmer.after_batch()) << "60 of 100 freed";
  trimmer.freed(40);
  EXPECT_TRUE(trimmer.after_batch());
  trimmer.freed(1000);
  EXPECT_FALSE(trimmer.after_batch()) << "within the interval of the last trim";
  EXPECT_EQ(trim_recorder::calls().size(), 1u);
  EXPECT_EQ(trimmer.stats().trims, 1u);
}

TEST_F(AllocatorTrimTest, WithoutAnIntervalEveryDueBatchTrimsAndTheCountStartsOver) {
  teardown::allocator_trimmer trimmer({.after = 10, .min_interval = 0ns, .trim = &trim_recorder::trim});
  trimmer.freed(10);
  EXPECT_TRUE(trimmer.after_batch());
  EXPECT_FALSE(trimmer.after_batch()) << "nothing freed since the trim";
  trimmer.freed(10);
  EXPECT_TRUE(trimmer.after_batch());
  EXPECT_EQ(trimmer.stats().trims, 2u);
}

TEST_F(AllocatorTrimTest, AfterZeroNeverTrims) {
  teardown::allocator_trimmer trimmer({.after = 0, .trim = &trim_recorder::trim});
  EXPECT_FALSE(trimmer.enabled());
  trimmer.freed(std::uint64_t{1} << 40);
  EXPECT_FALSE(trimmer.after_batch());
  EXPECT_TRUE(trim_recorder::calls().empty());
}

TEST_F(AllocatorTrimTest, BadOptionsAreRefusedNamingTheField) {
  try {
    teardown::allocator_trimmer trimmer({.after = 1, .min_interval = -1ns});
    ADD_FAILURE() << "a negative min_interval was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("trim.min_interval"), std::string::npos) << e.what();
  }
  try {
    teardown::allocator_trimmer trimmer({.after = 1, .trim = nullptr});
    ADD_FAILURE() << "a null trim was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("trim.trim"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(teardown::allocator_trimmer({.after = 0, .trim = nullptr})) << "off needs no function";
}

using buffer = std::vector<char>;

teardown::deferred_domain_options trimming_options(const char* name) {
  teardown::deferred_domain_options opts = teardown::deferred_domain::default_options();
  opts.reaper.name = name;
  opts.trim = {.after = 1, .min_interval = 0ns, .trim = &trim_recorder::trim};
  opts.cached_below = 0;  // the buffers are deferred by their bytes under every allocator
  return opts;
}

// The reaper's thread id, read from inside a destructor it runs.
struct tid_probe {
  std::atomic<pid_t>* where;
  explicit tid_probe(std::atomic<pid_t>* at) : where(at) {}
  tid_probe(const tid_probe&) = delete;
  tid_probe& operator=(const tid_probe&) = delete;
  ~tid_probe() { where->store(current_tid()); }
  char padding[1 << 17];  // above the threshold: queued
};

TEST_F(AllocatorTrimTest, ADomainTrimsOnItsReaperAfterABatchAndNeverOnADeletingThread) {
  teardown::deferred_domain domain(trimming_options("trim_reaper"));
  std::atomic<pid_t> reaper{0};
  teardown::deferred_deleter<tid_probe>{domain}(new tid_probe(&reaper));
  for (int i = 0; i < 8; ++i) teardown::deferred_deleter<buffer>{domain}(new buffer(std::size_t{1} << 20));
  domain.flush();
  ASSERT_NE(reaper.load(), 0);
  ASSERT_NE(reaper.load(), current_tid());
  // The batch-end call comes after the batch's last item: wait for it rather than for the flush.
  const auto give_up = std::chrono::steady_clock::now() + 30s;
  while (trim_recorder::calls().empty() && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(1ms);
  const std::vector<pid_t> calls = trim_recorder::calls();
  ASSERT_FALSE(calls.empty()) << "the reaper never trimmed after its batches";
  for (const pid_t caller : calls) EXPECT_EQ(caller, reaper.load()) << "a trim ran off the reaper";
  EXPECT_EQ(domain.stats().trim.trims, calls.size());
}

TEST_F(AllocatorTrimTest, NeitherADrainNorAnInlineDeleteAfterShutdownTrimsOnTheirThread) {
  teardown::deferred_domain domain(trimming_options("trim_drain"));
  domain.freeze();
  for (int i = 0; i < 8; ++i) teardown::deferred_deleter<buffer>{domain}(new buffer(std::size_t{1} << 20));
  EXPECT_EQ(domain.drain(std::uint64_t{1} << 40).items, 8u) << "the drain frees them on this thread";
  EXPECT_TRUE(trim_recorder::calls().empty()) << "the drain trimmed on its caller";
  domain.thaw();
  domain.stop();
  const std::size_t by_the_worker = trim_recorder::calls().size();  // the drain's memory, if it came first
  teardown::deferred_deleter<buffer>{domain}(new buffer(std::size_t{1} << 20));  // inline now
  const std::vector<pid_t> calls = trim_recorder::calls();
  EXPECT_EQ(calls.size(), by_the_worker) << "a trim ran after the stop";
  for (const pid_t caller : calls) EXPECT_NE(caller, current_tid()) << "a trim ran on the deleting thread";
  EXPECT_EQ(domain.stats().trim.trims, calls.size());
}

// An async_teardown item of a given cost whose destroy runs a hook (a gate).
struct costed_item {
  explicit costed_item(std::uint64_t of, std::function<void()> then = {}) : cost(of), on_destroy(std::move(then)) {}
  teardown::llist_node hook;
  std::uint64_t cost = 0;
  std::uint64_t charge = 0;
  std::function<void()> on_destroy;
};
struct costed_traits {
  std::uint64_t cost(const costed_item& item) const { return item.cost; }
  bool eligible(const costed_item&, std::uint64_t) const { return true; }
  void prepare(costed_item&) const {}
  void destroy(costed_item& item) const {
    if (item.on_destroy) item.on_destroy();
  }
  std::uint64_t& charge(costed_item& item) const { return item.charge; }
};
using costed_domain = teardown::async_teardown<costed_item, &costed_item::hook, costed_traits>;

// One thread opens it, others wait for it.
class test_gate {
 public:
  void open() {
    const std::lock_guard lock(mutex_);
    open_ = true;
    opened_.notify_all();
  }
  void wait() {
    std::unique_lock lock(mutex_);
    opened_.wait(lock, [this] { return open_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable opened_;
  bool open_ = false;
};

teardown::async_teardown_options costed_options(const char* name, std::uint64_t after) {
  teardown::async_teardown_options opts;
  opts.reaper.name = name;
  opts.trim = {.after = after, .min_interval = 0ns, .trim = &trim_recorder::trim};
  return opts;
}

// The schedule: a drain on another thread holds item a in its destroy (not yet freed) while the
// worker reaps b and trims. That trim cannot return a's memory, so it must not consume a's
// count: once a is freed, a's 100 and c's 1 reach `after` again and the worker trims a second
// time. (Counted before the destroy, a's 100 went with the first trim, and c's 1 alone never
// reaches 100.)
TEST_F(AllocatorTrimTest, ATrimBeforeAnItemIsFreedDoesNotConsumeItsCount) {
  costed_domain domain(costed_options("trim_count", 100));
  test_gate in_a;
  test_gate release_a;
  costed_item a(100, [&] {
    in_a.open();
    release_a.wait();
  });
  costed_item b(100);
  costed_item c(1);
  domain.freeze();
  ASSERT_EQ(domain.put(a), teardown::decision::queued);
  std::thread drainer([&] { EXPECT_EQ(domain.drain(1000).items, 1u); });
  in_a.wait();  // the drain holds a inside its destroy
  domain.thaw();
  ASSERT_EQ(domain.put(b), teardown::decision::queued);
  const bool first = trim_recorder::wait_for(1);
  release_a.open();
  drainer.join();
  ASSERT_TRUE(first) << "b's batch never trimmed";
  ASSERT_EQ(domain.put(c), teardown::decision::queued);
  domain.flush();
  EXPECT_TRUE(trim_recorder::wait_for(2)) << "a's count went with a trim that ran before a was freed";
  for (const pid_t caller : trim_recorder::calls()) EXPECT_NE(caller, current_tid());
}

// A flush settles: it returns once the worker trimmed what is left, though short of `after`
// (160), once that reaches the settle floor (after / 16 = 10); below the floor nothing.
TEST_F(AllocatorTrimTest, AFlushReturnsOnceTheWorkerTrimmedWhatIsLeftAboveTheSettleFloor) {
  costed_domain domain(costed_options("trim_settle", 160));
  costed_item small(9);
  ASSERT_EQ(domain.put(small), teardown::decision::queued);
  domain.flush();
  EXPECT_EQ(domain.stats().trim.trims, 0u) << "9 is below the floor of 10";
  costed_item a(50);
  ASSERT_EQ(domain.put(a), teardown::decision::queued);
  domain.flush();
  EXPECT_EQ(domain.stats().trim.trims, 1u) << "the flush returned with 59 freed and not trimmed";
  const std::vector<pid_t> calls = trim_recorder::calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_NE(calls.front(), current_tid()) << "the settle trimmed on the flushing thread";
  // Freed before the flush began, the worker long idle: the flush asks for the trim itself.
  costed_item b(20);
  costed_item after_b(0);
  const auto reaped = [&](std::uint64_t n) {
    const auto give_up = std::chrono::steady_clock::now() + 30s;  // a safety net only
    while (domain.stats().reaped < n && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(1ms);
    return domain.stats().reaped;
  };
  ASSERT_EQ(domain.put(b), teardown::decision::queued);
  ASSERT_EQ(reaped(3), 3u);
  // Put once b was reaped, so in a later batch: once it is reaped, b's batch end has run.
  ASSERT_EQ(domain.put(after_b), teardown::decision::queued);
  ASSERT_EQ(reaped(4), 4u);
  EXPECT_EQ(domain.stats().trim.trims, 1u) << "20 is short of after: no trim without a flush (are the flushes' "
                                              "settles closed?)";
  domain.flush();
  EXPECT_EQ(domain.stats().trim.trims, 2u) << "a flush that found nothing queued left 20 untrimmed";
  EXPECT_TRUE(domain.flush_for(10s));
  EXPECT_EQ(domain.stats().trim.trims, 2u) << "nothing freed since: nothing to trim";
}

// What an inline teardown freed (below the threshold here) is counted too, and trimmed on the
// worker, never on the producer, though nothing was ever queued: at the next flush (or the
// worker's next batch end), not at once.
TEST_F(AllocatorTrimTest, WhatAnInlineTeardownFreedIsTrimmedOnTheWorker) {
  teardown::async_teardown_options opts = costed_options("trim_inline", 100);
  opts.threshold = 1000;
  costed_domain domain(std::move(opts));
  costed_item a(60);
  costed_item b(40);
  ASSERT_EQ(domain.put(a), teardown::decision::inline_ineligible);
  ASSERT_EQ(domain.put(b), teardown::decision::inline_ineligible);
  EXPECT_TRUE(trim_recorder::calls().empty()) << "a producer's inline frees asked for a trim at once";
  domain.flush();
  ASSERT_EQ(trim_recorder::calls().size(), 1u) << "the flush returned with 100 freed inline untrimmed";
  EXPECT_NE(trim_recorder::calls().front(), current_tid()) << "the trim ran on the producer";
  EXPECT_EQ(domain.stats().queued, 0u);
}

// The same through a deferred_domain's small path, which frees without a node.
TEST_F(AllocatorTrimTest, ADeferredDomainsSmallFreesAreTrimmedOnItsReaper) {
  teardown::deferred_domain_options opts = trimming_options("trim_small");
  opts.threshold = std::uint64_t{1} << 30;
  opts.trim.after = std::uint64_t{4} << 20;
  teardown::deferred_domain domain(std::move(opts));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(domain.delete_object(new buffer(std::size_t{1} << 20)), teardown::decision::inline_ineligible);
  }
  domain.flush();
  ASSERT_EQ(trim_recorder::calls().size(), 1u) << "the flush returned with 4 MiB freed inline untrimmed";
  EXPECT_NE(trim_recorder::calls().front(), current_tid()) << "the trim ran on the deleting thread";
  EXPECT_EQ(domain.stats().inline_small, 4u);
}

// min_interval caps the batch ends' trims, not a flush's: the flush asked for its memory back.
TEST_F(AllocatorTrimTest, AFlushTrimsWithinMinInterval) {
  teardown::async_teardown_options opts = costed_options("trim_interval", 100);
  opts.trim.min_interval = 1h;
  costed_domain domain(std::move(opts));
  costed_item a(100);
  costed_item b(100);
  ASSERT_EQ(domain.put(a), teardown::decision::queued);
  domain.flush();
  ASSERT_EQ(domain.stats().trim.trims, 1u);
  ASSERT_EQ(domain.put(b), teardown::decision::queued);
  domain.flush();
  EXPECT_EQ(domain.stats().trim.trims, 2u) << "the interval held back the trim a flush waits for";
}

// Memory a drain freed on its caller is trimmed by the worker, though nothing more is queued.
TEST_F(AllocatorTrimTest, WhatADrainFreedIsTrimmedOnTheIdleWorker) {
  costed_domain domain(costed_options("trim_after_drain", 100));
  costed_item a(100);
  domain.freeze();
  ASSERT_EQ(domain.put(a), teardown::decision::queued);
  EXPECT_EQ(domain.drain(1000).items, 1u);
  EXPECT_TRUE(trim_recorder::calls().empty()) << "the drain trimmed on its caller";
  domain.thaw();
  ASSERT_TRUE(trim_recorder::wait_for(1)) << "the idle worker never trimmed what the drain freed";
  EXPECT_NE(trim_recorder::calls().front(), current_tid());
}

// A trim that pauses, the first time it is called, until the test has done what it wanted done
// between the worker's batch-end trim and the flush's return.
struct pausing_trim {
  static inline test_gate* entered = nullptr;
  static inline test_gate* resume = nullptr;
  static inline std::atomic<int> calls{0};
  static int trim(std::size_t pad) {
    const int done = trim_recorder::trim(pad);
    if (calls.fetch_add(1) == 0) {
      entered->open();
      resume->wait();
    }
    return done;
  }
};

// Memory freed inline on another thread while the worker trims for a flush (after the trim took
// its count) is still due when the flush's pass completes: the flush asks for one more batch end
// and returns (flush_for: true) only after that trim too. flush() and flush_for are one path
// with and without a deadline; each is checked.
void flush_waits_for_a_trim_of_what_was_freed_inline_during_its_settle(bool timed) {
  test_gate entered;
  test_gate resume;
  pausing_trim::entered = &entered;
  pausing_trim::resume = &resume;
  pausing_trim::calls.store(0);
  teardown::async_teardown_options opts = costed_options("trim_settle", 50);
  opts.trim.trim = &pausing_trim::trim;
  opts.threshold = 100;  // a: queued; c: torn down inline, its 60 counted for the worker to trim
  costed_domain domain(std::move(opts));
  costed_item a(100);
  costed_item c(60);
  domain.freeze();
  ASSERT_EQ(domain.put(a), teardown::decision::queued);
  std::atomic<bool> flushed_in_time{false};
  std::atomic<std::size_t> trims_at_return{0};
  std::atomic<pid_t> flusher_tid{0};
  std::thread flusher([&] {
    flusher_tid.store(current_tid());
    if (timed) {
      flushed_in_time.store(domain.flush_for(30s));
    } else {
      domain.flush();
      flushed_in_time.store(true);
    }
    trims_at_return.store(trim_recorder::calls().size());
  });
  while (flusher_tid.load() == 0) std::this_thread::sleep_for(1ms);
  reaper_support::wait_until_asleep(flusher_tid.load());  // in the flush, behind the freeze
  domain.thaw();  // the worker reaps a and, at its batch end, trims (and pauses in the trim)
  entered.wait();
  EXPECT_EQ(domain.put(c), teardown::decision::inline_ineligible);
  resume.open();
  flusher.join();
  EXPECT_TRUE(flushed_in_time.load()) << "everything queued was torn down; the flush gave up instead";
  EXPECT_EQ(trims_at_return.load(), 2u) << "the flush returned before the worker trimmed what c freed";
  for (const pid_t caller : trim_recorder::calls()) EXPECT_NE(caller, current_tid());
}

TEST_F(AllocatorTrimTest, AFlushWaitsForATrimOfWhatWasFreedInlineDuringItsSettle) {
  flush_waits_for_a_trim_of_what_was_freed_inline_during_its_settle(/*timed=*/false);
}

TEST_F(AllocatorTrimTest, AFlushForWaitsForATrimOfWhatWasFreedInlineDuringItsSettle) {
  flush_waits_for_a_trim_of_what_was_freed_inline_during_its_settle(/*timed=*/true);
}

// The same over a pool: the request reaches a worker of the pool.
TEST_F(AllocatorTrimTest, WhatADrainFreedIsTrimmedOnAnIdlePoolWorker) {
  using pool_domain = teardown::async_teardown<costed_item, &costed_item::hook, costed_traits,
                                               teardown::static_key, teardown::reaper_pool_workers>;
  teardown::async_teardown_options opts = costed_options("trim_pool_drain", 100);
  opts.pool.workers = 2;
  pool_domain domain(std::move(opts));
  costed_item a(100);
  domain.freeze();
  ASSERT_EQ(domain.put(a), teardown::decision::queued);
  EXPECT_EQ(domain.drain(1000).items, 1u);
  domain.thaw();
  ASSERT_TRUE(trim_recorder::wait_for(1)) << "no idle pool worker trimmed what the drain freed";
  EXPECT_NE(trim_recorder::calls().front(), current_tid());
}

// Once a shared worker has stopped, every sharer's puts are torn down on the putting thread:
// none of those teardowns trims there (nor anywhere: the worker is gone).
// On a shared worker too: what a sharer freed inline is trimmed at the worker's batch end (the
// sharers' batch ends, shared_worker::add_batch_end), and a flush settles there as well.
TEST_F(AllocatorTrimTest, ASharedWorkersSharerIsTrimmedForItsInlineFreesAndAtAFlush) {
  auto worker = std::make_shared<teardown::deferred_worker>();
  teardown::deferred_domain_options opts = trimming_options("trim_sharer");
  opts.worker = worker;
  opts.threshold = std::uint64_t{1} << 30;  // inline
  opts.trim.after = std::uint64_t{4} << 20;
  teardown::deferred_domain domain(std::move(opts));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(domain.delete_object(new buffer(std::size_t{1} << 20)), teardown::decision::inline_ineligible);
  }
  domain.flush();
  ASSERT_EQ(trim_recorder::calls().size(), 1u) << "4 MiB freed inline by a sharer were not trimmed by the flush";
  EXPECT_NE(trim_recorder::calls().front(), current_tid()) << "the trim ran on the deleting thread";
  domain.set_threshold(0);
  EXPECT_EQ(domain.delete_object(new buffer(std::size_t{1} << 20)), teardown::decision::queued);
  domain.flush();
  EXPECT_EQ(domain.stats().trim.trims, 2u) << "the flush returned with 1 MiB freed on the shared worker untrimmed";
  for (const pid_t caller : trim_recorder::calls()) EXPECT_NE(caller, current_tid());
}

TEST_F(AllocatorTrimTest, AStoppedSharedWorkersInlineTeardownsNeverTrim) {
  auto worker = std::make_shared<teardown::deferred_worker>();
  teardown::deferred_domain_options opts = trimming_options("trim_shared");
  opts.worker = worker;
  opts.threshold = 1;  // every buffer is put to the (stopped) worker
  teardown::deferred_domain domain(std::move(opts));
  worker->stop();
  for (int i = 0; i < 8; ++i) teardown::deferred_deleter<buffer>{domain}(new buffer(std::size_t{1} << 20));
  EXPECT_GE(domain.stats().reaped + domain.stats().inline_total, 8u);
  EXPECT_TRUE(trim_recorder::calls().empty()) << "a trim ran on the producer";
  EXPECT_EQ(domain.stats().trim.trims, 0u);
}

// A trim function that could call nothing (a negative return, as the default's under an
// allocator it does not know) is not a trim.
TEST_F(AllocatorTrimTest, ATrimThatCouldCallNothingIsNotCounted) {
  teardown::allocator_trimmer trimmer({.after = 10, .min_interval = 0ns, .trim = [](std::size_t) { return -1; }});
  trimmer.freed(10);
  EXPECT_FALSE(trimmer.after_batch());
  EXPECT_EQ(trimmer.stats().trims, 0u);
  EXPECT_EQ(trimmer.stats().trim_cpu_ns, 0u);
}


// Freed 64 KiB blocks between live small ones: glibc keeps them (none ends the heap), and only a
// trim gives their pages back; the same holds, with the allocator's own purge, under jemalloc and
// tcmalloc (the alloc_* runs).
TEST_F(AllocatorTrimTest, TheSystemTrimGivesAFragmentedHeapsFreePagesBack) {
  if (teardown_test::under_sanitizer) {
    GTEST_SKIP() << "the sanitizer's allocator serves malloc here: glibc's malloc_trim has no heap of ours to trim";
  }
  if (teardown::detect_allocator() == teardown::allocator_kind::other) {
    GTEST_SKIP() << "no purge known for this allocator: the default trim calls nothing";
  }
  if (teardown::detect_allocator() == teardown::allocator_kind::mimalloc) {
    GTEST_SKIP() << "mimalloc: the blocks the reaper frees go back to this thread's heap, which the reaper's purge "
                    "cannot collect (allocator_purge_test checks collect_here on this thread)";
  }
  teardown::deferred_domain_options opts = teardown::deferred_domain::default_options();
  opts.reaper.name = "trim_real";
  opts.threshold = 1;  // every block is queued
  opts.trim = {.after = 1, .min_interval = 0ns};
  teardown::deferred_domain domain(std::move(opts));
  constexpr std::size_t blocks = 1024;  // 64 MiB
  std::vector<std::unique_ptr<char[]>> keepers;
  std::vector<buffer*> freed;
  for (std::size_t i = 0; i < blocks; ++i) {
    auto* block = new buffer(std::size_t{64} << 10, 1);  // touched
    freed.push_back(block);
    keepers.emplace_back(new char[64]);  // keeps the block from merging into the heap's top
  }
  domain.freeze();  // one batch
  for (buffer* block : freed) teardown::deferred_deleter<buffer>{domain}(block);
  domain.thaw();
  domain.flush();
  const auto give_up = std::chrono::steady_clock::now() + 30s;
  while (domain.stats().trim.trims == 0 && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(1ms);
  const teardown::deferred_stats s = domain.stats();
  ASSERT_GE(s.trim.trims, 1u);
  EXPECT_GT(s.trim.trimmed_bytes, std::uint64_t{16} << 20)
      << "the resident set dropped by less than a quarter of the 64 MiB freed";
}

}  // namespace
}  // namespace teardown_test
