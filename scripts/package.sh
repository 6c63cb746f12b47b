#!/usr/bin/env bash
# scripts/package.sh OUTDIR — builds the Debian packages with Debian's own tools (debhelper,
# dpkg-buildpackage) and puts them into OUTDIR:
#
#   libteardown-dev         Architecture: all   the headers, the CMake package, teardown.pc
#   teardown-tools          Architecture: amd64 teardown-run and libteardown_shadow.so (tools/)
#   teardown-tools-dbgsym   Architecture: amd64 the tools' debug symbols (debhelper's dh_strip
#                                               makes it; DEB_BUILD_OPTIONS=noautodbgsym: none)
#
# A user installs libteardown-dev, and teardown-tools for the tools; the dbgsym package is for a
# debugger only. The script ends by printing the apt-get command.
#
# The packaging lives here, not in a debian/ folder of the tree: a debian/ directory is the
# distribution's to write. The script copies what the build needs (CMakeLists.txt, cmake/,
# include/, tools/, LICENSE, README.md) into a temporary source tree, writes debian/ beside it
# and runs `dpkg-buildpackage -b`: CMake configures with the tests, benchmarks and examples off,
# builds the two tools only, and installs into debian/tmp, which the .install files split.
# Rules-Requires-Root: no, so neither root nor fakeroot is needed. DEB_BUILD_OPTIONS is honoured
# (parallel=N, nostrip, noautodbgsym...). tests/cmake/packaging/ unpacks the result, builds a consumer
# against it and runs lintian.
#
# Environment: DEBFULLNAME, DEBEMAIL (the Maintainer and changelog signature; defaults below).
set -euo pipefail

if [ "$#" -ne 1 ] || [ "${1:0:1}" = "-" ]; then
  echo "usage: scripts/package.sh OUTDIR" >&2
  exit 2
fi
outdir=$(realpath -m "$1")
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/packages.sh"
ensure_packages cmake g++ "${package_packages[@]}" || exit 1

version=$(sed -n 's/^  VERSION \([0-9][0-9.]*\)$/\1/p' "$root/CMakeLists.txt" | head -n 1)
if [ -z "$version" ]; then
  echo "package.sh: no 'VERSION x.y.z' line in the project() call of CMakeLists.txt" >&2
  exit 1
fi
debian_version="$version-1"
maintainer="${DEBFULLNAME:-teardown authors} <${DEBEMAIL:-teardown@example.invalid}>"
# The changelog's date is the last commit's (the same tree packs the same way), else now.
if commit_time=$(git -C "$root" log -1 --format=%ct 2>/dev/null) && [ -n "$commit_time" ]; then
  commit=$(git -C "$root" rev-parse --short=12 HEAD)
  origin="git commit $commit"
else
  commit_time=$(date +%s)
  origin="a source tree without git"
fi
export SOURCE_DATE_EPOCH="$commit_time"
changelog_date=$(date -R -u -d "@$commit_time")

work=$(mktemp -d "${TMPDIR:-/tmp}/teardown-package.XXXXXX")
trap 'rm -rf "$work"' EXIT
src="$work/teardown-$version"
mkdir -p "$src/debian/source"
cp -a "$root/CMakeLists.txt" "$root/cmake" "$root/include" "$root/tools" "$root/LICENSE" \
      "$root/README.md" "$src/"

cat > "$src/debian/control" <<EOF
Source: teardown
Section: libdevel
Priority: optional
Maintainer: $maintainer
Build-Depends: debhelper-compat (= 13), cmake
Standards-Version: 4.6.2
Rules-Requires-Root: no

Package: libteardown-dev
Architecture: all
Multi-Arch: foreign
Depends: \${misc:Depends}
Suggests: libatomic-ops-dev, systemtap-sdt-dev
Description: header-only C++20 lock-free teardown-queue primitives
 teardown moves the cost of tearing down large objects and address spaces off
 the thread that lets go of them: a lock-free intrusive list, a budget and a
 static key that gate it, and a worker (reaper) that does the teardown in the
 background, with counters and USDT trace points.
 .
 This package holds the headers, the CMake package (find_package(teardown),
 target teardown::teardown) and teardown.pc for pkg-config. libatomic_ops and
 <sys/sdt.h> are used when the consumer has them installed.

Package: teardown-tools
Architecture: amd64
Section: utils
Depends: \${shlibs:Depends}, \${misc:Depends}
Description: shadow teardown for unmodified programs
 teardown-run runs a program with libteardown_shadow.so preloaded: a helper
 process that shares the program's memory pays for its teardown when the
 program exits or is killed, so that the parent's waitpid() returns at once.
 .
 Both are built from the teardown headers (libteardown-dev), with their C++
 runtime linked in statically, and export no symbol into the program.
EOF

cat > "$src/debian/changelog" <<EOF
teardown ($debian_version) unstable; urgency=medium

  * Package teardown $version from $origin (scripts/package.sh).

 -- $maintainer  $changelog_date
EOF

{
  cat <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: teardown

Files: *
Copyright: 2026 The teardown authors
License: Expat

License: Expat
EOF
  # The license text, each line indented, blank lines as " ." (the format's rule).
  sed -e '1,/^$/d' -e 's/^$/./' -e 's/^/ /' "$root/LICENSE"
} > "$src/debian/copyright"

echo "3.0 (quilt)" > "$src/debian/source/format"

cat > "$src/debian/rules" <<'EOF'
#!/usr/bin/make -f
export DEB_BUILD_MAINT_OPTIONS = hardening=+all

%:
	dh $@ --buildsystem=cmake

include /usr/share/dpkg/architecture.mk

# The packages carry the library and the tools; the tests, benchmarks and examples are the
# project's (scripts/test.sh), built and run there. The tools include only process.hpp, which
# uses neither libatomic_ops nor <sys/sdt.h>: both off, so that the build machine's packages do
# not decide what the binaries link. libteardown_shadow.so is a preload object, not a library to
# link against (no SONAME): it goes into a private directory, where teardown-run finds it
# (relative to its bindir, from CMAKE_INSTALL_LIBDIR).
override_dh_auto_configure:
	dh_auto_configure -- -DTEARDOWN_BUILD_TESTS=OFF -DTEARDOWN_BUILD_BENCHMARKS=OFF \
	  -DTEARDOWN_BUILD_EXAMPLES=OFF -DTEARDOWN_CONSUMER_TESTS=OFF \
	  -DTEARDOWN_WITH_ATOMIC_OPS=OFF -DTEARDOWN_WITH_USDT=OFF \
	  -DCMAKE_INSTALL_LIBDIR=lib/$(DEB_HOST_MULTIARCH)/teardown

override_dh_auto_test:
EOF
chmod +x "$src/debian/rules"

cat > "$src/debian/libteardown-dev.install" <<'EOF'
usr/include/teardown
usr/share/cmake/teardown
usr/share/pkgconfig/teardown.pc
EOF
cat > "$src/debian/teardown-tools.install" <<'EOF'
usr/bin/teardown-run
usr/lib/*/teardown/libteardown_shadow.so
EOF
# What lintian still says, and why it stays (lintian prints the comment with the tag).
for package in libteardown-dev teardown-tools; do
  cat > "$src/debian/$package.lintian-overrides" <<'EOF'
# Built by scripts/package.sh for local use, not uploaded to Debian: there is no ITP bug to close.
initial-upload-closes-no-bugs
EOF
done
cat >> "$src/debian/teardown-tools.lintian-overrides" <<'EOF'
# Compiled with -D_FORTIFY_SOURCE=2 (dpkg-buildflags, in the build log), but no call in it has a
# buffer size GCC knows at compile time, so no __*_chk variant is emitted, and lintian infers the
# flag's absence from theirs (nm -u of shadow_preload.o shows memcpy, memmove, memset alone).
hardening-no-fortify-functions [usr/lib/*/teardown/libteardown_shadow.so]
EOF
cat > "$src/debian/teardown-tools.manpages" <<'EOF'
debian/teardown-run.1
EOF
# The launcher's manual: its --help, its exit statuses and its environment (README.md,
# "Processes", has the whole story).
cat > "$src/debian/teardown-run.1" <<EOF
.TH TEARDOWN-RUN 1 "$(date -u -d "@$commit_time" +%Y-%m-%d)" "teardown $version" "User Commands"
.SH NAME
teardown-run \- run a program with shadow teardown
.SH SYNOPSIS
.B teardown-run
.RB [ \-\-nice
.IR N ]
.RB [ \-\-idle ]
.RB [ \-\- ]
.I PROGRAM
.RI [ ARG ...]
.SH DESCRIPTION
.B teardown-run
puts libteardown_shadow.so last in
.B LD_PRELOAD
and executes
.IR PROGRAM ,
which keeps the process id. A helper process that shares the program's memory
pays for its teardown when the program exits or is killed, so that its
parent's
.BR waitpid (2)
returns at once. Programs that
.I PROGRAM
executes get a helper of their own.
.SH OPTIONS
.TP
.BI \-\-nice " N"
the helper's nice value, \-20..19 (default 19)
.TP
.B \-\-idle
the helper runs in SCHED_IDLE
.TP
.B \-\-help
print a summary of the options
.SH ENVIRONMENT
.TP
.B TEARDOWN_SHADOW=0
leaves a program (and what it runs) without a helper.
.SH EXIT STATUS
2 for a usage error, 125 when the library cannot be found, 126 when
.I PROGRAM
cannot be executed, 127 when it is not found; otherwise the status of
.IR PROGRAM .
EOF

echo "==> package.sh: teardown $debian_version from $origin"
(cd "$src" && dpkg-buildpackage -b -uc -us)

mkdir -p "$outdir"
built=("$work"/*.deb)
cp "${built[@]}" "$work"/*.buildinfo "$work"/*.changes "$outdir/"
echo "==> package.sh: in $outdir:"
install=()
for deb in "${built[@]}"; do
  name=$(basename "$deb")
  echo "    $name"
  case "$name" in
    *-dbgsym_*) ;;  # debug symbols, for a debugger only
    *) install+=("$outdir/$name") ;;
  esac
done
echo "==> to install (as root): apt-get install ${install[*]}"
