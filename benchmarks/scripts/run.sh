#!/usr/bin/env bash
# The one-command benchmark run: installs what is missing, builds the bench preset (GCC,
# Release), runs every benchmark with JSON output, describes the machine and draws the plots.
#
# Usage: benchmarks/run.sh [--quick] [--img-dir DIR] [--build-dir DIR] [OUT_DIR]
#   OUT_DIR      where NAME.json, NAME.txt (the console output), machine.txt and plot.txt (the
#                markdown tables) go; default benchmarks/results
#   --quick      a smoke test of about a minute: each case runs for 0.01 s, once, and
#                exit_matrix gets --quick. Its figures are not for publishing, so its plots go
#                to OUT_DIR/img unless --img-dir says otherwise.
#   --img-dir    where the PNGs go (default docs/img, or OUT_DIR/img with --quick)
#   --build-dir  where the bench preset builds (default build/bench; one you can write to when
#                the checkout is not yours)
#   EXIT_MATRIX_ARGS, MM_REAPER_TRADEOFFS_ARGS (environment; RFC_QUESTIONS_ARGS, the old name,
#                too): more flags for those two programs, e.g. EXIT_MATRIX_ARGS="--mem-fraction 0.75"
#
# Full runs repeat each case 3 times and keep the aggregates (mean, median, stddev, cv). Run it
# on an otherwise idle machine: every benchmark uses all hardware threads.
set -euo pipefail

usage() { sed -n '5,15s/^# \{0,1\}//p' "$0"; }

quick=false
out_dir=""
img_dir=""
build_dir=""
while [ "$#" -gt 0 ]; do
  case "$1" in
    --quick) quick=true ;;
    --img-dir) [ "$#" -ge 2 ] || { usage >&2; exit 2; }; img_dir=$2; shift ;;
    --img-dir=*) img_dir=${1#--img-dir=} ;;
    --build-dir) [ "$#" -ge 2 ] || { usage >&2; exit 2; }; build_dir=$2; shift ;;
    --build-dir=*) build_dir=${1#--build-dir=} ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "run.sh: unknown option: $1" >&2; usage >&2; exit 2 ;;
    *) [ -z "$out_dir" ] || { usage >&2; exit 2; }; out_dir=$1 ;;
  esac
  shift
done

# Paths given on the command line are relative to where run.sh was started; the defaults are
# relative to the repository.
root=$(cd "$(dirname "$0")/../.." && pwd)  # this file is benchmarks/scripts/run.sh
out_dir=$(realpath -m "${out_dir:-$root/benchmarks/results}")
if [ -z "$img_dir" ]; then
  if $quick; then img_dir=$out_dir/img; else img_dir=$root/docs/img; fi
fi
img_dir=$(realpath -m "$img_dir")
build_dir=$(realpath -m "${build_dir:-$root/build/bench}")
cd "$root"

# shellcheck source=scripts/packages.sh
source scripts/packages.sh
# The plots need Debian's python3 with matplotlib (not whatever python3 is on PATH).
python=/usr/bin/python3
if can_install_packages; then
  # As root (or with sudo that asks no password): everything, the peers (Boost, Concurrency Kit,
  # liburcu, among the test packages) and the plots' matplotlib included.
  ensure_packages "${build_packages[@]}" "${test_packages[@]}" "${plot_packages[@]}"
else
  # Otherwise nothing is installed: the benchmarks run with what is there, and stop only where
  # they cannot build at all.
  mapfile -t missing < <(missing_packages "${bench_packages[@]}")
  if [ "${#missing[@]}" -ne 0 ]; then
    echo "run.sh: the benchmarks need these Debian packages, not installed here: ${missing[*]}" >&2
    echo "run.sh: as root (or with sudo): apt-get install ${missing[*]}" >&2
    exit 1
  fi
  mapfile -t missing < <(missing_packages "${bench_optional_packages[@]}")
  if [ "${#missing[@]}" -ne 0 ]; then
    echo "==> running without ${missing[*]} (the peers they provide are skipped; to have them, as" \
         "root: apt-get install ${missing[*]})"
  fi
fi
plots=true
if ! "$python" -c 'import matplotlib' >/dev/null 2>&1; then
  plots=false
  echo "==> the plots will be skipped: $python has no matplotlib (as root: apt-get install" \
       "${plot_packages[*]}; then: $python benchmarks/scripts/plot.py OUT_DIR IMG_DIR)"
fi

# Where the run writes, before the build: a directory it cannot write stops it now.
writes=("$out_dir" "$build_dir")
if $plots; then writes+=("$img_dir"); fi
for dir in "${writes[@]}"; do
  if ! mkdir -p "$dir" 2>/dev/null || [ ! -w "$dir" ]; then
    echo "run.sh: cannot write to $dir (OUT_DIR for the results, --build-dir for the build," \
         "--img-dir for the plots)" >&2
    exit 1
  fi
done

echo "==> configuring and building the benchmarks (preset: bench, in $build_dir)"
cmake --preset bench -B "$build_dir" >/dev/null
cmake --build "$build_dir" -j "$(nproc)"

# A figure left from an earlier run must not be plotted as this run's.
rm -f "$out_dir"/{llist_bench,budget_counter_static_key_bench,reaper_bench,batch_bench}.{json,txt} \
  "$out_dir"/{exit_matrix,mm_reaper_tradeoffs,oom_reap_bench,pool_bench,process_bench,fork_bench}.{json,txt} \
  "$out_dir/plot.txt"
bin=$build_dir/benchmarks
wrote=()

# shellcheck source=benchmarks/scripts/describe_machine.sh
source benchmarks/scripts/describe_machine.sh
mode=()
if $quick; then mode=("mode: --quick (smoke test, 0.01 s per case, no repetitions)"); fi
describe_machine "$(build_lines)" "${mode[@]}" >"$out_dir/machine.txt"
wrote+=("$out_dir/machine.txt")
cat "$out_dir/machine.txt"

if $quick; then
  bench_args=(--benchmark_min_time=0.01)
else
  bench_args=(--benchmark_repetitions=3 --benchmark_report_aggregates_only=true)
fi

started=$SECONDS
for name in llist_bench budget_counter_static_key_bench reaper_bench batch_bench; do
  echo "==> $name ${bench_args[*]}"
  "$bin/$name" "${bench_args[@]}" --benchmark_format=console \
    --benchmark_out="$out_dir/$name.json" --benchmark_out_format=json 2>&1 \
    | tee "$out_dir/$name.txt"
  wrote+=("$out_dir/$name.json" "$out_dir/$name.txt")
done

# run_macro NAME [EXTRA FLAGS...]: a plain program that writes its JSON with --out (and takes
# --quick); its console output goes to NAME.txt. Skipped with a message if it was not built.
run_macro() {
  local name=$1
  shift
  if [ ! -x "$bin/$name" ]; then
    echo "==> $name skipped: $bin/$name was not built"
    return
  fi
  local args=(--out "$out_dir/$name.json")
  if $quick; then args+=(--quick); fi
  args+=("$@")
  echo "==> $name ${args[*]}"
  "$bin/$name" "${args[@]}" 2>&1 | tee "$out_dir/$name.txt"
  wrote+=("$out_dir/$name.json" "$out_dir/$name.txt")
}

read -ra exit_matrix_args <<< "${EXIT_MATRIX_ARGS:-}"
read -ra mm_reaper_tradeoffs_args <<< "${MM_REAPER_TRADEOFFS_ARGS:-${RFC_QUESTIONS_ARGS:-}}"
run_macro exit_matrix "${exit_matrix_args[@]}"
run_macro mm_reaper_tradeoffs "${mm_reaper_tradeoffs_args[@]}"
run_macro oom_reap_bench
run_macro pool_bench
run_macro process_bench
run_macro fork_bench
echo "==> benchmarks took $((SECONDS - started)) s"

if $plots; then
  echo "==> plotting into $img_dir"
  mkdir -p "$img_dir"
  "$python" benchmarks/scripts/plot.py "$out_dir" "$img_dir" | tee "$out_dir/plot.txt"
  wrote+=("$out_dir/plot.txt")
  for image in "$img_dir"/*.png; do
    # Only those this run drew (or redrew).
    if [ -f "$image" ] && [ "$image" -nt "$out_dir/machine.txt" ]; then wrote+=("$image"); fi
  done
else
  echo "==> plots skipped: $python has no matplotlib. As root: apt-get install ${plot_packages[*]};"
  echo "    then: $python benchmarks/scripts/plot.py $out_dir $img_dir"
fi

echo
echo "run.sh wrote:"
printf '  %s\n' "${wrote[@]}"
