#!/usr/bin/env bash
# The demo: builds examples/exit_latency in Release and runs it: the exit-path latency of the
# model kernel on real memory with the deferred teardown off and on (1 GiB by default; extra
# arguments go to the program, e.g. `scripts/demo.sh 2 --reps 5`).
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
