// exec_bench — what an exec() costs a program run under teardown-run (tools/), against the same
// exec() without it. A plain program: each sample is a chain of re-execs timed from this
// process, repeated and summarised as mean / median / min / max per exec; the variants take
// turns within each repetition, so that drift on a busy machine hits them alike.
//
//   exec_bench [--execs N] [--reps R] [--out FILE]
//     --execs N   execs per chain (default 50)
//     --reps R    chains per variant (default 40)
//
// One chain: fork(); the child execve()s this program as "chain N", which execve()s itself N
// times and then exits; the time is fork -> waitpid() returning, divided by N.
//   plain        LD_PRELOAD unset: the exec alone
//   preloaded    LD_PRELOAD=libteardown_shadow.so, as every exec under teardown-run has it: each
//                image loads the library (the loader's work), and its constructor starts a
//                detached helper (two clones, the helper's setup) before main(); the previous
//                image's helper exits at the exec, off this path
//   loaded-only  LD_PRELOAD as "preloaded" with TEARDOWN_SHADOW=0: the loader's work and the
//                constructor's check, no helper; preloaded minus this is the helper's start
//   launcher     the preloaded chain with teardown-run in front (one more exec, teardown-run's
//                own, counted over the chain's N): what starting a program under it adds once
// JSON on stdout (or --out): {"benchmark": "exec_bench", "config": {...}, "rows": [{"variant",
// "execs", "reps", "us_per_exec": {"mean", "median", "min", "max"}}]}; a table on stderr.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#ifndef TEARDOWN_SHADOW_LIBRARY
#error "TEARDOWN_SHADOW_LIBRARY: libteardown_shadow.so's path"
#endif
#ifndef TEARDOWN_RUN
#error "TEARDOWN_RUN: teardown-run's path"
#endif

extern char** environ;

namespace {

enum class variant { plain, preloaded, loaded_only, launcher };
constexpr const char* names[] = {"plain", "preloaded", "loaded-only", "launcher"};
constexpr int variants = 4;

std::vector<std::string> environment_for(variant v) {
  std::vector<std::string> environment;
  for (char** variable = environ; *variable != nullptr; ++variable) {
    if (std::strncmp(*variable, "LD_PRELOAD=", 11) != 0 && std::strncmp(*variable, "TEARDOWN_SHADOW", 15) != 0) {
      environment.emplace_back(*variable);
    }
  }
  if (v == variant::preloaded || v == variant::loaded_only) {
    environment.emplace_back(std::string("LD_PRELOAD=") + TEARDOWN_SHADOW_LIBRARY);
  }
  if (v == variant::loaded_only) environment.emplace_back("TEARDOWN_SHADOW=0");
  return environment;
}

// Microseconds per exec of one chain.
double chain(variant v, int execs) {
  const std::string self = "/proc/self/exe";
  char resolved[4096];
  const ssize_t length = readlink(self.c_str(), resolved, sizeof resolved - 1);
  if (length <= 0) std::exit(1);
  resolved[length] = '\0';
  std::vector<std::string> arguments;
  if (v == variant::launcher) arguments.emplace_back(TEARDOWN_RUN);
  arguments.insert(arguments.end(), {resolved, "chain", std::to_string(execs - 1)});
  std::vector<std::string> environment = environment_for(v);
  std::vector<char*> argv, envp;
  for (std::string& argument : arguments) argv.push_back(argument.data());
  argv.push_back(nullptr);
  for (std::string& variable : environment) envp.push_back(variable.data());
  envp.push_back(nullptr);
  const auto start = std::chrono::steady_clock::now();
  const pid_t child = fork();
  if (child == 0) {
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  int status = 0;
  waitpid(child, &status, 0);
  const auto end = std::chrono::steady_clock::now();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "exec_bench: a %s chain failed (status %d)\n", names[static_cast<int>(v)], status);
    std::exit(1);
  }
  return std::chrono::duration<double, std::micro>(end - start).count() / execs;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "chain") == 0) {
    const int left = std::atoi(argv[2]);
    if (left <= 0) return 0;
    const std::string next = std::to_string(left - 1);
    execl("/proc/self/exe", argv[0], "chain", next.c_str(), static_cast<char*>(nullptr));
    return 126;
  }
  int execs = 50, reps = 40;
  const char* out = nullptr;
  for (int i = 1; i < argc; ++i) {
    const std::string argument = argv[i];
    if (argument == "--execs" && i + 1 < argc) {
      execs = std::max(1, std::atoi(argv[++i]));
    } else if (argument == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (argument == "--out" && i + 1 < argc) {
      out = argv[++i];
    } else {
      std::fprintf(stderr, "usage: exec_bench [--execs N] [--reps R] [--out FILE]\n");
      return 2;
    }
  }
  std::vector<double> samples[variants];
  for (int rep = 0; rep < reps; ++rep) {
    for (int v = 0; v < variants; ++v) samples[v].push_back(chain(static_cast<variant>(v), execs));
  }
  std::string json = "{\"benchmark\": \"exec_bench\", \"config\": {\"execs\": " + std::to_string(execs) +
                     ", \"reps\": " + std::to_string(reps) + "}, \"rows\": [";
  std::fprintf(stderr, "%-10s %10s %10s %10s %10s   (us per exec, %d chains of %d execs)\n", "variant", "mean",
               "median", "min", "max", reps, execs);
  double means[variants] = {};
  for (int v = 0; v < variants; ++v) {
    std::vector<double>& s = samples[v];
    std::sort(s.begin(), s.end());
    double sum = 0;
    for (const double x : s) sum += x;
    means[v] = sum / static_cast<double>(s.size());
    const double median = s[s.size() / 2];
    std::fprintf(stderr, "%-10s %10.1f %10.1f %10.1f %10.1f\n", names[v], means[v], median, s.front(), s.back());
    char row[256];
    std::snprintf(row, sizeof row,
                  "%s{\"variant\": \"%s\", \"execs\": %d, \"reps\": %d, \"us_per_exec\": {\"mean\": %.2f, \"median\": "
                  "%.2f, \"min\": %.2f, \"max\": %.2f}}",
                  v == 0 ? "" : ", ", names[v], execs, reps, means[v], median, s.front(), s.back());
    json += row;
  }
  json += "]}\n";
  std::fprintf(stderr, "preloaded - plain: %+.1f us per exec (mean), %+.1f us (min); ratio of means %.2f\n",
               means[1] - means[0], samples[1].front() - samples[0].front(), means[1] / means[0]);
  std::fprintf(stderr, "of which the library's loading: %+.1f us (mean), the helper's start: %+.1f us (mean)\n",
               means[2] - means[0], means[1] - means[2]);
  if (out != nullptr) {
    std::FILE* file = std::fopen(out, "w");
    if (file == nullptr) return 1;
    std::fputs(json.c_str(), file);
    std::fclose(file);
  } else {
    std::fputs(json.c_str(), stdout);
  }
  return 0;
}
