// teardown_test — the umbrella header, teardown/teardown.hpp. What it promises (README, "Headers"):
// one include gives every public header but the model (teardown/model/), process.hpp and
// process_reaper.hpp. The first test uses the library through the umbrella alone (this file
// includes nothing else of teardown); the others read the include graph of the headers in this
// checkout (TEARDOWN_INCLUDE_DIR, from tests/CMakeLists.txt), so that a new top-level header the
// umbrella forgets, or a model or process header it starts to pull in, fails here by name.
#include <teardown/teardown.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#ifndef TEARDOWN_INCLUDE_DIR
#error "TEARDOWN_INCLUDE_DIR must name the include/ folder of this checkout (tests/CMakeLists.txt)"
#endif

namespace {

namespace fs = std::filesystem;

struct item {
  teardown::llist_node hook;
  int id = 0;
};

// The name in `line` if it is an #include line ("name" or <name>), else empty. Plain string
// scanning: std::regex trips GCC 12's -Wmaybe-uninitialized at -O1 under the sanitizers.
std::string included_name(const std::string& line) {
  std::size_t at = line.find_first_not_of(" \t");
  if (at == std::string::npos || line[at] != '#') return {};
  at = line.find_first_not_of(" \t", at + 1);
  if (at == std::string::npos || line.compare(at, 7, "include") != 0) return {};
  at = line.find_first_not_of(" \t", at + 7);
  if (at == std::string::npos || (line[at] != '"' && line[at] != '<')) return {};
  const std::size_t end = line.find(line[at] == '"' ? '"' : '>', at + 1);
  return end == std::string::npos ? std::string{} : line.substr(at + 1, end - at - 1);
}

// The headers reachable from `start` (a path relative to include/, e.g. "teardown/teardown.hpp"),
// `start` included, each as a path relative to include/. An include is looked up beside the
// including header first, then under include/ (how the library writes them: "teardown/...").
std::set<std::string> reachable_from(const std::string& start) {
  const fs::path root = TEARDOWN_INCLUDE_DIR;
  std::set<std::string> seen;
  std::vector<std::string> pending{start};
  while (!pending.empty()) {
    const std::string header = pending.back();
    pending.pop_back();
    if (!seen.insert(header).second) continue;
    std::ifstream in(root / header);
    EXPECT_TRUE(in.good()) << "cannot read " << (root / header);
    std::string line;
    while (std::getline(in, line)) {
      const std::string named = included_name(line);
      if (named.empty()) continue;
      const fs::path beside = (fs::path(header).parent_path() / named).lexically_normal();
      if (fs::exists(root / beside)) {
        pending.push_back(beside.generic_string());
      } else if (fs::exists(root / named)) {
        pending.push_back(fs::path(named).lexically_normal().generic_string());
      }  // else a system or third-party header
    }
  }
  return seen;
}

// The public headers at the top of include/teardown/, as "teardown/<name>.hpp".
std::vector<std::string> top_level_headers() {
  std::vector<std::string> headers;
  for (const auto& entry : fs::directory_iterator(fs::path(TEARDOWN_INCLUDE_DIR) / "teardown")) {
    if (entry.is_regular_file() && entry.path().extension() == ".hpp") {
      headers.push_back("teardown/" + entry.path().filename().string());
    }
  }
  std::sort(headers.begin(), headers.end());
  return headers;
}

bool left_out_on_purpose(const std::string& header) {
  return header == "teardown/process.hpp" || header == "teardown/process_reaper.hpp";
}

TEST(UmbrellaTest, IsEnoughToUseTheLibrary) {
  teardown::llist<item, &item::hook> list;
  item items[3];
  for (int i = 0; i < 3; ++i) items[i].id = i + 1;
  EXPECT_TRUE(list.add(items[0]));
  std::thread other([&] { list.add(items[1]); });
  other.join();
  EXPECT_FALSE(list.add(items[2]));
  int sum = 0;
  for (item& taken : list.del_all()) sum += taken.id;
  EXPECT_EQ(sum, 6);
}

TEST(UmbrellaTest, ReachesEveryTopLevelHeaderButProcessAndProcessReaper) {
  const std::set<std::string> reached = reachable_from("teardown/teardown.hpp");
  const std::vector<std::string> headers = top_level_headers();
  ASSERT_GT(headers.size(), 10u) << "no headers under " << TEARDOWN_INCLUDE_DIR;
  for (const std::string& header : headers) {
    if (header == "teardown/teardown.hpp" || left_out_on_purpose(header)) continue;
    EXPECT_TRUE(reached.count(header)) << "teardown/teardown.hpp does not include " << header;
  }
}

TEST(UmbrellaTest, LeavesOutTheModelAndTheProcessHeaders) {
  const std::set<std::string> reached = reachable_from("teardown/teardown.hpp");
  for (const std::string& header : reached) {
    EXPECT_NE(header.rfind("teardown/model/", 0), 0u) << "the umbrella pulls in " << header;
    EXPECT_FALSE(left_out_on_purpose(header)) << "the umbrella pulls in " << header;
  }
}

}  // namespace
