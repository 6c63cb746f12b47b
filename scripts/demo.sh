#!/usr/bin/env bash
# The demo: builds the quickstart example in Release and runs it.
# Usage: scripts/demo.sh        (from anywhere; installs missing Debian packages first)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/packages.sh

ensure_packages "${build_packages[@]}"

echo "==> configuring and building the demo (preset: demo)"
cmake --preset demo >/dev/null
cmake --build --preset demo --target quickstart

echo "==> running examples/quickstart"
./build/demo/examples/quickstart
