// tools/parse_int.hpp — the one integer parser of the preload library and teardown-run, which
// read the same values (a nice value from an environment variable or a flag) and must refuse
// the same texts.
#pragma once

#include <cerrno>
#include <cstdlib>
#include <string>
#include <string_view>

namespace teardown_tools {

// The integer in `text` if it is one in [low, high], whole (no blanks, no trailing bytes).
inline bool parse_int(std::string_view text, long low, long high, long& value) {
  if (text.empty() || text.size() > 20 || !(text[0] == '-' || text[0] == '+' || (text[0] >= '0' && text[0] <= '9'))) {
    return false;  // strtol would skip leading blanks
  }
  const std::string copy(text);
  char* end = nullptr;
  errno = 0;
  const long parsed = std::strtol(copy.c_str(), &end, 10);
  if (errno != 0 || end != copy.c_str() + copy.size() || parsed < low || parsed > high) return false;
  value = parsed;
  return true;
}

}  // namespace teardown_tools
