# Sourced by scripts/demo.sh, scripts/test.sh, scripts/package.sh and benchmarks/run.sh: installs
# the Debian packages a script needs, and only those that are missing. Needs root (or sudo) only
# when something is missing; benchmarks/run.sh, which can do without some, installs nothing
# unless it can (can_install_packages).

ensure_packages() {
  local missing=()
  local package
  for package in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$package")
    fi
  done
  if [ "${#missing[@]}" -eq 0 ]; then
    return 0
  fi
  local as_root=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
      as_root=(sudo)
    else
      echo "error: these Debian packages are missing, and installing them needs root (or sudo):" \
           "${missing[*]}" >&2
      echo "       as root: apt-get install ${missing[*]}" >&2
      return 1
    fi
  fi
  echo "==> installing missing Debian packages: ${missing[*]}"
  "${as_root[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# missing_packages PACKAGE...: prints those of them that are not installed, one a line.
missing_packages() {
  local package
  for package in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
      echo "$package"
    fi
  done
}

# can_install_packages: true as root, or where sudo runs apt-get without asking for a password
# (a script that may go on without some packages installs them only then).
can_install_packages() {
  [ "$(id -u)" -eq 0 ] || { command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; }
}

# What building the library, its examples and its tests needs. The benchmark peers are part of
# the test build too, so that they keep compiling.
build_packages=(cmake ninja-build g++ pkg-config libatomic-ops-dev systemtap-sdt-dev)
# libc++-dev and libc++abi-dev: the strict consumer tests and process.libcxx build the headers
# with Clang's libc++; valgrind: process_boundary_test runs shadow teardown under it; strace and
# libjemalloc2: shadow_preload_test runs teardown-run under strace -f and with jemalloc preloaded;
# libjemalloc2, libtcmalloc-minimal4 and libmimalloc2.0: the alloc_* tests preload each allocator.
test_packages=(clang libclang-rt-14-dev libgtest-dev libgmock-dev libbenchmark-dev
               libboost-dev libck-dev liburcu-dev spin libc++-dev libc++abi-dev valgrind
               strace libjemalloc2 libtcmalloc-minimal4 libmimalloc2.0 bpftrace)

# What benchmarks/run.sh needs to draw its plots (Debian's python3 with matplotlib).
plot_packages=(python3-matplotlib)
# What benchmarks/run.sh cannot run without (the bench preset: CMake 3.25, Ninja, GCC, Google
# Benchmark), and what it goes on without: the peers (skipped by CMake, named by the programs),
# libatomic_ops and <sys/sdt.h> (the headers do without them) and pkg-config (finds two peers).
bench_packages=(cmake ninja-build g++ libbenchmark-dev)
bench_optional_packages=(pkg-config libboost-dev libck-dev liburcu-dev libatomic-ops-dev systemtap-sdt-dev)

# What scripts/package.sh needs beyond cmake and g++: dpkg-buildpackage and dpkg-deb (dpkg-dev),
# dh (debhelper). No fakeroot: the packages declare Rules-Requires-Root: no. Its ctests
# (tests/cmake/packaging/) also run lintian on what it built.
package_packages=(dpkg-dev debhelper)
package_test_packages=(lintian)
