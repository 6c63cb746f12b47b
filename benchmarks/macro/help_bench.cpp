// help_bench: waiters help on a busy machine, side by side. A batch of touched buffers (default
// 256 of 4 MiB: 1 GiB) is freed on the caller (inline), or handed to a reaper and flushed, with
// --busy processes spinning at nice 0. The reaper's cases: the default options; a nice-19 worker
// that no raise can reach (nice_only_if_raisable = false, which an ordinary user's process cannot
// raise again), with and without waiters_help; and one that is never boosted (boost_after 0).
// Each case is timed from the hand-over to the flush's return (memory back: each buffer is a
// mapping of its own, touched, and munmap()ed, which malloc's free might not do), as a ratio to
// the same round's inline free; the cases take turns in every round, medians over the rounds.
// Which user ran it (root raises a nice-19 worker; uid 65534 cannot) is in the output: run it
// both ways.
//
//   help_bench [--buffers 256] [--mib 4] [--rounds 5] [--busy 2] [--out FILE]
//
// JSON out (stdout or --out), a table on stderr. Not a test: nothing here asserts.
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "macro_support.hpp"
#include "teardown/reaper.hpp"

namespace {

using teardown_bench::ms_between;
using clock_type = std::chrono::steady_clock;

struct buffer {
  teardown::llist_node hook;
  char* bytes = nullptr;
  std::size_t size = 0;
};

void free_buffer(buffer& b) {
  munmap(b.bytes, b.size);
  b.bytes = nullptr;
}

using buffer_fn = void (*)(buffer&);
using buffer_reaper = teardown::reaper<buffer, &buffer::hook, buffer_fn>;

void fill(std::vector<buffer>& all, std::size_t bytes) {
  for (buffer& b : all) {
    void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED) {
      std::fprintf(stderr, "help_bench: mmap: %s\n", std::strerror(errno));
      std::exit(1);
    }
    b.bytes = static_cast<char*>(mapped);
    b.size = bytes;
    std::memset(b.bytes, 1, bytes);  // touched: resident
  }
}

struct case_spec {
  const char* name;
  teardown::reaper_options opts;
};

const char* usage =
    "usage: help_bench [--buffers N] [--mib M] [--rounds R] [--busy P] [--out FILE]\n"
    "  N buffers of M MiB (256 x 4: 1 GiB), freed inline or through a reaper and flush(), beside P\n"
    "  processes spinning at nice 0 (default 2), R rounds (default 5); JSON out, a table on stderr\n";

}  // namespace

int main(int argc, char** argv) {
  const teardown_bench::command_line cli("help_bench", usage);
  const auto given = cli.parse(argc, argv, {});
  int buffers = 256, mib = 4, rounds = 5, busy = 2;
  std::string out;
  for (const auto& [flag, value] : given.flags) {
    if (flag == "--buffers") {
      buffers = cli.count(flag, value);
    } else if (flag == "--mib") {
      mib = cli.count(flag, value, 1024);
    } else if (flag == "--rounds") {
      rounds = cli.count(flag, value, 1000);
    } else if (flag == "--busy") {
      busy = value == "0" ? 0 : cli.count(flag, value, 1024);
    } else if (flag == "--out") {
      out = value;
    } else {
      cli.usage_error("unknown flag " + flag);
    }
  }
  const std::size_t bytes = std::size_t(mib) << 20;
  const std::vector<case_spec> cases = {
      {"default options", {.name = "help_default"}},
      {"nice 19 kept, waiters help", {.name = "help_19", .nice_only_if_raisable = false}},
      {"nice 19 kept, no help", {.name = "help_19_off", .nice_only_if_raisable = false, .waiters_help = false}},
      {"never boosted (boost_after 0)", {.name = "help_never", .boost_after = std::chrono::nanoseconds(0)}},
  };
  std::vector<double> inline_ms;
  std::vector<std::vector<double>> case_ms(cases.size()), case_ratio(cases.size());
  std::vector<std::uint64_t> helped(cases.size()), boosts(cases.size()), refused(cases.size());
  std::vector<int> worker_nice(cases.size());
  const teardown_bench::cpu_hogs hogs(busy);
  for (int round = 0; round < rounds; ++round) {
    std::vector<buffer> all(static_cast<std::size_t>(buffers));
    fill(all, bytes);
    const auto start = clock_type::now();
    for (buffer& b : all) free_buffer(b);
    const double inline_round = ms_between(start, clock_type::now());
    inline_ms.push_back(inline_round);
    for (std::size_t c = 0; c < cases.size(); ++c) {
      buffer_reaper reaper(&free_buffer, cases[c].opts);
      fill(all, bytes);
      const auto handed = clock_type::now();
      for (buffer& b : all) reaper.enqueue(b);
      reaper.flush();
      const double took = ms_between(handed, clock_type::now());
      case_ms[c].push_back(took);
      case_ratio[c].push_back(took / inline_round);
      const teardown::reaper_stats s = reaper.stats();
      helped[c] += s.helped;
      boosts[c] += s.boosts;
      refused[c] += s.boosts_refused;
      worker_nice[c] = reaper.nice();
      teardown_bench::progress("round %d: %s %.1f ms (inline %.1f)\n", round + 1, cases[c].name, took, inline_round);
    }
  }
  const std::string who = geteuid() == 0 ? "root" : "uid " + std::to_string(geteuid());
  std::fprintf(stderr, "\nhelp_bench as %s: %d x %d MiB, %d spinner(s) at nice 0, medians of %d rounds\n", who.c_str(),
               buffers, mib, busy, rounds);
  std::fprintf(stderr, "%-32s %12s %16s %6s %8s %8s %8s\n", "case", "flush (ms)", "/ inline (median)", "nice",
               "helped", "boosts", "refused");
  const teardown_bench::summary inline_summary = teardown_bench::summarize(inline_ms);
  std::fprintf(stderr, "%-32s %12.1f %16s\n", "inline free", inline_summary.median, "1.00");
  teardown_bench::json_object config;
  config.set("user", who).set("buffers", buffers).set("mib", mib).set("busy", busy).set("rounds", rounds);
  std::vector<teardown_bench::json_object> rows;
  rows.push_back(teardown_bench::json_object().set("case", "inline free").set("median_ms", inline_summary.median));
  for (std::size_t c = 0; c < cases.size(); ++c) {
    const double ms = teardown_bench::summarize(case_ms[c]).median;
    const double ratio = teardown_bench::summarize(case_ratio[c]).median;
    std::fprintf(stderr, "%-32s %12.1f %16.2f %6d %8llu %8llu %8llu\n", cases[c].name, ms, ratio, worker_nice[c],
                 static_cast<unsigned long long>(helped[c]), static_cast<unsigned long long>(boosts[c]),
                 static_cast<unsigned long long>(refused[c]));
    rows.push_back(teardown_bench::json_object()
                       .set("case", cases[c].name)
                       .set("median_ms", ms)
                       .set("median_ratio_to_inline", ratio)
                       .set("worker_nice", worker_nice[c])
                       .set("helped", helped[c])
                       .set("boosts", boosts[c])
                       .set("boosts_refused", refused[c]));
  }
  std::fprintf(stderr,
               "  flush: from the hand-over until flush() returned (every buffer freed); / inline: over the same\n"
               "  round's inline free; helped, boosts, refused: all rounds together; nice: the worker's in force\n");
  const std::string json = teardown_bench::rows_document("help_bench", teardown_bench::machine_object(), config, rows);
  return teardown_bench::write_document("help_bench", out, json) ? 0 : 1;
}
