// shadow_preload_test's launcher (uninstrumented): runs PROGRAM through one route of the exec
// family or posix_spawn, the way programs, shells and make do, so that the preload library's
// wrappers are seen on each:
//
//     shadow_exec_launcher ROUTE PROGRAM [ARG...]
//
//   execve execv execvp execvpe execl execlp execle fexecve fexecve_opath execveat vfork
//                 PROGRAM replaces the launcher (vfork: in a vfork() child, which execve()s and
//                 is waited for; fexecve_opath: through an O_PATH descriptor); the p-variants
//                 search PATH for a PROGRAM without '/'. execl, execlp and execle take at most
//                 three ARGs.
//   posix_spawn posix_spawnp
//                 PROGRAM runs as a child, which is waited for.
//   system popen  "PROGRAM ARG..." runs through /bin/sh (popen: its output is copied to ours).
// A child's exit status is the launcher's (128 + N for a signal N). A route that fails prints
// "ROUTE: errno N (NAME)" on stdout, N the error it reported, and returns 120.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

extern char** environ;

namespace {

int failed(const char* route, int error) {
  std::printf("%s: errno %d (%s)\n", route, error, strerrorname_np(error) != nullptr ? strerrorname_np(error) : "?");
  std::fflush(stdout);
  return 120;
}

int status_of(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

int wait_for(pid_t child) {
  int status = 0;
  while (waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) return failed("waitpid", errno);
  }
  return status_of(status);
}

// execl-style calls: call(ARG...) with the launcher's ARGs (at most three).
template <class Call>
void with_list(int count, char** arguments, Call call) {
  switch (count) {
    case 0: call(); break;
    case 1: call(arguments[0]); break;
    case 2: call(arguments[0], arguments[1]); break;
    default: call(arguments[0], arguments[1], arguments[2]); break;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: shadow_exec_launcher ROUTE PROGRAM [ARG...]\n");
    return 64;
  }
  const std::string route = argv[1];
  const char* program = argv[2];
  char** const program_argv = argv + 2;
  const int extra = argc - 3;
  std::fflush(stdout);
  if (route == "execve") {
    execve(program, program_argv, environ);
  } else if (route == "execv") {
    execv(program, program_argv);
  } else if (route == "execvp") {
    execvp(program, program_argv);
  } else if (route == "execvpe") {
    execvpe(program, program_argv, environ);
  } else if (route == "execl") {
    with_list(extra, argv + 3, [&](auto... list) { execl(program, program, list..., nullptr); });
  } else if (route == "execlp") {
    with_list(extra, argv + 3, [&](auto... list) { execlp(program, program, list..., nullptr); });
  } else if (route == "execle") {
    with_list(extra, argv + 3, [&](auto... list) { execle(program, program, list..., nullptr, environ); });
  } else if (route == "fexecve" || route == "fexecve_opath" || route == "execveat") {
    const int fd = open(program, (route == "fexecve_opath" ? O_PATH : O_RDONLY) | O_CLOEXEC);
    if (fd < 0) return failed(argv[1], errno);
    if (route != "execveat") {
      fexecve(fd, program_argv, environ);
    } else {
      execveat(fd, "", program_argv, environ, AT_EMPTY_PATH);
    }
  } else if (route == "vfork") {
    volatile int error = 0;
    const pid_t child = vfork();
    if (child == 0) {
      execve(program, program_argv, environ);
      error = errno;  // the vfork child shares our memory until it execs or exits
      _exit(127);
    }
    if (child < 0) return failed("vfork", errno);
    const int status = wait_for(child);
    return error != 0 ? failed("vfork", error) : status;
  } else if (route == "posix_spawn" || route == "posix_spawnp") {
    pid_t child = 0;
    const int error = route == "posix_spawn"
                          ? posix_spawn(&child, program, nullptr, nullptr, program_argv, environ)
                          : posix_spawnp(&child, program, nullptr, nullptr, program_argv, environ);
    if (error != 0) return failed(argv[1], error);
    return wait_for(child);
  } else if (route == "system" || route == "popen") {
    std::string command;
    for (int i = 2; i < argc; ++i) command += std::string(i > 2 ? " " : "") + argv[i];
    if (route == "system") {
      const int status = std::system(command.c_str());
      return status < 0 ? failed("system", errno) : status_of(status);
    }
    FILE* const output = popen(command.c_str(), "r");
    if (output == nullptr) return failed("popen", errno);
    char buffer[4096];
    for (std::size_t got; (got = std::fread(buffer, 1, sizeof buffer, output)) > 0;) {
      std::fwrite(buffer, 1, got, stdout);
    }
    const int status = pclose(output);
    return status < 0 ? failed("pclose", errno) : status_of(status);
  } else {
    std::fprintf(stderr, "shadow_exec_launcher: unknown route %s\n", argv[1]);
    return 64;
  }
  return failed(argv[1], errno);
}
