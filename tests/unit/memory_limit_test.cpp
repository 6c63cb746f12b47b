// Specification of teardown/memory_limit.hpp: the tightest of physical memory and every memory
// cgroup limit above the process — cgroup v2's memory.max and memory.high up the whole path,
// cgroup v1's memory.limit_in_bytes up its hierarchy (its "unlimited" is no limit), mounts found
// through mountinfo wherever they are, a cgroup namespace's root, a container's cgroup mounted
// as the mount's root — and nothing made up from missing or garbled files.
//
// Each case builds a fake /proc/self/cgroup, mountinfo and cgroup tree in a temporary directory.
// Where deferred.hpp's earlier reader (old_reader below: the leaf's cgroup v2 memory.max under
// /sys/fs/cgroup, nothing else) answered wrongly, the test shows its answer next to the right
// one. One test reads this machine's real files and prints what it finds.
#include "teardown/memory_limit.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "teardown/deferred.hpp"

namespace teardown_test {
namespace {

using teardown::memory_limit;
using teardown::memory_limit_sources;

constexpr std::uint64_t gib = std::uint64_t{1} << 30;
constexpr std::uint64_t physical = 16 * gib;
constexpr const char* v1_unlimited = "9223372036854771712\n";  // LLONG_MAX rounded down to 4 KiB

static_assert(noexcept(memory_limit()));
static_assert(noexcept(memory_limit(memory_limit_sources{})));

// A directory holding proc/self/cgroup, proc/self/mountinfo and the cgroup mounts; removed at
// the end.
class fake_tree {
 public:
  fake_tree() {
    char name[] = "/tmp/memory_limit_test.XXXXXX";
    if (mkdtemp(name) == nullptr) throw std::runtime_error("mkdtemp failed");
    root_ = name;
    cgroup_ = root_ + "/proc/self/cgroup";
    mountinfo_ = root_ + "/proc/self/mountinfo";
  }
  ~fake_tree() {
    std::error_code ignored;
    std::filesystem::remove_all(root_, ignored);
  }
  fake_tree(const fake_tree&) = delete;
  fake_tree& operator=(const fake_tree&) = delete;

  // Writes `content` to root/path, creating the directories on the way.
  void write(const std::string& path, const std::string& content) const {
    const std::filesystem::path full = root_ + path;
    std::filesystem::create_directories(full.parent_path());
    std::ofstream(full, std::ios::binary) << content;
  }
  void cgroup(const std::string& content) const { write("/proc/self/cgroup", content); }
  void mountinfo(const std::string& content) const { write("/proc/self/mountinfo", content); }

  memory_limit_sources sources(std::uint64_t physical_bytes = physical) const {
    return {.cgroup = cgroup_.c_str(), .mountinfo = mountinfo_.c_str(), .root = root_.c_str(),
            .physical = physical_bytes};
  }
  std::uint64_t limit(std::uint64_t physical_bytes = physical) const { return memory_limit(sources(physical_bytes)); }

  // deferred.hpp's reader before memory_limit.hpp, word for word but for its two fixed paths,
  // taken under root: the leaf's cgroup v2 memory.max under /sys/fs/cgroup, or physical memory.
  std::uint64_t old_reader(std::uint64_t bytes = physical) const {
    std::ifstream self(root_ + "/proc/self/cgroup");
    std::string line;
    while (std::getline(self, line)) {
      if (line.rfind("0::", 0) != 0) continue;  // the cgroup v2 line
      std::ifstream max(root_ + "/sys/fs/cgroup" + line.substr(3) + "/memory.max");
      std::uint64_t limit = 0;
      if (max >> limit && limit > 0 && (bytes == 0 || limit < bytes)) bytes = limit;  // "max" fails
    }
    return bytes;
  }

 private:
  std::string root_, cgroup_, mountinfo_;
};

std::string bytes(std::uint64_t n) { return std::to_string(n) + "\n"; }

// A pure cgroup v2 system: the unified hierarchy at /sys/fs/cgroup.
constexpr const char* v2_mountinfo =
    "22 1 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw\n"
    "26 22 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n";

// A hybrid system: v1 controllers (memory among them) and an empty v2 hierarchy at unified.
constexpr const char* hybrid_mountinfo =
    "30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "31 30 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "34 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

TEST(MemoryLimitTest, LeafLimitTighterThanItsParentsIsTheLimit) {
  fake_tree tree;
  tree.cgroup("0::/app.slice/web.service\n");
  tree.mountinfo(v2_mountinfo);
  tree.write("/sys/fs/cgroup/app.slice/memory.max", bytes(4 * gib));
  tree.write("/sys/fs/cgroup/app.slice/web.service/memory.max", bytes(1 * gib));
  EXPECT_EQ(tree.limit(), 1 * gib);
  EXPECT_EQ(tree.old_reader(), 1 * gib) << "the one case the old reader saw";
}

TEST(MemoryLimitTest, ParentLimitAboveAnUnlimitedLeafIsTheLimit) {
  fake_tree tree;
  tree.cgroup("0::/app.slice/web.service\n");
  tree.mountinfo(v2_mountinfo);
  tree.write("/sys/fs/cgroup/app.slice/memory.max", bytes(1 * gib));
  tree.write("/sys/fs/cgroup/app.slice/web.service/memory.max", "max\n");
  EXPECT_EQ(tree.limit(), 1 * gib);
  EXPECT_EQ(tree.old_reader(), physical) << "the old reader read only the leaf";
}

TEST(MemoryLimitTest, ParentLimitTighterThanTheLeafsIsTheLimit) {
  fake_tree tree;
  tree.cgroup("0::/a/b/c\n");
  tree.mountinfo(v2_mountinfo);
  tree.write("/sys/fs/cgroup/a/memory.max", bytes(1 * gib));
  tree.write("/sys/fs/cgroup/a/b/memory.max", bytes(3 * gib));
  tree.write("/sys/fs/cgroup/a/b/c/memory.max", bytes(2 * gib));
  EXPECT_EQ(tree.limit(), 1 * gib);
  EXPECT_EQ(tree.old_reader(), 2 * gib) << "the old reader read only the leaf";
}

TEST(MemoryLimitTest, MemoryHighTighterThanMemoryMaxIsTheLimit) {
  fake_tree tree;
  tree.cgroup("0::/app.slice\n");
  tree.mountinfo(v2_mountinfo);
  tree.write("/sys/fs/cgroup/app.slice/memory.max", bytes(2 * gib));
  tree.write("/sys/fs/cgroup/app.slice/memory.high", bytes(1 * gib));
  EXPECT_EQ(tree.limit(), 1 * gib);
  EXPECT_EQ(tree.old_reader(), 2 * gib) << "the old reader ignored memory.high";
}

TEST(MemoryLimitTest, MaxEverywhereLeavesPhysicalMemory) {
  fake_tree tree;
  tree.cgroup("0::/a/b\n");
  tree.mountinfo(v2_mountinfo);
  for (const char* dir : {"/sys/fs/cgroup/a", "/sys/fs/cgroup/a/b"}) {
    tree.write(std::string(dir) + "/memory.max", "max\n");
    tree.write(std::string(dir) + "/memory.high", "max\n");
  }
  EXPECT_EQ(tree.limit(), physical);
  EXPECT_EQ(tree.limit(/*physical=*/0), 0u) << "nothing known: 0";
  EXPECT_EQ(tree.old_reader(), physical);
}

TEST(MemoryLimitTest, CgroupV1LimitUpTheMemoryHierarchyIsTheLimit) {
  fake_tree tree;
  tree.cgroup("4:memory:/process_api/abc\n3:cpu,cpuacct:/\n0::/\n");
  tree.mountinfo(hybrid_mountinfo);
  tree.write("/sys/fs/cgroup/memory/memory.limit_in_bytes", v1_unlimited);
  tree.write("/sys/fs/cgroup/memory/process_api/memory.limit_in_bytes", bytes(1 * gib));
  tree.write("/sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes", v1_unlimited);
  EXPECT_EQ(tree.limit(), 1 * gib);
  EXPECT_EQ(tree.old_reader(), physical) << "the old reader knew no cgroup v1";
}

TEST(MemoryLimitTest, CgroupV1UnlimitedAndLimitsAbovePhysicalMemoryAreNoLimit) {
  fake_tree tree;
  tree.cgroup("4:memory:/a\n");
  tree.mountinfo(hybrid_mountinfo);
  tree.write("/sys/fs/cgroup/memory/memory.limit_in_bytes", v1_unlimited);
  tree.write("/sys/fs/cgroup/memory/a/memory.limit_in_bytes", bytes(2 * physical));
  EXPECT_EQ(tree.limit(), physical);
  tree.write("/sys/fs/cgroup/memory/a/memory.limit_in_bytes", v1_unlimited);
  EXPECT_EQ(tree.limit(/*physical=*/0), 0u) << "v1's unlimited is no figure even without physical memory";
}

TEST(MemoryLimitTest, CgroupNamespaceRootHoldsTheContainersLimitAndTheWalkStopsAtTheMount) {
  fake_tree tree;
  tree.cgroup("0::/\n");  // in a cgroup namespace: the process's cgroup is the namespace's root
  tree.mountinfo(v2_mountinfo);
  tree.write("/sys/fs/cgroup/memory.max", bytes(2 * gib));
  tree.write("/sys/fs/cgroup/memory.high", bytes(1 * gib));
  tree.write("/sys/fs/memory.max", bytes(1));  // above the mount: not the cgroup filesystem
  EXPECT_EQ(tree.limit(), 1 * gib);
  EXPECT_EQ(tree.old_reader(), 2 * gib) << "the old reader ignored memory.high";
}

TEST(MemoryLimitTest, CgroupNamespaceRootMountedElsewhereIsFoundThroughMountinfo) {
  fake_tree tree;
  tree.cgroup("0::/\n");
  tree.mountinfo("26 22 0:23 / /run/cgroup2 rw,relatime shared:9 - cgroup2 none rw\n");
  tree.write("/run/cgroup2/memory.max", bytes(1 * gib));
  EXPECT_EQ(tree.limit(), 1 * gib);
  EXPECT_EQ(tree.old_reader(), physical) << "the old reader looked only under /sys/fs/cgroup";
}

TEST(MemoryLimitTest, ContainerCgroupMountedAsTheMountsRootIsFound) {
  fake_tree tree;
  // No cgroup namespace: the host's path, and the container sees its own cgroup at the mount.
  tree.cgroup("0::/docker/4f1e\n");
  tree.mountinfo("700 690 0:23 /docker/4f1e /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw\n");
  tree.write("/sys/fs/cgroup/memory.max", bytes(1 * gib));
  EXPECT_EQ(tree.limit(), 1 * gib);
  EXPECT_EQ(tree.old_reader(), physical) << "the old reader looked for /sys/fs/cgroup/docker/4f1e";
}

TEST(MemoryLimitTest, CgroupV1ContainerCgroupBelowTheMountsRootIsFound) {
  fake_tree tree;
  tree.cgroup("9:memory:/docker/4f1e/worker\n");
  tree.mountinfo("701 690 0:31 /docker/4f1e /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n");
  tree.write("/sys/fs/cgroup/memory/memory.limit_in_bytes", bytes(1 * gib));
  tree.write("/sys/fs/cgroup/memory/worker/memory.limit_in_bytes", v1_unlimited);
  EXPECT_EQ(tree.limit(), 1 * gib);
  EXPECT_EQ(tree.old_reader(), physical);
}

TEST(MemoryLimitTest, CgroupTheMountDoesNotShowGivesNoFigure) {
  fake_tree tree;
  tree.cgroup("0::/../sibling\n");  // outside the namespace
  tree.mountinfo(v2_mountinfo);
  tree.write("/sys/fs/cgroup/memory.max", bytes(1 * gib));  // the namespace's, not ours
  tree.write("/sys/fs/sibling/memory.max", bytes(1));
  EXPECT_EQ(tree.limit(), physical);
  tree.cgroup("0::/elsewhere\n");
  tree.mountinfo("700 690 0:23 /docker/4f1e /sys/fs/cgroup rw - cgroup2 cgroup rw\n");
  EXPECT_EQ(tree.limit(), physical);
  tree.cgroup("0::/..dotted\n");  // a name that only starts with two dots is inside
  tree.mountinfo(v2_mountinfo);
  tree.write("/sys/fs/cgroup/..dotted/memory.max", bytes(2 * gib));
  EXPECT_EQ(tree.limit(), 1 * gib) << "its own 2 GiB and the namespace root's 1 GiB";
}

TEST(MemoryLimitTest, MissingFilesGivePhysicalMemoryOrZero) {
  fake_tree tree;
  EXPECT_EQ(tree.limit(), physical) << "no /proc/self/cgroup";
  EXPECT_EQ(tree.limit(/*physical=*/0), 0u);
  tree.cgroup("0::/a\n");
  EXPECT_EQ(tree.limit(), physical) << "no mountinfo";
  tree.mountinfo(v2_mountinfo);
  EXPECT_EQ(tree.limit(), physical) << "no limit files";
  tree.write("/sys/fs/cgroup/a/memory.max", bytes(1 * gib));
  EXPECT_EQ(tree.limit(/*physical=*/0), 1 * gib) << "a cgroup figure without physical memory";
}

TEST(MemoryLimitTest, GarbledLimitFilesAreNoFigure) {
  fake_tree tree;
  tree.cgroup("0::/a\n");
  tree.mountinfo(v2_mountinfo);
  tree.write("/sys/fs/cgroup/a/memory.max", "1024 bytes, give or take\n");
  EXPECT_EQ(tree.limit(), physical);
  EXPECT_EQ(tree.old_reader(), 1024u) << "the old reader took the leading number of a garbled file";
  for (const char* garbage : {"", "\n", "-5\n", "0\n", "99999999999999999999999\n", "max junk\n", "12\n34\n",
                              " 12\n", "0x400\n", "\x01\x02\x03"}) {
    tree.write("/sys/fs/cgroup/a/memory.max", garbage);
    EXPECT_EQ(tree.limit(), physical) << '"' << garbage << '"';
  }
}

TEST(MemoryLimitTest, GarbledCgroupAndMountinfoLinesAreSkipped) {
  fake_tree tree;
  tree.cgroup("garbage\n::\n0::relative/path\n1:memory\n\n0::/a\n");
  tree.mountinfo(std::string("short\n- cgroup2\n") + std::string(20000, 'x') + " - overlay overlay rw\n" +
                 "1 2 3\n" + v2_mountinfo);
  tree.write("/sys/fs/cgroup/a/memory.max", bytes(1 * gib));
  EXPECT_EQ(tree.limit(), 1 * gib);
}

TEST(MemoryLimitTest, EscapedMountPointIsUnescaped) {
  fake_tree tree;
  tree.cgroup("0::/a\n");
  tree.mountinfo("26 22 0:23 / /mnt/cgroup\\040two rw - cgroup2 cgroup2 rw\n");
  tree.write("/mnt/cgroup two/a/memory.max", bytes(1 * gib));
  EXPECT_EQ(tree.limit(), 1 * gib);
}

TEST(MemoryLimitTest, ThisMachinesLimitIsNonzeroAndAtMostPhysicalMemory) {
  const std::uint64_t physical_bytes = teardown::physical_memory();
  const std::uint64_t limit = memory_limit();
  std::printf("physical memory %llu bytes, memory_limit() %llu bytes, default max_pending %llu bytes\n",
              static_cast<unsigned long long>(physical_bytes), static_cast<unsigned long long>(limit),
              static_cast<unsigned long long>(teardown::deferred_domain::default_max_pending()));
  if (physical_bytes == 0) GTEST_SKIP() << "sysconf reports no physical memory here";
  EXPECT_GT(limit, 0u);
  EXPECT_LE(limit, physical_bytes);
  EXPECT_EQ(teardown::deferred_domain::default_max_pending(), std::min(limit / 4, teardown::budget::max_cap));
}

}  // namespace
}  // namespace teardown_test
