#!/bin/sh
# Counts the syscalls the producing thread makes inside teardown::reaper::enqueue, with the
# worker awake and with it asleep: runs `reaper_bench --mode=syscalls,K` under strace -f and
# counts, per phase, the producer's syscalls between the two markers that surround each enqueue
# call (write(-1, "enqueue begin"/"enqueue end"), which fail with EBADF).
#
#   benchmarks/scripts/syscalls.sh build/bench/benchmarks/reaper_bench [K]      (K defaults to 1000)
#
# Phases (see reaper_bench.cpp): awake_empty (worker polling, each enqueue into an empty queue),
# awake_stream (worker polling, K enqueues back to back), asleep (each enqueue once the worker is
# blocked in futex()), asleep_polling (the same with reaper_options::poll_interval = 1 ms).
# Expected: 0 syscalls inside the awake enqueues, exactly one futex(FUTEX_WAKE_PRIVATE) inside
# each asleep enqueue, and 0 inside the asleep_polling ones. Then, for comparison, `strace -f -c -e
# trace=futex` over a whole run (all threads, all phases, the waiting between calls included).
# Needs strace (Debian: strace). ptrace slows every syscall down, so this shows counts, not times.
set -eu

bench=${1:?usage: $0 path/to/reaper_bench [K]}
k=${2:-1000}
command -v strace >/dev/null 2>&1 || { echo "$0: strace not found (Debian: apt-get install strace)" >&2; exit 1; }

trace=$(mktemp "${TMPDIR:-/tmp}/reaper_syscalls.XXXXXX")
trap 'rm -f "$trace"' EXIT

echo "== $bench --mode=syscalls,$k under strace -f -e trace=all"
strace -f -qq -o "$trace" -e trace=all "$bench" "--mode=syscalls,$k"

echo
echo "== syscalls made by the producer between the markers around each enqueue, per phase"
awk '
  # A line: "<tid> <name>(<args>) = <result>", or "<tid> <... name resumed>..." for a call whose
  # start was printed on an earlier, "<unfinished ...>" line; each call is counted at its start.
  # futex calls are told apart by operation, a wake by what it returned (the threads it woke),
  # a wait by its error, if any. A call split by another thread\047s line is named by its start.
  function call_name(line,   rest, name, op) {
    rest = line
    sub(/^[0-9]+ +/, "", rest)
    if (rest ~ /^<\.\.\./ || rest ~ /^\+\+\+/ || rest ~ /^---/) return ""
    name = rest
    sub(/\(.*/, "", name)
    if (name != "futex") return name
    op = rest
    sub(/^[^,]*, */, "", op)
    sub(/[,)].*/, "", op)
    name = "futex(" op ")"
    if (op ~ /WAKE/ && match(rest, /= [0-9]+$/)) name = name " returning " substr(rest, RSTART + 2)
    if (match(rest, /= -1 E[A-Z]+/)) name = name " " substr(rest, RSTART + 5, RLENGTH - 5)
    return name
  }
  /write\(-1, "phase [a-z_]+ begin"/ {
    if (producer == "") producer = $1
    if ($1 != producer) next
    match($0, /phase [a-z_]+ begin/)
    phase = substr($0, RSTART + 6, RLENGTH - 12)
    phases[++nphases] = phase
    next
  }
  producer == "" { next }
  $1 != producer {
    # Another thread (the worker) while a phase runs: strace -o writes the lines of all threads in
    # the order the calls happened, so this is what the others did during the phase.
    name = call_name($0)
    if (phase != "" && name != "") others_by[phase, name]++
    # The outcome of a call split across lines is on its "resumed" line.
    if (phase != "" && match($0, /^[0-9]+ +<\.\.\. [a-z_]+ resumed>.*= -1 E[A-Z]+/)) {
      rest = substr($0, RSTART, RLENGTH)
      sub(/^[0-9]+ +<\.\.\. /, "", rest)
      outcome = rest
      sub(/ resumed>.*/, "", rest)
      sub(/.*= -1 /, "", outcome)
      others_by[phase, "(of which " rest " " outcome ")"]++
    }
    next
  }
  /write\(-1, "phase [a-z_]+ end"/ { phase = ""; next }
  /write\(-1, "enqueue begin"/ { inside = 1; enqueues[phase]++; next }
  /write\(-1, "enqueue end"/ { inside = 0; next }
  {
    name = call_name($0)
    if (name == "") next
    if (inside) {
      inside_calls[phase]++
      inside_by[phase, name]++
    } else if (phase != "") {
      outside_by[phase, name]++
    }
  }
  END {
    if (producer == "") { print "no markers found"; exit 1 }
    printf "producer tid %s\n", producer
    for (i = 1; i <= nphases; i++) {
      p = phases[i]
      printf "%-13s %d enqueues, %d syscalls inside them", p, enqueues[p], inside_calls[p]
      sep = ": "
      for (key in inside_by) {
        split(key, parts, SUBSEP)
        if (parts[1] == p) { printf "%s%s x%d", sep, parts[2], inside_by[key]; sep = ", " }
      }
      printf "\n"
      line = ""
      for (key in outside_by) {
        split(key, parts, SUBSEP)
        if (parts[1] == p) line = line sprintf(" %s x%d", parts[2], outside_by[key])
      }
      if (line != "") printf "%-13s between the enqueues (markers, waiting for the worker):%s\n", "", line
      line = ""
      for (key in others_by) {
        split(key, parts, SUBSEP)
        if (parts[1] == p) line = line sprintf(" %s x%d", parts[2], others_by[key])
      }
      if (line != "") printf "%-13s other threads (the worker) meanwhile:%s\n", "", line
    }
  }
' "$trace"

echo
echo "== strace -f -c -e trace=futex over a whole run (every thread and phase, for comparison)"
strace -f -qq -c -e trace=futex "$bench" "--mode=syscalls,$k" 2>&1
