#!/usr/bin/env bash
# tests/cmake/packaging/deb.sh build|consumer|lintian SOURCE_DIR WORK CXX GENERATOR [MAKE_PROGRAM]
#
# The Debian packages of scripts/package.sh, as ctest checks them (tests/cmake/packaging/CMakeLists.txt):
#   build     scripts/package.sh WORK/debs (the fixture of the other two): the packages README.md
#             names, and the install command it prints
#   consumer  dpkg -x both packages into WORK/root, check what each holds (teardown.pc: prefix=/usr,
#             whose -I/usr/include pkg-config drops), build and run the consumer against the root
#             by find_package and by pkg-config (the root as its sysroot; neither sees
#             libatomic_ops), and run the unpacked teardown-run
#   lintian   lintian on both packages: fails on any error or warning; every override is shown
#             with its reason
# Exit 77 (ctest: skipped) with the reason when a Debian tool is missing. A skipped build leaves
# no packages, so the two others check the same tools first and skip with it.
set -euo pipefail

mode=$1 source_dir=$2 work=$3 cxx=$4 generator=$5 make_program=${6:-}
debs="$work/debs"

skip() {
  echo "SKIPPED: $*"
  exit 77
}
need() {  # need <command> <Debian package>
  command -v "$1" >/dev/null 2>&1 || skip "$1 not found (Debian: apt-get install $2)"
}
need dpkg-buildpackage dpkg-dev
need dpkg-deb dpkg
need dh debhelper
host_arch=$(dpkg --print-architecture)

packages_built() {
  dev=$(ls "$debs"/libteardown-dev_*_all.deb 2>/dev/null | head -n 1)
  tools=$(ls "$debs"/teardown-tools_*_"$host_arch".deb 2>/dev/null | head -n 1)
  [ -n "$dev" ] || { echo "no libteardown-dev in $debs: did packaging.deb.build run?"; exit 1; }
  # teardown-tools is Architecture: amd64 (tools/ builds for Linux x86-64 only).
  if [ "$host_arch" = amd64 ] && [ -z "$tools" ]; then
    echo "no teardown-tools in $debs: did packaging.deb.build run?"
    exit 1
  fi
}

case "$mode" in
build)
  rm -rf "$debs"
  mkdir -p "$work"  # a fresh build tree has none yet: tee would fail
  bash "$source_dir/scripts/package.sh" "$debs" | tee "$work/package.log"
  # The packages README.md names ("Debian packages"), and only those: libteardown-dev,
  # teardown-tools and its -dbgsym (amd64, unless DEB_BUILD_OPTIONS has noautodbgsym). The
  # install command package.sh prints is the README's: the first two.
  made=$(cd "$debs" && printf '%s\n' *.deb | sed 's|_.*||' | sort | tr '\n' ' ')
  expected=(libteardown-dev)
  install=("$debs"/libteardown-dev_*_all.deb)
  if [ "$host_arch" = amd64 ]; then
    expected+=(teardown-tools)
    case " ${DEB_BUILD_OPTIONS:-} " in *" noautodbgsym "*) ;; *) expected+=(teardown-tools-dbgsym) ;; esac
    install+=("$debs"/teardown-tools_*_amd64.deb)
  fi
  named=$(printf '%s\n' "${expected[@]}" | sort | tr '\n' ' ')
  if [ "$made" != "$named" ]; then
    echo "package.sh made: $made; README.md names: $named"; exit 1
  fi
  said=$(sed -n 's/^==> to install (as root): apt-get install //p' "$work/package.log")
  if [ "$said" != "${install[*]}" ]; then
    echo "package.sh says to install '$said', expected '${install[*]}'"; exit 1
  fi
  echo "packaging.deb.build: made $made; to install: $said"
  ;;

consumer)
  packages_built
  root="$work/root"
  rm -rf "$root" "$work/consumers"
  for deb in "$dev" $tools; do
    dpkg -x "$deb" "$root"
  done
  # What each package must hold (and libteardown-dev nothing architecture-specific).
  contents=$(dpkg-deb -c "$dev" | awk '{print $NF}')
  for expected in ./usr/include/teardown/teardown.hpp ./usr/share/cmake/teardown/teardownConfig.cmake \
                  ./usr/share/cmake/teardown/teardownConfigVersion.cmake ./usr/share/pkgconfig/teardown.pc \
                  ./usr/share/doc/libteardown-dev/copyright; do
    grep -qxF "$expected" <<<"$contents" || { echo "libteardown-dev lacks $expected"; exit 1; }
  done
  if grep -E '^\./usr/(lib|bin)/.' <<<"$contents"; then
    echo "libteardown-dev (Architecture: all) holds the files above"
    exit 1
  fi
  if grep -q '^Requires' "$root/usr/share/pkgconfig/teardown.pc"; then
    echo "teardown.pc requires another package:"; cat "$root/usr/share/pkgconfig/teardown.pc"; exit 1
  fi
  # Installed in /usr, teardown.pc names /usr, and pkg-config drops its -I/usr/include (the
  # system directory): the flags are -pthread alone.
  if ! grep -qx 'prefix=/usr' "$root/usr/share/pkgconfig/teardown.pc"; then
    echo "teardown.pc does not say prefix=/usr:"; cat "$root/usr/share/pkgconfig/teardown.pc"; exit 1
  fi
  cflags=$(env -u PKG_CONFIG_SYSROOT_DIR -u PKG_CONFIG_ALLOW_SYSTEM_CFLAGS -u PKG_CONFIG_SYSTEM_INCLUDE_PATH \
           PKG_CONFIG_LIBDIR="$root/usr/share/pkgconfig" PKG_CONFIG_PATH="" pkg-config --cflags teardown)
  read -ra cflags <<<"$cflags"
  if [ "${cflags[*]}" != "-pthread" ]; then
    echo "pkg-config --cflags teardown for a /usr install: '${cflags[*]}', expected -pthread alone"; exit 1
  fi

  options=(-G "$generator" "-DCMAKE_CXX_COMPILER=$cxx" -DCMAKE_BUILD_TYPE=Debug)
  [ -z "$make_program" ] || options+=("-DCMAKE_MAKE_PROGRAM=$make_program")
  # find_package: the root's /usr as the prefix; libatomic_ops hidden, as on a machine without it.
  project="$work/consumers/find_package"
  cmake -S "$source_dir/tests/cmake/find_package" -B "$project" "${options[@]}" \
        "-DCMAKE_PREFIX_PATH=$root/usr" -DCMAKE_DISABLE_FIND_PACKAGE_Atomic_ops=ON
  cmake --build "$project"
  "$project/consumer"
  # pkg-config: only the root's .pc files are visible (no atomic_ops.pc among them), and the
  # root is the sysroot of their /usr.
  project="$work/consumers/pkg_config"
  PKG_CONFIG_LIBDIR="$root/usr/share/pkgconfig" PKG_CONFIG_PATH="" PKG_CONFIG_SYSROOT_DIR="$root" \
    cmake -S "$source_dir/tests/cmake/pkg_config" -B "$project" "${options[@]}"
  cmake --build "$project"
  "$project/consumer"

  if [ -n "$tools" ]; then
    for expected in ./usr/bin/teardown-run ./usr/share/man/man1/teardown-run.1.gz; do
      dpkg-deb -c "$tools" | awk '{print $NF}' | grep -qxF "$expected" \
        || { echo "teardown-tools lacks $expected"; exit 1; }
    done
    # The launcher finds its library relative to itself, so it works from the unpacked root:
    # the program sees the library in LD_PRELOAD.
    preload=$("$root/usr/bin/teardown-run" -- sh -c 'echo "$LD_PRELOAD"')
    echo "teardown-run from the unpacked root: LD_PRELOAD=$preload"
    case "$preload" in
      "$root"/usr/lib/*/teardown/libteardown_shadow.so) ;;
      *) echo "teardown-run did not preload the packaged library"; exit 1 ;;
    esac
  fi
  echo "packaging.deb.consumer: find_package and pkg-config consumers built and ran against $root"
  ;;

lintian)
  need lintian lintian
  packages_built
  # Two runs: the first prints every tag, the overridden ones with their reasons
  # (debian/*.lintian-overrides, written by scripts/package.sh); the second decides, failing on
  # any tag not overridden, down to info and pedantic ones. (lintian 2.116 counts shown overrides
  # against --fail-on, hence not one run.) As root it warns on stderr; that is not a tag.
  lintian --fail-on none --display-info --pedantic --show-overrides "$dev" $tools
  lintian --fail-on error,warning,info,pedantic --display-info --pedantic "$dev" $tools
  echo "packaging.deb.lintian: no tag left but the overrides above"
  ;;

*)
  echo "usage: deb.sh build|consumer|lintian SOURCE_DIR WORK CXX GENERATOR [MAKE_PROGRAM]" >&2
  exit 2
  ;;
esac
