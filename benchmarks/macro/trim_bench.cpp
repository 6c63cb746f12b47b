// trim_bench — is memory really back after a deferred delete? The resident set after deleting
// 1 GiB held in objects of 1 MiB and of 64 KiB: inline, deferred (a deferred_domain with its
// trim off) and deferred with the trim (the domain's default: malloc_trim on the reaper once
// its batches freed 64 MiB), and what the trims cost the reaper.
// A plain program, not Google Benchmark: each case runs in a fresh child of this process, so
// that every case starts from an untouched heap; the cases share one run and one machine.
//
//   trim_bench [--gib G] [--json FILE] [--quick]
//     --gib G      the memory each case allocates and deletes (default 1)
//     --json FILE  write the JSON there (default: stdout); --out FILE is the same (run.sh's)
//     --quick      --gib 0.125: a smoke test
//
// Each child first frees one 4 MiB block: glibc then raises its mmap threshold to 4 MiB (as any
// program's first large free does), so the 1 MiB objects come from the heap, not from mmap.
// It allocates the objects (std::vector<char>, every page written) with a live 64-byte block
// after each (a program's other allocations: no freed object can merge into the heap's top),
// reads its resident set, deletes every object (timed: the caller's cost), flushes the domain,
// and reads the resident set again.
// Per case: rss_before_mib, rss_after_mib, returned (1 - after/before of the objects' share),
// delete_ms (the caller's loop), flush_ms, trims, trimmed_mib and trim_cpu_ms (the domain's
// stats).
//
// JSON: {"benchmark": "trim_bench", "machine": {...}, "config": {...},
//        "rows": [{"object_kib", "mode", "rss_before_mib", "rss_after_mib", "returned",
//                  "delete_ms", "flush_ms", "trims", "trimmed_mib", "trim_cpu_ms", ["failed"]}]}
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <thread>
#include <memory>
#include <string>
#include <vector>

#include "teardown/allocator_trim.hpp"
#include "teardown/deferred.hpp"

#include "machine_info.hpp"
#include "macro_support.hpp"

namespace {

using teardown_bench::json_object;
using teardown_bench::ms_between;
using teardown_bench::progress;
using teardown_bench::strprintf;

using clock_type = std::chrono::steady_clock;

struct options {
  double gib = 1;
  bool quick = false;
  std::string json;
};

constexpr const char* kUsage =
    "usage: trim_bench [--gib G] [--json FILE] [--quick]\n"
    "  --gib G       memory each case allocates and deletes (default 1)\n"
    "  --json FILE   write the JSON there (default: stdout); --out FILE is the same\n"
    "  --quick       --gib 0.125 (explicit flags win)\n";

constexpr teardown_bench::command_line kCommandLine{"trim_bench", kUsage};

options parse_options(int argc, char** argv) {
  options opts;
  const teardown_bench::command_line::given given = kCommandLine.parse(argc, argv, {"--quick"});
  opts.quick = given.has("--quick");
  if (opts.quick) opts.gib = 0.125;
  for (const auto& [name, value] : given.flags) {
    if (name == "--gib") {
      opts.gib = kCommandLine.positive(name, value);
    } else if (name == "--json" || name == "--out") {
      opts.json = value;
    } else {
      kCommandLine.usage_error("unknown flag " + name);
    }
  }
  return opts;
}

enum class mode { inline_delete, deferred, deferred_trim };
constexpr const char* kModeNames[] = {"inline", "deferred", "deferred_trim"};

// What a child reports (one pipe write).
struct case_report {
  double rss_before_mib = 0;
  double rss_after_mib = 0;
  double delete_ms = 0;
  double flush_ms = 0;
  std::uint64_t trims = 0;
  double trimmed_mib = 0;
  double trim_cpu_ms = 0;
  char failed[160] = {};
};

double resident_mib() { return static_cast<double>(teardown::detail::resident_bytes()) / (1 << 20); }

case_report run_case(std::size_t object_bytes, std::size_t count, mode m) {
  case_report r;
  {
    // glibc's mmap threshold: 4 MiB from here on. Written, so the pair is not optimized away.
    char* volatile large = static_cast<char*>(std::malloc(std::size_t{4} << 20));
    if (large == nullptr) throw std::runtime_error("malloc(4 MiB)");
    std::memset(large, 1, std::size_t{4} << 20);
    std::free(large);
  }
  teardown::deferred_domain_options opts = teardown::deferred_domain::default_options();
  opts.reaper.name = "trim_bench";
  if (m == mode::deferred) opts.trim.after = 0;
  teardown::deferred_domain domain(std::move(opts));
  std::vector<std::vector<char>*> objects;
  std::vector<std::unique_ptr<char[]>> keepers;
  objects.reserve(count);
  keepers.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    objects.push_back(new std::vector<char>(object_bytes, 1));
    keepers.emplace_back(new char[64]);
  }
  r.rss_before_mib = resident_mib();
  const auto start = clock_type::now();
  for (std::vector<char>* object : objects) {
    if (m == mode::inline_delete) {
      delete object;
    } else {
      teardown::deferred_deleter<std::vector<char>>{domain}(object);
    }
  }
  r.delete_ms = ms_between(start, clock_type::now());
  const auto flush_start = clock_type::now();
  domain.flush();
  r.flush_ms = ms_between(flush_start, clock_type::now());
  // The batch-end trim follows the batch's last delete: give the reaper its turn (bounded).
  const auto give_up = clock_type::now() + std::chrono::seconds(5);
  while (m == mode::deferred_trim && domain.stats().trim.trims == 0 && clock_type::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  r.rss_after_mib = resident_mib();
  const teardown::deferred_stats s = domain.stats();
  r.trims = s.trim.trims;
  r.trimmed_mib = static_cast<double>(s.trim.trimmed_bytes) / (1 << 20);
  r.trim_cpu_ms = static_cast<double>(s.trim.trim_cpu_ns) / 1e6;
  if (s.queued + (m == mode::inline_delete ? count : 0) < count) {
    std::snprintf(r.failed, sizeof r.failed, "only %llu of %zu objects were queued",
                  static_cast<unsigned long long>(s.queued), count);
  }
  return r;
}

case_report in_child(std::size_t object_bytes, std::size_t count, mode m) {
  return teardown_bench::in_child<case_report>([&] { return run_case(object_bytes, count, m); }, 300'000);
}

}  // namespace

int main(int argc, char** argv) {
  const options opts = parse_options(argc, argv);
  try {
    const double total_bytes = opts.gib * (1 << 30);
    std::vector<json_object> rows;
    std::vector<std::string> table;
    for (const std::size_t object_kib : {std::size_t{1024}, std::size_t{64}}) {
      const std::size_t object_bytes = object_kib << 10;
      const auto count = static_cast<std::size_t>(total_bytes / static_cast<double>(object_bytes));
      for (const mode m : {mode::inline_delete, mode::deferred, mode::deferred_trim}) {
        const char* name = kModeNames[static_cast<int>(m)];
        progress("%zu KiB x %zu, %s: ", object_kib, count, name);
        const case_report r = in_child(object_bytes, count, m);
        const double objects_mib = static_cast<double>(object_bytes * count) / (1 << 20);
        const double returned = (r.rss_before_mib - r.rss_after_mib) / objects_mib;
        progress("RSS %.0f -> %.0f MiB, %u trims%s%s\n", r.rss_before_mib, r.rss_after_mib,
                 static_cast<unsigned>(r.trims), r.failed[0] != '\0' ? ", failed: " : "", r.failed);
        json_object row;
        row.set("object_kib", static_cast<int>(object_kib)).set("mode", name).set("objects", static_cast<int>(count))
            .set("rss_before_mib", r.rss_before_mib).set("rss_after_mib", r.rss_after_mib).set("returned", returned)
            .set("delete_ms", r.delete_ms).set("flush_ms", r.flush_ms).set("trims", r.trims)
            .set("trimmed_mib", r.trimmed_mib).set("trim_cpu_ms", r.trim_cpu_ms);
        if (r.failed[0] != '\0') row.set("failed", r.failed);
        rows.push_back(std::move(row));
        table.push_back(strprintf("%8zu  %-14s %9.0f %9.0f %8.0f%% %10.2f %9.1f %6llu %11.0f %11.2f", object_kib, name,
                                  r.rss_before_mib, r.rss_after_mib, returned * 100, r.delete_ms, r.flush_ms,
                                  static_cast<unsigned long long>(r.trims), r.trimmed_mib, r.trim_cpu_ms));
      }
    }
    json_object config;
    config.set("gib", opts.gib).set("quick", opts.quick).set("trim_after_mib", 64)
        .set("note", "each case in a fresh child; glibc's mmap threshold raised to 4 MiB first by one large free; "
                     "a live 64-byte block after each object");
    const std::string json =
        teardown_bench::rows_document("trim_bench", teardown_bench::machine_object(), config, rows);
    if (!teardown_bench::write_document("trim_bench", opts.json, json)) return 1;
    progress(
        "\nobject KiB  mode            RSS before  RSS after  returned  delete ms  flush ms  trims  trimmed MiB  trim "
        "CPU ms\n");
    for (const std::string& line : table) progress("%s\n", line.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trim_bench: %s\n", e.what());
    return 1;
  }
}
