#!/bin/sh
# Runs one SPIN check of a Promela model: spin -a, compile pan.c, run pan, judge the result.
#
#   run_spin.sh SPIN CC MODEL WORKDIR MODE EXPECT [SPIN_DEFINE...] [-- PAN_OPTION...]
#
#   SPIN, CC  the spin and C compiler programs; empty or *-NOTFOUND (CMake's find_program
#             answer) means missing, and the check is skipped: exit status 77, which CTest is
#             told (SKIP_RETURN_CODE) to report as skipped, never as passed.
#   MODEL     the .pml file; it is copied into WORKDIR, which is emptied first, so that pan's
#             trail file lands there too.
#   MODE      safety  cc -DSAFETY, pan checks assertions and invalid end states (deadlocks);
#             cycles  cc -DNP, pan -l: any cycle in the state space (the model has no progress
#                     labels) is an error, i.e. some execution never ends.
#   EXPECT    pass    exit 0 only if pan completed the search and printed "errors: 0";
#             error   a mutant: exit 0 only if pan found an error; its shortest trail is printed.
#   SPIN_DEFINE  -DNAME[=VALUE] options for spin's preprocessor (configuration, mutants).
#   PAN_OPTION   extra options for ./pan (e.g. -E: ignore invalid end states; -f: weak fairness
#                in a cycles check; -I: with EXPECT error, a faster approximate shortest trail).
#
# Exit status: 0 as expected, 1 not as expected or a tool failed, 77 skipped.
set -u

if [ $# -lt 6 ]; then
  echo "usage: $0 SPIN CC MODEL WORKDIR safety|cycles pass|error [-DX...] [-- pan options]" >&2
  exit 1
fi
spin=$1 cc=$2 model=$3 workdir=$4 mode=$5 expect=$6
shift 6
defines=
panopts=
while [ $# -gt 0 ]; do
  if [ "$1" = -- ]; then
    shift
    panopts=$*
    break
  fi
  defines="$defines $1"
  shift
done

have() {
  case $1 in
    "" | *-NOTFOUND | *_NOTFOUND | NOTFOUND) return 1 ;;
  esac
  [ -x "$1" ] || command -v "$1" >/dev/null 2>&1
}
if ! have "$spin"; then
  echo "SKIPPED: the SPIN model checker was not found (Debian/Ubuntu: apt-get install spin;" \
       "then re-run cmake). This check has NOT run."
  exit 77
fi
if ! have "$cc"; then
  echo "SKIPPED: no C compiler was found to build SPIN's pan.c. This check has NOT run."
  exit 77
fi

case $mode in
  safety) ccflags=-DSAFETY; runflags= ;;
  cycles) ccflags=-DNP; runflags=-l ;;
  *) echo "run_spin.sh: MODE must be safety or cycles, not '$mode'" >&2; exit 1 ;;
esac
case $expect in
  pass) ;;
  # -DREACH with pan -i: look on for the shortest counterexample, for a readable trail. A
  # PAN_OPTION -I asks for pan's approximate, faster shortening instead (a large model).
  error)
    if [ "$mode" = safety ]; then
      ccflags="$ccflags -DREACH"
      case " $panopts " in
        *" -I "*) ;;
        *) runflags=-i ;;
      esac
    fi ;;
  *) echo "run_spin.sh: EXPECT must be pass or error, not '$expect'" >&2; exit 1 ;;
esac

name=$(basename "$model")
rm -rf "$workdir" && mkdir -p "$workdir" && cp "$model" "$workdir/$name" && cd "$workdir" || exit 1

echo "spin -a$defines $name"
# shellcheck disable=SC2086 # word splitting of the option lists is intended
"$spin" -a $defines "$name" || { echo "FAILED: spin -a rejected the model"; exit 1; }
echo "$cc -O2 -w $ccflags -o pan pan.c"
# shellcheck disable=SC2086
"$cc" -O2 -w $ccflags -o pan pan.c || { echo "FAILED: pan.c did not compile"; exit 1; }
# -m: search depth limit, far above the model's (a few hundred steps); hitting it is a failure.
echo "./pan -m100000 $runflags $panopts"
# shellcheck disable=SC2086
./pan -m100000 $runflags $panopts >pan.out 2>&1
cat pan.out

errors=$(sed -n 's/.*errors: \([0-9][0-9]*\).*/\1/p' pan.out | tail -n 1)
if [ -z "$errors" ]; then
  echo "FAILED: pan did not report an error count (crashed or ran out of memory?)"
  exit 1
fi
if grep -q "max search depth too small" pan.out; then
  echo "FAILED: the search was cut at the depth limit, so it is incomplete"
  exit 1
fi
if grep -qi "out of memory\|memlim" pan.out; then
  echo "FAILED: pan ran out of memory, so the search is incomplete"
  exit 1
fi

if [ "$expect" = pass ]; then
  if [ "$errors" = 0 ]; then
    echo "PASSED: errors: 0$defines"
    exit 0
  fi
  echo "FAILED: SPIN found $errors error(s). Counterexample (spin -t -p$defines $name in $workdir):"
  # shellcheck disable=SC2086
  "$spin" -t -p $defines "$name" | tail -n 200
  exit 1
fi

# expect = error: the mutant must be caught.
if [ "$errors" = 0 ]; then
  echo "FAILED: the mutant$defines was NOT caught: SPIN found no error"
  exit 1
fi
echo "PASSED: the mutant$defines was caught ($errors error(s) reported). Shortest trail:"
if [ -f "$name.trail" ]; then
  # shellcheck disable=SC2086
  "$spin" -t $defines "$name" | tail -n 60
fi
exit 0
