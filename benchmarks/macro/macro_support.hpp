// What the plain (not Google Benchmark) macro benchmarks share: exit_matrix, pool_bench,
// process_bench, fork_bench, oom_reap_bench and mm_reaper_tradeoffs. Each of them times a few repetitions of a
// scenario, summarises them as median / min / max, writes one JSON document and reads its flags
// the same way; keeping that here means a fix to the JSON escaping or to a flag's checks reaches
// every program, and their documents stay alike. machine_info.hpp says what machine they ran on.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "machine_info.hpp"

namespace teardown_bench {

// ---- time and progress ------------------------------------------------------------------------

inline double ms_between(std::chrono::steady_clock::time_point from, std::chrono::steady_clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

// CLOCK_THREAD_CPUTIME_ID of the calling thread, in milliseconds.
inline double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

// A progress line on stderr, flushed at once: a repetition can take seconds, and the line should
// be there while it runs.
inline void progress(const char* format, ...) __attribute__((format(printf, 1, 2)));
inline void progress(const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::vfprintf(stderr, format, args);
  va_end(args);
  std::fflush(stderr);
}

// printf into a std::string (up to 511 characters: a table line or a message).
inline std::string strprintf(const char* format, ...) __attribute__((format(printf, 1, 2)));
inline std::string strprintf(const char* format, ...) {
  char buffer[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buffer, sizeof buffer, format, args);
  va_end(args);
  return buffer;
}

// ---- summaries --------------------------------------------------------------------------------

struct summary {
  double median = NAN;
  double min = NAN;
  double max = NAN;
};

// A NaN sample stands for a figure a repetition could not take; it is left out, so an empty or
// all-NaN set summarises as NaN (null in the JSON).
inline summary summarize(std::vector<double> samples) {
  summary s;
  samples.erase(std::remove_if(samples.begin(), samples.end(), [](double x) { return std::isnan(x); }), samples.end());
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  const std::size_t n = samples.size();
  s.median = n % 2 == 1 ? samples[n / 2] : (samples[n / 2 - 1] + samples[n / 2]) / 2;
  s.min = samples.front();
  s.max = samples.back();
  return s;
}

// ---- JSON -------------------------------------------------------------------------------------

// Six significant digits; a figure that is not finite (a summary of nothing) is null, which
// JSON has and NaN is not.
inline std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.6g", value);
  return buffer;
}

inline std::string json_quoted(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escape[8];
      std::snprintf(escape, sizeof escape, "\\u%04x", static_cast<unsigned>(c));
      out += escape;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// An object on one line whose fields keep their insertion order; values are held as JSON text.
class json_object {
 public:
  json_object& set(std::string key, double value) { return raw(std::move(key), json_number(value)); }
  json_object& set(std::string key, int value) { return raw(std::move(key), std::to_string(value)); }
  json_object& set(std::string key, std::uint64_t value) { return raw(std::move(key), std::to_string(value)); }
  json_object& set(std::string key, bool value) { return raw(std::move(key), value ? "true" : "false"); }
  json_object& set(std::string key, const char* value) { return raw(std::move(key), json_quoted(value)); }
  json_object& set(std::string key, const std::string& value) { return raw(std::move(key), json_quoted(value)); }
  json_object& set(std::string key, const json_object& value) { return raw(std::move(key), value.str()); }
  json_object& set(std::string key, const summary& s) {
    return set(std::move(key), json_object().set("median", s.median).set("min", s.min).set("max", s.max));
  }
  json_object& set(std::string key, const std::vector<std::uint64_t>& values) {
    std::string text = "[";
    for (std::size_t i = 0; i < values.size(); ++i) text += (i == 0 ? "" : ", ") + std::to_string(values[i]);
    return raw(std::move(key), text + "]");
  }
  json_object& set(std::string key, const std::vector<int>& values) {
    return set(std::move(key), std::vector<std::uint64_t>(values.begin(), values.end()));
  }

  // Moves the field to the end, if there is one.
  void move_to_end(std::string_view key) {
    std::stable_partition(fields_.begin(), fields_.end(), [&](const auto& field) { return field.first != key; });
  }

  std::string str() const {
    std::string out = "{";
    for (std::size_t i = 0; i < fields_.size(); ++i) {
      if (i != 0) out += ", ";
      out += json_quoted(fields_[i].first) + ": " + fields_[i].second;
    }
    return out + "}";
  }

 private:
  json_object& raw(std::string key, std::string json) {
    fields_.emplace_back(std::move(key), std::move(json));
    return *this;
  }

  std::vector<std::pair<std::string, std::string>> fields_;
};

// The document exit_matrix, pool_bench and process_bench write: the benchmark's name, the
// machine, the configuration and one row a line, so that a diff of two runs reads row by row.
inline std::string rows_document(const char* benchmark, const json_object& machine, const json_object& config,
                                 const std::vector<json_object>& rows) {
  std::string json = "{\n  \"benchmark\": \"" + std::string(benchmark) + "\",\n";
  json += "  \"machine\": " + machine.str() + ",\n";
  json += "  \"config\": " + config.str() + ",\n";
  json += "  \"rows\": [";
  for (std::size_t i = 0; i < rows.size(); ++i) json += (i == 0 ? "\n    " : ",\n    ") + rows[i].str();
  json += "\n  ]\n}\n";
  return json;
}

// ---- the command line -------------------------------------------------------------------------

// The flags of exit_matrix, pool_bench and process_bench: "--flag value" or "--flag=value",
// switches without a value (--quick), and --help. A mistake prints the message and the usage on
// stderr and exits with status 2.
class command_line {
 public:
  constexpr command_line(const char* program, const char* usage) : program_(program), usage_(usage) {}

  struct given {
    std::vector<std::string> switches;
    std::vector<std::pair<std::string, std::string>> flags;  // in command-line order

    bool has(std::string_view name) const {
      return std::find(switches.begin(), switches.end(), name) != switches.end();
    }
  };

  // The switches (any of `switch_names`) and flags of argv; --help or -h prints the usage on
  // stdout and exits. The flags are handed back rather than applied so that the caller can set
  // --quick's defaults first: an explicit flag wins whatever its place on the line.
  given parse(int argc, char** argv, std::initializer_list<std::string_view> switch_names) const {
    given out;
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--help" || arg == "-h") {
        std::fputs(usage_, stdout);
        std::exit(0);
      }
      if (std::find(switch_names.begin(), switch_names.end(), arg) != switch_names.end()) {
        out.switches.push_back(arg);
        continue;
      }
      std::string name = arg;
      std::string value;
      if (const std::size_t eq = arg.find('='); eq != std::string::npos) {
        name = arg.substr(0, eq);
        value = arg.substr(eq + 1);
      } else {
        if (i + 1 >= argc) usage_error(arg + " needs a value");
        value = argv[++i];
      }
      out.flags.emplace_back(name, value);
    }
    return out;
  }

  [[noreturn]] void usage_error(const std::string& message) const {
    std::fprintf(stderr, "%s: %s\n%s", program_, message.c_str(), usage_);
    std::exit(2);
  }

  double positive(std::string_view flag, const std::string& text) const {
    char* end = nullptr;
    errno = 0;
    const double value = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || errno != 0 || !(value > 0) || !std::isfinite(value)) {
      usage_error(std::string(flag) + ": \"" + text + "\" is not a positive number");
    }
    return value;
  }

  // A whole number from 1 to `most`.
  int count(std::string_view flag, const std::string& text, int most = 100000) const {
    const double value = positive(flag, text);
    if (value != std::floor(value) || value > most)
      usage_error(std::string(flag) + ": \"" + text + "\" is not a count");
    return static_cast<int>(value);
  }

 private:
  const char* program_;
  const char* usage_;
};

// "1,4,16" -> {"1", "4", "16"}; an empty list is one empty part, which the caller's check refuses.
inline std::vector<std::string> split_list(const std::string& list) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = list.find(',', start);
    parts.push_back(list.substr(start, comma - start));
    if (comma == std::string::npos) return parts;
    start = comma + 1;
  }
}

// The "machine" object of a document: CPUs, memory, CPU model, kernel, load.
inline json_object machine_object() {
  return json_object()
      .set("cpus", static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)))
      .set("mem_total_gib", static_cast<double>(meminfo_bytes("MemTotal:")) / (1 << 30))
      .set("cpu_model", cpu_model())
      .set("kernel", kernel_release())
      .set("load_average_1m", load_average_1m());
}

// ---- a busy machine ---------------------------------------------------------------------------

// --busy: `count` processes that spin at this process's nice value until the object is
// destroyed (it kills and reaps them; PR_SET_PDEATHSIG kills them if this process dies first).
class cpu_hogs {
 public:
  explicit cpu_hogs(int count) {
    std::fflush(nullptr);
    for (int i = 0; i < count; ++i) {
      const pid_t pid = fork();
      if (pid < 0) throw std::system_error(errno, std::generic_category(), "fork (--busy)");
      if (pid == 0) {
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) _exit(1);
        volatile unsigned long spin = 0;
        for (;;) spin = spin + 1;
      }
      pids_.push_back(pid);
    }
  }
  cpu_hogs(const cpu_hogs&) = delete;
  cpu_hogs& operator=(const cpu_hogs&) = delete;

  // Their CPU per wall-clock ms over the next `window` (the calling thread sleeps through it).
  double cpu_per_ms(std::chrono::milliseconds window) const {
    const double before = cpu_ms();
    const auto start = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(window);
    const double wall = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    return (cpu_ms() - before) / wall;
  }

  // The spinners' CPU time so far, all together, in ms (from each child's CPU clock).
  double cpu_ms() const {
    double total = 0;
    for (const pid_t pid : pids_) {
      clockid_t clock{};
      timespec ts{};
      if (clock_getcpuclockid(pid, &clock) == 0 && clock_gettime(clock, &ts) == 0) {
        total += static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
      }
    }
    return total;
  }
  ~cpu_hogs() {
    for (const pid_t pid : pids_) kill(pid, SIGKILL);
    for (const pid_t pid : pids_) {
      while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
  }

 private:
  std::vector<pid_t> pids_;
};

// ---- a forked child's report ------------------------------------------------------------------

// The report (a plain struct written once) of a fork()ed child `who` ("the child") that populates
// memory before it writes, read from `fd` within `timeout_ms`; closes fd. Throws
// std::runtime_error if none came in time or the child died before it wrote one.
template <class Report>
Report read_child_report(int fd, int timeout_ms, const char* who) {
  Report report{};
  pollfd ready{fd, POLLIN, 0};
  int polled;
  while ((polled = poll(&ready, 1, timeout_ms)) < 0 && errno == EINTR) {
  }
  const ssize_t got = polled == 1 ? read(fd, &report, sizeof report) : -1;
  close(fd);
  if (polled == 0) throw std::runtime_error(strprintf("%s did not populate within %d s", who, timeout_ms / 1000));
  if (got != static_cast<ssize_t>(sizeof report))
    throw std::runtime_error(std::string(who) + " died before it reported");
  return report;
}

// Runs `work` in a fresh fork()ed child of this process and returns the Report (a plain struct
// with a `char failed[]` message) it writes back; a child that throws, dies or takes longer
// than `timeout_ms` comes back as a Report whose `failed` says so.
template <class Report, class Work>
Report in_child(Work work, int timeout_ms) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe");
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork");
  if (pid == 0) {
    close(fds[0]);
    Report r;
    try {
      r = work();
    } catch (const std::exception& e) {
      std::snprintf(r.failed, sizeof r.failed, "%s", e.what());
    }
    const ssize_t wrote = write(fds[1], &r, sizeof r);
    _exit(wrote == static_cast<ssize_t>(sizeof r) ? 0 : 1);
  }
  close(fds[1]);
  Report r;
  try {
    r = read_child_report<Report>(fds[0], timeout_ms, "the case's child");
  } catch (const std::exception& e) {
    std::snprintf(r.failed, sizeof r.failed, "%s", e.what());
  }
  while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
  return r;
}

// Writes the JSON to stdout, or to `path` if there is one; false (and a line on stderr saying
// why) if the file could not be written.
inline bool write_document(const char* program, const std::string& path, const std::string& json) {
  if (path.empty()) {
    std::fputs(json.c_str(), stdout);
    return true;
  }
  std::FILE* out = std::fopen(path.c_str(), "w");
  if (out == nullptr || std::fputs(json.c_str(), out) < 0 || std::fclose(out) != 0) {
    std::fprintf(stderr, "%s: cannot write %s: %s\n", program, path.c_str(), std::strerror(errno));
    return false;
  }
  return true;
}

}  // namespace teardown_bench
