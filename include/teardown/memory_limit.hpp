// teardown/memory_limit.hpp — how much memory this process may use: physical RAM and every
// memory cgroup limit above it, as a container-aware runtime reads them.
//
//     std::uint64_t bytes = teardown::memory_limit();   // 0 if nothing is known
//
// Who may call what
//   memory_limit(), physical_memory()   any thread; noexcept; blocking (reads a few small files
//                                       under /proc and the cgroup filesystem). Allocates
//                                       nothing and throws nothing: it uses open/read into
//                                       fixed buffers on the caller's stack (about 20 KiB).
//   memory_limit(const memory_limit_sources&)   the same, on files named by the caller (tests
//                                       build a fake tree in a temporary directory).
//
// The answer is the tightest of (a figure that is missing, unreadable or garbled counts as no
// limit; 0 when nothing at all is known):
//   - physical memory (sysconf(_SC_PHYS_PAGES) * page size);
//   - cgroup v2: memory.max and memory.high of the process's cgroup and of each ancestor up to
//     the root the mount shows; "max" is no limit. memory.high is the throttle rather than the
//     kill, but a process above it is reclaimed and stalled, which deferring must not cause;
//   - cgroup v1: memory.limit_in_bytes of the memory controller's cgroup and of each ancestor.
//     "Unlimited" is written as a huge number (LLONG_MAX rounded down to pages), so a value at
//     or above physical memory (above 2^62 where physical memory is unknown) is no limit.
// A limit of 0 is read as no figure (0 means "unknown" to every caller).
//
// Where the files are: /proc/self/cgroup names the cgroup ("0::<path>" for v2, and for v1 the
// line whose controller list holds "memory"); /proc/self/mountinfo says where each hierarchy is
// mounted (any mount point, not only /sys/fs/cgroup: fstype cgroup2, or cgroup with the memory
// super option) and which part of the hierarchy the mount shows (its root field). The cgroup's
// directory is the mount point plus the cgroup path less that root, and the walk up stops at
// the mount point: above it is not the cgroup filesystem. So:
//   - a cgroup namespace (/proc/self/cgroup says "/", the mount's root is "/"): the mount point
//     is the namespace's root, whose files hold the container's limit. Ancestors outside the
//     namespace are invisible and their limits unread (physical memory still bounds);
//   - a container without one (the path is "/docker/<id>" and so is the mount's root): the
//     mount point is the cgroup itself;
//   - a path the mount does not show (a cgroup outside the namespace, "/.."): no figure.
// Design: docs/design.md, "memory_limit.hpp and the shared budget: one cap of a quarter of what the process may use".
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace teardown {

/// Physical memory in bytes; 0 if the system does not say.
inline std::uint64_t physical_memory() noexcept {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page);
}

/// Where memory_limit() reads. The defaults are the running process's own.
struct memory_limit_sources {
  const char* cgroup = "/proc/self/cgroup";        // the process's cgroup file
  const char* mountinfo = "/proc/self/mountinfo";  // its mount table
  const char* root = "";                           // prefixed to every mount point
  std::uint64_t physical = physical_memory();      // bytes; 0: unknown
};

namespace detail::memory_limit_impl {

constexpr std::size_t max_line = 4096;  // longer lines are skipped (no cgroup line is that long)
constexpr std::size_t max_path = 4096;  // PATH_MAX

// Reads a file line by line through a fixed buffer. A line longer than the buffer is skipped
// whole; a read error ends the file.
class line_reader {
 public:
  explicit line_reader(const char* path) noexcept : fd_(::open(path, O_RDONLY | O_CLOEXEC)) {}
  ~line_reader() {
    if (fd_ >= 0) ::close(fd_);
  }
  line_reader(const line_reader&) = delete;
  line_reader& operator=(const line_reader&) = delete;

  bool next(std::string_view& line) noexcept {
    bool skipping = false;
    for (;;) {
      if (const void* found = std::memchr(buffer_ + begin_, '\n', end_ - begin_)) {
        const std::size_t at = static_cast<std::size_t>(static_cast<const char*>(found) - buffer_);
        line = std::string_view(buffer_ + begin_, at - begin_);
        begin_ = at + 1;
        if (skipping) {
          skipping = false;
          continue;
        }
        return true;
      }
      if (begin_ != 0) {  // keep the partial line, make room after it
        std::memmove(buffer_, buffer_ + begin_, end_ - begin_);
        end_ -= begin_;
        begin_ = 0;
      }
      if (end_ == sizeof buffer_) {  // too long: drop it up to its newline
        skipping = true;
        end_ = 0;
      }
      const ssize_t got = fd_ < 0 ? 0 : read_some(buffer_ + end_, sizeof buffer_ - end_);
      if (got <= 0) {  // the end: a last line without a newline still counts
        if (end_ == begin_ || skipping) return false;
        line = std::string_view(buffer_ + begin_, end_ - begin_);
        begin_ = end_;
        return true;
      }
      end_ += static_cast<std::size_t>(got);
    }
  }

 private:
  ssize_t read_some(char* into, std::size_t size) noexcept {
    ssize_t got;
    do {
      got = ::read(fd_, into, size);
    } while (got < 0 && errno == EINTR);
    return got;
  }

  int fd_;
  std::size_t begin_ = 0;
  std::size_t end_ = 0;
  char buffer_[max_line];
};

// The next space-separated field of `rest`, which loses it.
inline std::string_view next_field(std::string_view& rest, char separator = ' ') noexcept {
  const std::size_t at = rest.find(separator);
  const std::string_view field = rest.substr(0, at);
  rest = at == std::string_view::npos ? std::string_view() : rest.substr(at + 1);
  return field;
}

inline bool has_token(std::string_view list, std::string_view token) noexcept {
  while (!list.empty()) {
    if (next_field(list, ',') == token) return true;
  }
  return false;
}

// A path with its trailing slashes removed: "/" becomes "", so "/a" + suffix concatenates.
inline std::string_view without_trailing_slashes(std::string_view path) noexcept {
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  return path;
}

// mountinfo writes space, tab, newline and backslash as \ooo; undoes that into `out`.
inline bool unescape(std::string_view escaped, char* out, std::size_t capacity, std::size_t& length) noexcept {
  length = 0;
  for (std::size_t i = 0; i < escaped.size(); ++i) {
    char c = escaped[i];
    if (c == '\\' && i + 3 < escaped.size()) {
      const char a = escaped[i + 1], b = escaped[i + 2], d = escaped[i + 3];
      if (a >= '0' && a <= '3' && b >= '0' && b <= '7' && d >= '0' && d <= '7') {
        c = static_cast<char>((a - '0') * 64 + (b - '0') * 8 + (d - '0'));
        i += 3;
      }
    }
    if (length + 1 >= capacity) return false;
    out[length++] = c;
  }
  out[length] = '\0';
  return true;
}

// A file's whole content as a number of bytes: digits, then at most a newline. "max" (v2's no
// limit), garbage, an empty or missing file, overflow: false.
inline bool read_bytes(const char* path, std::uint64_t& value) noexcept {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char text[32];
  ssize_t got;
  do {
    got = ::read(fd, text, sizeof text);
  } while (got < 0 && errno == EINTR);
  ::close(fd);
  if (got <= 0 || static_cast<std::size_t>(got) == sizeof text) return false;
  std::size_t length = static_cast<std::size_t>(got);
  if (text[length - 1] == '\n') --length;
  if (length == 0) return false;
  std::uint64_t parsed = 0;
  for (std::size_t i = 0; i < length; ++i) {
    if (text[i] < '0' || text[i] > '9') return false;
    const std::uint64_t digit = static_cast<std::uint64_t>(text[i] - '0');
    if (parsed > (UINT64_MAX - digit) / 10) return false;
    parsed = parsed * 10 + digit;
  }
  value = parsed;
  return true;
}

enum class version { v1, v2 };

struct limit_walk {
  std::uint64_t physical;
  std::uint64_t tightest;

  void consider(std::uint64_t limit, version which) noexcept {
    if (limit == 0) return;
    if (which == version::v1) {
      // v1's "unlimited" is a page-rounded LLONG_MAX; any figure past the RAM limits nothing.
      if (physical != 0 ? limit >= physical : limit >= (std::uint64_t{1} << 62)) return;
    }
    if (tightest == 0 || limit < tightest) tightest = limit;
  }

  // Reads the limit files in `dir` (a buffer of max_path, `length` used, `stop` the mount
  // point's length) and in each parent up to the mount point.
  void walk_up(char* dir, std::size_t length, std::size_t stop, version which) noexcept {
    for (;;) {
      if (which == version::v2) {
        read_into(dir, length, "/memory.max", which);
        read_into(dir, length, "/memory.high", which);
      } else {
        read_into(dir, length, "/memory.limit_in_bytes", which);
      }
      if (length <= stop) return;
      while (length > stop && dir[length - 1] != '/') --length;
      if (length > stop) --length;  // the slash itself
      dir[length] = '\0';
    }
  }

  void read_into(char* dir, std::size_t length, std::string_view file, version which) noexcept {
    if (length + file.size() >= max_path) return;
    std::memcpy(dir + length, file.data(), file.size());
    dir[length + file.size()] = '\0';
    std::uint64_t value = 0;
    if (read_bytes(dir, value)) consider(value, which);
    dir[length] = '\0';
  }
};

// The cgroup path relative to what the mount shows (its root): "" for the mount point itself;
// false when the mount does not show the cgroup.
inline bool relative_path(std::string_view cgroup, std::string_view mount_root, std::string_view& suffix) noexcept {
  cgroup = without_trailing_slashes(cgroup);
  mount_root = without_trailing_slashes(mount_root);
  for (std::size_t at = cgroup.find("/.."); at != std::string_view::npos; at = cgroup.find("/..", at + 1)) {
    if (at + 3 == cgroup.size() || cgroup[at + 3] == '/') return false;  // outside the namespace
  }
  if (cgroup.substr(0, mount_root.size()) != mount_root) return false;
  suffix = cgroup.substr(mount_root.size());
  return suffix.empty() || suffix.front() == '/';
}

// Finds the process's memory cgroup directory in each hierarchy the sources show (see "Where
// the files are") and calls visit(dir, length, stop, which) once per hierarchy: dir is a
// NUL-terminated buffer of max_path bytes, `length` used, `stop` the mount point's length (the
// walk up ends there). memory_limit() and pressure.hpp's sampler and PSI lookup share it.
template <class Visit>
void for_each_memory_cgroup(const memory_limit_sources& sources, Visit&& visit) noexcept {
#if defined(__linux__)
  char v2_path[max_path];
  char v1_path[max_path];
  std::size_t v2_length = 0, v1_length = 0;
  bool v2_known = false, v1_known = false;
  {
    line_reader cgroup(sources.cgroup);
    std::string_view line;
    while (cgroup.next(line)) {
      const std::string_view id = next_field(line, ':');
      const std::string_view controllers = next_field(line, ':');
      const std::string_view path = line;  // the rest: a path may hold ':'
      if (path.empty() || path.front() != '/' || path.size() >= max_path) continue;
      if (id == "0" && controllers.empty() && !v2_known) {
        std::memcpy(v2_path, path.data(), path.size());
        v2_length = path.size();
        v2_known = true;
      } else if (has_token(controllers, "memory") && !v1_known) {
        std::memcpy(v1_path, path.data(), path.size());
        v1_length = path.size();
        v1_known = true;
      }
    }
  }
  if (v2_known || v1_known) {
    line_reader mounts(sources.mountinfo);
    std::string_view line;
    const std::string_view root = without_trailing_slashes(sources.root);
    while ((v2_known || v1_known) && mounts.next(line)) {
      // id parent major:minor root mount-point options [optional...] - fstype source super-options
      for (int i = 0; i < 3; ++i) (void)next_field(line);
      const std::string_view mount_root = next_field(line);
      const std::string_view mount_point = next_field(line);
      while (!line.empty() && next_field(line) != "-") {
      }
      const std::string_view fstype = next_field(line);
      (void)next_field(line);  // source
      const std::string_view super_options = next_field(line);
      version which;
      std::string_view cgroup;
      if (fstype == "cgroup2" && v2_known) {
        which = version::v2;
        cgroup = std::string_view(v2_path, v2_length);
      } else if (fstype == "cgroup" && v1_known && has_token(super_options, "memory")) {
        which = version::v1;
        cgroup = std::string_view(v1_path, v1_length);
      } else {
        continue;
      }
      char unescaped_root[max_path];
      std::size_t root_length = 0;
      if (!unescape(mount_root, unescaped_root, sizeof unescaped_root, root_length)) continue;
      std::string_view suffix;
      if (!relative_path(cgroup, std::string_view(unescaped_root, root_length), suffix)) continue;
      // The directory: sources.root + mount point + suffix.
      char dir[max_path];
      std::size_t length = 0;
      if (root.size() >= max_path) continue;
      std::memcpy(dir, root.data(), root.size());
      length = root.size();
      std::size_t point_length = 0;
      if (!unescape(mount_point, dir + length, max_path - length, point_length)) continue;
      length += point_length;
      while (length > root.size() && dir[length - 1] == '/') --length;  // "/" itself: nothing
      const std::size_t stop = length;
      if (length + suffix.size() >= max_path) continue;
      std::memcpy(dir + length, suffix.data(), suffix.size());
      length += suffix.size();
      dir[length] = '\0';
      visit(dir, length, stop, which);
      (which == version::v2 ? v2_known : v1_known) = false;  // one mount per hierarchy
    }
  }
#else
  (void)sources;
  (void)visit;
#endif
}

}  // namespace detail::memory_limit_impl

/// The tightest memory limit the sources show (see the header comment), in bytes; 0 if none is
/// known.
inline std::uint64_t memory_limit(const memory_limit_sources& sources) noexcept {
  using namespace detail::memory_limit_impl;
  limit_walk limits{sources.physical, sources.physical};
  for_each_memory_cgroup(sources, [&](char* dir, std::size_t length, std::size_t stop, version which) noexcept {
    limits.walk_up(dir, length, stop, which);
  });
  return limits.tightest;
}

/// The running process's memory limit: memory_limit(memory_limit_sources{}).
inline std::uint64_t memory_limit() noexcept { return memory_limit(memory_limit_sources{}); }

}  // namespace teardown
