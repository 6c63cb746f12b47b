#!/usr/bin/env bash
# ctest scaling.pack: the pack that benchmarks/scaling.sh makes for a many-core machine without a
# toolchain must run there. It packs this build's programs, moves the pack away from the
# repository, runs its --quick from another directory with an empty environment, and checks
#   - that every library the programs load comes from the pack (glibc's loader included), so the
#     machine's own libraries, whatever their versions, play no part;
#   - that scaling.md has its three tables and both many-core goals measured (met or not: a
#     --quick run on two CPUs proves nothing about them).
#
# Usage: scaling_pack_test.sh PROGRAMS_DIR WORK_DIR   (PROGRAMS_DIR: a build's benchmarks/)
set -euo pipefail

[ "$#" -eq 2 ] || { echo "usage: scaling_pack_test.sh PROGRAMS_DIR WORK_DIR" >&2; exit 2; }
programs=$(realpath "$1")
work=$(realpath -m "$2")
here=$(cd "$(dirname "$0")" && pwd)
fail() { echo "scaling_pack_test: FAILED: $*" >&2; exit 1; }

rm -rf "$work"
mkdir -p "$work"
bash "$here/scaling.sh" --bin "$programs" --pack "$work/packed"
mv "$work/packed" "$work/pack"  # a pack that reached back to where it was made would break here
cd "$work"
env -i PATH=/usr/bin:/bin HOME="$work" bash pack/scaling.sh --quick out

loader=$(sed -n 's/^loader: //p' pack/pack.txt)
for program in llist_bench pool_bench process_bench; do
  loaded=$(LD_DEBUG=libs "$work/pack/lib/$loader" --library-path "$work/pack/lib" \
             "pack/bin/$program" --help 2>&1 | sed -n 's/.*calling init: //p' | sort -u)
  grep -qx "$work/pack/lib/libc.so.6" <<<"$loaded" || fail "$program: no libc from the pack:
$loaded"
  outside=$(grep -v "^$work/pack/lib/" <<<"$loaded" || true)
  [ -z "$outside" ] || fail "$program loaded libraries from outside the pack: $outside"
done

report=out/scaling.md
for heading in "sharded_llist: ns per push" "reaper_pool: drain rate" "Killing a big process"; do
  grep -qF "**$heading" "$report" || fail "$report has no table \"$heading\""
done
for goal in "sharded / single-head ns per push at" "pool drain with"; do
  grep -F -- "- $goal" "$report" | grep -q "goal" || fail "$report does not measure \"$goal\""
done
grep -q "^built from: " out/machine.txt || fail "out/machine.txt does not say what was packed"
echo "scaling_pack_test: the pack ran on its own libraries and reported both goals"
