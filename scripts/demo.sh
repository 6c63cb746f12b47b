#!/usr/bin/env bash
# The demo: builds examples/exit_latency in Release and runs it: the exit-path latency of the
# model kernel on real memory (1 GiB, medians of 3) with the deferred teardown off and on, a
# reaper that polls its queue (the exit makes no wake syscall) and a lazy one (one exit each),
# with the exiting thread's wall and CPU time side by side and a legend under the table: 5 to
# 10 s after the build on 2 CPUs (the first run after a boot touches fresh memory: longer). Extra
# arguments go to the program: `scripts/demo.sh 2 --reps 5`, `scripts/demo.sh --poll-interval
# 10000` (us; 0: no polling rows), `scripts/demo.sh --busy 2` (adds the busy-machine rows: 2
# processes spinning at nice 0, the invoking user's rows and, as root, an ordinary user's too; about a
# minute), `scripts/demo.sh --help`.
# Usage: scripts/demo.sh [ARGS...]   (from anywhere; installs missing Debian packages first)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/packages.sh

ensure_packages "${build_packages[@]}"

echo "==> configuring and building the demo (preset: demo)"
cmake --preset demo >/dev/null
cmake --build --preset demo --target exit_latency

echo "==> running examples/exit_latency $*"
./build/demo/examples/exit_latency "$@"
