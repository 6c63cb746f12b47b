#!/usr/bin/env bash
# The test suite: every ctest preset the project promises — GCC Debug (with the consumer
# projects: find_package, add_subdirectory, FetchContent, pkg-config; the header-only install and
# the Debian packages, tests/cmake/packaging), GCC ThreadSanitizer,
# Clang ThreadSanitizer, and GCC AddressSanitizer + UndefinedBehaviorSanitizer.
# Usage: scripts/test.sh [preset...]   (default: default tsan clang-tsan asan)
# Exits non-zero if any preset fails to configure, build or pass; runs the others regardless.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/packages.sh

# package_*: the packaging tests (tests/cmake/packaging/) of the presets with consumer tests build the
# Debian packages and run lintian on them; without these they would only report skipped.
ensure_packages "${build_packages[@]}" "${test_packages[@]}" \
                "${package_packages[@]}" "${package_test_packages[@]}" || exit 1

presets=("$@")
if [ "${#presets[@]}" -eq 0 ]; then
  presets=(default tsan clang-tsan asan)
fi

# ThreadSanitizer (GCC 12, Clang 14) cannot map its shadow memory when the kernel randomizes
# mmap addresses with more than 28 bits; run its tests with address randomization off there.
tsan_wrapper=()
rnd_bits=$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 28)
if [ "$rnd_bits" -gt 28 ] && command -v setarch >/dev/null 2>&1; then
  tsan_wrapper=(setarch "$(uname -m)" -R)
fi

jobs=$(nproc 2>/dev/null || echo 2)
failed=()
mkdir -p build
for preset in "${presets[@]}"; do
  echo "==> [$preset] configure"
  if ! cmake --preset "$preset" >"build/$preset.configure.log" 2>&1; then
    cat "build/$preset.configure.log"; failed+=("$preset (configure)"); continue
  fi
  rm -f "build/$preset.configure.log"
  echo "==> [$preset] build"
  if ! cmake --build --preset "$preset" -j "$jobs"; then
    failed+=("$preset (build)"); continue
  fi
  echo "==> [$preset] test"
  wrapper=()
  case "$preset" in *tsan*) wrapper=("${tsan_wrapper[@]}") ;; esac
  if ! "${wrapper[@]}" ctest --preset "$preset" -j "$jobs"; then
    failed+=("$preset (tests)")
  fi
done

echo
if [ "${#failed[@]}" -ne 0 ]; then
  echo "test.sh: FAILED: ${failed[*]}"
  exit 1
fi
echo "test.sh: all presets passed: ${presets[*]}"
