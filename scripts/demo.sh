#!/usr/bin/env bash
# The demo: builds examples/exit_latency in Release and runs it: the exit-path latency of the
# model kernel on real memory with the deferred teardown off and on, and on with a reaper that
# polls its queue every millisecond so that the exit path makes no wake syscall (its idle CPU
# is printed beside it). 1 GiB by default; extra arguments go to the program, e.g.
# `scripts/demo.sh 2 --reps 5` or `scripts/demo.sh --poll-interval 10000` (us; 0: no polling row).
# Usage: scripts/demo.sh        (from anywhere; installs missing Debian packages first)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/packages.sh

ensure_packages "${build_packages[@]}"

echo "==> configuring and building the demo (preset: demo)"
cmake --preset demo >/dev/null
cmake --build --preset demo --target exit_latency

echo "==> running examples/exit_latency $*"
./build/demo/examples/exit_latency "$@"
