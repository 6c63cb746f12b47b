// teardown/process_reaper/anonymous_rss.hpp — how much memory a reap can give back: a process's
// anonymous RSS from /proc (statm's resident minus shared). Internal: process_reaper's charge.
//
// Who may call what: any thread; no allocation, a few open/read system calls (not
// async-signal-safe only for snprintf and opendir). 0 when /proc cannot tell.
// Design: docs/design.md, "Processes: the supervisor's side (process_reaper.hpp, Linux)".
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>

namespace teardown::process::detail {

// One statm file's resident minus shared, in pages; false if it cannot be read.
inline bool statm_anonymous_pages(const char* path, std::uint64_t& pages) noexcept {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char text[160];
  ssize_t got = 0;
  do {
    got = ::read(fd, text, sizeof text - 1);
  } while (got < 0 && errno == EINTR);
  ::close(fd);
  if (got <= 0) return false;
  text[got] = '\0';
  unsigned long long size = 0, resident = 0, shared = 0;
  if (std::sscanf(text, "%llu %llu %llu", &size, &resident, &shared) != 3 || shared > resident) return false;
  pages = resident - shared;
  return true;
}

// The process's anonymous RSS in bytes (statm's resident minus shared: what a reap can free),
// 0 if /proc cannot tell. The caller checks afterwards that the pid still named its process.
// /proc/PID/statm is the thread group leader's: once the main thread has exited
// (pthread_exit) it reads zero while the other threads keep the mm. Every thread shares that
// mm, so a live one's task/TID/statm tells instead.
inline std::uint64_t anonymous_rss_bytes(pid_t pid) noexcept {
  const auto page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%ld/statm", static_cast<long>(pid));
  std::uint64_t pages = 0;
  if (statm_anonymous_pages(path, pages) && pages != 0) return pages * page;
  std::snprintf(path, sizeof path, "/proc/%ld/task", static_cast<long>(pid));
  DIR* tasks = ::opendir(path);
  if (tasks == nullptr) return 0;
  std::uint64_t most = 0;
  while (const dirent* entry = ::readdir(tasks)) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    std::snprintf(path, sizeof path, "/proc/%ld/task/%.20s/statm", static_cast<long>(pid), entry->d_name);
    // A thread that exited reads zero; any live one reads the mm's.
    if (statm_anonymous_pages(path, pages) && pages > most) most = pages;
  }
  ::closedir(tasks);
  return most * page;
}

}  // namespace teardown::process::detail
