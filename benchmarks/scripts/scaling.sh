#!/usr/bin/env bash
# The many-core figures in one run: ns per push of sharded_llist against the single-head llist, a
# contended fetch_add and the peers, by producers from 1 to the hardware threads (llist_bench);
# reaper_pool's drain rate against M concurrent inline munmaps (pool_bench); kill -> waitpid with
# and without the shadow-teardown helper (process_bench). scaling.py then writes the tables and
# the issue's two goals, met or not, into scaling.md.
#
# Usage: benchmarks/scaling.sh [--quick] [--bin DIR] [OUT_DIR]
#        benchmarks/scaling.sh [--bin DIR] --pack [DIR]
#   OUT_DIR   where machine.txt, scaling.md and llist_bench, pool_bench, process_bench .json and
#             .txt go (8 files); default benchmarks/results/scaling-<N>cpus (N = nproc), or
#             ./scaling-<N>cpus when run from a pack
#   --quick   a smoke test of seconds (three llist cases, 0.01 s each, and the other
#             programs' --quick); its figures are not for publishing
#   --pack    builds the programs here, then copies them, every shared library they load
#             (glibc's loader too) and the scripts they need into DIR (default .scaling-pack,
#             which git ignores): a many-core machine with no compiler, no packages and no
#             network then runs `bash DIR/scaling.sh [--quick] OUT_DIR`, which needs bash,
#             coreutils and a python3 there, nothing else.
#   --bin     the programs already built in DIR (a build's benchmarks/ folder) instead of
#             building the bench preset; nothing is installed (ctest's scaling.pack uses it)
#
# Memory: pool_bench tears down M = 2 x nproc items of 0.5 GiB (at most 0.6 of MemAvailable; a
# larger M is cut down and "capped" says so); process_bench populates 1, 4 and 16 GiB (a size
# above 0.6 of MemAvailable is skipped, and the table says so). Run it on an otherwise idle
# machine: every program uses all hardware threads. On 16 CPUs it takes about 4 minutes.
set -euo pipefail

usage() { sed -n '8,21s/^# \{0,1\}//p' "$0"; }

quick=false
pack=false
dir=""
prebuilt=""
while [ "$#" -gt 0 ]; do
  case "$1" in
    --quick) quick=true ;;
    --pack) pack=true ;;
    --bin) [ "$#" -ge 2 ] || { usage >&2; exit 2; }; prebuilt=$(realpath -m "$2"); shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "scaling.sh: unknown option: $1" >&2; usage >&2; exit 2 ;;
    *) [ -z "$dir" ] || { usage >&2; exit 2; }; dir=$1 ;;
  esac
  shift
done

here=$(cd "$(dirname "$0")" && pwd)
programs=(llist_bench pool_bench process_bench)
scripts=(scaling.sh scaling.py bench_json.py describe_machine.sh)
cpus=$(nproc)

# where the programs are, how to start them, and how they were built
if [ -f "$here/pack.txt" ]; then
  # Run from a pack: its own glibc loader, with its own libraries, whatever the machine has.
  if $pack || [ -n "$prebuilt" ]; then
    echo "scaling.sh: a pack runs its own programs; --pack and --bin need the repository" >&2
    exit 2
  fi
  bin=$here/bin
  launch=("$here/lib/$(sed -n 's/^loader: //p' "$here/pack.txt")" --library-path "$here/lib")
  mapfile -t built < <(grep -v '^loader: ' "$here/pack.txt")
  out_dir=$(realpath -m "${dir:-scaling-${cpus}cpus}")
else
  # Paths on the command line are relative to where scaling.sh was started.
  [ -z "$dir" ] || dir=$(realpath -m "$dir")
  root=$(cd "$here/../.." && pwd)  # this file is benchmarks/scripts/scaling.sh
  cd "$root"
  if [ -n "$prebuilt" ]; then
    bin=$prebuilt
  else
    # shellcheck source=scripts/packages.sh
    source scripts/packages.sh
    # Google Benchmark and the peers (Boost, Concurrency Kit, liburcu) are test packages.
    ensure_packages "${build_packages[@]}" "${test_packages[@]}" python3
    echo "==> configuring and building the benchmarks (preset: bench)"
    cmake --preset bench >/dev/null
    cmake --build --preset bench -j "$cpus" --target "${programs[@]}"
    bin=$root/build/bench/benchmarks
  fi
  for program in "${programs[@]}"; do
    [ -x "$bin/$program" ] || { echo "scaling.sh: $bin/$program was not built" >&2; exit 1; }
  done
  launch=()
  # shellcheck source=benchmarks/scripts/describe_machine.sh
  source "$here/describe_machine.sh"
  mapfile -t built < <(build_lines)
  out_dir=${dir:-$root/benchmarks/results/scaling-${cpus}cpus}
fi

if $pack; then
  dest=$(realpath -m "${dir:-$root/.scaling-pack}")
  rm -rf "$dest"
  mkdir -p "$dest/bin" "$dest/lib"
  for program in "${programs[@]}"; do
    cp "$bin/$program" "$dest/bin/"
  done
  # ldd names each library as "name => /path (address)", the loader as "/path (address)", and
  # each program, when given several, as "/path:".
  loader=""
  while read -r path; do
    cp -L "$path" "$dest/lib/"
    case "$path" in */ld-linux*) loader=$(basename "$path") ;; esac
  done < <(ldd "${programs[@]/#/$bin/}" |
           awk '$2 == "=>" && $3 ~ /^\// { print $3 }  $1 ~ /^\// && $2 ~ /^\(/ { print $1 }' |
           sort -u)
  [ -n "$loader" ] || { echo "scaling.sh: ldd named no glibc loader" >&2; exit 1; }
  for script in "${scripts[@]}"; do
    cp "$here/$script" "$dest/"
  done
  {
    echo "loader: $loader"
    printf '%s\n' "${built[@]}"
    echo "built from: $(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)," \
      "packed $(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -n)"
  } >"$dest/pack.txt"
  echo "scaling.sh: packed into $dest ($(du -sh "$dest" | cut -f1));" \
    "run there: bash $dest/scaling.sh OUT_DIR"
  exit 0
fi

mkdir -p "$out_dir"
# A figure left from an earlier run must not be reported as this run's.
rm -f "$out_dir"/{llist_bench,pool_bench,process_bench}.{json,txt} "$out_dir/scaling.md"
# shellcheck source=benchmarks/scripts/describe_machine.sh
source "$here/describe_machine.sh"
mode=()
if $quick; then mode=("mode: --quick (smoke test, not for publishing)"); fi
describe_machine "${built[@]}" "${mode[@]}" >"$out_dir/machine.txt"
cat "$out_dir/machine.txt"

if $quick; then
  llist_args=(--benchmark_min_time=0.01
              "--benchmark_filter=^(llist/std|sharded_llist/std|limit/fetch_add)/")
  pool_args=(--quick)
  process_args=(--quick)
else
  llist_args=(--benchmark_repetitions=3 --benchmark_report_aggregates_only=true)
  # M = 2 x CPUs items of 0.5 GiB: 32 on 16 CPUs, as many as the seed's concurrent exits.
  pool_args=(--m $((2 * cpus)) --max-gib "$cpus")
  process_args=(--sizes "1,4,16")
fi

# run NAME ARGS...: one program, its console output into NAME.txt; then scaling.md again, so
# that a run cut short (a time limit on a borrowed machine) still leaves a report of what ended.
run() {
  local name=$1
  shift
  echo "==> $name $*"
  "${launch[@]}" "$bin/$name" "$@" 2>&1 | tee "$out_dir/$name.txt"
  python3 "$here/scaling.py" "$out_dir" >"$out_dir/scaling.md"
}

started=$SECONDS
# The two goals first; process_bench, the longest (it populates 16 GiB on one thread), last.
run llist_bench "${llist_args[@]}" --benchmark_format=console \
  --benchmark_out="$out_dir/llist_bench.json" --benchmark_out_format=json
run pool_bench "${pool_args[@]}" --out "$out_dir/pool_bench.json"
run process_bench "${process_args[@]}" --out "$out_dir/process_bench.json"
echo "==> the programs took $((SECONDS - started)) s"

echo
cat "$out_dir/scaling.md"
echo
echo "scaling.sh wrote into $out_dir: machine.txt scaling.md" \
  "{llist_bench,pool_bench,process_bench}.{json,txt}"
