// tools/sanitizer_runtime.hpp — which sanitizer runtime an executable needs first in its process,
// read from its ELF dynamic section: the one reading that teardown-run (for PROGRAM) and
// libteardown_shadow.so (at every exec and posix_spawn of the processes it is loaded in) share.
//
// GCC's AddressSanitizer (libasan.so, and libhwasan.so) refuses to start unless its runtime is the
// first object after the executable ("ASan runtime does not come first in initial library list"),
// and a program built with -fsanitize=address names it as a DT_NEEDED entry, which every
// LD_PRELOAD object precedes: such a program needs the runtime first in LD_PRELOAD.
//
// Everything here allocates nothing, takes no lock and calls only async-signal-safe functions
// (stat, open, pread, close, getenv's scan of environ), with buffers of fixed size on the stack:
// the preload library calls it from execve(), which may run in a vfork() child or a signal
// handler. What does not fit (a name over 255 bytes, a path over PATH_MAX) reads as "nothing
// needed", and the exec runs unchanged.
#pragma once

#include <elf.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string_view>

namespace teardown_tools {

// A DT_NEEDED name, or a path: '\0'-terminated.
struct runtime_name {
  char text[256] = {};
  std::string_view view() const noexcept { return text; }
};

namespace detail {

inline bool read_exactly(int fd, void* into, std::size_t bytes, off_t offset) noexcept {
  return pread(fd, into, bytes, offset) == static_cast<ssize_t>(bytes);
}

// Calls visit(segment) for each program header, 16 at a time; stops (and returns true) when
// visit returns true.
template <class Visit>
bool for_each_segment(int fd, const Elf64_Ehdr& header, Visit visit) noexcept {
  Elf64_Phdr chunk[16];
  for (std::size_t first = 0; first < header.e_phnum; first += 16) {
    const std::size_t count = header.e_phnum - first < 16 ? header.e_phnum - first : 16;
    const off_t offset = static_cast<off_t>(header.e_phoff + first * sizeof(Elf64_Phdr));
    if (!read_exactly(fd, chunk, count * sizeof(Elf64_Phdr), offset)) return false;
    for (std::size_t i = 0; i < count; ++i) {
      if (visit(chunk[i])) return true;
    }
  }
  return false;
}

// Calls visit(entry) for each entry of the dynamic section, 32 at a time, up to DT_NULL; stops
// (and returns true) when visit returns true.
template <class Visit>
bool for_each_dynamic(int fd, const Elf64_Phdr& dynamic, Visit visit) noexcept {
  Elf64_Dyn chunk[32];
  const std::size_t total = dynamic.p_filesz / sizeof(Elf64_Dyn);
  for (std::size_t first = 0; first < total; first += 32) {
    const std::size_t count = total - first < 32 ? total - first : 32;
    const off_t offset = static_cast<off_t>(dynamic.p_offset + first * sizeof(Elf64_Dyn));
    if (!read_exactly(fd, chunk, count * sizeof(Elf64_Dyn), offset)) return false;
    for (std::size_t i = 0; i < count; ++i) {
      if (chunk[i].d_tag == DT_NULL) return false;
      if (visit(chunk[i])) return true;
    }
  }
  return false;
}

inline bool is_sanitizer_runtime(std::string_view name) noexcept {
  return name.starts_with("libasan.so") || name.starts_with("libhwasan.so");
}

// The interpreter of a "#!" script read from the start of `fd`, as the kernel's binfmt_script
// takes it (the first word after "#!", within the first 256 bytes); false if not a script.
inline bool script_interpreter(int fd, runtime_name& interpreter) noexcept {
  char line[256];
  const ssize_t got = pread(fd, line, sizeof line, 0);
  if (got < 3 || line[0] != '#' || line[1] != '!') return false;
  const std::string_view text(line, static_cast<std::size_t>(got));
  const std::size_t start = text.find_first_not_of(" \t", 2);
  if (start == std::string_view::npos) return false;
  const std::size_t end = text.find_first_of(" \t\n", start);
  if (end == std::string_view::npos || end == start || end - start >= sizeof interpreter.text) return false;
  std::memcpy(interpreter.text, line + start, end - start);
  interpreter.text[end - start] = '\0';
  return true;
}

}  // namespace detail

// Calls visit(std::string_view name) for each DT_NEEDED entry of the 64-bit little-endian ELF file
// open as `fd` (names over 255 bytes are cut there); stops when visit returns true and then
// returns true. Anything else (a script, a static program, an unreadable file) visits nothing.
template <class Visit>
bool for_each_needed(int fd, Visit visit) noexcept {
  Elf64_Ehdr header{};
  if (!detail::read_exactly(fd, &header, sizeof header, 0) || std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0 ||
      header.e_ident[EI_CLASS] != ELFCLASS64 || header.e_ident[EI_DATA] != ELFDATA2LSB ||
      header.e_phentsize != sizeof(Elf64_Phdr) || header.e_phnum >= 4096) {
    return false;
  }
  Elf64_Phdr dynamic{};
  const bool found = detail::for_each_segment(fd, header, [&](const Elf64_Phdr& segment) {
    if (segment.p_type != PT_DYNAMIC) return false;
    dynamic = segment;
    return true;
  });
  if (!found || dynamic.p_filesz > (1u << 20)) return false;
  // DT_STRTAB is a virtual address: as a file offset, through the loaded segment that holds it.
  Elf64_Addr strings_address = 0;
  bool have_strings = detail::for_each_dynamic(fd, dynamic, [&](const Elf64_Dyn& entry) {
    if (entry.d_tag != DT_STRTAB) return false;
    strings_address = entry.d_un.d_ptr;
    return true;
  });
  Elf64_Off strings = 0;
  have_strings = have_strings && detail::for_each_segment(fd, header, [&](const Elf64_Phdr& segment) {
    if (segment.p_type != PT_LOAD || strings_address < segment.p_vaddr ||
        strings_address >= segment.p_vaddr + segment.p_filesz) {
      return false;
    }
    strings = segment.p_offset + (strings_address - segment.p_vaddr);
    return true;
  });
  if (!have_strings) return false;
  return detail::for_each_dynamic(fd, dynamic, [&](const Elf64_Dyn& entry) {
    if (entry.d_tag != DT_NEEDED) return false;
    char name[256] = {};
    if (pread(fd, name, sizeof name - 1, static_cast<off_t>(strings + entry.d_un.d_val)) <= 0) return false;
    return visit(std::string_view(name));
  });
}

namespace detail {

enum class inspected { nothing, runtime, script };

// What the regular file open as `fd` is: an ELF program that needs a sanitizer runtime first
// (into `runtime`), a "#!" script (its interpreter into `interpreter`), or neither.
inline inspected inspect(int fd, runtime_name& runtime, runtime_name& interpreter) noexcept {
  struct stat status {};
  if (fstat(fd, &status) != 0 || !S_ISREG(status.st_mode)) return inspected::nothing;
  if (script_interpreter(fd, interpreter)) return inspected::script;
  const bool found = for_each_needed(fd, [&](std::string_view name) {
    if (!is_sanitizer_runtime(name)) return false;
    std::memcpy(runtime.text, name.data(), name.size());
    runtime.text[name.size()] = '\0';
    return true;
  });
  return found ? inspected::runtime : inspected::nothing;
}

// Follows a script's interpreters (at most 4 levels, as the kernel nests them) from `interpreter`.
inline bool runtime_of_interpreter(runtime_name& interpreter, runtime_name& runtime) noexcept;

}  // namespace detail

// The sanitizer runtime that the program at `path` (relative to `directory`, as openat() takes
// it; AT_SYMLINK_NOFOLLOW in `flags` as execveat() takes it) needs first in its process, into
// `runtime`; false if none. A "#!" script is followed to its interpreter (relative to the working
// directory, as the kernel opens it), up to 4 levels. Only a regular file is opened (never a FIFO
// or a device, which an open could block on or change), and without blocking.
inline bool runtime_needed_first(int directory, const char* path, int flags, runtime_name& runtime) noexcept {
  struct stat status {};
  if (fstatat(directory, path, &status, flags & AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(status.st_mode)) return false;
  const int nofollow = (flags & AT_SYMLINK_NOFOLLOW) != 0 ? O_NOFOLLOW : 0;
  const int fd = openat(directory, path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | nofollow);
  if (fd < 0) return false;
  runtime_name interpreter;
  const detail::inspected what = detail::inspect(fd, runtime, interpreter);
  close(fd);
  if (what != detail::inspected::script) return what == detail::inspected::runtime;
  return detail::runtime_of_interpreter(interpreter, runtime);
}

// The same for the program open as `fd` (readable: not an O_PATH descriptor).
inline bool runtime_needed_first(int fd, runtime_name& runtime) noexcept {
  runtime_name interpreter;
  const detail::inspected what = detail::inspect(fd, runtime, interpreter);
  if (what != detail::inspected::script) return what == detail::inspected::runtime;
  return detail::runtime_of_interpreter(interpreter, runtime);
}

inline bool detail::runtime_of_interpreter(runtime_name& interpreter, runtime_name& runtime) noexcept {
  for (int level = 1; level < 5; ++level) {
    struct stat status {};
    if (stat(interpreter.text, &status) != 0 || !S_ISREG(status.st_mode)) return false;
    const int fd = open(interpreter.text, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return false;
    const inspected what = inspect(fd, runtime, interpreter);
    close(fd);
    if (what != inspected::script) return what == inspected::runtime;
  }
  return false;
}

// The file that execvp() would run for `file`, into `path`: `file` itself if it has a '/', else
// the first executable regular file among PATH's directories (glibc's default "/bin:/usr/bin"
// without PATH; an empty entry is the working directory). False if there is none, or a name does
// not fit; then nothing is inspected.
inline bool find_in_path(const char* file, char (&path)[PATH_MAX]) noexcept {
  const std::size_t length = std::strlen(file);
  if (length == 0 || length >= sizeof path) return false;
  if (std::strchr(file, '/') != nullptr) {
    std::memcpy(path, file, length + 1);
    return true;
  }
  const char* variable = std::getenv("PATH");
  std::string_view directories(variable != nullptr ? variable : "/bin:/usr/bin");
  for (;;) {
    const std::size_t colon = directories.find(':');
    std::string_view directory = directories.substr(0, colon);
    if (directory.empty()) directory = ".";
    if (directory.size() + 1 + length < sizeof path) {
      std::memcpy(path, directory.data(), directory.size());
      path[directory.size()] = '/';
      std::memcpy(path + directory.size() + 1, file, length + 1);
      struct stat status {};
      if (stat(path, &status) == 0 && S_ISREG(status.st_mode) && faccessat(AT_FDCWD, path, X_OK, AT_EACCESS) == 0) {
        return true;
      }
    }
    if (colon == std::string_view::npos) return false;
    directories.remove_prefix(colon + 1);
  }
}

// The entries of an LD_PRELOAD list, split at spaces and colons as the loader splits it.
template <class Visit>
bool for_each_preload(std::string_view list, Visit visit) noexcept {
  while (!list.empty()) {
    const std::size_t end = list.find_first_of(" :");
    const std::string_view entry = list.substr(0, end);
    if (!entry.empty() && visit(entry)) return true;
    if (end == std::string_view::npos) break;
    list.remove_prefix(end + 1);
  }
  return false;
}

// An LD_PRELOAD entry's file name (the entry may be a path).
inline std::string_view file_name(std::string_view entry) noexcept {
  const std::size_t slash = entry.rfind('/');
  return slash == std::string_view::npos ? entry : entry.substr(slash + 1);
}

// Whether LD_PRELOAD's list names `name` (by that name or as a path ending in it) anywhere.
inline bool preload_names(std::string_view list, std::string_view name) noexcept {
  return for_each_preload(list, [&](std::string_view entry) { return file_name(entry) == name; });
}

// Whether LD_PRELOAD's list names `name` first, which is where a sanitizer runtime must stand.
inline bool preload_names_first(std::string_view list, std::string_view name) noexcept {
  bool first = false;
  for_each_preload(list, [&](std::string_view entry) {
    first = file_name(entry) == name;
    return true;
  });
  return first;
}

}  // namespace teardown_tools
