#!/usr/bin/env bash
# The test suite: every ctest preset the project promises — GCC Debug (with the consumer
# projects: find_package, add_subdirectory, FetchContent, pkg-config; the header-only install and
# the Debian packages, tests/cmake/packaging), GCC ThreadSanitizer,
# Clang ThreadSanitizer, and GCC AddressSanitizer + UndefinedBehaviorSanitizer. Run as root, the
# default preset's unit and tracer tests also run as an ordinary user (uid 65534, no capabilities).
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

# As root, the default preset's tests run a second time as an ordinary user (uid 65534, no
# capabilities, Debian's RLIMIT_NICE 0): the path most users run, where a nice value cannot be
# lowered and a cgroup's files may be unreadable. Tests of a privileged path skip there, each
# with its reason. The schedule tests (which do not depend on privileges, and are the slowest)
# and the stress, lint and consumer tests are left to the root run. The run reuses this build
# tree read-only, through a CTest directory of its own; the one file a test writes into the
# tree (cmake --install's manifest) is made writable for it.
unprivileged_user=65534
run_unprivileged_tests() {
  local build=$PWD/build/default
  local as_user=(setpriv "--reuid=$unprivileged_user" "--regid=$unprivileged_user" --clear-groups
                 --inh-caps=-all)
  if [ "$(id -u)" -ne 0 ]; then
    echo "==> [default] unprivileged run: not needed, this run is already unprivileged (uid $(id -u))"
    return 0
  fi
  if ! command -v setpriv >/dev/null 2>&1; then
    echo "==> [default] unprivileged run SKIPPED: no setpriv (util-linux)"; return 0
  fi
  if ! "${as_user[@]}" test -r "$build/CTestTestfile.cmake"; then
    echo "==> [default] unprivileged run SKIPPED: uid $unprivileged_user cannot read $build" \
         "(a directory above the checkout is closed to other users)"
    return 0
  fi
  local dir
  dir=$(mktemp -d /tmp/teardown-unprivileged.XXXXXX) || return 1
  printf 'subdirs("%s")\n' "$build" >"$dir/CTestTestfile.cmake"
  chown -R "$unprivileged_user:$unprivileged_user" "$dir"
  touch "$build/install_manifest.txt" && chmod 666 "$build/install_manifest.txt"
  echo "==> [default] test, as uid $unprivileged_user without capabilities"
  (cd "$dir" && "${as_user[@]}" ctest -L "unit|tracer" -E "schedule" -j "$jobs" --timeout 120)
  local status=$?
  rm -rf "$dir"
  return $status
}
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
  if [ "$preset" = default ] && ! run_unprivileged_tests; then
    failed+=("default (tests as uid $unprivileged_user)")
  fi
done

# CI keeps only the tail of this output: name each failed test again here, with the end of its
# output, so the tail says what failed and why.
summarize_failures() {
  local preset log
  for preset in "${presets[@]}"; do
    log=build/$preset/Testing/Temporary/LastTestsFailed.log
    [ -s "$log" ] || continue
    echo "==> [$preset] failed tests:"
    sed 's/^/    /' "$log"
    while IFS=: read -r _ name; do
      echo "--- [$preset] $name: its failure lines and its end"
      awk -v name="$name" '
        { line = $0 }
        sub(/^[0-9]+\/[0-9]+ Test: /, "", line) && line == name { on = 1; n = 0; shown = 0 }
        !on { next }
        /Failure|[Ee]xpected|Which is|Value of|Actual|ThreadSanitizer|AddressSanitizer|runtime error|SUMMARY|Timeout|    #[0-4] / {
          if (shown++ < 40) print
        }
        { last[n++ % 12] = $0 }
        /^"[^"]*" end time:/ {
          on = 0; print "    ..."
          for (i = (n > 12 ? n - 12 : 0); i < n; i++) print last[i % 12]
        }
      ' "build/$preset/Testing/Temporary/LastTest.log"
    done <"$log"
  done
}

echo
if [ "${#failed[@]}" -ne 0 ]; then
  summarize_failures
  echo "test.sh: FAILED: ${failed[*]}"
  exit 1
fi
echo "test.sh: all presets passed: ${presets[*]}"
