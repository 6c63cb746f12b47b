// teardown/allocator_trim.hpp and a deferred_domain's trim: the trimmer trims once the freed
// cost reaches `after` and at most once per `min_interval`; a domain trims on its reaper after a
// batch, never on a deleting thread, not in a drain and not after shutdown; a real malloc_trim
// gives a fragmented heap's free pages back (the resident set drops). Counts and thread ids are
// asserted, never durations.
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "teardown/allocator_trim.hpp"
#include "teardown/deferred.hpp"

namespace teardown_test {
namespace {

using namespace std::chrono_literals;

pid_t current_tid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

// An injected trim: records the thread of every call.
struct trim_recorder {
  static inline std::mutex mutex;
  static inline std::vector<pid_t> callers;
  static int trim(std::size_t) {
    const std::lock_guard lock(mutex);
    callers.push_back(current_tid());
    return 0;
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

TEST_F(AllocatorTrimTest, NeitherADrainNorAnInlineDeleteAfterShutdownTrims) {
  teardown::deferred_domain domain(trimming_options("trim_drain"));
  domain.freeze();
  for (int i = 0; i < 8; ++i) teardown::deferred_deleter<buffer>{domain}(new buffer(std::size_t{1} << 20));
  EXPECT_EQ(domain.drain(std::uint64_t{1} << 40).items, 8u) << "the drain frees them on this thread";
  domain.thaw();
  domain.stop();
  teardown::deferred_deleter<buffer>{domain}(new buffer(std::size_t{1} << 20));  // inline now
  EXPECT_TRUE(trim_recorder::calls().empty()) << "a trim ran on the deleting thread";
  EXPECT_EQ(domain.stats().trim.trims, 0u);
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TEARDOWN_TEST_SANITIZED_HEAP 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define TEARDOWN_TEST_SANITIZED_HEAP 1
#endif
#endif

// Freed 64 KiB blocks between live small ones: glibc keeps them (none ends the heap), and only a
// trim gives their pages back.
TEST_F(AllocatorTrimTest, TheSystemTrimGivesAFragmentedHeapsFreePagesBack) {
#if defined(TEARDOWN_TEST_SANITIZED_HEAP)
  GTEST_SKIP() << "the sanitizer's allocator serves malloc here: glibc's malloc_trim has no heap of ours to trim";
#elif !defined(__GLIBC__)
  GTEST_SKIP() << "no glibc: the default trim does nothing";
#else
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
#endif
}

}  // namespace
}  // namespace teardown_test
