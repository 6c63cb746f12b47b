#!/usr/bin/env python3
"""The shape of include/teardown/, checked (ctest: lint.headers).

- Layers: every header sits on a floor of docs/design.md's picture ("Layers: which file holds
  what, and who includes whom") and includes only headers on its own floor or below; detail/
  includes no other teardown header; the process side (process.hpp, process/) only detail/nice
  and detail/pidfd.
- Openings: each header opens with a comment of at most OPENING_LINES lines, and names its
  section of docs/design.md in a `// Design: docs/design.md, "<title>".` line; that title is a
  heading of docs/design.md.
- Words: no "seed" (the documents the project grew from are named for what they are) in
  include/ or README.md.

Usage: scripts/check_headers.py [SOURCE_DIR]. Prints every violation and exits 1 if there is one.
"""
import pathlib
import re
import sys

OPENING_LINES = 60

# The floors of docs/design.md's picture, bottom up: a header's floor is the first rule it matches.
FLOORS = [
    (1, r"detail/.*"),
    (1.5, r"process\.hpp|process/.*"),
    (2, r"(llist|sharded_llist|atomics|budget|static_key|counter|snapshot_count|reference_count|memory_limit|allocator_purge)\.hpp"),
    (3, r"(sync|event_count|trace|allocator_trim|pressure|worker_thread)\.hpp|pressure/.*"),
    (4, r"(reaper|reaper_pool|process_reaper)\.hpp|(reaper|reaper_pool|process_reaper)/.*"),
    (5, r"(async_teardown|shared_worker|worker_control)\.hpp|async_teardown/.*"),
    (6, r"(deferred|pressure_policy)\.hpp|(deferred|model)/.*"),
    (7, r"teardown\.hpp"),
]


def floor_of(name):
    for floor, pattern in FLOORS:
        if re.fullmatch(pattern, name):
            return floor
    return None


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[1])
    include = root / "include" / "teardown"
    design = (root / "docs" / "design.md").read_text(encoding="utf-8")
    titles = {line.lstrip("#").strip() for line in design.splitlines() if re.match(r"^#{2,4} ", line)}
    problems = []
    headers = sorted(p.relative_to(include).as_posix() for p in include.rglob("*.hpp"))
    for name in headers:
        text = (include / name).read_text(encoding="utf-8")
        floor = floor_of(name)
        if floor is None:
            problems.append(f"{name}: on no floor of the layer picture (add it to docs/design.md and here)")
            continue
        for used in re.findall(r'#include "teardown/([^"]+)"', text):
            used_floor = floor_of(used)
            if used_floor is None or used_floor > floor:
                problems.append(f"{name} (floor {floor}) includes {used} (floor {used_floor}): an include upwards")
            elif floor == 1 and not used.startswith("detail/"):
                problems.append(f"{name}: detail/ includes {used}")
            elif floor == 1.5 and not (used.startswith("process/") or used in ("detail/nice.hpp", "detail/pidfd.hpp")):
                problems.append(f"{name}: the process side includes {used}")
        opening = 0
        for line in text.splitlines():
            if not line.startswith("//"):
                break
            opening += 1
        if opening > OPENING_LINES:
            problems.append(f"{name}: its opening comment is {opening} lines (at most {OPENING_LINES})")
        pointers = [re.sub(r"\s*\n\s*(//+)?\s*", " ", m).strip()
                    for m in re.findall(r'Design: docs/design\.md, "((?:[^"]|\n)+?)"', text)]
        if not pointers:
            problems.append(f'{name}: no `// Design: docs/design.md, "<title>".` line')
        for title in pointers:
            if title not in titles:
                problems.append(f'{name}: points to "{title}", which is no heading of docs/design.md')
    for path in [p for p in include.rglob("*.hpp")] + [root / "README.md"]:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"\bseeds?\b", line, re.IGNORECASE):
                problems.append(f"{path.relative_to(root)}:{number}: says \"seed\": {line.strip()}")
    for problem in problems:
        print(problem)
    print(f"check_headers: {len(headers)} headers, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
