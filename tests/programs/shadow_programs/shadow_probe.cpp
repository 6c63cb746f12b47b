// shadow_preload_test's program, with its own copy of teardown/process.hpp:
//   exit N        returns N
//   wall N        forks N children, waits for every child with __WALL until ECHILD, returns 7
//   api           reports what the API sees of the preload library's helper, enables (which must
//                 return that helper), disables, reports again; returns 0
//   reexec N      exec()s itself N times; the last image counts its zombie children, forks one
//                 child, returns 0 if that fork worked, 3 if not
//   cloexec       says "ready", waits for a line, clears FD_CLOEXEC on every descriptor and
//                 exec()s itself as "wait"
//   wait          says "ready", waits for EOF on stdin, returns 0
//   reaper CMD... a prompt subreaper (as systemd, tini or docker-init are): runs CMD, reaps every
//                 child it is handed as soon as it exits, returns CMD's exit status
// Each report is one line on stdout.
#include <dirent.h>
#include <sys/prctl.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "teardown/process.hpp"

namespace {

int zombie_children() {
  int count = 0;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return -1;
  while (const dirent* entry = readdir(proc)) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    std::ifstream stat(std::string("/proc/") + entry->d_name + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const std::size_t close = text.rfind(')');
    if (close == std::string::npos || close + 4 >= text.size()) continue;
    if (text[close + 2] == 'Z' && std::atol(text.c_str() + close + 4) == getpid()) ++count;
  }
  closedir(proc);
  return count;
}

void line(const std::string& text) {
  std::printf("%s\n", text.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  namespace tp = teardown::process;
  const std::string command = argc > 1 ? argv[1] : "exit";
  const int number = argc > 2 ? std::atoi(argv[2]) : 0;
  if (command == "exit") return number;
  if (command == "reaper" && argc > 2) {
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) return 70;
    const pid_t child = fork();
    if (child == 0) {
      execv(argv[2], argv + 2);
      _exit(127);
    }
    int result = 71, status = 0;
    for (pid_t reaped; (reaped = waitpid(-1, &status, 0)) > 0 || errno == EINTR;) {
      if (reaped == child) result = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    return result;
  }
  if (command == "wall") {
    for (int i = 0; i < number; ++i) {
      if (fork() == 0) _exit(0);
    }
    int reaped = 0, status = 0;
    while (waitpid(-1, &status, __WALL) > 0 || errno == EINTR) ++reaped;
    line("reaped " + std::to_string(reaped));
    return 7;
  }
  if (command == "api") {
    line("before " + std::to_string(tp::shadow_teardown_enabled()) + " " + std::to_string(tp::shadow_pid()));
    line("enable " + std::to_string(tp::enable_shadow_teardown()));
    tp::disable_shadow_teardown();
    line("after " + std::to_string(tp::shadow_teardown_enabled()) + " " + std::to_string(tp::shadow_pid()));
    return 0;
  }
  if (command == "reexec") {
    if (number > 0) {
      const std::string next = std::to_string(number - 1);
      execl("/proc/self/exe", argv[0], "reexec", next.c_str(), static_cast<char*>(nullptr));
      line(std::string("exec failed: ") + std::strerror(errno));
      return 4;
    }
    line("zombies " + std::to_string(zombie_children()));
    const pid_t child = fork();
    if (child == 0) _exit(0);
    if (child < 0) {
      line(std::string("fork failed: ") + std::strerror(errno));
      return 3;
    }
    waitpid(child, nullptr, 0);
    line("fork ok");
    return 0;
  }
  if (command == "cloexec" || command == "wait") {
    line("ready " + std::to_string(getpid()));
    char buffer[256];
    if (command == "wait") {
      while (read(0, buffer, sizeof buffer) > 0) {
      }
      return 0;
    }
    if (read(0, buffer, sizeof buffer) <= 0) return 5;
    for (int fd = 0; fd < 1024; ++fd) {
      const int flags = fcntl(fd, F_GETFD);
      if (flags >= 0) fcntl(fd, F_SETFD, flags & ~FD_CLOEXEC);
    }
    execl("/proc/self/exe", argv[0], "wait", static_cast<char*>(nullptr));
    return 4;
  }
  return 64;
}
