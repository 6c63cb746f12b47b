#!/usr/bin/env bash
# The line-length check: every line of the tracked C++ and CMake files (*.hpp, *.cpp, *.h,
# *.cmake, CMakeLists.txt) is at most 120 columns (characters, not bytes: an em dash is one; a
# tab counts as one). Prints each longer line as path:line: columns and fails when there is one.
# ctest runs it as `lint.line_length` (label lint).
#
# Usage: scripts/check_line_length.sh [SOURCE_DIR] [LIMIT]   (default: this checkout, 120)
# Needs python3. Outside a git checkout (a source tarball) it checks every such file under
# SOURCE_DIR except build/ and dot folders.
set -euo pipefail

root=$(cd "${1:-$(dirname "$0")/..}" && pwd)
limit=${2:-120}
cd "$root"

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  list() { git ls-files -z -- '*.hpp' '*.cpp' '*.h' '*.cmake' 'CMakeLists.txt' '**/CMakeLists.txt'; }
else
  list() {
    find . \( -path ./build -o -name '.?*' \) -prune -o -type f \
      \( -name '*.hpp' -o -name '*.cpp' -o -name '*.h' -o -name '*.cmake' -o -name CMakeLists.txt \) \
      -printf '%P\0'
  }
fi

list | python3 -c '
import sys
limit = int(sys.argv[1])
names = sorted(set(n for n in sys.stdin.buffer.read().decode().split("\0") if n))
long_lines = 0
for name in names:
    try:
        text = open(name, encoding="utf-8", errors="replace").read()
    except FileNotFoundError:  # deleted in the work tree, not yet in the index
        continue
    for number, line in enumerate(text.splitlines(), 1):
        if len(line) > limit:
            long_lines += 1
            print(f"{name}:{number}: {len(line)} columns")
if long_lines:
    print(f"check_line_length: {long_lines} lines over {limit} columns", file=sys.stderr)
    sys.exit(1)
print(f"check_line_length: {len(names)} files, no line over {limit} columns")
' "$limit"
