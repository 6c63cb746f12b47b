#!/usr/bin/env bash
# tracer.bpftrace: every USDT probe of trace.hpp, read by bpftrace, carries the arguments the
# program emitted, in trace.hpp's order, the domain last.
#
#   1. tracer_probes runs alone: it must pass its own checks (or say it has no probes: skip);
#   2. bpftrace lists the probes in its binary: exactly the eight names of trace.hpp;
#   3. tracer_probes runs under bpftrace, which prints each probe's arguments in the format the
#      program's hooks write theirs; the two sets of lines must be equal.
# Exit 0: pass; 1: fail; 77: skip (CTest SKIP_RETURN_CODE), with the reason on the last line:
# bpftrace missing, the build without USDT probes, or BPF or uprobes refused by the kernel or our
# privileges (not root, lockdown, no CONFIG_UPROBE_EVENTS). Never a pass without the tracer.
# Usage: bpftrace_test.sh PATH/TO/tracer_probes     (BPFTRACE=/path/to/bpftrace to pick one)
set -uo pipefail

program=${1:?usage: bpftrace_test.sh PATH/TO/tracer_probes}
probes=(queue reap sync reject pressure process_kill process_release boost)

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# 1. Alone.
"$program" "$work/alone.txt"
status=$?
[ "$status" -eq 77 ] && skip "tracer_probes was built without USDT probes (no <sys/sdt.h>: Debian systemtap-sdt-dev)"
[ "$status" -eq 0 ] || fail "tracer_probes failed its own checks without a tracer (exit $status)"

bpftrace=${BPFTRACE:-bpftrace}
command -v "$bpftrace" >/dev/null 2>&1 ||
  skip "$bpftrace is not installed (Debian package bpftrace; scripts/test.sh installs it)"
echo "bpftrace: $("$bpftrace" --version 2>&1)"

# bpftrace says why BPF is refused (not root, lockdown, no BPF syscall); that is a skip.
if ! out=$(timeout 60 "$bpftrace" -e 'BEGIN { printf("bpf works\n"); exit(); }' 2>&1) ||
   ! grep -q "bpf works" <<<"$out"; then
  skip "the kernel or our privileges refuse BPF: $(grep -v RLIMIT_MEMLOCK <<<"$out" | tr '\n' ' ')"
fi
if [ ! -e /sys/bus/event_source/devices/uprobe/type ] && [ ! -e /sys/kernel/tracing/uprobe_events ] &&
   [ ! -e /sys/kernel/debug/tracing/uprobe_events ]; then
  skip "the kernel has no uprobes (CONFIG_UPROBE_EVENTS): USDT probes cannot be attached"
fi

# 2. The probe names.
listed=$(timeout 60 "$bpftrace" -l "usdt:$program:teardown:*" 2>&1 | sed -n 's/^usdt:.*:teardown:\([a-z_]*\)$/\1/p' |
         sort -u | tr '\n' ' ')
expected=$(printf '%s\n' "${probes[@]}" | sort | tr '\n' ' ')
echo "probes listed: $listed"
[ "$listed" = "$expected" ] || fail "bpftrace lists the probes [$listed], trace.hpp has [$expected]"

# 3. The arguments. One action per probe, in the hooks' format (probe_program.cpp's on_*).
script=$(cat <<EOF
usdt:$program:teardown:queue { printf("queue id=%lu cost=%lu tid=%ld thread=%s cpu=%d domain=%lu\n",
  arg0, arg1, (int64)arg2, str(arg3), (int32)arg4, arg5); }
usdt:$program:teardown:reap { printf("reap id=%lu charged=%lu live=%lu cpu=%d wait_ns=%lu domain=%lu\n",
  arg0, arg1, arg2, (int32)arg3, arg4, arg5); }
usdt:$program:teardown:sync { printf("sync id=%lu cost=%lu reason=%s domain=%lu\n",
  arg0, arg1, str(arg2), arg3); }
usdt:$program:teardown:reject { printf("reject id=%lu cost=%lu pending=%lu cap=%lu domain=%lu\n",
  arg0, arg1, arg2, arg3, arg4); }
usdt:$program:teardown:pressure { printf("pressure action=%s amount=%lu domain=%lu\n",
  str(arg0), arg1, arg2); }
usdt:$program:teardown:process_kill { printf("process_kill pid=%ld bytes=%lu signal=%d domain=%lu\n",
  (int64)arg0, arg1, (int32)arg2, arg3); }
usdt:$program:teardown:process_release {
  printf("process_release pid=%ld bytes=%lu result=%s tries=%u wait_ns=%lu domain=%lu\n",
  (int64)arg0, arg1, str(arg2), (uint32)arg3, arg4, arg5); }
usdt:$program:teardown:boost { printf("boost tid=%ld before=%d after=%d reason=%s domain=%lu\n",
  (int64)arg0, (int32)arg1, (int32)arg2, str(arg3), arg4); }
EOF
)
timeout 90 "$bpftrace" -o "$work/bpftrace.txt" -e "$script" -c "$program $work/emitted.txt" >"$work/stdout.txt" \
  2>"$work/stderr.txt"
status=$?
# Without a mounted tracefs, bpftrace 0.17 reports an error for each probe it detaches at the
# end (the perf-event uprobes it attached are closed all the same): counted, not shown.
detach_noise='uprobe_events\): No such file or directory|failed to detach probe|RLIMIT_MEMLOCK'
grep -vE "$detach_noise" "$work/stderr.txt" | sed 's/^/  bpftrace stderr: /'
noise=$(grep -cE 'failed to detach probe' "$work/stderr.txt")
[ "$noise" -eq 0 ] || echo "  (bpftrace reported $noise detach errors: no tracefs mounted at /sys/kernel/tracing)"
grep -v '^$' "$work/stdout.txt" | sed 's/^/  program: /'
if [ ! -s "$work/emitted.txt" ]; then
  if grep -qiE "permission denied|operation not permitted|lockdown" "$work/stderr.txt"; then
    skip "the kernel refused to attach the USDT probes: $(grep -m1 -iE "permission|permitted|lockdown" "$work/stderr.txt")"
  fi
  fail "tracer_probes did not run to the end under bpftrace (bpftrace exit $status)"
fi
# The program ran to the end. bpftrace may still exit non-zero after it: it reports errors when it
# detaches uprobes through a tracefs that is not mounted; what it printed before is what counts.
names=$(IFS='|'; echo "${probes[*]}")
grep -E "^($names) " "$work/bpftrace.txt" | sort >"$work/seen.sorted"
sort "$work/emitted.txt" >"$work/emitted.sorted"
echo "events emitted: $(wc -l <"$work/emitted.sorted"), printed by bpftrace: $(wc -l <"$work/seen.sorted")"
for probe in "${probes[@]}"; do
  grep -q "^$probe " "$work/seen.sorted" || fail "bpftrace printed no $probe event"
done
if ! diff -u --label emitted --label bpftrace "$work/emitted.sorted" "$work/seen.sorted"; then
  fail "the probes' arguments as bpftrace read them differ from what tracer_probes emitted (above)"
fi
sed 's/^/  /' "$work/seen.sorted"
echo "PASS: all ${#probes[@]} probes, $(wc -l <"$work/seen.sorted") events, every argument as emitted"
