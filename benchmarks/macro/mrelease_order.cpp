// Which end does process_mrelease reap first? A frozen (cgroup v1 freezer), SIGKILLed victim with
// two 1 GiB mappings; the reap runs alone while /proc/PID/smaps is sampled.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
static void put(const std::string& path, const std::string& v) { std::ofstream(path) << v; }
int main() {
  const size_t gib = 1ul << 30, page = 4096;
  int ready[2]; pipe(ready);
  pid_t pid = fork();
  if (pid == 0) {
    char* base = (char*)mmap(nullptr, 2 * gib + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    mprotect(base + gib, page, PROT_NONE);
    for (size_t at = 0; at < 2 * gib + page; at += page) if (at < gib || at >= gib + page) base[at] = 1;
    write(ready[1], "x", 1);
    for (;;) pause();
  }
  char c; read(ready[0], &c, 1);
  const std::string cg = "/sys/fs/cgroup/freezer/td_order";
  mkdir(cg.c_str(), 0755);
  put(cg + "/cgroup.procs", std::to_string(pid));
  put(cg + "/freezer.state", "FROZEN");
  for (int i = 0; i < 1000; ++i) {
    std::ifstream f(cg + "/freezer.state");
    std::string s;
    f >> s;
    if (s == "FROZEN") break;
    usleep(1000);
  }
  int pidfd = syscall(SYS_pidfd_open, pid, 0);
  syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0);
  std::atomic<bool> done{false}; long rc = 0; int err = 0;
  auto t0 = std::chrono::steady_clock::now();
  std::thread reaper([&] { rc = syscall(448, pidfd, 0); err = errno; done = true; });
  std::vector<std::string> log;
  while (!done) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/smaps");
    std::string line, cur; long rss[2] = {-1, -1}; int idx = -1;
    while (std::getline(f, line)) {
      if (line.find('-') != std::string::npos && line.find(' ') != std::string::npos && isxdigit(line[0]) &&
          line.find("rw-p") != std::string::npos) {
        unsigned long a, b; sscanf(line.c_str(), "%lx-%lx", &a, &b);
        idx = (b - a >= gib) ? (idx + 1) : idx;  // the two big ones, in address order
        cur = (b - a >= gib) ? "big" : "";
      } else if (cur == "big" && line.rfind("Rss:", 0) == 0 && idx >= 0 && idx < 2) {
        rss[idx] = atol(line.c_str() + 4); cur = "";
      }
    }
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    char buf[128]; snprintf(buf, sizeof buf, "%8.2f ms  low %8ld kB  high %8ld kB", ms, rss[0], rss[1]);
    log.push_back(buf);
    usleep(2000);
  }
  double total = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  reaper.join();
  for (size_t i = 0; i < log.size(); i += std::max<size_t>(1, log.size() / 12)) puts(log[i].c_str());
  printf("process_mrelease returned %ld (errno %d) after %.1f ms\n", rc, rc ? err : 0, total);
  put(cg + "/freezer.state", "THAWED");
  waitpid(pid, nullptr, 0);
  rmdir(cg.c_str());
}
