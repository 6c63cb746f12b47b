// teardown/detail/fatal.hpp — the library's one way to say "misuse" and abort.
//
// Who may call what: any thread, a signal handler included (write(2) only: no stdio lock, no
// allocation). For misuse that cannot be refused with an exception (a destructor, a noexcept
// enqueue) and would otherwise be undefined behaviour. Internal: not part of the API.
// Design: docs/design.md, "The shared internal layer".
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string_view>

namespace teardown::detail {

// "job" for type_name<job>(), from the compiler's pretty function name; used in the messages.
template <class T>
constexpr std::string_view type_name() noexcept {
  std::string_view name = __PRETTY_FUNCTION__;
  const std::string_view marker = "T = ";
  const auto start = name.find(marker);
  if (start == std::string_view::npos) return name;
  name.remove_prefix(start + marker.size());
  const auto end = name.find_first_of(";]");
  return name.substr(0, end);
}

// Writes all of `text` to stderr with write(2): async-signal-safe, no stdio lock or buffer.
inline void write_to_stderr(std::string_view text) noexcept {
  while (!text.empty()) {
    const ssize_t written = ::write(STDERR_FILENO, text.data(), text.size());
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return;
    text.remove_prefix(static_cast<std::size_t>(written));
  }
}

// Says why on stderr, then aborts.
[[noreturn]] inline void fatal_misuse(std::string_view message) noexcept {
  write_to_stderr(message);
  std::abort();
}

}  // namespace teardown::detail
